/* Placeholder. */
#include "executor/interp/interp_internal.h"
int kiln__interp_eval_dot(kiln__interp_ctx *c, const kiln_instr *ins,
                          const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
int kiln__interp_eval_convolution(kiln__interp_ctx *c, const kiln_instr *ins,
                                  const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
