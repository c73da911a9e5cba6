/* kilnd's executable cache end to end, through libkiln and the kiln
 * command: the second identical compile is a memory hit; renamed
 * instructions keep the key and a changed dtype changes it (in the
 * signature component); CacheList shows entries with their components and
 * CacheEvict removes them (the next compile builds again); bad keys are
 * INVALID_ARGUMENT naming the index; a disk entry serves after the loaded
 * table lost it and after a restart, and a disk entry with one byte
 * flipped is refused (counted as a MAC failure), rebuilt and runs right;
 * a FIFO or a link at an entry path is a miss, never a thread held in open();
 * a Redis that is not there fails nothing; 32 concurrent compiles of one
 * program on a 2-thread compile pool build once; `kiln cache` prints what
 * it documents with its exit codes.
 *
 * One kilnd (with a disk tier) serves most cases; the disk and Redis cases
 * start their own. Programs carry a constant unique to each case, so cases
 * never see each other's entries. Every cpu compile costs a C compiler
 * run, so the cases compile as little as they can.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf */
#endif
#include <arpa/inet.h>
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/cache.h"
#include "clients/c/kiln.h"
#include "tests/integration/itest.h"

static itest_kilnd server;
static char tmp[256]; /* cache directories live here */

/* ---- helpers ------------------------------------------------------------------------ */

static kiln_client *connect_to(const itest_kilnd *k) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_client *c = NULL;
  ck_assert_msg(kiln_client_connect(k->addr, NULL, &c, &st) == 0, "connect: %s", st.msg);
  return c;
}

/* x + K over f32[4] (or `dtype`), written with the given names. */
static char *program(const char *dtype, double k, bool renamed) {
  char *text = NULL;
  if (!renamed)
    asprintf(&text,
             "HloModule plus\n\nENTRY main {\n  x = %s[4] parameter(0)\n"
             "  c = %s[] constant(%g)\n  b = %s[4] broadcast(c), dimensions={}\n"
             "  ROOT r = %s[4] add(x, b)\n}\n",
             dtype, dtype, k, dtype, dtype);
  else /* other names, the constant first, a comment, other spacing */
    asprintf(&text,
             "HloModule renamed_module\n// the same program\nENTRY entry_fn {\n"
             "  konst.7 = %s[] constant(%g)\n  arg.0 = %s[4]   parameter(0)\n"
             "  bcast.3 = %s[4] broadcast(konst.7), dimensions={}\n"
             "  ROOT sum.9 = %s[4] add(arg.0, bcast.3)\n}\n",
             dtype, k, dtype, dtype, dtype);
  ck_assert_ptr_nonnull(text);
  return text;
}

static kiln_remote_executable *compile_with(kiln_client *c, const char *text, const char *backend,
                                            kiln_remote_cache_policy policy) {
  kiln_remote_compile_options o = {.backend = backend, .cache_policy = policy};
  kiln_remote_executable *e = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_client_compile_text(c, text, strlen(text), &o, &e, &st);
  ck_assert_msg(rc == 0, "compile: %s: %s", st.where, st.msg);
  return e;
}

static kiln_remote_executable *compile(kiln_client *c, const char *text, const char *backend) {
  return compile_with(c, text, backend, KILN_REMOTE_CACHE_DEFAULT);
}

#define ASSERT_SOURCE(e, want) \
  ck_assert_msg((e)->cache_source == (want), "cache source %s, want %s", \
                kiln_remote_source_name((e)->cache_source), kiln_remote_source_name(want))

/* Runs x + K on {1, 2, 3, 4} and checks the result. */
static void check_run(kiln_client *c, const kiln_remote_executable *e, double k) {
  kiln_literal *x;
  kiln_status st;
  kiln_status_clear(&st);
  const char *xt = "f32[4] {1, 2, 3, 4}";
  ck_assert_int_eq(kiln_literal_parse_text(xt, strlen(xt), &x, &st), 0);
  kiln_remote_arg arg = {.literal = x};
  kiln_remote_result r;
  ck_assert_msg(kiln_client_execute(c, e->id, &arg, 1, NULL, &r, &st) == 0, "execute: %s: %s",
                st.where, st.msg);
  ck_assert_uint_eq(r.noutputs, 1);
  const float *v = (const float *)r.outputs[0].literal->data;
  for (int i = 0; i < 4; i++) ck_assert_float_eq(v[i], (float)(i + 1 + k));
  kiln_remote_result_free(&r);
  kiln_literal_destroy(x);
}

/* A counter from Stats ("tier=\"disk\"" style labels, "" for none). */
static int64_t counter(kiln_client *c, const char *name, const char *labels) {
  kiln_server_stats s;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_stats(c, &s, &st) == 0, "stats: %s", st.msg);
  int64_t v = -1;
  for (uint32_t i = 0; i < s.ncounters; i++)
    if (strcmp(s.counters[i].name, name) == 0 && strcmp(s.counters[i].labels, labels) == 0)
      v = s.counters[i].value;
  kiln_server_stats_clear(&s);
  ck_assert_msg(v >= 0, "no counter %s{%s}", name, labels);
  return v;
}

static const char *component(const kiln_remote_executable *e, const char *name) {
  for (uint32_t i = 0; i < e->nkey_components; i++)
    if (strcmp(e->key_components[i].name, name) == 0) return e->key_components[i].digest;
  ck_abort_msg("no key component %s", name);
  return NULL;
}

static int kiln_cmd(const char *const *args, char **out, char **err) {
  const char *cli = getenv("KILN_CLI");
  ck_assert_msg(cli && cli[0], "KILN_CLI is not set");
  char *argv[32];
  int n = 0;
  argv[n++] = (char *)cli;
  for (int i = 0; args[i] && n < 31; i++) argv[n++] = (char *)args[i];
  argv[n] = NULL;
  return itest_run(argv, out, err);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* The file under dir (recursively) whose name contains `key`; "" if none. */
static bool find_entry(const char *dir, const char *key, char *out, size_t size) {
  DIR *d = opendir(dir);
  if (d == NULL) return false;
  struct dirent *de;
  bool found = false;
  while (!found && (de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.') continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    struct stat sb;
    if (lstat(path, &sb) != 0) continue;
    if (S_ISDIR(sb.st_mode))
      found = find_entry(path, key, out, size);
    else if (S_ISREG(sb.st_mode) && strstr(de->d_name, key)) {
      snprintf(out, size, "%s", path);
      found = true;
    }
  }
  closedir(d);
  return found;
}

/* Stops a server a case started; it must drain and exit 0 (under ASan:
 * without leaks). */
static void stop_ok(itest_kilnd *k) {
  int status = itest_kilnd_stop(k, SIGTERM, 30);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) itest_kilnd_dump_log(k);
  ck_assert_msg(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "kilnd exit status %d", status);
}

/* ---- the memory tier, keys, components ------------------------------------------------- */

START_TEST(test_second_compile_is_memory) {
  kiln_client *c = connect_to(&server);
  char *text = program("f32", 1.5, false);
  kiln_remote_executable *a = compile(c, text, "cpu");
  ASSERT_SOURCE(a, KILN_REMOTE_SOURCE_COMPILED);
  ck_assert_str_eq(a->id, a->cache_key);
  ck_assert_uint_eq(strlen(a->cache_key), 64);
  ck_assert_uint_eq(a->nkey_components, 5);
  const char *names[] = {"module", "signature", "options", "target", "version"};
  for (int i = 0; i < 5; i++) {
    ck_assert_str_eq(a->key_components[i].name, names[i]);
    ck_assert_uint_eq(strlen(a->key_components[i].digest), 64);
    ck_assert_uint_eq(strspn(a->key_components[i].digest, "0123456789abcdef"), 64);
  }
  kiln_remote_executable *b = compile(c, text, "cpu");
  ASSERT_SOURCE(b, KILN_REMOTE_SOURCE_MEMORY);
  ck_assert_str_eq(b->cache_key, a->cache_key);
  for (int i = 0; i < 5; i++)
    ck_assert_str_eq(b->key_components[i].digest, a->key_components[i].digest);
  check_run(c, b, 1.5);

  /* CacheList: the entry, in memory and on disk, with the same components. */
  kiln_server_cache_list l;
  kiln_status st;
  kiln_status_clear(&st);
  const char *keys[] = {a->cache_key};
  ck_assert_msg(kiln_client_cache_list(c, keys, 1, 0, &l, &st) == 0, "list: %s", st.msg);
  ck_assert_uint_eq(l.nentries, 1);
  ck_assert(!l.truncated);
  const kiln_server_cache_entry *e = &l.entries[0];
  ck_assert_str_eq(e->key, a->cache_key);
  ck_assert_uint_eq(e->ntiers, 2);
  ck_assert_str_eq(e->tiers[0], "memory");
  ck_assert_str_eq(e->tiers[1], "disk");
  ck_assert_int_gt(e->bytes, 0);
  ck_assert_int_gt(e->compile_ns, 0);
  ck_assert_int_gt(e->created_unix_ms, 1700000000000LL);
  ck_assert_uint_eq(e->ncomponents, 5);
  for (int i = 0; i < 5; i++) {
    ck_assert_str_eq(e->components[i].name, names[i]);
    ck_assert_str_eq(e->components[i].digest, a->key_components[i].digest);
  }
  kiln_server_cache_list_clear(&l);
  /* BYPASS builds again; REFRESH too, and both answer with what they built. */
  kiln_remote_executable *r = compile_with(c, text, "cpu", KILN_REMOTE_CACHE_REFRESH);
  ASSERT_SOURCE(r, KILN_REMOTE_SOURCE_COMPILED);
  ck_assert_str_eq(r->cache_key, a->cache_key);
  check_run(c, r, 1.5);
  kiln_remote_executable_free(r);
  kiln_remote_executable_free(a);
  kiln_remote_executable_free(b);
  free(text);
  kiln_client_close(c);
}
END_TEST

START_TEST(test_key_ignores_names_not_dtypes) {
  kiln_client *c = connect_to(&server);
  char *text = program("f32", 2.5, false), *renamed = program("f32", 2.5, true),
       *wide = program("f64", 2.5, false);
  kiln_remote_executable *a = compile(c, text, "interp");
  ASSERT_SOURCE(a, KILN_REMOTE_SOURCE_COMPILED);
  kiln_remote_executable *b = compile(c, renamed, "interp");
  ASSERT_SOURCE(b, KILN_REMOTE_SOURCE_MEMORY);
  ck_assert_str_eq(b->cache_key, a->cache_key);
  check_run(c, b, 2.5);
  kiln_remote_executable *w = compile(c, wide, "interp");
  ASSERT_SOURCE(w, KILN_REMOTE_SOURCE_COMPILED);
  ck_assert_str_ne(w->cache_key, a->cache_key);
  ck_assert_str_ne(component(w, "signature"), component(a, "signature"));
  ck_assert_str_eq(component(w, "options"), component(a, "options"));
  ck_assert_str_eq(component(w, "target"), component(a, "target"));
  ck_assert_str_eq(component(w, "version"), component(a, "version"));
  /* The backend is part of the target: interp and cpu never share. */
  kiln_remote_compile_options o = {
      .backend = "cpu", .has_optimization_level = true, .optimization_level = 0};
  kiln_remote_executable *o0 = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_compile_text(c, text, strlen(text), &o, &o0, &st), 0);
  ck_assert_str_ne(component(o0, "target"), component(a, "target"));
  ck_assert_str_ne(component(o0, "options"), component(a, "options"));
  ck_assert_str_eq(component(o0, "module"), component(a, "module"));
  ck_assert_str_eq(component(o0, "signature"), component(a, "signature"));
  kiln_remote_executable_free(o0);
  kiln_remote_executable_free(a);
  kiln_remote_executable_free(b);
  kiln_remote_executable_free(w);
  free(text), free(renamed), free(wide);
  kiln_client_close(c);
}
END_TEST

/* ---- CacheList / CacheEvict ------------------------------------------------------------- */

START_TEST(test_evict) {
  kiln_client *c = connect_to(&server);
  char *text = program("f32", 3.5, false);
  kiln_remote_executable *a = compile(c, text, "cpu");
  ASSERT_SOURCE(a, KILN_REMOTE_SOURCE_COMPILED);
  const char *keys[] = {a->cache_key};
  int64_t n = -1;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_cache_evict(c, keys, 1, false, false, &n, &st) == 0, "%s", st.msg);
  ck_assert_int_eq(n, 3); /* memory, disk, the loaded table */
  kiln_server_cache_list l;
  ck_assert_int_eq(kiln_client_cache_list(c, keys, 1, 0, &l, &st), 0);
  ck_assert_uint_eq(l.nentries, 0);
  kiln_server_cache_list_clear(&l);
  kiln_remote_executable *b = compile(c, text, "cpu");
  ASSERT_SOURCE(b, KILN_REMOTE_SOURCE_COMPILED);
  ck_assert_str_eq(b->cache_key, a->cache_key);
  check_run(c, b, 3.5);
  /* Gone already: nothing to remove, and no error. */
  ck_assert_int_eq(kiln_client_cache_evict(c, keys, 1, false, false, &n, &st), 0);
  ck_assert_int_eq(n, 3);
  ck_assert_int_eq(kiln_client_cache_evict(c, keys, 1, false, false, &n, &st), 0);
  ck_assert_int_eq(n, 0);
  kiln_remote_executable_free(a);
  kiln_remote_executable_free(b);
  free(text);
  kiln_client_close(c);
}
END_TEST

/* The request memo answers repeats without the compile pool, but only with
 * what the pool would say: options take part in it (another optimization
 * level is another key), and an executable built under BYPASS reaches the
 * tiers when a default-policy request finds it. */
START_TEST(test_memo_and_bypass) {
  kiln_client *c = connect_to(&server);
  char *text = program("f32", 6.25, false);
  kiln_remote_executable *a = compile_with(c, text, "cpu", KILN_REMOTE_CACHE_BYPASS);
  ASSERT_SOURCE(a, KILN_REMOTE_SOURCE_COMPILED);
  const char *keys[] = {a->cache_key};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_server_cache_list l;
  ck_assert_int_eq(kiln_client_cache_list(c, keys, 1, 0, &l, &st), 0);
  ck_assert_uint_eq(l.nentries, 0); /* BYPASS wrote no tier */
  kiln_server_cache_list_clear(&l);
  kiln_remote_executable *b = compile(c, text, "cpu");
  ASSERT_SOURCE(b, KILN_REMOTE_SOURCE_MEMORY);
  ck_assert_str_eq(b->cache_key, a->cache_key);
  ck_assert_int_eq(kiln_client_cache_list(c, keys, 1, 0, &l, &st), 0);
  ck_assert_uint_eq(l.nentries, 1); /* stored by the default-policy hit */
  ck_assert_uint_ge(l.entries[0].ntiers, 1);
  kiln_server_cache_list_clear(&l);
  /* Repeats: answered from the memo, the same answer every time. */
  for (int i = 0; i < 3; i++) {
    kiln_remote_executable *r = compile(c, text, "cpu");
    ASSERT_SOURCE(r, KILN_REMOTE_SOURCE_MEMORY);
    ck_assert_str_eq(r->cache_key, a->cache_key);
    ck_assert_uint_eq(r->nkey_components, 5);
    ck_assert_uint_eq(r->nparams, 1);
    ck_assert_int_eq(r->nwarnings, 0);
    check_run(c, r, 6.25);
    kiln_remote_executable_free(r);
  }
  /* The same text at another optimization level: another key. */
  kiln_remote_compile_options o = {
      .backend = "cpu", .has_optimization_level = true, .optimization_level = 1};
  kiln_remote_executable *d = NULL;
  ck_assert_int_eq(kiln_client_compile_text(c, text, strlen(text), &o, &d, &st), 0);
  ck_assert_str_ne(d->cache_key, a->cache_key);
  ck_assert_str_ne(component(d, "options"), component(a, "options"));
  ASSERT_SOURCE(d, KILN_REMOTE_SOURCE_COMPILED);
  check_run(c, d, 6.25);
  kiln_remote_executable_free(a);
  kiln_remote_executable_free(b);
  kiln_remote_executable_free(d);
  free(text);
  kiln_client_close(c);
}
END_TEST

static void expect_invalid(int rc, const kiln_status *st, const char *msg) {
  ck_assert_int_eq(rc, KILN_EINVAL);
  ck_assert_int_eq(kiln_rpc_status_code(st), KILN_RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st->msg, msg) != NULL, "message '%s' lacks '%s'", st->msg, msg);
}

START_TEST(test_bad_requests) {
  kiln_client *c = connect_to(&server);
  const char *good = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
  const char *bad[] = {good, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeef",
                       "not-a-key"};
  kiln_server_cache_list l;
  kiln_status st;
  kiln_status_clear(&st);
  expect_invalid(
      kiln_client_cache_list(c, bad, 2, 0, &l, &st), &st,
      "keys[1]: error: '00112233445566778899aabbccddeeff00112233445566778899aabbccddeef' is "
      "not a cache key (64 hex digits)");
  kiln_status_clear(&st);
  const char *third[] = {good, good, "zz"};
  expect_invalid(kiln_client_cache_list(c, third, 3, 0, &l, &st), &st,
                 "keys[2]: error: 'zz' is not a cache key (64 hex digits)");
  kiln_status_clear(&st);
  expect_invalid(kiln_client_cache_list(c, NULL, 0, -1, &l, &st), &st,
                 "limit: error: -1 is out of range (0 to 100000)");
  kiln_status_clear(&st);
  expect_invalid(kiln_client_cache_list(c, NULL, 0, 100001, &l, &st), &st,
                 "limit: error: 100001 is out of range (0 to 100000)");
  int64_t n;
  kiln_status_clear(&st);
  expect_invalid(kiln_client_cache_evict(c, bad + 2, 1, false, false, &n, &st), &st,
                 "keys[0]: error: 'not-a-key' is not a cache key (64 hex digits)");
  kiln_status_clear(&st);
  expect_invalid(kiln_client_cache_evict(c, NULL, 0, false, false, &n, &st), &st,
                 "keys: error: name the keys to evict, or set all");
  kiln_status_clear(&st);
  expect_invalid(kiln_client_cache_evict(c, bad, 1, true, false, &n, &st), &st,
                 "all: error: set with keys: give one or the other");
  /* An unknown but well-formed key is simply not listed. */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_cache_list(c, bad, 1, 0, &l, &st), 0);
  ck_assert_uint_eq(l.nentries, 0);
  kiln_server_cache_list_clear(&l);
  /* Uppercase hex names the same entry. */
  kiln_remote_executable *e =
      compile(c, "HloModule u\nENTRY e {\n  ROOT p = s32[3] parameter(0)\n}\n", "interp");
  char upper[65];
  for (int i = 0; i < 65; i++) upper[i] = (char)toupper((unsigned char)e->cache_key[i]);
  const char *ukeys[] = {upper};
  ck_assert_int_eq(kiln_client_cache_evict(c, ukeys, 1, false, false, &n, &st), 0);
  ck_assert_int_eq(n, 1); /* interpreter programs live in the table only */
  kiln_remote_executable_free(e);
  kiln_client_close(c);
}
END_TEST

/* ---- Stats and /metrics ---------------------------------------------------------------- */

START_TEST(test_counters) {
  kiln_client *c = connect_to(&server);
  char *text = program("f32", 4.5, false);
  int64_t hits0 = counter(c, "kiln_cache_hits_total", "tier=\"memory\"");
  int64_t builds0 = counter(c, "kiln_cache_builds_total", "");
  kiln_remote_executable *a = compile(c, text, "cpu"), *b = compile(c, text, "cpu");
  ASSERT_SOURCE(b, KILN_REMOTE_SOURCE_MEMORY);
  ck_assert_int_ge(counter(c, "kiln_cache_hits_total", "tier=\"memory\"") - hits0, 1);
  ck_assert_int_ge(counter(c, "kiln_cache_builds_total", "") - builds0, 1);
  ck_assert_int_ge(counter(c, "kiln_cache_entries", "tier=\"disk\""), 1);
  ck_assert_int_eq(counter(c, "kiln_cache_redis_up", ""), 0);
  kiln_server_stats s;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_stats(c, &s, &st), 0);
  ck_assert_int_ge(s.cache_hits, 1);
  ck_assert_int_ge(s.cache_misses, 1);
  kiln_server_stats_clear(&s);

  char *body;
  size_t len;
  int status;
  ck_assert_int_eq(itest_http_get(server.metrics, "/metrics", &status, &body, &len), 0);
  ck_assert_int_eq(status, 200);
  itest_metrics m;
  char err[256];
  ck_assert_msg(itest_metrics_parse(body, &m, err, sizeof err) == 0, "%s", err);
  const char *names[] = {"kiln_cache_hits_total", "kiln_cache_misses_total", "kiln_cache_bytes",
                         "kiln_cache_entries", "kiln_cache_evictions_total"};
  const char *tiers[] = {"tier=\"memory\"", "tier=\"disk\"", "tier=\"redis\""};
  for (int i = 0; i < 5; i++)
    for (int t = 0; t < 3; t++)
      ck_assert_msg(!isnan(itest_metrics_value(&m, names[i], tiers[t])), "no %s{%s}", names[i],
                    tiers[t]);
  const char *reasons[] = {"truncated", "version", "key", "mac"};
  for (int r = 0; r < 4; r++) {
    char lab[64];
    snprintf(lab, sizeof lab, "reason=\"%s\"", reasons[r]);
    ck_assert(!isnan(itest_metrics_value(&m, "kiln_cache_integrity_failures_total", lab)));
  }
  const char *plain[] = {"kiln_cache_redis_faults_total", "kiln_cache_redis_up",
                         "kiln_cache_builds_total",       "kiln_cache_single_flight_waits_total",
                         "kiln_cache_lock_waits_total",   "kiln_cache_compile_ns_saved_total",
                         "kiln_cache_skipped_fast_total"};
  for (int i = 0; i < 7; i++)
    ck_assert_msg(!isnan(itest_metrics_value(&m, plain[i], NULL)), "no %s", plain[i]);
  ck_assert_double_ge(itest_metrics_value(&m, "kiln_cache_hits_total", "tier=\"memory\""),
                      (double)hits0 + 1);
  itest_metrics_free(&m);
  free(body);
  kiln_remote_executable_free(a);
  kiln_remote_executable_free(b);
  free(text);
  kiln_client_close(c);
}
END_TEST

/* ---- single flight on a small pool ----------------------------------------------------- */

typedef struct racer {
  kiln_client *c; /* shared: libkiln clients are thread-safe */
  const char *text;
  kiln_remote_source source;
  char key[65];
  int rc;
  kiln_status st;
} racer;

static void *race(void *arg) {
  racer *r = arg;
  kiln_status_clear(&r->st);
  kiln_remote_compile_options o = {.backend = "cpu"};
  kiln_remote_executable *e = NULL;
  r->rc = kiln_client_compile_text(r->c, r->text, strlen(r->text), &o, &e, &r->st);
  if (r->rc == 0) {
    r->source = e->cache_source;
    snprintf(r->key, sizeof r->key, "%s", e->cache_key);
  }
  kiln_remote_executable_free(e);
  return NULL;
}

START_TEST(test_32_concurrent_compiles) {
  kiln_client *c = connect_to(&server);
  int64_t builds0 = counter(c, "kiln_cache_builds_total", "");
  char *text = program("f32", 5.5, false);
  racer rs[32];
  pthread_t th[32];
  for (int i = 0; i < 32; i++) {
    rs[i] = (racer){.c = c, .text = text};
    ck_assert_int_eq(pthread_create(&th[i], NULL, race, &rs[i]), 0);
  }
  int compiled = 0;
  for (int i = 0; i < 32; i++) {
    pthread_join(th[i], NULL);
    ck_assert_msg(rs[i].rc == 0, "compile %d: %s: %s", i, rs[i].st.where, rs[i].st.msg);
    ck_assert_str_eq(rs[i].key, rs[0].key);
    compiled += rs[i].source == KILN_REMOTE_SOURCE_COMPILED;
    ck_assert(rs[i].source == KILN_REMOTE_SOURCE_COMPILED ||
              rs[i].source == KILN_REMOTE_SOURCE_MEMORY ||
              rs[i].source == KILN_REMOTE_SOURCE_SINGLE_FLIGHT);
  }
  ck_assert_int_eq(compiled, 1);
  ck_assert_int_eq(counter(c, "kiln_cache_builds_total", "") - builds0, 1);
  free(text);
  kiln_client_close(c);
}
END_TEST

/* ---- the disk tier: behind the table, across restarts, tampered ------------------------ */

/* Writes a validly sealed entry holding no executable for e's key into the
 * disk tier at dir (whose secret file the server reads too). */
static void put_garbage(const char *dir, const kiln_remote_executable *e) {
  kiln_cache_config cfg;
  kiln_cache_config_init(&cfg);
  cfg.memory_bytes = 0;
  cfg.disk_dir = dir;
  kiln_cache *cache;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_cache_create(&cfg, &cache, &st) == 0, "%s", st.msg);
  kiln_cache_meta meta;
  memset(&meta, 0, sizeof meta);
  ck_assert_int_eq(kiln_cache_from_hex(e->cache_key, meta.key, KILN_CACHE_DIGEST_LEN), 0);
  for (int i = 0; i < KILN_CACHE_NPARTS; i++)
    ck_assert_int_eq(
        kiln_cache_from_hex(e->key_components[i].digest, meta.parts[i], KILN_CACHE_DIGEST_LEN), 0);
  meta.kind = KILN_CACHE_PAYLOAD_CPU_EXE;
  meta.compile_ns = 1000000;
  const char junk[] = "KILNEXE1 but not really an executable";
  ck_assert_int_eq(kiln_cache_put(cache, &meta, junk, sizeof junk, &st), 0);
  kiln_cache_destroy(cache);
}

START_TEST(test_disk_tier) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/disk", tmp);
  /* No memory tier and a table of two: programs pushed out of the table
   * (the least recently used) come back from disk. */
  const char *extra[] = {"--cache-dir", dir, "--cache-memory-bytes", "0", "--max-executables",
                         "2",           NULL};
  itest_kilnd k;
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  kiln_client *c = connect_to(&k);
  char *t1 = program("f32", 6.5, false), *t2 = program("f32", 7.5, false),
       *t3 = program("f32", 12.5, false);
  kiln_remote_executable *e1 = compile(c, t1, "cpu");
  ASSERT_SOURCE(e1, KILN_REMOTE_SOURCE_COMPILED);
  kiln_remote_executable *e2 = compile(c, t2, "cpu");
  ASSERT_SOURCE(e2, KILN_REMOTE_SOURCE_COMPILED);
  kiln_remote_executable *e3 = compile(c, t3, "cpu"); /* t1 leaves the table */
  ASSERT_SOURCE(e3, KILN_REMOTE_SOURCE_COMPILED);
  kiln_remote_executable_free(e3);
  kiln_remote_executable *d1 = compile(c, t1, "cpu"); /* t2 leaves the table */
  ASSERT_SOURCE(d1, KILN_REMOTE_SOURCE_DISK);
  check_run(c, d1, 6.5);
  ck_assert_int_eq(counter(c, "kiln_cache_hits_total", "tier=\"disk\""), 1);

  /* One byte of the second entry flipped on disk: refused, counted,
   * deleted, rebuilt, and the rebuilt one runs right. */
  char path[1024];
  ck_assert_msg(find_entry(dir, e2->cache_key, path, sizeof path), "no file for %s under %s",
                e2->cache_key, dir);
  int fd = open(path, O_RDWR);
  ck_assert_int_ge(fd, 0);
  off_t size = lseek(fd, 0, SEEK_END);
  ck_assert_int_gt(size, 300);
  off_t at = size - 100; /* in the payload, past every header field */
  unsigned char byte;
  ck_assert_int_eq(pread(fd, &byte, 1, at), 1);
  byte ^= 0x40;
  ck_assert_int_eq(pwrite(fd, &byte, 1, at), 1);
  close(fd);
  kiln_remote_executable *r2 = compile(c, t2, "cpu");
  ASSERT_SOURCE(r2, KILN_REMOTE_SOURCE_COMPILED);
  ck_assert_int_eq(counter(c, "kiln_cache_integrity_failures_total", "reason=\"mac\""), 1);
  check_run(c, r2, 7.5);
  kiln_client_close(c);
  stop_ok(&k);

  /* A new server on the same directory finds both. */
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  c = connect_to(&k);
  kiln_remote_executable *again = compile(c, t1, "cpu");
  ASSERT_SOURCE(again, KILN_REMOTE_SOURCE_DISK);
  ck_assert_str_eq(again->cache_key, e1->cache_key);
  check_run(c, again, 6.5);
  kiln_client_close(c);
  stop_ok(&k);

  /* An entry that passes every check but is no executable (a Kiln with
   * another executable format would write one): rebuilt, not fatal. */
  put_garbage(dir, e2);
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  c = connect_to(&k);
  kiln_remote_executable *rebuilt = compile(c, t2, "cpu");
  ASSERT_SOURCE(rebuilt, KILN_REMOTE_SOURCE_COMPILED);
  check_run(c, rebuilt, 7.5);
  kiln_remote_executable_free(rebuilt);
  rebuilt = compile(c, t2, "cpu");
  ASSERT_SOURCE(rebuilt, KILN_REMOTE_SOURCE_MEMORY);
  kiln_remote_executable_free(rebuilt);
  kiln_client_close(c);
  stop_ok(&k);
  char logpath[400];
  snprintf(logpath, sizeof logpath, "%s/kilnd.err", k.dir);
  FILE *f = fopen(logpath, "r");
  ck_assert_ptr_nonnull(f);
  char log[8192] = "";
  log[fread(log, 1, sizeof log - 1, f)] = '\0';
  fclose(f);
  char want[160];
  snprintf(want, sizeof want, "cache entry %s from disk does not load", e2->cache_key);
  ck_assert_msg(strstr(log, want) != NULL, "kilnd.err: %s", log);
  kiln_remote_executable_free(e1);
  kiln_remote_executable_free(e2);
  kiln_remote_executable_free(d1);
  kiln_remote_executable_free(r2);
  kiln_remote_executable_free(again);
  free(t1), free(t2), free(t3);
}
END_TEST

/* Someone who can write the cache directory left a FIFO at one entry's path
 * and a link (to a copy of the valid entry) at another's: each compile is a
 * miss, built and answered at once, not a compile thread held in open(),
 * and the server still drains. */
START_TEST(test_disk_special_entries) {
  char dir[512], copy[600];
  snprintf(dir, sizeof dir, "%s/special", tmp);
  const char *extra[] = {"--cache-dir", dir, "--cache-memory-bytes", "0", NULL};
  itest_kilnd k;
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  kiln_client *c = connect_to(&k);
  char *tf = program("f32", 13.5, false), *tl = program("f32", 14.5, false);
  kiln_remote_executable *ef = compile(c, tf, "cpu"), *el = compile(c, tl, "cpu");
  ASSERT_SOURCE(ef, KILN_REMOTE_SOURCE_COMPILED);
  ASSERT_SOURCE(el, KILN_REMOTE_SOURCE_COMPILED);
  kiln_client_close(c);
  stop_ok(&k);

  char pf[1024], pl[1024];
  ck_assert(find_entry(dir, ef->cache_key, pf, sizeof pf));
  ck_assert(find_entry(dir, el->cache_key, pl, sizeof pl));
  ck_assert_int_eq(unlink(pf), 0);
  ck_assert_int_eq(mkfifo(pf, 0600), 0);
  snprintf(copy, sizeof copy, "%s/copy-of-entry", tmp);
  ck_assert_int_eq(rename(pl, copy), 0);
  ck_assert_int_eq(symlink(copy, pl), 0);

  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  c = connect_to(&k);
  kiln_remote_executable *rf = compile(c, tf, "cpu"), *rl = compile(c, tl, "cpu");
  ASSERT_SOURCE(rf, KILN_REMOTE_SOURCE_COMPILED);
  ASSERT_SOURCE(rl, KILN_REMOTE_SOURCE_COMPILED);
  check_run(c, rf, 13.5);
  check_run(c, rl, 14.5);
  kiln_client_close(c);
  stop_ok(&k);
  /* The rebuilt entries replaced both with regular files. */
  struct stat sb;
  ck_assert_int_eq(lstat(pf, &sb), 0);
  ck_assert(S_ISREG(sb.st_mode));
  ck_assert_int_eq(lstat(pl, &sb), 0);
  ck_assert(S_ISREG(sb.st_mode));
  kiln_remote_executable_free(ef);
  kiln_remote_executable_free(el);
  kiln_remote_executable_free(rf);
  kiln_remote_executable_free(rl);
  free(tf), free(tl);
}
END_TEST

/* ---- Redis that is not there ----------------------------------------------------------- */

START_TEST(test_redis_down) {
  /* A port nobody listens on: bind one, note it, close it. */
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  ck_assert_int_eq(bind(s, (struct sockaddr *)&sa, sizeof sa), 0);
  socklen_t sl = sizeof sa;
  getsockname(s, (struct sockaddr *)&sa, &sl);
  close(s);
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", ntohs(sa.sin_port));
  const char *extra[] = {"--redis-url", url, "--redis-timeout-ms", "100", NULL};
  itest_kilnd k;
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  kiln_client *c = connect_to(&k);
  char *text = program("f32", 8.5, false);
  kiln_remote_executable *a = compile(c, text, "cpu");
  ASSERT_SOURCE(a, KILN_REMOTE_SOURCE_COMPILED);
  check_run(c, a, 8.5);
  kiln_remote_executable *b = compile(c, text, "cpu");
  ASSERT_SOURCE(b, KILN_REMOTE_SOURCE_MEMORY);
  ck_assert_int_eq(counter(c, "kiln_cache_redis_up", ""), 0);
  kiln_client_close(c);
  ck_assert(itest_kilnd_alive(&k));
  stop_ok(&k);
  kiln_remote_executable_free(a);
  kiln_remote_executable_free(b);
  free(text);
}
END_TEST

/* ---- the kiln command ------------------------------------------------------------------ */

START_TEST(test_cli_explain) {
  char a[512], b[512], wide[512];
  snprintf(a, sizeof a, "%s/a.hlo", tmp);
  snprintf(b, sizeof b, "%s/b.hlo", tmp);
  snprintf(wide, sizeof wide, "%s/wide.hlo", tmp);
  char *ta = program("f32", 9.5, false), *tb = program("f32", 9.5, true),
       *tw = program("f64", 9.5, false);
  write_file(a, ta);
  write_file(b, tb);
  write_file(wide, tw);
  char *out, *err;
  const char *same[] = {"cache", "explain", a, b, NULL};
  ck_assert_int_eq(kiln_cmd(same, &out, &err), 0);
  ck_assert_msg(strstr(out, "same key\n") != NULL, "%s", out);
  free(out), free(err);

  const char *differs[] = {"cache", "explain", a, wide, NULL};
  ck_assert_int_eq(kiln_cmd(differs, &out, &err), 1);
  ck_assert_msg(strstr(out, "differs: signature\n") && strstr(out, "differs: module\n") &&
                    !strstr(out, "differs: options") && !strstr(out, "same key"),
                "%s", out);
  free(out), free(err);
  const char *opt[] = {"cache", "explain", a, b, "-O", "1", NULL};
  ck_assert_int_eq(kiln_cmd(opt, &out, &err), 0);
  free(out), free(err);

  /* The key computed here is the server's. */
  kiln_client *c = connect_to(&server);
  kiln_remote_executable *e = compile(c, ta, "cpu"), *w = compile(c, tw, "cpu");
  ck_assert_int_eq(kiln_cmd(same, &out, &err), 0);
  char line[1024];
  snprintf(line, sizeof line, "%s  %s\n", e->cache_key, a);
  ck_assert_msg(strncmp(out, line, strlen(line)) == 0, "%s vs %s", out, line);
  free(out), free(err);
  const char *keys[] = {"cache",    "explain",   e->cache_key, w->cache_key,
                        "--server", server.addr, NULL};
  ck_assert_int_eq(kiln_cmd(keys, &out, &err), 1);
  ck_assert_msg(strstr(out, "differs: signature\n") != NULL, "%s", out);
  free(out), free(err);

  const char *mixed[] = {"cache", "explain", e->cache_key, a, NULL};
  ck_assert_int_eq(kiln_cmd(mixed, &out, &err), 2);
  free(out), free(err);
  const char *missing[] = {"cache", "explain", a, "/nonexistent.hlo", NULL};
  ck_assert_int_eq(kiln_cmd(missing, &out, &err), 2);
  free(out), free(err);
  kiln_remote_executable_free(e);
  kiln_remote_executable_free(w);
  kiln_client_close(c);
  free(ta), free(tb), free(tw);
}
END_TEST

START_TEST(test_cli_cache) {
  kiln_client *c = connect_to(&server);
  char *text = program("s32", 11, false);
  kiln_remote_executable *e = compile(c, text, "cpu");
  kiln_client_close(c);
  char *out, *err;
  const char *stats[] = {"cache", "stats", "--server", server.addr, NULL};
  ck_assert_int_eq(kiln_cmd(stats, &out, &err), 0);
  ck_assert_msg(strncmp(out, "cache hits ", 11) == 0, "%s", out);
  ck_assert(strstr(out, "\nkiln_cache_hits_total{tier=\"disk\"} ") != NULL);
  ck_assert(strstr(out, "\nkiln_cache_integrity_failures_total{reason=\"mac\"} ") != NULL);
  free(out), free(err);

  const char *list[] = {"cache",      "list",         "--server", server.addr,
                        e->cache_key, "--components", NULL};
  ck_assert_int_eq(kiln_cmd(list, &out, &err), 0);
  char head[128];
  snprintf(head, sizeof head, "%s memory,disk ", e->cache_key);
  ck_assert_msg(strncmp(out, head, strlen(head)) == 0, "%s", out);
  char comp[128];
  snprintf(comp, sizeof comp, "\n  signature %s\n", e->key_components[1].digest);
  ck_assert_msg(strstr(out, comp) != NULL, "%s", out);
  free(out), free(err);

  const char *evict[] = {"cache", "evict", "--server", server.addr, e->cache_key, NULL};
  ck_assert_int_eq(kiln_cmd(evict, &out, &err), 0);
  ck_assert_str_eq(out, "evicted 3\n");
  free(out), free(err);
  const char *bad[] = {"cache", "evict", "--server", server.addr, "abc", NULL};
  ck_assert_int_eq(kiln_cmd(bad, &out, &err), 2);
  free(out), free(err);
  const char *neither[] = {"cache", "evict", "--server", server.addr, NULL};
  ck_assert_int_eq(kiln_cmd(neither, &out, &err), 2);
  free(out), free(err);
  const char *nosrv[] = {"cache", "stats", NULL};
  ck_assert_int_eq(kiln_cmd(nosrv, &out, &err), 2);
  free(out), free(err);
  const char *unknown[] = {"cache", "purge", NULL};
  ck_assert_int_eq(kiln_cmd(unknown, &out, &err), 2);
  free(out), free(err);
  /* compile --server prints the cache source and the key. */
  char file[512];
  snprintf(file, sizeof file, "%s/s32.hlo", tmp);
  write_file(file, text);
  const char *comp1[] = {"compile", file, "--server", server.addr, NULL};
  ck_assert_int_eq(kiln_cmd(comp1, &out, &err), 0);
  char want[128];
  snprintf(want, sizeof want, "\ncache compiled %s\n", e->cache_key);
  ck_assert_msg(strstr(out, want) != NULL, "%s", out);
  free(out), free(err);
  ck_assert_int_eq(kiln_cmd(comp1, &out, &err), 0);
  snprintf(want, sizeof want, "\ncache memory %s\n", e->cache_key);
  ck_assert_msg(strstr(out, want) != NULL, "%s", out);
  free(out), free(err);
  kiln_remote_executable_free(e);
  free(text);
}
END_TEST

static Suite *cache_suite(void) {
  Suite *s = suite_create("cache_server");
  TCase *tc = tcase_create("cache");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_second_compile_is_memory);
  tcase_add_test(tc, test_key_ignores_names_not_dtypes);
  tcase_add_test(tc, test_evict);
  tcase_add_test(tc, test_memo_and_bypass);
  tcase_add_test(tc, test_bad_requests);
  tcase_add_test(tc, test_counters);
  tcase_add_test(tc, test_32_concurrent_compiles);
  tcase_add_test(tc, test_disk_tier);
  tcase_add_test(tc, test_disk_special_entries);
  tcase_add_test(tc, test_redis_down);
  tcase_add_test(tc, test_cli_explain);
  tcase_add_test(tc, test_cli_cache);
  suite_add_tcase(s, tc);
  return s;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

int main(void) {
  itest_require_kilnd("test_cache_server");
  snprintf(tmp, sizeof tmp, "/tmp/kiln-cache-itest-XXXXXX");
  if (mkdtemp(tmp) == NULL) return 1;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/main", tmp);
  const char *extra[] = {"--cache-dir", dir, "--compile-threads", "2", NULL};
  if (itest_kilnd_start(&server, extra)) return 1;
  int rc = itest_run_suite("test_cache_server", cache_suite(), &server);
  nftw(tmp, remove_one, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}
