/* Replicas of a partitioned program: a global program run with R replicas
 * of P partitions (device K = replica * P + partition), as XLA runs an SPMD
 * module with num_replicas > 1. Every replica runs the same per-device
 * program on its own P devices, so the collectives the partitioner wrote
 * for one replica (and those of shard_map bodies, which JAX writes with
 * num_replicas 1) must stay within each replica. By how a collective reads
 * its groups (kiln_collective_group_mode):
 * - flattened device ids (use_global_device_ids=true): ids 0..P-1 name the
 *   devices of replica 0; each group g becomes R groups, g shifted by r*P;
 * - partition ids (a channel_id, no use_global_device_ids): already within
 *   the replica, unchanged;
 * - replica ids (no channel_id, or use_global_device_ids=false): with one
 *   replica every group is {0}, each device (or each replica's partitions)
 *   alone; with R the groups become {0},{1},...,{R-1}, and a permute's
 *   pairs (0,0) become (r,r).
 * A collective whose ids do not fit one replica is refused by name: the
 * program was not a global program over P partitions.
 */
#include <string.h>

#include "compiler/ir/sharding.h"
#include "compiler/spmd/spmd_internal.h"

/* An id that does not fit the one replica the program was written for. */
static int fail_id(kiln_status *st, const kiln_instr *ins, const char *what, int64_t id,
                   int64_t limit) {
  return kiln_status_set(st, KILN_EINVAL, ins->name,
                         "%s %lld in a program for one replica of %lld (on several replicas, "
                         "every replica runs the program on its own partitions)",
                         what, (long long)id, (long long)limit);
}

static bool has_groups(kiln_opcode op) {
  switch (op) {
  case KILN_OP_ALL_REDUCE:
  case KILN_OP_ALL_REDUCE_START:
  case KILN_OP_ALL_GATHER:
  case KILN_OP_ALL_GATHER_START:
  case KILN_OP_REDUCE_SCATTER:
  case KILN_OP_ALL_TO_ALL:
  case KILN_OP_RAGGED_ALL_TO_ALL:
  case KILN_OP_COLLECTIVE_BROADCAST: return true;
  default: return false;
  }
}

static bool is_permute(kiln_opcode op) {
  return op == KILN_OP_COLLECTIVE_PERMUTE || op == KILN_OP_COLLECTIVE_PERMUTE_START;
}

/* Sets ins's replica_groups to ng groups of `size` ids, v row by row. */
static int set_groups(kiln_module *m, kiln_instr *ins, const int64_t *v, int64_t ng, int64_t size,
                      kiln_status *st) {
  kiln_replica_groups *g = kiln_arena_calloc(m->arena, 1, sizeof *g);
  if (g == NULL || (g->groups = kiln_arena_calloc(m->arena, (size_t)ng, sizeof *g->groups)) == NULL)
    return kiln_status_set(st, KILN_ENOMEM, ins->name, "out of memory");
  g->ngroups = (uint32_t)ng;
  for (int64_t i = 0; i < ng; i++) {
    g->groups[i].v = kiln_arena_memdup(m->arena, v + i * size, (size_t)size * sizeof *v);
    if (g->groups[i].v == NULL) return kiln_status_set(st, KILN_ENOMEM, ins->name, "out of memory");
    g->groups[i].n = (uint32_t)size;
  }
  kiln_attr *at = kiln_instr_add_attr(m, ins, KILN_ATTR_REPLICA_GROUPS);
  if (at == NULL) return kiln_status_set(st, KILN_ENOMEM, ins->name, "out of memory");
  at->v.groups = g;
  return 0;
}

/* Flattened ids of replica 0 -> the same groups in every replica. */
static int widen_flat(kiln_module *m, kiln_instr *ins, int64_t R, int64_t P, kiln_arena *a,
                      kiln_status *st) {
  const kiln_attr *ga = kiln_instr_attr(ins, KILN_ATTR_REPLICA_GROUPS);
  int64_t *ids, ng, size;
  int rc = kiln_replica_groups_expand(ga ? ga->v.groups : NULL, a, &ids, &ng, &size, st);
  if (rc) return rc;
  if (ng == 0)
    return kiln_status_set(st, KILN_EINVAL, ins->name, "use_global_device_ids=true needs groups");
  for (int64_t i = 0; i < ng * size; i++)
    if (ids[i] < 0 || ids[i] >= P) return fail_id(st, ins, "device id", ids[i], P);
  int64_t *v = kiln_arena_alloc(a, (size_t)(R * ng * size) * sizeof *v);
  if (v == NULL) return kiln_status_set(st, KILN_ENOMEM, ins->name, "out of memory");
  for (int64_t r = 0; r < R; r++)
    for (int64_t i = 0; i < ng * size; i++) v[r * ng * size + i] = r * P + ids[i];
  return set_groups(m, ins, v, R * ng, size, st);
}

/* Replica ids of a one-replica program (all 0) -> each replica alone. */
static int widen_replica(kiln_module *m, kiln_instr *ins, int64_t R, kiln_arena *a,
                         kiln_status *st) {
  if (is_permute(ins->op)) {
    const kiln_i64s *pairs = kiln_instr_attr_ints(ins, KILN_ATTR_SOURCE_TARGET_PAIRS);
    if (pairs == NULL || pairs->n == 0) return 0; /* nobody sends: zeros everywhere */
    for (uint32_t i = 0; i < pairs->n; i++)
      if (pairs->v[i] != 0) return fail_id(st, ins, "replica id", pairs->v[i], 1);
    int64_t *v = kiln_arena_alloc(a, (size_t)(2 * R) * sizeof *v);
    if (v == NULL) return kiln_status_set(st, KILN_ENOMEM, ins->name, "out of memory");
    for (int64_t r = 0; r < R; r++) v[2 * r] = v[2 * r + 1] = r;
    return kiln_instr_set_attr_ints(m, ins, KILN_ATTR_SOURCE_TARGET_PAIRS, v, (uint32_t)(2 * R))
               ? kiln_status_set(st, KILN_ENOMEM, ins->name, "out of memory")
               : 0;
  }
  const kiln_attr *ga = kiln_instr_attr(ins, KILN_ATTR_REPLICA_GROUPS);
  int64_t *ids, ng, size;
  int rc = kiln_replica_groups_expand(ga ? ga->v.groups : NULL, a, &ids, &ng, &size, st);
  if (rc) return rc;
  for (int64_t i = 0; i < ng * size; i++)
    if (ids[i] != 0) return fail_id(st, ins, "replica id", ids[i], 1);
  int64_t *v = kiln_arena_alloc(a, (size_t)R * sizeof *v);
  if (v == NULL) return kiln_status_set(st, KILN_ENOMEM, ins->name, "out of memory");
  for (int64_t r = 0; r < R; r++) v[r] = r;
  return set_groups(m, ins, v, R, 1, st);
}

int kiln__spmd_replicate(kiln_module *m, int64_t replicas, int64_t partitions, kiln_status *st) {
  if (replicas < 1 || partitions < 1 || replicas * partitions > 4096)
    return kiln_status_set(st, KILN_EINVAL, "spmd",
                           "a mesh of %lld replicas x %lld partitions (at most 4096 devices)",
                           (long long)replicas, (long long)partitions);
  if (replicas == 1) return 0;
  kiln_arena *a = kiln_arena_create();
  if (a == NULL) return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
  int rc = 0;
  for (uint32_t i = 0; i < m->ninstrs && rc == 0; i++) {
    kiln_instr *ins = m->instrs[i];
    if (ins->comp == KILN_NO_ID || !(has_groups(ins->op) || is_permute(ins->op))) continue;
    kiln_group_mode mode;
    if ((rc = kiln_collective_group_mode(ins, &mode, st))) break;
    switch (mode) {
    case KILN_GROUPS_CROSS_PARTITION: break;
    case KILN_GROUPS_FLATTENED_ID: rc = widen_flat(m, ins, replicas, partitions, a, st); break;
    default: rc = widen_replica(m, ins, replicas, a, st); break;
    }
  }
  if (rc == 0) m->replica_count = replicas;
  kiln_arena_destroy(a);
  return rc;
}
