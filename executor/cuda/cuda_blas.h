/* GEMM steps on the cuda backend through cuBLASLt, loaded lazily like the
 * driver: dlopen("libcublasLt.so.<major of the toolkit's cuBLAS>") (env
 * KILN_CUBLASLT_LIB names another file: the tests' fake) at the first load
 * of an executable with a GEMM step, its entry points taken once into a
 * table. No library is a status at that load naming the file, and only
 * programs with GEMM steps are refused.
 *
 * A step (executable.h's kiln_gemm: row-major views of A, B and C, their
 * leading dimensions, transposes, batch strides, alpha and beta) is
 * planned once, at load: a matmul descriptor with the compute type of the
 * precision policy, three matrix layouts (cuBLASLt is column-major, so a
 * row-major C = op(A) op(B) is planned as its transpose C^T = op(B)^T
 * op(A)^T: the operands exchanged, each row-major view read as the
 * column-major matrix of its transpose), strided batches, a preference
 * bounded by the device's workspace and the operands' alignment, and the
 * heuristic's first algorithm. A run is then one cublasLtMatmul on the
 * compute stream.
 *
 * Internal to executor/cuda/: includes the toolkit's cuda.h.
 */
#ifndef KILN_EXECUTOR_CUDA_CUDA_BLAS_H
#define KILN_EXECUTOR_CUDA_CUDA_BLAS_H

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "compiler/codegen/executable.h"

/* The workspace a device lends its GEMMs, in bytes: what cuBLASLt asks
 * for its fastest Hopper kernels; 4 MiB before sm_90. */
#define KILN__CUBLAS_WORKSPACE_SM90 ((uint64_t)32 << 20)
#define KILN__CUBLAS_WORKSPACE ((uint64_t)4 << 20)

/* One device's cuBLASLt handle, created in its context (current). */
typedef struct kiln__cublas kiln__cublas;

/* A planned GEMM step: its descriptors and algorithm. */
typedef struct kiln__cublas_plan kiln__cublas_plan;

/* The compute type for a GEMM step, the precision policy (names cuBLAS's
 * cublasComputeType_t numbers, so that it is tested without the library):
 * f64 computes in f64; a bf16 step (A and B bf16, C f32) in f32 with
 * exact products; f32 in pure f32 unless tf32 is true, when TF32 tensor
 * cores may round the operands to 10 mantissa bits (what XLA on a GPU does
 * for a DEFAULT-precision f32 dot; the executable does not say a dot's
 * precision, so tf32 is the backend's setting, not the step's). false for
 * any other element type (integer GEMMs do not run on cuda). */
bool kiln__cublas_compute_type(kiln_dtype dtype, bool tf32, int *compute, int *scale, int *ab,
                               int *c);

/* Whether the environment allows TF32 for f32 GEMMs: KILN_CUDA_TF32=1 (the
 * default is off: pure f32, as precise as any precision a dot can ask). */
bool kiln__cublas_tf32_from_env(void);

/* Opens the library (once per process) and creates a handle in the
 * current context, for device `where` (named in messages). No
 * library or a handle that fails is a status naming it (KILN_EUNAVAIL,
 * or the cuBLAS status's code). */
int kiln__cublas_create(const char *where, kiln__cublas **out, kiln_status *st);
void kiln__cublas_destroy(kiln__cublas *h); /* context current; NULL: nothing */

/* Plans step g (checked by the caller: dims, leading dims and spans), for
 * operands whose device addresses are multiples of align[0..2] bytes (A,
 * B, C), with a workspace of at most `workspace` bytes. `what` names the
 * step in messages. A step cuBLASLt has no algorithm for is KILN_EUNIMPL. */
int kiln__cublas_plan_create(kiln__cublas *h, const kiln_gemm *g, bool tf32,
                             const uint32_t align[3], uint64_t workspace, const char *what,
                             kiln__cublas_plan **out, kiln_status *st);
void kiln__cublas_plan_destroy(kiln__cublas_plan *p); /* NULL: nothing */

/* The workspace bytes the plan's algorithm needs (<= the bound it got). */
uint64_t kiln__cublas_plan_workspace(const kiln__cublas_plan *p);

/* C = alpha op(A) op(B) + beta C on stream s (device addresses). */
int kiln__cublas_plan_run(const kiln__cublas_plan *p, uint64_t a, uint64_t b, uint64_t c,
                          uint64_t workspace, CUstream s, const char *where, kiln_status *st);

#endif /* KILN_EXECUTOR_CUDA_CUDA_BLAS_H */
