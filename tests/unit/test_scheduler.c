/* Unit tests for the scheduler: round-robin order across clients, FIFO
 * within one, the queue bounds (total and per client) with their messages,
 * deadlines and cancellation of waiting jobs, device classes, gang jobs on
 * several devices (not starved by single-device jobs), close and destroy with queued work, running
 * at once on the caller's thread, the done callback, a newcomer waiting behind at most one run of a
 * busy client's. A "gate" job holds a device until the test opens it, so the queue can be filled
 * first. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "executor/scheduler.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static bool gate_open;
static char order[64][16]; /* labels in run order */
static int nrun;
static int drops[64], ndrops;
static uint32_t last_devices[8], last_ndev;

static int holds_open; /* a job labelled "holdN" runs once this reaches N */

typedef struct tjob {
  char label[16];
  bool gate;
  int hold;
} tjob;

static void run(void *arg, const uint32_t *devices, uint32_t n) {
  tjob *j = arg;
  pthread_mutex_lock(&mu);
  if (j->gate)
    while (!gate_open) pthread_cond_wait(&cv, &mu);
  while (holds_open < j->hold) pthread_cond_wait(&cv, &mu);
  strcpy(order[nrun++], j->label);
  last_ndev = n;
  for (uint32_t i = 0; i < n && i < 8; i++) last_devices[i] = devices[i];
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

static void drop(void *arg, int code) {
  (void)arg;
  pthread_mutex_lock(&mu);
  drops[ndrops++] = code;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

static void open_gate(void) {
  pthread_mutex_lock(&mu);
  gate_open = true;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

static kiln_sched *make(uint32_t cls0, uint32_t cls1, uint32_t maxq, uint32_t per_client) {
  kiln_sched_options o = {.nclasses = cls1 ? 2 : 1,
                          .class_devices = {cls0, cls1},
                          .max_queued = maxq,
                          .max_queued_per_client = per_client};
  kiln_sched *s = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_sched_create(&o, &s, &st) == 0, "%s", st.msg);
  return s;
}

static tjob jobs[64];
static int njobs;

static int submit(kiln_sched *s, const char *client, const char *label, uint32_t cls, uint32_t ndev,
                  int64_t deadline, const atomic_int *cancel, kiln_status *st) {
  tjob *j = &jobs[njobs++];
  snprintf(j->label, sizeof j->label, "%s", label);
  j->gate = strcmp(label, "gate") == 0;
  j->hold = strncmp(label, "hold", 4) == 0 ? atoi(label + 4) : 0;
  kiln_sched_job d = {.client = client,
                      .dev_class = cls,
                      .ndevices = ndev,
                      .deadline_ns = deadline,
                      .cancelled = cancel,
                      .run = run,
                      .drop = drop,
                      .arg = j};
  return kiln_sched_submit(s, &d, st);
}

/* Waits until the gate job holds its device. */
static void wait_running(kiln_sched *s, uint32_t n) {
  for (int i = 0; i < 5000 && kiln_sched_running(s) < n; i++) usleep(1000);
  ck_assert_uint_eq(kiln_sched_running(s), n);
}

START_TEST(test_round_robin) {
  kiln_sched *s = make(1, 0, 0, 0);
  ck_assert_int_eq(submit(s, "a", "gate", 0, 1, 0, NULL, NULL), 0);
  wait_running(s, 1);
  const char *labels[] = {"a1", "a2", "a3", "a4"};
  for (int i = 0; i < 4; i++) ck_assert_int_eq(submit(s, "a", labels[i], 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "b", "b1", 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "b", "b2", 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "c", "c1", 0, 1, 0, NULL, NULL), 0);
  ck_assert_uint_eq(kiln_sched_queued(s), 7);
  open_gate();
  kiln_sched_wait_idle(s);
  const char *want[] = {"gate", "a1", "b1", "c1", "a2", "b2", "a3", "a4"};
  ck_assert_int_eq(nrun, 8);
  for (int i = 0; i < 8; i++) ck_assert_str_eq(order[i], want[i]);
  kiln_sched_device_stats ds;
  ck_assert(kiln_sched_device_stats_get(s, 0, &ds));
  ck_assert_uint_eq(ds.executions, 8);
  ck_assert(!kiln_sched_device_stats_get(s, 1, &ds));
  kiln_sched_destroy(s);
}
END_TEST

static void open_hold(int n) {
  pthread_mutex_lock(&mu);
  holds_open = n;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

static void wait_nrun(int n) {
  for (int i = 0; i < 5000; i++) {
    pthread_mutex_lock(&mu);
    int got = nrun;
    pthread_mutex_unlock(&mu);
    if (got >= n) return;
    usleep(1000);
  }
  ck_abort_msg("fewer than %d jobs ran", n);
}

/* One device, client a busy with more queued behind its running job: b,
 * arriving while a runs, goes next, not after a's next job (it waits
 * behind one run of a's, not two). The same with a third client c that
 * waited already: c, then b, then a again. */
START_TEST(test_newcomer_waits_one_run) {
  kiln_sched *s = make(1, 0, 0, 0);
  ck_assert_int_eq(submit(s, "a", "hold1", 0, 1, 0, NULL, NULL), 0);
  wait_running(s, 1);
  ck_assert_int_eq(submit(s, "a", "hold2", 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "a", "a3", 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "a", "hold3", 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "a", "a5", 0, 1, 0, NULL, NULL), 0);
  open_hold(1); /* hold1 ends; a's hold2 starts and a still has jobs queued */
  wait_nrun(1);
  wait_running(s, 1);
  ck_assert_uint_eq(kiln_sched_queued(s), 3);
  ck_assert_int_eq(submit(s, "b", "b1", 0, 1, 0, NULL, NULL), 0);
  open_hold(2); /* hold2 ends: b1 next, then a3, hold3 (held) */
  wait_nrun(3);
  wait_running(s, 1);
  pthread_mutex_lock(&mu);
  ck_assert_str_eq(order[1], "hold2");
  ck_assert_str_eq(order[2], "b1");
  pthread_mutex_unlock(&mu);
  /* a's hold3 runs now (a3 ran after b1); c waited, b comes back. */
  for (int i = 0; i < 5000 && kiln_sched_queued(s) != 1; i++) usleep(1000);
  ck_assert_int_eq(submit(s, "c", "c1", 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "b", "b2", 0, 1, 0, NULL, NULL), 0);
  open_hold(3);
  kiln_sched_wait_idle(s);
  const char *want[] = {"hold1", "hold2", "b1", "a3", "hold3", "c1", "b2", "a5"};
  ck_assert_int_eq(nrun, 8);
  for (int i = 0; i < 8; i++)
    ck_assert_msg(strcmp(order[i], want[i]) == 0, "run %d: %s, not %s", i, order[i], want[i]);
  kiln_sched_destroy(s);
}
END_TEST

START_TEST(test_queue_bounds) {
  kiln_sched *s = make(1, 0, 3, 2);
  kiln_status st;
  ck_assert_int_eq(submit(s, "a", "gate", 0, 1, 0, NULL, NULL), 0);
  wait_running(s, 1);
  ck_assert_int_eq(submit(s, "a", "a1", 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "a", "a2", 0, 1, 0, NULL, NULL), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(submit(s, "a", "a3", 0, 1, 0, NULL, &st), KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "this client already has 2 executions queued (the limit)");
  ck_assert_int_eq(submit(s, "b", "b1", 0, 1, 0, NULL, NULL), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(submit(s, "c", "c1", 0, 1, 0, NULL, &st), KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "execution queue is full (3 jobs)");
  open_gate();
  kiln_sched_wait_idle(s);
  ck_assert_int_eq(nrun, 4);
  ck_assert_int_eq(ndrops, 0);
  kiln_sched_destroy(s);
}
END_TEST

/* A client's own queue limit (a token's queue=N) overrides the server-wide
 * one, both ways; an empty table restores the default. */
START_TEST(test_queue_quota_override) {
  kiln_sched *s = make(1, 0, 16, 2);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_client_quota q[] = {{.client = "big", .queued = 4}, {.client = "small", .queued = 1}};
  ck_assert_int_eq(kiln_sched_set_quotas(s, q, 2, &st), 0);
  ck_assert_int_eq(submit(s, "x", "gate", 0, 1, 0, NULL, NULL), 0);
  wait_running(s, 1);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(submit(s, "big", "b", 0, 1, 0, NULL, NULL), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(submit(s, "big", "b", 0, 1, 0, NULL, &st), KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "this client already has 4 executions queued (the limit)");
  ck_assert_int_eq(submit(s, "small", "s", 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "small", "s", 0, 1, 0, NULL, NULL), KILN_ELIMIT);
  ck_assert_int_eq(submit(s, "other", "o", 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "other", "o", 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "other", "o", 0, 1, 0, NULL, NULL), KILN_ELIMIT);
  ck_assert_int_eq(kiln_sched_set_quotas(s, NULL, 0, &st), 0);
  ck_assert_int_eq(submit(s, "small", "s", 0, 1, 0, NULL, NULL), 0); /* back to 2 */
  kiln_client_quota dup[] = {{.client = "a", .queued = 1}, {.client = "a", .queued = 2}};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_sched_set_quotas(s, dup, 2, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "client 'a' has two quota entries");
  open_gate();
  kiln_sched_wait_idle(s);
  ck_assert_int_eq(nrun, 9);
  kiln_sched_destroy(s);
}
END_TEST

START_TEST(test_deadline_and_cancel) {
  kiln_sched *s = make(1, 0, 0, 0);
  static atomic_int cancel;
  ck_assert_int_eq(submit(s, "a", "gate", 0, 1, 0, NULL, NULL), 0);
  wait_running(s, 1);
  int64_t soon = kiln_sched_now_ns() + 20 * 1000000;
  ck_assert_int_eq(submit(s, "a", "late", 0, 1, soon, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "b", "gone", 0, 1, 0, &cancel, NULL), 0);
  ck_assert_int_eq(submit(s, "c", "fine", 0, 1, kiln_sched_now_ns() + 60000000000, NULL, NULL), 0);
  ck_assert_uint_eq(kiln_sched_expire(s), 0);
  atomic_store(&cancel, 1);
  ck_assert_uint_eq(kiln_sched_expire(s), 1);
  usleep(30000);
  ck_assert_uint_eq(kiln_sched_expire(s), 1);
  ck_assert_int_eq(ndrops, 2);
  ck_assert_int_eq(drops[0], KILN_ECANCELED);
  ck_assert_int_eq(drops[1], KILN_EDEADLINE);
  ck_assert_uint_eq(kiln_sched_queued(s), 1);
  open_gate();
  kiln_sched_wait_idle(s);
  ck_assert_int_eq(nrun, 2);
  ck_assert_str_eq(order[1], "fine");
  kiln_sched_destroy(s);
}
END_TEST

/* Workers also drop a dead job when they come to it, without the timer. */
START_TEST(test_worker_drops_expired) {
  kiln_sched *s = make(1, 0, 0, 0);
  ck_assert_int_eq(submit(s, "a", "gate", 0, 1, 0, NULL, NULL), 0);
  wait_running(s, 1);
  ck_assert_int_eq(submit(s, "a", "late", 0, 1, kiln_sched_now_ns() + 1000000, NULL, NULL), 0);
  usleep(5000);
  open_gate();
  kiln_sched_wait_idle(s);
  ck_assert_int_eq(nrun, 1);
  ck_assert_int_eq(ndrops, 1);
  ck_assert_int_eq(drops[0], KILN_EDEADLINE);
  kiln_sched_destroy(s);
}
END_TEST

START_TEST(test_classes_and_gangs) {
  kiln_sched *s = make(3, 2, 0, 0);
  kiln_status st;
  ck_assert_uint_eq(kiln_sched_device_count(s), 5);
  ck_assert_uint_eq(kiln_sched_class_first(s, 1), 3);
  ck_assert_uint_eq(kiln_sched_class_devices(s, 1), 2);
  gate_open = true;
  ck_assert_int_eq(submit(s, "a", "gang", 0, 3, 0, NULL, NULL), 0);
  kiln_sched_wait_idle(s);
  ck_assert_uint_eq(last_ndev, 3);
  bool seen[3] = {false, false, false};
  for (int i = 0; i < 3; i++) {
    ck_assert_uint_lt(last_devices[i], 3);
    seen[last_devices[i]] = true;
  }
  ck_assert(seen[0] && seen[1] && seen[2]);
  ck_assert_int_eq(submit(s, "a", "interp", 1, 1, 0, NULL, NULL), 0);
  kiln_sched_wait_idle(s);
  ck_assert_uint_eq(last_ndev, 1);
  ck_assert_uint_ge(last_devices[0], 3);
  kiln_status_clear(&st);
  ck_assert_int_eq(submit(s, "a", "big", 0, 4, 0, NULL, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "job needs 4 devices; the class has 3");
  kiln_status_clear(&st);
  ck_assert_int_eq(submit(s, "a", "nope", 2, 1, 0, NULL, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "no device class 2");
  kiln_sched_destroy(s);
}
END_TEST

static void *destroy_thread(void *arg) {
  kiln_sched_destroy(arg);
  return NULL;
}

START_TEST(test_close_and_destroy) {
  kiln_sched *s = make(1, 0, 0, 0);
  kiln_status st;
  ck_assert_int_eq(submit(s, "a", "gate", 0, 1, 0, NULL, NULL), 0);
  wait_running(s, 1);
  ck_assert_int_eq(submit(s, "a", "q1", 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "b", "q2", 0, 1, 0, NULL, NULL), 0);
  kiln_sched_close(s);
  kiln_status_clear(&st);
  ck_assert_int_eq(submit(s, "a", "q3", 0, 1, 0, NULL, &st), KILN_EUNAVAIL);
  ck_assert_str_eq(st.msg, "the server is shutting down");
  /* destroy drops the queued jobs; the running one finishes first. */
  pthread_t t;
  pthread_create(&t, NULL, destroy_thread, s);
  usleep(20000);
  open_gate();
  pthread_join(t, NULL);
  ck_assert_int_eq(nrun, 1);
  ck_assert_int_eq(ndrops, 2);
  ck_assert_int_eq(drops[0], KILN_EUNAVAIL);
  ck_assert_int_eq(drops[1], KILN_EUNAVAIL);
}
END_TEST

START_TEST(test_bad_options) {
  kiln_sched *s = NULL;
  kiln_status st;
  kiln_sched_options o = {.nclasses = 0};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_sched_create(&o, &s, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "0 device classes (1 to 8 allowed)");
  o.nclasses = 1;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_sched_create(&o, &s, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "device class 0 has 0 devices (1 to 1024 in all allowed)");
  ck_assert_ptr_null(s);
  kiln_sched_destroy(NULL);
}
END_TEST

/* run_now runs on the calling thread only when no queued job of the class
 * would be overtaken and a device is free; a refusal calls nothing. */
static pthread_t ran_on;
static void where_run(void *arg, const uint32_t *devices, uint32_t n) {
  ran_on = pthread_self();
  run(arg, devices, n);
}

START_TEST(test_run_now) {
  kiln_sched *s = make(1, 1, 0, 0);
  tjob now1 = {.label = "now1"}, now2 = {.label = "now2"}, cls1 = {.label = "cls1"};
  kiln_sched_job d = {.client = "a", .ndevices = 1, .run = where_run, .drop = drop, .arg = &now1};
  ck_assert(kiln_sched_run_now(s, &d));
  ck_assert(pthread_equal(ran_on, pthread_self()));
  ck_assert_int_eq(nrun, 1);
  ck_assert_str_eq(order[0], "now1");
  ck_assert_uint_eq(last_devices[0], 0);
  ck_assert_uint_eq(kiln_sched_running(s), 0);
  kiln_sched_device_stats ds;
  ck_assert(kiln_sched_device_stats_get(s, 0, &ds));
  ck_assert_uint_eq(ds.executions, 1);
  ck_assert(!ds.busy);
  /* The device is busy: refused. */
  ck_assert_int_eq(submit(s, "a", "gate", 0, 1, 0, NULL, NULL), 0);
  wait_running(s, 1);
  d.arg = &now2;
  ck_assert(!kiln_sched_run_now(s, &d));
  /* Another class is free: runs. */
  kiln_sched_job d1 = {
      .client = "b", .dev_class = 1, .ndevices = 1, .run = where_run, .drop = drop, .arg = &cls1};
  ck_assert(kiln_sched_run_now(s, &d1));
  ck_assert_uint_eq(last_devices[0], 1);
  /* A queued job of the class is never overtaken, even once a device is
   * free: the queued one runs first, then run_now succeeds again. */
  ck_assert_int_eq(submit(s, "b", "q1", 0, 1, 0, NULL, NULL), 0);
  ck_assert(!kiln_sched_run_now(s, &d));
  open_gate();
  kiln_sched_wait_idle(s);
  ck_assert(kiln_sched_run_now(s, &d));
  /* (the gate job records its label when it is let through) */
  const char *want[] = {"now1", "cls1", "gate", "q1", "now2"};
  ck_assert_int_eq(nrun, 5);
  for (int i = 0; i < 5; i++) ck_assert_str_eq(order[i], want[i]);
  ck_assert_int_eq(ndrops, 0);
  /* Closed: refused. Bad jobs: refused. */
  kiln_sched_close(s);
  ck_assert(!kiln_sched_run_now(s, &d));
  d.dev_class = 5;
  ck_assert(!kiln_sched_run_now(s, &d));
  ck_assert_int_eq(nrun, 5);
  kiln_sched_destroy(s);
}
END_TEST

/* done follows run on the same thread, after the devices were freed, and
 * wait_idle waits for it. */
static kiln_sched *done_sched;
static atomic_int done_calls;
static bool done_saw_free, done_same_thread;
static pthread_t run_thread;

static void run_then(void *arg, const uint32_t *devices, uint32_t n) {
  (void)arg, (void)devices, (void)n;
  run_thread = pthread_self();
}

static void done_fn(void *arg, const uint32_t *devices, uint32_t n) {
  (void)arg, (void)n;
  kiln_sched_device_stats ds;
  kiln_sched_device_stats_get(done_sched, devices[0], &ds);
  done_saw_free = !ds.busy && ds.executions == 1;
  done_same_thread = pthread_equal(run_thread, pthread_self());
  usleep(20000);
  atomic_fetch_add(&done_calls, 1);
}

START_TEST(test_done_after_devices_free) {
  kiln_sched *s = done_sched = make(1, 0, 0, 0);
  kiln_sched_job d = {.client = "a", .ndevices = 1, .run = run_then, .done = done_fn, .drop = drop};
  ck_assert_int_eq(kiln_sched_submit(s, &d, NULL), 0);
  kiln_sched_wait_idle(s);
  ck_assert_int_eq(atomic_load(&done_calls), 1);
  ck_assert(done_saw_free);
  ck_assert(done_same_thread);
  ck_assert(kiln_sched_run_now(s, &d));
  ck_assert_int_eq(atomic_load(&done_calls), 2);
  ck_assert(pthread_equal(run_thread, pthread_self()));
  ck_assert_uint_eq(kiln_sched_running(s), 0);
  kiln_sched_destroy(s);
}
END_TEST

/* Many clients, many jobs, four devices: everything runs exactly once. */
static void count_run(void *arg, const uint32_t *devices, uint32_t n) {
  (void)devices, (void)n;
  atomic_fetch_add((atomic_int *)arg, 1);
}
/* A gang waiting for devices is not overtaken by single-device jobs queued
 * after it, which would otherwise keep taking the device it waits for. */
START_TEST(test_gang_not_starved) {
  kiln_sched *s = make(2, 0, 0, 0);
  gate_open = false;
  ck_assert_int_eq(submit(s, "a", "gate", 0, 1, 0, NULL, NULL), 0);
  wait_running(s, 1);
  ck_assert_int_eq(submit(s, "b", "gang", 0, 2, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "c", "c1", 0, 1, 0, NULL, NULL), 0);
  ck_assert_int_eq(submit(s, "c", "c2", 0, 1, 0, NULL, NULL), 0);
  usleep(50000); /* a free device that would take c1 at once */
  pthread_mutex_lock(&mu);
  ck_assert_int_eq(nrun, 0);
  pthread_mutex_unlock(&mu);
  ck_assert_uint_eq(kiln_sched_queued(s), 3);
  open_gate();
  kiln_sched_wait_idle(s);
  ck_assert_int_eq(nrun, 4);
  ck_assert_str_eq(order[0], "gate");
  ck_assert_str_eq(order[1], "gang");
  kiln_sched_destroy(s);
}
END_TEST

static void count_drop(void *arg, int code) {
  (void)code;
  atomic_fetch_add((atomic_int *)arg, 1000000);
}

START_TEST(test_stress) {
  kiln_sched *s = make(4, 0, 100000, 0);
  static atomic_int count;
  for (int i = 0; i < 20000; i++) {
    char client[16];
    snprintf(client, sizeof client, "c%d", i % 37);
    kiln_sched_job d = {.client = client,
                        .ndevices = 1 + (uint32_t)(i % 3 == 0),
                        .run = count_run,
                        .drop = count_drop,
                        .arg = &count};
    ck_assert_int_eq(kiln_sched_submit(s, &d, NULL), 0);
  }
  kiln_sched_wait_idle(s);
  ck_assert_int_eq(atomic_load(&count), 20000);
  kiln_sched_destroy(s);
}
END_TEST

int main(void) {
  Suite *s = suite_create("scheduler");
  TCase *tc = tcase_create("sched");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_round_robin);
  tcase_add_test(tc, test_newcomer_waits_one_run);
  tcase_add_test(tc, test_queue_bounds);
  tcase_add_test(tc, test_queue_quota_override);
  tcase_add_test(tc, test_deadline_and_cancel);
  tcase_add_test(tc, test_worker_drops_expired);
  tcase_add_test(tc, test_classes_and_gangs);
  tcase_add_test(tc, test_gang_not_starved);
  tcase_add_test(tc, test_close_and_destroy);
  tcase_add_test(tc, test_bad_options);
  tcase_add_test(tc, test_run_now);
  tcase_add_test(tc, test_done_after_devices_free);
  tcase_add_test(tc, test_stress);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
