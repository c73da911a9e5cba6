/* Dead code elimination: drops every instruction of a computation that the
 * root does not reach through operand or control edges, except those with
 * side effects (which must run) and parameters (which define the
 * computation's signature). Computations are never removed, since that would
 * renumber computation ids; one no longer called is simply unreferenced. */
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/passes.h"

static bool must_keep(const kiln_instr *ins) {
  if (ins->op == KILN_OP_PARAMETER) return true;
  if (kiln_opcode_flags(ins->op) & KILN_OPF_SIDE_EFFECT) {
    /* A custom call is only pinned when it says it has a side effect. */
    if (ins->op != KILN_OP_CUSTOM_CALL) return true;
    return kiln_instr_attr_int(ins, KILN_ATTR_CUSTOM_CALL_HAS_SIDE_EFFECT, 0) != 0;
  }
  return false;
}

int kiln_pass_dce(kiln_module *m, const kiln_pass_ctx *ctx) {
  bool *live = kiln_calloc(m->ninstrs ? m->ninstrs : 1, sizeof *live);
  kiln_id *work = kiln_malloc((m->ninstrs ? m->ninstrs : 1) * sizeof *work);
  if (live == NULL || work == NULL) {
    kiln_free(live);
    kiln_free(work);
    return kiln_status_set(ctx->st, KILN_ENOMEM, "dce", "out of memory");
  }
  for (uint32_t c = 0; c < m->ncomps; c++) {
    kiln_computation *comp = m->comps[c];
    uint32_t top = 0;
    kiln_instr *root = kiln_computation_root(m, comp);
    if (root == NULL) continue;
    comp->root = root->id;
    live[root->id] = true;
    work[top++] = root->id;
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      kiln_instr *ins = m->instrs[comp->instrs[i]];
      if (must_keep(ins) && !live[ins->id]) {
        live[ins->id] = true;
        work[top++] = ins->id;
      }
    }
    while (top) {
      const kiln_instr *ins = m->instrs[work[--top]];
      for (uint32_t k = 0; k < ins->noperands + ins->ncontrol; k++) {
        kiln_id d = k < ins->noperands ? ins->operands[k] : ins->control_preds[k - ins->noperands];
        if (d < m->ninstrs && !live[d]) {
          live[d] = true;
          work[top++] = d;
        }
      }
    }
    kiln_computation_compact(m, c, live);
  }
  kiln_free(live);
  kiln_free(work);
  return 0;
}
