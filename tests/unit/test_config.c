/* Unit tests for kilnd's configuration: defaults, value syntax (sizes with
 * suffixes, durations, booleans), the three sources and their precedence
 * (file < environment < flags), --help/--version, and the messages for every
 * kind of mistake.
 *
 * server/config.c depends on nothing but common/, and the unit test build
 * links only the Kiln libraries, so the file is compiled into this test
 * directly. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/config.c"

static kiln_status st;

START_TEST(test_defaults) {
  kilnd_config c;
  ck_assert_int_eq(kilnd_config_init(&c, NULL), 0);
  ck_assert_str_eq(c.listen, "127.0.0.1:50051");
  ck_assert_str_eq(c.metrics_listen, "127.0.0.1:9464");
  ck_assert_uint_eq(c.cpu_devices, 1);
  ck_assert_uint_eq(c.max_message_bytes, 64u << 20);
  ck_assert_uint_eq(c.client_memory_bytes, UINT64_C(4) << 30);
  ck_assert_uint_eq(c.max_elements, UINT64_C(256) << 20);
  ck_assert_double_eq(c.run_timeout, 300.0);
  ck_assert(!c.log_requests);
  ck_assert_int_eq(kilnd_config_check(&c, NULL), 0);
  kilnd_config_free(&c);
}
END_TEST

START_TEST(test_values) {
  kilnd_config c;
  kilnd_config_init(&c, NULL);
  ck_assert_int_eq(kilnd_config_set(&c, "max-message-bytes", "8Mi", "t", NULL), 0);
  ck_assert_uint_eq(c.max_message_bytes, 8u << 20);
  ck_assert_int_eq(kilnd_config_set(&c, "max_buffer_bytes", "3G", "t", NULL), 0);
  ck_assert_uint_eq(c.max_buffer_bytes, 3000000000u);
  ck_assert_int_eq(kilnd_config_set(&c, "run-timeout", "250ms", "t", NULL), 0);
  ck_assert_double_eq_tol(c.run_timeout, 0.25, 1e-12);
  ck_assert_int_eq(kilnd_config_set(&c, "drain-timeout", "2m", "t", NULL), 0);
  ck_assert_double_eq(c.drain_timeout, 120.0);
  ck_assert_int_eq(kilnd_config_set(&c, "log-requests", "yes", "t", NULL), 0);
  ck_assert(c.log_requests);
  ck_assert_int_eq(kilnd_config_set(&c, "listen", "[::1]:0", "t", NULL), 0);
  ck_assert_str_eq(c.listen, "[::1]:0");

  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_set(&c, "cpu-devices", "four", "--cpu-devices", &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "--cpu-devices");
  ck_assert_str_eq(st.msg, "'four' is not a non-negative integer");
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_set(&c, "cpu-devices", "4x", "f:1", &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg,
                   "'4x' is not an integer with an optional K, M, G, T, Ki, Mi, Gi or Ti suffix");
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_set(&c, "max-elements", "20000000000Ti", "x", &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "'20000000000Ti' is not an integer below 2^64");
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_set(&c, "run-timeout", "-1", "x", &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "'-1' is not a non-negative number of seconds");
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_set(&c, "log-requests", "maybe", "x", &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "'maybe' is not a boolean (true/false, 1/0, yes/no, on/off)");
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_set(&c, "colour", "blue", "x", &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "unknown option 'colour' (see kilnd --help)");
  kilnd_config_free(&c);
}
END_TEST

START_TEST(test_file_text) {
  kilnd_config c;
  kilnd_config_init(&c, NULL);
  const char *text = "# kilnd settings\n"
                     "listen = 0.0.0.0:6000   # all interfaces\n"
                     "\n"
                     "  cpu_devices=8\n"
                     "default-backend = \"interp\"\r\n";
  ck_assert_int_eq(kilnd_config_apply_file_text(&c, text, "k.conf", NULL), 0);
  ck_assert_str_eq(c.listen, "0.0.0.0:6000");
  ck_assert_uint_eq(c.cpu_devices, 8);
  ck_assert_str_eq(c.default_backend, "interp");
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_apply_file_text(&c, "a = 1\n", "k.conf", &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "k.conf:1");
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_apply_file_text(&c, "\n\njust words\n", "k.conf", &st),
                   KILN_EINVAL);
  ck_assert_str_eq(st.where, "k.conf:3");
  ck_assert_str_eq(st.msg, "expected 'key = value', found 'just words'");
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_apply_file_text(&c, "config = x\n", "k.conf", &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "a config file cannot name another one");
  kilnd_config_free(&c);
}
END_TEST

START_TEST(test_env) {
  kilnd_config c;
  kilnd_config_init(&c, NULL);
  char *env[] = {"PATH=/bin", "KILN_CPU_DEVICES=3", "KILN_CC=gcc", "KILN_QUEUE_DEPTH=9",
                 "KILN_=x",   "KILNX_LISTEN=y",     NULL};
  ck_assert_int_eq(kilnd_config_apply_env(&c, env, NULL), 0);
  ck_assert_uint_eq(c.cpu_devices, 3);
  ck_assert_uint_eq(c.queue_depth, 9);
  char *bad[] = {"KILN_RUN_TIMEOUT=soon", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_apply_env(&c, bad, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "KILN_RUN_TIMEOUT");
  kilnd_config_free(&c);
}
END_TEST

START_TEST(test_precedence) {
  char path[] = "/tmp/kilnd-test-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  const char *text = "cpu-devices = 5\nqueue-depth = 7\ncompile-threads = 3\n";
  ck_assert_int_eq(write(fd, text, strlen(text)), (int)strlen(text));
  close(fd);
  char cfgflag[64];
  snprintf(cfgflag, sizeof cfgflag, "--config=%s", path);
  char *argv[] = {"kilnd", cfgflag, "--queue-depth", "11", "--log-requests", NULL};
  char *env[] = {"KILN_QUEUE_DEPTH=8", "KILN_COMPILE_THREADS=4", NULL};
  kilnd_config c;
  kilnd_config_action action;
  kiln_status_clear(&st);
  ck_assert_msg(kilnd_config_load(&c, 5, argv, env, &action, &st) == 0, "%s", st.msg);
  ck_assert_int_eq(action, KILND_CONFIG_RUN);
  ck_assert_uint_eq(c.cpu_devices, 5);     /* file */
  ck_assert_uint_eq(c.compile_threads, 4); /* environment over file */
  ck_assert_uint_eq(c.queue_depth, 11);    /* flag over both */
  ck_assert(c.log_requests);               /* bare boolean flag */
  ck_assert_str_eq(c.config_path, path);
  kilnd_config_free(&c);

  char *env2[] = {NULL, NULL};
  char envcfg[64];
  snprintf(envcfg, sizeof envcfg, "KILN_CONFIG=%s", path);
  env2[0] = envcfg;
  char *argv2[] = {"kilnd", NULL};
  ck_assert_int_eq(kilnd_config_load(&c, 1, argv2, env2, &action, NULL), 0);
  ck_assert_uint_eq(c.queue_depth, 7);
  kilnd_config_free(&c);
  unlink(path);

  char *argv3[] = {"kilnd", "--config", "/nonexistent/kilnd.conf", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_load(&c, 3, argv3, NULL, &action, &st), KILN_EIO);
  ck_assert_str_eq(st.where, "/nonexistent/kilnd.conf");
  kilnd_config_free(&c);
}
END_TEST

START_TEST(test_flags) {
  kilnd_config c;
  kilnd_config_action action;
  char *help[] = {"kilnd", "--cpu-devices", "2", "--help", NULL};
  ck_assert_int_eq(kilnd_config_load(&c, 4, help, NULL, &action, NULL), 0);
  ck_assert_int_eq(action, KILND_CONFIG_HELP);
  kilnd_config_free(&c);
  char *version[] = {"kilnd", "--version", NULL};
  ck_assert_int_eq(kilnd_config_load(&c, 2, version, NULL, &action, NULL), 0);
  ck_assert_int_eq(action, KILND_CONFIG_VERSION);
  kilnd_config_free(&c);

  char *missing[] = {"kilnd", "--listen", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_load(&c, 2, missing, NULL, &action, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "--listen");
  ck_assert_str_eq(st.msg, "needs a value");
  kilnd_config_free(&c);
  char *stray[] = {"kilnd", "serve", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_load(&c, 2, stray, NULL, &action, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "unexpected argument (options start with --)");
  kilnd_config_free(&c);
  char *unknown[] = {"kilnd", "--turbo", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_load(&c, 2, unknown, NULL, &action, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "--turbo");
  kilnd_config_free(&c);
  char *range[] = {"kilnd", "--cpu-devices=0", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_load(&c, 2, range, NULL, &action, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "cpu-devices");
  ck_assert_str_eq(st.msg, "0 is out of range (1 to 256)");
  kilnd_config_free(&c);
  char *backend[] = {"kilnd", "--default-backend=tpu", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_load(&c, 2, backend, NULL, &action, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "'tpu' is not cpu or interp");
  kilnd_config_free(&c);
}
END_TEST

/* The executable cache's options: defaults as documented, each from the
 * three sources, and the secret from the environment or a file only. */
START_TEST(test_cache_options) {
  kilnd_config c;
  ck_assert_int_eq(kilnd_config_init(&c, NULL), 0);
  ck_assert_uint_eq(c.cache_memory_bytes, UINT64_C(268435456));
  ck_assert_str_eq(c.cache_dir, "");
  ck_assert_uint_eq(c.cache_disk_bytes, UINT64_C(4294967296));
  ck_assert_str_eq(c.redis_url, "");
  ck_assert_uint_eq(c.redis_ttl_s, 604800);
  ck_assert_uint_eq(c.redis_timeout_ms, 200);
  ck_assert_str_eq(c.cache_secret_file, "");
  ck_assert_uint_eq(c.cache_min_compile_ms, 0);
  ck_assert_uint_eq(c.cache_lock_ttl_ms, 30000);
  ck_assert_ptr_null(c.cache_secret);
  char *secret = (char *)1;
  ck_assert_int_eq(kilnd_config_cache_secret(&c, &secret, NULL), 0);
  ck_assert_ptr_null(secret);
  kilnd_config_free(&c);

  char *argv[] = {"kilnd",
                  "--cache-dir",
                  "/var/cache/kiln",
                  "--redis-url=redis://r:6380/2",
                  "--cache-memory-bytes",
                  "0",
                  NULL};
  char *env[] = {"KILN_CACHE_DISK_BYTES=1Gi", "KILN_REDIS_TIMEOUT_MS=50",
                 "KILN_CACHE_SECRET=0123456789abcdef-cluster", "KILN_CACHE_DIR=/ignored", NULL};
  kilnd_config_action action;
  kiln_status_clear(&st);
  ck_assert_msg(kilnd_config_load(&c, 6, argv, env, &action, &st) == 0, "%s", st.msg);
  ck_assert_str_eq(c.cache_dir, "/var/cache/kiln");
  ck_assert_str_eq(c.redis_url, "redis://r:6380/2");
  ck_assert_uint_eq(c.cache_memory_bytes, 0);
  ck_assert_uint_eq(c.cache_disk_bytes, UINT64_C(1) << 30);
  ck_assert_uint_eq(c.redis_timeout_ms, 50);
  ck_assert_str_eq(c.cache_secret, "0123456789abcdef-cluster");
  ck_assert_int_eq(kilnd_config_cache_secret(&c, &secret, NULL), 0);
  ck_assert_str_eq(secret, "0123456789abcdef-cluster");
  kiln_free(secret);
  kilnd_config_free(&c);

  kilnd_config_init(&c, NULL);
  ck_assert_int_eq(kilnd_config_apply_file_text(&c,
                                                "cache_lock_ttl_ms = 5000\nredis-ttl-s=60\n"
                                                "cache-min-compile-ms = 250\n",
                                                "k.conf", NULL),
                   0);
  ck_assert_uint_eq(c.cache_lock_ttl_ms, 5000);
  ck_assert_uint_eq(c.redis_ttl_s, 60);
  ck_assert_uint_eq(c.cache_min_compile_ms, 250);
  /* The secret is never a config file key nor a flag. */
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_apply_file_text(&c, "cache-secret = x\n", "k.conf", &st),
                   KILN_EINVAL);
  ck_assert_str_eq(st.msg, "unknown option 'cache-secret' (see kilnd --help)");
  kilnd_config_free(&c);
  char *flag[] = {"kilnd", "--cache-secret", "0123456789abcdef", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_load(&c, 3, flag, NULL, &action, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "--cache-secret");
  ck_assert_str_eq(st.msg, "unknown option (see kilnd --help)");
  kilnd_config_free(&c);

  char *range[] = {"kilnd", "--redis-timeout-ms=0", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_load(&c, 2, range, NULL, &action, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "redis-timeout-ms");
  ck_assert_str_eq(st.msg, "0 is out of range (1 to 600000)");
  kilnd_config_free(&c);
  char *lock[] = {"kilnd", "--cache-lock-ttl-ms=10", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_load(&c, 2, lock, NULL, &action, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "10 is out of range (100 to 86400000)");
  kilnd_config_free(&c);
}
END_TEST

START_TEST(test_cache_secret_file) {
  char path[] = "/tmp/kilnd-secret-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  const char *text = "s3cret-of-the-cluster\n";
  ck_assert_int_eq(write(fd, text, strlen(text)), (int)strlen(text));
  close(fd);
  char *argv[] = {"kilnd", "--cache-secret-file", path, NULL};
  kilnd_config c;
  kilnd_config_action action;
  ck_assert_int_eq(kilnd_config_load(&c, 3, argv, NULL, &action, NULL), 0);
  char *secret = NULL;
  ck_assert_int_eq(kilnd_config_cache_secret(&c, &secret, NULL), 0);
  ck_assert_str_eq(secret, "s3cret-of-the-cluster");
  kiln_free(secret);
  kilnd_config_free(&c);

  /* Two ways at once is a mistake, not a precedence. */
  char *env[] = {"KILN_CACHE_SECRET=another-secret-16b", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_load(&c, 3, argv, env, &action, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "cache-secret-file");
  ck_assert_str_eq(st.msg, "KILN_CACHE_SECRET is set too: give the secret one way");
  kilnd_config_free(&c);

  fd = open(path, O_WRONLY | O_TRUNC);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, "\n", 1), 1);
  close(fd);
  ck_assert_int_eq(kilnd_config_load(&c, 3, argv, NULL, &action, NULL), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_cache_secret(&c, &secret, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "the cache secret file is empty");
  kilnd_config_free(&c);
  unlink(path);

  ck_assert_int_eq(kilnd_config_load(&c, 3, argv, NULL, &action, NULL), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_cache_secret(&c, &secret, &st), KILN_EIO);
  ck_assert_str_eq(st.where, path);
  ck_assert_ptr_nonnull(strstr(st.msg, "cannot open cache secret file: "));
  kilnd_config_free(&c);
}
END_TEST

/* --help names every option with its environment variable. */
/* The limits of issue 16: their defaults and ranges. */
START_TEST(test_reliability_limits) {
  kilnd_config c;
  kilnd_config_action action;
  ck_assert_int_eq(kilnd_config_init(&c, NULL), 0);
  ck_assert_uint_eq(c.max_nesting, 256);
  ck_assert_uint_eq(c.executable_table_bytes, UINT64_C(2) << 30);
  ck_assert_double_eq(c.stream_idle_timeout, 30.0);
  ck_assert_uint_eq(c.server_memory_bytes, 0); /* half the physical memory */
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  ck_assert_uint_eq(kilnd_config_server_memory(&c), (uint64_t)pages * (uint64_t)page / 2);
  c.server_memory_bytes = 12345;
  ck_assert_uint_eq(kilnd_config_server_memory(&c), 12345);
  kilnd_config_free(&c);
  char *deep[] = {"kilnd", "--max-nesting=5000", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_load(&c, 2, deep, NULL, &action, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "max-nesting");
  ck_assert_str_eq(st.msg, "5000 is out of range (1 to 4096)");
  kilnd_config_free(&c);
  char *tiny[] = {"kilnd", "--chunk-bytes=1", NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_config_load(&c, 2, tiny, NULL, &action, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "chunk-bytes");
  kilnd_config_free(&c);
  char *env[] = {"KILN_MAX_NESTING=64", "KILN_STREAM_IDLE_TIMEOUT=500ms", NULL};
  char *none[] = {"kilnd", NULL};
  ck_assert_int_eq(kilnd_config_load(&c, 1, none, env, &action, &st), 0);
  ck_assert_uint_eq(c.max_nesting, 64);
  ck_assert_double_eq(c.stream_idle_timeout, 0.5);
  kilnd_config_free(&c);
}
END_TEST

/* The GPU mesh: none by default; a name safe in a Redis key, a rank
 * within the ranks, and a Redis when it spans hosts. */
START_TEST(test_mesh_options) {
  kilnd_config c;
  kilnd_config_action action;
  ck_assert_int_eq(kilnd_config_init(&c, NULL), 0);
  ck_assert_str_eq(c.mesh_name, "");
  ck_assert_uint_eq(c.mesh_ranks, 1);
  ck_assert_double_eq(c.mesh_timeout, 60.0);
  kilnd_config_free(&c);
  char *good[] = {"kilnd",
                  "--mesh-name=gpu.pod-1",
                  "--mesh-ranks=4",
                  "--mesh-rank=3",
                  "--mesh-redis=10.0.0.5:6379",
                  "--mesh-devices=8",
                  "--mesh-timeout=2m",
                  NULL};
  kiln_status_clear(&st);
  ck_assert_msg(kilnd_config_load(&c, 7, good, NULL, &action, &st) == 0, "%s", st.msg);
  ck_assert_uint_eq(c.mesh_rank, 3);
  ck_assert_uint_eq(c.mesh_devices, 8);
  ck_assert_double_eq(c.mesh_timeout, 120.0);
  kilnd_config_free(&c);
  static const struct {
    const char *flags[3];
    const char *where, *msg;
  } bad[] = {
      {{"--mesh-name=a b", NULL}, "mesh-name", "character 2 is not a letter, digit"},
      {{"--mesh-name=m", "--mesh-rank=2"}, "mesh-rank", "2 is out of range (0 to 0)"},
      {{"--mesh-name=m", "--mesh-ranks=2"}, "mesh-redis", "a mesh of 2 hosts needs"},
      {{"--mesh-name=m", "--mesh-devices=17"}, "mesh-devices", "17 is out of range"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *argv[4] = {"kilnd", (char *)bad[i].flags[0], (char *)bad[i].flags[1], NULL};
    int argc = bad[i].flags[1] ? 3 : 2;
    kiln_status_clear(&st);
    ck_assert_int_eq(kilnd_config_load(&c, argc, argv, NULL, &action, &st), KILN_EINVAL);
    ck_assert_str_eq(st.where, bad[i].where);
    ck_assert_msg(strstr(st.msg, bad[i].msg) != NULL, "%s", st.msg);
    kilnd_config_free(&c);
  }
}
END_TEST

START_TEST(test_usage_lists_everything) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  kilnd_config_usage(f);
  fclose(f);
  for (size_t i = 0; i < NOPTIONS; i++) {
    char flag[80];
    snprintf(flag, sizeof flag, "--%s ", options[i].name);
    ck_assert_msg(strstr(buf, flag) != NULL, "usage lacks %s", flag);
  }
  ck_assert_ptr_nonnull(strstr(buf, "(KILN_CLIENT_MEMORY_BYTES, default 4Gi)"));
  ck_assert_ptr_nonnull(strstr(buf, "--config PATH"));
  ck_assert_ptr_nonnull(strstr(buf, "(KILN_CACHE_MEMORY_BYTES, default 256Mi)"));
  ck_assert_ptr_nonnull(strstr(buf, "(KILN_CACHE_DIR, default \"\")"));
  ck_assert_ptr_nonnull(strstr(buf, "KILN_CACHE_SECRET   (environment only)"));
  free(buf);
}
END_TEST

int main(void) {
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("config");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_defaults);
  tcase_add_test(tc, test_values);
  tcase_add_test(tc, test_file_text);
  tcase_add_test(tc, test_env);
  tcase_add_test(tc, test_precedence);
  tcase_add_test(tc, test_flags);
  tcase_add_test(tc, test_cache_options);
  tcase_add_test(tc, test_cache_secret_file);
  tcase_add_test(tc, test_reliability_limits);
  tcase_add_test(tc, test_mesh_options);
  tcase_add_test(tc, test_usage_lists_everything);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
