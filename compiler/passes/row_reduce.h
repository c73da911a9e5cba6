/* Row reductions inside loop kernels: the reduce-then-broadcast pattern of
 * softmax and layernorm (max or sum over the row, then every element of the
 * row combined with it) run as one kernel per row.
 *
 * A loop kernel in the row form (kernel_loop.c) runs one iteration per row
 * of its output (every index but the physically minor dim fixed) and an
 * inner loop over the row. The plan below says which members of such a
 * kernel are computed once per row, before the inner loop:
 *  - a reduce whose input has the output's dims and which reduces exactly
 *    the output's minor dim, read only at the current row's index (through
 *    elementwise ops on its own dims, reshapes that only add or drop dims of
 *    size 1, and broadcasts that keep its dims in order);
 *  - a broadcast to the output's dims that does not vary along the row
 *    (its operand has no dim of size > 1 on the minor dim), whose operand is
 *    computed from such a reduce, read only at indices of the current row.
 * The code generator binds each of them to a C variable, so the inner loop
 * reads it at no cost; the fusion pass uses the plan to accept a reduce into
 * a loop kernel only when every reduce of the kernel is computed this way,
 * and the cost model to charge such a broadcast once per row.
 *
 * The plan is purely structural and conservative: anything it cannot prove
 * is read within the row (a transpose, a slice, a reduce over other dims, a
 * full reduction...) makes the values below it ordinary per-element values.
 */
#ifndef KILN_COMPILER_PASSES_ROW_REDUCE_H
#define KILN_COMPILER_PASSES_ROW_REDUCE_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/ir/ir.h"

enum { KILN__ROW_NONE = 0, KILN__ROW_REDUCE = 1, KILN__ROW_BCAST = 2 };

/* The minor dim of the rows of a kernel writing `out`, or -1 when that
 * kernel has no row form (rank below 2, or a minor dim shorter than
 * KILN__ROW_MIN). */
#define KILN__ROW_MIN 8
int kiln__row_minor(const kiln_shape *out);

/* Plans the row kernel of members[0..n) (ids of one computation, every one
 * after the members among its operands; others are inputs) that stores the
 * values roots[0..nroots) at its output index, rows taken from `out` (the
 * dims and layout of the output). role[i] receives member i's role
 * (KILN__ROW_*); *stranded the number of member reduces (not roots) left
 * without a row role; in_row (NULL: not wanted) whether member i is read
 * only at indices of the current row with the output's dims, at the
 * position in the row of the loop that reads it (so that a value one pass
 * over the row computed may be kept for the next, indexed by that
 * position). Returns 0 or KILN_ENOMEM. */
int kiln__row_plan(const kiln_module *m, const kiln_id *members, uint32_t n, const kiln_id *roots,
                   uint32_t nroots, const kiln_shape *out, uint8_t *role, uint32_t *stranded,
                   bool *in_row);

#endif /* KILN_COMPILER_PASSES_ROW_REDUCE_H */
