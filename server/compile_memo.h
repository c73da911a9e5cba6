/* The request memo: Compile requests the server has answered before, by a
 * digest of their bytes, mapped to the cache key they produced.
 *
 * A repeated Compile of a program already in the loaded-executable table
 * (a training job recompiling its step on every start, a client that
 * compiles before each call) is answered on the completion-queue thread:
 * hash the request, look the digest up, find the key's executable in the
 * table, reply. Parsing, verifying and keying the program again would give
 * the same key: the key is a function of the request and of the server's
 * fixed configuration (default backend and target). A miss, or a key whose
 * executable left the table, goes the normal way through the compile pool.
 *
 * Only requests that change nothing but the answer may use it: the default
 * cache policy, no dumps, no per-pass verification, no serialized
 * executable, a program of at most KILND_MEMO_MAX_PROGRAM bytes (hashing
 * it must stay cheap on the completion-queue thread), and an answer that
 * carried no warnings (so both ways give the same response). The table is
 * direct-mapped and bounded: a newer digest overwrites an older one.
 */
#ifndef KILN_SERVER_COMPILE_MEMO_H
#define KILN_SERVER_COMPILE_MEMO_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/key.h"
#include "kiln/v1/kiln.pb-c.h"

#define KILND_MEMO_SLOTS 4096
#define KILND_MEMO_MAX_PROGRAM (64 * 1024)

typedef struct kilnd_memo kilnd_memo;

kilnd_memo *kilnd_memo_create(void); /* NULL on out-of-memory */
void kilnd_memo_destroy(kilnd_memo *m);

/* Whether r may be answered from the memo; if so, its digest. */
bool kilnd_memo_digest(const Kiln__V1__CompileRequest *r, uint8_t digest[KILN_CACHE_DIGEST_LEN]);

/* The key remembered for digest: true and *key set, or false. */
bool kilnd_memo_get(kilnd_memo *m, const uint8_t digest[KILN_CACHE_DIGEST_LEN],
                    kiln_cache_key *key);
void kilnd_memo_put(kilnd_memo *m, const uint8_t digest[KILN_CACHE_DIGEST_LEN],
                    const kiln_cache_key *key);

#endif /* KILN_SERVER_COMPILE_MEMO_H */
