/* kiln dot FILE [--after PASS] [-o OUT] [--opt-level N] [--target T]
 * [--disable-pass NAME]...: the module as a Graphviz graph, after the
 * compiler's pass pipeline has run up to PASS.
 *
 * The pipeline runs exactly as kiln_compile runs it (same opt level,
 * target and switched-off passes), verifying after every pass, and stops
 * after PASS; `--after input` draws the module as written and no --after
 * draws it after the whole pipeline. Naming a pass that the options keep
 * from running is allowed: the graph is then the one that pass would have
 * received, which is what a reader comparing dumps expects.
 */
#include <stdio.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "clients/cli/fileio.h"
#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/compile.h"
#include "compiler/pass.h"
#include "compiler/target.h"

int kiln__cmd_dot(const kiln__args *a) {
  const char *file = a->pos[0];
  kiln_compile_options co;
  bool given;
  int rc = kiln__compile_options_parse(a, &co, &given);
  if (rc) return rc;
  const char *after = kiln__args_get(a, "after");
  bool input_only = after && strcmp(after, "input") == 0;
  if (after && !input_only && kiln_pipeline_find(after) == NULL) {
    kiln_sbuf names = KILN_SBUF_INIT;
    uint32_t n;
    const kiln_pass *p = kiln_pipeline_passes(&n);
    for (uint32_t i = 0; i < n; i++) kiln_sbuf_printf(&names, ", %s", p[i].name);
    fprintf(stderr, "kiln dot: unknown pass '%s' (input%s)\n", after, kiln_sbuf_str(&names));
    kiln_sbuf_free(&names);
    return KILN_EXIT_USAGE;
  }
  kiln_module *m;
  if ((rc = kiln__module_load(file, true, &m))) return rc;
  kiln_status st;
  kiln_status_clear(&st);
  if (!input_only) {
    kiln_pipeline_options po = {0};
    kiln_target_resolve("cpu", co.target, &po.target, NULL); /* checked by copts.c */
    po.opt_level = co.opt_level;
    po.verify_each = true;
    po.dump_dir = co.dump_dir;
    po.stop_after = after;
    po.disabled = co.disabled;
    po.ndisabled = co.ndisabled;
    po.memory_budget = co.memory_budget;
    if (kiln_pipeline_run(m, &po, NULL, NULL, &st)) {
      kiln__report(file, m, &st);
      rc = kiln__exit_code(st.code);
      goto out_free_module;
    }
  }
  size_t len;
  char *dot = kiln_module_to_dot(m, &len);
  if (dot == NULL) {
    fprintf(stderr, "kiln dot: error: out of memory\n");
    rc = KILN_EXIT_INTERNAL;
    goto out_free_module;
  }
  const char *out = kiln__args_get(a, "output");
  if (out) {
    if (kiln__file_write(out, dot, len, &st)) {
      kiln__report(out, NULL, &st);
      rc = kiln__exit_code(st.code);
    }
  } else {
    fwrite(dot, 1, len, stdout);
  }
  kiln_free(dot);
out_free_module:
  kiln_module_destroy(m);
  return rc;
}
