/* The pass pipeline: the ordered list of passes and the manager that runs
 * them (timing, verify-after-each, dumps). Read the list to know what the
 * compiler does, in order. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/alloc.h"
#include "common/deadline.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/pass.h"
#include "compiler/passes/passes.h"

static const kiln_pass passes[] = {
    {"unroll", kiln_pass_unroll, 1}, /* first: the copies' calls are inlined next */
    {"inline", kiln_pass_inline, 1},
    {"algsimp", kiln_pass_algsimp, 1},
    {"constfold", kiln_pass_constfold, 1},
    {"cse", kiln_pass_cse, 1},
    {"dce", kiln_pass_dce, 0},
    {"scatter_merge", kiln_pass_scatter_merge, 1}, /* after cse: one indices instruction */
    {"scan_dots", kiln_pass_scan_dots, 1}, /* before while_licm, which hoists its products */
    {"while_licm", kiln_pass_while_licm, 1},
    {"annotations", kiln_pass_annotations, 0},
    {"dot_canon", kiln_pass_dot_canon, 1},
    {"fusion", kiln_pass_fusion, 1},
    {"layout", kiln_pass_layout, 1},
    {"schedule", kiln_pass_schedule, 0},
    {"remat", kiln_pass_remat, 0}, /* last: it weighs the final schedule's memory */
};

const kiln_pass *kiln_pipeline_passes(uint32_t *n) {
  *n = sizeof passes / sizeof passes[0];
  return passes;
}

const kiln_pass *kiln_pipeline_find(const char *name) {
  for (size_t i = 0; i < sizeof passes / sizeof passes[0]; i++)
    if (strcmp(passes[i].name, name) == 0) return &passes[i];
  return NULL;
}

static bool is_disabled(const kiln_pipeline_options *o, const char *name) {
  for (uint32_t i = 0; i < o->ndisabled; i++)
    if (strcmp(o->disabled[i], name) == 0) return true;
  return false;
}

static int write_file(const char *path, const char *data, size_t len, kiln_status *st) {
  FILE *f = fopen(path, "wb");
  if (f == NULL)
    return kiln_status_set(st, KILN_EIO, path, "cannot write dump: %s", strerror(errno));
  size_t w = fwrite(data, 1, len, f);
  int bad = fclose(f) != 0 || w != len;
  return bad ? kiln_status_set(st, KILN_EIO, path, "cannot write dump") : 0;
}

static int dump(const kiln_module *m, const char *dir, unsigned seq, const char *name,
                kiln_status *st) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return kiln_status_set(st, KILN_EIO, dir, "cannot create dump directory: %s", strerror(errno));
  char path[4096];
  size_t len;
  char *text = kiln_module_print(m, &len);
  if (text == NULL) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory dumping");
  snprintf(path, sizeof path, "%s/%02u-%s.hlo", dir, seq, name);
  int rc = write_file(path, text, len, st);
  kiln_free(text);
  if (rc) return rc;
  char *dot = kiln_module_to_dot(m, &len);
  if (dot == NULL) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory dumping");
  snprintf(path, sizeof path, "%s/%02u-%s.dot", dir, seq, name);
  rc = write_file(path, dot, len, st);
  kiln_free(dot);
  return rc;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static _Thread_local struct kiln_sbuf *explain_to;

struct kiln_sbuf *kiln__pass_explain(void) {
  return explain_to;
}

int kiln_pipeline_run(kiln_module *m, const kiln_pipeline_options *opts, kiln_pass_timing *timings,
                      uint32_t *ntimings, kiln_status *st) {
  kiln_pipeline_options o = {0};
  if (opts) o = *opts;
  if (o.target == NULL) o.target = kiln_target_default();
  uint32_t cap = timings && ntimings ? *ntimings : 0, nt = 0;
  int rc = 0;
  if (o.dump_dir && (rc = dump(m, o.dump_dir, 0, "input", st))) return rc;
  for (size_t i = 0; i < sizeof passes / sizeof passes[0]; i++) {
    const kiln_pass *p = &passes[i];
    bool run = o.opt_level >= p->min_opt_level && !is_disabled(&o, p->name);
    double ms = 0;
    if (run) {
      kiln_arena *scratch = kiln_arena_create();
      if (scratch == NULL) return kiln_status_set(st, KILN_ENOMEM, p->name, "out of memory");
      kiln_pass_ctx ctx = {o.target, scratch, st, o.opt_level, o.memory_budget, o.remat};
      explain_to = o.explain;
      double t0 = now_ms();
      rc = p->run(m, &ctx);
      explain_to = NULL;
      ms = now_ms() - t0;
      kiln_arena_destroy(scratch);
      if (rc == 0) rc = kiln__deadline_check(p->name, st);
      if (rc) {
        if (kiln_status_is_ok(st)) kiln_status_set(st, rc, p->name, "pass failed");
        return rc;
      }
      /* The input's nesting was checked before the pipeline; a pass may
       * add a level (a fusion in a loop body), never many. */
      kiln_verify_options vo = {.max_nesting = KILN_VERIFY_MAX_NESTING};
      if (o.verify_each && (rc = kiln_module_verify(m, &vo, st))) {
        char msg[KILN_STATUS_MSG_MAX + 64];
        snprintf(msg, sizeof msg, "after pass %s: %s", p->name, st->msg);
        snprintf(st->msg, sizeof st->msg, "%.*s", (int)sizeof st->msg - 1, msg);
        return rc;
      }
      if (o.dump_dir && (rc = dump(m, o.dump_dir, (unsigned)i + 1, p->name, st))) return rc;
    }
    if (nt < cap) timings[nt++] = (kiln_pass_timing){p->name, ms, run};
    if (o.stop_after && strcmp(o.stop_after, p->name) == 0) break;
  }
  if (ntimings) *ntimings = nt;
  return 0;
}
