/* Bump-pointer arenas.
 *
 * A module owns one arena; every IR node, name, shape and attribute lives in
 * it and is freed all at once with the module. Passes get a scratch arena.
 * Blocks come from the allocation hook, so out-of-memory is reported as NULL.
 */
#ifndef KILN_COMMON_ARENA_H
#define KILN_COMMON_ARENA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_arena kiln_arena;

kiln_arena *kiln_arena_create(void);
void kiln_arena_destroy(kiln_arena *a);

/* 16-byte aligned, uninitialised. NULL on out-of-memory or size overflow. */
void *kiln_arena_alloc(kiln_arena *a, size_t size);
/* Zeroed; count*size is checked for overflow. */
void *kiln_arena_calloc(kiln_arena *a, size_t count, size_t size);
void *kiln_arena_memdup(kiln_arena *a, const void *p, size_t size);
char *kiln_arena_strdup(kiln_arena *a, const char *s);
char *kiln_arena_strndup(kiln_arena *a, const char *s, size_t n);

/* Forgets everything handed out, keeping one 64 KiB block for reuse, so
 * that an arena recycled between requests allocates nothing. */
void kiln_arena_reset(kiln_arena *a);

/* Bytes handed out so far (for limits and statistics). */
size_t kiln_arena_used(const kiln_arena *a);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMMON_ARENA_H */
