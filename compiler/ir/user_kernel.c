/* User kernel calls in the IR: the target's prefix and the name rule
 * (user_kernel.h). Everything else about them lives in codegen. */
#include "compiler/ir/user_kernel.h"

#include <string.h>

bool kiln_user_kernel_name_ok(const char *name) {
  if (name == NULL) return false;
  size_t n = strlen(name);
  if (n == 0 || n > KILN_USER_KERNEL_NAME_MAX) return false;
  if (!((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= 'A' && name[0] <= 'Z'))) return false;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

bool kiln_user_kernel_call(const kiln_instr *ins, const char **name) {
  if (ins == NULL || ins->op != KILN_OP_CUSTOM_CALL) return false;
  const char *t = kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET);
  size_t np = sizeof KILN_USER_KERNEL_PREFIX - 1;
  if (t == NULL || strncmp(t, KILN_USER_KERNEL_PREFIX, np) != 0) return false;
  if (name) *name = t + np;
  return true;
}
