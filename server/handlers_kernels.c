/* RegisterKernel: a client's C kernel compiled and kept for its programs'
 * custom calls of kiln.user.NAME (compiler/codegen/user_kernel.h).
 *
 * It runs the caller's code inside kilnd, so it is off unless the server
 * was started with --allow-user-kernels, and with tokens on it is for
 * admins (rpc_table.c). The cheap checks (on, name, sizes) run on the
 * completion-queue thread; the C compiler runs on the compile pool, under
 * --user-kernel-timeout and the compile queue's bound, like a Compile.
 * Every registration leaves an audit line with the digest of the source.
 */
#include <stdio.h>
#include <string.h>

#include "compiler/codegen/user_kernel.h"
#include "kiln/v1/kiln.pb-c.h"
#include "server/log.h"
#include "server/server.h"

static size_t object_limit(const kilnd_config *cfg) {
  uint64_t n = cfg->user_kernel_max_bytes * 16;
  return n < KILN_USER_KERNEL_OBJECT_MAX ? KILN_USER_KERNEL_OBJECT_MAX : (size_t)n;
}

static int check(kilnd *srv, const Kiln__V1__RegisterKernelRequest *r, kiln_status *st) {
  if (srv->user_kernels == NULL)
    return kiln_status_set(st, KILND_EPERM, "RegisterKernel",
                           "user kernels are off on this server (start kilnd with "
                           "--allow-user-kernels: they run the caller's C code in the server)");
  if (!kiln_user_kernel_name_ok(r->name))
    return kiln_status_set(st, KILN_EINVAL, "name",
                           "a kernel name is 1 to %d letters, digits and '_', starting with a "
                           "letter",
                           KILN_USER_KERNEL_NAME_MAX);
  size_t max = (size_t)srv->cfg.user_kernel_max_bytes;
  if (strlen(r->source) > max || strlen(r->cuda_source) > max)
    return kiln_status_set(
        st, KILN_ELIMIT, "source", "%zu bytes, over the limit of %zu (--user-kernel-max-bytes)",
        strlen(r->source) > max ? strlen(r->source) : strlen(r->cuda_source), max);
  kiln_user_kernel_sig sig;
  return kiln_user_kernel_sig_parse(r->signature, &sig, st);
}

void kilnd_handle_register_kernel(kilnd_call *c, ProtobufCMessage *req) {
  kiln_status st;
  kiln_status_clear(&st);
  int rc = check(c->srv, (const Kiln__V1__RegisterKernelRequest *)req, &st);
  if (rc) {
    kilnd_log_rec lr;
    kilnd_log_audit(&lr, c, "register_kernel");
    kilnd_log_str(&lr, "code", kilnd_log_code_name((int)kilnd_status_code(rc)));
    kilnd_log_str(&lr, "reason", st.msg);
    kilnd_log_end(&lr);
    kilnd_call_finish(c, NULL, rc, &st);
    return;
  }
  kilnd_compile_submit(c);
}

void kilnd_kernel_work(kilnd_call *c) {
  const Kiln__V1__RegisterKernelRequest *r = (const Kiln__V1__RegisterKernelRequest *)c->req;
  kilnd *srv = c->srv;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_user_kernel_options o = {.timeout_s = kilnd_call_time_left(c, srv->cfg.user_kernel_timeout),
                                .max_source = (size_t)srv->cfg.user_kernel_max_bytes,
                                .max_object = object_limit(&srv->cfg),
                                .check_link = true};
  const kiln_user_kernel *k = NULL;
  bool cached = false;
  char cuda[KILN_STATUS_MSG_MAX + 16] = "";
  int rc = 0;
  if (r->cuda_source[0])
    rc = kiln_user_kernel_cuda_check(r->cuda_source, strlen(r->cuda_source), NULL, o.timeout_s,
                                     cuda, sizeof cuda, &st);
  if (rc == 0)
    rc = kiln_user_kernels_register(srv->user_kernels, r->name, r->source, strlen(r->source),
                                    r->signature, &o, &k, &cached, &st);
  kilnd_log_rec lr;
  kilnd_log_audit(&lr, c, "register_kernel");
  kilnd_log_str(&lr, "name", r->name);
  kilnd_log_str(&lr, "digest", k ? k->digest : "");
  kilnd_log_int(&lr, "bytes", (int64_t)strlen(r->source));
  kilnd_log_str(&lr, "code", rc ? kilnd_log_code_name((int)kilnd_status_code(rc)) : "OK");
  kilnd_log_end(&lr);
  if (rc) {
    kilnd_call_finish(c, NULL, rc, &st);
    return;
  }
  Kiln__V1__RegisterKernelResponse resp = KILN__V1__REGISTER_KERNEL_RESPONSE__INIT;
  resp.digest = (char *)k->digest;
  resp.cached = cached;
  resp.cuda_check = cuda;
  kilnd_call_finish(c, &resp.base, 0, NULL);
}
