/* Shape inference: the entry point, the helpers every per-op file uses, and
 * the elementwise ops (unary, binary, ternary, the convert family).
 *
 * The rules follow XLA's ShapeInference plus the extra checks its HLO
 * verifier makes (no implicit broadcast in elementwise ops). Where XLA's
 * inference ignores floating-point precision (add of f32 and bf16 operands
 * gives f32) so do we. Ops whose result cannot be derived from the operands
 * (convert, iota, reshape, ...) read the missing part from the written
 * result shape, and without one fail with KILN_EINVAL.
 *
 * Nothing here trusts the IR: operand ids, shapes, attribute values and
 * called computation ids are checked before use, because kiln_infer_shape is
 * also called by the parser on unverified modules.
 */
#include <stdio.h>
#include <string.h>

#include "common/sbuf.h"
#include "compiler/ir/infer_internal.h"
#include "compiler/ir/verify.h"

/* ---- messages ------------------------------------------------------------ */

/* "negate-start" for async sugar, else the opcode's spelling. */
static const char *op_label(const kiln_instr *ins, char *buf, size_t n) {
  const char *suffix = ins->op == KILN_OP_ASYNC_START    ? "start"
                       : ins->op == KILN_OP_ASYNC_UPDATE ? "update"
                       : ins->op == KILN_OP_ASYNC_DONE   ? "done"
                                                         : NULL;
  if (suffix && ins->async_op != KILN_OP_INVALID && (unsigned)ins->async_op < KILN_OP_COUNT) {
    snprintf(buf, n, "%s-%s", kiln_opcode_name(ins->async_op), suffix);
    return buf;
  }
  return kiln_opcode_name(ins->op);
}

void kiln__where(const kiln_module *m, const kiln_instr *ins, char *buf, size_t n) {
  const kiln_computation *c = kiln_module_computation(m, ins->comp);
  snprintf(buf, n, "%s/%s", c && c->name ? c->name : "?", ins->name ? ins->name : "?");
}

static int vfail(kiln__ictx *cx, int code, const char *fmt, va_list ap) {
  char where[KILN_STATUS_WHERE_MAX];
  char msg[KILN_STATUS_MSG_MAX];
  char label[96];
  kiln__where(cx->m, cx->ins, where, sizeof where);
  vsnprintf(msg, sizeof msg, fmt, ap);
  return kiln_status_set(cx->st, code, where, "%s: %s", op_label(cx->ins, label, sizeof label),
                         msg);
}

int kiln__fail(kiln__ictx *cx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vfail(cx, KILN_EVERIFY, fmt, ap);
  va_end(ap);
  return rc;
}

int kiln__failc(kiln__ictx *cx, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vfail(cx, code, fmt, ap);
  va_end(ap);
  return rc;
}

int kiln__oom(kiln__ictx *cx) { return kiln__failc(cx, KILN_ENOMEM, "out of memory"); }

int kiln__need_written(kiln__ictx *cx, const char *why) {
  return kiln__failc(cx, KILN_EINVAL, "the result shape must be written for this op (%s)", why);
}

static const char *keep(kiln__ictx *cx, kiln_sbuf *b) {
  const char *s = kiln_sbuf_failed(b) ? NULL : kiln_arena_strdup(cx->tmp, kiln_sbuf_str(b));
  kiln_sbuf_free(b);
  return s ? s : "?";
}

const char *kiln__sh(kiln__ictx *cx, const kiln_shape *s) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_shape_print_short(&b, s);
  return keep(cx, &b);
}

const char *kiln__on(kiln__ictx *cx, uint32_t i) {
  kiln_sbuf b = KILN_SBUF_INIT;
  const char *name = kiln__operand(cx, i)->name;
  kiln_sbuf_printf(&b, "operand %u (%%%s)", (unsigned)i, name ? name : "?");
  return keep(cx, &b);
}

const char *kiln__ints(kiln__ictx *cx, const int64_t *v, uint32_t n) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_putc(&b, '{');
  for (uint32_t i = 0; i < n; i++) kiln_sbuf_printf(&b, i ? ",%lld" : "%lld", (long long)v[i]);
  kiln_sbuf_putc(&b, '}');
  return keep(cx, &b);
}

const char *kiln__cname(const kiln_module *m, uint32_t comp) {
  const kiln_computation *c = kiln_module_computation(m, comp);
  return c && c->name ? c->name : "?";
}

/* ---- shapes -------------------------------------------------------------- */

bool kiln__shape_sane(const kiln_shape *s, int depth) {
  if (depth > KILN__MAX_TUPLE_DEPTH || (unsigned)s->dtype >= KILN_DTYPE_COUNT ||
      s->dtype == KILN_INVALID)
    return false;
  if (kiln_shape_is_tuple(s)) {
    if (s->rank && s->tuple == NULL) return false;
    for (uint32_t i = 0; i < s->rank; i++)
      if (!kiln__shape_sane(&s->tuple[i], depth + 1)) return false;
    return true;
  }
  if (!kiln_shape_is_array(s)) return s->rank == 0 || s->dims != NULL;
  if (s->rank && s->dims == NULL) return false;
  for (uint32_t i = 0; i < s->rank; i++)
    if (s->dims[i] < 0) return false;
  return true;
}

bool kiln__same_type_ignoring_fp(kiln_dtype a, kiln_dtype b) {
  return a == b || (kiln_dtype_is_float(a) && kiln_dtype_is_float(b));
}

/* Mantissa bits, to break ties between float types of one width. */
static int mantissa_bits(kiln_dtype t) {
  switch (t) {
  case KILN_F16: return 10;
  case KILN_BF16: return 7;
  case KILN_F32: return 23;
  case KILN_F64: return 52;
  case KILN_F8E5M2:
  case KILN_F8E5M2FNUZ: return 2;
  case KILN_F8E4M3FN:
  case KILN_F8E4M3B11FNUZ:
  case KILN_F8E4M3FNUZ:
  case KILN_F8E4M3: return 3;
  case KILN_F8E3M4: return 4;
  case KILN_F4E2M1FN: return 1;
  default: return 0;
  }
}

kiln_dtype kiln__higher_precision(kiln_dtype a, kiln_dtype b) {
  if (a == b || !kiln_dtype_is_float(a) || !kiln_dtype_is_float(b)) return a;
  int ba = kiln_dtype_bits(a), bb = kiln_dtype_bits(b);
  if (ba != bb) return ba > bb ? a : b;
  return mantissa_bits(b) > mantissa_bits(a) ? b : a;
}

bool kiln__same_dims(const kiln_shape *a, const kiln_shape *b) {
  if (a->rank != b->rank) return false;
  for (uint32_t i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

bool kiln__compatible(const kiln_shape *a, const kiln_shape *b, bool ignore_fp) {
  if (kiln_shape_is_tuple(a) || kiln_shape_is_tuple(b)) {
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    for (uint32_t i = 0; i < a->rank; i++)
      if (!kiln__compatible(&a->tuple[i], &b->tuple[i], ignore_fp)) return false;
    return true;
  }
  if (ignore_fp ? !kiln__same_type_ignoring_fp(a->dtype, b->dtype) : a->dtype != b->dtype)
    return false;
  if (!kiln_shape_is_array(a)) return true;
  return kiln__same_dims(a, b);
}

bool kiln__is_dyn(const kiln_shape *s, uint32_t i) {
  return s->dynamic != NULL && i < s->rank && s->dynamic[i];
}

int kiln__make_array(kiln__ictx *cx, kiln_shape *out, kiln_dtype t, const int64_t *dims,
                     const uint8_t *dyn, uint32_t rank) {
  if (kiln_shape_make_array(cx->out, out, t, dims, rank)) return kiln__oom(cx);
  bool any = false;
  for (uint32_t i = 0; dyn && i < rank; i++) any |= dyn[i] != 0;
  if (any) {
    out->dynamic = kiln_arena_calloc(cx->out, rank, 1);
    if (out->dynamic == NULL) return kiln__oom(cx);
    for (uint32_t i = 0; i < rank; i++) out->dynamic[i] = dyn[i] ? 1 : 0;
  }
  return 0;
}

static int copy_rec(kiln__ictx *cx, kiln_shape *out, const kiln_shape *src, int depth) {
  if (depth > KILN__MAX_TUPLE_DEPTH) return kiln__fail(cx, "tuple shapes nest too deeply");
  if (!kiln_shape_is_tuple(src)) {
    uint8_t *dyn = src->dynamic;
    return kiln__make_array(cx, out, src->dtype, src->dims, dyn, src->rank);
  }
  memset(out, 0, sizeof *out);
  out->dtype = KILN_TUPLE;
  out->rank = src->rank;
  if (src->rank == 0) return 0;
  out->tuple = kiln_arena_calloc(cx->out, src->rank, sizeof *out->tuple);
  if (out->tuple == NULL) return kiln__oom(cx);
  for (uint32_t i = 0; i < src->rank; i++) {
    int rc = copy_rec(cx, &out->tuple[i], &src->tuple[i], depth + 1);
    if (rc) return rc;
  }
  return 0;
}

int kiln__copy(kiln__ictx *cx, kiln_shape *out, const kiln_shape *src) {
  return copy_rec(cx, out, src, 0);
}

int kiln__make_tuple(kiln__ictx *cx, kiln_shape *out, const kiln_shape *const *elems, uint32_t n) {
  memset(out, 0, sizeof *out);
  out->dtype = KILN_TUPLE;
  out->rank = n;
  if (n == 0) return 0;
  out->tuple = kiln_arena_calloc(cx->out, n, sizeof *out->tuple);
  if (out->tuple == NULL) return kiln__oom(cx);
  for (uint32_t i = 0; i < n; i++) {
    int rc = copy_rec(cx, &out->tuple[i], elems[i], 1);
    if (rc) return rc;
  }
  return 0;
}

/* ---- operands, attributes, called computations ---------------------------- */

int kiln__expect_array(kiln__ictx *cx, uint32_t i, const char *role) {
  const kiln_shape *s = kiln__oshape(cx, i);
  if (kiln_shape_is_array(s)) return 0;
  return kiln__fail(cx, "%s%s%s must be an array, found %s", kiln__on(cx, i), role ? ", the " : "",
                    role ? role : "", kiln__sh(cx, s));
}

int kiln__expect_operands(kiln__ictx *cx, int64_t lo, int64_t hi) {
  int64_t n = cx->ins->noperands;
  if (n >= lo && (hi < 0 || n <= hi)) return 0;
  if (lo == hi)
    return kiln__fail(cx, "takes %lld operands, found %lld", (long long)lo, (long long)n);
  if (hi < 0)
    return kiln__fail(cx, "takes at least %lld operands, found %lld", (long long)lo, (long long)n);
  return kiln__fail(cx, "takes %lld to %lld operands, found %lld", (long long)lo, (long long)hi,
                    (long long)n);
}

int kiln__expect_called(kiln__ictx *cx, uint32_t n) {
  if (cx->ins->ncalled == n) return 0;
  return kiln__fail(cx, "takes %u called computations, found %u", (unsigned)n,
                    (unsigned)cx->ins->ncalled);
}

int kiln__comp_sig(kiln__ictx *cx, uint32_t comp, const char *role, kiln__sig *out) {
  const kiln_module *m = cx->m;
  memset(out, 0, sizeof *out);
  const kiln_computation *c = kiln_module_computation(m, comp);
  if (c == NULL)
    return kiln__fail(cx, "%s computation id %u does not exist (the module has %u)", role,
                      (unsigned)comp, (unsigned)m->ncomps);
  out->c = c;
  int64_t hi = -1;
  for (uint32_t k = 0; k < c->ninstrs; k++) {
    if (c->instrs[k] >= m->ninstrs || m->instrs[c->instrs[k]] == NULL)
      return kiln__fail(cx, "%s %%%s lists a bad instruction id %u", role, c->name,
                        (unsigned)c->instrs[k]);
    const kiln_instr *p = m->instrs[c->instrs[k]];
    if (p->op != KILN_OP_PARAMETER) continue;
    if (p->param_number < 0 || p->param_number >= (int64_t)c->ninstrs)
      return kiln__fail(cx, "%s %%%s has parameter %%%s with number %lld out of range", role,
                        c->name, p->name, (long long)p->param_number);
    if (p->param_number > hi) hi = p->param_number;
  }
  out->nparams = (uint32_t)(hi + 1);
  if (out->nparams) {
    out->params = kiln_arena_calloc(cx->tmp, out->nparams, sizeof *out->params);
    if (out->params == NULL) return kiln__oom(cx);
  }
  for (uint32_t k = 0; k < c->ninstrs; k++) {
    const kiln_instr *p = m->instrs[c->instrs[k]];
    if (p->op != KILN_OP_PARAMETER) continue;
    if (out->params[p->param_number])
      return kiln__fail(cx, "%s %%%s has two parameters numbered %lld", role, c->name,
                        (long long)p->param_number);
    if (!kiln__shape_sane(&p->shape, 0))
      return kiln__fail(cx, "%s %%%s: parameter %%%s has no valid shape", role, c->name, p->name);
    out->params[p->param_number] = &p->shape;
  }
  for (uint32_t k = 0; k < out->nparams; k++)
    if (out->params[k] == NULL)
      return kiln__fail(cx, "%s %%%s has no parameter number %u", role, c->name, (unsigned)k);
  kiln_id root = c->root;
  if (root == KILN_NO_ID && c->ninstrs) root = c->instrs[c->ninstrs - 1];
  if (root == KILN_NO_ID || root >= m->ninstrs || m->instrs[root] == NULL ||
      m->instrs[root]->comp != c->id)
    return kiln__fail(cx, "%s %%%s has no root instruction", role, c->name);
  if (!kiln__shape_sane(&m->instrs[root]->shape, 0))
    return kiln__fail(cx, "%s %%%s: root %%%s has no valid shape", role, c->name,
                      m->instrs[root]->name);
  out->result = &m->instrs[root]->shape;
  return 0;
}

int kiln__called_sig(kiln__ictx *cx, uint32_t k, const char *role, kiln__sig *out) {
  if (k >= cx->ins->ncalled) return kiln__fail(cx, "has no %s computation", role);
  return kiln__comp_sig(cx, cx->ins->called[k], role, out);
}

static const kiln_attr *find_attr(kiln__ictx *cx, kiln_attr_key k) {
  return kiln_instr_attr(cx->ins, k);
}

int kiln__attr_int(kiln__ictx *cx, kiln_attr_key k, bool required, int64_t dflt, int64_t *out) {
  const kiln_attr *a = find_attr(cx, k);
  if (a == NULL) {
    if (required) return kiln__fail(cx, "attribute %s is missing", kiln_attr_key_name(k));
    *out = dflt;
    return 0;
  }
  *out = a->v.i;
  return 0;
}

int kiln__attr_ints(kiln__ictx *cx, kiln_attr_key k, bool required, kiln_i64s *out) {
  const kiln_attr *a = find_attr(cx, k);
  out->v = NULL;
  out->n = 0;
  if (a == NULL) {
    if (required) return kiln__fail(cx, "attribute %s is missing", kiln_attr_key_name(k));
    return 0;
  }
  if (a->v.ints.n && a->v.ints.v == NULL)
    return kiln__fail(cx, "attribute %s has no values", kiln_attr_key_name(k));
  *out = a->v.ints;
  return 0;
}

int kiln__check_dims(kiln__ictx *cx, const char *what, const int64_t *v, uint32_t n, int64_t rank) {
  for (uint32_t i = 0; i < n; i++) {
    if (v[i] < 0 || v[i] >= rank)
      return kiln__fail(cx, "%s %s: dimension %lld is out of range for rank %lld", what,
                        kiln__ints(cx, v, n), (long long)v[i], (long long)rank);
    for (uint32_t j = 0; j < i; j++)
      if (v[j] == v[i])
        return kiln__fail(cx, "%s %s: dimension %lld appears twice", what, kiln__ints(cx, v, n),
                          (long long)v[i]);
  }
  return 0;
}

/* ---- elementwise ---------------------------------------------------------- */

/* Element type classes the unary/binary rules speak of. */
typedef enum tclass {
  TC_ANY,        /* any array type */
  TC_NOT_PRED,   /* arithmetic: anything but pred */
  TC_FLOAT,      /* real floating point */
  TC_FLOAT_CPLX, /* floating point or complex */
  TC_INT,        /* signed or unsigned integer */
  TC_PRED_INT,   /* pred or integer */
  TC_SIGNED,     /* signed integer or floating point */
  TC_SIGNED_CPLX /* signed integer, floating point or complex */
} tclass;

static bool in_class(kiln_dtype t, tclass c) {
  switch (c) {
  case TC_ANY: return kiln_dtype_is_array(t);
  case TC_NOT_PRED: return kiln_dtype_is_array(t) && t != KILN_PRED;
  case TC_FLOAT: return kiln_dtype_is_float(t);
  case TC_FLOAT_CPLX: return kiln_dtype_is_float(t) || kiln_dtype_is_complex(t);
  case TC_INT: return kiln_dtype_is_integral(t);
  case TC_PRED_INT: return t == KILN_PRED || kiln_dtype_is_integral(t);
  case TC_SIGNED: return kiln_dtype_is_signed_int(t) || kiln_dtype_is_float(t);
  case TC_SIGNED_CPLX:
    return kiln_dtype_is_signed_int(t) || kiln_dtype_is_float(t) || kiln_dtype_is_complex(t);
  }
  return false;
}

static const char *class_name(tclass c) {
  switch (c) {
  case TC_ANY: return "an array type";
  case TC_NOT_PRED: return "an arithmetic type (not pred)";
  case TC_FLOAT: return "a floating-point type";
  case TC_FLOAT_CPLX: return "a floating-point or complex type";
  case TC_INT: return "an integer type";
  case TC_PRED_INT: return "pred or an integer type";
  case TC_SIGNED: return "a signed integer or floating-point type";
  case TC_SIGNED_CPLX: return "a signed integer, floating-point or complex type";
  }
  return "?";
}

static int expect_class(kiln__ictx *cx, uint32_t i, tclass c) {
  int rc = kiln__expect_array(cx, i, NULL);
  if (rc) return rc;
  const kiln_shape *s = kiln__oshape(cx, i);
  if (in_class(s->dtype, c)) return 0;
  return kiln__fail(cx, "%s has type %s, expected %s", kiln__on(cx, i), kiln__sh(cx, s),
                    class_name(c));
}

static kiln_dtype complex_component(kiln_dtype t) { return t == KILN_C128 ? KILN_F64 : KILN_F32; }

/* Copies operand 0's dims and dynamic flags with element type t. */
static int like_operand(kiln__ictx *cx, kiln_shape *out, uint32_t i, kiln_dtype t) {
  const kiln_shape *s = kiln__oshape(cx, i);
  return kiln__make_array(cx, out, t, s->dims, s->dynamic, s->rank);
}

static int written_dtype(kiln__ictx *cx, const char *why, kiln_dtype *t) {
  *t = KILN_INVALID; /* set on every path: GCC -O3 cannot see that the others fail */
  if (cx->written == NULL) return kiln__need_written(cx, why);
  if (!kiln_shape_is_array(cx->written))
    return kiln__fail(cx, "result must be an array, found %s", kiln__sh(cx, cx->written));
  *t = cx->written->dtype;
  return 0;
}

static int infer_unary(kiln__ictx *cx, kiln_shape *out) {
  const kiln_instr *ins = cx->ins;
  tclass c;
  switch (ins->op) {
  case KILN_OP_FLOOR:
  case KILN_OP_CEIL:
  case KILN_OP_ROUND_AFZ:
  case KILN_OP_ROUND_EVEN:
  case KILN_OP_ERF:
  case KILN_OP_IS_FINITE: c = TC_FLOAT; break;
  case KILN_OP_COS:
  case KILN_OP_SIN:
  case KILN_OP_TAN:
  case KILN_OP_EXP:
  case KILN_OP_EXPM1:
  case KILN_OP_LOG:
  case KILN_OP_LOG1P:
  case KILN_OP_LOGISTIC:
  case KILN_OP_RSQRT:
  case KILN_OP_SQRT:
  case KILN_OP_CBRT:
  case KILN_OP_TANH:
  case KILN_OP_REAL:
  case KILN_OP_IMAG: c = TC_FLOAT_CPLX; break;
  case KILN_OP_ABS: c = TC_SIGNED_CPLX; break;
  case KILN_OP_SIGN: c = TC_SIGNED_CPLX; break;
  case KILN_OP_NEGATE: c = TC_NOT_PRED; break;
  case KILN_OP_CLZ:
  case KILN_OP_POPCNT: c = TC_INT; break;
  case KILN_OP_NOT: c = TC_PRED_INT; break;
  default: c = TC_ANY; break;
  }
  int rc = expect_class(cx, 0, c);
  if (rc) return rc;
  kiln_dtype t = kiln__oshape(cx, 0)->dtype;
  switch (ins->op) {
  case KILN_OP_IS_FINITE: return like_operand(cx, out, 0, KILN_PRED);
  case KILN_OP_REAL:
  case KILN_OP_IMAG:
  case KILN_OP_ABS:
    return like_operand(cx, out, 0, kiln_dtype_is_complex(t) ? complex_component(t) : t);
  default: return like_operand(cx, out, 0, t);
  }
}

static int infer_reduce_precision(kiln__ictx *cx, kiln_shape *out) {
  int64_t e = 0, mb = 0;
  int rc = expect_class(cx, 0, TC_FLOAT);
  if (rc || (rc = kiln__attr_int(cx, KILN_ATTR_EXPONENT_BITS, true, 0, &e)) ||
      (rc = kiln__attr_int(cx, KILN_ATTR_MANTISSA_BITS, true, 0, &mb)))
    return rc;
  if (e < 1) return kiln__fail(cx, "exponent_bits is %lld, expected at least 1", (long long)e);
  if (mb < 0) return kiln__fail(cx, "mantissa_bits is %lld, expected at least 0", (long long)mb);
  return like_operand(cx, out, 0, kiln__oshape(cx, 0)->dtype);
}

static int infer_convert(kiln__ictx *cx, kiln_shape *out) {
  kiln_dtype t;
  int rc = kiln__expect_array(cx, 0, NULL);
  if (rc || (rc = written_dtype(cx, "the new element type", &t))) return rc;
  return like_operand(cx, out, 0, t);
}

static int infer_bitcast_convert(kiln__ictx *cx, kiln_shape *out) {
  kiln_dtype t;
  int rc = kiln__expect_array(cx, 0, NULL);
  if (rc || (rc = written_dtype(cx, "the new element type", &t))) return rc;
  const kiln_shape *s = kiln__oshape(cx, 0);
  if (kiln_dtype_is_complex(s->dtype) != kiln_dtype_is_complex(t))
    return kiln__fail(cx, "cannot bitcast between complex and real types: %s to %s",
                      kiln__sh(cx, s), kiln_dtype_name(t));
  int ib = kiln_dtype_bits(s->dtype), ob = kiln_dtype_bits(t);
  int hi = ib > ob ? ib : ob, lo = ib > ob ? ob : ib;
  if (lo == 0 || hi % lo)
    return kiln__fail(cx, "cannot bitcast %s to %s: bit widths %d and %d do not divide",
                      kiln__sh(cx, s), kiln_dtype_name(t), ib, ob);
  int64_t ratio = hi / lo;
  int64_t dims[64 + 1];
  uint8_t dyn[64 + 1];
  if (s->rank > 64) return kiln__fail(cx, "%s has rank %u, over 64", kiln__on(cx, 0), s->rank);
  for (uint32_t i = 0; i < s->rank; i++) {
    dims[i] = s->dims[i];
    dyn[i] = kiln__is_dyn(s, i);
  }
  uint32_t rank = s->rank;
  if (ib > ob) {
    dims[rank] = ratio;
    dyn[rank++] = 0;
  } else if (ib < ob) {
    if (rank == 0 || dims[rank - 1] != ratio)
      return kiln__fail(cx,
                        "bitcast from %s to %s needs a last dimension of size %lld (the ratio "
                        "of bit widths)",
                        kiln__sh(cx, s), kiln_dtype_name(t), (long long)ratio);
    rank--;
  }
  return kiln__make_array(cx, out, t, dims, dyn, rank);
}

/* Binary elementwise: same dims (HLO has no implicit broadcast), element
 * types equal up to floating-point precision. */
static int same_shape_operands(kiln__ictx *cx, uint32_t a, uint32_t b) {
  const kiln_shape *sa = kiln__oshape(cx, a), *sb = kiln__oshape(cx, b);
  if (!kiln__same_type_ignoring_fp(sa->dtype, sb->dtype))
    return kiln__fail(cx, "%s has type %s but %s has type %s", kiln__on(cx, b), kiln__sh(cx, sb),
                      kiln__on(cx, a), kiln__sh(cx, sa));
  if (!kiln__same_dims(sa, sb))
    return kiln__fail(cx, "%s has shape %s but %s has shape %s", kiln__on(cx, b), kiln__sh(cx, sb),
                      kiln__on(cx, a), kiln__sh(cx, sa));
  return 0;
}

static int merged_like(kiln__ictx *cx, kiln_shape *out, const uint32_t *ops, uint32_t n,
                       kiln_dtype t) {
  const kiln_shape *s = kiln__oshape(cx, ops[0]);
  int rc = kiln__make_array(cx, out, t, s->dims, NULL, s->rank);
  if (rc) return rc;
  for (uint32_t k = 0; k < n; k++) {
    const kiln_shape *o = kiln__oshape(cx, ops[k]);
    if (o->rank != s->rank) continue; /* a scalar operand (clamp, select) */
    for (uint32_t i = 0; i < s->rank; i++) {
      if (!kiln__is_dyn(o, i)) continue;
      if (out->dynamic == NULL) {
        out->dynamic = kiln_arena_calloc(cx->out, s->rank, 1);
        if (out->dynamic == NULL) return kiln__oom(cx);
      }
      out->dynamic[i] = 1;
    }
  }
  return 0;
}

/* Comparison type attribute against the element type, as XLA checks it. */
static int check_compare_type(kiln__ictx *cx, kiln_dtype t) {
  int64_t dir = 0;
  int rc = kiln__attr_int(cx, KILN_ATTR_DIRECTION, true, 0, &dir);
  if (rc) return rc;
  if (dir < KILN_CMP_EQ || dir > KILN_CMP_LT)
    return kiln__fail(cx, "direction %lld is not a comparison direction", (long long)dir);
  const char *ty = kiln_instr_attr_str(cx->ins, KILN_ATTR_TYPE);
  if (ty == NULL) return 0;
  bool ok;
  if (strcmp(ty, "FLOAT") == 0 || strcmp(ty, "TOTALORDER") == 0 || strcmp(ty, "PARTIALORDER") == 0)
    ok = kiln_dtype_is_float(t) || kiln_dtype_is_complex(t);
  else if (strcmp(ty, "SIGNED") == 0)
    ok = kiln_dtype_is_signed_int(t);
  else if (strcmp(ty, "UNSIGNED") == 0)
    ok = kiln_dtype_is_unsigned_int(t) || t == KILN_PRED;
  else
    return kiln__fail(cx, "comparison type %s is not one of FLOAT, TOTALORDER, SIGNED, UNSIGNED",
                      ty);
  if (!ok)
    return kiln__fail(cx, "comparison type %s does not apply to element type %s", ty,
                      kiln_dtype_name(t));
  return 0;
}

static int infer_binary(kiln__ictx *cx, kiln_shape *out) {
  const kiln_instr *ins = cx->ins;
  tclass c;
  switch (ins->op) {
  case KILN_OP_SUBTRACT:
  case KILN_OP_POWER:
  case KILN_OP_DIVIDE:
  case KILN_OP_REMAINDER: c = TC_NOT_PRED; break;
  case KILN_OP_ATAN2: c = TC_FLOAT_CPLX; break;
  case KILN_OP_SHIFT_LEFT:
  case KILN_OP_SHIFT_RIGHT_ARITH:
  case KILN_OP_SHIFT_RIGHT_LOGICAL: c = TC_INT; break;
  case KILN_OP_AND:
  case KILN_OP_OR:
  case KILN_OP_XOR: c = TC_PRED_INT; break;
  case KILN_OP_COMPLEX: c = TC_FLOAT; break;
  default: c = TC_ANY; break;
  }
  int rc;
  if ((rc = expect_class(cx, 0, c)) || (rc = expect_class(cx, 1, c)) ||
      (rc = same_shape_operands(cx, 0, 1)))
    return rc;
  static const uint32_t ops[2] = {0, 1};
  kiln_dtype a = kiln__oshape(cx, 0)->dtype, b = kiln__oshape(cx, 1)->dtype;
  kiln_dtype t = kiln__higher_precision(a, b);
  switch (ins->op) {
  case KILN_OP_COMPARE:
    if ((rc = check_compare_type(cx, t))) return rc;
    t = KILN_PRED;
    break;
  case KILN_OP_COMPLEX:
    if (a == KILN_F32 && b == KILN_F32)
      t = KILN_C64;
    else if (a == KILN_F64 && b == KILN_F64)
      t = KILN_C128;
    else
      return kiln__fail(cx, "operands must be both f32 or both f64, found %s and %s",
                        kiln_dtype_name(a), kiln_dtype_name(b));
    break;
  default: break;
  }
  return merged_like(cx, out, ops, 2, t);
}

static int infer_stochastic_convert(kiln__ictx *cx, kiln_shape *out) {
  kiln_dtype t;
  int rc;
  if ((rc = expect_class(cx, 0, TC_FLOAT)) || (rc = kiln__expect_array(cx, 1, NULL))) return rc;
  const kiln_shape *s = kiln__oshape(cx, 0), *r = kiln__oshape(cx, 1);
  if (!kiln_dtype_is_unsigned_int(r->dtype))
    return kiln__fail(cx, "%s holds the random bits and must be unsigned, found %s",
                      kiln__on(cx, 1), kiln__sh(cx, r));
  if (kiln_dtype_bits(r->dtype) != kiln_dtype_bits(s->dtype))
    return kiln__fail(cx, "%s has %d-bit elements but %s has %d-bit elements", kiln__on(cx, 1),
                      kiln_dtype_bits(r->dtype), kiln__on(cx, 0), kiln_dtype_bits(s->dtype));
  if (!kiln__same_dims(s, r))
    return kiln__fail(cx, "%s has shape %s but %s has shape %s", kiln__on(cx, 1), kiln__sh(cx, r),
                      kiln__on(cx, 0), kiln__sh(cx, s));
  if ((rc = written_dtype(cx, "the new element type", &t))) return rc;
  return like_operand(cx, out, 0, t);
}

static int infer_select(kiln__ictx *cx, kiln_shape *out) {
  int rc;
  if ((rc = kiln__expect_array(cx, 0, "predicate")) || (rc = kiln__expect_array(cx, 1, NULL)) ||
      (rc = kiln__expect_array(cx, 2, NULL)))
    return rc;
  const kiln_shape *p = kiln__oshape(cx, 0), *a = kiln__oshape(cx, 1);
  if (p->dtype != KILN_PRED)
    return kiln__fail(cx, "%s is the predicate and must have type pred, found %s", kiln__on(cx, 0),
                      kiln__sh(cx, p));
  if ((rc = same_shape_operands(cx, 1, 2))) return rc;
  if (p->rank != 0 && !kiln__same_dims(p, a))
    return kiln__fail(cx,
                      "%s (the predicate) has shape %s but %s has shape %s; the predicate "
                      "must be a scalar or have the same dimensions",
                      kiln__on(cx, 0), kiln__sh(cx, p), kiln__on(cx, 1), kiln__sh(cx, a));
  static const uint32_t ops[3] = {1, 2, 0};
  kiln_dtype t = kiln__higher_precision(a->dtype, kiln__oshape(cx, 2)->dtype);
  return merged_like(cx, out, ops, 3, t);
}

static int infer_clamp(kiln__ictx *cx, kiln_shape *out) {
  int rc;
  for (uint32_t i = 0; i < 3; i++)
    if ((rc = expect_class(cx, i, TC_NOT_PRED))) return rc;
  const kiln_shape *x = kiln__oshape(cx, 1);
  for (uint32_t i = 0; i < 3; i += 2) {
    const kiln_shape *b = kiln__oshape(cx, i);
    if (!kiln__same_type_ignoring_fp(b->dtype, x->dtype))
      return kiln__fail(cx, "%s has type %s but %s has type %s", kiln__on(cx, i), kiln__sh(cx, b),
                        kiln__on(cx, 1), kiln__sh(cx, x));
    if (b->rank != 0 && !kiln__same_dims(b, x))
      return kiln__fail(cx,
                        "%s (a bound) has shape %s but %s has shape %s; a bound must be a "
                        "scalar or have the same dimensions",
                        kiln__on(cx, i), kiln__sh(cx, b), kiln__on(cx, 1), kiln__sh(cx, x));
  }
  static const uint32_t ops[3] = {1, 0, 2};
  return merged_like(cx, out, ops, 3, x->dtype);
}

int kiln__infer_elementwise(kiln__ictx *cx, kiln_shape *out) {
  switch (cx->ins->op) {
  case KILN_OP_CONVERT: return infer_convert(cx, out);
  case KILN_OP_BITCAST_CONVERT: return infer_bitcast_convert(cx, out);
  case KILN_OP_REDUCE_PRECISION: return infer_reduce_precision(cx, out);
  case KILN_OP_STOCHASTIC_CONVERT: return infer_stochastic_convert(cx, out);
  case KILN_OP_SELECT: return infer_select(cx, out);
  case KILN_OP_CLAMP: return infer_clamp(cx, out);
  case KILN_OP_COPY: return kiln__copy(cx, out, kiln__oshape(cx, 0));
  default: break;
  }
  if (kiln_opcode_family(cx->ins->op) == KILN_FAM_UNARY) return infer_unary(cx, out);
  return infer_binary(cx, out);
}

/* ---- dispatch ------------------------------------------------------------- */

int kiln__infer(kiln__ictx *cx, kiln_shape *out) {
  const kiln_instr *ins = cx->ins;
  const kiln_module *m = cx->m;
  memset(out, 0, sizeof *out);
  if ((unsigned)ins->op >= KILN_OP_COUNT || ins->op == KILN_OP_INVALID)
    return kiln__fail(cx, "opcode %d is not a valid opcode", (int)ins->op);
  if (ins->noperands && ins->operands == NULL) return kiln__fail(cx, "operand list is missing");
  for (uint32_t i = 0; i < ins->noperands; i++) {
    kiln_id id = ins->operands[i];
    if (id >= m->ninstrs || m->instrs[id] == NULL)
      return kiln__fail(cx, "operand %u has id %u, which is not an instruction", (unsigned)i,
                        (unsigned)id);
    if (!kiln__shape_sane(&m->instrs[id]->shape, 0))
      return kiln__fail(cx, "operand %u (%%%s) has no valid shape", (unsigned)i,
                        m->instrs[id]->name);
  }
  if (ins->ncalled && ins->called == NULL)
    return kiln__fail(cx, "called computation list is missing");
  /* Fixed arities come from ops.def; variadic ops check their own. */
  int arity = kiln_opcode_arity(ins->op);
  if (arity >= 0) {
    int rc = kiln__expect_operands(cx, arity, arity);
    if (rc) return rc;
  }
  /* One inference file per family of ops.def. */
  switch (kiln_opcode_family(ins->op)) {
  case KILN_FAM_UNARY:
  case KILN_FAM_BINARY:
  case KILN_FAM_COMPARE:
  case KILN_FAM_TERNARY: return kiln__infer_elementwise(cx, out);
  case KILN_FAM_MOVEMENT: return kiln__infer_data_movement(cx, out);
  case KILN_FAM_REDUCTION:
  case KILN_FAM_COMPUTE: return kiln__infer_compute(cx, out);
  default: return kiln__infer_control(cx, out);
  }
}

int kiln_infer_shape(const kiln_module *m, const kiln_instr *ins, kiln_arena *a, kiln_shape *out,
                     kiln_status *st) {
  if (m == NULL || ins == NULL || a == NULL || out == NULL)
    return kiln_status_set(st, KILN_EINVAL, NULL, "kiln_infer_shape: NULL argument");
  kiln__ictx cx = {.m = m, .ins = ins, .out = a, .st = st};
  cx.tmp = kiln_arena_create();
  if (cx.tmp == NULL) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  if (ins->shape.dtype != KILN_INVALID && kiln__shape_sane(&ins->shape, 0))
    cx.written = &ins->shape;
  int rc = kiln__infer(&cx, out);
  kiln_arena_destroy(cx.tmp);
  return rc;
}
