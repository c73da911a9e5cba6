/* vmap: the batching driver, the program-level transform and the rules for
 * elementwise and shape ops.
 *
 * Every value of a batched region is either unbatched (as in the source) or
 * batched with the batch dimension first; tuples record this per leaf
 * (kiln__bsig). Keeping the batch dimension in one place makes most rules
 * one line: shift the op's dimension attributes by one. An instruction none
 * of whose operands is batched is copied as it is, so unbatched inputs stay
 * unbatched and cost nothing (JAX's not-mapped values). An op that must
 * combine batched and unbatched operands broadcasts the unbatched ones.
 * The parameters' batch axes (in_axes) are moved to the front on entry and
 * the results' to out_axes on exit.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/arena.h"
#include "compiler/ir/lapack.h"
#include "compiler/transforms/rules.h"
#include "compiler/transforms/transform.h"

#define B (&c->b)

/* ---- batching signatures -------------------------------------------------- */

kiln__bsig *kiln__bsig_make(kiln__tx *tx, const kiln_shape *s, bool batched) {
  kiln__bsig *g = kiln_arena_calloc(tx->scratch, 1, sizeof *g);
  if (g == NULL) return kiln__tx_oom(tx), NULL;
  if (kiln_shape_is_tuple(s)) {
    g->n = s->rank;
    g->el = kiln_arena_calloc(tx->scratch, s->rank ? s->rank : 1, sizeof *g->el);
    if (g->el == NULL) return kiln__tx_oom(tx), NULL;
    for (uint32_t i = 0; i < s->rank; i++) {
      kiln__bsig *e = kiln__bsig_make(tx, &s->tuple[i], batched);
      if (e == NULL) return NULL;
      g->el[i] = *e;
    }
  } else {
    g->b = batched && kiln_shape_is_array(s);
  }
  return g;
}

bool kiln__bsig_any(const kiln__bsig *s) {
  if (s == NULL) return false;
  if (s->b) return true;
  for (uint32_t i = 0; i < s->n; i++)
    if (kiln__bsig_any(&s->el[i])) return true;
  return false;
}

bool kiln__bsig_equal(const kiln__bsig *a, const kiln__bsig *b) {
  if (a->b != b->b || a->n != b->n) return false;
  for (uint32_t i = 0; i < a->n; i++)
    if (!kiln__bsig_equal(&a->el[i], &b->el[i])) return false;
  return true;
}

kiln__bsig *kiln__bsig_join(kiln__tx *tx, const kiln__bsig *a, const kiln__bsig *b) {
  kiln__bsig *g = kiln_arena_calloc(tx->scratch, 1, sizeof *g);
  if (g == NULL) return kiln__tx_oom(tx), NULL;
  g->b = a->b || b->b;
  g->n = a->n;
  if (a->n) {
    g->el = kiln_arena_calloc(tx->scratch, a->n, sizeof *g->el);
    if (g->el == NULL) return kiln__tx_oom(tx), NULL;
    for (uint32_t i = 0; i < a->n && i < b->n; i++) {
      kiln__bsig *e = kiln__bsig_join(tx, &a->el[i], &b->el[i]);
      if (e == NULL) return NULL;
      g->el[i] = *e;
    }
  }
  return g;
}

/* The shape of a value of source shape s batched as g. */
static int batched_shape(kiln__tx *tx, const kiln_shape *s, const kiln__bsig *g, int64_t bsize,
                         kiln_shape *out) {
  if (kiln_shape_is_tuple(s)) {
    kiln_shape *el = kiln_arena_calloc(tx->m->arena, s->rank ? s->rank : 1, sizeof *el);
    if (el == NULL) return kiln__tx_oom(tx);
    for (uint32_t i = 0; i < s->rank; i++)
      if (batched_shape(tx, &s->tuple[i], &g->el[i], bsize, &el[i])) return tx->err;
    if (kiln_shape_make_tuple(tx->m->arena, out, el, s->rank)) return kiln__tx_oom(tx);
    return 0;
  }
  if (g->b) return kiln__b_shape_batched(tx, s, bsize, out);
  if (kiln_shape_copy(tx->m->arena, out, s)) return kiln__tx_oom(tx);
  return 0;
}

/* ---- the driver ----------------------------------------------------------- */

int kiln__bt_init(kiln__bt *c, kiln__tx *tx, uint32_t dst, const kiln_computation *src,
                  int64_t bsize) {
  memset(c, 0, sizeof *c);
  c->tx = tx;
  c->b.tx = tx;
  c->b.comp = dst;
  c->src = src;
  c->bsize = bsize;
  /* The tables cover src's ids only (as kiln__ad_init's): a region per
   * called computation with module-sized tables cost the square of the
   * nesting depth. */
  uint32_t lo = UINT32_MAX, hi = 0;
  for (uint32_t i = 0; i < src->ninstrs; i++) {
    if (src->instrs[i] >= tx->m->ninstrs)
      return kiln__tx_fail(tx, KILN_EINTERNAL, NULL, "%s: internal error: region grew", tx->name);
    if (src->instrs[i] < lo) lo = src->instrs[i];
    if (src->instrs[i] > hi) hi = src->instrs[i];
  }
  c->lo = src->ninstrs ? lo : 0;
  c->n = src->ninstrs ? hi - lo + 1 : 0;
  c->val = kiln__b_ids(tx, c->n ? c->n : 1);
  c->sig = kiln_arena_calloc(tx->scratch, c->n ? c->n : 1, sizeof *c->sig);
  if (c->val == NULL || c->sig == NULL) return kiln__tx_oom(tx);
  return 0;
}

static int no_rule(kiln__bt *c, const kiln_instr *ins) {
  char where[KILN_STATUS_WHERE_MAX];
  kiln_instr_where(c->tx->m, ins, where, sizeof where);
  if (ins->op == KILN_OP_CUSTOM_CALL) {
    const char *target = kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET);
    if (kiln_lapack_is_target(target))
      return kiln__tx_fail(c->tx, KILN_EUNIMPL, ins,
                           "%s: custom-call target \"%s\" (%s) is a LAPACK call, which Kiln's "
                           "vmap does not batch: apply jax.vmap before exporting (the calls then "
                           "carry the batch dimensions)",
                           c->tx->name, target, where);
    return kiln__tx_fail(
        c->tx, KILN_EUNIMPL, ins,
        "%s: custom-call target \"%.80s\" (%s) has no batching rule: its body is opaque to "
        "the transforms",
        c->tx->name, target ? target : "", where);
  }
  const char *why = kiln__tf_no_rule_why(kiln__tf_no_batching, kiln__tf_no_batching_count, ins->op);
  return kiln__tx_fail(c->tx, KILN_EUNIMPL, ins, "%s: op %s (%s) has no batching rule%s%s",
                       c->tx->name, kiln_opcode_name(ins->op), where, why ? ": " : "",
                       why ? why : "");
}

int kiln__batch_region(kiln__bt *c, const kiln_id *args, kiln__bsig *const *sigs) {
  kiln__tx *tx = c->tx;
  const kiln_module *m = tx->m;
  for (uint32_t i = 0; i < c->src->ninstrs && tx->err == 0; i++) {
    if (kiln__tx_poll(tx)) break;
    const kiln_instr *ins = m->instrs[c->src->instrs[i]];
    if (ins->op == KILN_OP_PARAMETER) {
      c->val[kiln__bt_slot(c, ins->id)] = args[ins->param_number];
      c->sig[kiln__bt_slot(c, ins->id)] = sigs[ins->param_number];
      continue;
    }
    bool any = false;
    for (uint32_t k = 0; k < ins->noperands; k++)
      any |= kiln__bsig_any(c->sig[kiln__bt_slot(c, ins->operands[k])]);
    if (!any) {
      kiln_id *ops = kiln__b_ids(tx, ins->noperands);
      if (ops == NULL) break;
      for (uint32_t k = 0; k < ins->noperands; k++)
        ops[k] = c->val[kiln__bt_slot(c, ins->operands[k])];
      c->val[kiln__bt_slot(c, ins->id)] = kiln__b_clone_same(B, ins, ops, ins->noperands);
      c->sig[kiln__bt_slot(c, ins->id)] = kiln__bsig_make(tx, &ins->shape, false);
      continue;
    }
    const kiln__rule *r = kiln__tf_rule_of(ins);
    if (r->batch == NULL) return no_rule(c, ins);
    r->batch(c, ins);
  }
  return tx->err;
}

kiln_id kiln__bt_coerce(kiln__bt *c, kiln_id v, const kiln__bsig *have, const kiln__bsig *want) {
  kiln__tx *tx = c->tx;
  if (tx->err) return KILN_NO_ID;
  const kiln_shape *s = kiln__b_shape(tx, v);
  if (kiln_shape_is_tuple(s)) {
    if (kiln__bsig_equal(have, want)) return v;
    kiln_id *el = kiln__b_ids(tx, s->rank);
    if (el == NULL) return KILN_NO_ID;
    for (uint32_t i = 0; i < s->rank; i++)
      el[i] = kiln__bt_coerce(c, kiln__b_gte(B, v, i), &have->el[i], &want->el[i]);
    return kiln__b_tuple(B, el, s->rank);
  }
  if (!want->b || have->b || !kiln_shape_is_array(s)) return v;
  int64_t *dims = kiln__b_i64s(tx, s->rank + 1), *map = kiln__b_i64s(tx, s->rank);
  if (dims == NULL || map == NULL) return KILN_NO_ID;
  dims[0] = c->bsize;
  for (uint32_t d = 0; d < s->rank; d++) {
    dims[d + 1] = s->dims[d];
    map[d] = d + 1;
  }
  return kiln__b_broadcast(B, v, dims, s->rank + 1, map, s->rank);
}

bool kiln__bt_batched(const kiln__bt *c, const kiln_instr *ins, uint32_t k) {
  return kiln__bsig_any(c->sig[kiln__bt_slot(c, ins->operands[k])]);
}

kiln_id kiln__bt_operand(kiln__bt *c, const kiln_instr *ins, uint32_t k) {
  kiln_id op = ins->operands[k];
  kiln__bsig *all = kiln__bsig_make(c->tx, &c->tx->m->instrs[op]->shape, true);
  if (all == NULL) return KILN_NO_ID;
  return kiln__bt_coerce(c, c->val[kiln__bt_slot(c, op)], c->sig[kiln__bt_slot(c, op)], all);
}

void kiln__bt_set(kiln__bt *c, const kiln_instr *ins, kiln_id v, bool batched) {
  c->val[kiln__bt_slot(c, ins->id)] = v;
  c->sig[kiln__bt_slot(c, ins->id)] = kiln__bsig_make(c->tx, &ins->shape, batched);
}

static kiln_id *batched_operands(kiln__bt *c, const kiln_instr *ins) {
  kiln_id *ops = kiln__b_ids(c->tx, ins->noperands);
  if (ops == NULL) return NULL;
  for (uint32_t k = 0; k < ins->noperands; k++) ops[k] = kiln__bt_operand(c, ins, k);
  return ops;
}

/* Shifts each entry of an INTS attribute by one (a batch dim in front);
 * with `front`, also lists 0 first. */
static int shift_attr(kiln__bt *c, kiln_instr *ins, kiln_attr_key key, bool front) {
  const kiln_i64s *l = kiln_instr_attr_ints(ins, key);
  uint32_t n = l ? l->n : 0;
  int64_t *v = kiln__b_i64s(c->tx, n + 1);
  if (v == NULL) return c->tx->err;
  uint32_t o = 0;
  if (front) v[o++] = 0;
  for (uint32_t i = 0; i < n; i++) v[o++] = l->v[i] + 1;
  if (o == 0 && l == NULL) return 0;
  if (kiln_instr_set_attr_ints(c->tx->m, ins, key, v, o)) return kiln__tx_oom(c->tx);
  return 0;
}

/* ---- rules: generic ------------------------------------------------------- */

int kiln__batch_elementwise(kiln__bt *c, const kiln_instr *ins) {
  const kiln_shape *os = &ins->shape;
  uint32_t r = os->rank;
  int64_t *dims = kiln__b_i64s(c->tx, r + 1), *map = kiln__b_i64s(c->tx, r + 1);
  kiln_id *ops = kiln__b_ids(c->tx, ins->noperands);
  if (dims == NULL || map == NULL || ops == NULL) return c->tx->err;
  dims[0] = c->bsize;
  for (uint32_t d = 0; d < r; d++) dims[d + 1] = os->dims[d], map[d] = d + 1;
  for (uint32_t k = 0; k < ins->noperands; k++) {
    kiln_id v = c->val[kiln__bt_slot(c, ins->operands[k])];
    const kiln_shape *s = &c->tx->m->instrs[ins->operands[k]]->shape;
    bool b = kiln__bt_batched(c, ins, k);
    if (b && s->rank == r)
      ops[k] = v;
    else if (b) { /* a batched scalar operand of clamp/select */
      int64_t zero = 0;
      ops[k] = kiln__b_broadcast(B, v, dims, r + 1, &zero, 1);
    } else
      ops[k] =
          kiln__b_broadcast(B, v, dims, r + 1, s->rank == r ? map : NULL, s->rank == r ? r : 0);
  }
  kiln__bt_set(c, ins, kiln__b_clone(B, ins, ops, ins->noperands), true);
  return c->tx->err;
}

int kiln__batch_same(kiln__bt *c, const kiln_instr *ins) {
  kiln_id *ops = batched_operands(c, ins);
  if (ops) kiln__bt_set(c, ins, kiln__b_clone(B, ins, ops, ins->noperands), true);
  return c->tx->err;
}

int kiln__batch_unbatched(kiln__bt *c, const kiln_instr *ins) {
  char where[KILN_STATUS_WHERE_MAX];
  kiln_instr_where(c->tx->m, ins, where, sizeof where);
  return kiln__tx_fail(c->tx, KILN_EUNIMPL, ins, "%s: op %s (%s) cannot take a batched operand",
                       c->tx->name, kiln_opcode_name(ins->op), where);
}

int kiln__batch_passthrough(kiln__bt *c, const kiln_instr *ins) {
  for (uint32_t k = 1; k < ins->noperands; k++)
    if (kiln__bt_batched(c, ins, k)) return kiln__batch_unbatched(c, ins);
  kiln_id *ops = kiln__b_ids(c->tx, ins->noperands);
  if (ops == NULL) return c->tx->err;
  for (uint32_t k = 0; k < ins->noperands; k++) ops[k] = c->val[kiln__bt_slot(c, ins->operands[k])];
  c->val[kiln__bt_slot(c, ins->id)] = kiln__b_clone(B, ins, ops, ins->noperands);
  c->sig[kiln__bt_slot(c, ins->id)] = c->sig[kiln__bt_slot(c, ins->operands[0])];
  return c->tx->err;
}

int kiln__batch_tuple(kiln__bt *c, const kiln_instr *ins) {
  kiln_id *ops = kiln__b_ids(c->tx, ins->noperands);
  kiln__bsig *g = kiln_arena_calloc(c->tx->scratch, 1, sizeof *g);
  if (ops == NULL || g == NULL) return kiln__tx_oom(c->tx);
  g->n = ins->noperands;
  g->el = kiln_arena_calloc(c->tx->scratch, g->n ? g->n : 1, sizeof *g->el);
  if (g->el == NULL) return kiln__tx_oom(c->tx);
  for (uint32_t k = 0; k < ins->noperands; k++) {
    ops[k] = c->val[kiln__bt_slot(c, ins->operands[k])];
    g->el[k] = *c->sig[kiln__bt_slot(c, ins->operands[k])];
  }
  c->val[kiln__bt_slot(c, ins->id)] = kiln__b_tuple(B, ops, ins->noperands);
  c->sig[kiln__bt_slot(c, ins->id)] = g;
  return c->tx->err;
}

int kiln__batch_gte(kiln__bt *c, const kiln_instr *ins) {
  int64_t i = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, 0);
  const kiln__bsig *g = c->sig[kiln__bt_slot(c, ins->operands[0])];
  if (i < 0 || (uint64_t)i >= g->n) return no_rule(c, ins);
  c->val[kiln__bt_slot(c, ins->id)] = kiln__b_gte(B, c->val[kiln__bt_slot(c, ins->operands[0])], i);
  c->sig[kiln__bt_slot(c, ins->id)] = &g->el[i];
  return c->tx->err;
}

int kiln__batch_dims_attr(kiln__bt *c, const kiln_instr *ins) {
  kiln_id *ops = batched_operands(c, ins);
  kiln_instr *n = ops ? kiln__b_clone_start(B, ins, ops, ins->noperands) : NULL;
  if (n && kiln_instr_has_attr(ins, KILN_ATTR_DIMENSIONS))
    shift_attr(c, n, KILN_ATTR_DIMENSIONS, false);
  kiln__bt_set(c, ins, kiln__b_finish(B, n), true);
  return c->tx->err;
}

int kiln__batch_map(kiln__bt *c, const kiln_instr *ins) {
  kiln_id *ops = batched_operands(c, ins);
  kiln_instr *n = ops ? kiln__b_clone_start(B, ins, ops, ins->noperands) : NULL;
  int64_t *all = kiln__b_i64s(c->tx, ins->shape.rank + 1);
  if (n == NULL || all == NULL) return c->tx->err;
  for (uint32_t d = 0; d <= ins->shape.rank; d++) all[d] = d;
  if (kiln_instr_set_attr_ints(c->tx->m, n, KILN_ATTR_DIMENSIONS, all, ins->shape.rank + 1))
    return kiln__tx_oom(c->tx);
  kiln__bt_set(c, ins, kiln__b_finish(B, n), true);
  return c->tx->err;
}

int kiln__batch_get_dimension_size(kiln__bt *c, const kiln_instr *ins) {
  kiln_id v = c->val[kiln__bt_slot(c, ins->operands[0])];
  kiln_instr *n = kiln__b_clone_start(B, ins, &v, 1);
  if (n == NULL) return c->tx->err;
  if (kiln_instr_set_attr_int(c->tx->m, n, KILN_ATTR_DIMENSIONS, 0)) return kiln__tx_oom(c->tx);
  shift_attr(c, n, KILN_ATTR_DIMENSIONS, false);
  kiln__bt_set(c, ins, kiln__b_finish(B, n), false);
  return c->tx->err;
}

/* ---- rules: shapes --------------------------------------------------------- */

static int64_t *batched_dims(kiln__bt *c, const kiln_shape *s) {
  int64_t *d = kiln__b_i64s(c->tx, s->rank + 1);
  if (d == NULL) return NULL;
  d[0] = c->bsize;
  if (s->rank) memcpy(d + 1, s->dims, s->rank * sizeof *d);
  return d;
}

int kiln__batch_broadcast(kiln__bt *c, const kiln_instr *ins) {
  const kiln_i64s *map = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  uint32_t n = map ? map->n : 0;
  int64_t *m2 = kiln__b_i64s(c->tx, n + 1), *dims = batched_dims(c, &ins->shape);
  if (m2 == NULL || dims == NULL) return c->tx->err;
  m2[0] = 0;
  for (uint32_t i = 0; i < n; i++) m2[i + 1] = map->v[i] + 1;
  kiln_id v = kiln__bt_operand(c, ins, 0);
  kiln__bt_set(c, ins, kiln__b_broadcast(B, v, dims, ins->shape.rank + 1, m2, n + 1), true);
  return c->tx->err;
}

int kiln__batch_reshape(kiln__bt *c, const kiln_instr *ins) {
  int64_t *dims = batched_dims(c, &ins->shape);
  if (dims == NULL) return c->tx->err;
  kiln_id v = kiln__bt_operand(c, ins, 0);
  kiln__bt_set(c, ins, kiln__b_reshape(B, v, dims, ins->shape.rank + 1), true);
  return c->tx->err;
}

int kiln__batch_transpose(kiln__bt *c, const kiln_instr *ins) {
  const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  uint32_t r = ins->shape.rank;
  int64_t *p2 = kiln__b_i64s(c->tx, r + 1);
  if (p2 == NULL || p == NULL) return no_rule(c, ins);
  p2[0] = 0;
  for (uint32_t i = 0; i < r; i++) p2[i + 1] = p->v[i] + 1;
  kiln__bt_set(c, ins, kiln__b_transpose(B, kiln__bt_operand(c, ins, 0), p2, r + 1), true);
  return c->tx->err;
}

int kiln__batch_slice(kiln__bt *c, const kiln_instr *ins) {
  const kiln_i64s *sl = kiln_instr_attr_ints(ins, KILN_ATTR_SLICE);
  uint32_t r = ins->shape.rank;
  int64_t *st = kiln__b_i64s(c->tx, r + 1), *li = kiln__b_i64s(c->tx, r + 1),
          *sd = kiln__b_i64s(c->tx, r + 1);
  if (st == NULL || li == NULL || sd == NULL || sl == NULL) return no_rule(c, ins);
  st[0] = 0, li[0] = c->bsize, sd[0] = 1;
  for (uint32_t d = 0; d < r; d++) {
    st[d + 1] = sl->v[3 * d];
    li[d + 1] = sl->v[3 * d + 1];
    sd[d + 1] = sl->v[3 * d + 2];
  }
  kiln__bt_set(c, ins, kiln__b_slice(B, kiln__bt_operand(c, ins, 0), st, li, sd), true);
  return c->tx->err;
}

int kiln__batch_pad(kiln__bt *c, const kiln_instr *ins) {
  const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_PADDING);
  uint32_t r = ins->shape.rank;
  int64_t *lo = kiln__b_i64s(c->tx, r + 1), *hi = kiln__b_i64s(c->tx, r + 1),
          *in = kiln__b_i64s(c->tx, r + 1);
  if (lo == NULL || hi == NULL || in == NULL || p == NULL) return no_rule(c, ins);
  for (uint32_t d = 0; d < r; d++) {
    lo[d + 1] = p->v[3 * d];
    hi[d + 1] = p->v[3 * d + 1];
    in[d + 1] = p->v[3 * d + 2];
  }
  kiln_id x = kiln__bt_operand(c, ins, 0);
  if (!kiln__bt_batched(c, ins, 1)) {
    kiln__bt_set(c, ins, kiln__b_pad(B, x, c->val[kiln__bt_slot(c, ins->operands[1])], lo, hi, in),
                 true);
    return c->tx->err;
  }
  /* A padding value per batch element: pad with zero, then put the values
   * where a padded mask says the padding went. */
  kiln_dtype t = ins->shape.dtype;
  kiln_id padded = kiln__b_pad(B, x, kiln__b_scalar(B, t, 0), lo, hi, in);
  const kiln_shape *xs = kiln__b_shape(c->tx, x);
  kiln_id ones = kiln__b_full(B, KILN_PRED, xs->dims, xs->rank, 1);
  kiln_id mask = kiln__b_pad(B, ones, kiln__b_scalar(B, KILN_PRED, 0), lo, hi, in);
  const kiln_shape *ps = kiln__b_shape(c->tx, padded);
  int64_t zero = 0;
  kiln_id v = kiln__b_broadcast(B, c->val[kiln__bt_slot(c, ins->operands[1])], ps->dims, ps->rank,
                                &zero, 1);
  kiln__bt_set(c, ins, kiln__b_select(B, mask, padded, v), true);
  return c->tx->err;
}

int kiln__batch_concatenate(kiln__bt *c, const kiln_instr *ins) {
  kiln_id *ops = batched_operands(c, ins);
  const kiln_i64s *d = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  if (ops == NULL || d == NULL || d->n != 1) return no_rule(c, ins);
  kiln__bt_set(c, ins, kiln__b_concat(B, ops, ins->noperands, d->v[0] + 1), true);
  return c->tx->err;
}

/* ---- the program-level transform -------------------------------------------- */

/* Moves dimension `from` of v to position `to`. */
kiln_id kiln__bt_move_axis(kiln__b *b, kiln_id v, int64_t from, int64_t to) {
  if (b->tx->err || from == to) return v;
  uint32_t r = kiln__b_shape(b->tx, v)->rank;
  int64_t *perm = kiln__b_i64s(b->tx, r);
  if (perm == NULL) return KILN_NO_ID;
  uint32_t o = 0;
  for (uint32_t d = 0; d < r; d++) {
    if ((int64_t)o == to) perm[o++] = from;
    if ((int64_t)d != from) perm[o++] = d;
  }
  if ((int64_t)o == to) perm[o++] = from;
  return kiln__b_transpose(b, v, perm, r);
}

static int64_t axis_of(const int64_t *axes, uint32_t n, uint32_t i) {
  return n == 0 ? 0 : n == 1 ? axes[0] : axes[i];
}

typedef struct vout {
  uint32_t leaf;
  const int64_t *axes;
  uint32_t naxes;
} vout;

/* Rebuilds the root with every leaf's batch dimension at its out axis. */
static kiln_id place_outputs(kiln__bt *c, kiln_id v, const kiln_shape *s, const kiln__bsig *g,
                             vout *o) {
  kiln__tx *tx = c->tx;
  if (tx->err) return KILN_NO_ID;
  if (kiln_shape_is_tuple(s)) {
    kiln_id *el = kiln__b_ids(tx, s->rank);
    if (el == NULL) return KILN_NO_ID;
    for (uint32_t i = 0; i < s->rank; i++)
      el[i] = place_outputs(c, kiln__b_gte(B, v, i), &s->tuple[i], &g->el[i], o);
    return kiln__b_tuple(B, el, s->rank);
  }
  uint32_t leaf = o->leaf++;
  int64_t ax = axis_of(o->axes, o->naxes, leaf);
  if (ax == KILN_AXIS_NONE) {
    if (g->b)
      kiln__tx_fail(tx, KILN_EINVAL, NULL,
                    "vmap: output %u depends on a batched input; out_axes none needs an "
                    "unbatched output",
                    leaf);
    return v;
  }
  if (!kiln_shape_is_array(s)) return v;
  int64_t r = s->rank + 1;
  if (ax < -r || ax >= r)
    return kiln__tx_fail(tx, KILN_EINVAL, NULL,
                         "vmap: out_axes %" PRId64
                         " is out of range for output %u of rank %" PRId64,
                         ax, leaf, r),
           KILN_NO_ID;
  if (ax < 0) ax += r;
  kiln__bsig yes = {true, 0, NULL};
  v = kiln__bt_coerce(c, v, g, &yes);
  return kiln__bt_move_axis(B, v, 0, ax);
}

int kiln__tf_apply_vmap(kiln__tx *tx, const kiln_transform *t, uint32_t *out) {
  kiln_module *m = tx->m;
  const kiln_computation *e = kiln_module_entry(m);
  if (e == NULL)
    return kiln__tx_fail(tx, KILN_EINVAL, NULL, "vmap: the module has no ENTRY computation");
  const kiln_instr *root = kiln_computation_root(m, e);
  uint32_t np = kiln_computation_nparams(m, e);
  if (t->nin_axes > 1 && t->nin_axes != np)
    return kiln__tx_fail(tx, KILN_EINVAL, NULL,
                         "vmap: in_axes has %u entries but ENTRY %s takes %u parameter%s",
                         t->nin_axes, e->name, np, np == 1 ? "" : "s");
  uint32_t nl = root ? kiln__b_leaf_count(&root->shape) : 0;
  if (t->nout_axes > 1 && t->nout_axes != nl)
    return kiln__tx_fail(tx, KILN_EINVAL, NULL,
                         "vmap: out_axes has %u entries but ENTRY %s has %u output%s", t->nout_axes,
                         e->name, nl, nl == 1 ? "" : "s");
  int64_t bsize = t->axis_size;
  bool any = false;
  for (uint32_t i = 0; i < np; i++) {
    int64_t ax = axis_of(t->in_axes, t->nin_axes, i);
    const kiln_instr *p = kiln_computation_param(m, e, i);
    if (p == NULL)
      return kiln__tx_fail(tx, KILN_EINVAL, NULL, "vmap: ENTRY %s has no parameter %u", e->name, i);
    if (ax == KILN_AXIS_NONE) continue;
    any = true;
    if (!kiln_shape_is_array(&p->shape))
      return kiln__tx_fail(tx, KILN_EINVAL, NULL,
                           "vmap: parameter %u is not an array; its in_axes must be none", i);
    int64_t r = p->shape.rank + 1;
    if (ax < -r || ax >= r)
      return kiln__tx_fail(tx, KILN_EINVAL, NULL,
                           "vmap: in_axes %" PRId64
                           " is out of range for parameter %u (rank %" PRId64
                           " with the batch dimension)",
                           ax, i, r);
  }
  if (!any)
    return kiln__tx_fail(tx, KILN_EINVAL, NULL,
                         "vmap: no parameter is batched (in_axes are all none)");
  if (bsize <= 0)
    return kiln__tx_fail(
        tx, KILN_EINVAL, NULL,
        "vmap: the batch size is not known (give size=N, or arguments to infer it from)");
  uint32_t comp;
  char name[160];
  snprintf(name, sizeof name, "%.120s.vmap", e->name);
  if (kiln__b_new_comp(tx, name, &comp)) return tx->err;
  kiln__bt c;
  if (kiln__bt_init(&c, tx, comp, e, bsize)) return tx->err;
  kiln_id *args = kiln__b_ids(tx, np);
  kiln__bsig **sigs = kiln_arena_calloc(tx->scratch, np ? np : 1, sizeof *sigs);
  if (args == NULL || sigs == NULL) return kiln__tx_oom(tx);
  for (uint32_t i = 0; i < np; i++) {
    const kiln_instr *src = kiln_computation_param(m, e, i);
    const kiln_shape *s = &src->shape;
    int64_t ax = axis_of(t->in_axes, t->nin_axes, i);
    if (ax == KILN_AXIS_NONE) {
      args[i] = kiln__b_param(&c.b, i, s, src->name);
      sigs[i] = kiln__bsig_make(tx, s, false);
      continue;
    }
    if (ax < 0) ax += s->rank + 1;
    kiln_shape bs;
    if (kiln__b_shape_batched(tx, s, bsize, &bs)) return tx->err;
    /* the batch dimension where the caller has it, then moved first */
    int64_t *dims = kiln__b_i64s(tx, s->rank + 1);
    if (dims == NULL) return tx->err;
    for (uint32_t d = 0, o = 0; d <= s->rank; d++)
      dims[d] = (int64_t)d == ax ? bsize : s->dims[o++];
    bs.dims = dims;
    kiln_id p = kiln__b_param(&c.b, i, &bs, src->name);
    args[i] = kiln__bt_move_axis(&c.b, p, ax, 0);
    sigs[i] = kiln__bsig_make(tx, s, true);
  }
  if (tx->err || kiln__batch_region(&c, args, sigs)) return tx->err;
  vout o = {0, t->out_axes, t->nout_axes};
  kiln_id r = place_outputs(&c, c.val[kiln__bt_slot(&c, root->id)], &root->shape,
                            c.sig[kiln__bt_slot(&c, root->id)], &o);
  if (tx->err) return tx->err;
  m->comps[comp]->root = r;
  *out = comp;
  return 0;
}

/* Exposed for the control-flow rules. */
int kiln__bt_shape(kiln__tx *tx, const kiln_shape *s, const kiln__bsig *g, int64_t bsize,
                   kiln_shape *out) {
  return batched_shape(tx, s, g, bsize, out);
}
