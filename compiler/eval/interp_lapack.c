/* The LAPACK custom calls JAX exports (lapack_spotrf_ffi, ...; see
 * compiler/ir/lapack.h), computed plainly in double per matrix of the batch
 * and rounded once when stored: the oracle the cpu backend's LAPACK step is
 * compared with. Real and complex element types go through the same
 * routines, written in complex arithmetic.
 *
 * What each result holds follows LAPACK where LAPACK defines it: potrf
 * leaves the other triangle as it was; getrf's pivots are 1-based row
 * swaps; geqrf's reflectors are LAPACK's (v[0] = 1 implied, beta =
 * -sign(alpha) * norm, tau = 0 for a column already zero below the
 * diagonal); info is the 1-based column of the first failure. Where LAPACK
 * leaves a result unspecified (syevd's vectors with mode N, gesdd's
 * overwritten operand, its u and vt with mode N) both this and the cpu step
 * write zeros. Eigen- and singular vectors are defined up to sign (and
 * within repeated values), so they are computed here by Jacobi rotations,
 * which is simple and accurate; tests compare them through the identities
 * they satisfy, not element by element.
 */
#include <complex.h>
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/eval/interp_internal.h"
#include "compiler/ir/lapack.h"

/* ---- per-matrix routines on row-major complex double arrays -------------- */

/* Every routine works in complex arithmetic: a real matrix is one whose
 * imaginary parts are zero, and each step below then reduces to the real
 * LAPACK routine's (zlarfg's reflector to dlarfg's, a Hermitian rotation to
 * a symmetric one, izamax's |re| + |im| to |x|). */
typedef double complex cplx;

static double cabs1(cplx x) { return fabs(creal(x)) + fabs(cimag(x)); }
static double norm2(cplx x) { return creal(x) * creal(x) + cimag(x) * cimag(x); }

/* Lower Cholesky (A = L L^H) of s (n x n, read from the lower triangle) in
 * place; the upper triangle is not touched. Returns info. */
static int64_t chol_lower(cplx *s, int64_t n) {
  for (int64_t j = 0; j < n; j++) {
    double d = creal(s[j * n + j]);
    for (int64_t k = 0; k < j; k++) d -= norm2(s[j * n + k]);
    if (!(d > 0)) return j + 1;
    d = sqrt(d);
    s[j * n + j] = d;
    for (int64_t i = j + 1; i < n; i++) {
      cplx v = s[i * n + j];
      for (int64_t k = 0; k < j; k++) v -= s[i * n + k] * conj(s[j * n + k]);
      s[i * n + j] = v / d;
    }
  }
  return 0;
}

/* Solves t x = b in place for each of the nrhs columns of b (k x nrhs,
 * row-major), t dense k x k, lower or upper triangular. */
static void tri_solve(const cplx *t, bool lower, int64_t k, cplx *b, int64_t nrhs) {
  for (int64_t q = 0; q < nrhs; q++)
    for (int64_t s = 0; s < k; s++) {
      int64_t i = lower ? s : k - 1 - s;
      cplx v = b[i * nrhs + q];
      for (int64_t j = lower ? 0 : i + 1; j < (lower ? i : k); j++)
        v -= t[i * k + j] * b[j * nrhs + q];
      b[i * nrhs + q] = v / t[i * k + i];
    }
}

/* LU with partial pivoting (first largest |re| + |im|), LAPACK's getrf. */
static int64_t lu(cplx *a, int64_t m, int64_t n, int32_t *ipiv) {
  int64_t info = 0, mn = m < n ? m : n;
  for (int64_t j = 0; j < mn; j++) {
    int64_t p = j;
    for (int64_t i = j + 1; i < m; i++)
      if (cabs1(a[i * n + j]) > cabs1(a[p * n + j])) p = i;
    ipiv[j] = (int32_t)(p + 1);
    if (p != j)
      for (int64_t c = 0; c < n; c++) {
        cplx t = a[j * n + c];
        a[j * n + c] = a[p * n + c];
        a[p * n + c] = t;
      }
    cplx piv = a[j * n + j];
    if (piv == 0) {
      if (info == 0) info = j + 1;
      continue;
    }
    for (int64_t i = j + 1; i < m; i++) a[i * n + j] /= piv;
    for (int64_t i = j + 1; i < m; i++)
      for (int64_t c = j + 1; c < n; c++) a[i * n + c] -= a[i * n + j] * a[j * n + c];
  }
  return info;
}

/* Householder QR, LAPACK's geqrf: R on and above the diagonal, the
 * reflectors' tails below it, their scales in tau[0..min(m,n)). H_j = I -
 * tau v v^H; A is reduced by H_j^H, as zgeqr2 applies conj(tau). */
static void qr(cplx *a, int64_t m, int64_t n, cplx *tau) {
  int64_t mn = m < n ? m : n;
  for (int64_t j = 0; j < mn; j++) {
    cplx alpha = a[j * n + j];
    double xnorm = 0;
    for (int64_t i = j + 1; i < m; i++) xnorm = hypot(xnorm, cabs(a[i * n + j]));
    if (xnorm == 0 && cimag(alpha) == 0) {
      tau[j] = 0;
      continue;
    }
    double beta = -copysign(hypot(cabs(alpha), xnorm), creal(alpha));
    tau[j] = CMPLX((beta - creal(alpha)) / beta, -cimag(alpha) / beta);
    cplx scale = 1 / (alpha - beta);
    for (int64_t i = j + 1; i < m; i++) a[i * n + j] *= scale;
    a[j * n + j] = beta;
    cplx ct = conj(tau[j]);
    for (int64_t c = j + 1; c < n; c++) {
      cplx w = a[j * n + c];
      for (int64_t i = j + 1; i < m; i++) w += conj(a[i * n + j]) * a[i * n + c];
      w *= ct;
      a[j * n + c] -= w;
      for (int64_t i = j + 1; i < m; i++) a[i * n + c] -= a[i * n + j] * w;
    }
  }
}

/* Q = H_0 ... H_{k-1} times the first n columns of the identity, from the
 * reflectors in v (m x n, below the diagonal) and tau: LAPACK's orgqr/ungqr. */
static void householder_product(const cplx *v, int64_t m, int64_t n, int64_t k, const cplx *tau,
                                cplx *q) {
  memset(q, 0, (size_t)(m * n) * sizeof *q);
  for (int64_t i = 0; i < n; i++) q[i * n + i] = 1;
  for (int64_t j = k - 1; j >= 0; j--)
    for (int64_t c = 0; c < n; c++) {
      cplx w = q[j * n + c];
      for (int64_t i = j + 1; i < m; i++) w += conj(v[i * n + j]) * q[i * n + c];
      w *= tau[j];
      q[j * n + c] -= w;
      for (int64_t i = j + 1; i < m; i++) q[i * n + c] -= w * v[i * n + j];
    }
}

/* Rotates columns p, q of the r x c matrix x: (x_p, x_q) <- (cs x_p - sn x_q,
 * sn x_p + cs x_q). */
static void rot_cols(cplx *x, int64_t r, int64_t c, int64_t p, int64_t q, double cs, double sn) {
  for (int64_t k = 0; k < r; k++) {
    cplx a = x[k * c + p], b = x[k * c + q];
    x[k * c + p] = cs * a - sn * b;
    x[k * c + q] = sn * a + cs * b;
  }
}

/* Cyclic Jacobi on the Hermitian s (n x n, destroyed): eigenvalues into w
 * (ascending), eigenvectors into the columns of v. Each rotation first
 * turns s_pq real by a phase on index q, then is the real symmetric one. */
static void herm_eigen(cplx *s, int64_t n, double *w, cplx *v) {
  memset(v, 0, (size_t)(n * n) * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i * n + i] = 1;
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0, all = 0;
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < n; j++) {
        all += norm2(s[i * n + j]);
        if (i != j) off += norm2(s[i * n + j]);
      }
    if (!(off > 1e-30 * all)) break;
    for (int64_t p = 0; p < n; p++)
      for (int64_t q = p + 1; q < n; q++) {
        double apq = cabs(s[p * n + q]);
        if (apq == 0) continue;
        cplx d = conj(s[p * n + q]) / apq; /* s_pq d = |s_pq| */
        for (int64_t k = 0; k < n; k++) {
          s[k * n + q] *= d;
          v[k * n + q] *= d;
        }
        for (int64_t k = 0; k < n; k++) s[q * n + k] *= conj(d);
        double theta = (creal(s[q * n + q]) - creal(s[p * n + p])) / (2 * apq);
        double t = copysign(1.0, theta) / (fabs(theta) + sqrt(theta * theta + 1));
        double c = 1 / sqrt(t * t + 1), sn = t * c;
        rot_cols(s, n, n, p, q, c, sn);
        for (int64_t k = 0; k < n; k++) { /* rows p, q */
          cplx x = s[p * n + k], y = s[q * n + k];
          s[p * n + k] = c * x - sn * y;
          s[q * n + k] = sn * x + c * y;
        }
        rot_cols(v, n, n, p, q, c, sn);
      }
  }
  for (int64_t i = 0; i < n; i++) w[i] = creal(s[i * n + i]);
  /* Selection sort, ascending, moving the vectors along. */
  for (int64_t i = 0; i < n; i++) {
    int64_t b = i;
    for (int64_t j = i + 1; j < n; j++)
      if (w[j] < w[b]) b = j;
    if (b == i) continue;
    double t = w[i];
    w[i] = w[b];
    w[b] = t;
    for (int64_t k = 0; k < n; k++) {
      cplx x = v[k * n + i];
      v[k * n + i] = v[k * n + b];
      v[k * n + b] = x;
    }
  }
}

/* Fills every column q of the r x cols matrix u with need[q] set by a unit
 * vector orthogonal to the columns already there: Gram-Schmidt, twice, over
 * the standard basis. need is cleared as columns are filled. */
static void complete_basis(cplx *u, int64_t r, int64_t cols, bool *need, cplx *tmp) {
  int64_t e = 0;
  for (int64_t c = 0; c < cols; c++) {
    if (!need[c]) continue;
    for (; e < r; e++) {
      for (int64_t i = 0; i < r; i++) tmp[i] = i == e;
      for (int pass = 0; pass < 2; pass++)
        for (int64_t o = 0; o < cols; o++) {
          if (need[o]) continue;
          cplx d = 0;
          for (int64_t i = 0; i < r; i++) d += conj(u[i * cols + o]) * tmp[i];
          for (int64_t i = 0; i < r; i++) tmp[i] -= d * u[i * cols + o];
        }
      double nrm = 0;
      for (int64_t i = 0; i < r; i++) nrm = hypot(nrm, cabs(tmp[i]));
      if (nrm > 0.5) {
        for (int64_t i = 0; i < r; i++) u[i * cols + c] = tmp[i] / nrm;
        need[c] = false;
        e++;
        break;
      }
    }
  }
}

/* One-sided Jacobi SVD of the tall t (r x c, r >= c, destroyed): singular
 * values s (descending), t becomes the r x c left vectors, v (c x c) the
 * right ones, as columns: t_in = t s v^H. */
static void tall_svd(cplx *t, int64_t r, int64_t c, double *s, cplx *v) {
  memset(v, 0, (size_t)(c * c) * sizeof *v);
  for (int64_t i = 0; i < c; i++) v[i * c + i] = 1;
  for (int sweep = 0; sweep < 100; sweep++) {
    bool rotated = false;
    for (int64_t p = 0; p < c; p++)
      for (int64_t q = p + 1; q < c; q++) {
        double al = 0, be = 0;
        cplx ga = 0;
        for (int64_t i = 0; i < r; i++) {
          al += norm2(t[i * c + p]);
          be += norm2(t[i * c + q]);
          ga += conj(t[i * c + p]) * t[i * c + q];
        }
        double g = cabs(ga);
        if (!(g > 1e-15 * sqrt(al * be)) || g == 0) continue;
        rotated = true;
        cplx d = conj(ga) / g; /* makes t_p^H t_q real */
        for (int64_t i = 0; i < r; i++) t[i * c + q] *= d;
        for (int64_t i = 0; i < c; i++) v[i * c + q] *= d;
        double zeta = (be - al) / (2 * g);
        double tn = copysign(1.0, zeta) / (fabs(zeta) + sqrt(1 + zeta * zeta));
        double cs = 1 / sqrt(1 + tn * tn), sn = cs * tn;
        rot_cols(t, r, c, p, q, cs, sn);
        rot_cols(v, c, c, p, q, cs, sn);
      }
    if (!rotated) break;
  }
  for (int64_t j = 0; j < c; j++) {
    double nrm = 0;
    for (int64_t i = 0; i < r; i++) nrm = hypot(nrm, cabs(t[i * c + j]));
    s[j] = nrm;
  }
  for (int64_t i = 0; i < c; i++) { /* descending, columns of t and v along */
    int64_t b = i;
    for (int64_t j = i + 1; j < c; j++)
      if (s[j] > s[b]) b = j;
    if (b == i) continue;
    double x = s[i];
    s[i] = s[b];
    s[b] = x;
    for (int64_t k = 0; k < r; k++) {
      cplx y = t[k * c + i];
      t[k * c + i] = t[k * c + b];
      t[k * c + b] = y;
    }
    for (int64_t k = 0; k < c; k++) {
      cplx y = v[k * c + i];
      v[k * c + i] = v[k * c + b];
      v[k * c + b] = y;
    }
  }
  for (int64_t j = 0; j < c; j++)
    for (int64_t i = 0; i < r; i++) t[i * c + j] = s[j] > 0 ? t[i * c + j] / s[j] : 0;
}

/* ---- the custom call ------------------------------------------------------ */

typedef struct job {
  kiln_lapack l;
  const kiln_literal *in[2];
  kiln_literal *out[5];
  cplx *w[4]; /* scratch matrices */
} job;

static void load(const kiln_literal *lit, int64_t base, int64_t count, cplx *dst) {
  bool c = kiln_dtype_is_complex(lit->shape.dtype);
  for (int64_t i = 0; i < count; i++) {
    double re, im = 0;
    if (c)
      kiln_literal_get_c128(lit, base + i, &re, &im);
    else
      re = kiln_literal_get_f64(lit, base + i);
    dst[i] = CMPLX(re, im);
  }
}

/* Stores src; into a real literal only the real parts. */
static void store(kiln_literal *lit, int64_t base, int64_t count, const cplx *src) {
  bool c = kiln_dtype_is_complex(lit->shape.dtype);
  for (int64_t i = 0; i < count; i++) {
    if (c)
      kiln_literal_set_c128(lit, base + i, creal(src[i]), cimag(src[i]));
    else
      kiln_literal_set_f64(lit, base + i, creal(src[i]));
  }
}

static void store_real(kiln_literal *lit, int64_t base, int64_t count, const double *src) {
  for (int64_t i = 0; i < count; i++) kiln_literal_set_f64(lit, base + i, src[i]);
}

static void store_zeros(kiln_literal *lit, int64_t base, int64_t count) {
  for (int64_t i = 0; i < count; i++) kiln_literal_set_f64(lit, base + i, 0);
}

static void put_info(kiln_literal *lit, int64_t b, int64_t info) {
  kiln_literal_set_s64(lit, b, info);
}

/* gesdd of matrix b: one-sided Jacobi on A (tall) or A^H (wide). */
static void run_gesdd(job *j, int64_t b) {
  const kiln_lapack *l = &j->l;
  int64_t m = l->m, n = l->n, mn = m < n ? m : n;
  cplx *w0 = j->w[0], *w1 = j->w[1], *w2 = j->w[2], *w3 = j->w[3];
  load(j->in[0], b * m * n, m * n, w0);
  bool tall = m >= n;
  int64_t r = tall ? m : n, c = tall ? n : m; /* the tall problem t = A or A^H */
  for (int64_t i = 0; i < m; i++)
    for (int64_t q = 0; q < n; q++)
      w1[tall ? i * n + q : q * m + i] = tall ? w0[i * n + q] : conj(w0[i * n + q]);
  double *s = (double *)(void *)w2;
  cplx *v = w3;
  tall_svd(w1, r, c, s, v);
  /* The tall side's vectors, widened to r x rc columns. */
  bool full = l->mode != 'S';
  int64_t rc = full ? r : c;
  cplx *wide = w0; /* a's values are no longer needed */
  bool *need = (bool *)(s + c);
  for (int64_t i = 0; i < r; i++)
    for (int64_t q = 0; q < rc; q++) wide[i * rc + q] = q < c ? w1[i * c + q] : 0;
  for (int64_t q = 0; q < rc; q++) need[q] = q >= c || !(s[q] > 0);
  complete_basis(wide, r, rc, need, w1);
  int64_t uc = tall ? rc : m, vr = tall ? n : rc;
  /* tall: A = wide s v^H, u = wide, vt = v^H; else A^H = wide s v^H, so
   * u = v and vt = wide^H. */
  kiln_literal *U = j->out[2], *VT = j->out[3];
  bool none = l->mode == 'N';
  for (int64_t i = 0; i < m && !none; i++)
    for (int64_t q = 0; q < uc; q++) w1[i * uc + q] = tall ? wide[i * rc + q] : v[i * c + q];
  if (none)
    store_zeros(U, b * m * uc, m * uc);
  else
    store(U, b * m * uc, m * uc, w1);
  for (int64_t i = 0; i < vr && !none; i++)
    for (int64_t q = 0; q < n; q++)
      w1[i * n + q] = tall ? conj(v[q * c + i]) : conj(wide[q * rc + i]);
  if (none)
    store_zeros(VT, b * vr * n, vr * n);
  else
    store(VT, b * vr * n, vr * n, w1);
  store_zeros(j->out[0], b * m * n, m * n);
  store_real(j->out[1], b * mn, mn, s);
  put_info(j->out[4], b, 0);
}

/* Matrix b of the batch; j->w[0..3] hold at least max(m,n)^2 + 2 max(m,n)
 * + 2 values each. */
static void run_one(job *j, int64_t b) {
  const kiln_lapack *l = &j->l;
  int64_t m = l->m, n = l->n, k = l->k, mn = m < n ? m : n;
  cplx *w0 = j->w[0], *w1 = j->w[1], *w2 = j->w[2], *w3 = j->w[3];
  switch (l->kind) {
  case KILN_LAPACK_POTRF: {
    load(j->in[0], b * n * n, n * n, w0);
    bool up = l->uplo == 'U'; /* A = U^H U: work on L = U^H */
    for (int64_t r = 0; r < n; r++)
      for (int64_t c = 0; c < n; c++) w1[r * n + c] = up ? conj(w0[c * n + r]) : w0[r * n + c];
    int64_t info = chol_lower(w1, n);
    int64_t done = info ? info - 1 : n; /* columns factored */
    for (int64_t r = 0; r < n; r++)
      for (int64_t c = 0; c < done && c <= r; c++)
        w0[up ? c * n + r : r * n + c] = up ? conj(w1[r * n + c]) : w1[r * n + c];
    store(j->out[0], b * n * n, n * n, w0);
    put_info(j->out[1], b, info);
    break;
  }
  case KILN_LAPACK_TRSM: {
    load(j->in[0], b * k * k, k * k, w0);
    load(j->in[1], b * m * n, m * n, w1);
    bool tr = l->trans != 'N', cj = l->trans == 'C', lower = l->uplo == 'L';
    /* M = op(A) with only its triangle, then for side R solve M^T X^T = B^T. */
    bool left = l->side == 'L', flip = tr != !left;
    for (int64_t r = 0; r < k; r++)
      for (int64_t c = 0; c < k; c++) {
        int64_t sr = flip ? c : r, sc = flip ? r : c; /* index into A */
        bool in_tri = lower ? sr >= sc : sr <= sc;
        cplx v = in_tri ? w0[sr * k + sc] : 0;
        if (cj) v = conj(v);
        if (sr == sc && l->diag == 'U') v = 1;
        w2[r * k + c] = v;
      }
    bool mlower = lower != flip;
    if (left) {
      tri_solve(w2, mlower, k, w1, n);
    } else {
      for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < n; c++) w3[c * m + r] = w1[r * n + c];
      tri_solve(w2, mlower, k, w3, m);
      for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < n; c++) w1[r * n + c] = w3[c * m + r];
    }
    store(j->out[0], b * m * n, m * n, w1);
    break;
  }
  case KILN_LAPACK_GETRF: {
    load(j->in[0], b * m * n, m * n, w0);
    int32_t *piv = (int32_t *)(void *)w1;
    int64_t info = lu(w0, m, n, piv);
    store(j->out[0], b * m * n, m * n, w0);
    for (int64_t i = 0; i < mn; i++) kiln_literal_set_s64(j->out[1], b * mn + i, piv[i]);
    put_info(j->out[2], b, info);
    break;
  }
  case KILN_LAPACK_GEQRF:
    load(j->in[0], b * m * n, m * n, w0);
    qr(w0, m, n, w1);
    store(j->out[0], b * m * n, m * n, w0);
    store(j->out[1], b * mn, mn, w1);
    break;
  case KILN_LAPACK_ORGQR:
    load(j->in[0], b * m * n, m * n, w0);
    load(j->in[1], b * k, k, w1);
    householder_product(w0, m, n, k, w1, w2);
    store(j->out[0], b * m * n, m * n, w2);
    break;
  case KILN_LAPACK_SYEVD: {
    load(j->in[0], b * n * n, n * n, w0);
    bool up = l->uplo == 'U';
    for (int64_t r = 0; r < n; r++) /* Hermitian, from the named triangle */
      for (int64_t c = 0; c < n; c++) {
        bool in_tri = up ? r <= c : r >= c;
        w1[r * n + c] = in_tri ? w0[r * n + c] : conj(w0[c * n + r]);
      }
    for (int64_t r = 0; r < n; r++) w1[r * n + r] = creal(w1[r * n + r]);
    double *w = (double *)(void *)w2;
    herm_eigen(w1, n, w, w3);
    if (l->mode == 'N')
      store_zeros(j->out[0], b * n * n, n * n);
    else
      store(j->out[0], b * n * n, n * n, w3);
    store_real(j->out[1], b * n, n, w);
    put_info(j->out[2], b, 0);
    break;
  }
  case KILN_LAPACK_GESDD: run_gesdd(j, b); break;
  default: break;
  }
}

int kiln__interp_eval_lapack(kiln__interp_ctx *c, const kiln_instr *ins,
                             const kiln_literal *const *ops, kiln_literal **out) {
  job j;
  memset(&j, 0, sizeof j);
  char why[256];
  if (kiln_lapack_describe(c->m, ins, &j.l, why, sizeof why))
    return kiln__interp_fail(c, ins, KILN_EINVAL, "custom-call %s: %s", ins->name, why);
  uint32_t nops = ins->noperands, nres = j.l.nargs - nops;
  for (uint32_t i = 0; i < nops; i++) j.in[i] = ops[i];
  int rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  for (uint32_t i = 0; i < nres; i++)
    j.out[i] = ins->shape.dtype == KILN_TUPLE ? (*out)->elems[i] : *out;
  int64_t big = j.l.m > j.l.n ? j.l.m : j.l.n, batch = 1;
  size_t words = (size_t)(big * big + 2 * big + 2);
  for (int w = 0; w < 4; w++)
    if ((j.w[w] = kiln_calloc(words, sizeof(cplx))) == NULL) rc = KILN_ENOMEM;
  for (uint32_t d = 0; d < j.l.nbatch; d++) batch *= j.l.batch[d];
  if (rc) rc = kiln__interp_fail(c, ins, KILN_ENOMEM, "custom-call %s: out of memory", ins->name);
  for (int64_t b = 0; rc == 0 && b < batch; b++) {
    run_one(&j, b);
    rc = kiln__interp_check_time(c, ins);
  }
  for (int w = 0; w < 4; w++) kiln_free(j.w[w]);
  if (rc) {
    kiln__interp_lit_free(c, *out);
    *out = NULL;
  }
  return rc;
}
