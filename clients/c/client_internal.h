/* Internals shared by libkiln's files: the connection, one call's life on
 * the gRPC core, and the message <-> value helpers.
 *
 * client.c owns the gRPC side: a kiln__call is one RPC with its own pluck
 * completion queue, so any thread may run calls on a shared client without
 * coordination. The other files build request messages with protobuf-c,
 * hand bytes to the call helpers and turn replies into libkiln's types.
 */
#ifndef KILN_CLIENTS_C_CLIENT_INTERNAL_H
#define KILN_CLIENTS_C_CLIENT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "clients/c/kiln.h"
#include "kiln/v1/kiln.pb-c.h"

/* The methods, in the order of kiln__method_paths. */
typedef enum kiln__method {
  KILN__M_COMPILE,
  KILN__M_EXECUTE,
  KILN__M_PUT_BUFFER,
  KILN__M_GET_BUFFER,
  KILN__M_RELEASE_BUFFERS,
  KILN__M_STATS,
  KILN__M_HEALTH_CHECK,
  KILN__M_CACHE_LIST,
  KILN__M_CACHE_EVICT,
  KILN__M_COMPILE_STREAM,
  KILN__M_CACHE_EXPORT,
  KILN__M_CACHE_IMPORT,
  KILN__M_REGISTER_KERNEL,
  KILN__M_COUNT
} kiln__method;

struct kiln_client {
  grpc_channel *channel;
  void *registered[KILN__M_COUNT]; /* grpc_channel_register_call handles */
  char *target;
  char *client_id;
  char *authorization; /* "Bearer TOKEN", or NULL */
  int64_t deadline_ms; /* resolved: > 0, or < 0 for none */
  int64_t max_receive_bytes;
  int64_t chunk_bytes;
  /* lease keep-alive (lease.c) */
  _Atomic int64_t last_call_ms; /* monotonic ms when the last call started */
  int64_t keepalive_ms;         /* 0: no keeper thread */
  struct kiln__keeper *keeper;  /* the thread renewing the lease, or NULL */
};

/* Monotonic milliseconds. */
int64_t kiln__now_ms(void);
/* Starts the keep-alive thread of c (c->keepalive_ms > 0); stops it. */
int kiln__keeper_start(kiln_client *c, kiln_status *st);
void kiln__keeper_stop(kiln_client *c);

/* One RPC in flight. Fields are the gRPC core's receive slots. */
typedef struct kiln__call {
  kiln_client *client;
  kiln__method method;
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_metadata md[2]; /* kiln-client, authorization */
  size_t nmd;
  grpc_metadata_array initial_md, trailing_md;
  grpc_status_code status;
  grpc_slice details;
  const char *error_string;
  bool status_received; /* the status came with the last batch */
  bool status_pending;  /* a batch receiving the status is running */
} kiln__call;

/* Starts a call: deadline_ms 0 means the client's default, negative none. */
int kiln__call_start(kiln_client *c, kiln__method m, int64_t deadline_ms, kiln__call *k,
                     kiln_status *st);
/* Runs a batch and waits for it; returns the batch's success flag. */
bool kiln__call_batch(kiln__call *k, const grpc_op *ops, size_t nops);
/* Starts receiving the final status (and the reply into *reply, unless
 * NULL) without waiting for it; kiln__call_finish collects it. */
bool kiln__call_recv_start(kiln__call *k, grpc_byte_buffer **reply);
/* Waits for the final status (unless already received), maps it onto st and
 * the return code, and frees the call. */
int kiln__call_finish(kiln__call *k, kiln_status *st);
/* Frees the call without looking at its status (cancels it if running). */
void kiln__call_abandon(kiln__call *k);

/* A unary call: sends req (len bytes) and returns the reply's bytes in
 * *reply (kiln_malloc'd; free with kiln_free). */
int kiln__unary(kiln_client *c, kiln__method m, int64_t deadline_ms, const uint8_t *req, size_t len,
                uint8_t **reply, size_t *reply_len, kiln_status *st);

/* The same with the request and the reply as byte buffers: `send` stays
 * the caller's; *reply is set on success (destroy it). */
int kiln__unary_buffer(kiln_client *c, kiln__method m, int64_t deadline_ms, grpc_byte_buffer *send,
                       grpc_byte_buffer **reply, kiln_status *st);
/* A byte buffer holding the packed message (packed once, into the slice
 * gRPC sends). NULL on out-of-memory. */
grpc_byte_buffer *kiln__pack_buffer(const ProtobufCMessage *msg);
/* kiln__unpack of a received byte buffer, in place when it is one slice. */
int kiln__unpack_buffer(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb,
                        ProtobufCMessage **out, kiln_status *st);

/* A byte buffer holding a copy of buf. NULL on out-of-memory. */
grpc_byte_buffer *kiln__bytes_to_buffer(const uint8_t *buf, size_t len);
/* The contents of a received byte buffer (kiln_malloc'd). */
int kiln__buffer_to_bytes(grpc_byte_buffer *bb, uint8_t **out, size_t *len, kiln_status *st);

/* Unpacks a reply after checking its wire form; free with
 * protobuf_c_message_free_unpacked(msg, NULL). A reply that does not
 * decode is DATA_LOSS. */
int kiln__unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                 ProtobufCMessage **out, kiln_status *st);
/* Packs a message into a kiln_malloc'd buffer. */
int kiln__pack(const ProtobufCMessage *msg, uint8_t **out, size_t *len, kiln_status *st);

/* Records an error with a gRPC code name as where; returns the KILN_E* code
 * that gRPC code maps to (KILN_ENOMEM for RESOURCE_EXHAUSTED when `oom`). */
int kiln__client_fail(kiln_status *st, kiln_rpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int kiln__client_oom(kiln_status *st);
int kiln__rpc_errno(kiln_rpc_code code);

/* ---- values (wire.c) ------------------------------------------------------------ */

/* Encodes a shape / literal as protobuf-c messages allocated in `a`; the
 * literal's data is referenced, not copied. */
int kiln__shape_encode(kiln_arena *a, const kiln_shape *s, Kiln__V1__Shape **out);
int kiln__literal_encode(kiln_arena *a, const kiln_literal *lit, Kiln__V1__Literal **out);
/* Decodes a shape from the server into `a`; errors are DATA_LOSS naming
 * `what`. */
int kiln__shape_decode(kiln_arena *a, const Kiln__V1__Shape *ps, const char *what, kiln_shape *out,
                       kiln_status *st);
/* Decodes a literal from the server as a new heap literal. */
int kiln__literal_decode(const Kiln__V1__Literal *pl, const char *what, kiln_literal **out,
                         kiln_status *st);
/* Copies key components from the server into `a` (cache.c). */
int kiln__key_components_decode(kiln_arena *a, Kiln__V1__KeyComponent *const *v, size_t n,
                                kiln_remote_key_component **out, uint32_t *nout, kiln_status *st);
/* Fills b from a BufferInfo message. */
int kiln__remote_buffer_decode(const Kiln__V1__BufferInfo *pi, kiln_remote_buffer *b,
                               kiln_status *st);

#endif /* KILN_CLIENTS_C_CLIENT_INTERNAL_H */
