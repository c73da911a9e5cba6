/* The CUDA target: the second implementation of the code target
 * interface (target_iface.h). Kernels are CUDA C compiled by NVRTC
 * (nvrtc.c) into one cubin per executable for the target's real
 * architecture; a step launches kiln_kernel_N over a grid whose threads
 * visit the step's range with a grid-stride loop.
 */
#ifndef KILN_COMPILER_CODEGEN_CUDA_TARGET_H
#define KILN_COMPILER_CODEGEN_CUDA_TARGET_H

#include "compiler/codegen/target_iface.h"

extern const kiln__cg_target kiln__cuda_target;

#endif /* KILN_COMPILER_CODEGEN_CUDA_TARGET_H */
