/* The scheduler: per-client FIFO queues in a round-robin ring, one worker
 * thread per device, one mutex.
 *
 * Only clients with queued jobs are in the ring; a client leaves it (and its
 * record is freed) when its queue empties, so the ring never holds more than
 * max_queued clients however many names callers make up. A free worker walks
 * the ring from the cursor, takes the first client whose oldest job of the
 * worker's class can start (enough free devices of the class), and moves the
 * cursor past that client: that is the fairness. A client joining the ring
 * goes just before the client served last (when that one is still in the
 * ring), else at the end of the round: either way it waits behind at most
 * one run of each other client before its own. A gang job is run by the
 * worker that took it; the other devices it needs are marked busy, and their
 * workers wait until it is done. Its devices are claimed all at once (no
 * job ever holds part of its devices while it waits for the rest, so two
 * gangs cannot deadlock), and a gang whose turn it is but that does not fit
 * yet holds the class's turn: no later job of the class starts before it,
 * so the devices drain and the gang cannot starve behind small jobs.
 *
 * Callbacks run outside the lock: jobs found expired or cancelled while the
 * lock is held are moved to a local list and dropped after unlocking.
 */
#include "executor/scheduler.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/thread.h"

typedef struct sclient sclient;

typedef struct job {
  kiln_sched_job j; /* j.client points at the client record's name */
  sclient *cl;
  struct job *next;
} job;

struct sclient {
  char *name;
  job *head, *tail;
  uint32_t n;
  sclient *prev, *next; /* ring */
};

typedef struct device {
  uint32_t id, dev_class;
  bool busy;
  uint64_t executions, busy_ns;
  pthread_t thread;
  bool started;
  kiln_sched *s;
} device;

struct kiln_sched {
  pthread_mutex_t mu;
  /* Per class: jobs of the class queued, its devices freed, stop. Waking
   * only the workers that can take the work keeps a submit from waking
   * every idle device of the other classes. */
  pthread_cond_t work_cv[KILN_SCHED_MAX_CLASSES];
  pthread_cond_t idle_cv; /* queue empty and nothing running */
  kiln_sched_options o;
  uint32_t first[KILN_SCHED_MAX_CLASSES];
  device *devs;
  uint32_t ndevs;
  sclient *cursor; /* next client to serve; NULL when the ring is empty */
  sclient *last;   /* the client served last, while it is in the ring; else NULL */
  uint32_t queued, running;
  uint32_t queued_class[KILN_SCHED_MAX_CLASSES]; /* of queued, per class */
  uint32_t dropping; /* jobs taken out to be dropped, callbacks not yet done */
  bool closed, stop;
  kiln_quota_table *quotas; /* per-client queue limits overriding o's, or NULL */
};

int64_t kiln_sched_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- the ring ---------------------------------------------------------------------- */

static sclient *ring_find(kiln_sched *s, const char *name) {
  sclient *c = s->cursor;
  if (c == NULL) return NULL;
  do {
    if (strcmp(c->name, name) == 0) return c;
    c = c->next;
  } while (c != s->cursor);
  return NULL;
}

static sclient *ring_add(kiln_sched *s, const char *name) {
  sclient *c = kiln_calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->name = kiln_strdup(name);
  if (c->name == NULL) {
    kiln_free(c);
    return NULL;
  }
  if (s->cursor == NULL) {
    c->prev = c->next = c;
    s->cursor = c;
    return c;
  }
  /* Served after every client in the ring that has waited since its last
   * run, but before the one served last (whose run may still be going):
   * then a newcomer waits behind at most one run of each other client. At
   * the end of the round (before the cursor) alone, a newcomer facing a
   * single busy client would wait behind two of its runs: the cursor is
   * that client again once it was served. */
  sclient *at = s->last ? s->last : s->cursor;
  c->next = at;
  c->prev = at->prev;
  c->prev->next = c;
  at->prev = c;
  if (s->last && at == s->cursor) s->cursor = c; /* the one served last is next: c goes first */
  return c;
}

static void ring_remove(kiln_sched *s, sclient *c) {
  if (s->last == c) s->last = NULL;
  if (c->next == c) {
    s->cursor = NULL;
  } else {
    c->prev->next = c->next;
    c->next->prev = c->prev;
    if (s->cursor == c) s->cursor = c->next;
  }
  kiln_free(c->name);
  kiln_free(c);
}

/* Unlinks j (whose predecessor in its client's queue is prev, or NULL). */
static void unlink_job(kiln_sched *s, job *j, job *prev) {
  sclient *c = j->cl;
  if (prev)
    prev->next = j->next;
  else
    c->head = j->next;
  if (c->tail == j) c->tail = prev;
  j->next = NULL;
  c->n--;
  s->queued--;
  s->queued_class[j->j.dev_class]--;
}

/* ---- taking work ------------------------------------------------------------------- */

static uint32_t free_devices(const kiln_sched *s, uint32_t cls) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->o.class_devices[cls]; i++) n += !s->devs[s->first[cls] + i].busy;
  return n;
}

static bool dead(const job *j, int64_t now, int *code) {
  if (j->j.cancelled && atomic_load(j->j.cancelled)) {
    *code = KILN_ECANCELED;
    return true;
  }
  if (j->j.deadline_ns && now >= j->j.deadline_ns) {
    *code = KILN_EDEADLINE;
    return true;
  }
  return false;
}

/* Moves the dead jobs of client c to *drops. */
static void reap_client(kiln_sched *s, sclient *c, int64_t now, job **drops) {
  job *prev = NULL;
  for (job *j = c->head, *next; j; j = next) {
    next = j->next;
    int code;
    if (dead(j, now, &code)) {
      unlink_job(s, j, prev);
      s->dropping++;
      j->next = *drops;
      *drops = j;
    } else {
      prev = j;
    }
  }
}

/* Moves every dead job to *drops and takes clients left with nothing
 * queued out of the ring. */
static void reap_all(kiln_sched *s, job **drops) {
  int64_t now = kiln_sched_now_ns();
  uint32_t nclients = 0;
  sclient *c = s->cursor;
  if (c == NULL) return;
  do {
    reap_client(s, c, now, drops);
    nclients++;
    c = c->next;
  } while (c != s->cursor);
  c = s->cursor;
  for (uint32_t i = 0; i < nclients; i++) {
    sclient *next = c->next;
    if (c->n == 0) ring_remove(s, c);
    c = next;
  }
}

/* The next job of class cls that can start now, taken out of its queue;
 * NULL when none. Dead jobs go to *drops. */
static job *pick(kiln_sched *s, uint32_t cls, job **drops) {
  reap_all(s, drops);
  if (s->cursor == NULL) return NULL;
  uint32_t nfree = free_devices(s, cls);
  sclient *c = s->cursor;
  do {
    job *prev = NULL, *j = c->head;
    while (j && j->j.dev_class != cls) prev = j, j = j->next;
    /* A gang that does not fit yet keeps its turn: nobody behind it in
     * the ring overtakes it, so the devices it needs drain instead of
     * being taken one at a time by single-device jobs forever. */
    if (j && j->j.ndevices > nfree) return NULL;
    if (j) {
      unlink_job(s, j, prev);
      s->cursor = c->next;
      s->last = c;
      if (c->n == 0) ring_remove(s, c);
      return j;
    }
    c = c->next;
  } while (c != s->cursor);
  return NULL;
}

static bool idle(const kiln_sched *s) {
  return s->queued == 0 && s->running == 0 && s->dropping == 0;
}

/* Calls the drop callbacks of jobs taken out under the lock (each counted
 * in s->dropping, so that wait_idle waits for the callbacks too). */
static void drop_all(kiln_sched *s, job *drops, int forced_code) {
  int64_t now = kiln_sched_now_ns();
  for (job *j = drops, *next; j; j = next) {
    next = j->next;
    int code = forced_code;
    if (code == 0 && !dead(j, now, &code)) code = KILN_EDEADLINE;
    j->j.drop(j->j.arg, code);
    kiln_free(j);
    pthread_mutex_lock(&s->mu);
    s->dropping--;
    if (idle(s)) pthread_cond_broadcast(&s->idle_cv);
    pthread_mutex_unlock(&s->mu);
  }
}

/* Marks n devices of the class busy, `self` first; writes their ids. */
static void claim(kiln_sched *s, device *self, uint32_t n, uint32_t *ids) {
  self->busy = true;
  ids[0] = self->id;
  uint32_t got = 1, cls = self->dev_class;
  for (uint32_t i = 0; got < n && i < s->o.class_devices[cls]; i++) {
    device *d = &s->devs[s->first[cls] + i];
    if (!d->busy) {
      d->busy = true;
      ids[got++] = d->id;
    }
  }
}

/* Runs a claimed job on the calling thread, frees its devices, then calls
 * its done callback. */
static void run_claimed(kiln_sched *s, const kiln_sched_job *jd, const uint32_t *ids) {
  int64_t t0 = kiln_sched_now_ns();
  jd->run(jd->arg, ids, jd->ndevices);
  int64_t dt = kiln_sched_now_ns() - t0;
  pthread_mutex_lock(&s->mu);
  for (uint32_t i = 0; i < jd->ndevices; i++) {
    device *d = &s->devs[ids[i]];
    d->busy = false;
    d->executions++;
    d->busy_ns += (uint64_t)(dt > 0 ? dt : 0);
  }
  /* Only waiting work needs the freed devices; waking idle workers for
   * nothing would cost two context switches per job. */
  if (s->queued_class[jd->dev_class]) pthread_cond_broadcast(&s->work_cv[jd->dev_class]);
  if (jd->done == NULL) {
    s->running--;
    if (idle(s)) pthread_cond_broadcast(&s->idle_cv);
  }
  pthread_mutex_unlock(&s->mu);
  if (jd->done == NULL) return;
  jd->done(jd->arg, ids, jd->ndevices);
  /* Counted as running until done returns, so that wait_idle waits for it. */
  pthread_mutex_lock(&s->mu);
  s->running--;
  if (idle(s)) pthread_cond_broadcast(&s->idle_cv);
  pthread_mutex_unlock(&s->mu);
}

static void run_job(kiln_sched *s, job *j, const uint32_t *ids) {
  run_claimed(s, &j->j, ids);
  kiln_free(j);
}

static void *worker(void *arg) {
  device *self = arg;
  kiln_sched *s = self->s;
  uint32_t ids[KILN_SCHED_MAX_DEVICES];
  pthread_mutex_lock(&s->mu);
  for (;;) {
    job *drops = NULL, *j = NULL;
    while (!s->stop &&
           (self->busy || ((j = pick(s, self->dev_class, &drops)) == NULL && drops == NULL)))
      pthread_cond_wait(&s->work_cv[self->dev_class], &s->mu);
    if (j) {
      claim(s, self, j->j.ndevices, ids);
      s->running++;
    }
    if (idle(s)) pthread_cond_broadcast(&s->idle_cv);
    bool stop = s->stop && j == NULL;
    pthread_mutex_unlock(&s->mu);
    drop_all(s, drops, 0);
    if (j) run_job(s, j, ids);
    if (stop) return NULL;
    pthread_mutex_lock(&s->mu);
  }
}

/* ---- the public side --------------------------------------------------------------- */

static int check_options(const kiln_sched_options *o, kiln_status *st) {
  if (o->nclasses == 0 || o->nclasses > KILN_SCHED_MAX_CLASSES)
    return kiln_status_set(st, KILN_EINVAL, "scheduler", "%u device classes (1 to %d allowed)",
                           o->nclasses, KILN_SCHED_MAX_CLASSES);
  uint32_t total = 0;
  for (uint32_t c = 0; c < o->nclasses; c++) {
    if (o->class_devices[c] == 0 || o->class_devices[c] > KILN_SCHED_MAX_DEVICES - total)
      return kiln_status_set(st, KILN_EINVAL, "scheduler",
                             "device class %u has %u devices (1 to %d in all allowed)", c,
                             o->class_devices[c], KILN_SCHED_MAX_DEVICES);
    total += o->class_devices[c];
  }
  return 0;
}

static int start_workers(kiln_sched *s, kiln_status *st) {
  for (uint32_t i = 0; i < s->ndevs; i++) {
    if (kiln_thread_start(&s->devs[i].thread, worker, &s->devs[i]) != 0)
      return kiln_status_set(st, KILN_EINTERNAL, "scheduler", "cannot start worker thread %u", i);
    s->devs[i].started = true;
  }
  return 0;
}

int kiln_sched_create(const kiln_sched_options *o, kiln_sched **out, kiln_status *st) {
  *out = NULL;
  int rc = check_options(o, st);
  if (rc) return rc;
  kiln_sched *s = kiln_calloc(1, sizeof *s);
  if (s == NULL) return kiln_status_set(st, KILN_ENOMEM, "scheduler", "out of memory");
  s->o = *o;
  if (s->o.max_queued == 0) s->o.max_queued = 1024;
  if (s->o.max_queued_per_client == 0 || s->o.max_queued_per_client > s->o.max_queued)
    s->o.max_queued_per_client = s->o.max_queued;
  for (uint32_t c = 0; c < o->nclasses; c++) {
    s->first[c] = s->ndevs;
    s->ndevs += o->class_devices[c];
  }
  s->devs = kiln_calloc(s->ndevs, sizeof *s->devs);
  if (s->devs == NULL) {
    kiln_free(s);
    return kiln_status_set(st, KILN_ENOMEM, "scheduler", "out of memory");
  }
  for (uint32_t c = 0; c < o->nclasses; c++)
    for (uint32_t i = 0; i < o->class_devices[c]; i++) {
      device *d = &s->devs[s->first[c] + i];
      d->id = s->first[c] + i;
      d->dev_class = c;
      d->s = s;
    }
  pthread_mutex_init(&s->mu, NULL);
  for (uint32_t c = 0; c < KILN_SCHED_MAX_CLASSES; c++) pthread_cond_init(&s->work_cv[c], NULL);
  pthread_cond_init(&s->idle_cv, NULL);
  rc = start_workers(s, st);
  if (rc)
    kiln_sched_destroy(s);
  else
    *out = s;
  return rc;
}

void kiln_sched_destroy(kiln_sched *s) {
  if (s == NULL) return;
  job *drops = NULL;
  pthread_mutex_lock(&s->mu);
  s->stop = s->closed = true;
  while (s->cursor) {
    sclient *c = s->cursor;
    while (c->head) {
      job *j = c->head;
      unlink_job(s, j, NULL);
      s->dropping++;
      j->next = drops;
      drops = j;
    }
    ring_remove(s, c);
  }
  for (uint32_t c = 0; c < KILN_SCHED_MAX_CLASSES; c++) pthread_cond_broadcast(&s->work_cv[c]);
  pthread_mutex_unlock(&s->mu);
  drop_all(s, drops, KILN_EUNAVAIL);
  for (uint32_t i = 0; i < s->ndevs; i++)
    if (s->devs[i].started) pthread_join(s->devs[i].thread, NULL);
  for (uint32_t c = 0; c < KILN_SCHED_MAX_CLASSES; c++) pthread_cond_destroy(&s->work_cv[c]);
  pthread_cond_destroy(&s->idle_cv);
  pthread_mutex_destroy(&s->mu);
  kiln_quota_table_free(s->quotas);
  kiln_free(s->devs);
  kiln_free(s);
}

int kiln_sched_set_quotas(kiln_sched *s, const kiln_client_quota *q, size_t n, kiln_status *st) {
  kiln_quota_table *t;
  int rc = kiln_quota_table_make(q, n, &t, st);
  if (rc) return rc;
  pthread_mutex_lock(&s->mu);
  kiln_quota_table *old = s->quotas;
  s->quotas = t;
  pthread_mutex_unlock(&s->mu);
  kiln_quota_table_free(old);
  return 0;
}

static int check_job(const kiln_sched *s, const kiln_sched_job *jd, kiln_status *st) {
  if (jd->run == NULL || jd->drop == NULL || jd->client == NULL)
    return kiln_status_set(st, KILN_EINVAL, "scheduler", "job without client or callbacks");
  if (jd->dev_class >= s->o.nclasses)
    return kiln_status_set(st, KILN_EINVAL, "scheduler", "no device class %u", jd->dev_class);
  if (jd->ndevices == 0 || jd->ndevices > s->o.class_devices[jd->dev_class])
    return kiln_status_set(st, KILN_EINVAL, "scheduler", "job needs %u devices; the class has %u",
                           jd->ndevices, s->o.class_devices[jd->dev_class]);
  return 0;
}

/* Under the lock: KILN_EUNAVAIL / KILN_ELIMIT / 0, and the client record. */
static int admit(kiln_sched *s, const char *name, sclient **out, kiln_status *st) {
  if (s->closed)
    return kiln_status_set(st, KILN_EUNAVAIL, "scheduler", "the server is shutting down");
  if (s->queued >= s->o.max_queued)
    return kiln_status_set(st, KILN_ELIMIT, "scheduler", "execution queue is full (%u jobs)",
                           s->o.max_queued);
  sclient *c = ring_find(s, name);
  const kiln_client_quota *q = kiln_quota_table_find(s->quotas, name);
  uint32_t limit = q && q->queued ? q->queued : s->o.max_queued_per_client;
  if (c && c->n >= limit)
    return kiln_status_set(st, KILN_ELIMIT, "scheduler",
                           "this client already has %u executions queued (the limit)", c->n);
  if (c == NULL && (c = ring_add(s, name)) == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "scheduler", "out of memory");
  *out = c;
  return 0;
}

int kiln_sched_submit(kiln_sched *s, const kiln_sched_job *jd, kiln_status *st) {
  int rc = check_job(s, jd, st);
  if (rc) return rc;
  job *j = kiln_calloc(1, sizeof *j);
  if (j == NULL) return kiln_status_set(st, KILN_ENOMEM, "scheduler", "out of memory");
  j->j = *jd;
  pthread_mutex_lock(&s->mu);
  sclient *c = NULL;
  rc = admit(s, jd->client, &c, st);
  if (rc == 0) {
    j->cl = c;
    j->j.client = c->name;
    if (c->tail)
      c->tail->next = j;
    else
      c->head = j;
    c->tail = j;
    c->n++;
    s->queued++;
    s->queued_class[jd->dev_class]++;
    pthread_cond_broadcast(&s->work_cv[jd->dev_class]);
  }
  pthread_mutex_unlock(&s->mu);
  if (rc) kiln_free(j);
  return rc;
}

bool kiln_sched_run_now(kiln_sched *s, const kiln_sched_job *jd) {
  if (check_job(s, jd, NULL) != 0) return false;
  uint32_t ids[KILN_SCHED_MAX_DEVICES > 64 ? 64 : KILN_SCHED_MAX_DEVICES];
  if (jd->ndevices > sizeof ids / sizeof ids[0]) return false;
  uint32_t cls = jd->dev_class, got = 0;
  pthread_mutex_lock(&s->mu);
  /* Anything of the class already waiting goes first: running now would
   * overtake it. */
  bool can = !s->closed && s->queued_class[cls] == 0 && free_devices(s, cls) >= jd->ndevices;
  for (uint32_t i = 0; can && got < jd->ndevices && i < s->o.class_devices[cls]; i++) {
    device *d = &s->devs[s->first[cls] + i];
    if (!d->busy) {
      d->busy = true;
      ids[got++] = d->id;
    }
  }
  if (can) s->running++;
  pthread_mutex_unlock(&s->mu);
  if (!can) return false;
  run_claimed(s, jd, ids);
  return true;
}

uint32_t kiln_sched_expire(kiln_sched *s) {
  job *drops = NULL;
  pthread_mutex_lock(&s->mu);
  reap_all(s, &drops);
  if (idle(s)) pthread_cond_broadcast(&s->idle_cv);
  pthread_mutex_unlock(&s->mu);
  uint32_t n = 0;
  for (job *j = drops; j; j = j->next) n++;
  drop_all(s, drops, 0);
  return n;
}

void kiln_sched_close(kiln_sched *s) {
  pthread_mutex_lock(&s->mu);
  s->closed = true;
  pthread_mutex_unlock(&s->mu);
}

void kiln_sched_wait_idle(kiln_sched *s) {
  pthread_mutex_lock(&s->mu);
  while (!idle(s)) pthread_cond_wait(&s->idle_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

uint32_t kiln_sched_device_count(const kiln_sched *s) { return s->ndevs; }

uint32_t kiln_sched_class_devices(const kiln_sched *s, uint32_t cls) {
  return cls < s->o.nclasses ? s->o.class_devices[cls] : 0;
}

uint32_t kiln_sched_class_first(const kiln_sched *s, uint32_t cls) {
  return cls < s->o.nclasses ? s->first[cls] : 0;
}

uint32_t kiln_sched_queued(kiln_sched *s) {
  pthread_mutex_lock(&s->mu);
  uint32_t n = s->queued;
  pthread_mutex_unlock(&s->mu);
  return n;
}

uint32_t kiln_sched_running(kiln_sched *s) {
  pthread_mutex_lock(&s->mu);
  uint32_t n = s->running;
  pthread_mutex_unlock(&s->mu);
  return n;
}

bool kiln_sched_device_stats_get(kiln_sched *s, uint32_t d, kiln_sched_device_stats *out) {
  if (d >= s->ndevs) return false;
  pthread_mutex_lock(&s->mu);
  out->dev_class = s->devs[d].dev_class;
  out->executions = s->devs[d].executions;
  out->busy_ns = s->devs[d].busy_ns;
  out->busy = s->devs[d].busy;
  pthread_mutex_unlock(&s->mu);
  return true;
}
