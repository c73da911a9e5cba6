/* Differential tests: the reference interpreter is the oracle for the pass
 * pipeline and the CPU backend.
 *
 * Inputs: modules from the random generator (tests/support/progen.c), the
 * corpus modules that the interpreter runs on one device, and the
 * examples. For each, the interpreter's result on the module as written is
 * the reference, with deterministic random arguments. Then:
 *  - pipeline: the pass pipeline (opt level 2, verifying after each pass)
 *    with all passes on, and with each pass switched off in turn, then the
 *    interpreter again. The passes are exact by contract (algsimp says no
 *    rewrite reassociates; constfold evaluates with the interpreter), so
 *    results must be bit-identical (NaNs equal to NaNs).
 *  - cpu: kiln_run_module(m, "cpu") with the same pass configurations.
 *    Integers and preds must be identical; floats agree within a small
 *    tolerance, because the backend sums in its own order (BLAS, vector
 *    lanes) and has its own transcendental functions (the per-op ULP bounds
 *    and the size-scaled reduction bound are in tests/support/tolerance.h;
 *    the relative tolerance here covers both). Ops the backend
 *    refuses with KILN_EUNIMPL are counted and listed, not failures.
 * On a mismatch the test prints what to replay: the seed (or file), the
 * configuration, the first differing element and the module text.
 *
 * Time: a few hundred generated modules, bounded for a 2-core machine;
 * KILN_DIFFTEST_SEEDS=N runs N seeds instead, for soak runs (with
 * CK_TIMEOUT_MULTIPLIER=K to give each case K times its 300 s, and
 * CK_RUN_CASE=cpu or pipeline to pick one).
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/compile.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/pass.h"
#include "executor/run.h"
#include "tests/support/progen.h"
#include "tests/support/testargs.h"

#define MAX_PASSES 32

/* ---- comparing results -------------------------------------------------- */

typedef struct tolerance {
  double rtol; /* 0: bit-exact */
} tolerance;

typedef struct diff {
  bool equal;
  bool exact;      /* equal bit for bit (NaN == NaN) */
  char where[512]; /* the first difference, when !equal */
} diff;

static void multi_index(char *buf, size_t size, const kiln_shape *s, int64_t flat) {
  int64_t idx[16] = {0};
  for (uint32_t d = s->rank; d-- > 0;) {
    if (d < 16 && s->dims[d]) {
      idx[d] = flat % s->dims[d];
      flat /= s->dims[d];
    }
  }
  size_t n = (size_t)snprintf(buf, size, "[");
  for (uint32_t d = 0; d < s->rank && d < 16 && n < size; d++)
    n += (size_t)snprintf(buf + n, size - n, "%s%lld", d ? "," : "", (long long)idx[d]);
  if (n < size) snprintf(buf + n, size - n, "]");
}

static double max_abs(const kiln_literal *lit) {
  double m = 1;
  int64_t n = kiln_literal_elements(lit);
  for (int64_t i = 0; i < n; i++) {
    double v = fabs(kiln_literal_get_f64(lit, i));
    if (isfinite(v) && v > m) m = v;
  }
  return m;
}

static bool float_close(double a, double b, double rtol, double scale, bool *exact) {
  if (a == b || (isnan(a) && isnan(b))) {
    if (a == 0 && b == 0 && signbit(a) != signbit(b)) *exact = false;
    return true;
  }
  *exact = false;
  if (rtol == 0 || isnan(a) || isnan(b) || isinf(a) || isinf(b)) return false;
  return fabs(a - b) <= rtol * (fabs(a) + scale);
}

static void compare_array(const kiln_literal *ref, const kiln_literal *got, const char *path,
                          tolerance tol, diff *d) {
  char ishape[64];
  if (!kiln_shape_equal(&ref->shape, &got->shape, false)) {
    kiln_sbuf a = KILN_SBUF_INIT, b = KILN_SBUF_INIT;
    kiln_shape_print_short(&a, &ref->shape);
    kiln_shape_print_short(&b, &got->shape);
    snprintf(d->where, sizeof d->where, "output %s: shape %s, expected %s", path, kiln_sbuf_str(&b),
             kiln_sbuf_str(&a));
    kiln_sbuf_free(&a);
    kiln_sbuf_free(&b);
    d->equal = d->exact = false;
    return;
  }
  kiln_dtype t = ref->shape.dtype;
  int64_t n = kiln_literal_elements(ref);
  double scale = kiln_dtype_is_float(t) || kiln_dtype_is_complex(t) ? max_abs(ref) : 0;
  for (int64_t i = 0; i < n; i++) {
    bool ok, ex = true;
    char a[64], b[64];
    if (kiln_dtype_is_float(t)) {
      double x = kiln_literal_get_f64(ref, i), y = kiln_literal_get_f64(got, i);
      ok = float_close(x, y, tol.rtol, scale, &ex);
      snprintf(a, sizeof a, "%.17g", x);
      snprintf(b, sizeof b, "%.17g", y);
    } else if (kiln_dtype_is_complex(t)) {
      double xr, xi, yr, yi;
      kiln_literal_get_c128(ref, i, &xr, &xi);
      kiln_literal_get_c128(got, i, &yr, &yi);
      ok = float_close(xr, yr, tol.rtol, scale, &ex) && float_close(xi, yi, tol.rtol, scale, &ex);
      snprintf(a, sizeof a, "(%.17g, %.17g)", xr, xi);
      snprintf(b, sizeof b, "(%.17g, %.17g)", yr, yi);
    } else if (kiln_dtype_is_unsigned_int(t) || t == KILN_PRED) {
      uint64_t x = kiln_literal_get_u64(ref, i), y = kiln_literal_get_u64(got, i);
      ok = ex = x == y;
      snprintf(a, sizeof a, "%llu", (unsigned long long)x);
      snprintf(b, sizeof b, "%llu", (unsigned long long)y);
    } else {
      int64_t x = kiln_literal_get_s64(ref, i), y = kiln_literal_get_s64(got, i);
      ok = ex = x == y;
      snprintf(a, sizeof a, "%lld", (long long)x);
      snprintf(b, sizeof b, "%lld", (long long)y);
    }
    if (!ex) d->exact = false;
    if (!ok) {
      multi_index(ishape, sizeof ishape, &ref->shape, i);
      snprintf(d->where, sizeof d->where, "output %s element %s (flat %lld): expected %s, got %s",
               path, ishape, (long long)i, a, b);
      d->equal = false;
      return;
    }
  }
}

static void compare_lit(const kiln_literal *ref, const kiln_literal *got, const char *path,
                        tolerance tol, diff *d) {
  if (!d->equal) return;
  if (kiln_shape_is_tuple(&ref->shape)) {
    if (!kiln_shape_is_tuple(&got->shape) || got->shape.rank != ref->shape.rank) {
      snprintf(d->where, sizeof d->where, "output %s: tuple structure differs", path);
      d->equal = d->exact = false;
      return;
    }
    for (uint32_t i = 0; i < ref->shape.rank; i++) {
      char sub[128];
      snprintf(sub, sizeof sub, "%s{%u}", path, i);
      compare_lit(ref->elems[i], got->elems[i], sub, tol, d);
    }
    return;
  }
  if (!kiln_shape_is_array(&ref->shape)) return; /* tokens */
  compare_array(ref, got, path, tol, d);
}

static diff compare(const kiln_literal *ref, const kiln_literal *got, tolerance tol) {
  diff d = {true, true, ""};
  compare_lit(ref, got, "", tol, &d);
  return d;
}

/* ---- one case ----------------------------------------------------------- */

typedef struct dcase {
  char name[256];   /* "progen seed 17" or a file path */
  const char *text; /* the module as text (replayable) */
  size_t len;
  kiln_literal **args;
  uint32_t nargs;
  kiln_literal *ref; /* the interpreter on the unchanged module */
} dcase;

/* Totals over a test, printed at its end. */
typedef struct tally {
  double t0; /* CLOCK_MONOTONIC seconds at the start */
  int cases, runs, failures, inexact, unsupported, skipped;
  kiln_sbuf unsupported_list;
} tally;

static void report(const dcase *c, const char *config, const char *what) {
  fprintf(stderr, "difftest MISMATCH: %s [%s]: %s\n--- module ---\n%.*s--- end ---\n", c->name,
          config, what, (int)c->len, c->text);
}

static kiln_module *parse(const dcase *c, kiln_status *st) {
  kiln_module *m = NULL;
  if (kiln_module_parse_text(c->text, c->len, c->name, NULL, &m, st)) return NULL;
  return m;
}

static const kiln_interp_options interp_limits = {.max_while_iterations = 100000,
                                                  .timeout_seconds = 60};

/* Parses, verifies, makes arguments and the reference result. false when
 * the case cannot be a reference (the interpreter refuses it): skipped. */
static bool prepare(dcase *c, uint64_t seed, bool must_run, double timeout_s) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = parse(c, &st);
  ck_assert_msg(m != NULL, "%s: parse: %s: %s", c->name, st.where, st.msg);
  int rc = kiln_module_verify(m, NULL, &st);
  ck_assert_msg(rc == 0, "%s: verify: %s: %s", c->name, st.where, st.msg);
  ck_assert_int_eq(kiln_test_args_random(m, seed, &c->args, &c->nargs, &st), 0);
  kiln_interp_options io = interp_limits;
  io.timeout_seconds = timeout_s;
  rc = kiln_interp_run(m, (const kiln_literal *const *)c->args, c->nargs, &io, &c->ref, &st);
  kiln_module_destroy(m);
  if (rc && !must_run)
    fprintf(stderr, "difftest: %s: skipped, the interpreter says %s%s%s\n", c->name, st.where,
            st.where[0] ? ": " : "", st.msg);
  if (rc && must_run)
    ck_abort_msg("%s: interpreter: %s: %s\n%.*s", c->name, st.where, st.msg, (int)c->len, c->text);
  return rc == 0;
}

static void release(dcase *c) {
  kiln_test_args_free(c->args, c->nargs);
  kiln_literal_destroy(c->ref);
  c->args = NULL;
  c->ref = NULL;
}

static void config_name(char *buf, size_t size, const char *backend, const char *off) {
  if (off)
    snprintf(buf, size, "%s, pass %s off", backend, off);
  else
    snprintf(buf, size, "%s, all passes", backend);
}

static void check_result(const dcase *c, const char *config, const kiln_literal *got, tolerance tol,
                         tally *t) {
  diff d = compare(c->ref, got, tol);
  if (!d.equal) {
    report(c, config, d.where);
    t->failures++;
  } else if (!d.exact) {
    t->inexact++;
  }
}

/* The pipeline with pass `off` disabled (NULL: all on), then the
 * interpreter; bit-exact against the reference. */
static void run_pipeline(const dcase *c, const char *off, tally *t) {
  char config[128];
  config_name(config, sizeof config, "pipeline+interp", off);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = parse(c, &st);
  ck_assert_ptr_nonnull(m);
  const char *disabled[1] = {off};
  kiln_pipeline_options po = {0};
  po.opt_level = 2;
  po.verify_each = true;
  po.disabled = disabled;
  po.ndisabled = off ? 1 : 0;
  t->runs++;
  int rc = kiln_pipeline_run(m, &po, NULL, NULL, &st);
  if (rc) {
    char what[1400];
    snprintf(what, sizeof what, "pipeline failed: %s: %s", st.where, st.msg);
    report(c, config, what);
    t->failures++;
    kiln_module_destroy(m);
    return;
  }
  kiln_literal *got = NULL;
  rc =
      kiln_interp_run(m, (const kiln_literal *const *)c->args, c->nargs, &interp_limits, &got, &st);
  if (rc) {
    char what[1400];
    snprintf(what, sizeof what, "interpreter failed after the pipeline: %s: %s", st.where, st.msg);
    report(c, config, what);
    t->failures++;
    char *after = kiln_module_print(m, NULL);
    fprintf(stderr, "--- after the pipeline ---\n%s--- end ---\n", after ? after : "");
    kiln_free(after);
  } else {
    check_result(c, config, got, (tolerance){0}, t);
  }
  kiln_literal_destroy(got);
  kiln_module_destroy(m);
}

/* The pass names, for switching each off in turn. */
static uint32_t pass_names(const char **names) {
  uint32_t n;
  const kiln_pass *p = kiln_pipeline_passes(&n);
  if (n > MAX_PASSES) n = MAX_PASSES;
  for (uint32_t i = 0; i < n; i++) names[i] = p[i].name;
  return n;
}

/* All pipeline configurations for one case. */
static void pipeline_all(const dcase *c, tally *t) {
  const char *names[MAX_PASSES];
  uint32_t n = pass_names(names);
  run_pipeline(c, NULL, t);
  for (uint32_t i = 0; i < n; i++) run_pipeline(c, names[i], t);
}

/* ---- the CPU backend ---------------------------------------------------- */

static tolerance cpu_tolerance(const kiln_literal *ref) {
  /* f64 when every float leaf is f64, else f32-sized */
  bool f64 = true;
  if (kiln_shape_is_tuple(&ref->shape)) {
    for (uint32_t i = 0; i < ref->shape.rank; i++)
      if (cpu_tolerance(ref->elems[i]).rtol > 1e-9) f64 = false;
  } else if (kiln_shape_is_array(&ref->shape)) {
    f64 = ref->shape.dtype == KILN_F64 || !kiln_dtype_is_float(ref->shape.dtype);
  }
  return (tolerance){f64 ? 1e-10 : 2e-5};
}

/* The CPU backend with pass `off` disabled; false when the backend refused
 * the module (KILN_EUNIMPL), which is counted, not failed. */
static bool run_cpu(const dcase *c, const char *off, tally *t) {
  char config[128];
  config_name(config, sizeof config, "cpu", off);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = parse(c, &st);
  ck_assert_ptr_nonnull(m);
  const char *disabled[1] = {off};
  kiln_compile_options co;
  kiln_compile_options_init(&co);
  co.opt_level = 2;
  co.verify_each = true;
  co.disabled = disabled;
  co.ndisabled = off ? 1 : 0;
  kiln_literal *got = NULL;
  t->runs++;
  int rc =
      kiln_run_module(m, "cpu", &co, (const kiln_literal *const *)c->args, c->nargs, &got, &st);
  bool supported = true;
  if (rc == KILN_EUNIMPL) {
    t->runs--;
    t->unsupported++;
    kiln_sbuf_printf(&t->unsupported_list, "  %s [%s]: %s%s%s\n", c->name, config, st.where,
                     st.where[0] ? ": " : "", st.msg);
    supported = false;
  } else if (rc) {
    char what[1400];
    snprintf(what, sizeof what, "cpu backend failed: %s: %s", st.where, st.msg);
    report(c, config, what);
    t->failures++;
  } else {
    check_result(c, config, got, cpu_tolerance(c->ref), t);
  }
  kiln_literal_destroy(got);
  kiln_module_destroy(m);
  return supported;
}

static void cpu_all(const dcase *c, bool each_pass, tally *t) {
  if (!run_cpu(c, NULL, t) || !each_pass) return;
  const char *names[MAX_PASSES];
  uint32_t n = pass_names(names);
  for (uint32_t i = 0; i < n; i++) run_cpu(c, names[i], t);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static tally tally_start(void) {
  tally t = {0};
  t.t0 = now_s();
  return t;
}

static void tally_done(tally *t, const char *what) {
  fprintf(stderr,
          "difftest %s: %d cases, %d runs compared, %d mismatches, %d within tolerance but not "
          "bit-exact, %d unsupported by the backend, %d skipped (%.1f s)\n",
          what, t->cases, t->runs, t->failures, t->inexact, t->unsupported, t->skipped,
          now_s() - t->t0);
  if (t->unsupported_list.len)
    fprintf(stderr, "unsupported:\n%s", kiln_sbuf_str(&t->unsupported_list));
  kiln_sbuf_free(&t->unsupported_list);
  ck_assert_msg(t->failures == 0, "%s: %d mismatches (details above)", what, t->failures);
}

/* ---- generated modules -------------------------------------------------- */

static int nseeds(int dflt) {
  const char *e = getenv("KILN_DIFFTEST_SEEDS");
  int n = e ? atoi(e) : 0;
  return n > 0 ? n : dflt;
}

static kiln_progen_options seed_options(uint64_t s) {
  kiln_progen_options o = {0};
  o.seed = s;
  o.ninstrs = 8 + (int)(s % 17);
  o.nparams = 1 + (int)(s % 3);
  o.dtype = s % 4 == 3 ? KILN_F64 : KILN_F32;
  o.differentiable = s % 6 == 5;
  o.scalar_output = s % 9 == 4;
  return o;
}

static void progen_case(dcase *c, uint64_t s, char **text) {
  kiln_progen_options o = seed_options(s);
  *text = kiln_progen_text(&o);
  ck_assert_ptr_nonnull(*text);
  memset(c, 0, sizeof *c);
  snprintf(c->name, sizeof c->name, "progen seed %llu (ninstrs %d, nparams %d, %s%s%s)",
           (unsigned long long)s, o.ninstrs, o.nparams, kiln_dtype_name(o.dtype),
           o.differentiable ? ", differentiable" : "", o.scalar_output ? ", scalar_output" : "");
  c->text = *text;
  c->len = strlen(*text);
}

START_TEST(test_progen_pipeline) {
  tally t = tally_start();
  int n = nseeds(300);
  for (int s = 0; s < n; s++) {
    dcase c;
    char *text;
    progen_case(&c, (uint64_t)s, &text);
    prepare(&c, (uint64_t)s, true, 60);
    t.cases++;
    pipeline_all(&c, &t);
    release(&c);
    kiln_free(text);
  }
  tally_done(&t, "progen pipeline+interp");
}
END_TEST

START_TEST(test_progen_cpu) {
  tally t = tally_start();
  /* Each compile costs a C compiler run (~0.1-0.2 s): every pass
   * configuration on the first seeds, all passes on for the rest. */
  int n = nseeds(60), each = n / 10;
  for (int s = 0; s < n; s++) {
    dcase c;
    char *text;
    progen_case(&c, (uint64_t)s, &text);
    prepare(&c, (uint64_t)s, true, 60);
    t.cases++;
    cpu_all(&c, s < each, &t);
    release(&c);
    kiln_free(text);
  }
  tally_done(&t, "progen cpu");
}
END_TEST

/* ---- corpus and examples ------------------------------------------------ */

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  kiln_sbuf b = KILN_SBUF_INIT;
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) kiln_sbuf_putn(&b, chunk, n);
  fclose(f);
  kiln_sbuf_puts(&b, "");
  return kiln_sbuf_detach(&b, len);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The .hlo files of a directory, sorted; NULL when it cannot be read. */
static char **list_hlo(const char *dir, int *n) {
  DIR *d = opendir(dir);
  *n = 0;
  if (d == NULL) return NULL;
  char **v = kiln_calloc(512, sizeof *v);
  struct dirent *e;
  while (v && (e = readdir(d)) != NULL && *n < 512) {
    size_t k = strlen(e->d_name);
    if (k > 4 && strcmp(e->d_name + k - 4, ".hlo") == 0) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      v[(*n)++] = kiln_strdup(path);
    }
  }
  closedir(d);
  if (v) qsort(v, (size_t)*n, sizeof *v, cmp_str);
  return v;
}

static void free_list(char **v, int n) {
  for (int i = 0; i < n; i++) kiln_free(v[i]);
  kiln_free(v);
}

static const char *corpus_dir(void) {
  const char *e = getenv("KILN_CORPUS_DIR");
  return e && *e ? e : KILN_SOURCE_DIR "/../shared/corpus/xla-hlo";
}

/* Runs every module of `dir` that parses, verifies and runs on the
 * interpreter on one device (others are skipped) through the pipeline
 * configurations and the CPU backend. A module whose reference run takes
 * over 3 s is skipped (listed), one over 0.3 s runs with all passes on
 * only: the whole stays within a minute on two cores. */
static void files(const char *dir, const char *what, bool all_must_run) {
  int n;
  char **v = list_hlo(dir, &n);
  if (v == NULL || n == 0) {
    fprintf(stderr, "difftest %s: no modules in %s, skipped\n", what, dir);
    free_list(v, n);
    return;
  }
  tally tp = tally_start(), tc = tally_start();
  for (int i = 0; i < n; i++) {
    dcase c;
    memset(&c, 0, sizeof c);
    size_t len;
    char *text = read_file(v[i], &len);
    ck_assert_ptr_nonnull(text);
    snprintf(c.name, sizeof c.name, "%s", v[i]);
    c.text = text;
    c.len = len;
    kiln_status st;
    kiln_status_clear(&st);
    kiln_module *m = parse(&c, &st);
    bool ok = m && kiln_module_verify(m, NULL, &st) == 0 && m->replica_count <= 1 &&
              m->num_partitions <= 1;
    kiln_module_destroy(m);
    double t0 = now_s();
    if (ok && prepare(&c, 1, all_must_run, 3.0) && now_s() - t0 > 3.0) {
      /* the interpreter checks its time limit between instructions: one
       * long instruction can overrun it */
      fprintf(stderr, "difftest: %s: skipped, reference run %.1f s (over 3 s)\n", v[i],
              now_s() - t0);
      tp.skipped++;
      tc.skipped++;
    } else if (ok && c.ref) {
      bool each = now_s() - t0 < 0.3;
      tp.cases++;
      tc.cases++;
      if (each) {
        pipeline_all(&c, &tp);
      } else {
        run_pipeline(&c, NULL, &tp);
        fprintf(stderr, "difftest: %s: reference run %.1f s, all passes on only\n", v[i],
                now_s() - t0);
      }
      cpu_all(&c, each && all_must_run, &tc); /* corpus: all passes on only */
    } else {
      tp.skipped++;
      tc.skipped++;
    }
    release(&c);
    kiln_free(text);
  }
  free_list(v, n);
  char label[128];
  snprintf(label, sizeof label, "%s pipeline+interp", what);
  tally_done(&tp, label);
  snprintf(label, sizeof label, "%s cpu", what);
  tally_done(&tc, label);
}

START_TEST(test_corpus) { files(corpus_dir(), "corpus", false); }
END_TEST

START_TEST(test_examples) { files(KILN_SOURCE_DIR "/examples", "examples", true); }
END_TEST

/* The comparison itself: exact, tolerance, NaN, signed zero, first
 * difference named by index. */
START_TEST(test_compare) {
  kiln_literal *a, *b;
  kiln_status st;
  kiln_status_clear(&st);
  const char *ta = "(f32[2,2], s32[2]) ({ {1, 2}, {3, nan} }, {4, 5})";
  const char *tb = "(f32[2,2], s32[2]) ({ {1, 2.00001}, {3, nan} }, {4, 5})";
  ck_assert_int_eq(kiln_literal_parse_text(ta, strlen(ta), &a, &st), 0);
  ck_assert_int_eq(kiln_literal_parse_text(tb, strlen(tb), &b, &st), 0);
  diff d = compare(a, a, (tolerance){0});
  ck_assert(d.equal && d.exact);
  d = compare(a, b, (tolerance){0});
  ck_assert(!d.equal);
  ck_assert_str_eq(d.where,
                   "output {0} element [0,1] (flat 1): expected 2, got 2.0000100135803223");
  d = compare(a, b, (tolerance){1e-5});
  ck_assert(d.equal && !d.exact);
  kiln_literal_destroy(b);
  const char *tc = "(f32[2,2], s32[2]) ({ {1, 2}, {3, nan} }, {4, 6})";
  ck_assert_int_eq(kiln_literal_parse_text(tc, strlen(tc), &b, &st), 0);
  d = compare(a, b, (tolerance){1e-3});
  ck_assert(!d.equal);
  ck_assert_str_eq(d.where, "output {1} element [1] (flat 1): expected 5, got 6");
  kiln_literal_destroy(b);
  const char *tz = "(f32[2,2], s32[2]) ({ {1, 2}, {-0, nan} }, {4, 5})";
  kiln_literal_destroy(a);
  const char *t0 = "(f32[2,2], s32[2]) ({ {1, 2}, {0, nan} }, {4, 5})";
  ck_assert_int_eq(kiln_literal_parse_text(t0, strlen(t0), &a, &st), 0);
  ck_assert_int_eq(kiln_literal_parse_text(tz, strlen(tz), &b, &st), 0);
  d = compare(a, b, (tolerance){0});
  ck_assert(d.equal && !d.exact); /* -0 == +0, but not bit for bit */
  kiln_literal_destroy(a);
  kiln_literal_destroy(b);
}
END_TEST

/* One tcase per input set, so CK_RUN_CASE=cpu (or pipeline, corpus,
 * examples) runs one of them. */
static void add_case(Suite *s, const char *name, const TTest *test) {
  TCase *tc = tcase_create(name);
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test);
  suite_add_tcase(s, tc);
}

int main(void) {
  Suite *s = suite_create("difftest");
  add_case(s, "compare", test_compare);
  add_case(s, "pipeline", test_progen_pipeline);
  add_case(s, "cpu", test_progen_cpu);
  add_case(s, "corpus", test_corpus);
  add_case(s, "examples", test_examples);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
