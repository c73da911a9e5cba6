/* Events, communicators, collectives and gang launches: the executor's
 * multi-device half of the checked forwarders (backend.c has the rest).
 *
 * An event is a flag under a mutex with a condition variable: signalled
 * once by whoever finishes the work, waited on by anyone. A communicator is
 * a checked, ordered set of distinct devices of one backend, made once and
 * reused; the backend may hang state of its own on it (an NCCL
 * communicator, say). Collectives are checked here against the
 * communicator (ranks, sizes, pairs, aliasing) before the backend's one
 * collective slot sees them. A gang launch runs every rank of a mesh load on
 * a thread of its own, all released together once every thread exists, so
 * a program that meets its peers in a collective finds them running; the
 * launch's one event signals when the last rank is done. Each launch has a
 * rendezvous where the ranks' collective steps meet (the interpreter
 * mesh's protocol, interp_mesh.c: a slot per rank, a generation counter,
 * readers counted before a slot may be reused; a rank whose run ends marks
 * its slot gone and releases whoever waits on it with an error).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/thread.h"
#include "compiler/codegen/executable.h"
#include "executor/backend.h"
#include "executor/backend_impl.h"

/* ---- events ------------------------------------------------------------- */

kiln_event *kiln__event_create(void) {
  kiln_event *ev = kiln_calloc(1, sizeof *ev);
  if (ev == NULL) return NULL;
  pthread_mutex_init(&ev->mu, NULL);
  pthread_cond_init(&ev->cv, NULL);
  kiln_status_clear(&ev->st);
  return ev;
}

void kiln__event_free(kiln_event *ev) {
  if (ev == NULL) return;
  pthread_cond_destroy(&ev->cv);
  pthread_mutex_destroy(&ev->mu);
  kiln_free(ev);
}

void kiln__event_signal(kiln_event *ev, int rc, const kiln_status *st) {
  pthread_mutex_lock(&ev->mu);
  ev->rc = rc;
  if (rc && st)
    ev->st = *st;
  else if (rc)
    kiln_status_set(&ev->st, rc, "event", "the work failed");
  ev->done = true;
  pthread_cond_broadcast(&ev->cv);
  pthread_mutex_unlock(&ev->mu);
}

int kiln_event_wait(kiln_event *ev, kiln_status *st) {
  if (ev == NULL) return kiln_status_set(st, KILN_EINVAL, "event", "no event");
  pthread_mutex_lock(&ev->mu);
  while (!ev->done) pthread_cond_wait(&ev->cv, &ev->mu);
  int rc = ev->rc;
  if (rc && st && st->code == 0) *st = ev->st; /* the first error wins */
  pthread_mutex_unlock(&ev->mu);
  return rc;
}

bool kiln_event_query(kiln_event *ev) {
  if (ev == NULL) return false;
  pthread_mutex_lock(&ev->mu);
  bool done = ev->done;
  pthread_mutex_unlock(&ev->mu);
  return done;
}

void kiln_event_destroy(kiln_event *ev) {
  if (ev == NULL) return;
  kiln_event_wait(ev, NULL);
  kiln__event_free(ev);
}

/* ---- communicators ------------------------------------------------------ */

int kiln_comm_create(kiln_backend *b, kiln_device *const *devices, uint32_t n, kiln_comm **out,
                     kiln_status *st) {
  if (out == NULL) return kiln_status_set(st, KILN_EINVAL, "comm", "no result pointer");
  *out = NULL;
  if (b == NULL) return kiln_status_set(st, KILN_EINVAL, "comm", "no backend");
  if (n == 0 || devices == NULL)
    return kiln_status_set(st, KILN_EINVAL, "comm", "an empty device set");
  for (uint32_t r = 0; r < n; r++) {
    kiln_device *d = devices[r];
    if (d == NULL) return kiln_status_set(st, KILN_EINVAL, "comm", "rank %u: no device", r);
    if (d->backend != b)
      return kiln_status_set(st, KILN_EINVAL, "comm",
                             "rank %u: device %s:%u belongs to another backend than this %s one", r,
                             d->backend->iface->name, d->index, b->iface->name);
    for (uint32_t k = 0; k < r; k++)
      if (devices[k] == d)
        return kiln_status_set(st, KILN_EINVAL, "comm", "rank %u: device %s:%u is already rank %u",
                               r, b->iface->name, d->index, k);
  }
  kiln_comm *c = kiln_calloc(1, sizeof *c);
  if (c) c->devices = kiln_calloc(n, sizeof *c->devices);
  if (c == NULL || c->devices == NULL) {
    kiln_free(c);
    return kiln_status_set(st, KILN_ENOMEM, "comm", "out of memory");
  }
  memcpy(c->devices, devices, n * sizeof *devices);
  c->ndevices = n;
  c->backend = b;
  int rc = b->iface->comm_init ? b->iface->comm_init(c, st) : 0;
  if (rc) {
    kiln_free(c->devices);
    kiln_free(c);
    return rc;
  }
  *out = c;
  return 0;
}

void kiln_comm_destroy(kiln_comm *c) {
  if (c == NULL) return;
  if (c->backend->iface->comm_fini) c->backend->iface->comm_fini(c);
  kiln_free(c->devices);
  kiln_free(c);
}

uint32_t kiln_comm_size(const kiln_comm *c) { return c ? c->ndevices : 0; }

kiln_device *kiln_comm_device(const kiln_comm *c, uint32_t rank) {
  return c && rank < c->ndevices ? c->devices[rank] : NULL;
}

/* ---- collectives -------------------------------------------------------- */

static bool is_collective(int op) {
  return op == KILN_OP_ALL_REDUCE || op == KILN_OP_ALL_GATHER || op == KILN_OP_REDUCE_SCATTER ||
         op == KILN_OP_ALL_TO_ALL || op == KILN_OP_COLLECTIVE_PERMUTE;
}

static bool is_reduction(int op) {
  return op == KILN_OP_ADD || op == KILN_OP_MULTIPLY || op == KILN_OP_MAXIMUM ||
         op == KILN_OP_MINIMUM;
}

/* Bytes each rank's send and recv buffer must hold at least. */
static int collective_sizes(const kiln_comm *c, const kiln_collective *d, const char *name,
                            uint64_t *send, uint64_t *recv, kiln_status *st) {
  size_t esize = kiln_dtype_size((kiln_dtype)d->dtype);
  uint64_t n = c->ndevices, bytes;
  if (__builtin_mul_overflow(d->count, (uint64_t)esize, &bytes) || bytes > SIZE_MAX / n)
    return kiln_status_set(st, KILN_ERANGE, name, "%llu elements overflow a buffer size",
                           (unsigned long long)d->count);
  *send = *recv = bytes;
  if (d->op == KILN_OP_ALL_GATHER) *recv = bytes * n;
  if (d->op == KILN_OP_REDUCE_SCATTER || d->op == KILN_OP_ALL_TO_ALL) {
    if (d->count % n)
      return kiln_status_set(st, KILN_EINVAL, name,
                             "%llu elements per rank do not split over %u ranks",
                             (unsigned long long)d->count, c->ndevices);
    if (d->op == KILN_OP_REDUCE_SCATTER) *recv = bytes / n;
  }
  return 0;
}

static int check_buffers(const kiln_comm *c, const kiln_collective *d, const char *name,
                         kiln_status *st) {
  uint64_t send_bytes = 0, recv_bytes = 0;
  int rc = collective_sizes(c, d, name, &send_bytes, &recv_bytes, st);
  if (rc) return rc;
  if (d->send == NULL || d->recv == NULL)
    return kiln_status_set(st, KILN_EINVAL, name, "no %s buffers", d->send ? "recv" : "send");
  for (uint32_t r = 0; r < c->ndevices; r++) {
    for (int side = 0; side < 2; side++) {
      const kiln_buffer *b = side ? d->recv[r] : d->send[r];
      const char *what = side ? "recv" : "send";
      uint64_t need = side ? recv_bytes : send_bytes;
      if (b == NULL)
        return kiln_status_set(st, KILN_EINVAL, name, "rank %u: no %s buffer", r, what);
      if (!kiln_device_can_access(c->devices[r], b))
        return kiln_status_set(st, KILN_EINVAL, name,
                               "rank %u: the %s buffer lives on %s:%u, the rank on %s:%u", r, what,
                               b->device->backend->iface->name, b->device->index,
                               c->backend->iface->name, c->devices[r]->index);
      if (b->size < need)
        return kiln_status_set(st, KILN_EINVAL, name,
                               "rank %u: the %s buffer has %zu bytes, %llu needed", r, what,
                               b->size, (unsigned long long)need);
    }
    for (uint32_t k = 0; k < c->ndevices; k++) {
      if (k != r && d->recv[r] == d->recv[k])
        return kiln_status_set(st, KILN_EINVAL, name, "ranks %u and %u share a recv buffer", k, r);
      bool in_place_ok = d->op == KILN_OP_ALL_REDUCE && k == r;
      if (d->recv[r] == d->send[k] && !in_place_ok)
        return kiln_status_set(st, KILN_EINVAL, name,
                               "rank %u: the recv buffer is also rank %u's send buffer", r, k);
    }
  }
  return 0;
}

static int check_pairs(const kiln_comm *c, const kiln_collective *d, const char *name,
                       kiln_status *st) {
  if (d->npairs && d->pairs == NULL) return kiln_status_set(st, KILN_EINVAL, name, "no pairs");
  for (uint32_t i = 0; i < d->npairs; i++) {
    uint32_t s = d->pairs[2 * i], t = d->pairs[2 * i + 1];
    if (s >= c->ndevices || t >= c->ndevices)
      return kiln_status_set(st, KILN_EINVAL, name, "pair %u: {%u,%u} outside ranks 0 to %u", i, s,
                             t, c->ndevices - 1);
    for (uint32_t k = 0; k < i; k++) {
      if (d->pairs[2 * k] == s)
        return kiln_status_set(st, KILN_EINVAL, name, "pairs %u and %u both send from rank %u", k,
                               i, s);
      if (d->pairs[2 * k + 1] == t)
        return kiln_status_set(st, KILN_EINVAL, name, "pairs %u and %u both send to rank %u", k, i,
                               t);
    }
  }
  return 0;
}

int kiln_comm_collective(kiln_comm *c, const kiln_collective *d, kiln_status *st) {
  if (c == NULL) return kiln_status_set(st, KILN_EINVAL, "collective", "no communicator");
  if (d == NULL) return kiln_status_set(st, KILN_EINVAL, "collective", "no descriptor");
  if (!is_collective(d->op))
    return kiln_status_set(st, KILN_EINVAL, "collective", "opcode %d is not a collective", d->op);
  const char *name = kiln_opcode_name((kiln_opcode)d->op);
  if (d->dtype < 0 || d->dtype == KILN_TUPLE || d->dtype == KILN_TOKEN ||
      kiln_dtype_size((kiln_dtype)d->dtype) == 0)
    return kiln_status_set(st, KILN_EINVAL, name, "element type %d is not an array type", d->dtype);
  if ((d->op == KILN_OP_ALL_REDUCE || d->op == KILN_OP_REDUCE_SCATTER) &&
      !is_reduction(d->reduce_op))
    return kiln_status_set(st, KILN_EINVAL, name,
                           "reduction %d: expected add, multiply, maximum or minimum",
                           d->reduce_op);
  int rc = check_buffers(c, d, name, st);
  if (rc == 0 && d->op == KILN_OP_COLLECTIVE_PERMUTE) rc = check_pairs(c, d, name, st);
  if (rc) return rc;
  if (c->backend->iface->collective == NULL)
    return kiln_status_set(st, KILN_EUNIMPL, name, "backend %s implements no collectives",
                           c->backend->iface->name);
  return c->backend->iface->collective(c, d, st);
}

/* ---- the rendezvous of a gang launch ------------------------------------ */

typedef struct rv_slot {
  uint64_t seq;      /* collectives entered so far */
  bool posted;       /* ptrs/key below are this seq's */
  bool gone, failed; /* the rank's run has ended (with an error) */
  uint64_t key;
  void *const *ptrs;
  uint32_t ngroup;
  uint32_t readers; /* members done reading this slot */
} rv_slot;

struct kiln__rendezvous {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  uint32_t n;
  rv_slot *slots;
};

double kiln__monotonic_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static kiln__rendezvous *rv_create(uint32_t n) {
  kiln__rendezvous *rv = kiln_calloc(1, sizeof *rv);
  if (rv) rv->slots = kiln_calloc(n, sizeof *rv->slots);
  if (rv == NULL || rv->slots == NULL) {
    kiln_free(rv);
    return NULL;
  }
  rv->n = n;
  pthread_mutex_init(&rv->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&rv->cv, &ca);
  pthread_condattr_destroy(&ca);
  return rv;
}

static void rv_destroy(kiln__rendezvous *rv) {
  if (rv == NULL) return;
  pthread_cond_destroy(&rv->cv);
  pthread_mutex_destroy(&rv->mu);
  kiln_free(rv->slots);
  kiln_free(rv);
}

/* Marks rank r's run over: whoever waits on it stops waiting. */
static void rv_gone(kiln__rendezvous *rv, uint32_t r, bool failed) {
  if (rv == NULL) return;
  pthread_mutex_lock(&rv->mu);
  rv->slots[r].gone = true;
  rv->slots[r].failed = failed;
  rv->slots[r].posted = false;
  pthread_cond_broadcast(&rv->cv);
  pthread_mutex_unlock(&rv->mu);
}

/* Sleeps on the condition for at most 50 ms, then checks the run's limits
 * (with the mutex released). */
static int rv_nap(kiln__rendezvous *rv, const atomic_int *cancel, double deadline,
                  kiln_status *st) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_nsec += 50 * 1000 * 1000;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_cond_timedwait(&rv->cv, &rv->mu, &ts);
  if (cancel && atomic_load_explicit(cancel, memory_order_relaxed))
    return kiln_status_set(st, KILN_ECANCELED, "run", "cancelled");
  if (deadline > 0 && kiln__monotonic_seconds() > deadline)
    return kiln_status_set(st, KILN_ELIMIT, "run", "time limit exceeded in a collective");
  return 0;
}

int kiln__rendezvous_enter(const kiln__gang_rank *g, uint64_t key, const uint32_t *members,
                           uint32_t n, void *const *ptrs, void *const **peers,
                           const atomic_int *cancel, double deadline, kiln_status *st) {
  kiln__rendezvous *rv = g->rv;
  pthread_mutex_lock(&rv->mu);
  rv_slot *s = &rv->slots[g->rank];
  s->seq++;
  s->posted = true;
  s->key = key;
  s->ptrs = ptrs;
  s->ngroup = n;
  s->readers = 0;
  pthread_cond_broadcast(&rv->cv);
  int rc = 0;
  for (;;) {
    bool waiting = false;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
      const rv_slot *p = &rv->slots[members[i]];
      if (p->posted && p->seq == s->seq) {
        if (p->key != key || p->ngroup != n)
          rc = kiln_status_set(st, KILN_EINVAL, "collective",
                               "rank %u meets rank %u in its collective number %llu, which there "
                               "is another collective step",
                               g->rank, members[i], (unsigned long long)s->seq);
        else
          peers[i] = p->ptrs;
      } else if (p->gone) {
        rc = kiln_status_set(st, p->failed ? KILN_ECANCELED : KILN_EINVAL, "collective",
                             "rank %u waits for rank %u, which %s before reaching its "
                             "collective number %llu",
                             g->rank, members[i], p->failed ? "failed" : "finished",
                             (unsigned long long)s->seq);
      } else {
        waiting = true;
      }
    }
    if (rc || !waiting) break;
    rc = rv_nap(rv, cancel, deadline, st);
    if (rc) break;
  }
  if (rc) { /* nobody may read this slot any more */
    s->posted = false;
    pthread_cond_broadcast(&rv->cv);
  }
  pthread_mutex_unlock(&rv->mu);
  return rc;
}

int kiln__rendezvous_leave(const kiln__gang_rank *g, const uint32_t *members, uint32_t n,
                           const atomic_int *cancel, double deadline, kiln_status *st) {
  kiln__rendezvous *rv = g->rv;
  pthread_mutex_lock(&rv->mu);
  for (uint32_t i = 0; i < n; i++) rv->slots[members[i]].readers++;
  pthread_cond_broadcast(&rv->cv);
  rv_slot *s = &rv->slots[g->rank];
  int rc = 0;
  while (s->readers < n) {
    bool lost = false; /* a member that is gone never counts itself */
    for (uint32_t i = 0; i < n; i++) lost = lost || rv->slots[members[i]].gone;
    if (lost) break;
    if ((rc = rv_nap(rv, cancel, deadline, st))) break;
  }
  s->posted = false;
  pthread_cond_broadcast(&rv->cv);
  pthread_mutex_unlock(&rv->mu);
  return rc;
}

/* ---- mesh loads and gang launches --------------------------------------- */

int kiln_comm_load(kiln_comm *c, const kiln_executable *e, kiln_mesh **out, kiln_status *st) {
  if (out == NULL) return kiln_status_set(st, KILN_EINVAL, "mesh", "no result pointer");
  *out = NULL;
  if (c == NULL) return kiln_status_set(st, KILN_EINVAL, "mesh", "no communicator");
  if (e == NULL) return kiln_status_set(st, KILN_EINVAL, "mesh", "no executable");
  kiln_mesh *m = kiln_calloc(1, sizeof *m);
  if (m) m->ranks = kiln_calloc(c->ndevices, sizeof *m->ranks);
  if (m == NULL || m->ranks == NULL) {
    kiln_free(m);
    return kiln_status_set(st, KILN_ENOMEM, "mesh", "out of memory");
  }
  m->comm = c;
  m->exe = e;
  for (uint32_t r = 0; r < c->ndevices; r++) {
    int rc = kiln_device_load(c->devices[r], e, &m->ranks[r], st);
    if (rc) {
      kiln_mesh_destroy(m);
      return rc;
    }
  }
  *out = m;
  return 0;
}

void kiln_mesh_destroy(kiln_mesh *m) {
  if (m == NULL) return;
  for (uint32_t r = 0; r < m->comm->ndevices; r++) kiln_loaded_destroy(m->ranks[r]);
  kiln_free(m->ranks);
  kiln_free(m);
}

kiln_loaded *kiln_mesh_rank(const kiln_mesh *m, uint32_t rank) {
  return m && rank < m->comm->ndevices ? m->ranks[rank] : NULL;
}

/* One gang launch: rank threads wait for `go` (or `abort`, when a thread
 * could not be started), run, and report; the last one out signals. */
typedef struct gang {
  kiln_mesh *m;
  kiln_buffer *const *const *args;
  kiln_buffer **const *results;
  kiln_run_options opts;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool go, abort;
  uint32_t left; /* ranks not finished */
  int rc;        /* the lowest failing rank's */
  uint32_t failed_rank;
  kiln_status st;
  kiln_event *ev;
  kiln__rendezvous *rv;
  /* kiln_mesh_run: host literals in and out instead of buffers */
  const kiln_literal *const *const *largs;
  kiln_literal **louts;
} gang;

typedef struct gang_rank {
  gang *g;
  uint32_t rank;
  pthread_t thread;
} gang_rank;

static void gang_finish(gang *g, uint32_t rank, int rc, const kiln_status *st) {
  pthread_mutex_lock(&g->mu);
  /* A rank that failed on its own outranks one released by a peer's failure. */
  bool own = rc != KILN_ECANCELED, had_own = g->rc != KILN_ECANCELED;
  if (rc && (g->rc == 0 || (own && !had_own) || (own == had_own && rank < g->failed_rank))) {
    g->rc = rc;
    g->failed_rank = rank;
    g->st = *st;
  }
  bool last = --g->left == 0;
  pthread_mutex_unlock(&g->mu);
  if (last) kiln__event_signal(g->ev, g->rc, &g->st);
}

static void gang_run_rank(gang *g, uint32_t r) {
  kiln_loaded *l = g->m->ranks[r];
  kiln_status st;
  kiln_status_clear(&st);
  kiln__gang_rank link = {.rv = g->rv, .rank = r, .nranks = g->m->comm->ndevices};
  kiln_run_options opts = g->opts;
  opts.gang = &link;
  int rc = g->louts ? l->device->backend->iface->run(l, g->largs ? g->largs[r] : NULL, &opts,
                                                     &g->louts[r], &st)
                    : l->device->backend->iface->execute(l, g->args[r], &opts, g->results[r], &st);
  rv_gone(g->rv, r, rc != 0);
  gang_finish(g, r, rc, &st);
}

static void *gang_thread(void *arg) {
  gang_rank *gr = arg;
  gang *g = gr->g;
  pthread_mutex_lock(&g->mu);
  while (!g->go && !g->abort) pthread_cond_wait(&g->cv, &g->mu);
  bool run = g->go;
  pthread_mutex_unlock(&g->mu);
  if (run) gang_run_rank(g, gr->rank);
  return NULL;
}

static void free_rank_results(kiln_buffer **const *results, uint32_t nranks, uint32_t nresults) {
  for (uint32_t r = 0; r < nranks; r++)
    for (uint32_t i = 0; i < nresults; i++) {
      kiln_buffer_free(results[r][i]);
      results[r][i] = NULL;
    }
}

/* Starts ranks 1.. on threads and runs rank 0 here; returns once all ranks
 * have finished (the event is then signalled). Nonzero only when the
 * threads could not be started, before any rank ran. */
static int gang_run(gang *g, kiln_status *st) {
  uint32_t n = g->m->comm->ndevices, started = 0;
  gang_rank *gr = kiln_calloc(n, sizeof *gr);
  if (gr == NULL) return kiln_status_set(st, KILN_ENOMEM, "mesh", "out of memory");
  for (uint32_t r = 1; r < n; r++, started++) {
    gr[r] = (gang_rank){.g = g, .rank = r};
    if (kiln_thread_start(&gr[r].thread, gang_thread, &gr[r]) != 0) break;
  }
  pthread_mutex_lock(&g->mu);
  if (started == n - 1)
    g->go = true;
  else
    g->abort = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  if (g->go) gang_run_rank(g, 0);
  for (uint32_t r = 1; r <= started; r++) pthread_join(gr[r].thread, NULL);
  kiln_free(gr);
  if (!g->go)
    return kiln_status_set(st, KILN_ELIMIT, "mesh", "could not start a thread for each of %u ranks",
                           n);
  return 0;
}

int kiln_mesh_execute_async(kiln_mesh *m, kiln_buffer *const *const *args, uint32_t nargs,
                            const kiln_run_options *opts, kiln_buffer **const *results,
                            uint32_t nresults, kiln_event **ev, kiln_status *st) {
  if (ev == NULL) return kiln_status_set(st, KILN_EINVAL, "mesh", "no event pointer");
  *ev = NULL;
  if (m == NULL) return kiln_status_set(st, KILN_EINVAL, "mesh", "no mesh");
  uint32_t n = m->comm->ndevices;
  if ((args == NULL && nargs > 0) || (results == NULL && nresults > 0))
    return kiln_status_set(st, KILN_EINVAL, "mesh", "no per-rank %s",
                           args == NULL ? "arguments" : "results");
  for (uint32_t k = 0; k < n && nresults; k++)
    for (uint32_t i = 0; i < nresults; i++) results[k][i] = NULL;
  int rc = 0;
  uint32_t r = 0;
  for (; r < n && rc == 0; r++) {
    char where[32];
    snprintf(where, sizeof where, "mesh rank %u", r);
    rc = kiln__run_memory_check(m->ranks[r]->exe, opts, where, st);
    if (rc == 0)
      rc = kiln__loaded_execute_prepare(m->ranks[r], nargs ? args[r] : NULL, nargs,
                                        nresults ? results[r] : NULL, nresults, where, st);
  }
  if (rc) {
    if (nresults) free_rank_results(results, r - 1, nresults);
    return rc;
  }
  gang g = {.m = m, .args = args, .results = results, .left = n};
  if (opts) g.opts = *opts;
  kiln_status_clear(&g.st);
  pthread_mutex_init(&g.mu, NULL);
  pthread_cond_init(&g.cv, NULL);
  g.ev = kiln__event_create();
  g.rv = rv_create(n);
  if (g.ev == NULL || g.rv == NULL)
    rc = kiln_status_set(st, KILN_ENOMEM, "mesh", "out of memory for an event");
  /* cpu-like backends complete here: every rank has finished when
   * gang_run returns, and the event is signalled. */
  if (rc == 0) rc = gang_run(&g, st);
  pthread_cond_destroy(&g.cv);
  pthread_mutex_destroy(&g.mu);
  rv_destroy(g.rv);
  if (rc) {
    kiln__event_free(g.ev);
    if (nresults) free_rank_results(results, n, nresults);
    return rc;
  }
  *ev = g.ev;
  return 0;
}

int kiln_mesh_execute(kiln_mesh *m, kiln_buffer *const *const *args, uint32_t nargs,
                      const kiln_run_options *opts, kiln_buffer **const *results, uint32_t nresults,
                      kiln_status *st) {
  kiln_event *ev = NULL;
  int rc = kiln_mesh_execute_async(m, args, nargs, opts, results, nresults, &ev, st);
  if (rc) return rc;
  rc = kiln_event_wait(ev, st);
  kiln_event_destroy(ev);
  if (rc && nresults) free_rank_results(results, m->comm->ndevices, nresults);
  return rc;
}

int kiln_mesh_run(kiln_mesh *m, const kiln_literal *const *const *args, uint32_t nargs,
                  const kiln_run_options *opts, kiln_literal **outs, kiln_status *st) {
  if (m == NULL || outs == NULL)
    return kiln_status_set(st, KILN_EINVAL, "mesh", "no mesh or results");
  uint32_t n = m->comm->ndevices;
  for (uint32_t r = 0; r < n; r++) outs[r] = NULL;
  if (m->ranks[0]->device->backend->iface->run == NULL)
    return kiln_status_set(st, KILN_EUNIMPL, "mesh", "backend %s runs no executables",
                           m->comm->backend->iface->name);
  if (nargs != m->exe->nparams)
    return kiln_status_set(st, KILN_EINVAL, "mesh", "the executable takes %u parameter%s, %u given",
                           m->exe->nparams, m->exe->nparams == 1 ? "" : "s", nargs);
  for (uint32_t r = 0; r < n; r++)
    for (uint32_t i = 0; i < nargs; i++)
      if (args == NULL || args[r] == NULL || args[r][i] == NULL)
        return kiln_status_set(st, KILN_EINVAL, "mesh", "rank %u: argument %u is missing", r, i);
  gang g = {.m = m, .largs = args, .louts = outs, .left = n};
  if (opts) g.opts = *opts;
  g.opts.gang = NULL;
  kiln_status_clear(&g.st);
  pthread_mutex_init(&g.mu, NULL);
  pthread_cond_init(&g.cv, NULL);
  g.ev = kiln__event_create();
  g.rv = rv_create(n);
  int rc = 0;
  if (g.ev == NULL || g.rv == NULL)
    rc = kiln_status_set(st, KILN_ENOMEM, "mesh", "out of memory for a gang launch");
  if (rc == 0) rc = gang_run(&g, st); /* returns once every rank has finished */
  if (rc == 0) {
    rc = kiln_event_wait(g.ev, NULL);
    if (rc)
      kiln_status_set(st, rc, g.st.where[0] ? g.st.where : "mesh", "rank %u: %s", g.failed_rank,
                      g.st.msg);
  }
  pthread_cond_destroy(&g.cv);
  pthread_mutex_destroy(&g.mu);
  rv_destroy(g.rv);
  kiln__event_free(g.ev);
  if (rc)
    for (uint32_t r = 0; r < n; r++) {
      kiln_literal_destroy(outs[r]);
      outs[r] = NULL;
    }
  return rc;
}
