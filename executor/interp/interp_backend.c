/* The interp backend: the reference interpreter (compiler/eval) behind the
 * backend vtable, a thin adapter from kiln_run_options to its options.
 *
 * One device, host memory, no executables: it runs modules as such
 * (kiln_device_run_module), which is what "disable_jit" debugging and the
 * oracle side of backend comparisons need. The load/run/execute slots stay
 * NULL, so asking it to load an executable is a clear KILN_EUNIMPL.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/eval/interp.h"
#include "executor/backend_impl.h"

static int kiln_interp_init(kiln_backend *b, const kiln_backend_options *opts, uint32_t *ndevices,
                            kiln_status *st) {
  if (opts->ndevices > 1)
    return kiln_status_set(st, KILN_EINVAL, "interp", "the interp backend has one device, %u asked",
                           opts->ndevices);
  b->ctx = NULL;
  *ndevices = 1;
  return 0;
}

static void kiln_interp_fini(kiln_backend *b) { (void)b; }

static int kiln_interp_buffer_alloc(kiln_device *d, size_t bytes, void **mem, kiln_status *st) {
  *mem = kiln_calloc(1, bytes ? bytes : 1);
  if (*mem == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "interp:0", "out of memory for a buffer of %zu bytes",
                           bytes);
  return 0;
}

static void kiln_interp_buffer_free(kiln_device *d, void *mem) { kiln_free(mem); }

static int kiln_interp_buffer_write(kiln_device *d, void *mem, size_t offset, const void *src,
                                    size_t n, kiln_status *st) {
  memcpy((char *)mem + offset, src, n);
  return 0;
}

static int kiln_interp_buffer_read(kiln_device *d, const void *mem, size_t offset, void *dst,
                                   size_t n, kiln_status *st) {
  memcpy(dst, (const char *)mem + offset, n);
  return 0;
}

/* Buffers are host memory; a module runs on them viewed as literals. */
static void *kiln_interp_buffer_host(kiln_device *d, void *mem, bool discard) {
  (void)d, (void)discard;
  return mem;
}

static int kiln_interp_run_module(kiln_device *d, const kiln_module *m,
                                  const kiln_literal *const *args, uint32_t nargs,
                                  const kiln_run_options *opts, kiln_literal **out,
                                  kiln_status *st) {
  kiln_interp_options io = {
      .max_while_iterations = opts->max_while_iterations,
      .timeout_seconds = opts->timeout_seconds,
      .cancel = opts->cancel,
      .max_live_bytes = opts->max_live_bytes,
      .debug = opts->debug,
  };
  return kiln_interp_run(m, args, nargs, &io, out, st);
}

const kiln_backend_iface kiln_interp_backend_iface = {
    .name = "interp",
    .init = kiln_interp_init,
    .fini = kiln_interp_fini,
    .device_init = NULL,
    .device_fini = NULL,
    .buffer_alloc = kiln_interp_buffer_alloc,
    .buffer_free = kiln_interp_buffer_free,
    .buffer_write = kiln_interp_buffer_write,
    .buffer_read = kiln_interp_buffer_read,
    .buffer_copy = NULL, /* through the host: it is host memory anyway */
    .buffer_host = kiln_interp_buffer_host,
    .shared_memory = false, /* one device */
    .load = NULL,
    .unload = NULL,
    .run = NULL,
    .execute = NULL,
    .execute_async = NULL,
    .run_module = kiln_interp_run_module,
    .comm_init = NULL,
    .comm_fini = NULL,
    .collective = NULL,
    .synchronize = NULL,
};
