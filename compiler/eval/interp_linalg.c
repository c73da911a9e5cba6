/* Linear algebra and normalization ops, computed plainly in double and
 * rounded once when stored: cholesky, triangular-solve, fft (naive DFT per
 * transformed dim), and batch-norm inference / training / grad.
 *
 * cholesky reads only the triangle it is asked for and writes zeros in the
 * other one; a matrix that is not positive definite yields NaN from the first
 * failing pivot on. triangular-solve reads only the triangle `lower` names.
 * IFFT and IRFFT scale by 1/N, as XLA's do.
 */
#include <complex.h>
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/eval/interp_internal.h"

static int bad(kiln__interp_ctx *c, const kiln_instr *ins, const char *what) {
  return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: %s", kiln_opcode_name(ins->op), ins->name,
                           what);
}

static int real_float(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *a) {
  int rc = kiln__interp_need_array(c, ins, a, "operand");
  if (rc == 0 &&
      (!kiln_dtype_is_float(a->shape.dtype) || !kiln__interp_dtype_computable(a->shape.dtype)))
    rc = kiln__interp_fail(c, ins, KILN_EUNIMPL,
                           "%s %s: supported on real floating-point "
                           "values only",
                           kiln_opcode_name(ins->op), ins->name);
  return rc;
}

/* ---- cholesky ----------------------------------------------------------- */

int kiln__interp_eval_cholesky(kiln__interp_ctx *c, const kiln_instr *ins,
                               const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  int rc = real_float(c, ins, a);
  if (rc) return rc;
  const kiln_shape *s = &a->shape;
  if (s->rank < 2 || s->dims[s->rank - 1] != s->dims[s->rank - 2] ||
      !kiln__interp_same_dims(s, &ins->shape))
    return bad(c, ins, "needs square matrices and a result of the same shape");
  bool lower = kiln_instr_attr_int(ins, KILN_ATTR_LOWER, 0) != 0;
  int64_t n = s->dims[s->rank - 1], mats = n ? kiln_literal_elements(a) / (n * n) : 0;
  double *l = kiln_calloc((size_t)(n * n > 0 ? n * n : 1), sizeof *l);
  if (l == NULL) return kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  rc = kiln__interp_lit_result(c, ins, out);
  for (int64_t m = 0; rc == 0 && m < mats; m++) {
    int64_t base = m * n * n;
    memset(l, 0, (size_t)(n * n) * sizeof *l);
    /* Work on the lower factor; an upper request reads and writes transposed. */
#define A_(i, j) kiln_literal_get_f64(a, base + (lower ? (i)*n + (j) : (j)*n + (i)))
    for (int64_t j = 0; j < n; j++) {
      double d = A_(j, j);
      for (int64_t k = 0; k < j; k++) d -= l[j * n + k] * l[j * n + k];
      double djj = d > 0 ? sqrt(d) : NAN;
      l[j * n + j] = djj;
      for (int64_t i = j + 1; i < n; i++) {
        double v = A_(i, j);
        for (int64_t k = 0; k < j; k++) v -= l[i * n + k] * l[j * n + k];
        l[i * n + j] = v / djj;
      }
    }
#undef A_
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < n; j++)
        kiln_literal_set_f64(*out, base + (lower ? i * n + j : j * n + i), l[i * n + j]);
  }
  kiln_free(l);
  return rc;
}

/* ---- triangular-solve --------------------------------------------------- */

int kiln__interp_eval_triangular_solve(kiln__interp_ctx *c, const kiln_instr *ins,
                                       const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0], *b = ops[1];
  int rc = real_float(c, ins, a);
  if (rc == 0) rc = real_float(c, ins, b);
  if (rc) return rc;
  const kiln_shape *as = &a->shape, *bs = &b->shape;
  bool left = kiln_instr_attr_int(ins, KILN_ATTR_LEFT_SIDE, 0) != 0;
  bool lower = kiln_instr_attr_int(ins, KILN_ATTR_LOWER, 0) != 0;
  bool unit = kiln_instr_attr_int(ins, KILN_ATTR_UNIT_DIAGONAL, 0) != 0;
  const char *ta = kiln_instr_attr_str(ins, KILN_ATTR_TRANSPOSE_A);
  bool trans = ta && (strcmp(ta, "TRANSPOSE") == 0 || strcmp(ta, "ADJOINT") == 0);
  if (as->rank < 2 || bs->rank != as->rank || !kiln__interp_same_dims(bs, &ins->shape))
    return bad(c, ins, "needs a and b of equal rank >= 2 and a result shaped like b");
  uint32_t r = as->rank;
  int64_t m = as->dims[r - 1], rows = bs->dims[r - 2], cols = bs->dims[r - 1];
  if (as->dims[r - 2] != m || (left ? rows : cols) != m)
    return bad(c, ins, "a must be square and match b's solved dim");
  for (uint32_t d = 0; d + 2 < r; d++)
    if (as->dims[d] != bs->dims[d]) return bad(c, ins, "batch dims differ");
  int64_t nb = m ? kiln_literal_elements(a) / (m * m) : 0, nrhs = left ? cols : rows;
  double *y = kiln_calloc((size_t)(m > 0 ? m : 1), sizeof *y);
  if (y == NULL) return kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  rc = kiln__interp_lit_result(c, ins, out);
  /* Solve M y = c per right-hand side, M = op(a) (left) or op(a)^T (right);
   * M is lower triangular when exactly one of these flips is absent. */
  bool flip = trans != !left;
  bool mlower = lower != flip;
  for (int64_t bi = 0; rc == 0 && bi < nb; bi++) {
    int64_t abase = bi * m * m, bbase = bi * rows * cols;
    for (int64_t q = 0; q < nrhs; q++) {
#define M_(i, k) kiln_literal_get_f64(a, abase + (flip ? (k)*m + (i) : (i)*m + (k)))
#define B_(i) (left ? bbase + (i)*cols + q : bbase + q * cols + (i))
      for (int64_t step = 0; step < m; step++) {
        int64_t i = mlower ? step : m - 1 - step;
        double v = kiln_literal_get_f64(b, B_(i));
        for (int64_t k = 0; k < m; k++) {
          bool solved = mlower ? k < i : k > i;
          if (solved) v -= M_(i, k) * y[k];
        }
        y[i] = unit ? v : v / M_(i, i);
      }
      for (int64_t i = 0; i < m; i++) kiln_literal_set_f64(*out, B_(i), y[i]);
#undef M_
#undef B_
    }
  }
  kiln_free(y);
  return rc;
}

/* ---- fft ---------------------------------------------------------------- */

/* exp(sign * 2 pi i t / n), exact at quarter turns so that transforms of
 * small integer signals come out exact. */
static double complex twiddle(int sign, int64_t t, int64_t n) {
  if ((4 * t) % n == 0) {
    static const double complex quarter[4] = {1, I, -1, -I};
    int64_t q = (4 * t) / n;
    return quarter[(sign > 0 ? q : 4 - q) % 4];
  }
  return cexp(sign * 2.0 * M_PI * I * (double)t / (double)n);
}

/* In-place DFT of every line along dim d of a row-major complex array. */
static int dft_dim(double complex *x, const int64_t *dims, uint32_t rank, uint32_t d, int sign,
                   int64_t use) {
  int64_t n = dims[d], stride = 1, outer = 1;
  for (uint32_t k = d + 1; k < rank; k++) stride *= dims[k];
  for (uint32_t k = 0; k < d; k++) outer *= dims[k];
  double complex *line = kiln_calloc((size_t)(n > 0 ? n : 1), sizeof *line);
  if (line == NULL) return KILN_ENOMEM;
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t s = 0; s < stride; s++) {
      double complex *p = x + o * n * stride + s;
      for (int64_t k = 0; k < n; k++) {
        double complex acc = 0;
        for (int64_t j = 0; j < use; j++) acc += p[j * stride] * twiddle(sign, (j * k) % n, n);
        line[k] = acc;
      }
      for (int64_t k = 0; k < n; k++) p[k * stride] = line[k];
    }
  }
  kiln_free(line);
  return 0;
}

int kiln__interp_eval_fft(kiln__interp_ctx *c, const kiln_instr *ins,
                          const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  const kiln_shape *s = &ins->shape;
  int rc = kiln__interp_need_array(c, ins, a, "operand");
  if (rc) return rc;
  const char *type = kiln_instr_attr_str(ins, KILN_ATTR_FFT_TYPE);
  const kiln_i64s *len = kiln_instr_attr_ints(ins, KILN_ATTR_FFT_LENGTH);
  int kind = !type                    ? -1
             : !strcmp(type, "FFT")   ? 0
             : !strcmp(type, "IFFT")  ? 1
             : !strcmp(type, "RFFT")  ? 2
             : !strcmp(type, "IRFFT") ? 3
                                      : -1;
  uint32_t r = a->shape.rank;
  if (kind < 0 || len == NULL || len->n < 1 || len->n > r || s->rank != r)
    return bad(c, ins, "needs fft_type and fft_length over the innermost dims");
  if (!kiln__interp_dtype_computable(a->shape.dtype) || !kiln__interp_dtype_computable(s->dtype))
    return bad(c, ins, "element types have no values");
  /* Work on the full (uncompressed) complex array of the transformed shape. */
  int64_t dims[KILN_INTERP_MAX_RANK], total = 1;
  for (uint32_t d = 0; d < r; d++) {
    bool t = d + len->n >= r;
    int64_t want = t ? len->v[d + len->n - r] : a->shape.dims[d];
    dims[d] = want;
    total *= want;
    int64_t in = a->shape.dims[d], o = s->dims[d];
    bool last = d + 1 == r;
    bool ok = in == (kind == 3 && last ? want / 2 + 1 : want) &&
              o == (kind == 2 && last ? want / 2 + 1 : want);
    if (!ok) return bad(c, ins, "operand or result dims do not match fft_length");
  }
  double complex *x = kiln_calloc((size_t)(total > 0 ? total : 1), sizeof *x);
  if (x == NULL) return kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  int64_t idx[KILN_INTERP_MAX_RANK] = {0}, ast[KILN_INTERP_MAX_RANK];
  kiln__interp_strides(&a->shape, ast);
  int64_t n_last = dims[r - 1], half = kind == 3 ? a->shape.dims[r - 1] : n_last;
  for (int64_t i = 0; i < total; i++) {
    int64_t k = idx[r - 1];
    if (k < half) {
      double re, im;
      kiln_literal_get_c128(a, kiln__interp_linear(idx, ast, r), &re, &im);
      x[i] = CMPLX(re, im);
    }
    kiln__interp_next_index(idx, dims, r);
  }
  int sign = kind == 0 || kind == 2 ? -1 : 1;
  double scale = 1;
  for (uint32_t d = r - len->n; rc == 0 && d < r; d++) {
    if (kind == 3 && d + 1 == r) continue; /* the real axis goes last */
    rc = dft_dim(x, dims, r, d, sign, dims[d]);
    scale *= (double)dims[d];
  }
  if (rc == 0 && kind == 3) {
    /* Complete the Hermitian half spectrum along the last dim, then invert. */
    int64_t lines = total / (n_last ? n_last : 1);
    for (int64_t l = 0; l < lines; l++)
      for (int64_t k = half; k < n_last; k++) x[l * n_last + k] = conj(x[l * n_last + n_last - k]);
    rc = dft_dim(x, dims, r, r - 1, sign, n_last);
    scale *= (double)n_last;
  }
  if (rc == 0)
    rc = kiln__interp_lit_result(c, ins, out);
  else
    kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  if (rc == 0) {
    int64_t o[KILN_INTERP_MAX_RANK] = {0}, fst[KILN_INTERP_MAX_RANK],
            n = kiln_literal_elements(*out);
    kiln_shape fs = {.dtype = KILN_C128, .rank = r, .dims = dims};
    kiln__interp_strides(&fs, fst);
    for (int64_t i = 0; i < n; i++) {
      double complex v = x[kiln__interp_linear(o, fst, r)];
      if (kind == 1 || kind == 3) v /= scale;
      kiln_literal_set_c128(*out, i, creal(v), cimag(v));
      kiln__interp_next_index(o, s->dims, r);
    }
  }
  kiln_free(x);
  return rc;
}

/* ---- batch norm --------------------------------------------------------- */

typedef struct bn {
  int64_t fi, nf, inner, outer, per; /* feature index, count; layout around it */
} bn;

static int bn_plan(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *x,
                   const kiln_literal *const *vecs, uint32_t nvec, bn *p) {
  int rc = real_float(c, ins, x);
  if (rc) return rc;
  p->fi = kiln_instr_attr_int(ins, KILN_ATTR_FEATURE_INDEX, -1);
  if (p->fi < 0 || p->fi >= x->shape.rank) return bad(c, ins, "feature_index out of range");
  p->nf = x->shape.dims[p->fi];
  p->inner = 1;
  p->outer = 1;
  for (uint32_t d = 0; d < x->shape.rank; d++) {
    if (d > p->fi) p->inner *= x->shape.dims[d];
    if (d < p->fi) p->outer *= x->shape.dims[d];
  }
  p->per = p->inner * p->outer;
  for (uint32_t k = 0; k < nvec; k++) {
    rc = real_float(c, ins, vecs[k]);
    if (rc) return rc;
    if (vecs[k]->shape.rank != 1 || vecs[k]->shape.dims[0] != p->nf)
      return bad(c, ins, "scale, offset, mean and variance must have one entry per feature");
  }
  return 0;
}

static int64_t bn_at(const bn *p, int64_t f, int64_t j) {
  return (j / p->inner) * p->nf * p->inner + f * p->inner + j % p->inner;
}

static int bn_result(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *x,
                     uint32_t nparts, kiln_literal **out) {
  const kiln_shape *s = &ins->shape;
  bool ok = nparts == 1 ? kiln__interp_same_dims(s, &x->shape) && kiln_shape_is_array(s)
                        : kiln_shape_is_tuple(s) && s->rank == nparts &&
                              kiln__interp_same_dims(&s->tuple[0], &x->shape);
  for (uint32_t k = 1; ok && k < nparts; k++)
    ok = kiln_shape_is_array(&s->tuple[k]) && s->tuple[k].rank == 1 &&
         s->tuple[k].dims[0] == x->shape.dims[kiln_instr_attr_int(ins, KILN_ATTR_FEATURE_INDEX, 0)];
  if (!ok) return bad(c, ins, "result shape does not match the operand");
  return kiln__interp_lit_result(c, ins, out);
}

int kiln__interp_eval_batch_norm_inference(kiln__interp_ctx *c, const kiln_instr *ins,
                                           const kiln_literal *const *ops, kiln_literal **out) {
  bn p;
  const kiln_literal *x = ops[0];
  int rc = bn_plan(c, ins, x, ops + 1, 4, &p);
  if (rc == 0) rc = bn_result(c, ins, x, 1, out);
  if (rc) return rc;
  double eps =
      kiln_instr_attr(ins, KILN_ATTR_EPSILON) ? kiln_instr_attr(ins, KILN_ATTR_EPSILON)->v.f : 0;
  for (int64_t f = 0; f < p.nf; f++) {
    double sc = kiln_literal_get_f64(ops[1], f), off = kiln_literal_get_f64(ops[2], f);
    double mean = kiln_literal_get_f64(ops[3], f), var = kiln_literal_get_f64(ops[4], f);
    for (int64_t j = 0; j < p.per; j++) {
      int64_t i = bn_at(&p, f, j);
      double v = kiln_literal_get_f64(x, i);
      kiln_literal_set_f64(*out, i, sc * (v - mean) / sqrt(var + eps) + off);
    }
  }
  return 0;
}

int kiln__interp_eval_batch_norm_training(kiln__interp_ctx *c, const kiln_instr *ins,
                                          const kiln_literal *const *ops, kiln_literal **out) {
  bn p;
  const kiln_literal *x = ops[0];
  int rc = bn_plan(c, ins, x, ops + 1, 2, &p);
  if (rc == 0) rc = bn_result(c, ins, x, 3, out);
  if (rc) return rc;
  double eps =
      kiln_instr_attr(ins, KILN_ATTR_EPSILON) ? kiln_instr_attr(ins, KILN_ATTR_EPSILON)->v.f : 0;
  for (int64_t f = 0; f < p.nf; f++) {
    double sum = 0, sq = 0;
    for (int64_t j = 0; j < p.per; j++) sum += kiln_literal_get_f64(x, bn_at(&p, f, j));
    double mean = p.per ? sum / (double)p.per : 0;
    for (int64_t j = 0; j < p.per; j++) {
      double d = kiln_literal_get_f64(x, bn_at(&p, f, j)) - mean;
      sq += d * d;
    }
    double var = p.per ? sq / (double)p.per : 0;
    double sc = kiln_literal_get_f64(ops[1], f), off = kiln_literal_get_f64(ops[2], f);
    for (int64_t j = 0; j < p.per; j++) {
      int64_t i = bn_at(&p, f, j);
      double v = kiln_literal_get_f64(x, i);
      kiln_literal_set_f64((*out)->elems[0], i, sc * (v - mean) / sqrt(var + eps) + off);
    }
    kiln_literal_set_f64((*out)->elems[1], f, mean);
    kiln_literal_set_f64((*out)->elems[2], f, var);
  }
  return 0;
}

int kiln__interp_eval_batch_norm_grad(kiln__interp_ctx *c, const kiln_instr *ins,
                                      const kiln_literal *const *ops, kiln_literal **out) {
  bn p;
  const kiln_literal *x = ops[0], *dy = ops[4];
  int rc = bn_plan(c, ins, x, ops + 1, 3, &p);
  if (rc == 0 &&
      (!kiln_shape_is_array(&dy->shape) || !kiln__interp_same_dims(&dy->shape, &x->shape)))
    rc = bad(c, ins, "grad_output must be shaped like the operand");
  if (rc == 0) rc = bn_result(c, ins, x, 3, out);
  if (rc) return rc;
  double eps =
      kiln_instr_attr(ins, KILN_ATTR_EPSILON) ? kiln_instr_attr(ins, KILN_ATTR_EPSILON)->v.f : 0;
  double n = (double)p.per;
  for (int64_t f = 0; f < p.nf; f++) {
    double sc = kiln_literal_get_f64(ops[1], f), mean = kiln_literal_get_f64(ops[2], f);
    double var = kiln_literal_get_f64(ops[3], f), rs = 1.0 / sqrt(var + eps);
    double sdy = 0, sdyx = 0;
    for (int64_t j = 0; j < p.per; j++) {
      int64_t i = bn_at(&p, f, j);
      double g = kiln_literal_get_f64(dy, i);
      sdy += g;
      sdyx += g * (kiln_literal_get_f64(x, i) - mean);
    }
    for (int64_t j = 0; j < p.per; j++) {
      int64_t i = bn_at(&p, f, j);
      double g = kiln_literal_get_f64(dy, i), xc = kiln_literal_get_f64(x, i) - mean;
      double gx = n > 0 ? sc * rs / n * (n * g - sdy - xc * sdyx / (var + eps)) : 0;
      kiln_literal_set_f64((*out)->elems[0], i, gx);
    }
    kiln_literal_set_f64((*out)->elems[1], f, sdyx * rs);
    kiln_literal_set_f64((*out)->elems[2], f, sdy);
  }
  return 0;
}
