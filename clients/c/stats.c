/* Stats: the server's counters, copied out of the reply into one arena so
 * that the caller frees them with a single kiln_server_stats_clear. Labels are
 * flattened into the Prometheus spelling (name="value",...), the form an
 * operator reads on /metrics. */
#include <string.h>

#include "clients/c/client_internal.h"
#include "common/alloc.h"
#include "common/sbuf.h"

static const char *dup(kiln_arena *a, const char *s) { return kiln_arena_strdup(a, s ? s : ""); }

static const char *labels_text(kiln_arena *a, const Kiln__V1__Counter *pc) {
  if (pc->n_labels == 0) return dup(a, "");
  kiln_sbuf b = KILN_SBUF_INIT;
  for (size_t i = 0; i < pc->n_labels; i++) {
    const Kiln__V1__Label *l = pc->labels[i];
    kiln_sbuf_printf(&b, "%s%s=\"", i ? "," : "", l->name ? l->name : "");
    for (const char *p = l->value ? l->value : ""; *p; p++) {
      if (*p == '"' || *p == '\\') kiln_sbuf_putc(&b, '\\');
      if (*p == '\n') {
        kiln_sbuf_puts(&b, "\\n");
        continue;
      }
      kiln_sbuf_putc(&b, *p);
    }
    kiln_sbuf_putc(&b, '"');
  }
  const char *s = kiln_sbuf_failed(&b) ? NULL : kiln_arena_strdup(a, kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return s;
}

static int copy_stats(const Kiln__V1__StatsResponse *r, kiln_server_stats *s) {
  kiln_arena *a = s->arena;
  if ((s->server_version = dup(a, r->server_version)) == NULL) return KILN_ENOMEM;
  s->uptime_ns = r->uptime_ns;
  s->compiles = r->compiles;
  s->cache_hits = r->cache_hits;
  s->cache_misses = r->cache_misses;
  s->executions = r->executions;
  s->live_buffers = r->live_buffers;
  s->live_buffer_bytes = r->live_buffer_bytes;
  s->queued_requests = r->queued_requests;
  if (r->n_counters > UINT32_MAX / 2 || r->n_devices > UINT32_MAX / 2) return KILN_ELIMIT;
  if (r->n_counters) {
    s->counters = kiln_arena_calloc(a, r->n_counters, sizeof *s->counters);
    if (s->counters == NULL) return KILN_ENOMEM;
  }
  for (size_t i = 0; i < r->n_counters; i++) {
    kiln_server_counter *c = &s->counters[i];
    c->name = dup(a, r->counters[i]->name);
    c->labels = labels_text(a, r->counters[i]);
    c->value = r->counters[i]->value;
    if (c->name == NULL || c->labels == NULL) return KILN_ENOMEM;
    s->ncounters = (uint32_t)i + 1;
  }
  if (r->n_devices) {
    s->devices = kiln_arena_calloc(a, r->n_devices, sizeof *s->devices);
    if (s->devices == NULL) return KILN_ENOMEM;
  }
  for (size_t i = 0; i < r->n_devices; i++) {
    const Kiln__V1__DeviceStats *pd = r->devices[i];
    kiln_server_device *d = &s->devices[i];
    d->device = pd->device;
    d->backend = dup(a, pd->backend);
    d->description = dup(a, pd->description);
    if (d->backend == NULL || d->description == NULL) return KILN_ENOMEM;
    d->memory_in_use_bytes = pd->memory_in_use_bytes;
    d->memory_limit_bytes = pd->memory_limit_bytes;
    d->executions = pd->executions;
    d->busy_ns = pd->busy_ns;
    s->ndevices = (uint32_t)i + 1;
  }
  return 0;
}

static int copy_activity(const Kiln__V1__StatsResponse *r, kiln_server_activity *v) {
  kiln_arena *a = v->arena;
  v->compiles_queued = r->compiles_queued;
  v->compiles_running = r->compiles_running;
  v->compile_threads = r->compile_threads;
  v->compile_queue_depth = r->compile_queue_depth;
  v->resident_bytes = r->resident_bytes;
  v->cache_memory_bytes = r->cache_memory_bytes;
  v->cache_memory_limit_bytes = r->cache_memory_limit_bytes;
  v->cache_hit_rate = r->cache_hit_rate;
  if (r->n_active_compiles > UINT32_MAX / 2) return KILN_ELIMIT;
  if (r->n_active_compiles) {
    v->compiles = kiln_arena_calloc(a, r->n_active_compiles, sizeof *v->compiles);
    if (v->compiles == NULL) return KILN_ENOMEM;
  }
  for (size_t i = 0; i < r->n_active_compiles; i++) {
    const Kiln__V1__ActiveCompile *pa = r->active_compiles[i];
    kiln_server_active_compile *ac = &v->compiles[i];
    ac->request_id = dup(a, pa->request_id);
    ac->client = dup(a, pa->client);
    if (ac->request_id == NULL || ac->client == NULL) return KILN_ENOMEM;
    ac->phase = (kiln_remote_phase)pa->phase;
    ac->elapsed_ns = pa->elapsed_ns;
    v->ncompiles = (uint32_t)i + 1;
  }
  return 0;
}

int kiln_client_stats(kiln_client *c, kiln_server_stats *out, kiln_status *st) {
  return kiln_client_stats_activity(c, out, NULL, st);
}

int kiln_client_stats_activity(kiln_client *c, kiln_server_stats *out,
                               kiln_server_activity *activity, kiln_status *st) {
  memset(out, 0, sizeof *out);
  if (activity) memset(activity, 0, sizeof *activity);
  Kiln__V1__StatsRequest req;
  kiln__v1__stats_request__init(&req);
  uint8_t *buf, *reply;
  size_t len, reply_len;
  int rc = kiln__pack(&req.base, &buf, &len, st);
  if (rc) return rc;
  rc = kiln__unary(c, KILN__M_STATS, 0, buf, len, &reply, &reply_len, st);
  kiln_free(buf);
  if (rc) return rc;
  ProtobufCMessage *msg;
  rc = kiln__unpack(&kiln__v1__stats_response__descriptor, reply, reply_len, &msg, st);
  kiln_free(reply);
  if (rc) return rc;
  if ((out->arena = kiln_arena_create()) == NULL) {
    rc = kiln__client_oom(st);
  } else if ((rc = copy_stats((const Kiln__V1__StatsResponse *)msg, out))) {
    rc = rc == KILN_ENOMEM
             ? kiln__client_oom(st)
             : kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server sent too many counters");
    kiln_server_stats_clear(out);
  }
  if (rc == 0 && activity) {
    if ((activity->arena = kiln_arena_create()) == NULL) {
      rc = kiln__client_oom(st);
    } else if ((rc = copy_activity((const Kiln__V1__StatsResponse *)msg, activity))) {
      rc = rc == KILN_ENOMEM ? kiln__client_oom(st)
                             : kiln__client_fail(st, KILN_RPC_DATA_LOSS,
                                                 "the server sent too many active compiles");
    }
    if (rc) {
      kiln_server_activity_clear(activity);
      kiln_server_stats_clear(out);
    }
  }
  protobuf_c_message_free_unpacked(msg, NULL);
  return rc;
}

void kiln_server_activity_clear(kiln_server_activity *v) {
  if (v == NULL) return;
  kiln_arena_destroy(v->arena);
  memset(v, 0, sizeof *v);
}

void kiln_server_stats_clear(kiln_server_stats *s) {
  if (s == NULL) return;
  kiln_arena_destroy(s->arena);
  memset(s, 0, sizeof *s);
}
