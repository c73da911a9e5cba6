/* The C target: the first implementation of the code target interface
 * (target_iface.h). Kernels are C11 compiled by the system C compiler
 * (cc.c) into a shared object; a step runs kiln_kernel_N over a range of
 * iterations that the executor may split across threads, so an invocation
 * loops over all of [begin, end) it is given.
 */
#ifndef KILN_COMPILER_CODEGEN_C_TARGET_H
#define KILN_COMPILER_CODEGEN_C_TARGET_H

#include "compiler/codegen/target_iface.h"

extern const kiln__cg_target kiln__c_target;

#endif /* KILN_COMPILER_CODEGEN_C_TARGET_H */
