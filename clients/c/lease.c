/* Lease renewal: kilnd keeps a client id's buffers only while the id makes
 * calls (--buffer-lease-seconds), so that a client that died leaks
 * nothing. Every call renews the lease; kiln_client_renew_leases is a call
 * that does nothing else (an empty ReleaseBuffers), and with
 * lease_keepalive_ms a thread of the client's own sends one whenever that
 * long passed without a call, as the Python client's keeper thread does.
 *
 * The thread sleeps on a condition variable (monotonic clock) so that
 * kiln_client_close wakes and joins it at once; a renewal it has in flight
 * has a deadline of its own interval, so close never waits for longer. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "clients/c/client_internal.h"
#include "common/alloc.h"

struct kiln__keeper {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* signalled by kiln__keeper_stop */
  bool stop;         /* under mu */
  _Atomic uint64_t renewals;
};

int64_t kiln__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int renew(kiln_client *c, int64_t deadline_ms, kiln_status *st) {
  /* An empty ReleaseBuffersRequest is zero bytes on the wire. */
  uint8_t *reply = NULL;
  size_t reply_len = 0;
  static const uint8_t empty[1] = {0};
  int rc = kiln__unary(c, KILN__M_RELEASE_BUFFERS, deadline_ms, empty, 0, &reply, &reply_len, st);
  kiln_free(reply);
  return rc;
}

int kiln_client_renew_leases(kiln_client *c, kiln_status *st) {
  if (c == NULL) return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "no client");
  return renew(c, 0, st);
}

uint64_t kiln_client_lease_renewals(const kiln_client *c) {
  return c && c->keeper ? atomic_load(&c->keeper->renewals) : 0;
}

static void *keep(void *arg) {
  kiln_client *c = arg;
  struct kiln__keeper *k = c->keeper;
  int64_t every = c->keepalive_ms, nap = every / 4 > 10 ? every / 4 : 10;
  pthread_mutex_lock(&k->mu);
  while (!k->stop) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += nap / 1000;
    until.tv_nsec += (nap % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000;
    }
    int rc = pthread_cond_timedwait(&k->cv, &k->mu, &until);
    if (k->stop) break;
    if (rc != ETIMEDOUT && rc != 0) continue;
    if (kiln__now_ms() - atomic_load(&c->last_call_ms) < every) continue;
    pthread_mutex_unlock(&k->mu);
    kiln_status st;
    kiln_status_clear(&st);
    /* A failed renewal (the server is gone) is the next call's error to
     * report; the thread just tries again. */
    if (renew(c, every, &st) == 0) atomic_fetch_add(&k->renewals, 1);
    pthread_mutex_lock(&k->mu);
  }
  pthread_mutex_unlock(&k->mu);
  return NULL;
}

int kiln__keeper_start(kiln_client *c, kiln_status *st) {
  struct kiln__keeper *k = kiln_calloc(1, sizeof *k);
  if (k == NULL) return kiln__client_oom(st);
  pthread_condattr_t ca;
  bool cv_ok = false, mu_ok = pthread_mutex_init(&k->mu, NULL) == 0;
  if (mu_ok && pthread_condattr_init(&ca) == 0) {
    cv_ok =
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&k->cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
  }
  c->keeper = k;
  if (cv_ok && pthread_create(&k->thread, NULL, keep, c) == 0) return 0;
  c->keeper = NULL;
  if (cv_ok) pthread_cond_destroy(&k->cv);
  if (mu_ok) pthread_mutex_destroy(&k->mu);
  kiln_free(k);
  return kiln__client_fail(st, KILN_RPC_INTERNAL, "cannot start the lease keep-alive thread");
}

void kiln__keeper_stop(kiln_client *c) {
  struct kiln__keeper *k = c->keeper;
  if (k == NULL) return;
  pthread_mutex_lock(&k->mu);
  k->stop = true;
  pthread_cond_signal(&k->cv);
  pthread_mutex_unlock(&k->mu);
  pthread_join(k->thread, NULL);
  pthread_cond_destroy(&k->cv);
  pthread_mutex_destroy(&k->mu);
  kiln_free(k);
  c->keeper = NULL;
}
