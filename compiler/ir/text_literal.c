/* Literal values in HLO text: the operand of constant(...) and the
 * "shape value" form of kiln_literal_parse_text.
 *
 * Arrays are nested braces, one level per dimension, read by a loop with a
 * counter per level rather than by recursion, so a shape of any rank is safe.
 * Every element is checked against its type: integers against the type's
 * range, the formats without infinities (f8e4m3fn, the fnuz types, f4e2m1fn,
 * f8e8m0fnu) against their largest value, so that a value that cannot be
 * stored is an error and never a silent wraparound. Before any storage is
 * allocated, the count of elements and empty arrays ("{}" under a dimension
 * of size 0) is checked against the length of the text left and the
 * element limit, which bounds a literal's memory, and the text it prints
 * to, by the size of its text.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/text.h"
#include "compiler/ir/text_parse.h"

static int nomem(kiln__lex *lx) {
  return kiln__lex_error_code(lx, NULL, KILN_ENOMEM, "out of memory");
}

/* Elements (leaves false), or elements plus empty arrays ("{}" under a
 * dimension of size 0: leaves true), of a literal of shape s, over a
 * tuple's elements too: what its text must spell out one by one. -1 on
 * overflow. */
static int64_t count(const kiln_shape *s, bool leaves) {
  if (kiln_shape_is_tuple(s)) {
    int64_t total = 0;
    for (uint32_t i = 0; i < s->rank; i++) {
      int64_t n = count(&s->tuple[i], leaves);
      if (n < 0 || total > INT64_MAX - n) return -1;
      total += n;
    }
    return total;
  }
  return leaves ? kiln_shape_leaves(s) : kiln_shape_elements(s);
}

int kiln__literal_check_size(kiln__lex *lx, const kiln_shape *shape, const char *at,
                             const char *name, int64_t max_leaves) {
  int64_t n = count(shape, true);
  size_t left = (size_t)(lx->end - at);
  if (n >= 0 && n <= max_leaves && (uint64_t)n <= (uint64_t)left) return 0;
  const char *what = n == count(shape, false) ? "elements" : "elements and empty arrays ({})";
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_shape_print_short(&b, shape);
  char who[96] = "";
  if (name) snprintf(who, sizeof who, "constant %.64s: ", name);
  int rc;
  if (n < 0 || n > max_leaves)
    rc = kiln__lex_error_code(lx, at, KILN_ELIMIT, "%sliteral of shape %s has more than %lld %s",
                              who, kiln_sbuf_str(&b), (long long)max_leaves, what);
  else
    rc = kiln__lex_error(lx, at,
                         "%sliteral of shape %s has %lld %s, more than the %zu characters of "
                         "text left can hold",
                         who, kiln_sbuf_str(&b), (long long)n, what, left);
  kiln_sbuf_free(&b);
  return rc;
}

/* ---- narrow float formats without infinities ------------------------------ */

typedef struct minifloat {
  int ebits, mbits, bias;
  bool fnuz;  /* NaN is the negative-zero code 0x80; no negative zero */
  bool fn;    /* NaN is all ones; the top exponent holds finite values */
  bool unsig; /* e8m0: no sign, no zero, NaN is all ones */
} minifloat;

static bool minifloat_of(kiln_dtype t, minifloat *f) {
  switch (t) {
  case KILN_F8E4M3FN: *f = (minifloat){4, 3, 7, false, true, false}; return true;
  case KILN_F8E4M3B11FNUZ: *f = (minifloat){4, 3, 11, true, false, false}; return true;
  case KILN_F8E5M2FNUZ: *f = (minifloat){5, 2, 16, true, false, false}; return true;
  case KILN_F8E4M3FNUZ: *f = (minifloat){4, 3, 8, true, false, false}; return true;
  case KILN_F4E2M1FN: *f = (minifloat){2, 1, 1, false, false, false}; return true;
  case KILN_F8E8M0FNU: *f = (minifloat){8, 0, 127, false, false, true}; return true;
  default: return false;
  }
}

/* Rounds x to nearest even in format f. Returns false when x has no
 * encoding (too large, infinite, NaN or zero where the format has none). */
static bool minifloat_encode(const minifloat *f, double x, uint8_t *out) {
  int width = f->ebits + f->mbits + (f->unsig ? 0 : 1);
  unsigned sign = signbit(x) ? 1u : 0u;
  unsigned emax = (1u << f->ebits) - 1;
  if (isnan(x)) {
    if (f->fnuz)
      *out = 0x80;
    else if (f->unsig)
      *out = 0xff;
    else if (f->fn)
      *out = (uint8_t)((sign << (width - 1)) | ((1u << (width - 1)) - 1));
    else
      return false;
    return true;
  }
  if (isinf(x) || (f->unsig && sign && x != 0)) return false;
  double a = fabs(x);
  int emin = 1 - f->bias;
  unsigned biased = 0, mant = 0;
  if (a != 0) {
    int e;
    frexp(a, &e);
    int ue = e - 1;
    if (ue < emin) ue = emin;
    double q = rint(ldexp(a, f->mbits - ue));
    double top = ldexp(1, f->mbits + 1);
    if (q >= top) {
      ue++;
      q = ldexp(1, f->mbits);
    }
    if (q < ldexp(1, f->mbits)) { /* subnormal */
      biased = 0;
      mant = (unsigned)q;
      if (f->unsig && mant == 0) return false;
    } else {
      if (ue + f->bias > (int)emax) return false;
      biased = (unsigned)(ue + f->bias);
      mant = (unsigned)(q - ldexp(1, f->mbits));
    }
    if (f->unsig) { /* no subnormals: code 0 is 2^-127 */
      if (biased == 0 && mant == 0) return false;
      if (biased == emax) return false;
    }
    if (f->fn && biased == emax && mant == (1u << f->mbits) - 1) return false;
  } else if (f->unsig) {
    return false;
  }
  if (biased == 0 && mant == 0 && f->fnuz) sign = 0;
  unsigned code = (biased << f->mbits) | mant;
  if (!f->unsig) code |= sign << (f->ebits + f->mbits);
  *out = (uint8_t)code;
  return true;
}

/* ---- scalars ------------------------------------------------------------ */

static int bad_value(kiln__lex *lx, const char *at, const char *what, kiln_dtype t) {
  char f[64];
  return kiln__lex_error(lx, at, "expected %s for %s, found %s", what, kiln_dtype_name(t),
                         kiln__lex_found(lx, at, f, sizeof f));
}

static int parse_int_elem(kiln__lex *lx, kiln_literal *lit, int64_t i) {
  kiln_dtype t = lit->shape.dtype;
  const char *at = lx->p, *p = at, *end = lx->end;
  bool neg = false;
  if (p < end && (*p == '-' || *p == '+')) neg = *p++ == '-';
  uint64_t mag = 0;
  bool over = false;
  const char *d0 = p;
  while (p < end && *p >= '0' && *p <= '9') {
    unsigned dg = (unsigned)(*p++ - '0');
    if (mag > (UINT64_MAX - dg) / 10)
      over = true;
    else
      mag = mag * 10 + dg;
  }
  if (p == d0 || (p < end && (kiln__lex_is_name_char((unsigned char)*p) && *p != '-')))
    return bad_value(lx, at, "an integer", t);
  int bits = kiln_dtype_bits(t);
  int shown = (int)(p - at > 40 ? 40 : p - at);
  if (kiln_dtype_is_signed_int(t)) {
    uint64_t hi = bits >= 64 ? (uint64_t)INT64_MAX : (UINT64_C(1) << (bits - 1)) - 1;
    if (over || mag > hi + (neg ? 1 : 0))
      return kiln__lex_error_code(lx, at, KILN_ERANGE,
                                  "value %.*s is out of range for %s (%lld..%llu)", shown, at,
                                  kiln_dtype_name(t), -(long long)hi - 1, (unsigned long long)hi);
    kiln_literal_set_s64(lit, i, neg ? (int64_t)(0 - mag) : (int64_t)mag);
  } else {
    uint64_t hi = bits >= 64 ? UINT64_MAX : (UINT64_C(1) << bits) - 1;
    if (over || (neg && mag != 0) || mag > hi)
      return kiln__lex_error_code(lx, at, KILN_ERANGE,
                                  "value %.*s is out of range for %s (0..%llu)", shown, at,
                                  kiln_dtype_name(t), (unsigned long long)hi);
    kiln_literal_set_u64(lit, i, mag);
  }
  lx->p = p;
  return 0;
}

/* Reads a real number; for f32 the text is converted once more with strtof
 * so that the value is rounded straight from decimal. */
static int read_real(kiln__lex *lx, kiln_dtype t, double *v, float *vf) {
  const char *at = lx->p;
  char what[48];
  snprintf(what, sizeof what, "a number for %s", kiln_dtype_name(t));
  int rc = kiln__lex_float(lx, v, what);
  if (rc) return rc;
  if (vf && isfinite(*v)) {
    char buf[512];
    size_t n = (size_t)(lx->p - at);
    memcpy(buf, at, n);
    buf[n] = '\0';
    *vf = strtof(buf, NULL);
  } else if (vf) {
    *vf = (float)*v;
  }
  return 0;
}

static int parse_scalar(kiln__lex *lx, kiln_literal *lit, int64_t i) {
  kiln_dtype t = lit->shape.dtype;
  kiln__lex_skip(lx);
  const char *at = lx->p;
  if (t == KILN_PRED) {
    if (kiln__lex_accept_word(lx, "true"))
      kiln_literal_set_u64(lit, i, 1);
    else if (kiln__lex_accept_word(lx, "false"))
      kiln_literal_set_u64(lit, i, 0);
    else if (kiln__lex_accept_word(lx, "1"))
      kiln_literal_set_u64(lit, i, 1);
    else if (kiln__lex_accept_word(lx, "0"))
      kiln_literal_set_u64(lit, i, 0);
    else
      return bad_value(lx, at, "true or false", t);
    return 0;
  }
  if (kiln_dtype_is_integral(t)) return parse_int_elem(lx, lit, i);
  if (kiln_dtype_is_complex(t)) {
    double re, im = 0;
    int rc;
    if (kiln__lex_accept(lx, '(')) {
      if ((rc = read_real(lx, t, &re, NULL))) return rc;
      if ((rc = kiln__lex_expect(lx, ',', "between the real and imaginary parts"))) return rc;
      kiln__lex_skip(lx);
      if ((rc = read_real(lx, t, &im, NULL))) return rc;
      if ((rc = kiln__lex_expect(lx, ')', "after the imaginary part"))) return rc;
    } else if ((rc = read_real(lx, t, &re, NULL))) {
      return rc;
    }
    kiln_literal_set_c128(lit, i, re, im);
    return 0;
  }
  if (kiln_dtype_is_float(t)) {
    double v;
    float vf;
    int rc = read_real(lx, t, &v, t == KILN_F32 ? &vf : NULL);
    if (rc) return rc;
    minifloat mf;
    if (t == KILN_F32) {
      ((float *)lit->data)[i] = vf;
    } else if (minifloat_of(t, &mf)) {
      if (!minifloat_encode(&mf, v, &((uint8_t *)lit->data)[i]))
        return kiln__lex_error_code(lx, at, KILN_ERANGE, "value %.*s cannot be represented in %s",
                                    (int)(lx->p - at > 40 ? 40 : lx->p - at), at,
                                    kiln_dtype_name(t));
    } else {
      kiln_literal_set_f64(lit, i, v);
    }
    return 0;
  }
  return kiln__lex_error(lx, at, "a literal of type %s cannot be written in text",
                         kiln_dtype_name(t));
}

/* ---- arrays and tuples ---------------------------------------------------- */

static int count_error(kiln__lex *lx, const char *at, const kiln_shape *s, uint32_t level,
                       int64_t want, const char *foundtxt) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_shape_print_short(&b, s);
  int rc = kiln__lex_error(lx, at, "expected %s%lld elements in dimension %u of %s, found %s",
                           s->dynamic && s->dynamic[level] ? "at most " : "", (long long)want,
                           (unsigned)level, kiln_sbuf_str(&b), foundtxt);
  kiln_sbuf_free(&b);
  return rc;
}

static int parse_array(kiln__lex *lx, kiln_arena *a, kiln_literal *lit) {
  const kiln_shape *s = &lit->shape;
  uint32_t r = s->rank;
  int rc = 0;
  int64_t *count = kiln_calloc(r, sizeof *count);
  int64_t *stride = kiln_calloc(r, sizeof *stride);
  int64_t *seen = kiln_calloc(r, sizeof *seen);
  if (!count || !stride || !seen) {
    rc = nomem(lx);
    goto out;
  }
  /* Strides only where an element exists: under a dim of size 0 the other
   * dims may multiply past INT64_MAX, and no element is ever indexed. */
  if (kiln_shape_elements(s) > 0) {
    stride[r - 1] = 1;
    for (uint32_t l = r - 1; l > 0; l--) stride[l - 1] = stride[l] * s->dims[l];
  }
  for (uint32_t l = 0; l < r; l++) seen[l] = -1;
  kiln__lex_skip(lx);
  if (lx->p + 5 <= lx->end && memcmp(lx->p, "{...}", 5) == 0) {
    rc = kiln__lex_error(lx, NULL, "the value of this constant was left out of the text ({...})");
    goto out;
  }
  if ((rc = kiln__lex_expect(lx, '{', "to open an array literal"))) goto out;
  int64_t level = 0;
  while (level >= 0) {
    int c = kiln__lex_peek(lx);
    if (kiln__lex_failed(lx)) {
      rc = KILN_EPARSE;
      goto out;
    }
    if (c == '}') {
      int64_t n = count[level];
      bool dyn = s->dynamic && s->dynamic[level];
      if (!dyn && n != s->dims[level]) {
        char ft[32];
        snprintf(ft, sizeof ft, "%lld", (long long)n);
        rc = count_error(lx, lx->p, s, (uint32_t)level, s->dims[level], ft);
        goto out;
      }
      if (dyn) {
        if (seen[level] >= 0 && seen[level] != n) {
          rc = kiln__lex_error(lx, NULL,
                               "dynamic dimension %lld has %lld elements here but %lld before",
                               (long long)level, (long long)n, (long long)seen[level]);
          goto out;
        }
        seen[level] = n;
      }
      lx->p++;
      if (--level >= 0) count[level]++;
      continue;
    }
    if (count[level] > 0 && (rc = kiln__lex_expect(lx, ',', "or '}' between array elements")))
      goto out;
    if (count[level] >= s->dims[level]) {
      kiln__lex_skip(lx);
      rc = count_error(lx, lx->p, s, (uint32_t)level, s->dims[level], "more");
      goto out;
    }
    if (level < (int64_t)r - 1) {
      if ((rc = kiln__lex_expect(lx, '{', "to open a nested array"))) goto out;
      count[++level] = 0;
    } else {
      int64_t idx = 0;
      for (uint32_t l = 0; l < r; l++) idx += count[l] * stride[l];
      if ((rc = parse_scalar(lx, lit, idx))) goto out;
      count[level]++;
    }
  }
  if (kiln_shape_is_dynamic(s)) {
    lit->dynamic_sizes = kiln_arena_alloc(a, r * sizeof *lit->dynamic_sizes);
    if (lit->dynamic_sizes == NULL) {
      rc = nomem(lx);
      goto out;
    }
    for (uint32_t l = 0; l < r; l++)
      lit->dynamic_sizes[l] = s->dynamic[l] && seen[l] >= 0 ? seen[l] : s->dims[l];
  }
out:
  kiln_free(count);
  kiln_free(stride);
  kiln_free(seen);
  return rc;
}

int kiln__parse_literal_value(kiln__lex *lx, kiln_arena *a, kiln_literal *lit, int depth) {
  const kiln_shape *s = &lit->shape;
  int rc;
  if (depth >= KILN__MAX_NESTING)
    return kiln__lex_error(lx, NULL, "nesting deeper than %d levels", KILN__MAX_NESTING);
  if (kiln_shape_is_tuple(s)) {
    if ((rc = kiln__lex_expect(lx, '(', "to open a tuple literal"))) return rc;
    for (uint32_t i = 0; i < s->rank; i++) {
      if (i && (rc = kiln__lex_expect(lx, ',', "between tuple literal elements"))) return rc;
      if ((rc = kiln__parse_literal_value(lx, a, lit->elems[i], depth + 1))) return rc;
    }
    return kiln__lex_expect(lx, ')', "to close a tuple literal");
  }
  if (!kiln_shape_is_array(s)) {
    kiln__lex_skip(lx);
    return kiln__lex_error(lx, NULL, "a literal of type %s cannot be written in text",
                           kiln_dtype_name(s->dtype));
  }
  if (s->rank == 0) return parse_scalar(lx, lit, 0);
  return parse_array(lx, a, lit);
}

int kiln_literal_parse_text(const char *text, size_t len, kiln_literal **out, kiln_status *st) {
  *out = NULL;
  kiln_status local;
  if (st == NULL) {
    kiln_status_clear(&local);
    st = &local;
  }
  if (st->code) return st->code;
  if (text == NULL && len) return kiln_status_set(st, KILN_EINVAL, NULL, "text is NULL");
  kiln__lex lx;
  kiln__lex_init(&lx, text ? text : "", text ? len : 0, "<literal>", st);
  kiln_arena *tmp = kiln_arena_create();
  if (tmp == NULL) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  kiln_literal *lit = NULL;
  kiln_shape shape;
  int rc =
      kiln__parse_shape(&lx, tmp, KILN__DEFAULT_MAX_ELEMENTS, 0, KILN__SHAPE_GLUED_LAYOUT, &shape);
  if (rc) goto out;
  kiln__lex_skip(&lx);
  if ((rc = kiln__literal_check_size(&lx, &shape, lx.p, NULL, KILN__DEFAULT_MAX_ELEMENTS)))
    goto out;
  kiln_status lst;
  kiln_status_clear(&lst);
  if ((rc = kiln_literal_create(NULL, &shape, 0, &lit, &lst))) {
    kiln__lex_error_code(&lx, NULL, rc, "%s", lst.msg);
    goto out;
  }
  if ((rc = kiln__parse_literal_value(&lx, lit->own, lit, 0))) goto out;
  if (kiln__lex_peek(&lx) >= 0) {
    char f[64];
    rc = kiln__lex_error(&lx, NULL, "expected the end of the literal, found %s",
                         kiln__lex_found(&lx, NULL, f, sizeof f));
    goto out;
  }
  if (kiln__lex_failed(&lx)) rc = st->code;
out:
  kiln_arena_destroy(tmp);
  if (rc) {
    kiln_literal_destroy(lit);
    if (st->code == 0) kiln_status_set(st, rc, NULL, "%s", kiln_strerror(rc));
    return rc;
  }
  *out = lit;
  return 0;
}
