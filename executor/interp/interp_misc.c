/* Placeholder. */
#include "executor/interp/interp_internal.h"
int kiln__interp_eval_rng(kiln__interp_ctx *c, const kiln_instr *ins,
                          const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
int kiln__interp_eval_rng_bit_generator(kiln__interp_ctx *c, const kiln_instr *ins,
                                        const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
int kiln__interp_eval_rng_get_and_update_state(kiln__interp_ctx *c, const kiln_instr *ins,
                                               const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
int kiln__interp_eval_collective(kiln__interp_ctx *c, const kiln_instr *ins,
                                 const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
int kiln__interp_eval_custom_call(kiln__interp_ctx *c, const kiln_instr *ins,
                                  const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
int kiln__interp_eval_replica_id(kiln__interp_ctx *c, const kiln_instr *ins,
                                 const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
