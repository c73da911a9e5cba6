/* Limits that keep one request from crashing, holding or exhausting kilnd
 * (issue 16): programs nested deeper than --max-nesting, one deadline for a
 * whole Compile, a cancelled Compile, a compiled run over --run-memory-bytes,
 * an executable larger than --executable-table-bytes, a PutBuffer stream
 * that stalls holding its reservation, GetBuffer asked for 1-byte chunks.
 * Each case feeds the bad input, checks the status and its message, and
 * then that a bystander is served at once.
 *
 * The server runs with one compile thread, so a Compile that did not stop
 * would keep the bystander's compile waiting, and with small memory limits
 * so that they are cheap to reach.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "clients/c/kiln.h"
#include "common/sbuf.h"
#include "compiler/ir/text.h"
#include "kiln/v1/kiln.pb-c.h"
#include "tests/integration/itest.h"

static itest_kilnd server;

/* ---- generated programs ------------------------------------------------------------ */

/* A chain of `depth` computations calling each other (377 KB at 5000). */
static char *deep_calls(int depth) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b,
                 "HloModule deep\nc0 {\n  p = f32[] parameter(0)\n  ROOT r = f32[] sine(p)\n}\n");
  for (int i = 1; i < depth; i++)
    kiln_sbuf_printf(&b,
                     "c%d {\n  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), to_apply=c%d\n}\n",
                     i, i - 1);
  kiln_sbuf_printf(&b,
                   "ENTRY main {\n  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), "
                   "to_apply=c%d\n}\n",
                   depth - 1);
  return kiln_sbuf_detach(&b, NULL);
}

/* `depth` whiles, each in the body of the next. */
static char *nested_whiles(int depth) {
  kiln_sbuf b = KILN_SBUF_INIT;
  const char *S = "(s32[], f32[])";
  kiln_sbuf_puts(&b, "HloModule whiles\n");
  for (int i = 0; i < depth; i++) {
    kiln_sbuf_printf(&b,
                     "cond%d {\n  s = %s parameter(0)\n  i = s32[] get-tuple-element(s), index=0\n"
                     "  two = s32[] constant(2)\n  ROOT lt = pred[] compare(i, two), "
                     "direction=LT\n}\n",
                     i, S);
    kiln_sbuf_printf(&b,
                     "body%d {\n  s = %s parameter(0)\n  i = s32[] get-tuple-element(s), "
                     "index=0\n",
                     i, S);
    if (i == 0)
      kiln_sbuf_puts(&b, "  x0 = f32[] get-tuple-element(s), index=1\n  x = f32[] sine(x0)\n");
    else
      kiln_sbuf_printf(&b,
                       "  w = %s while(s), condition=cond%d, body=body%d\n"
                       "  x = f32[] get-tuple-element(w), index=1\n",
                       S, i - 1, i - 1);
    kiln_sbuf_printf(&b,
                     "  one = s32[] constant(1)\n  i1 = s32[] add(i, one)\n"
                     "  ROOT t = %s tuple(i1, x)\n}\n",
                     S);
  }
  kiln_sbuf_printf(&b,
                   "ENTRY main {\n  p = f32[] parameter(0)\n  z = s32[] constant(0)\n"
                   "  s = %s tuple(z, p)\n  w = %s while(s), condition=cond%d, body=body%d\n"
                   "  ROOT r = f32[] get-tuple-element(w), index=1\n}\n",
                   S, S, depth - 1, depth - 1);
  return kiln_sbuf_detach(&b, NULL);
}

/* `depth` whiles, each in the body of the next, each running its body once:
 * from 0 the result is depth. */
static char *counting_whiles(int depth) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, "HloModule counting\n");
  for (int i = 0; i < depth; i++) {
    kiln_sbuf_printf(&b,
                     "cond%d {\n  p = s32[] parameter(0)\n  one = s32[] constant(1)\n"
                     "  ROOT lt = pred[] compare(p, one), direction=LT\n}\n",
                     i);
    kiln_sbuf_printf(&b, "body%d {\n  p = s32[] parameter(0)\n  one = s32[] constant(1)\n", i);
    if (i == 0)
      kiln_sbuf_puts(&b, "  ROOT r = s32[] add(p, one)\n}\n");
    else
      kiln_sbuf_printf(&b,
                       "  w = s32[] while(p), condition=cond%d, body=body%d\n"
                       "  ROOT r = s32[] add(w, one)\n}\n",
                       i - 1, i - 1);
  }
  kiln_sbuf_printf(&b,
                   "ENTRY main {\n  p = s32[] parameter(0)\n"
                   "  ROOT w = s32[] while(p), condition=cond%d, body=body%d\n}\n",
                   depth - 1, depth - 1);
  return kiln_sbuf_detach(&b, NULL);
}

/* A chain of n sines: seconds of transforms and passes under grad. */
static char *long_chain(int n) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, "HloModule chain\nENTRY main {\n  x0 = f32[] parameter(0)\n");
  for (int i = 1; i <= n; i++) kiln_sbuf_printf(&b, "  x%d = f32[] sine(x%d)\n", i, i - 1);
  kiln_sbuf_printf(&b, "  ROOT r = f32[] add(x%d, x0)\n}\n", n);
  return kiln_sbuf_detach(&b, NULL);
}

/* ---- helpers ------------------------------------------------------------------------ */

static const char axpy[] = "HloModule axpy\nENTRY e {\n  a = f32[] parameter(0)\n"
                           "  x = f32[4] parameter(1)\n  y = f32[4] parameter(2)\n"
                           "  ab = f32[4] broadcast(a), dimensions={}\n"
                           "  ax = f32[4] multiply(ab, x)\n  ROOT r = f32[4] add(ax, y)\n}\n";

static kiln_client *connect_to(const char *addr, const char *id) {
  kiln_client_options o = {.client_id = id};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_client *c = NULL;
  ck_assert_msg(kiln_client_connect(addr, &o, &c, &st) == 0, "connect: %s", st.msg);
  return c;
}

static kiln_client *connect_as(const char *id) { return connect_to(server.addr, id); }

static kiln_literal *lit(const char *text) {
  kiln_literal *l;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_literal_parse_text(text, strlen(text), &l, &st) == 0, "%s", st.msg);
  return l;
}

/* A compile and an execution with the right answer, within `secs`. The
 * program is a new one each time (an unused constant differs), so that no
 * table or memo answers it: it needs the compile thread. */
static void bystander_served(const char *addr, double secs) {
  static int seq;
  char text[sizeof axpy + 64];
  snprintf(text, sizeof text, "%.*s  u = f32[] constant(%d.%d)\n}\n", (int)strlen(axpy) - 2, axpy,
           (int)getpid(), seq++);
  double t0 = itest_now();
  kiln_client *c = connect_to(addr, "bystander");
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_compile_options o = {.backend = "interp", .deadline_ms = 60000};
  kiln_remote_executable *e;
  ck_assert_msg(kiln_client_compile_text(c, text, strlen(text), &o, &e, &st) == 0, "%s: %s", st.msg,
                text);
  ck_assert_msg(e->cache_source == KILN_REMOTE_SOURCE_COMPILED,
                "the bystander's program was known");
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
  double took = itest_now() - t0;
  ck_assert_msg(took < secs, "the bystander waited %.2f s", took);
}

static void still_serving(void) {
  ck_assert_msg(itest_kilnd_alive(&server), "kilnd died");
  bystander_served(server.addr, 10);
}

/* Compiles `text` with the options; returns the gRPC code, st the status. */
static kiln_rpc_code compile_on(const char *addr, const char *text,
                                const kiln_remote_compile_options *o, double *secs,
                                kiln_status *st) {
  kiln_client *c = connect_to(addr, "deep");
  kiln_remote_executable *e = NULL;
  kiln_status_clear(st);
  double t0 = itest_now();
  int rc = kiln_client_compile_text(c, text, strlen(text), o, &e, st);
  *secs = itest_now() - t0;
  if (rc == 0) kiln_remote_executable_free(e);
  kiln_client_close(c);
  return rc == 0 ? KILN_RPC_OK : kiln_rpc_status_code(st);
}

#define EXPECT_CODE(got, want, st) \
  ck_assert_msg((got) == (want), "expected %s, got %s: %s: %s", kiln_rpc_code_name(want), \
                kiln_rpc_code_name(got), (st).where, (st).msg)
#define EXPECT_IN(st, sub) \
  ck_assert_msg(strstr((st).msg, (sub)) != NULL, "'%s' not in '%s'", (sub), (st).msg)

/* ---- nesting ------------------------------------------------------------------------ */

START_TEST(test_deep_calls) {
  char *text = deep_calls(5000); /* overflowed the lowering's stack */
  kiln_status st;
  double secs;
  kiln_remote_compile_options o = {.backend = "cpu", .deadline_ms = 60000};
  kiln_rpc_code code = compile_on(server.addr, text, &o, &secs, &st);
  EXPECT_CODE(code, KILN_RPC_INVALID_ARGUMENT, st);
  EXPECT_IN(st, "computations nest 5000 deep");
  EXPECT_IN(st, "more than the limit of 256 (max-nesting)");
  EXPECT_IN(st, "%main -> %c4999 -> %c4998");
  ck_assert_msg(secs < 10, "refused after %.1f s", secs);
  free(text);
  /* 100000 deep with grad (7.7 MB) overflowed the transforms' lowering and
   * grew the server to 24 GiB. */
  text = deep_calls(100000);
  const char *grad[] = {"grad"};
  o.transforms = grad;
  o.ntransforms = 1;
  code = compile_on(server.addr, text, &o, &secs, &st);
  EXPECT_CODE(code, KILN_RPC_INVALID_ARGUMENT, st);
  EXPECT_IN(st, "computations nest 100000 deep");
  ck_assert_msg(secs < 20, "refused after %.1f s", secs);
  free(text);
  text = nested_whiles(1000);
  o.ntransforms = 0;
  code = compile_on(server.addr, text, &o, &secs, &st);
  EXPECT_CODE(code, KILN_RPC_INVALID_ARGUMENT, st);
  EXPECT_IN(st, "computations nest 1000 deep");
  EXPECT_IN(st, "%main -> %body999 -> %body998");
  free(text);
  /* At the limit it compiles and runs. */
  text = deep_calls(256);
  code = compile_on(server.addr, text, &o, &secs, &st);
  EXPECT_CODE(code, KILN_RPC_OK, st);
  free(text);
  still_serving();
}
END_TEST

/* What --max-nesting lets through, every backend runs: the run loops
 * recurse once per level, on threads with a stack sized for the largest
 * limit (common/thread.h). The cpu loader allowed 64 levels and the
 * interpreter 200 while Compile accepted 256 by default and up to 4096. */
START_TEST(test_deep_nesting_runs) {
  itest_kilnd k;
  const char *extra[] = {"--max-nesting", "4096", NULL};
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  char *text = counting_whiles(4000);
  const char *backends[] = {"interp", "cpu"};
  for (int b = 0; b < 2; b++) {
    kiln_client *c = connect_to(k.addr, "deep-runner");
    kiln_status st;
    kiln_status_clear(&st);
    kiln_remote_compile_options o = {.backend = backends[b], .deadline_ms = 120000};
    kiln_remote_executable *e;
    ck_assert_msg(kiln_client_compile_text(c, text, strlen(text), &o, &e, &st) == 0, "%s: %s",
                  backends[b], st.msg);
    kiln_literal *p = lit("s32[] 0");
    kiln_remote_arg args[1] = {{.literal = p}};
    kiln_remote_execute_options xo = {.deadline_ms = 60000};
    kiln_remote_result r;
    ck_assert_msg(kiln_client_execute(c, e->id, args, 1, &xo, &r, &st) == 0, "%s: %s: %s",
                  backends[b], st.where, st.msg);
    int32_t v;
    memcpy(&v, r.outputs[0].literal->data, sizeof v);
    ck_assert_msg(v == 4000, "%s: %d", backends[b], v);
    kiln_remote_result_free(&r);
    kiln_literal_destroy(p);
    kiln_remote_executable_free(e);
    kiln_client_close(c);
  }
  free(text);
  ck_assert_msg(itest_kilnd_alive(&k), "kilnd died");
  ck_assert_int_eq(itest_kilnd_stop(&k, SIGTERM, 20), 0);
}
END_TEST

/* kiln compile refuses it the same way, locally, and KILN_MAX_NESTING moves
 * the limit. */
START_TEST(test_deep_calls_cli) {
  const char *cli = getenv("KILN_CLI");
  if (cli == NULL) return; /* only under ctest */
  char path[] = "/tmp/kiln-deep-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  char *text = deep_calls(5000);
  ck_assert(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
  free(text);
  char *out = NULL, *err = NULL;
  char *argv[] = {(char *)cli, "compile", path, NULL};
  int status = itest_run(argv, &out, &err);
  ck_assert_msg(status == 1, "status %d: %s", status, err);
  ck_assert_msg(strstr(err, "computations nest 5000 deep") && strstr(err, "max-nesting"), "%s",
                err);
  free(out), free(err);
  setenv("KILN_MAX_NESTING", "4096", 1);
  char *check[] = {(char *)cli, "check", path, NULL};
  status = itest_run(check, &out, &err);
  ck_assert_msg(status == 1, "status %d: %s", status, err);
  ck_assert_msg(strstr(err, "limit of 4096"), "%s", err);
  free(out), free(err);
  unlink(path);
}
END_TEST

/* ---- the Compile deadline and cancellation ------------------------------------------ */

/* grad of a 60000-long chain takes about ten seconds of transforms,
 * passes, code generation and the C compiler. */
START_TEST(test_compile_deadline) {
  char *text = long_chain(60000);
  const char *grad[] = {"grad"};
  kiln_remote_compile_options o = {
      .backend = "cpu", .transforms = grad, .ntransforms = 1, .deadline_ms = 500};
  kiln_status st;
  double secs;
  kiln_rpc_code code = compile_on(server.addr, text, &o, &secs, &st);
  EXPECT_CODE(code, KILN_RPC_DEADLINE_EXCEEDED, st);
  ck_assert_msg(secs < 3, "the deadline came after %.1f s", secs);
  /* The server stopped too: its one compile thread is free at once. */
  still_serving();
  free(text);
}
END_TEST

/* --compile-timeout bounds the whole Compile; the message says what ran. */
START_TEST(test_compile_timeout) {
  itest_kilnd k;
  const char *extra[] = {"--compile-timeout", "0.5", "--compile-threads", "1", NULL};
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  char *text = long_chain(60000);
  const char *grad[] = {"grad"};
  kiln_remote_compile_options o = {
      .backend = "cpu", .transforms = grad, .ntransforms = 1, .deadline_ms = 60000};
  kiln_status st;
  double secs;
  kiln_rpc_code code = compile_on(k.addr, text, &o, &secs, &st);
  EXPECT_CODE(code, KILN_RPC_DEADLINE_EXCEEDED, st);
  EXPECT_IN(st, "compile time limit of 0.5 s (compile-timeout) passed during");
  ck_assert_msg(secs < 4, "the limit came after %.1f s", secs);
  bystander_served(k.addr, 10);
  free(text);
  ck_assert_int_eq(itest_kilnd_stop(&k, SIGTERM, 20), 0);
}
END_TEST

/* A caller that goes away in the middle of a long Compile stops it: the one
 * compile thread serves the next compile within moments, not after the
 * abandoned build's ten seconds. */
START_TEST(test_cancelled_compile) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    char *text = long_chain(60000);
    const char *grad[] = {"grad"};
    kiln_remote_compile_options o = {
        .backend = "cpu", .transforms = grad, .ntransforms = 1, .deadline_ms = -1};
    kiln_status st;
    double secs;
    compile_on(server.addr, text, &o, &secs, &st);
    _exit(4); /* not reached: killed first */
  }
  usleep(1500000); /* sent, and the compile is under way */
  kill(pid, SIGKILL);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFSIGNALED(status));
  bystander_served(server.addr, 5);
}
END_TEST

/* ---- memory ------------------------------------------------------------------------- */

/* Two 256 MiB outputs under the server's 128 MiB --run-memory-bytes. */
START_TEST(test_run_memory_cpu) {
  static const char two_big[] =
      "HloModule big\nENTRY main {\n  p = f32[] parameter(0)\n"
      "  a = f32[67108864] broadcast(p), dimensions={}\n  b = f32[67108864] negate(a)\n"
      "  ROOT t = (f32[67108864], f32[67108864]) tuple(a, b)\n}\n";
  kiln_client *c = connect_as("hungry");
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_compile_options o = {.backend = "cpu", .deadline_ms = 120000};
  kiln_remote_executable *e;
  ck_assert_msg(kiln_client_compile_text(c, two_big, strlen(two_big), &o, &e, &st) == 0, "%s",
                st.msg);
  kiln_literal *p = lit("f32[] 1");
  kiln_remote_arg args[1] = {{.literal = p}};
  kiln_remote_execute_options xo = {.deadline_ms = 60000};
  kiln_remote_result r;
  kiln_status_clear(&st);
  int rc = kiln_client_execute(c, e->id, args, 1, &xo, &r, &st);
  ck_assert_int_ne(rc, 0);
  kiln_rpc_code code = kiln_rpc_status_code(&st);
  EXPECT_CODE(code, KILN_RPC_RESOURCE_EXHAUSTED, st);
  EXPECT_IN(st, "over the run memory limit of 134217728 bytes (run-memory-bytes)");
  /* Kept on the server it is the same run. */
  bool keep[2] = {true, true};
  xo.keep_on_server = keep;
  xo.nkeep = 2;
  kiln_status_clear(&st);
  rc = kiln_client_execute(c, e->id, args, 1, &xo, &r, &st);
  ck_assert_int_ne(rc, 0);
  code = kiln_rpc_status_code(&st);
  EXPECT_CODE(code, KILN_RPC_RESOURCE_EXHAUSTED, st);
  EXPECT_IN(st, "run-memory-bytes");
  kiln_literal_destroy(p);
  kiln_remote_executable_free(e);
  kiln_client_close(c);
  still_serving();
}
END_TEST

/* A program larger than the whole executable table (16 MiB here): a
 * 20 MiB constant. */
START_TEST(test_executable_table_bytes) {
  enum { N = 5 << 20 };
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b, "HloModule wide\nENTRY main {\n  ROOT c = f32[%d] constant({", N);
  for (int i = 0; i < N; i++) kiln_sbuf_puts(&b, i ? ",0" : "0");
  kiln_sbuf_puts(&b, "})\n}\n");
  kiln_remote_compile_options o = {.backend = "interp", .deadline_ms = 60000};
  kiln_status st;
  double secs;
  kiln_rpc_code code = compile_on(server.addr, kiln_sbuf_str(&b), &o, &secs, &st);
  kiln_sbuf_free(&b);
  EXPECT_CODE(code, KILN_RPC_RESOURCE_EXHAUSTED, st);
  EXPECT_IN(st, "more than the whole table may hold (16777216, executable-table-bytes)");
  still_serving();
}
END_TEST

/* ---- streams ------------------------------------------------------------------------ */

static grpc_channel *raw_channel(void) {
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  grpc_channel *ch = grpc_channel_create(server.addr, creds, NULL);
  grpc_channel_credentials_release(creds);
  return ch;
}

static bool batch(grpc_call *call, grpc_completion_queue *cq, grpc_op *ops, size_t n) {
  if (grpc_call_start_batch(call, ops, n, (void *)1, NULL) != GRPC_CALL_OK) return false;
  grpc_event ev =
      grpc_completion_queue_pluck(cq, (void *)1, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static void send_bytes(grpc_call *call, grpc_completion_queue *cq, const void *p, size_t n) {
  grpc_slice s = grpc_slice_from_copied_buffer(p, n);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  grpc_op op = {.op = GRPC_OP_SEND_MESSAGE};
  op.data.send_message.send_message = bb;
  ck_assert(batch(call, cq, &op, 1));
  grpc_byte_buffer_destroy(bb);
}

typedef struct raw_result {
  grpc_status_code code;
  char details[1024];
  int received;
} raw_result;

/* One call: metadata, the messages, a half-close unless `stall` (then it
 * just waits), every reply message, the status. */
static void raw_call(const char *method, const char *client, const void *msg, size_t len,
                     bool stall, raw_result *r) {
  memset(r, 0, sizeof *r);
  grpc_channel *ch = raw_channel();
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  gpr_timespec deadline =
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(30000, GPR_TIMESPAN));
  grpc_call *call =
      grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                               grpc_slice_from_static_string(method), NULL, deadline, NULL);
  grpc_metadata md = {.key = grpc_slice_from_static_string("kiln-client"),
                      .value = grpc_slice_from_static_string(client)};
  grpc_op op = {.op = GRPC_OP_SEND_INITIAL_METADATA};
  op.data.send_initial_metadata.count = 1;
  op.data.send_initial_metadata.metadata = &md;
  ck_assert(batch(call, cq, &op, 1));
  send_bytes(call, cq, msg, len);
  if (!stall) {
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
  grpc_channel_destroy(ch);
}

/* An upload of 64 MiB (f32) that sends its header, reserving the bytes, and
 * then nothing: after --stream-idle-timeout (1 s here) the reservation goes
 * back and the call ends. The client's 100 MiB quota then takes another
 * 64 MiB, which it could not while the first reservation held. */
START_TEST(test_stalled_upload) {
  Kiln__V1__Shape shape;
  kiln__v1__shape__init(&shape);
  shape.element_type = (Kiln__V1__ElementType)16;
  int64_t dims[1] = {16 << 20};
  shape.dimensions = dims;
  shape.n_dimensions = 1;
  Kiln__V1__PutBufferHeader h;
  kiln__v1__put_buffer_header__init(&h);
  h.shape = &shape;
  Kiln__V1__PutBufferChunk chunk;
  kiln__v1__put_buffer_chunk__init(&chunk);
  chunk.header = &h;
  uint8_t buf[256];
  size_t len = kiln__v1__put_buffer_chunk__pack(&chunk, buf);
  grpc_init();
  raw_result r;
  double t0 = itest_now();
  raw_call("/kiln.v1.Kiln/PutBuffer", "staller", buf, len, true, &r);
  double took = itest_now() - t0;
  grpc_shutdown();
  ck_assert_msg(r.code == GRPC_STATUS_DEADLINE_EXCEEDED, "got %d: %s", (int)r.code, r.details);
  ck_assert_msg(strstr(r.details, "stream-idle-timeout") && strstr(r.details, "released"), "%s",
                r.details);
  ck_assert_msg(took > 0.8 && took < 5, "ended after %.2f s", took);
  kiln_client *c = connect_as("staller");
  kiln_arena *a = kiln_arena_create();
  kiln_shape s;
  ck_assert_int_eq(kiln_shape_make_array(a, &s, KILN_F32, dims, 1), 0);
  float *data = calloc((size_t)dims[0], sizeof *data);
  kiln_remote_buffer out;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_put_buffer_raw(c, &s, data, (size_t)dims[0] * 4, NULL, &out, &st) == 0,
                "%s: %s", st.where, st.msg);
  const char *hs[1] = {out.handle};
  ck_assert_int_eq(kiln_client_release_buffers(c, hs, 1, NULL, NULL, &st), 0);
  kiln_remote_buffer_clear(&out);
  free(data);
  kiln_arena_destroy(a);
  kiln_client_close(c);
  still_serving();
}
END_TEST

/* GetBuffer asked for 1-byte chunks of a 256 KiB buffer sends 64 KiB ones:
 * 4 chunks after the description, not 262144. */
START_TEST(test_tiny_chunks) {
  kiln_client *c = connect_as("reader");
  kiln_arena *a = kiln_arena_create();
  kiln_shape s;
  int64_t n = 65536;
  ck_assert_int_eq(kiln_shape_make_array(a, &s, KILN_U32, &n, 1), 0);
  uint32_t *data = calloc((size_t)n, sizeof *data);
  kiln_remote_buffer h;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_put_buffer_raw(c, &s, data, (size_t)n * 4, NULL, &h, &st), 0);
  Kiln__V1__GetBufferRequest req;
  kiln__v1__get_buffer_request__init(&req);
  req.handle = h.handle;
  req.chunk_bytes = 1;
  uint8_t buf[256];
  size_t len = kiln__v1__get_buffer_request__pack(&req, buf);
  grpc_init();
  raw_result r;
  raw_call("/kiln.v1.Kiln/GetBuffer", "reader", buf, len, false, &r);
  grpc_shutdown();
  ck_assert_msg(r.code == GRPC_STATUS_OK, "got %d: %s", (int)r.code, r.details);
  ck_assert_int_eq(r.received, 1 + 4);
  const char *hs[1] = {h.handle};
  ck_assert_int_eq(kiln_client_release_buffers(c, hs, 1, NULL, NULL, &st), 0);
  kiln_remote_buffer_clear(&h);
  free(data);
  kiln_arena_destroy(a);
  kiln_client_close(c);
  still_serving();
}
END_TEST

int main(void) {
  itest_require_kilnd("test_limits");
  const char *extra[] = {"--compile-threads",
                         "1",
                         "--run-memory-bytes",
                         "128Mi",
                         "--executable-table-bytes",
                         "16Mi",
                         "--client-memory-bytes",
                         "100Mi",
                         "--stream-idle-timeout",
                         "1",
                         NULL};
  if (itest_kilnd_start(&server, extra)) return 1;
  Suite *s = suite_create("limits");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, test_deep_calls);
  tcase_add_test(tc, test_deep_calls_cli);
  tcase_add_test(tc, test_deep_nesting_runs);
  tcase_add_test(tc, test_compile_deadline);
  tcase_add_test(tc, test_compile_timeout);
  tcase_add_test(tc, test_cancelled_compile);
  tcase_add_test(tc, test_run_memory_cpu);
  tcase_add_test(tc, test_executable_table_bytes);
  tcase_add_test(tc, test_stalled_upload);
  tcase_add_test(tc, test_tiny_chunks);
  suite_add_tcase(s, tc);
  return itest_run_suite("test_limits", s, &server);
}
