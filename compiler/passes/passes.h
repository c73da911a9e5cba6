/* Entry points of the passes, one per file in this folder. */
#ifndef KILN_COMPILER_PASSES_PASSES_H
#define KILN_COMPILER_PASSES_PASSES_H

#include "compiler/pass.h"

int kiln_pass_unroll(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_inline(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_annotations(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_dce(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_algsimp(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_constfold(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_cse(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_while_licm(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_dot_canon(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_fusion(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_layout(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_schedule(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_remat(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_scan_dots(kiln_module *m, const kiln_pass_ctx *ctx);
int kiln_pass_scatter_merge(kiln_module *m, const kiln_pass_ctx *ctx);

/* For passes that inline one call where it pays (inline.c): whether `call`
 * of computation comp can be copied in place (one callee, no control
 * edges), and the copy itself. The call's users read the copied root; the
 * call leaves comp's order, which is sorted again. */
struct kiln__tx;
bool kiln__inline_can(const kiln_module *m, uint32_t comp, const kiln_instr *call);
int kiln__inline_call(struct kiln__tx *tx, uint32_t comp, kiln_id call);

#endif /* KILN_COMPILER_PASSES_PASSES_H */
