/* Literal values as HLO text, canonically.
 *
 * Form: a scalar is its bare value; an array is nested braces, one level per
 * dimension, elements separated by ", " ("{{1, 2}, {3, 4}}"; "{}" for a
 * zero-sized dimension); a tuple is "(a, b)"; complex is "(re, im)"; pred is
 * true/false. With its shape the literal reads "f32[2] {1, 2}". An array of a
 * bounded-dynamic shape prints only the elements within its runtime sizes.
 *
 * Integers are exact (s64/u64 extremes included). A float prints with the
 * fewest significant digits that read back (round to nearest even, in one
 * step) to the very same value of its own type. For f64 we try 1, 2, ...
 * digits with "%.*e" and keep the first that strtod converts back exactly.
 * For the narrower types (f32, f16, bf16, f8, f4) one "%.16e" gives digits
 * far finer than the type's rounding interval; for each length the two
 * decimals around the value are tested against that interval with one
 * exactly rounded double operation (falling back to strtof or the exact
 * fp16.h conversions only on the interval's ends), so that big constants
 * cost about one snprintf per element. Then the digits are laid out plainly
 * when the decimal exponent is in [-5, 15] ("0.001", "100", "1.5") and in
 * scientific form otherwise ("1e+30", "1.4e-45"), the exponent written as C
 * does (sign, at least two digits). Special values: inf, -inf, nan, -nan (a
 * NaN with its sign bit set; payloads are not printed), -0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/fp16.h"
#include "compiler/ir/text.h"

/* ---- small float formats (f8 variants, f4) ------------------------------ */

enum { MF_IEEE, MF_FN, MF_FNUZ, MF_FINITE, MF_E8M0 };

typedef struct minifloat {
  int ebits, mbits, bias;
  int flavor; /* MF_*: where NaN and infinity live */
} minifloat;

static const minifloat *minifloat_of(kiln_dtype t) {
  static const minifloat e5m2 = {5, 2, 15, MF_IEEE}, e4m3 = {4, 3, 7, MF_IEEE},
                         e3m4 = {3, 4, 3, MF_IEEE}, e4m3fn = {4, 3, 7, MF_FN},
                         e4m3b11 = {4, 3, 11, MF_FNUZ}, e5m2fnuz = {5, 2, 16, MF_FNUZ},
                         e4m3fnuz = {4, 3, 8, MF_FNUZ}, e2m1 = {2, 1, 1, MF_FINITE},
                         e8m0 = {8, 0, 127, MF_E8M0};
  switch (t) {
  case KILN_F8E5M2: return &e5m2;
  case KILN_F8E4M3: return &e4m3;
  case KILN_F8E3M4: return &e3m4;
  case KILN_F8E4M3FN: return &e4m3fn;
  case KILN_F8E4M3B11FNUZ: return &e4m3b11;
  case KILN_F8E5M2FNUZ: return &e5m2fnuz;
  case KILN_F8E4M3FNUZ: return &e4m3fnuz;
  case KILN_F4E2M1FN: return &e2m1;
  case KILN_F8E8M0FNU: return &e8m0;
  default: return NULL;
  }
}

/* The magnitude encoded by `mag` (the code without its sign bit). */
static double minifloat_mag(const minifloat *f, uint32_t mag) {
  uint32_t emax = (1u << f->ebits) - 1u, mmax = (1u << f->mbits) - 1u;
  if (f->flavor == MF_E8M0) return mag == 0xffu ? NAN : ldexp(1.0, (int)mag - 127);
  uint32_t e = mag >> f->mbits, m = mag & mmax;
  if (f->flavor == MF_IEEE && e == emax) return m ? NAN : INFINITY;
  if (f->flavor == MF_FN && e == emax && m == mmax) return NAN;
  if (e == 0) return ldexp((double)m, 1 - f->bias - f->mbits);
  return ldexp((double)(m | (1u << f->mbits)), (int)e - f->bias - f->mbits);
}

static double minifloat_decode(const minifloat *f, uint32_t code, uint32_t *mag_out) {
  if (f->flavor == MF_E8M0) {
    *mag_out = code & 0xffu;
    return minifloat_mag(f, *mag_out);
  }
  uint32_t signbit = 1u << (f->ebits + f->mbits);
  uint32_t mag = code & (signbit - 1u);
  bool neg = (code & signbit) != 0;
  *mag_out = mag;
  if (f->flavor == MF_FNUZ && neg && mag == 0) return NAN;
  double v = minifloat_mag(f, mag);
  return neg ? -v : v;
}

/* ---- shortest round-trip digits ----------------------------------------- */

/* What a candidate decimal must read back to. */
typedef struct target {
  kiln_dtype type;
  double v;              /* the value, positive (signs are printed apart) */
  float f;               /* f32: the value */
  uint16_t h;            /* f16/bf16: the bit pattern, sign cleared */
  const minifloat *mf;   /* small formats: the format, */
  double lo_mid, hi_mid; /* and the value's rounding interval */
  bool even;             /* ties round to this value */
} target;

static bool reads_back(const target *t, const char *s) {
  switch (t->type) {
  case KILN_F64: return strtod(s, NULL) == t->v;
  case KILN_F32: return strtof(s, NULL) == t->f;
  case KILN_F16: return kiln_f64_to_f16(strtod(s, NULL)) == t->h;
  case KILN_BF16: return kiln_f64_to_bf16(strtod(s, NULL)) == t->h;
  default: {
    double x = strtod(s, NULL);
    bool above = x > t->lo_mid || (x == t->lo_mid && t->even);
    bool below = x < t->hi_mid || (x == t->hi_mid && t->even);
    return above && below;
  }
  }
}

/* Writes the decimal digits[0..nd) x 10^(e10 - nd + 1), i.e. with the first
 * digit at decimal exponent e10, plainly or in scientific form (see the file
 * comment). Trailing zeros of the digits are dropped. */
static void put_digits(kiln_sbuf *b, const char *digits, int nd, int e10) {
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  if (e10 < -4 || e10 >= 16) {
    kiln_sbuf_putc(b, digits[0]);
    if (nd > 1) {
      kiln_sbuf_putc(b, '.');
      kiln_sbuf_putn(b, digits + 1, (size_t)nd - 1);
    }
    kiln_sbuf_printf(b, "e%c%02d", e10 < 0 ? '-' : '+', e10 < 0 ? -e10 : e10);
  } else if (e10 < 0) {
    kiln_sbuf_puts(b, "0.");
    for (int i = 0; i < -e10 - 1; i++) kiln_sbuf_putc(b, '0');
    kiln_sbuf_putn(b, digits, (size_t)nd);
  } else {
    int intd = e10 + 1;
    if (nd <= intd) {
      kiln_sbuf_putn(b, digits, (size_t)nd);
      for (int i = nd; i < intd; i++) kiln_sbuf_putc(b, '0');
    } else {
      kiln_sbuf_putn(b, digits, (size_t)intd);
      kiln_sbuf_putc(b, '.');
      kiln_sbuf_putn(b, digits + intd, (size_t)(nd - intd));
    }
  }
}

/* Splits "%.*e" output ("d.ddde+XX") into its digits and exponent. */
static int split_eform(const char *eform, char *digits, int cap, int *e10) {
  int nd = 0;
  const char *p = eform;
  for (; *p && *p != 'e'; p++)
    if (*p >= '0' && *p <= '9' && nd < cap) digits[nd++] = *p;
  *e10 = *p == 'e' ? atoi(p + 1) : 0;
  return nd;
}

/* f64: the first of 1, 2, ... 17 correctly rounded digits ("%.*e") that
 * reads back; 17 always does. */
static void put_shortest_f64(kiln_sbuf *b, const target *t) {
  char buf[64], digits[40];
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, sizeof buf, "%.*e", p - 1, t->v);
    if (reads_back(t, buf)) break;
  }
  int e10, nd = split_eform(buf, digits, (int)sizeof digits, &e10);
  put_digits(b, digits, nd, e10);
}

static const double pow10_exact[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                       1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                       1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* Whether D x 10^k (D < 10^15) rounds to the target. Both D and 10^k are
 * exact doubles for |k| <= 22, so their product or quotient is rounded once,
 * and rounding is monotone: a result strictly inside (outside) the rounding
 * interval, whose ends are doubles, means the exact value is too. Only a
 * result on an end, or an exponent out of the table, needs the exact
 * conversion of the text. */
static bool candidate_reads_back(const target *t, int64_t D, int k) {
  if (k >= -22 && k <= 22) {
    double c = k >= 0 ? (double)D * pow10_exact[k] : (double)D / pow10_exact[-k];
    if (c > t->lo_mid && c < t->hi_mid) return true;
    if (c < t->lo_mid || c > t->hi_mid) return false;
  }
  char buf[48];
  snprintf(buf, sizeof buf, "%llde%d", (long long)D, k);
  return reads_back(t, buf);
}

/* Types up to f32 have a rounding interval far wider than 10^-16 of their
 * value, so the 17 digits of one "%.16e" stand for the exact value: for each
 * length p the two p-digit decimals around it (truncated, and one up) are
 * the only candidates that can lie in the interval. The first length with
 * one inside wins; of two inside, the nearer (ties: even last digit). */
static void put_shortest_narrow(kiln_sbuf *b, const target *t) {
  char s17[48], digits[24];
  snprintf(s17, sizeof s17, "%.16e", t->v);
  int e10, nd = split_eform(s17, digits, 17, &e10);
  for (int p = 1; p <= 15 && p <= nd; p++) {
    int64_t D = 0;
    for (int i = 0; i < p; i++) D = D * 10 + (digits[i] - '0');
    /* Is the rest of the digits above, at or below one half? */
    int half = 0;
    if (p < nd) {
      half = digits[p] > '5' ? 1 : digits[p] < '5' ? -1 : 0;
      for (int i = p + 1; half == 0 && i < nd; i++)
        if (digits[i] != '0') half = 1;
    } else {
      half = -1; /* exact */
    }
    bool up_first = half > 0 || (half == 0 && (D & 1));
    int k = e10 - p + 1;
    int64_t first = up_first ? D + 1 : D, second = up_first ? D : D + 1;
    int64_t pick = -1;
    if (candidate_reads_back(t, first, k))
      pick = first;
    else if (p < nd && candidate_reads_back(t, second, k))
      pick = second;
    if (pick < 0) continue;
    char out[24];
    int n = snprintf(out, sizeof out, "%lld", (long long)pick);
    put_digits(b, out, n, k + n - 1); /* D + 1 may have gained a digit */
    return;
  }
  put_shortest_f64(b, t); /* not reached for these types; stays correct */
}

/* Writes the value `v` (exact in `type`); `code` is its bit pattern for the
 * 16- and 8-bit formats. */
static void put_float(kiln_sbuf *b, kiln_dtype type, double v, uint32_t code) {
  if (isnan(v)) {
    kiln_sbuf_puts(b, signbit(v) ? "-nan" : "nan");
    return;
  }
  if (signbit(v)) kiln_sbuf_putc(b, '-');
  if (isinf(v)) {
    kiln_sbuf_puts(b, "inf");
    return;
  }
  if (v == 0) {
    kiln_sbuf_putc(b, '0');
    return;
  }
  target t = {.type = type, .v = fabs(v), .f = (float)fabs(v)};
  if (type == KILN_F64) {
    put_shortest_f64(b, &t);
    return;
  }
  /* The neighbours below and above give the rounding interval; past the
   * largest finite value the interval is as wide above as below. */
  double lo, hi;
  uint32_t mag;
  if (type == KILN_F32) {
    uint32_t bits;
    memcpy(&bits, &t.f, 4);
    mag = bits;
    lo = nextafterf(t.f, 0.0f);
    hi = nextafterf(t.f, INFINITY);
  } else if (type == KILN_F16 || type == KILN_BF16) {
    t.h = (uint16_t)(code & 0x7fffu);
    mag = t.h;
    double (*dec)(uint16_t) = type == KILN_F16 ? kiln_f16_to_f64 : kiln_bf16_to_f64;
    lo = dec((uint16_t)(mag - 1));
    hi = dec((uint16_t)(mag + 1));
  } else {
    t.mf = minifloat_of(type);
    minifloat_decode(t.mf, code, &mag);
    uint32_t nmag = t.mf->flavor == MF_E8M0 ? 0x100u : 1u << (t.mf->ebits + t.mf->mbits);
    lo = mag ? minifloat_mag(t.mf, mag - 1) : t.v / 2;
    hi = mag + 1 < nmag ? minifloat_mag(t.mf, mag + 1) : NAN;
  }
  if (!isfinite(hi)) hi = t.v + (t.v - lo);
  t.lo_mid = (t.v + lo) / 2;
  t.hi_mid = (t.v + hi) / 2;
  t.even = (mag & 1u) == 0;
  put_shortest_narrow(b, &t);
}

/* One element of an array literal at linear (bound-size) index i. */
static void put_element(kiln_sbuf *b, const kiln_literal *lit, int64_t i) {
  kiln_dtype t = lit->shape.dtype;
  const unsigned char *d = lit->data;
  switch (t) {
  case KILN_PRED: kiln_sbuf_puts(b, d[i] ? "true" : "false"); return;
  case KILN_F64: {
    double v;
    memcpy(&v, d + 8 * i, 8);
    put_float(b, t, v, 0);
    return;
  }
  case KILN_F32: {
    float v;
    memcpy(&v, d + 4 * i, 4);
    put_float(b, t, v, 0);
    return;
  }
  case KILN_F16:
  case KILN_BF16: {
    uint16_t h;
    memcpy(&h, d + 2 * i, 2);
    put_float(b, t, t == KILN_F16 ? kiln_f16_to_f64(h) : kiln_bf16_to_f64(h), h);
    return;
  }
  case KILN_C64: {
    float re, im;
    memcpy(&re, d + 8 * i, 4);
    memcpy(&im, d + 8 * i + 4, 4);
    kiln_sbuf_putc(b, '(');
    put_float(b, KILN_F32, re, 0);
    kiln_sbuf_puts(b, ", ");
    put_float(b, KILN_F32, im, 0);
    kiln_sbuf_putc(b, ')');
    return;
  }
  case KILN_C128: {
    double re, im;
    memcpy(&re, d + 16 * i, 8);
    memcpy(&im, d + 16 * i + 8, 8);
    kiln_sbuf_putc(b, '(');
    put_float(b, KILN_F64, re, 0);
    kiln_sbuf_puts(b, ", ");
    put_float(b, KILN_F64, im, 0);
    kiln_sbuf_putc(b, ')');
    return;
  }
  default: break;
  }
  const minifloat *mf = minifloat_of(t);
  if (mf) {
    uint32_t mag;
    put_float(b, t, minifloat_decode(mf, d[i], &mag), d[i]);
  } else if (kiln_dtype_is_unsigned_int(t)) {
    kiln_sbuf_printf(b, "%llu", (unsigned long long)kiln_literal_get_u64(lit, i));
  } else if (kiln_dtype_is_signed_int(t)) {
    kiln_sbuf_printf(b, "%lld", (long long)kiln_literal_get_s64(lit, i));
  } else {
    kiln_sbuf_putc(b, '?'); /* no elements in this type: not a valid literal */
  }
}

/* Nested braces over the first `r` dims of `size` (runtime sizes), strides
 * over the bound sizes. Iterative, so that a deep rank cannot exhaust the
 * stack. A dimension of size zero ends the nesting with "{}". */
static void put_array(kiln_sbuf *b, const kiln_literal *lit) {
  const kiln_shape *s = &lit->shape;
  uint32_t rank = s->rank;
  if (rank == 0) {
    if (lit->data) put_element(b, lit, 0);
    return;
  }
  int64_t small[3 * 8];
  int64_t *scratch = small;
  if (rank > 8) {
    scratch = kiln_calloc(3 * (size_t)rank, sizeof *scratch);
    if (scratch == NULL) {
      b->failed = true;
      return;
    }
  }
  int64_t *size = scratch, *stride = scratch + rank, *idx = scratch + 2 * rank;
  uint32_t r = rank; /* dims iterated; a zero-sized dim cuts it short */
  for (uint32_t d = 0; d < rank; d++) {
    size[d] = lit->dynamic_sizes ? lit->dynamic_sizes[d] : s->dims[d];
    if (size[d] > s->dims[d]) size[d] = s->dims[d];
    idx[d] = 0;
    if (size[d] <= 0 && r == rank) r = d;
  }
  bool leaf_empty = r < rank;
  if (r == 0 || lit->data == NULL) {
    kiln_sbuf_puts(b, "{}");
    goto out;
  }
  /* Strides over the bound dims. Empty leaves read no element, so their
   * offsets are never formed: under a zero-sized dim the bound dims may
   * multiply past INT64_MAX (f32[2^40,2^40,0] holds nothing). Otherwise
   * every dim is at least 1 and the product is the bound element count of
   * data that exists; a product that overflows anyway is a broken literal
   * and fails the print rather than index out of it. */
  int64_t st = 1;
  for (uint32_t d = rank; !leaf_empty && d-- > 0;) {
    stride[d] = st;
    if (__builtin_mul_overflow(st, s->dims[d], &st)) {
      b->failed = true;
      goto out;
    }
  }
  for (uint32_t d = 0; d < r; d++) kiln_sbuf_putc(b, '{');
  int64_t off = 0;
  for (;;) {
    if (leaf_empty)
      kiln_sbuf_puts(b, "{}");
    else
      put_element(b, lit, off);
    int64_t d = (int64_t)r - 1;
    for (; d >= 0; d--) {
      idx[d]++;
      if (!leaf_empty) off += stride[d];
      if (idx[d] < size[d]) break;
      if (!leaf_empty) off -= size[d] * stride[d];
      idx[d] = 0;
      kiln_sbuf_putc(b, '}');
    }
    if (d < 0 || b->failed) break;
    kiln_sbuf_puts(b, ", ");
    for (uint32_t e = (uint32_t)d + 1; e < r; e++) kiln_sbuf_putc(b, '{');
  }
out:
  if (scratch != small) kiln_free(scratch);
}

static void put_literal(kiln_sbuf *b, const kiln_literal *lit) {
  if (kiln_shape_is_tuple(&lit->shape)) {
    kiln_sbuf_putc(b, '(');
    for (uint32_t i = 0; i < lit->shape.rank; i++) {
      if (i) kiln_sbuf_puts(b, ", ");
      if (lit->elems && lit->elems[i]) put_literal(b, lit->elems[i]);
    }
    kiln_sbuf_putc(b, ')');
  } else if (kiln_dtype_is_array(lit->shape.dtype)) {
    put_array(b, lit);
  } else {
    kiln_sbuf_puts(b, kiln_dtype_name(lit->shape.dtype)); /* token: no value */
  }
}

void kiln_literal_print(kiln_sbuf *b, const kiln_literal *lit, bool with_shape) {
  if (with_shape) {
    kiln_shape_print(b, &lit->shape);
    kiln_sbuf_putc(b, ' ');
  }
  put_literal(b, lit);
}

bool kiln_literal_print_bounded(kiln_sbuf *b, const kiln_literal *lit, bool with_shape) {
  if (kiln_shape_is_array(&lit->shape)) {
    int64_t arrays = kiln_shape_literal_arrays(&lit->shape);
    int64_t elems = kiln_shape_elements(&lit->shape);
    /* elems is at most 2^40 for a shape that holds data (its bytes exist) */
    if (arrays < 0 || elems < 0 || arrays - elems * 64 > (INT64_C(1) << 16)) {
      kiln_shape_print(b, &lit->shape);
      kiln_sbuf_puts(b, " {...}");
      return false;
    }
  }
  kiln_literal_print(b, lit, with_shape);
  return true;
}
