/* Stats: the counters /metrics exposes, as messages, plus one entry per
 * device of the pool and the most watched figures summarized. Answered on
 * the completion-queue thread: it only reads counters.
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/arena.h"
#include "executor/backend.h"
#include "executor/buffers.h"
#include "executor/scheduler.h"
#include "kiln/v1/kiln.pb-c.h"
#include "server/executables.h"
#include "server/server.h"

#define KILND_VERSION "0.1.0"

typedef struct counters {
  kiln_arena *a;
  Kiln__V1__Counter **v;
  size_t n, cap;
  bool failed;
} counters;

static Kiln__V1__Label *label(kiln_arena *a, const char *name, const char *value) {
  Kiln__V1__Label *l = kiln_arena_alloc(a, sizeof *l);
  if (l == NULL) return NULL;
  kiln__v1__label__init(l);
  l->name = kiln_arena_strdup(a, name);
  l->value = kiln_arena_strdup(a, value);
  return l->name && l->value ? l : NULL;
}

static void add_counter(void *arg, const char *name, const char *l1, const char *v1, const char *l2,
                        const char *v2, int64_t value) {
  counters *cs = arg;
  if (cs->failed || kiln_grow((void **)&cs->v, &cs->cap, cs->n + 1, sizeof *cs->v)) {
    cs->failed = true;
    return;
  }
  Kiln__V1__Counter *k = kiln_arena_alloc(cs->a, sizeof *k);
  Kiln__V1__Label **labels = kiln_arena_calloc(cs->a, 2, sizeof *labels);
  if (k == NULL || labels == NULL) {
    cs->failed = true;
    return;
  }
  kiln__v1__counter__init(k);
  k->name = kiln_arena_strdup(cs->a, name);
  k->value = value;
  k->labels = labels;
  if (l1) labels[k->n_labels++] = label(cs->a, l1, v1);
  if (l2) labels[k->n_labels++] = label(cs->a, l2, v2);
  for (size_t i = 0; i < k->n_labels; i++)
    if (labels[i] == NULL) cs->failed = true;
  if (k->name == NULL) cs->failed = true;
  cs->v[cs->n++] = k;
}

static int add_devices(kilnd *srv, kiln_arena *a, Kiln__V1__StatsResponse *r) {
  uint32_t n = kiln_sched_device_count(srv->sched);
  r->devices = kiln_arena_calloc(a, n, sizeof *r->devices);
  if (r->devices == NULL) return KILN_ENOMEM;
  for (uint32_t d = 0; d < n; d++) {
    kiln_sched_device_stats ds;
    kiln_sched_device_stats_get(srv->sched, d, &ds);
    Kiln__V1__DeviceStats *p = kiln_arena_alloc(a, sizeof *p);
    char desc[64];
    if (p == NULL) return KILN_ENOMEM;
    kiln__v1__device_stats__init(p);
    p->device = (int32_t)d;
    const char *backend = kiln_backend_name(kilnd_class_backend(srv, (int)ds.dev_class));
    uint32_t local = d - kiln_sched_class_first(srv->sched, ds.dev_class);
    p->backend = (char *)backend; /* static; protobuf-c only reads it */
    snprintf(desc, sizeof desc, "%s:%u", backend, local);
    p->description = kiln_arena_strdup(a, desc);
    if (p->description == NULL) return KILN_ENOMEM;
    p->executions = (int64_t)ds.executions;
    p->busy_ns = (int64_t)ds.busy_ns;
    r->devices[r->n_devices++] = p;
  }
  return 0;
}

void kilnd_handle_stats(kilnd_call *c, ProtobufCMessage *req) {
  (void)req;
  kilnd *srv = c->srv;
  counters cs = {.a = kiln_arena_create()};
  if (cs.a == NULL) {
    kilnd_call_fail(c, KILN_ENOMEM, "out of memory");
    return;
  }
  Kiln__V1__StatsResponse r = KILN__V1__STATS_RESPONSE__INIT;
  r.server_version = KILND_VERSION;
  r.uptime_ns = kiln_sched_now_ns() - srv->start_ns;
  kilnd_metrics_each_counter(srv, add_counter, &cs);
  r.counters = cs.v;
  r.n_counters = cs.n;
  kiln_buffer_store_totals bt;
  kiln_buffer_store_get_totals(srv->buffers, &bt);
  r.compiles = (int64_t)kilnd_metrics_total(srv, "compiles");
  r.cache_hits = (int64_t)kilnd_metrics_total(srv, "cache_hits");
  r.cache_misses = (int64_t)kilnd_metrics_total(srv, "cache_misses");
  r.executions = (int64_t)kilnd_metrics_total(srv, "executions");
  r.live_buffers = (int64_t)bt.live_buffers;
  r.live_buffer_bytes = (int64_t)bt.live_bytes;
  r.queued_requests = kiln_sched_queued(srv->sched);
  if (cs.failed || add_devices(srv, cs.a, &r) != 0)
    kilnd_call_fail(c, KILN_ENOMEM, "out of memory");
  else
    kilnd_call_finish(c, &r.base, 0, NULL);
  kiln_free(cs.v);
  kiln_arena_destroy(cs.a);
}
