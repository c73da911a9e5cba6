/* The instruction builder shared by the passes and the transforms: "emit
 * add(a, b)" in one line.
 *
 * A kiln__tx is one building session over a module (a transform, or one run
 * of a pass); a kiln__b says where instructions go: one computation of it.
 * Every builder appends one instruction, gives it a name that is unique in
 * its computation (see build.c), infers its result shape (kiln_infer_shape)
 * unless the caller gives one, and returns its id. Errors are sticky in the
 * session: after the first failure every builder returns KILN_NO_ID (or
 * NULL) and does nothing, so callers can chain builders and check once at
 * the end. get-tuple-element of a tuple instruction folds to the element,
 * and zeros made by kiln__b_zeros are remembered (kiln__b_is_zero) so that
 * rules can keep symbolic zeros symbolic.
 *
 * Scalar constants convert their value to the element type in one step, the
 * same for every caller (kiln__b_scalar, kiln__b_iscalar, kiln__b_uscalar).
 *
 * The purity questions that decide whether a pass may move, merge, remove
 * or evaluate an instruction live here too, next to the builders that do
 * the moving.
 */
#ifndef KILN_COMPILER_IR_BUILD_H
#define KILN_COMPILER_IR_BUILD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/strmap.h"
#include "compiler/ir/ir.h"

/* State shared by everything one session builds. */
typedef struct kiln__tx {
  kiln_module *m;
  kiln_status *st;  /* may be NULL: the caller reports errors itself */
  const char *name; /* the transform or pass, as messages name it: "grad" */
  int err;          /* first error code; 0 while none */
  uint8_t *zero;    /* zero[id]: instruction id is known to be all zeros */
  size_t zcap;
  kiln_arena *scratch; /* freed when the session ends */
  /* names[c]: the names in use in computation c, filled on the first build
   * into c (valid when c < ncomps_named and named[c]); keys point at arena
   * names, which outlive the session. Instructions added to c behind the
   * builder's back afterwards are not seen. */
  kiln_strmap *names;
  uint8_t *named;
  size_t ncomps_named;
} kiln__tx;

/* Where builders append: one computation. Plain value; {tx, comp}. */
typedef struct kiln__b {
  kiln__tx *tx;
  uint32_t comp;
} kiln__b;

/* `st` may be NULL. kiln__tx_fini is needed even after a failed init. */
int kiln__tx_init(kiln__tx *tx, kiln_module *m, const char *name, kiln_status *st);
void kiln__tx_fini(kiln__tx *tx);

/* Records an error (first wins) and returns its code. `ins` (may be NULL)
 * names the source instruction in where. */
int kiln__tx_fail(kiln__tx *tx, int code, const kiln_instr *ins, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline bool kiln__tx_ok(const kiln__tx *tx) { return tx->err == 0; }
int kiln__tx_oom(kiln__tx *tx);
/* Polls the thread's deadline (common/deadline.h): its error, recorded as
 * the session's, or 0. Cheap enough for every instruction of a walk. */
int kiln__tx_poll(kiln__tx *tx);

static inline const kiln_shape *kiln__b_shape(const kiln__tx *tx, kiln_id id) {
  return &tx->m->instrs[id]->shape;
}
static inline kiln_instr *kiln__b_ins(const kiln__tx *tx, kiln_id id) { return tx->m->instrs[id]; }
bool kiln__b_is_zero(const kiln__tx *tx, kiln_id id);
/* n ids (or int64s) of scratch memory; NULL after an error. */
kiln_id *kiln__b_ids(kiln__tx *tx, uint32_t n);
int64_t *kiln__b_i64s(kiln__tx *tx, uint32_t n);

/* A new computation named after `base` (made unique in the module). */
int kiln__b_new_comp(kiln__tx *tx, const char *base, uint32_t *out);

/* ---- generic ------------------------------------------------------------ */

/* A new instruction with operands, no shape yet: set attributes, then
 * kiln__b_finish infers the shape. NULL after an error. */
kiln_instr *kiln__b_start(kiln__b *b, kiln_opcode op, const kiln_id *ops, uint32_t n);
kiln_id kiln__b_finish(kiln__b *b, kiln_instr *ins);
kiln_id kiln__b_op(kiln__b *b, kiln_opcode op, const kiln_id *ops, uint32_t n);
/* A new instruction with operands and result shape `shape` (copied, layout
 * included; not inferred), for passes that must keep layouts: set its
 * attributes, nothing to finish. NULL after an error. */
kiln_instr *kiln__b_make(kiln__b *b, kiln_opcode op, const kiln_shape *shape, const kiln_id *ops,
                         uint32_t n);
/* A copy of `src` (attributes and called computations; no sharding, no
 * control edges) on new operands, its shape inferred again. */
kiln_id kiln__b_clone(kiln__b *b, const kiln_instr *src, const kiln_id *ops, uint32_t n);
/* kiln__b_clone without the shape inference: adjust attributes, then
 * kiln__b_finish. NULL after an error. */
kiln_instr *kiln__b_clone_start(kiln__b *b, const kiln_instr *src, const kiln_id *ops, uint32_t n);
/* Same but keeps src's result shape and sharding (operands of the same
 * shapes as src's). */
kiln_id kiln__b_clone_same(kiln__b *b, const kiln_instr *src, const kiln_id *ops, uint32_t n);
/* kiln__b_clone_same that keeps src's very name when it is free in b's
 * computation (an instruction moved out of a loop body stays recognisable);
 * otherwise named after its opcode, as kiln__b_make names. */
kiln_id kiln__b_clone_keep_name(kiln__b *b, const kiln_instr *src, const kiln_id *ops, uint32_t n);
/* Removes attribute `key` from ins; whether it was there. */
bool kiln__b_drop_attr(kiln_instr *ins, kiln_attr_key key);
/* Parameter `number`, named after `base` (NULL: "param"). */
kiln_id kiln__b_param(kiln__b *b, int64_t number, const kiln_shape *shape, const char *base);

/* ---- elementwise -------------------------------------------------------- */

kiln_id kiln__b_un(kiln__b *b, kiln_opcode op, kiln_id x);
kiln_id kiln__b_bin(kiln__b *b, kiln_opcode op, kiln_id x, kiln_id y);
kiln_id kiln__b_add(kiln__b *b, kiln_id x, kiln_id y); /* zero-aware */
kiln_id kiln__b_sub(kiln__b *b, kiln_id x, kiln_id y);
kiln_id kiln__b_mul(kiln__b *b, kiln_id x, kiln_id y);
kiln_id kiln__b_div(kiln__b *b, kiln_id x, kiln_id y);
kiln_id kiln__b_neg(kiln__b *b, kiln_id x);
kiln_id kiln__b_cmp(kiln__b *b, kiln_id x, kiln_id y, kiln_cmp_dir dir);
kiln_id kiln__b_select(kiln__b *b, kiln_id p, kiln_id x, kiln_id y);
kiln_id kiln__b_convert(kiln__b *b, kiln_id x, kiln_dtype t);
/* complex(re, im), and the conjugate complex(real(x), -imag(x)). */
kiln_id kiln__b_complex(kiln__b *b, kiln_id re, kiln_id im);
kiln_id kiln__b_conj(kiln__b *b, kiln_id x);
/* x converted to `t` only when its type differs. */
kiln_id kiln__b_as(kiln__b *b, kiln_id x, kiln_dtype t);

/* ---- constants ---------------------------------------------------------- */

/* A scalar constant of type t. Each converts its value to t in one step,
 * the same way for every type:
 * - kiln__b_scalar: v as convert(f64 -> t) is in Kiln (kiln_literal_set_f64):
 *   real floats round to nearest even (f16, bf16 and f8 straight from the
 *   double, never through f32), complex types hold (v, 0), pred is v != 0,
 *   integers truncate toward zero and saturate to the type's range (NaN is
 *   0), so u64 values above 2^63 and the s64 extremes are exact where the
 *   double is.
 * - kiln__b_iscalar: the integer v exactly; integers wrap to the width
 *   (two's complement: -1 is all ones in an unsigned type), floats and
 *   complex types round the exact integer to nearest even once, pred is
 *   v != 0.
 * - kiln__b_uscalar: the same for an unsigned v (all of u64). */
kiln_id kiln__b_scalar(kiln__b *b, kiln_dtype t, double v);
kiln_id kiln__b_iscalar(kiln__b *b, kiln_dtype t, int64_t v);
kiln_id kiln__b_uscalar(kiln__b *b, kiln_dtype t, uint64_t v);
/* An array of shape `shape` (layout included) whose elements all equal the
 * scalar instruction `scalar` (of the same element type): the scalar itself
 * when the shape is a scalar, else a broadcast with dimensions={}. */
kiln_id kiln__b_splat(kiln__b *b, kiln_id scalar, const kiln_shape *shape);
/* An array of `dims` filled with v (broadcast of a scalar constant). */
kiln_id kiln__b_full(kiln__b *b, kiln_dtype t, const int64_t *dims, uint32_t rank, double v);
/* v shaped like x (dtype and dims). */
kiln_id kiln__b_full_like(kiln__b *b, kiln_id x, double v);
/* Zeros of any shape (tuples of zeros for tuples), remembered as zero. */
kiln_id kiln__b_zeros(kiln__b *b, const kiln_shape *s);
kiln_id kiln__b_zeros_like(kiln__b *b, kiln_id x);
/* A rank-1 constant of integers. */
kiln_id kiln__b_const_ints(kiln__b *b, kiln_dtype t, const int64_t *v, uint32_t n);
kiln_id kiln__b_iota(kiln__b *b, kiln_dtype t, const int64_t *dims, uint32_t rank, int64_t dim);

/* ---- shapes ------------------------------------------------------------- */

kiln_id kiln__b_broadcast(kiln__b *b, kiln_id x, const int64_t *dims, uint32_t rank,
                          const int64_t *map, uint32_t nmap);
/* x broadcast to the dims of `like` (x a scalar or already that shape). */
kiln_id kiln__b_broadcast_like(kiln__b *b, kiln_id x, kiln_id like);
kiln_id kiln__b_reshape(kiln__b *b, kiln_id x, const int64_t *dims, uint32_t rank);
kiln_id kiln__b_transpose(kiln__b *b, kiln_id x, const int64_t *perm, uint32_t rank);
kiln_id kiln__b_slice(kiln__b *b, kiln_id x, const int64_t *start, const int64_t *limit,
                      const int64_t *stride);
kiln_id kiln__b_slice_dim(kiln__b *b, kiln_id x, uint32_t dim, int64_t start, int64_t limit);
kiln_id kiln__b_pad(kiln__b *b, kiln_id x, kiln_id v, const int64_t *lo, const int64_t *hi,
                    const int64_t *interior);
kiln_id kiln__b_concat(kiln__b *b, const kiln_id *xs, uint32_t n, int64_t dim);
kiln_id kiln__b_reverse(kiln__b *b, kiln_id x, const int64_t *dims, uint32_t n);
kiln_id kiln__b_dyn_slice(kiln__b *b, kiln_id x, const kiln_id *idx, uint32_t n,
                          const int64_t *sizes);
kiln_id kiln__b_dyn_update(kiln__b *b, kiln_id x, kiln_id u, const kiln_id *idx, uint32_t n);

/* ---- tuples ------------------------------------------------------------- */

kiln_id kiln__b_tuple(kiln__b *b, const kiln_id *xs, uint32_t n);
kiln_id kiln__b_gte(kiln__b *b, kiln_id x, int64_t i); /* folds gte(tuple(...)) */

/* ---- contractions and reductions ---------------------------------------- */

kiln_id kiln__b_dot(kiln__b *b, kiln_id x, kiln_id y, const kiln_i64s *lb, const kiln_i64s *lc,
                    const kiln_i64s *rb, const kiln_i64s *rc);
/* The computation (p0, p1) -> op(p0, p1) on scalars of type t, made once
 * per module; KILN_NO_ID after an error. op KILN_OP_INVALID: returns p1
 * ("replace", for scatter). */
uint32_t kiln__b_reducer(kiln__tx *tx, kiln_opcode op, kiln_dtype t);
/* The computation (p0, p1) -> compare(p0, p1, dir), for select-and-scatter. */
uint32_t kiln__b_comparator(kiln__tx *tx, kiln_cmp_dir dir, kiln_dtype t);
kiln_id kiln__b_reduce(kiln__b *b, kiln_id x, kiln_id init, const int64_t *dims, uint32_t n,
                       kiln_opcode op);
kiln_id kiln__b_reduce_sum(kiln__b *b, kiln_id x, const int64_t *dims, uint32_t n);
/* Sums x down to the dims of `like`, where x is `like` broadcast (a scalar
 * `like` sums everything; equal shapes return x). */
kiln_id kiln__b_sum_to_like(kiln__b *b, kiln_id x, kiln_id like);
kiln_id kiln__b_call(kiln__b *b, uint32_t comp, const kiln_id *ops, uint32_t n);

/* ---- small helpers over shapes ------------------------------------------ */

/* A differentiable array: real or complex floating point. Complex values
 * carry tangents and cotangents as JAX's do (transposes without
 * conjugation); only grad's output must be real. */
static inline bool kiln__b_is_float_shape(const kiln_shape *s) {
  return kiln_shape_is_array(s) &&
         (kiln_dtype_is_float(s->dtype) || kiln_dtype_is_complex(s->dtype));
}
/* Any differentiable (real or complex floating) leaf. */
bool kiln__b_has_float(const kiln_shape *s);
/* Number of leaves (1 for an array or token). */
uint32_t kiln__b_leaf_count(const kiln_shape *s);
/* Copies a shape with the batch size inserted at dim 0. */
int kiln__b_shape_batched(kiln__tx *tx, const kiln_shape *s, int64_t bsize, kiln_shape *out);

/* ---- purity ------------------------------------------------------------- */

/* Whether the instruction may be removed, merged with an equal one,
 * evaluated at compile time or moved: no side effect, no randomness, no
 * communication, no async or token plumbing, no optimization barrier, and
 * (given `impure`, indexed by computation id, or NULL) no call into a
 * computation that is impure. */
bool kiln__instr_is_pure(const kiln_module *m, const kiln_instr *ins, const bool *impure);

/* impure[c] for every computation: it holds, or calls into, an instruction
 * that is not pure. kiln_malloc'd (m->ncomps entries); NULL on
 * out-of-memory. */
bool *kiln__impure_computations(const kiln_module *m);

#endif /* KILN_COMPILER_IR_BUILD_H */
