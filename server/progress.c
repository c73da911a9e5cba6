/* Compile phases: the active list and CompileStream's message queue
 * (progress.h says who calls what from where). */
#include "server/progress.h"

#include <string.h>

#include <grpc/byte_buffer.h>

#include "executor/scheduler.h"
#include "server/server.h"

/* The active compiles of the process (one server per process). */
static pthread_mutex_t list_mu = PTHREAD_MUTEX_INITIALIZER;
static kilnd_progress *list_head, *list_tail;

void kilnd_progress_init(kilnd_progress *p, kilnd_call *c, bool stream) {
  memset(p, 0, sizeof *p);
  p->c = c;
  p->stream = stream;
  atomic_store(&p->phase, KILN__V1__COMPILE_PHASE__COMPILE_PHASE_UNSPECIFIED);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->drained, NULL);
  pthread_mutex_lock(&list_mu);
  p->prev = list_tail;
  if (list_tail)
    list_tail->next = p;
  else
    list_head = p;
  list_tail = p;
  pthread_mutex_unlock(&list_mu);
}

void kilnd_progress_destroy(kilnd_progress *p) {
  pthread_mutex_lock(&list_mu);
  if (p->prev)
    p->prev->next = p->next;
  else
    list_head = p->next;
  if (p->next)
    p->next->prev = p->prev;
  else
    list_tail = p->prev;
  pthread_mutex_unlock(&list_mu);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->drained);
}

kilnd_progress *kilnd_progress_of(kilnd_call *c) {
  if (c->method == NULL || c->state == NULL) return NULL;
  if (c->method->id != KILND_M_COMPILE && c->method->id != KILND_M_COMPILE_STREAM) return NULL;
  return c->state;
}

void kilnd_progress_each(kilnd_progress_fn fn, void *arg) {
  pthread_mutex_lock(&list_mu);
  for (kilnd_progress *p = list_head; p; p = p->next) fn(arg, p->c, atomic_load(&p->phase));
  pthread_mutex_unlock(&list_mu);
}

/* ---- the stream ---------------------------------------------------------------------- */

static void on_sent(kilnd_tag *tag, bool ok);

/* Sends the queue's head; p->mu held. */
static void send_next(kilnd_progress *p) {
  while (p->n > 0 && !p->in_flight && !p->failed) {
    Kiln__V1__CompileProgress m = KILN__V1__COMPILE_PROGRESS__INIT;
    m.phase = (Kiln__V1__CompilePhase)p->queue[p->head].phase;
    m.detail = (char *)(p->queue[p->head].detail ? p->queue[p->head].detail : "");
    m.elapsed_ns = p->queue[p->head].elapsed_ns;
    p->head = (p->head + 1) % KILND_PROGRESS_QUEUE;
    p->n--;
    if (kilnd_call_send_message(p->c, &m.base, on_sent) == 0)
      p->in_flight = true;
    else
      p->failed = true;
  }
  if (!p->in_flight) pthread_cond_broadcast(&p->drained);
}

static void on_sent(kilnd_tag *tag, bool ok) {
  kilnd_call *c = KILND_CALL_FROM_TAG(tag, stream_tag);
  kilnd_progress *p = c->state;
  pthread_mutex_lock(&p->mu);
  p->in_flight = false;
  if (!ok) p->failed = true;
  send_next(p);
  pthread_mutex_unlock(&p->mu);
}

void kilnd_progress_set(kilnd_progress *p, int phase, const char *detail) {
  if (atomic_exchange(&p->phase, phase) == phase && !detail) return;
  if (!p->stream) return;
  pthread_mutex_lock(&p->mu);
  if (p->n < KILND_PROGRESS_QUEUE && !p->failed) {
    uint32_t tail = (p->head + p->n) % KILND_PROGRESS_QUEUE;
    p->queue[tail].phase = phase;
    p->queue[tail].detail = detail;
    p->queue[tail].elapsed_ns = kiln_sched_now_ns() - p->c->start_ns;
    p->n++;
  }
  send_next(p);
  pthread_mutex_unlock(&p->mu);
}

void kilnd_progress_stop(kilnd_progress *p) {
  pthread_mutex_lock(&p->mu);
  p->failed = true;
  pthread_mutex_unlock(&p->mu);
}

void kilnd_progress_finish(kilnd_progress *p, Kiln__V1__CompileResponse *resp, int rc,
                           const kiln_status *st) {
  kilnd_call *c = p->c;
  atomic_store(&p->phase, KILN__V1__COMPILE_PHASE__COMPILE_PHASE_DONE);
  if (!p->stream) {
    kilnd_call_finish(c, resp ? &resp->base : NULL, rc, st);
    return;
  }
  pthread_mutex_lock(&p->mu);
  while (p->in_flight) pthread_cond_wait(&p->drained, &p->mu);
  p->failed = true; /* nothing is queued after the end */
  pthread_mutex_unlock(&p->mu);
  if (c->reply) { /* the last phase's message, sent */
    grpc_byte_buffer_destroy(c->reply);
    c->reply = NULL;
  }
  Kiln__V1__CompileProgress m = KILN__V1__COMPILE_PROGRESS__INIT;
  m.phase = KILN__V1__COMPILE_PHASE__COMPILE_PHASE_DONE;
  m.elapsed_ns = kiln_sched_now_ns() - c->start_ns;
  m.result = resp;
  kilnd_call_finish(c, rc == 0 ? &m.base : NULL, rc, st);
}
