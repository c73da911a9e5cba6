/* The reference interpreter's driver: evaluating computations, the literal
 * bookkeeping every handler shares, dispatch, and control flow (while,
 * conditional, call, fusion, async wrappers, tuples, tokens).
 *
 * A computation is evaluated by walking its instruction list in order. Each
 * value is a heap literal; a use count per instruction frees a value as soon
 * as its last user has run, so peak memory follows the live values, and the
 * live-byte total is checked against the limit on every allocation.
 * Parameters are borrowed from the caller, never copied. Reducers,
 * comparators and combiners (computations of scalars only) take a fast path
 * on kiln__interp_scalar values that allocates nothing per call. Nothing here trusts
 * the module to be verified: operands are checked to be defined and in the
 * same computation, calls are depth-limited, loops are bounded.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/thread.h"
#include "compiler/eval/interp_internal.h"

#define MAX_CALL_DEPTH KILN_NESTING_CAPACITY
#define DEFAULT_MAX_LIVE ((size_t)8 << 30)
#define DEFAULT_MAX_WHILE 1000000000ull

struct kiln__interp_comp_info {
  int8_t scalar;                /* -1 not yet known, 0 no, 1 a computation of scalars */
  kiln__interp_scalar *scratch; /* scalar path: one value per instruction */
};

/* ---- errors and time ---------------------------------------------------- */

int kiln__interp_fail(kiln__interp_ctx *c, const kiln_instr *ins, int code, const char *fmt, ...) {
  char where[KILN_STATUS_WHERE_MAX];
  where[0] = '\0';
  if (ins) kiln_instr_where(c->m, ins, where, sizeof where);
  va_list ap;
  va_start(ap, fmt);
  kiln_status_vset(c->st, code, where, fmt, ap);
  va_end(ap);
  return code;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int kiln__interp_check_time(kiln__interp_ctx *c, const kiln_instr *ins) {
  if (c->opts.cancel && atomic_load_explicit(c->opts.cancel, memory_order_relaxed))
    return kiln__interp_fail(c, ins, KILN_ECANCELED, "%s %s: evaluation cancelled",
                             kiln_opcode_name(ins->op), ins->name);
  if (c->deadline <= 0 || now_seconds() < c->deadline) return 0;
  return kiln__interp_fail(c, ins, KILN_ELIMIT, "%s %s: evaluation ran past the time limit of %g s",
                           kiln_opcode_name(ins->op), ins->name, c->opts.timeout_seconds);
}

/* ---- literals ----------------------------------------------------------- */

static int64_t shape_total_bytes(const kiln_shape *s) {
  if (kiln_shape_is_tuple(s)) {
    int64_t t = 0;
    for (uint32_t i = 0; i < s->rank; i++) {
      int64_t b = shape_total_bytes(&s->tuple[i]);
      if (b < 0 || t > INT64_MAX - b) return -1;
      t += b;
    }
    return t;
  }
  return kiln_shape_bytes(s);
}

size_t kiln__interp_lit_bytes(const kiln_literal *lit) {
  if (kiln_shape_is_tuple(&lit->shape)) {
    size_t t = 0;
    for (uint32_t i = 0; i < lit->shape.rank; i++) t += kiln__interp_lit_bytes(lit->elems[i]);
    return t;
  }
  return lit->nbytes;
}

int kiln__interp_lit_new(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_shape *shape,
                         kiln_literal **out) {
  *out = NULL;
  if (shape->dtype == KILN_INVALID)
    return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s has no result shape",
                             ins ? kiln_opcode_name(ins->op) : "value", ins ? ins->name : "");
  int64_t bytes = shape_total_bytes(shape);
  if (bytes < 0 || (uint64_t)bytes > c->max_live - c->live) {
    kiln_sbuf b = KILN_SBUF_INIT;
    kiln_shape_print_short(&b, shape);
    int rc = kiln__interp_fail(
        c, ins, KILN_ELIMIT, "%s: result %s needs %lld bytes; %zu of the %zu-byte limit are in use",
        ins ? ins->name : "value", kiln_sbuf_str(&b), (long long)bytes, c->live, c->max_live);
    kiln_sbuf_free(&b);
    return rc;
  }
  int rc = kiln_literal_create(NULL, shape, 0, out, c->st);
  if (rc) return rc;
  c->live += (size_t)bytes;
  return 0;
}

int kiln__interp_lit_result(kiln__interp_ctx *c, const kiln_instr *ins, kiln_literal **out) {
  return kiln__interp_lit_new(c, ins, &ins->shape, out);
}

void kiln__interp_lit_free(kiln__interp_ctx *c, kiln_literal *lit) {
  if (lit == NULL) return;
  size_t b = kiln__interp_lit_bytes(lit);
  c->live = b > c->live ? 0 : c->live - b;
  kiln_literal_destroy(lit);
}

int64_t kiln__interp_dyn_size(const kiln_literal *lit, uint32_t d) {
  if (lit->dynamic_sizes && d < lit->shape.rank) return lit->dynamic_sizes[d];
  return d < lit->shape.rank ? lit->shape.dims[d] : 1;
}

int kiln__interp_dyn_set(kiln__interp_ctx *c, const kiln_instr *ins, kiln_arena *a,
                         kiln_literal *lit, const int64_t *sizes) {
  const kiln_shape *s = &lit->shape;
  if (!kiln_shape_is_array(s) || s->dynamic == NULL || sizes == NULL) return 0;
  bool any = false;
  for (uint32_t d = 0; d < s->rank; d++)
    if (s->dynamic[d] && sizes[d] < s->dims[d]) any = true;
  if (!any) {
    lit->dynamic_sizes = NULL;
    return 0;
  }
  if (lit->dynamic_sizes == NULL) {
    lit->dynamic_sizes = kiln_arena_calloc(a, s->rank, sizeof *lit->dynamic_sizes);
    if (lit->dynamic_sizes == NULL)
      return kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory for runtime sizes");
  }
  for (uint32_t d = 0; d < s->rank; d++) {
    int64_t v = s->dynamic[d] ? sizes[d] : s->dims[d];
    lit->dynamic_sizes[d] = v < 0 ? 0 : v > s->dims[d] ? s->dims[d] : v;
  }
  return 0;
}

int kiln__interp_dyn_inherit(kiln__interp_ctx *c, const kiln_instr *ins, kiln_literal *out,
                             const kiln_literal *src) {
  if (src->dynamic_sizes == NULL || !kiln_shape_is_array(&out->shape) ||
      !kiln_shape_is_array(&src->shape) || src->shape.rank != out->shape.rank)
    return 0;
  return kiln__interp_dyn_set(c, ins, out->own, out, src->dynamic_sizes);
}

static bool same_structure(const kiln_shape *a, const kiln_shape *b) {
  if (kiln_shape_is_tuple(a) || kiln_shape_is_tuple(b)) {
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    for (uint32_t i = 0; i < a->rank; i++)
      if (!same_structure(&a->tuple[i], &b->tuple[i])) return false;
    return true;
  }
  if (kiln_shape_is_token(a) || kiln_shape_is_token(b)) return a->dtype == b->dtype;
  return a->dtype == b->dtype && kiln__interp_same_dims(a, b);
}

int kiln__interp_lit_copy_into(kiln__interp_ctx *c, const kiln_instr *ins, kiln_arena *a,
                               kiln_literal *dst, const kiln_literal *src) {
  if (!same_structure(&dst->shape, &src->shape)) {
    kiln_sbuf b = KILN_SBUF_INIT, e = KILN_SBUF_INIT;
    kiln_shape_print_short(&b, &src->shape);
    kiln_shape_print_short(&e, &dst->shape);
    int rc = kiln__interp_fail(c, ins, KILN_EINVAL, "value of shape %s where %s was expected",
                               kiln_sbuf_str(&b), kiln_sbuf_str(&e));
    kiln_sbuf_free(&b);
    kiln_sbuf_free(&e);
    return rc;
  }
  if (kiln_shape_is_tuple(&src->shape)) {
    for (uint32_t i = 0; i < src->shape.rank; i++) {
      int rc = kiln__interp_lit_copy_into(c, ins, a, dst->elems[i], src->elems[i]);
      if (rc) return rc;
    }
    return 0;
  }
  if (src->nbytes) memcpy(dst->data, src->data, src->nbytes);
  if (src->dynamic_sizes) return kiln__interp_dyn_set(c, ins, a, dst, src->dynamic_sizes);
  return 0;
}

int kiln__interp_lit_clone(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *src,
                           kiln_literal **out) {
  int rc = kiln__interp_lit_new(c, ins, &src->shape, out);
  if (rc) return rc;
  rc = kiln__interp_lit_copy_into(c, ins, (*out)->own, *out, src);
  if (rc) {
    kiln__interp_lit_free(c, *out);
    *out = NULL;
  }
  return rc;
}

/* ---- shapes and indices ------------------------------------------------- */

bool kiln__interp_same_dims(const kiln_shape *a, const kiln_shape *b) {
  if (a->rank != b->rank) return false;
  for (uint32_t i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

int kiln__interp_need_array(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *lit,
                            const char *what) {
  if (!kiln_shape_is_array(&lit->shape))
    return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: %s is not an array",
                             kiln_opcode_name(ins->op), ins->name, what);
  if (lit->shape.rank > KILN_INTERP_MAX_RANK)
    return kiln__interp_fail(c, ins, KILN_EUNIMPL, "%s %s: %s has rank %u, over the supported %d",
                             kiln_opcode_name(ins->op), ins->name, what, lit->shape.rank,
                             KILN_INTERP_MAX_RANK);
  return 0;
}

void kiln__interp_strides(const kiln_shape *s, int64_t *strides) {
  int64_t acc = 1;
  for (uint32_t i = s->rank; i-- > 0;) {
    strides[i] = acc;
    acc *= s->dims[i];
  }
}

bool kiln__interp_next_index(int64_t *idx, const int64_t *dims, uint32_t rank) {
  for (uint32_t i = rank; i-- > 0;) {
    if (++idx[i] < dims[i]) return true;
    idx[i] = 0;
  }
  return false;
}

int64_t kiln__interp_linear(const int64_t *idx, const int64_t *strides, uint32_t rank) {
  int64_t l = 0;
  for (uint32_t i = 0; i < rank; i++) l += idx[i] * strides[i];
  return l;
}

bool kiln__interp_ints_has(const kiln_i64s *l, int64_t v) {
  if (l == NULL) return false;
  for (uint32_t i = 0; i < l->n; i++)
    if (l->v[i] == v) return true;
  return false;
}

void kiln__interp_copy_elem(kiln_literal *dst, int64_t di, const kiln_literal *src, int64_t si) {
  size_t e = kiln_dtype_size(dst->shape.dtype);
  if (e == kiln_dtype_size(src->shape.dtype))
    memcpy((char *)dst->data + (size_t)di * e, (const char *)src->data + (size_t)si * e, e);
}

/* ---- computations ------------------------------------------------------- */

int kiln__interp_called(kiln__interp_ctx *c, const kiln_instr *ins, uint32_t i, uint32_t *out) {
  if (i >= ins->ncalled || ins->called[i] >= c->m->ncomps)
    return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: missing called computation #%u",
                             kiln_opcode_name(ins->op), ins->name, i);
  *out = ins->called[i];
  return 0;
}

typedef struct slot {
  kiln_literal *lit;
  bool owned;    /* false: a parameter borrowed from the caller */
  uint32_t uses; /* users still to run (+1 for the root) */
} slot;

static void free_slots(kiln__interp_ctx *c, slot *v, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    if (v[i].owned) kiln__interp_lit_free(c, v[i].lit);
}

/* Counts uses and checks that operands live in the computation. */
static int count_uses(kiln__interp_ctx *c, const kiln_computation *comp, slot *v) {
  const kiln_module *m = c->m;
  for (uint32_t k = 0; k < comp->ninstrs; k++) {
    if (comp->instrs[k] >= m->ninstrs || m->instrs[comp->instrs[k]]->comp != comp->id ||
        c->pos[comp->instrs[k]] != k)
      return kiln__interp_fail(c, NULL, KILN_EINVAL,
                               "computation %s lists instruction #%u of another "
                               "computation",
                               comp->name, comp->instrs[k]);
  }
  for (uint32_t k = 0; k < comp->ninstrs; k++) {
    const kiln_instr *ins = m->instrs[comp->instrs[k]];
    for (uint32_t j = 0; j < ins->noperands; j++) {
      kiln_id o = ins->operands[j];
      if (o >= m->ninstrs || m->instrs[o]->comp != comp->id)
        return kiln__interp_fail(c, ins, KILN_EINVAL,
                                 "%s %s: operand %u is not an instruction of computation %s",
                                 kiln_opcode_name(ins->op), ins->name, j, comp->name);
      v[c->pos[o]].uses++;
    }
  }
  return 0;
}

static int eval_param(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *const *args,
                      uint32_t nargs, slot *s) {
  if (ins->param_number < 0 || (uint64_t)ins->param_number >= nargs)
    return kiln__interp_fail(c, ins, KILN_EINVAL,
                             "parameter %s: number %lld but %u argument(s) given", ins->name,
                             (long long)ins->param_number, nargs);
  s->lit = (kiln_literal *)args[ins->param_number];
  s->owned = false;
  return 0;
}

/* Runs one instruction of a computation being evaluated. */
static int step(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *const *args,
                uint32_t nargs, slot *v) {
  if (ins->op == KILN_OP_PARAMETER) return eval_param(c, ins, args, nargs, &v[c->pos[ins->id]]);
  int rc = kiln__interp_check_time(c, ins);
  if (rc) return rc;
  const kiln_literal *small[8];
  const kiln_literal **ops = small;
  if (ins->noperands > 8) {
    ops = kiln_calloc(ins->noperands, sizeof *ops);
    if (ops == NULL) return kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  }
  for (uint32_t j = 0; j < ins->noperands; j++) {
    ops[j] = v[c->pos[ins->operands[j]]].lit;
    if (ops[j] == NULL) {
      rc = kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: operand %u is used before it is defined",
                             kiln_opcode_name(ins->op), ins->name, j);
      goto out;
    }
  }
  kiln_literal *res = NULL;
  rc = kiln__interp_eval_instr(c, ins, ops, &res);
  if (rc) goto out;
  v[c->pos[ins->id]].lit = res;
  v[c->pos[ins->id]].owned = true;
  for (uint32_t j = 0; j < ins->noperands; j++) {
    slot *s = &v[c->pos[ins->operands[j]]];
    if (--s->uses == 0 && s->owned) {
      kiln__interp_lit_free(c, s->lit);
      s->lit = NULL;
      s->owned = false;
    }
  }
out:
  if (ops != small) kiln_free(ops);
  return rc;
}

int kiln__interp_call(kiln__interp_ctx *c, const kiln_instr *caller, uint32_t comp_id,
                      const kiln_literal *const *args, uint32_t nargs, kiln_literal **out) {
  *out = NULL;
  const kiln_module *m = c->m;
  const kiln_computation *comp = kiln_module_computation(m, comp_id);
  if (comp == NULL || comp->ninstrs == 0)
    return kiln__interp_fail(c, caller, KILN_EINVAL, "called computation #%u is missing or empty",
                             comp_id);
  if (c->depth >= MAX_CALL_DEPTH)
    return kiln__interp_fail(c, caller, KILN_ELIMIT, "computation calls nest deeper than %d at %s",
                             MAX_CALL_DEPTH, comp->name);
  const kiln_instr *root = kiln_computation_root(m, comp);
  if (root == NULL || root->comp != comp->id)
    return kiln__interp_fail(c, caller, KILN_EINVAL, "computation %s has no root", comp->name);
  slot *v = kiln_calloc(comp->ninstrs, sizeof *v);
  if (v == NULL) return kiln__interp_fail(c, caller, KILN_ENOMEM, "out of memory");
  c->depth++;
  int rc = count_uses(c, comp, v);
  v[c->pos[root->id]].uses++; /* the result is held until returned */
  for (uint32_t k = 0; rc == 0 && k < comp->ninstrs; k++) {
    const kiln_instr *ins = m->instrs[comp->instrs[k]];
    rc = step(c, ins, args, nargs, v);
    if (rc == 0 && v[k].uses == 0 && v[k].owned) { /* unused value */
      kiln__interp_lit_free(c, v[k].lit);
      v[k].lit = NULL;
      v[k].owned = false;
    }
  }
  c->depth--;
  if (rc == 0) {
    slot *r = &v[c->pos[root->id]];
    if (r->owned) {
      *out = r->lit;
      r->owned = false;
    } else {
      rc = kiln__interp_lit_clone(c, root, r->lit, out);
    }
  }
  free_slots(c, v, comp->ninstrs);
  kiln_free(v);
  return rc;
}

/* ---- computations of scalars -------------------------------------------- */

static bool scalar_shape(const kiln_shape *s) {
  return kiln_shape_is_array(s) && s->rank == 0 && kiln__interp_dtype_computable(s->dtype);
}

static bool scalar_instr_ok(const kiln_module *m, const kiln_computation *comp, uint32_t k,
                            const kiln_instr *root) {
  const kiln_instr *ins = m->instrs[comp->instrs[k]];
  for (uint32_t j = 0; j < ins->noperands; j++) {
    kiln_id o = ins->operands[j];
    if (o >= m->ninstrs || m->instrs[o]->comp != comp->id || m->instrs[o]->op == KILN_OP_TUPLE)
      return false;
  }
  if (ins->op == KILN_OP_TUPLE) return ins == root;
  if (!scalar_shape(&ins->shape)) return false;
  switch (ins->op) {
  case KILN_OP_PARAMETER: return ins->param_number >= 0;
  case KILN_OP_CONSTANT:
    return ins->literal && kiln_shape_is_array(&ins->literal->shape) &&
           kiln_literal_elements(ins->literal) == 1 &&
           kiln__interp_dtype_computable(ins->literal->shape.dtype);
  default:
    return (kiln_opcode_flags(ins->op) & KILN_OPF_ELEMENTWISE) && ins->ncalled == 0 &&
           ins->noperands >= 1 && ins->noperands <= 3 &&
           (int)ins->noperands == kiln_opcode_arity(ins->op);
  }
}

static kiln__interp_comp_info *comp_info(kiln__interp_ctx *c, uint32_t comp_id) {
  kiln__interp_comp_info *ci = &c->comps[comp_id];
  if (ci->scalar >= 0) return ci;
  const kiln_computation *comp = c->m->comps[comp_id];
  const kiln_instr *root = kiln_computation_root(c->m, comp);
  bool ok = root != NULL && comp->ninstrs > 0 && root->comp == comp->id;
  for (uint32_t k = 0; ok && k < comp->ninstrs; k++) {
    kiln_id id = comp->instrs[k];
    ok = id < c->m->ninstrs && c->m->instrs[id]->comp == comp->id && c->pos[id] == k &&
         scalar_instr_ok(c->m, comp, k, root);
  }
  if (ok) {
    ci->scratch = kiln_calloc(comp->ninstrs, sizeof *ci->scratch);
    ok = ci->scratch != NULL;
  }
  ci->scalar = ok ? 1 : 0;
  return ci;
}

static int scalar_eval(kiln__interp_ctx *c, const kiln_instr *caller, const kiln_computation *comp,
                       kiln__interp_scalar *vals, const kiln__interp_scalar *args, uint32_t nargs,
                       kiln__interp_scalar *outs, uint32_t nouts) {
  const kiln_module *m = c->m;
  const kiln_instr *root = kiln_computation_root(m, comp);
  for (uint32_t k = 0; k < comp->ninstrs; k++) {
    const kiln_instr *ins = m->instrs[comp->instrs[k]];
    switch (ins->op) {
    case KILN_OP_PARAMETER:
      if ((uint64_t)ins->param_number >= nargs)
        return kiln__interp_fail(c, ins, KILN_EINVAL,
                                 "parameter %s: number %lld but %u argument(s)", ins->name,
                                 (long long)ins->param_number, nargs);
      vals[k] = kiln__interp_scalar_convert(args[ins->param_number], ins->shape.dtype);
      break;
    case KILN_OP_CONSTANT: vals[k] = kiln__interp_scalar_load(ins->literal, 0); break;
    case KILN_OP_TUPLE: break;
    default: {
      kiln__interp_scalar a[3];
      for (uint32_t j = 0; j < ins->noperands; j++) {
        uint32_t p = c->pos[ins->operands[j]];
        if (p >= k)
          return kiln__interp_fail(c, ins, KILN_EINVAL,
                                   "%s: operand %u is used before it is defined", ins->name, j);
        a[j] = vals[p];
      }
      const char *why = "";
      int rc =
          kiln__interp_scalar_op(ins, ins->op, a, ins->noperands, ins->shape.dtype, &vals[k], &why);
      if (rc)
        return kiln__interp_fail(c, ins, rc, "%s %s: %s", kiln_opcode_name(ins->op), ins->name,
                                 why);
    }
    }
  }
  uint32_t have = root->op == KILN_OP_TUPLE ? root->noperands : 1;
  if (have != nouts)
    return kiln__interp_fail(c, caller, KILN_EINVAL,
                             "computation %s returns %u value(s), %u expected", comp->name, have,
                             nouts);
  if (root->op == KILN_OP_TUPLE) {
    for (uint32_t j = 0; j < nouts; j++) outs[j] = vals[c->pos[root->operands[j]]];
  } else {
    outs[0] = vals[c->pos[root->id]];
  }
  return 0;
}

static int scalar_via_literals(kiln__interp_ctx *c, const kiln_instr *caller, uint32_t comp,
                               const kiln__interp_scalar *args, uint32_t nargs,
                               kiln__interp_scalar *outs, uint32_t nouts) {
  kiln_literal **lits = kiln_calloc(nargs ? nargs : 1, sizeof *lits);
  if (lits == NULL) return kiln__interp_fail(c, caller, KILN_ENOMEM, "out of memory");
  int rc = 0;
  kiln_literal *res = NULL;
  for (uint32_t i = 0; rc == 0 && i < nargs; i++) {
    kiln_shape s = {.dtype = args[i].t};
    rc = kiln__interp_lit_new(c, caller, &s, &lits[i]);
    if (rc == 0) kiln__interp_scalar_store(lits[i], 0, args[i]);
  }
  if (rc == 0)
    rc = kiln__interp_call(c, caller, comp, (const kiln_literal *const *)lits, nargs, &res);
  if (rc == 0) {
    bool tup = kiln_shape_is_tuple(&res->shape);
    uint32_t have = tup ? res->shape.rank : 1;
    if (have != nouts) {
      rc = kiln__interp_fail(c, caller, KILN_EINVAL,
                             "computation %s returns %u value(s), %u expected",
                             c->m->comps[comp]->name, have, nouts);
    }
    for (uint32_t j = 0; rc == 0 && j < nouts; j++) {
      const kiln_literal *e = tup ? res->elems[j] : res;
      if (!kiln_shape_is_array(&e->shape) || kiln_literal_elements(e) != 1)
        rc = kiln__interp_fail(c, caller, KILN_EINVAL, "computation %s must return scalars",
                               c->m->comps[comp]->name);
      else
        outs[j] = kiln__interp_scalar_load(e, 0);
    }
  }
  kiln__interp_lit_free(c, res);
  for (uint32_t i = 0; i < nargs; i++) kiln__interp_lit_free(c, lits[i]);
  kiln_free(lits);
  return rc;
}

int kiln__interp_call_scalar(kiln__interp_ctx *c, const kiln_instr *caller, uint32_t comp,
                             const kiln__interp_scalar *args, uint32_t nargs,
                             kiln__interp_scalar *outs, uint32_t nouts) {
  if (comp >= c->m->ncomps)
    return kiln__interp_fail(c, caller, KILN_EINVAL, "called computation #%u is missing", comp);
  if ((++c->ticks & 0xffff) == 0) {
    int rc = kiln__interp_check_time(c, caller);
    if (rc) return rc;
  }
  kiln__interp_comp_info *ci = comp_info(c, comp);
  if (ci->scalar == 1)
    return scalar_eval(c, caller, c->m->comps[comp], ci->scratch, args, nargs, outs, nouts);
  return scalar_via_literals(c, caller, comp, args, nargs, outs, nouts);
}

int kiln__interp_comp_result_dtype(kiln__interp_ctx *c, const kiln_instr *caller, uint32_t comp,
                                   uint32_t i, kiln_dtype *out) {
  const kiln_computation *cp = kiln_module_computation(c->m, comp);
  const kiln_instr *root = cp ? kiln_computation_root(c->m, cp) : NULL;
  if (root == NULL)
    return kiln__interp_fail(c, caller, KILN_EINVAL, "called computation #%u is missing", comp);
  const kiln_shape *s = &root->shape;
  if (kiln_shape_is_tuple(s)) {
    if (i >= s->rank)
      return kiln__interp_fail(c, caller, KILN_EINVAL, "computation %s returns %u value(s), not %u",
                               cp->name, s->rank, i + 1);
    s = &s->tuple[i];
  }
  if (!scalar_shape(s))
    return kiln__interp_fail(c, caller, KILN_EINVAL,
                             "computation %s must return scalars of a "
                             "computable type",
                             cp->name);
  *out = s->dtype;
  return 0;
}

/* ---- tuples, tokens, identity ops --------------------------------------- */

static int eval_tuple(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *const *ops,
                      kiln_literal **out) {
  kiln_shape *el = kiln_calloc(ins->noperands ? ins->noperands : 1, sizeof *el);
  if (el == NULL) return kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  for (uint32_t i = 0; i < ins->noperands; i++) el[i] = ops[i]->shape;
  kiln_shape ts = {.dtype = KILN_TUPLE, .rank = ins->noperands, .tuple = el};
  int rc = kiln__interp_lit_new(c, ins, &ts, out);
  kiln_free(el);
  for (uint32_t i = 0; rc == 0 && i < ins->noperands; i++)
    rc = kiln__interp_lit_copy_into(c, ins, (*out)->own, (*out)->elems[i], ops[i]);
  if (rc && *out) {
    kiln__interp_lit_free(c, *out);
    *out = NULL;
  }
  return rc;
}

static int eval_gte(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *const *ops,
                    kiln_literal **out) {
  int64_t i = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, -1);
  if (!kiln_shape_is_tuple(&ops[0]->shape) || i < 0 || i >= ops[0]->shape.rank)
    return kiln__interp_fail(c, ins, KILN_EINVAL,
                             "get-tuple-element %s: index %lld is not an element "
                             "of the operand",
                             ins->name, (long long)i);
  return kiln__interp_lit_clone(c, ins, ops[0]->elems[i], out);
}

static int eval_constant(kiln__interp_ctx *c, const kiln_instr *ins, kiln_literal **out) {
  if (ins->literal == NULL)
    return kiln__interp_fail(c, ins, KILN_EINVAL, "constant %s has no value", ins->name);
  return kiln__interp_lit_clone(c, ins, ins->literal, out);
}

/* ---- control flow ------------------------------------------------------- */

static int read_pred(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *p, bool *out) {
  if (!kiln_shape_is_array(&p->shape) || kiln_literal_elements(p) != 1)
    return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: condition must be a scalar pred",
                             kiln_opcode_name(ins->op), ins->name);
  *out = kiln_literal_get_pred(p, 0);
  return 0;
}

static int eval_while(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *const *ops,
                      kiln_literal **out) {
  uint32_t cond = 0, body = 0;
  int rc = kiln__interp_called(c, ins, 0, &cond);
  if (rc == 0) rc = kiln__interp_called(c, ins, 1, &body);
  if (rc) return rc;
  uint64_t max = c->opts.max_while_iterations ? c->opts.max_while_iterations : DEFAULT_MAX_WHILE;
  const kiln_literal *state = ops[0];
  kiln_literal *owned = NULL;
  for (uint64_t iter = 0;; iter++) {
    kiln_literal *p = NULL;
    rc = kiln__interp_call(c, ins, cond, &state, 1, &p);
    bool go = false;
    if (rc == 0) rc = read_pred(c, ins, p, &go);
    kiln__interp_lit_free(c, p);
    if (rc || !go) break;
    if (iter >= max) {
      rc = kiln__interp_fail(c, ins, KILN_ELIMIT,
                             "while %s: still running after %llu iterations "
                             "(the limit)",
                             ins->name, (unsigned long long)max);
      break;
    }
    rc = kiln__interp_check_time(c, ins);
    if (rc) break;
    kiln_literal *next = NULL;
    rc = kiln__interp_call(c, ins, body, &state, 1, &next);
    if (rc) break;
    kiln__interp_lit_free(c, owned);
    owned = next;
    state = next;
  }
  if (rc) {
    kiln__interp_lit_free(c, owned);
    return rc;
  }
  if (owned) {
    *out = owned;
    return 0;
  }
  return kiln__interp_lit_clone(c, ins, state, out);
}

static int eval_conditional(kiln__interp_ctx *c, const kiln_instr *ins,
                            const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *sel = ops[0];
  if (ins->ncalled == 0 || !kiln_shape_is_array(&sel->shape) || kiln_literal_elements(sel) != 1)
    return kiln__interp_fail(c, ins, KILN_EINVAL,
                             "conditional %s: needs a scalar selector and "
                             "branches",
                             ins->name);
  uint32_t branch;
  if (sel->shape.dtype == KILN_PRED) {
    branch = kiln_literal_get_pred(sel, 0) ? 0 : 1;
  } else {
    int64_t b = kiln_literal_get_s64(sel, 0);
    /* XLA: an out-of-range index selects the last branch. */
    branch = (b < 0 || b >= (int64_t)ins->ncalled) ? ins->ncalled - 1 : (uint32_t)b;
  }
  if (1 + branch >= ins->noperands)
    return kiln__interp_fail(c, ins, KILN_EINVAL, "conditional %s: branch %u has no operand",
                             ins->name, branch);
  uint32_t comp = 0;
  int rc = kiln__interp_called(c, ins, branch, &comp);
  if (rc) return rc;
  return kiln__interp_call(c, ins, comp, &ops[1 + branch], 1, out);
}

static int eval_call(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *const *ops,
                     kiln_literal **out) {
  uint32_t comp = 0;
  int rc = kiln__interp_called(c, ins, 0, &comp);
  if (rc) return rc;
  return kiln__interp_call(c, ins, comp, ops, ins->noperands, out);
}

/* The value of an async "start": a tuple whose element 0 holds the operands
 * (one tuple of them), element 1 the wrapped op's result, and the rest
 * (contexts) zeros, all laid out as the instruction's shape declares. */
int kiln__interp_start_value(kiln__interp_ctx *c, const kiln_instr *ins,
                             const kiln_literal *const *ops, uint32_t nops,
                             const kiln_literal *result, kiln_literal **out) {
  const kiln_shape *s = &ins->shape;
  if (!kiln_shape_is_tuple(s) || s->rank < 2)
    return kiln__interp_fail(c, ins, KILN_EINVAL,
                             "%s %s: result must be a tuple (operands, result, "
                             "context...)",
                             kiln_opcode_name(ins->op), ins->name);
  int rc = kiln__interp_lit_new(c, ins, s, out);
  if (rc) return rc;
  kiln_literal *o = *out;
  kiln_literal *e0 = o->elems[0];
  if (kiln_shape_is_tuple(&e0->shape) && e0->shape.rank == nops) {
    for (uint32_t i = 0; rc == 0 && i < nops; i++)
      rc = kiln__interp_lit_copy_into(c, ins, o->own, e0->elems[i], ops[i]);
  } else if (nops == 1) {
    rc = kiln__interp_lit_copy_into(c, ins, o->own, e0, ops[0]);
  } else {
    rc = kiln__interp_fail(c, ins, KILN_EINVAL,
                           "%s %s: element 0 of the result must hold the %u "
                           "operands",
                           kiln_opcode_name(ins->op), ins->name, nops);
  }
  if (rc == 0) rc = kiln__interp_lit_copy_into(c, ins, o->own, o->elems[1], result);
  if (rc) {
    kiln__interp_lit_free(c, o);
    *out = NULL;
  }
  return rc;
}

static int eval_async_start(kiln__interp_ctx *c, const kiln_instr *ins,
                            const kiln_literal *const *ops, kiln_literal **out) {
  kiln_literal *res = NULL;
  int rc;
  if (ins->ncalled > 0) {
    rc = eval_call(c, ins, ops, &res);
  } else if (ins->async_op != KILN_OP_INVALID && ins->async_op != KILN_OP_ASYNC_START &&
             kiln_shape_is_tuple(&ins->shape) && ins->shape.rank >= 2) {
    /* Sugar ("negate-start"): the wrapped op with the start's operands and
     * attributes, its result shape element 1 of ours. */
    kiln_instr wrapped = *ins;
    wrapped.op = ins->async_op;
    wrapped.async_op = KILN_OP_INVALID;
    wrapped.shape = ins->shape.tuple[1];
    rc = kiln__interp_eval_instr(c, &wrapped, ops, &res);
  } else {
    return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: no computation or wrapped op to run",
                             kiln_opcode_name(ins->op), ins->name);
  }
  if (rc) return rc;
  rc = kiln__interp_start_value(c, ins, ops, ins->noperands, res, out);
  kiln__interp_lit_free(c, res);
  return rc;
}

/* async-done, copy-done, *-done: the result part of the start's value. */
static int eval_done(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *const *ops,
                     kiln_literal **out) {
  const kiln_literal *v = ops[0];
  if (kiln_shape_is_tuple(&v->shape) && v->shape.rank >= 2 &&
      !same_structure(&v->shape, &ins->shape))
    return kiln__interp_lit_clone(c, ins, v->elems[1], out);
  return kiln__interp_lit_clone(c, ins, v, out);
}

static int eval_copy_start(kiln__interp_ctx *c, const kiln_instr *ins,
                           const kiln_literal *const *ops, kiln_literal **out) {
  return kiln__interp_start_value(c, ins, ops, 1, ops[0], out);
}

/* ---- dispatch ----------------------------------------------------------- */

static int unsupported(kiln__interp_ctx *c, const kiln_instr *ins, const char *why) {
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "%s %s: %s", kiln_opcode_name(ins->op), ins->name,
                           why);
}

/* Fewest operands of the variadic ops (handlers index up to this many). */
static uint32_t min_operands(kiln_opcode op) {
  switch (op) {
  case KILN_OP_CONDITIONAL:
  case KILN_OP_DYNAMIC_SLICE:
  case KILN_OP_REDUCE:
  case KILN_OP_REDUCE_WINDOW:
  case KILN_OP_RNG: return 2;
  case KILN_OP_DYNAMIC_UPDATE_SLICE:
  case KILN_OP_SCATTER: return 3;
  case KILN_OP_TUPLE:
  case KILN_OP_CALL:
  case KILN_OP_FUSION:
  case KILN_OP_CUSTOM_CALL:
  case KILN_OP_ASYNC_START:
  case KILN_OP_AFTER_ALL: return 0;
  default: return 1;
  }
}

static int arity_ok(kiln__interp_ctx *c, const kiln_instr *ins) {
  int a = kiln_opcode_arity(ins->op);
  if (a >= 0 && (uint32_t)a != ins->noperands)
    return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: takes %d operand(s), has %u",
                             kiln_opcode_name(ins->op), ins->name, a, ins->noperands);
  if (a < 0 && ins->noperands < min_operands(ins->op))
    return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: needs at least %u operand(s), has %u",
                             kiln_opcode_name(ins->op), ins->name, min_operands(ins->op),
                             ins->noperands);
  return 0;
}

static kiln__interp_op_fn *handler(kiln_opcode op) {
  switch (op) {
  case KILN_OP_IOTA: return kiln__interp_eval_iota;
  case KILN_OP_BITCAST_CONVERT: return kiln__interp_eval_bitcast_convert;
  case KILN_OP_BITCAST: return kiln__interp_eval_bitcast;
  case KILN_OP_BROADCAST: return kiln__interp_eval_broadcast;
  case KILN_OP_RESHAPE: return kiln__interp_eval_reshape;
  case KILN_OP_DYNAMIC_RESHAPE: return kiln__interp_eval_dynamic_reshape;
  case KILN_OP_TRANSPOSE: return kiln__interp_eval_transpose;
  case KILN_OP_SLICE: return kiln__interp_eval_slice;
  case KILN_OP_DYNAMIC_SLICE: return kiln__interp_eval_dynamic_slice;
  case KILN_OP_DYNAMIC_UPDATE_SLICE: return kiln__interp_eval_dynamic_update_slice;
  case KILN_OP_CONCATENATE: return kiln__interp_eval_concatenate;
  case KILN_OP_PAD: return kiln__interp_eval_pad;
  case KILN_OP_REVERSE: return kiln__interp_eval_reverse;
  case KILN_OP_GET_DIMENSION_SIZE: return kiln__interp_eval_get_dimension_size;
  case KILN_OP_SET_DIMENSION_SIZE: return kiln__interp_eval_set_dimension_size;
  case KILN_OP_DOT: return kiln__interp_eval_dot;
  case KILN_OP_CONVOLUTION: return kiln__interp_eval_convolution;
  case KILN_OP_REDUCE: return kiln__interp_eval_reduce;
  case KILN_OP_REDUCE_WINDOW: return kiln__interp_eval_reduce_window;
  case KILN_OP_SELECT_AND_SCATTER: return kiln__interp_eval_select_and_scatter;
  case KILN_OP_MAP: return kiln__interp_eval_map;
  case KILN_OP_SORT: return kiln__interp_eval_sort;
  case KILN_OP_TOPK: return kiln__interp_eval_topk;
  case KILN_OP_GATHER: return kiln__interp_eval_gather;
  case KILN_OP_SCATTER: return kiln__interp_eval_scatter;
  case KILN_OP_FFT: return kiln__interp_eval_fft;
  case KILN_OP_CHOLESKY: return kiln__interp_eval_cholesky;
  case KILN_OP_TRIANGULAR_SOLVE: return kiln__interp_eval_triangular_solve;
  case KILN_OP_BATCH_NORM_TRAINING: return kiln__interp_eval_batch_norm_training;
  case KILN_OP_BATCH_NORM_INFERENCE: return kiln__interp_eval_batch_norm_inference;
  case KILN_OP_BATCH_NORM_GRAD: return kiln__interp_eval_batch_norm_grad;
  case KILN_OP_WHILE: return eval_while;
  case KILN_OP_CONDITIONAL: return eval_conditional;
  case KILN_OP_CALL:
  case KILN_OP_FUSION: return eval_call;
  case KILN_OP_CUSTOM_CALL: return kiln__interp_eval_custom_call;
  case KILN_OP_ASYNC_START: return eval_async_start;
  case KILN_OP_ASYNC_DONE:
  case KILN_OP_COPY_DONE:
  case KILN_OP_ALL_REDUCE_DONE:
  case KILN_OP_ALL_GATHER_DONE:
  case KILN_OP_COLLECTIVE_PERMUTE_DONE: return eval_done;
  case KILN_OP_COPY_START: return eval_copy_start;
  case KILN_OP_TUPLE: return eval_tuple;
  case KILN_OP_GET_TUPLE_ELEMENT: return eval_gte;
  case KILN_OP_RNG: return kiln__interp_eval_rng;
  case KILN_OP_RNG_BIT_GENERATOR: return kiln__interp_eval_rng_bit_generator;
  case KILN_OP_RNG_GET_AND_UPDATE_STATE: return kiln__interp_eval_rng_get_and_update_state;
  case KILN_OP_REPLICA_ID:
  case KILN_OP_PARTITION_ID: return kiln__interp_eval_replica_id;
  default: break;
  }
  if (kiln_opcode_flags(op) & KILN_OPF_COLLECTIVE) return kiln__interp_eval_collective;
  if (kiln_opcode_flags(op) & KILN_OPF_ELEMENTWISE) return kiln__interp_eval_elementwise;
  return NULL;
}

int kiln__interp_eval_instr(kiln__interp_ctx *c, const kiln_instr *ins,
                            const kiln_literal *const *ops, kiln_literal **out) {
  *out = NULL;
  int rc = arity_ok(c, ins);
  if (rc) return rc;
  switch (ins->op) {
  case KILN_OP_CONSTANT: return eval_constant(c, ins, out);
  case KILN_OP_PARAMETER:
    return kiln__interp_fail(c, ins, KILN_EINVAL, "parameter %s outside a computation", ins->name);
  case KILN_OP_AFTER_ALL: {
    kiln_shape t = {.dtype = KILN_TOKEN};
    return kiln__interp_lit_new(c, ins, &t, out);
  }
  case KILN_OP_ADD_DEPENDENCY:
  case KILN_OP_OPTIMIZATION_BARRIER:
  case KILN_OP_DOMAIN:
  case KILN_OP_ASYNC_UPDATE: return kiln__interp_lit_clone(c, ins, ops[0], out);
  case KILN_OP_STOCHASTIC_CONVERT:
  default: break;
  }
  if (kiln_opcode_family(ins->op) == KILN_FAM_CHANNEL)
    return unsupported(c, ins, "host and peer channels do not exist in the interpreter");
  kiln__interp_op_fn *fn = handler(ins->op);
  if (fn == NULL) return unsupported(c, ins, "not an operation the interpreter knows");
  rc = fn(c, ins, ops, out);
  if (rc == 0 && *out == NULL)
    rc = kiln__interp_fail(c, ins, KILN_EINTERNAL, "%s %s produced no value",
                           kiln_opcode_name(ins->op), ins->name);
  return rc;
}

/* ---- entry -------------------------------------------------------------- */

static int check_arg(kiln__interp_ctx *c, const kiln_instr *param, const kiln_shape *want,
                     const kiln_literal *arg, uint32_t i) {
  if (arg == NULL) return kiln__interp_fail(c, param, KILN_EINVAL, "argument %u is missing", i);
  if (!same_structure(want, &arg->shape)) {
    kiln_sbuf a = KILN_SBUF_INIT, b = KILN_SBUF_INIT;
    kiln_shape_print_short(&a, &arg->shape);
    kiln_shape_print_short(&b, want);
    int rc =
        kiln__interp_fail(c, param, KILN_EINVAL, "argument %u has shape %s; parameter %s is %s", i,
                          kiln_sbuf_str(&a), param->name, kiln_sbuf_str(&b));
    kiln_sbuf_free(&a);
    kiln_sbuf_free(&b);
    return rc;
  }
  return 0;
}

int kiln_interp_run(const kiln_module *m, const kiln_literal *const *args, uint32_t nargs,
                    const kiln_interp_options *opts, kiln_literal **out, kiln_status *st) {
  if (out) *out = NULL;
  if (m == NULL || out == NULL || (nargs && args == NULL))
    return kiln_status_set(st, KILN_EINVAL, NULL, "interpreter: missing module or result");
  const kiln_computation *entry = kiln_module_entry(m);
  if (entry == NULL)
    return kiln_status_set(st, KILN_EINVAL, NULL, "module %s has no ENTRY computation", m->name);
  kiln__interp_ctx c = {.m = m, .st = st};
  if (opts) c.opts = *opts;
  c.max_live = c.opts.max_live_bytes ? c.opts.max_live_bytes : DEFAULT_MAX_LIVE;
  if (c.opts.timeout_seconds > 0) c.deadline = now_seconds() + c.opts.timeout_seconds;
  c.pos = kiln_calloc(m->ninstrs ? m->ninstrs : 1, sizeof *c.pos);
  c.comps = kiln_calloc(m->ncomps ? m->ncomps : 1, sizeof *c.comps);
  int rc = 0;
  if (c.pos == NULL || c.comps == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
    goto out_free;
  }
  for (uint32_t i = 0; i < m->ncomps; i++) {
    c.comps[i].scalar = -1;
    const kiln_computation *comp = m->comps[i];
    for (uint32_t k = 0; k < comp->ninstrs; k++)
      if (comp->instrs[k] < m->ninstrs) c.pos[comp->instrs[k]] = k;
  }
  uint32_t np = kiln_computation_nparams(m, entry);
  if (np != nargs) {
    rc = kiln_status_set(st, KILN_EINVAL, entry->name, "ENTRY %s takes %u parameter(s), %u given",
                         entry->name, np, nargs);
    goto out_free;
  }
  for (uint32_t i = 0; i < nargs && rc == 0; i++) {
    const kiln_instr *p = kiln_computation_param(m, entry, i);
    if (p == NULL)
      rc = kiln_status_set(st, KILN_EINVAL, entry->name, "ENTRY has no parameter %u", i);
    else
      rc = check_arg(&c, p, &p->shape, args[i], i);
  }
  if (rc == 0) {
    const kiln_instr *root = kiln_computation_root(m, entry);
    rc = kiln__interp_call(&c, root, entry->id, args, nargs, out);
  }
out_free:
  if (c.comps)
    for (uint32_t i = 0; i < m->ncomps; i++) kiln_free(c.comps[i].scratch);
  kiln_free(c.comps);
  kiln_free(c.pos);
  return rc;
}
