/* Placeholder until the verifier lands. */
#include "compiler/ir/verify.h"

int kiln_module_verify(const kiln_module *m, const kiln_verify_options *opts, kiln_status *st) {
  (void)m; (void)opts;
  return kiln_status_set(st, KILN_EUNIMPL, NULL, "verifier not built yet");
}

int kiln_infer_shape(const kiln_module *m, const kiln_instr *ins, kiln_arena *a,
                     kiln_shape *out, kiln_status *st) {
  (void)m; (void)ins; (void)a; (void)out;
  return kiln_status_set(st, KILN_EUNIMPL, NULL, "shape inference not built yet");
}
