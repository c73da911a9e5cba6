/* The allocation hook: thin wrappers over libc with an injectable failure. */
#include "common/alloc.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

/* 0: never fail; n: the n-th call from now fails (and, sticky, every one
 * after it). Atomic because the server's threads all allocate while a test
 * arms it; the common case is one relaxed load. */
static _Atomic long fail_countdown;
static atomic_bool fail_sticky;

static int should_fail(void) {
  long n = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
  while (n > 0) {
    if (n == 1) {
      if (atomic_load(&fail_sticky)) return 1;
      /* Once: whoever moves it from 1 to 0 fails. */
      if (atomic_compare_exchange_weak(&fail_countdown, &n, 0)) return 1;
      continue;
    }
    if (atomic_compare_exchange_weak(&fail_countdown, &n, n - 1)) return 0;
  }
  return 0;
}

void kiln_alloc_fail_after(long n) {
  atomic_store(&fail_sticky, true);
  atomic_store(&fail_countdown, n);
}

void kiln_alloc_fail_once(long n) {
  atomic_store(&fail_sticky, false);
  atomic_store(&fail_countdown, n);
}

bool kiln_alloc_failure_pending(void) {
  return !atomic_load(&fail_sticky) && atomic_load(&fail_countdown) > 0;
}

void *kiln_malloc(size_t size) {
  if (should_fail()) return NULL;
  return malloc(size ? size : 1);
}

void *kiln_calloc(size_t count, size_t size) {
  if (should_fail()) return NULL;
  if (count == 0 || size == 0) return calloc(1, 1);
  return calloc(count, size);
}

void *kiln_realloc(void *ptr, size_t size) {
  if (should_fail()) return NULL;
  return realloc(ptr, size ? size : 1);
}

void kiln_free(void *ptr) { free(ptr); }

char *kiln_strndup(const char *s, size_t n) {
  char *d = kiln_malloc(n + 1);
  if (d == NULL) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

char *kiln_strdup(const char *s) { return kiln_strndup(s, strlen(s)); }

int kiln_grow(void **ptr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t ncap = *cap ? *cap : 8;
  while (ncap < need) {
    if (ncap > SIZE_MAX / 2) return KILN_ENOMEM;
    ncap *= 2;
  }
  if (elem != 0 && ncap > SIZE_MAX / elem) return KILN_ENOMEM;
  void *p = kiln_realloc(*ptr, ncap * elem);
  if (p == NULL) return KILN_ENOMEM;
  *ptr = p;
  *cap = ncap;
  return 0;
}
