/* kiln_builder: a thin layer over the IR's own construction calls
 * (compiler/ir/ir.h) that appends to the ENTRY computation and infers each
 * result shape as it goes, so a client can write a program as a chain of
 * calls and find out about a mistake at the instruction that made it.
 *
 * The first error sticks (later calls return KILN_NO_ID and do nothing) and
 * kiln_builder_finish reports it, which is XlaBuilder's habit: code that
 * builds a model needs one check, at the end. Shapes come from
 * kiln_infer_shape; for the ops whose result the operands do not determine
 * (broadcast, reshape, convert) the wanted shape is written first and the
 * inference checks it, as the text parser does with a written shape.
 */
#include <stdio.h>
#include <string.h>

#include "clients/c/kiln.h"
#include "common/alloc.h"
#include "compiler/ir/verify.h"

struct kiln_builder {
  kiln_module *m;
  uint32_t entry;
  uint32_t nparams;
  kiln_status err; /* the first error */
  bool finished;
};

kiln_builder *kiln_builder_create(const char *module_name) {
  kiln_builder *b = kiln_calloc(1, sizeof *b);
  if (b == NULL) return NULL;
  b->m = kiln_module_create(module_name && module_name[0] ? module_name : "module");
  if (b->m == NULL || kiln_module_add_computation(b->m, "main", &b->entry)) {
    kiln_module_destroy(b->m);
    kiln_free(b);
    return NULL;
  }
  b->m->entry = b->entry;
  kiln_module_computation(b->m, b->entry)->is_entry = true;
  return b;
}

void kiln_builder_destroy(kiln_builder *b) {
  if (b == NULL) return;
  if (!b->finished) kiln_module_destroy(b->m);
  kiln_free(b);
}

kiln_module *kiln_builder_module(kiln_builder *b) { return b->finished ? NULL : b->m; }

static bool failed(const kiln_builder *b) { return b->err.code != 0 || b->finished; }

static kiln_id oom(kiln_builder *b) {
  kiln_status_set(&b->err, KILN_ENOMEM, NULL, "out of memory building the module");
  return KILN_NO_ID;
}

static bool valid(kiln_builder *b, kiln_id x, const char *what) {
  if (x < b->m->ninstrs && b->m->instrs[x] && b->m->instrs[x]->comp == b->entry) return true;
  kiln_status_set(&b->err, KILN_EINVAL, NULL, "%s: %s is not an instruction of this builder", what,
                  x == KILN_NO_ID ? "KILN_NO_ID (an earlier call failed)" : "the id");
  return false;
}

/* Appends op with operands; NULL after recording an error. */
static kiln_instr *add(kiln_builder *b, kiln_opcode op, const kiln_id *ops, uint32_t n) {
  if (failed(b)) return NULL;
  for (uint32_t i = 0; i < n; i++)
    if (!valid(b, ops[i], kiln_opcode_name(op))) return NULL;
  kiln_instr *ins = kiln_module_add_instr(b->m, b->entry, op, NULL);
  if (ins == NULL || (n && kiln_instr_set_operands(b->m, ins, ops, n))) {
    oom(b);
    return NULL;
  }
  return ins;
}

/* Infers ins's shape (checking a written one) and returns its id. */
static kiln_id finish_instr(kiln_builder *b, kiln_instr *ins) {
  if (ins == NULL) return KILN_NO_ID;
  kiln_shape s;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_infer_shape(b->m, ins, b->m->arena, &s, &st)) {
    kiln_status_set(&b->err, st.code, st.where, "%s", st.msg);
    return KILN_NO_ID;
  }
  /* A written layout survives: inference leaves layouts absent. */
  if (ins->shape.layout == NULL || !kiln_shape_is_array(&s)) ins->shape = s;
  return ins->id;
}

static int write_shape(kiln_builder *b, kiln_instr *ins, kiln_dtype t, const int64_t *dims,
                       uint32_t rank) {
  kiln_shape s;
  if (kiln_shape_make_array(b->m->arena, &s, t, dims, rank)) return oom(b), KILN_ENOMEM;
  ins->shape = s;
  return 0;
}

kiln_id kiln_builder_parameter(kiln_builder *b, kiln_dtype t, const int64_t *dims, uint32_t rank,
                               const char *name) {
  if (failed(b)) return KILN_NO_ID;
  if (!kiln_dtype_is_array(t) || (rank && dims == NULL)) {
    kiln_status_set(&b->err, KILN_EINVAL, NULL, "parameter %u: not an array type or no dims",
                    b->nparams);
    return KILN_NO_ID;
  }
  for (uint32_t i = 0; i < rank; i++)
    if (dims[i] < 0) {
      kiln_status_set(&b->err, KILN_EINVAL, NULL, "parameter %u: dimension %u is negative",
                      b->nparams, i);
      return KILN_NO_ID;
    }
  kiln_instr *ins = kiln_module_add_instr(b->m, b->entry, KILN_OP_PARAMETER, name);
  if (ins == NULL || write_shape(b, ins, t, dims, rank)) return oom(b);
  ins->param_number = b->nparams++;
  return ins->id;
}

kiln_id kiln_builder_constant(kiln_builder *b, const kiln_literal *value) {
  if (failed(b)) return KILN_NO_ID;
  if (value == NULL) {
    kiln_status_set(&b->err, KILN_EINVAL, NULL, "constant: no value given");
    return KILN_NO_ID;
  }
  kiln_instr *ins = kiln_module_add_instr(b->m, b->entry, KILN_OP_CONSTANT, NULL);
  kiln_literal *copy;
  if (ins == NULL || kiln_literal_clone(b->m->arena, value, &copy, NULL)) return oom(b);
  ins->literal = copy;
  if (kiln_shape_copy(b->m->arena, &ins->shape, &value->shape)) return oom(b);
  return finish_instr(b, ins);
}

kiln_id kiln_builder_scalar(kiln_builder *b, kiln_dtype t, double v) {
  if (failed(b)) return KILN_NO_ID;
  if (!(kiln_dtype_is_float(t) || kiln_dtype_is_integral(t) || t == KILN_PRED)) {
    kiln_status_set(&b->err, KILN_EINVAL, NULL, "scalar: %s is not a real number type",
                    kiln_dtype_name(t));
    return KILN_NO_ID;
  }
  kiln_shape s;
  kiln_literal *lit;
  if (kiln_shape_make_array(b->m->arena, &s, t, NULL, 0) ||
      kiln_literal_create(b->m->arena, &s, 0, &lit, NULL))
    return oom(b);
  if (kiln_dtype_is_float(t))
    kiln_literal_set_f64(lit, 0, v);
  else if (kiln_dtype_is_unsigned_int(t) || t == KILN_PRED)
    kiln_literal_set_u64(lit, 0, (uint64_t)v);
  else
    kiln_literal_set_s64(lit, 0, (int64_t)v);
  kiln_instr *ins = kiln_module_add_instr(b->m, b->entry, KILN_OP_CONSTANT, NULL);
  if (ins == NULL) return oom(b);
  ins->literal = lit;
  ins->shape = lit->shape;
  return finish_instr(b, ins);
}

kiln_id kiln_builder_unary(kiln_builder *b, kiln_opcode op, kiln_id x) {
  if (!failed(b) &&
      (kiln_opcode_arity(op) != 1 || !(kiln_opcode_flags(op) & KILN_OPF_ELEMENTWISE))) {
    kiln_status_set(&b->err, KILN_EINVAL, NULL, "unary: %s is not a one-operand elementwise op",
                    kiln_opcode_name(op));
    return KILN_NO_ID;
  }
  return finish_instr(b, add(b, op, &x, 1));
}

kiln_id kiln_builder_binary(kiln_builder *b, kiln_opcode op, kiln_id x, kiln_id y) {
  if (!failed(b) && (kiln_opcode_arity(op) != 2 ||
                     !(kiln_opcode_flags(op) & KILN_OPF_ELEMENTWISE) || op == KILN_OP_COMPARE)) {
    kiln_status_set(&b->err, KILN_EINVAL, NULL, "binary: %s is not a two-operand elementwise op%s",
                    kiln_opcode_name(op),
                    op == KILN_OP_COMPARE ? " (use kiln_builder_compare)" : "");
    return KILN_NO_ID;
  }
  kiln_id ops[2] = {x, y};
  return finish_instr(b, add(b, op, ops, 2));
}

kiln_id kiln_builder_compare(kiln_builder *b, kiln_cmp_dir dir, kiln_id x, kiln_id y) {
  kiln_id ops[2] = {x, y};
  kiln_instr *ins = add(b, KILN_OP_COMPARE, ops, 2);
  if (ins == NULL) return KILN_NO_ID;
  kiln_attr *at = kiln_instr_add_attr(b->m, ins, KILN_ATTR_DIRECTION);
  if (at == NULL) return oom(b);
  at->v.i = dir;
  return finish_instr(b, ins);
}

kiln_id kiln_builder_select(kiln_builder *b, kiln_id pred, kiln_id on_true, kiln_id on_false) {
  kiln_id ops[3] = {pred, on_true, on_false};
  return finish_instr(b, add(b, KILN_OP_SELECT, ops, 3));
}

kiln_id kiln_builder_convert(kiln_builder *b, kiln_id x, kiln_dtype t) {
  kiln_instr *ins = add(b, KILN_OP_CONVERT, &x, 1);
  if (ins == NULL) return KILN_NO_ID;
  const kiln_shape *s = &b->m->instrs[x]->shape;
  if (!kiln_shape_is_array(s) || !kiln_dtype_is_array(t)) {
    kiln_status_set(&b->err, KILN_EINVAL, NULL, "convert: an array converts to an array type");
    return KILN_NO_ID;
  }
  if (write_shape(b, ins, t, s->dims, s->rank)) return KILN_NO_ID;
  return finish_instr(b, ins);
}

kiln_id kiln_builder_broadcast(kiln_builder *b, kiln_id x, const int64_t *dims, uint32_t rank,
                               const int64_t *map, uint32_t nmap) {
  kiln_instr *ins = add(b, KILN_OP_BROADCAST, &x, 1);
  if (ins == NULL) return KILN_NO_ID;
  if (write_shape(b, ins, b->m->instrs[x]->shape.dtype, dims, rank) ||
      kiln_instr_set_attr_ints(b->m, ins, KILN_ATTR_DIMENSIONS, map, nmap))
    return oom(b);
  return finish_instr(b, ins);
}

kiln_id kiln_builder_reshape(kiln_builder *b, kiln_id x, const int64_t *dims, uint32_t rank) {
  kiln_instr *ins = add(b, KILN_OP_RESHAPE, &x, 1);
  if (ins == NULL) return KILN_NO_ID;
  if (write_shape(b, ins, b->m->instrs[x]->shape.dtype, dims, rank)) return KILN_NO_ID;
  return finish_instr(b, ins);
}

kiln_id kiln_builder_transpose(kiln_builder *b, kiln_id x, const int64_t *perm, uint32_t rank) {
  kiln_instr *ins = add(b, KILN_OP_TRANSPOSE, &x, 1);
  if (ins == NULL) return KILN_NO_ID;
  if (kiln_instr_set_attr_ints(b->m, ins, KILN_ATTR_DIMENSIONS, perm, rank)) return oom(b);
  return finish_instr(b, ins);
}

kiln_id kiln_builder_dot(kiln_builder *b, kiln_id x, kiln_id y) {
  kiln_id ops[2] = {x, y};
  kiln_instr *ins = add(b, KILN_OP_DOT, ops, 2);
  if (ins == NULL) return KILN_NO_ID;
  uint32_t rx = b->m->instrs[x]->shape.rank;
  int64_t lhs = rx ? (int64_t)rx - 1 : 0, rhs = 0;
  if (kiln_instr_set_attr_ints(b->m, ins, KILN_ATTR_LHS_CONTRACTING_DIMS, &lhs, 1) ||
      kiln_instr_set_attr_ints(b->m, ins, KILN_ATTR_RHS_CONTRACTING_DIMS, &rhs, 1))
    return oom(b);
  return finish_instr(b, ins);
}

/* The scalar add computation a sum reduces with, one per element type. */
static int add_computation(kiln_builder *b, kiln_dtype t, uint32_t *out) {
  char name[48];
  snprintf(name, sizeof name, "sum.%s", kiln_dtype_name(t));
  const kiln_computation *have = kiln_module_find_computation(b->m, name);
  if (have) {
    *out = have->id;
    return 0;
  }
  uint32_t cid;
  if (kiln_module_add_computation(b->m, name, &cid)) return KILN_ENOMEM;
  kiln_instr *p[2];
  for (int i = 0; i < 2; i++) {
    p[i] = kiln_module_add_instr(b->m, cid, KILN_OP_PARAMETER, i ? "y" : "x");
    if (p[i] == NULL || kiln_shape_make_array(b->m->arena, &p[i]->shape, t, NULL, 0))
      return KILN_ENOMEM;
    p[i]->param_number = i;
  }
  kiln_instr *sum = kiln_module_add_instr(b->m, cid, KILN_OP_ADD, "sum");
  kiln_id ops[2] = {p[0]->id, p[1]->id};
  if (sum == NULL || kiln_instr_set_operands(b->m, sum, ops, 2) ||
      kiln_shape_make_array(b->m->arena, &sum->shape, t, NULL, 0))
    return KILN_ENOMEM;
  kiln_module_computation(b->m, cid)->root = sum->id;
  *out = cid;
  return 0;
}

kiln_id kiln_builder_reduce_sum(kiln_builder *b, kiln_id x, const int64_t *dims, uint32_t n) {
  if (failed(b) || !valid(b, x, "reduce")) return KILN_NO_ID;
  kiln_dtype t = b->m->instrs[x]->shape.dtype;
  kiln_id zero = kiln_builder_scalar(b, t, 0);
  if (zero == KILN_NO_ID) return KILN_NO_ID;
  uint32_t cid;
  if (add_computation(b, t, &cid)) return oom(b);
  kiln_id ops[2] = {x, zero};
  kiln_instr *ins = add(b, KILN_OP_REDUCE, ops, 2);
  if (ins == NULL) return KILN_NO_ID;
  if (kiln_instr_set_called(b->m, ins, &cid, 1) ||
      kiln_instr_set_attr_ints(b->m, ins, KILN_ATTR_DIMENSIONS, dims, n))
    return oom(b);
  return finish_instr(b, ins);
}

kiln_id kiln_builder_tuple(kiln_builder *b, const kiln_id *elems, uint32_t n) {
  return finish_instr(b, add(b, KILN_OP_TUPLE, elems, n));
}

int kiln_builder_finish(kiln_builder *b, kiln_id root, kiln_module **out, kiln_status *st) {
  *out = NULL;
  if (b->finished)
    return kiln_status_set(st, KILN_EINVAL, NULL, "the builder was already finished");
  if (!failed(b) && valid(b, root, "root")) kiln_module_computation(b->m, b->entry)->root = root;
  if (b->err.code) return kiln_status_set(st, b->err.code, b->err.where, "%s", b->err.msg);
  int rc = kiln_module_verify(b->m, NULL, st);
  if (rc) return rc;
  *out = b->m;
  b->finished = true;
  return 0;
}
