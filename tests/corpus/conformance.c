/* kiln-conformance: runs a corpus of real HLO modules through every stage
 * Kiln has and reports one line per module.
 *
 *   NAME: parsed ok, round-trip ok, verified ok, executed(interp) ok|FAIL|skipped (reason),
 *         executed(cpu) ok|FAIL|unsupported (reason)|skipped (reason)
 *
 * Stages: parse the text; round-trip (print -> parse -> print is a fixed
 * point, and text -> proto -> IR -> text gives the same text); verify
 * (modules INDEX.tsv calls invalid must instead be rejected with a message);
 * execute with the reference interpreter where NNN.expected.txt states
 * inputs and a result. The expected files are written for people, as the
 * original tests state them, so this reads a handful of forms: "input NAME
 * (pK): LITERAL", "case N: input ...: LITERAL -> expected LITERAL",
 * "expected: LITERAL   (comment)" where the literal ends before two spaces
 * and '(' -- plus "SHAPE, every element V", "{1, 2, 3, ..., N}" progressions
 * and "( LITERAL, ... )" tuples. Floats compare within a relative 1e-6
 * unless the file says "(exact)"; integers and preds compare exactly.
 *
 * Execution runs twice: on the reference interpreter and on the CPU
 * backend (compiled with kiln_compile at the default options, run with
 * kiln_run_executable), each judged against the same expected values. A
 * module the CPU compiler refuses with KILN_EUNIMPL is "unsupported" with
 * the compiler's reason: listed, not a failure; any other CPU error or a
 * wrong value is a failure.
 *
 * Each module runs in a forked child with a time limit, so a crash or a
 * hang in one is reported as that module's failure and the run goes on.
 * Exit status: 0 all passed, 1 some failed, 2 usage, 77 corpus not found
 * (ctest's skip code).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/compile.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/proto_codec.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "executor/run.h"

#define MAX_ARGS 16
#define MAX_CASES 8

static bool verbose;
static unsigned timeout_s = 300;

/* ---- small helpers ------------------------------------------------------ */

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  kiln_sbuf b = KILN_SBUF_INIT;
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) kiln_sbuf_putn(&b, chunk, n);
  bool err = ferror(f);
  fclose(f);
  if (err) {
    kiln_sbuf_free(&b);
    return NULL;
  }
  kiln_sbuf_puts(&b, ""); /* an empty file still gets a buffer */
  return kiln_sbuf_detach(&b, NULL);
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
  return s;
}

/* Details for --verbose, collected per stage and printed under the line. */
static kiln_sbuf details = KILN_SBUF_INIT;

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  kiln_sbuf_printf(&details, "    %s\n", buf);
}

static void note_status(const char *stage, const kiln_status *st) {
  note("%s: %s%s%s", stage, st->where, st->where[0] ? ": " : "", st->msg);
}

/* ---- INDEX.tsv ---------------------------------------------------------- */

typedef struct index_row {
  char expected_stated[256];
  char notes[1024];
  bool found;
} index_row;

/* Finds `file`'s row; columns are located by their header names. */
static index_row index_lookup(const char *tsv, const char *file) {
  index_row r = {0};
  if (tsv == NULL) return r;
  int col_file = -1, col_stated = -1, col_notes = -1;
  const char *line = tsv;
  bool header = true;
  while (*line) {
    const char *eol = strchr(line, '\n');
    size_t len = eol ? (size_t)(eol - line) : strlen(line);
    int col = 0;
    const char *cell = line;
    bool match = false;
    while (cell <= line + len) {
      const char *tab = memchr(cell, '\t', (size_t)(line + len - cell));
      size_t clen = tab ? (size_t)(tab - cell) : (size_t)(line + len - cell);
      if (header) {
        if (clen == 8 && memcmp(cell, "filename", 8) == 0) col_file = col;
        if (clen == 15 && memcmp(cell, "expected_stated", 15) == 0) col_stated = col;
        if (clen == 5 && memcmp(cell, "notes", 5) == 0) col_notes = col;
      } else if (col == col_file) {
        match = clen == strlen(file) && memcmp(cell, file, clen) == 0;
      } else if (match && col == col_stated) {
        snprintf(r.expected_stated, sizeof r.expected_stated, "%.*s", (int)clen, cell);
      } else if (match && col == col_notes) {
        snprintf(r.notes, sizeof r.notes, "%.*s", (int)clen, cell);
      }
      if (tab == NULL) break;
      cell = tab + 1;
      col++;
    }
    if (match) {
      r.found = true;
      return r;
    }
    header = false;
    if (eol == NULL) break;
    line = eol + 1;
  }
  return r;
}

/* ---- literals in the expected files ------------------------------------- */

/* "dtype[d0,d1]{layout}" at *p; advances *p past it. Arrays only. */
static bool parse_array_shape(const char **p, kiln_arena *a, kiln_shape *out) {
  const char *s = *p;
  const char *lb = strchr(s, '[');
  if (lb == NULL || !kiln_dtype_from_name(s, (size_t)(lb - s), &out->dtype)) return false;
  int64_t dims[16];
  uint32_t rank = 0;
  s = lb + 1;
  while (*s != ']') {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || rank == 16 || v < 0) return false;
    dims[rank++] = v;
    s = end;
    while (*s == ' ' || *s == ',') s++;
  }
  s++;
  if (*s == '{') {
    const char *rb = strchr(s, '}');
    if (rb == NULL) return false;
    s = rb + 1;
  }
  if (kiln_shape_make_array(a, out, out->dtype, dims, rank)) return false;
  *p = s;
  return true;
}

static kiln_literal *filled_literal(const char *text) {
  /* "s32[8192], every element 1" */
  const char *tag = strstr(text, ", every element ");
  kiln_arena *a = kiln_arena_create();
  kiln_literal *lit = NULL;
  kiln_shape shape;
  const char *p = text;
  if (a && parse_array_shape(&p, a, &shape) && p == tag &&
      kiln_literal_create(NULL, &shape, 0, &lit, NULL) == 0) {
    double v = strtod(tag + strlen(", every element "), NULL);
    for (int64_t i = 0; i < kiln_literal_elements(lit); i++) kiln_literal_set_f64(lit, i, v);
  }
  kiln_arena_destroy(a);
  return lit;
}

static kiln_literal *progression_literal(const char *text) {
  /* "s32[8192] {1, 2, 3, ..., 8192}": rank 1, step from the first two. */
  kiln_arena *a = kiln_arena_create();
  kiln_literal *lit = NULL;
  kiln_shape shape;
  const char *p = text;
  if (a == NULL || !parse_array_shape(&p, a, &shape) || shape.rank != 1) goto out;
  double head[8];
  int nhead = 0;
  p = strchr(p, '{');
  if (p == NULL) goto out;
  p++;
  for (;;) {
    while (*p == ' ' || *p == ',') p++;
    if (strncmp(p, "...", 3) == 0) break;
    char *end;
    double v = strtod(p, &end);
    if (end == p || nhead == 8) goto out;
    head[nhead++] = v;
    p = end;
  }
  p += 3;
  while (*p == ' ' || *p == ',') p++;
  double last = strtod(p, NULL);
  if (nhead < 2 || kiln_literal_create(NULL, &shape, 0, &lit, NULL)) goto out;
  double step = head[1] - head[0];
  int64_t n = kiln_literal_elements(lit);
  for (int64_t i = 0; i < n; i++) kiln_literal_set_f64(lit, i, head[0] + step * (double)i);
  if (n == 0 || head[0] + step * (double)(n - 1) != last) {
    kiln_literal_destroy(lit);
    lit = NULL;
  }
out:
  kiln_arena_destroy(a);
  return lit;
}

static kiln_literal *parse_value(const char *text);

static kiln_literal *tuple_literal(const char *text) {
  /* "( f32[3] {1, 2, 3}, s32[] 1 )": elements split at top-level commas. */
  size_t n = strlen(text);
  if (n < 2 || text[0] != '(' || text[n - 1] != ')') return NULL;
  kiln_literal *elems[16];
  uint32_t ne = 0;
  char *body = kiln_strndup(text + 1, n - 2);
  if (body == NULL) return NULL;
  int depth = 0;
  char *start = body;
  bool ok = true;
  for (char *q = body;; q++) {
    if (*q == '{' || *q == '(' || *q == '[') depth++;
    if (*q == '}' || *q == ')' || *q == ']') depth--;
    if ((*q == ',' && depth == 0) || *q == '\0') {
      char saved = *q;
      *q = '\0';
      char *t = trim(start);
      if (*t) {
        if (ne == 16 || (elems[ne] = parse_value(t)) == NULL)
          ok = false;
        else
          ne++;
      }
      if (saved == '\0' || !ok) break;
      start = q + 1;
    }
  }
  kiln_free(body);
  kiln_literal *lit = NULL;
  kiln_arena *a = kiln_arena_create();
  kiln_shape shapes[16], tshape;
  for (uint32_t i = 0; ok && i < ne; i++) shapes[i] = elems[i]->shape;
  if (ok && a && kiln_shape_make_tuple(a, &tshape, shapes, ne) == 0 &&
      kiln_literal_create(NULL, &tshape, 0, &lit, NULL) == 0) {
    for (uint32_t i = 0; i < ne; i++)
      if (elems[i]->nbytes) memcpy(lit->elems[i]->data, elems[i]->data, elems[i]->nbytes);
  }
  for (uint32_t i = 0; i < ne; i++) kiln_literal_destroy(elems[i]);
  kiln_arena_destroy(a);
  return lit;
}

/* A literal in any of the forms above; NULL when none fits. */
static kiln_literal *parse_value(const char *text) {
  kiln_literal *lit = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  if (strstr(text, ", every element ")) return filled_literal(text);
  if (strstr(text, "...")) return progression_literal(text);
  if (kiln_literal_parse_text(text, strlen(text), &lit, &st) == 0) return lit;
  if (text[0] == '(') return tuple_literal(text);
  return NULL;
}

/* The literal text of a line: from the first shape (an element type name
 * followed by '[', or '(') to just before "  (" or " ->". */
static char *literal_text(char *s) {
  char *start = NULL;
  for (char *p = s; *p && start == NULL; p++) {
    if (p != s && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) continue;
    if (*p == '(') {
      start = p;
      break;
    }
    char *lb = p;
    while (isalnum((unsigned char)*lb)) lb++;
    kiln_dtype t;
    if (*lb == '[' && lb > p && kiln_dtype_from_name(p, (size_t)(lb - p), &t)) start = p;
  }
  if (start == NULL) return NULL;
  char *cut = strstr(start, "  (");
  if (cut) *cut = '\0';
  cut = strstr(start, " ->");
  if (cut) *cut = '\0';
  return trim(start);
}

#define MAX_DEVICES 16

typedef struct expect_case {
  kiln_literal *args[MAX_ARGS];
  int nargs;
  kiln_literal *expected;
} expect_case;

typedef struct expectation {
  expect_case cases[MAX_CASES];
  int ncases;
  bool exact;
  char why_skip[128]; /* non-empty: executing is skipped for this reason */
  /* A per-device program: run on replicas x partitions devices, device K
   * expected to give per_device[K] ("replica K: LITERAL" lines). */
  int replicas, partitions;
  kiln_literal *per_device[MAX_DEVICES];
  int ndevices;
} expectation;

static void expectation_free(expectation *e) {
  for (int k = 0; k < e->ndevices; k++) kiln_literal_destroy(e->per_device[k]);
  for (int c = 0; c < e->ncases; c++) {
    for (int i = 0; i < e->cases[c].nargs; i++) kiln_literal_destroy(e->cases[c].args[i]);
    kiln_literal_destroy(e->cases[c].expected);
  }
}

/* "input NAME (p1, tuple): LITERAL": the parameter number, or -1. */
static int param_index(const char *line) {
  const char *colon = strchr(line, ':');
  for (const char *p = line; p && colon && p < colon; p++) {
    if (p[0] == 'p' && isdigit((unsigned char)p[1]) &&
        (p == line || p[-1] == '(' || p[-1] == ' ')) {
      char *end;
      long v = strtol(p + 1, &end, 10);
      if (*end == ')' || *end == ',') return (int)v;
    }
  }
  return -1;
}

static bool add_input(expect_case *c, char *line, char *why, size_t whysize) {
  int k = param_index(line);
  char *colon = strchr(line, ':');
  char *text = colon ? literal_text(colon + 1) : NULL;
  kiln_literal *lit = text ? parse_value(text) : NULL;
  if (lit == NULL) {
    snprintf(why, whysize, "cannot read input line '%s'", line);
    return false;
  }
  if (k < 0) k = c->nargs;
  if (k >= MAX_ARGS || c->args[k]) {
    kiln_literal_destroy(lit);
    snprintf(why, whysize, "bad input index in '%s'", line);
    return false;
  }
  c->args[k] = lit;
  if (k + 1 > c->nargs) c->nargs = k + 1;
  return true;
}

/* Reads NNN.expected.txt into e; returns false with a reason on a form it
 * cannot read (a runner failure, reported as such). */
static bool read_expected(char *text, expectation *e, char *why, size_t whysize) {
  expect_case *cur = &e->cases[0];
  e->ncases = 1;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    line = trim(line);
    const char *rc_at = strstr(line, "replica_count");
    if (rc_at) e->replicas = atoi(rc_at + strcspn(rc_at, "=:") + 1);
    const char *np_at = strstr(line, "num_partitions");
    if (np_at) e->partitions = atoi(np_at + strcspn(np_at, "=:") + 1);
    if (strncmp(line, "replica ", 8) == 0 && isdigit((unsigned char)line[8])) {
      /* "replica 1: u32[1] {110}" */
      int k = atoi(line + 8);
      char *colon = strchr(line, ':');
      char *t = colon ? literal_text(colon + 1) : NULL;
      if (k < 0 || k >= MAX_DEVICES || t == NULL || e->per_device[k])
        return snprintf(why, whysize, "cannot read '%s'", line), false;
      if ((e->per_device[k] = parse_value(t)) == NULL)
        return snprintf(why, whysize, "cannot read '%s'", line), false;
      if (k + 1 > e->ndevices) e->ndevices = k + 1;
      continue;
    }
    if (strncmp(line, "case ", 5) == 0) {
      /* "case 1: input p (p0): pred[] true   -> expected s32[] 42" */
      if (e->ncases == MAX_CASES) return snprintf(why, whysize, "too many cases"), false;
      expect_case *c = &e->cases[e->ncases - 1];
      if (c->nargs || c->expected) c = &e->cases[e->ncases++];
      char *arrow = strstr(line, "-> expected ");
      char *in = strstr(line, "input ");
      if (arrow == NULL || in == NULL) return snprintf(why, whysize, "bad case line"), false;
      char *exp_text = literal_text(arrow + strlen("-> expected "));
      c->expected = exp_text ? parse_value(exp_text) : NULL;
      *arrow = '\0';
      if (c->expected == NULL || !add_input(c, in, why, whysize)) {
        if (!why[0]) snprintf(why, whysize, "cannot read '%s'", line);
        return false;
      }
      cur = c;
    } else if (strncmp(line, "input ", 6) == 0 && strchr(line, ':')) {
      if (!add_input(cur, line, why, whysize)) return false;
    } else if (strncmp(line, "expected:", 9) == 0) {
      char *rest = trim(line + 9);
      if (*rest == '\0' && e->replicas > 1) continue; /* per-device lines follow */
      if (*rest == '\0' || strncmp(rest, "NOT STATED", 10) == 0) {
        snprintf(e->why_skip, sizeof e->why_skip, "no stated result");
        return true;
      }
      e->exact = strstr(rest, "(exact)") != NULL;
      char *t = literal_text(rest);
      cur->expected = t ? parse_value(t) : NULL;
      if (cur->expected == NULL)
        return snprintf(why, whysize, "cannot read expected line '%s'", line), false;
    }
  }
  if (e->ndevices) {
    int want = (e->replicas > 0 ? e->replicas : 1) * (e->partitions > 0 ? e->partitions : 1);
    if (want != e->ndevices || want > MAX_DEVICES)
      return snprintf(why, whysize, "%d per-device results for %d devices", e->ndevices, want),
             false;
    for (int k = 0; k < e->ndevices; k++)
      if (e->per_device[k] == NULL)
        return snprintf(why, whysize, "no result for device %d", k), false;
    return true;
  }
  for (int c = 0; c < e->ncases; c++)
    if (e->cases[c].expected == NULL)
      return snprintf(why, whysize, "no expected result found"), false;
  return true;
}

/* ---- comparing ---------------------------------------------------------- */

static void lit_str(const kiln_literal *l, char *buf, size_t size) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_literal_print(&b, l, true);
  const char *s = kiln_sbuf_failed(&b) ? "?" : kiln_sbuf_str(&b);
  if (strlen(s) >= size && size > 4)
    snprintf(buf, size, "%.*s...", (int)size - 4, s);
  else
    snprintf(buf, size, "%s", s);
  kiln_sbuf_free(&b);
}

static bool close_enough(double got, double want, bool exact) {
  if (isnan(got) || isnan(want)) return isnan(got) && isnan(want);
  if (got == want) return true;
  if (exact) return false;
  return fabs(got - want) <= 1e-6 * fmax(fabs(got), fabs(want));
}

static bool same_values(const kiln_literal *got, const kiln_literal *want, bool exact, char *why,
                        size_t whysize) {
  if (!kiln_shape_equal(&got->shape, &want->shape, false)) {
    kiln_sbuf a = KILN_SBUF_INIT, b = KILN_SBUF_INIT;
    kiln_shape_print_short(&a, &got->shape);
    kiln_shape_print_short(&b, &want->shape);
    snprintf(why, whysize, "result shape %s, expected %s", kiln_sbuf_str(&a), kiln_sbuf_str(&b));
    kiln_sbuf_free(&a);
    kiln_sbuf_free(&b);
    return false;
  }
  if (kiln_shape_is_tuple(&got->shape)) {
    for (uint32_t i = 0; i < got->shape.rank; i++)
      if (!same_values(got->elems[i], want->elems[i], exact, why, whysize)) return false;
    return true;
  }
  if (!kiln_shape_is_array(&got->shape)) return true;
  kiln_dtype t = got->shape.dtype;
  int64_t n = kiln_literal_elements(got);
  for (int64_t i = 0; i < n; i++) {
    bool ok;
    if (kiln_dtype_is_float(t)) {
      ok = close_enough(kiln_literal_get_f64(got, i), kiln_literal_get_f64(want, i), exact);
    } else if (kiln_dtype_is_complex(t)) {
      double gr, gi, wr, wi;
      kiln_literal_get_c128(got, i, &gr, &gi);
      kiln_literal_get_c128(want, i, &wr, &wi);
      ok = close_enough(gr, wr, exact) && close_enough(gi, wi, exact);
    } else {
      ok = kiln_literal_get_u64(got, i) == kiln_literal_get_u64(want, i);
    }
    if (!ok) {
      snprintf(why, whysize, "element %lld is %.17g, expected %.17g", (long long)i,
               kiln_literal_get_f64(got, i), kiln_literal_get_f64(want, i));
      return false;
    }
  }
  return true;
}

/* ---- stages ------------------------------------------------------------- */

static bool stage_round_trip(const kiln_module *m, const char *name) {
  kiln_status st;
  kiln_status_clear(&st);
  bool ok = false;
  kiln_module *m2 = NULL, *m3 = NULL;
  uint8_t *pb = NULL;
  size_t pblen, n1, n2, n3;
  char *t1 = kiln_module_print(m, &n1), *t2 = NULL, *t3 = NULL;
  if (t1 == NULL) {
    note("round-trip: printing failed");
    goto out;
  }
  if (kiln_module_parse_text(t1, n1, name, NULL, &m2, &st)) {
    note_status("round-trip: printed text does not parse", &st);
    goto out;
  }
  t2 = kiln_module_print(m2, &n2);
  if (t2 == NULL || n1 != n2 || memcmp(t1, t2, n1) != 0) {
    size_t i = 0;
    while (t2 && i < n1 && i < n2 && t1[i] == t2[i]) i++;
    note("round-trip: print -> parse -> print differs at byte %zu", i);
    goto out;
  }
  if (kiln_module_to_proto(m, &pb, &pblen, &st) || kiln_module_from_proto(pb, pblen, &m3, &st)) {
    note_status("round-trip: proto", &st);
    goto out;
  }
  t3 = kiln_module_print(m3, &n3);
  if (t3 == NULL || n1 != n3 || memcmp(t1, t3, n1) != 0) {
    size_t i = 0;
    while (t3 && i < n1 && i < n3 && t1[i] == t3[i]) i++;
    note("round-trip: text -> proto -> text differs at byte %zu: '%.60s' vs '%.60s'", i,
         t1 + (i < n1 ? i : n1), t3 ? t3 + (i < n3 ? i : n3) : "");
    goto out;
  }
  ok = true;
out:
  kiln_free(t1);
  kiln_free(t2);
  kiln_free(t3);
  kiln_free(pb);
  kiln_module_destroy(m2);
  kiln_module_destroy(m3);
  return ok;
}

/* Where cases run: the interpreter, or a CPU executable compiled once per
 * module (exe NULL until then). */
typedef struct runner {
  const char *backend; /* "interp" or "cpu" */
  kiln_executable *exe;
} runner;

static runner interp_runner = {"interp", NULL};

/* Runs one case: true when the result matches. */
static bool run_case(const kiln_module *m, expect_case *c, bool exact, const runner *r) {
  const kiln_computation *entry = kiln_module_entry(m);
  uint32_t np = kiln_computation_nparams(m, entry);
  if ((uint32_t)c->nargs != np) {
    note("execute: the expected file gives %d inputs, ENTRY takes %u", c->nargs, np);
    return false;
  }
  for (uint32_t i = 0; i < np; i++) {
    const kiln_instr *p = kiln_computation_param(m, entry, i);
    if (c->args[i] == NULL || p == NULL ||
        !kiln_shape_equal(&c->args[i]->shape, &p->shape, false)) {
      note("execute: input %u does not match parameter %u's shape", i, i);
      return false;
    }
  }
  kiln_status st;
  kiln_status_clear(&st);
  kiln_literal *out = NULL;
  const kiln_literal *const *args = (const kiln_literal *const *)c->args;
  int rc = r->exe ? kiln_run_executable(r->exe, NULL, NULL, args, np, &out, &st)
                  : kiln_interp_run(m, args, np, NULL, &out, &st);
  if (rc) {
    note("execute(%s): %s%s%s", r->backend, st.where, st.where[0] ? ": " : "", st.msg);
    return false;
  }
  char why[512] = "";
  bool ok = same_values(out, c->expected, exact, why, sizeof why);
  if (!ok) {
    char g[256], w[256];
    lit_str(out, g, sizeof g);
    lit_str(c->expected, w, sizeof w);
    note("execute(%s): %s; got %s, expected %s", r->backend, why, g, w);
  }
  kiln_literal_destroy(out);
  return ok;
}

/* A per-device program on the interpreter's mesh: every device gets the
 * case's inputs; device K must give e->per_device[K]. */
static bool run_mesh_case(const kiln_module *m, const expectation *e, const runner *r) {
  uint32_t R = e->replicas > 0 ? (uint32_t)e->replicas : 1;
  uint32_t P = e->partitions > 0 ? (uint32_t)e->partitions : 1;
  const expect_case *c = &e->cases[0];
  const kiln_literal *const *args[MAX_DEVICES];
  kiln_literal *outs[MAX_DEVICES] = {0};
  for (uint32_t k = 0; k < R * P; k++) args[k] = (const kiln_literal *const *)c->args;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_run_options o = {.timeout_seconds = 60};
  if (kiln_run_module_mesh(m, r->backend, &o, R, P, args, (uint32_t)c->nargs, outs, &st)) {
    note("execute(%s, %u x %u devices): %s%s%s", r->backend, R, P, st.where,
         st.where[0] ? ": " : "", st.msg);
    return false;
  }
  bool ok = true;
  for (uint32_t k = 0; k < R * P; k++) {
    char why[512] = "";
    if (!same_values(outs[k], e->per_device[k], e->exact, why, sizeof why)) {
      char g[256], w[256];
      lit_str(outs[k], g, sizeof g);
      lit_str(e->per_device[k], w, sizeof w);
      note("execute(%s): device %u: %s; got %s, expected %s", r->backend, k, why, g, w);
      ok = false;
    }
    kiln_literal_destroy(outs[k]);
  }
  return ok;
}

/* The truth-table form: run each stated input pair, check against the
 * reference function the file names. */
static const char *run_truth_table(const kiln_module *m, const char *text, bool *ok,
                                   const runner *r) {
  const char *line = strstr(text, "run in turn:");
  if (line == NULL || strstr(text, "logical OR") == NULL) return "no stated result";
  *ok = true;
  int ncases = 0;
  for (const char *p = strchr(line, '('); p && *p != '\n'; p = strchr(p + 1, '(')) {
    bool x = strncmp(p + 1, "true", 4) == 0;
    const char *comma = strchr(p, ',');
    if (comma == NULL) break;
    bool y = strncmp(comma + 1, "true", 4) == 0 || strncmp(comma + 2, "true", 4) == 0;
    expect_case c = {0};
    char buf[64];
    snprintf(buf, sizeof buf, "pred[] %s", x ? "true" : "false");
    c.args[0] = parse_value(buf);
    snprintf(buf, sizeof buf, "pred[] %s", y ? "true" : "false");
    c.args[1] = parse_value(buf);
    snprintf(buf, sizeof buf, "pred[] %s", x || y ? "true" : "false");
    c.expected = parse_value(buf);
    c.nargs = 2;
    if (!c.args[0] || !c.args[1] || !c.expected || !run_case(m, &c, true, r)) *ok = false;
    kiln_literal_destroy(c.args[0]);
    kiln_literal_destroy(c.args[1]);
    kiln_literal_destroy(c.expected);
    ncases++;
  }
  if (ncases == 0) *ok = false;
  return NULL;
}

/* Compiles m for the CPU backend into r->exe. false with `out` set when it
 * cannot run there: "unsupported (reason)" (KILN_EUNIMPL, *ok stays true)
 * or "FAIL" (any other error). */
static bool compile_cpu(const kiln_module *m, runner *r, char *out, size_t outsize, bool *ok) {
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_compile(m, NULL, &r->exe, NULL, &st);
  if (rc == 0) return true;
  if (rc == KILN_EUNIMPL) {
    snprintf(out, outsize, "unsupported (%s%s%.200s)", st.where, st.where[0] ? ": " : "", st.msg);
  } else {
    note("compile(cpu): %s%s%s", st.where, st.where[0] ? ": " : "", st.msg);
    snprintf(out, outsize, "FAIL");
    *ok = false;
  }
  return false;
}

/* "ok", "FAIL", "unsupported (reason)" or "skipped (reason)" into out. */
static bool stage_execute(const kiln_module *m, const char *dir, const char *file,
                          const index_row *row, char *out, size_t outsize, runner *r) {
  const char *stated = row->expected_stated;
  char num[8] = "";
  snprintf(num, sizeof num, "%.3s", file);
  bool yes = strncmp(stated, "yes", 3) == 0, inputs_only = strncmp(stated, "inputs-only", 11) == 0;
  if (strncmp(stated, "partial", 7) == 0) {
    const char *why = strchr(stated, '(');
    snprintf(out, outsize, "skipped (%s)",
             why ? "custom-call semantics are defined by the test's own handler" : "partial");
    return true;
  }
  if (!yes && !inputs_only) {
    snprintf(out, outsize, "skipped (no stated result)");
    return true;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.expected.txt", dir, num);
  char *text = read_text(path);
  if (text == NULL) {
    note("execute: cannot read %s", path);
    snprintf(out, outsize, "FAIL");
    return false;
  }
  bool ok = false;
  /* A per-device program ("replica K:" results) compiles for its mesh in
   * kiln_run_module_mesh; anything else once here for the cpu backend. */
  bool mesh = strstr(text, "replica 0:") != NULL || strstr(text, "replica_count") != NULL;
  if (strcmp(r->backend, "cpu") == 0 && r->exe == NULL && !mesh) {
    ok = true;
    if (!compile_cpu(m, r, out, outsize, &ok)) {
      kiln_free(text);
      return ok;
    }
  }
  if (inputs_only) {
    const char *skip = run_truth_table(m, text, &ok, r);
    kiln_free(text);
    if (skip) {
      snprintf(out, outsize, "skipped (%s)", skip);
      return true;
    }
    snprintf(out, outsize, ok ? "ok" : "FAIL");
    return ok;
  }
  expectation e;
  memset(&e, 0, sizeof e);
  char why[512] = "";
  if (!read_expected(text, &e, why, sizeof why)) {
    note("execute: %s: %s", path, why);
    snprintf(out, outsize, "FAIL");
  } else if (e.why_skip[0]) {
    snprintf(out, outsize, "skipped (%s)", e.why_skip);
    ok = true;
  } else if (e.ndevices) {
    ok = run_mesh_case(m, &e, r);
    snprintf(out, outsize, ok ? "ok (%d devices)" : "FAIL", e.ndevices);
  } else {
    ok = true;
    for (int c = 0; c < e.ncases; c++) ok &= run_case(m, &e.cases[c], e.exact, r);
    snprintf(out, outsize, ok ? "ok" : "FAIL");
  }
  expectation_free(&e);
  kiln_free(text);
  return ok;
}

/* The child's exit status for a module that passed but which the CPU
 * backend does not support (the parent counts these apart). */
#define EXIT_PASSED_CPU_UNSUPPORTED 10

static bool cpu_unsupported;

/* All stages of one module; prints its line; returns true when it passed. */
static bool check_module(const char *dir, const char *file, const char *index) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  char name[256];
  snprintf(name, sizeof name, "%.*s", (int)(strlen(file) - 4), file);
  index_row row = index_lookup(index, file);
  bool want_invalid = strstr(row.notes, "invalid") != NULL;

  bool parsed = false, round = false, verified = false, executed = false, executed_cpu = true;
  char exec[512] = "skipped (not verified)", exec_cpu[512] = "skipped (not verified)";
  runner cpu = {"cpu", NULL};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  char *text = read_text(path);
  if (text == NULL) {
    note("parse: cannot read %s: %s", path, strerror(errno));
  } else if (kiln_module_parse_text(text, strlen(text), path, NULL, &m, &st)) {
    note_status("parse", &st);
  } else {
    parsed = true;
  }
  kiln_free(text);
  if (parsed) {
    round = stage_round_trip(m, path);
    kiln_status_clear(&st);
    int rc = kiln_module_verify(m, NULL, &st);
    if (want_invalid) {
      verified = rc != 0 && st.msg[0] != '\0';
      if (verified)
        note_status("verify (rejected as expected)", &st);
      else
        note("verify: INDEX.tsv calls this module invalid, the verifier accepted it");
      snprintf(exec, sizeof exec, "skipped (invalid module)");
      snprintf(exec_cpu, sizeof exec_cpu, "skipped (invalid module)");
      executed = true;
    } else {
      verified = rc == 0;
      if (!verified)
        note_status("verify", &st);
      else {
        executed = stage_execute(m, dir, file, &row, exec, sizeof exec, &interp_runner);
        executed_cpu = stage_execute(m, dir, file, &row, exec_cpu, sizeof exec_cpu, &cpu);
      }
    }
  } else {
    snprintf(exec, sizeof exec, "skipped (not parsed)");
    snprintf(exec_cpu, sizeof exec_cpu, "skipped (not parsed)");
  }
  kiln_executable_destroy(cpu.exe);
  kiln_module_destroy(m);
  cpu_unsupported = strncmp(exec_cpu, "unsupported", 11) == 0;
  printf("%s: parsed %s, round-trip %s, verified %s, executed(interp) %s, executed(cpu) %s\n", name,
         parsed ? "ok" : "FAIL", round ? "ok" : "FAIL", verified ? "ok" : "FAIL", exec, exec_cpu);
  if (verbose && details.len) fputs(kiln_sbuf_str(&details), stdout);
  fflush(stdout);
  return parsed && round && verified && executed && executed_cpu;
}

/* ---- driver ------------------------------------------------------------- */

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int usage(void) {
  fprintf(stderr, "usage: kiln-conformance CORPUS_DIR [--verbose] [--timeout SECONDS]\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *dir = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--verbose") == 0 || strcmp(argv[i], "-v") == 0)
      verbose = true;
    else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc)
      timeout_s = (unsigned)atoi(argv[++i]);
    else if (argv[i][0] == '-' || dir)
      return usage();
    else
      dir = argv[i];
  }
  if (dir == NULL) dir = getenv("KILN_CORPUS_DIR");
  if (dir == NULL) return usage();
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    printf("corpus directory %s not found; skipping (set KILN_CORPUS_DIR)\n", dir);
    return 77;
  }
  DIR *d = opendir(dir);
  if (d == NULL) {
    printf("cannot open %s: %s\n", dir, strerror(errno));
    return 77;
  }
  char **files = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    size_t len = strlen(e->d_name);
    if (len < 5 || strcmp(e->d_name + len - 4, ".hlo") != 0) continue;
    if (kiln_grow((void **)&files, &cap, n + 1, sizeof *files)) return 3;
    files[n++] = kiln_strdup(e->d_name);
  }
  closedir(d);
  if (n) qsort(files, n, sizeof *files, by_name);
  char index_path[4096];
  snprintf(index_path, sizeof index_path, "%s/INDEX.tsv", dir);
  char *index = read_text(index_path);

  int passed = 0, failed = 0, unsupported = 0;
  for (size_t i = 0; i < n; i++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(timeout_s);
      bool ok = check_module(dir, files[i], index);
      _exit(!ok ? 1 : cpu_unsupported ? EXIT_PASSED_CPU_UNSUPPORTED : 0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) status = -1;
    if (status != -1 && WIFEXITED(status) &&
        (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == EXIT_PASSED_CPU_UNSUPPORTED)) {
      passed++;
      unsupported += WEXITSTATUS(status) == EXIT_PASSED_CPU_UNSUPPORTED;
    } else {
      failed++;
      if (status != -1 && WIFSIGNALED(status))
        printf("%.*s: FAIL (%s: signal %d, %s)\n", (int)(strlen(files[i]) - 4), files[i],
               WTERMSIG(status) == SIGALRM ? "timed out" : "crashed", WTERMSIG(status),
               strsignal(WTERMSIG(status)));
    }
    kiln_free(files[i]);
  }
  kiln_free(files);
  kiln_free(index);
  printf("%d passed, %d failed; %d unsupported by the cpu backend (listed above, not failures)\n",
         passed, failed, unsupported);
  return failed ? 1 : 0;
}
