/* Entry points of the passes, one per file in this folder. */
#ifndef KILN_COMPILER_PASSES_PASSES_H
#define KILN_COMPILER_PASSES_PASSES_H

#include "compiler/pass.h"

int kiln_pass_dce(kiln_module *m, const kiln_pass_ctx *ctx);

#endif /* KILN_COMPILER_PASSES_PASSES_H */
