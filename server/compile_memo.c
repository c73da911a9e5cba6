/* The request memo (compile_memo.h): a direct-mapped table of request
 * digests and the keys they produced, under one mutex held for a copy.
 *
 * The digest covers a domain string, which form the program came in, the
 * program's bytes and the packed options. Two encodings of the same options
 * give two digests: that is only a memo miss, never a wrong answer.
 */
#include <pthread.h>
#include <string.h>

#include <openssl/evp.h>

#include "common/alloc.h"
#include "server/compile_memo.h"

typedef struct slot {
  bool used;
  uint8_t digest[KILN_CACHE_DIGEST_LEN];
  kiln_cache_key key;
} slot;

struct kilnd_memo {
  pthread_mutex_t mu;
  slot slots[KILND_MEMO_SLOTS];
};

kilnd_memo *kilnd_memo_create(void) {
  kilnd_memo *m = kiln_calloc(1, sizeof *m);
  if (m) pthread_mutex_init(&m->mu, NULL);
  return m;
}

void kilnd_memo_destroy(kilnd_memo *m) {
  if (m == NULL) return;
  pthread_mutex_destroy(&m->mu);
  kiln_free(m);
}

static bool eligible(const Kiln__V1__CompileOptions *o) {
  if (o == NULL) return true;
  return o->cache_policy == KILN__V1__CACHE_POLICY__CACHE_POLICY_DEFAULT && !o->return_executable &&
         !o->verify_each_pass && o->n_dump_after_passes == 0;
}

bool kilnd_memo_digest(const Kiln__V1__CompileRequest *r, uint8_t digest[KILN_CACHE_DIGEST_LEN]) {
  if (!eligible(r->options)) return false;
  uint8_t *packed = NULL;
  const void *prog;
  size_t plen;
  if (r->program_case == KILN__V1__COMPILE_REQUEST__PROGRAM_HLO_TEXT) {
    prog = r->hlo_text;
    plen = strlen(r->hlo_text);
    if (plen > KILND_MEMO_MAX_PROGRAM) return false;
  } else if (r->program_case == KILN__V1__COMPILE_REQUEST__PROGRAM_MODULE) {
    plen = protobuf_c_message_get_packed_size(&r->module->base);
    if (plen > KILND_MEMO_MAX_PROGRAM || (packed = kiln_malloc(plen ? plen : 1)) == NULL)
      return false;
    protobuf_c_message_pack(&r->module->base, packed);
    prog = packed;
  } else {
    return false;
  }
  uint8_t obuf[1024];
  size_t olen = r->options ? protobuf_c_message_get_packed_size(&r->options->base) : 0;
  bool ok = olen <= sizeof obuf;
  if (ok && r->options) protobuf_c_message_pack(&r->options->base, obuf);
  EVP_MD_CTX *ctx = ok ? EVP_MD_CTX_new() : NULL;
  uint8_t form = (uint8_t)r->program_case;
  uint64_t lens[2] = {plen, olen};
  ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
       EVP_DigestUpdate(ctx, "kilnd-memo-1", 12) && EVP_DigestUpdate(ctx, &form, 1) &&
       EVP_DigestUpdate(ctx, lens, sizeof lens) && EVP_DigestUpdate(ctx, prog, plen) &&
       EVP_DigestUpdate(ctx, obuf, olen) && EVP_DigestFinal_ex(ctx, digest, NULL);
  EVP_MD_CTX_free(ctx);
  kiln_free(packed);
  return ok;
}

static slot *slot_of(kilnd_memo *m, const uint8_t digest[KILN_CACHE_DIGEST_LEN]) {
  uint32_t h = (uint32_t)digest[0] | (uint32_t)digest[1] << 8 | (uint32_t)digest[2] << 16;
  return &m->slots[h % KILND_MEMO_SLOTS];
}

bool kilnd_memo_get(kilnd_memo *m, const uint8_t digest[KILN_CACHE_DIGEST_LEN],
                    kiln_cache_key *key) {
  if (m == NULL) return false;
  pthread_mutex_lock(&m->mu);
  slot *s = slot_of(m, digest);
  bool hit = s->used && memcmp(s->digest, digest, KILN_CACHE_DIGEST_LEN) == 0;
  if (hit) *key = s->key;
  pthread_mutex_unlock(&m->mu);
  return hit;
}

void kilnd_memo_put(kilnd_memo *m, const uint8_t digest[KILN_CACHE_DIGEST_LEN],
                    const kiln_cache_key *key) {
  if (m == NULL) return;
  pthread_mutex_lock(&m->mu);
  slot *s = slot_of(m, digest);
  s->used = true;
  memcpy(s->digest, digest, KILN_CACHE_DIGEST_LEN);
  s->key = *key;
  pthread_mutex_unlock(&m->mu);
}
