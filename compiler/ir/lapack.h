/* The LAPACK custom calls that JAX exports for its CPU linear algebra
 * (lapack_spotrf_ffi, lapack_dgetrf_ffi, ...), and the HLO ops cholesky and
 * triangular-solve, described as one value: which factorization, the element
 * type, the batch, the matrix sizes and the LAPACK flags.
 *
 * kiln_lapack_describe is the single place where such an instruction is
 * checked: its target (a closed table), its backend_config (an MLIR
 * dictionary of ui8 character codes, every key known and every value one of
 * the characters LAPACK takes), its operands and its result tuple. The
 * verifier calls it so that a malformed call is refused at load with a
 * message naming what is wrong; the interpreter (compiler/eval) and the cpu
 * step (compiler/codegen/linalg_step.c) call it again and then trust it.
 *
 * Every argument is a stack of matrices (or vectors, or scalars) over the
 * same leading batch dimensions; kiln_lapack_arg_dims gives the logical
 * shape each argument must have, so the checks here, the interpreter and the
 * step's blob check all read one definition.
 */
#ifndef KILN_COMPILER_IR_LAPACK_H
#define KILN_COMPILER_IR_LAPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Arguments are listed operands first, then the result's leaves. */
typedef enum kiln_lapack_kind {
  KILN_LAPACK_POTRF,            /* (a[n,n]) -> (factor[n,n], info[]) */
  KILN_LAPACK_TRSM,             /* (a[k,k], b[m,n]) -> (x[m,n]); k = side L ? m : n */
  KILN_LAPACK_GETRF,            /* (a[m,n]) -> (lu[m,n], ipiv[min], info[]) */
  KILN_LAPACK_GEQRF,            /* (a[m,n]) -> (a[m,n], tau[min]) */
  KILN_LAPACK_ORGQR,            /* (a[m,n], tau[k]) -> (q[m,n]); k <= n <= m */
  KILN_LAPACK_SYEVD,            /* (a[n,n]) -> (v[n,n], w[n], info[]) */
  KILN_LAPACK_GESDD,            /* (a[m,n]) -> (a[m,n], s[min], u[m,uc], vt[vr,n], info[]) */
  KILN_LAPACK_CHOLESKY,         /* HLO cholesky: (a[n,n]) -> (l[n,n]), other triangle 0 */
  KILN_LAPACK_TRIANGULAR_SOLVE, /* HLO triangular-solve: as TRSM */
  KILN_LAPACK_KIND_COUNT
} kiln_lapack_kind;

#define KILN_LAPACK_MAX_ARGS 6
#define KILN_LAPACK_MAX_BATCH 6 /* batch dims; matrices add two */

typedef struct kiln_lapack {
  uint32_t kind;   /* kiln_lapack_kind */
  uint32_t dtype;  /* of the matrices: F32, F64, C64 or C128 */
  uint32_t nbatch; /* leading batch dims, alike in every argument */
  uint32_t nargs;  /* operands + result leaves */
  int64_t batch[KILN_LAPACK_MAX_BATCH];
  int64_t m, n, k; /* see kiln_lapack_kind */
  /* LAPACK's character flags ('L', 'U', 'N', 'T', 'C', 'R', 'V', 'A', 'S');
   * 0 where the kind has none. */
  uint8_t uplo, side, trans, diag, mode;
} kiln_lapack;

/* Whether target is one of the LAPACK custom-call targets of the table. */
bool kiln_lapack_is_target(const char *target);

/* Whether ins is a LAPACK custom call, a cholesky or a triangular-solve. */
bool kiln_lapack_is(const kiln_instr *ins);

/* Fills *out from instruction ins (kiln_lapack_is). On a malformed one
 * returns KILN_EINVAL and writes why[] (e.g. "lapack_spotrf_ffi: uplo is 88
 * ('X'), expected 76 ('L') or 85 ('U')"). Reads only the instruction and its
 * operands' shapes. */
int kiln_lapack_describe(const kiln_module *m, const kiln_instr *ins, kiln_lapack *out, char *why,
                         size_t nwhy);

/* Argument i of l: its element type, and its logical shape (rank into
 * *rank, dims into dims[0..rank), batch dims first). False when i >=
 * l->nargs. */
bool kiln_lapack_arg_dims(const kiln_lapack *l, uint32_t i, uint32_t *dtype, uint32_t *rank,
                          int64_t *dims);

/* Whether l is self-consistent (kind, dtype, counts, sizes in range): for a
 * description read from a blob. */
bool kiln_lapack_check(const kiln_lapack *l, char *why, size_t nwhy);

/* How many of the kind's arguments are operands (the rest are results). */
uint32_t kiln_lapack_noperands(uint32_t kind);

/* The kind's name ("potrf", ...). */
const char *kiln_lapack_kind_name(uint32_t kind);

#ifdef __cplusplus
}
#endif

#endif
