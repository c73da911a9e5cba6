/* Lowering a user kernel call (internal to codegen; user_kernel.c). */
#ifndef KILN_COMPILER_CODEGEN_USER_KERNEL_LOWER_H
#define KILN_COMPILER_CODEGEN_USER_KERNEL_LOWER_H

#include <stdint.h>

#include "compiler/codegen/lower_internal.h"

/* A custom call of kiln.user.NAME (kiln_user_kernel_call): checked against
 * the kernel registered in c->g->user, lowered to a kernel step calling it;
 * the kernel is added to c->g->used for the link. */
int kiln__lower_user_kernel(kiln__lctx *c, uint32_t prog, const kiln_instr *ins);

#endif /* KILN_COMPILER_CODEGEN_USER_KERNEL_LOWER_H */
