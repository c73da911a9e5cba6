/* The integration tests' harness: kilnd as a child process, /metrics over
 * plain HTTP, the Prometheus text format, and running commands.
 *
 * kilnd's stdout and stderr go to files in a temporary directory rather
 * than pipes: a server that logs a lot can never block on a pipe nobody
 * reads, and the log is there to print when a test fails. The child asks
 * the kernel to kill it when the test process dies (PR_SET_PDEATHSIG), so
 * a crashed test leaves no server behind.
 */
#include "tests/integration/itest.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char itest_spin_hlo[] =
    "HloModule spin\n"
    "cond {\n  s = (s32[], s32[]) parameter(0)\n  i = s32[] get-tuple-element(s), index=0\n"
    "  n = s32[] get-tuple-element(s), index=1\n  ROOT lt = pred[] compare(i, n), direction=LT\n}\n"
    "body {\n  s = (s32[], s32[]) parameter(0)\n  i = s32[] get-tuple-element(s), index=0\n"
    "  n = s32[] get-tuple-element(s), index=1\n  one = s32[] constant(1)\n"
    "  i1 = s32[] add(i, one)\n  ROOT t = (s32[], s32[]) tuple(i1, n)\n}\n"
    "ENTRY main {\n  n = s32[] parameter(0)\n  zero = s32[] constant(0)\n"
    "  init = (s32[], s32[]) tuple(zero, n)\n"
    "  loop = (s32[], s32[]) while(init), condition=cond, body=body\n"
    "  ROOT i = s32[] get-tuple-element(loop), index=0\n}\n";

double itest_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

const char *itest_kilnd_path(void) {
  const char *p = getenv("KILND");
  if (p == NULL || p[0] == '\0' || access(p, X_OK) != 0) return NULL;
  return p;
}

void itest_require_kilnd(const char *test_name) {
  if (itest_kilnd_path()) return;
  printf("%s: skipped: kilnd is not built (env KILND=%s)\n", test_name,
         getenv("KILND") ? getenv("KILND") : "");
  exit(77);
}

/* ---- kilnd ------------------------------------------------------------------------- */

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    size_t k = fread(buf + n, 1, cap - n - 1, f);
    n += k;
    if (k == 0) break;
    if (cap - n - 1 == 0) {
      char *nb = realloc(buf, cap * 2);
      if (nb == NULL) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
  }
  fclose(f);
  if (buf) buf[n] = '\0';
  return buf;
}

/* The HOST:PORT at the end of a line like "kilnd: listening on H:P" or
 * "kilnd: metrics on http://H:P/metrics". */
static bool address_in(const char *line, size_t len, char *out, size_t size) {
  const char *end = line + len;
  while (end > line && (end[-1] == ' ' || end[-1] == '\r')) end--;
  const char *start = end;
  while (start > line && start[-1] != ' ') start--;
  if (end - start > 7 && strncmp(start, "http://", 7) == 0) start += 7;
  const char *slash = memchr(start, '/', (size_t)(end - start));
  if (slash) end = slash;
  const char *colon = NULL;
  for (const char *p = start; p < end; p++)
    if (*p == ':') colon = p;
  if (colon == NULL || colon + 1 >= end || (size_t)(end - start) >= size) return false;
  for (const char *p = colon + 1; p < end; p++)
    if (*p < '0' || *p > '9') return false;
  memcpy(out, start, (size_t)(end - start));
  out[end - start] = '\0';
  return true;
}

static void scan_output(itest_kilnd *k, const char *text) {
  for (const char *line = text; *line;) {
    const char *nl = strchr(line, '\n');
    if (nl == NULL) break; /* only whole lines */
    size_t len = (size_t)(nl - line);
    char buf[512];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < 511 ? len : 511), line);
    if (strstr(buf, "metrics")) {
      if (k->metrics[0] == '\0') address_in(buf, strlen(buf), k->metrics, sizeof k->metrics);
    } else if (strstr(buf, "listening on") && k->addr[0] == '\0') {
      address_in(buf, strlen(buf), k->addr, sizeof k->addr);
    }
    line = nl + 1;
  }
}

static void child_exec(const itest_kilnd *k, const char *const *extra) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  char out[300], err[300];
  snprintf(out, sizeof out, "%s/kilnd.out", k->dir);
  snprintf(err, sizeof err, "%s/kilnd.err", k->dir);
  int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fo < 0 || fe < 0) _exit(126);
  dup2(fo, 1);
  dup2(fe, 2);
  const char *argv[64];
  int n = 0;
  argv[n++] = itest_kilnd_path();
  argv[n++] = "--listen";
  argv[n++] = "127.0.0.1:0";
  argv[n++] = "--metrics-listen";
  argv[n++] = "127.0.0.1:0";
  for (int i = 0; extra && extra[i] && n < 63; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  execv(argv[0], (char *const *)argv);
  _exit(127);
}

int itest_kilnd_start(itest_kilnd *k, const char *const *extra) {
  memset(k, 0, sizeof *k);
  const char *path = itest_kilnd_path();
  if (path == NULL) {
    fprintf(stderr, "itest: kilnd not found (env KILND)\n");
    return -1;
  }
  snprintf(k->dir, sizeof k->dir, "/tmp/kiln-itest-XXXXXX");
  if (mkdtemp(k->dir) == NULL) {
    fprintf(stderr, "itest: mkdtemp: %s\n", strerror(errno));
    return -1;
  }
  fflush(NULL);
  k->pid = fork();
  if (k->pid < 0) return -1;
  if (k->pid == 0) child_exec(k, extra);
  char out[300];
  snprintf(out, sizeof out, "%s/kilnd.out", k->dir);
  double deadline = itest_now() + 60, found_at = 0;
  while (itest_now() < deadline) {
    char *text = read_file(out);
    if (text) scan_output(k, text);
    free(text);
    if (k->addr[0] && (k->metrics[0] || (found_at && itest_now() - found_at > 1.0))) return 0;
    if (k->addr[0] && found_at == 0) found_at = itest_now();
    if (!itest_kilnd_alive(k)) {
      fprintf(stderr, "itest: kilnd exited before listening\n");
      itest_kilnd_dump_log(k);
      return -1;
    }
    sleep_ms(20);
  }
  fprintf(stderr, "itest: kilnd printed no address within 60 s\n");
  itest_kilnd_dump_log(k);
  itest_kilnd_stop(k, SIGKILL, 5);
  return -1;
}

bool itest_kilnd_alive(const itest_kilnd *k) {
  if (k->pid <= 0) return false;
  int status;
  pid_t r = waitpid(k->pid, &status, WNOHANG);
  if (r == 0) return true;
  if (r == k->pid || errno != ECHILD) return false;
  /* A forked test case is not kilnd's parent: ask /proc, where a server
   * that died and awaits its parent's wait shows as a zombie. */
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)k->pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *paren = strrchr(buf, ')');
  return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

int itest_kilnd_stop(itest_kilnd *k, int sig, double timeout_s) {
  if (k->pid <= 0) return -1;
  kill(k->pid, sig);
  double deadline = itest_now() + timeout_s;
  int status = -1;
  for (;;) {
    pid_t r = waitpid(k->pid, &status, WNOHANG);
    if (r == k->pid) break;
    if (r < 0) {
      status = -1;
      break;
    }
    if (itest_now() > deadline) {
      kill(k->pid, SIGKILL);
      waitpid(k->pid, NULL, 0);
      status = -1;
      break;
    }
    sleep_ms(10);
  }
  k->pid = 0;
  return status;
}

void itest_kilnd_dump_log(const itest_kilnd *k) {
  char path[300];
  snprintf(path, sizeof path, "%s/kilnd.err", k->dir);
  char *text = read_file(path);
  fprintf(stderr, "---- kilnd stderr (%s) ----\n%s\n----\n", path, text ? text : "(none)");
  free(text);
}

/* ---- HTTP ---------------------------------------------------------------------------- */

int itest_http_get(const char *addr, const char *path, int *status, char **body, size_t *len) {
  *status = 0;
  *body = NULL;
  *len = 0;
  char host[128];
  snprintf(host, sizeof host, "%s", addr);
  char *colon = strrchr(host, ':');
  if (colon == NULL) return -1;
  *colon = '\0';
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
  if (getaddrinfo(host, colon + 1, &hints, &ai)) return -1;
  int fd = socket(ai->ai_family, SOCK_STREAM, 0);
  int rc = fd < 0 ? -1 : connect(fd, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  if (rc) {
    if (fd >= 0) close(fd);
    return -1;
  }
  char req[512];
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
                   path, addr);
  if (write(fd, req, (size_t)n) != n) {
    close(fd);
    return -1;
  }
  size_t cap = 65536, got = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (buf == NULL) break;
    if (cap - got < 4096) {
      char *nb = realloc(buf, cap * 2);
      if (nb == NULL) break;
      buf = nb;
      cap *= 2;
    }
    ssize_t k = read(fd, buf + got, cap - got - 1);
    if (k <= 0) break;
    got += (size_t)k;
  }
  close(fd);
  if (buf == NULL) return -1;
  buf[got] = '\0';
  char *sep = strstr(buf, "\r\n\r\n");
  if (sep == NULL || sscanf(buf, "HTTP/1.%*d %d", status) != 1) {
    free(buf);
    return -1;
  }
  size_t blen = got - (size_t)(sep + 4 - buf);
  memmove(buf, sep + 4, blen + 1);
  *body = buf;
  *len = blen;
  return 0;
}

/* ---- Prometheus text format ------------------------------------------------------------- */

static bool name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
static bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }

static int metrics_error(char *err, size_t errlen, int line, const char *msg) {
  snprintf(err, errlen, "line %d: %s", line, msg);
  return -1;
}

/* label="value",... up to the closing brace; *p is after '{'. */
static int parse_labels(const char **p, char *out, size_t size, char *err, size_t errlen,
                        int line) {
  const char *s = *p, *start = s;
  while (*s != '}') {
    if (!name_start(*s) || *s == ':') return metrics_error(err, errlen, line, "bad label name");
    while (name_char(*s) && *s != ':') s++;
    if (*s++ != '=') return metrics_error(err, errlen, line, "label without '='");
    if (*s++ != '"') return metrics_error(err, errlen, line, "label value not quoted");
    while (*s != '"') {
      if (*s == '\0' || *s == '\n')
        return metrics_error(err, errlen, line, "unterminated label value");
      if (*s == '\\') {
        s++;
        if (*s != '\\' && *s != '"' && *s != 'n')
          return metrics_error(err, errlen, line, "bad escape in label value");
      }
      s++;
    }
    s++;
    if (*s == ',')
      s++;
    else if (*s != '}')
      return metrics_error(err, errlen, line, "expected ',' or '}' after a label");
  }
  size_t n = (size_t)(s - start);
  if (n >= size) return metrics_error(err, errlen, line, "labels too long");
  memcpy(out, start, n);
  out[n] = '\0';
  *p = s + 1;
  return 0;
}

static int parse_value(const char **p, double *v) {
  const char *s = *p;
  if (strncmp(s, "+Inf", 4) == 0 || strncmp(s, "Inf", 3) == 0) {
    *v = INFINITY;
    *p = s + (s[0] == '+' ? 4 : 3);
    return 0;
  }
  if (strncmp(s, "-Inf", 4) == 0) {
    *v = -INFINITY;
    *p = s + 4;
    return 0;
  }
  if (strncmp(s, "NaN", 3) == 0) {
    *v = NAN;
    *p = s + 3;
    return 0;
  }
  char *end;
  errno = 0;
  *v = strtod(s, &end);
  if (end == s || errno == ERANGE) return -1;
  *p = end;
  return 0;
}

static int parse_comment(const char *s, int line, itest_metrics *m, char *err, size_t errlen) {
  if (strncmp(s, "# TYPE ", 7) == 0) {
    s += 7;
    if (!name_start(*s)) return metrics_error(err, errlen, line, "bad metric name in TYPE");
    while (name_char(*s)) s++;
    if (*s++ != ' ') return metrics_error(err, errlen, line, "TYPE without a type");
    static const char *const types[] = {"counter", "gauge", "histogram", "summary", "untyped"};
    for (size_t i = 0; i < 5; i++) {
      size_t n = strlen(types[i]);
      if (strncmp(s, types[i], n) == 0 && (s[n] == '\n' || s[n] == '\0')) {
        m->ntypes++;
        return 0;
      }
    }
    return metrics_error(err, errlen, line, "unknown metric type");
  }
  if (strncmp(s, "# HELP ", 7) == 0 && name_start(s[7])) return 0;
  return 0; /* other comments are free text */
}

int itest_metrics_parse(const char *text, itest_metrics *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  size_t cap = 0;
  int line = 0;
  for (const char *s = text; *s;) {
    line++;
    const char *nl = strchr(s, '\n');
    if (nl == NULL) return metrics_error(err, errlen, line, "last line has no newline");
    if (*s == '#') {
      if (parse_comment(s, line, m, err, errlen)) return -1;
      s = nl + 1;
      continue;
    }
    if (s == nl) {
      s = nl + 1;
      continue;
    }
    if (m->n == cap) {
      cap = cap ? cap * 2 : 256;
      itest_sample *ns = realloc(m->samples, cap * sizeof *ns);
      if (ns == NULL) return metrics_error(err, errlen, line, "out of memory");
      m->samples = ns;
    }
    itest_sample *x = &m->samples[m->n];
    memset(x, 0, sizeof *x);
    if (!name_start(*s)) return metrics_error(err, errlen, line, "bad metric name");
    const char *start = s;
    while (name_char(*s)) s++;
    if ((size_t)(s - start) >= sizeof x->name)
      return metrics_error(err, errlen, line, "name too long");
    memcpy(x->name, start, (size_t)(s - start));
    if (*s == '{') {
      s++;
      if (parse_labels(&s, x->labels, sizeof x->labels, err, errlen, line)) return -1;
    }
    if (*s++ != ' ') return metrics_error(err, errlen, line, "expected a space before the value");
    if (parse_value(&s, &x->value)) return metrics_error(err, errlen, line, "bad value");
    if (*s == ' ') { /* optional timestamp */
      s++;
      char *end;
      strtoll(s, &end, 10);
      if (end == s) return metrics_error(err, errlen, line, "bad timestamp");
      s = end;
    }
    if (s != nl) return metrics_error(err, errlen, line, "trailing characters");
    m->n++;
    s = nl + 1;
  }
  return 0;
}

void itest_metrics_free(itest_metrics *m) {
  free(m->samples);
  memset(m, 0, sizeof *m);
}

double itest_metrics_value(const itest_metrics *m, const char *name, const char *labels_sub) {
  for (size_t i = 0; i < m->n; i++)
    if (strcmp(m->samples[i].name, name) == 0 &&
        (labels_sub == NULL || strstr(m->samples[i].labels, labels_sub)))
      return m->samples[i].value;
  return NAN;
}

double itest_metrics_sum(const itest_metrics *m, const char *name) {
  double s = 0;
  for (size_t i = 0; i < m->n; i++)
    if (strcmp(m->samples[i].name, name) == 0) s += m->samples[i].value;
  return s;
}

/* ---- commands -------------------------------------------------------------------------- */

static void append(char **buf, size_t *len, const char *data, size_t n) {
  char *nb = realloc(*buf, *len + n + 1);
  if (nb == NULL) return;
  memcpy(nb + *len, data, n);
  *len += n;
  nb[*len] = '\0';
  *buf = nb;
}

int itest_run(char *const *argv, char **out, char **err) {
  int po[2], pe[2];
  *out = calloc(1, 1);
  *err = calloc(1, 1);
  if (pipe(po) || pipe(pe)) return -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(po[0]);
    close(pe[0]);
    execv(argv[0], argv);
    _exit(127);
  }
  close(po[1]);
  close(pe[1]);
  size_t lo = 0, le = 0;
  struct pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds) {
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t k = read(fds[i].fd, buf, sizeof buf);
      if (k > 0) {
        append(i ? err : out, i ? &le : &lo, buf, (size_t)k);
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        open_fds--;
      }
    }
  }
  int status;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int itest_run_suite(const char *test_name, Suite *s, itest_kilnd *k) {
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  if (!itest_kilnd_alive(k)) {
    fprintf(stderr, "%s: kilnd died during the tests\n", test_name);
    failed++;
  }
  int status = itest_kilnd_stop(k, SIGTERM, 30);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "%s: kilnd did not exit 0 after SIGTERM (status %d)\n", test_name, status);
    failed++;
  }
  if (failed) itest_kilnd_dump_log(k);
  return failed ? 1 : 0;
}
