/* The RPC method table and its single validation point.
 *
 * Every method kilnd serves is one row: path, kind, request type, handler
 * (the Redis command table). Nothing reaches a handler without passing
 * kilnd_rpc_dispatch: the caller's identity is established (auth.c) and its
 * role checked against the method, an
 * expired deadline is answered at once, and the request bytes are checked
 * as wire data (depth, lengths, UTF-8 strings) before protobuf-c unpacks
 * them with a bounded allocator. Both read the bytes where gRPC received
 * them when they are one slice, as a small request's are. Handlers therefore see only well-formed
 * messages of the right type and validate meaning, not bytes.
 */
#include <stdio.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>

#include "common/alloc.h"
#include "executor/buffers.h"
#include "executor/scheduler.h"
#include "grpc/health/v1/health.pb-c.h"
#include "kiln/v1/kiln.pb-c.h"
#include "server/server.h"

static const kilnd_method methods[KILND_M_COUNT] = {
    [KILND_M_COMPILE] = {KILND_M_COMPILE, "/kiln.v1.Kiln/Compile", "Compile", KILND_UNARY,
                         &kiln__v1__compile_request__descriptor, kilnd_handle_compile},
    [KILND_M_EXECUTE] = {KILND_M_EXECUTE, "/kiln.v1.Kiln/Execute", "Execute", KILND_UNARY,
                         &kiln__v1__execute_request__descriptor, kilnd_handle_execute},
    [KILND_M_PUT_BUFFER] = {KILND_M_PUT_BUFFER, "/kiln.v1.Kiln/PutBuffer", "PutBuffer",
                            KILND_CLIENT_STREAM, &kiln__v1__put_buffer_chunk__descriptor,
                            kilnd_handle_put_buffer},
    [KILND_M_GET_BUFFER] = {KILND_M_GET_BUFFER, "/kiln.v1.Kiln/GetBuffer", "GetBuffer",
                            KILND_SERVER_STREAM, &kiln__v1__get_buffer_request__descriptor,
                            kilnd_handle_get_buffer},
    [KILND_M_RELEASE_BUFFERS] = {KILND_M_RELEASE_BUFFERS, "/kiln.v1.Kiln/ReleaseBuffers",
                                 "ReleaseBuffers", KILND_UNARY,
                                 &kiln__v1__release_buffers_request__descriptor,
                                 kilnd_handle_release_buffers},
    [KILND_M_STATS] = {KILND_M_STATS, "/kiln.v1.Kiln/Stats", "Stats", KILND_UNARY,
                       &kiln__v1__stats_request__descriptor, kilnd_handle_stats},
    [KILND_M_HEALTH_CHECK] = {KILND_M_HEALTH_CHECK, "/grpc.health.v1.Health/Check", "Health.Check",
                              KILND_UNARY, &grpc__health__v1__health_check_request__descriptor,
                              kilnd_handle_health_check},
    [KILND_M_CACHE_LIST] = {KILND_M_CACHE_LIST, "/kiln.v1.Kiln/CacheList", "CacheList", KILND_UNARY,
                            &kiln__v1__cache_list_request__descriptor, kilnd_handle_cache_list},
    [KILND_M_CACHE_EVICT] = {KILND_M_CACHE_EVICT, "/kiln.v1.Kiln/CacheEvict", "CacheEvict",
                             KILND_UNARY, &kiln__v1__cache_evict_request__descriptor,
                             kilnd_handle_cache_evict},
    /* Compile with its phases streamed (progress.h): the same handler. */
    [KILND_M_COMPILE_STREAM] = {KILND_M_COMPILE_STREAM, "/kiln.v1.Kiln/CompileStream",
                                "CompileStream", KILND_SERVER_STREAM,
                                &kiln__v1__compile_request__descriptor, kilnd_handle_compile},
    [KILND_M_CACHE_EXPORT] = {KILND_M_CACHE_EXPORT, "/kiln.v1.Kiln/CacheExport", "CacheExport",
                              KILND_UNARY, &kiln__v1__cache_export_request__descriptor,
                              kilnd_handle_cache_export},
    [KILND_M_CACHE_IMPORT] = {KILND_M_CACHE_IMPORT, "/kiln.v1.Kiln/CacheImport", "CacheImport",
                              KILND_UNARY, &kiln__v1__cache_import_request__descriptor,
                              kilnd_handle_cache_import},
    [KILND_M_REGISTER_KERNEL] = {KILND_M_REGISTER_KERNEL, "/kiln.v1.Kiln/RegisterKernel",
                                 "RegisterKernel", KILND_UNARY,
                                 &kiln__v1__register_kernel_request__descriptor,
                                 kilnd_handle_register_kernel},
};

const kilnd_method *kilnd_methods(void) { return methods; }

const char *kilnd_method_name(kilnd_method_id id) {
  return id < KILND_M_COUNT ? methods[id].name : "unknown";
}

/* ---- identity and roles --------------------------------------------------------------- */

/* Who the caller is comes from auth.c: the token's client name, the
 * verified certificate's subject, or (no authentication configured) the
 * kiln-client metadata. What a user token may not do: the cache is shared
 * by every client and the server does not record who built an entry, so
 * listing and evicting it are for admins; Stats reports every client's
 * work together, so it is for admins too. */
static int authorize(const kilnd_call *c, kiln_status *st) {
  if (c->role != KILND_ROLE_USER) return 0;
  switch (c->method->id) {
  case KILND_M_CACHE_LIST:
  case KILND_M_CACHE_EVICT:
  case KILND_M_CACHE_EXPORT:
  case KILND_M_CACHE_IMPORT:
  case KILND_M_REGISTER_KERNEL: /* runs the caller's code in the server */
  case KILND_M_STATS:
    return kiln_status_set(st, KILND_EPERM, c->method->name,
                           "needs an admin token (client '%s' is a user)", c->client);
  default: return 0;
  }
}

/* Every refusal by identity or role leaves an audit line (log.h). */
static void audit_refusal(const kilnd_call *c, const char *event, const kiln_status *st) {
  kilnd_log_rec r;
  kilnd_log_audit(&r, c, event);
  kilnd_log_str(&r, "reason", st->msg);
  char *peer = grpc_call_get_peer(c->call);
  kilnd_log_str(&r, "peer", peer ? peer : "");
  gpr_free(peer);
  kilnd_log_end(&r);
}

/* ---- request bytes ------------------------------------------------------------------- */

void kilnd_call_free_message(kilnd_call *c, ProtobufCMessage *msg) {
  if (msg) protobuf_c_message_free_unpacked(msg, &c->req_alloc.base);
}

/* The message's bytes: in place when gRPC holds them as one uncompressed
 * slice (a small request nearly always arrives so), else gathered into one
 * (readall). Either way *s holds a reference the caller drops. */
static bool message_bytes(grpc_byte_buffer *bb, grpc_slice *s) {
  if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
      bb->data.raw.slice_buffer.count == 1) {
    *s = grpc_slice_ref(bb->data.raw.slice_buffer.slices[0]);
    return true;
  }
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return false;
  *s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  return true;
}

int kilnd_rpc_unpack(kilnd_call *c, grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                     ProtobufCMessage **out, kiln_status *st) {
  *out = NULL;
  grpc_slice s;
  if (!message_bytes(bb, &s))
    return kiln_status_set(st, KILN_EINVAL, desc->name, "unreadable request message");
  const uint8_t *p = GRPC_SLICE_START_PTR(s);
  size_t len = GRPC_SLICE_LENGTH(s);
  int rc = 0;
  if (len > c->srv->cfg.max_message_bytes)
    rc = kiln_status_set(st, KILN_ELIMIT, desc->name,
                         "message of %zu bytes exceeds the limit of "
                         "%llu (max-message-bytes)",
                         len, (unsigned long long)c->srv->cfg.max_message_bytes);
  if (rc == 0) rc = kiln__proto_check_wire(desc, p, len, st);
  if (rc == 0) {
    /* The budget covers this message; a stream's messages share the call's
     * allocator, each freed before the next arrives. */
    kiln__proto_alloc_init(&c->req_alloc, KILN_PROTO_UNPACK_BUDGET(len));
    *out = protobuf_c_message_unpack(desc, &c->req_alloc.base, len, p);
    if (*out == NULL)
      rc = c->req_alloc.over_budget || c->req_alloc.failed
               ? kiln_status_set(st, KILN_ELIMIT, desc->name, "message too complex to unpack")
               : kiln_status_set(st, KILN_EINVAL, desc->name, "not a valid %s message", desc->name);
  }
  grpc_slice_unref(s);
  return rc;
}

/* ---- the validation point ------------------------------------------------------------ */

/* A call refused here never counts as work the drain waits for. */

void kilnd_rpc_dispatch(kilnd_call *c) {
  const kilnd_method *m = c->method;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kilnd_auth_identify(c, &st);
  if (rc == 0 && (rc = authorize(c, &st)) != 0)
    audit_refusal(c, "permission_denied", &st);
  else if (rc == KILND_EUNAUTH)
    audit_refusal(c, "auth_failure", &st);
  if (rc == 0) kiln_buffer_store_touch(c->srv->buffers, c->client); /* renews its lease */
  /* Draining: after the grace period (for calls that were on their way
   * when the signal came) new work is refused while the work already
   * accepted finishes; health checks are still answered (NOT_SERVING). */
  if (rc == 0 && atomic_load(&c->srv->draining) && m->id != KILND_M_HEALTH_CHECK &&
      kiln_sched_now_ns() >= atomic_load(&c->srv->refuse_after_ns))
    rc = kiln_status_set(&st, KILN_EUNAVAIL, m->name, "the server is draining");
  if (rc == 0 && kilnd_call_expired(c, &rc))
    kiln_status_set(&st, rc, m->name, "the call's deadline passed before it was served");
  if (rc == 0 && m->kind != KILND_CLIENT_STREAM) {
    if (c->payload == NULL)
      rc = kiln_status_set(&st, KILN_EINVAL, m->name, "no request message");
    else
      rc = kilnd_rpc_unpack(c, c->payload, m->request, &c->req, &st);
    if (c->payload) {
      grpc_byte_buffer_destroy(c->payload);
      c->payload = NULL;
    }
  }
  if (rc) {
    kilnd_call_finish(c, NULL, rc, &st);
    return;
  }
  c->working = true;
  atomic_fetch_add(&c->srv->working, 1);
  m->handler(c, c->req);
}
