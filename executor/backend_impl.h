/* The backend vtable: what a backend implements to plug into the executor.
 *
 * The public handles of executor/backend.h are thin structs defined here;
 * backend.c (and comm.c, for events, communicators and meshes) owns them
 * and calls the vtable only after checking every argument, so an
 * implementation may assume valid handles, in-range indices and sizes that
 * fit. Each backend fills one kiln_backend_iface with designated
 * initializers (implementations named kiln_<backend>_<verb>) and writes its
 * missing optional slots out as NULL. (After ggml-backend's interface table
 * and PJRT's client/device/executable split.)
 *
 * The contract, slot by slot (the caller's side is at the top of backend.h):
 *
 * Ownership: the handles (kiln_buffer, kiln_loaded, kiln_comm, kiln_mesh,
 * kiln_event) are allocated and freed by the forwarders; a slot fills or
 * undoes only its ctx/mem field. A slot never frees what it was given.
 *
 * Memory: `mem` is the implementation's handle for a buffer; only the
 * implementation dereferences it. buffer_host returns a host address for it
 * or the slot is NULL (device memory of its own). `shared_memory` says that
 * every device of the backend addresses every other device's buffers as its
 * own (cpu); execute may then get buffers of sibling devices.
 *
 * Blocking: every slot but execute_async returns with its work done.
 * execute_async returns once the work is queued, and signals the event it
 * was given exactly once (kiln__event_signal), from any thread, when the
 * work has finished and its writes are visible to the host; it may signal
 * before it returns. A backend without execute_async gets synchronous
 * semantics from backend.c: execute is called and the event is signalled
 * before the launch returns.
 *
 * Threads: any slot may be called from several threads at once, on the same
 * device too (runs of one loaded executable overlap), except that init/fini
 * and device_init/device_fini run alone and comm_init/comm_fini run alone
 * for their communicator.
 *
 * Communicators: comm_init gets a communicator whose devices were checked
 * (non-empty, distinct, all of this backend) and may set c->ctx. The
 * collective slot gets a descriptor checked against the communicator
 * (buffers in rank order on devices the ranks can access, sizes for
 * `count`, pairs in range and distinct, no forbidden aliasing) and runs the
 * whole collective before returning; an op or dtype it does not implement
 * is KILN_EUNIMPL with a message naming the collective and the backend.
 * A gang launch needs nothing of the backend but execute (run, for
 * kiln_mesh_run): comm.c runs the ranks on threads of their own, all at
 * once, each with its own copy of the run options whose `gang` names the
 * rank and the launch's rendezvous (kiln__rendezvous_enter/leave below),
 * where a backend's collective steps meet their peers.
 */
#ifndef KILN_EXECUTOR_BACKEND_IMPL_H
#define KILN_EXECUTOR_BACKEND_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler/ir/ir.h"
#include "executor/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_backend_iface kiln_backend_iface;

struct kiln_backend {
  const kiln_backend_iface *iface;
  void *ctx;            /* the implementation's backend state */
  kiln_device *devices; /* ndevices, created after iface->init */
  uint32_t ndevices;
};

struct kiln_device {
  kiln_backend *backend;
  uint32_t index;
  uint32_t nthreads; /* set by device_init; 1 when the backend has no pool */
  void *ctx;         /* the implementation's device state */
};

struct kiln_buffer {
  kiln_device *device;
  size_t size;
  void *mem; /* implementation handle (host pointer on cpu/interp) */
};

struct kiln_loaded {
  kiln_device *device;
  const kiln_executable *exe; /* borrowed */
  void *ctx;                  /* the implementation's loaded state */
};

/* An event: the completion of a launch (comm.c). Signalled once; waiters
 * sleep on cv. */
struct kiln_event {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;      /* under mu */
  int rc;         /* the work's outcome, once done */
  kiln_status st; /* its status, once done */
};

/* Creates an unsignalled event; NULL on out-of-memory. */
kiln_event *kiln__event_create(void);
/* Signals ev with the work's outcome (st may be NULL when rc is 0). Once. */
void kiln__event_signal(kiln_event *ev, int rc, const kiln_status *st);
/* Frees an event nobody waits on (a launch that failed before it began). */
void kiln__event_free(kiln_event *ev);

/* kiln_loaded_execute's argument checks, then the result buffers (results
 * are NULLed first and freed again on failure). `where` names the caller in
 * the status. */
/* KILN_ELIMIT when a run of e would hold more than opts->max_live_bytes
 * (its temporary arena and its results); 0 when it fits or there is no
 * limit. `verb` names the call in where. */
int kiln__run_memory_check(const kiln_executable *e, const kiln_run_options *opts, const char *verb,
                           kiln_status *st);

int kiln__loaded_execute_prepare(kiln_loaded *l, kiln_buffer *const *args, uint32_t nargs,
                                 kiln_buffer **results, uint32_t nresults, const char *where,
                                 kiln_status *st);

struct kiln_comm {
  kiln_backend *backend;
  kiln_device **devices; /* ndevices, rank order, distinct, all of backend */
  uint32_t ndevices;
  void *ctx; /* the implementation's communicator state (comm_init) */
};

struct kiln_mesh {
  kiln_comm *comm;            /* borrowed */
  const kiln_executable *exe; /* borrowed */
  kiln_loaded **ranks;        /* comm->ndevices loaded executables */
};

/* The rendezvous of one gang launch (comm.c): every rank that reaches a
 * collective step posts its operands' addresses under the step's key and
 * waits for its group. A slot per rank with a generation counter (the
 * collectives it has entered), so consecutive collectives and collectives
 * in loops never mix: a rank cannot run ahead into the next one until
 * every member has finished reading its operands (leave). A rank whose run
 * ends marks its slot gone, and whoever waits on it fails naming it.
 * Waits wake every 50 ms for the cancel flag and the deadline. */
typedef struct kiln__rendezvous kiln__rendezvous;
typedef struct kiln__gang_rank kiln__gang_rank;

struct kiln__gang_rank {
  kiln__rendezvous *rv;
  uint32_t rank, nranks;
};

/* Posts `ptrs` (this rank's operand addresses; they must stay valid until
 * leave returns) under `key`, then waits until every rank in members[0..n)
 * (rank order, this rank among them) has posted the same generation and
 * key; peers[j] receives member j's ptrs. deadline is CLOCK_MONOTONIC
 * seconds (0: none). On failure the rank's slot is withdrawn. */
int kiln__rendezvous_enter(const struct kiln__gang_rank *g, uint64_t key, const uint32_t *members,
                           uint32_t n, void *const *ptrs, void *const **peers,
                           const atomic_int *cancel, double deadline, kiln_status *st);
/* Counts this rank as done reading its members' operands and waits until
 * every member has read this rank's (or is gone). */
int kiln__rendezvous_leave(const struct kiln__gang_rank *g, const uint32_t *members, uint32_t n,
                           const atomic_int *cancel, double deadline, kiln_status *st);
double kiln__monotonic_seconds(void);

struct kiln_backend_iface {
  const char *name;

  /* Lifecycle (required). init sets b->ctx and *ndevices (>= 1) from the
   * options (opts never NULL here); backend.c then creates the devices and
   * calls device_init on each. fini undoes init, after device_fini. */
  int (*init)(kiln_backend *b, const kiln_backend_options *opts, uint32_t *ndevices,
              kiln_status *st);
  void (*fini)(kiln_backend *b);
  int (*device_init)(kiln_device *d, kiln_status *st); /* sets d->ctx, d->nthreads */
  void (*device_fini)(kiln_device *d);

  /* Memory (required). alloc returns zero-filled memory in *mem. Offsets and
   * sizes of write/read are within the buffer. */
  int (*buffer_alloc)(kiln_device *d, size_t bytes, void **mem, kiln_status *st);
  void (*buffer_free)(kiln_device *d, void *mem);
  int (*buffer_write)(kiln_device *d, void *mem, size_t offset, const void *src, size_t n,
                      kiln_status *st);
  int (*buffer_read)(kiln_device *d, const void *mem, size_t offset, void *dst, size_t n,
                     kiln_status *st);
  /* Device to device (optional: NULL bounces through host memory, read
   * then write). Both devices are of this backend, maybe the same one;
   * ranges are within the buffers and do not overlap. */
  int (*buffer_copy)(kiln_device *dd, void *dst, size_t dst_offset, kiln_device *sd,
                     const void *src, size_t src_offset, size_t n, kiln_status *st);
  /* The host address of mem (optional: NULL for device memory of its own).
   * discard: see kiln_buffer_host. */
  void *(*buffer_host)(kiln_device *d, void *mem, bool discard);
  /* Every device addresses every sibling's buffers directly (see above). */
  bool shared_memory;

  /* Executables (optional: NULL for backends that only interpret modules).
   * load validates e and sets l->ctx. run gets args already counted (nargs
   * == e->nparams, none NULL). execute gets parameter leaf buffers checked
   * against the bindings (device and size) and result buffers allocated to
   * the result bindings' sizes. */
  int (*load)(kiln_loaded *l, kiln_status *st);
  void (*unload)(kiln_loaded *l);
  int (*run)(kiln_loaded *l, const kiln_literal *const *args, const kiln_run_options *opts,
             kiln_literal **out, kiln_status *st);
  int (*execute)(kiln_loaded *l, kiln_buffer *const *args, const kiln_run_options *opts,
                 kiln_buffer *const *results, kiln_status *st);
  /* The same, launched (optional: NULL runs execute synchronously). On 0
   * the backend owns the launch and signals ev when it is over (the run's
   * outcome goes to the event); a nonzero return means nothing was
   * launched and ev will not be signalled. */
  int (*execute_async)(kiln_loaded *l, kiln_buffer *const *args, const kiln_run_options *opts,
                       kiln_buffer *const *results, kiln_event *ev, kiln_status *st);

  /* Modules (optional: only interpreters run a module as such). */
  int (*run_module)(kiln_device *d, const kiln_module *m, const kiln_literal *const *args,
                    uint32_t nargs, const kiln_run_options *opts, kiln_literal **out,
                    kiln_status *st);

  /* Communicators (optional: NULL when the backend needs no state for a
   * device set). comm_fini undoes comm_init. */
  int (*comm_init)(kiln_comm *c, kiln_status *st);
  void (*comm_fini)(kiln_comm *c);
  /* Collectives on a communicator (optional: NULL makes every collective
   * KILN_EUNIMPL). See the contract above. */
  int (*collective)(kiln_comm *c, const kiln_collective *desc, kiln_status *st);

  /* Waits for submitted work (optional: NULL when every call is synchronous). */
  int (*synchronize)(kiln_device *d, kiln_status *st);
};

/* The registered backends. */
extern const kiln_backend_iface kiln_cpu_backend_iface;
extern const kiln_backend_iface kiln_interp_backend_iface;
#ifdef KILN_HAVE_CUDA
/* Registered only where the driver loads and sees a GPU (backend.c). */
extern const kiln_backend_iface kiln_cuda_backend_iface;
#endif

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXECUTOR_BACKEND_IMPL_H */
