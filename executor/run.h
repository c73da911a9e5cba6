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

/* The backend kiln_run_module uses when none is named. */
#define KILN_RUN_DEFAULT_BACKEND "interp"

/* Runs the ENTRY computation of m on `args` (one literal per parameter,
 * row-major) on device 0 of a fresh backend `backend` (a name from
 * kiln_backend_names; NULL: KILN_RUN_DEFAULT_BACKEND). A backend that runs
 * modules (kiln_backend_runs_modules) gets the module as it is; any other is
 * given it compiled with kiln_compile (`copts` may be NULL for the
 * defaults). *out is a new heap literal. Unknown backends are
 * KILN_ENOTFOUND with a message naming the known ones. */
int kiln_run_module(const kiln_module *m, const char *backend, const kiln_compile_options *copts,
                    const kiln_literal *const *args, uint32_t nargs, kiln_literal **out,
                    kiln_status *st);

/* The same with run options (iteration and time limits, a cancel flag;
 * NULL: defaults) and backend options (NULL: defaults). A run whose cancel
 * flag is raised stops with KILN_ECANCELED. */
int kiln_run_module_with(const kiln_module *m, const char *backend,
                         const kiln_compile_options *copts, const kiln_backend_options *bopts,
                         const kiln_run_options *ropts, const kiln_literal *const *args,
                         uint32_t nargs, kiln_literal **out, kiln_status *st);

/* Runs a serialized executable (a .kexe blob from kiln_executable_serialize)
 * as kiln_run_executable does. The blob is checked as hostile input first. */
int kiln_run_executable_blob(const uint8_t *blob, size_t len, const kiln_backend_options *bopts,
                             const kiln_run_options *ropts, const kiln_literal *const *args,
                             uint32_t nargs, kiln_literal **out, kiln_status *st);

/* Runs an in-memory executable on device 0 of a fresh backend: the one its
 * target names (cpu for cpu targets), else the first registered backend
 * that loads executables. */
int kiln_run_executable(const kiln_executable *e, const kiln_backend_options *bopts,
                        const kiln_run_options *ropts, const kiln_literal *const *args,
                        uint32_t nargs, kiln_literal **out, kiln_status *st);

/* The same on backend `backend` (NULL: as kiln_run_executable chooses). */
int kiln_run_executable_on(const char *backend, const kiln_executable *e,
                           const kiln_backend_options *bopts, const kiln_run_options *ropts,
                           const kiln_literal *const *args, uint32_t nargs, kiln_literal **out,
                           kiln_status *st);

/* Runs a per-device program (explicit collectives, replica-id and
 * partition-id; what XLA's collective tests and post-partitioning dumps
 * are) on replicas x partitions devices of backend `backend` (NULL: the
 * default), device K = replica * partitions + partition: args[K] holds
 * device K's nargs arguments, outs[K] receives its result. On the interp
 * backend the devices are interpreters meeting at every collective (the
 * oracle); a backend that loads executables (cpu) gets the module
 * compiled once for that mesh (replica_count and num_partitions set to
 * replicas and partitions), loaded on that many devices and run as one gang
 * (kiln_mesh_run). Other backends are KILN_EUNIMPL. On failure every outs[K] is NULL and st names
 * the first failing device. */
int kiln_run_module_mesh(const kiln_module *m, const char *backend, const kiln_run_options *ropts,
                         uint32_t replicas, uint32_t partitions,
                         const kiln_literal *const *const *args, uint32_t nargs,
                         kiln_literal **outs, kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXECUTOR_RUN_H */
