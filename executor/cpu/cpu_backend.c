/* The cpu backend's vtable: N worker devices sharing the host's cores.
 *
 * Each device owns a fixed worker pool sized from its share of the cores
 * (or KILN_CPU_THREADS), so an 8-device mesh runs on any machine, each
 * device with its own threads. Device memory is host memory, 64-byte
 * aligned. Parallelism is ours, not OpenBLAS's: the backend sets OpenBLAS to
 * one thread per call and splits GEMMs over the device pool, so devices
 * running side by side never oversubscribe the cores.
 *
 * Large buffers are recycled: a freed buffer of at least CACHE_MIN_BYTES
 * stays in a small per-device cache and the next allocation of about its
 * size takes it back, pages already mapped. A program's outputs are the
 * typical case (allocated, written, read back, freed, run after run);
 * without the cache every run would map, fault in and zero fresh pages,
 * which costs as much as a memory-bound kernel itself. The zero-fill the
 * vtable promises is lazy for recycled buffers: the buffer is marked
 * pending and zeroed on first access (write, read, use as an argument),
 * except when a run writes it whole as a result, where the zeroes would
 * only be overwritten. Memory handed out is reachable only through this
 * vtable, so nobody can observe a pending buffer's old contents.
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
#define CACHE_MIN_BYTES (UINT64_C(256) << 10) /* smaller buffers: malloc does well */
#define CACHE_MAX_BYTES (UINT64_C(1) << 30)   /* per device, at most */

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

/* ---- buffers ------------------------------------------------------------ */

/* The 64 bytes before a buffer's memory. */
typedef struct buf_hdr {
  void *raw;        /* what kiln_free takes */
  size_t size;      /* bytes asked for */
  size_t cap;       /* bytes usable from the buffer's start */
  _Atomic int zero; /* ZERO_*: whether the promised zeroes are still owed */
} buf_hdr;

_Static_assert(sizeof(buf_hdr) <= 64, "the buffer header fits its 64 bytes");

enum { ZERO_DONE, ZERO_PENDING, ZERO_BUSY };

static buf_hdr *hdr_of(const void *mem) { return (buf_hdr *)((uintptr_t)mem - 64); }

/* Pays the zeroes a recycled buffer owes; concurrent callers wait for the
 * one that zeroes. */
static void buffer_settle(const void *mem) {
  buf_hdr *h = hdr_of(mem);
  int z = atomic_load_explicit(&h->zero, memory_order_acquire);
  if (z == ZERO_DONE) return;
  if (z == ZERO_PENDING && atomic_compare_exchange_strong(&h->zero, &z, ZERO_BUSY)) {
    memset((void *)mem, 0, h->size);
    atomic_store_explicit(&h->zero, ZERO_DONE, memory_order_release);
    return;
  }
  while (atomic_load_explicit(&h->zero, memory_order_acquire) != ZERO_DONE) sched_yield();
}

/* The caller is about to write all of mem: the zeroes need not be paid. */
static void buffer_overwritten(void *mem) {
  atomic_store_explicit(&hdr_of(mem)->zero, ZERO_DONE, memory_order_release);
}

/* A cached buffer that fits `bytes` without wasting more than a quarter of
 * it, the smallest such; NULL when none. */
static buf_hdr *cache_take(kiln__cpu_device *dev, size_t bytes) {
  if (bytes < CACHE_MIN_BYTES) return NULL;
  buf_hdr *best = NULL;
  uint32_t at = 0;
  pthread_mutex_lock(&dev->cache_mu);
  for (uint32_t i = 0; i < dev->ncache; i++) {
    buf_hdr *h = dev->cache[i];
    if (h->cap >= bytes && h->cap - bytes <= h->cap / 4 && (best == NULL || h->cap < best->cap)) {
      best = h;
      at = i;
    }
  }
  if (best) {
    memmove(&dev->cache[at], &dev->cache[at + 1], (dev->ncache - at - 1) * sizeof *dev->cache);
    dev->ncache--;
    dev->cache_bytes -= best->cap;
  }
  pthread_mutex_unlock(&dev->cache_mu);
  return best;
}

/* Keeps h for reuse, evicting the oldest entries to make room; false when
 * h is not worth keeping (the caller frees it). */
static bool cache_put(kiln__cpu_device *dev, buf_hdr *h) {
  if (h->cap < CACHE_MIN_BYTES || h->cap > dev->max_cache_bytes) return false;
  void *evicted[KILN__CPU_BUFFER_CACHE];
  uint32_t nev = 0;
  pthread_mutex_lock(&dev->cache_mu);
  while (dev->ncache > 0 && (dev->ncache == KILN__CPU_BUFFER_CACHE ||
                             dev->cache_bytes + h->cap > dev->max_cache_bytes)) {
    buf_hdr *old = dev->cache[0];
    evicted[nev++] = old->raw;
    dev->cache_bytes -= old->cap;
    memmove(&dev->cache[0], &dev->cache[1], (dev->ncache - 1) * sizeof *dev->cache);
    dev->ncache--;
  }
  dev->cache[dev->ncache++] = h;
  dev->cache_bytes += h->cap;
  pthread_mutex_unlock(&dev->cache_mu);
  for (uint32_t i = 0; i < nev; i++) kiln_free(evicted[i]);
  return true;
}

static void cache_clear(kiln__cpu_device *dev) {
  for (uint32_t i = 0; i < dev->ncache; i++) kiln_free(((buf_hdr *)dev->cache[i])->raw);
  dev->ncache = 0;
  dev->cache_bytes = 0;
}

/* Fresh buffers come from calloc: large ones are new mappings the kernel
 * has zeroed already, so calloc skips the memset malloc + memset would do. */
static int kiln_cpu_buffer_alloc(kiln_device *d, size_t bytes, void **mem, kiln_status *st) {
  kiln__cpu_device *dev = d->ctx;
  buf_hdr *h = cache_take(dev, bytes);
  if (h) {
    h->size = bytes;
    atomic_store_explicit(&h->zero, ZERO_PENDING, memory_order_relaxed);
    *mem = (char *)h + 64;
    return 0;
  }
  char *raw = bytes > SIZE_MAX - 128 ? NULL : kiln_calloc(1, bytes + 128);
  if (raw == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "cpu", "out of memory for a buffer of %zu bytes",
                           bytes);
  h = (buf_hdr *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
  h->raw = raw;
  h->size = h->cap = bytes;
  atomic_init(&h->zero, ZERO_DONE);
  *mem = (char *)h + 64;
  return 0;
}

static void kiln_cpu_buffer_free(kiln_device *d, void *mem) {
  buf_hdr *h = hdr_of(mem);
  if (!cache_put(d->ctx, h)) kiln_free(h->raw);
}

static int kiln_cpu_buffer_write(kiln_device *d, void *mem, size_t offset, const void *src,
                                 size_t n, kiln_status *st) {
  if (offset == 0 && n == hdr_of(mem)->size)
    buffer_overwritten(mem);
  else
    buffer_settle(mem);
  memcpy((char *)mem + offset, src, n);
  return 0;
}

static int kiln_cpu_buffer_read(kiln_device *d, const void *mem, size_t offset, void *dst, size_t n,
                                kiln_status *st) {
  buffer_settle(mem);
  memcpy(dst, (const char *)mem + offset, n);
  return 0;
}

/* Devices share the host's memory: a copy between two of them is a memcpy. */
static int kiln_cpu_buffer_copy(kiln_device *dd, void *dst, size_t dst_offset, kiln_device *sd,
                                const void *src, size_t src_offset, size_t n, kiln_status *st) {
  (void)dd, (void)sd, (void)st;
  buffer_settle(src);
  if (dst_offset == 0 && n == hdr_of(dst)->size)
    buffer_overwritten(dst);
  else
    buffer_settle(dst);
  memcpy((char *)dst + dst_offset, (const char *)src + src_offset, n);
  return 0;
}

static void *kiln_cpu_buffer_host(kiln_device *d, void *mem, bool discard) {
  (void)d;
  if (discard)
    buffer_overwritten(mem);
  else
    buffer_settle(mem);
  return mem;
}

/* ---- devices ------------------------------------------------------------ */

static int kiln_cpu_device_init(kiln_device *d, kiln_status *st) {
  cpu_backend *c = d->backend->ctx;
  kiln__cpu_device *dev = kiln_calloc(1, sizeof *dev);
  if (dev == NULL) return kiln_status_set(st, KILN_ENOMEM, "cpu", "out of memory");
  dev->max_temp_bytes = c->max_temp_bytes;
  dev->max_cache_bytes =
      default_max_temp() / 8 < CACHE_MAX_BYTES ? default_max_temp() / 8 : CACHE_MAX_BYTES;
  pthread_mutex_init(&dev->cache_mu, NULL);
  int rc = kiln__cpu_pool_create(c->threads_per_device, &dev->pool, st);
  if (rc) {
    pthread_mutex_destroy(&dev->cache_mu);
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
  cache_clear(dev);
  pthread_mutex_destroy(&dev->cache_mu);
  kiln_free(dev);
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
  for (uint32_t i = 0; i < e->nparam_leaves; i++) {
    buffer_settle(args[i]->mem);
    params[i] = args[i]->mem;
  }
  /* A run writes every byte of every result (a program stores each output
   * element, or copies a whole leaf into it), so their zeroes are moot. */
  for (uint32_t i = 0; i < e->nresults; i++) {
    buffer_overwritten(results[i]->mem);
    outs[i] = results[i]->mem;
  }
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
    .buffer_copy = kiln_cpu_buffer_copy,
    .buffer_host = kiln_cpu_buffer_host,
    .shared_memory = true,
    .load = kiln_cpu_load,
    .unload = kiln_cpu_unload,
    .run = kiln__cpu_run_literals,
    .execute = kiln_cpu_execute,
    .execute_async = NULL, /* launches complete before they return */
    .run_module = NULL,
    .comm_init = NULL,
    .comm_fini = NULL,
    .collective = kiln__cpu_collective,
    .synchronize = NULL,
};
