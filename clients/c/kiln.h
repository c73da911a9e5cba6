/* libkiln: the C client of a Kiln server (the kiln.v1.Kiln gRPC service).
 *
 * A kiln_client is one connection to one server (`kilnd --listen HOST:PORT`).
 * Through it a program compiles a module once (from HLO text, from a
 * serialized kiln.v1.Module, from a kiln_module, or from one put together
 * with the small kiln_builder API below), then executes it many times with
 * arguments given inline or as handles of buffers kept on the server, and
 * may keep outputs on the server for the next step. Buffers of any size
 * move as streams of chunks, so no single message nears gRPC's limits.
 *
 * Conventions (those of the rest of Kiln):
 * - Every call returns 0 or a negative KILN_E* code and, on failure, fills
 *   the kiln_status it is given (which may be NULL) unless it already holds
 *   an error: st->where is the gRPC status code name ("NOT_FOUND",
 *   "INVALID_ARGUMENT", "UNAVAILABLE", ...), st->msg the server's message
 *   (or the client's own, for errors found before anything was sent).
 *   kiln_rpc_status_code() turns st back into the numeric gRPC code. The
 *   return code follows from the gRPC code: INVALID_ARGUMENT (and
 *   FAILED_PRECONDITION, OUT_OF_RANGE, ALREADY_EXISTS, PERMISSION_DENIED,
 *   UNAUTHENTICATED) -> KILN_EINVAL, NOT_FOUND -> KILN_ENOTFOUND,
 *   RESOURCE_EXHAUSTED -> KILN_ELIMIT (KILN_ENOMEM when the client itself ran
 *   out of memory), UNIMPLEMENTED -> KILN_EUNIMPL, DEADLINE_EXCEEDED ->
 *   KILN_EDEADLINE, UNAVAILABLE -> KILN_EUNAVAIL, CANCELLED ->
 *   KILN_ECANCELED, ABORTED -> KILN_EIO, anything else -> KILN_EINTERNAL.
 * - Whatever a call returns through an out-parameter belongs to the caller
 *   and has one matching free function, named next to it. Nothing is
 *   returned on failure (out-parameters are zeroed or NULL).
 * - A kiln_client may be used by several threads at once: each call has its
 *   own completion queue and the connection is shared.
 * - Literals (kiln_literal, compiler/ir/ir.h) are the values: arrays in
 *   row-major order, little-endian, kiln_dtype_size() bytes per element, or
 *   tuples of them. Create them with kiln_literal_create(NULL, ...) or
 *   kiln_literal_parse_text("f32[2] {1, 2}", ...), print them with
 *   kiln_literal_print (compiler/ir/text.h), free them with
 *   kiln_literal_destroy().
 * - libkiln's own types are named for where their object lives:
 *   kiln_remote_* (executables, buffers, arguments and results of the
 *   server) and kiln_server_* (its statistics), apart from the in-process
 *   compiler's kiln_executable and kiln_compile_options.
 *
 * Linking: `pkg-config --cflags --libs kiln` (the header is installed as
 * <kiln.h>, with the IR headers it includes beside it).
 */
#ifndef KILN_CLIENTS_C_KILN_H
#define KILN_CLIENTS_C_KILN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/alloc.h"
#include "common/status.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/text.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ----------------------------------------------------------------- */

/* gRPC status codes: X(NAME, value). */
#define KILN_RPC_CODE_MAP(X) \
  X(OK, 0) \
  X(CANCELLED, 1) \
  X(UNKNOWN, 2) \
  X(INVALID_ARGUMENT, 3) \
  X(DEADLINE_EXCEEDED, 4) \
  X(NOT_FOUND, 5) \
  X(ALREADY_EXISTS, 6) \
  X(PERMISSION_DENIED, 7) \
  X(RESOURCE_EXHAUSTED, 8) \
  X(FAILED_PRECONDITION, 9) \
  X(ABORTED, 10) \
  X(OUT_OF_RANGE, 11) \
  X(UNIMPLEMENTED, 12) \
  X(INTERNAL, 13) \
  X(UNAVAILABLE, 14) \
  X(DATA_LOSS, 15) \
  X(UNAUTHENTICATED, 16)

typedef enum kiln_rpc_code {
#define KILN_X_(name, val) KILN_RPC_##name = val,
  KILN_RPC_CODE_MAP(KILN_X_)
#undef KILN_X_
} kiln_rpc_code;

/* "NOT_FOUND"; "UNKNOWN" for values outside the map. Never NULL. */
const char *kiln_rpc_code_name(kiln_rpc_code code);
/* The gRPC code recorded in st by a libkiln call: KILN_RPC_OK when st holds
 * no error (or st is NULL), KILN_RPC_UNKNOWN when st holds an error that
 * names no gRPC code. */
kiln_rpc_code kiln_rpc_status_code(const kiln_status *st);

/* ---- connecting --------------------------------------------------------------- */

typedef struct kiln_client kiln_client;

typedef struct kiln_client_options {
  /* Sent with every call as the "kiln-client" metadata value: the server
   * owns buffers and queues per client id. NULL: "libkiln-PID-N", unique
   * per kiln_client in this process. Two clients that give the same id
   * share buffers. */
  const char *client_id;
  /* Deadline of each call that does not give its own, in milliseconds.
   * 0: 300000 (five minutes); negative: none. */
  int64_t deadline_ms;
  /* How long kiln_client_connect waits for the connection to be ready.
   * 0: 10000; negative: do not wait (the first call connects). */
  int64_t connect_timeout_ms;
  /* Largest single message the client accepts from the server (unary
   * replies, each chunk of a GetBuffer stream). 0: 64 MiB. */
  int64_t max_receive_bytes;
  /* Data bytes per PutBuffer message, and the chunk size asked of the
   * server by GetBuffer. 0: 1 MiB. Must stay under the server's receive
   * limit (4 MiB by default). */
  int64_t chunk_bytes;
  /* Fields below were added later; a zeroed options struct keeps the old
   * behaviour (plaintext, no token). */
  /* TLS: a PEM file of the CA certificates that sign the server's
   * certificate. NULL and `tls` false: plaintext. NULL and `tls` true:
   * gRPC's default roots. */
  const char *tls_ca_file;
  /* Mutual TLS: this client's PEM certificate chain and private key (both
   * or neither). */
  const char *tls_cert_file;
  const char *tls_key_file;
  /* Bearer token, sent as "authorization: Bearer TOKEN" with every call
   * (printable ASCII without spaces). NULL: none. On a server with
   * --tokens the token, not client_id, says who the client is. */
  const char *token;
  /* TLS even without tls_ca_file. */
  bool tls;
  /* Lease keep-alive. kilnd releases the buffers of a client id that made
   * no call for its --buffer-lease-seconds (600 by default; Stats reports
   * it as the counter kiln_buffer_lease_ms), so that a client that died
   * leaks nothing; every call renews the lease. > 0: a background thread
   * renews it (as kiln_client_renew_leases does) whenever this many
   * milliseconds passed without a call, so a client that is idle for
   * longer than the lease (a long computation of its own, a pause between
   * jobs) keeps its buffers; choose at most a quarter of the lease. 0: no
   * thread; the client renews by making calls. Negative is an error. */
  int64_t lease_keepalive_ms;
} kiln_client_options;

/* Connects to `target` ("HOST:PORT", "[::1]:PORT", "unix:PATH": any gRPC
 * target). `opts` may be NULL. Unless opts->connect_timeout_ms is negative,
 * waits until the connection is ready and fails with UNAVAILABLE when the
 * server cannot be reached in time. *out is closed with kiln_client_close. */
int kiln_client_connect(const char *target, const kiln_client_options *opts, kiln_client **out,
                        kiln_status *st);
/* Closes the connection. Calls must not be in flight. NULL is a no-op. */
void kiln_client_close(kiln_client *c);
/* The client id sent as "kiln-client" (owned by c). */
const char *kiln_client_id(const kiln_client *c);

/* Renews the lease on every buffer of this client's id (see
 * lease_keepalive_ms above) with a call that does nothing else (an empty
 * ReleaseBuffers). Any other call renews it too; this is for a client that
 * has nothing else to send. Thread-safe like every call. */
int kiln_client_renew_leases(kiln_client *c, kiln_status *st);
/* How many renewals the keep-alive thread has sent (0 without one). */
uint64_t kiln_client_lease_renewals(const kiln_client *c);

/* Asks the standard grpc.health.v1.Health service about `service` ("" or
 * NULL: the server as a whole). *serving is true for SERVING. */
int kiln_client_health(kiln_client *c, const char *service, bool *serving, kiln_status *st);

/* ---- compiling ---------------------------------------------------------------- */

typedef enum kiln_remote_cache_policy {
  KILN_REMOTE_CACHE_DEFAULT = 0, /* read through every tier, write the result to every tier */
  KILN_REMOTE_CACHE_REFRESH = 1, /* compile even when cached, overwrite the entry */
  KILN_REMOTE_CACHE_BYPASS = 2,  /* neither read nor write the cache */
} kiln_remote_cache_policy;

/* Where an executable came from (kiln.v1.CacheSource). */
typedef enum kiln_remote_source {
  KILN_REMOTE_SOURCE_UNSPECIFIED = 0,
  KILN_REMOTE_SOURCE_COMPILED = 1,
  KILN_REMOTE_SOURCE_MEMORY = 2,
  KILN_REMOTE_SOURCE_DISK = 3,
  KILN_REMOTE_SOURCE_SHARED = 4,
  KILN_REMOTE_SOURCE_SINGLE_FLIGHT = 5,
} kiln_remote_source;

/* "compiled", "memory", "disk", "shared", "single-flight", "unspecified". */
const char *kiln_remote_source_name(kiln_remote_source s);

/* The phases of a compile on the server (kiln.v1.CompilePhase), in the
 * order they can happen; a cache hit goes from LOADING to DONE. */
typedef enum kiln_remote_phase {
  KILN_REMOTE_PHASE_UNSPECIFIED = 0,
  KILN_REMOTE_PHASE_QUEUED = 1,  /* waiting for a compile thread */
  KILN_REMOTE_PHASE_LOADING = 2, /* parse, verify, transforms, cache lookup */
  KILN_REMOTE_PHASE_WAITING = 3, /* for another build of the same key (detail: whose) */
  KILN_REMOTE_PHASE_PASSES = 4,  /* optimization passes and code generation */
  KILN_REMOTE_PHASE_CC = 5,      /* the C compiler (or NVRTC) */
  KILN_REMOTE_PHASE_STORING = 6, /* serializing and storing in the cache */
  KILN_REMOTE_PHASE_DONE = 7,
} kiln_remote_phase;

/* "queued", "loading", "waiting", "passes", "cc", "storing", "done",
 * "unspecified". */
const char *kiln_remote_phase_name(kiln_remote_phase p);

typedef struct kiln_remote_progress {
  kiln_remote_phase phase;
  int64_t elapsed_ns; /* since the call reached the server */
  const char *detail; /* "another server's build", ...; "" when none; valid during the call */
} kiln_remote_progress;

typedef struct kiln_remote_compile_options {
  const char *backend;  /* "cpu", "cuda", "interp"; NULL: the server's default */
  const char *target;   /* "x86-64-v3", "native", "sm_90"; NULL: the server's devices */
  int32_t device_count; /* 0: 1, or the module's num_partitions */
  /* Function transforms, innermost first, as specs: "grad", "grad:wrt=0,1",
   * "grad:output=1", "vjp", "jvp:wrt=1", "vmap", "vmap:in_axes=0,none,size=8",
   * "checkpoint" (the spec syntax of compiler/transforms/transform.h, with
   * the meaning `kiln run --transform` gives it: grad returns the value
   * first, then the gradients). */
  const char *const *transforms;
  uint32_t ntransforms;
  /* 0: verify and compile only, no optimization passes; 1: cheap
   * simplifications; 2: everything; 3: also aggressive fusion. Used only
   * when has_optimization_level (otherwise the server uses 2). */
  bool has_optimization_level;
  int32_t optimization_level;
  kiln_remote_cache_policy cache_policy;
  bool return_executable; /* fill kiln_remote_executable.serialized */
  int64_t deadline_ms;    /* 0: the client's default; negative: none */
  const char *request_id; /* echoed back and logged by the server; NULL: none */
  /* Appended (ABI): the shapes of the arguments the program will be executed with, in
   * parameter order (may be fewer than the parameters, or none): a vmap
   * without size=N takes its batch size from them, as `kiln run` does from
   * its --arg values. NULL: such a vmap needs size=N (the server says so);
   * non-NULL with narg_shapes 0: inferring from no arguments fails here. */
  const kiln_shape *const *arg_shapes;
  uint32_t narg_shapes;
  /* Appended (ABI): told of each phase of the compile as the server enters
   * it, on the calling thread, before kiln_client_compile_* returns (the
   * last is KILN_REMOTE_PHASE_DONE, when the compile succeeded). Non-NULL:
   * the compile goes through the CompileStream RPC; against a server
   * without it (UNIMPLEMENTED before any phase) it falls back to Compile
   * and the callback is not called. */
  struct kiln_remote_progress_cb {
    void (*fn)(void *arg, const struct kiln_remote_progress *p);
    void *arg;
  } progress;
  /* Appended (ABI): the most bytes of temporaries the program may hold
   * live at once (kiln_remote_executable.peak_bytes); over it the server's
   * compiler recomputes values instead of keeping them (rematerialization),
   * and a budget it cannot reach fails with RESOURCE_EXHAUSTED naming the
   * smallest peak it reached. 0: no budget. */
  uint64_t memory_budget_bytes;
  /* Appended (ABI): the device mesh of an SPMD program (device_count > 1):
   * its product must be device_count; for a per-device program [R, P] are
   * its replicas and partitions (CompileOptions.mesh_shape). NULL: 1-D. */
  const int64_t *mesh_shape;
  uint32_t nmesh_shape;
} kiln_remote_compile_options;

/* One input of a cache key and its SHA-256 (64 lowercase hex digits):
 * "module", "signature", "options", "target", "version", in that order.
 * Two keys differ exactly where their components do. */
typedef struct kiln_remote_key_component {
  const char *name;
  const char *digest;
} kiln_remote_key_component;

typedef struct kiln_remote_executable {
  char *id; /* executable_id, for kiln_client_execute */
  uint32_t nparams;
  kiln_shape *params; /* the calling convention, after transforms */
  kiln_shape result;  /* dtype KILN_INVALID when the server sent none */
  uint32_t noutputs;  /* outputs of Execute: tuple elements, or 1 */
  kiln_remote_source cache_source;
  char *cache_key;          /* lowercase hex SHA-256; "" when not sent */
  uint32_t nkey_components; /* 5 from a current server; 0 when not sent */
  kiln_remote_key_component *key_components;
  int64_t compile_wall_ns;
  int64_t peak_bytes;
  int32_t device_count;
  uint32_t nwarnings;
  char **warnings;
  uint8_t *serialized; /* with return_executable; else NULL */
  size_t serialized_len;
  kiln_arena *arena; /* owns everything above */
  /* Appended (ABI): an SPMD program's mesh (device_count = replicas x
   * partitions). per_device: arguments and outputs go per device (Execute
   * takes nparams, or device_count x nparams arguments grouped by device,
   * and returns device_count x noutputs outputs grouped by device); else a
   * program on several devices takes and returns global arrays. */
  bool per_device;
  int32_t replica_count, num_partitions;
} kiln_remote_executable;

/* The server's id of the last call this thread finished through any
 * client (its trailing metadata kiln-request-id: the request_id of the
 * call's line in the server's log), failed calls included; "" when the
 * server sent none. Valid until this thread's next call. */
const char *kiln_client_last_request_id(void);

/* The kiln.debug_print output of the last call this thread finished (its
 * trailing metadata kiln-debug, with the "\n" separators the server
 * writes turned back into newlines); "" when there was none. Valid until
 * this thread's next call. */
const char *kiln_client_last_debug(void);

/* Compiles HLO text (len bytes; need not be NUL-terminated). `opts` may be
 * NULL. *out is freed with kiln_remote_executable_free. */
int kiln_client_compile_text(kiln_client *c, const char *text, size_t len,
                             const kiln_remote_compile_options *opts, kiln_remote_executable **out,
                             kiln_status *st);
/* Compiles a serialized kiln.v1.Module (sent as it is). */
int kiln_client_compile_proto(kiln_client *c, const uint8_t *module, size_t len,
                              const kiln_remote_compile_options *opts, kiln_remote_executable **out,
                              kiln_status *st);
/* Compiles a module (encoded with the proto codec, not modified). */
int kiln_client_compile_module(kiln_client *c, const kiln_module *m,
                               const kiln_remote_compile_options *opts,
                               kiln_remote_executable **out, kiln_status *st);
void kiln_remote_executable_free(kiln_remote_executable *e);

/* ---- buffers on the server ------------------------------------------------------ */

typedef struct kiln_remote_buffer {
  char *handle;     /* opaque, unique on the server while the buffer lives */
  kiln_shape shape; /* an array shape */
  int64_t size_bytes;
  int32_t device;
  kiln_arena *arena; /* owns handle and shape */
} kiln_remote_buffer;

/* Frees what `b` holds and zeroes it. */
void kiln_remote_buffer_clear(kiln_remote_buffer *b);

typedef struct kiln_remote_put_options {
  int32_t device;      /* device to place it on; 0 is the first */
  const char *label;   /* shown in the server's stats and logs; NULL: none */
  int64_t deadline_ms; /* 0: the client's default; negative: none */
} kiln_remote_put_options;

/* Uploads an array literal (no tuples) as a server-resident buffer.
 * `opts` may be NULL. On success *out describes the new buffer. */
int kiln_client_put_buffer(kiln_client *c, const kiln_literal *value,
                           const kiln_remote_put_options *opts, kiln_remote_buffer *out,
                           kiln_status *st);
/* The same from raw bytes: `nbytes` must be exactly kiln_shape_bytes(shape),
 * in the layout of kiln_literal data. */
int kiln_client_put_buffer_raw(kiln_client *c, const kiln_shape *shape, const void *data,
                               size_t nbytes, const kiln_remote_put_options *opts,
                               kiln_remote_buffer *out, kiln_status *st);

typedef struct kiln_remote_get_options {
  bool release;        /* release the buffer once it has been sent */
  int64_t chunk_bytes; /* bytes per chunk to ask for; 0: the client's chunk_bytes */
  int64_t deadline_ms; /* 0: the client's default; negative: none */
} kiln_remote_get_options;

/* Downloads a buffer as a new heap literal (free with kiln_literal_destroy).
 * `opts` may be NULL. */
int kiln_client_get_buffer(kiln_client *c, const char *handle, const kiln_remote_get_options *opts,
                           kiln_literal **out, kiln_status *st);
/* Downloads a buffer into dst (cap bytes; KILN_ELIMIT, nothing kept, when
 * the buffer is larger). *nbytes is the size received; `info` (may be NULL)
 * describes the buffer (free with kiln_remote_buffer_clear). */
int kiln_client_get_buffer_raw(kiln_client *c, const char *handle,
                               const kiln_remote_get_options *opts, void *dst, size_t cap,
                               size_t *nbytes, kiln_remote_buffer *info, kiln_status *st);

/* Frees buffers. Handles the server does not know are not an error: they
 * are counted in *unknown. `released` and `unknown` may be NULL. */
int kiln_client_release_buffers(kiln_client *c, const char *const *handles, uint32_t n,
                                int64_t *released, int64_t *unknown, kiln_status *st);

/* ---- executing ---------------------------------------------------------------- */

/* One argument: an inline literal, or the handle of a server buffer. */
typedef struct kiln_remote_arg {
  const kiln_literal *literal; /* inline value; NULL to use handle */
  const char *handle;          /* a buffer handle, when literal is NULL */
  /* handle only: the executable may reuse the buffer, which the server then
   * frees; the handle is invalid after the call, whatever its outcome. */
  bool donate;
} kiln_remote_arg;

typedef struct kiln_remote_execute_options {
  /* Per output, in order: keep it on the server and return a handle. A
   * shorter list (or NULL) returns the remaining outputs inline. */
  const bool *keep_on_server;
  uint32_t nkeep;
  int64_t deadline_ms;    /* 0: the client's default; negative: none */
  const char *request_id; /* NULL: none */
  /* Appended (ABI): the devices to run on, one per device of the program
   * (ExecuteRequest.device_ids); NULL: the server's scheduler chooses. */
  const int32_t *device_ids;
  uint32_t ndevice_ids;
} kiln_remote_execute_options;

typedef struct kiln_remote_output {
  kiln_literal *literal;     /* an inline output (owned by the result), or NULL */
  kiln_remote_buffer buffer; /* a kept output: buffer.handle != NULL */
} kiln_remote_output;

typedef struct kiln_remote_result {
  uint32_t noutputs;
  kiln_remote_output *outputs;
  /* The server's timing of the request, nanoseconds. */
  int64_t queue_ns, transfer_in_ns, run_ns, transfer_out_ns, total_ns;
  /* Appended (ABI): the devices it ran on (device K of an SPMD program on
   * device_ids[K]); owned by the result. */
  int32_t *device_ids;
  uint32_t ndevice_ids;
} kiln_remote_result;

/* Runs executable `id` once. `opts` may be NULL. On success *out holds one
 * output per element of a tuple result (or one); free with
 * kiln_remote_result_free. To keep an inline output beyond the result,
 * take its literal and set the slot to NULL. */
int kiln_client_execute(kiln_client *c, const char *id, const kiln_remote_arg *args, uint32_t nargs,
                        const kiln_remote_execute_options *opts, kiln_remote_result *out,
                        kiln_status *st);
void kiln_remote_result_free(kiln_remote_result *r);

/* ---- server statistics ------------------------------------------------------------ */

typedef struct kiln_server_counter {
  const char *name;   /* "kiln_cache_hits_total" */
  const char *labels; /* Prometheus style, "tier=\"disk\",..."; "" when none */
  int64_t value;
} kiln_server_counter;

typedef struct kiln_server_device {
  int32_t device;
  const char *backend;     /* "cpu", "cuda" */
  const char *description; /* "cpu:3" */
  int64_t memory_in_use_bytes, memory_limit_bytes;
  int64_t executions, busy_ns;
} kiln_server_device;

typedef struct kiln_server_stats {
  const char *server_version;
  int64_t uptime_ns;
  int64_t compiles, cache_hits, cache_misses, executions;
  int64_t live_buffers, live_buffer_bytes, queued_requests;
  uint32_t ncounters;
  kiln_server_counter *counters;
  uint32_t ndevices;
  kiln_server_device *devices;
  kiln_arena *arena; /* owns everything above */
} kiln_server_stats;

int kiln_client_stats(kiln_client *c, kiln_server_stats *out, kiln_status *st);
/* Frees what `s` holds and zeroes it. */
void kiln_server_stats_clear(kiln_server_stats *s);

/* One compile queued or running on the server. */
typedef struct kiln_server_active_compile {
  const char *request_id; /* the call's id in the server's log */
  const char *client;
  kiln_remote_phase phase;
  int64_t elapsed_ns; /* since the call reached the server */
} kiln_server_active_compile;

/* What a live view of the server shows besides kiln_server_stats (a
 * struct of its own, so kiln_server_stats keeps its size). A server that
 * predates these fields reports zeros. */
typedef struct kiln_server_activity {
  int64_t compiles_queued, compiles_running;            /* waiting for / holding a compile thread */
  int64_t compile_threads, compile_queue_depth;         /* the pool's size and the queue's bound */
  int64_t resident_bytes;                               /* the server process's resident memory */
  int64_t cache_memory_bytes, cache_memory_limit_bytes; /* the cache's memory tier */
  double cache_hit_rate; /* hits / (hits + misses) since the start, 0 to 1 */
  uint32_t ncompiles;
  kiln_server_active_compile *compiles; /* oldest first */
  kiln_arena *arena;                    /* owns everything above */
} kiln_server_activity;

/* Stats as kiln_client_stats gives them, and (activity non-NULL) the live
 * figures, from one call. Free both with their _clear functions. */
int kiln_client_stats_activity(kiln_client *c, kiln_server_stats *out,
                               kiln_server_activity *activity, kiln_status *st);
void kiln_server_activity_clear(kiln_server_activity *a);

/* ---- the server's executable cache --------------------------------------------------- */

/* One entry of the server's local cache tiers (CacheList). */
typedef struct kiln_server_cache_entry {
  const char *key; /* 64 lowercase hex digits: the executable id */
  uint32_t ntiers;
  const char **tiers; /* "memory", "disk" */
  int64_t bytes;
  int64_t compile_ns; /* what compiling it took: what a hit saves */
  int64_t created_unix_ms;
  uint32_t ncomponents;
  kiln_remote_key_component *components;
} kiln_server_cache_entry;

typedef struct kiln_server_cache_list {
  uint32_t nentries;
  kiln_server_cache_entry *entries;
  bool truncated;    /* the server holds more than it returned */
  kiln_arena *arena; /* owns everything above */
} kiln_server_cache_list;

/* Lists the entries of the server's memory and disk tiers: only `keys`
 * when nkeys > 0 (each 64 hex digits), at most `limit` (0: the server's
 * default, 1000; at most 100000). The server refuses a key that is not 64
 * hex digits with INVALID_ARGUMENT naming it ("keys[1]"). */
int kiln_client_cache_list(kiln_client *c, const char *const *keys, uint32_t nkeys, int32_t limit,
                           kiln_server_cache_list *out, kiln_status *st);
/* Frees what `l` holds and zeroes it. */
void kiln_server_cache_list_clear(kiln_server_cache_list *l);

/* Removes `keys` (or, with `all` and no keys, every entry; one or the
 * other, else INVALID_ARGUMENT) from the
 * server's memory and disk tiers and its table of loaded executables (those
 * no Execute is running), and from the shared Redis tier too when `shared`.
 * *evicted (may be NULL) counts removals summed over tiers and the table. */
int kiln_client_cache_evict(kiln_client *c, const char *const *keys, uint32_t nkeys, bool all,
                            bool shared, int64_t *evicted, kiln_status *st);

/* The entries of `keys` (every local entry when nkeys is 0) as one export
 * file signed with the server's cache secret: *file kiln_malloc'd (*len
 * bytes), *entries (may be NULL) how many it holds. Admin role. */
int kiln_client_cache_export(kiln_client *c, const char *const *keys, uint32_t nkeys,
                             uint8_t **file, size_t *len, int64_t *entries, kiln_status *st);

/* Stores the entries of an export file in the server's cache tiers. The
 * server refuses a file changed in any way or signed with another secret
 * (INVALID_ARGUMENT, nothing stored). Admin role. */
int kiln_client_cache_import(kiln_client *c, const uint8_t *file, size_t len, int64_t *imported,
                             kiln_status *st);

/* ---- user kernels ------------------------------------------------------------------ */

/* What RegisterKernel answered. */
typedef struct kiln_remote_kernel {
  char digest[65];      /* hex SHA-256 of the source */
  bool cached;          /* the server had compiled this source before */
  char cuda_check[256]; /* "", "ok" or "skipped: why" */
} kiln_remote_kernel;

/* Registers C source (NUL-terminated) as kernel `name` with `signature`
 * ("f32[N], f32[N] -> f32[N]" or "...; grid=B"; docs/toolbox.md) for
 * custom calls of target "kiln.user.NAME". cuda_source may be NULL. The
 * server must run with --allow-user-kernels (else PERMISSION_DENIED); with
 * tokens on, admin role. A source that does not compile is
 * INVALID_ARGUMENT with the compiler's message. out may be NULL. */
int kiln_client_register_kernel(kiln_client *c, const char *name, const char *source,
                                const char *signature, const char *cuda_source,
                                kiln_remote_kernel *out, kiln_status *st);

/* ---- building modules ------------------------------------------------------------- */

/* A small builder for the ENTRY computation of a new module, in the manner
 * of XLA's XlaBuilder: each call appends one instruction, infers its result
 * shape and returns its id. The first error (a shape mismatch, a bad
 * dimension) is kept, later calls return KILN_NO_ID, and kiln_builder_finish
 * reports it: a chain of calls needs one check at the end. For anything the
 * builder lacks, kiln_builder_module gives the module itself (compiler/ir/ir.h
 * builds any instruction). */
typedef struct kiln_builder kiln_builder;

/* NULL on out-of-memory. */
kiln_builder *kiln_builder_create(const char *module_name);
void kiln_builder_destroy(kiln_builder *b);
/* The module under construction (owned by the builder until finish). */
kiln_module *kiln_builder_module(kiln_builder *b);

/* Parameters are numbered in the order they are added. `name` may be NULL. */
kiln_id kiln_builder_parameter(kiln_builder *b, kiln_dtype t, const int64_t *dims, uint32_t rank,
                               const char *name);
/* A constant (the value is copied). */
kiln_id kiln_builder_constant(kiln_builder *b, const kiln_literal *value);
/* A scalar constant of a floating or integral type, converted from v. */
kiln_id kiln_builder_scalar(kiln_builder *b, kiln_dtype t, double v);
/* Elementwise ops by opcode: KILN_OP_NEGATE, KILN_OP_EXP, ... (one operand)
 * and KILN_OP_ADD, KILN_OP_MULTIPLY, KILN_OP_MAXIMUM, ... (two). */
kiln_id kiln_builder_unary(kiln_builder *b, kiln_opcode op, kiln_id x);
kiln_id kiln_builder_binary(kiln_builder *b, kiln_opcode op, kiln_id x, kiln_id y);
kiln_id kiln_builder_compare(kiln_builder *b, kiln_cmp_dir dir, kiln_id x, kiln_id y);
kiln_id kiln_builder_select(kiln_builder *b, kiln_id pred, kiln_id on_true, kiln_id on_false);
kiln_id kiln_builder_convert(kiln_builder *b, kiln_id x, kiln_dtype t);
/* Result dims `dims`; operand dimension i becomes result dimension
 * map[i] (nmap = the operand's rank; NULL/0 for a scalar operand). */
kiln_id kiln_builder_broadcast(kiln_builder *b, kiln_id x, const int64_t *dims, uint32_t rank,
                               const int64_t *map, uint32_t nmap);
kiln_id kiln_builder_reshape(kiln_builder *b, kiln_id x, const int64_t *dims, uint32_t rank);
kiln_id kiln_builder_transpose(kiln_builder *b, kiln_id x, const int64_t *perm, uint32_t rank);
/* Matrix product: contracts the last dimension of x with the first of y
 * (vector or matrix operands, as numpy's dot for rank <= 2). */
kiln_id kiln_builder_dot(kiln_builder *b, kiln_id x, kiln_id y);
/* Sum over `dims` (a reduce with an add computation the builder writes). */
kiln_id kiln_builder_reduce_sum(kiln_builder *b, kiln_id x, const int64_t *dims, uint32_t n);
kiln_id kiln_builder_tuple(kiln_builder *b, const kiln_id *elems, uint32_t n);

/* Makes `root` the ENTRY root and verifies the module. On success *out is
 * the module (owned by the caller, kiln_module_destroy) and the builder is
 * spent (only kiln_builder_destroy remains). Reports the first error of any
 * earlier call. */
int kiln_builder_finish(kiln_builder *b, kiln_id root, kiln_module **out, kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CLIENTS_C_KILN_H */
