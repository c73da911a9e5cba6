/* The CUDA backend's caching device allocator and the small pure pieces of
 * a launch, kept apart from the driver so that they are tested without a
 * GPU (tests/unit/test_cuda_backend.c): nothing here includes cuda.h.
 *
 * Allocator: device memory comes from raw_alloc (cuMemAlloc_v2 in the
 * backend, host memory in the tests) in size classes, and a freed block
 * goes back to its class's free list instead of cuMemFree: a program's
 * temporaries and results are the same sizes run after run, and
 * cuMemAlloc/cuMemFree synchronize the device. Classes: powers of two from
 * 512 bytes to 1 MiB, then multiples of 2 MiB (a free block is taken again
 * only for a request of exactly its class). Everything held, live or
 * cached, counts against a byte budget: a request that would pass it
 * first releases the cached blocks, then fails with KILN_ELIMIT (gRPC
 * RESOURCE_EXHAUSTED) naming the budget; a raw allocation that fails
 * likewise releases the cache and is tried once more. Thread-safe.
 */
#ifndef KILN_EXECUTOR_CUDA_CUDA_ALLOC_H
#define KILN_EXECUTOR_CUDA_CUDA_ALLOC_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define KILN__CUDA_MIN_BLOCK 512u                 /* smallest class */
#define KILN__CUDA_SMALL_MAX (UINT64_C(1) << 20)  /* largest power-of-two class */
#define KILN__CUDA_LARGE_STEP (UINT64_C(2) << 20) /* larger classes: multiples of this */
#define KILN__CUDA_NSMALL 12u                     /* 512 B .. 1 MiB */

/* The class of a request of `bytes`: its rounded size in *rounded and
 * the free list it belongs to (0 .. KILN__CUDA_NSMALL-1 for the powers of
 * two, KILN__CUDA_NSMALL for every larger one). false when rounding up
 * would overflow. */
bool kiln__cuda_size_class(uint64_t bytes, uint64_t *rounded, uint32_t *list);

typedef struct kiln__cuda_block {
  uint64_t ptr;   /* the device address */
  uint64_t bytes; /* its class's size */
  uint64_t asked; /* bytes requested (<= bytes) */
  struct kiln__cuda_block *next;
} kiln__cuda_block;

typedef struct kiln__cuda_allocator {
  pthread_mutex_t mu;
  uint64_t budget; /* live + cached never exceeds it */
  uint64_t live;   /* bytes of blocks handed out */
  uint64_t cached; /* bytes of blocks on the free lists */
  uint64_t peak;   /* highest `live` seen */
  kiln__cuda_block *free[KILN__CUDA_NSMALL + 1];
  /* raw_alloc: 0 and *ptr, or a negative KILN_E* with st filled (KILN_ELIMIT
   * for out of device memory). raw_free gives a block back. */
  int (*raw_alloc)(void *ctx, uint64_t bytes, uint64_t *ptr, kiln_status *st);
  void (*raw_free)(void *ctx, uint64_t ptr);
  void *ctx;
  const char *what;        /* names the device in messages: "cuda:0" */
  const char *budget_name; /* how the budget is set, for messages */
} kiln__cuda_allocator;

void kiln__cuda_allocator_init(kiln__cuda_allocator *a, uint64_t budget,
                               int (*raw_alloc)(void *, uint64_t, uint64_t *, kiln_status *),
                               void (*raw_free)(void *, uint64_t), void *ctx, const char *what,
                               const char *budget_name);
/* Releases the cached blocks and the mutex; live blocks must be freed first. */
void kiln__cuda_allocator_fini(kiln__cuda_allocator *a);
/* A block of at least `bytes` (its contents are unspecified). */
int kiln__cuda_allocator_get(kiln__cuda_allocator *a, uint64_t bytes, kiln__cuda_block **out,
                             kiln_status *st);
/* Back to its free list (NULL: nothing). */
void kiln__cuda_allocator_put(kiln__cuda_allocator *a, kiln__cuda_block *b);
/* Frees every cached block through raw_free. */
void kiln__cuda_allocator_trim(kiln__cuda_allocator *a);

/* ---- launches ------------------------------------------------------------ */

/* The grid of a kernel step over `range` iterations (cuda_target.c: every
 * kernel is a grid-stride loop over [begin, end), so any grid covers the
 * range): blocks of at most max_block threads (the kernel's own limit,
 * rounded down to a warp; 256 at most), a small range in one block of
 * whole warps, and no more blocks than `nsm` multiprocessors keep
 * resident a few times over. range 0 is no launch: *grid = 0. */
void kiln__cuda_grid(uint64_t range, uint32_t nsm, uint32_t max_block, uint32_t *grid,
                     uint32_t *block);

/* The KILN_E* code for a CUresult (the numbers of cuda.h's CUresult):
 * out of memory is KILN_ELIMIT, no device or driver KILN_EUNAVAIL, an
 * image for another GPU KILN_EUNIMPL, a bad image or a missing kernel
 * KILN_EINVAL, anything else KILN_EINTERNAL. */
int kiln__cuda_error_code(int result);

/* Fills st with "CALL failed: NAME: DESCRIPTION" (name and desc from
 * cuGetErrorName/cuGetErrorString, NULL when the driver gave none) and
 * returns kiln__cuda_error_code(result). */
int kiln__cuda_error(int result, const char *call, const char *name, const char *desc,
                     const char *where, kiln_status *st);

/* Whether a cubin for sm_<major><minor> runs on a device of compute
 * capability dev_major.dev_minor: same major, device minor not lower. */
bool kiln__cuda_arch_runs(int cubin_major, int cubin_minor, int dev_major, int dev_minor);
/* Parses "sm_90" / "sm_100" into major and minor (the last digit); false
 * for anything else. */
bool kiln__cuda_arch_parse(const char *arch, int *major, int *minor);

/* Whether code[0..n) is a 64-bit little-endian ELF of machine EM_CUDA
 * whose program and section headers, and every section's bytes, lie
 * inside the n bytes: cuModuleLoadData takes an image without a length and
 * trusts its headers, so a cut or corrupt cubin must be refused before it.
 * On false, why[] says what is wrong. */
bool kiln__cuda_cubin_check(const uint8_t *code, uint64_t n, char *why, size_t nwhy);

#endif /* KILN_EXECUTOR_CUDA_CUDA_ALLOC_H */
