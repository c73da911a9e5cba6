/* Deadlines and cancellation for long work, polled where the work loops.
 *
 * A thread that does work on behalf of a call (a Compile on the compile
 * pool, kiln compile in the CLI) installs one kiln_deadline for the whole
 * of it: when it must be done by, and a flag that says the caller went
 * away. The passes, transforms and the lowering do not take it as an
 * argument: they call kiln__deadline_check in their loops, which reads the
 * thread's installed deadline and costs one thread-local load when none is
 * installed and one clock read otherwise. Once the deadline has passed or
 * the caller went away every check fails, so the first loop to notice
 * unwinds the work with a status naming what was running.
 */
#ifndef KILN_COMMON_DEADLINE_H
#define KILN_COMMON_DEADLINE_H

#include <stdatomic.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_deadline {
  int64_t at_ns;               /* CLOCK_MONOTONIC nanoseconds; 0: no deadline */
  const atomic_int *cancelled; /* NULL, or nonzero once the caller went away */
  /* What set at_ns, for the message ("--compile-timeout of 2 s", "the
   * call's deadline"); NULL: "the deadline". Not copied. */
  const char *limit;
} kiln_deadline;

/* CLOCK_MONOTONIC in nanoseconds (the clock of at_ns). */
int64_t kiln__deadline_now_ns(void);

/* Installs d for the calling thread (NULL removes it) and returns the one
 * installed before, so that nested work can restore it. d must outlive its
 * installation. */
const kiln_deadline *kiln__deadline_install(const kiln_deadline *d);

/* 0 while the calling thread's deadline (if any) has not passed and its
 * caller has not gone away; else KILN_EDEADLINE or KILN_ECANCELED, with
 * `what` (the pass, transform or stage running: "fusion") in st. */
int kiln__deadline_check(const char *what, kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMMON_DEADLINE_H */
