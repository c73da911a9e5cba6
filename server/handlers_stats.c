/* Stats: the counters /metrics exposes, as messages, plus one entry per
 * device of the pool and the most watched figures summarized. Answered on
 * the completion-queue thread: it only reads counters.
 */
#include <stdio.h>
#include <string.h>

#include "cache/cache.h"
#include "common/alloc.h"
#include "common/arena.h"
#include "executor/backend.h"
#include "executor/buffers.h"
#ifdef KILN_HAVE_CUDA
#include "executor/cuda/cuda.h"
#endif
#include "executor/scheduler.h"
#include "kiln/v1/kiln.pb-c.h"
#include "server/executables.h"
#include "server/progress.h"
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

/* The GPUs of the cuda backend, after the scheduler's devices: their
 * allocator's memory (held: live and cached blocks; limit: its budget). */
static int add_cuda_devices(kilnd *srv, kiln_arena *a, Kiln__V1__StatsResponse *r) {
#ifdef KILN_HAVE_CUDA
  uint32_t n = srv->cuda ? kiln_backend_device_count(srv->cuda) : 0;
  for (uint32_t i = 0; i < n; i++) {
    kiln_cuda_memory mem;
    kiln_cuda_device_info info;
    if (!kiln_cuda_device_memory(kiln_backend_device(srv->cuda, i), &mem)) continue;
    if (kiln_cuda_device_info_get(i, &info, NULL) != 0) snprintf(info.name, sizeof info.name, "?");
    Kiln__V1__DeviceStats *p = kiln_arena_alloc(a, sizeof *p);
    char desc[200];
    if (p == NULL) return KILN_ENOMEM;
    kiln__v1__device_stats__init(p);
    p->device = (int32_t)r->n_devices;
    p->backend = "cuda";
    snprintf(desc, sizeof desc, "cuda:%u (%.128s, %llu bytes)", i, info.name,
             (unsigned long long)mem.total);
    p->description = kiln_arena_strdup(a, desc);
    if (p->description == NULL) return KILN_ENOMEM;
    p->memory_in_use_bytes = (int64_t)(mem.live + mem.cached);
    p->memory_limit_bytes = (int64_t)mem.budget;
    r->devices[r->n_devices++] = p;
  }
#else
  (void)srv, (void)a, (void)r;
#endif
  return 0;
}

static int add_devices(kilnd *srv, kiln_arena *a, Kiln__V1__StatsResponse *r) {
  uint32_t n = kiln_sched_device_count(srv->sched);
  uint32_t ncuda = srv->cuda ? kiln_backend_device_count(srv->cuda) : 0;
  r->devices = kiln_arena_calloc(a, (size_t)n + ncuda + 1, sizeof *r->devices);
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
  return add_cuda_devices(srv, a, r);
}

/* ---- what `kiln top` shows --------------------------------------------------------- */

typedef struct actives {
  kiln_arena *a;
  Kiln__V1__ActiveCompile **v;
  size_t n, cap;
  int64_t now, queued, running;
  bool failed;
} actives;

static void add_active(void *arg, const kilnd_call *c, int phase) {
  actives *as = arg;
  if (phase == KILN__V1__COMPILE_PHASE__COMPILE_PHASE_QUEUED ||
      phase == KILN__V1__COMPILE_PHASE__COMPILE_PHASE_UNSPECIFIED)
    as->queued++;
  else if (phase != KILN__V1__COMPILE_PHASE__COMPILE_PHASE_DONE)
    as->running++;
  if (as->failed || kiln_grow((void **)&as->v, &as->cap, as->n + 1, sizeof *as->v)) {
    as->failed = true;
    return;
  }
  Kiln__V1__ActiveCompile *p = kiln_arena_alloc(as->a, sizeof *p);
  if (p == NULL) {
    as->failed = true;
    return;
  }
  kiln__v1__active_compile__init(p);
  p->request_id = kiln_arena_strdup(as->a, c->request_id);
  p->client = kiln_arena_strdup(as->a, c->client);
  p->phase = (Kiln__V1__CompilePhase)phase;
  p->elapsed_ns = as->now - c->start_ns;
  if (p->request_id == NULL || p->client == NULL) as->failed = true;
  as->v[as->n++] = p;
}

/* VmRSS of /proc/self/status, bytes; 0 when unreadable. */
static int64_t resident_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL) return 0;
  char line[256];
  long long kib = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %lld kB", &kib) == 1) break;
  fclose(f);
  return (int64_t)kib * 1024;
}

static int add_top(kilnd *srv, kiln_arena *a, Kiln__V1__StatsResponse *r, actives *as) {
  as->a = a;
  as->now = kiln_sched_now_ns();
  kilnd_progress_each(add_active, as);
  if (as->failed) return KILN_ENOMEM;
  r->active_compiles = as->v;
  r->n_active_compiles = as->n;
  r->compiles_queued = as->queued;
  r->compiles_running = as->running;
  r->resident_bytes = resident_bytes();
  kiln_cache_stats cst;
  kiln_cache_get_stats(srv->cache, &cst);
  r->cache_memory_bytes = (int64_t)cst.tier[KILN_CACHE_TIER_MEMORY].bytes;
  r->cache_memory_limit_bytes = (int64_t)srv->cfg.cache_memory_bytes;
  int64_t looked = r->cache_hits + r->cache_misses;
  r->cache_hit_rate = looked ? (double)r->cache_hits / (double)looked : 0.0;
  r->compile_threads = (int64_t)srv->cfg.compile_threads;
  r->compile_queue_depth = (int64_t)srv->cfg.compile_queue_depth;
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
  actives as = {0};
  if (cs.failed || add_devices(srv, cs.a, &r) != 0 || add_top(srv, cs.a, &r, &as) != 0)
    kilnd_call_fail(c, KILN_ENOMEM, "out of memory");
  else
    kilnd_call_finish(c, &r.base, 0, NULL);
  kiln_free(cs.v);
  kiln_free(as.v);
  kiln_arena_destroy(cs.a);
}
