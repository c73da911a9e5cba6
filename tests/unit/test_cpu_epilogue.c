/* GEMM epilogues on the cpu backend against the reference interpreter.
 *
 * A dot followed by elementwise work on its result (bias broadcast along
 * either matrix dim, relu, tanh, logistic, a gelu built from erf, leaky
 * relu as compare and select, a residual add, a scale, a convert) is a
 * kOutput fusion whose epilogue the GEMM step runs on each block of C as
 * it writes it (compiler/codegen/lower_kernels.c, executor/cpu/cpu_gemm.c).
 * Each case is an HLO module generated from a seed: random M, N, K, zero
 * to two batch dims, f32 or f64, the rhs stored either way, one to three
 * epilogue ops; some products are big enough to be cut over the pool
 * (rows, batches or columns: KILN_CPU_THREADS is set to 3 so that the
 * pieces are uneven). The cpu result must agree with the interpreter's
 * within tests/support/tolerance.h's bounds: the GEMM reassociates its K
 * products (kiln_tol_reduce_f32(K) relative to the largest magnitude, as
 * the inputs are about 1), the f32 transcendentals add a few ULPs. Most
 * cases must fuse (a GEMM step that carries an epilogue kernel); an
 * epilogue that reads the dot other than elementwise must not, and still
 * agree.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sbuf.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "executor/run.h"
#include "tests/support/tolerance.h"

static kiln_status st;

static uint64_t rng(uint64_t *s) {
  *s = *s * 6364136223846793005u + 1442695040888963407u;
  return *s >> 33;
}

/* Eighths in [-2, 2]: exact in every type, products and sums of them too
 * for small K. */
static void fill(kiln_literal *l, uint64_t *seed) {
  int64_t n = kiln_literal_elements(l);
  for (int64_t i = 0; i < n; i++)
    kiln_literal_set_f64(l, i, (double)((int64_t)(rng(seed) % 33) - 16) / 8.0);
}

static double max_mag(const kiln_literal *l) {
  double m = 0;
  for (int64_t i = 0; i < kiln_literal_elements(l); i++) {
    double v = kiln_literal_get_f64(l, i);
    if (isfinite(v) && fabs(v) > m) m = fabs(v);
  }
  return m;
}

/* Epilogue steps of the executable's entry program: GEMM steps that carry
 * a kernel (more than their 3 slots). */
static uint32_t fused_gemms(const kiln_executable *e) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < e->programs[0].nsteps; i++) {
    const kiln_step *s = &e->programs[0].steps[i];
    n += s->kind == KILN_STEP_GEMM && s->nargs > 3;
  }
  return n;
}

/* Runs `text` (parameters all floating) on both backends for two seeds;
 * results within rel * max(1, max |want|). Returns the fused GEMM count. */
static uint32_t agree(const char *text, double rel) {
  kiln_module *m = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st) == 0,
                "parse: %s: %s\n%s", st.where, st.msg, text);
  kiln_executable *e = NULL;
  kiln_status_clear(&st);
  int rc = kiln_compile(m, NULL, &e, NULL, &st);
  ck_assert_msg(rc == 0, "compile: %s: %s: %s\n%s", kiln_err_name(rc), st.where, st.msg, text);
  const kiln_computation *en = kiln_module_entry(m);
  uint32_t np = kiln_computation_nparams(m, en);
  ck_assert_uint_le(np, 4);
  kiln_run_options ro = {.timeout_seconds = 60};
  for (int seed = 1; seed <= 2; seed++) {
    kiln_literal *args[4] = {0}, *want = NULL, *got = NULL;
    uint64_t s = (uint64_t)seed * 7919u;
    for (uint32_t i = 0; i < np; i++) {
      const kiln_instr *p = kiln_computation_param(m, en, i);
      ck_assert(kiln_literal_create(NULL, &p->shape, 64u << 20, &args[i], &st) == 0);
      fill(args[i], &s);
    }
    kiln_status_clear(&st);
    rc = kiln_run_module_with(m, "interp", NULL, NULL, &ro, (const kiln_literal *const *)args, np,
                              &want, &st);
    ck_assert_msg(rc == 0, "interp: %s: %s\n%s", st.where, st.msg, text);
    kiln_status_clear(&st);
    rc = kiln_run_executable(e, NULL, &ro, (const kiln_literal *const *)args, np, &got, &st);
    ck_assert_msg(rc == 0, "cpu: %s: %s\n%s", st.where, st.msg, text);
    ck_assert(kiln_shape_equal(&want->shape, &got->shape, false));
    double tol = rel * fmax(1.0, max_mag(want));
    for (int64_t i = 0; i < kiln_literal_elements(want); i++) {
      double a = kiln_literal_get_f64(want, i), b = kiln_literal_get_f64(got, i);
      ck_assert_msg(fabs(a - b) <= tol || (isnan(a) && isnan(b)),
                    "seed %d, element %lld: interp %.9g, cpu %.9g, tolerance %g\n%s", seed,
                    (long long)i, a, b, tol, text);
    }
    kiln_literal_destroy(want);
    kiln_literal_destroy(got);
    for (uint32_t i = 0; i < np; i++) kiln_literal_destroy(args[i]);
  }
  uint32_t fused = fused_gemms(e);
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
  return fused;
}

/* ---- generated cases ---------------------------------------------------- */

enum {
  E_BIAS_N,
  E_BIAS_M,
  E_RELU,
  E_TANH,
  E_LOGISTIC,
  E_GELU,
  E_LEAKY,
  E_RESIDUAL,
  E_SCALE,
  E_CONVERT,
  NKINDS
};

typedef struct gcase {
  const char *t; /* element type */
  uint32_t nb;
  int64_t b[2], m, n, k;
  bool rhs_t; /* rhs stored [.., N, K] */
  int kinds[3], nk;
} gcase;

static void dims(kiln_sbuf *sb, const gcase *c, int64_t x, int64_t y) {
  kiln_sbuf_puts(sb, "[");
  for (uint32_t i = 0; i < c->nb; i++) kiln_sbuf_printf(sb, "%lld,", (long long)c->b[i]);
  kiln_sbuf_printf(sb, "%lld,%lld]", (long long)x, (long long)y);
}

static void batch_list(kiln_sbuf *sb, uint32_t nb) {
  for (uint32_t i = 0; i < nb; i++) kiln_sbuf_printf(sb, "%s%u", i ? "," : "", i);
}

/* The module of case c: ENTRY (x, w, bias, residual) -> epilogue(dot). */
static char *case_text(const gcase *c) {
  kiln_sbuf sb = KILN_SBUF_INIT;
  uint32_t nb = c->nb;
  kiln_sbuf_printf(&sb, "HloModule epi\n\nENTRY main {\n  x = %s", c->t);
  dims(&sb, c, c->m, c->k);
  kiln_sbuf_printf(&sb, " parameter(0)\n  w = %s", c->t);
  dims(&sb, c, c->rhs_t ? c->n : c->k, c->rhs_t ? c->k : c->n);
  kiln_sbuf_printf(&sb, " parameter(1)\n  bn = %s[%lld] parameter(2)\n  res = %s", c->t,
                   (long long)c->n, c->t);
  dims(&sb, c, c->m, c->n);
  kiln_sbuf_printf(&sb, " parameter(3)\n  v0 = %s", c->t);
  dims(&sb, c, c->m, c->n);
  kiln_sbuf_puts(&sb, " dot(x, w)");
  if (nb) {
    kiln_sbuf_puts(&sb, ", lhs_batch_dims={");
    batch_list(&sb, nb);
    kiln_sbuf_puts(&sb, "}, rhs_batch_dims={");
    batch_list(&sb, nb);
    kiln_sbuf_puts(&sb, "}");
  }
  kiln_sbuf_printf(&sb, ", lhs_contracting_dims={%u}, rhs_contracting_dims={%u}\n", nb + 1,
                   c->rhs_t ? nb + 1 : nb);
  const char *t = c->t;
  char shp[128];
  {
    kiln_sbuf d = KILN_SBUF_INIT;
    kiln_sbuf_puts(&d, t);
    dims(&d, c, c->m, c->n);
    snprintf(shp, sizeof shp, "%s", kiln_sbuf_str(&d));
    kiln_sbuf_free(&d);
  }
  int v = 0;
  for (int i = 0; i < c->nk; i++, v++) {
    switch (c->kinds[i]) {
    case E_BIAS_N:
      kiln_sbuf_printf(&sb, "  bb%d = %s broadcast(bn), dimensions={%u}\n", v, shp, nb + 1);
      kiln_sbuf_printf(&sb, "  v%d = %s add(v%d, bb%d)\n", v + 1, shp, v, v);
      break;
    case E_BIAS_M: /* a bias along M: an iota, broadcast along the rows */
      kiln_sbuf_printf(&sb, "  bm%d = %s[%lld] iota(), iota_dimension=0\n", v, t, (long long)c->m);
      kiln_sbuf_printf(&sb, "  bb%d = %s broadcast(bm%d), dimensions={%u}\n", v, shp, v, nb);
      kiln_sbuf_printf(&sb, "  v%d = %s subtract(v%d, bb%d)\n", v + 1, shp, v, v);
      break;
    case E_RELU:
      kiln_sbuf_printf(&sb, "  z%d = %s[] constant(0)\n  zb%d = %s broadcast(z%d), dimensions={}\n",
                       v, t, v, shp, v);
      kiln_sbuf_printf(&sb, "  v%d = %s maximum(v%d, zb%d)\n", v + 1, shp, v, v);
      break;
    case E_TANH: kiln_sbuf_printf(&sb, "  v%d = %s tanh(v%d)\n", v + 1, shp, v); break;
    case E_LOGISTIC: kiln_sbuf_printf(&sb, "  v%d = %s logistic(v%d)\n", v + 1, shp, v); break;
    case E_GELU:
      kiln_sbuf_printf(&sb,
                       "  h%d = %s[] constant(0.5)\n  hb%d = %s broadcast(h%d), dimensions={}\n"
                       "  r%d = %s[] constant(0.70710678)\n  rb%d = %s broadcast(r%d), "
                       "dimensions={}\n  o%d = %s[] constant(1)\n  ob%d = %s broadcast(o%d), "
                       "dimensions={}\n",
                       v, t, v, shp, v, v, t, v, shp, v, v, t, v, shp, v);
      kiln_sbuf_printf(&sb,
                       "  s%d = %s multiply(v%d, rb%d)\n  e%d = %s erf(s%d)\n"
                       "  p%d = %s add(e%d, ob%d)\n  q%d = %s multiply(v%d, hb%d)\n"
                       "  v%d = %s multiply(q%d, p%d)\n",
                       v, shp, v, v, v, shp, v, v, shp, v, v, v, shp, v, v, v + 1, shp, v, v);
      break;
    case E_LEAKY:
      kiln_sbuf_printf(&sb, "  z%d = %s[] constant(0)\n  zb%d = %s broadcast(z%d), dimensions={}\n",
                       v, t, v, shp, v);
      kiln_sbuf_printf(&sb,
                       "  a%d = %s[] constant(0.125)\n  ab%d = %s broadcast(a%d), "
                       "dimensions={}\n",
                       v, t, v, shp, v);
      kiln_sbuf_printf(&sb, "  c%d = pred", v);
      dims(&sb, c, c->m, c->n);
      kiln_sbuf_printf(&sb, " compare(v%d, zb%d), direction=GT\n", v, v);
      kiln_sbuf_printf(&sb, "  l%d = %s multiply(v%d, ab%d)\n", v, shp, v, v);
      kiln_sbuf_printf(&sb, "  v%d = %s select(c%d, v%d, l%d)\n", v + 1, shp, v, v, v);
      break;
    case E_RESIDUAL: kiln_sbuf_printf(&sb, "  v%d = %s add(res, v%d)\n", v + 1, shp, v); break;
    case E_SCALE:
      kiln_sbuf_printf(&sb,
                       "  k%d = %s[] constant(-0.375)\n  kb%d = %s broadcast(k%d), "
                       "dimensions={}\n",
                       v, t, v, shp, v);
      kiln_sbuf_printf(&sb, "  v%d = %s multiply(kb%d, v%d)\n", v + 1, shp, v, v);
      break;
    case E_CONVERT:
      /* there and back: rounds to f16 in the epilogue */
      kiln_sbuf_printf(&sb, "  f%d = f16", v);
      dims(&sb, c, c->m, c->n);
      kiln_sbuf_printf(&sb, " convert(v%d)\n  v%d = %s convert(f%d)\n", v, v + 1, shp, v);
      break;
    }
  }
  kiln_sbuf_printf(&sb, "  ROOT out = %s copy(v%d)\n}\n", shp, v);
  return kiln_sbuf_detach(&sb, NULL);
}

static void gen(uint64_t *s, gcase *c) {
  memset(c, 0, sizeof *c);
  c->t = rng(s) % 4 == 0 ? "f64" : "f32";
  c->nb = (uint32_t)(rng(s) % 3);
  if (c->nb == 2 && rng(s) % 2) c->nb = 1;
  for (uint32_t i = 0; i < c->nb; i++) c->b[i] = 1 + (int64_t)(rng(s) % 3);
  bool big = rng(s) % 3 == 0;
  c->m = big ? 64 + (int64_t)(rng(s) % 100) : 2 + (int64_t)(rng(s) % 40);
  c->n = big ? 64 + (int64_t)(rng(s) % 200) : 2 + (int64_t)(rng(s) % 40);
  c->k = big ? 96 + (int64_t)(rng(s) % 64) : 1 + (int64_t)(rng(s) % 30);
  if (big && rng(s) % 2) c->m = 8 + (int64_t)(rng(s) % 24); /* few rows: column pieces */
  c->rhs_t = rng(s) % 2;
  c->nk = 1 + (int)(rng(s) % 3);
  for (int i = 0; i < c->nk; i++) {
    c->kinds[i] = (int)(rng(s) % NKINDS);
  }
}

static double tolerance(const gcase *c) {
  bool f64 = strcmp(c->t, "f64") == 0;
  double rel = f64 ? 64.0 * (double)(c->k + 1) * 0x1p-52 : kiln_tol_reduce_f32(c->k);
  for (int i = 0; i < c->nk; i++) {
    if (c->kinds[i] == E_CONVERT) rel += 0x1p-10; /* f16 rounding of the value */
    if (!f64) rel += 4.0 * KILN_TOL_ULP_MAX * KILN_TOL_F32_EPS;
  }
  return rel;
}

START_TEST(generated) {
  uint64_t s = 0x5eed + (uint64_t)_i * 104729u;
  uint32_t fused = 0, n = 12;
  for (uint32_t i = 0; i < n; i++) {
    gcase c;
    gen(&s, &c);
    char *text = case_text(&c);
    fused += agree(text, tolerance(&c)) > 0;
    free(text);
  }
  /* Degenerate dims (M or N of 1 after canonicalization) may leave a case
   * unfused; nearly all must fuse. */
  ck_assert_msg(fused >= n - 2, "only %u of %u cases fused their epilogue", fused, n);
}
END_TEST

/* The MLP layer: bias and relu fused, the product cut over the pool. */
START_TEST(mlp_layer) {
  const char *text = "HloModule mlp\n\nENTRY main {\n"
                     "  x = f32[256,200] parameter(0)\n  w = f32[200,300] parameter(1)\n"
                     "  b = f32[300] parameter(2)\n"
                     "  d = f32[256,300] dot(x, w), lhs_contracting_dims={1}, "
                     "rhs_contracting_dims={0}\n"
                     "  bb = f32[256,300] broadcast(b), dimensions={1}\n"
                     "  s = f32[256,300] add(d, bb)\n  z = f32[] constant(0)\n"
                     "  zb = f32[256,300] broadcast(z), dimensions={}\n"
                     "  ROOT r = f32[256,300] maximum(s, zb)\n}\n";
  ck_assert_uint_eq(agree(text, kiln_tol_reduce_f32(200)), 1);
}
END_TEST

/* A batched product with a residual add and a scale, with few rows per
 * batch (pieces are whole batches). */
START_TEST(batched_residual) {
  const char *text = "HloModule bres\n\nENTRY main {\n"
                     "  x = f32[6,40,64] parameter(0)\n  w = f32[6,64,72] parameter(1)\n"
                     "  r = f32[6,40,72] parameter(2)\n"
                     "  d = f32[6,40,72] dot(x, w), lhs_batch_dims={0}, rhs_batch_dims={0}, "
                     "lhs_contracting_dims={2}, rhs_contracting_dims={1}\n"
                     "  k = f32[] constant(0.5)\n  kb = f32[6,40,72] broadcast(k), dimensions={}\n"
                     "  s = f32[6,40,72] multiply(d, kb)\n  ROOT o = f32[6,40,72] add(s, r)\n}\n";
  ck_assert_uint_eq(agree(text, kiln_tol_reduce_f32(64)), 1);
}
END_TEST

/* The residual is the lhs itself: the result may not take the lhs's
 * buffer while later blocks of the product still read it. */
START_TEST(residual_is_operand) {
  const char *text = "HloModule rop\n\nENTRY main {\n"
                     "  x = f32[128,128] parameter(0)\n  w = f32[128,128] parameter(1)\n"
                     "  n = f32[128,128] negate(x)\n"
                     "  d = f32[128,128] dot(n, w), lhs_contracting_dims={1}, "
                     "rhs_contracting_dims={0}\n"
                     "  ROOT o = f32[128,128] add(d, n)\n}\n";
  agree(text, kiln_tol_reduce_f32(128));
}
END_TEST

/* An epilogue that reads the dot transposed is not elementwise: it runs
 * after the GEMM (and agrees). */
START_TEST(transposed_epilogue) {
  const char *text = "HloModule tr\n\nENTRY main {\n"
                     "  x = f32[48,48] parameter(0)\n  w = f32[48,48] parameter(1)\n"
                     "  d = f32[48,48] dot(x, w), lhs_contracting_dims={1}, "
                     "rhs_contracting_dims={0}\n"
                     "  t = f32[48,48] transpose(d), dimensions={1,0}\n"
                     "  ROOT o = f32[48,48] add(d, t)\n}\n";
  ck_assert_uint_eq(agree(text, kiln_tol_reduce_f32(48)), 0);
}
END_TEST

/* Products whose readers were written with the matrix dims exchanged (a
 * transpose the simplifier folded into the dot: per-example gradients'
 * outer products, reduced both ways) are written in that order by the GEMM
 * (C^T = B^T A^T, compiler/passes/layout.c rule 2b), and agree. */
START_TEST(reader_layout) {
  const char *text = "HloModule rl\n\nadd {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
                     "  ROOT s = f32[] add(a, b)\n}\n\nENTRY main {\n"
                     "  x = f32[48,40] parameter(0)\n  g = f32[48,24] parameter(1)\n"
                     "  o = f32[48,24,40] dot(g, x), lhs_batch_dims={0}, lhs_contracting_dims={}, "
                     "rhs_batch_dims={0}, rhs_contracting_dims={}\n"
                     "  t = f32[48,40,24]{1,2,0} transpose(o), dimensions={0,2,1}\n"
                     "  sq = f32[48,40,24]{1,2,0} multiply(t, t)\n  z = f32[] constant(0)\n"
                     "  n = f32[48] reduce(sq, z), dimensions={1,2}, to_apply=add\n"
                     "  m = f32[40,24] reduce(t, z), dimensions={0}, to_apply=add\n"
                     "  a = f32[6,30,20] parameter(2)\n  b = f32[6,20,36] parameter(3)\n"
                     "  c = f32[6,30,36] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
                     "rhs_batch_dims={0}, rhs_contracting_dims={1}\n"
                     "  ct = f32[6,36,30]{1,2,0} transpose(c), dimensions={0,2,1}\n"
                     "  e = f32[6,36,30]{1,2,0} exponential(ct)\n"
                     "  r = f32[6,36] reduce(e, z), dimensions={2}, to_apply=add\n"
                     "  ROOT out = (f32[48], f32[40,24], f32[6,36]) tuple(n, m, r)\n}\n";
  agree(text, kiln_tol_reduce_f32(1000));
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cpu_epilogue");
  TCase *tc = tcase_create("epilogue");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, generated, 0, 4);
  tcase_add_test(tc, mlp_layer);
  tcase_add_test(tc, batched_residual);
  tcase_add_test(tc, residual_is_operand);
  tcase_add_test(tc, transposed_epilogue);
  tcase_add_test(tc, reader_layout);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  /* Three workers: pieces of uneven size, and more of them than cores. */
  setenv("KILN_CPU_THREADS", "3", 0);
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
