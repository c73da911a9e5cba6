/* Tilings (spmd_internal.h): a sharding read as a device array of shape
 * [tiles..., rep], and the few operations the propagation pass and the
 * partitioner need on them: move dims around (derive), fold dims into the
 * replication, compare, and list the device groups along some dims (the
 * replica groups of the collectives the partitioner inserts).
 *
 * Every operation is a transpose of the device array followed by a
 * regrouping of its dims, so a derived tiling always names each device
 * exactly once.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/sharding.h"
#include "compiler/spmd/spmd_internal.h"

static spmd_tiling *alloc_tiling(kiln_arena *a, uint32_t rank, int64_t n) {
  spmd_tiling *t = kiln_arena_calloc(a, 1, sizeof *t);
  if (t == NULL) return NULL;
  t->rank = rank;
  t->n = n;
  t->dev = kiln_arena_alloc(a, (size_t)n * sizeof *t->dev);
  t->pos = kiln_arena_alloc(a, (size_t)n * sizeof *t->pos);
  if (t->dev == NULL || t->pos == NULL) return NULL;
  return t;
}

static void fill_pos(spmd_tiling *t) {
  for (int64_t i = 0; i < t->n; i++) t->pos[t->dev[i]] = i;
}

spmd_tiling *kiln__tiling_replicated(kiln_arena *a, uint32_t rank, int64_t n) {
  if (rank > SPMD_MAX_RANK) return NULL;
  spmd_tiling *t = alloc_tiling(a, rank, n);
  if (t == NULL) return NULL;
  for (uint32_t d = 0; d < rank; d++) t->tiles[d] = 1;
  t->rep = n;
  for (int64_t i = 0; i < n; i++) t->dev[i] = i;
  fill_pos(t);
  return t;
}

int kiln__tiling_from_sharding(kiln_arena *a, const kiln_sharding *s, uint32_t rank, int64_t n,
                               const char *where, spmd_tiling **out, kiln_status *st) {
  if (rank > SPMD_MAX_RANK)
    return kiln_status_set(st, KILN_EUNIMPL, where,
                           "the partitioner takes arrays of rank %d at most", SPMD_MAX_RANK);
  if (s == NULL || s->kind == KILN_SHARD_REPLICATED || s->kind == KILN_SHARD_MAXIMAL ||
      s->kind == KILN_SHARD_UNKNOWN) {
    *out = kiln__tiling_replicated(a, rank, n);
    return *out ? 0 : kiln_status_set(st, KILN_ENOMEM, where, "out of memory");
  }
  if (s->kind == KILN_SHARD_MANUAL)
    return kiln_status_set(st, KILN_EUNIMPL, where,
                           "manual sharding ({manual}) outside a shard_map region (its values "
                           "lie between an SPMDFullToShardShape and an SPMDShardToFullShape, or "
                           "Shardy's xla.sdy.GlobalToLocalShape and LocalToGlobalShape)");
  if (s->kind != KILN_SHARD_TILED)
    return kiln_status_set(st, KILN_EINVAL, where, "a tuple sharding on an array");
  uint32_t nsub = s->last_tile_dims.n ? s->last_tile_dims.n : (s->last_tile_dim_replicate ? 1 : 0);
  for (uint32_t i = 0; i < s->last_tile_dims.n; i++)
    if (s->last_tile_dims.v[i] == KILN_SHARD_MANUAL)
      return kiln_status_set(
          st, KILN_EUNIMPL, where,
          "a manual subgroup (last_tile_dims={manual}) outside a shard_map region (its "
          "values lie between an SPMDFullToShardShape and an SPMDShardToFullShape)");
  if (s->tile_dims.n != rank + nsub)
    return kiln_status_set(st, KILN_EINVAL, where,
                           "sharding has %u tile dims for an array of rank %u (and %u subgroups)",
                           s->tile_dims.n, rank, nsub);
  int64_t count = kiln_sharding_tile_count(s);
  if (count != n)
    return kiln_status_set(st, KILN_EINVAL, where,
                           "sharding names %lld devices, the mesh has %lld partitions",
                           (long long)count, (long long)n);
  spmd_tiling *t = alloc_tiling(a, rank, n);
  if (t == NULL) return kiln_status_set(st, KILN_ENOMEM, where, "out of memory");
  if (!kiln_sharding_tile_devices(s, t->dev, n))
    return kiln_status_set(st, KILN_EINVAL, where, "malformed sharding device list");
  for (int64_t i = 0; i < n; i++) t->pos[i] = -1;
  for (int64_t i = 0; i < n; i++) {
    if (t->dev[i] < 0 || t->dev[i] >= n || t->pos[t->dev[i]] >= 0)
      return kiln_status_set(st, KILN_EINVAL, where,
                             "sharding devices are not a permutation of 0..%lld", (long long)n - 1);
    t->pos[t->dev[i]] = i;
  }
  t->rep = 1;
  for (uint32_t d = 0; d < rank; d++) t->tiles[d] = s->tile_dims.v[d];
  for (uint32_t k = rank; k < s->tile_dims.n; k++) t->rep *= s->tile_dims.v[k];
  *out = t;
  return 0;
}

kiln_sharding *kiln__tiling_to_sharding(kiln_arena *a, const spmd_tiling *t) {
  kiln_sharding *s = kiln_arena_calloc(a, 1, sizeof *s);
  if (s == NULL) return NULL;
  if (kiln__tiling_is_replicated(t)) {
    s->kind = KILN_SHARD_REPLICATED;
    return s;
  }
  s->kind = KILN_SHARD_TILED;
  uint32_t nd = t->rank + (t->rep > 1);
  s->tile_dims.v = kiln_arena_alloc(a, (nd ? nd : 1) * sizeof(int64_t));
  s->devices.v = kiln_arena_memdup(a, t->dev, (size_t)t->n * sizeof(int64_t));
  if (s->tile_dims.v == NULL || s->devices.v == NULL) return NULL;
  s->tile_dims.n = nd;
  for (uint32_t d = 0; d < t->rank; d++) s->tile_dims.v[d] = t->tiles[d];
  if (t->rep > 1) s->tile_dims.v[t->rank] = t->rep;
  s->devices.n = (uint32_t)t->n;
  s->last_tile_dim_replicate = t->rep > 1;
  return s;
}

/* Transposes t's device array [tiles..., rep] by order[0..t->rank] (a
 * permutation of the rank + 1 axes, rep being axis t->rank) into out->dev;
 * out's counts are the caller's. */
static void transpose_devices(const spmd_tiling *t, const uint32_t *order, spmd_tiling *out) {
  uint32_t na = t->rank + 1;
  int64_t size[SPMD_MAX_RANK + 1], stride[SPMD_MAX_RANK + 1], idx[SPMD_MAX_RANK + 1];
  for (uint32_t k = 0; k < t->rank; k++) size[k] = t->tiles[k];
  size[t->rank] = t->rep;
  int64_t s = 1;
  for (uint32_t k = na; k-- > 0;) {
    stride[k] = s;
    s *= size[k];
  }
  for (uint32_t k = 0; k < na; k++) idx[k] = 0;
  for (int64_t i = 0; i < t->n; i++) {
    int64_t src = 0;
    for (uint32_t k = 0; k < na; k++) src += idx[k] * stride[order[k]];
    out->dev[i] = t->dev[src];
    for (uint32_t k = na; k-- > 0;) {
      if (++idx[k] < size[order[k]]) break;
      idx[k] = 0;
    }
  }
  fill_pos(out);
}

spmd_tiling *kiln__tiling_derive(kiln_arena *a, const spmd_tiling *t, const int64_t *map,
                                 uint32_t rank) {
  if (rank > SPMD_MAX_RANK) return NULL;
  spmd_tiling *o = alloc_tiling(a, rank, t->n);
  if (o == NULL) return NULL;
  uint32_t order[SPMD_MAX_RANK + 1], no = 0;
  bool used[SPMD_MAX_RANK] = {false};
  for (uint32_t j = 0; j < rank; j++) {
    int64_t src = map[j];
    if (src >= 0 && (uint32_t)src < t->rank && !used[src]) {
      o->tiles[j] = t->tiles[src];
      used[src] = true;
      order[no++] = (uint32_t)src;
    } else {
      o->tiles[j] = 1;
    }
  }
  o->rep = t->rep;
  for (uint32_t d = 0; d < t->rank; d++)
    if (!used[d]) {
      order[no++] = d;
      o->rep *= t->tiles[d];
    }
  order[no++] = t->rank;
  transpose_devices(t, order, o);
  return o;
}

spmd_tiling *kiln__tiling_fold(kiln_arena *a, const spmd_tiling *t, const bool *fold) {
  int64_t map[SPMD_MAX_RANK];
  for (uint32_t d = 0; d < t->rank; d++) map[d] = fold[d] ? -1 : (int64_t)d;
  return kiln__tiling_derive(a, t, map, t->rank);
}

bool kiln__tiling_is_replicated(const spmd_tiling *t) { return t->rep == t->n; }

int64_t kiln__tiling_count(const spmd_tiling *t) { return t->n / t->rep; }

int64_t kiln__tiling_coord(const spmd_tiling *t, int64_t dev, uint32_t d) {
  int64_t p = t->pos[dev] / t->rep;
  for (uint32_t k = t->rank; k-- > d + 1;) p /= t->tiles[k];
  return p % t->tiles[d];
}

bool kiln__tiling_equal(const spmd_tiling *a, const spmd_tiling *b) {
  if (a->rank != b->rank || a->n != b->n || a->rep != b->rep) return false;
  for (uint32_t d = 0; d < a->rank; d++)
    if (a->tiles[d] != b->tiles[d]) return false;
  for (int64_t k = 0; k < a->n; k++)
    if (a->pos[k] / a->rep != b->pos[k] / b->rep) return false;
  return true;
}

bool kiln__tiling_covers(const spmd_tiling *from, const spmd_tiling *to) {
  if (from->rank != to->rank || from->n != to->n) return false;
  for (uint32_t d = 0; d < from->rank; d++) {
    if (from->tiles[d] == 1) continue;
    if (to->tiles[d] != from->tiles[d]) return false;
    for (int64_t k = 0; k < from->n; k++)
      if (kiln__tiling_coord(from, k, d) != kiln__tiling_coord(to, k, d)) return false;
  }
  return true;
}

int kiln__tiling_groups(kiln_arena *a, const spmd_tiling *t, const bool *dims, int64_t **out,
                        int64_t *ngroups, int64_t *size) {
  /* Move the group dims last: derive with them at the end, others first. */
  int64_t map[SPMD_MAX_RANK] = {0};
  uint32_t nk = 0;
  int64_t sz = 1;
  for (uint32_t d = 0; d < t->rank; d++)
    if (!dims[d]) map[nk++] = d;
  uint32_t nkeep = nk;
  for (uint32_t d = 0; d < t->rank; d++)
    if (dims[d]) {
      map[nk++] = d;
      sz *= t->tiles[d];
    }
  /* derive puts unnamed dims into rep after the named ones; here all are
   * named, so rep stays last: [others..., group dims..., rep]. Groups are
   * formed by fixing others and rep. */
  spmd_tiling *g = kiln__tiling_derive(a, t, map, t->rank);
  if (g == NULL) return KILN_ENOMEM;
  int64_t outer = 1;
  for (uint32_t k = 0; k < nkeep; k++) outer *= g->tiles[k];
  int64_t *v = kiln_arena_alloc(a, (size_t)t->n * sizeof *v);
  if (v == NULL) return KILN_ENOMEM;
  int64_t ng = 0;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t r = 0; r < g->rep; r++, ng++)
      for (int64_t i = 0; i < sz; i++) v[ng * sz + i] = g->dev[(o * sz + i) * g->rep + r];
  *out = v;
  *ngroups = ng;
  *size = sz;
  return 0;
}

spmd_tiling *kiln__tiling_merge(kiln_arena *a, const spmd_tiling *x, const spmd_tiling *y) {
  if (x->rank != y->rank || x->n != y->n) return NULL;
  uint32_t r = x->rank;
  int64_t tiles[SPMD_MAX_RANK], count = 1;
  bool from_x[SPMD_MAX_RANK];
  for (uint32_t d = 0; d < r; d++) {
    if (x->tiles[d] > 1 && y->tiles[d] > 1) {
      if (x->tiles[d] != y->tiles[d]) return NULL;
      for (int64_t k = 0; k < x->n; k++)
        if (kiln__tiling_coord(x, k, d) != kiln__tiling_coord(y, k, d)) return NULL;
    }
    from_x[d] = x->tiles[d] > 1;
    tiles[d] = from_x[d] ? x->tiles[d] : y->tiles[d];
    count *= tiles[d];
  }
  if (count <= 0 || x->n % count != 0) return NULL;
  int64_t rep = x->n / count;
  spmd_tiling *o = alloc_tiling(a, r, x->n);
  int64_t *fill = kiln_arena_calloc(a, (size_t)count, sizeof *fill);
  if (o == NULL || fill == NULL) return NULL;
  for (uint32_t d = 0; d < r; d++) o->tiles[d] = tiles[d];
  o->rep = rep;
  /* Each device's tile: its x coordinates on x's dims, y's elsewhere; every
   * tile must get exactly rep devices. */
  for (int64_t k = 0; k < x->n; k++) {
    int64_t lin = 0;
    for (uint32_t d = 0; d < r; d++)
      lin = lin * tiles[d] + kiln__tiling_coord(from_x[d] ? x : y, k, d);
    if (fill[lin] == rep) return NULL;
    o->dev[lin * rep + fill[lin]++] = k;
  }
  fill_pos(o);
  return o;
}

int64_t kiln__reshard_cost(const spmd_tiling *from, const spmd_tiling *to, int64_t bytes) {
  if (kiln__tiling_equal(from, to) || kiln__tiling_covers(from, to)) return 0;
  return bytes;
}

/* ---- dims through ops -------------------------------------------------- */

void kiln__reshape_dims(const kiln_shape *in, const kiln_shape *out, int64_t *map, int64_t *lim) {
  for (uint32_t j = 0; j < out->rank; j++) map[j] = -1, lim[j] = 0;
  uint32_t i = 0, j = 0;
  while (i < in->rank && j < out->rank) {
    if (in->dims[i] == 1) {
      i++;
      continue;
    }
    if (out->dims[j] == 1) {
      j++;
      continue;
    }
    /* A group starting at (i, j): its major dims correspond. */
    uint32_t i0 = i, j0 = j;
    int64_t pi = in->dims[i++], pj = out->dims[j++];
    while (pi != pj) {
      if (pi < pj && i < in->rank)
        pi *= in->dims[i++];
      else if (pj < pi && j < out->rank)
        pj *= out->dims[j++];
      else
        return;
    }
    map[j0] = i0;
    lim[j0] = in->dims[i0] < out->dims[j0] ? in->dims[i0] : out->dims[j0];
    /* A 1:1 group keeps even uneven tilings whole. */
    if (i == i0 + 1 && j == j0 + 1) lim[j0] = -1;
  }
}

bool kiln__contraction_loops(const kiln_module *m, const kiln_instr *ins, spmd_loop *loops,
                             uint32_t *n) {
  *n = 0;
  if (ins->op == KILN_OP_DOT) {
    if (ins->noperands != 2) return false;
    const kiln_shape *ls = &m->instrs[ins->operands[0]]->shape;
    const kiln_shape *rs = &m->instrs[ins->operands[1]]->shape;
    const kiln_i64s *lb = kiln_instr_attr_ints(ins, KILN_ATTR_LHS_BATCH_DIMS);
    const kiln_i64s *rb = kiln_instr_attr_ints(ins, KILN_ATTR_RHS_BATCH_DIMS);
    const kiln_i64s *lc = kiln_instr_attr_ints(ins, KILN_ATTR_LHS_CONTRACTING_DIMS);
    const kiln_i64s *rc = kiln_instr_attr_ints(ins, KILN_ATTR_RHS_CONTRACTING_DIMS);
    uint32_t nb = lb ? lb->n : 0, nc = lc ? lc->n : 0;
    if ((rb ? rb->n : 0) != nb || (rc ? rc->n : 0) != nc) return false;
    if (ls->rank > SPMD_MAX_RANK || rs->rank > SPMD_MAX_RANK) return false;
    bool lused[SPMD_MAX_RANK] = {false}, rused[SPMD_MAX_RANK] = {false};
    int64_t o = 0;
    for (uint32_t k = 0; k < nb; k++) {
      loops[(*n)++] = (spmd_loop){lb->v[k], rb->v[k], o++, false};
      lused[lb->v[k]] = rused[rb->v[k]] = true;
    }
    for (uint32_t k = 0; k < nc; k++) lused[lc->v[k]] = rused[rc->v[k]] = true;
    for (uint32_t d = 0; d < ls->rank; d++)
      if (!lused[d]) loops[(*n)++] = (spmd_loop){d, -1, o++, false};
    for (uint32_t d = 0; d < rs->rank; d++)
      if (!rused[d]) loops[(*n)++] = (spmd_loop){-1, d, o++, false};
    for (uint32_t k = 0; k < nc; k++) loops[(*n)++] = (spmd_loop){lc->v[k], rc->v[k], -1, false};
    return true;
  }
  if (ins->op == KILN_OP_CONVOLUTION) {
    const kiln_attr *da = kiln_instr_attr(ins, KILN_ATTR_DIM_LABELS);
    if (da == NULL || ins->noperands != 2) return false;
    if (kiln_instr_attr_int(ins, KILN_ATTR_FEATURE_GROUP_COUNT, 1) != 1 ||
        kiln_instr_attr_int(ins, KILN_ATTR_BATCH_GROUP_COUNT, 1) != 1)
      return false;
    const kiln_conv_dims *c = da->v.conv;
    if (c->nspatial + 3 > SPMD_MAX_RANK) return false;
    loops[(*n)++] = (spmd_loop){c->in_batch, -1, c->out_batch, false};
    loops[(*n)++] = (spmd_loop){-1, c->kernel_out, c->out_feature, false};
    loops[(*n)++] = (spmd_loop){c->in_feature, c->kernel_in, -1, false};
    for (uint32_t k = 0; k < c->nspatial; k++)
      loops[(*n)++] = (spmd_loop){c->in_spatial[k], c->kernel_spatial[k], c->out_spatial[k], true};
    return true;
  }
  return false;
}

bool kiln__tiling_auto_only(const spmd_tiling *t, const int64_t *sizes, const bool *manual,
                            uint32_t naxes) {
  int64_t n = t->n, total = 1;
  for (uint32_t k = 0; k < naxes; k++) total *= sizes[k];
  if (total != n || n <= 0 || t->rep <= 0) return false;
  int64_t *seen = kiln_calloc((size_t)(2 * n), sizeof *seen);
  if (seen == NULL) return false;
  int64_t *tile_of_auto = seen, *man_of_k = seen + n;
  for (int64_t i = 0; i < 2 * n; i++) seen[i] = -1;
  bool ok = true;
  for (int64_t d = 0; d < n && ok; d++) {
    /* the device's automatic and manual codes (mixed radix, row-major) */
    int64_t rest = d, acode = 0, mcode = 0, ascale = 1, mscale = 1;
    for (uint32_t k = naxes; k-- > 0;) {
      int64_t c = rest % sizes[k];
      rest /= sizes[k];
      if (manual[k])
        mcode += c * mscale, mscale *= sizes[k];
      else
        acode += c * ascale, ascale *= sizes[k];
    }
    int64_t pos = t->pos[d], tile = pos / t->rep, k = pos % t->rep;
    if (tile_of_auto[acode] < 0) tile_of_auto[acode] = tile;
    if (man_of_k[k] < 0) man_of_k[k] = mcode;
    ok = tile_of_auto[acode] == tile && man_of_k[k] == mcode;
  }
  kiln_free(seen);
  return ok;
}
