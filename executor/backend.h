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
 * The contract (the vtable's side is at the top of backend_impl.h):
 *
 * Ownership: the backend owns its devices (valid until kiln_backend_destroy).
 * Buffers, loaded executables, events, communicators and mesh loads belong
 * to the caller and must be released (kiln_buffer_free, kiln_loaded_destroy,
 * kiln_event_destroy, kiln_mesh_destroy, kiln_comm_destroy) before their
 * backend is destroyed. A loaded executable borrows its kiln_executable,
 * which must outlive it; a mesh load borrows its communicator.
 *
 * Memory: a buffer is device memory. On cpu and interp it is host memory and
 * kiln_buffer_host gives its address; a device with memory of its own (a
 * GPU) answers NULL there and is reached through read/write/copy only.
 *
 * Blocking: alloc/free/read/write/copy, kiln_loaded_run and
 * kiln_loaded_execute return when the work is done (a copy's bytes are in
 * place). kiln_loaded_execute_async and kiln_mesh_execute_async return once
 * the work is launched; kiln_event_wait blocks until it has finished. A
 * backend may complete a launch before returning (cpu does: the caller's
 * thread is one of the device's workers), in which case the event is already
 * signalled; callers must not rely on either behaviour.
 *
 * Threads: a backend may be used from several threads at once, each entry
 * point from any thread. Runs of one loaded executable may overlap; each
 * gets its own temporary memory. An event is waited on, queried and
 * destroyed from any thread, but destroyed once. A cpu backend owns worker
 * threads: a forked child must not use its parent's backend (create a new
 * one).
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
typedef struct kiln_event kiln_event;
typedef struct kiln_comm kiln_comm;
typedef struct kiln_mesh kiln_mesh;

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
  /* Bytes a run may hold. Backends that interpret (interp): literal bytes
   * alive at once; 0: default 8 GiB. Compiled executables: the temporary
   * arena and the result buffers the run allocates, checked before it
   * allocates any (KILN_ELIMIT naming the limit); 0: none. */
  size_t max_live_bytes;
  /* Set by a gang launch (kiln_mesh_execute) on the copy each rank runs
   * with: where the rank meets its peers in a collective step. Callers
   * leave it NULL; a run without one is a mesh of one device. */
  const struct kiln__gang_rank *gang;
  /* May be NULL: where kiln.debug_print custom calls print
   * (compiler/ir/debug_print.h); called from the thread that runs. */
  const struct kiln_debug_sink *debug;
  /* May be NULL: told the time of every step a compiled run takes
   * (`kiln bench --profile`); backends that interpret ignore it. */
  const struct kiln_step_observer *observer;
} kiln_run_options;

/* step(ctx, program, step, begin_ns, end_ns) after each step of a compiled
 * run (CLOCK_MONOTONIC nanoseconds), nested programs' steps included (a
 * while, conditional or call step is told after the steps it ran). */
typedef struct kiln_step_observer {
  void (*step)(void *ctx, uint32_t program, uint32_t step, int64_t begin_ns, int64_t end_ns);
  void *ctx;
} kiln_step_observer;

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

/* Why a backend that this build knows of is not registered here: "cuda"
 * without a driver or a GPU writes the driver's reason into buf and
 * returns true; false for every other name (registered or unknown). */
bool kiln_backend_why_absent(const char *name, char *buf, size_t size);

/* The compile target that programs for backend `name` are built for when
 * the caller names none: *target NULL for the host's default (cpu), or
 * the row of device 0's architecture for cuda ("cuda-sm_90" on an H100 or
 * H200). A GPU that no cuda row covers is KILN_EUNIMPL saying which. */
int kiln_backend_default_target(const char *name, const char **target, kiln_status *st);

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
/* Device -> device: n bytes of src at src_offset into dst at dst_offset.
 * The buffers may live on the same device or on two devices of one backend
 * (another backend's is KILN_EINVAL); they may be the same buffer only if
 * the ranges do not overlap. Returns when the bytes are in place. */
int kiln_buffer_copy(kiln_buffer *dst, size_t dst_offset, const kiln_buffer *src, size_t src_offset,
                     size_t n, kiln_status *st);
/* The host address of the buffer's bytes where device memory is host memory
 * (cpu, interp); NULL for a device with memory of its own, and for NULL.
 * With `discard` the caller promises to write every byte before reading
 * any, and the zero-fill still owed may be skipped. Valid until the buffer
 * is freed. */
void *kiln_buffer_host(kiln_buffer *b, bool discard);
/* Whether device d may take b as a parameter or result of its runs without
 * a copy: b lives on d, or on a device of the same backend whose memory d
 * addresses directly (all cpu devices share the host's memory). */
bool kiln_device_can_access(const kiln_device *d, const kiln_buffer *b);

/* ---- executables -------------------------------------------------------- */

/* Loads executable e on device d. The executable is checked first (format
 * version, target, every slot, program and kernel reference, sizes): a
 * mismatch or a corrupt table fails with a status naming it, never a crash.
 * `e` must outlive the loaded executable. */
int kiln_device_load(kiln_device *d, const kiln_executable *e, kiln_loaded **out, kiln_status *st);
void kiln_loaded_destroy(kiln_loaded *l);              /* NULL is a no-op */
kiln_device *kiln_loaded_device(const kiln_loaded *l); /* where it was loaded */
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

/* Whether the executable writes parameter leaf `leaf` in place: a result
 * is bound to it (input_output_alias donation). Such a buffer given to
 * kiln_loaded_execute holds unspecified bytes afterwards; a caller that
 * needs it kept passes a copy. */
bool kiln_loaded_donates(const kiln_loaded *l, uint32_t leaf);

/* ---- asynchronous launch and events ---------------------------------------- */

/* kiln_loaded_execute, launched: checks the arguments as kiln_loaded_execute
 * does (a failure there returns its code, and *ev stays NULL), allocates the
 * result buffers into results[] at once and returns 0 with *ev, the launch's
 * completion. The run's own outcome (a limit, a cancel, a fault) is what
 * kiln_event_wait returns. Arguments must stay allocated, and results must
 * not be read, until the event has signalled; the caller frees the results
 * in every case once it has (their bytes are unspecified after a failed
 * run). A backend with no asynchronous launch runs the program before
 * returning, and the event it gives is already signalled. */
int kiln_loaded_execute_async(kiln_loaded *l, kiln_buffer *const *args, uint32_t nargs,
                              const kiln_run_options *opts, kiln_buffer **results,
                              uint32_t nresults, kiln_event **ev, kiln_status *st);

/* Blocks until the event has signalled; returns the outcome of the work it
 * completes (0 or a negative KILN_E*) and copies its status into st. May be
 * called any number of times, from any thread. */
int kiln_event_wait(kiln_event *ev, kiln_status *st);
/* Whether the event has signalled (never blocks). Once true, stays true,
 * and everything the work wrote is visible to the caller. */
bool kiln_event_query(kiln_event *ev);
/* Waits for the event if it has not signalled, then frees it. NULL is a
 * no-op. Destroy once, after every waiter has returned. */
void kiln_event_destroy(kiln_event *ev);

/* ---- communicators and meshes ---------------------------------------------- */

/* A communicator: an ordered set of distinct devices of one backend (rank r
 * is devices[r]), created once and reused for every collective and gang
 * launch on that set (NCCL's model). The set must be non-empty, every
 * device must belong to b and none may repeat: anything else is KILN_EINVAL
 * naming the offending rank. The devices array is copied. */
int kiln_comm_create(kiln_backend *b, kiln_device *const *devices, uint32_t n, kiln_comm **out,
                     kiln_status *st);
/* NULL is a no-op. Mesh loads made on it must be destroyed first. */
void kiln_comm_destroy(kiln_comm *c);
uint32_t kiln_comm_size(const kiln_comm *c);
/* The device of rank r, NULL when out of range. */
kiln_device *kiln_comm_device(const kiln_comm *c, uint32_t rank);

/* Collectives between the ranks of a communicator, called once for the
 * whole set (the caller holds every rank's buffers): send[r] and recv[r]
 * belong to rank r (on its device, or one it can access). Element counts
 * are per rank, on the send side:
 * - KILN_OP_ALL_REDUCE: recv[r][i] = reduce_op over ranks of send[k][i];
 *   reduce_op is KILN_OP_ADD, MULTIPLY, MAXIMUM or MINIMUM. send[r] may
 *   be recv[r] (in place).
 * - KILN_OP_ALL_GATHER: recv[r] holds send[0..n) one after another
 *   (n * count elements).
 * - KILN_OP_COLLECTIVE_PERMUTE: recv[target] = send[source] for each
 *   (source, target) pair; a rank that is no pair's target gets zeros.
 *   Sources are distinct, and so are targets.
 * For these two, no recv buffer may also be a send buffer. Returns when
 * every recv buffer holds its result. A collective or element type the
 * backend does not implement is KILN_EUNIMPL naming both. */
typedef struct kiln_collective {
  int op;                   /* kiln_opcode: KILN_OP_ALL_REDUCE, ... */
  int dtype;                /* kiln_dtype of the elements */
  int reduce_op;            /* kiln_opcode, for all-reduce and reduce-scatter */
  uint64_t count;           /* elements per rank, send side */
  kiln_buffer *const *send; /* one per rank, in rank order */
  kiln_buffer *const *recv; /* one per rank, in rank order */
  const uint32_t *pairs;    /* collective-permute: npairs (source, target) pairs */
  uint32_t npairs;
} kiln_collective;

int kiln_comm_collective(kiln_comm *c, const kiln_collective *desc, kiln_status *st);

/* A mesh load: one executable loaded on every device of a communicator
 * (the SPMD form: every rank runs the same program). */
int kiln_comm_load(kiln_comm *c, const kiln_executable *e, kiln_mesh **out, kiln_status *st);
void kiln_mesh_destroy(kiln_mesh *m); /* NULL is a no-op */
/* The loaded executable of rank r, owned by the mesh; NULL when out of range. */
kiln_loaded *kiln_mesh_rank(const kiln_mesh *m, uint32_t rank);

/* A gang launch: runs every rank at once, rank r on args[r][0..nargs) with
 * results[r][0..nresults) allocated as kiln_loaded_execute_async does, all
 * ranks running together (a program that waits on its peers in a
 * collective finds them running). One event completes the whole gang; its
 * outcome is the first failing rank's (lowest rank first). Argument checks
 * fail before any rank starts, naming the rank. */
int kiln_mesh_execute_async(kiln_mesh *m, kiln_buffer *const *const *args, uint32_t nargs,
                            const kiln_run_options *opts, kiln_buffer **const *results,
                            uint32_t nresults, kiln_event **ev, kiln_status *st);
/* The same, waiting for the event: 0 once every rank has finished, or the
 * first failing rank's code (results are then freed and NULLed). */
int kiln_mesh_execute(kiln_mesh *m, kiln_buffer *const *const *args, uint32_t nargs,
                      const kiln_run_options *opts, kiln_buffer **const *results, uint32_t nresults,
                      kiln_status *st);

/* A gang launch on host literals, as kiln_loaded_run is for one device:
 * rank r runs on args[r][0..nargs) and outs[r] receives its result (a new
 * heap literal). Returns once every rank has finished: 0, or the lowest
 * failing rank's code with st naming the rank (every outs[r] is then
 * NULL). A rank that fails releases the peers waiting for it in a
 * collective with an error; none hangs. */
int kiln_mesh_run(kiln_mesh *m, const kiln_literal *const *const *args, uint32_t nargs,
                  const kiln_run_options *opts, kiln_literal **outs, kiln_status *st);

/* Runs a module directly, for backends that interpret modules (interp).
 * Backends that only run executables fail with KILN_EUNIMPL. */
int kiln_device_run_module(kiln_device *d, const kiln_module *m, const kiln_literal *const *args,
                           uint32_t nargs, const kiln_run_options *opts, kiln_literal **out,
                           kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXECUTOR_BACKEND_H */
