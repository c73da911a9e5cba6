/* The CUDA target: the second implementation of the code target
 * interface (target_iface.h). Kernels are CUDA C compiled by NVRTC
 * (nvrtc.c) into one cubin per executable for the target's real
 * architecture; a step launches kiln_kernel_N over a grid whose threads
 * visit the step's range with a grid-stride loop, or, for a cooperative
 * kernel (one with shared memory), whose blocks visit it with a
 * block-stride loop, the block's threads working on one iteration.
 */
#ifndef KILN_COMPILER_CODEGEN_CUDA_TARGET_H
#define KILN_COMPILER_CODEGEN_CUDA_TARGET_H

#include "compiler/codegen/target_iface.h"

extern const kiln__cg_target kiln__cuda_target;

/* Reduced positions per output from which a reduce kernel is cooperative
 * (a block per output element: cuda_reduce.c). */
#define KILN__CUDA_COOP_MIN 256

struct kiln__codegen;
struct kiln__kernel_spec;
/* The target's coop_kernel (target_iface.h): cooperative reductions. */
int kiln__cuda_coop_kernel(struct kiln__codegen *g, const struct kiln__kernel_spec *k,
                           struct kiln_sbuf *out, uint64_t *range);

#endif /* KILN_COMPILER_CODEGEN_CUDA_TARGET_H */
