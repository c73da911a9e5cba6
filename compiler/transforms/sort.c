/* Derivatives of sort and topk: both move elements, so their tangents move
 * the same way.
 *
 * sort gains one more operand, an iota along the sort dimension, which the
 * comparator ignores; the sorted iota is the permutation the sort applied
 * (per row), and every floating operand's tangent is gathered through it
 * (take_along_axis). The transpose scatter-adds the cotangent back through
 * the same permutation. topk returns its permutation (the indices) itself.
 * Integer operands and the indices have zero tangents. Ties move as the sort
 * moves them, so the derivative follows the element the sort put there.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "compiler/transforms/rules.h"

#define B (&c->b)

/* Gather/scatter dimension numbers of take_along_axis on dim d of rank r:
 * all other dims batch, the index reads one element of dim d. */
static kiln__gdims along(kiln__tx *tx, uint32_t r, int64_t d) {
  kiln__gdims g;
  memset(&g, 0, sizeof g);
  int64_t *bd = kiln__b_i64s(tx, r), *one = kiln__b_i64s(tx, r), *dd = kiln__b_i64s(tx, 1);
  if (bd == NULL || one == NULL || dd == NULL) return g;
  uint32_t nb = 0;
  for (uint32_t i = 0; i < r; i++) {
    one[i] = 1;
    if ((int64_t)i != d) bd[nb++] = i;
  }
  dd[0] = d;
  g.collapsed = (kiln_i64s){dd, 1};
  g.start_map = (kiln_i64s){dd, 1};
  g.obatch = (kiln_i64s){bd, nb};
  g.ibatch = (kiln_i64s){bd, nb};
  g.sizes = (kiln_i64s){one, r};
  g.ivd = r;
  return g;
}

/* The comparator of `srt` taking one more (ignored) pair of parameters of
 * type t. */
static uint32_t wider_comparator(kiln__tx *tx, const kiln_instr *srt, kiln_dtype t) {
  const kiln_computation *cmp =
      srt->ncalled == 1 ? kiln_module_computation(tx->m, srt->called[0]) : NULL;
  if (cmp == NULL)
    return kiln__tx_fail(tx, KILN_EINVAL, srt, "%s: sort without a comparator", tx->name),
           KILN_NO_ID;
  char name[160];
  snprintf(name, sizeof name, "%.120s.perm", cmp->name);
  uint32_t comp, n = 2 * srt->noperands;
  if (kiln__b_new_comp(tx, name, &comp)) return KILN_NO_ID;
  kiln__b b = {tx, comp};
  kiln_id *ps = kiln__b_ids(tx, n + 2);
  kiln_shape s;
  if (ps == NULL || kiln_shape_make_array(tx->m->arena, &s, t, NULL, 0))
    return kiln__tx_oom(tx), KILN_NO_ID;
  for (uint32_t i = 0; i < n; i++) {
    const kiln_instr *p = kiln_computation_param(tx->m, cmp, i);
    if (p == NULL)
      return kiln__tx_fail(tx, KILN_EINVAL, srt, "%s: comparator %s lacks parameter %u", tx->name,
                           cmp->name, i),
             KILN_NO_ID;
    ps[i] = kiln__b_param(&b, i, &p->shape, NULL);
  }
  ps[n] = kiln__b_param(&b, n, &s, NULL);
  ps[n + 1] = kiln__b_param(&b, n + 1, &s, NULL);
  kiln_id root = kiln__ad_inline(tx, &b, cmp, ps);
  if (root == KILN_NO_ID) return KILN_NO_ID;
  tx->m->comps[comp]->root = root;
  return comp;
}

/* The sort of ins's primal operands and an iota: sets the primal of ins and
 * returns the permutation. */
static kiln_id sort_with_perm(kiln__ad *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  const kiln_i64s *dd = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  const kiln_shape *xs = &tx->m->instrs[ins->operands[0]]->shape;
  if (dd == NULL || dd->n != 1) return kiln__ad_not_diff(c, ins), KILN_NO_ID;
  uint32_t n = ins->noperands;
  kiln_dtype it = xs->dims[dd->v[0]] < INT32_MAX ? KILN_S32 : KILN_S64;
  kiln_id *ops = kiln__b_ids(tx, n + 1);
  if (ops == NULL) return KILN_NO_ID;
  for (uint32_t k = 0; k < n; k++) ops[k] = kiln__X(c, ins, k);
  ops[n] = kiln__b_iota(B, it, xs->dims, xs->rank, dd->v[0]);
  uint32_t cmp = wider_comparator(tx, ins, it);
  kiln_instr *s = kiln__b_start(B, KILN_OP_SORT, ops, n + 1);
  if (s == NULL || cmp == KILN_NO_ID) return KILN_NO_ID;
  if (kiln_instr_set_attr_ints(tx->m, s, KILN_ATTR_DIMENSIONS, dd->v, 1) ||
      kiln_instr_set_called(tx->m, s, &cmp, 1) ||
      kiln_instr_set_attr_int(tx->m, s, KILN_ATTR_IS_STABLE,
                              kiln_instr_attr_int(ins, KILN_ATTR_IS_STABLE, 0)))
    return kiln__tx_oom(tx), KILN_NO_ID;
  kiln_id r = kiln__b_finish(B, s);
  if (n == 1) {
    c->prim[kiln__ad_slot(c, ins->id)] = kiln__b_gte(B, r, 0);
  } else {
    kiln_id *el = kiln__b_ids(tx, n);
    if (el == NULL) return KILN_NO_ID;
    for (uint32_t k = 0; k < n; k++) el[k] = kiln__b_gte(B, r, k);
    c->prim[kiln__ad_slot(c, ins->id)] = kiln__b_tuple(B, el, n);
  }
  return kiln__b_gte(B, r, n);
}

/* Output k of a value shaped like ins's result (one array, or a tuple). */
static kiln_id elem(kiln__ad *c, const kiln_instr *ins, kiln_id v, uint32_t k) {
  return kiln_shape_is_tuple(&ins->shape) ? kiln__b_gte(B, v, k) : v;
}

int kiln__jvp_sort(kiln__ad *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  kiln_id perm = sort_with_perm(c, ins);
  if (perm == KILN_NO_ID) return tx->err;
  uint32_t n = ins->noperands;
  const kiln_shape *xs = &tx->m->instrs[ins->operands[0]]->shape;
  kiln__gdims g = along(tx, xs->rank, kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS)->v[0]);
  kiln_id *t = kiln__b_ids(tx, n);
  if (t == NULL) return tx->err;
  for (uint32_t k = 0; k < n; k++) {
    const kiln_shape *ks = &tx->m->instrs[ins->operands[k]]->shape;
    t[k] = kiln__T(c, ins, k) == KILN_NO_ID || !kiln__b_is_float_shape(ks)
               ? kiln__b_zeros(B, ks)
               : kiln__tf_gather(B, kiln__T(c, ins, k), perm, &g);
  }
  c->tan[kiln__ad_slot(c, ins->id)] = n == 1 ? t[0] : kiln__b_tuple(B, t, n);
  return tx->err;
}

int kiln__fwd_sort(kiln__ad *c, const kiln_instr *ins) {
  kiln_id perm = sort_with_perm(c, ins);
  c->aux[kiln__ad_slot(c, ins->id)] = perm == KILN_NO_ID ? NULL : (void *)(uintptr_t)(perm + 1u);
  return c->tx->err;
}

int kiln__vjp_sort(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__tx *tx = c->tx;
  kiln_id perm = (kiln_id)((uintptr_t)c->aux[kiln__ad_slot(c, ins->id)] - 1u);
  if (c->aux[kiln__ad_slot(c, ins->id)] == NULL)
    return kiln__tx_fail(tx, KILN_EINTERNAL, ins,
                         "%s: internal error: sort without its permutation", tx->name);
  const kiln_shape *xs = &tx->m->instrs[ins->operands[0]]->shape;
  kiln__gdims g = along(tx, xs->rank, kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS)->v[0]);
  for (uint32_t k = 0; k < ins->noperands && tx->err == 0; k++) {
    const kiln_shape *ks = &tx->m->instrs[ins->operands[k]]->shape;
    if (!kiln__ad_wants(c, ins, k)) continue;
    uint32_t add = kiln__b_reducer(tx, KILN_OP_ADD, ks->dtype);
    kiln__ad_accum(c, ins, k,
                   kiln__tf_scatter(B, kiln__b_zeros(B, ks), perm, elem(c, ins, ct, k), &g, add));
  }
  return tx->err;
}

/* ---- topk ------------------------------------------------------------------ */

int kiln__jvp_topk(kiln__ad *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  const kiln_shape *xs = &tx->m->instrs[ins->operands[0]]->shape;
  if (!kiln_shape_is_tuple(&ins->shape) || ins->shape.rank != 2 || xs->rank == 0)
    return kiln__ad_not_diff(c, ins);
  kiln__gdims g = along(tx, xs->rank, xs->rank - 1);
  kiln_id t[2] = {
      kiln__tf_gather(B, kiln__ad_tmat(c, ins, 0), kiln__b_gte(B, kiln__Y(c, ins), 1), &g),
      kiln__b_zeros(B, &ins->shape.tuple[1])};
  c->tan[kiln__ad_slot(c, ins->id)] = kiln__b_tuple(B, t, 2);
  return tx->err;
}

int kiln__vjp_topk(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__tx *tx = c->tx;
  const kiln_shape *xs = &tx->m->instrs[ins->operands[0]]->shape;
  if (!kiln_shape_is_tuple(&ins->shape) || ins->shape.rank != 2 || xs->rank == 0)
    return kiln__ad_not_diff(c, ins);
  kiln__gdims g = along(tx, xs->rank, xs->rank - 1);
  uint32_t add = kiln__b_reducer(tx, KILN_OP_ADD, xs->dtype);
  kiln__ad_accum(c, ins, 0,
                 kiln__tf_scatter(B, kiln__b_zeros(B, xs), kiln__b_gte(B, kiln__Y(c, ins), 1),
                                  kiln__b_gte(B, ct, 0), &g, add));
  return tx->err;
}
