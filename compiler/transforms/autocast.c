/* autocast: mixed precision as a transform (jax's bf16 policy, torch's
 * autocast).
 *
 * The rewrite is narrow on purpose. Every dot and convolution whose two
 * operands are f32 arrays, in the ENTRY and in every computation it reaches
 * (loop bodies, branches, calls), gets its operands converted to the narrow
 * type (bf16 or f16) while its written result stays f32: in HLO that is
 * preferred_element_type=f32, so the products are exact in f32 and the
 * accumulation is f32, as on a tensor core. Nothing else changes, so
 * reductions, softmax, norms, exp/log and the loss keep computing in f32;
 * the error of the result is the rounding of the matmul inputs, which is
 * what "within bf16 tolerance of the f32 program" measures.
 *
 * Computations are rewritten in place (the transform owns the module); the
 * converts are placed right before the op that uses them, which keeps each
 * computation's instruction list in operand order. Dynamic loss scaling for
 * f16 belongs to the grad that follows (transform.c): the cotangent seed is
 * where the scale goes in.
 */
#include <string.h>

#include "common/arena.h"
#include "compiler/transforms/rules.h"
#include "compiler/transforms/transform.h"

static bool is_f32_array(const kiln_shape *s) {
  return kiln_shape_is_array(s) && s->dtype == KILN_F32;
}

static bool takes_cast(const kiln_module *m, const kiln_instr *ins) {
  if (ins->op != KILN_OP_DOT && ins->op != KILN_OP_CONVOLUTION) return false;
  if (ins->noperands != 2 || !is_f32_array(&ins->shape)) return false;
  for (uint32_t k = 0; k < 2; k++)
    if (!is_f32_array(&kiln_module_instr(m, ins->operands[k])->shape)) return false;
  return true;
}

/* Rewrites the dots and convolutions of computation c; *changed counts them. */
static int cast_comp(kiln__tx *tx, uint32_t c, kiln_dtype to, uint32_t *changed) {
  kiln_module *m = tx->m;
  kiln_computation *comp = m->comps[c];
  uint32_t n0 = comp->ninstrs;
  /* the converts made for instruction i are at [start[i], end[i]) of the
   * list (appended by the builder) until the list is put in order */
  uint32_t *start = kiln_arena_calloc(tx->scratch, n0 + 1, sizeof *start);
  uint32_t *end = kiln_arena_calloc(tx->scratch, n0 + 1, sizeof *end);
  if (start == NULL || end == NULL) return kiln__tx_oom(tx);
  kiln__b b = {tx, c};
  for (uint32_t i = 0; i < n0; i++) {
    kiln_instr *ins = m->instrs[m->comps[c]->instrs[i]];
    if (!takes_cast(m, ins)) continue;
    start[i] = m->comps[c]->ninstrs;
    kiln_id ops[2];
    for (uint32_t k = 0; k < 2; k++) ops[k] = kiln__b_convert(&b, ins->operands[k], to);
    if (tx->err) return tx->err;
    end[i] = m->comps[c]->ninstrs;
    if (kiln_instr_set_operands(m, ins, ops, 2)) return kiln__tx_oom(tx);
    (*changed)++;
  }
  comp = m->comps[c];
  uint32_t n = comp->ninstrs;
  if (n == n0) return 0;
  kiln_id *order = kiln_arena_calloc(tx->scratch, n, sizeof *order);
  if (order == NULL) return kiln__tx_oom(tx);
  uint32_t k = 0;
  for (uint32_t i = 0; i < n0; i++) {
    for (uint32_t j = start[i]; j < end[i]; j++) order[k++] = comp->instrs[j];
    order[k++] = comp->instrs[i];
  }
  if (k != n)
    return kiln__tx_fail(tx, KILN_EINTERNAL, NULL, "autocast: %s: %u instructions placed of %u",
                         comp->name, k, n);
  memcpy(comp->instrs, order, n * sizeof *order);
  return 0;
}

/* Marks c and everything it calls. */
static void reach(const kiln_module *m, uint32_t c, uint8_t *seen) {
  if (c >= m->ncomps || seen[c]) return;
  seen[c] = 1;
  const kiln_computation *comp = m->comps[c];
  for (uint32_t i = 0; i < comp->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[comp->instrs[i]];
    for (uint32_t j = 0; j < ins->ncalled; j++) reach(m, ins->called[j], seen);
  }
}

int kiln__tf_apply_autocast(kiln__tx *tx, const kiln_transform *t, uint32_t *out) {
  kiln_module *m = tx->m;
  if (t->cast_to != KILN_BF16 && t->cast_to != KILN_F16)
    return kiln__tx_fail(tx, KILN_EINVAL, NULL, "autocast: type %s is not bf16 or f16",
                         kiln_dtype_name(t->cast_to));
  if (kiln_module_entry(m) == NULL)
    return kiln__tx_fail(tx, KILN_EINVAL, NULL, "autocast: the module has no ENTRY computation");
  uint8_t *seen = kiln_arena_calloc(tx->scratch, m->ncomps + 1, 1);
  if (seen == NULL) return kiln__tx_oom(tx);
  uint32_t ncomps = m->ncomps, changed = 0;
  reach(m, m->entry, seen);
  for (uint32_t c = 0; c < ncomps; c++)
    if (seen[c] && cast_comp(tx, c, t->cast_to, &changed)) return tx->err;
  *out = m->entry;
  return 0;
}
