/* Element semantics: every elementwise op on one kiln__interp_scalar, and the
 * array drivers built on it (elementwise ops, map, bitcast-convert).
 *
 * Floats are computed in double and rounded once to the result type, which
 * is what XLA does for f16/bf16 (compute wider, round to nearest even after
 * every op) and what IEEE gives for f32 add/sub/mul/div/sqrt (double has more
 * than twice f32's precision, so the double result rounds to the correctly
 * rounded f32). Transcendentals use the C library in double. Integers are
 * computed in 64-bit unsigned arithmetic and wrapped to the type's width, with
 * XLA's definitions at the edges: x/0 = -1 (all ones), INT_MIN/-1 = INT_MIN,
 * x%0 = x, INT_MIN%-1 = 0, shifts by >= width give 0 (or the sign fill for an
 * arithmetic right shift). Complex numbers support the arithmetic ops
 * (add, subtract, multiply, divide, negate, abs), real/imag/complex,
 * EQ/NE comparison and conversion; other ops on complex are refused.
 */
#include <complex.h>
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/fp16.h"
#include "compiler/eval/interp_internal.h"

/* ---- type helpers ------------------------------------------------------- */

static int float_format(kiln_dtype t, int *e, int *m) {
  switch (t) {
  case KILN_F16: *e = 5, *m = 10; return 1;
  case KILN_BF16: *e = 8, *m = 7; return 1;
  case KILN_F32: *e = 8, *m = 23; return 1;
  case KILN_F64: *e = 11, *m = 52; return 1;
  case KILN_F8E5M2: *e = 5, *m = 2; return 1;
  case KILN_F8E4M3: *e = 4, *m = 3; return 1;
  case KILN_F8E3M4: *e = 3, *m = 4; return 1;
  default: return 0;
  }
}

bool kiln__interp_dtype_computable(kiln_dtype t) {
  int e, m;
  switch (kiln_dtype_kind_of(t)) {
  case KILN_KIND_PRED:
  case KILN_KIND_SINT:
  case KILN_KIND_UINT:
  case KILN_KIND_COMPLEX: return true;
  case KILN_KIND_FLOAT: return float_format(t, &e, &m);
  default: return false;
  }
}

/* Rounds a double to the nearest value of float type t (ties to even). */
static double round_to(kiln_dtype t, double x) {
  switch (t) {
  case KILN_F64: return x;
  case KILN_F32:
  case KILN_C64: return (double)(float)x;
  case KILN_C128: return x;
  default: {
    int e, m;
    if (float_format(t, &e, &m)) return kiln_round_to_format(x, e, m);
    return x;
  }
  }
}

static uint64_t width_mask(int w) { return w >= 64 ? UINT64_MAX : (UINT64_C(1) << w) - 1; }

/* An integer (or pred) scalar of type t from raw two's complement bits. */
static kiln__interp_scalar mk_int(kiln_dtype t, uint64_t bits) {
  kiln__interp_scalar r = {.t = t};
  int w = kiln_dtype_bits(t);
  if (t == KILN_PRED) {
    r.v.u = bits != 0;
  } else if (kiln_dtype_is_signed_int(t)) {
    uint64_t m = width_mask(w);
    bits &= m;
    if (w < 64 && (bits >> (w - 1))) bits |= ~m;
    r.v.s = (int64_t)bits;
  } else {
    r.v.u = bits & width_mask(w);
  }
  return r;
}

static kiln__interp_scalar mk_float(kiln_dtype t, double x) {
  kiln__interp_scalar r = {.t = t};
  r.v.f = round_to(t, x);
  return r;
}

static kiln__interp_scalar mk_complex(kiln_dtype t, double re, double im) {
  kiln__interp_scalar r = {.t = t};
  r.v.f = round_to(t, re);
  r.im = round_to(t, im);
  return r;
}

static uint64_t int_bits(kiln__interp_scalar v) {
  return kiln_dtype_is_signed_int(v.t) ? (uint64_t)v.v.s : v.v.u;
}

kiln__interp_scalar kiln__interp_scalar_zero(kiln_dtype t) {
  kiln__interp_scalar r = {.t = t};
  return r;
}

kiln__interp_scalar kiln__interp_scalar_load(const kiln_literal *lit, int64_t i) {
  kiln__interp_scalar r = {.t = lit->shape.dtype};
  switch (kiln_dtype_kind_of(r.t)) {
  case KILN_KIND_SINT: r.v.s = kiln_literal_get_s64(lit, i); break;
  case KILN_KIND_PRED:
  case KILN_KIND_UINT: r.v.u = kiln_literal_get_u64(lit, i); break;
  case KILN_KIND_COMPLEX: kiln_literal_get_c128(lit, i, &r.v.f, &r.im); break;
  default: r.v.f = kiln_literal_get_f64(lit, i); break;
  }
  return r;
}

void kiln__interp_scalar_store(kiln_literal *lit, int64_t i, kiln__interp_scalar v) {
  kiln_dtype t = lit->shape.dtype;
  if (v.t != t) v = kiln__interp_scalar_convert(v, t);
  switch (kiln_dtype_kind_of(t)) {
  case KILN_KIND_SINT: kiln_literal_set_s64(lit, i, v.v.s); break;
  case KILN_KIND_PRED:
  case KILN_KIND_UINT: kiln_literal_set_u64(lit, i, v.v.u); break;
  case KILN_KIND_COMPLEX: kiln_literal_set_c128(lit, i, v.v.f, v.im); break;
  default: kiln_literal_set_f64(lit, i, v.v.f); break;
  }
}

static double as_double(kiln__interp_scalar v) {
  switch (kiln_dtype_kind_of(v.t)) {
  case KILN_KIND_SINT: return (double)v.v.s;
  case KILN_KIND_PRED:
  case KILN_KIND_UINT: return (double)v.v.u;
  default: return v.v.f;
  }
}

/* Float -> integer as XLA's convert: truncate toward zero, saturate at the
 * type's range, NaN -> 0. */
static kiln__interp_scalar float_to_int(double x, kiln_dtype to) {
  int w = kiln_dtype_bits(to);
  if (isnan(x)) return mk_int(to, 0);
  if (kiln_dtype_is_signed_int(to)) {
    double hi = ldexp(1.0, w - 1); /* exclusive */
    if (x >= hi) return mk_int(to, width_mask(w - 1));
    if (x <= -hi) return mk_int(to, (uint64_t)1 << (w - 1));
    return mk_int(to, (uint64_t)(int64_t)trunc(x));
  }
  if (x <= 0) return mk_int(to, 0);
  if (x >= ldexp(1.0, w)) return mk_int(to, width_mask(w));
  return mk_int(to, (uint64_t)trunc(x));
}

/* Integer -> float in one rounding for f32/f64; narrower floats go through
 * f32 as XLA's conversions do. */
static double int_to_float(kiln__interp_scalar v, kiln_dtype to) {
  bool s = kiln_dtype_is_signed_int(v.t);
  if (to == KILN_F64 || to == KILN_C128) return s ? (double)v.v.s : (double)v.v.u;
  float f = s ? (float)v.v.s : (float)v.v.u;
  return round_to(to, (double)f);
}

kiln__interp_scalar kiln__interp_scalar_convert(kiln__interp_scalar v, kiln_dtype to) {
  if (v.t == to) return v;
  kiln_dtype_kind fk = kiln_dtype_kind_of(v.t), tk = kiln_dtype_kind_of(to);
  bool from_int = fk == KILN_KIND_SINT || fk == KILN_KIND_UINT || fk == KILN_KIND_PRED;
  switch (tk) {
  case KILN_KIND_PRED:
    if (fk == KILN_KIND_COMPLEX) return mk_int(to, v.v.f != 0 || v.im != 0);
    if (fk == KILN_KIND_FLOAT) return mk_int(to, v.v.f != 0);
    return mk_int(to, int_bits(v) != 0);
  case KILN_KIND_SINT:
  case KILN_KIND_UINT:
    if (from_int) return mk_int(to, int_bits(v));
    return float_to_int(v.v.f, to);
  case KILN_KIND_FLOAT:
    if (from_int) return mk_float(to, int_to_float(v, to));
    return mk_float(to, v.v.f);
  case KILN_KIND_COMPLEX:
    if (fk == KILN_KIND_COMPLEX) return mk_complex(to, v.v.f, v.im);
    if (from_int) return mk_complex(to, int_to_float(v, to == KILN_C64 ? KILN_F32 : KILN_F64), 0);
    return mk_complex(to, v.v.f, 0);
  default: return kiln__interp_scalar_zero(to);
  }
}

int64_t kiln__interp_scalar_as_s64(kiln__interp_scalar v) {
  switch (kiln_dtype_kind_of(v.t)) {
  case KILN_KIND_SINT: return v.v.s;
  case KILN_KIND_PRED:
  case KILN_KIND_UINT: return v.v.u > INT64_MAX ? INT64_MAX : (int64_t)v.v.u;
  default: return float_to_int(v.v.f, KILN_S64).v.s;
  }
}

bool kiln__interp_scalar_truthy(kiln__interp_scalar v) {
  switch (kiln_dtype_kind_of(v.t)) {
  case KILN_KIND_SINT:
  case KILN_KIND_PRED:
  case KILN_KIND_UINT: return int_bits(v) != 0;
  case KILN_KIND_COMPLEX: return v.v.f != 0 || v.im != 0;
  default: return v.v.f != 0;
  }
}

/* ---- comparison --------------------------------------------------------- */

/* The IEEE total order as a signed integer key:
 * -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN. */
static int64_t total_order_key(double x) {
  uint64_t b;
  memcpy(&b, &x, sizeof b);
  int64_t k = (int64_t)b;
  return k < 0 ? k ^ INT64_MAX : k;
}

static int compare(const kiln_instr *ins, kiln__interp_scalar a, kiln__interp_scalar b, bool *out,
                   const char **why) {
  const kiln_attr *d = kiln_instr_attr(ins, KILN_ATTR_DIRECTION);
  if (d == NULL) {
    *why = "compare needs a direction";
    return KILN_EINVAL;
  }
  const char *type = kiln_instr_attr_str(ins, KILN_ATTR_TYPE);
  kiln_dtype_kind k = kiln_dtype_kind_of(a.t);
  int c; /* -1, 0, 1; 2 = unordered */
  if (k == KILN_KIND_COMPLEX) {
    if (d->v.i != KILN_CMP_EQ && d->v.i != KILN_CMP_NE) {
      *why = "complex values compare only with EQ or NE";
      return KILN_EUNIMPL;
    }
    bool eq = a.v.f == b.v.f && a.im == b.im;
    *out = d->v.i == KILN_CMP_EQ ? eq : !eq;
    return 0;
  }
  if (k == KILN_KIND_FLOAT) {
    if (type && strcmp(type, "TOTALORDER") == 0) {
      int64_t ka = total_order_key(a.v.f), kb = total_order_key(b.v.f);
      c = ka < kb ? -1 : ka > kb ? 1 : 0;
    } else {
      c = a.v.f < b.v.f ? -1 : a.v.f > b.v.f ? 1 : a.v.f == b.v.f ? 0 : 2;
    }
  } else if (k == KILN_KIND_SINT) {
    c = a.v.s < b.v.s ? -1 : a.v.s > b.v.s;
  } else {
    c = a.v.u < b.v.u ? -1 : a.v.u > b.v.u;
  }
  switch ((kiln_cmp_dir)d->v.i) {
  case KILN_CMP_EQ: *out = c == 0; break;
  case KILN_CMP_NE: *out = c != 0; break;
  case KILN_CMP_GE: *out = c == 0 || c == 1; break;
  case KILN_CMP_GT: *out = c == 1; break;
  case KILN_CMP_LE: *out = c == 0 || c == -1; break;
  case KILN_CMP_LT: *out = c == -1; break;
  default: *why = "unknown comparison direction"; return KILN_EINVAL;
  }
  return 0;
}

/* ---- floats ------------------------------------------------------------- */

/* XLA's reduce-precision on the bit pattern of the source format: round the
 * mantissa to `mb` bits (nearest even), then send exponents beyond the
 * reduced range to infinity and below its normal range to zero. NaN stays
 * NaN (infinity when no mantissa bits are kept). */
static double reduce_precision(kiln_dtype t, double x, int64_t eb, int64_t mb) {
  int se, sm;
  if (!float_format(t, &se, &sm) || eb < 1 || mb < 0) return x;
  if (isnan(x)) return mb > 0 ? x : copysign(INFINITY, x);
  uint64_t bits;
  if (t == KILN_F64)
    memcpy(&bits, &x, sizeof bits);
  else if (t == KILN_F32) {
    float f = (float)x;
    uint32_t b32;
    memcpy(&b32, &f, sizeof b32);
    bits = b32;
  } else {
    bits = kiln_encode_ieee(x, se, sm);
  }
  uint64_t sign_mask = (uint64_t)1 << (se + sm);
  uint64_t exp_mask = width_mask(se) << sm;
  if (mb < sm) {
    uint64_t last = (uint64_t)1 << (sm - mb);
    uint64_t bias = (last >> 1) - 1 + ((bits & last) ? 1 : 0);
    bits = (bits + bias) & ~(last - 1);
  }
  if (eb < se) {
    uint64_t src_bias = width_mask(se - 1), red_bias = width_mask((int)eb - 1);
    uint64_t red_max = src_bias + red_bias, red_min = src_bias - red_bias;
    uint64_t e = bits & exp_mask;
    uint64_t s = bits & sign_mask;
    if (e > (red_max << sm))
      bits = s | exp_mask;
    else if (e <= (red_min << sm))
      bits = s;
  }
  if (t == KILN_F64) {
    double r;
    memcpy(&r, &bits, sizeof r);
    return r;
  }
  if (t == KILN_F32) {
    uint32_t b32 = (uint32_t)bits;
    float f;
    memcpy(&f, &b32, sizeof f);
    return f;
  }
  return kiln_decode_ieee((uint32_t)bits, se, sm);
}

static int float_unary(const kiln_instr *ins, kiln_opcode op, double x, kiln_dtype t, double *r,
                       const char **why) {
  switch (op) {
  case KILN_OP_ABS: *r = fabs(x); return 0;
  case KILN_OP_CBRT: *r = cbrt(x); return 0;
  case KILN_OP_CEIL: *r = ceil(x); return 0;
  case KILN_OP_COS: *r = cos(x); return 0;
  case KILN_OP_ERF: *r = erf(x); return 0;
  case KILN_OP_EXP: *r = exp(x); return 0;
  case KILN_OP_EXPM1: *r = expm1(x); return 0;
  case KILN_OP_FLOOR: *r = floor(x); return 0;
  case KILN_OP_LOG: *r = log(x); return 0;
  case KILN_OP_LOG1P: *r = log1p(x); return 0;
  case KILN_OP_LOGISTIC: *r = 1.0 / (1.0 + exp(-x)); return 0;
  case KILN_OP_NEGATE: *r = -x; return 0;
  case KILN_OP_ROUND_AFZ: *r = round(x); return 0;
  case KILN_OP_ROUND_EVEN: *r = nearbyint(x); return 0;
  case KILN_OP_RSQRT: *r = 1.0 / sqrt(x); return 0;
  case KILN_OP_SIGN: *r = isnan(x) ? x : copysign(x != 0 ? 1.0 : 0.0, x); return 0;
  case KILN_OP_SIN: *r = sin(x); return 0;
  case KILN_OP_SQRT: *r = sqrt(x); return 0;
  case KILN_OP_TAN: *r = tan(x); return 0;
  case KILN_OP_TANH: *r = tanh(x); return 0;
  case KILN_OP_COPY: *r = x; return 0;
  case KILN_OP_REDUCE_PRECISION:
    *r = reduce_precision(t, x, kiln_instr_attr_int(ins, KILN_ATTR_EXPONENT_BITS, 8),
                          kiln_instr_attr_int(ins, KILN_ATTR_MANTISSA_BITS, 23));
    return 0;
  default: *why = "is not defined on floating-point values"; return KILN_EINVAL;
  }
}

static double fmax_nan(double a, double b) {
  if (isnan(a)) return a;
  if (isnan(b)) return b;
  return a < b ? b : a;
}

static double fmin_nan(double a, double b) {
  if (isnan(a)) return a;
  if (isnan(b)) return b;
  return b < a ? b : a;
}

static int float_binary(kiln_opcode op, double a, double b, double *r, const char **why) {
  switch (op) {
  case KILN_OP_ADD: *r = a + b; return 0;
  case KILN_OP_SUBTRACT: *r = a - b; return 0;
  case KILN_OP_MULTIPLY: *r = a * b; return 0;
  case KILN_OP_DIVIDE: *r = a / b; return 0;
  case KILN_OP_REMAINDER: *r = fmod(a, b); return 0;
  case KILN_OP_MAXIMUM: *r = fmax_nan(a, b); return 0;
  case KILN_OP_MINIMUM: *r = fmin_nan(a, b); return 0;
  case KILN_OP_ATAN2: *r = atan2(a, b); return 0;
  case KILN_OP_POWER: *r = (a == 1 || b == 0) ? 1.0 : pow(a, b); return 0;
  default: *why = "is not defined on floating-point values"; return KILN_EINVAL;
  }
}

/* ---- integers ----------------------------------------------------------- */

static int clz_width(uint64_t v, int w) {
  int n = 0;
  for (int i = w - 1; i >= 0 && !((v >> i) & 1); i--) n++;
  return n;
}

static int int_unary(kiln_opcode op, kiln__interp_scalar a, kiln__interp_scalar *r,
                     const char **why) {
  kiln_dtype t = a.t;
  int w = kiln_dtype_bits(t);
  bool sgn = kiln_dtype_is_signed_int(t);
  uint64_t x = int_bits(a);
  switch (op) {
  case KILN_OP_ABS: *r = mk_int(t, sgn && a.v.s < 0 ? (uint64_t)0 - x : x); return 0;
  case KILN_OP_NEGATE: *r = mk_int(t, (uint64_t)0 - x); return 0;
  case KILN_OP_NOT: *r = mk_int(t, t == KILN_PRED ? !x : ~x); return 0;
  case KILN_OP_COPY: *r = a; return 0;
  case KILN_OP_SIGN:
    *r = mk_int(t, sgn ? (uint64_t)(int64_t)((a.v.s > 0) - (a.v.s < 0)) : (x != 0));
    return 0;
  case KILN_OP_POPCNT:
    if (t == KILN_PRED) break;
    *r = mk_int(t, (uint64_t)__builtin_popcountll(x & width_mask(w)));
    return 0;
  case KILN_OP_CLZ:
    if (t == KILN_PRED) break;
    *r = mk_int(t, (uint64_t)clz_width(x & width_mask(w), w));
    return 0;
  default: break;
  }
  *why = t == KILN_PRED ? "is not defined on pred values" : "is not defined on integer values";
  return KILN_EINVAL;
}

static uint64_t ipow(uint64_t base, uint64_t e) {
  uint64_t r = 1;
  while (e) {
    if (e & 1) r *= base;
    base *= base;
    e >>= 1;
  }
  return r;
}

static int int_binary(kiln_opcode op, kiln__interp_scalar a, kiln__interp_scalar b,
                      kiln__interp_scalar *r, const char **why) {
  kiln_dtype t = a.t;
  int w = kiln_dtype_bits(t);
  bool sgn = kiln_dtype_is_signed_int(t), pred = t == KILN_PRED;
  uint64_t x = int_bits(a), y = int_bits(b);
  int64_t smin = sgn ? -(int64_t)(w >= 64 ? (uint64_t)INT64_MAX : width_mask(w - 1)) - 1 : 0;
  switch (op) {
  case KILN_OP_ADD: *r = mk_int(t, x + y); return 0;
  case KILN_OP_SUBTRACT: *r = mk_int(t, x - y); return 0;
  case KILN_OP_MULTIPLY: *r = mk_int(t, x * y); return 0;
  case KILN_OP_AND: *r = mk_int(t, x & y); return 0;
  case KILN_OP_OR: *r = mk_int(t, x | y); return 0;
  case KILN_OP_XOR: *r = mk_int(t, x ^ y); return 0;
  case KILN_OP_DIVIDE:
    if (y == 0)
      *r = mk_int(t, UINT64_MAX);
    else if (sgn && a.v.s == smin && b.v.s == -1)
      *r = a;
    else
      *r = mk_int(t, sgn ? (uint64_t)(a.v.s / b.v.s) : x / y);
    return 0;
  case KILN_OP_REMAINDER:
    if (y == 0)
      *r = a;
    else if (sgn && a.v.s == smin && b.v.s == -1)
      *r = mk_int(t, 0);
    else
      *r = mk_int(t, sgn ? (uint64_t)(a.v.s % b.v.s) : x % y);
    return 0;
  case KILN_OP_MAXIMUM: *r = (sgn ? a.v.s < b.v.s : a.v.u < b.v.u) ? b : a; return 0;
  case KILN_OP_MINIMUM: *r = (sgn ? b.v.s < a.v.s : b.v.u < a.v.u) ? b : a; return 0;
  case KILN_OP_POWER:
    if (x == 1 || y == 0)
      *r = mk_int(t, 1);
    else if (pred)
      *r = mk_int(t, x || !y);
    else if (sgn && b.v.s < 0)
      *r = mk_int(t, 0);
    else
      *r = mk_int(t, ipow(x, y & width_mask(w)));
    return 0;
  default: break;
  }
  if (!pred) {
    uint64_t amount = y & width_mask(w);
    uint64_t xm = x & width_mask(w);
    bool neg = (xm >> (w - 1)) & 1;
    switch (op) {
    case KILN_OP_SHIFT_LEFT: *r = mk_int(t, amount >= (uint64_t)w ? 0 : xm << amount); return 0;
    case KILN_OP_SHIFT_RIGHT_LOGICAL:
      *r = mk_int(t, amount >= (uint64_t)w ? 0 : xm >> amount);
      return 0;
    case KILN_OP_SHIFT_RIGHT_ARITH: {
      uint64_t v;
      if (amount >= (uint64_t)w)
        v = neg ? UINT64_MAX : 0;
      else
        v = (xm >> amount) | (neg && amount ? ~(width_mask(w) >> amount) : 0);
      *r = mk_int(t, v);
      return 0;
    }
    default: break;
    }
  }
  *why = pred ? "is not defined on pred values" : "is not defined on integer values";
  return KILN_EINVAL;
}

/* ---- complex ------------------------------------------------------------ */

static int complex_op(kiln_opcode op, const kiln__interp_scalar *a, uint32_t n,
                      kiln__interp_scalar *r, const char **why) {
  kiln_dtype t = a[0].t;
  double complex x = CMPLX(a[0].v.f, a[0].im), y = n > 1 ? CMPLX(a[1].v.f, a[1].im) : 0, z;
  switch (op) {
  case KILN_OP_ADD: z = x + y; break;
  case KILN_OP_SUBTRACT: z = x - y; break;
  case KILN_OP_MULTIPLY: z = x * y; break;
  case KILN_OP_DIVIDE: z = x / y; break;
  case KILN_OP_NEGATE: z = -x; break;
  case KILN_OP_COPY: *r = a[0]; return 0;
  case KILN_OP_ABS: *r = mk_float(t == KILN_C64 ? KILN_F32 : KILN_F64, cabs(x)); return 0;
  default: *why = "is not supported on complex values by the interpreter"; return KILN_EUNIMPL;
  }
  *r = mk_complex(t, creal(z), cimag(z));
  return 0;
}

/* ---- dispatch ----------------------------------------------------------- */

static int stochastic_convert(kiln__interp_scalar x, kiln__interp_scalar rnd, kiln_dtype out_t,
                              kiln__interp_scalar *r, const char **why) {
  if (!kiln_dtype_is_float(x.t) || !kiln_dtype_is_unsigned_int(rnd.t) ||
      !kiln_dtype_is_signed_int(out_t)) {
    *why = "converts floats to signed integers with unsigned random bits";
    return KILN_EUNIMPL;
  }
  /* XLA: round |x| up when the random bits are below its fraction scaled to
   * the random type's range; saturate at the result type's ends. */
  double v = x.v.f, a = fabs(v), tr = floor(a);
  int rb = kiln_dtype_bits(rnd.t), ob = kiln_dtype_bits(out_t);
  kiln__interp_scalar fixed = float_to_int((a - tr) * ldexp(1.0, rb), rnd.t);
  kiln__interp_scalar ti = float_to_int(tr, out_t);
  if (rnd.v.u < fixed.v.u) ti = mk_int(out_t, (uint64_t)ti.v.s + 1);
  if (v < 0) ti = mk_int(out_t, (uint64_t)0 - (uint64_t)ti.v.s);
  double lo = -ldexp(1.0, ob - 1), hi = ldexp(1.0, ob - 1) - 1;
  if (v <= lo) ti = mk_int(out_t, (uint64_t)1 << (ob - 1));
  if (v >= hi) ti = mk_int(out_t, width_mask(ob - 1));
  *r = ti;
  return 0;
}

static int ternary(kiln_opcode op, const kiln__interp_scalar *a, kiln_dtype out_t,
                   kiln__interp_scalar *r, const char **why) {
  if (op == KILN_OP_SELECT) {
    *r = kiln__interp_scalar_truthy(a[0]) ? a[1] : a[2];
    return 0;
  }
  if (op != KILN_OP_CLAMP) {
    *why = "is not a ternary op";
    return KILN_EINVAL;
  }
  kiln_dtype t = a[1].t;
  kiln__interp_scalar lo = kiln__interp_scalar_convert(a[0], t),
                      hi = kiln__interp_scalar_convert(a[2], t);
  kiln_dtype_kind k = kiln_dtype_kind_of(t);
  if (k == KILN_KIND_COMPLEX) {
    *why = "is not defined on complex values";
    return KILN_EINVAL;
  }
  if (k == KILN_KIND_FLOAT) {
    /* XLA: a NaN bound or value propagates; else min(hi, max(x, lo)). */
    double l = lo.v.f, x = a[1].v.f, h = hi.v.f, y;
    if (isnan(l))
      y = l;
    else if (isnan(x))
      y = x;
    else if (isnan(h))
      y = h;
    else {
      y = x < l ? l : x;
      y = y < h ? y : h;
    }
    *r = mk_float(t, y);
    (void)out_t;
    return 0;
  }
  kiln__interp_scalar y = a[1];
  bool sgn = k == KILN_KIND_SINT;
  if (sgn ? y.v.s < lo.v.s : y.v.u < lo.v.u) y = lo;
  if (!(sgn ? y.v.s < hi.v.s : y.v.u < hi.v.u)) y = hi;
  *r = y;
  return 0;
}

int kiln__interp_scalar_op(const kiln_instr *ins, kiln_opcode op, const kiln__interp_scalar *a,
                           uint32_t n, kiln_dtype out_t, kiln__interp_scalar *r, const char **why) {
  kiln__interp_scalar b[3];
  kiln_dtype t = a[0].t;
  kiln_dtype_kind k = kiln_dtype_kind_of(t);
  int rc = 0;
  if (!kiln__interp_dtype_computable(out_t)) {
    *why = "has no arithmetic for its result type in the interpreter";
    return KILN_EUNIMPL;
  }
  for (uint32_t i = 0; i < n; i++) {
    if (!kiln__interp_dtype_computable(a[i].t)) {
      *why = "has no arithmetic for its operand type in the interpreter";
      return KILN_EUNIMPL;
    }
  }
  switch (op) {
  case KILN_OP_CONVERT: *r = kiln__interp_scalar_convert(a[0], out_t); return 0;
  case KILN_OP_SELECT:
  case KILN_OP_CLAMP:
    if (n != 3) break;
    rc = ternary(op, a, out_t, r, why);
    goto done;
  case KILN_OP_STOCHASTIC_CONVERT:
    if (n != 2) break;
    return stochastic_convert(a[0], a[1], out_t, r, why);
  case KILN_OP_COMPARE: {
    if (n != 2) break;
    bool res = false;
    rc = compare(ins, a[0], kiln__interp_scalar_convert(a[1], t), &res, why);
    if (rc == 0) *r = mk_int(KILN_PRED, res);
    goto done;
  }
  case KILN_OP_IS_FINITE:
    if (k != KILN_KIND_FLOAT) {
      *why = "is defined on floating-point values only";
      return KILN_EINVAL;
    }
    *r = mk_int(KILN_PRED, isfinite(a[0].v.f));
    goto done;
  case KILN_OP_REAL:
  case KILN_OP_IMAG:
    if (k == KILN_KIND_COMPLEX)
      *r = mk_float(t == KILN_C64 ? KILN_F32 : KILN_F64, op == KILN_OP_REAL ? a[0].v.f : a[0].im);
    else
      *r = op == KILN_OP_REAL ? a[0] : mk_float(t, k == KILN_KIND_FLOAT ? 0.0 * 0 : 0);
    goto done;
  case KILN_OP_COMPLEX:
    if (n != 2) break;
    *r = mk_complex(out_t, as_double(a[0]), as_double(a[1]));
    return kiln_dtype_is_complex(out_t) ? 0 : (*why = "result must be complex", KILN_EINVAL);
  default: break;
  }
  if (n != (uint32_t)kiln_opcode_arity(op) || n < 1 || n > 2) {
    *why = "has the wrong number of operands";
    return KILN_EINVAL;
  }
  for (uint32_t i = 0; i < n; i++) b[i] = kiln__interp_scalar_convert(a[i], t);
  if (k == KILN_KIND_COMPLEX) {
    rc = complex_op(op, b, n, r, why);
  } else if (k == KILN_KIND_FLOAT) {
    double v = 0;
    rc = n == 1 ? float_unary(ins, op, b[0].v.f, t, &v, why)
                : float_binary(op, b[0].v.f, b[1].v.f, &v, why);
    if (rc == 0) *r = mk_float(t, v);
  } else {
    rc = n == 1 ? int_unary(op, b[0], r, why) : int_binary(op, b[0], b[1], r, why);
  }
done:
  if (rc == 0 && r->t != out_t) *r = kiln__interp_scalar_convert(*r, out_t);
  return rc;
}

/* ---- array drivers ------------------------------------------------------ */

static int check_operand(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *op,
                         uint32_t j) {
  int rc = kiln__interp_need_array(c, ins, op, "operand");
  if (rc) return rc;
  if (op->shape.rank == 0 || kiln__interp_same_dims(&op->shape, &ins->shape)) return 0;
  kiln_sbuf a = KILN_SBUF_INIT, b = KILN_SBUF_INIT;
  kiln_shape_print_short(&a, &op->shape);
  kiln_shape_print_short(&b, &ins->shape);
  rc = kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: operand %u is %s, the result %s",
                         kiln_opcode_name(ins->op), ins->name, j, kiln_sbuf_str(&a),
                         kiln_sbuf_str(&b));
  kiln_sbuf_free(&a);
  kiln_sbuf_free(&b);
  return rc;
}

int kiln__interp_eval_elementwise(kiln__interp_ctx *c, const kiln_instr *ins,
                                  const kiln_literal *const *ops, kiln_literal **out) {
  uint32_t n = ins->noperands;
  if (ins->op == KILN_OP_COPY && !kiln_shape_is_array(&ops[0]->shape))
    return kiln__interp_lit_clone(c, ins, ops[0], out);
  if (n < 1 || n > 3)
    return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: has %u operands",
                             kiln_opcode_name(ins->op), ins->name, n);
  int rc = kiln__interp_need_array(c, ins, &(kiln_literal){.shape = ins->shape}, "result");
  for (uint32_t j = 0; rc == 0 && j < n; j++) rc = check_operand(c, ins, ops[j], j);
  if (rc) return rc;
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  kiln_literal *r = *out;
  int64_t count = kiln_literal_elements(r);
  /* Plain copies and selects move storage, so they work on every type. */
  bool bytes =
      (ins->op == KILN_OP_COPY && ops[0]->shape.dtype == r->shape.dtype) ||
      (ins->op == KILN_OP_SELECT && ops[1]->shape.dtype == r->shape.dtype &&
       ops[2]->shape.dtype == r->shape.dtype && !kiln__interp_dtype_computable(r->shape.dtype));
  for (int64_t i = 0; i < count; i++) {
    if (bytes) {
      uint32_t src =
          ins->op == KILN_OP_COPY ? 0
          : kiln__interp_scalar_truthy(kiln__interp_scalar_load(ops[0], ops[0]->shape.rank ? i : 0))
              ? 1
              : 2;
      kiln__interp_copy_elem(r, i, ops[src], ops[src]->shape.rank ? i : 0);
      continue;
    }
    kiln__interp_scalar a[3], v;
    for (uint32_t j = 0; j < n; j++)
      a[j] = kiln__interp_scalar_load(ops[j], ops[j]->shape.rank ? i : 0);
    const char *why = "";
    rc = kiln__interp_scalar_op(ins, ins->op, a, n, r->shape.dtype, &v, &why);
    if (rc) {
      kiln_sbuf s = KILN_SBUF_INIT;
      kiln_shape_print_short(&s, &ops[0]->shape);
      kiln__interp_fail(c, ins, rc, "%s %s on %s: %s", kiln_opcode_name(ins->op), ins->name,
                        kiln_sbuf_str(&s), why);
      kiln_sbuf_free(&s);
      goto fail;
    }
    kiln__interp_scalar_store(r, i, v);
  }
  for (uint32_t j = 0; j < n; j++) {
    if (ops[j]->dynamic_sizes) {
      rc = kiln__interp_dyn_inherit(c, ins, r, ops[j]);
      if (rc) goto fail;
      break;
    }
  }
  return 0;
fail:
  kiln__interp_lit_free(c, r);
  *out = NULL;
  return rc;
}

int kiln__interp_eval_map(kiln__interp_ctx *c, const kiln_instr *ins,
                          const kiln_literal *const *ops, kiln_literal **out) {
  uint32_t comp = 0, n = ins->noperands;
  int rc = kiln__interp_called(c, ins, 0, &comp);
  if (rc == 0) rc = kiln__interp_need_array(c, ins, &(kiln_literal){.shape = ins->shape}, "result");
  for (uint32_t j = 0; rc == 0 && j < n; j++) rc = check_operand(c, ins, ops[j], j);
  if (rc) return rc;
  kiln__interp_scalar *args = kiln_calloc(n, sizeof *args);
  if (args == NULL) return kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  rc = kiln__interp_lit_result(c, ins, out);
  int64_t count = rc ? 0 : kiln_literal_elements(*out);
  for (int64_t i = 0; rc == 0 && i < count; i++) {
    kiln__interp_scalar v;
    for (uint32_t j = 0; j < n; j++)
      args[j] = kiln__interp_scalar_load(ops[j], ops[j]->shape.rank ? i : 0);
    rc = kiln__interp_call_scalar(c, ins, comp, args, n, &v, 1);
    if (rc == 0) kiln__interp_scalar_store(*out, i, v);
  }
  kiln_free(args);
  if (rc && *out) {
    kiln__interp_lit_free(c, *out);
    *out = NULL;
  }
  return rc;
}

int kiln__interp_eval_bitcast_convert(kiln__interp_ctx *c, const kiln_instr *ins,
                                      const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  int rc = kiln__interp_need_array(c, ins, a, "operand");
  if (rc == 0) rc = kiln__interp_need_array(c, ins, &(kiln_literal){.shape = ins->shape}, "result");
  if (rc) return rc;
  kiln_dtype from = a->shape.dtype, to = ins->shape.dtype;
  int fb = kiln_dtype_bits(from), tb = kiln_dtype_bits(to);
  bool sub = fb % 8 != 0 || tb % 8 != 0;
  int64_t rb = kiln_shape_bytes(&ins->shape);
  if ((sub && (fb != tb || !kiln__interp_same_dims(&a->shape, &ins->shape))) ||
      (!sub && (rb < 0 || (size_t)rb != a->nbytes)))
    return kiln__interp_fail(c, ins, KILN_EINVAL,
                             "bitcast-convert %s: %s to %s does not keep the "
                             "bits of every element",
                             ins->name, kiln_dtype_name(from), kiln_dtype_name(to));
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  kiln_literal *r = *out;
  if (sub) {
    for (int64_t i = 0; i < kiln_literal_elements(r); i++)
      kiln_literal_set_u64(r, i, kiln_literal_get_u64(a, i) & width_mask(fb));
  } else if (r->nbytes) {
    memcpy(r->data, a->data, r->nbytes);
    if (to == KILN_PRED)
      for (size_t i = 0; i < r->nbytes; i++) ((uint8_t *)r->data)[i] = ((uint8_t *)r->data)[i] != 0;
  }
  return 0;
}
