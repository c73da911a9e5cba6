/* The LRU index of lru.h: a chained hash table that doubles when it holds
 * as many nodes as buckets, and an intrusive recency list. Every operation
 * is O(1) except the rare rehash.
 */
#include "cache/lru.h"

#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/alloc.h"

bool kiln__cache_hex_ok(const char *key) {
  if (key == NULL) return false;
  for (int i = 0; i < KILN_CACHE_HEX_LEN; i++) {
    char c = key[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return key[KILN_CACHE_HEX_LEN] == '\0';
}

void kiln__lru_init(kiln__lru *l) {
  memset(l, 0, sizeof *l);
  if (getrandom(&l->seed, sizeof l->seed, GRND_NONBLOCK) != (ssize_t)sizeof l->seed) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    l->seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15u ^ (uint64_t)(uintptr_t)l;
  }
}

void kiln__lru_free(kiln__lru *l) {
  kiln__lru_node *n = l->head;
  while (n) {
    kiln__lru_node *next = n->next;
    kiln_free(n);
    n = next;
  }
  kiln_free(l->buckets);
  memset(l, 0, sizeof *l);
}

static uint64_t hash_key(const kiln__lru *l, const char *key) {
  uint64_t h = 0xcbf29ce484222325u ^ l->seed;
  for (int i = 0; i < KILN_CACHE_HEX_LEN && key[i]; i++) {
    h ^= (uint8_t)key[i];
    h *= 0x100000001b3u;
  }
  return h ^ (h >> 29);
}

kiln__lru_node *kiln__lru_find(const kiln__lru *l, const char *key) {
  if (l->nbuckets == 0) return NULL;
  uint64_t h = hash_key(l, key);
  for (kiln__lru_node *n = l->buckets[h & (l->nbuckets - 1)]; n; n = n->chain)
    if (n->hash == h && strcmp(n->key, key) == 0) return n;
  return NULL;
}

static int grow(kiln__lru *l) {
  size_t nb = l->nbuckets ? l->nbuckets * 2 : 64;
  kiln__lru_node **b = kiln_calloc(nb, sizeof *b);
  if (b == NULL) return -1;
  for (size_t i = 0; i < l->nbuckets; i++) {
    kiln__lru_node *n = l->buckets[i];
    while (n) {
      kiln__lru_node *next = n->chain;
      n->chain = b[n->hash & (nb - 1)];
      b[n->hash & (nb - 1)] = n;
      n = next;
    }
  }
  kiln_free(l->buckets);
  l->buckets = b;
  l->nbuckets = nb;
  return 0;
}

static kiln__lru_node *add(kiln__lru *l, const char *key, uint64_t bytes) {
  /* A failed growth only lengthens chains while buckets exist. */
  if (l->n >= l->nbuckets && grow(l) != 0 && l->nbuckets == 0) return NULL;
  kiln__lru_node *n = kiln_calloc(1, sizeof *n);
  if (n == NULL) return NULL;
  memcpy(n->key, key, KILN_CACHE_HEX_LEN);
  n->key[KILN_CACHE_HEX_LEN] = '\0';
  n->hash = hash_key(l, n->key);
  n->bytes = bytes;
  size_t b = n->hash & (l->nbuckets - 1);
  n->chain = l->buckets[b];
  l->buckets[b] = n;
  l->n++;
  l->bytes += bytes;
  return n;
}

static void link_head(kiln__lru *l, kiln__lru_node *n) {
  n->prev = NULL;
  n->next = l->head;
  if (l->head) l->head->prev = n;
  l->head = n;
  if (l->tail == NULL) l->tail = n;
}

static void unlink_list(kiln__lru *l, kiln__lru_node *n) {
  if (n->prev)
    n->prev->next = n->next;
  else
    l->head = n->next;
  if (n->next)
    n->next->prev = n->prev;
  else
    l->tail = n->prev;
  n->prev = n->next = NULL;
}

kiln__lru_node *kiln__lru_add(kiln__lru *l, const char *key, uint64_t bytes) {
  kiln__lru_node *n = add(l, key, bytes);
  if (n) link_head(l, n);
  return n;
}

kiln__lru_node *kiln__lru_add_oldest(kiln__lru *l, const char *key, uint64_t bytes) {
  kiln__lru_node *n = add(l, key, bytes);
  if (n == NULL) return NULL;
  n->prev = l->tail;
  n->next = NULL;
  if (l->tail) l->tail->next = n;
  l->tail = n;
  if (l->head == NULL) l->head = n;
  return n;
}

void kiln__lru_touch(kiln__lru *l, kiln__lru_node *n) {
  if (l->head == n) return;
  unlink_list(l, n);
  link_head(l, n);
}

void kiln__lru_set_bytes(kiln__lru *l, kiln__lru_node *n, uint64_t bytes) {
  l->bytes = l->bytes - n->bytes + bytes;
  n->bytes = bytes;
}

void kiln__lru_remove(kiln__lru *l, kiln__lru_node *n) {
  unlink_list(l, n);
  kiln__lru_node **p = &l->buckets[n->hash & (l->nbuckets - 1)];
  while (*p && *p != n) p = &(*p)->chain;
  if (*p) *p = n->chain;
  l->n--;
  l->bytes -= n->bytes;
  kiln_free(n);
}
