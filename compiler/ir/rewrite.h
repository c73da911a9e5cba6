/* Graph rewriting helpers shared by passes and transforms.
 *
 * IR nodes are never freed one by one: "removing" an instruction drops it
 * from its computation's order list; it stays in kiln_module.instrs (with
 * comp set to KILN_NO_ID) until the module dies. Users are not maintained
 * incrementally; a pass that needs them builds a kiln_users index, and
 * rebuilds it after structural changes.
 */
#ifndef KILN_COMPILER_IR_REWRITE_H
#define KILN_COMPILER_IR_REWRITE_H

#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Users of every instruction (operand edges only; an instruction using a
 * value twice is listed twice). */
typedef struct kiln_users kiln_users;

int kiln_users_build(const kiln_module *m, kiln_users **out);
void kiln_users_destroy(kiln_users *u);
const kiln_id *kiln_users_of(const kiln_users *u, kiln_id id, uint32_t *n);

/* Replaces every operand and control edge equal to `from` by `to` in
 * computation `comp`, and the root. */
void kiln_replace_all_uses(kiln_module *m, uint32_t comp, kiln_id from, kiln_id to);

/* Rewrites every operand of computation `comp` through `map` (map[id] is the
 * replacement of instruction id, or id itself; sized m->ninstrs). Root too. */
void kiln_remap_operands(kiln_module *m, uint32_t comp, const kiln_id *map);

/* Drops from `comp`'s order the instructions with keep[id] == false. */
void kiln_computation_compact(kiln_module *m, uint32_t comp, const bool *keep);

/* Re-orders `comp` so that operands and control predecessors come before
 * users, keeping the current order where it already is one (stable). A
 * cycle is KILN_EINVAL naming an instruction on it. */
int kiln_computation_sort(kiln_module *m, uint32_t comp, kiln_status *st);

/* Deep copies of attribute values and whole instructions. */
int kiln_attr_copy(kiln_arena *a, kiln_attr *dst, const kiln_attr *src);
/* Appends to `comp` a copy of `src` (which may belong to another module)
 * with the given operands; called computations and control predecessors
 * are copied as ids unchanged unless `comp_map` is given (then mapped).
 * NULL on out-of-memory. */
kiln_instr *kiln_instr_clone(kiln_module *m, uint32_t comp, const kiln_instr *src,
                             const kiln_id *operands, uint32_t noperands, const uint32_t *comp_map,
                             const char *name);

/* A deep copy of a whole module; identical ids, names and order. */
int kiln_module_clone(const kiln_module *src, kiln_module **out);

/* Copies computation `comp` (and, recursively, nothing else: called
 * computations are shared) under a new name; *out is the new id. */
int kiln_computation_clone(kiln_module *m, uint32_t comp, const char *name, uint32_t *out);

/* Post-order of the computations reachable from the entry (callees before
 * callers); *n receives the count. The array is kiln_malloc'd. */
int kiln_module_post_order(const kiln_module *m, uint32_t **order, uint32_t *n);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_IR_REWRITE_H */
