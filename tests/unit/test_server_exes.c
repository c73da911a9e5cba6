/* Unit tests for kilnd's loaded-executable table (server/executables.c):
 * insert keeps or replaces an entry of the same id, the least recently used
 * entry nobody holds is evicted past the bounds (count and bytes), and drop (CacheEvict)
 * removes only entries no Execute holds, one id or all.
 *
 * Entries here carry neither module nor code: the table never looks inside
 * them. The file is compiled into this test directly, like test_config.
 */
#include <check.h>
#include <stdio.h>

#include "server/executables.c"

static const char *id(int n) {
  static char buf[8][KILND_EXE_ID_LEN + 1];
  char *b = buf[n % 8];
  snprintf(b, sizeof buf[0], "%064x", n);
  return b;
}

static kilnd_exe *entry(int n) {
  kilnd_exe *e = kilnd_exe_create(id(n), KILND_CLASS_INTERP, 1, NULL, NULL, 1);
  ck_assert_ptr_nonnull(e);
  return e;
}

/* Inserts entry n and drops the caller's reference. */
static void put(kilnd_exes *t, int n, bool replace) {
  kilnd_exe *out;
  ck_assert_int_eq(kilnd_exes_insert(t, entry(n), replace, &out, NULL), 0);
  kilnd_exe_unref(out);
}

START_TEST(test_insert_keeps_or_replaces) {
  kilnd_exes *t;
  ck_assert_int_eq(kilnd_exes_create(4, 0, &t, NULL), 0);
  kilnd_exe *first, *second, *third;
  ck_assert_int_eq(kilnd_exes_insert(t, entry(1), false, &first, NULL), 0);
  ck_assert_int_eq(kilnd_exes_insert(t, entry(1), false, &second, NULL), 0);
  ck_assert_ptr_eq(first, second); /* kept: the new one was freed */
  ck_assert_int_eq(atomic_load(&first->refs), 3);
  ck_assert_int_eq(kilnd_exes_insert(t, entry(1), true, &third, NULL), 0);
  ck_assert_ptr_ne(third, first); /* replaced: the old one lives on for its holders */
  ck_assert_int_eq(atomic_load(&first->refs), 2);
  ck_assert_uint_eq(kilnd_exes_count(t), 1);
  kilnd_exe *got;
  ck_assert_int_eq(kilnd_exes_get(t, id(1), &got, NULL), 0);
  ck_assert_ptr_eq(got, third);
  kilnd_exe_unref(got);
  kilnd_exe_unref(first);
  kilnd_exe_unref(second);
  kilnd_exe_unref(third);
  kilnd_exes_destroy(t);
}
END_TEST

START_TEST(test_lru_bound) {
  kilnd_exes *t;
  ck_assert_int_eq(kilnd_exes_create(2, 0, &t, NULL), 0);
  put(t, 1, false);
  put(t, 2, false);
  kilnd_exe *held;
  ck_assert_int_eq(kilnd_exes_get(t, id(1), &held, NULL), 0); /* 1 is now the most recent */
  put(t, 3, false);                                           /* evicts 2 */
  kilnd_exe *got;
  ck_assert_int_eq(kilnd_exes_get(t, id(2), &got, NULL), KILN_ENOTFOUND);
  ck_assert_int_eq(kilnd_exes_get(t, id(3), &got, NULL), 0);
  /* 1 and 3 are both held: nothing can make room. */
  kiln_status st;
  kiln_status_clear(&st);
  kilnd_exe *out;
  ck_assert_int_eq(kilnd_exes_insert(t, entry(4), false, &out, &st), KILN_ELIMIT);
  ck_assert_ptr_null(out);
  ck_assert_str_eq(st.msg, "2 executables are kept and all are in use (max-executables)");
  kilnd_exe_unref(got);
  kilnd_exe_unref(held);
  kilnd_exes_destroy(t);
}
END_TEST

/* Entries of a given size (what kilnd_exe_create measured is replaced). */
static kilnd_exe *sized(int n, uint64_t bytes) {
  kilnd_exe *e = entry(n);
  e->bytes = bytes;
  return e;
}

START_TEST(test_byte_bound) {
  kilnd_exes *t;
  ck_assert_int_eq(kilnd_exes_create(100, 1000, &t, NULL), 0);
  kilnd_exe *out, *held;
  for (int n = 1; n <= 3; n++) {
    ck_assert_int_eq(kilnd_exes_insert(t, sized(n, 300), false, &out, NULL), 0);
    kilnd_exe_unref(out);
  }
  ck_assert_int_eq(kilnd_exes_get(t, id(1), &held, NULL), 0); /* 1 is the most recent, held */
  ck_assert_int_eq(kilnd_exes_insert(t, sized(4, 500), false, &out, NULL), 0); /* 2 and 3 go */
  kilnd_exe_unref(out);
  kilnd_exe *got;
  ck_assert_int_eq(kilnd_exes_get(t, id(2), &got, NULL), KILN_ENOTFOUND);
  ck_assert_int_eq(kilnd_exes_get(t, id(3), &got, NULL), KILN_ENOTFOUND);
  ck_assert_uint_eq(kilnd_exes_count(t), 2);
  kiln_status st;
  kiln_status_clear(&st);
  /* Bigger than the whole table: refused, whatever could be evicted. */
  ck_assert_int_eq(kilnd_exes_insert(t, sized(5, 1001), false, &out, &st), KILN_ELIMIT);
  ck_assert_ptr_null(out);
  ck_assert_str_eq(st.msg, "the executable takes 1001 bytes, more than the whole table may hold "
                           "(1000, executable-table-bytes)");
  /* 4 held too: 800 bytes in use leave no room for 300. */
  ck_assert_int_eq(kilnd_exes_get(t, id(4), &got, NULL), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kilnd_exes_insert(t, sized(6, 300), false, &out, &st), KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "800 bytes of executables are kept and in use; 300 more do not fit in "
                           "1000 (executable-table-bytes)");
  kilnd_exe_unref(got);
  kilnd_exe_unref(held);
  ck_assert_int_eq(kilnd_exes_insert(t, sized(6, 300), false, &out, NULL), 0); /* evicts one */
  kilnd_exe_unref(out);
  ck_assert_uint_eq(kilnd_exes_count(t), 2);
  kilnd_exes_destroy(t);
}
END_TEST

START_TEST(test_drop) {
  kilnd_exes *t;
  ck_assert_int_eq(kilnd_exes_create(8, 0, &t, NULL), 0);
  for (int n = 1; n <= 4; n++) put(t, n, false);
  kilnd_exe *running;
  ck_assert_int_eq(kilnd_exes_get(t, id(2), &running, NULL), 0);
  uint32_t busy = 99;
  ck_assert_uint_eq(kilnd_exes_drop(t, id(1), &busy), 1);
  ck_assert_uint_eq(busy, 0);
  ck_assert_uint_eq(kilnd_exes_drop(t, id(1), &busy), 0); /* already gone */
  ck_assert_uint_eq(kilnd_exes_drop(t, id(2), &busy), 0); /* an Execute holds it */
  ck_assert_uint_eq(busy, 1);
  ck_assert_uint_eq(kilnd_exes_count(t), 3);
  ck_assert_uint_eq(kilnd_exes_drop(t, NULL, &busy), 2); /* all but the running one */
  ck_assert_uint_eq(busy, 1);
  ck_assert_uint_eq(kilnd_exes_count(t), 1);
  kilnd_exe_unref(running);
  ck_assert_uint_eq(kilnd_exes_drop(t, NULL, NULL), 1);
  ck_assert_uint_eq(kilnd_exes_count(t), 0);
  kilnd_exes_destroy(t);
}
END_TEST

int main(void) {
  Suite *s = suite_create("server_exes");
  TCase *tc = tcase_create("server_exes");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_insert_keeps_or_replaces);
  tcase_add_test(tc, test_lru_bound);
  tcase_add_test(tc, test_byte_bound);
  tcase_add_test(tc, test_drop);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
