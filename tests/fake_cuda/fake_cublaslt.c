/* A fake cuBLASLt (libcublasLt.so.13) for test_cuda_fake, opened by the
 * cuda backend through KILN_CUBLASLT_LIB beside the fake driver: the entry
 * points executor/cuda/cuda_blas.c calls, with a reference GEMM on the
 * host memory that stands for device memory.
 *
 * It is strict where the real library is, so that a backend that passes
 * here describes its GEMMs as cuBLASLt needs them: descriptors and layouts
 * must be live (created, not destroyed) and every attribute set with its
 * exact size; a column-major layout's leading dimension must be at least
 * its rows; the layouts of A, B and C must agree with the transposes on
 * m, n and k and have the same batch count; the element, scale and compute
 * types must be a combination cuBLASLt runs (f32 in f32 or TF32, bf16 into
 * f32, f64); D in place of C must have C's layout; the algorithm must come
 * from the heuristic for this same problem, and the pointers must have the
 * alignment its preference promised; the workspace must be as large as the
 * algorithm asked and every operand's extent must lie inside a live
 * allocation of the fake driver; a context must be current. A rejected
 * call returns the status cuBLASLt would (CUBLAS_STATUS_INVALID_VALUE or
 * NOT_SUPPORTED) and counts in the stats, with the reason kept
 * (kiln_fake_cublaslt_why).
 *
 * The reference computes D = alpha op(A) op(B) + beta C column-major as
 * cuBLASLt defines it, in double, the operands of a TF32 compute type
 * first rounded to TF32 (10 mantissa bits, to nearest even) as tensor
 * cores read them; C is not read when beta is 0. Calls can be made to fail
 * (kiln_fake_cublaslt_fail).
 */
#include <cublasLt.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC_HANDLE 0x4b4c4831u
#define MAGIC_DESC 0x4b4c4432u
#define MAGIC_LAYOUT 0x4b4c4c33u
#define MAGIC_PREF 0x4b4c5034u
#define MAGIC_ALGO 0x4b4c4135u
#define DEAD 0xdeadu

typedef struct fake_blas_stats {
  long handles, descs, layouts, prefs; /* live */
  long heuristics, matmuls, tf32_matmuls, batched_matmuls, rejects;
  uint64_t max_workspace; /* the most workspace an algorithm asked for */
} fake_blas_stats;

struct cublasLtContext {
  uint32_t magic;
};

typedef struct fdesc {
  uint32_t magic;
  int32_t compute, scale;
  int32_t ta, tb, pointer_mode;
} fdesc;

typedef struct flayout {
  uint32_t magic;
  int32_t type, order, batch;
  uint64_t rows, cols;
  int64_t ld, stride;
} flayout;

typedef struct fpref {
  uint32_t magic;
  uint32_t align[4]; /* A, B, C, D */
  uint64_t max_ws;
} fpref;

/* What the heuristic chose the algorithm for, checked again at the matmul. */
typedef struct falgo {
  uint32_t magic;
  int32_t compute, ta, tb, type_a, type_c;
  uint32_t align[4];
  int32_t batch;
  uint32_t m, n, k; /* layouts' rows and columns are int32 */
  uint64_t ws;
} falgo;

_Static_assert(sizeof(fdesc) <= sizeof(cublasLtMatmulDescOpaque_t), "desc");
_Static_assert(sizeof(flayout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout");
_Static_assert(sizeof(fpref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "pref");
_Static_assert(sizeof(falgo) <= sizeof(cublasLtMatmulAlgo_t), "algo");

static struct {
  pthread_mutex_t mu;
  fake_blas_stats s;
  char why[256];
  char fail_call[64];
  long fail_after;
  cublasStatus_t fail_with;
  bool (*inside)(uint64_t, size_t);
  long (*ctx_depth)(void);
} fb = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---- the test's side ------------------------------------------------------- */

void kiln_fake_cublaslt_stats(fake_blas_stats *out) {
  pthread_mutex_lock(&fb.mu);
  *out = fb.s;
  pthread_mutex_unlock(&fb.mu);
}

/* Why the last call was rejected ("" when none was). */
void kiln_fake_cublaslt_why(char *out, size_t n) {
  pthread_mutex_lock(&fb.mu);
  snprintf(out, n, "%s", fb.why);
  pthread_mutex_unlock(&fb.mu);
}

/* Call `name` returns r after `after` more successful calls. */
void kiln_fake_cublaslt_fail(const char *name, long after, int r) {
  pthread_mutex_lock(&fb.mu);
  snprintf(fb.fail_call, sizeof fb.fail_call, "%s", name ? name : "");
  fb.fail_after = after;
  fb.fail_with = (cublasStatus_t)r;
  pthread_mutex_unlock(&fb.mu);
}

static bool failing(const char *name) {
  pthread_mutex_lock(&fb.mu);
  bool f = false;
  if (fb.fail_call[0] && strcmp(fb.fail_call, name) == 0) f = fb.fail_after-- <= 0;
  pthread_mutex_unlock(&fb.mu);
  return f;
}
#define FAIL(name) \
  do { \
    if (failing(name)) return fb.fail_with; \
  } while (0)

static cublasStatus_t reject(cublasStatus_t r, const char *fmt, ...) {
  pthread_mutex_lock(&fb.mu);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(fb.why, sizeof fb.why, fmt, ap);
  va_end(ap);
  fb.s.rejects++;
  pthread_mutex_unlock(&fb.mu);
  return r;
}

static void count(long *c, long by) {
  pthread_mutex_lock(&fb.mu);
  *c += by;
  pthread_mutex_unlock(&fb.mu);
}

/* The fake driver's address check, from the file KILN_CUDA_DRIVER names
 * (already open in this process). */
static bool driver(void) {
  if (fb.inside && fb.ctx_depth) return true;
  const char *f = getenv("KILN_CUDA_DRIVER");
  void *h = f ? dlopen(f, RTLD_NOW | RTLD_NOLOAD) : NULL;
  if (h == NULL) return false;
  void *p = dlsym(h, "kiln_fake_cuda_inside"), *q = dlsym(h, "kiln_fake_cuda_ctx_depth");
  memcpy(&fb.inside, &p, sizeof p);
  memcpy(&fb.ctx_depth, &q, sizeof q);
  return fb.inside && fb.ctx_depth;
}

/* ---- the library ---------------------------------------------------------- */

size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }
size_t cublasLtGetCudartVersion(void) { return 13000; }

const char *cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

const char *cublasLtGetStatusString(cublasStatus_t s) {
  (void)s;
  return "fake cuBLASLt error";
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  FAIL("cublasLtCreate");
  if (h == NULL) return reject(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: NULL handle");
  if (!driver() || fb.ctx_depth() <= 0)
    return reject(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtCreate: no current context");
  struct cublasLtContext *c = calloc(1, sizeof *c);
  if (c == NULL) return CUBLAS_STATUS_ALLOC_FAILED;
  c->magic = MAGIC_HANDLE;
  count(&fb.s.handles, 1);
  *h = c;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (h == NULL || h->magic != MAGIC_HANDLE)
    return reject(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: not a live handle");
  h->magic = DEAD;
  free(h);
  count(&fb.s.handles, -1);
  return CUBLAS_STATUS_SUCCESS;
}

/* -- descriptors -- */

static bool compute_ok(int32_t c) {
  return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_FAST_TF32 || c == CUBLAS_COMPUTE_64F;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  FAIL("cublasLtMatmulDescCreate");
  if (d == NULL) return reject(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: NULL");
  if (!compute_ok((int32_t)compute))
    return reject(CUBLAS_STATUS_NOT_SUPPORTED, "compute type %d", (int)compute);
  cublasLtMatmulDescOpaque_t *o = calloc(1, sizeof *o);
  if (o == NULL) return CUBLAS_STATUS_ALLOC_FAILED;
  fdesc *f = (fdesc *)o;
  *f = (fdesc){.magic = MAGIC_DESC, .compute = compute, .scale = scale};
  count(&fb.s.descs, 1);
  *d = o;
  return CUBLAS_STATUS_SUCCESS;
}

static fdesc *live_desc(cublasLtMatmulDesc_t d) {
  fdesc *f = (fdesc *)d;
  return f && f->magic == MAGIC_DESC ? f : NULL;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  fdesc *f = live_desc(d);
  if (f == NULL) return reject(CUBLAS_STATUS_INVALID_VALUE, "desc destroy: not a live descriptor");
  f->magic = DEAD;
  free(d);
  count(&fb.s.descs, -1);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t n) {
  FAIL("cublasLtMatmulDescSetAttribute");
  fdesc *f = live_desc(d);
  if (f == NULL || buf == NULL)
    return reject(CUBLAS_STATUS_INVALID_VALUE, "desc set: not a live descriptor");
  int32_t v;
  if (n != sizeof v)
    return reject(CUBLAS_STATUS_INVALID_VALUE, "desc attribute %d: %zu bytes", (int)a, n);
  memcpy(&v, buf, sizeof v);
  switch (a) {
  case CUBLASLT_MATMUL_DESC_TRANSA:
  case CUBLASLT_MATMUL_DESC_TRANSB:
    if (v != CUBLAS_OP_N && v != CUBLAS_OP_T)
      return reject(CUBLAS_STATUS_INVALID_VALUE, "transpose %d (N or T for real types)", v);
    *(a == CUBLASLT_MATMUL_DESC_TRANSA ? &f->ta : &f->tb) = v;
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_POINTER_MODE:
    if (v != CUBLASLT_POINTER_MODE_HOST)
      return reject(CUBLAS_STATUS_NOT_SUPPORTED, "the fake takes alpha and beta on the host");
    f->pointer_mode = v;
    return CUBLAS_STATUS_SUCCESS;
  default: return reject(CUBLAS_STATUS_INVALID_VALUE, "desc attribute %d not in the fake", (int)a);
  }
}

/* -- layouts -- */

static bool type_ok(int32_t t) { return t == CUDA_R_32F || t == CUDA_R_64F || t == CUDA_R_16BF; }

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  FAIL("cublasLtMatrixLayoutCreate");
  if (l == NULL) return reject(CUBLAS_STATUS_INVALID_VALUE, "layout create: NULL");
  if (!type_ok((int32_t)type)) return reject(CUBLAS_STATUS_NOT_SUPPORTED, "type %d", (int)type);
  if (rows > INT32_MAX || cols > INT32_MAX || ld < 0 || (rows > 0 && (uint64_t)ld < rows))
    return reject(CUBLAS_STATUS_INVALID_VALUE, "layout %llu x %llu with ld %lld",
                  (unsigned long long)rows, (unsigned long long)cols, (long long)ld);
  cublasLtMatrixLayoutOpaque_t *o = calloc(1, sizeof *o);
  if (o == NULL) return CUBLAS_STATUS_ALLOC_FAILED;
  flayout *f = (flayout *)o;
  *f = (flayout){.magic = MAGIC_LAYOUT,
                 .type = type,
                 .order = CUBLASLT_ORDER_COL,
                 .batch = 1,
                 .rows = rows,
                 .cols = cols,
                 .ld = ld};
  count(&fb.s.layouts, 1);
  *l = o;
  return CUBLAS_STATUS_SUCCESS;
}

static flayout *live_layout(cublasLtMatrixLayout_t l) {
  flayout *f = (flayout *)l;
  return f && f->magic == MAGIC_LAYOUT ? f : NULL;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  flayout *f = live_layout(l);
  if (f == NULL) return reject(CUBLAS_STATUS_INVALID_VALUE, "layout destroy: not a live layout");
  f->magic = DEAD;
  free(l);
  count(&fb.s.layouts, -1);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t a, const void *buf,
                                                size_t n) {
  FAIL("cublasLtMatrixLayoutSetAttribute");
  flayout *f = live_layout(l);
  if (f == NULL || buf == NULL)
    return reject(CUBLAS_STATUS_INVALID_VALUE, "layout set: not a live layout");
  switch (a) {
  case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: {
    int32_t v;
    if (n != sizeof v) return reject(CUBLAS_STATUS_INVALID_VALUE, "batch count: %zu bytes", n);
    memcpy(&v, buf, sizeof v);
    if (v < 1) return reject(CUBLAS_STATUS_INVALID_VALUE, "batch count %d", v);
    f->batch = v;
    return CUBLAS_STATUS_SUCCESS;
  }
  case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: {
    int64_t v;
    if (n != sizeof v) return reject(CUBLAS_STATUS_INVALID_VALUE, "batch stride: %zu bytes", n);
    memcpy(&v, buf, sizeof v);
    if (v < 0) return reject(CUBLAS_STATUS_INVALID_VALUE, "batch stride %lld", (long long)v);
    f->stride = v;
    return CUBLAS_STATUS_SUCCESS;
  }
  default:
    return reject(CUBLAS_STATUS_INVALID_VALUE, "layout attribute %d not in the fake", (int)a);
  }
}

/* -- preferences -- */

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  FAIL("cublasLtMatmulPreferenceCreate");
  if (p == NULL) return reject(CUBLAS_STATUS_INVALID_VALUE, "preference create: NULL");
  cublasLtMatmulPreferenceOpaque_t *o = calloc(1, sizeof *o);
  if (o == NULL) return CUBLAS_STATUS_ALLOC_FAILED;
  fpref *f = (fpref *)o;
  *f = (fpref){.magic = MAGIC_PREF, .align = {256, 256, 256, 256}};
  count(&fb.s.prefs, 1);
  *p = o;
  return CUBLAS_STATUS_SUCCESS;
}

static fpref *live_pref(cublasLtMatmulPreference_t p) {
  fpref *f = (fpref *)p;
  return f && f->magic == MAGIC_PREF ? f : NULL;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  fpref *f = live_pref(p);
  if (f == NULL) return reject(CUBLAS_STATUS_INVALID_VALUE, "preference destroy: not live");
  f->magic = DEAD;
  free(p);
  count(&fb.s.prefs, -1);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *buf, size_t n) {
  FAIL("cublasLtMatmulPreferenceSetAttribute");
  fpref *f = live_pref(p);
  if (f == NULL || buf == NULL)
    return reject(CUBLAS_STATUS_INVALID_VALUE, "preference set: not live");
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    if (n != sizeof f->max_ws) return reject(CUBLAS_STATUS_INVALID_VALUE, "workspace: %zu", n);
    memcpy(&f->max_ws, buf, sizeof f->max_ws);
    return CUBLAS_STATUS_SUCCESS;
  }
  int k = a == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES   ? 0
          : a == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ? 1
          : a == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES ? 2
          : a == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES ? 3
                                                            : -1;
  if (k < 0) return reject(CUBLAS_STATUS_INVALID_VALUE, "preference %d not in the fake", (int)a);
  uint32_t v;
  if (n != sizeof v) return reject(CUBLAS_STATUS_INVALID_VALUE, "alignment: %zu bytes", n);
  memcpy(&v, buf, sizeof v);
  if (v == 0 || (v & (v - 1)))
    return reject(CUBLAS_STATUS_INVALID_VALUE, "alignment %u: not a power of two", v);
  f->align[k] = v;
  return CUBLAS_STATUS_SUCCESS;
}

/* -- the problem -- */

static size_t type_size(int32_t t) { return t == CUDA_R_64F ? 8 : t == CUDA_R_16BF ? 2 : 4; }

/* The types and shapes of one matmul; st and why say what is wrong. */
typedef struct problem {
  const fdesc *d;
  const flayout *a, *b, *c, *dd;
  uint64_t m, n, k;
} problem;

static cublasStatus_t describe(problem *p, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                               cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                               cublasLtMatrixLayout_t d) {
  p->d = live_desc(desc);
  p->a = live_layout(a);
  p->b = live_layout(b);
  p->c = live_layout(c);
  p->dd = live_layout(d);
  if (!p->d || !p->a || !p->b || !p->c || !p->dd)
    return reject(CUBLAS_STATUS_INVALID_VALUE, "a descriptor or layout is not live");
  const fdesc *f = p->d;
  int32_t ta = p->a->type, tb = p->b->type, tc = p->c->type;
  bool types = ta == tb && tc == p->dd->type;
  if (f->compute == CUBLAS_COMPUTE_64F)
    types = types && ta == CUDA_R_64F && tc == CUDA_R_64F && f->scale == CUDA_R_64F;
  else if (f->compute == CUBLAS_COMPUTE_32F_FAST_TF32)
    types = types && ta == CUDA_R_32F && tc == CUDA_R_32F && f->scale == CUDA_R_32F;
  else
    types = types && (ta == CUDA_R_32F || ta == CUDA_R_16BF) && tc == CUDA_R_32F &&
            f->scale == CUDA_R_32F;
  if (!types)
    return reject(CUBLAS_STATUS_NOT_SUPPORTED, "types A %d B %d C %d D %d, scale %d, compute %d",
                  ta, tb, tc, p->dd->type, f->scale, f->compute);
  p->m = p->c->rows;
  p->n = p->c->cols;
  uint64_t am = f->ta == CUBLAS_OP_N ? p->a->rows : p->a->cols;
  p->k = f->ta == CUBLAS_OP_N ? p->a->cols : p->a->rows;
  uint64_t bk = f->tb == CUBLAS_OP_N ? p->b->rows : p->b->cols;
  uint64_t bn = f->tb == CUBLAS_OP_N ? p->b->cols : p->b->rows;
  if (am != p->m || bk != p->k || bn != p->n)
    return reject(CUBLAS_STATUS_INVALID_VALUE,
                  "shapes: op(A) %llu x %llu, op(B) %llu x %llu, C %llu x %llu",
                  (unsigned long long)am, (unsigned long long)p->k, (unsigned long long)bk,
                  (unsigned long long)bn, (unsigned long long)p->m, (unsigned long long)p->n);
  if (p->a->batch != p->c->batch || p->b->batch != p->c->batch || p->dd->batch != p->c->batch)
    return reject(CUBLAS_STATUS_INVALID_VALUE, "batch counts %d, %d, %d, %d", p->a->batch,
                  p->b->batch, p->c->batch, p->dd->batch);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *res, int *found) {
  FAIL("cublasLtMatmulAlgoGetHeuristic");
  if (h == NULL || h->magic != MAGIC_HANDLE)
    return reject(CUBLAS_STATUS_NOT_INITIALIZED, "heuristic: not a live handle");
  const fpref *pf = live_pref(pref);
  if (pf == NULL || requested < 1 || res == NULL || found == NULL)
    return reject(CUBLAS_STATUS_INVALID_VALUE, "heuristic: preference or results");
  problem p;
  cublasStatus_t r = describe(&p, desc, a, b, c, d);
  if (r != CUBLAS_STATUS_SUCCESS) return r;
  count(&fb.s.heuristics, 1);
  memset(res, 0, sizeof *res);
  /* A split-k algorithm for a long contraction asks for workspace (up to
   * what the preference allows), so that the backend's is exercised. */
  uint64_t ws = p.k >= 64 ? 4096 + p.m * p.n * 4 : 0;
  if (ws > pf->max_ws) ws = pf->max_ws;
  falgo *al = (falgo *)&res->algo;
  *al = (falgo){.magic = MAGIC_ALGO,
                .compute = p.d->compute,
                .ta = p.d->ta,
                .tb = p.d->tb,
                .type_a = p.a->type,
                .type_c = p.c->type,
                .batch = p.c->batch,
                .m = (uint32_t)p.m,
                .n = (uint32_t)p.n,
                .k = (uint32_t)p.k,
                .ws = ws};
  memcpy(al->align, pf->align, sizeof al->align);
  res->workspaceSize = ws;
  res->state = CUBLAS_STATUS_SUCCESS;
  res->wavesCount = 1.0f;
  *found = 1;
  pthread_mutex_lock(&fb.mu);
  if (ws > fb.s.max_workspace) fb.s.max_workspace = ws;
  pthread_mutex_unlock(&fb.mu);
  return CUBLAS_STATUS_SUCCESS;
}

/* -- the reference -- */

static float tf32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) { /* finite: round the low 13 bits to nearest even */
    u += 0x0fffu + ((u >> 13) & 1u);
    u &= ~0x1fffu;
  }
  memcpy(&x, &u, 4);
  return x;
}

static double load(const char *base, int32_t type, int64_t i, bool round_tf32) {
  if (type == CUDA_R_64F) {
    double v;
    memcpy(&v, base + i * 8, 8);
    return v;
  }
  float f;
  if (type == CUDA_R_16BF) {
    uint16_t h;
    memcpy(&h, base + i * 2, 2);
    uint32_t u = (uint32_t)h << 16;
    memcpy(&f, &u, 4);
  } else {
    memcpy(&f, base + i * 4, 4);
  }
  return round_tf32 ? tf32(f) : f;
}

static void store(char *base, int32_t type, int64_t i, double v) {
  if (type == CUDA_R_64F) {
    memcpy(base + i * 8, &v, 8);
  } else {
    float f = (float)v;
    memcpy(base + i * 4, &f, 4);
  }
}

/* The bytes a layout's matrices span from their base. */
static uint64_t extent(const flayout *l) {
  if (l->rows == 0 || l->cols == 0) return 0;
  uint64_t last =
      (uint64_t)(l->batch - 1) * (uint64_t)l->stride + (l->cols - 1) * (uint64_t)l->ld + l->rows;
  return last * type_size(l->type);
}

static bool aligned(const void *p, uint32_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t wsbytes,
                              cudaStream_t stream) {
  (void)stream;
  FAIL("cublasLtMatmul");
  if (h == NULL || h->magic != MAGIC_HANDLE)
    return reject(CUBLAS_STATUS_NOT_INITIALIZED, "matmul: not a live handle");
  if (!driver() || fb.ctx_depth() <= 0)
    return reject(CUBLAS_STATUS_NOT_INITIALIZED, "matmul: no current context");
  problem p;
  cublasStatus_t r = describe(&p, desc, Adesc, Bdesc, Cdesc, Ddesc);
  if (r != CUBLAS_STATUS_SUCCESS) return r;
  const falgo *al = (const falgo *)algo;
  if (al == NULL || al->magic != MAGIC_ALGO || al->compute != p.d->compute || al->ta != p.d->ta ||
      al->tb != p.d->tb || al->type_a != p.a->type || al->type_c != p.c->type ||
      al->batch != p.c->batch || al->m != p.m || al->n != p.n || al->k != p.k)
    return reject(CUBLAS_STATUS_INVALID_VALUE, "matmul: the algorithm is not this problem's");
  if (alpha == NULL || beta == NULL || A == NULL || B == NULL || C == NULL || D == NULL)
    return reject(CUBLAS_STATUS_INVALID_VALUE, "matmul: a NULL pointer");
  if (C == D && memcmp(p.c, p.dd, sizeof *p.c) != 0)
    return reject(CUBLAS_STATUS_INVALID_VALUE, "matmul in place with D's layout not C's");
  const void *ptr[4] = {A, B, C, D};
  const flayout *lay[4] = {p.a, p.b, p.c, p.dd};
  for (int i = 0; i < 4; i++) {
    uint32_t need = al->align[i], es = (uint32_t)type_size(lay[i]->type);
    if (need < es) need = es;
    uint64_t step = lay[i]->batch > 1 ? (uint64_t)lay[i]->stride * es : 0;
    if (!aligned(ptr[i], need) || (step & (need - 1)))
      return reject(CUBLAS_STATUS_INVALID_VALUE,
                    "matmul: operand %d at %p (batch stride %llu bytes) is not %u-byte aligned "
                    "as its algorithm was chosen for",
                    i, ptr[i], (unsigned long long)step, need);
    uint64_t n = extent(lay[i]);
    if (n && !fb.inside((uint64_t)(uintptr_t)ptr[i], n))
      return reject(CUBLAS_STATUS_EXECUTION_FAILED, "matmul: operand %d's %llu bytes at %p", i,
                    (unsigned long long)n, ptr[i]);
  }
  if (wsbytes < al->ws ||
      (al->ws && (workspace == NULL || !fb.inside((uint64_t)(uintptr_t)workspace, al->ws))))
    return reject(CUBLAS_STATUS_INVALID_VALUE, "matmul: workspace of %zu bytes, %llu needed",
                  wsbytes, (unsigned long long)al->ws);
  double a, b;
  if (p.d->scale == CUDA_R_64F) {
    memcpy(&a, alpha, 8);
    memcpy(&b, beta, 8);
  } else {
    float fa, fbeta;
    memcpy(&fa, alpha, 4);
    memcpy(&fbeta, beta, 4);
    a = fa;
    b = fbeta;
  }
  bool round = p.d->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const char *pa = A, *pb = B, *pc = C;
  char *pd = D;
  int64_t ar = p.d->ta == CUBLAS_OP_N ? 1 : p.a->ld, ak = p.d->ta == CUBLAS_OP_N ? p.a->ld : 1;
  int64_t bk = p.d->tb == CUBLAS_OP_N ? 1 : p.b->ld, bc = p.d->tb == CUBLAS_OP_N ? p.b->ld : 1;
  /* op(A) rows and op(B) columns gathered into contiguous doubles once per
   * batch: the products are then plain dot products (the suite also runs
   * unoptimized under ASan). */
  size_t mk = (size_t)p.m * p.k, nk = (size_t)p.n * p.k;
  double *ra = malloc((mk ? mk : 1) * sizeof *ra), *cb = malloc((nk ? nk : 1) * sizeof *cb);
  if (ra == NULL || cb == NULL) {
    free(ra);
    free(cb);
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  for (int64_t t = 0; t < p.c->batch; t++) {
    for (uint64_t i = 0; i < p.m; i++)
      for (uint64_t q = 0; q < p.k; q++)
        ra[i * p.k + q] =
            load(pa, p.a->type, t * p.a->stride + (int64_t)i * ar + (int64_t)q * ak, round);
    for (uint64_t j = 0; j < p.n; j++)
      for (uint64_t q = 0; q < p.k; q++)
        cb[j * p.k + q] =
            load(pb, p.b->type, t * p.b->stride + (int64_t)j * bc + (int64_t)q * bk, round);
    for (uint64_t j = 0; j < p.n; j++)
      for (uint64_t i = 0; i < p.m; i++) {
        const double *x = ra + i * p.k, *y = cb + j * p.k;
        double acc = 0;
        for (uint64_t q = 0; q < p.k; q++) acc += x[q] * y[q];
        double v = a * acc;
        if (b != 0)
          v += b * load(pc, p.c->type, t * p.c->stride + (int64_t)(i + j * p.c->ld), false);
        store(pd, p.dd->type, t * p.dd->stride + (int64_t)(i + j * p.dd->ld), v);
      }
  }
  free(ra);
  free(cb);
  pthread_mutex_lock(&fb.mu);
  fb.s.matmuls++;
  if (round) fb.s.tf32_matmuls++;
  if (p.c->batch > 1) fb.s.batched_matmuls++;
  pthread_mutex_unlock(&fb.mu);
  return CUBLAS_STATUS_SUCCESS;
}
