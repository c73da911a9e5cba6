/* The watch list of client streams holding reservations (stall.h): one
 * list per process (kilnd serves one server per process), a mutex, and a
 * sweep from the loop's timer. */
#include "server/stall.h"

#include <pthread.h>
#include <stdio.h>

#include <grpc/grpc.h>

#include "executor/scheduler.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static kilnd_stall *head;

void kilnd_stall_watch(kilnd_stall *w, kilnd_call *c, void (*release)(kilnd_call *c)) {
  pthread_mutex_lock(&mu);
  *w = (kilnd_stall){.c = c, .release = release, .last_ns = kiln_sched_now_ns(), .listed = true};
  w->next = head;
  if (head) head->prev = w;
  head = w;
  pthread_mutex_unlock(&mu);
}

bool kilnd_stall_begin(kilnd_stall *w) {
  pthread_mutex_lock(&mu);
  bool ok = !w->stalled;
  if (ok) w->busy = true;
  pthread_mutex_unlock(&mu);
  return ok;
}

void kilnd_stall_end(kilnd_stall *w) {
  pthread_mutex_lock(&mu);
  w->busy = false;
  w->last_ns = kiln_sched_now_ns();
  pthread_mutex_unlock(&mu);
}

void kilnd_stall_forget(kilnd_stall *w) {
  pthread_mutex_lock(&mu);
  if (w->listed) {
    if (w->prev)
      w->prev->next = w->next;
    else
      head = w->next;
    if (w->next) w->next->prev = w->prev;
    w->listed = false;
  }
  pthread_mutex_unlock(&mu);
}

void kilnd_stall_fail(kilnd_call *c) {
  kilnd_call_fail(c, KILN_EDEADLINE,
                  "the stream sent nothing for longer than the stream idle timeout "
                  "(stream-idle-timeout of %g s): its reservation was released",
                  c->srv->cfg.stream_idle_timeout);
}

void kilnd_stall_sweep(kilnd *srv, double idle_s) {
  if (idle_s <= 0) return;
  int64_t now = kiln_sched_now_ns(), idle_ns = (int64_t)(idle_s * 1e9);
  char msg[160];
  snprintf(msg, sizeof msg,
           "the stream sent nothing for %g s (stream-idle-timeout): its reservation was released",
           idle_s);
  pthread_mutex_lock(&mu);
  for (kilnd_stall *w = head; w; w = w->next) {
    if (w->busy || w->stalled || now - w->last_ns < idle_ns || w->c->srv != srv) continue;
    w->stalled = true;
    w->release(w->c);
    /* The pending receive completes (ok false, or no message) and its
     * handler sees `stalled`; the status goes to the client now. */
    grpc_call_cancel_with_status(w->c->call, GRPC_STATUS_DEADLINE_EXCEEDED, msg, NULL);
  }
  pthread_mutex_unlock(&mu);
}
