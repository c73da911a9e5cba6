/* Region drivers for differentiation: forward mode (jvp), the two halves of
 * reverse mode (vjp), plain inlining, and the small analyses the rules lean
 * on (reducer kinds, checkpoint marks, trip counts).
 *
 * Forward mode walks a region in order, copies each instruction and asks its
 * rule for the tangent. Tangents that are zero stay symbolic (KILN_NO_ID),
 * so integer and pred values, constants and anything that does not depend
 * on a differentiated input cost nothing; a rule only runs when some operand
 * has a tangent and a user needs the result's tangent (a backward liveness
 * pass), which also keeps non-differentiable ops off the path harmless.
 *
 * Reverse mode is a forward copy that marks what depends on the
 * differentiated inputs (activity), then a walk in reverse order that hands
 * each active instruction's accumulated cotangent to its transpose rule.
 * Forward values the backward walk uses stay alive from the forward copy;
 * that is what a checkpointed call avoids by recomputing its inside.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/arena.h"
#include "compiler/ir/lapack.h"
#include "compiler/transforms/rules.h"

static void *zalloc(kiln__tx *tx, size_t n, size_t size) {
  void *p = kiln_arena_calloc(tx->scratch, n ? n : 1, size);
  if (p == NULL) kiln__tx_oom(tx);
  return p;
}

/* The tables cover the ids from the lowest to the highest of src's
 * instructions, not the whole module: a region per called computation, kept
 * for the backward walk, would otherwise cost the module's size each (the
 * square of the depth for a chain of nested calls). The builder gives a
 * computation's instructions consecutive ids, so the window is about its
 * size. */
int kiln__ad_init(kiln__ad *c, kiln__tx *tx, uint32_t dst, const kiln_computation *src) {
  memset(c, 0, sizeof *c);
  c->tx = tx;
  c->b.tx = tx;
  c->b.comp = dst;
  c->src = src;
  uint32_t lo = UINT32_MAX, hi = 0;
  for (uint32_t i = 0; i < src->ninstrs; i++) {
    if (src->instrs[i] >= tx->m->ninstrs)
      return kiln__tx_fail(tx, KILN_EINTERNAL, NULL, "%s: internal error: region grew", tx->name);
    if (src->instrs[i] < lo) lo = src->instrs[i];
    if (src->instrs[i] > hi) hi = src->instrs[i];
  }
  c->lo = src->ninstrs ? lo : 0;
  c->n = src->ninstrs ? hi - lo + 1 : 0;
  c->prim = zalloc(tx, c->n, sizeof *c->prim);
  c->tan = zalloc(tx, c->n, sizeof *c->tan);
  c->cot = zalloc(tx, c->n, sizeof *c->cot);
  c->need = zalloc(tx, c->n, 1);
  c->active = zalloc(tx, c->n, 1);
  c->aux = zalloc(tx, c->n, sizeof *c->aux);
  if (tx->err) return tx->err;
  for (uint32_t i = 0; i < c->n; i++) c->prim[i] = c->tan[i] = c->cot[i] = KILN_NO_ID;
  return 0;
}

int kiln__ad_not_diff(kiln__ad *c, const kiln_instr *ins) {
  char where[KILN_STATUS_WHERE_MAX];
  kiln_instr_where(c->tx->m, ins, where, sizeof where);
  const char *target = ins->op == KILN_OP_CUSTOM_CALL
                           ? kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET)
                           : NULL;
  if (ins->op == KILN_OP_CUSTOM_CALL && kiln_lapack_is_target(target))
    return kiln__tx_fail(c->tx, KILN_EUNIMPL, ins,
                         "%s: custom-call target \"%s\" (%s) is a LAPACK call, which Kiln does "
                         "not differentiate: take the derivative in JAX before exporting "
                         "(jax.grad or jax.jvp of the function writes its own LAPACK calls)",
                         c->tx->name, target, where);
  if (ins->op == KILN_OP_CUSTOM_CALL)
    return kiln__tx_fail(
        c->tx, KILN_EUNIMPL, ins,
        "%s: custom-call target \"%.80s\" (%s) has no derivative rule: its body is opaque "
        "to the transforms (write it with HLO ops, or keep it off the differentiated path)",
        c->tx->name, target ? target : "", where);
  if (ins->op == KILN_OP_MAP && ins->ncalled == 1)
    return kiln__tx_fail(
        c->tx, KILN_EUNIMPL, ins,
        "%s: op map (%s) is not differentiable: its computation %s is not elementwise (only "
        "maps of elementwise computations are applied to whole arrays and differentiated)",
        c->tx->name, where, kiln_module_computation(c->tx->m, ins->called[0])->name);
  const char *why =
      kiln__tf_no_rule_why(kiln__tf_no_derivative, kiln__tf_no_derivative_count, ins->op);
  if (why)
    return kiln__tx_fail(c->tx, KILN_EINVAL, ins, "%s: op %s (%s) is not differentiable: %s",
                         c->tx->name, kiln_opcode_name(ins->op), where, why);
  return kiln__tx_fail(c->tx, KILN_EINVAL, ins, "%s: op %s (%s) is not differentiable", c->tx->name,
                       kiln_opcode_name(ins->op), where);
}

static kiln_id copy_instr(kiln__ad *c, const kiln_instr *ins) {
  kiln_id *ops = kiln__b_ids(c->tx, ins->noperands);
  if (ops == NULL) return KILN_NO_ID;
  for (uint32_t k = 0; k < ins->noperands; k++)
    ops[k] = c->prim[kiln__ad_slot(c, ins->operands[k])];
  return kiln__b_clone_same(&c->b, ins, ops, ins->noperands);
}

static const kiln_instr *root_of(kiln__ad *c) {
  const kiln_instr *r = kiln_computation_root(c->tx->m, c->src);
  if (r == NULL)
    kiln__tx_fail(c->tx, KILN_EINVAL, NULL, "%s: computation %s has no root", c->tx->name,
                  c->src->name);
  return r;
}

int kiln__jvp_region(kiln__ad *c, const kiln_id *prim_in, const kiln_id *tan_in) {
  kiln__tx *tx = c->tx;
  const kiln_module *m = tx->m;
  const kiln_computation *src = c->src;
  const kiln_instr *root = root_of(c);
  if (root == NULL) return tx->err;
  c->need[kiln__ad_slot(c, root->id)] = kiln__b_has_float(&root->shape);
  for (uint32_t i = src->ninstrs; i-- > 0;) {
    const kiln_instr *ins = m->instrs[src->instrs[i]];
    if (!c->need[kiln__ad_slot(c, ins->id)]) continue;
    for (uint32_t k = 0; k < ins->noperands; k++)
      if (kiln__b_has_float(&m->instrs[ins->operands[k]]->shape))
        c->need[kiln__ad_slot(c, ins->operands[k])] = 1;
  }
  for (uint32_t i = 0; i < src->ninstrs && tx->err == 0; i++) {
    if (kiln__tx_poll(tx)) break;
    const kiln_instr *ins = m->instrs[src->instrs[i]];
    const kiln__rule *r = kiln__tf_rule_of(ins);
    if (ins->op == KILN_OP_PARAMETER) {
      c->prim[kiln__ad_slot(c, ins->id)] = prim_in[ins->param_number];
      c->tan[kiln__ad_slot(c, ins->id)] = tan_in ? tan_in[ins->param_number] : KILN_NO_ID;
    } else {
      bool any = false;
      for (uint32_t k = 0; k < ins->noperands; k++)
        any |= c->tan[kiln__ad_slot(c, ins->operands[k])] != KILN_NO_ID;
      bool run = any && c->need[kiln__ad_slot(c, ins->id)] && kiln__b_has_float(&ins->shape);
      if (!(run && r->own_primal)) c->prim[kiln__ad_slot(c, ins->id)] = copy_instr(c, ins);
      if (run) {
        if (r->jvp == NULL) return kiln__ad_not_diff(c, ins);
        r->jvp(c, ins);
      }
    }
    if (kiln__b_is_zero(tx, c->tan[kiln__ad_slot(c, ins->id)]))
      c->tan[kiln__ad_slot(c, ins->id)] = KILN_NO_ID;
  }
  return tx->err;
}

int kiln__vjp_forward(kiln__ad *c, const kiln_id *prim_in, const uint8_t *active_in) {
  kiln__tx *tx = c->tx;
  const kiln_module *m = tx->m;
  const kiln_computation *src = c->src;
  for (uint32_t i = 0; i < src->ninstrs && tx->err == 0; i++) {
    if (kiln__tx_poll(tx)) break;
    const kiln_instr *ins = m->instrs[src->instrs[i]];
    if (ins->op == KILN_OP_PARAMETER) {
      c->prim[kiln__ad_slot(c, ins->id)] = prim_in[ins->param_number];
      c->active[kiln__ad_slot(c, ins->id)] =
          active_in[ins->param_number] && kiln__b_has_float(&ins->shape);
      continue;
    }
    bool act = false;
    for (uint32_t k = 0; k < ins->noperands; k++)
      act |= c->active[kiln__ad_slot(c, ins->operands[k])] != 0;
    act &= kiln__b_has_float(&ins->shape);
    c->active[kiln__ad_slot(c, ins->id)] = act;
    const kiln__rule *r = kiln__tf_rule_of(ins);
    if (act && r->fwd)
      r->fwd(c, ins);
    else
      c->prim[kiln__ad_slot(c, ins->id)] = copy_instr(c, ins);
  }
  return tx->err;
}

int kiln__vjp_backward(kiln__ad *c, kiln_id ct_root) {
  kiln__tx *tx = c->tx;
  const kiln_module *m = tx->m;
  const kiln_computation *src = c->src;
  const kiln_instr *root = root_of(c);
  if (root == NULL) return tx->err;
  if (c->active[kiln__ad_slot(c, root->id)] && ct_root != KILN_NO_ID &&
      !kiln__b_is_zero(tx, ct_root))
    c->cot[kiln__ad_slot(c, root->id)] =
        c->cot[kiln__ad_slot(c, root->id)] == KILN_NO_ID
            ? ct_root
            : kiln__ad_add_any(&c->b, c->cot[kiln__ad_slot(c, root->id)], ct_root);
  for (uint32_t i = src->ninstrs; i-- > 0 && tx->err == 0;) {
    if (kiln__tx_poll(tx)) break;
    const kiln_instr *ins = m->instrs[src->instrs[i]];
    kiln_id ct = c->cot[kiln__ad_slot(c, ins->id)];
    if (ins->op == KILN_OP_PARAMETER || !c->active[kiln__ad_slot(c, ins->id)] || ct == KILN_NO_ID ||
        kiln__b_is_zero(tx, ct))
      continue;
    const kiln__rule *r = kiln__tf_rule_of(ins);
    if (r->vjp == NULL) return kiln__ad_not_diff(c, ins);
    r->vjp(c, ins, ct);
  }
  return tx->err;
}

kiln_id kiln__ad_inline(kiln__tx *tx, kiln__b *b, const kiln_computation *src,
                        const kiln_id *args) {
  kiln__ad c;
  if (kiln__ad_init(&c, tx, b->comp, src)) return KILN_NO_ID;
  const kiln_instr *root = root_of(&c);
  if (root == NULL) return KILN_NO_ID;
  for (uint32_t i = 0; i < src->ninstrs && tx->err == 0; i++) {
    if (kiln__tx_poll(tx)) break;
    const kiln_instr *ins = tx->m->instrs[src->instrs[i]];
    c.prim[kiln__ad_slot(&c, ins->id)] =
        ins->op == KILN_OP_PARAMETER ? args[ins->param_number] : copy_instr(&c, ins);
  }
  return tx->err ? KILN_NO_ID : c.prim[kiln__ad_slot(&c, root->id)];
}

/* ---- helpers for rules --------------------------------------------------- */

bool kiln__ad_wants(const kiln__ad *c, const kiln_instr *ins, uint32_t k) {
  return k < ins->noperands && c->active[kiln__ad_slot(c, ins->operands[k])];
}

kiln_id kiln__ad_add_any(kiln__b *b, kiln_id x, kiln_id y) {
  kiln__tx *tx = b->tx;
  if (tx->err) return KILN_NO_ID;
  if (x == KILN_NO_ID || kiln__b_is_zero(tx, x)) return y;
  if (y == KILN_NO_ID || kiln__b_is_zero(tx, y)) return x;
  const kiln_shape *s = kiln__b_shape(tx, x);
  if (!kiln_shape_is_tuple(s)) return kiln__b_add(b, x, y);
  kiln_id *el = kiln__b_ids(tx, s->rank);
  if (el == NULL) return KILN_NO_ID;
  for (uint32_t i = 0; i < s->rank; i++)
    el[i] = kiln__ad_add_any(b, kiln__b_gte(b, x, i), kiln__b_gte(b, y, i));
  return kiln__b_tuple(b, el, s->rank);
}

void kiln__ad_accum(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v) {
  if (!kiln__ad_wants(c, ins, k) || v == KILN_NO_ID || c->tx->err || kiln__b_is_zero(c->tx, v))
    return;
  kiln_id op = ins->operands[k];
  c->cot[kiln__ad_slot(c, op)] = c->cot[kiln__ad_slot(c, op)] == KILN_NO_ID
                                     ? v
                                     : kiln__ad_add_any(&c->b, c->cot[kiln__ad_slot(c, op)], v);
}

kiln_id kiln__ad_mat(kiln__b *b, kiln_id v, const kiln_shape *s) {
  return v != KILN_NO_ID ? v : kiln__b_zeros(b, s);
}

kiln_id kiln__ad_tmat(kiln__ad *c, const kiln_instr *ins, uint32_t k) {
  return kiln__ad_mat(&c->b, kiln__T(c, ins, k), &c->tx->m->instrs[ins->operands[k]]->shape);
}

/* ---- analyses ------------------------------------------------------------ */

kiln__red kiln__tf_reducer_kind(const kiln_module *m, uint32_t comp) {
  const kiln_computation *c = kiln_module_computation(m, comp);
  if (c == NULL || kiln_computation_nparams(m, c) != 2) return KILN__RED_OTHER;
  const kiln_instr *r = kiln_computation_root(m, c);
  if (r == NULL) return KILN__RED_OTHER;
  if (r->op == KILN_OP_PARAMETER) return r->param_number == 1 ? KILN__RED_REPLACE : KILN__RED_OTHER;
  if (r->noperands != 2) return KILN__RED_OTHER;
  const kiln_instr *a = m->instrs[r->operands[0]], *b = m->instrs[r->operands[1]];
  if (a->op != KILN_OP_PARAMETER || b->op != KILN_OP_PARAMETER ||
      a->param_number == b->param_number)
    return KILN__RED_OTHER;
  switch (r->op) {
  case KILN_OP_ADD: return KILN__RED_ADD;
  case KILN_OP_MULTIPLY: return KILN__RED_MUL;
  case KILN_OP_MAXIMUM: return KILN__RED_MAX;
  case KILN_OP_MINIMUM: return KILN__RED_MIN;
  case KILN_OP_AND: return KILN__RED_AND;
  case KILN_OP_OR: return KILN__RED_OR;
  default: return KILN__RED_OTHER;
  }
}

bool kiln__tf_is_checkpoint(const kiln_instr *ins) {
  if (ins->op != KILN_OP_CALL) return false;
  const char *fa = kiln_instr_attr_str(ins, KILN_ATTR_FRONTEND_ATTRIBUTES);
  return fa != NULL && strstr(fa, "_kiln_checkpoint=\"true\"") != NULL;
}

/* The value of a scalar integer constant. */
static bool const_int(const kiln_instr *ins, int64_t *v) {
  if (ins->op != KILN_OP_CONSTANT || ins->literal == NULL ||
      !kiln_shape_is_array(&ins->literal->shape) || ins->literal->shape.rank != 0 ||
      !kiln_dtype_is_integral(ins->literal->shape.dtype))
    return false;
  *v = kiln_literal_get_s64(ins->literal, 0);
  return true;
}

/* gte(param, k) of computation c; k or -1. */
static int64_t param_elem(const kiln_module *m, const kiln_instr *x) {
  if (x->op != KILN_OP_GET_TUPLE_ELEMENT) return -1;
  const kiln_instr *p = m->instrs[x->operands[0]];
  if (p->op != KILN_OP_PARAMETER || p->param_number != 0) return -1;
  return kiln_instr_attr_int(x, KILN_ATTR_INDEX, -1);
}

/* The initial value of state element k when it is a constant. */
static bool init_const(const kiln_module *m, const kiln_instr *w, int64_t k, int64_t *v) {
  const kiln_instr *init = m->instrs[w->operands[0]];
  if (init->op != KILN_OP_TUPLE || k < 0 || (uint64_t)k >= init->noperands) return false;
  return const_int(m->instrs[init->operands[k]], v);
}

/* Element k of the body's root, when the root is a tuple. */
static const kiln_instr *body_elem(const kiln_module *m, const kiln_computation *body, int64_t k) {
  const kiln_instr *r = kiln_computation_root(m, body);
  if (r == NULL || r->op != KILN_OP_TUPLE || k < 0 || (uint64_t)k >= r->noperands) return NULL;
  return m->instrs[r->operands[k]];
}

static int64_t trip_from_config(const kiln_instr *w) {
  const char *bc = kiln_instr_attr_str(w, KILN_ATTR_BACKEND_CONFIG);
  const char *p = bc ? strstr(bc, "known_trip_count") : NULL;
  if (p == NULL) return -1;
  p = strstr(p, "\"n\"");
  if (p == NULL) return -1;
  p += 3;
  while (*p == ' ' || *p == ':' || *p == '"') p++;
  char *end;
  long long n = strtoll(p, &end, 10);
  return end == p || n < 0 ? -1 : n;
}

static kiln_cmp_dir mirror(kiln_cmp_dir d) {
  return d == KILN_CMP_LT   ? KILN_CMP_GT
         : d == KILN_CMP_GT ? KILN_CMP_LT
         : d == KILN_CMP_LE ? KILN_CMP_GE
         : d == KILN_CMP_GE ? KILN_CMP_LE
                            : d;
}

/* Iterations of `while (a dir b)` where a is a state element stepped by a
 * constant and b a constant or an element the body passes through. */
static int64_t count_with(const kiln_module *m, const kiln_instr *w, const kiln_computation *body,
                          const kiln_instr *a, const kiln_instr *b, kiln_cmp_dir dir) {
  int64_t k = param_elem(m, a), start, bound, step;
  if (k < 0 || !init_const(m, w, k, &start)) return -1;
  if (!const_int(b, &bound)) {
    int64_t j = param_elem(m, b);
    const kiln_instr *e = body_elem(m, body, j);
    if (j < 0 || j == k || e == NULL || param_elem(m, e) != j || !init_const(m, w, j, &bound))
      return -1;
  }
  const kiln_instr *upd = body_elem(m, body, k);
  if (upd == NULL || upd->op != KILN_OP_ADD || !kiln_shape_is_array(&upd->shape)) return -1;
  const kiln_instr *u0 = m->instrs[upd->operands[0]], *u1 = m->instrs[upd->operands[1]];
  if (!(param_elem(m, u0) == k && const_int(u1, &step)) &&
      !(param_elem(m, u1) == k && const_int(u0, &step)))
    return -1;
  /* Count arithmetically; refuse spans that could overflow. */
  const int64_t lim = INT64_C(1) << 40;
  if (step == 0 || start < -lim || start > lim || bound < -lim || bound > lim) return -1;
  int64_t n;
  switch (dir) {
  case KILN_CMP_LT:
    n = step > 0 ? (start >= bound ? 0 : (bound - start + step - 1) / step) : -1;
    break;
  case KILN_CMP_LE: n = step > 0 ? (start > bound ? 0 : (bound - start) / step + 1) : -1; break;
  case KILN_CMP_GT:
    n = step < 0 ? (start <= bound ? 0 : (start - bound - step - 1) / -step) : -1;
    break;
  case KILN_CMP_GE: n = step < 0 ? (start < bound ? 0 : (start - bound) / -step + 1) : -1; break;
  case KILN_CMP_NE:
    n = (bound - start) % step != 0 || (bound - start) / step < 0 ? -1 : (bound - start) / step;
    break;
  default: n = -1;
  }
  /* The counter holds every value from start to start + n*step, the one
   * that ends the loop: in a narrow type the last step could wrap instead
   * (s8 120 < 126 by 5: 125, then -126, and the loop goes on), so the
   * count holds only when that value fits the counter's type. */
  if (n < 0) return -1;
  int bits = kiln_dtype_bits(upd->shape.dtype);
  int64_t last = start + n * step;
  if (bits < 64) {
    bool is_signed = kiln_dtype_is_signed_int(upd->shape.dtype);
    int64_t lo = is_signed ? -(INT64_C(1) << (bits - 1)) : 0;
    int64_t hi = is_signed ? (INT64_C(1) << (bits - 1)) - 1 : (INT64_C(1) << bits) - 1;
    if (start < lo || start > hi || last < lo || last > hi) return -1;
  } else if (!kiln_dtype_is_signed_int(upd->shape.dtype) && (start < 0 || last < 0)) {
    return -1;
  }
  return n;
}

int64_t kiln__tf_trip_count_counted(const kiln_module *m, const kiln_instr *w) {
  if (w->ncalled != 2 || w->noperands != 1) return -1;
  const kiln_computation *cond = kiln_module_computation(m, w->called[0]);
  const kiln_computation *body = kiln_module_computation(m, w->called[1]);
  const kiln_instr *cmp = cond ? kiln_computation_root(m, cond) : NULL;
  if (cmp == NULL || body == NULL || cmp->op != KILN_OP_COMPARE) return -1;
  const kiln_instr *a = m->instrs[cmp->operands[0]], *b = m->instrs[cmp->operands[1]];
  kiln_cmp_dir dir = (kiln_cmp_dir)kiln_instr_attr_int(cmp, KILN_ATTR_DIRECTION, KILN_CMP_EQ);
  int64_t n = count_with(m, w, body, a, b, dir);
  return n >= 0 ? n : count_with(m, w, body, b, a, mirror(dir));
}

int64_t kiln__tf_trip_count(const kiln_module *m, const kiln_instr *w) {
  int64_t n = trip_from_config(w);
  return n >= 0 ? n : kiln__tf_trip_count_counted(m, w);
}
