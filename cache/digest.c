/* SHA-256 and hex for cache keys: the small pieces key.c, entry.c and the
 * stores share. SHA-256 is libcrypto's one-shot EVP digest, which is
 * thread-safe and needs no initialization on OpenSSL 1.1 and later.
 */
#include <openssl/evp.h>
#include <string.h>

#include "cache/key.h"

static const char *const part_names[KILN_CACHE_NPARTS] = {
    [KILN_CACHE_PART_MODULE] = "module",   [KILN_CACHE_PART_SIGNATURE] = "signature",
    [KILN_CACHE_PART_OPTIONS] = "options", [KILN_CACHE_PART_TARGET] = "target",
    [KILN_CACHE_PART_VERSION] = "version",
};

const char *kiln_cache_part_name(int part) {
  return part >= 0 && part < KILN_CACHE_NPARTS ? part_names[part] : "?";
}

void kiln_cache_sha256(const void *data, size_t len, uint8_t out[KILN_CACHE_DIGEST_LEN]) {
  unsigned int n = 0;
  if (!EVP_Digest(data, len, out, &n, EVP_sha256(), NULL)) memset(out, 0, KILN_CACHE_DIGEST_LEN);
}

void kiln_cache_to_hex(const uint8_t *bytes, size_t len, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < len; i++) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  out[2 * len] = '\0';
}

static int nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int kiln_cache_from_hex(const char *hex, uint8_t *bytes, size_t len) {
  if (hex == NULL || strlen(hex) != 2 * len) return KILN_EINVAL;
  for (size_t i = 0; i < len; i++) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return KILN_EINVAL;
    bytes[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

/* The key is the SHA-256 of the component names and digests in order, so a
 * reordering or a renamed component can never collide with another key. */
void kiln_cache_key_from_parts(kiln_cache_key *k) {
  uint8_t buf[KILN_CACHE_NPARTS * (16 + KILN_CACHE_DIGEST_LEN)];
  size_t n = 0;
  for (int i = 0; i < KILN_CACHE_NPARTS; i++) {
    char name[16] = {0};
    strncpy(name, part_names[i], sizeof name - 1);
    memcpy(buf + n, name, sizeof name);
    n += sizeof name;
    memcpy(buf + n, k->parts[i], KILN_CACHE_DIGEST_LEN);
    n += KILN_CACHE_DIGEST_LEN;
  }
  kiln_cache_sha256(buf, n, k->digest);
  kiln_cache_to_hex(k->digest, KILN_CACHE_DIGEST_LEN, k->hex);
}

int kiln_cache_key_diff(const kiln_cache_key *a, const kiln_cache_key *b) {
  for (int i = 0; i < KILN_CACHE_NPARTS; i++)
    if (memcmp(a->parts[i], b->parts[i], KILN_CACHE_DIGEST_LEN) != 0) return i;
  return KILN_CACHE_NPARTS;
}
