/* Layout assignment: gives every array value a physical order
 * (minor_to_major), so that code generation and buffer assignment know how
 * each buffer is laid out, and uses that freedom to make transposes cost
 * nothing.
 *
 * The rules, in order:
 *  1. A dot operand that is a transpose is folded into the dot's dimension
 *     numbers when the dot is f32 or f64 (a GEMM) and stays a plain
 *     (batched) matrix product: the dot
 *     reads the transpose's operand directly and the GEMM runs with a
 *     transpose flag. The same holds for the dot inside a kOutput fusion
 *     whose parameter only feeds the dot. A transpose left without users is
 *     dropped.
 *  2. Entry parameters and the entry result take the
 *     entry_computation_layout when the module gives one; other values keep
 *     a layout written in the input (a dump after XLA's own layout
 *     assignment stays as it is, and bitcasts keep their meaning);
 *     a top-level GEMM takes its readers' written layout when they agree
 *     and it can write it (dot_layout);
 *     everything else is row-major ({rank-1,...,0}). Scalars carry no
 *     layout (the empty one is implied).
 *  3. Values that alias or cross a call boundary agree exactly: a tuple's
 *     shape is its operands' shapes, a get-tuple-element's is its tuple
 *     element's; a while's state has the body parameter's layouts (operand,
 *     condition parameter, body root and result); a conditional's branch
 *     parameters and roots match its operands and result; a call's result
 *     is its callee's root. A fused computation's parameters without a
 *     written layout take the fusion operands' layouts, so no copy is ever
 *     needed in front of a fusion. Where two layouts must meet and differ
 *     (written layouts that disagree, the entry result), a `copy` converts:
 *     the only copies this pass inserts.
 *  4. A top-level transpose whose users all read any layout (not a tuple,
 *     call boundary, custom call, collective or bitcast; not the root) takes
 *     its operand's layout permuted, so its bytes are its operand's: it
 *     becomes a `bitcast`. A reshape between row-major arrays (not a root)
 *     is likewise a bitcast. Inside fused computations nothing is rewritten:
 *     a transpose there is just indexing.
 * Finally the module's entry_computation_layout records the parameter and
 * result layouts the executable binds.
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/user_kernel.h"
#include "compiler/passes/passes.h"

typedef struct lctx {
  kiln_module *m;
  kiln_status *st;
  kiln_users *users;            /* built before any rewrite; original ids only */
  uint32_t nids;                /* instructions when users were built */
  const kiln_shape **want_root; /* per computation: the root's required shape, or NULL */
  bool *fused;                  /* per computation: called by a fusion */
  bool *done;                   /* per computation: layouts assigned */
  kiln_arena *a;
} lctx;

static int oom(lctx *l) { return kiln_status_set(l->st, KILN_ENOMEM, "layout", "out of memory"); }

/* ---- shapes ---------------------------------------------------------------- */

static bool has_layout(const kiln_shape *s) {
  return s->layout && s->layout->rank == s->rank && s->layout->minor_to_major;
}

static int set_m2m(kiln_module *m, kiln_shape *s, const int64_t *m2m) {
  kiln_layout *lay = kiln_arena_calloc(m->arena, 1, sizeof *lay);
  int64_t *v = kiln_arena_memdup(m->arena, m2m, s->rank * sizeof *v);
  if (lay == NULL || v == NULL) return KILN_ENOMEM;
  lay->minor_to_major = v;
  lay->rank = s->rank;
  s->layout = lay;
  return 0;
}

/* Fills every array leaf without a layout with the row-major one. */
static int fill_default(kiln_module *m, kiln_shape *s, int depth) {
  if (depth > 64) return 0;
  if (kiln_shape_is_tuple(s)) {
    for (uint32_t i = 0; i < s->rank; i++) {
      int rc = fill_default(m, &s->tuple[i], depth + 1);
      if (rc) return rc;
    }
    return 0;
  }
  if (!kiln_shape_is_array(s) || s->rank == 0 || has_layout(s)) return 0;
  int64_t m2m[64];
  if (s->rank > 64) return 0;
  for (uint32_t i = 0; i < s->rank; i++) m2m[i] = (int64_t)s->rank - 1 - i;
  return set_m2m(m, s, m2m);
}

/* Fills array leaves of `s` without a layout from the matching leaves of
 * `from` (same structure), then the rest with row-major. */
static int fill_from(kiln_module *m, kiln_shape *s, const kiln_shape *from, int depth) {
  if (depth > 64 || !kiln_shape_equal(s, from, false)) return fill_default(m, s, depth);
  if (kiln_shape_is_tuple(s)) {
    for (uint32_t i = 0; i < s->rank; i++) {
      int rc = fill_from(m, &s->tuple[i], &from->tuple[i], depth + 1);
      if (rc) return rc;
    }
    return 0;
  }
  if (kiln_shape_is_array(s) && s->rank && !has_layout(s) && has_layout(from))
    return set_m2m(m, s, from->layout->minor_to_major);
  return fill_default(m, s, depth);
}

/* ---- names ------------------------------------------------------------------ */

static bool name_taken(const kiln_module *m, const kiln_computation *c, const char *s) {
  for (uint32_t i = 0; i < c->ninstrs; i++)
    if (strcmp(m->instrs[c->instrs[i]]->name, s) == 0) return true;
  return false;
}

static kiln_instr *add(lctx *l, uint32_t comp, kiln_opcode op, const char *base) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", base);
  for (unsigned k = 1; name_taken(l->m, l->m->comps[comp], buf); k++)
    snprintf(buf, sizeof buf, "%s.%u", base, k);
  return kiln_module_add_instr(l->m, comp, op, buf);
}

/* ---- conversions ------------------------------------------------------------ */

/* A value equal to v with the layouts of `want` (same structure): v itself,
 * or a copy (per leaf, through the tuple, for tuples). */
static int coerce(lctx *l, uint32_t comp, kiln_id v, const kiln_shape *want, int depth,
                  kiln_id *out) {
  kiln_module *m = l->m;
  const kiln_instr *x = m->instrs[v];
  *out = v;
  if (kiln_shape_equal(&x->shape, want, true) || !kiln_shape_equal(&x->shape, want, false) ||
      depth > 64)
    return 0;
  if (kiln_shape_is_array(want)) {
    kiln_instr *c = add(l, comp, KILN_OP_COPY, "copy");
    if (c == NULL || kiln_instr_set_operands(m, c, &v, 1) || kiln_instr_set_shape(m, c, want))
      return oom(l);
    *out = c->id;
    return 0;
  }
  if (!kiln_shape_is_tuple(want)) return 0;
  uint32_t n = want->rank;
  kiln_id *elems = kiln_arena_alloc(l->a, (n ? n : 1) * sizeof *elems);
  if (elems == NULL) return oom(l);
  for (uint32_t i = 0; i < n; i++) {
    kiln_id e;
    if (x->op == KILN_OP_TUPLE && i < x->noperands) {
      e = x->operands[i]; /* take the element where it was made */
    } else {
      kiln_instr *g = add(l, comp, KILN_OP_GET_TUPLE_ELEMENT, "get-tuple-element");
      if (g == NULL || kiln_instr_set_operands(m, g, &v, 1) ||
          kiln_instr_set_shape(m, g, &m->instrs[v]->shape.tuple[i]) ||
          kiln_instr_set_attr_int(m, g, KILN_ATTR_INDEX, i))
        return oom(l);
      e = g->id;
    }
    int rc = coerce(l, comp, e, &want->tuple[i], depth + 1, &elems[i]);
    if (rc) return rc;
  }
  kiln_instr *t = add(l, comp, KILN_OP_TUPLE, "tuple");
  if (t == NULL || kiln_instr_set_operands(m, t, elems, n) || kiln_instr_set_shape(m, t, want))
    return oom(l);
  *out = t->id;
  return 0;
}

/* ---- rule 1: transposes into dots -------------------------------------- */

static bool is_iota_prefix(const kiln_i64s *v) {
  for (uint32_t i = 0; v && i < v->n; i++)
    if (v->v[i] != (int64_t)i) return false;
  return true;
}

/* Rewrites side `s` (0 lhs, 1 rhs) of dot d to read `src`, of which the
 * current operand is transpose(src, perm), when the dot stays a plain
 * batched matrix product: batch dims leading in order, one contracting dim,
 * at most one other dim. Returns whether it did. */
static int fold_into_dot(lctx *l, kiln_instr *d, uint32_t s, const kiln_shape *src, kiln_id src_id,
                         const kiln_i64s *perm, bool *folded) {
  *folded = false;
  /* Only a GEMM reads a transposed operand for free; an integer dot's loop
   * wants the copy dot_canon made (K minor on both sides). */
  if (d->shape.dtype != KILN_F32 && d->shape.dtype != KILN_F64) return 0;
  kiln_attr_key bk = s ? KILN_ATTR_RHS_BATCH_DIMS : KILN_ATTR_LHS_BATCH_DIMS;
  kiln_attr_key ck = s ? KILN_ATTR_RHS_CONTRACTING_DIMS : KILN_ATTR_LHS_CONTRACTING_DIMS;
  const kiln_i64s *b = kiln_instr_attr_ints(d, bk), *c = kiln_instr_attr_ints(d, ck);
  uint32_t nb = b ? b->n : 0, r = src->rank;
  if (c == NULL || c->n != 1 || perm == NULL || perm->n != r || r < nb + 1 || r > nb + 2 ||
      nb > 16 || !kiln_shape_is_array(src))
    return 0;
  int64_t nbv[16], ncv;
  for (uint32_t i = 0; i < nb; i++) {
    if (b->v[i] < 0 || b->v[i] >= r) return 0;
    nbv[i] = perm->v[b->v[i]];
  }
  if (c->v[0] < 0 || c->v[0] >= r) return 0;
  ncv = perm->v[c->v[0]];
  kiln_i64s nbs = {nbv, nb};
  if (!is_iota_prefix(&nbs)) return 0;
  if ((nb && kiln_instr_set_attr_ints(l->m, d, bk, nbv, nb)) ||
      kiln_instr_set_attr_ints(l->m, d, ck, &ncv, 1))
    return oom(l);
  d->operands[s] = src_id;
  *folded = true;
  return 0;
}

static bool only_user(const lctx *l, kiln_id x, kiln_id user) {
  uint32_t nu;
  const kiln_id *us = kiln_users_of(l->users, x, &nu);
  for (uint32_t i = 0; i < nu; i++)
    if (us[i] != user) return false;
  return nu > 0;
}

static bool foldable_transpose(const lctx *l, const kiln_instr *t, uint32_t comp) {
  return t->op == KILN_OP_TRANSPOSE && t->comp == comp && t->ncontrol == 0 && t->id < l->nids &&
         t->noperands == 1 && !kiln_shape_is_dynamic(&t->shape);
}

static int fold_transposes(lctx *l, uint32_t comp) {
  kiln_module *m = l->m;
  kiln_computation *c = m->comps[comp];
  bool changed = false;
  int rc;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_instr *x = m->instrs[c->instrs[i]];
    if (x->op == KILN_OP_DOT && x->noperands == 2) {
      for (uint32_t s = 0; s < 2; s++) {
        kiln_instr *t = m->instrs[x->operands[s]];
        bool f = false;
        if (foldable_transpose(l, t, comp) &&
            (rc = fold_into_dot(l, x, s, &m->instrs[t->operands[0]]->shape, t->operands[0],
                                kiln_instr_attr_ints(t, KILN_ATTR_DIMENSIONS), &f)))
          return rc;
        changed |= f;
      }
    }
    /* The dot of a kOutput fusion whose parameter k only feeds the dot. */
    if (x->op != KILN_OP_FUSION || x->ncalled != 1 || x->called[0] >= m->ncomps) continue;
    const char *kind = kiln_instr_attr_str(x, KILN_ATTR_KIND);
    if (kind == NULL || strcmp(kind, "kOutput") != 0) continue;
    kiln_computation *fc = m->comps[x->called[0]];
    for (uint32_t j = 0; j < fc->ninstrs; j++) {
      kiln_instr *d = m->instrs[fc->instrs[j]];
      /* (A parameter read as both operands would need both sides folded.) */
      if (d->op != KILN_OP_DOT || d->noperands != 2 || d->operands[0] == d->operands[1]) continue;
      for (uint32_t s = 0; s < 2; s++) {
        kiln_instr *p = m->instrs[d->operands[s]];
        if (p->op != KILN_OP_PARAMETER || p->param_number < 0 || p->param_number >= x->noperands ||
            p->id >= l->nids || !only_user(l, p->id, d->id))
          continue;
        kiln_instr *t = m->instrs[x->operands[p->param_number]];
        if (!foldable_transpose(l, t, comp)) continue;
        const kiln_instr *src = m->instrs[t->operands[0]];
        bool f = false;
        /* The dot keeps reading the parameter, which takes src's shape. */
        if ((rc = fold_into_dot(l, d, s, &src->shape, p->id,
                                kiln_instr_attr_ints(t, KILN_ATTR_DIMENSIONS), &f)))
          return rc;
        if (!f) continue;
        if (kiln_instr_set_shape(m, p, &src->shape)) return oom(l);
        x->operands[p->param_number] = src->id;
        changed = true;
      }
    }
  }
  if (!changed) return 0;
  /* Drop transposes nothing reads any more. */
  uint32_t *uses = kiln_calloc(m->ninstrs, sizeof *uses);
  bool *keep = kiln_calloc(m->ninstrs, sizeof *keep);
  if (uses == NULL || keep == NULL) {
    kiln_free(uses);
    kiln_free(keep);
    return oom(l);
  }
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *u = m->instrs[c->instrs[i]];
    keep[u->id] = true;
    for (uint32_t k = 0; k < u->noperands; k++) uses[u->operands[k]]++;
    for (uint32_t k = 0; k < u->ncontrol; k++) uses[u->control_preds[k]]++;
  }
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *t = m->instrs[c->instrs[i]];
    if (t->op == KILN_OP_TRANSPOSE && t->id != c->root && uses[t->id] == 0 && t->id < l->nids)
      keep[t->id] = false;
  }
  kiln_computation_compact(m, comp, keep);
  kiln_free(uses);
  kiln_free(keep);
  return 0;
}

/* ---- rules 2-4: assignment ------------------------------------------------ */

/* Whether user u reads its operands in whatever layout they come. */
static bool reads_any_layout(const kiln_instr *u) {
  switch (u->op) {
  case KILN_OP_TUPLE:
  case KILN_OP_WHILE:
  case KILN_OP_CONDITIONAL:
  case KILN_OP_CALL:
  case KILN_OP_CUSTOM_CALL:
  case KILN_OP_BITCAST:
  case KILN_OP_OPTIMIZATION_BARRIER:
  case KILN_OP_DOMAIN:
  /* A dot's GEMM needs its batch dims major: a transpose in front of one
   * (dot_canon puts them only where the bytes must move) stays a copy. */
  case KILN_OP_DOT: return false;
  default:
    return !(kiln_opcode_flags(u->op) &
             (KILN_OPF_COLLECTIVE | KILN_OPF_ASYNC | KILN_OPF_SIDE_EFFECT));
  }
}

/* Whether fusion u passes operand x to a dot inside it: the dot of a
 * kOutput fusion is a GEMM that needs its batch dims major, like a dot at
 * the top level, so a transpose rule 1 could not fold stays a copy instead
 * of handing the fused dot a strided layout (which made attention's
 * batched q.k^T a loop kernel). */
static bool feeds_fused_dot(const kiln_module *m, const kiln_instr *u, kiln_id x) {
  if (u->op != KILN_OP_FUSION || u->ncalled != 1 || u->called[0] >= m->ncomps) return false;
  const kiln_computation *fc = m->comps[u->called[0]];
  for (uint32_t j = 0; j < fc->ninstrs; j++) {
    const kiln_instr *d = m->instrs[fc->instrs[j]];
    if (d->op != KILN_OP_DOT) continue;
    for (uint32_t s = 0; s < d->noperands; s++) {
      const kiln_instr *p = m->instrs[d->operands[s]];
      if (p->op == KILN_OP_PARAMETER && p->param_number >= 0 && p->param_number < u->noperands &&
          u->operands[p->param_number] == x)
        return true;
    }
  }
  return false;
}

static int to_bitcast(kiln_module *m, kiln_instr *x) {
  x->op = KILN_OP_BITCAST;
  uint32_t n = 0;
  for (uint32_t i = 0; i < x->nattrs; i++)
    if (x->attrs[i].key != KILN_ATTR_DIMENSIONS) x->attrs[n++] = x->attrs[i];
  x->nattrs = n;
  (void)m;
  return 0;
}

/* Rule 4 for transpose and reshape x (layouts of its operand final). */
static int maybe_bitcast(lctx *l, kiln_instr *x, uint32_t comp, bool written) {
  kiln_module *m = l->m;
  const kiln_instr *o = m->instrs[x->operands[0]];
  if (x->id == m->comps[comp]->root || x->id >= l->nids || x->ncontrol ||
      kiln_shape_is_dynamic(&x->shape) || !kiln_shape_is_array(&o->shape) ||
      kiln_shape_is_dynamic(&o->shape) || o->shape.dtype != x->shape.dtype)
    return 0;
  if (x->op == KILN_OP_RESHAPE) {
    if (kiln_shape_is_row_major(&o->shape) && kiln_shape_is_row_major(&x->shape))
      return to_bitcast(m, x);
    return 0;
  }
  uint32_t nu, r = x->shape.rank;
  const kiln_id *us = kiln_users_of(l->users, x->id, &nu);
  for (uint32_t i = 0; i < nu; i++)
    if (!reads_any_layout(m->instrs[us[i]]) || feeds_fused_dot(m, m->instrs[us[i]], x->id))
      return 0;
  const kiln_i64s *perm = kiln_instr_attr_ints(x, KILN_ATTR_DIMENSIONS);
  if (perm == NULL || perm->n != r || r > 64 || o->shape.rank != r) return 0;
  /* Output dim j is operand dim perm[j]: same bytes when the output's
   * minor-to-major lists, position by position, the output dims whose
   * operand dims the operand lists. */
  int64_t inv[64], om2m[64], m2m[64];
  for (uint32_t j = 0; j < r; j++) {
    if (perm->v[j] < 0 || perm->v[j] >= r) return 0;
    inv[perm->v[j]] = j;
  }
  kiln_shape_minor_to_major(&o->shape, om2m);
  for (uint32_t i = 0; i < r; i++) m2m[i] = inv[om2m[i]];
  if (written) {
    /* A written layout is kept: a bitcast only when it already matches. */
    if (memcmp(x->shape.layout->minor_to_major, m2m, r * sizeof *m2m)) return 0;
  } else if (set_m2m(m, &x->shape, m2m)) {
    return oom(l);
  }
  return to_bitcast(m, x);
}

static int assign_comp(lctx *l, uint32_t comp, const kiln_instr *fusion);

/* Removes tuples, get-tuple-elements and copies nothing reads any more (a
 * tuple rebuilt with converted elements leaves the old one behind). */
static int drop_dead_moves(lctx *l, uint32_t comp) {
  kiln_module *m = l->m;
  kiln_computation *c = m->comps[comp];
  uint32_t *uses = kiln_calloc(m->ninstrs, sizeof *uses);
  bool *keep = kiln_calloc(m->ninstrs, sizeof *keep);
  if (uses == NULL || keep == NULL) {
    kiln_free(uses);
    kiln_free(keep);
    return oom(l);
  }
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *u = m->instrs[c->instrs[i]];
    keep[u->id] = true;
    for (uint32_t k = 0; k < u->noperands; k++) uses[u->operands[k]]++;
    for (uint32_t k = 0; k < u->ncontrol; k++) uses[u->control_preds[k]]++;
  }
  bool any = false;
  for (uint32_t i = c->ninstrs; i-- > 0;) {
    const kiln_instr *x = m->instrs[c->instrs[i]];
    bool move =
        x->op == KILN_OP_TUPLE || x->op == KILN_OP_GET_TUPLE_ELEMENT || x->op == KILN_OP_COPY;
    if (!move || uses[x->id] || x->id == c->root || x->ncontrol) continue;
    keep[x->id] = false;
    any = true;
    for (uint32_t k = 0; k < x->noperands; k++) uses[x->operands[k]]--;
  }
  if (any) kiln_computation_compact(m, comp, keep);
  kiln_free(uses);
  kiln_free(keep);
  return 0;
}

/* Shapes of called computation `callee`'s parameter n, or NULL. */
static const kiln_shape *param_shape(const lctx *l, uint32_t callee, int64_t n) {
  if (callee >= l->m->ncomps) return NULL;
  const kiln_instr *p = kiln_computation_param(l->m, l->m->comps[callee], n);
  return p ? &p->shape : NULL;
}

static int coerce_operand(lctx *l, uint32_t comp, kiln_instr *x, uint32_t k, const kiln_shape *w) {
  if (w == NULL || k >= x->noperands) return 0;
  kiln_id v;
  int rc = coerce(l, comp, x->operands[k], w, 0, &v);
  x->operands[k] = v;
  return rc;
}

/* A user kernel (codegen/user_kernel.h) reads and writes dense row-major
 * buffers: operands of another layout are copied, the result is row-major. */
static int row_major_call(lctx *l, uint32_t comp, kiln_instr *x) {
  kiln_module *m = l->m;
  for (uint32_t k = 0; k < x->noperands; k++) {
    kiln_shape w = m->instrs[x->operands[k]]->shape;
    if (!kiln_shape_is_array(&w) || kiln_shape_is_row_major(&w)) continue;
    w.layout = NULL;
    int rc = fill_default(m, &w, 0) ? oom(l) : coerce_operand(l, comp, x, k, &w);
    if (rc) return rc;
  }
  kiln_shape r = x->shape;
  kiln_shape *leaves = kiln_shape_is_tuple(&r) ? r.tuple : &r;
  uint32_t n = kiln_shape_is_tuple(&r) ? r.rank : 1;
  if (kiln_shape_is_tuple(&r) &&
      (r.tuple = kiln_arena_memdup(l->a, leaves, (n ? n : 1) * sizeof *leaves)) == NULL)
    return oom(l);
  for (uint32_t i = 0; i < n; i++) (kiln_shape_is_tuple(&r) ? &r.tuple[i] : &r)->layout = NULL;
  if (kiln_instr_set_shape(m, x, &r)) return oom(l);
  return fill_default(m, &x->shape, 0) ? oom(l) : 0;
}

/* Rule 2b: a GEMM's result written without a layout takes the one its
 * readers were written with (elementwise users at the top level, and those
 * of the fused parameter it binds inside a fusion), when all of them that
 * carry one agree and the GEMM can write it (batch dims major, in order:
 * its two matrix dims in either order, C^T = B^T A^T for the transposed
 * one). Otherwise it is row-major, and a reader written with the other
 * order (a transpose the simplifier folded into the dot) walks the GEMM's
 * output with a stride: per-example gradients' [256,64,32] outer products
 * read so ran their reductions 8x slower than contiguously. */
static void note_reader(const kiln_shape *s, const kiln_shape *r, const int64_t **want,
                        bool *clash) {
  if (!has_layout(r) || !kiln_shape_same_dims(r, s)) return;
  if (*want == NULL)
    *want = r->layout->minor_to_major;
  else if (memcmp(*want, r->layout->minor_to_major, s->rank * sizeof **want))
    *clash = true;
}

static int dot_layout(lctx *l, kiln_instr *x) {
  kiln_module *m = l->m;
  const kiln_shape *s = &x->shape;
  if (x->id >= l->nids || !kiln_shape_is_array(s) || kiln_shape_is_dynamic(s) ||
      (s->dtype != KILN_F32 && s->dtype != KILN_F64) || s->rank < 2)
    return 0;
  const kiln_i64s *lb = kiln_instr_attr_ints(x, KILN_ATTR_LHS_BATCH_DIMS);
  uint32_t nb = lb ? lb->n : 0, nu;
  if (nb + 2 != s->rank) return 0; /* one matrix dim or none: one order only */
  const int64_t *want = NULL;
  bool clash = false;
  const kiln_id *us = kiln_users_of(l->users, x->id, &nu);
  for (uint32_t i = 0; i < nu; i++) {
    const kiln_instr *u = m->instrs[us[i]];
    if (u->op != KILN_OP_FUSION) {
      if (kiln_opcode_flags(u->op) & KILN_OPF_ELEMENTWISE) note_reader(s, &u->shape, &want, &clash);
      continue;
    }
    if (u->ncalled != 1 || u->called[0] >= m->ncomps) continue;
    for (uint32_t k = 0; k < u->noperands; k++) {
      const kiln_instr *p =
          u->operands[k] == x->id ? kiln_computation_param(m, m->comps[u->called[0]], k) : NULL;
      if (p == NULL || p->id >= l->nids) continue;
      if (has_layout(&p->shape)) { /* the fusion reads it so */
        note_reader(s, &p->shape, &want, &clash);
        continue;
      }
      uint32_t np;
      const kiln_id *ps = kiln_users_of(l->users, p->id, &np);
      for (uint32_t j = 0; j < np; j++)
        if (kiln_opcode_flags(m->instrs[ps[j]]->op) & KILN_OPF_ELEMENTWISE)
          note_reader(s, &m->instrs[ps[j]]->shape, &want, &clash);
    }
  }
  if (want == NULL || clash) return 0;
  for (uint32_t i = 0; i < nb; i++)
    if (want[s->rank - 1 - i] != (int64_t)i) return 0;
  return set_m2m(m, &x->shape, want) ? oom(l) : 0;
}

static int assign_instr(lctx *l, uint32_t comp, kiln_instr *x, const kiln_instr *fusion) {
  kiln_module *m = l->m;
  kiln_computation *c = m->comps[comp];
  int rc = 0;
  switch (x->op) {
  case KILN_OP_PARAMETER:
    if (c->is_entry && m->entry_layout && x->param_number >= 0 &&
        x->param_number < m->entry_layout->nparams &&
        kiln_shape_equal(&x->shape, &m->entry_layout->params[x->param_number], false))
      return kiln_instr_set_shape(m, x, &m->entry_layout->params[x->param_number]) ? oom(l) : 0;
    if (fusion && x->param_number >= 0 && x->param_number < fusion->noperands)
      return fill_from(m, &x->shape, &m->instrs[fusion->operands[x->param_number]]->shape, 0)
                 ? oom(l)
                 : 0;
    break;
  case KILN_OP_TUPLE: {
    kiln_shape *ss = kiln_arena_alloc(l->a, (x->noperands ? x->noperands : 1) * sizeof *ss);
    kiln_shape ts;
    if (ss == NULL) return oom(l);
    for (uint32_t k = 0; k < x->noperands; k++) ss[k] = m->instrs[x->operands[k]]->shape;
    if (kiln_shape_make_tuple(m->arena, &ts, ss, x->noperands)) return oom(l);
    x->shape = ts;
    return 0;
  }
  case KILN_OP_GET_TUPLE_ELEMENT: {
    const kiln_shape *t = &m->instrs[x->operands[0]]->shape;
    int64_t i = kiln_instr_attr_int(x, KILN_ATTR_INDEX, -1);
    if (kiln_shape_is_tuple(t) && i >= 0 && i < t->rank)
      return kiln_instr_set_shape(m, x, &t->tuple[i]) ? oom(l) : 0;
    break;
  }
  case KILN_OP_WHILE:
    if (x->ncalled == 2 && (rc = coerce_operand(l, comp, x, 0, param_shape(l, x->called[1], 0))))
      return rc;
    if (x->ncalled == 2 && param_shape(l, x->called[1], 0))
      return kiln_instr_set_shape(m, x, param_shape(l, x->called[1], 0)) ? oom(l) : 0;
    break;
  case KILN_OP_CONDITIONAL:
    for (uint32_t k = 0; k < x->ncalled && rc == 0; k++)
      rc = coerce_operand(l, comp, x, k + 1, param_shape(l, x->called[k], 0));
    if (rc) return rc;
    break; /* the result keeps its own layout; branch roots are made to match */
  case KILN_OP_CALL:
    for (uint32_t k = 0; k < x->noperands && rc == 0; k++)
      rc = coerce_operand(l, comp, x, k, x->ncalled ? param_shape(l, x->called[0], k) : NULL);
    if (rc) return rc;
    if (x->ncalled == 1 && x->called[0] < m->ncomps) {
      const kiln_instr *r = kiln_computation_root(m, m->comps[x->called[0]]);
      if (r && kiln_shape_equal(&r->shape, &x->shape, false))
        return kiln_instr_set_shape(m, x, &r->shape) ? oom(l) : 0;
    }
    break;
  case KILN_OP_CUSTOM_CALL:
    if (kiln_user_kernel_call(x, NULL)) return row_major_call(l, comp, x);
    break;
  case KILN_OP_FUSION:
    if ((rc = fill_default(m, &x->shape, 0))) return oom(l);
    if (x->ncalled == 1 && x->called[0] < m->ncomps) {
      uint32_t fc = x->called[0];
      if (!l->done[fc]) {
        l->want_root[fc] = &x->shape;
        if ((rc = assign_comp(l, fc, x))) return rc;
      }
      for (uint32_t k = 0; k < x->noperands && rc == 0; k++)
        rc = coerce_operand(l, comp, x, k, param_shape(l, fc, k));
    }
    return rc;
  default: break;
  }
  bool written = has_layout(&x->shape);
  if (!written && x->op == KILN_OP_DOT && !fusion && (rc = dot_layout(l, x))) return rc;
  if (fill_default(m, &x->shape, 0)) return oom(l);
  if ((x->op == KILN_OP_TRANSPOSE || x->op == KILN_OP_RESHAPE) && !fusion && x->noperands == 1)
    return maybe_bitcast(l, x, comp, written);
  return 0;
}

/* Assigns layouts in computation comp (fusion: the instruction calling it,
 * when it is a fused computation), then makes its root match what its
 * callers need. */
static int assign_comp(lctx *l, uint32_t comp, const kiln_instr *fusion) {
  kiln_module *m = l->m;
  kiln_computation *c = m->comps[comp];
  l->done[comp] = true;
  uint32_t n = c->ninstrs;
  kiln_id *order = kiln_arena_memdup(l->a, c->instrs, (n ? n : 1) * sizeof *order);
  if (order == NULL) return oom(l);
  int rc;
  kiln_instr *root = kiln_computation_root(m, c);
  const kiln_shape *want = l->want_root[comp];
  kiln_shape entry_result;
  if (c->is_entry && root) {
    /* The entry result: the given layout, else the root's written layout
     * with row-major where none is written (taken before any rewrite). */
    if (m->entry_layout && kiln_shape_equal(&m->entry_layout->result, &root->shape, false)) {
      want = &m->entry_layout->result;
    } else {
      if (kiln_shape_copy(l->a, &entry_result, &root->shape) || fill_default(m, &entry_result, 0))
        return oom(l);
      want = &entry_result;
    }
  }
  for (uint32_t i = 0; i < n; i++)
    if ((rc = assign_instr(l, comp, m->instrs[order[i]], fusion))) return rc;
  root = kiln_computation_root(m, c);
  if (root && want) {
    kiln_id v;
    if ((rc = coerce(l, comp, root->id, want, 0, &v))) return rc;
    c->root = v;
  }
  if ((rc = kiln_computation_sort(m, comp, l->st))) return rc;
  return drop_dead_moves(l, comp);
}

/* Fixes, before any computation is visited, what callers and callees must
 * agree on: a while body's parameter (and so its condition's parameter and
 * its root) and a conditional's result (its branches' roots). */
static int boundaries(lctx *l) {
  kiln_module *m = l->m;
  for (uint32_t ci = 0; ci < m->ncomps; ci++) {
    const kiln_computation *c = m->comps[ci];
    for (uint32_t i = 0; i < c->ninstrs; i++) {
      kiln_instr *x = m->instrs[c->instrs[i]];
      if (x->op == KILN_OP_FUSION && x->ncalled == 1 && x->called[0] < m->ncomps) {
        l->fused[x->called[0]] = true;
      } else if (x->op == KILN_OP_WHILE && x->ncalled == 2 && x->called[0] < m->ncomps &&
                 x->called[1] < m->ncomps) {
        kiln_instr *bp = kiln_computation_param(m, m->comps[x->called[1]], 0);
        kiln_instr *cp = kiln_computation_param(m, m->comps[x->called[0]], 0);
        if (bp == NULL || fill_default(m, &bp->shape, 0)) {
          if (bp) return oom(l);
          continue;
        }
        if (cp && kiln_shape_equal(&cp->shape, &bp->shape, false) &&
            kiln_instr_set_shape(m, cp, &bp->shape))
          return oom(l);
        l->want_root[x->called[1]] = &bp->shape;
      } else if (x->op == KILN_OP_CONDITIONAL) {
        if (fill_default(m, &x->shape, 0)) return oom(l);
        for (uint32_t k = 0; k < x->ncalled; k++)
          if (x->called[k] < m->ncomps) l->want_root[x->called[k]] = &x->shape;
      }
    }
  }
  return 0;
}

/* Records the bound layouts in the module header. */
static int record_entry_layout(lctx *l) {
  kiln_module *m = l->m;
  kiln_computation *e = kiln_module_entry(m);
  const kiln_instr *root = e ? kiln_computation_root(m, e) : NULL;
  if (root == NULL) return 0;
  uint32_t np = kiln_computation_nparams(m, e);
  kiln_program_shape *ps = kiln_arena_calloc(m->arena, 1, sizeof *ps);
  if (ps == NULL ||
      (np && (ps->params = kiln_arena_calloc(m->arena, np, sizeof *ps->params)) == NULL))
    return oom(l);
  for (uint32_t i = 0; i < np; i++) {
    const kiln_instr *p = kiln_computation_param(m, e, i);
    if (p == NULL) return 0; /* a hole: leave the header alone */
    if (kiln_shape_copy(m->arena, &ps->params[i], &p->shape)) return oom(l);
  }
  ps->nparams = np;
  if (kiln_shape_copy(m->arena, &ps->result, &root->shape)) return oom(l);
  m->entry_layout = ps;
  return 0;
}

int kiln_pass_layout(kiln_module *m, const kiln_pass_ctx *ctx) {
  lctx l = {0};
  l.m = m;
  l.st = ctx->st;
  uint32_t *order = NULL, norder = 0;
  int rc = 0;
  l.a = kiln_arena_create();
  if (l.a == NULL || kiln_users_build(m, &l.users) || kiln_module_post_order(m, &order, &norder)) {
    rc = oom(&l);
    goto out_free;
  }
  l.nids = m->ninstrs;
  l.want_root = kiln_arena_calloc(l.a, m->ncomps ? m->ncomps : 1, sizeof *l.want_root);
  l.fused = kiln_arena_calloc(l.a, m->ncomps ? m->ncomps : 1, sizeof *l.fused);
  l.done = kiln_arena_calloc(l.a, m->ncomps ? m->ncomps : 1, sizeof *l.done);
  if (l.want_root == NULL || l.fused == NULL || l.done == NULL) {
    rc = oom(&l);
    goto out_free;
  }
  if ((rc = boundaries(&l))) goto out_free;
  for (uint32_t i = 0; i < norder && rc == 0; i++) {
    uint32_t c = order[i];
    if (!l.fused[c]) rc = fold_transposes(&l, c);
  }
  for (uint32_t i = 0; i < norder && rc == 0; i++) {
    uint32_t c = order[i];
    if (!l.fused[c] && !l.done[c]) rc = assign_comp(&l, c, NULL);
  }
  /* Fused computations no program reaches still get layouts. */
  for (uint32_t c = 0; c < m->ncomps && rc == 0; c++)
    if (!l.done[c] && l.fused[c]) rc = assign_comp(&l, c, NULL);
  if (rc == 0) rc = record_entry_layout(&l);
out_free:
  kiln_free(order);
  kiln_users_destroy(l.users);
  kiln_arena_destroy(l.a);
  return rc;
}
