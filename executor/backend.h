/* The executor's public face: backends, their devices, device memory and
 * loaded executables, behind opaque handles.
 *
 * A backend is created by name from a registry (kiln_backend_names) and owns a
 * fixed set of devices for its whole life. A device allocates buffers, loads
 * executables (kiln_executable from compiler/codegen/executable.h) and runs
 * them. Every entry point checks its arguments and turns every failure into
 * a negative KILN_E* code plus a kiln_status; nothing here aborts on input.
 * The backends plug in through the vtable of executor/backend_impl.h (the
 * shape of ggml-backend and PJRT).
 *
 * Ownership: the backend owns its devices (valid until kiln_backend_destroy).
 * Buffers and loaded executables belong to the caller and must be released
 * (kiln_buffer_free, kiln_loaded_destroy) before their backend is destroyed.
 * A loaded executable borrows its kiln_executable, which must outlive it.
 *
 * Threads: a backend may be used from several threads at once. Runs of one
 * loaded executable may overlap; each gets its own temporary memory. A cpu
 * backend owns worker threads: a forked child must not use its parent's
 * backend (create a new one).
 */
#ifndef KILN_EXECUTOR_BACKEND_H
#define KILN_EXECUTOR_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_backend kiln_backend;
typedef struct kiln_device kiln_device;
typedef struct kiln_buffer kiln_buffer;
typedef struct kiln_loaded kiln_loaded;

typedef struct kiln_module kiln_module;
typedef struct kiln_literal kiln_literal;
typedef struct kiln_executable kiln_executable;

typedef struct kiln_backend_options {
  /* Number of devices. 0: the backend's default (cpu: env KILN_CPU_DEVICES,
   * else 1; interp: 1). A cpu backend may have more devices than cores. */
  uint32_t ndevices;
  /* Worker threads per device, the caller's thread included. 0: env
   * KILN_CPU_THREADS, else the device's share of the cores available to the
   * process (at least 1). Ignored by interp. */
  uint32_t threads_per_device;
  /* Largest temporary arena an executable may ask for, in bytes. 0: half of
   * the physical memory. An executable asking for more fails to load with
   * KILN_ELIMIT. */
  uint64_t max_temp_bytes;
} kiln_backend_options;

typedef struct kiln_run_options {
  uint64_t max_while_iterations; /* per while loop; 0: default 1e9 */
  double timeout_seconds;        /* wall-clock limit, checked between steps; 0: none */
  /* May be NULL. Once it reads nonzero the run stops at its next check
   * (between steps, between while iterations) with KILN_ECANCELED: how a
   * server stops work whose caller went away. */
  const atomic_int *cancel;
  /* Backends that interpret (interp): literal bytes alive at once; 0:
   * default 8 GiB. Compiled backends size their memory at load and ignore
   * it. */
  size_t max_live_bytes;
} kiln_run_options;

/* ---- the registry ------------------------------------------------------- */

/* Names of the registered backends, in registry order; *n receives the
 * count. The one list of backend names: messages and option checks are
 * built from it, never from a list of their own. */
const char *const *kiln_backend_names(uint32_t *n);

/* What a backend runs, as bits (kiln_backend_caps). A caller asks these
 * instead of comparing names: a new backend then needs no branch. */
#define KILN_BACKEND_LOADS 1u        /* loads compiled executables (kiln_device_load) */
#define KILN_BACKEND_RUNS_MODULES 2u /* runs modules as such (kiln_device_run_module) */

/* The KILN_BACKEND_* bits of registered backend `name`, known without
 * creating it; 0 when no backend has that name (or name is NULL). */
unsigned kiln_backend_caps(const char *name);
/* Whether backend b runs modules as such (it interprets; nothing to compile). */
bool kiln_backend_runs_modules(const kiln_backend *b);

/* The names of the registered backends that have every bit of `caps` (0:
 * all of them), in registry order, joined by `sep` ("cpu, interp"), for
 * messages. Writes at most size bytes, NUL-terminated. */
void kiln_backend_names_join(unsigned caps, const char *sep, char *buf, size_t size);

/* Creates backend `name` (one of kiln_backend_names). `opts` may be NULL.
 * Unknown names are KILN_ENOTFOUND with a message listing the known ones. */
int kiln_backend_create(const char *name, const kiln_backend_options *opts, kiln_backend **out,
                        kiln_status *st);
/* Stops the backend's threads and frees it and its devices. NULL is a no-op. */
void kiln_backend_destroy(kiln_backend *b);

const char *kiln_backend_name(const kiln_backend *b);
uint32_t kiln_backend_device_count(const kiln_backend *b);
/* Device `i`, or NULL when out of range. Owned by the backend. */
kiln_device *kiln_backend_device(const kiln_backend *b, uint32_t i);

/* ---- devices ------------------------------------------------------------ */

uint32_t kiln_device_index(const kiln_device *d);
kiln_backend *kiln_device_backend(const kiln_device *d);
/* Worker threads of the device (the caller's thread included); 1 for interp. */
uint32_t kiln_device_threads(const kiln_device *d);
/* "cpu:0 (4 threads)". Writes at most size bytes, NUL-terminated. */
void kiln_device_describe(const kiln_device *d, char *buf, size_t size);
/* Waits until work submitted to the device has finished. Runs are
 * synchronous today, so this returns at once. */
int kiln_device_synchronize(kiln_device *d, kiln_status *st);

/* ---- memory ------------------------------------------------------------- */

/* A buffer of `bytes` bytes on device d (zero-filled). */
int kiln_buffer_alloc(kiln_device *d, size_t bytes, kiln_buffer **out, kiln_status *st);
void kiln_buffer_free(kiln_buffer *b); /* NULL is a no-op */
size_t kiln_buffer_size(const kiln_buffer *b);
kiln_device *kiln_buffer_device(const kiln_buffer *b);
/* Host -> device: n bytes from src into the buffer at `offset`. */
int kiln_buffer_write(kiln_buffer *b, size_t offset, const void *src, size_t n, kiln_status *st);
/* Device -> host: n bytes at `offset` into dst. */
int kiln_buffer_read(const kiln_buffer *b, size_t offset, void *dst, size_t n, kiln_status *st);

/* ---- executables -------------------------------------------------------- */

/* Loads executable e on device d. The executable is checked first (format
 * version, target, every slot, program and kernel reference, sizes): a
 * mismatch or a corrupt table fails with a status naming it, never a crash.
 * `e` must outlive the loaded executable. */
int kiln_device_load(kiln_device *d, const kiln_executable *e, kiln_loaded **out, kiln_status *st);
void kiln_loaded_destroy(kiln_loaded *l); /* NULL is a no-op */
const kiln_executable *kiln_loaded_executable(const kiln_loaded *l);

/* Runs a loaded executable on host literals: one per entry parameter (shapes
 * must match, dtype and dims; layouts ignored: literals are row-major).
 * *out is a new heap literal (a tuple when the entry returns one). `opts`
 * may be NULL. Limits (iterations, time) fail with KILN_ELIMIT. */
int kiln_loaded_run(kiln_loaded *l, const kiln_literal *const *args, uint32_t nargs,
                    const kiln_run_options *opts, kiln_literal **out, kiln_status *st);

/* Runs a loaded executable on device buffers: args[i] is flattened
 * parameter leaf i, its bytes laid out as the executable's binding says
 * (its layout, not necessarily row-major). results[0..nresults) receive new
 * buffers, one per flattened result leaf, laid out the same way; the caller
 * frees them. Parameter buffers are only read, except a parameter the
 * executable donates to a result (input_output_alias): its buffer is
 * written in place and holds unspecified bytes afterwards. */
int kiln_loaded_execute(kiln_loaded *l, kiln_buffer *const *args, uint32_t nargs,
                        const kiln_run_options *opts, kiln_buffer **results, uint32_t nresults,
                        kiln_status *st);

/* Runs a module directly, for backends that interpret modules (interp).
 * Backends that only run executables fail with KILN_EUNIMPL. */
int kiln_device_run_module(kiln_device *d, const kiln_module *m, const kiln_literal *const *args,
                           uint32_t nargs, const kiln_run_options *opts, kiln_literal **out,
                           kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXECUTOR_BACKEND_H */
