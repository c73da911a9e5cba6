/* f32 GEMM pieces through oneDNN's sgemm (dnnl_sgemm), where it beats
 * OpenBLAS.
 *
 * Measured single-threaded in CPU time on this project's machine (Debian's
 * OpenBLAS 0.3.21 SkylakeX kernels against oneDNN 2.6), on the shapes the
 * models' GEMM steps and their pieces have: oneDNN is 1-15% faster on the
 * MLP and VAE layers and their gradients (256x1024x784, 256x512x1024 with
 * ld 1024, 784x1024x256 with A transposed, 128x400x784), 30-70% on narrow
 * products (128x32x400, 256x10x1024, 2x512x512), and about even at
 * 128x16x128; below about 2^19 flops its per-call cost (half a
 * microsecond) loses to OpenBLAS (16x16x16: 0.5x). So pieces of at least
 * MIN_FLOPS come here, the others stay with OpenBLAS, and the unpacked
 * small tiles (cpu_gemm_small.c) keep theirs.
 *
 * Threads: a piece runs on the device pool's thread that took it, and
 * must stay on it (the pool already spreads the product over the cores;
 * a oneDNN OpenMP team per piece would put two threads on each core).
 * OpenMP's thread count is a per-thread setting for a thread OpenMP did
 * not create, so each call sets it to 1 for this thread and puts the old
 * value back (a CONV step run later on the same thread wants its team).
 * The symbols come from cpu_dnnl.c's table (OpenMP's controls included).
 * Sanitizer builds, builds without oneDNN, a oneDNN whose OpenMP controls
 * are not found and KILN_CPU_DNNL_SGEMM=0 keep OpenBLAS for every piece.
 * Results differ from OpenBLAS's in rounding only (another summation
 * order).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cpu/cpu.h"
#include "executor/cpu/cpu_dnnl.h"

#define MIN_FLOPS 524288.0 /* 2 m n k, at least */

#if KILN__DNNL

static const kiln__dnnl_api *dn; /* NULL: OpenBLAS for every piece */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void choose(void) {
  const char *env = getenv("KILN_CPU_DNNL_SGEMM");
  if (env && strcmp(env, "0") == 0) return;
  const kiln__dnnl_api *d = kiln__dnnl_get();
  /* Without the OpenMP controls a piece could not be kept on its thread. */
  if (d && d->omp_get_max_threads && d->omp_set_num_threads) dn = d;
}

bool kiln__cpu_sgemm_dnnl_takes(int64_t m, int64_t n, int64_t k) {
  if (2.0 * (double)m * (double)n * (double)k < MIN_FLOPS) return false;
  pthread_once(&once, choose);
  return dn != NULL;
}

bool kiln__cpu_sgemm_dnnl(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc) {
  if (!kiln__cpu_sgemm_dnnl_takes(m, n, k)) return false;
  int was = dn->omp_get_max_threads();
  if (was != 1) dn->omp_set_num_threads(1);
  dnnl_status_t s = dn->sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b,
                              ldb, beta, c, ldc);
  if (was != 1) dn->omp_set_num_threads(was);
  /* oneDNN checks the arguments before touching C: a refusal leaves it as
   * it was for OpenBLAS. */
  return s == dnnl_success;
}

#else

bool kiln__cpu_sgemm_dnnl_takes(int64_t m, int64_t n, int64_t k) {
  (void)m, (void)n, (void)k;
  return false;
}

bool kiln__cpu_sgemm_dnnl(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc) {
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b,
      (void)ldb, (void)beta, (void)c, (void)ldc;
  return false;
}

#endif
