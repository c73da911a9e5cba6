/* PutBuffer, GetBuffer and ReleaseBuffers: server-resident buffers moved as
 * streams of chunks, so a tensor of any size travels in messages well under
 * gRPC's per-message limit.
 *
 * A stored array is device memory (kilnd_buffer_home picks the device for
 * the server's device id). PutBuffer learns the array's shape from the
 * header in its first message, reserves the bytes against the client's
 * quota and allocates the device buffer before accepting any data, and then
 * copies each chunk's bytes into place (into host memory directly where the
 * device's memory is host memory, through kiln_buffer_write otherwise)
 * straight from the slices gRPC received them in (the chunk message is read
 * field by field; only its small header goes through the usual unpack);
 * more bytes than the shape holds are refused at once, fewer at the end. A stream that breaks or
 * whose caller goes away returns the reservation. GetBuffer sends the description first, then the
 * bytes in order, one message in flight at a time, holding a reference so that a concurrent release
 * cannot free the data under it: straight from host memory when the array is there and row-major,
 * else from one row-major copy read from the device at the start.
 */
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>

#include "common/alloc.h"
#include "compiler/ir/ir.h"
#include "executor/backend.h"
#include "executor/buffers.h"
#include "executor/scheduler.h"
#include "kiln/v1/kiln.pb-c.h"
#include "server/convert.h"
#include "server/server.h"
#include "server/stall.h"

#define LABEL_MAX 256
/* GetBuffer chunks are at least this big, whatever the request asks: a
 * 1-byte chunk size would turn a buffer into as many messages. */
#define MIN_CHUNK (64u << 10)

/* ---- PutBuffer ----------------------------------------------------------------------- */

typedef struct put_state {
  kiln_arena *arena; /* the shape */
  kiln_shape shape;  /* row-major, from the header */
  kiln_buffer *buf;  /* being filled; NULL until the header */
  uint8_t *host;     /* its host memory; NULL when the device has its own */
  uint64_t size, got;
  bool reserved;     /* size bytes reserved for c->client */
  kilnd_stall stall; /* released when the stream idles (stall.h) */
  int32_t device;
  char label[LABEL_MAX + 1];
} put_state;

/* The stall sweep's release, under its lock (the handler is not running). */
static void put_release(kilnd_call *c) {
  put_state *ps = c->state;
  if (ps->reserved) kiln_buffer_store_unreserve(c->srv->buffers, c->client, ps->size);
  ps->reserved = false;
}

static void put_free(kilnd_call *c) {
  put_state *ps = c->state;
  kilnd_stall_forget(&ps->stall);
  if (ps->reserved) kiln_buffer_store_unreserve(c->srv->buffers, c->client, ps->size);
  kiln_buffer_free(ps->buf);
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

kiln_device *kilnd_buffer_home(kilnd *srv, int32_t device) {
  uint32_t first = kiln_sched_class_first(srv->sched, KILND_CLASS_CPU);
  uint32_t n = kiln_backend_device_count(srv->cpu);
  if (device >= (int32_t)first && (uint32_t)device - first < n)
    return kiln_backend_device(srv->cpu, (uint32_t)device - first);
  /* The interpreter's devices run on host literals: their arrays live in
   * host memory, the first cpu device's, viewed in place. */
  return kiln_backend_device(srv->cpu, 0);
}

/* The device buffer an upload fills. Its bytes are not zeroed first (a
 * discarding host view): the upload writes every byte before the buffer is
 * stored (put_finish checks the count), and zeroes would touch every page
 * of a large upload once before its chunks write it again. */
static int upload_buffer(kilnd *srv, put_state *ps, kiln_status *st) {
  kiln_device *d = kilnd_buffer_home(srv, ps->device);
  int rc = kiln_buffer_alloc(d, (size_t)ps->size, &ps->buf, st);
  if (rc == KILN_ENOMEM)
    return kiln_status_set(st, KILN_ENOMEM, "header.shape",
                           "out of memory for a buffer of %llu bytes",
                           (unsigned long long)ps->size);
  if (rc) return rc;
  ps->host = kiln_buffer_host(ps->buf, true);
  if (ps->host) ask_huge_pages(ps->host, ps->size);
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
  /* the bytes come row-major whatever layout the header names */
  if (!kiln_shape_is_row_major(&shape)) shape.layout = NULL;
  ps->shape = shape;
  return upload_buffer(c->srv, ps, st);
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

/* cur_read into device memory of its own: slice by slice through
 * kiln_buffer_write. False when the message ends first (*rc stays 0) or the
 * write fails (*rc is its code). */
static bool cur_write_buffer(cursor *k, kiln_buffer *b, uint64_t at, uint64_t n, int *rc,
                             kiln_status *st) {
  if (n > k->left) return false;
  k->left -= n;
  while (n) {
    if (!cur_fill(k)) return false;
    size_t m = (size_t)(k->end - k->p) < n ? (size_t)(k->end - k->p) : (size_t)n;
    if ((*rc = kiln_buffer_write(b, (size_t)at, k->p, m, st)) != 0) return false;
    at += m;
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
static int put_chunk_header(kilnd_call *c, put_state *ps, const chunk_fields *f, kiln_status *st) {
  grpc_slice s = grpc_slice_from_copied_buffer((const char *)f->header, f->header_len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  if (bb == NULL) return kiln_status_set(st, KILN_ENOMEM, "PutBuffer", "out of memory");
  ProtobufCMessage *msg = NULL;
  int rc = kilnd_rpc_unpack(c, bb, &kiln__v1__put_buffer_chunk__descriptor, &msg, st);
  grpc_byte_buffer_destroy(bb);
  const Kiln__V1__PutBufferChunk *ch = (const void *)msg;
  if (rc == 0 && ch->header) {
    if (ps->buf)
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
  if (rc == 0 && ps->buf == NULL)
    rc = kiln_status_set(st, KILN_EINVAL, "header", "the first message must carry the header");
  uint64_t n = f.has_data ? f.data_len : 0;
  if (rc == 0 && n > ps->size - ps->got) {
    char shape[128];
    kilnd_shape_str(&ps->shape, shape, sizeof shape);
    rc = kiln_status_set(
        st, KILN_EINVAL, "data", "more data than %s holds: %llu bytes after %llu of %llu", shape,
        (unsigned long long)n, (unsigned long long)ps->got, (unsigned long long)ps->size);
  }
  if (rc == 0 && n) {
    if (ps->host ? cur_read(&f.data, ps->host + ps->got, n)
                 : cur_write_buffer(&f.data, ps->buf, ps->got, n, &rc, st))
      ps->got += n;
    else if (rc == 0)
      rc = malformed(st);
  }
  kiln_free(f.header);
  grpc_byte_buffer_reader_destroy(&k.r); /* f.data is a copy of k: destroyed once */
  return rc;
}

static void put_finish(kilnd_call *c, put_state *ps) {
  kiln_status st;
  kiln_status_clear(&st);
  int rc = 0;
  if (ps->buf == NULL)
    rc = kiln_status_set(&st, KILN_EINVAL, "PutBuffer", "the stream ended before a header");
  else if (ps->got != ps->size)
    rc = kiln_status_set(&st, KILN_EINVAL, "PutBuffer", "the stream ended after %llu of %llu bytes",
                         (unsigned long long)ps->got, (unsigned long long)ps->size);
  if (rc) {
    kilnd_call_finish(c, NULL, rc, &st);
    return;
  }
  kiln_stored *b = NULL;
  kiln_buffer *buf = ps->buf;
  ps->buf = NULL;
  ps->reserved = false; /* add takes over the reservation and the buffer, even when it fails */
  rc = kiln_buffer_store_add(c->srv->buffers, c->client, buf, &ps->shape, ps->device, ps->label,
                             true, &b, &st);
  if (rc) {
    kilnd_call_finish(c, NULL, rc, &st);
    return;
  }
  kilnd_call_note_created(c, b->handle);
  kiln_buffer_store *store = c->srv->buffers; /* c may be gone once finished */
  Kiln__V1__PutBufferResponse resp = KILN__V1__PUT_BUFFER_RESPONSE__INIT;
  resp.buffer = kilnd_buffer_info(ps->arena, b);
  if (resp.buffer)
    kilnd_call_finish(c, &resp.base, 0, NULL);
  else
    kilnd_call_fail(c, KILN_ENOMEM, "out of memory");
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
  if (!kilnd_stall_begin(&ps->stall)) {
    kilnd_stall_fail(c);
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
  if (rc == 0) {
    kilnd_stall_end(&ps->stall);
    rc = kilnd_call_recv_message(c, put_on_message);
  }
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
  kilnd_stall_watch(&ps->stall, c, put_release);
  if (kilnd_call_recv_message(c, put_on_message) != 0)
    kilnd_call_fail(c, KILN_EINTERNAL, "cannot receive the stream");
}

/* ---- GetBuffer ----------------------------------------------------------------------- */

typedef struct get_state {
  kiln_stored *b;
  const uint8_t *data; /* b's bytes row-major: its host memory, or `copy` */
  uint8_t *copy;       /* a row-major copy read from the device; NULL when none */
  uint64_t off, chunk;
  kiln_arena *arena;
} get_state;

static void get_free(kilnd_call *c) {
  get_state *gs = c->state;
  kiln_buffer_store_unref(c->srv->buffers, gs->b);
  kiln_free(gs->copy);
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
  msg.data.data = (uint8_t *)gs->data + gs->off;
  msg.data.len = n;
  gs->off += n; /* before sending: the completion may run on another thread at once */
  if (kilnd_call_send_message(c, &msg.base, get_on_sent) != 0)
    kilnd_call_fail(c, KILN_ENOMEM, "cannot send a chunk");
}

/* Where the bytes are sent from: the array's host memory when it is there
 * and row-major, else one row-major copy. */
static int get_source(get_state *gs, kiln_status *st) {
  kiln_literal view;
  if (kiln_stored_view(gs->b, &view, NULL) == 0) {
    gs->data = view.data;
    return 0;
  }
  gs->copy = kiln_malloc(gs->b->bytes ? (size_t)gs->b->bytes : 1);
  if (gs->copy == NULL) return kiln_status_set(st, KILN_ENOMEM, "GetBuffer", "out of memory");
  gs->data = gs->copy;
  return kiln_array_read_row_major(gs->b->buf, gs->b->shape, gs->copy, st);
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
  if (gs->chunk < MIN_CHUNK) gs->chunk = MIN_CHUNK; /* tiny chunks only cost messages */
  if (gs->chunk > max_chunk) gs->chunk = max_chunk;
  kiln_status st;
  kiln_status_clear(&st);
  int rc =
      kiln_buffer_store_acquire(c->srv->buffers, c->client, r->handle, r->release, &gs->b, &st);
  if (rc == 0) rc = get_source(gs, &st);
  if (rc) {
    kilnd_call_finish(c, NULL, rc, &st);
    return;
  }
  Kiln__V1__BufferChunk first = KILN__V1__BUFFER_CHUNK__INIT;
  first.info = kilnd_buffer_info(gs->arena, gs->b);
  if (first.info == NULL || kilnd_call_send_message(c, &first.base, get_on_sent) != 0)
    kilnd_call_fail(c, KILN_ENOMEM, "out of memory");
}

/* ---- leases -------------------------------------------------------------------------- */

/* Every call renews its client's lease (kilnd_rpc_dispatch touches the
 * store), so only a client that made no call for a whole lease loses its
 * buffers: one that was killed, or one idle for that long without renewing.
 * gRPC's core tells a server nothing when a connection closes, and buffers
 * belong to the client's identity, not to a connection, so a lease is what
 * ties them to a client that is still there. */
void kilnd_buffers_expire(kilnd *srv) {
  static _Atomic int64_t next_ns; /* one sweep a second is plenty */
  double lease = srv->cfg.buffer_lease_seconds;
  if (lease <= 0) return;
  int64_t now = kiln_sched_now_ns(), due = atomic_load(&next_ns);
  if (now < due || !atomic_compare_exchange_strong(&next_ns, &due, now + 1000000000)) return;
  uint64_t bytes = 0;
  uint64_t n = kiln_buffer_store_expire(srv->buffers, (int64_t)(lease * 1e9), &bytes);
  if (n)
    kilnd_log("buffers: released %llu buffers (%llu bytes) of clients idle for over %g s "
              "(buffer-lease-seconds)",
              (unsigned long long)n, (unsigned long long)bytes, lease);
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
