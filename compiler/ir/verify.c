/* The module verifier.
 *
 * It runs in passes, each relying on the ones before: (1) the tables
 * (computations, instructions, ids, owners, names, parameters, roots),
 * (2) every shape and literal on its own (dims, element limits, layouts),
 * (3) the operand and control edges (same computation, defined earlier),
 * (4) the call graph (valid ids, no recursion), (5) each instruction
 * through shape inference, comparing the written result shape with the
 * inferred one, and (6) the module header (entry layout, aliases). The IR
 * may come from a hostile proto, so every id and count is checked before it
 * is used, and nothing recurses without a bound.
 *
 * Result comparison follows XLA's verifier: layouts are ignored; most ops
 * may produce a different floating-point precision than inferred (a reduce
 * with an f32 reducer written as bf16), except those that only move data;
 * a written shape may mark more dimensions dynamic than inference does,
 * never fewer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/deadline.h"
#include "compiler/ir/infer_internal.h"
#include "compiler/ir/verify.h"

#define DEFAULT_MAX_ELEMENTS ((int64_t)1 << 40)
#define NONE UINT32_MAX

typedef struct vctx {
  const kiln_module *m;
  kiln_status *st;
  int64_t max_elements;
  uint32_t max_nesting;
  uint32_t *owner; /* instruction id -> computation listing it, or NONE */
  uint32_t *pos;   /* instruction id -> index in that computation */
} vctx;

static int fail_at(vctx *v, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_at(vctx *v, const char *where, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  kiln_status_vset(v->st, KILN_EVERIFY, where, fmt, ap);
  va_end(ap);
  return KILN_EVERIFY;
}

static const char *cname(const kiln_computation *c) { return c->name ? c->name : "?"; }

/* ---- pass 1: tables ---------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Reports the first name that appears twice in `names` (sorted in place). */
static const char *first_duplicate(const char **names, uint32_t n) {
  qsort(names, n, sizeof *names, cmp_str);
  for (uint32_t i = 1; i < n; i++)
    if (strcmp(names[i], names[i - 1]) == 0) return names[i];
  return NULL;
}

static int check_entry(vctx *v) {
  const kiln_module *m = v->m;
  if (m->ncomps == 0) return fail_at(v, NULL, "module has no computations");
  if (m->comps == NULL) return fail_at(v, NULL, "module's computation list is missing");
  for (uint32_t i = 0; i < m->ncomps; i++) {
    if (m->comps[i] == NULL) return fail_at(v, NULL, "computation #%u is missing", (unsigned)i);
    if (m->comps[i]->id != i)
      return fail_at(v, cname(m->comps[i]), "computation #%u says it has id %u", (unsigned)i,
                     (unsigned)m->comps[i]->id);
    if (m->comps[i]->name == NULL)
      return fail_at(v, NULL, "computation #%u has no name", (unsigned)i);
  }
  if (m->entry >= m->ncomps) {
    for (uint32_t i = 0; i < m->ncomps; i++)
      if (m->comps[i]->is_entry)
        return fail_at(v, cname(m->comps[i]),
                       "computation %%%s is marked ENTRY but the module "
                       "does not name it as its entry",
                       cname(m->comps[i]));
    return fail_at(v, NULL, "module has no ENTRY computation");
  }
  for (uint32_t i = 0; i < m->ncomps; i++)
    if (i != m->entry && m->comps[i]->is_entry)
      return fail_at(v, cname(m->comps[i]), "module has two ENTRY computations: %%%s and %%%s",
                     cname(m->comps[m->entry]), cname(m->comps[i]));
  return 0;
}

static int check_comp_names(vctx *v) {
  const kiln_module *m = v->m;
  const char **names = kiln_calloc(m->ncomps, sizeof *names);
  if (names == NULL) return kiln_status_set(v->st, KILN_ENOMEM, NULL, "out of memory");
  for (uint32_t i = 0; i < m->ncomps; i++) names[i] = m->comps[i]->name;
  const char *dup = first_duplicate(names, m->ncomps);
  int rc = dup ? fail_at(v, dup, "computation name %%%s is used twice", dup) : 0;
  kiln_free(names);
  return rc;
}

static int check_instr_table(vctx *v) {
  const kiln_module *m = v->m;
  if (m->ninstrs && m->instrs == NULL)
    return fail_at(v, NULL, "module's instruction list is missing");
  for (uint32_t i = 0; i < m->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[i];
    if (ins == NULL) return fail_at(v, NULL, "instruction id %u is missing", (unsigned)i);
    if (ins->id != i)
      return fail_at(v, NULL, "instruction #%u says it has id %u", (unsigned)i, (unsigned)ins->id);
    if (ins->name == NULL) return fail_at(v, NULL, "instruction #%u has no name", (unsigned)i);
    if (ins->comp >= m->ncomps && ins->comp != KILN_NO_ID)
      return fail_at(v, ins->name,
                     "instruction %%%s belongs to computation id %u, which does not "
                     "exist",
                     ins->name, (unsigned)ins->comp);
  }
  return 0;
}

static int check_params(vctx *v, const kiln_computation *c) {
  const kiln_module *m = v->m;
  uint32_t np = 0;
  for (uint32_t k = 0; k < c->ninstrs; k++) np += m->instrs[c->instrs[k]]->op == KILN_OP_PARAMETER;
  if (np == 0) return 0;
  kiln_id *by_num = kiln_malloc(np * sizeof *by_num);
  if (by_num == NULL) return kiln_status_set(v->st, KILN_ENOMEM, NULL, "out of memory");
  for (uint32_t k = 0; k < np; k++) by_num[k] = KILN_NO_ID;
  int rc = 0;
  char where[KILN_STATUS_WHERE_MAX];
  for (uint32_t k = 0; k < c->ninstrs && !rc; k++) {
    const kiln_instr *p = m->instrs[c->instrs[k]];
    if (p->op != KILN_OP_PARAMETER) continue;
    kiln__where(m, p, where, sizeof where);
    if (p->param_number < 0 || p->param_number >= np)
      rc = fail_at(v, where,
                   "parameter: number %lld is out of range: %%%s has %u parameters, "
                   "numbered 0 to %u",
                   (long long)p->param_number, cname(c), (unsigned)np, (unsigned)np - 1);
    else if (by_num[p->param_number] != KILN_NO_ID)
      rc = fail_at(v, where, "parameter: number %lld is already used by %%%s",
                   (long long)p->param_number, m->instrs[by_num[p->param_number]]->name);
    else
      by_num[p->param_number] = p->id;
  }
  kiln_free(by_num);
  return rc;
}

static int check_computation(vctx *v, const kiln_computation *c) {
  const kiln_module *m = v->m;
  if (c->ninstrs == 0)
    return fail_at(v, cname(c), "computation %%%s has no instructions", cname(c));
  if (c->instrs == NULL)
    return fail_at(v, cname(c), "computation %%%s has no instruction list", cname(c));
  for (uint32_t k = 0; k < c->ninstrs; k++) {
    kiln_id id = c->instrs[k];
    if (id >= m->ninstrs)
      return fail_at(v, cname(c), "computation %%%s lists instruction id %u, which does not exist",
                     cname(c), (unsigned)id);
    const kiln_instr *ins = m->instrs[id];
    if (v->owner[id] != NONE)
      return fail_at(v, cname(c), "instruction %%%s is listed twice (in %%%s and %%%s)", ins->name,
                     cname(m->comps[v->owner[id]]), cname(c));
    if (ins->comp == KILN_NO_ID)
      return fail_at(v, cname(c), "instruction %%%s is listed in %%%s but was removed from it",
                     ins->name, cname(c));
    if (ins->comp != c->id)
      return fail_at(v, cname(c), "instruction %%%s is listed in %%%s but says it belongs to %%%s",
                     ins->name, cname(c), cname(m->comps[ins->comp]));
    v->owner[id] = c->id;
    v->pos[id] = k;
  }
  if (c->root != KILN_NO_ID && (c->root >= m->ninstrs || v->owner[c->root] != c->id))
    return fail_at(v, cname(c),
                   "computation %%%s has root id %u, which is not one of its "
                   "instructions",
                   cname(c), (unsigned)c->root);
  const char **names = kiln_calloc(c->ninstrs, sizeof *names);
  if (names == NULL) return kiln_status_set(v->st, KILN_ENOMEM, NULL, "out of memory");
  for (uint32_t k = 0; k < c->ninstrs; k++) names[k] = m->instrs[c->instrs[k]]->name;
  const char *dup = first_duplicate(names, c->ninstrs);
  char where[KILN_STATUS_WHERE_MAX];
  snprintf(where, sizeof where, "%s/%s", cname(c), dup ? dup : "");
  int rc = dup ? fail_at(v, where, "instruction name %%%s is used twice in computation %%%s", dup,
                         cname(c))
               : 0;
  kiln_free(names);
  return rc ? rc : check_params(v, c);
}

static int check_tables(vctx *v) {
  const kiln_module *m = v->m;
  int rc;
  if ((rc = check_entry(v)) || (rc = check_comp_names(v)) || (rc = check_instr_table(v))) return rc;
  for (uint32_t i = 0; i < m->ncomps; i++)
    if ((rc = check_computation(v, m->comps[i]))) return rc;
  /* Instructions removed by a pass stay in the table with comp KILN_NO_ID
   * (see rewrite.h); they are ignored unless something still uses them. */
  for (uint32_t i = 0; i < m->ninstrs; i++)
    if (v->owner[i] == NONE && m->instrs[i]->comp != KILN_NO_ID)
      return fail_at(v, m->instrs[i]->name,
                     "instruction %%%s is not listed in its computation "
                     "%%%s",
                     m->instrs[i]->name, cname(m->comps[m->instrs[i]->comp]));
  return 0;
}

/* ---- pass 2: shapes and literals --------------------------------------------------- */

/* Writes what is wrong with `s` into msg, or returns true. */
static bool shape_valid(const vctx *v, const kiln_shape *s, int depth, char *msg, size_t n) {
  if (depth > KILN__MAX_TUPLE_DEPTH) {
    snprintf(msg, n, "tuples nest more than %d deep", KILN__MAX_TUPLE_DEPTH);
    return false;
  }
  if ((unsigned)s->dtype >= KILN_DTYPE_COUNT || s->dtype == KILN_INVALID) {
    snprintf(msg, n, "element type %d is not valid", (int)s->dtype);
    return false;
  }
  if (kiln_shape_is_tuple(s)) {
    if (s->rank && s->tuple == NULL) {
      snprintf(msg, n, "a tuple of %u elements has no element list", (unsigned)s->rank);
      return false;
    }
    for (uint32_t i = 0; i < s->rank; i++)
      if (!shape_valid(v, &s->tuple[i], depth + 1, msg, n)) return false;
    return true;
  }
  if (!kiln_shape_is_array(s)) {
    if (s->rank == 0) return true;
    snprintf(msg, n, "%s has rank %u", kiln_dtype_name(s->dtype), (unsigned)s->rank);
    return false;
  }
  if (s->rank && s->dims == NULL) {
    snprintf(msg, n, "an array of rank %u has no dimensions", (unsigned)s->rank);
    return false;
  }
  for (uint32_t i = 0; i < s->rank; i++)
    if (s->dims[i] < 0) {
      snprintf(msg, n, "dimension %u has size %lld", (unsigned)i, (long long)s->dims[i]);
      return false;
    }
  int64_t e = kiln_shape_elements(s);
  if (e < 0 || e > v->max_elements) {
    kiln_sbuf b = KILN_SBUF_INIT;
    kiln_shape_print_short(&b, s);
    if (e < 0)
      snprintf(msg, n, "%s has more elements than an int64 holds", kiln_sbuf_str(&b));
    else
      snprintf(msg, n, "%s has %lld elements, over the limit of %lld", kiln_sbuf_str(&b),
               (long long)e, (long long)v->max_elements);
    kiln_sbuf_free(&b);
    return false;
  }
  const kiln_layout *l = s->layout;
  if (l) {
    if (l->rank != s->rank || (l->rank && l->minor_to_major == NULL)) {
      snprintf(msg, n, "the layout has %u entries for rank %u", (unsigned)l->rank,
               (unsigned)s->rank);
      return false;
    }
    for (uint32_t i = 0; i < l->rank; i++) {
      int64_t d = l->minor_to_major[i];
      bool dup = false;
      for (uint32_t j = 0; j < i; j++) dup |= l->minor_to_major[j] == d;
      if (d < 0 || d >= s->rank || dup) {
        snprintf(msg, n, "the layout is not a permutation of the %u dimensions", (unsigned)s->rank);
        return false;
      }
    }
  }
  return true;
}

static bool literal_valid(const kiln_literal *lit, int depth) {
  if (depth > KILN__MAX_TUPLE_DEPTH) return false;
  const kiln_shape *s = &lit->shape;
  if (kiln_shape_is_tuple(s)) {
    if (s->rank && lit->elems == NULL) return false;
    for (uint32_t i = 0; i < s->rank; i++)
      if (lit->elems[i] == NULL || !literal_valid(lit->elems[i], depth + 1)) return false;
    return true;
  }
  if (!kiln_shape_is_array(s)) return true;
  int64_t bytes = kiln_shape_bytes(s);
  return bytes >= 0 && lit->nbytes == (size_t)bytes && (bytes == 0 || lit->data != NULL);
}

static int check_shapes(vctx *v) {
  const kiln_module *m = v->m;
  char msg[512], where[KILN_STATUS_WHERE_MAX];
  for (uint32_t i = 0; i < m->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[i];
    if (v->owner[i] == NONE) continue; /* removed */
    kiln__where(m, ins, where, sizeof where);
    const char *op = kiln_opcode_name(ins->op);
    if (ins->shape.dtype == KILN_INVALID)
      return fail_at(v, where, "%s: the instruction has no result shape", op);
    if (!shape_valid(v, &ins->shape, 0, msg, sizeof msg))
      return fail_at(v, where, "%s: result shape: %s", op, msg);
    if (ins->op == KILN_OP_CONSTANT && ins->literal) {
      if (!shape_valid(v, &ins->literal->shape, 0, msg, sizeof msg))
        return fail_at(v, where, "constant: literal shape: %s", msg);
      if (!literal_valid(ins->literal, 0))
        return fail_at(v, where, "constant: the literal's data does not match its shape");
    }
  }
  return 0;
}

/* ---- pass 3: edges ---------------------------------------------------------------------- */

static int check_edge(vctx *v, const kiln_instr *ins, kiln_id id, const char *what, uint32_t k) {
  const kiln_module *m = v->m;
  char where[KILN_STATUS_WHERE_MAX];
  kiln__where(m, ins, where, sizeof where);
  const char *op = kiln_opcode_name(ins->op);
  if (id >= m->ninstrs)
    return fail_at(v, where, "%s: %s %u has id %u, which is not an instruction", op, what,
                   (unsigned)k, (unsigned)id);
  const kiln_instr *o = m->instrs[id];
  if (v->owner[id] == NONE)
    return fail_at(v, where, "%s: %s %u (%%%s) was removed from its computation", op, what,
                   (unsigned)k, o->name);
  if (v->owner[id] != v->owner[ins->id])
    return fail_at(v, where, "%s: %s %u (%%%s) belongs to computation %%%s, not %%%s", op, what,
                   (unsigned)k, o->name, cname(m->comps[v->owner[id]]),
                   cname(m->comps[v->owner[ins->id]]));
  if (id == ins->id)
    return fail_at(v, where, "%s: %s %u is the instruction itself", op, what, (unsigned)k);
  if (v->pos[id] > v->pos[ins->id])
    return fail_at(v, where, "%s: %s %u (%%%s) is used before its definition", op, what,
                   (unsigned)k, o->name);
  return 0;
}

static int check_edges(vctx *v) {
  const kiln_module *m = v->m;
  int rc;
  for (uint32_t i = 0; i < m->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[i];
    if (v->owner[i] == NONE) continue; /* removed */
    if ((ins->noperands && ins->operands == NULL) ||
        (ins->ncontrol && ins->control_preds == NULL) || (ins->ncalled && ins->called == NULL)) {
      char where[KILN_STATUS_WHERE_MAX];
      kiln__where(m, ins, where, sizeof where);
      return fail_at(v, where, "%s: an operand, control or called list is missing",
                     kiln_opcode_name(ins->op));
    }
    for (uint32_t k = 0; k < ins->noperands; k++)
      if ((rc = check_edge(v, ins, ins->operands[k], "operand", k))) return rc;
    for (uint32_t k = 0; k < ins->ncontrol; k++)
      if ((rc = check_edge(v, ins, ins->control_preds[k], "control predecessor", k))) return rc;
  }
  return 0;
}

/* ---- pass 4: call graph ------------------------------------------------------------------ */

/* Iterative DFS over computations; a call into a computation that is on
 * the current path is recursion. The path is kept to name the cycle. */
typedef struct frame {
  uint32_t comp;
  uint32_t k;    /* next instruction index */
  uint32_t call; /* next called index within that instruction */
} frame;

static int report_cycle(vctx *v, const frame *stack, uint32_t depth, uint32_t target,
                        const kiln_instr *at) {
  const kiln_module *m = v->m;
  kiln_sbuf b = KILN_SBUF_INIT;
  uint32_t from = 0;
  while (stack[from].comp != target) from++;
  for (uint32_t i = from; i < depth; i++)
    kiln_sbuf_printf(&b, "%%%s -> ", cname(m->comps[stack[i].comp]));
  kiln_sbuf_printf(&b, "%%%s", cname(m->comps[target]));
  char where[KILN_STATUS_WHERE_MAX];
  kiln__where(m, at, where, sizeof where);
  int rc = fail_at(v, where, "%s: recursive call: %s", kiln_opcode_name(at->op), kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return rc;
}

/* The longest chain of calls from c: 1 + the deepest of its callees, all
 * of which are done when c is (no recursion). */
static uint32_t comp_height(const kiln_module *m, uint32_t comp, const uint32_t *height) {
  const kiln_computation *c = m->comps[comp];
  uint32_t h = 0;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < ins->ncalled; k++)
      if (height[ins->called[k]] > h) h = height[ins->called[k]];
  }
  return h + 1;
}

/* The deepest chain, from `top` down, named in the message: its first few
 * and last links ("%main -> %c9 -> ... -> %c0"). */
static int report_nesting(vctx *v, uint32_t top, const uint32_t *height, uint32_t max) {
  const kiln_module *m = v->m;
  kiln_sbuf b = KILN_SBUF_INIT;
  uint32_t depth = height[top] - 1, comp = top;
  for (uint32_t step = 0; step <= depth; step++) {
    if (step < 6 || step + 3 > depth)
      kiln_sbuf_printf(&b, "%s%%%.64s", step ? " -> " : "", cname(m->comps[comp]));
    else if (step == 6)
      kiln_sbuf_printf(&b, " -> ... (%u more)", (unsigned)(depth - 8));
    const kiln_computation *c = m->comps[comp];
    uint32_t next = NONE;
    for (uint32_t i = 0; i < c->ninstrs && next == NONE; i++) {
      const kiln_instr *ins = m->instrs[c->instrs[i]];
      for (uint32_t k = 0; k < ins->ncalled && next == NONE; k++)
        if (height[ins->called[k]] + 1 == height[comp]) next = ins->called[k];
    }
    if (next == NONE) break;
    comp = next;
  }
  int rc = fail_at(v, cname(m->comps[top]),
                   "computations nest %u deep (calls, whiles, conditionals, fusions and the "
                   "other called computations), more than the limit of %u (max-nesting): %s",
                   (unsigned)depth, (unsigned)max, kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return rc;
}

/* Called ids must exist; then an iterative DFS over computations: a call
 * into a computation on the current path is recursion, and on the way
 * back each computation's height (longest chain of calls below it) is
 * known, so the nesting depth is checked here, before any walk that
 * recurses into called computations (lowering, transforms, printing). */
static int check_call_graph(vctx *v) {
  const kiln_module *m = v->m;
  char where[KILN_STATUS_WHERE_MAX];
  for (uint32_t i = 0; i < m->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[i];
    if (v->owner[i] == NONE) continue; /* removed */
    for (uint32_t k = 0; k < ins->ncalled; k++)
      if (ins->called[k] >= m->ncomps) {
        kiln__where(m, ins, where, sizeof where);
        return fail_at(v, where, "%s: called computation %u has id %u, which does not exist",
                       kiln_opcode_name(ins->op), (unsigned)k, (unsigned)ins->called[k]);
      }
  }
  uint8_t *state = kiln_calloc(m->ncomps, 1); /* 0 new, 1 on path, 2 done */
  uint32_t *height = kiln_calloc(m->ncomps, sizeof *height);
  frame *stack = kiln_calloc(m->ncomps, sizeof *stack);
  int rc = 0;
  if (state == NULL || height == NULL || stack == NULL) {
    rc = kiln_status_set(v->st, KILN_ENOMEM, NULL, "out of memory");
    goto out_free;
  }
  uint32_t top = NONE;
  for (uint32_t root = 0; root < m->ncomps && !rc; root++) {
    if (state[root]) continue;
    uint32_t depth = 0;
    stack[depth++] = (frame){root, 0, 0};
    state[root] = 1;
    while (depth && !rc) {
      frame *f = &stack[depth - 1];
      const kiln_computation *c = m->comps[f->comp];
      if (f->k >= c->ninstrs) {
        state[f->comp] = 2;
        height[f->comp] = comp_height(m, f->comp, height);
        if (top == NONE || height[f->comp] > height[top]) top = f->comp;
        depth--;
        continue;
      }
      const kiln_instr *ins = m->instrs[c->instrs[f->k]];
      if (f->call >= ins->ncalled) {
        f->k++;
        f->call = 0;
        continue;
      }
      uint32_t callee = ins->called[f->call++];
      if (state[callee] == 1)
        rc = report_cycle(v, stack, depth, callee, ins);
      else if (state[callee] == 0) {
        state[callee] = 1;
        stack[depth++] = (frame){callee, 0, 0};
      }
    }
  }
  if (rc == 0 && top != NONE && height[top] - 1 > v->max_nesting)
    rc = report_nesting(v, top, height, v->max_nesting);
out_free:
  kiln_free(state);
  kiln_free(height);
  kiln_free(stack);
  return rc;
}

/* ---- pass 5: instructions ------------------------------------------------------------------ */

/* Ops that only move data keep their exact element type (XLA's list). */
static bool strict_precision(kiln_opcode op) {
  switch (op) {
  case KILN_OP_BITCAST:
  case KILN_OP_CALL:
  case KILN_OP_CONDITIONAL:
  case KILN_OP_CONSTANT:
  case KILN_OP_COPY_DONE:
  case KILN_OP_COPY_START:
  case KILN_OP_CUSTOM_CALL:
  case KILN_OP_DYNAMIC_UPDATE_SLICE:
  case KILN_OP_GET_TUPLE_ELEMENT:
  case KILN_OP_INFEED:
  case KILN_OP_OUTFEED:
  case KILN_OP_OPTIMIZATION_BARRIER:
  case KILN_OP_PARAMETER:
  case KILN_OP_RECV:
  case KILN_OP_RECV_DONE:
  case KILN_OP_SEND:
  case KILN_OP_SEND_DONE:
  case KILN_OP_TUPLE:
  case KILN_OP_WHILE:
  case KILN_OP_ASYNC_START:
  case KILN_OP_ASYNC_UPDATE:
  case KILN_OP_ASYNC_DONE: return true;
  default: return false;
  }
}

/* Written against inferred: same structure and dims, types equal (or both
 * floating point when !strict), every dimension inference marks dynamic
 * also dynamic in the written shape. */
static bool result_matches(const kiln_shape *w, const kiln_shape *inf, bool strict, int depth) {
  if (depth > KILN__MAX_TUPLE_DEPTH) return false;
  if (kiln_shape_is_tuple(w) || kiln_shape_is_tuple(inf)) {
    if (w->dtype != inf->dtype || w->rank != inf->rank) return false;
    for (uint32_t i = 0; i < w->rank; i++)
      if (!result_matches(&w->tuple[i], &inf->tuple[i], strict, depth + 1)) return false;
    return true;
  }
  if (!kiln__compatible(w, inf, !strict)) return false;
  for (uint32_t i = 0; i < inf->rank; i++)
    if (kiln__is_dyn(inf, i) && !kiln__is_dyn(w, i)) return false;
  return true;
}

static int check_instr(vctx *v, const kiln_instr *ins, kiln_arena *scratch) {
  const kiln_module *m = v->m;
  char where[KILN_STATUS_WHERE_MAX];
  if ((unsigned)ins->op >= KILN_OP_COUNT || ins->op == KILN_OP_INVALID) {
    kiln__where(m, ins, where, sizeof where);
    return fail_at(v, where, "opcode %d is not a valid opcode", (int)ins->op);
  }
  kiln__ictx cx = {.m = m, .ins = ins, .st = v->st, .written = &ins->shape};
  if (ins->ncalled && !(kiln_opcode_flags(ins->op) & KILN_OPF_CALLS) &&
      !(ins->op == KILN_OP_ASYNC_UPDATE || ins->op == KILN_OP_ASYNC_DONE))
    return kiln__fail(&cx, "takes no called computations, found %u", (unsigned)ins->ncalled);
  cx.out = cx.tmp = scratch;
  kiln_shape inf;
  int rc = kiln__infer(&cx, &inf);
  if (rc == 0 && !result_matches(&ins->shape, &inf, strict_precision(ins->op), 0))
    rc = kiln__fail(&cx, "result shape %s does not match the inferred shape %s",
                    kiln__sh(&cx, &ins->shape), kiln__sh(&cx, &inf));
  return rc;
}

/* One scratch arena serves many instructions; it is renewed once it holds
 * more than this, so big modules run in bounded memory. */
#define SCRATCH_RENEW_BYTES (1u << 20)

static int check_instrs(vctx *v) {
  const kiln_module *m = v->m;
  kiln_arena *scratch = kiln_arena_create();
  int rc = 0;
  for (uint32_t c = 0; c < m->ncomps && !rc; c++) {
    const kiln_computation *comp = m->comps[c];
    for (uint32_t k = 0; k < comp->ninstrs && !rc; k++) {
      if (scratch && kiln_arena_used(scratch) > SCRATCH_RENEW_BYTES) {
        kiln_arena_destroy(scratch);
        scratch = kiln_arena_create();
      }
      if (scratch == NULL) return kiln_status_set(v->st, KILN_ENOMEM, NULL, "out of memory");
      rc = check_instr(v, m->instrs[comp->instrs[k]], scratch);
      if (rc == 0 && (k & 255) == 0) rc = kiln__deadline_check("verify", v->st);
    }
  }
  kiln_arena_destroy(scratch);
  return rc;
}

/* ---- pass 6: header ------------------------------------------------------------------------ */

static int check_entry_layout(vctx *v) {
  const kiln_module *m = v->m;
  const kiln_program_shape *ps = m->entry_layout;
  const kiln_computation *e = m->comps[m->entry];
  if (ps == NULL) return 0;
  uint32_t np = kiln_computation_nparams(m, e);
  char msg[512];
  kiln_sbuf a = KILN_SBUF_INIT, b = KILN_SBUF_INIT;
  int rc = 0;
  if (ps->nparams && ps->params == NULL)
    return fail_at(v, cname(e),
                   "entry_computation_layout: "
                   "parameter list is missing");
  for (uint32_t i = 0; i < ps->nparams && !rc; i++)
    if (!shape_valid(v, &ps->params[i], 0, msg, sizeof msg))
      rc = fail_at(v, cname(e), "entry_computation_layout: parameter %u: %s", (unsigned)i, msg);
  if (!rc && !shape_valid(v, &ps->result, 0, msg, sizeof msg))
    rc = fail_at(v, cname(e), "entry_computation_layout: result: %s", msg);
  /* Real tooling accepts a layout whose parameter count differs from the
   * entry's (it is then ignored), so only matching counts are compared. */
  if (rc || ps->nparams != np) return rc;
  for (uint32_t i = 0; i < np && !rc; i++) {
    const kiln_instr *p = kiln_computation_param(m, e, i);
    if (p && !kiln__compatible(&ps->params[i], &p->shape, false)) {
      kiln_shape_print_short(&a, &ps->params[i]);
      kiln_shape_print_short(&b, &p->shape);
      rc = fail_at(v, cname(e),
                   "entry_computation_layout: parameter %u is %s but parameter %%%s "
                   "has shape %s",
                   (unsigned)i, kiln_sbuf_str(&a), p->name, kiln_sbuf_str(&b));
    }
  }
  const kiln_instr *root = kiln_computation_root(m, e);
  if (!rc && root && !kiln__compatible(&ps->result, &root->shape, false)) {
    kiln_shape_print_short(&a, &ps->result);
    kiln_shape_print_short(&b, &root->shape);
    rc = fail_at(v, cname(e),
                 "entry_computation_layout: the result is %s but root %%%s has "
                 "shape %s",
                 kiln_sbuf_str(&a), root->name, kiln_sbuf_str(&b));
  }
  kiln_sbuf_free(&a);
  kiln_sbuf_free(&b);
  return rc;
}

static const char *index_text(char *buf, size_t n, const kiln_i64s *ix) {
  size_t k = (size_t)snprintf(buf, n, "{");
  for (uint32_t i = 0; i < ix->n && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)ix->v[i]);
  if (k < n) snprintf(buf + k, n - k, "}");
  return buf;
}

static int check_aliases(vctx *v) {
  const kiln_module *m = v->m;
  const kiln_computation *e = m->comps[m->entry];
  const kiln_instr *root = kiln_computation_root(m, e);
  uint32_t np = kiln_computation_nparams(m, e);
  char ob[128], pb[128];
  if (m->naliases && m->aliases == NULL)
    return fail_at(v, NULL, "input_output_alias: list is missing");
  for (uint32_t i = 0; i < m->naliases; i++) {
    const kiln_alias *al = &m->aliases[i];
    if ((al->output_index.n && !al->output_index.v) || (al->param_index.n && !al->param_index.v))
      return fail_at(v, NULL, "input_output_alias: entry %u has a missing index", (unsigned)i);
    index_text(ob, sizeof ob, &al->output_index);
    index_text(pb, sizeof pb, &al->param_index);
    const kiln_shape *os =
        kiln_shape_subshape(&root->shape, al->output_index.v, al->output_index.n);
    if (os == NULL)
      return fail_at(v, NULL, "input_output_alias: output %s is not an index into the result", ob);
    if (al->param_number < 0 || al->param_number >= np)
      return fail_at(v, NULL,
                     "input_output_alias: output %s names parameter %lld, but the entry "
                     "has %u parameters",
                     ob, (long long)al->param_number, (unsigned)np);
    const kiln_instr *p = kiln_computation_param(m, e, al->param_number);
    const kiln_shape *ps = kiln_shape_subshape(&p->shape, al->param_index.v, al->param_index.n);
    if (ps == NULL)
      return fail_at(v, NULL, "input_output_alias: %s is not an index into parameter %lld", pb,
                     (long long)al->param_number);
    if (!kiln_shape_is_array(os) || !kiln_shape_is_array(ps) ||
        kiln_shape_bytes(os) != kiln_shape_bytes(ps))
      return fail_at(v, NULL,
                     "input_output_alias: output %s and parameter %lld at %s differ in "
                     "size",
                     ob, (long long)al->param_number, pb);
    for (uint32_t j = 0; j < i; j++) {
      const kiln_i64s *x = &m->aliases[j].output_index;
      if (x->n == al->output_index.n &&
          (x->n == 0 || memcmp(x->v, al->output_index.v, x->n * sizeof *x->v) == 0))
        return fail_at(v, NULL, "input_output_alias: output %s is aliased twice", ob);
    }
  }
  return 0;
}

int kiln_module_verify(const kiln_module *m, const kiln_verify_options *opts, kiln_status *st) {
  if (m == NULL) return kiln_status_set(st, KILN_EINVAL, NULL, "kiln_module_verify: NULL module");
  vctx v = {.m = m, .st = st, .max_elements = DEFAULT_MAX_ELEMENTS};
  if (opts && opts->max_elements > 0) v.max_elements = opts->max_elements;
  v.max_nesting = opts && opts->max_nesting ? opts->max_nesting : KILN_VERIFY_DEFAULT_MAX_NESTING;
  if (v.max_nesting > KILN_VERIFY_MAX_NESTING) v.max_nesting = KILN_VERIFY_MAX_NESTING;
  size_t n = m->ninstrs ? m->ninstrs : 1;
  v.owner = kiln_malloc(n * sizeof *v.owner);
  v.pos = kiln_malloc(n * sizeof *v.pos);
  int rc;
  if (v.owner == NULL || v.pos == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
    goto out_free;
  }
  for (uint32_t i = 0; i < m->ninstrs; i++) v.owner[i] = NONE;
  if ((rc = check_tables(&v)) || (rc = check_shapes(&v)) || (rc = check_edges(&v)) ||
      (rc = check_call_graph(&v)) || (rc = check_instrs(&v)) || (rc = check_entry_layout(&v)) ||
      (rc = check_aliases(&v)))
    goto out_free;
out_free:
  kiln_free(v.owner);
  kiln_free(v.pos);
  return rc;
}
