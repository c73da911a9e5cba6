/* The verifier and shape inference.
 *
 * kiln_module_verify checks a whole module: structure (one ENTRY, roots,
 * operands defined before use and within their computation, no cycles in
 * calls, nesting no deeper than a limit), per-op operand counts and types, attribute ranges, called
 * computations' signatures, and that every result shape equals the inferred
 * one. Each error names the computation and instruction in kiln_status.where
 * ("main/d3") and, in the message, the opcode, the operand and what was
 * expected vs found: "dot: lhs contracting dim 1 has size 7 but rhs
 * contracting dim 0 has size 5".
 */
#ifndef KILN_COMPILER_IR_VERIFY_H
#define KILN_COMPILER_IR_VERIFY_H

#include "common/thread.h"
#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Nesting depth: how many computations deep the longest chain of called
 * computations reaches below any computation (a while in a call in the
 * entry is 2). The walks that follow calls recurse, so the verifier refuses
 * a module nested deeper than the limit before any of them runs. JAX
 * programs nest a few tens deep; the largest limit a caller may set is
 * what every recursive walk (and the backends' run loops) was measured to
 * take on an 8 MiB stack, with room to spare, and it is what the backends
 * accept: KILN_NESTING_CAPACITY (common/thread.h). */
#define KILN_VERIFY_DEFAULT_MAX_NESTING 256
#define KILN_VERIFY_MAX_NESTING KILN_NESTING_CAPACITY

typedef struct kiln_verify_options {
  int64_t max_elements; /* per array; 0: default 2^40 */
  /* 0: KILN_VERIFY_DEFAULT_MAX_NESTING; more than KILN_VERIFY_MAX_NESTING
   * counts as that */
  uint32_t max_nesting;
} kiln_verify_options;

int kiln_module_verify(const kiln_module *m, const kiln_verify_options *opts, kiln_status *st);

/* Infers the result shape of `ins` from its operands' shapes, attributes and
 * called computations, as XLA's ShapeInference does. The shape is written
 * into `out`, allocated in arena `a`. Errors name the instruction. Layouts of
 * the result are left absent. */
int kiln_infer_shape(const kiln_module *m, const kiln_instr *ins, kiln_arena *a, kiln_shape *out,
                     kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_IR_VERIFY_H */
