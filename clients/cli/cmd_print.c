/* kiln print [--proto] [-o OUT] FILE: the module in canonical form.
 *
 * Printing does not verify, so that a module the verifier rejects can still
 * be looked at; only a file that does not parse fails. */
#include <stdio.h>
#include <unistd.h>

#include "clients/cli/cli.h"
#include "clients/cli/fileio.h"
#include "common/alloc.h"
#include "compiler/ir/proto_codec.h"
#include "compiler/ir/text.h"

int kiln__cmd_print(const kiln__args *a) {
  const char *out_path = kiln__args_get(a, "output");
  bool proto = kiln__args_get(a, "proto") != NULL;
  if (proto && out_path == NULL && isatty(STDOUT_FILENO)) {
    fprintf(stderr, "kiln print: --proto writes binary data; give -o OUT or redirect "
                    "standard output\n");
    return KILN_EXIT_USAGE;
  }
  kiln_module *m;
  int rc = kiln__module_load(a->pos[0], false, &m);
  if (rc) return rc;

  kiln_status st;
  kiln_status_clear(&st);
  uint8_t *data = NULL;
  size_t len = 0;
  if (proto) {
    rc = kiln_module_to_proto(m, &data, &len, &st);
  } else {
    data = (uint8_t *)kiln_module_print(m, &len);
    if (data == NULL) rc = kiln_status_set(&st, KILN_ENOMEM, NULL, "out of memory printing");
  }
  if (rc) {
    kiln__report(a->pos[0], m, &st);
    rc = kiln__exit_code(rc);
    goto out_free_module;
  }
  if (out_path) {
    if (kiln__file_write(out_path, data, len, &st)) {
      kiln__report(out_path, NULL, &st);
      rc = KILN_EXIT_INVALID;
    }
  } else if (len && fwrite(data, 1, len, stdout) != len) {
    rc = KILN_EXIT_INVALID; /* main reports the write error */
  }
  kiln_free(data);
out_free_module:
  kiln_module_destroy(m);
  return rc;
}
