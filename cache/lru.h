/* An LRU index keyed by cache key hex: the bookkeeping the memory and disk
 * stores share (internal to cache/).
 *
 * A chained hash table finds a node by key; a doubly linked list orders the
 * nodes from most (head) to least (tail) recently used. The index owns no
 * values and takes no lock: the memory store hangs its value off each node,
 * the disk store only sizes; each store guards its index with its own mutex.
 * Keys are hashed with FNV-1a under a random per-index seed, so keys chosen
 * by a client cannot force every node into one chain.
 */
#ifndef KILN_CACHE_LRU_H
#define KILN_CACHE_LRU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/key.h"

typedef struct kiln__lru_node {
  char key[KILN_CACHE_HEX_LEN + 1];
  uint64_t hash;
  uint64_t bytes;                     /* what the node counts against the bound */
  void *val;                          /* the store's own data (memory: the value), or NULL */
  struct kiln__lru_node *prev, *next; /* recency list */
  struct kiln__lru_node *chain;       /* hash bucket */
} kiln__lru_node;

typedef struct kiln__lru {
  kiln__lru_node **buckets;
  size_t nbuckets; /* power of two, or 0 */
  size_t n;
  uint64_t bytes; /* sum of node bytes */
  kiln__lru_node *head, *tail;
  uint64_t seed;
} kiln__lru;

void kiln__lru_init(kiln__lru *l);
/* Frees every node (not their values: the caller walks them first). */
void kiln__lru_free(kiln__lru *l);

/* True when key is exactly 64 lowercase hex digits: the only names a store
 * turns into a file name or a table entry. */
bool kiln__cache_hex_ok(const char *key);

kiln__lru_node *kiln__lru_find(const kiln__lru *l, const char *key);
/* Adds a node for key at the head (most recent), or returns NULL when out
 * of memory. The key must not be present. */
kiln__lru_node *kiln__lru_add(kiln__lru *l, const char *key, uint64_t bytes);
/* Inserts at the tail instead: for entries found on disk whose use is
 * older than everything indexed so far. */
kiln__lru_node *kiln__lru_add_oldest(kiln__lru *l, const char *key, uint64_t bytes);
void kiln__lru_touch(kiln__lru *l, kiln__lru_node *n);
void kiln__lru_set_bytes(kiln__lru *l, kiln__lru_node *n, uint64_t bytes);
/* Unlinks and frees n (the caller freed its value). */
void kiln__lru_remove(kiln__lru *l, kiln__lru_node *n);

#endif /* KILN_CACHE_LRU_H */
