/* Shared by the shape inference files (infer*.c) and the verifier.
 *
 * Inference of one instruction runs in a kiln__ictx: the module, the
 * instruction, the arena the result goes to, a scratch arena for messages
 * and temporaries, and the status. Every check that XLA's ShapeInference
 * makes lives in the per-op functions; the verifier adds the structural
 * checks and compares the written result shape with the inferred one.
 *
 * Entry invariant: the instruction's operand ids are valid instruction ids
 * (kiln__infer checks them before dispatching), so per-op code may use
 * kiln__oshape(cx, i) for any i < noperands.
 */
#ifndef KILN_COMPILER_IR_INFER_INTERNAL_H
#define KILN_COMPILER_IR_INFER_INTERNAL_H

#include <stdarg.h>

#include "compiler/ir/ir.h"

/* Deepest tuple nesting accepted anywhere (hostile input could nest deeper
 * than the stack allows for the recursive shape helpers). */
#define KILN__MAX_TUPLE_DEPTH 64

typedef struct kiln__ictx {
  const kiln_module *m;
  const kiln_instr *ins;
  kiln_arena *out; /* the inferred shape is allocated here */
  kiln_arena *tmp; /* scratch: message strings, temporary shapes */
  kiln_status *st;
  /* The instruction's written result shape when it has a valid one, else
   * NULL. Ops whose result type cannot come from operands (convert, iota,
   * reshape, ...) take the missing part from it; without it they fail
   * with KILN_EINVAL saying the shape must be written. */
  const kiln_shape *written;
} kiln__ictx;

/* The signature of a called computation. */
typedef struct kiln__sig {
  const kiln_computation *c;
  const kiln_shape **params; /* nparams entries, by parameter number */
  uint32_t nparams;
  const kiln_shape *result; /* the root's shape */
} kiln__sig;

/* Infers the shape of cx->ins into *out (arena cx->out, no layouts). */
int kiln__infer(kiln__ictx *cx, kiln_shape *out);

/* ---- helpers (infer.c) ---- */

/* "computation/instruction", safe on unnamed ones. */
void kiln__where(const kiln_module *m, const kiln_instr *ins, char *buf, size_t n);
/* Checked int64 arithmetic: false on overflow. */
static inline bool kiln__mul(int64_t a, int64_t b, int64_t *r) {
  return !__builtin_mul_overflow(a, b, r);
}
static inline bool kiln__add(int64_t a, int64_t b, int64_t *r) {
  return !__builtin_add_overflow(a, b, r);
}

/* Records "<opcode>: <message>" at the instruction; returns KILN_EVERIFY. */
int kiln__fail(kiln__ictx *cx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same with another code. */
int kiln__failc(kiln__ictx *cx, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int kiln__oom(kiln__ictx *cx);
/* KILN_EINVAL: "<opcode>: the result shape must be written: <why>". */
int kiln__need_written(kiln__ictx *cx, const char *why);

/* Text of a shape without layout ("f32[2,<=3]"), in the scratch arena. */
const char *kiln__sh(kiln__ictx *cx, const kiln_shape *s);
/* "operand 1 (%y)". */
const char *kiln__on(kiln__ictx *cx, uint32_t i);
/* "{1,2}". */
const char *kiln__ints(kiln__ictx *cx, const int64_t *v, uint32_t n);
const char *kiln__cname(const kiln_module *m, uint32_t comp); /* "%name" or "#id" */

static inline const kiln_instr *kiln__operand(const kiln__ictx *cx, uint32_t i) {
  return cx->m->instrs[cx->ins->operands[i]];
}
static inline const kiln_shape *kiln__oshape(const kiln__ictx *cx, uint32_t i) {
  return &kiln__operand(cx, i)->shape;
}

/* Operand i must be an array (not a tuple or token). */
int kiln__expect_array(kiln__ictx *cx, uint32_t i, const char *role);
/* Checks the operand count against [lo, hi] (hi < 0: no upper bound). */
int kiln__expect_operands(kiln__ictx *cx, int64_t lo, int64_t hi);
/* Called computations: exactly n. */
int kiln__expect_called(kiln__ictx *cx, uint32_t n);
/* The signature of called computation ins->called[k], described as `role`
 * ("to_apply", "body") in messages. */
int kiln__called_sig(kiln__ictx *cx, uint32_t k, const char *role, kiln__sig *out);
int kiln__comp_sig(kiln__ictx *cx, uint32_t comp, const char *role, kiln__sig *out);

/* Attributes. `required` ones that are missing fail. */
int kiln__attr_int(kiln__ictx *cx, kiln_attr_key k, bool required, int64_t dflt, int64_t *out);
/* A list attribute; missing and not required gives an empty list. */
int kiln__attr_ints(kiln__ictx *cx, kiln_attr_key k, bool required, kiln_i64s *out);
/* Every entry of v is a dimension in [0, rank) and none repeats. */
int kiln__check_dims(kiln__ictx *cx, const char *what, const int64_t *v, uint32_t n, int64_t rank);

/* Shapes. */
bool kiln__same_type_ignoring_fp(kiln_dtype a, kiln_dtype b);
kiln_dtype kiln__higher_precision(kiln_dtype a, kiln_dtype b);
/* Dims equal (dynamic flags ignored). */
bool kiln__same_dims(const kiln_shape *a, const kiln_shape *b);
/* XLA's Compatible: same structure, types and dims; layouts and dynamic
 * flags ignored; with ignore_fp, any two float types match. */
bool kiln__compatible(const kiln_shape *a, const kiln_shape *b, bool ignore_fp);
bool kiln__is_dyn(const kiln_shape *s, uint32_t i);
/* A new array shape in cx->out; dyn may be NULL. */
int kiln__make_array(kiln__ictx *cx, kiln_shape *out, kiln_dtype t, const int64_t *dims,
                     const uint8_t *dyn, uint32_t rank);
/* Deep copy into cx->out without layouts. */
int kiln__copy(kiln__ictx *cx, kiln_shape *out, const kiln_shape *src);
int kiln__make_tuple(kiln__ictx *cx, kiln_shape *out, const kiln_shape *const *elems, uint32_t n);
/* Structural sanity of a shape that may come from hostile input: valid
 * dtype, dims present and >= 0, tuples present, nesting bounded. */
bool kiln__shape_sane(const kiln_shape *s, int depth);

/* ---- per-op families ---- */
int kiln__infer_elementwise(kiln__ictx *cx, kiln_shape *out);   /* infer.c */
int kiln__infer_data_movement(kiln__ictx *cx, kiln_shape *out); /* infer_shape_ops.c */
int kiln__infer_compute(kiln__ictx *cx, kiln_shape *out);       /* infer_compute.c */
int kiln__infer_control(kiln__ictx *cx, kiln_shape *out);       /* infer_control.c */
int kiln__infer_collective(kiln__ictx *cx, kiln_shape *out);    /* infer_collective.c */
bool kiln__is_collective_op(kiln_opcode op);
/* Tuple `base` extended with the elements of the written shape past its
 * own (the context of async start ops, which XLA leaves free). */
int kiln__with_context(kiln__ictx *cx, kiln_shape *out, const kiln_shape *const *elems, uint32_t n);

#endif /* KILN_COMPILER_IR_INFER_INTERNAL_H */
