/* kilnd's GPU mesh across hosts: the `mesh-*` options name it (its name,
 * the hosts in it, this host's rank, the GPUs each gives, the Redis where
 * the ranks agree on the NCCL id, a generation and a deadline), and at its
 * first use the ranks meet: rank 0 mints the id (kiln_nccl_mint_id) and
 * publishes it under kiln:nccl:<name>:<generation>, the others wait for
 * it (cache/rendezvous.h), and every host then creates its ranks of the
 * communicator (kiln_cuda_mesh_open). A failed or timed-out meeting is a
 * status for the caller that made the first use; the next use tries
 * again.
 *
 * Depends only on the executor and the cache (no gRPC), so tests link it
 * alone.
 */
#ifndef KILN_SERVER_MESH_H
#define KILN_SERVER_MESH_H

#include <stdint.h>

#include "common/status.h"

typedef struct kiln_backend kiln_backend;
typedef struct kiln_cuda_mesh kiln_cuda_mesh;

typedef struct kilnd_mesh_config {
  const char *name;      /* letters, digits, ._- (checked by the config) */
  const char *redis;     /* HOST:PORT; may be "" when ranks == 1 */
  uint32_t ranks;        /* hosts */
  uint32_t rank;         /* this host's */
  uint32_t devices;      /* GPUs per host; 0: all of this host's from first_device */
  uint32_t first_device; /* the first of them: cuda:first_device .. */
  uint64_t generation;   /* part of the Redis key */
  double timeout_s;      /* the rendezvous and the init, each */
} kilnd_mesh_config;

/* Meets the other hosts now and opens this host's ranks on backend cuda:
 * the rendezvous (KILN_EDEADLINE naming the key when rank 0's id does not
 * come, KILN_EUNAVAIL when Redis cannot be reached), then the NCCL init
 * (KILN_EDEADLINE naming it when a host's ranks do not join). */
int kilnd_mesh_join(const kilnd_mesh_config *c, kiln_backend *cuda, kiln_cuda_mesh **out,
                    kiln_status *st);

/* The server's mesh, opened at first use (kilnd_mesh_get) and kept. */
typedef struct kilnd_mesh kilnd_mesh;

typedef enum kilnd_mesh_state {
  KILND_MESH_UNUSED, /* configured, not yet met */
  KILND_MESH_READY,  /* the communicator is up */
  KILND_MESH_FAILED, /* the last meeting failed (the next use tries again) */
} kilnd_mesh_state;

/* Copies the config's strings. cuda may be NULL (no GPU): every use then
 * fails with KILN_EUNAVAIL saying so. */
int kilnd_mesh_create(const kilnd_mesh_config *c, kiln_backend *cuda, kilnd_mesh **out,
                      kiln_status *st);
void kilnd_mesh_destroy(kilnd_mesh *m); /* NULL is a no-op */
/* The open mesh, meeting the other hosts first if it is not open; one
 * caller at a time meets, the others wait for its outcome. */
int kilnd_mesh_get(kilnd_mesh *m, kiln_cuda_mesh **out, kiln_status *st);
kilnd_mesh_state kilnd_mesh_state_get(kilnd_mesh *m);
const char *kilnd_mesh_name(const kilnd_mesh *m);

#endif /* KILN_SERVER_MESH_H */
