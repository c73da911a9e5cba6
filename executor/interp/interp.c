/* Placeholder until the interpreter lands. */
#include "executor/interp/interp.h"

int kiln_interp_run(const kiln_module *m, const kiln_literal *const *args, uint32_t nargs,
                    const kiln_interp_options *opts, kiln_literal **out, kiln_status *st) {
  (void)m; (void)args; (void)nargs; (void)opts; (void)out;
  return kiln_status_set(st, KILN_EUNIMPL, NULL, "interpreter not built yet");
}
