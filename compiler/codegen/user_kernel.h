/* User kernels: C source a client registered, compiled by the toolchain
 * that compiles generated code and called by the executables that use it.
 *
 * Running a client's C code is running the client's code: the server takes
 * registrations only with --allow-user-kernels (and from admins when
 * tokens are on; docs/toolbox.md).
 *
 * The ABI. The source defines one function,
 *
 *   void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end)
 *
 * (it includes <stdint.h> itself). bufs holds the base addresses of the
 * operands, then of the results, in the signature's order, each dense and
 * row-major. The kernel computes iterations [begin, end), which the
 * runtime splits across threads: for an element-wise signature the
 * iterations are the elements (every operand and result has the same
 * number of them), for a block-indexed one (grid=N) they are the N blocks,
 * whose extent the kernel knows from its own signature. It must write
 * only its results, only at its iterations, and hold no state.
 *
 * The source is compiled on its own, as a translation unit of its own,
 * with its function renamed (a -D flag) to kiln_user_<16 hex digits of the
 * SHA-256 of the source>; an executable's generated code calls it by that
 * name from a kernel of its own, and the object is linked into the
 * executable's shared object. Nothing the client wrote (neither the name
 * nor the signature) enters generated source. Objects are kept by that
 * digest: the same source registered again, under any name or signature,
 * is not compiled again.
 *
 * The signature, client text too, is parsed here:
 *
 *   f32[1024], f32[1024] -> f32[1024]              element-wise
 *   f32[8,128] -> f32[8,128], f32[8]; grid=8       block-indexed, 8 blocks
 *
 * (operands may be none: "-> f32[4]"; results one or more; at most
 * KILN_USER_KERNEL_MAX_ARGS in all, rank at most 8, no tuples.)
 */
#ifndef KILN_COMPILER_CODEGEN_USER_KERNEL_H
#define KILN_COMPILER_CODEGEN_USER_KERNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/user_kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_USER_KERNEL_MAX_ARGS 16
#define KILN_USER_KERNEL_MAX_RANK 8
#define KILN_USER_KERNEL_SIG_MAX 1024            /* bytes of signature text */
#define KILN_USER_KERNEL_SOURCE_MAX (256u << 10) /* default source limit */
#define KILN_USER_KERNEL_OBJECT_MAX (4u << 20)   /* default object limit */
#define KILN_USER_KERNELS_MAX 256                /* registrations a registry keeps */

typedef struct kiln_user_kernel_arg {
  kiln_dtype dtype;
  uint32_t rank;
  int64_t dims[KILN_USER_KERNEL_MAX_RANK];
} kiln_user_kernel_arg;

typedef struct kiln_user_kernel_sig {
  uint32_t nin, nout;
  kiln_user_kernel_arg in[KILN_USER_KERNEL_MAX_ARGS], out[KILN_USER_KERNEL_MAX_ARGS];
  uint64_t grid; /* 0: element-wise; else the number of blocks */
} kiln_user_kernel_sig;

/* Parses signature text; errors are KILN_EINVAL with where =
 * "signature:1:COL" and what was expected. */
int kiln_user_kernel_sig_parse(const char *text, kiln_user_kernel_sig *out, kiln_status *st);
/* The iterations one call runs: the elements (element-wise) or the grid. */
uint64_t kiln_user_kernel_sig_range(const kiln_user_kernel_sig *s);

/* One registered kernel; immutable once registered and alive as long as
 * its registry (a name registered again gets a new entry). */
typedef struct kiln_user_kernel {
  char name[KILN_USER_KERNEL_NAME_MAX + 1];
  kiln_user_kernel_sig sig;
  char digest[65];    /* hex SHA-256 of the source */
  char symbol[32];    /* kiln_user_<first 16 hex digits> */
  const uint8_t *obj; /* the compiled object (shared by entries of one source) */
  size_t nobj;
} kiln_user_kernel;

typedef struct kiln_user_kernels kiln_user_kernels;

typedef struct kiln_user_kernel_options {
  const char *cc;    /* NULL: env KILN_CC, else "cc" */
  double timeout_s;  /* the compiler's wall-clock limit; <= 0: 30 s */
  size_t max_source; /* 0: KILN_USER_KERNEL_SOURCE_MAX */
  size_t max_object; /* 0: KILN_USER_KERNEL_OBJECT_MAX */
  bool check_link;   /* also link it into a shared object (the symbol is defined) */
} kiln_user_kernel_options;

kiln_user_kernels *kiln_user_kernels_create(void);
void kiln_user_kernels_destroy(kiln_user_kernels *r);

/* Registers (or registers again) `name` with C source src[0..n) and the
 * signature text. Errors: KILN_EINVAL for a bad name or signature,
 * KILN_ELIMIT for a source or object over the limit, too many
 * registrations or a compiler past its time, KILN_EINVAL carrying the
 * compiler's message (lines as "kernel.c:LINE:COL", the function as
 * kiln_user_kernel) for source that does not compile or does not
 * define the kernel. *cached (may be
 * NULL) says whether the object was already there. Thread-safe. */
int kiln_user_kernels_register(kiln_user_kernels *r, const char *name, const char *src, size_t n,
                               const char *signature, const kiln_user_kernel_options *o,
                               const kiln_user_kernel **out, bool *cached, kiln_status *st);

/* CUDA C of a kernel compile-checked by NVRTC for arch (NULL: sm_90):
 * 0 with "ok" in out, or, where libnvrtc cannot be loaded, 0 with
 * "skipped: WHY"; a compile error is KILN_EINVAL with NVRTC's message
 * (where "cuda_source"), its time limit KILN_ELIMIT. */
int kiln_user_kernel_cuda_check(const char *src, size_t n, const char *arch, double timeout_s,
                                char *out, size_t size, kiln_status *st);

/* The newest registration of name, or NULL. Thread-safe. */
const kiln_user_kernel *kiln_user_kernels_find(const kiln_user_kernels *r, const char *name);

/* Compiles done by the registry (cache misses), for tests and stats. */
uint64_t kiln_user_kernels_compiles(const kiln_user_kernels *r);

/* A text naming the digest of every user kernel m calls, "NAME=DIGEST;"
 * in the module's order, for cache keys (an executable embeds the
 * kernels' code). Empty when m calls none. Errors: a call of a kernel not
 * registered (KILN_ENOTFOUND naming it). *out is kiln_malloc'd. */
int kiln_user_kernels_key(const kiln_user_kernels *r, const kiln_module *m, char **out,
                          kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_CODEGEN_USER_KERNEL_H */
