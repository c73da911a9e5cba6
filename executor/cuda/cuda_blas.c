/* GEMM steps through cuBLASLt (cuda_blas.h).
 *
 * The library is opened once per process, when the first executable with a
 * GEMM step loads: a machine without it runs every other program. Its
 * entry points are one X-macro table, each typed by the toolkit header's
 * own prototype. The library's major version must be the one the tree was
 * built against (cuBLAS keeps its ABI within a major).
 *
 * Row-major to column-major: a row-major r x c matrix with leading
 * dimension ld is, read column-major, the c x r matrix of its transpose
 * with the same ld. So C (m x n, row-major) = op(A) op(B) becomes
 * C^T (n x m, column-major) = op(B)^T op(A)^T: cuBLASLt's "A" is our B,
 * its "B" our A, each with its own transpose flag, and its m, n, k are our
 * n, m, k. Batches are strided (CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
 * in elements); C is read (beta) and written in place (D = C, one layout).
 */
#include "executor/cuda/cuda_blas.h"

#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

/* X(field, symbol) */
#define KILN__CUBLAS_API(X) \
  X(create, cublasLtCreate) \
  X(destroy, cublasLtDestroy) \
  X(get_version, cublasLtGetVersion) \
  X(status_name, cublasLtGetStatusName) \
  X(status_string, cublasLtGetStatusString) \
  X(desc_create, cublasLtMatmulDescCreate) \
  X(desc_destroy, cublasLtMatmulDescDestroy) \
  X(desc_set, cublasLtMatmulDescSetAttribute) \
  X(layout_create, cublasLtMatrixLayoutCreate) \
  X(layout_destroy, cublasLtMatrixLayoutDestroy) \
  X(layout_set, cublasLtMatrixLayoutSetAttribute) \
  X(pref_create, cublasLtMatmulPreferenceCreate) \
  X(pref_destroy, cublasLtMatmulPreferenceDestroy) \
  X(pref_set, cublasLtMatmulPreferenceSetAttribute) \
  X(heuristic, cublasLtMatmulAlgoGetHeuristic) \
  X(matmul, cublasLtMatmul)

typedef struct blas_api {
#define KILN__CUBLAS_FIELD(field, sym) __typeof__(sym) *field;
  KILN__CUBLAS_API(KILN__CUBLAS_FIELD)
#undef KILN__CUBLAS_FIELD
} blas_api;

static struct {
  void *lib;
  char file[256];
  char why[600]; /* empty when the table is whole */
  blas_api api;
} lib;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

#define STR2(x) #x
#define STR(x) STR2(x)

static void lib_open(void) {
  const char *env = getenv("KILN_CUBLASLT_LIB");
  snprintf(lib.file, sizeof lib.file, "%.200s",
           env && env[0] ? env : "libcublasLt.so." STR(CUBLAS_VER_MAJOR));
  lib.lib = dlopen(lib.file, RTLD_NOW | RTLD_LOCAL);
  if (lib.lib == NULL) {
    const char *e = dlerror();
    snprintf(lib.why, sizeof lib.why, "cuBLASLt is not installed (%.400s)", e ? e : lib.file);
    return;
  }
#define KILN__CUBLAS_FETCH(field, sym) \
  do { \
    void *p_ = dlsym(lib.lib, #sym); \
    if (p_ == NULL && lib.why[0] == '\0') \
      snprintf(lib.why, sizeof lib.why, "%s has no %s", lib.file, #sym); \
    memcpy(&lib.api.field, &p_, sizeof p_); \
  } while (0);
  KILN__CUBLAS_API(KILN__CUBLAS_FETCH)
#undef KILN__CUBLAS_FETCH
  if (lib.why[0]) return;
  size_t v = lib.api.get_version();
  if (v / 10000 != CUBLAS_VER_MAJOR)
    snprintf(lib.why, sizeof lib.why, "%s is cuBLASLt %zu.%zu, this tree was built for %d.x",
             lib.file, v / 10000, v / 100 % 100, CUBLAS_VER_MAJOR);
}

struct kiln__cublas {
  cublasLtHandle_t h;
};

struct kiln__cublas_plan {
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C = D */
  cublasLtMatmulAlgo_t algo;
  uint64_t workspace;
  kiln_dtype dtype;
  uint8_t alpha[8], beta[8]; /* in the scale type */
  char what[96];
};

static int blas_code(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_ALLOC_FAILED: return KILN_ELIMIT;
  case CUBLAS_STATUS_NOT_INITIALIZED: return KILN_EUNAVAIL;
  case CUBLAS_STATUS_NOT_SUPPORTED:
  case CUBLAS_STATUS_ARCH_MISMATCH: return KILN_EUNIMPL;
  case CUBLAS_STATUS_INVALID_VALUE: return KILN_EINVAL;
  default: return KILN_EINTERNAL;
  }
}

/* 0, or st filled with "CALL failed: NAME: TEXT" naming the step. */
static int check(cublasStatus_t s, const char *call, const char *what, kiln_status *st) {
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  const char *name = lib.api.status_name ? lib.api.status_name(s) : NULL;
  const char *text = lib.api.status_string ? lib.api.status_string(s) : NULL;
  return kiln_status_set(st, blas_code(s), what, "%s failed: %s: %s", call,
                         name ? name : "CUBLAS_STATUS_?", text ? text : "no description");
}

bool kiln__cublas_compute_type(kiln_dtype dtype, bool tf32, int *compute, int *scale, int *ab,
                               int *c) {
  switch (dtype) {
  case KILN_F32:
    *compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    *scale = *ab = *c = CUDA_R_32F;
    return true;
  case KILN_F64:
    *compute = CUBLAS_COMPUTE_64F;
    *scale = *ab = *c = CUDA_R_64F;
    return true;
  case KILN_BF16:
    *compute = CUBLAS_COMPUTE_32F;
    *scale = *c = CUDA_R_32F;
    *ab = CUDA_R_16BF;
    return true;
  default: return false;
  }
}

bool kiln__cublas_tf32_from_env(void) {
  const char *s = getenv("KILN_CUDA_TF32");
  return s && strcmp(s, "1") == 0;
}

int kiln__cublas_create(const char *where, kiln__cublas **out, kiln_status *st) {
  *out = NULL;
  pthread_once(&lib_once, lib_open);
  if (lib.why[0])
    return kiln_status_set(st, KILN_EUNAVAIL, where,
                           "GEMM steps need cuBLASLt: %s (env KILN_CUBLASLT_LIB names the file)",
                           lib.why);
  kiln__cublas *h = kiln_calloc(1, sizeof *h);
  if (h == NULL) return kiln_status_set(st, KILN_ENOMEM, where, "out of memory");
  int rc = check(lib.api.create(&h->h), "cublasLtCreate", where, st);
  if (rc) {
    kiln_free(h);
    return rc;
  }
  *out = h;
  return 0;
}

void kiln__cublas_destroy(kiln__cublas *h) {
  if (h == NULL) return;
  lib.api.destroy(h->h);
  kiln_free(h);
}

void kiln__cublas_plan_destroy(kiln__cublas_plan *p) {
  if (p == NULL) return;
  if (p->lc) lib.api.layout_destroy(p->lc);
  if (p->lb) lib.api.layout_destroy(p->lb);
  if (p->la) lib.api.layout_destroy(p->la);
  if (p->desc) lib.api.desc_destroy(p->desc);
  kiln_free(p);
}

uint64_t kiln__cublas_plan_workspace(const kiln__cublas_plan *p) { return p->workspace; }

/* A column-major rows x cols layout with leading dimension ld, `batch`
 * matrices `stride` elements apart. */
static int layout(cublasLtMatrixLayout_t *l, int type, int64_t rows, int64_t cols, int64_t ld,
                  int64_t batch, int64_t stride, const char *what, kiln_status *st) {
  int rc = check(lib.api.layout_create(l, (cudaDataType)type, (uint64_t)rows, (uint64_t)cols, ld),
                 "cublasLtMatrixLayoutCreate", what, st);
  if (rc) {
    *l = NULL;
    return rc;
  }
  if (batch <= 1) return 0;
  int32_t n = (int32_t)batch;
  rc = check(lib.api.layout_set(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n),
             "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)", what, st);
  if (rc == 0)
    rc = check(
        lib.api.layout_set(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
        "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)", what, st);
  return rc;
}

/* The first algorithm the heuristic offers under the preference. */
static int pick_algo(kiln__cublas_plan *p, const uint32_t align[3], uint64_t workspace,
                     kiln_status *st) {
  cublasLtMatmulPreference_t pref = NULL;
  int rc = check(lib.api.pref_create(&pref), "cublasLtMatmulPreferenceCreate", p->what, st);
  if (rc) return rc;
  rc = check(lib.api.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                              sizeof workspace),
             "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", p->what, st);
  /* cuBLASLt's A is our B, its B our A; C and D are ours. */
  uint32_t al[4] = {align[1], align[0], align[2], align[2]};
  static const cublasLtMatmulPreferenceAttributes_t keys[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && rc == 0; i++)
    rc = check(lib.api.pref_set(pref, keys[i], &al[i], sizeof al[i]),
               "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)", p->what, st);
  cublasLtMatmulHeuristicResult_t res;
  memset(&res, 0, sizeof res);
  int found = 0;
  if (rc == 0)
    rc = check(lib.api.heuristic(p->h, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found),
               "cublasLtMatmulAlgoGetHeuristic", p->what, st);
  lib.api.pref_destroy(pref);
  if (rc) return rc;
  if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS)
    return kiln_status_set(st, KILN_EUNIMPL, p->what,
                           "cuBLASLt has no algorithm for this GEMM (alignment %u/%u/%u bytes, "
                           "workspace %llu bytes)",
                           align[0], align[1], align[2], (unsigned long long)workspace);
  if (res.workspaceSize > workspace)
    return kiln_status_set(st, KILN_EINTERNAL, p->what,
                           "cuBLASLt's algorithm needs %zu workspace bytes, %llu were offered",
                           res.workspaceSize, (unsigned long long)workspace);
  p->algo = res.algo;
  p->workspace = res.workspaceSize;
  return 0;
}

int kiln__cublas_plan_create(kiln__cublas *h, const kiln_gemm *g, bool tf32,
                             const uint32_t align[3], uint64_t workspace, const char *what,
                             kiln__cublas_plan **out, kiln_status *st) {
  *out = NULL;
  int compute, scale, ab, ct;
  if (!kiln__cublas_compute_type(g->dtype, tf32, &compute, &scale, &ab, &ct))
    return kiln_status_set(st, KILN_EUNIMPL, what,
                           "GEMM of element type %d on cuda (f32, f64, bf16 into f32 only)",
                           g->dtype);
  kiln__cublas_plan *p = kiln_calloc(1, sizeof *p);
  if (p == NULL) return kiln_status_set(st, KILN_ENOMEM, what, "out of memory");
  p->h = h->h;
  p->dtype = g->dtype;
  snprintf(p->what, sizeof p->what, "%s", what);
  if (scale == CUDA_R_64F) {
    memcpy(p->alpha, &g->alpha, 8);
    memcpy(p->beta, &g->beta, 8);
  } else {
    float a = (float)g->alpha, b = (float)g->beta;
    memcpy(p->alpha, &a, 4);
    memcpy(p->beta, &b, 4);
  }
  int rc = check(lib.api.desc_create(&p->desc, (cublasComputeType_t)compute, (cudaDataType)scale),
                 "cublasLtMatmulDescCreate", what, st);
  if (rc) p->desc = NULL;
  /* ours: C (m x n) = op(A) op(B); cuBLASLt's: C^T = op(B^T) op(A^T). */
  cublasOperation_t ta = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (rc == 0)
    rc = check(lib.api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
               "cublasLtMatmulDescSetAttribute(TRANSA)", what, st);
  if (rc == 0)
    rc = check(lib.api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
               "cublasLtMatmulDescSetAttribute(TRANSB)", what, st);
  /* Column-major shapes: B^T is n x k (stored k x n when transposed), A^T
   * k x m (m x k when transposed), C^T n x m. */
  if (rc == 0)
    rc = layout(&p->la, ab, g->trans_b ? g->k : g->n, g->trans_b ? g->n : g->k, g->ldb, g->batch,
                g->stride_b, what, st);
  if (rc == 0)
    rc = layout(&p->lb, ab, g->trans_a ? g->m : g->k, g->trans_a ? g->k : g->m, g->lda, g->batch,
                g->stride_a, what, st);
  if (rc == 0) rc = layout(&p->lc, ct, g->n, g->m, g->ldc, g->batch, g->stride_c, what, st);
  if (rc == 0) rc = pick_algo(p, align, workspace, st);
  if (rc) {
    kiln__cublas_plan_destroy(p);
    return rc;
  }
  *out = p;
  return 0;
}

int kiln__cublas_plan_run(const kiln__cublas_plan *p, uint64_t a, uint64_t b, uint64_t c,
                          uint64_t workspace, CUstream s, const char *where, kiln_status *st) {
  void *pa = (void *)(uintptr_t)a, *pb = (void *)(uintptr_t)b, *pc = (void *)(uintptr_t)c;
  void *ws = p->workspace ? (void *)(uintptr_t)workspace : NULL;
  return check(lib.api.matmul(p->h, p->desc, p->alpha, pb, p->la, pa, p->lb, p->beta, pc, p->lc, pc,
                              p->lc, &p->algo, ws, (size_t)p->workspace, (cudaStream_t)s),
               "cublasLtMatmul", where, st);
}
