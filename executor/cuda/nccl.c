/* NCCL, opened at first use (nccl_api.h): the entry points, the unique id,
 * communicators created nonblocking with a deadline, and the bounded waits
 * that stand between a collective and a hang.
 *
 * The idea: every NCCL call that can block on peers (an init, a collective
 * that a peer never joins) is made on a nonblocking communicator, so it
 * returns at once, and completion is then polled: ncclCommGetAsyncError
 * for the communicator's own state, cuStreamQuery for the work on the
 * stream. Polling backs off from a few microseconds to a millisecond, so
 * a fast collective costs little and a stuck one costs no CPU. Past the
 * deadline the communicator is aborted, which is the only way NCCL lets go
 * of a kernel waiting for a peer, and the caller gets KILN_EDEADLINE
 * naming the call.
 */
#include "executor/cuda/nccl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "compiler/ir/ir.h"
#include "executor/cuda/nccl_api.h"

#define DEFAULT_INIT_SECONDS 60.0

static struct {
  void *lib;
  char why[400];
  kiln__nccl_api api;
  bool ok;
} nc;
static pthread_once_t nc_once = PTHREAD_ONCE_INIT;

static void load(void) {
  const char *env = getenv("KILN_NCCL_LIB");
  const char *file = env && env[0] ? env : "libnccl.so.2";
  nc.lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (nc.lib == NULL) {
    const char *e = dlerror();
    snprintf(nc.why, sizeof nc.why, "NCCL is not installed here (%.300s)", e ? e : file);
    return;
  }
  /* A void * from dlsym converts to a function pointer as POSIX allows. */
#define KILN__NCCL_FETCH(field, name, proto) \
  do { \
    void *p_ = dlsym(nc.lib, name); \
    memcpy(&nc.api.field, &p_, sizeof p_); \
    if (p_ == NULL && nc.why[0] == '\0') \
      snprintf(nc.why, sizeof nc.why, "%.200s has no %s (NCCL 2.18 or later is needed)", file, \
               name); \
  } while (0);
  KILN__NCCL_API(KILN__NCCL_FETCH)
#undef KILN__NCCL_FETCH
  void *p = dlsym(nc.lib, "ncclGetLastError");
  memcpy(&nc.api.get_last_error, &p, sizeof p);
  if (nc.why[0]) return;
  if (nc.api.get_version(&nc.api.version) != ncclSuccess) nc.api.version = 0;
  nc.ok = true;
}

const kiln__nccl_api *kiln__nccl_api_get(kiln_status *st) {
  pthread_once(&nc_once, load);
  if (!nc.ok) {
    kiln_status_set(st, KILN_EUNAVAIL, "nccl", "%s", nc.why);
    return NULL;
  }
  return &nc.api;
}

double kiln__nccl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int kiln__nccl_check(const kiln__nccl_api *a, ncclComm_t comm, ncclResult_t r, const char *call,
                     const char *where, kiln_status *st) {
  if (r == ncclSuccess) return 0;
  const char *text = a && a->get_error_string ? a->get_error_string(r) : NULL;
  const char *last = a && a->get_last_error ? a->get_last_error(comm) : NULL;
  int code = r == ncclSystemError || r == ncclRemoteError ? KILN_EUNAVAIL : KILN_EINTERNAL;
  return kiln_status_set(st, code, where, "%s failed: %.160s%s%.200s%s", call,
                         text ? text : "unknown NCCL error", last && last[0] ? " (" : "",
                         last ? last : "", last && last[0] ? ")" : "");
}

int kiln_nccl_mint_id(void *ctx, uint8_t *id, size_t n, kiln_status *st) {
  (void)ctx;
  if (n != KILN_NCCL_ID_BYTES)
    return kiln_status_set(st, KILN_EINVAL, "nccl", "an NCCL id is %d bytes, not %zu",
                           KILN_NCCL_ID_BYTES, n);
  const kiln__nccl_api *a = kiln__nccl_api_get(st);
  if (a == NULL) return KILN_EUNAVAIL;
  ncclUniqueId u;
  ncclResult_t r = a->get_unique_id(&u);
  if (r != ncclSuccess) { /* whatever NCCL says, no id means no mesh here */
    kiln_status why;
    kiln_status_clear(&why);
    kiln__nccl_check(a, NULL, r, "ncclGetUniqueId", "nccl", &why);
    return kiln_status_set(st, KILN_EUNAVAIL, "nccl", "%s", why.msg);
  }
  memcpy(id, u.internal, n);
  return 0;
}

/* ---- waiting --------------------------------------------------------------- */

/* Sleeps a little longer each time, up to a millisecond. */
static void backoff(long *ns) {
  struct timespec ts = {0, *ns};
  nanosleep(&ts, NULL);
  if (*ns < 1000000) *ns *= 2;
}

int kiln__nccl_settle(const kiln__nccl_api *a, ncclComm_t const *comms, uint32_t n, double deadline,
                      const char *call, const char *where, kiln_status *st) {
  long ns = 2000;
  for (;;) {
    bool busy = false;
    for (uint32_t i = 0; i < n; i++) {
      ncclResult_t s = ncclSuccess;
      ncclResult_t r = a->comm_get_async_error(comms[i], &s);
      if (r != ncclSuccess)
        return kiln__nccl_check(a, comms[i], r, "ncclCommGetAsyncError", where, st);
      if (s == ncclInProgress) {
        busy = true;
      } else if (s != ncclSuccess) {
        return kiln__nccl_check(a, comms[i], s, call, where, st);
      }
    }
    if (!busy) return 0;
    if (deadline > 0 && kiln__nccl_now() > deadline)
      return kiln_status_set(st, KILN_EDEADLINE, where,
                             "%s did not complete before its deadline (a peer did not join)", call);
    backoff(&ns);
  }
}

int kiln__nccl_stream_wait(const kiln__nccl_api *a, const kiln__cuda_api *cu,
                           ncclComm_t const *comms, const CUcontext *ctxs, const CUstream *streams,
                           uint32_t n, double deadline, const atomic_int *cancel, const char *call,
                           const char *where, kiln_status *st) {
  long ns = 1000;
  for (uint32_t i = 0; i < n;) {
    CUcontext popped;
    CUresult q = cu->ctx_push(ctxs[i]);
    if (q == CUDA_SUCCESS) {
      q = cu->stream_query(streams[i]);
      cu->ctx_pop(&popped);
    }
    ncclResult_t s = ncclSuccess;
    ncclResult_t r = a->comm_get_async_error(comms[i], &s);
    if (r != ncclSuccess)
      return kiln__nccl_check(a, comms[i], r, "ncclCommGetAsyncError", where, st);
    if (s != ncclSuccess && s != ncclInProgress)
      return kiln__nccl_check(a, comms[i], s, call, where, st);
    if (q == CUDA_SUCCESS) {
      i++;
      continue;
    }
    if (q != CUDA_ERROR_NOT_READY) return kiln__cuda_check(cu, q, "cuStreamQuery", where, st);
    if (cancel && atomic_load_explicit(cancel, memory_order_relaxed))
      return kiln_status_set(st, KILN_ECANCELED, where, "cancelled while %s ran", call);
    if (deadline > 0 && kiln__nccl_now() > deadline)
      return kiln_status_set(st, KILN_EDEADLINE, where,
                             "%s did not complete before the run's deadline (a peer did not "
                             "join); its communicator was aborted",
                             call);
    backoff(&ns);
  }
  return 0;
}

/* ---- communicators ----------------------------------------------------------- */

void kiln__nccl_clique_destroy(kiln__nccl_clique *c) {
  if (c == NULL) return;
  for (uint32_t i = 0; i < c->n; i++) {
    if (c->comms[i] == NULL) continue;
    CUcontext popped;
    bool pushed = c->cu->ctx_push(c->ctxs[i]) == CUDA_SUCCESS;
    if (c->broken)
      c->api->comm_abort(c->comms[i]);
    else
      c->api->comm_destroy(c->comms[i]);
    if (pushed) c->cu->ctx_pop(&popped);
  }
  kiln_free(c->comms);
  kiln_free(c->ctxs);
  kiln_free(c);
}

void kiln__nccl_clique_abort(kiln__nccl_clique *c) {
  if (c == NULL || c->broken) return;
  for (uint32_t i = 0; i < c->n; i++)
    if (c->comms[i]) {
      c->api->comm_abort(c->comms[i]);
      c->comms[i] = NULL;
    }
  c->broken = true;
}

int kiln__nccl_clique_create(const kiln__nccl_api *a, const kiln__cuda_api *cu, const uint8_t *id,
                             uint32_t nranks, uint32_t first, uint32_t n, const CUcontext *ctxs,
                             double deadline, const char *where, kiln__nccl_clique **out,
                             kiln_status *st) {
  *out = NULL;
  if (n == 0 || nranks == 0 || first > nranks || n > nranks - first || nranks > INT32_MAX)
    return kiln_status_set(st, KILN_EINVAL, where,
                           "ranks %u..%u of a communicator of %u: not a range of it", first,
                           first + n, nranks);
  if (id == NULL && n != nranks)
    return kiln_status_set(st, KILN_EINVAL, where,
                           "a communicator of %u ranks with %u here needs the id of its first "
                           "rank",
                           nranks, n);
  ncclUniqueId uid;
  if (id) {
    memcpy(uid.internal, id, sizeof uid.internal);
  } else {
    ncclResult_t r = a->get_unique_id(&uid);
    if (r != ncclSuccess) return kiln__nccl_check(a, NULL, r, "ncclGetUniqueId", where, st);
  }
  kiln__nccl_clique *c = kiln_calloc(1, sizeof *c);
  if (c) c->comms = kiln_calloc(n, sizeof *c->comms);
  if (c) c->ctxs = kiln_calloc(n, sizeof *c->ctxs);
  if (c == NULL || c->comms == NULL || c->ctxs == NULL) {
    if (c) {
      kiln_free(c->comms);
      kiln_free(c->ctxs);
    }
    kiln_free(c);
    return kiln_status_set(st, KILN_ENOMEM, where, "out of memory");
  }
  c->n = n;
  c->nranks = nranks;
  c->api = a;
  c->cu = cu;
  memcpy(c->ctxs, ctxs, n * sizeof *ctxs);
  if (deadline <= 0) deadline = kiln__nccl_now() + DEFAULT_INIT_SECONDS;
  /* One thread, several devices: the inits are one group, each made with
   * its device's context current (NCCL takes the device from it). */
  int rc = kiln__nccl_check(a, NULL, a->group_start(), "ncclGroupStart", where, st);
  bool grouped = rc == 0;
  for (uint32_t i = 0; rc == 0 && i < n; i++) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    CUcontext popped;
    rc = kiln__cuda_check(cu, cu->ctx_push(ctxs[i]), "cuCtxPushCurrent", where, st);
    if (rc) break;
    ncclResult_t r =
        a->comm_init_rank_config(&c->comms[i], (int)nranks, uid, (int)(first + i), &cfg);
    cu->ctx_pop(&popped);
    if (r != ncclSuccess && r != ncclInProgress) {
      c->comms[i] = NULL;
      rc = kiln__nccl_check(a, NULL, r, "ncclCommInitRankConfig", where, st);
    }
  }
  if (grouped) {
    ncclResult_t r = a->group_end();
    if (rc == 0 && r != ncclSuccess && r != ncclInProgress)
      rc = kiln__nccl_check(a, NULL, r, "ncclGroupEnd (the communicator's inits)", where, st);
  }
  if (rc == 0)
    rc = kiln__nccl_settle(a, c->comms, n, deadline, "ncclCommInitRankConfig", where, st);
  if (rc) {
    kiln__nccl_clique_abort(c);
    kiln__nccl_clique_destroy(c);
    return rc;
  }
  *out = c;
  return 0;
}

bool kiln__nccl_dtype(int dtype, int reduce, ncclDataType_t *out, ncclRedOp_t *op) {
  bool is_and = reduce == KILN_OP_AND, is_or = reduce == KILN_OP_OR;
  if (dtype == KILN_PRED) { /* 0/1 bytes: or is max, and is min */
    *out = ncclUint8;
    *op = is_or || reduce == KILN_OP_MAXIMUM || reduce == KILN_OP_ADD ? ncclMax : ncclMin;
    return true;
  }
  switch (dtype) {
  case KILN_S8: *out = ncclInt8; break;
  case KILN_U8: *out = ncclUint8; break;
  case KILN_S32: *out = ncclInt32; break;
  case KILN_U32: *out = ncclUint32; break;
  case KILN_S64: *out = ncclInt64; break;
  case KILN_U64: *out = ncclUint64; break;
  case KILN_F16: *out = ncclFloat16; break;
  case KILN_BF16: *out = ncclBfloat16; break;
  case KILN_F32: *out = ncclFloat32; break;
  case KILN_F64: *out = ncclFloat64; break;
  default: return false; /* s16, u16, complex, fp8: no NCCL reduction */
  }
  switch (reduce) {
  case KILN_OP_ADD: *op = ncclSum; return true;
  case KILN_OP_MULTIPLY: *op = ncclProd; return true;
  case KILN_OP_MAXIMUM: *op = ncclMax; return true;
  case KILN_OP_MINIMUM: *op = ncclMin; return true;
  default: (void)is_and; return false; /* bitwise and/or: NCCL has none */
  }
}
