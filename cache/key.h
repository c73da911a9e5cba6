/* The cache key: what determines an executable's code, hashed.
 *
 * A key is the SHA-256 of five component digests, each itself a SHA-256:
 *
 *   module     the canonical module: computations and instructions in a
 *              canonical order (post-order from each root, operands in
 *              order; independent instructions therefore land in the same
 *              order however the text listed them), renumbered names,
 *              metadata dropped. Whitespace and comments never reach it.
 *   signature  the ENTRY parameters and result: dtypes, dims, layouts,
 *              shardings, input/output aliases.
 *   options    the compile options that change code, as canonical text the
 *              caller builds ("opt=2\ndevices=1\n"), never device ids,
 *              replica or host identities, addresses or timestamps.
 *   target     backend and ISA: "cpu/x86-64-v3", "interp/", "cuda/sm_90".
 *   version    the compiler version and the executable format version.
 *
 * The digests are kept with each cache entry and returned by Compile, so a
 * miss can be explained: two keys differ exactly where a component does.
 */
#ifndef KILN_CACHE_KEY_H
#define KILN_CACHE_KEY_H

#include <stddef.h>
#include <stdint.h>

#include "common/sbuf.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_module kiln_module;

enum {
  KILN_CACHE_PART_MODULE,
  KILN_CACHE_PART_SIGNATURE,
  KILN_CACHE_PART_OPTIONS,
  KILN_CACHE_PART_TARGET,
  KILN_CACHE_PART_VERSION,
  KILN_CACHE_NPARTS
};

#define KILN_CACHE_DIGEST_LEN 32
#define KILN_CACHE_HEX_LEN 64

typedef struct kiln_cache_key {
  uint8_t digest[KILN_CACHE_DIGEST_LEN];
  char hex[KILN_CACHE_HEX_LEN + 1];
  uint8_t parts[KILN_CACHE_NPARTS][KILN_CACHE_DIGEST_LEN];
} kiln_cache_key;

/* "module", "signature", "options", "target", "version". */
const char *kiln_cache_part_name(int part);

typedef struct kiln_cache_key_inputs {
  const char *backend; /* "cpu", "interp", "cuda" */
  const char *target;  /* the resolved target ("x86-64-v3", "sm_90"); NULL or "" if none */
  const char *options; /* canonical option text built by the caller; NULL means none */
} kiln_cache_key_inputs;

#define KILN_CACHE_TEXT_MAX 96

/* The target text of a resolved target: its ISA (kiln_target.isa,
 * compiler/target.h, after kiln_target_resolve) as given ("x86-64-v3",
 * "sm_90"), or for "native" (cc -march=native; NULL is taken as native)
 * "native-" and 16 hex digits of this machine's CPU model and feature flags,
 * so that machines whose native code differs never share an entry
 * (key_inputs.c). The cache does not resolve names itself: it links kiln_ir
 * only, and the target table belongs to the compiler. */
void kiln_cache_target_text(const char *isa, char out[KILN_CACHE_TEXT_MAX]);

/* The target text of a target whose code compiler enters the key
 * (kiln_compile_code_identity, compiler/compile.h: NVRTC's version and
 * options for cuda): "ISA;IDENTITY" ("sm_90;nvrtc 13.0;--fmad=false ...").
 * NULL or "" identity: kiln_cache_target_text. */
void kiln_cache_code_target_text(const char *isa, const char *identity,
                                 char out[KILN_CACHE_TEXT_MAX]);

/* The options text: "opt=N\ndevices=N\n". Transforms are not in it: they
 * are applied before the module is hashed. Diagnostics (dumps,
 * verify_each_pass), return_executable, request_id and cache_policy never
 * change code and are left out. */
void kiln_cache_options_text(int opt_level, uint32_t ndevices, char out[KILN_CACHE_TEXT_MAX]);

/* Computes the key of a verified module. */
int kiln_cache_key_compute(const kiln_module *m, const kiln_cache_key_inputs *in,
                           kiln_cache_key *out, kiln_status *st);

/* Appends the canonical text of m (what the module component hashes). */
int kiln_cache_canonical_module(const kiln_module *m, kiln_sbuf *out, kiln_status *st);

/* Recomputes digest and hex from parts (after parts were read back from an
 * entry or a response). */
void kiln_cache_key_from_parts(kiln_cache_key *k);

/* The first component in which a and b differ, KILN_CACHE_NPARTS if none. */
int kiln_cache_key_diff(const kiln_cache_key *a, const kiln_cache_key *b);

/* Hex helpers: out has 2*len+1 bytes. from_hex returns 0, or KILN_EINVAL
 * when hex is not exactly 2*len lowercase or uppercase hex digits. */
void kiln_cache_to_hex(const uint8_t *bytes, size_t len, char *out);
int kiln_cache_from_hex(const char *hex, uint8_t *bytes, size_t len);

/* SHA-256 (libcrypto EVP; thread-safe). */
void kiln_cache_sha256(const void *data, size_t len, uint8_t out[KILN_CACHE_DIGEST_LEN]);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CACHE_KEY_H */
