/* libFuzzer target for what the cache reads back from disk and Redis: the
 * signed entry envelope (cache/entry.h) and, inside it, the serialized
 * executable (compiler/codegen/executable.h).
 *
 * The first input byte picks the mode:
 *   0: the rest is a stored value, opened under a fixed secret and key.
 *      It must be refused with a reason and no payload (a forged MAC is out
 *      of a fuzzer's reach), and kiln_cache_entry_peek must not read past it.
 *   1: the rest is a payload; it is sealed, then one byte of the sealed
 *      entry (position and xor from the input's first bytes) is changed, or
 *      the entry cut short. The untouched entry must open to the same meta
 *      and payload; a changed or cut one must be refused.
 *   2: the rest is a serialized executable: deserializing it either fails
 *      with a status or gives an executable that serializes to the same
 *      bytes (the format's round-trip contract). Nothing is loaded or run.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/entry.h"
#include "common/alloc.h"
#include "compiler/codegen/executable.h"

static void die(const char *what, const kiln_status *st) {
  fprintf(stderr, "fuzz_cache_entry: %s (%s: %s)\n", what, st ? st->where : "", st ? st->msg : "");
  abort();
}

static const kiln_cache_secret *secret(void) {
  static kiln_cache_secret s = {.len = 32};
  if (s.bytes[0] == 0) memset(s.bytes, 0x5a, s.len);
  return &s;
}

static void open_stored(const uint8_t *data, size_t size) {
  uint8_t key[KILN_CACHE_DIGEST_LEN];
  memset(key, 0xa5, sizeof key);
  kiln_cache_meta meta;
  const uint8_t *payload = NULL;
  size_t plen = 0;
  kiln_cache_reject why = KILN_CACHE_OK;
  kiln_status st = {0};
  int rc = kiln_cache_entry_open(secret(), key, data, size, &meta, &payload, &plen, &why, &st);
  if (rc == 0) die("an unsigned value was accepted", &st);
  if (why == KILN_CACHE_OK || why >= KILN_CACHE_NREJECTS || st.msg[0] == '\0')
    die("a refusal without a reason", &st);
  (void)kiln_cache_entry_peek(data, size, &meta);
}

static void seal_and_damage(const uint8_t *data, size_t size) {
  if (size < 5) return;
  uint32_t pos = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16;
  uint8_t flip = data[3];
  const uint8_t *payload = data + 4;
  size_t len = size - 4;
  kiln_cache_meta meta = {
      .kind = KILN_CACHE_PAYLOAD_CPU_EXE, .compile_ns = len, .created_unix_ms = 1, .peak_bytes = 2};
  memset(meta.key, 0x11, sizeof meta.key);
  kiln_status st = {0};
  uint8_t *sealed = NULL;
  size_t slen = 0;
  if (kiln_cache_entry_seal(secret(), &meta, payload, len, &sealed, &slen, &st)) return;
  kiln_cache_meta got;
  const uint8_t *p = NULL;
  size_t plen = 0;
  kiln_cache_reject why;
  if (kiln_cache_entry_open(secret(), meta.key, sealed, slen, &got, &p, &plen, &why, &st))
    die("a sealed entry did not open", &st);
  if (plen != len || memcmp(p, payload, len) != 0 || got.compile_ns != meta.compile_ns)
    die("a sealed entry opened to something else", NULL);
  size_t cut = slen;
  if (flip)
    sealed[pos % slen] ^= flip;
  else
    cut = pos % slen;
  kiln_status_clear(&st);
  if (kiln_cache_entry_open(secret(), meta.key, sealed, cut, &got, &p, &plen, &why, &st) == 0)
    die("a damaged entry was accepted", &st);
  kiln_free(sealed);
}

static void deserialize(const uint8_t *data, size_t size) {
  kiln_status st = {0};
  kiln_executable *e = NULL;
  int rc = kiln_executable_deserialize(data, size, &e, &st);
  if (rc) {
    if (e != NULL || st.msg[0] == '\0') die("a failure without a status, or with a result", &st);
    return;
  }
  uint8_t *again = NULL;
  size_t len = 0;
  if (kiln_executable_serialize(e, &again, &len, &st))
    die("a loaded executable did not serialize", &st);
  if (len != size || memcmp(again, data, size) != 0) die("round trip changed the bytes", NULL);
  kiln_free(again);
  kiln_executable_destroy(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  switch (data[0] % 3) {
  case 0: open_stored(data + 1, size - 1); break;
  case 1: seal_and_damage(data + 1, size - 1); break;
  default: deserialize(data + 1, size - 1); break;
  }
  return 0;
}
