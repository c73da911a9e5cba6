/* Running work stops when its call ends: an Execute of a program that would
 * loop for minutes is stopped by its deadline, or by its caller going away,
 * within moments, the server answers DEADLINE_EXCEEDED (or CANCELLED), and
 * the device it held runs the next request at once. Both device classes:
 * the cpu backend (compiled step program) and the interpreter.
 *
 * kilnd runs with one device per class, so a run that did not stop would
 * keep the next request waiting. A caller going away is a child process
 * killed in the middle of its call, once /metrics shows its run going; the
 * same for a run on the fast path (on the completion-queue thread, taken by
 * an executable whose recent runs were short).
 */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clients/c/kiln.h"
#include "tests/integration/itest.h"

static itest_kilnd server;

/* About 2e9 iterations of a sine over f32[1024]: minutes on any backend. */
static const char spin_text[] = "HloModule spin\n"
                                "cond {\n"
                                "  p = (s32[], f32[1024]) parameter(0)\n"
                                "  i = s32[] get-tuple-element(p), index=0\n"
                                "  n = s32[] constant(2000000000)\n"
                                "  ROOT lt = pred[] compare(i, n), direction=LT\n"
                                "}\n"
                                "body {\n"
                                "  p = (s32[], f32[1024]) parameter(0)\n"
                                "  i = s32[] get-tuple-element(p), index=0\n"
                                "  x = f32[1024] get-tuple-element(p), index=1\n"
                                "  one = s32[] constant(1)\n"
                                "  i1 = s32[] add(i, one)\n"
                                "  y = f32[1024] sine(x)\n"
                                "  ROOT t = (s32[], f32[1024]) tuple(i1, y)\n"
                                "}\n"
                                "ENTRY main {\n"
                                "  x = f32[1024] parameter(0)\n"
                                "  z = s32[] constant(0)\n"
                                "  t0 = (s32[], f32[1024]) tuple(z, x)\n"
                                "  w = (s32[], f32[1024]) while(t0), condition=cond, body=body\n"
                                "  ROOT r = f32[1024] get-tuple-element(w), index=1\n"
                                "}\n";

/* n iterations of a sine over f32[1024], n the second argument: a few
 * microseconds at n = 1, minutes at 2e9. */
static const char spin_n_text[] = "HloModule spin_n\n"
                                  "cond {\n"
                                  "  p = (s32[], s32[], f32[1024]) parameter(0)\n"
                                  "  i = s32[] get-tuple-element(p), index=0\n"
                                  "  n = s32[] get-tuple-element(p), index=1\n"
                                  "  ROOT lt = pred[] compare(i, n), direction=LT\n"
                                  "}\n"
                                  "body {\n"
                                  "  p = (s32[], s32[], f32[1024]) parameter(0)\n"
                                  "  i = s32[] get-tuple-element(p), index=0\n"
                                  "  n = s32[] get-tuple-element(p), index=1\n"
                                  "  x = f32[1024] get-tuple-element(p), index=2\n"
                                  "  one = s32[] constant(1)\n"
                                  "  i1 = s32[] add(i, one)\n"
                                  "  y = f32[1024] sine(x)\n"
                                  "  ROOT t = (s32[], s32[], f32[1024]) tuple(i1, n, y)\n"
                                  "}\n"
                                  "ENTRY main {\n"
                                  "  x = f32[1024] parameter(0)\n"
                                  "  n = s32[] parameter(1)\n"
                                  "  z = s32[] constant(0)\n"
                                  "  t0 = (s32[], s32[], f32[1024]) tuple(z, n, x)\n"
                                  "  w = (s32[], s32[], f32[1024]) while(t0), condition=cond, "
                                  "body=body\n"
                                  "  ROOT r = f32[1024] get-tuple-element(w), index=2\n"
                                  "}\n";

static const char negate_text[] = "HloModule neg\n"
                                  "ENTRY main {\n"
                                  "  x = f32[4] parameter(0)\n"
                                  "  ROOT y = f32[4] negate(x)\n"
                                  "}\n";

static kiln_client *connect_as(const char *id) {
  kiln_client_options o = {.client_id = id};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_client *c = NULL;
  ck_assert_msg(kiln_client_connect(server.addr, &o, &c, &st) == 0, "connect: %s", st.msg);
  return c;
}

static char *compile(kiln_client *c, const char *text, const char *backend) {
  kiln_remote_compile_options co = {.backend = backend};
  kiln_remote_executable *exe = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_compile_text(c, text, strlen(text), &co, &exe, &st) == 0,
                "compile on %s: %s: %s", backend, st.where, st.msg);
  char *id = strdup(exe->id);
  kiln_remote_executable_free(exe);
  return id;
}

static kiln_literal *vector(int64_t n, float v) {
  kiln_arena *a = kiln_arena_create();
  kiln_shape s;
  ck_assert_int_eq(kiln_shape_make_array(a, &s, KILN_F32, &n, 1), 0);
  kiln_literal *l = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &l, NULL), 0);
  for (int64_t i = 0; i < n; i++) ((float *)l->data)[i] = v;
  kiln_arena_destroy(a);
  return l;
}

/* Executes `id` on one f32[n] argument; returns the gRPC code, fills *secs. */
static kiln_rpc_code execute(kiln_client *c, const char *id, int64_t n, int64_t deadline_ms,
                             double *secs, kiln_status *st) {
  kiln_literal *x = vector(n, 0.5f);
  kiln_remote_arg args[1] = {{.literal = x}};
  kiln_remote_execute_options o = {.deadline_ms = deadline_ms};
  kiln_remote_result r;
  kiln_status_clear(st);
  double t0 = itest_now();
  int rc = kiln_client_execute(c, id, args, 1, &o, &r, st);
  *secs = itest_now() - t0;
  if (rc == 0) {
    ck_assert_uint_eq(r.noutputs, 1);
    if (n == 4) ck_assert(fabsf(((const float *)r.outputs[0].literal->data)[3] + 0.5f) < 1e-6f);
    kiln_remote_result_free(&r);
  }
  kiln_literal_destroy(x);
  return kiln_rpc_status_code(st);
}

/* The value of the first sample `name` with labels containing `labels`
 * (NULL: any) on /metrics, or 0. */
static double metric(const char *name, const char *labels) {
  int status = 0;
  char *body = NULL;
  size_t len = 0;
  ck_assert_int_eq(itest_http_get(server.metrics, "/metrics", &status, &body, &len), 0);
  ck_assert_int_eq(status, 200);
  itest_metrics m;
  char err[256];
  ck_assert_msg(itest_metrics_parse(body, &m, err, sizeof err) == 0, "%s", err);
  double v = itest_metrics_value(&m, name, labels);
  itest_metrics_free(&m);
  free(body);
  return isnan(v) ? 0 : v;
}

/* kiln_requests_total{method="Execute",code=`code`}, or 0. */
static double executes_answered(const char *code) {
  char labels[96];
  snprintf(labels, sizeof labels, "method=\"Execute\",code=\"%s\"", code);
  return metric("kiln_requests_total", labels);
}

/* Waits up to 5 s for the server to have answered `want` Executes with
 * `code` (the reply to a call whose caller left is counted when sent). */
static void expect_answered(const char *code, double want) {
  double got = 0;
  for (int i = 0; i < 100 && (got = executes_answered(code)) < want; i++) usleep(50000);
  ck_assert_msg(got >= want, "%g Executes answered %s, expected %g", got, code, want);
}

/* After a stopped run: the device takes the next request at once. */
static void next_runs_at_once(kiln_client *c, const char *backend) {
  char *neg = compile(c, negate_text, backend);
  kiln_status st;
  double secs;
  kiln_rpc_code code = execute(c, neg, 4, 20000, &secs, &st);
  ck_assert_msg(code == KILN_RPC_OK, "%s: next request: %s: %s", backend, st.where, st.msg);
  ck_assert_msg(secs < 2.0, "%s: the next request took %.3f s", backend, secs);
  free(neg);
}

static void deadline_stops_run(const char *backend) {
  kiln_client *c = connect_as(backend);
  char *spin = compile(c, spin_text, backend);
  double before = executes_answered("DEADLINE_EXCEEDED");
  kiln_status st;
  double secs;
  kiln_rpc_code code = execute(c, spin, 1024, 300, &secs, &st);
  ck_assert_msg(code == KILN_RPC_DEADLINE_EXCEEDED, "%s: got %s: %s", backend,
                kiln_rpc_code_name(code), st.msg);
  ck_assert_msg(secs < 3.0, "%s: the deadline came after %.3f s", backend, secs);
  next_runs_at_once(c, backend);
  /* The server itself stopped the run and answered so (not only the
   * client's own deadline). */
  expect_answered("DEADLINE_EXCEEDED", before + 1);
  free(spin);
  kiln_client_close(c);
}

START_TEST(test_deadline_cpu) { deadline_stops_run("cpu"); }
END_TEST

START_TEST(test_deadline_interp) { deadline_stops_run("interp"); }
END_TEST

/* A child starts the endless run without a deadline and is killed while it
 * waits; the run must stop although no deadline would ever end it (the
 * server's run timeout is 300 s). */
static void caller_leaving_stops_run(const char *backend) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    kiln_client_options o = {.client_id = "leaver"};
    kiln_client *c = NULL;
    kiln_status st;
    kiln_status_clear(&st);
    if (kiln_client_connect(server.addr, &o, &c, &st) != 0) _exit(3);
    char *spin = compile(c, spin_text, backend);
    double secs;
    execute(c, spin, 1024, -1, &secs, &st);
    _exit(4); /* not reached: killed first */
  }
  /* The parent stays off gRPC until the child is gone (no gRPC across a
   * fork): it watches /metrics for the run to start. */
  double running = 0;
  for (int i = 0; i < 1200 && (running = metric("kiln_running_executions", NULL)) < 1; i++) {
    int st = 0;
    ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "the child ended before its run started");
    usleep(50000);
  }
  ck_assert_msg(running >= 1, "the child's run never started");
  usleep(200000);
  kill(pid, SIGKILL);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFSIGNALED(status));
  kiln_client *c = connect_as(backend);
  next_runs_at_once(c, backend);
  expect_answered("CANCELLED", 1);
  kiln_client_close(c);
}

/* Executes spin_n with n iterations and no deadline. */
static int run_spin_n(kiln_client *c, const char *id, int n) {
  kiln_literal *x = vector(1024, 0.5f);
  char text[32];
  snprintf(text, sizeof text, "s32[] %d", n);
  kiln_literal *nl = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_literal_parse_text(text, strlen(text), &nl, &st)) return -1;
  kiln_remote_arg args[2] = {{.literal = x}, {.literal = nl}};
  kiln_remote_execute_options o = {.deadline_ms = -1};
  kiln_remote_result r;
  int rc = kiln_client_execute(c, id, args, 2, &o, &r, &st);
  if (rc == 0) kiln_remote_result_free(&r);
  kiln_literal_destroy(x);
  kiln_literal_destroy(nl);
  return rc;
}

/* The fast path: an executable whose recent runs were short runs on the
 * completion-queue thread. This call's arguments make it run for minutes;
 * its caller leaving must stop it as on a device worker. */
static void caller_leaving_stops_fast_run(const char *backend) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    kiln_client_options o = {.client_id = "fast-leaver"};
    kiln_client *c = NULL;
    kiln_status st;
    kiln_status_clear(&st);
    if (kiln_client_connect(server.addr, &o, &c, &st) != 0) _exit(3);
    char *id = compile(c, spin_n_text, backend);
    for (int i = 0; i < 8; i++)
      if (run_spin_n(c, id, 1) != 0) _exit(5);
    run_spin_n(c, id, 2000000000);
    _exit(4); /* not reached: killed first */
  }
  double running = 0;
  for (int i = 0; i < 1200; i++) {
    int st = 0;
    ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "the child ended before its long run");
    /* the short runs come and go; the long one stays */
    if ((running = metric("kiln_running_executions", NULL)) >= 1) {
      usleep(300000);
      if ((running = metric("kiln_running_executions", NULL)) >= 1) break;
    }
    usleep(20000);
  }
  ck_assert_msg(running >= 1, "the child's run never started");
  double before = executes_answered("CANCELLED");
  kill(pid, SIGKILL);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFSIGNALED(status));
  kiln_client *c = connect_as(backend);
  next_runs_at_once(c, backend);
  expect_answered("CANCELLED", before + 1);
  kiln_client_close(c);
}

START_TEST(test_caller_leaves_fast_cpu) { caller_leaving_stops_fast_run("cpu"); }
END_TEST

START_TEST(test_caller_leaves_fast_interp) { caller_leaving_stops_fast_run("interp"); }
END_TEST

START_TEST(test_caller_leaves_cpu) { caller_leaving_stops_run("cpu"); }
END_TEST

START_TEST(test_caller_leaves_interp) { caller_leaving_stops_run("interp"); }
END_TEST

static Suite *cancel_suite(void) {
  Suite *s = suite_create("cancel");
  TCase *tc = tcase_create("running work");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_deadline_cpu);
  tcase_add_test(tc, test_deadline_interp);
  tcase_add_test(tc, test_caller_leaves_cpu);
  tcase_add_test(tc, test_caller_leaves_interp);
  tcase_add_test(tc, test_caller_leaves_fast_cpu);
  tcase_add_test(tc, test_caller_leaves_fast_interp);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  itest_require_kilnd("test_cancel");
  const char *extra[] = {"--cpu-devices", "1", "--interp-devices", "1", NULL};
  if (itest_kilnd_start(&server, extra)) return 1;
  return itest_run_suite("test_cancel", cancel_suite(), &server);
}
