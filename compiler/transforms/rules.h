/* Internals of the transforms: the rule table and the contexts its rules
 * work in.
 *
 * The table (rules.c) has one row per opcode of ops.def. A row holds:
 *   partial  elementwise ops only: the linear map v -> (d out / d operand k)
 *            * v, with v shaped like the result. Forward and reverse mode
 *            both use it (the Jacobian of an elementwise op is diagonal, so
 *            it is its own transpose);
 *   jvp      forward mode: sets the tangent of the result from the primal
 *            and tangent of the operands;
 *   vjp      reverse mode (the transpose rule): given the cotangent of the
 *            result, adds the cotangents of the operands;
 *   fwd      reverse mode, optional: emits the forward value itself when a
 *            plain copy is not enough (loops that must save their states,
 *            calls whose insides the backward pass needs);
 *   batch    vmap: emits the batched op from batched operands.
 * A NULL jvp/vjp means "not differentiable": reaching it with a nonzero
 * tangent or cotangent is an error naming the op and instruction. A NULL
 * batch means the op cannot be batched.
 *
 * Differentiation works region by region: a region is one source
 * computation copied into a destination computation with its parameters
 * bound to given values. The entry is a region; so are loop bodies,
 * conditional branches and called computations. Source ids index the
 * per-region tables (they never change while a transform runs: transforms
 * only add computations).
 */
#ifndef KILN_COMPILER_TRANSFORMS_RULES_H
#define KILN_COMPILER_TRANSFORMS_RULES_H

#include <assert.h>

#include "compiler/ir/build.h"

/* ---- differentiation (jvp and vjp) -------------------------------------- */

typedef struct kiln__ad kiln__ad;

struct kiln__ad {
  kiln__tx *tx;
  kiln__b b; /* where instructions go */
  const kiln_computation *src;
  /* Tables over src's ids lo .. lo + n - 1, indexed by kiln__ad_slot. */
  kiln_id *prim;   /* source id -> destination primal value */
  kiln_id *tan;    /* jvp: source id -> tangent; KILN_NO_ID is zero */
  uint8_t *need;   /* jvp: the tangent of this value is used */
  kiln_id *cot;    /* vjp: accumulated cotangent; KILN_NO_ID is zero */
  uint8_t *active; /* vjp: depends on a differentiated input */
  void **aux;      /* vjp: per-instruction data its fwd rule saved */
  uint32_t lo, n;  /* the lowest id of src's instructions; the tables' length */
};

/* The table index of source id `id`: an instruction of c->src (operands
 * are in the same computation, the verifier says so). */
static inline uint32_t kiln__ad_slot(const kiln__ad *c, kiln_id id) {
  assert(id - c->lo < c->n);
  return id - c->lo;
}

typedef kiln_id (*kiln__partial_fn)(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v);
typedef int (*kiln__jvp_fn)(kiln__ad *c, const kiln_instr *ins);
typedef int (*kiln__vjp_fn)(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
typedef int (*kiln__fwd_fn)(kiln__ad *c, const kiln_instr *ins);

/* ---- batching ----------------------------------------------------------- */

/* Whether each leaf of a value is batched. Batched arrays always carry the
 * batch dimension first; a tuple lists its elements. */
typedef struct kiln__bsig {
  bool b;     /* arrays: batched */
  uint32_t n; /* tuples: elements */
  struct kiln__bsig *el;
} kiln__bsig;

typedef struct kiln__bt {
  kiln__tx *tx;
  kiln__b b;
  const kiln_computation *src;
  int64_t bsize;
  kiln_id *val;     /* source id -> destination value, indexed by kiln__bt_slot */
  kiln__bsig **sig; /* source id -> batching of that value, likewise */
  uint32_t lo, n;   /* the lowest id of src's instructions; the tables' length */
} kiln__bt;

/* The table index of source id `id`, an instruction of c->src. */
static inline uint32_t kiln__bt_slot(const kiln__bt *c, kiln_id id) {
  assert(id - c->lo < c->n);
  return id - c->lo;
}

typedef int (*kiln__batch_fn)(kiln__bt *c, const kiln_instr *ins);

typedef struct kiln__rule {
  kiln__partial_fn partial;
  kiln__jvp_fn jvp;
  kiln__vjp_fn vjp;
  kiln__fwd_fn fwd;
  kiln__batch_fn batch;
  bool own_primal; /* jvp emits the primal value too */
  /* lower.c rewrites it into ops with rules first: always, or for map when
   * its body is elementwise, for convolution when it has batch groups
   * (lower.c reads this column; it keeps no list of its own). */
  bool lowered;
} kiln__rule;

extern const kiln__rule kiln__tf_rules[KILN_OP_COUNT];
/* The rule of one instruction: its opcode's row, except for custom calls
 * whose target the transforms know (kiln.debug_print: an identity with a
 * side effect, ruled like optimization-barrier). */
const kiln__rule *kiln__tf_rule_of(const kiln_instr *ins);
/* Calls carrying a custom_jvp / custom_vjp rule in their frontend
 * attributes (custom.c) are ruled by kiln__tf_custom_rule. */
bool kiln__tf_is_custom(const kiln_instr *ins);
extern const kiln__rule kiln__tf_custom_rule;

/* Ops deliberately without derivative (or batching) rules, with the
 * reason; rules.c. */
typedef struct kiln__no_rule {
  kiln_opcode op;
  const char *why;
} kiln__no_rule;
extern const kiln__no_rule kiln__tf_no_derivative[];
extern const uint32_t kiln__tf_no_derivative_count;
extern const kiln__no_rule kiln__tf_no_batching[];
extern const uint32_t kiln__tf_no_batching_count;
/* The reason op is in list[0..n), or NULL. */
const char *kiln__tf_no_rule_why(const kiln__no_rule *list, uint32_t n, kiln_opcode op);

/* ---- region drivers (ad.c) ---------------------------------------------- */

int kiln__ad_init(kiln__ad *c, kiln__tx *tx, uint32_t dst, const kiln_computation *src);
/* Forward mode over c->src: prim_in/tan_in give each parameter's value and
 * tangent (KILN_NO_ID: zero). Sets c->prim, c->tan for every instruction. */
int kiln__jvp_region(kiln__ad *c, const kiln_id *prim_in, const kiln_id *tan_in);
/* Reverse mode, forward half: copies the region (c->prim), marking
 * parameters whose active_in is set, and what depends on them, active. */
int kiln__vjp_forward(kiln__ad *c, const kiln_id *prim_in, const uint8_t *active_in);
/* Reverse mode, backward half: seeds the root's cotangent (KILN_NO_ID:
 * zero) and propagates; then c->cot[param] are the parameters' cotangents. */
int kiln__vjp_backward(kiln__ad *c, kiln_id ct_root);
/* Copies a source computation into the destination with its parameters
 * bound to args; returns the root's copy. */
kiln_id kiln__ad_inline(kiln__tx *tx, kiln__b *b, const kiln_computation *src, const kiln_id *args);

/* Rules call these. */
static inline kiln_id kiln__X(const kiln__ad *c, const kiln_instr *ins, uint32_t k) {
  return c->prim[kiln__ad_slot(c, ins->operands[k])];
}
static inline kiln_id kiln__T(const kiln__ad *c, const kiln_instr *ins, uint32_t k) {
  return c->tan[kiln__ad_slot(c, ins->operands[k])];
}
static inline kiln_id kiln__Y(const kiln__ad *c, const kiln_instr *ins) {
  return c->prim[kiln__ad_slot(c, ins->id)];
}
/* Whether operand k wants a cotangent. */
bool kiln__ad_wants(const kiln__ad *c, const kiln_instr *ins, uint32_t k);
/* Adds v to the cotangent of operand k (skipped when it wants none). */
void kiln__ad_accum(kiln__ad *c, const kiln_instr *ins, uint32_t k, kiln_id v);
/* The tangent of operand k, zeros made when it is zero. */
kiln_id kiln__ad_tmat(kiln__ad *c, const kiln_instr *ins, uint32_t k);
/* Adds two values of one shape, tuples elementwise; zero-aware. */
kiln_id kiln__ad_add_any(kiln__b *b, kiln_id x, kiln_id y);
/* A value of shape s: v itself, or zeros when v is KILN_NO_ID. */
kiln_id kiln__ad_mat(kiln__b *b, kiln_id v, const kiln_shape *s);
int kiln__ad_not_diff(kiln__ad *c, const kiln_instr *ins);

/* Reducer kinds recognised in to_apply computations. */
typedef enum kiln__red {
  KILN__RED_OTHER,
  KILN__RED_ADD,
  KILN__RED_MUL,
  KILN__RED_MAX,
  KILN__RED_MIN,
  KILN__RED_AND,
  KILN__RED_OR,
  KILN__RED_REPLACE, /* returns its second parameter (scatter) */
} kiln__red;
kiln__red kiln__tf_reducer_kind(const kiln_module *m, uint32_t comp);

/* Dimension numbers of a gather, or of a scatter read as the gather of
 * its updates (update_window_dims as offset_dims, inserted_window_dims as
 * collapsed_slice_dims, ...; sizes empty). */
typedef struct kiln__gdims {
  kiln_i64s offset, collapsed, start_map, obatch, ibatch, sizes;
  int64_t ivd;
} kiln__gdims;
kiln__gdims kiln__tf_gather_dims(const kiln_instr *gather);
kiln__gdims kiln__tf_scatter_dims(const kiln_instr *scatter);
kiln_id kiln__tf_gather(kiln__b *b, kiln_id x, kiln_id idx, const kiln__gdims *d);
kiln_id kiln__tf_scatter(kiln__b *b, kiln_id x, kiln_id idx, kiln_id u, const kiln__gdims *d,
                         uint32_t comp);

/* Whether a call is marked for rematerialization. */
bool kiln__tf_is_checkpoint(const kiln_instr *ins);
#define KILN__CHECKPOINT_ATTR "{_kiln_checkpoint=\"true\"}"

/* tree.c: the scalar computation f applied elementwise to arrays args (of
 * dims[rank]), its constants broadcast; f's root value (a tuple when f
 * returns one). Fails naming `where` when f holds an op that is not
 * elementwise. */
kiln_id kiln__tf_apply_scalar(kiln__b *b, const kiln_computation *f, const kiln_id *args,
                              const int64_t *dims, uint32_t rank, const kiln_instr *where);
/* tree.c: whether kiln__tf_apply_scalar can apply f (scalar elementwise
 * ops, constants, tuples, calls of such computations). */
bool kiln__tf_scalar_comp_ok(const kiln_module *m, const kiln_computation *f, uint32_t depth);
/* tree.c: a new computation taking reduce `red`'s operands and computing
 * its result as a tree of elementwise reducer steps; KILN_NO_ID on error. */
uint32_t kiln__tf_reduce_tree(kiln__tx *tx, const kiln_instr *red);

/* conv.c: splits dimension `axis` of v into (g, n/g) and merges the g part
 * into dimension `into` as its major part. */
kiln_id kiln__tf_regroup(kiln__b *b, kiln_id v, int64_t axis, int64_t into, int64_t g);

/* lower.c: rewrites the computations reachable from the ENTRY whose ops
 * have no rules of their own but equal compositions of ops that do (async
 * wrappers, batch norms, maps of elementwise bodies, batch-grouped
 * convolutions) into new computations; *entry is the lowered ENTRY (the
 * ENTRY itself when nothing needed lowering). The module's computations
 * are not changed. */
int kiln__tf_lower(kiln__tx *tx, uint32_t *entry);
/* Whether kiln__tf_lower rewrites instructions of this op (always, or for
 * map: when its body is elementwise; for convolution: with batch groups):
 * the lowered column of the rule table. */
bool kiln__tf_lowered_op(kiln_opcode op);

/* Trip count of a while loop known at compile time, or -1: the
 * known_trip_count of its backend_config (a hint from the producer, as XLA
 * takes it), else kiln__tf_trip_count_counted. */
int64_t kiln__tf_trip_count(const kiln_module *m, const kiln_instr *w);
/* Trip count from the loop's own instructions only, or -1: the condition
 * compares a state element stepped by a constant in the body (from a
 * constant initial value) with a constant or an element the body passes
 * through, and the last value the counter takes fits its type. A pass
 * whose rewrite is only right for the true count uses this one. */
int64_t kiln__tf_trip_count_counted(const kiln_module *m, const kiln_instr *w);

/* ---- rule bodies, by file ----------------------------------------------- */

/* jvp.c: elementwise partials and the generic elementwise jvp/vjp. */
kiln_id kiln__d_abs(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
/* real, imag and complex take their direction from v's type: a complex v
 * on a real result (or a real v on a complex one) is a tangent, the other
 * way a cotangent. */
kiln_id kiln__d_real(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_imag(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_complex(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_cbrt(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_identity(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_cos(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_sin(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_tan(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_erf(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_exp(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_expm1(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_log(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_log1p(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_logistic(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_negate(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_reduce_precision(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_rsqrt(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_sqrt(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_tanh(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_add(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_sub(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_mul(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_div(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_atan2(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_maxmin(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_pow(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_rem(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_clamp(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
kiln_id kiln__d_select(kiln__ad *, const kiln_instr *, uint32_t, kiln_id);
int kiln__jvp_elementwise(kiln__ad *c, const kiln_instr *ins);
int kiln__vjp_elementwise(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__jvp_zero(kiln__ad *c, const kiln_instr *ins);
int kiln__vjp_zero(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__jvp_convert(kiln__ad *c, const kiln_instr *ins);
int kiln__vjp_convert(kiln__ad *c, const kiln_instr *ins, kiln_id ct);

/* linear.c, reduce.c, gather.c, conv.c: structural, linear and reducing ops. */
int kiln__jvp_linear(kiln__ad *c, const kiln_instr *ins); /* op(tangents, same attrs) */
int kiln__jvp_tuple(kiln__ad *c, const kiln_instr *ins);
int kiln__jvp_gte(kiln__ad *c, const kiln_instr *ins);
int kiln__jvp_dot(kiln__ad *c, const kiln_instr *ins); /* also convolution */
int kiln__jvp_reduce(kiln__ad *c, const kiln_instr *ins);
int kiln__fwd_reduce(kiln__ad *c, const kiln_instr *ins);
int kiln__jvp_reduce_window(kiln__ad *c, const kiln_instr *ins);
int kiln__jvp_scatter(kiln__ad *c, const kiln_instr *ins);
int kiln__jvp_select_and_scatter(kiln__ad *c, const kiln_instr *ins);
int kiln__jvp_all_reduce(kiln__ad *c, const kiln_instr *ins);
int kiln__jvp_barrier(kiln__ad *c, const kiln_instr *ins);

int kiln__vjp_tuple(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_gte(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_copy(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_broadcast(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_reshape(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_transpose(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_slice(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_pad(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_concatenate(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_reverse(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_dynamic_slice(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_dynamic_update_slice(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_dot(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_convolution(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_reduce(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_reduce_window(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_gather(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_scatter(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_select_and_scatter(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_all_reduce(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_barrier(kiln__ad *c, const kiln_instr *ins, kiln_id ct);

/* linalg.c */
int kiln__jvp_triangular_solve(kiln__ad *c, const kiln_instr *ins);
int kiln__vjp_triangular_solve(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_fft(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__jvp_cholesky(kiln__ad *c, const kiln_instr *ins);
int kiln__vjp_cholesky(kiln__ad *c, const kiln_instr *ins, kiln_id ct);

/* collective.c */
int kiln__jvp_reduce_scatter(kiln__ad *c, const kiln_instr *ins);
int kiln__vjp_all_gather(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_reduce_scatter(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_all_to_all(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_collective_permute(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_collective_broadcast(kiln__ad *c, const kiln_instr *ins, kiln_id ct);

/* sort.c */
int kiln__jvp_sort(kiln__ad *c, const kiln_instr *ins);
int kiln__fwd_sort(kiln__ad *c, const kiln_instr *ins);
int kiln__vjp_sort(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__jvp_topk(kiln__ad *c, const kiln_instr *ins);
int kiln__vjp_topk(kiln__ad *c, const kiln_instr *ins, kiln_id ct);

/* ad_control.c: while, conditional, call. */
int kiln__jvp_while(kiln__ad *c, const kiln_instr *ins);
int kiln__jvp_conditional(kiln__ad *c, const kiln_instr *ins);
int kiln__jvp_call(kiln__ad *c, const kiln_instr *ins);
int kiln__fwd_while(kiln__ad *c, const kiln_instr *ins);
int kiln__fwd_call(kiln__ad *c, const kiln_instr *ins);
int kiln__vjp_while(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_conditional(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
int kiln__vjp_call(kiln__ad *c, const kiln_instr *ins, kiln_id ct);
/* ins differentiated as if it were a call of computation comp on its
 * operands: jvp_via sets its tangent; fwd_via emits its forward value and
 * keeps what vjp_via (which must follow it) differentiates. */
int kiln__jvp_via(kiln__ad *c, const kiln_instr *ins, uint32_t comp);
int kiln__fwd_via(kiln__ad *c, const kiln_instr *ins, uint32_t comp);
int kiln__vjp_via(kiln__ad *c, const kiln_instr *ins, kiln_id ct);

/* batch*.c */
int kiln__bt_init(kiln__bt *c, kiln__tx *tx, uint32_t dst, const kiln_computation *src,
                  int64_t bsize);
/* Batches c->src with parameters bound to args of batching sigs. */
int kiln__batch_region(kiln__bt *c, const kiln_id *args, kiln__bsig *const *sigs);
kiln__bsig *kiln__bsig_make(kiln__tx *tx, const kiln_shape *s, bool batched);
bool kiln__bsig_any(const kiln__bsig *s);
bool kiln__bsig_equal(const kiln__bsig *a, const kiln__bsig *b);
/* Least upper bound: batched where either is. */
kiln__bsig *kiln__bsig_join(kiln__tx *tx, const kiln__bsig *a, const kiln__bsig *b);
/* Moves/broadcasts value v (of source shape s, batching `have`) to
 * batching `want` (which must be at least `have`). */
kiln_id kiln__bt_coerce(kiln__bt *c, kiln_id v, const kiln__bsig *have, const kiln__bsig *want);
/* Operand k of ins, batched (broadcast along the batch when it was not). */
kiln_id kiln__bt_operand(kiln__bt *c, const kiln_instr *ins, uint32_t k);
bool kiln__bt_batched(const kiln__bt *c, const kiln_instr *ins, uint32_t k);
/* The shape of a value of source shape s batched as g. */
int kiln__bt_shape(kiln__tx *tx, const kiln_shape *s, const kiln__bsig *g, int64_t bsize,
                   kiln_shape *out);
/* Moves dimension `from` of v to position `to`. */
kiln_id kiln__bt_move_axis(kiln__b *b, kiln_id v, int64_t from, int64_t to);
/* Records the result of ins. */
void kiln__bt_set(kiln__bt *c, const kiln_instr *ins, kiln_id v, bool batched);

int kiln__batch_elementwise(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_same(kiln__bt *c, const kiln_instr *ins);        /* clone; batch stays leading */
int kiln__batch_unbatched(kiln__bt *c, const kiln_instr *ins);   /* no batched operand allowed */
int kiln__batch_passthrough(kiln__bt *c, const kiln_instr *ins); /* result batched as operand 0 */
int kiln__batch_map(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_tuple(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_gte(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_broadcast(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_reshape(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_transpose(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_slice(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_pad(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_concatenate(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_dims_attr(kiln__bt *c, const kiln_instr *ins); /* shift "dimensions" by one */
int kiln__batch_dynamic_slice(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_dynamic_update_slice(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_dot(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_reduce(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_reduce_window(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_select_and_scatter(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_gather(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_scatter(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_convolution(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_get_dimension_size(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_while(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_conditional(kiln__bt *c, const kiln_instr *ins);
int kiln__batch_call(kiln__bt *c, const kiln_instr *ins);
/* A new computation: src batched with parameters batched as sigs, its root
 * coerced to `want` when given; *got (may be NULL) is the root's batching.
 * KILN_NO_ID on error. */
uint32_t kiln__bt_comp(kiln__bt *c, const kiln_computation *src, const kiln_shape *const *pshapes,
                       kiln__bsig *const *sigs, uint32_t np, const kiln__bsig *want,
                       const char *suffix, kiln__bsig **got);

#endif /* KILN_COMPILER_TRANSFORMS_RULES_H */
