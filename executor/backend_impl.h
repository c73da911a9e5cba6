/* The backend vtable: what a backend implements to plug into the executor.
 *
 * The public handles of executor/backend.h are thin structs defined here;
 * backend.c owns them and calls the vtable only after checking every
 * argument, so an implementation may assume valid handles, in-range indices
 * and sizes that fit. Each backend fills one kiln_backend_iface with
 * designated initializers (implementations named kiln_<backend>_<verb>) and
 * writes its missing optional slots out as NULL. (After ggml-backend's
 * interface table and PJRT's client/device/executable split.)
 */
#ifndef KILN_EXECUTOR_BACKEND_IMPL_H
#define KILN_EXECUTOR_BACKEND_IMPL_H

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

/* Collectives between the devices of one backend (all-reduce, all-gather,
 * reduce-scatter, all-to-all, collective-permute). Descriptor reserved for
 * the shared-memory and NCCL implementations; no backend fills these slots
 * yet. */
typedef struct kiln_collective {
  kiln_opcode op; /* KILN_OP_ALL_REDUCE, ... */
  kiln_dtype dtype;
  kiln_opcode reduce_op; /* all-reduce/reduce-scatter: add, max, ... */
  uint64_t count;        /* elements per device (send side) */
  uint32_t ndevices;
  kiln_device *const *devices; /* participants, in rank order */
  kiln_buffer *const *send;    /* one per participant */
  kiln_buffer *const *recv;    /* one per participant */
  const uint32_t *pairs;       /* collective-permute: (source, target) pairs */
  uint32_t npairs;
} kiln_collective;

typedef int (*kiln_collective_fn)(const kiln_collective *c, kiln_status *st);

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

  /* Modules (optional: only interpreters run a module as such). */
  int (*run_module)(kiln_device *d, const kiln_module *m, const kiln_literal *const *args,
                    uint32_t nargs, const kiln_run_options *opts, kiln_literal **out,
                    kiln_status *st);

  /* Collectives (optional). */
  kiln_collective_fn all_reduce;
  kiln_collective_fn all_gather;
  kiln_collective_fn reduce_scatter;
  kiln_collective_fn all_to_all;
  kiln_collective_fn collective_permute;

  /* Waits for submitted work (optional: NULL when every call is synchronous). */
  int (*synchronize)(kiln_device *d, kiln_status *st);
};

/* The registered backends. */
extern const kiln_backend_iface kiln_cpu_backend_iface;
extern const kiln_backend_iface kiln_interp_backend_iface;

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXECUTOR_BACKEND_IMPL_H */
