/* NVRTC (nvrtc.h): libnvrtc opened with dlopen at first use, so that Kiln
 * builds and runs where the CUDA toolkit is absent (the CUDA target then
 * answers KILN_EUNAVAIL) and needs no toolkit header at build time: the few
 * entry points are declared here with their stable C ABI (nvrtcResult is
 * an int, nvrtcProgram an opaque pointer).
 *
 * A compile runs in a forked child: NVRTC cannot be interrupted, and a
 * compile that never ends must not hold a server thread, so the parent
 * waits on a pipe against the deadline and kills the child when it
 * passes. The child writes back NVRTC's result, its log and the cubin;
 * the parent turns the first "kiln_kernels.cu(LINE): error: ..." of the
 * log into a located status that also names the kernel holding the line.
 * The library is opened (and its version read) in the parent before the
 * first fork, so a child only compiles.
 *
 * Options: --gpu-architecture=sm_XX (a real architecture: compute_XX
 * gives PTX and no cubin, so it is refused before NVRTC is asked),
 * --fmad=false (no contracted multiply-adds: the same roundings as the C
 * target's -ffp-contract=off), and the IEEE defaults spelled out
 * (-ftz=false, -prec-div=true, -prec-sqrt=true) so that a change of
 * NVRTC's defaults cannot change results silently.
 */
#include "compiler/codegen/nvrtc.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/sbuf.h"

#define RESULT_MAX ((size_t)512 << 20) /* log + cubin read back at most */
#define LOG_KEEP 600                   /* log text a status shows */

typedef int nvrtc_result;
typedef struct nvrtc_prog *nvrtc_program;

static struct {
  void *lib;
  char why[512];
  int major, minor;
  const char *(*error_string)(nvrtc_result);
  nvrtc_result (*version)(int *, int *);
  nvrtc_result (*create)(nvrtc_program *, const char *, const char *, int, const char *const *,
                         const char *const *);
  nvrtc_result (*compile)(nvrtc_program, int, const char *const *);
  nvrtc_result (*log_size)(nvrtc_program, size_t *);
  nvrtc_result (*log)(nvrtc_program, char *);
  nvrtc_result (*cubin_size)(nvrtc_program, size_t *);
  nvrtc_result (*cubin)(nvrtc_program, char *);
  nvrtc_result (*destroy)(nvrtc_program *);
} nv;
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static const char flags[] = "--fmad=false -ftz=false -prec-div=true -prec-sqrt=true";

const char *kiln__nvrtc_flags(void) { return flags; }

static void *sym(const char *name) {
  void *p = dlsym(nv.lib, name);
  if (p == NULL && nv.why[0] == '\0') snprintf(nv.why, sizeof nv.why, "libnvrtc has no %s", name);
  return p;
}

static void load(void) {
  const char *env = getenv("KILN_NVRTC_LIB");
  static const char *const names[] = {"libnvrtc.so.13",
                                      "libnvrtc.so.12",
                                      "libnvrtc.so",
                                      "/usr/local/cuda/lib64/libnvrtc.so.13",
                                      "/usr/local/cuda/lib64/libnvrtc.so.12",
                                      "/usr/local/cuda/lib/libnvrtc.so.13"};
  if (env && env[0]) {
    nv.lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (nv.lib == NULL) {
      const char *e = dlerror();
      snprintf(nv.why, sizeof nv.why, "KILN_NVRTC_LIB=%.200s cannot be opened: %.200s", env,
               e ? e : "?");
      return;
    }
  }
  for (size_t i = 0; nv.lib == NULL && i < sizeof names / sizeof names[0]; i++)
    nv.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (nv.lib == NULL) {
    snprintf(nv.why, sizeof nv.why,
             "libnvrtc (the CUDA toolkit's runtime compiler, libnvrtc.so.13 or .12) is not "
             "installed here; set KILN_NVRTC_LIB to its path");
    return;
  }
  nv.error_string = (const char *(*)(nvrtc_result))sym("nvrtcGetErrorString");
  nv.version = (nvrtc_result(*)(int *, int *))sym("nvrtcVersion");
  nv.create = (nvrtc_result(*)(nvrtc_program *, const char *, const char *, int,
                               const char *const *, const char *const *))sym("nvrtcCreateProgram");
  nv.compile = (nvrtc_result(*)(nvrtc_program, int, const char *const *))sym("nvrtcCompileProgram");
  nv.log_size = (nvrtc_result(*)(nvrtc_program, size_t *))sym("nvrtcGetProgramLogSize");
  nv.log = (nvrtc_result(*)(nvrtc_program, char *))sym("nvrtcGetProgramLog");
  nv.cubin_size = (nvrtc_result(*)(nvrtc_program, size_t *))sym("nvrtcGetCUBINSize");
  nv.cubin = (nvrtc_result(*)(nvrtc_program, char *))sym("nvrtcGetCUBIN");
  nv.destroy = (nvrtc_result(*)(nvrtc_program *))sym("nvrtcDestroyProgram");
  if (nv.why[0] == '\0' && nv.version(&nv.major, &nv.minor) != 0)
    snprintf(nv.why, sizeof nv.why, "nvrtcVersion failed");
  if (nv.why[0]) {
    dlclose(nv.lib);
    nv.lib = NULL;
  }
}

int kiln__nvrtc_version(int *major, int *minor, kiln_status *st) {
  pthread_once(&nv_once, load);
  if (nv.lib == NULL) return kiln_status_set(st, KILN_EUNAVAIL, "nvrtc", "%s", nv.why);
  if (major) *major = nv.major;
  if (minor) *minor = nv.minor;
  return 0;
}

int kiln__nvrtc_check_arch(const char *arch, kiln_status *st) {
  size_t n = arch ? strlen(arch) : 0;
  bool ok = n >= 5 && n <= 6 && strncmp(arch, "sm_", 3) == 0;
  for (size_t i = 3; ok && i < n; i++) ok = isdigit((unsigned char)arch[i]) != 0;
  if (ok) return 0;
  if (arch && strncmp(arch, "compute_", 8) == 0)
    return kiln_status_set(st, KILN_EINVAL, "target",
                           "'%.32s' is a virtual architecture: NVRTC makes PTX and no cubin for "
                           "it; name a real one (sm_80, sm_90, sm_100)",
                           arch);
  return kiln_status_set(st, KILN_EINVAL, "target",
                         "'%.32s' is not a CUDA architecture (expected sm_ and its number, e.g. "
                         "sm_90)",
                         arch ? arch : "");
}

/* ---- the child ----------------------------------------------------------- */

static void put_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(3);
    c += w;
    n -= (size_t)w;
  }
}

/* Writes: int32 result, u64 log bytes, log, u64 cubin bytes, cubin. */
static void child(int fd, const char *src, const char *arch) {
  char archopt[48];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
  const char *opts[] = {archopt, "--fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true"};
  nvrtc_program p = NULL;
  int32_t r = nv.create(&p, src, KILN__NVRTC_SOURCE_NAME, 0, NULL, NULL);
  if (r == 0) r = nv.compile(p, (int)(sizeof opts / sizeof opts[0]), opts);
  size_t nlog = 0, ncubin = 0;
  char *log = NULL, *cubin = NULL;
  if (p && nv.log_size(p, &nlog) == 0 && nlog > 0 && (log = malloc(nlog)) != NULL &&
      nv.log(p, log) != 0)
    nlog = 0;
  if (log == NULL) nlog = 0;
  if (r == 0 && nv.cubin_size(p, &ncubin) == 0 && ncubin > 0 && (cubin = malloc(ncubin)) != NULL &&
      nv.cubin(p, cubin) != 0)
    ncubin = 0;
  if (cubin == NULL) ncubin = 0;
  uint64_t a = nlog, b = ncubin;
  put_all(fd, &r, sizeof r);
  put_all(fd, &a, sizeof a);
  if (nlog) put_all(fd, log, nlog);
  put_all(fd, &b, sizeof b);
  if (ncubin) put_all(fd, cubin, ncubin);
  _exit(0);
}

/* ---- the parent ---------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Reads everything the child writes until EOF or the deadline; 1 on
 * timeout, 0 at EOF, a KILN_E* code otherwise. */
static int read_child(int fd, double deadline, kiln_sbuf *out) {
  char buf[65536];
  for (;;) {
    double left = deadline - now_s();
    if (left <= 0) return 1;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) return KILN_EIO;
    if (pr == 0) continue;
    ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r < 0) return KILN_EIO;
    if (r == 0) return 0;
    if (out->len + (size_t)r > RESULT_MAX) return KILN_ELIMIT;
    kiln_sbuf_putn(out, buf, (size_t)r);
    if (kiln_sbuf_failed(out)) return KILN_ENOMEM;
  }
}

/* The kernel whose text holds source line `line` (1-based), or -1. */
static long kernel_at(const char *src, size_t len, long line) {
  long cur = 1, kernel = -1;
  const char *mark = "void kiln_kernel_";
  size_t nm = strlen(mark);
  for (size_t i = 0; i < len && cur <= line; i++) {
    if ((i == 0 || src[i - 1] == '\n') && len - i > nm + 20) {
      const char *k = strstr(src + i, mark);
      const char *eol = memchr(src + i, '\n', len - i);
      if (k && (eol == NULL || k < eol)) kernel = strtol(k + nm, NULL, 10);
    }
    if (src[i] == '\n') cur++;
  }
  return kernel;
}

/* A status for a failed compile from NVRTC's log. */
static int located_error(const char *src, size_t len, int32_t r, const char *log, size_t nlog,
                         kiln_status *st) {
  char name[64];
  snprintf(name, sizeof name, "%s(", KILN__NVRTC_SOURCE_NAME);
  const char *end = log + nlog;
  for (const char *l = log; l && l < end;) {
    const char *eol = memchr(l, '\n', (size_t)(end - l));
    size_t ll = eol ? (size_t)(eol - l) : (size_t)(end - l);
    const char *err = ll > strlen(name) ? strstr(l, "): error") : NULL;
    if (strncmp(l, name, strlen(name)) == 0 && err && err < l + ll) {
      long line = strtol(l + strlen(name), NULL, 10);
      long k = kernel_at(src, len, line);
      char where[96], in[48] = "";
      snprintf(where, sizeof where, "%s:%ld", KILN__NVRTC_SOURCE_NAME, line);
      if (k >= 0) snprintf(in, sizeof in, " in kiln_kernel_%ld", k);
      const char *msg = err + strlen("): error");
      while (msg < l + ll && (*msg == ':' || *msg == ' ')) msg++;
      return kiln_status_set(st, KILN_EINTERNAL, where,
                             "NVRTC could not compile the generated CUDA C%s: %.*s", in,
                             (int)(l + ll - msg < LOG_KEEP ? l + ll - msg : LOG_KEEP), msg);
    }
    l = eol ? eol + 1 : NULL;
  }
  return kiln_status_set(st, KILN_EINTERNAL, "nvrtc", "NVRTC failed (%s): %.*s",
                         nv.error_string ? nv.error_string(r) : "?",
                         (int)(nlog < LOG_KEEP ? nlog : LOG_KEEP), log ? log : "");
}

int kiln__nvrtc_compile(const kiln__nvrtc_options *o, const char *src, size_t len, uint8_t **cubin,
                        size_t *n, kiln_status *st) {
  *cubin = NULL;
  *n = 0;
  int rc = kiln__nvrtc_check_arch(o ? o->arch : NULL, st);
  if (rc) return rc;
  if ((rc = kiln__nvrtc_version(NULL, NULL, st))) return rc;
  char *text = kiln_malloc(len + 1); /* NVRTC takes a NUL-terminated string */
  if (text == NULL) return kiln_status_set(st, KILN_ENOMEM, "nvrtc", "out of memory");
  memcpy(text, src, len);
  text[len] = '\0';
  double timeout = o->timeout_s > 0 ? o->timeout_s : 120;
  double deadline = now_s() + timeout;
  int fds[2];
  if (pipe(fds) != 0) {
    kiln_free(text);
    return kiln_status_set(st, KILN_EIO, "nvrtc", "pipe: %s", strerror(errno));
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    child(fds[1], text, o->arch);
  }
  int saved = errno;
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    kiln_free(text);
    return kiln_status_set(st, KILN_EIO, "nvrtc", "fork: %s", strerror(saved));
  }
  kiln_sbuf res = KILN_SBUF_INIT;
  int rr = read_child(fds[0], deadline, &res);
  close(fds[0]);
  if (rr != 0) kill(pid, SIGKILL);
  int wst = 0;
  while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
  }
  if (rr == 1)
    rc = kiln_status_set(st, KILN_ELIMIT, "nvrtc", "NVRTC ran past its %.0f s limit (sm %s)",
                         timeout, o->arch);
  else if (rr < 0)
    rc = kiln_status_set(st, rr, "nvrtc", "reading NVRTC's result failed");
  if (rc == 0) {
    const uint8_t *p = (const uint8_t *)res.data;
    size_t left = res.len;
    int32_t r;
    uint64_t nlog = 0, nbin = 0;
    bool ok = left >= sizeof r + 8;
    if (ok) {
      memcpy(&r, p, sizeof r);
      memcpy(&nlog, p + sizeof r, 8);
      p += sizeof r + 8;
      left -= sizeof r + 8;
      ok = nlog <= left && left - nlog >= 8;
    }
    const char *log = (const char *)p;
    if (ok) {
      memcpy(&nbin, p + nlog, 8);
      ok = nbin == left - nlog - 8;
    }
    if (!ok) {
      rc = kiln_status_set(st, KILN_EINTERNAL, "nvrtc",
                           "the NVRTC process ended without a result (%s %d)",
                           WIFSIGNALED(wst) ? "signal" : "exit status",
                           WIFSIGNALED(wst) ? WTERMSIG(wst) : WEXITSTATUS(wst));
    } else if (r != 0) {
      rc = located_error(text, len, r, log, (size_t)nlog, st);
    } else if (nbin == 0) {
      rc = kiln_status_set(st, KILN_EINTERNAL, "nvrtc", "NVRTC gave no cubin for %s", o->arch);
    } else if ((*cubin = kiln_malloc((size_t)nbin)) == NULL) {
      rc = kiln_status_set(st, KILN_ENOMEM, "nvrtc", "out of memory");
    } else {
      memcpy(*cubin, p + nlog + 8, (size_t)nbin);
      *n = (size_t)nbin;
    }
  }
  kiln_sbuf_free(&res);
  kiln_free(text);
  return rc;
}
