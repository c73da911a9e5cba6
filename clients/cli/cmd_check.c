/* kiln check FILE...: parse and verify each file, report every invalid one.
 *
 * All files are checked even after a failure, so one run lists every broken
 * module; the exit code is the worst seen (internal beats invalid). */
#include "clients/cli/cli.h"
#include "compiler/ir/ir.h"

int kiln__cmd_check(const kiln__args *a) {
  int worst = KILN_EXIT_OK;
  for (int i = 0; i < a->npos; i++) {
    kiln_module *m;
    int rc = kiln__module_load(a->pos[i], true, &m);
    if (rc == KILN_EXIT_OK) kiln_module_destroy(m);
    if (rc > worst) worst = rc;
  }
  return worst;
}
