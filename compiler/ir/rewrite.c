/* Graph rewriting helpers: users index, use replacement, compaction, stable
 * topological sort, deep copies of attributes, instructions, computations
 * and modules, and the call-graph post-order. */
#include "compiler/ir/rewrite.h"

#include <string.h>

#include "common/alloc.h"

struct kiln_users {
  uint32_t *start; /* ninstrs + 1 offsets into ids */
  kiln_id *ids;
};

int kiln_users_build(const kiln_module *m, kiln_users **out) {
  kiln_users *u = kiln_calloc(1, sizeof *u);
  if (u == NULL) return KILN_ENOMEM;
  u->start = kiln_calloc((size_t)m->ninstrs + 1, sizeof *u->start);
  if (u->start == NULL) goto oom;
  size_t total = 0;
  for (uint32_t c = 0; c < m->ncomps; c++) {
    const kiln_computation *comp = m->comps[c];
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const kiln_instr *ins = m->instrs[comp->instrs[i]];
      for (uint32_t k = 0; k < ins->noperands; k++) {
        if (ins->operands[k] < m->ninstrs) u->start[ins->operands[k] + 1]++;
      }
      total += ins->noperands;
    }
  }
  for (uint32_t i = 0; i < m->ninstrs; i++) u->start[i + 1] += u->start[i];
  u->ids = kiln_malloc((total ? total : 1) * sizeof *u->ids);
  uint32_t *fill = kiln_calloc((size_t)m->ninstrs + 1, sizeof *fill);
  if (u->ids == NULL || fill == NULL) {
    kiln_free(fill);
    goto oom;
  }
  for (uint32_t c = 0; c < m->ncomps; c++) {
    const kiln_computation *comp = m->comps[c];
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const kiln_instr *ins = m->instrs[comp->instrs[i]];
      for (uint32_t k = 0; k < ins->noperands; k++) {
        kiln_id o = ins->operands[k];
        if (o < m->ninstrs) u->ids[u->start[o] + fill[o]++] = ins->id;
      }
    }
  }
  kiln_free(fill);
  *out = u;
  return 0;
oom:
  kiln_users_destroy(u);
  return KILN_ENOMEM;
}

void kiln_users_destroy(kiln_users *u) {
  if (u == NULL) return;
  kiln_free(u->start);
  kiln_free(u->ids);
  kiln_free(u);
}

const kiln_id *kiln_users_of(const kiln_users *u, kiln_id id, uint32_t *n) {
  *n = u->start[id + 1] - u->start[id];
  return u->ids + u->start[id];
}

void kiln_replace_all_uses(kiln_module *m, uint32_t comp, kiln_id from, kiln_id to) {
  kiln_computation *c = m->comps[comp];
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_instr *ins = m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < ins->noperands; k++)
      if (ins->operands[k] == from) ins->operands[k] = to;
    for (uint32_t k = 0; k < ins->ncontrol; k++)
      if (ins->control_preds[k] == from) ins->control_preds[k] = to;
  }
  if (c->root == from) c->root = to;
}

void kiln_remap_operands(kiln_module *m, uint32_t comp, const kiln_id *map) {
  kiln_computation *c = m->comps[comp];
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_instr *ins = m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < ins->noperands; k++) ins->operands[k] = map[ins->operands[k]];
    for (uint32_t k = 0; k < ins->ncontrol; k++) ins->control_preds[k] = map[ins->control_preds[k]];
  }
  if (c->root != KILN_NO_ID) c->root = map[c->root];
}

void kiln_computation_compact(kiln_module *m, uint32_t comp, const bool *keep) {
  kiln_computation *c = m->comps[comp];
  uint32_t n = 0;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_id id = c->instrs[i];
    if (keep[id]) {
      c->instrs[n++] = id;
    } else {
      m->instrs[id]->comp = KILN_NO_ID;
    }
  }
  c->ninstrs = n;
}

/* Iterative DFS post-order from each instruction in current order: an
 * instruction is emitted after all its operands, so the existing order is
 * kept wherever it is already valid. */
int kiln_computation_sort(kiln_module *m, uint32_t comp, kiln_status *st) {
  kiln_computation *c = m->comps[comp];
  uint32_t n = c->ninstrs;
  if (n == 0) return 0;
  uint8_t *state = kiln_calloc(m->ninstrs, 1); /* 0 new, 1 on stack, 2 done */
  kiln_id *out = kiln_malloc(n * sizeof *out);
  kiln_id *stack = kiln_malloc(n * sizeof *stack);
  uint32_t *next = kiln_calloc(m->ninstrs, sizeof *next); /* next edge to visit */
  int rc = 0;
  if (!state || !out || !stack || !next) {
    rc = kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory sorting %s", c->name);
    goto out_free;
  }
  /* Mark membership: only edges inside this computation are followed. */
  for (uint32_t i = 0; i < n; i++) state[c->instrs[i]] = 0;
  uint8_t *member = kiln_calloc(m->ninstrs, 1);
  if (member == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory sorting %s", c->name);
    goto out_free;
  }
  for (uint32_t i = 0; i < n; i++) member[c->instrs[i]] = 1;
  uint32_t nout = 0;
  for (uint32_t i = 0; i < n && rc == 0; i++) {
    kiln_id s = c->instrs[i];
    if (state[s]) continue;
    uint32_t top = 0;
    stack[top++] = s;
    state[s] = 1;
    while (top) {
      kiln_instr *ins = m->instrs[stack[top - 1]];
      uint32_t e = next[ins->id]++;
      uint32_t nedges = ins->noperands + ins->ncontrol;
      if (e < nedges) {
        kiln_id d = e < ins->noperands ? ins->operands[e] : ins->control_preds[e - ins->noperands];
        if (d >= m->ninstrs || !member[d]) continue;
        if (state[d] == 1) {
          rc = kiln_status_set(st, KILN_EINVAL, NULL, "cycle in computation %s through %s", c->name,
                               m->instrs[d]->name);
          break;
        }
        if (state[d] == 0) {
          state[d] = 1;
          stack[top++] = d;
        }
      } else {
        state[ins->id] = 2;
        out[nout++] = ins->id;
        top--;
      }
    }
  }
  if (rc == 0) memcpy(c->instrs, out, n * sizeof *out);
  kiln_free(member);
out_free:
  kiln_free(state);
  kiln_free(out);
  kiln_free(stack);
  kiln_free(next);
  return rc;
}

static int copy_ints(kiln_arena *a, kiln_i64s *dst, const kiln_i64s *src) {
  dst->n = src->n;
  dst->v = NULL;
  if (src->n == 0) return 0;
  dst->v = kiln_arena_memdup(a, src->v, src->n * sizeof *src->v);
  return dst->v ? 0 : KILN_ENOMEM;
}

static int copy_sharding(kiln_arena *a, kiln_sharding *dst, const kiln_sharding *src) {
  *dst = *src;
  if (copy_ints(a, &dst->tile_dims, &src->tile_dims) ||
      copy_ints(a, &dst->devices, &src->devices) ||
      copy_ints(a, &dst->iota_reshape, &src->iota_reshape) ||
      copy_ints(a, &dst->iota_perm, &src->iota_perm) ||
      copy_ints(a, &dst->last_tile_dims, &src->last_tile_dims))
    return KILN_ENOMEM;
  if (src->extra && (dst->extra = kiln_arena_strdup(a, src->extra)) == NULL) return KILN_ENOMEM;
  if (src->nelems) {
    dst->elems = kiln_arena_calloc(a, src->nelems, sizeof *dst->elems);
    if (dst->elems == NULL) return KILN_ENOMEM;
    for (uint32_t i = 0; i < src->nelems; i++)
      if (copy_sharding(a, &dst->elems[i], &src->elems[i])) return KILN_ENOMEM;
  }
  return 0;
}

int kiln_attr_copy(kiln_arena *a, kiln_attr *dst, const kiln_attr *src) {
  *dst = *src;
  if (src->name && (dst->name = kiln_arena_strdup(a, src->name)) == NULL) return KILN_ENOMEM;
  switch (kiln_attr_key_kind(src->key)) {
  case KILN_AK_INT:
  case KILN_AK_BOOL:
  case KILN_AK_FLOAT:
  case KILN_AK_CMP_DIR: return 0;
  case KILN_AK_INTS:
  case KILN_AK_SLICE:
  case KILN_AK_PADDING:
  case KILN_AK_PAIRS: return copy_ints(a, &dst->v.ints, &src->v.ints);
  case KILN_AK_IDENT:
  case KILN_AK_STRING:
  case KILN_AK_OPAQUE:
    if (src->v.s == NULL) return 0;
    return (dst->v.s = kiln_arena_strdup(a, src->v.s)) ? 0 : KILN_ENOMEM;
  case KILN_AK_WINDOW: {
    if (src->v.window == NULL) return 0;
    kiln_window *w = kiln_arena_alloc(a, sizeof *w);
    if (w == NULL) return KILN_ENOMEM;
    *w = *src->v.window;
    if (w->rank) {
      w->dims = kiln_arena_memdup(a, src->v.window->dims, w->rank * sizeof *w->dims);
      if (w->dims == NULL) return KILN_ENOMEM;
    }
    dst->v.window = w;
    return 0;
  }
  case KILN_AK_DIM_LABELS: {
    if (src->v.conv == NULL) return 0;
    kiln_conv_dims *cd = kiln_arena_alloc(a, sizeof *cd);
    if (cd == NULL) return KILN_ENOMEM;
    *cd = *src->v.conv;
    size_t bytes = cd->nspatial * sizeof(int64_t);
    if (cd->nspatial) {
      cd->in_spatial = kiln_arena_memdup(a, src->v.conv->in_spatial, bytes);
      cd->kernel_spatial = kiln_arena_memdup(a, src->v.conv->kernel_spatial, bytes);
      cd->out_spatial = kiln_arena_memdup(a, src->v.conv->out_spatial, bytes);
      if (!cd->in_spatial || !cd->kernel_spatial || !cd->out_spatial) return KILN_ENOMEM;
    }
    dst->v.conv = cd;
    return 0;
  }
  case KILN_AK_REPLICA_GROUPS: {
    const kiln_replica_groups *g = src->v.groups;
    if (g == NULL) return 0;
    kiln_replica_groups *ng = kiln_arena_alloc(a, sizeof *ng);
    if (ng == NULL) return KILN_ENOMEM;
    *ng = *g;
    if (copy_ints(a, &ng->iota_shape, &g->iota_shape) ||
        copy_ints(a, &ng->iota_reshape, &g->iota_reshape) ||
        copy_ints(a, &ng->iota_perm, &g->iota_perm))
      return KILN_ENOMEM;
    if (g->ngroups) {
      ng->groups = kiln_arena_calloc(a, g->ngroups, sizeof *ng->groups);
      if (ng->groups == NULL) return KILN_ENOMEM;
      for (uint32_t i = 0; i < g->ngroups; i++)
        if (copy_ints(a, &ng->groups[i], &g->groups[i])) return KILN_ENOMEM;
    }
    dst->v.groups = ng;
    return 0;
  }
  case KILN_AK_SHARDING: {
    if (src->v.sharding == NULL) return 0;
    kiln_sharding *s = kiln_arena_alloc(a, sizeof *s);
    if (s == NULL || copy_sharding(a, s, src->v.sharding)) return KILN_ENOMEM;
    dst->v.sharding = s;
    return 0;
  }
  }
  return 0;
}

kiln_instr *kiln_instr_clone(kiln_module *m, uint32_t comp, const kiln_instr *src,
                             const kiln_id *operands, uint32_t noperands, const uint32_t *comp_map,
                             const char *name) {
  kiln_instr *ins = kiln_module_add_instr(m, comp, src->op, name ? name : src->name);
  if (ins == NULL) return NULL;
  ins->async_op = src->async_op;
  ins->param_number = src->param_number;
  ins->line = src->line;
  ins->col = src->col;
  if (kiln_instr_set_shape(m, ins, &src->shape)) return NULL;
  if (kiln_instr_set_operands(m, ins, operands, noperands)) return NULL;
  if (kiln_instr_set_called(m, ins, src->called, src->ncalled)) return NULL;
  if (comp_map)
    for (uint32_t i = 0; i < ins->ncalled; i++) ins->called[i] = comp_map[ins->called[i]];
  if (src->nattrs) {
    ins->attrs = kiln_arena_calloc(m->arena, src->nattrs, sizeof *ins->attrs);
    if (ins->attrs == NULL) return NULL;
    for (uint32_t i = 0; i < src->nattrs; i++)
      if (kiln_attr_copy(m->arena, &ins->attrs[i], &src->attrs[i])) return NULL;
    ins->nattrs = ins->attrcap = src->nattrs;
  }
  if (src->literal && kiln_literal_clone(m->arena, src->literal, &ins->literal, NULL)) return NULL;
  return ins;
}

static int copy_header(kiln_module *d, const kiln_module *s) {
  kiln_arena *a = d->arena;
  d->is_scheduled = s->is_scheduled;
  d->replica_count = s->replica_count;
  d->num_partitions = s->num_partitions;
  d->entry = s->entry;
  d->has_aliases = s->has_aliases;
  if (s->entry_layout) {
    kiln_program_shape *p = kiln_arena_calloc(a, 1, sizeof *p);
    if (p == NULL) return KILN_ENOMEM;
    p->nparams = s->entry_layout->nparams;
    if (p->nparams) {
      p->params = kiln_arena_calloc(a, p->nparams, sizeof *p->params);
      if (p->params == NULL) return KILN_ENOMEM;
      for (uint32_t i = 0; i < p->nparams; i++)
        if (kiln_shape_copy(a, &p->params[i], &s->entry_layout->params[i])) return KILN_ENOMEM;
    }
    if (kiln_shape_copy(a, &p->result, &s->entry_layout->result)) return KILN_ENOMEM;
    d->entry_layout = p;
  }
  if (s->naliases) {
    d->aliases = kiln_arena_calloc(a, s->naliases, sizeof *d->aliases);
    if (d->aliases == NULL) return KILN_ENOMEM;
    for (uint32_t i = 0; i < s->naliases; i++) {
      d->aliases[i] = s->aliases[i];
      if (copy_ints(a, &d->aliases[i].output_index, &s->aliases[i].output_index) ||
          copy_ints(a, &d->aliases[i].param_index, &s->aliases[i].param_index))
        return KILN_ENOMEM;
    }
    d->naliases = s->naliases;
  }
  if (s->nheader_extra) {
    d->header_extra = kiln_arena_calloc(a, s->nheader_extra, sizeof *d->header_extra);
    if (d->header_extra == NULL) return KILN_ENOMEM;
    for (uint32_t i = 0; i < s->nheader_extra; i++) {
      d->header_extra[i].name = kiln_arena_strdup(a, s->header_extra[i].name);
      d->header_extra[i].text = kiln_arena_strdup(a, s->header_extra[i].text);
      if (!d->header_extra[i].name || !d->header_extra[i].text) return KILN_ENOMEM;
    }
    d->nheader_extra = s->nheader_extra;
  }
  if (s->nsections) {
    d->sections = kiln_arena_calloc(a, s->nsections, sizeof *d->sections);
    if (d->sections == NULL) return KILN_ENOMEM;
    for (uint32_t i = 0; i < s->nsections; i++) {
      d->sections[i].name = kiln_arena_strdup(a, s->sections[i].name);
      d->sections[i].text = kiln_arena_strdup(a, s->sections[i].text);
      if (!d->sections[i].name || !d->sections[i].text) return KILN_ENOMEM;
    }
    d->nsections = s->nsections;
  }
  return 0;
}

int kiln_module_clone(const kiln_module *s, kiln_module **out) {
  *out = NULL;
  kiln_module *d = kiln_module_create(s->name);
  if (d == NULL) return KILN_ENOMEM;
  if (copy_header(d, s)) goto oom;
  for (uint32_t c = 0; c < s->ncomps; c++) {
    if (kiln_module_add_computation(d, s->comps[c]->name, NULL)) goto oom;
    kiln_computation *dc = d->comps[c];
    dc->root = s->comps[c]->root;
    dc->is_entry = s->comps[c]->is_entry;
    dc->line = s->comps[c]->line;
    dc->col = s->comps[c]->col;
  }
  for (uint32_t i = 0; i < s->ninstrs; i++) {
    const kiln_instr *si = s->instrs[i];
    uint32_t comp = si->comp < s->ncomps ? si->comp : 0;
    if (s->ncomps == 0) goto oom; /* instructions without computations: not a module */
    kiln_instr *di = kiln_instr_clone(d, comp, si, si->operands, si->noperands, NULL, si->name);
    if (di == NULL) goto oom;
    if (kiln_instr_set_control(d, di, si->control_preds, si->ncontrol)) goto oom;
    di->comp = si->comp;
  }
  /* Orders: the source's, not creation order (removed instructions drop out). */
  for (uint32_t c = 0; c < s->ncomps; c++) {
    kiln_computation *dc = d->comps[c];
    const kiln_computation *sc = s->comps[c];
    size_t cap = dc->cap;
    void *p = dc->instrs;
    if (kiln_grow(&p, &cap, sc->ninstrs ? sc->ninstrs : 1, sizeof *dc->instrs)) goto oom;
    dc->instrs = p;
    dc->cap = (uint32_t)cap;
    if (sc->ninstrs) memcpy(dc->instrs, sc->instrs, sc->ninstrs * sizeof *dc->instrs);
    dc->ninstrs = sc->ninstrs;
  }
  *out = d;
  return 0;
oom:
  kiln_module_destroy(d);
  return KILN_ENOMEM;
}

int kiln_computation_clone(kiln_module *m, uint32_t comp, const char *name, uint32_t *out) {
  uint32_t nc;
  int rc = kiln_module_add_computation(m, name, &nc);
  if (rc) return rc;
  /* map covers the instructions that exist now: the source's ids. */
  uint32_t nold = m->ninstrs, maxops = 1;
  const kiln_computation *src = m->comps[comp];
  for (uint32_t i = 0; i < src->ninstrs; i++) {
    const kiln_instr *si = m->instrs[src->instrs[i]];
    if (si->noperands > maxops) maxops = si->noperands;
    if (si->ncontrol > maxops) maxops = si->ncontrol;
  }
  kiln_id *map = kiln_malloc((size_t)nold * sizeof *map);
  kiln_id *ops = kiln_malloc((size_t)maxops * sizeof *ops);
  rc = KILN_ENOMEM;
  if (map == NULL || ops == NULL) goto out_free;
  for (uint32_t i = 0; i < src->ninstrs; i++) {
    const kiln_instr *si = m->instrs[src->instrs[i]];
    for (uint32_t k = 0; k < si->noperands; k++) ops[k] = map[si->operands[k]];
    kiln_instr *di = kiln_instr_clone(m, nc, si, ops, si->noperands, NULL, si->name);
    if (di == NULL) goto out_free;
    map[si->id] = di->id;
    for (uint32_t k = 0; k < si->ncontrol; k++) ops[k] = map[si->control_preds[k]];
    if (si->ncontrol && kiln_instr_set_control(m, di, ops, si->ncontrol)) goto out_free;
  }
  m->comps[nc]->root = src->root == KILN_NO_ID ? KILN_NO_ID : map[src->root];
  if (out) *out = nc;
  rc = 0;
out_free:
  kiln_free(map);
  kiln_free(ops);
  return rc;
}

int kiln_module_post_order(const kiln_module *m, uint32_t **order, uint32_t *n) {
  *order = NULL;
  *n = 0;
  if (m->ncomps == 0 || m->entry >= m->ncomps) return 0;
  uint32_t *out = kiln_malloc(m->ncomps * sizeof *out);
  uint8_t *state = kiln_calloc(m->ncomps, 1);
  uint32_t *stack = kiln_malloc(m->ncomps * sizeof *stack);
  uint32_t *pos = kiln_calloc(m->ncomps, sizeof *pos); /* (instr index, called index) flat */
  uint32_t *sub = kiln_calloc(m->ncomps, sizeof *sub);
  if (!out || !state || !stack || !pos || !sub) {
    kiln_free(out);
    kiln_free(state);
    kiln_free(stack);
    kiln_free(pos);
    kiln_free(sub);
    return KILN_ENOMEM;
  }
  uint32_t top = 0, nout = 0;
  stack[top++] = m->entry;
  state[m->entry] = 1;
  while (top) {
    uint32_t c = stack[top - 1];
    const kiln_computation *comp = m->comps[c];
    bool pushed = false;
    while (pos[c] < comp->ninstrs && !pushed) {
      const kiln_instr *ins = m->instrs[comp->instrs[pos[c]]];
      if (sub[c] < ins->ncalled) {
        uint32_t callee = ins->called[sub[c]++];
        if (callee < m->ncomps && state[callee] == 0) {
          state[callee] = 1;
          stack[top++] = callee;
          pushed = true;
        }
      } else {
        pos[c]++;
        sub[c] = 0;
      }
    }
    if (!pushed) {
      state[c] = 2;
      out[nout++] = c;
      top--;
    }
  }
  kiln_free(state);
  kiln_free(stack);
  kiln_free(pos);
  kiln_free(sub);
  *order = out;
  *n = nout;
  return 0;
}
