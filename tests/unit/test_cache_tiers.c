/* Tests for the cache tiers (cache/memory.c, cache/disk.c) and the tiered
 * cache on top of them (cache/tiered.c, cache/flight.c).
 *
 * Stores: LRU order and the byte bound in memory; on disk, atomic writes
 * (a leftover temporary file is ignored and removed at reopen), entries
 * surviving a reopen, the bound under a flood, recency kept across a
 * reopen, two stores sharing one directory, keys that are not hex refused.
 * The tiered cache: promotion, damaged and foreign entries refused,
 * counted and removed, single flight in one process (one build for 32
 * callers, failed builds, deadlines, fast builds), REFRESH and BYPASS,
 * list and evict, the secret file. With a real redis-server (skipped when
 * none is installed): two caches as two servers sharing Redis, single
 * flight across them, and Redis dying under a cache.
 *
 * Builds synchronise on the cache's own counters (waiting until every
 * caller is parked on the flight) rather than on sleeps, so the exact
 * counts asserted here hold on a loaded machine.
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/store.h"
#include "common/alloc.h"
#include "tests/support/redis_server.h"

#define TEST_SECRET "tiers-test-secret-0123456789"

/* ---- helpers ----------------------------------------------------------- */

static char tmp_root[64];

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

static void make_tmp(void) {
  snprintf(tmp_root, sizeof tmp_root, "/tmp/kiln-tiers-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmp_root));
}

static void remove_tmp(void) {
  if (tmp_root[0]) nftw(tmp_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void sub_path(char *out, size_t size, const char *name) {
  snprintf(out, size, "%s/%s", tmp_root, name);
}

static void hex_key(int i, char out[65]) {
  uint8_t d[32];
  kiln_cache_sha256(&i, sizeof i, d);
  kiln_cache_to_hex(d, 32, out);
}

static kiln_cache_key make_key(int i) {
  kiln_cache_key k;
  memset(&k, 0, sizeof k);
  for (int p = 0; p < KILN_CACHE_NPARTS; p++)
    for (int j = 0; j < KILN_CACHE_DIGEST_LEN; j++) k.parts[p][j] = (uint8_t)(i * 7 + p * 3 + j);
  kiln_cache_key_from_parts(&k);
  return k;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

static void put_bytes(kiln_cache_store *s, const char *key, uint8_t fill, size_t len) {
  uint8_t *v = kiln_malloc(len);
  memset(v, fill, len);
  kiln_status st = {0};
  ck_assert_int_eq(s->ops->put(s, key, v, len, &st), 0);
  kiln_free(v);
}

/* Gets key and checks it holds len bytes of fill; false on a miss. */
static bool get_bytes(kiln_cache_store *s, const char *key, uint8_t fill, size_t len) {
  uint8_t *v = NULL;
  size_t n = 0;
  int rc = s->ops->get(s, key, &v, &n, NULL);
  if (rc == KILN_ENOTFOUND) return false;
  ck_assert_int_eq(rc, 0);
  ck_assert_uint_eq(n, len);
  for (size_t i = 0; i < n; i++) ck_assert_uint_eq(v[i], fill);
  kiln_free(v);
  return true;
}

static kiln_cache_store_stats store_stats(kiln_cache_store *s) {
  kiln_cache_store_stats out;
  s->ops->stats(s, &out);
  return out;
}

/* Bytes of entry files under dir, and their count. */
static uint64_t disk_usage(const char *dir, int *files) {
  uint64_t total = 0;
  *files = 0;
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strlen(de->d_name) != 2) continue;
    char sub[512];
    snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name);
    DIR *s = opendir(sub);
    if (s == NULL) continue;
    struct dirent *fe;
    while ((fe = readdir(s)) != NULL) {
      if (strlen(fe->d_name) != 64) continue;
      char path[700];
      struct stat sb;
      snprintf(path, sizeof path, "%s/%s", sub, fe->d_name);
      if (stat(path, &sb) == 0) {
        total += (uint64_t)sb.st_size;
        (*files)++;
      }
    }
    closedir(s);
  }
  closedir(d);
  return total;
}

/* ---- memory ------------------------------------------------------------ */

START_TEST(memory_lru_order) {
  kiln_cache_store *s = NULL;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_memory_create(300, &s, &st), 0);
  ck_assert_str_eq(s->ops->name, "memory");
  char a[65], b[65], c[65], d[65];
  hex_key(1, a), hex_key(2, b), hex_key(3, c), hex_key(4, d);
  put_bytes(s, a, 'a', 100);
  put_bytes(s, b, 'b', 100);
  put_bytes(s, c, 'c', 100);
  ck_assert(get_bytes(s, a, 'a', 100)); /* a is now the most recent */
  put_bytes(s, d, 'd', 100);            /* evicts b, the least recent */
  ck_assert(!get_bytes(s, b, 'b', 100));
  ck_assert(get_bytes(s, c, 'c', 100));
  ck_assert(get_bytes(s, a, 'a', 100));
  ck_assert(get_bytes(s, d, 'd', 100));
  put_bytes(s, b, 'B', 150); /* order now b, d, a, c: evicts c then a */
  ck_assert(!get_bytes(s, c, 'c', 100));
  ck_assert(!get_bytes(s, a, 'a', 100));
  ck_assert(get_bytes(s, d, 'd', 100));
  ck_assert(get_bytes(s, b, 'B', 150));
  kiln_cache_store_stats ss = store_stats(s);
  ck_assert_uint_eq(ss.puts, 5);
  ck_assert_uint_eq(ss.evictions, 3);
  ck_assert_uint_eq(ss.bytes, 250);
  ck_assert_uint_eq(ss.entries, 2);
  ck_assert_uint_eq(ss.hits, 6);
  ck_assert_uint_eq(ss.misses, 3);
  ck_assert(ss.up);
  kiln_cache_store_destroy(s);
}
END_TEST

START_TEST(memory_byte_bound) {
  kiln_cache_store *s = NULL;
  ck_assert_int_eq(kiln_cache_memory_create(1000, &s, NULL), 0);
  char k[65];
  hex_key(9, k);
  put_bytes(s, k, 'x', 1001); /* larger than the bound: not stored */
  ck_assert(!get_bytes(s, k, 'x', 1001));
  ck_assert_uint_eq(store_stats(s).entries, 0);
  put_bytes(s, k, 'y', 1000); /* exactly the bound: stored */
  ck_assert(get_bytes(s, k, 'y', 1000));
  put_bytes(s, k, 'z', 10); /* replaced in place */
  ck_assert_uint_eq(store_stats(s).bytes, 10);
  unsigned seed = 12345;
  for (int i = 0; i < 300; i++) {
    char key[65];
    hex_key(100 + i % 50, key);
    put_bytes(s, key, (uint8_t)i, 1 + rand_r(&seed) % 400);
    kiln_cache_store_stats ss = store_stats(s);
    ck_assert_uint_le(ss.bytes, 1000);
  }
  ck_assert_int_eq(s->ops->del(s, k, NULL), KILN_ENOTFOUND); /* evicted long ago */
  put_bytes(s, k, 'w', 5);
  ck_assert_int_eq(s->ops->del(s, k, NULL), 0);
  ck_assert(!get_bytes(s, k, 'w', 5));
  kiln_status st = {0};
  ck_assert_int_eq(s->ops->get(s, "../../etc/passwd", &(uint8_t *){NULL}, &(size_t){0}, &st),
                   KILN_EINVAL);
  ck_assert_str_eq(st.msg, "key is not 64 lowercase hex digits");
  kiln_cache_store_destroy(s);
}
END_TEST

/* ---- disk ---------------------------------------------------------------- */

START_TEST(disk_survives_reopen) {
  make_tmp();
  char dir[128];
  sub_path(dir, sizeof dir, "cache/deeper");
  kiln_cache_store *s = NULL;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_disk_create(dir, 1 << 20, &s, &st), 0);
  ck_assert_str_eq(s->ops->name, "disk");
  struct stat sb;
  ck_assert_int_eq(stat(dir, &sb), 0);
  ck_assert_uint_eq(sb.st_mode & 0777, 0700);
  char k[3][65];
  for (int i = 0; i < 3; i++) {
    hex_key(i, k[i]);
    put_bytes(s, k[i], (uint8_t)('a' + i), 1000 + (size_t)i);
  }
  char path[256];
  snprintf(path, sizeof path, "%s/%.2s/%s", dir, k[1], k[1]);
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_uint_eq(sb.st_size, 1001);
  kiln_cache_store_destroy(s);

  ck_assert_int_eq(kiln_cache_disk_create(dir, 1 << 20, &s, &st), 0);
  kiln_cache_store_stats ss = store_stats(s);
  ck_assert_uint_eq(ss.entries, 3);
  ck_assert_uint_eq(ss.bytes, 3003);
  for (int i = 0; i < 3; i++) ck_assert(get_bytes(s, k[i], (uint8_t)('a' + i), 1000 + (size_t)i));
  ck_assert_int_eq(s->ops->del(s, k[0], NULL), 0);
  ck_assert_int_eq(s->ops->del(s, k[0], NULL), KILN_ENOTFOUND);
  ck_assert_uint_eq(store_stats(s).entries, 2);
  kiln_cache_store_destroy(s);
  remove_tmp();
}
END_TEST

START_TEST(disk_leftover_temp_removed) {
  make_tmp();
  char dir[128], junk[256], live[256];
  sub_path(dir, sizeof dir, "d");
  kiln_cache_store *s = NULL;
  ck_assert_int_eq(kiln_cache_disk_create(dir, 1 << 20, &s, NULL), 0);
  char k[65];
  hex_key(5, k);
  put_bytes(s, k, 'k', 64);
  kiln_cache_store_destroy(s);
  /* A writer that died mid-write (no such pid) and one still running (us). */
  snprintf(junk, sizeof junk, "%s/%.2s/.tmp-99999999-1-deadbeef", dir, k);
  snprintf(live, sizeof live, "%s/%.2s/.tmp-%ld-1-cafe0000", dir, k, (long)getpid());
  FILE *f = fopen(junk, "w");
  fputs("half an entry", f);
  fclose(f);
  f = fopen(live, "w");
  fputs("being written", f);
  fclose(f);
  ck_assert_int_eq(kiln_cache_disk_create(dir, 1 << 20, &s, NULL), 0);
  ck_assert_int_eq(access(junk, F_OK), -1);
  ck_assert_int_eq(access(live, F_OK), 0);
  kiln_cache_store_stats ss = store_stats(s);
  ck_assert_uint_eq(ss.entries, 1);
  ck_assert_uint_eq(ss.bytes, 64);
  ck_assert(get_bytes(s, k, 'k', 64));
  kiln_cache_store_destroy(s);
  remove_tmp();
}
END_TEST

/* Whatever someone left at an entry path that is not a regular file is a
 * miss at once: a FIFO (opening it for reading would wait for a writer), a
 * link to a valid entry, a fan-out directory that is a link. A put then
 * replaces the FIFO with a real entry. */
START_TEST(disk_special_files_are_misses) {
  make_tmp();
  char dir[128], path[512], target[256];
  sub_path(dir, sizeof dir, "d");
  kiln_cache_store *s = NULL;
  ck_assert_int_eq(kiln_cache_disk_create(dir, 1 << 20, &s, NULL), 0);
  char kf[65], kl[65], kd[65];
  hex_key(40, kf);
  hex_key(41, kl);
  for (int i = 42; i < 400; i++) { /* a key in a fan-out of its own */
    hex_key(i, kd);
    if (strncmp(kd, kf, 2) != 0 && strncmp(kd, kl, 2) != 0) break;
  }
  put_bytes(s, kl, 'l', 100);
  /* The FIFO, and a link to a copy of kl's file under kl's own name. */
  snprintf(path, sizeof path, "%s/%.2s", dir, kf);
  mkdir(path, 0700);
  snprintf(path, sizeof path, "%s/%.2s/%s", dir, kf, kf);
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  snprintf(path, sizeof path, "%s/%.2s/%s", dir, kl, kl);
  sub_path(target, sizeof target, "copy");
  ck_assert_int_eq(rename(path, target), 0);
  ck_assert_int_eq(symlink(target, path), 0);
  /* kd's fan-out directory is a link to a directory holding a valid file. */
  sub_path(target, sizeof target, "elsewhere");
  ck_assert_int_eq(mkdir(target, 0700), 0);
  snprintf(path, sizeof path, "%s/%s", target, kd);
  FILE *f = fopen(path, "w");
  fputs("not to be read", f);
  fclose(f);
  snprintf(path, sizeof path, "%s/%.2s", dir, kd);
  ck_assert_int_eq(symlink(target, path), 0);

  int64_t t0 = now_ns();
  ck_assert(!get_bytes(s, kf, 'f', 10));
  ck_assert(!get_bytes(s, kl, 'l', 100));
  ck_assert(!get_bytes(s, kd, 'n', 14));
  ck_assert_int_lt(now_ns() - t0, 2 * (int64_t)1000000000);
  /* A reopen's scan indexes none of them, nor does it block. */
  kiln_cache_store_destroy(s);
  ck_assert_int_eq(kiln_cache_disk_create(dir, 1 << 20, &s, NULL), 0);
  ck_assert_uint_eq(store_stats(s).entries, 0);
  /* Writing kf replaces the FIFO; writing kd does not go through the link. */
  put_bytes(s, kf, 'f', 10);
  ck_assert(get_bytes(s, kf, 'f', 10));
  uint8_t v[4] = {1, 2, 3, 4};
  kiln_status st = {0};
  ck_assert_int_eq(s->ops->put(s, kd, v, sizeof v, &st), KILN_EIO);
  snprintf(path, sizeof path, "%s/%s", target, kd);
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_uint_eq(sb.st_size, 14);
  kiln_cache_store_destroy(s);
  remove_tmp();
}
END_TEST

START_TEST(disk_bound_under_flood) {
  make_tmp();
  char dir[128];
  sub_path(dir, sizeof dir, "flood");
  kiln_cache_store *s = NULL;
  ck_assert_int_eq(kiln_cache_disk_create(dir, 10000, &s, NULL), 0);
  for (int i = 0; i < 200; i++) {
    char k[65];
    hex_key(1000 + i, k);
    put_bytes(s, k, (uint8_t)i, 500);
    ck_assert_uint_le(store_stats(s).bytes, 10000);
  }
  int files = 0;
  ck_assert_uint_eq(disk_usage(dir, &files), 10000);
  ck_assert_int_eq(files, 20);
  kiln_cache_store_stats ss = store_stats(s);
  ck_assert_uint_eq(ss.evictions, 180);
  ck_assert_uint_eq(ss.entries, 20);
  ck_assert_uint_eq(ss.puts, 200);
  for (int i = 180; i < 200; i++) {
    char k[65];
    hex_key(1000 + i, k);
    ck_assert(get_bytes(s, k, (uint8_t)i, 500));
  }
  /* Larger than the whole bound: not stored, nothing evicted for it. */
  char big[65];
  hex_key(5000, big);
  put_bytes(s, big, 'B', 10001);
  ck_assert(!get_bytes(s, big, 'B', 10001));
  ck_assert_uint_eq(store_stats(s).entries, 20);
  kiln_cache_store_destroy(s);
  remove_tmp();
}
END_TEST

static int count_listed(void *ctx, const char *key, const uint8_t *val, size_t len) {
  (void)key, (void)val, (void)len;
  (*(int *)ctx)++;
  return 0;
}

START_TEST(disk_recency_survives_reopen) {
  make_tmp();
  char dir[128];
  sub_path(dir, sizeof dir, "lru");
  kiln_cache_store *s = NULL;
  char a[65], b[65], c[65], d[65];
  hex_key(1, a), hex_key(2, b), hex_key(3, c), hex_key(4, d);
  ck_assert_int_eq(kiln_cache_disk_create(dir, 300, &s, NULL), 0);
  put_bytes(s, a, 'a', 100);
  sleep_ms(20);
  put_bytes(s, b, 'b', 100);
  sleep_ms(20);
  put_bytes(s, c, 'c', 100);
  sleep_ms(20);
  ck_assert(get_bytes(s, a, 'a', 100)); /* a's file time moves to now */
  sleep_ms(20);
  int listed = 0;
  ck_assert_int_eq(s->ops->list(s, count_listed, &listed, NULL), 0); /* no use: no recency */
  ck_assert_int_eq(listed, 3);
  kiln_cache_store_destroy(s);
  ck_assert_int_eq(kiln_cache_disk_create(dir, 300, &s, NULL), 0);
  put_bytes(s, d, 'd', 100); /* b is the oldest after the reopen */
  ck_assert(!get_bytes(s, b, 'b', 100));
  ck_assert(get_bytes(s, a, 'a', 100));
  ck_assert(get_bytes(s, c, 'c', 100));
  ck_assert(get_bytes(s, d, 'd', 100));
  kiln_cache_store_destroy(s);
  remove_tmp();
}
END_TEST

START_TEST(disk_refuses_non_hex_keys) {
  make_tmp();
  char dir[128];
  sub_path(dir, sizeof dir, "keys");
  kiln_cache_store *s = NULL;
  ck_assert_int_eq(kiln_cache_disk_create(dir, 1 << 20, &s, NULL), 0);
  const char *bad[] = {"../../../../etc/passwd",
                       "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
                       "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde",
                       "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0",
                       "../23456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                       ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kiln_status st = {0};
    ck_assert_int_eq(s->ops->put(s, bad[i], (const uint8_t *)"x", 1, &st), KILN_EINVAL);
    ck_assert_str_eq(st.msg, "key is not 64 lowercase hex digits");
    ck_assert_int_eq(s->ops->del(s, bad[i], NULL), KILN_EINVAL);
  }
  int files = 0;
  ck_assert_uint_eq(disk_usage(dir, &files), 0);
  kiln_cache_store_destroy(s);
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_disk_create("", 1, &s, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "no directory given");
  remove_tmp();
}
END_TEST

typedef struct sharer {
  kiln_cache_store *s;
  int seed;
  atomic_int *bad;
} sharer;

/* Puts and reads the same keys as another store on the same directory:
 * every hit must be one whole value, never a mix or a partial file. */
static void *share_loop(void *arg) {
  sharer *sh = arg;
  for (int i = 0; i < 300; i++) {
    char k[65];
    hex_key(i % 7, k);
    size_t len = 2000 + (size_t)((i * 131 + sh->seed) % 3000);
    uint8_t *v = kiln_malloc(len);
    memset(v, (uint8_t)(len % 251), len);
    sh->s->ops->put(sh->s, k, v, len, NULL);
    kiln_free(v);
    uint8_t *got = NULL;
    size_t n = 0;
    if (sh->s->ops->get(sh->s, k, &got, &n, NULL) == 0) {
      for (size_t j = 0; j < n; j++)
        if (got[j] != (uint8_t)(n % 251)) {
          atomic_fetch_add(sh->bad, 1);
          break;
        }
      kiln_free(got);
    }
  }
  return NULL;
}

START_TEST(disk_two_stores_one_dir) {
  make_tmp();
  char dir[128];
  sub_path(dir, sizeof dir, "shared");
  kiln_cache_store *s1 = NULL, *s2 = NULL;
  ck_assert_int_eq(kiln_cache_disk_create(dir, 1 << 20, &s1, NULL), 0);
  ck_assert_int_eq(kiln_cache_disk_create(dir, 1 << 20, &s2, NULL), 0);
  char k[65];
  hex_key(77, k);
  put_bytes(s1, k, 'q', 333);
  ck_assert(get_bytes(s2, k, 'q', 333));
  ck_assert_uint_eq(store_stats(s2).entries, 1); /* learnt from the hit */
  ck_assert_int_eq(s2->ops->del(s2, k, NULL), 0);
  ck_assert(!get_bytes(s1, k, 'q', 333)); /* vanished under s1: a miss */
  ck_assert_uint_eq(store_stats(s1).entries, 0);

  atomic_int bad = 0;
  sharer a = {s1, 1, &bad}, b = {s2, 2, &bad};
  pthread_t ta, tb;
  pthread_create(&ta, NULL, share_loop, &a);
  pthread_create(&tb, NULL, share_loop, &b);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  ck_assert_int_eq(atomic_load(&bad), 0);
  int files = 0;
  disk_usage(dir, &files);
  ck_assert_int_eq(files, 7);
  kiln_cache_store_destroy(s1);
  kiln_cache_store_destroy(s2);

  /* The same from two processes. */
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    kiln_cache_store *cs = NULL;
    atomic_int child_bad = 0;
    if (kiln_cache_disk_create(dir, 1 << 20, &cs, NULL) != 0) _exit(2);
    sharer sc = {cs, 3, &child_bad};
    share_loop(&sc);
    kiln_cache_store_destroy(cs);
    _exit(atomic_load(&child_bad) ? 1 : 0);
  }
  ck_assert_int_eq(kiln_cache_disk_create(dir, 1 << 20, &s1, NULL), 0);
  sharer p = {s1, 4, &bad};
  share_loop(&p);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status));
  ck_assert_int_eq(WEXITSTATUS(status), 0);
  ck_assert_int_eq(atomic_load(&bad), 0);
  kiln_cache_store_destroy(s1);
  remove_tmp();
}
END_TEST

/* ---- the tiered cache ------------------------------------------------------ */

typedef struct build_ctx {
  atomic_int *calls;   /* shared by the caches of a test */
  int fail_calls;      /* calls numbered up to this fail */
  int sleep_ms;        /* after the gate */
  uint64_t compile_ns; /* reported */
  uint8_t fill;        /* payload bytes */
  size_t len;
  atomic_int *started; /* set when a build starts */
  /* Gate: wait until these counters reach these values (20 s at most). */
  kiln_cache *gate_cache[2];
  uint64_t gate_sf_waits[2];
  uint64_t gate_lock_waits[2];
} build_ctx;

static void gate(const build_ctx *b) {
  int64_t until = now_ns() + 20 * (int64_t)1000000000;
  for (int i = 0; i < 2; i++) {
    if (b->gate_cache[i] == NULL) continue;
    for (;;) {
      kiln_cache_stats s;
      kiln_cache_get_stats(b->gate_cache[i], &s);
      if (s.single_flight_waits >= b->gate_sf_waits[i] && s.lock_waits >= b->gate_lock_waits[i])
        break;
      ck_assert_msg(now_ns() < until, "waiters never arrived: %llu flight, %llu lock",
                    (unsigned long long)s.single_flight_waits, (unsigned long long)s.lock_waits);
      sleep_ms(2);
    }
  }
}

static int build_fn(void *vctx, uint8_t **payload, size_t *len, uint32_t *kind,
                    uint64_t *peak_bytes, uint64_t *compile_ns, kiln_status *st) {
  build_ctx *b = vctx;
  int call = atomic_fetch_add(b->calls, 1) + 1;
  if (b->started) atomic_store(b->started, 1);
  gate(b);
  if (b->sleep_ms) sleep_ms(b->sleep_ms);
  if (call <= b->fail_calls)
    return kiln_status_set(st, KILN_EVERIFY, "test build", "build %d failed", call);
  *payload = kiln_malloc(b->len);
  memset(*payload, b->fill, b->len);
  *len = b->len;
  *kind = KILN_CACHE_PAYLOAD_CPU_EXE;
  *peak_bytes = 4096;
  *compile_ns = b->compile_ns;
  return 0;
}

static kiln_cache *new_cache(uint64_t memory_bytes, const char *disk_name, const char *secret) {
  kiln_cache_config cfg;
  kiln_cache_config_init(&cfg);
  cfg.memory_bytes = memory_bytes;
  char dir[128];
  if (disk_name) {
    sub_path(dir, sizeof dir, disk_name);
    cfg.disk_dir = dir;
    cfg.disk_bytes = 1 << 20;
  }
  cfg.secret = secret;
  kiln_cache *c = NULL;
  kiln_status st = {0};
  ck_assert_msg(kiln_cache_create(&cfg, &c, &st) == 0, "create: %s", st.msg);
  return c;
}

static kiln_cache_stats stats_of(kiln_cache *c) {
  kiln_cache_stats s;
  kiln_cache_get_stats(c, &s);
  return s;
}

static void check_payload(const kiln_cache_result *r, uint8_t fill, size_t len) {
  ck_assert_uint_eq(r->len, len);
  for (size_t i = 0; i < len; i++) ck_assert_uint_eq(r->payload[i], fill);
}

static int get_or_build(kiln_cache *c, int key, kiln_cache_policy pol, build_ctx *b,
                        kiln_cache_result *r) {
  kiln_cache_key k = make_key(key);
  kiln_status st = {0};
  return kiln_cache_get_or_build(c, &k, pol, 0, build_fn, b, r, &st);
}

START_TEST(config_defaults_and_sources) {
  kiln_cache_config cfg;
  kiln_cache_config_init(&cfg);
  ck_assert_uint_eq(cfg.memory_bytes, 268435456u);
  ck_assert_uint_eq(cfg.disk_bytes, 4294967296u);
  ck_assert_uint_eq(cfg.redis.ttl_s, 604800);
  ck_assert_uint_eq(cfg.redis.timeout_ms, 200);
  ck_assert_int_eq(cfg.redis.db, -1);
  ck_assert_uint_eq(cfg.lock_ttl_ms, 30000);
  ck_assert_uint_eq(cfg.wait_poll_ms, 20);
  ck_assert_ptr_null(cfg.secret);
  ck_assert_str_eq(kiln_cache_source_name(KILN_CACHE_SRC_MEMORY), "memory");
  ck_assert_str_eq(kiln_cache_source_name(KILN_CACHE_SRC_DISK), "disk");
  ck_assert_str_eq(kiln_cache_source_name(KILN_CACHE_SRC_REDIS), "redis");
  ck_assert_str_eq(kiln_cache_source_name(KILN_CACHE_SRC_COMPILED), "compiled");
  ck_assert_str_eq(kiln_cache_source_name(KILN_CACHE_SRC_SINGLE_FLIGHT), "single_flight");
  cfg.secret = "too short";
  kiln_cache *c = NULL;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_create(&cfg, &c, &st), KILN_EINVAL);
  ck_assert_ptr_null(c);
  ck_assert_str_eq(st.msg, "the cache secret has 9 bytes, at least 16 are needed");
  /* No disk and no secret: one is generated for the process. */
  c = new_cache(1 << 20, NULL, NULL);
  kiln_cache_stats s = stats_of(c);
  ck_assert(s.enabled[KILN_CACHE_TIER_MEMORY]);
  ck_assert(!s.enabled[KILN_CACHE_TIER_DISK]);
  ck_assert(!s.enabled[KILN_CACHE_TIER_REDIS]);
  kiln_cache_destroy(c);
}
END_TEST

START_TEST(secret_file_shared_by_restarts) {
  make_tmp();
  kiln_cache *c1 = new_cache(0, "d", NULL);
  char path[128];
  sub_path(path, sizeof path, "d/secret");
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_uint_eq(sb.st_mode & 0777, 0600);
  ck_assert_uint_eq(sb.st_size, 65); /* 64 hex digits and a newline */
  build_ctx b = {.calls = &(atomic_int){0}, .fill = 's', .len = 50};
  kiln_cache_result r;
  ck_assert_int_eq(get_or_build(c1, 1, KILN_CACHE_POLICY_DEFAULT, &b, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
  kiln_free(r.payload);
  kiln_cache_destroy(c1);
  /* A restart reads the same secret: the disk entry verifies. */
  kiln_cache *c2 = new_cache(0, "d", NULL);
  ck_assert_int_eq(get_or_build(c2, 1, KILN_CACHE_POLICY_DEFAULT, &b, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_DISK);
  check_payload(&r, 's', 50);
  kiln_free(r.payload);
  ck_assert_int_eq(atomic_load(b.calls), 1);
  kiln_cache_destroy(c2);
  /* A secret file too short to be one is an error, not a fresh secret. */
  char dir[128];
  sub_path(dir, sizeof dir, "e");
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  sub_path(path, sizeof path, "e/secret");
  FILE *f = fopen(path, "w");
  fputs("short\n", f);
  fclose(f);
  kiln_cache_config cfg;
  kiln_cache_config_init(&cfg);
  cfg.disk_dir = dir;
  kiln_cache *c3 = NULL;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_create(&cfg, &c3, &st), KILN_EINVAL);
  ck_assert_ptr_null(c3);
  ck_assert_str_eq(st.where, path);
  ck_assert_str_eq(st.msg, "the cache secret file holds 5 bytes, 16 to 256 are needed");
  remove_tmp();
}
END_TEST

START_TEST(promotion_disk_to_memory) {
  make_tmp();
  build_ctx b = {.calls = &(atomic_int){0}, .fill = 'p', .len = 700, .compile_ns = 5000};
  kiln_cache *c = new_cache(1 << 20, "d", TEST_SECRET);
  kiln_cache_result r;
  ck_assert_int_eq(get_or_build(c, 3, KILN_CACHE_POLICY_DEFAULT, &b, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
  ck_assert_uint_eq(r.meta.compile_ns, 5000);
  ck_assert_uint_eq(r.meta.kind, KILN_CACHE_PAYLOAD_CPU_EXE);
  ck_assert_uint_eq(r.meta.peak_bytes, 4096);
  kiln_cache_key k = make_key(3);
  ck_assert_int_eq(memcmp(r.meta.key, k.digest, 32), 0);
  ck_assert_int_eq(memcmp(r.meta.parts, k.parts, sizeof k.parts), 0);
  kiln_free(r.payload);
  kiln_cache_destroy(c);

  c = new_cache(1 << 20, "d", TEST_SECRET); /* empty memory, same disk */
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_get(c, &k, &r, &st), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_DISK);
  check_payload(&r, 'p', 700);
  ck_assert_uint_eq(r.meta.compile_ns, 5000);
  kiln_free(r.payload);
  ck_assert_int_eq(kiln_cache_get(c, &k, &r, &st), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_MEMORY);
  check_payload(&r, 'p', 700);
  kiln_free(r.payload);
  kiln_cache_stats s = stats_of(c);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_MEMORY].hits, 1);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_MEMORY].misses, 1);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_DISK].hits, 1);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_DISK].misses, 0);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_MEMORY].entries, 1);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_MEMORY].bytes, 700 + kiln_cache_entry_overhead());
  ck_assert_uint_eq(s.compile_ns_saved, 10000);
  ck_assert_uint_eq(s.builds, 0);
  kiln_cache_key missing = make_key(4);
  ck_assert_int_eq(kiln_cache_get(c, &missing, &r, &st), KILN_ENOTFOUND);
  ck_assert_ptr_null(r.payload);
  kiln_cache_destroy(c);
  remove_tmp();
}
END_TEST

static void entry_file(const char *disk_name, const kiln_cache_key *k, char *out, size_t size) {
  char rel[160];
  snprintf(rel, sizeof rel, "%s/%.2s/%s", disk_name, k->hex, k->hex);
  sub_path(out, size, rel);
}

START_TEST(damaged_disk_entries_rejected) {
  make_tmp();
  build_ctx b = {.calls = &(atomic_int){0}, .fill = 'd', .len = 400};
  kiln_cache *c = new_cache(0, "d", TEST_SECRET); /* disk only */
  kiln_cache_result r;
  char path[4][256];
  kiln_cache_key k[4];
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(get_or_build(c, i, KILN_CACHE_POLICY_DEFAULT, &b, &r), 0);
    kiln_free(r.payload);
    k[i] = make_key(i);
    entry_file("d", &k[i], path[i], sizeof path[i]);
    ck_assert_int_eq(access(path[i], F_OK), 0);
  }
  /* 0: truncated on disk; 1: a payload byte flipped; 2: holds 3's entry. */
  ck_assert_int_eq(truncate(path[0], 100), 0);
  int fd = open(path[1], O_RDWR);
  uint8_t byte;
  ck_assert_int_eq(pread(fd, &byte, 1, 300), 1);
  byte ^= 1;
  ck_assert_int_eq(pwrite(fd, &byte, 1, 300), 1);
  close(fd);
  ck_assert_int_eq(rename(path[3], path[2]), 0);

  kiln_status st = {0};
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(kiln_cache_get(c, &k[i], &r, &st), KILN_ENOTFOUND);
    ck_assert_ptr_null(r.payload);
    ck_assert_int_eq(access(path[i], F_OK), -1); /* removed */
  }
  kiln_cache_stats s = stats_of(c);
  ck_assert_uint_eq(s.rejects[KILN_CACHE_REJECT_TRUNCATED], 1);
  ck_assert_uint_eq(s.rejects[KILN_CACHE_REJECT_MAC], 1);
  ck_assert_uint_eq(s.rejects[KILN_CACHE_REJECT_KEY], 1);
  ck_assert_uint_eq(s.rejects[KILN_CACHE_REJECT_VERSION], 0);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_DISK].misses, 4 + 3);
  /* 3's file was moved away behind the store's back: a miss that drops
   * it from the index. */
  ck_assert_int_eq(kiln_cache_get(c, &k[3], &r, &st), KILN_ENOTFOUND);
  s = stats_of(c);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_DISK].entries, 0);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_DISK].bytes, 0);
  ck_assert_uint_eq(s.builds, 4);
  /* The next request rebuilds a refused entry. */
  ck_assert_int_eq(get_or_build(c, 1, KILN_CACHE_POLICY_DEFAULT, &b, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
  check_payload(&r, 'd', 400);
  kiln_free(r.payload);
  kiln_cache_destroy(c);
  remove_tmp();
}
END_TEST

START_TEST(other_secret_rejected) {
  make_tmp();
  build_ctx b = {.calls = &(atomic_int){0}, .fill = 'o', .len = 10};
  kiln_cache *c1 = new_cache(0, "d", "first-secret-0123456789");
  kiln_cache_result r;
  ck_assert_int_eq(get_or_build(c1, 8, KILN_CACHE_POLICY_DEFAULT, &b, &r), 0);
  kiln_free(r.payload);
  kiln_cache *c2 = new_cache(0, "d", "second-secret-0123456789");
  ck_assert_int_eq(get_or_build(c2, 8, KILN_CACHE_POLICY_DEFAULT, &b, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
  kiln_free(r.payload);
  ck_assert_uint_eq(stats_of(c2).rejects[KILN_CACHE_REJECT_MAC], 1);
  ck_assert_int_eq(atomic_load(b.calls), 2);
  kiln_cache_destroy(c1);
  kiln_cache_destroy(c2);
  remove_tmp();
}
END_TEST

typedef struct caller {
  kiln_cache *c;
  int key;
  build_ctx *b;
  int64_t deadline_ns;
  pthread_barrier_t *barrier;
  int rc;
  kiln_status st;
  kiln_cache_result r;
  int64_t took_ns;
} caller;

static void *call_thread(void *arg) {
  caller *cl = arg;
  if (cl->barrier) pthread_barrier_wait(cl->barrier);
  kiln_cache_key k = make_key(cl->key);
  int64_t t0 = now_ns();
  cl->rc = kiln_cache_get_or_build(cl->c, &k, KILN_CACHE_POLICY_DEFAULT, cl->deadline_ns, build_fn,
                                   cl->b, &cl->r, &cl->st);
  cl->took_ns = now_ns() - t0;
  return NULL;
}

static void run_callers(caller *cl, int n) {
  pthread_t t[64];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)n);
  for (int i = 0; i < n; i++) {
    cl[i].barrier = &bar;
    ck_assert_int_eq(pthread_create(&t[i], NULL, call_thread, &cl[i]), 0);
  }
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&bar);
}

START_TEST(single_flight_32_threads) {
  /* No tier at all: the waiters can only be served by the hand-over. */
  kiln_cache *c = new_cache(0, NULL, TEST_SECRET);
  atomic_int calls = 0;
  build_ctx b = {.calls = &calls,
                 .sleep_ms = 100,
                 .fill = 0x5a,
                 .len = 4096,
                 .gate_cache = {c, NULL},
                 .gate_sf_waits = {31, 0}};
  caller cl[32];
  memset(cl, 0, sizeof cl);
  for (int i = 0; i < 32; i++) cl[i] = (caller){.c = c, .key = 42, .b = &b};
  run_callers(cl, 32);
  ck_assert_int_eq(atomic_load(&calls), 1);
  int compiled = 0, flight = 0;
  for (int i = 0; i < 32; i++) {
    ck_assert_int_eq(cl[i].rc, 0);
    check_payload(&cl[i].r, 0x5a, 4096);
    compiled += cl[i].r.source == KILN_CACHE_SRC_COMPILED;
    flight += cl[i].r.source == KILN_CACHE_SRC_SINGLE_FLIGHT;
    ck_assert_int_eq(memcmp(&cl[i].r.meta, &cl[0].r.meta, sizeof cl[0].r.meta), 0);
    kiln_free(cl[i].r.payload);
  }
  ck_assert_int_eq(compiled, 1);
  ck_assert_int_eq(flight, 31);
  kiln_cache_stats s = stats_of(c);
  ck_assert_uint_eq(s.builds, 1);
  ck_assert_uint_eq(s.single_flight_waits, 31);
  kiln_cache_destroy(c);
}
END_TEST

START_TEST(failed_build_waiters_build) {
  kiln_cache *c = new_cache(1 << 20, NULL, TEST_SECRET);
  atomic_int calls = 0;
  /* The first build fails once all 7 others wait on it. */
  build_ctx b = {.calls = &calls,
                 .fail_calls = 1,
                 .sleep_ms = 50,
                 .fill = 0x33,
                 .len = 100,
                 .gate_cache = {c, NULL},
                 .gate_sf_waits = {7, 0}};
  caller cl[8];
  memset(cl, 0, sizeof cl);
  for (int i = 0; i < 8; i++) cl[i] = (caller){.c = c, .key = 7, .b = &b};
  run_callers(cl, 8);
  ck_assert_int_eq(atomic_load(&calls), 2);
  int failed = 0, compiled = 0;
  for (int i = 0; i < 8; i++) {
    if (cl[i].rc != 0) {
      failed++;
      ck_assert_int_eq(cl[i].rc, KILN_EVERIFY);
      ck_assert_str_eq(cl[i].st.msg, "build 1 failed");
      ck_assert_ptr_null(cl[i].r.payload);
      continue;
    }
    check_payload(&cl[i].r, 0x33, 100);
    compiled += cl[i].r.source == KILN_CACHE_SRC_COMPILED;
    ck_assert(cl[i].r.source == KILN_CACHE_SRC_COMPILED ||
              cl[i].r.source == KILN_CACHE_SRC_SINGLE_FLIGHT ||
              cl[i].r.source == KILN_CACHE_SRC_MEMORY);
    kiln_free(cl[i].r.payload);
  }
  ck_assert_int_eq(failed, 1);
  ck_assert_int_eq(compiled, 1);
  ck_assert_uint_eq(stats_of(c).builds, 2);
  kiln_cache_destroy(c);
}
END_TEST

static void *slow_builder(void *arg) { return call_thread(arg); }

START_TEST(waiter_deadline) {
  kiln_cache *c = new_cache(1 << 20, NULL, TEST_SECRET);
  atomic_int calls = 0, started = 0;
  build_ctx slow = {.calls = &calls, .sleep_ms = 1500, .fill = 1, .len = 10, .started = &started};
  build_ctx fast = {.calls = &calls, .fill = 2, .len = 20};
  caller builder = {.c = c, .key = 11, .b = &slow};
  pthread_t t;
  pthread_create(&t, NULL, slow_builder, &builder);
  while (!atomic_load(&started)) sleep_ms(1);
  caller waiter = {.c = c, .key = 11, .b = &fast, .deadline_ns = now_ns() + 100000000};
  call_thread(&waiter);
  ck_assert_int_eq(waiter.rc, 0);
  ck_assert_int_eq(waiter.r.source, KILN_CACHE_SRC_COMPILED);
  check_payload(&waiter.r, 2, 20);
  ck_assert_int_ge(waiter.took_ns, 90000000);
  ck_assert_int_lt(waiter.took_ns, 1400000000);
  ck_assert_uint_eq(stats_of(c).single_flight_waits, 1);
  pthread_join(t, NULL);
  ck_assert_int_eq(builder.rc, 0);
  ck_assert_int_eq(builder.r.source, KILN_CACHE_SRC_COMPILED);
  ck_assert_int_eq(atomic_load(&calls), 2);
  kiln_free(waiter.r.payload);
  kiln_free(builder.r.payload);
  kiln_cache_destroy(c);
}
END_TEST

START_TEST(min_compile_ns) {
  kiln_cache_config cfg;
  kiln_cache_config_init(&cfg);
  cfg.memory_bytes = 1 << 20;
  cfg.secret = TEST_SECRET;
  cfg.min_compile_ns = 1000000000;
  kiln_cache *c = NULL;
  ck_assert_int_eq(kiln_cache_create(&cfg, &c, NULL), 0);
  atomic_int calls = 0;
  build_ctx fast = {.calls = &calls, .compile_ns = 1000, .fill = 'f', .len = 30};
  kiln_cache_result r;
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(get_or_build(c, 1, KILN_CACHE_POLICY_DEFAULT, &fast, &r), 0);
    ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
    kiln_free(r.payload);
  }
  kiln_cache_stats s = stats_of(c);
  ck_assert_uint_eq(s.skipped_fast, 2);
  ck_assert_uint_eq(s.builds, 2);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_MEMORY].entries, 0);

  build_ctx slow = {.calls = &calls, .compile_ns = 2000000000, .fill = 'S', .len = 30};
  ck_assert_int_eq(get_or_build(c, 2, KILN_CACHE_POLICY_DEFAULT, &slow, &r), 0);
  kiln_free(r.payload);
  ck_assert_int_eq(get_or_build(c, 2, KILN_CACHE_POLICY_DEFAULT, &slow, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_MEMORY);
  check_payload(&r, 'S', 30);
  kiln_free(r.payload);
  s = stats_of(c);
  ck_assert_uint_eq(s.compile_ns_saved, 2000000000);
  ck_assert_uint_eq(s.skipped_fast, 2);

  /* Fast builds are not stored but still handed to concurrent waiters. */
  atomic_int calls3 = 0;
  build_ctx gated = {.calls = &calls3,
                     .compile_ns = 5,
                     .fill = 'g',
                     .len = 8,
                     .gate_cache = {c, NULL},
                     .gate_sf_waits = {3, 0}};
  caller cl[4];
  memset(cl, 0, sizeof cl);
  for (int i = 0; i < 4; i++) cl[i] = (caller){.c = c, .key = 3, .b = &gated};
  run_callers(cl, 4);
  ck_assert_int_eq(atomic_load(&calls3), 1);
  int flight = 0;
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(cl[i].rc, 0);
    check_payload(&cl[i].r, 'g', 8);
    flight += cl[i].r.source == KILN_CACHE_SRC_SINGLE_FLIGHT;
    kiln_free(cl[i].r.payload);
  }
  ck_assert_int_eq(flight, 3);
  ck_assert_uint_eq(stats_of(c).skipped_fast, 3);
  kiln_cache_destroy(c);
}
END_TEST

START_TEST(refresh_and_bypass) {
  make_tmp();
  kiln_cache *c = new_cache(1 << 20, "d", TEST_SECRET);
  atomic_int calls = 0;
  build_ctx v1 = {.calls = &calls, .fill = 1, .len = 10};
  build_ctx v2 = {.calls = &calls, .fill = 2, .len = 20};
  build_ctx v3 = {.calls = &calls, .fill = 3, .len = 30};
  kiln_cache_result r;
  ck_assert_int_eq(get_or_build(c, 5, KILN_CACHE_POLICY_DEFAULT, &v1, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
  kiln_free(r.payload);
  ck_assert_int_eq(get_or_build(c, 5, KILN_CACHE_POLICY_DEFAULT, &v2, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_MEMORY);
  check_payload(&r, 1, 10);
  kiln_free(r.payload);
  ck_assert_int_eq(get_or_build(c, 5, KILN_CACHE_POLICY_REFRESH, &v2, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
  check_payload(&r, 2, 20);
  kiln_free(r.payload);
  ck_assert_int_eq(get_or_build(c, 5, KILN_CACHE_POLICY_DEFAULT, &v1, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_MEMORY);
  check_payload(&r, 2, 20);
  kiln_free(r.payload);
  ck_assert_int_eq(get_or_build(c, 5, KILN_CACHE_POLICY_BYPASS, &v3, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
  check_payload(&r, 3, 30);
  kiln_free(r.payload);
  ck_assert_int_eq(get_or_build(c, 5, KILN_CACHE_POLICY_DEFAULT, &v1, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_MEMORY);
  check_payload(&r, 2, 20);
  kiln_free(r.payload);
  ck_assert_int_eq(atomic_load(&calls), 3);
  kiln_cache_stats s = stats_of(c);
  ck_assert_uint_eq(s.builds, 3);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_MEMORY].hits, 3);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_MEMORY].misses, 1);
  /* The refreshed value reached the disk too. */
  kiln_cache_destroy(c);
  c = new_cache(1 << 20, "d", TEST_SECRET);
  ck_assert_int_eq(get_or_build(c, 5, KILN_CACHE_POLICY_DEFAULT, &v1, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_DISK);
  check_payload(&r, 2, 20);
  kiln_free(r.payload);
  kiln_cache_destroy(c);
  remove_tmp();
}
END_TEST

typedef struct listing {
  int n;
  int mem, disk;
  uint64_t bytes;
  uint64_t compile_ns;
} listing;

static int list_cb(void *ctx, const kiln_cache_meta *meta, uint64_t bytes, bool in_memory,
                   bool on_disk) {
  listing *l = ctx;
  l->n++;
  l->mem += in_memory;
  l->disk += on_disk;
  l->bytes += bytes;
  l->compile_ns += meta->compile_ns;
  return 0;
}

START_TEST(list_and_evict) {
  make_tmp();
  kiln_cache *c = new_cache(1 << 20, "d", TEST_SECRET);
  atomic_int calls = 0;
  build_ctx b = {.calls = &calls, .fill = 'l', .len = 128, .compile_ns = 7};
  kiln_cache_result r;
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(get_or_build(c, i, KILN_CACHE_POLICY_DEFAULT, &b, &r), 0);
    kiln_free(r.payload);
  }
  listing l = {0};
  ck_assert_int_eq(kiln_cache_list(c, list_cb, &l, NULL), 0);
  ck_assert_int_eq(l.n, 3);
  ck_assert_int_eq(l.mem, 3);
  ck_assert_int_eq(l.disk, 3);
  ck_assert_uint_eq(l.bytes, 3 * (128 + kiln_cache_entry_overhead()));
  ck_assert_uint_eq(l.compile_ns, 21);

  kiln_cache_key k0 = make_key(0);
  uint64_t evicted = 99;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_evict(c, k0.hex, false, &evicted, &st), 0);
  ck_assert_uint_eq(evicted, 2);
  ck_assert_int_eq(kiln_cache_evict(c, k0.hex, false, &evicted, &st), 0);
  ck_assert_uint_eq(evicted, 0);
  memset(&l, 0, sizeof l);
  kiln_cache_list(c, list_cb, &l, NULL);
  ck_assert_int_eq(l.n, 2);
  ck_assert_int_eq(kiln_cache_evict(c, "not-a-key", false, &evicted, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "key \"not-a-key\" is not 64 hex digits");
  ck_assert_int_eq(kiln_cache_evict(c, NULL, false, &evicted, NULL), 0);
  ck_assert_uint_eq(evicted, 4);
  memset(&l, 0, sizeof l);
  kiln_cache_list(c, list_cb, &l, NULL);
  ck_assert_int_eq(l.n, 0);
  int files = 0;
  char dir[128];
  sub_path(dir, sizeof dir, "d");
  disk_usage(dir, &files);
  ck_assert_int_eq(files, 0);
  kiln_cache_destroy(c);
  remove_tmp();
}
END_TEST

/* ---- with a real Redis ------------------------------------------------------ */

static kiln_test_redis *redis;

static bool start_redis(void) {
  const char *why = NULL;
  if (!kiln_test_redis_available(&why)) {
    fprintf(stderr, "skipped: %s\n", why ? why : "no redis-server");
    return false;
  }
  kiln_status st = {0};
  ck_assert_msg(kiln_test_redis_start(NULL, &redis, &st) == 0, "redis: %s", st.msg);
  return true;
}

static kiln_cache *redis_cache_ttl(const char *disk_name, uint32_t timeout_ms,
                                   uint32_t lock_ttl_ms) {
  kiln_cache_config cfg;
  kiln_cache_config_init(&cfg);
  cfg.memory_bytes = 1 << 20;
  char dir[128];
  sub_path(dir, sizeof dir, disk_name);
  cfg.disk_dir = dir;
  cfg.disk_bytes = 1 << 20;
  cfg.secret = TEST_SECRET;
  cfg.redis.url = kiln_test_redis_addr(redis);
  cfg.redis.timeout_ms = timeout_ms;
  cfg.wait_poll_ms = 10;
  cfg.lock_ttl_ms = lock_ttl_ms;
  kiln_cache *c = NULL;
  kiln_status st = {0};
  ck_assert_msg(kiln_cache_create(&cfg, &c, &st) == 0, "create: %s", st.msg);
  return c;
}

static kiln_cache *redis_cache(const char *disk_name, uint32_t timeout_ms) {
  return redis_cache_ttl(disk_name, timeout_ms, 0);
}

START_TEST(redis_shared_between_servers) {
  make_tmp();
  if (!start_redis()) return;
  kiln_cache *a = redis_cache("a", 1000), *b = redis_cache("b", 1000);
  atomic_int calls = 0;
  build_ctx bc = {.calls = &calls, .fill = 'r', .len = 2000, .compile_ns = 77};
  kiln_cache_result r;
  ck_assert_int_eq(get_or_build(a, 1, KILN_CACHE_POLICY_DEFAULT, &bc, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
  kiln_free(r.payload);
  ck_assert_int_eq(get_or_build(b, 1, KILN_CACHE_POLICY_DEFAULT, &bc, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_REDIS);
  check_payload(&r, 'r', 2000);
  ck_assert_uint_eq(r.meta.compile_ns, 77);
  kiln_free(r.payload);
  /* Promoted: b's own disk and memory now hold it. */
  ck_assert_int_eq(get_or_build(b, 1, KILN_CACHE_POLICY_DEFAULT, &bc, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_MEMORY);
  kiln_free(r.payload);
  ck_assert_int_eq(atomic_load(&calls), 1);
  kiln_cache_stats s = stats_of(b);
  ck_assert(s.enabled[KILN_CACHE_TIER_REDIS]);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_REDIS].hits, 1);
  ck_assert_uint_eq(s.tier[KILN_CACHE_TIER_DISK].entries, 1);
  ck_assert_uint_eq(s.single_flight_waits, 0);
  ck_assert_uint_eq(s.lock_waits, 0);
  kiln_cache_destroy(a);
  kiln_cache_destroy(b);
  kiln_test_redis_destroy(redis);
  remove_tmp();
}
END_TEST

/* KILN_CACHE_POLICY_LOCAL (executables holding a client's code): stored
 * in and served from a's own tiers, never written to Redis, so b builds
 * its own; a DEFAULT entry of b is not read by a's LOCAL lookups either. */
START_TEST(redis_local_policy_not_shared) {
  make_tmp();
  if (!start_redis()) return;
  kiln_cache *a = redis_cache("a", 1000), *b = redis_cache("b", 1000);
  atomic_int calls = 0;
  build_ctx bc = {.calls = &calls, .fill = 'l', .len = 300, .compile_ns = 5};
  kiln_cache_result r;
  ck_assert_int_eq(get_or_build(a, 4, KILN_CACHE_POLICY_LOCAL, &bc, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
  kiln_free(r.payload);
  ck_assert_int_eq(get_or_build(a, 4, KILN_CACHE_POLICY_LOCAL, &bc, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_MEMORY);
  check_payload(&r, 'l', 300);
  kiln_free(r.payload);
  ck_assert_int_eq(atomic_load(&calls), 1);
  ck_assert_uint_eq(stats_of(a).tier[KILN_CACHE_TIER_DISK].entries, 1);
  /* b sees nothing of it in Redis */
  ck_assert_int_eq(get_or_build(b, 4, KILN_CACHE_POLICY_DEFAULT, &bc, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
  kiln_free(r.payload);
  ck_assert_int_eq(atomic_load(&calls), 2);
  /* b's entry went to Redis; a's LOCAL lookup of another key skips Redis */
  ck_assert_int_eq(get_or_build(b, 9, KILN_CACHE_POLICY_DEFAULT, &bc, &r), 0);
  kiln_free(r.payload);
  ck_assert_int_eq(get_or_build(a, 9, KILN_CACHE_POLICY_LOCAL, &bc, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
  kiln_free(r.payload);
  ck_assert_int_eq(atomic_load(&calls), 4);
  ck_assert_uint_eq(stats_of(a).tier[KILN_CACHE_TIER_REDIS].hits, 0);
  kiln_cache_destroy(a);
  kiln_cache_destroy(b);
  kiln_test_redis_destroy(redis);
  remove_tmp();
}
END_TEST

START_TEST(redis_single_flight_across_servers) {
  make_tmp();
  if (!start_redis()) return;
  kiln_cache *a = redis_cache("a", 1000), *b = redis_cache("b", 1000);
  atomic_int calls = 0;
  /* Whichever cache builds waits until the other's leader waits on the
   * Redis lock and every in-process caller waits on its leader. */
  build_ctx ba = {.calls = &calls,
                  .sleep_ms = 50,
                  .fill = 'x',
                  .len = 5000,
                  .gate_cache = {a, b},
                  .gate_sf_waits = {15, 15},
                  .gate_lock_waits = {0, 1}};
  build_ctx bb = ba;
  bb.gate_lock_waits[0] = 1;
  bb.gate_lock_waits[1] = 0;
  caller cl[32];
  memset(cl, 0, sizeof cl);
  for (int i = 0; i < 32; i++)
    cl[i] = (caller){.c = i < 16 ? a : b, .key = 99, .b = i < 16 ? &ba : &bb};
  run_callers(cl, 32);
  ck_assert_int_eq(atomic_load(&calls), 1);
  int compiled = 0, flight = 0;
  for (int i = 0; i < 32; i++) {
    ck_assert_int_eq(cl[i].rc, 0);
    check_payload(&cl[i].r, 'x', 5000);
    compiled += cl[i].r.source == KILN_CACHE_SRC_COMPILED;
    flight += cl[i].r.source == KILN_CACHE_SRC_SINGLE_FLIGHT;
    kiln_free(cl[i].r.payload);
  }
  ck_assert_int_eq(compiled, 1);
  ck_assert_int_eq(flight, 31);
  kiln_cache_stats sa = stats_of(a), sb = stats_of(b);
  ck_assert_uint_eq(sa.builds + sb.builds, 1);
  ck_assert_uint_eq(sa.lock_waits + sb.lock_waits, 1);
  ck_assert_uint_eq(sa.single_flight_waits, 15);
  ck_assert_uint_eq(sb.single_flight_waits, 15);
  kiln_cache_destroy(a);
  kiln_cache_destroy(b);
  kiln_test_redis_destroy(redis);
  remove_tmp();
}
END_TEST

START_TEST(redis_killed_builds_locally) {
  make_tmp();
  if (!start_redis()) return;
  kiln_cache *c = redis_cache("a", 200);
  atomic_int calls = 0;
  build_ctx b = {.calls = &calls, .fill = 'k', .len = 64};
  kiln_cache_result r;
  ck_assert_int_eq(get_or_build(c, 1, KILN_CACHE_POLICY_DEFAULT, &b, &r), 0);
  kiln_free(r.payload);
  kiln_test_redis_kill(redis);
  int64_t t0 = now_ns();
  ck_assert_int_eq(get_or_build(c, 2, KILN_CACHE_POLICY_DEFAULT, &b, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_COMPILED);
  check_payload(&r, 'k', 64);
  kiln_free(r.payload);
  ck_assert_int_lt(now_ns() - t0, 5 * (int64_t)1000000000);
  /* Local tiers still serve. */
  ck_assert_int_eq(get_or_build(c, 2, KILN_CACHE_POLICY_DEFAULT, &b, &r), 0);
  ck_assert_int_eq(r.source, KILN_CACHE_SRC_MEMORY);
  kiln_free(r.payload);
  ck_assert_int_eq(atomic_load(&calls), 2);
  kiln_cache_stats s = stats_of(c);
  ck_assert_uint_ge(s.tier[KILN_CACHE_TIER_REDIS].faults, 1);
  ck_assert(!s.tier[KILN_CACHE_TIER_REDIS].up);
  /* Evicting shared reports the Redis failure after the local deletions. */
  uint64_t evicted = 0;
  kiln_status st = {0};
  kiln_cache_key k = make_key(2);
  ck_assert_int_ne(kiln_cache_evict(c, k.hex, true, &evicted, &st), 0);
  ck_assert_uint_eq(evicted, 2);
  kiln_cache_destroy(c);
  kiln_test_redis_destroy(redis);
  remove_tmp();
}
END_TEST

/* Sets the lock of key as another server would, for ttl_ms. */
static void hold_lock(int key, int ttl_ms) {
  kiln_cache_key k = make_key(key);
  redisReply *rep =
      kiln_test_redis_command(redis, "SET kiln:v1:lock:%s other-server PX %d", k.hex, ttl_ms);
  ck_assert_ptr_nonnull(rep);
  ck_assert_int_eq(rep->type, REDIS_REPLY_STATUS);
  freeReplyObject(rep);
}

START_TEST(redis_lock_of_dead_holder_expires) {
  make_tmp();
  if (!start_redis()) return;
  kiln_cache *c = redis_cache("a", 1000);
  hold_lock(21, 400); /* a holder that died: its lock only expires */
  atomic_int calls = 0;
  build_ctx b = {.calls = &calls, .fill = 'e', .len = 32};
  caller cl = {.c = c, .key = 21, .b = &b};
  call_thread(&cl);
  ck_assert_int_eq(cl.rc, 0);
  ck_assert_int_eq(cl.r.source, KILN_CACHE_SRC_COMPILED);
  check_payload(&cl.r, 'e', 32);
  kiln_free(cl.r.payload);
  ck_assert_int_ge(cl.took_ns, 300000000);
  ck_assert_int_eq(atomic_load(&calls), 1);
  kiln_cache_stats s = stats_of(c);
  ck_assert_uint_eq(s.lock_waits, 1);
  ck_assert_uint_eq(s.builds, 1);
  /* The builder released its own lock after storing. */
  kiln_cache_key k = make_key(21);
  redisReply *rep = kiln_test_redis_command(redis, "EXISTS kiln:v1:lock:%s", k.hex);
  ck_assert_ptr_nonnull(rep);
  ck_assert_int_eq(rep->integer, 0);
  freeReplyObject(rep);
  rep = kiln_test_redis_command(redis, "EXISTS kiln:v1:exe:%s", k.hex);
  ck_assert_int_eq(rep->integer, 1);
  freeReplyObject(rep);
  kiln_cache_destroy(c);
  kiln_test_redis_destroy(redis);
  remove_tmp();
}
END_TEST

START_TEST(redis_lock_wait_deadline) {
  make_tmp();
  if (!start_redis()) return;
  kiln_cache *c = redis_cache("a", 1000);
  hold_lock(22, 20000); /* another server building for a long time */
  atomic_int calls = 0;
  build_ctx b = {.calls = &calls, .fill = 'w', .len = 16};
  caller cl = {.c = c, .key = 22, .b = &b, .deadline_ns = now_ns() + 200000000};
  call_thread(&cl);
  ck_assert_int_eq(cl.rc, 0);
  ck_assert_int_eq(cl.r.source, KILN_CACHE_SRC_COMPILED);
  kiln_free(cl.r.payload);
  ck_assert_int_ge(cl.took_ns, 150000000);
  ck_assert_int_lt(cl.took_ns, 5000000000);
  ck_assert_uint_eq(stats_of(c).lock_waits, 1);
  /* The other server's lock is not ours to release. */
  kiln_cache_key k = make_key(22);
  redisReply *rep = kiln_test_redis_command(redis, "GET kiln:v1:lock:%s", k.hex);
  ck_assert_ptr_nonnull(rep);
  ck_assert_int_eq(rep->type, REDIS_REPLY_STRING);
  ck_assert_str_eq(rep->str, "other-server");
  freeReplyObject(rep);
  kiln_cache_destroy(c);
  kiln_test_redis_destroy(redis);
  remove_tmp();
}
END_TEST

/* The lock of key as this cache's builder left it: its token and PTTL. */
static long long lock_pttl(int key, char *token, size_t size) {
  kiln_cache_key k = make_key(key);
  redisReply *rep = kiln_test_redis_command(redis, "GET kiln:v1:lock:%s", k.hex);
  ck_assert_ptr_nonnull(rep);
  snprintf(token, size, "%s", rep->type == REDIS_REPLY_STRING ? rep->str : "");
  freeReplyObject(rep);
  rep = kiln_test_redis_command(redis, "PTTL kiln:v1:lock:%s", k.hex);
  long long t = rep->integer;
  freeReplyObject(rep);
  return t;
}

/* A lock key planted without an expiry (by hand, by a client of old) would
 * hold every server off the key for good: it is taken over at once, and a
 * Compile with no deadline finishes. While the build runs the lock is
 * ours, with an expiry. */
START_TEST(redis_lock_without_expiry_taken_over) {
  make_tmp();
  if (!start_redis()) return;
  kiln_cache *c = redis_cache("a", 1000);
  kiln_cache_key k = make_key(23);
  redisReply *rep = kiln_test_redis_command(redis, "SET kiln:v1:lock:%s forever", k.hex);
  ck_assert_int_eq(rep->type, REDIS_REPLY_STATUS);
  freeReplyObject(rep);
  atomic_int calls = 0;
  build_ctx b = {.calls = &calls, .fill = 'n', .len = 24};
  caller cl = {.c = c, .key = 23, .b = &b}; /* no deadline */
  call_thread(&cl);
  ck_assert_int_eq(cl.rc, 0);
  ck_assert_int_eq(cl.r.source, KILN_CACHE_SRC_COMPILED);
  check_payload(&cl.r, 'n', 24);
  kiln_free(cl.r.payload);
  ck_assert_int_lt(cl.took_ns, 2 * (int64_t)1000000000);
  ck_assert_int_eq(atomic_load(&calls), 1);
  /* Released after the store, as any lock of ours. */
  char token[64];
  ck_assert_int_eq(lock_pttl(23, token, sizeof token), -2);
  rep = kiln_test_redis_command(redis, "EXISTS kiln:v1:exe:%s", k.hex);
  ck_assert_int_eq(rep->integer, 1);
  freeReplyObject(rep);
  /* The lock try_lock sets carries the configured expiry. */
  bool got = false;
  kiln_cache_store *r = NULL;
  kiln_status st = {0};
  kiln_cache_redis_config rc;
  memset(&rc, 0, sizeof rc);
  rc.url = kiln_test_redis_addr(redis);
  ck_assert_int_eq(kiln_cache_redis_create(&rc, &r, &st), 0);
  rep = kiln_test_redis_command(redis, "SET kiln:v1:lock:%s forever", k.hex);
  freeReplyObject(rep);
  ck_assert_int_eq(r->ops->try_lock(r, k.hex, "mine", 5000, &got, &st), 0);
  ck_assert(got);
  long long t = lock_pttl(23, token, sizeof token);
  ck_assert_str_eq(token, "mine");
  ck_assert_int_gt(t, 4000);
  ck_assert_int_le(t, 5000);
  kiln_cache_store_destroy(r);
  kiln_cache_destroy(c);
  kiln_test_redis_destroy(redis);
  remove_tmp();
}
END_TEST

/* A lock that lives far longer than a builder may hold one (a hung holder,
 * a key set by hand with a long life): a Compile with no deadline waits
 * lock_ttl_ms at most, then takes the lock over and builds. */
START_TEST(redis_lock_past_expiry_taken_over) {
  make_tmp();
  if (!start_redis()) return;
  kiln_cache *c = redis_cache_ttl("a", 1000, 300);
  hold_lock(24, 600000);
  atomic_int calls = 0;
  build_ctx b = {.calls = &calls, .fill = 'p', .len = 24};
  caller cl = {.c = c, .key = 24, .b = &b};
  call_thread(&cl);
  ck_assert_int_eq(cl.rc, 0);
  ck_assert_int_eq(cl.r.source, KILN_CACHE_SRC_COMPILED);
  kiln_free(cl.r.payload);
  ck_assert_int_ge(cl.took_ns, 250000000);
  ck_assert_int_lt(cl.took_ns, 5 * (int64_t)1000000000);
  kiln_cache_stats s = stats_of(c);
  ck_assert_uint_eq(s.lock_waits, 1);
  ck_assert_uint_eq(s.lock_takeovers, 1);
  /* Taken over, so released as ours. */
  char token[64];
  ck_assert_int_eq(lock_pttl(24, token, sizeof token), -2);
  kiln_cache_destroy(c);
  kiln_test_redis_destroy(redis);
  remove_tmp();
}
END_TEST

static Suite *tiers_suite(void) {
  Suite *s = suite_create("cache_tiers");
  TCase *mem = tcase_create("memory");
  tcase_add_test(mem, memory_lru_order);
  tcase_add_test(mem, memory_byte_bound);
  suite_add_tcase(s, mem);
  TCase *disk = tcase_create("disk");
  tcase_set_timeout(disk, 120);
  tcase_add_test(disk, disk_survives_reopen);
  tcase_add_test(disk, disk_leftover_temp_removed);
  tcase_add_test(disk, disk_bound_under_flood);
  tcase_add_test(disk, disk_recency_survives_reopen);
  tcase_add_test(disk, disk_refuses_non_hex_keys);
  tcase_add_test(disk, disk_two_stores_one_dir);
  tcase_add_test(disk, disk_special_files_are_misses);
  suite_add_tcase(s, disk);
  TCase *tiered = tcase_create("tiered");
  tcase_set_timeout(tiered, 120);
  tcase_add_test(tiered, config_defaults_and_sources);
  tcase_add_test(tiered, secret_file_shared_by_restarts);
  tcase_add_test(tiered, promotion_disk_to_memory);
  tcase_add_test(tiered, damaged_disk_entries_rejected);
  tcase_add_test(tiered, other_secret_rejected);
  tcase_add_test(tiered, single_flight_32_threads);
  tcase_add_test(tiered, failed_build_waiters_build);
  tcase_add_test(tiered, waiter_deadline);
  tcase_add_test(tiered, min_compile_ns);
  tcase_add_test(tiered, refresh_and_bypass);
  tcase_add_test(tiered, list_and_evict);
  suite_add_tcase(s, tiered);
  TCase *rd = tcase_create("redis");
  tcase_set_timeout(rd, 120);
  tcase_add_test(rd, redis_shared_between_servers);
  tcase_add_test(rd, redis_local_policy_not_shared);
  tcase_add_test(rd, redis_single_flight_across_servers);
  tcase_add_test(rd, redis_killed_builds_locally);
  tcase_add_test(rd, redis_lock_of_dead_holder_expires);
  tcase_add_test(rd, redis_lock_wait_deadline);
  tcase_add_test(rd, redis_lock_without_expiry_taken_over);
  tcase_add_test(rd, redis_lock_past_expiry_taken_over);
  suite_add_tcase(s, rd);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(tiers_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
