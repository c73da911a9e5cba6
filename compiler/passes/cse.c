/* Common subexpression elimination: within each computation, an
 * instruction equal to an earlier one (same opcode, operands, shape with
 * layout, attributes, called computations, constant literal; see equal.h)
 * is replaced by that earlier one and dropped.
 *
 * One walk in order per computation with a hash table of the instructions
 * kept so far. Operands are rewritten to their representatives as the walk
 * reaches each instruction, so chains of equal expressions collapse in the
 * same walk (two equal adds over two equal negates become one). Only pure
 * instructions merge: nothing with a side effect, randomness, communication
 * or token, nothing calling an impure computation, no parameter, and
 * nothing with control predecessors (its ordering is part of its meaning).
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/equal.h"
#include "compiler/passes/passes.h"

static bool mergeable(const kiln_module *m, const kiln_instr *ins, const bool *impure) {
  if (ins->op == KILN_OP_PARAMETER || ins->ncontrol) return false;
  return kiln__instr_is_pure(m, ins, impure);
}

/* Open addressing over instruction ids; KILN_NO_ID marks an empty slot. */
typedef struct table {
  kiln_id *slot;
  uint64_t mask;
} table;

static int cse_computation(kiln_module *m, uint32_t comp, const bool *impure, kiln_id *rep,
                           bool *keep, table *t) {
  kiln_computation *c = m->comps[comp];
  uint64_t cap = 16;
  while (cap < 2ull * c->ninstrs) cap <<= 1;
  if (cap - 1 > t->mask) {
    kiln_free(t->slot);
    t->slot = kiln_malloc(cap * sizeof *t->slot);
    if (t->slot == NULL) return KILN_ENOMEM;
    t->mask = cap - 1;
  }
  memset(t->slot, 0xff, (t->mask + 1) * sizeof *t->slot);
  bool changed = false;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_instr *ins = m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < ins->noperands; k++)
      if (ins->operands[k] < m->ninstrs) ins->operands[k] = rep[ins->operands[k]];
    for (uint32_t k = 0; k < ins->ncontrol; k++)
      if (ins->control_preds[k] < m->ninstrs) ins->control_preds[k] = rep[ins->control_preds[k]];
    if (!mergeable(m, ins, impure)) continue;
    uint64_t h = kiln__instr_hash(ins) & t->mask;
    for (;; h = (h + 1) & t->mask) {
      kiln_id s = t->slot[h];
      if (s == KILN_NO_ID) {
        t->slot[h] = ins->id;
        break;
      }
      if (kiln__instr_equal(m->instrs[s], ins)) {
        rep[ins->id] = s;
        keep[ins->id] = false;
        changed = true;
        break;
      }
    }
  }
  if (c->root < m->ninstrs) c->root = rep[c->root];
  if (changed) kiln_computation_compact(m, comp, keep);
  return 0;
}

int kiln_pass_cse(kiln_module *m, const kiln_pass_ctx *ctx) {
  size_t n = m->ninstrs ? m->ninstrs : 1;
  kiln_id *rep = kiln_malloc(n * sizeof *rep);
  bool *keep = kiln_malloc(n * sizeof *keep);
  bool *impure = kiln__impure_computations(m);
  table t = {NULL, 0};
  int rc = KILN_ENOMEM;
  if (rep == NULL || keep == NULL || impure == NULL) goto out_free;
  for (uint32_t i = 0; i < m->ninstrs; i++) {
    rep[i] = i;
    keep[i] = true;
  }
  t.slot = kiln_malloc(16 * sizeof *t.slot);
  t.mask = 15;
  if (t.slot == NULL) goto out_free;
  for (uint32_t c = 0; c < m->ncomps; c++)
    if ((rc = cse_computation(m, c, impure, rep, keep, &t))) goto out_free;
  rc = 0;
out_free:
  kiln_free(rep);
  kiln_free(keep);
  kiln_free(impure);
  kiln_free(t.slot);
  if (rc) return kiln_status_set(ctx->st, rc, "cse", "out of memory");
  return 0;
}
