/* Arguments in, results out: turning --arg values into literals that match
 * the ENTRY parameters exactly, generating --random-args, and writing
 * results as .npy.
 *
 * The rule for arguments is exactness: a dtype or shape that differs from
 * the parameter is an error that says what was expected, with a single
 * deliberate exception, float32 arrays for bf16 parameters (NumPy has no
 * bf16), rounded to nearest even by the literal setters. Results go the
 * other way: element types NumPy lacks are widened to a type that holds
 * every value exactly. */
#include <stdio.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "clients/cli/npy.h"
#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/ir/text.h"

static void shape_str(const kiln_shape *s, char *buf, size_t size) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_shape_print_short(&b, s);
  snprintf(buf, size, "%s", kiln_sbuf_failed(&b) ? "?" : kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
}

static void npy_shape_str(const kiln_npy *a, char *buf, size_t size) {
  /* Spelled as Kiln would spell the same array, so the two read alike. */
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b, "%s[", kiln_dtype_name(a->dtype));
  for (uint32_t i = 0; i < a->rank; i++)
    kiln_sbuf_printf(&b, "%s%lld", i ? "," : "", (long long)a->dims[i]);
  kiln_sbuf_putc(&b, ']');
  snprintf(buf, size, "%s", kiln_sbuf_failed(&b) ? "?" : kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A bounded-dynamic parameter takes an array of at most its bounds: the
 * .npy's dims are the runtime sizes, padded to the bounds. */
static int npy_to_bounds(const kiln_npy *a, const kiln_shape *want, const char *label,
                         const char *got, const char *path, kiln_literal **out, kiln_status *st) {
  char exp[256];
  shape_str(want, exp, sizeof exp);
  kiln_arena *ar = kiln_arena_create();
  if (ar == NULL) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  kiln_literal view = {.data = a->data, .nbytes = a->nbytes};
  const kiln_literal *fit = NULL;
  kiln_status local;
  kiln_status_clear(&local);
  int rc = kiln_shape_make_array(ar, &view.shape, a->dtype, a->dims, a->rank);
  if (rc == 0) rc = kiln_literal_fit_bounds(NULL, &view, want, &fit, &local);
  if (rc)
    kiln_status_set(st, rc, NULL, "%s: expected %s, found %s in %s: %s", label, exp, got, path,
                    local.msg);
  kiln_arena_destroy(ar);
  if (rc) return rc;
  if (fit == &view) { /* already at the bounds: copy it out of the .npy */
    kiln_literal *lit;
    if ((rc = kiln_literal_create(NULL, want, 0, &lit, st))) return rc;
    if (a->nbytes) memcpy(lit->data, a->data, a->nbytes);
    fit = lit;
  }
  *out = (kiln_literal *)fit;
  return 0;
}

static int arg_from_npy(const char *path, const kiln_shape *want, const char *label,
                        kiln_literal **out, kiln_status *st) {
  char exp[256], got[256];
  shape_str(want, exp, sizeof exp);
  if (!kiln_shape_is_array(want))
    return kiln_status_set(st, KILN_EINVAL, NULL,
                           "%s: expected %s, which an .npy file cannot hold; give it as "
                           "literal text",
                           label, exp);
  kiln_npy a;
  kiln_status local;
  kiln_status_clear(&local);
  int rc = kiln_npy_read(path, &a, &local);
  if (rc) return kiln_status_set(st, rc, NULL, "%s: %s: %s", label, path, local.msg);
  npy_shape_str(&a, got, sizeof got);
  if (kiln_shape_is_dynamic(want) && a.dtype == want->dtype) {
    rc = npy_to_bounds(&a, want, label, got, path, out, st);
    goto out_free_npy;
  }
  bool dims_ok = a.rank == want->rank;
  for (uint32_t i = 0; dims_ok && i < a.rank; i++) dims_ok = a.dims[i] == want->dims[i];
  bool widen = a.dtype == KILN_F32 && want->dtype == KILN_BF16;
  if (!dims_ok || (a.dtype != want->dtype && !widen)) {
    rc = kiln_status_set(st, KILN_EINVAL, NULL, "%s: expected %s, found %s in %s%s", label, exp,
                         got, path,
                         want->dtype == KILN_BF16 && dims_ok
                             ? " (a bf16 parameter takes a bf16 literal or a float32 .npy)"
                             : "");
    goto out_free_npy;
  }
  kiln_literal *lit;
  rc = kiln_literal_create(NULL, want, 0, &lit, st);
  if (rc) goto out_free_npy;
  if (widen) {
    int64_t n = kiln_literal_elements(lit);
    const float *f = a.data;
    for (int64_t i = 0; i < n; i++) kiln_literal_set_f64(lit, i, f[i]);
  } else if (a.nbytes) {
    memcpy(lit->data, a.data, a.nbytes); /* same dtype and dims: same byte count */
  }
  *out = lit;
out_free_npy:
  kiln_npy_free(&a);
  return rc;
}

static int arg_from_text(const char *text, const kiln_shape *want, const char *label,
                         kiln_literal **out, kiln_status *st) {
  kiln_literal *lit;
  kiln_status local;
  kiln_status_clear(&local);
  int rc = kiln_literal_parse_text(text, strlen(text), &lit, &local);
  if (rc)
    return kiln_status_set(st, rc, NULL, "%s: cannot parse '%s' as a literal: %s%s%s", label, text,
                           local.where, local.where[0] ? ": " : "", local.msg);
  if (!kiln_shape_equal(&lit->shape, want, false) && kiln_shape_is_dynamic(want)) {
    const kiln_literal *fit = NULL;
    int frc = kiln_literal_fit_bounds(NULL, lit, want, &fit, &local);
    if (frc == 0) {
      kiln_literal_destroy(lit);
      *out = (kiln_literal *)fit;
      return 0;
    }
  }
  if (!kiln_shape_equal(&lit->shape, want, false)) {
    char exp[256], got[256];
    shape_str(want, exp, sizeof exp);
    shape_str(&lit->shape, got, sizeof got);
    kiln_literal_destroy(lit);
    return kiln_status_set(st, KILN_EINVAL, NULL, "%s: expected %s, found %s", label, exp, got);
  }
  *out = lit;
  return 0;
}

int kiln__arg_load(const char *spec, const kiln_shape *want, int64_t pnum, kiln_literal **out,
                   kiln_status *st) {
  *out = NULL;
  char label[64];
  snprintf(label, sizeof label, "parameter %lld", (long long)pnum);
  if (ends_with(spec, ".npy")) return arg_from_npy(spec, want, label, out, st);
  return arg_from_text(spec, want, label, out, st);
}

int kiln__arg_shape(const char *spec, kiln_arena *a, kiln_shape *out, kiln_status *st) {
  if (ends_with(spec, ".npy")) {
    kiln_npy n;
    kiln_status local;
    kiln_status_clear(&local);
    int rc = kiln_npy_read(spec, &n, &local);
    if (rc) return kiln_status_set(st, rc, NULL, "%s: %s", spec, local.msg);
    rc = kiln_shape_make_array(a, out, n.dtype, n.dims, n.rank);
    kiln_npy_free(&n);
    return rc ? kiln_status_set(st, rc, NULL, "out of memory") : 0;
  }
  kiln_literal *lit;
  kiln_status local;
  kiln_status_clear(&local);
  int rc = kiln_literal_parse_text(spec, strlen(spec), &lit, &local);
  if (rc)
    return kiln_status_set(st, rc, NULL, "cannot parse '%s' as a literal: %s%s%s", spec,
                           local.where, local.where[0] ? ": " : "", local.msg);
  rc = kiln_shape_copy(a, out, &lit->shape);
  kiln_literal_destroy(lit);
  return rc ? kiln_status_set(st, rc, NULL, "out of memory") : 0;
}

/* ---- random arguments --------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Stored mantissa bits: values -1 + k * 2^-m are exact in the type, so a
 * narrow float gets exactly the value generated and never rounds up to 1. */
static int mantissa_bits(kiln_dtype t) {
  switch (t) {
  case KILN_F64:
  case KILN_C128: return 52;
  case KILN_F32:
  case KILN_C64: return 23;
  case KILN_F16: return 10;
  case KILN_BF16: return 7;
  case KILN_F8E3M4: return 4;
  case KILN_F8E5M2:
  case KILN_F8E5M2FNUZ: return 2;
  case KILN_F4E2M1FN: return 1;
  case KILN_F8E8M0FNU: return 0;
  default: return 3; /* the e4m3 family */
  }
}

static double unit_grid(uint64_t *s, int m) {
  uint64_t k = splitmix64(s) >> (63 - m); /* uniform in [0, 2^(m+1)) */
  return -1.0 + (double)k / (double)(UINT64_C(1) << m);
}

static void fill_random(kiln_literal *lit, uint64_t *s) {
  if (kiln_shape_is_tuple(&lit->shape)) {
    for (uint32_t i = 0; i < lit->shape.rank; i++) fill_random(lit->elems[i], s);
    return;
  }
  if (!kiln_shape_is_array(&lit->shape)) return;
  kiln_dtype t = lit->shape.dtype;
  int64_t n = kiln_literal_elements(lit);
  int bits = kiln_dtype_bits(t);
  uint64_t span = bits >= 4 ? 16 : UINT64_C(1) << bits;
  for (int64_t i = 0; i < n; i++) {
    if (kiln_dtype_is_complex(t)) {
      int m = mantissa_bits(t);
      double re = unit_grid(s, m);
      kiln_literal_set_c128(lit, i, re, unit_grid(s, m));
    } else if (kiln_dtype_is_float(t)) {
      kiln_literal_set_f64(lit, i, unit_grid(s, mantissa_bits(t)));
    } else if (kiln_dtype_is_signed_int(t)) {
      kiln_literal_set_s64(lit, i, (int64_t)(splitmix64(s) % span) - (int64_t)(span / 2));
    } else if (kiln_dtype_is_unsigned_int(t)) {
      kiln_literal_set_u64(lit, i, splitmix64(s) % span);
    } else if (t == KILN_PRED) {
      kiln_literal_set_u64(lit, i, splitmix64(s) >> 63);
    }
  }
}

int kiln__arg_random(const kiln_shape *shape, uint64_t *state, kiln_literal **out,
                     kiln_status *st) {
  int rc = kiln_literal_create(NULL, shape, 0, out, st);
  if (rc) return rc;
  fill_random(*out, state);
  return 0;
}

/* ---- results ------------------------------------------------------------ */

static uint32_t count_leaves(const kiln_literal *lit) {
  if (!kiln_shape_is_tuple(&lit->shape)) return 1;
  uint32_t n = 0;
  for (uint32_t i = 0; i < lit->shape.rank; i++) n += count_leaves(lit->elems[i]);
  return n;
}

static void collect_leaves(const kiln_literal *lit, const kiln_literal **v, uint32_t *n) {
  if (!kiln_shape_is_tuple(&lit->shape)) {
    v[(*n)++] = lit;
    return;
  }
  for (uint32_t i = 0; i < lit->shape.rank; i++) collect_leaves(lit->elems[i], v, n);
}

int kiln__literal_leaves(const kiln_literal *lit, const kiln_literal ***leaves, uint32_t *n) {
  uint32_t count = count_leaves(lit);
  *n = 0;
  *leaves = kiln_calloc(count ? count : 1, sizeof **leaves);
  if (*leaves == NULL) return KILN_ENOMEM;
  collect_leaves(lit, *leaves, n);
  return 0;
}

/* The dtype a result is written as: its own, or a NumPy type that holds it. */
static kiln_dtype npy_dtype_for(kiln_dtype t) {
  if (kiln_npy_descr(t)) return t;
  if (kiln_dtype_is_float(t)) return KILN_F32;
  if (t == KILN_S2 || t == KILN_S4) return KILN_S8;
  if (t == KILN_U2 || t == KILN_U4) return KILN_U8;
  return KILN_INVALID;
}

int kiln__literal_write_npy(const kiln_literal *lit, const char *path, kiln_status *st) {
  const kiln_shape *s = &lit->shape;
  kiln_dtype t = kiln_shape_is_array(s) ? npy_dtype_for(s->dtype) : KILN_INVALID;
  if (t == KILN_INVALID) {
    char buf[64];
    shape_str(s, buf, sizeof buf);
    return kiln_status_set(st, KILN_EINVAL, path, "a %s value has no .npy form", buf);
  }
  /* A bounded-dynamic array is written at its runtime size: copy the
   * leading corner of the padded storage. */
  int64_t dims[KILN_NPY_MAX_RANK];
  if (s->rank > KILN_NPY_MAX_RANK)
    return kiln_status_set(st, KILN_EINVAL, path, "rank %u is over the .npy limit", s->rank);
  int64_t n = 1;
  for (uint32_t d = 0; d < s->rank; d++) {
    dims[d] = lit->dynamic_sizes ? lit->dynamic_sizes[d] : s->dims[d];
    n *= dims[d];
  }
  size_t item = kiln_dtype_size(t);
  void *data = kiln_malloc(n ? (size_t)n * item : 1);
  if (data == NULL) return kiln_status_set(st, KILN_ENOMEM, path, "out of memory");
  int64_t idx[KILN_NPY_MAX_RANK] = {0};
  for (int64_t k = 0; k < n; k++) {
    int64_t src = 0; /* row-major offset in the padded (bound) storage */
    for (uint32_t d = 0; d < s->rank; d++) src = src * s->dims[d] + idx[d];
    if (t == KILN_F32 && s->dtype != KILN_F32)
      ((float *)data)[k] = (float)kiln_literal_get_f64(lit, src);
    else
      memcpy((char *)data + (size_t)k * item, (const char *)lit->data + (size_t)src * item, item);
    for (uint32_t d = s->rank; d-- > 0;) { /* odometer over the runtime dims */
      if (++idx[d] < dims[d]) break;
      idx[d] = 0;
    }
  }
  int rc = kiln_npy_write(path, t, dims, s->rank, data, (size_t)n * item, st);
  kiln_free(data);
  return rc;
}

int kiln__arg_shapes(const kiln__args *a, kiln_arena *ar, const kiln_shape ***out, uint32_t *n,
                     kiln_status *st) {
  int ngiven;
  const char **given = kiln__args_all(a, "arg", &ngiven);
  size_t cap = ngiven ? (size_t)ngiven : 1; /* none given is still "infer from these" */
  kiln_shape *store = kiln_arena_calloc(ar, cap, sizeof *store);
  const kiln_shape **shapes = kiln_arena_calloc(ar, cap, sizeof *shapes);
  if (store == NULL || shapes == NULL)
    return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  for (int i = 0; i < ngiven; i++) {
    int rc = kiln__arg_shape(given[i], ar, &store[i], st);
    if (rc) return rc;
    shapes[i] = &store[i];
  }
  *out = shapes;
  *n = (uint32_t)ngiven;
  return 0;
}
