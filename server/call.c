/* The life of one gRPC call on the server, and the one status mapping.
 *
 * A kilnd_call is created when its method is requested from the server and
 * freed when its last reference goes. Once the call has arrived it holds two
 * references: the handler's (passed along the batches the handler starts,
 * and dropped when its final status has been sent) and the close tag's (a
 * RECV_CLOSE_ON_SERVER batch, which completes when the call is over and
 * says whether the caller cancelled it; that is how queued and running work
 * learns its caller went away). The close batch starts on arrival, except
 * for Execute, which starts it only when the call has to wait for a device;
 * an Execute answered at once puts RECV_CLOSE_ON_SERVER in its final batch
 * instead. Freeing a call whose caller cancelled also releases the buffer
 * handles the call created, which the caller never saw.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "common/alloc.h"
#include "executor/buffers.h"
#include "executor/scheduler.h"
#include "server/server.h"

grpc_status_code kilnd_status_code(int rc) {
  switch (rc) {
  case KILN_OK: return GRPC_STATUS_OK;
  case KILN_EINVAL:
  case KILN_EPARSE:
  case KILN_EVERIFY:
  case KILN_ERANGE: return GRPC_STATUS_INVALID_ARGUMENT;
  case KILN_ENOMEM:
  case KILN_ELIMIT: return GRPC_STATUS_RESOURCE_EXHAUSTED;
  case KILN_EUNIMPL: return GRPC_STATUS_UNIMPLEMENTED;
  case KILN_ENOTFOUND: return GRPC_STATUS_NOT_FOUND;
  case KILN_EDEADLINE: return GRPC_STATUS_DEADLINE_EXCEEDED;
  case KILN_ECANCELED: return GRPC_STATUS_CANCELLED;
  case KILN_EUNAVAIL: return GRPC_STATUS_UNAVAILABLE;
  case KILND_EUNAUTH: return GRPC_STATUS_UNAUTHENTICATED;
  case KILND_EPERM: return GRPC_STATUS_PERMISSION_DENIED;
  case KILN_EIO:
  case KILN_EINTERNAL:
  default: return GRPC_STATUS_INTERNAL;
  }
}

/* ---- freeing ------------------------------------------------------------------------- */

static void release_created(kilnd_call *c) {
  for (uint32_t i = 0; i < c->ncreated; i++)
    kiln_buffer_store_release(c->srv->buffers, c->client, c->created[i], NULL);
}

static void call_free(kilnd_call *c) {
  kilnd *srv = c->srv;
  bool arrived = c->call != NULL;
  if (atomic_load(&c->cancelled)) release_created(c);
  kiln_free(c->created);
  if (c->state_free) c->state_free(c);
  if (c->req) kilnd_call_free_message(c, c->req);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->reply) grpc_byte_buffer_destroy(c->reply);
  if (c->recv_buf) grpc_byte_buffer_destroy(c->recv_buf);
  if (c->details_set) grpc_slice_unref(c->details_slice);
  grpc_metadata_array_destroy(&c->md);
  if (c->method == NULL) grpc_call_details_destroy(&c->details);
  if (c->call) grpc_call_unref(c->call);
  bool working = c->working;
  kiln_free(c);
  if (working) atomic_fetch_sub(&srv->working, 1);
  if (arrived) atomic_fetch_sub(&srv->inflight, 1);
}

static void unref(kilnd_call *c) {
  if (atomic_fetch_sub(&c->refs, 1) == 1) call_free(c);
}

void kilnd_call_abandon(kilnd_call *c) { unref(c); }

/* ---- arrival ------------------------------------------------------------------------- */

static void on_close(kilnd_tag *tag, bool ok) {
  kilnd_call *c = KILND_CALL_FROM_TAG(tag, close_tag);
  if (!ok || c->close_cancelled) atomic_store(&c->cancelled, 1);
  unref(c);
}

void kilnd_call_watch_close(kilnd_call *c) {
  if (c->close_watched) return;
  c->close_watched = true;
  grpc_op op = {.op = GRPC_OP_RECV_CLOSE_ON_SERVER};
  op.data.recv_close_on_server.cancelled = &c->close_cancelled;
  c->close_tag.fn = on_close;
  atomic_fetch_add(&c->refs, 1);
  if (grpc_call_start_batch(c->call, &op, 1, &c->close_tag, NULL) != GRPC_CALL_OK) unref(c);
}

/* Execute starts its watch only if it queues (handlers_execute.c). */
static bool watch_on_arrival(const kilnd_method *m) {
  return m == NULL || m->id != KILND_M_EXECUTE;
}

static int64_t deadline_to_ns(gpr_timespec d) {
  gpr_timespec mono = gpr_convert_clock_type(d, GPR_CLOCK_MONOTONIC);
  if (gpr_time_cmp(mono, gpr_inf_future(GPR_CLOCK_MONOTONIC)) == 0) return 0;
  gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
  gpr_timespec left = gpr_time_sub(mono, now);
  int64_t left_ns = (int64_t)left.tv_sec * 1000000000 + left.tv_nsec;
  int64_t ns = kiln_sched_now_ns() + left_ns;
  return ns == 0 ? 1 : ns;
}

static void unimplemented(kilnd_call *c) {
  char path[160];
  size_t n = GRPC_SLICE_LENGTH(c->details.method);
  snprintf(path, sizeof path, "%.*s", (int)(n < 128 ? n : 128),
           (const char *)GRPC_SLICE_START_PTR(c->details.method));
  for (char *p = path; *p; p++)
    if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
  kilnd_call_fail(c, KILN_EUNIMPL, "unknown method '%s'", path);
}

static void on_new(kilnd_tag *tag, bool ok) {
  kilnd_call *c = KILND_CALL_FROM_TAG(tag, new_tag);
  kilnd *srv = c->srv;
  atomic_fetch_sub(&srv->requested, 1);
  if (!ok || c->call == NULL) { /* the server is shutting down */
    if (c->call) grpc_call_unref(c->call);
    c->call = NULL;
    call_free(c);
    return;
  }
  atomic_fetch_add(&srv->inflight, 1);
  kilnd_call_request(srv, c->method); /* keep one request pending per method */
  c->start_ns = kiln_sched_now_ns();
  kilnd_log_request_id(c->request_id);
  c->deadline_ns = deadline_to_ns(c->method ? c->deadline : c->details.deadline);
  atomic_store(&c->refs, 1);
  if (watch_on_arrival(c->method)) kilnd_call_watch_close(c);
  if (c->method == NULL)
    unimplemented(c);
  else
    kilnd_rpc_dispatch(c);
}

bool kilnd_call_request(kilnd *srv, const kilnd_method *m) {
  if (atomic_load(&srv->shutdown)) return false;
  kilnd_call *c = kiln_calloc(1, sizeof *c);
  if (c == NULL) {
    kilnd_log("out of memory requesting a call; requested again later");
    atomic_fetch_add(&srv->owed[m ? m->id : KILND_M_COUNT], 1);
    return false;
  }
  c->srv = srv;
  c->method = m;
  c->new_tag.fn = on_new;
  grpc_metadata_array_init(&c->md);
  grpc_call_error err;
  atomic_fetch_add(&srv->requested, 1);
  if (m) {
    err = grpc_server_request_registered_call(
        srv->server, srv->registered[m->id], &c->call, &c->deadline, &c->md,
        m->kind == KILND_CLIENT_STREAM ? NULL : &c->payload, srv->cq, srv->cq, &c->new_tag);
  } else {
    grpc_call_details_init(&c->details);
    err = grpc_server_request_call(srv->server, &c->call, &c->details, &c->md, srv->cq, srv->cq,
                                   &c->new_tag);
  }
  if (err != GRPC_CALL_OK) {
    atomic_fetch_sub(&srv->requested, 1);
    call_free(c);
    return false;
  }
  return true;
}

void kilnd_call_repay(kilnd *srv) {
  const kilnd_method *methods = kilnd_methods();
  for (int i = 0; i <= KILND_M_COUNT; i++) {
    const kilnd_method *m = i < KILND_M_COUNT ? &methods[i] : NULL;
    while (atomic_load(&srv->owed[i]) > 0 && !atomic_load(&srv->shutdown)) {
      atomic_fetch_sub(&srv->owed[i], 1);
      if (!kilnd_call_request(srv, m)) return; /* owed again, or shutting down */
    }
  }
}

/* ---- replies ------------------------------------------------------------------------- */

static void on_sent(kilnd_tag *tag, bool ok) {
  kilnd_call *c = KILND_CALL_FROM_TAG(tag, send_tag);
  if (c->close_in_final && (!ok || c->close_cancelled)) atomic_store(&c->cancelled, 1);
  int64_t ns = kiln_sched_now_ns() - c->start_ns;
  kilnd_metrics_request(c->srv, c->method ? c->method->id : KILND_M_UNKNOWN, c->code, ns);
  kilnd_log_call(c, ns);
  unref(c);
}

/* Replies up to this size are packed into a gRPC slice allocated with its
 * reference count in one block; bigger ones into a kiln_malloc'd block
 * (gRPC's allocator aborts when memory runs out; ours reports it). */
#define SMALL_REPLY (64 * 1024)

/* Packs a protobuf-c message into a byte buffer, once: protobuf-c writes
 * the bytes gRPC sends. */
static grpc_byte_buffer *pack(const ProtobufCMessage *msg) {
  size_t len = protobuf_c_message_get_packed_size(msg);
  grpc_slice s;
  if (len <= SMALL_REPLY) {
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

static void send_status(kilnd_call *c, const ProtobufCMessage *msg, grpc_status_code code,
                        const char *text, bool initial_md_sent) {
  grpc_op ops[4];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (!initial_md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (!c->close_watched) { /* see kilnd_call_watch_close */
    c->close_watched = c->close_in_final = true;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &c->close_cancelled;
  }
  if (code == GRPC_STATUS_OK && msg) {
    c->reply = pack(msg);
    if (c->reply == NULL) {
      code = GRPC_STATUS_RESOURCE_EXHAUSTED;
      text = "out of memory packing the reply";
    } else {
      ops[n].op = GRPC_OP_SEND_MESSAGE;
      ops[n++].data.send_message.send_message = c->reply;
    }
  }
  c->code = code;
  if (text && text[0]) {
    c->details_slice = grpc_slice_from_copied_string(text);
    c->details_set = true;
  }
  /* The id of the call's log line, for the caller to quote. */
  c->trailer[0].key = grpc_slice_from_static_string("kiln-request-id");
  c->trailer[0].value = grpc_slice_from_static_buffer(c->request_id, strlen(c->request_id));
  size_t ntrailers = 1;
  if (c->ndebug > 0) {
    c->trailer[1].key = grpc_slice_from_static_string("kiln-debug");
    c->trailer[1].value = grpc_slice_from_static_buffer(c->debug, c->ndebug);
    ntrailers = 2;
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.trailing_metadata_count = ntrailers;
  ops[n].data.send_status_from_server.trailing_metadata = c->trailer;
  ops[n].data.send_status_from_server.status = code;
  ops[n++].data.send_status_from_server.status_details = c->details_set ? &c->details_slice : NULL;
  c->send_tag.fn = on_sent;
  if (grpc_call_start_batch(c->call, ops, n, &c->send_tag, NULL) != GRPC_CALL_OK) unref(c);
}

static bool initial_md_sent(const kilnd_call *c) { return c->md_sent; }

void kilnd_call_finish(kilnd_call *c, const ProtobufCMessage *msg, int rc, const kiln_status *st) {
  if (rc == 0) {
    send_status(c, msg, GRPC_STATUS_OK, NULL, initial_md_sent(c));
    return;
  }
  char text[KILN_STATUS_MSG_MAX + KILN_STATUS_WHERE_MAX + 16];
  if (st && st->code)
    kiln_status_format(st, text, sizeof text);
  else
    snprintf(text, sizeof text, "%s", kiln_strerror(rc));
  send_status(c, NULL, kilnd_status_code(rc), text, initial_md_sent(c));
}

void kilnd_call_fail(kilnd_call *c, int rc, const char *fmt, ...) {
  kiln_status st;
  kiln_status_clear(&st);
  va_list ap;
  va_start(ap, fmt);
  kiln_status_vset(&st, rc, NULL, fmt, ap);
  va_end(ap);
  kilnd_call_finish(c, NULL, rc, &st);
}

/* ---- streams ------------------------------------------------------------------------- */

int kilnd_call_send_message(kilnd_call *c, const ProtobufCMessage *msg, kilnd_tag_fn done) {
  grpc_op ops[2];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (!initial_md_sent(c)) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (c->reply) grpc_byte_buffer_destroy(c->reply);
  c->reply = pack(msg);
  if (c->reply == NULL) return KILN_ENOMEM;
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = c->reply;
  c->md_sent = true;
  c->stream_tag.fn = done;
  if (grpc_call_start_batch(c->call, ops, n, &c->stream_tag, NULL) != GRPC_CALL_OK)
    return KILN_EINTERNAL;
  return 0;
}

int kilnd_call_recv_message(kilnd_call *c, kilnd_tag_fn done) {
  if (c->recv_buf) {
    grpc_byte_buffer_destroy(c->recv_buf);
    c->recv_buf = NULL;
  }
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->recv_buf;
  c->stream_tag.fn = done;
  if (grpc_call_start_batch(c->call, &op, 1, &c->stream_tag, NULL) != GRPC_CALL_OK)
    return KILN_EINTERNAL;
  return 0;
}

void kilnd_call_note_created(kilnd_call *c, const char *handle) {
  char(*grown)[33] = kiln_realloc(c->created, (c->ncreated + 1) * sizeof *c->created);
  if (grown == NULL) return;
  c->created = grown;
  snprintf(c->created[c->ncreated++], 33, "%s", handle);
}

/* ---- deadlines ----------------------------------------------------------------------- */

bool kilnd_call_expired(kilnd_call *c, int *rc) {
  if (atomic_load(&c->cancelled)) return *rc = KILN_ECANCELED, true;
  if (c->deadline_ns && kiln_sched_now_ns() >= c->deadline_ns) return *rc = KILN_EDEADLINE, true;
  return false;
}

double kilnd_call_time_left(const kilnd_call *c, double cap) {
  if (c->deadline_ns == 0) return cap;
  double left = (double)(c->deadline_ns - kiln_sched_now_ns()) / 1e9;
  if (left < 0.001) left = 0.001;
  return cap > 0 && cap < left ? cap : left;
}
