/* kiln top --server HOST:PORT [--once]: a live view of one server.
 *
 * Every second one Stats call (kiln_client_stats_activity) and one screen:
 * the compile pool (queued, running, its size and bound), the executable
 * cache (hit rate, memory tier), executions and buffers, the process's
 * resident memory, each device with how busy it was since the last screen,
 * and every compile queued or running with its phase. --once prints one
 * screen without clearing the terminal (device figures since the server
 * started) and exits: for scripts and tests. Ctrl-C ends the live view.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clients/cli/cli.h"

#ifdef KILN_HAVE_CLIENT

#include "clients/c/kiln.h"
#include "common/alloc.h"

static volatile sig_atomic_t stop;

static void on_interrupt(int sig) {
  (void)sig;
  stop = 1;
}

/* "12.3 MiB" */
static const char *bytes_text(int64_t n, char *buf, size_t size) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

/* Busy time per device at the previous screen, for the live figures. */
typedef struct previous {
  int64_t uptime_ns;
  uint32_t ndevices;
  int64_t busy_ns[256];
} previous;

static void print_screen(const char *server, const kiln_server_stats *s,
                         const kiln_server_activity *v, previous *prev) {
  char b1[32], b2[32];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  printf("kilnd %s at %s, up %.1f s, %04d-%02d-%02d %02d:%02d:%02d UTC\n", s->server_version,
         server, (double)s->uptime_ns / 1e9, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
         tm.tm_hour, tm.tm_min, tm.tm_sec);
  printf("compiles    queued %lld  running %lld  threads %lld  queue bound %lld  total %lld\n",
         (long long)v->compiles_queued, (long long)v->compiles_running,
         (long long)v->compile_threads, (long long)v->compile_queue_depth, (long long)s->compiles);
  printf("cache       hit rate %.1f%% (%lld hits, %lld misses)  memory %s of %s\n",
         v->cache_hit_rate * 100, (long long)s->cache_hits, (long long)s->cache_misses,
         bytes_text(v->cache_memory_bytes, b1, sizeof b1),
         bytes_text(v->cache_memory_limit_bytes, b2, sizeof b2));
  printf("executions  %lld  queued %lld\n", (long long)s->executions,
         (long long)s->queued_requests);
  printf("memory      resident %s  buffers %lld live, %s\n",
         bytes_text(v->resident_bytes, b1, sizeof b1), (long long)s->live_buffers,
         bytes_text(s->live_buffer_bytes, b2, sizeof b2));
  printf("\n%-4s %-24s %12s %10s %6s\n", "DEV", "DESCRIPTION", "EXECUTIONS", "BUSY S", "BUSY%");
  int64_t span = s->uptime_ns - prev->uptime_ns;
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const kiln_server_device *d = &s->devices[i];
    int64_t busy = d->busy_ns - (i < prev->ndevices ? prev->busy_ns[i] : 0);
    double pct = span > 0 ? 100.0 * (double)busy / (double)span : 0;
    if (pct > 100) pct = 100;
    if (pct < 0) pct = 0;
    printf("%-4d %-24s %12lld %10.3f %5.1f%%\n", d->device, d->description,
           (long long)d->executions, (double)d->busy_ns / 1e9, pct);
  }
  printf("\n%-16s %-24s %-8s %9s\n", "REQUEST", "CLIENT", "PHASE", "ELAPSED S");
  for (uint32_t i = 0; i < v->ncompiles; i++) {
    const kiln_server_active_compile *c = &v->compiles[i];
    printf("%-16s %-24s %-8s %9.1f\n", c->request_id, c->client, kiln_remote_phase_name(c->phase),
           (double)c->elapsed_ns / 1e9);
  }
  if (v->ncompiles == 0) printf("(no compiles)\n");
  prev->uptime_ns = s->uptime_ns;
  prev->ndevices = s->ndevices < 256 ? s->ndevices : 256;
  for (uint32_t i = 0; i < prev->ndevices; i++) prev->busy_ns[i] = s->devices[i].busy_ns;
}

int kiln__cmd_top(const kiln__args *a) {
  bool once = kiln__args_get(a, "once") != NULL;
  kiln_client *c;
  int rc = kiln__remote_connect(a, &c);
  if (rc) return rc;
  const char *server = kiln__args_get(a, "server");
  previous prev = {0};
  if (!once) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
  }
  while (!stop) {
    kiln_server_stats s;
    kiln_server_activity v;
    kiln_status st;
    kiln_status_clear(&st);
    if (kiln_client_stats_activity(c, &s, &v, &st)) {
      rc = kiln__remote_report("kiln top", &st);
      break;
    }
    if (!once) printf("\033[H\033[2J"); /* home, clear */
    print_screen(server, &s, &v, &prev);
    fflush(stdout);
    kiln_server_activity_clear(&v);
    kiln_server_stats_clear(&s);
    if (once) break;
    struct timespec sec = {.tv_sec = 1};
    nanosleep(&sec, NULL); /* a signal ends it early */
  }
  kiln_client_close(c);
  return rc;
}

#else /* !KILN_HAVE_CLIENT */

int kiln__cmd_top(const kiln__args *a) {
  (void)a;
  fprintf(stderr, "kiln top: this kiln was built without libkiln (no gRPC core found)\n");
  return KILN_EXIT_USAGE;
}

#endif
