/* Fair scheduling at one device, end to end: a kilnd with a single
 * interpreter device, a "heavy" client keeping four executions of about
 * 200 ms in flight at all times (so it always has work queued behind the
 * one running), and a "light" client sending one execution at a time.
 * Each light call must wait behind at most one run of the heavy client's:
 * at most one heavy call may end between the light call's send and its
 * answer (the run in progress when it came), give or take a reply in
 * flight. Before the fix the light client waited behind the heavy run in
 * progress and the next one.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/kiln.h"
#include "compiler/ir/text.h"
#include "tests/integration/itest.h"

#define NHEAVY 4
#define NLIGHT 8
#define MAX_ENDS 4096

static itest_kilnd server;

static char exe_id[128];
static int32_t spin_n;
static double heavy_ends[MAX_ENDS]; /* when each heavy call was answered */
static atomic_int nheavy_ends, heavy_errors;
static atomic_bool stop;

static kiln_client *connect_as(const char *name) {
  kiln_client_options o = {.client_id = name};
  kiln_client *c = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_connect(server.addr, &o, &c, &st) == 0, "connect: %s", st.msg);
  return c;
}

static int execute(kiln_client *c, int32_t n, kiln_status *st) {
  kiln_literal *arg;
  char text[32];
  int len = snprintf(text, sizeof text, "s32[] %d", n);
  if (kiln_literal_parse_text(text, (size_t)len, &arg, st)) return -1;
  kiln_remote_arg args[1] = {{.literal = arg}};
  kiln_remote_result r;
  int rc = kiln_client_execute(c, exe_id, args, 1, NULL, &r, st);
  if (rc == 0) {
    if (r.noutputs != 1 || kiln_literal_get_s64(r.outputs[0].literal, 0) != n) rc = -1;
    kiln_remote_result_free(&r);
  }
  kiln_literal_destroy(arg);
  return rc;
}

/* One execution takes about 200 ms. */
static void calibrate(kiln_client *c) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_compile_options o = {.backend = "interp"};
  kiln_remote_executable *e;
  ck_assert_msg(kiln_client_compile_text(c, itest_spin_hlo, strlen(itest_spin_hlo), &o, &e, &st) ==
                    0,
                "%s", st.msg);
  snprintf(exe_id, sizeof exe_id, "%s", e->id);
  kiln_remote_executable_free(e);
  /* Twice: the first guess (call overhead included) sizes a run long
   * enough for the second to measure the loop alone. */
  int32_t n = 100000;
  double per = 0;
  for (int round = 0; round < 2; round++) {
    double t0 = itest_now();
    ck_assert_int_eq(execute(c, n, &st), 0);
    per = (itest_now() - t0) / n;
    double next = 0.05 / (per > 0 ? per : 1e-9);
    n = next > 2e8 ? 200000000 : next < 1000 ? 1000 : (int32_t)next;
  }
  double want = 0.200 / (per > 0 ? per : 1e-9);
  spin_n = want > 2e8 ? 200000000 : want < 1000 ? 1000 : (int32_t)want;
}

static void *heavy(void *arg) {
  (void)arg;
  kiln_client *c = connect_as("heavy");
  while (!atomic_load(&stop)) {
    kiln_status st;
    kiln_status_clear(&st);
    if (execute(c, spin_n, &st) != 0) atomic_fetch_add(&heavy_errors, 1);
    int i = atomic_fetch_add(&nheavy_ends, 1);
    if (i < MAX_ENDS) heavy_ends[i] = itest_now();
  }
  kiln_client_close(c);
  return NULL;
}

START_TEST(test_light_waits_one_heavy_run) {
  kiln_client *light = connect_as("light");
  calibrate(light);
  pthread_t t[NHEAVY];
  for (int i = 0; i < NHEAVY; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, heavy, NULL), 0);
  /* Let the heavy client fill its queue. */
  struct timespec settle = {0, 400000000};
  nanosleep(&settle, NULL);
  double sent[NLIGHT], answered[NLIGHT];
  for (int k = 0; k < NLIGHT; k++) {
    kiln_status st;
    kiln_status_clear(&st);
    sent[k] = itest_now();
    ck_assert_msg(execute(light, spin_n / 10, &st) == 0, "light call %d: %s", k, st.msg);
    answered[k] = itest_now();
    struct timespec gap = {0, 37000000}; /* land at varying points of a heavy run */
    nanosleep(&gap, NULL);
  }
  atomic_store(&stop, true);
  for (int i = 0; i < NHEAVY; i++) pthread_join(t[i], NULL);
  ck_assert_int_eq(atomic_load(&heavy_errors), 0);
  int n = atomic_load(&nheavy_ends);
  if (n > MAX_ENDS) n = MAX_ENDS;
  /* A heavy answer seen after the light call was sent may belong to a run
   * that ended on the device just before the light request got there (its
   * reply was on its way); then the run in progress is the next one, and
   * two heavy answers arrive meanwhile. That takes a light call landing
   * within a reply's latency of a heavy run's end, rarely; waiting behind
   * two runs, as before the fix, makes every light call see two or more. */
  int worst = 0, twos = 0;
  for (int k = 0; k < NLIGHT; k++) {
    int ends = 0;
    for (int i = 0; i < n; i++) ends += heavy_ends[i] > sent[k] && heavy_ends[i] < answered[k];
    printf("test_scheduler_fair: light call %d: %.0f ms, %d heavy runs ended meanwhile\n", k,
           (answered[k] - sent[k]) * 1e3, ends);
    if (ends > worst) worst = ends;
    twos += ends >= 2;
  }
  ck_assert_msg(worst <= 2, "a light call waited behind %d heavy runs", worst);
  ck_assert_msg(twos <= NLIGHT / 4, "%d of %d light calls saw two heavy runs end meanwhile", twos,
                NLIGHT);
  kiln_client_close(light);
}
END_TEST

int main(void) {
  itest_require_kilnd("test_scheduler_fair");
  const char *extra[] = {"--interp-devices", "1", NULL};
  if (itest_kilnd_start(&server, extra)) return 1;
  Suite *s = suite_create("scheduler_fair");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_light_waits_one_heavy_run);
  suite_add_tcase(s, tc);
  return itest_run_suite("test_scheduler_fair", s, &server);
}
