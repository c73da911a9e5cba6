/* The interpreter on a device mesh: one interpreter per device, each in a
 * thread of its own, meeting at a rendezvous in every collective.
 *
 * The rendezvous is a slot per device under one mutex. A device entering
 * its k-th collective posts its operands in its slot (seq = k) and waits
 * until every member of its group has posted seq k; it then reads the
 * members' operands (they stay alive: their owners are waiting too) and
 * computes its own result, counts itself as a reader of each member's slot,
 * and waits until all its readers are done before it clears its slot and
 * goes on. So a slot is never rewritten while a peer still reads it, and a
 * fast device cannot run ahead into the next collective's data. Devices
 * agree on each collective's group and opcode or fail saying they do not.
 * A device that fails or returns marks its slot gone: anyone waiting on it
 * fails with a message naming it, so nothing hangs. Waits wake every 50 ms
 * to honour the run's timeout and cancel flag.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/thread.h"
#include "compiler/eval/interp_internal.h"

typedef struct slot {
  uint64_t seq; /* collectives entered so far */
  bool posted;  /* ops/group below are this seq's */
  bool gone;    /* the device's run has ended */
  bool failed;  /* ... with an error */
  const kiln_literal *const *ops;
  uint32_t nops;
  kiln_opcode op;
  const int64_t *group; /* members, rank order */
  int64_t ngroup;
  int64_t readers; /* members done reading this slot */
} slot;

struct kiln_interp_mesh {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int64_t replicas, partitions, n;
  slot *slots;
};

int64_t kiln__interp_mesh_replicas(const kiln_interp_mesh *mh) { return mh->replicas; }
int64_t kiln__interp_mesh_partitions(const kiln_interp_mesh *mh) { return mh->partitions; }

/* Waits on the condition for at most 50 ms. */
static void nap(kiln_interp_mesh *mh) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += 50 * 1000 * 1000;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_cond_timedwait(&mh->cv, &mh->mu, &ts);
}

static bool same_group(const slot *a, const slot *b) {
  return a->ngroup == b->ngroup &&
         memcmp(a->group, b->group, (size_t)a->ngroup * sizeof *a->group) == 0;
}

int kiln__interp_mesh_enter(kiln__interp_ctx *c, const kiln_instr *ins, const int64_t *group,
                            int64_t ngroup, const kiln_literal *const *ops, uint32_t nops,
                            const kiln_literal *const **peer_ops) {
  kiln_interp_mesh *mh = c->opts.mesh;
  int64_t me = c->opts.replica_id * mh->partitions + c->opts.partition_id;
  pthread_mutex_lock(&mh->mu);
  slot *s = &mh->slots[me];
  s->seq++;
  s->posted = true;
  s->ops = ops;
  s->nops = nops;
  s->op = ins->op;
  s->group = group;
  s->ngroup = ngroup;
  s->readers = 0;
  pthread_cond_broadcast(&mh->cv);
  int rc = 0;
  for (;;) {
    int64_t waiting = -1;
    for (int64_t i = 0; i < ngroup && rc == 0; i++) {
      const slot *p = &mh->slots[group[i]];
      if (p->posted && p->seq == s->seq) {
        if (p->op != s->op || !same_group(p, s))
          rc = kiln__interp_fail(c, ins, KILN_EINVAL,
                                 "%s %s: device %lld meets device %lld in its collective number "
                                 "%llu, which there is %s with another group",
                                 kiln_opcode_name(ins->op), ins->name, (long long)me,
                                 (long long)group[i], (unsigned long long)s->seq,
                                 kiln_opcode_name(p->op));
        else
          peer_ops[i] = p->ops;
        continue;
      }
      if (p->gone)
        rc = kiln__interp_fail(c, ins, p->failed ? KILN_ECANCELED : KILN_EINVAL,
                               "%s %s: device %lld waits for device %lld, which %s before "
                               "reaching this collective",
                               kiln_opcode_name(ins->op), ins->name, (long long)me,
                               (long long)group[i], p->failed ? "failed" : "finished");
      else if (waiting < 0)
        waiting = group[i];
    }
    if (rc || waiting < 0) break;
    pthread_mutex_unlock(&mh->mu);
    rc = kiln__interp_check_time(c, ins);
    pthread_mutex_lock(&mh->mu);
    if (rc) break;
    nap(mh);
  }
  if (rc) { /* nobody may read this slot any more */
    s->posted = false;
    pthread_cond_broadcast(&mh->cv);
  }
  pthread_mutex_unlock(&mh->mu);
  return rc;
}

int kiln__interp_mesh_leave(kiln__interp_ctx *c, const kiln_instr *ins, const int64_t *group,
                            int64_t ngroup) {
  kiln_interp_mesh *mh = c->opts.mesh;
  int64_t me = c->opts.replica_id * mh->partitions + c->opts.partition_id;
  pthread_mutex_lock(&mh->mu);
  for (int64_t i = 0; i < ngroup; i++) mh->slots[group[i]].readers++;
  pthread_cond_broadcast(&mh->cv);
  slot *s = &mh->slots[me];
  int rc = 0;
  while (s->readers < ngroup) {
    /* A reader that is gone will never count itself: stop waiting for it. */
    bool lost = false;
    for (int64_t i = 0; i < ngroup; i++) lost = lost || mh->slots[group[i]].gone;
    if (lost) break;
    pthread_mutex_unlock(&mh->mu);
    rc = kiln__interp_check_time(c, ins);
    pthread_mutex_lock(&mh->mu);
    if (rc) break;
    nap(mh);
  }
  s->posted = false;
  pthread_cond_broadcast(&mh->cv);
  pthread_mutex_unlock(&mh->mu);
  return rc;
}

/* ---- the runner --------------------------------------------------------- */

typedef struct device_run {
  kiln_interp_mesh *mh;
  const kiln_module *m;
  const kiln_literal *const *args;
  uint32_t nargs;
  kiln_interp_options opts;
  kiln_literal *out;
  kiln_status st;
  int rc;
  int64_t k;
} device_run;

static void *device_main(void *arg) {
  device_run *d = arg;
  kiln_status_clear(&d->st);
  d->rc = kiln_interp_run(d->m, d->args, d->nargs, &d->opts, &d->out, &d->st);
  pthread_mutex_lock(&d->mh->mu);
  d->mh->slots[d->k].gone = true;
  d->mh->slots[d->k].failed = d->rc != 0;
  d->mh->slots[d->k].posted = false;
  pthread_cond_broadcast(&d->mh->cv);
  pthread_mutex_unlock(&d->mh->mu);
  return NULL;
}

#define MAX_DEVICES 4096

int kiln_interp_run_mesh(const kiln_module *m, uint32_t replicas, uint32_t partitions,
                         const kiln_literal *const *const *args, uint32_t nargs,
                         const kiln_interp_options *opts, kiln_literal **outs, kiln_status *st) {
  if (m == NULL || outs == NULL || (nargs && args == NULL))
    return kiln_status_set(st, KILN_EINVAL, "mesh", "interpreter mesh: missing module or results");
  if (replicas == 0 || partitions == 0 || (uint64_t)replicas * partitions > MAX_DEVICES)
    return kiln_status_set(st, KILN_EINVAL, "mesh",
                           "a mesh of %u replicas x %u partitions: each must be at least 1 and "
                           "the product at most %d",
                           replicas, partitions, MAX_DEVICES);
  int64_t n = (int64_t)replicas * partitions;
  for (int64_t k = 0; k < n; k++) outs[k] = NULL;
  kiln_interp_mesh mh = {.replicas = replicas, .partitions = partitions, .n = n};
  mh.slots = kiln_calloc((size_t)n, sizeof *mh.slots);
  device_run *runs = kiln_calloc((size_t)n, sizeof *runs);
  pthread_t *th = kiln_calloc((size_t)n, sizeof *th);
  bool *started = kiln_calloc((size_t)n, sizeof *started);
  int rc = 0;
  if (!mh.slots || !runs || !th || !started) {
    rc = kiln_status_set(st, KILN_ENOMEM, "mesh", "out of memory for %lld devices", (long long)n);
    goto out_free;
  }
  pthread_mutex_init(&mh.mu, NULL);
  pthread_cond_init(&mh.cv, NULL);
  for (int64_t k = 0; k < n; k++) {
    device_run *d = &runs[k];
    d->mh = &mh;
    d->m = m;
    d->args = nargs ? args[k] : NULL;
    d->nargs = nargs;
    if (opts) d->opts = *opts;
    d->opts.replica_id = k / partitions;
    d->opts.partition_id = k % partitions;
    d->opts.mesh = &mh;
    d->k = k;
  }
  for (int64_t k = 0; k < n; k++) {
    if (kiln_thread_start(&th[k], device_main, &runs[k]) != 0) {
      /* Devices not started count as failed, so their peers stop. */
      pthread_mutex_lock(&mh.mu);
      for (int64_t j = k; j < n; j++) mh.slots[j].gone = mh.slots[j].failed = true;
      pthread_cond_broadcast(&mh.cv);
      pthread_mutex_unlock(&mh.mu);
      rc = kiln_status_set(st, KILN_ENOMEM, "mesh", "cannot start a thread for device %lld",
                           (long long)k);
      break;
    }
    started[k] = true;
  }
  for (int64_t k = 0; k < n; k++)
    if (started[k]) pthread_join(th[k], NULL);
  /* Report the first device whose failure is its own (not a peer's). */
  int64_t bad = -1;
  for (int64_t k = 0; k < n && bad < 0 && rc == 0; k++)
    if (started[k] && runs[k].rc && runs[k].rc != KILN_ECANCELED) bad = k;
  for (int64_t k = 0; k < n && bad < 0 && rc == 0; k++)
    if (started[k] && runs[k].rc) bad = k;
  if (bad >= 0) {
    rc = runs[bad].rc;
    kiln_status_set(st, rc, runs[bad].st.where[0] ? runs[bad].st.where : "mesh", "device %lld: %s",
                    (long long)bad, runs[bad].st.msg);
  }
  for (int64_t k = 0; k < n; k++) {
    if (rc)
      kiln_literal_destroy(runs[k].out);
    else
      outs[k] = runs[k].out;
  }
  pthread_cond_destroy(&mh.cv);
  pthread_mutex_destroy(&mh.mu);
out_free:
  kiln_free(started);
  kiln_free(th);
  kiln_free(runs);
  kiln_free(mh.slots);
  return rc;
}
