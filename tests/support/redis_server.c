/* A real redis-server for tests (redis_server.h).
 *
 * The server is a child process with its own temporary directory (working
 * directory, log, unix socket), started on a port the kernel just handed out
 * for a moment. Another process can take that port in between, so a start
 * whose server exits before answering PING is retried on a new port. The
 * child asks to be killed when this process dies, so a crashed test leaves no
 * server behind; stop, kill, pause and restart act on the pid we keep.
 */
#include "tests/support/redis_server.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"

#define READY_TIMEOUT_MS 10000
#define START_ATTEMPTS 5
#define MAX_ARGS 64

struct kiln_test_redis {
  pid_t pid; /* 0 while not running */
  uint16_t port;
  char addr[32];
  char dir[64];   /* mkdtemp'd; removed by destroy */
  char sock[96];  /* dir/redis.sock */
  char *bin;      /* resolved path of redis-server */
  char *password; /* from --requirepass among the extra args, or NULL */
  char **extra;   /* owned copies, NULL-terminated */
  char conf[96];  /* dir/redis.conf when started with a config text, else "" */
};

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* kiln_malloc'd path of the redis-server binary, or NULL. */
static char *find_binary(void) {
  const char *env = getenv("KILN_REDIS_SERVER");
  if (env && env[0]) return access(env, X_OK) == 0 ? kiln_strdup(env) : NULL;
  const char *path = getenv("PATH");
  if (!path || !path[0]) path = "/usr/local/bin:/usr/bin:/bin";
  for (const char *p = path; *p;) {
    const char *colon = strchr(p, ':');
    size_t n = colon ? (size_t)(colon - p) : strlen(p);
    char buf[4096];
    if (n > 0 && n + sizeof("/redis-server") < sizeof buf) {
      snprintf(buf, sizeof buf, "%.*s/redis-server", (int)n, p);
      if (access(buf, X_OK) == 0) return kiln_strdup(buf);
    }
    p += n;
    if (*p == ':') p++;
  }
  return NULL;
}

bool kiln_test_redis_available(const char **why) {
  char *bin = find_binary();
  if (!bin) {
    if (why) {
      *why = getenv("KILN_REDIS_SERVER") && getenv("KILN_REDIS_SERVER")[0]
                 ? "KILN_REDIS_SERVER does not name an executable"
                 : "redis-server is not installed (not on PATH)";
    }
    return false;
  }
  kiln_free(bin);
  return true;
}

/* A loopback socket bound to a kernel-chosen port; fd or -1. */
static int bind_any_port(uint16_t *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(sa.sin_port);
  return fd;
}

uint16_t kiln_test_free_port(void) {
  uint16_t port = 0;
  int fd = bind_any_port(&port);
  if (fd < 0) return 0;
  close(fd);
  return port;
}

int kiln_test_silent_listener(uint16_t *port) {
  int fd = bind_any_port(port);
  if (fd < 0) return -1;
  if (listen(fd, 64) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* fork + exec of the server on r->port; argv is built before the fork so the
 * child only calls async-signal-safe functions. */
static int spawn(kiln_test_redis *r) {
  char port[8], log[128], out[128];
  snprintf(port, sizeof port, "%u", (unsigned)r->port);
  snprintf(log, sizeof log, "%s/redis.log", r->dir);
  snprintf(out, sizeof out, "%s/redis.out", r->dir);
  const char *argv[MAX_ARGS + 24];
  int n = 0;
  const char *fixed[] = {
      r->bin,  "--port",           port, "--bind", "127.0.0.1", "--save",    "",  "--appendonly",
      "no",    "--daemonize",      "no", "--dir",  r->dir,      "--logfile", log, "--unixsocket",
      r->sock, "--unixsocketperm", "700"};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
    argv[n++] = fixed[i];
    if (i == 0 && r->conf[0]) argv[n++] = r->conf; /* a config file comes first */
  }
  for (int i = 0; r->extra[i] && i < MAX_ARGS; i++) argv[n++] = r->extra[i];
  argv[n] = NULL;

  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int devnull = open("/dev/null", O_RDONLY);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
    if (devnull >= 0) dup2(devnull, 0);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    long maxfd = sysconf(_SC_OPEN_MAX);
    if (maxfd < 0 || maxfd > 4096) maxfd = 4096;
    for (int i = 3; i < maxfd; i++) close(i);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execv(r->bin, (char *const *)argv);
    _exit(127);
  }
  r->pid = pid;
  return 0;
}

/* Connects to the server (AUTH when needed) with the given timeout. */
static redisContext *connect_to(const kiln_test_redis *r, int timeout_ms) {
  struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
  if (!c) return NULL;
  if (c->err || redisSetTimeout(c, tv) != REDIS_OK) {
    redisFree(c);
    return NULL;
  }
  if (r->password) {
    redisReply *rep = redisCommand(c, "AUTH %s", r->password);
    bool ok = rep && rep->type == REDIS_REPLY_STATUS;
    if (rep) freeReplyObject(rep);
    if (!ok) {
      redisFree(c);
      return NULL;
    }
  }
  return c;
}

static bool answers_ping(const kiln_test_redis *r) {
  redisContext *c = connect_to(r, 500);
  if (!c) return false;
  redisReply *rep = redisCommand(c, "PING");
  bool ok = rep && rep->type == REDIS_REPLY_STATUS && strcmp(rep->str, "PONG") == 0;
  if (rep) freeReplyObject(rep);
  redisFree(c);
  return ok;
}

/* Reaps the child if it exited; true when it is gone. */
static bool reap_if_exited(kiln_test_redis *r) {
  if (r->pid <= 0) return true;
  int ws;
  pid_t got = waitpid(r->pid, &ws, WNOHANG);
  if (got == r->pid || (got < 0 && errno == ECHILD)) {
    r->pid = 0;
    return true;
  }
  return false;
}

/* 1: ready; 0: the server exited (port taken, bad arguments); -1: it runs but
 * never answered (it is killed). */
static int wait_ready(kiln_test_redis *r) {
  int64_t deadline = now_ms() + READY_TIMEOUT_MS;
  while (now_ms() < deadline) {
    if (reap_if_exited(r)) return 0;
    /* Check the pid again after PING: another process could own the port. */
    if (answers_ping(r) && !reap_if_exited(r)) return 1;
    sleep_ms(20);
  }
  kiln_test_redis_kill(r);
  return -1;
}

/* The last line of the server's output, for a failure message. */
static void last_output_line(const kiln_test_redis *r, char *buf, size_t size) {
  buf[0] = 0;
  const char *names[] = {"redis.out", "redis.log"};
  for (int i = 0; i < 2 && !buf[0]; i++) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", r->dir, names[i]);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    char line[512];
    while (fgets(line, sizeof line, f)) {
      size_t n = strlen(line);
      while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
      if (n) snprintf(buf, size, "%s", line);
    }
    fclose(f);
  }
}

/* Starts on r->port, or on fresh ports when pick_port (START_ATTEMPTS tries). */
static int launch(kiln_test_redis *r, bool pick_port, kiln_status *st) {
  char last[512] = "";
  for (int attempt = 0; attempt < START_ATTEMPTS; attempt++) {
    if (pick_port) {
      r->port = kiln_test_free_port();
      if (!r->port) return kiln_status_set(st, KILN_EIO, "redis-server", "no free port");
      snprintf(r->addr, sizeof r->addr, "127.0.0.1:%u", (unsigned)r->port);
    }
    if (spawn(r) != 0) {
      return kiln_status_set(st, KILN_EIO, "redis-server", "fork: %s", strerror(errno));
    }
    int ready = wait_ready(r);
    if (ready == 1) return 0;
    last_output_line(r, last, sizeof last);
    if (ready < 0) break;
    if (!pick_port) sleep_ms(100); /* the same port: give the old socket a moment */
  }
  return kiln_status_set(st, KILN_EUNAVAIL, "redis-server", "did not answer PING on port %u: %s",
                         (unsigned)r->port, last[0] ? last : "no output");
}

int kiln_test_redis_start(const char *const *extra_args, kiln_test_redis **out, kiln_status *st) {
  return kiln_test_redis_start_conf(NULL, extra_args, out, st);
}

int kiln_test_redis_start_conf(const char *conf_text, const char *const *extra_args,
                               kiln_test_redis **out, kiln_status *st) {
  *out = NULL;
  size_t n = 0;
  while (extra_args && extra_args[n]) n++;
  if (n > MAX_ARGS) return kiln_status_set(st, KILN_EINVAL, "redis-server", "too many arguments");
  kiln_test_redis *r = kiln_calloc(1, sizeof *r);
  if (!r) return kiln_status_set(st, KILN_ENOMEM, "redis-server", "out of memory");
  r->extra = kiln_calloc(n + 1, sizeof *r->extra);
  r->bin = find_binary();
  if (!r->extra || !r->bin) {
    kiln_test_redis_destroy(r);
    return kiln_status_set(st, KILN_EUNAVAIL, "redis-server",
                           "redis-server is not installed (not on PATH)");
  }
  for (size_t i = 0; i < n; i++) {
    r->extra[i] = kiln_strdup(extra_args[i]);
    if (i > 0 && strcmp(extra_args[i - 1], "--requirepass") == 0) r->password = r->extra[i];
  }
  snprintf(r->dir, sizeof r->dir, "/tmp/kiln-redis-XXXXXX");
  if (!mkdtemp(r->dir)) {
    r->dir[0] = 0;
    kiln_test_redis_destroy(r);
    return kiln_status_set(st, KILN_EIO, "redis-server", "mkdtemp: %s", strerror(errno));
  }
  snprintf(r->sock, sizeof r->sock, "%s/redis.sock", r->dir);
  if (conf_text) {
    snprintf(r->conf, sizeof r->conf, "%s/redis.conf", r->dir);
    FILE *f = fopen(r->conf, "w");
    bool ok = f && fputs(conf_text, f) >= 0;
    if (f && fclose(f) != 0) ok = false;
    if (!ok) {
      kiln_test_redis_destroy(r);
      return kiln_status_set(st, KILN_EIO, "redis-server", "cannot write its config file");
    }
  }
  int rc = launch(r, true, st);
  if (rc != 0) {
    kiln_test_redis_destroy(r);
    return rc;
  }
  *out = r;
  return 0;
}

static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

void kiln_test_redis_destroy(kiln_test_redis *r) {
  if (!r) return;
  kiln_test_redis_stop(r);
  if (r->dir[0]) remove_dir(r->dir);
  for (size_t i = 0; r->extra && r->extra[i]; i++) kiln_free(r->extra[i]);
  kiln_free(r->extra);
  kiln_free(r->bin);
  kiln_free(r);
}

const char *kiln_test_redis_addr(const kiln_test_redis *r) { return r->addr; }
uint16_t kiln_test_redis_port(const kiln_test_redis *r) { return r->port; }
const char *kiln_test_redis_socket(const kiln_test_redis *r) { return r->sock; }
pid_t kiln_test_redis_pid(const kiln_test_redis *r) { return r->pid; }

/* Sends sig (after SIGCONT, so a paused server can act on it) and waits up
 * to grace_ms before SIGKILL. */
static void terminate(kiln_test_redis *r, int sig, int grace_ms) {
  if (!r || r->pid <= 0) return;
  kill(r->pid, sig);
  if (sig != SIGKILL) kill(r->pid, SIGCONT);
  int64_t deadline = now_ms() + grace_ms;
  while (!reap_if_exited(r)) {
    if (now_ms() >= deadline) {
      kill(r->pid, SIGKILL);
      waitpid(r->pid, NULL, 0);
      r->pid = 0;
      return;
    }
    sleep_ms(5);
  }
}

void kiln_test_redis_stop(kiln_test_redis *r) { terminate(r, SIGTERM, 5000); }
void kiln_test_redis_kill(kiln_test_redis *r) { terminate(r, SIGKILL, 5000); }

void kiln_test_redis_pause(kiln_test_redis *r) {
  if (r && r->pid > 0) kill(r->pid, SIGSTOP);
}

void kiln_test_redis_resume(kiln_test_redis *r) {
  if (r && r->pid > 0) kill(r->pid, SIGCONT);
}

int kiln_test_redis_restart(kiln_test_redis *r, kiln_status *st) {
  kiln_test_redis_stop(r);
  return launch(r, false, st);
}

struct redisReply *kiln_test_redis_command(kiln_test_redis *r, const char *fmt, ...) {
  redisContext *c = connect_to(r, 2000);
  if (!c) return NULL;
  va_list ap;
  va_start(ap, fmt);
  redisReply *rep = redisvCommand(c, fmt, ap);
  va_end(ap);
  redisFree(c);
  return rep;
}
