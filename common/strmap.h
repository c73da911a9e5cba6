/* A string -> uint32 hash map with open addressing, for name lookups.
 *
 * Keys are (pointer, length) byte strings that the map does not copy: they
 * must stay valid while the map is used (the parser points them into the
 * text it reads). Clearing is O(1): every slot carries the generation it was
 * written in, and a clear only bumps the generation, so one map can be reused
 * for many small scopes after one large one without quadratic cost. Keys are
 * hashed with SipHash-1-3 under a per-map key, so hostile names cannot force
 * collisions.
 */
#ifndef KILN_COMMON_STRMAP_H
#define KILN_COMMON_STRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_strmap_slot {
  const char *key;
  size_t len;
  uint64_t hash;
  uint32_t value;
  uint32_t gen; /* occupied iff gen == map.gen */
} kiln_strmap_slot;

typedef struct kiln_strmap {
  kiln_strmap_slot *slots;
  size_t cap;   /* power of two, or 0 */
  size_t n;     /* live entries of the current generation */
  uint32_t gen; /* starts at 1 */
  uint64_t k0, k1;
} kiln_strmap;

void kiln_strmap_init(kiln_strmap *m);
void kiln_strmap_free(kiln_strmap *m);
/* Forgets every entry in O(1), keeping the storage. */
void kiln_strmap_clear(kiln_strmap *m);
/* Adds key -> value. Returns 0 when added, 1 when the key was already
 * present (then *existing, if not NULL, holds its value and nothing
 * changes), or KILN_ENOMEM. */
int kiln_strmap_put(kiln_strmap *m, const char *key, size_t len, uint32_t value,
                    uint32_t *existing);
bool kiln_strmap_get(const kiln_strmap *m, const char *key, size_t len, uint32_t *value);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMMON_STRMAP_H */
