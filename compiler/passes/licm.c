/* While-loop invariant code motion: work in a while body that depends only
 * on loop-invariant state and constants is done once, before the loop.
 *
 * A state element i is invariant when the body's root tuple passes
 * get-tuple-element(param, i) through unchanged. An instruction of the body
 * is invariant when it is pure (ir/build.h), has no control predecessors, is
 * not itself a loop, and all its operands are invariant; constants and
 * iotas are invariant. Invariant instructions that are worth moving (not
 * cheap: constants, iotas, tuples, get-tuple-element, broadcasts of
 * scalars) and that feed something staying in the loop are hoisted: their
 * invariant operand cones are copied before the while, the values are
 * appended to the loop state as new tuple elements, and inside the body
 * they become get-tuple-elements of the parameter, passed through by the
 * root. The while, the body's and condition's parameters take the grown
 * shape; users of the while that are not get-tuple-elements see a tuple of
 * the original elements, so the result shape is what it was.
 *
 * A loop is left alone when its body or condition is called from anywhere
 * else, its body's root is not a tuple, or a parameter is used other than
 * through get-tuple-element (the grown shape would reach those users).
 * Computations are visited callees first, so an inner loop's hoisted work
 * can move out of the outer loop too.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/passes.h"

enum { F_INV = 1, F_WORTH = 2, F_HOIST = 4, F_NEED = 8 };

typedef struct licm {
  kiln_module *m;
  const bool *impure;
  uint32_t *ncallers; /* per computation: references from listed instructions */
  /* Per instruction id, valid when mark[id] == gen. */
  uint32_t *mark;
  uint8_t *flags;
  kiln_id *outer; /* the value before the loop of an invariant body value */
  size_t cap;
  uint32_t gen;
  kiln_id *elem; /* the loop being rewritten: its state elements before it */
  kiln__tx tx;   /* builds the copies, reads and tuples; one per pass run */
  bool moved;    /* some loop grew: its body keeps the dead originals until dce */
} licm;

static int grow(licm *l) {
  size_t need = l->m->ninstrs;
  if (need <= l->cap) return 0;
  size_t cap = l->cap ? l->cap : 64;
  while (cap < need) cap *= 2;
  uint32_t *mk = kiln_realloc(l->mark, cap * sizeof *mk);
  if (mk == NULL) return KILN_ENOMEM;
  l->mark = mk;
  uint8_t *fl = kiln_realloc(l->flags, cap);
  if (fl == NULL) return KILN_ENOMEM;
  l->flags = fl;
  kiln_id *o = kiln_realloc(l->outer, cap * sizeof *o);
  if (o == NULL) return KILN_ENOMEM;
  l->outer = o;
  for (size_t i = l->cap; i < cap; i++) l->mark[i] = 0;
  l->cap = cap;
  return 0;
}

static uint8_t flags_of(const licm *l, kiln_id id) {
  return id < l->cap && l->mark[id] == l->gen ? l->flags[id] : 0;
}

static void set_flag(licm *l, kiln_id id, uint8_t f) {
  if (l->mark[id] != l->gen) {
    l->mark[id] = l->gen;
    l->flags[id] = 0;
  }
  l->flags[id] |= f;
}

static bool cheap(const kiln_module *m, const kiln_instr *x) {
  switch (x->op) {
  case KILN_OP_CONSTANT:
  case KILN_OP_IOTA:
  case KILN_OP_TUPLE:
  case KILN_OP_GET_TUPLE_ELEMENT:
  case KILN_OP_PARAMETER: return true;
  case KILN_OP_BROADCAST: return x->noperands == 1 && m->instrs[x->operands[0]]->shape.rank == 0;
  default: return false;
  }
}

static bool is_gte_of(const kiln_instr *x, kiln_id tuple, int64_t *index) {
  if (x->op != KILN_OP_GET_TUPLE_ELEMENT || x->noperands != 1 || x->operands[0] != tuple)
    return false;
  *index = kiln_instr_attr_int(x, KILN_ATTR_INDEX, -1);
  return true;
}

/* Every use of `param` in computation c is a get-tuple-element, and (when
 * `root` is given) the root is used by nothing. */
static bool only_gte_uses(const kiln_module *m, const kiln_computation *c, kiln_id param,
                          kiln_id root) {
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *x = m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < x->noperands; k++) {
      if (x->operands[k] == param && x->op != KILN_OP_GET_TUPLE_ELEMENT) return false;
      if (x->operands[k] == root) return false;
    }
  }
  return true;
}

/* Marks invariant, worth-moving, hoisted and needed instructions of body
 * b; returns the number hoisted. */
static uint32_t analyse(licm *l, const kiln_computation *b, const kiln_instr *p,
                        const kiln_instr *root) {
  kiln_module *m = l->m;
  for (uint32_t i = 0; i < b->ninstrs; i++) {
    const kiln_instr *x = m->instrs[b->instrs[i]];
    int64_t e;
    bool inv;
    if (is_gte_of(x, p->id, &e)) {
      const kiln_instr *r =
          e >= 0 && e < (int64_t)root->noperands ? m->instrs[root->operands[e]] : NULL;
      int64_t e2;
      inv = r && is_gte_of(r, p->id, &e2) && e2 == e;
    } else if (x->op == KILN_OP_PARAMETER || x->op == KILN_OP_WHILE || x->ncontrol ||
               !kiln__instr_is_pure(m, x, l->impure)) {
      inv = false;
    } else {
      inv = true;
      for (uint32_t k = 0; k < x->noperands && inv; k++) inv = flags_of(l, x->operands[k]) & F_INV;
    }
    if (inv) set_flag(l, x->id, cheap(m, x) ? F_INV : F_INV | F_WORTH);
  }
  uint32_t n = 0;
  for (uint32_t i = 0; i < b->ninstrs; i++) {
    const kiln_instr *y = m->instrs[b->instrs[i]];
    bool y_moves = (flags_of(l, y->id) & F_WORTH) != 0;
    for (uint32_t k = 0; k < y->noperands && !y_moves; k++) {
      kiln_id o = y->operands[k];
      if ((flags_of(l, o) & (F_WORTH | F_HOIST)) == F_WORTH) {
        set_flag(l, o, F_HOIST | F_NEED);
        n++;
      }
    }
  }
  for (uint32_t i = b->ninstrs; i-- > 0;) {
    const kiln_instr *x = m->instrs[b->instrs[i]];
    int64_t e;
    if (!(flags_of(l, x->id) & F_NEED) || is_gte_of(x, p->id, &e)) continue;
    for (uint32_t k = 0; k < x->noperands; k++) set_flag(l, x->operands[k], F_NEED);
  }
  return n;
}

/* The value of state element i before the loop (built once). */
static kiln_id outside_elem(licm *l, kiln__b *nc, const kiln_instr *init, const kiln_shape *s,
                            int64_t i) {
  if (i < 0 || i >= (int64_t)s->rank) return KILN_NO_ID;
  if (l->elem[i] != KILN_NO_ID) return l->elem[i];
  if (init->op == KILN_OP_TUPLE && init->noperands == s->rank)
    return l->elem[i] = init->operands[i];
  kiln_instr *g = kiln__b_make(nc, KILN_OP_GET_TUPLE_ELEMENT, &s->tuple[i], &init->id, 1);
  if (g == NULL || kiln_instr_set_attr_int(l->m, g, KILN_ATTR_INDEX, i)) return KILN_NO_ID;
  return l->elem[i] = g->id;
}

/* Copies the needed cone before the loop; fills l->outer. */
static int copy_out(licm *l, kiln__b *nc, const kiln_computation *b, const kiln_instr *p,
                    const kiln_instr *w) {
  kiln_module *m = l->m;
  const kiln_instr *init = m->instrs[w->operands[0]];
  kiln_id ops[64];
  for (uint32_t i = 0; i < b->ninstrs; i++) {
    const kiln_instr *x = m->instrs[b->instrs[i]];
    if (!(flags_of(l, x->id) & F_NEED)) continue;
    int64_t e;
    kiln_id v;
    if (is_gte_of(x, p->id, &e)) {
      v = outside_elem(l, nc, init, &w->shape, e);
    } else {
      if (x->noperands > 64) return KILN_EINVAL;
      for (uint32_t k = 0; k < x->noperands; k++) ops[k] = l->outer[x->operands[k]];
      v = kiln__b_clone_keep_name(nc, x, ops, x->noperands);
    }
    if (v == KILN_NO_ID || grow(l)) return KILN_ENOMEM;
    l->outer[x->id] = v;
  }
  return 0;
}

/* Whether loop w can be rewritten; fills its parts. */
static bool eligible(const licm *l, const kiln_instr *w, kiln_computation **bp,
                     kiln_computation **cp, kiln_instr **pp, kiln_instr **qp, kiln_instr **rp) {
  const kiln_module *m = l->m;
  if (w->ncalled != 2 || w->noperands != 1 || !kiln_shape_is_tuple(&w->shape)) return false;
  uint32_t cd = w->called[0], bd = w->called[1];
  if (cd >= m->ncomps || bd >= m->ncomps || cd == bd || l->ncallers[cd] != 1 ||
      l->ncallers[bd] != 1)
    return false;
  kiln_computation *b = m->comps[bd], *c = m->comps[cd];
  kiln_instr *p = kiln_computation_param(m, b, 0), *q = kiln_computation_param(m, c, 0);
  kiln_instr *r = kiln_computation_root(m, b);
  if (!p || !q || !r || kiln_computation_nparams(m, b) != 1 ||
      kiln_computation_nparams(m, c) != 1 || r->op != KILN_OP_TUPLE ||
      r->noperands != w->shape.rank || w->shape.rank > 4096)
    return false;
  if (!only_gte_uses(m, b, p->id, r->id) || !only_gte_uses(m, c, q->id, KILN_NO_ID)) return false;
  *bp = b, *cp = c, *pp = p, *qp = q, *rp = r;
  return true;
}

/* Inside body b, each hoisted value becomes state element k + j, read from
 * parameter p; root_ops[k + j] receives those reads. */
static int thread_inside(licm *l, kiln__b *nb, kiln_computation *b, const kiln_instr *p,
                         const kiln_id *hoisted, uint32_t nh, uint32_t k, kiln_id *root_ops) {
  kiln_module *m = l->m;
  for (uint32_t j = 0; j < nh; j++) {
    const kiln_instr *x = m->instrs[hoisted[j]];
    kiln_instr *g = kiln__b_make(nb, KILN_OP_GET_TUPLE_ELEMENT, &x->shape, &p->id, 1);
    if (g == NULL || kiln_instr_set_attr_int(m, g, KILN_ATTR_INDEX, k + j) || grow(l))
      return KILN_ENOMEM;
    l->outer[x->id] = g->id; /* from here on: the replacement inside */
    root_ops[k + j] = g->id;
  }
  for (uint32_t i = 0; i < b->ninstrs; i++) {
    kiln_instr *y = m->instrs[b->instrs[i]];
    for (uint32_t t = 0; t < y->noperands; t++)
      if (flags_of(l, y->operands[t]) & F_HOIST) y->operands[t] = l->outer[y->operands[t]];
    for (uint32_t t = 0; t < y->ncontrol; t++)
      if (flags_of(l, y->control_preds[t]) & F_HOIST)
        y->control_preds[t] = l->outer[y->control_preds[t]];
  }
  return 0;
}

/* Grows the loop state by the hoisted values. *done tells whether it did. */
static int hoist(licm *l, kiln__b *nc, kiln_instr *w, bool *done) {
  kiln_module *m = l->m;
  kiln_computation *b, *c;
  kiln_instr *p, *q, *r;
  *done = false;
  if (!eligible(l, w, &b, &c, &p, &q, &r)) return 0;
  l->gen++;
  uint32_t nh = analyse(l, b, p, r);
  if (nh == 0) return 0;
  uint32_t k = w->shape.rank, k2 = k + nh;
  kiln_free(l->elem);
  if ((l->elem = kiln_malloc(k * sizeof *l->elem + 1)) == NULL) return KILN_ENOMEM;
  for (uint32_t i = 0; i < k; i++) l->elem[i] = KILN_NO_ID;
  int rc = copy_out(l, nc, b, p, w);
  if (rc) return rc;
  kiln_shape *elems = kiln_arena_calloc(m->arena, k2, sizeof *elems);
  kiln_id *init_ops = kiln_malloc(k2 * sizeof *init_ops);
  kiln_id *root_ops = kiln_malloc(k2 * sizeof *root_ops);
  kiln_id *hoisted = kiln_malloc(nh * sizeof *hoisted);
  kiln__b nb = {&l->tx, b->id};
  rc = KILN_ENOMEM;
  if (!elems || !init_ops || !root_ops || !hoisted) goto out;
  const kiln_instr *init = m->instrs[w->operands[0]];
  for (uint32_t i = 0; i < k; i++) {
    elems[i] = w->shape.tuple[i];
    init_ops[i] = outside_elem(l, nc, init, &w->shape, i);
    root_ops[i] = r->operands[i];
    if (init_ops[i] == KILN_NO_ID) goto out;
  }
  uint32_t j = 0;
  for (uint32_t i = 0; i < b->ninstrs && j < nh; i++)
    if (flags_of(l, b->instrs[i]) & F_HOIST) hoisted[j++] = b->instrs[i];
  kiln_shape grown;
  for (j = 0; j < nh; j++) {
    elems[k + j] = m->instrs[hoisted[j]]->shape;
    init_ops[k + j] = l->outer[hoisted[j]];
  }
  if (kiln_shape_make_tuple(m->arena, &grown, elems, k2)) goto out;
  kiln_instr *ninit = kiln__b_make(nc, KILN_OP_TUPLE, &grown, init_ops, k2);
  if (ninit == NULL) goto out;
  if (thread_inside(l, &nb, b, p, hoisted, nh, k, root_ops)) goto out;
  for (uint32_t i = 0; i < k; i++) root_ops[i] = r->operands[i]; /* after the remap */
  if (kiln_instr_set_operands(m, r, root_ops, k2) || kiln_instr_set_shape(m, r, &grown) ||
      kiln_instr_set_shape(m, p, &grown) || kiln_instr_set_shape(m, q, &grown) ||
      kiln_instr_set_shape(m, w, &grown))
    goto out;
  w->operands[0] = ninit->id;
  *done = true;
  rc = kiln_computation_sort(m, b->id, NULL);
out:
  kiln_free(init_ops);
  kiln_free(root_ops);
  kiln_free(hoisted);
  return rc;
}

typedef struct grown_loop {
  kiln_id w;
  kiln_shape old; /* the shape users outside saw */
  kiln_id wrap;   /* tuple of the original elements, built on first need */
} grown_loop;

/* Non-get-tuple-element users of grown loops (and the root) get a tuple of
 * the original elements instead. */
static int rewrap(licm *l, kiln__b *nc, grown_loop *g, uint32_t ng) {
  kiln_module *m = l->m;
  kiln_computation *c = m->comps[nc->comp];
  /* Here F_INV marks a grown loop and outer[] holds its index in g. */
  l->gen++;
  for (uint32_t i = 0; i < ng; i++) {
    set_flag(l, g[i].w, F_INV);
    l->outer[g[i].w] = i;
  }
  kiln_id ops[4096];
  uint32_t n0 = c->ninstrs; /* the wrappers appended below use only get-tuple-element */
  for (uint32_t i = 0; i <= n0; i++) {
    bool is_root = i == n0;
    kiln_instr *y = is_root ? NULL : m->instrs[c->instrs[i]];
    uint32_t n = is_root ? 1 : y->noperands;
    for (uint32_t t = 0; t < n; t++) {
      kiln_id *slot = is_root ? &c->root : &y->operands[t];
      if (*slot >= l->cap || !(flags_of(l, *slot) & F_INV)) continue;
      if (!is_root && y->op == KILN_OP_GET_TUPLE_ELEMENT) continue;
      grown_loop *gl = &g[l->outer[*slot]];
      if (gl->wrap == KILN_NO_ID) {
        for (uint32_t e = 0; e < gl->old.rank; e++) {
          kiln_instr *x = kiln__b_make(nc, KILN_OP_GET_TUPLE_ELEMENT, &gl->old.tuple[e], &gl->w, 1);
          if (x == NULL || kiln_instr_set_attr_int(m, x, KILN_ATTR_INDEX, e)) return KILN_ENOMEM;
          ops[e] = x->id;
        }
        kiln_instr *t2 = kiln__b_make(nc, KILN_OP_TUPLE, &gl->old, ops, gl->old.rank);
        if (t2 == NULL || grow(l)) return KILN_ENOMEM;
        gl->wrap = t2->id;
      }
      *slot = gl->wrap;
    }
  }
  return 0;
}

static int licm_computation(licm *l, uint32_t comp) {
  kiln_module *m = l->m;
  kiln_computation *c = m->comps[comp];
  uint32_t nw = 0;
  for (uint32_t i = 0; i < c->ninstrs; i++) nw += m->instrs[c->instrs[i]]->op == KILN_OP_WHILE;
  if (nw == 0) return 0;
  grown_loop *g = kiln_malloc(nw * sizeof *g);
  kiln__b nc = {&l->tx, comp};
  if (g == NULL) return KILN_ENOMEM;
  uint32_t ng = 0;
  for (uint32_t i = 0; i < c->ninstrs; i++)
    if (m->instrs[c->instrs[i]]->op == KILN_OP_WHILE) g[ng++].w = c->instrs[i];
  uint32_t grown = 0;
  int rc = 0;
  for (uint32_t i = 0; i < ng && rc == 0; i++) {
    kiln_instr *w = m->instrs[g[i].w];
    kiln_shape old = w->shape;
    bool done = false;
    rc = hoist(l, &nc, w, &done);
    if (done) g[grown++] = (grown_loop){w->id, old, KILN_NO_ID};
  }
  if (grown) l->moved = true;
  if (rc == 0 && grown) rc = rewrap(l, &nc, g, grown);
  if (rc == 0 && grown) rc = kiln_computation_sort(m, comp, NULL);
  kiln_free(g);
  return rc;
}

int kiln_pass_while_licm(kiln_module *m, const kiln_pass_ctx *ctx) {
  licm l = {0};
  l.m = m;
  uint32_t *order = NULL, n = 0;
  bool *impure = kiln__impure_computations(m);
  l.impure = impure;
  l.ncallers = kiln_calloc(m->ncomps ? m->ncomps : 1, sizeof *l.ncallers);
  int rc = KILN_ENOMEM;
  if (kiln__tx_init(&l.tx, m, "while_licm", NULL) || impure == NULL || l.ncallers == NULL ||
      grow(&l) || kiln_module_post_order(m, &order, &n))
    goto out;
  for (uint32_t c = 0; c < m->ncomps; c++) {
    const kiln_computation *comp = m->comps[c];
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const kiln_instr *x = m->instrs[comp->instrs[i]];
      for (uint32_t k = 0; k < x->ncalled; k++)
        if (x->called[k] < m->ncomps) l.ncallers[x->called[k]]++;
    }
  }
  rc = 0;
  for (uint32_t i = 0; i < n && rc == 0; i++) rc = licm_computation(&l, order[i]);
out:
  kiln__tx_fini(&l.tx);
  kiln_free(order);
  kiln_free(impure);
  kiln_free(l.ncallers);
  kiln_free(l.mark);
  kiln_free(l.flags);
  kiln_free(l.outer);
  kiln_free(l.elem);
  if (rc == KILN_ENOMEM) return kiln_status_set(ctx->st, rc, "while_licm", "out of memory");
  if (rc) return kiln_status_set(ctx->st, rc, "while_licm", "cannot hoist out of a loop");
  /* The hoisted originals are dead in the bodies now, but a body runs every
   * instruction it lists: without this the loop still computed them. */
  return l.moved ? kiln_pass_dce(m, ctx) : 0;
}
