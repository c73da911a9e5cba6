/* rpc_bench: kilnd's RPC path against raw baselines measured in the same
 * run.
 *
 * 1. Execute of a small cached program (negate over f32[1024]: 4 KiB in,
 *    4 KiB out) from C concurrent clients through libkiln, against a unary
 *    echo of the same request bytes through the gRPC core to
 *    rpc_echo_server (a server that does nothing but answer): throughput,
 *    p50 and p99. The ratio is what kilnd's work per call costs on top of
 *    gRPC itself.
 * 2. PutBuffer then GetBuffer of 256 MiB through libkiln's chunked streams,
 *    against a copy of the same bytes over a loopback TCP connection: GB/s.
 * 3. kilnd's resident memory over N executes (default 100,000): the figure
 *    after warm-up and at each quarter; a leak shows as steady growth.
 *
 *   rpc_bench --kilnd PATH --echo PATH [--clients 8] [--seconds 5] [--rounds 1]
 *             [--mib 256] [--rss-executes 100000] [--backend cpu] [--chunk-kib 1024]
 *
 * --rounds R repeats the Execute/echo pair R times, alternating, and reports
 * the median ratio with its spread; --mib 0 and --rss-executes 0 skip parts
 * 2 and 3. The CPU time per call of the server and of the clients (this
 * process; from /proc) is printed beside the throughput: on a shared
 * machine it moves much less than calls/s, and on a small one the clients'
 * share bounds both sides.
 *
 * Prints a human-readable report and one JSON line at the end.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "clients/c/kiln.h"
#include "kiln/v1/kiln.pb-c.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- child processes ------------------------------------------------------------- */

typedef struct child {
  pid_t pid;
  char addr[128];
} child;

/* Starts argv and reads its stdout until a line "...listening on H:P". */
static int spawn(char *const *argv, const char *prefix, child *c) {
  int fd[2];
  if (pipe(fd)) return -1;
  c->pid = fork();
  if (c->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(fd[1], 1);
    close(fd[0]);
    execv(argv[0], argv);
    _exit(127);
  }
  close(fd[1]);
  FILE *f = fdopen(fd[0], "r");
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, prefix, strlen(prefix)) == 0) {
      char *a = strrchr(line, ' ');
      snprintf(c->addr, sizeof c->addr, "%s", a + 1);
      c->addr[strcspn(c->addr, "\r\n")] = '\0';
      return 0; /* the pipe stays open: the child may write more */
    }
  }
  return -1;
}

static void stop(child *c) {
  if (c->pid <= 0) return;
  kill(c->pid, SIGTERM);
  waitpid(c->pid, NULL, 0);
}

/* User plus system CPU seconds a process has used so far. */
static double cpu_seconds(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')'); /* the command name may hold spaces */
  unsigned long ut = 0, st = 0;
  if (p == NULL ||
      sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
    return 0;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static long rss_kib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) kib = atol(line + 6);
  if (f) fclose(f);
  return kib;
}

/* ---- latency statistics ------------------------------------------------------------ */

typedef struct lat {
  double *v;
  size_t n, cap;
} lat;

static void lat_add(lat *l, double x) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 4096;
    l->v = realloc(l->v, l->cap * sizeof *l->v);
  }
  l->v[l->n++] = x;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct result {
  double rps, p50_us, p99_us;
  double server_cpu_us; /* the server's CPU time per call */
  double client_cpu_us; /* this process's (the clients') CPU time per call */
  long calls, errors;
} result;

static void summarize(lat *all, int nthreads, double secs, long errors, result *r) {
  lat m = {0};
  for (int i = 0; i < nthreads; i++)
    for (size_t k = 0; k < all[i].n; k++) lat_add(&m, all[i].v[k]);
  qsort(m.v, m.n, sizeof *m.v, cmp_double);
  r->calls = (long)m.n;
  r->errors = errors;
  r->rps = (double)m.n / secs;
  r->p50_us = m.n ? m.v[m.n / 2] * 1e6 : 0;
  r->p99_us = m.n ? m.v[(size_t)((double)m.n * 0.99)] * 1e6 : 0;
  free(m.v);
}

/* ---- the two unary loads ------------------------------------------------------------- */

typedef struct load {
  const char *addr;
  const char *exe_id;
  const uint8_t *payload; /* the echo's request bytes */
  size_t payload_len;
  double seconds;
  long max_calls; /* 0: run for `seconds` */
  atomic_long *total;
  lat lat;
  long errors;
  char error[1400];
} load;

static void *kiln_worker(void *arg) {
  load *w = arg;
  kiln_client *c;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_connect(w->addr, NULL, &c, &st)) {
    w->errors++;
    snprintf(w->error, sizeof w->error, "%s", st.msg);
    return NULL;
  }
  kiln_arena *a = kiln_arena_create();
  kiln_shape s;
  int64_t n = 1024;
  kiln_shape_make_array(a, &s, KILN_F32, &n, 1);
  kiln_literal *x;
  kiln_literal_create(NULL, &s, 0, &x, NULL);
  for (int i = 0; i < 1024; i++) ((float *)x->data)[i] = (float)i;
  kiln_remote_arg args[1] = {{.literal = x}};
  double end = now() + w->seconds;
  for (long k = 0;; k++) {
    if (w->max_calls ? atomic_fetch_add(w->total, 1) >= w->max_calls : now() > end) break;
    double t0 = now();
    kiln_remote_result r;
    kiln_status_clear(&st);
    if (kiln_client_execute(c, w->exe_id, args, 1, NULL, &r, &st)) {
      if (w->errors++ == 0) snprintf(w->error, sizeof w->error, "%s: %s", st.where, st.msg);
      continue;
    }
    lat_add(&w->lat, now() - t0);
    kiln_remote_result_free(&r);
  }
  kiln_literal_destroy(x);
  kiln_arena_destroy(a);
  kiln_client_close(c);
  return NULL;
}

/* One unary call on the raw core, as libkiln makes them (a pluck queue per
 * call). */
static bool echo_once(grpc_channel *ch, void *reg, const uint8_t *p, size_t n) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_call *call = grpc_channel_create_registered_call(
      ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, reg,
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(30, GPR_TIMESPAN)), NULL);
  grpc_slice s = grpc_slice_from_copied_buffer((const char *)p, n);
  grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1), *recv = NULL;
  grpc_slice_unref(s);
  grpc_metadata_array imd, tmd;
  grpc_metadata_array_init(&imd);
  grpc_metadata_array_init(&tmd);
  grpc_status_code code;
  grpc_slice details;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &imd;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &tmd;
  ops[5].data.recv_status_on_client.status = &code;
  ops[5].data.recv_status_on_client.status_details = &details;
  grpc_call_start_batch(call, ops, 6, (void *)1, NULL);
  grpc_event ev =
      grpc_completion_queue_pluck(cq, (void *)1, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  bool ok = ev.success && code == GRPC_STATUS_OK && recv && grpc_byte_buffer_length(recv) == n;
  grpc_byte_buffer_destroy(send);
  if (recv) grpc_byte_buffer_destroy(recv);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&imd);
  grpc_metadata_array_destroy(&tmd);
  grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  return ok;
}

static void *echo_worker(void *arg) {
  load *w = arg;
  grpc_init();
  grpc_arg carg = {.type = GRPC_ARG_INTEGER,
                   .key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL,
                   .value.integer = 1};
  grpc_channel_args cargs = {.num_args = 1, .args = &carg};
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  grpc_channel *ch = grpc_channel_create(w->addr, creds, &cargs);
  grpc_channel_credentials_release(creds);
  void *reg = grpc_channel_register_call(ch, "/bench.Echo/Echo", NULL, NULL);
  double end = now() + w->seconds;
  while (now() < end) {
    double t0 = now();
    if (!echo_once(ch, reg, w->payload, w->payload_len)) {
      w->errors++;
      continue;
    }
    lat_add(&w->lat, now() - t0);
  }
  grpc_channel_destroy(ch);
  grpc_shutdown();
  return NULL;
}

static void run_load(void *(*fn)(void *), load *proto, int nthreads, pid_t server, result *r) {
  load *w = calloc((size_t)nthreads, sizeof *w);
  pthread_t *t = calloc((size_t)nthreads, sizeof *t);
  double cpu0 = cpu_seconds(server), self0 = cpu_seconds(getpid());
  double t0 = now();
  for (int i = 0; i < nthreads; i++) {
    w[i] = *proto;
    pthread_create(&t[i], NULL, fn, &w[i]);
  }
  long errors = 0;
  for (int i = 0; i < nthreads; i++) {
    pthread_join(t[i], NULL);
    errors += w[i].errors;
    if (w[i].errors)
      fprintf(stderr, "rpc_bench: client %d: %ld errors: %s\n", i, w[i].errors, w[i].error);
  }
  double secs = now() - t0;
  double cpu = cpu_seconds(server) - cpu0, self = cpu_seconds(getpid()) - self0;
  lat *all = calloc((size_t)nthreads, sizeof *all);
  for (int i = 0; i < nthreads; i++) all[i] = w[i].lat;
  summarize(all, nthreads, secs, errors, r);
  r->server_cpu_us = r->calls ? cpu / (double)r->calls * 1e6 : 0;
  r->client_cpu_us = r->calls ? self / (double)r->calls * 1e6 : 0;
  for (int i = 0; i < nthreads; i++) free(all[i].v);
  free(all);
  free(w);
  free(t);
}

/* ---- loopback TCP ------------------------------------------------------------------ */

typedef struct tcp_sink {
  int fd;
  size_t n;
  uint8_t *buf;
} tcp_sink;

static void *tcp_read_all(void *arg) {
  tcp_sink *s = arg;
  size_t got = 0;
  while (got < s->n) {
    ssize_t k = read(s->fd, s->buf + got, s->n - got);
    if (k <= 0) break;
    got += (size_t)k;
  }
  s->n = got;
  return NULL;
}

/* Seconds to move n bytes from one buffer to another over 127.0.0.1. */
static double tcp_copy(const uint8_t *src, uint8_t *dst, size_t n) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  bind(ls, (struct sockaddr *)&a, sizeof a);
  listen(ls, 1);
  getsockname(ls, (struct sockaddr *)&a, &al);
  int cs = socket(AF_INET, SOCK_STREAM, 0);
  connect(cs, (struct sockaddr *)&a, sizeof a);
  int ss = accept(ls, NULL, NULL);
  tcp_sink sink = {.fd = ss, .n = n, .buf = dst};
  pthread_t t;
  double t0 = now();
  pthread_create(&t, NULL, tcp_read_all, &sink);
  size_t sent = 0;
  while (sent < n) {
    ssize_t k = write(cs, src + sent, n - sent);
    if (k <= 0) break;
    sent += (size_t)k;
  }
  pthread_join(t, NULL);
  double secs = now() - t0;
  close(cs), close(ss), close(ls);
  return sink.n == n ? secs : -1;
}

/* ---- main ----------------------------------------------------------------------------- */

static const char negate_text[] = "HloModule negate4k\nENTRY main {\n"
                                  "  x = f32[1024] parameter(0)\n"
                                  "  ROOT y = f32[1024] negate(x)\n}\n";

static const char *opt(int argc, char **argv, const char *name, const char *dflt) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0) return argv[i + 1];
  return dflt;
}

static void fail(const char *what, const kiln_status *st) {
  fprintf(stderr, "rpc_bench: %s: %s: %s\n", what, st->where, st->msg);
  exit(1);
}

/* The Execute request's bytes, so that the echo moves the same payload. */
static uint8_t *execute_bytes(const char *id, size_t *len) {
  static float data[1024];
  Kiln__V1__Shape shape;
  kiln__v1__shape__init(&shape);
  shape.element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_F32;
  int64_t dim = 1024;
  shape.dimensions = &dim;
  shape.n_dimensions = 1;
  Kiln__V1__Literal lit;
  kiln__v1__literal__init(&lit);
  lit.shape = &shape;
  lit.data.data = (uint8_t *)data;
  lit.data.len = sizeof data;
  Kiln__V1__Argument arg, *argp = &arg;
  kiln__v1__argument__init(&arg);
  arg.value_case = KILN__V1__ARGUMENT__VALUE_LITERAL;
  arg.literal = &lit;
  Kiln__V1__ExecuteRequest req;
  kiln__v1__execute_request__init(&req);
  req.executable_id = (char *)id;
  req.arguments = &argp;
  req.n_arguments = 1;
  *len = kiln__v1__execute_request__get_packed_size(&req);
  uint8_t *buf = malloc(*len);
  kiln__v1__execute_request__pack(&req, buf);
  return buf;
}

static int cmp_result_ratio(const void *a, const void *b) {
  double x = ((const double *)a)[0], y = ((const double *)b)[0];
  return x < y ? -1 : x > y;
}

/* The round whose ratio is the median, and the spread of the ratios. */
typedef struct execute_summary {
  result echo, kilnd; /* of the median round */
  double ratio, ratio_min, ratio_max;
} execute_summary;

/* 1. Execute vs echo, `rounds` times, each round an echo load then a kilnd
 * load of `seconds` each (after a short warm-up of both), so that both
 * sides of every ratio saw about the same machine load. */
static void bench_execute(const child *k, const child *e, const char *exe_id,
                          const uint8_t *payload, size_t plen, int clients, double seconds,
                          int rounds, execute_summary *out) {
  atomic_long total = 0;
  load proto = {.addr = e->addr, .payload = payload, .payload_len = plen, .seconds = 0.5};
  load kproto = {.addr = k->addr, .exe_id = exe_id, .seconds = 0.5, .total = &total};
  result warm;
  run_load(echo_worker, &proto, clients, e->pid, &warm);
  run_load(kiln_worker, &kproto, clients, k->pid, &warm);
  proto.seconds = kproto.seconds = seconds;
  double(*r)[2] = calloc((size_t)rounds, sizeof *r); /* ratio, round index */
  result *re = calloc((size_t)rounds, sizeof *re), *rk = calloc((size_t)rounds, sizeof *rk);
  for (int i = 0; i < rounds; i++) {
    run_load(echo_worker, &proto, clients, e->pid, &re[i]);
    run_load(kiln_worker, &kproto, clients, k->pid, &rk[i]);
    r[i][0] = rk[i].rps / re[i].rps;
    r[i][1] = i;
    printf("  round %d: echo %6.0f calls/s (p50 %6.1f, p99 %7.1f us; CPU/call server %5.1f, "
           "clients %5.1f us), kilnd %6.0f calls/s (p50 %6.1f, p99 %7.1f us; CPU/call server "
           "%5.1f, clients %5.1f us): %.3f\n",
           i + 1, re[i].rps, re[i].p50_us, re[i].p99_us, re[i].server_cpu_us, re[i].client_cpu_us,
           rk[i].rps, rk[i].p50_us, rk[i].p99_us, rk[i].server_cpu_us, rk[i].client_cpu_us,
           r[i][0]);
    fflush(stdout);
  }
  qsort(r, (size_t)rounds, sizeof *r, cmp_result_ratio);
  int m = (int)r[rounds / 2][1];
  out->echo = re[m];
  out->kilnd = rk[m];
  out->ratio = r[rounds / 2][0];
  out->ratio_min = r[0][0];
  out->ratio_max = r[rounds - 1][0];
  free(r);
  free(re);
  free(rk);
}

typedef struct buffer_summary {
  double put_gbs, get_gbs, tcp_gbs;
  /* CPU seconds of kilnd and of the client during the fastest put / get */
  double put_cpu_server, put_cpu_client, get_cpu_server, get_cpu_client;
} buffer_summary;

/* 2. PutBuffer then GetBuffer of `mib` MiB, best of three, vs loopback TCP. */
static void bench_buffers(kiln_client *c, pid_t server, size_t mib, buffer_summary *out) {
  kiln_status st;
  kiln_status_clear(&st);
  size_t bytes = mib << 20;
  uint8_t *src = malloc(bytes), *dst = malloc(bytes);
  for (size_t i = 0; i < bytes; i++) src[i] = (uint8_t)(i * 131u);
  memset(dst, 0, bytes);
  kiln_arena *ar = kiln_arena_create();
  kiln_shape shape;
  int64_t n = (int64_t)(bytes / 4);
  kiln_shape_make_array(ar, &shape, KILN_F32, &n, 1);
  double best_put = 1e9, best_get = 1e9, best_tcp = 1e9;
  for (int rep = 0; rep < 3; rep++) {
    kiln_remote_buffer h;
    double s0 = cpu_seconds(server), c0 = cpu_seconds(getpid());
    double t0 = now();
    if (kiln_client_put_buffer_raw(c, &shape, src, bytes, NULL, &h, &st)) fail("put", &st);
    double t1 = now();
    double s1 = cpu_seconds(server), c1 = cpu_seconds(getpid());
    size_t got;
    kiln_remote_get_options go = {.release = true};
    if (kiln_client_get_buffer_raw(c, h.handle, &go, dst, bytes, &got, NULL, &st)) fail("get", &st);
    double t2 = now();
    double s2 = cpu_seconds(server), c2 = cpu_seconds(getpid());
    if (got != bytes || memcmp(src, dst, bytes) != 0) fprintf(stderr, "rpc_bench: data differs\n");
    memset(dst, 0, bytes);
    kiln_remote_buffer_clear(&h);
    if (t1 - t0 < best_put) {
      best_put = t1 - t0;
      out->put_cpu_server = s1 - s0;
      out->put_cpu_client = c1 - c0;
    }
    if (t2 - t1 < best_get) {
      best_get = t2 - t1;
      out->get_cpu_server = s2 - s1;
      out->get_cpu_client = c2 - c1;
    }
    double tt = tcp_copy(src, dst, bytes);
    if (tt > 0 && tt < best_tcp) best_tcp = tt;
  }
  out->put_gbs = (double)bytes / best_put / 1e9;
  out->get_gbs = (double)bytes / best_get / 1e9;
  out->tcp_gbs = (double)bytes / best_tcp / 1e9;
  free(src);
  free(dst);
  kiln_arena_destroy(ar);
}

/* 3. kilnd's RSS after warm-up and after each quarter of n executes. */
static void bench_rss(const child *k, const char *exe_id, int clients, long n, long rss[5]) {
  atomic_long total = 0;
  rss[0] = rss_kib(k->pid);
  for (int q = 1; q <= 4; q++) {
    atomic_store(&total, 0);
    load rp = {.addr = k->addr, .exe_id = exe_id, .max_calls = n / 4, .total = &total};
    result rr;
    run_load(kiln_worker, &rp, clients, k->pid, &rr);
    rss[q] = rss_kib(k->pid);
  }
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const char *kilnd = opt(argc, argv, "--kilnd", getenv("KILND"));
  const char *echo = opt(argc, argv, "--echo", NULL);
  int clients = atoi(opt(argc, argv, "--clients", "8"));
  double seconds = atof(opt(argc, argv, "--seconds", "5"));
  int rounds = atoi(opt(argc, argv, "--rounds", "1"));
  size_t mib = (size_t)atol(opt(argc, argv, "--mib", "256"));
  long rss_n = atol(opt(argc, argv, "--rss-executes", "100000"));
  const char *backend = opt(argc, argv, "--backend", "cpu");
  int64_t chunk_kib = atol(opt(argc, argv, "--chunk-kib", "1024"));
  if (kilnd == NULL || echo == NULL || clients < 1 || rounds < 1) {
    fprintf(stderr, "usage: rpc_bench --kilnd PATH --echo PATH [--clients N] [--seconds S] "
                    "[--rounds R] [--mib M (0: skip)] [--rss-executes N (0: skip)] "
                    "[--backend cpu|interp] [--chunk-kib K]\n");
    return 2;
  }
  char *kargv[] = {(char *)kilnd, "--listen", "127.0.0.1:0", "--metrics-listen", "off", NULL};
  char *eargv[] = {(char *)echo, "--listen", "127.0.0.1:0", NULL};
  child k = {0}, e = {0};
  if (spawn(kargv, "kilnd: listening on ", &k) || spawn(eargv, "echo: listening on ", &e)) {
    fprintf(stderr, "rpc_bench: cannot start kilnd or the echo server\n");
    return 1;
  }
  fprintf(stderr, "rpc_bench: kilnd at %s, echo at %s\n", k.addr, e.addr);

  kiln_client *c;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_client_options copts = {.chunk_bytes = chunk_kib << 10};
  if (kiln_client_connect(k.addr, &copts, &c, &st)) fail("connect", &st);
  kiln_remote_compile_options co = {.backend = backend};
  kiln_remote_executable *exe;
  if (kiln_client_compile_text(c, negate_text, sizeof negate_text - 1, &co, &exe, &st))
    fail("compile", &st);
  size_t plen;
  uint8_t *payload = execute_bytes(exe->id, &plen);

  printf("Execute f32[1024] -> f32[1024] (%s backend, %zu-byte request), %d clients, "
         "%d round(s) of %.0f s:\n",
         backend, plen, clients, rounds, seconds);
  execute_summary ex;
  bench_execute(&k, &e, exe->id, payload, plen, clients, seconds, rounds, &ex);
  const result *re = &ex.echo, *rk = &ex.kilnd;
  printf("  median round:\n");
  printf("  echo    %9.0f calls/s  p50 %7.1f us  p99 %7.1f us  CPU/call server %5.1f, clients "
         "%5.1f us  (%ld calls, %ld errors)\n",
         re->rps, re->p50_us, re->p99_us, re->server_cpu_us, re->client_cpu_us, re->calls,
         re->errors);
  printf("  kilnd   %9.0f calls/s  p50 %7.1f us  p99 %7.1f us  CPU/call server %5.1f, clients "
         "%5.1f us  (%ld calls, %ld errors)\n",
         rk->rps, rk->p50_us, rk->p99_us, rk->server_cpu_us, rk->client_cpu_us, rk->calls,
         rk->errors);
  printf("  ratio   %9.3f (throughput kilnd/echo; rounds %.3f to %.3f), p50 %.2fx, p99 %.2fx\n",
         ex.ratio, ex.ratio_min, ex.ratio_max, rk->p50_us / re->p50_us, rk->p99_us / re->p99_us);

  buffer_summary bs = {0};
  if (mib > 0) {
    bench_buffers(c, k.pid, mib, &bs);
    printf("%zu MiB buffer (%lld KiB chunks), best of 3:\n", mib, (long long)chunk_kib);
    printf("  PutBuffer %6.2f GB/s, GetBuffer %6.2f GB/s, loopback TCP copy %6.2f GB/s\n",
           bs.put_gbs, bs.get_gbs, bs.tcp_gbs);
    printf("  ratio     put %.3f, get %.3f of TCP\n", bs.put_gbs / bs.tcp_gbs,
           bs.get_gbs / bs.tcp_gbs);
    printf("  CPU s     put: kilnd %.2f, client %.2f; get: kilnd %.2f, client %.2f (%.2f / %.2f "
           "s wall)\n",
           bs.put_cpu_server, bs.put_cpu_client, bs.get_cpu_server, bs.get_cpu_client,
           (double)(mib << 20) / bs.put_gbs / 1e9, (double)(mib << 20) / bs.get_gbs / 1e9);
  }

  long rss[5] = {0};
  if (rss_n > 0) {
    bench_rss(&k, exe->id, clients, rss_n, rss);
    printf("kilnd RSS over %ld executes (KiB): %ld -> %ld -> %ld -> %ld -> %ld (%+.1f%%)\n", rss_n,
           rss[0], rss[1], rss[2], rss[3], rss[4],
           100.0 * (double)(rss[4] - rss[0]) / (double)rss[0]);
  }
  printf("{\"bench\":\"rpc\",\"clients\":%d,\"rounds\":%d,\"echo_rps\":%.0f,\"echo_p50_us\":%.1f,"
         "\"echo_p99_us\":%.1f,\"echo_cpu_us\":%.1f,\"execute_rps\":%.0f,"
         "\"execute_p50_us\":%.1f,\"execute_p99_us\":%.1f,\"execute_cpu_us\":%.1f,"
         "\"ratio\":%.3f,\"ratio_min\":%.3f,\"ratio_max\":%.3f,\"put_gbs\":%.3f,"
         "\"get_gbs\":%.3f,\"tcp_gbs\":%.3f,\"rss_kib\":[%ld,%ld,%ld,%ld,%ld]}\n",
         clients, rounds, re->rps, re->p50_us, re->p99_us, re->server_cpu_us, rk->rps, rk->p50_us,
         rk->p99_us, rk->server_cpu_us, ex.ratio, ex.ratio_min, ex.ratio_max, bs.put_gbs,
         bs.get_gbs, bs.tcp_gbs, rss[0], rss[1], rss[2], rss[3], rss[4]);
  free(payload);
  kiln_remote_executable_free(exe);
  kiln_client_close(c);
  stop(&k);
  stop(&e);
  return 0;
}
