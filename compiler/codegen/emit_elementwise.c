/* Elementwise ops as C expressions, with the reference interpreter's
 * semantics (compiler/eval/interp_elementwise.c): one rounding per op for
 * floats (f32 transcendentals computed in double and rounded once), except
 * the f32 exp/log/log1p/expm1/tanh/logistic/erf and atan2, computed in f32
 * by the prelude's vectorizable helpers within a few ULP (emit.h). f16 and
 * bf16 are held in f32 and computed as XLA's CPU backend computes them:
 * the op in f32 (the same helpers), its result rounded to nearest even
 * back to the narrow type by krhf/krbf before the next op reads it;
 * + - * / sqrt so come out correctly rounded, bit-equal to the
 * interpreter's, and the transcendentals within 1 unit of the narrow type;
 * the few ops with no f32 helper (cbrt, power) are computed in double and
 * rounded once (krh/krb), as the interpreter does. floor, ceil, round,
 * is-finite and float selects go through exact branch-free helpers
 * (kfloorf ... kself) so that GCC vectorizes the loops holding them;
 * integer arithmetic in unsigned types so that it wraps without undefined
 * behaviour, and
 * XLA's edges (x/0 = -1, INT_MIN/-1 = INT_MIN, x%0 = x, shifts past the
 * width, saturating float->int conversion with NaN -> 0, NaN-propagating
 * max/min/clamp, total-order comparison) through the prelude's helpers.
 * 32-bit integer division goes through double unless the divisor is a
 * constant (kdivs32v). Complex values (c64, c128) are double _Complex, each
 * c64 result rounded to float parts, for the interpreter's complex ops
 * only (c64 multiply and divide by kc64mul and kc64div, a complex select
 * by kcsel, which vectorize).
 */
#include <stdio.h>
#include <string.h>

#include "compiler/codegen/emit.h"

typedef kiln_dtype dt;

static bool is_f(dt t) { return t == KILN_F16 || t == KILN_BF16 || t == KILN_F32 || t == KILN_F64; }
static bool is_half(dt t) { return t == KILN_F16 || t == KILN_BF16; }
/* Computed in float: f32, and f16/bf16 held in f32. */
static bool in_f32(dt t) { return t == KILN_F32 || is_half(t); }
static bool is_s(dt t) { return kiln_dtype_is_signed_int(t); }

/* Unsigned type arithmetic on t is carried out in (never narrower than int,
 * so that promotions cannot overflow a signed int). */
static const char *utype(dt t) { return kiln_dtype_bits(t) > 32 ? "uint64_t" : "uint32_t"; }

/* Unsigned type of t's exact width. */
static const char *uwidth(dt t) {
  switch (kiln_dtype_bits(t)) {
  case 8: return "uint8_t";
  case 16: return "uint16_t";
  case 32: return "uint32_t";
  default: return "uint64_t";
  }
}

/* Rounds a double expression to float type t, as t's compute value:
 * "(float)krh(e)" (one rounding, straight from double). */
static void fround(dt t, const char *e, char *dst, size_t n) {
  switch (t) {
  case KILN_F16: snprintf(dst, n, "(float)krh(%s)", e); break;
  case KILN_BF16: snprintf(dst, n, "(float)krb(%s)", e); break;
  case KILN_F32: snprintf(dst, n, "(float)(%s)", e); break;
  default: snprintf(dst, n, "(%s)", e); break;
  }
}

/* Rounds a float expression to f32, f16 or bf16: "krhf(e)". */
static void fround_f(dt t, const char *e, char *dst, size_t n) {
  switch (t) {
  case KILN_F16: snprintf(dst, n, "krhf(%s)", e); break;
  case KILN_BF16: snprintf(dst, n, "krbf(%s)", e); break;
  default: snprintf(dst, n, "(%s)", e); break;
  }
}

/* Wraps an unsigned arithmetic result to t (pred: nonzero). */
static void iwrap(const kiln__emit_fn *f, dt t, const char *e, char *dst, size_t n) {
  if (t == KILN_PRED)
    snprintf(dst, n, "(uint8_t)((%s) != 0)", e);
  else
    snprintf(dst, n, "(%s)(%s)", kiln__ctype(f->mod, t), e);
}

/* ---- floats ------------------------------------------------------------- */

/* Ops exact in the operand's own type (no rounding needed). */
static const char *float_exact_unary(kiln_opcode op, dt t) {
  bool f = in_f32(t);
  switch (op) {
  case KILN_OP_ABS: return f ? "fabsf" : "fabs";
  case KILN_OP_CEIL: return f ? "kceilf" : "kceild";
  case KILN_OP_FLOOR: return f ? "kfloorf" : "kfloord";
  case KILN_OP_ROUND_AFZ: return f ? "kroundf" : "kroundd";
  case KILN_OP_ROUND_EVEN: return f ? "rintf" : "rint";
  case KILN_OP_SIGN: return f ? "ksignf" : "ksign";
  case KILN_OP_NEGATE: return "-";
  case KILN_OP_COPY: return "";
  default: return NULL;
  }
}

/* f32 ops computed in f32 by the prelude (emit.h gives their ULP bounds);
 * for f16/bf16 too, the result rounded to the narrow type. */
static const char *float_f32_unary(kiln_opcode op) {
  switch (op) {
  case KILN_OP_ERF: return "kerff";
  case KILN_OP_EXP: return "kexpf";
  case KILN_OP_EXPM1: return "kexpm1f";
  case KILN_OP_LOG: return "klogf";
  case KILN_OP_LOG1P: return "klog1pf";
  case KILN_OP_LOGISTIC: return "klogisticf";
  case KILN_OP_TANH: return "ktanhf";
  case KILN_OP_SIN: return "sinf"; /* libmvec's on x86-64 (c_target.c) */
  case KILN_OP_COS: return "cosf";
  case KILN_OP_TAN: return "tanf";
  default: return NULL;
  }
}

/* Ops computed in double and rounded once. */
static const char *float_double_unary(kiln_opcode op) {
  switch (op) {
  case KILN_OP_CBRT: return "cbrt";
  case KILN_OP_COS: return "cos";
  case KILN_OP_ERF: return "erf";
  case KILN_OP_EXP: return "exp";
  case KILN_OP_EXPM1: return "expm1";
  case KILN_OP_LOG: return "log";
  case KILN_OP_LOG1P: return "log1p";
  case KILN_OP_LOGISTIC: return "klogistic";
  case KILN_OP_RSQRT: return "krsqrt";
  case KILN_OP_SIN: return "sin";
  case KILN_OP_SQRT: return "sqrt";
  case KILN_OP_TAN: return "tan";
  case KILN_OP_TANH: return "tanh";
  default: return NULL;
  }
}

static int float_unary(kiln__emit_fn *f, const kiln_instr *ins, kiln_opcode op, const char *a, dt t,
                       char *dst, size_t n) {
  char e[512];
  const char *fn = float_exact_unary(op, t);
  if (fn) {
    snprintf(dst, n, "(%s(%s))", fn, a);
    return 0;
  }
  if (op == KILN_OP_SQRT && in_f32(t)) {
    snprintf(e, sizeof e, "sqrtf(%s)", a);
    fround_f(t, e, dst, n);
    return 0;
  }
  if (in_f32(t) && (fn = float_f32_unary(op))) {
    snprintf(e, sizeof e, "%s(%s)", fn, a);
    fround_f(t, e, dst, n);
    return 0;
  }
  if (op == KILN_OP_RSQRT && is_half(t)) {
    /* in double, vectorizable; the f32 rounding on the way is a second
     * one only for a result within 2^-25 of a narrow midpoint */
    snprintf(e, sizeof e, "(float)krsqrt((double)%s)", a);
    fround_f(t, e, dst, n);
    return 0;
  }
  if ((fn = float_double_unary(op))) {
    snprintf(e, sizeof e, "%s((double)%s)", fn, a);
    fround(t, e, dst, n);
    return 0;
  }
  if (op == KILN_OP_IS_FINITE) {
    snprintf(dst, n, "%s(%s)", t == KILN_F32 ? "kfinitef" : "kfinited", a);
    return 0;
  }
  if (op == KILN_OP_REDUCE_PRECISION) {
    long long eb = kiln_instr_attr_int(ins, KILN_ATTR_EXPONENT_BITS, 8);
    long long mb = kiln_instr_attr_int(ins, KILN_ATTR_MANTISSA_BITS, 23);
    const char *h = t == KILN_F32   ? "krpf"
                    : t == KILN_F64 ? "krpd"
                    : t == KILN_F16 ? "krph"
                                    : "krpb";
    snprintf(dst, n, "%s%s(%s, %lld, %lld)", is_half(t) ? "(float)" : "", h, a, eb, mb);
    return 0;
  }
  return kiln__emit_fail(f, ins, KILN_EINVAL, "%s %s: not defined on floating-point values",
                         kiln_opcode_name(op), ins->name);
}

static int float_binary(kiln__emit_fn *f, const kiln_instr *ins, kiln_opcode op, const char *a,
                        const char *b, dt t, char *dst, size_t n) {
  bool f32 = in_f32(t);
  char e[512];
  const char *sym = NULL;
  switch (op) {
  case KILN_OP_ADD: sym = "+"; break;
  case KILN_OP_SUBTRACT: sym = "-"; break;
  case KILN_OP_MULTIPLY: sym = "*"; break;
  case KILN_OP_DIVIDE: sym = "/"; break;
  case KILN_OP_MAXIMUM: snprintf(dst, n, "%s(%s, %s)", f32 ? "kmaxf" : "kmaxd", a, b); return 0;
  case KILN_OP_MINIMUM: snprintf(dst, n, "%s(%s, %s)", f32 ? "kminf" : "kmind", a, b); return 0;
  case KILN_OP_REMAINDER:
    if (f32) { /* exact: fmod's result is representable in the operands' type */
      snprintf(dst, n, "fmodf(%s, %s)", a, b);
      return 0;
    }
    snprintf(e, sizeof e, "fmod(%s, %s)", a, b);
    break;
  case KILN_OP_ATAN2:
    if (t == KILN_F32) { /* f32 alone: katan2f's result is not rounded to a narrower type */
      snprintf(dst, n, "katan2f(%s, %s)", a, b);
      return 0;
    }
    snprintf(e, sizeof e, "atan2((double)%s, (double)%s)", a, b);
    break;
  case KILN_OP_POWER: snprintf(e, sizeof e, "kpowd((double)%s, (double)%s)", a, b); break;
  default:
    return kiln__emit_fail(f, ins, KILN_EINVAL, "%s %s: not defined on floating-point values",
                           kiln_opcode_name(op), ins->name);
  }
  /* x / y with y the same over a row (softmax's sum): one divide a row,
   * a multiply an element (within 1.5 ulp of the quotient), unless 1 / y
   * is subnormal (flushed to 0); GCC unswitches the loop on the test. */
  if (op == KILN_OP_DIVIDE && t == KILN_F32 && f->row_invariant && ins->noperands == 2 &&
      f->row_invariant[ins->operands[1]]) {
    snprintf(dst, n, "(fabsf(%s) < 0x1p126f ? %s * (1.0f / %s) : %s / %s)", b, a, b, a, b);
    return 0;
  }
  if (sym && (t == KILN_F32 || t == KILN_F64)) {
    snprintf(dst, n, "(%s %s %s)", a, sym, b);
    return 0;
  }
  if (sym) { /* f16/bf16: in f32, correctly rounded to the narrow type */
    snprintf(e, sizeof e, "%s %s %s", a, sym, b);
    fround_f(t, e, dst, n);
    return 0;
  }
  fround(t, e, dst, n);
  return 0;
}

/* ---- integers ----------------------------------------------------------- */

static int int_unary(kiln__emit_fn *f, const kiln_instr *ins, kiln_opcode op, const char *a, dt t,
                     char *dst, size_t n) {
  const char *U = utype(t), *T = kiln__ctype(f->mod, t);
  int w = kiln_dtype_bits(t);
  char e[512];
  bool pred = t == KILN_PRED;
  switch (op) {
  case KILN_OP_COPY: snprintf(dst, n, "%s", a); return 0;
  case KILN_OP_ABS:
    if (is_s(t))
      snprintf(dst, n, "(%s)(%s < 0 ? (%s)0 - (%s)%s : (%s)%s)", T, a, U, U, a, U, a);
    else
      snprintf(dst, n, "%s", a);
    return 0;
  case KILN_OP_NEGATE:
    snprintf(e, sizeof e, "(%s)0 - (%s)%s", U, U, a);
    iwrap(f, t, e, dst, n);
    return 0;
  case KILN_OP_NOT:
    if (pred)
      snprintf(dst, n, "(uint8_t)(%s ^ 1)", a);
    else
      snprintf(dst, n, "(%s)~%s", T, a);
    return 0;
  case KILN_OP_SIGN:
    if (is_s(t))
      snprintf(dst, n, "(%s)((%s > 0) - (%s < 0))", T, a, a);
    else
      snprintf(dst, n, "(%s)(%s != 0)", T, a);
    return 0;
  case KILN_OP_POPCNT:
    if (pred) break;
    snprintf(dst, n, "(%s)%s((uint64_t)(%s)%s)", T, f->mod->target->popcount64, uwidth(t), a);
    return 0;
  case KILN_OP_CLZ:
    if (pred) break;
    snprintf(dst, n, "(%s)kclz((uint64_t)(%s)%s, %d)", T, uwidth(t), a, w);
    return 0;
  default: break;
  }
  return kiln__emit_fail(f, ins, KILN_EINVAL, "%s %s: not defined on %s values",
                         kiln_opcode_name(op), ins->name, pred ? "pred" : "integer");
}

static int int_shift(const kiln__emit_fn *f, kiln_opcode op, const char *a, const char *b, dt t,
                     char *dst, size_t n) {
  int w = kiln_dtype_bits(t);
  const char *h = op == KILN_OP_SHIFT_LEFT            ? "kshl"
                  : op == KILN_OP_SHIFT_RIGHT_LOGICAL ? "kshrl"
                                                      : "kshra";
  const char *uw = uwidth(t);
  snprintf(dst, n, "(%s)%s%d((%s)%s, (%s)%s)", kiln__ctype(f->mod, t), h, w, uw, a, uw, b);
  return 0;
}

static int int_binary(kiln__emit_fn *f, const kiln_instr *ins, kiln_opcode op, const char *a,
                      const char *b, dt t, char *dst, size_t n) {
  const char *U = utype(t);
  bool s = is_s(t), pred = t == KILN_PRED, w64 = kiln_dtype_bits(t) > 32;
  char e[512];
  const char *sym = NULL;
  switch (op) {
  case KILN_OP_ADD: sym = "+"; break;
  case KILN_OP_SUBTRACT: sym = "-"; break;
  case KILN_OP_MULTIPLY: sym = "*"; break;
  case KILN_OP_AND: sym = "&"; break;
  case KILN_OP_OR: sym = "|"; break;
  case KILN_OP_XOR: sym = "^"; break;
  case KILN_OP_MAXIMUM: snprintf(dst, n, "(%s < %s ? %s : %s)", a, b, b, a); return 0;
  case KILN_OP_MINIMUM: snprintf(dst, n, "(%s < %s ? %s : %s)", b, a, b, a); return 0;
  case KILN_OP_DIVIDE:
  case KILN_OP_REMAINDER: {
    const char *h = op == KILN_OP_DIVIDE ? "kdiv" : "krem";
    if (s && !w64)
      snprintf(e, sizeof e, "%ss32v((int32_t)%s, (int32_t)%s)", h, a, b);
    else if (s)
      snprintf(e, sizeof e, "%ss64((int64_t)%s, (int64_t)%s)", h, a, b);
    else if (!w64)
      snprintf(e, sizeof e, "%su32v((uint32_t)%s, (uint32_t)%s)", h, a, b);
    else
      snprintf(e, sizeof e, "%su64((uint64_t)%s, (uint64_t)%s)", h, a, b);
    iwrap(f, t, e, dst, n);
    return 0;
  }
  case KILN_OP_POWER:
    if (s)
      snprintf(e, sizeof e, "kipow((uint64_t)(int64_t)%s, (uint64_t)(int64_t)%s, %s < 0)", a, b, b);
    else
      snprintf(e, sizeof e, "kipow((uint64_t)%s, (uint64_t)%s, 0)", a, b);
    iwrap(f, t, e, dst, n);
    return 0;
  case KILN_OP_SHIFT_LEFT:
  case KILN_OP_SHIFT_RIGHT_LOGICAL:
  case KILN_OP_SHIFT_RIGHT_ARITH:
    if (pred) break;
    return int_shift(f, op, a, b, t, dst, n);
  default: break;
  }
  if (sym == NULL)
    return kiln__emit_fail(f, ins, KILN_EINVAL, "%s %s: not defined on %s values",
                           kiln_opcode_name(op), ins->name, pred ? "pred" : "integer");
  snprintf(e, sizeof e, "(%s)%s %s (%s)%s", U, a, sym, U, b);
  iwrap(f, t, e, dst, n);
  return 0;
}

/* ---- conversions -------------------------------------------------------- */

/* The bits of a compute value of type t, as an unsigned of t's width. */
static void to_bits(dt t, const char *a, char *dst, size_t n) {
  switch (t) {
  case KILN_F16: snprintf(dst, n, "kf2h(%s)", a); break;
  case KILN_BF16: snprintf(dst, n, "kf2b(%s)", a); break;
  case KILN_F32: snprintf(dst, n, "kf32bits(%s)", a); break;
  case KILN_F64: snprintf(dst, n, "kf64bits(%s)", a); break;
  default: snprintf(dst, n, "(%s)%s", uwidth(t), a); break;
  }
}

static void from_bits(const kiln__emit_fn *f, dt t, const char *a, char *dst, size_t n) {
  switch (t) {
  case KILN_F16: snprintf(dst, n, "kh2f((uint16_t)%s)", a); break;
  case KILN_BF16: snprintf(dst, n, "kb2f((uint16_t)%s)", a); break;
  case KILN_F32: snprintf(dst, n, "kbf32((uint32_t)%s)", a); break;
  case KILN_F64: snprintf(dst, n, "kbf64((uint64_t)%s)", a); break;
  case KILN_PRED: snprintf(dst, n, "(uint8_t)(%s != 0)", a); break;
  default: snprintf(dst, n, "(%s)%s", kiln__ctype(f->mod, t), a); break;
  }
}

/* Conversions from or to complex, as the interpreter converts: a real
 * value becomes the real part (integers reach c64 through f32), a complex
 * one gives its real part, or for pred whether it is nonzero. */
static void complex_convert(const kiln__emit_fn *f, const char *a, dt from, dt to, char *dst,
                            size_t n) {
  char e[512];
  bool cf = kiln_dtype_is_complex(from);
  if (kiln_dtype_is_complex(to)) {
    if (cf)
      snprintf(e, sizeof e, "%s", a);
    else if (!is_f(from) && to == KILN_C64)
      snprintf(e, sizeof e, "kcx((double)(float)%s, 0.0)", a);
    else
      snprintf(e, sizeof e, "kcx((double)%s, 0.0)", a);
    if (to == KILN_C64 && from != KILN_C64)
      snprintf(dst, n, "kc64r(%s)", e);
    else
      snprintf(dst, n, "%s", e);
  } else if (to == KILN_PRED) {
    snprintf(dst, n, "(uint8_t)(%s != 0)", a);
  } else if (is_f(to)) {
    snprintf(e, sizeof e, "creal(%s)", a);
    fround(to, e, dst, n);
  } else {
    snprintf(dst, n, "(%s)%s(creal(%s), %d)", kiln__ctype(f->mod, to), is_s(to) ? "kf2s" : "kf2u",
             a, kiln_dtype_bits(to));
  }
}

int kiln__emit_convert_expr(kiln__emit_fn *f, const kiln_instr *ins, const char *a, dt from, dt to,
                            char *dst, size_t n) {
  char e[512];
  if (from == to) {
    snprintf(dst, n, "%s", a);
    return 0;
  }
  if (kiln_dtype_is_complex(from) || kiln_dtype_is_complex(to)) {
    complex_convert(f, a, from, to, dst, n);
    return 0;
  }
  if (to == KILN_PRED) {
    snprintf(dst, n, "(uint8_t)(%s != 0)", a);
    return 0;
  }
  if (!is_f(to)) {
    if (!is_f(from)) {
      snprintf(dst, n, "(%s)%s", kiln__ctype(f->mod, to), a);
    } else if (is_s(to) && in_f32(from) && kiln_dtype_bits(to) <= 32) {
      snprintf(dst, n, "(%s)kf2sf(%s, %d)", kiln__ctype(f->mod, to), a, kiln_dtype_bits(to));
    } else if (is_s(to)) {
      snprintf(dst, n, "(%s)kf2s((double)%s, %d)", kiln__ctype(f->mod, to), a, kiln_dtype_bits(to));
    } else {
      snprintf(dst, n, "(%s)kf2u((double)%s, %d)", kiln__ctype(f->mod, to), a, kiln_dtype_bits(to));
    }
    return 0;
  }
  if (!is_f(from)) {
    /* Integers reach the narrow floats through f32, as XLA converts. */
    if (to == KILN_F64)
      snprintf(dst, n, "(double)%s", a);
    else if (to == KILN_F32)
      snprintf(dst, n, "(float)%s", a);
    else {
      snprintf(e, sizeof e, "(float)%s", a);
      fround_f(to, e, dst, n);
    }
    return 0;
  }
  if (to == KILN_F64) {
    snprintf(dst, n, "(double)%s", a);
    return 0;
  }
  if (from != KILN_F64) { /* between f32, f16 and bf16: one rounding from f32 */
    fround_f(to, a, dst, n);
    return 0;
  }
  fround(to, a, dst, n); /* from f64: one rounding, straight from double */
  (void)ins;
  return 0;
}

/* ---- dispatch ----------------------------------------------------------- */

static const char *cmp_sym(int64_t d) {
  static const char *const s[] = {"==", "!=", ">=", ">", "<=", "<"};
  return d >= 0 && d < 6 ? s[d] : NULL;
}

static int compare(kiln__emit_fn *f, const kiln_instr *ins, const char *const *a, dt t, char *dst,
                   size_t n) {
  const kiln_attr *d = kiln_instr_attr(ins, KILN_ATTR_DIRECTION);
  const char *sym = d ? cmp_sym(d->v.i) : NULL;
  if (sym == NULL)
    return kiln__emit_fail(f, ins, KILN_EINVAL, "compare %s needs a direction", ins->name);
  const char *type = kiln_instr_attr_str(ins, KILN_ATTR_TYPE);
  if (t == KILN_F32 && type && strcmp(type, "TOTALORDER") == 0)
    snprintf(dst, n, "(uint8_t)(ktotf(%s) %s ktotf(%s))", a[0], sym, a[1]);
  else if (is_f(t) && type && strcmp(type, "TOTALORDER") == 0)
    snprintf(dst, n, "(uint8_t)(ktot((double)%s) %s ktot((double)%s))", a[0], sym, a[1]);
  else
    snprintf(dst, n, "(uint8_t)(%s %s %s)", a[0], sym, a[1]);
  return 0;
}

static int clamp(const char *const *a, dt t, char *dst, size_t n) {
  const char *lo = a[0], *x = a[1], *hi = a[2];
  if (is_f(t))
    snprintf(dst, n, "%s(%s, %s, %s)", in_f32(t) ? "kclampf" : "kclampd", lo, x, hi);
  else
    snprintf(dst, n, "(%s < %s ? (%s < %s ? %s : %s) : (%s < %s ? %s : %s))", x, lo, lo, hi, lo, hi,
             x, hi, x, hi);
  return 0;
}

/* The interpreter's complex ops (add, subtract, multiply, divide, negate,
 * abs, real, imag, complex, EQ/NE compare), in double _Complex; a c64
 * result is rounded to float parts (kc64r). 1 when op is not one. */
static int complex_op(kiln__emit_fn *f, const kiln_instr *ins, kiln_opcode op, const char *const *a,
                      uint32_t n, dt rt, char *dst, size_t size) {
  static const char sym[] = {[KILN_OP_ADD] = '+',
                             [KILN_OP_SUBTRACT] = '-',
                             [KILN_OP_MULTIPLY] = '*',
                             [KILN_OP_DIVIDE] = '/'};
  char e[512];
  switch (op) {
  case KILN_OP_ADD:
  case KILN_OP_SUBTRACT:
  case KILN_OP_MULTIPLY:
  case KILN_OP_DIVIDE:
    if (n != 2) return 1;
    if (op == KILN_OP_MULTIPLY && rt == KILN_C64) /* C's x * y, vectorizable */
      snprintf(e, sizeof e, "kc64mul(%s, %s)", a[0], a[1]);
    else if (op == KILN_OP_DIVIDE && rt == KILN_C64) /* C's x / y, likewise */
      snprintf(e, sizeof e, "kc64div(%s, %s)", a[0], a[1]);
    else
      snprintf(e, sizeof e, "(%s %c %s)", a[0], sym[op], a[1]);
    break;
  case KILN_OP_NEGATE: snprintf(dst, size, "(-%s)", a[0]); return 0;
  case KILN_OP_COPY: snprintf(dst, size, "%s", a[0]); return 0;
  case KILN_OP_ABS:
    snprintf(e, sizeof e, "%s(%s)", rt == KILN_F32 ? "kc64abs" : "cabs", a[0]);
    fround(rt, e, dst, size);
    return 0;
  case KILN_OP_REAL:
  case KILN_OP_IMAG:
    snprintf(dst, size, "(%s)%s(%s)", kiln__ctype(f->mod, rt),
             op == KILN_OP_REAL ? "creal" : "cimag", a[0]);
    return 0;
  case KILN_OP_COMPLEX:
    if (n != 2) return 1;
    snprintf(e, sizeof e, "kcx((double)%s, (double)%s)", a[0], a[1]);
    break;
  case KILN_OP_COMPARE: {
    const kiln_attr *d = kiln_instr_attr(ins, KILN_ATTR_DIRECTION);
    if (n != 2 || d == NULL || (d->v.i != KILN_CMP_EQ && d->v.i != KILN_CMP_NE))
      return kiln__emit_fail(f, ins, KILN_EUNIMPL,
                             "compare %s: complex values compare only with EQ or NE", ins->name);
    snprintf(dst, size, "(uint8_t)(%s %s %s)", a[0], d->v.i == KILN_CMP_EQ ? "==" : "!=", a[1]);
    return 0;
  }
  default: return 1;
  }
  if (rt == KILN_C64)
    snprintf(dst, size, "kc64r(%s)", e);
  else
    snprintf(dst, size, "%s", e);
  return 0;
}

int kiln__emit_scalar_op(kiln__emit_fn *f, const kiln_instr *ins, kiln_opcode op,
                         const char *const *a, const dt *at, uint32_t n, dt rt, char *dst,
                         size_t size) {
  for (uint32_t i = 0; i < n; i++)
    if (!kiln__emit_dtype_ok(at[i]))
      return kiln__emit_fail(f, ins, KILN_EUNIMPL,
                             "the %s backend cannot compile %s %s: element type %s is not "
                             "supported",
                             f->mod->target->name, kiln_opcode_name(op), ins->name,
                             kiln_dtype_name(at[i]));
  dt t = at[0];
  bool cplx = kiln_dtype_is_complex(t) || (op == KILN_OP_COMPLEX && kiln_dtype_is_complex(rt));
  if (op == KILN_OP_BITCAST_CONVERT && (kiln_dtype_is_complex(t) || kiln_dtype_is_complex(rt)))
    cplx = true; /* refused below: no bit view of a complex value */
  if (cplx && op != KILN_OP_CONVERT && op != KILN_OP_SELECT) {
    int rc = complex_op(f, ins, op, a, n, rt, dst, size);
    if (rc <= 0) return rc;
    char where[KILN_STATUS_WHERE_MAX];
    kiln_instr_where(f->mod->m, ins, where, sizeof where);
    return kiln__emit_fail(f, ins, KILN_EUNIMPL, "the %s backend cannot compile %s %s on %s values",
                           f->mod->target->name, kiln_opcode_name(op), where, kiln_dtype_name(t));
  }
  switch (op) {
  case KILN_OP_CONVERT: return kiln__emit_convert_expr(f, ins, a[0], t, rt, dst, size);
  case KILN_OP_BITCAST_CONVERT: {
    char e[256];
    if (kiln_dtype_bits(t) != kiln_dtype_bits(rt)) break;
    to_bits(t, a[0], e, sizeof e);
    from_bits(f, rt, e, dst, size);
    return 0;
  }
  case KILN_OP_COMPARE:
    if (n != 2) break;
    return compare(f, ins, a, t, dst, size);
  case KILN_OP_SELECT:
    if (n != 3) break;
    if (is_f(at[1]))
      snprintf(dst, size, "%s(%s, %s, %s)",
               strcmp(kiln__ctype(f->mod, at[1]), "float") == 0 ? "kself" : "kseld", a[0], a[1],
               a[2]);
    else if (kiln_dtype_is_complex(at[1])) /* part by part: vectorizes */
      snprintf(dst, size, "kcsel(%s, %s, %s)", a[0], a[1], a[2]);
    else
      snprintf(dst, size, "(%s ? %s : %s)", a[0], a[1], a[2]);
    return 0;
  case KILN_OP_CLAMP:
    if (n != 3) break;
    return clamp(a, at[1], dst, size);
  case KILN_OP_IS_FINITE:
    if (!is_f(t)) break;
    return float_unary(f, ins, op, a[0], t, dst, size);
  case KILN_OP_REAL:
    if (is_f(t) || !kiln_dtype_is_complex(t)) {
      snprintf(dst, size, "%s", a[0]);
      return 0;
    }
    break;
  case KILN_OP_IMAG:
    if (is_f(t)) {
      snprintf(dst, size, "(%s)0", kiln__ctype(f->mod, t));
      return 0;
    }
    break;
  default:
    if (n == 1)
      return is_f(t) ? float_unary(f, ins, op, a[0], t, dst, size)
                     : int_unary(f, ins, op, a[0], t, dst, size);
    if (n == 2)
      return is_f(t) ? float_binary(f, ins, op, a[0], a[1], t, dst, size)
                     : int_binary(f, ins, op, a[0], a[1], t, dst, size);
    break;
  }
  char where[KILN_STATUS_WHERE_MAX];
  kiln_instr_where(f->mod->m, ins, where, sizeof where);
  return kiln__emit_fail(f, ins, KILN_EUNIMPL, "the %s backend cannot compile %s %s (%s) yet",
                         f->mod->target->name, kiln_opcode_name(op), where, kiln_dtype_name(t));
}

int kiln__emit_elementwise(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x,
                           uint32_t *var) {
  uint32_t n = ins->noperands;
  if (n < 1 || n > 3 || !kiln_shape_is_array(&ins->shape))
    return kiln__emit_fail(f, ins, KILN_EUNIMPL, "the %s backend cannot compile %s %s yet",
                           f->mod->target->name, kiln_opcode_name(ins->op), ins->name);
  char names[3][24];
  const char *a[3];
  dt at[3];
  kiln__ix scalar = {0};
  for (uint32_t j = 0; j < n; j++) {
    const kiln_instr *o = f->mod->m->instrs[ins->operands[j]];
    if (!kiln_shape_is_array(&o->shape))
      return kiln__emit_fail(f, ins, KILN_EUNIMPL, "%s %s: operand %u is not an array",
                             kiln_opcode_name(ins->op), ins->name, j);
    uint32_t v;
    bool bcast = o->shape.rank == 0 && ins->shape.rank > 0;
    int rc = kiln__emit_value1(f, o->id, bcast ? &scalar : x, &v);
    if (rc) return rc;
    snprintf(names[j], sizeof names[j], "v%u", v);
    a[j] = names[j];
    at[j] = o->shape.dtype;
  }
  char e[1024];
  int rc = kiln__emit_scalar_op(f, ins, ins->op, a, at, n, ins->shape.dtype, e, sizeof e);
  if (rc) return rc;
  *var = kiln__emit_newvar(f);
  kiln__emit_line(f, "%s v%u = %s;", kiln__ctype(f->mod, ins->shape.dtype), *var, e);
  return 0;
}
