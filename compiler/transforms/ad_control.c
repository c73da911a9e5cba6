/* Differentiation of control flow: while, conditional, call (and fusion).
 *
 * Forward mode carries (primal, tangent) pairs through new loop bodies and
 * branches built by differentiating the old ones; calls are inlined, except
 * checkpointed ones, which stay calls (of their differentiated body) and
 * keep their mark for a later reverse-mode transform.
 *
 * Reverse mode needs the forward values of every iteration of a loop. With
 * a trip count N known at compile time the forward loop is rebuilt to push
 * its state at the start of each iteration onto stacks of shape [N, ...]
 * (the forward values saved per iteration); the backward loop runs N times
 * from the last iteration down, reads the state back and pulls the
 * cotangent of the state through a reverse-mode copy of the body, which
 * recomputes the body's intermediates from the saved state. A conditional's
 * backward pass is a conditional whose branches recompute their forward
 * values and differentiate them, returning cotangents for every branch's
 * operand (zeros for the branches not taken). A call is differentiated
 * inline, its forward values kept like any others; a checkpointed call
 * keeps only its operands and recomputes its inside in the backward pass.
 */
#include <stdio.h>
#include <string.h>

#include "common/arena.h"
#include "compiler/ir/rewrite.h"
#include "compiler/transforms/rules.h"

#define B (&c->b)

static const kiln_shape *src_shape(const kiln__ad *c, const kiln_instr *ins, uint32_t k) {
  return &c->tx->m->instrs[ins->operands[k]]->shape;
}

static int pair_shape(kiln__tx *tx, const kiln_shape *a, const kiln_shape *b, kiln_shape *out) {
  kiln_shape el[2] = {*a, *b};
  if (kiln_shape_make_tuple(tx->m->arena, out, el, 2)) return kiln__tx_oom(tx);
  return 0;
}

static void set_root(kiln__tx *tx, uint32_t comp, kiln_id root) {
  if (tx->err == 0 && root != KILN_NO_ID) tx->m->comps[comp]->root = root;
}

static kiln_id param_id(const kiln__tx *tx, const kiln_computation *comp, int64_t n) {
  const kiln_instr *p = kiln_computation_param(tx->m, comp, n);
  return p ? p->id : KILN_NO_ID;
}

static const kiln_computation *called(const kiln__tx *tx, const kiln_instr *ins, uint32_t i) {
  return i < ins->ncalled ? kiln_module_computation(tx->m, ins->called[i]) : NULL;
}

/* A new computation holding the jvp of `src` whose one parameter is the
 * pair (primal, tangent); it returns the pair (result, result tangent). */
static uint32_t jvp_pair_comp(kiln__ad *c, const kiln_computation *src, const kiln_shape *in,
                              const char *suffix) {
  kiln__tx *tx = c->tx;
  char name[160];
  snprintf(name, sizeof name, "%.120s.%s", src->name, suffix);
  uint32_t comp;
  kiln_shape ps;
  if (kiln__b_new_comp(tx, name, &comp) || pair_shape(tx, in, in, &ps)) return KILN_NO_ID;
  kiln__b b = {tx, comp};
  kiln_id p = kiln__b_param(&b, 0, &ps, NULL);
  kiln_id x = kiln__b_gte(&b, p, 0), t = kiln__b_gte(&b, p, 1);
  kiln__ad child;
  if (kiln__ad_init(&child, tx, comp, src) || kiln__jvp_region(&child, &x, &t)) return KILN_NO_ID;
  const kiln_instr *root = kiln_computation_root(tx->m, src);
  kiln_id r[2] = {child.prim[kiln__ad_slot(&child, root->id)],
                  kiln__ad_mat(&b, child.tan[kiln__ad_slot(&child, root->id)], &root->shape)};
  set_root(tx, comp, kiln__b_tuple(&b, r, 2));
  return tx->err ? KILN_NO_ID : comp;
}

int kiln__jvp_while(kiln__ad *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  const kiln_computation *cond = called(tx, ins, 0), *body = called(tx, ins, 1);
  if (cond == NULL || body == NULL) return kiln__ad_not_diff(c, ins);
  uint32_t nbody = jvp_pair_comp(c, body, &ins->shape, "jvp");
  char name[160];
  snprintf(name, sizeof name, "%.120s.jvp", cond->name);
  uint32_t ncond;
  kiln_shape ps;
  if (nbody == KILN_NO_ID || kiln__b_new_comp(tx, name, &ncond) ||
      pair_shape(tx, &ins->shape, &ins->shape, &ps))
    return tx->err;
  kiln__b cb = {tx, ncond};
  kiln_id p = kiln__b_param(&cb, 0, &ps, NULL);
  kiln_id s0 = kiln__b_gte(&cb, p, 0);
  set_root(tx, ncond, kiln__ad_inline(tx, &cb, cond, &s0));
  kiln_id init[2] = {kiln__X(c, ins, 0), kiln__ad_tmat(c, ins, 0)};
  kiln_id t = kiln__b_tuple(B, init, 2);
  kiln_instr *w = kiln__b_start(B, KILN_OP_WHILE, &t, 1);
  uint32_t cs[2] = {ncond, nbody};
  if (w && kiln_instr_set_called(tx->m, w, cs, 2)) return kiln__tx_oom(tx);
  const kiln_attr *bc = kiln_instr_attr(ins, KILN_ATTR_BACKEND_CONFIG);
  if (w && bc) {
    kiln_attr *a = kiln_instr_add_attr(tx->m, w, KILN_ATTR_BACKEND_CONFIG);
    if (a == NULL || kiln_attr_copy(tx->m->arena, a, bc)) return kiln__tx_oom(tx);
  }
  kiln_id wid = kiln__b_finish(B, w);
  c->prim[kiln__ad_slot(c, ins->id)] = kiln__b_gte(B, wid, 0);
  c->tan[kiln__ad_slot(c, ins->id)] = kiln__b_gte(B, wid, 1);
  return tx->err;
}

int kiln__jvp_conditional(kiln__ad *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  uint32_t nb = ins->ncalled;
  uint32_t *nbr = kiln_arena_calloc(tx->scratch, nb ? nb : 1, sizeof *nbr);
  kiln_id *ops = kiln__b_ids(tx, ins->noperands);
  if (nbr == NULL || ops == NULL) return kiln__tx_oom(tx);
  if (ins->noperands != nb + 1) return kiln__ad_not_diff(c, ins);
  ops[0] = kiln__X(c, ins, 0);
  for (uint32_t k = 0; k < nb && tx->err == 0; k++) {
    nbr[k] = jvp_pair_comp(c, called(tx, ins, k), src_shape(c, ins, k + 1), "jvp");
    kiln_id pr[2] = {kiln__X(c, ins, k + 1), kiln__ad_tmat(c, ins, k + 1)};
    ops[k + 1] = kiln__b_tuple(B, pr, 2);
  }
  kiln_instr *cd = kiln__b_start(B, KILN_OP_CONDITIONAL, ops, ins->noperands);
  if (cd && kiln_instr_set_called(tx->m, cd, nbr, nb)) return kiln__tx_oom(tx);
  kiln_id r = kiln__b_finish(B, cd);
  c->prim[kiln__ad_slot(c, ins->id)] = kiln__b_gte(B, r, 0);
  c->tan[kiln__ad_slot(c, ins->id)] = kiln__b_gte(B, r, 1);
  return tx->err;
}

/* A checkpointed call under jvp: a new marked computation taking the
 * primals then the tangents and returning (result, tangent). */
static int jvp_checkpoint_call(kiln__ad *c, const kiln_instr *ins, const kiln_computation *f) {
  kiln__tx *tx = c->tx;
  uint32_t n = ins->noperands, comp;
  char name[160];
  snprintf(name, sizeof name, "%.120s.jvp", f->name);
  if (kiln__b_new_comp(tx, name, &comp)) return tx->err;
  kiln__b b = {tx, comp};
  kiln_id *ps = kiln__b_ids(tx, 2 * n), *ops = kiln__b_ids(tx, 2 * n);
  if (ps == NULL || ops == NULL) return tx->err;
  for (uint32_t k = 0; k < n; k++) {
    ps[k] = kiln__b_param(&b, k, src_shape(c, ins, k), NULL);
    ps[n + k] = kiln__b_param(&b, n + k, src_shape(c, ins, k), NULL);
    ops[k] = kiln__X(c, ins, k);
    ops[n + k] = kiln__ad_tmat(c, ins, k);
  }
  kiln__ad child;
  if (kiln__ad_init(&child, tx, comp, f) || kiln__jvp_region(&child, ps, ps + n)) return tx->err;
  const kiln_instr *root = kiln_computation_root(tx->m, f);
  kiln_id r[2] = {child.prim[kiln__ad_slot(&child, root->id)],
                  kiln__ad_mat(&b, child.tan[kiln__ad_slot(&child, root->id)], &root->shape)};
  set_root(tx, comp, kiln__b_tuple(&b, r, 2));
  kiln_id call = kiln__b_call(B, comp, ops, 2 * n);
  if (call != KILN_NO_ID &&
      kiln_instr_set_attr_str(tx->m, kiln__b_ins(tx, call), KILN_ATTR_FRONTEND_ATTRIBUTES,
                              KILN__CHECKPOINT_ATTR))
    return kiln__tx_oom(tx);
  c->prim[kiln__ad_slot(c, ins->id)] = kiln__b_gte(B, call, 0);
  c->tan[kiln__ad_slot(c, ins->id)] = kiln__b_gte(B, call, 1);
  return tx->err;
}

static int jvp_inline(kiln__ad *c, const kiln_instr *ins, const kiln_computation *f, bool primal);

int kiln__jvp_call(kiln__ad *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  const kiln_computation *f = called(tx, ins, 0);
  if (f == NULL || ins->ncalled != 1) return kiln__ad_not_diff(c, ins);
  if (kiln__tf_is_checkpoint(ins)) return jvp_checkpoint_call(c, ins, f);
  return jvp_inline(c, ins, f, true);
}

/* The jvp of f inlined with ins's operands (and their tangents) bound to
 * its parameters; sets the tangent of ins, and its primal when asked. */
static int jvp_inline(kiln__ad *c, const kiln_instr *ins, const kiln_computation *f, bool primal) {
  kiln__tx *tx = c->tx;
  kiln_id *ps = kiln__b_ids(tx, ins->noperands), *ts = kiln__b_ids(tx, ins->noperands);
  if (ps == NULL || ts == NULL) return tx->err;
  for (uint32_t k = 0; k < ins->noperands; k++) {
    ps[k] = kiln__X(c, ins, k);
    ts[k] = kiln__T(c, ins, k);
  }
  kiln__ad child;
  if (kiln__ad_init(&child, tx, c->b.comp, f) || kiln__jvp_region(&child, ps, ts)) return tx->err;
  const kiln_instr *root = kiln_computation_root(tx->m, f);
  if (primal) c->prim[kiln__ad_slot(c, ins->id)] = child.prim[kiln__ad_slot(&child, root->id)];
  c->tan[kiln__ad_slot(c, ins->id)] = child.tan[kiln__ad_slot(&child, root->id)];
  return tx->err;
}

int kiln__jvp_via(kiln__ad *c, const kiln_instr *ins, uint32_t comp) {
  const kiln_computation *f = comp == KILN_NO_ID ? NULL : kiln_module_computation(c->tx->m, comp);
  if (f == NULL) return c->tx->err ? c->tx->err : kiln__ad_not_diff(c, ins);
  return jvp_inline(c, ins, f, false);
}

/* ---- reverse mode: while ------------------------------------------------- */

typedef struct loop_save {
  int64_t trips;
  uint32_t nleaves;
  kiln_id *stacks; /* per state leaf: [trips, ...] forward states */
} loop_save;

/* A loop state is saved leaf by leaf: its array leaves, depth-first,
 * however the tuples nest (loops built by an earlier transform nest). */
static bool array_leaves(const kiln_shape *s) {
  if (kiln_shape_is_array(s)) return true;
  if (!kiln_shape_is_tuple(s)) return false;
  for (uint32_t i = 0; i < s->rank; i++)
    if (!array_leaves(&s->tuple[i])) return false;
  return true;
}

/* The shape of leaf e of s (depth-first), with *k counting leaves. */
static const kiln_shape *leaf_at(const kiln_shape *s, uint32_t e, uint32_t *k) {
  if (!kiln_shape_is_tuple(s)) return (*k)++ == e ? s : NULL;
  for (uint32_t i = 0; i < s->rank; i++) {
    const kiln_shape *r = leaf_at(&s->tuple[i], e, k);
    if (r) return r;
  }
  return NULL;
}

static const kiln_shape *leaf_shape(const kiln_shape *s, uint32_t e) {
  uint32_t k = 0;
  return leaf_at(s, e, &k);
}

static void leaves_of(kiln__b *b, kiln_id v, const kiln_shape *s, kiln_id *out, uint32_t *n) {
  if (!kiln_shape_is_tuple(s)) {
    out[(*n)++] = v;
    return;
  }
  for (uint32_t i = 0; i < s->rank; i++) leaves_of(b, kiln__b_gte(b, v, i), &s->tuple[i], out, n);
}

static kiln_id from_leaves(kiln__b *b, const kiln_shape *s, const kiln_id *v, uint32_t *k) {
  if (!kiln_shape_is_tuple(s)) return v[(*k)++];
  kiln_id *el = kiln__b_ids(b->tx, s->rank);
  if (el == NULL) return KILN_NO_ID;
  for (uint32_t i = 0; i < s->rank; i++) el[i] = from_leaves(b, &s->tuple[i], v, k);
  return kiln__b_tuple(b, el, s->rank);
}

/* Start indices (i, 0, ..., 0) into a stack of the given leaf's rank. */
static kiln_id *stack_index(kiln__b *b, kiln_id i, uint32_t rank) {
  kiln_id *idx = kiln__b_ids(b->tx, rank + 1);
  if (idx == NULL) return NULL;
  idx[0] = i;
  for (uint32_t d = 0; d < rank; d++) idx[d + 1] = kiln__b_iscalar(b, KILN_S32, 0);
  return idx;
}

/* Shape of (state, s32 counter, stacks...). */
static int loop_shape(kiln__tx *tx, const kiln_shape *s, const kiln_id *stacks, uint32_t nl,
                      kiln_shape *out) {
  kiln_shape *el = kiln_arena_calloc(tx->m->arena, nl + 2, sizeof *el);
  if (el == NULL) return kiln__tx_oom(tx);
  el[0] = *s;
  if (kiln_shape_make_array(tx->m->arena, &el[1], KILN_S32, NULL, 0)) return kiln__tx_oom(tx);
  for (uint32_t e = 0; e < nl; e++) el[e + 2] = *kiln__b_shape(tx, stacks[e]);
  if (kiln_shape_make_tuple(tx->m->arena, out, el, nl + 2)) return kiln__tx_oom(tx);
  return 0;
}

/* A while loop that runs `trips` times, saying so as XLA does
 * (known_trip_count), so that a later reverse-mode transform of the
 * program (grad of grad) knows it too. */
static kiln_id make_while(kiln__b *b, kiln_id init, uint32_t cond, uint32_t body, int64_t trips) {
  kiln_instr *w = kiln__b_start(b, KILN_OP_WHILE, &init, 1);
  uint32_t cs[2] = {cond, body};
  char bc[96];
  snprintf(bc, sizeof bc, "{\"known_trip_count\":{\"n\":\"%lld\"}}", (long long)trips);
  if (w && (kiln_instr_set_called(b->tx->m, w, cs, 2) ||
            kiln_instr_set_attr_str(b->tx->m, w, KILN_ATTR_BACKEND_CONFIG, bc)))
    return kiln__tx_oom(b->tx), KILN_NO_ID;
  return kiln__b_finish(b, w);
}

int kiln__fwd_while(kiln__ad *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  const kiln_computation *cond = called(tx, ins, 0), *body = called(tx, ins, 1);
  const kiln_shape *S = &ins->shape;
  int64_t n = kiln__tf_trip_count(tx->m, ins);
  if (cond == NULL || body == NULL) return kiln__ad_not_diff(c, ins);
  if (n < 0)
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: while %s has no trip count known at compile time (reverse mode "
                         "saves each iteration's state and needs one)",
                         tx->name, ins->name);
  if (!array_leaves(S))
    return kiln__tx_fail(tx, KILN_EUNIMPL, ins,
                         "%s: while %s: reverse mode needs a state made of arrays (no tokens)",
                         tx->name, ins->name);
  loop_save *sv = kiln_arena_calloc(tx->scratch, 1, sizeof *sv);
  if (sv == NULL) return kiln__tx_oom(tx);
  sv->trips = n;
  c->aux[kiln__ad_slot(c, ins->id)] = sv;
  if (n == 0) {
    c->prim[kiln__ad_slot(c, ins->id)] = kiln__X(c, ins, 0);
    return tx->err;
  }
  uint32_t nl = kiln__b_leaf_count(S);
  sv->nleaves = nl;
  kiln_id *zst = kiln__b_ids(tx, nl + 2);
  sv->stacks = kiln__b_ids(tx, nl);
  if (zst == NULL || sv->stacks == NULL) return tx->err;
  zst[0] = kiln__X(c, ins, 0);
  zst[1] = kiln__b_iscalar(B, KILN_S32, 0);
  for (uint32_t e = 0; e < nl; e++) {
    const kiln_shape *ls = leaf_shape(S, e);
    int64_t *dims = kiln__b_i64s(tx, ls->rank + 1);
    if (dims == NULL) return tx->err;
    dims[0] = n;
    if (ls->rank) memcpy(dims + 1, ls->dims, ls->rank * sizeof *dims);
    zst[e + 2] = kiln__b_full(B, ls->dtype, dims, ls->rank + 1, 0);
  }
  kiln_shape A;
  if (loop_shape(tx, S, zst + 2, nl, &A)) return tx->err;
  char name[160];
  uint32_t nbody, ncond;
  snprintf(name, sizeof name, "%.120s.save", body->name);
  if (kiln__b_new_comp(tx, name, &nbody)) return tx->err;
  snprintf(name, sizeof name, "%.120s.save", cond->name);
  if (kiln__b_new_comp(tx, name, &ncond)) return tx->err;
  /* body: push the incoming state, then run the old body. */
  kiln__b bb = {tx, nbody};
  kiln_id p = kiln__b_param(&bb, 0, &A, NULL);
  kiln_id s = kiln__b_gte(&bb, p, 0), j = kiln__b_gte(&bb, p, 1);
  kiln_id *out = kiln__b_ids(tx, nl + 2), *sl = kiln__b_ids(tx, nl);
  uint32_t ns = 0;
  if (out == NULL || sl == NULL) return tx->err;
  leaves_of(&bb, s, S, sl, &ns);
  for (uint32_t e = 0; e < nl && tx->err == 0; e++) {
    const kiln_shape *ls = leaf_shape(S, e);
    int64_t *one = kiln__b_i64s(tx, ls->rank + 1);
    if (one == NULL) return tx->err;
    one[0] = 1;
    if (ls->rank) memcpy(one + 1, ls->dims, ls->rank * sizeof *one);
    kiln_id v = kiln__b_reshape(&bb, sl[e], one, ls->rank + 1);
    out[e + 2] = kiln__b_dyn_update(&bb, kiln__b_gte(&bb, p, e + 2), v,
                                    stack_index(&bb, j, ls->rank), ls->rank + 1);
  }
  out[0] = kiln__ad_inline(tx, &bb, body, &s);
  out[1] = kiln__b_add(&bb, j, kiln__b_iscalar(&bb, KILN_S32, 1));
  set_root(tx, nbody, kiln__b_tuple(&bb, out, nl + 2));
  kiln__b cb = {tx, ncond};
  kiln_id cp = kiln__b_param(&cb, 0, &A, NULL);
  kiln_id cs = kiln__b_gte(&cb, cp, 0);
  set_root(tx, ncond, kiln__ad_inline(tx, &cb, cond, &cs));
  kiln_id w = make_while(B, kiln__b_tuple(B, zst, nl + 2), ncond, nbody, n);
  c->prim[kiln__ad_slot(c, ins->id)] = kiln__b_gte(B, w, 0);
  for (uint32_t e = 0; e < nl; e++) sv->stacks[e] = kiln__b_gte(B, w, e + 2);
  return tx->err;
}

int kiln__vjp_while(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__tx *tx = c->tx;
  const loop_save *sv = c->aux[kiln__ad_slot(c, ins->id)];
  const kiln_computation *body = called(tx, ins, 1);
  const kiln_shape *S = &ins->shape;
  if (sv == NULL || body == NULL)
    return kiln__tx_fail(tx, KILN_EINTERNAL, ins, "%s: loop not saved", tx->name);
  if (sv->trips == 0) {
    kiln__ad_accum(c, ins, 0, ct);
    return tx->err;
  }
  uint32_t nl = sv->nleaves;
  kiln_shape Q;
  if (loop_shape(tx, S, sv->stacks, nl, &Q)) return tx->err;
  char name[160];
  uint32_t nbody, ncond;
  snprintf(name, sizeof name, "%.120s.vjp", body->name);
  if (kiln__b_new_comp(tx, name, &nbody)) return tx->err;
  snprintf(name, sizeof name, "%.120s.vjp_cond", body->name);
  if (kiln__b_new_comp(tx, name, &ncond)) return tx->err;
  /* body: read iteration i's state, pull the cotangent through the body. */
  kiln__b bb = {tx, nbody};
  kiln_id p = kiln__b_param(&bb, 0, &Q, NULL);
  kiln_id cts = kiln__b_gte(&bb, p, 0), i = kiln__b_gte(&bb, p, 1);
  kiln_id *el = kiln__b_ids(tx, nl), *out = kiln__b_ids(tx, nl + 2);
  if (el == NULL || out == NULL) return tx->err;
  for (uint32_t e = 0; e < nl && tx->err == 0; e++) {
    const kiln_shape *ls = leaf_shape(S, e);
    int64_t *one = kiln__b_i64s(tx, ls->rank + 1);
    if (one == NULL) return tx->err;
    one[0] = 1;
    if (ls->rank) memcpy(one + 1, ls->dims, ls->rank * sizeof *one);
    out[e + 2] = kiln__b_gte(&bb, p, e + 2);
    kiln_id v =
        kiln__b_dyn_slice(&bb, out[e + 2], stack_index(&bb, i, ls->rank), ls->rank + 1, one);
    el[e] = kiln__b_reshape(&bb, v, ls->dims, ls->rank);
  }
  uint32_t k0 = 0;
  kiln_id state = from_leaves(&bb, S, el, &k0);
  kiln__ad child;
  uint8_t act = 1;
  if (kiln__ad_init(&child, tx, nbody, body) || kiln__vjp_forward(&child, &state, &act) ||
      kiln__vjp_backward(&child, cts))
    return tx->err;
  kiln_id pid = param_id(tx, body, 0);
  out[0] =
      kiln__ad_mat(&bb, pid == KILN_NO_ID ? KILN_NO_ID : child.cot[kiln__ad_slot(&child, pid)], S);
  out[1] = kiln__b_sub(&bb, i, kiln__b_iscalar(&bb, KILN_S32, 1));
  set_root(tx, nbody, kiln__b_tuple(&bb, out, nl + 2));
  kiln__b cb = {tx, ncond};
  kiln_id cp = kiln__b_param(&cb, 0, &Q, NULL);
  set_root(
      tx, ncond,
      kiln__b_cmp(&cb, kiln__b_gte(&cb, cp, 1), kiln__b_iscalar(&cb, KILN_S32, 0), KILN_CMP_GE));
  kiln_id *init = kiln__b_ids(tx, nl + 2);
  if (init == NULL) return tx->err;
  init[0] = kiln__ad_mat(B, ct, S);
  init[1] = kiln__b_iscalar(B, KILN_S32, sv->trips - 1);
  for (uint32_t e = 0; e < nl; e++) init[e + 2] = sv->stacks[e];
  kiln_id w = make_while(B, kiln__b_tuple(B, init, nl + 2), ncond, nbody, sv->trips);
  kiln__ad_accum(c, ins, 0, kiln__b_gte(B, w, 0));
  return tx->err;
}

/* ---- reverse mode: conditional -------------------------------------------- */

int kiln__vjp_conditional(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__tx *tx = c->tx;
  uint32_t nb = ins->ncalled;
  if (ins->noperands != nb + 1) return kiln__ad_not_diff(c, ins);
  kiln_shape *outs = kiln_arena_calloc(tx->m->arena, nb ? nb : 1, sizeof *outs);
  uint32_t *nbr = kiln_arena_calloc(tx->scratch, nb ? nb : 1, sizeof *nbr);
  kiln_id *ops = kiln__b_ids(tx, nb + 1);
  if (outs == NULL || nbr == NULL || ops == NULL) return kiln__tx_oom(tx);
  for (uint32_t k = 0; k < nb; k++) outs[k] = *src_shape(c, ins, k + 1);
  kiln_shape O;
  if (kiln_shape_make_tuple(tx->m->arena, &O, outs, nb)) return kiln__tx_oom(tx);
  kiln_id ctm = kiln__ad_mat(B, ct, &ins->shape);
  ops[0] = kiln__X(c, ins, 0);
  for (uint32_t k = 0; k < nb && tx->err == 0; k++) {
    const kiln_computation *br = called(tx, ins, k);
    char name[160];
    snprintf(name, sizeof name, "%.120s.vjp", br->name);
    kiln_shape ps;
    if (kiln__b_new_comp(tx, name, &nbr[k]) || pair_shape(tx, &outs[k], &ins->shape, &ps))
      return tx->err;
    kiln__b b = {tx, nbr[k]};
    kiln_id p = kiln__b_param(&b, 0, &ps, NULL);
    kiln_id x = kiln__b_gte(&b, p, 0);
    kiln__ad child;
    uint8_t act = 1;
    if (kiln__ad_init(&child, tx, nbr[k], br) || kiln__vjp_forward(&child, &x, &act) ||
        kiln__vjp_backward(&child, kiln__b_gte(&b, p, 1)))
      return tx->err;
    kiln_id *el = kiln__b_ids(tx, nb);
    if (el == NULL) return tx->err;
    for (uint32_t j = 0; j < nb; j++) {
      kiln_id pid = param_id(tx, br, 0);
      el[j] = j == k
                  ? kiln__ad_mat(
                        &b, pid == KILN_NO_ID ? KILN_NO_ID : child.cot[kiln__ad_slot(&child, pid)],
                        &outs[j])
                  : kiln__b_zeros(&b, &outs[j]);
    }
    set_root(tx, nbr[k], kiln__b_tuple(&b, el, nb));
    kiln_id pr[2] = {kiln__X(c, ins, k + 1), ctm};
    ops[k + 1] = kiln__b_tuple(B, pr, 2);
  }
  kiln_instr *cd = kiln__b_start(B, KILN_OP_CONDITIONAL, ops, nb + 1);
  if (cd && kiln_instr_set_called(tx->m, cd, nbr, nb)) return kiln__tx_oom(tx);
  kiln_id r = kiln__b_finish(B, cd);
  for (uint32_t k = 0; k < nb; k++)
    if (kiln__ad_wants(c, ins, k + 1)) kiln__ad_accum(c, ins, k + 1, kiln__b_gte(B, r, k));
  return tx->err;
}

/* ---- reverse mode: call --------------------------------------------------- */

static kiln__ad *call_forward(kiln__ad *c, const kiln_instr *ins, const kiln_computation *f) {
  kiln__tx *tx = c->tx;
  kiln__ad *child = kiln_arena_calloc(tx->scratch, 1, sizeof *child);
  kiln_id *ps = kiln__b_ids(tx, ins->noperands);
  uint8_t *act = kiln_arena_calloc(tx->scratch, ins->noperands + 1, 1);
  if (child == NULL || ps == NULL || act == NULL) return kiln__tx_oom(tx), NULL;
  for (uint32_t k = 0; k < ins->noperands; k++) {
    ps[k] = kiln__X(c, ins, k);
    act[k] = c->active[kiln__ad_slot(c, ins->operands[k])];
  }
  if (kiln__ad_init(child, tx, c->b.comp, f) || kiln__vjp_forward(child, ps, act)) return NULL;
  return child;
}

int kiln__fwd_call(kiln__ad *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  const kiln_computation *f = called(tx, ins, 0);
  if (f == NULL || ins->ncalled != 1) return kiln__ad_not_diff(c, ins);
  if (kiln__tf_is_checkpoint(ins)) {
    /* Only the operands stay alive: the call runs opaque here and is
     * recomputed inside the backward pass. */
    kiln_id *ops = kiln__b_ids(tx, ins->noperands);
    if (ops == NULL) return tx->err;
    for (uint32_t k = 0; k < ins->noperands; k++) ops[k] = kiln__X(c, ins, k);
    c->prim[kiln__ad_slot(c, ins->id)] = kiln__b_clone_same(B, ins, ops, ins->noperands);
    return tx->err;
  }
  return kiln__fwd_via(c, ins, f->id);
}

int kiln__fwd_via(kiln__ad *c, const kiln_instr *ins, uint32_t comp) {
  kiln__tx *tx = c->tx;
  const kiln_computation *f = comp == KILN_NO_ID ? NULL : kiln_module_computation(tx->m, comp);
  if (f == NULL) return tx->err ? tx->err : kiln__ad_not_diff(c, ins);
  kiln__ad *child = call_forward(c, ins, f);
  if (child == NULL) return tx->err;
  c->aux[kiln__ad_slot(c, ins->id)] = child;
  c->prim[kiln__ad_slot(c, ins->id)] =
      child->prim[kiln__ad_slot(child, kiln_computation_root(tx->m, f)->id)];
  return tx->err;
}

/* Pulls ct back through the forward copy `child` of computation f. */
static int pull_back(kiln__ad *c, const kiln_instr *ins, kiln__ad *child, kiln_id ct) {
  kiln__tx *tx = c->tx;
  if (child == NULL || kiln__vjp_backward(child, ct)) return tx->err;
  for (uint32_t k = 0; k < ins->noperands; k++) {
    kiln_id pid = param_id(tx, child->src, k);
    if (pid != KILN_NO_ID) kiln__ad_accum(c, ins, k, child->cot[kiln__ad_slot(child, pid)]);
  }
  return tx->err;
}

int kiln__vjp_via(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  if (c->aux[kiln__ad_slot(c, ins->id)] == NULL)
    return kiln__tx_fail(c->tx, KILN_EINTERNAL, ins,
                         "%s: internal error: no forward copy to differentiate", c->tx->name);
  return pull_back(c, ins, c->aux[kiln__ad_slot(c, ins->id)], ct);
}

int kiln__vjp_call(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__tx *tx = c->tx;
  const kiln_computation *f = called(tx, ins, 0);
  if (f == NULL) return kiln__ad_not_diff(c, ins);
  kiln__ad *child = c->aux[kiln__ad_slot(c, ins->id)];
  if (child == NULL) child = call_forward(c, ins, f); /* checkpoint: recompute here */
  return pull_back(c, ins, child, ct);
}
