/* CacheList and CacheEvict: the server's executable cache from a client.
 *
 * Replies are copied into one arena per result, as Stats does, so one clear
 * frees a listing.
 */
#include <string.h>

#include "clients/c/client_internal.h"
#include "common/alloc.h"

/* Keys are the server's to check (its message names the bad one); only
 * what cannot be sent at all is refused here. */
static int check_keys(const char *const *keys, uint32_t n, kiln_status *st) {
  for (uint32_t i = 0; i < n; i++)
    if (keys[i] == NULL)
      return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "keys[%u] is NULL", i);
  return 0;
}

int kiln__key_components_decode(kiln_arena *a, Kiln__V1__KeyComponent *const *v, size_t n,
                                kiln_remote_key_component **out, uint32_t *nout, kiln_status *st) {
  *out = NULL;
  *nout = 0;
  if (n == 0) return 0;
  if (n > 64)
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server sent %zu key components", n);
  *out = kiln_arena_calloc(a, n, sizeof **out);
  if (*out == NULL) return kiln__client_oom(st);
  for (size_t i = 0; i < n; i++) {
    (*out)[i].name = kiln_arena_strdup(a, v[i]->name ? v[i]->name : "");
    (*out)[i].digest = kiln_arena_strdup(a, v[i]->digest ? v[i]->digest : "");
    if ((*out)[i].name == NULL || (*out)[i].digest == NULL) return kiln__client_oom(st);
  }
  *nout = (uint32_t)n;
  return 0;
}

/* One unary call: pack, send, unpack the reply as `desc`. */
static int call(kiln_client *c, kiln__method m, const ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out, kiln_status *st) {
  uint8_t *buf, *reply;
  size_t len, reply_len;
  int rc = kiln__pack(req, &buf, &len, st);
  if (rc) return rc;
  rc = kiln__unary(c, m, 0, buf, len, &reply, &reply_len, st);
  kiln_free(buf);
  if (rc) return rc;
  rc = kiln__unpack(desc, reply, reply_len, out, st);
  kiln_free(reply);
  return rc;
}

static int copy_entry(kiln_arena *a, const Kiln__V1__CacheEntryInfo *pe, kiln_server_cache_entry *e,
                      kiln_status *st) {
  if ((e->key = kiln_arena_strdup(a, pe->key ? pe->key : "")) == NULL) return kiln__client_oom(st);
  if (pe->n_tiers > 16)
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server sent %zu tiers", pe->n_tiers);
  if (pe->n_tiers) {
    e->tiers = kiln_arena_calloc(a, pe->n_tiers, sizeof *e->tiers);
    if (e->tiers == NULL) return kiln__client_oom(st);
    for (size_t i = 0; i < pe->n_tiers; i++)
      if ((e->tiers[i] = kiln_arena_strdup(a, pe->tiers[i])) == NULL) return kiln__client_oom(st);
    e->ntiers = (uint32_t)pe->n_tiers;
  }
  e->bytes = pe->bytes;
  e->compile_ns = pe->compile_ns;
  e->created_unix_ms = pe->created_unix_ms;
  return kiln__key_components_decode(a, pe->components, pe->n_components, &e->components,
                                     &e->ncomponents, st);
}

int kiln_client_cache_list(kiln_client *c, const char *const *keys, uint32_t nkeys, int32_t limit,
                           kiln_server_cache_list *out, kiln_status *st) {
  memset(out, 0, sizeof *out);
  int rc = check_keys(keys, nkeys, st);
  if (rc) return rc;
  Kiln__V1__CacheListRequest req;
  kiln__v1__cache_list_request__init(&req);
  req.keys = (char **)keys;
  req.n_keys = nkeys;
  req.limit = limit;
  ProtobufCMessage *msg;
  rc = call(c, KILN__M_CACHE_LIST, &req.base, &kiln__v1__cache_list_response__descriptor, &msg, st);
  if (rc) return rc;
  const Kiln__V1__CacheListResponse *r = (const Kiln__V1__CacheListResponse *)msg;
  if ((out->arena = kiln_arena_create()) == NULL) {
    rc = kiln__client_oom(st);
  } else if (r->n_entries > UINT32_MAX / 2) {
    rc = kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server sent too many entries");
  } else if (r->n_entries && (out->entries = kiln_arena_calloc(out->arena, r->n_entries,
                                                               sizeof *out->entries)) == NULL) {
    rc = kiln__client_oom(st);
  }
  for (size_t i = 0; rc == 0 && i < r->n_entries; i++) {
    rc = copy_entry(out->arena, r->entries[i], &out->entries[i], st);
    if (rc == 0) out->nentries = (uint32_t)i + 1;
  }
  out->truncated = r->truncated;
  protobuf_c_message_free_unpacked(msg, NULL);
  if (rc) kiln_server_cache_list_clear(out);
  return rc;
}

void kiln_server_cache_list_clear(kiln_server_cache_list *l) {
  if (l == NULL) return;
  kiln_arena_destroy(l->arena);
  memset(l, 0, sizeof *l);
}

int kiln_client_cache_evict(kiln_client *c, const char *const *keys, uint32_t nkeys, bool all,
                            bool shared, int64_t *evicted, kiln_status *st) {
  if (evicted) *evicted = 0;
  int rc = check_keys(keys, nkeys, st);
  if (rc) return rc;
  Kiln__V1__CacheEvictRequest req;
  kiln__v1__cache_evict_request__init(&req);
  req.keys = (char **)keys;
  req.n_keys = nkeys;
  req.all = all;
  req.shared = shared;
  ProtobufCMessage *msg;
  rc = call(c, KILN__M_CACHE_EVICT, &req.base, &kiln__v1__cache_evict_response__descriptor, &msg,
            st);
  if (rc) return rc;
  if (evicted) *evicted = ((const Kiln__V1__CacheEvictResponse *)msg)->evicted;
  protobuf_c_message_free_unpacked(msg, NULL);
  return 0;
}

int kiln_client_cache_export(kiln_client *c, const char *const *keys, uint32_t nkeys,
                             uint8_t **file, size_t *len, int64_t *entries, kiln_status *st) {
  *file = NULL;
  *len = 0;
  if (entries) *entries = 0;
  int rc = check_keys(keys, nkeys, st);
  if (rc) return rc;
  Kiln__V1__CacheExportRequest req;
  kiln__v1__cache_export_request__init(&req);
  req.keys = (char **)keys;
  req.n_keys = nkeys;
  ProtobufCMessage *msg;
  rc = call(c, KILN__M_CACHE_EXPORT, &req.base, &kiln__v1__cache_export_response__descriptor, &msg,
            st);
  if (rc) return rc;
  const Kiln__V1__CacheExportResponse *r = (const Kiln__V1__CacheExportResponse *)msg;
  *file = kiln_malloc(r->file.len + 1);
  if (*file == NULL) {
    protobuf_c_message_free_unpacked(msg, NULL);
    return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  }
  if (r->file.len) memcpy(*file, r->file.data, r->file.len);
  *len = r->file.len;
  if (entries) *entries = r->entries;
  protobuf_c_message_free_unpacked(msg, NULL);
  return 0;
}

int kiln_client_cache_import(kiln_client *c, const uint8_t *file, size_t len, int64_t *imported,
                             kiln_status *st) {
  if (imported) *imported = 0;
  Kiln__V1__CacheImportRequest req;
  kiln__v1__cache_import_request__init(&req);
  req.file.data = (uint8_t *)file;
  req.file.len = len;
  ProtobufCMessage *msg;
  int rc = call(c, KILN__M_CACHE_IMPORT, &req.base, &kiln__v1__cache_import_response__descriptor,
                &msg, st);
  if (rc) return rc;
  if (imported) *imported = ((const Kiln__V1__CacheImportResponse *)msg)->imported;
  protobuf_c_message_free_unpacked(msg, NULL);
  return 0;
}
