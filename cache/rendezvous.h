/* A one-time id exchanged through Redis: how the ranks of a mesh that
 * spans hosts agree on the NCCL unique id (executor/cuda/nccl.h) before
 * ncclCommInitRank, as XLA does with its key-value store.
 *
 * Rank 0 mints the id and publishes it with SET key id NX EX ttl (when the
 * key already holds an id, another minter was first: that one is used, so
 * every rank gets the same bytes); the others poll GET key until it
 * appears or the deadline passes. Nothing here blocks past the deadline:
 * connects and commands carry socket timeouts of the time left. The key
 * names the mesh and its generation (a restarted mesh uses a new one); the
 * TTL lets a dead mesh's id expire.
 */
#ifndef KILN_CACHE_RENDEZVOUS_H
#define KILN_CACHE_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define KILN_RENDEZVOUS_ID_MAX 512

/* Mints the id (rank 0 only): writes n bytes into id. */
typedef int (*kiln_rendezvous_mint_fn)(void *ctx, uint8_t *id, size_t n, kiln_status *st);

typedef struct kiln_rendezvous_options {
  const char *redis; /* "host:port" of the Redis holding the ids */
  const char *key;   /* e.g. "kiln:nccl:<mesh>:<generation>" */
  uint32_t rank;     /* rank 0 mints and publishes; the others wait */
  size_t id_bytes;   /* the id's size (NCCL: 128), at most KILN_RENDEZVOUS_ID_MAX */
  double timeout_s;  /* the whole rendezvous; <= 0: 30 s */
  uint32_t ttl_s;    /* how long the published id lives; 0: 300 s */
  double poll_s;     /* between GETs of a waiting rank; <= 0: 0.02 s */
  kiln_rendezvous_mint_fn mint;
  void *mint_ctx;
} kiln_rendezvous_options;

/* Agrees on the id: on success id[0 .. id_bytes) is the mesh's. A rank
 * that sees no id before the deadline is KILN_EDEADLINE naming the key and
 * the wait; a Redis that cannot be reached or answers an error is
 * KILN_EUNAVAIL; a published value of the wrong size KILN_EINVAL; a mint
 * failure is the minter's status. */
int kiln_rendezvous_id(const kiln_rendezvous_options *o, uint8_t *id, kiln_status *st);

#endif /* KILN_CACHE_RENDEZVOUS_H */
