/* The kernels of a cpu executable mapped into the test process, for the
 * fake NVIDIA driver (tests/fake_cuda) to call in place of a cubin's: the
 * cuda and cpu compiles of one program lower to the same steps and kernel
 * numbers when kiln_test_same_program says so, and then the cpu kernels
 * stand in for the device's (test_cuda_fake, test_cuda_nccl).
 */
#ifndef KILN_TESTS_SUPPORT_HOSTKERNELS_H
#define KILN_TESTS_SUPPORT_HOSTKERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/codegen/executable.h"

/* The ABI of a generated kernel (cuda_target.c and c_target.c). */
typedef void (*kiln_test_kernel_fn)(void *const *bufs, int64_t begin, int64_t end);

/* e's kiln_kernel_0 .. N-1, its code mapped as the cpu loader maps it
 * (*dl: dlclose when done); the array is kiln_malloc'd (kiln_free). A
 * failure fails the running Check test. */
kiln_test_kernel_fn *kiln_test_cpu_kernels(const kiln_executable *e, void **dl);

/* Whether a and b have the same programs, steps, slots and kernels. */
bool kiln_test_same_program(const kiln_executable *a, const kiln_executable *b);

#endif /* KILN_TESTS_SUPPORT_HOSTKERNELS_H */
