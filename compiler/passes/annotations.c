/* Annotation removal: drops the custom calls that only annotate their
 * operand (with_sharding_constraint's "Sharding", Shardy's xla.sdy.*
 * markers, host-offloading moves; the list is sharding.h's) when their
 * result has the operand's shape, so that code generation never sees them.
 *
 * It runs before fusion and at every optimization level: correctness needs
 * it (the backends have no kernel for an annotation), and Shardy marks
 * FuncResultSharding as having a side effect, which DCE would keep. An
 * annotation that changes the shape (a manual region over several devices)
 * is left alone, for the backend to refuse by name. The shardings these
 * calls carry are for the partitioner, which reads them before this pass.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/sharding.h"
#include "compiler/passes/passes.h"

static bool removable(const kiln_module *m, const kiln_instr *ins) {
  if (ins->op != KILN_OP_CUSTOM_CALL || ins->noperands != 1) return false;
  if (!kiln_custom_call_is_annotation(kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET)))
    return false;
  const kiln_shape *a = &ins->shape, *b = &m->instrs[ins->operands[0]]->shape;
  if (!kiln_shape_is_array(a) || !kiln_shape_is_array(b) || a->dtype != b->dtype ||
      a->rank != b->rank)
    return false;
  for (uint32_t d = 0; d < a->rank; d++)
    if (a->dims[d] != b->dims[d]) return false;
  return true;
}

int kiln_pass_annotations(kiln_module *m, const kiln_pass_ctx *ctx) {
  bool *keep = kiln_malloc((m->ninstrs ? m->ninstrs : 1) * sizeof *keep);
  if (keep == NULL) return kiln_status_set(ctx->st, KILN_ENOMEM, "annotations", "out of memory");
  for (uint32_t i = 0; i < m->ninstrs; i++) keep[i] = true;
  for (uint32_t c = 0; c < m->ncomps; c++) {
    kiln_computation *comp = m->comps[c];
    bool any = false;
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      kiln_instr *ins = m->instrs[comp->instrs[i]];
      if (!removable(m, ins)) continue;
      kiln_replace_all_uses(m, c, ins->id, ins->operands[0]);
      keep[ins->id] = false;
      any = true;
    }
    if (any) kiln_computation_compact(m, c, keep);
  }
  kiln_free(keep);
  return 0;
}
