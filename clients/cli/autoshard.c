/* --auto-shard [--mesh M] [--memory-budget BYTES], shared by run, compile
 * and bench (and compile's -O 3 with --partitions: level 3 includes
 * auto-sharding): before a module is partitioned over --partitions P
 * devices, auto-sharding (compiler/spmd/auto.c) gives it shardings (the
 * user's stay) and the plan's modelled cost is printed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "compiler/spmd/spmd.h"

bool kiln__auto_shard_wanted(const kiln__args *a) {
  if (kiln__args_get(a, "auto-shard")) return true;
  /* kiln compile: optimization level 3 includes auto-sharding. */
  const char *level = kiln__args_get(a, "opt-level");
  return strcmp(a->cmd->name, "compile") == 0 && level && strcmp(level, "3") == 0 &&
         kiln__args_get(a, "partitions");
}

int kiln__auto_shard_check(const kiln__args *a) {
  const char *cmd = a->cmd->name;
  /* --memory-budget is also the rematerialization budget (copts.c). */
  if (!kiln__auto_shard_wanted(a) && kiln__args_get(a, "mesh")) {
    fprintf(stderr, "kiln %s: --mesh goes with --auto-shard\n", cmd);
    return KILN_EXIT_USAGE;
  }
  if (kiln__args_get(a, "auto-shard") && kiln__args_get(a, "partitions") == NULL) {
    fprintf(stderr, "kiln %s: --auto-shard needs --partitions P\n", cmd);
    return KILN_EXIT_USAGE;
  }
  return KILN_EXIT_OK;
}

/* --mesh and --memory-budget into o; an exit code. */
static int options(const kiln__args *a, int64_t partitions, kiln_spmd_auto_options *o) {
  const char *cmd = a->cmd->name;
  kiln_spmd_auto_options_init(o);
  const char *mesh = kiln__args_get(a, "mesh");
  kiln_status st;
  kiln_status_clear(&st);
  if (mesh && kiln_spmd_mesh_parse(mesh, o, &st)) {
    fprintf(stderr, "kiln %s: --mesh: %s\n", cmd, st.msg);
    return KILN_EXIT_USAGE;
  }
  int64_t prod = 1;
  for (uint32_t k = 0; k < o->mesh_rank; k++) prod *= o->mesh[k];
  if (mesh && prod != partitions) {
    fprintf(stderr, "kiln %s: --mesh %s has %" PRId64 " devices, --partitions says %" PRId64 "\n",
            cmd, mesh, prod, partitions);
    return KILN_EXIT_USAGE;
  }
  const char *budget = kiln__args_get(a, "memory-budget");
  if (budget) {
    char *end;
    errno = 0;
    long long v = strtoll(budget, &end, 10);
    if (errno || end == budget || v < 1 ||
        (*end && strcmp(end, "K") && strcmp(end, "M") && strcmp(end, "G"))) {
      fprintf(stderr,
              "kiln %s: --memory-budget needs a positive number of bytes (K, M, G: KiB, MiB, "
              "GiB), not '%s'\n",
              cmd, budget);
      return KILN_EXIT_USAGE;
    }
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    if (v > (INT64_MAX >> shift)) {
      fprintf(stderr, "kiln %s: --memory-budget %s is too large\n", cmd, budget);
      return KILN_EXIT_USAGE;
    }
    o->memory_budget = (int64_t)v << shift;
  }
  return KILN_EXIT_OK;
}

int kiln__spmd_options(const kiln__args *a, kiln_spmd_options *o) {
  const char *cmd = a->cmd->name;
  kiln_spmd_options_init(o);
  const char *mode = kiln__args_get(a, "windowed-einsum");
  if (mode && !kiln_spmd_windowed_parse(mode, &o->windowed)) {
    fprintf(stderr, "kiln %s: --windowed-einsum needs auto, on or off, not '%s'\n", cmd, mode);
    return KILN_EXIT_USAGE;
  }
  const char *bytes = kiln__args_get(a, "windowed-einsum-bytes");
  if (bytes) {
    char *end;
    errno = 0;
    long long v = strtoll(bytes, &end, 10);
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    if (errno || end == bytes || v < 0 || (*end && (end[1] || !shift)) ||
        v > (INT64_MAX >> shift)) {
      fprintf(stderr,
              "kiln %s: --windowed-einsum-bytes needs a number of bytes (K, M, G: KiB, MiB, "
              "GiB), not '%s'\n",
              cmd, bytes);
      return KILN_EXIT_USAGE;
    }
    o->windowed_min_bytes = (int64_t)v << shift;
  }
  return KILN_EXIT_OK;
}

int kiln__auto_shard(const kiln__args *a, const char *file, kiln_module *m, int64_t partitions,
                     FILE *out, kiln_spmd_cost *cost) {
  kiln_spmd_auto_options o;
  kiln_spmd_options po;
  int rc = options(a, partitions, &o);
  if (rc == 0) rc = kiln__spmd_options(a, &po);
  if (rc) return rc;
  o.partition = &po; /* the model follows the partitioner the command runs */
  kiln_status st;
  kiln_status_clear(&st);
  kiln_spmd_cost c;
  if (kiln_spmd_auto_shard(m, partitions, &o, &c, &st)) {
    kiln__report(file, m, &st);
    return kiln__exit_code(st.code);
  }
  int64_t bytes = 0;
  for (int k = 0; k < KILN_SPMD_NKINDS; k++) bytes += c.comm.bytes[k];
  char mesh[64] = "";
  for (uint32_t k = 0, n = 0; k < o.mesh_rank && n < sizeof mesh; k++)
    n +=
        (uint32_t)snprintf(mesh + n, sizeof mesh - n, "%s%" PRId64, k ? "x" : " (mesh ", o.mesh[k]);
  if (o.mesh_rank) strncat(mesh, ")", sizeof mesh - strlen(mesh) - 1);
  fprintf(out,
          "%s: auto-sharded over %" PRId64 " devices%s: modelled %.3f ms per run per device "
          "(compute %.3f ms, collectives %.3f ms moving %" PRId64 " bytes), peak memory %" PRId64
          " bytes per device; %u choices solved in %.2f s%s\n",
          file, partitions, mesh, 1e3 * c.seconds, 1e3 * c.compute_s, 1e3 * c.comm_s, bytes,
          c.memory, c.choices, c.solve_s, c.optimal ? " (optimal)" : " (best within the limit)");
  if (cost) *cost = c;
  return KILN_EXIT_OK;
}
