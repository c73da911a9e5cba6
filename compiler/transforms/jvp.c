/* Derivatives of the elementwise ops, and the generic elementwise jvp and
 * transpose built on them.
 *
 * Each kiln__d_OP(c, ins, k, v) applies the partial derivative of the
 * result with respect to operand k to v, a value shaped like the result:
 * d out / d x_k * v. The Jacobian of an elementwise op is diagonal, so the
 * same map serves forward mode (v a tangent) and reverse mode (v a
 * cotangent). Where derivatives have edge points the formulas are JAX's, so
 * that results agree with jax.grad bit for bit in spirit:
 *   abs'(0) = 1 (select(x >= 0, v, -v));
 *   maximum/minimum at a tie give each side half;
 *   sqrt'(0) = inf, rsqrt'(0) = -inf, log'(0) = inf (plain formulas);
 *   pow: d/dx = y * x^(y-1), d/dy = log(x == 0 ? 1 : x) * x^y;
 *   clamp at a bound passes nothing to any operand;
 *   sign, floor, ceil, round, compare and integer ops have zero derivative.
 */
#include "compiler/transforms/rules.h"

#define B (&c->b)

static kiln_id full(kiln__ad *c, kiln_id like, double v) { return kiln__b_full_like(B, like, v); }

kiln_id kiln__d_identity(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) { return v; }

static bool is_complex(const kiln__ad *c, kiln_id v) {
  return c->tx->err == 0 && v != KILN_NO_ID &&
         kiln_dtype_is_complex(kiln__b_shape(c->tx, v)->dtype);
}

/* On complex x, JAX's rule: d|x| = real(dx * conj(x) / |x|) (|x| = 0 read
 * as 1), transposed as ct * conj(x) / |x|. */
kiln_id kiln__d_abs(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id x = kiln__X(c, ins, 0);
  if (is_complex(c, x)) {
    kiln_id y = kiln__Y(c, ins), zero = full(c, y, 0);
    kiln_id nz = kiln__b_select(B, kiln__b_cmp(B, y, zero, KILN_CMP_EQ), full(c, y, 1), y);
    kiln_id s = kiln__b_div(B, kiln__b_conj(B, x), kiln__b_complex(B, nz, zero));
    if (is_complex(c, v)) return kiln__b_un(B, KILN_OP_REAL, kiln__b_mul(B, v, s));
    return kiln__b_mul(B, kiln__b_complex(B, v, full(c, v, 0)), s);
  }
  return kiln__b_select(B, kiln__b_cmp(B, x, full(c, x, 0), KILN_CMP_GE), v, kiln__b_neg(B, v));
}

/* JAX's transposes: real^T t = complex(t, 0), imag^T t = complex(0, -t),
 * complex^T t = (real(t), -imag(t)); so that grad of a real function of
 * z = x + iy is df/dx - i df/dy, as jax.grad gives. */
kiln_id kiln__d_real(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  if (is_complex(c, v)) return kiln__b_un(B, KILN_OP_REAL, v);
  return kiln__b_complex(B, v, full(c, v, 0));
}

kiln_id kiln__d_imag(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  if (is_complex(c, v)) return kiln__b_un(B, KILN_OP_IMAG, v);
  return kiln__b_complex(B, full(c, v, 0), kiln__b_neg(B, v));
}

kiln_id kiln__d_complex(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  if (is_complex(c, v))
    return k == 0 ? kiln__b_un(B, KILN_OP_REAL, v) : kiln__b_neg(B, kiln__b_un(B, KILN_OP_IMAG, v));
  kiln_id z = full(c, v, 0);
  return k == 0 ? kiln__b_complex(B, v, z) : kiln__b_complex(B, z, v);
}

kiln_id kiln__d_cbrt(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id y = kiln__Y(c, ins);
  return kiln__b_mul(B, v, kiln__b_div(B, full(c, y, 1.0 / 3.0), kiln__b_mul(B, y, y)));
}

kiln_id kiln__d_cos(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  return kiln__b_neg(B, kiln__b_mul(B, v, kiln__b_un(B, KILN_OP_SIN, kiln__X(c, ins, 0))));
}

kiln_id kiln__d_sin(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  return kiln__b_mul(B, v, kiln__b_un(B, KILN_OP_COS, kiln__X(c, ins, 0)));
}

kiln_id kiln__d_tan(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id y = kiln__Y(c, ins);
  return kiln__b_mul(B, v, kiln__b_add(B, full(c, y, 1), kiln__b_mul(B, y, y)));
}

kiln_id kiln__d_erf(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id x = kiln__X(c, ins, 0);
  kiln_id e = kiln__b_un(B, KILN_OP_EXP, kiln__b_neg(B, kiln__b_mul(B, x, x)));
  return kiln__b_mul(B, v, kiln__b_mul(B, full(c, x, 1.1283791670955126), e)); /* 2/sqrt(pi) */
}

kiln_id kiln__d_exp(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  return kiln__b_mul(B, v, kiln__Y(c, ins));
}

kiln_id kiln__d_expm1(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id y = kiln__Y(c, ins);
  return kiln__b_mul(B, v, kiln__b_add(B, y, full(c, y, 1)));
}

kiln_id kiln__d_log(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  return kiln__b_div(B, v, kiln__X(c, ins, 0));
}

kiln_id kiln__d_log1p(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id x = kiln__X(c, ins, 0);
  return kiln__b_div(B, v, kiln__b_add(B, x, full(c, x, 1)));
}

kiln_id kiln__d_logistic(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id y = kiln__Y(c, ins);
  return kiln__b_mul(B, kiln__b_mul(B, v, y), kiln__b_sub(B, full(c, y, 1), y));
}

kiln_id kiln__d_negate(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  return kiln__b_neg(B, v);
}

kiln_id kiln__d_reduce_precision(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  return kiln__b_clone(B, ins, &v, 1);
}

kiln_id kiln__d_rsqrt(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id x = kiln__X(c, ins, 0), y = kiln__Y(c, ins);
  return kiln__b_mul(B, v, kiln__b_mul(B, full(c, y, -0.5), kiln__b_div(B, y, x)));
}

kiln_id kiln__d_sqrt(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id y = kiln__Y(c, ins);
  return kiln__b_mul(B, v, kiln__b_div(B, full(c, y, 0.5), y));
}

kiln_id kiln__d_tanh(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id y = kiln__Y(c, ins);
  return kiln__b_mul(B, kiln__b_add(B, v, kiln__b_mul(B, v, y)), kiln__b_sub(B, full(c, y, 1), y));
}

kiln_id kiln__d_add(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) { return v; }

kiln_id kiln__d_sub(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  return k == 0 ? v : kiln__b_neg(B, v);
}

kiln_id kiln__d_mul(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  return kiln__b_mul(B, v, kiln__X(c, ins, 1 - k));
}

kiln_id kiln__d_div(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id a = kiln__X(c, ins, 0), d = kiln__X(c, ins, 1);
  if (k == 0) return kiln__b_div(B, v, d);
  kiln_id inv2 = kiln__b_div(B, full(c, d, 1), kiln__b_mul(B, d, d));
  return kiln__b_mul(B, kiln__b_mul(B, kiln__b_neg(B, v), a), inv2);
}

kiln_id kiln__d_atan2(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id a = kiln__X(c, ins, 0), b = kiln__X(c, ins, 1);
  kiln_id den = kiln__b_add(B, kiln__b_mul(B, a, a), kiln__b_mul(B, b, b));
  kiln_id num = k == 0 ? b : kiln__b_neg(B, a);
  return kiln__b_mul(B, v, kiln__b_div(B, num, den));
}

/* JAX's balanced rule: the operand equal to the result gets 1, halved when
 * the other one equals it too. */
kiln_id kiln__d_maxmin(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id y = kiln__Y(c, ins), me = kiln__X(c, ins, k), other = kiln__X(c, ins, 1 - k);
  kiln_id num = kiln__b_select(B, kiln__b_cmp(B, me, y, KILN_CMP_EQ), full(c, y, 1), full(c, y, 0));
  kiln_id den =
      kiln__b_select(B, kiln__b_cmp(B, other, y, KILN_CMP_EQ), full(c, y, 2), full(c, y, 1));
  return kiln__b_mul(B, v, kiln__b_div(B, num, den));
}

kiln_id kiln__d_pow(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id x = kiln__X(c, ins, 0), e = kiln__X(c, ins, 1), y = kiln__Y(c, ins);
  if (k == 0) {
    kiln_id em1 = kiln__b_sub(B, e, full(c, e, 1));
    return kiln__b_mul(B, v, kiln__b_mul(B, e, kiln__b_bin(B, KILN_OP_POWER, x, em1)));
  }
  kiln_id nz = kiln__b_select(B, kiln__b_cmp(B, x, full(c, x, 0), KILN_CMP_EQ), full(c, x, 1), x);
  return kiln__b_mul(B, v, kiln__b_mul(B, kiln__b_un(B, KILN_OP_LOG, nz), y));
}

kiln_id kiln__d_rem(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  if (k == 0) return v;
  kiln_id q = kiln__b_div(B, kiln__X(c, ins, 0), kiln__X(c, ins, 1));
  kiln_id t = kiln__b_mul(B, kiln__b_un(B, KILN_OP_SIGN, q),
                          kiln__b_un(B, KILN_OP_FLOOR, kiln__b_un(B, KILN_OP_ABS, q)));
  return kiln__b_mul(B, kiln__b_neg(B, v), t);
}

kiln_id kiln__d_clamp(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id y = kiln__Y(c, ins);
  kiln_id lo = kiln__b_broadcast_like(B, kiln__X(c, ins, 0), y);
  kiln_id x = kiln__X(c, ins, 1);
  kiln_id hi = kiln__b_broadcast_like(B, kiln__X(c, ins, 2), y);
  kiln_id p;
  if (k == 0)
    p = kiln__b_bin(B, KILN_OP_AND, kiln__b_cmp(B, lo, x, KILN_CMP_GT),
                    kiln__b_cmp(B, lo, hi, KILN_CMP_LT));
  else if (k == 1)
    p = kiln__b_bin(B, KILN_OP_AND, kiln__b_cmp(B, x, lo, KILN_CMP_GT),
                    kiln__b_cmp(B, x, hi, KILN_CMP_LT));
  else
    p = kiln__b_cmp(B, hi, x, KILN_CMP_LT);
  return kiln__b_select(B, p, v, full(c, v, 0));
}

kiln_id kiln__d_select(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  kiln_id p = kiln__b_broadcast_like(B, kiln__X(c, ins, 0), v), z = full(c, v, 0);
  return k == 1 ? kiln__b_select(B, p, v, z) : kiln__b_select(B, p, z, v);
}

/* ---- generic rules ------------------------------------------------------- */

static bool float_operand(const kiln__ad *c, const kiln_instr *ins, uint32_t k) {
  return kiln__b_is_float_shape(&c->tx->m->instrs[ins->operands[k]]->shape);
}

int kiln__jvp_elementwise(kiln__ad *c, const kiln_instr *ins) {
  const kiln__rule *r = &kiln__tf_rules[ins->op];
  kiln_id y = kiln__Y(c, ins), acc = KILN_NO_ID;
  for (uint32_t k = 0; k < ins->noperands && c->tx->err == 0; k++) {
    kiln_id t = kiln__T(c, ins, k);
    if (t == KILN_NO_ID || !float_operand(c, ins, k)) continue;
    kiln_id d = r->partial(c, ins, k, kiln__b_broadcast_like(B, t, y));
    acc = acc == KILN_NO_ID ? d : kiln__b_add(B, acc, d);
  }
  c->tan[kiln__ad_slot(c, ins->id)] = acc;
  return c->tx->err;
}

int kiln__vjp_elementwise(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  const kiln__rule *r = &kiln__tf_rules[ins->op];
  for (uint32_t k = 0; k < ins->noperands && c->tx->err == 0; k++) {
    if (!kiln__ad_wants(c, ins, k) || !float_operand(c, ins, k)) continue;
    kiln__ad_accum(c, ins, k,
                   kiln__b_sum_to_like(B, r->partial(c, ins, k, ct), kiln__X(c, ins, k)));
  }
  return c->tx->err;
}

/* sign(z) = z / |z| is not piecewise constant on complex values: refused
 * there rather than given a wrong zero derivative. */
static int complex_sign(kiln__ad *c, const kiln_instr *ins) {
  if (!kiln_dtype_is_complex(c->tx->m->instrs[ins->operands[0]]->shape.dtype)) return 0;
  char where[KILN_STATUS_WHERE_MAX];
  kiln_instr_where(c->tx->m, ins, where, sizeof where);
  return kiln__tx_fail(c->tx, KILN_EUNIMPL, ins,
                       "%s: op %s (%s) has no derivative rule on complex values", c->tx->name,
                       kiln_opcode_name(ins->op), where);
}

int kiln__jvp_zero(kiln__ad *c, const kiln_instr *ins) {
  c->tan[kiln__ad_slot(c, ins->id)] = KILN_NO_ID;
  return complex_sign(c, ins);
}

int kiln__vjp_zero(kiln__ad *c, const kiln_instr *ins, kiln_id ct) { return complex_sign(c, ins); }

/* v (real or complex) as type t. Complex to real keeps the real part
 * through real(), since XLA has no complex-to-real convert; this is the
 * transpose of real-to-complex, as JAX's. */
static kiln_id convert_to(kiln__ad *c, kiln_id v, kiln_dtype t) {
  if (c->tx->err == 0 && is_complex(c, v) && !kiln_dtype_is_complex(t))
    v = kiln__b_un(B, KILN_OP_REAL, v);
  return kiln__b_as(B, v, t);
}

/* convert between floating types (real or complex) is the identity on
 * tangents, rounded to the other type; from or to integers it has no
 * derivative (the activity analysis never hands it an integer result). */
int kiln__jvp_convert(kiln__ad *c, const kiln_instr *ins) {
  kiln_id t = kiln__T(c, ins, 0);
  c->tan[kiln__ad_slot(c, ins->id)] =
      float_operand(c, ins, 0) && kiln__b_is_float_shape(&ins->shape)
          ? convert_to(c, t, ins->shape.dtype)
          : KILN_NO_ID;
  return c->tx->err;
}

int kiln__vjp_convert(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  if (float_operand(c, ins, 0))
    kiln__ad_accum(c, ins, 0, convert_to(c, ct, c->tx->m->instrs[ins->operands[0]]->shape.dtype));
  return c->tx->err;
}
