/* The LAPACK step (KILN_STEP_LINALG) on the cpu backend: each matrix of the
 * batch is copied into a column-major work array (whatever the argument's
 * layout: the step carries every dimension's stride), factored or solved
 * by OpenBLAS's LAPACK (the Fortran symbols spotrf_, dgesdd_, ..., which
 * libopenblas exports), and its results are copied back out.
 *
 * The copies are O(n^2) per matrix against the routine's O(n^3). Where
 * LAPACK leaves a result unspecified (syevd's vectors with mode N, gesdd's
 * overwritten operand, its u and vt with mode N) zeros are written, as the
 * interpreter writes (compiler/eval/interp_lapack.c), so runs are
 * deterministic. The HLO cholesky zeroes the other triangle and, on a
 * matrix that is not positive definite, writes NaN from the failing column
 * on, as the interpreter does; the custom calls return LAPACK's info.
 *
 * Matrices of the batch are independent: they are spread over the device's
 * worker pool when there are several and they are small (a large matrix
 * is left to OpenBLAS's own threads).
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "executor/cpu/cpu.h"

/* LAPACK's Fortran interface (LP64: 32-bit integers, as Debian's OpenBLAS
 * is built); the trailing size_t are the hidden lengths of the character
 * arguments gfortran passes. */
typedef int lint;
#define F(name) name##_
void F(spotrf)(const char *, const lint *, float *, const lint *, lint *, size_t);
void F(dpotrf)(const char *, const lint *, double *, const lint *, lint *, size_t);
void F(strsm)(const char *, const char *, const char *, const char *, const lint *, const lint *,
              const float *, const float *, const lint *, float *, const lint *, size_t, size_t,
              size_t, size_t);
void F(dtrsm)(const char *, const char *, const char *, const char *, const lint *, const lint *,
              const double *, const double *, const lint *, double *, const lint *, size_t, size_t,
              size_t, size_t);
void F(sgetrf)(const lint *, const lint *, float *, const lint *, lint *, lint *);
void F(dgetrf)(const lint *, const lint *, double *, const lint *, lint *, lint *);
void F(sgeqrf)(const lint *, const lint *, float *, const lint *, float *, float *, const lint *,
               lint *);
void F(dgeqrf)(const lint *, const lint *, double *, const lint *, double *, double *, const lint *,
               lint *);
void F(sorgqr)(const lint *, const lint *, const lint *, float *, const lint *, const float *,
               float *, const lint *, lint *);
void F(dorgqr)(const lint *, const lint *, const lint *, double *, const lint *, const double *,
               double *, const lint *, lint *);
void F(ssyevd)(const char *, const char *, const lint *, float *, const lint *, float *, float *,
               const lint *, lint *, const lint *, lint *, size_t, size_t);
void F(dsyevd)(const char *, const char *, const lint *, double *, const lint *, double *, double *,
               const lint *, lint *, const lint *, lint *, size_t, size_t);
void F(sgesdd)(const char *, const lint *, const lint *, float *, const lint *, float *, float *,
               const lint *, float *, const lint *, float *, const lint *, lint *, lint *, size_t);
void F(dgesdd)(const char *, const lint *, const lint *, double *, const lint *, double *, double *,
               const lint *, double *, const lint *, double *, const lint *, lint *, lint *,
               size_t);

/* ---- gathering and scattering ------------------------------------------ */

typedef struct arg_view {
  uint32_t rank;  /* batch dims + 0, 1 or 2 */
  uint32_t minor; /* 0 (scalar), 1 (vector) or 2 (matrix) */
  size_t es;      /* element bytes */
  int64_t dims[KILN_LINALG_MAX_RANK];
  const int64_t *strides;
} arg_view;

static void view_of(const kiln_linalg *g, uint32_t i, arg_view *v) {
  uint32_t dt;
  kiln_lapack_arg_dims(&g->l, i, &dt, &v->rank, v->dims);
  v->minor = v->rank - g->l.nbatch;
  v->es = kiln_dtype_size((kiln_dtype)dt);
  v->strides = g->strides[i];
}

/* Element offset of matrix b (linear over the batch dims, row-major). */
static int64_t batch_offset(const kiln_linalg *g, const arg_view *v, int64_t b) {
  int64_t off = 0;
  for (uint32_t d = g->l.nbatch; d-- > 0;) {
    int64_t n = g->l.batch[d];
    off += (b % n) * v->strides[d];
    b /= n;
  }
  return off;
}

/* Rows and columns of the minor part (a vector is rows x 1, a scalar 1 x 1). */
static void minor_dims(const arg_view *v, int64_t *r, int64_t *c) {
  uint32_t nb = v->rank - v->minor;
  *r = v->minor >= 1 ? v->dims[nb] : 1;
  *c = v->minor == 2 ? v->dims[nb + 1] : 1;
}

/* Copies matrix b of argument v into col (column-major, ld = rows). */
static void gather(const kiln_linalg *g, const arg_view *v, const void *base, int64_t b,
                   void *col) {
  int64_t r, c, off = batch_offset(g, v, b);
  minor_dims(v, &r, &c);
  uint32_t nb = v->rank - v->minor;
  int64_t sr = v->minor >= 1 ? v->strides[nb] : 0, sc = v->minor == 2 ? v->strides[nb + 1] : 0;
  const char *src = (const char *)base;
  char *dst = col;
  if (v->es == 8) {
    double *d = (double *)(void *)dst;
    const double *x = (const double *)(const void *)src + off;
    for (int64_t j = 0; j < c; j++)
      for (int64_t i = 0; i < r; i++) d[j * r + i] = x[i * sr + j * sc];
  } else { /* f32 or s32: moved as 4 bytes */
    uint32_t *d = (uint32_t *)dst;
    const uint32_t *x = (const uint32_t *)(const void *)src + off;
    for (int64_t j = 0; j < c; j++)
      for (int64_t i = 0; i < r; i++) d[j * r + i] = x[i * sr + j * sc];
  }
}

/* The inverse of gather; col NULL writes zeros. */
static void scatter(const kiln_linalg *g, const arg_view *v, void *base, int64_t b,
                    const void *col) {
  int64_t r, c, off = batch_offset(g, v, b);
  minor_dims(v, &r, &c);
  uint32_t nb = v->rank - v->minor;
  int64_t sr = v->minor >= 1 ? v->strides[nb] : 0, sc = v->minor == 2 ? v->strides[nb + 1] : 0;
  if (v->es == 8) {
    double *d = (double *)base + off;
    const double *x = col;
    for (int64_t j = 0; j < c; j++)
      for (int64_t i = 0; i < r; i++) d[i * sr + j * sc] = x ? x[j * r + i] : 0;
  } else { /* f32, and the s32 of pivots and info */
    uint32_t *d = (uint32_t *)base + off;
    const uint32_t *x = col;
    for (int64_t j = 0; j < c; j++)
      for (int64_t i = 0; i < r; i++) d[i * sr + j * sc] = x ? x[j * r + i] : 0;
  }
}

/* ---- one matrix ----------------------------------------------------------- */

/* Work arrays of one worker, sized for the step (work_alloc). */
typedef struct work {
  void *a, *b, *u, *vt, *vec, *lwork;
  lint *iwork;
  lint nlwork, niwork;
} work;

typedef struct job {
  const kiln_linalg *g;
  arg_view v[KILN_LAPACK_MAX_ARGS];
  void *const *args;
} job;

static lint I(int64_t v) { return (lint)v; }
static lint ld(int64_t v) { return v > 0 ? (lint)v : 1; }

/* The HLO cholesky's other triangle (zeros) and its failure (NaN from the
 * failing column on), on the column-major factor a. */
static void cholesky_finish(bool f64, void *a, int64_t n, bool lower, lint info) {
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < n; i++) {
      /* (i, j) in the factor's triangle, as the lower form's (row, column). */
      int64_t row = lower ? i : j, colm = lower ? j : i;
      bool in_tri = row >= colm;
      double x;
      if (!in_tri)
        x = 0;
      else if (info > 0 && colm >= info - 1)
        x = NAN;
      else
        continue;
      if (f64)
        ((double *)a)[j * n + i] = x;
      else
        ((float *)a)[j * n + i] = (float)x;
    }
}

static void put_info(const job *jb, uint32_t arg, int64_t b, lint info) {
  int32_t v = info;
  scatter(jb->g, &jb->v[arg], jb->args[arg], b, &v);
}

static void run_one(const job *jb, work *w, int64_t b) {
  const kiln_lapack *l = &jb->g->l;
  bool f64 = l->dtype == KILN_F64;
  void *const *a = jb->args;
  lint m = I(l->m), n = I(l->n), k = I(l->k), mn = m < n ? m : n, info = 0;
  char uplo = (char)l->uplo, mode = (char)l->mode;
  switch (l->kind) {
  case KILN_LAPACK_POTRF:
  case KILN_LAPACK_CHOLESKY: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    lint lda = ld(n);
    if (f64)
      F(dpotrf)(&uplo, &n, w->a, &lda, &info, 1);
    else
      F(spotrf)(&uplo, &n, w->a, &lda, &info, 1);
    if (l->kind == KILN_LAPACK_CHOLESKY) cholesky_finish(f64, w->a, n, uplo == 'L', info);
    scatter(jb->g, &jb->v[1], a[1], b, w->a);
    if (l->kind == KILN_LAPACK_POTRF) put_info(jb, 2, b, info);
    break;
  }
  case KILN_LAPACK_TRSM:
  case KILN_LAPACK_TRIANGULAR_SOLVE: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    gather(jb->g, &jb->v[1], a[1], b, w->b);
    char side = (char)l->side, tr = (char)l->trans, diag = (char)l->diag;
    lint lda = ld(k), ldb = ld(m);
    if (f64) {
      double one = 1;
      F(dtrsm)(&side, &uplo, &tr, &diag, &m, &n, &one, w->a, &lda, w->b, &ldb, 1, 1, 1, 1);
    } else {
      float one = 1;
      F(strsm)(&side, &uplo, &tr, &diag, &m, &n, &one, w->a, &lda, w->b, &ldb, 1, 1, 1, 1);
    }
    scatter(jb->g, &jb->v[2], a[2], b, w->b);
    break;
  }
  case KILN_LAPACK_GETRF: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    lint lda = ld(m);
    if (f64)
      F(dgetrf)(&m, &n, w->a, &lda, w->iwork, &info);
    else
      F(sgetrf)(&m, &n, w->a, &lda, w->iwork, &info);
    scatter(jb->g, &jb->v[1], a[1], b, w->a);
    scatter(jb->g, &jb->v[2], a[2], b, w->iwork);
    put_info(jb, 3, b, info);
    break;
  }
  case KILN_LAPACK_GEQRF: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    lint lda = ld(m);
    if (f64)
      F(dgeqrf)(&m, &n, w->a, &lda, w->vec, w->lwork, &w->nlwork, &info);
    else
      F(sgeqrf)(&m, &n, w->a, &lda, w->vec, w->lwork, &w->nlwork, &info);
    scatter(jb->g, &jb->v[1], a[1], b, w->a);
    scatter(jb->g, &jb->v[2], a[2], b, w->vec);
    break;
  }
  case KILN_LAPACK_ORGQR: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    gather(jb->g, &jb->v[1], a[1], b, w->vec);
    lint lda = ld(m);
    if (f64)
      F(dorgqr)(&m, &n, &k, w->a, &lda, w->vec, w->lwork, &w->nlwork, &info);
    else
      F(sorgqr)(&m, &n, &k, w->a, &lda, w->vec, w->lwork, &w->nlwork, &info);
    scatter(jb->g, &jb->v[2], a[2], b, w->a);
    break;
  }
  case KILN_LAPACK_SYEVD: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    lint lda = ld(n);
    if (f64) F(dsyevd)
    (&mode, &uplo, &n, w->a, &lda, w->vec, w->lwork, &w->nlwork, w->iwork, &w->niwork, &info, 1, 1);
    else F(ssyevd)(&mode, &uplo, &n, w->a, &lda, w->vec, w->lwork, &w->nlwork, w->iwork, &w->niwork,
                   &info, 1, 1);
    scatter(jb->g, &jb->v[1], a[1], b, mode == 'N' ? NULL : w->a);
    scatter(jb->g, &jb->v[2], a[2], b, w->vec);
    put_info(jb, 3, b, info);
    break;
  }
  case KILN_LAPACK_GESDD: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    lint lda = ld(m), ldu = ld(m), ldvt = ld(mode == 'S' ? mn : n);
    if (f64) F(dgesdd)
    (&mode, &m, &n, w->a, &lda, w->vec, w->u, &ldu, w->vt, &ldvt, w->lwork, &w->nlwork, w->iwork,
     &info, 1);
    else F(sgesdd)(&mode, &m, &n, w->a, &lda, w->vec, w->u, &ldu, w->vt, &ldvt, w->lwork,
                   &w->nlwork, w->iwork, &info, 1);
    bool none = mode == 'N';
    scatter(jb->g, &jb->v[1], a[1], b, NULL);
    scatter(jb->g, &jb->v[2], a[2], b, w->vec);
    scatter(jb->g, &jb->v[3], a[3], b, none ? NULL : w->u);
    scatter(jb->g, &jb->v[4], a[4], b, none ? NULL : w->vt);
    put_info(jb, 5, b, info);
    break;
  }
  default: break;
  }
}

/* ---- work arrays ----------------------------------------------------------- */

/* LAPACK's own workspace size (lwork = -1 query), at least 1. */
static int query(const kiln_lapack *l, lint *nlwork, lint *niwork) {
  bool f64 = l->dtype == KILN_F64;
  lint m = I(l->m), n = I(l->n), k = I(l->k), mn = m < n ? m : n, info = 0, q = -1;
  double wd = 0, dummy = 0;
  float wf = 0, dummyf = 0;
  lint iw = 0, ldm = ld(m), ldn = ld(n);
  char uplo = (char)l->uplo, mode = (char)l->mode;
  *nlwork = 1;
  *niwork = mn > 0 ? mn : 1;
  switch (l->kind) {
  case KILN_LAPACK_GEQRF:
    if (f64)
      F(dgeqrf)(&m, &n, &dummy, &ldm, &dummy, &wd, &q, &info);
    else
      F(sgeqrf)(&m, &n, &dummyf, &ldm, &dummyf, &wf, &q, &info);
    break;
  case KILN_LAPACK_ORGQR:
    if (f64)
      F(dorgqr)(&m, &n, &k, &dummy, &ldm, &dummy, &wd, &q, &info);
    else
      F(sorgqr)(&m, &n, &k, &dummyf, &ldm, &dummyf, &wf, &q, &info);
    break;
  case KILN_LAPACK_SYEVD:
    if (f64)
      F(dsyevd)(&mode, &uplo, &n, &dummy, &ldn, &dummy, &wd, &q, &iw, &q, &info, 1, 1);
    else
      F(ssyevd)(&mode, &uplo, &n, &dummyf, &ldn, &dummyf, &wf, &q, &iw, &q, &info, 1, 1);
    *niwork = iw > 1 ? iw : 1;
    break;
  case KILN_LAPACK_GESDD: {
    lint ldvt = ld(mode == 'S' ? mn : n);
    if (f64) F(dgesdd)
    (&mode, &m, &n, &dummy, &ldm, &dummy, &dummy, &ldm, &dummy, &ldvt, &wd, &q, &iw, &info, 1);
    else F(sgesdd)(&mode, &m, &n, &dummyf, &ldm, &dummyf, &dummyf, &ldm, &dummyf, &ldvt, &wf, &q,
                   &iw, &info, 1);
    *niwork = 8 * (mn > 0 ? mn : 1);
    break;
  }
  default: return 0;
  }
  if (info != 0) return KILN_EINTERNAL;
  double want = f64 ? wd : (double)wf;
  if (!(want >= 1)) want = 1;
  if (want > INT_MAX / 2) return KILN_ELIMIT;
  *nlwork = (lint)want + 1;
  return 0;
}

static void work_free(work *w) {
  kiln_free(w->a);
  kiln_free(w->b);
  kiln_free(w->u);
  kiln_free(w->vt);
  kiln_free(w->vec);
  kiln_free(w->lwork);
  kiln_free(w->iwork);
}

static int work_alloc(const kiln_lapack *l, lint nlwork, lint niwork, work *w) {
  size_t es = l->dtype == KILN_F64 ? 8 : 4;
  size_t m = (size_t)l->m, n = (size_t)l->n, k = (size_t)l->k;
  size_t big = m > n ? m : n;
  big = big > k ? big : k;
  memset(w, 0, sizeof *w);
  w->nlwork = nlwork;
  w->niwork = niwork;
  w->a = kiln_calloc(big * big + 1, es);
  w->b = kiln_calloc(m * n + 1, es);
  w->vec = kiln_calloc(big + 1, es);
  w->lwork = kiln_calloc((size_t)nlwork, es);
  w->iwork = kiln_calloc((size_t)niwork + big, sizeof(lint));
  if (l->kind == KILN_LAPACK_GESDD) {
    w->u = kiln_calloc(m * m + 1, es);
    w->vt = kiln_calloc(n * n + 1, es);
  }
  bool ok = w->a && w->b && w->vec && w->lwork && w->iwork &&
            (l->kind != KILN_LAPACK_GESDD || (w->u && w->vt));
  if (!ok) work_free(w);
  return ok ? 0 : KILN_ENOMEM;
}

/* ---- the step ------------------------------------------------------------------ */

typedef struct par_ctx {
  const job *jb;
  lint nlwork, niwork;
  int64_t per; /* matrices per task */
  int64_t nmat;
  int rc; /* a failure (stored atomically: any nonzero will do) */
} par_ctx;

static void par_task(void *ctx, uint64_t chunk) {
  par_ctx *p = ctx;
  work w;
  if (work_alloc(&p->jb->g->l, p->nlwork, p->niwork, &w)) {
    __atomic_store_n(&p->rc, KILN_ENOMEM, __ATOMIC_RELAXED);
    return;
  }
  int64_t t = (int64_t)chunk;
  for (int64_t b = t * p->per; b < (t + 1) * p->per && b < p->nmat; b++) run_one(p->jb, &w, b);
  work_free(&w);
}

int kiln__cpu_linalg_run(const kiln_linalg *g, kiln__cpu_pool *pool, void *const *args,
                         kiln_status *st) {
  const kiln_lapack *l = &g->l;
  job jb = {.g = g, .args = args};
  for (uint32_t i = 0; i < l->nargs; i++) view_of(g, i, &jb.v[i]);
  int64_t nmat = 1;
  for (uint32_t d = 0; d < l->nbatch; d++) nmat *= l->batch[d];
  if (nmat == 0) return 0;
  lint nlwork, niwork;
  int rc = query(l, &nlwork, &niwork);
  if (rc)
    return kiln_status_set(st, rc, "linalg", "LAPACK %s: the workspace query failed",
                           kiln_lapack_kind_name(l->kind));
  /* Small matrices of a batch go to the pool, several per task. */
  int64_t big = l->m > l->n ? l->m : l->n;
  if (pool && nmat > 1 && big <= 256) {
    par_ctx p = {.jb = &jb, .nlwork = nlwork, .niwork = niwork, .nmat = nmat};
    /* Tasks of about 2^18 flops, but at least 4 per thread when the batch allows. */
    int64_t flops = big * big * big + 1, spread = 4 * (int64_t)kiln__cpu_pool_threads(pool);
    p.per = (int64_t)(1 << 18) / flops + 1;
    if (p.per > (nmat + spread - 1) / spread) p.per = (nmat + spread - 1) / spread;
    int64_t ntasks = (nmat + p.per - 1) / p.per;
    kiln__cpu_pool_run(pool, par_task, &p, (uint64_t)ntasks);
    if (p.rc) return kiln_status_set(st, p.rc, "linalg", "out of memory");
    return 0;
  }
  work w;
  if (work_alloc(l, nlwork, niwork, &w))
    return kiln_status_set(st, KILN_ENOMEM, "linalg", "out of memory");
  for (int64_t b = 0; b < nmat; b++) run_one(&jb, &w, b);
  work_free(&w);
  return 0;
}
