/* libkiln's connection and the life of one call on the gRPC core.
 *
 * A kiln_client is a gRPC channel with the service's methods registered
 * once. Every call gets its own pluck completion queue: batches are started
 * and waited for in the calling thread, so calls from many threads share
 * the channel without any lock of ours. Each client has a subchannel pool
 * of its own, so that N clients in one process are N connections, as N
 * processes would be.
 *
 * Every failure is recorded the same way: where is the gRPC status code
 * name, msg what went wrong, and the return code is the KILN_E* the gRPC
 * code maps to (kiln__rpc_errno), whether the error came from the server or
 * was found before anything was sent.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "clients/c/client_internal.h"
#include "common/alloc.h"
#include "compiler/ir/proto_internal.h"

static const char *const method_paths[KILN__M_COUNT] = {
    [KILN__M_COMPILE] = "/kiln.v1.Kiln/Compile",
    [KILN__M_EXECUTE] = "/kiln.v1.Kiln/Execute",
    [KILN__M_PUT_BUFFER] = "/kiln.v1.Kiln/PutBuffer",
    [KILN__M_GET_BUFFER] = "/kiln.v1.Kiln/GetBuffer",
    [KILN__M_RELEASE_BUFFERS] = "/kiln.v1.Kiln/ReleaseBuffers",
    [KILN__M_STATS] = "/kiln.v1.Kiln/Stats",
    [KILN__M_HEALTH_CHECK] = "/grpc.health.v1.Health/Check",
    [KILN__M_CACHE_LIST] = "/kiln.v1.Kiln/CacheList",
    [KILN__M_CACHE_EVICT] = "/kiln.v1.Kiln/CacheEvict",
    [KILN__M_COMPILE_STREAM] = "/kiln.v1.Kiln/CompileStream",
    [KILN__M_CACHE_EXPORT] = "/kiln.v1.Kiln/CacheExport",
    [KILN__M_CACHE_IMPORT] = "/kiln.v1.Kiln/CacheImport",
    [KILN__M_REGISTER_KERNEL] = "/kiln.v1.Kiln/RegisterKernel",
};

/* The kiln-request-id of the last call finished on this thread. */
static _Thread_local char last_request_id[65];

const char *kiln_client_last_request_id(void) { return last_request_id; }

/* The kiln-debug trailer of that call, unescaped ("\n" -> newline). */
static _Thread_local char last_debug[4097];

const char *kiln_client_last_debug(void) { return last_debug; }

static void keep_debug(const grpc_slice *v) {
  const char *p = (const char *)GRPC_SLICE_START_PTR(*v);
  size_t n = GRPC_SLICE_LENGTH(*v), o = 0;
  for (size_t i = 0; i < n && o + 1 < sizeof last_debug; i++) {
    if (p[i] == '\\' && i + 1 < n && p[i + 1] == 'n') {
      last_debug[o++] = '\n';
      i++;
    } else {
      last_debug[o++] = p[i];
    }
  }
  last_debug[o] = '\0';
}

static void keep_request_id(const grpc_metadata_array *md) {
  last_request_id[0] = '\0';
  last_debug[0] = '\0';
  for (size_t i = 0; i < md->count; i++) {
    const grpc_slice *k = &md->metadata[i].key, *v = &md->metadata[i].value;
    if (GRPC_SLICE_LENGTH(*k) == 10 && memcmp(GRPC_SLICE_START_PTR(*k), "kiln-debug", 10) == 0)
      keep_debug(v);
    if (GRPC_SLICE_LENGTH(*k) == 15 &&
        memcmp(GRPC_SLICE_START_PTR(*k), "kiln-request-id", 15) == 0) {
      size_t n = GRPC_SLICE_LENGTH(*v);
      if (n >= sizeof last_request_id) n = sizeof last_request_id - 1;
      memcpy(last_request_id, GRPC_SLICE_START_PTR(*v), n);
      last_request_id[n] = '\0';
    }
  }
}

#define DEFAULT_DEADLINE_MS INT64_C(300000)
#define DEFAULT_CONNECT_MS INT64_C(10000)
#define DEFAULT_MAX_RECEIVE (INT64_C(64) << 20)
#define DEFAULT_CHUNK (INT64_C(1) << 20)

/* Batch tags: sends and plain receives use one, the early status batch of a
 * client stream the other. */
#define TAG_BATCH ((void *)1)
#define TAG_STATUS ((void *)2)

/* ---- status --------------------------------------------------------------------- */

const char *kiln_rpc_code_name(kiln_rpc_code code) {
  switch (code) {
#define KILN_X_(name, val) \
  case KILN_RPC_##name: return #name;
    KILN_RPC_CODE_MAP(KILN_X_)
#undef KILN_X_
  }
  return "UNKNOWN";
}

kiln_rpc_code kiln_rpc_status_code(const kiln_status *st) {
  if (st == NULL || st->code == 0) return KILN_RPC_OK;
#define KILN_X_(name, val) \
  if (strcmp(st->where, #name) == 0) return KILN_RPC_##name;
  KILN_RPC_CODE_MAP(KILN_X_)
#undef KILN_X_
  return KILN_RPC_UNKNOWN;
}

int kiln__rpc_errno(kiln_rpc_code code) {
  switch (code) {
  case KILN_RPC_OK: return 0;
  case KILN_RPC_INVALID_ARGUMENT:
  case KILN_RPC_FAILED_PRECONDITION:
  case KILN_RPC_OUT_OF_RANGE:
  case KILN_RPC_ALREADY_EXISTS:
  case KILN_RPC_PERMISSION_DENIED:
  case KILN_RPC_UNAUTHENTICATED: return KILN_EINVAL;
  case KILN_RPC_NOT_FOUND: return KILN_ENOTFOUND;
  case KILN_RPC_RESOURCE_EXHAUSTED: return KILN_ELIMIT;
  case KILN_RPC_UNIMPLEMENTED: return KILN_EUNIMPL;
  case KILN_RPC_DEADLINE_EXCEEDED: return KILN_EDEADLINE;
  case KILN_RPC_UNAVAILABLE: return KILN_EUNAVAIL;
  case KILN_RPC_CANCELLED: return KILN_ECANCELED;
  case KILN_RPC_ABORTED: return KILN_EIO;
  default: return KILN_EINTERNAL;
  }
}

static int vfail(kiln_status *st, kiln_rpc_code code, int err, const char *fmt, va_list ap) {
  return kiln_status_vset(st, err, kiln_rpc_code_name(code), fmt, ap);
}

int kiln__client_fail(kiln_status *st, kiln_rpc_code code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vfail(st, code, kiln__rpc_errno(code), fmt, ap);
  va_end(ap);
  return rc;
}

int kiln__client_oom(kiln_status *st) {
  return kiln_status_set(st, KILN_ENOMEM, kiln_rpc_code_name(KILN_RPC_RESOURCE_EXHAUSTED),
                         "out of memory in the client");
}

/* ---- messages ------------------------------------------------------------------- */

int kiln__pack(const ProtobufCMessage *msg, uint8_t **out, size_t *len, kiln_status *st) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = kiln_malloc(n ? n : 1);
  if (buf == NULL) return kiln__client_oom(st);
  *len = protobuf_c_message_pack(msg, buf);
  *out = buf;
  return 0;
}

int kiln__unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                 ProtobufCMessage **out, kiln_status *st) {
  static const uint8_t empty[1];
  kiln_status local;
  kiln_status_clear(&local);
  *out = NULL;
  if (kiln__proto_check_wire(desc, len ? buf : empty, len, &local))
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server's %s reply does not decode: %s",
                             desc->short_name, local.msg);
  ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, len, len ? buf : empty);
  if (msg == NULL)
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server's reply is not a valid %s message",
                             desc->short_name);
  *out = msg;
  return 0;
}

/* Requests up to this size are packed into a gRPC slice allocated with its
 * reference count in one block; bigger ones into a kiln_malloc'd block, so
 * that running out of memory is an error, not gRPC's abort. */
#define SMALL_MESSAGE (64 * 1024)

grpc_byte_buffer *kiln__pack_buffer(const ProtobufCMessage *msg) {
  size_t len = protobuf_c_message_get_packed_size(msg);
  grpc_slice s;
  if (len <= SMALL_MESSAGE) {
    s = grpc_slice_malloc(len);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
  } else {
    uint8_t *buf = kiln_malloc(len);
    if (buf == NULL) return NULL;
    protobuf_c_message_pack(msg, buf);
    s = grpc_slice_new(buf, len, kiln_free);
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

int kiln__unpack_buffer(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb,
                        ProtobufCMessage **out, kiln_status *st) {
  /* A small reply is nearly always one uncompressed slice: read it where
   * it lies instead of gathering a copy. */
  if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
      bb->data.raw.slice_buffer.count == 1) {
    grpc_slice s = bb->data.raw.slice_buffer.slices[0];
    return kiln__unpack(desc, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), out, st);
  }
  uint8_t *bytes;
  size_t len;
  int rc = kiln__buffer_to_bytes(bb, &bytes, &len, st);
  if (rc) return rc;
  rc = kiln__unpack(desc, bytes, len, out, st);
  kiln_free(bytes);
  return rc;
}

grpc_byte_buffer *kiln__bytes_to_buffer(const uint8_t *buf, size_t len) {
  grpc_slice s = grpc_slice_from_copied_buffer((const char *)buf, len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

int kiln__buffer_to_bytes(grpc_byte_buffer *bb, uint8_t **out, size_t *len, kiln_status *st) {
  *out = NULL;
  *len = 0;
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb))
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "cannot read the server's reply");
  size_t n = grpc_byte_buffer_length(bb), off = 0;
  uint8_t *buf = kiln_malloc(n ? n : 1);
  if (buf == NULL) {
    grpc_byte_buffer_reader_destroy(&r);
    return kiln__client_oom(st);
  }
  /* Slice by slice: readall would make a second copy of the whole reply. */
  grpc_slice s;
  while (grpc_byte_buffer_reader_next(&r, &s)) {
    size_t k = GRPC_SLICE_LENGTH(s);
    if (k > n - off) k = n - off;
    memcpy(buf + off, GRPC_SLICE_START_PTR(s), k);
    off += k;
    grpc_slice_unref(s);
  }
  grpc_byte_buffer_reader_destroy(&r);
  *out = buf;
  *len = off;
  return 0;
}

/* ---- calls ---------------------------------------------------------------------- */

static gpr_timespec deadline_after(int64_t ms) {
  if (ms < 0) return gpr_inf_future(GPR_CLOCK_REALTIME);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

int kiln__call_start(kiln_client *c, kiln__method m, int64_t deadline_ms, kiln__call *k,
                     kiln_status *st) {
  memset(k, 0, sizeof *k);
  k->client = c;
  k->method = m;
  k->details = grpc_empty_slice();
  grpc_metadata_array_init(&k->initial_md);
  grpc_metadata_array_init(&k->trailing_md);
  atomic_store(&c->last_call_ms, kiln__now_ms()); /* the server renews the lease on it */
  k->cq = grpc_completion_queue_create_for_pluck(NULL);
  if (k->cq == NULL) return kiln__client_oom(st);
  int64_t ms = deadline_ms == 0 ? c->deadline_ms : deadline_ms;
  k->call = grpc_channel_create_registered_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, k->cq,
                                                c->registered[m], deadline_after(ms), NULL);
  if (k->call == NULL) {
    grpc_completion_queue_shutdown(k->cq);
    grpc_completion_queue_destroy(k->cq);
    k->cq = NULL;
    return kiln__client_fail(st, KILN_RPC_INTERNAL, "cannot create a %s call", method_paths[m]);
  }
  k->md[0].key = grpc_slice_from_static_string("kiln-client");
  k->md[0].value = grpc_slice_from_static_string(c->client_id);
  k->nmd = 1;
  if (c->authorization) {
    k->md[1].key = grpc_slice_from_static_string("authorization");
    k->md[1].value = grpc_slice_from_static_string(c->authorization);
    k->nmd = 2;
  }
  return 0;
}

static bool wait_tag(kiln__call *k, void *tag) {
  grpc_event ev = grpc_completion_queue_pluck(k->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

bool kiln__call_batch(kiln__call *k, const grpc_op *ops, size_t nops) {
  if (grpc_call_start_batch(k->call, ops, nops, TAG_BATCH, NULL) != GRPC_CALL_OK) return false;
  return wait_tag(k, TAG_BATCH);
}

/* Starts the batch that receives the final status (and, for client
 * streams, the one reply), without waiting: a server that fails a stream
 * early then ends our sends instead of leaving them blocked. */
bool kiln__call_recv_start(kiln__call *k, grpc_byte_buffer **reply) {
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  ops[n++].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[n - 1].data.recv_initial_metadata.recv_initial_metadata = &k->initial_md;
  if (reply) {
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = reply;
  }
  ops[n].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[n].data.recv_status_on_client.trailing_metadata = &k->trailing_md;
  ops[n].data.recv_status_on_client.status = &k->status;
  ops[n].data.recv_status_on_client.status_details = &k->details;
  ops[n++].data.recv_status_on_client.error_string = &k->error_string;
  if (grpc_call_start_batch(k->call, ops, n, TAG_STATUS, NULL) != GRPC_CALL_OK) return false;
  k->status_pending = true;
  return true;
}

static void call_free(kiln__call *k) {
  if (k->call) grpc_call_unref(k->call);
  if (k->cq) {
    grpc_completion_queue_shutdown(k->cq);
    while (
        grpc_completion_queue_pluck(k->cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
        GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(k->cq);
  }
  grpc_slice_unref(k->details);
  if (k->error_string) gpr_free((void *)k->error_string);
  grpc_metadata_array_destroy(&k->initial_md);
  grpc_metadata_array_destroy(&k->trailing_md);
  memset(k, 0, sizeof *k);
}

void kiln__call_abandon(kiln__call *k) {
  if (k->call == NULL) return;
  if (k->status_pending) {
    grpc_call_cancel(k->call, NULL);
    wait_tag(k, TAG_STATUS);
  }
  call_free(k);
}

int kiln__call_finish(kiln__call *k, kiln_status *st) {
  if (!k->status_received && !k->status_pending) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &k->trailing_md;
    op.data.recv_status_on_client.status = &k->status;
    op.data.recv_status_on_client.status_details = &k->details;
    op.data.recv_status_on_client.error_string = &k->error_string;
    if (grpc_call_start_batch(k->call, &op, 1, TAG_STATUS, NULL) == GRPC_CALL_OK)
      k->status_pending = true;
    else
      k->status = GRPC_STATUS_INTERNAL;
  }
  if (k->status_pending) {
    wait_tag(k, TAG_STATUS);
    k->status_pending = false;
  }
  keep_request_id(&k->trailing_md);
  int rc = 0;
  if (k->status != GRPC_STATUS_OK) {
    kiln_rpc_code code = (kiln_rpc_code)k->status;
    size_t n = GRPC_SLICE_LENGTH(k->details);
    if (n)
      rc = kiln__client_fail(st, code, "%.*s", (int)n,
                             (const char *)GRPC_SLICE_START_PTR(k->details));
    else if (k->error_string)
      rc = kiln__client_fail(st, code, "%s", k->error_string);
    else
      rc = kiln__client_fail(st, code, "%s failed without a message", method_paths[k->method]);
  }
  call_free(k);
  return rc;
}

int kiln__unary_buffer(kiln_client *c, kiln__method m, int64_t deadline_ms, grpc_byte_buffer *send,
                       grpc_byte_buffer **reply, kiln_status *st) {
  *reply = NULL;
  kiln__call k;
  int rc = kiln__call_start(c, m, deadline_ms, &k, st);
  if (rc) return rc;
  grpc_byte_buffer *recv = NULL;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = k.nmd;
  ops[0].data.send_initial_metadata.metadata = k.md;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &k.initial_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &k.trailing_md;
  ops[5].data.recv_status_on_client.status = &k.status;
  ops[5].data.recv_status_on_client.status_details = &k.details;
  ops[5].data.recv_status_on_client.error_string = &k.error_string;
  bool ok = kiln__call_batch(&k, ops, 6);
  k.status_received = ok;
  if (!ok) k.status = GRPC_STATUS_INTERNAL;
  rc = kiln__call_finish(&k, st);
  if (rc == 0 && recv == NULL)
    rc = kiln__client_fail(st, KILN_RPC_INTERNAL, "%s succeeded without a reply message",
                           method_paths[m]);
  if (rc == 0)
    *reply = recv;
  else if (recv)
    grpc_byte_buffer_destroy(recv);
  return rc;
}

int kiln__unary(kiln_client *c, kiln__method m, int64_t deadline_ms, const uint8_t *req, size_t len,
                uint8_t **reply, size_t *reply_len, kiln_status *st) {
  *reply = NULL;
  *reply_len = 0;
  grpc_byte_buffer *send = kiln__bytes_to_buffer(req, len);
  if (send == NULL) return kiln__client_oom(st);
  grpc_byte_buffer *recv;
  int rc = kiln__unary_buffer(c, m, deadline_ms, send, &recv, st);
  grpc_byte_buffer_destroy(send);
  if (rc) return rc;
  rc = kiln__buffer_to_bytes(recv, reply, reply_len, st);
  grpc_byte_buffer_destroy(recv);
  return rc;
}

/* ---- connecting ----------------------------------------------------------------- */

static atomic_uint client_serial;

/* Waits for the channel to be READY; a failed attempt ends the wait. */
static int wait_ready(kiln_client *c, int64_t ms, kiln_status *st) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  if (cq == NULL) return kiln__client_oom(st);
  gpr_timespec deadline = deadline_after(ms);
  grpc_connectivity_state s = grpc_channel_check_connectivity_state(c->channel, 1);
  int rc = 0;
  while (s != GRPC_CHANNEL_READY) {
    if (s == GRPC_CHANNEL_TRANSIENT_FAILURE || s == GRPC_CHANNEL_SHUTDOWN) {
      rc = kiln__client_fail(st, KILN_RPC_UNAVAILABLE, "cannot connect to %s", c->target);
      break;
    }
    grpc_channel_watch_connectivity_state(c->channel, s, deadline, cq, TAG_BATCH);
    grpc_event ev =
        grpc_completion_queue_pluck(cq, TAG_BATCH, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (!ev.success) {
      rc = kiln__client_fail(st, KILN_RPC_UNAVAILABLE, "cannot connect to %s within %lld ms",
                             c->target, (long long)ms);
      break;
    }
    s = grpc_channel_check_connectivity_state(c->channel, 1);
  }
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  return rc;
}

static int check_options(const kiln_client_options *o, kiln_status *st) {
  if (o->max_receive_bytes < 0 || o->max_receive_bytes > INT32_MAX)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT,
                             "max_receive_bytes %lld is outside 0..2147483647",
                             (long long)o->max_receive_bytes);
  if (o->chunk_bytes < 0 || o->chunk_bytes > (INT64_C(1) << 30))
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "chunk_bytes %lld is outside 0..2^30",
                             (long long)o->chunk_bytes);
  if (o->client_id && (o->client_id[0] == '\0' || strlen(o->client_id) > 256))
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "client_id must be 1 to 256 bytes");
  /* A metadata value is printable ASCII: anything else would be refused
   * by the transport. */
  for (const char *p = o->client_id; p && *p; p++)
    if (*p < 0x20 || *p > 0x7e)
      return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT,
                               "client_id may hold only printable ASCII characters");
  if ((o->tls_cert_file == NULL) != (o->tls_key_file == NULL))
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT,
                             "tls_cert_file and tls_key_file go together");
  if (o->token && (o->token[0] == '\0' || strlen(o->token) > 4096))
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "token must be 1 to 4096 bytes");
  for (const char *p = o->token; p && *p; p++)
    if (*p < 0x21 || *p > 0x7e)
      return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT,
                               "token may hold only printable ASCII characters without spaces");
  if (o->lease_keepalive_ms < 0)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT,
                             "lease_keepalive_ms %lld is negative (0: no keep-alive thread)",
                             (long long)o->lease_keepalive_ms);
  return 0;
}

/* A PEM file, NUL-terminated (kiln_malloc'd). */
static int read_pem(const char *path, const char *what, char **out, kiln_status *st) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "cannot open %s %s: %s", what, path,
                             strerror(errno));
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int rc = 0;
  for (;;) {
    if (kiln_grow((void **)&buf, &cap, len + 4097, 1)) {
      rc = kiln__client_oom(st);
      break;
    }
    size_t n = fread(buf + len, 1, 4096, f);
    len += n;
    if (n < 4096) break;
    if (len > (4u << 20)) {
      rc = kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "%s %s is larger than 4 MiB", what,
                             path);
      break;
    }
  }
  if (rc == 0 && ferror(f))
    rc = kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "cannot read %s %s", what, path);
  fclose(f);
  if (rc) {
    kiln_free(buf);
    return rc;
  }
  buf[len] = '\0';
  *out = buf;
  return 0;
}

/* Plaintext, or TLS with the given roots and optional client pair. */
static int channel_credentials(const kiln_client_options *o, grpc_channel_credentials **out,
                               kiln_status *st) {
  *out = NULL;
  if (!o->tls && o->tls_ca_file == NULL && o->tls_cert_file == NULL) {
    *out = grpc_insecure_credentials_create();
    return 0;
  }
  char *ca = NULL, *cert = NULL, *key = NULL;
  int rc = 0;
  if (o->tls_ca_file) rc = read_pem(o->tls_ca_file, "CA file", &ca, st);
  if (rc == 0 && o->tls_cert_file) rc = read_pem(o->tls_cert_file, "certificate file", &cert, st);
  if (rc == 0 && o->tls_key_file) rc = read_pem(o->tls_key_file, "key file", &key, st);
  if (rc == 0) {
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    *out = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
    if (*out == NULL)
      rc = kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "cannot create TLS credentials");
  }
  if (key) memset(key, 0, strlen(key));
  kiln_free(ca);
  kiln_free(cert);
  kiln_free(key);
  return rc;
}

int kiln_client_connect(const char *target, const kiln_client_options *opts, kiln_client **out,
                        kiln_status *st) {
  *out = NULL;
  kiln_client_options o = {0};
  if (opts) o = *opts;
  if (target == NULL || target[0] == '\0')
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "no server address given (HOST:PORT)");
  int rc = check_options(&o, st);
  if (rc) return rc;
  kiln_client *c = kiln_calloc(1, sizeof *c);
  if (c == NULL) return kiln__client_oom(st);
  c->deadline_ms = o.deadline_ms == 0 ? DEFAULT_DEADLINE_MS : o.deadline_ms;
  c->max_receive_bytes = o.max_receive_bytes ? o.max_receive_bytes : DEFAULT_MAX_RECEIVE;
  c->chunk_bytes = o.chunk_bytes ? o.chunk_bytes : DEFAULT_CHUNK;
  c->target = kiln_strdup(target);
  if (o.client_id) {
    c->client_id = kiln_strdup(o.client_id);
  } else {
    char id[64];
    snprintf(id, sizeof id, "libkiln-%ld-%u", (long)getpid(),
             atomic_fetch_add(&client_serial, 1) + 1);
    c->client_id = kiln_strdup(id);
  }
  if (o.token) {
    size_t n = strlen(o.token);
    c->authorization = kiln_malloc(n + 8);
    if (c->authorization) snprintf(c->authorization, n + 8, "Bearer %s", o.token);
  }
  if (c->target == NULL || c->client_id == NULL || (o.token && c->authorization == NULL)) {
    kiln_free(c->target);
    kiln_free(c->client_id);
    kiln_free(c->authorization);
    kiln_free(c);
    return kiln__client_oom(st);
  }
  grpc_init();
  grpc_arg args[3];
  memset(args, 0, sizeof args);
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = (int)c->max_receive_bytes;
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
  args[1].value.integer = 1;
  args[2].type = GRPC_ARG_STRING;
  args[2].key = (char *)GRPC_ARG_PRIMARY_USER_AGENT_STRING;
  args[2].value.string = (char *)"libkiln/0.1.0";
  grpc_channel_args cargs = {.num_args = 3, .args = args};
  grpc_channel_credentials *creds;
  if ((rc = channel_credentials(&o, &creds, st))) goto out_close;
  c->channel = grpc_channel_create(target, creds, &cargs);
  grpc_channel_credentials_release(creds);
  if (c->channel == NULL) {
    rc = kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "cannot create a channel to %s", target);
    goto out_close;
  }
  for (int m = 0; m < KILN__M_COUNT; m++)
    c->registered[m] = grpc_channel_register_call(c->channel, method_paths[m], NULL, NULL);
  int64_t wait_ms = o.connect_timeout_ms == 0 ? DEFAULT_CONNECT_MS : o.connect_timeout_ms;
  if (wait_ms > 0 && (rc = wait_ready(c, wait_ms, st))) goto out_close;
  c->keepalive_ms = o.lease_keepalive_ms;
  atomic_store(&c->last_call_ms, kiln__now_ms());
  if (c->keepalive_ms > 0 && (rc = kiln__keeper_start(c, st))) goto out_close;
  *out = c;
  return 0;
out_close:
  kiln_client_close(c);
  return rc;
}

void kiln_client_close(kiln_client *c) {
  if (c == NULL) return;
  kiln__keeper_stop(c); /* before the channel it calls on goes */
  if (c->channel) grpc_channel_destroy(c->channel);
  kiln_free(c->target);
  kiln_free(c->client_id);
  if (c->authorization) {
    memset(c->authorization, 0, strlen(c->authorization));
    kiln_free(c->authorization);
  }
  kiln_free(c);
  grpc_shutdown();
}

const char *kiln_client_id(const kiln_client *c) { return c->client_id; }

/* ---- health --------------------------------------------------------------------- */

/* grpc.health.v1 messages are two fields; they are written and read here
 * directly rather than generated. */
static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

static int health_status(const uint8_t *p, size_t len, uint64_t *status) {
  const uint8_t *end = p + len;
  *status = 0;
  while (p < end) {
    uint64_t key, v;
    if (!read_varint(&p, end, &key)) return -1;
    switch (key & 7) {
    case 0:
      if (!read_varint(&p, end, &v)) return -1;
      if (key >> 3 == 1) *status = v;
      break;
    case 1:
      if (end - p < 8) return -1;
      p += 8;
      break;
    case 5:
      if (end - p < 4) return -1;
      p += 4;
      break;
    case 2:
      if (!read_varint(&p, end, &v) || v > (uint64_t)(end - p)) return -1;
      p += v;
      break;
    default: return -1;
    }
  }
  return 0;
}

int kiln_client_health(kiln_client *c, const char *service, bool *serving, kiln_status *st) {
  *serving = false;
  size_t n = service ? strlen(service) : 0;
  if (n > 127)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "service name over 127 bytes");
  uint8_t req[130];
  size_t len = 0;
  if (n) {
    req[len++] = 0x0a; /* field 1, length-delimited */
    req[len++] = (uint8_t)n;
    memcpy(req + len, service, n);
    len += n;
  }
  uint8_t *reply;
  size_t reply_len;
  int rc = kiln__unary(c, KILN__M_HEALTH_CHECK, 0, req, len, &reply, &reply_len, st);
  if (rc) return rc;
  uint64_t status;
  if (health_status(reply, reply_len, &status))
    rc = kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the health reply does not decode");
  else
    *serving = status == 1; /* SERVING */
  kiln_free(reply);
  return rc;
}
