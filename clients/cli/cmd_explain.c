/* kiln explain FILE [--target T] [-O N] [--disable-pass NAME]...
 * [--transform SPEC]... [--memory-budget BYTES]: the compiler's fusion
 * decisions with the cost model's numbers, and rematerialization's under a
 * budget (compiler/passes/remat.c).
 *
 * The pass pipeline runs as kiln_compile runs it, with kiln_pass_ctx.explain
 * set: fusion writes, per computation, each group it starts (its kind and
 * the roofline cost of its root alone), each producer it weighs with the
 * fused cost against the cost apart (+ joined, - stayed out, and why),
 * each sibling merge it weighs, and each fusion it writes with its members
 * and cost (compiler/passes/fusion.c, cost.h). A summary of the kernels
 * follows. */
#include <stdio.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "common/sbuf.h"
#include "compiler/compile.h"
#include "compiler/pass.h"
#include "compiler/target.h"
#include "compiler/transforms/transform.h"

static int apply_transforms(const kiln__args *a, const char *file, kiln_module *m) {
  int n;
  const char **specs = kiln__args_all(a, "transform", &n);
  for (int i = 0; i < n; i++) {
    kiln_transform t;
    kiln_status st;
    kiln_status_clear(&st);
    if (kiln_transform_parse(specs[i], &t, &st) || kiln_transforms_apply(m, &t, 1, &st)) {
      fprintf(stderr, "kiln explain: --transform '%s': %s\n", specs[i], st.msg);
      (void)file;
      return KILN_EXIT_USAGE;
    }
  }
  return 0;
}

int kiln__cmd_explain(const kiln__args *a) {
  const char *file = a->pos[0];
  kiln_compile_options co;
  bool given;
  int rc = kiln__compile_options_parse(a, &co, &given);
  if (rc) return rc;
  kiln_module *m;
  if ((rc = kiln__module_load(file, true, &m))) return rc;
  if ((rc = apply_transforms(a, file, m))) goto out;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_sbuf text = KILN_SBUF_INIT;
  kiln_pipeline_options po = {0};
  kiln_target_resolve("cpu", co.target, &po.target, NULL); /* checked by copts.c */
  po.opt_level = co.opt_level;
  po.disabled = co.disabled;
  po.ndisabled = co.ndisabled;
  po.memory_budget = co.memory_budget;
  po.explain = &text;
  if (kiln_pipeline_run(m, &po, NULL, NULL, &st)) {
    /* What the passes decided up to the failure (a budget remat cannot
     * meet: the steps it took) still explains it. */
    if (!kiln_sbuf_failed(&text)) fwrite(kiln_sbuf_str(&text), 1, text.len, stdout);
    kiln__report(file, m, &st);
    rc = kiln__exit_code(st.code);
    kiln_sbuf_free(&text);
    goto out;
  }
  if (kiln_sbuf_failed(&text)) {
    fprintf(stderr, "kiln explain: error: out of memory\n");
    rc = KILN_EXIT_INTERNAL;
  } else {
    if (text.len == 0) printf("fusion did not run (opt level %d or switched off)\n", co.opt_level);
    fwrite(kiln_sbuf_str(&text), 1, text.len, stdout);
    uint32_t fusions = 0, kernels = 0;
    const kiln_computation *e = kiln_module_entry(m);
    for (uint32_t i = 0; e && i < e->ninstrs; i++) {
      const kiln_instr *x = m->instrs[e->instrs[i]];
      fusions += x->op == KILN_OP_FUSION;
      kernels += x->op != KILN_OP_PARAMETER && x->op != KILN_OP_CONSTANT &&
                 x->op != KILN_OP_TUPLE && x->op != KILN_OP_GET_TUPLE_ELEMENT;
    }
    printf("summary: ENTRY %s has %u fusions among %u instructions that run\n", e ? e->name : "?",
           fusions, kernels);
  }
  kiln_sbuf_free(&text);
out:
  kiln_module_destroy(m);
  return rc;
}
