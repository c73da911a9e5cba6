/* The disk tier: one file per entry in a local directory, bounded in bytes.
 *
 * An entry lives at <dir>/<first two hex digits>/<64 hex digits>; the
 * fan-out keeps directories small. A put writes a temporary file in the
 * entry's own directory, fsyncs it and rename()s it over the name, so a
 * reader sees the old file or the new one, never a partial one, and a crash
 * mid-write leaves only a temporary file (named .tmp-<pid>-...), which the
 * next open removes once its writer is gone.
 *
 * The byte bound is kept with an in-memory LRU index (lru.h) rebuilt from a
 * scan at open, oldest modification time first; a hit sets the file's times
 * to now, so recency survives a restart. Several processes may share one
 * directory: renames are atomic, any file may vanish under us (another
 * process evicted it: a miss), and files others wrote are picked up by a
 * rescan every RESCAN_PUTS puts or RESCAN_NS, so the bound holds for the
 * directory as a whole up to what others wrote since the last rescan.
 * Keys are checked to be 64 lowercase hex digits before any path is built.
 * Whoever can write the directory may leave anything at an entry path: only
 * regular files are read or written, through the fan-out directory opened
 * without following links, and opened non-blocking so that a FIFO or a
 * device there is a miss at once instead of a thread held in open().
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/lru.h"
#include "cache/store.h"
#include "common/alloc.h"

#define RESCAN_PUTS 128
#define RESCAN_NS (30 * (int64_t)1000000000)
#define TMP_PREFIX ".tmp-"
/* A temporary file this old is a leftover even if a process with its pid
 * runs now (pids are reused; directories may be shared over NFS). */
#define TMP_STALE_S (3600)

typedef struct disk_store {
  kiln_cache_store base;
  char *dir;
  uint64_t max_bytes;
  pthread_mutex_t mu; /* guards everything below */
  kiln__lru lru;      /* node bytes = file size */
  uint64_t hits, misses, puts, evictions;
  uint64_t tmp_seq;
  unsigned puts_since_scan;
  int64_t last_scan_ns;
} disk_store;

/* One file found by a scan. */
typedef struct found {
  char key[KILN_CACHE_HEX_LEN + 1];
  uint64_t bytes;
  int64_t mtime_ns;
} found;

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void entry_path(const disk_store *d, const char *key, char *out, size_t size) {
  snprintf(out, size, "%s/%.2s/%s", d->dir, key, key);
}

static int bad_key(kiln_status *st) {
  return kiln_status_set(st, KILN_EINVAL, "cache disk", "key is not 64 lowercase hex digits");
}

static int mkdir_p(const char *path) {
  char buf[PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf) return ENAMETOOLONG;
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    char c = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0700) != 0 && errno != EEXIST) return errno;
    buf[i] = c;
  }
  struct stat sb;
  if (stat(path, &sb) != 0) return errno;
  return S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;
}

/* A temporary file is a leftover when its writer is gone or it is old. */
static bool tmp_is_leftover(const char *name, const struct stat *sb) {
  if (time(NULL) - sb->st_mtime > TMP_STALE_S) return true;
  char *end = NULL;
  long pid = strtol(name + strlen(TMP_PREFIX), &end, 10);
  if (end == NULL || *end != '-' || pid <= 0 || pid > INT_MAX) return true;
  return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

static bool is_hex_digit(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

static bool is_fanout(const char *name) {
  return is_hex_digit(name[0]) && is_hex_digit(name[1]) && name[2] == '\0';
}

static int add_found(found **v, size_t *n, size_t *cap, const char *key, const struct stat *sb) {
  if (kiln_grow((void **)v, cap, *n + 1, sizeof **v) != 0) return KILN_ENOMEM;
  found *f = &(*v)[(*n)++];
  memcpy(f->key, key, KILN_CACHE_HEX_LEN + 1);
  f->bytes = (uint64_t)sb->st_size;
  f->mtime_ns = (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
  return 0;
}

/* Walks one fan-out directory: indexes entries, removes leftovers. */
static int scan_sub(int subfd, const char *sub, found **v, size_t *n, size_t *cap) {
  DIR *dh = fdopendir(subfd);
  if (dh == NULL) {
    close(subfd);
    return 0;
  }
  struct dirent *de;
  int rc = 0;
  while (rc == 0 && (de = readdir(dh)) != NULL) {
    struct stat sb;
    if (fstatat(dirfd(dh), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0) {
      if (tmp_is_leftover(de->d_name, &sb)) unlinkat(dirfd(dh), de->d_name, 0);
    } else if (S_ISREG(sb.st_mode) && kiln__cache_hex_ok(de->d_name) &&
               strncmp(de->d_name, sub, 2) == 0) {
      rc = add_found(v, n, cap, de->d_name, &sb);
    }
  }
  closedir(dh);
  return rc;
}

static int scan(const disk_store *d, found **out, size_t *nout) {
  found *v = NULL;
  size_t n = 0, cap = 0;
  *out = NULL;
  *nout = 0;
  DIR *dh = opendir(d->dir);
  if (dh == NULL) return KILN_EIO;
  struct dirent *de;
  int rc = 0;
  while (rc == 0 && (de = readdir(dh)) != NULL) {
    if (!is_fanout(de->d_name)) continue;
    int fd = openat(dirfd(dh), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) rc = scan_sub(fd, de->d_name, &v, &n, &cap);
  }
  closedir(dh);
  if (rc != 0) {
    kiln_free(v);
    return rc;
  }
  *out = v;
  *nout = n;
  return 0;
}

static int by_mtime(const void *a, const void *b) {
  const found *x = a, *y = b;
  return (x->mtime_ns > y->mtime_ns) - (x->mtime_ns < y->mtime_ns);
}

static int by_key(const void *a, const void *b) {
  return strcmp(((const found *)a)->key, ((const found *)b)->key);
}

static int key_vs_found(const void *key, const void *f) {
  return strcmp(key, ((const found *)f)->key);
}

static void remove_file(const disk_store *d, const char *key) {
  char path[PATH_MAX];
  entry_path(d, key, path, sizeof path);
  unlink(path);
}

/* Evicts from the old end until the bound holds, sparing keep. Locked. */
static void evict_locked(disk_store *d, const kiln__lru_node *keep) {
  while (d->lru.bytes > d->max_bytes && d->lru.tail != NULL && d->lru.tail != keep) {
    remove_file(d, d->lru.tail->key);
    kiln__lru_remove(&d->lru, d->lru.tail);
    d->evictions++;
  }
}

/* Brings the index in line with the directory: files others wrote join at
 * the old end, files gone are dropped, then the bound is enforced. */
static int rescan(disk_store *d) {
  found *v = NULL;
  size_t n = 0;
  int rc = scan(d, &v, &n);
  if (rc != 0) return rc;
  if (n > 1) qsort(v, n, sizeof *v, by_mtime);
  pthread_mutex_lock(&d->mu);
  /* Oldest first through add_oldest would invert them: add newest first. */
  for (size_t i = n; i-- > 0;) {
    kiln__lru_node *node = kiln__lru_find(&d->lru, v[i].key);
    if (node)
      kiln__lru_set_bytes(&d->lru, node, v[i].bytes);
    else
      kiln__lru_add_oldest(&d->lru, v[i].key, v[i].bytes);
  }
  /* Indexed but not seen: gone, unless a put renamed it in after the scan
   * passed its directory; only those few cost a stat. */
  if (n > 1) qsort(v, n, sizeof *v, by_key);
  kiln__lru_node *node = d->lru.head;
  while (node) {
    kiln__lru_node *next = node->next;
    if (n == 0 || bsearch(node->key, v, n, sizeof *v, key_vs_found) == NULL) {
      char path[PATH_MAX];
      struct stat sb;
      entry_path(d, node->key, path, sizeof path);
      if (lstat(path, &sb) != 0 && errno == ENOENT) kiln__lru_remove(&d->lru, node);
    }
    node = next;
  }
  evict_locked(d, NULL);
  d->puts_since_scan = 0;
  d->last_scan_ns = mono_ns();
  pthread_mutex_unlock(&d->mu);
  kiln_free(v);
  return 0;
}

/* Opens the entry file of key for reading, -1 with errno when there is
 * none. Anyone able to write the directory could have left anything at an
 * entry path: neither the fan-out directory nor the file may be a symbolic
 * link (O_NOFOLLOW on both), and O_NONBLOCK keeps open() from waiting for a
 * writer on a FIFO or for a device; the caller's fstat() then refuses
 * whatever is not a regular file. */
static int open_entry(const disk_store *d, const char *key) {
  char sub[PATH_MAX];
  snprintf(sub, sizeof sub, "%s/%.2s", d->dir, key);
  int dfd = open(sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return -1;
  int fd = openat(dfd, key, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  int e = errno;
  close(dfd);
  errno = e;
  return fd;
}

/* Reads the whole entry file of key; KILN_ENOTFOUND when it is absent or is
 * no regular file that could be an entry (a link, a FIFO, a device, a
 * directory: left where it is, a miss). */
static int read_entry(const disk_store *d, const char *key, bool touch, uint8_t **val, size_t *len,
                      kiln_status *st) {
  char path[PATH_MAX];
  entry_path(d, key, path, sizeof path);
  int fd = open_entry(d, key);
  if (fd < 0) {
    if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR || errno == ENXIO ||
        errno == EWOULDBLOCK || errno == ENODEV)
      return KILN_ENOTFOUND;
    return kiln_status_set(st, KILN_EIO, "cache disk", "open %s: %s", path, strerror(errno));
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > d->max_bytes) {
    close(fd);
    return KILN_ENOTFOUND;
  }
  size_t size = (size_t)sb.st_size, got = 0;
  uint8_t *buf = kiln_malloc(size ? size : 1);
  if (buf == NULL) {
    close(fd);
    return kiln_status_set(st, KILN_ENOMEM, "cache disk", "reading %zu bytes", size);
  }
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      close(fd);
      kiln_free(buf);
      return kiln_status_set(st, KILN_EIO, "cache disk", "read %s: %s", path, strerror(e));
    }
    if (r == 0) break; /* shorter than stat said: the entry check will refuse it */
    got += (size_t)r;
  }
  /* Recency for the next open's scan; fails harmlessly on others' files. */
  struct timespec now[2] = {{.tv_nsec = UTIME_NOW}, {.tv_nsec = UTIME_NOW}};
  if (touch) futimens(fd, now);
  close(fd);
  *val = buf;
  *len = got;
  return 0;
}

static int disk_get(kiln_cache_store *s, const char *key, uint8_t **val, size_t *len,
                    kiln_status *st) {
  disk_store *d = (disk_store *)s;
  *val = NULL;
  *len = 0;
  if (!kiln__cache_hex_ok(key)) return bad_key(st);
  int rc = read_entry(d, key, true, val, len, st);
  pthread_mutex_lock(&d->mu);
  kiln__lru_node *n = kiln__lru_find(&d->lru, key);
  if (rc == 0) {
    d->hits++;
    if (n == NULL)
      n = kiln__lru_add(&d->lru, key, *len);
    else
      kiln__lru_set_bytes(&d->lru, n, *len);
    if (n) kiln__lru_touch(&d->lru, n);
  } else {
    d->misses++;
    if (rc == KILN_ENOTFOUND && n) kiln__lru_remove(&d->lru, n);
  }
  pthread_mutex_unlock(&d->mu);
  return rc;
}

static int write_all(int fd, const uint8_t *p, size_t len) {
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

/* Opens the fan-out directory of key, creating it when missing; a link
 * there is refused (ELOOP or ENOTDIR), never written through. */
static int open_sub(const char *sub) {
  int dfd = open(sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0 && errno == ENOENT) {
    /* The fan-out directory (or the whole cache directory) is missing. */
    int e = mkdir_p(sub);
    if (e != 0) {
      errno = e;
      return -1;
    }
    dfd = open(sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  }
  return dfd;
}

/* Writes val to a fresh temporary file next to path and renames it there,
 * every step relative to the fan-out directory opened once. */
static int write_atomic(disk_store *d, const char *key, const char *path, const uint8_t *val,
                        size_t len, kiln_status *st) {
  char sub[PATH_MAX], tmp[128];
  snprintf(sub, sizeof sub, "%s/%.2s", d->dir, key);
  pthread_mutex_lock(&d->mu);
  uint64_t seq = ++d->tmp_seq;
  pthread_mutex_unlock(&d->mu);
  uint32_t r = 0;
  if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) r = (uint32_t)mono_ns();
  snprintf(tmp, sizeof tmp, TMP_PREFIX "%ld-%llu-%08x", (long)getpid(), (unsigned long long)seq, r);
  int dfd = open_sub(sub);
  if (dfd < 0)
    return kiln_status_set(st, KILN_EIO, "cache disk", "directory %s: %s", sub, strerror(errno));
  int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    int e = errno;
    close(dfd);
    return kiln_status_set(st, KILN_EIO, "cache disk", "create %s/%s: %s", sub, tmp, strerror(e));
  }
  int e = write_all(fd, val, len);
  if (e == 0 && fsync(fd) != 0) e = errno;
  if (close(fd) != 0 && e == 0) e = errno;
  if (e == 0 && renameat(dfd, tmp, dfd, key) != 0) e = errno;
  if (e != 0) unlinkat(dfd, tmp, 0);
  close(dfd);
  if (e != 0)
    return kiln_status_set(st, KILN_EIO, "cache disk", "writing %s: %s", path, strerror(e));
  return 0;
}

static int disk_put(kiln_cache_store *s, const char *key, const uint8_t *val, size_t len,
                    kiln_status *st) {
  disk_store *d = (disk_store *)s;
  if (!kiln__cache_hex_ok(key)) return bad_key(st);
  char path[PATH_MAX];
  entry_path(d, key, path, sizeof path);
  if ((uint64_t)len > d->max_bytes) {
    /* Not stored; an older value under this key is stale now. */
    unlink(path);
    pthread_mutex_lock(&d->mu);
    kiln__lru_node *old = kiln__lru_find(&d->lru, key);
    if (old) kiln__lru_remove(&d->lru, old);
    pthread_mutex_unlock(&d->mu);
    return 0;
  }
  int rc = write_atomic(d, key, path, val, len, st);
  if (rc != 0) return rc;
  pthread_mutex_lock(&d->mu);
  d->puts++;
  kiln__lru_node *n = kiln__lru_find(&d->lru, key);
  if (n) {
    kiln__lru_set_bytes(&d->lru, n, len);
    kiln__lru_touch(&d->lru, n);
  } else {
    n = kiln__lru_add(&d->lru, key, len);
  }
  evict_locked(d, n);
  bool stale = ++d->puts_since_scan >= RESCAN_PUTS || mono_ns() - d->last_scan_ns > RESCAN_NS;
  if (stale) {
    /* Claimed here so that concurrent puts do not all rescan. */
    d->puts_since_scan = 0;
    d->last_scan_ns = mono_ns();
  }
  pthread_mutex_unlock(&d->mu);
  if (stale) rescan(d);
  return 0;
}

static int disk_del(kiln_cache_store *s, const char *key, kiln_status *st) {
  disk_store *d = (disk_store *)s;
  if (!kiln__cache_hex_ok(key)) return bad_key(st);
  char path[PATH_MAX];
  entry_path(d, key, path, sizeof path);
  int rc = 0;
  if (unlink(path) != 0) {
    rc = errno == ENOENT
             ? KILN_ENOTFOUND
             : kiln_status_set(st, KILN_EIO, "cache disk", "unlink %s: %s", path, strerror(errno));
  }
  pthread_mutex_lock(&d->mu);
  kiln__lru_node *n = kiln__lru_find(&d->lru, key);
  if (n) kiln__lru_remove(&d->lru, n);
  pthread_mutex_unlock(&d->mu);
  return rc;
}

/* Lists what is on disk now (a rescan first), newest first; fn runs
 * unlocked and may call back into the store. */
static int disk_list(kiln_cache_store *s, kiln_cache_list_fn fn, void *ctx, kiln_status *st) {
  disk_store *d = (disk_store *)s;
  rescan(d);
  pthread_mutex_lock(&d->mu);
  size_t n = d->lru.n, i = 0;
  char(*keys)[KILN_CACHE_HEX_LEN + 1] = kiln_malloc((n ? n : 1) * sizeof *keys);
  if (keys == NULL) {
    pthread_mutex_unlock(&d->mu);
    return kiln_status_set(st, KILN_ENOMEM, "cache disk", "listing %zu entries", n);
  }
  for (kiln__lru_node *node = d->lru.head; node && i < n; node = node->next)
    memcpy(keys[i++], node->key, KILN_CACHE_HEX_LEN + 1);
  pthread_mutex_unlock(&d->mu);
  int rc = 0;
  for (size_t k = 0; k < i; k++) {
    uint8_t *val = NULL;
    size_t len = 0;
    /* Listing is no use: recency stays as it was. */
    if (read_entry(d, keys[k], false, &val, &len, NULL) != 0) continue; /* vanished meanwhile */
    int stop = fn(ctx, keys[k], val, len);
    kiln_free(val);
    if (stop) break;
  }
  kiln_free(keys);
  return rc;
}

static void disk_stats(kiln_cache_store *s, kiln_cache_store_stats *out) {
  disk_store *d = (disk_store *)s;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&d->mu);
  out->hits = d->hits;
  out->misses = d->misses;
  out->puts = d->puts;
  out->evictions = d->evictions;
  out->bytes = d->lru.bytes;
  out->entries = d->lru.n;
  pthread_mutex_unlock(&d->mu);
  out->up = true;
}

static void disk_destroy(kiln_cache_store *s) {
  disk_store *d = (disk_store *)s;
  kiln__lru_free(&d->lru);
  pthread_mutex_destroy(&d->mu);
  kiln_free(d->dir);
  kiln_free(d);
}

static const kiln_cache_store_ops disk_ops = {
    .name = "disk",
    .get = disk_get,
    .put = disk_put,
    .del = disk_del,
    .list = disk_list,
    .stats = disk_stats,
    .try_lock = NULL,
    .take_over = NULL,
    .unlock = NULL,
    .locked = NULL,
    .destroy = disk_destroy,
};

int kiln_cache_disk_create(const char *dir, uint64_t max_bytes, kiln_cache_store **out,
                           kiln_status *st) {
  *out = NULL;
  if (dir == NULL || dir[0] == '\0')
    return kiln_status_set(st, KILN_EINVAL, "cache disk", "no directory given");
  /* Room for "/ab/<64 hex>" and a temporary name after the directory. */
  if (strlen(dir) > PATH_MAX - 160)
    return kiln_status_set(st, KILN_EINVAL, "cache disk", "directory path of %zu bytes is too long",
                           strlen(dir));
  int e = mkdir_p(dir);
  if (e != 0)
    return kiln_status_set(st, KILN_EIO, "cache disk", "cannot create directory %s: %s", dir,
                           strerror(e));
  disk_store *d = kiln_calloc(1, sizeof *d);
  char *copy = kiln_strdup(dir);
  if (d == NULL || copy == NULL) {
    kiln_free(d);
    kiln_free(copy);
    return kiln_status_set(st, KILN_ENOMEM, "cache disk", "creating the store");
  }
  size_t n = strlen(copy);
  while (n > 1 && copy[n - 1] == '/') copy[--n] = '\0';
  d->base.ops = &disk_ops;
  d->dir = copy;
  d->max_bytes = max_bytes;
  kiln__lru_init(&d->lru);
  pthread_mutex_init(&d->mu, NULL);
  int rc = rescan(d);
  if (rc != 0) {
    disk_destroy(&d->base);
    return kiln_status_set(st, rc, "cache disk", "cannot scan directory %s", dir);
  }
  *out = &d->base;
  return 0;
}
