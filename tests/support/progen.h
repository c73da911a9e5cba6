/* A random generator of well-typed HLO modules, for differential tests
 * (every backend and pass against the interpreter) and for transform tests
 * (gradients against finite differences, vmap against stacking).
 *
 * The generator is deterministic in its seed and writes HLO text, so a
 * failing case can be printed, saved and replayed with the kiln command.
 */
#ifndef KILN_TESTS_SUPPORT_PROGEN_H
#define KILN_TESTS_SUPPORT_PROGEN_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/ir/ir.h"

/* Families of ops the generator may use (bit mask). */
enum {
  KILN_PROGEN_ELEMENTWISE = 1u << 0, /* unary and binary arithmetic, compare+select */
  KILN_PROGEN_BROADCAST = 1u << 1,
  KILN_PROGEN_RESHAPE = 1u << 2,
  KILN_PROGEN_TRANSPOSE = 1u << 3,
  KILN_PROGEN_SLICE = 1u << 4,
  KILN_PROGEN_CONCATENATE = 1u << 5,
  KILN_PROGEN_PAD = 1u << 6,
  KILN_PROGEN_DOT = 1u << 7,
  KILN_PROGEN_REDUCE = 1u << 8,
  KILN_PROGEN_REDUCE_WINDOW = 1u << 9,
  KILN_PROGEN_SELECT = 1u << 10,
  KILN_PROGEN_WHILE = 1u << 11, /* with a trip count known at compile time */
  KILN_PROGEN_CONDITIONAL = 1u << 12,
  KILN_PROGEN_DYNAMIC_SLICE = 1u << 13,
  KILN_PROGEN_GATHER = 1u << 14,
  KILN_PROGEN_ALL = (1u << 15) - 1,
};

typedef struct kiln_progen_options {
  uint64_t seed;
  int ninstrs;         /* approximate number of instructions in the entry */
  int nparams;         /* entry parameters (>= 1) */
  kiln_dtype dtype;    /* KILN_F32 or KILN_F64 */
  unsigned families;   /* KILN_PROGEN_* mask; 0 means ALL */
  bool differentiable; /* smooth ops only, inputs kept in their domains */
  bool scalar_output;  /* ROOT is a scalar (a final reduce), e.g. for grad */
  int max_dim;         /* largest dimension size (default 6) */
} kiln_progen_options;

/* HLO text of a random module; kiln_malloc'd, NUL-terminated. NULL on
 * out-of-memory. */
char *kiln_progen_text(const kiln_progen_options *o);

#endif /* KILN_TESTS_SUPPORT_PROGEN_H */
