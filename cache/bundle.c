/* Cache export files: a set of entries moved between servers as one signed
 * file (`kiln cache export` / `kiln cache import`).
 *
 *   "KILNCXP1"  u32 version (1)  u32 count
 *   count x { u64 length, the sealed entry (entry.c: already MAC'd) }
 *   HMAC-SHA-256 over everything before it, with the cache secret
 *
 * all little-endian. Importing checks the file's HMAC first (constant time)
 * and then opens every entry as the tiers do, so a file that was changed,
 * cut, or signed with another secret is refused as a whole with a message
 * naming what is wrong, and nothing of it is stored. Servers that share a
 * secret (a cluster, or clusters given the same KILN_CACHE_SECRET) can move
 * entries this way; others cannot, by design: an entry carries code.
 */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>

#include "cache/cache.h"
#include "cache/entry.h"
#include "cache/key.h"
#include "cache/tiered.h"
#include "common/alloc.h"

#define MAGIC "KILNCXP1"
#define VERSION 1u
#define HEAD 16
#define MAC_LEN 32

typedef struct out {
  uint8_t *p;
  size_t n, cap;
  bool failed;
} out;

static void put(out *o, const void *d, size_t n) {
  if (o->failed) return;
  if (kiln_grow((void **)&o->p, &o->cap, o->n + n + 1, 1)) {
    o->failed = true;
    return;
  }
  memcpy(o->p + o->n, d, n);
  o->n += n;
}

static void put_le(out *o, uint64_t v, int bytes) {
  uint8_t b[8];
  for (int i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
  put(o, b, (size_t)bytes);
}

static uint64_t get_le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static bool mac(const kiln_cache_secret *s, const uint8_t *d, size_t n, uint8_t m[MAC_LEN]) {
  unsigned len = 0;
  return HMAC(EVP_sha256(), s->bytes, (int)s->len, d, n, m, &len) != NULL && len == MAC_LEN;
}

/* One key's entry, resealed from what the tiers hold (checked there). */
static int add_key(kiln_cache *c, const uint8_t digest[KILN_CACHE_DIGEST_LEN], out *o,
                   uint32_t *count, kiln_status *st) {
  kiln_cache_result res;
  memset(&res, 0, sizeof res);
  if (kiln__cache_lookup(c, digest, KILN__TIERS_ALL, false, &res) != 0) {
    char hex[KILN_CACHE_HEX_LEN + 1];
    kiln_cache_to_hex(digest, KILN_CACHE_DIGEST_LEN, hex);
    return kiln_status_set(st, KILN_ENOTFOUND, hex, "no such entry in the cache");
  }
  uint8_t *sealed = NULL;
  size_t len = 0;
  int rc = kiln_cache_entry_seal(&c->secret, &res.meta, res.payload, res.len, &sealed, &len, st);
  kiln_free(res.payload);
  if (rc) return rc;
  put_le(o, len, 8);
  put(o, sealed, len);
  kiln_free(sealed);
  (*count)++;
  return 0;
}

typedef struct collect {
  uint8_t (*keys)[KILN_CACHE_DIGEST_LEN];
  size_t n, cap;
  bool failed;
} collect;

static int collect_key(void *ctx, const kiln_cache_meta *meta, uint64_t bytes, bool in_memory,
                       bool on_disk) {
  (void)bytes;
  (void)in_memory;
  (void)on_disk;
  collect *k = ctx;
  if (kiln_grow((void **)&k->keys, &k->cap, k->n + 1, sizeof *k->keys)) return k->failed = true, 1;
  memcpy(k->keys[k->n++], meta->key, KILN_CACHE_DIGEST_LEN);
  return 0;
}

int kiln_cache_export(kiln_cache *c, const char *const *keys_hex, size_t nkeys, uint8_t **file,
                      size_t *len, uint32_t *count, kiln_status *st) {
  out o = {0};
  collect all = {0};
  *count = 0;
  int rc = 0;
  put(&o, MAGIC, 8);
  put_le(&o, VERSION, 4);
  put_le(&o, 0, 4); /* the count, written at the end */
  if (nkeys == 0) {
    rc = kiln_cache_list(c, collect_key, &all, st);
    if (rc == 0 && all.failed) rc = kiln_status_set(st, KILN_ENOMEM, "export", "out of memory");
    for (size_t i = 0; rc == 0 && i < all.n; i++) rc = add_key(c, all.keys[i], &o, count, st);
  }
  for (size_t i = 0; rc == 0 && i < nkeys; i++) {
    uint8_t d[KILN_CACHE_DIGEST_LEN];
    if (kiln_cache_from_hex(keys_hex[i], d, sizeof d) != 0)
      rc = kiln_status_set(st, KILN_EINVAL, keys_hex[i], "not a cache key (64 hex digits)");
    else
      rc = add_key(c, d, &o, count, st);
  }
  kiln_free(all.keys);
  if (rc == 0 && !o.failed) {
    for (int i = 0; i < 4; i++) o.p[12 + i] = (uint8_t)(*count >> (8 * i));
    uint8_t m[MAC_LEN];
    if (!mac(&c->secret, o.p, o.n, m))
      rc = kiln_status_set(st, KILN_EINTERNAL, "export", "HMAC failed");
    else
      put(&o, m, MAC_LEN);
  }
  if (rc == 0 && o.failed) rc = kiln_status_set(st, KILN_ENOMEM, "export", "out of memory");
  if (rc) {
    kiln_free(o.p);
    return rc;
  }
  *file = o.p;
  *len = o.n;
  return 0;
}

int kiln_cache_import(kiln_cache *c, const uint8_t *file, size_t len, uint32_t *imported,
                      kiln_status *st) {
  *imported = 0;
  if (len < HEAD + MAC_LEN || memcmp(file, MAGIC, 8) != 0)
    return kiln_status_set(st, KILN_EINVAL, "import", "not a kiln cache export file");
  if (get_le(file + 8, 4) != VERSION)
    return kiln_status_set(st, KILN_EINVAL, "import",
                           "export file version %u (this server reads %u)",
                           (unsigned)get_le(file + 8, 4), VERSION);
  uint8_t m[MAC_LEN];
  if (!mac(&c->secret, file, len - MAC_LEN, m))
    return kiln_status_set(st, KILN_EINTERNAL, "import", "HMAC failed");
  if (CRYPTO_memcmp(m, file + len - MAC_LEN, MAC_LEN) != 0)
    return kiln_status_set(st, KILN_EINVAL, "import",
                           "the file's signature does not match: it was changed, cut, or "
                           "signed with another cache secret");
  uint32_t count = (uint32_t)get_le(file + 12, 4);
  size_t body = len - MAC_LEN;
  /* two passes: every entry checked before any is stored */
  for (int pass = 0; pass < 2; pass++) {
    size_t at = HEAD;
    for (uint32_t i = 0; i < count; i++) {
      if (body - at < 8 || get_le(file + at, 8) > body - at - 8)
        return kiln_status_set(st, KILN_EINVAL, "import", "entry %u runs past the end", i);
      size_t n = (size_t)get_le(file + at, 8);
      const uint8_t *e = file + at + 8;
      kiln_cache_meta meta;
      const uint8_t *payload;
      size_t plen;
      kiln_cache_reject why;
      if (kiln_cache_entry_peek(e, n, &meta) != 0)
        return kiln_status_set(st, KILN_EINVAL, "import", "entry %u is not a cache entry", i);
      int rc = kiln_cache_entry_open(&c->secret, meta.key, e, n, &meta, &payload, &plen, &why, st);
      if (rc) return rc;
      if (pass == 1) {
        if ((rc = kiln_cache_put(c, &meta, payload, plen, st))) return rc;
        (*imported)++;
      }
      at += 8 + n;
    }
    if (at != body)
      return kiln_status_set(st, KILN_EINVAL, "import", "%zu bytes follow the last entry",
                             body - at);
  }
  return 0;
}
