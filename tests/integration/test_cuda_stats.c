/* kilnd with GPUs, without a GPU: the fake driver (tests/fake_cuda/,
 * KILN_CUDA_DRIVER) with two devices under a 64 MiB budget. Stats lists
 * both after the scheduler's devices, backend "cuda", with the memory
 * their allocators hold and the budget as the limit; /metrics has the
 * count and kiln_cuda_memory_bytes for each device (total, budget, live,
 * cached, peak); a configured mesh is reported as not yet met (its first
 * use meets the other hosts; test_cuda_nccl tests that).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/kiln.h"
#include "tests/integration/itest.h"

#define BUDGET (64.0 * 1024 * 1024)

static itest_kilnd server;

START_TEST(stats_and_metrics_list_the_gpus) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_client *c = NULL;
  ck_assert_msg(kiln_client_connect(server.addr, NULL, &c, &st) == 0, "%s", st.msg);
  kiln_server_stats s;
  ck_assert_msg(kiln_client_stats(c, &s, &st) == 0, "%s", st.msg);
  int ncuda = 0;
  for (uint32_t i = 0; i < s.ndevices; i++) {
    const kiln_server_device *d = &s.devices[i];
    if (strcmp(d->backend, "cuda") != 0) continue;
    char want[64];
    snprintf(want, sizeof want, "cuda:%d (Kiln fake GPU, 1073741824 bytes)", ncuda);
    ck_assert_str_eq(d->description, want);
    ck_assert_int_eq(d->memory_limit_bytes, (int64_t)BUDGET);
    ck_assert_int_ge(d->memory_in_use_bytes, 0);
    ck_assert_int_le(d->memory_in_use_bytes, (int64_t)BUDGET);
    ck_assert_int_eq(d->device, (int32_t)i);
    ncuda++;
  }
  ck_assert_int_eq(ncuda, 2);
  kiln_server_stats_clear(&s);
  kiln_client_close(c);
  int status = 0;
  char *body = NULL;
  size_t len = 0;
  ck_assert_int_eq(itest_http_get(server.metrics, "/metrics", &status, &body, &len), 0);
  ck_assert_int_eq(status, 200);
  itest_metrics m;
  char err[256];
  ck_assert_msg(itest_metrics_parse(body, &m, err, sizeof err) == 0, "%s", err);
  ck_assert_double_eq(itest_metrics_value(&m, "kiln_cuda_devices", NULL), 2);
  for (int d = 0; d < 2; d++) {
    char l[64];
    snprintf(l, sizeof l, "device=\"cuda:%d\",kind=\"total\"", d);
    ck_assert_double_eq(itest_metrics_value(&m, "kiln_cuda_memory_bytes", l), 1073741824.0);
    snprintf(l, sizeof l, "device=\"cuda:%d\",kind=\"budget\"", d);
    ck_assert_double_eq(itest_metrics_value(&m, "kiln_cuda_memory_bytes", l), BUDGET);
    snprintf(l, sizeof l, "device=\"cuda:%d\",kind=\"live\"", d);
    ck_assert(!isnan(itest_metrics_value(&m, "kiln_cuda_memory_bytes", l)));
  }
  ck_assert_double_eq(itest_metrics_value(&m, "kiln_mesh_ready", "mesh=\"pod\""), 0);
  itest_metrics_free(&m);
  free(body);
}
END_TEST

int main(void) {
  itest_require_kilnd("test_cuda_stats");
#ifndef KILN_FAKE_CUDA
  printf("test_cuda_stats: built without the fake CUDA driver: skipped\n");
  return 77;
#else
  setenv("KILN_CUDA_DRIVER", KILN_FAKE_CUDA, 1); /* kilnd inherits these */
  setenv("KILN_FAKE_CUDA_DEVICES", "2", 1);
  setenv("KILN_CUDA_MEMORY_BYTES", "67108864", 1);
  const char *extra[] = {"--cpu-devices", "1", "--mesh-name", "pod", NULL};
  if (itest_kilnd_start(&server, extra)) return 1;
  Suite *s = suite_create("cuda_stats");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, stats_and_metrics_list_the_gpus);
  suite_add_tcase(s, tc);
  return itest_run_suite("test_cuda_stats", s, &server);
#endif
}
