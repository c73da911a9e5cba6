/* The system C compiler as a child process.
 *
 * posix_spawn with three pipes' worth of plumbing: the source goes in on
 * stdin, stdout and stderr come back on one pipe, and a poll loop feeds
 * one and drains the other against a deadline. The child leads its own
 * process group so that a timeout kills the driver and everything it
 * started (cc1, as, ld). The object is written into a private temporary
 * directory (mode 0700), read back, and the directory removed, whatever
 * happened. SIGPIPE (the compiler quitting before reading all of its
 * input) is blocked on this thread and consumed, never delivered.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "compiler/codegen/cc.h"

extern char **environ;

#define OUT_MAX 65536 /* compiler output kept for the message */
#define MSG_MAX 800   /* of which the status shows the start */

typedef struct child {
  pid_t pid;
  int in, out; /* parent ends: write source, read diagnostics */
} child;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The environment with TMPDIR pointing into our private directory, so that
 * whatever a killed compiler leaves behind is removed with it. */
static char **child_env(const char *dir) {
  size_t n = 0;
  while (environ && environ[n]) n++;
  char **env = kiln_calloc(n + 2, sizeof *env);
  if (env == NULL) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "TMPDIR=", 7) != 0) env[k++] = environ[i];
  size_t len = strlen(dir) + 8;
  env[k] = kiln_malloc(len);
  if (env[k] == NULL) {
    kiln_free(env);
    return NULL;
  }
  snprintf(env[k], len, "TMPDIR=%s", dir);
  return env;
}

static void free_env(char **env) {
  if (env == NULL) return;
  size_t k = 0;
  while (env[k]) k++;
  if (k) kiln_free(env[k - 1]);
  kiln_free(env);
}

/* Removes dir and the plain files in it. */
static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      char p[4400];
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
    closedir(d);
  }
  rmdir(dir);
}

static int spawn(const kiln__cc_options *o, const char *dir, const char *out_path, child *c,
                 kiln_status *st) {
  int pin[2] = {-1, -1}, pout[2] = {-1, -1};
  if (pipe2(pin, O_CLOEXEC) || pipe2(pout, O_CLOEXEC)) {
    int e = errno;
    if (pin[0] >= 0) close(pin[0]), close(pin[1]);
    return kiln_status_set(st, KILN_EIO, "cc", "cannot create pipes: %s", strerror(e));
  }
  char march[128];
  const char *cc = o->cc && *o->cc ? o->cc : "cc";
  const char *argv[28];
  int n = 0;
  argv[n++] = cc;
  argv[n++] = o->opt ? o->opt : "-O3";
  if (o->tune && *o->tune) argv[n++] = o->tune;
  if (o->march && *o->march) {
    snprintf(march, sizeof march, "-march=%s", o->march);
    argv[n++] = march;
  }
  const char *fixed[] = {"-pipe",
                         "-fPIC",
                         "-shared",
                         "-fno-math-errno",
                         "-ffp-contract=off",
                         "-fno-strict-aliasing",
                         "-w",
                         "-o",
                         out_path,
                         "-x",
                         "c",
                         "-",
                         "-lm"};
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) argv[n++] = fixed[i];
  argv[n] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&at);
  posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
  posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
  posix_spawn_file_actions_adddup2(&fa, pout[1], 2);
  posix_spawnattr_setpgroup(&at, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  char **env = child_env(dir);
  int e = env ? posix_spawnp(&c->pid, cc, &fa, &at, (char *const *)argv, env) : ENOMEM;
  free_env(env);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  close(pin[0]);
  close(pout[1]);
  if (e) {
    close(pin[1]);
    close(pout[0]);
    return kiln_status_set(st, e == ENOMEM ? KILN_ENOMEM : KILN_ENOTFOUND, "cc",
                           "cannot start the C compiler '%s': %s", cc, strerror(e));
  }
  c->in = pin[1];
  c->out = pout[0];
  fcntl(c->in, F_SETFL, fcntl(c->in, F_GETFL) | O_NONBLOCK);
  return 0;
}

/* Feeds the source and collects output until both pipes are done or the
 * deadline passes (then returns 1). */
static int pump(child *c, const char *src, size_t len, double deadline, char *out, size_t *nout) {
  size_t sent = 0;
  if (len == 0) close(c->in), c->in = -1;
  while (c->out >= 0) {
    struct pollfd p[2] = {{c->out, POLLIN, 0}, {c->in, POLLOUT, 0}};
    double left = deadline - now_s();
    if (left <= 0) return 1;
    int r = poll(p, c->in >= 0 ? 2 : 1, (int)(left * 1000) + 1);
    if (r < 0 && errno != EINTR) return 1;
    if (r <= 0) continue;
    if (p[0].revents) {
      char buf[4096];
      ssize_t k = read(c->out, buf, sizeof buf);
      if (k > 0) {
        size_t keep = *nout + (size_t)k > OUT_MAX ? OUT_MAX - *nout : (size_t)k;
        memcpy(out + *nout, buf, keep);
        *nout += keep;
      } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
        close(c->out);
        c->out = -1;
      }
    }
    if (c->in >= 0 && p[1].revents) {
      ssize_t k = write(c->in, src + sent, len - sent);
      if (k > 0) sent += (size_t)k;
      if ((k < 0 && errno != EAGAIN && errno != EINTR) || sent == len) {
        close(c->in);
        c->in = -1;
      }
    }
  }
  return 0;
}

static int read_file(const char *path, uint8_t **data, size_t *len, kiln_status *st) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0) {
    if (fd >= 0) close(fd);
    return kiln_status_set(st, KILN_EINTERNAL, "cc", "the C compiler wrote no object");
  }
  uint8_t *p = kiln_malloc(sb.st_size > 0 ? (size_t)sb.st_size : 1);
  size_t got = 0;
  while (p && got < (size_t)sb.st_size) {
    ssize_t k = read(fd, p + got, (size_t)sb.st_size - got);
    if (k <= 0) break;
    got += (size_t)k;
  }
  close(fd);
  if (p == NULL) return kiln_status_set(st, KILN_ENOMEM, "cc", "out of memory");
  if (got != (size_t)sb.st_size) {
    kiln_free(p);
    return kiln_status_set(st, KILN_EIO, "cc", "cannot read the compiled object");
  }
  *data = p;
  *len = got;
  return 0;
}

static int make_dir(char *dir, size_t size, kiln_status *st) {
  const char *t = getenv("TMPDIR");
  snprintf(dir, size, "%s/kiln-cc-XXXXXX", t && *t ? t : "/tmp");
  if (mkdtemp(dir) == NULL)
    return kiln_status_set(st, KILN_EIO, "cc", "cannot create a temporary directory: %s",
                           strerror(errno));
  return 0;
}

/* Waits for the child; a SIGPIPE raised on this thread while writing is
 * consumed here. */
static int finish(child *c, bool killed, int *status) {
  if (c->in >= 0) close(c->in);
  if (c->out >= 0) close(c->out);
  if (killed) kill(-c->pid, SIGKILL);
  while (waitpid(c->pid, status, 0) < 0 && errno == EINTR) {
  }
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  struct timespec zero = {0, 0};
  while (sigtimedwait(&pipe_set, NULL, &zero) > 0) {
  }
  return 0;
}

int kiln__cc_compile(const kiln__cc_options *o, const char *src, size_t len, uint8_t **so,
                     size_t *so_len, kiln_status *st) {
  *so = NULL;
  *so_len = 0;
  char dir[4096], path[4200];
  int rc = make_dir(dir, sizeof dir, st);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/k.so", dir);
  char *out = kiln_malloc(OUT_MAX + 1);
  if (out == NULL) {
    rmdir(dir);
    return kiln_status_set(st, KILN_ENOMEM, "cc", "out of memory");
  }
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  child c = {-1, -1, -1};
  size_t nout = 0;
  double limit = o->timeout_s > 0 ? o->timeout_s : 120;
  rc = spawn(o, dir, path, &c, st);
  if (rc == 0) {
    bool late = pump(&c, src, len, now_s() + limit, out, &nout) != 0;
    int status = 0;
    finish(&c, late, &status);
    out[nout] = 0;
    if (late)
      rc = kiln_status_set(st, KILN_ELIMIT, "cc", "the C compiler took longer than %.0f s", limit);
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      rc = kiln_status_set(st, KILN_EINTERNAL, "cc", "the C compiler failed (status %d): %.*s%s",
                           WIFEXITED(status) ? WEXITSTATUS(status) : -1, MSG_MAX, out,
                           nout > MSG_MAX ? "..." : "");
    else
      rc = read_file(path, so, so_len, st);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  remove_dir(dir);
  kiln_free(out);
  return rc;
}
