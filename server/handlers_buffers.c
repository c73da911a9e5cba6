/* PutBuffer, GetBuffer and ReleaseBuffers: server-resident buffers moved as
 * streams of chunks, so a tensor of any size travels in messages well under
 * gRPC's per-message limit.
 *
 * PutBuffer learns the array's shape from the header in its first message,
 * reserves the bytes against the client's quota and allocates the array
 * before accepting any data, and then copies each chunk's bytes into place
 * straight from the slices gRPC received them in (the chunk message is read
 * field by field; only its small header goes through the usual unpack);
 * more bytes than the shape holds are refused at once, fewer at the end. A stream that breaks or whose caller
 * goes away returns the reservation. GetBuffer sends the description first,
 * then the bytes in order, one message in flight at a time, holding a
 * reference so that a concurrent release cannot free the data under it.
 */
#include <string.h>
#include <sys/mman.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>

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

/* The chunks of a large upload each write fresh memory: with 2 MiB pages
 * it faults in 512 times less often. Only a hint; the kernel may say no. */
static void ask_huge_pages(void *data, uint64_t bytes) {
#ifdef MADV_HUGEPAGE
  const uintptr_t huge = (uintptr_t)2 << 20;
  if (bytes < 4 * huge) return;
  uintptr_t b = ((uintptr_t)data + huge - 1) & ~(huge - 1);
  uintptr_t e = ((uintptr_t)data + (uintptr_t)bytes) & ~(huge - 1);
  if (e > b) madvise((void *)b, e - b, MADV_HUGEPAGE);
#else
  (void)data, (void)bytes;
#endif
}

/* A heap literal (ir.h: it owns a private arena holding itself, its shape
 * and its data) whose data is left unwritten: kiln_literal_create would zero
 * it, touching every page of a large upload once before its chunks write it
 * again, and before the huge-page hint could matter. The upload writes every
 * byte before the literal is stored (put_finish checks the count). */
static int upload_literal(const kiln_shape *shape, uint64_t bytes, kiln_literal **out,
                          kiln_status *st) {
  *out = NULL;
  kiln_arena *own = kiln_arena_create();
  kiln_literal *lit = own ? kiln_arena_calloc(own, 1, sizeof *lit) : NULL;
  if (lit == NULL || kiln_shape_copy(own, &lit->shape, shape) != 0 ||
      (lit->data = kiln_arena_alloc(own, bytes ? (size_t)bytes : 1)) == NULL) {
    kiln_arena_destroy(own);
    return kiln_status_set(st, KILN_ENOMEM, "header.shape",
                           "out of memory for a buffer of %llu bytes", (unsigned long long)bytes);
  }
  lit->nbytes = (size_t)bytes;
  lit->own = own;
  ask_huge_pages(lit->data, bytes);
  *out = lit;
  return 0;
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
  return upload_literal(&shape, ps->size, &ps->lit, st);
}

/* ---- reading a chunk where it lies ----------------------------------------------------- */

/* A cursor over the slices of a received message: a PutBufferChunk is read
 * field by field straight from gRPC's slices, and its data bytes are copied
 * once, into the array, without being gathered into one block first. */
typedef struct cursor {
  grpc_byte_buffer_reader r;
  const uint8_t *p, *end; /* the current slice's unread bytes */
  uint64_t left;          /* bytes of the message not read yet */
} cursor;

static bool cur_fill(cursor *k) {
  while (k->p == k->end) {
    grpc_slice *s;
    if (!grpc_byte_buffer_reader_peek(&k->r, &s)) return false;
    k->p = GRPC_SLICE_START_PTR(*s);
    k->end = k->p + GRPC_SLICE_LENGTH(*s);
  }
  return true;
}

/* Copies n bytes to dst (NULL: skips them). False when the message ends first. */
static bool cur_read(cursor *k, uint8_t *dst, uint64_t n) {
  if (n > k->left) return false;
  k->left -= n;
  while (n) {
    if (!cur_fill(k)) return false;
    size_t m = (size_t)(k->end - k->p) < n ? (size_t)(k->end - k->p) : (size_t)n;
    if (dst) {
      memcpy(dst, k->p, m);
      dst += m;
    }
    k->p += m;
    n -= m;
  }
  return true;
}

static bool cur_varint(cursor *k, uint64_t *v) {
  *v = 0;
  for (unsigned shift = 0; shift < 64; shift += 7) {
    uint8_t b;
    if (!cur_read(k, &b, 1)) return false;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

/* The fields of one PutBufferChunk. The header's occurrences are gathered
 * (re-framed as field 1) into `header` for the usual check and unpack; the
 * data is only located: the last occurrence wins, as protobuf-c has it. */
typedef struct chunk_fields {
  uint8_t *header; /* kiln_malloc'd; NULL when the message has no header */
  size_t header_len;
  bool has_data;
  cursor data; /* positioned at the data bytes */
  uint64_t data_len;
} chunk_fields;

static int malformed(kiln_status *st) {
  return kiln_status_set(st, KILN_EINVAL, NULL, "not a valid %s message",
                         kiln__v1__put_buffer_chunk__descriptor.name);
}

static int gather_header(chunk_fields *f, cursor *k, uint64_t len, kiln_status *st) {
  uint8_t *grown = kiln_realloc(f->header, f->header_len + 11 + len);
  if (grown == NULL) return kiln_status_set(st, KILN_ENOMEM, "PutBuffer", "out of memory");
  f->header = grown;
  uint8_t *w = grown + f->header_len;
  *w++ = 1 << 3 | 2; /* field 1, length-delimited */
  for (uint64_t v = len;; v >>= 7) {
    *w++ = (uint8_t)(v & 0x7f) | (v >= 0x80 ? 0x80 : 0);
    if (v < 0x80) break;
  }
  if (!cur_read(k, w, len)) return malformed(st);
  f->header_len = (size_t)(w - grown) + len;
  return 0;
}

static int scan_chunk(cursor *k, chunk_fields *f, kiln_status *st) {
  while (k->left) {
    uint64_t tag, v;
    if (!cur_varint(k, &tag)) return malformed(st);
    uint64_t number = tag >> 3;
    if (number == 0 || number > 0x1fffffff) return malformed(st);
    int rc = 0;
    switch (tag & 7) {
    case 0: rc = cur_varint(k, &v) ? 0 : malformed(st); break;
    case 1: rc = cur_read(k, NULL, 8) ? 0 : malformed(st); break;
    case 5: rc = cur_read(k, NULL, 4) ? 0 : malformed(st); break;
    case 2:
      if (!cur_varint(k, &v) || v > k->left) return malformed(st);
      if (number == 1) {
        rc = gather_header(f, k, v, st);
      } else if (number == 2) {
        f->has_data = true;
        f->data = *k;
        f->data_len = v;
        rc = cur_read(k, NULL, v) ? 0 : malformed(st);
      } else {
        rc = cur_read(k, NULL, v) ? 0 : malformed(st);
      }
      break;
    default: return malformed(st); /* groups are not proto3; 6 and 7 do not exist */
    }
    if (rc) return rc;
    /* header and data are length-delimited; anything else under their
     * numbers is not this message */
    if ((number == 1 || number == 2) && (tag & 7) != 2) return malformed(st);
  }
  return 0;
}

/* The header's occurrences, unpacked through the validation point's own
 * check and bounded allocator (errors name "header.shape..." as before). */
static int put_chunk_header(kilnd_call *c, put_state *ps, const chunk_fields *f,
                            kiln_status *st) {
  grpc_slice s = grpc_slice_from_copied_buffer((const char *)f->header, f->header_len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  if (bb == NULL) return kiln_status_set(st, KILN_ENOMEM, "PutBuffer", "out of memory");
  ProtobufCMessage *msg = NULL;
  int rc = kilnd_rpc_unpack(c, bb, &kiln__v1__put_buffer_chunk__descriptor, &msg, st);
  grpc_byte_buffer_destroy(bb);
  const Kiln__V1__PutBufferChunk *ch = (const void *)msg;
  if (rc == 0 && ch->header) {
    if (ps->lit)
      rc = kiln_status_set(st, KILN_EINVAL, "header", "sent again after the first message");
    else
      rc = put_header(c, ps, ch->header, st);
  }
  kilnd_call_free_message(c, msg);
  return rc;
}

static int put_chunk_raw(kilnd_call *c, put_state *ps, grpc_byte_buffer *bb, kiln_status *st);

static int put_chunk(kilnd_call *c, put_state *ps, grpc_byte_buffer *bb, kiln_status *st) {
  if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE)
    return put_chunk_raw(c, ps, bb, st);
  /* A compressed message (gRPC normally decompresses before we see it):
   * decompressed into one slice, then read the same way. */
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb))
    return kiln_status_set(st, KILN_EINVAL, kiln__v1__put_buffer_chunk__descriptor.name,
                           "unreadable request message");
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  grpc_byte_buffer *plain = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  int rc = put_chunk_raw(c, ps, plain, st);
  grpc_byte_buffer_destroy(plain);
  return rc;
}

static int put_chunk_raw(kilnd_call *c, put_state *ps, grpc_byte_buffer *bb, kiln_status *st) {
  size_t len = grpc_byte_buffer_length(bb);
  if (len > c->srv->cfg.max_message_bytes)
    return kiln_status_set(st, KILN_ELIMIT, kiln__v1__put_buffer_chunk__descriptor.name,
                           "message of %zu bytes exceeds the limit of %llu (max-message-bytes)",
                           len, (unsigned long long)c->srv->cfg.max_message_bytes);
  cursor k = {.left = len};
  if (!grpc_byte_buffer_reader_init(&k.r, bb))
    return kiln_status_set(st, KILN_EINVAL, kiln__v1__put_buffer_chunk__descriptor.name,
                           "unreadable request message");
  chunk_fields f = {0};
  int rc = scan_chunk(&k, &f, st);
  if (rc == 0 && f.header) rc = put_chunk_header(c, ps, &f, st);
  if (rc == 0 && ps->lit == NULL)
    rc = kiln_status_set(st, KILN_EINVAL, "header", "the first message must carry the header");
  uint64_t n = f.has_data ? f.data_len : 0;
  if (rc == 0 && n > ps->size - ps->got) {
    char shape[128];
    kilnd_shape_str(&ps->lit->shape, shape, sizeof shape);
    rc = kiln_status_set(st, KILN_EINVAL, "data",
                         "more data than %s holds: %llu bytes after %llu of %llu", shape,
                         (unsigned long long)n, (unsigned long long)ps->got,
                         (unsigned long long)ps->size);
  }
  if (rc == 0 && n) {
    if (cur_read(&f.data, (uint8_t *)ps->lit->data + ps->got, n)) ps->got += n;
    else rc = malformed(st);
  }
  kiln_free(f.header);
  grpc_byte_buffer_reader_destroy(&k.r); /* f.data is a copy of k: destroyed once */
  return rc;
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
  rc = put_chunk(c, ps, c->recv_buf, &st);
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
