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
  *out = NULL;
  kiln_spmd_program *prog;
  int rc = kiln_spmd_partition(m, partitions, dump_dir, &prog, st);
  if (rc) return rc;
  if (stats) *stats = prog->stats;
  if (nargs != prog->nparams) {
    rc = kiln_status_set(st, KILN_EINVAL, "spmd", "%u arguments given, the ENTRY takes %u", nargs,
                         prog->nparams);
    kiln_spmd_program_destroy(prog);
    return rc;
  }
  size_t n = (size_t)partitions * (nargs ? nargs : 1);
  kiln_literal **shards = kiln_calloc(n, sizeof *shards);
  const kiln_literal **views = kiln_calloc(n, sizeof *views);
  const kiln_literal *const **per = kiln_calloc(partitions, sizeof *per);
  kiln_literal **outs = kiln_calloc(partitions, sizeof *outs);
  if (!shards || !views || !per || !outs) {
    rc = kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
    goto out_free;
  }
  for (uint32_t k = 0; k < partitions && rc == 0; k++) {
    for (uint32_t i = 0; i < nargs && rc == 0; i++) {
      rc = kiln_spmd_shard_arg(prog, i, args[i], k, &shards[k * nargs + i], st);
      views[k * nargs + i] = shards[k * nargs + i];
    }
    per[k] = views + (size_t)k * nargs;
  }
  if (rc == 0)
    rc = kiln_run_module_mesh(prog->module, backend, ropts, 1, partitions, per, nargs, outs, st);
  if (rc == 0) rc = kiln_spmd_assemble(prog, outs, out, st);
out_free:
  for (uint32_t k = 0; outs && k < partitions; k++) kiln_literal_destroy(outs[k]);
  for (size_t i = 0; shards && i < n; i++) kiln_literal_destroy(shards[i]);
  kiln_free(outs);
  kiln_free(per);
  kiln_free(views);
  kiln_free(shards);
  kiln_spmd_program_destroy(prog);
  return rc;
}
