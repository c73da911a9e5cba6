/* A cache tier: one storage vtable, three implementations.
 *
 *   memory  in-process LRU bounded in bytes (memory.c)
 *   disk    a local directory bounded in bytes; writes go to a temporary
 *           file renamed into place, so a crash mid-write leaves no entry
 *           (disk.c)
 *   redis   hiredis, one Redis key per entry with a TTL, on one Redis, a
 *           Redis Cluster or a Sentinel-watched primary; faults (down,
 *           slow, restarted, full, failing over) are counted and reported
 *           as KILN_EUNAVAIL, never block past the configured timeout, and
 *           background threads reconnect and follow the topology (redis.c)
 *
 * Keys are the 64 lowercase hex digits of a cache key. Values are sealed
 * entries (cache/entry.h); stores do not interpret them. Every operation is
 * thread-safe.
 */
#ifndef KILN_CACHE_STORE_H
#define KILN_CACHE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_cache_store kiln_cache_store;

typedef struct kiln_cache_store_stats {
  uint64_t hits, misses;
  uint64_t puts;
  uint64_t evictions; /* removed to stay within the byte bound */
  uint64_t bytes;     /* held now (memory, disk; redis: unknown, 0) */
  uint64_t entries;   /* held now (memory, disk) */
  uint64_t faults;    /* redis: failed operations (down, timeout, OOM, protocol) */
  bool up;            /* redis: connected now; others always true */
} kiln_cache_store_stats;

/* One Redis server of the shared tier, as a store sees it. */
typedef struct kiln_cache_node_stats {
  char addr[280]; /* "HOST:PORT" or "unix:PATH" */
  bool up;        /* connected now */
  uint32_t slots; /* hash slots it serves as primary (0: a node known but serving none) */
  uint64_t requests, errors, redirects;
  uint64_t latency_us; /* summed over requests */
} kiln_cache_node_stats;

/* Called per listed entry; a nonzero return stops the listing. */
typedef int (*kiln_cache_list_fn)(void *ctx, const char *key_hex, const uint8_t *val, size_t len);

typedef struct kiln_cache_store_ops {
  const char *name; /* "memory", "disk", "redis" */
  /* 0 with *val (kiln_malloc'd) on a hit; KILN_ENOTFOUND on a miss;
   * another code on a fault. */
  int (*get)(kiln_cache_store *s, const char *key_hex, uint8_t **val, size_t *len, kiln_status *st);
  int (*put)(kiln_cache_store *s, const char *key_hex, const uint8_t *val, size_t len,
             kiln_status *st);
  /* 0 when removed, KILN_ENOTFOUND when absent. */
  int (*del)(kiln_cache_store *s, const char *key_hex, kiln_status *st);
  /* Local stores list every entry; redis may leave this NULL. */
  int (*list)(kiln_cache_store *s, kiln_cache_list_fn fn, void *ctx, kiln_status *st);
  void (*stats)(kiln_cache_store *s, kiln_cache_store_stats *out);
  /* Cross-server single flight (redis only; NULL elsewhere). try_lock sets
   * *acquired when this caller now holds the lock of key_hex for ttl_ms,
   * under token (a lock found without an expiry is a leftover and is taken
   * over); take_over sets it to token for ttl_ms whoever holds it (for a
   * lock held past the longest a builder may hold one); unlock removes it
   * only if token still holds it. */
  int (*try_lock)(kiln_cache_store *s, const char *key_hex, const char *token, uint32_t ttl_ms,
                  bool *acquired, kiln_status *st);
  int (*take_over)(kiln_cache_store *s, const char *key_hex, const char *token, uint32_t ttl_ms,
                   kiln_status *st);
  int (*unlock)(kiln_cache_store *s, const char *key_hex, const char *token, kiln_status *st);
  /* Whether the lock of key_hex is held by anyone with an expiry (redis
   * only): a lock without one counts as free. */
  int (*locked)(kiln_cache_store *s, const char *key_hex, bool *held, kiln_status *st);
  /* The servers behind the store, up to cap of them into out; returns how
   * many there are (redis only; NULL elsewhere). */
  size_t (*nodes)(kiln_cache_store *s, kiln_cache_node_stats *out, size_t cap);
  void (*destroy)(kiln_cache_store *s);
} kiln_cache_store_ops;

struct kiln_cache_store {
  const kiln_cache_store_ops *ops;
};

/* In-process LRU holding at most max_bytes of values. */
int kiln_cache_memory_create(uint64_t max_bytes, kiln_cache_store **out, kiln_status *st);

/* A directory (created 0700 if missing) holding at most max_bytes. Leftover
 * temporary files from a crash are removed at open. */
int kiln_cache_disk_create(const char *dir, uint64_t max_bytes, kiln_cache_store **out,
                           kiln_status *st);

typedef struct kiln_cache_redis_config {
  /* "host:port", "redis://[:password@]host:port[/db]", "unix:/path/sock[?db=N]"
   * or "/path/sock" (one Redis); "redis-cluster://[:password@]host:port[,...]"
   * (seed nodes of a Redis Cluster); "redis-sentinel://[:password@]host:port[,...]/MASTER"
   * (sentinels and the master set they watch; the password is the data
   * nodes'). password and db may also be given below. */
  const char *url;
  const char *password; /* NULL: none (or from url) */
  int db;               /* -1: from url, else 0 */
  uint32_t ttl_s;       /* entry TTL; 0: none */
  uint32_t timeout_ms;  /* per operation and per connect; 0: 200 */
  const char *prefix;   /* key prefix; NULL: "kiln:v1:" */
  uint32_t pool;        /* connections; 0: 4 */
} kiln_cache_redis_config;

/* Parses the URL (errors name what is wrong) and starts; a Redis that is
 * down at start is not an error: the store reports faults and reconnects. */
int kiln_cache_redis_create(const kiln_cache_redis_config *cfg, kiln_cache_store **out,
                            kiln_status *st);

static inline void kiln_cache_store_destroy(kiln_cache_store *s) {
  if (s) s->ops->destroy(s);
}

#ifdef __cplusplus
}
#endif
#endif /* KILN_CACHE_STORE_H */
