/* kilnd in process (see kilnd_inproc.h).
 *
 * server/main.c is compiled here with its main renamed, so that start-up
 * and tear-down are main's own static functions, not a copy that could
 * drift from them. The client side uses only the gRPC core and libc
 * malloc, never the kiln allocation hook, so that a test failing the n-th
 * kiln allocation fails one of the server's. The channel runs over a
 * socket pair whose other end the server adopts as an accepted connection.
 */
#define main kilnd_program_main
#include "server/main.c"
#undef main

#include <errno.h>
#include <sys/socket.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_posix.h>

#include "tests/server/kilnd_inproc.h"

#define MAX_THREADS 16

struct kilnd_inproc {
  kilnd srv;
  pthread_t cq[MAX_THREADS];
  uint32_t ncq;
  pthread_t loop;
  bool loop_started;
  grpc_channel *channel;
};

static void *loop_thread(void *arg) {
  kilnd_loop_run(arg);
  return NULL;
}

int kilnd_inproc_start(const char *const *args, kilnd_inproc **out, kiln_status *st) {
  *out = NULL;
  const char *argv[64] = {"kilnd",         "--listen", "127.0.0.1:0", "--metrics-listen", "off",
                          "--drain-grace", "0"};
  int argc = 7;
  for (; args && *args && argc < 63; args++) argv[argc++] = *args;
  argv[argc] = NULL;
  kilnd_inproc *k = calloc(1, sizeof *k);
  if (k == NULL) return kiln_status_set(st, KILN_ENOMEM, "inproc", "out of memory");
  kilnd *srv = &k->srv;
  char *noenv[] = {NULL};
  kilnd_config_action action;
  int rc = kilnd_config_load(&srv->cfg, argc, (char **)argv, noenv, &action, st);
  if (rc == 0 && action != KILND_CONFIG_RUN)
    rc = kiln_status_set(st, KILN_EINVAL, "inproc", "flags asked for help or version");
  if (rc) {
    kilnd_config_free(&srv->cfg);
    free(k);
    return rc;
  }
  char pool[16];
  snprintf(pool, sizeof pool, "%llu", (unsigned long long)srv->cfg.compile_threads);
  setenv("UV_THREADPOOL_SIZE", pool, 1);
  signal(SIGPIPE, SIG_IGN);
  srv->start_ns = kiln_sched_now_ns();
  srv->shutdown_tag.fn = on_shutdown;
  kilnd_sha256_init();
  grpc_init();
  rc = start_parts(srv, st);
  if (rc == 0) rc = start_grpc(srv, st);
  if (rc == 0) {
    const kilnd_method *m = kilnd_methods();
    for (int i = 0; i < KILND_M_COUNT; i++)
      for (int n = 0; n < 8; n++) kilnd_call_request(srv, &m[i]);
    for (int n = 0; n < 2; n++) kilnd_call_request(srv, NULL);
    for (; k->ncq < srv->cfg.cq_threads && k->ncq < MAX_THREADS; k->ncq++)
      if (pthread_create(&k->cq[k->ncq], NULL, cq_thread, srv) != 0) break;
    if (k->ncq == 0) rc = kiln_status_set(st, KILN_EINTERNAL, "inproc", "no cq thread");
  }
  if (rc == 0) {
    k->loop_started = pthread_create(&k->loop, NULL, loop_thread, srv) == 0;
    if (!k->loop_started) rc = kiln_status_set(st, KILN_EINTERNAL, "inproc", "no loop thread");
  }
  if (rc == 0) {
    /* One end of a socket pair is a connection the server accepted, the
     * other the client's channel (the core wants them non-blocking): no port,
     * no network. (The core's inproc
     * transport has no C declaration.) */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
      rc = kiln_status_set(st, KILN_EIO, "inproc", "socketpair: %s", strerror(errno));
    } else {
      grpc_server_credentials *sc = grpc_insecure_server_credentials_create();
      grpc_server_add_channel_from_fd(srv->server, sv[0], sc);
      grpc_server_credentials_release(sc);
      grpc_channel_credentials *cc = grpc_insecure_credentials_create();
      grpc_arg arg = {.type = GRPC_ARG_INTEGER,
                      .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                      .value.integer = -1};
      grpc_channel_args cargs = {.num_args = 1, .args = &arg};
      k->channel = grpc_channel_create_from_fd("kilnd-inproc", sv[1], cc, &cargs);
      grpc_channel_credentials_release(cc);
      if (k->channel == NULL) rc = kiln_status_set(st, KILN_EINTERNAL, "inproc", "no channel");
    }
  }
  if (rc) {
    /* As main does after a failed start. */
    if (srv->loop) kilnd_http_close(srv);
    stop_grpc(srv, k->cq, k->ncq);
    stop_parts(srv);
    kilnd_config_free(&srv->cfg);
    grpc_shutdown();
    free(k);
    return rc;
  }
  *out = k;
  return 0;
}

int kilnd_inproc_stop(kilnd_inproc *k) {
  if (k == NULL) return 0;
  kilnd *srv = &k->srv;
  grpc_channel_destroy(k->channel);
  kill(getpid(), SIGTERM); /* the loop's own drain */
  pthread_join(k->loop, NULL);
  if (atomic_load(&srv->abandoned)) return -1;
  stop_grpc(srv, k->cq, k->ncq);
  stop_parts(srv);
  kilnd_config_free(&srv->cfg);
  grpc_shutdown();
  free(k);
  return 0;
}

int kilnd_inproc_inflight(kilnd_inproc *k) { return atomic_load(&k->srv.inflight); }

/* ---- calls ------------------------------------------------------------------------------ */

static bool run_batch(grpc_call *call, grpc_completion_queue *cq, grpc_op *ops, size_t n,
                      void *tag) {
  if (grpc_call_start_batch(call, ops, n, tag, NULL) != GRPC_CALL_OK) return false;
  grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static bool keep_message(kilnd_inproc_reply *r, grpc_byte_buffer *bb) {
  grpc_byte_buffer_reader rd;
  if (!grpc_byte_buffer_reader_init(&rd, bb)) return false;
  grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
  grpc_byte_buffer_reader_destroy(&rd);
  size_t len = GRPC_SLICE_LENGTH(s);
  uint8_t **m = realloc(r->msgs, (r->n + 1) * sizeof *m);
  size_t *l = m ? realloc(r->lens, (r->n + 1) * sizeof *l) : NULL;
  if (m) r->msgs = m;
  if (l) r->lens = l;
  uint8_t *copy = l ? malloc(len ? len : 1) : NULL;
  if (copy == NULL) {
    grpc_slice_unref(s);
    return false;
  }
  memcpy(copy, GRPC_SLICE_START_PTR(s), len);
  grpc_slice_unref(s);
  r->msgs[r->n] = copy;
  r->lens[r->n++] = len;
  return true;
}

int kilnd_inproc_call(kilnd_inproc *k, const char *path, const char *client,
                      const uint8_t *const *msgs, const size_t *lens, size_t nmsgs,
                      int64_t timeout_ms, size_t max_replies, kilnd_inproc_reply *out) {
  memset(out, 0, sizeof *out);
  out->code = GRPC_STATUS_UNKNOWN;
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  gpr_timespec deadline =
      gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
  grpc_slice method = grpc_slice_from_copied_string(path);
  grpc_call *call = grpc_channel_create_call(k->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method,
                                             NULL, deadline, NULL);
  grpc_slice_unref(method);
  int rc = -1;
  grpc_metadata md = {0};
  grpc_metadata_array initial, trailing;
  grpc_metadata_array_init(&initial);
  grpc_metadata_array_init(&trailing);
  grpc_slice details = grpc_empty_slice();
  if (client) {
    md.key = grpc_slice_from_static_string("kiln-client");
    md.value = grpc_slice_from_copied_string(client);
  }
  int tag_status, tag_send, tag_recv;
  grpc_op op[3];
  memset(op, 0, sizeof op);
  op[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op[0].data.recv_status_on_client.trailing_metadata = &trailing;
  op[0].data.recv_status_on_client.status = &out->code;
  op[0].data.recv_status_on_client.status_details = &details;
  if (grpc_call_start_batch(call, op, 1, &tag_status, NULL) != GRPC_CALL_OK) goto out;
  /* The sends go as few batches as the core allows (one message each; the
   * metadata with the first, the half-close with the last), and the first
   * receive is started beside them, not after: a call costs the fewest
   * round trips between this thread and the server's, which is most of
   * what a small call costs (fuzz_rpc makes two per input). The order on
   * the wire is the same as one op at a time. */
  grpc_byte_buffer *recv_bb = NULL;
  memset(op, 0, sizeof op);
  op[0].op = GRPC_OP_RECV_INITIAL_METADATA;
  op[0].data.recv_initial_metadata.recv_initial_metadata = &initial;
  op[1].op = GRPC_OP_RECV_MESSAGE;
  op[1].data.recv_message.recv_message = &recv_bb;
  bool recv_started = grpc_call_start_batch(call, op, 2, &tag_recv, NULL) == GRPC_CALL_OK;
  bool alive = true;
  size_t i = 0;
  do {
    size_t n = 0;
    grpc_byte_buffer *bb = NULL;
    memset(op, 0, sizeof op);
    if (i == 0) {
      op[n].op = GRPC_OP_SEND_INITIAL_METADATA;
      op[n].data.send_initial_metadata.count = client ? 1 : 0;
      op[n++].data.send_initial_metadata.metadata = client ? &md : NULL;
    }
    if (i < nmsgs) {
      grpc_slice sl = grpc_slice_from_copied_buffer((const char *)msgs[i], lens[i]);
      bb = grpc_raw_byte_buffer_create(&sl, 1);
      grpc_slice_unref(sl);
      op[n].op = GRPC_OP_SEND_MESSAGE;
      op[n++].data.send_message.send_message = bb;
    }
    if (i + 1 >= nmsgs) op[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    alive = run_batch(call, cq, op, n, &tag_send);
    if (bb) grpc_byte_buffer_destroy(bb);
  } while (alive && ++i < nmsgs);
  /* Whatever happened to the sends, the server's answer is read. */
  for (bool first = true;; first = false) {
    grpc_byte_buffer *bb = NULL;
    bool ok;
    if (first && recv_started) {
      grpc_event ev =
          grpc_completion_queue_pluck(cq, &tag_recv, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
      ok = ev.type == GRPC_OP_COMPLETE && ev.success;
      bb = recv_bb;
    } else {
      size_t n = 0;
      memset(op, 0, sizeof op);
      if (first) {
        op[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        op[n++].data.recv_initial_metadata.recv_initial_metadata = &initial;
      }
      op[n].op = GRPC_OP_RECV_MESSAGE;
      op[n++].data.recv_message.recv_message = &bb;
      ok = run_batch(call, cq, op, n, &tag_recv);
    }
    if (!ok || bb == NULL) {
      if (bb) grpc_byte_buffer_destroy(bb);
      break;
    }
    bool kept = keep_message(out, bb);
    grpc_byte_buffer_destroy(bb);
    if (!kept || out->n >= max_replies) {
      grpc_call_cancel(call, NULL);
      break;
    }
  }
  grpc_completion_queue_pluck(cq, &tag_status, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  snprintf(out->details, sizeof out->details, "%.*s", (int)GRPC_SLICE_LENGTH(details),
           (const char *)GRPC_SLICE_START_PTR(details));
  rc = 0;
out:
  if (client) grpc_slice_unref(md.value);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&initial);
  grpc_metadata_array_destroy(&trailing);
  grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  return rc;
}

void kilnd_inproc_reply_clear(kilnd_inproc_reply *r) {
  for (size_t i = 0; i < r->n; i++) free(r->msgs[i]);
  free(r->msgs);
  free(r->lens);
  memset(r, 0, sizeof *r);
}
