/* The CUDA differential suite: programs compiled for the local GPU's
 * target (kiln_backend_default_target("cuda"); env KILN_CUDA_TARGET names
 * another) and run on the cuda backend, against the reference
 * interpreter on the same deterministic random arguments.
 *
 * Corpus: the random programs of tests/support/progen.c that
 * test_difftest and test_cuda_codegen use (KILN_CUDA_DIFF_SEEDS=N for
 * more than the default), in three mixes (every family, every family but
 * dot, and dots among layout changes: GEMM steps through cuBLASLt with
 * random dimension numbers, layouts, batches and f64), hand-written dots
 * (transposes, batches, a column-major result, matrix-vector, an epilogue,
 * a loop of products), and the JAX-exported programs of tests/data/jax
 * (gru_scan on arguments scaled by 1/16: its recurrence, on values in
 * [-1, 1], amplifies rounding until correct summation orders part; see
 * test_cuda_fake). f32 GEMMs run in pure f32 (KILN_CUDA_TF32 unset), so
 * the cpu tolerances hold for them too. Tolerances are
 * test_difftest's for the cpu backend (tests/support/tolerance.h):
 * integers and predicates bit-exact; floats within a relative 2e-5 (f32)
 * or 1e-10 (f64) of max(1, |reference|) over the output, which covers the
 * prelude's transcendental bounds and reassociated reductions. A program
 * the cuda target or backend refuses with KILN_EUNIMPL (convolution and
 * other library steps are not built for CUDA yet) is counted and listed,
 * never a failure; any other error is; a dot program refused is a failure.
 *
 * Also the buffer API (kiln_loaded_execute on device buffers), and that
 * a cpu executable, a corrupt one and one for another sm are refused at
 * load with a status.
 *
 * Without a driver or a GPU (CI) every case prints why and passes.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "executor/backend.h"
#include "tests/support/progen.h"
#include "tests/support/testargs.h"

/* The cuda backend and its target, or false (printing why) without a GPU. */
static bool gpu(kiln_backend **b, const char **target) {
  char why[600];
  if (kiln_backend_why_absent("cuda", why, sizeof why) || kiln_backend_caps("cuda") == 0) {
    fprintf(stderr, "skipped: %s\n", kiln_backend_caps("cuda") ? "?" : why);
    return false;
  }
  kiln_status st;
  kiln_status_clear(&st);
  const char *env = getenv("KILN_CUDA_TARGET");
  if (env && env[0])
    *target = env;
  else
    ck_assert_msg(kiln_backend_default_target("cuda", target, &st) == 0, "%s", st.msg);
  ck_assert_msg(kiln_backend_create("cuda", NULL, b, &st) == 0, "%s", st.msg);
  fprintf(stderr, "cuda: target %s, %u devices\n", *target, kiln_backend_device_count(*b));
  return true;
}

/* ---- comparing ------------------------------------------------------------- */

static double max_abs(const kiln_literal *lit) {
  double m = 1;
  int64_t n = kiln_literal_elements(lit);
  for (int64_t i = 0; i < n; i++) {
    double v = fabs(kiln_literal_get_f64(lit, i));
    if (isfinite(v) && v > m) m = v;
  }
  return m;
}

/* The first difference of got from ref beyond the tolerance into why;
 * false when there is none. */
static bool differs(const kiln_literal *ref, const kiln_literal *got, char *why, size_t n) {
  if (!kiln_shape_equal(&ref->shape, &got->shape, false)) {
    snprintf(why, n, "shapes differ");
    return true;
  }
  if (kiln_shape_is_tuple(&ref->shape)) {
    for (uint32_t i = 0; i < ref->shape.rank; i++)
      if (differs(ref->elems[i], got->elems[i], why, n)) return true;
    return false;
  }
  if (!kiln_shape_is_array(&ref->shape)) return false;
  kiln_dtype t = ref->shape.dtype;
  int64_t count = kiln_literal_elements(ref);
  if (kiln_dtype_is_float(t)) {
    double rtol = t == KILN_F64 ? 1e-10 : 2e-5, scale = max_abs(ref);
    for (int64_t i = 0; i < count; i++) {
      double x = kiln_literal_get_f64(ref, i), y = kiln_literal_get_f64(got, i);
      if (x == y || (isnan(x) && isnan(y))) continue;
      if (isnan(x) || isnan(y) || isinf(x) || isinf(y) || fabs(x - y) > rtol * (fabs(x) + scale)) {
        snprintf(why, n, "element %lld: expected %.17g, got %.17g", (long long)i, x, y);
        return true;
      }
    }
    return false;
  }
  if (kiln_dtype_is_complex(t)) {
    for (int64_t i = 0; i < count; i++) {
      double xr, xi, yr, yi;
      kiln_literal_get_c128(ref, i, &xr, &xi);
      kiln_literal_get_c128(got, i, &yr, &yi);
      if (fabs(xr - yr) > 2e-5 * (fabs(xr) + 1) || fabs(xi - yi) > 2e-5 * (fabs(xi) + 1)) {
        snprintf(why, n, "element %lld differs", (long long)i);
        return true;
      }
    }
    return false;
  }
  for (int64_t i = 0; i < count; i++)
    if (kiln_literal_get_u64(ref, i) != kiln_literal_get_u64(got, i)) {
      snprintf(why, n, "element %lld: expected %llu, got %llu", (long long)i,
               (unsigned long long)kiln_literal_get_u64(ref, i),
               (unsigned long long)kiln_literal_get_u64(got, i));
      return true;
    }
  return false;
}

/* ---- one case ---------------------------------------------------------------- */

typedef struct tally {
  int ran, refused, skipped, failed;
  kiln_sbuf refusals;
} tally;

static const kiln_interp_options interp_limits = {.max_while_iterations = 100000,
                                                  .timeout_seconds = 60};

/* Interpreter vs cuda on one module text, its random arguments scaled
 * by `scale` (1: as generated). */
static void run_case(kiln_backend *b, const char *target, const char *text, const char *name,
                     uint64_t seed, double scale, tally *t) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), name, NULL, &m, &st) == 0, "%s: %s",
                name, st.msg);
  ck_assert_msg(kiln_module_verify(m, NULL, &st) == 0, "%s: %s", name, st.msg);
  kiln_literal **args = NULL, *ref = NULL, *got = NULL;
  uint32_t nargs = 0;
  ck_assert_int_eq(kiln_test_args_random(m, seed, &args, &nargs, &st), 0);
  for (uint32_t a = 0; scale != 1 && a < nargs; a++)
    if (kiln_dtype_is_float(args[a]->shape.dtype))
      for (int64_t i = 0; i < kiln_literal_elements(args[a]); i++)
        kiln_literal_set_f64(args[a], i, kiln_literal_get_f64(args[a], i) * scale);
  if (kiln_interp_run(m, (const kiln_literal *const *)args, nargs, &interp_limits, &ref, &st)) {
    fprintf(stderr, "%s: skipped, the interpreter says %s\n", name, st.msg);
    t->skipped++;
    goto out;
  }
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.target = target;
  kiln_executable *e = NULL;
  kiln_loaded *l = NULL;
  int rc = kiln_compile(m, &o, &e, NULL, &st);
  if (rc == 0) rc = kiln_device_load(kiln_backend_device(b, 0), e, &l, &st);
  if (rc == KILN_EUNIMPL) {
    t->refused++;
    kiln_sbuf_printf(&t->refusals, "  %s: %s\n", name, st.msg);
  } else {
    ck_assert_msg(rc == 0, "%s: %s: %s\n%s", name, st.where, st.msg, text);
    kiln_run_options ro = {.timeout_seconds = 60, .max_while_iterations = 100000};
    rc = kiln_loaded_run(l, (const kiln_literal *const *)args, nargs, &ro, &got, &st);
    ck_assert_msg(rc == 0, "%s: run: %s: %s\n%s", name, st.where, st.msg, text);
    char why[512];
    if (differs(ref, got, why, sizeof why)) {
      fprintf(stderr, "cuda MISMATCH: %s: %s\n--- module ---\n%s--- end ---\n", name, why, text);
      t->failed++;
    }
    t->ran++;
  }
  kiln_literal_destroy(got);
  kiln_loaded_destroy(l);
  kiln_executable_destroy(e);
out:
  kiln_literal_destroy(ref);
  kiln_test_args_free(args, nargs);
  kiln_module_destroy(m);
}

static void tally_report(const char *what, tally *t) {
  fprintf(stderr, "%s: %d ran on cuda, %d refused (EUNIMPL), %d skipped, %d mismatched\n", what,
          t->ran, t->refused, t->skipped, t->failed);
  if (t->refused) fprintf(stderr, "refused:\n%s", kiln_sbuf_str(&t->refusals));
  kiln_sbuf_free(&t->refusals);
}

START_TEST(progen_corpus_matches_the_interpreter) {
  kiln_backend *b = NULL;
  const char *target = NULL;
  if (!gpu(&b, &target)) return;
  int seeds = getenv("KILN_CUDA_DIFF_SEEDS") ? atoi(getenv("KILN_CUDA_DIFF_SEEDS")) : 48;
  tally t = {0, 0, 0, 0, KILN_SBUF_INIT};
  for (int s = 1; s <= seeds; s++) {
    kiln_progen_options o = {0};
    o.seed = (uint64_t)s;
    o.ninstrs = 8 + s % 17;
    o.nparams = 1 + s % 3;
    o.dtype = s % 4 == 3 ? KILN_F64 : KILN_F32;
    o.families = s % 2 ? KILN_PROGEN_ALL : (KILN_PROGEN_ALL & ~KILN_PROGEN_DOT);
    char *text = kiln_progen_text(&o);
    ck_assert_ptr_nonnull(text);
    char name[48];
    snprintf(name, sizeof name, "progen seed %d", s);
    run_case(b, target, text, name, (uint64_t)s, 1, &t);
    kiln_free(text);
  }
  int failed = t.failed, ran = t.ran;
  tally_report("progen", &t);
  kiln_backend_destroy(b);
  ck_assert_int_eq(failed, 0);
  ck_assert_int_gt(ran, seeds / 2);
}
END_TEST

static const char *const dot_cases[][2] = {
    {"dot: batched, rhs K-minor",
     "HloModule d1\nENTRY e {\n  a = f32[3,17,9]{2,1,0} parameter(0)\n"
     "  b = f32[3,9,33]{1,2,0} parameter(1)\n"
     "  ROOT d = f32[3,17,33]{2,1,0} dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
     "rhs_batch_dims={0}, rhs_contracting_dims={1}\n}\n"},
    {"dot: column-major result",
     "HloModule d2\nENTRY e {\n  a = f32[70,40]{1,0} parameter(0)\n"
     "  b = f32[70,24]{1,0} parameter(1)\n"
     "  ROOT d = f32[40,24]{0,1} dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
     "}\n"},
    {"dot: f64",
     "HloModule d3\nENTRY e {\n  a = f64[20,11] parameter(0)\n  b = f64[11,30] parameter(1)\n"
     "  ROOT d = f64[20,30] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n"},
    {"dot: matrix-vector",
     "HloModule d4\nENTRY e {\n  a = f32[50,70] parameter(0)\n  v = f32[70] parameter(1)\n"
     "  ROOT d = f32[50] dot(a, v), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n"},
    {"dot: bias and relu",
     "HloModule d5\nENTRY e {\n  x = f32[512,384] parameter(0)\n  w = f32[384,1024] parameter(1)\n"
     "  bias = f32[1024] parameter(2)\n"
     "  d = f32[512,1024] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
     "  bb = f32[512,1024] broadcast(bias), dimensions={1}\n  s = f32[512,1024] add(d, bb)\n"
     "  z = f32[] constant(0)\n  zb = f32[512,1024] broadcast(z), dimensions={}\n"
     "  ROOT r = f32[512,1024] maximum(s, zb)\n}\n"},
};

/* GEMM steps through cuBLASLt: none may be refused. */
START_TEST(dot_programs_match_the_interpreter) {
  kiln_backend *b = NULL;
  const char *target = NULL;
  if (!gpu(&b, &target)) return;
  tally t = {0, 0, 0, 0, KILN_SBUF_INIT};
  for (size_t i = 0; i < sizeof dot_cases / sizeof dot_cases[0]; i++)
    run_case(b, target, dot_cases[i][1], dot_cases[i][0], 11 + i, 1, &t);
  int seeds = getenv("KILN_CUDA_DIFF_SEEDS") ? atoi(getenv("KILN_CUDA_DIFF_SEEDS")) : 48;
  for (int s = 1; s <= seeds / 2; s++) {
    kiln_progen_options o = {0};
    o.seed = (uint64_t)s + 5000;
    o.ninstrs = 6 + s % 9;
    o.nparams = 2 + s % 2;
    o.dtype = s % 3 == 2 ? KILN_F64 : KILN_F32;
    o.families = KILN_PROGEN_DOT | KILN_PROGEN_ELEMENTWISE | KILN_PROGEN_BROADCAST |
                 KILN_PROGEN_TRANSPOSE | KILN_PROGEN_RESHAPE;
    char *text = kiln_progen_text(&o);
    char name[48];
    snprintf(name, sizeof name, "progen dot seed %d", s + 5000);
    run_case(b, target, text, name, (uint64_t)s, 1, &t);
    kiln_free(text);
  }
  int failed = t.failed, refused = t.refused;
  tally_report("dots", &t);
  kiln_backend_destroy(b);
  ck_assert_int_eq(failed, 0);
  ck_assert_int_eq(refused, 0);
}
END_TEST

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = kiln_malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    kiln_free(buf);
    buf = NULL;
  }
  if (buf) buf[n] = '\0';
  fclose(f);
  return buf;
}

START_TEST(jax_programs_match_the_interpreter) {
  kiln_backend *b = NULL;
  const char *target = NULL;
  if (!gpu(&b, &target)) return;
  static const char *const files[] = {"layernorm_softmax", "mlp_grad", "transformer", "embedding",
                                      "gru_scan",          "mlp2",     "block_small"};
  tally t = {0, 0, 0, 0, KILN_SBUF_INIT};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/jax/%s.hlo", KILN_SOURCE_DIR, files[i]);
    char *text = read_file(path);
    ck_assert_msg(text != NULL, "cannot read %s", path);
    run_case(b, target, text, path, 7, strstr(files[i], "gru_scan") ? 1.0 / 16 : 1, &t);
    kiln_free(text);
  }
  int failed = t.failed, refused = t.refused;
  tally_report("jax", &t);
  kiln_backend_destroy(b);
  ck_assert_int_eq(failed, 0);
  ck_assert_int_eq(refused, 0); /* their dots run through cuBLASLt */
}
END_TEST

static const char elementwise[] = "HloModule ew\n"
                                  "ENTRY e {\n"
                                  "  p = f32[1000,33] parameter(0)\n"
                                  "  q = f32[1000,33] parameter(1)\n"
                                  "  m = f32[1000,33] multiply(p, q)\n"
                                  "  ROOT a = f32[1000,33] add(m, p)\n"
                                  "}\n";

static kiln_executable *compile(const char *text, const char *target) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st) == 0, "%s",
                st.msg);
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.target = target;
  kiln_executable *e = NULL;
  ck_assert_msg(kiln_compile(m, &o, &e, NULL, &st) == 0, "%s", st.msg);
  kiln_module_destroy(m);
  return e;
}

/* Device buffers in, device buffers out, several runs of one load. */
START_TEST(execute_on_device_buffers) {
  kiln_backend *b = NULL;
  const char *target = NULL;
  if (!gpu(&b, &target)) return;
  kiln_executable *e = compile(elementwise, target);
  kiln_device *d = kiln_backend_device(b, 0);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_loaded *l = NULL;
  ck_assert_msg(kiln_device_load(d, e, &l, &st) == 0, "%s", st.msg);
  size_t n = 1000 * 33;
  float *p = kiln_malloc(n * 4), *q = kiln_malloc(n * 4), *r = kiln_malloc(n * 4);
  for (size_t i = 0; i < n; i++) {
    p[i] = (float)i * 0.25f;
    q[i] = 1.0f + (float)(i % 7);
  }
  kiln_buffer *in[2] = {NULL, NULL}, *out[1] = {NULL};
  ck_assert_int_eq(kiln_buffer_alloc(d, n * 4, &in[0], &st), 0);
  ck_assert_int_eq(kiln_buffer_alloc(d, n * 4, &in[1], &st), 0);
  ck_assert_int_eq(kiln_buffer_write(in[0], 0, p, n * 4, &st), 0);
  ck_assert_int_eq(kiln_buffer_write(in[1], 0, q, n * 4, &st), 0);
  for (int run = 0; run < 3; run++) {
    ck_assert_msg(kiln_loaded_execute(l, in, 2, NULL, out, 1, &st) == 0, "%s", st.msg);
    ck_assert_int_eq(kiln_buffer_read(out[0], 0, r, n * 4, &st), 0);
    for (size_t i = 0; i < n; i++) ck_assert_float_eq(r[i], p[i] * q[i] + p[i]);
    kiln_buffer_free(out[0]);
  }
  /* a buffer of the wrong size is refused before anything runs */
  kiln_buffer *small = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(d, 4, &small, &st), 0);
  kiln_buffer *bad[2] = {small, in[1]};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_execute(l, bad, 2, NULL, out, 1, &st), KILN_EINVAL);
  kiln_buffer_free(small);
  kiln_buffer_free(in[0]);
  kiln_buffer_free(in[1]);
  kiln_free(p);
  kiln_free(q);
  kiln_free(r);
  kiln_loaded_destroy(l);
  kiln_executable_destroy(e);
  kiln_backend_destroy(b);
}
END_TEST

START_TEST(foreign_and_corrupt_executables_are_refused) {
  kiln_backend *b = NULL;
  const char *target = NULL;
  if (!gpu(&b, &target)) return;
  kiln_device *d = kiln_backend_device(b, 0);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_loaded *l = NULL;
  /* cpu code */
  kiln_executable *cpu = compile(elementwise, "cpu");
  ck_assert_int_eq(kiln_device_load(d, cpu, &l, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "not a cuda target") != NULL, "%s", st.msg);
  kiln_executable_destroy(cpu);
  /* a kernel index out of range */
  kiln_executable *e = compile(elementwise, target);
  for (uint32_t p = 0; p < e->nprograms; p++)
    for (uint32_t i = 0; i < e->programs[p].nsteps; i++)
      if (e->programs[p].steps[i].kind == KILN_STEP_KERNEL) e->programs[p].steps[i].kernel = 999;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_load(d, e, &l, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "out of range") != NULL, "%s", st.msg);
  kiln_executable_destroy(e);
  /* a cubin that is not one */
  e = compile(elementwise, target);
  ck_assert_uint_gt(e->ncode, 64);
  memset(e->code + 40, 0x7f, 8); /* e_shoff far outside */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_load(d, e, &l, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "section headers") != NULL, "%s", st.msg);
  ck_assert_ptr_null(l);
  kiln_executable_destroy(e);
  /* code for another major architecture */
  const char *other = strcmp(target, "cuda-sm_80") == 0 ? "cuda-sm_90" : "cuda-sm_80";
  e = compile(elementwise, other);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_load(d, e, &l, &st), KILN_EUNIMPL);
  ck_assert_msg(strstr(st.msg, "this GPU is sm_") != NULL, "%s", st.msg);
  kiln_executable_destroy(e);
  kiln_backend_destroy(b);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cuda_diff");
  TCase *c = tcase_create("gpu");
  tcase_set_timeout(c, 300);
  tcase_add_test(c, progen_corpus_matches_the_interpreter);
  tcase_add_test(c, jax_programs_match_the_interpreter);
  tcase_add_test(c, dot_programs_match_the_interpreter);
  tcase_add_test(c, execute_on_device_buffers);
  tcase_add_test(c, foreign_and_corrupt_executables_are_refused);
  suite_add_tcase(s, c);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
