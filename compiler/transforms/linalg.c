/* Derivatives of triangular-solve and cholesky (below).
 *
 * With M = op(a) (a or its transpose) and only a's triangle read (lower or
 * upper, its diagonal too unless unit_diagonal), the op computes
 * x = M^-1 b (left_side) or x = b M^-1 (right side). Differentiating
 * M x = b gives
 *   left:  dx = M^-1 (db - dM x)        right: dx = (db - x dM) M^-1
 * so the tangent is one more solve with the same a. Transposing:
 *   left:  ct_b = M^-T ct_x, ct_M = -ct_b x^T
 *   right: ct_b = ct_x M^-T, ct_M = -x^T ct_b
 * where M^-T is a solve with transpose_a flipped, and ct_a is ct_M (or its
 * transpose) kept on the triangle the op reads. Leading dimensions are
 * batch dimensions throughout.
 */
#include <string.h>

#include "compiler/transforms/rules.h"

#define B (&c->b)

typedef struct tri {
  bool left, lower, unit, trans;
  uint32_t r;      /* rank */
  kiln_i64s batch; /* 0 .. r-3 */
} tri;

static int tri_of(kiln__ad *c, const kiln_instr *ins, tri *t) {
  const kiln_shape *as = &c->tx->m->instrs[ins->operands[0]]->shape;
  t->left = kiln_instr_attr_int(ins, KILN_ATTR_LEFT_SIDE, 0) != 0;
  t->lower = kiln_instr_attr_int(ins, KILN_ATTR_LOWER, 0) != 0;
  t->unit = kiln_instr_attr_int(ins, KILN_ATTR_UNIT_DIAGONAL, 0) != 0;
  const char *ta = kiln_instr_attr_str(ins, KILN_ATTR_TRANSPOSE_A);
  t->trans = ta && (strcmp(ta, "TRANSPOSE") == 0 || strcmp(ta, "ADJOINT") == 0);
  t->r = as->rank;
  if (ins->noperands != 2 || t->r < 2 || !kiln_shape_is_array(as)) return kiln__ad_not_diff(c, ins);
  t->batch.n = t->r - 2;
  t->batch.v = kiln__b_i64s(c->tx, t->r);
  if (t->batch.v == NULL) return c->tx->err;
  for (uint32_t d = 0; d + 2 < t->r; d++) t->batch.v[d] = d;
  return 0;
}

/* v (shaped like a) kept on the triangle the op reads, zeros elsewhere. */
static kiln_id on_triangle(kiln__ad *c, const tri *t, kiln_id v) {
  const kiln_shape *s = kiln__b_shape(c->tx, v);
  kiln_id row = kiln__b_iota(B, KILN_S32, s->dims, s->rank, t->r - 2);
  kiln_id col = kiln__b_iota(B, KILN_S32, s->dims, s->rank, t->r - 1);
  kiln_cmp_dir dir =
      t->lower ? (t->unit ? KILN_CMP_GT : KILN_CMP_GE) : (t->unit ? KILN_CMP_LT : KILN_CMP_LE);
  return kiln__b_select(B, kiln__b_cmp(B, row, col, dir), v, kiln__b_zeros_like(B, v));
}

/* Batched matrix product of the last two dims: x^(tx) y^(ty). */
static kiln_id matmul(kiln__ad *c, const tri *t, kiln_id x, bool tx, kiln_id y, bool ty) {
  int64_t lc = tx ? t->r - 2 : t->r - 1, rc = ty ? t->r - 1 : t->r - 2;
  kiln_i64s l = {&lc, 1}, r = {&rc, 1};
  return kiln__b_dot(B, x, y, &t->batch, &l, &t->batch, &r);
}

/* A triangular-solve like ins on (a, rhs), transpose_a flipped if asked. */
static kiln_id solve(kiln__ad *c, const kiln_instr *ins, const tri *t, kiln_id a, kiln_id rhs,
                     bool flip) {
  kiln_id o[2] = {a, rhs};
  kiln_instr *s = kiln__b_clone_start(B, ins, o, 2);
  if (s == NULL) return KILN_NO_ID;
  if (flip && kiln_instr_set_attr_str(c->tx->m, s, KILN_ATTR_TRANSPOSE_A,
                                      t->trans ? "NO_TRANSPOSE" : "TRANSPOSE"))
    return kiln__tx_oom(c->tx), KILN_NO_ID;
  return kiln__b_finish(B, s);
}

int kiln__jvp_triangular_solve(kiln__ad *c, const kiln_instr *ins) {
  tri t;
  if (tri_of(c, ins, &t)) return c->tx->err;
  kiln_id x = kiln__Y(c, ins), rhs = kiln__T(c, ins, 1);
  if (kiln__T(c, ins, 0) != KILN_NO_ID) {
    kiln_id da = on_triangle(c, &t, kiln__T(c, ins, 0));
    /* left: dM x with dM = op(da); right: x dM */
    kiln_id dmx =
        t.left ? matmul(c, &t, da, t.trans, x, false) : matmul(c, &t, x, false, da, t.trans);
    rhs = rhs == KILN_NO_ID ? kiln__b_neg(B, dmx) : kiln__b_sub(B, rhs, dmx);
  }
  c->tan[kiln__ad_slot(c, ins->id)] =
      rhs == KILN_NO_ID ? KILN_NO_ID : solve(c, ins, &t, kiln__X(c, ins, 0), rhs, false);
  return c->tx->err;
}

int kiln__vjp_triangular_solve(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  tri t;
  if (tri_of(c, ins, &t)) return c->tx->err;
  kiln_id ctb = solve(c, ins, &t, kiln__X(c, ins, 0), ct, true);
  kiln__ad_accum(c, ins, 1, ctb);
  if (!kiln__ad_wants(c, ins, 0)) return c->tx->err;
  kiln_id x = kiln__Y(c, ins);
  /* ct_M = -ct_b x^T (left) or -x^T ct_b (right); ct_a = ct_M or ct_M^T,
   * written directly in the orientation a has */
  kiln_id cta;
  if (t.left)
    cta = t.trans ? matmul(c, &t, x, false, ctb, true) : matmul(c, &t, ctb, false, x, true);
  else
    cta = t.trans ? matmul(c, &t, ctb, true, x, false) : matmul(c, &t, x, true, ctb, false);
  kiln__ad_accum(c, ins, 0, on_triangle(c, &t, kiln__b_neg(B, cta)));
  return c->tx->err;
}

/* ---- cholesky ------------------------------------------------------------------
 *
 * The op reads a's lower triangle (upper=false: its upper one, which is the
 * lower triangle of a^T, giving U = L^T) and returns the factor L with
 * zeros above the diagonal. As a function of the lower triangle T of da,
 * the symmetric matrix read is S = T + T^T - diag(T), and
 *   dL = L Phi(L^-1 S L^-T),  Phi(X) = the lower triangle of X, diagonal halved.
 * Phi is its own adjoint, so for a cotangent c of L (upper part ignored)
 *   H = L^-T Phi(L^T c) L^-1,  ct_a = lower triangle of H + H^T - diag(H).
 * The upper form runs the same on transposes.
 */

static kiln_id swap_last(kiln__ad *c, const tri *t, kiln_id v) {
  int64_t *perm = kiln__b_i64s(c->tx, t->r);
  if (perm == NULL) return KILN_NO_ID;
  for (uint32_t d = 0; d < t->r; d++) perm[d] = d;
  perm[t->r - 2] = t->r - 1;
  perm[t->r - 1] = t->r - 2;
  return kiln__b_transpose(B, v, perm, t->r);
}

/* Strictly-lower part of v scaled by `off`, its diagonal by `diag`. */
static kiln_id lower_part(kiln__ad *c, const tri *t, kiln_id v, double off, double diag) {
  const kiln_shape *s = kiln__b_shape(c->tx, v);
  kiln_id row = kiln__b_iota(B, KILN_S32, s->dims, s->rank, t->r - 2);
  kiln_id col = kiln__b_iota(B, KILN_S32, s->dims, s->rank, t->r - 1);
  kiln_id z = kiln__b_zeros_like(B, v);
  kiln_id lo = off == 1 ? v : kiln__b_mul(B, v, kiln__b_full_like(B, v, off));
  kiln_id dg = diag == 1 ? v : kiln__b_mul(B, v, kiln__b_full_like(B, v, diag));
  return kiln__b_select(B, kiln__b_cmp(B, row, col, KILN_CMP_GT), lo,
                        kiln__b_select(B, kiln__b_cmp(B, row, col, KILN_CMP_EQ), dg, z));
}

/* Solves with the lower factor l: op(l) x = v (left) or x op(l) = v. */
static kiln_id lsolve(kiln__ad *c, kiln_id l, kiln_id v, bool left, bool trans) {
  kiln_id o[2] = {l, v};
  kiln_instr *s = kiln__b_start(B, KILN_OP_TRIANGULAR_SOLVE, o, 2);
  if (s == NULL) return KILN_NO_ID;
  if (kiln_instr_set_attr_int(c->tx->m, s, KILN_ATTR_LEFT_SIDE, left) ||
      kiln_instr_set_attr_int(c->tx->m, s, KILN_ATTR_LOWER, 1) ||
      kiln_instr_set_attr_str(c->tx->m, s, KILN_ATTR_TRANSPOSE_A,
                              trans ? "TRANSPOSE" : "NO_TRANSPOSE"))
    return kiln__tx_oom(c->tx), KILN_NO_ID;
  return kiln__b_finish(B, s);
}

static int chol_of(kiln__ad *c, const kiln_instr *ins, tri *t) {
  const kiln_shape *as = &c->tx->m->instrs[ins->operands[0]]->shape;
  memset(t, 0, sizeof *t);
  t->lower = kiln_instr_attr_int(ins, KILN_ATTR_LOWER, 0) != 0;
  t->r = as->rank;
  if (ins->noperands != 1 || t->r < 2 || !kiln_shape_is_array(as)) return kiln__ad_not_diff(c, ins);
  t->batch.n = t->r - 2;
  t->batch.v = kiln__b_i64s(c->tx, t->r);
  if (t->batch.v == NULL) return c->tx->err;
  for (uint32_t d = 0; d + 2 < t->r; d++) t->batch.v[d] = d;
  return 0;
}

int kiln__jvp_cholesky(kiln__ad *c, const kiln_instr *ins) {
  tri t;
  if (chol_of(c, ins, &t)) return c->tx->err;
  kiln_id l = kiln__Y(c, ins), da = kiln__ad_tmat(c, ins, 0);
  if (!t.lower) {
    l = swap_last(c, &t, l);
    da = swap_last(c, &t, da);
  }
  kiln_id tl = lower_part(c, &t, da, 1, 1);
  kiln_id s = kiln__b_sub(B, kiln__b_add(B, tl, swap_last(c, &t, tl)), lower_part(c, &t, da, 0, 1));
  kiln_id v = lsolve(c, l, lsolve(c, l, s, true, false), false, true); /* L^-1 S L^-T */
  kiln_id dl = matmul(c, &t, l, false, lower_part(c, &t, v, 1, 0.5), false);
  c->tan[kiln__ad_slot(c, ins->id)] = t.lower ? dl : swap_last(c, &t, dl);
  return c->tx->err;
}

int kiln__vjp_cholesky(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  tri t;
  if (chol_of(c, ins, &t)) return c->tx->err;
  kiln_id l = kiln__Y(c, ins);
  if (!t.lower) {
    l = swap_last(c, &t, l);
    ct = swap_last(c, &t, ct);
  }
  ct = lower_part(c, &t, ct, 1, 1); /* L is zero above the diagonal whatever a is */
  kiln_id g = lower_part(c, &t, matmul(c, &t, l, true, ct, false), 1, 0.5);
  kiln_id h = lsolve(c, l, lsolve(c, l, g, true, true), false, false); /* L^-T G L^-1 */
  kiln_id cta = lower_part(c, &t, kiln__b_add(B, h, swap_last(c, &t, h)), 1, 0.5);
  kiln__ad_accum(c, ins, 0, t.lower ? cta : swap_last(c, &t, cta));
  return c->tx->err;
}

/* ---- fft ------------------------------------------------------------------
 * fft is linear: its tangent is the same fft of the tangent (the generic
 * linear jvp). Transposes are JAX's, without conjugation: FFT and IFFT are
 * their own transposes (the DFT matrix is symmetric); RFFT is a full FFT of
 * the real input seen as complex, sliced to the n/2+1 half spectrum, so its
 * transpose pads the cotangent back to n with zeros, applies FFT and keeps
 * the real part; IRFFT's is conj(RFFT(ct) * mask / prod(fft_length)), the
 * mask 2 on half-spectrum entries that stand for a Hermitian twin too and 1
 * on DC (and on Nyquist for even n). */

static kiln_id fft_as(kiln__ad *c, const kiln_instr *ins, kiln_id x, const char *type) {
  kiln_instr *f = kiln__b_clone_start(B, ins, &x, 1);
  if (f && kiln_instr_set_attr_str(c->tx->m, f, KILN_ATTR_FFT_TYPE, type)) kiln__tx_oom(c->tx);
  return kiln__b_finish(B, f);
}

/* RFFT^T: real(FFT(ct padded to n along the last dim)). */
static kiln_id rfft_transpose(kiln__ad *c, const kiln_instr *ins, kiln_id ct, int64_t n) {
  const kiln_shape *s = kiln__b_shape(c->tx, ct);
  uint32_t r = s->rank;
  int64_t *lo = kiln__b_i64s(c->tx, r), *hi = kiln__b_i64s(c->tx, r), *in = kiln__b_i64s(c->tx, r);
  if (lo == NULL || hi == NULL || in == NULL) return KILN_NO_ID;
  for (uint32_t d = 0; d < r; d++) lo[d] = hi[d] = in[d] = 0;
  hi[r - 1] = n - s->dims[r - 1];
  kiln_id p = kiln__b_pad(B, ct, kiln__b_scalar(B, s->dtype, 0), lo, hi, in);
  return kiln__b_un(B, KILN_OP_REAL, fft_as(c, ins, p, "FFT"));
}

/* IRFFT^T: conj(RFFT(ct) * mask / prod(fft_length)). */
static kiln_id irfft_transpose(kiln__ad *c, const kiln_instr *ins, kiln_id ct,
                               const kiln_i64s *len) {
  kiln_id x = fft_as(c, ins, ct, "RFFT");
  if (c->tx->err) return KILN_NO_ID;
  const kiln_shape *xs = kiln__b_shape(c->tx, x);
  uint32_t r = xs->rank;
  int64_t m = xs->dims[r - 1], n = len->v[len->n - 1], total = 1;
  for (uint32_t i = 0; i < len->n; i++) total *= len->v[i];
  kiln_dtype rt = kiln__b_shape(c->tx, ct)->dtype;
  kiln_id i = kiln__b_iota(B, KILN_S64, &m, 1, 0);
  kiln_id single = kiln__b_cmp(B, i, kiln__b_full(B, KILN_S64, &m, 1, 0), KILN_CMP_EQ);
  if (n % 2 == 0)
    single = kiln__b_bin(
        B, KILN_OP_OR, single,
        kiln__b_cmp(B, i, kiln__b_full(B, KILN_S64, &m, 1, (double)(m - 1)), KILN_CMP_EQ));
  double one = 1.0 / (double)total;
  kiln_id mask = kiln__b_select(B, single, kiln__b_full(B, rt, &m, 1, one),
                                kiln__b_full(B, rt, &m, 1, 2 * one));
  kiln_id cm = kiln__b_complex(B, mask, kiln__b_full(B, rt, &m, 1, 0));
  int64_t last = (int64_t)r - 1;
  kiln_id bm = kiln__b_broadcast(B, cm, xs->dims, r, &last, 1);
  return kiln__b_conj(B, kiln__b_mul(B, x, bm));
}

int kiln__vjp_fft(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  const char *type = kiln_instr_attr_str(ins, KILN_ATTR_FFT_TYPE);
  const kiln_i64s *len = kiln_instr_attr_ints(ins, KILN_ATTR_FFT_LENGTH);
  const kiln_shape *xs = &c->tx->m->instrs[ins->operands[0]]->shape;
  if (type == NULL || len == NULL || len->n < 1 || len->n > xs->rank || ins->noperands != 1)
    return kiln__ad_not_diff(c, ins);
  kiln_id g;
  if (strcmp(type, "FFT") == 0 || strcmp(type, "IFFT") == 0)
    g = kiln__b_clone_same(B, ins, &ct, 1);
  else if (strcmp(type, "RFFT") == 0)
    g = rfft_transpose(c, ins, ct, len->v[len->n - 1]);
  else if (strcmp(type, "IRFFT") == 0)
    g = irfft_transpose(c, ins, ct, len);
  else
    return kiln__ad_not_diff(c, ins);
  kiln__ad_accum(c, ins, 0, g);
  return c->tx->err;
}
