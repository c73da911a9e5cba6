/* The scheduler: a device pool with fair per-client queues.
 *
 * Devices come in classes (the server's: cpu devices, then the interpreter);
 * device ids are numbered class after class. Each device has a worker thread.
 * A job names its client, its class and how many devices of that class it
 * needs at once (an SPMD program with P partitions is gang-scheduled on P
 * devices); a free worker takes the next job round-robin over the clients
 * that have one waiting, so a client with a thousand queued calls delays a
 * client with one by at most one job per device. Within a client, jobs of a
 * class start in the order they came. A gang's devices are claimed all at
 * once, and a gang whose turn it is waits for them without being overtaken
 * by later jobs of its class: gangs neither deadlock nor starve.
 *
 * The queue is bounded, in total and per client: a full queue refuses the
 * job (KILN_ELIMIT) rather than letting latency grow without limit. A job
 * whose deadline passes, or whose caller went away (its cancel flag), while
 * it waits is dropped instead of run: its drop callback gets
 * KILN_EDEADLINE or KILN_ECANCELED. Closing the scheduler refuses new jobs
 * (KILN_EUNAVAIL) and lets the queued ones run; destroying it drops what is
 * still queued with KILN_EUNAVAIL and joins the workers.
 *
 * Exactly one of run and drop is called for every accepted job, once, from a
 * worker thread (run, and drops noticed by a worker), from kiln_sched_expire's
 * caller, or from kiln_sched_destroy's caller. Neither is called with the
 * scheduler's lock held, so they may submit new jobs. kiln_sched_run_now
 * runs a job on its caller's thread instead, when no queued job would be
 * overtaken. A job's optional done callback follows its run on the same
 * thread, after the devices were freed.
 */
#ifndef KILN_EXECUTOR_SCHEDULER_H
#define KILN_EXECUTOR_SCHEDULER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "executor/quota.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_sched kiln_sched;

#define KILN_SCHED_MAX_CLASSES 8
#define KILN_SCHED_MAX_DEVICES 1024

typedef struct kiln_sched_options {
  uint32_t nclasses;
  uint32_t class_devices[KILN_SCHED_MAX_CLASSES]; /* devices per class, each >= 1 */
  uint32_t max_queued;                            /* all clients together; 0: 1024 */
  uint32_t max_queued_per_client;                 /* 0: max_queued */
} kiln_sched_options;

/* Runs the job on devices[0..n) (global device ids, all of the job's class). */
typedef void (*kiln_sched_run_fn)(void *arg, const uint32_t *devices, uint32_t n);
/* The job will not run: code is KILN_EDEADLINE, KILN_ECANCELED or
 * KILN_EUNAVAIL. */
typedef void (*kiln_sched_drop_fn)(void *arg, int code);

typedef struct kiln_sched_job {
  const char *client; /* copied */
  uint32_t dev_class;
  uint32_t ndevices;   /* >= 1, at most the class's device count */
  int64_t deadline_ns; /* kiln_sched_now_ns() clock; 0: none */
  /* Nonzero once the caller went away. Must stay valid until run or drop
   * has been called. May be NULL. */
  const atomic_int *cancelled;
  kiln_sched_run_fn run;
  /* May be NULL. Called after run, on the same thread, once the devices are
   * free again (other jobs may already use them): for the part of the work
   * that needs no device, such as sending the reply. */
  kiln_sched_run_fn done;
  kiln_sched_drop_fn drop;
  void *arg;
} kiln_sched_job;

typedef struct kiln_sched_device_stats {
  uint32_t dev_class;
  uint64_t executions;
  uint64_t busy_ns;
  bool busy;
} kiln_sched_device_stats;

/* Starts one worker thread per device. */
int kiln_sched_create(const kiln_sched_options *o, kiln_sched **out, kiln_status *st);
/* Drops every queued job with KILN_EUNAVAIL, waits for running ones and
 * joins the workers. NULL is a no-op. */
/* Replaces the per-client queue limits (executor/quota.h: `queued`);
 * executions already queued stay. */
int kiln_sched_set_quotas(kiln_sched *s, const kiln_client_quota *q, size_t n, kiln_status *st);
void kiln_sched_destroy(kiln_sched *s);

/* Queues a job. KILN_ELIMIT when the queue (or the client's share) is full,
 * KILN_EUNAVAIL once closed, KILN_EINVAL for a bad class or device count.
 * On error neither callback is called. */
int kiln_sched_submit(kiln_sched *s, const kiln_sched_job *job, kiln_status *st);

/* Runs the job on the calling thread, at once, when that overtakes no one:
 * the scheduler is open, no job of the job's class is queued, and enough
 * devices of the class are free. Then the devices are claimed as a worker
 * would claim them, run is called here and true returned once it has
 * returned (drop is never called). Otherwise nothing happens and false is
 * returned: submit the job instead. For work too small to be worth a hand-off
 * to a worker thread. */
bool kiln_sched_run_now(kiln_sched *s, const kiln_sched_job *job);

/* Drops queued jobs past their deadline or cancelled, calling their drop
 * callbacks from the calling thread. Returns how many were dropped. Meant
 * for a periodic timer: workers also check when they take a job. */
uint32_t kiln_sched_expire(kiln_sched *s);

/* Refuses new jobs from now on; queued and running jobs go on. */
void kiln_sched_close(kiln_sched *s);
/* Blocks until nothing is queued or running. */
void kiln_sched_wait_idle(kiln_sched *s);

uint32_t kiln_sched_device_count(const kiln_sched *s);
uint32_t kiln_sched_class_devices(const kiln_sched *s, uint32_t dev_class);
/* First global device id of a class. */
uint32_t kiln_sched_class_first(const kiln_sched *s, uint32_t dev_class);
uint32_t kiln_sched_queued(kiln_sched *s);
uint32_t kiln_sched_running(kiln_sched *s);
/* Stats of device `d`; false when out of range. */
bool kiln_sched_device_stats_get(kiln_sched *s, uint32_t d, kiln_sched_device_stats *out);

/* CLOCK_MONOTONIC in nanoseconds: the clock of deadline_ns. */
int64_t kiln_sched_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXECUTOR_SCHEDULER_H */
