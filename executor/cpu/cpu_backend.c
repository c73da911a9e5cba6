/* The cpu backend's vtable: N worker devices sharing the host's cores.
 *
 * Each device owns a fixed worker pool sized from its share of the cores
 * (or KILN_CPU_THREADS), so an 8-device mesh runs on any machine, each
 * device with its own threads. Device memory is host memory, 64-byte
 * aligned. Parallelism is ours, not OpenBLAS's: the backend sets OpenBLAS to
 * one thread per call and splits GEMMs over the device pool, so devices
 * running side by side never oversubscribe the cores.
 */
#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "executor/cpu/cpu.h"

#define MAX_DEVICES 1024u
#define MAX_THREADS 1024u

typedef struct cpu_backend {
  uint32_t threads_per_device;
  uint64_t max_temp_bytes;
} cpu_backend;

void *kiln__cpu_aligned_alloc(size_t bytes, void **raw) {
  *raw = NULL;
  if (bytes > SIZE_MAX - 64) return NULL;
  char *p = kiln_malloc(bytes + 64);
  if (p == NULL) return NULL;
  *raw = p;
  return (void *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

/* A positive integer from the environment; 0 when unset. */
static int env_count(const char *name, uint32_t max, uint32_t *out, kiln_status *st) {
  *out = 0;
  const char *s = getenv(name);
  if (s == NULL || *s == '\0') return 0;
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || *end || v == 0 || v > max || s[0] == '-')
    return kiln_status_set(st, KILN_EINVAL, "cpu", "%s=%.32s: expected an integer in [1, %u]", name,
                           s, max);
  *out = (uint32_t)v;
  return 0;
}

static uint32_t available_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return (uint32_t)n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (uint32_t)n : 1;
}

static uint64_t default_max_temp(void) {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || size <= 0) return UINT64_C(1) << 32;
  return (uint64_t)pages * (uint64_t)size / 2;
}

static int kiln_cpu_init(kiln_backend *b, const kiln_backend_options *opts, uint32_t *ndevices,
                         kiln_status *st) {
  uint32_t n = opts->ndevices, threads = opts->threads_per_device;
  int rc;
  if (n == 0 && (rc = env_count("KILN_CPU_DEVICES", MAX_DEVICES, &n, st)) != 0) return rc;
  if (n == 0) n = 1;
  if (n > MAX_DEVICES)
    return kiln_status_set(st, KILN_EINVAL, "cpu", "%u devices asked, at most %u", n, MAX_DEVICES);
  if (threads == 0 && (rc = env_count("KILN_CPU_THREADS", MAX_THREADS, &threads, st)) != 0)
    return rc;
  if (threads == 0) threads = available_cores() / n;
  if (threads == 0) threads = 1;
  if (threads > MAX_THREADS)
    return kiln_status_set(st, KILN_EINVAL, "cpu", "%u threads per device asked, at most %u",
                           threads, MAX_THREADS);
  cpu_backend *c = kiln_calloc(1, sizeof *c);
  if (c == NULL) return kiln_status_set(st, KILN_ENOMEM, "cpu", "out of memory");
  c->threads_per_device = threads;
  c->max_temp_bytes = opts->max_temp_bytes ? opts->max_temp_bytes : default_max_temp();
  /* GEMMs are split over our pools; OpenBLAS threads on top would
   * oversubscribe the cores. The setting is process-wide. */
  openblas_set_num_threads(1);
  b->ctx = c;
  *ndevices = n;
  return 0;
}

static void kiln_cpu_fini(kiln_backend *b) { kiln_free(b->ctx); }

static int kiln_cpu_device_init(kiln_device *d, kiln_status *st) {
  cpu_backend *c = d->backend->ctx;
  kiln__cpu_device *dev = kiln_calloc(1, sizeof *dev);
  if (dev == NULL) return kiln_status_set(st, KILN_ENOMEM, "cpu", "out of memory");
  dev->max_temp_bytes = c->max_temp_bytes;
  int rc = kiln__cpu_pool_create(c->threads_per_device, &dev->pool, st);
  if (rc) {
    kiln_free(dev);
    return rc;
  }
  d->ctx = dev;
  d->nthreads = kiln__cpu_pool_threads(dev->pool);
  return 0;
}

static void kiln_cpu_device_fini(kiln_device *d) {
  kiln__cpu_device *dev = d->ctx;
  kiln__cpu_pool_destroy(dev->pool);
  kiln_free(dev);
}

/* Buffers keep their raw allocation pointer just before the aligned start. */
static int kiln_cpu_buffer_alloc(kiln_device *d, size_t bytes, void **mem, kiln_status *st) {
  void *raw;
  char *p = bytes > SIZE_MAX - 128 ? NULL : kiln__cpu_aligned_alloc(bytes + 64, &raw);
  if (p == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "cpu", "out of memory for a buffer of %zu bytes",
                           bytes);
  ((void **)(p + 64))[-1] = raw;
  memset(p + 64, 0, bytes);
  *mem = p + 64;
  return 0;
}

static void kiln_cpu_buffer_free(kiln_device *d, void *mem) { kiln_free(((void **)mem)[-1]); }

static int kiln_cpu_buffer_write(kiln_device *d, void *mem, size_t offset, const void *src,
                                 size_t n, kiln_status *st) {
  memcpy((char *)mem + offset, src, n);
  return 0;
}

static int kiln_cpu_buffer_read(kiln_device *d, const void *mem, size_t offset, void *dst, size_t n,
                                kiln_status *st) {
  memcpy(dst, (const char *)mem + offset, n);
  return 0;
}

static int kiln_cpu_load(kiln_loaded *l, kiln_status *st) {
  kiln__cpu_loaded *cl;
  int rc = kiln__cpu_load(l->device->ctx, l->exe, &cl, st);
  if (rc == 0) l->ctx = cl;
  return rc;
}

static void kiln_cpu_unload(kiln_loaded *l) { kiln__cpu_unload(l->ctx); }

static int kiln_cpu_execute(kiln_loaded *l, kiln_buffer *const *args, const kiln_run_options *opts,
                            kiln_buffer *const *results, kiln_status *st) {
  const kiln_executable *e = l->exe;
  int rc = KILN_ENOMEM;
  const void **params = kiln_calloc(e->nparam_leaves + 1, sizeof *params);
  void **outs = kiln_calloc(e->nresults + 1, sizeof *outs);
  if (params == NULL || outs == NULL) {
    kiln_status_set(st, rc, "cpu", "out of memory");
    goto out_free;
  }
  for (uint32_t i = 0; i < e->nparam_leaves; i++) params[i] = args[i]->mem;
  for (uint32_t i = 0; i < e->nresults; i++) outs[i] = results[i]->mem;
  rc = kiln__cpu_run(l->ctx, params, outs, opts, st);
out_free:
  kiln_free(params);
  kiln_free(outs);
  return rc;
}

const kiln_backend_iface kiln_cpu_backend_iface = {
    .name = "cpu",
    .init = kiln_cpu_init,
    .fini = kiln_cpu_fini,
    .device_init = kiln_cpu_device_init,
    .device_fini = kiln_cpu_device_fini,
    .buffer_alloc = kiln_cpu_buffer_alloc,
    .buffer_free = kiln_cpu_buffer_free,
    .buffer_write = kiln_cpu_buffer_write,
    .buffer_read = kiln_cpu_buffer_read,
    .load = kiln_cpu_load,
    .unload = kiln_cpu_unload,
    .run = kiln__cpu_run_literals,
    .execute = kiln_cpu_execute,
    .run_module = NULL,
    .all_reduce = NULL,
    .all_gather = NULL,
    .reduce_scatter = NULL,
    .all_to_all = NULL,
    .collective_permute = NULL,
    .synchronize = NULL,
};
