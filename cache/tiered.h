/* Internals of the tiered cache shared by tiered.c (tiers, lookups,
 * stores, listing, the secret) and flight.c (get_or_build: single flight in
 * this process and across servers). Not a public header.
 */
#ifndef KILN_CACHE_TIERED_H
#define KILN_CACHE_TIERED_H

#include <pthread.h>

#include "cache/cache.h"

typedef struct kiln__flight kiln__flight;

struct kiln_cache {
  kiln_cache_store *tier[KILN_CACHE_NTIERS]; /* NULL: tier disabled */
  kiln_cache_secret secret;
  uint64_t min_compile_ns;
  uint32_t lock_ttl_ms, wait_poll_ms;

  pthread_mutex_t mu; /* guards the counters and the flight table below */
  /* The cache's own view of each tier: a hit is a valid entry handed out,
   * a miss a request that found nothing usable there. Store counters also
   * see promotions, rechecks and lock polling, so these replace them. */
  uint64_t hits[KILN_CACHE_NTIERS], misses[KILN_CACHE_NTIERS];
  uint64_t rejects[KILN_CACHE_NREJECTS];
  uint64_t builds, single_flight_waits, lock_waits, compile_ns_saved, skipped_fast;
  uint64_t lock_takeovers; /* locks held past their expiry, or without one, taken over */
  kiln__flight *flights;   /* builds in progress in this process, by key */
};

/* Tier sets for kiln__cache_lookup. */
#define KILN__TIERS_LOCAL ((1u << KILN_CACHE_TIER_MEMORY) | (1u << KILN_CACHE_TIER_DISK))
#define KILN__TIERS_ALL (KILN__TIERS_LOCAL | (1u << KILN_CACHE_TIER_REDIS))

/* Looks key up in the tiers of mask, nearest first: on a valid entry fills
 * res (payload kiln_malloc'd, source the tier), promotes it to the nearer
 * enabled tiers and returns 0; otherwise KILN_ENOTFOUND. Rejected entries
 * are counted and deleted; faults are misses. With count, hits, misses
 * and compile_ns_saved are counted. */
int kiln__cache_lookup(kiln_cache *c, const uint8_t digest[KILN_CACHE_DIGEST_LEN], unsigned mask,
                       bool count, kiln_cache_result *res);

/* Fetches key from redis alone, verifying and promoting like a lookup but
 * counting nothing but rejects: 0 with res filled, KILN_ENOTFOUND, or the
 * store's fault code. */
int kiln__cache_redis_fetch(kiln_cache *c, const uint8_t digest[KILN_CACHE_DIGEST_LEN],
                            kiln_cache_result *res);

/* Seals and writes to every enabled tier; store failures are ignored (a
 * cache that cannot store still serves). */
void kiln__cache_store_all(kiln_cache *c, const kiln_cache_meta *meta, const void *payload,
                           size_t len);
/* The same, memory and disk only. */
void kiln__cache_store_local(kiln_cache *c, const kiln_cache_meta *meta, const void *payload,
                             size_t len);

/* Removes key from every enabled tier (a refresh whose build is too fast to
 * store must not leave the old entry behind). */
void kiln__cache_forget(kiln_cache *c, const char *hex);

int64_t kiln__cache_mono_ns(void);

#endif /* KILN_CACHE_TIERED_H */
