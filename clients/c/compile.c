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
#include "compiler/transforms/transform.h"

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

/* vmap axes: KILN_AXIS_NONE is "not mapped". */
static int put_axes(kiln_arena *a, const int64_t *axes, uint32_t n, Kiln__V1__VmapAxis ***out,
                    size_t *nout) {
  *nout = 0;
  if (n == 0) return 0;
  *out = kiln_arena_calloc(a, n, sizeof **out);
  if (*out == NULL) return KILN_ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    Kiln__V1__VmapAxis *ax = kiln_arena_alloc(a, sizeof *ax);
    if (ax == NULL) return KILN_ENOMEM;
    kiln__v1__vmap_axis__init(ax);
    ax->not_mapped = axes[i] == KILN_AXIS_NONE;
    ax->axis = ax->not_mapped ? 0 : axes[i];
    (*out)[i] = ax;
  }
  *nout = n;
  return 0;
}

#define NEW_MSG(a, T, init_fn, out) \
  do { \
    (out) = kiln_arena_alloc((a), sizeof(T)); \
    if ((out) == NULL) return KILN_ENOMEM; \
    init_fn(out); \
  } while (0)

/* A parsed transform spec as a kiln.v1.Transform. */
static int encode_transform(kiln_arena *a, const kiln_transform *t, Kiln__V1__Transform *pt) {
  switch (t->kind) {
  case KILN_TRANSFORM_GRAD:
    NEW_MSG(a, Kiln__V1__GradTransform, kiln__v1__grad_transform__init, pt->grad);
    pt->kind_case = KILN__V1__TRANSFORM__KIND_GRAD;
    pt->grad->n_wrt = t->nwrt;
    pt->grad->wrt = t->nwrt ? (int64_t *)t->wrt : NULL;
    return 0;
  case KILN_TRANSFORM_VJP:
    NEW_MSG(a, Kiln__V1__VjpTransform, kiln__v1__vjp_transform__init, pt->vjp);
    pt->kind_case = KILN__V1__TRANSFORM__KIND_VJP;
    pt->vjp->n_wrt = t->nwrt;
    pt->vjp->wrt = t->nwrt ? (int64_t *)t->wrt : NULL;
    return 0;
  case KILN_TRANSFORM_JVP:
    NEW_MSG(a, Kiln__V1__JvpTransform, kiln__v1__jvp_transform__init, pt->jvp);
    pt->kind_case = KILN__V1__TRANSFORM__KIND_JVP;
    pt->jvp->n_wrt = t->nwrt;
    pt->jvp->wrt = t->nwrt ? (int64_t *)t->wrt : NULL;
    return 0;
  case KILN_TRANSFORM_VMAP:
    NEW_MSG(a, Kiln__V1__VmapTransform, kiln__v1__vmap_transform__init, pt->vmap);
    pt->kind_case = KILN__V1__TRANSFORM__KIND_VMAP;
    pt->vmap->axis_size = t->axis_size;
    if (put_axes(a, t->in_axes, t->nin_axes, &pt->vmap->in_axes, &pt->vmap->n_in_axes) ||
        put_axes(a, t->out_axes, t->nout_axes, &pt->vmap->out_axes, &pt->vmap->n_out_axes))
      return KILN_ENOMEM;
    return 0;
  case KILN_TRANSFORM_CHECKPOINT:
    NEW_MSG(a, Kiln__V1__CheckpointTransform, kiln__v1__checkpoint_transform__init, pt->checkpoint);
    pt->kind_case = KILN__V1__TRANSFORM__KIND_CHECKPOINT;
    return 0;
  }
  return KILN_EINVAL;
}

/* One transform spec ("grad", "grad:wrt=0,1", "vmap:in_axes=0,none"), as
 * kiln_transform_parse reads it. */
static int build_transform(kiln_arena *a, const char *spec, Kiln__V1__Transform **out,
                           kiln_status *st) {
  kiln_transform *t = kiln_arena_alloc(a, sizeof *t);
  Kiln__V1__Transform *pt = kiln_arena_alloc(a, sizeof *pt);
  if (t == NULL || pt == NULL) return kiln__client_oom(st);
  kiln__v1__transform__init(pt);
  kiln_status local;
  kiln_status_clear(&local);
  if (spec == NULL || kiln_transform_parse(spec, t, &local))
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "transform '%s': %s",
                             spec ? spec : "(null)", spec ? local.msg : "no spec given");
  if (t->output >= 0)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT,
                             "transform '%s': output= has no kiln.v1 form; the server "
                             "differentiates output 0 (grad) or all outputs (vjp)",
                             spec);
  if (encode_transform(a, t, pt)) return kiln__client_oom(st);
  *out = pt;
  return 0;
}

static int build_options(kiln_arena *a, const kiln_remote_compile_options *o,
                         Kiln__V1__CompileOptions *po, kiln_status *st) {
  kiln__v1__compile_options__init(po);
  po->backend = (char *)(o->backend ? o->backend : "");
  po->target = (char *)(o->target ? o->target : "");
  po->device_count = o->device_count;
  po->has_optimization_level = o->has_optimization_level;
  po->optimization_level = o->optimization_level;
  po->return_executable = o->return_executable;
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
  po->transforms = kiln_arena_calloc(a, o->ntransforms, sizeof *po->transforms);
  if (po->transforms == NULL) return kiln__client_oom(st);
  po->n_transforms = o->ntransforms;
  for (uint32_t i = 0; i < o->ntransforms; i++) {
    int rc = build_transform(a, o->transforms[i], &po->transforms[i], st);
    if (rc) return rc;
  }
  return 0;
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
  rc = kiln__unary(c, KILN__M_COMPILE, o.deadline_ms, req, req_len, &reply, &reply_len, st);
  kiln_free(req);
  if (rc) return rc;
  ProtobufCMessage *msg;
  rc = kiln__unpack(&kiln__v1__compile_response__descriptor, reply, reply_len, &msg, st);
  kiln_free(reply);
  if (rc) return rc;
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
