/* Cache export files (cache/bundle.c): entries exported from one cache
 * import into another with the same secret and are found there with their
 * payloads; every local entry is exported when no key is named; a file
 * changed in any byte, cut, extended, or signed with another secret is
 * refused as a whole (nothing stored) with a message saying so; unknown
 * keys are NOTFOUND naming the key. */
#include <check.h>
#include <string.h>

#include "cache/cache.h"
#include "common/alloc.h"

#define SECRET "0123456789abcdef0123456789abcdef"

static kiln_cache *new_cache(const char *secret) {
  kiln_cache_config cfg;
  kiln_cache_config_init(&cfg);
  cfg.memory_bytes = 1 << 20;
  cfg.secret = secret;
  kiln_cache *c = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_cache_create(&cfg, &c, &st) == 0, "create: %s", st.msg);
  return c;
}

static void put_entry(kiln_cache *c, uint8_t tag, const char *payload, char hex[65]) {
  kiln_cache_meta m;
  memset(&m, 0, sizeof m);
  memset(m.key, tag, sizeof m.key);
  m.kind = KILN_CACHE_PAYLOAD_CPU_EXE;
  m.compile_ns = 1000000;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_cache_put(c, &m, payload, strlen(payload), &st) == 0, "%s", st.msg);
  kiln_cache_to_hex(m.key, sizeof m.key, hex);
}

static bool holds(kiln_cache *c, const char *hex, const char *payload) {
  kiln_cache_key k;
  memset(&k, 0, sizeof k);
  kiln_cache_from_hex(hex, k.digest, sizeof k.digest);
  memcpy(k.hex, hex, 65);
  kiln_cache_result r;
  memset(&r, 0, sizeof r);
  if (kiln_cache_get(c, &k, &r, NULL) != 0) return false;
  bool same = r.len == strlen(payload) && memcmp(r.payload, payload, r.len) == 0;
  kiln_free(r.payload);
  return same;
}

START_TEST(test_roundtrip) {
  kiln_cache *a = new_cache(SECRET), *b = new_cache(SECRET);
  char k1[65], k2[65];
  put_entry(a, 0x11, "first executable", k1);
  put_entry(a, 0x22, "second", k2);
  uint8_t *file;
  size_t len;
  uint32_t n, got;
  kiln_status st;
  kiln_status_clear(&st);
  const char *keys[] = {k2};
  ck_assert_int_eq(kiln_cache_export(a, keys, 1, &file, &len, &n, &st), 0);
  ck_assert_uint_eq(n, 1);
  ck_assert_int_eq(kiln_cache_import(b, file, len, &got, &st), 0);
  ck_assert_uint_eq(got, 1);
  ck_assert(holds(b, k2, "second"));
  ck_assert(!holds(b, k1, "first executable"));
  kiln_free(file);
  /* every entry */
  ck_assert_int_eq(kiln_cache_export(a, NULL, 0, &file, &len, &n, &st), 0);
  ck_assert_uint_eq(n, 2);
  ck_assert_int_eq(kiln_cache_import(b, file, len, &got, &st), 0);
  ck_assert_uint_eq(got, 2);
  ck_assert(holds(b, k1, "first executable"));
  kiln_free(file);
  /* an unknown key */
  char k3[65];
  memset(k3, 'e', 64);
  k3[64] = 0;
  const char *bad[] = {k3};
  ck_assert_int_eq(kiln_cache_export(a, bad, 1, &file, &len, &n, &st), KILN_ENOTFOUND);
  ck_assert_str_eq(st.where, k3);
  kiln_cache_destroy(a);
  kiln_cache_destroy(b);
}
END_TEST

START_TEST(test_tampered_refused) {
  kiln_cache *a = new_cache(SECRET), *b = new_cache(SECRET);
  kiln_cache *other = new_cache("another secret, not the same one");
  char k1[65];
  put_entry(a, 0x33, "payload bytes", k1);
  uint8_t *file;
  size_t len;
  uint32_t n, got;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_export(a, NULL, 0, &file, &len, &n, &st), 0);
  /* every byte flipped in turn */
  for (size_t i = 0; i < len; i++) {
    file[i] ^= 0x40;
    kiln_status_clear(&st);
    ck_assert_msg(kiln_cache_import(b, file, len, &got, &st) == KILN_EINVAL, "byte %zu", i);
    ck_assert_uint_eq(got, 0);
    file[i] ^= 0x40;
  }
  ck_assert(!holds(b, k1, "payload bytes"));
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_import(b, file, len - 1, &got, &st), KILN_EINVAL);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_import(b, file, 10, &got, &st), KILN_EINVAL);
  ck_assert_ptr_nonnull(strstr(st.msg, "not a kiln cache export"));
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_import(other, file, len, &got, &st), KILN_EINVAL);
  ck_assert_ptr_nonnull(strstr(st.msg, "another cache secret"));
  ck_assert_int_eq(kiln_cache_import(b, file, len, &got, &st), 0);
  ck_assert(holds(b, k1, "payload bytes"));
  kiln_free(file);
  kiln_cache_destroy(a);
  kiln_cache_destroy(b);
  kiln_cache_destroy(other);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cache_bundle");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_roundtrip);
  tcase_add_test(tc, test_tampered_refused);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
