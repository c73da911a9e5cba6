/* The phases of Compile calls: reported to CompileStream callers as they
 * happen, and listed for Stats (`kiln top`).
 *
 * Every Compile and CompileStream call that gets past its cheap checks
 * owns a kilnd_progress (the first member of its c->state) from then until
 * the call is freed; while it lives it is on the server's list of active
 * compiles. Phases are set from wherever the compile is: the completion-
 * queue thread (QUEUED), the compile pool (the rest) and, through the
 * cache's wait hook, from under the cache's lock. Setting a phase never
 * blocks: for a stream it queues a small message, and the send of each
 * completes on a cq thread, which starts the next (a call never has two
 * sends in flight). Only the end waits, on the compile pool, until the
 * queue has drained, so the result always comes after every phase.
 */
#ifndef KILN_SERVER_PROGRESS_H
#define KILN_SERVER_PROGRESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kiln/v1/kiln.pb-c.h"

typedef struct kilnd_call kilnd_call;

#define KILND_PROGRESS_QUEUE 16 /* phases waiting to be sent (there are 7) */

typedef struct kilnd_progress {
  kilnd_call *c;
  bool stream;      /* CompileStream: phases are sent */
  atomic_int phase; /* Kiln__V1__CompilePhase, for Stats */
  pthread_mutex_t mu;
  pthread_cond_t drained;
  struct {
    int phase;
    const char *detail; /* static */
    int64_t elapsed_ns;
  } queue[KILND_PROGRESS_QUEUE];
  uint32_t head, n; /* guarded by mu */
  bool in_flight;   /* a send batch is running */
  bool failed;      /* a send failed: the caller went away; nothing more is sent */
  struct kilnd_progress *prev, *next; /* the active list, under its own lock */
} kilnd_progress;

/* Starts tracking call c (listed, phase UNSPECIFIED until the first set). */
void kilnd_progress_init(kilnd_progress *p, kilnd_call *c, bool stream);
/* Takes p off the list; no send may be in flight (after kilnd_progress_finish). */
void kilnd_progress_destroy(kilnd_progress *p);
/* Enters `phase` (a Kiln__V1__CompilePhase); detail static or NULL. */
void kilnd_progress_set(kilnd_progress *p, int phase, const char *detail);
/* Answers the call: Compile's reply as it is, CompileStream's as a last
 * DONE message carrying it (after every queued phase). rc/st as for
 * kilnd_call_finish. Consumes the handler's reference. */
void kilnd_progress_finish(kilnd_progress *p, Kiln__V1__CompileResponse *resp, int rc,
                           const kiln_status *st);

/* Sends nothing more (the call is answered some other way, at once). */
void kilnd_progress_stop(kilnd_progress *p);

/* The progress of a Compile or CompileStream call (the start of c->state),
 * or NULL before it has one. */
kilnd_progress *kilnd_progress_of(kilnd_call *c);

/* Each active compile, oldest first, under the list's lock (fn must not
 * block). */
typedef void (*kilnd_progress_fn)(void *arg, const kilnd_call *c, int phase);
void kilnd_progress_each(kilnd_progress_fn fn, void *arg);

#endif /* KILN_SERVER_PROGRESS_H */
