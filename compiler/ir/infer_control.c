/* Shape inference for structure and control: parameter, constant, tuple,
 * get-tuple-element, while, conditional, call, fusion, custom-call, the
 * async start/update/done chain (both the generic `calls=` form and the
 * "negate-start" sugar), tokens and side effects (after-all,
 * add-dependency, infeed, outfeed, send, recv, copy-start/done), random
 * numbers, opt-barrier and domain. Collectives are in infer_collective.c.
 *
 * An async start produces ((operands...), result, context...): the
 * context elements are the runtime's business, so inference keeps whatever
 * the written shape has past the first two elements.
 */
#include <string.h>

#include "compiler/ir/infer_internal.h"
#include "compiler/ir/lapack.h"

static bool is_token(const kiln_shape *s) { return s->dtype == KILN_TOKEN; }

static bool is_scalar_u32(const kiln_shape *s) {
  return kiln_shape_is_array(s) && s->rank == 0 && s->dtype == KILN_U32;
}

static int expect_token(kiln__ictx *cx, uint32_t i) {
  if (is_token(kiln__oshape(cx, i))) return 0;
  return kiln__fail(cx, "%s must be a token, found %s", kiln__on(cx, i),
                    kiln__sh(cx, kiln__oshape(cx, i)));
}

static int make_token(kiln__ictx *cx, kiln_shape *out) {
  memset(out, 0, sizeof *out);
  out->dtype = KILN_TOKEN;
  return 0;
}

static int make_scalar(kiln__ictx *cx, kiln_shape *out, kiln_dtype t) {
  return kiln__make_array(cx, out, t, NULL, NULL, 0);
}

static int need_written(kiln__ictx *cx, const char *why, const kiln_shape **w) {
  if (cx->written == NULL) return kiln__need_written(cx, why);
  *w = cx->written;
  return 0;
}

int kiln__with_context(kiln__ictx *cx, kiln_shape *out, const kiln_shape *const *elems,
                       uint32_t n) {
  const kiln_shape *w = cx->written;
  uint32_t extra = w && kiln_shape_is_tuple(w) && w->rank > n ? w->rank - n : 0;
  const kiln_shape **all = kiln_arena_calloc(cx->tmp, n + extra + 1, sizeof *all);
  if (all == NULL) return kiln__oom(cx);
  for (uint32_t i = 0; i < n; i++) all[i] = elems[i];
  for (uint32_t i = 0; i < extra; i++) all[n + i] = &w->tuple[n + i];
  return kiln__make_tuple(cx, out, all, n + extra);
}

/* The tuple of operand shapes, or operand 0's shape alone when n == 1 and
 * `single` says so. */
static int operands_shape(kiln__ictx *cx, kiln_shape *out, uint32_t first, bool single) {
  uint32_t n = cx->ins->noperands - first;
  if (single && n == 1) return kiln__copy(cx, out, kiln__oshape(cx, first));
  const kiln_shape **el = kiln_arena_calloc(cx->tmp, n + 1, sizeof *el);
  if (el == NULL) return kiln__oom(cx);
  for (uint32_t i = 0; i < n; i++) el[i] = kiln__oshape(cx, first + i);
  return kiln__make_tuple(cx, out, el, n);
}

/* ---- parameter, constant, tuples ------------------------------------------ */

static int infer_parameter(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *w = NULL;
  int rc = need_written(cx, "a parameter declares its shape", &w);
  return rc ? rc : kiln__copy(cx, out, w);
}

static int infer_constant(kiln__ictx *cx, kiln_shape *out) {
  const kiln_literal *lit = cx->ins->literal;
  if (lit == NULL)
    return cx->written ? kiln__fail(cx, "the constant has no literal value")
                       : kiln__need_written(cx, "the constant has no literal");
  if (!kiln__shape_sane(&lit->shape, 0)) return kiln__fail(cx, "the literal has no valid shape");
  return kiln__copy(cx, out, &lit->shape);
}

static int infer_gte(kiln__ictx *cx, kiln_shape *out) {
  int64_t k = 0;
  int rc = kiln__attr_int(cx, KILN_ATTR_INDEX, true, 0, &k);
  if (rc) return rc;
  const kiln_shape *s = kiln__oshape(cx, 0);
  if (!kiln_shape_is_tuple(s))
    return kiln__fail(cx, "%s must be a tuple, found %s", kiln__on(cx, 0), kiln__sh(cx, s));
  if (k < 0 || k >= s->rank)
    return kiln__fail(cx, "index %lld is out of range for %s with %u elements", (long long)k,
                      kiln__on(cx, 0), (unsigned)s->rank);
  return kiln__copy(cx, out, &s->tuple[k]);
}

/* ---- calls ---------------------------------------------------------------- */

/* Operand i against parameter p of a called computation. */
static int arg_matches(kiln__ictx *cx, const kiln__sig *g, const char *role, uint32_t i,
                       uint32_t p) {
  if (kiln__compatible(kiln__oshape(cx, i), g->params[p], false)) return 0;
  return kiln__fail(cx, "%s %%%s parameter %u has shape %s but %s has shape %s", role, g->c->name,
                    (unsigned)p, kiln__sh(cx, g->params[p]), kiln__on(cx, i),
                    kiln__sh(cx, kiln__oshape(cx, i)));
}

static int call_like(kiln__ictx *cx, const char *role, kiln__sig *g, bool fewer_params_ok) {
  int rc;
  if ((rc = kiln__expect_called(cx, 1)) || (rc = kiln__called_sig(cx, 0, role, g))) return rc;
  uint32_t n = cx->ins->noperands;
  if (fewer_params_ok ? g->nparams > n : g->nparams != n)
    return kiln__fail(cx, "%s %%%s takes %u parameters but the instruction has %u operands", role,
                      g->c->name, (unsigned)g->nparams, (unsigned)n);
  for (uint32_t i = 0; i < g->nparams; i++)
    if ((rc = arg_matches(cx, g, role, i, i))) return rc;
  return 0;
}

static int infer_call(kiln__ictx *cx, kiln_shape *out) {
  kiln__sig g;
  /* XLA lets a fusion ignore trailing operands it has no parameter for. */
  bool fusion = cx->ins->op == KILN_OP_FUSION;
  int rc = call_like(cx, fusion ? "calls" : "to_apply", &g, fusion);
  return rc ? rc : kiln__copy(cx, out, g.result);
}

static int infer_custom_call(kiln__ictx *cx, kiln_shape *out) {
  kiln__sig g;
  const kiln_shape *w = NULL;
  int rc;
  for (uint32_t k = 0; k < cx->ins->ncalled; k++)
    if ((rc = kiln__called_sig(cx, k, "called", &g))) return rc;
  if ((rc = need_written(cx, "a custom call declares its result", &w))) return rc;
  if (kiln_lapack_is(cx->ins)) {
    /* JAX's LAPACK calls: target, backend_config, operands and result tuple. */
    kiln_lapack l;
    char why[256];
    if (kiln_lapack_describe(cx->m, cx->ins, &l, why, sizeof why)) return kiln__fail(cx, "%s", why);
  }
  return kiln__copy(cx, out, w);
}

static int infer_while(kiln__ictx *cx, kiln_shape *out) {
  kiln__sig c, b;
  int rc;
  if ((rc = kiln__expect_called(cx, 2)) || (rc = kiln__called_sig(cx, 0, "condition", &c)) ||
      (rc = kiln__called_sig(cx, 1, "body", &b)))
    return rc;
  const kiln_shape *init = kiln__oshape(cx, 0);
  if (c.nparams != 1)
    return kiln__fail(cx, "condition %%%s takes %u parameters, expected 1", c.c->name,
                      (unsigned)c.nparams);
  if (b.nparams != 1)
    return kiln__fail(cx, "body %%%s takes %u parameters, expected 1", b.c->name,
                      (unsigned)b.nparams);
  if (!(kiln_shape_is_array(c.result) && c.result->rank == 0 && c.result->dtype == KILN_PRED))
    return kiln__fail(cx, "condition %%%s returns %s, expected pred[]", c.c->name,
                      kiln__sh(cx, c.result));
  if (!kiln__compatible(b.result, b.params[0], false))
    return kiln__fail(cx, "body %%%s returns %s but takes %s", b.c->name, kiln__sh(cx, b.result),
                      kiln__sh(cx, b.params[0]));
  if (!kiln__compatible(c.params[0], b.params[0], false))
    return kiln__fail(cx, "condition %%%s takes %s but body %%%s takes %s", c.c->name,
                      kiln__sh(cx, c.params[0]), b.c->name, kiln__sh(cx, b.params[0]));
  if (!kiln__compatible(init, b.params[0], false))
    return kiln__fail(cx, "body %%%s takes %s but %s (the initial state) has shape %s", b.c->name,
                      kiln__sh(cx, b.params[0]), kiln__on(cx, 0), kiln__sh(cx, init));
  return kiln__copy(cx, out, init);
}

/* ORs the dynamic flags of `src` into `dst` (same structure). */
static int merge_dynamic(kiln__ictx *cx, kiln_shape *dst, const kiln_shape *src, int depth) {
  if (depth > KILN__MAX_TUPLE_DEPTH) return 0;
  if (kiln_shape_is_tuple(dst)) {
    for (uint32_t i = 0; i < dst->rank && i < src->rank; i++)
      merge_dynamic(cx, &dst->tuple[i], &src->tuple[i], depth + 1);
    return 0;
  }
  for (uint32_t i = 0; i < dst->rank && i < src->rank; i++) {
    if (!kiln__is_dyn(src, i)) continue;
    if (dst->dynamic == NULL && !(dst->dynamic = kiln_arena_calloc(cx->out, dst->rank, 1)))
      return kiln__oom(cx);
    dst->dynamic[i] = 1;
  }
  return 0;
}

static int infer_conditional(kiln__ictx *cx, kiln_shape *out) {
  int rc;
  const kiln_shape *sel = kiln__oshape(cx, 0);
  uint32_t nb = cx->ins->ncalled;
  if (!(kiln_shape_is_array(sel) && sel->rank == 0 &&
        (sel->dtype == KILN_PRED || sel->dtype == KILN_S32)))
    return kiln__fail(cx, "%s selects the branch and must be pred[] or s32[], found %s",
                      kiln__on(cx, 0), kiln__sh(cx, sel));
  if (sel->dtype == KILN_PRED && nb != 2)
    return kiln__fail(cx, "a pred selector needs 2 branch computations, found %u", (unsigned)nb);
  if (nb == 0) return kiln__fail(cx, "has no branch computations");
  if ((rc = kiln__expect_operands(cx, nb + 1, nb + 1))) return rc;
  kiln__sig g0, g;
  for (uint32_t k = 0; k < nb; k++) {
    kiln__sig *gk = k ? &g : &g0;
    if ((rc = kiln__called_sig(cx, k, "branch", gk))) return rc;
    if (gk->nparams != 1)
      return kiln__fail(cx, "branch %u %%%s takes %u parameters, expected 1", (unsigned)k,
                        gk->c->name, (unsigned)gk->nparams);
    if (!kiln__compatible(gk->params[0], kiln__oshape(cx, k + 1), false))
      return kiln__fail(cx, "branch %u %%%s takes %s but %s has shape %s", (unsigned)k, gk->c->name,
                        kiln__sh(cx, gk->params[0]), kiln__on(cx, k + 1),
                        kiln__sh(cx, kiln__oshape(cx, k + 1)));
    if (k && !kiln__compatible(gk->result, g0.result, false))
      return kiln__fail(cx, "branch %u %%%s returns %s but branch 0 %%%s returns %s", (unsigned)k,
                        gk->c->name, kiln__sh(cx, gk->result), g0.c->name, kiln__sh(cx, g0.result));
  }
  if ((rc = kiln__copy(cx, out, g0.result))) return rc;
  for (uint32_t k = 1; k < nb; k++) {
    (void)kiln__called_sig(cx, k, "branch", &g);
    if ((rc = merge_dynamic(cx, out, g.result, 0))) return rc;
  }
  return 0;
}

/* ---- async ------------------------------------------------------------------ */

/* The result of the op an async-start sugar wraps ("negate-start"): infer
 * a copy of the instruction with its opcode replaced. */
static int wrapped_result(kiln__ictx *cx, kiln_shape *out) {
  kiln_opcode op = cx->ins->async_op;
  if ((unsigned)op >= KILN_OP_COUNT || op == KILN_OP_INVALID ||
      (kiln_opcode_flags(op) & KILN_OPF_ASYNC))
    return kiln__fail(cx, "async_op %d cannot be wrapped", (int)op);
  kiln_instr inner = *cx->ins;
  inner.op = op;
  inner.async_op = KILN_OP_INVALID;
  kiln__ictx sub = *cx;
  sub.ins = &inner;
  sub.written = NULL;
  const kiln_shape *w = cx->written;
  if (w && kiln_shape_is_tuple(w) && w->rank >= 2 && kiln__shape_sane(&w->tuple[1], 0))
    sub.written = &w->tuple[1];
  return kiln__infer(&sub, out);
}

static int infer_async_start(kiln__ictx *cx, kiln_shape *out) {
  kiln_shape args, res;
  int rc;
  if (cx->ins->async_op != KILN_OP_INVALID) {
    if ((rc = wrapped_result(cx, &res))) return rc;
  } else {
    kiln__sig g;
    if ((rc = kiln__expect_called(cx, 1)) || (rc = kiln__called_sig(cx, 0, "calls", &g))) return rc;
    if (g.nparams != cx->ins->noperands)
      return kiln__fail(cx, "calls %%%s takes %u parameters but the instruction has %u operands",
                        g.c->name, (unsigned)g.nparams, (unsigned)cx->ins->noperands);
    for (uint32_t i = 0; i < g.nparams; i++)
      if ((rc = arg_matches(cx, &g, "calls", i, i))) return rc;
    if ((rc = kiln__copy(cx, &res, g.result))) return rc;
  }
  if ((rc = operands_shape(cx, &args, 0, false))) return rc;
  const kiln_shape *el[2] = {&args, &res};
  return kiln__with_context(cx, out, el, 2);
}

/* async-update and async-done continue a chain from an async-start. */
static int async_chain_operand(kiln__ictx *cx, const kiln_shape **s) {
  const kiln_instr *p = kiln__operand(cx, 0);
  *s = &p->shape;
  if (p->op != KILN_OP_ASYNC_START && p->op != KILN_OP_ASYNC_UPDATE)
    return kiln__fail(cx, "%s must be an async-start or async-update, found %s", kiln__on(cx, 0),
                      kiln_opcode_name(p->op));
  if (p->async_op != cx->ins->async_op)
    return kiln__fail(cx, "%s wraps %s but this instruction wraps %s", kiln__on(cx, 0),
                      kiln_opcode_name(p->async_op), kiln_opcode_name(cx->ins->async_op));
  if (!kiln_shape_is_tuple(*s) || (*s)->rank < 2)
    return kiln__fail(cx, "%s must have the shape ((operands...), result, ...), found %s",
                      kiln__on(cx, 0), kiln__sh(cx, *s));
  return 0;
}

static int infer_async_update_done(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *s;
  int rc;
  if ((rc = kiln__expect_operands(cx, 1, 1)) || (rc = async_chain_operand(cx, &s))) return rc;
  if (cx->ins->op == KILN_OP_ASYNC_UPDATE) return kiln__copy(cx, out, s);
  return kiln__copy(cx, out, &s->tuple[1]);
}

/* ---- tokens, host transfers, copies ----------------------------------------- */

static int infer_send(kiln__ictx *cx, kiln_shape *out) {
  int rc = expect_token(cx, 1);
  if (rc) return rc;
  kiln_shape u32, tok;
  if ((rc = make_scalar(cx, &u32, KILN_U32))) return rc;
  make_token(cx, &tok);
  const kiln_shape *el[3] = {kiln__oshape(cx, 0), &u32, &tok};
  return kiln__make_tuple(cx, out, el, 3);
}

static int infer_recv(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *w = NULL;
  int rc;
  if ((rc = expect_token(cx, 0)) || (rc = need_written(cx, "the received data's shape", &w)))
    return rc;
  if (!(kiln_shape_is_tuple(w) && w->rank == 3 && is_scalar_u32(&w->tuple[1]) &&
        is_token(&w->tuple[2])))
    return kiln__fail(cx, "result must be (data, u32[], token[]), found %s", kiln__sh(cx, w));
  return kiln__copy(cx, out, w);
}

static int done_of(kiln__ictx *cx, kiln_opcode start, uint32_t want_rank) {
  const kiln_instr *p = kiln__operand(cx, 0);
  if (p->op != start)
    return kiln__fail(cx, "%s must be produced by %s, found %s", kiln__on(cx, 0),
                      kiln_opcode_name(start), kiln_opcode_name(p->op));
  if (!kiln_shape_is_tuple(&p->shape) || p->shape.rank < want_rank)
    return kiln__fail(cx, "%s has shape %s, expected a tuple of %u elements", kiln__on(cx, 0),
                      kiln__sh(cx, &p->shape), (unsigned)want_rank);
  return 0;
}

static int infer_recv_done(kiln__ictx *cx, kiln_shape *out) {
  int rc = done_of(cx, KILN_OP_RECV, 3);
  if (rc) return rc;
  kiln_shape tok;
  make_token(cx, &tok);
  const kiln_shape *el[2] = {&kiln__oshape(cx, 0)->tuple[0], &tok};
  return kiln__make_tuple(cx, out, el, 2);
}

static int infer_infeed(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *w = NULL;
  int rc;
  if ((rc = expect_token(cx, 0)) || (rc = need_written(cx, "the infed data's shape", &w)))
    return rc;
  if (!(kiln_shape_is_tuple(w) && w->rank == 2 && is_token(&w->tuple[1])))
    return kiln__fail(cx, "result must be (data, token[]), found %s", kiln__sh(cx, w));
  return kiln__copy(cx, out, w);
}

static int infer_copy_start(kiln__ictx *cx, kiln_shape *out) {
  kiln_shape u32;
  int rc = make_scalar(cx, &u32, KILN_U32);
  if (rc) return rc;
  const kiln_shape *el[3] = {kiln__oshape(cx, 0), kiln__oshape(cx, 0), &u32};
  return kiln__make_tuple(cx, out, el, 3);
}

static int infer_rng(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *w = NULL;
  int rc;
  if ((rc = kiln__expect_operands(cx, 2, 2))) return rc;
  const char *dist = kiln_instr_attr_str(cx->ins, KILN_ATTR_DISTRIBUTION);
  if (dist == NULL) return kiln__fail(cx, "attribute distribution is missing");
  bool normal = strcmp(dist, "rng_normal") == 0;
  if (!normal && strcmp(dist, "rng_uniform") != 0)
    return kiln__fail(cx, "distribution=%s is not rng_uniform or rng_normal", dist);
  if ((rc = need_written(cx, "the shape of the random array", &w))) return rc;
  if (!kiln_shape_is_array(w))
    return kiln__fail(cx, "result must be an array, found %s", kiln__sh(cx, w));
  if (normal ? !kiln_dtype_is_float(w->dtype)
             : !(kiln_dtype_is_float(w->dtype) || kiln_dtype_is_integral(w->dtype)))
    return kiln__fail(cx, "%s cannot produce %s", dist, kiln__sh(cx, w));
  for (uint32_t i = 0; i < 2; i++) {
    const kiln_shape *p = kiln__oshape(cx, i);
    if (!(kiln_shape_is_array(p) && p->rank == 0 && p->dtype == w->dtype))
      return kiln__fail(cx, "%s must be a %s[] scalar, found %s", kiln__on(cx, i),
                        kiln_dtype_name(w->dtype), kiln__sh(cx, p));
  }
  return kiln__copy(cx, out, w);
}

static int infer_rng_bit_generator(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *w = NULL, *s = kiln__oshape(cx, 0);
  int rc;
  if ((rc = kiln__expect_array(cx, 0, "state")) || (rc = need_written(cx, "the output shape", &w)))
    return rc;
  if (!kiln_dtype_is_integral(s->dtype) || s->rank != 1)
    return kiln__fail(cx, "%s is the state and must be an integer vector, found %s",
                      kiln__on(cx, 0), kiln__sh(cx, s));
  if (!(kiln_shape_is_tuple(w) && w->rank == 2 && kiln_shape_is_array(&w->tuple[1]) &&
        kiln_dtype_is_integral(w->tuple[1].dtype)))
    return kiln__fail(cx, "result must be (state, integer array), found %s", kiln__sh(cx, w));
  const kiln_shape *el[2] = {s, &w->tuple[1]};
  return kiln__make_tuple(cx, out, el, 2);
}

int kiln__infer_control(kiln__ictx *cx, kiln_shape *out) {
  int rc;
  const kiln_instr *ins = cx->ins;
  if (kiln__is_collective_op(ins->op)) return kiln__infer_collective(cx, out);
  switch (ins->op) {
  case KILN_OP_PARAMETER: return infer_parameter(cx, out);
  case KILN_OP_CONSTANT: return infer_constant(cx, out);
  case KILN_OP_TUPLE: return operands_shape(cx, out, 0, false);
  case KILN_OP_GET_TUPLE_ELEMENT: return infer_gte(cx, out);
  case KILN_OP_WHILE: return infer_while(cx, out);
  case KILN_OP_CONDITIONAL:
    if ((rc = kiln__expect_operands(cx, 1, -1))) return rc;
    return infer_conditional(cx, out);
  case KILN_OP_CALL:
  case KILN_OP_FUSION: return infer_call(cx, out);
  case KILN_OP_CUSTOM_CALL: return infer_custom_call(cx, out);
  case KILN_OP_ASYNC_START: return infer_async_start(cx, out);
  case KILN_OP_ASYNC_UPDATE:
  case KILN_OP_ASYNC_DONE: return infer_async_update_done(cx, out);
  case KILN_OP_OPTIMIZATION_BARRIER:
  case KILN_OP_DOMAIN: return kiln__copy(cx, out, kiln__oshape(cx, 0));
  case KILN_OP_RNG: return infer_rng(cx, out);
  case KILN_OP_RNG_BIT_GENERATOR: return infer_rng_bit_generator(cx, out);
  case KILN_OP_RNG_GET_AND_UPDATE_STATE: {
    int64_t two = 2;
    return kiln__make_array(cx, out, KILN_U64, &two, NULL, 1);
  }
  case KILN_OP_AFTER_ALL:
    /* Any operands: XLA uses after-all to order arbitrary values too. */
    return make_token(cx, out);
  case KILN_OP_ADD_DEPENDENCY:
    if ((rc = expect_token(cx, 1))) return rc;
    return kiln__copy(cx, out, kiln__oshape(cx, 0));
  case KILN_OP_INFEED: return infer_infeed(cx, out);
  case KILN_OP_OUTFEED:
    if ((rc = expect_token(cx, 1))) return rc;
    return make_token(cx, out);
  case KILN_OP_SEND: return infer_send(cx, out);
  case KILN_OP_SEND_DONE:
    if ((rc = done_of(cx, KILN_OP_SEND, 3))) return rc;
    return make_token(cx, out);
  case KILN_OP_RECV: return infer_recv(cx, out);
  case KILN_OP_RECV_DONE: return infer_recv_done(cx, out);
  case KILN_OP_COPY_START: return infer_copy_start(cx, out);
  case KILN_OP_COPY_DONE:
    if ((rc = done_of(cx, KILN_OP_COPY_START, 2))) return rc;
    return kiln__copy(cx, out, &kiln__oshape(cx, 0)->tuple[0]);
  case KILN_OP_REPLICA_ID:
  case KILN_OP_PARTITION_ID: return make_scalar(cx, out, KILN_U32);
  default: return kiln__fail(cx, "no shape rule for this op");
  }
}
