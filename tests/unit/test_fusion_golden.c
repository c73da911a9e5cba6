/* Golden tests of the fusion, layout and schedule passes.
 *
 * Each file under tests/golden/passes/<pass>/ is an input module followed
 * by a trailing EXPECTED comment holding the canonical text after running
 * that one pass (on the default "cpu" target). Every case also checks that
 * the input and the output verify, and that the interpreter gives
 * bit-identical results on both for random arguments. Set
 * KILN_GOLDEN_SHOW=1 to print the actual text of failing cases, or
 * KILN_GOLDEN_UPDATE=1 to rewrite the EXPECTED blocks from the actual text
 * (then read the diff: the update is a proposal, not a verdict).
 */
#include <dirent.h>

#include "test_fusion_harness.h"

#define MAX_FILES 256

typedef struct golden_case {
  char *path;
  const char *pass; /* directory name = pass name */
} golden_case;

static golden_case cases[MAX_FILES];
static int ncases;

static kiln_pass_fn pass_fn(const char *name) {
  if (strcmp(name, "fusion") == 0) return kiln_pass_fusion;
  if (strcmp(name, "layout") == 0) return kiln_pass_layout;
  if (strcmp(name, "schedule") == 0) return kiln_pass_schedule;
  return NULL;
}

static int cmp_case(const void *a, const void *b) {
  return strcmp(((const golden_case *)a)->path, ((const golden_case *)b)->path);
}

static void list_dir(const char *pass) {
  char dir[2048];
  snprintf(dir, sizeof dir, "%s/tests/golden/passes/%s", KILN_SOURCE_DIR, pass);
  DIR *d = opendir(dir);
  if (d == NULL) return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL && ncases < MAX_FILES) {
    size_t l = strlen(de->d_name);
    if (l > 4 && strcmp(de->d_name + l - 4, ".hlo") == 0) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
      cases[ncases].path = strdup(path);
      cases[ncases].pass = pass;
      ncases++;
    }
  }
  closedir(d);
}

static void update_expected(const char *path, const char *text, size_t head, const char *got) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot write %s", path);
  fwrite(text, 1, head, f);
  fprintf(f, "/* EXPECTED\n%s*/\n", got);
  fclose(f);
}

/* First differing line, for readable failures. */
static void assert_same_text(const char *file, const char *want, const char *got) {
  if (strcmp(want, got) == 0) return;
  if (getenv("KILN_GOLDEN_SHOW")) fprintf(stderr, "==== %s actual:\n%s====\n", file, got);
  int line = 1;
  const char *a = want, *b = got, *la = want, *lb = got;
  while (*a && *a == *b) {
    if (*a == '\n') {
      line++;
      la = a + 1;
      lb = b + 1;
    }
    a++;
    b++;
  }
  const char *ea = strchr(la, '\n'), *eb = strchr(lb, '\n');
  int na = ea ? (int)(ea - la) : (int)strlen(la), nb = eb ? (int)(eb - lb) : (int)strlen(lb);
  ck_abort_msg("%s differs at line %d:\n  want: %.*s\n  got:  %.*s", file, line, na, la, nb, lb);
}

/* The interpreter's results on m0 and m1 are identical for two seeds. */
static void assert_same_results(const char *file, const kiln_module *m0, const kiln_module *m1) {
  for (uint64_t seed = 1; seed <= 2; seed++) {
    uint32_t n = 0;
    kiln_literal **args = fh_args(m0, seed, &n);
    if (args == NULL) return;
    int rc0, rc1;
    kiln_status st0, st1;
    kiln_literal *r0 = fh_interp(m0, args, n, &rc0, &st0);
    kiln_literal *r1 = fh_interp(m1, args, n, &rc1, &st1);
    ck_assert_msg(rc0 == rc1, "%s: interpreter rc %d before, %d after (%s / %s)", file, rc0, rc1,
                  st0.msg, st1.msg);
    if (r0 && r1 && !kiln_literal_equal(r0, r1)) {
      char *t0 = fh_lit_text(r0), *t1 = fh_lit_text(r1);
      ck_abort_msg("%s: results differ (seed %u):\n before: %s\n after:  %s", file, (unsigned)seed,
                   t0, t1);
    }
    kiln_literal_destroy(r0);
    kiln_literal_destroy(r1);
    fh_free_args(args, n);
  }
}

START_TEST(test_golden) {
  const golden_case *gc = &cases[_i];
  size_t len = 0;
  char *text = fh_read_file(gc->path, &len);
  ck_assert_msg(text != NULL, "cannot read %s", gc->path);
  const char *tag = "/* EXPECTED\n";
  char *exp = strstr(text, tag);
  ck_assert_msg(exp != NULL, "%s has no EXPECTED block", gc->path);
  char *want = exp + strlen(tag);
  char *end = strstr(want, "*/");
  ck_assert_msg(end != NULL, "%s: EXPECTED block is not closed", gc->path);
  *end = '\0';
  kiln_module *m0 = fh_parse(text, (size_t)(exp - text), gc->path);
  fh_verify(m0, gc->path);
  kiln_module *m = NULL;
  ck_assert_int_eq(kiln_module_clone(m0, &m), 0);
  fh_run_pass(m, pass_fn(gc->pass), gc->pass, NULL, 2);
  char where[4200];
  snprintf(where, sizeof where, "%s (after %s)", gc->path, gc->pass);
  fh_verify(m, where);
  char *got = kiln_module_print(m, NULL);
  ck_assert_ptr_nonnull(got);
  if (getenv("KILN_GOLDEN_UPDATE") && strcmp(want, got) != 0)
    update_expected(gc->path, text, (size_t)(exp - text), got);
  else
    assert_same_text(gc->path, want, got);
  /* The expected text is itself a valid module that prints back unchanged. */
  kiln_module *m2 = fh_parse(got, strlen(got), where);
  fh_verify(m2, where);
  char *again = kiln_module_print(m2, NULL);
  assert_same_text(where, got, again);
  assert_same_results(gc->path, m0, m);
  kiln_free(again);
  kiln_free(got);
  kiln_module_destroy(m2);
  kiln_module_destroy(m);
  kiln_module_destroy(m0);
  free(text);
}
END_TEST

START_TEST(test_have_cases) {
  /* At least five cases per pass. */
  int per[3] = {0, 0, 0};
  for (int i = 0; i < ncases; i++) {
    per[0] += strcmp(cases[i].pass, "fusion") == 0;
    per[1] += strcmp(cases[i].pass, "layout") == 0;
    per[2] += strcmp(cases[i].pass, "schedule") == 0;
  }
  ck_assert_int_ge(per[0], 5);
  ck_assert_int_ge(per[1], 5);
  ck_assert_int_ge(per[2], 5);
}
END_TEST

int main(void) {
  list_dir("fusion");
  list_dir("layout");
  list_dir("schedule");
  qsort(cases, (size_t)ncases, sizeof *cases, cmp_case);
  Suite *s = suite_create("fusion_golden");
  TCase *tc = tcase_create("golden");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_have_cases);
  tcase_add_loop_test(tc, test_golden, 0, ncases);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  for (int i = 0; i < ncases; i++) free(cases[i].path);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
