/* The integer GEMM step on the cpu backend: C (s32) = A (s8 or u8) x B
 * (s8), the GEMM step with dtype S8 or U8 (compiler/codegen/executable.h),
 * as int8-quantized matmuls write it (jax lax.dot_general with
 * preferred_element_type=int32).
 *
 * The idea: oneDNN's int8 matmul runs it with s32 accumulation on VNNI
 * (vpdpbusd: four u8 x s8 products summed into an s32 lane per
 * instruction; an s8 A is shifted into u8 and compensated with B's column
 * sums), which is exact: every product and sum is an integer computed
 * modulo 2^32, so C is the s32 result bit for bit whatever K is, as XLA's
 * and the interpreter's wrapping sums are. Without VNNI oneDNN's int8
 * kernels add pairs of products in saturating 16-bit lanes
 * (vpmaddubsw), which is not exact: such CPUs, builds without oneDNN and
 * sanitizer builds (oneDNN is not instrumented, as cpu_conv.c says) run the
 * plain loop below, split over the pool by rows, which is exact too.
 *
 * Operands are described to oneDNN as they lie: [batch, rows, cols] with
 * the step's leading dimensions and batch strides, transposes as swapped
 * strides, so nothing is copied by Kiln. The primitive for a step's shape
 * is made at its first run and kept for the process (a small table keyed
 * by the kiln_gemm, under a mutex); every run makes its own stream and
 * memory objects, so runs may overlap. oneDNN is opened with dlopen as
 * cpu_conv.c opens it (its OpenMP runtime must see OMP_WAIT_POLICY first).
 */
#include <stdint.h>
#include <string.h>

#include "executor/cpu/cpu.h"

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
#include <stdlib.h>

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
static bool usable; /* oneDNN opened, the engine made, the CPU has VNNI */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void open_dnnl(void) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512vnni")) return;
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

/* The primitives made so far, one per distinct step shape; never freed
 * (a process compiles a bounded set of shapes; past MAX_PLANS a shape is
 * made and destroyed at each run). */
#define MAX_PLANS 256
typedef struct plan {
  kiln_gemm g;
  dnnl_memory_desc_t a, b, c;
  dnnl_primitive_t prim; /* NULL: oneDNN refused the shape (the loop runs it) */
} plan;
static plan plans[MAX_PLANS];
static uint32_t nplans;
static pthread_mutex_t plans_mu = PTHREAD_MUTEX_INITIALIZER;

static bool same_gemm(const kiln_gemm *x, const kiln_gemm *y) {
  return x->dtype == y->dtype && x->batch == y->batch && x->m == y->m && x->n == y->n &&
         x->k == y->k && x->lda == y->lda && x->ldb == y->ldb && x->ldc == y->ldc &&
         x->stride_a == y->stride_a && x->stride_b == y->stride_b && x->stride_c == y->stride_c &&
         x->trans_a == y->trans_a && x->trans_b == y->trans_b;
}

/* Makes p's descriptors and primitive from p->g; p->prim stays NULL when
 * oneDNN refuses. */
static void make_plan(plan *p) {
  const kiln_gemm *g = &p->g;
  dnnl_dims_t ad = {g->batch, g->m, g->k}, bd = {g->batch, g->k, g->n};
  dnnl_dims_t cd = {g->batch, g->m, g->n};
  dnnl_dims_t as = {g->stride_a, g->trans_a ? 1 : g->lda, g->trans_a ? g->lda : 1};
  dnnl_dims_t bs = {g->stride_b, g->trans_b ? 1 : g->ldb, g->trans_b ? g->ldb : 1};
  dnnl_dims_t cs = {g->stride_c, g->ldc, 1};
  dnnl_data_type_t at = g->dtype == KILN_S8 ? dnnl_s8 : dnnl_u8;
  dnnl_matmul_desc_t md;
  dnnl_primitive_desc_t pd = NULL;
  p->prim = NULL;
  if (p_dnnl_memory_desc_init_by_strides(&p->a, 3, ad, at, as) != dnnl_success ||
      p_dnnl_memory_desc_init_by_strides(&p->b, 3, bd, dnnl_s8, bs) != dnnl_success ||
      p_dnnl_memory_desc_init_by_strides(&p->c, 3, cd, dnnl_s32, cs) != dnnl_success ||
      p_dnnl_matmul_desc_init(&md, &p->a, &p->b, NULL, &p->c) != dnnl_success ||
      p_dnnl_primitive_desc_create(&pd, &md, NULL, engine, NULL) != dnnl_success)
    return;
  if (p_dnnl_primitive_create(&p->prim, pd) != dnnl_success) p->prim = NULL;
  p_dnnl_primitive_desc_destroy(pd);
}

/* The plan of g: a cached one, or *tmp made now (its primitive the
 * caller's to destroy) when the table is full. */
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

bool kiln__cpu_igemm_uses_library(const kiln_gemm *g) {
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

bool kiln__cpu_igemm_uses_library(const kiln_gemm *g) {
  (void)g;
  return false;
}

#endif

void kiln__cpu_igemm(kiln__cpu_pool *pool, const kiln_gemm *g, const void *a, const void *b,
                     void *c) {
  if (g->batch == 0 || g->m == 0 || g->n == 0) return;
  if (g->k == 0) { /* oneDNN takes no empty K: C is zeros */
    for (int64_t bt = 0; bt < g->batch; bt++)
      for (int64_t i = 0; i < g->m; i++)
        memset((int32_t *)c + bt * g->stride_c + i * g->ldc, 0, (size_t)g->n * sizeof(int32_t));
    return;
  }
  if (!run_dnnl(g, a, b, c)) run_loop(pool, g, a, b, c);
}
