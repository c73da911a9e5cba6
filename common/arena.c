/* Bump-pointer arena: a list of blocks, each at least 64 KiB; large requests
 * get a block of their own so that the slack stays small. */
#include "common/arena.h"

#include <stdint.h>
#include <string.h>

#include "common/alloc.h"

#define BLOCK_MIN (64 * 1024)
#define ALIGN 16

typedef struct block {
  struct block *next;
  size_t size; /* usable bytes in data[] */
  size_t used;
  _Alignas(ALIGN) unsigned char data[];
} block;

struct kiln_arena {
  block *head; /* current block first */
  size_t used; /* bytes handed out */
};

kiln_arena *kiln_arena_create(void) {
  kiln_arena *a = kiln_calloc(1, sizeof *a);
  return a;
}

void kiln_arena_destroy(kiln_arena *a) {
  if (a == NULL) return;
  block *b = a->head;
  while (b) {
    block *n = b->next;
    kiln_free(b);
    b = n;
  }
  kiln_free(a);
}

void kiln_arena_reset(kiln_arena *a) {
  block *keep = NULL;
  for (block *b = a->head, *n; b; b = n) {
    n = b->next;
    if (keep == NULL && b->size == BLOCK_MIN)
      keep = b;
    else
      kiln_free(b);
  }
  if (keep) {
    keep->next = NULL;
    keep->used = 0;
  }
  a->head = keep;
  a->used = 0;
}

void *kiln_arena_alloc(kiln_arena *a, size_t size) {
  if (size > SIZE_MAX - 2 * ALIGN - sizeof(block)) return NULL;
  size_t rounded = (size + ALIGN - 1) & ~(size_t)(ALIGN - 1);
  block *b = a->head;
  if (b == NULL || b->size - b->used < rounded) {
    size_t bsize = rounded > BLOCK_MIN ? rounded : BLOCK_MIN;
    block *nb = kiln_malloc(sizeof(block) + bsize);
    if (nb == NULL) return NULL;
    nb->size = bsize;
    nb->used = 0;
    if (b != NULL && rounded > BLOCK_MIN) {
      /* Keep bumping in the current block; put the big one behind it. */
      nb->next = b->next;
      b->next = nb;
    } else {
      nb->next = b;
      a->head = nb;
    }
    b = nb;
  }
  void *p = b->data + b->used;
  b->used += rounded;
  a->used += rounded;
  return p;
}

void *kiln_arena_calloc(kiln_arena *a, size_t count, size_t size) {
  if (size != 0 && count > SIZE_MAX / size) return NULL;
  void *p = kiln_arena_alloc(a, count * size);
  if (p) memset(p, 0, count * size);
  return p;
}

void *kiln_arena_memdup(kiln_arena *a, const void *src, size_t size) {
  void *p = kiln_arena_alloc(a, size);
  if (p && size) memcpy(p, src, size);
  return p;
}

char *kiln_arena_strndup(kiln_arena *a, const char *s, size_t n) {
  char *p = kiln_arena_alloc(a, n + 1);
  if (p == NULL) return NULL;
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

char *kiln_arena_strdup(kiln_arena *a, const char *s) {
  return kiln_arena_strndup(a, s, strlen(s));
}

size_t kiln_arena_used(const kiln_arena *a) { return a->used; }
