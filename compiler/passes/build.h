/* Instruction builders for passes: names that stay unique within a
 * computation, scalar and splat constants, and the purity questions that
 * decide whether a pass may move, merge or evaluate an instruction.
 *
 * A namer holds the names of one computation in a hash set, so that every
 * added instruction gets a fresh name in O(1) instead of a scan.
 */
#ifndef KILN_COMPILER_PASSES_BUILD_H
#define KILN_COMPILER_PASSES_BUILD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/strmap.h"
#include "compiler/ir/ir.h"

typedef struct kiln__namer {
  kiln_module *m;
  uint32_t comp;
  kiln_strmap names; /* keys point at arena names, which outlive the namer */
} kiln__namer;

/* Fills the set with the names listed in computation `comp`. */
int kiln__namer_init(kiln__namer *n, kiln_module *m, uint32_t comp);
void kiln__namer_free(kiln__namer *n);

/* Appends to the namer's computation an instruction "<op>.<id>" (made
 * unique with a further suffix when taken) of shape `shape` (copied; may be
 * NULL) with the given operands. NULL on out-of-memory. */
kiln_instr *kiln__build(kiln__namer *n, kiln_opcode op, const kiln_shape *shape,
                        const kiln_id *operands, uint32_t noperands);

/* Appends a copy of `src` with the given operands (called computations
 * shared), named as src when that name is free in the computation, else
 * made up as kiln__build does. NULL on out-of-memory. */
kiln_instr *kiln__clone(kiln__namer *n, const kiln_instr *src, const kiln_id *operands,
                        uint32_t noperands);

/* A scalar constant of type t holding v (converted as kiln_literal_set_f64
 * does: floats rounded, integers truncated toward zero and wrapped). */
kiln_instr *kiln__build_scalar(kiln__namer *n, kiln_dtype t, double v);

/* A value of array shape `shape` whose elements all equal the scalar
 * `scalar` (an instruction of the same element type): the scalar itself
 * when the shape is a scalar, else a broadcast with dimensions={}. */
kiln_instr *kiln__build_splat(kiln__namer *n, kiln_id scalar, const kiln_shape *shape);

/* Whether the instruction may be removed, merged with an equal one,
 * evaluated at compile time or moved: no side effect, no randomness, no
 * communication, no async or token plumbing, no optimization barrier, and
 * (given `impure`, indexed by computation id, or NULL) no call into a
 * computation that is impure. */
bool kiln__instr_is_pure(const kiln_module *m, const kiln_instr *ins, const bool *impure);

/* impure[c] for every computation: it holds, or calls into, an instruction
 * that is not pure. kiln_malloc'd (m->ncomps entries); NULL on
 * out-of-memory. */
bool *kiln__impure_computations(const kiln_module *m);

#endif /* KILN_COMPILER_PASSES_BUILD_H */
