/* Redis Cluster's routing arithmetic, apart from any connection: the hash
 * slot of a key, the redirections a node answers with (MOVED, ASK), and the
 * slot map a CLUSTER SLOTS reply describes. Pure functions over bytes and
 * hiredis reply trees, so they are tested without a server (redis.c uses
 * them; tests/unit/test_cache_redis_slots.c checks them).
 */
#ifndef KILN_CACHE_REDIS_SLOTS_H
#define KILN_CACHE_REDIS_SLOTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN__REDIS_SLOTS 16384
#define KILN__REDIS_HOST_MAX 256

/* CRC16 (XMODEM: polynomial 0x1021, initial 0) of s[0..n). */
uint16_t kiln__redis_crc16(const uint8_t *s, size_t n);

/* The slot of key[0..n): CRC16 mod 16384 of the whole key, or of the part
 * between the first '{' and the first '}' after it when that part is not
 * empty (a hash tag). */
uint16_t kiln__redis_slot(const char *key, size_t n);

/* A redirection: "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>".
 * An empty host (a node that does not know its own address) means the node
 * that answered. */
typedef struct kiln__redis_redirect {
  bool ask; /* ASK: this request only, after ASKING; MOVED: the slot moved */
  uint16_t slot;
  char host[KILN__REDIS_HOST_MAX];
  int port;
} kiln__redis_redirect;

/* Whether err[0..n) is a well-formed redirection; fills *out when it is. */
bool kiln__redis_parse_redirect(const char *err, size_t n, kiln__redis_redirect *out);

/* Called once per slot range of a CLUSTER SLOTS reply with the range and its
 * primary's address; a nonzero return stops the walk and is returned. */
typedef int (*kiln__redis_range_fn)(void *ctx, uint16_t first, uint16_t last, const char *host,
                                    int port);

struct redisReply;

/* Walks a CLUSTER SLOTS reply. 0 when every range was well formed (fn was
 * called for each); -1 with why filled when the reply is not one (a range
 * out of order, out of bounds, a missing address, a port out of range). An
 * empty host is passed as is (the node that answered). */
int kiln__redis_walk_slots(const struct redisReply *rep, kiln__redis_range_fn fn, void *ctx,
                           char *why, size_t whyn);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CACHE_REDIS_SLOTS_H */
