/* Placeholder. */
#include "executor/interp/interp_internal.h"
int kiln__interp_eval_cholesky(kiln__interp_ctx *c, const kiln_instr *ins,
                               const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
int kiln__interp_eval_triangular_solve(kiln__interp_ctx *c, const kiln_instr *ins,
                                       const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
int kiln__interp_eval_fft(kiln__interp_ctx *c, const kiln_instr *ins,
                          const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
int kiln__interp_eval_batch_norm_inference(kiln__interp_ctx *c, const kiln_instr *ins,
                                           const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
int kiln__interp_eval_batch_norm_training(kiln__interp_ctx *c, const kiln_instr *ins,
                                          const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
int kiln__interp_eval_batch_norm_grad(kiln__interp_ctx *c, const kiln_instr *ins,
                                      const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  (void)out;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "not yet");
}
