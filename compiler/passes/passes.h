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

#endif /* KILN_COMPILER_PASSES_PASSES_H */
