/* The kernel cache: compiled translation units kept for reuse, keyed by
 * the SHA-256 of the unit's text, its flags and the compiler's identity
 * (cc.c computes the key).
 *
 * In memory: one process-wide LRU list bounded in bytes of objects,
 * guarded by a mutex (kilnd compiles on several threads); a lookup is a
 * walk of the list, which holds at most a few thousand units.
 *
 * On disk (optional, a directory given per compile): one file per unit,
 * <64 hex digits of the key>.o, holding "KILNKO1\n", the SHA-256 of the
 * object and the object. Files are written as a temporary file in the
 * same directory and rename()d into place, so readers never see a partial
 * one. A file is trusted only when it is ours: the directory and the file
 * are owned by this user and writable by nobody else, the file is regular
 * (opened without following links), no larger than MAX_OBJECT, and its
 * checksum matches; anything else is a miss (counted in disk_rejected),
 * and the next put replaces it. The directory is not bounded here; it is
 * meant to be a cache that an operator may empty at any time.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "compiler/codegen/cc_internal.h"

#define MAGIC "KILNKO1\n"
#define MAGIC_LEN 8
#define HEADER_LEN (MAGIC_LEN + KILN__SHA256_LEN)
#define MAX_OBJECT (UINT64_C(256) << 20)
#define DEFAULT_LIMIT (UINT64_C(64) << 20)

typedef struct entry {
  uint8_t key[KILN__SHA256_LEN];
  uint8_t *obj;
  size_t len;
  struct entry *prev, *next; /* most recent first */
} entry;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static entry *head, *tail; /* guarded by mu, like everything below */
static uint64_t limit;
static bool limit_set;
static kiln__cc_cache_stats stats;

static void init_limit_locked(void) {
  if (limit_set) return;
  const char *v = getenv("KILN_KERNEL_CACHE_BYTES");
  char *end;
  unsigned long long n = v && *v ? strtoull(v, &end, 10) : 0;
  limit = v && *v && *end == 0 ? (uint64_t)n : DEFAULT_LIMIT;
  limit_set = true;
}

static void unlink_entry(entry *e) {
  if (e->prev)
    e->prev->next = e->next;
  else
    head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    tail = e->prev;
  e->prev = e->next = NULL;
}

static void push_front(entry *e) {
  e->next = head;
  e->prev = NULL;
  if (head) head->prev = e;
  head = e;
  if (tail == NULL) tail = e;
}

static void evict_locked(void) {
  while (tail && stats.bytes > limit) {
    entry *e = tail;
    unlink_entry(e);
    stats.bytes -= e->len;
    stats.entries--;
    stats.evictions++;
    kiln_free(e->obj);
    kiln_free(e);
  }
}

void kiln__cc_cache_set_limit(uint64_t bytes) {
  pthread_mutex_lock(&mu);
  limit = bytes;
  limit_set = true;
  evict_locked();
  pthread_mutex_unlock(&mu);
}

void kiln__cc_cache_stats_get(kiln__cc_cache_stats *out) {
  pthread_mutex_lock(&mu);
  *out = stats;
  pthread_mutex_unlock(&mu);
}

void kiln__cc_cache_clear(void) {
  pthread_mutex_lock(&mu);
  while (head) {
    entry *e = head;
    unlink_entry(e);
    kiln_free(e->obj);
    kiln_free(e);
  }
  memset(&stats, 0, sizeof stats);
  pthread_mutex_unlock(&mu);
}

bool kiln__cc_cache_empty(void) {
  pthread_mutex_lock(&mu);
  bool empty = head == NULL;
  pthread_mutex_unlock(&mu);
  return empty;
}

static bool memory_get(const uint8_t *key, uint8_t **obj, size_t *len) {
  bool hit = false;
  pthread_mutex_lock(&mu);
  for (entry *e = head; e; e = e->next) {
    if (memcmp(e->key, key, KILN__SHA256_LEN) != 0) continue;
    uint8_t *copy = kiln_malloc(e->len ? e->len : 1);
    if (copy) {
      memcpy(copy, e->obj, e->len);
      *obj = copy;
      *len = e->len;
      unlink_entry(e);
      push_front(e);
      hit = true;
    }
    break;
  }
  pthread_mutex_unlock(&mu);
  return hit;
}

static void memory_put(const uint8_t *key, const uint8_t *obj, size_t len) {
  pthread_mutex_lock(&mu);
  init_limit_locked();
  bool present = false;
  for (entry *e = head; e && !present; e = e->next)
    present = !memcmp(e->key, key, KILN__SHA256_LEN);
  if (!present && len <= limit) {
    entry *e = kiln_calloc(1, sizeof *e);
    uint8_t *copy = e ? kiln_malloc(len ? len : 1) : NULL;
    if (copy) {
      memcpy(e->key, key, KILN__SHA256_LEN);
      memcpy(copy, obj, len);
      e->obj = copy;
      e->len = len;
      push_front(e);
      stats.bytes += len;
      stats.entries++;
      evict_locked();
    } else {
      kiln_free(e);
    }
  }
  pthread_mutex_unlock(&mu);
}

static void count(uint64_t *field) {
  pthread_mutex_lock(&mu);
  (*field)++;
  pthread_mutex_unlock(&mu);
}

/* The directory is ours: a real directory, our own, writable only by us. */
static bool dir_ok(const char *dir) {
  struct stat sb;
  if (lstat(dir, &sb) != 0) {
    if (errno != ENOENT || mkdir(dir, 0700) != 0 || lstat(dir, &sb) != 0) return false;
  }
  return S_ISDIR(sb.st_mode) && sb.st_uid == geteuid() && (sb.st_mode & 022) == 0;
}

static void entry_path(const char *dir, const uint8_t *key, const char *suffix, char *out,
                       size_t size) {
  char hex[2 * KILN__SHA256_LEN + 1];
  kiln__hex(key, KILN__SHA256_LEN, hex);
  snprintf(out, size, "%s/%s%s", dir, hex, suffix);
}

static bool disk_get(const char *dir, const uint8_t *key, uint8_t **obj, size_t *len) {
  char path[4400];
  if (!dir_ok(dir)) return false;
  entry_path(dir, key, ".o", path, sizeof path);
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat sb;
  uint8_t *buf = NULL;
  bool ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == geteuid() &&
            (sb.st_mode & 022) == 0 && sb.st_size >= HEADER_LEN &&
            (uint64_t)sb.st_size <= MAX_OBJECT + HEADER_LEN;
  size_t n = ok ? (size_t)sb.st_size : 0, got = 0;
  if (ok && (buf = kiln_malloc(n)) == NULL) {
    close(fd);
    return false; /* out of memory: not the file's fault */
  }
  while (ok && got < n) {
    ssize_t k = read(fd, buf + got, n - got);
    if (k <= 0) break;
    got += (size_t)k;
  }
  close(fd);
  uint8_t sum[KILN__SHA256_LEN];
  if (ok && got == n) kiln__sha256_of(buf + HEADER_LEN, n - HEADER_LEN, sum);
  ok = ok && got == n && memcmp(buf, MAGIC, MAGIC_LEN) == 0 &&
       memcmp(buf + MAGIC_LEN, sum, KILN__SHA256_LEN) == 0;
  if (!ok) {
    kiln_free(buf);
    count(&stats.disk_rejected);
    return false;
  }
  memmove(buf, buf + HEADER_LEN, n - HEADER_LEN);
  *obj = buf;
  *len = n - HEADER_LEN;
  return true;
}

static void disk_put(const char *dir, const uint8_t *key, const uint8_t *obj, size_t len) {
  char path[4400], tmp[4500];
  if (!dir_ok(dir)) return;
  entry_path(dir, key, ".o", path, sizeof path);
  static unsigned seq;
  unsigned n = __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED);
  snprintf(tmp, sizeof tmp, "%s/.tmp-%ld-%u", dir, (long)getpid(), n);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return;
  uint8_t header[HEADER_LEN];
  memcpy(header, MAGIC, MAGIC_LEN);
  kiln__sha256_of(obj, len, header + MAGIC_LEN);
  bool ok = write(fd, header, HEADER_LEN) == HEADER_LEN;
  for (size_t done = 0; ok && done < len;) {
    ssize_t k = write(fd, obj + done, len - done);
    if (k <= 0)
      ok = false;
    else
      done += (size_t)k;
  }
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) unlink(tmp);
}

bool kiln__cc_cache_get(const char *dir, const uint8_t key[KILN__SHA256_LEN], uint8_t **obj,
                        size_t *len) {
  if (memory_get(key, obj, len)) {
    count(&stats.hits);
    return true;
  }
  if (dir && *dir && disk_get(dir, key, obj, len)) {
    count(&stats.disk_hits);
    memory_put(key, *obj, *len);
    return true;
  }
  count(&stats.misses);
  return false;
}

void kiln__cc_cache_put(const char *dir, const uint8_t key[KILN__SHA256_LEN], const uint8_t *obj,
                        size_t len) {
  memory_put(key, obj, len);
  if (dir && *dir) disk_put(dir, key, obj, len);
}
