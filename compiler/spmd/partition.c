/* The SPMD partitioner: a propagated module (every ENTRY array instruction
 * carries a sharding over its global shape) becomes one per-device program,
 * driven by partition-id, that computes each instruction's shard.
 *
 * The ENTRY is walked in order; each instruction is built by the rule its
 * opcode has in `rules` (one table, as the transforms' rules.c), which asks
 * for its operands in the tilings it needs (kiln__spmd_bwd), emits the
 * local op, and says what tiling its local result has; the driver then
 * reshards that to the instruction's own sharding. An op without a rule is
 * computed whole: its operands are gathered to replicated, it runs on every
 * device as written, and each device slices out its shard. So an
 * unsupported op costs communication, never a wrong result.
 *
 * Resharding (from -> to) all-gathers the dims whose split changes, cuts
 * the padding off, and slices out the target shard with a dynamic-slice at
 * an offset looked up by partition-id (a local slice is free). Reductions
 * over a split dim (reduce, dot and convolution contracting dims) compute a
 * partial result per device and all-reduce it over the devices that split
 * that dim, with the op's own reducer; uneven shards are masked with the
 * reducer's identity first (the init value, or zero for dot).
 * The all-reduce combiner then merges all-reduces of one group and reducer
 * that do not depend on each other into one tuple all-reduce.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/sharding.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/spmd/spmd.h"
#include "compiler/spmd/spmd_internal.h"

#define CACHE 4

typedef struct part {
  kiln_module *m;
  kiln__tx *tx;
  kiln__b b;
  kiln_arena *a; /* tilings, freed with the partitioner */
  int64_t n;
  kiln_id *local;    /* local[old id]: its shard in the new program */
  spmd_tiling **lt;  /* arrays: the tiling of local[old id] */
  spmd_tiling ***le; /* tuples: per element, NULL = all replicated */
  /* Reshards already built: cached[old id][i] in tiling ctile[..][i]. */
  kiln_id (*cached)[CACHE];
  bool *manual;     /* manual[old id]: a per-device value of a shard_map region */
  bool region_body; /* building a partially manual region's body split along
                       its automatic axes: no exchanges that pair devices by
                       position across tilings (permutes, all-to-all) */
  spmd_tiling *(*ctile)[CACHE];
  kiln_id pid; /* s32 partition id of the computation being built, built once */
  size_t ncap; /* entries of local, lt, le, cached, ctile */
  /* The all-reduce the last rule ended with (KILN_NO_ID: none): the
   * driver may turn it and the reshard after it into a reduce-scatter. */
  kiln_id ar;
  const spmd_tiling *ar_tiling; /* the loops' (or operand's) tiling ... */
  bool ar_dims[SPMD_MAX_RANK];  /* ... and the split dims reduced over */
  int64_t channel;
  kiln_spmd_options opts;
} part;

typedef int (*rule_fn)(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                       spmd_tiling **got);

static int fail(part *p, const kiln_instr *ins, int code, const char *msg) {
  return kiln__tx_fail(p->tx, code, ins, "spmd: %s", msg);
}

static const kiln_shape *gshape(const part *p, kiln_id old) { return &p->m->instrs[old]->shape; }

static spmd_tiling *replicated(part *p, uint32_t rank) {
  return kiln__tiling_replicated(p->a, rank, p->n);
}

/* ---- small builders ------------------------------------------------------ */

static kiln_id pid(part *p) {
  if (p->pid == KILN_NO_ID) {
    kiln_id id = kiln__b_op(&p->b, KILN_OP_PARTITION_ID, NULL, 0);
    p->pid = kiln__b_convert(&p->b, id, KILN_S32);
  }
  return p->pid;
}

/* vals[partition id] as an s32 scalar of this device. */
static kiln_id lookup(part *p, const int64_t *vals) {
  bool same = true;
  for (int64_t k = 1; k < p->n; k++) same = same && vals[k] == vals[0];
  if (same) return kiln__b_iscalar(&p->b, KILN_S32, vals[0]);
  kiln_id table = kiln__b_const_ints(&p->b, KILN_S32, vals, (uint32_t)p->n);
  kiln_id at = pid(p);
  int64_t one = 1;
  kiln_id s = kiln__b_dyn_slice(&p->b, table, &at, 1, &one);
  return kiln__b_reshape(&p->b, s, NULL, 0);
}

static kiln_replica_groups *make_groups(part *p, const int64_t *v, int64_t ng, int64_t size) {
  kiln_arena *ma = p->m->arena;
  kiln_replica_groups *g = kiln_arena_calloc(ma, 1, sizeof *g);
  if (g == NULL || (g->groups = kiln_arena_calloc(ma, (size_t)ng, sizeof *g->groups)) == NULL)
    return NULL;
  g->ngroups = (uint32_t)ng;
  for (int64_t i = 0; i < ng; i++) {
    g->groups[i].v = kiln_arena_memdup(ma, v + i * size, (size_t)size * sizeof *v);
    if (g->groups[i].v == NULL) return NULL;
    g->groups[i].n = (uint32_t)size;
  }
  return g;
}

/* Sets channel_id, replica_groups (the groups of t along dims) and
 * use_global_device_ids on a collective. */
static bool set_collective(part *p, kiln_instr *ins, const spmd_tiling *t, const bool *dims) {
  int64_t *v, ng, size;
  if (ins == NULL || kiln__tiling_groups(p->a, t, dims, &v, &ng, &size)) return false;
  kiln_replica_groups *g = make_groups(p, v, ng, size);
  kiln_attr *at = g ? kiln_instr_add_attr(p->m, ins, KILN_ATTR_REPLICA_GROUPS) : NULL;
  if (at == NULL) return false;
  at->v.groups = g;
  return kiln_instr_set_attr_int(p->m, ins, KILN_ATTR_CHANNEL_ID, p->channel++) == 0 &&
         kiln_instr_set_attr_int(p->m, ins, KILN_ATTR_USE_GLOBAL_DEVICE_IDS, 1) == 0;
}

static kiln_id all_gather(part *p, kiln_id x, uint32_t d, const spmd_tiling *t) {
  if (!kiln__tx_ok(p->tx)) return KILN_NO_ID;
  const kiln_shape *s = kiln__b_shape(p->tx, x);
  int64_t dims[SPMD_MAX_RANK];
  for (uint32_t k = 0; k < s->rank; k++) dims[k] = s->dims[k];
  dims[d] *= t->tiles[d];
  kiln_shape out;
  if (kiln_shape_make_array(p->tx->scratch, &out, s->dtype, dims, s->rank)) {
    kiln__tx_oom(p->tx);
    return KILN_NO_ID;
  }
  kiln_instr *ins = kiln__b_make(&p->b, KILN_OP_ALL_GATHER, &out, &x, 1);
  bool only[SPMD_MAX_RANK] = {false};
  only[d] = true;
  int64_t dd = d;
  if (ins == NULL || !set_collective(p, ins, t, only) ||
      kiln_instr_set_attr_ints(p->m, ins, KILN_ATTR_DIMENSIONS, &dd, 1)) {
    kiln__tx_oom(p->tx);
    return KILN_NO_ID;
  }
  return ins->id;
}

/* All-reduce of x with reducer comp over the devices of t that differ along
 * dims. */
static kiln_id all_reduce(part *p, kiln_id x, uint32_t comp, const spmd_tiling *t,
                          const bool *dims) {
  if (!kiln__tx_ok(p->tx)) return KILN_NO_ID;
  kiln_instr *ins = kiln__b_make(&p->b, KILN_OP_ALL_REDUCE, kiln__b_shape(p->tx, x), &x, 1);
  if (ins == NULL || kiln_instr_set_called(p->m, ins, &comp, 1) ||
      !set_collective(p, ins, t, dims)) {
    kiln__tx_oom(p->tx);
    return KILN_NO_ID;
  }
  return ins->id;
}

/* x (this device's shard under t of an array of global dims gdims) with the
 * padding of dim d replaced by the scalar v. */
static kiln_id mask_dim(part *p, kiln_id x, const int64_t *gdims, const spmd_tiling *t, uint32_t d,
                        kiln_id v) {
  int64_t c = t->tiles[d], D = gdims[d];
  if (c <= 1 || D % c == 0 || !kiln__tx_ok(p->tx)) return x;
  const kiln_shape *s = kiln__b_shape(p->tx, x);
  int64_t sz = kiln__shard_size(D, c);
  int64_t *offs = kiln__b_i64s(p->tx, (uint32_t)p->n);
  if (offs == NULL) return KILN_NO_ID;
  for (int64_t k = 0; k < p->n; k++) offs[k] = kiln__tiling_coord(t, k, d) * sz;
  kiln_id idx = kiln__b_iota(&p->b, KILN_S32, s->dims, s->rank, d);
  kiln_id off = kiln__b_splat(&p->b, lookup(p, offs), kiln__b_shape(p->tx, idx));
  kiln_id lim = kiln__b_full(&p->b, KILN_S32, s->dims, s->rank, (double)D);
  kiln_id ok = kiln__b_cmp(&p->b, kiln__b_add(&p->b, idx, off), lim, KILN_CMP_LT);
  kiln_id fill = kiln__b_splat(&p->b, v, kiln__b_shape(p->tx, x));
  return kiln__b_select(&p->b, ok, x, fill);
}

/* ---- resharding ---------------------------------------------------------- */

/* Same tile counts, other devices: each tile's holders send it to the
 * devices that need it (collective-permute, pairs matched in order). */
static bool try_permute(part *p, kiln_id x, const spmd_tiling *from, const spmd_tiling *to,
                        kiln_id *out) {
  if (from->rep != to->rep) return false;
  for (uint32_t d = 0; d < from->rank; d++)
    if (from->tiles[d] != to->tiles[d]) return false;
  int64_t *pairs = kiln__b_i64s(p->tx, (uint32_t)(2 * p->n));
  if (pairs == NULL) return false;
  /* dev[] is row-major over [tiles..., rep]: the i-th holder of a tile in
   * from sends to its i-th holder in to. */
  for (int64_t i = 0; i < p->n; i++) {
    pairs[2 * i] = from->dev[i];
    pairs[2 * i + 1] = to->dev[i];
  }
  kiln_instr *ins = kiln__b_make(&p->b, KILN_OP_COLLECTIVE_PERMUTE, kiln__b_shape(p->tx, x), &x, 1);
  if (ins == NULL ||
      kiln_instr_set_attr_ints(p->m, ins, KILN_ATTR_SOURCE_TARGET_PAIRS, pairs,
                               (uint32_t)(2 * p->n)) ||
      kiln_instr_set_attr_int(p->m, ins, KILN_ATTR_CHANNEL_ID, p->channel++)) {
    kiln__tx_oom(p->tx);
    return false;
  }
  *out = ins->id;
  return true;
}

/* Dim a split t ways becomes whole while dim b becomes split t ways, the
 * device of a's tile i getting b's tile i: one all-to-all among the
 * devices that split a, then the received blocks (stacked along b) moved
 * over to a. Both dims must divide evenly. */
static bool try_all_to_all(part *p, kiln_id x, const kiln_shape *g, const spmd_tiling *from,
                           const spmd_tiling *to, kiln_id *out) {
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
  int64_t t = from->tiles[a];
  if (to->tiles[b] != t || g->dims[a] % t || g->dims[b] % t) return false;
  for (int64_t k = 0; k < p->n; k++) {
    if (kiln__tiling_coord(from, k, (uint32_t)a) != kiln__tiling_coord(to, k, (uint32_t)b))
      return false;
    for (uint32_t d = 0; d < g->rank; d++)
      if ((int)d != a && (int)d != b && from->tiles[d] > 1 &&
          kiln__tiling_coord(from, k, d) != kiln__tiling_coord(to, k, d))
        return false;
  }
  kiln_instr *ins = kiln__b_make(&p->b, KILN_OP_ALL_TO_ALL, kiln__b_shape(p->tx, x), &x, 1);
  bool only[SPMD_MAX_RANK] = {false};
  only[a] = true;
  int64_t bb = b;
  if (ins == NULL || !set_collective(p, ins, from, only) ||
      kiln_instr_set_attr_ints(p->m, ins, KILN_ATTR_DIMENSIONS, &bb, 1)) {
    kiln__tx_oom(p->tx);
    return false;
  }
  /* [.., A/t @a, .., B @b, ..]: split b into [t, B/t], move the t axis in
   * front of a, merge it with a. */
  const kiln_shape *ls = kiln__b_shape(p->tx, ins->id);
  uint32_t r = ls->rank;
  int64_t ex[SPMD_MAX_RANK + 1], perm[SPMD_MAX_RANK + 1], fin[SPMD_MAX_RANK];
  uint32_t ne = 0, axis[SPMD_MAX_RANK], taxis = 0;
  for (uint32_t d = 0; d < r; d++) {
    if ((int)d == b) {
      taxis = ne;
      ex[ne++] = t;
    }
    axis[d] = ne;
    ex[ne++] = (int)d == b ? ls->dims[d] / t : ls->dims[d];
  }
  uint32_t np = 0;
  for (uint32_t d = 0; d < r; d++) {
    if ((int)d == a) perm[np++] = taxis;
    perm[np++] = axis[d];
    fin[d] = (int)d == a ? ls->dims[d] * t : (int)d == b ? ls->dims[d] / t : ls->dims[d];
  }
  kiln_id y = kiln__b_reshape(&p->b, ins->id, ex, ne);
  y = kiln__b_transpose(&p->b, y, perm, ne);
  *out = kiln__b_reshape(&p->b, y, fin, r);
  return kiln__tx_ok(p->tx);
}

static kiln_id reshard(part *p, kiln_id x, const kiln_shape *g, const spmd_tiling *from,
                       const spmd_tiling *to) {
  if (!kiln__tx_ok(p->tx) || kiln__tiling_equal(from, to)) return x;
  kiln_id y;
  if (!kiln__tiling_covers(from, to) && !p->region_body &&
      (try_permute(p, x, from, to, &y) || try_all_to_all(p, x, g, from, to, &y)))
    return y;
  if (!kiln__tx_ok(p->tx)) return KILN_NO_ID;
  uint32_t r = g->rank;
  bool gather[SPMD_MAX_RANK];
  for (uint32_t d = 0; d < r; d++) {
    gather[d] = false;
    if (from->tiles[d] == 1) continue;
    if (to->tiles[d] != from->tiles[d]) {
      gather[d] = true;
      continue;
    }
    for (int64_t k = 0; k < p->n && !gather[d]; k++)
      gather[d] = kiln__tiling_coord(from, k, d) != kiln__tiling_coord(to, k, d);
  }
  for (uint32_t d = 0; d < r; d++) {
    if (!gather[d]) continue;
    x = all_gather(p, x, d, from);
    if (from->tiles[d] * kiln__shard_size(g->dims[d], from->tiles[d]) != g->dims[d])
      x = kiln__b_slice_dim(&p->b, x, d, 0, g->dims[d]);
  }
  /* Now dim d is whole unless it keeps from's split; slice out to's. */
  bool slice = false;
  int64_t lo[SPMD_MAX_RANK], hi[SPMD_MAX_RANK], in[SPMD_MAX_RANK], sizes[SPMD_MAX_RANK];
  bool cut[SPMD_MAX_RANK];
  for (uint32_t d = 0; d < r; d++) {
    cut[d] = to->tiles[d] > 1 && (gather[d] || from->tiles[d] == 1);
    int64_t sz = kiln__shard_size(g->dims[d], to->tiles[d]);
    lo[d] = in[d] = 0;
    hi[d] = cut[d] ? to->tiles[d] * sz - g->dims[d] : 0;
    sizes[d] = cut[d] ? sz : kiln__b_shape(p->tx, x)->dims[d];
    slice = slice || cut[d];
  }
  if (!slice || !kiln__tx_ok(p->tx)) return x;
  bool padded = false;
  for (uint32_t d = 0; d < r; d++) padded = padded || hi[d] > 0;
  if (padded) {
    kiln_id zero = kiln__b_scalar(&p->b, g->dtype, 0);
    x = kiln__b_pad(&p->b, x, zero, lo, hi, in);
  }
  kiln_id *idx = kiln__b_ids(p->tx, r ? r : 1);
  int64_t *offs = kiln__b_i64s(p->tx, (uint32_t)p->n);
  if (idx == NULL || offs == NULL) return KILN_NO_ID;
  for (uint32_t d = 0; d < r; d++) {
    for (int64_t k = 0; k < p->n; k++)
      offs[k] = cut[d] ? kiln__tiling_coord(to, k, d) * sizes[d] : 0;
    idx[d] = lookup(p, offs);
  }
  return kiln__b_dyn_slice(&p->b, x, idx, r, sizes);
}

/* The shard of old array instruction `old` in tiling `want`. */
static kiln_id local_as(part *p, kiln_id old, const spmd_tiling *want) {
  if (!kiln__tx_ok(p->tx)) return KILN_NO_ID;
  if (kiln__tiling_equal(p->lt[old], want)) return p->local[old];
  for (int i = 0; i < CACHE; i++)
    if (p->ctile[old][i] && kiln__tiling_equal(p->ctile[old][i], want)) return p->cached[old][i];
  kiln_id x = reshard(p, p->local[old], gshape(p, old), p->lt[old], want);
  for (int i = 0; i < CACHE; i++)
    if (p->ctile[old][i] == NULL) {
      p->ctile[old][i] = (spmd_tiling *)want;
      p->cached[old][i] = x;
      break;
    }
  return x;
}

static bool is_array(const kiln_shape *s) {
  return kiln_shape_is_array(s) && s->rank <= SPMD_MAX_RANK;
}

/* The whole value of old instruction `old` (any shape). */
static kiln_id whole(part *p, kiln_id old) {
  const kiln_shape *s = gshape(p, old);
  if (is_array(s)) return local_as(p, old, replicated(p, s->rank));
  if (!kiln_shape_is_tuple(s) || p->le[old] == NULL) return p->local[old];
  kiln_id *xs = kiln__b_ids(p->tx, s->rank ? s->rank : 1);
  if (xs == NULL) return KILN_NO_ID;
  bool any = false;
  for (uint32_t i = 0; i < s->rank; i++) {
    xs[i] = kiln__b_gte(&p->b, p->local[old], i);
    if (p->le[old][i] && !kiln__tiling_is_replicated(p->le[old][i])) {
      xs[i] = reshard(p, xs[i], &s->tuple[i], p->le[old][i], replicated(p, s->tuple[i].rank));
      any = true;
    }
  }
  return any ? kiln__b_tuple(&p->b, xs, s->rank) : p->local[old];
}

/* ---- halo exchange ------------------------------------------------------- */

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* A copy of x sent along split dim d of t by q tiles: device k receives the
 * x of the device holding the tile q before its own along d (the same
 * other coordinates and replica); a device with no such neighbour gets
 * zeros. */
static kiln_id shift_tiles(part *p, kiln_id x, const spmd_tiling *t, uint32_t d, int64_t q) {
  int64_t stride = t->rep;
  for (uint32_t e = t->rank; e-- > d + 1;) stride *= t->tiles[e];
  int64_t *pairs = kiln__b_i64s(p->tx, (uint32_t)(2 * p->n));
  if (pairs == NULL) return KILN_NO_ID;
  uint32_t np = 0;
  for (int64_t k = 0; k < p->n; k++) {
    int64_t c = kiln__tiling_coord(t, k, d);
    if (c + q < 0 || c + q >= t->tiles[d]) continue;
    pairs[np++] = t->dev[t->pos[k] + q * stride];
    pairs[np++] = k;
  }
  if (np == 0) return kiln__b_zeros_like(&p->b, x);
  kiln_instr *ins = kiln__b_make(&p->b, KILN_OP_COLLECTIVE_PERMUTE, kiln__b_shape(p->tx, x), &x, 1);
  if (ins == NULL ||
      kiln_instr_set_attr_ints(p->m, ins, KILN_ATTR_SOURCE_TARGET_PAIRS, pairs, np) ||
      kiln_instr_set_attr_int(p->m, ins, KILN_ATTR_CHANNEL_ID, p->channel++)) {
    kiln__tx_oom(p->tx);
    return KILN_NO_ID;
  }
  return ins->id;
}

/* The window [a[k], a[k] + len) (global indices along split dim d) of the
 * array of global size D along d whose shard under t is x, on every device
 * k at once: the parts held by neighbours come by collective-permute (only
 * the slices some device needs), are concatenated with the local shard,
 * and each device cuts its window out (dynamic-slice at an offset looked up
 * by partition-id). Elements outside [0, D) are `fill` (a scalar of x's
 * type; KILN_NO_ID: left as they come), and *valid (may be NULL) receives
 * the pred mask of those inside. KILN_NO_ID without an error when windows
 * would need more than `maxq` tiles, or more elements sent than an
 * all-gather of the dim: the caller gathers instead. */
/* Which tiles the windows [a[k], a[k] + len) of an array of global size D
 * split along d by t need (qmin..qmax relative to each device's own), and
 * the slice [first, s) of the first and [0, last) of the last that some
 * device needs. False when that spans more than maxq tiles or sends more
 * elements than an all-gather of the dim would. */
typedef struct halo_plan {
  int64_t s, qmin, qmax, first, last;
  bool edges; /* some window reaches outside [0, D) */
} halo_plan;

static bool halo_plan_n(int64_t n, int64_t D, const spmd_tiling *t, uint32_t d, const int64_t *a,
                        int64_t len, int64_t maxq, halo_plan *h) {
  int64_t c = t->tiles[d], s = kiln__shard_size(D, c);
  int64_t qmin = INT64_MAX, qmax = INT64_MIN, inside = 0;
  bool edges = false;
  for (int64_t k = 0; k < n; k++) {
    int64_t ck = kiln__tiling_coord(t, k, d), lo = a[k] > 0 ? a[k] : 0;
    int64_t hi = a[k] + len < D ? a[k] + len : D;
    edges = edges || a[k] < 0 || a[k] + len > D;
    if (lo >= hi) continue;
    inside++;
    int64_t q0 = floor_div(lo, s) - ck, q1 = floor_div(hi - 1, s) - ck;
    if (q0 < qmin) qmin = q0;
    if (q1 > qmax) qmax = q1;
  }
  if (inside == 0) return false; /* no device needs the array: nothing to exchange */
  if (maxq > 64) maxq = 64;      /* halo_window's blocks[] */
  if (qmax - qmin + 1 > maxq) return false;
  int64_t first = s, last = 0;
  for (int64_t k = 0; k < n; k++) {
    int64_t ck = kiln__tiling_coord(t, k, d), lo = a[k] > 0 ? a[k] : 0;
    int64_t hi = a[k] + len < D ? a[k] + len : D;
    if (lo >= hi) continue;
    if (lo - (ck + qmin) * s < first) first = lo - (ck + qmin) * s;
    if (hi - (ck + qmax) * s > last) last = hi - (ck + qmax) * s;
  }
  int64_t sent = 0;
  for (int64_t q = qmin; q <= qmax; q++)
    if (q != 0) sent += (q == qmax ? last : s) - (q == qmin ? first : 0);
  if (sent > (c - 1) * s) return false;
  *h = (halo_plan){s, qmin, qmax, first, last, edges};
  return true;
}

static bool halo_plan_make(const part *p, int64_t D, const spmd_tiling *t, uint32_t d,
                           const int64_t *a, int64_t len, int64_t maxq, halo_plan *h) {
  return halo_plan_n(p->n, D, t, d, a, len, maxq, h);
}

/* Whether shift_tiles along d of t by q sends anything (some device has a
 * neighbour q tiles away). */
static bool shift_sends(const spmd_tiling *t, uint32_t d, int64_t q) {
  return q != 0 && (q > 0 ? q : -q) < t->tiles[d];
}

/* What halo_window sends for plan h of x, whose local shape is ls (dim d
 * its shard), into *sent: one collective-permute per neighbouring tile
 * that some device needs, of the slice of x it needs. */
static void halo_sent(const halo_plan *h, const spmd_tiling *t, uint32_t d, const int64_t *ls,
                      uint32_t rank, int64_t esize, kiln_spmd_stats *sent) {
  int64_t other = esize;
  for (uint32_t e = 0; e < rank; e++)
    if (e != d) other *= ls[e];
  for (int64_t q = h->qmin; q <= h->qmax; q++) {
    if (!shift_sends(t, d, q)) continue;
    int64_t b0 = q == h->qmin ? h->first : 0, b1 = q == h->qmax ? h->last : h->s;
    sent->count[KILN_SPMD_COLLECTIVE_PERMUTE]++;
    sent->bytes[KILN_SPMD_COLLECTIVE_PERMUTE] += (b1 - b0) * other;
  }
}

static kiln_id halo_window(part *p, kiln_id x, int64_t D, const spmd_tiling *t, uint32_t d,
                           const int64_t *a, int64_t len, kiln_id fill, int64_t maxq,
                           kiln_id *valid) {
  if (valid) *valid = KILN_NO_ID;
  if (!kiln__tx_ok(p->tx)) return KILN_NO_ID;
  halo_plan h;
  if (!halo_plan_make(p, D, t, d, a, len, maxq, &h)) return KILN_NO_ID;
  int64_t s = h.s, qmin = h.qmin, qmax = h.qmax, first = h.first, last = h.last;
  bool edges = h.edges;
  kiln_id blocks[64];
  uint32_t nb = 0;
  for (int64_t q = qmin; q <= qmax; q++) {
    int64_t b0 = q == qmin ? first : 0, b1 = q == qmax ? last : s;
    kiln_id piece = b0 == 0 && b1 == s ? x : kiln__b_slice_dim(&p->b, x, d, b0, b1);
    blocks[nb++] = q == 0 ? piece : shift_tiles(p, piece, t, d, q);
  }
  kiln_id w = nb == 1 ? blocks[0] : kiln__b_concat(&p->b, blocks, nb, d);
  if (!kiln__tx_ok(p->tx)) return KILN_NO_ID;
  /* w holds global [(ck + qmin) * s + first, ...); pad so every window
   * fits (the pad is outside [0, D) and masked below). */
  int64_t wlen = kiln__b_shape(p->tx, w)->dims[d], padlo = 0, padhi = 0;
  for (int64_t k = 0; k < p->n; k++) {
    int64_t start = (kiln__tiling_coord(t, k, d) + qmin) * s + first;
    if (a[k] + len <= 0 || a[k] >= D) continue; /* all outside: masked whatever it gets */
    if (start - a[k] > padlo) padlo = start - a[k];
    if (a[k] + len - (start + wlen) > padhi) padhi = a[k] + len - (start + wlen);
  }
  const kiln_shape *ws = kiln__b_shape(p->tx, w);
  uint32_t r = ws->rank;
  if (padlo || padhi) {
    int64_t lo[SPMD_MAX_RANK] = {0}, hi[SPMD_MAX_RANK] = {0}, in[SPMD_MAX_RANK] = {0};
    lo[d] = padlo, hi[d] = padhi;
    w = kiln__b_pad(&p->b, w, kiln__b_scalar(&p->b, ws->dtype, 0), lo, hi, in);
    wlen += padlo + padhi;
  }
  int64_t *offs = kiln__b_i64s(p->tx, (uint32_t)p->n);
  int64_t *starts = kiln__b_i64s(p->tx, (uint32_t)p->n);
  kiln_id *idx = kiln__b_ids(p->tx, r);
  if (offs == NULL || starts == NULL || idx == NULL) return KILN_NO_ID;
  for (int64_t k = 0; k < p->n; k++) {
    int64_t start = (kiln__tiling_coord(t, k, d) + qmin) * s + first - padlo;
    offs[k] = a[k] - start;
    if (offs[k] < 0) offs[k] = 0;
    if (offs[k] > wlen - len) offs[k] = wlen - len;
    starts[k] = a[k];
  }
  int64_t sizes[SPMD_MAX_RANK];
  const kiln_shape *ps = kiln__b_shape(p->tx, w);
  for (uint32_t e = 0; e < r; e++) {
    sizes[e] = e == d ? len : ps->dims[e];
    idx[e] = e == d ? lookup(p, offs) : kiln__b_iscalar(&p->b, KILN_S32, 0);
  }
  kiln_id y = wlen == len ? w : kiln__b_dyn_slice(&p->b, w, idx, r, sizes);
  if (!edges || (fill == KILN_NO_ID && valid == NULL)) return y;
  /* inside: 0 <= a[k] + i < D */
  const kiln_shape *ys = kiln__b_shape(p->tx, y);
  kiln_id g = kiln__b_iota(&p->b, KILN_S32, ys->dims, ys->rank, d);
  kiln_id at = kiln__b_splat(&p->b, lookup(p, starts), kiln__b_shape(p->tx, g));
  g = kiln__b_add(&p->b, g, at);
  kiln_id ok = kiln__b_bin(
      &p->b, KILN_OP_AND,
      kiln__b_cmp(&p->b, g, kiln__b_full(&p->b, KILN_S32, ys->dims, ys->rank, 0), KILN_CMP_GE),
      kiln__b_cmp(&p->b, g, kiln__b_full(&p->b, KILN_S32, ys->dims, ys->rank, (double)D),
                  KILN_CMP_LT));
  if (valid) *valid = ok;
  if (fill == KILN_NO_ID) return y;
  return kiln__b_select(&p->b, ok, y, kiln__b_splat(&p->b, fill, kiln__b_shape(p->tx, y)));
}

/* ---- rules --------------------------------------------------------------- */

/* Computed whole on every device. */
static int rule_whole(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                      spmd_tiling **got) {
  (void)want;
  kiln_id *ops = kiln__b_ids(p->tx, ins->noperands ? ins->noperands : 1);
  if (ops == NULL) return p->tx->err;
  for (uint32_t k = 0; k < ins->noperands; k++) ops[k] = whole(p, ins->operands[k]);
  *out = kiln__b_clone_same(&p->b, ins, ops, ins->noperands);
  if (*out != KILN_NO_ID) kiln__b_drop_attr(kiln__b_ins(p->tx, *out), KILN_ATTR_SHARDING);
  *got = is_array(&ins->shape) ? replicated(p, ins->shape.rank) : NULL;
  return p->tx->err;
}

static int rule_parameter(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                          spmd_tiling **got) {
  if (!is_array(&ins->shape)) {
    const kiln_attr *sa = kiln_instr_attr(ins, KILN_ATTR_SHARDING);
    const kiln_sharding *s = sa ? sa->v.sharding : NULL;
    for (uint32_t i = 0; s && s->kind == KILN_SHARD_TUPLE && i < s->nelems; i++)
      if (s->elems[i].kind == KILN_SHARD_TILED)
        return fail(p, ins, KILN_EUNIMPL, "a tuple parameter split across devices");
    return rule_whole(p, ins, want, out, got);
  }
  int64_t dims[SPMD_MAX_RANK];
  for (uint32_t d = 0; d < ins->shape.rank; d++)
    dims[d] = kiln__shard_size(ins->shape.dims[d], want->tiles[d]);
  kiln_shape s;
  if (kiln_shape_make_array(p->tx->scratch, &s, ins->shape.dtype, dims, ins->shape.rank))
    return kiln__tx_oom(p->tx);
  *out = kiln__b_param(&p->b, ins->param_number, &s, ins->name);
  *got = (spmd_tiling *)want;
  return p->tx->err;
}

static int rule_elementwise(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                            spmd_tiling **got) {
  kiln_id ops[8];
  if (ins->noperands > 8 || !is_array(&ins->shape)) return rule_whole(p, ins, want, out, got);
  for (uint32_t k = 0; k < ins->noperands; k++) {
    kiln_id o = ins->operands[k];
    if (!is_array(gshape(p, o))) return rule_whole(p, ins, want, out, got);
    bool same = kiln_shape_same_dims(gshape(p, o), &ins->shape);
    ops[k] = local_as(p, o, same ? want : replicated(p, gshape(p, o)->rank));
  }
  *out = kiln__b_clone(&p->b, ins, ops, ins->noperands);
  *got = (spmd_tiling *)want;
  return p->tx->err;
}

static int rule_annotation(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                           spmd_tiling **got) {
  if (ins->noperands != 1 || !is_array(&ins->shape) ||
      !kiln_custom_call_is_annotation(kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET)) ||
      !kiln_shape_same_dims(gshape(p, ins->operands[0]), &ins->shape))
    return rule_whole(p, ins, want, out, got);
  *out = local_as(p, ins->operands[0], want);
  *got = (spmd_tiling *)want;
  return p->tx->err;
}

/* The operands in the tilings kiln__spmd_bwd gives (arrays of other ranks,
 * scalars: replicated); false when an operand has no rule. */
static bool operands_as_needed(part *p, const kiln_instr *ins, const spmd_tiling *want,
                               kiln_id *ops, spmd_tiling **need) {
  for (uint32_t k = 0; k < ins->noperands; k++) {
    kiln_id o = ins->operands[k];
    if (!is_array(gshape(p, o))) return false;
    need[k] = gshape(p, o)->rank == ins->shape.rank || k == 0
                  ? kiln__spmd_bwd(p->a, p->m, ins, k, want)
                  : replicated(p, gshape(p, o)->rank);
    if (need[k] == NULL) return false;
    ops[k] = local_as(p, o, need[k]);
  }
  return true;
}

/* Local shard dims of an array of global shape g under t. */
static void shard_dims(const kiln_shape *g, const spmd_tiling *t, int64_t *dims) {
  for (uint32_t d = 0; d < g->rank; d++) dims[d] = kiln__shard_size(g->dims[d], t->tiles[d]);
}

/* Most tiles one device's window may span (halo_window also refuses
 * windows that move more than an all-gather would). */
static int64_t halo_max(const spmd_tiling *t, uint32_t d) { return t->tiles[d] + 1; }

/* Whether movement_halo builds ins (pad, slice (stride 1) or concatenate
 * with the result split along a dim they move) under `want` on n devices:
 * every window within reach of the neighbours. The collective-permutes it
 * sends then go into *sent (may be NULL; the cost model's count). a: n
 * entries of scratch. */
static bool movement_halo_check(const kiln_module *m, const kiln_instr *ins,
                                const spmd_tiling *want, int64_t n, int64_t *a,
                                kiln_spmd_stats *sent) {
  if (ins->op != KILN_OP_PAD && ins->op != KILN_OP_SLICE && ins->op != KILN_OP_CONCATENATE)
    return false;
  uint32_t r = ins->shape.rank;
  const kiln_i64s *cfg =
      kiln_instr_attr_ints(ins, ins->op == KILN_OP_PAD ? KILN_ATTR_PADDING : KILN_ATTR_SLICE);
  const kiln_i64s *cd = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  const kiln_shape *in = &m->instrs[ins->operands[0]]->shape;
  bool any = false;
  for (uint32_t d = 0; d < r; d++) {
    if (want->tiles[d] <= 1) continue;
    if (ins->op == KILN_OP_CONCATENATE) {
      if (cd == NULL || cd->n != 1) return false;
      any = any || cd->v[0] == (int64_t)d;
      continue;
    }
    if (cfg == NULL || cfg->n != 3 * r || in->rank != r) return false;
    const int64_t *v = cfg->v + 3 * d;
    if (ins->op == KILN_OP_PAD) {
      if (v[2] != 0) return false; /* interior padding: gathered */
      any = any || v[0] || v[1];
    } else {
      if (v[2] != 1) return false;
      any = any || v[0] != 0 || v[1] != in->dims[d];
    }
  }
  if (!any || ins->noperands > 64 || r > SPMD_MAX_RANK) return false;
  halo_plan h;
  int64_t ls[SPMD_MAX_RANK];
  kiln_spmd_stats none;
  if (sent == NULL) sent = &none;
  if (ins->op == KILN_OP_CONCATENATE) {
    uint32_t d = (uint32_t)cd->v[0];
    int64_t so = kiln__shard_size(ins->shape.dims[d], want->tiles[d]), off = 0;
    for (uint32_t i = 0; i < ins->noperands; i++) {
      const kiln_shape *gs = &m->instrs[ins->operands[i]]->shape;
      if (!is_array(gs) || gs->rank != r) return false;
      for (int64_t k = 0; k < n; k++) a[k] = kiln__tiling_coord(want, k, d) * so - off;
      if (!halo_plan_n(n, gs->dims[d], want, d, a, so, halo_max(want, d), &h)) return false;
      for (uint32_t e = 0; e < r; e++) ls[e] = kiln__shard_size(gs->dims[e], want->tiles[e]);
      halo_sent(&h, want, d, ls, r, (int64_t)kiln_dtype_size(gs->dtype), sent);
      off += gs->dims[d];
    }
    return true;
  }
  /* pad, slice: each split moved dim by its window, in order, the local
   * array taking the result's shard size along it */
  for (uint32_t e = 0; e < r; e++) ls[e] = kiln__shard_size(in->dims[e], want->tiles[e]);
  for (uint32_t d = 0; d < r; d++) {
    const int64_t *vd = cfg->v + 3 * d;
    if (want->tiles[d] <= 1) continue;
    bool moved = ins->op == KILN_OP_PAD ? (vd[0] || vd[1]) : (vd[0] != 0 || vd[1] != in->dims[d]);
    if (!moved) continue;
    int64_t so = kiln__shard_size(ins->shape.dims[d], want->tiles[d]);
    int64_t shift = ins->op == KILN_OP_PAD ? -vd[0] : vd[0];
    for (int64_t k = 0; k < n; k++) a[k] = kiln__tiling_coord(want, k, d) * so + shift;
    if (!halo_plan_n(n, in->dims[d], want, d, a, so, halo_max(want, d), &h)) return false;
    halo_sent(&h, want, d, ls, r, (int64_t)kiln_dtype_size(in->dtype), sent);
    ls[d] = so;
  }
  return true;
}

bool kiln__movement_halo_sent(kiln_arena *ar, const kiln_module *m, const kiln_instr *ins,
                              const spmd_tiling *want, int64_t n, kiln_spmd_stats *sent) {
  memset(sent, 0, sizeof *sent);
  int64_t *a = kiln_arena_alloc(ar, (size_t)(n ? n : 1) * sizeof *a);
  return a != NULL && is_array(&ins->shape) && ins->noperands > 0 &&
         movement_halo_check(m, ins, want, n, a, sent);
}

/* pad, slice (stride 1) and concatenate with the result split along a dim
 * they move: each device builds its result shard from the window of the
 * operand it covers (halo_window), instead of gathering the dim. Returns
 * false (nothing built) when the op or the split is not of that kind
 * (movement_halo_check). */
static bool movement_halo(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                          int *err) {
  *err = 0;
  int64_t *a = kiln__b_i64s(p->tx, (uint32_t)p->n);
  if (a == NULL) return *err = p->tx->err, true;
  if (!movement_halo_check(p->m, ins, want, p->n, a, NULL)) return false;
  uint32_t r = ins->shape.rank;
  const kiln_i64s *cfg =
      kiln_instr_attr_ints(ins, ins->op == KILN_OP_PAD ? KILN_ATTR_PADDING : KILN_ATTR_SLICE);
  const kiln_i64s *cd = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  kiln_id y = KILN_NO_ID;
  if (ins->op == KILN_OP_CONCATENATE) {
    uint32_t d = (uint32_t)cd->v[0];
    int64_t so = kiln__shard_size(ins->shape.dims[d], want->tiles[d]), off = 0;
    for (uint32_t i = 0; i < ins->noperands; i++) {
      kiln_id o = ins->operands[i];
      const kiln_shape *gs = gshape(p, o);
      for (int64_t k = 0; k < p->n; k++) a[k] = kiln__tiling_coord(want, k, d) * so - off;
      kiln_id valid, w = halo_window(p, local_as(p, o, want), gs->dims[d], want, d, a, so,
                                     KILN_NO_ID, halo_max(want, d), &valid);
      if (w == KILN_NO_ID) {
        *err = p->tx->err;
        return p->tx->err != 0; /* too far: the caller gathers */
      }
      /* no mask: this operand covers every device's window whole */
      y = y == KILN_NO_ID || valid == KILN_NO_ID ? w : kiln__b_select(&p->b, valid, w, y);
      off += gs->dims[d];
    }
    *out = y;
    *err = p->tx->err;
    return true;
  }
  /* pad, slice: split moved dims by window, the others by the local op */
  const kiln_shape *in = gshape(p, ins->operands[0]);
  kiln_id x = local_as(p, ins->operands[0], want);
  kiln_id fill = ins->op == KILN_OP_PAD ? whole(p, ins->operands[1]) : KILN_NO_ID;
  int64_t v[3 * SPMD_MAX_RANK];
  memcpy(v, cfg->v, cfg->n * sizeof *v);
  const kiln_shape *ls = kiln__b_shape(p->tx, x);
  for (uint32_t d = 0; d < r && kiln__tx_ok(p->tx); d++) {
    int64_t *vd = v + 3 * d;
    if (want->tiles[d] <= 1) continue; /* whole: the local op as written */
    bool moved = ins->op == KILN_OP_PAD ? (vd[0] || vd[1]) : (vd[0] != 0 || vd[1] != in->dims[d]);
    int64_t so = kiln__shard_size(ins->shape.dims[d], want->tiles[d]);
    if (moved) {
      int64_t shift = ins->op == KILN_OP_PAD ? -vd[0] : vd[0];
      for (int64_t k = 0; k < p->n; k++) a[k] = kiln__tiling_coord(want, k, d) * so + shift;
      kiln_id w = halo_window(p, x, in->dims[d], want, d, a, so, fill, halo_max(want, d), NULL);
      if (w == KILN_NO_ID) {
        *err = p->tx->err;
        return p->tx->err != 0;
      }
      x = w;
    }
    ls = kiln__b_shape(p->tx, x);
    if (ins->op == KILN_OP_PAD)
      vd[0] = vd[1] = 0;
    else
      vd[0] = 0, vd[1] = ls->dims[d];
  }
  if (!kiln__tx_ok(p->tx)) return *err = p->tx->err, true;
  bool local = false;
  for (uint32_t d = 0; d < r; d++)
    local = local || (ins->op == KILN_OP_PAD
                          ? (v[3 * d] || v[3 * d + 1] || v[3 * d + 2])
                          : (v[3 * d] != 0 || v[3 * d + 1] != kiln__b_shape(p->tx, x)->dims[d] ||
                             v[3 * d + 2] != 1));
  if (local) {
    kiln_id ops[2] = {x, fill};
    kiln_instr *c = kiln__b_clone_start(&p->b, ins, ops, ins->op == KILN_OP_PAD ? 2 : 1);
    if (c == NULL ||
        kiln_instr_set_attr_ints(
            p->m, c, ins->op == KILN_OP_PAD ? KILN_ATTR_PADDING : KILN_ATTR_SLICE, v, 3 * r)) {
      *err = kiln__tx_oom(p->tx);
      return true;
    }
    x = kiln__b_finish(&p->b, c);
  }
  *out = x;
  *err = p->tx->err;
  return true;
}

/* reduce-window (one operand) with the result split along windowed dims:
 * each device reduces the window of the operand its result shard covers
 * (the halo comes from its neighbours, the array's edge is the init
 * value), so the window's padding along those dims becomes 0. Windows
 * along dims split trivially (size 1, stride 1, no padding) need nothing.
 * Base dilation, or a halo past the neighbours: computed whole. */
static int rule_reduce_window(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                              spmd_tiling **got) {
  const kiln_attr *wa = kiln_instr_attr(ins, KILN_ATTR_WINDOW);
  const kiln_window *win = wa ? wa->v.window : NULL;
  uint32_t r = ins->shape.rank;
  if (ins->noperands != 2 || !is_array(&ins->shape) || win == NULL || win->rank != r ||
      !is_array(gshape(p, ins->operands[0])) || gshape(p, ins->operands[0])->rank != r)
    return rule_whole(p, ins, want, out, got);
  for (uint32_t d = 0; d < r; d++)
    if (want->tiles[d] > 1 && win->dims[d].lhs_dilate != 1)
      return rule_whole(p, ins, want, out, got);
  const kiln_shape *in = gshape(p, ins->operands[0]);
  int64_t *a = kiln__b_i64s(p->tx, (uint32_t)p->n);
  if (a == NULL) return kiln__tx_oom(p->tx);
  for (uint32_t d = 0; d < r; d++) { /* every window first: nothing dead */
    const kiln_window_dim *w = &win->dims[d];
    if (want->tiles[d] <= 1) continue;
    int64_t so = kiln__shard_size(ins->shape.dims[d], want->tiles[d]);
    int64_t span = (w->size - 1) * w->rhs_dilate + 1;
    halo_plan h;
    for (int64_t k = 0; k < p->n; k++)
      a[k] = kiln__tiling_coord(want, k, d) * so * w->stride - w->pad_lo;
    if (!halo_plan_make(p, in->dims[d], want, d, a, (so - 1) * w->stride + span, halo_max(want, d),
                        &h))
      return rule_whole(p, ins, want, out, got);
  }
  kiln_id x = local_as(p, ins->operands[0], want);
  kiln_id init = whole(p, ins->operands[1]);
  kiln_window *nw = kiln_arena_alloc(p->m->arena, sizeof *nw);
  kiln_window_dim *nd = nw ? kiln_arena_calloc(p->m->arena, r ? r : 1, sizeof *nd) : NULL;
  if (nd == NULL) return kiln__tx_oom(p->tx);
  nw->rank = r;
  nw->dims = nd;
  memcpy(nd, win->dims, r * sizeof *nd);
  for (uint32_t d = 0; d < r && kiln__tx_ok(p->tx); d++) {
    kiln_window_dim *w = &nd[d];
    if (want->tiles[d] <= 1) continue;
    if (w->size == 1 && w->stride == 1 && w->pad_lo == 0 && w->pad_hi == 0 &&
        in->dims[d] == ins->shape.dims[d])
      continue;
    int64_t so = kiln__shard_size(ins->shape.dims[d], want->tiles[d]);
    int64_t span = (w->size - 1) * w->rhs_dilate + 1;
    for (int64_t k = 0; k < p->n; k++)
      a[k] = kiln__tiling_coord(want, k, d) * so * w->stride - w->pad_lo;
    kiln_id y = halo_window(p, x, in->dims[d], want, d, a, (so - 1) * w->stride + span, init,
                            halo_max(want, d), NULL);
    if (y == KILN_NO_ID) {
      if (p->tx->err) return p->tx->err;
      return rule_whole(p, ins, want, out, got);
    }
    x = y;
    w->pad_lo = w->pad_hi = 0;
  }
  kiln_id ops[2] = {x, init};
  kiln_instr *c = kiln__b_clone_start(&p->b, ins, ops, 2);
  kiln_attr *na = c ? kiln_instr_add_attr(p->m, c, KILN_ATTR_WINDOW) : NULL;
  if (na == NULL) return p->tx->err ? p->tx->err : kiln__tx_oom(p->tx);
  na->v.window = nw;
  *out = kiln__b_finish(&p->b, c);
  *got = (spmd_tiling *)want;
  return p->tx->err;
}

/* broadcast, transpose, reshape, slice, pad, reverse, concatenate: the ops
 * whose result dims follow operand dims (dims.c). */
static int rule_movement(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                         spmd_tiling **got) {
  kiln_id ops[64];
  spmd_tiling *need[64];
  if (ins->noperands > 64 || ins->noperands == 0 || !is_array(&ins->shape))
    return rule_whole(p, ins, want, out, got);
  int herr;
  if (movement_halo(p, ins, want, out, &herr)) {
    *got = (spmd_tiling *)want;
    return herr;
  }
  /* What the result can be from the first operand's needed tiling. */
  spmd_tiling *n0 = kiln__spmd_bwd(p->a, p->m, ins, 0, want);
  spmd_tiling *g0 = n0 ? kiln__spmd_fwd(p->a, p->m, ins, 0, n0) : NULL;
  if (g0 == NULL) return rule_whole(p, ins, want, out, got);
  if (!operands_as_needed(p, ins, g0, ops, need)) return rule_whole(p, ins, want, out, got);
  int64_t dims[SPMD_MAX_RANK];
  shard_dims(&ins->shape, g0, dims);
  const kiln_shape *ls = kiln__b_shape(p->tx, ops[0]);
  switch (ins->op) {
  case KILN_OP_BROADCAST: {
    const kiln_i64s *map = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
    *out = kiln__b_broadcast(&p->b, ops[0], dims, ins->shape.rank, map ? map->v : NULL,
                             map ? map->n : 0);
    break;
  }
  case KILN_OP_RESHAPE: {
    int64_t a = 1, b = 1;
    for (uint32_t d = 0; d < ls->rank; d++) a *= ls->dims[d];
    for (uint32_t d = 0; d < ins->shape.rank; d++) b *= dims[d];
    if (a != b) return rule_whole(p, ins, want, out, got);
    *out = kiln__b_reshape(&p->b, ops[0], dims, ins->shape.rank);
    break;
  }
  case KILN_OP_SLICE: {
    kiln_instr *c = kiln__b_clone_start(&p->b, ins, ops, ins->noperands);
    const kiln_i64s *sl = c ? kiln_instr_attr_ints(c, KILN_ATTR_SLICE) : NULL;
    if (sl == NULL) return p->tx->err ? p->tx->err : fail(p, ins, KILN_EINTERNAL, "slice");
    int64_t v[3 * SPMD_MAX_RANK];
    memcpy(v, sl->v, sl->n * sizeof *v);
    for (uint32_t d = 0; d < ins->shape.rank; d++)
      if (g0->tiles[d] > 1) v[3 * d + 1] = ls->dims[d];
    if (kiln_instr_set_attr_ints(p->m, c, KILN_ATTR_SLICE, v, sl->n)) return kiln__tx_oom(p->tx);
    *out = kiln__b_finish(&p->b, c);
    break;
  }
  default: *out = kiln__b_clone(&p->b, ins, ops, ins->noperands); break;
  }
  *got = g0;
  return p->tx->err;
}

/* Whether reduce ins may be split into partial reductions combined by an
 * all-reduce with its reducer: the reducer is add, multiply, maximum,
 * minimum, and or or of its two parameters and the init is a constant of
 * that op's identity (each partial includes the init once). */
bool kiln__reduce_splittable(const kiln_module *m, const kiln_instr *ins) {
  const kiln_instr *init = m->instrs[ins->operands[1]];
  const kiln_computation *c = m->comps[ins->called[0]];
  if (init->op != KILN_OP_CONSTANT || init->literal == NULL || c->root == KILN_NO_ID ||
      !kiln_shape_is_scalar(&init->shape))
    return false;
  const kiln_instr *r = m->instrs[c->root];
  if (r->noperands != 2 || m->instrs[r->operands[0]]->op != KILN_OP_PARAMETER ||
      m->instrs[r->operands[1]]->op != KILN_OP_PARAMETER || r->operands[0] == r->operands[1])
    return false;
  kiln_dtype t = init->shape.dtype;
  double v = kiln_literal_get_f64(init->literal, 0);
  int bits = kiln_dtype_bits(t);
  double lo = kiln_dtype_is_float(t)        ? -INFINITY
              : kiln_dtype_is_signed_int(t) ? -ldexp(1, bits - 1)
                                            : 0,
         hi = kiln_dtype_is_float(t) ? INFINITY
                                     : ldexp(1, bits - !kiln_dtype_is_unsigned_int(t)) - 1;
  switch (r->op) {
  case KILN_OP_ADD: return v == 0;
  case KILN_OP_MULTIPLY: return v == 1;
  case KILN_OP_MAXIMUM: return v == lo || (t == KILN_PRED && v == 0);
  case KILN_OP_MINIMUM: return v == hi || (t == KILN_PRED && v == 1);
  case KILN_OP_AND: return t == KILN_PRED ? v == 1 : false;
  case KILN_OP_OR: return v == 0;
  default: return false;
  }
}

static int rule_reduce(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                       spmd_tiling **got) {
  if (ins->noperands != 2 || !is_array(&ins->shape) || ins->ncalled != 1)
    return rule_whole(p, ins, want, out, got);
  kiln_id x = ins->operands[0];
  const kiln_shape *xs = gshape(p, x);
  const kiln_i64s *ds = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  /* Keep the operand's split (partial results, all-reduced) or reshard the
   * operand so that no reduced dim is split: whichever moves less. */
  spmd_tiling *keep = p->lt[x];
  spmd_tiling *res = kiln__spmd_fwd(p->a, p->m, ins, 0, keep);
  spmd_tiling *alt = kiln__spmd_bwd(p->a, p->m, ins, 0, want);
  if (res == NULL || alt == NULL) return rule_whole(p, ins, want, out, got);
  bool red[SPMD_MAX_RANK] = {false}, split = false;
  for (uint32_t i = 0; i < ds->n; i++) {
    red[ds->v[i]] = true;
    split = split || keep->tiles[ds->v[i]] > 1;
  }
  int64_t ob = kiln_shape_bytes(&ins->shape), xb = kiln_shape_bytes(xs);
  int64_t cost_keep =
      (split ? 2 * ob / kiln__tiling_count(res) : 0) + kiln__reshard_cost(res, want, ob);
  int64_t cost_alt = kiln__reshard_cost(keep, alt, xb);
  spmd_tiling *tx =
      cost_keep <= cost_alt && (!split || kiln__reduce_splittable(p->m, ins)) ? keep : alt;
  if (tx == alt) {
    res = kiln__spmd_fwd(p->a, p->m, ins, 0, alt);
    split = false;
    if (res == NULL) return rule_whole(p, ins, want, out, got);
  }
  kiln_id lx = local_as(p, x, tx);
  kiln_id init = local_as(p, ins->operands[1], replicated(p, 0));
  for (uint32_t d = 0; d < xs->rank; d++)
    if (red[d]) lx = mask_dim(p, lx, xs->dims, tx, d, init);
  kiln_id ops[2] = {lx, init};
  kiln_id r = kiln__b_clone(&p->b, ins, ops, 2);
  if (split) {
    r = all_reduce(p, r, ins->called[0], tx, red);
    p->ar = r;
    p->ar_tiling = tx;
    memcpy(p->ar_dims, red, sizeof red);
  }
  *out = r;
  *got = res;
  return p->tx->err;
}

/* A convolution whose result is split along spatial dims (and perhaps its
 * batch, never its features): the input split the same way, each device
 * convolving the window of the input its result shard covers (halos from
 * its neighbours, zeros past the edges), the kernel whole. False (nothing
 * built) when the convolution is not of that kind or a window would reach
 * past the neighbours. */
static bool conv_halo(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                      int *err) {
  *err = 0;
  spmd_loop loops[SPMD_MAX_RANK * 2];
  uint32_t nl;
  const kiln_attr *wa = kiln_instr_attr(ins, KILN_ATTR_WINDOW);
  const kiln_window *win = wa ? wa->v.window : NULL;
  if (ins->op != KILN_OP_CONVOLUTION || win == NULL || !is_array(&ins->shape) ||
      !kiln__contraction_loops(p->m, ins, loops, &nl) || nl > SPMD_MAX_RANK)
    return false;
  kiln_id l = ins->operands[0];
  const kiln_shape *ls = gshape(p, l);
  int64_t lmap[SPMD_MAX_RANK];
  for (uint32_t d = 0; d < ls->rank; d++) lmap[d] = -1;
  bool spatial = false;
  uint32_t k = 0; /* window dim of the next spatial loop */
  for (uint32_t j = 0; j < nl; j++) {
    const spmd_loop *lp = &loops[j];
    bool split = lp->o >= 0 && want->tiles[lp->o] > 1;
    if (lp->fixed) {
      if (k >= win->rank) return false;
      if (split && win->dims[k].lhs_dilate != 1) return false;
      k++;
    }
    if (split && lp->l < 0) return false; /* output features: the kernel's split */
    if (split) lmap[lp->l] = lp->o;
    spatial = spatial || (split && lp->fixed);
  }
  if (!spatial) return false;
  spmd_tiling *tl = kiln__tiling_derive(p->a, want, lmap, ls->rank);
  int64_t *a = kiln__b_i64s(p->tx, (uint32_t)p->n);
  if (tl == NULL || a == NULL) return *err = kiln__tx_oom(p->tx), true;
  /* every window first: nothing dead */
  for (int pass = 0; pass < 2; pass++) {
    kiln_id x = pass ? local_as(p, l, tl) : KILN_NO_ID;
    kiln_window *nw = NULL;
    if (pass) {
      nw = kiln_arena_alloc(p->m->arena, sizeof *nw);
      kiln_window_dim *nd = nw ? kiln_arena_calloc(p->m->arena, win->rank, sizeof *nd) : NULL;
      if (nd == NULL) return *err = kiln__tx_oom(p->tx), true;
      memcpy(nd, win->dims, win->rank * sizeof *nd);
      nw->rank = win->rank;
      nw->dims = nd;
    }
    kiln_id zero = pass ? kiln__b_scalar(&p->b, ls->dtype, 0) : KILN_NO_ID;
    k = 0;
    for (uint32_t j = 0; j < nl; j++) {
      const spmd_loop *lp = &loops[j];
      if (!lp->fixed) continue;
      const kiln_window_dim *w = &win->dims[k++];
      if (want->tiles[lp->o] <= 1) continue;
      uint32_t dl = (uint32_t)lp->l;
      int64_t so = kiln__shard_size(ins->shape.dims[lp->o], want->tiles[lp->o]);
      int64_t span = (w->size - 1) * w->rhs_dilate + 1, len = (so - 1) * w->stride + span;
      for (int64_t q = 0; q < p->n; q++)
        a[q] = kiln__tiling_coord(tl, q, dl) * so * w->stride - w->pad_lo;
      halo_plan h;
      if (!pass && !halo_plan_make(p, ls->dims[dl], tl, dl, a, len, halo_max(tl, dl), &h))
        return false;
      if (!pass) continue;
      x = halo_window(p, x, ls->dims[dl], tl, dl, a, len, zero, halo_max(tl, dl), NULL);
      nw->dims[k - 1].pad_lo = nw->dims[k - 1].pad_hi = 0;
    }
    if (!pass) continue;
    kiln_id ops[2] = {x, whole(p, ins->operands[1])};
    kiln_instr *c = kiln__b_clone_start(&p->b, ins, ops, 2);
    kiln_attr *na = c ? kiln_instr_add_attr(p->m, c, KILN_ATTR_WINDOW) : NULL;
    if (na == NULL) return *err = p->tx->err ? p->tx->err : kiln__tx_oom(p->tx), true;
    na->v.window = nw;
    *out = kiln__b_finish(&p->b, c);
  }
  *err = p->tx->err;
  return true;
}

/* ---- windowed einsum ------------------------------------------------------ */

void kiln_spmd_options_init(kiln_spmd_options *o) {
  o->windowed = KILN_SPMD_WINDOWED_AUTO;
  o->windowed_min_bytes = KILN_SPMD_WINDOWED_MIN_BYTES;
  const char *e = getenv("KILN_SPMD_WINDOWED");
  kiln_spmd_windowed w;
  if (e && kiln_spmd_windowed_parse(e, &w)) o->windowed = w;
  e = getenv("KILN_SPMD_WINDOWED_BYTES");
  if (e) {
    char *end;
    errno = 0;
    long long v = strtoll(e, &end, 10);
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    if (shift) end++;
    if (errno == 0 && end != e && *end == '\0' && v >= 0 && v <= (INT64_MAX >> 30))
      o->windowed_min_bytes = (int64_t)v << shift;
  }
}

bool kiln_spmd_windowed_parse(const char *text, kiln_spmd_windowed *out) {
  static const char *names[] = {"auto", "on", "off"};
  for (int i = 0; i < 3; i++)
    if (text && strcmp(text, names[i]) == 0) {
      *out = (kiln_spmd_windowed)i;
      return true;
    }
  return false;
}

/* Most steps of one windowed einsum: the loop is unrolled. */
#define WINDOW_MAX_STEPS 64

bool kiln__window_plan(const kiln_module *m, const kiln_instr *ins, int x, const spmd_tiling *cur,
                       const spmd_tiling *need, const kiln_spmd_options *o, spmd_window *w) {
  if (ins->op != KILN_OP_DOT || ins->noperands != 2 || o == NULL ||
      o->windowed == KILN_SPMD_WINDOWED_OFF || cur == NULL || need == NULL)
    return false;
  const kiln_shape *xs = &m->instrs[ins->operands[x]]->shape;
  if (!is_array(xs) || !is_array(&ins->shape) || cur->rank != xs->rank || need->rank != xs->rank ||
      cur->n != need->n)
    return false;
  /* cur and need differ in one dim only, split in cur and whole in need:
   * the reshard is the all-gather of that dim */
  int d = -1;
  for (uint32_t e = 0; e < xs->rank; e++) {
    if (cur->tiles[e] == need->tiles[e]) continue;
    if (d >= 0 || need->tiles[e] != 1) return false;
    d = (int)e;
  }
  if (d < 0 || cur->tiles[d] < 2 || cur->tiles[d] > WINDOW_MAX_STEPS ||
      xs->dims[d] % cur->tiles[d] != 0)
    return false;
  for (uint32_t e = 0; e < xs->rank; e++)
    for (int64_t k = 0; (int)e != d && cur->tiles[e] > 1 && k < cur->n; k++)
      if (kiln__tiling_coord(cur, k, e) != kiln__tiling_coord(need, k, e)) return false;
  /* that dim is one the dot neither contracts nor batches */
  spmd_loop loops[SPMD_MAX_RANK * 2];
  uint32_t nl;
  if (!kiln__contraction_loops(m, ins, loops, &nl) || nl > SPMD_MAX_RANK) return false;
  int j = -1;
  for (uint32_t i = 0; i < nl; i++)
    if ((x == 0 ? loops[i].l : loops[i].r) == d) j = (int)i;
  if (j < 0 || loops[j].fixed || loops[j].o < 0 || (x == 0 ? loops[j].r : loops[j].l) >= 0)
    return false;
  /* the same bytes as the all-gather, less one block; what decides is the
   * gathered copy it does not build */
  int64_t min = o->windowed_min_bytes >= 0 ? o->windowed_min_bytes : KILN_SPMD_WINDOWED_MIN_BYTES;
  if (o->windowed == KILN_SPMD_WINDOWED_AUTO && kiln__shard_bytes(xs, need) < min) return false;
  *w = (spmd_window){x, (uint32_t)d, (uint32_t)loops[j].o, cur->tiles[d],
                     kiln__shard_bytes(xs, cur)};
  return true;
}

/* x sent one tile back around the ring along split dim d of t: the device
 * at coordinate c receives from the one at (c + 1) mod tiles (the same
 * other coordinates and replica). */
static kiln_id ring_shift(part *p, kiln_id x, const spmd_tiling *t, uint32_t d) {
  int64_t stride = t->rep;
  for (uint32_t e = t->rank; e-- > d + 1;) stride *= t->tiles[e];
  int64_t *pairs = kiln__b_i64s(p->tx, (uint32_t)(2 * p->n));
  if (pairs == NULL) return KILN_NO_ID;
  for (int64_t k = 0; k < p->n; k++) {
    int64_t c = kiln__tiling_coord(t, k, d), cn = (c + 1) % t->tiles[d];
    pairs[2 * k] = t->dev[t->pos[k] + (cn - c) * stride];
    pairs[2 * k + 1] = k;
  }
  kiln_instr *ins = kiln__b_make(&p->b, KILN_OP_COLLECTIVE_PERMUTE, kiln__b_shape(p->tx, x), &x, 1);
  if (ins == NULL ||
      kiln_instr_set_attr_ints(p->m, ins, KILN_ATTR_SOURCE_TARGET_PAIRS, pairs,
                               (uint32_t)(2 * p->n)) ||
      kiln_instr_set_attr_int(p->m, ins, KILN_ATTR_CHANNEL_ID, p->channel++)) {
    kiln__tx_oom(p->tx);
    return KILN_NO_ID;
  }
  return ins->id;
}

/* The dot as a windowed einsum (kiln__window_plan; best: the loops',
 * lhs's, rhs's and result's tilings): the operand keeps its split, and for
 * steps i = 0..T-1 the device at coordinate c along the split multiplies
 * block (c + i) mod T with the other operand into its rows of the result
 * (a dynamic-update-slice of the result shard), the block passed on around
 * the ring before each multiplication so the two can overlap. Masks and the
 * all-reduce of split contracting loops as in rule_contraction. False when
 * the dot is not of that kind. */
static bool windowed_dot(part *p, const kiln_instr *ins, const spmd_loop *loops, uint32_t nl,
                         spmd_tiling *const *best, kiln_id *out, int *err) {
  *err = 0;
  spmd_window w;
  int x = -1;
  if (p->region_body) return false; /* no permutes inside such a body */
  for (int k = 0; k < 2 && x < 0; k++)
    if (kiln__window_plan(p->m, ins, k, p->lt[ins->operands[k]], best[1 + k], &p->opts, &w)) x = k;
  if (x < 0) return false;
  kiln_id xo = ins->operands[x], yo = ins->operands[1 - x];
  const spmd_tiling *cur = p->lt[xo], *it = best[0], *to = best[3];
  kiln_id blk = p->local[xo], other = local_as(p, yo, best[2 - x]);
  const kiln_shape *xs = gshape(p, xo), *ys = gshape(p, yo);
  bool ksplit[SPMD_MAX_RANK] = {false}, any = false;
  for (uint32_t j = 0; j < nl; j++) {
    if (loops[j].o >= 0 || it->tiles[j] <= 1) continue;
    ksplit[j] = any = true;
    int64_t dx = x == 0 ? loops[j].l : loops[j].r, dy = x == 0 ? loops[j].r : loops[j].l;
    blk = mask_dim(p, blk, xs->dims, cur, (uint32_t)dx, kiln__b_scalar(&p->b, xs->dtype, 0));
    other = mask_dim(p, other, ys->dims, best[2 - x], (uint32_t)dy,
                     kiln__b_scalar(&p->b, ys->dtype, 0));
  }
  uint32_t r = ins->shape.rank;
  int64_t odims[SPMD_MAX_RANK];
  shard_dims(&ins->shape, to, odims);
  kiln_id acc = kiln__b_full(&p->b, ins->shape.dtype, odims, r, 0);
  int64_t mb = xs->dims[w.dim] / w.steps;
  int64_t *offs = kiln__b_i64s(p->tx, (uint32_t)p->n);
  kiln_id *idx = kiln__b_ids(p->tx, r ? r : 1);
  if (offs == NULL || idx == NULL) return *err = p->tx->err, true;
  kiln_id zero = kiln__b_iscalar(&p->b, KILN_S32, 0);
  for (int64_t i = 0; i < w.steps && kiln__tx_ok(p->tx); i++) {
    kiln_id next = i + 1 < w.steps ? ring_shift(p, blk, cur, w.dim) : KILN_NO_ID;
    kiln_id ops[2];
    ops[x] = blk;
    ops[1 - x] = other;
    kiln_id y = kiln__b_clone(&p->b, ins, ops, 2);
    for (int64_t k = 0; k < p->n; k++)
      offs[k] = (kiln__tiling_coord(cur, k, w.dim) + i) % w.steps * mb;
    for (uint32_t e = 0; e < r; e++) idx[e] = e == w.odim ? lookup(p, offs) : zero;
    acc = kiln__b_dyn_update(&p->b, acc, y, idx, r);
    blk = next;
  }
  if (any) {
    uint32_t add = kiln__b_reducer(p->tx, KILN_OP_ADD, ins->shape.dtype);
    acc = all_reduce(p, acc, add, it, ksplit);
    p->ar = acc;
    p->ar_tiling = it;
    memcpy(p->ar_dims, ksplit, sizeof ksplit);
  }
  *out = acc;
  *err = p->tx->err;
  return true;
}

/* dot and convolution: choose the tiling of the loops (from the result's,
 * the lhs's or the rhs's), compute locally, all-reduce over split
 * contracting loops. */
static int rule_contraction(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                            spmd_tiling **got) {
  spmd_loop loops[SPMD_MAX_RANK * 2];
  uint32_t nl;
  int herr;
  if (conv_halo(p, ins, want, out, &herr)) {
    *got = (spmd_tiling *)want;
    return herr;
  }
  if (!is_array(&ins->shape) || !kiln__contraction_loops(p->m, ins, loops, &nl) ||
      nl > SPMD_MAX_RANK)
    return rule_whole(p, ins, want, out, got);
  kiln_id l = ins->operands[0], r = ins->operands[1];
  const kiln_shape *ls = gshape(p, l), *rs = gshape(p, r);
  const spmd_tiling *src[3] = {want, p->lt[l], p->lt[r]};
  spmd_tiling *best[4] = {NULL};
  int64_t best_cost = 0;
  for (int c = 0; c < 3; c++) {
    int64_t map[SPMD_MAX_RANK];
    for (uint32_t j = 0; j < nl; j++)
      map[j] = loops[j].fixed ? -1 : (c == 0 ? loops[j].o : c == 1 ? loops[j].l : loops[j].r);
    spmd_tiling *it = kiln__tiling_derive(p->a, src[c], map, nl);
    int64_t lm[SPMD_MAX_RANK], rm[SPMD_MAX_RANK], om[SPMD_MAX_RANK];
    for (uint32_t j = 0; j < nl; j++) {
      if (loops[j].l >= 0) lm[loops[j].l] = j;
      if (loops[j].r >= 0) rm[loops[j].r] = j;
      if (loops[j].o >= 0) om[loops[j].o] = j;
    }
    if (it == NULL) return kiln__tx_oom(p->tx);
    spmd_tiling *tl = kiln__tiling_derive(p->a, it, lm, ls->rank);
    spmd_tiling *tr = kiln__tiling_derive(p->a, it, rm, rs->rank);
    spmd_tiling *to = kiln__tiling_derive(p->a, it, om, ins->shape.rank);
    if (!tl || !tr || !to) return kiln__tx_oom(p->tx);
    bool ksplit = false;
    for (uint32_t j = 0; j < nl; j++) ksplit = ksplit || (loops[j].o < 0 && it->tiles[j] > 1);
    int64_t ob = kiln_shape_bytes(&ins->shape);
    int64_t cost = kiln__reshard_cost(p->lt[l], tl, kiln_shape_bytes(ls)) +
                   kiln__reshard_cost(p->lt[r], tr, kiln_shape_bytes(rs)) +
                   (ksplit ? 2 * ob / kiln__tiling_count(to) : 0) +
                   kiln__reshard_cost(to, want, ob);
    if (best[0] == NULL || cost < best_cost) {
      best[0] = it, best[1] = tl, best[2] = tr, best[3] = to;
      best_cost = cost;
    }
  }
  if (windowed_dot(p, ins, loops, nl, best, out, &herr)) {
    *got = best[3];
    return herr;
  }
  spmd_tiling *it = best[0];
  kiln_id xl = local_as(p, l, best[1]), xr = local_as(p, r, best[2]);
  bool ksplit[SPMD_MAX_RANK] = {false}, any = false;
  kiln_id zl = KILN_NO_ID, zr = KILN_NO_ID;
  for (uint32_t j = 0; j < nl; j++) {
    if (loops[j].o >= 0 || it->tiles[j] <= 1) continue;
    ksplit[j] = any = true;
    if (zl == KILN_NO_ID) {
      zl = kiln__b_scalar(&p->b, ls->dtype, 0);
      zr = kiln__b_scalar(&p->b, rs->dtype, 0);
    }
    xl = mask_dim(p, xl, ls->dims, best[1], (uint32_t)loops[j].l, zl);
    xr = mask_dim(p, xr, rs->dims, best[2], (uint32_t)loops[j].r, zr);
  }
  kiln_id ops[2] = {xl, xr};
  kiln_id y = kiln__b_clone(&p->b, ins, ops, 2);
  if (any) {
    uint32_t add = kiln__b_reducer(p->tx, KILN_OP_ADD, ins->shape.dtype);
    y = all_reduce(p, y, add, it, ksplit);
    p->ar = y;
    p->ar_tiling = it;
    memcpy(p->ar_dims, ksplit, sizeof ksplit);
  }
  *out = y;
  *got = best[3];
  return p->tx->err;
}

/* The indices of a gather or scatter (old id ix, whole on this device) as
 * indices into this device's shard of an operand whose dim d (of size D)
 * tiling t splits: minus the shard's first row. */
static kiln_id local_indices(part *p, kiln_id ix, const spmd_tiling *t, uint32_t d, int64_t D) {
  const kiln_shape *is = gshape(p, ix);
  kiln_id idx = whole(p, ix);
  int64_t sz = kiln__shard_size(D, t->tiles[d]);
  int64_t *offs = kiln__b_i64s(p->tx, (uint32_t)p->n);
  if (offs == NULL || !kiln__tx_ok(p->tx)) return KILN_NO_ID;
  for (int64_t k = 0; k < p->n; k++) offs[k] = kiln__tiling_coord(t, k, d) * sz;
  kiln_id off = kiln__b_convert(&p->b, lookup(p, offs), is->dtype);
  return kiln__b_sub(&p->b, idx, kiln__b_splat(&p->b, off, is));
}

/* Gather ins from operands ops, the table a shard under tt: the slices
 * of the whole dims tt splits are its shards. */
static kiln_id local_gather(part *p, const kiln_instr *ins, const kiln_id *ops,
                            const spmd_tiling *tt) {
  const kiln_shape *ts = gshape(p, ins->operands[0]);
  kiln_instr *c = kiln__b_clone_start(&p->b, ins, ops, 2);
  const kiln_i64s *ss = kiln_instr_attr_ints(ins, KILN_ATTR_SLICE_SIZES);
  int64_t *ls = ss ? kiln__b_i64s(p->tx, ss->n) : NULL;
  if (c == NULL || ls == NULL) {
    if (!p->tx->err) kiln__tx_oom(p->tx);
    return KILN_NO_ID;
  }
  for (uint32_t d = 0; d < ss->n; d++)
    ls[d] = d < ts->rank && tt->tiles[d] > 1 && ss->v[d] == ts->dims[d]
                ? kiln__shard_size(ts->dims[d], tt->tiles[d])
                : ss->v[d];
  if (kiln_instr_set_attr_ints(p->m, c, KILN_ATTR_SLICE_SIZES, ls, ss->n)) {
    kiln__tx_oom(p->tx);
    return KILN_NO_ID;
  }
  return kiln__b_finish(&p->b, c);
}

/* A gather from a table split along the dim it indexes (an embedding
 * lookup over a split vocabulary), when the result moves fewer bytes than
 * the table: each device gathers the (clamped) indices that fall in its
 * shard from it, zeros the others, and an all-reduce (add) over the
 * devices splitting that dim sums the rows; the indices whole. A table
 * split along dims the result takes whole as well (its features) passes
 * those splits to the result (kiln__gather_split). */
static bool gather_split_table(part *p, const kiln_instr *ins, kiln_id *out, spmd_tiling **got) {
  kiln_id tb = ins->operands[0], ix = ins->operands[1];
  const kiln_shape *ts = gshape(p, tb), *is = gshape(p, ix);
  const spmd_tiling *tt = p->lt[tb];
  if (!is_array(ts) || !is_array(is) || !is_array(&ins->shape) || tt == NULL ||
      ins->shape.dtype == KILN_PRED || ts->dtype != ins->shape.dtype)
    return false;
  spmd_tiling *rt;
  int d = kiln__gather_split(p->a, p->m, ins, tt, &rt);
  if (d < 0) return false;
  int64_t rb = kiln_shape_bytes(&ins->shape), tbytes = kiln_shape_bytes(ts);
  int64_t ib = p->lt[ix] && !kiln__tiling_is_replicated(p->lt[ix]) ? kiln_shape_bytes(is) : 0;
  if (rb < 0 || tbytes < 0 || rb + ib >= tbytes) return false;
  int64_t D = ts->dims[d], sz = kiln__shard_size(D, tt->tiles[d]);
  /* gather clamps a start index to [0, D - 1]: clamp first, then shift */
  kiln_id g = whole(p, ix);
  kiln_id lo = kiln__b_full(&p->b, is->dtype, is->dims, is->rank, 0);
  kiln_id hi = kiln__b_full(&p->b, is->dtype, is->dims, is->rank, (double)(D - 1));
  g = kiln__b_bin(&p->b, KILN_OP_MINIMUM, kiln__b_bin(&p->b, KILN_OP_MAXIMUM, g, lo), hi);
  int64_t *offs = kiln__b_i64s(p->tx, (uint32_t)p->n);
  if (offs == NULL || !kiln__tx_ok(p->tx)) return false;
  for (int64_t k = 0; k < p->n; k++) offs[k] = kiln__tiling_coord(tt, k, (uint32_t)d) * sz;
  kiln_id off = kiln__b_convert(&p->b, lookup(p, offs), is->dtype);
  kiln_id l = kiln__b_sub(&p->b, g, kiln__b_splat(&p->b, off, is));
  kiln_id in = kiln__b_bin(
      &p->b, KILN_OP_AND, kiln__b_cmp(&p->b, l, lo, KILN_CMP_GE),
      kiln__b_cmp(&p->b, l, kiln__b_full(&p->b, is->dtype, is->dims, is->rank, (double)sz),
                  KILN_CMP_LT));
  kiln_id ops[2] = {p->local[tb], l};
  kiln_id y = local_gather(p, ins, ops, tt);
  if (y == KILN_NO_ID) return false;
  /* the mask over the result's batch dims (the indices' dims but the
   * index vector's, in order) */
  int64_t ivd = kiln_instr_attr_int(ins, KILN_ATTR_INDEX_VECTOR_DIM, is->rank);
  int64_t bd[SPMD_MAX_RANK], map[SPMD_MAX_RANK];
  uint32_t nb = 0;
  for (uint32_t k = 0; k < is->rank; k++)
    if ((int64_t)k != ivd) bd[nb++] = is->dims[k];
  if (ivd < (int64_t)is->rank) in = kiln__b_reshape(&p->b, in, bd, nb);
  const kiln_i64s *offd = kiln_instr_attr_ints(ins, KILN_ATTR_OFFSET_DIMS);
  bool is_off[SPMD_MAX_RANK] = {false};
  for (uint32_t i = 0; offd && i < offd->n; i++)
    if (offd->v[i] >= 0 && offd->v[i] < (int64_t)ins->shape.rank) is_off[offd->v[i]] = true;
  uint32_t j = 0;
  for (uint32_t k = 0; k < ins->shape.rank; k++)
    if (!is_off[k] && j < nb) map[j++] = k;
  if (j != nb) return false;
  const kiln_shape *ys = kiln__b_shape(p->tx, y);
  kiln_id mask = kiln__b_broadcast(&p->b, in, ys->dims, ys->rank, map, nb);
  y = kiln__b_select(&p->b, mask, y, kiln__b_zeros_like(&p->b, y));
  bool dims[SPMD_MAX_RANK] = {false};
  dims[d] = true;
  y = all_reduce(p, y, kiln__b_reducer(p->tx, KILN_OP_ADD, ins->shape.dtype), tt, dims);
  p->ar = y;
  p->ar_tiling = tt;
  memcpy(p->ar_dims, dims, sizeof dims);
  *out = y;
  *got = rt;
  return kiln__tx_ok(p->tx);
}

/* scatter into an operand split along the dim it indexes (the gradient of
 * an embedding lookup over a split vocabulary), when the result is to be
 * split so: each device scatters the updates whose indices fall in its
 * shard (the others are out of bounds there, which scatter skips); the
 * indices whole. Split along whole window dims no index names (an
 * embedding's feature dim), each device scatters its part of every
 * window: the updates split along the same dims. A scatter-add whose
 * updates arrive split along their batch dims: partial scatter-adds and
 * one all-reduce, when that moves fewer bytes (kiln__scatter_partial).
 * Else whole. */
static int rule_scatter(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                        spmd_tiling **got) {
  int d;
  spmd_tiling *tu, *tb, *ti;
  bool dims[SPMD_MAX_RANK];
  const spmd_tiling *lt[3] = {NULL, NULL, NULL};
  for (uint32_t k = 0; k < 3 && k < ins->noperands; k++) lt[k] = p->lt[ins->operands[k]];
  if (is_array(&ins->shape) && !kiln__scatter_plan(p->a, p->m, ins, want, &d, &tu) &&
      kiln__scatter_partial(p->a, p->m, ins, lt, &tb, &ti, dims)) {
    /* partial scatter-adds of each device's updates into zeros, summed */
    const kiln_shape *s = &ins->shape;
    kiln_id ops[3] = {kiln__b_full(&p->b, s->dtype, s->dims, s->rank, 0),
                      local_as(p, ins->operands[1], ti), local_as(p, ins->operands[2], tb)};
    kiln_id y = kiln__b_clone(&p->b, ins, ops, 3);
    y = all_reduce(p, y, kiln__b_reducer(p->tx, KILN_OP_ADD, s->dtype), tb, dims);
    *out = kiln__b_bin(&p->b, KILN_OP_ADD, whole(p, ins->operands[0]), y);
    *got = replicated(p, s->rank);
    return p->tx->err;
  }
  if (!is_array(&ins->shape) || !kiln__scatter_plan(p->a, p->m, ins, want, &d, &tu))
    return rule_whole(p, ins, want, out, got);
  kiln_id ops[3] = {local_as(p, ins->operands[0], want),
                    d >= 0
                        ? local_indices(p, ins->operands[1], want, (uint32_t)d, ins->shape.dims[d])
                        : whole(p, ins->operands[1]),
                    local_as(p, ins->operands[2], tu)};
  *out = kiln__b_clone(&p->b, ins, ops, 3);
  *got = (spmd_tiling *)want;
  return p->tx->err;
}

/* gather: the indices split as the result's batch dims and the table
 * along the dims the result takes whole, else whole (an embedding lookup
 * of split ids, or from a table split along its features, needs no
 * communication), the split from the result, the table or the indices,
 * whichever reshards fewer bytes (kiln__gather_plan); or a table split
 * along the indexed dim (gather_split_table). */
static int rule_gather(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                       spmd_tiling **got) {
  if (gather_split_table(p, ins, out, got)) return 0;
  if (!kiln__tx_ok(p->tx)) return p->tx->err;
  kiln_id tb = ins->operands[0], ix = ins->operands[1];
  const kiln_shape *ts = gshape(p, tb);
  spmd_tiling *tt, *ti, *tr;
  if (!is_array(&ins->shape) || !is_array(ts) || !is_array(gshape(p, ix)) ||
      !kiln__gather_plan(p->a, p->m, ins, p->lt[tb], p->lt[ix], want, &tt, &ti, &tr))
    return rule_whole(p, ins, want, out, got);
  kiln_id ops[2] = {local_as(p, tb, tt), local_as(p, ix, ti)};
  *out = local_gather(p, ins, ops, tt);
  *got = tr;
  return p->tx->err;
}

static int rule_gte(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                    spmd_tiling **got) {
  kiln_id t = ins->operands[0];
  int64_t i = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, 0);
  *out = kiln__b_gte(&p->b, p->local[t], i);
  spmd_tiling *e = p->le[t] ? p->le[t][i] : NULL;
  *got = is_array(&ins->shape) ? (e ? e : replicated(p, ins->shape.rank)) : NULL;
  (void)want;
  return p->tx->err;
}

/* all-reduce (only in a partially manual region's body, whose explicit
 * collectives run over its manual axes): each device's shard of the
 * operand reduced with the same shards of its group. */
static int rule_all_reduce(part *p, const kiln_instr *ins, const spmd_tiling *want, kiln_id *out,
                           spmd_tiling **got) {
  if (!p->region_body || want == NULL || ins->noperands != 1 || !is_array(&ins->shape) ||
      !kiln_shape_same_dims(gshape(p, ins->operands[0]), &ins->shape))
    return rule_whole(p, ins, want, out, got);
  kiln_id x = local_as(p, ins->operands[0], want);
  *out = kiln__b_clone(&p->b, ins, &x, 1);
  *got = (spmd_tiling *)want;
  return p->tx->err;
}

static const rule_fn rules[KILN_OP_COUNT] = {
    [KILN_OP_PARAMETER] = rule_parameter,
    [KILN_OP_CUSTOM_CALL] = rule_annotation,
    [KILN_OP_BROADCAST] = rule_movement,
    [KILN_OP_TRANSPOSE] = rule_movement,
    [KILN_OP_RESHAPE] = rule_movement,
    [KILN_OP_SLICE] = rule_movement,
    [KILN_OP_PAD] = rule_movement,
    [KILN_OP_REVERSE] = rule_movement,
    [KILN_OP_CONCATENATE] = rule_movement,
    [KILN_OP_REDUCE] = rule_reduce,
    [KILN_OP_DOT] = rule_contraction,
    [KILN_OP_CONVOLUTION] = rule_contraction,
    [KILN_OP_GET_TUPLE_ELEMENT] = rule_gte,
    [KILN_OP_GATHER] = rule_gather,
    [KILN_OP_SCATTER] = rule_scatter,
    [KILN_OP_ALL_REDUCE] = rule_all_reduce,
    [KILN_OP_REDUCE_WINDOW] = rule_reduce_window,
};

static rule_fn rule_of(const kiln_instr *ins) {
  if (rules[ins->op]) return rules[ins->op];
  if (kiln_opcode_flags(ins->op) & KILN_OPF_ELEMENTWISE) return rule_elementwise;
  return rule_whole;
}

/* ---- manual regions (shard_map) ------------------------------------------ */

static bool is_target(const kiln_instr *ins, const char *target) {
  const char *t = ins->op == KILN_OP_CUSTOM_CALL
                      ? kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET)
                      : NULL;
  return t && strcmp(t, target) == 0;
}

static bool manual_operand(const part *p, const kiln_instr *ins) {
  for (uint32_t k = 0; k < ins->noperands; k++)
    if (ins->operands[k] < p->ncap && p->manual[ins->operands[k]]) return true;
  return false;
}

/* Whether global shape gs tiled by t has shards of exactly shape ls. */
static bool local_shape_ok(const kiln_shape *gs, const kiln_shape *ls, const spmd_tiling *t) {
  if (gs->rank != ls->rank) return false;
  for (uint32_t d = 0; d < gs->rank; d++)
    if (gs->dims[d] % t->tiles[d] != 0 || gs->dims[d] / t->tiles[d] != ls->dims[d]) return false;
  return true;
}

static int wanted(part *p, const kiln_instr *ins, spmd_tiling **want, spmd_tiling ***elems);
static int partition_sub(part *p, uint32_t comp);
static kiln_id as_elems(part *p, kiln_id old, spmd_tiling *const *want);

/* The tiling of a region's global array that splits its dims as tm (the
 * manual axes: which local array a device holds) and ta (the automatic
 * axes: which part of that local array), when no dim is split by both and
 * the devices agree; else NULL. */
static spmd_tiling *region_tiling(part *p, const spmd_tiling *tm, const spmd_tiling *ta) {
  if (ta == NULL || kiln__tiling_is_replicated(ta)) return (spmd_tiling *)tm;
  if (tm->rank != ta->rank) return NULL;
  if (kiln__tiling_is_replicated(tm)) return (spmd_tiling *)ta;
  for (uint32_t d = 0; d < tm->rank; d++)
    if (tm->tiles[d] > 1 && ta->tiles[d] > 1) return NULL;
  spmd_tiling *c = kiln__tiling_merge(p->a, tm, ta);
  if (c == NULL) return NULL;
  for (uint32_t d = 0; d < tm->rank; d++) {
    if (c->tiles[d] != tm->tiles[d] * ta->tiles[d]) return NULL;
    const spmd_tiling *by = tm->tiles[d] > 1 ? tm : ta;
    for (int64_t k = 0; by->tiles[d] > 1 && k < p->n; k++)
      if (kiln__tiling_coord(c, k, d) != kiln__tiling_coord(by, k, d)) return NULL;
  }
  return c;
}

/* The call of the region body that takes G's values when propagation
 * split it along the region's automatic axes (a parameter of its body
 * carries a sharding); else NULL. */
static const kiln_instr *split_body_call(part *p, const kiln_instr *g) {
  const kiln_computation *c = p->m->comps[p->m->entry];
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *ins = p->m->instrs[c->instrs[i]];
    if (ins->op != KILN_OP_CALL || ins->ncalled != 1 || ins->noperands == 0 ||
        ins->operands[0] >= p->ncap)
      continue;
    const kiln_instr *o0 = p->m->instrs[ins->operands[0]];
    if (o0 != g && !(o0->op == KILN_OP_GET_TUPLE_ELEMENT && o0->operands[0] == g->id)) continue;
    const kiln_computation *body = p->m->comps[ins->called[0]];
    for (uint32_t k = 0; k < ins->noperands; k++) {
      const kiln_instr *pi = kiln_computation_param(p->m, body, k);
      if (pi && kiln_instr_has_attr(pi, KILN_ATTR_SHARDING)) return ins;
    }
    return NULL;
  }
  return NULL;
}

/* The tiling propagation gave parameter k of a split body (replicated when
 * none). */
static spmd_tiling *body_param_tiling(part *p, const kiln_instr *call, uint32_t k) {
  const kiln_instr *pi = kiln_computation_param(p->m, p->m->comps[call->called[0]], k);
  spmd_tiling *t = NULL, **e;
  if (pi == NULL || !is_array(&pi->shape) || wanted(p, pi, &t, &e)) return NULL;
  return t;
}

/* A region value as each device holds it whole along the automatic axes
 * (a split body's result or a split entry's value is gathered back along
 * them). */
static kiln_id manual_whole(part *p, kiln_id o) {
  const kiln_shape *s = gshape(p, o);
  if (is_array(s) && p->lt[o] && !kiln__tiling_is_replicated(p->lt[o]))
    return reshard(p, p->local[o], s, p->lt[o], replicated(p, s->rank));
  if (kiln_shape_is_tuple(s) && p->le[o]) {
    spmd_tiling **none = kiln_arena_calloc(p->a, s->rank ? s->rank : 1, sizeof *none);
    return none ? as_elems(p, o, none) : KILN_NO_ID;
  }
  return p->local[o];
}

/* A region's entry (xla.sdy.GlobalToLocalShape, or XLA's
 * SPMDFullToShardShape): each operand's shard
 * under its in_sharding, which must be the region's local shape; inside
 * the region (its values' users up to the LocalToGlobalShape) every op
 * runs per device as written, its collectives included. */
static int build_manual(part *p, const kiln_instr *ins) {
  char where[200];
  kiln_instr_where(p->m, ins, where, sizeof where);
  kiln_id out;
  spmd_tiling *lt_out = is_array(&ins->shape) ? replicated(p, ins->shape.rank) : NULL;
  spmd_tiling **le_out = NULL;
  const kiln_instr *call = NULL;
  if (is_target(ins, "SPMDFullToShardShape")) {
    /* XLA's form: the operand's own sharding (the Sharding annotation in
     * front of it) says which shard each device's local value is. */
    spmd_tiling *t, **elems;
    kiln_id o = ins->operands[0];
    const kiln_shape *gs = ins->noperands == 1 ? gshape(p, o) : NULL;
    if (gs == NULL || !is_array(gs) || !is_array(&ins->shape) || gs->rank != ins->shape.rank)
      return fail(p, ins, KILN_EINVAL, "SPMDFullToShardShape: one array in, one out, one rank");
    int rc = wanted(p, p->m->instrs[o], &t, &elems);
    if (rc) return p->tx->err = rc;
    if (!local_shape_ok(gs, &ins->shape, t))
      return fail(p, ins, KILN_EINVAL,
                  "SPMDFullToShardShape: the operand's shard under its sharding is not the "
                  "region's local shape (shard_map needs dims that divide evenly)");
    out = local_as(p, o, t);
  } else if (is_target(ins, "xla.sdy.GlobalToLocalShape")) {
    bool tuple = kiln_shape_is_tuple(&ins->shape);
    if (ins->noperands == 0 || ins->noperands > 64 ||
        (tuple && ins->shape.rank != ins->noperands) || (!tuple && ins->noperands != 1))
      return fail(p, ins, KILN_EINVAL, "GlobalToLocalShape: one result per operand");
    kiln_id xs[64];
    /* a body split along the automatic axes takes each value as the
     * operand already holds it along them (tiling ta: no exchange) */
    call = split_body_call(p, ins);
    if (tuple && (le_out = kiln_arena_calloc(p->a, ins->noperands, sizeof *le_out)) == NULL)
      return kiln__tx_oom(p->tx);
    for (uint32_t i = 0; i < ins->noperands; i++) {
      const kiln_shape *gs = gshape(p, ins->operands[i]);
      const kiln_shape *ls = tuple ? &ins->shape.tuple[i] : &ins->shape;
      const kiln_sharding *sh;
      spmd_tiling *t;
      if (!is_array(gs) || !is_array(ls) || gs->rank != ls->rank)
        return fail(p, ins, KILN_EINVAL,
                    "GlobalToLocalShape: operands and results are arrays of "
                    "one rank");
      int rc = kiln__sdy_region_sharding(p->a, p->m, ins, i, gs->rank, &sh, p->tx->st);
      if (rc == 0) rc = kiln__tiling_from_sharding(p->a, sh, gs->rank, p->n, where, &t, p->tx->st);
      if (rc) return p->tx->err = rc;
      if (!local_shape_ok(gs, ls, t))
        return fail(p, ins, KILN_EINVAL,
                    "GlobalToLocalShape: an operand's shard is not the region's local shape "
                    "(shard_map needs dims that divide evenly)");
      spmd_tiling *ta = call ? body_param_tiling(p, call, i) : NULL, *c = region_tiling(p, t, ta);
      if (c == NULL || c == t) ta = NULL, c = t;
      xs[i] = local_as(p, ins->operands[i], c);
      if (tuple)
        le_out[i] = ta;
      else if (ta)
        lt_out = ta;
    }
    out = tuple ? kiln__b_tuple(&p->b, xs, ins->noperands) : xs[0];
  } else if (ins->op == KILN_OP_GET_TUPLE_ELEMENT && ins->noperands == 1) {
    kiln_id o = ins->operands[0];
    int64_t i = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, 0);
    out = kiln__b_gte(&p->b, p->manual[o] ? p->local[o] : whole(p, o), i);
    if (p->manual[o] && p->le[o] && i >= 0 && i < (int64_t)gshape(p, o)->rank && p->le[o][i])
      lt_out = p->le[o][i];
  } else if (ins->op == KILN_OP_CALL && ins->ncalled == 1 && ins->noperands <= 256 &&
             ins->noperands > 0 &&
             (call =
                  split_body_call(p, p->m->instrs[ins->operands[0]]->op == KILN_OP_GET_TUPLE_ELEMENT
                                         ? p->m->instrs[p->m->instrs[ins->operands[0]]->operands[0]]
                                         : p->m->instrs[ins->operands[0]])) == ins) {
    /* the split body: its parameters in their tilings, partitioned as a
     * loop body is, its explicit collectives over the manual axes as
     * written on the shards */
    kiln_id ops[256];
    for (uint32_t k = 0; k < ins->noperands; k++) {
      kiln_id o = ins->operands[k];
      spmd_tiling *ta = body_param_tiling(p, ins, k);
      const kiln_shape *os = gshape(p, o);
      if (!p->manual[o] || !is_array(os) || ta == NULL) {
        ops[k] = p->manual[o] ? manual_whole(p, o) : whole(p, o);
        continue;
      }
      spmd_tiling *from = p->lt[o] ? p->lt[o] : replicated(p, os->rank);
      ops[k] = reshard(p, p->local[o], os, from, ta);
    }
    const kiln_computation *body = p->m->comps[ins->called[0]];
    spmd_tiling *rt = NULL, **re;
    int rc = wanted(p, p->m->instrs[body->root], &rt, &re);
    if (rc) return p->tx->err = rc;
    bool saved = p->region_body;
    p->region_body = true;
    rc = partition_sub(p, ins->called[0]);
    p->region_body = saved;
    if (rc) return rc;
    out = kiln__b_clone(&p->b, ins, ops, ins->noperands);
    if (rt) lt_out = rt;
    if (re && kiln_shape_is_tuple(&ins->shape)) le_out = re;
  } else {
    kiln_id ops[256];
    if (ins->noperands > 256) return fail(p, ins, KILN_EUNIMPL, "too many operands");
    for (uint32_t k = 0; k < ins->noperands; k++) {
      kiln_id o = ins->operands[k];
      ops[k] = p->manual[o] ? manual_whole(p, o) : whole(p, o);
    }
    out = kiln__b_clone_same(&p->b, ins, ops, ins->noperands);
    if (out != KILN_NO_ID) kiln__b_drop_attr(kiln__b_ins(p->tx, out), KILN_ATTR_SHARDING);
  }
  p->local[ins->id] = out;
  p->lt[ins->id] = lt_out;
  p->le[ins->id] = le_out;
  p->manual[ins->id] = true;
  return p->tx->err;
}

/* A region's exit (xla.sdy.LocalToGlobalShape, or XLA's
 * SPMDShardToFullShape): each device's value is its shard of the result
 * under out_shardings (XLA's: the exit's own sharding). */
static int rule_local_to_global(part *p, const kiln_instr *ins, spmd_tiling **got, kiln_id *out) {
  char where[200];
  kiln_instr_where(p->m, ins, where, sizeof where);
  kiln_id o = ins->operands[0];
  const kiln_shape *ls = gshape(p, o);
  const kiln_sharding *sh;
  spmd_tiling *t;
  if (ins->noperands != 1 || !is_array(&ins->shape) || !is_array(ls) || ls->rank != ins->shape.rank)
    return fail(p, ins, KILN_EUNIMPL, "LocalToGlobalShape: one array in, one out");
  int rc = 0;
  if (is_target(ins, "SPMDShardToFullShape")) { /* XLA's form: its own sharding */
    const kiln_attr *sa = kiln_instr_attr(ins, KILN_ATTR_SHARDING);
    sh = sa ? sa->v.sharding : NULL;
  } else {
    rc = kiln__sdy_region_sharding(p->a, p->m, ins, 0, ins->shape.rank, &sh, p->tx->st);
  }
  if (rc == 0)
    rc = kiln__tiling_from_sharding(p->a, sh, ins->shape.rank, p->n, where, &t, p->tx->st);
  if (rc) return p->tx->err = rc;
  if (!local_shape_ok(&ins->shape, ls, t))
    return fail(p, ins, KILN_EINVAL,
                "LocalToGlobalShape: the region's local shape is not a shard of the result");
  /* a value split along the automatic axes (a split body's result): the
   * result split along both, or gathered back along them */
  spmd_tiling *c = region_tiling(p, t, p->lt[o]);
  *out = c ? p->local[o] : manual_whole(p, o);
  *got = c ? c : t;
  return p->tx->err;
}

/* A region's exit for several results (a shard_map of several outputs: a
 * LocalToGlobalShape of n operands and a tuple of n results): each
 * operand's value is its device's shard of result i under out_shardings
 * value i (split along both when the value is split along automatic axes
 * too); the result a tuple of them. */
static int build_exit_tuple(part *p, const kiln_instr *ins) {
  char where[200];
  kiln_instr_where(p->m, ins, where, sizeof where);
  uint32_t n = ins->noperands;
  if (!kiln_shape_is_tuple(&ins->shape) || ins->shape.rank != n || n == 0 || n > 256)
    return fail(p, ins, KILN_EINVAL, "LocalToGlobalShape: one result per operand");
  kiln_id xs[256];
  spmd_tiling **le = kiln_arena_calloc(p->a, n, sizeof *le);
  if (le == NULL) return kiln__tx_oom(p->tx);
  for (uint32_t i = 0; i < n; i++) {
    kiln_id o = ins->operands[i];
    const kiln_shape *ls = gshape(p, o), *gs = &ins->shape.tuple[i];
    const kiln_sharding *sh;
    spmd_tiling *t;
    if (!is_array(ls) || !is_array(gs) || ls->rank != gs->rank)
      return fail(p, ins, KILN_EINVAL,
                  "LocalToGlobalShape: operands and results are arrays of one rank");
    int rc = kiln__sdy_region_sharding(p->a, p->m, ins, i, gs->rank, &sh, p->tx->st);
    if (rc == 0) rc = kiln__tiling_from_sharding(p->a, sh, gs->rank, p->n, where, &t, p->tx->st);
    if (rc) return p->tx->err = rc;
    if (!local_shape_ok(gs, ls, t))
      return fail(p, ins, KILN_EINVAL,
                  "LocalToGlobalShape: a region's local shape is not a shard of its result");
    spmd_tiling *c = p->manual[o] ? region_tiling(p, t, p->lt[o]) : NULL;
    xs[i] = c ? p->local[o] : p->manual[o] ? manual_whole(p, o) : local_as(p, o, t);
    le[i] = c ? c : t;
  }
  p->local[ins->id] = kiln__b_tuple(&p->b, xs, n);
  p->lt[ins->id] = NULL;
  p->le[ins->id] = le;
  return p->tx->err;
}

/* ---- the driver ---------------------------------------------------------- */

/* The tiling(s) propagation wrote on ins. */
static int wanted(part *p, const kiln_instr *ins, spmd_tiling **want, spmd_tiling ***elems) {
  const kiln_attr *sa = kiln_instr_attr(ins, KILN_ATTR_SHARDING);
  const kiln_sharding *s = sa ? sa->v.sharding : NULL;
  char where[200];
  kiln_instr_where(p->m, ins, where, sizeof where);
  *want = NULL;
  *elems = NULL;
  if (is_array(&ins->shape))
    return kiln__tiling_from_sharding(p->a, s, ins->shape.rank, p->n, where, want, p->tx->st);
  if (s && s->kind == KILN_SHARD_TUPLE && s->nelems == ins->shape.rank &&
      kiln_shape_is_tuple(&ins->shape)) {
    *elems = kiln_arena_calloc(p->a, s->nelems ? s->nelems : 1, sizeof **elems);
    if (*elems == NULL) return KILN_ENOMEM;
    for (uint32_t i = 0; i < s->nelems; i++) {
      const kiln_shape *es = &ins->shape.tuple[i];
      if (!is_array(es)) continue;
      int rc = kiln__tiling_from_sharding(p->a, &s->elems[i], es->rank, p->n, where, &(*elems)[i],
                                          p->tx->st);
      if (rc) return rc;
    }
  }
  return 0;
}

/* A tuple instruction: elements resharded to what was asked of them. */
static int build_tuple(part *p, const kiln_instr *ins, spmd_tiling **elems) {
  kiln_id *ops = kiln__b_ids(p->tx, ins->noperands ? ins->noperands : 1);
  spmd_tiling **le = kiln_arena_calloc(p->a, ins->noperands ? ins->noperands : 1, sizeof *le);
  if (ops == NULL || le == NULL) return kiln__tx_oom(p->tx);
  for (uint32_t k = 0; k < ins->noperands; k++) {
    kiln_id o = ins->operands[k];
    if (is_array(gshape(p, o))) {
      le[k] = elems && elems[k] ? elems[k] : p->lt[o];
      ops[k] = local_as(p, o, le[k]);
    } else {
      ops[k] = whole(p, o);
    }
  }
  p->local[ins->id] = kiln__b_tuple(&p->b, ops, ins->noperands);
  p->le[ins->id] = le;
  return p->tx->err;
}

static int partition_sub(part *p, uint32_t comp);

/* A loop state parameter (condition, body): each element's shard. */
static int build_state_param(part *p, const kiln_instr *ins, spmd_tiling **elems) {
  uint32_t r = ins->shape.rank;
  kiln_shape *es = kiln_arena_calloc(p->tx->scratch, r ? r : 1, sizeof *es);
  if (es == NULL) return kiln__tx_oom(p->tx);
  for (uint32_t i = 0; i < r; i++) {
    const kiln_shape *g = &ins->shape.tuple[i];
    es[i] = *g;
    if (!is_array(g) || elems[i] == NULL) continue;
    int64_t dims[SPMD_MAX_RANK];
    shard_dims(g, elems[i], dims);
    if (kiln_shape_make_array(p->tx->scratch, &es[i], g->dtype, dims, g->rank))
      return kiln__tx_oom(p->tx);
  }
  kiln_shape ts;
  if (kiln_shape_make_tuple(p->tx->scratch, &ts, es, r)) return kiln__tx_oom(p->tx);
  p->local[ins->id] = kiln__b_param(&p->b, ins->param_number, &ts, ins->name);
  p->le[ins->id] = elems;
  return p->tx->err;
}

/* The local value of old tuple instruction `old` with its elements in the
 * tilings want[i] (NULL: replicated): its own when they agree, else a tuple
 * of its elements resharded. */
static kiln_id as_elems(part *p, kiln_id old, spmd_tiling *const *want) {
  const kiln_shape *s = gshape(p, old);
  spmd_tiling **have = p->le[old];
  bool same = true;
  for (uint32_t i = 0; i < s->rank; i++) {
    if (!is_array(&s->tuple[i])) continue;
    const spmd_tiling *h = have && have[i] ? have[i] : replicated(p, s->tuple[i].rank);
    const spmd_tiling *w = want[i] ? want[i] : replicated(p, s->tuple[i].rank);
    same = same && h && w && kiln__tiling_equal(h, w);
  }
  if (same || !kiln__tx_ok(p->tx)) return p->local[old];
  kiln_id *xs = kiln__b_ids(p->tx, s->rank ? s->rank : 1);
  if (xs == NULL) return KILN_NO_ID;
  for (uint32_t i = 0; i < s->rank; i++) {
    xs[i] = kiln__b_gte(&p->b, p->local[old], i);
    if (!is_array(&s->tuple[i])) continue;
    const spmd_tiling *h = have && have[i] ? have[i] : replicated(p, s->tuple[i].rank);
    const spmd_tiling *w = want[i] ? want[i] : replicated(p, s->tuple[i].rank);
    xs[i] = reshard(p, xs[i], &s->tuple[i], h, w);
  }
  return kiln__b_tuple(&p->b, xs, s->rank);
}

/* Whether some element of a tuple's tilings splits. */
static bool elems_split(const kiln_shape *s, spmd_tiling *const *elems) {
  for (uint32_t i = 0; elems && i < s->rank; i++)
    if (elems[i] && !kiln__tiling_is_replicated(elems[i])) return true;
  return false;
}

/* A loop with split state (propagation gave it private copies of its
 * condition and body): its init resharded to the state's tiling, its
 * condition and body partitioned with that state. A loop whose state is
 * not split runs whole. */
static int build_while(part *p, const kiln_instr *ins, spmd_tiling *want, spmd_tiling **elems) {
  kiln_id init = ins->operands[0];
  if (ins->ncalled != 2 || ins->noperands != 1 ||
      (elems ? !elems_split(&ins->shape, elems)
             : want == NULL || kiln__tiling_is_replicated(want))) {
    kiln_id out;
    spmd_tiling *got;
    int rc = rule_whole(p, ins, NULL, &out, &got);
    p->local[ins->id] = out;
    p->lt[ins->id] = got;
    if (rc == 0 && want && got) {
      p->local[ins->id] = reshard(p, out, &ins->shape, got, want);
      p->lt[ins->id] = want;
    }
    return rc;
  }
  kiln_id x = elems ? as_elems(p, init, elems) : local_as(p, init, want);
  int rc = partition_sub(p, ins->called[0]);
  if (rc == 0) rc = partition_sub(p, ins->called[1]);
  if (rc) return rc;
  p->local[ins->id] = kiln__b_clone(&p->b, ins, &x, 1);
  p->lt[ins->id] = want;
  p->le[ins->id] = elems;
  return p->tx->err;
}

/* The tilings propagation wrote on ins: whether one splits. */
static bool sharding_splits(const kiln_instr *ins) {
  const kiln_attr *a = kiln_instr_attr(ins, KILN_ATTR_SHARDING);
  const kiln_sharding *s = a ? a->v.sharding : NULL;
  if (s && s->kind == KILN_SHARD_TILED) return true;
  for (uint32_t k = 0; s && s->kind == KILN_SHARD_TUPLE && k < s->nelems; k++)
    if (s->elems[k].kind == KILN_SHARD_TILED) return true;
  return false;
}

/* A conditional with split operands or result (propagation gave it private
 * copies of its branches, each parameter in its operand's sharding, each
 * root in the result's): each branch operand resharded to its branch's
 * parameter, the branches partitioned, the selector whole. Else it runs
 * whole. */
static int build_conditional(part *p, const kiln_instr *ins, spmd_tiling *want,
                             spmd_tiling **elems) {
  bool split = sharding_splits(ins) && ins->ncalled > 0 && ins->ncalled <= 256 &&
               ins->noperands == ins->ncalled + 1;
  for (uint32_t k = 1;
       !split && k < ins->noperands && ins->noperands == ins->ncalled + 1 && ins->ncalled <= 256;
       k++)
    split = sharding_splits(p->m->instrs[ins->operands[k]]);
  if (!split) {
    kiln_id out;
    spmd_tiling *got;
    int rc = rule_whole(p, ins, NULL, &out, &got);
    p->local[ins->id] = out;
    p->lt[ins->id] = got;
    if (rc == 0 && want && got) {
      p->local[ins->id] = reshard(p, out, &ins->shape, got, want);
      p->lt[ins->id] = want;
    }
    return rc;
  }
  kiln_id *ops = kiln__b_ids(p->tx, ins->noperands);
  if (ops == NULL) return p->tx->err;
  ops[0] = whole(p, ins->operands[0]);
  for (uint32_t k = 0; k < ins->ncalled; k++) {
    kiln_id o = ins->operands[k + 1];
    const kiln_computation *c = p->m->comps[ins->called[k]];
    const kiln_instr *param = kiln_computation_param(p->m, c, 0);
    spmd_tiling *pt, **pe;
    if (param == NULL) return fail(p, ins, KILN_EINVAL, "a branch without a parameter");
    int rc = wanted(p, param, &pt, &pe);
    if (rc) return p->tx->err = rc;
    if (is_array(gshape(p, o)) && pt)
      ops[k + 1] = local_as(p, o, pt);
    else if (kiln_shape_is_tuple(gshape(p, o)) && pe && param->shape.rank == gshape(p, o)->rank)
      ops[k + 1] = as_elems(p, o, pe);
    else
      ops[k + 1] = whole(p, o);
  }
  for (uint32_t k = 0; k < ins->ncalled; k++) {
    int rc = partition_sub(p, ins->called[k]);
    if (rc) return rc;
  }
  p->local[ins->id] = kiln__b_clone(&p->b, ins, ops, ins->noperands);
  p->lt[ins->id] = want;
  p->le[ins->id] = elems;
  return p->tx->err;
}

/* all-reduce(x) resharded from got to want, where want splits one more
 * dim d exactly among each all-reduce group in rank order: one
 * reduce-scatter along d instead. */
static bool try_reduce_scatter(part *p, const kiln_shape *g, const spmd_tiling *got,
                               const spmd_tiling *want, kiln_id *out) {
  kiln_instr *ar = kiln__b_ins(p->tx, p->ar);
  int d = -1;
  for (uint32_t k = 0; k < g->rank; k++) {
    if (want->tiles[k] == got->tiles[k]) continue;
    if (got->tiles[k] != 1 || d >= 0) return false;
    d = (int)k;
  }
  if (d < 0 || g->dims[d] % want->tiles[d] != 0 || ar->noperands != 1) return false;
  for (uint32_t k = 0; k < g->rank; k++)
    for (int64_t dev = 0; (int)k != d && got->tiles[k] > 1 && dev < p->n; dev++)
      if (kiln__tiling_coord(got, dev, k) != kiln__tiling_coord(want, dev, k)) return false;
  int64_t *v, ng, size;
  if (kiln__tiling_groups(p->a, p->ar_tiling, p->ar_dims, &v, &ng, &size) || size != want->tiles[d])
    return false;
  for (int64_t i = 0; i < ng * size; i++)
    if (kiln__tiling_coord(want, v[i], (uint32_t)d) != i % size) return false;
  kiln_id x = ar->operands[0];
  const kiln_shape *xs = kiln__b_shape(p->tx, x);
  int64_t dims[SPMD_MAX_RANK];
  for (uint32_t k = 0; k < xs->rank; k++) dims[k] = xs->dims[k];
  dims[d] /= size;
  kiln_shape rs;
  if (kiln_shape_make_array(p->tx->scratch, &rs, xs->dtype, dims, xs->rank)) return false;
  kiln_instr *r = kiln__b_make(&p->b, KILN_OP_REDUCE_SCATTER, &rs, &x, 1);
  kiln_replica_groups *gr = r ? make_groups(p, v, ng, size) : NULL;
  kiln_attr *at = gr ? kiln_instr_add_attr(p->m, r, KILN_ATTR_REPLICA_GROUPS) : NULL;
  int64_t dd = d;
  if (at == NULL || kiln_instr_set_called(p->m, r, ar->called, 1) ||
      kiln_instr_set_attr_int(p->m, r, KILN_ATTR_CHANNEL_ID, p->channel++) ||
      kiln_instr_set_attr_int(p->m, r, KILN_ATTR_USE_GLOBAL_DEVICE_IDS, 1) ||
      kiln_instr_set_attr_ints(p->m, r, KILN_ATTR_DIMENSIONS, &dd, 1)) {
    kiln__tx_oom(p->tx);
    return false;
  }
  at->v.groups = gr;
  ar->comp = KILN_NO_ID; /* dropped by finish_comp */
  *out = r->id;
  return true;
}

static int build(part *p, const kiln_instr *ins) {
  spmd_tiling *want, **elems;
  bool exit =
      (is_target(ins, "xla.sdy.LocalToGlobalShape") || is_target(ins, "SPMDShardToFullShape")) &&
      manual_operand(p, ins);
  if (!exit && (is_target(ins, "xla.sdy.GlobalToLocalShape") ||
                is_target(ins, "SPMDFullToShardShape") || manual_operand(p, ins)))
    return build_manual(p, ins);
  if (exit && kiln_shape_is_tuple(&ins->shape)) return build_exit_tuple(p, ins);
  int rc = wanted(p, ins, &want, &elems);
  if (rc) {
    if (p->tx->err == 0) p->tx->err = rc;
    return rc;
  }
  if (ins->op == KILN_OP_TUPLE) return build_tuple(p, ins, elems);
  if (ins->op == KILN_OP_WHILE) return build_while(p, ins, want, elems);
  if (ins->op == KILN_OP_CONDITIONAL) return build_conditional(p, ins, want, elems);
  if (ins->op == KILN_OP_PARAMETER && elems && ins->comp != p->m->entry)
    return build_state_param(p, ins, elems);
  kiln_id out = KILN_NO_ID;
  spmd_tiling *got = NULL;
  p->ar = KILN_NO_ID;
  if (exit ? (rc = rule_local_to_global(p, ins, &got, &out)) != 0
           : (rc = rule_of(ins)(p, ins, want, &out, &got)) != 0)
    return rc;
  kiln_id rs;
  if (want && got && p->ar == out && !kiln__tiling_equal(got, want) &&
      try_reduce_scatter(p, &ins->shape, got, want, &rs)) {
    p->local[ins->id] = rs;
    p->lt[ins->id] = want;
  } else if (want && got) {
    p->local[ins->id] = reshard(p, out, &ins->shape, got, want);
    p->lt[ins->id] = want;
  } else {
    p->local[ins->id] = out;
    p->lt[ins->id] = got;
    if (ins->op == KILN_OP_PARAMETER && elems) p->le[ins->id] = elems;
  }
  return p->tx->err;
}

/* ---- the all-reduce combiner --------------------------------------------- */

static bool same_groups(const kiln_instr *a, const kiln_instr *b) {
  const kiln_replica_groups *ga = kiln_instr_attr(a, KILN_ATTR_REPLICA_GROUPS)->v.groups;
  const kiln_replica_groups *gb = kiln_instr_attr(b, KILN_ATTR_REPLICA_GROUPS)->v.groups;
  if (ga->ngroups != gb->ngroups) return false;
  for (uint32_t i = 0; i < ga->ngroups; i++)
    if (ga->groups[i].n != gb->groups[i].n ||
        memcmp(ga->groups[i].v, gb->groups[i].v, ga->groups[i].n * sizeof(int64_t)))
      return false;
  return true;
}

/* Merges each all-reduce the partitioner made with later ones of the same
 * groups and reducer whose operands do not depend on it. */
static int combine(part *p, uint32_t comp) {
  kiln_module *m = p->m;
  kiln_computation *c = m->comps[comp];
  uint32_t n0 = c->ninstrs;
  uint8_t *dep = NULL;
  size_t ndep = 0;
  kiln_id base = m->ninstrs; /* made by the combiner: may depend on anything */
  for (uint32_t i = 0; i < n0; i++) {
    kiln_instr *a = m->instrs[c->instrs[i]];
    if (a->op != KILN_OP_ALL_REDUCE || a->noperands != 1 || a->comp == KILN_NO_ID) continue;
    /* dep[x]: x depends on a (ids past the array: made here, assume so). */
    if (ndep < m->ninstrs + 1) {
      kiln_free(dep);
      ndep = m->ninstrs + 1;
      if ((dep = kiln_malloc(ndep)) == NULL) return kiln__tx_oom(p->tx);
    }
    memset(dep, 0, ndep);
    dep[a->id] = 1;
    kiln_id group[16];
    uint32_t ng = 0;
    group[ng++] = a->id;
    for (uint32_t j = i + 1; j < n0 && ng < 16; j++) {
      kiln_instr *b = m->instrs[c->instrs[j]];
      if (b->comp == KILN_NO_ID || b->id >= ndep) continue;
      for (uint32_t k = 0; k < b->noperands; k++)
        dep[b->id] |= b->operands[k] >= base ? 1 : dep[b->operands[k]];
      if (dep[b->id] || b->op != KILN_OP_ALL_REDUCE || b->noperands != 1) continue;
      if (b->called[0] != a->called[0] || !same_groups(a, b)) continue;
      group[ng++] = b->id;
      dep[b->id] = 1; /* its users come after the combined one */
    }
    if (ng < 2) continue;
    kiln_id ops[16];
    kiln_shape shapes[16];
    for (uint32_t k = 0; k < ng; k++) {
      ops[k] = m->instrs[group[k]]->operands[0];
      shapes[k] = m->instrs[group[k]]->shape;
    }
    kiln_shape ts;
    if (kiln_shape_make_tuple(p->tx->scratch, &ts, shapes, ng)) {
      kiln_free(dep);
      return kiln__tx_oom(p->tx);
    }
    kiln_instr *t = kiln__b_make(&p->b, KILN_OP_ALL_REDUCE, &ts, ops, ng);
    kiln_attr *at = t ? kiln_instr_add_attr(m, t, KILN_ATTR_REPLICA_GROUPS) : NULL;
    if (at == NULL || kiln_instr_set_called(m, t, a->called, 1) ||
        kiln_instr_set_attr_int(m, t, KILN_ATTR_CHANNEL_ID, p->channel++) ||
        kiln_instr_set_attr_int(m, t, KILN_ATTR_USE_GLOBAL_DEVICE_IDS, 1)) {
      kiln_free(dep);
      return kiln__tx_oom(p->tx);
    }
    at->v.groups = kiln_instr_attr(a, KILN_ATTR_REPLICA_GROUPS)->v.groups;
    for (uint32_t k = 0; k < ng; k++) {
      kiln_id e = kiln__b_gte(&p->b, t->id, k);
      kiln_replace_all_uses(m, comp, group[k], e);
      m->instrs[group[k]]->comp = KILN_NO_ID; /* dropped below */
    }
  }
  kiln_free(dep);
  bool *keep = kiln_malloc((m->ninstrs + 1) * sizeof *keep);
  if (keep == NULL) return kiln__tx_oom(p->tx);
  for (uint32_t i = 0; i < m->ninstrs; i++) keep[i] = m->instrs[i]->comp != KILN_NO_ID;
  kiln_computation_compact(m, comp, keep);
  kiln_free(keep);
  return kiln_computation_sort(m, comp, p->tx->st);
}

/* ---- entry point --------------------------------------------------------- */

static int record(part *p, kiln_spmd_program *prog, const kiln_computation *c, const kiln_id *order,
                  uint32_t n0) {
  kiln_arena *a = prog->arena;
  uint32_t np = 0;
  for (uint32_t i = 0; i < n0; i++) {
    const kiln_instr *ins = p->m->instrs[order[i]];
    if (ins->op == KILN_OP_PARAMETER && ins->param_number >= np)
      np = (uint32_t)ins->param_number + 1;
  }
  prog->nparams = np;
  prog->param_shapes = kiln_arena_calloc(a, np ? np : 1, sizeof *prog->param_shapes);
  prog->param_shardings = kiln_arena_calloc(a, np ? np : 1, sizeof *prog->param_shardings);
  if (!prog->param_shapes || !prog->param_shardings) return KILN_ENOMEM;
  for (uint32_t j = 0; j < n0; j++) {
    const kiln_instr *ins = p->m->instrs[order[j]];
    if (ins->op != KILN_OP_PARAMETER) continue;
    uint32_t i = (uint32_t)ins->param_number;
    if (kiln_shape_copy(a, &prog->param_shapes[i], &ins->shape)) return KILN_ENOMEM;
    spmd_tiling *t = p->lt[ins->id] ? p->lt[ins->id] : replicated(p, 0);
    if ((prog->param_shardings[i] = kiln__tiling_to_sharding(a, t)) == NULL) return KILN_ENOMEM;
  }
  const kiln_instr *root = p->m->instrs[c->root];
  prog->result_is_tuple = kiln_shape_is_tuple(&root->shape);
  uint32_t nr = prog->result_is_tuple ? root->shape.rank : 1;
  prog->nresults = nr;
  prog->result_shapes = kiln_arena_calloc(a, nr ? nr : 1, sizeof *prog->result_shapes);
  prog->result_shardings = kiln_arena_calloc(a, nr ? nr : 1, sizeof *prog->result_shardings);
  if (!prog->result_shapes || !prog->result_shardings) return KILN_ENOMEM;
  for (uint32_t i = 0; i < nr; i++) {
    const kiln_shape *s = prog->result_is_tuple ? &root->shape.tuple[i] : &root->shape;
    if (kiln_shape_copy(a, &prog->result_shapes[i], s)) return KILN_ENOMEM;
    spmd_tiling *t =
        prog->result_is_tuple ? (p->le[root->id] ? p->le[root->id][i] : NULL) : p->lt[root->id];
    if (t == NULL) t = replicated(p, is_array(s) ? s->rank : 0);
    if (!is_array(s) && !kiln__tiling_is_replicated(t)) return KILN_EUNIMPL;
    if ((prog->result_shardings[i] = kiln__tiling_to_sharding(a, t)) == NULL) return KILN_ENOMEM;
  }
  return 0;
}

static int dump(const kiln_module *m, const char *dir, const char *name, kiln_status *st) {
  if (dir == NULL) return 0;
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return kiln_status_set(st, KILN_EIO, dir, "cannot create dump directory: %s", strerror(errno));
  size_t len;
  char *text = kiln_module_print(m, &len);
  if (text == NULL) return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory dumping");
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.hlo", dir, name);
  FILE *f = fopen(path, "wb");
  int rc = 0;
  if (f == NULL || fwrite(text, 1, len, f) != len) rc = KILN_EIO;
  if (f && fclose(f) != 0) rc = KILN_EIO;
  kiln_free(text);
  return rc ? kiln_status_set(st, rc, path, "cannot write dump") : 0;
}

static int64_t max_channel(const kiln_module *m) {
  int64_t c = 0;
  for (uint32_t i = 0; i < m->ninstrs; i++) {
    int64_t v = kiln_instr_attr_int(m->instrs[i], KILN_ATTR_CHANNEL_ID, 0);
    if (v > c) c = v;
  }
  return c;
}

/* Builds every instruction listed in order[0..n0) (a snapshot of the
 * computation being built, p->b.comp) after the originals. */
static int build_all(part *p, const kiln_id *order, uint32_t n0) {
  int rc = 0;
  for (uint32_t i = 0; i < n0 && rc == 0; i++) rc = build(p, p->m->instrs[order[i]]);
  return rc;
}

/* Drops the originals from comp, roots it at the local root, strips the
 * shardings and combines all-reduces. */
static int finish_comp(part *p, uint32_t comp, const kiln_id *order, uint32_t n0,
                       kiln_id old_root) {
  kiln_module *m = p->m;
  kiln_computation *c = m->comps[comp];
  bool *keep = kiln_calloc(m->ninstrs + 1, sizeof *keep);
  if (keep == NULL) return kiln__tx_oom(p->tx);
  for (uint32_t i = 0; i < c->ninstrs; i++)
    keep[c->instrs[i]] = m->instrs[c->instrs[i]]->comp != KILN_NO_ID;
  for (uint32_t i = 0; i < n0; i++) {
    keep[order[i]] = false;
    m->instrs[order[i]]->comp = KILN_NO_ID;
  }
  kiln_computation_compact(m, comp, keep);
  kiln_free(keep);
  c->root = p->local[old_root];
  for (uint32_t i = 0; i < c->ninstrs; i++)
    kiln__b_drop_attr(m->instrs[c->instrs[i]], KILN_ATTR_SHARDING);
  return combine(p, comp);
}

/* Partitions a called computation (a loop's condition or body) in place. */
static int partition_sub(part *p, uint32_t comp) {
  kiln_computation *c = p->m->comps[comp];
  uint32_t n0 = c->ninstrs;
  kiln_id *order = kiln_arena_memdup(p->a, c->instrs, (n0 ? n0 : 1) * sizeof *order);
  if (order == NULL) return kiln__tx_oom(p->tx);
  kiln__b saved = p->b;
  kiln_id saved_pid = p->pid;
  p->b.comp = comp;
  p->pid = KILN_NO_ID;
  kiln_id old_root = c->root;
  int rc = build_all(p, order, n0);
  /* A tuple root other than a tuple instruction (the state passed through,
   * a nested loop's or conditional's result) returns the tilings
   * propagation gave it, element by element. */
  const kiln_instr *r = old_root != KILN_NO_ID ? p->m->instrs[old_root] : NULL;
  if (rc == 0 && r && kiln_shape_is_tuple(&r->shape) && r->op != KILN_OP_TUPLE) {
    spmd_tiling *w, **e;
    if ((rc = wanted(p, r, &w, &e)) == 0 && e) p->local[old_root] = as_elems(p, old_root, e);
    if (rc) p->tx->err = rc;
  }
  if (rc == 0) rc = finish_comp(p, comp, order, n0, old_root);
  p->b = saved;
  p->pid = saved_pid;
  return rc;
}

static int partition_entry(part *p, kiln_spmd_program *prog) {
  kiln_module *m = p->m;
  kiln_computation *c = m->comps[m->entry];
  uint32_t n0 = c->ninstrs;
  kiln_id *order = kiln_arena_memdup(p->a, c->instrs, (n0 ? n0 : 1) * sizeof *order);
  size_t cap = m->ninstrs + 1;
  p->local = kiln_arena_alloc(p->a, cap * sizeof *p->local);
  p->lt = kiln_arena_calloc(p->a, cap, sizeof *p->lt);
  p->le = kiln_arena_calloc(p->a, cap, sizeof *p->le);
  p->cached = kiln_arena_calloc(p->a, cap, sizeof *p->cached);
  p->ctile = kiln_arena_calloc(p->a, cap, sizeof *p->ctile);
  p->manual = kiln_arena_calloc(p->a, cap, sizeof *p->manual);
  if (!order || !p->local || !p->lt || !p->le || !p->cached || !p->ctile || !p->manual)
    return kiln__tx_oom(p->tx);
  for (size_t i = 0; i < cap; i++) p->local[i] = KILN_NO_ID;
  p->ncap = cap;
  int rc = build_all(p, order, n0);
  if (rc) return rc;
  kiln_id old_root = c->root;
  if ((rc = record(p, prog, c, order, n0)))
    return rc == KILN_EUNIMPL ? fail(p, m->instrs[old_root], rc,
                                     "a token or nested tuple result split across devices")
                              : kiln__tx_oom(p->tx);
  if ((rc = finish_comp(p, m->entry, order, n0, old_root))) return rc;
  m->num_partitions = p->n;
  m->entry_layout = NULL;
  m->naliases = 0;
  m->has_aliases = false;
  return 0;
}

int kiln_spmd_partition(const kiln_module *src, int64_t partitions, const char *dump_dir,
                        kiln_spmd_program **out, kiln_status *st) {
  return kiln_spmd_partition_mesh(src, 1, partitions, dump_dir, out, st);
}

int kiln_spmd_partition_mesh(const kiln_module *src, int64_t replicas, int64_t partitions,
                             const char *dump_dir, kiln_spmd_program **out, kiln_status *st) {
  return kiln_spmd_partition_opts(src, replicas, partitions, dump_dir, NULL, out, st);
}

int kiln_spmd_partition_opts(const kiln_module *src, int64_t replicas, int64_t partitions,
                             const char *dump_dir, const kiln_spmd_options *opts,
                             kiln_spmd_program **out, kiln_status *st) {
  *out = NULL;
  if (replicas < 1 || replicas > 4096 || partitions < 1 || replicas * partitions > 4096)
    return kiln_status_set(st, KILN_EINVAL, "spmd",
                           "a mesh of %lld replicas x %lld partitions (at most 4096 devices)",
                           (long long)replicas, (long long)partitions);
  kiln_spmd_program *prog = kiln_calloc(1, sizeof *prog);
  if (prog == NULL || (prog->arena = kiln_arena_create()) == NULL) {
    kiln_free(prog);
    return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
  }
  prog->partitions = partitions;
  prog->replicas = replicas;
  int rc = kiln_module_clone(src, &prog->module);
  if (rc) {
    kiln_spmd_program_destroy(prog);
    return kiln_status_set(st, rc, "spmd", "out of memory");
  }
  kiln_module *m = prog->module;
  if ((rc = kiln_spmd_propagate(m, partitions, st)) ||
      (rc = dump(m, dump_dir, "spmd-propagated", st))) {
    kiln_spmd_program_destroy(prog);
    return rc;
  }
  kiln__tx tx;
  rc = kiln__tx_init(&tx, m, "spmd", st);
  part p = {.m = m,
            .tx = &tx,
            .b = {&tx, m->entry},
            .a = kiln_arena_create(),
            .n = partitions,
            .pid = KILN_NO_ID,
            .channel = max_channel(m) + 1,
            .ar = KILN_NO_ID};
  if (opts)
    p.opts = *opts;
  else
    kiln_spmd_options_init(&p.opts);
  if (rc == 0 && p.a == NULL) rc = kiln__tx_oom(&tx);
  if (rc == 0) rc = partition_entry(&p, prog);
  if (rc == 0 && tx.err) rc = tx.err;
  kiln__tx_fini(&tx);
  kiln_arena_destroy(p.a);
  if (rc == 0) rc = kiln__spmd_replicate(m, replicas, partitions, st);
  if (rc == 0) rc = kiln_module_verify(m, NULL, st);
  if (rc == 0) rc = dump(m, dump_dir, "spmd-partitioned", st);
  if (rc) {
    if (kiln_status_is_ok(st)) kiln_status_set(st, rc, "spmd", "partitioning failed");
    kiln_spmd_program_destroy(prog);
    return rc;
  }
  kiln_spmd_count_collectives(m, &prog->stats);
  *out = prog;
  return 0;
}

void kiln_spmd_program_destroy(kiln_spmd_program *p) {
  if (p == NULL) return;
  kiln_module_destroy(p->module);
  kiln_arena_destroy(p->arena);
  kiln_free(p);
}
