/* Per-step profiles of compiled runs (profile.h). Steps are indexed
 * (program, step); their names come from the executable's step_names and
 * step_op_names, which kiln_compile fills in process. */
#include "clients/cli/profile.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"

typedef struct event {
  uint32_t prog, step;
  int64_t begin, end;
} event;

typedef struct row {
  uint32_t prog, step;
  int64_t ns;
  uint64_t calls;
} row;

struct kiln__profile {
  const kiln_executable *e;
  uint64_t *base; /* program -> index of its first step in ns/calls */
  int64_t *ns;
  uint64_t *calls;
  uint64_t nsteps;
  bool counted;
  int64_t run_begin, run_total; /* the current run's start; counted runs' sum */
  uint64_t runs;
  event *ev; /* the current run's events */
  size_t nev, evcap;
  event *last; /* the last counted run's */
  size_t nlast, lastcap;
  int64_t last_begin, last_end;
  kiln_step_observer obs;
};

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void on_step(void *ctx, uint32_t prog, uint32_t step, int64_t begin, int64_t end) {
  kiln__profile *p = ctx;
  if (prog >= p->e->nprograms || step >= p->e->programs[prog].nsteps || !p->counted) return;
  uint64_t k = p->base[prog] + step;
  p->ns[k] += end - begin;
  p->calls[k]++;
  if (p->nev < 1000000 && kiln_grow((void **)&p->ev, &p->evcap, p->nev + 1, sizeof *p->ev) == 0)
    p->ev[p->nev++] = (event){prog, step, begin, end};
}

kiln__profile *kiln__profile_create(const kiln_executable *e) {
  kiln__profile *p = kiln_calloc(1, sizeof *p);
  if (p == NULL) return NULL;
  p->e = e;
  p->base = kiln_calloc(e->nprograms + 1, sizeof *p->base);
  for (uint32_t i = 0; p->base && i < e->nprograms; i++) {
    p->base[i] = p->nsteps;
    p->nsteps += e->programs[i].nsteps;
  }
  p->ns = kiln_calloc(p->nsteps + 1, sizeof *p->ns);
  p->calls = kiln_calloc(p->nsteps + 1, sizeof *p->calls);
  if (p->base == NULL || p->ns == NULL || p->calls == NULL) {
    kiln__profile_destroy(p);
    return NULL;
  }
  p->obs = (kiln_step_observer){on_step, p};
  return p;
}

void kiln__profile_destroy(kiln__profile *p) {
  if (p == NULL) return;
  kiln_free(p->base);
  kiln_free(p->ns);
  kiln_free(p->calls);
  kiln_free(p->ev);
  kiln_free(p->last);
  kiln_free(p);
}

const kiln_step_observer *kiln__profile_observer(kiln__profile *p) { return &p->obs; }

void kiln__profile_begin(kiln__profile *p, bool counted) {
  p->counted = counted;
  p->nev = 0;
  p->run_begin = now_ns();
}

void kiln__profile_end(kiln__profile *p) {
  int64_t t = now_ns();
  if (!p->counted) return;
  p->run_total += t - p->run_begin;
  p->runs++;
  /* this run's events become the last run's; the old buffer is reused */
  event *ev = p->last;
  size_t cap = p->lastcap;
  p->last = p->ev;
  p->nlast = p->nev;
  p->lastcap = p->evcap;
  p->ev = ev;
  p->evcap = cap;
  p->nev = 0;
  p->last_begin = p->run_begin;
  p->last_end = t;
  p->counted = false;
}

static const char *kind_name(kiln_step_kind k) {
  switch (k) {
  case KILN_STEP_KERNEL: return "kernel";
  case KILN_STEP_GEMM: return "gemm";
  case KILN_STEP_COPY: return "copy";
  case KILN_STEP_WHILE: return "while";
  case KILN_STEP_CONDITIONAL: return "conditional";
  case KILN_STEP_CALL: return "call";
  case KILN_STEP_CONV: return "conv";
  case KILN_STEP_COLLECTIVE: return "collective";
  case KILN_STEP_DEBUG_PRINT: return "debug-print";
  case KILN_STEP_FFT: return "fft";
  case KILN_STEP_LINALG: return "linalg";
  }
  return "?";
}

static bool is_control(kiln_step_kind k) {
  return k == KILN_STEP_WHILE || k == KILN_STEP_CONDITIONAL || k == KILN_STEP_CALL;
}

static const char *step_name(const kiln_executable *e, uint32_t prog, uint32_t step) {
  return e->step_names && e->step_names[prog] && e->step_names[prog][step]
             ? e->step_names[prog][step]
             : "?";
}

static const char *step_op_name(const kiln_executable *e, uint32_t prog, uint32_t step) {
  return e->step_op_names && e->step_op_names[prog] && e->step_op_names[prog][step]
             ? e->step_op_names[prog][step]
             : "";
}

static int by_time(const void *a, const void *b) {
  const row *x = a, *y = b;
  return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : 0;
}

void kiln__profile_print(const kiln__profile *p, FILE *f) {
  const kiln_executable *e = p->e;
  row *rows = kiln_calloc(p->nsteps + 1, sizeof *rows);
  if (rows == NULL) return;
  size_t n = 0;
  int64_t leaf = 0;
  for (uint32_t g = 0; g < e->nprograms; g++)
    for (uint32_t i = 0; i < e->programs[g].nsteps; i++) {
      uint64_t k = p->base[g] + i;
      if (p->calls[k] == 0 || is_control(e->programs[g].steps[i].kind)) continue;
      rows[n++] = (row){g, i, p->ns[k], p->calls[k]};
      leaf += p->ns[k];
    }
  qsort(rows, n, sizeof *rows, by_time);
  double total = (double)p->run_total;
  fprintf(f, "profile: %" PRIu64 " runs, %.3f ms in all, %.3f ms in steps (%.1f%%)\n", p->runs,
          total / 1e6, (double)leaf / 1e6, total > 0 ? 100.0 * (double)leaf / total : 0.0);
  fprintf(f, "%-12s %9s %8s %10s %6s  %-40s %s\n", "kind", "total_ms", "calls", "mean_us", "%",
          "instruction", "op_name");
  for (size_t r = 0; r < n; r++) {
    const row *w = &rows[r];
    fprintf(f, "%-12s %9.3f %8" PRIu64 " %10.2f %6.1f  %-40s %s\n",
            kind_name(e->programs[w->prog].steps[w->step].kind), (double)w->ns / 1e6, w->calls,
            (double)w->ns / 1e3 / (double)w->calls, total > 0 ? 100.0 * (double)w->ns / total : 0.0,
            step_name(e, w->prog, w->step), step_op_name(e, w->prog, w->step));
  }
  kiln_free(rows);
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

int kiln__profile_write_trace(const kiln__profile *p, const char *path) {
  FILE *f = fopen(path, "w");
  if (f == NULL) return -1;
  const kiln_executable *e = p->e;
  int64_t t0 = p->last_begin;
  fprintf(f, "{\"displayTimeUnit\": \"ns\", \"traceEvents\": [\n");
  fprintf(f,
          "{\"name\": \"run\", \"cat\": \"run\", \"ph\": \"X\", \"pid\": 1, \"tid\": 1, "
          "\"ts\": 0, \"dur\": %.3f}",
          (double)(p->last_end - t0) / 1e3);
  for (size_t i = 0; i < p->nlast; i++) {
    const event *v = &p->last[i];
    kiln_step_kind k = e->programs[v->prog].steps[v->step].kind;
    fprintf(f, ",\n{\"name\": ");
    json_str(f, step_name(e, v->prog, v->step));
    fprintf(f,
            ", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": 1, \"ts\": %.3f, "
            "\"dur\": %.3f, \"args\": {\"kind\": \"%s\", \"program\": %u, \"step\": %u, "
            "\"op_name\": ",
            is_control(k) ? "control" : "step", (double)(v->begin - t0) / 1e3,
            (double)(v->end - v->begin) / 1e3, kind_name(k), v->prog, v->step);
    json_str(f, step_op_name(e, v->prog, v->step));
    fprintf(f, "}}");
  }
  fprintf(f, "\n]}\n");
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) {
    if (errno == 0) errno = EIO;
    return -1;
  }
  return 0;
}
