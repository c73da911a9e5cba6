/* Deterministic arguments for a module's ENTRY parameters, for tests that
 * run generated or corpus modules on several backends with the same inputs.
 */
#ifndef KILN_TESTS_SUPPORT_TESTARGS_H
#define KILN_TESTS_SUPPORT_TESTARGS_H

#include <stdint.h>

#include "compiler/ir/ir.h"

/* One heap literal per parameter of m's ENTRY: floats in [-1, 1) on a grid
 * exact in the element type (so every backend sees the same values), signed
 * ints in [-8, 8), unsigned in [0, 16), fair-coin preds; tuples
 * recursively. *args is kiln_malloc'd; free with kiln_test_args_free. */
int kiln_test_args_random(const kiln_module *m, uint64_t seed, kiln_literal ***args,
                          uint32_t *nargs, kiln_status *st);
void kiln_test_args_free(kiln_literal **args, uint32_t nargs);

#endif /* KILN_TESTS_SUPPORT_TESTARGS_H */
