/* The memory tier: an in-process LRU bounded in bytes.
 *
 * Values live on the nodes of an LRU index (lru.h) under one mutex. A put
 * that would take the store past its bound evicts from the least recently
 * used end until it fits; a value larger than the whole bound is not stored
 * at all, since keeping it would mean evicting everything else for one
 * entry that cannot fit anyway. get hands out a copy, so an eviction never
 * frees bytes a caller still reads.
 */
#include <pthread.h>
#include <string.h>

#include "cache/lru.h"
#include "cache/store.h"
#include "common/alloc.h"

typedef struct mem_store {
  kiln_cache_store base;
  pthread_mutex_t mu;
  kiln__lru lru; /* node bytes = value length; node val = the value */
  uint64_t max_bytes;
  uint64_t hits, misses, puts, evictions;
} mem_store;

static int bad_key(const char *key, kiln_status *st) {
  return kiln_status_set(st, KILN_EINVAL, "cache memory", "key is not 64 lowercase hex digits");
}

static int mem_get(kiln_cache_store *s, const char *key, uint8_t **val, size_t *len,
                   kiln_status *st) {
  mem_store *m = (mem_store *)s;
  *val = NULL;
  *len = 0;
  if (!kiln__cache_hex_ok(key)) return bad_key(key, st);
  pthread_mutex_lock(&m->mu);
  kiln__lru_node *n = kiln__lru_find(&m->lru, key);
  if (n == NULL) {
    m->misses++;
    pthread_mutex_unlock(&m->mu);
    return KILN_ENOTFOUND;
  }
  uint8_t *copy = kiln_malloc(n->bytes ? n->bytes : 1);
  if (copy == NULL) {
    pthread_mutex_unlock(&m->mu);
    return kiln_status_set(st, KILN_ENOMEM, "cache memory", "copying %llu bytes",
                           (unsigned long long)n->bytes);
  }
  memcpy(copy, n->val, n->bytes);
  *val = copy;
  *len = n->bytes;
  kiln__lru_touch(&m->lru, n);
  m->hits++;
  pthread_mutex_unlock(&m->mu);
  return 0;
}

static void drop(mem_store *m, kiln__lru_node *n) {
  kiln_free(n->val);
  kiln__lru_remove(&m->lru, n);
}

static int mem_put(kiln_cache_store *s, const char *key, const uint8_t *val, size_t len,
                   kiln_status *st) {
  mem_store *m = (mem_store *)s;
  if (!kiln__cache_hex_ok(key)) return bad_key(key, st);
  if ((uint64_t)len > m->max_bytes) {
    /* Too large for the tier; an older value under this key is stale now. */
    pthread_mutex_lock(&m->mu);
    kiln__lru_node *old = kiln__lru_find(&m->lru, key);
    if (old) drop(m, old);
    pthread_mutex_unlock(&m->mu);
    return 0;
  }
  uint8_t *copy = kiln_malloc(len ? len : 1);
  if (copy == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "cache memory", "storing %zu bytes", len);
  if (len) memcpy(copy, val, len);
  pthread_mutex_lock(&m->mu);
  kiln__lru_node *n = kiln__lru_find(&m->lru, key);
  if (n) {
    kiln_free(n->val);
    kiln__lru_set_bytes(&m->lru, n, len);
    kiln__lru_touch(&m->lru, n);
  } else if ((n = kiln__lru_add(&m->lru, key, len)) == NULL) {
    pthread_mutex_unlock(&m->mu);
    kiln_free(copy);
    return kiln_status_set(st, KILN_ENOMEM, "cache memory", "indexing an entry");
  }
  n->val = copy;
  m->puts++;
  while (m->lru.bytes > m->max_bytes && m->lru.tail != n) {
    drop(m, m->lru.tail);
    m->evictions++;
  }
  pthread_mutex_unlock(&m->mu);
  return 0;
}

static int mem_del(kiln_cache_store *s, const char *key, kiln_status *st) {
  mem_store *m = (mem_store *)s;
  if (!kiln__cache_hex_ok(key)) return bad_key(key, st);
  pthread_mutex_lock(&m->mu);
  kiln__lru_node *n = kiln__lru_find(&m->lru, key);
  if (n) drop(m, n);
  pthread_mutex_unlock(&m->mu);
  return n ? 0 : KILN_ENOTFOUND;
}

/* fn runs with the store locked, in recency order (newest first): it must
 * not call back into this store. */
static int mem_list(kiln_cache_store *s, kiln_cache_list_fn fn, void *ctx, kiln_status *st) {
  mem_store *m = (mem_store *)s;
  pthread_mutex_lock(&m->mu);
  for (kiln__lru_node *n = m->lru.head; n; n = n->next)
    if (fn(ctx, n->key, n->val, n->bytes) != 0) break;
  pthread_mutex_unlock(&m->mu);
  return 0;
}

static void mem_stats(kiln_cache_store *s, kiln_cache_store_stats *out) {
  mem_store *m = (mem_store *)s;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&m->mu);
  out->hits = m->hits;
  out->misses = m->misses;
  out->puts = m->puts;
  out->evictions = m->evictions;
  out->bytes = m->lru.bytes;
  out->entries = m->lru.n;
  pthread_mutex_unlock(&m->mu);
  out->up = true;
}

static void mem_destroy(kiln_cache_store *s) {
  mem_store *m = (mem_store *)s;
  for (kiln__lru_node *n = m->lru.head; n; n = n->next) kiln_free(n->val);
  kiln__lru_free(&m->lru);
  pthread_mutex_destroy(&m->mu);
  kiln_free(m);
}

static const kiln_cache_store_ops mem_ops = {
    .name = "memory",
    .get = mem_get,
    .put = mem_put,
    .del = mem_del,
    .list = mem_list,
    .stats = mem_stats,
    .try_lock = NULL,
    .take_over = NULL,
    .unlock = NULL,
    .locked = NULL,
    .destroy = mem_destroy,
};

int kiln_cache_memory_create(uint64_t max_bytes, kiln_cache_store **out, kiln_status *st) {
  *out = NULL;
  mem_store *m = kiln_calloc(1, sizeof *m);
  if (m == NULL) return kiln_status_set(st, KILN_ENOMEM, "cache memory", "creating the store");
  m->base.ops = &mem_ops;
  m->max_bytes = max_bytes;
  kiln__lru_init(&m->lru);
  pthread_mutex_init(&m->mu, NULL);
  *out = &m->base;
  return 0;
}
