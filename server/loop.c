/* The server's own event loop (libuv, on the main thread).
 *
 * It owns what has a file descriptor or a clock: SIGTERM/SIGINT, SIGHUP
 * (reload of certificates and tokens), the
 * housekeeping timer (drops queued executions whose deadline passed or whose
 * caller went away, even while every device is busy), the drain timer, the
 * /metrics listener; and it feeds the compile pool (libuv's work queue, sized
 * by --compile-threads through UV_THREADPOOL_SIZE before first use).
 *
 * Other threads reach the loop through kilnd_loop_post: a locked list plus
 * uv_async_send. Wake-ups coalesce, so each wake-up drains the whole list.
 * The list refuses posts once the loop is closing, under the same lock that
 * closing takes, so uv_async_send never touches a closed handle.
 *
 * Drain, in two phases. The first signal makes health checks answer
 * NOT_SERVING and, after --drain-grace (calls already on their way), the
 * validation point refuse new work with UNAVAILABLE; it arms
 * --drain-timeout; work already accepted runs to the end. When none is
 * left, the gRPC server shuts down (grpc_server_shutdown_and_notify); when
 * its shutdown tag has come and our last call is freed, the loop closes its
 * handles and returns. A second signal, or the timer, cancels what is still
 * running.
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "common/alloc.h"
#include "executor/scheduler.h"
#include "server/config.h"
#include "server/log.h"
#include "server/server.h"
#include "server/stall.h"

#define TICK_MS 50
#define GIVE_UP_MS 5000 /* after the drain timeout cancelled what was left */

typedef struct post_item {
  kilnd_post_fn fn;
  void *arg;
  struct post_item *next;
} post_item;

struct kilnd_loop {
  uv_loop_t loop;
  uv_async_t async;
  uv_signal_t sigterm, sigint, sighup;
  uv_timer_t tick, drain;
  pthread_mutex_t mu;
  post_item *head, *tail;
  bool closed;
};

typedef struct compile_req {
  uv_work_t req;
  kilnd_call *c;
} compile_req;

/* ---- posting ------------------------------------------------------------------------- */

/* 0, KILN_ENOMEM, or KILN_EUNAVAIL once the loop has closed. */
static int post(kilnd *srv, kilnd_post_fn fn, void *arg) {
  kilnd_loop *l = srv->loop;
  post_item *it = kiln_malloc(sizeof *it);
  if (it == NULL) return KILN_ENOMEM;
  it->fn = fn;
  it->arg = arg;
  it->next = NULL;
  pthread_mutex_lock(&l->mu);
  bool ok = !l->closed;
  if (ok) {
    if (l->tail)
      l->tail->next = it;
    else
      l->head = it;
    l->tail = it;
    uv_async_send(&l->async);
  }
  pthread_mutex_unlock(&l->mu);
  if (!ok) kiln_free(it);
  return ok ? 0 : KILN_EUNAVAIL;
}

bool kilnd_loop_post(kilnd *srv, kilnd_post_fn fn, void *arg) { return post(srv, fn, arg) == 0; }

static void run_posted(kilnd *srv) {
  kilnd_loop *l = srv->loop;
  pthread_mutex_lock(&l->mu);
  post_item *it = l->head;
  l->head = l->tail = NULL;
  pthread_mutex_unlock(&l->mu);
  while (it) {
    post_item *next = it->next;
    it->fn(srv, it->arg);
    kiln_free(it);
    it = next;
  }
}

static void on_async(uv_async_t *h) { run_posted(h->data); }

/* ---- the compile pool ---------------------------------------------------------------- */

static void compile_work(uv_work_t *req) {
  compile_req *cr = req->data;
  kilnd_compile_work(cr->c);
}

static void compile_after(uv_work_t *req, int status) {
  (void)status;
  kiln_free(req->data);
}

static void start_compile(kilnd *srv, void *arg) {
  compile_req *cr = kiln_calloc(1, sizeof *cr);
  kilnd_call *c = arg;
  if (cr == NULL) {
    atomic_fetch_sub(&srv->compiles, 1);
    kilnd_call_fail(c, KILN_ENOMEM, "out of memory queueing the compile");
    return;
  }
  cr->c = c;
  cr->req.data = cr;
  int rc = uv_queue_work(&srv->loop->loop, &cr->req, compile_work, compile_after);
  if (rc != 0) {
    kiln_free(cr);
    atomic_fetch_sub(&srv->compiles, 1);
    kilnd_call_fail(c, KILN_EINTERNAL, "cannot queue the compile: %s", uv_strerror(rc));
  }
}

int kilnd_loop_queue_compile(kilnd *srv, kilnd_call *c) { return post(srv, start_compile, c); }

/* ---- timers and signals -------------------------------------------------------------- */

/* On the loop: closes everything so uv_run returns once the compile pool's
 * last after-callbacks ran. */
static void close_loop(kilnd *srv) {
  kilnd_loop *l = srv->loop;
  pthread_mutex_lock(&l->mu);
  bool was = l->closed;
  l->closed = true;
  pthread_mutex_unlock(&l->mu);
  if (was) return;
  run_posted(srv);
  uv_close((uv_handle_t *)&l->async, NULL);
  uv_close((uv_handle_t *)&l->sigterm, NULL);
  uv_close((uv_handle_t *)&l->sigint, NULL);
  uv_close((uv_handle_t *)&l->sighup, NULL);
  uv_close((uv_handle_t *)&l->tick, NULL);
  uv_close((uv_handle_t *)&l->drain, NULL);
  kilnd_http_close(srv);
}

/* Phase two of the drain: gRPC stops taking calls. Calls caught between
 * arriving and being matched at that moment are cancelled by gRPC, which
 * is why phase one refuses new work with UNAVAILABLE first. */
static void shutdown_grpc(kilnd *srv) {
  if (atomic_exchange(&srv->shutdown, true)) return;
  grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_tag);
}

/* gRPC's shutdown tag says its calls are over, but a call whose caller went
 * away may still have its execution running on a device: the drain ends
 * when our own count of calls reaches zero too. */
static void maybe_finish(kilnd *srv) {
  if (!atomic_load(&srv->draining)) return;
  if (atomic_load(&srv->working) == 0 && kiln_sched_now_ns() >= atomic_load(&srv->refuse_after_ns))
    shutdown_grpc(srv);
  if (atomic_load(&srv->grpc_down) && atomic_load(&srv->inflight) == 0 &&
      atomic_load(&srv->requested) == 0)
    close_loop(srv);
}

static void on_tick(uv_timer_t *h) {
  kilnd *srv = h->data;
  kiln_sched_expire(srv->sched);
  kilnd_buffers_expire(srv);
  kilnd_call_repay(srv);
  kilnd_stall_sweep(srv, srv->cfg.stream_idle_timeout);
  maybe_finish(srv);
}

/* The last resort: executions that outlived the drain timeout and the
 * cancellation cannot be interrupted; the process leaves them behind. */
static void on_give_up(uv_timer_t *h) {
  kilnd *srv = h->data;
  kilnd_log("%d calls still running after the drain timeout; exiting without them",
            atomic_load(&srv->inflight));
  atomic_store(&srv->abandoned, true);
  close_loop(srv);
}

static void cancel_rest(kilnd *srv) {
  shutdown_grpc(srv);
  grpc_server_cancel_all_calls(srv->server);
  uv_timer_start(&srv->loop->drain, on_give_up, GIVE_UP_MS, 0);
}

static void on_drain_timeout(uv_timer_t *h) {
  kilnd *srv = h->data;
  kilnd_log("drain timeout: cancelling the calls still running");
  cancel_rest(srv);
}

/* Phase one: new work is refused (UNAVAILABLE) and health says
 * NOT_SERVING while accepted work finishes; maybe_finish moves on. */
static void begin_drain(kilnd *srv, int signum) {
  if (atomic_load(&srv->draining)) {
    kilnd_log("signal %d again: cancelling the calls still running", signum);
    cancel_rest(srv);
    return;
  }
  int64_t grace = (int64_t)(srv->cfg.drain_grace * 1e9);
  atomic_store(&srv->refuse_after_ns, kiln_sched_now_ns() + grace);
  kilnd_log("signal %d: draining (new calls refused after %.3g s; running calls finish)", signum,
            srv->cfg.drain_grace);
  atomic_store(&srv->draining, true);
  uint64_t ms = (uint64_t)(srv->cfg.drain_timeout * 1000.0);
  uv_timer_start(&srv->loop->drain, on_drain_timeout, ms ? ms : 1, 0);
  maybe_finish(srv);
}

static void on_signal(uv_signal_t *h, int signum) { begin_drain(h->data, signum); }

/* The config file's log-level, when the file sets one, becomes the level
 * (a file that no longer parses keeps the old level and says why). The
 * level from the flags or the environment at start stays unless the file
 * names one: only the file can be changed under a running server. */
static void reload_log_level(kilnd *srv) {
  if (!srv->cfg.config_path) return;
  kiln_status st;
  kiln_status_clear(&st);
  char *text = NULL;
  kilnd_config fresh;
  bool have = kilnd_config_init(&fresh, &st) == 0;
  int rc = have ? kilnd_config_set(&fresh, "log-level", kilnd_log_level_now(), "current", &st) : -1;
  if (rc == 0) rc = kilnd_read_file(srv->cfg.config_path, "config file", 16, &text, &st);
  if (rc == 0) rc = kilnd_config_apply_file_text(&fresh, text, srv->cfg.config_path, &st);
  const char *before = kilnd_log_level_now();
  if (rc == 0 && strcmp(fresh.log_level, before) != 0) {
    rc = kilnd_log_set_level(fresh.log_level, &st);
    if (rc == 0) kilnd_log("SIGHUP: log level %s (was %s)", fresh.log_level, before);
  }
  if (rc) kilnd_log("SIGHUP: log level kept (%s)", st.msg[0] ? st.msg : "cannot reload it");
  kiln_free(text);
  if (have) kilnd_config_free(&fresh);
}

/* SIGHUP reloads what can change without a restart and drains nothing:
 * the TLS certificates (for new connections) and the token file (for new
 * calls), auth.c, and the config file's log level; what cannot (ports,
 * devices, limits) needs a restart. */
static void on_sighup(uv_signal_t *h, int signum) {
  (void)signum;
  kilnd_log("SIGHUP: reloading; calls go on");
  kilnd_auth_reload(h->data);
  reload_log_level(h->data);
}

static void server_down(kilnd *srv, void *arg) {
  (void)arg;
  maybe_finish(srv);
}

void kilnd_loop_server_down(kilnd *srv) {
  atomic_store(&srv->grpc_down, true);
  if (!kilnd_loop_post(srv, server_down, NULL)) kilnd_log("loop already closed at shutdown");
}

/* ---- life ---------------------------------------------------------------------------- */

int kilnd_loop_create(kilnd *srv, kiln_status *st) {
  kilnd_loop *l = kiln_calloc(1, sizeof *l);
  if (l == NULL) return kiln_status_set(st, KILN_ENOMEM, "loop", "out of memory");
  srv->loop = l;
  pthread_mutex_init(&l->mu, NULL);
  int rc = uv_loop_init(&l->loop);
  if (rc == 0) rc = uv_async_init(&l->loop, &l->async, on_async);
  if (rc == 0) rc = uv_signal_init(&l->loop, &l->sigterm);
  if (rc == 0) rc = uv_signal_init(&l->loop, &l->sigint);
  if (rc == 0) rc = uv_signal_init(&l->loop, &l->sighup);
  if (rc == 0) rc = uv_timer_init(&l->loop, &l->tick);
  if (rc == 0) rc = uv_timer_init(&l->loop, &l->drain);
  if (rc) return kiln_status_set(st, KILN_EINTERNAL, "loop", "libuv: %s", uv_strerror(rc));
  l->async.data = l->sigterm.data = l->sigint.data = l->sighup.data = srv;
  l->tick.data = l->drain.data = srv;
  rc = uv_signal_start(&l->sigterm, on_signal, SIGTERM);
  if (rc == 0) rc = uv_signal_start(&l->sigint, on_signal, SIGINT);
  if (rc == 0) rc = uv_signal_start(&l->sighup, on_sighup, SIGHUP);
  if (rc == 0) rc = uv_timer_start(&l->tick, on_tick, TICK_MS, TICK_MS);
  if (rc) return kiln_status_set(st, KILN_EINTERNAL, "loop", "libuv: %s", uv_strerror(rc));
  return 0;
}

void *kilnd_loop_uv(kilnd *srv) { return &srv->loop->loop; }

void kilnd_loop_run(kilnd *srv) {
  uv_run(&srv->loop->loop, UV_RUN_DEFAULT);
  /* libuv put SIGHUP back to its default (death) when its handle closed:
   * a reload sent while the last of the shutdown runs is ignored. */
  signal(SIGHUP, SIG_IGN);
}

static void close_one(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

void kilnd_loop_destroy(kilnd *srv) {
  kilnd_loop *l = srv->loop;
  if (l == NULL) return;
  if (uv_loop_close(&l->loop) == UV_EBUSY) {
    /* After a failed start the handles are still open: close them all. */
    uv_walk(&l->loop, close_one, NULL);
    uv_run(&l->loop, UV_RUN_DEFAULT);
    uv_loop_close(&l->loop);
  }
  pthread_mutex_destroy(&l->mu);
  kiln_free(l);
  srv->loop = NULL;
}
