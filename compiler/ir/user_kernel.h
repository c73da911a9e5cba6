/* User kernels in the IR: a custom call whose target names a kernel a
 * client registered with the server (compiler/codegen/user_kernel.h has
 * the registry, the signature and how the kernel is compiled and called).
 *
 *   y = f32[1024] custom-call(a, b), custom_call_target="kiln.user.saxpy"
 *
 * The name after the prefix is client data: 1 to KILN_USER_KERNEL_NAME_MAX
 * characters of [A-Za-z0-9_], starting with a letter. It is looked up in
 * the registry and never written into generated code (the code calls the
 * kernel by a symbol made of its source's digest).
 */
#ifndef KILN_COMPILER_IR_USER_KERNEL_H
#define KILN_COMPILER_IR_USER_KERNEL_H

#include <stdbool.h>

#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_USER_KERNEL_PREFIX "kiln.user."
#define KILN_USER_KERNEL_NAME_MAX 64

/* Whether name is a valid kernel name (the part after the prefix). */
bool kiln_user_kernel_name_ok(const char *name);

/* Whether ins is a custom call of a user kernel (its target starts with
 * the prefix, whatever follows); *name (may be NULL) then points at the
 * part after the prefix, which may still be invalid. */
bool kiln_user_kernel_call(const kiln_instr *ins, const char **name);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_IR_USER_KERNEL_H */
