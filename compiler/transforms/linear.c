/* Derivatives of the structural and linear ops: tuples, data movement,
 * dot, and the linear collectives.
 *
 * A linear op's tangent is the op applied to the tangents (with the same
 * attributes, and the primal values for index operands), so one generic
 * rule covers broadcast, reshape, slice, pad, concatenate, gather, the
 * dynamic slices and more. Their transposes are written out one by one:
 * broadcast sums, slice pads, pad slices, concatenate splits, dynamic-slice
 * updates into zeros, and dot contracts the cotangent with the other side.
 */
#include <string.h>

#include "compiler/transforms/rules.h"

#define B (&c->b)

static const kiln_shape *src_shape(const kiln__ad *c, const kiln_instr *ins, uint32_t k) {
  return &c->tx->m->instrs[ins->operands[k]]->shape;
}

int kiln__jvp_linear(kiln__ad *c, const kiln_instr *ins) {
  kiln_id *ops = kiln__b_ids(c->tx, ins->noperands);
  if (ops == NULL) return c->tx->err;
  for (uint32_t k = 0; k < ins->noperands; k++)
    ops[k] =
        kiln__b_has_float(src_shape(c, ins, k)) ? kiln__ad_tmat(c, ins, k) : kiln__X(c, ins, k);
  c->tan[kiln__ad_slot(c, ins->id)] = kiln__b_clone_same(B, ins, ops, ins->noperands);
  return c->tx->err;
}

int kiln__jvp_tuple(kiln__ad *c, const kiln_instr *ins) {
  kiln_id *ops = kiln__b_ids(c->tx, ins->noperands);
  if (ops == NULL) return c->tx->err;
  for (uint32_t k = 0; k < ins->noperands; k++) ops[k] = kiln__ad_tmat(c, ins, k);
  c->tan[kiln__ad_slot(c, ins->id)] = kiln__b_tuple(B, ops, ins->noperands);
  return c->tx->err;
}

int kiln__jvp_gte(kiln__ad *c, const kiln_instr *ins) {
  kiln_id t = kiln__T(c, ins, 0);
  c->tan[kiln__ad_slot(c, ins->id)] =
      t == KILN_NO_ID ? KILN_NO_ID
                      : kiln__b_gte(B, t, kiln_instr_attr_int(ins, KILN_ATTR_INDEX, 0));
  return c->tx->err;
}

/* dot and convolution are bilinear: d(a*b) = da*b + a*db. */
int kiln__jvp_dot(kiln__ad *c, const kiln_instr *ins) {
  kiln_id acc = KILN_NO_ID;
  if (kiln__T(c, ins, 0) != KILN_NO_ID) {
    kiln_id o[2] = {kiln__T(c, ins, 0), kiln__X(c, ins, 1)};
    acc = kiln__b_clone_same(B, ins, o, 2);
  }
  if (kiln__T(c, ins, 1) != KILN_NO_ID) {
    kiln_id o[2] = {kiln__X(c, ins, 0), kiln__T(c, ins, 1)};
    kiln_id d = kiln__b_clone_same(B, ins, o, 2);
    acc = acc == KILN_NO_ID ? d : kiln__b_add(B, acc, d);
  }
  c->tan[kiln__ad_slot(c, ins->id)] = acc;
  return c->tx->err;
}

int kiln__jvp_barrier(kiln__ad *c, const kiln_instr *ins) {
  c->tan[kiln__ad_slot(c, ins->id)] = kiln__T(c, ins, 0);
  return 0;
}

int kiln__jvp_all_reduce(kiln__ad *c, const kiln_instr *ins) {
  if (ins->ncalled != 1 || kiln__tf_reducer_kind(c->tx->m, ins->called[0]) != KILN__RED_ADD)
    return kiln__ad_not_diff(c, ins);
  return kiln__jvp_linear(c, ins);
}

/* ---- transposes ---------------------------------------------------------- */

int kiln__vjp_tuple(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  for (uint32_t k = 0; k < ins->noperands && c->tx->err == 0; k++)
    if (kiln__ad_wants(c, ins, k)) kiln__ad_accum(c, ins, k, kiln__b_gte(B, ct, k));
  return c->tx->err;
}

int kiln__vjp_gte(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  const kiln_shape *s = src_shape(c, ins, 0);
  int64_t idx = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, 0);
  kiln_id *el = kiln__b_ids(c->tx, s->rank);
  if (el == NULL) return c->tx->err;
  for (uint32_t i = 0; i < s->rank; i++)
    el[i] = (int64_t)i == idx ? ct : kiln__b_zeros(B, &s->tuple[i]);
  kiln__ad_accum(c, ins, 0, kiln__b_tuple(B, el, s->rank));
  return c->tx->err;
}

int kiln__vjp_copy(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__ad_accum(c, ins, 0, ct);
  return c->tx->err;
}

int kiln__vjp_barrier(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__ad_accum(c, ins, 0, ct);
  return c->tx->err;
}

int kiln__vjp_broadcast(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  const kiln_shape *xs = src_shape(c, ins, 0), *os = &ins->shape;
  const kiln_i64s *map = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  uint32_t r = xs->rank, R = os->rank, nred = 0;
  int64_t *red = kiln__b_i64s(c->tx, R), *order = kiln__b_i64s(c->tx, r),
          *dims = kiln__b_i64s(c->tx, r), *perm = kiln__b_i64s(c->tx, r);
  uint8_t *mapped = (uint8_t *)kiln__b_i64s(c->tx, R);
  if (red == NULL || order == NULL || dims == NULL || perm == NULL || mapped == NULL)
    return c->tx->err;
  if ((map ? map->n : 0) != r)
    return kiln__tx_fail(c->tx, KILN_EINTERNAL, ins, "%s: broadcast dimensions", c->tx->name);
  for (uint32_t i = 0; i < r; i++) {
    int64_t d = map->v[i];
    if (xs->dims[i] == os->dims[d]) mapped[d] = 1;
  }
  for (uint32_t d = 0; d < R; d++)
    if (!mapped[d]) red[nred++] = d;
  kiln_id s = kiln__b_reduce_sum(B, ct, red, nred);
  /* order: operand dims sorted by where they land in the result. */
  for (uint32_t i = 0; i < r; i++) order[i] = i;
  for (uint32_t i = 1; i < r; i++)
    for (uint32_t j = i; j > 0 && map->v[order[j - 1]] > map->v[order[j]]; j--) {
      int64_t t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  for (uint32_t i = 0; i < r; i++) {
    dims[i] = xs->dims[order[i]];
    perm[order[i]] = i;
  }
  s = kiln__b_reshape(B, s, dims, r);
  kiln__ad_accum(c, ins, 0, kiln__b_transpose(B, s, perm, r));
  return c->tx->err;
}

int kiln__vjp_reshape(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  const kiln_shape *xs = src_shape(c, ins, 0);
  kiln__ad_accum(c, ins, 0, kiln__b_reshape(B, ct, xs->dims, xs->rank));
  return c->tx->err;
}

int kiln__vjp_transpose(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  int64_t *inv = kiln__b_i64s(c->tx, p ? p->n : 0);
  if (inv == NULL || p == NULL) return c->tx->err;
  for (uint32_t i = 0; i < p->n; i++) inv[p->v[i]] = i;
  kiln__ad_accum(c, ins, 0, kiln__b_transpose(B, ct, inv, p->n));
  return c->tx->err;
}

int kiln__vjp_slice(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  const kiln_shape *xs = src_shape(c, ins, 0);
  const kiln_i64s *sl = kiln_instr_attr_ints(ins, KILN_ATTR_SLICE);
  uint32_t r = xs->rank;
  int64_t *lo = kiln__b_i64s(c->tx, r), *hi = kiln__b_i64s(c->tx, r), *in = kiln__b_i64s(c->tx, r);
  if (lo == NULL || hi == NULL || in == NULL || sl == NULL) return c->tx->err;
  for (uint32_t d = 0; d < r; d++) {
    int64_t s = sl->v[3 * d], k = sl->v[3 * d + 2], n = ins->shape.dims[d];
    if (n == 0) return 0; /* an empty slice passes nothing back */
    lo[d] = s;
    in[d] = k - 1;
    hi[d] = xs->dims[d] - (s + (n - 1) * k + 1);
  }
  kiln_id z = kiln__b_scalar(B, ins->shape.dtype, 0);
  kiln__ad_accum(c, ins, 0, kiln__b_pad(B, ct, z, lo, hi, in));
  return c->tx->err;
}

int kiln__vjp_pad(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_PADDING);
  uint32_t r = ins->shape.rank;
  int64_t *lo = kiln__b_i64s(c->tx, r), *hi = kiln__b_i64s(c->tx, r), *st = kiln__b_i64s(c->tx, r),
          *li = kiln__b_i64s(c->tx, r), *sd = kiln__b_i64s(c->tx, r);
  if (lo == NULL || hi == NULL || st == NULL || li == NULL || sd == NULL || p == NULL)
    return c->tx->err;
  for (uint32_t d = 0; d < r; d++) {
    lo[d] = -p->v[3 * d];
    hi[d] = -p->v[3 * d + 1];
    sd[d] = p->v[3 * d + 2] + 1;
  }
  kiln_id z = kiln__b_scalar(B, ins->shape.dtype, 0);
  kiln_id un = kiln__b_pad(B, ct, z, lo, hi, NULL);
  const kiln_shape *us = un == KILN_NO_ID ? NULL : kiln__b_shape(c->tx, un);
  if (us == NULL) return c->tx->err;
  for (uint32_t d = 0; d < r; d++) li[d] = us->dims[d];
  kiln_id cx = kiln__b_slice(B, un, st, li, sd);
  kiln__ad_accum(c, ins, 0, cx);
  if (kiln__ad_wants(c, ins, 1)) {
    int64_t *all = kiln__b_i64s(c->tx, r);
    if (all == NULL) return c->tx->err;
    for (uint32_t d = 0; d < r; d++) all[d] = d;
    kiln_id tot = kiln__b_reduce_sum(B, ct, all, r);
    kiln__ad_accum(c, ins, 1, kiln__b_sub(B, tot, kiln__b_reduce_sum(B, cx, all, r)));
  }
  return c->tx->err;
}

int kiln__vjp_concatenate(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  const kiln_i64s *dd = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  if (dd == NULL || dd->n != 1) return kiln__ad_not_diff(c, ins);
  uint32_t d = (uint32_t)dd->v[0];
  int64_t off = 0;
  for (uint32_t k = 0; k < ins->noperands && c->tx->err == 0; k++) {
    int64_t n = src_shape(c, ins, k)->dims[d];
    if (kiln__ad_wants(c, ins, k))
      kiln__ad_accum(c, ins, k, kiln__b_slice_dim(B, ct, d, off, off + n));
    off += n;
  }
  return c->tx->err;
}

int kiln__vjp_reverse(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  const kiln_i64s *dd = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  kiln__ad_accum(c, ins, 0, kiln__b_reverse(B, ct, dd ? dd->v : NULL, dd ? dd->n : 0));
  return c->tx->err;
}

/* Index operands of dynamic-slice (from 1) / dynamic-update-slice (from 2). */
static kiln_id *primal_indices(kiln__ad *c, const kiln_instr *ins, uint32_t from) {
  kiln_id *idx = kiln__b_ids(c->tx, ins->noperands);
  if (idx == NULL) return NULL;
  for (uint32_t k = from; k < ins->noperands; k++) idx[k - from] = kiln__X(c, ins, k);
  return idx;
}

int kiln__vjp_dynamic_slice(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln_id *idx = primal_indices(c, ins, 1);
  if (idx == NULL) return c->tx->err;
  kiln_id z = kiln__b_zeros(B, src_shape(c, ins, 0));
  kiln__ad_accum(c, ins, 0, kiln__b_dyn_update(B, z, ct, idx, ins->noperands - 1));
  return c->tx->err;
}

int kiln__vjp_dynamic_update_slice(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln_id *idx = primal_indices(c, ins, 2);
  if (idx == NULL) return c->tx->err;
  uint32_t n = ins->noperands - 2;
  const kiln_shape *us = src_shape(c, ins, 1);
  if (kiln__ad_wants(c, ins, 0))
    kiln__ad_accum(c, ins, 0, kiln__b_dyn_update(B, ct, kiln__b_zeros(B, us), idx, n));
  if (kiln__ad_wants(c, ins, 1))
    kiln__ad_accum(c, ins, 1, kiln__b_dyn_slice(B, ct, idx, n, us->dims));
  return c->tx->err;
}

int kiln__vjp_all_reduce(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  if (ins->noperands != 1) return kiln__ad_not_diff(c, ins);
  kiln__ad_accum(c, ins, 0, kiln__b_clone_same(B, ins, &ct, 1));
  return c->tx->err;
}

/* ---- dot ----------------------------------------------------------------- */

static bool in_list(const kiln_i64s *l, int64_t d) {
  for (uint32_t i = 0; l && i < l->n; i++)
    if (l->v[i] == d) return true;
  return false;
}

/* Position of d among the values of l sorted ascending. */
static int64_t sorted_pos(const kiln_i64s *l, int64_t d) {
  int64_t p = 0;
  for (uint32_t i = 0; i < l->n; i++) p += l->v[i] < d;
  return p;
}

static kiln_i64s free_dims(kiln__tx *tx, uint32_t rank, const kiln_i64s *bd, const kiln_i64s *cd) {
  kiln_i64s f = {kiln__b_i64s(tx, rank), 0};
  for (uint32_t d = 0; f.v && d < rank; d++)
    if (!in_list(bd, d) && !in_list(cd, d)) f.v[f.n++] = d;
  return f;
}

static kiln_i64s range(kiln__tx *tx, int64_t from, uint32_t n) {
  kiln_i64s r = {kiln__b_i64s(tx, n), n};
  for (uint32_t i = 0; r.v && i < n; i++) r.v[i] = from + i;
  return r;
}

static kiln_i64s attr_list(const kiln_instr *ins, kiln_attr_key k) {
  const kiln_i64s *l = kiln_instr_attr_ints(ins, k);
  kiln_i64s e = {NULL, 0};
  return l ? *l : e;
}

/* The cotangent of one side of a dot: ct contracted with the other side
 * over the other side's free dims, then transposed into this side's order.
 * (sb, sc) are this side's batch/contracting dims, (ob, oc) the other's;
 * `ct_free_at` is where the other side's free dims start in ct. */
static kiln_id dot_side(kiln__ad *c, kiln_id ct, kiln_id other, const kiln_shape *self,
                        const kiln_shape *oshape, kiln_i64s sb, kiln_i64s sc, kiln_i64s ob,
                        kiln_i64s oc, int64_t ct_free_at) {
  kiln__tx *tx = c->tx;
  uint32_t nb = sb.n;
  kiln_i64s sfree = free_dims(tx, self->rank, &sb, &sc);
  kiln_i64s ofree = free_dims(tx, oshape->rank, &ob, &oc);
  kiln_i64s lb = range(tx, 0, nb), lc = range(tx, ct_free_at, ofree.n);
  int64_t *perm = kiln__b_i64s(tx, self->rank);
  if (tx->err) return KILN_NO_ID;
  kiln_dtype ctt = kiln__b_shape(tx, ct)->dtype;
  /* dot(other, ct) puts the contracting dims first: when that is this
   * side's order (the rhs of a plain matmul: dW = x^T . ct) no transpose is
   * left for the compiler to materialize. */
  bool swap = true, plain = true;
  for (uint32_t i = 0; i < nb; i++) perm[sb.v[i]] = i;
  for (uint32_t k = 0; k < sc.n; k++) perm[sc.v[k]] = nb + sorted_pos(&oc, oc.v[k]);
  for (uint32_t j = 0; j < sfree.n; j++) perm[sfree.v[j]] = nb + sc.n + j;
  for (uint32_t d = 0; d < self->rank; d++) swap &= perm[d] == (int64_t)d;
  kiln_id o = kiln__b_as(&c->b, other, ctt), r;
  if (swap) return kiln__b_as(&c->b, kiln__b_dot(&c->b, o, ct, &ob, &ofree, &lb, &lc), self->dtype);
  r = kiln__b_dot(&c->b, ct, o, &lb, &lc, &ob, &ofree);
  for (uint32_t j = 0; j < sfree.n; j++) perm[sfree.v[j]] = nb + j;
  for (uint32_t k = 0; k < sc.n; k++) perm[sc.v[k]] = nb + sfree.n + sorted_pos(&oc, oc.v[k]);
  for (uint32_t d = 0; d < self->rank; d++) plain &= perm[d] == (int64_t)d;
  if (!plain) r = kiln__b_transpose(&c->b, r, perm, self->rank);
  return kiln__b_as(&c->b, r, self->dtype);
}

int kiln__vjp_dot(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln_i64s lb = attr_list(ins, KILN_ATTR_LHS_BATCH_DIMS),
            lc = attr_list(ins, KILN_ATTR_LHS_CONTRACTING_DIMS);
  kiln_i64s rb = attr_list(ins, KILN_ATTR_RHS_BATCH_DIMS),
            rc = attr_list(ins, KILN_ATTR_RHS_CONTRACTING_DIMS);
  const kiln_shape *ls = src_shape(c, ins, 0), *rs = src_shape(c, ins, 1);
  uint32_t nlfree = ls->rank - lb.n - lc.n;
  if (kiln__ad_wants(c, ins, 0))
    kiln__ad_accum(c, ins, 0,
                   dot_side(c, ct, kiln__X(c, ins, 1), ls, rs, lb, lc, rb, rc, lb.n + nlfree));
  if (kiln__ad_wants(c, ins, 1))
    kiln__ad_accum(c, ins, 1, dot_side(c, ct, kiln__X(c, ins, 0), rs, ls, rb, rc, lb, lc, lb.n));
  return c->tx->err;
}
