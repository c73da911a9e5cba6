/* A cache entry as stored in every tier: a signed, versioned envelope
 * around a payload (a serialized executable).
 *
 *   "KILNCE\r\n" | u32 format version | u32 payload kind | key digest (32)
 *   | component digests (5 x 32) | u64 compile_ns | u64 created_unix_ms
 *   | u64 peak_bytes | u64 payload length | payload
 *   | HMAC-SHA-256 (32) over everything before it, under the cluster secret
 *
 * All integers little-endian. Opening an entry checks, in order: the length
 * (truncated), the magic and version, the key (an entry stored under
 * another key), the MAC (tampered, or signed with another secret). Any
 * failure is a miss that the caller counts by reason; the payload of an
 * entry that failed is never handed out: a CPU executable is native code.
 */
#ifndef KILN_CACHE_ENTRY_H
#define KILN_CACHE_ENTRY_H

#include <stddef.h>
#include <stdint.h>

#include "cache/key.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_CACHE_ENTRY_VERSION 1u
#define KILN_CACHE_SECRET_MAX 256

enum { KILN_CACHE_PAYLOAD_CPU_EXE = 1, KILN_CACHE_PAYLOAD_INTERP_MODULE = 2 };

typedef struct kiln_cache_secret {
  uint8_t bytes[KILN_CACHE_SECRET_MAX];
  size_t len; /* >= 16 */
} kiln_cache_secret;

typedef struct kiln_cache_meta {
  uint8_t key[KILN_CACHE_DIGEST_LEN];
  uint8_t parts[KILN_CACHE_NPARTS][KILN_CACHE_DIGEST_LEN];
  uint32_t kind;
  uint64_t compile_ns;
  uint64_t created_unix_ms;
  uint64_t peak_bytes;
} kiln_cache_meta;

/* Why an entry was refused. */
typedef enum kiln_cache_reject {
  KILN_CACHE_OK = 0,
  KILN_CACHE_REJECT_TRUNCATED, /* shorter than its header or its stated length */
  KILN_CACHE_REJECT_VERSION,   /* bad magic or another format version */
  KILN_CACHE_REJECT_KEY,       /* stored under another key */
  KILN_CACHE_REJECT_MAC,       /* tampered, or signed with another secret */
  KILN_CACHE_NREJECTS
} kiln_cache_reject;

/* "truncated", "version", "key", "mac". */
const char *kiln_cache_reject_name(kiln_cache_reject r);

/* Bytes of header + trailer around a payload. */
size_t kiln_cache_entry_overhead(void);

/* Seals meta + payload into *out (kiln_malloc'd, *outlen bytes). */
int kiln_cache_entry_seal(const kiln_cache_secret *sec, const kiln_cache_meta *meta,
                          const void *payload, size_t len, uint8_t **out, size_t *outlen,
                          kiln_status *st);

/* Opens buf (untrusted) expecting key. On success returns 0 and points
 * *payload into buf. On refusal returns KILN_EINVAL with *why set and a
 * status naming the reason. The MAC comparison is constant time. */
int kiln_cache_entry_open(const kiln_cache_secret *sec, const uint8_t key[KILN_CACHE_DIGEST_LEN],
                          const uint8_t *buf, size_t len, kiln_cache_meta *meta,
                          const uint8_t **payload, size_t *plen, kiln_cache_reject *why,
                          kiln_status *st);

/* Reads only the meta of an entry (no MAC check): for listing. */
int kiln_cache_entry_peek(const uint8_t *buf, size_t len, kiln_cache_meta *meta);

/* 32 random bytes from the OS. */
int kiln_cache_secret_generate(kiln_cache_secret *sec, kiln_status *st);
/* The secret from text (KILN_CACHE_SECRET): its bytes as given, >= 16. */
int kiln_cache_secret_from_string(const char *s, kiln_cache_secret *sec, kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CACHE_ENTRY_H */
