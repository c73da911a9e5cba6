/* libFuzzer target for the RPC layer: requests of every method, decoded and
 * dispatched as kilnd does, by a kilnd running in this process
 * (tests/server/kilnd_inproc.h: the server's own start-up, validation
 * point, handlers and teardown, over a channel on a socket pair, no port).
 *
 * Input: byte 0 picks the method (kilnd's table in order, then one path the
 * server does not serve); the rest is the request. For PutBuffer, a client
 * stream, the rest is a sequence of messages, each a 2-byte little-endian
 * length then that many bytes (a short tail is the last message); for the
 * others it is the one request message. Requests go as client "fuzz".
 *
 * Placeholders let a request name real objects: 32 'H' bytes are replaced
 * (in place, same length, so the encoding stays valid) by the handle of a
 * buffer made for the input (f32[4]) and 64 'E' bytes by the id of an
 * executable compiled for it (x + 1 over f32[4], the interpreter). What a
 * request creates (PutBuffer replies, outputs kept on the server) is
 * released after it, so state does not pile up across inputs.
 *
 * Checks besides the sanitizers: every call ends with a status (never
 * UNKNOWN: a call the server dropped), and the server keeps answering a
 * health check. The seed corpus is tests/fuzz/corpus/fuzz_rpc/ (see
 * tests/fuzz/README.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "kiln/v1/kiln.pb-c.h"
#include "tests/server/kilnd_inproc.h"

#define HANDLE_LEN 32
#define EXE_LEN 64
#define TIMEOUT_MS 8000
#define MAX_MSGS 64
#define IDLE_WAIT_MS 2000

static const char *const paths[] = {
    "/kiln.v1.Kiln/Compile",        "/kiln.v1.Kiln/Execute",        "/kiln.v1.Kiln/PutBuffer",
    "/kiln.v1.Kiln/GetBuffer",      "/kiln.v1.Kiln/ReleaseBuffers", "/kiln.v1.Kiln/Stats",
    "/grpc.health.v1.Health/Check", "/kiln.v1.Kiln/CacheList",      "/kiln.v1.Kiln/CacheEvict",
    "/kiln.v1.Kiln/NoSuchMethod",
};
#define NPATHS (sizeof paths / sizeof paths[0])
#define PUT_BUFFER 2

static kilnd_inproc *server;
static char exe_id[EXE_LEN + 1];

static const char program[] = "HloModule fuzz_rpc\nENTRY main {\n  x = f32[4] parameter(0)\n"
                              "  c = f32[] constant(1)\n  b = f32[4] broadcast(c), dimensions={}\n"
                              "  ROOT r = f32[4] add(x, b)\n}\n";

static kilnd_inproc_reply call(int method, const uint8_t *const *msgs, const size_t *lens,
                               size_t n) {
  kilnd_inproc_reply r;
  if (kilnd_inproc_call(server, paths[method], "fuzz", msgs, lens, n, TIMEOUT_MS, MAX_MSGS, &r)) {
    fprintf(stderr, "fuzz_rpc: the core refused a call of %s\n", paths[method]);
    abort();
  }
  if (r.code == GRPC_STATUS_UNKNOWN) {
    fprintf(stderr, "fuzz_rpc: %s ended without a status (%s)\n", paths[method], r.details);
    abort();
  }
  return r;
}

static kilnd_inproc_reply call_msg(int method, const ProtobufCMessage *m) {
  size_t len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(len ? len : 1);
  protobuf_c_message_pack(m, buf);
  const uint8_t *msgs[1] = {buf};
  kilnd_inproc_reply r = call(method, msgs, &len, 1);
  free(buf);
  return r;
}

static void release(const char *handle) {
  Kiln__V1__ReleaseBuffersRequest req = KILN__V1__RELEASE_BUFFERS_REQUEST__INIT;
  char *h[1] = {(char *)handle};
  req.n_handles = 1;
  req.handles = h;
  kilnd_inproc_reply r = call_msg(4, &req.base);
  kilnd_inproc_reply_clear(&r);
}

/* A fresh f32[4] buffer; its handle in out (empty when refused). */
static void make_buffer(char out[HANDLE_LEN + 1]) {
  int64_t dims[1] = {4};
  float data[4] = {1, 2, 3, 4};
  Kiln__V1__Shape shape = KILN__V1__SHAPE__INIT;
  shape.element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_F32;
  shape.n_dimensions = 1;
  shape.dimensions = dims;
  Kiln__V1__PutBufferHeader hdr = KILN__V1__PUT_BUFFER_HEADER__INIT;
  hdr.shape = &shape;
  Kiln__V1__PutBufferChunk chunk = KILN__V1__PUT_BUFFER_CHUNK__INIT;
  chunk.header = &hdr;
  chunk.data.data = (uint8_t *)data;
  chunk.data.len = sizeof data;
  kilnd_inproc_reply r = call_msg(PUT_BUFFER, &chunk.base);
  out[0] = '\0';
  if (r.code == GRPC_STATUS_OK && r.n == 1) {
    Kiln__V1__PutBufferResponse *resp =
        kiln__v1__put_buffer_response__unpack(NULL, r.lens[0], r.msgs[0]);
    if (resp && resp->buffer && strlen(resp->buffer->handle) == HANDLE_LEN)
      memcpy(out, resp->buffer->handle, HANDLE_LEN + 1);
    if (resp) kiln__v1__put_buffer_response__free_unpacked(resp, NULL);
  }
  kilnd_inproc_reply_clear(&r);
}

/* Compiles the program behind the 64 'E' placeholder (again: an input may
 * have evicted it; a cache hit when it did not). */
static void compile_program(void) {
  Kiln__V1__CompileRequest req = KILN__V1__COMPILE_REQUEST__INIT;
  req.program_case = KILN__V1__COMPILE_REQUEST__PROGRAM_HLO_TEXT;
  req.hlo_text = (char *)program;
  kilnd_inproc_reply r = call_msg(0, &req.base);
  Kiln__V1__CompileResponse *resp =
      r.code == GRPC_STATUS_OK && r.n == 1
          ? kiln__v1__compile_response__unpack(NULL, r.lens[0], r.msgs[0])
          : NULL;
  if (resp == NULL || strlen(resp->executable_id) != EXE_LEN) {
    fprintf(stderr, "fuzz_rpc: the start-up compile failed: %d %s\n", (int)r.code, r.details);
    abort();
  }
  memcpy(exe_id, resp->executable_id, EXE_LEN + 1);
  kiln__v1__compile_response__free_unpacked(resp, NULL);
  kilnd_inproc_reply_clear(&r);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  static const char *const args[] = {"--interp-devices",
                                     "2",
                                     "--cpu-devices",
                                     "1",
                                     "--default-backend",
                                     "interp",
                                     "--max-message-bytes",
                                     "4Mi",
                                     "--max-module-bytes",
                                     "1Mi",
                                     "--max-elements",
                                     "1Mi",
                                     "--client-memory-bytes",
                                     "64Mi",
                                     "--max-executables",
                                     "32",
                                     "--cache-memory-bytes",
                                     "16Mi",
                                     "--run-timeout",
                                     "5",
                                     "--compile-timeout",
                                     "5",
                                     "--chunk-bytes",
                                     "64Ki",
                                     NULL};
  kiln_status st;
  kiln_status_clear(&st);
  if (kilnd_inproc_start(args, &server, &st)) {
    fprintf(stderr, "fuzz_rpc: the server did not start: %s\n", st.msg);
    abort();
  }
  compile_program();
  return 0;
}

/* Replaces every run of `len` bytes `c` with `with`; true when one was. */
static bool substitute(uint8_t *p, size_t n, char c, const char *with, size_t len) {
  bool any = false;
  for (size_t i = 0; i + len <= n; i++) {
    size_t k = 0;
    while (k < len && p[i + k] == (uint8_t)c) k++;
    if (k == len) {
      memcpy(p + i, with, len);
      i += len - 1;
      any = true;
    }
  }
  return any;
}

static bool has_run(const uint8_t *p, size_t n, char c, size_t len) {
  for (size_t i = 0, run = 0; i < n; i++) {
    run = p[i] == (uint8_t)c ? run + 1 : 0;
    if (run == len) return true;
  }
  return false;
}

/* Releases what a reply created: PutBuffer's buffer, Execute's kept outputs. */
static void release_created(int method, const kilnd_inproc_reply *r) {
  if (r->code != GRPC_STATUS_OK || r->n != 1) return;
  if (method == PUT_BUFFER) {
    Kiln__V1__PutBufferResponse *resp =
        kiln__v1__put_buffer_response__unpack(NULL, r->lens[0], r->msgs[0]);
    if (resp && resp->buffer && resp->buffer->handle[0]) release(resp->buffer->handle);
    if (resp) kiln__v1__put_buffer_response__free_unpacked(resp, NULL);
  } else if (method == 1) {
    Kiln__V1__ExecuteResponse *resp =
        kiln__v1__execute_response__unpack(NULL, r->lens[0], r->msgs[0]);
    for (size_t i = 0; resp && i < resp->n_outputs; i++)
      if (resp->outputs[i]->value_case == KILN__V1__OUTPUT__VALUE_BUFFER &&
          resp->outputs[i]->buffer->handle[0])
        release(resp->outputs[i]->buffer->handle);
    if (resp) kiln__v1__execute_response__free_unpacked(resp, NULL);
  }
}

/* Waits (at most IDLE_WAIT_MS) until the server has released every call
 * of the input. Their statuses are in, but the server frees a call on its
 * own thread just after the status goes out; returning before that leaves
 * the input with more allocations than frees, and libFuzzer then runs the
 * input again and scans the whole heap for leaks, which cost more than
 * the input itself. Not a check: a call held longer (a run past its
 * deadline) is left to the server, as before. */
static void wait_released(void) {
  struct timespec pause = {0, 50 * 1000};
  for (int i = 0; i < IDLE_WAIT_MS * 20 && kilnd_inproc_inflight(server) > 0; i++)
    nanosleep(&pause, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  int method = data[0] % NPATHS;
  size_t n = size - 1;
  uint8_t *body = malloc(n ? n : 1);
  memcpy(body, data + 1, n);
  char handle[HANDLE_LEN + 1] = "";
  if (has_run(body, n, 'H', HANDLE_LEN)) {
    make_buffer(handle);
    if (handle[0]) substitute(body, n, 'H', handle, HANDLE_LEN);
  }
  if (has_run(body, n, 'E', EXE_LEN)) {
    compile_program();
    substitute(body, n, 'E', exe_id, EXE_LEN);
  }
  const uint8_t *msgs[MAX_MSGS];
  size_t lens[MAX_MSGS], nmsgs = 0;
  if (method == PUT_BUFFER) {
    size_t at = 0;
    while (at < n && nmsgs < MAX_MSGS) {
      size_t len = n - at >= 2 ? (size_t)body[at] | (size_t)body[at + 1] << 8 : 0;
      at += n - at >= 2 ? 2 : n - at;
      if (len > n - at) len = n - at;
      msgs[nmsgs] = body + at;
      lens[nmsgs++] = len;
      at += len;
    }
  } else {
    msgs[0] = body;
    lens[0] = n;
    nmsgs = 1;
  }
  kilnd_inproc_reply r = call(method, msgs, lens, nmsgs);
  if (getenv("KILN_FUZZ_RPC_VERBOSE"))
    fprintf(stderr, "fuzz_rpc: %s: code %d, %zu messages: %s\n", paths[method], (int)r.code, r.n,
            r.details);
  release_created(method, &r);
  kilnd_inproc_reply_clear(&r);
  if (handle[0]) release(handle);
  free(body);
  /* Still serving. */
  Grpc__Health__V1__HealthCheckRequest hc = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  r = call_msg(6, &hc.base);
  if (r.code != GRPC_STATUS_OK) {
    fprintf(stderr, "fuzz_rpc: health check after the input: %d %s\n", (int)r.code, r.details);
    abort();
  }
  kilnd_inproc_reply_clear(&r);
  wait_released();
  return 0;
}
