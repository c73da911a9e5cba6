/* Transposes of the collectives that move data between devices. Each is
 * linear, so its tangent is the op applied to the tangents (jvp_linear) and
 * its transpose is another collective over the same groups:
 *
 *   all-gather      -> reduce-scatter (add) along the gathered dimension
 *   reduce-scatter  -> all-gather along the scattered dimension (add only)
 *   all-to-all      -> the same all-to-all: piece j of device r goes to
 *                      device j as piece r, a symmetric exchange (in HLO the
 *                      split and concat dimensions are one, and the tuple
 *                      form exchanges whole operands the same way)
 *   collective-permute -> the inverse permutation (pairs swapped); devices
 *                      that sent nothing receive zeros, as their operand
 *                      reached no result
 *   collective-broadcast -> the sum over the group (all-reduce) kept on
 *                      the group's first device, the source, zeros elsewhere
 *
 * The transposes keep replica_groups, channel_id and use_global_device_ids,
 * so they run over the same devices as the forward op.
 */
#include <string.h>

#include "common/arena.h"
#include "compiler/transforms/rules.h"

#define B (&c->b)

static const kiln_attr_key group_keys[] = {KILN_ATTR_REPLICA_GROUPS, KILN_ATTR_CHANNEL_ID,
                                           KILN_ATTR_USE_GLOBAL_DEVICE_IDS, KILN_ATTR_DIMENSIONS};

/* A new collective `op` over the devices of `src`, on operand v, with the
 * written result shape `res` (all-gather and reduce-scatter read their
 * group size back from it when the module does not say). */
static kiln_id collective(kiln__ad *c, const kiln_instr *src, kiln_opcode op, kiln_id v,
                          const kiln_shape *res, bool dims) {
  kiln__tx *tx = c->tx;
  kiln_instr *ins = kiln__b_start(B, op, &v, 1);
  if (ins == NULL) return KILN_NO_ID;
  for (size_t i = 0; i < sizeof group_keys / sizeof group_keys[0]; i++) {
    if (!dims && group_keys[i] == KILN_ATTR_DIMENSIONS) continue;
    const kiln_attr *a = kiln_instr_attr(src, group_keys[i]);
    if (a == NULL) continue;
    kiln_attr *d = kiln_instr_add_attr(tx->m, ins, group_keys[i]);
    if (d == NULL) return kiln__tx_oom(tx), KILN_NO_ID;
    *d = *a;
  }
  if (op == KILN_OP_REDUCE_SCATTER || op == KILN_OP_ALL_REDUCE) {
    uint32_t add = kiln__b_reducer(tx, KILN_OP_ADD, kiln__b_shape(tx, v)->dtype);
    if (add == KILN_NO_ID || kiln_instr_set_called(tx->m, ins, &add, 1))
      return kiln__tx_oom(tx), KILN_NO_ID;
  }
  if (res && kiln_instr_set_shape(tx->m, ins, res)) return kiln__tx_oom(tx), KILN_NO_ID;
  return kiln__b_finish(B, ins);
}

/* Operand k's part of a cotangent: the element of a tuple result. */
static kiln_id part(kiln__ad *c, const kiln_instr *ins, kiln_id ct, uint32_t k) {
  return kiln_shape_is_tuple(&ins->shape) ? kiln__b_gte(B, ct, k) : ct;
}

static const kiln_shape *operand_shape(const kiln__ad *c, const kiln_instr *ins, uint32_t k) {
  return &c->tx->m->instrs[ins->operands[k]]->shape;
}

int kiln__vjp_all_gather(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  for (uint32_t k = 0; k < ins->noperands && c->tx->err == 0; k++)
    if (kiln__ad_wants(c, ins, k))
      kiln__ad_accum(c, ins, k,
                     collective(c, ins, KILN_OP_REDUCE_SCATTER, part(c, ins, ct, k),
                                operand_shape(c, ins, k), true));
  return c->tx->err;
}

int kiln__vjp_reduce_scatter(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  if (ins->ncalled != 1 || kiln__tf_reducer_kind(c->tx->m, ins->called[0]) != KILN__RED_ADD)
    return kiln__ad_not_diff(c, ins);
  for (uint32_t k = 0; k < ins->noperands && c->tx->err == 0; k++)
    if (kiln__ad_wants(c, ins, k))
      kiln__ad_accum(c, ins, k,
                     collective(c, ins, KILN_OP_ALL_GATHER, part(c, ins, ct, k),
                                operand_shape(c, ins, k), true));
  return c->tx->err;
}

int kiln__vjp_all_to_all(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__tx *tx = c->tx;
  kiln_id *ops = kiln__b_ids(tx, ins->noperands);
  if (ops == NULL) return tx->err;
  for (uint32_t k = 0; k < ins->noperands; k++)
    ops[k] = kiln__ad_mat(B, part(c, ins, ct, k), operand_shape(c, ins, k));
  kiln_id r = kiln__b_clone_same(B, ins, ops, ins->noperands);
  for (uint32_t k = 0; k < ins->noperands && tx->err == 0; k++)
    kiln__ad_accum(c, ins, k, part(c, ins, r, k));
  return tx->err;
}

int kiln__vjp_collective_permute(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__tx *tx = c->tx;
  const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_SOURCE_TARGET_PAIRS);
  if (ins->noperands != 1 || p == NULL) return kiln__ad_not_diff(c, ins);
  kiln_instr *t = kiln__b_clone_start(B, ins, &ct, 1);
  int64_t *sw = kiln_arena_calloc(tx->m->arena, p->n ? p->n : 1, sizeof *sw);
  if (t == NULL || sw == NULL) return tx->err ? tx->err : kiln__tx_oom(tx);
  for (uint32_t i = 0; i + 1 < p->n; i += 2) {
    sw[i] = p->v[i + 1];
    sw[i + 1] = p->v[i];
  }
  kiln_attr *a = kiln_instr_add_attr(tx->m, t, KILN_ATTR_SOURCE_TARGET_PAIRS);
  if (a == NULL) return kiln__tx_oom(tx);
  a->v.ints = (kiln_i64s){sw, p->n};
  kiln__ad_accum(c, ins, 0, kiln__b_finish(B, t));
  return tx->err;
}

/* This device's id as the collective's groups count devices. */
static kiln_id device_id(kiln__ad *c, const kiln_instr *ins) {
  const kiln_module *m = c->tx->m;
  int64_t parts = m->num_partitions > 1 ? m->num_partitions : 1;
  kiln_id r = kiln__b_op(B, KILN_OP_REPLICA_ID, NULL, 0);
  if (parts == 1) return r;
  kiln_id p = kiln__b_op(B, KILN_OP_PARTITION_ID, NULL, 0);
  if (kiln_instr_attr_int(ins, KILN_ATTR_USE_GLOBAL_DEVICE_IDS, 0))
    return kiln__b_add(B, kiln__b_mul(B, r, kiln__b_iscalar(B, KILN_U32, parts)), p);
  return kiln_instr_has_attr(ins, KILN_ATTR_CHANNEL_ID) ? p : r;
}

/* 1 on the first device of each group (the source), 0 elsewhere, in type t. */
static kiln_id is_source(kiln__ad *c, const kiln_instr *ins, kiln_dtype t) {
  kiln__tx *tx = c->tx;
  const kiln_attr *ga = kiln_instr_attr(ins, KILN_ATTR_REPLICA_GROUPS);
  const kiln_replica_groups *g = ga ? ga->v.groups : NULL;
  kiln_id id = device_id(c, ins);
  if (g == NULL || (!g->iota && g->ngroups == 0)) /* one group of everyone: device 0 */
    return kiln__b_convert(B, kiln__b_cmp(B, id, kiln__b_iscalar(B, KILN_U32, 0), KILN_CMP_EQ), t);
  if (g->iota)
    return kiln__tx_fail(
               tx, KILN_EUNIMPL, ins,
               "%s: collective-broadcast with replica groups in the iota form has no transpose yet "
               "(write the groups as a list)",
               tx->name),
           KILN_NO_ID;
  int64_t top = 0;
  for (uint32_t i = 0; i < g->ngroups; i++)
    for (uint32_t j = 0; j < g->groups[i].n; j++)
      if (g->groups[i].v[j] >= top) top = g->groups[i].v[j] + 1;
  if (top > (1 << 20))
    return kiln__tx_fail(tx, KILN_EUNIMPL, ins,
                         "%s: collective-broadcast over device ids up to %lld", tx->name,
                         (long long)top),
           KILN_NO_ID;
  int64_t *first = kiln__b_i64s(tx, (uint32_t)top + 1);
  if (first == NULL) return KILN_NO_ID;
  memset(first, 0, ((size_t)top + 1) * sizeof *first);
  for (uint32_t i = 0; i < g->ngroups; i++)
    if (g->groups[i].n) first[g->groups[i].v[0]] = 1;
  /* ids past the table (devices in no group) read the zero appended at its end */
  kiln_id idx = kiln__b_convert(B, id, KILN_S32);
  kiln_id lim = kiln__b_iscalar(B, KILN_S32, top);
  idx = kiln__b_select(B, kiln__b_cmp(B, idx, lim, KILN_CMP_LT), idx, lim);
  int64_t one = 1;
  kiln_id v = kiln__b_dyn_slice(B, kiln__b_const_ints(B, KILN_S32, first, (uint32_t)top + 1), &idx,
                                1, &one);
  return kiln__b_convert(B, kiln__b_reshape(B, v, NULL, 0), t);
}

int kiln__vjp_collective_broadcast(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__tx *tx = c->tx;
  if (ins->noperands != 1 || !kiln_shape_is_array(&ins->shape)) return kiln__ad_not_diff(c, ins);
  kiln_id sum = collective(c, ins, KILN_OP_ALL_REDUCE, ct, NULL, false);
  kiln_id keep = is_source(c, ins, ins->shape.dtype);
  if (tx->err) return tx->err;
  kiln__ad_accum(c, ins, 0, kiln__b_mul(B, sum, kiln__b_broadcast_like(B, keep, sum)));
  return tx->err;
}

int kiln__jvp_reduce_scatter(kiln__ad *c, const kiln_instr *ins) {
  if (ins->ncalled != 1 || kiln__tf_reducer_kind(c->tx->m, ins->called[0]) != KILN__RED_ADD)
    return kiln__ad_not_diff(c, ins);
  return kiln__jvp_linear(c, ins);
}
