/* Linear algebra: JAX's LAPACK custom calls (compiler/ir/lapack.c), their
 * reference loops in the interpreter (compiler/eval/interp_lapack.c) and
 * the cpu backend's LINALG step (executor/cpu/cpu_linalg.c).
 *
 * - The verifier refuses malformed calls (flags, keys, shapes, operand
 *   counts) with a message naming what is wrong.
 * - The interpreter gives LAPACK's answers on small matrices worked by
 *   hand (the other triangle of potrf, getrf's 1-based pivots, geqrf's
 *   reflector and tau, info on failure).
 * - The cpu backend agrees with the interpreter on random batches, f32
 *   and f64, in the column-major layouts JAX writes and in others: the
 *   unique results elementwise; eigenvectors and singular vectors (unique
 *   only up to sign) through products computed in the same module
 *   (V diag(w) V^T, U diag(s) Vt, Q^T Q).
 * - Complex calls (c64, c128) agree likewise.
 * - A LINALG step description that does not fit its slots is refused.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sbuf.h"
#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "executor/run.h"

static kiln_status st;

static kiln_module *parse(const char *text) {
  kiln_module *m = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st) == 0,
                "parse: %s: %s\n%s", st.where, st.msg, text);
  return m;
}

/* The module must fail verification with a message containing needle. */
static void refused(const char *text, const char *needle) {
  kiln_module *m = NULL;
  kiln_status_clear(&st);
  int rc = kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st);
  if (rc == 0) {
    kiln_status_clear(&st);
    rc = kiln_module_verify(m, NULL, &st);
  }
  ck_assert_msg(rc != 0, "accepted, but should be refused:\n%s", text);
  ck_assert_msg(strstr(st.msg, needle) != NULL, "message '%s' lacks '%s'", st.msg, needle);
  kiln_module_destroy(m);
}

static void accepted(const char *text) {
  kiln_module *m = parse(text);
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_verify(m, NULL, &st) == 0, "verify: %s: %s\n%s", st.where, st.msg,
                text);
  kiln_module_destroy(m);
}

#define POTRF(shape, res, cfg) \
  "HloModule t\nENTRY main {\n  a = " shape " parameter(0)\n  ROOT c = " res \
  " custom-call(a), custom_call_target=\"lapack_spotrf_ffi\", " \
  "api_version=API_VERSION_TYPED_FFI, backend_config=" cfg "\n}\n"

START_TEST(test_verifier) {
  accepted(POTRF("f32[4,4]{0,1}", "(f32[4,4]{0,1}, s32[])", "{uplo = 76 : ui8}"));
  accepted(POTRF("f32[2,4,4]{1,2,0}", "(f32[2,4,4]{1,2,0}, s32[2])", "{uplo = 85 : ui8}"));
  accepted(POTRF("f32[4,4]", "(f32[4,4], s32[])", "\"{uplo = 76 : ui8}\""));
  accepted(POTRF("f32[0,4,4]", "(f32[0,4,4], s32[0])", "{uplo = 76 : ui8}"));
  refused(POTRF("f32[<=4,4]", "(f32[<=4,4], s32[])", "{uplo = 76 : ui8}"),
          "lapack_spotrf_ffi: operand 0 must be f32[4,4] (static)");
  refused(POTRF("f32[4,4]", "(f32[4,4], s32[])", "\"uplo\""), "uplo has no '= value'");
  refused(POTRF("f32[4,4]", "(f32[4,4], s32[])", "{uplo = 88 : ui8}"),
          "lapack_spotrf_ffi: uplo is 88, expected 76 ('L') or 85 ('U')");
  refused(POTRF("f32[4,4]", "(f32[4,4], s32[])", "{}"),
          "lapack_spotrf_ffi: backend_config has no uplo");
  refused(POTRF("f32[4,4]", "(f32[4,4], s32[])", "{uplo = 76 : ui8, side = 76 : ui8}"),
          "backend_config has key side, which potrf does not take");
  refused(POTRF("f32[4,4]", "(f32[4,4], s32[])", "{uplo = 76 : ui8, uplo = 76 : ui8}"),
          "backend_config gives uplo twice");
  refused(POTRF("f32[4,4]", "(f32[4,4], s32[])", "{uplo = 76 : i32}"), "uplo is not of type ui8");
  refused(POTRF("f32[4,4]", "(f32[4,4], s32[])", "{uplo 76}"), "uplo has no '= value'");
  refused(POTRF("f32[4,4]", "(f32[4,4], s32[])", "{uplo = 76 : ui8 diag}"),
          "expected ',' or '}' after uplo");
  refused(POTRF("f32[4,4]", "(f32[4,4], s32[])", "{uplo = 99999999 : ui8}"),
          "uplo is not a small integer");
  refused(POTRF("f32[4,3]", "(f32[4,3], s32[])", "{uplo = 76 : ui8}"),
          "lapack_spotrf_ffi: operand 0 must be square, is 4 x 3");
  refused(POTRF("f32[4,4]", "(f32[4,4], s32[2])", "{uplo = 76 : ui8}"),
          "lapack_spotrf_ffi: result 1 must be s32[] (static)");
  refused(POTRF("f32[4,4]", "(f64[4,4], s32[])", "{uplo = 76 : ui8}"),
          "lapack_spotrf_ffi: result 0 must be f32[4,4]");
  refused(POTRF("f32[4,4]", "f32[4,4]", "{uplo = 76 : ui8}"),
          "lapack_spotrf_ffi: the result must be a tuple of 2 arrays");
  refused(POTRF("f32[4]", "(f32[4], s32[])", "{uplo = 76 : ui8}"),
          "operand 0 must be a (batch of) matrices, has rank 1");
  /* gesdd's u and vt follow the mode; orgqr needs rows >= cols >= taus */
  refused("HloModule t\nENTRY main {\n  a = f64[5,3] parameter(0)\n"
          "  ROOT s = (f64[5,3], f64[3], f64[5,3], f64[3,3], s32[]) custom-call(a), "
          "custom_call_target=\"lapack_dgesdd_ffi\", backend_config={mode = 65 : ui8}\n}\n",
          "lapack_dgesdd_ffi: result 2 must be f64[5,5]");
  refused("HloModule t\nENTRY main {\n  a = f64[5,3] parameter(0)\n"
          "  ROOT s = (f64[5,3], f64[3], f64[5,5], f64[3,3], s32[]) custom-call(a), "
          "custom_call_target=\"lapack_dgesdd_ffi\", backend_config={mode = 79 : ui8}\n}\n",
          "mode is 79, expected 65 ('A') or 83 ('S') or 78 ('N')");
  refused("HloModule t\nENTRY main {\n  a = f32[3,5] parameter(0)\n  t = f32[3] parameter(1)\n"
          "  ROOT q = f32[3,5] custom-call(a, t), custom_call_target=\"lapack_sorgqr_ffi\", "
          "backend_config={}\n}\n",
          "needs rows >= columns >= reflectors, has 3 x 5 and 3 reflectors");
  refused("HloModule t\nENTRY main {\n  a = f32[4,4] parameter(0)\n"
          "  ROOT q = f32[4,4] custom-call(a), custom_call_target=\"lapack_strsm_ffi\", "
          "backend_config={diag = 78 : ui8, side = 76 : ui8, trans_x = 78 : ui8, uplo = 76 : "
          "ui8}\n}\n",
          "lapack_strsm_ffi takes 2 operands, 1 given");
}
END_TEST

/* ---- known answers on the interpreter -------------------------------------- */

static kiln_literal *run_interp(const char *text, kiln_literal *const *args, uint32_t n) {
  kiln_module *m = parse(text);
  kiln_run_options ro = {.max_while_iterations = 1000, .timeout_seconds = 60};
  kiln_literal *out = NULL;
  kiln_status_clear(&st);
  int rc = kiln_run_module_with(m, "interp", NULL, NULL, &ro, (const kiln_literal *const *)args, n,
                                &out, &st);
  ck_assert_msg(rc == 0, "interp: %s: %s\n%s", st.where, st.msg, text);
  kiln_module_destroy(m);
  return out;
}

/* A heap literal of the entry's parameter i of m, filled from v (logical
 * row-major), or by fn when v is NULL. */
static kiln_literal *param_literal(const kiln_module *m, uint32_t i) {
  const kiln_instr *p = kiln_computation_param(m, kiln_module_entry(m), i);
  kiln_literal *l = NULL;
  kiln_status_clear(&st);
  ck_assert(kiln_literal_create(NULL, &p->shape, 0, &l, &st) == 0);
  return l;
}

static void expect_values(const kiln_literal *l, const double *want, int64_t n, double tol) {
  ck_assert_int_eq(kiln_literal_elements(l), n);
  for (int64_t i = 0; i < n; i++) {
    double g = kiln_literal_get_f64(l, i);
    ck_assert_msg(fabs(g - want[i]) <= tol, "element %lld: %.17g, want %.17g", (long long)i, g,
                  want[i]);
  }
}

/* Runs text on the interpreter with one or two f64 arguments given row-major. */
static kiln_literal *known(const char *text, const double *a, const double *b) {
  kiln_module *m = parse(text);
  uint32_t np = kiln_computation_nparams(m, kiln_module_entry(m));
  kiln_literal *args[2] = {NULL, NULL};
  for (uint32_t i = 0; i < np; i++) {
    args[i] = param_literal(m, i);
    const double *v = i ? b : a;
    for (int64_t k = 0; k < kiln_literal_elements(args[i]); k++)
      kiln_literal_set_f64(args[i], k, v[k]);
  }
  kiln_module_destroy(m);
  kiln_literal *out = run_interp(text, args, np);
  for (uint32_t i = 0; i < np; i++) kiln_literal_destroy(args[i]);
  return out;
}

#define CALL1(shape, res, target, cfg) \
  "HloModule t\nENTRY main {\n  a = " shape " parameter(0)\n  ROOT c = " res \
  " custom-call(a), custom_call_target=\"" target "\", backend_config=" cfg "\n}\n"

START_TEST(test_known_answers) {
  /* potrf, lower: L = [[2,0],[1,sqrt 2]]; the upper triangle keeps its 7. */
  const double spd[] = {4, 7, 2, 3}, notpd[] = {1, 2, 2, 1};
  const char *potrf =
      CALL1("f64[2,2]{0,1}", "(f64[2,2]{0,1}, s32[])", "lapack_dpotrf_ffi", "{uplo = 76 : ui8}");
  kiln_literal *o = known(potrf, spd, NULL);
  expect_values(o->elems[0], (const double[]){2, 7, 1, sqrt(2)}, 4, 1e-15);
  expect_values(o->elems[1], (const double[]){0}, 1, 0);
  kiln_literal_destroy(o);
  /* Not positive definite at the second pivot: info 2, column 0 factored. */
  o = known(potrf, notpd, NULL);
  expect_values(o->elems[0], (const double[]){1, 2, 2, 1}, 4, 1e-15);
  expect_values(o->elems[1], (const double[]){2}, 1, 0);
  kiln_literal_destroy(o);
  /* Upper: U = L^T, the lower triangle kept. */
  o = known(CALL1("f64[2,2]", "(f64[2,2], s32[])", "lapack_dpotrf_ffi", "{uplo = 85 : ui8}"),
            (const double[]){4, 2, 7, 3}, NULL);
  expect_values(o->elems[0], (const double[]){2, 1, 7, sqrt(2)}, 4, 1e-15);
  kiln_literal_destroy(o);
  /* getrf [[1,2],[3,4]]: rows swapped (pivots are 1-based), l = 1/3, u11 = 2/3. */
  o = known(CALL1("f64[2,2]", "(f64[2,2], s32[2], s32[])", "lapack_dgetrf_ffi", "{}"),
            (const double[]){1, 2, 3, 4}, NULL);
  expect_values(o->elems[0], (const double[]){3, 4, 1.0 / 3, 2.0 / 3}, 4, 1e-15);
  expect_values(o->elems[1], (const double[]){2, 2}, 2, 0);
  expect_values(o->elems[2], (const double[]){0}, 1, 0);
  kiln_literal_destroy(o);
  /* A zero pivot: info names its column, the factorization goes on. */
  o = known(CALL1("f64[2,2]", "(f64[2,2], s32[2], s32[])", "lapack_dgetrf_ffi", "{}"),
            (const double[]){0, 1, 0, 2}, NULL);
  expect_values(o->elems[2], (const double[]){1}, 1, 0);
  kiln_literal_destroy(o);
  /* geqrf of (3, 4): beta = -5, tau = 1.6, v = (1, 0.5). */
  o = known(CALL1("f64[2,1]", "(f64[2,1], f64[1])", "lapack_dgeqrf_ffi", "{}"),
            (const double[]){3, 4}, NULL);
  expect_values(o->elems[0], (const double[]){-5, 0.5}, 2, 1e-15);
  expect_values(o->elems[1], (const double[]){1.6}, 1, 1e-15);
  kiln_literal_destroy(o);
  /* orgqr of that reflector: Q's column (-0.6, -0.8). */
  o = known("HloModule t\nENTRY main {\n  a = f64[2,1] parameter(0)\n  t = f64[1] parameter(1)\n"
            "  ROOT q = f64[2,1] custom-call(a, t), custom_call_target=\"lapack_dorgqr_ffi\", "
            "backend_config={}\n}\n",
            (const double[]){-5, 0.5}, (const double[]){1.6});
  expect_values(o, (const double[]){-0.6, -0.8}, 2, 1e-15);
  kiln_literal_destroy(o);
  /* trsm, left, lower, no transpose: the 9 above the diagonal is not read. */
  o = known("HloModule t\nENTRY main {\n  a = f64[2,2] parameter(0)\n  b = f64[2,1] parameter(1)\n"
            "  ROOT x = f64[2,1] custom-call(a, b), custom_call_target=\"lapack_dtrsm_ffi\", "
            "backend_config={diag = 78 : ui8, side = 76 : ui8, trans_x = 78 : ui8, uplo = 76 : "
            "ui8}\n}\n",
            (const double[]){2, 9, 1, 1}, (const double[]){4, 3});
  expect_values(o, (const double[]){2, 1}, 2, 1e-15);
  kiln_literal_destroy(o);
  /* syevd of [[2,1],[1,2]]: eigenvalues 1, 3 ascending; mode N writes zeros for v. */
  o = known(CALL1("f64[2,2]", "(f64[2,2], f64[2], s32[])", "lapack_dsyevd_ffi",
                  "{mode = 78 : ui8, uplo = 76 : ui8}"),
            (const double[]){2, 1, 1, 2}, NULL);
  expect_values(o->elems[0], (const double[]){0, 0, 0, 0}, 4, 0);
  expect_values(o->elems[1], (const double[]){1, 3}, 2, 1e-14);
  kiln_literal_destroy(o);
  /* gesdd of diag(3, -4) (2 x 3 with a zero column): s = (4, 3). */
  o = known(CALL1("f64[2,3]", "(f64[2,3], f64[2], f64[2,2], f64[3,3], s32[])", "lapack_dgesdd_ffi",
                  "{mode = 65 : ui8}"),
            (const double[]){3, 0, 0, 0, -4, 0}, NULL);
  expect_values(o->elems[1], (const double[]){4, 3}, 2, 1e-14);
  kiln_literal_destroy(o);
}
END_TEST

/* ---- cpu against the interpreter ---------------------------------------------- */

static uint64_t rng(uint64_t *s) {
  *s = *s * 6364136223846793005u + 1442695040888963407u;
  return *s >> 33;
}

static double unit(uint64_t *s) { return (double)(rng(s) % 2001) / 1000.0 - 1.0; }

/* Fills batch x rows x cols (logical row-major) with noise (complex noise
 * for complex types); with `boost` adds it on the diagonal; spd makes each
 * square matrix X X^H / n + I. */
static void fill(kiln_literal *l, uint64_t *s, double boost, bool spd) {
  const kiln_shape *sh = &l->shape;
  bool cx = kiln_dtype_is_complex(sh->dtype);
  int64_t r = sh->rank >= 2 ? sh->dims[sh->rank - 2] : 1, c = sh->dims[sh->rank - 1];
  int64_t per = r * c, nb = kiln_literal_elements(l) / (per ? per : 1);
  double *x = calloc((size_t)(2 * per + 1), sizeof *x), *y = x + per;
  for (int64_t b = 0; b < nb; b++) {
    for (int64_t i = 0; i < per; i++) x[i] = unit(s), y[i] = cx ? unit(s) : 0;
    for (int64_t i = 0; i < r; i++)
      for (int64_t j = 0; j < c; j++) {
        double re = x[i * c + j], im = y[i * c + j];
        if (spd) {
          re = i == j ? 1 : 0, im = 0;
          for (int64_t k = 0; k < c; k++) { /* x_ik conj(x_jk) */
            re += (x[i * c + k] * x[j * c + k] + y[i * c + k] * y[j * c + k]) / (double)c;
            im += (y[i * c + k] * x[j * c + k] - x[i * c + k] * y[j * c + k]) / (double)c;
          }
        } else if (i == j) {
          re += boost;
        }
        if (cx)
          kiln_literal_set_c128(l, b * per + i * c + j, re, im);
        else
          kiln_literal_set_f64(l, b * per + i * c + j, re);
      }
  }
  free(x);
}

typedef struct run_pair {
  kiln_literal *args[2];
  kiln_literal *want, *got, *got_blob;
  uint32_t nargs;
} run_pair;

/* Runs text on the interpreter, the cpu backend, and the cpu backend from
 * the serialized executable. */
static void run_both(const char *text, uint64_t seed, double boost, bool spd, run_pair *p) {
  kiln_module *m = parse(text);
  p->nargs = kiln_computation_nparams(m, kiln_module_entry(m));
  uint64_t s = seed;
  for (uint32_t i = 0; i < p->nargs; i++) {
    p->args[i] = param_literal(m, i);
    fill(p->args[i], &s, i == 0 ? boost : 0, i == 0 && spd);
  }
  kiln_run_options ro = {.max_while_iterations = 1000, .timeout_seconds = 60};
  kiln_status_clear(&st);
  int rc = kiln_run_module_with(m, "interp", NULL, NULL, &ro, (const kiln_literal *const *)p->args,
                                p->nargs, &p->want, &st);
  ck_assert_msg(rc == 0, "interp: %s: %s\n%s", st.where, st.msg, text);
  kiln_executable *e = NULL;
  kiln_status_clear(&st);
  rc = kiln_compile(m, NULL, &e, NULL, &st);
  ck_assert_msg(rc == 0, "compile: %s: %s\n%s", st.where, st.msg, text);
  bool has_step = false;
  for (uint32_t k = 0; k < e->programs[0].nsteps; k++)
    has_step |= e->programs[0].steps[k].kind == KILN_STEP_LINALG;
  ck_assert_msg(has_step, "no LINALG step:\n%s", text);
  kiln_status_clear(&st);
  rc = kiln_run_executable(e, NULL, &ro, (const kiln_literal *const *)p->args, p->nargs, &p->got,
                           &st);
  ck_assert_msg(rc == 0, "cpu: %s: %s\n%s", st.where, st.msg, text);
  uint8_t *blob = NULL;
  size_t len = 0;
  ck_assert(kiln_executable_serialize(e, &blob, &len, &st) == 0);
  kiln_status_clear(&st);
  rc = kiln_run_executable_blob(blob, len, NULL, &ro, (const kiln_literal *const *)p->args,
                                p->nargs, &p->got_blob, &st);
  ck_assert_msg(rc == 0, "cpu (blob): %s: %s\n%s", st.where, st.msg, text);
  free(blob);
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
}

static void run_pair_free(run_pair *p) {
  for (uint32_t i = 0; i < p->nargs; i++) kiln_literal_destroy(p->args[i]);
  kiln_literal_destroy(p->want);
  kiln_literal_destroy(p->got);
  kiln_literal_destroy(p->got_blob);
}

static const kiln_literal *leaf(const kiln_literal *l, uint32_t i) {
  return l->shape.dtype == KILN_TUPLE ? l->elems[i] : l;
}

static void get2(const kiln_literal *l, int64_t k, double *re, double *im) {
  *im = 0;
  if (kiln_dtype_is_complex(l->shape.dtype))
    kiln_literal_get_c128(l, k, re, im);
  else
    *re = kiln_literal_get_f64(l, k);
}

/* Leaf i of both results within rel of the interpreter's largest magnitude
 * (integers exactly). */
static void close_leaf(const run_pair *p, uint32_t i, double rel, const char *text) {
  const kiln_literal *w = leaf(p->want, i), *gs[2] = {leaf(p->got, i), leaf(p->got_blob, i)};
  int64_t n = kiln_literal_elements(w);
  double mag = 1, re, im, re2, im2;
  for (int64_t k = 0; k < n; k++) get2(w, k, &re, &im), mag = fmax(mag, hypot(re, im));
  bool fl = kiln_dtype_is_float(w->shape.dtype) || kiln_dtype_is_complex(w->shape.dtype);
  for (int g = 0; g < 2; g++) {
    ck_assert(kiln_shape_equal(&w->shape, &gs[g]->shape, false));
    for (int64_t k = 0; k < n; k++) {
      get2(w, k, &re, &im);
      get2(gs[g], k, &re2, &im2);
      bool ok = fl ? hypot(re - re2, im - im2) <= rel * mag : re == re2;
      ck_assert_msg(ok, "leaf %u element %lld: interp (%.9g, %.9g), cpu (%.9g, %.9g)\n%s", i,
                    (long long)k, re, im, re2, im2, text);
    }
  }
}

static const char *layout_of(int rank, bool colmajor) {
  static const char *const cm[] = {"", "{0}", "{0,1}", "{1,2,0}", "{2,3,1,0}"};
  static const char *const rm[] = {"", "{0}", "{1,0}", "{2,1,0}", "{3,2,1,0}"};
  return colmajor ? cm[rank] : rm[rank];
}

/* "f32[2,4,4]{1,2,0}" */
static void shape_text(kiln_sbuf *b, const char *t, const int64_t *batch, int nb, const int64_t *d,
                       int nd, bool colmajor) {
  kiln_sbuf_printf(b, "%s[", t);
  for (int i = 0; i < nb; i++) kiln_sbuf_printf(b, "%s%lld", i ? "," : "", (long long)batch[i]);
  for (int i = 0; i < nd; i++) kiln_sbuf_printf(b, "%s%lld", nb + i ? "," : "", (long long)d[i]);
  kiln_sbuf_printf(b, "]%s", nd == 0 && nb == 0 ? "" : layout_of(nb + nd, colmajor && nd == 2));
}

static double tol_of(const char *t) { return strcmp(t, "f32") == 0 ? 2e-4 : 1e-10; }

/* One random case of each deterministic kind: potrf, trsm, getrf, geqrf,
 * orgqr, cholesky and triangular-solve. */
START_TEST(test_cpu_agrees) {
  static const char *const types[] = {"f32", "f64"};
  for (int seed = 1; seed <= 16; seed++) {
    uint64_t s = (uint64_t)seed * 7919u;
    const char *t = types[seed % 2], *tc = seed % 2 ? "d" : "s";
    bool cm = (seed / 2) % 2 == 0;
    int nb = (int)(rng(&s) % 3);
    int64_t batch[2] = {1 + (int64_t)(rng(&s) % 3), 1 + (int64_t)(rng(&s) % 2)};
    int64_t m = 1 + (int64_t)(rng(&s) % 7), n = 1 + (int64_t)(rng(&s) % 7);
    int64_t mn = m < n ? m : n, tall[2] = {m > n ? m : n, mn};
    kiln_sbuf b = KILN_SBUF_INIT;
#define SH(tt, ...) \
  do { \
    const int64_t d_[] = {__VA_ARGS__}; \
    shape_text(&b, tt, batch, nb, d_, (int)(sizeof d_ / sizeof *d_), cm); \
  } while (0)
#define SH0(tt) shape_text(&b, tt, batch, nb, NULL, 0, cm)
    run_pair p;
    /* potrf */
    kiln_sbuf_printf(&b, "HloModule t\nENTRY main {\n  a = ");
    SH(t, n, n);
    kiln_sbuf_printf(&b, " parameter(0)\n  ROOT c = (");
    SH(t, n, n);
    kiln_sbuf_printf(&b, ", ");
    SH0("s32");
    kiln_sbuf_printf(&b,
                     ") custom-call(a), custom_call_target=\"lapack_%spotrf_ffi\", "
                     "backend_config={uplo = %d : ui8}\n}\n",
                     tc, seed % 3 ? 'L' : 'U');
    run_both(kiln_sbuf_str(&b), s, 0, true, &p);
    close_leaf(&p, 0, tol_of(t), kiln_sbuf_str(&b));
    close_leaf(&p, 1, 0, kiln_sbuf_str(&b));
    run_pair_free(&p);
    kiln_sbuf_free(&b);
    /* trsm, every side / uplo / trans / diag */
    char side = seed % 2 ? 'L' : 'R', uplo = (seed / 2) % 2 ? 'L' : 'U';
    char tr = "NTC"[seed % 3], diag = (seed / 4) % 2 ? 'U' : 'N';
    int64_t k = side == 'L' ? m : n;
    b = (kiln_sbuf)KILN_SBUF_INIT;
    kiln_sbuf_printf(&b, "HloModule t\nENTRY main {\n  a = ");
    SH(t, k, k);
    kiln_sbuf_printf(&b, " parameter(0)\n  b = ");
    SH(t, m, n);
    kiln_sbuf_printf(&b, " parameter(1)\n  ROOT x = ");
    SH(t, m, n);
    kiln_sbuf_printf(&b,
                     " custom-call(a, b), custom_call_target=\"lapack_%strsm_ffi\", "
                     "backend_config={diag = %d : ui8, side = %d : ui8, trans_x = %d : ui8, "
                     "uplo = %d : ui8}\n}\n",
                     tc, diag, side, tr, uplo);
    run_both(kiln_sbuf_str(&b), s, 3, false, &p);
    close_leaf(&p, 0, tol_of(t) * 10, kiln_sbuf_str(&b));
    run_pair_free(&p);
    kiln_sbuf_free(&b);
    /* getrf (f64: no near-ties between pivot candidates at this precision) */
    b = (kiln_sbuf)KILN_SBUF_INIT;
    kiln_sbuf_printf(&b, "HloModule t\nENTRY main {\n  a = ");
    SH("f64", m, n);
    kiln_sbuf_printf(&b, " parameter(0)\n  ROOT c = (");
    SH("f64", m, n);
    kiln_sbuf_printf(&b, ", ");
    SH("s32", mn);
    kiln_sbuf_printf(&b, ", ");
    SH0("s32");
    kiln_sbuf_printf(&b, ") custom-call(a), custom_call_target=\"lapack_dgetrf_ffi\", "
                         "backend_config={}\n}\n");
    run_both(kiln_sbuf_str(&b), s, 0, false, &p);
    for (uint32_t i = 0; i < 3; i++) close_leaf(&p, i, 1e-10, kiln_sbuf_str(&b));
    run_pair_free(&p);
    kiln_sbuf_free(&b);
    /* geqrf, then orgqr of its reflectors (tall shapes) */
    b = (kiln_sbuf)KILN_SBUF_INIT;
    kiln_sbuf_printf(&b, "HloModule t\nENTRY main {\n  a = ");
    SH(t, m, n);
    kiln_sbuf_printf(&b, " parameter(0)\n  ROOT c = (");
    SH(t, m, n);
    kiln_sbuf_printf(&b, ", ");
    SH(t, mn);
    kiln_sbuf_printf(&b,
                     ") custom-call(a), custom_call_target=\"lapack_%sgeqrf_ffi\", "
                     "backend_config={}\n}\n",
                     tc);
    run_both(kiln_sbuf_str(&b), s, 2, false, &p);
    for (uint32_t i = 0; i < 2; i++) close_leaf(&p, i, tol_of(t) * 10, kiln_sbuf_str(&b));
    run_pair_free(&p);
    kiln_sbuf_free(&b);
    b = (kiln_sbuf)KILN_SBUF_INIT;
    kiln_sbuf_printf(&b, "HloModule t\nENTRY main {\n  a = ");
    SH(t, tall[0], tall[1]);
    kiln_sbuf_printf(&b, " parameter(0)\n  tau = ");
    SH(t, mn);
    kiln_sbuf_printf(&b, " parameter(1)\n  ROOT q = ");
    SH(t, tall[0], tall[1]);
    kiln_sbuf_printf(&b,
                     " custom-call(a, tau), custom_call_target=\"lapack_%sorgqr_ffi\", "
                     "backend_config={}\n}\n",
                     tc);
    run_both(kiln_sbuf_str(&b), s, 0, false, &p);
    close_leaf(&p, 0, tol_of(t) * 10, kiln_sbuf_str(&b));
    run_pair_free(&p);
    kiln_sbuf_free(&b);
    /* the HLO ops */
    b = (kiln_sbuf)KILN_SBUF_INIT;
    kiln_sbuf_printf(&b, "HloModule t\nENTRY main {\n  a = ");
    SH(t, n, n);
    kiln_sbuf_printf(&b, " parameter(0)\n  r = ");
    SH(t, n, m);
    kiln_sbuf_printf(&b, " parameter(1)\n  l = ");
    SH(t, n, n);
    kiln_sbuf_printf(&b, " cholesky(a), lower=%s\n  ROOT x = ", seed % 3 ? "true" : "false");
    SH(t, n, m);
    kiln_sbuf_printf(&b, " triangular-solve(l, r), left_side=true, lower=%s, transpose_a=%s\n}\n",
                     seed % 3 ? "true" : "false", seed % 2 ? "TRANSPOSE" : "NO_TRANSPOSE");
    run_both(kiln_sbuf_str(&b), s, 0, true, &p);
    close_leaf(&p, 0, tol_of(t) * 10, kiln_sbuf_str(&b));
    run_pair_free(&p);
    kiln_sbuf_free(&b);
#undef SH
#undef SH0
  }
}
END_TEST

/* Triangles on both sides of the direct solves' bound (cpu_linalg.c:
 * SMALL_TRSM and SMALL_GETRF rows are substituted in place, larger ones go
 * to OpenBLAS): trsm of every side / uplo / trans / diag and getrf, f32
 * and f64, square and not, against the interpreter. */
START_TEST(test_cpu_sizes) {
  static const int64_t sizes[] = {1, 8, 31, 32, 33, 48};
  for (int seed = 0; seed < 24; seed++) {
    uint64_t s = (uint64_t)seed * 104729u + 5;
    const char *t = seed % 2 ? "f64" : "f32", *tc = seed % 2 ? "d" : "s";
    int64_t batch[1] = {1 + (int64_t)(rng(&s) % 3)};
    int64_t k = sizes[(seed / 2) % 6], other = 1 + (int64_t)(rng(&s) % 40);
    char side = (seed / 3) % 2 ? 'L' : 'R', uplo = (seed / 5) % 2 ? 'L' : 'U';
    char tr = "NTC"[seed % 3], diag = (seed / 7) % 2 ? 'U' : 'N';
    int64_t m = side == 'L' ? k : other, n = side == 'L' ? other : k;
    kiln_sbuf b = KILN_SBUF_INIT;
    run_pair p;
    kiln_sbuf_printf(&b, "HloModule t\nENTRY main {\n  a = ");
    shape_text(&b, t, batch, 1, (int64_t[]){k, k}, 2, true);
    kiln_sbuf_printf(&b, " parameter(0)\n  b = ");
    shape_text(&b, t, batch, 1, (int64_t[]){m, n}, 2, true);
    kiln_sbuf_printf(&b, " parameter(1)\n  ROOT x = ");
    shape_text(&b, t, batch, 1, (int64_t[]){m, n}, 2, true);
    kiln_sbuf_printf(&b,
                     " custom-call(a, b), custom_call_target=\"lapack_%strsm_ffi\", "
                     "backend_config={diag = %d : ui8, side = %d : ui8, trans_x = %d : ui8, "
                     "uplo = %d : ui8}\n}\n",
                     tc, diag, side, tr, uplo);
    /* a strong diagonal: the triangle is well conditioned at every size */
    run_both(kiln_sbuf_str(&b), s, (double)k + 3, false, &p);
    close_leaf(&p, 0, tol_of(t) * 10, kiln_sbuf_str(&b));
    run_pair_free(&p);
    kiln_sbuf_free(&b);
    /* getrf, f64 (no near-ties between pivot candidates) */
    int64_t gm = k, gn = seed % 4 ? k : other;
    int64_t gmn = gm < gn ? gm : gn;
    b = (kiln_sbuf)KILN_SBUF_INIT;
    kiln_sbuf_printf(&b, "HloModule t\nENTRY main {\n  a = ");
    shape_text(&b, "f64", batch, 1, (int64_t[]){gm, gn}, 2, true);
    kiln_sbuf_printf(&b, " parameter(0)\n  ROOT c = (");
    shape_text(&b, "f64", batch, 1, (int64_t[]){gm, gn}, 2, true);
    kiln_sbuf_printf(&b, ", ");
    shape_text(&b, "s32", batch, 1, (int64_t[]){gmn}, 1, true);
    kiln_sbuf_printf(&b, ", ");
    shape_text(&b, "s32", batch, 1, NULL, 0, true);
    kiln_sbuf_printf(&b, ") custom-call(a), custom_call_target=\"lapack_dgetrf_ffi\", "
                         "backend_config={}\n}\n");
    run_both(kiln_sbuf_str(&b), s, 0, false, &p);
    for (uint32_t i = 0; i < 3; i++) close_leaf(&p, i, 1e-9, kiln_sbuf_str(&b));
    run_pair_free(&p);
    kiln_sbuf_free(&b);
  }
}
END_TEST

/* max |x^H x - I| over the columns (rows: x x^H over the rows) of the
 * (batch of) r x c matrices in l. */
static double orth_err(const kiln_literal *l, bool rows) {
  const kiln_shape *sh = &l->shape;
  int64_t r = sh->dims[sh->rank - 2], c = sh->dims[sh->rank - 1];
  int64_t nb = kiln_literal_elements(l) / (r * c);
  double e = 0;
  int64_t n = rows ? r : c, len = rows ? c : r;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < n; j++) {
        double dr = 0, di = 0, ar, ai, br, bi;
        for (int64_t k = 0; k < len; k++) {
          int64_t x = rows ? i * c + k : k * c + i, y = rows ? j * c + k : k * c + j;
          get2(l, b * r * c + x, &ar, &ai);
          get2(l, b * r * c + y, &br, &bi);
          dr += ar * br + ai * bi; /* conj(a) b */
          di += ar * bi - ai * br;
        }
        e = fmax(e, hypot(dr - (i == j), di));
      }
  return e;
}

/* The HLO ops between fused producers and consumers: they stay steps of
 * their own (fusion does not take them in), fed by and feeding kernels. */
START_TEST(test_between_kernels) {
  const char *text =
      "HloModule f\nENTRY main {\n  a = f32[4,4] parameter(0)\n  b = f32[4,3] parameter(1)\n"
      "  i = f32[4,4] iota(), iota_dimension=0\n  j = f32[4,4] iota(), iota_dimension=1\n"
      "  e = pred[4,4] compare(i, j), direction=EQ\n  c8 = f32[] constant(8)\n"
      "  z = f32[] constant(0)\n  d8 = f32[4,4] broadcast(c8), dimensions={}\n"
      "  dz = f32[4,4] broadcast(z), dimensions={}\n  dd = f32[4,4] select(e, d8, dz)\n"
      "  t = f32[4,4] transpose(a), dimensions={1,0}\n  s = f32[4,4] add(a, t)\n"
      "  s2 = f32[4,4] add(s, dd)\n  l = f32[4,4] cholesky(s2), lower=true\n"
      "  bb = f32[4,3] multiply(b, b)\n"
      "  x = f32[4,3] triangular-solve(l, bb), left_side=true, lower=true, "
      "transpose_a=NO_TRANSPOSE\n  ROOT r = f32[4,3] exponential(x)\n}\n";
  for (uint64_t seed = 1; seed <= 4; seed++) {
    run_pair p;
    run_both(text, seed, 0, false, &p);
    close_leaf(&p, 0, 1e-5, text);
    run_pair_free(&p);
  }
}
END_TEST

/* syevd and gesdd: values against the interpreter, vectors by identity. */
START_TEST(test_cpu_vectors) {
  for (int seed = 1; seed <= 8; seed++) {
    uint64_t s = (uint64_t)seed * 104729u;
    bool f64 = seed % 2;
    const char *t = f64 ? "f64" : "f32", *tc = f64 ? "d" : "s";
    double tol = tol_of(t) * 20;
    int64_t n = 1 + (int64_t)(rng(&s) % 6), m = 1 + (int64_t)(rng(&s) % 6), mn = m < n ? m : n;
    int64_t batch = 1 + (int64_t)(rng(&s) % 3);
    char text[1024];
    snprintf(text, sizeof text,
             "HloModule t\nENTRY main {\n  a = %s[%lld,%lld,%lld]{1,2,0} parameter(0)\n"
             "  ROOT e = (%s[%lld,%lld,%lld]{1,2,0}, %s[%lld,%lld], s32[%lld]) custom-call(a), "
             "custom_call_target=\"lapack_%ssyevd_ffi\", backend_config={mode = 86 : ui8, uplo = "
             "%d : ui8}\n}\n",
             t, (long long)batch, (long long)n, (long long)n, t, (long long)batch, (long long)n,
             (long long)n, t, (long long)batch, (long long)n, (long long)batch, tc,
             seed % 3 ? 'L' : 'U');
    run_pair p;
    run_both(text, s, 0, true, &p);
    close_leaf(&p, 1, tol, text);
    close_leaf(&p, 2, 0, text);
    for (const kiln_literal *r = p.want;; r = p.got) {
      ck_assert_msg(orth_err(r->elems[0], false) < tol, "eigenvectors not orthonormal\n%s", text);
      /* A v_j = w_j v_j, A from the triangle the call reads (spd: symmetric) */
      const kiln_literal *a = p.args[0], *v = r->elems[0], *w = r->elems[1];
      for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < n; i++)
          for (int64_t j = 0; j < n; j++) {
            double av = 0;
            for (int64_t k = 0; k < n; k++)
              av += kiln_literal_get_f64(a, b * n * n + i * n + k) *
                    kiln_literal_get_f64(v, b * n * n + k * n + j);
            double vw =
                kiln_literal_get_f64(v, b * n * n + i * n + j) * kiln_literal_get_f64(w, b * n + j);
            ck_assert_msg(fabs(av - vw) < tol * 4, "A v != v w\n%s", text);
          }
      if (r == p.got) break;
    }
    run_pair_free(&p);
    /* gesdd, full and reduced */
    for (int full = 0; full < 2; full++) {
      int64_t uc = full ? m : mn, vr = full ? n : mn;
      snprintf(text, sizeof text,
               "HloModule t\nENTRY main {\n  a = %s[%lld,%lld]{0,1} parameter(0)\n"
               "  ROOT e = (%s[%lld,%lld]{0,1}, %s[%lld], %s[%lld,%lld]{0,1}, %s[%lld,%lld]{0,1}, "
               "s32[]) custom-call(a), custom_call_target=\"lapack_%sgesdd_ffi\", "
               "backend_config={mode = %d : ui8}\n}\n",
               t, (long long)m, (long long)n, t, (long long)m, (long long)n, t, (long long)mn, t,
               (long long)m, (long long)uc, t, (long long)vr, (long long)n, tc, full ? 'A' : 'S');
      run_both(text, s + 1, 0.5, false, &p);
      close_leaf(&p, 0, 0, text); /* zeros on both */
      close_leaf(&p, 1, tol, text);
      close_leaf(&p, 4, 0, text);
      for (const kiln_literal *r = p.want;; r = p.got) {
        const kiln_literal *u = r->elems[2], *sv = r->elems[1], *vt = r->elems[3];
        ck_assert_msg(orth_err(u, false) < tol, "u not orthonormal\n%s", text);
        ck_assert_msg(orth_err(vt, true) < tol, "vt not orthonormal\n%s", text);
        for (int64_t i = 0; i < m; i++)
          for (int64_t j = 0; j < n; j++) {
            double x = 0;
            for (int64_t k = 0; k < mn; k++)
              x += kiln_literal_get_f64(u, i * uc + k) * kiln_literal_get_f64(sv, k) *
                   kiln_literal_get_f64(vt, k * n + j);
            ck_assert_msg(fabs(x - kiln_literal_get_f64(p.args[0], i * n + j)) < tol * 4,
                          "u s vt != a\n%s", text);
          }
        if (r == p.got) break;
      }
      run_pair_free(&p);
    }
  }
}
END_TEST

/* A step description from a blob that does not fit its slots. */
START_TEST(test_step_check) {
  kiln_linalg g;
  memset(&g, 0, sizeof g);
  g.l = (kiln_lapack){
      .kind = KILN_LAPACK_POTRF, .dtype = KILN_F32, .nargs = 3, .m = 4, .n = 4, .uplo = 'L'};
  for (int a = 0; a < 2; a++) g.strides[a][0] = 1, g.strides[a][1] = 4;
  uint64_t sizes[3] = {64, 64, 4};
  char why[200];
  ck_assert_msg(kiln_linalg_check(&g, 3, sizes, why, sizeof why), "%s", why);
  sizes[1] = 60;
  ck_assert(!kiln_linalg_check(&g, 3, sizes, why, sizeof why));
  ck_assert_str_eq(why, "argument 1 spans 64 bytes, its slot has 60");
  sizes[1] = 64;
  g.strides[0][1] = (int64_t)1 << 50;
  ck_assert(!kiln_linalg_check(&g, 3, sizes, why, sizeof why));
  ck_assert_str_eq(why, "argument 0: stride 1125899906842624 of dim 1 out of range");
  g.strides[0][1] = 4;
  ck_assert(!kiln_linalg_check(&g, 2, sizes, why, sizeof why));
  ck_assert_str_eq(why, "potrf takes 3 slots, 2 given");
  g.l.uplo = 'X';
  ck_assert(!kiln_linalg_check(&g, 3, sizes, why, sizeof why));
  ck_assert_str_eq(why, "potrf: flags or sizes are inconsistent");
  g.l.uplo = 'L';
  g.l.dtype = KILN_C64;
  ck_assert(!kiln_linalg_check(&g, 3, sizes, why, sizeof why));
  g.l.dtype = KILN_F32;
  g.l.kind = 99;
  ck_assert(!kiln_linalg_check(&g, 3, sizes, why, sizeof why));
  ck_assert_str_eq(why, "unknown kind 99");
}
END_TEST

/* c64 and c128: every kind on cpu against the interpreter (trsm with the
 * conjugate transpose), heevd's and gesdd's values, and their vectors'
 * orthonormality. */
START_TEST(test_cpu_complex) {
  for (int seed = 1; seed <= 6; seed++) {
    uint64_t s = (uint64_t)seed * 31337u;
    bool z = seed % 2;
    const char *t = z ? "c128" : "c64", *rt = z ? "f64" : "f32", *tc = z ? "z" : "c";
    double tol = z ? 1e-10 : 5e-4;
    long long n = 1 + (long long)(rng(&s) % 5), m = 1 + (long long)(rng(&s) % 5);
    long long mn = m < n ? m : n, big = m > n ? m : n;
    char text[1024];
    run_pair p;
    snprintf(text, sizeof text,
             "HloModule t\nENTRY main {\n  a = %s[2,%lld,%lld]{1,2,0} parameter(0)\n  ROOT c = "
             "(%s[2,%lld,%lld]{1,2,0}, s32[2]) custom-call(a), custom_call_target=\"lapack_%s"
             "potrf_ffi\", backend_config={uplo = %d : ui8}\n}\n",
             t, n, n, t, n, n, tc, seed % 3 ? 'L' : 'U');
    run_both(text, s, 0, true, &p);
    close_leaf(&p, 0, tol, text);
    close_leaf(&p, 1, 0, text);
    run_pair_free(&p);
    snprintf(text, sizeof text,
             "HloModule t\nENTRY main {\n  a = %s[%lld,%lld]{0,1} parameter(0)\n  b = "
             "%s[%lld,%lld]{0,1} parameter(1)\n  ROOT x = %s[%lld,%lld]{0,1} custom-call(a, b), "
             "custom_call_target=\"lapack_%strsm_ffi\", backend_config={diag = 78 : ui8, side = "
             "%d : ui8, trans_x = %d : ui8, uplo = %d : ui8}\n}\n",
             t, seed % 2 ? m : n, seed % 2 ? m : n, t, m, n, t, m, n, tc, seed % 2 ? 'L' : 'R',
             "NTC"[seed % 3], seed % 4 < 2 ? 'L' : 'U');
    run_both(text, s, 3, false, &p);
    close_leaf(&p, 0, tol * 10, text);
    run_pair_free(&p);
    snprintf(text, sizeof text,
             "HloModule t\nENTRY main {\n  a = %s[%lld,%lld] parameter(0)\n  ROOT c = (%s[%lld,"
             "%lld], s32[%lld], s32[]) custom-call(a), custom_call_target=\"lapack_zgetrf_ffi\", "
             "backend_config={}\n}\n",
             "c128", m, n, "c128", m, n, mn);
    run_both(text, s, 0, false, &p);
    for (uint32_t i = 0; i < 3; i++) close_leaf(&p, i, 1e-10, text);
    run_pair_free(&p);
    snprintf(text, sizeof text,
             "HloModule t\nENTRY main {\n  a = %s[%lld,%lld]{0,1} parameter(0)\n  ROOT c = "
             "(%s[%lld,%lld]{0,1}, %s[%lld]) custom-call(a), custom_call_target=\"lapack_%sgeqrf_"
             "ffi\", backend_config={}\n}\n",
             t, m, n, t, m, n, t, mn, tc);
    run_both(text, s, 2, false, &p);
    for (uint32_t i = 0; i < 2; i++) close_leaf(&p, i, tol * 10, text);
    run_pair_free(&p);
    snprintf(text, sizeof text,
             "HloModule t\nENTRY main {\n  a = %s[%lld,%lld]{0,1} parameter(0)\n  tau = %s[%lld] "
             "parameter(1)\n  ROOT q = %s[%lld,%lld]{0,1} custom-call(a, tau), custom_call_target="
             "\"lapack_%sungqr_ffi\", backend_config={}\n}\n",
             t, big, mn, t, mn, t, big, mn, tc);
    run_both(text, s, 0, false, &p);
    close_leaf(&p, 0, tol * 10, text);
    run_pair_free(&p);
    snprintf(text, sizeof text,
             "HloModule t\nENTRY main {\n  a = %s[%lld,%lld]{0,1} parameter(0)\n  ROOT e = "
             "(%s[%lld,%lld]{0,1}, %s[%lld], s32[]) custom-call(a), custom_call_target=\"lapack_%s"
             "heevd_ffi\", backend_config={mode = 86 : ui8, uplo = %d : ui8}\n}\n",
             t, n, n, t, n, n, rt, n, tc, seed % 3 ? 'L' : 'U');
    run_both(text, s, 0, true, &p);
    close_leaf(&p, 1, tol * 10, text);
    ck_assert_msg(orth_err(p.want->elems[0], false) < tol * 20, "interp vectors\n%s", text);
    ck_assert_msg(orth_err(p.got->elems[0], false) < tol * 20, "cpu vectors\n%s", text);
    run_pair_free(&p);
    snprintf(text, sizeof text,
             "HloModule t\nENTRY main {\n  a = %s[%lld,%lld]{0,1} parameter(0)\n  ROOT e = "
             "(%s[%lld,%lld]{0,1}, %s[%lld], %s[%lld,%lld]{0,1}, %s[%lld,%lld]{0,1}, s32[]) "
             "custom-call(a), custom_call_target=\"lapack_%sgesdd_ffi\", backend_config={mode = "
             "65 : ui8}\n}\n",
             t, m, n, t, m, n, rt, mn, t, m, m, t, n, n, tc);
    run_both(text, s, 0.5, false, &p);
    close_leaf(&p, 1, tol * 10, text);
    for (const kiln_literal *r = p.want;; r = p.got) {
      ck_assert_msg(orth_err(r->elems[2], false) < tol * 20, "u\n%s", text);
      ck_assert_msg(orth_err(r->elems[3], true) < tol * 20, "vt\n%s", text);
      if (r == p.got) break;
    }
    run_pair_free(&p);
  }
}
END_TEST

Suite *linalg_suite(void) {
  Suite *s = suite_create("cpu_linalg");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_verifier);
  tcase_add_test(tc, test_known_answers);
  tcase_add_test(tc, test_cpu_agrees);
  tcase_add_test(tc, test_cpu_sizes);
  tcase_add_test(tc, test_cpu_vectors);
  tcase_add_test(tc, test_between_kernels);
  tcase_add_test(tc, test_step_check);
  tcase_add_test(tc, test_cpu_complex);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(linalg_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
