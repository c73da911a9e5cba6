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
 *
 * The integer GEMM step (cpu_igemm.c: s8 or u8 x s8 -> s32) likewise, bit
 * for bit against a loop that sums in u32 (s32's wrapping), with operands
 * at random or lopsided (nearly all at one end of the range, so that the
 * sums run far past 2^24, and past 2^31 where K allows: wrap-around) and K
 * on both sides of the bound below which oneDNN's own s8 path is exact.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cpu/cpu.h"
#include "executor/cpu/cpu_dnnl.h"

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

/* ---- integer GEMMs -------------------------------------------------------- */

/* One operand element: random over the type, or lopsided (7 in 8 at the
 * end of the range whose products are largest: min for s8, max for u8). */
static int32_t int_value(uint64_t *s, bool u8, bool lopsided) {
  uint64_t r = rng(s);
  if (!lopsided) return u8 ? (int32_t)(r & 0xff) : (int32_t)(r & 0xff) - 128;
  if (r % 8 != 0) return u8 ? 255 : -128;
  return u8 ? (int32_t)(r >> 8) % 256 : 127;
}

/* One integer product C = A B on `pool` against the wrapping loop; dense:
 * no gaps between rows and batches (oneDNN picks other kernels then);
 * trans: bit 0 A transposed, bit 1 B, -1 at random. */
static void int_case(kiln__cpu_pool *pool, uint64_t *s, kiln_dtype dt, int64_t batch, int64_t m,
                     int64_t n, int64_t k, bool lopsided, bool dense, int trans) {
  kiln_gemm g;
  memset(&g, 0, sizeof g);
  g.dtype = dt;
  g.batch = batch, g.m = m, g.n = n, g.k = k;
  if (trans < 0) trans = (int)pick(s, 0, 3);
  g.trans_a = trans & 1;
  g.trans_b = (trans >> 1) & 1;
  int64_t ar = g.trans_a ? k : m, ac = g.trans_a ? m : k, br = g.trans_b ? n : k;
  int64_t bc = g.trans_b ? k : n;
  int64_t gap = dense ? 0 : 1;
  g.lda = ac + gap * pick(s, 0, 1) * pick(s, 1, 9);
  g.ldb = bc + gap * pick(s, 0, 1) * pick(s, 1, 9);
  g.ldc = n + gap * pick(s, 0, 1) * pick(s, 1, 9);
  g.stride_a = ar * g.lda + gap * pick(s, 0, 5);
  g.stride_b = br * g.ldb + gap * pick(s, 0, 5);
  g.stride_c = m * g.ldc + gap * pick(s, 0, 5);
  g.alpha = 1;
  int64_t na = batch * g.stride_a, nb = batch * g.stride_b, nc = batch * g.stride_c;
  uint8_t *a = malloc((size_t)na);
  int8_t *b = malloc((size_t)nb);
  int32_t *c = malloc((size_t)nc * sizeof *c), *want = malloc((size_t)nc * sizeof *want);
  ck_assert(a && b && c && want);
  bool u8 = dt == KILN_U8;
  for (int64_t i = 0; i < na; i++) a[i] = (uint8_t)int_value(s, u8, lopsided);
  for (int64_t i = 0; i < nb; i++) b[i] = (int8_t)int_value(s, false, lopsided);
  for (int64_t i = 0; i < nc; i++) c[i] = want[i] = (int32_t)(0x5a5a0000 + i); /* gaps kept */
  for (int64_t t = 0; t < batch; t++)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        uint32_t acc = 0;
        for (int64_t p = 0; p < k; p++) {
          int64_t ai = t * g.stride_a + (g.trans_a ? p * g.lda + i : i * g.lda + p);
          int64_t bi = t * g.stride_b + (g.trans_b ? j * g.ldb + p : p * g.ldb + j);
          int32_t av = u8 ? (int32_t)a[ai] : (int32_t)(int8_t)a[ai];
          acc += (uint32_t)(av * (int32_t)b[bi]);
        }
        memcpy(&want[t * g.stride_c + i * g.ldc + j], &acc, sizeof acc);
      }
  kiln__cpu_igemm(pool, &g, a, b, c);
  for (int64_t i = 0; i < nc; i++)
    ck_assert_msg(c[i] == want[i],
                  "element %lld: %d, want %d (%s batch %lld m %lld n %lld k %lld ta %d tb %d "
                  "lda %lld ldb %lld ldc %lld, %s operands, %s)",
                  (long long)i, c[i], want[i], u8 ? "u8" : "s8", (long long)batch, (long long)m,
                  (long long)n, (long long)k, g.trans_a, g.trans_b, (long long)g.lda,
                  (long long)g.ldb, (long long)g.ldc, lopsided ? "lopsided" : "random",
                  kiln__cpu_igemm_shifts(&g)         ? "oneDNN, A shifted to u8"
                  : kiln__cpu_igemm_uses_library(&g) ? "oneDNN"
                                                     : "the loop");
  free(a);
  free(b);
  free(c);
  free(want);
}

/* Random shapes and layouts, K on both sides of 514 (oneDNN's own s8 path
 * is exact up to it), on pools of one and three threads. */
START_TEST(int_products) {
  kiln_status st;
  kiln__cpu_pool *pool = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__cpu_pool_create(_i == 0 ? 1 : 3, &pool, &st), 0);
  uint64_t s = 0x1e77u + (uint64_t)_i;
  static const int64_t ks[] = {1, 3, 64, 300, 514, 515, 1031, 2048, 4097};
  for (int round = 0; round < (LIBRARY ? 40 : 12); round++) {
    kiln_dtype dt = pick(&s, 0, 2) == 0 ? KILN_U8 : KILN_S8;
    int64_t batch = pick(&s, 1, 3), m = pick(&s, 1, 48), n = pick(&s, 1, 48);
    int64_t k = ks[pick(&s, 0, 8)];
    int_case(pool, &s, dt, batch, m, n, k, pick(&s, 0, 1) == 1, pick(&s, 0, 1) == 1, -1);
  }
  kiln__cpu_pool_destroy(pool);
}
END_TEST

/* The sums oneDNN's s8 path rounds through f32 (oneDNN 2.6 on its VNNI
 * kernels: s8 [16, 4097] x [4097, 16], lopsided, came back 1 or 2 off) and
 * sums past 2^31 that wrap, both ways, s8 and u8, every layout, dense and
 * with gaps; a large square one where oneDNN picks its AMX kernels on CPUs
 * that have them. */
static void wide_sums(void) {
  kiln_status st;
  kiln__cpu_pool *pool = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__cpu_pool_create(2, &pool, &st), 0);
  uint64_t s = 0x5eedu;
  /* Without the library (sanitizer builds) only the loop runs, slowly
   * there: two layouts suffice. */
  for (int layout = 0; layout < 8; layout += LIBRARY ? 1 : 5) {
    bool dense = layout < 4;
    int t = layout % 4;
    int_case(pool, &s, KILN_S8, 1, 16, 16, 4097, true, dense, t);
    int_case(pool, &s, KILN_U8, 1, 16, 16, 4097, true, dense, t);
    int_case(pool, &s, KILN_S8, 2, 28, 42, 2048, true, dense, t);
    int_case(pool, &s, KILN_S8, 1, 4, 8, 140001, true, dense, t); /* 16384 K > 2^31 */
    int_case(pool, &s, KILN_U8, 2, 4, 8, 70001, true, dense, t);  /* -32640 K < -2^31 */
    if (LIBRARY) int_case(pool, &s, KILN_S8, 1, 256, 256, 1031, true, dense, t);
  }
  kiln__cpu_pool_destroy(pool);
}

START_TEST(int_wide_sums) { wide_sums(); }
END_TEST

/* The same on oneDNN's VNNI kernels, as a CPU without AMX runs them (on
 * this machine's AMX the s8 kernels happen to be exact): oneDNN reads
 * ONEDNN_MAX_CPU_ISA when it is opened, which in fork mode is in this
 * test's own process. */
START_TEST(int_wide_sums_vnni) {
  setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI", 0);
  wide_sums();
}
END_TEST

/* Which path an integer GEMM takes: oneDNN where the CPU has VNNI (s8 as
 * s8 up to K = 514, shifted to u8 past it; u8 always as u8), else the
 * loop. */
START_TEST(int_paths) {
  kiln_gemm g = {.dtype = KILN_S8,
                 .batch = 1,
                 .m = 8,
                 .n = 8,
                 .k = 514,
                 .lda = 514,
                 .ldb = 8,
                 .ldc = 8,
                 .stride_a = 8 * 514,
                 .stride_b = 514 * 8,
                 .stride_c = 64,
                 .alpha = 1};
  bool vnni = false;
#if defined(__x86_64__)
  __builtin_cpu_init();
  vnni = __builtin_cpu_supports("avx512vnni");
#endif
  bool on = LIBRARY && vnni && kiln__dnnl_why() == NULL;
  if (!on) fprintf(stderr, "int_paths: the loop only (%s)\n", vnni ? kiln__dnnl_why() : "no VNNI");
  ck_assert_int_eq(kiln__cpu_igemm_uses_library(&g), on);
  ck_assert(!kiln__cpu_igemm_shifts(&g));
  g.k = g.lda = 515, g.stride_a = 8 * 515, g.stride_b = 515 * 8;
  ck_assert_int_eq(kiln__cpu_igemm_uses_library(&g), on);
  ck_assert_int_eq(kiln__cpu_igemm_shifts(&g), on);
  g.dtype = KILN_U8;
  ck_assert_int_eq(kiln__cpu_igemm_uses_library(&g), on);
  ck_assert(!kiln__cpu_igemm_shifts(&g));
}
END_TEST

int main(void) {
  Suite *su = suite_create("cpu_gemm");
  TCase *tc = tcase_create("gemm");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, random_products, 0, 2);
  tcase_add_test(tc, dnnl_takes);
  tcase_add_loop_test(tc, int_products, 0, 2);
  tcase_add_test(tc, int_wide_sums);
  tcase_add_test(tc, int_wide_sums_vnni);
  tcase_add_test(tc, int_paths);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
