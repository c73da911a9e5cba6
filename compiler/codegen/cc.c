/* The system C compiler as child processes.
 *
 * posix_spawn with three pipes' worth of plumbing: the source goes in on
 * stdin, stdout and stderr come back on one pipe, and a poll loop feeds
 * and drains every running compiler against one deadline. Each child leads
 * its own process group so that a timeout kills the driver and everything
 * it started (cc1, as, ld). Objects are written into a private temporary
 * directory (mode 0700), read back, and the directory removed, whatever
 * happened. SIGPIPE (a compiler quitting before reading all of its input)
 * is blocked on this thread and consumed, never delivered.
 *
 * kiln__cc_build, a module's kernels: cc_split.c cuts the source into
 * translation units, each the prelude (its helpers are static inline) and
 * whole kernels, renamed by content: a kernel becomes kk<16 hex digits of
 * the SHA-256 of its canonical text>, its helpers kk<...>_h<j>, so that a
 * unit's text depends only on which kernels it holds, never on the index
 * a kernel got in its module (kiln_kernel_N), nor on the numbers its
 * helpers got (kf<N>). A unit's key is the SHA-256 of "kiln-cc-unit-1",
 * the compiler's identity (the digest of its `--version` output and exit
 * status, probed once per compiler file and kept while the file's device,
 * inode, size and mtime stay the same), the flags (without the output
 * path) and the text; the kernel cache (cc_cache.c) gives back the objects
 * of units compiled before, in this process or, with a cache directory,
 * in any process of ours. The other units are compiled with -c, at most
 * `jobs` at once (the CPUs sched_getaffinity grants), largest first; when
 * no lookup can hit (nothing in memory, no directory) the identity probe
 * runs alongside them and the keys are computed afterwards. One link step
 * then joins the objects into the shared object, with a linker script
 * that makes each kiln_kernel_N an alias of its kk<hash> (identical
 * kernels share one body), without the C runtime's start files and libc
 * (the driver's own link when the compiler refuses that), and without
 * libm, libmvec and libgcc when no object leaves a symbol undefined that
 * they would define. Units hold kernels of one class (kiln__cc_class),
 * whose flags they get (compile.c does not call this for a module without
 * kernels), except that under GCC a small module's few tiny kernels share
 * the light class's unit: the unit gets the light flags and each kernel
 * of another class its own as an optimize attribute (GCC is known by its
 * --version, probed before the split when a unit would mix; clang ignores
 * the attribute, so it gets a unit per class). The time limit covers
 * all of it: the probe, the compilers and the link. A compiler's failure
 * is reported with its output and the unit it was compiling (its size in
 * kernels, its first kiln_kernel_N).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/deadline.h"
#include "common/sbuf.h"
#include "compiler/codegen/cc.h"
#include "compiler/codegen/cc_internal.h"

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

/* Starts argv[0] (PATH searched) with stdin and stdout+stderr on pipes. */
static int spawn_argv(const char *const *argv, const char *dir, child *c, kiln_status *st) {
  int pin[2] = {-1, -1}, pout[2] = {-1, -1};
  if (pipe2(pin, O_CLOEXEC) || pipe2(pout, O_CLOEXEC)) {
    int e = errno;
    if (pin[0] >= 0) close(pin[0]), close(pin[1]);
    return kiln_status_set(st, KILN_EIO, "cc", "cannot create pipes: %s", strerror(e));
  }
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
  int e = env ? posix_spawnp(&c->pid, argv[0], &fa, &at, (char *const *)argv, env) : ENOMEM;
  free_env(env);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  close(pin[0]);
  close(pout[1]);
  if (e) {
    close(pin[1]);
    close(pout[0]);
    return kiln_status_set(st, e == ENOMEM ? KILN_ENOMEM : KILN_ENOTFOUND, "cc",
                           "cannot start the C compiler '%s': %s", argv[0], strerror(e));
  }
  c->in = pin[1];
  c->out = pout[0];
  fcntl(c->in, F_SETFL, fcntl(c->in, F_GETFL) | O_NONBLOCK);
  return 0;
}

/* The flags every compile of generated code gets, after the options'. */
static const char *const fixed_flags[] = {
    "-pipe", "-fPIC", "-fno-math-errno", "-ffp-contract=off", "-fno-strict-aliasing", "-w"};
#define NFIXED (sizeof fixed_flags / sizeof *fixed_flags)

/* cc, opt, [tune], [-march=...], the fixed flags: n arguments into argv. */
static int base_args(const kiln__cc_options *o, const char *opt, const char *tune, char *march,
                     size_t march_size, const char **argv) {
  int n = 0;
  argv[n++] = o->cc && *o->cc ? o->cc : "cc";
  argv[n++] = opt ? opt : "-O3";
  if (tune && *tune) argv[n++] = tune;
  if (o->march && *o->march) {
    snprintf(march, march_size, "-march=%s", o->march);
    argv[n++] = march;
  }
  for (size_t i = 0; i < NFIXED; i++) argv[n++] = fixed_flags[i];
  return n;
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

/* ---- the parallel build ------------------------------------------------- */

/* One compiler run: its arguments, the text it reads and what it says. */
typedef struct job {
  const char **argv;
  const char *in;
  size_t inlen, sent;
  char *out; /* OUT_MAX + 1 bytes */
  size_t nout;
  child c;
  bool running, done;
  int status;
  uint32_t unit; /* index into the split's units; UINT32_MAX: probe or link */
  bool may_fail; /* the probe: its status is data, not an error */
  bool own_out;  /* out allocated by run_jobs (kept only if the job failed) */
} job;

static double tv_ms(struct timeval tv) { return tv.tv_sec * 1e3 + tv.tv_usec / 1e3; }

/* Reaps j's child (killing its group first when `kill_it`). */
static void reap(job *j, bool kill_it, double *cpu_ms) {
  if (j->c.in >= 0) close(j->c.in), j->c.in = -1;
  if (j->c.out >= 0) close(j->c.out), j->c.out = -1;
  if (kill_it) kill(-j->c.pid, SIGKILL);
  struct rusage ru;
  memset(&ru, 0, sizeof ru);
  while (wait4(j->c.pid, &j->status, 0, &ru) < 0 && errno == EINTR) {
  }
  if (cpu_ms) *cpu_ms += tv_ms(ru.ru_utime) + tv_ms(ru.ru_stime);
  j->running = false;
  j->done = true;
}

/* One step of j's pipes after poll. */
static void pump_one(job *j, short out_ev, short in_ev) {
  if (out_ev) {
    char buf[4096];
    ssize_t k = read(j->c.out, buf, sizeof buf);
    if (k > 0) {
      size_t keep = j->nout + (size_t)k > OUT_MAX ? OUT_MAX - j->nout : (size_t)k;
      memcpy(j->out + j->nout, buf, keep);
      j->nout += keep;
    } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
      close(j->c.out);
      j->c.out = -1;
    }
  }
  if (j->c.in >= 0 && in_ev) {
    ssize_t k = write(j->c.in, j->in + j->sent, j->inlen - j->sent);
    if (k > 0) j->sent += (size_t)k;
    if ((k < 0 && errno != EAGAIN && errno != EINTR) || j->sent == j->inlen) {
      close(j->c.in);
      j->c.in = -1;
    }
  }
}

static bool failed(const job *j) { return !WIFEXITED(j->status) || WEXITSTATUS(j->status) != 0; }

/* Runs jobs[0..n) at most `par` at once until all are done, one fails
 * (*bad: its index) or the deadline passes (1). Returns 0, 1, or a
 * negative status when a compiler cannot be started. */
static int run_jobs(job *jobs, uint32_t n, uint32_t par, const char *dir, double deadline,
                    double *cpu_ms, uint32_t *bad, kiln_status *st) {
  struct pollfd *p = kiln_malloc((2 * (size_t)n + 1) * sizeof *p);
  uint32_t *who = kiln_malloc((2 * (size_t)n + 1) * sizeof *who);
  int rc = 0;
  uint32_t next = 0, running = 0, done = 0;
  *bad = UINT32_MAX;
  if (p == NULL || who == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, "cc", "out of memory");
    goto out_kill;
  }
  while (done < n) {
    while (running < par && next < n) {
      job *j = &jobs[next++];
      j->c = (child){-1, -1, -1};
      if (j->out == NULL) {
        if ((j->out = kiln_malloc(OUT_MAX + 1)) == NULL) {
          rc = kiln_status_set(st, KILN_ENOMEM, "cc", "out of memory");
          goto out_kill;
        }
        j->own_out = true;
      }
      if ((rc = spawn_argv(j->argv, dir, &j->c, st))) goto out_kill;
      j->running = true;
      running++;
      if (j->inlen == 0) close(j->c.in), j->c.in = -1;
    }
    nfds_t np = 0;
    for (uint32_t i = 0; i < n; i++) {
      job *j = &jobs[i];
      if (!j->running) continue;
      if (j->c.out < 0) { /* all output read: the compiler is done */
        reap(j, false, cpu_ms);
        running--, done++;
        if (failed(j) && !j->may_fail) {
          *bad = i;
          goto out_kill;
        }
        if (j->own_out) kiln_free(j->out), j->out = NULL, j->own_out = false;
        continue;
      }
      p[np] = (struct pollfd){j->c.out, POLLIN, 0};
      who[np++] = i;
      if (j->c.in >= 0) {
        p[np] = (struct pollfd){j->c.in, POLLOUT, 0};
        who[np++] = i | 0x80000000u;
      }
    }
    if (np == 0) continue;
    double left = deadline - now_s();
    if (left <= 0) {
      rc = 1;
      goto out_kill;
    }
    /* Woken at least every 100 ms to see whether the Compile was
     * cancelled or ran out of time (common/deadline.h). */
    int r = poll(p, np, left < 0.1 ? (int)(left * 1000) + 1 : 100);
    if (r < 0 && errno != EINTR) {
      rc = 1;
      goto out_kill;
    }
    if ((rc = kiln__deadline_check("the C compiler", st))) goto out_kill;
    for (nfds_t q = 0; r > 0 && q < np; q++) {
      if (!p[q].revents) continue;
      job *j = &jobs[who[q] & 0x7fffffffu];
      if (who[q] & 0x80000000u) {
        if (j->c.in >= 0) pump_one(j, 0, p[q].revents);
      } else if (j->c.out >= 0) {
        pump_one(j, p[q].revents, 0);
      }
    }
  }
out_kill:
  for (uint32_t i = 0; i < n; i++)
    if (jobs[i].running) reap(&jobs[i], true, cpu_ms);
  kiln_free(p);
  kiln_free(who);
  return rc;
}

/* ---- the compiler's identity ---------------------------------------------- */

static pthread_mutex_t id_mu = PTHREAD_MUTEX_INITIALIZER;
typedef struct cc_id {
  char *cc;                         /* as given */
  struct stat sb;                   /* of the file it resolved to */
  uint8_t digest[KILN__SHA256_LEN]; /* of its --version output */
  bool gcc;                         /* that output is GCC's (it honours optimize attributes) */
  struct cc_id *next;
} cc_id;
static cc_id *ids; /* guarded by id_mu; never freed (one per compiler) */

/* The file `cc` names, as posix_spawnp would find it. */
static bool resolve(const char *cc, struct stat *sb) {
  if (strchr(cc, '/')) return stat(cc, sb) == 0;
  const char *path = getenv("PATH");
  if (path == NULL) path = "/usr/bin:/bin";
  for (const char *d = path;; d++) {
    const char *e = strchr(d, ':');
    size_t n = e ? (size_t)(e - d) : strlen(d);
    char full[4400];
    snprintf(full, sizeof full, "%.*s/%s", (int)n, n ? d : ".", cc);
    if (access(full, X_OK) == 0 && stat(full, sb) == 0) return true;
    if (e == NULL) return false;
    d = e;
  }
}

static bool same_file(const struct stat *a, const struct stat *b) {
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
         a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static bool id_lookup(const char *cc, const struct stat *sb, uint8_t *digest, bool *gcc) {
  bool hit = false;
  pthread_mutex_lock(&id_mu);
  for (cc_id *i = ids; i && !hit; i = i->next)
    if (strcmp(i->cc, cc) == 0 && same_file(&i->sb, sb)) {
      memcpy(digest, i->digest, KILN__SHA256_LEN);
      *gcc = i->gcc;
      hit = true;
    }
  pthread_mutex_unlock(&id_mu);
  return hit;
}

static void id_store(const char *cc, const struct stat *sb, const uint8_t *digest, bool gcc) {
  cc_id *i = kiln_calloc(1, sizeof *i);
  char *name = i ? kiln_strdup(cc) : NULL;
  if (name == NULL) {
    kiln_free(i);
    return;
  }
  i->cc = name;
  i->sb = *sb;
  i->gcc = gcc;
  memcpy(i->digest, digest, KILN__SHA256_LEN);
  pthread_mutex_lock(&id_mu);
  i->next = ids;
  ids = i;
  pthread_mutex_unlock(&id_mu);
}

/* What one build knows of its compiler. */
typedef struct ident {
  bool have;  /* digest (and gcc) are known */
  bool known; /* the compiler's file was found (sb) */
  bool gcc;   /* GCC, by its --version output */
  struct stat sb;
  uint8_t digest[KILN__SHA256_LEN];
} ident;

/* The identity of a compiler run before (its file unchanged since), or
 * false; id->sb, id->known: the file, and whether it was found. */
static bool identity_known(const kiln__cc_options *o, ident *id) {
  const char *cc = o->cc && *o->cc ? o->cc : "cc";
  id->known = resolve(cc, &id->sb);
  id->have = id->known && id_lookup(cc, &id->sb, id->digest, &id->gcc);
  return id->have;
}

static bool has_text(const char *p, size_t n, const char *what) {
  size_t w = strlen(what);
  for (size_t i = 0; i + w <= n; i++)
    if (memcmp(p + i, what, w) == 0) return true;
  return false;
}

/* The identity from the probe j (`cc --version`): its output and status.
 * GCC names its copyright holder there, clang its own name. */
static void identity_from(const kiln__cc_options *o, const job *j, ident *id) {
  kiln__sha256 h;
  kiln__sha256_init(&h);
  kiln__sha256_update(&h, &j->status, sizeof j->status);
  kiln__sha256_update(&h, j->out, j->nout);
  kiln__sha256_final(&h, id->digest);
  id->gcc = !failed(j) && has_text(j->out, j->nout, "Free Software Foundation") &&
            !has_text(j->out, j->nout, "clang");
  id->have = true;
  if (id->known && !failed(j))
    id_store(o->cc && *o->cc ? o->cc : "cc", &id->sb, id->digest, id->gcc);
}

/* ---- kiln__cc_build -------------------------------------------------------- */

static uint32_t cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return (uint32_t)CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (uint32_t)n : 1;
}

static uint32_t job_count(const kiln__cc_options *o) {
  if (o->jobs) return o->jobs;
  const char *v = getenv("KILN_CC_JOBS");
  long n = v && *v ? strtol(v, NULL, 10) : 0;
  if (n > 0 && n <= 1024) return (uint32_t)n;
  return cpu_count();
}

#define UNIT_ARGS 24

/* Everything one build holds, freed in one place. */
typedef struct build {
  kiln__cc_split sp;
  job *jobs;
  const char **argv; /* UNIT_ARGS per unit */
  char (*paths)[4200];
  char *outs; /* (OUT_MAX + 1) per job */
  uint8_t **objs;
  size_t *nobjs;
  uint32_t *todo;
  char *glue;
  const char **link_argv;
  uint32_t nextra; /* objects of the program's objs, written for the link */
  char (*extra_paths)[4200];
} build;

static void build_free(build *b) {
  for (uint32_t i = 0; b->jobs && i < b->sp.nunits + 2; i++)
    if (b->jobs[i].own_out) kiln_free(b->jobs[i].out);
  for (uint32_t u = 0; b->objs && u < b->sp.nunits; u++) kiln_free(b->objs[u]);
  kiln_free(b->objs);
  kiln_free(b->nobjs);
  kiln_free(b->jobs);
  kiln_free(b->argv);
  kiln_free(b->paths);
  kiln_free(b->outs);
  kiln_free(b->todo);
  kiln_free(b->glue);
  kiln_free(b->link_argv);
  kiln_free(b->extra_paths);
  kiln__cc_split_free(&b->sp);
}

static void unit_key(const kiln__cc_unit *u, const uint8_t *id, const char *const *argv, int nargs,
                     uint8_t *key) {
  kiln__sha256 h;
  kiln__sha256_init(&h);
  kiln__sha256_update(&h, "kiln-cc-unit-1", 15);
  kiln__sha256_update(&h, id, KILN__SHA256_LEN);
  for (int i = 1; i < nargs; i++) kiln__sha256_update(&h, argv[i], strlen(argv[i]) + 1);
  kiln__sha256_update(&h, u->src, u->len);
  kiln__sha256_final(&h, key);
}

static int write_file(const char *path, const uint8_t *data, size_t len, kiln_status *st) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  size_t done = 0;
  while (fd >= 0 && done < len) {
    ssize_t k = write(fd, data + done, len - done);
    if (k <= 0) break;
    done += (size_t)k;
  }
  if (fd < 0 || close(fd) != 0 || done != len)
    return kiln_status_set(st, KILN_EIO, "cc", "cannot write an object file: %s", strerror(errno));
  return 0;
}

/* The glue, a linker script: each kiln_kernel_N is an alias of its
 * content-named kernel (the same address; nothing runs in between). */
static char *glue_source(const kiln__cc_split *sp, size_t *len) {
  kiln_sbuf b = KILN_SBUF_INIT;
  for (uint32_t k = 0; k < sp->nkernels; k++)
    kiln_sbuf_printf(&b, "kiln_kernel_%u = %s;\n", k, sp->sym[k]);
  return kiln_sbuf_detach(&b, len);
}

static int fail_unit(const build *b, const job *j, kiln_status *st) {
  const kiln__cc_unit *u = &b->sp.units[j->unit];
  j->out[j->nout] = 0;
  return kiln_status_set(st, KILN_EINTERNAL, "cc",
                         "the C compiler failed (status %d): %.*s%s [translation unit %u of %u, "
                         "%u kernels, the first kiln_kernel_%u]",
                         WIFEXITED(j->status) ? WEXITSTATUS(j->status) : -1, MSG_MAX, j->out,
                         j->nout > MSG_MAX ? "..." : "", j->unit + 1, b->sp.nunits, u->nkernels,
                         u->first);
}

/* The per-unit arrays (one spare job and output for the probe). */
static int build_alloc(build *b, uint32_t nu) {
  b->jobs = kiln_calloc(nu + 2, sizeof *b->jobs);
  b->argv = kiln_calloc((size_t)(nu + 1) * UNIT_ARGS, sizeof *b->argv);
  b->paths = kiln_calloc(nu + 1, sizeof *b->paths);
  b->outs = kiln_malloc(2 * (OUT_MAX + 1)); /* the probe's and the link's */
  b->objs = kiln_calloc(nu + 1, sizeof *b->objs);
  b->nobjs = kiln_calloc(nu + 1, sizeof *b->nobjs);
  b->todo = kiln_calloc(nu + 1, sizeof *b->todo);
  return !b->jobs || !b->argv || !b->paths || !b->outs || !b->objs || !b->nobjs || !b->todo;
}

/* Largest unit first, so that the last to finish is a small one. */
static void sort_todo(build *b, uint32_t ntodo) {
  for (uint32_t i = 1; i < ntodo; i++)
    for (uint32_t q = i; q > 0 && b->sp.units[b->todo[q]].len > b->sp.units[b->todo[q - 1]].len;
         q--) {
      uint32_t t = b->todo[q];
      b->todo[q] = b->todo[q - 1], b->todo[q - 1] = t;
    }
}

static int took_too_long(const kiln__cc_options *o, kiln_status *st) {
  return kiln_status_set(st, KILN_ELIMIT, "cc", "the C compiler took longer than %.0f s",
                         o->timeout_s > 0 ? o->timeout_s : 120);
}

/* The flags a unit of class c is compiled with (tune may be NULL). */
static void class_flags(const kiln__cc_options *o, uint8_t c, const char **opt, const char **tune) {
  *opt = o->opt, *tune = o->tune;
  if (c == KILN__CC_TINY && o->tiny_opt)
    *opt = o->tiny_opt, *tune = o->tiny_tune;
  else if (c != KILN__CC_HEAVY && o->light_opt)
    *opt = o->light_opt, *tune = o->light_tune;
  if (*opt == NULL) *opt = "-O3";
}

/* Runs `cc --version` now (out: OUT_MAX + 1 bytes) for *id. */
static int probe(const kiln__cc_options *o, char *out, const char *dir, double deadline, ident *id,
                 kiln__cc_stats *stats, kiln_status *st) {
  const char *cc = o->cc && *o->cc ? o->cc : "cc";
  const char *argv[] = {cc, "--version", NULL};
  job pj = {.argv = argv, .out = out, .unit = UINT32_MAX, .may_fail = true};
  uint32_t bad;
  int rc = run_jobs(&pj, 1, 1, dir, deadline, &stats->cpu_ms, &bad, st);
  if (rc == 1) return took_too_long(o, st);
  if (rc) return rc;
  identity_from(o, &pj, id);
  return 0;
}

/* Units from the cache or compiled; their objects end up in b->objs. The
 * compiler's identity (the keys) is needed before compiling only when a
 * lookup can hit: with an empty in-process cache and no directory the
 * probe runs alongside the compilers instead. */
static int compile_units(build *b, const kiln__cc_options *o, const char *dir, double deadline,
                         const char *cache_dir, ident *idn, kiln__cc_stats *stats,
                         kiln_status *st) {
  uint32_t nu = b->sp.nunits;
  const uint8_t *id = idn->digest;
  char march[128];
  if (build_alloc(b, nu)) return kiln_status_set(st, KILN_ENOMEM, "cc", "out of memory");
  const char *cc = o->cc && *o->cc ? o->cc : "cc";
  const char *probe_argv[] = {cc, "--version", NULL};
  bool caching = !o->no_cache;
  bool lookups = caching && ((cache_dir && *cache_dir) || !kiln__cc_cache_empty());
  uint32_t bad;
  int rc = 0;
  if (caching && !idn->have) identity_known(o, idn);
  bool have_id = idn->have;
  if (lookups && !have_id) {
    rc = probe(o, b->outs, dir, deadline, idn, stats, st);
    if (rc) return rc;
    have_id = true;
  }
  uint32_t ntodo = 0;
  int *n_of = kiln_calloc(nu + 1, sizeof *n_of);
  if (n_of == NULL) return kiln_status_set(st, KILN_ENOMEM, "cc", "out of memory");
  for (uint32_t u = 0; u < nu; u++) {
    kiln__cc_unit *un = &b->sp.units[u];
    const char **argv = b->argv + (size_t)u * UNIT_ARGS;
    const char *opt, *tune;
    class_flags(o, un->cls, &opt, &tune);
    int n = base_args(o, opt, tune, march, sizeof march, argv);
    n_of[u] = n;
    snprintf(b->paths[u], sizeof b->paths[u], "%s/u%u.o", dir, u);
    if (have_id) unit_key(un, id, argv, n, un->key);
    if (lookups && kiln__cc_cache_get(cache_dir, un->key, &b->objs[u], &b->nobjs[u])) {
      stats->units_cached++;
      if ((rc = write_file(b->paths[u], b->objs[u], b->nobjs[u], st))) goto out_free;
      continue;
    }
    /* The march buffer is shared: every unit spells it the same. */
    const char *tail[] = {"-c", "-o", b->paths[u], "-x", "c", "-"};
    for (size_t i = 0; i < sizeof tail / sizeof *tail; i++) argv[n++] = tail[i];
    argv[n] = NULL;
    b->todo[ntodo++] = u;
  }
  sort_todo(b, ntodo);
  /* The probe, when still wanted, goes first: it is quick. */
  uint32_t nj = 0;
  bool alongside = caching && !have_id;
  if (alongside)
    b->jobs[nj++] = (job){
        .argv = probe_argv, .out = b->outs + OUT_MAX + 1, .unit = UINT32_MAX, .may_fail = true};
  for (uint32_t i = 0; i < ntodo; i++) {
    uint32_t u = b->todo[i];
    b->jobs[nj++] = (job){.argv = b->argv + (size_t)u * UNIT_ARGS,
                          .in = b->sp.units[u].src,
                          .inlen = b->sp.units[u].len,
                          .unit = u};
  }
  uint32_t par = job_count(o);
  if (par > ntodo) par = ntodo ? ntodo : 1;
  stats->jobs = par;
  rc = run_jobs(b->jobs, nj, par + (alongside ? 1 : 0), dir, deadline, &stats->cpu_ms, &bad, st);
  if (rc == 1) {
    rc = took_too_long(o, st);
    goto out_free;
  }
  if (rc) goto out_free;
  if (bad != UINT32_MAX) {
    rc = fail_unit(b, &b->jobs[bad], st);
    goto out_free;
  }
  if (alongside) {
    identity_from(o, &b->jobs[0], idn);
    for (uint32_t u = 0; u < nu; u++)
      unit_key(&b->sp.units[u], id, b->argv + (size_t)u * UNIT_ARGS, n_of[u], b->sp.units[u].key);
  }
  for (uint32_t i = 0; i < ntodo; i++) {
    uint32_t u = b->todo[i];
    if ((rc = read_file(b->paths[u], &b->objs[u], &b->nobjs[u], st))) goto out_free;
    if (caching) kiln__cc_cache_put(cache_dir, b->sp.units[u].key, b->objs[u], b->nobjs[u]);
  }
out_free:
  kiln_free(n_of);
  return rc;
}

/* ---- what the link needs ---------------------------------------------- */

static uint64_t le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* Symbols generated code may leave undefined without a library on the
 * link line: libc's (every process that loads the kernels has it) and
 * the linker's own. */
static bool resolved_anyway(const char *name, size_t n) {
  static const char *const names[] = {"memcpy", "memset", "memmove", "memcmp",
                                      "_GLOBAL_OFFSET_TABLE_"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (strlen(names[i]) == n && memcmp(names[i], name, n) == 0) return true;
  return false;
}

/* Whether the relocatable ELF64 object obj[0..len) leaves a symbol
 * undefined that only a library named on the link line (libm, libmvec,
 * libgcc) defines; true for anything it cannot read as such. */
static bool needs_libs(const uint8_t *obj, size_t len) {
  if (len < 64 || memcmp(obj, "\177ELF", 4) != 0 || obj[4] != 2 || obj[5] != 1) return true;
  uint64_t shoff = le(obj + 0x28, 8), shentsize = le(obj + 0x3a, 2), shnum = le(obj + 0x3c, 2);
  if (shentsize < 64 || shoff > len || shnum > (len - shoff) / shentsize) return true;
  bool symtab = false;
  for (uint64_t i = 0; i < shnum; i++) {
    const uint8_t *sh = obj + shoff + i * shentsize;
    if (le(sh + 4, 4) != 2) continue; /* SHT_SYMTAB */
    uint64_t off = le(sh + 24, 8), size = le(sh + 32, 8), link = le(sh + 40, 4);
    uint64_t ent = le(sh + 56, 8);
    if (ent < 24 || off > len || size > len - off || link >= shnum) return true;
    const uint8_t *str = obj + shoff + link * shentsize;
    uint64_t soff = le(str + 24, 8), ssize = le(str + 32, 8);
    if (soff > len || ssize > len - soff) return true;
    symtab = true;
    for (uint64_t k = 1; k < size / ent; k++) {
      const uint8_t *sym = obj + off + k * ent;
      uint8_t bind = sym[4] >> 4;
      if (le(sym + 6, 2) != 0 || (bind != 1 && bind != 2)) continue; /* defined, or local */
      uint64_t name = le(sym, 4);
      if (name >= ssize) return true;
      const char *nm = (const char *)obj + soff + name;
      size_t n = strnlen(nm, (size_t)(ssize - name));
      if (n == ssize - name || !resolved_anyway(nm, n)) return true;
    }
  }
  return !symtab;
}

/* The link's arguments: cc, the shared-object flags, the objects, the
 * glue and the libraries. A fast link (`lean`) leaves out the C runtime's
 * start files and libc: the kernels define no constructors, and what they
 * take from libc (memcpy, memset) every process that loads them has
 * already; libm is named (a process may hold it only in a local scope)
 * and libgcc's static archive given (complex multiplication and other
 * helpers the compiler calls). The C compiler driver then looks for less,
 * and ld reads two libraries instead of seven: 4-5 ms of a 10 ms link. */
static void link_args(build *b, const kiln__cc_options *o, const char *so_path,
                      const char *glue_path, bool lean, bool libs) {
  int n = 0;
  const char **a = b->link_argv;
  a[n++] = o->cc && *o->cc ? o->cc : "cc";
  a[n++] = "-fPIC";
  a[n++] = "-shared";
  if (lean) a[n++] = "-nostdlib";
  a[n++] = "-o";
  a[n++] = so_path;
  for (uint32_t u = 0; u < b->sp.nunits; u++) a[n++] = b->paths[u];
  for (uint32_t x = 0; x < b->nextra; x++) a[n++] = b->extra_paths[x];
  a[n++] = glue_path;
#if defined(__x86_64__) && defined(__linux__)
  if (libs) a[n++] = "-lmvec"; /* the f32 sin/cos/tan vector variants (c_target.c) */
#endif
  if (o->link_flag && *o->link_flag) a[n++] = o->link_flag;
  if (libs) a[n++] = "-lm";
  if (lean && libs) a[n++] = "-lgcc";
  a[n] = NULL;
}

static int link_units(build *b, const kiln__cc_options *o, const char *dir, double deadline,
                      const char *so_path, kiln__cc_stats *stats, kiln_status *st) {
  size_t nglue;
  char glue_path[4200];
  if ((b->glue = glue_source(&b->sp, &nglue)) == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "cc", "out of memory");
  snprintf(glue_path, sizeof glue_path, "%s/glue.ld", dir);
  int rc = write_file(glue_path, (const uint8_t *)b->glue, nglue, st);
  if (rc) return rc;
  b->link_argv = kiln_calloc(b->sp.nunits + b->nextra + 16, sizeof *b->link_argv);
  if (b->link_argv == NULL) return kiln_status_set(st, KILN_ENOMEM, "cc", "out of memory");
  job j;
  uint32_t bad = UINT32_MAX;
  double t0 = now_s();
  /* The libraries only when an object needs one (reading them is 2 of a
   * lean link's 7 ms); objects compiled elsewhere may. */
  bool libs = b->nextra > 0;
  for (uint32_t u = 0; u < b->sp.nunits && !libs; u++) libs = needs_libs(b->objs[u], b->nobjs[u]);
  /* The fast link first; should this compiler or system refuse it, the
   * driver's own. */
  for (int lean = 1; lean >= 0; lean--) {
    link_args(b, o, so_path, glue_path, lean, libs || !lean);
    j = (job){.argv = b->link_argv, .out = b->outs, .unit = UINT32_MAX};
    rc = run_jobs(&j, 1, 1, dir, deadline, &stats->cpu_ms, &bad, st);
    if (rc || bad == UINT32_MAX) break;
    unlink(so_path);
  }
  stats->link_ms = (now_s() - t0) * 1e3;
  if (rc == 1) return took_too_long(o, st);
  if (rc) return rc;
  if (bad != UINT32_MAX) {
    j.out[j.nout] = 0;
    return kiln_status_set(st, KILN_EINTERNAL, "cc",
                           "the C compiler failed (status %d) linking %u units: %.*s%s",
                           WIFEXITED(j.status) ? WEXITSTATUS(j.status) : -1, b->sp.nunits, MSG_MAX,
                           j.out, j.nout > MSG_MAX ? "..." : "");
  }
  return 0;
}

/* The program's ready objects as files for the link. */
static int write_extra(build *b, const kiln__cc_program *p, const char *dir, kiln_status *st) {
  if ((b->extra_paths = kiln_calloc(p->nobjs, sizeof *b->extra_paths)) == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "cc", "out of memory");
  for (uint32_t x = 0; x < p->nobjs; x++) {
    snprintf(b->extra_paths[x], sizeof b->extra_paths[x], "%s/x%u.o", dir, x);
    int rc = write_file(b->extra_paths[x], p->objs[x], p->objs_len[x], st);
    b->nextra = x + 1;
    if (rc) return rc;
  }
  return 0;
}

/* A flag that may be spelled inside a C string: -O<level> or -f<name>. */
static bool plain_flag(const char *f) {
  if (f[0] != '-' || (f[1] != 'O' && f[1] != 'f')) return false;
  if (f[1] == 'O') return f[2] == 0 || (strchr("0123sgz", f[2]) && f[3] == 0);
  for (const char *c = f + 2; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '='))
      return false;
  return f[2] != 0;
}

#define ATTR_MAX 200

/* Each class's flags as a GCC optimize attribute; false when a flag is not
 * plain (the units then hold one class each). */
static bool class_attrs(const kiln__cc_options *o, char (*buf)[ATTR_MAX], const char **attrs) {
  for (uint8_t c = 0; c < KILN__CC_NCLASSES; c++) {
    const char *opt, *tune;
    class_flags(o, c, &opt, &tune);
    if (!plain_flag(opt) || (tune && *tune && !plain_flag(tune)) || strlen(opt) > 40 ||
        (tune && strlen(tune) > 100))
      return false;
    if (tune && *tune)
      snprintf(buf[c], ATTR_MAX, "__attribute__((optimize(\"%s\", \"%s\")))", opt, tune);
    else
      snprintf(buf[c], ATTR_MAX, "__attribute__((optimize(\"%s\")))", opt);
    attrs[c] = buf[c];
  }
  return true;
}

/* The module's units: classes mixed in small modules when the compiler
 * is GCC (known from a probe run before, or run now: a mixed unit saves
 * a compiler process, the probe costs a millisecond). */
static int split(build *b, const kiln__cc_options *o, const kiln__cc_program *p, const char *dir,
                 double deadline, ident *id, kiln__cc_stats *stats, kiln_status *st) {
  size_t unit_bytes = o->unit_bytes;
  const char *ub = getenv("KILN_CC_UNIT_BYTES");
  if (unit_bytes == 0 && ub && *ub) unit_bytes = (size_t)strtoull(ub, NULL, 10);
  char buf[KILN__CC_NCLASSES][ATTR_MAX];
  const char *attrs[KILN__CC_NCLASSES];
  bool mix = class_attrs(o, buf, attrs);
  int rc = kiln__cc_split_program(p, job_count(o), unit_bytes, mix ? attrs : NULL, &b->sp, st);
  if (rc || b->sp.nmixed == 0) return rc;
  if (!identity_known(o, id)) {
    char *out = kiln_malloc(OUT_MAX + 1);
    if (out == NULL) return kiln_status_set(st, KILN_ENOMEM, "cc", "out of memory");
    rc = probe(o, out, dir, deadline, id, stats, st);
    kiln_free(out);
    if (rc) return rc;
  }
  if (id->gcc) return 0;
  kiln__cc_split_free(&b->sp);
  return kiln__cc_split_program(p, job_count(o), unit_bytes, NULL, &b->sp, st);
}

int kiln__cc_object(const kiln__cc_options *o, const char *src, size_t n, const char *define,
                    uint8_t **obj, size_t *obj_len, kiln_status *st) {
  *obj = NULL;
  *obj_len = 0;
  double deadline = now_s() + (o->timeout_s > 0 ? o->timeout_s : 120);
  char dir[4096], path[4200], march[128];
  int rc = make_dir(dir, sizeof dir, st);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/user.o", dir);
  const char *argv[UNIT_ARGS + 4];
  int k = base_args(o, o->opt, o->tune, march, sizeof march, argv);
  if (define) argv[k++] = define;
  const char *tail[] = {"-c", "-o", path, "-x", "c", "-"};
  for (size_t i = 0; i < sizeof tail / sizeof *tail; i++) argv[k++] = tail[i];
  argv[k] = NULL;
  job j = {.argv = argv, .in = src, .inlen = n, .unit = UINT32_MAX};
  uint32_t bad = UINT32_MAX;
  double cpu = 0;
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  rc = run_jobs(&j, 1, 1, dir, deadline, &cpu, &bad, st);
  if (rc == 1) {
    rc = took_too_long(o, st);
  } else if (rc == 0 && bad != UINT32_MAX) {
    j.out[j.nout] = 0;
    rc = kiln_status_set(st, KILN_EINTERNAL, "cc", "the C compiler failed (status %d): %.*s%s",
                         WIFEXITED(j.status) ? WEXITSTATUS(j.status) : -1, MSG_MAX, j.out,
                         j.nout > MSG_MAX ? "..." : "");
  } else if (rc == 0) {
    rc = read_file(path, obj, obj_len, st);
  }
  if (j.own_out) kiln_free(j.out);
  struct timespec zero = {0, 0};
  while (sigtimedwait(&pipe_set, NULL, &zero) > 0) {
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  remove_dir(dir);
  return rc;
}

int kiln__cc_build(const kiln__cc_options *o, const kiln__cc_program *p, uint8_t **so,
                   size_t *so_len, kiln__cc_stats *stats, kiln_status *st) {
  *so = NULL;
  *so_len = 0;
  kiln__cc_stats scratch;
  if (stats == NULL) stats = &scratch;
  memset(stats, 0, sizeof *stats);
  double deadline = now_s() + (o->timeout_s > 0 ? o->timeout_s : 120);
  const char *cache_dir = o->cache_dir ? o->cache_dir : getenv("KILN_KERNEL_CACHE_DIR");
  build b = {0};
  ident id = {0};
  char dir[4096], path[4200];
  int rc = make_dir(dir, sizeof dir, st);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/k.so", dir);
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  rc = split(&b, o, p, dir, deadline, &id, stats, st);
  stats->units = b.sp.nunits;
  stats->kernels_distinct = b.sp.ndistinct;
  if (rc == 0) rc = compile_units(&b, o, dir, deadline, cache_dir, &id, stats, st);
  if (rc == 0 && p->nobjs) rc = write_extra(&b, p, dir, st);
  if (rc == 0) rc = link_units(&b, o, dir, deadline, path, stats, st);
  if (rc == 0) rc = read_file(path, so, so_len, st);
  struct timespec zero = {0, 0};
  while (sigtimedwait(&pipe_set, NULL, &zero) > 0) {
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  remove_dir(dir);
  build_free(&b);
  return rc;
}
