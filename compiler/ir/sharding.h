/* Shardings and replica groups as values: what device assignment a written
 * form denotes, whether two forms denote the same one, and which devices a
 * collective instruction talks to.
 *
 * The parser keeps every form as written (an explicit device list or an iota
 * tile assignment, last_tile_dim_replicate or last_tile_dims), so that a
 * module prints back as it came. These functions look through the spelling:
 * an iota assignment is expanded to its device list, and
 * last_tile_dim_replicate is last_tile_dims={replicated}. The later SPMD
 * passes (propagation, the partitioner) and the cache key work on that
 * denotation, never on the text.
 */
#ifndef KILN_COMPILER_IR_SHARDING_H
#define KILN_COMPILER_IR_SHARDING_H

#include <stdbool.h>
#include <stdint.h>

#include "common/arena.h"
#include "common/status.h"
#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Expands an iota list: the devices 0..prod(reshape) laid out as `reshape`,
 * transposed by `perm` (n == 0: identity), read row-major into out[0..n).
 * Returns false when the permutation or the count (n) does not fit. */
bool kiln_iota_expand(const kiln_i64s *reshape, const kiln_i64s *perm, int64_t *out, int64_t n);

/* The number of tiles (devices listed) of a TILED sharding, -1 when it
 * overflows. */
int64_t kiln_sharding_tile_count(const kiln_sharding *s);

/* The device of every tile of a TILED sharding, row-major over tile_dims,
 * into out[0..n) (n = kiln_sharding_tile_count). False when malformed. */
bool kiln_sharding_tile_devices(const kiln_sharding *s, int64_t *out, int64_t n);

/* Whether a and b denote the same assignment: explicit and iota device lists
 * that expand alike, last_tile_dim_replicate and last_tile_dims={replicated},
 * a tiling whose only tiled dimension is the replicated one and
 * {replicated}. Metadata and other verbatim fields are not compared. NULL
 * equals NULL only. */
bool kiln_sharding_equal(const kiln_sharding *a, const kiln_sharding *b);

/* A copy of s in arena a in one spelling per denotation (the cache key's):
 * explicit device lists, last_tile_dim_replicate for a lone replicated
 * subgroup dimension and last_tile_dims otherwise, {replicated} for a tiling
 * that tiles nothing. Verbatim extras are kept. NULL on out-of-memory or a
 * malformed sharding (then a copy of s as it is would not be canonical). */
kiln_sharding *kiln_sharding_canonical(kiln_arena *a, const kiln_sharding *s);

/* Whether a custom-call target only annotates its one operand (sharding
 * constraints, Shardy's xla.sdy.* markers, host-offloading moves): on one
 * device, or once partitioned, it is the identity when its result has the
 * operand's shape. The list is kiln_annotation_targets (n entries). */
bool kiln_custom_call_is_annotation(const char *target);
const char *const *kiln_annotation_targets(uint32_t *n);

/* ---- replica groups ----------------------------------------------------- */

/* How a collective reads its replica groups (XLA's CollectiveOpGroupMode),
 * from its channel_id and use_global_device_ids. */
typedef enum kiln_group_mode {
  KILN_GROUPS_CROSS_REPLICA,               /* no channel_id: replica ids, per partition */
  KILN_GROUPS_CROSS_PARTITION,             /* channel_id, op has no use_global_device_ids */
  KILN_GROUPS_CROSS_REPLICA_AND_PARTITION, /* channel_id, use_global_device_ids=false */
  KILN_GROUPS_FLATTENED_ID,                /* channel_id, use_global_device_ids=true */
} kiln_group_mode;

int kiln_collective_group_mode(const kiln_instr *ins, kiln_group_mode *mode, kiln_status *st);

/* The groups of a replica_groups attribute as a flat list: ngroups groups
 * of `size` ids each, row by row, in out (arena a). Groups of unequal sizes
 * are KILN_EINVAL. An empty list gives ngroups 0. */
int kiln_replica_groups_expand(const kiln_replica_groups *g, kiln_arena *a, int64_t **out,
                               int64_t *ngroups, int64_t *size, kiln_status *st);

/* The devices (global ids, device = replica * partitions + partition) that
 * `device` meets in collective `ins` on a replicas x partitions mesh, in
 * rank order, into *members (arena a), *nmembers of them, and the rank of
 * `device` among them. For collective-permute and collective-broadcast-less
 * pair forms the members are the devices of `device`'s domain (its
 * partition across replicas, or its replica across partitions) and
 * *id_of_rank gives each member's id in the pairs' id space. Malformed
 * groups (an id out of range, a device in no group or in two) fail naming
 * the instruction. */
typedef struct kiln_collective_group {
  int64_t *members; /* global device ids, rank order */
  int64_t *ids;     /* the id of each member in the instruction's id space */
  int64_t n;
  int64_t rank; /* of the asking device */
} kiln_collective_group;

int kiln_collective_group_of(const kiln_instr *ins, int64_t replicas, int64_t partitions,
                             int64_t device, kiln_arena *a, kiln_collective_group *out,
                             kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_IR_SHARDING_H */
