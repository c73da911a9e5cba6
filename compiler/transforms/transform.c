/* The transforms as whole-program rewrites: each builds a new ENTRY from
 * the old one with the signature transform.h documents, makes it the entry
 * and lets DCE drop what the rules built but nobody uses. Ops without rules
 * of their own are first lowered into ops that have them (lower.c). The old entry
 * stays in the module as an ordinary computation (a checkpoint calls it;
 * otherwise it is unreferenced).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/arena.h"
#include "compiler/pass.h"
#include "compiler/transforms/rules.h"
#include "compiler/transforms/transform.h"

int kiln__tf_apply_vmap(kiln__tx *tx, const kiln_transform *t, uint32_t *out);
int kiln__tf_apply_autocast(kiln__tx *tx, const kiln_transform *t, uint32_t *out);

typedef struct entry_info {
  const kiln_computation *comp;
  uint32_t nparams;
  const kiln_shape **pshape;
  const char **pname;
  const kiln_instr *root;
} entry_info;

static int entry_of(kiln__tx *tx, entry_info *e) {
  const kiln_module *m = tx->m;
  e->comp = kiln_module_entry(m);
  if (e->comp == NULL)
    return kiln__tx_fail(tx, KILN_EINVAL, NULL, "%s: the module has no ENTRY computation",
                         tx->name);
  e->root = kiln_computation_root(m, e->comp);
  if (e->root == NULL)
    return kiln__tx_fail(tx, KILN_EINVAL, NULL, "%s: ENTRY %s has no root", tx->name,
                         e->comp->name);
  e->nparams = kiln_computation_nparams(m, e->comp);
  e->pshape = kiln_arena_calloc(tx->scratch, e->nparams + 1, sizeof *e->pshape);
  e->pname = kiln_arena_calloc(tx->scratch, e->nparams + 1, sizeof *e->pname);
  if (e->pshape == NULL || e->pname == NULL) return kiln__tx_oom(tx);
  for (uint32_t i = 0; i < e->nparams; i++) {
    const kiln_instr *p = kiln_computation_param(m, e->comp, i);
    if (p == NULL)
      return kiln__tx_fail(tx, KILN_EINVAL, NULL, "%s: ENTRY %s has no parameter %u", tx->name,
                           e->comp->name, i);
    e->pshape[i] = &p->shape;
    e->pname[i] = p->name;
  }
  return 0;
}

static int new_entry(kiln__tx *tx, const entry_info *e, uint32_t *out) {
  char name[160];
  snprintf(name, sizeof name, "%.120s.%s", e->comp->name, tx->name);
  return kiln__b_new_comp(tx, name, out);
}

/* Appends the leaves of v (shape s) depth-first. */
static void leaves(kiln__b *b, kiln_id v, const kiln_shape *s, kiln_id *out, uint32_t *n) {
  if (!kiln_shape_is_tuple(s)) {
    out[(*n)++] = v;
    return;
  }
  for (uint32_t i = 0; i < s->rank; i++) leaves(b, kiln__b_gte(b, v, i), &s->tuple[i], out, n);
}

/* A value of shape s whose leaves are vals[*k...] (KILN_NO_ID: zeros). */
static kiln_id from_leaves(kiln__b *b, const kiln_shape *s, const kiln_id *vals, uint32_t *k) {
  if (!kiln_shape_is_tuple(s)) {
    kiln_id v = vals[(*k)++];
    return v == KILN_NO_ID ? kiln__b_zeros(b, s) : v;
  }
  kiln_id *el = kiln__b_ids(b->tx, s->rank);
  if (el == NULL) return KILN_NO_ID;
  for (uint32_t i = 0; i < s->rank; i++) el[i] = from_leaves(b, &s->tuple[i], vals, k);
  return kiln__b_tuple(b, el, s->rank);
}

static const kiln_shape *leaf_shape_at(const kiln_shape *s, uint32_t want, uint32_t *k) {
  if (!kiln_shape_is_tuple(s)) return (*k)++ == want ? s : NULL;
  for (uint32_t i = 0; i < s->rank; i++) {
    const kiln_shape *r = leaf_shape_at(&s->tuple[i], want, k);
    if (r) return r;
  }
  return NULL;
}

/* The wrt list: given, or the default (all parameters, or just 0). */
static int wrt_list(kiln__tx *tx, const kiln_transform *t, const entry_info *e, bool all,
                    int64_t **wrt, uint32_t *n) {
  if (t->nwrt) {
    *wrt = (int64_t *)t->wrt;
    *n = t->nwrt;
  } else {
    *n = all ? e->nparams : (e->nparams ? 1 : 0);
    *wrt = kiln__b_i64s(tx, *n);
    if (*wrt == NULL) return tx->err;
    for (uint32_t i = 0; i < *n; i++) (*wrt)[i] = i;
  }
  for (uint32_t i = 0; i < *n; i++)
    if ((*wrt)[i] < 0 || (*wrt)[i] >= (int64_t)e->nparams)
      return kiln__tx_fail(tx, KILN_EINVAL, NULL,
                           "%s: wrt parameter %" PRId64 " does not exist (ENTRY %s takes %u "
                           "parameter%s)",
                           tx->name, (*wrt)[i], e->comp->name, e->nparams,
                           e->nparams == 1 ? "" : "s");
  return 0;
}

static int apply_jvp(kiln__tx *tx, const kiln_transform *t, uint32_t *out) {
  entry_info e;
  int64_t *wrt;
  uint32_t nw, comp;
  if (entry_of(tx, &e) || wrt_list(tx, t, &e, true, &wrt, &nw) || new_entry(tx, &e, &comp))
    return tx->err;
  kiln__b b = {tx, comp};
  kiln_id *prims = kiln__b_ids(tx, e.nparams), *tans = kiln__b_ids(tx, e.nparams);
  if (prims == NULL || tans == NULL) return tx->err;
  for (uint32_t i = 0; i < e.nparams; i++) {
    prims[i] = kiln__b_param(&b, i, e.pshape[i], e.pname[i]);
    tans[i] = KILN_NO_ID;
  }
  for (uint32_t j = 0; j < nw; j++)
    tans[wrt[j]] = kiln__b_param(&b, e.nparams + j, e.pshape[wrt[j]], "tangent");
  kiln__ad c;
  if (kiln__ad_init(&c, tx, comp, e.comp) || kiln__jvp_region(&c, prims, tans)) return tx->err;
  const kiln_shape *rs = &e.root->shape;
  uint32_t nl = kiln__b_leaf_count(rs), n = 0;
  kiln_id *outs = kiln__b_ids(tx, 2 * nl);
  if (outs == NULL) return tx->err;
  leaves(&b, c.prim[kiln__ad_slot(&c, e.root->id)], rs, outs, &n);
  leaves(&b, kiln__ad_mat(&b, c.tan[kiln__ad_slot(&c, e.root->id)], rs), rs, outs, &n);
  kiln_id root = kiln__b_tuple(&b, outs, n);
  if (tx->err) return tx->err;
  tx->m->comps[comp]->root = root;
  *out = comp;
  return 0;
}

static int64_t shape_bytes(const kiln_shape *s) {
  if (!kiln_shape_is_tuple(s)) return kiln_shape_bytes(s) > 0 ? kiln_shape_bytes(s) : 0;
  int64_t n = 0;
  for (uint32_t i = 0; i < s->rank; i++) n += shape_bytes(&s->tuple[i]);
  return n;
}

/* Forward values of comp (ids in [lo, mid)) used by backward ones (ids at
 * or past mid, the root excepted). */
static void count_saved(const kiln_module *m, uint32_t comp, kiln_id lo, kiln_id mid,
                        kiln_transform_stats *stats) {
  const kiln_computation *c = m->comps[comp];
  uint8_t *seen = kiln_calloc(m->ninstrs + 1, 1);
  if (seen == NULL) return;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *u = m->instrs[c->instrs[i]];
    if (u->id < mid || u->id == c->root) continue;
    for (uint32_t k = 0; k < u->noperands; k++) {
      const kiln_instr *d = m->instrs[u->operands[k]];
      if (d->id < lo || d->id >= mid || seen[d->id] || d->op == KILN_OP_PARAMETER ||
          d->op == KILN_OP_CONSTANT || d->op == KILN_OP_GET_TUPLE_ELEMENT ||
          (d->op == KILN_OP_BROADCAST && m->instrs[d->operands[0]]->op == KILN_OP_CONSTANT))
        continue;
      seen[d->id] = 1;
      stats->saved_values++;
      stats->saved_bytes += shape_bytes(&d->shape);
    }
  }
  kiln_free(seen);
}

typedef struct vjp_marks {
  kiln_id lo, mid;
} vjp_marks;

/* Dynamic loss scaling of a grad (transform.h): the gradients g[0..n)
 * were computed from the seed `scale`; they become g / scale, or zeros
 * when any is not finite, and outs gets (new_scale, new_good) after them. */
static void loss_scale_finish(kiln__b *b, kiln_id scale, kiln_id good, int64_t interval, kiln_id *g,
                              uint32_t n, kiln_id *outs, uint32_t *nouts) {
  kiln__tx *tx = b->tx;
  kiln_id inv = kiln__b_div(b, kiln__b_scalar(b, KILN_F32, 1), scale);
  kiln_id finite = kiln__b_iscalar(b, KILN_PRED, 1);
  for (uint32_t j = 0; j < n && tx->err == 0; j++) {
    const kiln_shape *s = kiln__b_shape(tx, g[j]);
    g[j] = kiln__b_mul(b, g[j], kiln__b_splat(b, kiln__b_convert(b, inv, s->dtype), s));
    int64_t *dims = kiln__b_i64s(tx, s->rank + 1);
    if (dims == NULL) return;
    for (uint32_t d = 0; d < s->rank; d++) dims[d] = d;
    kiln_id fin = kiln__b_un(b, KILN_OP_IS_FINITE, g[j]);
    fin = kiln__b_reduce(b, fin, kiln__b_iscalar(b, KILN_PRED, 1), dims, s->rank, KILN_OP_AND);
    finite = kiln__b_bin(b, KILN_OP_AND, finite, fin);
  }
  for (uint32_t j = 0; j < n && tx->err == 0; j++) {
    const kiln_shape *s = kiln__b_shape(tx, g[j]);
    kiln_id keep = kiln__b_broadcast_like(b, finite, g[j]);
    outs[(*nouts)++] = kiln__b_select(b, keep, g[j], kiln__b_zeros(b, s));
  }
  kiln_id good1 = kiln__b_add(b, good, kiln__b_iscalar(b, KILN_S32, 1));
  kiln_id grow = kiln__b_cmp(b, good1, kiln__b_iscalar(b, KILN_S32, interval), KILN_CMP_GE);
  kiln_id up =
      kiln__b_select(b, grow, kiln__b_mul(b, scale, kiln__b_scalar(b, KILN_F32, 2)), scale);
  kiln_id down = kiln__b_mul(b, scale, kiln__b_scalar(b, KILN_F32, 0.5));
  outs[(*nouts)++] = kiln__b_select(b, finite, up, down);
  kiln_id zero = kiln__b_iscalar(b, KILN_S32, 0);
  outs[(*nouts)++] = kiln__b_select(b, finite, kiln__b_select(b, grow, zero, good1), zero);
}

static int apply_vjp(kiln__tx *tx, const kiln_transform *t, bool grad, const kiln_transform *ls,
                     uint32_t *out, vjp_marks *mk) {
  entry_info e;
  int64_t *wrt;
  uint32_t nw, comp;
  if (entry_of(tx, &e) || wrt_list(tx, t, &e, !grad, &wrt, &nw)) return tx->err;
  const kiln_shape *rs = &e.root->shape;
  uint32_t nl = kiln__b_leaf_count(rs), k = 0;
  int64_t chosen = t->output >= 0 ? t->output : grad ? 0 : -1;
  if (chosen >= (int64_t)nl)
    return kiln__tx_fail(tx, KILN_EINVAL, NULL,
                         "%s: output %" PRId64 " does not exist (ENTRY %s has %u output%s)",
                         tx->name, chosen, e.comp->name, nl, nl == 1 ? "" : "s");
  if (grad) {
    const kiln_shape *os = leaf_shape_at(rs, (uint32_t)chosen, &k);
    if (!kiln_shape_is_array(os) || !kiln_dtype_is_float(os->dtype) || os->rank != 0) {
      char buf[128];
      kiln_sbuf sb = KILN_SBUF_INIT;
      kiln_shape_print_short(&sb, os);
      snprintf(buf, sizeof buf, "%s", kiln_sbuf_str(&sb));
      kiln_sbuf_free(&sb);
      return kiln__tx_fail(tx, KILN_EINVAL, NULL,
                           "grad: output %" PRId64 " is %s; grad needs a floating-point scalar "
                           "output (vjp takes a cotangent for any output)",
                           chosen, buf);
    }
    for (uint32_t j = 0; j < nw; j++)
      if (!kiln__b_has_float(e.pshape[wrt[j]]) || (ls && !kiln_shape_is_array(e.pshape[wrt[j]]))) {
        kiln_sbuf sb = KILN_SBUF_INIT;
        kiln_shape_print_short(&sb, e.pshape[wrt[j]]);
        kiln__tx_fail(tx, KILN_EINVAL, NULL,
                      "grad: parameter %" PRId64 " is %s; gradients need floating-point "
                      "parameters%s",
                      wrt[j], kiln_sbuf_str(&sb),
                      ls ? " (arrays, not tuples, under dynamic loss scaling)" : "");
        kiln_sbuf_free(&sb);
        return tx->err;
      }
  }
  if (new_entry(tx, &e, &comp)) return tx->err;
  kiln__b b = {tx, comp};
  mk->lo = tx->m->ninstrs;
  kiln_id *prims = kiln__b_ids(tx, e.nparams);
  uint8_t *act = kiln_arena_calloc(tx->scratch, e.nparams + 1, 1);
  kiln_id *outs = kiln__b_ids(tx, nl + nw + 2), *cts = kiln__b_ids(tx, nl);
  kiln_id *gs = kiln__b_ids(tx, nw + 1);
  if (prims == NULL || act == NULL || outs == NULL || cts == NULL || gs == NULL)
    return kiln__tx_oom(tx);
  for (uint32_t i = 0; i < e.nparams; i++) prims[i] = kiln__b_param(&b, i, e.pshape[i], e.pname[i]);
  for (uint32_t j = 0; j < nw; j++) act[wrt[j]] = 1;
  kiln__ad c;
  if (kiln__ad_init(&c, tx, comp, e.comp) || kiln__vjp_forward(&c, prims, act)) return tx->err;
  uint32_t n = 0;
  leaves(&b, c.prim[kiln__ad_slot(&c, e.root->id)], rs, outs, &n);
  if (grad) {
    outs[0] = outs[chosen];
    n = 1;
  }
  /* cotangent parameters, one per chosen output */
  uint32_t np = e.nparams;
  kiln_id scale = KILN_NO_ID, good = KILN_NO_ID;
  if (grad && ls) {
    kiln_shape f32s = {.dtype = KILN_F32}, s32s = {.dtype = KILN_S32};
    scale = kiln__b_param(&b, np++, &f32s, "loss_scale");
    good = kiln__b_param(&b, np++, &s32s, "good_steps");
  }
  for (uint32_t j = 0; j < nl; j++) {
    cts[j] = KILN_NO_ID;
    if (chosen >= 0 && j != chosen) continue;
    k = 0;
    const kiln_shape *os = leaf_shape_at(rs, j, &k);
    cts[j] = !grad ? kiln__b_param(&b, np++, os, "cotangent")
             : ls  ? kiln__b_convert(&b, scale, os->dtype)
                   : kiln__b_scalar(&b, os->dtype, 1);
  }
  k = 0;
  kiln_id ct_root = from_leaves(&b, rs, cts, &k);
  mk->mid = tx->m->ninstrs;
  if (kiln__vjp_backward(&c, ct_root)) return tx->err;
  for (uint32_t j = 0; j < nw; j++) {
    const kiln_instr *p = kiln_computation_param(tx->m, e.comp, wrt[j]);
    gs[j] = kiln__ad_mat(&b, c.cot[kiln__ad_slot(&c, p->id)], e.pshape[wrt[j]]);
  }
  if (grad && ls)
    loss_scale_finish(&b, scale, good, ls->growth_interval > 0 ? ls->growth_interval : 2000, gs, nw,
                      outs, &n);
  else
    for (uint32_t j = 0; j < nw; j++) outs[n++] = gs[j];
  kiln_id root = kiln__b_tuple(&b, outs, n);
  if (tx->err) return tx->err;
  tx->m->comps[comp]->root = root;
  *out = comp;
  return 0;
}

static int apply_checkpoint(kiln__tx *tx, uint32_t *out) {
  entry_info e;
  uint32_t comp;
  if (entry_of(tx, &e) || new_entry(tx, &e, &comp)) return tx->err;
  kiln__b b = {tx, comp};
  kiln_id *ps = kiln__b_ids(tx, e.nparams);
  if (ps == NULL) return tx->err;
  for (uint32_t i = 0; i < e.nparams; i++) ps[i] = kiln__b_param(&b, i, e.pshape[i], e.pname[i]);
  kiln_id call = kiln__b_call(&b, e.comp->id, ps, e.nparams);
  if (call == KILN_NO_ID) return tx->err;
  if (kiln_instr_set_attr_str(tx->m, kiln__b_ins(tx, call), KILN_ATTR_FRONTEND_ATTRIBUTES,
                              KILN__CHECKPOINT_ATTR))
    return kiln__tx_oom(tx);
  tx->m->comps[comp]->root = call;
  *out = comp;
  return 0;
}

/* ls: the autocast whose dynamic loss scaling a grad takes (NULL: none). */
static int apply_one(kiln_module *m, const kiln_transform *t, const kiln_transform *ls,
                     kiln_transform_stats *stats, kiln_status *st) {
  kiln__tx tx;
  if (kiln__tx_init(&tx, m, kiln_transform_kind_name(t->kind), st)) return KILN_ENOMEM;
  uint32_t comp = KILN_NO_ID, old = m->entry, low = old;
  vjp_marks mk = {0, 0};
  /* the transform reads the lowered ENTRY (lower.c); on failure the old
   * one is the entry again */
  if (kiln__tf_lower(&tx, &low) == 0 && low != old) {
    m->comps[old]->is_entry = false;
    m->comps[low]->is_entry = true;
    m->entry = low;
  }
  if (tx.err == 0) switch (t->kind) {
    case KILN_TRANSFORM_JVP: apply_jvp(&tx, t, &comp); break;
    case KILN_TRANSFORM_VJP: apply_vjp(&tx, t, false, NULL, &comp, &mk); break;
    case KILN_TRANSFORM_GRAD: apply_vjp(&tx, t, true, ls, &comp, &mk); break;
    case KILN_TRANSFORM_VMAP: kiln__tf_apply_vmap(&tx, t, &comp); break;
    case KILN_TRANSFORM_CHECKPOINT: apply_checkpoint(&tx, &comp); break;
    case KILN_TRANSFORM_AUTOCAST: kiln__tf_apply_autocast(&tx, t, &comp); break;
    default: kiln__tx_fail(&tx, KILN_EINVAL, NULL, "unknown transform kind %d", (int)t->kind);
    }
  int rc = tx.err;
  if (rc && low != old) {
    m->comps[low]->is_entry = false;
    m->comps[old]->is_entry = true;
    m->entry = old;
  }
  if (rc == 0) {
    m->comps[m->entry]->is_entry = false;
    m->comps[comp]->is_entry = true;
    m->entry = comp;
    m->entry_layout = NULL;
    m->is_scheduled = -1; /* the new computations are in operand order, not a schedule */
    m->aliases = NULL;
    m->naliases = 0;
    m->has_aliases = false;
    const kiln_pass *dce = kiln_pipeline_find("dce");
    kiln_pass_ctx ctx = {kiln_target_default(), tx.scratch, st, 2, 0, NULL};
    if (dce) rc = dce->run(m, &ctx);
    if (rc == 0 && stats && (t->kind == KILN_TRANSFORM_VJP || t->kind == KILN_TRANSFORM_GRAD)) {
      memset(stats, 0, sizeof *stats);
      count_saved(m, comp, mk.lo, mk.mid, stats);
    }
  }
  kiln__tx_fini(&tx);
  return rc;
}

int kiln_transforms_apply_stats(kiln_module *m, const kiln_transform *ts, uint32_t n,
                                kiln_transform_stats *stats, kiln_status *st) {
  if (stats) memset(stats, 0, sizeof *stats);
  if (m == NULL || (ts == NULL && n))
    return kiln_status_set(st, KILN_EINVAL, NULL, "kiln_transforms_apply: NULL argument");
  /* an autocast with loss scaling hands it to the next grad of the list */
  const kiln_transform *ls = NULL;
  for (uint32_t i = 0; i < n; i++) {
    bool takes = ts[i].kind == KILN_TRANSFORM_GRAD;
    int rc = apply_one(m, &ts[i], takes ? ls : NULL, stats, st);
    if (rc) return rc;
    if (ts[i].kind == KILN_TRANSFORM_AUTOCAST) ls = ts[i].loss_scale ? &ts[i] : NULL;
    if (takes) ls = NULL;
  }
  return 0;
}

int kiln_transforms_apply(kiln_module *m, const kiln_transform *ts, uint32_t n, kiln_status *st) {
  return kiln_transforms_apply_stats(m, ts, n, NULL, st);
}

int kiln_transforms_infer_sizes(kiln_transform *ts, uint32_t n, const kiln_shape *const *args,
                                uint32_t nargs, kiln_status *st) {
  /* dims[i][k]: which dimension of argument i is dimension k of parameter
   * i of the program seen by the transform being looked at (outermost
   * first: each vmap removes its batch dimension for the ones inside). */
  int64_t(*dims)[KILN_TRANSFORM_MAX_ARGS] = NULL;
  uint32_t *rank = NULL;
  int rc = 0;
  if (nargs) {
    dims = kiln_calloc(nargs, sizeof *dims);
    rank = kiln_calloc(nargs, sizeof *rank);
    if (dims == NULL || rank == NULL) {
      rc = kiln_status_set(st, KILN_ENOMEM, NULL, "vmap: out of memory");
      goto out;
    }
  }
  for (uint32_t i = 0; i < nargs; i++) {
    rank[i] = args[i] && kiln_shape_is_array(args[i]) && args[i]->rank <= KILN_TRANSFORM_MAX_ARGS
                  ? args[i]->rank
                  : 0;
    for (uint32_t k = 0; k < rank[i]; k++) dims[i][k] = k;
  }
  for (uint32_t t = n; t-- > 0;) {
    kiln_transform *v = &ts[t];
    if (v->kind != KILN_TRANSFORM_VMAP) continue;
    int64_t found = -1;
    uint32_t from = 0;
    for (uint32_t i = 0; i < nargs; i++) {
      int64_t ax = v->nin_axes == 0   ? 0
                   : v->nin_axes == 1 ? v->in_axes[0]
                   : i < v->nin_axes  ? v->in_axes[i]
                                      : KILN_AXIS_NONE;
      if (ax == KILN_AXIS_NONE || rank[i] == 0) continue;
      if (ax < 0) ax += rank[i];
      if (ax < 0 || ax >= (int64_t)rank[i]) continue;
      int64_t b = args[i]->dims[dims[i][ax]];
      if (found < 0) {
        found = b;
        from = i;
      } else if (b != found && i < v->nin_axes) {
        rc = kiln_status_set(st, KILN_EINVAL, NULL,
                             "vmap: argument %u has batch size %" PRId64
                             " but argument %u has %" PRId64,
                             i, b, from, found);
        goto out;
      }
      memmove(&dims[i][ax], &dims[i][ax + 1], (rank[i] - ax - 1) * sizeof dims[i][0]);
      rank[i]--;
    }
    if (v->axis_size > 0 && found >= 0 && found != v->axis_size) {
      rc = kiln_status_set(st, KILN_EINVAL, NULL,
                           "vmap: argument %u has batch size %" PRId64
                           " but the transform says size=%" PRId64,
                           from, found, v->axis_size);
      goto out;
    }
    if (v->axis_size <= 0) {
      if (found < 0) {
        rc = kiln_status_set(st, KILN_EINVAL, NULL,
                             "vmap: cannot infer the batch size from the arguments (give size=N)");
        goto out;
      }
      v->axis_size = found;
    }
  }
out:
  kiln_free(dims);
  kiln_free(rank);
  return rc;
}
