/* Derivatives of gather and scatter.
 *
 * gather is linear in its operand; its transpose is a scatter-add of the
 * cotangent into zeros. XLA's gather clamps start indices so that slices
 * stay in bounds while scatter drops out-of-bounds updates, so the transpose
 * clamps the indices first, exactly as the gather did.
 *
 * scatter with an add combiner is linear in (operand, updates): the operand
 * passes its cotangent through and each update gathers the cotangent at its
 * target, or nothing when its target was out of bounds (a mask rebuilt from
 * the indices). scatter with a replace combiner (JAX's .at[].set) is linear
 * too, but only the update that won a position gets its cotangent: the
 * transpose scatters each update's own id the same way and gathers it back
 * to see who won (JAX does the same with ids), and the operand keeps the
 * cotangent only where nothing was written.
 *
 * scatter with a multiplying combiner (.at[].multiply) is x * P, P the
 * product of the updates at each position; each update's derivative is x
 * times the product of the others landing with it, computed without
 * dividing by zero. scatter with a max/min combiner (.at[].max, .at[].min)
 * shares the derivative at each position equally among the operand element
 * and the updates that equal the result, as JAX does.
 */
#include <string.h>

#include "compiler/transforms/rules.h"

#define B (&c->b)

static kiln_i64s list(const kiln_instr *ins, kiln_attr_key k) {
  const kiln_i64s *l = kiln_instr_attr_ints(ins, k);
  kiln_i64s e = {NULL, 0};
  return l ? *l : e;
}

kiln__gdims kiln__tf_gather_dims(const kiln_instr *g) {
  kiln__gdims d = {list(g, KILN_ATTR_OFFSET_DIMS),
                   list(g, KILN_ATTR_COLLAPSED_SLICE_DIMS),
                   list(g, KILN_ATTR_START_INDEX_MAP),
                   list(g, KILN_ATTR_OPERAND_BATCHING_DIMS),
                   list(g, KILN_ATTR_START_INDICES_BATCHING_DIMS),
                   list(g, KILN_ATTR_SLICE_SIZES),
                   kiln_instr_attr_int(g, KILN_ATTR_INDEX_VECTOR_DIM, 0)};
  return d;
}

kiln__gdims kiln__tf_scatter_dims(const kiln_instr *s) {
  kiln__gdims d = {list(s, KILN_ATTR_UPDATE_WINDOW_DIMS),
                   list(s, KILN_ATTR_INSERTED_WINDOW_DIMS),
                   list(s, KILN_ATTR_SCATTER_DIMS_TO_OPERAND_DIMS),
                   list(s, KILN_ATTR_INPUT_BATCHING_DIMS),
                   list(s, KILN_ATTR_SCATTER_INDICES_BATCHING_DIMS),
                   {NULL, 0},
                   kiln_instr_attr_int(s, KILN_ATTR_INDEX_VECTOR_DIM, 0)};
  return d;
}

static int set_list(kiln__tx *tx, kiln_instr *ins, kiln_attr_key k, kiln_i64s l) {
  if (kiln_instr_set_attr_ints(tx->m, ins, k, l.v, l.n)) return kiln__tx_oom(tx);
  return 0;
}

kiln_id kiln__tf_gather(kiln__b *b, kiln_id x, kiln_id idx, const kiln__gdims *d) {
  kiln_id o[2] = {x, idx};
  kiln_instr *ins = kiln__b_start(b, KILN_OP_GATHER, o, 2);
  if (ins == NULL) return KILN_NO_ID;
  kiln__tx *tx = b->tx;
  if (set_list(tx, ins, KILN_ATTR_OFFSET_DIMS, d->offset) ||
      set_list(tx, ins, KILN_ATTR_COLLAPSED_SLICE_DIMS, d->collapsed) ||
      set_list(tx, ins, KILN_ATTR_START_INDEX_MAP, d->start_map) ||
      (d->obatch.n && set_list(tx, ins, KILN_ATTR_OPERAND_BATCHING_DIMS, d->obatch)) ||
      (d->ibatch.n && set_list(tx, ins, KILN_ATTR_START_INDICES_BATCHING_DIMS, d->ibatch)) ||
      kiln_instr_set_attr_int(tx->m, ins, KILN_ATTR_INDEX_VECTOR_DIM, d->ivd) ||
      set_list(tx, ins, KILN_ATTR_SLICE_SIZES, d->sizes))
    return kiln__tx_oom(tx), KILN_NO_ID;
  return kiln__b_finish(b, ins);
}

kiln_id kiln__tf_scatter(kiln__b *b, kiln_id x, kiln_id idx, kiln_id u, const kiln__gdims *d,
                         uint32_t comp) {
  kiln_id o[3] = {x, idx, u};
  kiln_instr *ins = kiln__b_start(b, KILN_OP_SCATTER, o, 3);
  if (ins == NULL) return KILN_NO_ID;
  kiln__tx *tx = b->tx;
  if (set_list(tx, ins, KILN_ATTR_UPDATE_WINDOW_DIMS, d->offset) ||
      set_list(tx, ins, KILN_ATTR_INSERTED_WINDOW_DIMS, d->collapsed) ||
      set_list(tx, ins, KILN_ATTR_SCATTER_DIMS_TO_OPERAND_DIMS, d->start_map) ||
      (d->obatch.n && set_list(tx, ins, KILN_ATTR_INPUT_BATCHING_DIMS, d->obatch)) ||
      (d->ibatch.n && set_list(tx, ins, KILN_ATTR_SCATTER_INDICES_BATCHING_DIMS, d->ibatch)) ||
      kiln_instr_set_attr_int(tx->m, ins, KILN_ATTR_INDEX_VECTOR_DIM, d->ivd) ||
      kiln_instr_set_called(tx->m, ins, &comp, 1))
    return kiln__tx_oom(tx), KILN_NO_ID;
  return kiln__b_finish(b, ins);
}

/* The largest in-bounds start of each index component, shaped like idx. */
static kiln_id index_bounds(kiln__ad *c, kiln_id idx, const kiln_shape *xs, const kiln__gdims *d) {
  const kiln_shape *is = kiln__b_shape(c->tx, idx);
  uint32_t n = d->start_map.n;
  int64_t *hi = kiln__b_i64s(c->tx, n);
  if (hi == NULL) return KILN_NO_ID;
  for (uint32_t j = 0; j < n; j++) {
    int64_t od = d->start_map.v[j];
    hi[j] = xs->dims[od] - d->sizes.v[od];
  }
  if (d->ivd >= (int64_t)is->rank)
    return kiln__b_broadcast(B, kiln__b_iscalar(B, is->dtype, hi[0]), is->dims, is->rank, NULL, 0);
  kiln_id vec = kiln__b_const_ints(B, is->dtype, hi, n);
  return kiln__b_broadcast(B, vec, is->dims, is->rank, &d->ivd, 1);
}

static kiln_id clamp_indices(kiln__ad *c, kiln_id idx, const kiln_shape *xs, const kiln__gdims *d) {
  kiln_id hi = index_bounds(c, idx, xs, d);
  kiln_id lo = kiln__b_iscalar(B, kiln__b_shape(c->tx, idx)->dtype, 0);
  kiln_id o[3] = {lo, idx, hi};
  return kiln__b_op(B, KILN_OP_CLAMP, o, 3);
}

int kiln__vjp_gather(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  if (!kiln__ad_wants(c, ins, 0)) return 0;
  kiln__gdims d = kiln__tf_gather_dims(ins);
  const kiln_shape *xs = &c->tx->m->instrs[ins->operands[0]]->shape;
  kiln_id idx = clamp_indices(c, kiln__X(c, ins, 1), xs, &d);
  uint32_t add = kiln__b_reducer(c->tx, KILN_OP_ADD, xs->dtype);
  kiln__ad_accum(c, ins, 0, kiln__tf_scatter(B, kiln__b_zeros(B, xs), idx, ct, &d, add));
  return c->tx->err;
}

/* The gather that reads back, for every update element, the operand
 * position the scatter wrote it to (slice sizes from the update window). */
static kiln__gdims readback_dims(kiln__ad *c, const kiln_instr *s, const kiln__gdims *sd) {
  const kiln_shape *xs = &c->tx->m->instrs[s->operands[0]]->shape;
  const kiln_shape *us = &c->tx->m->instrs[s->operands[2]]->shape;
  kiln__gdims g = *sd;
  g.sizes.n = xs->rank;
  g.sizes.v = kiln__b_i64s(c->tx, xs->rank);
  if (g.sizes.v == NULL) return g;
  uint32_t j = 0;
  for (uint32_t od = 0; od < xs->rank; od++) {
    bool skip = false;
    for (uint32_t i = 0; i < sd->collapsed.n; i++) skip |= sd->collapsed.v[i] == (int64_t)od;
    for (uint32_t i = 0; i < sd->obatch.n; i++) skip |= sd->obatch.v[i] == (int64_t)od;
    g.sizes.v[od] = skip || j >= sd->offset.n ? 1 : us->dims[sd->offset.v[j++]];
  }
  return g;
}

/* Positions of the update dims that are not window dims (the scatter dims). */
static kiln_i64s update_scatter_dims(kiln__tx *tx, const kiln_shape *us, const kiln__gdims *d) {
  kiln_i64s r = {kiln__b_i64s(tx, us->rank), 0};
  for (uint32_t i = 0; r.v && i < us->rank; i++) {
    bool win = false;
    for (uint32_t j = 0; j < d->offset.n; j++) win |= d->offset.v[j] == (int64_t)i;
    if (!win) r.v[r.n++] = i;
  }
  return r;
}

/* Per update element: whether its scatter index was in bounds. */
static kiln_id inbounds_mask(kiln__ad *c, kiln_id idx, const kiln_shape *xs, const kiln_shape *us,
                             const kiln__gdims *g) {
  const kiln_shape *is = kiln__b_shape(c->tx, idx);
  kiln_id ok =
      kiln__b_bin(B, KILN_OP_AND, kiln__b_cmp(B, idx, kiln__b_full_like(B, idx, 0), KILN_CMP_GE),
                  kiln__b_cmp(B, idx, index_bounds(c, idx, xs, g), KILN_CMP_LE));
  if (g->ivd < (int64_t)is->rank) {
    kiln_id t = kiln__b_scalar(B, KILN_PRED, 1);
    ok = kiln__b_reduce(B, ok, t, &g->ivd, 1, KILN_OP_AND);
  }
  kiln_i64s sdims = update_scatter_dims(c->tx, us, g);
  return kiln__b_broadcast(B, ok, us->dims, us->rank, sdims.v, sdims.n);
}

/* ---- scatter with a multiplying combiner ---------------------------------- */

/* y = x * P where P is the product of the updates landing at each position.
 * *prod is P; *others, per update element, the product of the other
 * updates landing where it does, exact at zeros (no division by a zero: the
 * zero updates are counted apart from the product of the nonzero ones). */
static void mul_parts(kiln__ad *c, const kiln_instr *ins, const kiln__gdims *sd,
                      const kiln__gdims *g, kiln_id *prod, kiln_id *others) {
  kiln__tx *tx = c->tx;
  kiln_id x = kiln__X(c, ins, 0), idx = kiln__X(c, ins, 1), u = kiln__X(c, ins, 2);
  kiln_dtype t = kiln__b_shape(tx, x)->dtype;
  kiln_id uzero = kiln__b_cmp(B, u, kiln__b_zeros_like(B, u), KILN_CMP_EQ);
  kiln_id unz = kiln__b_select(B, uzero, kiln__b_full_like(B, u, 1), u);
  kiln_id pn = kiln__tf_scatter(B, kiln__b_full_like(B, x, 1), idx, unz, sd,
                                kiln__b_reducer(tx, KILN_OP_MULTIPLY, t));
  kiln_id nz = kiln__tf_scatter(B, kiln__b_full_like(B, x, 0), idx, kiln__b_convert(B, uzero, t),
                                sd, kiln__b_reducer(tx, KILN_OP_ADD, t));
  *prod = kiln__b_select(B, kiln__b_cmp(B, nz, kiln__b_full_like(B, nz, 0), KILN_CMP_EQ), pn,
                         kiln__b_zeros_like(B, pn));
  if (others == NULL) return;
  kiln_id gp = kiln__tf_gather(B, pn, idx, g), gz = kiln__tf_gather(B, nz, idx, g);
  kiln_id z = kiln__b_zeros_like(B, gp);
  kiln_id one_zero = kiln__b_cmp(B, gz, kiln__b_full_like(B, gz, 1), KILN_CMP_EQ);
  kiln_id no_zero = kiln__b_cmp(B, gz, kiln__b_full_like(B, gz, 0), KILN_CMP_EQ);
  *others = kiln__b_select(B, uzero, kiln__b_select(B, one_zero, gp, z),
                           kiln__b_select(B, no_zero, kiln__b_div(B, gp, unz), z));
}

/* ---- scatter with a max/min combiner ----------------------------------------- */

/* As JAX: the derivative at a position is shared equally by the operand
 * element (when it equals the result) and every update equal to the result
 * landing there. *succ marks the updates that share; *share is 1 / the
 * number of sharers per position; *keep the operand's part (share where it
 * equals the result, else 0). */
static void extremal_parts(kiln__ad *c, const kiln_instr *ins, const kiln__gdims *sd,
                           const kiln__gdims *g, kiln_id *succ, kiln_id *share, kiln_id *keep) {
  kiln__tx *tx = c->tx;
  const kiln_shape *xs = &tx->m->instrs[ins->operands[0]]->shape;
  const kiln_shape *us = &tx->m->instrs[ins->operands[2]]->shape;
  kiln_id x = kiln__X(c, ins, 0), idx = kiln__X(c, ins, 1), u = kiln__X(c, ins, 2),
          y = kiln__Y(c, ins);
  kiln_dtype t = xs->dtype;
  *succ = kiln__b_bin(B, KILN_OP_AND, kiln__b_cmp(B, u, kiln__tf_gather(B, y, idx, g), KILN_CMP_EQ),
                      inbounds_mask(c, idx, xs, us, g));
  kiln_id n = kiln__tf_scatter(B, kiln__b_full_like(B, x, 0), idx, kiln__b_convert(B, *succ, t), sd,
                               kiln__b_reducer(tx, KILN_OP_ADD, t));
  kiln_id ret = kiln__b_convert(B, kiln__b_cmp(B, x, y, KILN_CMP_EQ), t);
  kiln_id one = kiln__b_full_like(B, n, 1);
  kiln_id denom =
      kiln__b_bin(B, KILN_OP_MAXIMUM, kiln__b_add(B, n, ret), one); /* NaN results: nobody */
  *share = kiln__b_div(B, one, denom);
  *keep = kiln__b_mul(B, ret, *share);
}

static kiln__red scatter_kind(const kiln__ad *c, const kiln_instr *ins) {
  if (ins->noperands != 3 || ins->ncalled != 1) return KILN__RED_OTHER;
  return kiln__tf_reducer_kind(c->tx->m, ins->called[0]);
}

int kiln__jvp_scatter(kiln__ad *c, const kiln_instr *ins) {
  kiln__red k = scatter_kind(c, ins);
  if (k == KILN__RED_ADD || k == KILN__RED_REPLACE) return kiln__jvp_linear(c, ins);
  if (k != KILN__RED_MUL && k != KILN__RED_MAX && k != KILN__RED_MIN)
    return kiln__ad_not_diff(c, ins);
  kiln__tx *tx = c->tx;
  kiln__gdims sd = kiln__tf_scatter_dims(ins);
  kiln__gdims g = readback_dims(c, ins, &sd);
  kiln_id x = kiln__X(c, ins, 0), idx = kiln__X(c, ins, 1);
  kiln_id tx_ = kiln__ad_tmat(c, ins, 0), tu = kiln__ad_tmat(c, ins, 2);
  uint32_t add = kiln__b_reducer(tx, KILN_OP_ADD, kiln__b_shape(tx, x)->dtype);
  kiln_id zx = kiln__b_zeros_like(B, x);
  if (k == KILN__RED_MUL) {
    kiln_id prod, others;
    mul_parts(c, ins, &sd, &g, &prod, &others);
    kiln_id dp = kiln__tf_scatter(B, zx, idx, kiln__b_mul(B, tu, others), &sd, add);
    c->tan[kiln__ad_slot(c, ins->id)] =
        kiln__b_add(B, kiln__b_mul(B, tx_, prod), kiln__b_mul(B, x, dp));
    return tx->err;
  }
  kiln_id succ, share, keep;
  extremal_parts(c, ins, &sd, &g, &succ, &share, &keep);
  kiln_id picked = kiln__b_select(B, succ, tu, kiln__b_zeros_like(B, tu));
  kiln_id du = kiln__b_mul(B, kiln__tf_scatter(B, zx, idx, picked, &sd, add), share);
  c->tan[kiln__ad_slot(c, ins->id)] = kiln__b_add(B, kiln__b_mul(B, tx_, keep), du);
  return tx->err;
}

/* Transposes of the scatters above: the same coefficients, read back per
 * update by a gather (out-of-bounds updates, which wrote nothing, get
 * nothing). */
static int vjp_scatter_nonlinear(kiln__ad *c, const kiln_instr *ins, kiln_id ct, kiln__red k) {
  kiln__tx *tx = c->tx;
  const kiln_shape *xs = &tx->m->instrs[ins->operands[0]]->shape;
  const kiln_shape *us = &tx->m->instrs[ins->operands[2]]->shape;
  kiln__gdims sd = kiln__tf_scatter_dims(ins);
  kiln__gdims g = readback_dims(c, ins, &sd);
  kiln_id idx = kiln__X(c, ins, 1);
  if (k == KILN__RED_MUL) {
    kiln_id prod, others;
    mul_parts(c, ins, &sd, &g, &prod, kiln__ad_wants(c, ins, 2) ? &others : NULL);
    kiln__ad_accum(c, ins, 0, kiln__b_mul(B, ct, prod));
    if (kiln__ad_wants(c, ins, 2)) {
      kiln_id got = kiln__b_mul(
          B, kiln__tf_gather(B, kiln__b_mul(B, ct, kiln__X(c, ins, 0)), idx, &g), others);
      kiln_id mask = inbounds_mask(c, idx, xs, us, &g);
      kiln__ad_accum(c, ins, 2, kiln__b_select(B, mask, got, kiln__b_zeros_like(B, got)));
    }
    return tx->err;
  }
  kiln_id succ, share, keep;
  extremal_parts(c, ins, &sd, &g, &succ, &share, &keep);
  kiln__ad_accum(c, ins, 0, kiln__b_mul(B, ct, keep));
  if (kiln__ad_wants(c, ins, 2)) {
    kiln_id got = kiln__tf_gather(B, kiln__b_mul(B, ct, share), idx, &g);
    kiln__ad_accum(c, ins, 2, kiln__b_select(B, succ, got, kiln__b_zeros_like(B, got)));
  }
  return tx->err;
}

int kiln__vjp_scatter(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__red k = scatter_kind(c, ins);
  if (k == KILN__RED_MUL || k == KILN__RED_MAX || k == KILN__RED_MIN)
    return vjp_scatter_nonlinear(c, ins, ct, k);
  if (k != KILN__RED_ADD && k != KILN__RED_REPLACE) return kiln__ad_not_diff(c, ins);
  kiln__tx *tx = c->tx;
  const kiln_shape *xs = &tx->m->instrs[ins->operands[0]]->shape;
  const kiln_shape *us = &tx->m->instrs[ins->operands[2]]->shape;
  kiln__gdims sd = kiln__tf_scatter_dims(ins);
  kiln__gdims g = readback_dims(c, ins, &sd);
  kiln_id idx = kiln__X(c, ins, 1);
  if (k == KILN__RED_ADD) {
    kiln__ad_accum(c, ins, 0, ct);
    if (kiln__ad_wants(c, ins, 2)) {
      kiln_id got = kiln__tf_gather(B, ct, idx, &g);
      kiln_id mask = inbounds_mask(c, idx, xs, us, &g);
      kiln__ad_accum(c, ins, 2, kiln__b_select(B, mask, got, kiln__b_zeros_like(B, got)));
    }
    return tx->err;
  }
  /* replace: find the winners by scattering ids. */
  kiln_i64s sdims = update_scatter_dims(tx, us, &sd);
  int64_t nids = 1;
  int64_t *sizes = kiln__b_i64s(tx, sdims.n + 1);
  if (sizes == NULL) return tx->err;
  for (uint32_t i = 0; i < sdims.n; i++) nids *= (sizes[i] = us->dims[sdims.v[i]]);
  kiln_id ids = kiln__b_reshape(B, kiln__b_iota(B, KILN_S32, &nids, 1, 0), sizes, sdims.n);
  ids = kiln__b_broadcast(B, ids, us->dims, us->rank, sdims.v, sdims.n);
  uint32_t repl = kiln__b_reducer(tx, KILN_OP_INVALID, KILN_S32);
  kiln_id none = kiln__b_full(B, KILN_S32, xs->dims, xs->rank, -1);
  kiln_id won = kiln__tf_scatter(B, none, idx, ids, &sd, repl);
  if (kiln__ad_wants(c, ins, 0)) {
    kiln_id untouched = kiln__b_cmp(B, won, none, KILN_CMP_EQ);
    kiln__ad_accum(c, ins, 0, kiln__b_select(B, untouched, ct, kiln__b_zeros_like(B, ct)));
  }
  if (kiln__ad_wants(c, ins, 2)) {
    kiln_id mine = kiln__b_cmp(B, kiln__tf_gather(B, won, idx, &g), ids, KILN_CMP_EQ);
    kiln_id got = kiln__tf_gather(B, ct, idx, &g);
    kiln__ad_accum(c, ins, 2, kiln__b_select(B, mine, got, kiln__b_zeros_like(B, got)));
  }
  return tx->err;
}
