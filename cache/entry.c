/* Signed cache entries: the envelope of entry.h, sealed and opened.
 *
 * Every tier stores the same bytes, and disk files and Redis values are
 * untrusted: another process, another server or an attacker with write
 * access to the directory may have put them there. So opening reads no
 * field before checking that the buffer holds it, decides on the layout
 * (magic, version) before trusting the stated payload length, compares the
 * key before spending an HMAC on the entry, and compares MACs in constant
 * time. A payload is handed out only after all four checks passed.
 */
#include "cache/entry.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <string.h>
#include <sys/random.h>

#include "common/alloc.h"

static const uint8_t magic[8] = {'K', 'I', 'L', 'N', 'C', 'E', '\r', '\n'};

/* Field offsets; the header ends where the payload starts. */
enum {
  OFF_MAGIC = 0,
  OFF_VERSION = 8,
  OFF_KIND = 12,
  OFF_KEY = 16,
  OFF_PARTS = OFF_KEY + KILN_CACHE_DIGEST_LEN,
  OFF_COMPILE_NS = OFF_PARTS + KILN_CACHE_NPARTS * KILN_CACHE_DIGEST_LEN,
  OFF_CREATED = OFF_COMPILE_NS + 8,
  OFF_PEAK = OFF_CREATED + 8,
  OFF_PLEN = OFF_PEAK + 8,
  HEADER_LEN = OFF_PLEN + 8,
  MAC_LEN = 32,
};

static const char *const reject_names[KILN_CACHE_NREJECTS] = {
    [KILN_CACHE_OK] = "ok",
    [KILN_CACHE_REJECT_TRUNCATED] = "truncated",
    [KILN_CACHE_REJECT_VERSION] = "version",
    [KILN_CACHE_REJECT_KEY] = "key",
    [KILN_CACHE_REJECT_MAC] = "mac",
};

const char *kiln_cache_reject_name(kiln_cache_reject r) {
  return (unsigned)r < KILN_CACHE_NREJECTS ? reject_names[r] : "?";
}

size_t kiln_cache_entry_overhead(void) { return HEADER_LEN + MAC_LEN; }

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static int mac_of(const kiln_cache_secret *sec, const uint8_t *data, size_t len,
                  uint8_t out[MAC_LEN]) {
  unsigned int n = 0;
  if (sec->len < 16 || sec->len > KILN_CACHE_SECRET_MAX) return KILN_EINVAL;
  if (HMAC(EVP_sha256(), sec->bytes, (int)sec->len, data, len, out, &n) == NULL || n != MAC_LEN)
    return KILN_EINTERNAL;
  return 0;
}

int kiln_cache_entry_seal(const kiln_cache_secret *sec, const kiln_cache_meta *meta,
                          const void *payload, size_t len, uint8_t **out, size_t *outlen,
                          kiln_status *st) {
  *out = NULL;
  *outlen = 0;
  if (len > SIZE_MAX - HEADER_LEN - MAC_LEN)
    return kiln_status_set(st, KILN_ERANGE, "cache entry", "payload of %zu bytes is too large",
                           len);
  size_t total = HEADER_LEN + len + MAC_LEN;
  uint8_t *buf = kiln_malloc(total);
  if (buf == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "cache entry", "sealing %zu bytes", total);
  memcpy(buf + OFF_MAGIC, magic, sizeof magic);
  put32(buf + OFF_VERSION, KILN_CACHE_ENTRY_VERSION);
  put32(buf + OFF_KIND, meta->kind);
  memcpy(buf + OFF_KEY, meta->key, KILN_CACHE_DIGEST_LEN);
  memcpy(buf + OFF_PARTS, meta->parts, sizeof meta->parts);
  put64(buf + OFF_COMPILE_NS, meta->compile_ns);
  put64(buf + OFF_CREATED, meta->created_unix_ms);
  put64(buf + OFF_PEAK, meta->peak_bytes);
  put64(buf + OFF_PLEN, (uint64_t)len);
  if (len > 0) memcpy(buf + HEADER_LEN, payload, len);
  int rc = mac_of(sec, buf, HEADER_LEN + len, buf + HEADER_LEN + len);
  if (rc != 0) {
    kiln_free(buf);
    return kiln_status_set(st, rc, "cache entry", "cannot sign: %s",
                           rc == KILN_EINVAL ? "secret shorter than 16 bytes" : "HMAC failed");
  }
  *out = buf;
  *outlen = total;
  return 0;
}

static void read_meta(const uint8_t *buf, kiln_cache_meta *meta) {
  memset(meta, 0, sizeof *meta); /* padding too: metas compare with memcmp */
  meta->kind = get32(buf + OFF_KIND);
  memcpy(meta->key, buf + OFF_KEY, KILN_CACHE_DIGEST_LEN);
  memcpy(meta->parts, buf + OFF_PARTS, sizeof meta->parts);
  meta->compile_ns = get64(buf + OFF_COMPILE_NS);
  meta->created_unix_ms = get64(buf + OFF_CREATED);
  meta->peak_bytes = get64(buf + OFF_PEAK);
}

/* The layout checks shared by open and peek: returns the reason, and the
 * payload length when the buffer is exactly header + payload + MAC. */
static kiln_cache_reject check_layout(const uint8_t *buf, size_t len, uint64_t *plen) {
  if (buf == NULL || len < HEADER_LEN + MAC_LEN) return KILN_CACHE_REJECT_TRUNCATED;
  if (memcmp(buf + OFF_MAGIC, magic, sizeof magic) != 0 ||
      get32(buf + OFF_VERSION) != KILN_CACHE_ENTRY_VERSION)
    return KILN_CACHE_REJECT_VERSION;
  *plen = get64(buf + OFF_PLEN);
  size_t room = len - HEADER_LEN - MAC_LEN;
  if (*plen > room) return KILN_CACHE_REJECT_TRUNCATED;
  /* Bytes past the MAC: the stated length was lowered or data appended.
   * Either way the MAC no longer sits where the length says: tampered. */
  if (*plen < room) return KILN_CACHE_REJECT_MAC;
  return KILN_CACHE_OK;
}

static int refuse(kiln_cache_reject r, kiln_cache_reject *why, size_t len, kiln_status *st) {
  static const char *const what[KILN_CACHE_NREJECTS] = {
      [KILN_CACHE_REJECT_TRUNCATED] = "shorter than its header or its stated length",
      [KILN_CACHE_REJECT_VERSION] = "bad magic or another format version",
      [KILN_CACHE_REJECT_KEY] = "stored under another key",
      [KILN_CACHE_REJECT_MAC] = "MAC mismatch (tampered, or signed with another secret)",
  };
  if (why) *why = r;
  return kiln_status_set(st, KILN_EINVAL, "cache entry", "%s: entry of %zu bytes %s",
                         kiln_cache_reject_name(r), len, what[r]);
}

int kiln_cache_entry_open(const kiln_cache_secret *sec, const uint8_t key[KILN_CACHE_DIGEST_LEN],
                          const uint8_t *buf, size_t len, kiln_cache_meta *meta,
                          const uint8_t **payload, size_t *plen, kiln_cache_reject *why,
                          kiln_status *st) {
  if (payload) *payload = NULL;
  if (plen) *plen = 0;
  if (why) *why = KILN_CACHE_OK;
  uint64_t n = 0;
  kiln_cache_reject r = check_layout(buf, len, &n);
  if (r != KILN_CACHE_OK) return refuse(r, why, len, st);
  if (memcmp(buf + OFF_KEY, key, KILN_CACHE_DIGEST_LEN) != 0)
    return refuse(KILN_CACHE_REJECT_KEY, why, len, st);
  uint8_t mac[MAC_LEN];
  int rc = mac_of(sec, buf, HEADER_LEN + (size_t)n, mac);
  if (rc != 0)
    return kiln_status_set(st, rc, "cache entry", "cannot verify: %s",
                           rc == KILN_EINVAL ? "secret shorter than 16 bytes" : "HMAC failed");
  if (CRYPTO_memcmp(mac, buf + HEADER_LEN + n, MAC_LEN) != 0)
    return refuse(KILN_CACHE_REJECT_MAC, why, len, st);
  if (meta) read_meta(buf, meta);
  if (payload) *payload = buf + HEADER_LEN;
  if (plen) *plen = (size_t)n;
  return 0;
}

int kiln_cache_entry_peek(const uint8_t *buf, size_t len, kiln_cache_meta *meta) {
  uint64_t n = 0;
  if (check_layout(buf, len, &n) != KILN_CACHE_OK) return KILN_EINVAL;
  read_meta(buf, meta);
  return 0;
}

int kiln_cache_secret_generate(kiln_cache_secret *sec, kiln_status *st) {
  memset(sec, 0, sizeof *sec);
  sec->len = 32;
  if (RAND_bytes(sec->bytes, (int)sec->len) == 1) return 0;
  /* libcrypto's generator failed to seed: ask the kernel directly. */
  size_t got = 0;
  while (got < sec->len) {
    ssize_t r = getrandom(sec->bytes + got, sec->len - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      memset(sec, 0, sizeof *sec);
      return kiln_status_set(st, KILN_EIO, "cache secret", "no random bytes from the OS: %s",
                             strerror(errno));
    }
    got += (size_t)r;
  }
  return 0;
}

int kiln_cache_secret_from_string(const char *s, kiln_cache_secret *sec, kiln_status *st) {
  memset(sec, 0, sizeof *sec);
  size_t n = s ? strlen(s) : 0;
  if (n < 16)
    return kiln_status_set(st, KILN_EINVAL, "cache secret",
                           "the cache secret has %zu bytes, at least 16 are needed", n);
  if (n > KILN_CACHE_SECRET_MAX)
    return kiln_status_set(st, KILN_EINVAL, "cache secret",
                           "the cache secret has %zu bytes, at most %d are allowed", n,
                           KILN_CACHE_SECRET_MAX);
  memcpy(sec->bytes, s, n);
  sec->len = n;
  return 0;
}
