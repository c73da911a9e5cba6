/* Lease renewal in libkiln against a kilnd with a one-second lease
 * (--buffer-lease-seconds 1; it sweeps once a second): a client that stays
 * idle loses its buffers, one whose keep-alive thread runs
 * (lease_keepalive_ms) or that calls kiln_client_renew_leases keeps them,
 * and closing a client with a keep-alive thread is prompt. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clients/c/kiln.h"
#include "compiler/ir/text.h"
#include "tests/integration/itest.h"

static itest_kilnd server;

/* Long enough for the one-second lease to run out and be swept. */
#define IDLE_S 3.5

static kiln_client *connect_with(int64_t keepalive_ms, const char *id) {
  kiln_client_options o = {0};
  o.client_id = id;
  o.lease_keepalive_ms = keepalive_ms;
  kiln_client *c = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_connect(server.addr, &o, &c, &st) == 0, "connect: %s", st.msg);
  return c;
}

static void put(kiln_client *c, kiln_remote_buffer *b) {
  kiln_literal *v = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  const char *t = "f32[3] {1, 2, 3}";
  ck_assert_int_eq(kiln_literal_parse_text(t, strlen(t), &v, &st), 0);
  ck_assert_msg(kiln_client_put_buffer(c, v, NULL, b, &st) == 0, "put: %s", st.msg);
  kiln_literal_destroy(v);
}

/* 0, or the code of fetching the buffer. */
static int fetch(kiln_client *c, const kiln_remote_buffer *b, kiln_status *st) {
  kiln_literal *v = NULL;
  kiln_status_clear(st);
  int rc = kiln_client_get_buffer(c, b->handle, NULL, &v, st);
  if (rc == 0) {
    ck_assert_double_eq(kiln_literal_get_f64(v, 2), 3.0);
    kiln_literal_destroy(v);
  }
  return rc;
}

static void idle(double seconds) {
  double until = itest_now() + seconds;
  while (itest_now() < until) usleep(50000);
}

START_TEST(test_idle_client_loses_its_buffers) {
  kiln_client *c = connect_with(0, "lease-idle");
  kiln_remote_buffer b;
  put(c, &b);
  kiln_status st;
  ck_assert_int_eq(fetch(c, &b, &st), 0);
  idle(IDLE_S);
  int rc = fetch(c, &b, &st);
  ck_assert_msg(rc == KILN_ENOTFOUND, "expected NOT_FOUND after the lease, got %s: %s",
                kiln_err_name(rc), st.msg);
  ck_assert_uint_eq(kiln_client_lease_renewals(c), 0);
  kiln_remote_buffer_clear(&b);
  kiln_client_close(c);
}
END_TEST

START_TEST(test_keepalive_thread_keeps_them) {
  kiln_client *c = connect_with(200, "lease-keepalive");
  kiln_remote_buffer b;
  put(c, &b);
  idle(IDLE_S);
  kiln_status st;
  int rc = fetch(c, &b, &st);
  ck_assert_msg(rc == 0, "the kept-alive buffer is gone: %s: %s", kiln_err_name(rc), st.msg);
  ck_assert_uint_ge(kiln_client_lease_renewals(c), 5); /* about one per 200 ms idle */
  double t0 = itest_now();
  kiln_remote_buffer_clear(&b);
  kiln_client_close(c);
  ck_assert_msg(itest_now() - t0 < 1.0, "close took %.2f s", itest_now() - t0);
}
END_TEST

START_TEST(test_explicit_renewal_keeps_them) {
  kiln_client *c = connect_with(0, "lease-explicit");
  kiln_remote_buffer b;
  put(c, &b);
  kiln_status st;
  for (double until = itest_now() + IDLE_S; itest_now() < until;) {
    usleep(300000);
    kiln_status_clear(&st);
    ck_assert_msg(kiln_client_renew_leases(c, &st) == 0, "renew: %s", st.msg);
  }
  int rc = fetch(c, &b, &st);
  ck_assert_msg(rc == 0, "the renewed buffer is gone: %s: %s", kiln_err_name(rc), st.msg);
  kiln_remote_buffer_clear(&b);
  kiln_client_close(c);
}
END_TEST

START_TEST(test_bad_keepalive_option) {
  kiln_client_options o = {0};
  o.lease_keepalive_ms = -5;
  kiln_client *c = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_connect(server.addr, &o, &c, &st), KILN_EINVAL);
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(st.msg, "lease_keepalive_ms") != NULL, "%s", st.msg);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_renew_leases(NULL, &st), KILN_EINVAL);
}
END_TEST

static Suite *lease_suite(void) {
  Suite *s = suite_create("lease");
  TCase *tc = tcase_create("renewal");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_idle_client_loses_its_buffers);
  tcase_add_test(tc, test_keepalive_thread_keeps_them);
  tcase_add_test(tc, test_explicit_renewal_keeps_them);
  tcase_add_test(tc, test_bad_keepalive_option);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  itest_require_kilnd("test_lease");
  const char *extra[] = {"--buffer-lease-seconds", "1", NULL};
  if (itest_kilnd_start(&server, extra)) return 1;
  return itest_run_suite("test_lease", lease_suite(), &server);
}
