/* Structural equality and hashing of attributes and instructions, for
 * common subexpression elimination and any pass that needs to recognise two
 * instructions computing the same value.
 *
 * Hashes agree with equality: equal attributes (instructions) hash equal.
 */
#ifndef KILN_COMPILER_PASSES_EQUAL_H
#define KILN_COMPILER_PASSES_EQUAL_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/ir/ir.h"

/* Same key (and spelling, for unknown keys) and structurally equal value.
 * FLOAT values compare by bits. */
bool kiln__attr_equal(const kiln_attr *a, const kiln_attr *b);
uint64_t kiln__attr_hash(const kiln_attr *a);

/* Whether a and b compute the same value: same opcode (and async wrapped
 * op), the same operand ids in order (or swapped, for a commutative binary
 * op), equal result shapes with layouts, the same attributes as a set
 * (metadata aside: it names where a value came from, not what it is), the
 * same called computations, parameter number and constant literal. Control
 * predecessors are not compared. */
bool kiln__instr_equal(const kiln_instr *a, const kiln_instr *b);
uint64_t kiln__instr_hash(const kiln_instr *a);

/* Literal equality including layouts-free shape and bytes, with a hash. */
uint64_t kiln__literal_hash(const kiln_literal *lit);

#endif /* KILN_COMPILER_PASSES_EQUAL_H */
