/* Operating kilnd: its structured log, the phases of a long compile and
 * `kiln top`, against real servers.
 *
 * Two kilnd (A and B) share one redis-server (on a unix socket in a
 * temporary directory) and write logfmt logs. Their C compiler is a
 * wrapper (KILN_CC) that sleeps 8 s when the test has armed it
 * (a file it takes with an atomic rename, so exactly one compiler run
 * sleeps), which makes a compile slow enough to watch:
 *   - the log: every field of a call's request line, its request_id equal
 *     to the trailing metadata kiln-request-id the client received, the
 *     audit lines of a build, an eviction and refused tokens (the latter
 *     on a third kilnd logging JSON with --tokens);
 *   - progress: while A builds a program (holding the Redis lock), B is
 *     asked for the same program with a deadline; B waits for A for half
 *     of it, then builds itself, so one CompileStream shows every phase
 *     in order: queued, loading, waiting (another server's build),
 *     passes, cc, storing, done. Once through libkiln's callback, once
 *     through `kiln compile --server --progress` (plain lines: stderr is
 *     not a terminal here);
 *   - `kiln top --once` while A builds: the running compile, its phase,
 *     the cache and device sections.
 * Skipped (77) without kilnd or redis-server.
 */
#include <check.h>
#include <ctype.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clients/c/kiln.h"
#include "tests/integration/itest.h"

static itest_kilnd server_a, server_b;
static char dir[256];
static pid_t redis_pid;

/* ---- helpers ------------------------------------------------------------------------ */

static const char *path(const char *name) {
  static char buf[8][512];
  static int next;
  char *p = buf[next++ % 8];
  snprintf(p, 512, "%s/%s", dir, name);
  return p;
}

static int sh(const char *cmd) {
  int rc = system(cmd);
  return rc == -1 || !WIFEXITED(rc) ? -1 : WEXITSTATUS(rc);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A program of its own per test: the shape makes the key differ. */
static char *program(int n) {
  static char buf[4][256];
  static int next;
  char *p = buf[next++ % 4];
  snprintf(p, 256,
           "HloModule ops%d\nENTRY main {\n  x = f32[%d] parameter(0)\n"
           "  ROOT y = f32[%d] negate(x)\n}\n",
           n, n, n);
  return p;
}

static kiln_client *connect_to(const itest_kilnd *k, const char *token) {
  kiln_client_options o = {.token = token};
  kiln_client *c = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_client_connect(k->addr, &o, &c, &st);
  ck_assert_msg(rc == 0, "connect %s: %s", k->addr, st.msg);
  return c;
}

/* Makes the next C compiler run sleep (slowcc, below), and waits for it to start. */
static void arm_slow_cc(void) {
  FILE *f = fopen(path("slow.arm"), "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
}

static void wait_slow_cc_started(void) {
  double until = itest_now() + 30;
  while (access(path("slow.arm"), F_OK) == 0 && itest_now() < until) sleep_ms(20);
  ck_assert_msg(access(path("slow.arm"), F_OK) != 0, "the slow compiler never started");
}

/* A compile on a thread of its own (the build the other waits for). */
typedef struct bg_compile {
  const itest_kilnd *k;
  const char *text;
  int rc;
  char msg[1100];
  pthread_t thread;
} bg_compile;

static void *bg_main(void *arg) {
  bg_compile *b = arg;
  kiln_client_options o = {0};
  kiln_client *c = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  b->rc = kiln_client_connect(b->k->addr, &o, &c, &st);
  kiln_remote_executable *e = NULL;
  if (b->rc == 0) b->rc = kiln_client_compile_text(c, b->text, strlen(b->text), NULL, &e, &st);
  snprintf(b->msg, sizeof b->msg, "%s", st.msg);
  kiln_remote_executable_free(e);
  kiln_client_close(c);
  return NULL;
}

static void bg_start(bg_compile *b, const itest_kilnd *k, const char *text) {
  memset(b, 0, sizeof *b);
  b->k = k;
  b->text = text;
  ck_assert_int_eq(pthread_create(&b->thread, NULL, bg_main, b), 0);
}

static void bg_join(bg_compile *b) {
  pthread_join(b->thread, NULL);
  ck_assert_msg(b->rc == 0, "background compile: %s", b->msg);
}

/* ---- log records -------------------------------------------------------------------- */

#define MAX_FIELDS 24

typedef struct record {
  int n;
  char key[MAX_FIELDS][32];
  char val[MAX_FIELDS][256];
} record;

static const char *field(const record *r, const char *key) {
  for (int i = 0; i < r->n; i++)
    if (strcmp(r->key[i], key) == 0) return r->val[i];
  return NULL;
}

/* One logfmt line: key=value or key="quoted \" value". False if malformed. */
static bool parse_logfmt(const char *line, record *r) {
  memset(r, 0, sizeof *r);
  const char *p = line;
  while (*p && *p != '\n') {
    while (*p == ' ') p++;
    if (*p == '\0' || *p == '\n') break;
    if (r->n == MAX_FIELDS) return false;
    size_t k = 0;
    while (*p && *p != '=' && *p != ' ' && *p != '\n') {
      if (k + 1 < sizeof r->key[0]) r->key[r->n][k++] = *p;
      p++;
    }
    if (*p != '=' || k == 0) return false;
    p++;
    size_t v = 0;
    if (*p == '"') {
      p++;
      while (*p && *p != '"') {
        if (*p == '\\' && p[1]) p++;
        if (v + 1 < sizeof r->val[0]) r->val[r->n][v++] = *p;
        p++;
      }
      if (*p != '"') return false;
      p++;
    } else {
      while (*p && *p != ' ' && *p != '\n') {
        if (*p == '"' || *p == '=') return false;
        if (v + 1 < sizeof r->val[0]) r->val[r->n][v++] = *p;
        p++;
      }
    }
    r->n++;
  }
  return r->n > 0;
}

/* One flat JSON object of strings and numbers (what kilnd writes). */
static bool parse_json(const char *line, record *r) {
  memset(r, 0, sizeof *r);
  const char *p = line;
  if (*p++ != '{') return false;
  for (;;) {
    if (r->n == MAX_FIELDS || *p++ != '"') return false;
    size_t k = 0;
    while (*p && *p != '"') {
      if (k + 1 < sizeof r->key[0]) r->key[r->n][k++] = *p;
      p++;
    }
    if (*p++ != '"' || *p++ != ':') return false;
    size_t v = 0;
    if (*p == '"') {
      p++;
      while (*p && *p != '"') {
        if (*p == '\\') {
          p++;
          if (*p == 'u') { /* \u00XX: kilnd escapes bytes so; keep a marker */
            if (strlen(p) < 5) return false;
            p += 4;
          }
        }
        if (*p == '\0') return false;
        if (v + 1 < sizeof r->val[0]) r->val[r->n][v++] = *p;
        p++;
      }
      if (*p++ != '"') return false;
    } else {
      while (*p && (isdigit((unsigned char)*p) || *p == '.' || *p == '-')) {
        if (v + 1 < sizeof r->val[0]) r->val[r->n][v++] = *p;
        p++;
      }
      if (v == 0) return false;
    }
    r->n++;
    if (*p == '}') return p[1] == '\0' || p[1] == '\n';
    if (*p++ != ',') return false;
  }
}

static char *read_log(const itest_kilnd *k) {
  char p[300];
  snprintf(p, sizeof p, "%s/kilnd.err", k->dir);
  FILE *f = fopen(p, "r");
  if (f == NULL) return strdup("");
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = calloc(1, (size_t)n + 1);
  if (fread(text, 1, (size_t)n, f) != (size_t)n) text[0] = '\0';
  fclose(f);
  return text;
}

/* The first record with msg=`msg` whose field `key` is `value` (and, when
 * event is given, event=`event`), waiting up to 5 s for kilnd to write it
 * (it logs a call after its status went out). Every line of the log must
 * parse. */
static bool find_record(const itest_kilnd *k, bool json, const char *msg, const char *event,
                        const char *key, const char *value, record *out) {
  double until = itest_now() + 5;
  for (;;) {
    char *text = read_log(k);
    bool found = false;
    for (char *line = strtok(text, "\n"); line && !found; line = strtok(NULL, "\n")) {
      record r;
      bool ok = json ? parse_json(line, &r) : parse_logfmt(line, &r);
      ck_assert_msg(ok, "log line does not parse: %s", line);
      const char *m = field(&r, "msg"), *v = field(&r, key), *e = field(&r, "event");
      if (m && strcmp(m, msg) == 0 && v && strcmp(v, value) == 0 &&
          (event == NULL || (e && strcmp(e, event) == 0))) {
        *out = r;
        found = true;
      }
    }
    free(text);
    if (found) return true;
    if (itest_now() > until) return false;
    sleep_ms(50);
  }
}

static bool is_time(const char *t) { /* 2026-12-01T12:00:00.123Z */
  if (t == NULL || strlen(t) != 24) return false;
  for (int i = 0; i < 24; i++) {
    char ch = "dddd-dd-ddTdd:dd:dd.dddZ"[i];
    if (ch == 'd' ? !isdigit((unsigned char)t[i]) : t[i] != ch) return false;
  }
  return true;
}

static bool is_hex(const char *s, size_t len) {
  if (s == NULL || strlen(s) != len) return false;
  for (size_t i = 0; i < len; i++)
    if (!isxdigit((unsigned char)s[i])) return false;
  return true;
}

static void check_request_line(const record *r, const char *method, const char *code) {
  static const char *const keys[] = {"time",   "level",       "msg",   "request_id", "client",
                                     "method", "duration_ms", "cache", "key",        "code"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    ck_assert_msg(field(r, keys[i]) != NULL, "request line without %s", keys[i]);
  ck_assert_msg(is_time(field(r, "time")), "time '%s'", field(r, "time"));
  ck_assert_str_eq(field(r, "level"), "info");
  ck_assert_msg(is_hex(field(r, "request_id"), 16), "request_id '%s'", field(r, "request_id"));
  ck_assert_str_eq(field(r, "method"), method);
  ck_assert_str_eq(field(r, "code"), code);
  char *end;
  double ms = strtod(field(r, "duration_ms"), &end);
  ck_assert_msg(*end == '\0' && ms >= 0, "duration_ms '%s'", field(r, "duration_ms"));
}

/* ---- the log ------------------------------------------------------------------------ */

START_TEST(test_request_lines) {
  kiln_client *c = connect_to(&server_a, NULL);
  const char *text = program(3);
  kiln_remote_executable *e = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_compile_text(c, text, strlen(text), NULL, &e, &st), 0);
  char id[65];
  snprintf(id, sizeof id, "%s", kiln_client_last_request_id());
  ck_assert_msg(is_hex(id, 16), "trailer kiln-request-id '%s'", id);

  record r;
  ck_assert_msg(find_record(&server_a, false, "request", NULL, "request_id", id, &r),
                "no request line with request_id=%s", id);
  check_request_line(&r, "Compile", "OK");
  ck_assert_str_eq(field(&r, "client"), kiln_client_id(c));
  ck_assert_str_eq(field(&r, "cache"), "compiled");
  ck_assert_str_eq(field(&r, "key"), e->cache_key);
  /* The build is audited under the same request id. */
  ck_assert(find_record(&server_a, false, "audit", "compile", "request_id", id, &r));
  ck_assert_str_eq(field(&r, "key"), e->cache_key);
  ck_assert_str_eq(field(&r, "client"), kiln_client_id(c));

  /* The same program again: from memory, a new request id. */
  kiln_remote_executable *e2 = NULL;
  ck_assert_int_eq(kiln_client_compile_text(c, text, strlen(text), NULL, &e2, &st), 0);
  ck_assert_str_ne(kiln_client_last_request_id(), id);
  snprintf(id, sizeof id, "%s", kiln_client_last_request_id());
  ck_assert(find_record(&server_a, false, "request", NULL, "request_id", id, &r));
  check_request_line(&r, "Compile", "OK");
  ck_assert_str_eq(field(&r, "cache"), "memory");
  kiln_remote_executable_free(e2);

  /* A failed call has its line and its trailer too. */
  kiln_remote_result res;
  int frc =
      kiln_client_execute(c, "0000000000000000000000000000000000000000000000000000000000000000",
                          NULL, 0, NULL, &res, &st);
  ck_assert_int_ne(frc, 0);
  snprintf(id, sizeof id, "%s", kiln_client_last_request_id());
  ck_assert(find_record(&server_a, false, "request", NULL, "request_id", id, &r));
  check_request_line(&r, "Execute", "NOT_FOUND");
  ck_assert_str_eq(field(&r, "cache"), "none");

  /* An eviction is audited. */
  const char *keys[] = {e->cache_key};
  int64_t evicted = 0;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_cache_evict(c, keys, 1, false, false, &evicted, &st), 0);
  snprintf(id, sizeof id, "%s", kiln_client_last_request_id());
  ck_assert(find_record(&server_a, false, "audit", "evict", "request_id", id, &r));
  ck_assert_str_eq(field(&r, "keys"), e->cache_key);
  ck_assert_msg(atoi(field(&r, "evicted")) >= 1, "evicted=%s", field(&r, "evicted"));
  ck_assert(find_record(&server_a, false, "request", NULL, "request_id", id, &r));
  check_request_line(&r, "CacheEvict", "OK");
  kiln_remote_executable_free(e);
  kiln_client_close(c);
}
END_TEST

/* JSON, tokens: refusals are audited with the reason; the health probe
 * and a good token are logged as calls. */
START_TEST(test_json_and_auth_audit) {
  char cmd[1024];
  snprintf(
      cmd, sizeof cmd,
      "d() { printf %%s \"$1\" | sha256sum | cut -c1-64; };"
      "{ echo \"sha256:$(d tok-alice) alice user\"; echo \"sha256:$(d tok-root) root admin\"; }"
      " > '%s'",
      path("tokens"));
  ck_assert_int_eq(sh(cmd), 0);
  itest_kilnd k;
  const char *extra[] = {"--log-format", "json", "--tokens", path("tokens"), NULL};
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);

  kiln_client *bad = connect_to(&k, "tok-wrong");
  kiln_server_stats s;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_ne(kiln_client_stats(bad, &s, &st), 0);
  ck_assert_int_eq(kiln_rpc_status_code(&st), KILN_RPC_UNAUTHENTICATED);
  char id[65];
  snprintf(id, sizeof id, "%s", kiln_client_last_request_id());
  record r;
  ck_assert_msg(find_record(&k, true, "audit", "auth_failure", "request_id", id, &r),
                "no auth_failure audit for %s", id);
  ck_assert_str_eq(field(&r, "method"), "Stats");
  ck_assert_str_eq(field(&r, "reason"), "unknown token");
  ck_assert_msg(strncmp(field(&r, "peer") ? field(&r, "peer") : "", "ipv4:127.0.0.1", 14) == 0,
                "peer '%s'", field(&r, "peer"));
  ck_assert(find_record(&k, true, "request", NULL, "request_id", id, &r));
  check_request_line(&r, "Stats", "UNAUTHENTICATED");
  kiln_client_close(bad);

  kiln_client *alice = connect_to(&k, "tok-alice");
  kiln_status_clear(&st);
  ck_assert_int_ne(kiln_client_stats(alice, &s, &st), 0);
  ck_assert_int_eq(kiln_rpc_status_code(&st), KILN_RPC_PERMISSION_DENIED);
  snprintf(id, sizeof id, "%s", kiln_client_last_request_id());
  ck_assert(find_record(&k, true, "audit", "permission_denied", "request_id", id, &r));
  ck_assert_str_eq(field(&r, "client"), "alice");
  kiln_client_close(alice);

  kiln_client *root = connect_to(&k, "tok-root");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_stats(root, &s, &st), 0);
  kiln_server_stats_clear(&s);
  snprintf(id, sizeof id, "%s", kiln_client_last_request_id());
  ck_assert(find_record(&k, true, "request", NULL, "request_id", id, &r));
  check_request_line(&r, "Stats", "OK");
  ck_assert_str_eq(field(&r, "client"), "root");
  kiln_client_close(root);
  /* Start-up said, at level warn and without the text's old prefix, that
   * tokens travel in plaintext. */
  ck_assert(find_record(&k, true,
                        "--tokens without --tls-cert: tokens cross the network in plaintext", NULL,
                        "level", "warn", &r));
  ck_assert_int_eq(itest_kilnd_stop(&k, SIGTERM, 30), 0);
}
END_TEST

/* ---- progress ----------------------------------------------------------------------- */

typedef struct phases {
  int n;
  kiln_remote_phase v[32];
  char detail[32][64];
} phases;

static void on_phase(void *arg, const kiln_remote_progress *p) {
  phases *ph = arg;
  if (ph->n == 32) return;
  snprintf(ph->detail[ph->n], sizeof ph->detail[0], "%s", p->detail);
  ph->v[ph->n++] = p->phase;
}

static const kiln_remote_phase every_phase[] = {
    KILN_REMOTE_PHASE_QUEUED, KILN_REMOTE_PHASE_LOADING, KILN_REMOTE_PHASE_WAITING,
    KILN_REMOTE_PHASE_PASSES, KILN_REMOTE_PHASE_CC,      KILN_REMOTE_PHASE_STORING,
    KILN_REMOTE_PHASE_DONE};

START_TEST(test_progress_libkiln) {
  const char *text = program(11);
  arm_slow_cc();
  bg_compile a;
  bg_start(&a, &server_a, text); /* A builds it, slowly, holding the Redis lock */
  wait_slow_cc_started();
  kiln_client *c = connect_to(&server_b, NULL);
  phases ph = {0};
  kiln_remote_compile_options o = {.deadline_ms = 12000, .progress = {on_phase, &ph}};
  kiln_remote_executable *e = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  double t0 = itest_now();
  int rc = kiln_client_compile_text(c, text, strlen(text), &o, &e, &st);
  ck_assert_msg(rc == 0, "compile on B: %s", st.msg);
  ck_assert_msg(itest_now() - t0 > 5.0, "B did not wait for A (%.1f s)", itest_now() - t0);
  char got[512] = "";
  for (int i = 0; i < ph.n; i++)
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? "," : "",
             kiln_remote_phase_name(ph.v[i]));
  ck_assert_msg(ph.n == 7, "phases: %s", got);
  for (int i = 0; i < 7; i++) ck_assert_msg(ph.v[i] == every_phase[i], "phase %d: %s", i, got);
  ck_assert_str_eq(ph.detail[2], "another server's build");
  ck_assert_int_eq(e->cache_source, KILN_REMOTE_SOURCE_COMPILED);
  kiln_remote_executable_free(e);
  kiln_client_close(c);
  bg_join(&a);

  /* A hit: loading, then done; no build phases. */
  c = connect_to(&server_b, NULL);
  memset(&ph, 0, sizeof ph);
  o.progress.arg = &ph;
  ck_assert_int_eq(kiln_client_compile_text(c, text, strlen(text), &o, &e, &st), 0);
  ck_assert_int_ge(ph.n, 1);
  ck_assert_int_eq(ph.v[ph.n - 1], KILN_REMOTE_PHASE_DONE);
  for (int i = 0; i < ph.n; i++)
    ck_assert(ph.v[i] != KILN_REMOTE_PHASE_PASSES && ph.v[i] != KILN_REMOTE_PHASE_CC);
  kiln_remote_executable_free(e);

  /* A failure ends the stream with Compile's status, no DONE. */
  memset(&ph, 0, sizeof ph);
  kiln_status_clear(&st);
  const char *bad = "HloModule bad\nENTRY main {\n  ROOT y = f32[2] negate(f32[3] x)\n}\n";
  ck_assert_int_ne(kiln_client_compile_text(c, bad, strlen(bad), &o, &e, &st), 0);
  ck_assert_int_eq(kiln_rpc_status_code(&st), KILN_RPC_INVALID_ARGUMENT);
  for (int i = 0; i < ph.n; i++) ck_assert(ph.v[i] != KILN_REMOTE_PHASE_DONE);
  kiln_client_close(c);
}
END_TEST

START_TEST(test_progress_cli) {
  const char *cli = getenv("KILN_CLI");
  ck_assert_msg(cli && cli[0], "KILN_CLI is not set");
  const char *text = program(13);
  FILE *f = fopen(path("p13.hlo"), "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
  arm_slow_cc();
  bg_compile a;
  bg_start(&a, &server_a, text);
  wait_slow_cc_started();
  char *argv[] = {(char *)cli,  "compile",     (char *)path("p13.hlo"),
                  "--server",   server_b.addr, "--progress",
                  "--deadline", "12",          NULL};
  char *out, *err;
  int rc = itest_run(argv, &out, &err);
  ck_assert_msg(rc == 0, "kiln compile: %d\n%s", rc, err);
  ck_assert_msg(strstr(out, "cache compiled") != NULL, "stdout: %s", out);
  static const char *const want[] = {
      ": queued...", ": loading...", ": waiting for another server's build...",
      ": passes...", ": cc...",      ": storing...",
      ": done ("};
  const char *at = err;
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    const char *hit = strstr(at, want[i]);
    ck_assert_msg(hit != NULL, "no '%s' after the previous phase in:\n%s", want[i], err);
    const char *bol = hit;
    while (bol > err && bol[-1] != '\n') bol--;
    ck_assert_msg(strncmp(bol, path("p13.hlo"), strlen(path("p13.hlo"))) == 0,
                  "phase line names no file: %.80s", bol);
    at = strchr(hit, '\n') ? strchr(hit, '\n') : hit;
  }
  ck_assert_msg(strchr(err, '\r') == NULL, "carriage returns on a non-terminal");
  free(out);
  free(err);
  bg_join(&a);
}
END_TEST

/* On a terminal (a pty from script(1)) the phases share one line,
 * rewritten in place, without --progress; it is erased before the
 * summary. Skipped without script. */
START_TEST(test_progress_tty) {
  const char *cli = getenv("KILN_CLI");
  ck_assert_msg(cli && cli[0], "KILN_CLI is not set");
  if (sh("command -v script >/dev/null 2>&1") != 0) return;
  FILE *f = fopen(path("p19.hlo"), "w");
  ck_assert_ptr_nonnull(f);
  fputs(program(19), f);
  fclose(f);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "script -qec \"'%s' compile '%s' --server %s\" /dev/null > '%s' 2>&1",
           cli, path("p19.hlo"), server_a.addr, path("tty.out"));
  ck_assert_int_eq(sh(cmd), 0);
  f = fopen(path("tty.out"), "r");
  ck_assert_ptr_nonnull(f);
  static char out[16384];
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = '\0';
  fclose(f);
  char want[600];
  snprintf(want, sizeof want, "\r%s: passes... (", path("p19.hlo"));
  ck_assert_msg(strstr(out, want) != NULL, "no updating line in:\n%s", out);
  snprintf(want, sizeof want, "\r%s: cc... (", path("p19.hlo"));
  ck_assert_msg(strstr(out, want) != NULL, "%s", out);
  ck_assert_msg(strstr(out, "\033[K") != NULL, "%s", out);
  /* No phase has a line of its own: each follows a carriage return. */
  snprintf(want, sizeof want, "\n%s: ", path("p19.hlo"));
  ck_assert_msg(strstr(out, want) == NULL && strncmp(out, want + 1, strlen(want) - 1) != 0, "%s",
                out);
  const char *exe = strstr(out, "executable ");
  ck_assert_msg(exe != NULL, "%s", out);
  ck_assert_msg(strstr(exe, "...") == NULL, "a phase after the summary:\n%s", out);
}
END_TEST

/* ---- kiln top ----------------------------------------------------------------------- */

START_TEST(test_top_once) {
  const char *cli = getenv("KILN_CLI");
  ck_assert_msg(cli && cli[0], "KILN_CLI is not set");
  const char *text = program(17);
  arm_slow_cc();
  bg_compile a;
  bg_start(&a, &server_a, text);
  wait_slow_cc_started();
  char *argv[] = {(char *)cli, "top", "--server", server_a.addr, "--once", NULL};
  char *out, *err;
  int rc = itest_run(argv, &out, &err);
  ck_assert_msg(rc == 0, "kiln top: %d\n%s", rc, err);
  ck_assert_msg(strstr(out, "compiles    queued 0  running 1  threads 2") != NULL, "%s", out);
  ck_assert_msg(strstr(out, "cache       hit rate ") != NULL, "%s", out);
  ck_assert_msg(strstr(out, "memory      resident ") != NULL, "%s", out);
  ck_assert_msg(strstr(out, " cpu:0 ") != NULL, "%s", out);
  ck_assert_msg(strstr(out, "REQUEST") != NULL, "%s", out);
  /* The running compile, in its C compiler phase, under its client. */
  const char *row = strstr(out, " cc ");
  ck_assert_msg(row != NULL, "no compile in phase cc:\n%s", out);
  ck_assert_msg(strstr(out, "libkiln-") != NULL, "%s", out);
  ck_assert_msg(strchr(out, '\033') == NULL, "--once clears the screen");
  free(out);
  free(err);
  bg_join(&a);

  /* Nothing running afterwards; the hit rate counts the compile. */
  char *out2, *err2;
  ck_assert_int_eq(itest_run(argv, &out2, &err2), 0);
  ck_assert_msg(strstr(out2, "(no compiles)") != NULL, "%s", out2);
  free(out2);
  free(err2);
}
END_TEST

/* ---- SIGHUP: the log level --------------------------------------------------------- */

/* Whether the log holds a request line for request id `id` (no waiting). */
static bool has_request_line(const itest_kilnd *k, const char *id) {
  char *text = read_log(k);
  bool found = false;
  for (char *line = strtok(text, "\n"); line && !found; line = strtok(NULL, "\n")) {
    record r;
    if (parse_logfmt(line, &r) && field(&r, "msg") && strcmp(field(&r, "msg"), "request") == 0 &&
        field(&r, "request_id") && strcmp(field(&r, "request_id"), id) == 0)
      found = true;
  }
  free(text);
  return found;
}

static void write_conf(const char *level) {
  FILE *f = fopen(path("kilnd.conf"), "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "# test config\nlog-format = logfmt\nlog-level = %s\n", level);
  ck_assert_int_eq(fclose(f), 0);
}

/* A config file at log-level warn: request lines (info) are dropped. The
 * file changed to info and SIGHUP sent: the next call's line is written,
 * and nothing drained. A file that no longer parses keeps the level. */
START_TEST(test_sighup_log_level) {
  write_conf("warn");
  itest_kilnd k;
  const char *extra[] = {"--config", path("kilnd.conf"), NULL};
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  kiln_client *c = connect_to(&k, NULL);
  kiln_server_stats s;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_stats(c, &s, &st), 0);
  kiln_server_stats_clear(&s);
  char id[65];
  snprintf(id, sizeof id, "%s", kiln_client_last_request_id());
  sleep_ms(500);
  ck_assert_msg(!has_request_line(&k, id), "a request line was written at level warn");

  write_conf("info");
  ck_assert_int_eq(kill(k.pid, SIGHUP), 0);
  record r;
  ck_assert_msg(
      find_record(&k, false, "SIGHUP: log level info (was warn)", NULL, "level", "info", &r),
      "no reload line in the log");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_stats(c, &s, &st), 0);
  kiln_server_stats_clear(&s);
  snprintf(id, sizeof id, "%s", kiln_client_last_request_id());
  ck_assert(find_record(&k, false, "request", NULL, "request_id", id, &r));

  FILE *f = fopen(path("kilnd.conf"), "w");
  ck_assert_ptr_nonnull(f);
  fputs("log-level = loud\n", f);
  fclose(f);
  ck_assert_int_eq(kill(k.pid, SIGHUP), 0);
  sleep_ms(500);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_stats(c, &s, &st), 0);
  kiln_server_stats_clear(&s);
  snprintf(id, sizeof id, "%s", kiln_client_last_request_id());
  ck_assert(find_record(&k, false, "request", NULL, "request_id", id, &r));
  kiln_client_close(c);
  ck_assert(itest_kilnd_alive(&k));
  ck_assert_int_eq(itest_kilnd_stop(&k, SIGTERM, 30), 0);
}
END_TEST

/* ---- set-up ------------------------------------------------------------------------- */

static Suite *ops_suite(void) {
  Suite *s = suite_create("ops");
  TCase *tc = tcase_create("ops");
  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, test_request_lines);
  tcase_add_test(tc, test_json_and_auth_audit);
  tcase_add_test(tc, test_progress_libkiln);
  tcase_add_test(tc, test_progress_cli);
  tcase_add_test(tc, test_progress_tty);
  tcase_add_test(tc, test_top_once);
  tcase_add_test(tc, test_sighup_log_level);
  suite_add_tcase(s, tc);
  return s;
}

static int start_redis(void) {
  fflush(NULL);
  redis_pid = fork();
  if (redis_pid < 0) return -1;
  if (redis_pid == 0) {
    char log[300];
    snprintf(log, sizeof log, "%s/redis.log", dir);
    FILE *f = freopen(log, "w", stdout);
    (void)f;
    execlp("redis-server", "redis-server", "--port", "0", "--unixsocket", path("redis.sock"),
           "--save", "", "--appendonly", "no", "--maxmemory", "64mb", "--maxmemory-policy",
           "allkeys-lru", (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 500; i++) {
    if (access(path("redis.sock"), F_OK) == 0) return 0;
    sleep_ms(10);
  }
  return -1;
}

/* Both servers see Redis before the tests begin (they connect in the background). */
static int wait_redis_up(const itest_kilnd *k) {
  for (int i = 0; i < 200; i++) {
    int status = 0;
    char *body = NULL;
    size_t len = 0;
    if (itest_http_get(k->metrics, "/metrics", &status, &body, &len) == 0 && status == 200 &&
        strstr(body, "\nkiln_cache_redis_up 1")) {
      free(body);
      return 0;
    }
    free(body);
    sleep_ms(50);
  }
  return -1;
}

int main(void) {
  itest_require_kilnd("test_ops");
  if (sh("command -v redis-server >/dev/null 2>&1") != 0) {
    printf("test_ops: skipped: no redis-server\n");
    return 77;
  }
  snprintf(dir, sizeof dir, "/tmp/kiln-ops-XXXXXX");
  if (mkdtemp(dir) == NULL) return 1;
  /* The C compiler: slow once per arming (the rename picks one run). */
  FILE *f = fopen(path("slowcc"), "w");
  if (f == NULL) return 1;
  fprintf(f,
          "#!/bin/sh\n"
          "if mv '%s' '%s.$$' 2>/dev/null; then sleep 8; fi\n"
          "exec \"${REAL_CC:-cc}\" \"$@\"\n",
          path("slow.arm"), path("slow.taken"));
  fclose(f);
  chmod(path("slowcc"), 0755);
  setenv("KILN_CC", path("slowcc"), 1);
  if (start_redis()) {
    fprintf(stderr, "test_ops: redis-server did not start\n");
    return 1;
  }
  char url[300];
  snprintf(url, sizeof url, "unix:%s", path("redis.sock"));
  const char *extra[] = {"--redis-url", url, "--log-format", "logfmt", "--cache-lock-ttl-ms",
                         "60000",       NULL};
  setenv("KILN_CACHE_SECRET", "test-ops-cluster-secret-0123456789", 1);
  if (itest_kilnd_start(&server_a, extra) || itest_kilnd_start(&server_b, extra) ||
      wait_redis_up(&server_a) || wait_redis_up(&server_b)) {
    fprintf(stderr, "test_ops: the servers did not start or see Redis\n");
    kill(redis_pid, SIGTERM);
    return 1;
  }
  int rc = itest_run_suite("test_ops", ops_suite(), &server_a);
  if (itest_kilnd_stop(&server_b, SIGTERM, 30) != 0) {
    fprintf(stderr, "test_ops: server B did not exit cleanly\n");
    itest_kilnd_dump_log(&server_b);
    rc = 1;
  }
  kill(redis_pid, SIGTERM);
  waitpid(redis_pid, NULL, 0);
  if (rc == 0) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    sh(cmd);
  }
  return rc;
}
