/* Lowering a scheduled, buffer-assigned module to step programs and
 * kernels (internal to the compiler). */
#ifndef KILN_COMPILER_CODEGEN_LOWER_H
#define KILN_COMPILER_CODEGEN_LOWER_H

#include <stdint.h>

#include "compiler/buffer_assign.h"
#include "compiler/codegen/executable.h"
#include "compiler/codegen/kernel.h"

/* Gives every computation that runs as a step program (while condition
 * and body, branches, called computations) a single caller, cloning where
 * one is run from several places, and sizes the scratch memory each
 * instruction's lowering needs (*scratch: per instruction id, kiln_malloc'd). */
int kiln__lower_prepare(kiln_module *m, uint64_t **scratch, kiln_status *st);

/* Writes the kernels into g (in g's target's dialect) and fills e's
 * signature, bindings, slots, constants and programs (everything but the
 * header and the code). */
int kiln__lower(const kiln_module *m, const kiln_buffer_assignment *ba, kiln__codegen *g,
                kiln_executable *e, kiln_status *st);

#endif /* KILN_COMPILER_CODEGEN_LOWER_H */
