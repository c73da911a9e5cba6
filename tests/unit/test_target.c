/* Unit tests of the target table and its resolver (compiler/target.c):
 * every row by each spelling it accepts, with and without its backend; the
 * defaults for NULL and ""; unknown names, rows of another backend and
 * unknown backends, whose messages list what the table holds; kiln_compile
 * taking every spelling (the in-process `kiln compile --target x86-64-v3`
 * bug); and the cache key's target text of a resolved row. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/key.h"
#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "compiler/target.h"

static const kiln_target *must_resolve(const char *backend, const char *name) {
  const kiln_target *t = (const kiln_target *)1;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_target_resolve(backend, name, &t, &st);
  ck_assert_msg(rc == 0, "resolve(%s, %s): %s", backend ? backend : "NULL", name ? name : "NULL",
                st.msg);
  ck_assert_int_eq(st.code, 0);
  ck_assert_ptr_nonnull(t);
  return t;
}

/* Fails; returns the message. */
static kiln_status must_fail(const char *backend, const char *name) {
  const kiln_target *t = (const kiln_target *)1;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_target_resolve(backend, name, &t, &st);
  ck_assert_msg(rc == KILN_EINVAL, "resolve(%s, %s) gave %d", backend ? backend : "NULL",
                name ? name : "NULL", rc);
  ck_assert_int_eq(st.code, KILN_EINVAL);
  ck_assert_str_eq(st.where, "target");
  ck_assert_ptr_null(t);
  return st;
}

static bool has(const char *msg, const char *s) { return strstr(msg, s) != NULL; }

START_TEST(test_every_row_by_every_spelling) {
  uint32_t n;
  const kiln_target *rows = kiln_targets(&n);
  ck_assert_uint_ge(n, 1);
  for (uint32_t i = 0; i < n; i++) {
    const kiln_target *r = &rows[i];
    ck_assert_ptr_nonnull(r->name);
    ck_assert_ptr_nonnull(r->backend);
    ck_assert_ptr_eq(must_resolve(NULL, r->name), r);
    ck_assert_ptr_eq(must_resolve(r->backend, r->name), r);
    if (r->isa == NULL) continue;
    char prefixed[128];
    snprintf(prefixed, sizeof prefixed, "%s-%s", r->backend, r->isa);
    ck_assert_ptr_eq(must_resolve(NULL, r->isa), r);
    ck_assert_ptr_eq(must_resolve(r->backend, r->isa), r);
    ck_assert_ptr_eq(must_resolve(NULL, prefixed), r);
    ck_assert_ptr_eq(must_resolve(r->backend, prefixed), r);
  }
}
END_TEST

/* The spellings that clients send today, pinned to their rows. */
START_TEST(test_known_spellings) {
  const char *cases[][3] = {
      {"cpu", "x86-64-v3", "cpu-x86-64-v3"},
      {NULL, "x86-64-v3", "cpu-x86-64-v3"},
      {"cpu", "cpu-x86-64-v3", "cpu-x86-64-v3"},
      {"cpu", "x86-64", "cpu-x86-64"},
      {"cpu", "x86-64-v2", "cpu-x86-64-v2"},
      {"cpu", "x86-64-v4", "cpu-x86-64-v4"},
      {"cpu", "native", "cpu"},
      {"cpu", "cpu", "cpu"},
      {"cpu", "cpu-native", "cpu"},
      {NULL, "native", "cpu"},
      {"interp", "interp", "interp"},
      {"cuda", "sm_80", "cuda-sm_80"},
      {"cuda", "cuda-sm_90", "cuda-sm_90"},
      {NULL, "sm_100", "cuda-sm_100"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const kiln_target *t = must_resolve(cases[i][0], cases[i][1]);
    ck_assert_msg(strcmp(t->name, cases[i][2]) == 0, "%s resolved to %s, not %s", cases[i][1],
                  t->name, cases[i][2]);
  }
  const kiln_target *v3 = must_resolve("cpu", "x86-64-v3");
  ck_assert_str_eq(v3->backend, "cpu");
  ck_assert_str_eq(v3->isa, "x86-64-v3");
  ck_assert_str_eq(v3->march, "x86-64-v3");
  ck_assert_str_eq(must_resolve("cuda", "sm_90")->backend, "cuda");
}
END_TEST

START_TEST(test_defaults) {
  const kiln_target *d = kiln_target_default();
  uint32_t n;
  const kiln_target *rows = kiln_targets(&n);
  ck_assert_ptr_eq(d, &rows[0]);
  ck_assert_str_eq(d->name, "cpu");
  ck_assert_str_eq(d->isa, "native");
  ck_assert_ptr_eq(must_resolve(NULL, NULL), d);
  ck_assert_ptr_eq(must_resolve(NULL, ""), d);
  ck_assert_ptr_eq(must_resolve("cpu", NULL), d);
  ck_assert_ptr_eq(must_resolve("cpu", ""), d);
  ck_assert_ptr_eq(must_resolve("cpu", "native"), d);
  /* each backend's default is its first row */
  for (uint32_t i = 0; i < n; i++) {
    const kiln_target *first = NULL;
    for (uint32_t j = 0; j < n && first == NULL; j++)
      if (strcmp(rows[j].backend, rows[i].backend) == 0) first = &rows[j];
    ck_assert_ptr_eq(must_resolve(rows[i].backend, NULL), first);
    ck_assert_ptr_eq(must_resolve(rows[i].backend, ""), first);
  }
  ck_assert_str_eq(must_resolve("interp", NULL)->name, "interp");
  /* st may be NULL */
  const kiln_target *t;
  ck_assert_int_eq(kiln_target_resolve("cpu", "x86-64", &t, NULL), 0);
  ck_assert_str_eq(t->name, "cpu-x86-64");
  ck_assert_int_eq(kiln_target_resolve("cpu", "z80", &t, NULL), KILN_EINVAL);
  ck_assert_ptr_null(t);
}
END_TEST

/* Whether item is one of the ", "-separated entries of msg that follow
 * `label` and end at one of the characters in `ends`. */
static bool listed(const char *msg, const char *label, const char *ends, const char *item) {
  const char *p = strstr(msg, label);
  if (p == NULL) return false;
  p += strlen(label);
  size_t n = strcspn(p, ends), k = strlen(item);
  for (const char *q = p; q < p + n;) {
    size_t len = strcspn(q, ",;)");
    if (len == k && strncmp(q, item, k) == 0) return true;
    q += len;
    while (q < p + n && (*q == ',' || *q == ' ')) q++;
  }
  return false;
}

/* The message lists every row of the backend (NULL: all) by name and by
 * ISA, taken from the table, and no row of another backend. */
static void lists_backend(const char *msg, const char *backend) {
  uint32_t n;
  const kiln_target *rows = kiln_targets(&n);
  for (uint32_t i = 0; i < n; i++) {
    bool mine = backend == NULL || strcmp(rows[i].backend, backend) == 0;
    ck_assert_msg(listed(msg, "(known: ", ";)", rows[i].name) == mine, "row %s %s in: %s",
                  rows[i].name, mine ? "missing" : "listed", msg);
    if (rows[i].isa)
      ck_assert_msg(listed(msg, "; or by ISA: ", ")", rows[i].isa) == mine, "isa %s %s in: %s",
                    rows[i].isa, mine ? "missing" : "listed", msg);
  }
}

START_TEST(test_unknown_names) {
  const char *bad[] = {"z80",        "CPU",        "X86-64-V3",      "cpu-",
                       "-x86-64",    "x86-64-v3 ", " native",        "cpu-cpu",
                       "cpux86-64",  "x86-64-v9",  "cpu-cpu-x86-64", "cuda-native",
                       "sm_90-cuda", "native-cpu"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kiln_status st = must_fail("cpu", bad[i]);
    char want[160];
    snprintf(want, sizeof want, "unknown cpu target '%s' (known: cpu, ", bad[i]);
    ck_assert_msg(strncmp(st.msg, want, strlen(want)) == 0, "%s", st.msg);
    lists_backend(st.msg, "cpu");
  }
  kiln_status st = must_fail("cpu", "z80");
  ck_assert_str_eq(st.msg, "unknown cpu target 'z80' (known: cpu, cpu-x86-64, cpu-x86-64-v2, "
                           "cpu-x86-64-v3, cpu-x86-64-v4; or by ISA: native, x86-64, x86-64-v2, "
                           "x86-64-v3, x86-64-v4)");
  /* without a backend: every row */
  st = must_fail(NULL, "z80");
  const char *want = "unknown target 'z80' (known: cpu, ";
  ck_assert_msg(strncmp(st.msg, want, strlen(want)) == 0, "%s", st.msg);
  lists_backend(st.msg, NULL);
  /* a backend without ISAs lists names only */
  st = must_fail("interp", "z80");
  ck_assert_str_eq(st.msg, "unknown interp target 'z80' (known: interp)");
  /* a long name is cut, the list is whole */
  char *big = malloc(5000);
  memset(big, 'x', 4999);
  big[4999] = '\0';
  st = must_fail("cpu", big);
  ck_assert(has(st.msg, "x86-64-v4)"));
  ck_assert_uint_lt(strlen(st.msg), 400);
  free(big);
}
END_TEST

START_TEST(test_other_backend_and_unknown_backend) {
  kiln_status st = must_fail("cpu", "cuda-sm_90");
  const char *want = "target 'cuda-sm_90' is for the cuda backend, not cpu (known: cpu, ";
  ck_assert_msg(strncmp(st.msg, want, strlen(want)) == 0, "%s", st.msg);
  lists_backend(st.msg, "cpu");
  st = must_fail("cpu", "sm_90");
  ck_assert(has(st.msg, "is for the cuda backend, not cpu"));
  st = must_fail("cpu", "interp");
  ck_assert(has(st.msg, "is for the interp backend, not cpu"));
  st = must_fail("cuda", "x86-64-v3");
  ck_assert(has(st.msg, "'x86-64-v3' is for the cpu backend, not cuda (known: cuda-sm_80"));
  lists_backend(st.msg, "cuda");
  st = must_fail("tpu", "v5");
  ck_assert_str_eq(st.msg, "unknown backend 'tpu' (backends with targets: cpu, interp, cuda)");
  st = must_fail("tpu", NULL);
  ck_assert(has(st.msg, "unknown backend 'tpu'"));
  st = must_fail("", "cpu");
  ck_assert(has(st.msg, "unknown backend ''"));
}
END_TEST

/* The cache key's target text is the row's ISA; "native" names this host. */
START_TEST(test_cache_target_text) {
  char a[KILN_CACHE_TEXT_MAX], b[KILN_CACHE_TEXT_MAX];
  kiln_cache_target_text(must_resolve("cpu", "x86-64-v3")->isa, a);
  ck_assert_str_eq(a, "x86-64-v3");
  kiln_cache_target_text(must_resolve("cpu", "cpu-x86-64-v3")->isa, b);
  ck_assert_str_eq(a, b);
  kiln_cache_target_text(must_resolve("cuda", "cuda-sm_90")->isa, a);
  ck_assert_str_eq(a, "sm_90");
  kiln_cache_target_text(must_resolve("cpu", "native")->isa, a);
  ck_assert_msg(strncmp(a, "native-", 7) == 0 && strlen(a) == 7 + 16, "%s", a);
  kiln_cache_target_text(must_resolve("cpu", NULL)->isa, b);
  ck_assert_str_eq(a, b);
  kiln_cache_target_text(must_resolve("cpu", "cpu")->isa, b);
  ck_assert_str_eq(a, b);
}
END_TEST

static const char tiny[] =
    "HloModule t\nENTRY main {\n  p = f32[4] parameter(0)\n  ROOT n = f32[4] negate(p)\n}\n";

/* kiln_compile takes every spelling and records the canonical name. */
START_TEST(test_compile_spellings) {
  kiln_module *m;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(tiny, strlen(tiny), "tiny.hlo", NULL, &m, &st), 0);
  const char *cases[][2] = {{NULL, "cpu"},
                            {"native", "cpu"},
                            {"", "cpu"},
                            {"x86-64-v3", "cpu-x86-64-v3"},
                            {"cpu-x86-64-v3", "cpu-x86-64-v3"},
                            {"x86-64", "cpu-x86-64"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kiln_compile_options o;
    kiln_compile_options_init(&o);
    o.target = cases[i][0];
    kiln_executable *e = NULL;
    kiln_status_clear(&st);
    ck_assert_msg(kiln_compile(m, &o, &e, NULL, &st) == 0, "%s: %s", cases[i][0], st.msg);
    ck_assert_str_eq(e->target, cases[i][1]);
    kiln_executable_destroy(e);
  }
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  kiln_executable *e = NULL;
  o.target = "z80";
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_compile(m, &o, &e, NULL, &st), KILN_ENOTFOUND);
  ck_assert_ptr_null(e);
  ck_assert_str_eq(st.where, "options.target");
  ck_assert(has(st.msg, "unknown target 'z80' (known: cpu, "));
  /* cuda rows have the CUDA target (NVRTC, where libnvrtc is installed) */
  o.target = "sm_90";
  kiln_status_clear(&st);
  int rc = kiln_compile(m, &o, &e, NULL, &st);
  ck_assert_msg(rc == 0 || rc == KILN_EUNAVAIL, "%s", st.msg);
  if (rc == 0) ck_assert_str_eq(e->target, "cuda-sm_90");
  kiln_executable_destroy(e);
  e = NULL;
  o.target = "interp";
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_compile(m, &o, &e, NULL, &st), KILN_EUNIMPL);
  ck_assert_ptr_null(e);
  ck_assert(has(st.msg, "target 'interp' (backend interp) has no code generator"));
  kiln_module_destroy(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("target");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_every_row_by_every_spelling);
  tcase_add_test(tc, test_known_spellings);
  tcase_add_test(tc, test_defaults);
  tcase_add_test(tc, test_unknown_names);
  tcase_add_test(tc, test_other_backend_and_unknown_backend);
  tcase_add_test(tc, test_cache_target_text);
  tcase_add_test(tc, test_compile_spellings);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
