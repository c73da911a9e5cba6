/* The server's counters and histograms, and their Prometheus text form.
 *
 * Everything is a fixed array of atomics indexed by method and status code,
 * so recording from any thread is a few relaxed increments and rendering
 * (on the loop thread, for /metrics; on a cq thread, for Stats) reads a
 * consistent-enough snapshot without locks. Gauges (queue depth, live
 * buffers, executables) are read from their owners at render time.
 *
 * The executable cache's counters (kiln_cache_*) come from the cache
 * itself (kiln_cache_get_stats), except that a Compile answered from the
 * loaded-executable table, which sits in front of the memory tier, counts
 * as a memory hit. One list of rows (cache_rows) feeds both /metrics and
 * Stats, so the two always carry the same names.
 */
#include <stdio.h>
#include <string.h>

#include "cache/cache.h"
#include "common/alloc.h"
#include "common/sbuf.h"
#include "executor/backend.h"
#include "executor/buffers.h"
#ifdef KILN_HAVE_CUDA
#include "executor/cuda/cuda.h"
#endif
#include "executor/scheduler.h"
#include "kiln/v1/kiln.pb-c.h"
#include "server/executables.h"
#include "server/mesh.h"
#include "server/server.h"

#define NCODES 17
#define NBOUNDS 17
static const double bounds[NBOUNDS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                       0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                       1,      2.5,     5,      10,    30};

static const char *const code_names[NCODES] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

typedef struct hist {
  atomic_ullong bucket[NBOUNDS]; /* non-cumulative; +Inf is count */
  atomic_ullong count;
  atomic_ullong sum_ns;
} hist;

struct kilnd_metrics {
  atomic_ullong requests[KILND_M_COUNT + 1][NCODES];
  hist latency[KILND_M_COUNT + 1];
  hist compile, execute, queue_wait;
  atomic_ullong compiles, cache_hits, cache_misses, executions;
  atomic_ullong table_hits; /* Compiles answered from the loaded-executable table */
};

int kilnd_metrics_create(kilnd *srv, kiln_status *st) {
  srv->metrics = kiln_calloc(1, sizeof *srv->metrics);
  return srv->metrics ? 0 : kiln_status_set(st, KILN_ENOMEM, "metrics", "out of memory");
}

void kilnd_metrics_destroy(kilnd *srv) {
  kiln_free(srv->metrics);
  srv->metrics = NULL;
}

static void observe(hist *h, int64_t ns) {
  if (ns < 0) ns = 0;
  double s = (double)ns / 1e9;
  int i = 0;
  while (i < NBOUNDS && s > bounds[i]) i++;
  if (i < NBOUNDS) atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->sum_ns, (unsigned long long)ns, memory_order_relaxed);
}

void kilnd_metrics_request(kilnd *srv, kilnd_method_id m, grpc_status_code code, int64_t ns) {
  kilnd_metrics *k = srv->metrics;
  unsigned c = (unsigned)code < NCODES ? (unsigned)code : 2; /* UNKNOWN */
  atomic_fetch_add_explicit(&k->requests[m][c], 1, memory_order_relaxed);
  observe(&k->latency[m], ns);
}

/* Hits: answered from a tier or the table. Misses: built here, or waited
 * for a build. Compiles: built by this request. */
void kilnd_metrics_compile(kilnd *srv, int64_t ns, int cache_source, bool from_table) {
  kilnd_metrics *k = srv->metrics;
  observe(&k->compile, ns);
  switch (cache_source) {
  case KILN__V1__CACHE_SOURCE__CACHE_SOURCE_MEMORY:
  case KILN__V1__CACHE_SOURCE__CACHE_SOURCE_DISK:
  case KILN__V1__CACHE_SOURCE__CACHE_SOURCE_SHARED: atomic_fetch_add(&k->cache_hits, 1); break;
  case KILN__V1__CACHE_SOURCE__CACHE_SOURCE_SINGLE_FLIGHT:
    atomic_fetch_add(&k->cache_misses, 1);
    break;
  default:
    atomic_fetch_add(&k->cache_misses, 1);
    atomic_fetch_add(&k->compiles, 1);
    break;
  }
  if (from_table) atomic_fetch_add(&k->table_hits, 1);
}

void kilnd_metrics_execute(kilnd *srv, int64_t run_ns, int64_t queue_ns) {
  kilnd_metrics *k = srv->metrics;
  observe(&k->execute, run_ns);
  observe(&k->queue_wait, queue_ns);
  atomic_fetch_add(&k->executions, 1);
}

uint64_t kilnd_metrics_total(kilnd *srv, const char *what) {
  kilnd_metrics *k = srv->metrics;
  if (strcmp(what, "compiles") == 0) return atomic_load(&k->compiles);
  if (strcmp(what, "cache_hits") == 0) return atomic_load(&k->cache_hits);
  if (strcmp(what, "cache_misses") == 0) return atomic_load(&k->cache_misses);
  if (strcmp(what, "executions") == 0) return atomic_load(&k->executions);
  return 0;
}

/* ---- the cache's rows ----------------------------------------------------------------- */

typedef struct cache_row {
  const char *name, *type, *help;
  const char *label, *value; /* NULL when unlabelled */
  uint64_t v;
} cache_row;

#define NODE_FAMILIES 6
#define CACHE_ROWS \
  (6 * KILN_CACHE_NTIERS + KILN_CACHE_NREJECTS + 8 + NODE_FAMILIES * KILN_CACHE_MAX_NODE_STATS)

static const char *const tier_names[KILN_CACHE_NTIERS] = {"memory", "disk", "redis"};

/* Every kiln_cache_* sample, families in order, read into the caller's cs
 * (the rows' node labels point into it); returns the count. Tiers that are
 * not configured are listed with zeros, so queries never find a series
 * missing; the shared tier's nodes are listed as the store knows them. */
static size_t cache_rows(kilnd *srv, kiln_cache_stats *cs, cache_row *rows) {
  memset(cs, 0, sizeof *cs);
  if (srv->cache) kiln_cache_get_stats(srv->cache, cs);
  cs->tier[KILN_CACHE_TIER_MEMORY].hits += atomic_load(&srv->metrics->table_hits);
  size_t n = 0;
  static const struct {
    const char *name, *type, *help;
  } fam[] = {
      {"kiln_cache_hits_total", "counter",
       "Valid entries handed out by each cache tier (memory includes the loaded-executable "
       "table)."},
      {"kiln_cache_misses_total", "counter", "Lookups that found nothing usable in each tier."},
      {"kiln_cache_bytes", "gauge", "Bytes each tier holds now (redis: not known, 0)."},
      {"kiln_cache_entries", "gauge", "Entries each tier holds now (redis: not known, 0)."},
      {"kiln_cache_evictions_total", "counter", "Entries a tier removed to stay within its bound."},
  };
  for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++)
    for (int t = 0; t < KILN_CACHE_NTIERS; t++) {
      const kiln_cache_store_stats *ts = &cs->tier[t];
      uint64_t v = f == 0   ? ts->hits
                   : f == 1 ? ts->misses
                   : f == 2 ? ts->bytes
                   : f == 3 ? ts->entries
                            : ts->evictions;
      rows[n++] = (cache_row){fam[f].name, fam[f].type, fam[f].help, "tier", tier_names[t], v};
    }
  for (int r = 1; r < KILN_CACHE_NREJECTS; r++)
    rows[n++] = (cache_row){"kiln_cache_integrity_failures_total",
                            "counter",
                            "Entries refused (and deleted) by reason: never loaded.",
                            "reason",
                            kiln_cache_reject_name((kiln_cache_reject)r),
                            cs->rejects[r]};
  const kiln_cache_store_stats *rs = &cs->tier[KILN_CACHE_TIER_REDIS];
  rows[n++] = (cache_row){"kiln_cache_redis_faults_total",
                          "counter",
                          "Redis operations that failed (down, timeout, full); never a failed "
                          "request.",
                          NULL,
                          NULL,
                          rs->faults};
  rows[n++] = (cache_row){"kiln_cache_redis_up",
                          "gauge",
                          "1 while the Redis tier is connected.",
                          NULL,
                          NULL,
                          cs->enabled[KILN_CACHE_TIER_REDIS] && rs->up};
  rows[n++] = (cache_row){"kiln_cache_builds_total",
                          "counter",
                          "cpu compiles performed through the cache (builds).",
                          NULL,
                          NULL,
                          cs->builds};
  rows[n++] = (cache_row){"kiln_cache_single_flight_waits_total",
                          "counter",
                          "Compiles that waited for a concurrent build of the same key.",
                          NULL,
                          NULL,
                          cs->single_flight_waits};
  rows[n++] = (cache_row){"kiln_cache_lock_waits_total",
                          "counter",
                          "Waits on another server's Redis build lock.",
                          NULL,
                          NULL,
                          cs->lock_waits};
  rows[n++] = (cache_row){"kiln_cache_lock_takeovers_total",
                          "counter",
                          "Redis build locks without an expiry or held past it, taken over.",
                          NULL,
                          NULL,
                          cs->lock_takeovers};
  rows[n++] = (cache_row){"kiln_cache_compile_ns_saved_total",
                          "counter",
                          "Compile time of the entries hits handed out, nanoseconds.",
                          NULL,
                          NULL,
                          cs->compile_ns_saved};
  rows[n++] = (cache_row){"kiln_cache_skipped_fast_total",
                          "counter",
                          "Builds faster than cache-min-compile-ms, not stored.",
                          NULL,
                          NULL,
                          cs->skipped_fast};
  static const struct {
    const char *name, *type, *help;
  } node_fam[NODE_FAMILIES] = {
      {"kiln_cache_redis_node_up", "gauge",
       "1 while this Redis node of the shared tier is connected."},
      {"kiln_cache_redis_node_slots", "gauge",
       "Hash slots the node serves as primary (one Redis or a sentinel's primary: all 16384)."},
      {"kiln_cache_redis_node_requests_total", "counter", "Commands sent to the node."},
      {"kiln_cache_redis_node_errors_total", "counter",
       "Commands to the node that failed (no answer, or an error other than a redirection)."},
      {"kiln_cache_redis_node_redirects_total", "counter",
       "MOVED and ASK answers from the node (a cluster resharding or a stale slot map)."},
      {"kiln_cache_redis_node_latency_microseconds_total", "counter",
       "Time spent waiting for the node's answers, microseconds."},
  };
  uint32_t nn = cs->nnodes < KILN_CACHE_MAX_NODE_STATS ? cs->nnodes : KILN_CACHE_MAX_NODE_STATS;
  for (int f = 0; f < NODE_FAMILIES; f++)
    for (uint32_t i = 0; i < nn; i++) {
      const kiln_cache_node_stats *ns = &cs->nodes[i];
      uint64_t v = f == 0   ? ns->up
                   : f == 1 ? ns->slots
                   : f == 2 ? ns->requests
                   : f == 3 ? ns->errors
                   : f == 4 ? ns->redirects
                            : ns->latency_us;
      rows[n++] =
          (cache_row){node_fam[f].name, node_fam[f].type, node_fam[f].help, "node", ns->addr, v};
    }
  return n;
}

/* ---- rendering ----------------------------------------------------------------------- */

static void header(kiln_sbuf *b, const char *name, const char *type, const char *help) {
  kiln_sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void render_hist(kiln_sbuf *b, const char *name, const char *labels, hist *h) {
  unsigned long long cum = 0;
  const char *sep = labels[0] ? "," : "";
  for (int i = 0; i < NBOUNDS; i++) {
    cum += atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
    kiln_sbuf_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, bounds[i], cum);
  }
  unsigned long long n = atomic_load(&h->count);
  kiln_sbuf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, n);
  kiln_sbuf_printf(b, "%s_sum%s%s%s %.9f\n", name, labels[0] ? "{" : "", labels,
                   labels[0] ? "}" : "", (double)atomic_load(&h->sum_ns) / 1e9);
  kiln_sbuf_printf(b, "%s_count%s%s%s %llu\n", name, labels[0] ? "{" : "", labels,
                   labels[0] ? "}" : "", n);
}

static void render_requests(kiln_sbuf *b, kilnd_metrics *k) {
  header(b, "kiln_requests_total", "counter", "gRPC calls finished, by method and status code.");
  for (int m = 0; m <= KILND_M_COUNT; m++)
    for (int c = 0; c < NCODES; c++) {
      unsigned long long n = atomic_load(&k->requests[m][c]);
      if (n || (c == 0 && m < KILND_M_COUNT))
        kiln_sbuf_printf(b, "kiln_requests_total{method=\"%s\",code=\"%s\"} %llu\n",
                         kilnd_method_name((kilnd_method_id)m), code_names[c], n);
    }
  header(b, "kiln_request_errors_total", "counter",
         "gRPC calls finished with a status other than OK, by method and code.");
  for (int m = 0; m <= KILND_M_COUNT; m++)
    for (int c = 1; c < NCODES; c++) {
      unsigned long long n = atomic_load(&k->requests[m][c]);
      if (n)
        kiln_sbuf_printf(b, "kiln_request_errors_total{method=\"%s\",code=\"%s\"} %llu\n",
                         kilnd_method_name((kilnd_method_id)m), code_names[c], n);
    }
  header(b, "kiln_request_duration_seconds", "histogram",
         "Time from a call's arrival to its final status, by method.");
  for (int m = 0; m <= KILND_M_COUNT; m++) {
    char labels[64];
    snprintf(labels, sizeof labels, "method=\"%s\"", kilnd_method_name((kilnd_method_id)m));
    render_hist(b, "kiln_request_duration_seconds", labels, &k->latency[m]);
  }
}

static void gauge(kiln_sbuf *b, const char *name, const char *help, double v) {
  header(b, name, "gauge", help);
  kiln_sbuf_printf(b, "%s %.17g\n", name, v);
}

static void counter(kiln_sbuf *b, const char *name, const char *help, unsigned long long v) {
  header(b, name, "counter", help);
  kiln_sbuf_printf(b, "%s %llu\n", name, v);
}

static void render_devices(kiln_sbuf *b, kilnd *srv) {
  uint32_t n = kiln_sched_device_count(srv->sched);
  header(b, "kiln_device_executions_total", "counter", "Runs per device.");
  for (uint32_t d = 0; d < n; d++) {
    kiln_sched_device_stats ds;
    kiln_sched_device_stats_get(srv->sched, d, &ds);
    kiln_sbuf_printf(b, "kiln_device_executions_total{device=\"%u\",backend=\"%s\"} %llu\n", d,
                     kiln_backend_name(kilnd_class_backend(srv, (int)ds.dev_class)),
                     (unsigned long long)ds.executions);
  }
  header(b, "kiln_device_busy_seconds_total", "counter", "Time each device spent running.");
  for (uint32_t d = 0; d < n; d++) {
    kiln_sched_device_stats ds;
    kiln_sched_device_stats_get(srv->sched, d, &ds);
    kiln_sbuf_printf(b, "kiln_device_busy_seconds_total{device=\"%u\",backend=\"%s\"} %.9f\n", d,
                     kiln_backend_name(kilnd_class_backend(srv, (int)ds.dev_class)),
                     (double)ds.busy_ns / 1e9);
  }
}

/* The GPUs' memory, by their caching allocators, and the mesh's state. */
static void render_cuda(kiln_sbuf *b, kilnd *srv) {
#ifdef KILN_HAVE_CUDA
  uint32_t n = srv->cuda ? kiln_backend_device_count(srv->cuda) : 0;
  if (n > 0) {
    header(b, "kiln_cuda_memory_bytes", "gauge",
           "GPU memory: total, the allocator's budget, live and cached blocks, peak live.");
    for (uint32_t i = 0; i < n; i++) {
      kiln_cuda_memory m;
      if (!kiln_cuda_device_memory(kiln_backend_device(srv->cuda, i), &m)) continue;
      const struct {
        const char *kind;
        uint64_t v;
      } rows[] = {{"total", m.total},
                  {"budget", m.budget},
                  {"live", m.live},
                  {"cached", m.cached},
                  {"peak", m.peak}};
      for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
        kiln_sbuf_printf(b, "kiln_cuda_memory_bytes{device=\"cuda:%u\",kind=\"%s\"} %llu\n", i,
                         rows[k].kind, (unsigned long long)rows[k].v);
    }
  }
#endif
  if (srv->mesh) {
    header(
        b, "kiln_mesh_ready", "gauge",
        "1 once the GPU mesh across hosts is up, 0 before its first use, -1 after a failed one.");
    kilnd_mesh_state s = kilnd_mesh_state_get(srv->mesh);
    kiln_sbuf_printf(b, "kiln_mesh_ready{mesh=\"%s\"} %d\n", kilnd_mesh_name(srv->mesh),
                     s == KILND_MESH_READY    ? 1
                     : s == KILND_MESH_FAILED ? -1
                                              : 0);
  }
}

static void render_cache(kiln_sbuf *b, kilnd *srv) {
  cache_row rows[CACHE_ROWS];
  kiln_cache_stats cs;
  size_t n = cache_rows(srv, &cs, rows);
  for (size_t i = 0; i < n; i++) {
    const cache_row *r = &rows[i];
    if (i == 0 || strcmp(rows[i - 1].name, r->name) != 0) header(b, r->name, r->type, r->help);
    if (r->label)
      kiln_sbuf_printf(b, "%s{%s=\"%s\"} %llu\n", r->name, r->label, r->value,
                       (unsigned long long)r->v);
    else
      kiln_sbuf_printf(b, "%s %llu\n", r->name, (unsigned long long)r->v);
  }
}

char *kilnd_metrics_render(kilnd *srv, size_t *len) {
  kilnd_metrics *k = srv->metrics;
  kiln_sbuf b = KILN_SBUF_INIT;
  render_requests(&b, k);
  header(&b, "kiln_compile_seconds", "histogram", "Compile requests' work, parse to executable.");
  render_hist(&b, "kiln_compile_seconds", "", &k->compile);
  header(&b, "kiln_execute_seconds", "histogram", "Executions' run time on a device.");
  render_hist(&b, "kiln_execute_seconds", "", &k->execute);
  header(&b, "kiln_execute_queue_seconds", "histogram", "Executions' wait for a device.");
  render_hist(&b, "kiln_execute_queue_seconds", "", &k->queue_wait);
  counter(&b, "kiln_compiles_total", "Compile requests that built their executable.",
          atomic_load(&k->compiles));
  counter(&b, "kiln_compile_cache_hits_total",
          "Compile requests answered from the executable table.", atomic_load(&k->table_hits));
  counter(&b, "kiln_executions_total", "Executions run.", atomic_load(&k->executions));
  kiln_buffer_store_totals bt;
  kiln_buffer_store_get_totals(srv->buffers, &bt);
  gauge(&b, "kiln_queue_depth", "Executions waiting for a device.", kiln_sched_queued(srv->sched));
  gauge(&b, "kiln_running_executions", "Executions running.", kiln_sched_running(srv->sched));
  gauge(&b, "kiln_compile_queue_depth", "Compiles queued or running.", atomic_load(&srv->compiles));
  gauge(&b, "kiln_live_buffers", "Server-resident buffers (live handles).",
        (double)bt.live_buffers);
  gauge(&b, "kiln_live_buffer_bytes", "Bytes charged for server-resident buffers.",
        (double)bt.live_bytes);
  gauge(&b, "kiln_executables", "Executables kept.", kilnd_exes_count(srv->exes));
  gauge(&b, "kiln_inflight_requests", "gRPC calls being served.", atomic_load(&srv->inflight));
  gauge(&b, "kiln_draining", "1 while the server drains after SIGTERM.",
        atomic_load(&srv->draining));
  gauge(&b, "kiln_uptime_seconds", "Seconds since the server started.",
        (double)(kiln_sched_now_ns() - srv->start_ns) / 1e9);
  gauge(&b, "kiln_cuda_devices", "GPUs the CUDA driver sees (0 without a driver).",
        srv->cuda_devices);
  render_devices(&b, srv);
  render_cuda(&b, srv);
  render_cache(&b, srv);
  if (b.failed) {
    kiln_sbuf_free(&b);
    return NULL;
  }
  return kiln_sbuf_detach(&b, len);
}

void kilnd_metrics_each_counter(kilnd *srv, kilnd_counter_fn fn, void *arg) {
  kilnd_metrics *k = srv->metrics;
  for (int m = 0; m <= KILND_M_COUNT; m++)
    for (int c = 0; c < NCODES; c++) {
      unsigned long long n = atomic_load(&k->requests[m][c]);
      if (n)
        fn(arg, "kiln_requests_total", "method", kilnd_method_name((kilnd_method_id)m), "code",
           code_names[c], (int64_t)n);
    }
  fn(arg, "kiln_compiles_total", NULL, NULL, NULL, NULL, (int64_t)atomic_load(&k->compiles));
  fn(arg, "kiln_compile_cache_hits_total", NULL, NULL, NULL, NULL,
     (int64_t)atomic_load(&k->table_hits));
  fn(arg, "kiln_executions_total", NULL, NULL, NULL, NULL, (int64_t)atomic_load(&k->executions));
  fn(arg, "kiln_execute_seconds_sum_ns", NULL, NULL, NULL, NULL,
     (int64_t)atomic_load(&k->execute.sum_ns));
  fn(arg, "kiln_compile_seconds_sum_ns", NULL, NULL, NULL, NULL,
     (int64_t)atomic_load(&k->compile.sum_ns));
  kiln_buffer_store_totals bt;
  kiln_buffer_store_get_totals(srv->buffers, &bt);
  fn(arg, "kiln_live_buffers", NULL, NULL, NULL, NULL, (int64_t)bt.live_buffers);
  fn(arg, "kiln_live_buffer_bytes", NULL, NULL, NULL, NULL, (int64_t)bt.live_bytes);
  fn(arg, "kiln_buffer_lease_ms", NULL, NULL, NULL, NULL,
     (int64_t)(srv->cfg.buffer_lease_seconds * 1000.0));
  fn(arg, "kiln_queue_depth", NULL, NULL, NULL, NULL, kiln_sched_queued(srv->sched));
  fn(arg, "kiln_executables", NULL, NULL, NULL, NULL, kilnd_exes_count(srv->exes));
  cache_row rows[CACHE_ROWS];
  kiln_cache_stats cs;
  size_t n = cache_rows(srv, &cs, rows);
  for (size_t i = 0; i < n; i++)
    fn(arg, rows[i].name, rows[i].label, rows[i].value, NULL, NULL, (int64_t)rows[i].v);
}
