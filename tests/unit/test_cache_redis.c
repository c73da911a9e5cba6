/* Unit tests for the Redis tier (cache/redis.c) against a real redis-server
 * started per test on a free loopback port (tests/support/redis_server.h):
 * URL forms and their messages, binary round trips, TTLs, the cross-server
 * lock, AUTH and SELECT, unix sockets, SCAN listing, and every fault the tier
 * must absorb: a killed server (fast EUNAVAIL, recovery by itself after a
 * restart on the same port), a paused server and a socket that never
 * answers (timeouts, no hang), a full Redis under noeviction (OOM is a
 * fault, the store stays up) and a value of the wrong Redis type.
 *
 * Without redis-server only the tests that need no server run, and the
 * suite says so.
 */
#include <check.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/store.h"
#include "common/alloc.h"
#include "tests/support/redis_server.h"

#define TIMEOUT_MS 200

static const char key_a[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
static const char key_b[] = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
static const char key_c[] = "00000000000000000000000000000000000000000000000000000000000000ff";

static kiln_status st;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static kiln_test_redis *start_redis(const char *const *args) {
  kiln_test_redis *r = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_test_redis_start(args, &r, &st) == 0, "redis-server: %s", st.msg);
  return r;
}

/* A store on url with the test's timeout and the given ttl. */
static kiln_cache_store *open_store(const char *url, uint32_t ttl_s) {
  kiln_cache_redis_config cfg = {.url = url, .db = -1, .ttl_s = ttl_s, .timeout_ms = TIMEOUT_MS};
  kiln_cache_store *s = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_cache_redis_create(&cfg, &s, &st) == 0, "create: %s", st.msg);
  return s;
}

static kiln_cache_store_stats stats_of(kiln_cache_store *s) {
  kiln_cache_store_stats x;
  s->ops->stats(s, &x);
  return x;
}

static int put(kiln_cache_store *s, const char *key, const void *val, size_t len) {
  kiln_status_clear(&st);
  return s->ops->put(s, key, val, len, &st);
}

/* get into a malloc'd buffer; the caller frees *val. */
static int get(kiln_cache_store *s, const char *key, uint8_t **val, size_t *len) {
  kiln_status_clear(&st);
  return s->ops->get(s, key, val, len, &st);
}

static void expect_value(kiln_cache_store *s, const char *key, const void *want, size_t n) {
  uint8_t *val = NULL;
  size_t len = 0;
  ck_assert_msg(get(s, key, &val, &len) == 0, "get: %s", st.msg);
  ck_assert_uint_eq(len, n);
  ck_assert(memcmp(val, want, n) == 0);
  kiln_free(val);
}

static long long raw_integer(kiln_test_redis *r, const char *fmt, const char *arg) {
  redisReply *rep = kiln_test_redis_command(r, fmt, arg);
  ck_assert_ptr_nonnull(rep);
  ck_assert_int_eq(rep->type, REDIS_REPLY_INTEGER);
  long long v = rep->integer;
  freeReplyObject(rep);
  return v;
}

/* ---- URLs (no server needed) ------------------------------------------------ */

static void expect_url_error(const char *url, const char *msg) {
  kiln_cache_redis_config cfg = {.url = url, .db = -1, .timeout_ms = TIMEOUT_MS};
  kiln_cache_store *s = (kiln_cache_store *)&cfg; /* must be reset to NULL */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_redis_create(&cfg, &s, &st), KILN_EINVAL);
  ck_assert_ptr_null(s);
  ck_assert_str_eq(st.msg, msg);
}

START_TEST(test_url_errors) {
  expect_url_error("", "redis url is empty");
  expect_url_error(NULL, "redis url is empty");
  expect_url_error("localhost:abc", "redis url 'localhost:abc': port 'abc' is not a number");
  expect_url_error("localhost:", "redis url 'localhost:': port is empty");
  expect_url_error("localhost:70000",
                   "redis url 'localhost:70000': port '70000' is out of range (1 to 65535)");
  expect_url_error("redis://h:0", "redis url 'redis://h:0': port '0' is out of range (1 to 65535)");
  expect_url_error(":6379", "redis url ':6379': host is empty");
  expect_url_error("redis://", "redis url 'redis://': host is empty");
  expect_url_error("redis://:pw@", "redis url 'redis://:pw@': host is empty");
  expect_url_error("redis://h:1/x", "redis url 'redis://h:1/x': database 'x' is not a number");
  expect_url_error("redis://h:1/99999999999",
                   "redis url 'redis://h:1/99999999999': database '99999999999' is out of range");
  expect_url_error("http://h:1", "redis url 'http://h:1': scheme 'http' is not supported (use "
                                 "redis://, redis-cluster://, redis-sentinel://, unix: or "
                                 "host:port)");
  expect_url_error("rediss://h:1", "redis url 'rediss://h:1': TLS (rediss://) is not supported");
  expect_url_error("unix:", "redis url 'unix:': socket path is empty");
  expect_url_error("unix:?db=1", "redis url 'unix:?db=1': socket path is empty");
  expect_url_error("unix:/tmp/s?db=x",
                   "redis url 'unix:/tmp/s?db=x': database 'x' is not a number");
  expect_url_error(
      "/tmp/s?timeout=1",
      "redis url '/tmp/s?timeout=1': parameter 'timeout=1' is not supported (only db=N)");
  expect_url_error("[::1", "redis url '[::1': missing ']' after the IPv6 address");
  expect_url_error("[::1]x", "redis url '[::1]x': expected ':' after ']'");
  expect_url_error("[]:1", "redis url '[]:1': host is empty");
  expect_url_error("::1:6379",
                   "redis url '::1:6379': an IPv6 address needs brackets, as in [::1]:6379");
  expect_url_error("redis://:%zz@h:1", "redis url 'redis://:%zz@h:1': the credentials hold a "
                                       "malformed %-escape");
  expect_url_error("redis://:pw%4@h:1", "redis url 'redis://:pw%4@h:1': the credentials hold a "
                                        "malformed %-escape");
}
END_TEST

START_TEST(test_config_errors) {
  kiln_cache_store *s = NULL;
  char prefix[300];
  memset(prefix, 'p', sizeof prefix - 1);
  prefix[sizeof prefix - 1] = 0;
  kiln_cache_redis_config cfg = {.url = "127.0.0.1:1", .prefix = prefix};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_redis_create(&cfg, &s, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "redis key prefix is longer than 256 bytes");
  cfg.prefix = NULL;
  cfg.pool = 1000;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_redis_create(&cfg, &s, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "redis pool of 1000 connections is over 256");
  ck_assert_int_eq(kiln_cache_redis_create(NULL, &s, &st), KILN_EINVAL);
}
END_TEST

/* The address a URL names shows in every status's where; a bad key gives
 * one without touching the network. */
static void expect_where(const char *url, const char *where) {
  kiln_cache_store *s = open_store(url, 0);
  uint8_t *val = NULL;
  size_t len = 0;
  ck_assert_int_eq(get(s, "xyz", &val, &len), KILN_EINVAL);
  ck_assert_str_eq(st.where, where);
  kiln_cache_store_destroy(s);
}

START_TEST(test_url_forms) {
  uint16_t port = kiln_test_free_port();
  char url[64], where[64];
  snprintf(url, sizeof url, "127.0.0.1:%u", (unsigned)port);
  snprintf(where, sizeof where, "redis 127.0.0.1:%u", (unsigned)port);
  expect_where(url, where);
  snprintf(url, sizeof url, "redis://:pw@127.0.0.1:%u/3", (unsigned)port);
  expect_where(url, where);
  snprintf(url, sizeof url, "redis://u:p%%40w@127.0.0.1:%u/?db=2", (unsigned)port);
  expect_where(url, where);
  snprintf(url, sizeof url, "[::1]:%u", (unsigned)port);
  snprintf(where, sizeof where, "redis [::1]:%u", (unsigned)port);
  expect_where(url, where);
  expect_where("redis://127.0.0.1", "redis 127.0.0.1:6379");
  expect_where("localhost", "redis localhost:6379");
  expect_where("unix:/nonexistent/kiln.sock?db=3", "redis unix:/nonexistent/kiln.sock");
  expect_where("unix:///nonexistent/kiln.sock", "redis unix:/nonexistent/kiln.sock");
  expect_where("/nonexistent/kiln.sock", "redis unix:/nonexistent/kiln.sock");
}
END_TEST

/* Nothing listens: create succeeds, the store is down, every op fails fast
 * with KILN_EUNAVAIL and a fault, and bad arguments are still EINVAL. */
START_TEST(test_down_at_start) {
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%u", (unsigned)kiln_test_free_port());
  kiln_cache_store *s = open_store(url, 0);
  ck_assert(!stats_of(s).up);
  uint8_t *val = NULL;
  size_t len = 0;
  double t0 = now_ms();
  ck_assert_int_eq(get(s, key_a, &val, &len), KILN_EUNAVAIL);
  ck_assert_double_lt(now_ms() - t0, 2 * TIMEOUT_MS);
  ck_assert_ptr_null(val);
  char want[256];
  snprintf(want, sizeof want,
           "GET kiln:v1:exe:%s: redis is down (connect: Connection refused); reconnecting in "
           "the background",
           key_a);
  ck_assert_str_eq(st.msg, want);
  ck_assert_int_eq(put(s, key_a, "x", 1), KILN_EUNAVAIL);
  bool b = true;
  ck_assert_int_eq(s->ops->try_lock(s, key_a, "t", 100, &b, &st), KILN_EUNAVAIL);
  ck_assert(!b);
  ck_assert_uint_eq(stats_of(s).faults, 3);
  ck_assert_uint_eq(stats_of(s).hits + stats_of(s).misses + stats_of(s).puts, 0);
  kiln_cache_store_destroy(s);
}
END_TEST

START_TEST(test_bad_keys) {
  kiln_cache_store *s = open_store("127.0.0.1:1", 0);
  const char *bad[] = {"0123", "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
                       "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0",
                       "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdeg"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(put(s, bad[i], "x", 1), KILN_EINVAL);
    char want[200];
    snprintf(want, sizeof want, "key '%s' is not 64 lowercase hex digits", bad[i]);
    ck_assert_str_eq(st.msg, want);
  }
  kiln_status_clear(&st);
  ck_assert_int_eq(s->ops->del(s, NULL, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "key '(null)' is not 64 lowercase hex digits");
  bool held;
  kiln_status_clear(&st);
  ck_assert_int_eq(s->ops->try_lock(s, key_a, "", 100, &held, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "lock token must be 1 to 512 bytes");
  kiln_status_clear(&st);
  ck_assert_int_eq(s->ops->try_lock(s, key_a, "t", 0, &held, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "lock ttl is 0 ms");
  /* Refused before a byte is read. */
  static const uint8_t one = 1;
  ck_assert_int_eq(put(s, key_a, &one, ((size_t)512 << 20) + 1), KILN_ELIMIT);
  char want[300];
  snprintf(want, sizeof want,
           "value of 536870913 bytes for kiln:v1:exe:%s is over the limit of 536870912 bytes",
           key_a);
  ck_assert_str_eq(st.msg, want);
  ck_assert_uint_eq(stats_of(s).faults, 0);
  kiln_cache_store_destroy(s);
}
END_TEST

/* ---- against redis-server --------------------------------------------------- */

START_TEST(test_round_trip) {
  kiln_test_redis *r = start_redis(NULL);
  kiln_cache_store *s = open_store(kiln_test_redis_addr(r), 0);
  ck_assert(stats_of(s).up);
  ck_assert_str_eq(s->ops->name, "redis");
  uint8_t small[256];
  for (int i = 0; i < 256; i++) small[i] = (uint8_t)i; /* NULs, CR LF, high bytes */
  size_t big_n = (size_t)5 << 20;
  uint8_t *big = kiln_malloc(big_n);
  for (size_t i = 0; i < big_n; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
  ck_assert_int_eq(put(s, key_a, small, sizeof small), 0);
  ck_assert_int_eq(put(s, key_b, big, big_n), 0);
  ck_assert_int_eq(put(s, key_c, NULL, 0), 0);
  expect_value(s, key_a, small, sizeof small);
  expect_value(s, key_b, big, big_n);
  expect_value(s, key_c, "", 0);
  ck_assert_int_eq(put(s, key_a, "over", 4), 0);
  expect_value(s, key_a, "over", 4);

  kiln_status_clear(&st);
  ck_assert_int_eq(s->ops->del(s, key_b, &st), 0);
  ck_assert_int_eq(s->ops->del(s, key_b, &st), KILN_ENOTFOUND);
  uint8_t *val = (uint8_t *)"sentinel";
  size_t len = 7;
  ck_assert_int_eq(get(s, key_b, &val, &len), KILN_ENOTFOUND);
  ck_assert_ptr_null(val);
  ck_assert_uint_eq(len, 0);
  ck_assert_int_eq(st.code, 0); /* a miss is not an error */

  /* Out of memory for the value: a status, not a crash, and no hit. */
  kiln_alloc_fail_after(1);
  ck_assert_int_eq(get(s, key_a, &val, &len), KILN_ENOMEM);
  kiln_alloc_fail_after(0);
  ck_assert_ptr_null(val);
  char want[160];
  snprintf(want, sizeof want, "GET kiln:v1:exe:%s: out of memory for 4 bytes", key_a);
  ck_assert_str_eq(st.msg, want);

  kiln_cache_store_stats x = stats_of(s);
  ck_assert_uint_eq(x.hits, 4);
  ck_assert_uint_eq(x.misses, 1);
  ck_assert_uint_eq(x.puts, 4);
  ck_assert_uint_eq(x.faults, 0);
  ck_assert(x.up);
  ck_assert_uint_eq(x.bytes + x.entries + x.evictions, 0);
  kiln_free(big);
  kiln_cache_store_destroy(s);
  kiln_test_redis_destroy(r);
}
END_TEST

START_TEST(test_ttl_and_prefix) {
  kiln_test_redis *r = start_redis(NULL);
  kiln_cache_store *s = open_store(kiln_test_redis_addr(r), 100);
  ck_assert_int_eq(put(s, key_a, "v", 1), 0);
  char key[128];
  snprintf(key, sizeof key, "kiln:v1:exe:%s", key_a);
  long long ttl = raw_integer(r, "TTL %s", key);
  ck_assert_int_ge(ttl, 98);
  ck_assert_int_le(ttl, 100);
  kiln_cache_store_destroy(s);

  /* ttl 0: no expiry; a custom prefix (with glob characters, for SCAN). */
  kiln_cache_redis_config cfg = {
      .url = kiln_test_redis_addr(r), .prefix = "t*[1]:", .timeout_ms = TIMEOUT_MS};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_redis_create(&cfg, &s, &st), 0);
  ck_assert_int_eq(put(s, key_b, "w", 1), 0);
  snprintf(key, sizeof key, "t*[1]:exe:%s", key_b);
  ck_assert_int_eq(raw_integer(r, "TTL %s", key), -1);
  kiln_cache_store_destroy(s);
  kiln_test_redis_destroy(r);
}
END_TEST

static int collect(void *ctx, const char *key_hex, const uint8_t *val, size_t len) {
  char *seen = ctx;
  size_t n = strlen(seen);
  snprintf(seen + n, 512 - n, "%.4s=%.*s;", key_hex, (int)len, (const char *)val);
  return 0;
}

static int stop_at_first(void *ctx, const char *key_hex, const uint8_t *val, size_t len) {
  (*(int *)ctx)++;
  return 1;
}

START_TEST(test_list) {
  kiln_test_redis *r = start_redis(NULL);
  kiln_cache_redis_config cfg = {
      .url = kiln_test_redis_addr(r), .prefix = "t*[1]:", .timeout_ms = TIMEOUT_MS};
  kiln_cache_store *s = NULL;
  ck_assert_int_eq(kiln_cache_redis_create(&cfg, &s, &st), 0);
  kiln_cache_store *other = open_store(kiln_test_redis_addr(r), 0);
  ck_assert_int_eq(put(s, key_a, "A", 1), 0);
  ck_assert_int_eq(put(s, key_b, "B", 1), 0);
  ck_assert_int_eq(put(other, key_c, "C", 1), 0); /* another prefix: not listed */
  freeReplyObject(kiln_test_redis_command(r, "SET %s x", "t*[1]:exe:short"));
  freeReplyObject(kiln_test_redis_command(r, "SET %s x",
                                          "t11:exe:"
                                          "0123456789abcdef0123456789"
                                          "abcdef0123456789abcdef0123456789abcdef"));
  char seen[512] = "";
  kiln_status_clear(&st);
  ck_assert_int_eq(s->ops->list(s, collect, seen, &st), 0);
  ck_assert_msg(!strcmp(seen, "0123=A;fedc=B;") || !strcmp(seen, "fedc=B;0123=A;"), "%s", seen);
  int calls = 0;
  ck_assert_int_eq(s->ops->list(s, stop_at_first, &calls, &st), 0);
  ck_assert_int_eq(calls, 1);
  kiln_cache_store_stats x = stats_of(s);
  ck_assert_uint_eq(x.hits + x.misses, 0); /* listing is not a lookup */
  kiln_cache_store_destroy(other);
  kiln_cache_store_destroy(s);
  kiln_test_redis_destroy(r);
}
END_TEST

static bool is_locked(kiln_cache_store *s, const char *key) {
  bool held = false;
  kiln_status_clear(&st);
  ck_assert_int_eq(s->ops->locked(s, key, &held, &st), 0);
  return held;
}

START_TEST(test_lock) {
  kiln_test_redis *r = start_redis(NULL);
  kiln_cache_store *s = open_store(kiln_test_redis_addr(r), 0);
  kiln_cache_store *s2 = open_store(kiln_test_redis_addr(r), 0); /* another server */
  bool got = false;
  ck_assert(!is_locked(s, key_a));
  ck_assert_int_eq(s->ops->try_lock(s, key_a, "token-a", 10000, &got, &st), 0);
  ck_assert(got);
  ck_assert_int_eq(s2->ops->try_lock(s2, key_a, "token-b", 10000, &got, &st), 0);
  ck_assert(!got);
  ck_assert(is_locked(s2, key_a));
  char lock[128];
  snprintf(lock, sizeof lock, "kiln:v1:lock:%s", key_a);
  long long pttl = raw_integer(r, "PTTL %s", lock);
  ck_assert_int_gt(pttl, 9000);
  ck_assert_int_le(pttl, 10000);

  /* The wrong token leaves it; the right one frees it. */
  ck_assert_int_eq(s2->ops->unlock(s2, key_a, "token-b", &st), 0);
  ck_assert(is_locked(s, key_a));
  redisReply *rep = kiln_test_redis_command(r, "GET %s", lock);
  ck_assert_str_eq(rep->str, "token-a");
  freeReplyObject(rep);
  ck_assert_int_eq(s->ops->unlock(s, key_a, "token-a", &st), 0);
  ck_assert(!is_locked(s, key_a));
  ck_assert_int_eq(s->ops->unlock(s, key_a, "token-a", &st), 0); /* already free: fine */

  /* PX expiry frees it. */
  ck_assert_int_eq(s2->ops->try_lock(s2, key_a, "token-b", 100, &got, &st), 0);
  ck_assert(got);
  ck_assert(is_locked(s, key_a));
  usleep(250 * 1000);
  ck_assert(!is_locked(s, key_a));
  ck_assert_int_eq(s->ops->try_lock(s, key_a, "token-a", 1000, &got, &st), 0);
  ck_assert(got);
  /* Locks and values live apart. */
  ck_assert_int_eq(put(s, key_a, "v", 1), 0);
  ck_assert(is_locked(s, key_a));
  ck_assert_uint_eq(stats_of(s).faults + stats_of(s2).faults, 0);
  kiln_cache_store_destroy(s2);
  kiln_cache_store_destroy(s);
  kiln_test_redis_destroy(r);
}
END_TEST

/* What a raw connection sees in db: EXISTS of the value key of hex. */
static long long exists_in_db(kiln_test_redis *r, const char *password, int db, const char *hex) {
  redisContext *c = redisConnect("127.0.0.1", kiln_test_redis_port(r));
  ck_assert(c && !c->err);
  redisReply *rep = redisCommand(c, "AUTH %s", password);
  ck_assert_int_eq(rep->type, REDIS_REPLY_STATUS);
  freeReplyObject(rep);
  rep = redisCommand(c, "SELECT %d", db);
  ck_assert_int_eq(rep->type, REDIS_REPLY_STATUS);
  freeReplyObject(rep);
  rep = redisCommand(c, "EXISTS kiln:v1:exe:%s", hex);
  long long v = rep->integer;
  freeReplyObject(rep);
  redisFree(c);
  return v;
}

START_TEST(test_password_and_db) {
  const char *args[] = {"--requirepass", "s3cr@t", NULL};
  kiln_test_redis *r = start_redis(args);
  unsigned port = kiln_test_redis_port(r);
  char url[128];
  snprintf(url, sizeof url, "redis://:s3cr%%40t@127.0.0.1:%u/3", port);
  kiln_cache_store *s = open_store(url, 0);
  ck_assert(stats_of(s).up);
  ck_assert_int_eq(put(s, key_a, "in3", 3), 0);
  ck_assert_int_eq(exists_in_db(r, "s3cr@t", 3, key_a), 1);
  ck_assert_int_eq(exists_in_db(r, "s3cr@t", 0, key_a), 0);
  kiln_cache_store_destroy(s);

  /* The ACL form user:password, and the config overriding the URL. */
  snprintf(url, sizeof url, "redis://default:s3cr%%40t@127.0.0.1:%u?db=3", port);
  s = open_store(url, 0);
  expect_value(s, key_a, "in3", 3);
  kiln_cache_store_destroy(s);
  snprintf(url, sizeof url, "redis://:wrong@127.0.0.1:%u/1", port);
  kiln_cache_redis_config cfg = {
      .url = url, .password = "s3cr@t", .db = 3, .timeout_ms = TIMEOUT_MS};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_redis_create(&cfg, &s, &st), 0);
  expect_value(s, key_a, "in3", 3);
  kiln_cache_store_destroy(s);

  /* A wrong password is an outage the store reports, not a create error. */
  snprintf(url, sizeof url, "redis://:wrong@127.0.0.1:%u", port);
  s = open_store(url, 0);
  ck_assert(!stats_of(s).up);
  uint8_t *val = NULL;
  size_t len = 0;
  ck_assert_int_eq(get(s, key_a, &val, &len), KILN_EUNAVAIL);
  ck_assert_msg(strstr(st.msg, "AUTH: WRONGPASS") != NULL, "%s", st.msg);
  kiln_cache_store_destroy(s);
  /* No password at all: NOAUTH on the first command after connecting. */
  snprintf(url, sizeof url, "127.0.0.1:%u", port);
  s = open_store(url, 0);
  ck_assert_int_eq(get(s, key_a, &val, &len), KILN_EUNAVAIL);
  ck_assert_msg(strstr(st.msg, "NOAUTH") != NULL, "%s", st.msg);
  kiln_cache_store_destroy(s);
  kiln_test_redis_destroy(r);
}
END_TEST

START_TEST(test_unix_socket) {
  kiln_test_redis *r = start_redis(NULL);
  char url[256];
  snprintf(url, sizeof url, "unix:%s?db=2", kiln_test_redis_socket(r));
  kiln_cache_store *s = open_store(url, 0);
  ck_assert(stats_of(s).up);
  ck_assert_int_eq(put(s, key_a, "u", 1), 0);
  kiln_cache_store_destroy(s);
  s = open_store(kiln_test_redis_socket(r), 0); /* db 0: not there */
  uint8_t *val = NULL;
  size_t len = 0;
  ck_assert_int_eq(get(s, key_a, &val, &len), KILN_ENOTFOUND);
  kiln_cache_store_destroy(s);
  snprintf(url, sizeof url, "unix://%s?db=2", kiln_test_redis_socket(r));
  s = open_store(url, 0);
  expect_value(s, key_a, "u", 1);
  kiln_cache_store_destroy(s);
  kiln_test_redis_destroy(r);
}
END_TEST

/* ---- faults ------------------------------------------------------------------- */

/* Waits up to ms for the store's up flag to become want. */
static bool wait_up(kiln_cache_store *s, bool want, int ms) {
  double end = now_ms() + ms;
  while (now_ms() < end) {
    if (stats_of(s).up == want) return true;
    usleep(10 * 1000);
  }
  return stats_of(s).up == want;
}

/* An op that must fail with KILN_EUNAVAIL within 2 x the timeout. */
static void expect_fast_unavail(kiln_cache_store *s) {
  uint8_t *val = NULL;
  size_t len = 0;
  double t0 = now_ms();
  ck_assert_int_eq(get(s, key_a, &val, &len), KILN_EUNAVAIL);
  double took = now_ms() - t0;
  ck_assert_msg(took < 2 * TIMEOUT_MS, "get took %.0f ms", took);
  ck_assert_ptr_null(val);
}

START_TEST(test_killed_and_restarted) {
  kiln_test_redis *r = start_redis(NULL);
  kiln_cache_store *s = open_store(kiln_test_redis_addr(r), 0);
  ck_assert_int_eq(put(s, key_a, "v", 1), 0);
  kiln_test_redis_kill(r);

  expect_fast_unavail(s); /* finds the pooled connection dead */
  char want[160];
  snprintf(want, sizeof want, "redis %s", kiln_test_redis_addr(r));
  ck_assert_str_eq(st.where, want);
  ck_assert(!stats_of(s).up);
  for (int i = 0; i < 5; i++) expect_fast_unavail(s); /* down: no network at all */
  ck_assert_msg(strstr(st.msg, "redis is down (") != NULL, "%s", st.msg);
  ck_assert_int_eq(put(s, key_a, "v", 1), KILN_EUNAVAIL);
  ck_assert_uint_eq(stats_of(s).faults, 7);

  /* Comes back by itself, on the same store, without any request. */
  ck_assert_int_eq(kiln_test_redis_restart(r, &st), 0);
  double t0 = now_ms();
  ck_assert_msg(wait_up(s, true, 2500), "not up %.0f ms after the restart", now_ms() - t0);
  uint8_t *val = NULL;
  size_t len = 0;
  ck_assert_int_eq(get(s, key_a, &val, &len), KILN_ENOTFOUND); /* no persistence */
  ck_assert_int_eq(put(s, key_a, "w", 1), 0);
  expect_value(s, key_a, "w", 1);
  ck_assert_uint_eq(stats_of(s).faults, 7);

  /* A clean shutdown (SIGTERM) is an outage too. */
  kiln_test_redis_stop(r);
  expect_fast_unavail(s);
  ck_assert_int_eq(kiln_test_redis_restart(r, &st), 0);
  ck_assert(wait_up(s, true, 2500));
  kiln_cache_store_destroy(s);
  kiln_test_redis_destroy(r);
}
END_TEST

START_TEST(test_paused_server) {
  kiln_test_redis *r = start_redis(NULL);
  kiln_cache_store *s = open_store(kiln_test_redis_addr(r), 0);
  ck_assert_int_eq(put(s, key_a, "v", 1), 0);
  kiln_test_redis_pause(r);
  double t0 = now_ms();
  ck_assert_int_eq(put(s, key_b, "v", 1), KILN_EUNAVAIL);
  double took = now_ms() - t0;
  ck_assert_msg(took >= TIMEOUT_MS * 0.9 && took < 2 * TIMEOUT_MS, "put took %.0f ms", took);
  char want[200];
  snprintf(want, sizeof want, "SET kiln:v1:exe:%s: no answer within 200 ms", key_b);
  ck_assert_str_eq(st.msg, want);
  for (int i = 0; i < 3; i++) expect_fast_unavail(s);
  kiln_test_redis_resume(r);
  ck_assert(wait_up(s, true, 2500));
  expect_value(s, key_a, "v", 1);
  kiln_cache_store_destroy(s);
  kiln_test_redis_destroy(r);
}
END_TEST

/* Connects complete in the kernel; nothing ever answers. */
START_TEST(test_silent_listener) {
  uint16_t port = 0;
  int fd = kiln_test_silent_listener(&port);
  ck_assert_int_ge(fd, 0);
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%u", (unsigned)port);
  double t0 = now_ms();
  kiln_cache_store *s = open_store(url, 0);
  double took = now_ms() - t0;
  ck_assert_msg(took < 2 * TIMEOUT_MS, "create took %.0f ms", took);
  ck_assert(!stats_of(s).up);
  for (int i = 0; i < 3; i++) expect_fast_unavail(s);
  ck_assert_msg(strstr(st.msg, "(PING: no answer within 200 ms)") != NULL, "%s", st.msg);
  usleep(300 * 1000); /* let the reconnect thread get stuck in a try */
  t0 = now_ms();
  kiln_cache_store_destroy(s);
  took = now_ms() - t0;
  ck_assert_msg(took < 3 * TIMEOUT_MS, "destroy took %.0f ms", took);
  close(fd);
}
END_TEST

START_TEST(test_out_of_memory) {
  const char *args[] = {"--maxmemory-policy", "noeviction", NULL};
  kiln_test_redis *r = start_redis(args);
  kiln_cache_store *s = open_store(kiln_test_redis_addr(r), 0);
  ck_assert_int_eq(put(s, key_a, "small", 5), 0);
  redisReply *rep = kiln_test_redis_command(r, "CONFIG SET maxmemory %s", "1mb");
  ck_assert_int_eq(rep->type, REDIS_REPLY_STATUS);
  freeReplyObject(rep);

  size_t n = (size_t)2 << 20;
  uint8_t *big = kiln_calloc(1, n);
  ck_assert_int_eq(put(s, key_b, big, n), KILN_EUNAVAIL);
  char want[300];
  snprintf(want, sizeof want,
           "SET kiln:v1:exe:%s: OOM command not allowed when used memory > 'maxmemory'.", key_b);
  ck_assert_str_eq(st.msg, want);
  kiln_cache_store_stats x = stats_of(s);
  ck_assert_uint_eq(x.faults, 1);
  ck_assert_uint_eq(x.puts, 1);
  ck_assert(x.up); /* a full Redis still answers */
  expect_value(s, key_a, "small", 5);
  uint8_t *val = NULL;
  size_t len = 0;
  ck_assert_int_eq(get(s, key_b, &val, &len), KILN_ENOTFOUND);
  ck_assert_int_eq(put(s, key_b, big, n), KILN_EUNAVAIL);
  ck_assert_uint_eq(stats_of(s).faults, 2);
  ck_assert(stats_of(s).up);
  kiln_free(big);
  kiln_cache_store_destroy(s);
  kiln_test_redis_destroy(r);
}
END_TEST

START_TEST(test_wrong_type) {
  kiln_test_redis *r = start_redis(NULL);
  kiln_cache_store *s = open_store(kiln_test_redis_addr(r), 0);
  char key[128];
  snprintf(key, sizeof key, "kiln:v1:exe:%s", key_a);
  freeReplyObject(kiln_test_redis_command(r, "RPUSH %s x", key));
  uint8_t *val = NULL;
  size_t len = 0;
  ck_assert_int_eq(get(s, key_a, &val, &len), KILN_EUNAVAIL);
  ck_assert_ptr_null(val);
  char want[300];
  snprintf(want, sizeof want,
           "GET %s: WRONGTYPE Operation against a key holding the wrong kind of value", key);
  ck_assert_str_eq(st.msg, want);
  ck_assert(stats_of(s).up);
  ck_assert_uint_eq(stats_of(s).faults, 1);
  /* A lock key holding a hash: the lock ops fail cleanly too. */
  snprintf(key, sizeof key, "kiln:v1:lock:%s", key_b);
  freeReplyObject(kiln_test_redis_command(r, "HSET %s f v", key));
  kiln_status_clear(&st);
  ck_assert_int_eq(s->ops->unlock(s, key_b, "t", &st), KILN_EUNAVAIL);
  ck_assert_msg(strstr(st.msg, "WRONGTYPE") != NULL, "%s", st.msg);
  /* SET replaces any type: the next put heals the entry. */
  ck_assert_int_eq(put(s, key_a, "ok", 2), 0);
  expect_value(s, key_a, "ok", 2);
  kiln_cache_store_destroy(s);
  kiln_test_redis_destroy(r);
}
END_TEST

typedef struct worker {
  kiln_cache_store *s;
  int id, failures;
} worker;

static void *hammer(void *arg) {
  worker *w = arg;
  char key[65];
  for (int i = 0; i < 100; i++) {
    snprintf(key, sizeof key, "%064x", (unsigned)(w->id * 1000 + i % 7));
    char val[32];
    int n = snprintf(val, sizeof val, "v%d", w->id);
    kiln_status wst = {0};
    if (w->s->ops->put(w->s, key, (const uint8_t *)val, (size_t)n, &wst) != 0) w->failures++;
    uint8_t *got = NULL;
    size_t len = 0;
    if (w->s->ops->get(w->s, key, &got, &len, &wst) != 0 || len != (size_t)n ||
        memcmp(got, val, len) != 0)
      w->failures++;
    kiln_free(got);
  }
  return NULL;
}

START_TEST(test_threads_share_a_small_pool) {
  kiln_test_redis *r = start_redis(NULL);
  kiln_cache_redis_config cfg = {.url = kiln_test_redis_addr(r), .pool = 2, .timeout_ms = 2000};
  kiln_cache_store *s = NULL;
  ck_assert_int_eq(kiln_cache_redis_create(&cfg, &s, &st), 0);
  worker w[6];
  pthread_t t[6];
  for (int i = 0; i < 6; i++) {
    w[i] = (worker){s, i, 0};
    pthread_create(&t[i], NULL, hammer, &w[i]);
  }
  for (int i = 0; i < 6; i++) {
    pthread_join(t[i], NULL);
    ck_assert_int_eq(w[i].failures, 0);
  }
  ck_assert_uint_eq(stats_of(s).puts, 600);
  ck_assert_uint_eq(stats_of(s).hits, 600);
  redisReply *rep = kiln_test_redis_command(r, "CLIENT LIST");
  int clients = 0;
  for (const char *p = rep->str; (p = strstr(p, "cmd=")); p++) clients++;
  freeReplyObject(rep);
  ck_assert_int_le(clients, 3); /* the pool's two and CLIENT LIST's own */
  kiln_cache_store_destroy(s);
  kiln_test_redis_destroy(r);
}
END_TEST

int main(void) {
  Suite *su = suite_create("cache_redis");
  TCase *tc = tcase_create("offline");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_url_errors);
  tcase_add_test(tc, test_config_errors);
  tcase_add_test(tc, test_url_forms);
  tcase_add_test(tc, test_down_at_start);
  tcase_add_test(tc, test_bad_keys);
  tcase_add_test(tc, test_silent_listener);
  suite_add_tcase(su, tc);
  const char *why = NULL;
  if (kiln_test_redis_available(&why)) {
    TCase *tr = tcase_create("redis-server");
    tcase_set_timeout(tr, 120);
    tcase_add_test(tr, test_round_trip);
    tcase_add_test(tr, test_ttl_and_prefix);
    tcase_add_test(tr, test_list);
    tcase_add_test(tr, test_lock);
    tcase_add_test(tr, test_password_and_db);
    tcase_add_test(tr, test_unix_socket);
    tcase_add_test(tr, test_killed_and_restarted);
    tcase_add_test(tr, test_paused_server);
    tcase_add_test(tr, test_out_of_memory);
    tcase_add_test(tr, test_wrong_type);
    tcase_add_test(tr, test_threads_share_a_small_pool);
    suite_add_tcase(su, tr);
  } else {
    printf("cache_redis: skipping the tests that need redis-server: %s\n", why);
  }
  SRunner *sr = srunner_create(su);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
