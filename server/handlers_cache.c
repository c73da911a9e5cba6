/* CacheList, CacheEvict, CacheExport and CacheImport: the executable
 * cache seen, pruned and moved between servers from outside (export files:
 * cache/bundle.c).
 *
 * Requests are checked on the completion-queue thread (every key 64 hex
 * digits, the limit in range, evict naming keys or all but not both); the
 * work then runs on the compile pool, because listing reads the disk tier
 * and a shared evict talks to Redis, and neither may hold a thread that
 * serves every other call. Evicting also drops the key from the
 * loaded-executable table unless an Execute is running it, so the next
 * Compile of it really goes back to the tiers.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "cache/cache.h"
#include "common/alloc.h"
#include "common/arena.h"
#include "kiln/v1/kiln.pb-c.h"
#include "server/executables.h"
#include "server/server.h"

#define LIST_DEFAULT 1000
#define LIST_MAX 100000
#define EVICT_MAX_KEYS 10000

/* ---- checks on the cq thread ---------------------------------------------------------- */

static int check_keys(char **keys, size_t n, size_t max, kiln_status *st) {
  if (n > max)
    return kiln_status_set(st, KILN_EINVAL, "keys", "%zu keys; at most %zu per request", n, max);
  for (size_t i = 0; i < n; i++) {
    uint8_t d[KILN_CACHE_DIGEST_LEN];
    if (kiln_cache_from_hex(keys[i], d, sizeof d) != 0) {
      char where[32];
      snprintf(where, sizeof where, "keys[%zu]", i);
      return kiln_status_set(st, KILN_EINVAL, where, "'%.80s' is not a cache key (64 hex digits)",
                             keys[i]);
    }
  }
  return 0;
}

static int check_list(const Kiln__V1__CacheListRequest *r, kiln_status *st) {
  if (r->limit < 0 || r->limit > LIST_MAX)
    return kiln_status_set(st, KILN_EINVAL, "limit", "%d is out of range (0 to %d)", r->limit,
                           LIST_MAX);
  return check_keys(r->keys, r->n_keys, LIST_MAX, st);
}

static int check_evict(const Kiln__V1__CacheEvictRequest *r, kiln_status *st) {
  if (r->n_keys == 0 && !r->all)
    return kiln_status_set(st, KILN_EINVAL, "keys", "name the keys to evict, or set all");
  if (r->n_keys && r->all)
    return kiln_status_set(st, KILN_EINVAL, "all", "set with keys: give one or the other");
  return check_keys(r->keys, r->n_keys, EVICT_MAX_KEYS, st);
}

/* Checked requests go to the compile pool, under its bound. */
static void queue(kilnd_call *c, int rc, kiln_status *st) {
  if (rc)
    kilnd_call_finish(c, NULL, rc, st);
  else
    kilnd_compile_submit(c);
}

void kilnd_handle_cache_list(kilnd_call *c, ProtobufCMessage *req) {
  kiln_status st;
  kiln_status_clear(&st);
  queue(c, check_list((const Kiln__V1__CacheListRequest *)req, &st), &st);
}

void kilnd_handle_cache_evict(kilnd_call *c, ProtobufCMessage *req) {
  kiln_status st;
  kiln_status_clear(&st);
  queue(c, check_evict((const Kiln__V1__CacheEvictRequest *)req, &st), &st);
}

void kilnd_handle_cache_export(kilnd_call *c, ProtobufCMessage *req) {
  kiln_status st;
  kiln_status_clear(&st);
  const Kiln__V1__CacheExportRequest *r = (const Kiln__V1__CacheExportRequest *)req;
  queue(c, check_keys(r->keys, r->n_keys, EVICT_MAX_KEYS, &st), &st);
}

void kilnd_handle_cache_import(kilnd_call *c, ProtobufCMessage *req) {
  kiln_status st;
  kiln_status_clear(&st);
  const Kiln__V1__CacheImportRequest *r = (const Kiln__V1__CacheImportRequest *)req;
  queue(c, r->file.len ? 0 : kiln_status_set(&st, KILN_EINVAL, "file", "empty"), &st);
}

/* ---- CacheList ------------------------------------------------------------------------ */

typedef struct lister {
  kiln_arena *a;
  const Kiln__V1__CacheListRequest *r;
  Kiln__V1__CacheEntryInfo **v;
  size_t n, cap;
  size_t limit;
  bool truncated, failed;
} lister;

static bool wanted(const lister *l, const char *hex) {
  if (l->r->n_keys == 0) return true;
  for (size_t i = 0; i < l->r->n_keys; i++)
    if (strcasecmp(l->r->keys[i], hex) == 0) return true;
  return false;
}

static Kiln__V1__KeyComponent **components(kiln_arena *a, const kiln_cache_meta *m) {
  Kiln__V1__KeyComponent **v = kiln_arena_calloc(a, KILN_CACHE_NPARTS, sizeof *v);
  for (int i = 0; v && i < KILN_CACHE_NPARTS; i++) {
    Kiln__V1__KeyComponent *k = kiln_arena_alloc(a, sizeof *k);
    char *hex = kiln_arena_alloc(a, KILN_CACHE_HEX_LEN + 1);
    if (k == NULL || hex == NULL) return NULL;
    kiln__v1__key_component__init(k);
    kiln_cache_to_hex(m->parts[i], KILN_CACHE_DIGEST_LEN, hex);
    k->name = (char *)kiln_cache_part_name(i);
    k->digest = hex;
    v[i] = k;
  }
  return v;
}

static int add_entry(void *ctx, const kiln_cache_meta *m, uint64_t bytes, bool in_memory,
                     bool on_disk) {
  lister *l = ctx;
  char hex[KILN_CACHE_HEX_LEN + 1];
  kiln_cache_to_hex(m->key, KILN_CACHE_DIGEST_LEN, hex);
  if (!wanted(l, hex)) return 0;
  if (l->n >= l->limit) {
    l->truncated = true;
    return 1;
  }
  if (kiln_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v)) return l->failed = true, 1;
  Kiln__V1__CacheEntryInfo *e = kiln_arena_alloc(l->a, sizeof *e);
  char **tiers = kiln_arena_calloc(l->a, 2, sizeof *tiers);
  if (e == NULL || tiers == NULL) return l->failed = true, 1;
  kiln__v1__cache_entry_info__init(e);
  e->key = kiln_arena_strdup(l->a, hex);
  e->tiers = tiers;
  if (in_memory) tiers[e->n_tiers++] = "memory";
  if (on_disk) tiers[e->n_tiers++] = "disk";
  e->bytes = (int64_t)bytes;
  e->compile_ns = (int64_t)m->compile_ns;
  e->created_unix_ms = (int64_t)m->created_unix_ms;
  e->components = components(l->a, m);
  e->n_components = e->components ? KILN_CACHE_NPARTS : 0;
  if (e->key == NULL || e->components == NULL) return l->failed = true, 1;
  l->v[l->n++] = e;
  return 0;
}

static void list_work(kilnd_call *c) {
  const Kiln__V1__CacheListRequest *r = (const Kiln__V1__CacheListRequest *)c->req;
  lister l = {.a = kiln_arena_create(), .r = r};
  l.limit = r->limit ? (size_t)r->limit : LIST_DEFAULT;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = l.a ? kiln_cache_list(c->srv->cache, add_entry, &l, &st)
               : kiln_status_set(&st, KILN_ENOMEM, "CacheList", "out of memory");
  if (rc == 0 && l.failed) rc = kiln_status_set(&st, KILN_ENOMEM, "CacheList", "out of memory");
  if (rc == 0) {
    Kiln__V1__CacheListResponse resp = KILN__V1__CACHE_LIST_RESPONSE__INIT;
    resp.entries = l.v;
    resp.n_entries = l.n;
    resp.truncated = l.truncated;
    kilnd_call_finish(c, &resp.base, 0, NULL);
  } else {
    kilnd_call_finish(c, NULL, rc, &st);
  }
  kiln_free(l.v);
  kiln_arena_destroy(l.a);
}

/* ---- CacheEvict ----------------------------------------------------------------------- */

static void evict_work(kilnd_call *c) {
  const Kiln__V1__CacheEvictRequest *r = (const Kiln__V1__CacheEvictRequest *)c->req;
  kilnd *srv = c->srv;
  kiln_status st;
  kiln_status_clear(&st);
  uint64_t total = 0;
  int rc = 0;
  if (r->all) {
    rc = kiln_cache_evict(srv->cache, NULL, r->shared, &total, &st);
    total += kilnd_exes_drop(srv->exes, NULL, NULL);
  }
  for (size_t i = 0; i < r->n_keys; i++) {
    char hex[KILN_CACHE_HEX_LEN + 1];
    for (int k = 0; k < KILN_CACHE_HEX_LEN; k++)
      hex[k] = (char)tolower((unsigned char)r->keys[i][k]);
    hex[KILN_CACHE_HEX_LEN] = '\0';
    uint64_t n = 0;
    int krc = kiln_cache_evict(srv->cache, hex, r->shared, &n, &st);
    if (rc == 0) rc = krc;
    total += n + kilnd_exes_drop(srv->exes, hex, NULL);
  }
  kilnd_log_rec lr;
  kilnd_log_audit(&lr, c, "evict");
  kilnd_log_str(&lr, "keys", r->all ? "all" : r->n_keys == 1 ? r->keys[0] : "several");
  kilnd_log_int(&lr, "nkeys", (int64_t)r->n_keys);
  kilnd_log_str(&lr, "shared", r->shared ? "true" : "false");
  kilnd_log_int(&lr, "evicted", (int64_t)total);
  kilnd_log_str(&lr, "code", rc ? kilnd_log_code_name((int)kilnd_status_code(rc)) : "OK");
  kilnd_log_end(&lr);
  if (rc) {
    /* The local tiers were pruned; a tier that failed (Redis down) is
     * worth telling, with what was done. */
    kiln_status failed;
    kiln_status_clear(&failed);
    kiln_status_set(&failed, rc, st.where, "%s (%llu entries were removed)", st.msg,
                    (unsigned long long)total);
    kilnd_call_finish(c, NULL, rc, &failed);
    return;
  }
  Kiln__V1__CacheEvictResponse resp = KILN__V1__CACHE_EVICT_RESPONSE__INIT;
  resp.evicted = (int64_t)total;
  kilnd_call_finish(c, &resp.base, 0, NULL);
}

/* ---- CacheExport and CacheImport ------------------------------------------------------ */

static void export_work(kilnd_call *c) {
  const Kiln__V1__CacheExportRequest *r = (const Kiln__V1__CacheExportRequest *)c->req;
  kiln_status st;
  kiln_status_clear(&st);
  uint8_t *file = NULL;
  size_t len = 0;
  uint32_t n = 0;
  int rc = kiln_cache_export(c->srv->cache, (const char *const *)r->keys, r->n_keys, &file, &len,
                             &n, &st);
  kilnd_log_rec lr;
  kilnd_log_audit(&lr, c, "cache_export");
  kilnd_log_int(&lr, "entries", (int64_t)n);
  kilnd_log_int(&lr, "bytes", (int64_t)len);
  kilnd_log_str(&lr, "code", rc ? kilnd_log_code_name((int)kilnd_status_code(rc)) : "OK");
  kilnd_log_end(&lr);
  if (rc) {
    kilnd_call_finish(c, NULL, rc, &st);
    return;
  }
  Kiln__V1__CacheExportResponse resp = KILN__V1__CACHE_EXPORT_RESPONSE__INIT;
  resp.file.data = file;
  resp.file.len = len;
  resp.entries = n;
  kilnd_call_finish(c, &resp.base, 0, NULL);
  kiln_free(file);
}

static void import_work(kilnd_call *c) {
  const Kiln__V1__CacheImportRequest *r = (const Kiln__V1__CacheImportRequest *)c->req;
  kiln_status st;
  kiln_status_clear(&st);
  uint32_t n = 0;
  int rc = kiln_cache_import(c->srv->cache, r->file.data, r->file.len, &n, &st);
  kilnd_log_rec lr;
  kilnd_log_audit(&lr, c, "cache_import");
  kilnd_log_int(&lr, "entries", (int64_t)n);
  kilnd_log_int(&lr, "bytes", (int64_t)r->file.len);
  kilnd_log_str(&lr, "code", rc ? kilnd_log_code_name((int)kilnd_status_code(rc)) : "OK");
  kilnd_log_end(&lr);
  if (rc) {
    kilnd_call_finish(c, NULL, rc, &st);
    return;
  }
  Kiln__V1__CacheImportResponse resp = KILN__V1__CACHE_IMPORT_RESPONSE__INIT;
  resp.imported = n;
  kilnd_call_finish(c, &resp.base, 0, NULL);
}

void kilnd_cache_work(kilnd_call *c) {
  switch (c->method->id) {
  case KILND_M_CACHE_LIST: list_work(c); break;
  case KILND_M_CACHE_EXPORT: export_work(c); break;
  case KILND_M_CACHE_IMPORT: import_work(c); break;
  default: evict_work(c); break;
  }
}
