/* kilnd in process, for tests that need the server's own code paths without
 * a second process or the network: fault injection (test_server_faults.c)
 * and the RPC fuzzer (tests/fuzz/fuzz_rpc.c).
 *
 * kilnd_inproc_start builds a server from flags exactly as kilnd's main
 * does (server/main.c is compiled into the harness, its main renamed): the
 * buffer store, executable table, cache, backends, scheduler, metrics, the
 * libuv loop (on a thread of its own here), the gRPC server and its
 * completion-queue threads. Requests reach it over a gRPC channel on a
 * socket pair (grpc_channel_create_from_fd, grpc_server_add_channel_from_fd),
 * so they pass the same transport, validation point, decoding and handlers
 * as requests from the network, without a port. Stopping
 * drains the server as SIGTERM does and tears it down as main does, so
 * LeakSanitizer sees everything the server kept.
 */
#ifndef KILN_TESTS_SERVER_KILND_INPROC_H
#define KILN_TESTS_SERVER_KILND_INPROC_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "common/status.h"

typedef struct kilnd_inproc kilnd_inproc;

/* Starts a server with kilnd's flags `args` (NULL-terminated, may be NULL)
 * after "--listen 127.0.0.1:0 --metrics-listen off --drain-grace 0". The
 * environment is not read. One server per process at a time. */
int kilnd_inproc_start(const char *const *args, kilnd_inproc **out, kiln_status *st);
/* Drains (as SIGTERM would), stops and frees. Returns 0, or -1 when work
 * was still running at the end (the process must then exit). */
int kilnd_inproc_stop(kilnd_inproc *k);

/* What one call got back. */
typedef struct kilnd_inproc_reply {
  grpc_status_code code;
  char details[1024];
  uint8_t **msgs; /* the messages received, each malloc'd */
  size_t *lens;
  size_t n;
} kilnd_inproc_reply;

/* One call of `path` ("/kiln.v1.Kiln/Compile") as client `client` (sent as
 * kiln-client metadata; NULL: none): sends the nmsgs messages (raw bytes:
 * whatever a client could send) and half-closes, then receives every reply
 * message (at most max_replies, then the call is cancelled) and the status.
 * timeout_ms bounds the whole call. 0, or -1 when the core refused a batch. */
int kilnd_inproc_call(kilnd_inproc *k, const char *path, const char *client,
                      const uint8_t *const *msgs, const size_t *lens, size_t nmsgs,
                      int64_t timeout_ms, size_t max_replies, kilnd_inproc_reply *out);
void kilnd_inproc_reply_clear(kilnd_inproc_reply *r);

/* Calls running or queued on the server (0 when it is idle). */
int kilnd_inproc_inflight(kilnd_inproc *k);

#endif /* KILN_TESTS_SERVER_KILND_INPROC_H */
