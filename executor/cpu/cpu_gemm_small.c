/* Small f32 GEMM pieces without packing: C = alpha op(A) B + beta C.
 *
 * OpenBLAS copies both operands into packed panels on every call. For a
 * product with few rows of C (a recurrent step: 32 rows against a 256x256
 * weight) the copy of B is as much work as the multiply, and it is redone
 * on every call, every loop iteration, for the same loop-invariant weight.
 * Here B is read where it lies: C is cut into tiles of up to 12 rows by 32
 * columns (24 AVX-512 accumulators), and for each k the tile's two vectors
 * of row k of B are multiplied by the broadcast A[i][k] of each row. A
 * 32-column strip of B (K x 128 bytes) stays in L1 while the row tiles
 * below it reuse it. Only pieces with at most KILN__SMALL_GEMM_M rows come
 * here, B not transposed, on a CPU with AVX-512F, and only where B is
 * between 64 KiB and 512 KiB: below, OpenBLAS's packing costs little and its
 * kernels are 5-15% faster; above, the strided strips of B no longer stay in
 * cache and the packed panels win (measured on this project's machine,
 * single-threaded, 16-64 rows). Everything else goes to OpenBLAS
 * (cpu_gemm.c).
 *
 * Each element of C is one sequential fused multiply-add chain over k, in
 * order, in f32, as OpenBLAS's kernels compute it. KILN_CPU_SMALL_GEMM=0
 * sends every piece to OpenBLAS (to compare the two).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cpu/cpu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX512_PATH 1
#endif

#ifdef HAVE_AVX512_PATH
#define TARGET __attribute__((target("avx512f,fma")))
#define MAX_MR 12 /* rows of a tile: 24 accumulators, 2 vectors of B, 6 spare */

/* One tile: rows [0, MR) of C, the columns selected by masks m0 (first 16)
 * and m1 (next 16). MR is a constant at every call site, so the loops over
 * rows unroll and the accumulators live in registers. */
TARGET __attribute__((always_inline)) static inline void
tile(const int MR, int64_t k, const float *a, int64_t ars, int64_t acs, const float *b, int64_t ldb,
     float *c, int64_t ldc, __mmask16 m0, __mmask16 m1, float alpha, float beta) {
  __m512 acc0[MAX_MR], acc1[MAX_MR];
  _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++) acc0[i] = acc1[i] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; p++) {
    __m512 b0 = _mm512_maskz_loadu_ps(m0, b + p * ldb);
    __m512 b1 = _mm512_maskz_loadu_ps(m1, b + p * ldb + 16);
    const float *ap = a + p * acs;
    _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++) {
      __m512 av = _mm512_set1_ps(ap[i * ars]);
      acc0[i] = _mm512_fmadd_ps(av, b0, acc0[i]);
      acc1[i] = _mm512_fmadd_ps(av, b1, acc1[i]);
    }
  }
  __m512 al = _mm512_set1_ps(alpha), bt = _mm512_set1_ps(beta);
  _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++) {
    float *ci = c + i * ldc;
    __m512 r0 = _mm512_mul_ps(al, acc0[i]), r1 = _mm512_mul_ps(al, acc1[i]);
    if (beta != 0.0f) { /* beta 0 never reads C (a NaN there stays out) */
      r0 = _mm512_fmadd_ps(bt, _mm512_maskz_loadu_ps(m0, ci), r0);
      r1 = _mm512_fmadd_ps(bt, _mm512_maskz_loadu_ps(m1, ci + 16), r1);
    }
    _mm512_mask_storeu_ps(ci, m0, r0);
    _mm512_mask_storeu_ps(ci + 16, m1, r1);
  }
}

TARGET static void sgemm_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                               int64_t ars, int64_t acs, const float *b, int64_t ldb, float beta,
                               float *c, int64_t ldc) {
  for (int64_t j = 0; j < n; j += 32) {
    int64_t w = n - j < 32 ? n - j : 32;
    __mmask16 m0 = w >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << w) - 1);
    __mmask16 m1 = w >= 32   ? (__mmask16)0xffff
                   : w <= 16 ? (__mmask16)0
                             : (__mmask16)((1u << (w - 16)) - 1);
    int64_t i = 0;
    for (; i + MAX_MR <= m; i += MAX_MR)
      tile(MAX_MR, k, a + i * ars, ars, acs, b + j, ldb, c + i * ldc + j, ldc, m0, m1, alpha, beta);
    const float *ai = a + i * ars;
    float *cij = c + i * ldc + j;
    switch (m - i) {
#define TAIL(r) \
  case r: tile(r, k, ai, ars, acs, b + j, ldb, cij, ldc, m0, m1, alpha, beta); break;
      TAIL(1)
      TAIL(2)
      TAIL(3)
      TAIL(4)
      TAIL(5)
      TAIL(6)
      TAIL(7)
      TAIL(8)
      TAIL(9)
      TAIL(10)
      TAIL(11)
#undef TAIL
    default: break;
    }
  }
}
#endif

/* 1: take small pieces here; 0: off (no AVX-512F, or KILN_CPU_SMALL_GEMM=0);
 * -1: not decided yet. Deciding twice gives the same answer. */
static atomic_int enabled = -1;

static bool small_enabled(void) {
  int e = atomic_load_explicit(&enabled, memory_order_relaxed);
  if (e >= 0) return e == 1;
  e = 0;
#ifdef HAVE_AVX512_PATH
  __builtin_cpu_init();
  const char *env = getenv("KILN_CPU_SMALL_GEMM");
  e = __builtin_cpu_supports("avx512f") && !(env && strcmp(env, "0") == 0);
#endif
  atomic_store_explicit(&enabled, e, memory_order_relaxed);
  return e == 1;
}

bool kiln__cpu_sgemm_small_takes(int64_t m, int64_t n, int64_t k) {
  return m >= 1 && m <= KILN__SMALL_GEMM_M && n >= 1 && k >= 1 &&
         n * k >= KILN__SMALL_GEMM_MIN_NK && n * k <= KILN__SMALL_GEMM_MAX_NK && small_enabled();
}

bool kiln__cpu_sgemm_small(int64_t m, int64_t n, int64_t k, bool trans_a, float alpha,
                           const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                           float *c, int64_t ldc) {
  if (!kiln__cpu_sgemm_small_takes(m, n, k)) return false;
#ifdef HAVE_AVX512_PATH
  /* A[i][p] is a[i * ars + p * acs]. */
  int64_t ars = trans_a ? 1 : lda, acs = trans_a ? lda : 1;
  sgemm_small(m, n, k, alpha, a, ars, acs, b, ldb, beta, c, ldc);
  return true;
#else
  (void)trans_a, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)beta, (void)c,
      (void)ldc;
  return false;
#endif
}
