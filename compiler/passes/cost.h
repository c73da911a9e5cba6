/* The roofline cost model used by fusion (and by whoever must compare two
 * ways of running the same values).
 *
 * A kernel's time is max(flops / peak_flops, bytes / bandwidth) plus the
 * target's launch overhead: the kernel is either compute-bound or
 * memory-bound, and every launch costs a fixed amount. Bytes count each
 * operand read once and each output written once; values computed inside a
 * fused kernel cost no bytes. Flops count per element: 1 for cheap
 * arithmetic (add, compare, select, convert, ...), 4 for divide, remainder
 * and roots, 16 for transcendental functions (exp, log, tanh, sin, pow,
 * erf, ...); a dot costs 2 flops per multiply-add, a reduction its
 * reducer's flops per input element. Instructions that launch nothing
 * (parameter, constant, tuple, get-tuple-element, bitcast, ...) cost zero.
 *
 * A candidate fusion is a set of instructions of one computation with the
 * roots it writes. Inside it, an instruction is evaluated once per element
 * of whatever reads it (a loop kernel computes element index -> value), so
 * a producer under a broadcast is recomputed for every broadcast element:
 * the model charges that, which is what keeps expensive producers out of
 * kernels that would repeat them. The exception is a row kernel's row
 * broadcast (row_reduce.h), which the code generator computes once per
 * row: it is charged once per operand element.
 */
#ifndef KILN_COMPILER_PASSES_COST_H
#define KILN_COMPILER_PASSES_COST_H

#include <stdint.h>

#include "compiler/ir/ir.h"
#include "compiler/pass.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_cost {
  double flops;   /* arithmetic operations */
  double bytes;   /* bytes read plus bytes written */
  double seconds; /* roofline time, launch overhead included (0 when no kernel runs) */
  int kernels;    /* kernels launched: 0 or 1 for one instruction or one group */
} kiln_cost;

/* Flops of one element of an elementwise opcode (1, 4 or 16; 0 for ops
 * that compute nothing). */
double kiln_cost_op_flops(kiln_opcode op);

/* Time of a kernel doing `flops` and moving `bytes` on target t:
 * max(flops / peak_flops, bytes / bandwidth) + launch_overhead. */
double kiln_cost_time(const kiln_target *t, double flops, double bytes);

/* Cost of instruction `ins` run on its own (a fusion instruction: its fused
 * computation as one kernel; while/conditional/call: one pass through
 * their computations). */
void kiln_cost_instr(const kiln_module *m, const kiln_instr *ins, const kiln_target *t,
                     kiln_cost *out);

/* Cost of running the instructions `members` (ids of one computation, any
 * order, no duplicates) as one kernel that writes the values of `roots`
 * (members too). Operands from outside the set are read once (only the
 * sliced part when every use slices them); the roots are written once.
 * Returns 0, or KILN_ENOMEM. */
int kiln_cost_group(const kiln_module *m, const kiln_id *members, uint32_t nmembers,
                    const kiln_id *roots, uint32_t nroots, const kiln_target *t, kiln_cost *out);

/* Peak bytes of temporaries live at once when computation `comp` runs in
 * the order `order` (its instruction list when NULL): every value except
 * parameters and constants occupies its shape's bytes from its definition
 * to its last use (the root to the end); tuple, get-tuple-element and
 * bitcast make no new bytes and keep their operands alive as long as they
 * are used. Nested computations are not counted. -1 on out-of-memory. */
int64_t kiln_cost_peak_bytes(const kiln_module *m, uint32_t comp, const kiln_id *order);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_PASSES_COST_H */
