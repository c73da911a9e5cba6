/* One-call runs: module -> (compile) -> load -> run -> release.
 *
 * Each call creates its own backend and releases it before returning, so
 * nothing lingers between calls (no thread pool survives a fork, no cached
 * code outlives its executable). That costs a thread start per device per
 * call, which is fine for the command line and tests; a server keeps its
 * backend.
 */
#include "executor/run.h"

#include <string.h>

#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/eval/interp.h"

int kiln_run_executable(const kiln_executable *e, const kiln_backend_options *bopts,
                        const kiln_run_options *ropts, const kiln_literal *const *args,
                        uint32_t nargs, kiln_literal **out, kiln_status *st) {
  kiln_backend *b = NULL;
  kiln_loaded *l = NULL;
  int rc = kiln_backend_create("cpu", bopts, &b, st);
  if (rc == 0) rc = kiln_device_load(kiln_backend_device(b, 0), e, &l, st);
  if (rc == 0) rc = kiln_loaded_run(l, args, nargs, ropts, out, st);
  kiln_loaded_destroy(l);
  kiln_backend_destroy(b);
  return rc;
}

int kiln_run_executable_blob(const uint8_t *blob, size_t len, const kiln_backend_options *bopts,
                             const kiln_run_options *ropts, const kiln_literal *const *args,
                             uint32_t nargs, kiln_literal **out, kiln_status *st) {
  if (out) *out = NULL;
  if (blob == NULL && len > 0)
    return kiln_status_set(st, KILN_EINVAL, "run", "no executable bytes");
  kiln_executable *e = NULL;
  int rc = kiln_executable_deserialize(blob, len, &e, st);
  if (rc == 0) rc = kiln_run_executable(e, bopts, ropts, args, nargs, out, st);
  kiln_executable_destroy(e);
  return rc;
}

static int run_cpu(const kiln_module *m, const kiln_compile_options *copts,
                   const kiln_backend_options *bopts, const kiln_run_options *ropts,
                   const kiln_literal *const *args, uint32_t nargs, kiln_literal **out,
                   kiln_status *st) {
  kiln_executable *e = NULL;
  int rc = kiln_compile(m, copts, &e, NULL, st);
  if (rc == 0) rc = kiln_run_executable(e, bopts, ropts, args, nargs, out, st);
  kiln_executable_destroy(e);
  return rc;
}

int kiln_run_module_with(const kiln_module *m, const char *backend,
                         const kiln_compile_options *copts, const kiln_backend_options *bopts,
                         const kiln_run_options *ropts, const kiln_literal *const *args,
                         uint32_t nargs, kiln_literal **out, kiln_status *st) {
  if (out == NULL) return kiln_status_set(st, KILN_EINVAL, "run", "no result pointer");
  *out = NULL;
  if (m == NULL) return kiln_status_set(st, KILN_EINVAL, "run", "no module");
  if (args == NULL && nargs > 0) return kiln_status_set(st, KILN_EINVAL, "run", "no arguments");
  kiln_run_options defaults = {0};
  if (ropts == NULL) ropts = &defaults;
  if (backend == NULL || strcmp(backend, "interp") == 0) {
    kiln_interp_options io = {
        .max_while_iterations = ropts->max_while_iterations,
        .timeout_seconds = ropts->timeout_seconds,
        .cancel = ropts->cancel,
    };
    return kiln_interp_run(m, args, nargs, &io, out, st);
  }
  if (strcmp(backend, "cpu") == 0) return run_cpu(m, copts, bopts, ropts, args, nargs, out, st);
  return kiln_status_set(st, KILN_ENOTFOUND, "run", "unknown backend '%.64s' (known: cpu, interp)",
                         backend);
}

int kiln_run_module(const kiln_module *m, const char *backend, const kiln_compile_options *copts,
                    const kiln_literal *const *args, uint32_t nargs, kiln_literal **out,
                    kiln_status *st) {
  return kiln_run_module_with(m, backend, copts, NULL, NULL, args, nargs, out, st);
}
