/* THE rule table: one row per opcode of ops.def, in its order, with the
 * op's derivative (partial for elementwise ops), forward rule, transpose
 * rule, reverse-mode forward hook and batching rule (see rules.h). Every op
 * is listed, so that what an op lacks is written here as an empty slot, not
 * forgotten; the bodies live in jvp.c (elementwise), linear.c, reduce.c,
 * gather.c, conv.c, sort.c, tree.c, collective.c, linalg.c (with fft),
 * ad_control.c and batch*.c. Rows marked LOWERED are rewritten by lower.c into ops with
 * rules before a transform runs; ops deliberately without rules are listed
 * with the reason at the end of this file.
 *
 * Ops whose result is piecewise constant (sign, floor, ceil, round) or not
 * floating point (compare, integer and bit ops) have zero derivatives:
 * activity analysis never hands them a tangent or cotangent, and those
 * with float results have explicit zero rules (sign of a complex value is
 * refused instead). Complex values are differentiated as JAX does:
 * holomorphic ops keep their formulas, transposes do not conjugate, and
 * real/imag/complex/abs/fft follow JAX's transposes (jvp.c, linalg.c).
 */
#include "compiler/transforms/rules.h"

#include "compiler/ir/debug_print.h"

/* elementwise, differentiable through `d` */
#define EW(d) \
  { \
    .partial = d, .jvp = kiln__jvp_elementwise, .vjp = kiln__vjp_elementwise, \
    .batch = kiln__batch_elementwise \
  }
/* elementwise with a zero derivative */
#define EW_ZERO \
  { .jvp = kiln__jvp_zero, .vjp = kiln__vjp_zero, .batch = kiln__batch_elementwise }
/* elementwise, not differentiable (integer or pred values) */
#define EW_NONE \
  { .batch = kiln__batch_elementwise }
/* linear in its floating operands: the jvp applies the op to the tangents */
#define LINEAR(t, b) \
  { .jvp = kiln__jvp_linear, .vjp = t, .batch = b }
#define CONTROL(j, v, f, b) \
  { .jvp = j, .vjp = v, .fwd = f, .batch = b, .own_primal = true }
#define UNBATCHED \
  { .batch = kiln__batch_unbatched }
#define NONE \
  { .batch = NULL }
/* rewritten by lower.c into ops with rules before any transform runs */
#define LOWERED \
  { .lowered = true }

const kiln__rule kiln__tf_rules[KILN_OP_COUNT] = {
    [KILN_OP_INVALID] = NONE,
    [KILN_OP_PARAMETER] = NONE, /* bound by the region drivers */
    [KILN_OP_CONSTANT] = UNBATCHED,
    [KILN_OP_IOTA] = UNBATCHED,
    [KILN_OP_TUPLE] = {.jvp = kiln__jvp_tuple, .vjp = kiln__vjp_tuple, .batch = kiln__batch_tuple},
    [KILN_OP_GET_TUPLE_ELEMENT] = {.jvp = kiln__jvp_gte,
                                   .vjp = kiln__vjp_gte,
                                   .batch = kiln__batch_gte},
    /* elementwise unary */
    [KILN_OP_ABS] = EW(kiln__d_abs),
    [KILN_OP_CBRT] = EW(kiln__d_cbrt),
    [KILN_OP_CEIL] = EW_ZERO,
    [KILN_OP_CLZ] = EW_NONE,
    [KILN_OP_CONVERT] = {.jvp = kiln__jvp_convert,
                         .vjp = kiln__vjp_convert,
                         .batch = kiln__batch_elementwise},
    [KILN_OP_BITCAST_CONVERT] = {.batch = kiln__batch_same},
    [KILN_OP_COPY] = EW(kiln__d_identity),
    [KILN_OP_COS] = EW(kiln__d_cos),
    [KILN_OP_ERF] = EW(kiln__d_erf),
    [KILN_OP_EXP] = EW(kiln__d_exp),
    [KILN_OP_EXPM1] = EW(kiln__d_expm1),
    [KILN_OP_FLOOR] = EW_ZERO,
    [KILN_OP_IMAG] = EW(kiln__d_imag),
    [KILN_OP_IS_FINITE] = EW_NONE,
    [KILN_OP_LOG] = EW(kiln__d_log),
    [KILN_OP_LOG1P] = EW(kiln__d_log1p),
    [KILN_OP_LOGISTIC] = EW(kiln__d_logistic),
    [KILN_OP_NEGATE] = EW(kiln__d_negate),
    [KILN_OP_NOT] = EW_NONE,
    [KILN_OP_POPCNT] = EW_NONE,
    [KILN_OP_REAL] = EW(kiln__d_real),
    [KILN_OP_REDUCE_PRECISION] = EW(kiln__d_reduce_precision),
    [KILN_OP_ROUND_AFZ] = EW_ZERO,
    [KILN_OP_ROUND_EVEN] = EW_ZERO,
    [KILN_OP_RSQRT] = EW(kiln__d_rsqrt),
    [KILN_OP_SIGN] = EW_ZERO,
    [KILN_OP_SIN] = EW(kiln__d_sin),
    [KILN_OP_SQRT] = EW(kiln__d_sqrt),
    [KILN_OP_TAN] = EW(kiln__d_tan),
    [KILN_OP_TANH] = EW(kiln__d_tanh),
    /* elementwise binary */
    [KILN_OP_ADD] = EW(kiln__d_add),
    [KILN_OP_ATAN2] = EW(kiln__d_atan2),
    [KILN_OP_AND] = EW_NONE,
    [KILN_OP_COMPARE] = EW_NONE,
    [KILN_OP_COMPLEX] = EW(kiln__d_complex),
    [KILN_OP_DIVIDE] = EW(kiln__d_div),
    [KILN_OP_MAXIMUM] = EW(kiln__d_maxmin),
    [KILN_OP_MINIMUM] = EW(kiln__d_maxmin),
    [KILN_OP_MULTIPLY] = EW(kiln__d_mul),
    [KILN_OP_OR] = EW_NONE,
    [KILN_OP_POWER] = EW(kiln__d_pow),
    [KILN_OP_REMAINDER] = EW(kiln__d_rem),
    [KILN_OP_SHIFT_LEFT] = EW_NONE,
    [KILN_OP_SHIFT_RIGHT_ARITH] = EW_NONE,
    [KILN_OP_SHIFT_RIGHT_LOGICAL] = EW_NONE,
    [KILN_OP_SUBTRACT] = EW(kiln__d_sub),
    [KILN_OP_XOR] = EW_NONE,
    [KILN_OP_STOCHASTIC_CONVERT] = EW_NONE,
    /* elementwise ternary */
    [KILN_OP_CLAMP] = EW(kiln__d_clamp),
    [KILN_OP_SELECT] = EW(kiln__d_select),
    /* shape manipulation */
    [KILN_OP_BITCAST] = LINEAR(kiln__vjp_reshape, kiln__batch_reshape),
    [KILN_OP_BROADCAST] = LINEAR(kiln__vjp_broadcast, kiln__batch_broadcast),
    [KILN_OP_RESHAPE] = LINEAR(kiln__vjp_reshape, kiln__batch_reshape),
    [KILN_OP_DYNAMIC_RESHAPE] = NONE,
    [KILN_OP_TRANSPOSE] = LINEAR(kiln__vjp_transpose, kiln__batch_transpose),
    [KILN_OP_SLICE] = LINEAR(kiln__vjp_slice, kiln__batch_slice),
    [KILN_OP_DYNAMIC_SLICE] = LINEAR(kiln__vjp_dynamic_slice, kiln__batch_dynamic_slice),
    [KILN_OP_DYNAMIC_UPDATE_SLICE] =
        LINEAR(kiln__vjp_dynamic_update_slice, kiln__batch_dynamic_update_slice),
    [KILN_OP_CONCATENATE] = LINEAR(kiln__vjp_concatenate, kiln__batch_concatenate),
    [KILN_OP_PAD] = LINEAR(kiln__vjp_pad, kiln__batch_pad),
    [KILN_OP_REVERSE] = LINEAR(kiln__vjp_reverse, kiln__batch_dims_attr),
    [KILN_OP_GET_DIMENSION_SIZE] = {.batch = kiln__batch_get_dimension_size},
    [KILN_OP_SET_DIMENSION_SIZE] = NONE,
    /* contractions, reductions, data movement */
    [KILN_OP_DOT] = {.jvp = kiln__jvp_dot, .vjp = kiln__vjp_dot, .batch = kiln__batch_dot},
    [KILN_OP_CONVOLUTION] = {.jvp = kiln__jvp_dot,
                             .vjp = kiln__vjp_convolution,
                             .batch = kiln__batch_convolution,
                             .lowered = true}, /* with batch_group_count > 1 only */
    [KILN_OP_REDUCE] = {.jvp = kiln__jvp_reduce,
                        .vjp = kiln__vjp_reduce,
                        .fwd = kiln__fwd_reduce,
                        .batch = kiln__batch_reduce},
    [KILN_OP_REDUCE_WINDOW] = {.jvp = kiln__jvp_reduce_window,
                               .vjp = kiln__vjp_reduce_window,
                               .batch = kiln__batch_reduce_window},
    [KILN_OP_SELECT_AND_SCATTER] = {.jvp = kiln__jvp_select_and_scatter,
                                    .vjp = kiln__vjp_select_and_scatter,
                                    .batch = kiln__batch_select_and_scatter},
    [KILN_OP_MAP] = {.batch = kiln__batch_map, .lowered = true}, /* elementwise bodies only */
    [KILN_OP_SORT] = {.jvp = kiln__jvp_sort,
                      .vjp = kiln__vjp_sort,
                      .fwd = kiln__fwd_sort,
                      .batch = kiln__batch_dims_attr,
                      .own_primal = true},
    [KILN_OP_GATHER] = LINEAR(kiln__vjp_gather, kiln__batch_gather),
    [KILN_OP_SCATTER] = {.jvp = kiln__jvp_scatter,
                         .vjp = kiln__vjp_scatter,
                         .batch = kiln__batch_scatter},
    [KILN_OP_FFT] = LINEAR(kiln__vjp_fft, kiln__batch_same), /* over the trailing dims */
    [KILN_OP_CHOLESKY] = {.jvp = kiln__jvp_cholesky,
                          .vjp = kiln__vjp_cholesky,
                          .batch = kiln__batch_same},
    [KILN_OP_TRIANGULAR_SOLVE] = {.jvp = kiln__jvp_triangular_solve,
                                  .vjp = kiln__vjp_triangular_solve,
                                  .batch = kiln__batch_same},
    [KILN_OP_TOPK] = {.jvp = kiln__jvp_topk, .vjp = kiln__vjp_topk, .batch = kiln__batch_same},
    [KILN_OP_BATCH_NORM_TRAINING] = LOWERED,
    [KILN_OP_BATCH_NORM_INFERENCE] = LOWERED,
    [KILN_OP_BATCH_NORM_GRAD] = LOWERED,
    /* control flow and calls */
    [KILN_OP_WHILE] = CONTROL(kiln__jvp_while, kiln__vjp_while, kiln__fwd_while, kiln__batch_while),
    [KILN_OP_CONDITIONAL] =
        CONTROL(kiln__jvp_conditional, kiln__vjp_conditional, NULL, kiln__batch_conditional),
    [KILN_OP_CALL] = CONTROL(kiln__jvp_call, kiln__vjp_call, kiln__fwd_call, kiln__batch_call),
    [KILN_OP_FUSION] = CONTROL(kiln__jvp_call, kiln__vjp_call, kiln__fwd_call, kiln__batch_call),
    [KILN_OP_CUSTOM_CALL] = NONE,
    [KILN_OP_ASYNC_START] = LOWERED,
    [KILN_OP_ASYNC_UPDATE] = LOWERED,
    [KILN_OP_ASYNC_DONE] = LOWERED,
    [KILN_OP_OPTIMIZATION_BARRIER] = {.jvp = kiln__jvp_barrier,
                                      .vjp = kiln__vjp_barrier,
                                      .batch = kiln__batch_passthrough},
    [KILN_OP_DOMAIN] = {.jvp = kiln__jvp_barrier,
                        .vjp = kiln__vjp_barrier,
                        .batch = kiln__batch_passthrough},
    /* random numbers */
    [KILN_OP_RNG] = UNBATCHED,
    [KILN_OP_RNG_BIT_GENERATOR] = UNBATCHED,
    [KILN_OP_RNG_GET_AND_UPDATE_STATE] = UNBATCHED,
    /* tokens and side effects */
    [KILN_OP_AFTER_ALL] = UNBATCHED,
    [KILN_OP_ADD_DEPENDENCY] = {.jvp = kiln__jvp_barrier,
                                .vjp = kiln__vjp_barrier,
                                .batch = kiln__batch_passthrough},
    [KILN_OP_INFEED] = UNBATCHED,
    [KILN_OP_OUTFEED] = UNBATCHED,
    [KILN_OP_SEND] = UNBATCHED,
    [KILN_OP_SEND_DONE] = UNBATCHED,
    [KILN_OP_RECV] = UNBATCHED,
    [KILN_OP_RECV_DONE] = UNBATCHED,
    [KILN_OP_COPY_START] = LOWERED,
    [KILN_OP_COPY_DONE] = LOWERED,
    /* collectives */
    [KILN_OP_REPLICA_ID] = UNBATCHED,
    [KILN_OP_PARTITION_ID] = UNBATCHED,
    [KILN_OP_ALL_REDUCE] = {.jvp = kiln__jvp_all_reduce,
                            .vjp = kiln__vjp_all_reduce,
                            .batch = kiln__batch_same},
    [KILN_OP_ALL_REDUCE_START] = LOWERED,
    [KILN_OP_ALL_REDUCE_DONE] = LOWERED,
    [KILN_OP_ALL_GATHER] = LINEAR(kiln__vjp_all_gather, kiln__batch_dims_attr),
    [KILN_OP_ALL_GATHER_START] = LOWERED,
    [KILN_OP_ALL_GATHER_DONE] = LOWERED,
    [KILN_OP_REDUCE_SCATTER] = {.jvp = kiln__jvp_reduce_scatter,
                                .vjp = kiln__vjp_reduce_scatter,
                                .batch = kiln__batch_dims_attr},
    [KILN_OP_ALL_TO_ALL] = LINEAR(kiln__vjp_all_to_all, kiln__batch_dims_attr),
    [KILN_OP_RAGGED_ALL_TO_ALL] = NONE,
    [KILN_OP_COLLECTIVE_PERMUTE] = LINEAR(kiln__vjp_collective_permute, kiln__batch_same),
    [KILN_OP_COLLECTIVE_PERMUTE_START] = LOWERED,
    [KILN_OP_COLLECTIVE_PERMUTE_DONE] = LOWERED,
    [KILN_OP_COLLECTIVE_BROADCAST] = LINEAR(kiln__vjp_collective_broadcast, kiln__batch_same),
};

/* Ops deliberately left without derivative rules (no jvp/vjp and not
 * lowered), each with the reason a refusal names. Reaching one with a
 * nonzero tangent or cotangent is an error naming the op; off the
 * differentiated path they are copied as they are. The rule-table test
 * holds this list to the table above, both ways. */
const kiln__no_rule kiln__tf_no_derivative[] = {
    {KILN_OP_INVALID, "not an op"},
    {KILN_OP_PARAMETER, "bound by the region drivers"},
    {KILN_OP_CONSTANT, "no operands"},
    {KILN_OP_IOTA, "no operands"},
    {KILN_OP_CLZ, "integer values"},
    {KILN_OP_BITCAST_CONVERT, "reinterprets bits"},
    {KILN_OP_IS_FINITE, "pred result"},
    {KILN_OP_NOT, "integer or pred values"},
    {KILN_OP_POPCNT, "integer values"},
    {KILN_OP_AND, "integer or pred values"},
    {KILN_OP_COMPARE, "pred result"},
    {KILN_OP_OR, "integer or pred values"},
    {KILN_OP_SHIFT_LEFT, "integer values"},
    {KILN_OP_SHIFT_RIGHT_ARITH, "integer values"},
    {KILN_OP_SHIFT_RIGHT_LOGICAL, "integer values"},
    {KILN_OP_XOR, "integer or pred values"},
    {KILN_OP_STOCHASTIC_CONVERT, "random rounding"},
    {KILN_OP_DYNAMIC_RESHAPE, "dynamic shapes are not transformed"},
    {KILN_OP_GET_DIMENSION_SIZE, "integer result"},
    {KILN_OP_SET_DIMENSION_SIZE, "dynamic shapes are not transformed"},
    {KILN_OP_CUSTOM_CALL, "its body is opaque to the transforms"},
    {KILN_OP_RNG, "random values"},
    {KILN_OP_RNG_BIT_GENERATOR, "random values"},
    {KILN_OP_RNG_GET_AND_UPDATE_STATE, "random values"},
    {KILN_OP_AFTER_ALL, "tokens"},
    {KILN_OP_INFEED, "side effect"},
    {KILN_OP_OUTFEED, "side effect"},
    {KILN_OP_SEND, "side effect"},
    {KILN_OP_SEND_DONE, "side effect"},
    {KILN_OP_RECV, "side effect"},
    {KILN_OP_RECV_DONE, "side effect"},
    {KILN_OP_REPLICA_ID, "integer result"},
    {KILN_OP_PARTITION_ID, "integer result"},
    {KILN_OP_RAGGED_ALL_TO_ALL, "no rule yet"},
};
const uint32_t kiln__tf_no_derivative_count =
    sizeof kiln__tf_no_derivative / sizeof kiln__tf_no_derivative[0];

/* Ops deliberately left without a batching rule (and not lowered). */
const kiln__no_rule kiln__tf_no_batching[] = {
    {KILN_OP_INVALID, "not an op"},
    {KILN_OP_PARAMETER, "bound by the region drivers"},
    {KILN_OP_DYNAMIC_RESHAPE, "dynamic shapes are not transformed"},
    {KILN_OP_SET_DIMENSION_SIZE, "dynamic shapes are not transformed"},
    {KILN_OP_CUSTOM_CALL, "its body is opaque to the transforms"},
    {KILN_OP_RAGGED_ALL_TO_ALL, "no rule yet"},
};
const uint32_t kiln__tf_no_batching_count =
    sizeof kiln__tf_no_batching / sizeof kiln__tf_no_batching[0];

const char *kiln__tf_no_rule_why(const kiln__no_rule *list, uint32_t n, kiln_opcode op) {
  for (uint32_t i = 0; i < n; i++)
    if (list[i].op == op) return list[i].why;
  return NULL;
}

/* vmap of a debug print prints the whole batch: the same call on the
 * batched value, its result shaped like it. */
static int batch_debug_print(kiln__bt *c, const kiln_instr *ins) {
  kiln_id v = c->val[kiln__bt_slot(c, ins->operands[0])];
  kiln_instr *n = kiln__b_clone_start(&c->b, ins, &v, 1);
  if (n && kiln_instr_set_shape(c->tx->m, n, kiln__b_shape(c->tx, v))) kiln__tx_oom(c->tx);
  c->val[kiln__bt_slot(c, ins->id)] = kiln__b_finish(&c->b, n);
  c->sig[kiln__bt_slot(c, ins->id)] = c->sig[kiln__bt_slot(c, ins->operands[0])];
  return c->tx->err;
}

/* kiln.debug_print passes its operand on: its tangent and cotangent pass
 * through unprinted (the primal is printed once), and vmap prints the
 * whole batch. */
static const kiln__rule debug_print_rule = {
    .jvp = kiln__jvp_barrier, .vjp = kiln__vjp_barrier, .batch = batch_debug_print};

const kiln__rule *kiln__tf_rule_of(const kiln_instr *ins) {
  if (kiln_debug_print_is(ins)) return &debug_print_rule;
  if (kiln__tf_is_custom(ins)) return &kiln__tf_custom_rule;
  return &kiln__tf_rules[ins->op];
}
