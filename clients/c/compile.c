/* Compile: a program (HLO text, a serialized kiln.v1.Module, or a module in
 * memory) and options in, an executable id and its calling convention out.
 *
 * The program is written into the request as raw bytes of its oneof field
 * after the rest of the request is packed: protobuf messages may be
 * concatenated, so a serialized Module goes out without being decoded and
 * re-encoded, and text goes out byte for byte (an embedded NUL or invalid
 * UTF-8 is the server's to refuse, with INVALID_ARGUMENT, rather than being
 * cut short here).
 */
#include <string.h>

#include "clients/c/client_internal.h"
#include "common/alloc.h"
#include "compiler/ir/proto_codec.h"
#include "compiler/transforms/transform_proto.h"

const char *kiln_remote_source_name(kiln_remote_source s) {
  switch (s) {
  case KILN_REMOTE_SOURCE_COMPILED: return "compiled";
  case KILN_REMOTE_SOURCE_MEMORY: return "memory";
  case KILN_REMOTE_SOURCE_DISK: return "disk";
  case KILN_REMOTE_SOURCE_SHARED: return "shared";
  case KILN_REMOTE_SOURCE_SINGLE_FLIGHT: return "single-flight";
  default: return "unspecified";
  }
}

/* The transforms, as the kiln command would apply them in process: parsed
 * and encoded by the one mapping clients and server share
 * (compiler/transforms/transform_proto.c), vmap sizes inferred from the
 * argument shapes when the caller gave them. */
static int build_transforms(kiln_arena *a, const kiln_remote_compile_options *o,
                            Kiln__V1__CompileOptions *po, kiln_status *st) {
  kiln_status local;
  kiln_status_clear(&local);
  int bad = -1;
  int rc = kiln_transform_specs_to_proto(a, o->transforms, o->ntransforms, o->arg_shapes,
                                         o->narg_shapes, &po->transforms, &bad, &local);
  if (rc == KILN_ENOMEM) return kiln__client_oom(st);
  if (rc && bad >= 0)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "transform '%s': %s",
                             o->transforms[bad] ? o->transforms[bad] : "(null)", local.msg);
  if (rc) return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "%s", local.msg);
  po->n_transforms = o->ntransforms;
  return 0;
}

static int build_options(kiln_arena *a, const kiln_remote_compile_options *o,
                         Kiln__V1__CompileOptions *po, kiln_status *st) {
  kiln__v1__compile_options__init(po);
  po->backend = (char *)(o->backend ? o->backend : "");
  po->target = (char *)(o->target ? o->target : "");
  po->device_count = o->device_count;
  if (o->nmesh_shape) {
    if (o->mesh_shape == NULL)
      return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "mesh_shape is NULL");
    po->mesh_shape = (int64_t *)o->mesh_shape; /* only read while packing */
    po->n_mesh_shape = o->nmesh_shape;
  }
  po->has_optimization_level = o->has_optimization_level;
  po->optimization_level = o->optimization_level;
  po->return_executable = o->return_executable;
  if (o->memory_budget_bytes > INT64_MAX)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "memory_budget_bytes %llu is too large",
                             (unsigned long long)o->memory_budget_bytes);
  po->memory_budget_bytes = (int64_t)o->memory_budget_bytes;
  switch (o->cache_policy) {
  case KILN_REMOTE_CACHE_REFRESH:
    po->cache_policy = KILN__V1__CACHE_POLICY__CACHE_POLICY_REFRESH;
    break;
  case KILN_REMOTE_CACHE_BYPASS:
    po->cache_policy = KILN__V1__CACHE_POLICY__CACHE_POLICY_BYPASS;
    break;
  default: po->cache_policy = KILN__V1__CACHE_POLICY__CACHE_POLICY_DEFAULT; break;
  }
  if (o->ntransforms == 0) return 0;
  return build_transforms(a, o, po, st);
}

static size_t put_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;
  do {
    p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return n;
}

/* The request bytes: options and request id, then the program as field
 * `field` (1: hlo_text, 2: module). */
static int build_request(const kiln_remote_compile_options *o, int field, const uint8_t *program,
                         size_t len, uint8_t **out, size_t *out_len, kiln_status *st) {
  kiln_arena *a = kiln_arena_create();
  if (a == NULL) return kiln__client_oom(st);
  Kiln__V1__CompileRequest req;
  kiln__v1__compile_request__init(&req);
  Kiln__V1__CompileOptions po;
  int rc = build_options(a, o, &po, st);
  if (rc) goto out_free_arena;
  req.options = &po;
  req.request_id = (char *)(o->request_id ? o->request_id : "");
  size_t head = protobuf_c_message_get_packed_size(&req.base);
  uint8_t *buf = kiln_malloc(head + 11 + len);
  if (buf == NULL) {
    rc = kiln__client_oom(st);
    goto out_free_arena;
  }
  size_t n = protobuf_c_message_pack(&req.base, buf);
  buf[n++] = (uint8_t)(field << 3 | 2);
  n += put_varint(buf + n, len);
  if (len) memcpy(buf + n, program, len);
  *out = buf;
  *out_len = n + len;
out_free_arena:
  kiln_arena_destroy(a);
  return rc;
}

static int decode_signature(kiln_remote_executable *e, const Kiln__V1__ProgramSignature *sig,
                            kiln_status *st) {
  if (sig == NULL) {
    e->noutputs = 1;
    return 0;
  }
  if (sig->n_parameters > UINT32_MAX / 2)
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server sent too many parameters");
  e->nparams = (uint32_t)sig->n_parameters;
  if (e->nparams &&
      (e->params = kiln_arena_calloc(e->arena, e->nparams, sizeof *e->params)) == NULL)
    return kiln__client_oom(st);
  for (uint32_t i = 0; i < e->nparams; i++) {
    int rc = kiln__shape_decode(e->arena, sig->parameters[i], "parameter shape", &e->params[i], st);
    if (rc) return rc;
  }
  if (sig->result) {
    int rc = kiln__shape_decode(e->arena, sig->result, "result shape", &e->result, st);
    if (rc) return rc;
  }
  e->noutputs = kiln_shape_is_tuple(&e->result) ? e->result.rank : 1;
  return 0;
}

static int decode_response(const Kiln__V1__CompileResponse *r, kiln_remote_executable **out,
                           kiln_status *st) {
  if (r->executable_id == NULL || r->executable_id[0] == '\0')
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS,
                             "the server's Compile reply has no executable_id");
  kiln_remote_executable *e = kiln_calloc(1, sizeof *e);
  if (e == NULL || (e->arena = kiln_arena_create()) == NULL) {
    kiln_free(e);
    return kiln__client_oom(st);
  }
  int rc = decode_signature(e, r->signature, st);
  if (rc) goto out_free;
  e->id = kiln_arena_strdup(e->arena, r->executable_id);
  e->cache_key = kiln_arena_strdup(e->arena, r->cache_key ? r->cache_key : "");
  if (e->id == NULL || e->cache_key == NULL) goto out_oom;
  e->cache_source = (kiln_remote_source)r->cache_source;
  if ((rc = kiln__key_components_decode(e->arena, r->key_components, r->n_key_components,
                                        &e->key_components, &e->nkey_components, st)))
    goto out_free;
  e->compile_wall_ns = r->compile_wall_ns;
  e->peak_bytes = r->peak_bytes;
  e->device_count = r->device_count;
  e->per_device = r->per_device;
  e->replica_count = r->replica_count;
  e->num_partitions = r->num_partitions;
  if (r->n_warnings) {
    e->warnings = kiln_arena_calloc(e->arena, r->n_warnings, sizeof *e->warnings);
    if (e->warnings == NULL) goto out_oom;
    for (size_t i = 0; i < r->n_warnings; i++)
      if ((e->warnings[i] = kiln_arena_strdup(e->arena, r->warnings[i])) == NULL) goto out_oom;
    e->nwarnings = (uint32_t)r->n_warnings;
  }
  if (r->serialized_executable.len) {
    e->serialized =
        kiln_arena_memdup(e->arena, r->serialized_executable.data, r->serialized_executable.len);
    if (e->serialized == NULL) goto out_oom;
    e->serialized_len = r->serialized_executable.len;
  }
  *out = e;
  return 0;
out_oom:
  rc = kiln__client_oom(st);
out_free:
  kiln_remote_executable_free(e);
  return rc;
}

const char *kiln_remote_phase_name(kiln_remote_phase p) {
  switch (p) {
  case KILN_REMOTE_PHASE_QUEUED: return "queued";
  case KILN_REMOTE_PHASE_LOADING: return "loading";
  case KILN_REMOTE_PHASE_WAITING: return "waiting";
  case KILN_REMOTE_PHASE_PASSES: return "passes";
  case KILN_REMOTE_PHASE_CC: return "cc";
  case KILN_REMOTE_PHASE_STORING: return "storing";
  case KILN_REMOTE_PHASE_DONE: return "done";
  default: return "unspecified";
  }
}

/* CompileStream: each message is a phase, told to the caller; the last
 * carries the result, left in *out (free with
 * protobuf_c_message_free_unpacked). */
static int receive_progress(kiln__call *k, const kiln_remote_compile_options *o,
                            ProtobufCMessage **out, uint32_t *nmsgs, kiln_status *st) {
  int rc = 0;
  for (;; (*nmsgs)++) {
    grpc_byte_buffer *bb = NULL;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    if (!kiln__call_batch(k, &op, 1) || bb == NULL) return rc;
    ProtobufCMessage *msg;
    rc = kiln__unpack_buffer(&kiln__v1__compile_progress__descriptor, bb, &msg, st);
    grpc_byte_buffer_destroy(bb);
    if (rc) return rc;
    const Kiln__V1__CompileProgress *p = (const Kiln__V1__CompileProgress *)msg;
    kiln_remote_progress rp = {.phase = (kiln_remote_phase)p->phase,
                               .elapsed_ns = p->elapsed_ns,
                               .detail = p->detail ? p->detail : ""};
    if (p->result && *out == NULL) {
      /* The result outlives the message around it. */
      *out = &p->result->base;
      ((Kiln__V1__CompileProgress *)msg)->result = NULL;
    }
    o->progress.fn(o->progress.arg, &rp);
    protobuf_c_message_free_unpacked(msg, NULL);
  }
}

/* *old_server: the server answered UNIMPLEMENTED before any phase (it has
 * no CompileStream): the caller asks Compile instead. */
static int compile_stream(kiln_client *c, const kiln_remote_compile_options *o, const uint8_t *req,
                          size_t len, ProtobufCMessage **out, bool *old_server, kiln_status *st) {
  *out = NULL;
  *old_server = false;
  uint32_t nmsgs = 0;
  kiln_status local;
  kiln_status_clear(&local);
  grpc_byte_buffer *send = kiln__bytes_to_buffer(req, len);
  if (send == NULL) return kiln__client_oom(st);
  kiln__call k;
  int rc = kiln__call_start(c, KILN__M_COMPILE_STREAM, o->deadline_ms, &k, st);
  if (rc) {
    grpc_byte_buffer_destroy(send);
    return rc;
  }
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = k.nmd;
  ops[0].data.send_initial_metadata.metadata = k.md;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &k.initial_md;
  bool ok = kiln__call_batch(&k, ops, 4);
  grpc_byte_buffer_destroy(send);
  if (ok && (rc = receive_progress(&k, o, out, &nmsgs, st))) {
    kiln__call_abandon(&k);
  } else {
    rc = kiln__call_finish(&k, &local);
    if (rc && nmsgs == 0 && kiln_rpc_status_code(&local) == KILN_RPC_UNIMPLEMENTED) {
      *old_server = true;
      return rc;
    }
    if (rc && st && st->code == 0) *st = local;
    if (rc == 0 && *out == NULL)
      rc = kiln__client_fail(st, KILN_RPC_DATA_LOSS, "CompileStream ended without a result");
  }
  if (rc && *out) {
    protobuf_c_message_free_unpacked(*out, NULL);
    *out = NULL;
  }
  return rc;
}

static int compile(kiln_client *c, int field, const uint8_t *program, size_t len,
                   const kiln_remote_compile_options *opts, kiln_remote_executable **out,
                   kiln_status *st) {
  *out = NULL;
  kiln_remote_compile_options o = {0};
  if (opts) o = *opts;
  uint8_t *req = NULL, *reply = NULL;
  size_t req_len = 0, reply_len = 0;
  int rc = build_request(&o, field, program, len, &req, &req_len, st);
  if (rc) return rc;
  ProtobufCMessage *msg;
  bool old_server = false;
  if (o.progress.fn) rc = compile_stream(c, &o, req, req_len, &msg, &old_server, st);
  if (o.progress.fn && !old_server) {
    kiln_free(req);
    if (rc) return rc;
  } else {
    rc = kiln__unary(c, KILN__M_COMPILE, o.deadline_ms, req, req_len, &reply, &reply_len, st);
    kiln_free(req);
    if (rc) return rc;
    rc = kiln__unpack(&kiln__v1__compile_response__descriptor, reply, reply_len, &msg, st);
    kiln_free(reply);
    if (rc) return rc;
  }
  rc = decode_response((const Kiln__V1__CompileResponse *)msg, out, st);
  protobuf_c_message_free_unpacked(msg, NULL);
  return rc;
}

int kiln_client_compile_text(kiln_client *c, const char *text, size_t len,
                             const kiln_remote_compile_options *opts, kiln_remote_executable **out,
                             kiln_status *st) {
  return compile(c, 1, (const uint8_t *)text, len, opts, out, st);
}

int kiln_client_compile_proto(kiln_client *c, const uint8_t *module, size_t len,
                              const kiln_remote_compile_options *opts, kiln_remote_executable **out,
                              kiln_status *st) {
  return compile(c, 2, module, len, opts, out, st);
}

int kiln_client_compile_module(kiln_client *c, const kiln_module *m,
                               const kiln_remote_compile_options *opts,
                               kiln_remote_executable **out, kiln_status *st) {
  *out = NULL;
  uint8_t *buf;
  size_t len;
  kiln_status local;
  kiln_status_clear(&local);
  int rc = kiln_module_to_proto(m, &buf, &len, &local);
  if (rc == KILN_ENOMEM) return kiln__client_oom(st);
  if (rc)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "cannot encode the module: %s%s%s",
                             local.where, local.where[0] ? ": " : "", local.msg);
  rc = compile(c, 2, buf, len, opts, out, st);
  kiln_free(buf);
  return rc;
}

void kiln_remote_executable_free(kiln_remote_executable *e) {
  if (e == NULL) return;
  kiln_arena_destroy(e->arena);
  kiln_free(e);
}
