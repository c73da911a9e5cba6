/* The cuda backend's vtable: executables of a cuda target run on NVIDIA
 * GPUs through the driver API (cuda_api.h), loaded lazily.
 *
 * Devices: one per GPU the driver reports (backend option ndevices asks for
 * fewer), each with its primary context, a compute stream for a run's
 * launches and copies, a copy stream for buffer transfers, an event that
 * completes a run, and a pinned staging buffer for host <-> device bytes
 * (PutBuffer / GetBuffer sizes go through it in one piece; larger
 * transfers in pieces of its size). Device memory comes from the caching
 * allocator of cuda_alloc.h, under a byte budget (env
 * KILN_CUDA_MEMORY_BYTES, else 90% of the device's memory).
 *
 * Loading: the executable is checked as the cpu loader checks its own
 * (version, target, every slot, binding, step and sub-program; no cycles),
 * for a cuda target whose architecture this GPU runs, and then its cubin is
 * loaded once (cuModuleLoadData) and kiln_kernel_0 .. N-1 are looked up
 * (cuModuleGetFunction), with each one's largest block. The constants
 * blob goes to device memory once. GEMM steps are planned once through
 * cuBLASLt (cuda_blas.h: descriptors, layouts and the heuristic's
 * algorithm per step, the device's handle and workspace made at the first
 * such load). Steps the cuda target does not run yet (convolution, FFT,
 * LAPACK, collectives) are KILN_EUNIMPL at load, naming the step: nothing
 * of such a program runs.
 *
 * Running: a run takes the device (one run at a time per device, in the
 * order they come), allocates its temporary arena and, after it, the
 * argument vector: for every step, the device addresses of its slots, laid
 * out once on the host and copied up once (cuda_target.c's ABI: a kernel
 * takes `void *const *bufs, int64_t begin, int64_t end`; bufs points into
 * that vector). Kernel steps launch over [0, range) with the grid of
 * kiln__cuda_grid, except a kernel with static shared memory
 * (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES > 0: a cooperative reduction of
 * cuda_target.c, whose block works on one iteration at a time): 256
 * threads (whole warps) and a block per iteration up to 32 per SM; a GEMM
 * step is one cublasLtMatmul on the compute stream, its epilogue (a fused
 * kernel over C) launched right after it; copies are device-to-device on
 * the compute stream; while and conditional steps are driven from the
 * host, reading the predicate or selector back (a small pinned buffer, the
 * stream synchronized) between programs. The run ends with the event
 * recorded on the compute stream and waited for: a kernel that faulted is reported
 * there, naming the call. Limits (time, cancel) are checked between
 * steps; a step observer makes every step synchronous, so its times are
 * the device's.
 *
 * Every driver call is checked (kiln__cuda_check): its failure is a status
 * naming the call and the driver's error.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "common/thread.h"
#include "compiler/codegen/executable.h"
#include "compiler/ir/debug_print.h"
#include "compiler/target.h"
#include "executor/backend_impl.h"
#include "executor/cuda/cuda.h"
#include "executor/cuda/cuda_alloc.h"
#include "executor/cuda/cuda_api.h"
#include "executor/cuda/cuda_blas.h"
#include "executor/cuda/nccl_api.h"

#define DEFAULT_MAX_ITERATIONS UINT64_C(1000000000)
#define STAGE_BYTES ((size_t)8 << 20)
#define ARGV_ALIGN UINT64_C(256)
#define MAX_NESTING KILN_NESTING_CAPACITY
#define MAX_SHAPE_DEPTH 64
#define MAX_STEP_ARGS 65536u
#define MAX_KERNELS (1u << 20)
#define DEFAULT_COLL_SECONDS 300.0 /* env KILN_NCCL_TIMEOUT */

static const char *const step_names[] = {"kernel",      "gemm",        "copy",  "while",
                                         "conditional", "call",        "conv",  "collective",
                                         "fft",         "debug-print", "linalg"};

typedef struct nccl_group nccl_group;

typedef struct cuda_backend {
  uint64_t max_temp_bytes; /* 0: the device budget */
  uint64_t budget;         /* per device; 0: 90% of its memory */
  double coll_seconds;     /* a collective's deadline when the run has none */
  pthread_mutex_t comm_mu; /* groups, graveyard */
  nccl_group *groups;      /* the communicators of collective steps, by device set */
  nccl_group *graveyard;   /* replaced after an abort; freed at fini, when unused */
} cuda_backend;

typedef struct cuda_dev {
  const kiln__cuda_api *api;
  cuda_backend *cb;
  kiln_device *dv; /* the executor's handle of this device */
  CUdevice dev;
  CUcontext ctx; /* the primary context, retained */
  CUstream compute, copy;
  CUevent done;
  kiln__cuda_allocator alloc;
  bool alloc_init;
  pthread_mutex_t copy_mu; /* the staging buffer and the copy stream */
  void *stage;             /* STAGE_BYTES pinned */
  pthread_mutex_t run_mu;  /* one run at a time; `small` */
  void *small;             /* 64 pinned bytes: predicates, selectors */
  int major, minor, nsm;
  uint64_t total_memory; /* cuDeviceTotalMem */
  uint64_t max_temp_bytes;
  char where[32];       /* "cuda:0" */
  char budget_name[96]; /* for the allocator's messages */
  /* GEMM steps: made at the first load that has one, under run_mu (the
   * workspace serves one run at a time, as the device does). */
  kiln__cublas *blas;
  kiln__cuda_block *workspace;
  uint64_t workspace_bytes;
} cuda_dev;

typedef struct cuda_loaded {
  const kiln_executable *exe;
  cuda_dev *dev;
  CUmodule module;
  CUfunction *fns;     /* nkernels */
  uint32_t *max_block; /* nkernels: CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK */
  uint8_t *coop;       /* nkernels: uses shared memory, one block per iteration */
  kiln__cuda_block *consts;
  uint64_t **argv_base;       /* [p][s]: the step's first entry in the argument vector */
  kiln__cublas_plan ***plans; /* [p][s]: a GEMM step's plan; NULL for others and empty ones */
  bool tf32;                  /* f32 GEMMs may use TF32 (KILN_CUDA_TF32=1 at load) */
  uint64_t nargv;
  uint32_t *leaf_base; /* nparams + 1 */
  bool *donated;       /* per parameter leaf */
  kiln_arena *arena;
} cuda_loaded;

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

extern const kiln_backend_iface kiln_cuda_backend_iface;

#define CK(d, call, name, st) kiln__cuda_check((d)->api, (call), (name), (d)->where, (st))

static int ctx_enter(cuda_dev *d, kiln_status *st) {
  return CK(d, d->api->ctx_push(d->ctx), "cuCtxPushCurrent", st);
}

static void ctx_leave(cuda_dev *d) {
  CUcontext c;
  d->api->ctx_pop(&c);
}

/* ---- backend and devices ------------------------------------------------- */

/* A byte count from the environment; 0 when unset. */
static int env_bytes(const char *name, uint64_t *out, kiln_status *st) {
  *out = 0;
  const char *s = getenv(name);
  if (s == NULL || *s == '\0') return 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end || v == 0 || s[0] == '-')
    return kiln_status_set(st, KILN_EINVAL, "cuda", "%s=%.32s: expected a positive byte count",
                           name, s);
  *out = v;
  return 0;
}

static int kiln_cuda_init(kiln_backend *b, const kiln_backend_options *opts, uint32_t *ndevices,
                          kiln_status *st) {
  kiln_status dst;
  kiln_status_clear(&dst);
  uint32_t n = kiln_cuda_device_count(&dst);
  if (n == 0) return kiln_status_set(st, KILN_EUNAVAIL, "cuda", "no CUDA devices: %s", dst.msg);
  if (opts->ndevices > n)
    return kiln_status_set(st, KILN_ELIMIT, "cuda",
                           "%u CUDA devices asked for, this machine has %u", opts->ndevices, n);
  cuda_backend *cb = kiln_calloc(1, sizeof *cb);
  if (cb == NULL) return kiln_status_set(st, KILN_ENOMEM, "cuda", "out of memory");
  int rc = env_bytes("KILN_CUDA_MEMORY_BYTES", &cb->budget, st);
  if (rc) {
    kiln_free(cb);
    return rc;
  }
  cb->max_temp_bytes = opts->max_temp_bytes;
  cb->coll_seconds = DEFAULT_COLL_SECONDS;
  const char *cs = getenv("KILN_NCCL_TIMEOUT");
  if (cs && cs[0]) {
    char *end;
    double v = strtod(cs, &end);
    if (*end || !(v > 0) || v > 86400) {
      kiln_free(cb);
      return kiln_status_set(st, KILN_EINVAL, "cuda",
                             "KILN_NCCL_TIMEOUT=%.32s: expected seconds in (0, 86400]", cs);
    }
    cb->coll_seconds = v;
  }
  pthread_mutex_init(&cb->comm_mu, NULL);
  b->ctx = cb;
  *ndevices = opts->ndevices ? opts->ndevices : n;
  return 0;
}

static void groups_free(nccl_group *g);

static void kiln_cuda_fini(kiln_backend *b) {
  cuda_backend *cb = b->ctx;
  groups_free(cb->groups);
  groups_free(cb->graveyard);
  pthread_mutex_destroy(&cb->comm_mu);
  kiln_free(cb);
}

static int raw_alloc(void *ctx, uint64_t bytes, uint64_t *ptr, kiln_status *st) {
  cuda_dev *d = ctx;
  CUdeviceptr p = 0;
  int rc = CK(d, d->api->mem_alloc(&p, (size_t)bytes), "cuMemAlloc_v2", st);
  *ptr = rc ? 0 : (uint64_t)p;
  return rc;
}

static void raw_free(void *ctx, uint64_t ptr) {
  cuda_dev *d = ctx;
  d->api->mem_free((CUdeviceptr)ptr);
}

/* Undoes device_init, whatever part of it was done. */
static void dev_destroy(cuda_dev *d) {
  if (d == NULL) return;
  if (d->ctx && ctx_enter(d, NULL) == 0) {
    kiln__cublas_destroy(d->blas);
    if (d->alloc_init) {
      kiln__cuda_allocator_put(&d->alloc, d->workspace);
      kiln__cuda_allocator_fini(&d->alloc);
    }
    if (d->stage) d->api->mem_free_host(d->stage);
    if (d->small) d->api->mem_free_host(d->small);
    if (d->done) d->api->event_destroy(d->done);
    if (d->copy) d->api->stream_destroy(d->copy);
    if (d->compute) d->api->stream_destroy(d->compute);
    ctx_leave(d);
  }
  if (d->ctx) d->api->primary_ctx_release(d->dev);
  pthread_mutex_destroy(&d->copy_mu);
  pthread_mutex_destroy(&d->run_mu);
  kiln_free(d);
}

static int dev_open(cuda_dev *d, uint32_t index, const cuda_backend *cb, kiln_status *st) {
  const kiln__cuda_api *a = d->api;
  int rc = CK(d, a->device_get(&d->dev, (int)index), "cuDeviceGet", st);
  if (rc == 0)
    rc = CK(
        d, a->device_get_attribute(&d->major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->dev),
        "cuDeviceGetAttribute", st);
  if (rc == 0)
    rc = CK(
        d, a->device_get_attribute(&d->minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->dev),
        "cuDeviceGetAttribute", st);
  if (rc == 0)
    rc = CK(d, a->device_get_attribute(&d->nsm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d->dev),
            "cuDeviceGetAttribute", st);
  size_t total = 0;
  if (rc == 0) rc = CK(d, a->device_total_mem(&total, d->dev), "cuDeviceTotalMem_v2", st);
  d->total_memory = (uint64_t)total;
  if (rc == 0) rc = CK(d, a->primary_ctx_retain(&d->ctx, d->dev), "cuDevicePrimaryCtxRetain", st);
  if (rc) {
    d->ctx = NULL;
    return rc;
  }
  if ((rc = ctx_enter(d, st)) != 0) return rc;
  rc = CK(d, a->stream_create(&d->compute, CU_STREAM_NON_BLOCKING), "cuStreamCreate", st);
  if (rc == 0) rc = CK(d, a->stream_create(&d->copy, CU_STREAM_NON_BLOCKING), "cuStreamCreate", st);
  if (rc == 0) rc = CK(d, a->event_create(&d->done, CU_EVENT_DISABLE_TIMING), "cuEventCreate", st);
  if (rc == 0) rc = CK(d, a->mem_host_alloc(&d->stage, STAGE_BYTES, 0), "cuMemHostAlloc", st);
  if (rc == 0) rc = CK(d, a->mem_host_alloc(&d->small, 64, 0), "cuMemHostAlloc", st);
  ctx_leave(d);
  if (rc) return rc;
  uint64_t budget = cb->budget;
  if (budget == 0) {
    budget = (uint64_t)total / 10 * 9;
    snprintf(d->budget_name, sizeof d->budget_name,
             "the device memory budget (90%% of the GPU's; env KILN_CUDA_MEMORY_BYTES)");
  } else {
    snprintf(d->budget_name, sizeof d->budget_name,
             "the device memory budget (KILN_CUDA_MEMORY_BYTES)");
  }
  d->max_temp_bytes = cb->max_temp_bytes ? cb->max_temp_bytes : budget;
  kiln__cuda_allocator_init(&d->alloc, budget, raw_alloc, raw_free, d, d->where, d->budget_name);
  d->alloc_init = true;
  return 0;
}

static int kiln_cuda_device_init(kiln_device *dv, kiln_status *st) {
  const kiln__cuda_api *api = kiln__cuda_api_get(st);
  if (api == NULL) return kiln_status_set(st, KILN_EUNAVAIL, "cuda", "no CUDA driver");
  cuda_dev *d = kiln_calloc(1, sizeof *d);
  if (d == NULL) return kiln_status_set(st, KILN_ENOMEM, "cuda", "out of memory");
  d->api = api;
  d->cb = dv->backend->ctx;
  d->dv = dv;
  pthread_mutex_init(&d->copy_mu, NULL);
  pthread_mutex_init(&d->run_mu, NULL);
  snprintf(d->where, sizeof d->where, "cuda:%u", dv->index);
  int rc = dev_open(d, dv->index, dv->backend->ctx, st);
  if (rc) {
    dev_destroy(d);
    return rc;
  }
  dv->ctx = d;
  dv->nthreads = 1;
  return 0;
}

static void groups_drop_device(cuda_backend *cb, CUdevice dev);

static void kiln_cuda_device_fini(kiln_device *dv) {
  cuda_dev *d = dv->ctx;
  if (d && d->ctx) groups_drop_device(d->cb, d->dev);
  dev_destroy(dv->ctx);
  dv->ctx = NULL;
}

static int kiln_cuda_synchronize(kiln_device *dv, kiln_status *st) {
  cuda_dev *d = dv->ctx;
  int rc = ctx_enter(d, st);
  if (rc) return rc;
  rc = CK(d, d->api->stream_synchronize(d->compute), "cuStreamSynchronize", st);
  if (rc == 0) rc = CK(d, d->api->stream_synchronize(d->copy), "cuStreamSynchronize", st);
  ctx_leave(d);
  return rc;
}

/* ---- memory ---------------------------------------------------------------- */

/* A block from the allocator, context current. */
static int dev_get(cuda_dev *d, uint64_t bytes, kiln__cuda_block **out, kiln_status *st) {
  return kiln__cuda_allocator_get(&d->alloc, bytes, out, st);
}

static int kiln_cuda_buffer_alloc(kiln_device *dv, size_t bytes, void **mem, kiln_status *st) {
  cuda_dev *d = dv->ctx;
  kiln__cuda_block *b = NULL;
  int rc = ctx_enter(d, st);
  if (rc) return rc;
  rc = dev_get(d, bytes, &b, st);
  if (rc == 0 && bytes > 0) { /* zero-filled, as the vtable promises */
    pthread_mutex_lock(&d->copy_mu);
    rc = CK(d, d->api->memset_d8_async((CUdeviceptr)b->ptr, 0, bytes, d->copy), "cuMemsetD8Async",
            st);
    if (rc == 0) rc = CK(d, d->api->stream_synchronize(d->copy), "cuStreamSynchronize", st);
    pthread_mutex_unlock(&d->copy_mu);
  }
  ctx_leave(d);
  if (rc) {
    kiln__cuda_allocator_put(&d->alloc, b);
    return rc;
  }
  *mem = b;
  return 0;
}

static void kiln_cuda_buffer_free(kiln_device *dv, void *mem) {
  cuda_dev *d = dv->ctx;
  kiln__cuda_allocator_put(&d->alloc, mem);
}

/* Host -> device through the staging buffer; context current. */
static int upload(cuda_dev *d, uint64_t dst, const void *src, size_t n, kiln_status *st) {
  int rc = 0;
  pthread_mutex_lock(&d->copy_mu);
  for (size_t done = 0; done < n && rc == 0;) {
    size_t m = n - done < STAGE_BYTES ? n - done : STAGE_BYTES;
    memcpy(d->stage, (const char *)src + done, m);
    rc = CK(d, d->api->memcpy_htod_async((CUdeviceptr)(dst + done), d->stage, m, d->copy),
            "cuMemcpyHtoDAsync_v2", st);
    if (rc == 0) rc = CK(d, d->api->stream_synchronize(d->copy), "cuStreamSynchronize", st);
    done += m;
  }
  pthread_mutex_unlock(&d->copy_mu);
  return rc;
}

/* Device -> host through the staging buffer; context current. */
static int download(cuda_dev *d, void *dst, uint64_t src, size_t n, kiln_status *st) {
  int rc = 0;
  pthread_mutex_lock(&d->copy_mu);
  for (size_t done = 0; done < n && rc == 0;) {
    size_t m = n - done < STAGE_BYTES ? n - done : STAGE_BYTES;
    rc = CK(d, d->api->memcpy_dtoh_async(d->stage, (CUdeviceptr)(src + done), m, d->copy),
            "cuMemcpyDtoHAsync_v2", st);
    if (rc == 0) rc = CK(d, d->api->stream_synchronize(d->copy), "cuStreamSynchronize", st);
    if (rc == 0) memcpy((char *)dst + done, d->stage, m);
    done += m;
  }
  pthread_mutex_unlock(&d->copy_mu);
  return rc;
}

static int kiln_cuda_buffer_write(kiln_device *dv, void *mem, size_t offset, const void *src,
                                  size_t n, kiln_status *st) {
  cuda_dev *d = dv->ctx;
  const kiln__cuda_block *b = mem;
  int rc = ctx_enter(d, st);
  if (rc) return rc;
  rc = upload(d, b->ptr + offset, src, n, st);
  ctx_leave(d);
  return rc;
}

static int kiln_cuda_buffer_read(kiln_device *dv, const void *mem, size_t offset, void *dst,
                                 size_t n, kiln_status *st) {
  cuda_dev *d = dv->ctx;
  const kiln__cuda_block *b = mem;
  int rc = ctx_enter(d, st);
  if (rc) return rc;
  rc = download(d, dst, b->ptr + offset, n, st);
  ctx_leave(d);
  return rc;
}

static int kiln_cuda_buffer_copy(kiln_device *ddv, void *dst, size_t dst_offset, kiln_device *sdv,
                                 const void *src, size_t src_offset, size_t n, kiln_status *st) {
  cuda_dev *dd = ddv->ctx, *sd = sdv->ctx;
  const kiln__cuda_block *db = dst, *sb = src;
  int rc;
  if (dd != sd) { /* two GPUs: through the host */
    char *tmp = kiln_malloc(n ? n : 1);
    if (tmp == NULL) return kiln_status_set(st, KILN_ENOMEM, "cuda", "copy: out of memory");
    rc = kiln_cuda_buffer_read(sdv, src, src_offset, tmp, n, st);
    if (rc == 0) rc = kiln_cuda_buffer_write(ddv, dst, dst_offset, tmp, n, st);
    kiln_free(tmp);
    return rc;
  }
  if ((rc = ctx_enter(dd, st)) != 0) return rc;
  pthread_mutex_lock(&dd->copy_mu);
  rc = CK(dd,
          dd->api->memcpy_dtod_async((CUdeviceptr)(db->ptr + dst_offset),
                                     (CUdeviceptr)(sb->ptr + src_offset), n, dd->copy),
          "cuMemcpyDtoDAsync_v2", st);
  if (rc == 0) rc = CK(dd, dd->api->stream_synchronize(dd->copy), "cuStreamSynchronize", st);
  pthread_mutex_unlock(&dd->copy_mu);
  ctx_leave(dd);
  return rc;
}

/* ---- loading: the checks ------------------------------------------------- */

static int check_array_shape(const kiln_shape *s, const char *what, uint32_t i, kiln_status *st) {
  if (!kiln_dtype_is_array(s->dtype) || s->dtype >= KILN_DTYPE_COUNT)
    return kiln_status_set(st, KILN_EINVAL, "load", "%s %u: not an array shape", what, i);
  if (s->rank > 0 && s->dims == NULL)
    return kiln_status_set(st, KILN_EINVAL, "load", "%s %u: rank %u without dims", what, i,
                           s->rank);
  if (s->rank > 64)
    return kiln_status_set(st, KILN_ELIMIT, "load", "%s %u: rank %u", what, i, s->rank);
  for (uint32_t d = 0; d < s->rank; d++)
    if (s->dims[d] < 0)
      return kiln_status_set(st, KILN_EINVAL, "load", "%s %u: dim %u is %lld", what, i, d,
                             (long long)s->dims[d]);
  if (kiln_shape_bytes(s) < 0)
    return kiln_status_set(st, KILN_ELIMIT, "load", "%s %u: size overflows", what, i);
  if (s->layout) {
    const kiln_layout *l = s->layout;
    if (l->rank != s->rank || (l->rank > 0 && l->minor_to_major == NULL))
      return kiln_status_set(st, KILN_EINVAL, "load", "%s %u: layout of rank %u for rank %u", what,
                             i, l->rank, s->rank);
    uint64_t seen = 0;
    for (uint32_t d = 0; d < l->rank; d++) {
      int64_t v = l->minor_to_major[d];
      if (v < 0 || v >= (int64_t)s->rank || (seen >> v & 1))
        return kiln_status_set(st, KILN_EINVAL, "load", "%s %u: layout is not a permutation", what,
                               i);
      seen |= UINT64_C(1) << v;
    }
  }
  return 0;
}

/* Array leaves of an entry shape, structure checked; shapes[] (may be NULL)
 * receives them in order. */
static int walk_leaves(const kiln_shape *s, uint32_t depth, uint64_t *n, const kiln_shape **shapes,
                       uint64_t max, kiln_status *st) {
  if (depth > MAX_SHAPE_DEPTH)
    return kiln_status_set(st, KILN_ELIMIT, "load", "entry shape nested deeper than %d",
                           MAX_SHAPE_DEPTH);
  if (s->dtype == KILN_TUPLE) {
    if (s->rank > 0 && s->tuple == NULL)
      return kiln_status_set(st, KILN_EINVAL, "load", "tuple shape without elements");
    for (uint32_t i = 0; i < s->rank; i++) {
      int rc = walk_leaves(&s->tuple[i], depth + 1, n, shapes, max, st);
      if (rc) return rc;
    }
    return 0;
  }
  if (s->dtype == KILN_TOKEN) return 0;
  if (!kiln_dtype_is_array(s->dtype) || s->dtype >= KILN_DTYPE_COUNT)
    return kiln_status_set(st, KILN_EINVAL, "load", "entry shape of element type %d", s->dtype);
  if (shapes && *n < max) shapes[*n] = s;
  (*n)++;
  return 0;
}

/* Bindings b[0..n) against the entry shape's leaves. */
static int check_bindings(const kiln_executable *e, const kiln_binding *b, uint32_t n,
                          const kiln_shape *const *roots, uint32_t nroots, const char *what,
                          kiln_arena *a, kiln_status *st) {
  uint64_t leaves = 0;
  for (uint32_t r = 0; r < nroots; r++) {
    int rc = walk_leaves(roots[r], 0, &leaves, NULL, 0, st);
    if (rc) return rc;
  }
  if (leaves != n)
    return kiln_status_set(st, KILN_EINVAL, "load", "%u %s bindings for %llu leaves", n, what,
                           (unsigned long long)leaves);
  if (n > 0 && b == NULL)
    return kiln_status_set(st, KILN_EINVAL, "load", "%s bindings missing", what);
  const kiln_shape **shapes = kiln_arena_calloc(a, leaves + 1, sizeof *shapes);
  if (shapes == NULL) return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  uint64_t k = 0;
  for (uint32_t r = 0; r < nroots; r++) walk_leaves(roots[r], 0, &k, shapes, leaves, st);
  for (uint32_t i = 0; i < n; i++) {
    int rc = check_array_shape(&b[i].shape, what, i, st);
    if (rc) return rc;
    if (b[i].slot >= e->nslots)
      return kiln_status_set(st, KILN_EINVAL, "load", "%s %u: slot %u out of range (%u slots)",
                             what, i, b[i].slot, e->nslots);
    if (!kiln_shape_equal(shapes[i], &b[i].shape, false))
      return kiln_status_set(st, KILN_EINVAL, "load",
                             "%s leaf %u: binding shape differs from the entry's", what, i);
    if (e->slots[b[i].slot].size != (uint64_t)kiln_shape_bytes(&b[i].shape))
      return kiln_status_set(st, KILN_EINVAL, "load",
                             "%s %u: slot %u has %llu bytes, its shape %lld", what, i, b[i].slot,
                             (unsigned long long)e->slots[b[i].slot].size,
                             (long long)kiln_shape_bytes(&b[i].shape));
  }
  return 0;
}

static bool fits(uint64_t offset, uint64_t size, uint64_t limit) {
  return offset <= limit && size <= limit - offset;
}

static int check_slots(const kiln_executable *e, const cuda_loaded *l, kiln_status *st) {
  if (e->nslots > 0 && e->slots == NULL)
    return kiln_status_set(st, KILN_EINVAL, "load", "%u slots missing", e->nslots);
  if (e->nconstants > 0 && e->constants == NULL)
    return kiln_status_set(st, KILN_EINVAL, "load", "constants blob missing");
  for (uint32_t i = 0; i < e->nslots; i++) {
    const kiln_slot *s = &e->slots[i];
    const kiln_binding *b = NULL;
    switch (s->kind) {
    case KILN_SLOT_TEMP:
      if (!fits(s->offset, s->size, e->temp_bytes))
        return kiln_status_set(st, KILN_EINVAL, "load", "slot %u: outside the %llu-byte arena", i,
                               (unsigned long long)e->temp_bytes);
      break;
    case KILN_SLOT_CONSTANT:
      if (!fits(s->offset, s->size, e->nconstants))
        return kiln_status_set(st, KILN_EINVAL, "load", "slot %u: outside the %llu-byte constants",
                               i, (unsigned long long)e->nconstants);
      break;
    case KILN_SLOT_PARAM: {
      if (s->index >= e->nparams)
        return kiln_status_set(st, KILN_EINVAL, "load", "slot %u: parameter %u of %u", i, s->index,
                               e->nparams);
      uint32_t have = l->leaf_base[s->index + 1] - l->leaf_base[s->index];
      if (s->leaf >= have)
        return kiln_status_set(st, KILN_EINVAL, "load", "slot %u: parameter %u has no leaf %u", i,
                               s->index, s->leaf);
      b = &e->params[l->leaf_base[s->index] + s->leaf];
      break;
    }
    case KILN_SLOT_OUTPUT:
      if (s->index >= e->nresults)
        return kiln_status_set(st, KILN_EINVAL, "load", "slot %u: result leaf %u of %u", i,
                               s->index, e->nresults);
      b = &e->results[s->index];
      break;
    default:
      return kiln_status_set(st, KILN_EINVAL, "load", "slot %u: unknown kind %d", i, s->kind);
    }
    if (b && s->size != (uint64_t)kiln_shape_bytes(&b->shape))
      return kiln_status_set(st, KILN_EINVAL, "load", "slot %u: %llu bytes for a leaf of %lld", i,
                             (unsigned long long)s->size, (long long)kiln_shape_bytes(&b->shape));
  }
  return 0;
}

/* Parameters, results, their bindings and the slots; fills leaf_base and
 * donated. */
static int check_signature(const kiln_executable *e, cuda_loaded *l, kiln_status *st) {
  kiln_arena *a = l->arena;
  if (e->nparams > 0 && e->param_shapes == NULL)
    return kiln_status_set(st, KILN_EINVAL, "load", "%u parameter shapes missing", e->nparams);
  l->leaf_base = kiln_arena_calloc(a, (size_t)e->nparams + 1, sizeof *l->leaf_base);
  l->donated = kiln_arena_calloc(a, (size_t)e->nparam_leaves + 1, sizeof *l->donated);
  const kiln_shape **roots = kiln_arena_calloc(a, (size_t)e->nparams + 1, sizeof *roots);
  if (l->leaf_base == NULL || l->donated == NULL || roots == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  uint64_t leaves = 0;
  for (uint32_t p = 0; p < e->nparams; p++) {
    l->leaf_base[p] = (uint32_t)leaves;
    roots[p] = &e->param_shapes[p];
    int rc = walk_leaves(&e->param_shapes[p], 0, &leaves, NULL, 0, st);
    if (rc) return rc;
    if (leaves > UINT32_MAX)
      return kiln_status_set(st, KILN_ELIMIT, "load", "too many parameter leaves");
  }
  l->leaf_base[e->nparams] = (uint32_t)leaves;
  int rc = check_bindings(e, e->params, e->nparam_leaves, roots, e->nparams, "parameter", a, st);
  const kiln_shape *rroot = &e->result_shape;
  if (rc == 0) rc = check_bindings(e, e->results, e->nresults, &rroot, 1, "result", a, st);
  if (rc == 0) rc = check_slots(e, l, st);
  if (rc) return rc;
  for (uint32_t i = 0; i < e->nresults; i++) {
    const kiln_slot *s = &e->slots[e->results[i].slot];
    if (s->kind == KILN_SLOT_PARAM) l->donated[l->leaf_base[s->index] + s->leaf] = true;
  }
  return 0;
}

static bool slot_writable(const kiln_executable *e, const cuda_loaded *l, uint32_t slot) {
  const kiln_slot *s = &e->slots[slot];
  if (s->kind == KILN_SLOT_PARAM) return l->donated[l->leaf_base[s->index] + s->leaf];
  return s->kind == KILN_SLOT_TEMP || s->kind == KILN_SLOT_OUTPUT;
}

/* A collective step: the executable's own checks (kiln_coll_check), its
 * results writable, and a reduction NCCL can do; groups of more than one
 * device need libnccl. */
static int check_coll_step(const kiln_executable *e, const cuda_loaded *l, const kiln_step *s,
                           const char *w, kiln_status *st) {
  const kiln_coll *c = &s->coll;
  const char *why = kiln_coll_check(c, s->nargs, e->slots, s->args);
  if (why) return kiln_status_set(st, KILN_EINVAL, w, "collective: %s", why);
  for (uint32_t i = c->nops; i < s->nargs; i++)
    if (!slot_writable(e, l, s->args[i]))
      return kiln_status_set(st, KILN_EINVAL, w,
                             "collective writes slot %u, a parameter or constant", s->args[i]);
  const char *name = kiln_opcode_name((kiln_opcode)c->op);
  ncclDataType_t t;
  ncclRedOp_t op;
  switch (c->op) {
  case KILN_OP_REPLICA_ID:
  case KILN_OP_PARTITION_ID: return 0;
  case KILN_OP_ALL_REDUCE:
  case KILN_OP_REDUCE_SCATTER:
    if (!kiln__nccl_dtype((int)c->dtype, (int)c->reduce, &t, &op))
      return kiln_status_set(st, KILN_EUNIMPL, w,
                             "%s: NCCL cannot reduce %s with %s (it sums, multiplies, takes the "
                             "maximum or minimum of s8, u8, s32, u32, s64, u64, f16, bf16, f32 "
                             "and f64, and and/or of pred); run this program on a cpu target",
                             name, kiln_dtype_name((kiln_dtype)c->dtype),
                             kiln_opcode_name((kiln_opcode)c->reduce));
    break;
  case KILN_OP_ALL_GATHER:
  case KILN_OP_ALL_TO_ALL:
  case KILN_OP_COLLECTIVE_PERMUTE:
  case KILN_OP_COLLECTIVE_BROADCAST: break;
  default:
    return kiln_status_set(st, KILN_EUNIMPL, w, "collective %s does not run on the cuda backend",
                           name);
  }
  if (c->gsize > KILN_CUDA_MAX_DEVICES)
    return kiln_status_set(st, KILN_ELIMIT, w, "%s: groups of %u devices (at most %d)", name,
                           c->gsize, KILN_CUDA_MAX_DEVICES);
  if (c->gsize > 1) {
    kiln_status ns;
    kiln_status_clear(&ns);
    if (kiln__nccl_api_get(&ns) == NULL)
      return kiln_status_set(st, KILN_EUNAVAIL, w, "%s between %u devices needs NCCL: %s", name,
                             c->gsize, ns.msg);
  }
  return 0;
}

/* ---- loading: GEMM steps ------------------------------------------------ */

/* A GEMM step as cuBLASLt will read it: element types it runs, sizes it
 * takes (int32 dims and batch count), each operand's leading dimension and
 * extent within its slot, C's batches apart and writable, the epilogue's
 * kernel. Integer GEMMs are refused: the cuda target lowers integer dots
 * to kernels, so only a foreign executable has them. */
static int check_gemm(const kiln_executable *e, const cuda_loaded *l, const kiln_step *s,
                      const char *w, kiln_status *st) {
  const kiln_gemm *g = &s->gemm;
  if (s->nargs < 3)
    return kiln_status_set(st, KILN_EINVAL, w,
                           "gemm takes 3 slots (A, B, C) and its epilogue's, %u given", s->nargs);
  if (g->dtype == KILN_S8 || g->dtype == KILN_U8)
    return kiln_status_set(st, KILN_EUNIMPL, w,
                           "integer GEMM steps do not run on cuda (the cuda target compiles "
                           "integer dots to kernels: this step was not made by it)");
  if (g->dtype != KILN_F32 && g->dtype != KILN_F64 && g->dtype != KILN_BF16)
    return kiln_status_set(st, KILN_EUNIMPL, w,
                           "gemm of element type %d (f32, f64 and bf16 into f32 run on cuda)",
                           g->dtype);
  if (g->batch < 0 || g->m < 0 || g->n < 0 || g->k < 0 || g->m > INT32_MAX || g->n > INT32_MAX ||
      g->k > INT32_MAX || g->batch > INT32_MAX)
    return kiln_status_set(st, KILN_EINVAL, w, "gemm batch %lld, m %lld, n %lld, k %lld",
                           (long long)g->batch, (long long)g->m, (long long)g->n, (long long)g->k);
  bool empty = g->batch == 0 || g->m == 0 || g->n == 0;
  if (g->k == 0 && !empty)
    return kiln_status_set(st, KILN_EUNIMPL, w,
                           "a GEMM with an empty contraction (k 0) does not run on cuda");
  if (!isfinite(g->alpha) || !isfinite(g->beta))
    return kiln_status_set(st, KILN_EINVAL, w, "gemm alpha %g, beta %g", g->alpha, g->beta);
  char why[160];
  if (!kiln_gemm_check_extents(g, s->args, e->slots, why, sizeof why))
    return kiln_status_set(st, KILN_EINVAL, w, "%s", why);
  if (!empty && !slot_writable(e, l, s->args[2]))
    return kiln_status_set(st, KILN_EINVAL, w, "gemm writes slot %u, a parameter or constant",
                           s->args[2]);
  if (s->nargs > 3 && (s->kernel >= e->nkernels || s->range > (uint64_t)INT64_MAX))
    return kiln_status_set(st, KILN_EINVAL, w,
                           "gemm epilogue kernel %u out of range (%u kernels), range %llu",
                           s->kernel, e->nkernels, (unsigned long long)s->range);
  return 0;
}

static int check_step(const kiln_executable *e, const cuda_loaded *l, const kiln_step *s,
                      const char *w, kiln_status *st) {
  if (s->nargs > MAX_STEP_ARGS || (s->nargs > 0 && s->args == NULL))
    return kiln_status_set(st, KILN_EINVAL, w, "%u slot ids", s->nargs);
  if (s->nsub > 0 && s->sub == NULL)
    return kiln_status_set(st, KILN_EINVAL, w, "%u sub-programs missing", s->nsub);
  for (uint32_t i = 0; i < s->nargs; i++)
    if (s->args[i] >= e->nslots)
      return kiln_status_set(st, KILN_EINVAL, w, "argument %u: slot %u out of range (%u slots)", i,
                             s->args[i], e->nslots);
  for (uint32_t i = 0; i < s->nsub; i++)
    if (s->sub[i] >= e->nprograms)
      return kiln_status_set(st, KILN_EINVAL, w, "sub-program %u out of range (%u programs)",
                             s->sub[i], e->nprograms);
  switch (s->kind) {
  case KILN_STEP_KERNEL:
    if (s->kernel >= e->nkernels)
      return kiln_status_set(st, KILN_EINVAL, w, "kernel %u out of range (%u kernels)", s->kernel,
                             e->nkernels);
    if (s->range > (uint64_t)INT64_MAX)
      return kiln_status_set(st, KILN_EINVAL, w, "range %llu", (unsigned long long)s->range);
    return 0;
  case KILN_STEP_COPY:
    if (s->nargs != 2)
      return kiln_status_set(st, KILN_EINVAL, w, "copy takes 2 slots, %u given", s->nargs);
    for (int i = 0; i < 2; i++)
      if (s->range > e->slots[s->args[i]].size)
        return kiln_status_set(st, KILN_EINVAL, w, "copy of %llu bytes, slot %u has %llu",
                               (unsigned long long)s->range, s->args[i],
                               (unsigned long long)e->slots[s->args[i]].size);
    if (s->range > 0 && !slot_writable(e, l, s->args[0]))
      return kiln_status_set(st, KILN_EINVAL, w, "copy writes slot %u, a parameter or constant",
                             s->args[0]);
    return 0;
  case KILN_STEP_WHILE:
    if (s->nsub != 2 || s->nargs < 1)
      return kiln_status_set(st, KILN_EINVAL, w,
                             "while takes 2 programs and a predicate slot, has %u and %u", s->nsub,
                             s->nargs);
    if (e->slots[s->args[0]].size < 1)
      return kiln_status_set(st, KILN_EINVAL, w, "while predicate slot %u is empty", s->args[0]);
    return 0;
  case KILN_STEP_CONDITIONAL: {
    if (s->nsub < 1 || s->nargs < 1)
      return kiln_status_set(st, KILN_EINVAL, w,
                             "conditional takes branches and a selector slot, has %u and %u",
                             s->nsub, s->nargs);
    uint64_t size = e->slots[s->args[0]].size;
    if (size != 1 && size != 4)
      return kiln_status_set(st, KILN_EINVAL, w,
                             "selector slot %u has %llu bytes (1 for pred, 4 for s32)", s->args[0],
                             (unsigned long long)size);
    return 0;
  }
  case KILN_STEP_CALL:
    if (s->nsub != 1)
      return kiln_status_set(st, KILN_EINVAL, w, "call takes 1 program, has %u", s->nsub);
    return 0;
  case KILN_STEP_DEBUG_PRINT: {
    kiln_debug_record rec;
    char why[160];
    if (s->nargs != 2 || e->slots[s->args[1]].kind != KILN_SLOT_CONSTANT)
      return kiln_status_set(st, KILN_EINVAL, w, "debug print takes a value and a constant record");
    const kiln_slot *rs = &e->slots[s->args[1]];
    if (!kiln_debug_record_read(e->constants + rs->offset, rs->size, e->slots[s->args[0]].size,
                                &rec, why, sizeof why))
      return kiln_status_set(st, KILN_EINVAL, w, "%s", why);
    return 0;
  }
  case KILN_STEP_COLLECTIVE: return check_coll_step(e, l, s, w, st);
  case KILN_STEP_GEMM: return check_gemm(e, l, s, w, st);
  case KILN_STEP_CONV:
  case KILN_STEP_FFT:
  case KILN_STEP_LINALG:
    return kiln_status_set(st, KILN_EUNIMPL, w,
                           "the cuda backend does not run %s steps yet (convolutions, FFTs "
                           "and LAPACK are not built); run this program on a cpu target",
                           step_names[s->kind]);
  }
  return kiln_status_set(st, KILN_EINVAL, w, "unknown step kind %d", s->kind);
}

/* No cycles, bounded nesting (state: 0 unseen, 1 on the path, 2 done). */
static int check_nesting(const kiln_executable *e, uint32_t p, uint32_t depth, uint8_t *state,
                         uint32_t *height, kiln_status *st) {
  if (state[p] == 1)
    return kiln_status_set(st, KILN_EINVAL, "load", "program %u runs itself (a cycle)", p);
  if (state[p] == 2) {
    if (depth + height[p] > MAX_NESTING) goto too_deep;
    return 0;
  }
  if (depth > MAX_NESTING) goto too_deep;
  state[p] = 1;
  uint32_t h = 0;
  const kiln_program *pr = &e->programs[p];
  for (uint32_t i = 0; i < pr->nsteps; i++)
    for (uint32_t j = 0; j < pr->steps[i].nsub; j++) {
      uint32_t q = pr->steps[i].sub[j];
      int rc = check_nesting(e, q, depth + 1, state, height, st);
      if (rc) return rc;
      if (height[q] + 1 > h) h = height[q] + 1;
    }
  state[p] = 2;
  height[p] = h;
  return 0;
too_deep:
  return kiln_status_set(st, KILN_ELIMIT, "load", "programs nest deeper than %d", MAX_NESTING);
}

static int check_programs(const kiln_executable *e, cuda_loaded *l, kiln_status *st) {
  kiln_arena *a = l->arena;
  if (e->nprograms == 0 || e->programs == NULL)
    return kiln_status_set(st, KILN_EINVAL, "load", "no entry program");
  if (e->nkernels > MAX_KERNELS)
    return kiln_status_set(st, KILN_ELIMIT, "load", "%u kernels (at most %u)", e->nkernels,
                           MAX_KERNELS);
  l->argv_base = kiln_arena_calloc(a, e->nprograms, sizeof *l->argv_base);
  uint8_t *state = kiln_arena_calloc(a, e->nprograms, 1);
  uint32_t *height = kiln_arena_calloc(a, e->nprograms, sizeof *height);
  if (l->argv_base == NULL || state == NULL || height == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  uint64_t nargv = 0;
  for (uint32_t p = 0; p < e->nprograms; p++) {
    const kiln_program *pr = &e->programs[p];
    if (pr->nsteps > 0 && pr->steps == NULL)
      return kiln_status_set(st, KILN_EINVAL, "load", "program %u: steps missing", p);
    l->argv_base[p] = kiln_arena_calloc(a, (size_t)pr->nsteps + 1, sizeof(uint64_t));
    if (l->argv_base[p] == NULL) return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
    for (uint32_t i = 0; i < pr->nsteps; i++) {
      const kiln_step *s = &pr->steps[i];
      char w[96];
      unsigned kind = (unsigned)s->kind;
      snprintf(w, sizeof w, "program %u step %u (%s)", p, i,
               kind < sizeof step_names / sizeof step_names[0] ? step_names[kind] : "?");
      int rc = check_step(e, l, s, w, st);
      if (rc) return rc;
      l->argv_base[p][i] = nargv;
      nargv += s->nargs;
      if (nargv > (UINT64_C(1) << 28))
        return kiln_status_set(st, KILN_ELIMIT, "load", "too many step arguments");
    }
  }
  l->nargv = nargv;
  return check_nesting(e, 0, 0, state, height, st);
}

static int check_header(const cuda_dev *d, const kiln_executable *e, kiln_status *st) {
  if (e->format_version != KILN_EXE_FORMAT_VERSION)
    return kiln_status_set(st, KILN_EINVAL, "load",
                           "executable format version %u, this executor runs version %u",
                           e->format_version, KILN_EXE_FORMAT_VERSION);
  if (e->target == NULL || e->target[0] == '\0')
    return kiln_status_set(st, KILN_EINVAL, "load", "executable names no target");
  const kiln_target *t;
  if (kiln_target_resolve("cuda", e->target, &t, NULL))
    return kiln_status_set(st, KILN_EINVAL, "load",
                           "executable compiled for target '%.64s', not a cuda target", e->target);
  int major = 0, minor = 0;
  if (!kiln__cuda_arch_parse(t->isa, &major, &minor))
    return kiln_status_set(st, KILN_EINVAL, "load", "target %s names no sm architecture", t->name);
  if (!kiln__cuda_arch_runs(major, minor, d->major, d->minor))
    return kiln_status_set(st, KILN_EUNIMPL, "load",
                           "executable compiled for %s (%s), this GPU is sm_%d%d: compile for "
                           "cuda-sm_%d%d",
                           t->name, t->isa, d->major, d->minor, d->major, d->minor);
  if (e->code_kind != KILN_CODE_CUBIN)
    return kiln_status_set(st, KILN_EINVAL, "load", "the code object is not a cubin (kind %u)",
                           e->code_kind);
  if (e->dyn)
    return kiln_status_set(st, KILN_EUNIMPL, "load",
                           "bounded-dynamic programs do not run on the cuda backend");
  char why[160];
  if (e->nkernels > 0 && !kiln__cuda_cubin_check(e->code, e->ncode, why, sizeof why))
    return kiln_status_set(st, KILN_EINVAL, "load", "%u kernels: %s", e->nkernels, why);
  if (e->temp_bytes > d->max_temp_bytes)
    return kiln_status_set(
        st, KILN_ELIMIT, "load", "executable needs a %llu-byte temporary arena, the limit is %llu",
        (unsigned long long)e->temp_bytes, (unsigned long long)d->max_temp_bytes);
  return 0;
}

/* ---- loading: the module ------------------------------------------------- */

static int load_code(cuda_loaded *l, kiln_status *st) {
  const kiln_executable *e = l->exe;
  cuda_dev *d = l->dev;
  const kiln__cuda_api *a = d->api;
  int rc = 0;
  if (e->nconstants > 0) {
    rc = dev_get(d, e->nconstants, &l->consts, st);
    if (rc == 0) rc = upload(d, l->consts->ptr, e->constants, e->nconstants, st);
    if (rc) return rc;
  }
  if (e->nkernels == 0) return 0;
  l->fns = kiln_arena_calloc(l->arena, e->nkernels, sizeof *l->fns);
  l->max_block = kiln_arena_calloc(l->arena, e->nkernels, sizeof *l->max_block);
  l->coop = kiln_arena_calloc(l->arena, e->nkernels, sizeof *l->coop);
  if (l->fns == NULL || l->max_block == NULL || l->coop == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  /* cuModuleLoadData reads an ELF image without a length: check_header
   * made sure its headers and sections lie within the bytes we have. */
  if ((rc = CK(d, a->module_load_data(&l->module, e->code), "cuModuleLoadData", st)) != 0) {
    l->module = NULL;
    return rc;
  }
  for (uint32_t i = 0; i < e->nkernels && rc == 0; i++) {
    char name[32];
    snprintf(name, sizeof name, "kiln_kernel_%u", i);
    rc = CK(d, a->module_get_function(&l->fns[i], l->module, name), "cuModuleGetFunction", st);
    if (rc) {
      kiln_status_set(st, rc, "load", "the cubin has no %s", name);
      break;
    }
    int most = 0;
    rc = CK(d, a->func_get_attribute(&most, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, l->fns[i]),
            "cuFuncGetAttribute", st);
    l->max_block[i] = most > 0 ? (uint32_t)most : 32;
    int shared = 0;
    if (rc == 0)
      rc = CK(d, a->func_get_attribute(&shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, l->fns[i]),
              "cuFuncGetAttribute", st);
    l->coop[i] = shared > 0;
  }
  return rc;
}

/* ---- loading: GEMM plans ------------------------------------------------- */

/* The device's cuBLASLt handle and GEMM workspace, made once; context
 * current. The workspace is what cuBLASLt's fastest kernels ask for on
 * this architecture, within a sixteenth of the budget. */
static int blas_open(cuda_dev *d, kiln_status *st) {
  int rc = 0;
  pthread_mutex_lock(&d->run_mu);
  if (d->blas == NULL) {
    uint64_t ws = d->major >= 9 ? KILN__CUBLAS_WORKSPACE_SM90 : KILN__CUBLAS_WORKSPACE;
    if (ws > d->alloc.budget / 16) ws = d->alloc.budget / 16 / 256 * 256;
    if (ws > 0) rc = dev_get(d, ws, &d->workspace, st);
    if (rc == 0) rc = kiln__cublas_create(d->where, &d->blas, st);
    if (rc) {
      kiln__cuda_allocator_put(&d->alloc, d->workspace);
      d->workspace = NULL;
    } else {
      d->workspace_bytes = ws;
    }
  }
  pthread_mutex_unlock(&d->run_mu);
  return rc;
}

/* The alignment in bytes (a power of two, at most 256) that slot's device
 * address, and every batch's matrix `stride` elements on, is known to
 * have: blocks of the allocator are 256-byte aligned; arena and constant
 * slots lie at their offset in one. */
static uint32_t slot_align(const kiln_executable *e, uint32_t slot, int64_t batch, int64_t stride,
                           size_t esize) {
  const kiln_slot *s = &e->slots[slot];
  uint64_t bits = 256;
  if (s->kind == KILN_SLOT_TEMP || s->kind == KILN_SLOT_CONSTANT) bits |= s->offset;
  if (batch > 1) bits |= (uint64_t)stride * esize;
  return (uint32_t)(bits & (~bits + 1));
}

/* Every non-empty GEMM step planned (context current). */
static int plan_gemms(cuda_loaded *l, kiln_status *st) {
  const kiln_executable *e = l->exe;
  cuda_dev *d = l->dev;
  bool opened = false;
  l->tf32 = kiln__cublas_tf32_from_env();
  l->plans = kiln_arena_calloc(l->arena, e->nprograms, sizeof *l->plans);
  if (l->plans == NULL) return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  for (uint32_t p = 0; p < e->nprograms; p++) {
    const kiln_program *pr = &e->programs[p];
    l->plans[p] = kiln_arena_calloc(l->arena, (size_t)pr->nsteps + 1, sizeof *l->plans[p]);
    if (l->plans[p] == NULL) return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
    for (uint32_t i = 0; i < pr->nsteps; i++) {
      const kiln_step *s = &pr->steps[i];
      const kiln_gemm *g = &s->gemm;
      if (s->kind != KILN_STEP_GEMM || g->batch == 0 || g->m == 0 || g->n == 0) continue;
      int rc = opened ? 0 : blas_open(d, st);
      if (rc) return rc;
      opened = true;
      size_t es = kiln_dtype_size(g->dtype), esc = g->dtype == KILN_BF16 ? 4 : es;
      uint32_t align[3] = {slot_align(e, s->args[0], g->batch, g->stride_a, es),
                           slot_align(e, s->args[1], g->batch, g->stride_b, es),
                           slot_align(e, s->args[2], g->batch, g->stride_c, esc)};
      char w[96];
      snprintf(w, sizeof w, "program %u step %u (gemm %lldx%lldx%lld, batch %lld)", p, i,
               (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch);
      rc = kiln__cublas_plan_create(d->blas, g, l->tf32, align, d->workspace_bytes, w,
                                    &l->plans[p][i], st);
      if (rc) return rc;
    }
  }
  return 0;
}

static void loaded_free(cuda_loaded *l) {
  if (l == NULL) return;
  cuda_dev *d = l->dev;
  if ((l->module || l->consts || l->plans) && ctx_enter(d, NULL) == 0) {
    for (uint32_t p = 0; l->plans && p < l->exe->nprograms; p++)
      for (uint32_t i = 0; l->plans[p] && i < l->exe->programs[p].nsteps; i++)
        kiln__cublas_plan_destroy(l->plans[p][i]);
    if (l->module) d->api->module_unload(l->module);
    ctx_leave(d);
  }
  kiln__cuda_allocator_put(&d->alloc, l->consts);
  kiln_arena_destroy(l->arena);
}

static int kiln_cuda_load(kiln_loaded *ld, kiln_status *st) {
  cuda_dev *d = ld->device->ctx;
  const kiln_executable *e = ld->exe;
  int rc = check_header(d, e, st);
  if (rc) return rc;
  kiln_arena *a = kiln_arena_create();
  cuda_loaded *l = a ? kiln_arena_calloc(a, 1, sizeof *l) : NULL;
  if (l == NULL) {
    kiln_arena_destroy(a);
    return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  }
  l->arena = a;
  l->exe = e;
  l->dev = d;
  if ((rc = check_signature(e, l, st)) || (rc = check_programs(e, l, st))) {
    loaded_free(l);
    return rc;
  }
  if ((rc = ctx_enter(d, st)) == 0) {
    rc = load_code(l, st);
    if (rc == 0) rc = plan_gemms(l, st);
    ctx_leave(d);
  }
  if (rc) {
    loaded_free(l);
    return rc;
  }
  ld->ctx = l;
  return 0;
}

static void kiln_cuda_unload(kiln_loaded *ld) {
  loaded_free(ld->ctx);
  ld->ctx = NULL;
}

/* ---- running ---------------------------------------------------------------- */

typedef struct run_ctx {
  cuda_loaded *l;
  cuda_dev *d;
  uint64_t *slot;    /* nslots device addresses */
  uint64_t *argv;    /* nargv: the host copy of the argument vector */
  uint64_t argv_dev; /* its device copy */
  uint64_t max_iterations;
  double deadline;
  const atomic_int *cancel;
  const kiln_debug_sink *debug;
  const kiln_step_observer *observer;
  const kiln__gang_rank *gang; /* a gang launch's rank, or NULL */
  kiln_status *st;
} run_ctx;

static int run_program(run_ctx *r, uint32_t p);

static int check_deadline(run_ctx *r) {
  if (r->cancel && atomic_load_explicit(r->cancel, memory_order_relaxed))
    return kiln_status_set(r->st, KILN_ECANCELED, "run", "cancelled");
  if (r->deadline > 0 && now_seconds() > r->deadline)
    return kiln_status_set(r->st, KILN_ELIMIT, "run", "time limit exceeded");
  return 0;
}

/* Kernel `kernel` over [0, range), its slots' addresses at entry `base`
 * of the argument vector. */
static int launch(run_ctx *r, uint32_t kernel, uint64_t range, uint64_t base) {
  cuda_dev *d = r->d;
  uint32_t grid, block;
  kiln__cuda_grid(range, (uint32_t)d->nsm, r->l->max_block[kernel], &grid, &block);
  if (grid == 0) return 0;
  if (r->l->coop[kernel]) { /* a cooperative kernel (cuda_target.c): a block per iteration */
    uint64_t cap = (uint64_t)(d->nsm > 0 ? d->nsm : 1) * 32;
    grid = (uint32_t)(range < cap ? range : cap);
    block = r->l->max_block[kernel] >= 256 ? 256 : r->l->max_block[kernel] / 32 * 32;
    if (block == 0) block = 32;
  }
  CUdeviceptr bufs = (CUdeviceptr)(r->argv_dev + base * sizeof(uint64_t));
  int64_t begin = 0, end = (int64_t)range;
  void *params[] = {&bufs, &begin, &end};
  return CK(d,
            d->api->launch_kernel(r->l->fns[kernel], grid, 1, 1, block, 1, 1, 0, d->compute, params,
                                  NULL),
            "cuLaunchKernel", r->st);
}

static int run_kernel(run_ctx *r, const kiln_step *s, uint64_t base) {
  return launch(r, s->kernel, s->range, base);
}

/* The product (nothing for an empty one: no plan), then its epilogue, a
 * kernel over C with the step's arguments from the fourth on: cuBLASLt's
 * own epilogues would need the step to say what its kernel computes. */
static int run_gemm(run_ctx *r, const kiln_step *s, const kiln__cublas_plan *plan, uint64_t base) {
  cuda_dev *d = r->d;
  int rc = 0;
  if (plan)
    rc = kiln__cublas_plan_run(plan, r->argv[base], r->argv[base + 1], r->argv[base + 2],
                               d->workspace ? d->workspace->ptr : 0, d->compute, d->where, r->st);
  if (rc == 0 && s->nargs > 3) rc = launch(r, s->kernel, s->range, base + 3);
  return rc;
}

static int run_copy(run_ctx *r, uint64_t dst, uint64_t src, uint64_t bytes) {
  cuda_dev *d = r->d;
  if (bytes == 0 || dst == src) return 0;
  if (dst < src + bytes && src < dst + bytes) { /* overlapping: through a scratch block */
    kiln__cuda_block *t = NULL;
    int rc = dev_get(d, bytes, &t, r->st);
    if (rc == 0)
      rc =
          CK(d, d->api->memcpy_dtod_async((CUdeviceptr)t->ptr, (CUdeviceptr)src, bytes, d->compute),
             "cuMemcpyDtoDAsync_v2", r->st);
    if (rc == 0)
      rc =
          CK(d, d->api->memcpy_dtod_async((CUdeviceptr)dst, (CUdeviceptr)t->ptr, bytes, d->compute),
             "cuMemcpyDtoDAsync_v2", r->st);
    /* The block goes back only once the copies have read it. */
    if (rc == 0) rc = CK(d, d->api->stream_synchronize(d->compute), "cuStreamSynchronize", r->st);
    kiln__cuda_allocator_put(&d->alloc, t);
    return rc;
  }
  return CK(d, d->api->memcpy_dtod_async((CUdeviceptr)dst, (CUdeviceptr)src, bytes, d->compute),
            "cuMemcpyDtoDAsync_v2", r->st);
}

/* n (<= 8) bytes at device address src, after everything launched so far. */
static int read_scalar(run_ctx *r, uint64_t src, size_t n, void *out) {
  cuda_dev *d = r->d;
  int rc = CK(d, d->api->memcpy_dtoh_async(d->small, (CUdeviceptr)src, n, d->compute),
              "cuMemcpyDtoHAsync_v2", r->st);
  if (rc == 0) rc = CK(d, d->api->stream_synchronize(d->compute), "cuStreamSynchronize", r->st);
  if (rc == 0) memcpy(out, d->small, n);
  return rc;
}

static int run_while(run_ctx *r, const kiln_step *s, uint64_t base) {
  uint64_t pred_at = r->argv[base];
  for (uint64_t it = 0;; it++) {
    int rc = run_program(r, s->sub[0]);
    uint8_t pred = 0;
    if (rc == 0) rc = read_scalar(r, pred_at, 1, &pred);
    if (rc) return rc;
    if (pred == 0) return 0;
    if (it >= r->max_iterations)
      return kiln_status_set(r->st, KILN_ELIMIT, "run", "while loop ran past %llu iterations",
                             (unsigned long long)r->max_iterations);
    if ((rc = run_program(r, s->sub[1])) != 0) return rc;
    if ((rc = check_deadline(r)) != 0) return rc;
  }
}

static int run_conditional(run_ctx *r, const kiln_step *s, uint64_t base) {
  const kiln_slot *sel = &r->l->exe->slots[s->args[0]];
  uint32_t branch;
  int rc;
  if (sel->size == 1) {
    uint8_t v = 0;
    if ((rc = read_scalar(r, r->argv[base], 1, &v)) != 0) return rc;
    branch = v ? 0 : 1;
  } else {
    int32_t v = 0;
    if ((rc = read_scalar(r, r->argv[base], 4, &v)) != 0) return rc;
    branch = v < 0 ? UINT32_MAX : (uint32_t)v;
  }
  if (branch >= s->nsub) branch = s->nsub - 1; /* out of range: the last branch */
  return run_program(r, s->sub[branch]);
}

/* The value is read back (after what was launched before it) and rendered
 * with its record, which lives in the host's constants (checked at load). */
static int run_debug_print(run_ctx *r, const kiln_step *s, uint64_t base) {
  if (r->debug == NULL || r->debug->write == NULL) return 0;
  const kiln_executable *e = r->l->exe;
  cuda_dev *d = r->d;
  const kiln_slot *vs = &e->slots[s->args[0]], *rs = &e->slots[s->args[1]];
  kiln_debug_record rec;
  char why[160];
  if (!kiln_debug_record_read(e->constants + rs->offset, rs->size, vs->size, &rec, why, sizeof why))
    return 0;
  char *host = kiln_malloc(vs->size ? vs->size : 1);
  if (host == NULL) return kiln_status_set(r->st, KILN_ENOMEM, "run", "out of memory");
  int rc = CK(d, d->api->stream_synchronize(d->compute), "cuStreamSynchronize", r->st);
  if (rc == 0) rc = download(d, host, r->argv[base], vs->size, r->st);
  if (rc == 0) {
    kiln_sbuf sb = KILN_SBUF_INIT;
    kiln_debug_record_render(&sb, &rec, host);
    if (!kiln_sbuf_failed(&sb)) r->debug->write(r->debug->ctx, sb.data, sb.len);
    kiln_sbuf_free(&sb);
  }
  kiln_free(host);
  return rc;
}

/* ---- collective steps: NCCL ------------------------------------------------ */

/* Per-rank collectives (KILN_STEP_COLLECTIVE) of a gang launch: each rank
 * runs on its own thread and device and meets its group at the gang's
 * rendezvous (executor/comm.c) before it calls NCCL. That meeting is what
 * keeps NCCL from hanging on a peer that failed or was cancelled before
 * the step (the rendezvous notices it), it carries every member's device,
 * so that the group's first member can create the group's communicator
 * for all of them from one thread (a group of nonblocking inits), and it
 * orders the members' collectives the same way. The communicator is kept
 * in the backend, keyed by the members' devices in group order, and
 * reused by every later step and run with that group. The collective is
 * issued on the compute stream, after the step's predecessors, and waited
 * for with a deadline (the run's, else KILN_NCCL_TIMEOUT or 300 s); a
 * rank that misses it aborts its own communicator, and the group's next
 * use creates a new one. */

struct nccl_group {
  nccl_group *next;
  uint32_t n;
  CUdevice *devs; /* n: the members' devices, group order */
  int state;      /* 0 being created, 1 ready, 2 failed */
  int rc;         /* state 2: why */
  kiln_status st;
  kiln__nccl_clique *clique; /* state 1 */
};

static void groups_free(nccl_group *g) {
  while (g) {
    nccl_group *next = g->next;
    kiln__nccl_clique_destroy(g->clique);
    kiln_free(g->devs);
    kiln_free(g);
    g = next;
  }
}

static nccl_group *group_find(cuda_backend *cb, const CUdevice *devs, uint32_t n) {
  for (nccl_group *g = cb->groups; g; g = g->next)
    if (g->n == n && memcmp(g->devs, devs, n * sizeof *devs) == 0) return g;
  return NULL;
}

/* Group rank 0, between the rendezvous' enter and leave (every member is
 * at the step): makes sure the group has a communicator, creating it, or
 * replacing one that was aborted, for all members' devices. */
static void group_ensure(cuda_backend *cb, cuda_dev *const *peers, const CUdevice *devs, uint32_t n,
                         double deadline) {
  pthread_mutex_lock(&cb->comm_mu);
  nccl_group *g = group_find(cb, devs, n);
  if (g && g->state == 1 && !g->clique->broken) {
    pthread_mutex_unlock(&cb->comm_mu);
    return;
  }
  if (g) { /* unlink it: to the graveyard, freed at fini */
    nccl_group **pp = &cb->groups;
    while (*pp != g) pp = &(*pp)->next;
    *pp = g->next;
    g->next = cb->graveyard;
    cb->graveyard = g;
  }
  g = kiln_calloc(1, sizeof *g);
  if (g) g->devs = kiln_calloc(n, sizeof *g->devs);
  if (g == NULL || g->devs == NULL) {
    if (g) kiln_free(g);
    pthread_mutex_unlock(&cb->comm_mu);
    return; /* the members find no group: out of memory */
  }
  g->n = n;
  memcpy(g->devs, devs, n * sizeof *devs);
  g->next = cb->groups;
  cb->groups = g;
  pthread_mutex_unlock(&cb->comm_mu);
  /* Created outside the lock: an init waits for every rank's. */
  CUcontext ctxs[KILN_CUDA_MAX_DEVICES];
  for (uint32_t j = 0; j < n; j++) ctxs[j] = peers[j]->ctx;
  kiln__nccl_clique *c = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  const kiln__nccl_api *a = kiln__nccl_api_get(&st);
  int rc = a ? kiln__nccl_clique_create(a, peers[0]->api, NULL, n, 0, n, ctxs, deadline,
                                        peers[0]->where, &c, &st)
             : KILN_EUNAVAIL;
  pthread_mutex_lock(&cb->comm_mu);
  g->clique = c;
  g->state = rc ? 2 : 1;
  g->rc = rc;
  g->st = st;
  pthread_mutex_unlock(&cb->comm_mu);
}

/* The communicator of this rank's group, after group_ensure. */
static int group_get(cuda_backend *cb, const CUdevice *devs, uint32_t n, kiln__nccl_clique **out,
                     kiln_status *st) {
  pthread_mutex_lock(&cb->comm_mu);
  nccl_group *g = group_find(cb, devs, n);
  int rc = 0;
  if (g == NULL)
    rc = kiln_status_set(st, KILN_ENOMEM, "collective", "out of memory for a communicator");
  else if (g->state != 1)
    rc = kiln_status_set(st, g->rc ? g->rc : KILN_EINTERNAL, g->st.where[0] ? g->st.where : "nccl",
                         "%s", g->st.msg);
  else
    *out = g->clique;
  pthread_mutex_unlock(&cb->comm_mu);
  return rc;
}

/* Frees the communicators that use device `dev` (its context goes next). */
static void groups_drop_device(cuda_backend *cb, CUdevice dev) {
  pthread_mutex_lock(&cb->comm_mu);
  nccl_group **lists[2] = {&cb->groups, &cb->graveyard};
  for (int k = 0; k < 2; k++)
    for (nccl_group **pp = lists[k]; *pp;) {
      nccl_group *g = *pp;
      bool uses = false;
      for (uint32_t j = 0; j < g->n; j++) uses |= g->devs[j] == dev;
      if (!uses) {
        pp = &g->next;
        continue;
      }
      *pp = g->next;
      g->next = NULL;
      groups_free(g);
    }
  pthread_mutex_unlock(&cb->comm_mu);
}

/* What one rank issues for a step: the operand and result addresses, the
 * scratch that rearranges rows (operands whose split or gathered dimension
 * is not the most major), and the communicator. */
typedef struct coll_run {
  run_ctx *r;
  const kiln_step *s;
  uint64_t base;
  uint32_t n, rank; /* group size, this rank in it */
  ncclComm_t comm;
  const kiln__nccl_api *a;
  CUstream stream;
  uint64_t scratch; /* device address */
} coll_run;

static uint64_t op_addr(const coll_run *c, uint32_t i) { return c->r->argv[c->base + i]; }
static uint64_t res_addr(const coll_run *c, uint32_t i) {
  return c->r->argv[c->base + c->s->coll.nops + i];
}
static uint64_t op_bytes(const coll_run *c, uint32_t i) {
  return c->r->l->exe->slots[c->s->args[i]].size;
}
static uint64_t res_bytes(const coll_run *c, uint32_t i) {
  return c->r->l->exe->slots[c->s->args[c->s->coll.nops + i]].size;
}

static bool spans_overlap(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) {
  return an && bn && a < b + bn && b < a + an;
}

/* Whether result i shares bytes with an operand, other than being operand
 * i exactly when `in_place_ok` (NCCL allows in-place, not partial overlap). */
static bool res_clashes(const coll_run *c, uint32_t i, bool in_place_ok) {
  uint64_t ra = res_addr(c, i), rn = res_bytes(c, i);
  for (uint32_t k = 0; k < c->s->coll.nops; k++) {
    if (in_place_ok && k == i && op_addr(c, k) == ra && op_bytes(c, k) == rn) continue;
    if (spans_overlap(ra, rn, op_addr(c, k), op_bytes(c, k))) return true;
  }
  return false;
}

static int dtod(coll_run *c, uint64_t dst, uint64_t src, uint64_t n) {
  cuda_dev *d = c->r->d;
  if (n == 0) return 0;
  return CK(d, d->api->memcpy_dtod_async((CUdeviceptr)dst, (CUdeviceptr)src, n, c->stream),
            "cuMemcpyDtoDAsync_v2", c->r->st);
}

#define NCK(c, call, name) \
  kiln__nccl_check((c)->a, (c)->comm, (call), (name), "collective", (c)->r->st)

/* The scratch each operand needs, at most (one operand at a time). */
static uint64_t scratch_bytes(const coll_run *c) {
  const kiln_coll *k = &c->s->coll;
  uint64_t most = 0, all = 0;
  for (uint32_t i = 0; i < k->nops; i++) {
    uint64_t need = 2 * (op_bytes(c, i) > res_bytes(c, i) ? op_bytes(c, i) : res_bytes(c, i));
    if (need > most) most = need;
    all += res_bytes(c, i); /* the tuple all-to-all receives every result aside */
  }
  return most > all ? most : all;
}

static int issue_all_reduce(coll_run *c, uint32_t i) {
  const kiln_coll *k = &c->s->coll;
  ncclDataType_t t;
  ncclRedOp_t op;
  kiln__nccl_dtype((int)k->dtype, (int)k->reduce, &t, &op); /* checked at load */
  size_t count = (size_t)(op_bytes(c, i) / kiln_dtype_size((kiln_dtype)k->dtype));
  bool aside = res_clashes(c, i, true);
  uint64_t dst = aside ? c->scratch : res_addr(c, i);
  int rc = NCK(c,
               c->a->all_reduce((const void *)(uintptr_t)op_addr(c, i), (void *)(uintptr_t)dst,
                                count, t, op, c->comm, c->stream),
               "ncclAllReduce");
  if (rc == 0 && aside) rc = dtod(c, res_addr(c, i), dst, res_bytes(c, i));
  return rc;
}

/* Result row o = the members' rows o, one after another. */
static int issue_all_gather(coll_run *c, uint32_t i) {
  uint64_t in = op_bytes(c, i), rows = c->s->coll.outer[i] ? c->s->coll.outer[i] : 1;
  uint64_t row = in / rows;
  bool direct = rows == 1 && !res_clashes(c, i, false);
  uint64_t dst = direct ? res_addr(c, i) : c->scratch; /* [member][row o] */
  int rc = NCK(c,
               c->a->all_gather((const void *)(uintptr_t)op_addr(c, i), (void *)(uintptr_t)dst,
                                (size_t)in, ncclUint8, c->comm, c->stream),
               "ncclAllGather");
  for (uint64_t o = 0; rc == 0 && !direct && o < rows; o++)
    for (uint32_t j = 0; rc == 0 && j < c->n; j++)
      rc = dtod(c, res_addr(c, i) + (o * c->n + j) * row, dst + j * in + o * row, row);
  return rc;
}

/* Result row o = block `rank` of the reduced row o. */
static int issue_reduce_scatter(coll_run *c, uint32_t i) {
  const kiln_coll *k = &c->s->coll;
  ncclDataType_t t;
  ncclRedOp_t op;
  kiln__nccl_dtype((int)k->dtype, (int)k->reduce, &t, &op);
  uint64_t in = op_bytes(c, i), rows = k->outer[i] ? k->outer[i] : 1, row = in / rows;
  uint64_t blk = row / c->n;
  uint64_t src = op_addr(c, i), dst = res_addr(c, i);
  int rc = 0;
  if (rows > 1) { /* [row o][block j] -> [block j][row o] */
    src = c->scratch;
    for (uint64_t o = 0; rc == 0 && o < rows; o++)
      for (uint32_t j = 0; rc == 0 && j < c->n; j++)
        rc = dtod(c, src + (j * rows + o) * blk, op_addr(c, i) + o * row + j * blk, blk);
  }
  bool aside = res_clashes(c, i, false);
  if (aside) dst = c->scratch + (rows > 1 ? in : 0);
  size_t count = (size_t)(rows * blk / kiln_dtype_size((kiln_dtype)k->dtype));
  if (rc == 0)
    rc = NCK(c,
             c->a->reduce_scatter((const void *)(uintptr_t)src, (void *)(uintptr_t)dst, count, t,
                                  op, c->comm, c->stream),
             "ncclReduceScatter");
  if (rc == 0 && aside) rc = dtod(c, res_addr(c, i), dst, res_bytes(c, i));
  return rc;
}

/* Block j of result row o = block `rank` of member j's row o: to member j
 * go this rank's blocks j of every row, packed [j][o]; from it come its
 * blocks `rank`, unpacked to [o][j]. One group of sends and receives. */
static int issue_all_to_all(coll_run *c, uint32_t i) {
  const kiln_coll *k = &c->s->coll;
  int rc = 0;
  if (k->outer[i] == 0) { /* the tuple form: result j = member j's operand `rank` */
    if (i > 0) return 0;  /* all operands at once */
    bool aside = false;
    for (uint32_t j = 0; j < c->n; j++) aside |= res_clashes(c, j, false);
    uint64_t off = 0;
    rc = NCK(c, c->a->group_start(), "ncclGroupStart");
    for (uint32_t j = 0; rc == 0 && j < c->n; j++) {
      uint64_t dst = aside ? c->scratch + off : res_addr(c, j);
      rc = NCK(c,
               c->a->send((const void *)(uintptr_t)op_addr(c, j), (size_t)op_bytes(c, j), ncclUint8,
                          (int)j, c->comm, c->stream),
               "ncclSend");
      if (rc == 0)
        rc = NCK(c,
                 c->a->recv((void *)(uintptr_t)dst, (size_t)res_bytes(c, j), ncclUint8, (int)j,
                            c->comm, c->stream),
                 "ncclRecv");
      off += res_bytes(c, j);
    }
    int grc = NCK(c, c->a->group_end(), "ncclGroupEnd (all-to-all)");
    if (rc == 0) rc = grc;
    off = 0;
    for (uint32_t j = 0; rc == 0 && aside && j < c->n; j++) {
      rc = dtod(c, res_addr(c, j), c->scratch + off, res_bytes(c, j));
      off += res_bytes(c, j);
    }
    return rc;
  }
  uint64_t in = op_bytes(c, i), rows = k->outer[i], row = in / rows, blk = row / c->n;
  bool packed = rows > 1 || res_clashes(c, i, false);
  uint64_t sbuf = op_addr(c, i), rbuf = res_addr(c, i);
  if (packed) {
    sbuf = c->scratch;
    rbuf = c->scratch + in;
    for (uint64_t o = 0; rc == 0 && o < rows; o++)
      for (uint32_t j = 0; rc == 0 && j < c->n; j++)
        rc = dtod(c, sbuf + (j * rows + o) * blk, op_addr(c, i) + o * row + j * blk, blk);
  }
  if (rc) return rc;
  rc = NCK(c, c->a->group_start(), "ncclGroupStart");
  for (uint32_t j = 0; rc == 0 && j < c->n; j++) {
    rc = NCK(c,
             c->a->send((const void *)(uintptr_t)(sbuf + j * rows * blk), (size_t)(rows * blk),
                        ncclUint8, (int)j, c->comm, c->stream),
             "ncclSend");
    if (rc == 0)
      rc = NCK(c,
               c->a->recv((void *)(uintptr_t)(rbuf + j * rows * blk), (size_t)(rows * blk),
                          ncclUint8, (int)j, c->comm, c->stream),
               "ncclRecv");
  }
  int grc = NCK(c, c->a->group_end(), "ncclGroupEnd (all-to-all)");
  if (rc == 0) rc = grc;
  for (uint64_t o = 0; rc == 0 && packed && o < rows; o++)
    for (uint32_t j = 0; rc == 0 && j < c->n; j++)
      rc = dtod(c, res_addr(c, i) + o * row + j * blk, rbuf + (j * rows + o) * blk, blk);
  return rc;
}

/* The result is the operand of device source[me] (zeros when it has
 * none); this rank sends its operand to every member whose source it is. */
static int issue_permute(coll_run *c, uint32_t me) {
  const kiln_coll *k = &c->s->coll;
  const uint32_t *row = k->members + (size_t)me * c->n;
  uint32_t ndev = k->replicas * k->partitions;
  int32_t src = k->source[me];
  bool aside = res_clashes(c, 0, false);
  uint64_t dst = aside ? c->scratch : res_addr(c, 0), bytes = res_bytes(c, 0);
  cuda_dev *d = c->r->d;
  int rc = 0;
  bool member = false; /* a source outside the group sends nothing here */
  for (uint32_t j = 0; src >= 0 && j < c->n; j++) member |= row[j] == (uint32_t)src;
  if (!member) src = -1;
  if (src < 0 && bytes > 0)
    rc = CK(d, d->api->memset_d8_async((CUdeviceptr)res_addr(c, 0), 0, bytes, c->stream),
            "cuMemsetD8Async", c->r->st);
  if (rc == 0) rc = NCK(c, c->a->group_start(), "ncclGroupStart");
  for (uint32_t j = 0; rc == 0 && j < c->n; j++) {
    uint32_t peer = row[j];
    if (peer < ndev && k->source[peer] == (int32_t)me)
      rc = NCK(c,
               c->a->send((const void *)(uintptr_t)op_addr(c, 0), (size_t)op_bytes(c, 0), ncclUint8,
                          (int)j, c->comm, c->stream),
               "ncclSend");
    if (rc == 0 && src >= 0 && peer == (uint32_t)src)
      rc = NCK(
          c,
          c->a->recv((void *)(uintptr_t)dst, (size_t)bytes, ncclUint8, (int)j, c->comm, c->stream),
          "ncclRecv");
  }
  int grc = NCK(c, c->a->group_end(), "ncclGroupEnd (collective-permute)");
  if (rc == 0) rc = grc;
  if (rc == 0 && aside && src >= 0) rc = dtod(c, res_addr(c, 0), dst, bytes);
  return rc;
}

static int issue_broadcast(coll_run *c, uint32_t i) {
  bool aside = res_clashes(c, i, true);
  uint64_t dst = aside ? c->scratch : res_addr(c, i);
  int rc = NCK(c,
               c->a->broadcast((const void *)(uintptr_t)op_addr(c, i), (void *)(uintptr_t)dst,
                               (size_t)op_bytes(c, i), ncclUint8, 0, c->comm, c->stream),
               "ncclBroadcast");
  if (rc == 0 && aside) rc = dtod(c, res_addr(c, i), dst, res_bytes(c, i));
  return rc;
}

static int issue_step(coll_run *c, uint32_t me) {
  const kiln_coll *k = &c->s->coll;
  int rc = 0;
  if (k->op == KILN_OP_COLLECTIVE_PERMUTE) return issue_permute(c, me);
  for (uint32_t i = 0; rc == 0 && i < k->nops; i++) {
    switch (k->op) {
    case KILN_OP_ALL_REDUCE: rc = issue_all_reduce(c, i); break;
    case KILN_OP_ALL_GATHER: rc = issue_all_gather(c, i); break;
    case KILN_OP_REDUCE_SCATTER: rc = issue_reduce_scatter(c, i); break;
    case KILN_OP_ALL_TO_ALL: rc = issue_all_to_all(c, i); break;
    default: rc = issue_broadcast(c, i); break; /* COLLECTIVE_BROADCAST; checked at load */
    }
  }
  return rc;
}

/* A group of one: the step is copies (or zeros). */
static int coll_alone(run_ctx *r, const kiln_step *s, uint64_t base, uint32_t me) {
  const kiln_coll *k = &s->coll;
  const kiln_executable *e = r->l->exe;
  int rc = 0;
  for (uint32_t i = 0; rc == 0 && i < k->nops; i++) {
    uint64_t dst = r->argv[base + k->nops + i], src = r->argv[base + i];
    uint64_t bytes = e->slots[s->args[k->nops + i]].size;
    if (k->op == KILN_OP_COLLECTIVE_PERMUTE && k->source[me] < 0) {
      if (bytes)
        rc = CK(r->d, r->d->api->memset_d8_async((CUdeviceptr)dst, 0, bytes, r->d->compute),
                "cuMemsetD8Async", r->st);
    } else {
      rc = run_copy(r, dst, src, bytes);
    }
  }
  return rc;
}

static int run_collective(run_ctx *r, const kiln_step *s, uint64_t base) {
  const kiln_coll *k = &s->coll;
  cuda_dev *d = r->d;
  const char *name = kiln_opcode_name((kiln_opcode)k->op);
  uint32_t ndev = k->replicas * k->partitions, nranks = r->gang ? r->gang->nranks : 1;
  uint32_t me = r->gang ? r->gang->rank : 0;
  if (nranks != ndev)
    return kiln_status_set(r->st, KILN_EINVAL, "collective",
                           "%s was compiled for %u replicas x %u partitions; this run has %u "
                           "device%s (run it with kiln_mesh_execute on that many)",
                           name, k->replicas, k->partitions, nranks, nranks == 1 ? "" : "s");
  if (k->op == KILN_OP_REPLICA_ID || k->op == KILN_OP_PARTITION_ID) {
    uint32_t v = k->op == KILN_OP_REPLICA_ID ? me / k->partitions : me % k->partitions;
    memcpy(d->small, &v, sizeof v);
    int rc =
        CK(d, d->api->memcpy_htod_async((CUdeviceptr)r->argv[base], d->small, sizeof v, d->compute),
           "cuMemcpyHtoDAsync_v2", r->st);
    /* small is reused by the next read-back: wait for this copy. */
    if (rc == 0) rc = CK(d, d->api->stream_synchronize(d->compute), "cuStreamSynchronize", r->st);
    return rc;
  }
  uint32_t n = k->gsize, rank = 0;
  const uint32_t *row = k->members + (size_t)me * n;
  while (row[rank] != me) rank++; /* checked at load: me is a member */
  if (n == 1) return coll_alone(r, s, base, me);
  if (n > KILN_CUDA_MAX_DEVICES)
    return kiln_status_set(r->st, KILN_ELIMIT, "collective",
                           "%s: a group of %u devices (at most %d)", name, n,
                           KILN_CUDA_MAX_DEVICES);
  double deadline = r->deadline > 0 ? r->deadline : now_seconds() + d->cb->coll_seconds;
  void *mine[1] = {d};
  void *const *peers[KILN_CUDA_MAX_DEVICES];
  int rc = kiln__rendezvous_enter(r->gang, (uint64_t)(uintptr_t)s, row, n, mine, peers, r->cancel,
                                  r->deadline, r->st);
  if (rc) return rc;
  cuda_dev *pd[KILN_CUDA_MAX_DEVICES];
  CUdevice devs[KILN_CUDA_MAX_DEVICES];
  for (uint32_t j = 0; j < n; j++) {
    pd[j] = peers[j][0];
    devs[j] = pd[j]->dev;
  }
  if (rank == 0) group_ensure(d->cb, pd, devs, n, deadline);
  rc = kiln__rendezvous_leave(r->gang, row, n, r->cancel, r->deadline, r->st);
  kiln__nccl_clique *cl = NULL;
  if (rc == 0) rc = group_get(d->cb, devs, n, &cl, r->st);
  if (rc) return rc;
  coll_run c = {.r = r,
                .s = s,
                .base = base,
                .n = n,
                .rank = rank,
                .comm = cl->comms[rank],
                .a = cl->api,
                .stream = d->compute};
  kiln__cuda_block *scratch = NULL;
  uint64_t sb = scratch_bytes(&c);
  if (sb > 0 && (rc = dev_get(d, sb, &scratch, r->st)) != 0) return rc;
  c.scratch = scratch ? scratch->ptr : 0;
  rc = issue_step(&c, me);
  char call[64];
  snprintf(call, sizeof call, "%s through NCCL", name);
  if (rc == 0) rc = kiln__nccl_settle(c.a, &c.comm, 1, deadline, call, "collective", r->st);
  if (rc == 0)
    rc = kiln__nccl_stream_wait(c.a, d->api, &c.comm, &d->ctx, &d->compute, 1, deadline, r->cancel,
                                call, "collective", r->st);
  if (rc) { /* this rank's communicator may be stuck: abort it */
    pthread_mutex_lock(&d->cb->comm_mu);
    if (cl->comms[rank]) cl->api->comm_abort(cl->comms[rank]);
    cl->comms[rank] = NULL;
    cl->broken = true;
    pthread_mutex_unlock(&d->cb->comm_mu);
  }
  kiln__cuda_allocator_put(&d->alloc, scratch);
  return rc;
}

static int run_program(run_ctx *r, uint32_t p) {
  const kiln_program *pr = &r->l->exe->programs[p];
  const uint64_t *base = r->l->argv_base[p];
  cuda_dev *d = r->d;
  for (uint32_t i = 0; i < pr->nsteps; i++) {
    const kiln_step *s = &pr->steps[i];
    uint64_t b = base[i];
    int rc = 0;
    int64_t t0 = r->observer ? now_ns() : 0;
    switch (s->kind) {
    case KILN_STEP_KERNEL: rc = run_kernel(r, s, b); break;
    case KILN_STEP_GEMM: rc = run_gemm(r, s, r->l->plans[p][i], b); break;
    case KILN_STEP_COPY: rc = run_copy(r, r->argv[b], r->argv[b + 1], s->range); break;
    case KILN_STEP_WHILE: rc = run_while(r, s, b); break;
    case KILN_STEP_CONDITIONAL: rc = run_conditional(r, s, b); break;
    case KILN_STEP_CALL: rc = run_program(r, s->sub[0]); break;
    case KILN_STEP_DEBUG_PRINT: rc = run_debug_print(r, s, b); break;
    case KILN_STEP_COLLECTIVE: rc = run_collective(r, s, b); break;
    default: /* refused at load */
      rc = kiln_status_set(r->st, KILN_EINTERNAL, "run", "step kind %d on cuda", s->kind);
      break;
    }
    if (rc == 0 && r->observer) {
      rc = CK(d, d->api->stream_synchronize(d->compute), "cuStreamSynchronize", r->st);
      r->observer->step(r->observer->ctx, p, i, t0, now_ns());
    }
    if (rc == 0) rc = check_deadline(r);
    if (rc) return rc;
  }
  return 0;
}

/* Runs program 0 with parameter leaf i at params[i] and result leaf i at
 * results[i] (device addresses, laid out as their bindings say). */
static int run_on_device(cuda_loaded *l, const uint64_t *params, const uint64_t *results,
                         const kiln_run_options *opts, kiln_status *st) {
  const kiln_executable *e = l->exe;
  cuda_dev *d = l->dev;
  uint64_t temp = (e->temp_bytes + ARGV_ALIGN - 1) / ARGV_ALIGN * ARGV_ALIGN;
  uint64_t *host = kiln_calloc((size_t)e->nslots + (size_t)l->nargv + 1, sizeof *host);
  if (host == NULL) return kiln_status_set(st, KILN_ENOMEM, "run", "out of memory");
  run_ctx r = {.l = l, .d = d, .slot = host, .argv = host + e->nslots, .st = st};
  r.max_iterations =
      opts->max_while_iterations ? opts->max_while_iterations : DEFAULT_MAX_ITERATIONS;
  if (opts->timeout_seconds > 0) r.deadline = now_seconds() + opts->timeout_seconds;
  r.cancel = opts->cancel;
  r.debug = opts->debug;
  r.observer = opts->observer;
  r.gang = opts->gang;
  kiln__cuda_block *arena = NULL;
  pthread_mutex_lock(&d->run_mu);
  int rc = ctx_enter(d, st);
  if (rc) goto out_unlock;
  if (temp + l->nargv * sizeof(uint64_t) > 0)
    rc = dev_get(d, temp + l->nargv * sizeof(uint64_t), &arena, st);
  if (rc) goto out_leave;
  for (uint32_t i = 0; i < e->nslots; i++) {
    const kiln_slot *s = &e->slots[i];
    switch (s->kind) {
    case KILN_SLOT_TEMP: r.slot[i] = arena ? arena->ptr + s->offset : 0; break;
    case KILN_SLOT_CONSTANT: r.slot[i] = l->consts ? l->consts->ptr + s->offset : 0; break;
    case KILN_SLOT_PARAM: r.slot[i] = params[l->leaf_base[s->index] + s->leaf]; break;
    case KILN_SLOT_OUTPUT: r.slot[i] = results[s->index]; break;
    }
  }
  for (uint32_t p = 0; p < e->nprograms; p++)
    for (uint32_t i = 0; i < e->programs[p].nsteps; i++) {
      const kiln_step *s = &e->programs[p].steps[i];
      for (uint32_t j = 0; j < s->nargs; j++) r.argv[l->argv_base[p][i] + j] = r.slot[s->args[j]];
    }
  if (l->nargv > 0) {
    r.argv_dev = arena->ptr + temp;
    rc = upload(d, r.argv_dev, r.argv, l->nargv * sizeof(uint64_t), st);
  }
  if (rc == 0) rc = run_program(&r, 0);
  /* Results bound to slots other than their own output slot are copied out. */
  for (uint32_t i = 0; rc == 0 && i < e->nresults; i++) {
    const kiln_slot *s = &e->slots[e->results[i].slot];
    if (s->kind == KILN_SLOT_OUTPUT && s->index == i) continue;
    rc = run_copy(&r, results[i], r.slot[e->results[i].slot], s->size);
  }
  /* Completion: the event after the run's last launch; a kernel that
   * faulted is reported here. Waited for on failure too, so that the arena
   * goes back idle. */
  int wrc = CK(d, d->api->event_record(d->done, d->compute), "cuEventRecord", rc ? NULL : st);
  if (wrc == 0)
    wrc = CK(d, d->api->event_synchronize(d->done), "cuEventSynchronize (the run's kernels)",
             rc ? NULL : st);
  if (rc == 0) rc = wrc;
  kiln__cuda_allocator_put(&d->alloc, arena);
out_leave:
  ctx_leave(d);
out_unlock:
  pthread_mutex_unlock(&d->run_mu);
  kiln_free(host);
  return rc;
}

static int kiln_cuda_execute(kiln_loaded *ld, kiln_buffer *const *args,
                             const kiln_run_options *opts, kiln_buffer *const *results,
                             kiln_status *st) {
  cuda_loaded *l = ld->ctx;
  const kiln_executable *e = l->exe;
  uint64_t *ptrs = kiln_calloc((size_t)e->nparam_leaves + e->nresults + 1, sizeof *ptrs);
  if (ptrs == NULL) return kiln_status_set(st, KILN_ENOMEM, "execute", "out of memory");
  for (uint32_t i = 0; i < e->nparam_leaves; i++)
    ptrs[i] = ((const kiln__cuda_block *)args[i]->mem)->ptr;
  for (uint32_t i = 0; i < e->nresults; i++)
    ptrs[e->nparam_leaves + i] = ((const kiln__cuda_block *)results[i]->mem)->ptr;
  int rc = run_on_device(l, ptrs, ptrs + e->nparam_leaves, opts, st);
  kiln_free(ptrs);
  return rc;
}

/* ---- host literals --------------------------------------------------------- */

/* Row-major (logical) order <-> the physical order of shape's layout.
 * to_physical: dst is laid out by the layout, src row-major. */
static void relayout(void *dst, const void *src, const kiln_shape *shape, bool to_physical) {
  uint32_t rank = shape->rank;
  size_t esize = kiln_dtype_size(shape->dtype);
  int64_t n = kiln_shape_elements(shape);
  if (n <= 0) return;
  int64_t stride[64], idx[64] = {0}, m2m[64];
  kiln_shape_minor_to_major(shape, m2m);
  int64_t acc = 1;
  for (uint32_t i = 0; i < rank; i++) {
    stride[m2m[i]] = acc;
    acc *= shape->dims[m2m[i]];
  }
  int64_t phys = 0;
  for (int64_t lin = 0; lin < n; lin++) {
    char *d = (char *)dst + (size_t)(to_physical ? phys : lin) * esize;
    const char *s = (const char *)src + (size_t)(to_physical ? lin : phys) * esize;
    memcpy(d, s, esize);
    for (uint32_t k = rank; k-- > 0;) {
      phys += stride[k];
      if (++idx[k] < shape->dims[k]) break;
      phys -= stride[k] * idx[k];
      idx[k] = 0;
    }
  }
}

static void flatten(const kiln_literal *lit, const kiln_literal **out, uint32_t *k, uint32_t max) {
  if (lit->shape.dtype == KILN_TUPLE) {
    for (uint32_t i = 0; i < lit->shape.rank; i++) flatten(lit->elems[i], out, k, max);
  } else if (lit->shape.dtype != KILN_TOKEN && *k < max) {
    out[(*k)++] = lit;
  }
}

/* Host bytes -> a new device block, in the binding's layout. */
static int put_leaf(cuda_dev *d, const kiln_literal *leaf, const kiln_shape *bs, uint32_t i,
                    kiln__cuda_block **out, kiln_status *st) {
  size_t bytes = (size_t)kiln_shape_bytes(bs);
  if (leaf->nbytes < bytes || (bytes > 0 && leaf->data == NULL))
    return kiln_status_set(st, KILN_EINVAL, "run",
                           "parameter leaf %u: %zu bytes of data, %zu needed", i, leaf->nbytes,
                           bytes);
  if (leaf->dynamic_sizes)
    for (uint32_t k = 0; k < bs->rank; k++)
      if (leaf->dynamic_sizes[k] != bs->dims[k])
        return kiln_status_set(st, KILN_EUNIMPL, "run",
                               "parameter leaf %u: dynamic size %lld below its bound %lld", i,
                               (long long)leaf->dynamic_sizes[k], (long long)bs->dims[k]);
  int rc = dev_get(d, bytes, out, st);
  if (rc || bytes == 0) return rc;
  if (kiln_shape_is_row_major(bs)) return upload(d, (*out)->ptr, leaf->data, bytes, st);
  void *t = kiln_malloc(bytes);
  if (t == NULL) return kiln_status_set(st, KILN_ENOMEM, "run", "out of memory");
  relayout(t, leaf->data, bs, true);
  rc = upload(d, (*out)->ptr, t, bytes, st);
  kiln_free(t);
  return rc;
}

/* A device block -> the result leaf's (row-major) host bytes. */
static int get_leaf(cuda_dev *d, const kiln__cuda_block *b, const kiln_shape *bs,
                    kiln_literal *leaf, kiln_status *st) {
  size_t bytes = (size_t)kiln_shape_bytes(bs);
  if (bytes == 0) return 0;
  if (kiln_shape_is_row_major(bs)) return download(d, leaf->data, b->ptr, bytes, st);
  void *t = kiln_malloc(bytes);
  if (t == NULL) return kiln_status_set(st, KILN_ENOMEM, "run", "out of memory");
  int rc = download(d, t, b->ptr, bytes, st);
  if (rc == 0) relayout(leaf->data, t, bs, false);
  kiln_free(t);
  return rc;
}

static int shape_mismatch(uint32_t p, const kiln_shape *got, const kiln_shape *want,
                          kiln_status *st) {
  kiln_sbuf a = KILN_SBUF_INIT, b = KILN_SBUF_INIT;
  kiln_shape_print_short(&a, got);
  kiln_shape_print_short(&b, want);
  int rc = kiln_status_set(st, KILN_EINVAL, "run", "argument %u: %.200s given, %.200s expected", p,
                           kiln_sbuf_str(&a), kiln_sbuf_str(&b));
  kiln_sbuf_free(&a);
  kiln_sbuf_free(&b);
  return rc;
}

static int kiln_cuda_run(kiln_loaded *ld, const kiln_literal *const *args,
                         const kiln_run_options *opts, kiln_literal **out, kiln_status *st) {
  cuda_loaded *l = ld->ctx;
  cuda_dev *d = l->dev;
  const kiln_executable *e = l->exe;
  uint32_t np = e->nparam_leaves, nr = e->nresults;
  for (uint32_t p = 0; p < e->nparams; p++)
    if (!kiln_shape_equal(&args[p]->shape, &e->param_shapes[p], false))
      return shape_mismatch(p, &args[p]->shape, &e->param_shapes[p], st);
  const kiln_literal **pleaves = kiln_calloc((size_t)np + 1, sizeof *pleaves);
  const kiln_literal **rleaves = kiln_calloc((size_t)nr + 1, sizeof *rleaves);
  kiln__cuda_block **blocks = kiln_calloc((size_t)np + nr + 1, sizeof *blocks);
  uint64_t *ptrs = kiln_calloc((size_t)np + nr + 1, sizeof *ptrs);
  kiln_literal *res = NULL;
  int rc = 0;
  if (!pleaves || !rleaves || !blocks || !ptrs) {
    rc = kiln_status_set(st, KILN_ENOMEM, "run", "out of memory");
    goto out_free;
  }
  uint32_t k = 0;
  for (uint32_t p = 0; p < e->nparams; p++) flatten(args[p], pleaves, &k, np);
  if (k != np) {
    rc = kiln_status_set(st, KILN_EINVAL, "run", "%u parameter leaves given, %u expected", k, np);
    goto out_free;
  }
  rc = kiln_literal_create(NULL, &e->result_shape, d->alloc.budget, &res, st);
  if (rc) goto out_free;
  k = 0;
  flatten(res, rleaves, &k, nr);
  if ((rc = ctx_enter(d, st)) != 0) goto out_free;
  for (uint32_t i = 0; i < np && rc == 0; i++) {
    rc = put_leaf(d, pleaves[i], &e->params[i].shape, i, &blocks[i], st);
    if (rc == 0) ptrs[i] = blocks[i]->ptr;
  }
  for (uint32_t i = 0; i < nr && rc == 0; i++) {
    rc = dev_get(d, (uint64_t)kiln_shape_bytes(&e->results[i].shape), &blocks[np + i], st);
    if (rc == 0) ptrs[np + i] = blocks[np + i]->ptr;
  }
  ctx_leave(d);
  if (rc == 0) rc = run_on_device(l, ptrs, ptrs + np, opts, st);
  if (rc == 0 && (rc = ctx_enter(d, st)) == 0) {
    for (uint32_t i = 0; i < nr && rc == 0; i++)
      rc = get_leaf(d, blocks[np + i], &e->results[i].shape, (kiln_literal *)rleaves[i], st);
    ctx_leave(d);
  }
  if (rc == 0) {
    *out = res;
    res = NULL;
  }
out_free:
  for (uint32_t i = 0; blocks && i < np + nr; i++) kiln__cuda_allocator_put(&d->alloc, blocks[i]);
  kiln_literal_destroy(res);
  kiln_free(pleaves);
  kiln_free(rleaves);
  kiln_free(blocks);
  kiln_free(ptrs);
  return rc;
}

/* ---- communicators and meshes: one thread, several devices ---------------- */

/* kiln_comm's communicator (comm_init) and a mesh across hosts
 * (kiln_cuda_mesh_open) are the same thing: this process's ranks of one
 * NCCL communicator, driven from the caller's thread. A collective on it
 * is one group (ncclGroupStart/End) with a call per local rank, each on
 * its device's copy stream (held with the staging mutex, as a buffer
 * transfer is), then waited for on every device with a deadline. */

typedef struct cuda_clique {
  kiln__nccl_clique *nc;
  cuda_dev **devs; /* nc->n */
  uint32_t first;  /* global rank of local rank 0 */
  double seconds;  /* a collective's deadline */
} cuda_clique;

static void clique_free(cuda_clique *c) {
  if (c == NULL) return;
  kiln__nccl_clique_destroy(c->nc);
  kiln_free(c->devs);
  kiln_free(c);
}

static int clique_open(kiln_device *const *dv, uint32_t n, const uint8_t *id, uint32_t nranks,
                       uint32_t first, double seconds, cuda_clique **out, kiln_status *st) {
  *out = NULL;
  if (n > KILN_CUDA_MAX_DEVICES)
    return kiln_status_set(st, KILN_ELIMIT, "nccl", "%u devices (at most %d)", n,
                           KILN_CUDA_MAX_DEVICES);
  const kiln__nccl_api *a = kiln__nccl_api_get(st);
  if (a == NULL) return KILN_EUNAVAIL;
  cuda_clique *c = kiln_calloc(1, sizeof *c);
  if (c) c->devs = kiln_calloc(n, sizeof *c->devs);
  if (c == NULL || c->devs == NULL) {
    if (c) kiln_free(c);
    return kiln_status_set(st, KILN_ENOMEM, "nccl", "out of memory");
  }
  CUcontext ctxs[KILN_CUDA_MAX_DEVICES];
  for (uint32_t i = 0; i < n; i++) {
    c->devs[i] = dv[i]->ctx;
    ctxs[i] = c->devs[i]->ctx;
  }
  c->first = first;
  c->seconds = seconds > 0 ? seconds : DEFAULT_COLL_SECONDS;
  int rc =
      kiln__nccl_clique_create(a, c->devs[0]->api, id, nranks, first, n, ctxs,
                               now_seconds() + (seconds > 0 ? seconds : 60.0), "nccl", &c->nc, st);
  if (rc) {
    clique_free(c);
    return rc;
  }
  *out = c;
  return 0;
}

static uint64_t blk_ptr(kiln_buffer *b) { return ((const kiln__cuda_block *)b->mem)->ptr; }

/* Local rank i's calls for desc (inside the group). */
static int grouped_issue(cuda_clique *c, uint32_t i, const kiln_collective *desc, ncclDataType_t t,
                         ncclRedOp_t op, kiln_status *st) {
  const kiln__nccl_api *a = c->nc->api;
  ncclComm_t cm = c->nc->comms[i];
  CUstream s = c->devs[i]->copy;
  uint32_t nr = c->nc->nranks, me = c->first + i;
  size_t es = kiln_dtype_size((kiln_dtype)desc->dtype), bytes = (size_t)desc->count * es;
  const void *sb = (const void *)(uintptr_t)blk_ptr(desc->send[i]);
  void *rb = (void *)(uintptr_t)blk_ptr(desc->recv[i]);
  const char *w = "nccl";
  switch (desc->op) {
  case KILN_OP_ALL_REDUCE:
    return kiln__nccl_check(a, cm, a->all_reduce(sb, rb, (size_t)desc->count, t, op, cm, s),
                            "ncclAllReduce", w, st);
  case KILN_OP_REDUCE_SCATTER:
    return kiln__nccl_check(a, cm,
                            a->reduce_scatter(sb, rb, (size_t)desc->count / nr, t, op, cm, s),
                            "ncclReduceScatter", w, st);
  case KILN_OP_ALL_GATHER:
    return kiln__nccl_check(a, cm, a->all_gather(sb, rb, bytes, ncclUint8, cm, s), "ncclAllGather",
                            w, st);
  case KILN_OP_ALL_TO_ALL: {
    size_t chunk = bytes / nr;
    for (uint32_t j = 0; j < nr; j++) {
      int rc = kiln__nccl_check(
          a, cm, a->send((const char *)sb + j * chunk, chunk, ncclUint8, (int)j, cm, s), "ncclSend",
          w, st);
      if (rc == 0)
        rc = kiln__nccl_check(a, cm,
                              a->recv((char *)rb + j * chunk, chunk, ncclUint8, (int)j, cm, s),
                              "ncclRecv", w, st);
      if (rc) return rc;
    }
    return 0;
  }
  default: /* COLLECTIVE_PERMUTE */
    for (uint32_t p = 0; p < desc->npairs; p++) {
      uint32_t from = desc->pairs[2 * p], to = desc->pairs[2 * p + 1];
      int rc = 0;
      if (from == me)
        rc = kiln__nccl_check(a, cm, a->send(sb, bytes, ncclUint8, (int)to, cm, s), "ncclSend", w,
                              st);
      if (rc == 0 && to == me)
        rc = kiln__nccl_check(a, cm, a->recv(rb, bytes, ncclUint8, (int)from, cm, s), "ncclRecv", w,
                              st);
      if (rc) return rc;
    }
    return 0;
  }
}

static int grouped_collective(cuda_clique *c, const kiln_collective *desc, double seconds,
                              kiln_status *st) {
  const char *name = kiln_opcode_name((kiln_opcode)desc->op);
  kiln__nccl_clique *nc = c->nc;
  if (nc->broken)
    return kiln_status_set(st, KILN_EUNAVAIL, "nccl",
                           "%s: the communicator was aborted after an earlier error; open it "
                           "again",
                           name);
  ncclDataType_t t = ncclUint8;
  ncclRedOp_t op = ncclSum;
  bool reduces = desc->op == KILN_OP_ALL_REDUCE || desc->op == KILN_OP_REDUCE_SCATTER;
  if (reduces && !kiln__nccl_dtype(desc->dtype, desc->reduce_op, &t, &op))
    return kiln_status_set(st, KILN_EUNIMPL, "cuda",
                           "%s over %s with %s is not implemented by backend cuda (NCCL has no "
                           "such reduction)",
                           name, kiln_dtype_name((kiln_dtype)desc->dtype),
                           kiln_opcode_name((kiln_opcode)desc->reduce_op));
  if (!reduces && desc->op != KILN_OP_ALL_GATHER && desc->op != KILN_OP_ALL_TO_ALL &&
      desc->op != KILN_OP_COLLECTIVE_PERMUTE)
    return kiln_status_set(st, KILN_EUNIMPL, "cuda", "%s is not implemented by backend cuda", name);
  if (desc->op == KILN_OP_ALL_TO_ALL && desc->count % nc->nranks)
    return kiln_status_set(st, KILN_EINVAL, "cuda", "%s of %llu elements over %u ranks", name,
                           (unsigned long long)desc->count, nc->nranks);
  if (desc->op == KILN_OP_REDUCE_SCATTER && desc->count % nc->nranks)
    return kiln_status_set(st, KILN_EINVAL, "cuda", "%s of %llu elements over %u ranks", name,
                           (unsigned long long)desc->count, nc->nranks);
  double deadline = now_seconds() + (seconds > 0 ? seconds : c->seconds);
  size_t bytes = (size_t)desc->count * kiln_dtype_size((kiln_dtype)desc->dtype);
  CUstream streams[KILN_CUDA_MAX_DEVICES];
  CUcontext ctxs[KILN_CUDA_MAX_DEVICES];
  for (uint32_t i = 0; i < nc->n; i++) {
    pthread_mutex_lock(&c->devs[i]->copy_mu);
    streams[i] = c->devs[i]->copy;
    ctxs[i] = c->devs[i]->ctx;
  }
  int rc = 0;
  /* Permute: a rank nobody sends to gets zeros. */
  for (uint32_t i = 0; rc == 0 && desc->op == KILN_OP_COLLECTIVE_PERMUTE && i < nc->n; i++) {
    cuda_dev *d = c->devs[i];
    if ((rc = ctx_enter(d, st)) != 0) break;
    rc = CK(d, d->api->memset_d8_async((CUdeviceptr)blk_ptr(desc->recv[i]), 0, bytes, d->copy),
            "cuMemsetD8Async", st);
    ctx_leave(d);
  }
  bool grouped = false;
  if (rc == 0) {
    rc = kiln__nccl_check(nc->api, NULL, nc->api->group_start(), "ncclGroupStart", "nccl", st);
    grouped = rc == 0;
  }
  for (uint32_t i = 0; rc == 0 && i < nc->n; i++) {
    if ((rc = ctx_enter(c->devs[i], st)) != 0) break;
    rc = grouped_issue(c, i, desc, t, op, st);
    ctx_leave(c->devs[i]);
  }
  if (grouped) {
    int grc = kiln__nccl_check(nc->api, NULL, nc->api->group_end(), "ncclGroupEnd", "nccl", st);
    if (rc == 0) rc = grc;
  }
  char call[64];
  snprintf(call, sizeof call, "%s through NCCL", name);
  if (rc == 0) rc = kiln__nccl_settle(nc->api, nc->comms, nc->n, deadline, call, "nccl", st);
  if (rc == 0)
    rc = kiln__nccl_stream_wait(nc->api, c->devs[0]->api, nc->comms, ctxs, streams, nc->n, deadline,
                                NULL, call, "nccl", st);
  if (rc && rc != KILN_EINVAL && rc != KILN_EUNIMPL) kiln__nccl_clique_abort(nc);
  for (uint32_t i = nc->n; i-- > 0;) pthread_mutex_unlock(&c->devs[i]->copy_mu);
  return rc;
}

/* A kiln_comm's communicator, created at its first collective (a gang
 * launch's steps use their own, by group), so that a communicator made
 * only to load a mesh costs no NCCL init. */
typedef struct cuda_comm {
  pthread_mutex_t mu; /* one collective at a time on it */
  cuda_clique *c;
} cuda_comm;

static int kiln_cuda_comm_init(kiln_comm *c, kiln_status *st) {
  cuda_comm *cc = kiln_calloc(1, sizeof *cc);
  if (cc == NULL) return kiln_status_set(st, KILN_ENOMEM, "cuda", "out of memory");
  pthread_mutex_init(&cc->mu, NULL);
  c->ctx = cc;
  return 0;
}

static void kiln_cuda_comm_fini(kiln_comm *c) {
  cuda_comm *cc = c->ctx;
  if (cc == NULL) return;
  clique_free(cc->c);
  pthread_mutex_destroy(&cc->mu);
  kiln_free(cc);
  c->ctx = NULL;
}

/* One rank: recv = send (permute: zeros unless the rank sends to itself). */
static int collective_alone(kiln_comm *c, const kiln_collective *desc, kiln_status *st) {
  kiln_device *dv = c->devices[0];
  size_t bytes = (size_t)desc->count * kiln_dtype_size((kiln_dtype)desc->dtype);
  if (desc->op != KILN_OP_COLLECTIVE_PERMUTE || desc->npairs > 0)
    return kiln_cuda_buffer_copy(dv, desc->recv[0]->mem, 0, dv, desc->send[0]->mem, 0, bytes, st);
  cuda_dev *d = dv->ctx;
  int rc = ctx_enter(d, st);
  if (rc) return rc;
  pthread_mutex_lock(&d->copy_mu);
  rc = CK(d, d->api->memset_d8_async((CUdeviceptr)blk_ptr(desc->recv[0]), 0, bytes, d->copy),
          "cuMemsetD8Async", st);
  if (rc == 0) rc = CK(d, d->api->stream_synchronize(d->copy), "cuStreamSynchronize", st);
  pthread_mutex_unlock(&d->copy_mu);
  ctx_leave(d);
  return rc;
}

static int kiln_cuda_collective(kiln_comm *c, const kiln_collective *desc, kiln_status *st) {
  if (c->ndevices == 1) return collective_alone(c, desc, st);
  cuda_comm *cc = c->ctx;
  pthread_mutex_lock(&cc->mu);
  int rc = 0;
  if (cc->c && cc->c->nc->broken) { /* aborted by an earlier error: a new one */
    clique_free(cc->c);
    cc->c = NULL;
  }
  if (cc->c == NULL) rc = clique_open(c->devices, c->ndevices, NULL, c->ndevices, 0, 0, &cc->c, st);
  if (rc == 0) rc = grouped_collective(cc->c, desc, 0, st);
  pthread_mutex_unlock(&cc->mu);
  return rc;
}

struct kiln_cuda_mesh {
  cuda_clique *c;
};

int kiln_cuda_mesh_open(kiln_backend *b, const uint8_t id[KILN_NCCL_ID_BYTES], uint32_t nranks,
                        uint32_t first, kiln_device *const *devices, uint32_t n, double timeout_s,
                        kiln_cuda_mesh **out, kiln_status *st) {
  if (out == NULL) return kiln_status_set(st, KILN_EINVAL, "nccl", "no result pointer");
  *out = NULL;
  if (b == NULL || b->iface != &kiln_cuda_backend_iface)
    return kiln_status_set(st, KILN_EUNAVAIL, "nccl", "a cuda mesh needs the cuda backend");
  if (id == NULL || devices == NULL || n == 0)
    return kiln_status_set(st, KILN_EINVAL, "nccl", "a mesh needs its id and at least one device");
  for (uint32_t i = 0; i < n; i++) {
    if (devices[i] == NULL || devices[i]->backend != b)
      return kiln_status_set(st, KILN_EINVAL, "nccl", "device %u is not of this backend", i);
    for (uint32_t j = 0; j < i; j++)
      if (devices[j] == devices[i])
        return kiln_status_set(st, KILN_EINVAL, "nccl", "device %u is given twice", i);
  }
  kiln_cuda_mesh *m = kiln_calloc(1, sizeof *m);
  if (m == NULL) return kiln_status_set(st, KILN_ENOMEM, "nccl", "out of memory");
  int rc = clique_open(devices, n, id, nranks, first, timeout_s, &m->c, st);
  if (rc) {
    kiln_free(m);
    return rc;
  }
  *out = m;
  return 0;
}

void kiln_cuda_mesh_close(kiln_cuda_mesh *m) {
  if (m == NULL) return;
  clique_free(m->c);
  kiln_free(m);
}

int kiln_cuda_mesh_collective(kiln_cuda_mesh *m, const kiln_collective *desc, double timeout_s,
                              kiln_status *st) {
  if (m == NULL || desc == NULL || desc->send == NULL || desc->recv == NULL)
    return kiln_status_set(st, KILN_EINVAL, "nccl", "no mesh, collective or buffers");
  cuda_clique *c = m->c;
  uint32_t nr = c->nc->nranks;
  size_t es = desc->dtype >= 0 && desc->dtype < KILN_DTYPE_COUNT &&
                      kiln_dtype_is_array((kiln_dtype)desc->dtype)
                  ? kiln_dtype_size((kiln_dtype)desc->dtype)
                  : 0;
  if (es == 0 || desc->count > ((uint64_t)1 << 40))
    return kiln_status_set(st, KILN_EINVAL, "nccl", "element type %d, count %llu", desc->dtype,
                           (unsigned long long)desc->count);
  uint64_t bytes = desc->count * es, want = bytes;
  if (desc->op == KILN_OP_ALL_GATHER) want = bytes * nr;
  if (desc->op == KILN_OP_REDUCE_SCATTER) want = bytes / nr;
  for (uint32_t i = 0; i < c->nc->n; i++) {
    kiln_buffer *sb = desc->send[i], *rb = desc->recv[i];
    if (sb == NULL || rb == NULL || sb->device != c->devs[i]->dv || rb->device != c->devs[i]->dv)
      return kiln_status_set(st, KILN_EINVAL, "nccl", "local rank %u: buffers not on its device",
                             i);
    if (sb->size < bytes || rb->size < want)
      return kiln_status_set(st, KILN_EINVAL, "nccl",
                             "local rank %u: %zu and %zu bytes, %llu and %llu needed", i, sb->size,
                             rb->size, (unsigned long long)bytes, (unsigned long long)want);
  }
  for (uint32_t p = 0; desc->op == KILN_OP_COLLECTIVE_PERMUTE && p < desc->npairs; p++)
    if (desc->pairs == NULL || desc->pairs[2 * p] >= nr || desc->pairs[2 * p + 1] >= nr)
      return kiln_status_set(st, KILN_EINVAL, "nccl", "pair %u names a rank outside 0..%u", p,
                             nr - 1);
  return grouped_collective(c, desc, timeout_s, st);
}

bool kiln_cuda_device_memory(const kiln_device *dv, kiln_cuda_memory *out) {
  memset(out, 0, sizeof *out);
  if (dv == NULL || dv->backend->iface != &kiln_cuda_backend_iface || dv->ctx == NULL) return false;
  cuda_dev *d = dv->ctx;
  out->total = d->total_memory;
  pthread_mutex_lock(&d->alloc.mu);
  out->budget = d->alloc.budget;
  out->live = d->alloc.live;
  out->cached = d->alloc.cached;
  out->peak = d->alloc.peak;
  pthread_mutex_unlock(&d->alloc.mu);
  return true;
}

const kiln_backend_iface kiln_cuda_backend_iface = {
    .name = "cuda",
    .init = kiln_cuda_init,
    .fini = kiln_cuda_fini,
    .device_init = kiln_cuda_device_init,
    .device_fini = kiln_cuda_device_fini,
    .buffer_alloc = kiln_cuda_buffer_alloc,
    .buffer_free = kiln_cuda_buffer_free,
    .buffer_write = kiln_cuda_buffer_write,
    .buffer_read = kiln_cuda_buffer_read,
    .buffer_copy = kiln_cuda_buffer_copy,
    .buffer_host = NULL,
    .shared_memory = false,
    .load = kiln_cuda_load,
    .unload = kiln_cuda_unload,
    .run = kiln_cuda_run,
    .execute = kiln_cuda_execute,
    .execute_async = NULL,
    .run_module = NULL,
    .comm_init = kiln_cuda_comm_init,
    .comm_fini = kiln_cuda_comm_fini,
    .collective = kiln_cuda_collective,
    .synchronize = kiln_cuda_synchronize,
};
