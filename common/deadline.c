/* The calling thread's deadline: one thread-local pointer (deadline.h). */
#include "common/deadline.h"

#include <time.h>

static _Thread_local const kiln_deadline *current;

int64_t kiln__deadline_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

const kiln_deadline *kiln__deadline_install(const kiln_deadline *d) {
  const kiln_deadline *old = current;
  current = d;
  return old;
}

int kiln__deadline_check(const char *what, kiln_status *st) {
  const kiln_deadline *d = current;
  if (d == NULL) return 0;
  if (d->cancelled && atomic_load(d->cancelled))
    return kiln_status_set(st, KILN_ECANCELED, what, "the caller cancelled the call during %s",
                           what);
  if (d->at_ns == 0 || kiln__deadline_now_ns() < d->at_ns) return 0;
  return kiln_status_set(st, KILN_EDEADLINE, what, "%s passed during %s",
                         d->limit ? d->limit : "the deadline", what);
}
