/* The kernel emitter: source for "the value of instruction X at element
 * index I", shared by every code target (target_iface.h): the C target
 * wraps it in loops over an index range, a CUDA target in grid-stride
 * loops.
 *
 * An index is a vector of C expressions, one per logical dim (variables or
 * integer literals the emitter made up), plus optionally the name of the
 * physical linear offset it denotes in buffers of one layout, so that
 * elementwise chains over equal layouts read b[i] directly and vectorize.
 * A value is a list of C variables (one per leaf; tuples have several),
 * memoized per (instruction, index) within the scope that computed it.
 * Values that come from outside the kernel (fusion parameters, operands of
 * a lone instruction, constants) are inputs: a buffer argument with its
 * physical shape, or a C variable (the parameters of a scalar function).
 *
 * Arithmetic follows XLA and the reference interpreter exactly: f16/bf16
 * are computed in double and rounded to nearest even after every op, f32
 * transcendentals are computed in double and rounded once, integers wrap,
 * and division, remainder, shifts, conversions, min/max and comparisons use
 * XLA's edge semantics (the prelude's helpers).
 *
 * Identifiers in the generated code are the emitter's own (v12, x3, b0,
 * kf2); no name or string from the module ever reaches the source.
 */
#ifndef KILN_COMPILER_CODEGEN_EMIT_H
#define KILN_COMPILER_CODEGEN_EMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sbuf.h"
#include "compiler/codegen/target_iface.h"
#include "compiler/ir/ir.h"

#define KILN__EMIT_MAXR 32 /* largest rank code generation handles */
#define KILN__IX_LEN 48    /* longest index component expression */
#define KILN__NO_INPUT UINT32_MAX

/* Module-wide state: helper functions written so far (reducers,
 * comparators, map functions), shared by every kernel of the module. */
typedef struct kiln__emit_mod {
  const kiln_module *m;
  const kiln__cg_target *target; /* the dialect everything is written in */
  kiln_sbuf funcs;               /* file-scope helper functions */
  int32_t *comp_fn;              /* per computation: its helper function's number, or -1 */
  uint8_t *fn_tuple;             /* per helper function: returns through pointers (tuple root) */
  uint32_t nfns;
  size_t fncap;
  kiln_status *st;
} kiln__emit_mod;

typedef struct kiln__emit_input {
  uint32_t arg;            /* buffer argument number, or KILN__NO_INPUT */
  const kiln_shape *shape; /* the buffer's array shape (layout) */
  char var[16];            /* or a C variable holding the (scalar) value */
} kiln__emit_input;

typedef struct kiln__ix {
  uint32_t id; /* memo key; 0 for every rank-0 index */
  uint32_t rank;
  char (*c)[KILN__IX_LEN]; /* per logical dim */
  const char *lin;         /* physical offset in lin_shape's layout, or NULL */
  const kiln_shape *lin_shape;
  bool root; /* the kernel's own output index */
} kiln__ix;

typedef struct kiln__memo {
  kiln_id id;
  uint32_t ix;
  uint32_t n;
  uint32_t *vars;
} kiln__memo;

/* One function being written (a kernel body or a scalar helper). */
typedef struct kiln__emit_fn {
  kiln__emit_mod *mod;
  kiln_sbuf *out;
  int indent;
  uint32_t nvars, nix;
  uint32_t *in_first; /* per instruction id: first input leaf, or KILN__NO_INPUT */
  kiln__emit_input *in;
  uint32_t nin;
  size_t incap;
  kiln__memo *memo;
  uint32_t nmemo;
  size_t memocap;
  bool used_root;    /* a component of the root index was read */
  kiln_arena *arena; /* index vectors, value lists; freed with the function */
  int rc;
} kiln__emit_fn;

/* ---- setup (emit.c) ----------------------------------------------------- */

int kiln__emit_mod_init(kiln__emit_mod *mod, const kiln_module *m, const kiln__cg_target *target,
                        kiln_status *st);
void kiln__emit_mod_free(kiln__emit_mod *mod);
int kiln__emit_fn_init(kiln__emit_fn *f, kiln__emit_mod *mod, kiln_sbuf *out, int indent);
void kiln__emit_fn_free(kiln__emit_fn *f);
/* Reads instruction id's leaves from buffers (args[k] for leaf k) or from C
 * variables (vars[k]); one of the two is NULL. */
int kiln__emit_bind(kiln__emit_fn *f, kiln_id id, const uint32_t *args,
                    const kiln_shape *const *shapes, const char *const *vars, uint32_t nleaves);

/* ---- values ------------------------------------------------------------- */

/* The value of instruction id at index x: *vars receives its leaves' C
 * variable numbers (v<N>), *n their count. */
int kiln__emit_value(kiln__emit_fn *f, kiln_id id, const kiln__ix *x, const uint32_t **vars,
                     uint32_t *n);
/* Single-leaf convenience: the variable number of an array value. */
int kiln__emit_value1(kiln__emit_fn *f, kiln_id id, const kiln__ix *x, uint32_t *var);

/* ---- indices ------------------------------------------------------------ */

int kiln__ix_new(kiln__emit_fn *f, uint32_t rank, kiln__ix *x);
/* Component d (marks the root index used). */
const char *kiln__ix_get(kiln__emit_fn *f, const kiln__ix *x, uint32_t d);
void kiln__ix_set(kiln__ix *x, uint32_t d, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A new index variable x<N> = expr; its name is written into dst. */
void kiln__ix_var(kiln__emit_fn *f, char dst[KILN__IX_LEN], const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The physical element offset of index x in a buffer of shape s. */
void kiln__ix_offset(kiln__emit_fn *f, const kiln__ix *x, const kiln_shape *s, char *dst,
                     size_t size);
/* A logical row-major linear index of x within dims (an expression). */
void kiln__ix_linear(kiln__emit_fn *f, const kiln__ix *x, const int64_t *dims, char *dst,
                     size_t size);
/* Splits a linear row-major index expression into components for dims. */
int kiln__ix_split(kiln__emit_fn *f, const char *linear, const int64_t *dims, uint32_t rank,
                   kiln__ix *out);

/* ---- writing ------------------------------------------------------------ */

void kiln__emit_line(kiln__emit_fn *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Opens/closes a C block; values and indices made inside die with it. */
uint32_t kiln__emit_open(kiln__emit_fn *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void kiln__emit_close(kiln__emit_fn *f, uint32_t mark, const char *tail);
uint32_t kiln__emit_newvar(kiln__emit_fn *f);
int kiln__emit_fail(kiln__emit_fn *f, const kiln_instr *ins, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int kiln__emit_memo_put(kiln__emit_fn *f, kiln_id id, const kiln__ix *x, const uint32_t *vars,
                        uint32_t n);

/* ---- types -------------------------------------------------------------- */

/* Whether code generation computes on this element type. */
bool kiln__emit_dtype_ok(kiln_dtype t);
/* The target's spelling of t's compute type ("float"; "double" for
 * f16/bf16) and storage type ("uint16_t" for f16/bf16); that of u8 for a
 * type the emitter does not compute on. */
const char *kiln__ctype(const kiln__emit_mod *mod, kiln_dtype t);
const char *kiln__stype(const kiln__emit_mod *mod, kiln_dtype t);
/* Loads element `off` of buffer b<arg> as a compute value expression. */
void kiln__emit_load_expr(kiln_dtype t, uint32_t arg, const char *off, char *dst, size_t size);
/* Writes `v` (compute value expression) converted to storage form. */
void kiln__emit_store_expr(kiln_dtype t, const char *v, char *dst, size_t size);
/* A scalar literal of type t from the literal's element i. */
void kiln__emit_literal(const kiln__emit_mod *mod, kiln_dtype t, const kiln_literal *lit, int64_t i,
                        char *dst, size_t size);

/* ---- op families -------------------------------------------------------- */

/* emit_elementwise.c: expression of op on operand values a[] of types at[]
 * into result type rt (written as a C expression into dst). */
int kiln__emit_scalar_op(kiln__emit_fn *f, const kiln_instr *ins, kiln_opcode op,
                         const char *const *a, const kiln_dtype *at, uint32_t n, kiln_dtype rt,
                         char *dst, size_t size);
int kiln__emit_convert_expr(kiln__emit_fn *f, const kiln_instr *ins, const char *a, kiln_dtype from,
                            kiln_dtype to, char *dst, size_t size);
int kiln__emit_elementwise(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x,
                           uint32_t *var);
/* emit_shape.c: data movement ops. */
int kiln__emit_movement(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var);
/* For dynamic-update-slice `dus` written in place: the update's value at
 * update index u, and the output index it goes to (starts clamped). */
int kiln__emit_dus_target(kiln__emit_fn *f, const kiln_instr *dus, const kiln__ix *u, uint32_t *var,
                          kiln__ix *target);
/* emit_reduce.c: reduce (variadic), reduce-window, dot, convolution, map. */
int kiln__emit_reduction(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x,
                         const uint32_t **vars, uint32_t *n);
/* Writes (once per computation) a helper function computing scalar
 * computation comp: "<helper_qual> T kf<N>(T p0, ...)" returning the root,
 * or, for a tuple root, "<helper_qual> void kf<N>(T p0, ..., T *restrict
 * r0, ...)". */
int kiln__emit_comp_fn(kiln__emit_mod *mod, uint32_t comp, const kiln_instr *caller, uint32_t *fn);
/* Calls helper fn with argument variables args[0..nargs) and stores its
 * results into variables outs[0..nouts). */
void kiln__emit_call_fn(kiln__emit_fn *f, uint32_t fn, const uint32_t *args, uint32_t nargs,
                        const uint32_t *outs, uint32_t nouts);

#endif /* KILN_COMPILER_CODEGEN_EMIT_H */
