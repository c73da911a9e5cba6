/* Reductions with any reducer, rewritten as trees of elementwise steps, so
 * that the ordinary elementwise rules differentiate them.
 *
 * A reduce whose to_apply is not a plain add/mul/max/min (argmax and argmin
 * as variadic reduces over (values, iota), sums of pairs, any reducer made
 * of elementwise ops) has no rule of its own. Instead the transform builds
 * a computation that computes the same reduction with the reducer applied
 * elementwise to whole arrays: the reduced dimensions are flattened into
 * one of size N, padded with the init values to a power of two, and halved
 * log2(N) times by applying the reducer to the two halves; the init value is
 * folded in last as the accumulator. The reduce is then differentiated as a
 * call of that computation. For a selecting reducer (argmax) every step
 * selects, so the derivative flows to exactly the element the reduce
 * selected, and integer outputs (the index) get zero cotangents as all
 * integer values do. XLA leaves the order of a reduction unspecified, so
 * for reducers that are associative and commutative the tree computes the
 * same value as the reduce itself.
 */
#include <stdio.h>
#include <string.h>

#include "common/arena.h"
#include "compiler/transforms/rules.h"

/* ops a reducer may use when applied elementwise to arrays */
static bool scalar_op_ok(kiln_opcode op) {
  return (kiln_opcode_flags(op) & KILN_OPF_ELEMENTWISE) || op == KILN_OP_COMPARE ||
         op == KILN_OP_SELECT || op == KILN_OP_CLAMP || op == KILN_OP_TUPLE ||
         op == KILN_OP_GET_TUPLE_ELEMENT || op == KILN_OP_PARAMETER || op == KILN_OP_CONSTANT ||
         op == KILN_OP_CALL;
}

bool kiln__tf_scalar_comp_ok(const kiln_module *m, const kiln_computation *f, uint32_t depth) {
  if (f == NULL || depth > 16 || kiln_computation_root(m, f) == NULL) return false;
  for (uint32_t i = 0; i < f->ninstrs; i++) {
    const kiln_instr *s = m->instrs[f->instrs[i]];
    if (!scalar_op_ok(s->op) || (kiln_shape_is_array(&s->shape) && s->shape.rank != 0))
      return false;
    if (s->op == KILN_OP_CALL &&
        (s->ncalled != 1 ||
         !kiln__tf_scalar_comp_ok(m, kiln_module_computation(m, s->called[0]), depth + 1)))
      return false;
  }
  return true;
}

kiln_id kiln__tf_apply_scalar(kiln__b *b, const kiln_computation *f, const kiln_id *args,
                              const int64_t *dims, uint32_t rank, const kiln_instr *where) {
  kiln__tx *tx = b->tx;
  const kiln_module *m = tx->m;
  const kiln_instr *root = kiln_computation_root(m, f);
  uint32_t n0 = m->ninstrs;
  kiln_id *val = kiln_arena_calloc(tx->scratch, n0 ? n0 : 1, sizeof *val);
  if (val == NULL) return kiln__tx_oom(tx), KILN_NO_ID;
  if (root == NULL)
    return kiln__tx_fail(tx, KILN_EINVAL, where, "%s: computation %s has no root", tx->name,
                         f->name),
           KILN_NO_ID;
  for (uint32_t i = 0; i < f->ninstrs && tx->err == 0; i++) {
    const kiln_instr *s = m->instrs[f->instrs[i]];
    if (!scalar_op_ok(s->op) || (kiln_shape_is_array(&s->shape) && s->shape.rank != 0))
      return kiln__tx_fail(
                 tx, KILN_EUNIMPL, where,
                 "%s: computation %s uses %s %s, which cannot be applied elementwise to arrays; "
                 "the %s has no derivative yet",
                 tx->name, f->name, kiln_opcode_name(s->op), s->name ? s->name : "",
                 where ? kiln_opcode_name(where->op) : "computation"),
             KILN_NO_ID;
    kiln_id *ops = kiln__b_ids(tx, s->noperands);
    if (ops == NULL) return KILN_NO_ID;
    for (uint32_t k = 0; k < s->noperands; k++) ops[k] = val[s->operands[k]];
    switch (s->op) {
    case KILN_OP_PARAMETER: val[s->id] = args[s->param_number]; break;
    case KILN_OP_CONSTANT:
      val[s->id] = kiln__b_broadcast(b, kiln__b_clone_same(b, s, NULL, 0), dims, rank, NULL, 0);
      break;
    case KILN_OP_TUPLE: val[s->id] = kiln__b_tuple(b, ops, s->noperands); break;
    case KILN_OP_GET_TUPLE_ELEMENT:
      val[s->id] = kiln__b_gte(b, ops[0], kiln_instr_attr_int(s, KILN_ATTR_INDEX, 0));
      break;
    case KILN_OP_CALL: { /* JAX wraps jnp.where and friends in calls */
      const kiln_computation *g = s->ncalled == 1 ? kiln_module_computation(m, s->called[0]) : NULL;
      if (g == NULL)
        return kiln__tx_fail(tx, KILN_EINVAL, where, "%s: malformed call in %s", tx->name, f->name),
               KILN_NO_ID;
      val[s->id] = kiln__tf_apply_scalar(b, g, ops, dims, rank, where);
      break;
    }
    default: val[s->id] = kiln__b_clone(b, s, ops, s->noperands);
    }
  }
  return tx->err ? KILN_NO_ID : val[root->id];
}

/* Output k of a reducer's result r (a tuple, or one array). */
static kiln_id out_k(kiln__b *b, kiln_id r, uint32_t k) {
  if (r == KILN_NO_ID) return KILN_NO_ID;
  return kiln_shape_is_tuple(kiln__b_shape(b->tx, r)) ? kiln__b_gte(b, r, k) : r;
}

/* One application of the reducer to (acc..., x...) of dims [rows, w]. */
static void step(kiln__b *b, const kiln_computation *f, kiln_id *acc, const kiln_id *x, uint32_t n,
                 int64_t rows, int64_t w, const kiln_instr *where) {
  kiln_id *args = kiln__b_ids(b->tx, 2 * n);
  if (args == NULL) return;
  for (uint32_t k = 0; k < n; k++) args[k] = acc[k], args[n + k] = x[k];
  int64_t d[2] = {rows, w};
  kiln_id r = kiln__tf_apply_scalar(b, f, args, d, 2, where);
  for (uint32_t k = 0; k < n; k++) acc[k] = out_k(b, r, k);
}

uint32_t kiln__tf_reduce_tree(kiln__tx *tx, const kiln_instr *red) {
  const kiln_module *m = tx->m;
  const kiln_i64s *dims = kiln_instr_attr_ints(red, KILN_ATTR_DIMENSIONS);
  const kiln_computation *f = red->ncalled == 1 ? kiln_module_computation(m, red->called[0]) : NULL;
  uint32_t n = red->noperands / 2, comp;
  if (f == NULL || dims == NULL || n == 0 || red->noperands % 2)
    return kiln__tx_fail(tx, KILN_EINVAL, red, "%s: malformed reduce", tx->name), KILN_NO_ID;
  char name[160];
  snprintf(name, sizeof name, "%.120s.tree", f->name);
  if (kiln__b_new_comp(tx, name, &comp)) return KILN_NO_ID;
  kiln__b b = {tx, comp};
  const kiln_shape *xs = &m->instrs[red->operands[0]]->shape;
  uint32_t r = xs->rank, nk = 0;
  int64_t *perm = kiln__b_i64s(tx, r + 1), *kept = kiln__b_i64s(tx, r + 1);
  kiln_id *v = kiln__b_ids(tx, n), *init = kiln__b_ids(tx, n), *lo = kiln__b_ids(tx, n),
          *hi = kiln__b_ids(tx, n);
  if (perm == NULL || kept == NULL || v == NULL || init == NULL || lo == NULL || hi == NULL)
    return KILN_NO_ID;
  int64_t rows = 1, cols = 1;
  for (uint32_t d = 0; d < r; d++) {
    bool reduced = false;
    for (uint32_t i = 0; i < dims->n; i++) reduced |= dims->v[i] == (int64_t)d;
    if (!reduced) perm[nk] = d, kept[nk++] = xs->dims[d], rows *= xs->dims[d];
  }
  for (uint32_t d = 0, j = nk; d < r; d++) {
    bool reduced = false;
    for (uint32_t i = 0; i < dims->n; i++) reduced |= dims->v[i] == (int64_t)d;
    if (reduced) perm[j++] = d, cols *= xs->dims[d];
  }
  int64_t width = 1;
  while (width < cols) width *= 2;
  for (uint32_t k = 0; k < n; k++) {
    const kiln_shape *ks = &m->instrs[red->operands[k]]->shape;
    kiln_id x = kiln__b_param(&b, k, ks, "x");
    init[k] = kiln__b_param(&b, n + k, &m->instrs[red->operands[n + k]]->shape, "init");
    int64_t flat[2] = {rows, cols}, plo[2] = {0, 0}, phi[2] = {0, width - cols};
    v[k] = kiln__b_reshape(&b, kiln__b_transpose(&b, x, perm, r), flat, 2);
    if (cols > 0 && width > cols) v[k] = kiln__b_pad(&b, v[k], init[k], plo, phi, NULL);
  }
  for (int64_t w = cols > 0 ? width : 1; cols > 0 && w > 1 && tx->err == 0; w /= 2) {
    for (uint32_t k = 0; k < n; k++) {
      lo[k] = kiln__b_slice_dim(&b, v[k], 1, 0, w / 2);
      hi[k] = kiln__b_slice_dim(&b, v[k], 1, w / 2, w);
    }
    step(&b, f, lo, hi, n, rows, w / 2, red);
    memcpy(v, lo, n * sizeof *v);
  }
  /* the init value is the first accumulator, as in the reduce */
  int64_t one[2] = {rows, 1};
  for (uint32_t k = 0; k < n; k++) lo[k] = kiln__b_broadcast(&b, init[k], one, 2, NULL, 0);
  if (cols > 0) step(&b, f, lo, v, n, rows, 1, red);
  for (uint32_t k = 0; k < n; k++) v[k] = kiln__b_reshape(&b, lo[k], kept, nk);
  kiln_id root = n == 1 ? v[0] : kiln__b_tuple(&b, v, n);
  if (tx->err) return KILN_NO_ID;
  tx->m->comps[comp]->root = root;
  return comp;
}
