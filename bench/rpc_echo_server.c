/* rpc_echo_server: the baseline rpc_bench measures kilnd against, a gRPC
 * C-core server that answers the unary method /bench.Echo/Echo with the
 * bytes it received, and nothing else.
 *
 * It is built the way kilnd's network side is (one completion queue,
 * registered method with the payload read up front, N threads on the
 * queue, a reply as one batch of initial metadata, message and status), so
 * the difference between the two is what kilnd does per call: decoding,
 * scheduling, running and encoding. It keeps 64 calls requested so that a
 * burst of clients never waits for a request slot.
 *
 *   rpc_echo_server [--listen HOST:PORT] [--threads N]
 * prints "echo: listening on HOST:PORT" and serves until SIGTERM/SIGINT.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#define PENDING 64

typedef struct echo_call {
  int state; /* 0: requested, 1: replying */
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
  int cancelled;
} echo_call;

static grpc_server *server;
static grpc_completion_queue *cq;
static void *method;
static atomic_bool stopping;

static void request(echo_call *c) {
  memset(c, 0, sizeof *c);
  grpc_metadata_array_init(&c->md);
  grpc_server_request_registered_call(server, method, &c->call, &c->deadline, &c->md, &c->payload,
                                      cq, cq, c);
}

static void reply(echo_call *c) {
  c->state = 1;
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = c->payload;
  ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[2].data.send_status_from_server.status = GRPC_STATUS_OK;
  ops[3].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[3].data.recv_close_on_server.cancelled = &c->cancelled;
  if (c->payload == NULL) { /* no message: answer with an empty one */
    grpc_slice s = grpc_empty_slice();
    c->payload = grpc_raw_byte_buffer_create(&s, 1);
    ops[1].data.send_message.send_message = c->payload;
  }
  grpc_call_start_batch(c->call, ops, 4, c, NULL);
}

static void *serve(void *arg) {
  (void)arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) return NULL;
    if (ev.type != GRPC_OP_COMPLETE || ev.tag == NULL) continue;
    if (ev.tag == (void *)&server) continue; /* the shutdown tag */
    echo_call *c = ev.tag;
    if (c->state == 0 && ev.success) {
      reply(c);
      continue;
    }
    if (c->call) grpc_call_unref(c->call);
    if (c->payload) grpc_byte_buffer_destroy(c->payload);
    grpc_metadata_array_destroy(&c->md);
    if (atomic_load(&stopping)) {
      free(c);
      continue;
    }
    request(c);
  }
}

static void on_signal(int sig) {
  (void)sig;
  atomic_store(&stopping, true);
}

int main(int argc, char **argv) {
  const char *listen = "127.0.0.1:0";
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--listen") == 0)
      listen = argv[i + 1];
    else if (strcmp(argv[i], "--threads") == 0)
      threads = atoi(argv[i + 1]);
  }
  if (threads < 1 || threads > 64) threads = 2;
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  grpc_init();
  grpc_arg arg = {.type = GRPC_ARG_INTEGER,
                  .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                  .value.integer = 64 << 20};
  grpc_channel_args args = {.num_args = 1, .args = &arg};
  server = grpc_server_create(&args, NULL);
  cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(server, cq, NULL);
  method = grpc_server_register_method(server, "/bench.Echo/Echo", NULL,
                                       GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
  int port = grpc_server_add_http2_port(server, listen, creds);
  grpc_server_credentials_release(creds);
  if (port == 0) {
    fprintf(stderr, "echo: cannot listen on %s\n", listen);
    return 1;
  }
  grpc_server_start(server);
  for (int i = 0; i < PENDING; i++) request(malloc(sizeof(echo_call)));
  const char *colon = strrchr(listen, ':');
  printf("echo: listening on %.*s:%d\n", (int)(colon - listen), listen, port);
  fflush(stdout);
  pthread_t t[64];
  for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, serve, NULL);
  while (!atomic_load(&stopping)) pause();
  grpc_server_shutdown_and_notify(server, cq, (void *)&server);
  grpc_server_cancel_all_calls(server);
  struct timespec ts = {0, 200000000};
  nanosleep(&ts, NULL);
  grpc_server_destroy(server);
  grpc_completion_queue_shutdown(cq);
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  grpc_completion_queue_destroy(cq);
  grpc_shutdown();
  return 0;
}
