/* Fault injection through the allocation hook, in the server's own code:
 * every allocation of a Compile and of an Execute is failed in turn
 * (kiln_alloc_fail_once(n) for n = 1, 2, ... until a call no longer reaches
 * the n-th allocation), each on a kilnd running in this process
 * (tests/server/kilnd_inproc.h), reached over an in-process gRPC channel.
 *
 * Each failed call must end with RESOURCE_EXHAUSTED and a message (not
 * UNKNOWN, which is what a crashed or abandoned call looks like, nor a
 * status that blames the caller or says the server is going away), no call left
 * hanging; right after it, with nothing armed, a bystander's Execute must be
 * served with the right result. At the end the server drains and is torn
 * down: under ASan, LeakSanitizer fails the case on anything the failed
 * paths leaked. Compiles use the interpreter backend (a cpu compile is a C
 * compiler run, too slow to repeat for each allocation).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "kiln/v1/kiln.pb-c.h"
#include "tests/server/kilnd_inproc.h"

#define MAX_FAULTS 200000
#define TIMEOUT_MS 30000

static const char *const server_args[] = {"--interp-devices",
                                          "1",
                                          "--cpu-devices",
                                          "1",
                                          "--compile-threads",
                                          "1",
                                          "--cq-threads",
                                          "2",
                                          NULL};

/* x + K over f32[4]; K makes each program its own (no cache or memo hit). */
static char *program(int k) {
  char *t = NULL;
  int n = asprintf(&t,
                   "HloModule faults_%d\nENTRY main {\n  x = f32[4] parameter(0)\n"
                   "  c = f32[] constant(%d)\n  b = f32[4] broadcast(c), dimensions={}\n"
                   "  ROOT r = f32[4] add(x, b)\n}\n",
                   k, k);
  ck_assert_int_gt(n, 0);
  return t;
}

static uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
  *len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(*len ? *len : 1);
  protobuf_c_message_pack(m, buf);
  return buf;
}

static kilnd_inproc_reply unary(kilnd_inproc *k, const char *method, const ProtobufCMessage *m,
                                const char *client) {
  size_t len;
  uint8_t *buf = pack(m, &len);
  const uint8_t *msgs[1] = {buf};
  char path[64];
  snprintf(path, sizeof path, "/kiln.v1.Kiln/%s", method);
  kilnd_inproc_reply r;
  ck_assert_int_eq(kilnd_inproc_call(k, path, client, msgs, &len, 1, TIMEOUT_MS, 4, &r), 0);
  free(buf);
  return r;
}

static kilnd_inproc_reply compile(kilnd_inproc *k, const char *text, const char *client) {
  Kiln__V1__CompileOptions o = KILN__V1__COMPILE_OPTIONS__INIT;
  o.backend = (char *)"interp";
  Kiln__V1__CompileRequest req = KILN__V1__COMPILE_REQUEST__INIT;
  req.program_case = KILN__V1__COMPILE_REQUEST__PROGRAM_HLO_TEXT;
  req.hlo_text = (char *)text;
  req.options = &o;
  return unary(k, "Compile", &req.base, client);
}

/* The executable id of a successful Compile reply (malloc'd). */
static char *exe_id(const kilnd_inproc_reply *r) {
  ck_assert_int_eq(r->code, GRPC_STATUS_OK);
  ck_assert_uint_eq(r->n, 1);
  Kiln__V1__CompileResponse *resp =
      kiln__v1__compile_response__unpack(NULL, r->lens[0], r->msgs[0]);
  ck_assert_ptr_nonnull(resp);
  char *id = strdup(resp->executable_id);
  kiln__v1__compile_response__free_unpacked(resp, NULL);
  return id;
}

static kilnd_inproc_reply execute(kilnd_inproc *k, const char *id, float x, const char *client) {
  float data[4] = {x, x + 1, x + 2, x + 3};
  int64_t dims[1] = {4};
  Kiln__V1__Shape shape = KILN__V1__SHAPE__INIT;
  shape.element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_F32;
  shape.n_dimensions = 1;
  shape.dimensions = dims;
  Kiln__V1__Literal lit = KILN__V1__LITERAL__INIT;
  lit.shape = &shape;
  lit.data.data = (uint8_t *)data;
  lit.data.len = sizeof data;
  Kiln__V1__Argument arg = KILN__V1__ARGUMENT__INIT, *args[1] = {&arg};
  arg.value_case = KILN__V1__ARGUMENT__VALUE_LITERAL;
  arg.literal = &lit;
  Kiln__V1__ExecuteRequest req = KILN__V1__EXECUTE_REQUEST__INIT;
  req.executable_id = (char *)id;
  req.n_arguments = 1;
  req.arguments = args;
  return unary(k, "Execute", &req.base, client);
}

/* An OK Execute reply holds x + K, x + K + 1, ... */
static bool execute_right(const kilnd_inproc_reply *r, float x, int kconst) {
  if (r->code != GRPC_STATUS_OK || r->n != 1) return false;
  Kiln__V1__ExecuteResponse *resp =
      kiln__v1__execute_response__unpack(NULL, r->lens[0], r->msgs[0]);
  bool ok = resp && resp->n_outputs == 1 &&
            resp->outputs[0]->value_case == KILN__V1__OUTPUT__VALUE_LITERAL &&
            resp->outputs[0]->literal->data.len == 4 * sizeof(float);
  for (int i = 0; ok && i < 4; i++) {
    float v;
    memcpy(&v, resp->outputs[0]->literal->data.data + 4 * i, sizeof v);
    ok = v == x + (float)i + (float)kconst;
  }
  if (resp) kiln__v1__execute_response__free_unpacked(resp, NULL);
  return ok;
}

/* A failure must be a status of its own with a message. */
static void check_clean(const kilnd_inproc_reply *r, const char *what, long n) {
  ck_assert_msg(r->code != GRPC_STATUS_UNKNOWN && r->code != GRPC_STATUS_CANCELLED &&
                    r->code != GRPC_STATUS_DEADLINE_EXCEEDED,
                "%s with allocation %ld failed: gRPC status %d (%s)", what, n, (int)r->code,
                r->details);
  ck_assert_msg(r->details[0] != '\0', "%s with allocation %ld failed: code %d without a message",
                what, n, (int)r->code);
  /* Out of memory is said as such, never as the caller's fault or the
   * server going away. */
  ck_assert_msg(r->code == GRPC_STATUS_RESOURCE_EXHAUSTED,
                "%s with allocation %ld failed: code %d (%s), not RESOURCE_EXHAUSTED", what, n,
                (int)r->code, r->details);
}

/* Nothing armed: the bystander is served right. */
static void bystander(kilnd_inproc *k, const char *id, long n) {
  kilnd_inproc_reply r = execute(k, id, 10.0f, "bystander");
  ck_assert_msg(execute_right(&r, 10.0f, 1), "bystander after allocation %ld: code %d (%s)", n,
                (int)r.code, r.details);
  kilnd_inproc_reply_clear(&r);
}

static void wait_idle(kilnd_inproc *k) {
  for (int i = 0; i < 5000 && kilnd_inproc_inflight(k) > 0; i++) usleep(1000);
}

static kilnd_inproc *start(void) {
  kilnd_inproc *k = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kilnd_inproc_start(server_args, &k, &st) == 0, "start: %s", st.msg);
  return k;
}

static void stop(kilnd_inproc *k) { ck_assert_int_eq(kilnd_inproc_stop(k), 0); }

START_TEST(test_compile_each_allocation_fails) {
  kilnd_inproc *k = start();
  char *text = program(1);
  kilnd_inproc_reply r = compile(k, text, "bystander");
  char *by = exe_id(&r);
  kilnd_inproc_reply_clear(&r);
  free(text);
  long n = 1, failed = 0, codes[17] = {0};
  for (; n <= MAX_FAULTS; n++) {
    text = program((int)(n + 100));
    kiln_alloc_fail_once(n);
    r = compile(k, text, "victim");
    bool reached = !kiln_alloc_failure_pending();
    kiln_alloc_fail_after(0);
    free(text);
    if (r.code != GRPC_STATUS_OK) {
      check_clean(&r, "Compile", n);
      failed++;
    }
    codes[r.code <= 16 ? r.code : 16]++;
    if (r.code != GRPC_STATUS_OK && r.code != GRPC_STATUS_RESOURCE_EXHAUSTED)
      printf("test_server_faults: Compile, allocation %ld: code %d: %s\n", n, (int)r.code,
             r.details);
    kilnd_inproc_reply_clear(&r);
    wait_idle(k);
    bystander(k, by, n);
    if (!reached) break; /* past the Compile's last allocation */
  }
  ck_assert_msg(n <= MAX_FAULTS, "more than %d allocations in one Compile", MAX_FAULTS);
  printf("test_server_faults: Compile: %ld allocations failed in turn, %ld calls failed "
         "(RESOURCE_EXHAUSTED %ld, INTERNAL %ld, INVALID_ARGUMENT %ld, other %ld)\n",
         n - 1, failed, codes[GRPC_STATUS_RESOURCE_EXHAUSTED], codes[GRPC_STATUS_INTERNAL],
         codes[GRPC_STATUS_INVALID_ARGUMENT],
         failed - codes[GRPC_STATUS_RESOURCE_EXHAUSTED] - codes[GRPC_STATUS_INTERNAL] -
             codes[GRPC_STATUS_INVALID_ARGUMENT]);
  ck_assert_int_gt(failed, 0);
  free(by);
  stop(k);
}
END_TEST

START_TEST(test_execute_each_allocation_fails) {
  kilnd_inproc *k = start();
  char *text = program(1);
  kilnd_inproc_reply r = compile(k, text, "bystander");
  char *by = exe_id(&r);
  kilnd_inproc_reply_clear(&r);
  free(text);
  text = program(7);
  r = compile(k, text, "victim");
  char *id = exe_id(&r);
  kilnd_inproc_reply_clear(&r);
  free(text);
  long n = 1, failed = 0;
  for (; n <= MAX_FAULTS; n++) {
    kiln_alloc_fail_once(n);
    r = execute(k, id, 2.0f, "victim");
    bool reached = !kiln_alloc_failure_pending();
    kiln_alloc_fail_after(0);
    if (r.code != GRPC_STATUS_OK) {
      check_clean(&r, "Execute", n);
      failed++;
    } else {
      ck_assert_msg(execute_right(&r, 2.0f, 7), "Execute with allocation %ld failed: OK but wrong",
                    n);
    }
    kilnd_inproc_reply_clear(&r);
    wait_idle(k);
    bystander(k, by, n);
    if (!reached) break;
  }
  ck_assert_msg(n <= MAX_FAULTS, "more than %d allocations in one Execute", MAX_FAULTS);
  printf("test_server_faults: Execute: %ld allocations failed in turn, %ld calls failed\n", n - 1,
         failed);
  ck_assert_int_gt(failed, 0);
  free(id);
  free(by);
  stop(k);
}
END_TEST

int main(void) {
  Suite *s = suite_create("server_faults");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, test_compile_each_allocation_fails);
  tcase_add_test(tc, test_execute_each_allocation_fails);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
