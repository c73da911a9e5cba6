/* SIGTERM under load: the server drains, and no request it accepted is
 * lost. Before it, the signals that must not drain (SIGHUP, SIGUSR1,
 * SIGUSR2, SIGPIPE) come under the same load and refuse nothing.
 *
 * Eight clients keep executions (each a loop that runs for about 150 ms on
 * the interpreter) and uploads going; a second into the
 * load the server gets SIGTERM. From then on a new request may be refused,
 * but only with UNAVAILABLE; every request that was already running must
 * finish with the right answer; and the server must exit with status 0
 * once the last one is answered. A request counts as already running when
 * it was sent more than 50 ms before the signal and had not been answered
 * when the signal came.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "clients/c/kiln.h"
#include "compiler/ir/text.h"
#include "tests/integration/itest.h"

#define NWORKERS 8
#define MAX_CALLS 20000

static itest_kilnd server;

typedef struct call_record {
  double start, end;
  kiln_rpc_code code;
  bool wrong; /* OK but with a wrong answer */
  const char *what;
  char msg[160];
} call_record;

static call_record calls[MAX_CALLS];
static atomic_int ncalls;
static atomic_bool stop;
static int32_t spin_n;
static char exe_id[128];

static call_record *record(const char *what, double start, double end, const kiln_status *st,
                           bool wrong) {
  int i = atomic_fetch_add(&ncalls, 1);
  if (i >= MAX_CALLS) return NULL;
  call_record *r = &calls[i];
  r->start = start;
  r->end = end;
  r->code = kiln_rpc_status_code(st);
  r->wrong = wrong;
  r->what = what;
  snprintf(r->msg, sizeof r->msg, "%.150s", st->msg);
  return r;
}

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  char name[32];
  snprintf(name, sizeof name, "drain-%d", id);
  kiln_client_options o = {.client_id = name};
  kiln_client *c;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_connect(server.addr, &o, &c, &st)) return NULL;
  kiln_arena *a = kiln_arena_create();
  kiln_shape s32, big;
  int64_t n = 1 << 18; /* 1 MiB of u32 */
  kiln_shape_make_array(a, &s32, KILN_S32, NULL, 0);
  kiln_shape_make_array(a, &big, KILN_U32, &n, 1);
  kiln_literal *arg_n;
  kiln_literal_create(NULL, &s32, 0, &arg_n, NULL);
  kiln_literal_set_s64(arg_n, 0, spin_n);
  uint32_t *data = calloc((size_t)n, 4);
  for (int k = 0; !atomic_load(&stop); k++) {
    kiln_status_clear(&st);
    double t0 = itest_now();
    if (k % 4 == 3) {
      kiln_remote_buffer h;
      int rc = kiln_client_put_buffer_raw(c, &big, data, (size_t)n * 4, NULL, &h, &st);
      record("PutBuffer", t0, itest_now(), &st, false);
      if (rc == 0) {
        const char *hs[1] = {h.handle};
        kiln_status_clear(&st);
        t0 = itest_now();
        kiln_client_release_buffers(c, hs, 1, NULL, NULL, &st);
        record("ReleaseBuffers", t0, itest_now(), &st, false);
        kiln_remote_buffer_clear(&h);
      }
    } else {
      kiln_remote_arg args[1] = {{.literal = arg_n}};
      kiln_remote_result r;
      int rc = kiln_client_execute(c, exe_id, args, 1, NULL, &r, &st);
      bool wrong = false;
      if (rc == 0) {
        wrong = r.noutputs != 1 || r.outputs[0].literal == NULL ||
                kiln_literal_get_s64(r.outputs[0].literal, 0) != spin_n;
        kiln_remote_result_free(&r);
      }
      record("Execute", t0, itest_now(), &st, wrong);
    }
    /* Once refused, the server is going away: stop sending. */
    if (st.code && kiln_rpc_status_code(&st) == KILN_RPC_UNAVAILABLE) break;
  }
  free(data);
  kiln_literal_destroy(arg_n);
  kiln_arena_destroy(a);
  kiln_client_close(c);
  return NULL;
}

/* Picks the loop count so that one execution takes about 150 ms: long
 * enough that several are always running when the signal comes. */
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
  kiln_literal *arg;
  ck_assert_int_eq(kiln_literal_parse_text("s32[] 100000", 12, &arg, &st), 0);
  kiln_remote_arg args[1] = {{.literal = arg}};
  kiln_remote_result r;
  double t0 = itest_now();
  ck_assert_msg(kiln_client_execute(c, exe_id, args, 1, NULL, &r, &st) == 0, "%s", st.msg);
  double per = (itest_now() - t0) / 100000;
  kiln_remote_result_free(&r);
  kiln_literal_destroy(arg);
  double want = 0.150 / (per > 0 ? per : 1e-9);
  spin_n = want > 2e8 ? 200000000 : want < 1000 ? 1000 : (int32_t)want;
}

/* SIGHUP (reload), SIGUSR1, SIGUSR2 and SIGPIPE under the same load drain
 * nothing and refuse nothing: every call answers OK and right, the server
 * stays up and healthy. (It runs before the SIGTERM case, on the same
 * server.) */
START_TEST(test_other_signals_keep_serving) {
  kiln_client *c;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_connect(server.addr, NULL, &c, &st), 0);
  calibrate(c);
  pthread_t t[NWORKERS];
  for (int i = 0; i < NWORKERS; i++)
    ck_assert_int_eq(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i), 0);
  const int sigs[] = {SIGHUP, SIGUSR1, SIGUSR2, SIGPIPE, SIGHUP, SIGUSR1};
  struct timespec gap = {0, 250000000};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    nanosleep(&gap, NULL);
    ck_assert_int_eq(kill(server.pid, sigs[i]), 0);
  }
  nanosleep(&gap, NULL);
  atomic_store(&stop, true);
  for (int i = 0; i < NWORKERS; i++) pthread_join(t[i], NULL);
  ck_assert_msg(itest_kilnd_alive(&server), "kilnd died of a signal it should not die of");
  int n = atomic_load(&ncalls);
  for (int i = 0; i < n && i < MAX_CALLS; i++) {
    ck_assert_msg(!calls[i].wrong, "call %d answered OK with a wrong result", i);
    ck_assert_msg(calls[i].code == KILN_RPC_OK, "call %d (%s) failed with %s: %s", i, calls[i].what,
                  kiln_rpc_code_name(calls[i].code), calls[i].msg);
  }
  ck_assert_int_gt(n, NWORKERS);
  bool serving = false;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_health(c, NULL, &serving, &st), 0);
  ck_assert(serving);
  kiln_client_close(c);
}
END_TEST

START_TEST(test_sigterm_under_load) {
  kiln_client *c;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_connect(server.addr, NULL, &c, &st), 0);
  calibrate(c);
  kiln_client_close(c);

  pthread_t t[NWORKERS];
  for (int i = 0; i < NWORKERS; i++)
    ck_assert_int_eq(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i), 0);
  struct timespec one = {1, 0};
  nanosleep(&one, NULL);
  double t_sig = itest_now();
  ck_assert_int_eq(kill(server.pid, SIGTERM), 0);
  /* Workers stop on their own once refused; the rest stop after 5 s. */
  struct timespec tick = {0, 50000000};
  while (itest_now() - t_sig < 5 && itest_kilnd_alive(&server)) nanosleep(&tick, NULL);
  atomic_store(&stop, true);
  for (int i = 0; i < NWORKERS; i++) pthread_join(t[i], NULL);
  double t_exit = itest_now();
  while (itest_kilnd_alive(&server) && itest_now() - t_exit < 40) nanosleep(&tick, NULL);
  ck_assert_msg(!itest_kilnd_alive(&server), "kilnd still running 40 s after the load ended");

  int n = atomic_load(&ncalls), ok = 0, refused = 0, in_flight = 0, in_flight_ok = 0;
  for (int i = 0; i < n && i < MAX_CALLS; i++) {
    const call_record *r = &calls[i];
    ck_assert_msg(!r->wrong, "call %d answered OK with a wrong result", i);
    ck_assert_msg(r->code == KILN_RPC_OK || r->code == KILN_RPC_UNAVAILABLE,
                  "call %d (%s, sent %.3f s after SIGTERM, answered %.3f s after) failed with "
                  "%s: %s",
                  i, r->what, r->start - t_sig, r->end - t_sig, kiln_rpc_code_name(r->code),
                  r->msg);
    ok += r->code == KILN_RPC_OK;
    refused += r->code == KILN_RPC_UNAVAILABLE;
    if (r->start < t_sig - 0.05 && r->end > t_sig) {
      in_flight++;
      in_flight_ok += r->code == KILN_RPC_OK;
      ck_assert_msg(r->code == KILN_RPC_OK,
                    "call %d was running when SIGTERM came (sent %.3f s before) and failed: "
                    "%s: %s",
                    i, t_sig - r->start, kiln_rpc_code_name(r->code), r->msg);
    }
  }
  printf("test_drain: %d calls (%d ok, %d refused); %d running at SIGTERM, all %d answered; "
         "loop of %d iterations\n",
         n, ok, refused, in_flight, in_flight_ok, spin_n);
  ck_assert_msg(in_flight >= NWORKERS / 4, "only %d calls were running at SIGTERM", in_flight);
}
END_TEST

int main(void) {
  itest_require_kilnd("test_drain");
  const char *extra[] = {"--interp-devices", "4", "--cpu-devices", "2", NULL};
  if (itest_kilnd_start(&server, extra)) return 1;
  Suite *s = suite_create("drain");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_other_signals_keep_serving);
  tcase_add_test(tc, test_sigterm_under_load);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  /* The case signalled and watched the server; its exit status is read
   * here, by its parent. */
  int status = itest_kilnd_stop(&server, 0, 45);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "test_drain: kilnd did not exit 0 after SIGTERM (status %d)\n", status);
    failed++;
  }
  if (failed) itest_kilnd_dump_log(&server);
  return failed ? 1 : 0;
}
