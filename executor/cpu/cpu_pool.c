/* The per-device worker pool: a fixed set of threads that run the chunks of
 * parallel loops (kernel launches, GEMM tiles, large copies).
 *
 * A parallel loop is a job on the submitting thread's stack, queued under
 * the pool mutex. Workers and the submitter claim chunks one at a time
 * under the mutex (chunks are coarse, a few per thread, so the lock is
 * cheap), and the submitter helps until nothing is left to claim, then
 * sleeps until the last claimed chunk has finished. Several threads may
 * submit at once (concurrent runs on one device): their jobs queue up and
 * workers drain them in order. The job leaves the queue when its last chunk
 * is claimed, and its memory is only released once the thread finishing the
 * last chunk has let go of the mutex, so no worker touches a dead job.
 *
 * A worker that runs out of work spins for a few tens of microseconds
 * before it sleeps (OpenMP's "block time", kept short): consecutive split
 * launches, the common case in a step program, then find the workers awake
 * and pay no futex wake-up; the submitter signals only sleeping workers.
 *
 * Workers run with denormals flushed to zero, as runs do on the submitting
 * thread (see kiln__cpu_flush_denormals).
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "executor/cpu/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define MXCSR_FTZ_DAZ 0x8040u
#endif

#define SPIN_NS 50000 /* how long an idle worker polls before sleeping */

typedef struct job {
  kiln__cpu_task_fn fn;
  void *ctx;
  uint64_t nchunks;
  uint64_t next;    /* next chunk to claim (under the mutex) */
  uint64_t ndone;   /* finished chunks (under the mutex) */
  struct job *link; /* queue order */
} job;

struct kiln__cpu_pool {
  pthread_mutex_t mu;
  pthread_cond_t work; /* a job was queued, or stop */
  pthread_cond_t done; /* some job finished its last chunk */
  job *head, *tail;
  _Atomic uint32_t queued; /* jobs in the queue; read without the mutex by spinners */
  _Atomic bool stop;
  uint32_t sleeping; /* workers waiting on `work` (under the mutex) */
  uint32_t nthreads; /* workers + the submitting thread */
  uint32_t nworkers; /* threads actually started */
  pthread_t *workers;
};

static void unlink_job(kiln__cpu_pool *p, job *j) {
  job **pp = &p->head, *prev = NULL;
  while (*pp && *pp != j) {
    prev = *pp;
    pp = &(*pp)->link;
  }
  if (*pp == NULL) return;
  *pp = j->link;
  if (p->tail == j) p->tail = prev;
  atomic_fetch_sub_explicit(&p->queued, 1, memory_order_relaxed);
}

/* Claims the next chunk of j (mutex held); false when none is left. */
static bool claim(kiln__cpu_pool *p, job *j, uint64_t *chunk) {
  if (j->next >= j->nchunks) return false;
  *chunk = j->next++;
  if (j->next == j->nchunks) unlink_job(p, j);
  return true;
}

/* Records a finished chunk (mutex held). */
static void finish(kiln__cpu_pool *p, job *j) {
  if (++j->ndone == j->nchunks) pthread_cond_broadcast(&p->done);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Polls for queued work for SPIN_NS (mutex not held). */
static void spin_for_work(kiln__cpu_pool *p) {
  int64_t until = now_ns() + SPIN_NS;
  for (uint32_t i = 0;; i++) {
    if (atomic_load_explicit(&p->queued, memory_order_relaxed) ||
        atomic_load_explicit(&p->stop, memory_order_relaxed))
      return;
    cpu_relax();
    if ((i & 63) == 63 && now_ns() > until) return;
  }
}

unsigned kiln__cpu_flush_denormals(void) {
#ifdef MXCSR_FTZ_DAZ
  unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | MXCSR_FTZ_DAZ);
  return csr;
#else
  return 0;
#endif
}

void kiln__cpu_restore_denormals(unsigned saved) {
#ifdef MXCSR_FTZ_DAZ
  _mm_setcsr(saved);
#else
  (void)saved;
#endif
}

static void *worker_main(void *arg) {
  kiln__cpu_pool *p = arg;
  (void)kiln__cpu_flush_denormals();
  pthread_mutex_lock(&p->mu);
  for (;;) {
    if (!p->stop && p->head == NULL) {
      pthread_mutex_unlock(&p->mu);
      spin_for_work(p);
      pthread_mutex_lock(&p->mu);
      while (!p->stop && p->head == NULL) {
        p->sleeping++;
        pthread_cond_wait(&p->work, &p->mu);
        p->sleeping--;
      }
    }
    if (p->stop) break;
    job *j = p->head;
    uint64_t c;
    if (!claim(p, j, &c)) continue;
    pthread_mutex_unlock(&p->mu);
    j->fn(j->ctx, c);
    pthread_mutex_lock(&p->mu);
    finish(p, j);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

int kiln__cpu_pool_create(uint32_t nthreads, kiln__cpu_pool **out, kiln_status *st) {
  *out = NULL;
  if (nthreads == 0) nthreads = 1;
  kiln__cpu_pool *p = kiln_calloc(1, sizeof *p);
  if (p == NULL) return kiln_status_set(st, KILN_ENOMEM, "cpu", "out of memory for a pool");
  p->nthreads = nthreads;
  if (nthreads > 1) {
    p->workers = kiln_calloc(nthreads - 1, sizeof *p->workers);
    if (p->workers == NULL) {
      kiln_free(p);
      return kiln_status_set(st, KILN_ENOMEM, "cpu", "out of memory for %u threads", nthreads);
    }
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->done, NULL);
  for (uint32_t i = 0; i + 1 < nthreads; i++) {
    int err = pthread_create(&p->workers[i], NULL, worker_main, p);
    if (err) {
      kiln__cpu_pool_destroy(p);
      return kiln_status_set(st, err == EAGAIN ? KILN_ELIMIT : KILN_EINTERNAL, "cpu",
                             "cannot start worker thread %u of %u: %s", i + 1, nthreads - 1,
                             strerror(err));
    }
    p->nworkers++;
  }
  *out = p;
  return 0;
}

void kiln__cpu_pool_destroy(kiln__cpu_pool *p) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  for (uint32_t i = 0; i < p->nworkers; i++) pthread_join(p->workers[i], NULL);
  pthread_cond_destroy(&p->done);
  pthread_cond_destroy(&p->work);
  pthread_mutex_destroy(&p->mu);
  kiln_free(p->workers);
  kiln_free(p);
}

uint32_t kiln__cpu_pool_threads(const kiln__cpu_pool *p) { return p->nworkers + 1; }

void kiln__cpu_pool_run(kiln__cpu_pool *p, kiln__cpu_task_fn fn, void *ctx, uint64_t nchunks) {
  if (nchunks == 0) return;
  if (p->nworkers == 0 || nchunks == 1) {
    for (uint64_t c = 0; c < nchunks; c++) fn(ctx, c);
    return;
  }
  job j = {.fn = fn, .ctx = ctx, .nchunks = nchunks};
  pthread_mutex_lock(&p->mu);
  if (p->tail)
    p->tail->link = &j;
  else
    p->head = &j;
  p->tail = &j;
  atomic_fetch_add_explicit(&p->queued, 1, memory_order_relaxed);
  /* Spinning workers see `queued`; wake sleepers, no more than can help. */
  uint64_t wake = nchunks - 1 < p->sleeping ? nchunks - 1 : p->sleeping;
  if (wake >= p->sleeping && wake > 0)
    pthread_cond_broadcast(&p->work);
  else
    for (uint64_t i = 0; i < wake; i++) pthread_cond_signal(&p->work);
  uint64_t c;
  while (claim(p, &j, &c)) {
    pthread_mutex_unlock(&p->mu);
    fn(ctx, c);
    pthread_mutex_lock(&p->mu);
    finish(p, &j);
  }
  while (j.ndone < j.nchunks) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}
