/* The bf16 GEMM step on the cpu backend: C (f32) = A (bf16) x B (bf16),
 * the GEMM step with dtype BF16 (compiler/codegen/executable.h), which dot
 * canonicalization writes for a dot of two bf16 operands (a bf16 matmul
 * in JAX), its f32 sum converted to the dot's type afterwards.
 *
 * The idea: every product of two bf16 values is exact in f32 and XLA
 * accumulates a bf16 dot in f32, so any f32 GEMM of the operands widened
 * computes it, in any summation order (the tolerance of an f32 GEMM
 * against the interpreter: tests/support/tolerance.h). oneDNN's bf16
 * matmul does that on the CPU's bf16 units (AMX tiles or AVX-512
 * vdpbf16ps: 2 to 16 times an f32 FMA's products per cycle) and reads
 * half the bytes of A and B. Where oneDNN cannot run it (no library, a
 * CPU without avx512_bf16, a sanitizer build, a shape it refuses) A and B
 * are widened into f32 scratch and the f32 GEMM step runs (cpu_gemm.c),
 * which is what the step computed before it kept bf16 operands.
 *
 * The matmul primitives and their cache are cpu_dnnl.c's (operands
 * described as they lie, one primitive per distinct step, kept for the
 * process). oneDNN threads the product itself; an epilogue then runs over
 * all of C, split over the pool.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "executor/cpu/cpu.h"
#include "executor/cpu/cpu_dnnl.h"

/* ---- the fallback: widen, then the f32 GEMM ------------------------------- */

typedef struct widen_job {
  const uint16_t *src;
  float *dst;
  uint64_t n, chunk;
} widen_job;

static void widen_chunk(void *ctx, uint64_t c) {
  const widen_job *j = ctx;
  uint64_t lo = c * j->chunk, hi = lo + j->chunk < j->n ? lo + j->chunk : j->n;
  for (uint64_t i = lo; i < hi; i++) {
    uint32_t u = (uint32_t)j->src[i] << 16;
    memcpy(&j->dst[i], &u, 4);
  }
}

static void widen(kiln__cpu_pool *pool, const uint16_t *src, float *dst, uint64_t n) {
  widen_job j = {src, dst, n, 1u << 16};
  if (n) kiln__cpu_pool_run(pool, widen_chunk, &j, (n + j.chunk - 1) / j.chunk);
}

/* Elements spanned by a [batch, rows, cols] view with leading dimension
 * ld and batch stride `stride` (the load checked that they lie in the
 * slot), up to the last element of its last row. */
static uint64_t extent(int64_t batch, int64_t rows, int64_t cols, int64_t ld, int64_t stride) {
  if (batch == 0 || rows == 0 || cols == 0) return 0;
  return (uint64_t)((batch - 1) * stride + (rows - 1) * ld + cols);
}

static bool run_widened(kiln__cpu_pool *pool, const kiln_gemm *g, const void *a, const void *b,
                        void *c, const kiln__cpu_epilogue *epi) {
  uint64_t na =
      extent(g->batch, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda, g->stride_a);
  uint64_t nb =
      extent(g->batch, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb, g->stride_b);
  float *fa = kiln_malloc((na ? na : 1) * sizeof *fa),
        *fb = kiln_malloc((nb ? nb : 1) * sizeof *fb);
  bool ok = fa && fb;
  if (ok) {
    widen(pool, a, fa, na);
    widen(pool, b, fb, nb);
    kiln_gemm f = *g;
    f.dtype = KILN_F32;
    kiln__cpu_gemm(pool, &f, fa, fb, c, epi);
  }
  kiln_free(fa);
  kiln_free(fb);
  return ok;
}

/* ---- oneDNN -------------------------------------------------------------- */

static bool has_bf16(void) {
#if KILN__DNNL && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

bool kiln__cpu_bgemm_uses_library(const kiln_gemm *g) {
  return has_bf16() && kiln__dnnl_matmul_takes(g, KILN_BF16, KILN_BF16, KILN_F32);
}

int kiln__cpu_bgemm(kiln__cpu_pool *pool, const kiln_gemm *g, const void *a, const void *b, void *c,
                    const kiln__cpu_epilogue *epi) {
  if (g->batch == 0 || g->m == 0 || g->n == 0) return 0;
  if (g->k > 0 && has_bf16() && kiln__dnnl_matmul_run(g, KILN_BF16, KILN_BF16, KILN_F32, a, b, c)) {
    if (epi) kiln__cpu_gemm_epilogue(pool, g, epi);
    return 0;
  }
  return run_widened(pool, g, a, b, c, epi) ? 0 : KILN_ENOMEM;
}
