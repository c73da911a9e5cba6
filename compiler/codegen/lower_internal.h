/* Internals shared by lower.c (programs, control flow, the executable's
 * tables) and lower_kernels.c (kernel steps: loops, GEMM, in-place
 * updates, scatter, sort). */
#ifndef KILN_COMPILER_CODEGEN_LOWER_INTERNAL_H
#define KILN_COMPILER_CODEGEN_LOWER_INTERNAL_H

#include "compiler/codegen/lower.h"

typedef struct kiln__prog {
  kiln_step *steps;
  size_t n, cap;
  kiln_id *origin; /* per step: the instruction lowered into it (KILN_NO_ID: none) */
  size_t ocap;
} kiln__prog;

typedef struct kiln__lctx {
  const kiln_module *m;
  const kiln_buffer_assignment *ba;
  kiln__codegen *g;
  kiln_executable *e;
  kiln_status *st;
  kiln__prog *progs;
  size_t nprogs, progcap;
  kiln_slot *slots; /* ba's slots, then constants found inside fusions */
  size_t nslots, slotcap;
  uint8_t *consts; /* the constants blob */
  size_t nconsts, constcap;
  uint32_t *const_slot; /* per instruction id: slot of a fused array constant */
  kiln_arena *scratch;  /* kernel specs; freed at the end */
} kiln__lctx;

/* lower.c */
int kiln__lower_step(kiln__lctx *c, uint32_t prog, const kiln_step *s);
int kiln__lower_copy(kiln__lctx *c, uint32_t prog, uint32_t dst, uint32_t src, uint64_t bytes);
uint32_t kiln__lower_leaf_shapes(const kiln_shape *s, const kiln_shape **out, uint32_t cap);
/* A constant slot for a constant instruction that lives inside a fusion. */
int kiln__lower_const_slot(kiln__lctx *c, const kiln_instr *k, uint32_t **slots);
int kiln__lower_fail(kiln__lctx *c, const kiln_instr *ins, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* lower_kernels.c: the steps of one instruction that is not control flow
 * or pure aliasing. */
int kiln__lower_compute(kiln__lctx *c, uint32_t prog, const kiln_instr *ins);
/* Whether dot `d` (whose operands are read from buffers) maps onto one
 * GEMM step; fills g and *swap (operands exchanged for a column-major
 * result). */
bool kiln__gemm_plan(const kiln_module *m, const kiln_instr *d, kiln_gemm *g, bool *swap);
/* The (batched) matrix product kiln__gemm_plan describes, for any element
 * type (the integer dot kernel's plan). */
bool kiln__gemm_shape(const kiln_module *m, const kiln_instr *d, kiln_gemm *g, bool *swap);
/* The integer GEMM (kiln_gemm dtype S8 or U8: A's type, B s8, C s32) of a
 * dot of an s8 or u8 lhs and an s8 rhs into s32; false for other dots. */
bool kiln__igemm_plan(const kiln_module *m, const kiln_instr *d, kiln_gemm *g, bool *swap);
/* conv_step.c: whether convolution `ins` becomes one CONV step (f32, at
 * most 3 spatial dims, no window reversal); fills c. */
bool kiln__conv_plan(const kiln_module *m, const kiln_instr *ins, kiln_conv *c);
/* fft_step.c: fills *f for fft `ins`; NULL, or why it cannot be a step. */
const char *kiln__fft_plan(const kiln_module *m, const kiln_instr *ins, kiln_fft *f);
/* linalg_step.c: fills *g for a LAPACK call, cholesky or triangular-solve
 * `ins`; NULL, or why it cannot be a step (written into why[]). */
const char *kiln__linalg_plan(const kiln_module *m, const kiln_instr *ins, kiln_linalg *g,
                              char *why, size_t nwhy);
/* The dot inside fusion f that becomes a GEMM step followed by an
 * epilogue, or NULL. */
const kiln_instr *kiln__fusion_gemm_dot(const kiln_module *m, const kiln_instr *f);

/* lower_collective.c: whether ins becomes collective steps (or -done
 * copies) on this module's mesh, and those steps. */
bool kiln__lower_is_collective(const kiln_module *m, const kiln_instr *ins);
int kiln__lower_collective(kiln__lctx *c, uint32_t prog, const kiln_instr *ins);

#endif /* KILN_COMPILER_CODEGEN_LOWER_INTERNAL_H */
