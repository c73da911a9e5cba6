/* Unit tests for the backend registry and its checked forwarders: creating
 * backends by name, device counts and thread shares, buffers (alloc, write,
 * read, bounds), the interp backend running modules, every registered
 * backend running a module the way callers drive it (by what the backend
 * says it runs, never by its name), the run options reaching the
 * interpreter through the vtable, and every misuse turning into a status
 * with the exact message; then the multi-device half: device-to-device
 * copies, host views, asynchronous launches and their events (after success
 * and after a failed run), communicators (and the device sets they refuse),
 * mesh loads with gang launches on 4 cpu devices, and the cpu collectives
 * against results computed by hand. */
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

/* ---- copies, host views ---------------------------------------------------- */

START_TEST(test_buffer_copy) {
  kiln_backend *b = make("cpu", 2, 1);
  kiln_device *d0 = kiln_backend_device(b, 0), *d1 = kiln_backend_device(b, 1);
  kiln_buffer *x = NULL, *y = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(d0, 16, &x, &st), 0);
  ck_assert_int_eq(kiln_buffer_alloc(d1, 16, &y, &st), 0);
  const char text[16] = "0123456789abcde";
  ck_assert_int_eq(kiln_buffer_write(x, 0, text, 16, &st), 0);
  /* across devices, then within one buffer (disjoint ranges) */
  ck_assert_int_eq(kiln_buffer_copy(y, 4, x, 0, 8, &st), 0);
  ck_assert_int_eq(kiln_buffer_copy(x, 0, x, 8, 8, &st), 0);
  char back[16];
  ck_assert_int_eq(kiln_buffer_read(y, 0, back, 16, &st), 0);
  ck_assert_mem_eq(back,
                   "\0\0\0\0"
                   "01234567"
                   "\0\0\0\0",
                   16);
  ck_assert_int_eq(kiln_buffer_read(x, 0, back, 8, &st), 0);
  ck_assert_mem_eq(back, "89abcde", 8);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_copy(x, 2, x, 0, 4, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "copy: bytes [0, 0 + 4) and [2, 2 + 4) of one buffer overlap");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_copy(y, 10, x, 0, 8, &st), KILN_ERANGE);
  ck_assert_str_eq(st.msg, "copy to: bytes [10, 10 + 8) outside a buffer of 16 bytes");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_copy(NULL, 0, x, 0, 1, &st), KILN_EINVAL);

  /* host views and who can access what */
  char *h = kiln_buffer_host(y, false);
  ck_assert_ptr_nonnull(h);
  ck_assert_mem_eq(h + 4, "01234567", 8);
  ck_assert(kiln_device_can_access(d0, y)); /* cpu devices share the host's memory */
  ck_assert_ptr_null(kiln_buffer_host(NULL, false));

  /* another backend: refused; interp copies bounce through the host */
  kiln_backend *ib = make("interp", 0, 0);
  kiln_buffer *z = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(kiln_backend_device(ib, 0), 16, &z, &st), 0);
  ck_assert(!kiln_device_can_access(d0, z));
  ck_assert(!kiln_device_can_access(kiln_backend_device(ib, 0), x));
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_copy(z, 0, x, 0, 4, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "copy: from a buffer of backend cpu to one of backend interp (copy "
                           "through the host)");
  ck_assert_int_eq(kiln_buffer_write(z, 0, "wxyz", 4, &st), 0);
  ck_assert_int_eq(kiln_buffer_copy(z, 8, z, 0, 4, &st), 0);
  ck_assert_mem_eq((char *)kiln_buffer_host(z, false) + 8, "wxyz", 4);
  kiln_buffer_free(z);
  kiln_backend_destroy(ib);
  kiln_buffer_free(x);
  kiln_buffer_free(y);
  kiln_backend_destroy(b);
}
END_TEST

/* A recycled cpu buffer owes zeroes: a host view pays them, a discarding
 * one does not need to; either way the caller sees no old bytes unless it
 * promised to overwrite them. */
START_TEST(test_host_view_zeroes) {
  kiln_backend *b = make("cpu", 1, 1);
  kiln_device *d = kiln_backend_device(b, 0);
  size_t big = (size_t)1 << 20;
  kiln_buffer *x = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(d, big, &x, &st), 0);
  memset(kiln_buffer_host(x, true), 0x5a, big);
  kiln_buffer_free(x); /* into the device's cache */
  ck_assert_int_eq(kiln_buffer_alloc(d, big, &x, &st), 0);
  unsigned char *h = kiln_buffer_host(x, false);
  for (size_t i = 0; i < big; i += 4096) ck_assert_uint_eq(h[i], 0);
  kiln_buffer_free(x);
  kiln_backend_destroy(b);
}
END_TEST

/* ---- executables: async launch, events, meshes -------------------------- */

static kiln_executable *compile(const char *text) {
  kiln_module *m = parse(text);
  kiln_executable *e = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_compile(m, NULL, &e, NULL, &st) == 0, "%s", st.msg);
  kiln_module_destroy(m);
  return e;
}

static const char add_text[] = "HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n"
                               "  q = f32[4] parameter(1)\n  ROOT r = f32[4] add(p, q)\n}\n";

static kiln_buffer *f32_buffer(kiln_device *d, const float *v, size_t n) {
  kiln_buffer *b = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(d, n * sizeof *v, &b, &st), 0);
  ck_assert_int_eq(kiln_buffer_write(b, 0, v, n * sizeof *v, &st), 0);
  return b;
}

START_TEST(test_async_launch) {
  kiln_backend *b = make("cpu", 2, 1);
  kiln_device *d0 = kiln_backend_device(b, 0), *d1 = kiln_backend_device(b, 1);
  kiln_executable *e = compile(add_text);
  kiln_loaded *l = NULL;
  ck_assert_int_eq(kiln_device_load(d0, e, &l, &st), 0);
  ck_assert(!kiln_loaded_donates(l, 0));
  /* a sibling device's buffer is taken as it is */
  kiln_buffer *args[2] = {f32_buffer(d0, (float[]){1, 2, 3, 4}, 4),
                          f32_buffer(d1, (float[]){10, 20, 30, 40}, 4)};
  kiln_buffer *res[1] = {NULL};
  kiln_event *ev = NULL;
  ck_assert_int_eq(kiln_loaded_execute_async(l, args, 2, NULL, res, 1, &ev, &st), 0);
  ck_assert_ptr_nonnull(ev);
  ck_assert_int_eq(kiln_event_wait(ev, &st), 0);
  ck_assert(kiln_event_query(ev));
  ck_assert_int_eq(kiln_event_wait(ev, &st), 0); /* again: same answer */
  float out[4];
  ck_assert_int_eq(kiln_buffer_read(res[0], 0, out, sizeof out, &st), 0);
  ck_assert_float_eq(out[0], 11);
  ck_assert_float_eq(out[3], 44);
  kiln_event_destroy(ev);
  kiln_buffer_free(res[0]);

  /* argument errors come back at once, with no event */
  ev = (kiln_event *)1;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_execute_async(l, args, 1, NULL, res, 1, &ev, &st), KILN_EINVAL);
  ck_assert_ptr_null(ev);
  ck_assert_ptr_null(res[0]);
  ck_assert_str_eq(st.msg, "the executable takes 2 parameter leaves, 1 buffers given");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_execute_async(l, args, 2, NULL, res, 1, NULL, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "no event pointer");
  kiln_event_destroy(NULL);
  ck_assert(!kiln_event_query(NULL));
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_event_wait(NULL, &st), KILN_EINVAL);

  kiln_buffer_free(args[0]);
  kiln_buffer_free(args[1]);
  kiln_loaded_destroy(l);
  kiln_executable_destroy(e);
  kiln_backend_destroy(b);
}
END_TEST

/* A run that fails is launched fine: its failure is the event's. */
START_TEST(test_event_after_error) {
  kiln_backend *b = make("cpu", 1, 1);
  kiln_device *d = kiln_backend_device(b, 0);
  kiln_executable *e = compile("HloModule w\n"
                               "cond {\n  p = s32[] parameter(0)\n  c = s32[] constant(1000000)\n"
                               "  ROOT lt = pred[] compare(p, c), direction=LT\n}\n"
                               "body {\n  p = s32[] parameter(0)\n  one = s32[] constant(1)\n"
                               "  ROOT a = s32[] add(p, one)\n}\n"
                               "ENTRY e {\n  x = s32[] parameter(0)\n"
                               "  ROOT w = s32[] while(x), condition=cond, body=body\n}\n");
  kiln_loaded *l = NULL;
  ck_assert_int_eq(kiln_device_load(d, e, &l, &st), 0);
  kiln_buffer *arg = NULL, *res[1] = {NULL};
  ck_assert_int_eq(kiln_buffer_alloc(d, 4, &arg, &st), 0);
  kiln_run_options ro = {.max_while_iterations = 3};
  kiln_event *ev = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_execute_async(l, &arg, 1, &ro, res, 1, &ev, &st), 0);
  ck_assert_int_eq(st.code, 0); /* the launch itself went fine */
  ck_assert_ptr_nonnull(res[0]);
  ck_assert_int_eq(kiln_event_wait(ev, &st), KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "while loop ran past 3 iterations");
  ck_assert(kiln_event_query(ev));
  kiln_event_destroy(ev);
  kiln_buffer_free(res[0]); /* the caller's in every case */
  /* the synchronous form frees the results itself */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_execute(l, &arg, 1, &ro, res, 1, &st), KILN_ELIMIT);
  ck_assert_ptr_null(res[0]);
  kiln_buffer_free(arg);
  kiln_loaded_destroy(l);
  kiln_executable_destroy(e);
  kiln_backend_destroy(b);
}
END_TEST

START_TEST(test_comm_create) {
  kiln_backend *b = make("cpu", 4, 1), *ib = make("interp", 0, 0);
  kiln_device *d[4];
  for (uint32_t i = 0; i < 4; i++) d[i] = kiln_backend_device(b, i);
  kiln_comm *c = (kiln_comm *)1;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_comm_create(b, d, 0, &c, &st), KILN_EINVAL);
  ck_assert_ptr_null(c);
  ck_assert_str_eq(st.msg, "an empty device set");
  kiln_device *dup[3] = {d[0], d[2], d[0]};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_comm_create(b, dup, 3, &c, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "rank 2: device cpu:0 is already rank 0");
  kiln_device *mixed[2] = {d[1], kiln_backend_device(ib, 0)};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_comm_create(b, mixed, 2, &c, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "rank 1: device interp:0 belongs to another backend than this cpu one");
  kiln_device *none[1] = {NULL};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_comm_create(b, none, 1, &c, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "rank 0: no device");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_comm_create(NULL, d, 4, &c, &st), KILN_EINVAL);

  /* any order of distinct devices */
  kiln_device *order[3] = {d[3], d[1], d[2]};
  ck_assert_int_eq(kiln_comm_create(b, order, 3, &c, &st), 0);
  order[0] = NULL; /* copied */
  ck_assert_uint_eq(kiln_comm_size(c), 3);
  ck_assert_ptr_eq(kiln_comm_device(c, 0), d[3]);
  ck_assert_ptr_eq(kiln_comm_device(c, 2), d[2]);
  ck_assert_ptr_null(kiln_comm_device(c, 3));
  kiln_comm_destroy(c);
  kiln_comm_destroy(NULL);
  ck_assert_uint_eq(kiln_comm_size(NULL), 0);
  kiln_backend_destroy(ib);
  kiln_backend_destroy(b);
}
END_TEST

START_TEST(test_mesh_gang_launch) {
  kiln_backend *b = make("cpu", 4, 1);
  kiln_device *d[4];
  for (uint32_t i = 0; i < 4; i++) d[i] = kiln_backend_device(b, i);
  kiln_comm *c = NULL;
  ck_assert_int_eq(kiln_comm_create(b, d, 4, &c, &st), 0);
  kiln_executable *e = compile(add_text);
  kiln_mesh *m = NULL;
  ck_assert_int_eq(kiln_comm_load(c, e, &m, &st), 0);
  ck_assert_ptr_eq(kiln_loaded_executable(kiln_mesh_rank(m, 3)), e);
  ck_assert_ptr_null(kiln_mesh_rank(m, 4));
  kiln_buffer *argv[4][2], *resv[4][1];
  kiln_buffer *const *args[4];
  kiln_buffer **res[4];
  for (uint32_t r = 0; r < 4; r++) {
    float x = (float)r;
    argv[r][0] = f32_buffer(d[r], (float[]){x, x, x, x}, 4);
    argv[r][1] = f32_buffer(d[r], (float[]){1, 2, 3, 4}, 4);
    args[r] = argv[r];
    res[r] = resv[r];
  }
  ck_assert_int_eq(kiln_mesh_execute(m, args, 2, NULL, res, 1, &st), 0);
  for (uint32_t r = 0; r < 4; r++) {
    float out[4];
    ck_assert_ptr_eq(kiln_buffer_device(resv[r][0]), d[r]);
    ck_assert_int_eq(kiln_buffer_read(resv[r][0], 0, out, sizeof out, &st), 0);
    for (int i = 0; i < 4; i++) ck_assert_float_eq(out[i], (float)r + (float)(i + 1));
    kiln_buffer_free(resv[r][0]);
  }
  /* async: one event for the gang */
  kiln_event *ev = NULL;
  ck_assert_int_eq(kiln_mesh_execute_async(m, args, 2, NULL, res, 1, &ev, &st), 0);
  ck_assert_int_eq(kiln_event_wait(ev, &st), 0);
  kiln_event_destroy(ev);
  for (uint32_t r = 0; r < 4; r++) kiln_buffer_free(resv[r][0]);
  /* a bad argument on one rank: nothing runs, nothing is left allocated */
  kiln_buffer *short_buf = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(d[2], 8, &short_buf, &st), 0);
  kiln_buffer *good_buf = argv[2][1];
  argv[2][1] = short_buf;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_mesh_execute(m, args, 2, NULL, res, 1, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "mesh rank 2");
  ck_assert_str_eq(st.msg, "parameter leaf 1: buffer has 8 bytes, expected 16");
  for (uint32_t r = 0; r < 4; r++) ck_assert_ptr_null(resv[r][0]);
  kiln_buffer_free(short_buf);
  kiln_buffer_free(good_buf);
  for (uint32_t r = 0; r < 4; r++) {
    kiln_buffer_free(argv[r][0]);
    if (r != 2) kiln_buffer_free(argv[r][1]);
  }
  kiln_mesh_destroy(m);
  kiln_mesh_destroy(NULL);
  kiln_comm_destroy(c);
  kiln_executable_destroy(e);
  kiln_backend_destroy(b);
}
END_TEST

/* ---- collectives on 4 cpu devices ------------------------------------------ */

typedef struct ring {
  kiln_backend *b;
  kiln_comm *c;
  kiln_buffer *send[4], *recv[4];
} ring;

/* 4 devices; send[r] holds `count` elements of `esize` bytes from `init`
 * (rank-major), recv[r] has room for recv_count elements. */
static void ring_open(ring *g, const void *init, size_t esize, uint64_t count,
                      uint64_t recv_count) {
  g->b = make("cpu", 4, 1);
  kiln_device *d[4];
  for (uint32_t r = 0; r < 4; r++) d[r] = kiln_backend_device(g->b, r);
  ck_assert_int_eq(kiln_comm_create(g->b, d, 4, &g->c, &st), 0);
  for (uint32_t r = 0; r < 4; r++) {
    ck_assert_int_eq(kiln_buffer_alloc(d[r], count * esize, &g->send[r], &st), 0);
    ck_assert_int_eq(kiln_buffer_alloc(d[r], recv_count * esize, &g->recv[r], &st), 0);
    ck_assert_int_eq(kiln_buffer_write(g->send[r], 0, (const char *)init + r * count * esize,
                                       count * esize, &st),
                     0);
  }
}

static void ring_close(ring *g) {
  for (uint32_t r = 0; r < 4; r++) {
    kiln_buffer_free(g->send[r]);
    kiln_buffer_free(g->recv[r]);
  }
  kiln_comm_destroy(g->c);
  kiln_backend_destroy(g->b);
}

static int collective(ring *g, int op, int dtype, int reduce_op, uint64_t count) {
  kiln_collective k = {.op = op,
                       .dtype = dtype,
                       .reduce_op = reduce_op,
                       .count = count,
                       .send = g->send,
                       .recv = g->recv};
  kiln_status_clear(&st);
  return kiln_comm_collective(g->c, &k, &st);
}

START_TEST(test_all_reduce) {
  /* f32: rank r holds {r+1, -r, r/2, 2} */
  float f[16];
  for (int r = 0; r < 4; r++) {
    f[4 * r] = (float)(r + 1);
    f[4 * r + 1] = (float)-r;
    f[4 * r + 2] = (float)r / 2;
    f[4 * r + 3] = 2;
  }
  ring g;
  ring_open(&g, f, 4, 4, 4);
  const struct {
    int op;
    float want[4];
  } cases[] = {
      {KILN_OP_ADD, {10, -6, 3, 8}},
      {KILN_OP_MULTIPLY, {24, 0, 0, 16}},
      {KILN_OP_MAXIMUM, {4, 0, 1.5f, 2}},
      {KILN_OP_MINIMUM, {1, -3, 0, 2}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ck_assert_msg(collective(&g, KILN_OP_ALL_REDUCE, KILN_F32, cases[i].op, 4) == 0, "%s", st.msg);
    for (uint32_t r = 0; r < 4; r++) {
      float out[4];
      ck_assert_int_eq(kiln_buffer_read(g.recv[r], 0, out, sizeof out, &st), 0);
      for (int j = 0; j < 4; j++) ck_assert_float_eq(out[j], cases[i].want[j]);
    }
  }
  ring_close(&g);

  /* f64 over more than one block, in place */
  enum { N = 1300 };
  double *dv = malloc(4 * N * sizeof *dv);
  for (int r = 0; r < 4; r++)
    for (int j = 0; j < N; j++) dv[r * N + j] = j * 0.5 + r;
  ring_open(&g, dv, 8, N, N);
  kiln_collective k = {.op = KILN_OP_ALL_REDUCE,
                       .dtype = KILN_F64,
                       .reduce_op = KILN_OP_ADD,
                       .count = N,
                       .send = g.send,
                       .recv = g.send};
  ck_assert_int_eq(kiln_comm_collective(g.c, &k, &st), 0);
  for (uint32_t r = 0; r < 4; r++) {
    const double *h = kiln_buffer_host(g.send[r], false);
    for (int j = 0; j < N; j++) ck_assert_double_eq(h[j], j * 2.0 + 6);
  }
  ring_close(&g);
  free(dv);

  /* s32: sum, max, min, product */
  int32_t s[8] = {1, -5, 2, 7, -3, 0, 4, 2}; /* 2 elements per rank */
  ring_open(&g, s, 4, 2, 2);
  const struct {
    int op;
    int32_t want[2];
  } sc[] = {{KILN_OP_ADD, {4, 4}},
            {KILN_OP_MAXIMUM, {4, 7}},
            {KILN_OP_MINIMUM, {-3, -5}},
            {KILN_OP_MULTIPLY, {-24, 0}}};
  for (size_t i = 0; i < 4; i++) {
    ck_assert_int_eq(collective(&g, KILN_OP_ALL_REDUCE, KILN_S32, sc[i].op, 2), 0);
    int32_t out[2];
    ck_assert_int_eq(kiln_buffer_read(g.recv[3], 0, out, sizeof out, &st), 0);
    ck_assert_int_eq(out[0], sc[i].want[0]);
    ck_assert_int_eq(out[1], sc[i].want[1]);
  }
  /* refused: a reduction that is none, a type cpu does not reduce */
  ck_assert_int_eq(collective(&g, KILN_OP_ALL_REDUCE, KILN_S32, KILN_OP_SUBTRACT, 2), KILN_EINVAL);
  ck_assert_str_eq(st.where, "all-reduce");
  ck_assert_int_eq(collective(&g, KILN_OP_ALL_REDUCE, KILN_F16, KILN_OP_ADD, 2), KILN_EUNIMPL);
  ck_assert_str_eq(st.msg, "all-reduce over f16 is not implemented by backend cpu (f32, f64, s32, "
                           "s64, u32, u64 are)");
  ck_assert_int_eq(collective(&g, KILN_OP_ALL_REDUCE, KILN_S32, KILN_OP_ADD, 3), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "rank 0: the send buffer has 8 bytes, 12 needed");
  ck_assert_int_eq(collective(&g, KILN_OP_ADD, KILN_S32, KILN_OP_ADD, 2), KILN_EINVAL);
  ring_close(&g);
}
END_TEST

START_TEST(test_all_gather_and_friends) {
  int32_t s[8] = {0, 1, 10, 11, 20, 21, 30, 31};
  ring g;
  ring_open(&g, s, 4, 2, 8);
  ck_assert_msg(collective(&g, KILN_OP_ALL_GATHER, KILN_S32, 0, 2) == 0, "%s", st.msg);
  for (uint32_t r = 0; r < 4; r++) {
    int32_t out[8];
    ck_assert_int_eq(kiln_buffer_read(g.recv[r], 0, out, sizeof out, &st), 0);
    ck_assert_mem_eq(out, s, sizeof s);
  }
  /* the recv buffers must hold every rank's part */
  ck_assert_int_eq(collective(&g, KILN_OP_ALL_GATHER, KILN_S32, 0, 3), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "rank 0: the send buffer has 8 bytes, 12 needed");
  ring_close(&g);

  /* reduce-scatter and all-to-all: 4 elements per rank, one per peer */
  int32_t t[16];
  for (int i = 0; i < 16; i++) t[i] = i; /* rank r: 4r .. 4r+3 */
  ring_open(&g, t, 4, 4, 4);
  ck_assert_int_eq(collective(&g, KILN_OP_REDUCE_SCATTER, KILN_S32, KILN_OP_ADD, 4), 0);
  for (uint32_t r = 0; r < 4; r++) {
    int32_t out;
    ck_assert_int_eq(kiln_buffer_read(g.recv[r], 0, &out, 4, &st), 0);
    ck_assert_int_eq(out, (int32_t)(4 * r + 24)); /* r + (4 + r) + (8 + r) + (12 + r) */
  }
  ck_assert_int_eq(collective(&g, KILN_OP_ALL_TO_ALL, KILN_S32, 0, 4), 0);
  for (uint32_t r = 0; r < 4; r++) {
    int32_t out[4];
    ck_assert_int_eq(kiln_buffer_read(g.recv[r], 0, out, sizeof out, &st), 0);
    for (int k = 0; k < 4; k++) ck_assert_int_eq(out[k], 4 * k + (int)r); /* element r of rank k */
  }
  ck_assert_int_eq(collective(&g, KILN_OP_ALL_TO_ALL, KILN_S32, 0, 3), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "3 elements per rank do not split over 4 ranks");
  ring_close(&g);
}
END_TEST

START_TEST(test_collective_permute) {
  float f[8] = {0, 0.5f, 1, 1.5f, 2, 2.5f, 3, 3.5f};
  ring g;
  ring_open(&g, f, 4, 2, 2);
  /* a shift by one that leaves rank 0 nothing: {0->1, 1->2, 2->3} */
  const uint32_t pairs[] = {0, 1, 1, 2, 2, 3};
  kiln_collective k = {.op = KILN_OP_COLLECTIVE_PERMUTE,
                       .dtype = KILN_F32,
                       .count = 2,
                       .send = g.send,
                       .recv = g.recv,
                       .pairs = pairs,
                       .npairs = 3};
  ck_assert_int_eq(kiln_buffer_write(g.recv[0], 0, "garbage!", 8, &st), 0);
  ck_assert_int_eq(kiln_comm_collective(g.c, &k, &st), 0);
  float out[2];
  ck_assert_int_eq(kiln_buffer_read(g.recv[0], 0, out, sizeof out, &st), 0);
  ck_assert_float_eq(out[0], 0); /* no pair's target: zeros */
  ck_assert_float_eq(out[1], 0);
  for (uint32_t r = 1; r < 4; r++) {
    ck_assert_int_eq(kiln_buffer_read(g.recv[r], 0, out, sizeof out, &st), 0);
    ck_assert_float_eq(out[0], (float)(r - 1));
    ck_assert_float_eq(out[1], (float)(r - 1) + 0.5f);
  }
  /* refused: repeated targets, ranks out of range, aliasing */
  const uint32_t twice[] = {0, 1, 2, 1};
  k.pairs = twice;
  k.npairs = 2;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_comm_collective(g.c, &k, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "pairs 0 and 1 both send to rank 1");
  const uint32_t far[] = {0, 4};
  k.pairs = far;
  k.npairs = 1;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_comm_collective(g.c, &k, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "pair 0: {0,4} outside ranks 0 to 3");
  k.recv = g.send;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_comm_collective(g.c, &k, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "rank 0: the recv buffer is also rank 0's send buffer");
  ring_close(&g);

  /* a backend with no collectives says so */
  kiln_backend *ib = make("interp", 0, 0);
  kiln_device *d = kiln_backend_device(ib, 0);
  kiln_comm *c = NULL;
  ck_assert_int_eq(kiln_comm_create(ib, &d, 1, &c, &st), 0);
  kiln_buffer *x = NULL, *y = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(d, 4, &x, &st), 0);
  ck_assert_int_eq(kiln_buffer_alloc(d, 4, &y, &st), 0);
  kiln_collective ar = {.op = KILN_OP_ALL_REDUCE,
                        .dtype = KILN_F32,
                        .reduce_op = KILN_OP_ADD,
                        .count = 1,
                        .send = &x,
                        .recv = &y};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_comm_collective(c, &ar, &st), KILN_EUNIMPL);
  ck_assert_str_eq(st.msg, "backend interp implements no collectives");
  ck_assert_str_eq(st.where, "all-reduce");
  kiln_buffer_free(x);
  kiln_buffer_free(y);
  kiln_comm_destroy(c);
  kiln_backend_destroy(ib);
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
  TCase *multi = tcase_create("multi-device");
  tcase_set_timeout(multi, 120);
  tcase_add_test(multi, test_buffer_copy);
  tcase_add_test(multi, test_host_view_zeroes);
  tcase_add_test(multi, test_async_launch);
  tcase_add_test(multi, test_event_after_error);
  tcase_add_test(multi, test_comm_create);
  tcase_add_test(multi, test_mesh_gang_launch);
  tcase_add_test(multi, test_all_reduce);
  tcase_add_test(multi, test_all_gather_and_friends);
  tcase_add_test(multi, test_collective_permute);
  suite_add_tcase(s, multi);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
