/* Hostile and broken requests against a real kilnd, sent on the raw gRPC
 * core so that the bytes are exactly what a bad client would send: garbage,
 * messages of the wrong type, no message at all, unknown methods, unknown
 * and foreign handles, malformed uploads (no header, truncated, oversized,
 * a second header, impossible shapes), messages over the size limits, a
 * client that disconnects in the middle of a stream, runs past their
 * deadline, quotas, idle sockets on the metrics port. Each must get the right status with a
 * message, and after each the server must still serve everyone else: every case ends by checking
 * health and a real compile + execute.
 *
 * The server runs with small limits (2 MiB messages, 1 MiB modules, 48 MiB
 * per client) so that the limits are cheap to reach.
 */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "clients/c/kiln.h"
#include "compiler/ir/text.h"
#include "kiln/v1/kiln.pb-c.h"
#include "tests/integration/itest.h"

static itest_kilnd server;

/* ---- the raw core ------------------------------------------------------------------ */

typedef struct raw_msg {
  const void *data;
  size_t len;
} raw_msg;

typedef struct raw_result {
  grpc_status_code code;
  char details[1024];
  int received; /* messages received */
} raw_result;

static grpc_channel *raw_channel(void) {
  grpc_arg arg = {.type = GRPC_ARG_INTEGER,
                  .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                  .value.integer = 64 << 20};
  grpc_channel_args args = {.num_args = 1, .args = &arg};
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  grpc_channel *ch = grpc_channel_create(server.addr, creds, &args);
  grpc_channel_credentials_release(creds);
  return ch;
}

static bool wait_tag(grpc_completion_queue *cq, void *tag) {
  grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static bool batch(grpc_call *call, grpc_completion_queue *cq, grpc_op *ops, size_t n) {
  if (grpc_call_start_batch(call, ops, n, (void *)1, NULL) != GRPC_CALL_OK) return false;
  return wait_tag(cq, (void *)1);
}

static bool send_bytes(grpc_call *call, grpc_completion_queue *cq, const void *p, size_t n) {
  grpc_slice s = grpc_slice_from_copied_buffer(p, n);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  grpc_op op = {.op = GRPC_OP_SEND_MESSAGE};
  op.data.send_message.send_message = bb;
  bool ok = batch(call, cq, &op, 1);
  grpc_byte_buffer_destroy(bb);
  return ok;
}

/* One call: initial metadata (kiln-client = client_id unless NULL), the
 * messages, a half-close (unless cancel_after_sends >= 0: then the call is
 * cancelled after that many messages went out), then every reply message
 * until the status. With cancel_after_recvs >= 0 the call is cancelled
 * once that many messages came back. */
static void raw_call(grpc_channel *ch, const char *method, const char *client_id,
                     const raw_msg *msgs, int n, int cancel_after_sends, int cancel_after_recvs,
                     int64_t deadline_ms, raw_result *r) {
  memset(r, 0, sizeof *r);
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  gpr_timespec deadline =
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(deadline_ms, GPR_TIMESPAN));
  grpc_call *call =
      grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                               grpc_slice_from_static_string(method), NULL, deadline, NULL);
  grpc_metadata md = {.key = grpc_slice_from_static_string("kiln-client"),
                      .value = grpc_slice_from_static_string(client_id ? client_id : "")};
  grpc_op op = {.op = GRPC_OP_SEND_INITIAL_METADATA};
  op.data.send_initial_metadata.count = client_id ? 1 : 0;
  op.data.send_initial_metadata.metadata = &md;
  bool alive = batch(call, cq, &op, 1);
  bool cancelled = false;
  for (int i = 0; alive && i < n; i++) {
    if (cancel_after_sends >= 0 && i == cancel_after_sends) break;
    alive = send_bytes(call, cq, msgs[i].data, msgs[i].len);
  }
  if (cancel_after_sends >= 0) {
    grpc_call_cancel(call, NULL);
    cancelled = true;
  } else if (alive) {
    grpc_op close = {.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT};
    batch(call, cq, &close, 1);
  }
  grpc_metadata_array imd, tmd;
  grpc_metadata_array_init(&imd);
  grpc_metadata_array_init(&tmd);
  grpc_op rim = {.op = GRPC_OP_RECV_INITIAL_METADATA};
  rim.data.recv_initial_metadata.recv_initial_metadata = &imd;
  batch(call, cq, &rim, 1);
  for (;;) {
    grpc_byte_buffer *bb = NULL;
    grpc_op rm = {.op = GRPC_OP_RECV_MESSAGE};
    rm.data.recv_message.recv_message = &bb;
    if (!batch(call, cq, &rm, 1) || bb == NULL) break;
    grpc_byte_buffer_destroy(bb);
    r->received++;
    if (!cancelled && cancel_after_recvs >= 0 && r->received >= cancel_after_recvs) {
      grpc_call_cancel(call, NULL);
      cancelled = true;
    }
  }
  grpc_slice details = grpc_empty_slice();
  const char *err = NULL;
  grpc_op rs = {.op = GRPC_OP_RECV_STATUS_ON_CLIENT};
  rs.data.recv_status_on_client.trailing_metadata = &tmd;
  rs.data.recv_status_on_client.status = &r->code;
  rs.data.recv_status_on_client.status_details = &details;
  rs.data.recv_status_on_client.error_string = &err;
  batch(call, cq, &rs, 1);
  snprintf(r->details, sizeof r->details, "%.*s", (int)GRPC_SLICE_LENGTH(details),
           (const char *)GRPC_SLICE_START_PTR(details));
  grpc_slice_unref(details);
  if (err) gpr_free((void *)err);
  grpc_metadata_array_destroy(&imd);
  grpc_metadata_array_destroy(&tmd);
  grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

static const char *code_name(grpc_status_code c) { return kiln_rpc_code_name((kiln_rpc_code)c); }

#define EXPECT(r, want, what) \
  ck_assert_msg((r).code == (want) && ((want) == GRPC_STATUS_OK || (r).details[0] != '\0'), \
                "%s: expected %s, got %s: '%s'", what, code_name(want), code_name((r).code), \
                (r).details)

/* ---- helpers through libkiln --------------------------------------------------------- */

static const char axpy[] = "HloModule axpy\nENTRY e {\n  a = f32[] parameter(0)\n"
                           "  x = f32[4] parameter(1)\n  y = f32[4] parameter(2)\n"
                           "  ab = f32[4] broadcast(a), dimensions={}\n"
                           "  ax = f32[4] multiply(ab, x)\n  ROOT r = f32[4] add(ax, y)\n}\n";

static kiln_client *connect_as(const char *id) {
  kiln_client_options o = {.client_id = id};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_client *c = NULL;
  ck_assert_msg(kiln_client_connect(server.addr, &o, &c, &st) == 0, "connect: %s", st.msg);
  return c;
}

static kiln_literal *lit(const char *text) {
  kiln_literal *l;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_literal_parse_text(text, strlen(text), &l, &st) == 0, "%s", st.msg);
  return l;
}

/* Health, then a compile and an execution that must give the right answer. */
static void still_serving(void) {
  ck_assert_msg(itest_kilnd_alive(&server), "kilnd died");
  kiln_client *c = connect_as("bystander");
  kiln_status st;
  kiln_status_clear(&st);
  bool serving = false;
  ck_assert_msg(kiln_client_health(c, NULL, &serving, &st) == 0 && serving, "health: %s", st.msg);
  kiln_remote_compile_options o = {.backend = "interp"};
  kiln_remote_executable *e;
  ck_assert_msg(kiln_client_compile_text(c, axpy, strlen(axpy), &o, &e, &st) == 0, "%s", st.msg);
  kiln_literal *a = lit("f32[] 2"), *x = lit("f32[4] {1, 2, 3, 4}");
  kiln_remote_arg args[3] = {{.literal = a}, {.literal = x}, {.literal = x}};
  kiln_remote_execute_options xo = {.deadline_ms = 20000};
  kiln_remote_result r;
  ck_assert_msg(kiln_client_execute(c, e->id, args, 3, &xo, &r, &st) == 0, "execute: %s: %s",
                st.where, st.msg);
  const float *v = r.outputs[0].literal->data;
  ck_assert(v[0] == 3 && v[3] == 12);
  kiln_remote_result_free(&r);
  kiln_literal_destroy(a);
  kiln_literal_destroy(x);
  kiln_remote_executable_free(e);
  kiln_client_close(c);
}

static void live(int64_t *buffers, int64_t *bytes) {
  kiln_client *c = connect_as("observer");
  kiln_server_stats s;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_stats(c, &s, &st), 0);
  *buffers = s.live_buffers;
  *bytes = s.live_buffer_bytes;
  kiln_server_stats_clear(&s);
  kiln_client_close(c);
}

/* A packed PutBufferChunk with a header for `dims` of element type t. */
static uint8_t *header_msg(int t, const int64_t *dims, size_t rank, size_t *len) {
  Kiln__V1__Shape shape;
  kiln__v1__shape__init(&shape);
  shape.element_type = (Kiln__V1__ElementType)t;
  shape.dimensions = (int64_t *)dims;
  shape.n_dimensions = rank;
  Kiln__V1__PutBufferHeader h;
  kiln__v1__put_buffer_header__init(&h);
  h.shape = &shape;
  Kiln__V1__PutBufferChunk c;
  kiln__v1__put_buffer_chunk__init(&c);
  c.header = &h;
  *len = kiln__v1__put_buffer_chunk__get_packed_size(&c);
  uint8_t *buf = malloc(*len);
  kiln__v1__put_buffer_chunk__pack(&c, buf);
  return buf;
}

static uint8_t *data_msg(size_t n, size_t *len) {
  Kiln__V1__PutBufferChunk c;
  kiln__v1__put_buffer_chunk__init(&c);
  uint8_t *data = calloc(1, n ? n : 1);
  c.data.data = data;
  c.data.len = n;
  *len = kiln__v1__put_buffer_chunk__get_packed_size(&c);
  uint8_t *buf = malloc(*len);
  kiln__v1__put_buffer_chunk__pack(&c, buf);
  free(data);
  return buf;
}

/* ---- cases --------------------------------------------------------------------------- */

static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x13, 0x37};

START_TEST(test_garbage_bytes) {
  grpc_init();
  grpc_channel *ch = raw_channel();
  const char *methods[] = {"/kiln.v1.Kiln/Compile",       "/kiln.v1.Kiln/Execute",
                           "/kiln.v1.Kiln/GetBuffer",     "/kiln.v1.Kiln/ReleaseBuffers",
                           "/kiln.v1.Kiln/Stats",         "/kiln.v1.Kiln/PutBuffer",
                           "/grpc.health.v1.Health/Check"};
  raw_msg m = {garbage, sizeof garbage};
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
    raw_result r;
    raw_call(ch, methods[i], "hostile", &m, 1, -1, -1, 10000, &r);
    char what[128];
    snprintf(what, sizeof what, "garbage to %s", methods[i]);
    EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, what);
  }
  grpc_channel_destroy(ch);
  grpc_shutdown();
  still_serving();
}
END_TEST

START_TEST(test_wrong_and_missing_messages) {
  grpc_init();
  grpc_channel *ch = raw_channel();
  raw_result r;
  /* An ExecuteRequest sent to Compile: its id reads as HLO text and its
   * argument as a module. */
  Kiln__V1__ExecuteRequest ex;
  kiln__v1__execute_request__init(&ex);
  ex.executable_id = "abc";
  Kiln__V1__Argument arg, *argp = &arg;
  kiln__v1__argument__init(&arg);
  arg.value_case = KILN__V1__ARGUMENT__VALUE_BUFFER_HANDLE;
  arg.buffer_handle = "h";
  ex.arguments = &argp;
  ex.n_arguments = 1;
  uint8_t buf[256];
  size_t n = kiln__v1__execute_request__pack(&ex, buf);
  raw_msg m = {buf, n};
  raw_call(ch, "/kiln.v1.Kiln/Compile", "hostile", &m, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "ExecuteRequest to Compile");
  /* Empty messages: nothing to compile, no executable, no handle. */
  raw_msg empty = {"", 0};
  raw_call(ch, "/kiln.v1.Kiln/Compile", "hostile", &empty, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "empty CompileRequest");
  raw_call(ch, "/kiln.v1.Kiln/PutBuffer", "hostile", NULL, 0, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "PutBuffer without any message");
  /* No message at all on unary methods. */
  raw_call(ch, "/kiln.v1.Kiln/Compile", "hostile", NULL, 0, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "Compile without a message");
  raw_call(ch, "/kiln.v1.Kiln/Execute", "hostile", NULL, 0, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "Execute without a message");
  /* A handle that is not UTF-8. */
  const uint8_t bad_utf8[] = {0x0a, 0x02, 0xff, 0xfe};
  raw_msg bu = {bad_utf8, sizeof bad_utf8};
  raw_call(ch, "/kiln.v1.Kiln/GetBuffer", "hostile", &bu, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "GetBuffer handle not UTF-8");
  /* A field of the wrong wire type (handle as a varint). */
  const uint8_t wire[] = {0x08, 0x01};
  raw_msg wm = {wire, sizeof wire};
  raw_call(ch, "/kiln.v1.Kiln/GetBuffer", "hostile", &wm, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "GetBuffer handle as a varint");
  /* Messages nested far deeper than any real module. */
  size_t depth = 20000, len = 0;
  uint8_t *deep = malloc(depth * 6);
  size_t inner = 0;
  for (size_t i = 0; i < depth; i++) { /* field 2 (module), nested in field 2 ... */
    uint8_t head[6];
    size_t h = 0;
    head[h++] = 0x12;
    size_t v = inner;
    do {
      head[h++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
      v >>= 7;
    } while (v);
    memmove(deep + h, deep, len);
    memcpy(deep, head, h);
    len += h;
    inner = len;
  }
  raw_msg dm = {deep, len};
  raw_call(ch, "/kiln.v1.Kiln/Compile", "hostile", &dm, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "messages nested 20,000 deep");
  free(deep);
  /* No executable id or handle is a malformed request, not a lookup that
   * failed. */
  raw_call(ch, "/kiln.v1.Kiln/GetBuffer", "hostile", &empty, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "empty GetBufferRequest");
  raw_call(ch, "/kiln.v1.Kiln/Execute", "hostile", &empty, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "empty ExecuteRequest");
  grpc_channel_destroy(ch);
  grpc_shutdown();
  still_serving();
}
END_TEST

START_TEST(test_unknown_methods_and_identity) {
  grpc_init();
  grpc_channel *ch = raw_channel();
  raw_result r;
  raw_msg empty = {"", 0};
  raw_call(ch, "/kiln.v1.Kiln/Frobnicate", "hostile", &empty, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_UNIMPLEMENTED, "unknown method");
  raw_call(ch, "/other.Service/Call", "hostile", &empty, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_UNIMPLEMENTED, "unknown service");
  char id[201];
  memset(id, 'x', 200);
  id[200] = '\0';
  raw_call(ch, "/kiln.v1.Kiln/Stats", id, &empty, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "a 200-byte kiln-client");
  /* No kiln-client at all is allowed (the peer address stands in). */
  raw_call(ch, "/kiln.v1.Kiln/Stats", NULL, &empty, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_OK, "Stats without kiln-client");
  grpc_channel_destroy(ch);
  grpc_shutdown();
  still_serving();
}
END_TEST

START_TEST(test_unknown_and_foreign_handles) {
  kiln_client *a = connect_as("owner"), *b = connect_as("thief");
  kiln_status st;
  kiln_status_clear(&st);
  kiln_literal *x = lit("f32[4] {1, 2, 3, 4}"), *out = NULL;
  kiln_remote_buffer h;
  ck_assert_int_eq(kiln_client_put_buffer(a, x, NULL, &h, &st), 0);
  ck_assert_int_eq(kiln_client_get_buffer(b, h.handle, NULL, &out, &st), KILN_ENOTFOUND);
  ck_assert_int_eq(kiln_rpc_status_code(&st), KILN_RPC_NOT_FOUND);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_get_buffer(b, "00000000000000000000000000000000", NULL, &out, &st),
                   KILN_ENOTFOUND);
  kiln_status_clear(&st);
  /* A donation of someone else's buffer must not free it. */
  kiln_remote_compile_options o = {.backend = "interp"};
  kiln_remote_executable *e;
  ck_assert_int_eq(kiln_client_compile_text(b, axpy, strlen(axpy), &o, &e, &st), 0);
  kiln_literal *s = lit("f32[] 1");
  kiln_remote_arg args[3] = {{.literal = s}, {.handle = h.handle, .donate = true}, {.literal = x}};
  kiln_remote_result r;
  ck_assert_int_eq(kiln_client_execute(b, e->id, args, 3, NULL, &r, &st), KILN_ENOTFOUND);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_get_buffer(a, h.handle, NULL, &out, &st), 0);
  kiln_literal_destroy(out);
  /* A handle twice in one call, donated: refused, not freed twice. */
  kiln_remote_arg twice[3] = {
      {.literal = s}, {.handle = h.handle, .donate = true}, {.handle = h.handle, .donate = true}};
  int rc = kiln_client_execute(a, e->id, twice, 3, NULL, &r, &st);
  if (rc == 0) kiln_remote_result_free(&r);
  ck_assert_msg(rc == KILN_EINVAL, "the same handle donated twice: rc %d %s: %s", rc, st.where,
                st.msg);
  kiln_status_clear(&st);
  const char *hs[1] = {h.handle};
  kiln_client_release_buffers(a, hs, 1, NULL, NULL, &st);
  kiln_remote_buffer_clear(&h);
  kiln_remote_executable_free(e);
  kiln_literal_destroy(s);
  kiln_literal_destroy(x);
  kiln_client_close(a);
  kiln_client_close(b);
  still_serving();
}
END_TEST

START_TEST(test_bad_uploads) {
  int64_t b0, y0;
  live(&b0, &y0);
  grpc_init();
  grpc_channel *ch = raw_channel();
  raw_result r;
  size_t hl, dl, d2l, sl;
  int64_t four[1] = {4};
  uint8_t *head = header_msg(16 /* F32 */, four, 1, &hl);
  uint8_t *d12 = data_msg(12, &dl), *d20 = data_msg(20, &d2l), *d16 = data_msg(16, &sl);
  raw_msg no_header[1] = {{d16, sl}};
  raw_call(ch, "/kiln.v1.Kiln/PutBuffer", "uploader", no_header, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "data before any header");
  raw_msg truncated[2] = {{head, hl}, {d12, dl}};
  raw_call(ch, "/kiln.v1.Kiln/PutBuffer", "uploader", truncated, 2, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "12 bytes for f32[4]");
  raw_msg oversized[2] = {{head, hl}, {d20, d2l}};
  raw_call(ch, "/kiln.v1.Kiln/PutBuffer", "uploader", oversized, 2, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "20 bytes for f32[4]");
  raw_msg two_headers[3] = {{head, hl}, {d16, sl}, {head, hl}};
  raw_call(ch, "/kiln.v1.Kiln/PutBuffer", "uploader", two_headers, 3, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "a second header");
  raw_msg header_only[1] = {{head, hl}};
  raw_call(ch, "/kiln.v1.Kiln/PutBuffer", "uploader", header_only, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "a header and no data");

  size_t tl, bl, nl, hugel;
  uint8_t *tuple = header_msg(30 /* TUPLE */, NULL, 0, &tl);
  uint8_t *badt = header_msg(99, four, 1, &bl);
  int64_t neg[1] = {-4}, huge[2] = {INT64_C(1) << 20, INT64_C(1) << 20};
  uint8_t *negh = header_msg(16, neg, 1, &nl);
  uint8_t *hugeh = header_msg(16, huge, 2, &hugel);
  raw_msg m1[1] = {{tuple, tl}}, m2[1] = {{badt, bl}}, m3[1] = {{negh, nl}},
          m4[2] = {{hugeh, hugel}, {d16, sl}};
  raw_call(ch, "/kiln.v1.Kiln/PutBuffer", "uploader", m1, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "a tuple shape");
  raw_call(ch, "/kiln.v1.Kiln/PutBuffer", "uploader", m2, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "element type 99");
  raw_call(ch, "/kiln.v1.Kiln/PutBuffer", "uploader", m3, 1, -1, -1, 10000, &r);
  EXPECT(r, GRPC_STATUS_INVALID_ARGUMENT, "a negative dimension");
  raw_call(ch, "/kiln.v1.Kiln/PutBuffer", "uploader", m4, 2, -1, -1, 10000, &r);
  ck_assert_msg(r.code == GRPC_STATUS_RESOURCE_EXHAUSTED || r.code == GRPC_STATUS_INVALID_ARGUMENT,
                "f32[2^20,2^20] (4 TiB): got %s: %s", code_name(r.code), r.details);
  ck_assert(r.details[0]);
  free(head), free(d12), free(d20), free(d16), free(tuple), free(badt), free(negh), free(hugeh);
  grpc_channel_destroy(ch);
  grpc_shutdown();
  int64_t b1, y1;
  live(&b1, &y1);
  ck_assert_int_eq(b1, b0);
  ck_assert_int_eq(y1, y0);
  still_serving();
}
END_TEST

START_TEST(test_size_limits) {
  grpc_init();
  grpc_channel *ch = raw_channel();
  raw_result r;
  /* One message over --max-message-bytes (2 MiB). */
  size_t n = 3u << 20;
  char *text = malloc(n + 1);
  memset(text, ' ', n);
  memcpy(text, "HloModule m", 11);
  text[n] = '\0';
  Kiln__V1__CompileRequest req;
  kiln__v1__compile_request__init(&req);
  req.program_case = KILN__V1__COMPILE_REQUEST__PROGRAM_HLO_TEXT;
  req.hlo_text = text;
  size_t len = kiln__v1__compile_request__get_packed_size(&req);
  uint8_t *buf = malloc(len);
  kiln__v1__compile_request__pack(&req, buf);
  raw_msg m = {buf, len};
  raw_call(ch, "/kiln.v1.Kiln/Compile", "big", &m, 1, -1, -1, 20000, &r);
  EXPECT(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "a 3 MiB Compile message");
  size_t hl, dl;
  int64_t dims[1] = {1 << 20};
  uint8_t *head = header_msg(16, dims, 1, &hl), *data = data_msg(4u << 20, &dl);
  raw_msg put[2] = {{head, hl}, {data, dl}};
  raw_call(ch, "/kiln.v1.Kiln/PutBuffer", "big", put, 2, -1, -1, 20000, &r);
  EXPECT(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "a 4 MiB PutBuffer chunk");
  free(head), free(data);
  /* Under the message limit, over --max-module-bytes (1 MiB). */
  text[(3u << 19)] = '\0';
  req.hlo_text = text;
  len = kiln__v1__compile_request__get_packed_size(&req);
  kiln__v1__compile_request__pack(&req, buf);
  m.len = len;
  raw_call(ch, "/kiln.v1.Kiln/Compile", "big", &m, 1, -1, -1, 20000, &r);
  EXPECT(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "a 1.5 MiB module");
  free(buf);
  free(text);
  grpc_channel_destroy(ch);
  grpc_shutdown();
  still_serving();
}
END_TEST

START_TEST(test_quota) {
  kiln_client *c = connect_as("greedy");
  kiln_arena *a = kiln_arena_create();
  kiln_shape shape;
  int64_t n = (INT64_C(20) << 20) / 4; /* 20 MiB each; the quota is 48 MiB */
  kiln_shape_make_array(a, &shape, KILN_F32, &n, 1);
  void *data = calloc(1, (size_t)n * 4);
  kiln_remote_buffer h[3];
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_put_buffer_raw(c, &shape, data, (size_t)n * 4, NULL, &h[0], &st), 0);
  ck_assert_int_eq(kiln_client_put_buffer_raw(c, &shape, data, (size_t)n * 4, NULL, &h[1], &st), 0);
  int rc = kiln_client_put_buffer_raw(c, &shape, data, (size_t)n * 4, NULL, &h[2], &st);
  ck_assert_msg(rc == KILN_ELIMIT && kiln_rpc_status_code(&st) == KILN_RPC_RESOURCE_EXHAUSTED,
                "third 20 MiB buffer over a 48 MiB quota: rc %d %s: %s", rc, st.where, st.msg);
  /* Someone else is not affected by this client's quota. */
  kiln_client *d = connect_as("modest");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_put_buffer_raw(d, &shape, data, (size_t)n * 4, NULL, &h[2], &st), 0);
  const char *hd[1] = {h[2].handle};
  ck_assert_int_eq(kiln_client_release_buffers(d, hd, 1, NULL, NULL, &st), 0);
  kiln_remote_buffer_clear(&h[2]);
  kiln_client_close(d);
  /* Releasing makes room again. */
  const char *hs[1] = {h[0].handle};
  ck_assert_int_eq(kiln_client_release_buffers(c, hs, 1, NULL, NULL, &st), 0);
  ck_assert_int_eq(kiln_client_put_buffer_raw(c, &shape, data, (size_t)n * 4, NULL, &h[2], &st), 0);
  const char *rest[2] = {h[1].handle, h[2].handle};
  ck_assert_int_eq(kiln_client_release_buffers(c, rest, 2, NULL, NULL, &st), 0);
  for (int i = 0; i < 3; i++) kiln_remote_buffer_clear(&h[i]);
  free(data);
  kiln_arena_destroy(a);
  kiln_client_close(c);
  still_serving();
}
END_TEST

START_TEST(test_disconnect_mid_upload) {
  int64_t b0, y0;
  live(&b0, &y0);
  grpc_init();
  grpc_channel *ch = raw_channel();
  raw_result r;
  size_t hl, dl;
  int64_t dims[1] = {(INT64_C(8) << 20) / 4};
  uint8_t *head = header_msg(16, dims, 1, &hl), *data = data_msg(1u << 20, &dl);
  raw_msg msgs[4] = {{head, hl}, {data, dl}, {data, dl}, {data, dl}};
  raw_call(ch, "/kiln.v1.Kiln/PutBuffer", "leaver", msgs, 4, 3, -1, 20000, &r);
  ck_assert_int_eq(r.code, GRPC_STATUS_CANCELLED);
  /* The same, but the whole connection goes away. */
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_call *call =
      grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                               grpc_slice_from_static_string("/kiln.v1.Kiln/PutBuffer"), NULL,
                               gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  grpc_op op = {.op = GRPC_OP_SEND_INITIAL_METADATA};
  batch(call, cq, &op, 1);
  send_bytes(call, cq, head, hl);
  send_bytes(call, cq, data, dl);
  grpc_channel_destroy(ch); /* with the call still open */
  grpc_call_cancel(call, NULL);
  grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  free(head), free(data);
  grpc_shutdown();
  /* Nothing half-uploaded survives (give the server a moment to notice). */
  int64_t b1 = -1, y1 = -1;
  for (int i = 0; i < 50; i++) {
    live(&b1, &y1);
    if (b1 == b0 && y1 == y0) break;
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
  }
  ck_assert_int_eq(b1, b0);
  ck_assert_int_eq(y1, y0);
  still_serving();
}
END_TEST

START_TEST(test_disconnect_mid_download) {
  kiln_client *c = connect_as("reader");
  kiln_arena *a = kiln_arena_create();
  kiln_shape shape;
  int64_t n = (INT64_C(8) << 20) / 4;
  kiln_shape_make_array(a, &shape, KILN_U32, &n, 1);
  uint32_t *data = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) data[i] = (uint32_t)i;
  kiln_remote_buffer h;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_put_buffer_raw(c, &shape, data, (size_t)n * 4, NULL, &h, &st), 0);
  grpc_init();
  grpc_channel *ch = raw_channel();
  Kiln__V1__GetBufferRequest req;
  kiln__v1__get_buffer_request__init(&req);
  req.handle = h.handle;
  req.chunk_bytes = 65536;
  uint8_t buf[256];
  raw_msg m = {buf, kiln__v1__get_buffer_request__pack(&req, buf)};
  raw_result r;
  raw_call(ch, "/kiln.v1.Kiln/GetBuffer", "reader", &m, 1, -1, 3, 20000, &r);
  ck_assert_int_eq(r.code, GRPC_STATUS_CANCELLED);
  ck_assert_int_ge(r.received, 3);
  grpc_channel_destroy(ch);
  grpc_shutdown();
  /* The buffer is intact and whole for the next reader. */
  uint32_t *back = malloc((size_t)n * 4);
  size_t got;
  ck_assert_int_eq(
      kiln_client_get_buffer_raw(c, h.handle, NULL, back, (size_t)n * 4, &got, NULL, &st), 0);
  ck_assert(got == (size_t)n * 4 && memcmp(back, data, got) == 0);
  const char *hs[1] = {h.handle};
  ck_assert_int_eq(kiln_client_release_buffers(c, hs, 1, NULL, NULL, &st), 0);
  kiln_remote_buffer_clear(&h);
  free(back);
  free(data);
  kiln_arena_destroy(a);
  kiln_client_close(c);
  still_serving();
}
END_TEST

START_TEST(test_deadlines) {
  kiln_client *c = connect_as("impatient");
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_compile_options o = {.backend = "interp"};
  kiln_remote_executable *e;
  ck_assert_msg(kiln_client_compile_text(c, itest_spin_hlo, strlen(itest_spin_hlo), &o, &e, &st) ==
                    0,
                "%s", st.msg);
  kiln_literal *big = lit("s32[] 2000000000");
  kiln_remote_arg args[1] = {{.literal = big}};
  /* More runs than the server has interpreter devices: each must be
   * stopped, or the devices stay busy and still_serving times out. */
  for (int i = 0; i < 4; i++) {
    kiln_remote_execute_options xo = {.deadline_ms = 300};
    kiln_remote_result r;
    kiln_status_clear(&st);
    double t0 = itest_now();
    int rc = kiln_client_execute(c, e->id, args, 1, &xo, &r, &st);
    ck_assert_msg(rc == KILN_EDEADLINE && kiln_rpc_status_code(&st) == KILN_RPC_DEADLINE_EXCEEDED,
                  "run %d: rc %d %s: %s", i, rc, st.where, st.msg);
    ck_assert_msg(itest_now() - t0 < 5, "the deadline took %.1f s", itest_now() - t0);
  }
  kiln_literal_destroy(big);
  kiln_remote_executable_free(e);
  kiln_client_close(c);
  double t0 = itest_now();
  still_serving();
  ck_assert_msg(itest_now() - t0 < 10, "the server needed %.1f s to serve again", itest_now() - t0);
}
END_TEST

START_TEST(test_too_many_arguments) {
  kiln_client *c = connect_as("verbose");
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_compile_options o = {.backend = "interp"};
  kiln_remote_executable *e;
  ck_assert_int_eq(kiln_client_compile_text(c, axpy, strlen(axpy), &o, &e, &st), 0);
  kiln_literal *s = lit("f32[] 1");
  enum { NARGS = 10000 };
  kiln_remote_arg *args = calloc(NARGS, sizeof *args);
  for (int i = 0; i < NARGS; i++) args[i].literal = s;
  kiln_remote_result r;
  ck_assert_int_eq(kiln_client_execute(c, e->id, args, NARGS, NULL, &r, &st), KILN_EINVAL);
  ck_assert_int_eq(kiln_rpc_status_code(&st), KILN_RPC_INVALID_ARGUMENT);
  free(args);
  kiln_literal_destroy(s);
  kiln_remote_executable_free(e);
  kiln_client_close(c);
  still_serving();
}
END_TEST

/* A TCP connection to addr ("HOST:PORT"), or -1. */
static int tcp_connect(const char *addr) {
  char host[128];
  snprintf(host, sizeof host, "%s", addr);
  char *colon = strrchr(host, ':');
  if (colon == NULL) return -1;
  *colon = '\0';
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return -1;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* 100 sockets held open on the metrics port without a request (one with
 * half a request head) do not stall /metrics: each scrape meanwhile is
 * answered at once; the half request is closed by its read deadline. */
START_TEST(test_metrics_idle_sockets) {
  ck_assert_msg(server.metrics[0], "no metrics address");
  enum { NIDLE = 100 };
  int idle[NIDLE];
  for (int i = 0; i < NIDLE; i++) {
    idle[i] = tcp_connect(server.metrics);
    ck_assert_int_ge(idle[i], 0);
  }
  int half = NIDLE - 1; /* the newest: scrapes push out older idle ones first */
  ck_assert_int_eq(write(idle[half], "GET /metr", 9), 9);
  for (int k = 0; k < 5; k++) {
    double t0 = itest_now();
    int status = 0;
    char *body = NULL;
    size_t len = 0;
    ck_assert_int_eq(itest_http_get(server.metrics, "/metrics", &status, &body, &len), 0);
    ck_assert_int_eq(status, 200);
    ck_assert_ptr_nonnull(strstr(body, "kiln_"));
    free(body);
    ck_assert_msg(itest_now() - t0 < 2.0, "scrape %d took %.2f s behind idle sockets", k,
                  itest_now() - t0);
  }
  /* The half request gets no answer and is closed within its deadline. */
  struct timeval tv = {.tv_sec = 15};
  setsockopt(idle[half], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  double t0 = itest_now();
  char b[64];
  ssize_t n = read(idle[half], b, sizeof b);
  ck_assert_int_eq(n, 0); /* closed by the server, not our receive timeout */
  ck_assert_msg(itest_now() - t0 < 12.0, "half a request held %.2f s", itest_now() - t0);
  /* Older idle sockets made room for the scrapes: the oldest is closed. */
  ck_assert_int_eq(read(idle[0], b, sizeof b), 0);
  for (int i = 0; i < NIDLE; i++) close(idle[i]);
  still_serving();
}
END_TEST

int main(void) {
  itest_require_kilnd("test_hostile");
  const char *extra[] = {"--max-message-bytes",
                         "2Mi",
                         "--max-module-bytes",
                         "1Mi",
                         "--client-memory-bytes",
                         "48Mi",
                         "--interp-devices",
                         "2",
                         NULL};
  if (itest_kilnd_start(&server, extra)) return 1;
  Suite *s = suite_create("hostile");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_garbage_bytes);
  tcase_add_test(tc, test_wrong_and_missing_messages);
  tcase_add_test(tc, test_unknown_methods_and_identity);
  tcase_add_test(tc, test_unknown_and_foreign_handles);
  tcase_add_test(tc, test_bad_uploads);
  tcase_add_test(tc, test_size_limits);
  tcase_add_test(tc, test_quota);
  tcase_add_test(tc, test_disconnect_mid_upload);
  tcase_add_test(tc, test_disconnect_mid_download);
  tcase_add_test(tc, test_deadlines);
  tcase_add_test(tc, test_too_many_arguments);
  tcase_add_test(tc, test_metrics_idle_sockets);
  suite_add_tcase(s, tc);
  return itest_run_suite("test_hostile", s, &server);
}
