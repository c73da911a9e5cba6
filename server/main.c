/* kilnd: start, serve, drain, stop.
 *
 * Start-up builds the parts bottom-up (buffer store, executable table, the
 * executable cache, cpu backend, scheduler, metrics, loop and its HTTP
 * endpoint, gRPC server),
 * requests one call per method plus one for unregistered methods, starts the
 * completion-queue threads and runs the loop until the server has drained.
 * Tear-down follows gRPC's order: every call finished (the shutdown tag),
 * server destroyed, queue shut down and emptied, queue threads joined, then
 * our own parts in reverse.
 */
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "cache/cache.h"
#include "common/alloc.h"
#include "common/thread.h"
#include "compiler/codegen/user_kernel.h"
#include "executor/backend.h"
#include "executor/buffers.h"
#include "executor/cpu/cpu_blas.h"
#ifdef KILN_HAVE_CUDA
#include "executor/cuda/cuda.h"
#endif
#include "executor/scheduler.h"
#include "server/compile_memo.h"
#include "server/executables.h"
#include "server/mesh.h"
#include "server/server.h"

extern char **environ;

#define KILND_VERSION "0.1.0"
#define REQUESTS_PER_METHOD 64

/* ---- completion-queue threads -------------------------------------------------------- */

static void *cq_thread(void *arg) {
  kilnd *srv = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) return NULL;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    kilnd_tag *tag = ev.tag;
    tag->fn(tag, ev.success != 0);
  }
}

static void on_shutdown(kilnd_tag *tag, bool ok) {
  (void)ok;
  kilnd *srv = (kilnd *)((char *)tag - offsetof(kilnd, shutdown_tag));
  kilnd_loop_server_down(srv);
}

/* ---- the gRPC server ----------------------------------------------------------------- */

/* "HOST:PORT" with the bound port; `what` is "" or "health ". */
static void print_listen(const char *what, const char *spec, int port) {
  const char *colon = strrchr(spec, ':');
  int hl = colon ? (int)(colon - spec) : (int)strlen(spec);
  printf("kilnd: %slistening on %.*s:%d\n", what, hl, spec, port);
  fflush(stdout);
}

static int start_grpc(kilnd *srv, kiln_status *st) {
  grpc_arg args[3] = {
      {.type = GRPC_ARG_INTEGER,
       .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
       .value.integer = (int)srv->cfg.max_message_bytes},
      {.type = GRPC_ARG_INTEGER,
       .key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
       .value.integer = -1},
      /* Two servers on one port would split the calls between them. */
      {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
  };
  grpc_channel_args ca = {.num_args = 3, .args = args};
  srv->server = grpc_server_create(&ca, NULL);
  srv->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
  const kilnd_method *m = kilnd_methods();
  for (int i = 0; i < KILND_M_COUNT; i++)
    srv->registered[i] = grpc_server_register_method(
        srv->server, m[i].path, NULL,
        m[i].kind == KILND_CLIENT_STREAM ? GRPC_SRM_PAYLOAD_NONE
                                         : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
        0);
  grpc_server_credentials *creds = kilnd_auth_main_credentials(srv, st);
  if (creds == NULL) return KILN_EINTERNAL;
  int port = grpc_server_add_http2_port(srv->server, srv->cfg.listen, creds);
  grpc_server_credentials_release(creds);
  if (port == 0)
    return kiln_status_set(st, KILN_EIO, "listen", "cannot listen on '%s'", srv->cfg.listen);
  /* The health port is a second port of the same server: its calls are
   * marked (auth.c) and the validation point serves them health only. */
  int hport = 0;
  if (srv->cfg.health_listen[0]) {
    creds = kilnd_auth_health_credentials(srv);
    hport = grpc_server_add_http2_port(srv->server, srv->cfg.health_listen, creds);
    grpc_server_credentials_release(creds);
    if (hport == 0)
      return kiln_status_set(st, KILN_EIO, "health-listen", "cannot listen on '%s'",
                             srv->cfg.health_listen);
  }
  grpc_server_start(srv->server);
  print_listen("", srv->cfg.listen, port);
  if (hport) print_listen("health ", srv->cfg.health_listen, hport);
  return 0;
}

/* The executable cache: one object for the whole server. A bad Redis URL
 * or an unreadable secret stops start-up; a Redis that is down does not
 * (the cache reconnects in the background). */
static int start_cache(kilnd *srv, kiln_status *st) {
  const kilnd_config *cfg = &srv->cfg;
  kiln_cache_config cc;
  kiln_cache_config_init(&cc);
  cc.memory_bytes = cfg->cache_memory_bytes;
  cc.disk_dir = cfg->cache_dir;
  cc.disk_bytes = cfg->cache_disk_bytes;
  cc.redis.url = cfg->redis_url;
  cc.redis.ttl_s = (uint32_t)cfg->redis_ttl_s;
  cc.redis.timeout_ms = (uint32_t)cfg->redis_timeout_ms;
  cc.min_compile_ns = cfg->cache_min_compile_ms * UINT64_C(1000000);
  cc.lock_ttl_ms = (uint32_t)cfg->cache_lock_ttl_ms;
  char *secret = NULL;
  int rc = kilnd_config_cache_secret(cfg, &secret, st);
  if (rc) return rc;
  cc.secret = secret;
  bool shared_secret = secret != NULL;
  rc = kiln_cache_create(&cc, &srv->cache, st);
  if (secret) {
    memset(secret, 0, strlen(secret));
    kiln_free(secret);
  }
  if (rc == 0 && cfg->redis_url[0] && !shared_secret)
    kilnd_log("warning: --redis-url without KILN_CACHE_SECRET or --cache-secret-file: entries "
              "of servers with another secret fail their check and are rebuilt");
  return rc;
}

static int start_parts(kilnd *srv, kiln_status *st) {
  const kilnd_config *cfg = &srv->cfg;
  kiln_buffer_store_options bo = {.client_quota_bytes = cfg->client_memory_bytes,
                                  .total_quota_bytes = kilnd_config_server_memory(cfg),
                                  .max_buffers_per_client = (uint32_t)cfg->max_buffers_per_client};
  int rc = kiln_buffer_store_create(&bo, &srv->buffers, st);
  if (rc == 0)
    rc = kilnd_exes_create((uint32_t)cfg->max_executables, cfg->executable_table_bytes, &srv->exes,
                           st);
  if (rc == 0) rc = kilnd_auth_create(srv, st);
  if (rc == 0) rc = start_cache(srv, st);
  if (rc == 0 && (srv->memo = kilnd_memo_create()) == NULL)
    rc = kiln_status_set(st, KILN_ENOMEM, "kilnd", "out of memory");
  if (rc == 0 && cfg->allow_user_kernels) {
    if ((srv->user_kernels = kiln_user_kernels_create()) == NULL)
      rc = kiln_status_set(st, KILN_ENOMEM, "kilnd", "out of memory");
    else
      kilnd_log("warning: --allow-user-kernels: RegisterKernel compiles C code from clients and "
                "runs it in this process%s",
                cfg->tokens[0] ? " (admins only)" : "; no tokens: any client may");
  }
  if (rc) return rc;
  kiln_backend_options cpu = {.ndevices = (uint32_t)cfg->cpu_devices,
                              .threads_per_device = (uint32_t)cfg->cpu_threads};
  if ((rc = kiln_backend_create("cpu", &cpu, &srv->cpu, st))) return rc;
  if ((rc = kiln_backend_create("interp", NULL, &srv->interp, st))) return rc;
  /* GPUs: none without a driver, and the server serves as before (Compile
   * for cuda targets needs none; Execute of their code says why not). */
  snprintf(srv->cuda_why, sizeof srv->cuda_why, "this kilnd was built without the CUDA pool");
#ifdef KILN_HAVE_CUDA
  kiln_status cst;
  kiln_status_clear(&cst);
  srv->cuda_devices = kiln_cuda_device_count(&cst);
  if (srv->cuda_devices == 0) snprintf(srv->cuda_why, sizeof srv->cuda_why, "%.200s", cst.msg);
  /* A GPU that the backend cannot open leaves kilnd serving cpu, saying why. */
  if (srv->cuda_devices && kiln_backend_create("cuda", NULL, &srv->cuda, &cst) != 0) {
    snprintf(srv->cuda_why, sizeof srv->cuda_why, "%.200s", cst.msg);
    kilnd_log("warning: cuda: %u devices, but the cuda backend failed: %s", srv->cuda_devices,
              cst.msg);
    srv->cuda = NULL;
    srv->cuda_devices = 0;
  }
#endif
  if (srv->cuda_devices)
    kilnd_log("cuda: %u devices; executables of cuda targets run on cuda:0", srv->cuda_devices);
  else
    kilnd_log("cuda: 0 devices (%s); cuda targets still compile", srv->cuda_why);
  if (cfg->mesh_name[0]) { /* met at its first use, not here */
    kilnd_mesh_config mc = {.name = cfg->mesh_name,
                            .redis = cfg->mesh_redis,
                            .ranks = (uint32_t)cfg->mesh_ranks,
                            .rank = (uint32_t)cfg->mesh_rank,
                            .devices = (uint32_t)cfg->mesh_devices,
                            .first_device = (uint32_t)cfg->mesh_first_device,
                            .generation = cfg->mesh_generation,
                            .timeout_s = cfg->mesh_timeout};
    if ((rc = kilnd_mesh_create(&mc, srv->cuda, &srv->mesh, st))) return rc;
    kilnd_log("mesh %s: rank %u of %u hosts%s", cfg->mesh_name, mc.rank, mc.ranks,
              srv->cuda ? "" : " (this host has no CUDA device: its uses will fail)");
  }
  kiln_sched_options so = {
      .nclasses = 2,
      .class_devices = {(uint32_t)cfg->cpu_devices, (uint32_t)cfg->interp_devices},
      .max_queued = (uint32_t)cfg->queue_depth,
      .max_queued_per_client = (uint32_t)cfg->client_queue_depth};
  if ((rc = kiln_sched_create(&so, &srv->sched, st))) return rc;
  if ((rc = kilnd_auth_apply_quotas(srv, st))) return rc;
  if ((rc = kilnd_metrics_create(srv, st))) return rc;
  if ((rc = kilnd_loop_create(srv, st))) return rc;
  return kilnd_http_start(srv, kilnd_loop_uv(srv), st);
}

/* ---- tear-down ----------------------------------------------------------------------- */

/* Our own references drop on cq threads just after gRPC's last
 * completions; wait for them (bounded, in case of a bug) before destroying
 * the server under them. */
static void wait_calls(kilnd *srv) {
  for (int i = 0; i < 5000; i++) {
    if (atomic_load(&srv->inflight) == 0 && atomic_load(&srv->requested) == 0) return;
    usleep(1000);
  }
  kilnd_log("%d calls still in flight, %d requested at exit", atomic_load(&srv->inflight),
            atomic_load(&srv->requested));
}

static void stop_grpc(kilnd *srv, pthread_t *threads, uint32_t nthreads) {
  if (srv->server == NULL) return;
  if (!atomic_exchange(&srv->shutdown, true)) {
    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_tag);
    grpc_server_cancel_all_calls(srv->server);
  }
  wait_calls(srv);
  grpc_server_destroy(srv->server);
  grpc_completion_queue_shutdown(srv->cq);
  if (nthreads == 0) /* never started: drain here */
    while (grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
  for (uint32_t i = 0; i < nthreads; i++) pthread_join(threads[i], NULL);
  grpc_completion_queue_destroy(srv->cq);
}

static void stop_parts(kilnd *srv) {
  kiln_sched_destroy(srv->sched);
  kilnd_exes_destroy(srv->exes);
  /* Buffers still held at exit live in the backends' device memory: free
   * them before the devices go. */
  kiln_buffer_store_destroy(srv->buffers);
  kiln_backend_destroy(srv->cpu);
  kiln_backend_destroy(srv->interp);
  kilnd_mesh_destroy(srv->mesh);
  kiln_backend_destroy(srv->cuda);
  kilnd_loop_destroy(srv);
  kiln_cache_destroy(srv->cache); /* after the compile pool */
  srv->cache = NULL;
  kilnd_memo_destroy(srv->memo);
  srv->memo = NULL;
  kiln_user_kernels_destroy(srv->user_kernels); /* after the compile pool */
  srv->user_kernels = NULL;
  kilnd_metrics_destroy(srv);
  kilnd_auth_destroy(srv); /* after the gRPC server: its handshakes read it */
}

/* ---- main ---------------------------------------------------------------------------- */

static int serve(kilnd *srv, kiln_status *st) {
  pthread_t threads[64];
  uint32_t nthreads = 0;
  int rc = start_parts(srv, st);
  if (rc == 0) rc = start_grpc(srv, st);
  if (rc == 0) {
    /* Calls that arrive while no request of theirs is pending wait inside
     * gRPC, and those still waiting when a drain begins are cancelled by
     * it: keep enough requested that a burst is matched at once. */
    const kilnd_method *m = kilnd_methods();
    for (int i = 0; i < KILND_M_COUNT; i++)
      for (int k = 0; k < REQUESTS_PER_METHOD; k++) kilnd_call_request(srv, &m[i]);
    for (int k = 0; k < 4; k++) kilnd_call_request(srv, NULL);
    for (; nthreads < srv->cfg.cq_threads; nthreads++)
      if (kiln_thread_start(&threads[nthreads], cq_thread, srv) != 0) break;
    if (nthreads == 0) rc = kiln_status_set(st, KILN_EINTERNAL, "cq-threads", "no thread started");
  }
  if (rc == 0)
    kilnd_loop_run(srv);
  else if (srv->loop)
    kilnd_http_close(srv);
  if (atomic_load(&srv->abandoned)) {
    /* Device threads still run code that will reply on these calls:
     * nothing may be torn down under them. */
    fflush(NULL);
    _exit(0);
  }
  stop_grpc(srv, threads, nthreads);
  stop_parts(srv);
  return rc;
}

int main(int argc, char **argv) {
  /* Before anything else: OpenBLAS may need its core chosen (cpu_blas.h). */
  kiln_cpu_blas_select_core(argv);
  kilnd srv;
  memset(&srv, 0, sizeof srv);
  kiln_status st;
  kiln_status_clear(&st);
  kilnd_config_action action;
  int rc = kilnd_config_load(&srv.cfg, argc, argv, environ, &action, &st);
  if (rc == 0 && action == KILND_CONFIG_RUN)
    rc = kilnd_log_configure(srv.cfg.log_format, srv.cfg.log_level, &st);
  if (rc == 0 && action == KILND_CONFIG_HELP) kilnd_config_usage(stdout);
  if (rc == 0 && action == KILND_CONFIG_VERSION) printf("kilnd %s\n", KILND_VERSION);
  if (rc || action != KILND_CONFIG_RUN) {
    if (rc) {
      char msg[KILN_STATUS_MSG_MAX + KILN_STATUS_WHERE_MAX + 16];
      kiln_status_format(&st, msg, sizeof msg);
      kilnd_logl(KILN_LOG_ERROR, "%s", msg);
    }
    kilnd_config_free(&srv.cfg);
    return rc ? 2 : 0;
  }
  char pool[16];
  snprintf(pool, sizeof pool, "%llu", (unsigned long long)srv.cfg.compile_threads);
  setenv("UV_THREADPOOL_SIZE", pool, 1);
  /* Signals with no meaning here must not kill a server that others'
   * work runs on: SIGPIPE (a peer gone: the write fails instead), SIGUSR1
   * and SIGUSR2 (nothing to do), and SIGHUP until the loop takes it over to
   * reload (loop.c). SIGTERM and SIGINT drain (loop.c). */
  signal(SIGPIPE, SIG_IGN);
  signal(SIGUSR1, SIG_IGN);
  signal(SIGUSR2, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  /* Streams pass megabyte messages through short-lived buffers: keep freed
   * heap memory for reuse rather than trimming it and faulting it in again
   * per message (PutBuffer ran at half speed), and serve allocations up to
   * 4 MiB from the heap; larger ones are mapped and returned when freed.
   * Few arenas, so that what one thread frees another reuses and the memory
   * kept stays small (bench/RESULTS.md, rpc_bench). */
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  mallopt(M_TRIM_THRESHOLD, 32 << 20);
  mallopt(M_ARENA_MAX, 4);
  srv.start_ns = kiln_sched_now_ns();
  srv.shutdown_tag.fn = on_shutdown;
  kilnd_sha256_init();
  if (kilnd_log_get_format() != KILND_LOG_TEXT) gpr_set_log_function(kilnd_log_grpc);
  grpc_init();
  rc = serve(&srv, &st);
  grpc_shutdown();
  if (rc) {
    char msg[KILN_STATUS_MSG_MAX + KILN_STATUS_WHERE_MAX + 16];
    kiln_status_format(&st, msg, sizeof msg);
    kilnd_logl(KILN_LOG_ERROR, "%s", msg);
  } else {
    kilnd_log("drained; exiting");
  }
  kilnd_config_free(&srv.cfg);
  return rc ? 1 : 0;
}
