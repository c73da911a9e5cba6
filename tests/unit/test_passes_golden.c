/* Golden tests of the simplification passes: each file under
 * tests/golden/passes/<pass>/ holds an input module and, in a trailing
 * EXPECTED comment, the canonical text after running <pass> and then DCE
 * (a first line "// PASSES: a b c" names another sequence). The result must
 * match exactly and verify; running the sequence again must change nothing
 * (the passes reach a fixed point in one run).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/pass.h"
#include "tests/support/golden.h"

static const char *const pass_dirs[] = {"unroll", "inline",     "algsimp",   "constfold",
                                        "cse",    "while_licm", "scan_dots", "scatter_merge"};
#define NDIRS (sizeof pass_dirs / sizeof pass_dirs[0])

static char **files;
static const char **file_pass;
static int nfiles;

static kiln_module *parse_or_fail(const char *text, size_t len, const char *file) {
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_module_parse_text(text, len, file, NULL, &m, &st);
  ck_assert_msg(rc == 0, "%s: parse: %s: %s", file, st.where, st.msg);
  rc = kiln_module_verify(m, NULL, &st);
  ck_assert_msg(rc == 0, "%s: input does not verify: %s: %s", file, st.where, st.msg);
  return m;
}

/* Runs the named passes in order, verifying after each. */
static void run_passes(kiln_module *m, const char *seq, const char *file) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", seq);
  for (char *save = NULL, *name = strtok_r(buf, " ,\n", &save); name;
       name = strtok_r(NULL, " ,\n", &save)) {
    const kiln_pass *p = kiln_pipeline_find(name);
    ck_assert_msg(p != NULL, "%s: no pass %s", file, name);
    kiln_status st;
    kiln_status_clear(&st);
    kiln_arena *scratch = kiln_arena_create();
    kiln_pass_ctx ctx = {kiln_target_default(), scratch, &st, 2, 0, NULL};
    int rc = p->run(m, &ctx);
    kiln_arena_destroy(scratch);
    ck_assert_msg(rc == 0, "%s: pass %s failed: %s: %s", file, name, st.where, st.msg);
    rc = kiln_module_verify(m, NULL, &st);
    ck_assert_msg(rc == 0, "%s: after %s: %s: %s", file, name, st.where, st.msg);
  }
}

/* The pass sequence a file asks for. */
static void sequence(const char *text, const char *pass, char *out, size_t size) {
  const char *tag = "// PASSES:";
  if (strncmp(text, tag, strlen(tag)) == 0) {
    const char *b = text + strlen(tag), *e = strchr(b, '\n');
    snprintf(out, size, "%.*s", e ? (int)(e - b) : (int)strlen(b), b);
  } else {
    snprintf(out, size, "%s dce", pass);
  }
}

START_TEST(test_golden) {
  const char *file = files[_i];
  size_t len;
  char *text = kiln_golden_read(file, &len);
  ck_assert_msg(text != NULL, "cannot read %s", file);
  char *want = kiln_golden_expected(text);
  ck_assert_msg(want != NULL, "%s has no closed EXPECTED block", file);
  char seq[256];
  sequence(text, file_pass[_i], seq, sizeof seq);
  kiln_module *m = parse_or_fail(text, len, file);
  run_passes(m, seq, file);
  char *got = kiln_module_print(m, NULL);
  ck_assert_ptr_nonnull(got);
  char *diff = kiln_golden_diff(want, got);
  if (diff) {
    fprintf(stderr, "---- %s: actual text ----\n%s----\n", file, got);
    ck_abort_msg("%s: %s", file, diff);
  }
  run_passes(m, seq, file);
  char *again = kiln_module_print(m, NULL);
  diff = kiln_golden_diff(got, again);
  ck_assert_msg(diff == NULL, "%s: a second run changed the module: %s", file, diff);
  kiln_free(again);
  kiln_free(got);
  kiln_module_destroy(m);
  free(want);
  free(text);
}
END_TEST

/* Each pass has its golden files, at least five. */
START_TEST(test_golden_counts) {
  for (size_t d = 0; d < NDIRS; d++) {
    int n = 0;
    for (int i = 0; i < nfiles; i++) n += strcmp(file_pass[i], pass_dirs[d]) == 0;
    ck_assert_msg(n >= 5, "%s has %d golden files", pass_dirs[d], n);
    ck_assert_ptr_nonnull(kiln_pipeline_find(pass_dirs[d]));
  }
}
END_TEST

static void find_files(void) {
  for (size_t d = 0; d < NDIRS; d++) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/golden/passes/%s", KILN_SOURCE_DIR, pass_dirs[d]);
    char **list = NULL;
    int n = kiln_golden_list(dir, &list);
    for (int i = 0; i < n; i++) {
      files = realloc(files, (size_t)(nfiles + 1) * sizeof *files);
      file_pass = realloc(file_pass, (size_t)(nfiles + 1) * sizeof *file_pass);
      files[nfiles] = strdup(list[i]);
      file_pass[nfiles++] = pass_dirs[d];
    }
    if (n > 0) kiln_golden_free_list(list, n);
  }
}

int main(void) {
  find_files();
  Suite *s = suite_create("passes_golden");
  TCase *tc = tcase_create("golden");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_golden, 0, nfiles);
  tcase_add_test(tc, test_golden_counts);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  for (int i = 0; i < nfiles; i++) free(files[i]);
  free(files);
  free(file_pass);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
