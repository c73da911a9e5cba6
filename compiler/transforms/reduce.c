/* Derivatives of reductions: reduce (sum, max, min, product; any other
 * reducer through tree.c), reduce-window (sum, max, min) and
 * select-and-scatter.
 *
 * The choices follow JAX. A max/min reduction splits the derivative equally
 * among the elements equal to the result (jax.grad of jnp.max at a tie). A
 * product passes each element the product of the others, computed from
 * prefix and suffix products, so zeros in the input are handled exactly (no
 * division). A windowed max/min passes everything to the first maximal
 * element of each window in row-major order: the forward rule carries
 * (value, tangent) pairs through a two-operand reduce-window that keeps the
 * running pick unless the candidate is strictly better, and the transpose is
 * select-and-scatter with a GE (LE) select, which picks the same element
 * (with dilations, a scatter at the positions the same pair reduce-window
 * picks).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compiler/transforms/rules.h"

#define B (&c->b)

static const kiln_shape *src_shape(const kiln__ad *c, const kiln_instr *ins, uint32_t k) {
  return &c->tx->m->instrs[ins->operands[k]]->shape;
}

static kiln__red reducer(const kiln__ad *c, const kiln_instr *ins) {
  return ins->ncalled == 1 ? kiln__tf_reducer_kind(c->tx->m, ins->called[0]) : KILN__RED_OTHER;
}

/* y (the reduce result, kept dims) broadcast back to x's shape. */
static kiln_id unreduce(kiln__ad *c, kiln_id y, const kiln_shape *xs, const kiln_i64s *dims) {
  int64_t *keep = kiln__b_i64s(c->tx, xs->rank);
  if (keep == NULL) return KILN_NO_ID;
  uint32_t nk = 0;
  for (uint32_t d = 0; d < xs->rank; d++) {
    bool red = false;
    for (uint32_t i = 0; i < dims->n; i++) red |= dims->v[i] == (int64_t)d;
    if (!red) keep[nk++] = d;
  }
  return kiln__b_broadcast(B, y, xs->dims, xs->rank, keep, nk);
}

/* Inclusive running product along the last dim of a rank-2 [K, R] value. */
static kiln_id cumprod_last(kiln__ad *c, kiln_id x) {
  const kiln_shape *s = kiln__b_shape(c->tx, x);
  int64_t r = s->dims[1];
  kiln_id one = kiln__b_scalar(B, s->dtype, 1);
  kiln_id o[2] = {x, one};
  kiln_instr *ins = kiln__b_start(B, KILN_OP_REDUCE_WINDOW, o, 2);
  if (ins == NULL) return KILN_NO_ID;
  kiln_window *w = kiln_arena_calloc(c->tx->m->arena, 1, sizeof *w);
  kiln_window_dim *wd = w ? kiln_arena_calloc(c->tx->m->arena, 2, sizeof *wd) : NULL;
  uint32_t comp = kiln__b_reducer(c->tx, KILN_OP_MULTIPLY, s->dtype);
  kiln_attr *a = wd ? kiln_instr_add_attr(c->tx->m, ins, KILN_ATTR_WINDOW) : NULL;
  if (a == NULL || kiln_instr_set_called(c->tx->m, ins, &comp, 1))
    return kiln__tx_oom(c->tx), KILN_NO_ID;
  w->rank = 2;
  w->dims = wd;
  for (int i = 0; i < 2; i++) wd[i] = (kiln_window_dim){1, 1, 0, 0, 1, 1, false};
  wd[1].size = r;
  wd[1].pad_lo = r - 1;
  a->v.window = w;
  return kiln__b_finish(B, ins);
}

/* For each element of x, the product of the other elements of its
 * reduction group (dims). */
static kiln_id prod_others(kiln__ad *c, kiln_id x, const kiln_i64s *dims) {
  kiln__tx *tx = c->tx;
  const kiln_shape *xs = kiln__b_shape(tx, x);
  uint32_t r = xs->rank;
  int64_t *perm = kiln__b_i64s(tx, r), *inv = kiln__b_i64s(tx, r), *tdims = kiln__b_i64s(tx, r);
  if (perm == NULL || inv == NULL || tdims == NULL) return KILN_NO_ID;
  uint32_t np = 0;
  int64_t K = 1, R = 1;
  for (uint32_t d = 0; d < r; d++) {
    bool red = false;
    for (uint32_t i = 0; i < dims->n; i++) red |= dims->v[i] == (int64_t)d;
    if (!red) perm[np++] = d, K *= xs->dims[d];
  }
  for (uint32_t i = 0; i < dims->n; i++) perm[np++] = dims->v[i], R *= xs->dims[dims->v[i]];
  for (uint32_t i = 0; i < r; i++) {
    inv[perm[i]] = i;
    tdims[i] = xs->dims[perm[i]];
  }
  kiln_dtype t = xs->dtype;
  int64_t kr[2] = {K, R}, lo[2] = {0, 1}, hi[2] = {0, 0}, rev = 1;
  kiln_id flat = kiln__b_reshape(B, kiln__b_transpose(B, x, perm, r), kr, 2);
  kiln_id one = kiln__b_scalar(B, t, 1);
  /* prefix[i] = prod(x[0..i)), suffix[i] = prod(x(i..R)) */
  kiln_id pre =
      kiln__b_slice_dim(B, cumprod_last(c, kiln__b_pad(B, flat, one, lo, hi, NULL)), 1, 0, R);
  kiln_id rflat = kiln__b_reverse(B, flat, &rev, 1);
  kiln_id suf =
      kiln__b_slice_dim(B, cumprod_last(c, kiln__b_pad(B, rflat, one, lo, hi, NULL)), 1, 0, R);
  kiln_id others = kiln__b_mul(B, pre, kiln__b_reverse(B, suf, &rev, 1));
  return kiln__b_transpose(B, kiln__b_reshape(B, others, tdims, r), inv, r);
}

static int reduce_sum_jvp(kiln__ad *c, const kiln_instr *ins) {
  kiln_id o[2] = {kiln__ad_tmat(c, ins, 0), kiln__ad_tmat(c, ins, 1)};
  c->tan[kiln__ad_slot(c, ins->id)] = kiln__b_clone_same(B, ins, o, 2);
  return c->tx->err;
}

/* Where x equals the result, and how many per group (at least 1). */
static void ties(kiln__ad *c, const kiln_instr *ins, kiln_id *loc, kiln_id *count, kiln_id *none) {
  const kiln_i64s *dims = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  kiln_id x = kiln__X(c, ins, 0), y = kiln__Y(c, ins);
  const kiln_shape *xs = src_shape(c, ins, 0);
  *loc = kiln__b_cmp(B, x, unreduce(c, y, xs, dims), KILN_CMP_EQ);
  kiln_id n = kiln__b_reduce_sum(B, kiln__b_convert(B, *loc, xs->dtype), dims->v, dims->n);
  *none = kiln__b_cmp(B, n, kiln__b_full_like(B, n, 0), KILN_CMP_EQ);
  *count = kiln__b_bin(B, KILN_OP_MAXIMUM, n, kiln__b_full_like(B, n, 1));
}

/* Reducers with rules of their own; the others go through a tree (tree.c). */
static bool known(const kiln_instr *ins, kiln__red k) {
  return ins->noperands == 2 &&
         (k == KILN__RED_ADD || k == KILN__RED_MAX || k == KILN__RED_MIN || k == KILN__RED_MUL);
}

int kiln__fwd_reduce(kiln__ad *c, const kiln_instr *ins) {
  if (!known(ins, reducer(c, ins))) return kiln__fwd_via(c, ins, kiln__tf_reduce_tree(c->tx, ins));
  kiln_id *ops = kiln__b_ids(c->tx, ins->noperands);
  if (ops == NULL) return c->tx->err;
  for (uint32_t k = 0; k < ins->noperands; k++) ops[k] = kiln__X(c, ins, k);
  c->prim[kiln__ad_slot(c, ins->id)] = kiln__b_clone_same(B, ins, ops, ins->noperands);
  return c->tx->err;
}

int kiln__jvp_reduce(kiln__ad *c, const kiln_instr *ins) {
  kiln__red k = reducer(c, ins);
  const kiln_i64s *dims = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  if (dims == NULL) return kiln__ad_not_diff(c, ins);
  if (!known(ins, k)) return kiln__jvp_via(c, ins, kiln__tf_reduce_tree(c->tx, ins));
  if (k == KILN__RED_ADD) return reduce_sum_jvp(c, ins);
  kiln_id x = kiln__X(c, ins, 0), init = kiln__X(c, ins, 1);
  kiln_id tx_ = kiln__ad_tmat(c, ins, 0), ti = kiln__T(c, ins, 1);
  if (k == KILN__RED_MAX || k == KILN__RED_MIN) {
    kiln_id loc, count, none;
    ties(c, ins, &loc, &count, &none);
    kiln_id picked = kiln__b_select(B, loc, tx_, kiln__b_zeros_like(B, tx_));
    kiln_id t = kiln__b_div(B, kiln__b_reduce_sum(B, picked, dims->v, dims->n), count);
    if (ti != KILN_NO_ID)
      t = kiln__b_add(
          B, t,
          kiln__b_select(B, none, kiln__b_broadcast_like(B, ti, t), kiln__b_zeros_like(B, t)));
    c->tan[kiln__ad_slot(c, ins->id)] = t;
    return c->tx->err;
  }
  if (k == KILN__RED_MUL) {
    kiln_id others = kiln__b_mul(B, prod_others(c, x, dims), kiln__b_broadcast_like(B, init, x));
    kiln_id t = kiln__b_reduce_sum(B, kiln__b_mul(B, tx_, others), dims->v, dims->n);
    if (ti != KILN_NO_ID) {
      kiln_id one = kiln__b_scalar(B, src_shape(c, ins, 0)->dtype, 1);
      kiln_id p = kiln__b_reduce(B, x, one, dims->v, dims->n, KILN_OP_MULTIPLY);
      t = kiln__b_add(B, t, kiln__b_mul(B, p, kiln__b_broadcast_like(B, ti, p)));
    }
    c->tan[kiln__ad_slot(c, ins->id)] = t;
    return c->tx->err;
  }
  return kiln__ad_not_diff(c, ins);
}

int kiln__vjp_reduce(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__red k = reducer(c, ins);
  const kiln_i64s *dims = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  if (!known(ins, k)) return kiln__vjp_via(c, ins, ct);
  if (dims == NULL) return kiln__ad_not_diff(c, ins);
  const kiln_shape *xs = src_shape(c, ins, 0);
  kiln_id x = kiln__X(c, ins, 0), init = kiln__X(c, ins, 1);
  int64_t *all = kiln__b_i64s(c->tx, ins->shape.rank);
  if (all == NULL) return c->tx->err;
  for (uint32_t d = 0; d < ins->shape.rank; d++) all[d] = d;
  if (k == KILN__RED_ADD) {
    kiln__ad_accum(c, ins, 0, unreduce(c, ct, xs, dims));
    if (kiln__ad_wants(c, ins, 1))
      kiln__ad_accum(c, ins, 1, kiln__b_reduce_sum(B, ct, all, ins->shape.rank));
    return c->tx->err;
  }
  if (k == KILN__RED_MAX || k == KILN__RED_MIN) {
    kiln_id loc, count, none;
    ties(c, ins, &loc, &count, &none);
    kiln_id share = unreduce(c, kiln__b_div(B, ct, count), xs, dims);
    kiln__ad_accum(c, ins, 0, kiln__b_select(B, loc, share, kiln__b_zeros_like(B, share)));
    if (kiln__ad_wants(c, ins, 1)) {
      kiln_id ci = kiln__b_select(B, none, ct, kiln__b_zeros_like(B, ct));
      kiln__ad_accum(c, ins, 1, kiln__b_reduce_sum(B, ci, all, ins->shape.rank));
    }
    return c->tx->err;
  }
  if (k == KILN__RED_MUL) {
    if (kiln__ad_wants(c, ins, 0)) {
      kiln_id others = kiln__b_mul(B, prod_others(c, x, dims), kiln__b_broadcast_like(B, init, x));
      kiln__ad_accum(c, ins, 0, kiln__b_mul(B, unreduce(c, ct, xs, dims), others));
    }
    if (kiln__ad_wants(c, ins, 1)) {
      kiln_id one = kiln__b_scalar(B, xs->dtype, 1);
      kiln_id p = kiln__b_reduce(B, x, one, dims->v, dims->n, KILN_OP_MULTIPLY);
      kiln__ad_accum(c, ins, 1, kiln__b_reduce_sum(B, kiln__b_mul(B, ct, p), all, ins->shape.rank));
    }
    return c->tx->err;
  }
  return kiln__ad_not_diff(c, ins);
}

/* ---- windows ------------------------------------------------------------- */

/* (v0, t0, v1, t1) -> (v0 dir v1 ? v0 : v1, v0 dir v1 ? t0 : t1): carries the
 * tangent of the running pick; keeps the earlier element on ties. */
static uint32_t pick_pair(kiln__tx *tx, kiln_cmp_dir dir, kiln_dtype t, kiln_dtype t2) {
  if (tx->err) return KILN_NO_ID;
  char name[64];
  snprintf(name, sizeof name, "kiln.pick_%s.%s.%s", kiln_cmp_dir_name(dir), kiln_dtype_name(t),
           kiln_dtype_name(t2));
  const kiln_computation *have = kiln_module_find_computation(tx->m, name);
  if (have) return have->id;
  uint32_t comp;
  if (kiln_module_add_computation(tx->m, name, &comp)) return kiln__tx_oom(tx), KILN_NO_ID;
  kiln__b b = {tx, comp};
  kiln_shape s, s2;
  if (kiln_shape_make_array(tx->m->arena, &s, t, NULL, 0) ||
      kiln_shape_make_array(tx->m->arena, &s2, t2, NULL, 0))
    return kiln__tx_oom(tx), KILN_NO_ID;
  kiln_id p[4];
  for (int i = 0; i < 4; i++) p[i] = kiln__b_param(&b, i, i % 2 ? &s2 : &s, NULL);
  kiln_id keep = kiln__b_cmp(&b, p[0], p[2], dir);
  kiln_id r[2] = {kiln__b_select(&b, keep, p[0], p[2]), kiln__b_select(&b, keep, p[1], p[3])};
  kiln_id root = kiln__b_tuple(&b, r, 2);
  if (root == KILN_NO_ID) return KILN_NO_ID;
  tx->m->comps[comp]->root = root;
  return comp;
}

/* The tangent (or cotangent) carried by the pick of each window of x:
 * reduce-window over (x, v) with the pair reducer. */
static kiln_id gather_picks(kiln__ad *c, const kiln_instr *win, kiln_id x, kiln_id init, kiln_id v,
                            kiln_id vinit, kiln_cmp_dir dir) {
  kiln_dtype t = kiln__b_shape(c->tx, x)->dtype;
  uint32_t comp = pick_pair(c->tx, dir, t, kiln__b_shape(c->tx, v)->dtype);
  kiln_id o[4] = {x, v, init, vinit};
  kiln_instr *ins = kiln__b_start(B, KILN_OP_REDUCE_WINDOW, o, 4);
  if (ins == NULL) return KILN_NO_ID;
  kiln_attr *a = kiln_instr_add_attr(c->tx->m, ins, KILN_ATTR_WINDOW);
  if (a == NULL || kiln_instr_set_called(c->tx->m, ins, &comp, 1))
    return kiln__tx_oom(c->tx), KILN_NO_ID;
  a->v.window = kiln_instr_attr(win, KILN_ATTR_WINDOW)->v.window;
  return kiln__b_gte(B, kiln__b_finish(B, ins), 1);
}

int kiln__jvp_reduce_window(kiln__ad *c, const kiln_instr *ins) {
  kiln__red k = reducer(c, ins);
  if (ins->noperands != 2 || !kiln_instr_has_attr(ins, KILN_ATTR_WINDOW))
    return kiln__ad_not_diff(c, ins);
  if (k == KILN__RED_ADD) return reduce_sum_jvp(c, ins);
  if (k != KILN__RED_MAX && k != KILN__RED_MIN) return kiln__ad_not_diff(c, ins);
  c->tan[kiln__ad_slot(c, ins->id)] =
      gather_picks(c, ins, kiln__X(c, ins, 0), kiln__X(c, ins, 1), kiln__ad_tmat(c, ins, 0),
                   kiln__ad_tmat(c, ins, 1), k == KILN__RED_MAX ? KILN_CMP_GE : KILN_CMP_LE);
  return c->tx->err;
}

/* Transpose of a windowed sum: every input position receives the sum of the
 * cotangents of the windows that cover it, which is itself a windowed sum
 * over the cotangent dilated by the strides (base dilation) and padded by
 * the window's reach, then cut back to the input's positions. */
static kiln_id window_sum_transpose(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  const kiln_window *w = kiln_instr_attr(ins, KILN_ATTR_WINDOW)->v.window;
  const kiln_shape *xs = src_shape(c, ins, 0);
  uint32_t r = xs->rank;
  kiln_window *nw = kiln_arena_calloc(c->tx->m->arena, 1, sizeof *nw);
  kiln_window_dim *nd = nw ? kiln_arena_calloc(c->tx->m->arena, r ? r : 1, sizeof *nd) : NULL;
  int64_t *st = kiln__b_i64s(c->tx, r), *li = kiln__b_i64s(c->tx, r), *sd = kiln__b_i64s(c->tx, r);
  if (nd == NULL || st == NULL || li == NULL || sd == NULL) return kiln__tx_oom(c->tx), KILN_NO_ID;
  nw->rank = r;
  nw->dims = nd;
  for (uint32_t d = 0; d < r; d++) {
    const kiln_window_dim *wd = &w->dims[d];
    int64_t o = ins->shape.dims[d], n = xs->dims[d];
    int64_t padded = (n > 0 ? (n - 1) * wd->lhs_dilate + 1 : 0) + wd->pad_lo + wd->pad_hi;
    int64_t reach = (wd->size - 1) * wd->rhs_dilate;
    nd[d] = (kiln_window_dim){wd->size, 1, reach, 0, wd->stride, wd->rhs_dilate, false};
    nd[d].pad_hi = padded - (o > 0 ? (o - 1) * wd->stride + 1 : 0);
    st[d] = wd->pad_lo;
    li[d] = wd->pad_lo + (n > 0 ? (n - 1) * wd->lhs_dilate + 1 : 0);
    sd[d] = wd->lhs_dilate;
    if (o == 0 || nd[d].pad_hi < 0 || wd->pad_lo < 0) return kiln__b_zeros(B, xs);
  }
  kiln_id zero = kiln__b_scalar(B, xs->dtype, 0);
  kiln_id o[2] = {ct, zero};
  kiln_instr *rw = kiln__b_start(B, KILN_OP_REDUCE_WINDOW, o, 2);
  uint32_t add = kiln__b_reducer(c->tx, KILN_OP_ADD, xs->dtype);
  kiln_attr *a = rw ? kiln_instr_add_attr(c->tx->m, rw, KILN_ATTR_WINDOW) : NULL;
  if (a == NULL || kiln_instr_set_called(c->tx->m, rw, &add, 1))
    return kiln__tx_oom(c->tx), KILN_NO_ID;
  a->v.window = nw;
  return kiln__b_slice(B, kiln__b_finish(B, rw), st, li, sd);
}

static bool has_dilation(const kiln_instr *ins) {
  const kiln_window *w = kiln_instr_attr(ins, KILN_ATTR_WINDOW)->v.window;
  for (uint32_t d = 0; d < w->rank; d++)
    if (w->dims[d].lhs_dilate != 1 || w->dims[d].rhs_dilate != 1) return true;
  return false;
}

/* Transpose of a windowed max/min with dilations, which select-and-scatter
 * cannot express: the pick of every window is found by carrying each
 * element's flat position through the same pair reduce-window as the
 * forward rule (padding and holes carry -1), and the cotangents are
 * scatter-added at those positions (-1 is out of bounds: dropped). */
static kiln_id window_pick_transpose(kiln__ad *c, const kiln_instr *ins, kiln_id ct,
                                     kiln_cmp_dir dir) {
  kiln__tx *tx = c->tx;
  const kiln_shape *xs = src_shape(c, ins, 0);
  int64_t n = kiln_shape_elements(xs), m = kiln_shape_elements(&ins->shape);
  kiln_dtype it = n < INT32_MAX ? KILN_S32 : KILN_S64;
  kiln_id pos = kiln__b_reshape(B, kiln__b_iota(B, it, &n, 1, 0), xs->dims, xs->rank);
  kiln_id picks = gather_picks(c, ins, kiln__X(c, ins, 0), kiln__X(c, ins, 1), pos,
                               kiln__b_iscalar(B, it, -1), dir);
  int64_t m1[2] = {m, 1}, zero = 0;
  kiln_i64s none = {NULL, 0}, d0 = {&zero, 1};
  kiln__gdims sd = {none, d0, d0, none, none, none, 1};
  kiln_id flat = kiln__tf_scatter(B, kiln__b_full(B, xs->dtype, &n, 1, 0),
                                  kiln__b_reshape(B, picks, m1, 2), kiln__b_reshape(B, ct, &m, 1),
                                  &sd, kiln__b_reducer(tx, KILN_OP_ADD, xs->dtype));
  return kiln__b_reshape(B, flat, xs->dims, xs->rank);
}

int kiln__vjp_reduce_window(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__red k = reducer(c, ins);
  if (ins->noperands != 2 || !kiln_instr_has_attr(ins, KILN_ATTR_WINDOW))
    return kiln__ad_not_diff(c, ins);
  uint32_t r = ins->shape.rank;
  int64_t *all = kiln__b_i64s(c->tx, r);
  if (all == NULL) return c->tx->err;
  for (uint32_t d = 0; d < r; d++) all[d] = d;
  if (k == KILN__RED_ADD) {
    if (kiln__ad_wants(c, ins, 0)) kiln__ad_accum(c, ins, 0, window_sum_transpose(c, ins, ct));
    if (kiln__ad_wants(c, ins, 1)) kiln__ad_accum(c, ins, 1, kiln__b_reduce_sum(B, ct, all, r));
    return c->tx->err;
  }
  if (k != KILN__RED_MAX && k != KILN__RED_MIN) return kiln__ad_not_diff(c, ins);
  if (kiln__ad_wants(c, ins, 0) && has_dilation(ins)) {
    kiln__ad_accum(
        c, ins, 0,
        window_pick_transpose(c, ins, ct, k == KILN__RED_MAX ? KILN_CMP_GE : KILN_CMP_LE));
  } else if (kiln__ad_wants(c, ins, 0)) {
    kiln_dtype t = ins->shape.dtype;
    uint32_t sel = kiln__b_comparator(c->tx, k == KILN__RED_MAX ? KILN_CMP_GE : KILN_CMP_LE, t);
    uint32_t add = kiln__b_reducer(c->tx, KILN_OP_ADD, t);
    kiln_id o[3] = {kiln__X(c, ins, 0), ct, kiln__b_scalar(B, t, 0)};
    kiln_instr *s = kiln__b_start(B, KILN_OP_SELECT_AND_SCATTER, o, 3);
    uint32_t called[2] = {sel, add};
    kiln_attr *a = s ? kiln_instr_add_attr(c->tx->m, s, KILN_ATTR_WINDOW) : NULL;
    if (a == NULL || kiln_instr_set_called(c->tx->m, s, called, 2)) return kiln__tx_oom(c->tx);
    a->v.window = kiln_instr_attr(ins, KILN_ATTR_WINDOW)->v.window;
    kiln__ad_accum(c, ins, 0, kiln__b_finish(B, s));
  }
  if (kiln__ad_wants(c, ins, 1)) {
    /* The running pick starts at the init value, which stays the result of
     * windows where no element beats it (padding-only windows, say). */
    kiln_id init = kiln__b_broadcast_like(B, kiln__X(c, ins, 1), ct);
    kiln_id won = kiln__b_cmp(B, kiln__Y(c, ins), init, KILN_CMP_EQ);
    kiln__ad_accum(
        c, ins, 1,
        kiln__b_reduce_sum(B, kiln__b_select(B, won, ct, kiln__b_zeros_like(B, ct)), all, r));
  }
  return c->tx->err;
}

/* select-and-scatter with an add scatter is linear in (source, init) for a
 * fixed operand; the operand only steers the selection. */
int kiln__jvp_select_and_scatter(kiln__ad *c, const kiln_instr *ins) {
  if (ins->ncalled != 2 || kiln__tf_reducer_kind(c->tx->m, ins->called[1]) != KILN__RED_ADD)
    return kiln__ad_not_diff(c, ins);
  kiln_id o[3] = {kiln__X(c, ins, 0), kiln__ad_tmat(c, ins, 1), kiln__ad_tmat(c, ins, 2)};
  c->tan[kiln__ad_slot(c, ins->id)] = kiln__b_clone_same(B, ins, o, 3);
  return c->tx->err;
}

int kiln__vjp_select_and_scatter(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  const kiln_module *m = c->tx->m;
  if (ins->ncalled != 2 || kiln__tf_reducer_kind(m, ins->called[1]) != KILN__RED_ADD)
    return kiln__ad_not_diff(c, ins);
  const kiln_computation *sel = kiln_module_computation(m, ins->called[0]);
  const kiln_instr *cmp = sel ? kiln_computation_root(m, sel) : NULL;
  if (cmp == NULL || cmp->op != KILN_OP_COMPARE) return kiln__ad_not_diff(c, ins);
  kiln_cmp_dir dir = (kiln_cmp_dir)kiln_instr_attr_int(cmp, KILN_ATTR_DIRECTION, KILN_CMP_GE);
  if (m->instrs[cmp->operands[0]]->param_number != 0) /* compare(p1, p0): mirror */
    dir = dir == KILN_CMP_GE   ? KILN_CMP_LE
          : dir == KILN_CMP_LE ? KILN_CMP_GE
          : dir == KILN_CMP_GT ? KILN_CMP_LT
          : dir == KILN_CMP_LT ? KILN_CMP_GT
                               : dir;
  uint32_t r = ins->shape.rank;
  if (kiln__ad_wants(c, ins, 1)) {
    kiln_id x = kiln__X(c, ins, 0);
    const kiln_shape *xs = kiln__b_shape(c->tx, x);
    kiln_id lowest = kiln__b_scalar(
        B, xs->dtype, dir == KILN_CMP_GE || dir == KILN_CMP_GT ? -INFINITY : INFINITY);
    kiln__ad_accum(c, ins, 1,
                   gather_picks(c, ins, x, lowest, ct, kiln__b_scalar(B, xs->dtype, 0), dir));
  }
  if (kiln__ad_wants(c, ins, 2)) {
    int64_t *all = kiln__b_i64s(c->tx, r);
    if (all == NULL) return c->tx->err;
    for (uint32_t d = 0; d < r; d++) all[d] = d;
    kiln__ad_accum(c, ins, 2, kiln__b_reduce_sum(B, ct, all, r));
  }
  return c->tx->err;
}
