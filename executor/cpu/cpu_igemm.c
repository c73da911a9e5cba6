/* The integer GEMM step on the cpu backend: C (s32) = A (s8 or u8) x B
 * (s8), the GEMM step with dtype S8 or U8 (compiler/codegen/executable.h),
 * as int8-quantized matmuls write it (jax lax.dot_general with
 * preferred_element_type=int32).
 *
 * The idea: oneDNN's int8 matmul runs it with s32 accumulation on VNNI
 * (vpdpbusd: four u8 x s8 products summed into an s32 lane per
 * instruction) or AMX tiles, which is exact for a u8 A: every product and
 * sum is an integer computed modulo 2^32, so C is the s32 result bit for
 * bit whatever K is, as XLA's and the interpreter's wrapping sums are.
 * An s8 A is not always so: where the CPU has no s8 x s8 instruction
 * (VNNI; AMX has one) oneDNN shifts A into u8 and subtracts B's column
 * sums times 128 afterwards, and it does that subtraction in f32 (oneDNN
 * 2.6, measured: s8 [16, 4097] x [4097, 16] with |sums| near 2^25 came
 * back rounded to a multiple of 4). So an s8 A goes to oneDNN as s8 only
 * while no value it forms can leave f32's exact integers (K * 255 * 128 <=
 * 2^24: EXACT_K); past that Kiln does the shift itself, in integers: A ^
 * 0x80 is a + 128 as u8, oneDNN's u8 matmul sums (a + 128) b exactly, and
 * C = that - 128 * colsum(B) modulo 2^32, the same wrapping sums.
 *
 * Without VNNI oneDNN's int8 kernels add pairs of products in saturating
 * 16-bit lanes (vpmaddubsw), which is not exact: such CPUs, builds without
 * oneDNN and sanitizer builds run the plain loop below, split over the pool
 * by rows, which is exact too. The matmul primitives and their cache are
 * cpu_dnnl.c's (the operands described as they lie, nothing copied).
 */
#include <stdint.h>
#include <string.h>

#include "common/alloc.h"
#include "executor/cpu/cpu.h"
#include "executor/cpu/cpu_dnnl.h"

/* ---- the plain loop ------------------------------------------------------ */

typedef struct loop_job {
  const kiln_gemm *g;
  const void *a, *b;
  int32_t *c;
} loop_job;

/* Row i of batch `bt`: C[i, :] = sum over k of A[i, k] B[k, :], in u32 so
 * that the sums wrap as s32's two's complement does (signed overflow is
 * undefined in C). */
static void loop_row(void *ctx, uint64_t chunk) {
  const loop_job *j = ctx;
  const kiln_gemm *g = j->g;
  int64_t bt = (int64_t)chunk / g->m, i = (int64_t)chunk % g->m;
  const int8_t *as = (const int8_t *)j->a + bt * g->stride_a;
  const uint8_t *au = (const uint8_t *)j->a + bt * g->stride_a;
  const int8_t *b = (const int8_t *)j->b + bt * g->stride_b;
  uint32_t *c = (uint32_t *)(j->c + bt * g->stride_c + i * g->ldc);
  bool sa = g->dtype == KILN_S8;
  for (int64_t n = 0; n < g->n; n++) c[n] = 0;
  for (int64_t k = 0; k < g->k; k++) {
    int64_t ai = g->trans_a ? k * g->lda + i : i * g->lda + k;
    uint32_t av = sa ? (uint32_t)(int32_t)as[ai] : (uint32_t)au[ai];
    if (av == 0) continue;
    if (g->trans_b)
      for (int64_t n = 0; n < g->n; n++) c[n] += av * (uint32_t)(int32_t)b[n * g->ldb + k];
    else
      for (int64_t n = 0; n < g->n; n++) c[n] += av * (uint32_t)(int32_t)b[k * g->ldb + n];
  }
}

static void run_loop(kiln__cpu_pool *pool, const kiln_gemm *g, const void *a, const void *b,
                     void *c) {
  loop_job j = {g, a, b, c};
  uint64_t rows = (uint64_t)g->batch * (uint64_t)g->m;
  if (rows) kiln__cpu_pool_run(pool, loop_row, &j, rows);
}

/* ---- oneDNN -------------------------------------------------------------- */

/* The largest K for which oneDNN's s8 path stays exact (see above). */
#define EXACT_K ((1 << 24) / (255 * 128))

static bool has_vnni(void) {
#if KILN__DNNL && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

/* Elements spanned by a [batch, rows, cols] view with leading dimension
 * ld and batch stride `stride` (the load checked that they lie in the
 * slot). */
static uint64_t extent(int64_t batch, int64_t rows, int64_t cols, int64_t ld, int64_t stride) {
  return (uint64_t)((batch - 1) * stride + (rows - 1) * ld + cols);
}

/* An s8 A past EXACT_K: A + 128 as u8 through oneDNN, then C -= 128 *
 * colsum(B) in u32 (wrapping as s32 does). False, with C not written
 * when oneDNN refuses, or out of memory (the loop runs it then). */
static bool run_shifted(const kiln_gemm *g, const void *a, const void *b, void *c) {
  uint64_t na =
      extent(g->batch, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda, g->stride_a);
  uint8_t *ua = kiln_malloc(na);
  uint32_t *sums = kiln_malloc((size_t)(g->batch * g->n) * sizeof *sums);
  bool ok = ua && sums;
  if (ok) {
    const uint8_t *sa = a;
    for (uint64_t i = 0; i < na; i++) ua[i] = sa[i] ^ 0x80;
    ok = kiln__dnnl_matmul_run(g, KILN_U8, KILN_S8, KILN_S32, ua, b, c);
  }
  for (int64_t bt = 0; ok && bt < g->batch; bt++) {
    const int8_t *bb = (const int8_t *)b + bt * g->stride_b;
    uint32_t *s = sums + bt * g->n;
    for (int64_t j = 0; j < g->n; j++) s[j] = 0;
    for (int64_t k = 0; k < g->k; k++)
      for (int64_t j = 0; j < g->n; j++)
        s[j] += (uint32_t)(int32_t)bb[g->trans_b ? j * g->ldb + k : k * g->ldb + j];
    for (int64_t i = 0; i < g->m; i++) {
      uint32_t *row = (uint32_t *)c + bt * g->stride_c + i * g->ldc;
      for (int64_t j = 0; j < g->n; j++) row[j] -= 128u * s[j];
    }
  }
  kiln_free(ua);
  kiln_free(sums);
  return ok;
}

static bool shifts(const kiln_gemm *g) { return g->dtype == KILN_S8 && g->k > EXACT_K; }

bool kiln__cpu_igemm_uses_library(const kiln_gemm *g) {
  return has_vnni() &&
         kiln__dnnl_matmul_takes(g, shifts(g) ? KILN_U8 : g->dtype, KILN_S8, KILN_S32);
}

bool kiln__cpu_igemm_shifts(const kiln_gemm *g) {
  return kiln__cpu_igemm_uses_library(g) && shifts(g);
}

void kiln__cpu_igemm(kiln__cpu_pool *pool, const kiln_gemm *g, const void *a, const void *b,
                     void *c) {
  if (g->batch == 0 || g->m == 0 || g->n == 0) return;
  if (g->k == 0) { /* oneDNN takes no empty K: C is zeros */
    for (int64_t bt = 0; bt < g->batch; bt++)
      for (int64_t i = 0; i < g->m; i++)
        memset((int32_t *)c + bt * g->stride_c + i * g->ldc, 0, (size_t)g->n * sizeof(int32_t));
    return;
  }
  if (has_vnni()) {
    if (shifts(g) ? run_shifted(g, a, b, c)
                  : kiln__dnnl_matmul_run(g, g->dtype, KILN_S8, KILN_S32, a, b, c))
      return;
  }
  run_loop(pool, g, a, b, c);
}
