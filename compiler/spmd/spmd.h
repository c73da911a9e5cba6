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
 * Shardings name partitions; with R replicas (kiln_spmd_partition_mesh)
 * every replica runs the partitioned program on its own partitions,
 * device K = replica * partitions + partition.
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
  int64_t replicas; /* each runs the program on its partitions (module replica_count) */
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
/* As kiln_spmd_partition, for a mesh of `replicas` x `partitions` devices
 * (device K = replica * partitions + partition), as XLA runs an SPMD module
 * with num_replicas > 1: every replica runs the partitioned program on its
 * own partitions, its collectives (the partitioner's and a shard_map
 * body's) kept within the replica; the module's replica_count is set. */
int kiln_spmd_partition_mesh(const kiln_module *m, int64_t replicas, int64_t partitions,
                             const char *dump_dir, kiln_spmd_program **out, kiln_status *st);

/* Windowed einsum (collective matmul): a dot whose operand would be
 * all-gathered along a split dim it does not contract becomes P steps, each
 * multiplying the block at hand while the next is passed around the ring
 * by collective-permute; the gathered copy is never built. AUTO: when that
 * copy would hold at least windowed_min_bytes per device. */
typedef enum kiln_spmd_windowed {
  KILN_SPMD_WINDOWED_AUTO,
  KILN_SPMD_WINDOWED_ON,
  KILN_SPMD_WINDOWED_OFF
} kiln_spmd_windowed;

typedef struct kiln_spmd_options {
  kiln_spmd_windowed windowed;
  int64_t windowed_min_bytes; /* AUTO's threshold (default 1 MiB) */
} kiln_spmd_options;

#define KILN_SPMD_WINDOWED_MIN_BYTES (1 << 20)

/* The defaults, then the environment's KILN_SPMD_WINDOWED (auto, on, off)
 * and KILN_SPMD_WINDOWED_BYTES (an integer; K, M, G suffixes), which every
 * caller passing no options (kilnd, kiln run) gets; values not understood
 * are ignored. */
void kiln_spmd_options_init(kiln_spmd_options *o);
/* "auto", "on" or "off"; false for anything else. */
bool kiln_spmd_windowed_parse(const char *text, kiln_spmd_windowed *out);

/* kiln_spmd_partition_mesh with options (NULL: kiln_spmd_options_init's). */
int kiln_spmd_partition_opts(const kiln_module *m, int64_t replicas, int64_t partitions,
                             const char *dump_dir, const kiln_spmd_options *o,
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

/* ---- auto-sharding (auto.c) and its cost model (model.c) ----------------
 *
 * kiln_spmd_auto_shard chooses shardings for a module's ENTRY over a device
 * mesh (user annotations kept as they are) by minimizing the modelled cost
 * of the per-device program the partitioner would build, subject to a
 * memory budget, as an integer program solved by GLPK; it then writes them
 * onto the module, so kiln_spmd_partition partitions it as usual.
 * kiln_spmd_plan_cost models any plan (a module with whatever annotations
 * it carries, propagated as kiln_spmd_partition would) the same way, so
 * that an automatic plan and a hand-written one compare. See docs/spmd.md. */

#define KILN_SPMD_MAX_MESH 4

typedef struct kiln_spmd_auto_options {
  /* The device mesh: axes mesh[0..mesh_rank), row-major (device id = the
   * linear index of its mesh coordinates), their product the partitions.
   * mesh_rank 0: one axis of all partitions. */
  uint32_t mesh_rank;
  int64_t mesh[KILN_SPMD_MAX_MESH];
  double flops_per_s;      /* per device; 0: the cpu target's */
  double mem_bytes_per_s;  /* per device memory bandwidth; 0: the cpu target's */
  double link_bytes_per_s; /* what a collective moves per device per second; 0: mem_bytes_per_s */
  int64_t memory_budget;   /* bytes per device (parameters and live values); 0: none */
  double time_limit_s;     /* the solver's limit; 0: 30 s (the best plan found by then wins) */
  /* The partitioner's options the model follows (windowed einsum); NULL:
   * kiln_spmd_options_init's. Appended. */
  const kiln_spmd_options *partition;
} kiln_spmd_auto_options;

/* The modelled cost of a plan, per device and per run. */
typedef struct kiln_spmd_cost {
  double seconds;       /* compute_s + comm_s */
  double compute_s;     /* roofline time of each device's share of every instruction */
  double comm_s;        /* collectives: bytes x algorithm factor / link bandwidth */
  double flops;         /* each device's share */
  kiln_spmd_stats comm; /* the collectives the partitioner inserts, counted as
                         * kiln_spmd_count_collectives counts them (before the combiner) */
  int64_t memory;       /* peak bytes: parameters' shards plus live values' shards */
  /* Filled by kiln_spmd_auto_shard only: */
  double planned_s; /* what the program's objective says the plan costs (seconds: the same
                     * model, edge by edge; equal to `seconds` unless the partitioner
                     * remembers a reshard the program paid twice) */
  double solve_s;   /* time in the solver */
  bool optimal;     /* proven optimal (else the best found within the limit) */
  uint32_t choices; /* instructions the solver chose a strategy for */
  uint32_t vars;    /* columns of the integer program */
} kiln_spmd_cost;

void kiln_spmd_auto_options_init(kiln_spmd_auto_options *o); /* all defaults */

/* "8", "2x4" or "2,4" as o's mesh; KILN_EINVAL naming what is wrong. */
int kiln_spmd_mesh_parse(const char *text, kiln_spmd_auto_options *o, kiln_status *st);

/* Whether kiln_spmd_auto_shard can run: Kiln was built with GLPK. */
bool kiln_spmd_auto_available(void);

/* In place: inlines the calls the ENTRY makes and gives every array
 * instruction of the ENTRY a sharding over `partitions` devices (o may be
 * NULL: defaults). User annotations stay. *cost (may be NULL) receives the
 * chosen plan's modelled cost. Errors: KILN_EUNAVAIL when built without
 * GLPK, KILN_ELIMIT when no plan fits the memory budget (or none was found
 * in time), KILN_EINVAL for a mesh that does not multiply to `partitions`
 * or a module that is already a per-device program. */
int kiln_spmd_auto_shard(kiln_module *m, int64_t partitions, const kiln_spmd_auto_options *o,
                         kiln_spmd_cost *cost, kiln_status *st);

/* The modelled cost of m's plan over `partitions` devices (m is not
 * changed: a copy is propagated). o may be NULL. */
int kiln_spmd_plan_cost(const kiln_module *m, int64_t partitions, const kiln_spmd_auto_options *o,
                        kiln_spmd_cost *out, kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_SPMD_SPMD_H */
