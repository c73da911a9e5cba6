/* Sharding propagation: every array instruction of the ENTRY gets a
 * sharding, starting from the user's (sharding= attributes, sharding custom
 * calls, Shardy's attributes), which are never changed.
 *
 * Calls made by the ENTRY are inlined first (JAX wraps jax.nn functions in
 * calls), so that one walk sees the whole program. Then rounds of a forward
 * sweep (an unknown instruction takes a tiling offered by its operands,
 * dims.c's forward rules) and a backward sweep (an unknown operand takes one
 * its users need, the backward rules) until nothing changes. Where several
 * offers conflict, the one that makes the fewest bytes move wins (each
 * operand or user whose tiling it does not cover costs its array's bytes);
 * ties go to the more finely tiled offer. Replicated offers are not taken:
 * they carry no information, and whatever is still unknown at the end is
 * replicated anyway. Tuples carry one tiling per element through tuple,
 * parameter and get-tuple-element; every other tuple-valued op (while,
 * conditional, sort of several operands, ...) is computed replicated by the
 * partitioner, so nothing flows through it.
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/sharding.h"
#include "compiler/spmd/spmd.h"
#include "compiler/spmd/spmd_internal.h"

typedef struct prop {
  kiln_module *m;
  uint32_t comp; /* the computation propagated */
  kiln_arena *a;
  kiln_status *st;
  int64_t n;
  spmd_tiling **t;  /* arrays: t[id], NULL while unknown */
  spmd_tiling ***e; /* tuples: e[id][i] per element, NULL while unknown */
  bool *fixed;      /* user annotation: never changed */
  kiln_users *users;
} prop;

/* ---- inlining ----------------------------------------------------------- */

int kiln__spmd_inline_calls(kiln_module *m, uint32_t entry, kiln_status *st) {
  kiln__tx tx;
  int rc = kiln__tx_init(&tx, m, "spmd", st);
  kiln__b b = {&tx, entry};
  bool any = false;
  for (uint32_t i = 0; rc == 0 && i < m->comps[entry]->ninstrs; i++) {
    kiln_instr *call = m->instrs[m->comps[entry]->instrs[i]];
    if (call->op != KILN_OP_CALL || call->ncalled != 1) continue;
    const kiln_computation *c = m->comps[call->called[0]];
    /* A per-device body (a shard_map region's: explicit collectives) is
     * run as written, not partitioned. */
    bool per_device = false;
    for (uint32_t k = 0; k < c->ninstrs; k++)
      per_device =
          per_device || kiln_opcode_family(m->instrs[c->instrs[k]]->op) == KILN_FAM_COLLECTIVE;
    if (per_device) continue;
    kiln_id *map = kiln_arena_alloc(tx.scratch, (m->ninstrs + 1) * sizeof *map);
    kiln_id ops[256];
    if (map == NULL) {
      rc = kiln__tx_oom(&tx);
      break;
    }
    for (uint32_t k = 0; k < c->ninstrs; k++) {
      const kiln_instr *src = m->instrs[c->instrs[k]];
      if (src->op == KILN_OP_PARAMETER) {
        if (src->param_number < 0 || src->param_number >= call->noperands) {
          rc = kiln__tx_fail(&tx, KILN_EINVAL, call, "call parameter %lld out of range",
                             (long long)src->param_number);
          break;
        }
        map[src->id] = call->operands[src->param_number];
        continue;
      }
      if (src->noperands > 256) {
        rc = kiln__tx_fail(&tx, KILN_EUNIMPL, src, "spmd: too many operands to inline");
        break;
      }
      for (uint32_t o = 0; o < src->noperands; o++) ops[o] = map[src->operands[o]];
      map[src->id] = kiln__b_clone_same(&b, src, ops, src->noperands);
      if (!kiln__tx_ok(&tx)) rc = tx.err;
      /* Cloning may have grown m->instrs: map was sized before. */
      if (map[src->id] >= m->ninstrs + 1) rc = kiln__tx_fail(&tx, KILN_EINTERNAL, src, "map");
    }
    if (rc) break;
    kiln_replace_all_uses(m, entry, call->id, map[c->root]);
    any = true;
  }
  if (rc == 0 && any) {
    bool *keep = kiln_malloc(m->ninstrs * sizeof *keep);
    if (keep == NULL)
      rc = kiln__tx_oom(&tx);
    else {
      for (uint32_t i = 0; i < m->ninstrs; i++)
        keep[i] = !(m->instrs[i]->op == KILN_OP_CALL && m->instrs[i]->comp == entry);
      kiln_computation_compact(m, entry, keep);
      kiln_free(keep);
      rc = kiln_computation_sort(m, entry, st);
    }
  }
  kiln__tx_fini(&tx);
  return rc;
}

/* ---- offers ------------------------------------------------------------- */

static int64_t bytes_of(const prop *p, kiln_id id) {
  int64_t b = kiln_shape_bytes(&p->m->instrs[id]->shape);
  return b > 0 ? b : 1;
}

static bool is_array(const prop *p, kiln_id id) {
  const kiln_shape *s = &p->m->instrs[id]->shape;
  return kiln_shape_is_array(s) && s->rank <= SPMD_MAX_RANK;
}

/* Better offer: lower cost, then more tiles. */
static bool better(const spmd_tiling *c, int64_t cost, const spmd_tiling *best, int64_t best_cost) {
  if (best == NULL) return true;
  if (cost != best_cost) return cost < best_cost;
  return kiln__tiling_count(c) > kiln__tiling_count(best);
}

/* Forward: an unknown array instruction from its operands. */
static spmd_tiling *offer_forward(prop *p, const kiln_instr *ins) {
  spmd_tiling *best = NULL;
  int64_t best_cost = 0;
  /* Each operand's offer, and the merge of two offers that split
   * different dims (x split by rows, y by columns: the dot by both). */
  spmd_tiling *offers[16];
  uint32_t no = 0;
  for (uint32_t k = 0; k < ins->noperands && no < 8; k++) {
    const spmd_tiling *tk = p->t[ins->operands[k]];
    spmd_tiling *c = tk ? kiln__spmd_fwd(p->a, p->m, ins, k, tk) : NULL;
    if (c && !kiln__tiling_is_replicated(c)) offers[no++] = c;
  }
  for (uint32_t i = 0, n0 = no; i < n0 && no < 16; i++)
    for (uint32_t j = i + 1; j < n0 && no < 16; j++) {
      spmd_tiling *c = kiln__tiling_merge(p->a, offers[i], offers[j]);
      if (c && kiln__tiling_count(c) > kiln__tiling_count(offers[i]) &&
          kiln__tiling_count(c) > kiln__tiling_count(offers[j]))
        offers[no++] = c;
    }
  for (uint32_t i = 0; i < no; i++) {
    spmd_tiling *c = offers[i];
    int64_t cost = 0;
    for (uint32_t j = 0; j < ins->noperands; j++) {
      kiln_id o = ins->operands[j];
      if (p->t[o] == NULL) continue;
      const spmd_tiling *need = kiln__spmd_bwd(p->a, p->m, ins, j, c);
      if (need) cost += kiln__reshard_cost(p->t[o], need, bytes_of(p, o));
    }
    if (better(c, cost, best, best_cost)) best = c, best_cost = cost;
  }
  return best;
}

/* What user u needs of its operand `id` (NULL: no opinion). */
static spmd_tiling *user_need(prop *p, const kiln_instr *u, kiln_id id) {
  for (uint32_t k = 0; k < u->noperands; k++) {
    if (u->operands[k] != id) continue;
    if (u->op == KILN_OP_TUPLE) return p->e[u->id] ? p->e[u->id][k] : NULL;
    if (p->t[u->id] == NULL) continue;
    spmd_tiling *c = kiln__spmd_bwd(p->a, p->m, u, k, p->t[u->id]);
    if (c) return c;
  }
  return NULL;
}

/* Backward: an unknown array instruction from its users. */
static spmd_tiling *offer_backward(prop *p, kiln_id id) {
  uint32_t nu;
  const kiln_id *us = kiln_users_of(p->users, id, &nu);
  spmd_tiling *best = NULL;
  int64_t best_cost = 0;
  for (uint32_t i = 0; i < nu; i++) {
    const kiln_instr *u = p->m->instrs[us[i]];
    if (u->comp != p->comp) continue;
    spmd_tiling *c = user_need(p, u, id);
    if (c == NULL || kiln__tiling_is_replicated(c)) continue;
    int64_t cost = 0;
    for (uint32_t j = 0; j < nu; j++) {
      const kiln_instr *v = p->m->instrs[us[j]];
      if (v->comp != p->comp) continue;
      spmd_tiling *need = user_need(p, v, id);
      if (need) cost += kiln__reshard_cost(c, need, bytes_of(p, id));
    }
    if (better(c, cost, best, best_cost)) best = c, best_cost = cost;
  }
  return best;
}

/* ---- tuples -------------------------------------------------------------- */

static bool tuple_tracked(const kiln_instr *ins) {
  return kiln_shape_is_tuple(&ins->shape) &&
         (ins->op == KILN_OP_TUPLE || ins->op == KILN_OP_PARAMETER || ins->op == KILN_OP_WHILE ||
          ins->op == KILN_OP_CONDITIONAL);
}

static int ensure_elems(prop *p, kiln_id id) {
  if (p->e[id]) return 0;
  uint32_t r = p->m->instrs[id]->shape.rank;
  p->e[id] = kiln_arena_calloc(p->a, r ? r : 1, sizeof **p->e);
  return p->e[id] ? 0 : KILN_ENOMEM;
}

/* The flows through tuple and get-tuple-element, both ways. */
static bool tuple_step(prop *p, const kiln_instr *ins) {
  bool changed = false;
  if (ins->op == KILN_OP_TUPLE && p->e[ins->id]) {
    for (uint32_t k = 0; k < ins->noperands; k++) {
      kiln_id o = ins->operands[k];
      if (!is_array(p, o)) continue;
      if (p->e[ins->id][k] == NULL && p->t[o] && !kiln__tiling_is_replicated(p->t[o])) {
        p->e[ins->id][k] = p->t[o];
        changed = true;
      } else if (p->t[o] == NULL && p->e[ins->id][k] &&
                 !kiln__tiling_is_replicated(p->e[ins->id][k])) {
        p->t[o] = p->e[ins->id][k];
        changed = true;
      }
    }
  }
  if (ins->op == KILN_OP_GET_TUPLE_ELEMENT && is_array(p, ins->id)) {
    kiln_id o = ins->operands[0];
    int64_t i = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, -1);
    if (p->e[o] && i >= 0 && i < (int64_t)p->m->instrs[o]->shape.rank) {
      if (p->t[ins->id] == NULL && p->e[o][i] && !kiln__tiling_is_replicated(p->e[o][i])) {
        p->t[ins->id] = p->e[o][i];
        changed = true;
      } else if (p->e[o][i] == NULL && p->t[ins->id] &&
                 !kiln__tiling_is_replicated(p->t[ins->id])) {
        p->e[o][i] = p->t[ins->id];
        changed = true;
      }
    }
  }
  return changed;
}

/* ---- seeds and results --------------------------------------------------- */

/* {manual}, or a tiling with a manual subgroup (last_tile_dims={manual}). */
static bool sharding_is_manual(const kiln_sharding *s) {
  if (s->kind == KILN_SHARD_MANUAL) return true;
  for (uint32_t i = 0; s->kind == KILN_SHARD_TILED && i < s->last_tile_dims.n; i++)
    if (s->last_tile_dims.v[i] == KILN_SHARD_MANUAL) return true;
  return false;
}

static int seed(prop *p, const kiln_instr *ins) {
  char where[200];
  kiln_instr_where(p->m, ins, where, sizeof where);
  const kiln_sharding *s;
  int rc = kiln__user_sharding(p->a, p->m, ins, &s, p->st);
  if (rc) return kiln_status_set(p->st, rc, where, "out of memory");
  if (tuple_tracked(ins) && (rc = ensure_elems(p, ins->id)))
    return kiln_status_set(p->st, rc, where, "out of memory");
  if (s == NULL) return 0;
  /* A manual sharding on an annotation marks a value of a shard_map
   * region (XLA's SPMDFullToShardShape form), built per device as written
   * by the partitioner: nothing to propagate. Elsewhere it is refused. */
  if (ins->op == KILN_OP_CUSTOM_CALL && sharding_is_manual(s)) return 0;
  if (is_array(p, ins->id)) {
    if ((rc = kiln__tiling_from_sharding(p->a, s, ins->shape.rank, p->n, where, &p->t[ins->id],
                                         p->st)))
      return rc;
    p->fixed[ins->id] = true;
  } else if (tuple_tracked(ins) && s->kind == KILN_SHARD_TUPLE && s->nelems == ins->shape.rank) {
    for (uint32_t i = 0; i < s->nelems; i++) {
      const kiln_shape *es = &ins->shape.tuple[i];
      if (!kiln_shape_is_array(es) || es->rank > SPMD_MAX_RANK) continue;
      if ((rc = kiln__tiling_from_sharding(p->a, &s->elems[i], es->rank, p->n, where,
                                           &p->e[ins->id][i], p->st)))
        return rc;
    }
    p->fixed[ins->id] = true;
  } else if (tuple_tracked(ins) && s->kind != KILN_SHARD_TUPLE) {
    /* One sharding for every element (replicated, maximal). */
    for (uint32_t i = 0; i < ins->shape.rank; i++) {
      const kiln_shape *es = &ins->shape.tuple[i];
      if (!kiln_shape_is_array(es) || es->rank > SPMD_MAX_RANK) continue;
      if ((rc = kiln__tiling_from_sharding(p->a, s, es->rank, p->n, where, &p->e[ins->id][i],
                                           p->st)))
        return rc;
    }
    p->fixed[ins->id] = true;
  }
  return 0;
}

static int write_back(prop *p, kiln_instr *ins) {
  kiln_arena *ma = p->m->arena;
  /* a region marker keeps its manual sharding: the partitioner refuses it
   * anywhere but on a region's values */
  const kiln_attr *own = kiln_instr_attr(ins, KILN_ATTR_SHARDING);
  if (ins->op == KILN_OP_CUSTOM_CALL && own && sharding_is_manual(own->v.sharding)) return 0;
  kiln_sharding *s = NULL;
  if (is_array(p, ins->id)) {
    spmd_tiling *t = p->t[ins->id];
    if (t == NULL && (t = kiln__tiling_replicated(p->a, ins->shape.rank, p->n)) == NULL)
      return KILN_ENOMEM;
    s = kiln__tiling_to_sharding(ma, t);
  } else if (tuple_tracked(ins)) {
    uint32_t r = ins->shape.rank;
    for (uint32_t i = 0; i < r; i++)
      if (!kiln_shape_is_array(&ins->shape.tuple[i])) return 0; /* nested: left replicated */
    s = kiln_arena_calloc(ma, 1, sizeof *s);
    if (s == NULL || (r && (s->elems = kiln_arena_calloc(ma, r, sizeof *s->elems)) == NULL))
      return KILN_ENOMEM;
    s->kind = KILN_SHARD_TUPLE;
    s->nelems = r;
    for (uint32_t i = 0; i < r; i++) {
      spmd_tiling *t = p->e[ins->id][i];
      if (t == NULL && (t = kiln__tiling_replicated(p->a, ins->shape.tuple[i].rank, p->n)) == NULL)
        return KILN_ENOMEM;
      kiln_sharding *es = kiln__tiling_to_sharding(ma, t);
      if (es == NULL) return KILN_ENOMEM;
      s->elems[i] = *es;
    }
  } else {
    return 0;
  }
  if (s == NULL) return KILN_ENOMEM;
  kiln_attr *at = kiln_instr_add_attr(p->m, ins, KILN_ATTR_SHARDING);
  if (at == NULL) return KILN_ENOMEM;
  at->v.sharding = s;
  return 0;
}

/* ---- the pass ------------------------------------------------------------ */

bool kiln_spmd_module_is_sharded(const kiln_module *m) {
  const kiln_computation *c = kiln_module_entry(m);
  if (c == NULL || m->is_scheduled == 1) return false; /* XLA's compiled, partitioned dumps */
  /* A shard_map region: global, its body's collectives are per device. */
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[c->instrs[i]];
    const char *t = ins->op == KILN_OP_CUSTOM_CALL
                        ? kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET)
                        : NULL;
    if (t &&
        (strcmp(t, "xla.sdy.GlobalToLocalShape") == 0 || strcmp(t, "SPMDFullToShardShape") == 0))
      return true;
  }
  for (uint32_t i = 0; i < m->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[i];
    if (ins->comp != KILN_NO_ID && kiln_opcode_family(ins->op) == KILN_FAM_COLLECTIVE)
      return false; /* explicit collectives, partition-id: a per-device program */
  }
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[c->instrs[i]];
    if (kiln_instr_has_attr(ins, KILN_ATTR_SHARDING)) return true;
    if (ins->op == KILN_OP_CUSTOM_CALL &&
        kiln_custom_call_is_annotation(kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET)))
      return true;
  }
  return false;
}

static int sweep(prop *p, const kiln_computation *c) {
  for (int round = 0; round < 16; round++) {
    bool changed = false;
    for (uint32_t i = 0; i < c->ninstrs; i++) {
      const kiln_instr *ins = p->m->instrs[c->instrs[i]];
      changed |= tuple_step(p, ins);
      if (p->t[ins->id] || !is_array(p, ins->id) || ins->op == KILN_OP_GET_TUPLE_ELEMENT) continue;
      spmd_tiling *o = offer_forward(p, ins);
      if (o) p->t[ins->id] = o, changed = true;
    }
    for (uint32_t i = c->ninstrs; i-- > 0;) {
      const kiln_instr *ins = p->m->instrs[c->instrs[i]];
      changed |= tuple_step(p, ins);
      if (p->t[ins->id] || !is_array(p, ins->id)) continue;
      spmd_tiling *o = offer_backward(p, ins->id);
      if (o) p->t[ins->id] = o, changed = true;
    }
    if (!changed) break;
  }
  return 0;
}

/* ---- while loops -------------------------------------------------------- */

/* A while whose state is an array, or a tuple of arrays (and tokens) whose
 * init's elements are tracked (a tuple, a parameter, a loop or a
 * conditional), carries its state split as the init is (unknown elements
 * replicated): the state's tiling S is a fixed point because the body's
 * root, whatever instruction it is, is made to return S. Other loops run
 * whole. */
static bool loop_splittable(const prop *p, const kiln_instr *w) {
  if (w->op != KILN_OP_WHILE || w->ncalled != 2 || w->noperands != 1) return false;
  const kiln_instr *init = p->m->instrs[w->operands[0]];
  const kiln_computation *body = p->m->comps[w->called[1]];
  if (body->root == KILN_NO_ID) return false;
  if (is_array(p, w->id)) return true;
  if (!kiln_shape_is_tuple(&w->shape) || p->e[init->id] == NULL) return false;
  for (uint32_t i = 0; i < w->shape.rank; i++) /* arrays and tokens: no nested tuples */
    if (!kiln_shape_is_array(&w->shape.tuple[i]) && !kiln_shape_is_token(&w->shape.tuple[i]))
      return false;
  return true;
}

/* e[w] (t[w] for an array state) from its init: returns whether anything
 * was set. */
static bool loop_state(prop *p, const kiln_instr *w) {
  if (!loop_splittable(p, w)) return false;
  kiln_id init = w->operands[0];
  if (is_array(p, w->id)) {
    if (p->t[w->id] || p->t[init] == NULL || kiln__tiling_is_replicated(p->t[init])) return false;
    p->t[w->id] = p->t[init];
    return true;
  }
  if (p->e[w->id] == NULL) return false;
  bool any = false;
  spmd_tiling **ie = p->e[init];
  for (uint32_t i = 0; i < w->shape.rank; i++)
    if (p->e[w->id][i] == NULL && ie[i] && !kiln__tiling_is_replicated(ie[i])) {
      p->e[w->id][i] = ie[i];
      any = true;
    }
  return any;
}

/* A conditional whose result is unknown takes the tiling of a branch
 * operand of the result's shape, or of such an element of a tuple operand
 * (each branch then computes its result as its operand is split): returns
 * whether anything was set. */
static bool cond_state(prop *p, const kiln_instr *c) {
  if (c->op != KILN_OP_CONDITIONAL || !is_array(p, c->id) || p->t[c->id]) return false;
  for (uint32_t k = 1; k < c->noperands; k++) {
    kiln_id o = c->operands[k];
    const kiln_shape *os = &p->m->instrs[o]->shape;
    uint32_t ne = kiln_shape_is_tuple(os) && p->e[o] ? os->rank : 0;
    for (uint32_t i = 0; i <= ne; i++) {
      const spmd_tiling *t = i < ne ? p->e[o][i] : is_array(p, o) ? p->t[o] : NULL;
      const kiln_shape *s = i < ne ? &os->tuple[i] : os;
      if (t && !kiln__tiling_is_replicated(t) && kiln_shape_is_array(s) &&
          kiln_shape_same_dims(s, &c->shape)) {
        p->t[c->id] = (spmd_tiling *)t;
        return true;
      }
    }
  }
  return false;
}

static int propagate_comp(kiln_module *m, uint32_t comp, int64_t n, kiln_status *st);

static int set_sharding(kiln_module *m, kiln_instr *ins, kiln_sharding *s) {
  kiln_attr *a = kiln_instr_add_attr(m, ins, KILN_ATTR_SHARDING);
  if (a == NULL) return KILN_ENOMEM;
  a->v.sharding = s;
  return 0;
}

/* The sharding propagation wrote on ins, when it splits something (an
 * array's, or some element's of a tuple's); else NULL. */
static kiln_sharding *split_sharding(const kiln_instr *ins) {
  const kiln_attr *a = kiln_instr_attr(ins, KILN_ATTR_SHARDING);
  if (a == NULL) return NULL;
  kiln_sharding *s = a->v.sharding;
  if (s->kind == KILN_SHARD_TILED) return s;
  for (uint32_t k = 0; s->kind == KILN_SHARD_TUPLE && k < s->nelems; k++)
    if (s->elems[k].kind == KILN_SHARD_TILED) return s;
  return NULL;
}

/* A private copy of computation `comp` called by ins, propagated with its
 * parameter 0 in sharding `param` and (unless NULL) its root in `root`. */
static int propagate_called(kiln_module *m, const kiln_instr *ins, uint32_t comp,
                            kiln_sharding *param, kiln_sharding *root, int64_t n, uint32_t *out,
                            kiln_status *st) {
  char name[200];
  snprintf(name, sizeof name, "%.180s.spmd", m->comps[comp]->name);
  for (uint32_t k = 1, used = 1; used; k++) { /* a name no computation has */
    used = 0;
    for (uint32_t i = 0; i < m->ncomps && !used; i++)
      used = m->comps[i] && m->comps[i]->name && strcmp(m->comps[i]->name, name) == 0;
    if (used) snprintf(name, sizeof name, "%.180s.spmd%u", m->comps[comp]->name, k);
  }
  int rc = kiln_computation_clone(m, comp, name, out);
  if (rc) return kiln_status_set(st, rc, "spmd", "out of memory");
  kiln_computation *c = m->comps[*out];
  kiln_instr *pi = kiln_computation_param(m, c, 0);
  if (pi == NULL || c->root == KILN_NO_ID) {
    char where[200];
    kiln_instr_where(m, ins, where, sizeof where);
    return kiln_status_set(st, KILN_EINVAL, where,
                           "a called computation without parameter or root");
  }
  if ((param && set_sharding(m, pi, param)) || (root && set_sharding(m, m->instrs[c->root], root)))
    return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
  return propagate_comp(m, *out, n, st);
}

/* Gives each splittable loop of comp private copies of its condition and
 * body whose parameters (and the body's root) carry the state's sharding,
 * and each conditional with split operands or result private copies of its
 * branches whose parameter carries its operand's sharding and whose root
 * the result's; and propagates inside them. */
static int propagate_loops(kiln_module *m, uint32_t comp, int64_t n, kiln_status *st) {
  for (uint32_t i = 0; i < m->comps[comp]->ninstrs; i++) {
    kiln_instr *w = m->instrs[m->comps[comp]->instrs[i]];
    if (w->op == KILN_OP_WHILE && w->ncalled == 2 && w->noperands == 1) {
      kiln_sharding *s = split_sharding(w);
      if (s == NULL) continue;
      uint32_t called[2];
      for (int k = 0; k < 2; k++) {
        int rc = propagate_called(m, w, w->called[k], s, k == 1 ? s : NULL, n, &called[k], st);
        if (rc) return rc;
      }
      if (kiln_instr_set_called(m, w, called, 2))
        return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
    } else if (w->op == KILN_OP_CONDITIONAL && w->ncalled > 0 && w->ncalled <= 256 &&
               w->noperands == w->ncalled + 1) {
      bool split = split_sharding(w) != NULL;
      for (uint32_t k = 1; k < w->noperands; k++)
        split = split || split_sharding(m->instrs[w->operands[k]]) != NULL;
      const kiln_attr *ra = kiln_instr_attr(w, KILN_ATTR_SHARDING);
      if (!split || ra == NULL) continue;
      uint32_t called[256];
      for (uint32_t k = 0; k < w->ncalled; k++) {
        const kiln_attr *oa = kiln_instr_attr(m->instrs[w->operands[k + 1]], KILN_ATTR_SHARDING);
        int rc = propagate_called(m, w, w->called[k], oa ? oa->v.sharding : NULL, ra->v.sharding, n,
                                  &called[k], st);
        if (rc) return rc;
      }
      if (kiln_instr_set_called(m, w, called, w->ncalled))
        return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
    }
  }
  return 0;
}

static bool is_target(const kiln_instr *ins, const char *target) {
  const char *t = ins->op == KILN_OP_CUSTOM_CALL
                      ? kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET)
                      : NULL;
  return t && strcmp(t, target) == 0;
}

/* The body of a region manual over some axes of its mesh is split along
 * the others, as XLA's Shardy partitioner does: a call whose operands are
 * the values of one GlobalToLocalShape G (in order), with an array result
 * or a tuple of them, gets a private copy of its body, whose
 * parameter k carries the automatic axes of G's operand k's Shardy
 * sharding (what that operand already holds along them: no communication
 * on the way in), propagated inside. Every tiling there must split only
 * along automatic axes (kiln__tiling_auto_only); else the body stays as it
 * is, whole along them. */
static int propagate_region(kiln_module *m, kiln_instr *call, int64_t n, kiln_status *st) {
  if (call->op != KILN_OP_CALL || call->ncalled != 1 || call->noperands == 0 ||
      call->noperands > 64)
    return 0;
  if (!kiln_shape_is_array(&call->shape)) { /* several results: a tuple of arrays */
    if (!kiln_shape_is_tuple(&call->shape)) return 0;
    for (uint32_t i = 0; i < call->shape.rank; i++)
      if (!kiln_shape_is_array(&call->shape.tuple[i])) return 0;
  }
  const kiln_instr *o0 = m->instrs[call->operands[0]];
  const kiln_instr *g = o0->op == KILN_OP_GET_TUPLE_ELEMENT ? m->instrs[o0->operands[0]] : o0;
  if (!is_target(g, "xla.sdy.GlobalToLocalShape")) return 0;
  for (uint32_t k = 0; k < call->noperands; k++) {
    const kiln_instr *o = m->instrs[call->operands[k]];
    bool ok = o == g ? call->noperands == 1 && g->noperands == 1
                     : o->op == KILN_OP_GET_TUPLE_ELEMENT && o->operands[0] == g->id &&
                           kiln_instr_attr_int(o, KILN_ATTR_INDEX, -1) == (int64_t)k &&
                           g->noperands == call->noperands;
    if (!ok) return 0;
  }
  int64_t sizes[16];
  bool manual[16], autos[16];
  uint32_t na;
  if (!kiln__sdy_region_axes(m, g, sizes, manual, &na)) return 0;
  bool partial = false;
  for (uint32_t k = 0; k < na; k++) partial = partial || !manual[k], autos[k] = !manual[k];
  if (!partial) return 0;
  kiln_arena *a = kiln_arena_create();
  if (a == NULL) return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
  int rc = 0;
  bool any = false;
  kiln_sharding *ps[64];
  for (uint32_t k = 0; k < call->noperands && rc == 0; k++) {
    const kiln_instr *src = m->instrs[g->operands[k]];
    const kiln_shape *ls = &m->instrs[call->operands[k]]->shape;
    const kiln_sharding *s = NULL;
    spmd_tiling *t = NULL;
    kiln_status ignore = {0};
    ps[k] = NULL;
    if ((rc = kiln__sdy_instr_sharding_axes(a, m, src, autos, &s)) || s == NULL) continue;
    if (!kiln_shape_is_array(ls) || ls->rank != src->shape.rank ||
        kiln__tiling_from_sharding(a, s, ls->rank, n, "spmd", &t, &ignore))
      continue;
    bool even = true;
    for (uint32_t d = 0; d < ls->rank; d++) even = even && ls->dims[d] % t->tiles[d] == 0;
    if (!even || kiln__tiling_is_replicated(t)) continue;
    ps[k] = kiln__tiling_to_sharding(m->arena, t);
    any = any || ps[k] != NULL;
  }
  kiln_arena_destroy(a);
  if (rc || !any) return rc ? kiln_status_set(st, rc, "spmd", "out of memory") : 0;
  uint32_t body;
  char name[200];
  snprintf(name, sizeof name, "%.180s.spmd", m->comps[call->called[0]]->name);
  if ((rc = kiln_computation_clone(m, call->called[0], name, &body)))
    return kiln_status_set(st, rc, "spmd", "out of memory");
  kiln_computation *c = m->comps[body];
  for (uint32_t k = 0; k < call->noperands; k++) {
    kiln_instr *pi = kiln_computation_param(m, c, k);
    if (pi == NULL) return 0; /* the clone stays unused */
    if (ps[k] && set_sharding(m, pi, ps[k])) return kiln_status_set(st, KILN_ENOMEM, "spmd", "oom");
  }
  if ((rc = propagate_comp(m, body, n, st))) return rc;
  /* every array value split along automatic axes only, or none is */
  a = kiln_arena_create();
  if (a == NULL) return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
  bool ok = true;
  for (uint32_t i = 0; i < c->ninstrs && ok; i++) {
    const kiln_instr *ins = m->instrs[c->instrs[i]];
    const kiln_attr *sa = kiln_instr_attr(ins, KILN_ATTR_SHARDING);
    spmd_tiling *t;
    kiln_status ignore = {0};
    if (!kiln_shape_is_array(&ins->shape)) {
      const kiln_sharding *ts = sa ? sa->v.sharding : NULL;
      if (ts == NULL || !split_sharding(ins)) continue;
      ok = ts->kind == KILN_SHARD_TUPLE && kiln_shape_is_tuple(&ins->shape) &&
           ts->nelems == ins->shape.rank;
      for (uint32_t k = 0; ok && k < ts->nelems; k++) {
        const kiln_shape *es = &ins->shape.tuple[k];
        ok = kiln_shape_is_array(es) &&
             kiln__tiling_from_sharding(a, &ts->elems[k], es->rank, n, "spmd", &t, &ignore) == 0 &&
             (kiln__tiling_is_replicated(t) || kiln__tiling_auto_only(t, sizes, manual, na));
      }
      continue;
    }
    ok = kiln__tiling_from_sharding(a, sa ? sa->v.sharding : NULL, ins->shape.rank, n, "spmd", &t,
                                    &ignore) == 0 &&
         (kiln__tiling_is_replicated(t) || kiln__tiling_auto_only(t, sizes, manual, na));
  }
  kiln_arena_destroy(a);
  if (ok && kiln_instr_set_called(m, call, &body, 1))
    return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
  return 0;
}

static int propagate_comp(kiln_module *m, uint32_t comp, int64_t n, kiln_status *st) {
  int rc = kiln__spmd_inline_calls(m, comp, st);
  if (rc) return rc;
  prop p = {m, comp, kiln_arena_create(), st, n, NULL, NULL, NULL, NULL};
  if (p.a == NULL) return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
  p.t = kiln_arena_calloc(p.a, m->ninstrs + 1, sizeof *p.t);
  p.e = kiln_arena_calloc(p.a, m->ninstrs + 1, sizeof *p.e);
  p.fixed = kiln_arena_calloc(p.a, m->ninstrs + 1, sizeof *p.fixed);
  if (!p.t || !p.e || !p.fixed || kiln_users_build(m, &p.users)) {
    rc = kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
    goto out;
  }
  const kiln_computation *c = m->comps[comp];
  for (uint32_t i = 0; i < c->ninstrs && rc == 0; i++) rc = seed(&p, m->instrs[c->instrs[i]]);
  /* Sweep; then loops take their init's tiling and the sweep goes on
   * through their results. */
  for (int round = 0; rc == 0 && round < 8; round++) {
    rc = sweep(&p, c);
    bool more = false;
    for (uint32_t i = 0; i < c->ninstrs; i++) {
      more |= loop_state(&p, m->instrs[c->instrs[i]]);
      more |= cond_state(&p, m->instrs[c->instrs[i]]);
    }
    if (!more) break;
  }
  for (uint32_t i = 0; i < c->ninstrs && rc == 0; i++) {
    kiln_instr *ins = m->instrs[c->instrs[i]];
    if (ins->op == KILN_OP_WHILE && !loop_splittable(&p, ins)) continue; /* runs whole */
    if ((rc = write_back(&p, ins))) kiln_status_set(st, rc, "spmd", "out of memory");
  }
out:
  kiln_users_destroy(p.users);
  kiln_arena_destroy(p.a);
  if (rc == 0) rc = propagate_loops(m, comp, n, st);
  for (uint32_t i = 0; rc == 0 && comp == m->entry && i < m->comps[comp]->ninstrs; i++)
    rc = propagate_region(m, m->instrs[m->comps[comp]->instrs[i]], n, st);
  return rc;
}

int kiln_spmd_propagate(kiln_module *m, int64_t partitions, kiln_status *st) {
  if (kiln_module_entry(m) == NULL)
    return kiln_status_set(st, KILN_EINVAL, "spmd", "module has no ENTRY computation");
  if (partitions < 1 || partitions > 4096)
    return kiln_status_set(st, KILN_EINVAL, "spmd", "partitions must be 1 to 4096");
  return propagate_comp(m, m->entry, partitions, st);
}
