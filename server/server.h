/* kilnd internals shared by the server's files.
 *
 * Threads and hand-offs:
 * - cq threads (--cq-threads) wait on the one gRPC completion queue. Every
 *   completion is a kilnd_tag whose callback runs on that thread: a new call
 *   goes through the RPC table's single validation point (rpc_table.c) and
 *   then to its handler; cheap handlers (Stats, ReleaseBuffers, health) answer
 *   right there.
 * - the libuv loop (main thread, loop.c) owns signals, the housekeeping
 *   timer, the /metrics HTTP endpoint and the compile thread pool. cq threads
 *   hand it work through a locked list plus uv_async_send (kilnd_loop_post).
 * - compile pool threads (libuv's pool, sized by --compile-threads) parse,
 *   verify, transform and compile, then reply.
 * - device workers (executor/scheduler.c, one per device) run executions in
 *   per-client fair order and reply.
 * A reply is sent from whichever thread finishes (grpc_call_start_batch is
 * thread-safe); a call never has two batches of the same direction in flight.
 */
#ifndef KILN_SERVER_SERVER_H
#define KILN_SERVER_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "common/status.h"
#include "compiler/ir/proto_internal.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/log.h"

typedef struct kilnd kilnd;
typedef struct kilnd_call kilnd_call;
typedef struct kilnd_method kilnd_method;
typedef struct kilnd_exe kilnd_exe;
typedef struct kilnd_exes kilnd_exes;
typedef struct kilnd_memo kilnd_memo;
typedef struct kilnd_metrics kilnd_metrics;
typedef struct kilnd_loop kilnd_loop;
typedef struct kiln_sched kiln_sched;
typedef struct kiln_buffer_store kiln_buffer_store;
typedef struct kiln_backend kiln_backend;
typedef struct kiln_device kiln_device;
typedef struct kiln_cache kiln_cache;

/* ---- completion-queue tags ------------------------------------------------------------ */

typedef struct kilnd_tag kilnd_tag;
typedef void (*kilnd_tag_fn)(kilnd_tag *tag, bool ok);
struct kilnd_tag {
  kilnd_tag_fn fn;
};

/* ---- the method table (rpc_table.c) ---------------------------------------------------- */

typedef enum kilnd_method_id {
  KILND_M_COMPILE,
  KILND_M_EXECUTE,
  KILND_M_PUT_BUFFER,
  KILND_M_GET_BUFFER,
  KILND_M_RELEASE_BUFFERS,
  KILND_M_STATS,
  KILND_M_HEALTH_CHECK,
  KILND_M_CACHE_LIST,
  KILND_M_CACHE_EVICT,
  KILND_M_COMPILE_STREAM,
  KILND_M_CACHE_EXPORT,
  KILND_M_CACHE_IMPORT,
  KILND_M_REGISTER_KERNEL,
  KILND_M_COUNT,
  KILND_M_UNKNOWN = KILND_M_COUNT, /* unregistered paths, for metrics */
} kilnd_method_id;

typedef enum kilnd_rpc_kind {
  KILND_UNARY,         /* one request message, one reply */
  KILND_CLIENT_STREAM, /* messages until half-close, one reply */
  KILND_SERVER_STREAM, /* one request message, a stream of replies */
} kilnd_rpc_kind;

/* Called after validation with the unpacked request (NULL for client
 * streams, which receive their own messages). The handler owns the reply:
 * it must eventually call kilnd_call_finish (or, for streams, start the
 * batches that lead to it). */
typedef void (*kilnd_handler_fn)(kilnd_call *c, ProtobufCMessage *req);

struct kilnd_method {
  kilnd_method_id id;
  const char *path; /* "/kiln.v1.Kiln/Compile" */
  const char *name; /* metrics label: "Compile" */
  kilnd_rpc_kind kind;
  const ProtobufCMessageDescriptor *request; /* for client streams: each message */
  kilnd_handler_fn handler;
};

/* The table, indexed by kilnd_method_id. */
const kilnd_method *kilnd_methods(void);
const char *kilnd_method_name(kilnd_method_id id); /* "unknown" for KILND_M_UNKNOWN */

/* ---- calls (call.c) -------------------------------------------------------------------- */

#define KILND_CLIENT_MAX 128 /* bytes of a kiln-client identity */
#define KILND_DEBUG_MAX 4096 /* bytes of the kiln-debug trailer */

struct kilnd_call {
  kilnd *srv;
  const kilnd_method *method; /* NULL for an unregistered method */
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload; /* unary request (registered) */
  grpc_call_details details; /* unregistered calls only */
  int64_t deadline_ns;       /* kiln_sched_now_ns clock; 0: none */
  int64_t start_ns;
  char client[KILND_CLIENT_MAX + 1];
  kilnd_role role; /* from the token (auth.h); OPEN without tokens */
  /* For the request log line (log.h): the id also sent as the trailing
   * metadata kiln-request-id, and what Compile and Execute found. */
  char request_id[17];
  const char *log_cache;    /* static: "memory", ..., "compiled"; NULL: none */
  char log_key[65];         /* the executable key, "" when none */
  grpc_metadata trailer[2]; /* kiln-request-id, then kiln-debug when there is any */
  /* kiln.debug_print output of an Execute, sent as the trailing metadata
   * kiln-debug: messages joined by the two characters "\n", cut at
   * KILND_DEBUG_MAX bytes with "..." (handlers_execute.c). debug_lock
   * guards it (the ranks of a mesh run print from their own threads). */
  char debug[KILND_DEBUG_MAX + 1];
  size_t ndebug;
  atomic_int debug_lock;

  atomic_int refs;      /* the handler (until its last batch) + the close tag */
  atomic_int cancelled; /* the caller went away (RECV_CLOSE_ON_SERVER said so) */
  int close_cancelled;  /* written by gRPC for RECV_CLOSE_ON_SERVER */
  bool close_watched;   /* RECV_CLOSE_ON_SERVER started (own batch or the final one) */
  bool close_in_final;  /* ... as part of the final status batch */
  kilnd_tag new_tag, close_tag, send_tag, stream_tag;

  bool md_sent;          /* initial metadata went out (server streams) */
  grpc_status_code code; /* of the reply, for metrics */
  grpc_slice details_slice;
  bool details_set;
  grpc_byte_buffer *reply;
  grpc_byte_buffer *recv_buf; /* client streams: the message received */

  /* The unpacked request and the allocator it came from. */
  ProtobufCMessage *req;
  kiln__proto_alloc req_alloc;

  /* Handler state, freed with the call. */
  void *state;
  void (*state_free)(kilnd_call *c);

  bool working; /* counted in kilnd.working */

  /* Buffer handles this call created: released if the caller went away
   * before receiving them. */
  char (*created)[33];
  uint32_t ncreated;
};

/* Requests the next call of method m (or, with m NULL, an unregistered one)
 * from the server. False once the server is shutting down, or when out of
 * memory (then the request is owed and kilnd_call_repay retries it). */
bool kilnd_call_request(kilnd *srv, const kilnd_method *m);
/* Loop thread: requests again the calls owed after allocation failures. */
void kilnd_call_repay(kilnd *srv);

/* Sends the final status, with `msg` (a protobuf-c message, may be NULL) as
 * the one message when code is OK. `rc`/`st` give the status: rc 0 is OK;
 * otherwise kilnd_status_code(rc) and st's text. Consumes the handler's
 * reference. */
void kilnd_call_finish(kilnd_call *c, const ProtobufCMessage *msg, int rc, const kiln_status *st);
/* Same with a code and text given directly. */
void kilnd_call_fail(kilnd_call *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Streams: one send-only batch with `msg` (initial metadata first time);
 * `done` runs on a cq thread when it completed. */
int kilnd_call_send_message(kilnd_call *c, const ProtobufCMessage *msg, kilnd_tag_fn done);
/* Streams: one receive batch; `done` runs with c->recv_buf (NULL at the
 * end of the stream). */
int kilnd_call_recv_message(kilnd_call *c, kilnd_tag_fn done);

/* Remembers a handle the call created (see kilnd_call.created). */
void kilnd_call_note_created(kilnd_call *c, const char *handle);

/* Drops the handler's reference without a reply (the call is dead). */
void kilnd_call_abandon(kilnd_call *c);

/* Starts watching for the caller going away (c->cancelled), once. Every
 * call is watched from its arrival except Execute, whose handler starts the
 * watch once the request resolved, before it runs (on a device worker or on
 * the cq thread): a call refused at once learns it with its final batch
 * instead, one batch and one completion fewer. Call before handing the call
 * to another thread. */
void kilnd_call_watch_close(kilnd_call *c);

/* True once the deadline has passed or the caller went away; fills rc. */
bool kilnd_call_expired(kilnd_call *c, int *rc);
/* Seconds left before the deadline (capped at `cap`; cap when none). */
double kilnd_call_time_left(const kilnd_call *c, double cap);

#define KILND_CALL_FROM_TAG(tag, member) \
  ((kilnd_call *)((char *)(tag)-offsetof(kilnd_call, member)))

/* The one mapping from KILN_E* codes to gRPC status codes. */
grpc_status_code kilnd_status_code(int rc);

/* The validation point: identity, deadline, payload, wire check and unpack,
 * then the method's handler (rpc_table.c). */
void kilnd_rpc_dispatch(kilnd_call *c);
/* Reads a byte buffer, checks it as `desc` and unpacks it with the call's
 * bounded allocator into *out (free with kilnd_call_free_message). */
int kilnd_rpc_unpack(kilnd_call *c, grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                     ProtobufCMessage **out, kiln_status *st);
void kilnd_call_free_message(kilnd_call *c, ProtobufCMessage *msg);

/* ---- the server ------------------------------------------------------------------------ */

/* Device classes of the scheduler, one per backend the server runs on
 * (kilnd_class_backend). */
enum { KILND_CLASS_CPU = 0, KILND_CLASS_INTERP = 1 };

struct kilnd {
  kilnd_config cfg;
  grpc_server *server;
  grpc_completion_queue *cq;
  void *registered[KILND_M_COUNT]; /* grpc_server_register_method handles */
  kilnd_loop *loop;
  void *http; /* the /metrics endpoint (http.c) */
  kilnd_metrics *metrics;
  kiln_sched *sched;
  kiln_buffer_store *buffers;
  kilnd_exes *exes;
  kiln_backend *cpu;     /* NULL when the build has no CPU compiler */
  kiln_backend *interp;  /* runs the modules of KILND_CLASS_INTERP */
  uint32_t cuda_devices; /* GPUs the CUDA driver sees (0 without one) */
  kiln_backend *cuda;    /* runs cubin executables; NULL without a GPU */
  char cuda_why[256];    /* why there are none, for Execute's refusal */
  kilnd_memo *memo;      /* Compile requests answered before (compile_memo.h) */
  kiln_cache *cache;     /* the executable cache's tiers (cache/cache.h) */
  /* Kernels clients registered (compiler/codegen/user_kernel.h); NULL
   * unless --allow-user-kernels. */
  struct kiln_user_kernels *user_kernels;
  /* --mesh-name's GPU mesh across hosts (server/mesh.h); NULL: none. */
  struct kilnd_mesh *mesh;
  kilnd_auth *auth;                /* TLS, tokens, health port (auth.h) */
  atomic_bool draining;            /* SIGTERM seen: health says NOT_SERVING */
  _Atomic int64_t refuse_after_ns; /* draining: new work refused from then on */
  atomic_bool shutdown;            /* grpc_server_shutdown_and_notify called */
  atomic_bool grpc_down;           /* its shutdown tag completed */
  atomic_bool abandoned;           /* exiting with executions still running */
  atomic_int inflight;             /* calls arrived and not yet freed */
  atomic_int working;              /* of those, calls past validation (not refused) */
  atomic_int requested;            /* requested calls not yet completed */
  atomic_int compiles;             /* compiles queued or running */
  int64_t start_ns;
  kilnd_tag shutdown_tag;
  /* Requests that could not be renewed (out of memory), per method and one
   * for unregistered calls: the loop's tick requests them again, so that a
   * passing allocation failure does not leave a method fewer calls. */
  atomic_int owed[KILND_M_COUNT + 1];
};

/* The backend that runs the work of device class `dev_class`; a run asks it
 * what it runs (kiln_backend_runs_modules), not its name. */
static inline kiln_backend *kilnd_class_backend(const kilnd *srv, int dev_class) {
  return dev_class == KILND_CLASS_INTERP ? srv->interp : srv->cpu;
}

/* The device whose memory holds the arrays stored for server device id
 * `device` (handlers_buffers.c): the cpu device of a cpu id, host memory
 * for the interpreter's. */
kiln_device *kilnd_buffer_home(kilnd *srv, int32_t device);
/* Releases the buffers of clients whose lease (--buffer-lease-seconds)
 * ran out; called from the loop's tick, does the work at most once a second. */
void kilnd_buffers_expire(kilnd *srv);

/* Handlers (handlers_*.c, health.c). */
void kilnd_handle_compile(kilnd_call *c, ProtobufCMessage *req);
void kilnd_handle_execute(kilnd_call *c, ProtobufCMessage *req);
void kilnd_handle_put_buffer(kilnd_call *c, ProtobufCMessage *req);
void kilnd_handle_get_buffer(kilnd_call *c, ProtobufCMessage *req);
void kilnd_handle_release_buffers(kilnd_call *c, ProtobufCMessage *req);
void kilnd_handle_stats(kilnd_call *c, ProtobufCMessage *req);
void kilnd_handle_health_check(kilnd_call *c, ProtobufCMessage *req);
void kilnd_handle_cache_list(kilnd_call *c, ProtobufCMessage *req);
void kilnd_handle_cache_evict(kilnd_call *c, ProtobufCMessage *req);
void kilnd_handle_cache_export(kilnd_call *c, ProtobufCMessage *req);
void kilnd_handle_cache_import(kilnd_call *c, ProtobufCMessage *req);
void kilnd_handle_register_kernel(kilnd_call *c, ProtobufCMessage *req);
/* RegisterKernel's pool job (handlers_kernels.c). */
void kilnd_kernel_work(kilnd_call *c);

/* Compile's pool job, run by the loop's thread pool (handlers_compile.c).
 * CacheList and CacheEvict share the pool: their jobs arrive here too and
 * go on to kilnd_cache_work (handlers_cache.c). */
void kilnd_compile_work(kilnd_call *c);
/* Queues c for the compile pool under --compile-queue-depth (Compile,
 * CacheList and CacheEvict share the bound), or answers RESOURCE_EXHAUSTED
 * or UNAVAILABLE (draining). */
void kilnd_compile_submit(kilnd_call *c);
void kilnd_cache_work(kilnd_call *c);

/* ---- the loop (loop.c) ----------------------------------------------------------------- */

typedef void (*kilnd_post_fn)(kilnd *srv, void *arg);

int kilnd_loop_create(kilnd *srv, kiln_status *st);
/* Runs until the server has shut down and every handle is closed. */
void kilnd_loop_run(kilnd *srv);
void kilnd_loop_destroy(kilnd *srv);
void *kilnd_loop_uv(kilnd *srv); /* the uv_loop_t */
/* From any thread: runs fn(srv, arg) on the loop thread. False when the
 * loop has closed (fn is not called). */
bool kilnd_loop_post(kilnd *srv, kilnd_post_fn fn, void *arg);
/* From any thread: runs kilnd_compile_work(c) on the compile pool. */
int kilnd_loop_queue_compile(kilnd *srv, kilnd_call *c); /* 0, KILN_ENOMEM or KILN_EUNAVAIL */
/* From a cq thread: the server's shutdown tag completed. */
void kilnd_loop_server_down(kilnd *srv);

/* ---- metrics (metrics.c) --------------------------------------------------------------- */

int kilnd_metrics_create(kilnd *srv, kiln_status *st);
void kilnd_metrics_destroy(kilnd *srv);
void kilnd_metrics_request(kilnd *srv, kilnd_method_id m, grpc_status_code code, int64_t ns);
/* A Compile answered: its Kiln__V1__CacheSource, and whether the
 * loaded-executable table had it. */
void kilnd_metrics_compile(kilnd *srv, int64_t ns, int cache_source, bool from_table);
void kilnd_metrics_execute(kilnd *srv, int64_t run_ns, int64_t queue_ns);
/* The Prometheus text exposition; kiln_malloc'd. */
char *kilnd_metrics_render(kilnd *srv, size_t *len);
/* Counters as (name, label name, label value, value) rows for Stats. */
typedef void (*kilnd_counter_fn)(void *arg, const char *name, const char *l1, const char *v1,
                                 const char *l2, const char *v2, int64_t value);
void kilnd_metrics_each_counter(kilnd *srv, kilnd_counter_fn fn, void *arg);
uint64_t kilnd_metrics_total(kilnd *srv, const char *what); /* "compiles", "cache_hits", ... */

/* HTTP endpoint on the loop (metrics_http.c). */
int kilnd_http_start(kilnd *srv, void *uv_loop, kiln_status *st);
void kilnd_http_close(kilnd *srv);

#endif /* KILN_SERVER_SERVER_H */
