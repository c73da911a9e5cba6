/* The libnccl entry points the cuda backend calls, taken once per process
 * with dlsym (nccl.c), and the helpers that turn NCCL's results into
 * statuses and its asynchronous completion into bounded waits. Internal to
 * executor/cuda/: it includes the toolkit's nccl.h and cuda.h for the
 * types; nothing links libnccl.
 *
 * Communicators are created nonblocking (ncclConfig_t.blocking = 0) so
 * that no call can hang: an init or a collective that does not finish by
 * its deadline is aborted (ncclCommAbort) and becomes KILN_EDEADLINE
 * naming the call, and an asynchronous error (ncclCommGetAsyncError, a
 * peer that died) becomes a status naming the call it surfaced in.
 */
#ifndef KILN_EXECUTOR_CUDA_NCCL_API_H
#define KILN_EXECUTOR_CUDA_NCCL_API_H

#include <cuda.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "common/status.h"
#include "executor/cuda/cuda_api.h"
#include "executor/cuda/nccl.h"

/* X(field, symbol, prototype in nccl.h) */
#define KILN__NCCL_API(X) \
  X(get_version, "ncclGetVersion", ncclGetVersion) \
  X(get_unique_id, "ncclGetUniqueId", ncclGetUniqueId) \
  X(get_error_string, "ncclGetErrorString", ncclGetErrorString) \
  X(comm_init_rank_config, "ncclCommInitRankConfig", ncclCommInitRankConfig) \
  X(comm_destroy, "ncclCommDestroy", ncclCommDestroy) \
  X(comm_abort, "ncclCommAbort", ncclCommAbort) \
  X(comm_get_async_error, "ncclCommGetAsyncError", ncclCommGetAsyncError) \
  X(group_start, "ncclGroupStart", ncclGroupStart) \
  X(group_end, "ncclGroupEnd", ncclGroupEnd) \
  X(all_reduce, "ncclAllReduce", ncclAllReduce) \
  X(all_gather, "ncclAllGather", ncclAllGather) \
  X(reduce_scatter, "ncclReduceScatter", ncclReduceScatter) \
  X(broadcast, "ncclBroadcast", ncclBroadcast) \
  X(send, "ncclSend", ncclSend) \
  X(recv, "ncclRecv", ncclRecv)

typedef struct kiln__nccl_api {
#define KILN__NCCL_FIELD(field, name, proto) __typeof__(proto) *field;
  KILN__NCCL_API(KILN__NCCL_FIELD)
#undef KILN__NCCL_FIELD
  const char *(*get_last_error)(ncclComm_t); /* optional (NCCL >= 2.13) */
  int version;                               /* ncclGetVersion's */
} kiln__nccl_api;

/* The table once libnccl has loaded (env KILN_NCCL_LIB names another
 * file); NULL with the reason in st (KILN_EUNAVAIL) otherwise. */
const kiln__nccl_api *kiln__nccl_api_get(kiln_status *st);

/* 0 for ncclSuccess; else "CALL failed: <NCCL's text> (<its last error>)"
 * at where, KILN_EUNAVAIL for a system or remote error (a peer, the
 * network), KILN_EINTERNAL for the rest. ncclInProgress is not handled
 * here (kiln__nccl_settle). */
int kiln__nccl_check(const kiln__nccl_api *a, ncclComm_t comm, ncclResult_t r, const char *call,
                     const char *where, kiln_status *st);

/* The local ranks of one NCCL communicator, one per device, created
 * together and destroyed together. */
struct kiln__nccl_clique {
  uint32_t n;        /* local ranks */
  uint32_t nranks;   /* the communicator's ranks, all hosts */
  ncclComm_t *comms; /* n, in the order of the devices given */
  CUcontext *ctxs;   /* n: each comm's device's primary context */
  bool broken;       /* aborted after an error: recreate before use */
  const kiln__nccl_api *api;
  const kiln__cuda_api *cu;
};

/* Creates n local ranks of a communicator of nranks: local rank i is
 * communicator rank first + i on the device whose context is ctxs[i]. id is
 * the communicator's unique id (NULL: minted here, for a communicator
 * wholly in this process, nranks == n). The inits are one group
 * (ncclGroupStart/End) issued from this thread, nonblocking, then polled
 * until done; past `deadline` (CLOCK_MONOTONIC seconds; 0: 60 s from now)
 * they are aborted and the result is KILN_EDEADLINE. */
int kiln__nccl_clique_create(const kiln__nccl_api *a, const kiln__cuda_api *cu, const uint8_t *id,
                             uint32_t nranks, uint32_t first, uint32_t n, const CUcontext *ctxs,
                             double deadline, const char *where, kiln__nccl_clique **out,
                             kiln_status *st);
void kiln__nccl_clique_destroy(kiln__nccl_clique *c); /* NULL is a no-op */
/* Aborts every rank (after an error or a missed deadline) and marks the
 * clique broken. */
void kiln__nccl_clique_abort(kiln__nccl_clique *c);

/* Waits until none of comms[0..n) reports ncclInProgress (a nonblocking
 * call's enqueueing); an asynchronous error is a status naming `call`; the
 * deadline passing is KILN_EDEADLINE. */
int kiln__nccl_settle(const kiln__nccl_api *a, ncclComm_t const *comms, uint32_t n, double deadline,
                      const char *call, const char *where, kiln_status *st);

/* Waits until streams[i] (on context ctxs[i]) has run everything issued to
 * it, polling cuStreamQuery and comms[i]'s asynchronous error; the deadline
 * passing (or cancel raised) is KILN_EDEADLINE (KILN_ECANCELED) naming
 * `call`. The caller aborts the communicator on failure. */
int kiln__nccl_stream_wait(const kiln__nccl_api *a, const kiln__cuda_api *cu,
                           ncclComm_t const *comms, const CUcontext *ctxs, const CUstream *streams,
                           uint32_t n, double deadline, const atomic_int *cancel, const char *call,
                           const char *where, kiln_status *st);

/* NCCL's element type for a kiln dtype, and its reduction for a kiln
 * opcode; false when NCCL has none (the step is refused at load). */
bool kiln__nccl_dtype(int dtype, int reduce, ncclDataType_t *out, ncclRedOp_t *op);

double kiln__nccl_now(void);

#endif /* KILN_EXECUTOR_CUDA_NCCL_API_H */
