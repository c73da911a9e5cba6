/* kilnd on a machine without a GPU (CI's): it starts as usual with zero
 * CUDA devices (its log says so and why, /metrics has kiln_cuda_devices 0)
 * and serves cpu as before; Compile
 * for cuda-sm_90 answers with an executable built by NVRTC that lands in
 * the cache (the second compile is a memory hit, a disk tier holds its
 * entry); Execute of it is UNAVAILABLE saying that the server has no CUDA
 * device (with a GPU, it runs on cuda:0). Compiling needs libnvrtc: without it the Compile cases
 * check the clear refusal instead. Running on a GPU is scripts/gpu-check.sh.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/kiln.h"
#include "common/alloc.h"
#include "tests/integration/itest.h"

static itest_kilnd server;
static char cache_dir[300];

static const char program[] =
    "HloModule plus\n\nENTRY main {\n  x = f32[4] parameter(0)\n"
    "  c = f32[] constant(2.5)\n  b = f32[4] broadcast(c), dimensions={}\n"
    "  ROOT r = f32[4] add(x, b)\n}\n";

static kiln_client *connect_to(void) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_client *c = NULL;
  ck_assert_msg(kiln_client_connect(server.addr, NULL, &c, &st) == 0, "connect: %s", st.msg);
  return c;
}

static int compile_for(kiln_client *c, const char *backend, const char *target,
                       kiln_remote_executable **e, kiln_status *st) {
  kiln_remote_compile_options o = {.backend = backend, .target = target};
  kiln_status_clear(st);
  return kiln_client_compile_text(c, program, strlen(program), &o, e, st);
}

static int run(kiln_client *c, const kiln_remote_executable *e, kiln_remote_result *r,
               kiln_status *st) {
  kiln_literal *x;
  kiln_status_clear(st);
  const char *xt = "f32[4] {1, 2, 3, 4}";
  ck_assert_int_eq(kiln_literal_parse_text(xt, strlen(xt), &x, st), 0);
  kiln_remote_arg arg = {.literal = x};
  int rc = kiln_client_execute(c, e->id, &arg, 1, NULL, r, st);
  kiln_literal_destroy(x);
  return rc;
}

static char *read_log(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/kilnd.err", server.dir);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char *buf = calloc(1, 1 << 20);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

START_TEST(starts_with_zero_cuda_devices_and_serves_cpu) {
  char *log = read_log();
  bool none = strstr(log, "cuda: 0 devices (") != NULL;
  ck_assert_msg(none || strstr(log, "cuda: "), "no cuda line in the log:\n%s", log);
  free(log);
  /* /metrics has the count */
  int status = 0;
  char *body = NULL;
  size_t len = 0;
  ck_assert_int_eq(itest_http_get(server.metrics, "/metrics", &status, &body, &len), 0);
  ck_assert_int_eq(status, 200);
  ck_assert_msg(strstr(body, none ? "\nkiln_cuda_devices 0\n" : "\nkiln_cuda_devices "), "%s",
                body);
  free(body);
  kiln_client *c = connect_to();
  kiln_remote_executable *e = NULL;
  kiln_status st;
  ck_assert_msg(compile_for(c, "cpu", NULL, &e, &st) == 0, "%s", st.msg);
  kiln_remote_result r;
  ck_assert_msg(run(c, e, &r, &st) == 0, "%s", st.msg);
  const float *v = (const float *)r.outputs[0].literal->data;
  for (int i = 0; i < 4; i++) ck_assert_float_eq(v[i], (float)(i + 1) + 2.5f);
  kiln_remote_result_free(&r);
  kiln_remote_executable_free(e);
  kiln_client_close(c);
}
END_TEST

static size_t files_under(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) return 0;
  size_t n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.') continue;
    char sub[1024];
    snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name);
    if (de->d_type == DT_DIR)
      n += files_under(sub);
    else
      n++;
  }
  closedir(d);
  return n;
}

START_TEST(compile_for_sm_90_lands_in_the_cache) {
  kiln_client *c = connect_to();
  kiln_remote_executable *e = NULL;
  kiln_status st;
  size_t before = files_under(cache_dir);
  int rc = compile_for(c, "cuda", "sm_90", &e, &st);
  if (rc != 0) {
    /* no libnvrtc on this machine: a clear refusal, nothing else */
    ck_assert_msg(strstr(st.msg, "libnvrtc") != NULL, "compile: %s: %s", st.where, st.msg);
    fprintf(stderr, "skipped: %s\n", st.msg);
    kiln_client_close(c);
    return;
  }
  ck_assert_int_eq(e->cache_source, KILN_REMOTE_SOURCE_COMPILED);
  ck_assert_uint_gt(files_under(cache_dir), before); /* the disk tier holds it */
  kiln_remote_executable *again = NULL;
  ck_assert_msg(compile_for(c, "cuda", "cuda-sm_90", &again, &st) == 0, "%s", st.msg);
  ck_assert_int_eq(again->cache_source, KILN_REMOTE_SOURCE_MEMORY);
  ck_assert_str_eq(again->cache_key, e->cache_key);
  /* sm_80 is another entry */
  kiln_remote_executable *other = NULL;
  ck_assert_msg(compile_for(c, "cuda", "sm_80", &other, &st) == 0, "%s", st.msg);
  ck_assert_str_ne(other->cache_key, e->cache_key);
  /* Without a GPU the program cannot run here, and the status says why;
   * with one it runs on cuda:0 (or, on a GPU that sm_90 code does not run
   * on, the load says which sm the GPU is). */
  char *log = read_log();
  bool gpu = strstr(log, "cuda: 0 devices (") == NULL;
  free(log);
  kiln_remote_result r;
  rc = run(c, e, &r, &st);
  if (!gpu) {
    ck_assert_int_eq(rc, KILN_EUNAVAIL);
    ck_assert_msg(strstr(st.msg, "CUDA code for cuda-sm_90") && strstr(st.msg, "CUDA device"), "%s",
                  st.msg);
  } else if (rc == 0) {
    const float *v = (const float *)r.outputs[0].literal->data;
    for (int i = 0; i < 4; i++) ck_assert_float_eq(v[i], (float)(i + 1) + 2.5f);
    kiln_remote_result_free(&r);
  } else {
    ck_assert_msg(rc == KILN_EUNIMPL && strstr(st.msg, "this GPU is sm_"), "%s", st.msg);
  }
  /* a virtual architecture is not a target */
  kiln_remote_executable *bad = NULL;
  ck_assert_int_ne(compile_for(c, "cuda", "compute_90", &bad, &st), 0);
  ck_assert_msg(strstr(st.msg, "compute_90"), "%s", st.msg);
  kiln_remote_executable_free(other);
  kiln_remote_executable_free(again);
  kiln_remote_executable_free(e);
  kiln_client_close(c);
}
END_TEST

int main(void) {
  itest_require_kilnd("test_cuda_service");
  char tmpl[] = "/tmp/kiln-cuda-svc-XXXXXX";
  if (mkdtemp(tmpl) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(cache_dir, sizeof cache_dir, "%s/cache", tmpl);
  const char *extra[] = {"--cpu-devices", "1", "--cache-dir", cache_dir, NULL};
  if (itest_kilnd_start(&server, extra)) return 1;
  Suite *s = suite_create("cuda_service");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, starts_with_zero_cuda_devices_and_serves_cpu);
  tcase_add_test(tc, compile_for_sm_90_lands_in_the_cache);
  suite_add_tcase(s, tc);
  int rc = itest_run_suite("test_cuda_service", s, &server);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpl);
  return rc;
}
