/* Lookups over the closed lists: element types, opcodes, attribute keys,
 * comparison directions. Each is expanded from its .def table; name lookups
 * are linear scans over a few dozen short strings, cheap next to parsing. */
#include <string.h>

#include "compiler/ir/ir.h"

typedef struct dtype_info {
  const char *name;
  int bits;
  size_t bytes;
  kiln_dtype_kind kind;
} dtype_info;

static const dtype_info dtypes[KILN_DTYPE_COUNT] = {
#define X(e, s, bits, bytes, kind) {s, bits, bytes, KILN_KIND_##kind},
#include "compiler/ir/types.def"
#undef X
};

static bool valid_dtype(kiln_dtype t) { return (unsigned)t < KILN_DTYPE_COUNT; }

const char *kiln_dtype_name(kiln_dtype t) { return valid_dtype(t) ? dtypes[t].name : "invalid"; }

static bool name_eq(const char *want, const char *s, size_t n) {
  return strlen(want) == n && memcmp(want, s, n) == 0;
}

bool kiln_dtype_from_name(const char *s, size_t n, kiln_dtype *out) {
  for (int i = 1; i < KILN_DTYPE_COUNT; i++) {
    if (i == KILN_TUPLE) continue; /* not a spelling in text */
    if (name_eq(dtypes[i].name, s, n)) {
      *out = (kiln_dtype)i;
      return true;
    }
  }
  return false;
}

int kiln_dtype_bits(kiln_dtype t) { return valid_dtype(t) ? dtypes[t].bits : 0; }
size_t kiln_dtype_size(kiln_dtype t) { return valid_dtype(t) ? dtypes[t].bytes : 0; }
kiln_dtype_kind kiln_dtype_kind_of(kiln_dtype t) {
  return valid_dtype(t) ? dtypes[t].kind : KILN_KIND_OTHER;
}
bool kiln_dtype_is_float(kiln_dtype t) { return kiln_dtype_kind_of(t) == KILN_KIND_FLOAT; }
bool kiln_dtype_is_signed_int(kiln_dtype t) { return kiln_dtype_kind_of(t) == KILN_KIND_SINT; }
bool kiln_dtype_is_unsigned_int(kiln_dtype t) { return kiln_dtype_kind_of(t) == KILN_KIND_UINT; }
bool kiln_dtype_is_integral(kiln_dtype t) {
  return kiln_dtype_is_signed_int(t) || kiln_dtype_is_unsigned_int(t);
}
bool kiln_dtype_is_complex(kiln_dtype t) { return kiln_dtype_kind_of(t) == KILN_KIND_COMPLEX; }
bool kiln_dtype_is_array(kiln_dtype t) {
  switch (kiln_dtype_kind_of(t)) {
  case KILN_KIND_PRED:
  case KILN_KIND_SINT:
  case KILN_KIND_UINT:
  case KILN_KIND_FLOAT:
  case KILN_KIND_COMPLEX: return true;
  default: return false;
  }
}

typedef struct op_info {
  const char *name;
  int arity;
  kiln_op_family family;
  unsigned flags;
} op_info;

#define E KILN_OPF_ELEMENTWISE
#define C KILN_OPF_COMMUTATIVE
#define K KILN_OPF_CALLS
#define S KILN_OPF_SIDE_EFFECT
#define A KILN_OPF_ASYNC
#define L KILN_OPF_COLLECTIVE
#define R KILN_OPF_RANDOM
#define B KILN_OPF_BARRIER
#define I KILN_OPF_INDEXING
#define F KILN_OPF_FOLDABLE
static const op_info ops[KILN_OP_COUNT] = {
#define X(e, s, arity, family, flags) {s, arity, KILN_FAM_##family, flags},
#include "compiler/ir/ops.def"
#undef X
};
#undef E
#undef C
#undef K
#undef S
#undef A
#undef L
#undef R
#undef B
#undef I
#undef F

const char *kiln_opcode_name(kiln_opcode op) {
  return (unsigned)op < KILN_OP_COUNT ? ops[op].name : "invalid";
}

bool kiln_opcode_from_name(const char *s, size_t n, kiln_opcode *out) {
  for (int i = 1; i < KILN_OP_COUNT; i++) {
    if (name_eq(ops[i].name, s, n)) {
      *out = (kiln_opcode)i;
      return true;
    }
  }
  return false;
}

int kiln_opcode_arity(kiln_opcode op) { return (unsigned)op < KILN_OP_COUNT ? ops[op].arity : 0; }
unsigned kiln_opcode_flags(kiln_opcode op) {
  return (unsigned)op < KILN_OP_COUNT ? ops[op].flags : 0;
}

kiln_op_family kiln_opcode_family(kiln_opcode op) {
  return (unsigned)op < KILN_OP_COUNT ? ops[op].family : KILN_FAM_NONE;
}

bool kiln_opcode_is_elementwise_family(kiln_opcode op) {
  kiln_op_family f = kiln_opcode_family(op);
  return f == KILN_FAM_UNARY || f == KILN_FAM_BINARY || f == KILN_FAM_COMPARE ||
         f == KILN_FAM_TERNARY;
}

bool kiln_opcode_is_pure(kiln_opcode op) {
  const unsigned impure = KILN_OPF_SIDE_EFFECT | KILN_OPF_ASYNC | KILN_OPF_COLLECTIVE |
                          KILN_OPF_RANDOM | KILN_OPF_BARRIER;
  return kiln_opcode_family(op) != KILN_FAM_NONE && !(kiln_opcode_flags(op) & impure);
}

bool kiln_opcode_has_side_effects(kiln_opcode op) {
  return (kiln_opcode_flags(op) & KILN_OPF_SIDE_EFFECT) != 0;
}

bool kiln_opcode_is_foldable(kiln_opcode op) {
  return (kiln_opcode_flags(op) & KILN_OPF_FOLDABLE) != 0;
}

typedef struct attr_info {
  const char *name;
  kiln_attr_kind kind;
} attr_info;

static const attr_info attrs[KILN_ATTR_COUNT] = {
#define X(e, s, kind) {s, KILN_AK_##kind},
#include "compiler/ir/attrs.def"
#undef X
};

const char *kiln_attr_key_name(kiln_attr_key k) {
  return (unsigned)k < KILN_ATTR_COUNT ? attrs[k].name : "invalid";
}

bool kiln_attr_key_from_name(const char *s, size_t n, kiln_attr_key *out) {
  for (int i = 1; i < KILN_ATTR_UNKNOWN; i++) {
    if (name_eq(attrs[i].name, s, n)) {
      *out = (kiln_attr_key)i;
      return true;
    }
  }
  return false;
}

kiln_attr_kind kiln_attr_key_kind(kiln_attr_key k) {
  return (unsigned)k < KILN_ATTR_COUNT ? attrs[k].kind : KILN_AK_OPAQUE;
}

const char *kiln_cmp_dir_name(kiln_cmp_dir d) {
  static const char *names[] = {"EQ", "NE", "GE", "GT", "LE", "LT"};
  return (unsigned)d < 6 ? names[d] : "??";
}
