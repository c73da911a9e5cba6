/* Algebraic simplification: rewrites that make an instruction cheaper or
 * remove it, each one exact, i.e. bit for bit what the reference
 * interpreter computes for the original (NaN payloads aside).
 *
 * Exactness decides which textbook identities apply. For floats:
 *   x + (-0) = x, but x + (+0) is not (it turns -0 into +0); x - (+0) = x;
 *   x * 1 = x and x / 1 = x, but x * 0 is not 0 (NaN, inf, -0);
 *   x / c = x * (1/c) when c is a power of two whose reciprocal the type
 *   holds exactly (both round the same real number once);
 *   pow(x, 2) = x * x for types narrower than f64 (the interpreter computes
 *   them in double, where both are exact); pow(x, 1) = x; pow(x, 0) = 1;
 *   pow(x, 0.5) is NOT sqrt(x): pow(-0, 0.5) = +0 and pow(-inf, 0.5) = +inf
 *   where sqrt gives -0 and NaN, so it is left alone;
 *   compare(x, x) is not constant (NaN).
 * For integers and pred the ring and lattice identities hold (x * 0 = 0,
 * x - x = 0, x ^ x = 0, compare(x, x) is known). A reduce over no
 * dimensions applies its reducer once, to the init value and the element,
 * so it is the operand only when the reducer is add/multiply/max/min/and/or
 * and the init value its identity (-0 for a float add, not +0). A dot with
 * a contraction of size 1 is not a multiply here: the interpreter sums
 * from +0, which turns a -0 product into +0.
 *
 * Shape rules: identity reshape/transpose/broadcast/slice/pad/reverse/copy/
 * convert removed; reshape of reshape, transpose of transpose (composed
 * permutation), broadcast of broadcast (composed dimensions), slice of
 * slice (composed start and stride) become one; reshape or transpose of a
 * scalar broadcast becomes a broadcast; a one-operand concatenate is its
 * operand; get-tuple-element of a tuple is the element; a transpose that
 * swaps a dot's two free-dimension blocks is the dot with its operands
 * swapped (when nothing else reads the dot).
 *
 * No rewrite reassociates. The walk goes in order, so operands are already
 * simplified when their users are looked at; an instruction rewritten in
 * place is looked at again. Replaced instructions are left for DCE.
 */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/fp16.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/passes.h"

enum { NO_CHANGE = 0, REPLACED = 1, MUTATED = 2 };

typedef struct simp {
  kiln_module *m;
  uint32_t comp;
  kiln__tx tx;    /* builds the new constants and splats; one per pass run */
  bool added;     /* instructions appended to comp: it needs sorting */
  kiln_id *fwd;   /* replacement of each instruction (itself when none) */
  uint8_t *splat; /* per id: 0 not known yet, 1 not a splat, 2 a splat */
  size_t cap;     /* entries of fwd and splat */
} simp;

static int grow(simp *s) {
  size_t need = s->m->ninstrs;
  if (need <= s->cap) return 0;
  size_t cap = s->cap ? s->cap : 64;
  while (cap < need) cap *= 2;
  kiln_id *f = kiln_realloc(s->fwd, cap * sizeof *f);
  if (f == NULL) return KILN_ENOMEM;
  s->fwd = f;
  uint8_t *sp = kiln_realloc(s->splat, cap);
  if (sp == NULL) return KILN_ENOMEM;
  s->splat = sp;
  for (size_t i = s->cap; i < cap; i++) {
    s->fwd[i] = (kiln_id)i;
    s->splat[i] = 0;
  }
  s->cap = cap;
  return 0;
}

/* Where new instructions of the computation being walked go. */
static kiln__b builder(simp *s) {
  s->added = true;
  return (kiln__b){&s->tx, s->comp};
}

static kiln_instr *opnd(const simp *s, const kiln_instr *ins, uint32_t k) {
  return s->m->instrs[ins->operands[k]];
}

/* ---- splat values ------------------------------------------------------- */

static bool literal_is_splat(const kiln_literal *lit) {
  if (lit == NULL || !kiln_shape_is_array(&lit->shape) || lit->dynamic_sizes) return false;
  int64_t n = kiln_literal_elements(lit);
  size_t es = kiln_dtype_size(lit->shape.dtype);
  if (n <= 0 || es == 0 || lit->nbytes != (size_t)n * es) return false;
  const unsigned char *d = lit->data;
  for (int64_t i = 1; i < n; i++)
    if (memcmp(d, d + i * es, es) != 0) return false;
  return true;
}

/* The literal whose element 0 every element of instruction `id` equals: a
 * constant with all elements equal, or a broadcast of one. NULL if none. */
static const kiln_literal *splat_of(simp *s, kiln_id id) {
  const kiln_instr *ins = s->m->instrs[id];
  for (int depth = 0; depth < 64 && ins->op == KILN_OP_BROADCAST && ins->noperands == 1; depth++)
    ins = s->m->instrs[ins->operands[0]];
  if (ins->op != KILN_OP_CONSTANT) return NULL;
  if (s->splat[ins->id] == 0) s->splat[ins->id] = literal_is_splat(ins->literal) ? 2 : 1;
  return s->splat[ins->id] == 2 ? ins->literal : NULL;
}

static bool is_real_float(kiln_dtype t) { return kiln_dtype_is_float(t); }
static bool is_int(kiln_dtype t) { return kiln_dtype_is_integral(t); }
static bool is_logical(kiln_dtype t) { return is_int(t) || t == KILN_PRED; }

static uint64_t width_mask(kiln_dtype t) {
  int bits = kiln_dtype_bits(t);
  return bits >= 64 ? UINT64_MAX : (1ull << bits) - 1;
}

/* Integer (or pred) splat equal to v. */
static bool splat_int(simp *s, kiln_id id, int64_t v) {
  const kiln_literal *l = splat_of(s, id);
  if (l == NULL || !is_logical(l->shape.dtype)) return false;
  if (l->shape.dtype == KILN_PRED) return kiln_literal_get_pred(l, 0) == (v != 0);
  if (kiln_dtype_is_unsigned_int(l->shape.dtype))
    return v >= 0 && kiln_literal_get_u64(l, 0) == (uint64_t)v;
  return kiln_literal_get_s64(l, 0) == v;
}

static bool splat_all_ones(simp *s, kiln_id id) {
  const kiln_literal *l = splat_of(s, id);
  if (l == NULL || !is_logical(l->shape.dtype)) return false;
  if (l->shape.dtype == KILN_PRED) return kiln_literal_get_pred(l, 0);
  return (kiln_literal_get_u64(l, 0) & width_mask(l->shape.dtype)) == width_mask(l->shape.dtype);
}

/* Float splat equal to v; zeros compare their signs too. */
static bool splat_float(simp *s, kiln_id id, double v) {
  const kiln_literal *l = splat_of(s, id);
  if (l == NULL || !is_real_float(l->shape.dtype)) return false;
  double x = kiln_literal_get_f64(l, 0);
  return x == v && signbit(x) == signbit(v);
}

static bool splat_one(simp *s, kiln_id id) {
  return splat_int(s, id, 1) || splat_float(s, id, 1.0);
}

/* ---- results ------------------------------------------------------------ */

/* Replaces ins by v when v has exactly ins's shape (layout included). */
static int replace(const simp *s, const kiln_instr *ins, kiln_id v, kiln_id *out) {
  if (!kiln_shape_equal(&ins->shape, &s->m->instrs[v]->shape, true)) return NO_CHANGE;
  *out = v;
  return REPLACED;
}

/* Replaces ins by a splat of value v of its own shape; when `have` is an
 * operand that already is that splat with that shape, by it. */
static int replace_splat(simp *s, const kiln_instr *ins, double v, kiln_id have, kiln_id *out) {
  if (have != KILN_NO_ID && replace(s, ins, have, out) == REPLACED) return REPLACED;
  kiln__b b = builder(s);
  kiln_id sp = kiln__b_splat(&b, kiln__b_scalar(&b, ins->shape.dtype, v), &ins->shape);
  if (sp == KILN_NO_ID || grow(s)) return KILN_ENOMEM;
  *out = sp;
  return REPLACED;
}

static int set_dims(simp *s, kiln_instr *ins, const int64_t *v, uint32_t n) {
  return kiln_instr_set_attr_ints(s->m, ins, KILN_ATTR_DIMENSIONS, v, n) ? KILN_ENOMEM : MUTATED;
}

/* ---- arithmetic and logic ----------------------------------------------- */

static int simp_add(simp *s, kiln_instr *ins, kiln_id *out) {
  kiln_id a = ins->operands[0], b = ins->operands[1];
  kiln_dtype t = ins->shape.dtype;
  if (is_int(t)) {
    if (splat_int(s, b, 0)) return replace(s, ins, a, out);
    if (splat_int(s, a, 0)) return replace(s, ins, b, out);
  } else if (is_real_float(t)) {
    if (splat_float(s, b, -0.0)) return replace(s, ins, a, out);
    if (splat_float(s, a, -0.0)) return replace(s, ins, b, out);
  }
  return NO_CHANGE;
}

static int simp_subtract(simp *s, kiln_instr *ins, kiln_id *out) {
  kiln_id a = ins->operands[0], b = ins->operands[1];
  kiln_dtype t = ins->shape.dtype;
  if (is_int(t)) {
    if (splat_int(s, b, 0)) return replace(s, ins, a, out);
    if (a == b) return replace_splat(s, ins, 0, KILN_NO_ID, out);
  } else if (is_real_float(t) && splat_float(s, b, 0.0)) {
    return replace(s, ins, a, out);
  }
  return NO_CHANGE;
}

static int simp_multiply(simp *s, kiln_instr *ins, kiln_id *out) {
  kiln_id a = ins->operands[0], b = ins->operands[1];
  kiln_dtype t = ins->shape.dtype;
  if (!is_int(t) && !is_real_float(t)) return NO_CHANGE;
  int rc;
  if (splat_one(s, b) && (rc = replace(s, ins, a, out))) return rc;
  if (splat_one(s, a) && (rc = replace(s, ins, b, out))) return rc;
  if (is_int(t)) { /* floats: x * 0 is NaN for inf/NaN and -0 for negative x */
    if (splat_int(s, b, 0)) return replace_splat(s, ins, 0, b, out);
    if (splat_int(s, a, 0)) return replace_splat(s, ins, 0, a, out);
  }
  return NO_CHANGE;
}

/* The reciprocal of a splat power of two (either sign) when type t holds
 * it exactly; 0 otherwise. */
static double exact_reciprocal(simp *s, kiln_id id, kiln_dtype t) {
  const kiln_literal *l = splat_of(s, id);
  if (l == NULL || l->shape.dtype != t) return 0;
  double v = kiln_literal_get_f64(l, 0);
  int e;
  if (!isfinite(v) || v == 0 || fabs(frexp(v, &e)) != 0.5) return 0;
  double r = 1.0 / v; /* exact in double: a power of two within range */
  if (r == 0 || !isfinite(r) || r * v != 1.0) return 0;
  switch (t) {
  case KILN_F64: return r;
  case KILN_F32: return (double)(float)r == r ? r : 0;
  case KILN_F16: return kiln_f16_to_f64(kiln_f64_to_f16(r)) == r ? r : 0;
  case KILN_BF16: return kiln_bf16_to_f64(kiln_f64_to_bf16(r)) == r ? r : 0;
  default: return 0;
  }
}

static int simp_divide(simp *s, kiln_instr *ins, kiln_id *out) {
  kiln_id a = ins->operands[0], b = ins->operands[1];
  kiln_dtype t = ins->shape.dtype;
  if (!is_int(t) && !is_real_float(t)) return NO_CHANGE;
  int rc;
  if (splat_one(s, b) && (rc = replace(s, ins, a, out))) return rc;
  double r = is_real_float(t) ? exact_reciprocal(s, b, t) : 0;
  if (r == 0) return NO_CHANGE;
  kiln__b bd = builder(s);
  kiln_id sp = kiln__b_splat(&bd, kiln__b_scalar(&bd, t, r), &opnd(s, ins, 1)->shape);
  if (sp == KILN_NO_ID || grow(s)) return KILN_ENOMEM;
  ins->op = KILN_OP_MULTIPLY;
  ins->operands[1] = sp;
  return MUTATED;
}

static int simp_power(simp *s, kiln_instr *ins, kiln_id *out) {
  kiln_id a = ins->operands[0], b = ins->operands[1];
  kiln_dtype t = ins->shape.dtype;
  if (!is_int(t) && !is_real_float(t)) return NO_CHANGE;
  if (splat_one(s, b)) return replace(s, ins, a, out);
  if (splat_int(s, b, 0) || splat_float(s, b, 0.0) || splat_float(s, b, -0.0))
    return replace_splat(s, ins, 1, KILN_NO_ID, out);
  bool two = splat_int(s, b, 2) || splat_float(s, b, 2.0);
  if (two && t != KILN_F64 && opnd(s, ins, 0)->shape.dtype == t) {
    ins->op = KILN_OP_MULTIPLY;
    ins->operands[1] = a;
    return MUTATED;
  }
  return NO_CHANGE;
}

static int simp_logic(simp *s, kiln_instr *ins, kiln_id *out) {
  kiln_id a = ins->operands[0], b = ins->operands[1];
  if (!is_logical(ins->shape.dtype)) return NO_CHANGE;
  int rc = NO_CHANGE;
  switch (ins->op) {
  case KILN_OP_AND:
    if (a == b || splat_all_ones(s, b)) return replace(s, ins, a, out);
    if (splat_all_ones(s, a)) return replace(s, ins, b, out);
    if (splat_int(s, b, 0)) return replace_splat(s, ins, 0, b, out);
    if (splat_int(s, a, 0)) return replace_splat(s, ins, 0, a, out);
    break;
  case KILN_OP_OR:
    if (a == b || splat_int(s, b, 0)) return replace(s, ins, a, out);
    if (splat_int(s, a, 0)) return replace(s, ins, b, out);
    if (splat_all_ones(s, b) && (rc = replace(s, ins, b, out))) return rc;
    if (splat_all_ones(s, a)) return replace(s, ins, a, out);
    break;
  case KILN_OP_XOR:
    if (splat_int(s, b, 0)) return replace(s, ins, a, out);
    if (splat_int(s, a, 0)) return replace(s, ins, b, out);
    if (a == b) return replace_splat(s, ins, 0, KILN_NO_ID, out);
    break;
  default: break;
  }
  return NO_CHANGE;
}

static int simp_compare(simp *s, kiln_instr *ins, kiln_id *out) {
  if (ins->operands[0] != ins->operands[1] || !is_logical(opnd(s, ins, 0)->shape.dtype))
    return NO_CHANGE;
  const kiln_attr *d = kiln_instr_attr(ins, KILN_ATTR_DIRECTION);
  if (d == NULL) return NO_CHANGE;
  bool v = d->v.i == KILN_CMP_EQ || d->v.i == KILN_CMP_GE || d->v.i == KILN_CMP_LE;
  return replace_splat(s, ins, v, KILN_NO_ID, out);
}

static int simp_select(simp *s, kiln_instr *ins, kiln_id *out) {
  kiln_id p = ins->operands[0], x = ins->operands[1], y = ins->operands[2];
  if (x == y) return replace(s, ins, x, out);
  const kiln_literal *l = splat_of(s, p);
  if (l == NULL || l->shape.dtype != KILN_PRED) return NO_CHANGE;
  return replace(s, ins, kiln_literal_get_pred(l, 0) ? x : y, out);
}

/* ---- reduce over no dimensions ------------------------------------------ */

/* Whether computation `comp` is the scalar binary op `*op` of its two
 * parameters of type t. */
static bool plain_reducer(const kiln_module *m, uint32_t comp, kiln_dtype t, kiln_opcode *op) {
  if (comp >= m->ncomps) return false;
  const kiln_computation *c = m->comps[comp];
  const kiln_instr *r = kiln_computation_root(m, c);
  if (r == NULL || r->noperands != 2 || !kiln_shape_is_array(&r->shape) || r->shape.rank != 0 ||
      r->shape.dtype != t || kiln_computation_nparams(m, c) != 2)
    return false;
  const kiln_instr *p0 = kiln_computation_param(m, c, 0), *p1 = kiln_computation_param(m, c, 1);
  if (p0 == NULL || p1 == NULL || p0->shape.dtype != t || p1->shape.dtype != t ||
      p0->shape.rank != 0 || p1->shape.rank != 0)
    return false;
  bool uses = (r->operands[0] == p0->id && r->operands[1] == p1->id) ||
              (r->operands[0] == p1->id && r->operands[1] == p0->id);
  *op = r->op;
  return uses;
}

static bool reducer_identity(simp *s, kiln_opcode op, kiln_dtype t, kiln_id init) {
  bool fl = is_real_float(t), sg = kiln_dtype_is_signed_int(t), un = kiln_dtype_is_unsigned_int(t);
  int bits = kiln_dtype_bits(t);
  int64_t smin = bits >= 64 ? INT64_MIN : -(1ll << (bits - 1));
  int64_t smax = bits >= 64 ? INT64_MAX : (1ll << (bits - 1)) - 1;
  switch (op) {
  case KILN_OP_ADD: return fl ? splat_float(s, init, -0.0) : (sg || un) && splat_int(s, init, 0);
  case KILN_OP_MULTIPLY:
    return fl ? splat_float(s, init, 1.0) : (sg || un) && splat_int(s, init, 1);
  case KILN_OP_MAXIMUM:
    return fl   ? splat_float(s, init, -INFINITY)
           : sg ? splat_int(s, init, smin)
                : un && splat_int(s, init, 0);
  case KILN_OP_MINIMUM:
    return fl   ? splat_float(s, init, INFINITY)
           : sg ? splat_int(s, init, smax)
                : un && splat_all_ones(s, init);
  case KILN_OP_AND: return is_logical(t) && splat_all_ones(s, init);
  case KILN_OP_OR: return is_logical(t) && splat_int(s, init, 0);
  default: return false;
  }
}

static int simp_reduce(simp *s, kiln_instr *ins, kiln_id *out) {
  const kiln_i64s *d = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  if (ins->noperands != 2 || ins->ncalled != 1 || (d && d->n)) return NO_CHANGE;
  kiln_dtype t = ins->shape.dtype;
  kiln_opcode op;
  if (opnd(s, ins, 0)->shape.dtype != t || !plain_reducer(s->m, ins->called[0], t, &op) ||
      !reducer_identity(s, op, t, ins->operands[1]))
    return NO_CHANGE;
  return replace(s, ins, ins->operands[0], out);
}

/* ---- shapes ------------------------------------------------------------- */

static bool is_iota(const kiln_i64s *p, uint32_t n) {
  if (p == NULL) return n == 0;
  if (p->n != n) return false;
  for (uint32_t i = 0; i < n; i++)
    if (p->v[i] != (int64_t)i) return false;
  return true;
}

/* Turns ins into a broadcast of scalar y with dimensions={} (ins keeps its
 * shape): reshape/transpose of a scalar broadcast. */
static int to_scalar_broadcast(simp *s, kiln_instr *ins, kiln_id y) {
  ins->op = KILN_OP_BROADCAST;
  ins->operands[0] = y;
  return set_dims(s, ins, NULL, 0);
}

static bool scalar_broadcast(const simp *s, const kiln_instr *x) {
  return x->op == KILN_OP_BROADCAST && x->noperands == 1 &&
         kiln_shape_is_array(&opnd(s, x, 0)->shape) && opnd(s, x, 0)->shape.rank == 0;
}

static int simp_reshape(simp *s, kiln_instr *ins, kiln_id *out) {
  kiln_instr *x = opnd(s, ins, 0);
  if (replace(s, ins, x->id, out)) return REPLACED;
  if (x->op == KILN_OP_RESHAPE && x->noperands == 1) {
    ins->operands[0] = x->operands[0];
    return MUTATED;
  }
  if (scalar_broadcast(s, x)) return to_scalar_broadcast(s, ins, x->operands[0]);
  return NO_CHANGE;
}

/* Readers of id in the computation being walked (the root counts). */
static uint32_t readers(const simp *s, kiln_id id) {
  const kiln_computation *c = s->m->comps[s->comp];
  uint32_t n = c->root == id;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *y = s->m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < y->noperands; k++) n += y->operands[k] == id;
    for (uint32_t k = 0; k < y->ncontrol; k++) n += y->control_preds[k] == id;
  }
  return n;
}

/* Whether the value id is stored as it is: the computation's root or an
 * element of a tuple (an output, a loop's state), where its own layout is
 * the one wanted. */
static bool stored(const simp *s, kiln_id id) {
  const kiln_computation *c = s->m->comps[s->comp];
  if (c->root == id) return true;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *y = s->m->instrs[c->instrs[i]];
    for (uint32_t k = 0; y->op == KILN_OP_TUPLE && k < y->noperands; k++)
      if (y->operands[k] == id) return true;
  }
  return false;
}

/* transpose(dot(a, b)) that puts b's free dims before a's (batch dims
 * staying first) is dot(b, a): the same sums of the same products, in the
 * same order of contracting pairs, written in the transposed order. A
 * gradient's dW^T that an update then transposes back (w - lr * dW^T^T)
 * becomes one GEMM writing dW in w's own order, instead of a GEMM and a
 * strided copy over the whole matrix. Only for a dot read by nothing else
 * (otherwise both products would be computed), and only where the
 * transpose is read by computations: a transpose that is stored (JAX's
 * gradient outputs are often transposes laid out {0,1}, relabellings of the
 * dot's row-major result) stays, since a row-major dot would then need a
 * copy into the stored layout. */
static int transpose_of_dot(simp *s, kiln_instr *ins, const kiln_instr *x, const kiln_i64s *p,
                            kiln_id *out) {
  if (x->op != KILN_OP_DOT || x->noperands != 2 || x->ncontrol || readers(s, x->id) != 1 ||
      stored(s, ins->id))
    return NO_CHANGE;
  const kiln_i64s *lb = kiln_instr_attr_ints(x, KILN_ATTR_LHS_BATCH_DIMS);
  const kiln_i64s *lc = kiln_instr_attr_ints(x, KILN_ATTR_LHS_CONTRACTING_DIMS);
  const kiln_i64s *rb = kiln_instr_attr_ints(x, KILN_ATTR_RHS_BATCH_DIMS);
  const kiln_i64s *rc = kiln_instr_attr_ints(x, KILN_ATTR_RHS_CONTRACTING_DIMS);
  int64_t nb = lb ? lb->n : 0, nlc = lc ? lc->n : 0;
  int64_t fa = (int64_t)opnd(s, x, 0)->shape.rank - nb - nlc;
  int64_t fb = (int64_t)p->n - nb - fa;
  if (fa <= 0 || fb <= 0 || (rb ? rb->n : 0) != nb || (rc ? rc->n : 0) != nlc) return NO_CHANGE;
  for (int64_t i = 0; i < (int64_t)p->n; i++) {
    int64_t want = i < nb ? i : i < nb + fb ? nb + fa + (i - nb) : nb + (i - nb - fb);
    if (p->v[i] != want) return NO_CHANGE;
  }
  /* Row-major: the transpose's own layout is often {0,1} (it was a
   * relabelling of the dot's row-major result), which would have the new
   * dot write the old order again. */
  kiln_shape rs = ins->shape;
  rs.layout = NULL;
  kiln__b b = builder(s);
  kiln_id ops[2] = {x->operands[1], x->operands[0]};
  kiln_instr *d = kiln__b_clone_start(&b, x, ops, 2);
  kiln_module *m = s->m;
  if (d == NULL || (rb && kiln_instr_set_attr_ints(m, d, KILN_ATTR_LHS_BATCH_DIMS, rb->v, rb->n)) ||
      (lb && kiln_instr_set_attr_ints(m, d, KILN_ATTR_RHS_BATCH_DIMS, lb->v, lb->n)) ||
      (rc && kiln_instr_set_attr_ints(m, d, KILN_ATTR_LHS_CONTRACTING_DIMS, rc->v, rc->n)) ||
      (lc && kiln_instr_set_attr_ints(m, d, KILN_ATTR_RHS_CONTRACTING_DIMS, lc->v, lc->n)) ||
      kiln_instr_set_shape(m, d, &rs) || grow(s))
    return KILN_ENOMEM;
  *out = d->id;
  return REPLACED;
}

static int simp_transpose(simp *s, kiln_instr *ins, kiln_id *out) {
  kiln_instr *x = opnd(s, ins, 0);
  const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  if (p == NULL || p->n != ins->shape.rank) return NO_CHANGE;
  if (is_iota(p, p->n) && replace(s, ins, x->id, out)) return REPLACED;
  if (scalar_broadcast(s, x)) return to_scalar_broadcast(s, ins, x->operands[0]);
  int r = transpose_of_dot(s, ins, x, p, out);
  if (r != NO_CHANGE) return r;
  const kiln_i64s *q = kiln_instr_attr_ints(x, KILN_ATTR_DIMENSIONS);
  if (x->op != KILN_OP_TRANSPOSE || q == NULL || q->n != p->n) return NO_CHANGE;
  /* Result dim i is x's dim p[i], which is x's operand's dim q[p[i]]. */
  int64_t comp[64];
  if (p->n > 64) return NO_CHANGE;
  for (uint32_t i = 0; i < p->n; i++) {
    if (p->v[i] < 0 || p->v[i] >= (int64_t)q->n) return NO_CHANGE;
    comp[i] = q->v[p->v[i]];
  }
  ins->operands[0] = x->operands[0];
  return set_dims(s, ins, comp, p->n);
}

static int simp_broadcast(simp *s, kiln_instr *ins, kiln_id *out) {
  kiln_instr *x = opnd(s, ins, 0);
  const kiln_i64s *d = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  uint32_t nd = d ? d->n : 0;
  if (x->shape.rank == ins->shape.rank && is_iota(d, nd) && replace(s, ins, x->id, out))
    return REPLACED;
  if (x->op != KILN_OP_BROADCAST || x->noperands != 1) return NO_CHANGE;
  /* x's operand dim i lands in x's dim e[i], which lands in our d[e[i]]. */
  const kiln_i64s *e = kiln_instr_attr_ints(x, KILN_ATTR_DIMENSIONS);
  uint32_t ne = e ? e->n : 0;
  int64_t comp[64];
  if (ne > 64) return NO_CHANGE;
  for (uint32_t i = 0; i < ne; i++) {
    if (e->v[i] < 0 || e->v[i] >= (int64_t)nd) return NO_CHANGE;
    comp[i] = d->v[e->v[i]];
  }
  ins->operands[0] = x->operands[0];
  return set_dims(s, ins, comp, ne);
}

static int simp_slice(simp *s, kiln_instr *ins, kiln_id *out) {
  kiln_instr *x = opnd(s, ins, 0);
  const kiln_i64s *sl = kiln_instr_attr_ints(ins, KILN_ATTR_SLICE);
  uint32_t r = ins->shape.rank;
  if (sl == NULL || sl->n != 3 * r || x->shape.rank != r) return NO_CHANGE;
  bool full = true;
  for (uint32_t i = 0; i < r; i++)
    full =
        full && sl->v[3 * i] == 0 && sl->v[3 * i + 1] == x->shape.dims[i] && sl->v[3 * i + 2] == 1;
  if (full && replace(s, ins, x->id, out)) return REPLACED;
  const kiln_i64s *in = kiln_instr_attr_ints(x, KILN_ATTR_SLICE);
  if (x->op != KILN_OP_SLICE || in == NULL || in->n != 3 * r || r > 64) return NO_CHANGE;
  /* Element j of ours is x's element start + j*stride, which is x's
   * operand's element start' + (start + j*stride)*stride'. */
  int64_t v[3 * 64];
  for (uint32_t i = 0; i < r; i++) {
    int64_t st = in->v[3 * i] + sl->v[3 * i] * in->v[3 * i + 2];
    int64_t stride = sl->v[3 * i + 2] * in->v[3 * i + 2];
    int64_t count = ins->shape.dims[i];
    v[3 * i] = st;
    v[3 * i + 1] = count ? st + (count - 1) * stride + 1 : st;
    v[3 * i + 2] = stride;
  }
  ins->operands[0] = x->operands[0];
  return kiln_instr_set_attr_ints(s->m, ins, KILN_ATTR_SLICE, v, 3 * r) ? KILN_ENOMEM : MUTATED;
}

static int simp_pad(simp *s, kiln_instr *ins, kiln_id *out) {
  const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_PADDING);
  if (p)
    for (uint32_t i = 0; i < p->n; i++)
      if (p->v[i] != 0) return NO_CHANGE;
  return replace(s, ins, ins->operands[0], out);
}

static int simp_reverse(simp *s, kiln_instr *ins, kiln_id *out) {
  const kiln_i64s *d = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  for (uint32_t i = 0; d && i < d->n; i++)
    if (d->v[i] < 0 || d->v[i] >= (int64_t)ins->shape.rank || ins->shape.dims[d->v[i]] > 1)
      return NO_CHANGE;
  return replace(s, ins, ins->operands[0], out);
}

static int simp_gte(simp *s, kiln_instr *ins, kiln_id *out) {
  kiln_instr *t = opnd(s, ins, 0);
  int64_t i = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, -1);
  if (t->op != KILN_OP_TUPLE || i < 0 || i >= (int64_t)t->noperands) return NO_CHANGE;
  return replace(s, ins, t->operands[i], out);
}

/* ---- dispatch ----------------------------------------------------------- */

static bool entry_root(const simp *s, const kiln_instr *ins) {
  const kiln_computation *c = s->m->comps[s->comp];
  return c->is_entry && c->root == ins->id;
}

static bool skip(const simp *s, const kiln_instr *ins) {
  if (!kiln__instr_is_pure(s->m, ins, NULL) || kiln_shape_is_dynamic(&ins->shape)) return true;
  int arity = kiln_opcode_arity(ins->op);
  if (arity >= 0 && ins->noperands != (uint32_t)arity) return true;
  for (uint32_t k = 0; k < ins->noperands; k++) {
    if (ins->operands[k] >= s->m->ninstrs) return true;
    if (kiln_shape_is_dynamic(&opnd(s, ins, k)->shape)) return true;
  }
  return false;
}

static int simplify(simp *s, kiln_instr *ins, kiln_id *out) {
  if (skip(s, ins)) return NO_CHANGE;
  kiln_id x = ins->noperands ? ins->operands[0] : KILN_NO_ID;
  switch (ins->op) {
  case KILN_OP_ADD: return simp_add(s, ins, out);
  case KILN_OP_SUBTRACT: return simp_subtract(s, ins, out);
  case KILN_OP_MULTIPLY: return simp_multiply(s, ins, out);
  case KILN_OP_DIVIDE: return simp_divide(s, ins, out);
  case KILN_OP_POWER: return simp_power(s, ins, out);
  case KILN_OP_AND:
  case KILN_OP_OR:
  case KILN_OP_XOR: return simp_logic(s, ins, out);
  case KILN_OP_MAXIMUM:
  case KILN_OP_MINIMUM: return x == ins->operands[1] ? replace(s, ins, x, out) : NO_CHANGE;
  case KILN_OP_COMPARE: return simp_compare(s, ins, out);
  case KILN_OP_SELECT: return simp_select(s, ins, out);
  case KILN_OP_NEGATE:
  case KILN_OP_NOT: {
    const kiln_instr *y = s->m->instrs[x];
    return y->op == ins->op ? replace(s, ins, y->operands[0], out) : NO_CHANGE;
  }
  case KILN_OP_CONVERT: return replace(s, ins, x, out);
  /* The entry's root copy may be there to give the result its own buffer. */
  case KILN_OP_COPY: return entry_root(s, ins) ? NO_CHANGE : replace(s, ins, x, out);
  case KILN_OP_RESHAPE: return simp_reshape(s, ins, out);
  case KILN_OP_TRANSPOSE: return simp_transpose(s, ins, out);
  case KILN_OP_BROADCAST: return simp_broadcast(s, ins, out);
  case KILN_OP_SLICE: return simp_slice(s, ins, out);
  case KILN_OP_PAD: return simp_pad(s, ins, out);
  case KILN_OP_REVERSE: return simp_reverse(s, ins, out);
  case KILN_OP_CONCATENATE: return ins->noperands == 1 ? replace(s, ins, x, out) : NO_CHANGE;
  case KILN_OP_REDUCE: return simp_reduce(s, ins, out);
  case KILN_OP_GET_TUPLE_ELEMENT: return simp_gte(s, ins, out);
  default: return NO_CHANGE;
  }
}

static kiln_id resolve(const simp *s, kiln_id id) {
  for (int i = 0; i < 64 && id < s->cap && s->fwd[id] != id; i++) id = s->fwd[id];
  return id;
}

/* One walk over computation `comp`; *changed is set when anything was. */
static int walk(simp *s, uint32_t comp, bool *changed, kiln_status *st) {
  kiln_module *m = s->m;
  s->comp = comp;
  s->added = false;
  uint32_t n0 = m->comps[comp]->ninstrs;
  int rc = 0;
  for (uint32_t i = 0; i < n0 && rc >= 0; i++) {
    kiln_instr *ins = m->instrs[m->comps[comp]->instrs[i]];
    if (s->fwd[ins->id] != ins->id) continue; /* replaced in an earlier sweep */
    for (uint32_t k = 0; k < ins->noperands; k++) ins->operands[k] = resolve(s, ins->operands[k]);
    kiln_id out = KILN_NO_ID;
    for (int round = 0; round < 16; round++) {
      rc = simplify(s, ins, &out);
      if (rc != MUTATED) break;
      *changed = true;
    }
    if (rc == REPLACED && out != ins->id) {
      s->fwd[ins->id] = out;
      *changed = true;
    }
  }
  if (rc < 0) return kiln_status_set(st, rc, "algsimp", "out of memory");
  if (grow(s)) return kiln_status_set(st, KILN_ENOMEM, "algsimp", "out of memory");
  kiln_computation *c = m->comps[comp];
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_instr *ins = m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < ins->ncontrol; k++)
      ins->control_preds[k] = resolve(s, ins->control_preds[k]);
  }
  if (c->root != KILN_NO_ID) c->root = resolve(s, c->root);
  if (s->added) return kiln_computation_sort(m, comp, st);
  return 0;
}

int kiln_pass_algsimp(kiln_module *m, const kiln_pass_ctx *ctx) {
  simp s = {0};
  s.m = m;
  int rc = kiln__tx_init(&s.tx, m, "algsimp", NULL);
  if (rc || grow(&s)) {
    rc = kiln_status_set(ctx->st, KILN_ENOMEM, "algsimp", "out of memory");
    goto out_free;
  }
  /* Each walk finishes most chains; a few more catch rewrites that enable
   * rewrites of earlier instructions' users through new instructions. */
  for (int sweep = 0; sweep < 4; sweep++) {
    bool changed = false;
    memset(s.splat, 0, s.cap);
    for (uint32_t c = 0; c < m->ncomps && rc == 0; c++) rc = walk(&s, c, &changed, ctx->st);
    if (rc || !changed) break;
  }
out_free:
  kiln__tx_fini(&s.tx);
  kiln_free(s.fwd);
  kiln_free(s.splat);
  return rc;
}
