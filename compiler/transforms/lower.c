/* Lowering before a transform: ops that have no rules of their own because
 * they equal a composition of ops that do are rewritten into that
 * composition, and the transform then runs on the rewritten program.
 *
 *   async-start/update/done (the computation form and the "negate-start"
 *   sugar), all-reduce-start/done, all-gather-start/done,
 *   collective-permute-start/done, copy-start/done: the start becomes a
 *   tuple shaped like its own value, (operands, wrapped result, zero
 *   contexts), with the wrapped op run synchronously (a call of the wrapped
 *   computation, or the op itself); an update passes it on; the done takes
 *   the result. Every transform sees the wrapped op, so its rules apply;
 *   the asynchrony is a scheduling choice the compiler may make again.
 *   batch-norm-training/inference/grad: the formulas of their definition
 *   (mean, biased variance, rsqrt(variance + epsilon)) in elementwise ops,
 *   broadcasts and sums over the non-feature dimensions.
 *   map whose computation is elementwise: the computation applied to whole
 *   arrays (tree.c). Other maps stay maps (batchable, not differentiable).
 *   convolution with batch_group_count G: the batch dimension split into
 *   (G, N/G) and the G part folded into the features as their major part,
 *   a convolution with feature_group_count G computing the same values,
 *   whose rules exist.
 *
 * A computation is rewritten when it holds such an op or calls one that is
 * rewritten; the others stay shared. Rewritten computations are new
 * computations next to the old ones, which stay as they were.
 */
#include <stdio.h>
#include <string.h>

#include "common/arena.h"
#include "compiler/transforms/rules.h"

typedef struct lw {
  kiln__tx *tx;
  uint32_t ncomps; /* computations before lowering */
  uint32_t n0;     /* instructions before lowering */
  uint32_t *to;    /* computation -> its lowered version (itself when unchanged) */
  uint8_t *state;  /* 0 not seen, 1 being lowered, 2 done */
} lw;

static bool map_ok(const kiln_module *m, const kiln_instr *ins) {
  return ins->ncalled == 1 &&
         kiln__tf_scalar_comp_ok(m, kiln_module_computation(m, ins->called[0]), 0);
}

/* The rule table's lowered column decides; this file only says how. */
bool kiln__tf_lowered_op(kiln_opcode op) {
  return (unsigned)op < KILN_OP_COUNT && kiln__tf_rules[op].lowered;
}

static bool lowers(const kiln_module *m, const kiln_instr *ins) {
  if (!kiln__tf_lowered_op(ins->op)) return false;
  if (ins->op == KILN_OP_MAP) return map_ok(m, ins);
  if (ins->op == KILN_OP_CONVOLUTION)
    return kiln_instr_attr_int(ins, KILN_ATTR_BATCH_GROUP_COUNT, 1) > 1 &&
           kiln_instr_attr_int(ins, KILN_ATTR_FEATURE_GROUP_COUNT, 1) == 1;
  return true;
}

/* ---- async wrappers -------------------------------------------------------- */

/* The op a start runs synchronously, on the lowered operands. */
static kiln_id wrapped(lw *L, kiln__b *b, const kiln_instr *ins, const kiln_id *ops) {
  kiln__tx *tx = L->tx;
  const kiln_shape *s = &ins->shape;
  /* all-reduce-start's value is the result; the others' are (operands, result, ...) */
  const kiln_shape *res =
      ins->op != KILN_OP_ALL_REDUCE_START && kiln_shape_is_tuple(s) && s->rank >= 2 ? &s->tuple[1]
                                                                                    : s;
  kiln_opcode op = KILN_OP_INVALID;
  switch (ins->op) {
  case KILN_OP_ASYNC_START:
    if (ins->async_op == KILN_OP_INVALID) {
      if (ins->ncalled != 1) break;
      return kiln__b_call(b, L->to[ins->called[0]], ops, ins->noperands);
    }
    op = ins->async_op;
    break;
  case KILN_OP_ALL_REDUCE_START: op = KILN_OP_ALL_REDUCE; break;
  case KILN_OP_ALL_GATHER_START: op = KILN_OP_ALL_GATHER; break;
  case KILN_OP_COLLECTIVE_PERMUTE_START: op = KILN_OP_COLLECTIVE_PERMUTE; break;
  case KILN_OP_COPY_START: op = KILN_OP_COPY; break;
  default: break;
  }
  if (op == KILN_OP_INVALID || (kiln_opcode_flags(op) & KILN_OPF_ASYNC))
    return kiln__tx_fail(tx, KILN_EINVAL, ins, "%s: %s %s wraps no op the transforms can run",
                         tx->name, kiln_opcode_name(ins->op), ins->name ? ins->name : ""),
           KILN_NO_ID;
  kiln_instr inner = *ins;
  inner.op = op;
  inner.async_op = KILN_OP_INVALID;
  kiln_instr *w = kiln__b_clone_start(b, &inner, ops, ins->noperands);
  if (w == NULL) return KILN_NO_ID;
  if (ins->ncalled) {
    uint32_t *called = kiln_arena_calloc(tx->scratch, ins->ncalled, sizeof *called);
    if (called == NULL) return kiln__tx_oom(tx), KILN_NO_ID;
    for (uint32_t k = 0; k < ins->ncalled; k++) called[k] = L->to[ins->called[k]];
    if (kiln_instr_set_called(tx->m, w, called, ins->ncalled)) return kiln__tx_oom(tx), KILN_NO_ID;
  }
  /* ops whose inference reads the written result (custom-call) find it */
  if (kiln_instr_set_shape(tx->m, w, res)) return kiln__tx_oom(tx), KILN_NO_ID;
  return kiln__b_finish(b, w);
}

/* A start's value: (operands, result, zero contexts) when its shape is
 * such a tuple, else the result itself. *tup says which. */
static kiln_id lower_start(lw *L, kiln__b *b, const kiln_instr *ins, const kiln_id *ops,
                           bool *tup) {
  kiln__tx *tx = L->tx;
  kiln_id r = wrapped(L, b, ins, ops);
  const kiln_shape *s = &ins->shape;
  *tup = false;
  if (r == KILN_NO_ID) return KILN_NO_ID;
  if (!kiln_shape_is_tuple(s) || s->rank < 2 || kiln_shape_equal(kiln__b_shape(tx, r), s, false))
    return r;
  kiln_id *el = kiln__b_ids(tx, s->rank);
  if (el == NULL) return KILN_NO_ID;
  const kiln_shape *s0 = &s->tuple[0];
  if (kiln_shape_is_tuple(s0) && s0->rank == ins->noperands &&
      !(ins->noperands == 1 && kiln_shape_equal(s0, kiln__b_shape(tx, ops[0]), false)))
    el[0] = kiln__b_tuple(b, ops, ins->noperands);
  else if (ins->noperands == 1)
    el[0] = ops[0];
  else
    return kiln__tx_fail(tx, KILN_EINVAL, ins, "%s: %s %s has an operand part of unexpected shape",
                         tx->name, kiln_opcode_name(ins->op), ins->name ? ins->name : ""),
           KILN_NO_ID;
  el[1] = r;
  for (uint32_t i = 2; i < s->rank; i++) el[i] = kiln__b_zeros(b, &s->tuple[i]);
  *tup = true;
  return kiln__b_tuple(b, el, s->rank);
}

/* ---- batch norms ----------------------------------------------------------- */

typedef struct bn {
  const kiln_shape *xs;
  int64_t fi;      /* feature dimension */
  int64_t *others; /* the other dimensions */
  uint32_t nothers;
  kiln_dtype t;
  kiln_id count; /* elements per feature, f[F] */
  kiln_id eps;   /* epsilon, f[F] */
} bn;

static int bn_init(kiln__tx *tx, kiln__b *b, const kiln_instr *ins, const kiln_shape *xs, bn *p) {
  p->xs = xs;
  p->fi = kiln_instr_attr_int(ins, KILN_ATTR_FEATURE_INDEX, -1);
  p->t = xs->dtype;
  if (!kiln_shape_is_array(xs) || !kiln_dtype_is_float(xs->dtype) || p->fi < 0 ||
      p->fi >= (int64_t)xs->rank)
    return kiln__tx_fail(tx, KILN_EINVAL, ins, "%s: %s %s: operand or feature_index is malformed",
                         tx->name, kiln_opcode_name(ins->op), ins->name ? ins->name : "");
  p->others = kiln__b_i64s(tx, xs->rank);
  if (p->others == NULL) return tx->err;
  p->nothers = 0;
  int64_t per = 1;
  for (uint32_t d = 0; d < xs->rank; d++)
    if ((int64_t)d != p->fi) {
      p->others[p->nothers++] = d;
      per *= xs->dims[d];
    }
  const kiln_attr *ea = kiln_instr_attr(ins, KILN_ATTR_EPSILON);
  int64_t f = xs->dims[p->fi];
  p->count = kiln__b_full(b, p->t, &f, 1, (double)per);
  p->eps = kiln__b_full(b, p->t, &f, 1, ea ? ea->v.f : 0);
  return tx->err;
}

/* v of [F] broadcast along the operand. */
static kiln_id feat(kiln__b *b, const bn *p, kiln_id v) {
  return kiln__b_broadcast(b, v, p->xs->dims, p->xs->rank, &p->fi, 1);
}

static kiln_id per_feature_sum(kiln__b *b, const bn *p, kiln_id v) {
  return kiln__b_reduce_sum(b, v, p->others, p->nothers);
}

/* (x - mean) * scale / sqrt(var + eps) + offset */
static kiln_id bn_normalize(kiln__b *b, const bn *p, kiln_id x, kiln_id scale, kiln_id offset,
                            kiln_id mean, kiln_id var) {
  kiln_id rs = kiln__b_un(b, KILN_OP_RSQRT, kiln__b_add(b, var, p->eps));
  kiln_id xc = kiln__b_sub(b, x, feat(b, p, mean));
  return kiln__b_add(b, kiln__b_mul(b, xc, feat(b, p, kiln__b_mul(b, rs, scale))),
                     feat(b, p, offset));
}

static kiln_id lower_batch_norm(lw *L, kiln__b *b, const kiln_instr *ins, const kiln_id *ops) {
  kiln__tx *tx = L->tx;
  bn p;
  if (bn_init(tx, b, ins, kiln__b_shape(tx, ops[0]), &p)) return KILN_NO_ID;
  kiln_id x = ops[0];
  if (ins->op == KILN_OP_BATCH_NORM_INFERENCE)
    return bn_normalize(b, &p, x, ops[1], ops[2], ops[3], ops[4]);
  if (ins->op == KILN_OP_BATCH_NORM_TRAINING) {
    kiln_id mean = kiln__b_div(b, per_feature_sum(b, &p, x), p.count);
    kiln_id xc = kiln__b_sub(b, x, feat(b, &p, mean));
    kiln_id var = kiln__b_div(b, per_feature_sum(b, &p, kiln__b_mul(b, xc, xc)), p.count);
    kiln_id el[3] = {bn_normalize(b, &p, x, ops[1], ops[2], mean, var), mean, var};
    return kiln__b_tuple(b, el, 3);
  }
  /* grad: (scale, mean, var, dy) = ops[1..4] */
  kiln_id scale = ops[1], mean = ops[2], ve = kiln__b_add(b, ops[3], p.eps), dy = ops[4];
  kiln_id rs = kiln__b_un(b, KILN_OP_RSQRT, ve);
  kiln_id xc = kiln__b_sub(b, x, feat(b, &p, mean));
  kiln_id sdy = per_feature_sum(b, &p, dy);
  kiln_id sdyx = per_feature_sum(b, &p, kiln__b_mul(b, dy, xc));
  /* scale * rs / n * (n * dy - sum(dy) - xc * sum(dy * xc) / (var + eps)) */
  kiln_id k = kiln__b_div(b, kiln__b_mul(b, scale, rs), p.count);
  kiln_id inner =
      kiln__b_sub(b, kiln__b_sub(b, kiln__b_mul(b, feat(b, &p, p.count), dy), feat(b, &p, sdy)),
                  kiln__b_mul(b, xc, feat(b, &p, kiln__b_div(b, sdyx, ve))));
  kiln_id el[3] = {kiln__b_mul(b, feat(b, &p, k), inner), kiln__b_mul(b, sdyx, rs), sdy};
  return kiln__b_tuple(b, el, 3);
}

/* ---- map, batch-grouped convolution --------------------------------------------- */

static kiln_id lower_map(lw *L, kiln__b *b, const kiln_instr *ins, const kiln_id *ops) {
  const kiln_computation *f = kiln_module_computation(L->tx->m, ins->called[0]);
  return kiln__tf_apply_scalar(b, f, ops, ins->shape.dims, ins->shape.rank, ins);
}

static kiln_id lower_conv(lw *L, kiln__b *b, const kiln_instr *ins, const kiln_id *ops) {
  kiln__tx *tx = L->tx;
  const kiln_attr *la = kiln_instr_attr(ins, KILN_ATTR_DIM_LABELS);
  int64_t g = kiln_instr_attr_int(ins, KILN_ATTR_BATCH_GROUP_COUNT, 1);
  if (la == NULL || la->v.conv == NULL || ins->noperands != 2)
    return kiln__tx_fail(tx, KILN_EINVAL, ins, "%s: convolution %s has no dimension numbers",
                         tx->name, ins->name ? ins->name : ""),
           KILN_NO_ID;
  const kiln_conv_dims *cd = la->v.conv;
  kiln_id o[2] = {kiln__tf_regroup(b, ops[0], cd->in_batch, cd->in_feature, g), ops[1]};
  kiln_instr *c = kiln__b_clone_start(b, ins, o, 2);
  if (c == NULL) return KILN_NO_ID;
  kiln__b_drop_attr(c, KILN_ATTR_BATCH_GROUP_COUNT);
  if (kiln_instr_set_attr_int(tx->m, c, KILN_ATTR_FEATURE_GROUP_COUNT, g))
    return kiln__tx_oom(tx), KILN_NO_ID;
  return kiln__b_finish(b, c);
}

/* ---- computations -------------------------------------------------------------- */

static uint32_t lower_comp(lw *L, uint32_t id);

static kiln_id copy_one(lw *L, kiln__b *b, const kiln_instr *ins, const kiln_id *ops) {
  kiln__tx *tx = L->tx;
  if (ins->op == KILN_OP_PARAMETER)
    return kiln__b_param(b, ins->param_number, &ins->shape, ins->name);
  kiln_id v = kiln__b_clone_same(b, ins, ops, ins->noperands);
  bool moved = false;
  for (uint32_t k = 0; k < ins->ncalled; k++) moved |= L->to[ins->called[k]] != ins->called[k];
  if (v == KILN_NO_ID || !moved) return v;
  uint32_t *called = kiln_arena_calloc(tx->scratch, ins->ncalled, sizeof *called);
  if (called == NULL) return kiln__tx_oom(tx), KILN_NO_ID;
  for (uint32_t k = 0; k < ins->ncalled; k++) called[k] = L->to[ins->called[k]];
  if (kiln_instr_set_called(tx->m, kiln__b_ins(tx, v), called, ins->ncalled))
    return kiln__tx_oom(tx), KILN_NO_ID;
  return v;
}

static uint32_t rewrite(lw *L, const kiln_computation *src) {
  kiln__tx *tx = L->tx;
  const kiln_module *m = tx->m;
  char name[160];
  uint32_t dst;
  snprintf(name, sizeof name, "%.120s.lowered", src->name);
  if (kiln__b_new_comp(tx, name, &dst)) return KILN_NO_ID;
  kiln__b b = {tx, dst};
  /* val and tup cover src's ids only (lo and up), not the module: every
   * caller of a rewritten computation is rewritten too, and module-sized
   * tables for each made a chain of nested calls cost its square. */
  uint32_t lo = UINT32_MAX, hi = 0;
  for (uint32_t i = 0; i < src->ninstrs; i++) {
    if (src->instrs[i] >= L->n0)
      return kiln__tx_fail(tx, KILN_EINTERNAL, NULL, "%s: internal error: %s grew", tx->name,
                           src->name),
             KILN_NO_ID;
    if (src->instrs[i] < lo) lo = src->instrs[i];
    if (src->instrs[i] > hi) hi = src->instrs[i];
  }
  if (src->ninstrs == 0) lo = hi = 0;
  kiln_id *val = kiln_arena_calloc(tx->scratch, hi - lo + 1, sizeof *val);
  uint8_t *tup = kiln_arena_calloc(tx->scratch, hi - lo + 1, 1);
  if (val == NULL || tup == NULL) return kiln__tx_oom(tx), KILN_NO_ID;
  for (uint32_t i = 0; i < src->ninstrs && tx->err == 0; i++) {
    if (kiln__tx_poll(tx)) break;
    const kiln_instr *ins = m->instrs[src->instrs[i]];
    kiln_id *ops = kiln__b_ids(tx, ins->noperands);
    if (ops == NULL) return KILN_NO_ID;
    for (uint32_t k = 0; k < ins->noperands; k++) ops[k] = val[ins->operands[k] - lo];
    kiln_id v;
    bool t = false;
    if (!lowers(m, ins)) {
      v = copy_one(L, &b, ins, ops);
    } else {
      switch (ins->op) {
      case KILN_OP_ASYNC_UPDATE:
        v = ops[0];
        t = tup[ins->operands[0] - lo];
        break;
      case KILN_OP_ASYNC_DONE:
      case KILN_OP_ALL_REDUCE_DONE:
      case KILN_OP_ALL_GATHER_DONE:
      case KILN_OP_COLLECTIVE_PERMUTE_DONE:
      case KILN_OP_COPY_DONE:
        v = tup[ins->operands[0] - lo] ? kiln__b_gte(&b, ops[0], 1) : ops[0];
        break;
      case KILN_OP_BATCH_NORM_TRAINING:
      case KILN_OP_BATCH_NORM_INFERENCE:
      case KILN_OP_BATCH_NORM_GRAD: v = lower_batch_norm(L, &b, ins, ops); break;
      case KILN_OP_MAP: v = lower_map(L, &b, ins, ops); break;
      case KILN_OP_CONVOLUTION: v = lower_conv(L, &b, ins, ops); break;
      default: v = lower_start(L, &b, ins, ops, &t); break;
      }
    }
    if (v != KILN_NO_ID && tx->err == 0 &&
        !kiln_shape_equal(kiln__b_shape(tx, v), &ins->shape, false)) {
      char want[160], got[160];
      kiln_sbuf s1 = KILN_SBUF_INIT, s2 = KILN_SBUF_INIT;
      kiln_shape_print_short(&s1, &ins->shape);
      kiln_shape_print_short(&s2, kiln__b_shape(tx, v));
      snprintf(want, sizeof want, "%s", kiln_sbuf_str(&s1));
      snprintf(got, sizeof got, "%s", kiln_sbuf_str(&s2));
      kiln_sbuf_free(&s1);
      kiln_sbuf_free(&s2);
      return kiln__tx_fail(tx, KILN_EINTERNAL, ins,
                           "%s: internal error: lowering %s %s gave %s, not %s", tx->name,
                           kiln_opcode_name(ins->op), ins->name ? ins->name : "", got, want),
             KILN_NO_ID;
    }
    val[ins->id - lo] = v;
    tup[ins->id - lo] = t;
  }
  if (tx->err) return KILN_NO_ID;
  tx->m->comps[dst]->root = val[src->root - lo];
  return dst;
}

static uint32_t lower_comp(lw *L, uint32_t id) {
  kiln__tx *tx = L->tx;
  if (id >= L->ncomps) return id;
  if (L->state[id]) return L->to[id]; /* done, or a cycle the verifier refuses anyway */
  L->state[id] = 1;
  L->to[id] = id;
  const kiln_module *m = tx->m;
  const kiln_computation *c = m->comps[id];
  bool need = false;
  for (uint32_t i = 0; i < c->ninstrs && tx->err == 0; i++) {
    const kiln_instr *ins = m->instrs[c->instrs[i]];
    need |= lowers(m, ins);
    for (uint32_t k = 0; k < ins->ncalled; k++)
      need |= lower_comp(L, ins->called[k]) != ins->called[k];
  }
  if (need && tx->err == 0 && c->root != KILN_NO_ID) {
    uint32_t r = rewrite(L, c);
    if (r != KILN_NO_ID) L->to[id] = r;
  }
  L->state[id] = 2;
  return L->to[id];
}

int kiln__tf_lower(kiln__tx *tx, uint32_t *entry) {
  kiln_module *m = tx->m;
  *entry = m->entry;
  if (m->entry == KILN_NO_ID || m->entry >= m->ncomps) return 0;
  lw L = {tx, m->ncomps, m->ninstrs, NULL, NULL};
  L.to = kiln_arena_calloc(tx->scratch, L.ncomps, sizeof *L.to);
  L.state = kiln_arena_calloc(tx->scratch, L.ncomps, 1);
  if (L.to == NULL || L.state == NULL) return kiln__tx_oom(tx);
  *entry = lower_comp(&L, m->entry);
  return tx->err;
}
