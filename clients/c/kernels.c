/* RegisterKernel from a client: a C kernel sent to the server under a
 * name (compiler/codegen/user_kernel.h on the server says what it must
 * be). The server checks everything; here only what cannot be sent. */
#include <stdio.h>
#include <string.h>

#include "clients/c/client_internal.h"
#include "common/alloc.h"

int kiln_client_register_kernel(kiln_client *c, const char *name, const char *source,
                                const char *signature, const char *cuda_source,
                                kiln_remote_kernel *out, kiln_status *st) {
  if (out) memset(out, 0, sizeof *out);
  if (name == NULL || source == NULL || signature == NULL)
    return kiln__client_fail(st, KILN_RPC_INVALID_ARGUMENT,
                             "register_kernel: name, source and signature are required");
  Kiln__V1__RegisterKernelRequest req;
  kiln__v1__register_kernel_request__init(&req);
  req.name = (char *)name;
  req.source = (char *)source;
  req.signature = (char *)signature;
  if (cuda_source) req.cuda_source = (char *)cuda_source;
  uint8_t *buf, *reply;
  size_t len, reply_len;
  int rc = kiln__pack(&req.base, &buf, &len, st);
  if (rc) return rc;
  rc = kiln__unary(c, KILN__M_REGISTER_KERNEL, 0, buf, len, &reply, &reply_len, st);
  kiln_free(buf);
  if (rc) return rc;
  ProtobufCMessage *msg;
  rc = kiln__unpack(&kiln__v1__register_kernel_response__descriptor, reply, reply_len, &msg, st);
  kiln_free(reply);
  if (rc) return rc;
  const Kiln__V1__RegisterKernelResponse *r = (const Kiln__V1__RegisterKernelResponse *)msg;
  if (out) {
    snprintf(out->digest, sizeof out->digest, "%s", r->digest ? r->digest : "");
    out->cached = r->cached;
    snprintf(out->cuda_check, sizeof out->cuda_check, "%s", r->cuda_check ? r->cuda_check : "");
  }
  protobuf_c_message_free_unpacked(msg, NULL);
  return 0;
}
