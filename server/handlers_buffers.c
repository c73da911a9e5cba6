/* PutBuffer, GetBuffer and ReleaseBuffers: server-resident buffers moved as
 * streams of chunks, so a tensor of any size travels in messages well under
 * gRPC's per-message limit.
 *
 * PutBuffer learns the array's shape from the header in its first message,
 * reserves the bytes against the client's quota before accepting any data,
 * and then copies each chunk into place; more bytes than the shape holds are
 * refused at once, fewer at the end. A stream that breaks or whose caller
 * goes away returns the reservation. GetBuffer sends the description first,
 * then the bytes in order, one message in flight at a time, holding a
 * reference so that a concurrent release cannot free the data under it.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/ir.h"
#include "executor/buffers.h"
#include "executor/scheduler.h"
#include "kiln/v1/kiln.pb-c.h"
#include "server/convert.h"
#include "server/server.h"

#define LABEL_MAX 256

/* ---- PutBuffer ----------------------------------------------------------------------- */

typedef struct put_state {
  kiln_arena *arena; /* the shape */
  kiln_literal *lit; /* being filled; NULL until the header */
  uint64_t size, got;
  bool reserved;     /* size bytes reserved for c->client */
  int32_t device;
  char label[LABEL_MAX + 1];
} put_state;

static void put_free(kilnd_call *c) {
  put_state *ps = c->state;
  if (ps->reserved) kiln_buffer_store_unreserve(c->srv->buffers, c->client, ps->size);
  kiln_literal_destroy(ps->lit);
  kiln_arena_destroy(ps->arena);
  kiln_free(ps);
}

static int put_header(kilnd_call *c, put_state *ps, const Kiln__V1__PutBufferHeader *h,
                      kiln_status *st) {
  const kilnd_config *cfg = &c->srv->cfg;
  kiln_shape shape;
  int rc = kilnd_array_shape_from_proto(ps->arena, h->shape, cfg->max_elements, "header.shape",
                                        &shape, st);
  if (rc) return rc;
  int64_t bytes = kiln_shape_bytes(&shape);
  if (bytes < 0 || (uint64_t)bytes > cfg->max_buffer_bytes)
    return kiln_status_set(st, KILN_ELIMIT, "header.shape",
                           "buffer of %lld bytes exceeds the limit of %llu (max-buffer-bytes)",
                           (long long)bytes, (unsigned long long)cfg->max_buffer_bytes);
  uint32_t ndev = kiln_sched_device_count(c->srv->sched);
  if (h->device < 0 || (uint32_t)h->device >= ndev)
    return kiln_status_set(st, KILN_EINVAL, "header.device",
                           "device %d does not exist (the server has %u)", h->device, ndev);
  if (h->label && strlen(h->label) > LABEL_MAX)
    return kiln_status_set(st, KILN_EINVAL, "header.label", "longer than %d bytes", LABEL_MAX);
  rc = kiln_buffer_store_reserve(c->srv->buffers, c->client, (uint64_t)bytes, st);
  if (rc) return rc;
  ps->reserved = true;
  ps->size = (uint64_t)bytes;
  ps->device = h->device;
  snprintf(ps->label, sizeof ps->label, "%s", h->label ? h->label : "");
  return kiln_literal_create(NULL, &shape, 0, &ps->lit, st);
}

static int put_chunk(kilnd_call *c, put_state *ps, const Kiln__V1__PutBufferChunk *ch,
                     kiln_status *st) {
  int rc = 0;
  if (ch->header) {
    if (ps->lit)
      return kiln_status_set(st, KILN_EINVAL, "header", "sent again after the first message");
    rc = put_header(c, ps, ch->header, st);
    if (rc) return rc;
  } else if (ps->lit == NULL) {
    return kiln_status_set(st, KILN_EINVAL, "header", "the first message must carry the header");
  }
  size_t n = ch->data.len;
  if (n > ps->size - ps->got) {
    char shape[128];
    kilnd_shape_str(&ps->lit->shape, shape, sizeof shape);
    return kiln_status_set(st, KILN_EINVAL, "data",
                           "more data than %s holds: %llu bytes after %llu of %llu", shape,
                           (unsigned long long)n, (unsigned long long)ps->got,
                           (unsigned long long)ps->size);
  }
  if (n) memcpy((uint8_t *)ps->lit->data + ps->got, ch->data.data, n);
  ps->got += n;
  return 0;
}

static void put_finish(kilnd_call *c, put_state *ps) {
  kiln_status st;
  kiln_status_clear(&st);
  int rc = 0;
  if (ps->lit == NULL)
    rc = kiln_status_set(&st, KILN_EINVAL, "PutBuffer", "the stream ended before a header");
  else if (ps->got != ps->size)
    rc = kiln_status_set(&st, KILN_EINVAL, "PutBuffer",
                         "the stream ended after %llu of %llu bytes",
                         (unsigned long long)ps->got, (unsigned long long)ps->size);
  if (rc) {
    kilnd_call_finish(c, NULL, rc, &st);
    return;
  }
  kiln_stored *b = NULL;
  kiln_literal *lit = ps->lit;
  ps->lit = NULL;
  ps->reserved = false; /* add takes over the reservation, even when it fails */
  rc = kiln_buffer_store_add(c->srv->buffers, c->client, lit, ps->device, ps->label, true, &b,
                             &st);
  if (rc) {
    kilnd_call_finish(c, NULL, rc, &st);
    return;
  }
  kilnd_call_note_created(c, b->handle);
  kiln_buffer_store *store = c->srv->buffers; /* c may be gone once finished */
  Kiln__V1__PutBufferResponse resp = KILN__V1__PUT_BUFFER_RESPONSE__INIT;
  resp.buffer = kilnd_buffer_info(ps->arena, b);
  if (resp.buffer) kilnd_call_finish(c, &resp.base, 0, NULL);
  else kilnd_call_fail(c, KILN_ENOMEM, "out of memory");
  kiln_buffer_store_unref(store, b);
}

static void put_on_message(kilnd_tag *tag, bool ok) {
  kilnd_call *c = KILND_CALL_FROM_TAG(tag, stream_tag);
  put_state *ps = c->state;
  int rc = 0;
  if (!ok) { /* the caller went away mid-stream: nobody to answer */
    kilnd_call_fail(c, KILN_ECANCELED, "the stream broke");
    return;
  }
  if (c->recv_buf == NULL) {
    put_finish(c, ps);
    return;
  }
  kiln_status st;
  kiln_status_clear(&st);
  ProtobufCMessage *msg = NULL;
  rc = kilnd_rpc_unpack(c, c->recv_buf, &kiln__v1__put_buffer_chunk__descriptor, &msg, &st);
  if (rc == 0) rc = put_chunk(c, ps, (const Kiln__V1__PutBufferChunk *)msg, &st);
  kilnd_call_free_message(c, msg);
  if (rc == 0 && kilnd_call_expired(c, &rc))
    kiln_status_set(&st, rc, "PutBuffer", "the call's deadline passed during the upload");
  if (rc == 0) rc = kilnd_call_recv_message(c, put_on_message);
  if (rc) kilnd_call_finish(c, NULL, rc, &st);
}

void kilnd_handle_put_buffer(kilnd_call *c, ProtobufCMessage *req) {
  (void)req;
  put_state *ps = kiln_calloc(1, sizeof *ps);
  if (ps) ps->arena = kiln_arena_create();
  if (ps == NULL || ps->arena == NULL) {
    kiln_free(ps);
    kilnd_call_fail(c, KILN_ENOMEM, "out of memory");
    return;
  }
  c->state = ps;
  c->state_free = put_free;
  if (kilnd_call_recv_message(c, put_on_message) != 0)
    kilnd_call_fail(c, KILN_EINTERNAL, "cannot receive the stream");
}

/* ---- GetBuffer ----------------------------------------------------------------------- */

typedef struct get_state {
  kiln_stored *b;
  uint64_t off, chunk;
  kiln_arena *arena;
} get_state;

static void get_free(kilnd_call *c) {
  get_state *gs = c->state;
  kiln_buffer_store_unref(c->srv->buffers, gs->b);
  kiln_arena_destroy(gs->arena);
  kiln_free(gs);
}

static void get_on_sent(kilnd_tag *tag, bool ok) {
  kilnd_call *c = KILND_CALL_FROM_TAG(tag, stream_tag);
  get_state *gs = c->state;
  if (!ok) {
    kilnd_call_abandon(c);
    return;
  }
  if (gs->off >= gs->b->bytes) {
    kilnd_call_finish(c, NULL, 0, NULL);
    return;
  }
  uint64_t n = gs->b->bytes - gs->off;
  if (n > gs->chunk) n = gs->chunk;
  Kiln__V1__BufferChunk msg = KILN__V1__BUFFER_CHUNK__INIT;
  msg.offset = (int64_t)gs->off;
  msg.data.data = (uint8_t *)gs->b->lit->data + gs->off;
  msg.data.len = n;
  gs->off += n; /* before sending: the completion may run on another thread at once */
  if (kilnd_call_send_message(c, &msg.base, get_on_sent) != 0)
    kilnd_call_fail(c, KILN_ENOMEM, "cannot send a chunk");
}

void kilnd_handle_get_buffer(kilnd_call *c, ProtobufCMessage *req) {
  const Kiln__V1__GetBufferRequest *r = (const void *)req;
  const kilnd_config *cfg = &c->srv->cfg;
  if (r->handle == NULL || r->handle[0] == '\0') {
    kilnd_call_fail(c, KILN_EINVAL, "handle: required");
    return;
  }
  if (r->chunk_bytes < 0) {
    kilnd_call_fail(c, KILN_EINVAL, "chunk_bytes: %lld is negative", (long long)r->chunk_bytes);
    return;
  }
  get_state *gs = kiln_calloc(1, sizeof *gs);
  if (gs) gs->arena = kiln_arena_create();
  if (gs == NULL || gs->arena == NULL) {
    kiln_free(gs);
    kilnd_call_fail(c, KILN_ENOMEM, "out of memory");
    return;
  }
  c->state = gs;
  c->state_free = get_free;
  /* A chunk plus its framing must fit the client's receive limit, which is
   * 4 MiB unless it raised it; a larger request is the client's choice. */
  uint64_t max_chunk = cfg->max_message_bytes > 1024 ? cfg->max_message_bytes - 1024 : 1;
  gs->chunk = r->chunk_bytes ? (uint64_t)r->chunk_bytes : cfg->chunk_bytes;
  if (gs->chunk > max_chunk) gs->chunk = max_chunk;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_buffer_store_acquire(c->srv->buffers, c->client, r->handle, r->release, &gs->b,
                                     &st);
  if (rc) {
    kilnd_call_finish(c, NULL, rc, &st);
    return;
  }
  Kiln__V1__BufferChunk first = KILN__V1__BUFFER_CHUNK__INIT;
  first.info = kilnd_buffer_info(gs->arena, gs->b);
  if (first.info == NULL || kilnd_call_send_message(c, &first.base, get_on_sent) != 0)
    kilnd_call_fail(c, KILN_ENOMEM, "out of memory");
}

/* ---- ReleaseBuffers ------------------------------------------------------------------ */

void kilnd_handle_release_buffers(kilnd_call *c, ProtobufCMessage *req) {
  const Kiln__V1__ReleaseBuffersRequest *r = (const void *)req;
  Kiln__V1__ReleaseBuffersResponse resp = KILN__V1__RELEASE_BUFFERS_RESPONSE__INIT;
  char **unknown = kiln_calloc(r->n_handles ? r->n_handles : 1, sizeof *unknown);
  if (unknown == NULL) {
    kilnd_call_fail(c, KILN_ENOMEM, "out of memory");
    return;
  }
  for (size_t i = 0; i < r->n_handles; i++) {
    uint64_t bytes = 0;
    if (kiln_buffer_store_release(c->srv->buffers, c->client, r->handles[i], &bytes) == 0) {
      resp.released++;
      resp.freed_bytes += (int64_t)bytes;
    } else {
      unknown[resp.n_unknown_handles++] = r->handles[i];
    }
  }
  resp.unknown_handles = unknown;
  kilnd_call_finish(c, &resp.base, 0, NULL);
  kiln_free(unknown);
}
