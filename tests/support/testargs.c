/* Deterministic test arguments: a splitmix64 stream filling each parameter
 * in order, with floats on a grid of the type's mantissa so the same
 * values reach the interpreter and every backend without rounding. */
#include "tests/support/testargs.h"

#include "common/alloc.h"

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int mantissa_bits(kiln_dtype t) {
  switch (t) {
  case KILN_F64:
  case KILN_C128: return 52;
  case KILN_F32:
  case KILN_C64: return 23;
  case KILN_F16: return 10;
  case KILN_BF16: return 7;
  default: return 2;
  }
}

static double unit(uint64_t *s, int m) {
  uint64_t k = splitmix64(s) >> (63 - m);
  return -1.0 + (double)k / (double)(UINT64_C(1) << m);
}

static void fill(kiln_literal *lit, uint64_t *s) {
  if (kiln_shape_is_tuple(&lit->shape)) {
    for (uint32_t i = 0; i < lit->shape.rank; i++) fill(lit->elems[i], s);
    return;
  }
  if (!kiln_shape_is_array(&lit->shape)) return;
  kiln_dtype t = lit->shape.dtype;
  int64_t n = kiln_literal_elements(lit);
  for (int64_t i = 0; i < n; i++) {
    if (kiln_dtype_is_complex(t)) {
      double re = unit(s, mantissa_bits(t));
      kiln_literal_set_c128(lit, i, re, unit(s, mantissa_bits(t)));
    } else if (kiln_dtype_is_float(t)) {
      kiln_literal_set_f64(lit, i, unit(s, mantissa_bits(t)));
    } else if (kiln_dtype_is_signed_int(t)) {
      kiln_literal_set_s64(lit, i, (int64_t)(splitmix64(s) % 16) - 8);
    } else if (kiln_dtype_is_unsigned_int(t)) {
      kiln_literal_set_u64(lit, i, splitmix64(s) % 16);
    } else if (t == KILN_PRED) {
      kiln_literal_set_u64(lit, i, splitmix64(s) >> 63);
    }
  }
}

int kiln_test_args_random(const kiln_module *m, uint64_t seed, kiln_literal ***args,
                          uint32_t *nargs, kiln_status *st) {
  *args = NULL;
  *nargs = 0;
  const kiln_computation *entry = kiln_module_entry(m);
  if (entry == NULL) return kiln_status_set(st, KILN_EINVAL, NULL, "module has no ENTRY");
  uint32_t n = kiln_computation_nparams(m, entry);
  kiln_literal **v = kiln_calloc(n ? n : 1, sizeof *v);
  if (v == NULL) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  uint64_t state = seed;
  for (uint32_t i = 0; i < n; i++) {
    const kiln_instr *p = kiln_computation_param(m, entry, i);
    int rc = p ? kiln_literal_create(NULL, &p->shape, 0, &v[i], st)
               : kiln_status_set(st, KILN_EINVAL, NULL, "parameter %u missing", i);
    if (rc) {
      kiln_test_args_free(v, i);
      return rc;
    }
    fill(v[i], &state);
  }
  *args = v;
  *nargs = n;
  return 0;
}

void kiln_test_args_free(kiln_literal **args, uint32_t nargs) {
  if (args == NULL) return;
  for (uint32_t i = 0; i < nargs; i++) kiln_literal_destroy(args[i]);
  kiln_free(args);
}
