/* kiln.debug_print (compiler/ir/debug_print.c and its users): the format
 * checks; rendering; the compiled step's record read as hostile input; the
 * interpreter and the cpu executable printing the same text to the run's
 * sink (and nothing without one), the executable surviving serialization;
 * grad, jvp and vmap passing through it (the primal printed once, vmap
 * printing the batch); bad formats refused with the instruction named. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/debug_print.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/transforms/transform.h"
#include "executor/run.h"

static const char *const prog =
    "HloModule dp\n"
    "ENTRY main {\n"
    "  x = f32[3] parameter(0)\n"
    "  y = f32[3] multiply(x, x)\n"
    "  p = f32[3] custom-call(y), custom_call_target=\"kiln.debug_print\", "
    "backend_config=\"y = {} {{ok}}\", custom_call_has_side_effect=true\n"
    "  ROOT z = f32[3] add(p, x)\n"
    "}\n";

static kiln_sbuf got;

static void collect(void *ctx, const char *text, size_t n) {
  (void)ctx;
  kiln_sbuf_putn(&got, text, n);
}

static const kiln_debug_sink sink = {collect, NULL};

static kiln_module *parse(const char *text) {
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st) == 0, "%s",
                st.msg);
  ck_assert_msg(kiln_module_verify(m, NULL, &st) == 0, "%s", st.msg);
  return m;
}

static kiln_literal *arg3(double a, double b, double c) {
  int64_t d = 3;
  kiln_shape s = {.dtype = KILN_F32, .rank = 1, .dims = &d};
  kiln_literal *l = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &l, NULL), 0);
  kiln_literal_set_f64(l, 0, a);
  kiln_literal_set_f64(l, 1, b);
  kiln_literal_set_f64(l, 2, c);
  return l;
}

static void bad_format(const char *fmt, const char *part) {
  char why[160];
  ck_assert_msg(!kiln_debug_format_ok(fmt, strlen(fmt), why, sizeof why), "%s accepted", fmt);
  ck_assert_msg(strstr(why, part) != NULL, "%s: \"%s\" lacks \"%s\"", fmt, why, part);
}

START_TEST(test_format_checks) {
  char why[160];
  const char *ok[] = {"", "x", "x = {}", "{{}} {}", "a}}b{{c", "{} done"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    ck_assert_msg(kiln_debug_format_ok(ok[i], strlen(ok[i]), why, sizeof why), "%s: %s", ok[i],
                  why);
  bad_format("{", "lone '{'");
  bad_format("a } b", "lone '}'");
  bad_format("{x}", "lone '{'");
  bad_format("{} {}", "at most one");
  bad_format("tab\there", "0x09");
  bad_format("q\"uote", "0x22");
  bad_format("back\\slash", "0x5c");
  char big[KILN_DEBUG_FORMAT_MAX + 2];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  bad_format(big, "at most");
}
END_TEST

START_TEST(test_render) {
  kiln_literal *v = arg3(1, 2.5, -3);
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_debug_print_render(&b, "v={} {{x}}", 10, v);
  ck_assert_str_eq(kiln_sbuf_str(&b), "v={1, 2.5, -3} {x}\n");
  /* printf directives are text, not directives */
  kiln_sbuf_reset(&b);
  kiln_debug_print_render(&b, "%s%n%x {}", 9, v);
  ck_assert_str_eq(kiln_sbuf_str(&b), "%s%n%x {1, 2.5, -3}\n");
  kiln_literal_destroy(v);
  /* No element, but 2^40 "{}" in full: summarized, as a large value is. */
  int64_t dims[3] = {1 << 20, 1 << 20, 0};
  kiln_shape s = {.dtype = KILN_F32, .rank = 3, .dims = dims};
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &v, &st), 0);
  kiln_sbuf_reset(&b);
  kiln_debug_print_render(&b, "{}", 2, v);
  ck_assert_str_eq(kiln_sbuf_str(&b), "f32[1048576,1048576,0] {... (0 elements)}\n");
  kiln_literal_destroy(v);
  /* A small empty one still prints in full. */
  dims[0] = 2;
  dims[1] = 1;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &v, &st), 0);
  kiln_sbuf_reset(&b);
  kiln_debug_print_render(&b, "{}", 2, v);
  ck_assert_str_eq(kiln_sbuf_str(&b), "{{{}}, {{}}}\n");
  kiln_literal_destroy(v);
  kiln_sbuf_free(&b);
}
END_TEST

START_TEST(test_record_hostile) {
  int64_t d[2] = {2, 3};
  kiln_shape s = {.dtype = KILN_F32, .rank = 2, .dims = d};
  size_t n = kiln_debug_record_size(&s, 4);
  ck_assert_uint_eq(n, 8 + 16 + 4 + 4);
  uint8_t buf[64];
  kiln_debug_record_write(buf, &s, "v={}", 4);
  kiln_debug_record r;
  char why[160];
  ck_assert(kiln_debug_record_read(buf, n, 24, &r, why, sizeof why));
  ck_assert_uint_eq(r.rank, 2);
  ck_assert_uint_eq(r.nfmt, 4);
  ck_assert(!kiln_debug_record_read(buf, n, 20, &r, why, sizeof why)); /* wrong value size */
  ck_assert(strstr(why, "does not fill") != NULL);
  ck_assert(!kiln_debug_record_read(buf, n - 1, 24, &r, why, sizeof why)); /* cut */
  ck_assert(!kiln_debug_record_read(buf, 5, 24, &r, why, sizeof why));
  uint8_t evil[64];
  memcpy(evil, buf, n);
  uint32_t rank = 99;
  memcpy(evil + 4, &rank, 4);
  ck_assert(!kiln_debug_record_read(evil, n, 24, &r, why, sizeof why));
  memcpy(evil, buf, n);
  evil[n - 1] = '\n'; /* the format "v={\n" */
  ck_assert(!kiln_debug_record_read(evil, n, 24, &r, why, sizeof why));
  int64_t neg = -1;
  memcpy(evil, buf, n);
  memcpy(evil + 8, &neg, 8);
  ck_assert(!kiln_debug_record_read(evil, n, 24, &r, why, sizeof why));
}
END_TEST

static char *interp_text(const kiln_module *m, kiln_literal **args, uint32_t n) {
  kiln_sbuf_reset(&got);
  kiln_interp_options io = {.debug = &sink};
  kiln_literal *out = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_interp_run(m, (const kiln_literal *const *)args, n, &io, &out, &st) == 0,
                "%s: %s", st.where, st.msg);
  kiln_literal_destroy(out);
  return strdup(kiln_sbuf_str(&got));
}

START_TEST(test_interp_and_cpu_agree) {
  kiln_module *m = parse(prog);
  kiln_literal *x = arg3(1, 2, 3);
  char *want = interp_text(m, &x, 1);
  ck_assert_str_eq(want, "y = {1, 4, 9} {ok}\n");
  /* no sink: nothing, and the same result */
  kiln_literal *out = NULL;
  ck_assert_int_eq(kiln_interp_run(m, (const kiln_literal *const *)&x, 1, NULL, &out, NULL), 0);
  ck_assert_double_eq(kiln_literal_get_f64(out, 2), 12);
  kiln_literal_destroy(out);

  kiln_executable *e = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_compile(m, NULL, &e, NULL, &st) == 0, "%s: %s", st.where, st.msg);
  /* through the blob: the step and its record survive, checked */
  uint8_t *blob;
  size_t len;
  ck_assert_int_eq(kiln_executable_serialize(e, &blob, &len, &st), 0);
  kiln_executable *back = NULL;
  ck_assert_msg(kiln_executable_deserialize(blob, len, &back, &st) == 0, "%s", st.msg);
  kiln_free(blob);
  kiln_run_options ro = {.debug = &sink};
  kiln_sbuf_reset(&got);
  ck_assert_msg(
      kiln_run_executable(back, NULL, &ro, (const kiln_literal *const *)&x, 1, &out, &st) == 0,
      "%s: %s", st.where, st.msg);
  ck_assert_str_eq(kiln_sbuf_str(&got), want);
  ck_assert_double_eq(kiln_literal_get_f64(out, 2), 12);
  kiln_literal_destroy(out);
  /* the format is data: the generated code does not hold it */
  ck_assert_ptr_null(memmem(back->code, back->ncode, "{{ok}}", 6));
  ck_assert_ptr_null(memmem(back->code, back->ncode, "y = ", 4));
  kiln_executable_destroy(back);
  kiln_executable_destroy(e);
  free(want);
  kiln_literal_destroy(x);
  kiln_module_destroy(m);
}
END_TEST

static kiln_module *transformed(const char *spec) {
  kiln_module *m = parse(prog);
  kiln_transform t;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_transform_parse(spec, &t, &st), 0);
  ck_assert_msg(kiln_transforms_apply(m, &t, 1, &st) == 0, "%s: %s: %s", spec, st.where, st.msg);
  ck_assert_msg(kiln_module_verify(m, NULL, &st) == 0, "%s: %s", spec, st.msg);
  return m;
}

START_TEST(test_transforms_pass_through) {
  kiln_literal *a[2] = {arg3(1, 2, 3), arg3(1, 1, 1)};
  kiln_module *m = transformed("jvp");
  char *t = interp_text(m, a, 2);
  ck_assert_str_eq(t, "y = {1, 4, 9} {ok}\n");
  free(t);
  kiln_module_destroy(m);
  m = transformed("vjp");
  t = interp_text(m, a, 2);
  ck_assert_str_eq(t, "y = {1, 4, 9} {ok}\n");
  free(t);
  kiln_module_destroy(m);
  m = transformed("vmap:size=2");
  int64_t d[2] = {2, 3};
  kiln_shape s = {.dtype = KILN_F32, .rank = 2, .dims = d};
  kiln_literal *xb = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &xb, NULL), 0);
  for (int i = 0; i < 6; i++) kiln_literal_set_f64(xb, i, i);
  t = interp_text(m, &xb, 1);
  ck_assert_str_eq(t, "y = {{0, 1, 4}, {9, 16, 25}} {ok}\n");
  free(t);
  kiln_literal_destroy(xb);
  kiln_module_destroy(m);
  kiln_literal_destroy(a[0]);
  kiln_literal_destroy(a[1]);
}
END_TEST

START_TEST(test_bad_instruction_refused) {
  const char *fmts[] = {"backend_config=\"y = {\"", "backend_config=\"{} {}\""};
  for (int i = 0; i < 2; i++) {
    char text[1024];
    snprintf(text, sizeof text,
             "HloModule bad\nENTRY main {\n  x = f32[3] parameter(0)\n"
             "  ROOT p = f32[3] custom-call(x), custom_call_target=\"kiln.debug_print\", %s\n}\n",
             fmts[i]);
    kiln_module *m = parse(text);
    kiln_literal *x = arg3(1, 2, 3), *out = NULL;
    kiln_status st;
    kiln_status_clear(&st);
    ck_assert_int_eq(kiln_interp_run(m, (const kiln_literal *const *)&x, 1, NULL, &out, &st),
                     KILN_EINVAL);
    ck_assert_msg(strstr(st.where, "p") != NULL, "where: %s", st.where);
    kiln_executable *e = NULL;
    kiln_status_clear(&st);
    ck_assert_int_eq(kiln_compile(m, NULL, &e, NULL, &st), KILN_EINVAL);
    ck_assert_msg(strstr(st.msg, "kiln.debug_print") != NULL, "%s", st.msg);
    kiln_literal_destroy(x);
    kiln_module_destroy(m);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("debug_print");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_format_checks);
  tcase_add_test(tc, test_render);
  tcase_add_test(tc, test_record_hostile);
  tcase_add_test(tc, test_interp_and_cpu_agree);
  tcase_add_test(tc, test_transforms_pass_through);
  tcase_add_test(tc, test_bad_instruction_refused);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  kiln_sbuf_init(&got);
  SRunner *sr = srunner_create(suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  kiln_sbuf_free(&got);
  return failed ? 1 : 0;
}
