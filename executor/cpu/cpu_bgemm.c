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
 * Operands are described to oneDNN as they lie (cpu_igemm.c's scheme:
 * [batch, rows, cols] with the step's strides, transposes as swapped
 * strides); one primitive per distinct step, made at its first run and
 * kept for the process. oneDNN threads the product itself; an epilogue
 * then runs over all of C, split over the pool.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "executor/cpu/cpu.h"

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

#if defined(__SANITIZE_ADDRESS__)
#define KILN__ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN__ASAN 1
#endif
#endif
#ifndef KILN__ASAN
#define KILN__ASAN 0
#endif

#if defined(KILN_HAVE_DNNL) && !KILN__ASAN && (defined(__x86_64__) || defined(__i386__))
#include <dlfcn.h>
#include <pthread.h>

#include <dnnl.h>

/* clang-format off */
#define DNNL_FNS(X) \
  X(dnnl_engine_create) \
  X(dnnl_matmul_desc_init) \
  X(dnnl_memory_create) \
  X(dnnl_memory_desc_init_by_strides) \
  X(dnnl_memory_destroy) \
  X(dnnl_primitive_create) \
  X(dnnl_primitive_desc_create) \
  X(dnnl_primitive_desc_destroy) \
  X(dnnl_primitive_destroy) \
  X(dnnl_primitive_execute) \
  X(dnnl_stream_create) \
  X(dnnl_stream_destroy) \
  X(dnnl_stream_wait)
/* clang-format on */
#define DECLARE(f) static __typeof__(f) *p_##f;
DNNL_FNS(DECLARE)
#undef DECLARE

static dnnl_engine_t engine;
static bool usable; /* oneDNN opened, the engine made, the CPU has bf16 dot products */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void open_dnnl(void) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16")) return;
  if (getenv("OMP_WAIT_POLICY") == NULL) setenv("OMP_WAIT_POLICY", "passive", 0);
  void *h = dlopen(KILN_DNNL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return;
  bool ok = true;
#define RESOLVE(f) ok = ok && (*(void **)&p_##f = dlsym(h, #f)) != NULL;
  DNNL_FNS(RESOLVE)
#undef RESOLVE
  usable = ok && p_dnnl_engine_create(&engine, dnnl_cpu, 0) == dnnl_success;
}

/* The primitives made so far, one per distinct step; never freed (past
 * MAX_PLANS a step's is made and destroyed at each run). */
#define MAX_PLANS 256
typedef struct plan {
  kiln_gemm g;
  dnnl_memory_desc_t a, b, c;
  dnnl_primitive_t prim; /* NULL: oneDNN refused the shape (the fallback runs it) */
} plan;
static plan plans[MAX_PLANS];
static uint32_t nplans;
static pthread_mutex_t plans_mu = PTHREAD_MUTEX_INITIALIZER;

static bool same_gemm(const kiln_gemm *x, const kiln_gemm *y) {
  return x->batch == y->batch && x->m == y->m && x->n == y->n && x->k == y->k && x->lda == y->lda &&
         x->ldb == y->ldb && x->ldc == y->ldc && x->stride_a == y->stride_a &&
         x->stride_b == y->stride_b && x->stride_c == y->stride_c && x->trans_a == y->trans_a &&
         x->trans_b == y->trans_b;
}

static void make_plan(plan *p) {
  const kiln_gemm *g = &p->g;
  dnnl_dims_t ad = {g->batch, g->m, g->k}, bd = {g->batch, g->k, g->n};
  dnnl_dims_t cd = {g->batch, g->m, g->n};
  dnnl_dims_t as = {g->stride_a, g->trans_a ? 1 : g->lda, g->trans_a ? g->lda : 1};
  dnnl_dims_t bs = {g->stride_b, g->trans_b ? 1 : g->ldb, g->trans_b ? g->ldb : 1};
  dnnl_dims_t cs = {g->stride_c, g->ldc, 1};
  dnnl_matmul_desc_t md;
  dnnl_primitive_desc_t pd = NULL;
  p->prim = NULL;
  if (p_dnnl_memory_desc_init_by_strides(&p->a, 3, ad, dnnl_bf16, as) != dnnl_success ||
      p_dnnl_memory_desc_init_by_strides(&p->b, 3, bd, dnnl_bf16, bs) != dnnl_success ||
      p_dnnl_memory_desc_init_by_strides(&p->c, 3, cd, dnnl_f32, cs) != dnnl_success ||
      p_dnnl_matmul_desc_init(&md, &p->a, &p->b, NULL, &p->c) != dnnl_success ||
      p_dnnl_primitive_desc_create(&pd, &md, NULL, engine, NULL) != dnnl_success)
    return;
  if (p_dnnl_primitive_create(&p->prim, pd) != dnnl_success) p->prim = NULL;
  p_dnnl_primitive_desc_destroy(pd);
}

static const plan *find_plan(const kiln_gemm *g, plan *tmp) {
  const plan *found = NULL;
  pthread_mutex_lock(&plans_mu);
  for (uint32_t i = 0; i < nplans && !found; i++)
    if (same_gemm(&plans[i].g, g)) found = &plans[i];
  if (found == NULL && nplans < MAX_PLANS) {
    plan *p = &plans[nplans];
    p->g = *g;
    make_plan(p);
    nplans++;
    found = p;
  }
  pthread_mutex_unlock(&plans_mu);
  if (found) return found;
  tmp->g = *g;
  make_plan(tmp);
  return tmp;
}

static bool run_dnnl(const kiln_gemm *g, const void *a, const void *b, void *c) {
  pthread_once(&once, open_dnnl);
  if (!usable) return false;
  plan tmp;
  const plan *p = find_plan(g, &tmp);
  if (p->prim == NULL) return false;
  dnnl_memory_t mem[3] = {NULL, NULL, NULL};
  dnnl_stream_t s = NULL;
  bool ok = p_dnnl_memory_create(&mem[0], &p->a, engine, (void *)a) == dnnl_success &&
            p_dnnl_memory_create(&mem[1], &p->b, engine, (void *)b) == dnnl_success &&
            p_dnnl_memory_create(&mem[2], &p->c, engine, c) == dnnl_success &&
            p_dnnl_stream_create(&s, engine, dnnl_stream_default_flags) == dnnl_success;
  if (ok) {
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]}};
    ok = p_dnnl_primitive_execute(p->prim, s, 3, args) == dnnl_success &&
         p_dnnl_stream_wait(s) == dnnl_success;
  }
  if (s) p_dnnl_stream_destroy(s);
  for (int i = 0; i < 3; i++)
    if (mem[i]) p_dnnl_memory_destroy(mem[i]);
  if (p == &tmp) p_dnnl_primitive_destroy(tmp.prim);
  return ok;
}

bool kiln__cpu_bgemm_uses_library(const kiln_gemm *g) {
  pthread_once(&once, open_dnnl);
  if (!usable) return false;
  plan tmp;
  const plan *p = find_plan(g, &tmp);
  bool on = p->prim != NULL;
  if (p == &tmp && on) p_dnnl_primitive_destroy(tmp.prim);
  return on;
}

#else /* no oneDNN, a sanitizer build, or not x86 */

static bool run_dnnl(const kiln_gemm *g, const void *a, const void *b, void *c) {
  (void)g, (void)a, (void)b, (void)c;
  return false;
}

bool kiln__cpu_bgemm_uses_library(const kiln_gemm *g) {
  (void)g;
  return false;
}

#endif

/* The epilogue over all of C, split over the pool. */
typedef struct epi_job {
  const kiln__cpu_epilogue *epi;
  int64_t chunk, end;
} epi_job;

static void epi_chunk(void *ctx, uint64_t c) {
  const epi_job *j = ctx;
  int64_t b = (int64_t)c * j->chunk, e = j->end - b > j->chunk ? b + j->chunk : j->end;
  j->epi->fn(j->epi->bufs, b, e);
}

static void epi_all(kiln__cpu_pool *pool, const kiln_gemm *g, const kiln__cpu_epilogue *epi) {
  int64_t n = g->batch * g->m * g->n / epi->unit, threads = kiln__cpu_pool_threads(pool);
  epi_job j = {.epi = epi, .chunk = (n + threads - 1) / threads, .end = n};
  if (threads <= 1 || n < 2) {
    epi->fn(epi->bufs, 0, n);
    return;
  }
  kiln__cpu_pool_run(pool, epi_chunk, &j, (uint64_t)((n + j.chunk - 1) / j.chunk));
}

int kiln__cpu_bgemm(kiln__cpu_pool *pool, const kiln_gemm *g, const void *a, const void *b, void *c,
                    const kiln__cpu_epilogue *epi) {
  if (g->batch == 0 || g->m == 0 || g->n == 0) return 0;
  if (g->k > 0 && run_dnnl(g, a, b, c)) {
    if (epi) epi_all(pool, g, epi);
    return 0;
  }
  return run_widened(pool, g, a, b, c, epi) ? 0 : KILN_ENOMEM;
}
