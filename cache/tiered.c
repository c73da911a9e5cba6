/* The tiered cache: memory -> disk -> redis behind one object.
 *
 * Reads go nearest first; a hit is verified (entry.h) before anything else
 * happens to it, then copied to the nearer tiers so the next read is
 * cheaper. A value that fails verification is counted by reason, deleted
 * from the tier that held it and treated as a miss, so one bad file or one
 * foreign Redis value costs one rebuild, never a wrong executable. Writes
 * go through to every tier; a Redis fault is a miss on read and ignored on
 * write (the store counts it), so Redis is an accelerator, never a
 * dependency. get_or_build and its single flight live in flight.c.
 *
 * The cluster secret comes from the configuration, else from
 * <disk_dir>/secret (created 0600 with 32 random bytes in hex when
 * missing, via link() so two processes starting at once agree on one),
 * else it is generated for this process only.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/lru.h"
#include "cache/tiered.h"
#include "common/alloc.h"

int64_t kiln__cache_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void kiln_cache_config_init(kiln_cache_config *c) {
  memset(c, 0, sizeof *c);
  c->memory_bytes = (uint64_t)256 << 20;
  c->disk_bytes = (uint64_t)4 << 30;
  c->redis.db = -1;
  c->redis.ttl_s = 604800;
  c->redis.timeout_ms = 200;
  c->lock_ttl_ms = 30000;
  c->wait_poll_ms = 20;
}

const char *kiln_cache_source_name(kiln_cache_source s) {
  switch (s) {
  case KILN_CACHE_SRC_NONE: return "none";
  case KILN_CACHE_SRC_MEMORY: return "memory";
  case KILN_CACHE_SRC_DISK: return "disk";
  case KILN_CACHE_SRC_REDIS: return "redis";
  case KILN_CACHE_SRC_COMPILED: return "compiled";
  case KILN_CACHE_SRC_SINGLE_FLIGHT: return "single_flight";
  }
  return "?";
}

/* ---- the secret ---------------------------------------------------------- */

static int read_secret_file(const char *path, kiln_cache_secret *sec, kiln_status *st) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return KILN_ENOTFOUND;
    return kiln_status_set(st, KILN_EIO, path, "cannot read the cache secret: %s", strerror(errno));
  }
  char buf[KILN_CACHE_SECRET_MAX + 64];
  size_t n = 0;
  for (;;) {
    ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
    if (n == sizeof buf - 1) break;
  }
  close(fd);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) n--;
  buf[n] = '\0';
  if (strlen(buf) != n)
    return kiln_status_set(st, KILN_EINVAL, path, "the cache secret file contains a NUL byte");
  int rc = kiln_cache_secret_from_string(buf, sec, NULL);
  memset(buf, 0, sizeof buf);
  if (rc != 0)
    return kiln_status_set(st, rc, path,
                           "the cache secret file holds %zu bytes, 16 to %d are needed", n,
                           KILN_CACHE_SECRET_MAX);
  return 0;
}

/* Creates <dir>/secret unless another process got there first; either way
 * ends with the secret that is in the file. */
static int make_secret_file(const char *dir, const char *path, kiln_cache_secret *sec,
                            kiln_status *st) {
  kiln_cache_secret raw;
  int rc = kiln_cache_secret_generate(&raw, st);
  if (rc != 0) return rc;
  char hex[2 * 32 + 2];
  kiln_cache_to_hex(raw.bytes, 32, hex);
  memset(&raw, 0, sizeof raw);
  strcat(hex, "\n");
  char tmp[PATH_MAX];
  int tn = snprintf(tmp, sizeof tmp, "%s/.secret-%ld-%lld", dir, (long)getpid(),
                    (long long)kiln__cache_mono_ns());
  if (tn < 0 || (size_t)tn >= sizeof tmp)
    return kiln_status_set(st, KILN_EINVAL, dir, "cache directory path too long");
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return kiln_status_set(st, KILN_EIO, tmp, "cannot create the cache secret: %s",
                           strerror(errno));
  size_t len = strlen(hex);
  bool ok = write(fd, hex, len) == (ssize_t)len && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  memset(hex, 0, sizeof hex);
  int e = ok ? (link(tmp, path) == 0 ? 0 : errno) : EIO;
  unlink(tmp);
  if (e != 0 && e != EEXIST)
    return kiln_status_set(st, KILN_EIO, path, "cannot create the cache secret: %s", strerror(e));
  return read_secret_file(path, sec, st);
}

static int load_secret(const kiln_cache_config *cfg, kiln_cache_secret *sec, kiln_status *st) {
  if (cfg->secret && cfg->secret[0]) return kiln_cache_secret_from_string(cfg->secret, sec, st);
  if (cfg->disk_dir == NULL || cfg->disk_dir[0] == '\0') return kiln_cache_secret_generate(sec, st);
  char path[PATH_MAX];
  int n = snprintf(path, sizeof path, "%s/secret", cfg->disk_dir);
  if (n < 0 || (size_t)n >= sizeof path)
    return kiln_status_set(st, KILN_EINVAL, cfg->disk_dir, "cache directory path too long");
  int rc = read_secret_file(path, sec, st);
  if (rc == KILN_ENOTFOUND) return make_secret_file(cfg->disk_dir, path, sec, st);
  return rc;
}

/* ---- create / destroy ---------------------------------------------------- */

int kiln_cache_create(const kiln_cache_config *cfg, kiln_cache **out, kiln_status *st) {
  *out = NULL;
  kiln_cache *c = kiln_calloc(1, sizeof *c);
  if (c == NULL) return kiln_status_set(st, KILN_ENOMEM, "cache", "creating the cache");
  pthread_mutex_init(&c->mu, NULL);
  c->min_compile_ns = cfg->min_compile_ns;
  c->lock_ttl_ms = cfg->lock_ttl_ms ? cfg->lock_ttl_ms : 30000;
  c->wait_poll_ms = cfg->wait_poll_ms ? cfg->wait_poll_ms : 20;
  int rc = 0;
  if (cfg->disk_dir && cfg->disk_dir[0])
    rc = kiln_cache_disk_create(cfg->disk_dir, cfg->disk_bytes, &c->tier[KILN_CACHE_TIER_DISK], st);
  if (rc == 0) rc = load_secret(cfg, &c->secret, st);
  if (rc == 0 && cfg->memory_bytes > 0)
    rc = kiln_cache_memory_create(cfg->memory_bytes, &c->tier[KILN_CACHE_TIER_MEMORY], st);
  if (rc == 0 && cfg->redis.url && cfg->redis.url[0])
    rc = kiln_cache_redis_create(&cfg->redis, &c->tier[KILN_CACHE_TIER_REDIS], st);
  if (rc != 0) {
    kiln_cache_destroy(c);
    return rc;
  }
  *out = c;
  return 0;
}

void kiln_cache_destroy(kiln_cache *c) {
  if (c == NULL) return;
  for (int t = 0; t < KILN_CACHE_NTIERS; t++) kiln_cache_store_destroy(c->tier[t]);
  pthread_mutex_destroy(&c->mu);
  memset(&c->secret, 0, sizeof c->secret);
  kiln_free(c);
}

/* ---- reads ---------------------------------------------------------------- */

static void count_reject(kiln_cache *c, kiln_cache_reject why) {
  pthread_mutex_lock(&c->mu);
  if (why > KILN_CACHE_OK && why < KILN_CACHE_NREJECTS) c->rejects[why]++;
  pthread_mutex_unlock(&c->mu);
}

/* One tier: 0 with res filled (from the sealed value, payload moved to the
 * front of the same allocation), KILN_ENOTFOUND, or the store's fault. */
static int fetch_tier(kiln_cache *c, int t, const uint8_t *digest, const char *hex,
                      kiln_cache_result *res) {
  kiln_cache_store *s = c->tier[t];
  uint8_t *val = NULL;
  size_t len = 0;
  int rc = s->ops->get(s, hex, &val, &len, NULL);
  if (rc != 0) return rc;
  kiln_cache_meta meta;
  const uint8_t *payload = NULL;
  size_t plen = 0;
  kiln_cache_reject why = KILN_CACHE_OK;
  if (kiln_cache_entry_open(&c->secret, digest, val, len, &meta, &payload, &plen, &why, NULL) !=
      0) {
    count_reject(c, why);
    s->ops->del(s, hex, NULL);
    kiln_free(val);
    return KILN_ENOTFOUND;
  }
  for (int near = 0; near < t; near++)
    if (c->tier[near]) c->tier[near]->ops->put(c->tier[near], hex, val, len, NULL);
  memmove(val, payload, plen);
  res->source = (kiln_cache_source)(KILN_CACHE_SRC_MEMORY + t);
  res->meta = meta;
  res->payload = val;
  res->len = plen;
  return 0;
}

int kiln__cache_lookup(kiln_cache *c, const uint8_t digest[KILN_CACHE_DIGEST_LEN], unsigned mask,
                       bool count, kiln_cache_result *res) {
  char hex[KILN_CACHE_HEX_LEN + 1];
  kiln_cache_to_hex(digest, KILN_CACHE_DIGEST_LEN, hex);
  for (int t = 0; t < KILN_CACHE_NTIERS; t++) {
    if (c->tier[t] == NULL || !(mask & (1u << t))) continue;
    int rc = fetch_tier(c, t, digest, hex, res);
    if (count) {
      pthread_mutex_lock(&c->mu);
      if (rc == 0) {
        c->hits[t]++;
        c->compile_ns_saved += res->meta.compile_ns;
      } else {
        c->misses[t]++;
      }
      pthread_mutex_unlock(&c->mu);
    }
    if (rc == 0) return 0;
  }
  return KILN_ENOTFOUND;
}

int kiln__cache_redis_fetch(kiln_cache *c, const uint8_t digest[KILN_CACHE_DIGEST_LEN],
                            kiln_cache_result *res) {
  if (c->tier[KILN_CACHE_TIER_REDIS] == NULL) return KILN_ENOTFOUND;
  char hex[KILN_CACHE_HEX_LEN + 1];
  kiln_cache_to_hex(digest, KILN_CACHE_DIGEST_LEN, hex);
  return fetch_tier(c, KILN_CACHE_TIER_REDIS, digest, hex, res);
}

int kiln_cache_get(kiln_cache *c, const kiln_cache_key *key, kiln_cache_result *res,
                   kiln_status *st) {
  memset(res, 0, sizeof *res);
  int rc = kiln__cache_lookup(c, key->digest, KILN__TIERS_ALL, true, res);
  if (rc != 0)
    return kiln_status_set(st, KILN_ENOTFOUND, "cache", "no valid entry for key %.16s...",
                           key->hex);
  return 0;
}

/* ---- writes --------------------------------------------------------------- */

static int store_in(kiln_cache *c, const kiln_cache_meta *meta, const void *payload, size_t len,
                    unsigned mask, kiln_status *st) {
  uint8_t *sealed = NULL;
  size_t slen = 0;
  int rc = kiln_cache_entry_seal(&c->secret, meta, payload, len, &sealed, &slen, st);
  if (rc != 0) return rc;
  char hex[KILN_CACHE_HEX_LEN + 1];
  kiln_cache_to_hex(meta->key, KILN_CACHE_DIGEST_LEN, hex);
  int first = 0;
  for (int t = 0; t < KILN_CACHE_NTIERS; t++) {
    if (c->tier[t] == NULL || !(mask & (1u << t))) continue;
    /* A redis failure is counted by the store and is nobody's error. */
    kiln_status *tst = t == KILN_CACHE_TIER_REDIS ? NULL : st;
    int trc = c->tier[t]->ops->put(c->tier[t], hex, sealed, slen, tst);
    if (trc != 0 && first == 0 && t != KILN_CACHE_TIER_REDIS) first = trc;
  }
  kiln_free(sealed);
  return first;
}

static int store_all(kiln_cache *c, const kiln_cache_meta *meta, const void *payload, size_t len,
                     kiln_status *st) {
  return store_in(c, meta, payload, len, KILN__TIERS_ALL, st);
}

void kiln__cache_store_all(kiln_cache *c, const kiln_cache_meta *meta, const void *payload,
                           size_t len) {
  store_all(c, meta, payload, len, NULL);
}

void kiln__cache_store_local(kiln_cache *c, const kiln_cache_meta *meta, const void *payload,
                             size_t len) {
  store_in(c, meta, payload, len, KILN__TIERS_LOCAL, NULL);
}

int kiln_cache_put(kiln_cache *c, const kiln_cache_meta *meta, const void *payload, size_t len,
                   kiln_status *st) {
  return store_all(c, meta, payload, len, st);
}

void kiln__cache_forget(kiln_cache *c, const char *hex) {
  for (int t = 0; t < KILN_CACHE_NTIERS; t++)
    if (c->tier[t]) c->tier[t]->ops->del(c->tier[t], hex, NULL);
}

/* ---- stats ----------------------------------------------------------------- */

void kiln_cache_get_stats(kiln_cache *c, kiln_cache_stats *out) {
  memset(out, 0, sizeof *out);
  for (int t = 0; t < KILN_CACHE_NTIERS; t++) {
    out->enabled[t] = c->tier[t] != NULL;
    if (c->tier[t]) c->tier[t]->ops->stats(c->tier[t], &out->tier[t]);
  }
  kiln_cache_store *shared = c->tier[KILN_CACHE_TIER_REDIS];
  if (shared && shared->ops->nodes)
    out->nnodes = (uint32_t)shared->ops->nodes(shared, out->nodes, KILN_CACHE_MAX_NODE_STATS);
  pthread_mutex_lock(&c->mu);
  for (int t = 0; t < KILN_CACHE_NTIERS; t++) {
    out->tier[t].hits = c->hits[t];
    out->tier[t].misses = c->misses[t];
  }
  memcpy(out->rejects, c->rejects, sizeof out->rejects);
  out->builds = c->builds;
  out->single_flight_waits = c->single_flight_waits;
  out->lock_waits = c->lock_waits;
  out->lock_takeovers = c->lock_takeovers;
  out->compile_ns_saved = c->compile_ns_saved;
  out->skipped_fast = c->skipped_fast;
  pthread_mutex_unlock(&c->mu);
}

/* ---- list / evict ---------------------------------------------------------- */

typedef struct listed {
  kiln_cache_meta meta;
  char hex[KILN_CACHE_HEX_LEN + 1];
  uint64_t bytes;
  bool mem, disk;
} listed;

typedef struct list_acc {
  listed *v;
  size_t n, cap;
  bool on_disk; /* which tier is being listed */
  bool keys_only;
  int rc;
} list_acc;

static int collect(void *ctx, const char *key_hex, const uint8_t *val, size_t len) {
  list_acc *a = ctx;
  kiln_cache_meta meta;
  memset(&meta, 0, sizeof meta);
  /* Unreadable entries are not listed; a get would refuse them anyway. */
  if (!a->keys_only && kiln_cache_entry_peek(val, len, &meta) != 0) return 0;
  if (kiln_grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v) != 0) {
    a->rc = KILN_ENOMEM;
    return 1;
  }
  listed *l = &a->v[a->n++];
  l->meta = meta;
  memcpy(l->hex, key_hex, KILN_CACHE_HEX_LEN + 1);
  l->bytes = len;
  l->mem = !a->on_disk;
  l->disk = a->on_disk;
  return 0;
}

static int by_hex(const void *x, const void *y) {
  return strcmp(((const listed *)x)->hex, ((const listed *)y)->hex);
}

/* Every local entry once, sorted by key, with the tiers holding it. */
static int collect_local(kiln_cache *c, bool keys_only, list_acc *a, kiln_status *st) {
  memset(a, 0, sizeof *a);
  a->keys_only = keys_only;
  for (int t = KILN_CACHE_TIER_MEMORY; t <= KILN_CACHE_TIER_DISK && a->rc == 0; t++) {
    kiln_cache_store *s = c->tier[t];
    if (s == NULL || s->ops->list == NULL) continue;
    a->on_disk = t == KILN_CACHE_TIER_DISK;
    int rc = s->ops->list(s, collect, a, st);
    if (rc != 0 && a->rc == 0) a->rc = rc;
  }
  if (a->rc != 0) {
    kiln_free(a->v);
    a->v = NULL;
    return kiln_status_set(st, a->rc, "cache", "listing local entries");
  }
  if (a->n > 1) qsort(a->v, a->n, sizeof *a->v, by_hex);
  size_t w = 0;
  for (size_t r = 0; r < a->n; r++) {
    if (w > 0 && strcmp(a->v[w - 1].hex, a->v[r].hex) == 0) {
      a->v[w - 1].mem |= a->v[r].mem;
      a->v[w - 1].disk |= a->v[r].disk;
      continue;
    }
    a->v[w++] = a->v[r];
  }
  a->n = w;
  return 0;
}

int kiln_cache_list(kiln_cache *c, kiln_cache_entry_fn fn, void *ctx, kiln_status *st) {
  list_acc a;
  int rc = collect_local(c, false, &a, st);
  if (rc != 0) return rc;
  for (size_t i = 0; i < a.n; i++)
    if (fn(ctx, &a.v[i].meta, a.v[i].bytes, a.v[i].mem, a.v[i].disk) != 0) break;
  kiln_free(a.v);
  return 0;
}

static void evict_one(kiln_cache *c, const char *hex, bool shared, uint64_t *evicted, int *fault,
                      kiln_status *st) {
  for (int t = 0; t < KILN_CACHE_NTIERS; t++) {
    kiln_cache_store *s = c->tier[t];
    if (s == NULL || (t == KILN_CACHE_TIER_REDIS && !shared)) continue;
    int rc = s->ops->del(s, hex, st);
    if (rc == 0)
      (*evicted)++;
    else if (rc != KILN_ENOTFOUND && *fault == 0)
      *fault = rc;
  }
}

int kiln_cache_evict(kiln_cache *c, const char *key_hex, bool shared, uint64_t *evicted,
                     kiln_status *st) {
  uint64_t n = 0;
  int fault = 0;
  if (evicted) *evicted = 0;
  if (key_hex) {
    uint8_t digest[KILN_CACHE_DIGEST_LEN];
    char hex[KILN_CACHE_HEX_LEN + 1];
    if (kiln_cache_from_hex(key_hex, digest, sizeof digest) != 0)
      return kiln_status_set(st, KILN_EINVAL, "cache evict", "key \"%.80s\" is not 64 hex digits",
                             key_hex);
    kiln_cache_to_hex(digest, sizeof digest, hex);
    evict_one(c, hex, shared, &n, &fault, st);
  } else {
    list_acc a;
    int rc = collect_local(c, true, &a, st);
    if (rc != 0) return rc;
    for (size_t i = 0; i < a.n; i++) evict_one(c, a.v[i].hex, shared, &n, &fault, st);
    kiln_free(a.v);
  }
  if (evicted) *evicted = n;
  if (fault != 0) return kiln_status_set(st, fault, "cache evict", "a tier failed to delete");
  return 0;
}
