/* vmap rules for contractions, reductions, indexing and control flow.
 *
 * dot: a batch dimension on both sides becomes one more dot batch
 * dimension; on one side only it is a free dimension, moved to the front
 * afterwards. convolution folds the batch into the input batch (lhs only)
 * or into the output features (rhs), or, with both batched, into the
 * features of a grouped convolution (JAX's rule). gather and scatter gain
 * an operand/indices batching dimension pair. Dynamic slices with batched
 * indices become gathers/scatters. Reductions shift their dimensions; a
 * batched init value reduces with the identity, then combines.
 *
 * Loops find a fixed point of which state leaves are batched (a leaf fed by
 * a batched value must be batched at entry too). A batched loop predicate
 * runs the loop while any batch element wants to and updates only those
 * whose predicate holds. A batched conditional predicate runs every branch
 * and selects per batch element, as jax.vmap does.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/arena.h"
#include "compiler/transforms/rules.h"

#define B (&c->b)

static kiln_i64s list(const kiln_instr *ins, kiln_attr_key k) {
  const kiln_i64s *l = kiln_instr_attr_ints(ins, k);
  kiln_i64s e = {NULL, 0};
  return l ? *l : e;
}

/* l + 1, with 0 in front when `front`. */
static kiln_i64s shifted(kiln__tx *tx, kiln_i64s l, bool front) {
  kiln_i64s r = {kiln__b_i64s(tx, l.n + 1), 0};
  if (r.v == NULL) return r;
  if (front) r.v[r.n++] = 0;
  for (uint32_t i = 0; i < l.n; i++) r.v[r.n++] = l.v[i] + 1;
  return r;
}

static int set_list(kiln__tx *tx, kiln_instr *ins, kiln_attr_key k, kiln_i64s l) {
  if (kiln_instr_set_attr_ints(tx->m, ins, k, l.v, l.n)) return kiln__tx_oom(tx);
  return 0;
}

static int cannot(kiln__bt *c, const kiln_instr *ins, const char *why) {
  char where[KILN_STATUS_WHERE_MAX];
  kiln_instr_where(c->tx->m, ins, where, sizeof where);
  return kiln__tx_fail(c->tx, KILN_EUNIMPL, ins, "%s: op %s (%s) cannot be batched: %s",
                       c->tx->name, kiln_opcode_name(ins->op), where, why);
}

/* ---- dot ----------------------------------------------------------------- */

int kiln__batch_dot(kiln__bt *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  bool bl = kiln__bt_batched(c, ins, 0), br = kiln__bt_batched(c, ins, 1);
  kiln_i64s lb = list(ins, KILN_ATTR_LHS_BATCH_DIMS),
            lc = list(ins, KILN_ATTR_LHS_CONTRACTING_DIMS);
  kiln_i64s rb = list(ins, KILN_ATTR_RHS_BATCH_DIMS),
            rc = list(ins, KILN_ATTR_RHS_CONTRACTING_DIMS);
  kiln_id o[2] = {c->val[kiln__bt_slot(c, ins->operands[0])],
                  c->val[kiln__bt_slot(c, ins->operands[1])]};
  kiln_instr *d = kiln__b_clone_start(B, ins, o, 2);
  if (d == NULL) return tx->err;
  if (bl && (set_list(tx, d, KILN_ATTR_LHS_BATCH_DIMS, shifted(tx, lb, br)) ||
             set_list(tx, d, KILN_ATTR_LHS_CONTRACTING_DIMS, shifted(tx, lc, false))))
    return tx->err;
  if (br && (set_list(tx, d, KILN_ATTR_RHS_BATCH_DIMS, shifted(tx, rb, bl)) ||
             set_list(tx, d, KILN_ATTR_RHS_CONTRACTING_DIMS, shifted(tx, rc, false))))
    return tx->err;
  kiln_id r = kiln__b_finish(B, d);
  if (!(bl && br)) {
    uint32_t lrank = tx->m->instrs[ins->operands[0]]->shape.rank;
    int64_t at = bl ? (int64_t)lb.n : (int64_t)(lb.n + lrank - lb.n - lc.n);
    r = kiln__bt_move_axis(B, r, at, 0);
  }
  kiln__bt_set(c, ins, r, true);
  return tx->err;
}

/* ---- reductions ----------------------------------------------------------- */

/* The identity of a recognised reducer, as a scalar of type t. */
static kiln_id identity(kiln__b *b, kiln__red k, kiln_dtype t) {
  bool fl = kiln_dtype_is_float(t);
  int bits = kiln_dtype_bits(t);
  switch (k) {
  case KILN__RED_ADD: return kiln__b_scalar(b, t, 0);
  case KILN__RED_MUL: return kiln__b_scalar(b, t, 1);
  case KILN__RED_AND: return kiln__b_scalar(b, t, 1);
  case KILN__RED_OR: return kiln__b_scalar(b, t, 0);
  case KILN__RED_MAX:
    if (fl) return kiln__b_scalar(b, t, -INFINITY);
    if (t == KILN_PRED || kiln_dtype_is_unsigned_int(t)) return kiln__b_iscalar(b, t, 0);
    return kiln__b_iscalar(b, t, bits >= 64 ? INT64_MIN : -(INT64_C(1) << (bits - 1)));
  case KILN__RED_MIN:
    if (fl) return kiln__b_scalar(b, t, INFINITY);
    if (t == KILN_PRED) return kiln__b_iscalar(b, t, 1);
    if (kiln_dtype_is_unsigned_int(t)) return kiln__b_iscalar(b, t, -1);
    return kiln__b_iscalar(b, t, bits >= 64 ? INT64_MAX : (INT64_C(1) << (bits - 1)) - 1);
  default: return KILN_NO_ID;
  }
}

static kiln_opcode red_op(kiln__red k) {
  switch (k) {
  case KILN__RED_ADD: return KILN_OP_ADD;
  case KILN__RED_MUL: return KILN_OP_MULTIPLY;
  case KILN__RED_MAX: return KILN_OP_MAXIMUM;
  case KILN__RED_MIN: return KILN_OP_MINIMUM;
  case KILN__RED_AND: return KILN_OP_AND;
  case KILN__RED_OR: return KILN_OP_OR;
  default: return KILN_OP_INVALID;
  }
}

/* Operands of a reduce/reduce-window with batched inputs: inputs batched,
 * inits as they are, or the reducer's identity when an init is batched
 * (*late then says to combine the init into the result afterwards). */
static kiln_id *reduce_operands(kiln__bt *c, const kiln_instr *ins, kiln_id *late) {
  uint32_t n = ins->noperands / 2;
  kiln_id *ops = kiln__b_ids(c->tx, ins->noperands);
  if (ops == NULL) return NULL;
  *late = KILN_NO_ID;
  for (uint32_t k = 0; k < n; k++) ops[k] = kiln__bt_operand(c, ins, k);
  for (uint32_t k = n; k < 2 * n; k++) {
    ops[k] = c->val[kiln__bt_slot(c, ins->operands[k])];
    if (!kiln__bt_batched(c, ins, k)) continue;
    kiln__red rk =
        ins->ncalled == 1 ? kiln__tf_reducer_kind(c->tx->m, ins->called[0]) : KILN__RED_OTHER;
    if (n != 1 || red_op(rk) == KILN_OP_INVALID) {
      cannot(c, ins, "a batched init value needs a plain add/multiply/max/min/and/or reducer");
      return NULL;
    }
    *late = ops[k];
    ops[k] = identity(B, rk, ins->shape.dtype);
  }
  return ops;
}

static kiln_id combine_late(kiln__bt *c, const kiln_instr *ins, kiln_id r, kiln_id late) {
  if (late == KILN_NO_ID) return r;
  const kiln_shape *s = kiln__b_shape(c->tx, r);
  int64_t zero = 0;
  kiln_id init = kiln__b_broadcast(B, late, s->dims, s->rank, &zero, 1);
  return kiln__b_bin(B, red_op(kiln__tf_reducer_kind(c->tx->m, ins->called[0])), r, init);
}

int kiln__batch_reduce(kiln__bt *c, const kiln_instr *ins) {
  kiln_id late;
  kiln_id *ops = reduce_operands(c, ins, &late);
  kiln_instr *r = ops ? kiln__b_clone_start(B, ins, ops, ins->noperands) : NULL;
  if (r == NULL || set_list(c->tx, r, KILN_ATTR_DIMENSIONS,
                            shifted(c->tx, list(ins, KILN_ATTR_DIMENSIONS), false)))
    return c->tx->err;
  kiln__bt_set(c, ins, combine_late(c, ins, kiln__b_finish(B, r), late), true);
  return c->tx->err;
}

/* A copy of the op's window with a size-1 window over the batch in front. */
static int batched_window(kiln__bt *c, const kiln_instr *src, kiln_instr *dst) {
  const kiln_attr *a = kiln_instr_attr(src, KILN_ATTR_WINDOW);
  if (a == NULL || a->v.window == NULL) return cannot(c, src, "no window");
  const kiln_window *w = a->v.window;
  kiln_window *nw = kiln_arena_calloc(c->tx->m->arena, 1, sizeof *nw);
  kiln_window_dim *nd = nw ? kiln_arena_calloc(c->tx->m->arena, w->rank + 1, sizeof *nd) : NULL;
  kiln_attr *na = nd ? kiln_instr_add_attr(c->tx->m, dst, KILN_ATTR_WINDOW) : NULL;
  if (na == NULL) return kiln__tx_oom(c->tx);
  nd[0] = (kiln_window_dim){1, 1, 0, 0, 1, 1, false};
  if (w->rank) memcpy(nd + 1, w->dims, w->rank * sizeof *nd);
  nw->rank = w->rank + 1;
  nw->dims = nd;
  na->v.window = nw;
  return 0;
}

int kiln__batch_reduce_window(kiln__bt *c, const kiln_instr *ins) {
  kiln_id late;
  kiln_id *ops = reduce_operands(c, ins, &late);
  kiln_instr *r = ops ? kiln__b_clone_start(B, ins, ops, ins->noperands) : NULL;
  if (r == NULL || batched_window(c, ins, r)) return c->tx->err;
  kiln__bt_set(c, ins, combine_late(c, ins, kiln__b_finish(B, r), late), true);
  return c->tx->err;
}

int kiln__batch_select_and_scatter(kiln__bt *c, const kiln_instr *ins) {
  if (kiln__bt_batched(c, ins, 2)) return cannot(c, ins, "the init value is batched");
  kiln_id o[3] = {kiln__bt_operand(c, ins, 0), kiln__bt_operand(c, ins, 1),
                  c->val[kiln__bt_slot(c, ins->operands[2])]};
  kiln_instr *r = kiln__b_clone_start(B, ins, o, 3);
  if (r == NULL || batched_window(c, ins, r)) return c->tx->err;
  kiln__bt_set(c, ins, kiln__b_finish(B, r), true);
  return c->tx->err;
}

/* ---- indexing ------------------------------------------------------------- */

/* Index operands from..n as one [B, n-from] s32 array, each clamped to
 * [0, hi[k]] when hi is given. */
static kiln_id stack_indices(kiln__bt *c, const kiln_instr *ins, uint32_t from, const int64_t *hi) {
  uint32_t n = ins->noperands - from;
  kiln_id *cols = kiln__b_ids(c->tx, n);
  if (cols == NULL) return KILN_NO_ID;
  int64_t one[2] = {c->bsize, 1};
  for (uint32_t k = 0; k < n; k++) {
    kiln_id v = kiln__b_as(B, kiln__bt_operand(c, ins, from + k), KILN_S32);
    if (hi) {
      kiln_id o[3] = {kiln__b_iscalar(B, KILN_S32, 0), v,
                      kiln__b_iscalar(B, KILN_S32, hi[k] < 0 ? 0 : hi[k])};
      v = kiln__b_op(B, KILN_OP_CLAMP, o, 3);
    }
    cols[k] = kiln__b_reshape(B, v, one, 2);
  }
  return kiln__b_concat(B, cols, n, 1);
}

static kiln__gdims slice_gdims(kiln__tx *tx, uint32_t rank, const int64_t *sizes) {
  kiln__gdims g;
  memset(&g, 0, sizeof g);
  g.offset = (kiln_i64s){kiln__b_i64s(tx, rank), rank};
  g.start_map = (kiln_i64s){kiln__b_i64s(tx, rank), rank};
  g.obatch = (kiln_i64s){kiln__b_i64s(tx, 1), 1};
  g.ibatch = (kiln_i64s){kiln__b_i64s(tx, 1), 1};
  g.sizes = (kiln_i64s){kiln__b_i64s(tx, rank + 1), rank + 1};
  g.ivd = 1;
  if (tx->err) return g;
  g.sizes.v[0] = 1;
  for (uint32_t d = 0; d < rank; d++) {
    g.offset.v[d] = d + 1;
    g.start_map.v[d] = d + 1;
    g.sizes.v[d + 1] = sizes ? sizes[d] : 0;
  }
  return g;
}

static bool indices_batched(kiln__bt *c, const kiln_instr *ins, uint32_t from) {
  for (uint32_t k = from; k < ins->noperands; k++)
    if (kiln__bt_batched(c, ins, k)) return true;
  return false;
}

int kiln__batch_dynamic_slice(kiln__bt *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  uint32_t r = ins->shape.rank;
  const kiln_i64s *sizes = kiln_instr_attr_ints(ins, KILN_ATTR_DYNAMIC_SLICE_SIZES);
  if (sizes == NULL || sizes->n != r) return cannot(c, ins, "bad dynamic_slice_sizes");
  kiln_id x = kiln__bt_operand(c, ins, 0);
  if (!indices_batched(c, ins, 1)) {
    kiln_id *idx = kiln__b_ids(tx, r + 1);
    int64_t *sz = kiln__b_i64s(tx, r + 1);
    if (idx == NULL || sz == NULL) return tx->err;
    kiln_dtype it = r ? tx->m->instrs[ins->operands[1]]->shape.dtype : KILN_S32;
    idx[0] = kiln__b_iscalar(B, it, 0);
    sz[0] = c->bsize;
    for (uint32_t k = 0; k < r; k++)
      idx[k + 1] = c->val[kiln__bt_slot(c, ins->operands[k + 1])], sz[k + 1] = sizes->v[k];
    kiln__bt_set(c, ins, kiln__b_dyn_slice(B, x, idx, r + 1, sz), true);
    return tx->err;
  }
  kiln__gdims g = slice_gdims(tx, r, sizes->v);
  kiln_id idx = stack_indices(c, ins, 1, NULL);
  kiln__bt_set(c, ins, kiln__tf_gather(B, x, idx, &g), true);
  return tx->err;
}

int kiln__batch_dynamic_update_slice(kiln__bt *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  uint32_t r = ins->shape.rank;
  kiln_id x = kiln__bt_operand(c, ins, 0), u = kiln__bt_operand(c, ins, 1);
  if (!indices_batched(c, ins, 2)) {
    kiln_id *idx = kiln__b_ids(tx, r + 1);
    if (idx == NULL) return tx->err;
    kiln_dtype it = r ? tx->m->instrs[ins->operands[2]]->shape.dtype : KILN_S32;
    idx[0] = kiln__b_iscalar(B, it, 0);
    for (uint32_t k = 0; k < r; k++) idx[k + 1] = c->val[kiln__bt_slot(c, ins->operands[k + 2])];
    kiln__bt_set(c, ins, kiln__b_dyn_update(B, x, u, idx, r + 1), true);
    return tx->err;
  }
  /* scatter drops out-of-bounds updates where dynamic-update-slice shifts
   * them in: clamp the starts as dynamic-update-slice does. */
  const kiln_shape *xs = &tx->m->instrs[ins->operands[0]]->shape;
  const kiln_shape *us = &tx->m->instrs[ins->operands[1]]->shape;
  int64_t *hi = kiln__b_i64s(tx, r);
  if (hi == NULL) return tx->err;
  for (uint32_t d = 0; d < r; d++) hi[d] = xs->dims[d] - us->dims[d];
  kiln__gdims g = slice_gdims(tx, r, NULL);
  g.collapsed.n = 0;
  kiln_id idx = stack_indices(c, ins, 2, hi);
  uint32_t repl = kiln__b_reducer(tx, KILN_OP_INVALID, ins->shape.dtype);
  kiln__bt_set(c, ins, kiln__tf_scatter(B, x, idx, u, &g, repl), true);
  return tx->err;
}

int kiln__batch_gather(kiln__bt *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  kiln_id o[2] = {kiln__bt_operand(c, ins, 0), kiln__bt_operand(c, ins, 1)};
  kiln__gdims g = kiln__tf_gather_dims(ins);
  kiln__gdims n = g;
  n.offset = shifted(tx, g.offset, false);
  n.collapsed = shifted(tx, g.collapsed, false);
  n.start_map = shifted(tx, g.start_map, false);
  n.obatch = shifted(tx, g.obatch, true);
  n.ibatch = shifted(tx, g.ibatch, true);
  n.ivd = g.ivd + 1;
  n.sizes = (kiln_i64s){kiln__b_i64s(tx, g.sizes.n + 1), g.sizes.n + 1};
  if (tx->err) return tx->err;
  n.sizes.v[0] = 1;
  if (g.sizes.n) memcpy(n.sizes.v + 1, g.sizes.v, g.sizes.n * sizeof *g.sizes.v);
  kiln__bt_set(c, ins, kiln__tf_gather(B, o[0], o[1], &n), true);
  return tx->err;
}

int kiln__batch_scatter(kiln__bt *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  kiln_id *ops = kiln__b_ids(tx, ins->noperands);
  if (ops == NULL) return tx->err;
  for (uint32_t k = 0; k < ins->noperands; k++) ops[k] = kiln__bt_operand(c, ins, k);
  kiln__gdims g = kiln__tf_scatter_dims(ins);
  kiln_instr *s = kiln__b_clone_start(B, ins, ops, ins->noperands);
  if (s == NULL || set_list(tx, s, KILN_ATTR_UPDATE_WINDOW_DIMS, shifted(tx, g.offset, false)) ||
      set_list(tx, s, KILN_ATTR_INSERTED_WINDOW_DIMS, shifted(tx, g.collapsed, false)) ||
      set_list(tx, s, KILN_ATTR_SCATTER_DIMS_TO_OPERAND_DIMS, shifted(tx, g.start_map, false)) ||
      set_list(tx, s, KILN_ATTR_INPUT_BATCHING_DIMS, shifted(tx, g.obatch, true)) ||
      set_list(tx, s, KILN_ATTR_SCATTER_INDICES_BATCHING_DIMS, shifted(tx, g.ibatch, true)) ||
      kiln_instr_set_attr_int(tx->m, s, KILN_ATTR_INDEX_VECTOR_DIM, g.ivd + 1))
    return tx->err ? tx->err : kiln__tx_oom(tx);
  kiln__bt_set(c, ins, kiln__b_finish(B, s), true);
  return tx->err;
}

/* ---- convolution ----------------------------------------------------------- */

/* Merges dimension src of v into dimension dst (src becoming the major
 * part); returns the value, with the merged dimension's index in *at. */
static kiln_id merge_axis(kiln__b *b, kiln_id v, int64_t src, int64_t dst, int64_t *at) {
  if (b->tx->err) return KILN_NO_ID;
  int64_t to = dst > src ? dst - 1 : dst;
  v = kiln__bt_move_axis(b, v, src, to);
  const kiln_shape *s = kiln__b_shape(b->tx, v);
  int64_t *dims = kiln__b_i64s(b->tx, s->rank);
  if (dims == NULL) return KILN_NO_ID;
  uint32_t o = 0;
  for (uint32_t d = 0; d < s->rank; d++) {
    if ((int64_t)d == to) {
      dims[o++] = s->dims[d] * s->dims[d + 1];
      d++;
    } else {
      dims[o++] = s->dims[d];
    }
  }
  *at = to;
  return kiln__b_reshape(b, v, dims, o);
}

/* Splits dimension `axis` of v into (bsize, rest) and moves bsize first. */
static kiln_id split_axis(kiln__bt *c, kiln_id v, int64_t axis) {
  if (c->tx->err) return KILN_NO_ID;
  const kiln_shape *s = kiln__b_shape(c->tx, v);
  int64_t *dims = kiln__b_i64s(c->tx, s->rank + 1);
  if (dims == NULL) return KILN_NO_ID;
  uint32_t o = 0;
  for (uint32_t d = 0; d < s->rank; d++) {
    if ((int64_t)d == axis) {
      dims[o++] = c->bsize;
      dims[o++] = s->dims[d] / c->bsize;
    } else {
      dims[o++] = s->dims[d];
    }
  }
  return kiln__bt_move_axis(B, kiln__b_reshape(B, v, dims, o), axis, 0);
}

/* Dims of v with dimension `axis` split into the given parts. */
static kiln_id split_into(kiln__b *b, kiln_id v, int64_t axis, const int64_t *parts, uint32_t np) {
  if (b->tx->err) return KILN_NO_ID;
  const kiln_shape *s = kiln__b_shape(b->tx, v);
  int64_t *dims = kiln__b_i64s(b->tx, s->rank + np);
  if (dims == NULL) return KILN_NO_ID;
  uint32_t o = 0;
  for (uint32_t d = 0; d < s->rank; d++) {
    if ((int64_t)d != axis) {
      dims[o++] = s->dims[d];
      continue;
    }
    for (uint32_t k = 0; k < np; k++) dims[o++] = parts[k];
  }
  return kiln__b_reshape(b, v, dims, o);
}

/* Dims of v with the n dimensions from `axis` merged into one. */
static kiln_id merge_run(kiln__b *b, kiln_id v, int64_t axis, uint32_t n) {
  if (b->tx->err) return KILN_NO_ID;
  const kiln_shape *s = kiln__b_shape(b->tx, v);
  int64_t *dims = kiln__b_i64s(b->tx, s->rank);
  if (dims == NULL) return KILN_NO_ID;
  uint32_t o = 0;
  for (uint32_t d = 0; d < s->rank; d++) {
    if ((int64_t)d == axis) {
      int64_t p = 1;
      for (uint32_t k = 0; k < n; k++) p *= s->dims[d + k];
      dims[o++] = p;
      d += n - 1;
    } else {
      dims[o++] = s->dims[d];
    }
  }
  return kiln__b_reshape(b, v, dims, o);
}

/* A batched kernel of a convolution with G feature groups, the input not
 * batched: the kernel's output features (G, O/G) take the batch inside
 * each group, (G, B, O/G), so every group still reads its own inputs; the
 * result's features come out in that order and the batch moves first. */
static int grouped_batched_kernel(kiln__bt *c, const kiln_instr *ins, const kiln_conv_dims *cd,
                                  int64_t g) {
  kiln__tx *tx = c->tx;
  kiln_id l = c->val[kiln__bt_slot(c, ins->operands[0])],
          r = c->val[kiln__bt_slot(c, ins->operands[1])];
  int64_t ko = cd->kernel_out + 1, of = cd->out_feature;
  int64_t o = kiln__b_shape(tx, r)->dims[ko];
  int64_t kp[2] = {g, o / g};
  r = kiln__bt_move_axis(B, split_into(B, r, ko, kp, 2), 0, ko); /* ..., G, B, O/G, ... */
  r = merge_run(B, r, ko - 1, 3);
  kiln_id ops[2] = {l, r};
  kiln_id y = kiln__b_clone(B, ins, ops, 2);
  int64_t yp[3] = {g, c->bsize, o / g};
  y = kiln__bt_move_axis(B, split_into(B, y, of, yp, 3), of + 1, 0);
  kiln__bt_set(c, ins, merge_run(B, y, of + 1, 2), true);
  return tx->err;
}

int kiln__batch_convolution(kiln__bt *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  const kiln_attr *la = kiln_instr_attr(ins, KILN_ATTR_DIM_LABELS);
  if (la == NULL || la->v.conv == NULL) return cannot(c, ins, "no dim_labels");
  const kiln_conv_dims *cd = la->v.conv;
  int64_t fgc = kiln_instr_attr_int(ins, KILN_ATTR_FEATURE_GROUP_COUNT, 1);
  int64_t bgc = kiln_instr_attr_int(ins, KILN_ATTR_BATCH_GROUP_COUNT, 1);
  bool bl = kiln__bt_batched(c, ins, 0), br = kiln__bt_batched(c, ins, 1);
  kiln_id l = c->val[kiln__bt_slot(c, ins->operands[0])],
          r = c->val[kiln__bt_slot(c, ins->operands[1])];
  int64_t at;
  if (bgc != 1) return cannot(c, ins, "batch_group_count is not 1");
  if (bl && !br) {
    l = merge_axis(B, l, 0, cd->in_batch + 1, &at);
    kiln_id o[2] = {l, r};
    kiln_id y = kiln__b_clone(B, ins, o, 2);
    kiln__bt_set(c, ins, split_axis(c, y, cd->out_batch), true);
    return tx->err;
  }
  if (fgc != 1 && !bl) return grouped_batched_kernel(c, ins, cd, fgc);
  r = merge_axis(B, r, 0, cd->kernel_out + 1, &at);
  kiln_instr *y;
  if (bl) {
    /* batch elements become groups of their own: (b, g) is group b*G + g */
    l = merge_axis(B, l, 0, cd->in_feature + 1, &at);
    kiln_id o[2] = {l, r};
    y = kiln__b_clone_start(B, ins, o, 2);
    if (y && kiln_instr_set_attr_int(tx->m, y, KILN_ATTR_FEATURE_GROUP_COUNT, c->bsize * fgc))
      return kiln__tx_oom(tx);
  } else {
    kiln_id o[2] = {l, r};
    y = kiln__b_clone_start(B, ins, o, 2);
  }
  kiln__bt_set(c, ins, split_axis(c, kiln__b_finish(B, y), cd->out_feature), true);
  return tx->err;
}

/* ---- control flow ------------------------------------------------------------ */

static kiln__bsig *analyze(kiln__bt *c, const kiln_computation *comp, kiln__bsig *const *ps);

static kiln__bsig *all_batched(kiln__bt *c, const kiln_shape *s) {
  return kiln__bsig_make(c->tx, s, true);
}

/* The loop state's batching: the least fixed point above the init's. */
static kiln__bsig *loop_sig(kiln__bt *c, const kiln_instr *w, kiln__bsig *init, bool *pred_b) {
  kiln__tx *tx = c->tx;
  const kiln_computation *cond = kiln_module_computation(tx->m, w->called[0]);
  const kiln_computation *body = kiln_module_computation(tx->m, w->called[1]);
  kiln__bsig *s = init;
  for (int it = 0; it < 256 && tx->err == 0; it++) {
    kiln__bsig *out = analyze(c, body, &s);
    kiln__bsig *j = out ? kiln__bsig_join(tx, s, out) : NULL;
    if (j == NULL) return NULL;
    if (kiln__bsig_equal(j, s)) break;
    s = j;
  }
  kiln__bsig *p = analyze(c, cond, &s);
  *pred_b = p && kiln__bsig_any(p);
  if (*pred_b) s = all_batched(c, &w->shape);
  return tx->err ? NULL : s;
}

/* sigs[id - lo]: the batching of each value of ins's computation. */
static kiln__bsig *cond_sig(kiln__bt *c, const kiln_instr *ins, kiln__bsig **sigs, uint32_t lo) {
  if (kiln__bsig_any(sigs[ins->operands[0] - lo])) return all_batched(c, &ins->shape);
  kiln__bsig *r = kiln__bsig_make(c->tx, &ins->shape, false);
  for (uint32_t k = 0; r && k < ins->ncalled && k + 1 < ins->noperands; k++) {
    const kiln_computation *br = kiln_module_computation(c->tx->m, ins->called[k]);
    kiln__bsig *o = analyze(c, br, &sigs[ins->operands[k + 1] - lo]);
    r = o ? kiln__bsig_join(c->tx, r, o) : NULL;
  }
  return r;
}

/* Which leaves of the root of comp are batched, given its parameters'. */
static kiln__bsig *analyze(kiln__bt *c, const kiln_computation *comp, kiln__bsig *const *ps) {
  kiln__tx *tx = c->tx;
  const kiln_module *m = tx->m;
  if (comp == NULL) return kiln__tx_oom(tx), NULL;
  /* sig[id - lo] over comp's ids only: each call analyzes its callee
   * again, so module-sized tables made nesting cost its square. */
  uint32_t lo = UINT32_MAX, hi = 0;
  for (uint32_t i = 0; i < comp->ninstrs; i++) {
    if (comp->instrs[i] < lo) lo = comp->instrs[i];
    if (comp->instrs[i] > hi) hi = comp->instrs[i];
  }
  if (comp->ninstrs == 0) lo = hi = 0;
  kiln__bsig **sig = kiln_arena_calloc(tx->scratch, hi - lo + 1, sizeof *sig);
  if (sig == NULL) return kiln__tx_oom(tx), NULL;
  for (uint32_t i = 0; i < comp->ninstrs && tx->err == 0; i++) {
    const kiln_instr *ins = m->instrs[comp->instrs[i]];
    bool any = false;
    for (uint32_t k = 0; k < ins->noperands; k++) any |= kiln__bsig_any(sig[ins->operands[k] - lo]);
    kiln__bsig *g;
    switch (ins->op) {
    case KILN_OP_PARAMETER: g = ps[ins->param_number]; break;
    case KILN_OP_TUPLE:
      g = kiln__bsig_make(tx, &ins->shape, false);
      for (uint32_t k = 0; g && k < ins->noperands; k++) g->el[k] = *sig[ins->operands[k] - lo];
      break;
    case KILN_OP_GET_TUPLE_ELEMENT: {
      int64_t x = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, 0);
      const kiln__bsig *t = sig[ins->operands[0] - lo];
      g = x >= 0 && (uint64_t)x < t->n ? &t->el[x] : NULL;
      break;
    }
    case KILN_OP_WHILE: {
      bool pb;
      g = any ? loop_sig(c, ins, sig[ins->operands[0] - lo], &pb)
              : kiln__bsig_make(tx, &ins->shape, false);
      break;
    }
    case KILN_OP_CONDITIONAL: g = cond_sig(c, ins, sig, lo); break;
    case KILN_OP_CALL:
    case KILN_OP_FUSION: {
      kiln__bsig **args = kiln_arena_calloc(tx->scratch, ins->noperands + 1, sizeof *args);
      if (args == NULL) return kiln__tx_oom(tx), NULL;
      for (uint32_t k = 0; k < ins->noperands; k++) args[k] = sig[ins->operands[k] - lo];
      g = analyze(c, kiln_module_computation(m, ins->called[0]), args);
      break;
    }
    case KILN_OP_GET_DIMENSION_SIZE: g = kiln__bsig_make(tx, &ins->shape, false); break;
    case KILN_OP_OPTIMIZATION_BARRIER:
    case KILN_OP_DOMAIN:
    case KILN_OP_ADD_DEPENDENCY: g = sig[ins->operands[0] - lo]; break;
    default: g = kiln__bsig_make(tx, &ins->shape, any); break;
    }
    if (g == NULL) {
      if (tx->err == 0)
        kiln__tx_fail(tx, KILN_EINTERNAL, ins, "%s: batching analysis failed", tx->name);
      return NULL;
    }
    sig[ins->id - lo] = g;
  }
  const kiln_instr *root = kiln_computation_root(m, comp);
  return tx->err || root == NULL ? NULL : sig[root->id - lo];
}

/* Batches computation src into a new computation whose parameters are
 * batched as sigs; its root is coerced to `want` (when given). */
static uint32_t batch_comp(kiln__bt *c, const kiln_computation *src,
                           const kiln_shape *const *pshapes, kiln__bsig *const *sigs, uint32_t np,
                           const kiln__bsig *want, const char *suffix, kiln__bsig **got) {
  kiln__tx *tx = c->tx;
  char name[160];
  snprintf(name, sizeof name, "%.120s.%s", src->name, suffix);
  uint32_t comp;
  if (kiln__b_new_comp(tx, name, &comp)) return KILN_NO_ID;
  kiln__bt child;
  kiln_id *args = kiln__b_ids(tx, np);
  if (args == NULL || kiln__bt_init(&child, tx, comp, src, c->bsize)) return KILN_NO_ID;
  for (uint32_t k = 0; k < np; k++) {
    kiln_shape s;
    if (kiln__bt_shape(tx, pshapes[k], sigs[k], c->bsize, &s)) return KILN_NO_ID;
    args[k] = kiln__b_param(&child.b, k, &s, NULL);
  }
  if (kiln__batch_region(&child, args, sigs)) return KILN_NO_ID;
  const kiln_instr *root = kiln_computation_root(tx->m, src);
  kiln_id r = child.val[kiln__bt_slot(&child, root->id)];
  if (want) r = kiln__bt_coerce(&child, r, child.sig[kiln__bt_slot(&child, root->id)], want);
  if (got) *got = want ? (kiln__bsig *)want : child.sig[kiln__bt_slot(&child, root->id)];
  if (tx->err) return KILN_NO_ID;
  tx->m->comps[comp]->root = r;
  return comp;
}

uint32_t kiln__bt_comp(kiln__bt *c, const kiln_computation *src, const kiln_shape *const *pshapes,
                       kiln__bsig *const *sigs, uint32_t np, const kiln__bsig *want,
                       const char *suffix, kiln__bsig **got) {
  return batch_comp(c, src, pshapes, sigs, np, want, suffix, got);
}

/* select(pred[B], x, y) leaf by leaf over values batched everywhere. */
static kiln_id select_leaves(kiln__bt *c, kiln_id p, kiln_id x, kiln_id y) {
  if (c->tx->err) return KILN_NO_ID;
  const kiln_shape *s = kiln__b_shape(c->tx, x);
  if (kiln_shape_is_tuple(s)) {
    kiln_id *el = kiln__b_ids(c->tx, s->rank);
    if (el == NULL) return KILN_NO_ID;
    for (uint32_t i = 0; i < s->rank; i++)
      el[i] = select_leaves(c, p, kiln__b_gte(B, x, i), kiln__b_gte(B, y, i));
    return kiln__b_tuple(B, el, s->rank);
  }
  if (!kiln_shape_is_array(s)) return x;
  int64_t zero = 0;
  return kiln__b_select(B, kiln__b_broadcast(B, p, s->dims, s->rank, &zero, 1), x, y);
}

int kiln__batch_while(kiln__bt *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  const kiln_computation *cond = kiln_module_computation(tx->m, ins->called[0]);
  const kiln_computation *body = kiln_module_computation(tx->m, ins->called[1]);
  bool pb = false;
  kiln__bsig *s = loop_sig(c, ins, c->sig[kiln__bt_slot(c, ins->operands[0])], &pb);
  if (s == NULL) return tx->err;
  const kiln_shape *S = &ins->shape;
  uint32_t nbody = batch_comp(c, body, &S, &s, 1, s, "vmap", NULL);
  if (nbody == KILN_NO_ID) return tx->err;
  kiln_shape SB;
  if (kiln__bt_shape(tx, S, s, c->bsize, &SB)) return tx->err;
  if (pb) {
    /* Only batch elements whose predicate holds take the new state. */
    kiln__bt bc;
    kiln_id p;
    kiln_computation *bcomp = tx->m->comps[nbody];
    kiln_id newv = bcomp->root, old = KILN_NO_ID;
    for (uint32_t i = 0; i < bcomp->ninstrs; i++)
      if (tx->m->instrs[bcomp->instrs[i]]->op == KILN_OP_PARAMETER) old = bcomp->instrs[i];
    if (kiln__bt_init(&bc, tx, nbody, cond, c->bsize) || kiln__batch_region(&bc, &old, &s))
      return tx->err;
    p = kiln__bt_coerce(&bc, bc.val[kiln__bt_slot(&bc, kiln_computation_root(tx->m, cond)->id)],
                        bc.sig[kiln__bt_slot(&bc, kiln_computation_root(tx->m, cond)->id)],
                        &(kiln__bsig){true, 0, NULL});
    kiln__bt sel = bc;
    kiln_id r = select_leaves(&sel, p, newv, old);
    if (tx->err) return tx->err;
    bcomp->root = r;
  }
  kiln__bsig *pg = NULL;
  uint32_t ncond = batch_comp(c, cond, &S, &s, 1, NULL, "vmap", &pg);
  if (ncond == KILN_NO_ID) return tx->err;
  if (pg && pg->b) {
    kiln__b cb = {tx, ncond};
    kiln_id any = kiln__b_reduce(&cb, tx->m->comps[ncond]->root, kiln__b_scalar(&cb, KILN_PRED, 0),
                                 &(int64_t){0}, 1, KILN_OP_OR);
    if (tx->err) return tx->err;
    tx->m->comps[ncond]->root = any;
  }
  kiln_id init = kiln__bt_coerce(c, c->val[kiln__bt_slot(c, ins->operands[0])],
                                 c->sig[kiln__bt_slot(c, ins->operands[0])], s);
  kiln_instr *w = kiln__b_clone_start(B, ins, &init, 1);
  uint32_t cs[2] = {ncond, nbody};
  if (w && kiln_instr_set_called(tx->m, w, cs, 2)) return kiln__tx_oom(tx);
  /* with a batched predicate the loop runs as long as its longest element */
  if (w && pb) kiln__b_drop_attr(w, KILN_ATTR_BACKEND_CONFIG);
  c->val[kiln__bt_slot(c, ins->id)] = kiln__b_finish(B, w);
  c->sig[kiln__bt_slot(c, ins->id)] = s;
  return tx->err;
}

int kiln__batch_conditional(kiln__bt *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  uint32_t nb = ins->ncalled;
  if (ins->noperands != nb + 1) return cannot(c, ins, "operand count");
  if (!kiln__bt_batched(c, ins, 0)) {
    kiln__bsig *want = cond_sig(c, ins, c->sig, c->lo);
    uint32_t *nbr = kiln_arena_calloc(tx->scratch, nb + 1, sizeof *nbr);
    kiln_id *ops = kiln__b_ids(tx, nb + 1);
    if (want == NULL || nbr == NULL || ops == NULL) return tx->err ? tx->err : kiln__tx_oom(tx);
    ops[0] = c->val[kiln__bt_slot(c, ins->operands[0])];
    for (uint32_t k = 0; k < nb; k++) {
      const kiln_shape *ps = &tx->m->instrs[ins->operands[k + 1]]->shape;
      nbr[k] = batch_comp(c, kiln_module_computation(tx->m, ins->called[k]), &ps,
                          &c->sig[kiln__bt_slot(c, ins->operands[k + 1])], 1, want, "vmap", NULL);
      if (nbr[k] == KILN_NO_ID) return tx->err;
      ops[k + 1] = c->val[kiln__bt_slot(c, ins->operands[k + 1])];
    }
    kiln_instr *cd = kiln__b_clone_start(B, ins, ops, nb + 1);
    if (cd && kiln_instr_set_called(tx->m, cd, nbr, nb)) return kiln__tx_oom(tx);
    c->val[kiln__bt_slot(c, ins->id)] = kiln__b_finish(B, cd);
    c->sig[kiln__bt_slot(c, ins->id)] = want;
    return tx->err;
  }
  /* A batched predicate: run every branch and select per batch element. */
  kiln__bsig *all = all_batched(c, &ins->shape);
  kiln_id *res = kiln__b_ids(tx, nb);
  if (all == NULL || res == NULL) return tx->err;
  for (uint32_t k = 0; k < nb; k++) {
    const kiln_computation *br = kiln_module_computation(tx->m, ins->called[k]);
    kiln__bt child;
    kiln_id arg = c->val[kiln__bt_slot(c, ins->operands[k + 1])];
    if (kiln__bt_init(&child, tx, c->b.comp, br, c->bsize) ||
        kiln__batch_region(&child, &arg, &c->sig[kiln__bt_slot(c, ins->operands[k + 1])]))
      return tx->err;
    const kiln_instr *root = kiln_computation_root(tx->m, br);
    res[k] = kiln__bt_coerce(&child, child.val[kiln__bt_slot(&child, root->id)],
                             child.sig[kiln__bt_slot(&child, root->id)], all);
  }
  kiln_id sel = kiln__bt_operand(c, ins, 0), r;
  if (kiln__b_shape(tx, sel)->dtype == KILN_PRED) {
    r = nb == 2 ? select_leaves(c, sel, res[0], res[1]) : res[0];
  } else {
    /* out-of-range indices run the last branch */
    kiln_dtype it = kiln__b_shape(tx, sel)->dtype;
    kiln_id lo = kiln__b_cmp(B, sel, kiln__b_full_like(B, sel, 0), KILN_CMP_LT);
    kiln_id hi = kiln__b_cmp(B, sel, kiln__b_full_like(B, sel, nb - 1), KILN_CMP_GT);
    sel = kiln__b_select(B, kiln__b_bin(B, KILN_OP_OR, lo, hi), kiln__b_full_like(B, sel, nb - 1),
                         sel);
    r = res[nb - 1];
    for (uint32_t k = nb - 1; k-- > 0;) {
      kiln_id is = kiln__b_cmp(B, sel, kiln__b_full_like(B, sel, k), KILN_CMP_EQ);
      r = select_leaves(c, is, res[k], r);
    }
    (void)it;
  }
  c->val[kiln__bt_slot(c, ins->id)] = r;
  c->sig[kiln__bt_slot(c, ins->id)] = all;
  return tx->err;
}

int kiln__batch_call(kiln__bt *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  const kiln_computation *f =
      ins->ncalled == 1 ? kiln_module_computation(tx->m, ins->called[0]) : NULL;
  if (f == NULL) return cannot(c, ins, "no called computation");
  const kiln_shape **ps = kiln_arena_calloc(tx->scratch, ins->noperands + 1, sizeof *ps);
  kiln__bsig **sigs = kiln_arena_calloc(tx->scratch, ins->noperands + 1, sizeof *sigs);
  kiln_id *ops = kiln__b_ids(tx, ins->noperands);
  if (ps == NULL || sigs == NULL || ops == NULL) return tx->err ? tx->err : kiln__tx_oom(tx);
  for (uint32_t k = 0; k < ins->noperands; k++) {
    ps[k] = &tx->m->instrs[ins->operands[k]]->shape;
    sigs[k] = c->sig[kiln__bt_slot(c, ins->operands[k])];
    ops[k] = c->val[kiln__bt_slot(c, ins->operands[k])];
  }
  kiln__bsig *got = NULL;
  uint32_t nf = batch_comp(c, f, ps, sigs, ins->noperands, NULL, "vmap", &got);
  if (nf == KILN_NO_ID) return tx->err;
  kiln_instr *call = kiln__b_clone_start(B, ins, ops, ins->noperands);
  if (call && kiln_instr_set_called(tx->m, call, &nf, 1)) return kiln__tx_oom(tx);
  c->val[kiln__bt_slot(c, ins->id)] = kiln__b_finish(B, call);
  c->sig[kiln__bt_slot(c, ins->id)] = got;
  return tx->err;
}
