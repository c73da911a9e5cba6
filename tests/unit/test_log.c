/* kilnd's logger (server/log.c): the three formats, quoting and escaping,
 * levels, cut records, the request line of a call, the libraries' lines
 * through common/log.h and request ids.
 *
 * The logger writes to fd 2; each case points fd 2 at a file of its own
 * and reads back what was written (Check runs every case in its own
 * process, so the settings of one never reach another).
 */
#include <check.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/log.c"

static char captured[64 * 1024];

/* fd 2 into a temporary file, until collect(). */
static FILE *capture_file;
static int saved_fd = -1;

static void capture(void) {
  capture_file = tmpfile();
  ck_assert_ptr_nonnull(capture_file);
  fflush(stderr);
  saved_fd = dup(2);
  dup2(fileno(capture_file), 2);
}

static const char *collect(void) {
  fflush(stderr);
  dup2(saved_fd, 2);
  close(saved_fd);
  rewind(capture_file);
  size_t n = fread(captured, 1, sizeof captured - 1, capture_file);
  captured[n] = '\0';
  fclose(capture_file);
  return captured;
}

static void configure(const char *fmt_name, const char *level) {
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_log_configure(fmt_name, level, &st), 0);
}

/* ---- formats ------------------------------------------------------------------------ */

START_TEST(test_text_format) {
  configure("text", "info");
  capture();
  kilnd_log("listening on %s", "127.0.0.1:1");
  kilnd_log_rec r;
  kilnd_log_begin(&r, KILN_LOG_INFO, "request");
  kilnd_log_str(&r, "client", "a b");
  kilnd_log_int(&r, "n", -3);
  kilnd_log_end(&r);
  kilnd_log("warning: careful");
  ck_assert_str_eq(collect(), "kilnd: listening on 127.0.0.1:1\n"
                              "kilnd: request client=\"a b\" n=-3\n"
                              "kilnd: warning: careful\n");
}
END_TEST

START_TEST(test_logfmt_quoting) {
  configure("logfmt", "info");
  capture();
  kilnd_log_rec r;
  kilnd_log_begin(&r, KILN_LOG_INFO, "two words");
  kilnd_log_str(&r, "plain", "abc-1.2:3");
  kilnd_log_str(&r, "empty", "");
  kilnd_log_str(&r, "null", NULL);
  kilnd_log_str(&r, "tricky", "say \"hi\"=\\ok\nnext\x01");
  kilnd_log_ms(&r, "ms", 1.23456);
  kilnd_log_end(&r);
  const char *out = collect();
  ck_assert_msg(strncmp(out, "time=", 5) == 0, "%s", out);
  /* time=YYYY-MM-DDTHH:MM:SS.mmmZ */
  ck_assert_int_eq(out[5 + 4], '-');
  ck_assert_int_eq(out[5 + 10], 'T');
  ck_assert_int_eq(out[5 + 23], 'Z');
  const char *rest = strstr(out, " level=");
  ck_assert_ptr_nonnull(rest);
  ck_assert_str_eq(rest, " level=info msg=\"two words\" plain=abc-1.2:3 empty=\"\" null=\"\" "
                         "tricky=\"say \\\"hi\\\"=\\\\ok\\nnext\\x01\" ms=1.235\n");
}
END_TEST

START_TEST(test_json_escaping) {
  configure("json", "debug");
  capture();
  kilnd_log_rec r;
  kilnd_log_begin(&r, KILN_LOG_DEBUG, "m\"sg");
  kilnd_log_str(&r, "s", "a\"b\\c\nd\te\x7f\xc3\xa9");
  kilnd_log_int(&r, "i", 42);
  kilnd_log_end(&r);
  const char *out = collect();
  ck_assert_msg(strncmp(out, "{\"time\":\"", 9) == 0, "%s", out);
  const char *rest = strstr(out, "\",\"level\"");
  ck_assert_ptr_nonnull(rest);
  ck_assert_str_eq(rest, "\",\"level\":\"debug\",\"msg\":\"m\\\"sg\","
                         "\"s\":\"a\\\"b\\\\c\\nd\\u0009e\\u007f\\u00c3\\u00a9\",\"i\":42}\n");
}
END_TEST

START_TEST(test_levels) {
  configure("logfmt", "warn");
  ck_assert(!kilnd_log_enabled(KILN_LOG_INFO));
  ck_assert(kilnd_log_enabled(KILN_LOG_ERROR));
  capture();
  kilnd_log("an info line");
  kilnd_logl(KILN_LOG_DEBUG, "a debug line");
  kilnd_log("warning: a warning");
  kilnd_logl(KILN_LOG_ERROR, "an error %d", 7);
  const char *out = collect();
  ck_assert_ptr_null(strstr(out, "info line"));
  ck_assert_ptr_null(strstr(out, "debug line"));
  /* "warning: " becomes the level in the structured formats. */
  ck_assert_ptr_nonnull(strstr(out, " level=warn msg=\"a warning\"\n"));
  ck_assert_ptr_nonnull(strstr(out, " level=error msg=\"an error 7\"\n"));
}
END_TEST

START_TEST(test_bad_settings) {
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_log_configure("yaml", "info", &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "log-format");
  ck_assert_ptr_nonnull(strstr(st.msg, "'yaml'"));
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_log_configure("json", "loud", &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "log-level");
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_log_configure(NULL, NULL, &st), KILN_EINVAL);
}
END_TEST

/* A record longer than the line buffer stays one line; JSON keeps the
 * fields that fitted whole and still closes the object. */
START_TEST(test_cut_records) {
  static char big[KILND_LOG_LINE_MAX * 2];
  memset(big, 'x', sizeof big - 1);
  configure("json", "info");
  capture();
  kilnd_log_rec r;
  kilnd_log_begin(&r, KILN_LOG_INFO, "cut");
  kilnd_log_str(&r, "first", "kept");
  kilnd_log_str(&r, "big", big);
  kilnd_log_int(&r, "after", 1);
  kilnd_log_end(&r);
  kilnd_log("next");
  const char *out = collect();
  const char *nl = strchr(out, '\n');
  ck_assert_ptr_nonnull(nl);
  ck_assert_msg(strncmp(nl - 15, "\"first\":\"kept\"}\n", 16) == 0, "%.40s", nl - 30);
  ck_assert_ptr_nonnull(strstr(nl + 1, "\"msg\":\"next\"}\n"));

  configure("logfmt", "info");
  capture();
  kilnd_log_begin(&r, KILN_LOG_INFO, "cut");
  kilnd_log_str(&r, "big", big);
  kilnd_log_end(&r);
  out = collect();
  ck_assert_uint_le(strlen(out), KILND_LOG_LINE_MAX);
  ck_assert_int_eq(out[strlen(out) - 1], '\n');
  ck_assert_ptr_eq(strchr(out, '\n'), out + strlen(out) - 1);
}
END_TEST

/* ---- calls, libraries, ids ---------------------------------------------------------- */

START_TEST(test_call_line) {
  static kilnd srv;
  static const kilnd_method m = {.id = KILND_M_COMPILE, .name = "Compile"};
  static kilnd_call c;
  c.srv = &srv;
  c.method = &m;
  c.code = GRPC_STATUS_NOT_FOUND;
  snprintf(c.client, sizeof c.client, "alice");
  snprintf(c.request_id, sizeof c.request_id, "0123456789abcdef");
  c.log_cache = "redis";
  snprintf(c.log_key, sizeof c.log_key, "%064d", 7);

  configure("text", "info");
  capture();
  kilnd_log_call(&c, 1500000); /* text without --log-requests: nothing */
  ck_assert_str_eq(collect(), "");
  srv.cfg.log_requests = true;
  capture();
  kilnd_log_call(&c, 1500000);
  ck_assert_ptr_nonnull(strstr(collect(), "kilnd: request request_id=0123456789abcdef client=alice "
                                          "method=Compile code=NOT_FOUND duration_ms=1.500 "
                                          "cache=redis key=000"));
  srv.cfg.log_requests = false;
  configure("logfmt", "info");
  c.log_cache = NULL;
  c.log_key[0] = '\0';
  c.method = NULL;
  capture();
  kilnd_log_call(&c, 0);
  ck_assert_ptr_nonnull(strstr(collect(), " msg=request request_id=0123456789abcdef client=alice "
                                          "method=unknown code=NOT_FOUND duration_ms=0.000 "
                                          "cache=none key=\"\"\n"));
  c.method = &m;
  capture();
  kilnd_log_rec r;
  kilnd_log_audit(&r, &c, "evict");
  kilnd_log_int(&r, "evicted", 3);
  kilnd_log_end(&r);
  kilnd_log_audit(&r, NULL, "auth_failure");
  kilnd_log_end(&r);
  const char *out = collect();
  ck_assert_ptr_nonnull(strstr(out, " msg=audit event=evict request_id=0123456789abcdef "
                                    "client=alice method=Compile evicted=3\n"));
  ck_assert_ptr_nonnull(
      strstr(out, " msg=audit event=auth_failure request_id=\"\" client=\"\" method=\"\"\n"));
}
END_TEST

START_TEST(test_code_names) {
  ck_assert_str_eq(kilnd_log_code_name(0), "OK");
  ck_assert_str_eq(kilnd_log_code_name(5), "NOT_FOUND");
  ck_assert_str_eq(kilnd_log_code_name(16), "UNAUTHENTICATED");
  ck_assert_str_eq(kilnd_log_code_name(17), "UNKNOWN");
  ck_assert_str_eq(kilnd_log_code_name(-1), "UNKNOWN");
}
END_TEST

START_TEST(test_library_sink) {
  capture();
  kiln_log(KILN_LOG_WARN, "kiln cache", "before %s", "configure"); /* no sink yet: plain */
  configure("json", "info");
  kiln_log(KILN_LOG_WARN, "kiln cache", "redis %s unreachable", "h:1");
  kiln_log(KILN_LOG_DEBUG, "kiln cache", "dropped");
  const char *out = collect();
  ck_assert_msg(strncmp(out, "kiln cache: before configure\n{", 30) == 0, "%s", out);
  ck_assert_ptr_nonnull(strstr(
      out, "\"level\":\"warn\",\"msg\":\"redis h:1 unreachable\",\"component\":\"kiln cache\"}\n"));
  ck_assert_ptr_null(strstr(out, "dropped"));
  kiln_log_set_sink(NULL);
}
END_TEST

START_TEST(test_grpc_lines) {
  configure("logfmt", "info");
  capture();
  gpr_log_func_args a = {.file = "src/core/tsi/ssl_transport_security.cc",
                         .line = 1501,
                         .severity = GPR_LOG_SEVERITY_ERROR,
                         .message = "Handshake failed with fatal error SSL_ERROR_SSL: peer did not "
                                    "return a certificate."};
  kilnd_log_grpc(&a);
  gpr_log_func_args b = {
      .file = "x/y.cc", .line = 7, .severity = GPR_LOG_SEVERITY_INFO, .message = "plain"};
  kilnd_log_grpc(&b);
  b.severity = GPR_LOG_SEVERITY_DEBUG;
  kilnd_log_grpc(&b); /* below info */
  const char *out = collect();
  ck_assert_ptr_nonnull(strstr(out, " level=info msg=audit event=tls_failure request_id=\"\" "
                                    "client=\"\" method=\"\" reason=\"Handshake failed with fatal "
                                    "error SSL_ERROR_SSL: peer did not return a certificate.\" "
                                    "file=ssl_transport_security.cc line=1501\n"));
  ck_assert_ptr_nonnull(strstr(out, " level=info msg=plain component=grpc file=y.cc line=7\n"));
  const char *first = strstr(out, "msg=plain");
  ck_assert_ptr_null(strstr(first + 1, "msg=plain")); /* the debug one was dropped */
}
END_TEST

START_TEST(test_request_ids) {
  enum { N = 4096 };
  static char ids[N][17];
  for (int i = 0; i < N; i++) {
    kilnd_log_request_id(ids[i]);
    ck_assert_uint_eq(strlen(ids[i]), 16);
    for (int k = 0; k < 16; k++)
      ck_assert_msg(isxdigit((unsigned char)ids[i][k]) && !isupper((unsigned char)ids[i][k]), "%s",
                    ids[i]);
  }
  qsort(ids, N, sizeof ids[0], (int (*)(const void *, const void *))strcmp);
  for (int i = 1; i < N; i++) ck_assert_str_ne(ids[i - 1], ids[i]);
}
END_TEST

static Suite *log_suite(void) {
  Suite *s = suite_create("log");
  TCase *tc = tcase_create("log");
  tcase_add_test(tc, test_text_format);
  tcase_add_test(tc, test_logfmt_quoting);
  tcase_add_test(tc, test_json_escaping);
  tcase_add_test(tc, test_levels);
  tcase_add_test(tc, test_bad_settings);
  tcase_add_test(tc, test_cut_records);
  tcase_add_test(tc, test_call_line);
  tcase_add_test(tc, test_code_names);
  tcase_add_test(tc, test_library_sink);
  tcase_add_test(tc, test_grpc_lines);
  tcase_add_test(tc, test_request_ids);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(log_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
