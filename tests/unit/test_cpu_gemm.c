/* The GEMM step's runner (executor/cpu/cpu_gemm.c) against a plain loop:
 * random batched products, f32 and f64, either operand transposed,
 * leading dimensions wider than the matrix, alpha and beta, on pools of
 * one and of three threads (pieces cut by batches, rows or columns). Small
 * pieces run on OpenBLAS or the unpacked tiles (cpu_gemm_small.c), large
 * f32 ones on oneDNN's sgemm (cpu_gemm_dnnl.c) when the build has it.
 *
 * Operands are multiples of 1/8 in [-2, 2], alpha and beta in {1, 1/2,
 * -1/2, 0}: every product and every partial sum here is a multiple of 2^-8
 * far below 2^24 of them, exact in f32 in any order of summation, so the
 * results must equal the loop's exactly whichever library runs them. With
 * beta 0, C starts as NaN: a GEMM must not read it.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cpu/cpu.h"

#if defined(KILN_HAVE_DNNL) && !defined(__SANITIZE_ADDRESS__)
#define LIBRARY 1
#else
#define LIBRARY 0
#endif

static uint64_t rng(uint64_t *s) {
  *s = *s * 6364136223846793005u + 1442695040888963407u;
  return *s >> 33;
}

static int64_t pick(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(rng(s) % (uint64_t)(hi - lo + 1));
}

static double eighth(uint64_t *s) { return (double)((int64_t)(rng(s) % 33) - 16) / 8.0; }

static void put(void *p, bool f64, int64_t i, double v) {
  if (f64)
    ((double *)p)[i] = v;
  else
    ((float *)p)[i] = (float)v;
}

static double get(const void *p, bool f64, int64_t i) {
  return f64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

/* One random product run on `pool`; fails the test on any difference. */
static void one_case(kiln__cpu_pool *pool, uint64_t *s) {
  kiln_gemm g;
  memset(&g, 0, sizeof g);
  bool f64 = pick(s, 0, 3) == 0, big = pick(s, 0, 1) == 1;
  g.dtype = f64 ? KILN_F64 : KILN_F32;
  g.batch = pick(s, 1, 3);
  g.m = big ? pick(s, 40, 300) : pick(s, 1, 24);
  g.n = big ? pick(s, 40, 300) : pick(s, 1, 24);
  g.k = big ? pick(s, 30, 300) : pick(s, 1, 24);
  g.trans_a = (uint8_t)pick(s, 0, 1);
  g.trans_b = (uint8_t)pick(s, 0, 1);
  int64_t ar = g.trans_a ? g.k : g.m, ac = g.trans_a ? g.m : g.k; /* A as stored */
  int64_t br = g.trans_b ? g.n : g.k, bc = g.trans_b ? g.k : g.n;
  g.lda = ac + pick(s, 0, 1) * pick(s, 1, 9);
  g.ldb = bc + pick(s, 0, 1) * pick(s, 1, 9);
  g.ldc = g.n + pick(s, 0, 1) * pick(s, 1, 9);
  g.stride_a = ar * g.lda + pick(s, 0, 5);
  g.stride_b = br * g.ldb + pick(s, 0, 5);
  g.stride_c = g.m * g.ldc + pick(s, 0, 5);
  static const double coef[] = {1, 0.5, -0.5, 0};
  g.alpha = coef[pick(s, 0, 2)];
  g.beta = coef[pick(s, 0, 3)];
  size_t es = f64 ? 8 : 4;
  int64_t na = g.batch * g.stride_a, nb = g.batch * g.stride_b, nc = g.batch * g.stride_c;
  void *a = malloc((size_t)na * es), *b = malloc((size_t)nb * es), *c = malloc((size_t)nc * es);
  double *want = malloc((size_t)nc * sizeof *want);
  ck_assert(a && b && c && want);
  for (int64_t i = 0; i < na; i++) put(a, f64, i, eighth(s));
  for (int64_t i = 0; i < nb; i++) put(b, f64, i, eighth(s));
  for (int64_t i = 0; i < nc; i++) {
    put(c, f64, i, g.beta == 0 ? NAN : eighth(s));
    want[i] = get(c, f64, i); /* outside the matrices: untouched */
  }
  for (int64_t t = 0; t < g.batch; t++)
    for (int64_t i = 0; i < g.m; i++)
      for (int64_t j = 0; j < g.n; j++) {
        double acc = 0;
        for (int64_t p = 0; p < g.k; p++) {
          int64_t ai = t * g.stride_a + (g.trans_a ? p * g.lda + i : i * g.lda + p);
          int64_t bi = t * g.stride_b + (g.trans_b ? j * g.ldb + p : p * g.ldb + j);
          acc += get(a, f64, ai) * get(b, f64, bi);
        }
        int64_t ci = t * g.stride_c + i * g.ldc + j;
        want[ci] = g.alpha * acc + (g.beta == 0 ? 0 : g.beta * want[ci]);
      }
  kiln__cpu_gemm(pool, &g, a, b, c, NULL);
  for (int64_t i = 0; i < nc; i++) {
    double got = get(c, f64, i);
    bool same = isnan(want[i]) ? isnan(got) : got == want[i];
    ck_assert_msg(same,
                  "element %lld: %.9g, want %.9g (%s batch %lld m %lld n %lld k %lld ta %d tb %d "
                  "lda %lld ldb %lld ldc %lld alpha %g beta %g)",
                  (long long)i, got, want[i], f64 ? "f64" : "f32", (long long)g.batch,
                  (long long)g.m, (long long)g.n, (long long)g.k, g.trans_a, g.trans_b,
                  (long long)g.lda, (long long)g.ldb, (long long)g.ldc, g.alpha, g.beta);
  }
  free(a);
  free(b);
  free(c);
  free(want);
}

START_TEST(random_products) {
  kiln_status st;
  kiln__cpu_pool *pool = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__cpu_pool_create(_i == 0 ? 1 : 3, &pool, &st), 0);
  uint64_t s = 0x6e33u + (uint64_t)_i;
  for (int round = 0; round < 60; round++) one_case(pool, &s);
  kiln__cpu_pool_destroy(pool);
}
END_TEST

/* Which pieces oneDNN takes: large f32 ones, where the build has it. */
START_TEST(dnnl_takes) {
  ck_assert_int_eq(kiln__cpu_sgemm_dnnl_takes(256, 512, 1024), LIBRARY);
  ck_assert_int_eq(kiln__cpu_sgemm_dnnl_takes(128, 32, 400), LIBRARY);
  ck_assert(!kiln__cpu_sgemm_dnnl_takes(16, 16, 16));
  ck_assert(!kiln__cpu_sgemm_dnnl_takes(1, 256, 8));
}
END_TEST

int main(void) {
  Suite *su = suite_create("cpu_gemm");
  TCase *tc = tcase_create("gemm");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, random_products, 0, 2);
  tcase_add_test(tc, dnnl_takes);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
