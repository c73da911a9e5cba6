/* A fake libnccl for the tests (opened through KILN_NCCL_LIB): the NCCL
 * calls the cuda backend makes, implemented across the fake driver's
 * devices of one process (fake_cuda.c keeps "device" memory in host
 * memory), with real data movement, so that programs with collectives run
 * on a fake cuda mesh and their results can be compared.
 *
 * Communicators: ranks that init with the same id (from this library's
 * ncclGetUniqueId) form a clique; a nonblocking init reports ncclInProgress
 * (ncclCommGetAsyncError) until every rank has joined, a blocking one
 * waits for them. Collectives: each rank's k-th collective on a clique is
 * its round k; a rank posts its operand (copied at the call, as the
 * synchronous fake stream has run everything before it) and completes once
 * every rank has posted the same round, computing its own result in rank
 * order. Sends are copied into a queue per pair of ranks; a receive takes
 * the oldest from its peer. Inside ncclGroupStart/End the calls are queued
 * and run at the end: every post first, then every completion, so that one
 * thread can drive all the ranks of a clique.
 *
 * Arguments are checked strictly (a bad one is ncclInvalidArgument or
 * ncclInvalidUsage, ncclGetLastError says which, and the test reads the
 * count back): the communicator is live and complete, the element type
 * and reduction exist, roots and peers are ranks, the stream and every
 * buffer belong to the communicator's device (the fake driver says whose
 * an address is), buffers lie within live allocations, and the ranks of a
 * round agree on the collective, count, type, reduction and root. A rank
 * that waits longer than KILN_FAKE_NCCL_TIMEOUT seconds (default 20) for a
 * peer fails with ncclRemoteError; so does one whose peer aborted. A call
 * can be made to fail (kiln_fake_nccl_fail).
 */
#include <dlfcn.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RANKS 64
#define COMM_MAGIC 0x6e63636cu
static const char id_mark[8] = "KILNFAKE";

typedef struct clique clique;

struct ncclComm {
  uint32_t magic;
  clique *q;
  int rank, dev;
  bool blocking;
  ncclResult_t async; /* an error seen by this rank */
  uint64_t seq;       /* collectives posted */
};

typedef struct fround {
  struct fround *next;
  uint64_t seq;
  int nposted, ndone;
  struct {
    int kind;
    size_t count;
    ncclDataType_t t;
    ncclRedOp_t red;
    int root;
    char *data; /* the operand, copied */
  } post[MAX_RANKS];
} fround;

typedef struct msg {
  struct msg *next;
  int from, to;
  size_t bytes;
  char *data;
} msg;

struct clique {
  clique *next;
  char id[NCCL_UNIQUE_ID_BYTES];
  int nranks, joined, live;
  bool aborted; /* a rank aborted: the others fail */
  struct ncclComm *comms[MAX_RANKS];
  fround *rounds;
  msg *msgs;
};

enum { K_ALL_REDUCE, K_ALL_GATHER, K_REDUCE_SCATTER, K_BROADCAST, K_SEND, K_RECV };
static const char *const kind_names[] = {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter",
                                         "ncclBroadcast", "ncclSend",      "ncclRecv"};

typedef struct fop {
  int kind;
  struct ncclComm *comm;
  const void *send;
  void *recv;
  size_t count;
  ncclDataType_t t;
  ncclRedOp_t red;
  int peer;  /* root, or the p2p peer */
  fround *r; /* posted collective */
} fop;

typedef struct fake_nccl_stats {
  long inits, live_comms, collectives, p2p, groups, bad_args, aborts, destroys;
} fake_nccl_stats;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  clique *cliques;
  fake_nccl_stats s;
  unsigned long ids;
  char fail_call[64];
  long fail_after;
  ncclResult_t fail_with;
  int (*device_of)(uint64_t, size_t);
  int (*current_device)(void);
  int (*stream_device)(void *);
} fn = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static __thread int group_depth;
static __thread fop *queue;
static __thread size_t nqueue, capqueue;
static __thread struct ncclComm *pending_init[MAX_RANKS];
static __thread int npending_init;
static __thread char last_error[512];

/* ---- the test's side ------------------------------------------------------ */

void kiln_fake_nccl_stats(fake_nccl_stats *out) {
  pthread_mutex_lock(&fn.mu);
  *out = fn.s;
  pthread_mutex_unlock(&fn.mu);
}

/* Call `name` fails with r after `after` more successful calls. */
void kiln_fake_nccl_fail(const char *name, long after, int r) {
  pthread_mutex_lock(&fn.mu);
  snprintf(fn.fail_call, sizeof fn.fail_call, "%s", name ? name : "");
  fn.fail_after = after;
  fn.fail_with = (ncclResult_t)r;
  pthread_mutex_unlock(&fn.mu);
}

static bool failing(const char *name) {
  pthread_mutex_lock(&fn.mu);
  bool f = false;
  if (fn.fail_call[0] && strcmp(fn.fail_call, name) == 0) f = fn.fail_after-- <= 0;
  pthread_mutex_unlock(&fn.mu);
  if (f) snprintf(last_error, sizeof last_error, "fake nccl: %s made to fail", name);
  return f;
}
#define FAIL(name) \
  do { \
    if (failing(name)) return fn.fail_with; \
  } while (0)

/* ---- checks ------------------------------------------------------------------ */

static ncclResult_t bad(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t bad(ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&fn.mu);
  fn.s.bad_args++;
  pthread_mutex_unlock(&fn.mu);
  return r;
}

/* The fake driver's own functions (it was opened first, by the backend). */
static bool driver(void) {
  if (fn.device_of) return true;
  const char *file = getenv("KILN_CUDA_DRIVER");
  void *h = file ? dlopen(file, RTLD_NOW | RTLD_NOLOAD) : NULL;
  if (h == NULL) return false;
  void *a = dlsym(h, "kiln_fake_cuda_current_device"),
       *b = dlsym(h, "kiln_fake_cuda_stream_device");
  void *c = dlsym(h, "kiln_fake_cuda_device_of");
  memcpy(&fn.current_device, &a, sizeof a);
  memcpy(&fn.stream_device, &b, sizeof b);
  memcpy(&fn.device_of, &c, sizeof c); /* last: the flag that all are set */
  return fn.device_of && fn.current_device && fn.stream_device;
}

static size_t type_size(ncclDataType_t t) {
  switch (t) {
  case ncclInt8:
  case ncclUint8: return 1;
  case ncclFloat16:
  case ncclBfloat16: return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32: return 4;
  case ncclInt64:
  case ncclUint64:
  case ncclFloat64: return 8;
  default: return 0; /* fp8 and the rest: not in this fake */
  }
}

static ncclResult_t check_comm(struct ncclComm *c, const char *call) {
  if (c == NULL || c->magic != COMM_MAGIC)
    return bad(ncclInvalidArgument, "fake nccl: %s: not a live communicator", call);
  if (c->q->joined < c->q->nranks)
    return bad(ncclInvalidUsage, "fake nccl: %s: the communicator's init has not completed", call);
  return ncclSuccess;
}

/* [p, p + n) is memory of device dev (n == 0: nothing to check). */
static ncclResult_t check_buf(const void *p, size_t n, int dev, const char *call,
                              const char *what) {
  if (n == 0) return ncclSuccess;
  int d = fn.device_of((uint64_t)(uintptr_t)p, n);
  if (d < 0)
    return bad(ncclInvalidArgument, "fake nccl: %s: %s %p (%zu bytes) is not in a live allocation",
               call, what, p, n);
  if (d != dev)
    return bad(ncclInvalidArgument, "fake nccl: %s: %s is memory of device %d, the comm's is %d",
               call, what, d, dev);
  return ncclSuccess;
}

static bool overlap(const void *a, size_t an, const void *b, size_t bn) {
  const char *x = a, *y = b;
  return an && bn && x < y + bn && y < x + an;
}

/* Operand and result sizes of a collective, in bytes. */
static void sizes(const fop *o, size_t *in, size_t *out) {
  size_t es = type_size(o->t), n = (size_t)o->comm->q->nranks;
  *in = *out = o->count * es;
  if (o->kind == K_ALL_GATHER) *out = o->count * es * n;
  if (o->kind == K_REDUCE_SCATTER) *in = o->count * es * n;
}

static ncclResult_t check_op(const fop *o, void *stream) {
  const char *call = kind_names[o->kind];
  ncclResult_t r = check_comm(o->comm, call);
  if (r != ncclSuccess) return r;
  if (!driver()) return bad(ncclSystemError, "fake nccl: the fake driver is not loaded");
  if (type_size(o->t) == 0)
    return bad(ncclInvalidArgument, "fake nccl: %s: element type %d", call, (int)o->t);
  if ((o->kind == K_ALL_REDUCE || o->kind == K_REDUCE_SCATTER) &&
      ((int)o->red < 0 || o->red >= ncclAvg))
    return bad(ncclInvalidArgument, "fake nccl: %s: reduction %d", call, (int)o->red);
  int n = o->comm->q->nranks, dev = o->comm->dev;
  if ((o->kind == K_BROADCAST || o->kind == K_SEND || o->kind == K_RECV) &&
      (o->peer < 0 || o->peer >= n))
    return bad(ncclInvalidArgument, "fake nccl: %s: rank %d of %d", call, o->peer, n);
  if (stream == NULL)
    return bad(ncclInvalidUsage, "fake nccl: %s: the legacy stream (the backend has its own)",
               call);
  if (fn.stream_device(stream) != dev)
    return bad(ncclInvalidUsage, "fake nccl: %s: a stream of device %d, the comm's is %d", call,
               fn.stream_device(stream), dev);
  size_t in, out;
  sizes(o, &in, &out);
  if (o->kind == K_RECV) in = 0;
  if (o->kind == K_SEND) out = 0;
  if ((r = check_buf(o->send, in, dev, call, "the send buffer")) != ncclSuccess) return r;
  if ((r = check_buf(o->recv, out, dev, call, "the receive buffer")) != ncclSuccess) return r;
  if (o->kind != K_SEND && o->kind != K_RECV && overlap(o->send, in, o->recv, out)) {
    const char *s = o->send, *d = o->recv;
    size_t rank = (size_t)o->comm->rank;
    bool in_place = (o->kind == K_ALL_REDUCE || o->kind == K_BROADCAST) ? s == d
                    : o->kind == K_ALL_GATHER                           ? s == d + rank * in
                                                                        : d == s + rank * out;
    if (!in_place)
      return bad(ncclInvalidArgument,
                 "fake nccl: %s: send and receive buffers overlap without being in place", call);
  }
  return ncclSuccess;
}

/* ---- reductions ---------------------------------------------------------------- */

static float half_to_float(uint16_t h) {
  uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 0)
    v = ldexpf((float)m, -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = ldexpf((float)(m | 1024), (int)e - 25);
  return s ? -v : v;
}

static uint16_t float_to_half(float f) { /* round to nearest even, through the bits */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t e = (int32_t)((x >> 23) & 255) - 127 + 15;
  uint32_t m = x & 0x7fffff;
  if (((x >> 23) & 255) == 255) return (uint16_t)(sign | 0x7c00 | (m ? 0x200 : 0));
  if (e >= 31) return (uint16_t)(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    m |= 0x800000;
    uint32_t shift = (uint32_t)(14 - e), half = 1u << (shift - 1);
    uint32_t v = m >> shift, rem = m & ((1u << shift) - 1);
    if (rem > half || (rem == half && (v & 1))) v++;
    return (uint16_t)(sign | v);
  }
  uint32_t v = ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (v & 1))) v++;
  return (uint16_t)(sign | v);
}

static float bf16_to_float(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

#define FOLD(a, b, red) \
  ((red) == ncclSum    ? (a) + (b) \
   : (red) == ncclProd ? (a) * (b) \
   : (red) == ncclMax  ? ((a) > (b) ? (a) : (b)) \
                       : ((a) < (b) ? (a) : (b)))

/* acc[i] = acc[i] red x[i], n elements of t. Integers wrap. */
static void combine(void *acc, const void *x, size_t n, ncclDataType_t t, ncclRedOp_t red) {
#define INT_CASE(T, U) \
  for (size_t i = 0; i < n; i++) { \
    T a = ((T *)acc)[i], b = ((const T *)x)[i]; \
    T v = red == ncclSum    ? (T)((U)a + (U)b) \
          : red == ncclProd ? (T)((U)a * (U)b) \
          : red == ncclMax  ? (a > b ? a : b) \
                            : (a < b ? a : b); \
    ((T *)acc)[i] = v; \
  }
  switch (t) {
  case ncclInt8: INT_CASE(int8_t, uint8_t) break;
  case ncclUint8: INT_CASE(uint8_t, uint8_t) break;
  case ncclInt32: INT_CASE(int32_t, uint32_t) break;
  case ncclUint32: INT_CASE(uint32_t, uint32_t) break;
  case ncclInt64: INT_CASE(int64_t, uint64_t) break;
  case ncclUint64: INT_CASE(uint64_t, uint64_t) break;
  case ncclFloat32:
    for (size_t i = 0; i < n; i++)
      ((float *)acc)[i] = FOLD(((float *)acc)[i], ((const float *)x)[i], red);
    break;
  case ncclFloat64:
    for (size_t i = 0; i < n; i++)
      ((double *)acc)[i] = FOLD(((double *)acc)[i], ((const double *)x)[i], red);
    break;
  case ncclFloat16:
  case ncclBfloat16:
    for (size_t i = 0; i < n; i++) {
      uint16_t *a = (uint16_t *)acc + i, b = ((const uint16_t *)x)[i];
      bool bf = t == ncclBfloat16;
      float u = bf ? bf16_to_float(*a) : half_to_float(*a),
            v = bf ? bf16_to_float(b) : half_to_float(b);
      float w = FOLD(u, v, red);
      *a = bf ? float_to_bf16(w) : float_to_half(w);
    }
    break;
  default: break; /* refused by check_op */
  }
#undef INT_CASE
}

/* ---- posting and completing ----------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double timeout_s(void) {
  const char *e = getenv("KILN_FAKE_NCCL_TIMEOUT");
  double v = e && e[0] ? atof(e) : 20.0;
  return v > 0 ? v : 20.0;
}

/* Waits on the cv until `deadline`; false once it has passed. Holding mu. */
static bool nap(double deadline) {
  double left = deadline - now_s();
  if (left <= 0) return false;
  if (left > 0.05) left = 0.05;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  long ns = ts.tv_nsec + (long)(left * 1e9);
  ts.tv_sec += ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  pthread_cond_timedwait(&fn.cv, &fn.mu, &ts);
  return true;
}

/* Holding mu. */
static void post(fop *o) {
  clique *q = o->comm->q;
  if (o->kind == K_RECV) return;
  size_t in, out;
  sizes(o, &in, &out);
  char *copy = malloc(in ? in : 1);
  if (copy && in) memcpy(copy, o->send, in);
  if (o->kind == K_SEND) {
    msg *m = calloc(1, sizeof *m);
    m->from = o->comm->rank;
    m->to = o->peer;
    m->bytes = in;
    m->data = copy;
    msg **pp = &q->msgs;
    while (*pp) pp = &(*pp)->next;
    *pp = m;
    fn.s.p2p++;
    return;
  }
  uint64_t seq = o->comm->seq++;
  fround *r = q->rounds;
  while (r && r->seq != seq) r = r->next;
  if (r == NULL) {
    r = calloc(1, sizeof *r);
    r->seq = seq;
    r->next = q->rounds;
    q->rounds = r;
  }
  int k = o->comm->rank;
  r->post[k].kind = o->kind;
  r->post[k].count = o->count;
  r->post[k].t = o->t;
  r->post[k].red = o->red;
  r->post[k].root = o->peer;
  r->post[k].data = copy;
  r->nposted++;
  o->r = r;
  fn.s.collectives++;
}

static void round_free(clique *q, fround *r) {
  fround **pp = &q->rounds;
  while (*pp != r) pp = &(*pp)->next;
  *pp = r->next;
  for (int k = 0; k < q->nranks; k++) free(r->post[k].data);
  free(r);
}

static ncclResult_t peer_gone(fop *o, const char *what) {
  o->comm->async = ncclRemoteError;
  snprintf(last_error, sizeof last_error, "fake nccl: %s: rank %d %s", kind_names[o->kind],
           o->comm->rank, what);
  return ncclRemoteError;
}

/* Holding mu. */
static ncclResult_t complete(fop *o) {
  clique *q = o->comm->q;
  double deadline = now_s() + timeout_s();
  if (o->kind == K_SEND) return ncclSuccess;
  if (o->kind == K_RECV) {
    for (;;) {
      for (msg **pp = &q->msgs; *pp; pp = &(*pp)->next) {
        msg *m = *pp;
        if (m->from != o->peer || m->to != o->comm->rank) continue;
        *pp = m->next;
        size_t want = o->count * type_size(o->t);
        ncclResult_t r = ncclSuccess;
        if (m->bytes != want)
          r = bad(ncclInvalidUsage, "fake nccl: ncclRecv of %zu bytes from rank %d, which sent %zu",
                  want, m->from, m->bytes);
        else if (want)
          memcpy(o->recv, m->data, want);
        free(m->data);
        free(m);
        return r;
      }
      if (q->aborted) return peer_gone(o, "waited for a peer that aborted");
      if (!nap(deadline)) return peer_gone(o, "timed out waiting for its peer's ncclSend");
    }
  }
  fround *r = o->r;
  while (r->nposted < q->nranks) {
    if (q->aborted) return peer_gone(o, "waited for a peer that aborted");
    if (!nap(deadline)) return peer_gone(o, "timed out waiting for its peers' calls");
  }
  int me = o->comm->rank, n = q->nranks;
  ncclResult_t res = ncclSuccess;
  for (int k = 0; k < n && res == ncclSuccess; k++)
    if (r->post[k].kind != o->kind || r->post[k].count != o->count || r->post[k].t != o->t ||
        ((o->kind == K_ALL_REDUCE || o->kind == K_REDUCE_SCATTER) && r->post[k].red != o->red) ||
        (o->kind == K_BROADCAST && r->post[k].root != o->peer))
      res = bad(ncclInvalidUsage,
                "fake nccl: round %llu: rank %d called %s (count %zu, type %d), rank %d %s (count "
                "%zu, type %d)",
                (unsigned long long)r->seq, me, kind_names[o->kind], o->count, (int)o->t, k,
                kind_names[r->post[k].kind], r->post[k].count, (int)r->post[k].t);
  size_t es = type_size(o->t), bytes = o->count * es;
  if (res == ncclSuccess) switch (o->kind) {
    case K_ALL_REDUCE:
    case K_REDUCE_SCATTER: {
      size_t off = o->kind == K_REDUCE_SCATTER ? (size_t)me * bytes : 0;
      char *acc = malloc(bytes ? bytes : 1);
      memcpy(acc, r->post[0].data + off, bytes);
      for (int k = 1; k < n; k++) combine(acc, r->post[k].data + off, o->count, o->t, o->red);
      memcpy(o->recv, acc, bytes);
      free(acc);
      break;
    }
    case K_ALL_GATHER:
      for (int k = 0; k < n; k++)
        memcpy((char *)o->recv + (size_t)k * bytes, r->post[k].data, bytes);
      break;
    default: memcpy(o->recv, r->post[o->peer].data, bytes); break; /* K_BROADCAST */
    }
  if (++r->ndone == n) round_free(q, r);
  return res;
}

/* Runs ops (one call, or a group's): posts, then completions. */
static ncclResult_t run_ops(fop *ops, size_t n) {
  pthread_mutex_lock(&fn.mu);
  for (size_t i = 0; i < n; i++) post(&ops[i]);
  pthread_cond_broadcast(&fn.cv);
  ncclResult_t res = ncclSuccess;
  for (size_t i = 0; i < n; i++) {
    ncclResult_t r = complete(&ops[i]);
    if (res == ncclSuccess) res = r;
  }
  pthread_cond_broadcast(&fn.cv);
  pthread_mutex_unlock(&fn.mu);
  return res;
}

static ncclResult_t submit(fop o, void *stream) {
  ncclResult_t r = check_op(&o, stream);
  if (r != ncclSuccess) return r;
  if (group_depth == 0) return run_ops(&o, 1);
  if (nqueue == capqueue) {
    size_t cap = capqueue ? capqueue * 2 : 16;
    fop *q = realloc(queue, cap * sizeof *q);
    if (q == NULL) return bad(ncclSystemError, "fake nccl: out of memory");
    queue = q;
    capqueue = cap;
  }
  queue[nqueue++] = o;
  return ncclSuccess;
}

/* ---- the library ------------------------------------------------------------------ */

ncclResult_t ncclGetVersion(int *version) {
  if (version == NULL) return bad(ncclInvalidArgument, "fake nccl: ncclGetVersion(NULL)");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return last_error;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  FAIL("ncclGetUniqueId");
  if (id == NULL) return bad(ncclInvalidArgument, "fake nccl: ncclGetUniqueId(NULL)");
  memset(id, 0, sizeof *id);
  memcpy(id->internal, id_mark, sizeof id_mark);
  pthread_mutex_lock(&fn.mu);
  unsigned long k = ++fn.ids;
  pthread_mutex_unlock(&fn.mu);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(id->internal + 8, sizeof id->internal - 8, "%lu.%ld.%ld", k, (long)ts.tv_sec,
           ts.tv_nsec);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
  FAIL("ncclCommInitRankConfig");
  if (comm == NULL) return bad(ncclInvalidArgument, "fake nccl: init: no comm pointer");
  *comm = NULL;
  if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
    return bad(ncclInvalidArgument, "fake nccl: init: rank %d of %d", rank, nranks);
  if (memcmp(id.internal, id_mark, sizeof id_mark) != 0)
    return bad(ncclInvalidArgument, "fake nccl: init: the id is not one from ncclGetUniqueId");
  if (config && (config->magic != 0xcafebeef || config->size != sizeof *config))
    return bad(ncclInvalidArgument, "fake nccl: init: the config was not NCCL_CONFIG_INITIALIZER");
  if (!driver()) return bad(ncclSystemError, "fake nccl: the fake driver is not loaded");
  int dev = fn.current_device();
  if (dev < 0) return bad(ncclInvalidUsage, "fake nccl: init: no CUDA context is current");
  pthread_mutex_lock(&fn.mu);
  clique *q = fn.cliques;
  while (q && memcmp(q->id, id.internal, sizeof q->id) != 0) q = q->next;
  if (q == NULL) {
    q = calloc(1, sizeof *q);
    memcpy(q->id, id.internal, sizeof q->id);
    q->nranks = nranks;
    q->next = fn.cliques;
    fn.cliques = q;
  }
  ncclResult_t r = ncclSuccess;
  if (q->nranks != nranks)
    r = ncclInvalidArgument;
  else if (q->comms[rank] || q->aborted)
    r = ncclInvalidUsage;
  for (int k = 0; r == ncclSuccess && k < nranks; k++)
    if (q->comms[k] && q->comms[k]->dev == dev) r = ncclInvalidUsage; /* a GPU twice */
  if (r != ncclSuccess) {
    fn.s.bad_args++;
    pthread_mutex_unlock(&fn.mu);
    snprintf(last_error, sizeof last_error,
             "fake nccl: init of rank %d of %d on device %d: the id's communicator has %d ranks "
             "or that rank or device already",
             rank, nranks, dev, q->nranks);
    return r;
  }
  struct ncclComm *c = calloc(1, sizeof *c);
  c->magic = COMM_MAGIC;
  c->q = q;
  c->rank = rank;
  c->dev = dev;
  c->blocking = config == NULL || config->blocking != 0;
  q->comms[rank] = c;
  q->joined++;
  q->live++;
  fn.s.inits++;
  fn.s.live_comms++;
  pthread_cond_broadcast(&fn.cv);
  *comm = c;
  if (group_depth > 0) {
    if (npending_init < MAX_RANKS) pending_init[npending_init++] = c;
    pthread_mutex_unlock(&fn.mu);
    return ncclSuccess;
  }
  if (!c->blocking) {
    bool done = q->joined == q->nranks;
    pthread_mutex_unlock(&fn.mu);
    return done ? ncclSuccess : ncclInProgress;
  }
  double deadline = now_s() + timeout_s();
  while (q->joined < q->nranks && !q->aborted)
    if (!nap(deadline)) break;
  r = q->joined == q->nranks ? ncclSuccess : ncclRemoteError;
  pthread_mutex_unlock(&fn.mu);
  if (r != ncclSuccess) snprintf(last_error, sizeof last_error, "fake nccl: init: peers missing");
  return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

/* Holding mu: c leaves its clique, which goes once empty. */
static void leave(struct ncclComm *c) {
  clique *q = c->q;
  q->comms[c->rank] = NULL;
  c->magic = 0;
  free(c);
  fn.s.live_comms--;
  if (--q->live > 0) return;
  while (q->rounds) round_free(q, q->rounds);
  while (q->msgs) {
    msg *m = q->msgs;
    q->msgs = m->next;
    free(m->data);
    free(m);
  }
  clique **pp = &fn.cliques;
  while (*pp != q) pp = &(*pp)->next;
  *pp = q->next;
  free(q);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == NULL || comm->magic != COMM_MAGIC)
    return bad(ncclInvalidArgument, "fake nccl: ncclCommDestroy: not a live communicator");
  pthread_mutex_lock(&fn.mu);
  fn.s.destroys++;
  leave(comm);
  pthread_cond_broadcast(&fn.cv);
  pthread_mutex_unlock(&fn.mu);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  if (comm->magic != COMM_MAGIC)
    return bad(ncclInvalidArgument, "fake nccl: ncclCommAbort: not a live communicator");
  pthread_mutex_lock(&fn.mu);
  fn.s.aborts++;
  comm->q->aborted = true;
  leave(comm);
  pthread_cond_broadcast(&fn.cv);
  pthread_mutex_unlock(&fn.mu);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async) {
  FAIL("ncclCommGetAsyncError");
  if (comm == NULL || comm->magic != COMM_MAGIC || async == NULL)
    return bad(ncclInvalidArgument, "fake nccl: ncclCommGetAsyncError: not a live communicator");
  pthread_mutex_lock(&fn.mu);
  clique *q = comm->q;
  if (comm->async != ncclSuccess)
    *async = comm->async;
  else if (q->aborted && q->joined < q->nranks)
    *async = ncclRemoteError;
  else
    *async = q->joined < q->nranks ? ncclInProgress : ncclSuccess;
  pthread_mutex_unlock(&fn.mu);
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  FAIL("ncclGroupStart");
  if (group_depth++ == 0) {
    pthread_mutex_lock(&fn.mu);
    fn.s.groups++;
    pthread_mutex_unlock(&fn.mu);
  }
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return bad(ncclInvalidUsage, "fake nccl: ncclGroupEnd without a start");
  if (--group_depth > 0) return ncclSuccess;
  size_t n = nqueue;
  nqueue = 0;
  int ninit = npending_init;
  npending_init = 0;
  if (failing("ncclGroupEnd")) {
    free(queue);
    queue = NULL;
    capqueue = 0;
    return fn.fail_with;
  }
  ncclResult_t r = n ? run_ops(queue, n) : ncclSuccess;
  free(queue); /* per group: a thread that ends leaves nothing behind */
  queue = NULL;
  capqueue = 0;
  if (r != ncclSuccess || ninit == 0) return r;
  /* The group's inits: blocking ones wait, nonblocking ones are in progress. */
  pthread_mutex_lock(&fn.mu);
  bool blocking = false, done = true;
  for (int i = 0; i < ninit; i++) {
    blocking |= pending_init[i]->blocking;
    done &= pending_init[i]->q->joined == pending_init[i]->q->nranks;
  }
  double deadline = now_s() + timeout_s();
  while (blocking && !done && nap(deadline)) {
    done = true;
    for (int i = 0; i < ninit; i++)
      done &= pending_init[i]->q->joined == pending_init[i]->q->nranks;
  }
  pthread_mutex_unlock(&fn.mu);
  if (done) return ncclSuccess;
  return blocking ? ncclRemoteError : ncclInProgress;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  FAIL("ncclAllReduce");
  fop o = {K_ALL_REDUCE, comm, sendbuff, recvbuff, count, datatype, op, 0, NULL};
  return submit(o, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  FAIL("ncclAllGather");
  fop o = {K_ALL_GATHER, comm, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, NULL};
  return submit(o, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  FAIL("ncclReduceScatter");
  fop o = {K_REDUCE_SCATTER, comm, sendbuff, recvbuff, recvcount, datatype, op, 0, NULL};
  return submit(o, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  FAIL("ncclBroadcast");
  fop o = {K_BROADCAST, comm, sendbuff, recvbuff, count, datatype, ncclSum, root, NULL};
  return submit(o, stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  FAIL("ncclSend");
  fop o = {K_SEND, comm, sendbuff, NULL, count, datatype, ncclSum, peer, NULL};
  return submit(o, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  FAIL("ncclRecv");
  fop o = {K_RECV, comm, NULL, recvbuff, count, datatype, ncclSum, peer, NULL};
  return submit(o, stream);
}
