/* Literals: dense row-major element storage and typed element access.
 *
 * Every literal lives in an arena: a module's (constants) or a private one
 * that kiln_literal_destroy frees in one go (heap literals). Access goes
 * through three wide families (f64, s64/u64, c128) so that code over
 * literals needs no per-type switch; the setters perform the one rounding
 * (floats: nearest even, exactly once) or wraparound (integers) the element
 * type calls for. */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/fp16.h"
#include "compiler/ir/ir.h"

static int fill(kiln_arena *a, const kiln_shape *shape, size_t max_bytes, size_t *total,
                kiln_literal *lit, kiln_status *st) {
  if (kiln_shape_copy(a, &lit->shape, shape)) goto oom;
  if (kiln_shape_is_tuple(shape)) {
    if (shape->rank == 0) return 0;
    lit->elems = kiln_arena_calloc(a, shape->rank, sizeof *lit->elems);
    if (lit->elems == NULL) goto oom;
    for (uint32_t i = 0; i < shape->rank; i++) {
      lit->elems[i] = kiln_arena_calloc(a, 1, sizeof(kiln_literal));
      if (lit->elems[i] == NULL) goto oom;
      int rc = fill(a, &shape->tuple[i], max_bytes, total, lit->elems[i], st);
      if (rc) return rc;
    }
    return 0;
  }
  if (!kiln_shape_is_array(shape)) return 0; /* token: no data */
  int64_t bytes = kiln_shape_bytes(shape);
  if (bytes < 0 || (max_bytes && (size_t)bytes > max_bytes - *total))
    return kiln_status_set(st, KILN_ELIMIT, NULL,
                           "literal of %lld elements is over the size limit of %zu bytes",
                           (long long)kiln_shape_elements(shape), max_bytes);
  *total += (size_t)bytes;
  lit->nbytes = (size_t)bytes;
  lit->data = kiln_arena_calloc(a, 1, lit->nbytes ? lit->nbytes : 1);
  if (lit->data == NULL) goto oom;
  return 0;
oom:
  return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory for a literal");
}

int kiln_literal_create(kiln_arena *arena, const kiln_shape *shape, size_t max_bytes,
                        kiln_literal **out, kiln_status *st) {
  *out = NULL;
  kiln_arena *own = NULL;
  if (arena == NULL) {
    own = kiln_arena_create();
    if (own == NULL) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory for a literal");
    arena = own;
  }
  kiln_literal *lit = kiln_arena_calloc(arena, 1, sizeof *lit);
  if (lit == NULL) {
    kiln_arena_destroy(own);
    return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory for a literal");
  }
  size_t total = 0;
  int rc = fill(arena, shape, max_bytes, &total, lit, st);
  if (rc) {
    kiln_arena_destroy(own);
    return rc;
  }
  lit->own = own;
  *out = lit;
  return 0;
}

void kiln_literal_destroy(kiln_literal *lit) {
  if (lit && lit->own) kiln_arena_destroy(lit->own);
}

static int copy_data(kiln_arena *a, kiln_literal *dst, const kiln_literal *src) {
  if (kiln_shape_is_tuple(&src->shape)) {
    for (uint32_t i = 0; i < src->shape.rank; i++) {
      int rc = copy_data(a, dst->elems[i], src->elems[i]);
      if (rc) return rc;
    }
    return 0;
  }
  if (src->nbytes) memcpy(dst->data, src->data, src->nbytes);
  if (src->dynamic_sizes && src->shape.rank) {
    dst->dynamic_sizes =
        kiln_arena_memdup(a, src->dynamic_sizes, src->shape.rank * sizeof *src->dynamic_sizes);
    if (dst->dynamic_sizes == NULL) return KILN_ENOMEM;
  }
  return 0;
}

int kiln_literal_clone(kiln_arena *arena, const kiln_literal *src, kiln_literal **out,
                       kiln_status *st) {
  int rc = kiln_literal_create(arena, &src->shape, 0, out, st);
  if (rc) return rc;
  rc = copy_data(arena ? arena : (*out)->own, *out, src);
  if (rc) {
    kiln_literal_destroy(*out);
    *out = NULL;
    return kiln_status_set(st, rc, NULL, "out of memory for a literal");
  }
  return 0;
}

int64_t kiln_literal_elements(const kiln_literal *lit) { return kiln_shape_elements(&lit->shape); }

#define AT(T) (((T *)lit->data)[i])
#define CAT(T) (((const T *)lit->data)[i])

double kiln_literal_get_f64(const kiln_literal *lit, int64_t i) {
  switch (lit->shape.dtype) {
  case KILN_F16: return kiln_f16_to_f64(CAT(uint16_t));
  case KILN_BF16: return kiln_bf16_to_f64(CAT(uint16_t));
  case KILN_F32: return CAT(float);
  case KILN_F64: return CAT(double);
  case KILN_C64: return ((const float *)lit->data)[2 * i];
  case KILN_C128: return ((const double *)lit->data)[2 * i];
  case KILN_F8E5M2: return kiln_decode_ieee(CAT(uint8_t), 5, 2);
  case KILN_F8E4M3: return kiln_decode_ieee(CAT(uint8_t), 4, 3);
  case KILN_F8E3M4: return kiln_decode_ieee(CAT(uint8_t), 3, 4);
  default:
    if (kiln_dtype_is_unsigned_int(lit->shape.dtype) || lit->shape.dtype == KILN_PRED)
      return (double)kiln_literal_get_u64(lit, i);
    if (kiln_dtype_is_signed_int(lit->shape.dtype)) return (double)kiln_literal_get_s64(lit, i);
    return NAN; /* other f8/f4 types are storage-only */
  }
}

int64_t kiln_literal_get_s64(const kiln_literal *lit, int64_t i) {
  switch (lit->shape.dtype) {
  case KILN_PRED: return CAT(uint8_t) != 0;
  case KILN_S2:
  case KILN_S4:
  case KILN_S8: return CAT(int8_t);
  case KILN_S16: return CAT(int16_t);
  case KILN_S32: return CAT(int32_t);
  case KILN_S64: return CAT(int64_t);
  case KILN_U2:
  case KILN_U4:
  case KILN_U8: return CAT(uint8_t);
  case KILN_U16: return CAT(uint16_t);
  case KILN_U32: return CAT(uint32_t);
  case KILN_U64: return (int64_t)CAT(uint64_t);
  default: {
    double d = kiln_literal_get_f64(lit, i);
    if (isnan(d)) return 0;
    if (d >= 9223372036854775807.0) return INT64_MAX;
    if (d <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)d;
  }
  }
}

uint64_t kiln_literal_get_u64(const kiln_literal *lit, int64_t i) {
  switch (lit->shape.dtype) {
  case KILN_PRED: return CAT(uint8_t) != 0;
  case KILN_U2:
  case KILN_U4:
  case KILN_U8: return CAT(uint8_t);
  case KILN_U16: return CAT(uint16_t);
  case KILN_U32: return CAT(uint32_t);
  case KILN_U64: return CAT(uint64_t);
  default:
    if (kiln_dtype_is_signed_int(lit->shape.dtype)) return (uint64_t)kiln_literal_get_s64(lit, i);
    {
      double d = kiln_literal_get_f64(lit, i);
      if (isnan(d) || d <= 0) return 0;
      if (d >= 18446744073709551615.0) return UINT64_MAX;
      return (uint64_t)d;
    }
  }
}

bool kiln_literal_get_pred(const kiln_literal *lit, int64_t i) {
  if (lit->shape.dtype == KILN_PRED) return CAT(uint8_t) != 0;
  if (kiln_dtype_is_float(lit->shape.dtype) || kiln_dtype_is_complex(lit->shape.dtype))
    return kiln_literal_get_f64(lit, i) != 0;
  return kiln_literal_get_u64(lit, i) != 0;
}

void kiln_literal_get_c128(const kiln_literal *lit, int64_t i, double *re, double *im) {
  switch (lit->shape.dtype) {
  case KILN_C64:
    *re = ((const float *)lit->data)[2 * i];
    *im = ((const float *)lit->data)[2 * i + 1];
    return;
  case KILN_C128:
    *re = ((const double *)lit->data)[2 * i];
    *im = ((const double *)lit->data)[2 * i + 1];
    return;
  default: *re = kiln_literal_get_f64(lit, i); *im = 0;
  }
}

/* Wrap an integer to `bits` wide, sign- or zero-extending back. */
static int64_t wrap_signed(uint64_t v, int bits) {
  if (bits >= 64) return (int64_t)v;
  uint64_t m = (UINT64_C(1) << bits) - 1;
  v &= m;
  if (v >> (bits - 1)) v |= ~m;
  return (int64_t)v;
}

/* The integer -mag (neg) or mag as a double that kiln_literal_set_f64 then
 * rounds to type t in what amounts to one step: exact below 2^53; beyond,
 * correctly rounded for the 53-bit types (f64, c128) and rounded to odd for
 * the narrower ones, whose nearest-even rounding of a round-to-odd value
 * with at least two more bits is the nearest-even rounding of the exact
 * integer (no double rounding at the halfway points). */
static double int_to_f64(uint64_t mag, bool neg, kiln_dtype t) {
  double d;
  if (mag < (UINT64_C(1) << 53) || t == KILN_F64 || t == KILN_C128) {
    d = (double)mag;
  } else {
    int shift = 0;
    while ((mag >> shift) >= (UINT64_C(1) << 53)) shift++;
    uint64_t kept = mag >> shift;
    if (mag & ((UINT64_C(1) << shift) - 1)) kept |= 1; /* sticky: round to odd */
    d = ldexp((double)kept, shift);
  }
  return neg ? -d : d;
}

void kiln_literal_set_s64(kiln_literal *lit, int64_t i, int64_t v) {
  kiln_dtype t = lit->shape.dtype;
  if (kiln_dtype_is_float(t) || kiln_dtype_is_complex(t)) {
    uint64_t mag = v < 0 ? -(uint64_t)v : (uint64_t)v;
    kiln_literal_set_f64(lit, i, int_to_f64(mag, v < 0, t));
    return;
  }
  kiln_literal_set_u64(lit, i, (uint64_t)v);
}

void kiln_literal_set_u64(kiln_literal *lit, int64_t i, uint64_t v) {
  kiln_dtype t = lit->shape.dtype;
  switch (t) {
  case KILN_PRED: AT(uint8_t) = v != 0; return;
  case KILN_S2:
  case KILN_S4: AT(int8_t) = (int8_t)wrap_signed(v, kiln_dtype_bits(t)); return;
  case KILN_U2:
  case KILN_U4: AT(uint8_t) = (uint8_t)(v & ((1u << kiln_dtype_bits(t)) - 1)); return;
  case KILN_S8: AT(int8_t) = (int8_t)wrap_signed(v, 8); return;
  case KILN_S16: AT(int16_t) = (int16_t)wrap_signed(v, 16); return;
  case KILN_S32: AT(int32_t) = (int32_t)wrap_signed(v, 32); return;
  case KILN_S64: AT(int64_t) = (int64_t)v; return;
  case KILN_U8: AT(uint8_t) = (uint8_t)v; return;
  case KILN_U16: AT(uint16_t) = (uint16_t)v; return;
  case KILN_U32: AT(uint32_t) = (uint32_t)v; return;
  case KILN_U64: AT(uint64_t) = v; return;
  default: kiln_literal_set_f64(lit, i, int_to_f64(v, false, t)); return;
  }
}

void kiln_literal_set_f64(kiln_literal *lit, int64_t i, double v) {
  switch (lit->shape.dtype) {
  case KILN_F16: AT(uint16_t) = kiln_f64_to_f16(v); return;
  case KILN_BF16: AT(uint16_t) = kiln_f64_to_bf16(v); return;
  case KILN_F32: AT(float) = (float)v; return;
  case KILN_F64: AT(double) = v; return;
  case KILN_C64:
  case KILN_C128: kiln_literal_set_c128(lit, i, v, 0); return;
  case KILN_F8E5M2: AT(uint8_t) = (uint8_t)kiln_encode_ieee(v, 5, 2); return;
  case KILN_F8E4M3: AT(uint8_t) = (uint8_t)kiln_encode_ieee(v, 4, 3); return;
  case KILN_F8E3M4: AT(uint8_t) = (uint8_t)kiln_encode_ieee(v, 3, 4); return;
  case KILN_PRED: AT(uint8_t) = v != 0; return;
  default:
    if (kiln_dtype_is_signed_int(lit->shape.dtype)) {
      /* float -> signed int: truncate toward zero, saturate, NaN -> 0 (XLA). */
      int64_t x;
      if (isnan(v))
        x = 0;
      else if (v >= 9223372036854775807.0)
        x = INT64_MAX;
      else if (v <= -9223372036854775808.0)
        x = INT64_MIN;
      else
        x = (int64_t)v;
      int bits = kiln_dtype_bits(lit->shape.dtype);
      if (bits < 64) {
        int64_t hi = (INT64_C(1) << (bits - 1)) - 1, lo = -hi - 1;
        x = x > hi ? hi : x < lo ? lo : x;
      }
      kiln_literal_set_u64(lit, i, (uint64_t)x);
    } else if (kiln_dtype_is_unsigned_int(lit->shape.dtype)) {
      uint64_t x;
      if (isnan(v) || v <= 0)
        x = 0;
      else if (v >= 18446744073709551615.0)
        x = UINT64_MAX;
      else
        x = (uint64_t)v;
      int bits = kiln_dtype_bits(lit->shape.dtype);
      if (bits < 64 && x > (UINT64_C(1) << bits) - 1) x = (UINT64_C(1) << bits) - 1;
      kiln_literal_set_u64(lit, i, x);
    }
    return;
  }
}

void kiln_literal_set_c128(kiln_literal *lit, int64_t i, double re, double im) {
  if (lit->shape.dtype == KILN_C64) {
    ((float *)lit->data)[2 * i] = (float)re;
    ((float *)lit->data)[2 * i + 1] = (float)im;
  } else if (lit->shape.dtype == KILN_C128) {
    ((double *)lit->data)[2 * i] = re;
    ((double *)lit->data)[2 * i + 1] = im;
  } else {
    kiln_literal_set_f64(lit, i, re);
  }
}

bool kiln_literal_equal(const kiln_literal *a, const kiln_literal *b) {
  if (!kiln_shape_equal(&a->shape, &b->shape, false)) return false;
  if (kiln_shape_is_tuple(&a->shape)) {
    for (uint32_t i = 0; i < a->shape.rank; i++)
      if (!kiln_literal_equal(a->elems[i], b->elems[i])) return false;
    return true;
  }
  return a->nbytes == b->nbytes && (a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
}

int kiln_literal_fit_bounds(kiln_arena *arena, const kiln_literal *src, const kiln_shape *want,
                            const kiln_literal **out, kiln_status *st) {
  *out = NULL;
  const kiln_shape *s = &src->shape;
  if (kiln_shape_equal(s, want, false)) {
    *out = src;
    return 0;
  }
  if (!kiln_shape_is_array(s) || !kiln_shape_is_array(want) || s->dtype != want->dtype ||
      s->rank != want->rank || s->rank > 64)
    return kiln_status_set(st, KILN_EINVAL, NULL, "the element type or rank differs");
  int64_t size[64];
  for (uint32_t d = 0; d < s->rank; d++) {
    size[d] = src->dynamic_sizes ? src->dynamic_sizes[d] : s->dims[d];
    bool dyn = want->dynamic && want->dynamic[d];
    if (size[d] < 0 || size[d] > s->dims[d] || (dyn && size[d] > want->dims[d]))
      return kiln_status_set(st, KILN_EINVAL, NULL,
                             "dimension %u has %lld elements, over its bound %lld", d,
                             (long long)size[d], (long long)want->dims[d]);
    if (!dyn && size[d] != want->dims[d])
      return kiln_status_set(st, KILN_EINVAL, NULL,
                             "dimension %u has %lld elements, %lld expected (it is not dynamic)", d,
                             (long long)size[d], (long long)want->dims[d]);
  }
  kiln_literal *lit;
  int rc = kiln_literal_create(arena, want, 0, &lit, st);
  if (rc) return rc;
  int64_t n = 1;
  for (uint32_t d = 0; d < s->rank; d++) n *= size[d];
  size_t es = kiln_dtype_size(s->dtype);
  int64_t idx[64] = {0};
  for (int64_t k = 0; k < n; k++) { /* the runtime box, row by row */
    int64_t from = 0, to = 0;
    for (uint32_t d = 0; d < s->rank; d++) {
      from = from * s->dims[d] + idx[d];
      to = to * want->dims[d] + idx[d];
    }
    memcpy((char *)lit->data + (size_t)to * es, (const char *)src->data + (size_t)from * es, es);
    for (uint32_t d = s->rank; d-- > 0;) {
      if (++idx[d] < size[d]) break;
      idx[d] = 0;
    }
  }
  bool smaller = false;
  for (uint32_t d = 0; d < s->rank; d++) smaller |= size[d] < want->dims[d];
  if (smaller) {
    kiln_arena *a = arena ? arena : lit->own;
    lit->dynamic_sizes = kiln_arena_memdup(a, size, s->rank * sizeof *size);
    if (lit->dynamic_sizes == NULL) {
      kiln_literal_destroy(lit);
      return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory for a literal");
    }
  }
  *out = lit;
  return 0;
}
