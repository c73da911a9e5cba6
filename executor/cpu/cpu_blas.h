/* Choosing OpenBLAS's kernels for this CPU before any work starts.
 *
 * OpenBLAS built with DYNAMIC_ARCH picks its kernel set (its "core") once,
 * when the library loads, from the CPU's model number. A library older
 * than the CPU does not know the model and falls back to a generic core:
 * Debian's 0.3.21 on a recent Xeon with AVX-512 runs its Prescott (SSE3)
 * kernels, about five times slower at sgemm than its own SkylakeX kernels
 * on the same machine. OpenBLAS reads OPENBLAS_CORETYPE at load time and
 * never again, and the library is loaded before main() (it is a dependency
 * of the executable, its constructor runs before ours), so the only robust
 * fix inside the process is to set the variable and execute the program
 * again.
 */
#ifndef KILN_EXECUTOR_CPU_CPU_BLAS_H
#define KILN_EXECUTOR_CPU_CPU_BLAS_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The core OpenBLAS runs ("SkylakeX", "Haswell", "Prescott", ...). */
const char *kiln_cpu_blas_core(void);

/* The OpenBLAS core the CPU's features call for, when the loaded core is a
 * weaker one (generic fallback on an unrecognized CPU) and the user did not
 * choose one (OPENBLAS_CORETYPE unset): "SkylakeX" with AVX-512 (F, CD, BW,
 * DQ, VL), "Haswell" with AVX2 and FMA. NULL when nothing is to change. */
const char *kiln_cpu_blas_better_core(void);

/* Call first thing in main(), before any thread of ours starts. Sets
 * OMP_WAIT_POLICY=passive unless set (for oneDNN's OpenMP threads), then, when
 * kiln_cpu_blas_better_core() names a core, sets OPENBLAS_CORETYPE to it
 * and re-executes the program (/proc/self/exe) with the same argv and the
 * environment otherwise unchanged. Returns only when nothing was to change
 * or the re-execution failed (the program then runs on the generic core,
 * correct but slower). Setting OPENBLAS_CORETYPE yourself, to any value,
 * turns this off. */
void kiln_cpu_blas_select_core(char **argv);

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXECUTOR_CPU_CPU_BLAS_H */
