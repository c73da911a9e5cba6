/* A fake NVIDIA driver (libcuda.so.1) for test_cuda_fake: the entry points
 * the cuda backend takes through cuGetProcAddress_v2, with device memory
 * in host memory, so that the backend's host side (contexts, streams,
 * allocator, staging, module loading, argument vectors, launches, while
 * and conditional programs, completion, every error path) runs on a
 * machine without a GPU.
 *
 * Every device address the backend hands the driver is checked against
 * the live allocations (a copy, memset or launch outside one fails the
 * test through a counter, and the call returns CUDA_ERROR_ILLEGAL_ADDRESS),
 * contexts must be pushed and popped in pairs, and the test reads the
 * counters back. Kernels cannot run a cubin here: the test hands the fake
 * either the same program's kernels compiled for the cpu target
 * (kiln_fake_cuda_set_kernels), and a launch calls kernel N over the
 * launch's whole [begin, end) on the calling thread, or the cubin's own
 * CUDA C built for the host with cuda_emu.h and its block runner
 * (kiln_fake_cuda_set_emulator), and a launch runs every block of its grid
 * in turn, the last first, with the launch's block size (up to 1024
 * threads) and dynamic shared memory (up to the 48 KiB a launch gets
 * without opting in to more); a block that fails (a barrier nobody can
 * pass, ...) fails the launch with CUDA_ERROR_LAUNCH_FAILED and its reason
 * (kiln_fake_cuda_launch_error). The static shared memory size a kernel
 * reports (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES) is the test's
 * (kiln_fake_cuda_set_shared: what ptxas would say of the cubin). Streams
 * and events are synchronous. A call can be made to fail
 * (kiln_fake_cuda_fail).
 *
 * Env KILN_FAKE_CUDA_DEVICES (1..16, default 1) sets how many GPUs it has:
 * each its own primary context, the current one kept per thread, and each
 * allocation and stream remembers the device that was current when it was
 * made, so that the fake NCCL (fake_nccl.c) can check that a collective's
 * buffers and stream belong to its communicator's device
 * (kiln_fake_cuda_device_of, kiln_fake_cuda_stream_device).
 * The fake cuBLASLt beside it checks its addresses through
 * kiln_fake_cuda_inside.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*kernel_fn)(void *const *bufs, int64_t begin, int64_t end);
/* cuda_emu.h's kemu_block: runs block b of a grid of g blocks of bd
 * threads; 0, or -1 with the reason in err. */
typedef int (*emu_block_fn)(kernel_fn k, void *const *bufs, int64_t begin, int64_t end, unsigned b,
                            unsigned g, unsigned bd, unsigned dyn, char *err, size_t nerr);

#define MAX_DYN_SHARED (48u << 10)

#define MAX_ALLOCS 65536
#define MAX_DEVICES 16
#define CTX_STACK 64

typedef struct fake_stats {
  long allocs, frees, bad_addresses, launches, ctx_depth, modules, bad_frees;
  uint64_t live_bytes;
  int max_grid, max_block;
  /* launches of kernels with static shared memory (kiln_fake_cuda_set_shared) */
  long coop_launches;
  int coop_max_grid, coop_min_block, coop_max_block;
} fake_stats;

static struct {
  pthread_mutex_t mu;
  struct {
    char *p;
    size_t n;
    int dev; /* current when it was allocated */
  } live[MAX_ALLOCS];
  int nlive;
  int ndevices;
  kernel_fn *kernels;
  unsigned nkernels;
  /* With an emulator: a launch runs every block of its grid in turn. */
  emu_block_fn emu_block;
  const unsigned *shared; /* nkernels: static shared bytes; NULL: none */
  char launch_error[256];
  fake_stats s;
  char fail_call[64];
  long fail_after; /* calls of fail_call that still succeed */
  CUresult fail_with;
} fk = {.mu = PTHREAD_MUTEX_INITIALIZER, .ndevices = 1};

/* This thread's pushed contexts, as device numbers. */
static __thread int ctx_stack[CTX_STACK];
static __thread int ctx_top;

typedef struct fake_stream {
  int dev;
} fake_stream;

/* ---- the test's side ------------------------------------------------------ */

void kiln_fake_cuda_set_kernels(kernel_fn *fns, unsigned n) {
  fk.kernels = fns;
  fk.nkernels = n;
}

/* The cubin's own CUDA C built for the host (test_cuda_fake): run() runs
 * one block of a launch; NULL: the kernels are cpu ones over the range. */
void kiln_fake_cuda_set_emulator(emu_block_fn run) { fk.emu_block = run; }

/* Per kernel (as many as set_kernels gave), its static shared memory in
 * bytes; NULL: none uses any. */
void kiln_fake_cuda_set_shared(const unsigned *bytes) { fk.shared = bytes; }

/* Why the last launch that failed in a block failed ("" if none did). */
const char *kiln_fake_cuda_launch_error(void) { return fk.launch_error; }

void kiln_fake_cuda_stats(fake_stats *out) {
  pthread_mutex_lock(&fk.mu);
  *out = fk.s;
  pthread_mutex_unlock(&fk.mu);
}

/* Call `name` fails with r after `after` more successful calls. */
void kiln_fake_cuda_fail(const char *name, long after, int r) {
  pthread_mutex_lock(&fk.mu);
  snprintf(fk.fail_call, sizeof fk.fail_call, "%s", name ? name : "");
  fk.fail_after = after;
  fk.fail_with = (CUresult)r;
  pthread_mutex_unlock(&fk.mu);
}

static bool failing(const char *name) {
  pthread_mutex_lock(&fk.mu);
  bool f = false;
  if (fk.fail_call[0] && strcmp(fk.fail_call, name) == 0) f = fk.fail_after-- <= 0;
  pthread_mutex_unlock(&fk.mu);
  return f;
}
#define FAIL(name) \
  do { \
    if (failing(name)) return fk.fail_with; \
  } while (0)

/* Whether [p, p + n) lies inside one live allocation. */
static bool inside(uint64_t p, size_t n) {
  pthread_mutex_lock(&fk.mu);
  bool ok = false;
  for (int i = 0; i < fk.nlive && !ok; i++) {
    uint64_t b = (uint64_t)(uintptr_t)fk.live[i].p;
    ok = p >= b && n <= fk.live[i].n && p - b <= fk.live[i].n - n;
  }
  if (!ok) fk.s.bad_addresses++;
  pthread_mutex_unlock(&fk.mu);
  return ok;
}

/* The device of the live allocation holding [p, p + n), or -1. */
int kiln_fake_cuda_device_of(uint64_t p, size_t n) {
  pthread_mutex_lock(&fk.mu);
  int dev = -1;
  for (int i = 0; i < fk.nlive && dev < 0; i++) {
    uint64_t b = (uint64_t)(uintptr_t)fk.live[i].p;
    if (p >= b && n <= fk.live[i].n && p - b <= fk.live[i].n - n) dev = fk.live[i].dev;
  }
  pthread_mutex_unlock(&fk.mu);
  return dev;
}

/* The calling thread's current device, or -1 when no context is pushed. */
int kiln_fake_cuda_current_device(void) { return ctx_top > 0 ? ctx_stack[ctx_top - 1] : -1; }

/* The device a stream was created on, or -1 for NULL (the legacy stream). */
int kiln_fake_cuda_stream_device(CUstream s) { return s ? ((fake_stream *)s)->dev : -1; }

/* For the fake cuBLASLt (fake_cublaslt.c), which checks the addresses it
 * is given and that a context is current as the real library needs. */
bool kiln_fake_cuda_inside(uint64_t p, size_t n) { return inside(p, n); }

long kiln_fake_cuda_ctx_depth(void) {
  pthread_mutex_lock(&fk.mu);
  long d = fk.s.ctx_depth;
  pthread_mutex_unlock(&fk.mu);
  return d;
}

/* ---- the driver ------------------------------------------------------------ */

static CUresult f_init(unsigned flags) {
  (void)flags;
  FAIL("cuInit");
  const char *e = getenv("KILN_FAKE_CUDA_DEVICES");
  int n = e && e[0] ? atoi(e) : 1;
  fk.ndevices = n < 1 ? 1 : n > MAX_DEVICES ? MAX_DEVICES : n;
  return CUDA_SUCCESS;
}
static CUresult f_get_error_name(CUresult r, const char **s) {
  switch (r) {
  case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
  case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
  case CUDA_ERROR_NO_BINARY_FOR_GPU: *s = "CUDA_ERROR_NO_BINARY_FOR_GPU"; break;
  case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
  case CUDA_ERROR_LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; break;
  default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
static CUresult f_get_error_string(CUresult r, const char **s) {
  (void)r;
  *s = "fake driver error";
  return CUDA_SUCCESS;
}
static CUresult f_device_get_count(int *n) {
  *n = fk.ndevices;
  return CUDA_SUCCESS;
}
static CUresult f_device_get(CUdevice *d, int i) {
  if (i < 0 || i >= fk.ndevices) return CUDA_ERROR_INVALID_DEVICE;
  *d = i;
  return CUDA_SUCCESS;
}
static CUresult f_device_get_name(char *name, int len, CUdevice d) {
  (void)d;
  snprintf(name, (size_t)len, "Kiln fake GPU");
  return CUDA_SUCCESS;
}
static CUresult f_device_total_mem(size_t *bytes, CUdevice d) {
  (void)d;
  *bytes = (size_t)1 << 30;
  return CUDA_SUCCESS;
}
static CUresult f_device_get_attribute(int *v, CUdevice_attribute a, CUdevice d) {
  (void)d;
  switch (a) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 4; break;
  default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}
static int the_ctx[MAX_DEVICES];
static int ctx_device(CUcontext c) {
  for (int i = 0; i < fk.ndevices; i++)
    if (c == (CUcontext)&the_ctx[i]) return i;
  return -1;
}
static CUresult f_primary_ctx_retain(CUcontext *c, CUdevice d) {
  FAIL("cuDevicePrimaryCtxRetain");
  if (d < 0 || d >= fk.ndevices) return CUDA_ERROR_INVALID_DEVICE;
  *c = (CUcontext)&the_ctx[d];
  return CUDA_SUCCESS;
}
static CUresult f_primary_ctx_release(CUdevice d) {
  (void)d;
  return CUDA_SUCCESS;
}
static CUresult f_ctx_push(CUcontext c) {
  int dev = ctx_device(c);
  if (dev < 0 || ctx_top == CTX_STACK) return CUDA_ERROR_INVALID_CONTEXT;
  ctx_stack[ctx_top++] = dev;
  pthread_mutex_lock(&fk.mu);
  fk.s.ctx_depth++;
  pthread_mutex_unlock(&fk.mu);
  return CUDA_SUCCESS;
}
static CUresult f_ctx_pop(CUcontext *c) {
  if (ctx_top == 0) return CUDA_ERROR_INVALID_CONTEXT;
  int dev = ctx_stack[--ctx_top];
  pthread_mutex_lock(&fk.mu);
  fk.s.ctx_depth--;
  pthread_mutex_unlock(&fk.mu);
  if (c) *c = (CUcontext)&the_ctx[dev];
  return CUDA_SUCCESS;
}
static int an_event;
static CUresult f_stream_create(CUstream *s, unsigned flags) {
  (void)flags;
  FAIL("cuStreamCreate");
  if (ctx_top == 0) return CUDA_ERROR_INVALID_CONTEXT;
  fake_stream *fs = malloc(sizeof *fs);
  if (fs == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  fs->dev = ctx_stack[ctx_top - 1];
  *s = (CUstream)fs;
  return CUDA_SUCCESS;
}
static CUresult f_stream_destroy(CUstream s) {
  free(s);
  return CUDA_SUCCESS;
}
static CUresult f_stream_query(CUstream s) {
  (void)s;
  FAIL("cuStreamQuery");
  return CUDA_SUCCESS; /* synchronous: everything issued has run */
}
static CUresult f_stream_synchronize(CUstream s) {
  (void)s;
  FAIL("cuStreamSynchronize");
  return CUDA_SUCCESS;
}
static CUresult f_stream_wait_event(CUstream s, CUevent e, unsigned flags) {
  (void)s, (void)e, (void)flags;
  return CUDA_SUCCESS;
}
static CUresult f_event_create(CUevent *e, unsigned flags) {
  (void)flags;
  *e = (CUevent)&an_event;
  return CUDA_SUCCESS;
}
static CUresult f_event_destroy(CUevent e) {
  (void)e;
  return CUDA_SUCCESS;
}
static CUresult f_event_record(CUevent e, CUstream s) {
  (void)e, (void)s;
  return CUDA_SUCCESS;
}
static CUresult f_event_synchronize(CUevent e) {
  (void)e;
  FAIL("cuEventSynchronize");
  return CUDA_SUCCESS;
}
static CUresult f_mem_alloc(CUdeviceptr *p, size_t n) {
  FAIL("cuMemAlloc");
  if (n == 0) return CUDA_ERROR_INVALID_VALUE;
  char *m = aligned_alloc(256, (n + 255) / 256 * 256);
  if (m == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  memset(m, 0xa5, n); /* device memory is not zeroed */
  pthread_mutex_lock(&fk.mu);
  if (fk.nlive == MAX_ALLOCS) {
    pthread_mutex_unlock(&fk.mu);
    free(m);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  fk.live[fk.nlive].p = m;
  fk.live[fk.nlive].n = n;
  fk.live[fk.nlive].dev = ctx_top > 0 ? ctx_stack[ctx_top - 1] : -1;
  fk.nlive++;
  fk.s.allocs++;
  fk.s.live_bytes += n;
  pthread_mutex_unlock(&fk.mu);
  *p = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}
static CUresult f_mem_free(CUdeviceptr p) {
  pthread_mutex_lock(&fk.mu);
  for (int i = 0; i < fk.nlive; i++)
    if ((uint64_t)(uintptr_t)fk.live[i].p == p) {
      free(fk.live[i].p);
      fk.s.live_bytes -= fk.live[i].n;
      fk.live[i] = fk.live[--fk.nlive];
      fk.s.frees++;
      pthread_mutex_unlock(&fk.mu);
      return CUDA_SUCCESS;
    }
  fk.s.bad_frees++;
  pthread_mutex_unlock(&fk.mu);
  return CUDA_ERROR_INVALID_VALUE;
}
static CUresult f_mem_host_alloc(void **p, size_t n, unsigned flags) {
  (void)flags;
  FAIL("cuMemHostAlloc");
  *p = malloc(n);
  return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_mem_free_host(void *p) {
  free(p);
  return CUDA_SUCCESS;
}
static CUresult f_memcpy_htod(CUdeviceptr d, const void *h, size_t n, CUstream s) {
  (void)s;
  FAIL("cuMemcpyHtoDAsync");
  if (!inside(d, n)) return CUDA_ERROR_ILLEGAL_ADDRESS;
  memcpy((void *)(uintptr_t)d, h, n);
  return CUDA_SUCCESS;
}
static CUresult f_memcpy_dtoh(void *h, CUdeviceptr d, size_t n, CUstream s) {
  (void)s;
  FAIL("cuMemcpyDtoHAsync");
  if (!inside(d, n)) return CUDA_ERROR_ILLEGAL_ADDRESS;
  memcpy(h, (const void *)(uintptr_t)d, n);
  return CUDA_SUCCESS;
}
static CUresult f_memcpy_dtod(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
  (void)st;
  if (!inside(d, n) || !inside(s, n)) return CUDA_ERROR_ILLEGAL_ADDRESS;
  uint64_t lo = d < s ? d : s, hi = d < s ? s : d;
  if (lo + n > hi) return CUDA_ERROR_INVALID_VALUE; /* overlapping: undefined on a GPU */
  memcpy((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
  return CUDA_SUCCESS;
}
static CUresult f_memset_d8(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  (void)s;
  if (!inside(d, n)) return CUDA_ERROR_ILLEGAL_ADDRESS;
  memset((void *)(uintptr_t)d, v, n);
  return CUDA_SUCCESS;
}
static int a_module;
static CUresult f_module_load_data(CUmodule *m, const void *image) {
  FAIL("cuModuleLoadData");
  if (memcmp(image, "\177ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  pthread_mutex_lock(&fk.mu);
  fk.s.modules++;
  pthread_mutex_unlock(&fk.mu);
  *m = (CUmodule)&a_module;
  return CUDA_SUCCESS;
}
static CUresult f_module_unload(CUmodule m) {
  (void)m;
  pthread_mutex_lock(&fk.mu);
  fk.s.modules--;
  pthread_mutex_unlock(&fk.mu);
  return CUDA_SUCCESS;
}
static CUresult f_module_get_function(CUfunction *f, CUmodule m, const char *name) {
  (void)m;
  unsigned k;
  char tail;
  if (sscanf(name, "kiln_kernel_%u%c", &k, &tail) != 1) return CUDA_ERROR_NOT_FOUND;
  *f = (CUfunction)(uintptr_t)(k + 1);
  return CUDA_SUCCESS;
}
static CUresult f_func_get_attribute(int *v, CUfunction_attribute a, CUfunction f) {
  unsigned k = (unsigned)(uintptr_t)f - 1;
  *v = 0;
  if (a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) *v = 1024;
  if (a == CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES && fk.shared && k < fk.nkernels)
    *v = (int)fk.shared[k];
  return CUDA_SUCCESS;
}
static CUresult f_launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,
                                void **extra) {
  (void)s;
  FAIL("cuLaunchKernel");
  unsigned k = (unsigned)(uintptr_t)f - 1;
  if (gx == 0 || bx == 0 || gy != 1 || gz != 1 || by != 1 || bz != 1 || bx > 1024 ||
      shmem > MAX_DYN_SHARED || extra || params == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (fk.kernels == NULL || k >= fk.nkernels) return CUDA_ERROR_LAUNCH_FAILED;
  CUdeviceptr bufs;
  int64_t begin, end;
  memcpy(&bufs, params[0], sizeof bufs);
  memcpy(&begin, params[1], sizeof begin);
  memcpy(&end, params[2], sizeof end);
  if (!inside(bufs, 8)) return CUDA_ERROR_ILLEGAL_ADDRESS;
  pthread_mutex_lock(&fk.mu);
  fk.s.launches++;
  if ((int)gx > fk.s.max_grid) fk.s.max_grid = (int)gx;
  if ((int)bx > fk.s.max_block) fk.s.max_block = (int)bx;
  if (fk.shared && k < fk.nkernels && fk.shared[k]) {
    fk.s.coop_launches++;
    if ((int)gx > fk.s.coop_max_grid) fk.s.coop_max_grid = (int)gx;
    if (fk.s.coop_min_block == 0 || (int)bx < fk.s.coop_min_block) fk.s.coop_min_block = (int)bx;
    if ((int)bx > fk.s.coop_max_block) fk.s.coop_max_block = (int)bx;
  }
  pthread_mutex_unlock(&fk.mu);
  if (fk.emu_block == NULL) {
    fk.kernels[k]((void *const *)(uintptr_t)bufs, begin, end);
    return CUDA_SUCCESS;
  }
  for (unsigned b = gx; b-- > 0;) {
    char why[200];
    if (fk.emu_block(fk.kernels[k], (void *const *)(uintptr_t)bufs, begin, end, b, gx, bx, shmem,
                     why, sizeof why) != 0) {
      snprintf(fk.launch_error, sizeof fk.launch_error, "kiln_kernel_%u, block %u of %u: %s", k, b,
               gx, why);
      fprintf(stderr, "fake cuda: %s\n", fk.launch_error);
      return CUDA_ERROR_LAUNCH_FAILED;
    }
  }
  return CUDA_SUCCESS;
}

static const struct {
  const char *name;
  void *fn;
} table[] = {
    {"cuInit", (void *)f_init},
    {"cuGetErrorName", (void *)f_get_error_name},
    {"cuGetErrorString", (void *)f_get_error_string},
    {"cuDeviceGetCount", (void *)f_device_get_count},
    {"cuDeviceGet", (void *)f_device_get},
    {"cuDeviceGetName", (void *)f_device_get_name},
    {"cuDeviceTotalMem", (void *)f_device_total_mem},
    {"cuDeviceGetAttribute", (void *)f_device_get_attribute},
    {"cuDevicePrimaryCtxRetain", (void *)f_primary_ctx_retain},
    {"cuDevicePrimaryCtxRelease", (void *)f_primary_ctx_release},
    {"cuCtxPushCurrent", (void *)f_ctx_push},
    {"cuCtxPopCurrent", (void *)f_ctx_pop},
    {"cuStreamCreate", (void *)f_stream_create},
    {"cuStreamDestroy", (void *)f_stream_destroy},
    {"cuStreamSynchronize", (void *)f_stream_synchronize},
    {"cuStreamQuery", (void *)f_stream_query},
    {"cuStreamWaitEvent", (void *)f_stream_wait_event},
    {"cuEventCreate", (void *)f_event_create},
    {"cuEventDestroy", (void *)f_event_destroy},
    {"cuEventRecord", (void *)f_event_record},
    {"cuEventSynchronize", (void *)f_event_synchronize},
    {"cuMemAlloc", (void *)f_mem_alloc},
    {"cuMemFree", (void *)f_mem_free},
    {"cuMemHostAlloc", (void *)f_mem_host_alloc},
    {"cuMemFreeHost", (void *)f_mem_free_host},
    {"cuMemcpyHtoDAsync", (void *)f_memcpy_htod},
    {"cuMemcpyDtoHAsync", (void *)f_memcpy_dtoh},
    {"cuMemcpyDtoDAsync", (void *)f_memcpy_dtod},
    {"cuMemsetD8Async", (void *)f_memset_d8},
    {"cuModuleLoadData", (void *)f_module_load_data},
    {"cuModuleUnload", (void *)f_module_unload},
    {"cuModuleGetFunction", (void *)f_module_get_function},
    {"cuFuncGetAttribute", (void *)f_func_get_attribute},
    {"cuLaunchKernel", (void *)f_launch_kernel},
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  (void)version, (void)flags;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(table[i].name, symbol) == 0) {
      *pfn = table[i].fn;
      if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  *pfn = NULL;
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}
