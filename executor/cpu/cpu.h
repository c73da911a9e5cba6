/* Internal interface of the CPU backend (executor/cpu/).
 *
 * cpu_backend.c: the vtable, devices and host memory. cpu_pool.c: one fixed
 * worker pool per device. cpu_load.c: checks an executable and maps its code
 * object (memfd + dlopen). cpu_run.c: resolves slots and interprets the
 * step programs. cpu_bind.c: host literals to and from the bindings
 * (layouts, tuples, donation). cpu_gemm.c: GEMM steps through OpenBLAS,
 * split over the pool. cpu_collective.c: collectives between devices.
 * cpu_conv.c: convolution steps through oneDNN. cpu_dnnl.c (cpu_dnnl.h):
 * oneDNN's loader, engine, streams and matmul plans, for cpu_conv.c,
 * cpu_igemm.c, cpu_bgemm.c and cpu_gemm_dnnl.c.
 * cpu_fft.c: fft steps through FFTW (opened at the first plan).
 */
#ifndef KILN_EXECUTOR_CPU_CPU_H
#define KILN_EXECUTOR_CPU_CPU_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "compiler/codegen/executable.h"
#include "executor/backend_impl.h"

/* ---- the worker pool ---------------------------------------------------- */

typedef struct kiln__cpu_pool kiln__cpu_pool;

/* One chunk of a parallel loop. */
typedef void (*kiln__cpu_task_fn)(void *ctx, uint64_t chunk);

/* A pool of nthreads - 1 worker threads; the thread that submits work is
 * the nthreads-th. nthreads >= 1. */
int kiln__cpu_pool_create(uint32_t nthreads, kiln__cpu_pool **out, kiln_status *st);
/* Stops and joins the workers. Work must not be in flight. */
void kiln__cpu_pool_destroy(kiln__cpu_pool *p);
uint32_t kiln__cpu_pool_threads(const kiln__cpu_pool *p);
/* Runs fn(ctx, c) for every c in [0, nchunks) on the workers and the
 * calling thread; returns when all chunks have finished. Safe to call from
 * several threads at once (their chunks share the workers). */
void kiln__cpu_pool_run(kiln__cpu_pool *p, kiln__cpu_task_fn fn, void *ctx, uint64_t nchunks);

/* Denormal floats flushed to zero (x86 MXCSR FTZ and DAZ) on the calling
 * thread, as XLA's CPU backend runs its programs: a softmax or GELU whose
 * values underflow otherwise runs tens of times slower. Workers run with it
 * always; a run sets it on the submitting thread and puts back the state
 * kiln__cpu_flush_denormals returned. Elsewhere (not x86): nothing. */
unsigned kiln__cpu_flush_denormals(void);
void kiln__cpu_restore_denormals(unsigned saved);

/* ---- devices and loaded executables -------------------------------------- */

/* Large device buffers freed recently, kept for the next allocation of
 * about the same size (see cpu_backend.c). */
#define KILN__CPU_BUFFER_CACHE 8

typedef struct kiln__cpu_device {
  kiln__cpu_pool *pool;
  uint64_t max_temp_bytes;
  pthread_mutex_t cache_mu;
  void *cache[KILN__CPU_BUFFER_CACHE]; /* buffer headers, most recently freed last */
  uint32_t ncache;
  uint64_t cache_bytes;     /* capacity held in cache[] */
  uint64_t max_cache_bytes; /* at most this much is kept */
} kiln__cpu_device;

#define KILN__CPU_ARENA_CACHE 4

typedef struct kiln__cpu_loaded {
  const kiln_executable *exe;
  kiln__cpu_device *dev;
  void *dl;                /* dlopen handle; NULL when there is no code */
  int memfd;               /* kept open while loaded (see cpu_load.c); -1 when none */
  kiln_kernel_fn *kernels; /* nkernels resolved entry points */
  /* Per kernel: measured nanoseconds per 1024 iterations (0: not yet
   * measured), used to decide whether a launch is worth splitting. */
  _Atomic uint64_t *kernel_cost;
  /* argv_base[p][s]: offset of step s of program p in the per-run argument
   * vector (all steps' slot pointers, laid out once per run). */
  uint64_t **argv_base;
  uint64_t nargv;
  uint32_t *leaf_base; /* nparams: first flattened leaf of parameter p */
  /* conv[p][s]: the plan of CONV step s of program p (cpu_conv.c); NULL
   * for other steps, and conv[p] NULL for programs without one. */
  struct kiln__cpu_conv ***conv;
  /* fft[p][s]: the plan of FFT step s of program p (cpu_fft.c), likewise. */
  struct kiln__cpu_fft ***fft;
  /* Per parameter leaf: a result is bound to its slot (input_output_alias
   * donation), so the program may write it. The literal API copies such a
   * leaf first; the buffer API writes the caller's buffer. */
  bool *donated;
  /* Temporary arenas of finished runs, ready for the next one; a run takes
   * one out (or allocates), so overlapping runs never share an arena. */
  pthread_mutex_t mu;
  void *arena_cache[KILN__CPU_ARENA_CACHE]; /* raw kiln_malloc pointers */
  uint32_t narena_cache;
} kiln__cpu_loaded;

/* 64-byte aligned memory through the allocation hook; NULL on failure.
 * *raw receives the pointer to give back to kiln_free. */
void *kiln__cpu_aligned_alloc(size_t bytes, void **raw);

/* Checks e for this host and the device's limits and maps its code. */
int kiln__cpu_load(kiln__cpu_device *dev, const kiln_executable *e, kiln__cpu_loaded **out,
                   kiln_status *st);
void kiln__cpu_unload(kiln__cpu_loaded *l);

/* Runs program 0 with parameter leaf i at params[i] and result leaf i at
 * results[i], both laid out as their bindings say. */
int kiln__cpu_run(kiln__cpu_loaded *l, const void *const *params, void *const *results,
                  const kiln_run_options *opts, kiln_status *st);

/* The vtable's run: binds host literals (row-major) to the executable's
 * parameter layouts, runs, and gathers the result literal. */
int kiln__cpu_run_literals(kiln_loaded *l, const kiln_literal *const *args,
                           const kiln_run_options *opts, kiln_literal **out, kiln_status *st);

/* Row-major (logical) order <-> the physical order of shape's layout.
 * to_physical: dst is laid out by the layout, src row-major. */
void kiln__cpu_relayout(void *dst, const void *src, const kiln_shape *shape, int to_physical);

/* The vtable's collective slot: all-reduce, all-gather, reduce-scatter,
 * all-to-all and collective-permute between the communicator's devices, in
 * host memory (cpu_collective.c). */
int kiln__cpu_collective(kiln_comm *c, const kiln_collective *d, kiln_status *st);

/* A collective step (KILN_STEP_COLLECTIVE, checked at load) with its slot
 * addresses a: meets the rank's group at the gang's rendezvous (g NULL: a
 * run on one device) and writes this rank's results (cpu_collective.c). */
int kiln__cpu_coll_step(const kiln_executable *e, const kiln_step *s, void *const *a,
                        const kiln__gang_rank *g, const atomic_int *cancel, double deadline,
                        kiln_status *st);

/* A GEMM step's epilogue: fn over iterations of `unit` elements of C
 * each, with its own arguments bufs. */
typedef struct kiln__cpu_epilogue {
  kiln_kernel_fn fn;
  void *const *bufs;
  int64_t unit;
} kiln__cpu_epilogue;

/* The GEMM step: C[b] = alpha op(A[b]) op(B[b]) + beta C[b], split over the
 * pool, then epi (NULL: none) over each block of C as it is written.
 * Arguments are checked at load. */
void kiln__cpu_gemm(kiln__cpu_pool *pool, const kiln_gemm *g, const void *a, const void *b, void *c,
                    const kiln__cpu_epilogue *epi);

/* epi over all of C once a product is written, split over the pool by
 * rows (a product cut into column blocks, or one a library ran). */
void kiln__cpu_gemm_epilogue(kiln__cpu_pool *pool, const kiln_gemm *g,
                             const kiln__cpu_epilogue *epi);

/* The integer GEMM step (dtype S8 or U8: A of that type, B s8, C s32;
 * checked at load): through oneDNN's int8 matmul on a CPU with VNNI, else
 * an exact loop split over the pool (cpu_igemm.c). */
void kiln__cpu_igemm(kiln__cpu_pool *pool, const kiln_gemm *g, const void *a, const void *b,
                     void *c);
/* Whether kiln__cpu_igemm runs g through oneDNN, and whether it does so
 * with A shifted into u8 by Kiln (an s8 A whose K is too large for
 * oneDNN's own s8 path to be exact; see cpu_igemm.c) (tests). */
bool kiln__cpu_igemm_uses_library(const kiln_gemm *g);
bool kiln__cpu_igemm_shifts(const kiln_gemm *g);

/* The bf16 GEMM step (dtype BF16: A and B bf16, C f32; checked at load),
 * then epi (NULL: none) over C: through oneDNN's bf16 matmul on a CPU with
 * avx512_bf16, else A and B widened to f32 and the f32 GEMM step
 * (cpu_bgemm.c). KILN_ENOMEM when the widened copies cannot be made. */
int kiln__cpu_bgemm(kiln__cpu_pool *pool, const kiln_gemm *g, const void *a, const void *b, void *c,
                    const kiln__cpu_epilogue *epi);
/* Whether kiln__cpu_bgemm runs g through oneDNN (tests). */
bool kiln__cpu_bgemm_uses_library(const kiln_gemm *g);

/* One f32 GEMM piece of at most KILN__SMALL_GEMM_M rows, B not transposed
 * and of KILN__SMALL_GEMM_MIN_NK to KILN__SMALL_GEMM_MAX_NK elements:
 * C = alpha op(A) B + beta C (row-major, leading dimensions in elements)
 * by unpacked AVX-512 tiles (cpu_gemm_small.c). False, with nothing
 * written, when the piece is not one it takes or the CPU lacks AVX-512F:
 * the caller then runs OpenBLAS. kiln__cpu_sgemm_small_takes says whether a
 * piece of that size (B not transposed) would run here. */
#define KILN__SMALL_GEMM_M 64
#define KILN__SMALL_GEMM_MIN_NK 16384
#define KILN__SMALL_GEMM_MAX_NK 131072
bool kiln__cpu_sgemm_small_takes(int64_t m, int64_t n, int64_t k);
bool kiln__cpu_sgemm_small(int64_t m, int64_t n, int64_t k, bool trans_a, float alpha,
                           const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                           float *c, int64_t ldc);

/* One f32 GEMM piece through oneDNN's sgemm on the calling thread
 * (cpu_gemm_dnnl.c): C = alpha op(A) op(B) + beta C, row-major. False,
 * with nothing written, for a piece too small to gain from it or when
 * oneDNN is not there (the caller then runs OpenBLAS);
 * kiln__cpu_sgemm_dnnl_takes says whether a piece of that size would run
 * here. */
bool kiln__cpu_sgemm_dnnl_takes(int64_t m, int64_t n, int64_t k);
bool kiln__cpu_sgemm_dnnl(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc);

/* The CONV step (cpu_conv.c): primitives made once at load (through
 * oneDNN when the build has it, else the direct loop); running one is safe
 * from several runs at once. c must have passed kiln_conv_check. */
typedef struct kiln__cpu_conv kiln__cpu_conv;
int kiln__cpu_conv_create(const kiln_conv *c, kiln__cpu_conv **out, const char *where,
                          kiln_status *st);
void kiln__cpu_conv_destroy(kiln__cpu_conv *p);
int kiln__cpu_conv_run(const kiln__cpu_conv *p, kiln__cpu_pool *pool, const void *lhs,
                       const void *rhs, void *out, kiln_status *st);
/* Whether the plan runs through a library, oneDNN or OpenBLAS (false: the
 * direct loop). */
bool kiln__cpu_conv_uses_library(const kiln__cpu_conv *p);
/* Whether it runs as sgemm calls (a long-kernel 1-D convolution: weight
 * gradients), split over the pool it is run with. */
bool kiln__cpu_conv_uses_gemm(const kiln__cpu_conv *p);
/* Whether it runs as oneDNN's backward data (a transposed convolution:
 * lhs dilation, window stride 1). */
bool kiln__cpu_conv_uses_bwd(const kiln__cpu_conv *p);

/* The FFT step (cpu_fft.c): an FFTW plan made once at load (the direct DFT
 * when FFTW cannot be opened); running one is safe from several runs at
 * once. f must have passed kiln_fft_check. */
typedef struct kiln__cpu_fft kiln__cpu_fft;
int kiln__cpu_fft_create(const kiln_fft *f, kiln__cpu_fft **out, const char *where,
                         kiln_status *st);
void kiln__cpu_fft_destroy(kiln__cpu_fft *p);
/* pool: where the batch is spread (NULL: this thread). */
int kiln__cpu_fft_run(const kiln__cpu_fft *p, kiln__cpu_pool *pool, const void *in, void *out,
                      kiln_status *st);
/* Whether the plan runs through FFTW (false: the direct DFT). */
bool kiln__cpu_fft_uses_library(const kiln__cpu_fft *p);
/* Whether p runs as a line pass and column passes (cpu_fft.c). */
bool kiln__cpu_fft_uses_passes(const kiln__cpu_fft *p);

/* The LINALG step (cpu_linalg.c): LAPACK per matrix of the batch; args are
 * the step's slot pointers in order. g must have passed kiln_linalg_check.
 * pool: where a batch of small matrices is spread (NULL: this thread). */
int kiln__cpu_linalg_run(const kiln_linalg *g, kiln__cpu_pool *pool, void *const *args,
                         kiln_status *st);

#endif /* KILN_EXECUTOR_CPU_CPU_H */
