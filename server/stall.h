/* Streams that stall: a client stream (PutBuffer) that holds a reservation
 * while it waits for its next message is watched, and one that sends
 * nothing for --stream-idle-timeout gives its reservation back and is
 * cancelled, so an idle uploader cannot pin server memory for as long as it
 * keeps its connection open.
 *
 * A handler marks the time it spends on a message (begin .. end); the
 * loop's housekeeping timer sweeps the watched streams and releases those
 * idle past the limit that are not being handled, through the release
 * callback, under the watch list's lock: so a release never races the
 * handler that would consume the reservation.
 */
#ifndef KILN_SERVER_STALL_H
#define KILN_SERVER_STALL_H

#include <stdbool.h>
#include <stdint.h>

#include "server/server.h"

typedef struct kilnd_stall kilnd_stall;

struct kilnd_stall {
  kilnd_stall *prev, *next;
  kilnd_call *c;
  void (*release)(kilnd_call *c); /* gives the reservation back; under the lock */
  int64_t last_ns;                /* kiln_sched_now_ns of the last message handled */
  bool listed, busy, stalled;
};

/* Starts watching c's stream (w lives in c's state). */
void kilnd_stall_watch(kilnd_stall *w, kilnd_call *c, void (*release)(kilnd_call *c));
/* A message arrived: false when the stream was already released as idle
 * (the handler then fails the call with kilnd_stall_fail). */
bool kilnd_stall_begin(kilnd_stall *w);
/* The message was handled; the idle time starts again. */
void kilnd_stall_end(kilnd_stall *w);
/* Stops watching (before c's state is freed). */
void kilnd_stall_forget(kilnd_stall *w);
/* Fails a released call with the status that says why. */
void kilnd_stall_fail(kilnd_call *c);
/* Releases and cancels the streams idle for longer than idle_s (0: none). */
void kilnd_stall_sweep(kilnd *srv, double idle_s);

#endif /* KILN_SERVER_STALL_H */
