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
 * and the next put replaces it. An operator may empty the directory at any
 * time.
 *
 * The directory is bounded in bytes of objects (env
 * KILN_KERNEL_CACHE_DIR_BYTES, default 1 GiB, 0: no bound), least recently
 * used first: a hit sets the file's mtime to now, and after each put the
 * directory is listed and, when its objects add up to more than the bound,
 * the oldest are removed until they fit in 7/8 of it (so that the next few
 * puts do not each remove one). Other processes trim the same directory
 * concurrently; a file already removed by one of them is simply skipped.
 * Temporary files older than an hour (a process killed mid-write) go too.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "compiler/codegen/cc_internal.h"

#define MAGIC "KILNKO1\n"
#define MAGIC_LEN 8
#define HEADER_LEN (MAGIC_LEN + KILN__SHA256_LEN)
#define MAX_OBJECT (UINT64_C(256) << 20)
#define DEFAULT_LIMIT (UINT64_C(64) << 20)
#define DEFAULT_DIR_LIMIT (UINT64_C(1) << 30)
#define STALE_TMP_SECONDS 3600

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
static uint64_t dir_limit;
static bool dir_limit_set;

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

static void init_dir_limit_locked(void) {
  if (dir_limit_set) return;
  const char *v = getenv("KILN_KERNEL_CACHE_DIR_BYTES");
  char *end;
  unsigned long long n = v && *v ? strtoull(v, &end, 10) : 0;
  dir_limit = v && *v && *end == 0 ? (uint64_t)n : DEFAULT_DIR_LIMIT;
  dir_limit_set = true;
}

void kiln__cc_cache_set_dir_limit(uint64_t bytes) {
  pthread_mutex_lock(&mu);
  dir_limit = bytes;
  dir_limit_set = true;
  pthread_mutex_unlock(&mu);
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
  /* Used now: the trim removes the least recently used first. */
  utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW);
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

/* An object file of ours: 64 hex digits and ".o". */
static bool object_name(const char *name) {
  size_t n = strlen(name);
  if (n != 2 * KILN__SHA256_LEN + 2 || strcmp(name + n - 2, ".o") != 0) return false;
  for (size_t i = 0; i + 2 < n; i++)
    if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return false;
  return true;
}

typedef struct dir_file {
  int64_t mtime_ns;
  uint64_t bytes;
  char name[2 * KILN__SHA256_LEN + 3];
} dir_file;

static int cmp_oldest(const void *x, const void *y) {
  const dir_file *a = x, *b = y;
  if (a->mtime_ns != b->mtime_ns) return a->mtime_ns < b->mtime_ns ? -1 : 1;
  return strcmp(a->name, b->name);
}

/* Removes the least recently used objects of dir until they fit in 7/8 of
 * bound, when they exceed it; and stale temporary files. */
static void trim_dir(const char *dir, uint64_t bound) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  int fd = dirfd(d);
  dir_file *files = NULL;
  size_t n = 0, cap = 0;
  uint64_t total = 0;
  time_t now = time(NULL);
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    struct stat sb;
    bool tmp = strncmp(de->d_name, ".tmp-", 5) == 0;
    if ((!tmp && !object_name(de->d_name)) ||
        fstatat(fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
        sb.st_uid != geteuid())
      continue;
    if (tmp) {
      if (now - sb.st_mtime > STALE_TMP_SECONDS) unlinkat(fd, de->d_name, 0);
      continue;
    }
    if (kiln_grow((void **)&files, &cap, n + 1, sizeof *files)) break; /* trim what we saw */
    files[n].mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    files[n].bytes = (uint64_t)sb.st_size;
    snprintf(files[n].name, sizeof files[n].name, "%s", de->d_name);
    total += files[n++].bytes;
  }
  if (total > bound) {
    qsort(files, n, sizeof *files, cmp_oldest);
    uint64_t goal = bound / 8 * 7;
    for (size_t i = 0; i < n && total > goal; i++) {
      if (unlinkat(fd, files[i].name, 0) == 0 || errno == ENOENT) {
        total -= files[i].bytes;
        count(&stats.disk_evictions);
      }
    }
  }
  kiln_free(files);
  closedir(d);
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
  if (dir == NULL || *dir == 0) return;
  disk_put(dir, key, obj, len);
  pthread_mutex_lock(&mu);
  init_dir_limit_locked();
  uint64_t bound = dir_limit;
  pthread_mutex_unlock(&mu);
  if (bound) trim_dir(dir, bound);
}
