/* Execute: one run of a compiled executable, arguments inline or by handle,
 * outputs inline or kept on the server.
 *
 * Arguments are checked here only for what would make the request
 * meaningless (an argument with neither a literal nor a handle, donation of
 * an inline value); whether they match the executable is the server's
 * judgement, which comes back as INVALID_ARGUMENT naming the parameter.
 *
 * A call costs little besides gRPC's own work: the request is built in the
 * calling thread's spare arena (kept between calls: a fresh arena is a
 * 64 KiB block per call), packed once into the slice gRPC sends, and the
 * reply is unpacked from the slice it arrived in.
 */
#include <pthread.h>
#include <string.h>

#include "clients/c/client_internal.h"
#include "common/alloc.h"

static int build_request(kiln_arena *a, const char *id, const kiln_remote_arg *args, uint32_t nargs,
                         const kiln_remote_execute_options *o, Kiln__V1__ExecuteRequest *req,
                         kiln_status *st) {
  kiln__v1__execute_request__init(req);
  req->executable_id = (char *)id;
  req->request_id = (char *)(o->request_id ? o->request_id : "");
  if (nargs) {
    req->arguments = kiln_arena_calloc(a, nargs, sizeof *req->arguments);
    if (req->arguments == NULL) return kiln__client_oom(st);
    req->n_arguments = nargs;
  }
  for (uint32_t i = 0; i < nargs; i++) {
    Kiln__V1__Argument *pa = kiln_arena_alloc(a, sizeof *pa);
    if (pa == NULL) return kiln__client_oom(st);
    kiln__v1__argument__init(pa);
    req->arguments[i] = pa;
    if (args[i].literal) {
      if (args[i].donate)
        return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT,
                                 "argument %u: only a buffer handle can be donated", i);
      int rc = kiln__literal_encode(a, args[i].literal, &pa->literal);
      if (rc == KILN_ELIMIT)
        return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT,
                                 "argument %u: tuple nested too deep", i);
      if (rc) return kiln__client_oom(st);
      pa->value_case = KILN__V1__ARGUMENT__VALUE_LITERAL;
    } else if (args[i].handle && args[i].handle[0]) {
      pa->buffer_handle = (char *)args[i].handle;
      pa->value_case = KILN__V1__ARGUMENT__VALUE_BUFFER_HANDLE;
      pa->donate = args[i].donate;
    } else {
      return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT,
                               "argument %u has neither a literal nor a buffer handle", i);
    }
  }
  if (o->nkeep) {
    req->keep_on_server = kiln_arena_calloc(a, o->nkeep, sizeof *req->keep_on_server);
    if (req->keep_on_server == NULL) return kiln__client_oom(st);
    req->n_keep_on_server = o->nkeep;
    for (uint32_t i = 0; i < o->nkeep; i++) req->keep_on_server[i] = o->keep_on_server[i];
  }
  if (o->ndevice_ids) {
    if (o->device_ids == NULL)
      return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "device_ids is NULL");
    req->device_ids = (int32_t *)o->device_ids; /* only read while packing */
    req->n_device_ids = o->ndevice_ids;
  }
  return 0;
}

static int decode_response(const Kiln__V1__ExecuteResponse *r, kiln_remote_result *out,
                           kiln_status *st) {
  if (r->n_outputs > UINT32_MAX / 2)
    return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server sent too many outputs");
  if (r->n_outputs) {
    out->outputs = kiln_calloc(r->n_outputs, sizeof *out->outputs);
    if (out->outputs == NULL) return kiln__client_oom(st);
  }
  for (size_t i = 0; i < r->n_outputs; i++) {
    const Kiln__V1__Output *po = r->outputs[i];
    int rc;
    out->noutputs = (uint32_t)i + 1;
    if (po->value_case == KILN__V1__OUTPUT__VALUE_LITERAL)
      rc = kiln__literal_decode(po->literal, "outputs", &out->outputs[i].literal, st);
    else if (po->value_case == KILN__V1__OUTPUT__VALUE_BUFFER)
      rc = kiln__remote_buffer_decode(po->buffer, &out->outputs[i].buffer, st);
    else
      rc = kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server sent output %zu without a value",
                             i);
    if (rc) return rc;
  }
  if (r->n_device_ids && r->n_device_ids <= 4096) {
    out->device_ids = kiln_calloc(r->n_device_ids, sizeof *out->device_ids);
    if (out->device_ids == NULL) return kiln__client_oom(st);
    memcpy(out->device_ids, r->device_ids, r->n_device_ids * sizeof *out->device_ids);
    out->ndevice_ids = (uint32_t)r->n_device_ids;
  }
  if (r->timing) {
    out->queue_ns = r->timing->queue_ns;
    out->transfer_in_ns = r->timing->transfer_in_ns;
    out->run_ns = r->timing->run_ns;
    out->transfer_out_ns = r->timing->transfer_out_ns;
    out->total_ns = r->timing->total_ns;
  }
  return 0;
}

/* Each thread's spare arena for building requests, freed when the thread
 * ends. */
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static bool spare_ok;

static void spare_destroy(void *a) { kiln_arena_destroy(a); }

static void spare_init(void) { spare_ok = pthread_key_create(&spare_key, spare_destroy) == 0; }

/* Takes the thread's spare arena (or a new one); give it back with
 * arena_put. */
static kiln_arena *arena_get(void) {
  pthread_once(&spare_once, spare_init);
  kiln_arena *a = spare_ok ? pthread_getspecific(spare_key) : NULL;
  if (a) {
    pthread_setspecific(spare_key, NULL);
    return a;
  }
  return kiln_arena_create();
}

static void arena_put(kiln_arena *a) {
  if (spare_ok && pthread_getspecific(spare_key) == NULL) {
    kiln_arena_reset(a);
    if (pthread_setspecific(spare_key, a) == 0) return;
  }
  kiln_arena_destroy(a);
}

int kiln_client_execute(kiln_client *c, const char *id, const kiln_remote_arg *args, uint32_t nargs,
                        const kiln_remote_execute_options *opts, kiln_remote_result *out,
                        kiln_status *st) {
  memset(out, 0, sizeof *out);
  if (id == NULL || id[0] == '\0')
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "no executable id given");
  if (nargs && args == NULL)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT, "%u arguments announced, none given",
                             nargs);
  kiln_remote_execute_options o = {0};
  if (opts) o = *opts;
  kiln_arena *a = arena_get();
  if (a == NULL) return kiln__client_oom(st);
  Kiln__V1__ExecuteRequest req;
  grpc_byte_buffer *send = NULL, *reply = NULL;
  int rc = build_request(a, id, args, nargs, &o, &req, st);
  if (rc == 0 && (send = kiln__pack_buffer(&req.base)) == NULL) rc = kiln__client_oom(st);
  arena_put(a);
  if (rc) return rc;
  rc = kiln__unary_buffer(c, KILN__M_EXECUTE, o.deadline_ms, send, &reply, st);
  grpc_byte_buffer_destroy(send);
  if (rc) return rc;
  ProtobufCMessage *msg;
  rc = kiln__unpack_buffer(&kiln__v1__execute_response__descriptor, reply, &msg, st);
  grpc_byte_buffer_destroy(reply);
  if (rc) return rc;
  rc = decode_response((const Kiln__V1__ExecuteResponse *)msg, out, st);
  protobuf_c_message_free_unpacked(msg, NULL);
  if (rc) kiln_remote_result_free(out);
  return rc;
}

void kiln_remote_result_free(kiln_remote_result *r) {
  if (r == NULL) return;
  for (uint32_t i = 0; i < r->noutputs; i++) {
    kiln_literal_destroy(r->outputs[i].literal);
    kiln_remote_buffer_clear(&r->outputs[i].buffer);
  }
  kiln_free(r->outputs);
  kiln_free(r->device_ids);
  memset(r, 0, sizeof *r);
}
