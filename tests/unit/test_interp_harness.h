/* Helpers shared by the interpreter's test suites: parse HLO text, run it on
 * arguments written as literal text, compare the printed result exactly, or
 * check the failure's code and message. Argument lists end with NULL. */
#ifndef KILN_TESTS_UNIT_TEST_INTERP_HARNESS_H
#define KILN_TESTS_UNIT_TEST_INTERP_HARNESS_H

#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/text.h"

static inline kiln_module *parse_ok(const char *text) {
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_module_parse_text(text, strlen(text), "test.hlo", NULL, &m, &st);
  ck_assert_msg(rc == 0, "parse failed: %s: %s\n%s", st.where, st.msg, text);
  return m;
}

/* The literal parser reads "{...}" right after an array shape as a layout;
 * argument texts name none, so the default one is inserted: "f32[2] {1, 2}"
 * becomes "f32[2]{0} {1, 2}". */
static inline char *with_layout(const char *a) {
  const char *lb = strchr(a, '['), *rb = strchr(a, ']');
  size_t len = strlen(a);
  char *out = malloc(len + 200);
  ck_assert(out != NULL);
  if (a[0] == '(' || lb == NULL || rb == NULL || rb < lb || strncmp(rb + 1, " {", 2) != 0) {
    memcpy(out, a, len + 1);
    return out;
  }
  int rank = 0;
  for (const char *p = lb + 1; p < rb; p++)
    if (*p != ' ') rank = rank ? rank : 1;
  for (const char *p = lb + 1; p < rb; p++) rank += *p == ',';
  size_t head = (size_t)(rb + 1 - a), o = head;
  memcpy(out, a, head);
  out[o++] = '{';
  for (int d = rank - 1; d >= 0; d--) o += (size_t)sprintf(out + o, d ? "%d," : "%d", d);
  out[o++] = '}';
  memcpy(out + o, rb + 1, len - head + 1);
  return out;
}

/* The result as "shape-without-layout value", as tests write it. */
static inline char *print_result(const kiln_literal *res) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_shape_print_short(&b, &res->shape);
  kiln_sbuf_putc(&b, ' ');
  kiln_literal_print(&b, res, false);
  return kiln_sbuf_detach(&b, NULL);
}

/* Runs `hlo` on the NULL-terminated argument texts in `ap`. Returns the
 * printed result (kiln_free it) or NULL with *rc and st filled. */
static inline char *run_va(const char *hlo, const kiln_interp_options *o, kiln_status *st, int *rc,
                           va_list ap) {
  kiln_module *m = parse_ok(hlo);
  kiln_literal *args[16] = {NULL};
  uint32_t n = 0;
  const char *a;
  while ((a = va_arg(ap, const char *)) != NULL) {
    ck_assert(n < 16);
    kiln_status ps;
    kiln_status_clear(&ps);
    char *fixed = with_layout(a);
    ck_assert_msg(kiln_literal_parse_text(fixed, strlen(fixed), &args[n], &ps) == 0,
                  "argument %s: %s", a, ps.msg);
    free(fixed);
    n++;
  }
  kiln_literal *res = NULL;
  kiln_status_clear(st);
  *rc = kiln_interp_run(m, (const kiln_literal *const *)args, n, o, &res, st);
  char *text = NULL;
  if (*rc == 0) {
    ck_assert(res != NULL);
    text = print_result(res);
    kiln_literal_destroy(res);
  } else {
    ck_assert(res == NULL);
  }
  for (uint32_t i = 0; i < n; i++) kiln_literal_destroy(args[i]);
  kiln_module_destroy(m);
  return text;
}

static inline void expect_va(const char *hlo, const kiln_interp_options *o, const char *want,
                             va_list ap) {
  kiln_status st;
  int rc;
  char *got = run_va(hlo, o, &st, &rc, ap);
  ck_assert_msg(rc == 0, "run failed: %s: %s (%s)", st.where, st.msg, kiln_err_name(rc));
  if (want) ck_assert_str_eq(got, want);
  kiln_free(got);
}

static inline void expect(const char *hlo, const char *want, ...) {
  va_list ap;
  va_start(ap, want);
  expect_va(hlo, NULL, want, ap);
  va_end(ap);
}

static inline void expect_opts(const char *hlo, const kiln_interp_options *o, const char *want,
                               ...) {
  va_list ap;
  va_start(ap, want);
  expect_va(hlo, o, want, ap);
  va_end(ap);
}

/* The failure must have `code` and "where: msg" must contain `part`. */
static inline void expect_fail_va(const char *hlo, const kiln_interp_options *o, int code,
                                  const char *part, va_list ap) {
  kiln_status st;
  int rc;
  char *got = run_va(hlo, o, &st, &rc, ap);
  ck_assert_msg(rc != 0, "expected %s, got %s", kiln_err_name(code), got ? got : "");
  char full[KILN_STATUS_WHERE_MAX + KILN_STATUS_MSG_MAX + 4];
  snprintf(full, sizeof full, "%s: %s", st.where, st.msg);
  ck_assert_msg(rc == code, "expected %s, got %s: %s", kiln_err_name(code), kiln_err_name(rc),
                full);
  ck_assert_int_eq(st.code, code);
  ck_assert_msg(strstr(full, part) != NULL, "message \"%s\" lacks \"%s\"", full, part);
}

static inline void expect_fail(const char *hlo, int code, const char *part, ...) {
  va_list ap;
  va_start(ap, part);
  expect_fail_va(hlo, NULL, code, part, ap);
  va_end(ap);
}

static inline void expect_fail_opts(const char *hlo, const kiln_interp_options *o, int code,
                                    const char *part, ...) {
  va_list ap;
  va_start(ap, part);
  expect_fail_va(hlo, o, code, part, ap);
  va_end(ap);
}

/* The corpus file's text (free it), or NULL when the corpus is absent. */
static inline char *corpus_read(const char *name) {
  const char *dir = getenv("KILN_CORPUS_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir ? dir : KILN_SOURCE_DIR "/../shared/corpus/xla-hlo",
           name);
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    printf("corpus file %s not found; skipping (set KILN_CORPUS_DIR)\n", path);
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)len + 1);
  ck_assert(text != NULL);
  ck_assert_int_eq(fread(text, 1, (size_t)len, f), (size_t)len);
  text[len] = '\0';
  fclose(f);
  return text;
}

static inline void corpus_expect(const char *name, const char *want, ...) {
  char *text = corpus_read(name);
  if (text == NULL) return;
  va_list ap;
  va_start(ap, want);
  expect_va(text, NULL, want, ap);
  va_end(ap);
  free(text);
}

#endif /* KILN_TESTS_UNIT_TEST_INTERP_HARNESS_H */
