/* Kernels: the translation unit of one module, for any code target
 * (target_iface.h), built from the kernel emitter's bodies. It holds the
 * target's prelude (element conversions and XLA's edge semantics as
 * helpers, emit.h's contract), the helper functions the emitter asked for,
 * and one exported function per kernel,
 * void kiln_kernel_N(void *const *bufs, int64_t begin, int64_t end),
 * that computes iterations [begin, end) so that a step can be split by
 * range (across threads, or across a grid); the target's wrappers say how
 * an invocation visits its share.
 */
#ifndef KILN_COMPILER_CODEGEN_KERNEL_H
#define KILN_COMPILER_CODEGEN_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#include "compiler/codegen/emit.h"
#include "compiler/codegen/executable.h"

/* An instruction whose leaves are read from kernel arguments. */
typedef struct kiln__kbind {
  kiln_id id;
  uint32_t nleaves;
  const uint32_t *args;            /* per leaf: argument number */
  const kiln_shape *const *shapes; /* per leaf: the buffer's shape (layout) */
} kiln__kbind;

typedef struct kiln__kernel_spec {
  uint32_t nargs;
  const kiln_dtype *arg_dtype; /* element type behind each argument */
  const uint8_t *arg_out;      /* written by the kernel */
  const uint8_t *arg_shared;   /* the same memory as another argument: no restrict */
  const kiln__kbind *binds;
  uint32_t nbinds;
  kiln_id root;   /* the value computed (an array or a tuple) */
  uint32_t nouts; /* leaves of root's value stored, all of one dims */
  const uint32_t *out_leaf;
  const uint32_t *out_arg;
  const kiln_shape *const *out_shape;
} kiln__kernel_spec;

/* Module-wide code generation state: the target (mod.target), the helper
 * functions (mod.funcs) and the kernels written so far. */
typedef struct kiln__codegen {
  kiln__emit_mod mod;
  kiln_sbuf kernels;
  uint32_t nkernels;
  bool wide; /* the next kernel finished is a row kernel (target wide_decl) */
  kiln_status *st;
  /* User kernels (user_kernel.h): the registry calls are looked up in
   * (NULL: none may be called), and those called, one per object, whose
   * objects the link adds (kiln_malloc'd array). */
  const struct kiln_user_kernels *user;
  const struct kiln_user_kernel **used;
  uint32_t nused;
  size_t usedcap;
} kiln__codegen;

/* target must outlive g. */
int kiln__codegen_init(kiln__codegen *g, const kiln_module *m, const kiln__cg_target *target,
                       kiln_status *st);
void kiln__codegen_free(kiln__codegen *g);
/* The whole translation unit; kiln_malloc'd, NUL-terminated. */
char *kiln__codegen_source(kiln__codegen *g, size_t *len);

/* A loop kernel over the elements of the outputs: *range is the number of
 * iterations the step runs (elements, or rows of the innermost dim). */
int kiln__kernel_loop(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t *kernel,
                      uint64_t *range);
/* dynamic-update-slice `dus` (k->root, or the root inside a fused
 * computation) written in place: iterates over the update only; the
 * output argument already holds the operand. */
int kiln__kernel_dus(kiln__codegen *g, const kiln__kernel_spec *k, kiln_id dus, uint32_t *kernel,
                     uint64_t *range);
/* dynamic-slice or in-place dynamic-update-slice k->root (its operands
 * bound, one output; an update's output already holds the operand) as
 * copies of contiguous runs, the start indices clamped once per
 * invocation; *done false (nothing written) where it does not apply:
 * source and destination of different types or layouts, runs under 8. */
int kiln__kernel_window_copy(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t *kernel,
                             uint64_t *range, bool *done);
/* scatter (k->root): one iteration applying every update in order to the
 * output arguments, which already hold the operands. */
int kiln__kernel_scatter(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t *kernel,
                         uint64_t *range);
/* Bytes of int32 scratch a row scatter (kernel_special.c) takes: 0 when
 * scatter s is not one, and kiln__kernel_scatter applies it instead. */
uint64_t kiln__scatter_rows_scratch(const kiln_module *m, const kiln_instr *s);
/* A row scatter (k->root) with that scratch as argument `scratch`: two
 * kernels, kernels[0] (one iteration) sorting the updates by block of rows,
 * kernels[1] (ranges[1] blocks) applying each block's updates in order to
 * the output arguments, which already hold the operands. */
int kiln__kernel_scatter_rows(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t scratch,
                              uint32_t kernels[2], uint64_t ranges[2]);
/* select-and-scatter (k->root): one sequential iteration; the operand,
 * source and init value are bound inputs. */
int kiln__kernel_select_scatter(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t *kernel,
                                uint64_t *range);
/* sort (k->root): one iteration per row; outputs args out_arg[], the
 * inputs bound by binds, and argument `scratch` holding 2 x len int64 per
 * row for the permutation. */
int kiln__kernel_sort(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t scratch,
                      uint32_t *kernel, uint64_t *range);
/* topk (k->root) along the last dim: one iteration per row; binds[0] the
 * operand, outputs 0 (values) and 1 (indices, which also hold the row's
 * heap while it is built). */
int kiln__kernel_topk(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t *kernel,
                      uint64_t *range);

/* A prefix scan (kiln_reduce_window_is_scan) (k->root): one iteration per row along dim, folding
 * the row's elements in order through the reduction as the window would (the same operations in the
 * same order: bit-equal to the general form), in linear instead of quadratic time. binds[0] the
 * input, binds[1] the init. */
int kiln__kernel_scan(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t dim, uint32_t *kernel,
                      uint64_t *range);

/* An integer dot the idot kernel computes: a 32- or 64-bit integer result,
 * integer operands. */
bool kiln__idot_ok(const kiln_module *m, const kiln_instr *d);
/* It (k->root), as planned by kiln__gemm_shape (no swap, not both
 * operands transposed): one iteration per row of the result, accumulating
 * modulo 2^32 or 2^64 as the loop form does (the same bits), either as
 * rows of B scaled by A's elements into C's row or as dots of contiguous
 * rows, so that the compiler vectorizes it. */
int kiln__kernel_idot(kiln__codegen *g, const kiln__kernel_spec *k, const kiln_gemm *gm,
                      uint32_t *kernel, uint64_t *range);

/* Shared by kernel_loop.c and kernel_special.c. */
int kiln__kernel_begin(kiln__codegen *g, const kiln__kernel_spec *k, kiln_sbuf *body,
                       kiln__emit_fn *f, int indent);
void kiln__kernel_finish(kiln__codegen *g, const kiln__kernel_spec *k, const char *body,
                         uint64_t range);
void kiln__kernel_decompose(kiln_sbuf *b, const kiln_shape *s, const char *lin, uint32_t skip_minor,
                            const char *prefix, int indent);

#endif /* KILN_COMPILER_CODEGEN_KERNEL_H */
