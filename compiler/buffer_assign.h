/* Buffer assignment: which memory every value of a compiled module lives in.
 *
 * The computations that run as step programs (the entry, while conditions
 * and bodies, conditional branches, called computations) are laid end to end
 * in one order: each instruction is a position, and a nested computation's
 * instructions sit at the position of the instruction that runs it. Values
 * are grouped into buffers: a tuple is the list of its leaves' buffers;
 * get-tuple-element, tuple, bitcast, copy and reshape/transpose that keep the
 * physical order alias their operand's buffers; a call's result is its
 * computation's root, and a conditional's result the root of each branch
 * whose root buffer is the branch's own temporary; a while's state is one
 * set of buffers shared by the loop's operand copy, its condition's and
 * body's parameters and its result, except that a leaf the body passes
 * through unchanged stays in the operand's buffer. An elementwise result
 * may take over the buffer of an operand that dies at that instruction (in
 * place; a loop state leaf first, which saves the copy back), a loop's
 * state the buffer of an operand leaf
 * that dies at the loop, the state of a loop the entry runs an output
 * buffer, and a result leaf a donated parameter (input_output_alias). A
 * lax.scan step thus copies nothing but what the body moves from one state
 * leaf to another. Buffers live from
 * their first definition to their last use; temporaries get offsets in one
 * arena by a greedy best-fit sweep over the positions, entry results become
 * output slots, entry parameters parameter slots and constants constant
 * slots in the constants blob.
 */
#ifndef KILN_COMPILER_BUFFER_ASSIGN_H
#define KILN_COMPILER_BUFFER_ASSIGN_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/codegen/executable.h"
#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_NO_SLOT UINT32_MAX

typedef struct kiln_buffer_options {
  /* Per instruction id: bytes of scratch memory it needs while it runs (a
   * GEMM result before its epilogue, sort permutations), or NULL. */
  const uint64_t *scratch_bytes;
  uint64_t alignment; /* of every temporary and constant; 0: 64 */
} kiln_buffer_options;

typedef struct kiln_buffer_assignment {
  kiln_slot *slots; /* kiln_executable's slot table */
  uint32_t nslots;
  /* Per instruction id: its leaves' slots are leaf_slots[leaf_start[id] ..
   * + nleaves[id]) (depth-first); nleaves 0 for instructions outside the
   * program computations. */
  uint32_t *leaf_start, *nleaves, *leaf_slots;
  uint32_t *scratch_slot; /* per instruction id, or KILN_NO_SLOT */
  /* Per result leaf of the entry: the slot the caller reads it from (an
   * output slot, or a donated parameter's slot). */
  uint32_t *result_slots;
  uint32_t nresults;
  uint64_t temp_bytes;     /* size of the temporary arena */
  uint64_t peak_bytes;     /* most temporary bytes live at one position */
  uint64_t constant_bytes; /* size of the constants blob */
  /* Where the peak comes from, for passes that weigh memory (remat.c):
   * per instruction id the position it runs at (-1 outside the program
   * computations; a while, call or conditional spans the positions of its
   * computations after its own), per slot the positions it is live at, from
   * slot_def to slot_last inclusive (meaningful for temporaries). The live
   * temporaries at a position are the temporary slots whose range holds it,
   * each rounded up to `alignment`; peak_bytes is the most of them. */
  int64_t *instr_pos;
  int64_t *slot_def, *slot_last;
  uint64_t alignment;
  kiln_arena *arena; /* owns the arrays above */
} kiln_buffer_assignment;

/* Assigns buffers for module m (verified, every program computation run
 * from one place only). Fails with KILN_EUNIMPL on bounded-dynamic shapes
 * and KILN_EINVAL on malformed input. */
int kiln_buffer_assign(const kiln_module *m, const kiln_buffer_options *o,
                       kiln_buffer_assignment **out, kiln_status *st);
void kiln_buffer_assignment_destroy(kiln_buffer_assignment *ba);

/* The slots of instruction id's leaves (NULL when it has none). */
const uint32_t *kiln_buffer_leaves(const kiln_buffer_assignment *ba, kiln_id id, uint32_t *n);

/* ---- shared layout predicates (also used by code generation) ------------ */

/* Whether the two array shapes of equal element count store their elements
 * in the same physical order when both are read in logical row-major order
 * (a reshape between them moves no bytes). */
bool kiln__reshape_is_bitcast(const kiln_shape *from, const kiln_shape *to);
/* Whether transpose(from, perm) -> to moves no bytes. */
bool kiln__transpose_is_bitcast(const kiln_shape *from, const kiln_shape *to, const int64_t *perm);
/* Same dims and same physical order (a copy between them is a memcpy). */
bool kiln__same_layout(const kiln_shape *a, const kiln_shape *b);
/* Whether instruction ins (elementwise op or fusion) reads operand k only
 * at the position of the element it writes, with the same physical layout
 * and element size, so its result may share operand k's buffer. */
bool kiln__can_write_over(const kiln_module *m, const kiln_instr *ins, uint32_t k);
/* Whether a value of op `ins` is just its operand 0's bytes (no step). */
bool kiln__is_alias_op(const kiln_module *m, const kiln_instr *ins);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_BUFFER_ASSIGN_H */
