/* Products of a scan's inputs done once for all steps: a dot in a while body
 * whose operand is step t of a loop-invariant array becomes step t of one
 * dot over the whole array, which while_licm then moves before the loop.
 *
 * A JAX scan over xs[T, B, D] slices x_t = xs[t] in each iteration and
 * multiplies it by loop-invariant weights W: T products of B rows each, too
 * small to keep the machine busy (an RNN step's 32x256x256), with W packed
 * again on every call. The same T products are one product with T*B rows:
 *
 *   dot(reshape(dynamic-slice(X, i, s1..)), W)
 *     ==  reshape(dynamic-slice(dot(X, W'), .., i, ..))
 *
 * where W' is W and the dot's dimension numbers move by one on X's side
 * (X's leading dimension becomes a free dimension of the product, at
 * position `tpos` of its result). The identity holds for any start index i:
 * the slice of X has size 1 along a dimension of the same extent T as the
 * product's, so both clamp i to [0, T-1] alike, and the product's other
 * dimensions are sliced whole, so any start there clamps to 0 (the pass
 * reuses X's second start index for them: one of the right type). Each row
 * of the product is the same sum of the same products as before; only the
 * GEMM kernel that computes it changes.
 *
 * The rewrite pays only when the loop runs at least T times (otherwise the
 * big product computes rows that are never read): the trip count must be
 * known at compile time (kiln__tf_trip_count) and at least T. Each step
 * still copies its slice of the product (B x N elements, where the product
 * did B x N x K work), so only contractions of at least MIN_CONTRACTION
 * are moved. X and W must
 * be invariant the way while_licm sees it (a state element the body passes
 * through unchanged, or a constant) and the loop one that while_licm
 * rewrites (body and condition called only by it, one parameter read only
 * through get-tuple-element, a tuple root): otherwise the big product would
 * stay in the body and run T times per step. The product is limited to
 * MAX_PRODUCT_BYTES. Operands and result share one element type (no mixed
 * precision to reason about).
 *
 * JAX puts a scan's step function in a `call` that the inline pass leaves
 * alone when its tuple value is read by several get-tuple-elements. A call
 * in a loop body whose computation holds such a dot (operands that are the
 * call's parameters, bound to a step slice and an invariant value) is
 * inlined here first, so that the dot becomes visible; calls without one
 * stay calls. A dead dot or slice left behind is removed by dce before the
 * pass returns.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/passes.h"
#include "compiler/transforms/rules.h"

#define MAX_PRODUCT_BYTES ((int64_t)256 << 20)
#define MAX_INLINES 64 /* calls inlined in one loop body, at most */
/* Contraction length below which a step's product stays in the loop.
 * Measured (2 threads, loaded machine, min of 100-300 runs): a GRU step's
 * 32x256x256 products hoisted ran gru_scan in 27.5-30.8 ms against
 * 32.2-32.4; an LSTM's 16x96x768 input product hoisted ran 3.4-3.5 ms
 * against 2.9 (the slice of the product it copies each step is half the
 * work of the small product it replaced). */
#define MIN_CONTRACTION 256

typedef struct loop {
  const kiln_module *m;
  kiln_computation *body;
  const kiln_instr *param, *root;
  int64_t trips;
} loop;

static bool is_gte_of(const kiln_instr *x, kiln_id tuple, int64_t *index) {
  if (x->op != KILN_OP_GET_TUPLE_ELEMENT || x->noperands != 1 || x->operands[0] != tuple)
    return false;
  *index = kiln_instr_attr_int(x, KILN_ATTR_INDEX, -1);
  return true;
}

/* Every use of `param` in c is a get-tuple-element and nothing reads `root`
 * (KILN_NO_ID: no root to check). */
static bool only_gte_uses(const kiln_module *m, const kiln_computation *c, kiln_id param,
                          kiln_id root) {
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *x = m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < x->noperands; k++)
      if ((x->operands[k] == param && x->op != KILN_OP_GET_TUPLE_ELEMENT) || x->operands[k] == root)
        return false;
  }
  return true;
}

/* Fills *l when w is a loop while_licm rewrites and its trip count is known. */
static bool loop_parts(const kiln_module *m, const uint32_t *ncallers, const kiln_instr *w,
                       loop *l) {
  if (w->op != KILN_OP_WHILE || w->ncalled != 2 || w->noperands != 1 ||
      !kiln_shape_is_tuple(&w->shape))
    return false;
  uint32_t cd = w->called[0], bd = w->called[1];
  if (cd >= m->ncomps || bd >= m->ncomps || cd == bd || ncallers[cd] != 1 || ncallers[bd] != 1)
    return false;
  kiln_computation *b = m->comps[bd], *c = m->comps[cd];
  const kiln_instr *p = kiln_computation_param(m, b, 0), *q = kiln_computation_param(m, c, 0);
  const kiln_instr *r = kiln_computation_root(m, b);
  if (!p || !q || !r || kiln_computation_nparams(m, b) != 1 ||
      kiln_computation_nparams(m, c) != 1 || r->op != KILN_OP_TUPLE ||
      r->noperands != w->shape.rank)
    return false;
  if (!only_gte_uses(m, b, p->id, r->id) || !only_gte_uses(m, c, q->id, KILN_NO_ID)) return false;
  int64_t trips = kiln__tf_trip_count(m, w);
  if (trips < 1) return false;
  *l = (loop){m, b, p, r, trips};
  return true;
}

/* A state element the body passes through unchanged, or a constant. */
static bool invariant(const loop *l, kiln_id id) {
  const kiln_instr *x = l->m->instrs[id];
  int64_t e, e2;
  if (x->op == KILN_OP_CONSTANT) return true;
  if (!is_gte_of(x, l->param->id, &e) || e < 0 || e >= (int64_t)l->root->noperands) return false;
  return is_gte_of(l->m->instrs[l->root->operands[e]], l->param->id, &e2) && e2 == e;
}

/* The dynamic-slice when id is reshape(dynamic-slice(X, ...)) taking one
 * whole step X[i] of an invariant X of rank >= 2 and dropping its leading
 * unit dimension; NULL otherwise. */
static const kiln_instr *step_slice(const loop *l, kiln_id id) {
  const kiln_module *m = l->m;
  const kiln_instr *r = m->instrs[id];
  if (r->op != KILN_OP_RESHAPE || r->noperands != 1) return NULL;
  const kiln_instr *ds = m->instrs[r->operands[0]];
  if (ds->op != KILN_OP_DYNAMIC_SLICE || ds->noperands < 3) return NULL;
  const kiln_instr *x = m->instrs[ds->operands[0]];
  const kiln_shape *xs = &x->shape;
  if (!kiln_shape_is_array(xs) || xs->rank < 2 || ds->noperands != xs->rank + 1 ||
      kiln_shape_is_dynamic(xs) || !invariant(l, x->id))
    return NULL;
  const kiln_i64s *sz = kiln_instr_attr_ints(ds, KILN_ATTR_DYNAMIC_SLICE_SIZES);
  if (sz == NULL || sz->n != xs->rank || sz->v[0] != 1 || r->shape.rank != xs->rank - 1)
    return NULL;
  for (uint32_t k = 1; k < xs->rank; k++)
    if (sz->v[k] != xs->dims[k] || r->shape.dims[k - 1] != xs->dims[k]) return NULL;
  for (uint32_t k = 1; k <= xs->rank; k++)
    if (m->instrs[ds->operands[k]]->shape.rank != 0) return NULL;
  return ds;
}

/* Which operand of dot d (its operands given: d's own, or a call's values
 * bound to its callee's parameters) is the step slice, the other being
 * invariant: 0 or 1, or -1 when the rewrite does not apply or not pay. */
static int match(const loop *l, const kiln_instr *d, const kiln_id ops[2]) {
  const kiln_module *m = l->m;
  if (d->op != KILN_OP_DOT || d->noperands != 2 || !kiln_shape_is_array(&d->shape) ||
      kiln_shape_is_dynamic(&d->shape))
    return -1;
  for (int s = 0; s < 2; s++) {
    const kiln_instr *ds = step_slice(l, ops[s]);
    if (ds == NULL || !invariant(l, ops[1 - s])) continue;
    const kiln_shape *xs = &m->instrs[ds->operands[0]]->shape;
    const kiln_shape *ws = &m->instrs[ops[1 - s]]->shape;
    if (xs->dtype != d->shape.dtype || ws->dtype != d->shape.dtype || !kiln_shape_is_array(ws))
      return -1;
    /* Per step the rewrite trades the product for a copy of its result's
     * slice (B x N against B x N x K work): with a short contraction the
     * copy costs about what the product did. */
    const kiln_i64s *c = kiln_instr_attr_ints(d, s == 0 ? KILN_ATTR_LHS_CONTRACTING_DIMS
                                                        : KILN_ATTR_RHS_CONTRACTING_DIMS);
    const kiln_shape *ss = &m->instrs[ops[s]]->shape;
    int64_t k = 1;
    for (uint32_t j = 0; c && j < c->n && k < MIN_CONTRACTION; j++)
      k *= c->v[j] >= 0 && c->v[j] < (int64_t)ss->rank ? ss->dims[c->v[j]] : 0;
    if (k < MIN_CONTRACTION) return -1;
    int64_t bytes = kiln_shape_bytes(&d->shape);
    if (bytes < 0 || xs->dims[0] < 1 || xs->dims[0] > l->trips ||
        bytes > MAX_PRODUCT_BYTES / xs->dims[0])
      return -1;
    return s;
  }
  return -1;
}

/* A copy of dimension list `a` of d, each entry plus `by`. */
static int64_t *shifted(kiln__tx *tx, const kiln_instr *d, kiln_attr_key key, int64_t by,
                        uint32_t *n) {
  const kiln_i64s *a = kiln_instr_attr_ints(d, key);
  *n = a ? a->n : 0;
  int64_t *v = kiln__b_i64s(tx, *n + 1);
  if (v == NULL) return NULL;
  for (uint32_t k = 0; k < *n; k++) v[k] = a->v[k] + by;
  return v;
}

/* Replaces dot d of the body, operand `s` a step slice, by a slice of the
 * product over all steps. */
static int rewrite(kiln__tx *tx, const loop *l, kiln_instr *d, int s) {
  kiln_module *m = tx->m;
  kiln__b b = {tx, l->body->id};
  const kiln_instr *step = m->instrs[d->operands[s]];
  const kiln_instr *ds = m->instrs[step->operands[0]];
  kiln_id ops[2];
  ops[s] = ds->operands[0];
  ops[1 - s] = d->operands[1 - s];
  static const kiln_attr_key keys[2][2] = {
      {KILN_ATTR_LHS_BATCH_DIMS, KILN_ATTR_LHS_CONTRACTING_DIMS},
      {KILN_ATTR_RHS_BATCH_DIMS, KILN_ATTR_RHS_CONTRACTING_DIMS}};
  uint32_t nbatch, ncontract, n;
  const kiln_i64s *lb = kiln_instr_attr_ints(d, KILN_ATTR_LHS_BATCH_DIMS);
  const kiln_i64s *lc = kiln_instr_attr_ints(d, KILN_ATTR_LHS_CONTRACTING_DIMS);
  nbatch = lb ? lb->n : 0;
  ncontract = lc ? lc->n : 0;
  int64_t lhs_free = (int64_t)m->instrs[d->operands[0]]->shape.rank - nbatch - ncontract;
  uint32_t tpos = nbatch + (s == 1 ? (uint32_t)lhs_free : 0);
  kiln_instr *p = kiln__b_clone_start(&b, d, ops, 2);
  for (int k = 0; k < 2 && p; k++) {
    int64_t *v = shifted(tx, d, keys[s][k], 1, &n);
    if (v == NULL || (n && kiln_instr_set_attr_ints(m, p, keys[s][k], v, n)))
      return kiln__tx_oom(tx);
  }
  kiln_id pid = kiln__b_finish(&b, p);
  if (pid == KILN_NO_ID) return tx->err ? tx->err : KILN_EINTERNAL;
  const kiln_shape *ps = &m->instrs[pid]->shape;
  if (ps->rank != d->shape.rank + 1 || ps->dims[tpos] != m->instrs[ops[s]]->shape.dims[0])
    return kiln__tx_fail(tx, KILN_EINTERNAL, d, "scan_dots: product over all steps has rank %u",
                         ps->rank);
  kiln_id *idx = kiln__b_ids(tx, ps->rank);
  int64_t *sizes = kiln__b_i64s(tx, ps->rank);
  if (idx == NULL || sizes == NULL) return kiln__tx_oom(tx);
  for (uint32_t k = 0; k < ps->rank; k++) {
    idx[k] = ds->operands[k == tpos ? 1 : 2];
    sizes[k] = k == tpos ? 1 : ps->dims[k];
  }
  kiln_id sl = kiln__b_dyn_slice(&b, pid, idx, ps->rank, sizes);
  kiln_instr *out = sl == KILN_NO_ID ? NULL : kiln__b_make(&b, KILN_OP_RESHAPE, &d->shape, &sl, 1);
  if (out == NULL) return tx->err ? tx->err : KILN_EINTERNAL;
  kiln_replace_all_uses(m, l->body->id, d->id, out->id);
  return 0;
}

/* A call of the body whose computation holds a dot that matches once its
 * parameters are bound to the call's operands. */
static bool call_hides_match(const loop *l, const kiln_instr *call) {
  const kiln_module *m = l->m;
  if (!kiln__inline_can(m, l->body->id, call)) return false;
  const kiln_computation *c = m->comps[call->called[0]];
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *d = m->instrs[c->instrs[i]];
    if (d->op != KILN_OP_DOT || d->noperands != 2) continue;
    kiln_id ops[2];
    bool bound = true;
    for (int s = 0; s < 2 && bound; s++) {
      const kiln_instr *o = m->instrs[d->operands[s]];
      bound = o->op == KILN_OP_PARAMETER && o->param_number >= 0 &&
              o->param_number < (int64_t)call->noperands;
      if (bound) ops[s] = call->operands[o->param_number];
    }
    if (bound && match(l, d, ops) >= 0) return true;
  }
  return false;
}

/* Rewrites the matching dots of one loop; *changed when it did. */
static int scan_loop(kiln__tx *tx, loop *l, bool *changed) {
  kiln_module *m = tx->m;
  int rc = 0;
  for (int inlined = 0; inlined < MAX_INLINES && rc == 0;) {
    kiln_id found = KILN_NO_ID;
    for (uint32_t i = 0; i < l->body->ninstrs && found == KILN_NO_ID; i++) {
      const kiln_instr *x = m->instrs[l->body->instrs[i]];
      if (x->op == KILN_OP_CALL && call_hides_match(l, x)) found = x->id;
    }
    if (found == KILN_NO_ID) break;
    rc = kiln__inline_call(tx, l->body->id, found);
    inlined++;
    *changed = true;
  }
  uint32_t n0 = l->body->ninstrs; /* the rewrite appends; those are not dots to match */
  for (uint32_t i = 0; i < n0 && rc == 0; i++) {
    kiln_instr *d = m->instrs[l->body->instrs[i]];
    if (d->op != KILN_OP_DOT || d->noperands != 2) continue;
    int s = match(l, d, d->operands);
    if (s < 0) continue;
    rc = rewrite(tx, l, d, s);
    *changed = true;
  }
  if (rc == 0 && *changed) rc = kiln_computation_sort(m, l->body->id, tx->st);
  return rc;
}

int kiln_pass_scan_dots(kiln_module *m, const kiln_pass_ctx *ctx) {
  kiln__tx tx;
  uint32_t *ncallers = kiln_calloc(m->ncomps ? m->ncomps : 1, sizeof *ncallers);
  int rc = kiln__tx_init(&tx, m, "scan_dots", ctx->st);
  if (rc == 0 && ncallers == NULL) rc = kiln__tx_oom(&tx);
  for (uint32_t c = 0; rc == 0 && c < m->ncomps; c++) {
    const kiln_computation *comp = m->comps[c];
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const kiln_instr *x = m->instrs[comp->instrs[i]];
      for (uint32_t k = 0; k < x->ncalled; k++)
        if (x->called[k] < m->ncomps) ncallers[x->called[k]]++;
    }
  }
  bool changed = false;
  uint32_t ncomps = m->ncomps;
  for (uint32_t c = 0; rc == 0 && c < ncomps; c++) {
    for (uint32_t i = 0; rc == 0 && i < m->comps[c]->ninstrs; i++) {
      loop l;
      const kiln_instr *w = m->instrs[m->comps[c]->instrs[i]];
      if (loop_parts(m, ncallers, w, &l)) rc = scan_loop(&tx, &l, &changed);
    }
  }
  kiln__tx_fini(&tx);
  kiln_free(ncallers);
  if (rc == 0 && changed) rc = kiln_pass_dce(m, ctx);
  return rc;
}
