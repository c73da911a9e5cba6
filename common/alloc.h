/* The one allocation hook.
 *
 * Every heap allocation in Kiln goes through these functions so that tests can
 * inject out-of-memory (fail the Nth allocation) and check that every path
 * turns it into KILN_ENOMEM instead of a crash. (Redis's zmalloc, libuv's
 * uv_replace_allocator.)
 */
#ifndef KILN_COMMON_ALLOC_H
#define KILN_COMMON_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void *kiln_malloc(size_t size);
void *kiln_calloc(size_t count, size_t size);
void *kiln_realloc(void *ptr, size_t size);
void kiln_free(void *ptr);
char *kiln_strdup(const char *s);
char *kiln_strndup(const char *s, size_t n);

/* Growth helper for arrays: makes room for `need` elements of `elem` bytes in
 * *ptr whose capacity is *cap. Returns 0 or KILN_ENOMEM (leaving *ptr intact).
 * Checks the size computation for overflow. */
int kiln_grow(void **ptr, size_t *cap, size_t need, size_t elem);

/* Test hooks (safe to arm while other threads allocate):
 * kiln_alloc_fail_after: the `n`-th allocation from now (1 = the next one)
 * and all after it fail until reset with 0. kiln_alloc_fail_once: only the
 * `n`-th fails, later ones succeed; kiln_alloc_failure_pending tells whether
 * it has not happened yet (fewer than n allocations since), which is how a
 * test that fails each allocation of an operation in turn knows it has gone
 * past the last one. */
void kiln_alloc_fail_after(long n);
void kiln_alloc_fail_once(long n);
bool kiln_alloc_failure_pending(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMMON_ALLOC_H */
