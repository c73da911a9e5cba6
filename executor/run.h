/* Running a module or a serialized executable in one call.
 *
 * The convenience layer the kiln command and the tests use: pick a backend
 * by name, compile when the backend needs code, load, run on host literals,
 * and release everything. A long-lived caller (the server) keeps its own
 * kiln_backend and loaded executables instead (executor/backend.h).
 */
#ifndef KILN_EXECUTOR_RUN_H
#define KILN_EXECUTOR_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "executor/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_compile_options kiln_compile_options;

/* Runs the ENTRY computation of m on `args` (one literal per parameter,
 * row-major) with backend "interp" (the reference interpreter) or "cpu"
 * (compiled with kiln_compile, `copts` may be NULL for the defaults, and run
 * on a cpu device). NULL backend means "interp". *out is a new heap literal.
 * Unknown backends are KILN_ENOTFOUND. */
int kiln_run_module(const kiln_module *m, const char *backend, const kiln_compile_options *copts,
                    const kiln_literal *const *args, uint32_t nargs, kiln_literal **out,
                    kiln_status *st);

/* The same with run options (iteration and time limits, a cancel flag;
 * NULL: defaults) and backend options for the cpu backend (NULL:
 * defaults). A run whose cancel flag is raised stops with KILN_ECANCELED. */
int kiln_run_module_with(const kiln_module *m, const char *backend,
                         const kiln_compile_options *copts, const kiln_backend_options *bopts,
                         const kiln_run_options *ropts, const kiln_literal *const *args,
                         uint32_t nargs, kiln_literal **out, kiln_status *st);

/* Runs a serialized executable (a .kexe blob from kiln_executable_serialize)
 * on the cpu backend. The blob is checked as hostile input first. */
int kiln_run_executable_blob(const uint8_t *blob, size_t len, const kiln_backend_options *bopts,
                             const kiln_run_options *ropts, const kiln_literal *const *args,
                             uint32_t nargs, kiln_literal **out, kiln_status *st);

/* Runs an in-memory executable on a fresh cpu backend. */
int kiln_run_executable(const kiln_executable *e, const kiln_backend_options *bopts,
                        const kiln_run_options *ropts, const kiln_literal *const *args,
                        uint32_t nargs, kiln_literal **out, kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXECUTOR_RUN_H */
