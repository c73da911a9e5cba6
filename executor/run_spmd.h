/* Running a global program (a module whose ENTRY carries shardings over
 * global shapes) on a mesh of partitions, as PJRT runs a jitted function
 * with sharded inputs: partition it (compiler/spmd), cut each global
 * argument into the devices' shards, run the per-device program on the
 * mesh (kiln_run_module_mesh: interpreters, or the cpu backend's gang) and
 * put the global result back together; with replicas, each replica does
 * so on its own partitions.
 */
#ifndef KILN_EXECUTOR_RUN_SPMD_H
#define KILN_EXECUTOR_RUN_SPMD_H

#include <stdint.h>

#include "executor/run.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_spmd_stats kiln_spmd_stats;

/* Runs global program m on `partitions` devices of backend `backend` (NULL:
 * the default) with global args; *out is the global result, a new heap
 * literal. dump_dir (may be NULL) receives the module after propagation and
 * after partitioning. stats (may be NULL) receives the collectives the
 * per-device program runs. */
int kiln_run_module_global(const kiln_module *m, const char *backend, const kiln_run_options *ropts,
                           uint32_t partitions, const char *dump_dir,
                           const kiln_literal *const *args, uint32_t nargs, kiln_literal **out,
                           kiln_spmd_stats *stats, kiln_status *st);

/* As kiln_run_module_global on a mesh of `replicas` x `partitions`
 * devices (device K = replica * partitions + partition): every replica
 * runs the partitioned program on its own partitions with its own global
 * arguments args[replica][0..nargs), and outs[replica] receives its global
 * result (new heap literals, all NULL on failure). */
int kiln_run_module_global_mesh(const kiln_module *m, const char *backend,
                                const kiln_run_options *ropts, uint32_t replicas,
                                uint32_t partitions, const char *dump_dir,
                                const kiln_literal *const *const *args, uint32_t nargs,
                                kiln_literal **outs, kiln_spmd_stats *stats, kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXECUTOR_RUN_SPMD_H */
