/* Internals of the reference interpreter, shared by its files.
 *
 * Values are heap literals (kiln_literal with a private arena). An evaluator
 * context carries the module, the options, the live-byte account and the
 * first error. Every op handler has one signature: it reads its operand
 * literals (already evaluated, never modified) and creates one result
 * literal, owned by the caller. Element values move through kiln__interp_scalar, a
 * typed scalar whose semantics (one rounding or wraparound per op, as XLA)
 * live in interp_elementwise.c and serve both whole-array elementwise ops and
 * the small scalar computations that reducers, comparators and combiners are.
 */
#ifndef KILN_COMPILER_EVAL_INTERP_INTERNAL_H
#define KILN_COMPILER_EVAL_INTERP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler/eval/interp.h"
#include "compiler/ir/ir.h"

/* CMPLX is C11, but clang with glibc does not define it: build the value
 * without arithmetic, so that infinities and NaNs survive as they are. */
#if defined(__clang__) && !defined(CMPLX)
#define CMPLX(x, y) __builtin_complex((double)(x), (double)(y))
#endif

/* Arrays of higher rank are refused; it keeps index vectors on the stack. */
#define KILN_INTERP_MAX_RANK 32

/* One element value. Floats hold the exact value of their type in f (already
 * rounded to it); signed integers hold s and unsigned integers and pred hold
 * u, both already wrapped to the type's width (pred: 0 or 1); complex types
 * hold re in f and im in im. */
typedef struct kiln__interp_scalar {
  kiln_dtype t;
  union {
    double f;
    int64_t s;
    uint64_t u;
  } v;
  double im;
} kiln__interp_scalar;

typedef struct kiln__interp_comp_info kiln__interp_comp_info;

typedef struct kiln__interp_ctx {
  const kiln_module *m;
  kiln_interp_options opts;
  size_t live; /* bytes of literals alive that the interpreter created */
  size_t max_live;
  uint32_t *pos;                 /* instruction id -> its index within its computation */
  kiln__interp_comp_info *comps; /* per computation, lazily filled */
  uint32_t depth;                /* nesting of computation calls */
  double deadline;               /* monotonic seconds; 0: none */
  uint64_t ticks;                /* scalar calls since the last clock check */
  uint64_t rng_counter;          /* state of rng (distribution) draws */
  uint64_t rng_state[2];         /* rng-get-and-update-state */
  kiln_status *st;
} kiln__interp_ctx;

/* ---- errors ------------------------------------------------------------- */

/* Records code + message at "computation/instruction" and returns code. */
int kiln__interp_fail(kiln__interp_ctx *c, const kiln_instr *ins, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Checks the wall-clock limit; `ins` names where it was hit. */
int kiln__interp_check_time(kiln__interp_ctx *c, const kiln_instr *ins);

/* ---- literals ----------------------------------------------------------- */

/* A zero-filled heap literal of `shape`, counted against the live limit. */
int kiln__interp_lit_new(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_shape *shape,
                         kiln_literal **out);
/* A new literal with the instruction's result shape. */
int kiln__interp_lit_result(kiln__interp_ctx *c, const kiln_instr *ins, kiln_literal **out);
void kiln__interp_lit_free(kiln__interp_ctx *c, kiln_literal *lit);
/* Deep copy, runtime sizes included. */
int kiln__interp_lit_clone(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *src,
                           kiln_literal **out);
/* Copies src's values (and runtime sizes) into dst, whose root literal owns
 * arena `a`; fails unless the two have the same structure and dims. */
int kiln__interp_lit_copy_into(kiln__interp_ctx *c, const kiln_instr *ins, kiln_arena *a,
                               kiln_literal *dst, const kiln_literal *src);
size_t kiln__interp_lit_bytes(const kiln_literal *lit);

/* Runtime size of dim d (the bound when the literal carries no sizes). */
int64_t kiln__interp_dyn_size(const kiln_literal *lit, uint32_t d);
/* Sets runtime sizes (rank entries; NULL = bounds) on an array literal whose
 * root owns arena `a`; only dims the shape marks dynamic keep a size below
 * the bound. */
int kiln__interp_dyn_set(kiln__interp_ctx *c, const kiln_instr *ins, kiln_arena *a,
                         kiln_literal *lit, const int64_t *sizes);
/* Result dims that are dynamic take their runtime size from the same dim of
 * `src` (when the ranks agree). */
int kiln__interp_dyn_inherit(kiln__interp_ctx *c, const kiln_instr *ins, kiln_literal *out,
                             const kiln_literal *src);

/* ---- shapes and indices ------------------------------------------------- */

bool kiln__interp_same_dims(const kiln_shape *a, const kiln_shape *b);
/* Fails unless `lit` is an array of at most KILN_INTERP_MAX_RANK dims. */
int kiln__interp_need_array(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *lit,
                            const char *what);
/* Row-major strides of an array shape. */
void kiln__interp_strides(const kiln_shape *s, int64_t *strides);
/* Advances a row-major multi-index; false after the last one. */
bool kiln__interp_next_index(int64_t *idx, const int64_t *dims, uint32_t rank);
int64_t kiln__interp_linear(const int64_t *idx, const int64_t *strides, uint32_t rank);
/* Whether an attribute's list holds v. */
bool kiln__interp_ints_has(const kiln_i64s *l, int64_t v);
/* Copies one element (its storage bytes) between literals. */
void kiln__interp_copy_elem(kiln_literal *dst, int64_t di, const kiln_literal *src, int64_t si);

/* ---- scalars ------------------------------------------------------------ */

/* Whether the interpreter computes on values of this element type. */
bool kiln__interp_dtype_computable(kiln_dtype t);
kiln__interp_scalar kiln__interp_scalar_load(const kiln_literal *lit, int64_t i);
void kiln__interp_scalar_store(kiln_literal *lit, int64_t i, kiln__interp_scalar v);
/* XLA convert: rounding to nearest even, float->int truncation with
 * saturation and NaN -> 0, integer wraparound. */
kiln__interp_scalar kiln__interp_scalar_convert(kiln__interp_scalar v, kiln_dtype to);
kiln__interp_scalar kiln__interp_scalar_zero(kiln_dtype t);
/* Reads an integer scalar of any type as int64 (for indices). */
int64_t kiln__interp_scalar_as_s64(kiln__interp_scalar v);
bool kiln__interp_scalar_truthy(kiln__interp_scalar v);
/* One elementwise op on scalars: `ins` supplies the opcode and attributes,
 * a[] the operands; the result has element type `out_t`. Returns 0, or
 * KILN_EUNIMPL/KILN_EINVAL with the reason in *why. */
int kiln__interp_scalar_op(const kiln_instr *ins, kiln_opcode op, const kiln__interp_scalar *a,
                           uint32_t n, kiln_dtype out_t, kiln__interp_scalar *r, const char **why);

/* ---- calling computations ----------------------------------------------- */

/* Evaluates computation `comp` on borrowed arguments; *out is new. */
int kiln__interp_call(kiln__interp_ctx *c, const kiln_instr *caller, uint32_t comp,
                      const kiln_literal *const *args, uint32_t nargs, kiln_literal **out);
/* Evaluates a computation of scalars (reducers, comparators, combiners):
 * nargs scalar arguments in, nouts scalar results out (a tuple root gives
 * several). Plain scalar computations run on kiln__interp_scalar directly, without
 * literals; anything else goes through kiln__interp_call. */
int kiln__interp_call_scalar(kiln__interp_ctx *c, const kiln_instr *caller, uint32_t comp,
                             const kiln__interp_scalar *args, uint32_t nargs,
                             kiln__interp_scalar *outs, uint32_t nouts);
/* Element type of a scalar computation's result number i (for accumulators). */
int kiln__interp_comp_result_dtype(kiln__interp_ctx *c, const kiln_instr *caller, uint32_t comp,
                                   uint32_t i, kiln_dtype *out);
/* The value of an async start: (operands, result, zero contexts...) laid out
 * as the instruction's tuple shape declares. */
int kiln__interp_start_value(kiln__interp_ctx *c, const kiln_instr *ins,
                             const kiln_literal *const *ops, uint32_t nops,
                             const kiln_literal *result, kiln_literal **out);
/* Evaluates one instruction (used for async wrappers of plain ops). */
int kiln__interp_eval_instr(kiln__interp_ctx *c, const kiln_instr *ins,
                            const kiln_literal *const *ops, kiln_literal **out);
/* The called computation number i, checked. */
int kiln__interp_called(kiln__interp_ctx *c, const kiln_instr *ins, uint32_t i, uint32_t *out);

/* ---- the device mesh (interp_mesh.c) ------------------------------------ */

int64_t kiln__interp_mesh_replicas(const kiln_interp_mesh *mh);
int64_t kiln__interp_mesh_partitions(const kiln_interp_mesh *mh);
/* Posts this device's operands for collective `ins` with `group` (global
 * device ids, rank order, this device among them) and waits until every
 * member has posted; peer_ops[i] then holds member i's operands. After a
 * successful enter the device must call leave (once it has read them),
 * whatever happens in between. */
int kiln__interp_mesh_enter(kiln__interp_ctx *c, const kiln_instr *ins, const int64_t *group,
                            int64_t ngroup, const kiln_literal *const *ops, uint32_t nops,
                            const kiln_literal *const **peer_ops);
int kiln__interp_mesh_leave(kiln__interp_ctx *c, const kiln_instr *ins, const int64_t *group,
                            int64_t ngroup);
/* A collective evaluated across the mesh (interp_collective.c). */
int kiln__interp_eval_collective_mesh(kiln__interp_ctx *c, const kiln_instr *ins,
                                      const kiln_literal *const *ops, kiln_literal **out);

/* ---- op handlers: (context, instruction, operands, result) -------------- */

typedef int kiln__interp_op_fn(kiln__interp_ctx *c, const kiln_instr *ins,
                               const kiln_literal *const *ops, kiln_literal **out);

/* interp_elementwise.c */
kiln__interp_op_fn kiln__interp_eval_elementwise, kiln__interp_eval_bitcast_convert,
    kiln__interp_eval_map;
/* interp_shape.c */
kiln__interp_op_fn kiln__interp_eval_iota, kiln__interp_eval_broadcast, kiln__interp_eval_reshape,
    kiln__interp_eval_transpose, kiln__interp_eval_slice, kiln__interp_eval_dynamic_slice,
    kiln__interp_eval_dynamic_update_slice, kiln__interp_eval_concatenate, kiln__interp_eval_pad,
    kiln__interp_eval_reverse, kiln__interp_eval_bitcast, kiln__interp_eval_get_dimension_size,
    kiln__interp_eval_set_dimension_size, kiln__interp_eval_dynamic_reshape;
/* interp_gather.c */
kiln__interp_op_fn kiln__interp_eval_gather, kiln__interp_eval_scatter;
/* interp_reduce.c */
kiln__interp_op_fn kiln__interp_eval_reduce, kiln__interp_eval_reduce_window,
    kiln__interp_eval_select_and_scatter, kiln__interp_eval_sort, kiln__interp_eval_topk;
/* interp_dot.c */
kiln__interp_op_fn kiln__interp_eval_dot, kiln__interp_eval_convolution;
/* interp_misc.c */
kiln__interp_op_fn kiln__interp_eval_rng, kiln__interp_eval_rng_bit_generator,
    kiln__interp_eval_rng_get_and_update_state, kiln__interp_eval_collective,
    kiln__interp_eval_custom_call, kiln__interp_eval_replica_id;
/* interp_lapack.c */
kiln__interp_op_fn kiln__interp_eval_lapack;
/* interp_linalg.c */
kiln__interp_op_fn kiln__interp_eval_cholesky, kiln__interp_eval_triangular_solve,
    kiln__interp_eval_fft, kiln__interp_eval_batch_norm_inference,
    kiln__interp_eval_batch_norm_training, kiln__interp_eval_batch_norm_grad;

#endif /* KILN_COMPILER_EVAL_INTERP_INTERNAL_H */
