/* kilnd's GPU mesh across hosts (mesh.h): the rendezvous through Redis,
 * then this host's ranks of the NCCL communicator, once, at first use. */
#include "server/mesh.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "executor/backend.h"
#ifdef KILN_HAVE_CUDA
#include "executor/cuda/nccl.h"
#endif
#if defined(KILN_HAVE_CUDA) && defined(KILND_HAVE_RENDEZVOUS)
#include "cache/rendezvous.h"
#endif

#define MAX_LOCAL 16

struct kilnd_mesh {
  pthread_mutex_t mu; /* one meeting at a time; the fields below */
  kilnd_mesh_config c;
  char name[65], redis[256];
  kiln_backend *cuda;
  kiln_cuda_mesh *open;
  kilnd_mesh_state state;
};

int kilnd_mesh_join(const kilnd_mesh_config *c, kiln_backend *cuda, kiln_cuda_mesh **out,
                    kiln_status *st) {
  *out = NULL;
#ifdef KILN_HAVE_CUDA
  if (cuda == NULL)
    return kiln_status_set(st, KILN_EUNAVAIL, "mesh", "mesh %s: this host has no CUDA device",
                           c->name);
  uint32_t have = kiln_backend_device_count(cuda), first = c->first_device;
  uint32_t n = c->devices ? c->devices : have > first ? have - first : 0;
  if (first >= have || n > have - first || n > MAX_LOCAL || n == 0)
    return kiln_status_set(st, KILN_ELIMIT, "mesh",
                           "mesh %s: %u GPUs per host from cuda:%u, this host has %u", c->name, n,
                           first, have);
  if (c->ranks == 0 || c->rank >= c->ranks)
    return kiln_status_set(st, KILN_EINVAL, "mesh", "mesh %s: rank %u of %u hosts", c->name,
                           c->rank, c->ranks);
  uint8_t id[KILN_NCCL_ID_BYTES];
  int rc;
  if (c->ranks == 1) {
    rc = kiln_nccl_mint_id(NULL, id, sizeof id, st);
  } else {
#ifdef KILND_HAVE_RENDEZVOUS
    char key[160];
    snprintf(key, sizeof key, "kiln:nccl:%s:%llu", c->name, (unsigned long long)c->generation);
    kiln_rendezvous_options o = {.redis = c->redis,
                                 .key = key,
                                 .rank = c->rank,
                                 .id_bytes = sizeof id,
                                 .timeout_s = c->timeout_s,
                                 .mint = kiln_nccl_mint_id};
    rc = kiln_rendezvous_id(&o, id, st);
#else
    rc = kiln_status_set(st, KILN_EUNAVAIL, "mesh",
                         "mesh %s spans hosts, and this kilnd was built without Redis", c->name);
#endif
  }
  if (rc) return rc;
  kiln_device *devs[MAX_LOCAL];
  for (uint32_t i = 0; i < n; i++) devs[i] = kiln_backend_device(cuda, first + i);
  return kiln_cuda_mesh_open(cuda, id, c->ranks * n, c->rank * n, devs, n, c->timeout_s, out, st);
#else
  (void)cuda;
  return kiln_status_set(st, KILN_EUNAVAIL, "mesh",
                         "mesh %s: this kilnd was built without the CUDA pool", c->name);
#endif
}

int kilnd_mesh_create(const kilnd_mesh_config *c, kiln_backend *cuda, kilnd_mesh **out,
                      kiln_status *st) {
  *out = NULL;
  kilnd_mesh *m = kiln_calloc(1, sizeof *m);
  if (m == NULL) return kiln_status_set(st, KILN_ENOMEM, "mesh", "out of memory");
  pthread_mutex_init(&m->mu, NULL);
  m->c = *c;
  snprintf(m->name, sizeof m->name, "%s", c->name ? c->name : "");
  snprintf(m->redis, sizeof m->redis, "%s", c->redis ? c->redis : "");
  m->c.name = m->name;
  m->c.redis = m->redis;
  m->cuda = cuda;
  *out = m;
  return 0;
}

void kilnd_mesh_destroy(kilnd_mesh *m) {
  if (m == NULL) return;
#ifdef KILN_HAVE_CUDA
  kiln_cuda_mesh_close(m->open);
#endif
  pthread_mutex_destroy(&m->mu);
  kiln_free(m);
}

int kilnd_mesh_get(kilnd_mesh *m, kiln_cuda_mesh **out, kiln_status *st) {
  pthread_mutex_lock(&m->mu);
  int rc = 0;
  if (m->open == NULL) {
    rc = kilnd_mesh_join(&m->c, m->cuda, &m->open, st);
    m->state = rc ? KILND_MESH_FAILED : KILND_MESH_READY;
  }
  *out = m->open;
  pthread_mutex_unlock(&m->mu);
  return rc;
}

kilnd_mesh_state kilnd_mesh_state_get(kilnd_mesh *m) {
  pthread_mutex_lock(&m->mu);
  kilnd_mesh_state s = m->state;
  pthread_mutex_unlock(&m->mu);
  return s;
}

const char *kilnd_mesh_name(const kilnd_mesh *m) { return m->name; }
