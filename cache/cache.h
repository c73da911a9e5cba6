/* The executable cache: tiers, integrity, single flight.
 *
 * A kiln_cache combines up to three stores (memory -> disk -> redis):
 * read-through with promotion (a disk hit is copied to memory, a redis hit
 * to disk and memory), write-through to every tier. Every value is a sealed
 * entry (cache/entry.h); one that fails its checks is a miss, is counted by
 * reason, is deleted from the tier that held it, and is never returned.
 *
 * kiln_cache_get_or_build is the one entry point a compile path needs: it
 * returns the payload from the nearest tier, or waits for a concurrent
 * build of the same key (in this process; across processes through a Redis
 * lock with a deadline), or calls build itself and stores the result when
 * the build took at least min_compile_ns. Redis faults never fail it: the
 * local tiers and a local build serve instead.
 */
#ifndef KILN_CACHE_CACHE_H
#define KILN_CACHE_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/entry.h"
#include "cache/key.h"
#include "cache/store.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_cache kiln_cache;

typedef struct kiln_cache_config {
  uint64_t memory_bytes; /* 0: no memory tier */
  const char *disk_dir;  /* NULL or "": no disk tier */
  uint64_t disk_bytes;
  kiln_cache_redis_config redis; /* redis.url NULL or "": no redis tier */
  /* KILN_CACHE_SECRET; NULL: read <disk_dir>/secret, or generate one
   * (written there 0600 when there is a disk tier). */
  const char *secret;
  uint64_t min_compile_ns; /* builds faster than this are not stored */
  uint32_t lock_ttl_ms;    /* cross-server lock lifetime; 0: 30000 */
  uint32_t wait_poll_ms;   /* how often a waiter looks for the entry; 0: 20 */
} kiln_cache_config;

void kiln_cache_config_init(kiln_cache_config *c);

int kiln_cache_create(const kiln_cache_config *cfg, kiln_cache **out, kiln_status *st);
void kiln_cache_destroy(kiln_cache *c);

typedef enum kiln_cache_source {
  KILN_CACHE_SRC_NONE,
  KILN_CACHE_SRC_MEMORY,
  KILN_CACHE_SRC_DISK,
  KILN_CACHE_SRC_REDIS,
  KILN_CACHE_SRC_COMPILED,      /* built by this call */
  KILN_CACHE_SRC_SINGLE_FLIGHT, /* built by a concurrent call it waited for: in this process,
                                 * or on another server holding the Redis lock */
} kiln_cache_source;

const char *kiln_cache_source_name(kiln_cache_source s); /* "memory", ... */

/* Builds the payload for a miss: *payload kiln_malloc'd (the cache takes
 * it), *compile_ns what building took, *kind and *peak_bytes for the meta. */
typedef int (*kiln_cache_build_fn)(void *ctx, uint8_t **payload, size_t *len, uint32_t *kind,
                                   uint64_t *peak_bytes, uint64_t *compile_ns, kiln_status *st);

typedef enum kiln_cache_policy {
  KILN_CACHE_POLICY_DEFAULT, /* read, then build and write */
  KILN_CACHE_POLICY_REFRESH, /* build and overwrite */
  KILN_CACHE_POLICY_BYPASS,  /* build; neither read nor write */
  /* read and write the local tiers (memory, disk) only, never the shared
   * one: executables holding code a client wrote (user kernels) */
  KILN_CACHE_POLICY_LOCAL,
} kiln_cache_policy;

typedef struct kiln_cache_result {
  kiln_cache_source source;
  kiln_cache_meta meta;
  uint8_t *payload; /* kiln_malloc'd; the caller frees */
  size_t len;
} kiln_cache_result;

/* deadline_ns: kiln monotonic clock (CLOCK_MONOTONIC ns) after which a
 * waiter gives up waiting and builds itself; 0 for none. On a build error
 * the error is returned (waiters on the same key then build themselves). */
int kiln_cache_get_or_build(kiln_cache *c, const kiln_cache_key *key, kiln_cache_policy policy,
                            int64_t deadline_ns, kiln_cache_build_fn build, void *ctx,
                            kiln_cache_result *res, kiln_status *st);

/* Told when a kiln_cache_get_or_build on the calling thread starts
 * waiting for another build of its key: other_server true for another
 * server holding the Redis lock, false for a concurrent call in this
 * process. The hook belongs to the thread (set it around the call, clear
 * it with NULL after); it may run under the cache's lock, so it must not
 * block or call into the cache. */
typedef void (*kiln_cache_wait_fn)(void *arg, bool other_server);
void kiln_cache_set_wait_hook(kiln_cache_wait_fn fn, void *arg);

/* Plain lookups and stores, for tools and tests. get: KILN_ENOTFOUND on a miss. */
int kiln_cache_get(kiln_cache *c, const kiln_cache_key *key, kiln_cache_result *res,
                   kiln_status *st);
int kiln_cache_put(kiln_cache *c, const kiln_cache_meta *meta, const void *payload, size_t len,
                   kiln_status *st);

typedef enum kiln_cache_tier {
  KILN_CACHE_TIER_MEMORY,
  KILN_CACHE_TIER_DISK,
  KILN_CACHE_TIER_REDIS,
  KILN_CACHE_NTIERS
} kiln_cache_tier;

#define KILN_CACHE_MAX_NODE_STATS 16

typedef struct kiln_cache_stats {
  bool enabled[KILN_CACHE_NTIERS];
  kiln_cache_store_stats tier[KILN_CACHE_NTIERS];
  uint64_t rejects[KILN_CACHE_NREJECTS]; /* integrity failures by reason */
  uint64_t builds;                       /* builds performed */
  uint64_t single_flight_waits;          /* calls that waited for another build */
  uint64_t lock_waits;                   /* waits on another server's Redis lock */
  uint64_t lock_takeovers;               /* Redis locks without expiry or past it, taken over */
  uint64_t compile_ns_saved;             /* sum of compile_ns over hits */
  uint64_t skipped_fast;                 /* builds under min_compile_ns, not stored */
  /* The shared tier's servers (its one Redis, a cluster's nodes, the
   * sentinel-named primaries), the first KILN_CACHE_MAX_NODE_STATS of them;
   * nnodes counts them all. */
  uint32_t nnodes;
  kiln_cache_node_stats nodes[KILN_CACHE_MAX_NODE_STATS];
} kiln_cache_stats;

void kiln_cache_get_stats(kiln_cache *c, kiln_cache_stats *out);

/* Local entries (memory and disk, deduplicated): meta and tiers per key. */
typedef int (*kiln_cache_entry_fn)(void *ctx, const kiln_cache_meta *meta, uint64_t bytes,
                                   bool in_memory, bool on_disk);
int kiln_cache_list(kiln_cache *c, kiln_cache_entry_fn fn, void *ctx, kiln_status *st);

/* Removes key (or every local entry when key is NULL) from the local tiers,
 * and from redis too when shared. *evicted counts removals over tiers. */
int kiln_cache_evict(kiln_cache *c, const char *key_hex, bool shared, uint64_t *evicted,
                     kiln_status *st);

/* Export files (bundle.c): the entries of keys_hex[0..nkeys) (every local
 * entry when nkeys is 0), each sealed, in one file signed with the cache
 * secret; *file kiln_malloc'd. A key the cache does not hold is
 * KILN_ENOTFOUND naming it. */
int kiln_cache_export(kiln_cache *c, const char *const *keys_hex, size_t nkeys, uint8_t **file,
                      size_t *len, uint32_t *count, kiln_status *st);
/* Checks an export file (untrusted) as a whole, then stores its entries in
 * every tier. A changed file, or one signed with another secret, is
 * KILN_EINVAL and nothing is stored. */
int kiln_cache_import(kiln_cache *c, const uint8_t *file, size_t len, uint32_t *imported,
                      kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CACHE_CACHE_H */
