/* SPMD partitioning: from a module whose ENTRY carries shardings over
 * global shapes (what JAX's lowering writes) to one per-device program
 * driven by partition-id, with the collectives it needs inserted, and the
 * sharding of global arrays into per-device arguments and back.
 *
 * Three steps, each usable alone:
 * - kiln_spmd_propagate: inline calls in the ENTRY, then give every array
 *   instruction of it a sharding (forward and backward through the ops
 *   dims.c knows; user annotations win; conflicts go to the choice that
 *   reshards the fewest bytes; the rest is replicated).
 * - kiln_spmd_partition: the propagated module as a per-device program;
 *   per-op rules in one table (partition.c), every op without a rule
 *   computed replicated, so a result is never wrong, at worst slower.
 * - kiln_spmd_shard_arg / kiln_spmd_assemble: global arrays <-> shards as
 *   the program's parameter and result shardings say.
 * Only partitions are modelled (replicas 1); devices are partition ids.
 */
#ifndef KILN_COMPILER_SPMD_SPMD_H
#define KILN_COMPILER_SPMD_SPMD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The collective kinds the partitioner inserts, in report order. */
typedef enum kiln_spmd_kind {
  KILN_SPMD_ALL_REDUCE,
  KILN_SPMD_ALL_GATHER,
  KILN_SPMD_ALL_TO_ALL,
  KILN_SPMD_COLLECTIVE_PERMUTE,
  KILN_SPMD_REDUCE_SCATTER,
  KILN_SPMD_NKINDS
} kiln_spmd_kind;

const char *kiln_spmd_kind_name(kiln_spmd_kind k); /* "all-reduce" */

/* Collectives of one per-device program run: count and bytes each device
 * sends (all-reduce, all-to-all, collective-permute: its operand;
 * all-gather: its result, what it receives), by kind. Collectives inside
 * loops count once. */
typedef struct kiln_spmd_stats {
  uint32_t count[KILN_SPMD_NKINDS];
  int64_t bytes[KILN_SPMD_NKINDS];
} kiln_spmd_stats;

/* A partitioned program. Owns everything it points to. */
typedef struct kiln_spmd_program {
  kiln_module *module; /* the per-device program (num_partitions set) */
  int64_t partitions;
  uint32_t nparams;
  kiln_shape *param_shapes;        /* global shapes */
  kiln_sharding **param_shardings; /* how each is split; never NULL */
  bool result_is_tuple;            /* the ENTRY result is a tuple of nresults arrays */
  uint32_t nresults;
  kiln_shape *result_shapes;        /* global */
  kiln_sharding **result_shardings; /* never NULL */
  kiln_spmd_stats stats;
  kiln_arena *arena;
} kiln_spmd_program;

/* Whether m is a global program to partition: its ENTRY carries a sharding
 * (an attribute or a sharding custom call), and it is not already a
 * per-device program (no collective, partition-id or replica-id anywhere;
 * not scheduled, as XLA's compiled dumps are). */
bool kiln_spmd_module_is_sharded(const kiln_module *m);

/* In place: inlines calls made by the ENTRY and sets a sharding attribute
 * on every array instruction of the ENTRY (tuples get tuple shardings). */
int kiln_spmd_propagate(kiln_module *m, int64_t partitions, kiln_status *st);

/* Partitions a copy of m (not changed) over `partitions` devices:
 * propagation, then the rules. dump_dir (may be NULL) receives
 * spmd-propagated.hlo and spmd-partitioned.hlo. *out is the caller's, freed
 * with kiln_spmd_program_destroy. Unsupported forms (manual shardings,
 * tuple parameters split across devices) fail naming the instruction. */
int kiln_spmd_partition(const kiln_module *m, int64_t partitions, const char *dump_dir,
                        kiln_spmd_program **out, kiln_status *st);
void kiln_spmd_program_destroy(kiln_spmd_program *p); /* NULL is a no-op */

/* Device `device`'s shard of the global argument of parameter `param`
 * (padded with zeros where the shard runs past the array), a new heap
 * literal. */
int kiln_spmd_shard_arg(const kiln_spmd_program *p, uint32_t param, const kiln_literal *global,
                        int64_t device, kiln_literal **out, kiln_status *st);

/* The global result from the devices' results outs[0..partitions) (each
 * the program's per-device result), a new heap literal (a tuple when the
 * ENTRY returns one). */
int kiln_spmd_assemble(const kiln_spmd_program *p, kiln_literal *const *outs, kiln_literal **out,
                       kiln_status *st);

/* The collectives of a per-device module's ENTRY (and what it calls). */
void kiln_spmd_count_collectives(const kiln_module *m, kiln_spmd_stats *stats);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_SPMD_SPMD_H */
