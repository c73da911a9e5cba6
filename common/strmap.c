/* Open-addressing string map (linear probing, load factor <= 1/2) keyed by
 * SipHash-1-3. Slots are reused across clears by generation number; when the
 * 32-bit generation would wrap, the slots are wiped once. */
#include "common/strmap.h"

#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/status.h"

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND \
  do { \
    v0 += v1; \
    v1 = ROTL(v1, 13); \
    v1 ^= v0; \
    v0 = ROTL(v0, 32); \
    v2 += v3; \
    v3 = ROTL(v3, 16); \
    v3 ^= v2; \
    v0 += v3; \
    v3 = ROTL(v3, 21); \
    v3 ^= v0; \
    v2 += v1; \
    v1 = ROTL(v1, 17); \
    v1 ^= v2; \
    v2 = ROTL(v2, 32); \
  } while (0)

static uint64_t load64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static uint64_t siphash13(uint64_t k0, uint64_t k1, const char *key, size_t len) {
  const unsigned char *p = (const unsigned char *)key;
  uint64_t v0 = k0 ^ UINT64_C(0x736f6d6570736575), v1 = k1 ^ UINT64_C(0x646f72616e646f6d);
  uint64_t v2 = k0 ^ UINT64_C(0x6c7967656e657261), v3 = k1 ^ UINT64_C(0x7465646279746573);
  size_t full = len & ~(size_t)7;
  for (size_t i = 0; i < full; i += 8) {
    uint64_t m = load64(p + i);
    v3 ^= m;
    SIPROUND;
    v0 ^= m;
  }
  uint64_t b = (uint64_t)len << 56;
  for (size_t i = 0; i < (len & 7); i++) b |= (uint64_t)p[full + i] << (8 * i);
  v3 ^= b;
  SIPROUND;
  v0 ^= b;
  v2 ^= 0xff;
  SIPROUND;
  SIPROUND;
  SIPROUND;
  return v0 ^ v1 ^ v2 ^ v3;
}

void kiln_strmap_init(kiln_strmap *m) {
  memset(m, 0, sizeof *m);
  m->gen = 1;
  /* The key only needs to be unpredictable from outside the process:
   * address-space layout and the clock are enough for that. */
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  m->k0 = (uint64_t)(uintptr_t)m * UINT64_C(0x9e3779b97f4a7c15) ^ (uint64_t)ts.tv_nsec;
  m->k1 = (uint64_t)(uintptr_t)&kiln_strmap_init ^ ((uint64_t)ts.tv_sec << 20) ^
          (uint64_t)(uintptr_t)&ts;
}

void kiln_strmap_free(kiln_strmap *m) {
  kiln_free(m->slots);
  m->slots = NULL;
  m->cap = m->n = 0;
}

void kiln_strmap_clear(kiln_strmap *m) {
  m->n = 0;
  if (m->gen == UINT32_MAX) {
    if (m->slots) memset(m->slots, 0, m->cap * sizeof *m->slots);
    m->gen = 1;
  } else {
    m->gen++;
  }
}

static int rehash(kiln_strmap *m, size_t ncap) {
  if (ncap > SIZE_MAX / sizeof(kiln_strmap_slot)) return KILN_ENOMEM;
  kiln_strmap_slot *ns = kiln_calloc(ncap, sizeof *ns);
  if (ns == NULL) return KILN_ENOMEM;
  for (size_t i = 0; i < m->cap; i++) {
    kiln_strmap_slot *s = &m->slots[i];
    if (s->gen != m->gen) continue;
    size_t j = (size_t)s->hash & (ncap - 1);
    while (ns[j].gen == m->gen) j = (j + 1) & (ncap - 1);
    ns[j] = *s;
  }
  kiln_free(m->slots);
  m->slots = ns;
  m->cap = ncap;
  return 0;
}

int kiln_strmap_put(kiln_strmap *m, const char *key, size_t len, uint32_t value,
                    uint32_t *existing) {
  if ((m->n + 1) * 2 > m->cap) {
    if (m->cap > SIZE_MAX / 4) return KILN_ENOMEM;
    int rc = rehash(m, m->cap ? m->cap * 2 : 16);
    if (rc) return rc;
  }
  uint64_t h = siphash13(m->k0, m->k1, key, len);
  size_t j = (size_t)h & (m->cap - 1);
  for (;;) {
    kiln_strmap_slot *s = &m->slots[j];
    if (s->gen != m->gen) {
      s->key = key;
      s->len = len;
      s->hash = h;
      s->value = value;
      s->gen = m->gen;
      m->n++;
      return 0;
    }
    if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
      if (existing) *existing = s->value;
      return 1;
    }
    j = (j + 1) & (m->cap - 1);
  }
}

bool kiln_strmap_get(const kiln_strmap *m, const char *key, size_t len, uint32_t *value) {
  if (m->cap == 0) return false;
  uint64_t h = siphash13(m->k0, m->k1, key, len);
  size_t j = (size_t)h & (m->cap - 1);
  for (;;) {
    const kiln_strmap_slot *s = &m->slots[j];
    if (s->gen != m->gen) return false;
    if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
      if (value) *value = s->value;
      return true;
    }
    j = (j + 1) & (m->cap - 1);
  }
}
