/* oneDNN on the cpu backend: the one place the library is opened, its
 * matmul primitives planned and cached, and primitives run
 * (cpu_dnnl.c). Its users hold only what is theirs: cpu_conv.c (the
 * convolution step), cpu_igemm.c (the int8 GEMM step), cpu_bgemm.c (the
 * bf16 GEMM step) and cpu_gemm_dnnl.c (f32 GEMM pieces through sgemm).
 *
 * oneDNN is opened with dlopen at first use, not linked: its OpenMP runtime
 * (libgomp) reads OMP_WAIT_POLICY when it is loaded, and the default policy
 * keeps oneDNN's idle threads spinning after every primitive, taking the
 * cores from the device pool's kernels that run next (a convnet ran 10x
 * slower so on a loaded 2-core machine). The loader sets the policy to
 * passive first unless the environment already says.
 *
 * Sanitizer builds do not use it (KILN__DNNL is 0 there): LeakSanitizer's
 * tracer faults at exit in a process with oneDNN's OpenMP threads, and
 * oneDNN is not instrumented. Builds without libdnnl-dev likewise. Then
 * kiln__dnnl_get() is NULL and kiln__dnnl_why() says why, and every user
 * keeps its own fallback (OpenBLAS, an exact loop, the direct convolution).
 */
#ifndef KILN_EXECUTOR_CPU_CPU_DNNL_H
#define KILN_EXECUTOR_CPU_CPU_DNNL_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/codegen/executable.h"

#if defined(__SANITIZE_ADDRESS__)
#define KILN__ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN__ASAN 1
#endif
#endif
#ifndef KILN__ASAN
#define KILN__ASAN 0
#endif

#if defined(KILN_HAVE_DNNL) && !KILN__ASAN
#define KILN__DNNL 1
#else
#define KILN__DNNL 0
#endif

/* Why oneDNN is not there ("oneDNN is not installed: ...", "this build
 * has no oneDNN", ...), or NULL when it is (after opening it). */
const char *kiln__dnnl_why(void);

#if KILN__DNNL
#include <dnnl.h>

/* The library's entry points this backend uses, each named without its
 * "dnnl_" prefix (kiln__dnnl.memory_create is dnnl_memory_create). */
/* clang-format off */
#define KILN__DNNL_FNS(X) \
  X(dilated_convolution_backward_data_desc_init) \
  X(dilated_convolution_forward_desc_init) \
  X(engine_create) \
  X(matmul_desc_init) \
  X(memory_create) \
  X(memory_desc_equal) \
  X(memory_desc_get_size) \
  X(memory_desc_init_by_strides) \
  X(memory_desc_init_by_tag) \
  X(memory_destroy) \
  X(primitive_attr_create) \
  X(primitive_attr_destroy) \
  X(primitive_attr_set_scratchpad_mode) \
  X(primitive_create) \
  X(primitive_desc_create) \
  X(primitive_desc_destroy) \
  X(primitive_desc_query) \
  X(primitive_desc_query_md) \
  X(primitive_destroy) \
  X(primitive_execute) \
  X(reorder_primitive_desc_create) \
  X(sgemm) \
  X(stream_create) \
  X(stream_destroy) \
  X(stream_wait)
/* clang-format on */

typedef struct kiln__dnnl_api {
#define KILN__DNNL_MEMBER(f) __typeof__(dnnl_##f) *f;
  KILN__DNNL_FNS(KILN__DNNL_MEMBER)
#undef KILN__DNNL_MEMBER
  /* OpenMP's per-thread team size, from the runtime oneDNN loads (NULL
   * when dlsym does not find them there). */
  int (*omp_get_max_threads)(void);
  void (*omp_set_num_threads)(int);
  dnnl_engine_t engine; /* the one cpu engine of the process */
} kiln__dnnl_api;

/* The table itself, for calls written kiln__dnnl.memory_create(...):
 * filled once kiln__dnnl_get() has returned it, read-only after. */
extern kiln__dnnl_api kiln__dnnl;

/* Opens oneDNN at the first call (once per process, thread-safe) and
 * makes the engine; NULL when it cannot (kiln__dnnl_why says why). The
 * table lives for the process. */
const kiln__dnnl_api *kiln__dnnl_get(void);

/* This thread's stream on the engine, made at its first use and destroyed
 * when the thread exits; NULL when it cannot be made. */
dnnl_stream_t kiln__dnnl_stream(void);

/* ---- building primitives --------------------------------------------- */

/* A memory descriptor of n dims as the operand lies (element strides), or
 * in the layout the primitive chooses. */
dnnl_status_t kiln__dnnl_md_strided(dnnl_memory_desc_t *md, int n, const dnnl_dims_t dims,
                                    dnnl_data_type_t type, const dnnl_dims_t strides);
dnnl_status_t kiln__dnnl_md_any(dnnl_memory_desc_t *md, int n, const dnnl_dims_t dims,
                                dnnl_data_type_t type);

/* The primitive descriptor of op_desc (a convolution or matmul
 * descriptor); user_scratchpad: the runs pass their own scratchpad
 * (DNNL_ARG_SCRATCHPAD), so that runs of one primitive may overlap. */
dnnl_status_t kiln__dnnl_pd_create(dnnl_primitive_desc_t *pd, const void *op_desc,
                                   bool user_scratchpad);
/* A reorder's primitive descriptor (user scratchpad). */
dnnl_status_t kiln__dnnl_reorder_pd(dnnl_primitive_desc_t *pd, const dnnl_memory_desc_t *from,
                                    const dnnl_memory_desc_t *to);
/* Whether pd is only oneDNN's reference implementation (slow). */
bool kiln__dnnl_pd_is_ref(dnnl_primitive_desc_t pd);
/* The primitive of pd into *prim, with its scratchpad's descriptor into
 * *scratch (ndims 0: none) when scratch is not NULL; pd is destroyed. */
dnnl_status_t kiln__dnnl_prim_create(dnnl_primitive_t *prim, dnnl_primitive_desc_t pd,
                                     dnnl_memory_desc_t *scratch);

/* ---- running them ---------------------------------------------------- */

/* One argument of a run: its DNNL_ARG_*, how it lies and where. */
typedef struct kiln__dnnl_arg {
  int arg;
  const dnnl_memory_desc_t *md;
  const void *data;
} kiln__dnnl_arg;

/* Runs prim on this thread's stream with the n arguments and waits for it.
 * Memory objects are made per run, so runs of one primitive may overlap. */
dnnl_status_t kiln__dnnl_exec(dnnl_primitive_t prim, const kiln__dnnl_arg *args, int n);
#endif /* KILN__DNNL */

/* ---- cached matmuls -------------------------------------------------- */

/* A batched matmul C[b] = op(A[b]) op(B[b]) (a GEMM step's shape, its
 * dtype, alpha and beta aside) with operands of types a x b -> c,
 * described to oneDNN as they lie: [batch, rows, cols] with the step's
 * leading dimensions and batch strides, transposes as swapped strides, so
 * nothing is copied. The primitive of a shape is made at its first run and
 * kept for the process, in a table of at most KILN__DNNL_MAX_PLANS shapes
 * (past it a shape's is made and destroyed at each run), under a mutex. */
#define KILN__DNNL_MAX_PLANS 256

/* Runs the matmul; false, with C not written, when oneDNN is not there or
 * refuses the shape (the caller then runs its fallback). */
bool kiln__dnnl_matmul_run(const kiln_gemm *g, kiln_dtype a, kiln_dtype b, kiln_dtype c,
                           const void *pa, const void *pb, void *pc);
/* Whether kiln__dnnl_matmul_run would run it (tests). */
bool kiln__dnnl_matmul_takes(const kiln_gemm *g, kiln_dtype a, kiln_dtype b, kiln_dtype c);

#endif /* KILN_EXECUTOR_CPU_CPU_DNNL_H */
