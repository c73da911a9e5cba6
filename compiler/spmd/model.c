/* The cost model of a partitioned program, and the modelled cost of a plan
 * (kiln_spmd_plan_cost).
 *
 * The model does not guess what a sharding costs: it replays what the
 * partitioner (partition.c) would build for it, rule by rule, with the same
 * choices made by the same byte counts (the dot's loop tiling taken from
 * the result, the lhs or the rhs; keeping a reduce's split or resharding
 * its operand; reduce-scatter instead of all-reduce then slice; the
 * collective-permute, all-to-all or all-gathers a reshard becomes), and
 * charges what comes out: each device's share of the instruction's
 * roofline time (compiler/passes/cost.c) and every collective's bytes per
 * device times its algorithm's factor (ring all-reduce 2(n-1)/n, all-gather,
 * reduce-scatter and all-to-all (n-1)/n, a permute 1) over the link
 * bandwidth. Whoever changes a rule in partition.c changes its mirror
 * here; test_spmd_auto checks the two agree on the bytes they move.
 *
 * A plan's memory is the parameters' shards plus, at the worst point of
 * the ENTRY's order, the shards of the values live there (the same measure
 * the auto-sharder's budget constrains). Loops and other ops without a
 * rule are charged as run whole once, as the partitioner runs them.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/sharding.h"
#include "compiler/passes/cost.h"
#include "compiler/spmd/spmd.h"
#include "compiler/spmd/spmd_internal.h"
#include "compiler/target.h"

#define CACHE 4 /* reshards remembered per instruction, as partition.c */

void kiln__model_init(spmd_model *md, const kiln_module *m, kiln_arena *a, int64_t n,
                      const kiln_spmd_auto_options *o) {
  const kiln_target *t = kiln_target_default();
  md->m = m;
  md->a = a;
  md->n = n;
  md->flops_per_s = o && o->flops_per_s > 0 ? o->flops_per_s : t->peak_flops;
  md->mem_bytes_per_s = o && o->mem_bytes_per_s > 0 ? o->mem_bytes_per_s : t->bandwidth;
  md->link_bytes_per_s = o && o->link_bytes_per_s > 0 ? o->link_bytes_per_s : md->mem_bytes_per_s;
  if (o && o->partition)
    md->opts = *o->partition;
  else
    kiln_spmd_options_init(&md->opts);
}

static bool is_array(const kiln_shape *s) {
  return kiln_shape_is_array(s) && s->rank <= SPMD_MAX_RANK;
}

static spmd_tiling *replicated(const spmd_model *md, uint32_t rank) {
  return kiln__tiling_replicated(md->a, rank, md->n);
}

int64_t kiln__shard_bytes(const kiln_shape *g, const spmd_tiling *t) {
  int64_t e = (int64_t)kiln_dtype_size(g->dtype);
  for (uint32_t d = 0; d < g->rank; d++) e *= kiln__shard_size(g->dims[d], t ? t->tiles[d] : 1);
  return e;
}

static double elems_of(const kiln_shape *g, const spmd_tiling *t) {
  double e = 1;
  for (uint32_t d = 0; d < g->rank; d++)
    e *= (double)kiln__shard_size(g->dims[d], t ? t->tiles[d] : 1);
  return e;
}

/* The share of g's elements one device holds under t. */
static double share(const kiln_shape *g, const spmd_tiling *t) {
  double all = elems_of(g, NULL);
  return all > 0 ? elems_of(g, t) / all : 1;
}

static void charge_collective(const spmd_model *md, spmd_charge *c, kiln_spmd_kind k, int64_t bytes,
                              int64_t group) {
  c->comm.count[k]++;
  c->comm.bytes[k] += bytes;
  double f = 1, g = group > 1 ? (double)group : 1;
  switch (k) {
  case KILN_SPMD_ALL_REDUCE: f = 2 * (g - 1) / g; break;
  case KILN_SPMD_ALL_GATHER:
  case KILN_SPMD_REDUCE_SCATTER:
  case KILN_SPMD_ALL_TO_ALL: f = (g - 1) / g; break;
  default: f = 1; break;
  }
  c->comm_s += f * (double)bytes / md->link_bytes_per_s;
}

/* The share `frac` of ins's roofline time on one device. */
static void charge_compute(const spmd_model *md, const kiln_instr *ins, double frac,
                           spmd_charge *c) {
  kiln_target t = *kiln_target_default();
  t.peak_flops = md->flops_per_s;
  t.bandwidth = md->mem_bytes_per_s;
  t.launch_overhead = 0;
  kiln_cost k;
  kiln_cost_instr(md->m, ins, &t, &k);
  c->flops += k.flops * frac;
  c->compute_s += k.seconds * frac;
}

/* ---- resharding ---------------------------------------------------------- */

static bool permutes(const spmd_tiling *from, const spmd_tiling *to) {
  if (from->rep != to->rep) return false;
  for (uint32_t d = 0; d < from->rank; d++)
    if (from->tiles[d] != to->tiles[d]) return false;
  return true;
}

/* partition.c's try_all_to_all conditions: one split dim traded for
 * another, evenly, the same devices holding matching tiles. */
static bool trades(const kiln_shape *g, const spmd_tiling *from, const spmd_tiling *to,
                   int64_t *t) {
  int a = -1, b = -1;
  if (from->rep != to->rep) return false;
  for (uint32_t d = 0; d < g->rank; d++) {
    if (from->tiles[d] == to->tiles[d]) continue;
    if (from->tiles[d] > 1 && to->tiles[d] == 1 && a < 0)
      a = (int)d;
    else if (from->tiles[d] == 1 && to->tiles[d] > 1 && b < 0)
      b = (int)d;
    else
      return false;
  }
  if (a < 0 || b < 0) return false;
  *t = from->tiles[a];
  if (to->tiles[b] != *t || g->dims[a] % *t || g->dims[b] % *t) return false;
  for (int64_t k = 0; k < from->n; k++) {
    if (kiln__tiling_coord(from, k, (uint32_t)a) != kiln__tiling_coord(to, k, (uint32_t)b))
      return false;
    for (uint32_t d = 0; d < g->rank; d++)
      if ((int)d != a && (int)d != b && from->tiles[d] > 1 &&
          kiln__tiling_coord(from, k, d) != kiln__tiling_coord(to, k, d))
        return false;
  }
  return true;
}

void kiln__model_reshard(const spmd_model *md, const kiln_shape *g, const spmd_tiling *from,
                         const spmd_tiling *to, spmd_charge *c) {
  if (from == NULL || to == NULL || kiln__tiling_equal(from, to)) return;
  if (!kiln__tiling_covers(from, to)) {
    int64_t t;
    if (permutes(from, to)) {
      charge_collective(md, c, KILN_SPMD_COLLECTIVE_PERMUTE, kiln__shard_bytes(g, from), 2);
      return;
    }
    if (trades(g, from, to, &t)) {
      charge_collective(md, c, KILN_SPMD_ALL_TO_ALL, kiln__shard_bytes(g, from), t);
      return;
    }
  }
  /* All-gathers of the dims whose split changes, one after the other, the
   * local array growing; then a local slice (free). */
  int64_t dims[SPMD_MAX_RANK], es = (int64_t)kiln_dtype_size(g->dtype);
  for (uint32_t d = 0; d < g->rank; d++) dims[d] = kiln__shard_size(g->dims[d], from->tiles[d]);
  for (uint32_t d = 0; d < g->rank; d++) {
    if (from->tiles[d] == 1) continue;
    bool gather = to->tiles[d] != from->tiles[d];
    for (int64_t k = 0; k < from->n && !gather; k++)
      gather = kiln__tiling_coord(from, k, d) != kiln__tiling_coord(to, k, d);
    if (!gather) continue;
    dims[d] *= from->tiles[d];
    int64_t bytes = es;
    for (uint32_t e = 0; e < g->rank; e++) bytes *= dims[e];
    charge_collective(md, c, KILN_SPMD_ALL_GATHER, bytes, from->tiles[d]);
    dims[d] = g->dims[d];
  }
}

/* ---- the rules ----------------------------------------------------------- */

/* An all-reduce a rule ended with: its operand's bytes, its devices. */
typedef struct pending {
  bool any;
  int64_t bytes, group;
  const spmd_tiling *tiling; /* the loops' (or operand's) tiling ... */
  bool dims[SPMD_MAX_RANK];  /* ... and the split dims reduced over */
} pending;

/* partition.c's try_reduce_scatter conditions. */
static bool scatters(const spmd_model *md, const kiln_shape *g, const spmd_tiling *got,
                     const spmd_tiling *want, const pending *ar) {
  int d = -1;
  for (uint32_t k = 0; k < g->rank; k++) {
    if (want->tiles[k] == got->tiles[k]) continue;
    if (got->tiles[k] != 1 || d >= 0) return false;
    d = (int)k;
  }
  if (d < 0 || g->dims[d] % want->tiles[d] != 0) return false;
  for (uint32_t k = 0; k < g->rank; k++)
    for (int64_t dev = 0; (int)k != d && got->tiles[k] > 1 && dev < md->n; dev++)
      if (kiln__tiling_coord(got, dev, k) != kiln__tiling_coord(want, dev, k)) return false;
  int64_t *v, ng, size;
  if (kiln__tiling_groups(md->a, ar->tiling, ar->dims, &v, &ng, &size) || size != want->tiles[d])
    return false;
  for (int64_t i = 0; i < ng * size; i++)
    if (kiln__tiling_coord(want, v[i], (uint32_t)d) != i % size) return false;
  return true;
}

/* The driver after a rule: the result from `got` to `want`, by a
 * reduce-scatter where the all-reduce allows. */
static void finish(const spmd_model *md, const kiln_shape *g, const spmd_tiling *got,
                   const spmd_tiling *want, const pending *ar, spmd_charge *c) {
  if (ar->any && want && !kiln__tiling_equal(got, want) && scatters(md, g, got, want, ar)) {
    charge_collective(md, c, KILN_SPMD_REDUCE_SCATTER, ar->bytes, ar->group);
    return;
  }
  if (ar->any) charge_collective(md, c, KILN_SPMD_ALL_REDUCE, ar->bytes, ar->group);
  if (want) kiln__model_reshard(md, g, got, want, c);
}

static void rule_whole(const spmd_model *md, const kiln_instr *ins, spmd_tiling **need, bool *whole,
                       spmd_charge *c) {
  for (uint32_t k = 0; k < ins->noperands; k++) {
    const kiln_shape *s = &md->m->instrs[ins->operands[k]]->shape;
    need[k] = is_array(s) ? replicated(md, s->rank) : NULL;
  }
  *whole = true;
  charge_compute(md, ins, 1, c); /* then a local slice to want: free */
}

static bool rule_elementwise(const spmd_model *md, const kiln_instr *ins, const spmd_tiling *want,
                             spmd_tiling **need, spmd_charge *c) {
  if (ins->noperands > 8) return false;
  for (uint32_t k = 0; k < ins->noperands; k++) {
    const kiln_shape *s = &md->m->instrs[ins->operands[k]]->shape;
    if (!is_array(s)) return false;
    need[k] = kiln_shape_same_dims(s, &ins->shape) ? (spmd_tiling *)want : replicated(md, s->rank);
  }
  charge_compute(md, ins, share(&ins->shape, want), c);
  return true;
}

static bool rule_annotation(const spmd_model *md, const kiln_instr *ins, const spmd_tiling *want,
                            spmd_tiling **need) {
  if (ins->noperands != 1 ||
      !kiln_custom_call_is_annotation(kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET)) ||
      !kiln_shape_same_dims(&md->m->instrs[ins->operands[0]]->shape, &ins->shape))
    return false;
  need[0] = (spmd_tiling *)want;
  return true;
}

/* partition.c's movement_halo: pad, slice and concatenate split along a
 * dim they move, each device's window from its neighbours' shards. */
static bool rule_movement_halo(const spmd_model *md, const kiln_instr *ins, const spmd_tiling *want,
                               spmd_tiling **need, spmd_charge *c) {
  kiln_spmd_stats sent;
  if (!kiln__movement_halo_sent(md->a, md->m, ins, want, md->n, &sent)) return false;
  for (uint32_t k = 0; k < ins->noperands; k++) {
    const kiln_shape *s = &md->m->instrs[ins->operands[k]]->shape;
    need[k] = ins->op == KILN_OP_PAD && k == 1 ? replicated(md, s->rank) : (spmd_tiling *)want;
  }
  uint32_t np = sent.count[KILN_SPMD_COLLECTIVE_PERMUTE];
  if (np) { /* a permute's factor is 1: their bytes charged at once */
    charge_collective(md, c, KILN_SPMD_COLLECTIVE_PERMUTE, sent.bytes[KILN_SPMD_COLLECTIVE_PERMUTE],
                      2);
    c->comm.count[KILN_SPMD_COLLECTIVE_PERMUTE] += np - 1;
  }
  charge_compute(md, ins, share(&ins->shape, want), c);
  return true;
}

static bool rule_movement(const spmd_model *md, const kiln_instr *ins, const spmd_tiling *want,
                          spmd_tiling **need, spmd_charge *c) {
  const kiln_module *m = md->m;
  if (ins->noperands > 64 || ins->noperands == 0) return false;
  if (rule_movement_halo(md, ins, want, need, c)) return true;
  spmd_tiling *n0 = kiln__spmd_bwd(md->a, m, ins, 0, want);
  spmd_tiling *g0 = n0 ? kiln__spmd_fwd(md->a, m, ins, 0, n0) : NULL;
  if (g0 == NULL) return false;
  for (uint32_t k = 0; k < ins->noperands; k++) {
    const kiln_shape *s = &m->instrs[ins->operands[k]]->shape;
    if (!is_array(s)) return false;
    need[k] = s->rank == ins->shape.rank || k == 0 ? kiln__spmd_bwd(md->a, m, ins, k, g0)
                                                   : replicated(md, s->rank);
    if (need[k] == NULL) return false;
  }
  if (ins->op == KILN_OP_RESHAPE &&
      elems_of(&m->instrs[ins->operands[0]]->shape, need[0]) != elems_of(&ins->shape, g0))
    return false;
  charge_compute(md, ins, share(&ins->shape, g0), c);
  pending none = {0};
  finish(md, &ins->shape, g0, want, &none, c);
  return true;
}

static bool rule_reduce(const spmd_model *md, const kiln_instr *ins, spmd_tiling *const *lt,
                        const spmd_tiling *want, spmd_tiling **need, spmd_charge *c) {
  const kiln_module *m = md->m;
  if (ins->noperands != 2 || ins->ncalled != 1) return false;
  const kiln_shape *xs = &m->instrs[ins->operands[0]]->shape;
  const kiln_i64s *ds = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  spmd_tiling *keep = lt[0] ? lt[0] : replicated(md, xs->rank);
  spmd_tiling *res = kiln__spmd_fwd(md->a, m, ins, 0, keep);
  spmd_tiling *alt = kiln__spmd_bwd(md->a, m, ins, 0, want);
  if (res == NULL || alt == NULL || ds == NULL) return false;
  pending ar = {0};
  bool split = false;
  for (uint32_t i = 0; i < ds->n; i++) {
    ar.dims[ds->v[i]] = true;
    split = split || keep->tiles[ds->v[i]] > 1;
  }
  int64_t ob = kiln_shape_bytes(&ins->shape), xb = kiln_shape_bytes(xs);
  int64_t cost_keep =
      (split ? 2 * ob / kiln__tiling_count(res) : 0) + kiln__reshard_cost(res, want, ob);
  int64_t cost_alt = kiln__reshard_cost(keep, alt, xb);
  spmd_tiling *tx =
      cost_keep <= cost_alt && (!split || kiln__reduce_splittable(m, ins)) ? keep : alt;
  if (tx == alt) {
    res = kiln__spmd_fwd(md->a, m, ins, 0, alt);
    split = false;
    if (res == NULL) return false;
  }
  need[0] = tx;
  need[1] = replicated(md, 0);
  charge_compute(md, ins, share(xs, tx), c);
  if (split) {
    ar.any = true;
    ar.bytes = kiln__shard_bytes(&ins->shape, res);
    ar.group = 1;
    for (uint32_t d = 0; d < xs->rank; d++)
      if (ar.dims[d]) ar.group *= tx->tiles[d];
    ar.tiling = tx;
  }
  finish(md, &ins->shape, res, want, &ar, c);
  return true;
}

static bool rule_contraction(const spmd_model *md, const kiln_instr *ins, spmd_tiling *const *lt,
                             const spmd_tiling *want, spmd_tiling **need, spmd_charge *c) {
  const kiln_module *m = md->m;
  spmd_loop loops[SPMD_MAX_RANK * 2];
  uint32_t nl;
  if (!kiln__contraction_loops(m, ins, loops, &nl) || nl > SPMD_MAX_RANK) return false;
  const kiln_shape *ls = &m->instrs[ins->operands[0]]->shape;
  const kiln_shape *rs = &m->instrs[ins->operands[1]]->shape;
  const spmd_tiling *src[3] = {want, lt[0] ? lt[0] : replicated(md, ls->rank),
                               lt[1] ? lt[1] : replicated(md, rs->rank)};
  int64_t lm[SPMD_MAX_RANK], rm[SPMD_MAX_RANK], om[SPMD_MAX_RANK];
  for (uint32_t j = 0; j < nl; j++) {
    if (loops[j].l >= 0) lm[loops[j].l] = j;
    if (loops[j].r >= 0) rm[loops[j].r] = j;
    if (loops[j].o >= 0) om[loops[j].o] = j;
  }
  spmd_tiling *best[4] = {NULL};
  int64_t best_cost = 0;
  int64_t ob = kiln_shape_bytes(&ins->shape);
  for (int k = 0; k < 3; k++) {
    int64_t map[SPMD_MAX_RANK];
    for (uint32_t j = 0; j < nl; j++)
      map[j] = loops[j].fixed ? -1 : (k == 0 ? loops[j].o : k == 1 ? loops[j].l : loops[j].r);
    spmd_tiling *it = kiln__tiling_derive(md->a, src[k], map, nl);
    if (it == NULL) return false;
    spmd_tiling *tl = kiln__tiling_derive(md->a, it, lm, ls->rank);
    spmd_tiling *tr = kiln__tiling_derive(md->a, it, rm, rs->rank);
    spmd_tiling *to = kiln__tiling_derive(md->a, it, om, ins->shape.rank);
    if (!tl || !tr || !to) return false;
    bool ksplit = false;
    for (uint32_t j = 0; j < nl; j++) ksplit = ksplit || (loops[j].o < 0 && it->tiles[j] > 1);
    int64_t cost = kiln__reshard_cost(src[1], tl, kiln_shape_bytes(ls)) +
                   kiln__reshard_cost(src[2], tr, kiln_shape_bytes(rs)) +
                   (ksplit ? 2 * ob / kiln__tiling_count(to) : 0) +
                   kiln__reshard_cost(to, want, ob);
    if (best[0] == NULL || cost < best_cost) {
      best[0] = it, best[1] = tl, best[2] = tr, best[3] = to;
      best_cost = cost;
    }
  }
  spmd_tiling *it = best[0];
  need[0] = best[1];
  need[1] = best[2];
  /* partition.c's windowed_dot: the operand stays split, its blocks go
   * around the ring in steps - 1 permutes instead of one all-gather */
  spmd_window w;
  for (int k = 0; k < 2; k++)
    if (lt[k] && kiln__window_plan(m, ins, k, lt[k], best[1 + k], &md->opts, &w)) {
      need[k] = lt[k];
      charge_collective(md, c, KILN_SPMD_COLLECTIVE_PERMUTE, (w.steps - 1) * w.block_bytes, 2);
      c->comm.count[KILN_SPMD_COLLECTIVE_PERMUTE] += (uint32_t)(w.steps - 2);
      break;
    }
  double local = 1, all = 1;
  pending ar = {0};
  ar.group = 1;
  for (uint32_t j = 0; j < nl; j++) {
    int64_t size = loops[j].l >= 0 ? ls->dims[loops[j].l] : rs->dims[loops[j].r];
    all *= (double)size;
    local *= (double)kiln__shard_size(size, it->tiles[j]);
    if (loops[j].o < 0 && it->tiles[j] > 1) {
      ar.any = ar.dims[j] = true;
      ar.group *= it->tiles[j];
    }
  }
  charge_compute(md, ins, all > 0 ? local / all : 1, c);
  if (ar.any) {
    ar.bytes = kiln__shard_bytes(&ins->shape, best[3]);
    ar.tiling = it;
  }
  finish(md, &ins->shape, best[3], want, &ar, c);
  return true;
}

/* partition.c's rule_gather: the indices and the table split as the
 * result's batch dims and whole dims (kiln__gather_plan). */
static bool rule_gather(const spmd_model *md, const kiln_instr *ins, spmd_tiling *const *lt,
                        const spmd_tiling *want, spmd_tiling **need, spmd_charge *c) {
  const kiln_module *m = md->m;
  if (ins->noperands != 2) return false;
  const kiln_shape *ts = &m->instrs[ins->operands[0]]->shape;
  const kiln_shape *is = &m->instrs[ins->operands[1]]->shape;
  spmd_tiling *tt, *ti, *g;
  if (!is_array(ts) || !is_array(is) ||
      !kiln__gather_plan(md->a, m, ins, lt[0], lt[1], want, &tt, &ti, &g))
    return false;
  need[0] = tt;
  need[1] = ti;
  charge_compute(md, ins, share(&ins->shape, g), c);
  pending none = {0};
  finish(md, &ins->shape, g, want, &none, c);
  return true;
}

/* partition.c's gather_split_table: a table split along the dim it
 * indexes (and perhaps dims the result takes whole), when the result moves
 * fewer bytes than the table: the table as it is, the indices whole, the
 * result (split as the table's whole dims) on every device and one
 * all-reduce over the devices splitting the indexed dim. */
static bool rule_gather_split(const spmd_model *md, const kiln_instr *ins, spmd_tiling *const *lt,
                              const spmd_tiling *want, spmd_tiling **need, spmd_charge *c) {
  const kiln_module *m = md->m;
  if (ins->noperands != 2 || lt[0] == NULL) return false;
  const kiln_shape *ts = &m->instrs[ins->operands[0]]->shape;
  const kiln_shape *is = &m->instrs[ins->operands[1]]->shape;
  if (!is_array(ts) || !is_array(is) || ins->shape.dtype == KILN_PRED ||
      ts->dtype != ins->shape.dtype)
    return false;
  spmd_tiling *rt;
  int d = kiln__gather_split(md->a, m, ins, lt[0], &rt);
  if (d < 0) return false;
  int64_t rb = kiln_shape_bytes(&ins->shape), tb = kiln_shape_bytes(ts);
  int64_t ib = lt[1] && !kiln__tiling_is_replicated(lt[1]) ? kiln_shape_bytes(is) : 0;
  if (rb < 0 || tb < 0 || rb + ib >= tb) return false;
  need[0] = lt[0];
  need[1] = replicated(md, is->rank);
  charge_compute(md, ins, share(&ins->shape, rt), c);
  pending ar = {0};
  ar.any = true;
  ar.bytes = kiln__shard_bytes(&ins->shape, rt);
  ar.group = lt[0]->tiles[d];
  ar.tiling = lt[0];
  ar.dims[d] = true;
  finish(md, &ins->shape, rt, want, &ar, c);
  return true;
}

/* partition.c's rule_scatter: the result split along the dim the scatter
 * indexes and/or whole window dims, each device scattering into its shard;
 * the indices whole, the updates split along those window dims. Or the
 * partial scatter-adds of updates split along their batch dims and one
 * all-reduce (kiln__scatter_partial). */
static bool rule_scatter(const spmd_model *md, const kiln_instr *ins, spmd_tiling *const *lt,
                         const spmd_tiling *want, spmd_tiling **need, spmd_charge *c) {
  const kiln_module *m = md->m;
  int d;
  spmd_tiling *tu, *tb, *ti;
  bool dims[SPMD_MAX_RANK];
  const spmd_tiling *l3[3] = {lt[0], lt[1], lt[2]};
  if (!kiln__scatter_plan(md->a, m, ins, want, &d, &tu)) {
    if (!kiln__scatter_partial(md->a, m, ins, l3, &tb, &ti, dims)) return false;
    /* partial scatter-adds and one all-reduce of the whole result */
    const kiln_shape *us = &m->instrs[ins->operands[2]]->shape;
    need[0] = replicated(md, ins->shape.rank);
    need[1] = ti;
    need[2] = tb;
    charge_compute(md, ins, share(us, tb), c);
    int64_t group = 1;
    for (uint32_t u = 0; u < us->rank; u++)
      if (dims[u]) group *= tb->tiles[u];
    charge_collective(md, c, KILN_SPMD_ALL_REDUCE, kiln_shape_bytes(&ins->shape), group);
    pending none = {0};
    finish(md, &ins->shape, replicated(md, ins->shape.rank), want, &none, c);
    return true;
  }
  const kiln_shape *is = &m->instrs[ins->operands[1]]->shape;
  need[0] = (spmd_tiling *)want;
  need[1] = replicated(md, is->rank);
  need[2] = tu;
  charge_compute(md, ins, share(&ins->shape, want), c);
  return true;
}

static void charge_add(spmd_charge *c, const spmd_charge *d) {
  c->flops += d->flops;
  c->compute_s += d->compute_s;
  c->comm_s += d->comm_s;
  for (int k = 0; k < KILN_SPMD_NKINDS; k++) {
    c->comm.count[k] += d->comm.count[k];
    c->comm.bytes[k] += d->comm.bytes[k];
  }
}

void kiln__model_rule(const spmd_model *md, const kiln_instr *ins, spmd_tiling *const *lt,
                      const spmd_tiling *want, spmd_tiling **need, bool *whole, spmd_charge *c) {
  for (uint32_t k = 0; k < ins->noperands; k++) need[k] = NULL;
  *whole = false;
  bool arr = is_array(&ins->shape) && want != NULL, done = false;
  pending none = {0};
  spmd_charge r = {0}; /* a rule that gives up leaves nothing charged */
  switch (ins->op) {
  case KILN_OP_PARAMETER: done = true; break; /* a shard, or a whole tuple */
  case KILN_OP_GET_TUPLE_ELEMENT:
    if (arr)
      finish(md, &ins->shape, lt[0] ? lt[0] : replicated(md, ins->shape.rank), want, &none, &r);
    done = true;
    break;
  case KILN_OP_CUSTOM_CALL: done = arr && rule_annotation(md, ins, want, need); break;
  case KILN_OP_BROADCAST:
  case KILN_OP_TRANSPOSE:
  case KILN_OP_RESHAPE:
  case KILN_OP_SLICE:
  case KILN_OP_PAD:
  case KILN_OP_REVERSE:
  case KILN_OP_CONCATENATE: done = arr && rule_movement(md, ins, want, need, &r); break;
  case KILN_OP_REDUCE: done = arr && rule_reduce(md, ins, lt, want, need, &r); break;
  case KILN_OP_DOT:
  case KILN_OP_CONVOLUTION: done = arr && rule_contraction(md, ins, lt, want, need, &r); break;
  case KILN_OP_GATHER:
    done = arr && (rule_gather_split(md, ins, lt, want, need, &r) ||
                   rule_gather(md, ins, lt, want, need, &r));
    break;
  case KILN_OP_SCATTER:
    done = arr && ins->noperands == 3 && rule_scatter(md, ins, lt, want, need, &r);
    break;
  default:
    if (kiln_opcode_flags(ins->op) & KILN_OPF_ELEMENTWISE)
      done = arr && rule_elementwise(md, ins, want, need, &r);
    break;
  }
  if (done) {
    charge_add(c, &r);
    return;
  }
  rule_whole(md, ins, need, whole, c);
}

/* ---- lifetimes ----------------------------------------------------------- */

static bool is_alias(const kiln_instr *ins) {
  return ins->op == KILN_OP_GET_TUPLE_ELEMENT || ins->op == KILN_OP_BITCAST ||
         ins->op == KILN_OP_TUPLE ||
         (ins->op == KILN_OP_CUSTOM_CALL &&
          kiln_custom_call_is_annotation(kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET)));
}

int kiln__model_lifetimes(kiln_arena *a, const kiln_module *m, uint32_t comp, uint32_t **last,
                          bool **counted) {
  const kiln_computation *c = m->comps[comp];
  uint32_t n = c->ninstrs;
  uint32_t *pos = kiln_arena_alloc(a, (m->ninstrs + 1) * sizeof *pos);
  *last = kiln_arena_alloc(a, (n ? n : 1) * sizeof **last);
  *counted = kiln_arena_alloc(a, (n ? n : 1) * sizeof **counted);
  if (pos == NULL || *last == NULL || *counted == NULL) return KILN_ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    const kiln_instr *ins = m->instrs[c->instrs[i]];
    pos[ins->id] = i;
    (*last)[i] = ins->op == KILN_OP_PARAMETER || ins->id == c->root ? n : i;
    (*counted)[i] = is_array(&ins->shape) && !is_alias(ins);
  }
  /* Users come after what they use: one backward walk sees every user's
   * final lifetime before its operands'. */
  for (uint32_t i = n; i-- > 0;) {
    const kiln_instr *ins = m->instrs[c->instrs[i]];
    uint32_t use = is_alias(ins) ? (*last)[i] : i;
    for (uint32_t k = 0; k < ins->noperands; k++) {
      const kiln_instr *o = m->instrs[ins->operands[k]];
      if (o->comp != comp) continue;
      uint32_t p = pos[o->id];
      if ((*last)[p] < use) (*last)[p] = use;
    }
  }
  return 0;
}

/* ---- the modelled cost of a plan ------------------------------------------ */

typedef struct eval {
  spmd_model md;
  kiln_module *m;
  spmd_tiling **lt;  /* arrays: the tiling of the local value */
  spmd_tiling ***le; /* tuples: per element (NULL: replicated) */
  spmd_tiling *(*cache)[CACHE];
  spmd_charge c;
} eval;

/* partition.c's local_as: a reshard, remembered per instruction. */
static void local_as(eval *e, kiln_id id, spmd_tiling *want) {
  if (e->lt[id] == NULL || kiln__tiling_equal(e->lt[id], want)) return;
  for (int i = 0; i < CACHE; i++)
    if (e->cache[id][i] && kiln__tiling_equal(e->cache[id][i], want)) return;
  kiln__model_reshard(&e->md, &e->m->instrs[id]->shape, e->lt[id], want, &e->c);
  for (int i = 0; i < CACHE; i++)
    if (e->cache[id][i] == NULL) {
      e->cache[id][i] = want;
      break;
    }
}

/* The tilings propagation wrote on ins: *want for an array, *elems for a
 * tuple with a tuple sharding. */
static int wanted(eval *e, const kiln_instr *ins, spmd_tiling **want, spmd_tiling ***elems,
                  kiln_status *st) {
  const kiln_attr *sa = kiln_instr_attr(ins, KILN_ATTR_SHARDING);
  const kiln_sharding *s = sa ? sa->v.sharding : NULL;
  char where[200];
  kiln_instr_where(e->m, ins, where, sizeof where);
  *want = NULL;
  *elems = NULL;
  if (is_array(&ins->shape))
    return kiln__tiling_from_sharding(e->md.a, s, ins->shape.rank, e->md.n, where, want, st);
  if (s == NULL || s->kind != KILN_SHARD_TUPLE || !kiln_shape_is_tuple(&ins->shape) ||
      s->nelems != ins->shape.rank)
    return 0;
  *elems = kiln_arena_calloc(e->md.a, s->nelems ? s->nelems : 1, sizeof **elems);
  if (*elems == NULL) return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
  for (uint32_t i = 0; i < s->nelems; i++) {
    const kiln_shape *es = &ins->shape.tuple[i];
    if (!is_array(es)) continue;
    int rc = kiln__tiling_from_sharding(e->md.a, &s->elems[i], es->rank, e->md.n, where,
                                        &(*elems)[i], st);
    if (rc) return rc;
  }
  return 0;
}

/* The elements of tuple `id` gathered whole (partition.c's whole()). */
static void gather_elems(eval *e, kiln_id id) {
  const kiln_shape *s = &e->m->instrs[id]->shape;
  if (!kiln_shape_is_tuple(s) || e->le[id] == NULL) return;
  for (uint32_t i = 0; i < s->rank; i++)
    if (e->le[id][i] && is_array(&s->tuple[i]))
      kiln__model_reshard(&e->md, &s->tuple[i], e->le[id][i], replicated(&e->md, s->tuple[i].rank),
                          &e->c);
}

static int eval_instr(eval *e, const kiln_instr *ins, kiln_status *st) {
  spmd_tiling *want, **elems;
  int rc = wanted(e, ins, &want, &elems, st);
  if (rc) return rc;
  const kiln_module *m = e->m;
  if (ins->op == KILN_OP_TUPLE) {
    spmd_tiling **le = kiln_arena_calloc(e->md.a, ins->noperands ? ins->noperands : 1, sizeof *le);
    if (le == NULL) return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
    for (uint32_t k = 0; k < ins->noperands; k++) {
      kiln_id o = ins->operands[k];
      if (is_array(&m->instrs[o]->shape)) {
        le[k] = elems && elems[k] ? elems[k] : e->lt[o];
        local_as(e, o, le[k]);
      } else {
        gather_elems(e, o);
      }
    }
    e->le[ins->id] = le;
    return 0;
  }
  uint32_t no = ins->noperands ? ins->noperands : 1;
  spmd_tiling **lt = kiln_arena_calloc(e->md.a, 2 * (size_t)no, sizeof *lt), **need = lt + no;
  if (lt == NULL) return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
  for (uint32_t k = 0; k < ins->noperands; k++) lt[k] = e->lt[ins->operands[k]];
  if (ins->op == KILN_OP_GET_TUPLE_ELEMENT) {
    kiln_id t = ins->operands[0];
    int64_t i = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, 0);
    lt[0] = e->le[t] && i >= 0 && i < (int64_t)m->instrs[t]->shape.rank ? e->le[t][i] : NULL;
  }
  bool whole;
  kiln__model_rule(&e->md, ins, lt, want, need, &whole, &e->c);
  for (uint32_t k = 0; k < ins->noperands; k++) {
    if (need[k])
      local_as(e, ins->operands[k], need[k]);
    else if (whole)
      gather_elems(e, ins->operands[k]);
  }
  if (is_array(&ins->shape)) e->lt[ins->id] = want;
  if (ins->op == KILN_OP_PARAMETER && elems) e->le[ins->id] = elems;
  return 0;
}

static int64_t peak_memory(eval *e, kiln_status *st) {
  const kiln_computation *c = e->m->comps[e->m->entry];
  uint32_t *last;
  bool *counted;
  if (kiln__model_lifetimes(e->md.a, e->m, e->m->entry, &last, &counted)) {
    kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
    return -1;
  }
  int64_t params = 0, peak = 0;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *ins = e->m->instrs[c->instrs[i]];
    if (counted[i] && ins->op == KILN_OP_PARAMETER)
      params += kiln__shard_bytes(&ins->shape, e->lt[ins->id]);
  }
  for (uint32_t t = 0; t < c->ninstrs; t++) {
    int64_t live = 0;
    for (uint32_t i = 0; i <= t; i++) {
      const kiln_instr *ins = e->m->instrs[c->instrs[i]];
      if (counted[i] && ins->op != KILN_OP_PARAMETER && last[i] >= t)
        live += kiln__shard_bytes(&ins->shape, e->lt[ins->id]);
    }
    if (live > peak) peak = live;
  }
  return params + peak;
}

int kiln_spmd_plan_cost(const kiln_module *src, int64_t partitions, const kiln_spmd_auto_options *o,
                        kiln_spmd_cost *out, kiln_status *st) {
  memset(out, 0, sizeof *out);
  if (kiln_module_entry(src) == NULL)
    return kiln_status_set(st, KILN_EINVAL, "spmd", "module has no ENTRY computation");
  kiln_module *m;
  int rc = kiln_module_clone(src, &m);
  if (rc) return kiln_status_set(st, rc, "spmd", "out of memory");
  eval e = {.m = m};
  kiln_arena *a = kiln_arena_create();
  if (a == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
    goto out_free_module;
  }
  if ((rc = kiln_spmd_propagate(m, partitions, st))) goto out_free_arena;
  kiln__model_init(&e.md, m, a, partitions, o);
  size_t cap = m->ninstrs + 1;
  e.lt = kiln_arena_calloc(a, cap, sizeof *e.lt);
  e.le = kiln_arena_calloc(a, cap, sizeof *e.le);
  e.cache = kiln_arena_calloc(a, cap, sizeof *e.cache);
  if (!e.lt || !e.le || !e.cache) {
    rc = kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
    goto out_free_arena;
  }
  const kiln_computation *c = m->comps[m->entry];
  for (uint32_t i = 0; i < c->ninstrs && rc == 0; i++)
    rc = eval_instr(&e, m->instrs[c->instrs[i]], st);
  if (rc) goto out_free_arena;
  if ((out->memory = peak_memory(&e, st)) < 0) {
    rc = KILN_ENOMEM;
    goto out_free_arena;
  }
  out->compute_s = e.c.compute_s;
  out->comm_s = e.c.comm_s;
  out->seconds = e.c.compute_s + e.c.comm_s;
  out->flops = e.c.flops;
  out->comm = e.c.comm;
out_free_arena:
  kiln_arena_destroy(a);
out_free_module:
  kiln_module_destroy(m);
  return rc;
}
