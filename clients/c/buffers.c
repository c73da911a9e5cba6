/* Server-resident buffers: PutBuffer (a client stream of chunks),
 * GetBuffer (a server stream of chunks) and ReleaseBuffers.
 *
 * Bulk data never travels in one message: PutBuffer sends the header with
 * the first chunk, then one message per chunk_bytes, each written straight
 * into a gRPC slice (one copy from the caller's memory). The batch that
 * receives the final status is started before the first send, so a server
 * that refuses the header (a bad shape, a full quota) ends the upload at
 * once instead of after the last chunk. GetBuffer reads chunks as they
 * arrive and copies each into place after checking that it continues the
 * data exactly where the previous one stopped: offsets in order, no gaps,
 * no overlap, no byte past the announced size.
 */
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

#include "clients/c/client_internal.h"
#include "common/alloc.h"

static size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v > 0x7f) {
    v >>= 7;
    n++;
  }
  return n;
}

static size_t put_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;
  do {
    p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return n;
}

/* ---- PutBuffer ------------------------------------------------------------------ */

/* One PutBufferChunk: the packed header (may be NULL) then field 2, data. */
static grpc_byte_buffer *chunk_message(const uint8_t *head, size_t head_len, const void *data,
                                       size_t n) {
  size_t total = head_len + (n ? 1 + varint_size(n) + n : 0);
  grpc_slice s = grpc_slice_malloc(total);
  uint8_t *p = GRPC_SLICE_START_PTR(s);
  if (head_len) memcpy(p, head, head_len);
  p += head_len;
  if (n) {
    *p++ = 0x12; /* field 2, length-delimited */
    p += put_varint(p, n);
    memcpy(p, data, n);
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

static int pack_header(const kiln_shape *shape, const kiln_remote_put_options *o, uint8_t **out,
                       size_t *len, kiln_status *st) {
  kiln_arena *a = kiln_arena_create();
  if (a == NULL) return kiln__client_oom(st);
  Kiln__V1__PutBufferChunk msg;
  Kiln__V1__PutBufferHeader h;
  kiln__v1__put_buffer_chunk__init(&msg);
  kiln__v1__put_buffer_header__init(&h);
  int rc = kiln__shape_encode(a, shape, &h.shape);
  if (rc) {
    kiln_arena_destroy(a);
    return kiln__client_oom(st);
  }
  h.device = o->device;
  h.label = (char *)(o->label ? o->label : "");
  msg.header = &h;
  rc = kiln__pack(&msg.base, out, len, st);
  kiln_arena_destroy(a);
  return rc;
}

/* Sends every chunk; stops early (returning normally) when a send fails,
 * which means the server has ended the call: its status says why. */
static int send_chunks(kiln__call *k, const uint8_t *head, size_t head_len, const uint8_t *data,
                       size_t nbytes, size_t chunk, kiln_status *st) {
  size_t off = 0;
  bool first = true;
  while (first || off < nbytes) {
    size_t n = nbytes - off < chunk ? nbytes - off : chunk;
    grpc_byte_buffer *bb = chunk_message(first ? head : NULL, first ? head_len : 0, data + off, n);
    if (bb == NULL) return kiln__client_oom(st);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    bool ok = kiln__call_batch(k, &op, 1);
    grpc_byte_buffer_destroy(bb);
    if (!ok) return 0;
    off += n;
    first = false;
  }
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  kiln__call_batch(k, &op, 1);
  return 0;
}

int kiln_client_put_buffer_raw(kiln_client *c, const kiln_shape *shape, const void *data,
                               size_t nbytes, const kiln_remote_put_options *opts,
                               kiln_remote_buffer *out, kiln_status *st) {
  memset(out, 0, sizeof *out);
  kiln_remote_put_options o = {0};
  if (opts) o = *opts;
  if (shape == NULL || !kiln_shape_is_array(shape))
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "a buffer holds an array, not a %s",
                             shape ? kiln_dtype_name(shape->dtype) : "missing shape");
  int64_t want = kiln_shape_bytes(shape);
  if (want < 0 || (uint64_t)want != (uint64_t)nbytes)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT,
                             "%zu bytes given for a shape of %lld bytes", nbytes, (long long)want);
  if (nbytes && data == NULL)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "no data given");
  uint8_t *head;
  size_t head_len;
  int rc = pack_header(shape, &o, &head, &head_len, st);
  if (rc) return rc;
  kiln__call k;
  if ((rc = kiln__call_start(c, KILN__M_PUT_BUFFER, o.deadline_ms, &k, st))) goto out_free_head;
  grpc_byte_buffer *reply = NULL;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_INITIAL_METADATA;
  op.data.send_initial_metadata.count = k.nmd;
  op.data.send_initial_metadata.metadata = k.md;
  if (!kiln__call_batch(&k, &op, 1) || !kiln__call_recv_start(&k, &reply)) {
    rc = kiln__call_finish(&k, st);
    if (rc == 0) rc = kiln__client_fail(st, KILN_RPC_INTERNAL, "PutBuffer could not start");
    goto out_free_head;
  }
  rc = send_chunks(&k, head, head_len, data, nbytes, (size_t)c->chunk_bytes, st);
  if (rc) {
    kiln__call_abandon(&k);
    goto out_free_reply;
  }
  if ((rc = kiln__call_finish(&k, st))) goto out_free_reply;
  if (reply == NULL) {
    rc = kiln__client_fail(st, KILN_RPC_INTERNAL, "PutBuffer succeeded without a reply message");
    goto out_free_head;
  }
  uint8_t *bytes;
  size_t len;
  if ((rc = kiln__buffer_to_bytes(reply, &bytes, &len, st))) goto out_free_reply;
  ProtobufCMessage *msg;
  rc = kiln__unpack(&kiln__v1__put_buffer_response__descriptor, bytes, len, &msg, st);
  kiln_free(bytes);
  if (rc == 0) {
    rc = kiln__remote_buffer_decode(((Kiln__V1__PutBufferResponse *)msg)->buffer, out, st);
    protobuf_c_message_free_unpacked(msg, NULL);
  }
out_free_reply:
  if (reply) grpc_byte_buffer_destroy(reply);
out_free_head:
  kiln_free(head);
  return rc;
}

int kiln_client_put_buffer(kiln_client *c, const kiln_literal *value,
                           const kiln_remote_put_options *opts, kiln_remote_buffer *out,
                           kiln_status *st) {
  if (value == NULL) {
    memset(out, 0, sizeof *out);
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "no value given");
  }
  return kiln_client_put_buffer_raw(c, &value->shape, value->data, value->nbytes, opts, out, st);
}

/* ---- GetBuffer ------------------------------------------------------------------ */

/* A BufferChunk read in place: the info message (if any) is unpacked, the
 * data is a view into the received bytes. */
typedef struct chunk {
  Kiln__V1__BufferInfo *info;
  int64_t offset;
  const uint8_t *data;
  size_t len;
} chunk;

static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

static int parse_chunk(const uint8_t *p, size_t len, chunk *ch, kiln_status *st) {
  const uint8_t *end = p + len;
  memset(ch, 0, sizeof *ch);
  while (p < end) {
    uint64_t key, v;
    if (!read_varint(&p, end, &key)) goto bad;
    uint32_t field = (uint32_t)(key >> 3), wire = key & 7;
    if (wire == 0) {
      if (!read_varint(&p, end, &v)) goto bad;
      if (field == 2) ch->offset = (int64_t)v;
    } else if (wire == 2) {
      if (!read_varint(&p, end, &v) || v > (uint64_t)(end - p)) goto bad;
      if (field == 1) {
        ProtobufCMessage *m;
        if (ch->info) protobuf_c_message_free_unpacked(&ch->info->base, NULL);
        ch->info = NULL;
        int rc = kiln__unpack(&kiln__v1__buffer_info__descriptor, p, v, &m, st);
        if (rc) return rc;
        ch->info = (Kiln__V1__BufferInfo *)m;
      } else if (field == 3) {
        ch->data = p;
        ch->len = v;
      }
      p += v;
    } else if (wire == 1 && end - p >= 8) {
      p += 8;
    } else if (wire == 5 && end - p >= 4) {
      p += 4;
    } else {
      goto bad;
    }
  }
  return 0;
bad:
  if (ch->info) protobuf_c_message_free_unpacked(&ch->info->base, NULL);
  ch->info = NULL;
  return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server sent a malformed BufferChunk");
}

/* Where the bytes of a download go: a literal made from the first chunk's
 * info, or the caller's memory. */
typedef struct sink {
  uint8_t *dst;
  size_t cap;
  kiln_literal *lit; /* kiln_client_get_buffer */
  kiln_remote_buffer info;
  size_t size, received;
  bool started;
} sink;

static int sink_start(sink *s, const chunk *ch, kiln_status *st) {
  if (ch->info == NULL)
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server's first BufferChunk has no info");
  int rc = kiln__remote_buffer_decode(ch->info, &s->info, st);
  if (rc) return rc;
  s->size = (size_t)s->info.size_bytes;
  s->started = true;
  if (s->dst == NULL && s->cap == 0) {
    if ((rc = kiln_literal_create(NULL, &s->info.shape, 0, &s->lit, NULL)))
      return rc == KILN_ENOMEM
                 ? kiln__client_oom(st)
                 : kiln__client_fail(st, KILN_RPC_RESOURCE_EXHAUSTED,
                                     "a %zu-byte buffer does not fit in memory", s->size);
    s->dst = s->lit->data;
  } else if (s->size > s->cap) {
    return kiln__client_fail(st, KILN_RPC_RESOURCE_EXHAUSTED,
                             "the buffer holds %zu bytes, the destination only %zu", s->size,
                             s->cap);
  }
  return 0;
}

static int sink_chunk(sink *s, const chunk *ch, kiln_status *st) {
  int rc;
  if (!s->started && (rc = sink_start(s, ch, st))) return rc;
  if (ch->len == 0) return 0;
  if (ch->offset < 0 || (uint64_t)ch->offset != s->received)
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS,
                             "the server sent a chunk at offset %lld, expected %zu",
                             (long long)ch->offset, s->received);
  if (ch->len > s->size - s->received)
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS,
                             "the server sent more than the %zu bytes announced", s->size);
  memcpy(s->dst + s->received, ch->data, ch->len);
  s->received += ch->len;
  return 0;
}

static int get_request(const char *handle, const kiln_remote_get_options *o, int64_t chunk_bytes,
                       grpc_byte_buffer **out, kiln_status *st) {
  Kiln__V1__GetBufferRequest req;
  kiln__v1__get_buffer_request__init(&req);
  req.handle = (char *)handle;
  req.chunk_bytes = o->chunk_bytes ? o->chunk_bytes : chunk_bytes;
  req.release = o->release;
  uint8_t *buf;
  size_t len;
  int rc = kiln__pack(&req.base, &buf, &len, st);
  if (rc) return rc;
  *out = kiln__bytes_to_buffer(buf, len);
  kiln_free(buf);
  return *out ? 0 : kiln__client_oom(st);
}

/* Copies a received message into *buf, growing it as needed: one buffer
 * serves every chunk of a download (a fresh megabyte per chunk would be a
 * fresh mmap and its page faults each time). */
static int message_bytes(grpc_byte_buffer *bb, uint8_t **buf, size_t *cap, size_t *len,
                         kiln_status *st) {
  size_t n = grpc_byte_buffer_length(bb);
  if (n > *cap) {
    uint8_t *nb = kiln_realloc(*buf, n);
    if (nb == NULL) return kiln__client_oom(st);
    *buf = nb;
    *cap = n;
  }
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb))
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "cannot read the server's reply");
  grpc_slice s;
  size_t off = 0;
  while (grpc_byte_buffer_reader_next(&r, &s)) {
    size_t k = GRPC_SLICE_LENGTH(s);
    if (k > n - off) k = n - off;
    memcpy(*buf + off, GRPC_SLICE_START_PTR(s), k);
    off += k;
    grpc_slice_unref(s);
  }
  grpc_byte_buffer_reader_destroy(&r);
  *len = off;
  return 0;
}

/* Receives chunks until the server ends the stream. */
static int receive_chunks(kiln__call *k, sink *s, kiln_status *st) {
  uint8_t *bytes = NULL;
  size_t cap = 0;
  int rc = 0;
  for (;;) {
    grpc_byte_buffer *bb = NULL;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    if (!kiln__call_batch(k, &op, 1) || bb == NULL) break;
    size_t len = 0;
    rc = message_bytes(bb, &bytes, &cap, &len, st);
    grpc_byte_buffer_destroy(bb);
    if (rc) break;
    chunk ch;
    rc = parse_chunk(bytes, len, &ch, st);
    if (rc == 0) rc = sink_chunk(s, &ch, st);
    if (ch.info) protobuf_c_message_free_unpacked(&ch.info->base, NULL);
    if (rc) break;
  }
  kiln_free(bytes);
  return rc;
}

static int get_buffer(kiln_client *c, const char *handle, const kiln_remote_get_options *opts,
                      sink *s, kiln_status *st) {
  kiln_remote_get_options o = {0};
  if (opts) o = *opts;
  if (handle == NULL || handle[0] == '\0')
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "no buffer handle given");
  if (o.chunk_bytes < 0)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "chunk_bytes %lld is negative",
                             (long long)o.chunk_bytes);
  grpc_byte_buffer *req;
  int rc = get_request(handle, &o, c->chunk_bytes, &req, st);
  if (rc) return rc;
  kiln__call k;
  if ((rc = kiln__call_start(c, KILN__M_GET_BUFFER, o.deadline_ms, &k, st))) {
    grpc_byte_buffer_destroy(req);
    return rc;
  }
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = k.nmd;
  ops[0].data.send_initial_metadata.metadata = k.md;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = req;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &k.initial_md;
  bool ok = kiln__call_batch(&k, ops, 4);
  grpc_byte_buffer_destroy(req);
  if (ok && (rc = receive_chunks(&k, s, st))) {
    kiln__call_abandon(&k);
    return rc;
  }
  if ((rc = kiln__call_finish(&k, st))) return rc;
  if (!s->started)
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "GetBuffer ended without sending the buffer");
  if (s->received != s->size)
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "GetBuffer ended after %zu of %zu bytes",
                             s->received, s->size);
  return 0;
}

int kiln_client_get_buffer(kiln_client *c, const char *handle, const kiln_remote_get_options *opts,
                           kiln_literal **out, kiln_status *st) {
  *out = NULL;
  sink s = {0};
  int rc = get_buffer(c, handle, opts, &s, st);
  if (rc == 0) {
    *out = s.lit;
    s.lit = NULL;
  }
  kiln_literal_destroy(s.lit);
  kiln_remote_buffer_clear(&s.info);
  return rc;
}

int kiln_client_get_buffer_raw(kiln_client *c, const char *handle,
                               const kiln_remote_get_options *opts, void *dst, size_t cap,
                               size_t *nbytes, kiln_remote_buffer *info, kiln_status *st) {
  *nbytes = 0;
  if (info) memset(info, 0, sizeof *info);
  if (dst == NULL && cap)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "no destination given");
  /* A zero-capacity destination still needs a non-NULL pointer, so that the
   * sink does not take it for the literal case. */
  static uint8_t none[1];
  sink s = {.dst = dst ? dst : none, .cap = cap};
  int rc = get_buffer(c, handle, opts, &s, st);
  if (rc == 0) {
    *nbytes = s.received;
    if (info) {
      *info = s.info;
      memset(&s.info, 0, sizeof s.info);
    }
  }
  kiln_remote_buffer_clear(&s.info);
  return rc;
}

/* ---- ReleaseBuffers ------------------------------------------------------------- */

int kiln_client_release_buffers(kiln_client *c, const char *const *handles, uint32_t n,
                                int64_t *released, int64_t *unknown, kiln_status *st) {
  if (released) *released = 0;
  if (unknown) *unknown = 0;
  if (n && handles == NULL)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "%u handles announced, none given", n);
  for (uint32_t i = 0; i < n; i++)
    if (handles[i] == NULL)
      return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "handle %u is NULL", i);
  Kiln__V1__ReleaseBuffersRequest req;
  kiln__v1__release_buffers_request__init(&req);
  req.n_handles = n;
  req.handles = (char **)handles;
  uint8_t *buf, *reply;
  size_t len, reply_len;
  int rc = kiln__pack(&req.base, &buf, &len, st);
  if (rc) return rc;
  rc = kiln__unary(c, KILN__M_RELEASE_BUFFERS, 0, buf, len, &reply, &reply_len, st);
  kiln_free(buf);
  if (rc) return rc;
  ProtobufCMessage *msg;
  rc = kiln__unpack(&kiln__v1__release_buffers_response__descriptor, reply, reply_len, &msg, st);
  kiln_free(reply);
  if (rc) return rc;
  const Kiln__V1__ReleaseBuffersResponse *r = (const Kiln__V1__ReleaseBuffersResponse *)msg;
  if (released) *released = r->released;
  if (unknown) *unknown = (int64_t)r->n_unknown_handles;
  protobuf_c_message_free_unpacked(msg, NULL);
  return 0;
}
