/* Global programs on a mesh (run_spmd.h): partition, shard the arguments,
 * run the devices as one gang, assemble the result. */
#include "executor/run_spmd.h"

#include <string.h>

#include "common/alloc.h"
#include "compiler/spmd/spmd.h"

int kiln_run_module_global(const kiln_module *m, const char *backend, const kiln_run_options *ropts,
                           uint32_t partitions, const char *dump_dir,
                           const kiln_literal *const *args, uint32_t nargs, kiln_literal **out,
                           kiln_spmd_stats *stats, kiln_status *st) {
  const kiln_literal *const *per[1] = {args};
  return kiln_run_module_global_mesh(m, backend, ropts, 1, partitions, dump_dir, per, nargs, out,
                                     stats, st);
}

int kiln_run_module_global_mesh(const kiln_module *m, const char *backend,
                                const kiln_run_options *ropts, uint32_t replicas,
                                uint32_t partitions, const char *dump_dir,
                                const kiln_literal *const *const *args, uint32_t nargs,
                                kiln_literal **outs, kiln_spmd_stats *stats, kiln_status *st) {
  for (uint32_t r = 0; r < replicas; r++) outs[r] = NULL;
  kiln_spmd_program *prog;
  int rc = kiln_spmd_partition_mesh(m, replicas, partitions, dump_dir, &prog, st);
  if (rc) return rc;
  if (stats) *stats = prog->stats;
  if (nargs != prog->nparams) {
    rc = kiln_status_set(st, KILN_EINVAL, "spmd", "%u arguments given, the ENTRY takes %u", nargs,
                         prog->nparams);
    kiln_spmd_program_destroy(prog);
    return rc;
  }
  size_t ndev = (size_t)replicas * partitions, n = ndev * (nargs ? nargs : 1);
  kiln_literal **shards = kiln_calloc(n, sizeof *shards);
  const kiln_literal **views = kiln_calloc(n, sizeof *views);
  const kiln_literal *const **per = kiln_calloc(ndev, sizeof *per);
  kiln_literal **douts = kiln_calloc(ndev, sizeof *douts);
  if (!shards || !views || !per || !douts) {
    rc = kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
    goto out_free;
  }
  /* device K = replica * partitions + partition takes partition's shard of
   * its replica's arguments */
  for (size_t k = 0; k < ndev && rc == 0; k++) {
    for (uint32_t i = 0; i < nargs && rc == 0; i++) {
      rc = kiln_spmd_shard_arg(prog, i, args[k / partitions][i], (int64_t)(k % partitions),
                               &shards[k * nargs + i], st);
      views[k * nargs + i] = shards[k * nargs + i];
    }
    per[k] = views + k * nargs;
  }
  if (rc == 0)
    rc = kiln_run_module_mesh(prog->module, backend, ropts, replicas, partitions, per, nargs, douts,
                              st);
  for (uint32_t r = 0; r < replicas && rc == 0; r++)
    rc = kiln_spmd_assemble(prog, douts + (size_t)r * partitions, &outs[r], st);
  if (rc)
    for (uint32_t r = 0; r < replicas; r++) {
      kiln_literal_destroy(outs[r]);
      outs[r] = NULL;
    }
out_free:
  for (size_t k = 0; douts && k < ndev; k++) kiln_literal_destroy(douts[k]);
  for (size_t i = 0; shards && i < n; i++) kiln_literal_destroy(shards[i]);
  kiln_free(douts);
  kiln_free(per);
  kiln_free(views);
  kiln_free(shards);
  kiln_spmd_program_destroy(prog);
  return rc;
}
