/* The interface between the shared kernel emitter and a code target.
 *
 * Lowering (lower*.c) decides which kernels a module needs; the shared
 * kernel builders (kernel*.c) and the emitter (emit*.c) write their bodies.
 * What differs between targets is kept here, in one table per target: the
 * dialect (how the generated source spells qualifiers, types and
 * intrinsics, and the prelude of helpers every kernel may call) and the
 * kernel wrappers (how the iterations [begin, end) a step hands a kernel
 * are visited: a plain loop on the CPU, a grid-stride loop on CUDA). The
 * shared code reaches a target only through this table and never names
 * one; the C target (c_target.c) is the first implementation.
 *
 * Every prelude implements the helper contract written in emit.h
 * (KILN__PRELUDE_HELPERS) with exactly those semantics, so that generated
 * code computes the same bits on every target.
 */
#ifndef KILN_COMPILER_CODEGEN_TARGET_IFACE_H
#define KILN_COMPILER_CODEGEN_TARGET_IFACE_H

#include <stddef.h>
#include <stdint.h>

#include "common/sbuf.h"
#include "compiler/ir/ir.h"

/* What a target's translation unit is compiled into (compile.c picks the
 * compiler by it; the executable records it, executable.h). */
typedef enum kiln__code_kind {
  KILN__CODE_SO = 0,    /* the system C compiler: an ELF shared object (cc.c) */
  KILN__CODE_CUBIN = 1, /* NVRTC: a cubin for the target's architecture (nvrtc.c) */
} kiln__code_kind;

/* The ctype and stype entries of the real element types, the same spelling
 * in every C-family target (C and CUDA C with <stdint.h>'s names); a
 * target's table starts with them and adds its own (complex on C). */
#define KILN__CG_REAL_TYPES(HALF) \
  [KILN_PRED] = "uint8_t", [KILN_S8] = "int8_t", [KILN_S16] = "int16_t", [KILN_S32] = "int32_t", \
  [KILN_S64] = "int64_t", [KILN_U8] = "uint8_t", [KILN_U16] = "uint16_t", [KILN_U32] = "uint32_t", \
  [KILN_U64] = "uint64_t", [KILN_F16] = HALF, [KILN_BF16] = HALF, [KILN_F32] = "float", \
  [KILN_F64] = "double"
/* Values of f16/bf16 are computed in f32 (each op's result rounded back to
 * the narrow type); elements are their bit patterns. */
#define KILN__CG_REAL_CTYPES KILN__CG_REAL_TYPES("float")
#define KILN__CG_REAL_STYPES KILN__CG_REAL_TYPES("uint16_t")

struct kiln__codegen;     /* kernel.h */
struct kiln__kernel_spec; /* kernel.h */

typedef struct kiln__cg_target {
  /* The backend's name in messages: "the %s backend cannot compile ...". */
  const char *name;
  kiln__code_kind code;

  /* ---- dialect ---------------------------------------------------------- */

  /* Opens every translation unit: defines each helper of
   * KILN__PRELUDE_HELPERS and makes the vocabulary the emitter spells
   * directly available (emit.h, "vocabulary"). */
  const char *prelude;
  /* Written before each helper function the emitter writes (kf<N>,
   * kless<N>), followed by a space: "static inline". */
  const char *helper_qual;
  /* Written before "void kiln_kernel_<N>(void *const *bufs, int64_t begin,
   * int64_t end)": "" for C, e.g. "extern \"C\" __global__ " for CUDA
   * (including its trailing space when not empty). */
  const char *kernel_qual;
  /* Declares a kernel whose loops gain from the widest vectors (a row
   * kernel: its passes over a row are compute-bound) before its definition
   * on the same line: "<kernel_qual>void kiln_kernel_<N>(...)<wide_decl>;".
   * NULL: none. */
  const char *wide_decl;
  /* The pointer qualifier that promises no aliasing: "restrict". */
  const char *restrict_qual;
  /* A function counting the set bits of a uint64_t (returns an int). */
  const char *popcount64;
  /* Per element type the emitter computes on (kiln__emit_dtype_ok): the
   * type values are computed in (ctype; f16/bf16 in float) and the type
   * of a buffer element (stype; f16/bf16 as their 16-bit patterns).
   * Entries for other types are NULL. */
  const char *ctype[KILN_DTYPE_COUNT];
  const char *stype[KILN_DTYPE_COUNT];

  /* ---- kernel wrappers -------------------------------------------------- */

  /* Writes into dst the header of the loop that visits, in `var` (an
   * int64_t), this invocation's share of the kernel's iterations
   * [begin, end), each once; the caller appends the body (" {" or one
   * statement). Every kernel over an index range uses it: elementwise
   * kernels (one iteration per element), row kernels (one per row, the
   * inner loop over the row written by the shared code), reductions into
   * their output (the range visited once per reduced position: an
   * invocation must see the same share of iterations each time) and sort
   * (one per row). */
  void (*range_loop)(char *dst, size_t size, const char *var);
  /* Writes into dst the first statement of a kernel that is one
   * sequential iteration (scatter, select-and-scatter): it returns from
   * every invocation but the single one that runs iteration 0 of
   * [begin, end). */
  void (*single)(char *dst, size_t size);

  /* ---- cooperative kernels (NULL: none) --------------------------------- */

  /* Writes the body of loop kernel k in a form of the target's own, where
   * its threads work together on one iteration (a reduce over many
   * elements: a block per output element, cuda_reduce.c), and sets *range:
   * 0; 1 when it has no such form for k (nothing written: the shared forms
   * follow); or a negative error. */
  int (*coop_kernel)(struct kiln__codegen *g, const struct kiln__kernel_spec *k,
                     struct kiln_sbuf *out, uint64_t *range);
} kiln__cg_target;

/* The code generator for targets of backend `backend` ("cpu": the C
 * target), or NULL when this compiler has none for it. The one place that
 * ties a backend's targets (compiler/target.h) to their emitter
 * (codegen/targets.c). */
const kiln__cg_target *kiln__cg_target_for(const char *backend);

#endif /* KILN_COMPILER_CODEGEN_TARGET_IFACE_H */
