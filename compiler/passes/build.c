/* Instruction builders shared by the simplification passes: fresh names,
 * scalar and splat constants, and purity.
 *
 * Fresh names follow the "<op>.<id>" convention of made-up names; since a
 * parsed module may already hold such a name (XLA numbers its own), each
 * candidate is checked against the computation's name set and a counter
 * suffix added until it is free.
 */
#include "compiler/passes/build.h"

#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/rewrite.h"

int kiln__namer_init(kiln__namer *n, kiln_module *m, uint32_t comp) {
  n->m = m;
  n->comp = comp;
  kiln_strmap_init(&n->names);
  const kiln_computation *c = m->comps[comp];
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const char *name = m->instrs[c->instrs[i]]->name;
    if (name && kiln_strmap_put(&n->names, name, strlen(name), 0, NULL) < 0) {
      kiln_strmap_free(&n->names);
      return KILN_ENOMEM;
    }
  }
  return 0;
}

void kiln__namer_free(kiln__namer *n) { kiln_strmap_free(&n->names); }

static void fresh_name(kiln__namer *n, kiln_opcode op, char *buf, size_t size) {
  snprintf(buf, size, "%s.%u", kiln_opcode_name(op), (unsigned)n->m->ninstrs);
  size_t base = strlen(buf);
  for (unsigned k = 1; kiln_strmap_get(&n->names, buf, strlen(buf), NULL); k++)
    snprintf(buf + base, size - base, ".%u", k);
}

kiln_instr *kiln__build(kiln__namer *n, kiln_opcode op, const kiln_shape *shape,
                        const kiln_id *operands, uint32_t noperands) {
  kiln_module *m = n->m;
  char buf[96];
  fresh_name(n, op, buf, sizeof buf);
  kiln_instr *ins = kiln_module_add_instr(m, n->comp, op, buf);
  if (ins == NULL) return NULL;
  if (kiln_strmap_put(&n->names, ins->name, strlen(ins->name), 0, NULL) < 0) return NULL;
  if (shape && kiln_instr_set_shape(m, ins, shape)) return NULL;
  if (noperands && kiln_instr_set_operands(m, ins, operands, noperands)) return NULL;
  return ins;
}

kiln_instr *kiln__clone(kiln__namer *n, const kiln_instr *src, const kiln_id *operands,
                        uint32_t noperands) {
  char buf[96];
  const char *name = src->name;
  if (name == NULL || kiln_strmap_get(&n->names, name, strlen(name), NULL)) {
    fresh_name(n, src->op, buf, sizeof buf);
    name = buf;
  }
  kiln_instr *ins = kiln_instr_clone(n->m, n->comp, src, operands, noperands, NULL, name);
  if (ins == NULL) return NULL;
  if (kiln_strmap_put(&n->names, ins->name, strlen(ins->name), 0, NULL) < 0) return NULL;
  return ins;
}

kiln_instr *kiln__build_scalar(kiln__namer *n, kiln_dtype t, double v) {
  kiln_shape s;
  if (kiln_shape_make_array(n->m->arena, &s, t, NULL, 0)) return NULL;
  kiln_instr *c = kiln__build(n, KILN_OP_CONSTANT, &s, NULL, 0);
  if (c == NULL) return NULL;
  if (kiln_literal_create(n->m->arena, &s, 0, &c->literal, NULL)) return NULL;
  if (kiln_dtype_is_float(t))
    kiln_literal_set_f64(c->literal, 0, v);
  else if (kiln_dtype_is_unsigned_int(t) || t == KILN_PRED)
    kiln_literal_set_u64(c->literal, 0, v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v);
  else
    kiln_literal_set_s64(c->literal, 0, (int64_t)v);
  return c;
}

kiln_instr *kiln__build_splat(kiln__namer *n, kiln_id scalar, const kiln_shape *shape) {
  if (shape->rank == 0) return n->m->instrs[scalar];
  kiln_instr *b = kiln__build(n, KILN_OP_BROADCAST, shape, &scalar, 1);
  if (b == NULL || kiln_instr_set_attr_ints(n->m, b, KILN_ATTR_DIMENSIONS, NULL, 0)) return NULL;
  return b;
}

static bool has_token(const kiln_shape *s) {
  if (s->dtype == KILN_TOKEN) return true;
  if (!kiln_shape_is_tuple(s)) return false;
  for (uint32_t i = 0; i < s->rank; i++)
    if (has_token(&s->tuple[i])) return true;
  return false;
}

/* The instruction alone, not what it calls. */
static bool self_pure(const kiln_instr *ins) {
  unsigned f = kiln_opcode_flags(ins->op);
  if (f & (KILN_OPF_SIDE_EFFECT | KILN_OPF_ASYNC | KILN_OPF_COLLECTIVE)) return false;
  switch (ins->op) {
  case KILN_OP_INVALID:
  case KILN_OP_RNG:
  case KILN_OP_RNG_BIT_GENERATOR:
  case KILN_OP_RNG_GET_AND_UPDATE_STATE:
  case KILN_OP_OPTIMIZATION_BARRIER:
  case KILN_OP_DOMAIN:
  case KILN_OP_AFTER_ALL:
  case KILN_OP_ADD_DEPENDENCY:
  case KILN_OP_CUSTOM_CALL: return false;
  default: break;
  }
  return !has_token(&ins->shape);
}

bool kiln__instr_is_pure(const kiln_module *m, const kiln_instr *ins, const bool *impure) {
  if (!self_pure(ins)) return false;
  for (uint32_t i = 0; i < ins->ncalled; i++) {
    if (ins->called[i] >= m->ncomps) return false;
    if (impure && impure[ins->called[i]]) return false;
  }
  return true;
}

bool *kiln__impure_computations(const kiln_module *m) {
  bool *impure = kiln_malloc((m->ncomps ? m->ncomps : 1) * sizeof *impure);
  if (impure == NULL) return NULL;
  /* Unreachable computations stay impure: nothing reachable calls them. */
  for (uint32_t c = 0; c < m->ncomps; c++) impure[c] = true;
  uint32_t *order = NULL, n = 0;
  if (kiln_module_post_order(m, &order, &n)) {
    kiln_free(order);
    return impure; /* a call cycle or no entry: everything impure */
  }
  for (uint32_t k = 0; k < n; k++) {
    const kiln_computation *c = m->comps[order[k]];
    bool bad = false;
    for (uint32_t i = 0; i < c->ninstrs && !bad; i++)
      bad = !kiln__instr_is_pure(m, m->instrs[c->instrs[i]], impure);
    impure[order[k]] = bad;
  }
  kiln_free(order);
  return impure;
}
