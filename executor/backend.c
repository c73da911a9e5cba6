/* The backend registry and the checked forwarders.
 *
 * Every public entry point of executor/backend.h lands here, checks its
 * handles, indices and sizes, and only then calls the backend's vtable, so
 * that an implementation never sees a bad argument and a caller never sees
 * a crash: a NULL handle, an out-of-range index, a missing optional slot or
 * a mismatched buffer all become a status naming what was wrong.
 */
#include "executor/backend.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "executor/backend_impl.h"
#ifdef KILN_HAVE_CUDA
#include "executor/cuda/cuda.h"
#endif

/* The backends always present, then those that need hardware: cuda is
 * registered only when the NVIDIA driver loads and reports at least one
 * GPU (executor/cuda/cuda_driver.c), asked once, when a name that is not
 * a fixed one is looked up or the names are listed. Without one, "cuda" is not a backend name here
 * at all, and everything else runs as before. */
static const kiln_backend_iface *const fixed[] = {
    &kiln_cpu_backend_iface,
    &kiln_interp_backend_iface,
};
#define NFIXED (sizeof fixed / sizeof fixed[0])
#define NREGISTRY_MAX (NFIXED + 1)

static const kiln_backend_iface *registry[NREGISTRY_MAX];
static size_t nregistry;
/* The names, taken from the ifaces once: the registry above is the only
 * place a backend is listed. */
static const char *registry_names[NREGISTRY_MAX];
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;

static void fill_registry(void) {
  for (size_t i = 0; i < NFIXED; i++) registry[nregistry++] = fixed[i];
#ifdef KILN_HAVE_CUDA
  if (kiln_cuda_device_count(NULL) > 0) registry[nregistry++] = &kiln_cuda_backend_iface;
#endif
  for (size_t i = 0; i < nregistry; i++) registry_names[i] = registry[i]->name;
}

const char *const *kiln_backend_names(uint32_t *n) {
  pthread_once(&registry_once, fill_registry);
  if (n) *n = (uint32_t)nregistry;
  return registry_names;
}

static const kiln_backend_iface *registry_find(const char *name) {
  if (name == NULL) return NULL;
  /* The fixed backends without asking the driver: a process that never
   * names cuda (or lists the backends) never opens it. */
  for (size_t i = 0; i < NFIXED; i++)
    if (strcmp(fixed[i]->name, name) == 0) return fixed[i];
  pthread_once(&registry_once, fill_registry);
  for (size_t i = 0; i < nregistry; i++)
    if (strcmp(registry[i]->name, name) == 0) return registry[i];
  return NULL;
}

static unsigned iface_caps(const kiln_backend_iface *iface) {
  return (iface->load ? KILN_BACKEND_LOADS : 0) |
         (iface->run_module ? KILN_BACKEND_RUNS_MODULES : 0);
}

unsigned kiln_backend_caps(const char *name) {
  const kiln_backend_iface *iface = registry_find(name);
  return iface ? iface_caps(iface) : 0;
}

bool kiln_backend_runs_modules(const kiln_backend *b) {
  return b != NULL && b->iface->run_module != NULL;
}

void kiln_backend_names_join(unsigned caps, const char *sep, char *buf, size_t size) {
  if (buf == NULL || size == 0) return;
  buf[0] = '\0';
  if (sep == NULL) sep = ", ";
  size_t len = 0;
  pthread_once(&registry_once, fill_registry);
  for (size_t i = 0; i < nregistry && len < size; i++) {
    if ((iface_caps(registry[i]) & caps) != caps) continue;
    int k = snprintf(buf + len, size - len, "%s%s", len ? sep : "", registry[i]->name);
    if (k < 0) break;
    len += (size_t)k;
  }
}

bool kiln_backend_why_absent(const char *name, char *buf, size_t size) {
  if (name == NULL || strcmp(name, "cuda") != 0 || registry_find(name) != NULL) return false;
#ifdef KILN_HAVE_CUDA
  kiln_status st;
  kiln_status_clear(&st);
  kiln_cuda_device_count(&st);
  if (buf && size) snprintf(buf, size, "no CUDA devices here: %s", st.msg);
#else
  if (buf && size) snprintf(buf, size, "this build has no CUDA device pool (no cuda.h)");
#endif
  return true;
}

int kiln_backend_default_target(const char *name, const char **target, kiln_status *st) {
  *target = NULL;
  char why[600];
  if (kiln_backend_why_absent(name, why, sizeof why))
    return kiln_status_set(st, KILN_EUNAVAIL, "backend", "%s", why);
#ifdef KILN_HAVE_CUDA
  if (name && strcmp(name, "cuda") == 0) return kiln_cuda_default_target(0, target, st);
#endif
  return 0;
}

/* ---- backends ----------------------------------------------------------- */

static void destroy_devices(kiln_backend *b, uint32_t ninit) {
  for (uint32_t i = ninit; i-- > 0;)
    if (b->iface->device_fini) b->iface->device_fini(&b->devices[i]);
  kiln_free(b->devices);
  b->devices = NULL;
}

int kiln_backend_create(const char *name, const kiln_backend_options *opts, kiln_backend **out,
                        kiln_status *st) {
  if (out == NULL) return kiln_status_set(st, KILN_EINVAL, "backend", "no result pointer");
  *out = NULL;
  if (name == NULL) return kiln_status_set(st, KILN_EINVAL, "backend", "no backend name");
  const kiln_backend_iface *iface = registry_find(name);
  char absent[600];
  if (iface == NULL && kiln_backend_why_absent(name, absent, sizeof absent))
    return kiln_status_set(st, KILN_EUNAVAIL, "backend", "backend '%s': %s", name, absent);
  if (iface == NULL) {
    char known[256];
    kiln_backend_names_join(0, ", ", known, sizeof known);
    return kiln_status_set(st, KILN_ENOTFOUND, "backend", "unknown backend '%.64s' (known: %s)",
                           name, known);
  }
  kiln_backend_options defaults = {0};
  if (opts == NULL) opts = &defaults;

  kiln_backend *b = kiln_calloc(1, sizeof *b);
  if (b == NULL) return kiln_status_set(st, KILN_ENOMEM, name, "out of memory");
  b->iface = iface;
  uint32_t ndevices = 0;
  int rc = iface->init(b, opts, &ndevices, st);
  if (rc) goto out_free_backend;
  if (ndevices == 0) {
    rc = kiln_status_set(st, KILN_EINTERNAL, name, "backend reported no devices");
    goto out_fini;
  }
  b->devices = kiln_calloc(ndevices, sizeof *b->devices);
  if (b->devices == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, name, "out of memory for %u devices", ndevices);
    goto out_fini;
  }
  b->ndevices = ndevices;
  for (uint32_t i = 0; i < ndevices; i++) {
    kiln_device *d = &b->devices[i];
    d->backend = b;
    d->index = i;
    d->nthreads = 1;
    if (iface->device_init && (rc = iface->device_init(d, st)) != 0) {
      destroy_devices(b, i);
      goto out_fini;
    }
  }
  *out = b;
  return 0;

out_fini:
  iface->fini(b);
out_free_backend:
  kiln_free(b);
  return rc;
}

void kiln_backend_destroy(kiln_backend *b) {
  if (b == NULL) return;
  destroy_devices(b, b->ndevices);
  b->iface->fini(b);
  kiln_free(b);
}

const char *kiln_backend_name(const kiln_backend *b) { return b ? b->iface->name : "(null)"; }

uint32_t kiln_backend_device_count(const kiln_backend *b) { return b ? b->ndevices : 0; }

kiln_device *kiln_backend_device(const kiln_backend *b, uint32_t i) {
  if (b == NULL || i >= b->ndevices) return NULL;
  return &b->devices[i];
}

/* ---- devices ------------------------------------------------------------ */

uint32_t kiln_device_index(const kiln_device *d) { return d ? d->index : 0; }

kiln_backend *kiln_device_backend(const kiln_device *d) { return d ? d->backend : NULL; }

uint32_t kiln_device_threads(const kiln_device *d) { return d ? d->nthreads : 0; }

void kiln_device_describe(const kiln_device *d, char *buf, size_t size) {
  if (buf == NULL || size == 0) return;
  if (d == NULL) {
    snprintf(buf, size, "(null)");
    return;
  }
  snprintf(buf, size, "%s:%u (%u thread%s)", d->backend->iface->name, d->index, d->nthreads,
           d->nthreads == 1 ? "" : "s");
}

/* "cpu:0" for status messages. */
static void device_where(const kiln_device *d, char *buf, size_t size) {
  snprintf(buf, size, "%s:%u", d->backend->iface->name, d->index);
}

int kiln_device_synchronize(kiln_device *d, kiln_status *st) {
  if (d == NULL) return kiln_status_set(st, KILN_EINVAL, "device", "no device");
  if (d->backend->iface->synchronize == NULL) return 0;
  return d->backend->iface->synchronize(d, st);
}

/* ---- memory ------------------------------------------------------------- */

int kiln_buffer_alloc(kiln_device *d, size_t bytes, kiln_buffer **out, kiln_status *st) {
  if (out == NULL) return kiln_status_set(st, KILN_EINVAL, "buffer", "no result pointer");
  *out = NULL;
  if (d == NULL) return kiln_status_set(st, KILN_EINVAL, "buffer", "no device");
  char where[64];
  device_where(d, where, sizeof where);
  kiln_buffer *b = kiln_calloc(1, sizeof *b);
  if (b == NULL) return kiln_status_set(st, KILN_ENOMEM, where, "out of memory");
  b->device = d;
  b->size = bytes;
  int rc = d->backend->iface->buffer_alloc(d, bytes, &b->mem, st);
  if (rc) {
    kiln_free(b);
    return rc;
  }
  *out = b;
  return 0;
}

void kiln_buffer_free(kiln_buffer *b) {
  if (b == NULL) return;
  b->device->backend->iface->buffer_free(b->device, b->mem);
  kiln_free(b);
}

size_t kiln_buffer_size(const kiln_buffer *b) { return b ? b->size : 0; }

kiln_device *kiln_buffer_device(const kiln_buffer *b) { return b ? b->device : NULL; }

/* offset + n within size, without overflow. */
static int check_range(const kiln_buffer *b, size_t offset, size_t n, const void *host,
                       const char *verb, kiln_status *st) {
  if (b == NULL) return kiln_status_set(st, KILN_EINVAL, "buffer", "%s: no buffer", verb);
  if (host == NULL && n > 0)
    return kiln_status_set(st, KILN_EINVAL, "buffer", "%s: no host pointer", verb);
  if (offset > b->size || n > b->size - offset)
    return kiln_status_set(st, KILN_ERANGE, "buffer",
                           "%s: bytes [%zu, %zu + %zu) outside a buffer of %zu bytes", verb, offset,
                           offset, n, b->size);
  return 0;
}

int kiln_buffer_write(kiln_buffer *b, size_t offset, const void *src, size_t n, kiln_status *st) {
  int rc = check_range(b, offset, n, src, "write", st);
  if (rc || n == 0) return rc;
  return b->device->backend->iface->buffer_write(b->device, b->mem, offset, src, n, st);
}

int kiln_buffer_read(const kiln_buffer *b, size_t offset, void *dst, size_t n, kiln_status *st) {
  int rc = check_range(b, offset, n, dst, "read", st);
  if (rc || n == 0) return rc;
  return b->device->backend->iface->buffer_read(b->device, b->mem, offset, dst, n, st);
}

int kiln_buffer_copy(kiln_buffer *dst, size_t dst_offset, const kiln_buffer *src, size_t src_offset,
                     size_t n, kiln_status *st) {
  int rc = check_range(dst, dst_offset, n, "", "copy to", st);
  if (rc == 0) rc = check_range(src, src_offset, n, "", "copy from", st);
  if (rc || n == 0) return rc;
  kiln_backend *b = dst->device->backend;
  if (src->device->backend != b)
    return kiln_status_set(st, KILN_EINVAL, "buffer",
                           "copy: from a buffer of backend %s to one of backend %s (copy "
                           "through the host)",
                           src->device->backend->iface->name, b->iface->name);
  if (src == dst && src_offset < dst_offset + n && dst_offset < src_offset + n)
    return kiln_status_set(
        st, KILN_EINVAL, "buffer",
        "copy: bytes [%zu, %zu + %zu) and [%zu, %zu + %zu) of one buffer overlap", src_offset,
        src_offset, n, dst_offset, dst_offset, n);
  if (b->iface->buffer_copy)
    return b->iface->buffer_copy(dst->device, dst->mem, dst_offset, src->device, src->mem,
                                 src_offset, n, st);
  /* No device copy: bounce through host memory, a bounded block at a time. */
  size_t block = n < ((size_t)1 << 20) ? n : ((size_t)1 << 20);
  char *tmp = kiln_malloc(block);
  if (tmp == NULL) return kiln_status_set(st, KILN_ENOMEM, "buffer", "copy: out of memory");
  for (size_t done = 0; done < n && rc == 0; done += block) {
    size_t m = n - done < block ? n - done : block;
    rc = b->iface->buffer_read(src->device, src->mem, src_offset + done, tmp, m, st);
    if (rc == 0) rc = b->iface->buffer_write(dst->device, dst->mem, dst_offset + done, tmp, m, st);
  }
  kiln_free(tmp);
  return rc;
}

void *kiln_buffer_host(kiln_buffer *b, bool discard) {
  if (b == NULL || b->device->backend->iface->buffer_host == NULL) return NULL;
  return b->device->backend->iface->buffer_host(b->device, b->mem, discard);
}

bool kiln_device_can_access(const kiln_device *d, const kiln_buffer *b) {
  if (d == NULL || b == NULL) return false;
  if (b->device == d) return true;
  return b->device->backend == d->backend && d->backend->iface->shared_memory;
}

/* ---- executables -------------------------------------------------------- */

int kiln_device_load(kiln_device *d, const kiln_executable *e, kiln_loaded **out, kiln_status *st) {
  if (out == NULL) return kiln_status_set(st, KILN_EINVAL, "load", "no result pointer");
  *out = NULL;
  if (d == NULL) return kiln_status_set(st, KILN_EINVAL, "load", "no device");
  if (e == NULL) return kiln_status_set(st, KILN_EINVAL, "load", "no executable");
  char where[64];
  device_where(d, where, sizeof where);
  const kiln_backend_iface *iface = d->backend->iface;
  if (iface->load == NULL)
    return kiln_status_set(st, KILN_EUNIMPL, where,
                           "backend %s does not load executables (it runs modules)", iface->name);
  kiln_loaded *l = kiln_calloc(1, sizeof *l);
  if (l == NULL) return kiln_status_set(st, KILN_ENOMEM, where, "out of memory");
  l->device = d;
  l->exe = e;
  int rc = iface->load(l, st);
  if (rc) {
    kiln_free(l);
    return rc;
  }
  *out = l;
  return 0;
}

void kiln_loaded_destroy(kiln_loaded *l) {
  if (l == NULL) return;
  l->device->backend->iface->unload(l);
  kiln_free(l);
}

const kiln_executable *kiln_loaded_executable(const kiln_loaded *l) { return l ? l->exe : NULL; }

kiln_device *kiln_loaded_device(const kiln_loaded *l) { return l ? l->device : NULL; }

/* Bytes of result/parameter binding `b`'s dense storage (checked at load). */
static size_t binding_bytes(const kiln_binding *b) { return (size_t)kiln_shape_bytes(&b->shape); }

int kiln__run_memory_check(const kiln_executable *e, const kiln_run_options *opts, const char *verb,
                           kiln_status *st) {
  if (opts == NULL || opts->max_live_bytes == 0) return 0;
  uint64_t results = 0;
  for (uint32_t i = 0; i < e->nresults; i++) results += (uint64_t)binding_bytes(&e->results[i]);
  uint64_t need = e->temp_bytes + results;
  if (need <= opts->max_live_bytes) return 0;
  return kiln_status_set(st, KILN_ELIMIT, verb,
                         "the run needs %llu bytes (%llu of temporaries, %llu in %u result%s), "
                         "over the run memory limit of %llu bytes (run-memory-bytes)",
                         (unsigned long long)need, (unsigned long long)e->temp_bytes,
                         (unsigned long long)results, e->nresults, e->nresults == 1 ? "" : "s",
                         (unsigned long long)opts->max_live_bytes);
}

int kiln_loaded_run(kiln_loaded *l, const kiln_literal *const *args, uint32_t nargs,
                    const kiln_run_options *opts, kiln_literal **out, kiln_status *st) {
  if (out == NULL) return kiln_status_set(st, KILN_EINVAL, "run", "no result pointer");
  *out = NULL;
  if (l == NULL) return kiln_status_set(st, KILN_EINVAL, "run", "no loaded executable");
  /* A bounded-dynamic program takes the caller's parameters; the runtime
   * sizes it also takes are the backend's to pass (kiln_exe_dynamic). */
  uint32_t want = l->exe->dyn ? l->exe->dyn->nuser_params : l->exe->nparams;
  if (nargs != want)
    return kiln_status_set(st, KILN_EINVAL, "run", "the executable takes %u parameter%s, %u given",
                           want, want == 1 ? "" : "s", nargs);
  for (uint32_t i = 0; i < nargs; i++)
    if (args == NULL || args[i] == NULL)
      return kiln_status_set(st, KILN_EINVAL, "run", "argument %u is missing", i);
  int rc = kiln__run_memory_check(l->exe, opts, "run", st);
  if (rc) return rc;
  kiln_run_options defaults = {0};
  return l->device->backend->iface->run(l, args, opts ? opts : &defaults, out, st);
}

static void free_results(kiln_buffer **results, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    kiln_buffer_free(results[i]);
    results[i] = NULL;
  }
}

/* Array leaves of an entry shape (depth checked at load). */
static uint32_t shape_leaves(const kiln_shape *s) {
  if (s->dtype == KILN_TOKEN) return 0;
  if (s->dtype != KILN_TUPLE) return 1;
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->rank; i++) n += shape_leaves(&s->tuple[i]);
  return n;
}

bool kiln_loaded_donates(const kiln_loaded *l, uint32_t leaf) {
  if (l == NULL || leaf >= l->exe->nparam_leaves) return false;
  const kiln_executable *e = l->exe;
  for (uint32_t i = 0; i < e->nresults; i++) {
    const kiln_slot *s = &e->slots[e->results[i].slot];
    if (s->kind != KILN_SLOT_PARAM || s->index >= e->nparams) continue;
    uint32_t base = 0; /* the first leaf of parameter s->index */
    for (uint32_t p = 0; p < s->index; p++) base += shape_leaves(&e->param_shapes[p]);
    if (base + s->leaf == leaf) return true;
  }
  return false;
}

/* The checks kiln_loaded_execute and its async form share, then the result
 * buffers; on failure nothing is left allocated. */
int kiln__loaded_execute_prepare(kiln_loaded *l, kiln_buffer *const *args, uint32_t nargs,
                                 kiln_buffer **results, uint32_t nresults, const char *verb,
                                 kiln_status *st) {
  if (l == NULL) return kiln_status_set(st, KILN_EINVAL, verb, "no loaded executable");
  const kiln_executable *e = l->exe;
  if (results == NULL && nresults > 0)
    return kiln_status_set(st, KILN_EINVAL, verb, "no result array");
  for (uint32_t i = 0; i < nresults; i++) results[i] = NULL;
  const kiln_backend_iface *iface = l->device->backend->iface;
  if (iface->execute == NULL)
    return kiln_status_set(st, KILN_EUNIMPL, verb, "backend %s does not execute on buffers",
                           iface->name);
  if (nargs != e->nparam_leaves)
    return kiln_status_set(st, KILN_EINVAL, verb,
                           "the executable takes %u parameter leaves, %u buffers given",
                           e->nparam_leaves, nargs);
  if (nresults != e->nresults)
    return kiln_status_set(st, KILN_EINVAL, verb,
                           "the executable returns %u result leaves, room for %u given",
                           e->nresults, nresults);
  for (uint32_t i = 0; i < nargs; i++) {
    if (args == NULL || args[i] == NULL)
      return kiln_status_set(st, KILN_EINVAL, verb, "parameter leaf %u: no buffer", i);
    if (!kiln_device_can_access(l->device, args[i]))
      return kiln_status_set(st, KILN_EINVAL, verb,
                             "parameter leaf %u: buffer lives on %s:%u, the executable on %s:%u", i,
                             args[i]->device->backend->iface->name, args[i]->device->index,
                             iface->name, l->device->index);
    if (args[i]->size != binding_bytes(&e->params[i]))
      return kiln_status_set(st, KILN_EINVAL, verb,
                             "parameter leaf %u: buffer has %zu bytes, expected %zu", i,
                             args[i]->size, binding_bytes(&e->params[i]));
  }
  int rc = 0;
  for (uint32_t i = 0; i < nresults && rc == 0; i++)
    rc = kiln_buffer_alloc(l->device, binding_bytes(&e->results[i]), &results[i], st);
  if (rc) free_results(results, nresults);
  return rc;
}

int kiln_loaded_execute(kiln_loaded *l, kiln_buffer *const *args, uint32_t nargs,
                        const kiln_run_options *opts, kiln_buffer **results, uint32_t nresults,
                        kiln_status *st) {
  int rc = l ? kiln__run_memory_check(l->exe, opts, "execute", st) : 0;
  if (rc == 0) rc = kiln__loaded_execute_prepare(l, args, nargs, results, nresults, "execute", st);
  if (rc) return rc;
  kiln_run_options defaults = {0};
  rc = l->device->backend->iface->execute(l, args, opts ? opts : &defaults, results, st);
  if (rc) free_results(results, nresults);
  return rc;
}

int kiln_loaded_execute_async(kiln_loaded *l, kiln_buffer *const *args, uint32_t nargs,
                              const kiln_run_options *opts, kiln_buffer **results,
                              uint32_t nresults, kiln_event **ev, kiln_status *st) {
  if (ev == NULL) return kiln_status_set(st, KILN_EINVAL, "execute", "no event pointer");
  *ev = NULL;
  int rc = l ? kiln__run_memory_check(l->exe, opts, "execute", st) : 0;
  if (rc == 0) rc = kiln__loaded_execute_prepare(l, args, nargs, results, nresults, "execute", st);
  if (rc) return rc;
  kiln_event *e = kiln__event_create();
  if (e == NULL) {
    free_results(results, nresults);
    return kiln_status_set(st, KILN_ENOMEM, "execute", "out of memory for an event");
  }
  kiln_run_options defaults = {0};
  if (opts == NULL) opts = &defaults;
  const kiln_backend_iface *iface = l->device->backend->iface;
  if (iface->execute_async) {
    rc = iface->execute_async(l, args, opts, results, e, st);
    if (rc) {
      kiln__event_free(e);
      free_results(results, nresults);
      return rc;
    }
  } else {
    /* Synchronous completion: the run's outcome goes to the event. */
    kiln_status run_st;
    kiln_status_clear(&run_st);
    int run_rc = iface->execute(l, args, opts, results, &run_st);
    kiln__event_signal(e, run_rc, &run_st);
  }
  *ev = e;
  return 0;
}

int kiln_device_run_module(kiln_device *d, const kiln_module *m, const kiln_literal *const *args,
                           uint32_t nargs, const kiln_run_options *opts, kiln_literal **out,
                           kiln_status *st) {
  if (out == NULL) return kiln_status_set(st, KILN_EINVAL, "run", "no result pointer");
  *out = NULL;
  if (d == NULL) return kiln_status_set(st, KILN_EINVAL, "run", "no device");
  if (m == NULL) return kiln_status_set(st, KILN_EINVAL, "run", "no module");
  if (args == NULL && nargs > 0) return kiln_status_set(st, KILN_EINVAL, "run", "no arguments");
  const kiln_backend_iface *iface = d->backend->iface;
  if (iface->run_module == NULL)
    return kiln_status_set(st, KILN_EUNIMPL, "run",
                           "backend %s runs compiled executables, not modules (compile first)",
                           iface->name);
  kiln_run_options defaults = {0};
  return iface->run_module(d, m, args, nargs, opts ? opts : &defaults, out, st);
}
