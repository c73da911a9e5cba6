/* PutBuffer's chunk messages as kilnd reads them: field by field, straight
 * from the received slices. Hand-encoded messages check that it means what
 * protobuf means: a data field before the header in the same message, the
 * last of two data fields winning, unknown fields of every wire type
 * skipped, a header given in two pieces merged; and that broken encodings
 * (a header that is not length-delimited, a length past the end, a varint
 * that never ends) are INVALID_ARGUMENT, with nothing stored. Stored bytes
 * are read back through libkiln.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "clients/c/kiln.h"
#include "kiln/v1/kiln.pb-c.h"
#include "tests/integration/itest.h"

static itest_kilnd server;

/* ---- hand encoding ----------------------------------------------------------------- */

typedef struct wbuf {
  uint8_t b[512];
  size_t n;
} wbuf;

static void put_varint(wbuf *w, uint64_t v) {
  do {
    w->b[w->n++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
    v >>= 7;
  } while (v);
}

static void put_bytes(wbuf *w, uint32_t field, const void *p, size_t n) {
  put_varint(w, field << 3 | 2);
  put_varint(w, n);
  memcpy(w->b + w->n, p, n);
  w->n += n;
}

/* A PutBufferHeader for f32[dims...] on device 0 (Shape field 1: type,
 * field 2: packed dimensions). */
static wbuf header_msg(const int64_t *dims, int rank) {
  wbuf shape = {0}, packed = {0}, h = {0};
  put_varint(&shape, 1 << 3 | 0);
  put_varint(&shape, KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_F32);
  for (int i = 0; i < rank; i++) put_varint(&packed, (uint64_t)dims[i]);
  put_bytes(&shape, 2, packed.b, packed.n);
  put_bytes(&h, 1, shape.b, shape.n);
  return h;
}

/* A PutBufferChunk holding just that header (field 1). */
static wbuf header(const int64_t *dims, int rank) {
  wbuf h = header_msg(dims, rank), m = {0};
  put_bytes(&m, 1, h.b, h.n);
  return m;
}

/* ---- one PutBuffer call on the raw core ------------------------------------------- */

typedef struct put_result {
  grpc_status_code code;
  char details[512];
  char handle[64]; /* from the reply's BufferInfo */
} put_result;

static bool batch(grpc_call *call, grpc_completion_queue *cq, grpc_op *ops, size_t n) {
  if (grpc_call_start_batch(call, ops, n, ops, NULL) != GRPC_CALL_OK) return false;
  return grpc_completion_queue_pluck(cq, ops, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).success;
}

static void reply_handle(grpc_byte_buffer *bb, put_result *r) {
  grpc_byte_buffer_reader rd;
  ck_assert(grpc_byte_buffer_reader_init(&rd, bb));
  grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
  grpc_byte_buffer_reader_destroy(&rd);
  Kiln__V1__PutBufferResponse *resp =
      kiln__v1__put_buffer_response__unpack(NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
  ck_assert(resp != NULL && resp->buffer != NULL);
  snprintf(r->handle, sizeof r->handle, "%s", resp->buffer->handle);
  kiln__v1__put_buffer_response__free_unpacked(resp, NULL);
  grpc_slice_unref(s);
}

static void put_call(const wbuf *msgs, int n, put_result *r) {
  memset(r, 0, sizeof *r);
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  grpc_channel *ch = grpc_channel_create(server.addr, creds, NULL);
  grpc_channel_credentials_release(creds);
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_call *call = grpc_channel_create_call(
      ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
      grpc_slice_from_static_string("/kiln.v1.Kiln/PutBuffer"), NULL,
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(20, GPR_TIMESPAN)), NULL);
  grpc_metadata md = {.key = grpc_slice_from_static_string("kiln-client"),
                      .value = grpc_slice_from_static_string("wire")};
  grpc_op op = {.op = GRPC_OP_SEND_INITIAL_METADATA};
  op.data.send_initial_metadata.count = 1;
  op.data.send_initial_metadata.metadata = &md;
  bool alive = batch(call, cq, &op, 1);
  for (int i = 0; alive && i < n; i++) {
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)msgs[i].b, msgs[i].n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_op send = {.op = GRPC_OP_SEND_MESSAGE};
    send.data.send_message.send_message = bb;
    alive = batch(call, cq, &send, 1);
    grpc_byte_buffer_destroy(bb);
  }
  grpc_op close = {.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT};
  if (alive) batch(call, cq, &close, 1);
  grpc_metadata_array imd, tmd;
  grpc_metadata_array_init(&imd);
  grpc_metadata_array_init(&tmd);
  grpc_byte_buffer *reply = NULL;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[3] = {{.op = GRPC_OP_RECV_INITIAL_METADATA},
                    {.op = GRPC_OP_RECV_MESSAGE},
                    {.op = GRPC_OP_RECV_STATUS_ON_CLIENT}};
  ops[0].data.recv_initial_metadata.recv_initial_metadata = &imd;
  ops[1].data.recv_message.recv_message = &reply;
  ops[2].data.recv_status_on_client.trailing_metadata = &tmd;
  ops[2].data.recv_status_on_client.status = &r->code;
  ops[2].data.recv_status_on_client.status_details = &details;
  batch(call, cq, ops, 3);
  snprintf(r->details, sizeof r->details, "%.*s", (int)GRPC_SLICE_LENGTH(details),
           (const char *)GRPC_SLICE_START_PTR(details));
  if (reply) {
    if (r->code == GRPC_STATUS_OK) reply_handle(reply, r);
    grpc_byte_buffer_destroy(reply);
  }
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&imd);
  grpc_metadata_array_destroy(&tmd);
  grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  grpc_channel_destroy(ch);
}

/* The stored bytes of `handle` (released afterwards) equal want[0..n). */
static void expect_stored(const char *handle, const float *want, size_t n) {
  kiln_client_options o = {.client_id = "wire"};
  kiln_client *c = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_connect(server.addr, &o, &c, &st) == 0, "%s", st.msg);
  float got[16] = {0};
  size_t nbytes = 0;
  kiln_remote_get_options go = {.release = true};
  ck_assert_msg(kiln_client_get_buffer_raw(c, handle, &go, got, sizeof got, &nbytes, NULL, &st) ==
                    0,
                "%s", st.msg);
  ck_assert_uint_eq(nbytes, n * sizeof(float));
  for (size_t i = 0; i < n; i++) ck_assert_float_eq(got[i], want[i]);
  kiln_client_close(c);
}

#define EXPECT_OK(r) \
  ck_assert_msg((r).code == GRPC_STATUS_OK, "code %d: %s", (int)(r).code, (r).details)

#define EXPECT_INVALID(r, text) \
  do { \
    ck_assert_msg((r).code == GRPC_STATUS_INVALID_ARGUMENT, "code %d: %s", (int)(r).code, \
                  (r).details); \
    ck_assert_msg(strstr((r).details, text) != NULL, "details: %s", (r).details); \
  } while (0)

static const float a2[2] = {1.5f, -2.0f}, b2[2] = {7.0f, 8.25f}, c4[4] = {1, 2, 3, 4};
static const int64_t two[1] = {2}, four[1] = {4};

/* ---- cases ------------------------------------------------------------------------- */

START_TEST(test_data_before_header) {
  grpc_init();
  wbuf h = header_msg(two, 1), m = {0};
  put_bytes(&m, 2, a2, sizeof a2); /* data first */
  put_bytes(&m, 1, h.b, h.n);      /* then the header */
  put_result r;
  put_call(&m, 1, &r);
  EXPECT_OK(r);
  expect_stored(r.handle, a2, 2);
  grpc_shutdown();
}
END_TEST

START_TEST(test_last_data_wins_and_unknown_fields) {
  grpc_init();
  wbuf m = header(two, 1);
  put_varint(&m, 7 << 3 | 0); /* unknown varint */
  put_varint(&m, 300);
  put_bytes(&m, 2, a2, sizeof a2);
  put_varint(&m, 9 << 3 | 5); /* unknown fixed32 */
  memset(m.b + m.n, 0xee, 4);
  m.n += 4;
  put_varint(&m, 11 << 3 | 1); /* unknown fixed64 */
  memset(m.b + m.n, 0xdd, 8);
  m.n += 8;
  put_bytes(&m, 10, "skip me", 7); /* unknown length-delimited */
  put_bytes(&m, 2, b2, sizeof b2); /* the last data field wins */
  put_result r;
  put_call(&m, 1, &r);
  EXPECT_OK(r);
  expect_stored(r.handle, b2, 2);
  grpc_shutdown();
}
END_TEST

START_TEST(test_header_in_two_pieces_and_chunks) {
  grpc_init();
  /* header piece 1: the shape; piece 2: device 0 written out (merged) */
  wbuf m1 = header(four, 1), dev = {0}, m2 = {0}, m3 = {0};
  put_varint(&dev, 2 << 3 | 0);
  put_varint(&dev, 0);
  put_bytes(&m1, 1, dev.b, dev.n);
  put_bytes(&m2, 2, c4, 8);
  put_bytes(&m3, 2, c4 + 2, 8);
  wbuf msgs[3] = {m1, m2, m3};
  put_result r;
  put_call(msgs, 3, &r);
  EXPECT_OK(r);
  expect_stored(r.handle, c4, 4);
  grpc_shutdown();
}
END_TEST

START_TEST(test_broken_encodings) {
  grpc_init();
  put_result r;
  wbuf m = {0};
  put_varint(&m, 1 << 3 | 0); /* header as a varint */
  put_varint(&m, 5);
  put_call(&m, 1, &r);
  EXPECT_INVALID(r, "not a valid kiln.v1.PutBufferChunk message");

  wbuf h = header(four, 1), d = {0};
  put_varint(&d, 2 << 3 | 2); /* data of 100 bytes, 8 present */
  put_varint(&d, 100);
  memcpy(d.b + d.n, c4, 8);
  d.n += 8;
  wbuf msgs[2] = {h, d};
  put_call(msgs, 2, &r);
  EXPECT_INVALID(r, "not a valid kiln.v1.PutBufferChunk message");

  wbuf v = {0};
  memset(v.b, 0xff, 12); /* a tag varint that never ends */
  v.n = 12;
  wbuf msgs2[2] = {h, v};
  put_call(msgs2, 2, &r);
  EXPECT_INVALID(r, "not a valid kiln.v1.PutBufferChunk message");

  wbuf g = {0};
  put_varint(&g, 5 << 3 | 3); /* a group */
  wbuf msgs3[2] = {h, g};
  put_call(msgs3, 2, &r);
  EXPECT_INVALID(r, "not a valid kiln.v1.PutBufferChunk message");

  /* A header whose own bytes are broken: named by the usual check. */
  wbuf bad = {0}, inner = {0};
  put_varint(&inner, 3 << 3 | 2); /* label */
  put_varint(&inner, 2);
  inner.b[inner.n++] = 0xc3; /* not UTF-8 */
  inner.b[inner.n++] = 0x28;
  put_bytes(&bad, 1, inner.b, inner.n);
  put_call(&bad, 1, &r);
  EXPECT_INVALID(r, "header.label: not valid UTF-8");
  grpc_shutdown();
}
END_TEST

static Suite *wire_suite(void) {
  Suite *s = suite_create("upload_wire");
  TCase *tc = tcase_create("chunks");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_data_before_header);
  tcase_add_test(tc, test_last_data_wins_and_unknown_fields);
  tcase_add_test(tc, test_header_in_two_pieces_and_chunks);
  tcase_add_test(tc, test_broken_encodings);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  itest_require_kilnd("test_upload_wire");
  if (itest_kilnd_start(&server, NULL)) return 1;
  return itest_run_suite("test_upload_wire", wire_suite(), &server);
}
