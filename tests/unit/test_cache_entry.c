/* Tests for cache/entry.c: the signed envelope of a cache entry.
 *
 * A round trip keeps meta and payload exactly; every way an entry can be
 * damaged or misplaced is refused with its own reason (truncated, version,
 * key, mac), the status names the reason, and no payload pointer is handed
 * out for a refused entry. Secrets: generated, and from text with the
 * length limits.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/entry.h"
#include "common/alloc.h"

static kiln_cache_secret secret_a, secret_b;

static void setup(void) {
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_secret_from_string("secret-a-0123456789abcdef", &secret_a, &st), 0);
  ck_assert_int_eq(kiln_cache_secret_from_string("secret-b-0123456789abcdef", &secret_b, &st), 0);
}

static void fill_meta(kiln_cache_meta *m, uint8_t seed) {
  memset(m, 0, sizeof *m);
  for (int i = 0; i < KILN_CACHE_DIGEST_LEN; i++) m->key[i] = (uint8_t)(seed + i);
  for (int p = 0; p < KILN_CACHE_NPARTS; p++)
    for (int i = 0; i < KILN_CACHE_DIGEST_LEN; i++) m->parts[p][i] = (uint8_t)(seed * p + i);
  m->kind = KILN_CACHE_PAYLOAD_CPU_EXE;
  m->compile_ns = 123456789u;
  m->created_unix_ms = 1700000000123u;
  m->peak_bytes = 1u << 20;
}

/* A sealed entry of a 1000-byte payload under secret_a and key seed 7. */
static uint8_t *sealed(size_t *len, kiln_cache_meta *meta) {
  uint8_t payload[1000];
  for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)(i * 13 + 5);
  fill_meta(meta, 7);
  uint8_t *buf = NULL;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_entry_seal(&secret_a, meta, payload, sizeof payload, &buf, len, &st),
                   0);
  ck_assert_uint_eq(*len, sizeof payload + kiln_cache_entry_overhead());
  return buf;
}

/* Opens buf expecting a refusal for reason r: no payload, exact status. */
static void expect_refused(const kiln_cache_secret *sec, const uint8_t *key, const uint8_t *buf,
                           size_t len, kiln_cache_reject r) {
  kiln_status st = {0};
  kiln_cache_meta meta;
  const uint8_t *payload = (const uint8_t *)"sentinel";
  size_t plen = 99;
  kiln_cache_reject why = KILN_CACHE_OK;
  ck_assert_int_eq(kiln_cache_entry_open(sec, key, buf, len, &meta, &payload, &plen, &why, &st),
                   KILN_EINVAL);
  ck_assert_int_eq(why, r);
  ck_assert_ptr_null(payload);
  ck_assert_uint_eq(plen, 0);
  ck_assert_int_eq(st.code, KILN_EINVAL);
  ck_assert_str_eq(st.where, "cache entry");
  char prefix[32];
  snprintf(prefix, sizeof prefix, "%s: entry of %zu bytes ", kiln_cache_reject_name(r), len);
  ck_assert_msg(strncmp(st.msg, prefix, strlen(prefix)) == 0, "message \"%s\"", st.msg);
}

START_TEST(round_trip) {
  kiln_cache_meta meta, got;
  size_t len = 0;
  uint8_t *buf = sealed(&len, &meta);
  kiln_status st = {0};
  const uint8_t *payload = NULL;
  size_t plen = 0;
  kiln_cache_reject why = KILN_CACHE_REJECT_MAC;
  ck_assert_int_eq(
      kiln_cache_entry_open(&secret_a, meta.key, buf, len, &got, &payload, &plen, &why, &st), 0);
  ck_assert_int_eq(why, KILN_CACHE_OK);
  ck_assert_uint_eq(plen, 1000);
  ck_assert_ptr_eq(payload, buf + kiln_cache_entry_overhead() - 32);
  for (size_t i = 0; i < plen; i++) ck_assert_uint_eq(payload[i], (uint8_t)(i * 13 + 5));
  ck_assert_int_eq(memcmp(&got, &meta, sizeof meta), 0);
  kiln_cache_meta peeked;
  ck_assert_int_eq(kiln_cache_entry_peek(buf, len, &peeked), 0);
  ck_assert_int_eq(memcmp(&peeked, &meta, sizeof meta), 0);
  kiln_free(buf);
}
END_TEST

START_TEST(empty_payload) {
  kiln_cache_meta meta;
  fill_meta(&meta, 3);
  uint8_t *buf = NULL;
  size_t len = 0;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_entry_seal(&secret_a, &meta, NULL, 0, &buf, &len, &st), 0);
  ck_assert_uint_eq(len, kiln_cache_entry_overhead());
  ck_assert_uint_eq(kiln_cache_entry_overhead(), 272);
  const uint8_t *payload = NULL;
  size_t plen = 1;
  ck_assert_int_eq(
      kiln_cache_entry_open(&secret_a, meta.key, buf, len, NULL, &payload, &plen, NULL, &st), 0);
  ck_assert_uint_eq(plen, 0);
  kiln_free(buf);
}
END_TEST

START_TEST(flipped_bytes_are_mac) {
  kiln_cache_meta meta;
  size_t len = 0;
  uint8_t *buf = sealed(&len, &meta);
  /* Payload bytes, header fields after the key, the MAC itself. */
  size_t spots[] = {240, 241, 740, 1239, 16 + 32 + 5, 200, 216, 224, len - 32, len - 1};
  for (size_t i = 0; i < sizeof spots / sizeof spots[0]; i++) {
    buf[spots[i]] ^= 0x40;
    expect_refused(&secret_a, meta.key, buf, len, KILN_CACHE_REJECT_MAC);
    buf[spots[i]] ^= 0x40;
  }
  /* The kind field too. */
  buf[12] ^= 1;
  expect_refused(&secret_a, meta.key, buf, len, KILN_CACHE_REJECT_MAC);
  buf[12] ^= 1;
  kiln_free(buf);
}
END_TEST

START_TEST(truncated) {
  kiln_cache_meta meta;
  size_t len = 0;
  uint8_t *buf = sealed(&len, &meta);
  size_t cuts[] = {0, 1, 7, 8, 12, 100, 239, 240, 271, 272, 273, 240 + 500, len - 32, len - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    uint8_t *copy = kiln_malloc(cuts[i] ? cuts[i] : 1);
    memcpy(copy, buf, cuts[i]);
    expect_refused(&secret_a, meta.key, copy, cuts[i], KILN_CACHE_REJECT_TRUNCATED);
    kiln_cache_meta m;
    ck_assert_int_eq(kiln_cache_entry_peek(copy, cuts[i], &m), KILN_EINVAL);
    kiln_free(copy);
  }
  expect_refused(&secret_a, meta.key, NULL, 0, KILN_CACHE_REJECT_TRUNCATED);
  kiln_free(buf);
}
END_TEST

START_TEST(stated_length_lies) {
  kiln_cache_meta meta;
  size_t len = 0;
  uint8_t *buf = sealed(&len, &meta);
  /* A huge stated length must not overflow the bounds check. */
  memset(buf + 232, 0xff, 8);
  expect_refused(&secret_a, meta.key, buf, len, KILN_CACHE_REJECT_TRUNCATED);
  /* A smaller stated length leaves bytes after the MAC: tampered. */
  memset(buf + 232, 0, 8);
  buf[232] = 0xe7; /* 999 */
  buf[233] = 0x03;
  expect_refused(&secret_a, meta.key, buf, len, KILN_CACHE_REJECT_MAC);
  kiln_free(buf);
  /* An appended byte. */
  buf = sealed(&len, &meta);
  uint8_t *longer = kiln_malloc(len + 1);
  memcpy(longer, buf, len);
  longer[len] = 0;
  expect_refused(&secret_a, meta.key, longer, len + 1, KILN_CACHE_REJECT_MAC);
  kiln_free(longer);
  kiln_free(buf);
}
END_TEST

START_TEST(other_version_or_magic) {
  kiln_cache_meta meta;
  size_t len = 0;
  uint8_t *buf = sealed(&len, &meta);
  buf[8] = 2; /* format version 2 */
  expect_refused(&secret_a, meta.key, buf, len, KILN_CACHE_REJECT_VERSION);
  buf[8] = 1;
  buf[0] = 'X';
  expect_refused(&secret_a, meta.key, buf, len, KILN_CACHE_REJECT_VERSION);
  kiln_cache_meta m;
  ck_assert_int_eq(kiln_cache_entry_peek(buf, len, &m), KILN_EINVAL);
  kiln_free(buf);
}
END_TEST

START_TEST(stored_under_another_key) {
  kiln_cache_meta meta;
  size_t len = 0;
  uint8_t *buf = sealed(&len, &meta);
  uint8_t other[KILN_CACHE_DIGEST_LEN];
  memcpy(other, meta.key, sizeof other);
  other[31] ^= 1;
  expect_refused(&secret_a, other, buf, len, KILN_CACHE_REJECT_KEY);
  kiln_free(buf);
}
END_TEST

START_TEST(another_secret) {
  kiln_cache_meta meta;
  size_t len = 0;
  uint8_t *buf = sealed(&len, &meta);
  expect_refused(&secret_b, meta.key, buf, len, KILN_CACHE_REJECT_MAC);
  kiln_free(buf);
}
END_TEST

START_TEST(reject_names) {
  ck_assert_str_eq(kiln_cache_reject_name(KILN_CACHE_REJECT_TRUNCATED), "truncated");
  ck_assert_str_eq(kiln_cache_reject_name(KILN_CACHE_REJECT_VERSION), "version");
  ck_assert_str_eq(kiln_cache_reject_name(KILN_CACHE_REJECT_KEY), "key");
  ck_assert_str_eq(kiln_cache_reject_name(KILN_CACHE_REJECT_MAC), "mac");
  ck_assert_str_eq(kiln_cache_reject_name((kiln_cache_reject)99), "?");
}
END_TEST

START_TEST(secrets) {
  kiln_cache_secret s1, s2;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_secret_generate(&s1, &st), 0);
  ck_assert_int_eq(kiln_cache_secret_generate(&s2, &st), 0);
  ck_assert_uint_eq(s1.len, 32);
  ck_assert_int_ne(memcmp(s1.bytes, s2.bytes, 32), 0);

  ck_assert_int_eq(kiln_cache_secret_from_string("0123456789abcdef", &s1, &st), 0);
  ck_assert_uint_eq(s1.len, 16);
  ck_assert_int_eq(memcmp(s1.bytes, "0123456789abcdef", 16), 0);

  ck_assert_int_eq(kiln_cache_secret_from_string("0123456789abcde", &s1, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "the cache secret has 15 bytes, at least 16 are needed");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_secret_from_string("", &s1, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "the cache secret has 0 bytes, at least 16 are needed");
  kiln_status_clear(&st);
  char big[KILN_CACHE_SECRET_MAX + 2];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  ck_assert_int_eq(kiln_cache_secret_from_string(big, &s1, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "the cache secret has 257 bytes, at most 256 are allowed");
  big[KILN_CACHE_SECRET_MAX] = '\0';
  ck_assert_int_eq(kiln_cache_secret_from_string(big, &s1, NULL), 0);
  ck_assert_uint_eq(s1.len, 256);

  /* A secret that was never set cannot sign. */
  kiln_cache_secret empty;
  memset(&empty, 0, sizeof empty);
  kiln_cache_meta meta;
  fill_meta(&meta, 1);
  uint8_t *buf = (uint8_t *)&meta;
  size_t len = 5;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_entry_seal(&empty, &meta, "x", 1, &buf, &len, &st), KILN_EINVAL);
  ck_assert_ptr_null(buf);
  ck_assert_uint_eq(len, 0);
  ck_assert_str_eq(st.msg, "cannot sign: secret shorter than 16 bytes");
}
END_TEST

static Suite *entry_suite(void) {
  Suite *s = suite_create("cache_entry");
  TCase *tc = tcase_create("entry");
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, round_trip);
  tcase_add_test(tc, empty_payload);
  tcase_add_test(tc, flipped_bytes_are_mac);
  tcase_add_test(tc, truncated);
  tcase_add_test(tc, stated_length_lies);
  tcase_add_test(tc, other_version_or_magic);
  tcase_add_test(tc, stored_under_another_key);
  tcase_add_test(tc, another_secret);
  tcase_add_test(tc, reject_names);
  tcase_add_test(tc, secrets);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(entry_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
