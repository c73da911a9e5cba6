/* Sibling scatter merging: scatters in one computation that read the same
 * indices (one instruction), apply updates of one shape into operands of
 * one shape under the same dimension numbers, and do not depend on one
 * another become one variadic scatter whose combiner applies each
 * original combiner to its own operand and update; each original's users
 * read its element of the result. jax.ops.segment_sum next to
 * segment_max of the same ids, or a segment max, min and product, then
 * walk (and bucket, kernel_special.c) the indices once, and read an
 * update shared by several of them once, where separate scatters each
 * read them all. Each result element still sees its updates in order
 * through its own combiner, so the values are those of the separate
 * scatters.
 *
 * One walk per computation in order. A scatter joins the first open group
 * it matches when none of its operands is a descendant of a member (the
 * merged scatter then has every operand before it and every user after
 * it); members of a group never feed one another. Only single-operand,
 * pure scatters with no control edges, no sharding and known attributes
 * of static shapes merge, at most MAX_MEMBERS to a group, among the first
 * MAX_SCATTERS of a computation.
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/equal.h"
#include "compiler/passes/passes.h"

#define MAX_MEMBERS 4 /* the codegen applies at most a few outputs per update */
#define MAX_GROUPS 16 /* open groups per computation */
/* Scatters examined per computation: each member costs a walk of the
 * computation (mark_below), so the pass stays linear in its size. */
#define MAX_SCATTERS 64

typedef struct group {
  kiln_id member[MAX_MEMBERS];
  uint32_t n;
  uint8_t *below; /* below[id]: id uses a member, directly or not */
} group;

/* A scatter that may merge: one operand, one update, one combiner of two
 * scalar parameters (numbered 0 and 1) and a scalar result, pure, no control edges, no sharding,
 * every attribute a known one. */
static bool candidate(const kiln_module *m, const kiln_instr *s, const bool *impure) {
  if (s->op != KILN_OP_SCATTER || s->noperands != 3 || s->ncalled != 1 || s->ncontrol ||
      !kiln_shape_is_array(&s->shape) || kiln_shape_is_dynamic(&s->shape) ||
      kiln_shape_is_dynamic(&m->instrs[s->operands[2]]->shape) || s->called[0] >= m->ncomps)
    return false;
  for (uint32_t i = 0; i < s->nattrs; i++)
    if (s->attrs[i].key == KILN_ATTR_UNKNOWN || s->attrs[i].key == KILN_ATTR_SHARDING) return false;
  const kiln_computation *c = m->comps[s->called[0]];
  const kiln_instr *root = kiln_computation_root(m, c);
  if (kiln_computation_nparams(m, c) != 2 || root == NULL || !kiln_shape_is_array(&root->shape) ||
      root->shape.rank != 0)
    return false;
  for (uint32_t j = 0; j < c->ninstrs; j++) {
    const kiln_instr *q = m->instrs[c->instrs[j]];
    if (q->op == KILN_OP_PARAMETER && (q->param_number < 0 || q->param_number > 1 ||
                                       !kiln_shape_is_array(&q->shape) || q->shape.rank != 0))
      return false;
  }
  return kiln__instr_is_pure(m, s, impure);
}

/* The same attributes (metadata aside), key by key. */
static bool same_attrs(const kiln_instr *a, const kiln_instr *b) {
  uint32_t na = 0, nb = 0;
  for (uint32_t i = 0; i < a->nattrs; i++) {
    if (a->attrs[i].key == KILN_ATTR_METADATA) continue;
    na++;
    const kiln_attr *o = kiln_instr_attr(b, a->attrs[i].key);
    if (o == NULL || !kiln__attr_equal(&a->attrs[i], o)) return false;
  }
  for (uint32_t i = 0; i < b->nattrs; i++) nb += b->attrs[i].key != KILN_ATTR_METADATA;
  return na == nb;
}

/* The same dims (element types may differ: a sum and an s32 count). */
static bool same_dims(const kiln_shape *a, const kiln_shape *b) {
  if (a->rank != b->rank) return false;
  for (uint32_t d = 0; d < a->rank; d++)
    if (a->dims[d] != b->dims[d]) return false;
  return true;
}

/* Whether scatter s may join g, whose first member is f. */
static bool joins(const kiln_module *m, const group *g, const kiln_instr *s) {
  const kiln_instr *f = m->instrs[g->member[0]];
  if (g->n >= MAX_MEMBERS || f->operands[1] != s->operands[1]) return false;
  const kiln_shape *fu = &m->instrs[f->operands[2]]->shape, *su = &m->instrs[s->operands[2]]->shape;
  if (!same_dims(fu, su) || !same_dims(&f->shape, &s->shape) || !same_attrs(f, s)) return false;
  for (uint32_t k = 0; k < s->noperands; k++)
    if (g->below[s->operands[k]]) return false;
  return true;
}

/* Marks in g->below every instruction of c after member x that uses x or
 * an instruction already marked (c is in order). */
static void mark_below(const kiln_module *m, const kiln_computation *c, group *g, kiln_id x) {
  g->below[x] = 1;
  bool seen = false;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[c->instrs[i]];
    if (ins->id == x) seen = true;
    if (!seen || g->below[ins->id]) continue;
    for (uint32_t k = 0; k < ins->noperands; k++)
      if (g->below[ins->operands[k]]) {
        g->below[ins->id] = 1;
        break;
      }
  }
}

/* The merged combiner: parameters a_0..a_{n-1}, u_0..u_{n-1}; member i's
 * combiner copied on (a_i, u_i); the tuple of their results. */
static int merged_combiner(kiln__tx *tx, const group *g, uint32_t *out) {
  kiln_module *m = tx->m;
  uint32_t nc;
  if (kiln__b_new_comp(tx, "scatter_merged", &nc)) return tx->err;
  kiln__b b = {tx, nc};
  kiln_id params[2 * MAX_MEMBERS], roots[MAX_MEMBERS];
  for (uint32_t i = 0; i < g->n; i++) {
    const kiln_computation *c = m->comps[m->instrs[g->member[i]]->called[0]];
    for (int64_t p = 0; p < 2; p++) {
      const kiln_instr *q = kiln_computation_param(m, c, p);
      params[p * g->n + i] = kiln__b_param(&b, p * g->n + i, &q->shape, "p");
    }
  }
  kiln_id *map = kiln__b_ids(tx, m->ninstrs);
  for (uint32_t i = 0; i < g->n && map; i++) {
    const kiln_computation *c = m->comps[m->instrs[g->member[i]]->called[0]];
    for (uint32_t j = 0; j < c->ninstrs && kiln__tx_ok(tx); j++) {
      const kiln_instr *x = m->instrs[c->instrs[j]];
      if (x->op == KILN_OP_PARAMETER) {
        map[x->id] = params[x->param_number * g->n + i];
        continue;
      }
      kiln_id ops[16], *o = x->noperands <= 16 ? ops : kiln__b_ids(tx, x->noperands);
      for (uint32_t k = 0; o && k < x->noperands; k++) o[k] = map[x->operands[k]];
      map[x->id] = o ? kiln__b_clone_same(&b, x, o, x->noperands) : KILN_NO_ID;
    }
    roots[i] = map[c->root];
  }
  kiln_id r = map ? kiln__b_tuple(&b, roots, g->n) : KILN_NO_ID;
  if (!kiln__tx_ok(tx) || r == KILN_NO_ID) return tx->err ? tx->err : kiln__tx_oom(tx);
  m->comps[nc]->root = r;
  *out = nc;
  return 0;
}

/* Replaces group g of computation comp by one scatter and its elements. */
static int merge(kiln__tx *tx, uint32_t comp, const group *g) {
  kiln_module *m = tx->m;
  const kiln_instr *f = m->instrs[g->member[0]];
  uint32_t nc;
  int rc = merged_combiner(tx, g, &nc);
  if (rc) return rc;
  kiln_id ops[2 * MAX_MEMBERS + 1];
  kiln_shape elems[MAX_MEMBERS], ts;
  for (uint32_t i = 0; i < g->n; i++) {
    const kiln_instr *s = m->instrs[g->member[i]];
    ops[i] = s->operands[0];
    ops[g->n + 1 + i] = s->operands[2];
    elems[i] = s->shape;
  }
  ops[g->n] = f->operands[1];
  kiln__b b = {tx, comp};
  if (kiln_shape_make_tuple(m->arena, &ts, elems, g->n)) return kiln__tx_oom(tx);
  kiln_id sid = kiln__b_clone_same(&b, f, ops, 2 * g->n + 1);
  kiln_instr *s = sid == KILN_NO_ID ? NULL : m->instrs[sid];
  if (s == NULL || kiln_instr_set_called(m, s, &nc, 1) || kiln_instr_set_shape(m, s, &ts))
    return tx->err ? tx->err : kiln__tx_oom(tx);
  for (uint32_t i = 0; i < g->n; i++) {
    kiln_instr *e = kiln__b_make(&b, KILN_OP_GET_TUPLE_ELEMENT, &elems[i], &sid, 1);
    if (e == NULL || kiln_instr_set_attr_int(m, e, KILN_ATTR_INDEX, i))
      return tx->err ? tx->err : kiln__tx_oom(tx);
    kiln_replace_all_uses(m, comp, g->member[i], e->id);
  }
  return 0;
}

/* Drops the merged members of groups gs[0..ng) from comp and sorts it. */
static int drop_members(kiln_module *m, uint32_t comp, const group *gs, uint32_t ng,
                        kiln_status *st) {
  bool *keep = kiln_malloc(m->ninstrs * sizeof *keep);
  if (keep == NULL) return KILN_ENOMEM;
  for (uint32_t i = 0; i < m->ninstrs; i++) keep[i] = true;
  for (uint32_t j = 0; j < ng; j++)
    for (uint32_t i = 0; gs[j].n >= 2 && i < gs[j].n; i++) keep[gs[j].member[i]] = false;
  kiln_computation_compact(m, comp, keep);
  kiln_free(keep);
  return kiln_computation_sort(m, comp, st);
}

static int merge_computation(kiln__tx *tx, uint32_t comp, const bool *impure, group *gs,
                             uint32_t nbelow, kiln_status *st) {
  kiln_module *m = tx->m;
  const kiln_computation *c = m->comps[comp];
  uint32_t ng = 0, seen = 0;
  bool changed = false;
  for (uint32_t i = 0; i < c->ninstrs && seen < MAX_SCATTERS; i++) {
    const kiln_instr *s = m->instrs[c->instrs[i]];
    if (!candidate(m, s, impure)) continue;
    seen++;
    uint32_t j = 0;
    while (j < ng && !joins(m, &gs[j], s)) j++;
    if (j == ng && ng == MAX_GROUPS) continue;
    if (j == ng) {
      memset(gs[ng].below, 0, nbelow);
      gs[ng++].n = 0;
    }
    gs[j].member[gs[j].n++] = s->id;
    mark_below(m, c, &gs[j], s->id);
  }
  for (uint32_t j = 0; j < ng; j++) {
    if (gs[j].n < 2) continue;
    int rc = merge(tx, comp, &gs[j]);
    if (rc) return rc;
    changed = true;
  }
  return changed ? drop_members(m, comp, gs, ng, st) : 0;
}

int kiln_pass_scatter_merge(kiln_module *m, const kiln_pass_ctx *ctx) {
  kiln__tx tx;
  group gs[MAX_GROUPS];
  /* Computations made here (combiners) come after nc0 and hold no
   * scatter; the walked ones hold only ids below n0. */
  uint32_t n0 = m->ninstrs ? m->ninstrs : 1, nc0 = m->ncomps;
  bool *impure = kiln__impure_computations(m);
  int rc = kiln__tx_init(&tx, m, "scatter_merge", ctx->st);
  for (uint32_t j = 0; j < MAX_GROUPS; j++) gs[j].below = kiln_malloc(n0);
  for (uint32_t j = 0; j < MAX_GROUPS && rc == 0; j++)
    if (gs[j].below == NULL) rc = KILN_ENOMEM;
  if (rc == 0 && impure == NULL) rc = KILN_ENOMEM;
  for (uint32_t c = 0; rc == 0 && c < nc0; c++)
    rc = merge_computation(&tx, c, impure, gs, n0, ctx->st);
  kiln__tx_fini(&tx);
  for (uint32_t j = 0; j < MAX_GROUPS; j++) kiln_free(gs[j].below);
  kiln_free(impure);
  if (rc == KILN_ENOMEM) return kiln_status_set(ctx->st, rc, "scatter_merge", "out of memory");
  return rc;
}
