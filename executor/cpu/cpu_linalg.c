/* The LAPACK step (KILN_STEP_LINALG) on the cpu backend: each matrix of the
 * batch is copied into a column-major work array (whatever the argument's
 * layout: the step carries every dimension's stride), factored or solved
 * by OpenBLAS's LAPACK (the Fortran symbols spotrf_, dgesdd_, ..., which
 * libopenblas exports), and its results are copied back out.
 *
 * Every element type LAPACK has is taken: s, d, c and z (the complex
 * kinds are c/zungqr and c/zheevd under the real names orgqr and syevd).
 * The copies are O(n^2) per matrix against the routine's O(n^3). Where
 * LAPACK leaves a result unspecified (syevd's vectors with mode N, gesdd's
 * overwritten operand, its u and vt with mode N) zeros are written, as the
 * interpreter writes (compiler/eval/interp_lapack.c), so runs are
 * deterministic. The HLO cholesky zeroes the other triangle and, on a
 * matrix that is not positive definite, writes NaN from the failing column
 * on, as the interpreter does; the custom calls return LAPACK's info.
 *
 * Small real triangular solves and LU factorizations (up to 32 rows) are
 * substituted in place instead (trsm_small, getrf_small): OpenBLAS's call
 * overhead is more than their arithmetic.
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
 * arguments gfortran passes. Arrays and scalars of the element type are
 * declared void *, so that one table per type (s, d, c, z) holds them. */
typedef int lint;
typedef void potrf_fn(const char *, const lint *, void *, const lint *, lint *, size_t);
typedef void trsm_fn(const char *, const char *, const char *, const char *, const lint *,
                     const lint *, const void *, const void *, const lint *, void *, const lint *,
                     size_t, size_t, size_t, size_t);
typedef void getrf_fn(const lint *, const lint *, void *, const lint *, lint *, lint *);
typedef void geqrf_fn(const lint *, const lint *, void *, const lint *, void *, void *,
                      const lint *, lint *);
typedef void orgqr_fn(const lint *, const lint *, const lint *, void *, const lint *, const void *,
                      void *, const lint *, lint *);
/* syevd: jobz uplo n a lda w work lwork iwork liwork info */
typedef void syevd_fn(const char *, const char *, const lint *, void *, const lint *, void *,
                      void *, const lint *, lint *, const lint *, lint *, size_t, size_t);
/* heevd: jobz uplo n a lda w work lwork rwork lrwork iwork liwork info */
typedef void heevd_fn(const char *, const char *, const lint *, void *, const lint *, void *,
                      void *, const lint *, void *, const lint *, lint *, const lint *, lint *,
                      size_t, size_t);
/* gesdd: jobz m n a lda s u ldu vt ldvt work lwork iwork info */
typedef void gesdd_fn(const char *, const lint *, const lint *, void *, const lint *, void *,
                      void *, const lint *, void *, const lint *, void *, const lint *, lint *,
                      lint *, size_t);
/* complex gesdd: ... work lwork rwork iwork info */
typedef void cgesdd_fn(const char *, const lint *, const lint *, void *, const lint *, void *,
                       void *, const lint *, void *, const lint *, void *, const lint *, void *,
                       lint *, lint *, size_t);
potrf_fn spotrf_, dpotrf_, cpotrf_, zpotrf_;
trsm_fn strsm_, dtrsm_, ctrsm_, ztrsm_;
getrf_fn sgetrf_, dgetrf_, cgetrf_, zgetrf_;
geqrf_fn sgeqrf_, dgeqrf_, cgeqrf_, zgeqrf_;
orgqr_fn sorgqr_, dorgqr_, cungqr_, zungqr_;
syevd_fn ssyevd_, dsyevd_;
heevd_fn cheevd_, zheevd_;
gesdd_fn sgesdd_, dgesdd_;
cgesdd_fn cgesdd_, zgesdd_;

typedef struct routines {
  potrf_fn *potrf;
  trsm_fn *trsm;
  getrf_fn *getrf;
  geqrf_fn *geqrf;
  orgqr_fn *orgqr;
  syevd_fn *syevd; /* real */
  heevd_fn *heevd; /* complex */
  gesdd_fn *gesdd;
  cgesdd_fn *cgesdd;
  bool cplx;
  bool f64; /* double precision (d, z) */
} routines;

static const routines lapack_s = {spotrf_, strsm_,  sgetrf_, sgeqrf_, sorgqr_, ssyevd_,
                                  NULL,    sgesdd_, NULL,    false,   false};
static const routines lapack_d = {dpotrf_, dtrsm_,  dgetrf_, dgeqrf_, dorgqr_, dsyevd_,
                                  NULL,    dgesdd_, NULL,    false,   true};
static const routines lapack_c = {cpotrf_, ctrsm_, cgetrf_, cgeqrf_, cungqr_, NULL,
                                  cheevd_, NULL,   cgesdd_, true,    false};
static const routines lapack_z = {zpotrf_, ztrsm_, zgetrf_, zgeqrf_, zungqr_, NULL,
                                  zheevd_, NULL,   zgesdd_, true,    true};

static const routines *routines_of(uint32_t dtype) {
  switch (dtype) {
  case KILN_F64: return &lapack_d;
  case KILN_C64: return &lapack_c;
  case KILN_C128: return &lapack_z;
  default: return &lapack_s;
  }
}

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

typedef struct pair64 {
  uint64_t lo, hi;
} pair64;

/* Moves r x c elements of v->es bytes (4, 8 or 16) between a strided view
 * and a column-major array; src NULL writes zeros. Columns go MOVE_TILE at
 * a time, row by row within them: a row-major operand (JAX's, where the
 * custom call asks for column-major) is then read a cache line at a time
 * and written to MOVE_TILE columns that stay in cache, where walking each
 * column through a 512-float row stride missed in cache (4 KiB apart, the
 * rows fall in one cache set) on every element: 14% of linalg_solve. */
#define MOVE_TILE 8
#define MOVE(T, dst, dexpr, src, sexpr) \
  do { \
    T *d_ = (T *)(dst); \
    const T *s_ = (const T *)(src); \
    T z_; \
    memset(&z_, 0, sizeof z_); \
    for (int64_t j0 = 0; j0 < c; j0 += MOVE_TILE) { \
      int64_t j1 = c - j0 < MOVE_TILE ? c : j0 + MOVE_TILE; \
      for (int64_t i = 0; i < r; i++) \
        for (int64_t j = j0; j < j1; j++) d_[dexpr] = s_ ? s_[sexpr] : z_; \
    } \
  } while (0)

/* Copies matrix b of argument v into col (column-major, ld = rows). */
static void gather(const kiln_linalg *g, const arg_view *v, const void *base, int64_t b,
                   void *col) {
  int64_t r, c, off = batch_offset(g, v, b);
  minor_dims(v, &r, &c);
  uint32_t nb = v->rank - v->minor;
  int64_t sr = v->minor >= 1 ? v->strides[nb] : 0, sc = v->minor == 2 ? v->strides[nb + 1] : 0;
  const char *src = (const char *)base + (size_t)off * v->es;
  if (v->es == 16)
    MOVE(pair64, col, j * r + i, src, i * sr + j * sc);
  else if (v->es == 8)
    MOVE(uint64_t, col, j * r + i, src, i * sr + j * sc);
  else
    MOVE(uint32_t, col, j * r + i, src, i * sr + j * sc);
}

/* The inverse of gather; col NULL writes zeros. */
static void scatter(const kiln_linalg *g, const arg_view *v, void *base, int64_t b,
                    const void *col) {
  int64_t r, c, off = batch_offset(g, v, b);
  minor_dims(v, &r, &c);
  uint32_t nb = v->rank - v->minor;
  int64_t sr = v->minor >= 1 ? v->strides[nb] : 0, sc = v->minor == 2 ? v->strides[nb + 1] : 0;
  char *dst = (char *)base + (size_t)off * v->es;
  if (v->es == 16)
    MOVE(pair64, dst, i * sr + j * sc, col, j * r + i);
  else if (v->es == 8)
    MOVE(uint64_t, dst, i * sr + j * sc, col, j * r + i);
  else
    MOVE(uint32_t, dst, i * sr + j * sc, col, j * r + i);
}
#undef MOVE

/* ---- one matrix ----------------------------------------------------------- */

/* Work arrays of one worker, sized for the step (work_alloc). */
typedef struct work {
  void *a, *b, *u, *vt, *vec, *lwork, *rwork;
  lint *iwork;
  lint nlwork, nrwork, niwork;
} work;

typedef struct job {
  const kiln_linalg *g;
  const routines *fn;
  arg_view v[KILN_LAPACK_MAX_ARGS];
  void *const *args;
} job;

static lint I(int64_t v) { return (lint)v; }
static lint ld(int64_t v) { return v > 0 ? (lint)v : 1; }

/* The HLO cholesky's other triangle (zeros) and its failure (NaN from the
 * failing column on), on the column-major real factor a. */
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

/* syevd/heevd and gesdd of matrix b: the calls with vectors and real values. */
static void run_vectors(const job *jb, work *w, int64_t b) {
  const kiln_lapack *l = &jb->g->l;
  const routines *fn = jb->fn;
  void *const *a = jb->args;
  lint m = I(l->m), n = I(l->n), mn = m < n ? m : n, info = 0;
  char uplo = (char)l->uplo, mode = (char)l->mode;
  switch (l->kind) {
  case KILN_LAPACK_SYEVD: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    lint lda = ld(n);
    if (fn->cplx)
      fn->heevd(&mode, &uplo, &n, w->a, &lda, w->vec, w->lwork, &w->nlwork, w->rwork, &w->nrwork,
                w->iwork, &w->niwork, &info, 1, 1);
    else
      fn->syevd(&mode, &uplo, &n, w->a, &lda, w->vec, w->lwork, &w->nlwork, w->iwork, &w->niwork,
                &info, 1, 1);
    scatter(jb->g, &jb->v[1], a[1], b, mode == 'N' ? NULL : w->a);
    scatter(jb->g, &jb->v[2], a[2], b, w->vec);
    put_info(jb, 3, b, info);
    break;
  }
  case KILN_LAPACK_GESDD: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    lint lda = ld(m), ldu = ld(m), ldvt = ld(mode == 'S' ? mn : n);
    if (fn->cplx)
      fn->cgesdd(&mode, &m, &n, w->a, &lda, w->vec, w->u, &ldu, w->vt, &ldvt, w->lwork, &w->nlwork,
                 w->rwork, w->iwork, &info, 1);
    else
      fn->gesdd(&mode, &m, &n, w->a, &lda, w->vec, w->u, &ldu, w->vt, &ldvt, w->lwork, &w->nlwork,
                w->iwork, &info, 1);
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

/* ---- small triangular solves ---------------------------------------------
 *
 * OpenBLAS's trsm spends microseconds on every call before its arithmetic
 * (argument checks, blocking, packing the triangle): for the small
 * triangles of a batch (512 inverses of 8x8 matrices through their LU
 * factors) that was nearly all of the step, 9 us a matrix. Up to
 * SMALL_TRSM rows in the triangle, real types, the solve is a direct
 * substitution in the column-major work arrays instead: op(A) X = B (side
 * L) solves each column of B, X op(A) = B (side R) each row as
 * op(A)^T x = b. The system's matrix M is A or A^T (`swap`), lower
 * triangular when A's stored triangle is the lower one and not swapped, or
 * the upper one swapped; each unknown is its right-hand side less the
 * known ones times M's row, divided by the diagonal (not with a unit
 * diagonal). The interpreter (compiler/eval/interp_lapack.c) substitutes
 * likewise; OpenBLAS multiplies by reciprocals, which differs in the last
 * bits only. */
#define SMALL_TRSM 32

#define DEFINE_TRSM(NAME, T) \
  static void NAME(char side, char uplo, char tr, char diag, int64_t m, int64_t n, const T *a, \
                   int64_t lda, T *b, int64_t ldb) { \
    bool swap = (tr != 'N') != (side == 'R'); \
    bool lower = (uplo == 'L') != swap; \
    int64_t len = side == 'L' ? m : n, nv = side == 'L' ? n : m; \
    int64_t es = side == 'L' ? 1 : ldb, vs = side == 'L' ? ldb : 1; \
    int64_t si = swap ? lda : 1, sk = swap ? 1 : lda; /* M[i][k] = a[i * si + k * sk] */ \
    for (int64_t v = 0; v < nv; v++) { \
      T *x = b + v * vs; \
      for (int64_t t = 0; t < len; t++) { \
        int64_t i = lower ? t : len - 1 - t; \
        int64_t k0 = lower ? 0 : i + 1, k1 = lower ? i : len; \
        T acc = x[i * es]; \
        for (int64_t k = k0; k < k1; k++) acc -= a[i * si + k * sk] * x[k * es]; \
        x[i * es] = diag == 'U' ? acc : acc / a[i * si + i * sk]; \
      } \
    } \
  }
DEFINE_TRSM(trsm_small_s, float)
DEFINE_TRSM(trsm_small_d, double)
#undef DEFINE_TRSM

/* Whether trsm_small takes this solve (then it has done it). */
static bool trsm_small(const routines *fn, char side, char uplo, char tr, char diag, int64_t m,
                       int64_t n, const void *a, int64_t lda, void *b, int64_t ldb) {
  int64_t k = side == 'L' ? m : n;
  if (fn->cplx || k > SMALL_TRSM) return false;
  if (fn->f64)
    trsm_small_d(side, uplo, tr, diag, m, n, a, lda, b, ldb);
  else
    trsm_small_s(side, uplo, tr, diag, m, n, a, lda, b, ldb);
  return true;
}

/* LU with partial pivoting of a small real m x n matrix (column-major, ld
 * m), as getrf: for each column the first row of largest magnitude on or
 * below the diagonal is the pivot (1-based in ipiv), its row is swapped
 * in, the column below is divided by it and the trailing matrix updated;
 * a zero pivot is skipped and named in info (the first one). The same
 * steps as the interpreter's (compiler/eval/interp_lapack.c), for the
 * same reason as trsm_small: OpenBLAS's sgetrf costs more in calls (an
 * isamax, a scal and a gemv per column) than an 8x8 matrix's arithmetic. */
#define SMALL_GETRF 32

#define DEFINE_GETRF(NAME, T) \
  static lint NAME(int64_t m, int64_t n, T *a, lint *ipiv) { \
    lint info = 0; \
    int64_t mn = m < n ? m : n; \
    for (int64_t j = 0; j < mn; j++) { \
      T *cj = a + j * m; \
      int64_t p = j; \
      for (int64_t i = j + 1; i < m; i++) \
        if ((cj[i] < 0 ? -cj[i] : cj[i]) > (cj[p] < 0 ? -cj[p] : cj[p])) p = i; \
      ipiv[j] = (lint)(p + 1); \
      if (p != j) \
        for (int64_t c = 0; c < n; c++) { \
          T t = a[j + c * m]; \
          a[j + c * m] = a[p + c * m]; \
          a[p + c * m] = t; \
        } \
      T piv = cj[j]; \
      if (piv == 0) { \
        if (info == 0) info = (lint)(j + 1); \
        continue; \
      } \
      for (int64_t i = j + 1; i < m; i++) cj[i] /= piv; \
      for (int64_t c = j + 1; c < n; c++) { \
        T *cc = a + c * m, f = cc[j]; \
        for (int64_t i = j + 1; i < m; i++) cc[i] -= cj[i] * f; \
      } \
    } \
    return info; \
  }
DEFINE_GETRF(getrf_small_s, float)
DEFINE_GETRF(getrf_small_d, double)
#undef DEFINE_GETRF

/* Whether getrf_small takes this factorization (then it has done it). */
static bool getrf_small(const routines *fn, int64_t m, int64_t n, void *a, lint *ipiv, lint *info) {
  if (fn->cplx || m > SMALL_GETRF || n > SMALL_GETRF) return false;
  *info = fn->f64 ? getrf_small_d(m, n, a, ipiv) : getrf_small_s(m, n, a, ipiv);
  return true;
}

static void run_one(const job *jb, work *w, int64_t b) {
  const kiln_lapack *l = &jb->g->l;
  const routines *fn = jb->fn;
  void *const *a = jb->args;
  lint m = I(l->m), n = I(l->n), k = I(l->k), info = 0;
  char uplo = (char)l->uplo;
  switch (l->kind) {
  case KILN_LAPACK_POTRF:
  case KILN_LAPACK_CHOLESKY: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    lint lda = ld(n);
    fn->potrf(&uplo, &n, w->a, &lda, &info, 1);
    if (l->kind == KILN_LAPACK_CHOLESKY) cholesky_finish(fn->f64, w->a, n, uplo == 'L', info);
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
    const double one[2] = {1, 0};
    const float onef[2] = {1, 0};
    if (!trsm_small(fn, side, uplo, tr, diag, m, n, w->a, lda, w->b, ldb))
      fn->trsm(&side, &uplo, &tr, &diag, &m, &n, fn->f64 ? (const void *)one : (const void *)onef,
               w->a, &lda, w->b, &ldb, 1, 1, 1, 1);
    scatter(jb->g, &jb->v[2], a[2], b, w->b);
    break;
  }
  case KILN_LAPACK_GETRF: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    lint lda = ld(m);
    if (!getrf_small(fn, m, n, w->a, w->iwork, &info))
      fn->getrf(&m, &n, w->a, &lda, w->iwork, &info);
    scatter(jb->g, &jb->v[1], a[1], b, w->a);
    scatter(jb->g, &jb->v[2], a[2], b, w->iwork);
    put_info(jb, 3, b, info);
    break;
  }
  case KILN_LAPACK_GEQRF: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    lint lda = ld(m);
    fn->geqrf(&m, &n, w->a, &lda, w->vec, w->lwork, &w->nlwork, &info);
    scatter(jb->g, &jb->v[1], a[1], b, w->a);
    scatter(jb->g, &jb->v[2], a[2], b, w->vec);
    break;
  }
  case KILN_LAPACK_ORGQR: {
    gather(jb->g, &jb->v[0], a[0], b, w->a);
    gather(jb->g, &jb->v[1], a[1], b, w->vec);
    lint lda = ld(m);
    fn->orgqr(&m, &n, &k, w->a, &lda, w->vec, w->lwork, &w->nlwork, &info);
    scatter(jb->g, &jb->v[2], a[2], b, w->a);
    break;
  }
  case KILN_LAPACK_SYEVD:
  case KILN_LAPACK_GESDD: run_vectors(jb, w, b); break;
  default: break;
  }
}

/* ---- work arrays ----------------------------------------------------------- */

/* A single-precision query answer written where a double was offered. */
static double first_float(const void *p) {
  float f;
  memcpy(&f, p, sizeof f);
  return f;
}

/* LAPACK's own workspace sizes (lwork = -1 queries), each at least 1. */
static int query(const kiln_lapack *l, const routines *fn, lint *nlwork, lint *nrwork,
                 lint *niwork) {
  lint m = I(l->m), n = I(l->n), k = I(l->k), mn = m < n ? m : n, big = m > n ? m : n;
  lint info = 0, q = -1, iw = 0, ldm = ld(m), ldn = ld(n);
  double wq[2] = {0, 0}, rw = 0, dummy[2] = {0, 0};
  char uplo = (char)l->uplo, mode = (char)l->mode;
  *nlwork = 1;
  *nrwork = 1;
  *niwork = mn > 0 ? mn : 1;
  switch (l->kind) {
  case KILN_LAPACK_GEQRF: fn->geqrf(&m, &n, dummy, &ldm, dummy, wq, &q, &info); break;
  case KILN_LAPACK_ORGQR: fn->orgqr(&m, &n, &k, dummy, &ldm, dummy, wq, &q, &info); break;
  case KILN_LAPACK_SYEVD:
    if (fn->cplx) {
      fn->heevd(&mode, &uplo, &n, dummy, &ldn, dummy, wq, &q, &rw, &q, &iw, &q, &info, 1, 1);
      double r = fn->f64 ? rw : first_float(&rw);
      *nrwork = r >= 1 && r < INT_MAX / 2 ? (lint)r + 1 : 1;
    } else {
      fn->syevd(&mode, &uplo, &n, dummy, &ldn, dummy, wq, &q, &iw, &q, &info, 1, 1);
    }
    *niwork = iw > 1 ? iw : 1;
    break;
  case KILN_LAPACK_GESDD: {
    lint ldvt = ld(mode == 'S' ? mn : n);
    if (fn->cplx) {
      fn->cgesdd(&mode, &m, &n, dummy, &ldm, dummy, dummy, &ldm, dummy, &ldvt, wq, &q, &rw, &iw,
                 &info, 1);
      /* LAPACK's documented rwork sizes (no query for them) */
      int64_t r = mode == 'N'
                      ? 7 * (int64_t)mn
                      : (int64_t)mn *
                            (5 * mn + 7 > 2 * big + 2 * mn + 1 ? 5 * mn + 7 : 2 * big + 2 * mn + 1);
      if (r >= INT_MAX / 2) return KILN_ELIMIT;
      *nrwork = r > 1 ? (lint)r : 1;
    } else {
      fn->gesdd(&mode, &m, &n, dummy, &ldm, dummy, dummy, &ldm, dummy, &ldvt, wq, &q, &iw, &info,
                1);
    }
    *niwork = 8 * (mn > 0 ? mn : 1);
    break;
  }
  default: return 0;
  }
  if (info != 0) return KILN_EINTERNAL;
  double want = fn->f64 ? wq[0] : first_float(wq);
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
  kiln_free(w->rwork);
  kiln_free(w->iwork);
}

static int work_alloc(const kiln_lapack *l, const work *sizes, work *w) {
  size_t es = kiln_dtype_size((kiln_dtype)l->dtype);
  size_t m = (size_t)l->m, n = (size_t)l->n, k = (size_t)l->k;
  size_t big = m > n ? m : n;
  big = big > k ? big : k;
  memset(w, 0, sizeof *w);
  w->nlwork = sizes->nlwork;
  w->nrwork = sizes->nrwork;
  w->niwork = sizes->niwork;
  w->a = kiln_calloc(big * big + 1, es);
  w->b = kiln_calloc(m * n + 1, es);
  w->vec = kiln_calloc(big + 1, es);
  w->lwork = kiln_calloc((size_t)w->nlwork, es);
  w->rwork = kiln_calloc((size_t)w->nrwork, es);
  w->iwork = kiln_calloc((size_t)w->niwork + big, sizeof(lint));
  if (l->kind == KILN_LAPACK_GESDD) {
    w->u = kiln_calloc(m * m + 1, es);
    w->vt = kiln_calloc(n * n + 1, es);
  }
  bool ok = w->a && w->b && w->vec && w->lwork && w->rwork && w->iwork &&
            (l->kind != KILN_LAPACK_GESDD || (w->u && w->vt));
  if (!ok) work_free(w);
  return ok ? 0 : KILN_ENOMEM;
}

/* ---- the step ------------------------------------------------------------------ */

typedef struct par_ctx {
  const job *jb;
  work sizes;
  int64_t per; /* matrices per task */
  int64_t nmat;
  int rc; /* a failure (stored atomically: any nonzero will do) */
} par_ctx;

static void par_task(void *ctx, uint64_t chunk) {
  par_ctx *p = ctx;
  work w;
  if (work_alloc(&p->jb->g->l, &p->sizes, &w)) {
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
  job jb = {.g = g, .fn = routines_of(l->dtype), .args = args};
  for (uint32_t i = 0; i < l->nargs; i++) view_of(g, i, &jb.v[i]);
  int64_t nmat = 1;
  for (uint32_t d = 0; d < l->nbatch; d++) nmat *= l->batch[d];
  if (nmat == 0) return 0;
  work sizes;
  memset(&sizes, 0, sizeof sizes);
  int rc = query(l, jb.fn, &sizes.nlwork, &sizes.nrwork, &sizes.niwork);
  if (rc)
    return kiln_status_set(st, rc, "linalg", "LAPACK %s: the workspace query failed",
                           kiln_lapack_kind_name(l->kind));
  /* Small matrices of a batch go to the pool, several per task. */
  int64_t big = l->m > l->n ? l->m : l->n;
  if (pool && nmat > 1 && big <= 256) {
    par_ctx p = {.jb = &jb, .sizes = sizes, .nmat = nmat};
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
  if (work_alloc(l, &sizes, &w)) return kiln_status_set(st, KILN_ENOMEM, "linalg", "out of memory");
  for (int64_t b = 0; b < nmat; b++) run_one(&jb, &w, b);
  work_free(&w);
  return 0;
}
