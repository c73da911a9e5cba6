/* Unit tests for the backend registry and its checked forwarders: creating
 * backends by name, device counts and thread shares, buffers (alloc, write,
 * read, bounds), the interp backend running modules, every registered
 * backend running a module the way callers drive it (by what the backend
 * says it runs, never by its name), the run options reaching the
 * interpreter through the vtable, and every misuse turning into a status
 * with the exact message. */
#include <check.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "executor/backend.h"
#include "executor/run.h"

static kiln_status st;

static kiln_backend *make(const char *name, uint32_t ndevices, uint32_t threads) {
  kiln_backend_options o = {.ndevices = ndevices, .threads_per_device = threads};
  kiln_backend *b = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_backend_create(name, &o, &b, &st) == 0, "%s", st.msg);
  ck_assert_ptr_nonnull(b);
  return b;
}

START_TEST(test_registry_names) {
  uint32_t n = 0;
  const char *const *names = kiln_backend_names(&n);
  ck_assert_uint_eq(n, 2);
  ck_assert_str_eq(names[0], "cpu");
  ck_assert_str_eq(names[1], "interp");
  kiln_backend *b = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_backend_create("tpu", NULL, &b, &st), KILN_ENOTFOUND);
  ck_assert_ptr_null(b);
  ck_assert_str_eq(st.msg, "unknown backend 'tpu' (known: cpu, interp)");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_backend_create(NULL, NULL, &b, &st), KILN_EINVAL);
  ck_assert_int_eq(kiln_backend_create("cpu", NULL, NULL, &st), KILN_EINVAL);
  kiln_backend_destroy(NULL);
}
END_TEST

START_TEST(test_cpu_devices) {
  kiln_backend *b = make("cpu", 3, 2);
  ck_assert_str_eq(kiln_backend_name(b), "cpu");
  ck_assert_uint_eq(kiln_backend_device_count(b), 3);
  for (uint32_t i = 0; i < 3; i++) {
    kiln_device *d = kiln_backend_device(b, i);
    ck_assert_ptr_nonnull(d);
    ck_assert_uint_eq(kiln_device_index(d), i);
    ck_assert_ptr_eq(kiln_device_backend(d), b);
    ck_assert_uint_eq(kiln_device_threads(d), 2);
    ck_assert_int_eq(kiln_device_synchronize(d, &st), 0);
  }
  char desc[64];
  kiln_device_describe(kiln_backend_device(b, 2), desc, sizeof desc);
  ck_assert_str_eq(desc, "cpu:2 (2 threads)");
  ck_assert_ptr_null(kiln_backend_device(b, 3));
  ck_assert_ptr_null(kiln_backend_device(NULL, 0));
  ck_assert_uint_eq(kiln_backend_device_count(NULL), 0);
  kiln_backend_destroy(b);
}
END_TEST

START_TEST(test_cpu_defaults_and_env) {
  unsetenv("KILN_CPU_DEVICES");
  unsetenv("KILN_CPU_THREADS");
  kiln_backend *b = make("cpu", 0, 0);
  ck_assert_uint_eq(kiln_backend_device_count(b), 1);
  ck_assert_uint_ge(kiln_device_threads(kiln_backend_device(b, 0)), 1);
  kiln_backend_destroy(b);

  setenv("KILN_CPU_DEVICES", "8", 1);
  setenv("KILN_CPU_THREADS", "3", 1);
  b = make("cpu", 0, 0);
  ck_assert_uint_eq(kiln_backend_device_count(b), 8);
  ck_assert_uint_eq(kiln_device_threads(kiln_backend_device(b, 7)), 3);
  kiln_backend_destroy(b);
  /* Options win over the environment. */
  b = make("cpu", 2, 1);
  ck_assert_uint_eq(kiln_backend_device_count(b), 2);
  ck_assert_uint_eq(kiln_device_threads(kiln_backend_device(b, 0)), 1);
  kiln_backend_destroy(b);

  setenv("KILN_CPU_THREADS", "lots", 1);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_backend_create("cpu", NULL, &b, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "KILN_CPU_THREADS=lots: expected an integer in [1, 1024]");
  setenv("KILN_CPU_THREADS", "0", 1);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_backend_create("cpu", NULL, &b, &st), KILN_EINVAL);
  unsetenv("KILN_CPU_THREADS");
  setenv("KILN_CPU_DEVICES", "-2", 1);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_backend_create("cpu", NULL, &b, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "KILN_CPU_DEVICES=-2: expected an integer in [1, 1024]");
  unsetenv("KILN_CPU_DEVICES");

  kiln_backend_options o = {.ndevices = 5000};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_backend_create("cpu", &o, &b, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "5000 devices asked, at most 1024");
}
END_TEST

START_TEST(test_buffers) {
  kiln_backend *b = make("cpu", 2, 1);
  kiln_device *d = kiln_backend_device(b, 1);
  kiln_buffer *buf = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(d, 100, &buf, &st), 0);
  ck_assert_uint_eq(kiln_buffer_size(buf), 100);
  ck_assert_ptr_eq(kiln_buffer_device(buf), d);
  uint8_t zeros[100] = {0}, back[100];
  ck_assert_int_eq(kiln_buffer_read(buf, 0, back, 100, &st), 0);
  ck_assert_mem_eq(back, zeros, 100); /* zero-filled */
  const char msg[] = "hello, device";
  ck_assert_int_eq(kiln_buffer_write(buf, 50, msg, sizeof msg, &st), 0);
  memset(back, 0, sizeof back);
  ck_assert_int_eq(kiln_buffer_read(buf, 50, back, sizeof msg, &st), 0);
  ck_assert_str_eq((char *)back, msg);
  /* Bounds, without overflow. */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_write(buf, 90, msg, 11, &st), KILN_ERANGE);
  ck_assert_str_eq(st.msg, "write: bytes [90, 90 + 11) outside a buffer of 100 bytes");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_read(buf, SIZE_MAX, back, 2, &st), KILN_ERANGE);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_read(buf, 1, back, SIZE_MAX, &st), KILN_ERANGE);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_read(buf, 0, NULL, 4, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "read: no host pointer");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_write(NULL, 0, msg, 1, &st), KILN_EINVAL);
  ck_assert_int_eq(kiln_buffer_read(buf, 100, back, 0, &st), 0); /* empty at the end is fine */
  kiln_buffer_free(buf);
  kiln_buffer_free(NULL);

  /* Zero-sized and huge buffers. */
  ck_assert_int_eq(kiln_buffer_alloc(d, 0, &buf, &st), 0);
  ck_assert_uint_eq(kiln_buffer_size(buf), 0);
  kiln_buffer_free(buf);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_alloc(d, SIZE_MAX - 8, &buf, &st), KILN_ENOMEM);
  ck_assert_ptr_null(buf);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_alloc(NULL, 8, &buf, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "no device");

  kiln_backend_destroy(b);
}
END_TEST

START_TEST(test_buffers_out_of_memory) {
  kiln_backend *b = make("cpu", 1, 1);
  kiln_buffer *buf = NULL;
  for (long n = 1; n <= 2; n++) {
    kiln_alloc_fail_after(n);
    kiln_status_clear(&st);
    ck_assert_int_eq(kiln_buffer_alloc(kiln_backend_device(b, 0), 64, &buf, &st), KILN_ENOMEM);
    kiln_alloc_fail_after(0);
    ck_assert_ptr_null(buf);
  }
  kiln_backend_destroy(b);
  /* Backend creation fails cleanly at each allocation. */
  for (long n = 1; n <= 6; n++) {
    kiln_alloc_fail_after(n);
    kiln_status_clear(&st);
    int rc = kiln_backend_create(
        "cpu", &(kiln_backend_options){.ndevices = 2, .threads_per_device = 2}, &b, &st);
    kiln_alloc_fail_after(0);
    if (rc == 0) {
      kiln_backend_destroy(b);
      break;
    }
    ck_assert_int_eq(rc, KILN_ENOMEM);
    ck_assert_ptr_null(b);
  }
}
END_TEST

static kiln_module *parse(const char *text) {
  kiln_module *m = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st) == 0, "%s",
                st.msg);
  return m;
}

START_TEST(test_interp_backend) {
  kiln_backend *b = make("interp", 0, 0);
  ck_assert_uint_eq(kiln_backend_device_count(b), 1);
  kiln_device *d = kiln_backend_device(b, 0);
  ck_assert_uint_eq(kiln_device_threads(d), 1);
  kiln_module *m = parse("HloModule m\nENTRY e {\n  p = s32[3] parameter(0)\n"
                         "  ROOT r = s32[3] add(p, p)\n}\n");
  kiln_literal *arg = NULL, *out = NULL;
  kiln_shape s = {.dtype = KILN_S32, .rank = 1, .dims = (int64_t[]){3}};
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &arg, &st), 0);
  for (int i = 0; i < 3; i++) kiln_literal_set_s64(arg, i, i + 5);
  const kiln_literal *args[] = {arg};
  ck_assert_int_eq(kiln_device_run_module(d, m, args, 1, NULL, &out, &st), 0);
  ck_assert_int_eq(kiln_literal_get_s64(out, 0), 10);
  ck_assert_int_eq(kiln_literal_get_s64(out, 2), 14);
  kiln_literal_destroy(out);

  /* Interp buffers are host memory too. */
  kiln_buffer *buf = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(d, 8, &buf, &st), 0);
  uint64_t v = 0x1122334455667788u, w = 0;
  ck_assert_int_eq(kiln_buffer_write(buf, 0, &v, 8, &st), 0);
  ck_assert_int_eq(kiln_buffer_read(buf, 0, &w, 8, &st), 0);
  ck_assert_uint_eq(v, w);
  kiln_buffer_free(buf);

  /* interp loads no executables. */
  kiln_executable *e = kiln_executable_create();
  kiln_loaded *l = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_load(d, e, &l, &st), KILN_EUNIMPL);
  ck_assert_str_eq(st.where, "interp:0");
  ck_assert_str_eq(st.msg, "backend interp does not load executables (it runs modules)");
  kiln_executable_destroy(e);

  kiln_backend_options o = {.ndevices = 2};
  kiln_backend *b2 = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_backend_create("interp", &o, &b2, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "the interp backend has one device, 2 asked");

  /* The cpu backend runs executables, not modules. */
  kiln_backend *c = make("cpu", 1, 1);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_run_module(kiln_backend_device(c, 0), m, args, 1, NULL, &out, &st),
                   KILN_EUNIMPL);
  ck_assert_str_eq(st.msg, "backend cpu runs compiled executables, not modules (compile first)");
  kiln_backend_destroy(c);
  kiln_literal_destroy(arg);
  kiln_module_destroy(m);
  kiln_backend_destroy(b);
}
END_TEST

/* Runs m on device 0 of b as the server and the CLI do: the module itself
 * when the backend interprets, else compiled and loaded. */
static int run_on(kiln_backend *b, const kiln_module *m, const kiln_literal *const *args,
                  uint32_t nargs, const kiln_run_options *ro, kiln_literal **out) {
  kiln_device *d = kiln_backend_device(b, 0);
  if (kiln_backend_runs_modules(b)) return kiln_device_run_module(d, m, args, nargs, ro, out, &st);
  kiln_executable *e = NULL;
  kiln_loaded *l = NULL;
  int rc = kiln_compile(m, NULL, &e, NULL, &st);
  if (rc == 0) rc = kiln_device_load(d, e, &l, &st);
  if (rc == 0) rc = kiln_loaded_run(l, args, nargs, ro, out, &st);
  kiln_loaded_destroy(l);
  kiln_executable_destroy(e);
  return rc;
}

/* Every name of the registry creates a backend that says what it runs and
 * runs a small module through the vtable, alone and through
 * kiln_run_module_with, with the same result. */
START_TEST(test_every_backend_runs) {
  kiln_module *m = parse("HloModule m\nENTRY e {\n  p = s32[3] parameter(0)\n"
                         "  q = s32[3] multiply(p, p)\n  ROOT r = s32[3] add(q, p)\n}\n");
  kiln_literal *arg = NULL;
  kiln_shape s = {.dtype = KILN_S32, .rank = 1, .dims = (int64_t[]){3}};
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &arg, &st), 0);
  for (int i = 0; i < 3; i++) kiln_literal_set_s64(arg, i, i + 2);
  const kiln_literal *args[] = {arg};
  uint32_t n = 0;
  const char *const *names = kiln_backend_names(&n);
  ck_assert_uint_ge(n, 2);
  for (uint32_t i = 0; i < n; i++) {
    unsigned caps = kiln_backend_caps(names[i]);
    ck_assert_msg(caps != 0, "%s: registered but runs nothing", names[i]);
    kiln_backend *b = make(names[i], 0, 1);
    ck_assert_str_eq(kiln_backend_name(b), names[i]);
    ck_assert(kiln_backend_runs_modules(b) == ((caps & KILN_BACKEND_RUNS_MODULES) != 0));
    kiln_literal *out = NULL, *again = NULL;
    kiln_status_clear(&st);
    ck_assert_msg(run_on(b, m, args, 1, NULL, &out) == 0, "%s: %s", names[i], st.msg);
    for (int k = 0; k < 3; k++) ck_assert_int_eq(kiln_literal_get_s64(out, k), (k + 2) * (k + 3));
    kiln_status_clear(&st);
    ck_assert_msg(kiln_run_module_with(m, names[i], NULL, NULL, NULL, args, 1, &again, &st) == 0,
                  "%s: %s", names[i], st.msg);
    for (int k = 0; k < 3; k++)
      ck_assert_int_eq(kiln_literal_get_s64(again, k), kiln_literal_get_s64(out, k));
    kiln_literal_destroy(again);
    kiln_literal_destroy(out);
    kiln_backend_destroy(b);
  }
  kiln_literal_destroy(arg);
  kiln_module_destroy(m);
}
END_TEST

/* Unknown names: refused by every entry that takes a name, with a message
 * that lists exactly the registry's names, in its order. */
START_TEST(test_unknown_backend_lists_registry) {
  uint32_t n = 0;
  const char *const *names = kiln_backend_names(&n);
  char want[512] = "unknown backend 'tpu' (known: ";
  for (uint32_t i = 0; i < n; i++) {
    if (i) strcat(want, ", ");
    strcat(want, names[i]);
  }
  strcat(want, ")");
  kiln_backend *b = (kiln_backend *)1;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_backend_create("tpu", NULL, &b, &st), KILN_ENOTFOUND);
  ck_assert_ptr_null(b);
  ck_assert_str_eq(st.msg, want);
  kiln_module *m = parse("HloModule m\nENTRY e {\n  ROOT c = s32[] constant(1)\n}\n");
  kiln_literal *out = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_run_module(m, "tpu", NULL, NULL, 0, &out, &st), KILN_ENOTFOUND);
  ck_assert_ptr_null(out);
  ck_assert_str_eq(st.msg, want);
  kiln_module_destroy(m);
  ck_assert_uint_eq(kiln_backend_caps("tpu"), 0);
  ck_assert_uint_eq(kiln_backend_caps(NULL), 0);

  /* The joined list: all names, or those with the bits asked, cut to fit. */
  char all[256], loads[256], tiny[4];
  kiln_backend_names_join(0, " or ", all, sizeof all);
  kiln_backend_names_join(KILN_BACKEND_LOADS, ", ", loads, sizeof loads);
  ck_assert_str_eq(all, "cpu or interp");
  ck_assert_str_eq(loads, "cpu");
  kiln_backend_names_join(KILN_BACKEND_LOADS | KILN_BACKEND_RUNS_MODULES, ", ", loads,
                          sizeof loads);
  ck_assert_str_eq(loads, "");
  kiln_backend_names_join(0, ", ", tiny, sizeof tiny);
  ck_assert_str_eq(tiny, "cpu");
  ck_assert_uint_eq(kiln_backend_caps("cpu"), KILN_BACKEND_LOADS);
  ck_assert_uint_eq(kiln_backend_caps("interp"), KILN_BACKEND_RUNS_MODULES);
}
END_TEST

static const char *const forever =
    "HloModule m\n"
    "cond { p = s32[] parameter(0)\n ROOT t = pred[] constant(true) }\n"
    "body { p = s32[] parameter(0)\n one = s32[] constant(1)\n ROOT a = s32[] add(p, one) }\n"
    "ENTRY e { z = s32[] constant(0)\n ROOT w = s32[] while(z), condition=cond, body=body }\n";

/* kiln_run_options reach the interpreter through the vtable: the while
 * limit, the cancel flag, the time limit and the live-bytes limit. */
START_TEST(test_interp_run_options) {
  kiln_backend *b = make("interp", 0, 0);
  kiln_device *d = kiln_backend_device(b, 0);
  kiln_module *m = parse(forever);
  kiln_literal *out = NULL;

  kiln_run_options ro = {.max_while_iterations = 1000};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_run_module(d, m, NULL, 0, &ro, &out, &st), KILN_ELIMIT);
  ck_assert_ptr_null(out);
  ck_assert_msg(strstr(st.msg, "still running after 1000 iterations"), "%s", st.msg);

  static atomic_int cancel = 1;
  kiln_run_options rc = {.cancel = &cancel};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_run_module(d, m, NULL, 0, &rc, &out, &st), KILN_ECANCELED);
  ck_assert_msg(strstr(st.msg, "cancelled"), "%s", st.msg);
  /* the same through the one-call API */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_run_module_with(m, "interp", NULL, NULL, &rc, NULL, 0, &out, &st),
                   KILN_ECANCELED);

  kiln_run_options rt = {.timeout_seconds = 0.2};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_run_module(d, m, NULL, 0, &rt, &out, &st), KILN_ELIMIT);
  ck_assert_msg(strstr(st.msg, "time limit"), "%s", st.msg);
  kiln_module_destroy(m);

  m = parse("HloModule m\n"
            "ENTRY e { x = f32[] constant(1)\n ROOT b = f32[1000] broadcast(x), dimensions={} }\n");
  kiln_run_options rm = {.max_live_bytes = 1000};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_run_module(d, m, NULL, 0, &rm, &out, &st), KILN_ELIMIT);
  ck_assert_msg(strstr(st.msg, "needs 4000 bytes"), "%s", st.msg);
  /* without the limit it runs */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_run_module(d, m, NULL, 0, NULL, &out, &st), 0);
  ck_assert_int_eq(kiln_literal_elements(out), 1000);
  kiln_literal_destroy(out);
  kiln_module_destroy(m);
  kiln_backend_destroy(b);
}
END_TEST

START_TEST(test_forwarders_refuse_nulls) {
  kiln_literal *out = (kiln_literal *)1;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_run(NULL, NULL, 0, NULL, &out, &st), KILN_EINVAL);
  ck_assert_ptr_null(out);
  ck_assert_str_eq(st.msg, "no loaded executable");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_execute(NULL, NULL, 0, NULL, NULL, 0, &st), KILN_EINVAL);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_load(NULL, NULL, NULL, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "no result pointer");
  kiln_backend *b = make("cpu", 1, 1);
  kiln_loaded *l = (kiln_loaded *)1;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_load(kiln_backend_device(b, 0), NULL, &l, &st), KILN_EINVAL);
  ck_assert_ptr_null(l);
  ck_assert_str_eq(st.msg, "no executable");
  kiln_status_clear(&st);
  ck_assert_int_eq(
      kiln_device_run_module(kiln_backend_device(b, 0), NULL, NULL, 0, NULL, &out, &st),
      KILN_EINVAL);
  ck_assert_str_eq(st.msg, "no module");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_synchronize(NULL, &st), KILN_EINVAL);
  kiln_loaded_destroy(NULL);
  ck_assert_ptr_null(kiln_loaded_executable(NULL));
  char desc[8];
  kiln_device_describe(NULL, desc, sizeof desc);
  ck_assert_str_eq(desc, "(null)");
  kiln_backend_destroy(b);
}
END_TEST

int main(void) {
  Suite *s = suite_create("backend");
  TCase *tc = tcase_create("registry");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_registry_names);
  tcase_add_test(tc, test_cpu_devices);
  tcase_add_test(tc, test_cpu_defaults_and_env);
  tcase_add_test(tc, test_buffers);
  tcase_add_test(tc, test_buffers_out_of_memory);
  tcase_add_test(tc, test_interp_backend);
  tcase_add_test(tc, test_forwarders_refuse_nulls);
  tcase_add_test(tc, test_every_backend_runs);
  tcase_add_test(tc, test_unknown_backend_lists_registry);
  tcase_add_test(tc, test_interp_run_options);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
