/* Modules, computations and instructions: creation and the small accessors
 * every other part of the compiler uses. Everything is allocated in the
 * module's arena except the two growable index tables (instrs, comps), which
 * are heap arrays of pointers so that instructions never move. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/ir.h"

kiln_module *kiln_module_create(const char *name) {
  kiln_module *m = kiln_calloc(1, sizeof *m);
  if (m == NULL) return NULL;
  m->arena = kiln_arena_create();
  if (m->arena == NULL) goto out_free_module;
  m->name = kiln_arena_strdup(m->arena, name ? name : "module");
  if (m->name == NULL) goto out_free_arena;
  m->entry = KILN_NO_ID;
  m->is_scheduled = -1;
  return m;
out_free_arena:
  kiln_arena_destroy(m->arena);
out_free_module:
  kiln_free(m);
  return NULL;
}

void kiln_module_destroy(kiln_module *m) {
  if (m == NULL) return;
  for (uint32_t i = 0; i < m->ncomps; i++) kiln_free(m->comps[i]->instrs);
  kiln_free(m->instrs);
  kiln_free(m->comps);
  kiln_arena_destroy(m->arena);
  kiln_free(m);
}

int kiln_module_add_computation(kiln_module *m, const char *name, uint32_t *out) {
  if (m->ncomps == UINT32_MAX - 1) return KILN_ELIMIT;
  void *p = m->comps;
  if (kiln_grow(&p, &m->comp_cap, (size_t)m->ncomps + 1, sizeof *m->comps)) return KILN_ENOMEM;
  m->comps = p;
  kiln_computation *c = kiln_arena_calloc(m->arena, 1, sizeof *c);
  if (c == NULL) return KILN_ENOMEM;
  c->name = kiln_arena_strdup(m->arena, name ? name : "computation");
  if (c->name == NULL) return KILN_ENOMEM;
  c->id = m->ncomps;
  c->root = KILN_NO_ID;
  m->comps[m->ncomps++] = c;
  if (out) *out = c->id;
  return 0;
}

kiln_computation *kiln_module_computation(const kiln_module *m, uint32_t id) {
  return id < m->ncomps ? m->comps[id] : NULL;
}

kiln_computation *kiln_module_find_computation(const kiln_module *m, const char *name) {
  for (uint32_t i = 0; i < m->ncomps; i++)
    if (strcmp(m->comps[i]->name, name) == 0) return m->comps[i];
  return NULL;
}

kiln_computation *kiln_module_entry(const kiln_module *m) {
  return kiln_module_computation(m, m->entry);
}

kiln_instr *kiln_module_add_instr(kiln_module *m, uint32_t comp, kiln_opcode op, const char *name) {
  kiln_computation *c = kiln_module_computation(m, comp);
  if (c == NULL || m->ninstrs >= UINT32_MAX - 1 || c->ninstrs >= UINT32_MAX - 1) return NULL;
  void *p = m->instrs;
  if (kiln_grow(&p, &m->instr_cap, (size_t)m->ninstrs + 1, sizeof *m->instrs)) return NULL;
  m->instrs = p;
  size_t ccap = c->cap;
  p = c->instrs;
  if (kiln_grow(&p, &ccap, (size_t)c->ninstrs + 1, sizeof *c->instrs)) return NULL;
  c->instrs = p;
  c->cap = (uint32_t)ccap;
  kiln_instr *ins = kiln_arena_calloc(m->arena, 1, sizeof *ins);
  if (ins == NULL) return NULL;
  ins->id = m->ninstrs;
  ins->comp = comp;
  ins->op = op;
  ins->async_op = KILN_OP_INVALID;
  ins->shape.dtype = KILN_INVALID;
  if (name) {
    ins->name = kiln_arena_strdup(m->arena, name);
  } else {
    char buf[64];
    snprintf(buf, sizeof buf, "%s.%u", kiln_opcode_name(op), (unsigned)ins->id);
    ins->name = kiln_arena_strdup(m->arena, buf);
  }
  if (ins->name == NULL) return NULL;
  m->instrs[m->ninstrs++] = ins;
  c->instrs[c->ninstrs++] = ins->id;
  return ins;
}

static int set_ids(kiln_module *m, uint32_t **dst, uint32_t *ndst, const uint32_t *ids,
                   uint32_t n) {
  uint32_t *v = NULL;
  if (n) {
    v = kiln_arena_memdup(m->arena, ids, (size_t)n * sizeof *ids);
    if (v == NULL) return KILN_ENOMEM;
  }
  *dst = v;
  *ndst = n;
  return 0;
}

int kiln_instr_set_operands(kiln_module *m, kiln_instr *ins, const kiln_id *ids, uint32_t n) {
  return set_ids(m, &ins->operands, &ins->noperands, ids, n);
}

int kiln_instr_set_called(kiln_module *m, kiln_instr *ins, const uint32_t *comps, uint32_t n) {
  return set_ids(m, &ins->called, &ins->ncalled, comps, n);
}

int kiln_instr_set_control(kiln_module *m, kiln_instr *ins, const kiln_id *ids, uint32_t n) {
  return set_ids(m, &ins->control_preds, &ins->ncontrol, ids, n);
}

int kiln_instr_set_shape(kiln_module *m, kiln_instr *ins, const kiln_shape *shape) {
  return kiln_shape_copy(m->arena, &ins->shape, shape);
}

kiln_attr *kiln_instr_add_attr(kiln_module *m, kiln_instr *ins, kiln_attr_key key) {
  if (key != KILN_ATTR_UNKNOWN) {
    for (uint32_t i = 0; i < ins->nattrs; i++) {
      if (ins->attrs[i].key == key) {
        memset(&ins->attrs[i], 0, sizeof ins->attrs[i]);
        ins->attrs[i].key = key;
        return &ins->attrs[i];
      }
    }
  }
  if (ins->nattrs == ins->attrcap) {
    uint32_t ncap = ins->attrcap ? ins->attrcap * 2 : 4;
    kiln_attr *na = kiln_arena_calloc(m->arena, ncap, sizeof *na);
    if (na == NULL) return NULL;
    if (ins->nattrs) memcpy(na, ins->attrs, ins->nattrs * sizeof *na);
    ins->attrs = na;
    ins->attrcap = ncap;
  }
  kiln_attr *a = &ins->attrs[ins->nattrs++];
  memset(a, 0, sizeof *a);
  a->key = key;
  return a;
}

const kiln_attr *kiln_instr_attr(const kiln_instr *ins, kiln_attr_key key) {
  for (uint32_t i = 0; i < ins->nattrs; i++)
    if (ins->attrs[i].key == key) return &ins->attrs[i];
  return NULL;
}

bool kiln_instr_has_attr(const kiln_instr *ins, kiln_attr_key key) {
  return kiln_instr_attr(ins, key) != NULL;
}

int64_t kiln_instr_attr_int(const kiln_instr *ins, kiln_attr_key key, int64_t dflt) {
  const kiln_attr *a = kiln_instr_attr(ins, key);
  return a ? a->v.i : dflt;
}

const kiln_i64s *kiln_instr_attr_ints(const kiln_instr *ins, kiln_attr_key key) {
  const kiln_attr *a = kiln_instr_attr(ins, key);
  return a ? &a->v.ints : NULL;
}

const char *kiln_instr_attr_str(const kiln_instr *ins, kiln_attr_key key) {
  const kiln_attr *a = kiln_instr_attr(ins, key);
  return a ? a->v.s : NULL;
}

int kiln_instr_set_attr_int(kiln_module *m, kiln_instr *ins, kiln_attr_key key, int64_t v) {
  kiln_attr *a = kiln_instr_add_attr(m, ins, key);
  if (a == NULL) return KILN_ENOMEM;
  a->v.i = v;
  return 0;
}

int kiln_instr_set_attr_ints(kiln_module *m, kiln_instr *ins, kiln_attr_key key, const int64_t *v,
                             uint32_t n) {
  int64_t *copy = NULL;
  if (n) {
    copy = kiln_arena_memdup(m->arena, v, (size_t)n * sizeof *v);
    if (copy == NULL) return KILN_ENOMEM;
  }
  kiln_attr *a = kiln_instr_add_attr(m, ins, key);
  if (a == NULL) return KILN_ENOMEM;
  a->v.ints.v = copy;
  a->v.ints.n = n;
  return 0;
}

int kiln_instr_set_attr_str(kiln_module *m, kiln_instr *ins, kiln_attr_key key, const char *s) {
  const char *copy = kiln_arena_strdup(m->arena, s);
  if (copy == NULL) return KILN_ENOMEM;
  kiln_attr *a = kiln_instr_add_attr(m, ins, key);
  if (a == NULL) return KILN_ENOMEM;
  a->v.s = copy;
  return 0;
}

kiln_instr *kiln_computation_param(const kiln_module *m, const kiln_computation *c, int64_t n) {
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_instr *ins = m->instrs[c->instrs[i]];
    if (ins->op == KILN_OP_PARAMETER && ins->param_number == n) return ins;
  }
  return NULL;
}

uint32_t kiln_computation_nparams(const kiln_module *m, const kiln_computation *c) {
  int64_t hi = -1;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_instr *ins = m->instrs[c->instrs[i]];
    if (ins->op == KILN_OP_PARAMETER && ins->param_number > hi) hi = ins->param_number;
  }
  return (uint32_t)(hi + 1);
}

kiln_instr *kiln_computation_root(const kiln_module *m, const kiln_computation *c) {
  if (c->root != KILN_NO_ID) return m->instrs[c->root];
  if (c->ninstrs) return m->instrs[c->instrs[c->ninstrs - 1]];
  return NULL;
}

void kiln_instr_where(const kiln_module *m, const kiln_instr *ins, char *buf, size_t size) {
  const kiln_computation *c = kiln_module_computation(m, ins->comp);
  snprintf(buf, size, "%s/%s", c && c->name ? c->name : "?", ins->name ? ins->name : "?");
}

bool kiln_reduce_window_is_scan(const kiln_module *m, const kiln_instr *rw, uint32_t *dim) {
  if (rw->op != KILN_OP_REDUCE_WINDOW || rw->noperands != 2 || rw->ncalled != 1) return false;
  const kiln_shape *in = &m->instrs[rw->operands[0]]->shape;
  const kiln_attr *wa = kiln_instr_attr(rw, KILN_ATTR_WINDOW);
  const kiln_window *w = wa ? wa->v.window : NULL;
  if (w == NULL || w->rank != in->rank || !kiln_shape_is_array(&rw->shape) ||
      rw->shape.rank != in->rank || m->instrs[rw->operands[1]]->shape.rank != 0)
    return false;
  uint32_t found = UINT32_MAX;
  for (uint32_t d = 0; d < in->rank; d++) {
    const kiln_window_dim *wd = &w->dims[d];
    if (rw->shape.dims[d] != in->dims[d] || wd->stride != 1 || wd->lhs_dilate != 1 ||
        wd->rhs_dilate != 1 || wd->reversal || wd->pad_hi != 0)
      return false;
    if (wd->size == 1 && wd->pad_lo == 0) continue;
    if (found != UINT32_MAX || in->dims[d] < 2 || wd->size != in->dims[d] ||
        wd->pad_lo != in->dims[d] - 1)
      return false;
    found = d;
  }
  if (found == UINT32_MAX) return false;
  *dim = found;
  return true;
}
