/* SHA-256 (FIPS 180-4) for the kernel cache's keys and checksums.
 *
 * The compiler library links nothing but libm and the base library, so it
 * carries its own small implementation rather than libcrypto's (which only
 * the cache library links). Streaming: init, any number of updates, final.
 */
#ifndef KILN_COMPILER_CODEGEN_SHA256_H
#define KILN_COMPILER_CODEGEN_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define KILN__SHA256_LEN 32

typedef struct kiln__sha256 {
  uint32_t h[8];
  uint64_t nbytes; /* message length so far */
  uint8_t buf[64]; /* the partial block */
  uint32_t nbuf;
} kiln__sha256;

void kiln__sha256_init(kiln__sha256 *s);
void kiln__sha256_update(kiln__sha256 *s, const void *data, size_t len);
void kiln__sha256_final(kiln__sha256 *s, uint8_t out[KILN__SHA256_LEN]);
/* One shot. */
void kiln__sha256_of(const void *data, size_t len, uint8_t out[KILN__SHA256_LEN]);
/* 2 * len lowercase hex digits and a NUL into out. */
void kiln__hex(const uint8_t *bytes, size_t len, char *out);

#endif /* KILN_COMPILER_CODEGEN_SHA256_H */
