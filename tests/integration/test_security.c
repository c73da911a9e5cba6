/* kilnd's transport security and authentication against real clients
 * (libkiln): TLS with a CA made by openssl here, mutual TLS, bearer tokens
 * and roles, the plaintext health-only port, certificate and token reload
 * on SIGHUP.
 *
 * The main server runs with --tls-cert/--tls-key, --tls-client-ca,
 * --tokens (alice and bob are users, root is admin) and --health-listen.
 * Every refusal must come with the right gRPC status, and after each one a
 * good client (mutual TLS and the admin token) is still served. Cases that
 * need a server configured otherwise (an expired certificate, a malformed
 * token file, reloading) start their own kilnd.
 *
 * The certificates are made with the openssl command in a temporary
 * directory: the expired server certificate is one whose notAfter lies
 * before now (`openssl x509 -days -1`; OpenSSL 3.0 has no -not_after).
 * Skipped (77) without kilnd or openssl.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clients/c/kiln.h"
#include "tests/integration/itest.h"

static itest_kilnd server;
static char dir[256];         /* the certificates and token files */
static char health_addr[128]; /* the main server's health port */

static const char negate_text[] = "HloModule neg\n"
                                  "ENTRY main {\n"
                                  "  x = f32[4] parameter(0)\n"
                                  "  ROOT y = f32[4] negate(x)\n"
                                  "}\n";

/* ---- files -------------------------------------------------------------------------- */

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

/* CA and CA2 (a stranger), the server's certificate for 127.0.0.1 and
 * localhost, an expired one, a client certificate (CN=alice) of each CA,
 * a server certificate of CA2 (for the reload), and the token file. */
static int make_files(void) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "set -e; cd '%s'; K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';"
           "for ca in ca ca2; do openssl req -x509 $K -keyout $ca.key -out $ca.crt"
           "  -subj /CN=kiln-test-$ca -days 2; done;"
           "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > srv.ext;"
           "sign() { openssl req $K -keyout $1.key -out $1.csr -subj /CN=$2;"
           "  openssl x509 -req -in $1.csr -CA $3.crt -CAkey $3.key -CAcreateserial -out $1.crt"
           "  -days $4 $5; }\n"
           "sign srv localhost ca 2 '-extfile srv.ext';"
           "sign exp localhost ca -1 '-extfile srv.ext';"
           "sign srv2 localhost ca2 2 '-extfile srv.ext';"
           "sign cli alice ca 2 '';"
           "sign cli2 alice ca2 2 '';"
           "d() { printf %%s \"$1\" | openssl dgst -sha256 -r | cut -c1-64; };"
           "{ echo '# test tokens'; echo \"sha256:$(d tok-alice) alice user\";"
           "  echo \"sha256:$(d tok-bob) bob user  # a comment\";"
           "  echo \"sha256:$(d tok-quota) quota user memory=8 queue=1 buffers=2\";"
           "  echo; echo \"sha256:$(d tok-root) root admin\"; } > tokens;"
           "{ echo \"sha256:$(d a) alice user\"; echo \"sha256:$(d b) bob superuser\"; } > bad1;"
           "{ echo \"sha256:$(d a) alice user memory-bytes=1Gi\"; } > bad2;"
           "echo 'sha256:12 alice user' > bad3;"
           "{ echo \"sha256:$(d a) alice user memory=0\"; } > bad4;"
           "{ echo \"sha256:$(d a) alice user buffers=2\"; echo \"sha256:$(d b) alice user\"; } "
           "> bad5",
           dir);
  char full[4400];
  snprintf(full, sizeof full, "( %s ) >'%s/openssl.log' 2>&1", cmd, dir);
  return sh(full);
}

/* The address of the "health listening on" line in the server's stdout. */
static void find_health_addr(const itest_kilnd *k, char *out, size_t size) {
  char p[300], line[512];
  snprintf(p, sizeof p, "%s/kilnd.out", k->dir);
  out[0] = '\0';
  FILE *f = fopen(p, "r");
  if (f == NULL) return;
  while (fgets(line, sizeof line, f)) {
    const char *h = strstr(line, "health listening on ");
    if (h == NULL) continue;
    snprintf(out, size, "%s", h + strlen("health listening on "));
    out[strcspn(out, "\r\n")] = '\0';
  }
  fclose(f);
}

/* ---- clients ------------------------------------------------------------------------ */

typedef struct creds {
  const char *ca, *cert, *key, *token, *client_id;
  bool plaintext;
} creds;

static int try_connect(const char *addr, creds w, kiln_client **out, kiln_status *st) {
  kiln_client_options o = {.connect_timeout_ms = 3000, .client_id = w.client_id};
  if (!w.plaintext) {
    o.tls = true;
    o.tls_ca_file = w.ca ? w.ca : path("ca.crt");
    o.tls_cert_file = w.cert;
    o.tls_key_file = w.key;
  }
  o.token = w.token;
  kiln_status_clear(st);
  return kiln_client_connect(addr, &o, out, st);
}

/* Mutual TLS with the CA's client certificate and `token`. */
static creds good(const char *token) {
  return (creds){.cert = path("cli.crt"), .key = path("cli.key"), .token = token};
}

static kiln_client *connect_ok(const char *addr, creds w) {
  kiln_client *c = NULL;
  kiln_status st;
  ck_assert_msg(try_connect(addr, w, &c, &st) == 0, "connect: %s: %s", st.where, st.msg);
  return c;
}

/* A handshake the server refuses: the connection never becomes ready, or
 * (TLS 1.3 lets a client finish before the server has checked its
 * certificate) the first call fails UNAVAILABLE. */
static void expect_refused_handshake(const char *addr, creds w) {
  kiln_client *c = NULL;
  kiln_status st;
  if (try_connect(addr, w, &c, &st) != 0) {
    ck_assert_msg(kiln_rpc_status_code(&st) == KILN_RPC_UNAVAILABLE, "connect failed with %s: %s",
                  st.where, st.msg);
    return;
  }
  bool serving = false;
  kiln_status_clear(&st);
  int rc = kiln_client_health(c, NULL, &serving, &st);
  kiln_client_close(c);
  ck_assert_msg(rc != 0, "the server answered a client it should have refused");
  ck_assert_msg(kiln_rpc_status_code(&st) == KILN_RPC_UNAVAILABLE, "health failed with %s: %s",
                st.where, st.msg);
}

static void expect_code(int rc, const kiln_status *st, kiln_rpc_code want, const char *what) {
  ck_assert_msg(rc != 0, "%s succeeded; expected %s", what, kiln_rpc_code_name(want));
  ck_assert_msg(kiln_rpc_status_code(st) == want, "%s: expected %s, got %s: %s", what,
                kiln_rpc_code_name(want), st->where, st->msg);
}

static kiln_literal *vector4(float v) {
  kiln_arena *a = kiln_arena_create();
  kiln_shape s;
  int64_t n = 4;
  ck_assert_int_eq(kiln_shape_make_array(a, &s, KILN_F32, &n, 1), 0);
  kiln_literal *l = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &l, NULL), 0);
  for (int i = 0; i < 4; i++) ((float *)l->data)[i] = v;
  kiln_arena_destroy(a);
  return l;
}

/* A good client: admin token over mutual TLS; compiles, executes, reads
 * stats. Every case ends with it. */
static void good_client_served(void) {
  kiln_client *c = connect_ok(server.addr, good("tok-root"));
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_compile_options co = {.backend = "interp"};
  kiln_remote_executable *exe = NULL;
  ck_assert_msg(kiln_client_compile_text(c, negate_text, strlen(negate_text), &co, &exe, &st) == 0,
                "compile: %s: %s", st.where, st.msg);
  kiln_literal *x = vector4(2.0f);
  kiln_remote_arg args[1] = {{.literal = x}};
  kiln_remote_result r;
  ck_assert_msg(kiln_client_execute(c, exe->id, args, 1, NULL, &r, &st) == 0, "execute: %s: %s",
                st.where, st.msg);
  ck_assert_uint_eq(r.noutputs, 1);
  ck_assert(((const float *)r.outputs[0].literal->data)[0] == -2.0f);
  kiln_remote_result_free(&r);
  kiln_literal_destroy(x);
  kiln_remote_executable_free(exe);
  kiln_server_stats s;
  ck_assert_msg(kiln_client_stats(c, &s, &st) == 0, "stats: %s: %s", st.where, st.msg);
  kiln_server_stats_clear(&s);
  kiln_client_close(c);
}

static char *put(kiln_client *c, float v) {
  kiln_literal *x = vector4(v);
  kiln_remote_buffer b;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_put_buffer(c, x, NULL, &b, &st) == 0, "put: %s: %s", st.where, st.msg);
  char *h = strdup(b.handle);
  kiln_remote_buffer_clear(&b);
  kiln_literal_destroy(x);
  return h;
}

/* ---- TLS ---------------------------------------------------------------------------- */

START_TEST(test_plaintext_client_refused) {
  expect_refused_handshake(server.addr, (creds){.plaintext = true, .token = "tok-root"});
  good_client_served();
}
END_TEST

START_TEST(test_wrong_ca_refused) {
  creds w = good("tok-root");
  w.ca = path("ca2.crt");
  expect_refused_handshake(server.addr, w);
  good_client_served();
}
END_TEST

START_TEST(test_mtls_without_client_cert_refused) {
  expect_refused_handshake(server.addr, (creds){.token = "tok-root"});
  good_client_served();
}
END_TEST

START_TEST(test_client_cert_of_another_ca_refused) {
  creds w = good("tok-root");
  w.cert = path("cli2.crt");
  w.key = path("cli2.key");
  expect_refused_handshake(server.addr, w);
  good_client_served();
}
END_TEST

START_TEST(test_expired_server_cert_refused) {
  itest_kilnd k;
  const char *extra[] = {"--tls-cert", path("exp.crt"), "--tls-key", path("exp.key"), NULL};
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  expect_refused_handshake(k.addr, (creds){0});
  /* The same server with a valid certificate would be reachable: the
   * failure is the expiry, not the setup. */
  ck_assert_int_eq(itest_kilnd_stop(&k, SIGTERM, 30), 0);
  const char *ok[] = {"--tls-cert", path("srv.crt"), "--tls-key", path("srv.key"), NULL};
  ck_assert_int_eq(itest_kilnd_start(&k, ok), 0);
  kiln_client *c = connect_ok(k.addr, (creds){0});
  bool serving = false;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_health(c, NULL, &serving, &st), 0);
  ck_assert(serving);
  kiln_client_close(c);
  /* TLS without client certificates or tokens: kilnd says so at start. */
  char errp[300];
  snprintf(errp, sizeof errp, "%s/kilnd.err", k.dir);
  FILE *f = fopen(errp, "r");
  ck_assert_ptr_nonnull(f);
  char buf[4096];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  ck_assert_msg(strstr(buf, "unauthenticated") != NULL, "no warning in: %s", buf);
  ck_assert_int_eq(itest_kilnd_stop(&k, SIGTERM, 30), 0);
  good_client_served();
}
END_TEST

START_TEST(test_good_client) { good_client_served(); }
END_TEST

/* ---- tokens ------------------------------------------------------------------------- */

START_TEST(test_no_token_unauthenticated) {
  kiln_client *c = connect_ok(server.addr, good(NULL));
  kiln_status st;
  kiln_status_clear(&st);
  kiln_server_stats s;
  expect_code(kiln_client_stats(c, &s, &st), &st, KILN_RPC_UNAUTHENTICATED, "stats without token");
  kiln_status_clear(&st);
  kiln_remote_executable *exe = NULL;
  expect_code(kiln_client_compile_text(c, negate_text, strlen(negate_text), NULL, &exe, &st), &st,
              KILN_RPC_UNAUTHENTICATED, "compile without token");
  /* Health needs no token. */
  bool serving = false;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_health(c, NULL, &serving, &st), 0);
  ck_assert(serving);
  kiln_client_close(c);
  good_client_served();
}
END_TEST

START_TEST(test_wrong_token_unauthenticated) {
  kiln_client *c = connect_ok(server.addr, good("tok-alicex"));
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_executable *exe = NULL;
  expect_code(kiln_client_compile_text(c, negate_text, strlen(negate_text), NULL, &exe, &st), &st,
              KILN_RPC_UNAUTHENTICATED, "compile with a wrong token");
  ck_assert_ptr_nonnull(strstr(st.msg, "unknown token"));
  kiln_client_close(c);
  good_client_served();
}
END_TEST

START_TEST(test_user_token_on_admin_calls) {
  kiln_client *c = connect_ok(server.addr, good("tok-alice"));
  kiln_status st;
  kiln_status_clear(&st);
  int64_t evicted = -1;
  expect_code(kiln_client_cache_evict(c, NULL, 0, true, true, &evicted, &st), &st,
              KILN_RPC_PERMISSION_DENIED, "user CacheEvict all shared");
  kiln_status_clear(&st);
  kiln_server_cache_list l;
  expect_code(kiln_client_cache_list(c, NULL, 0, 0, &l, &st), &st, KILN_RPC_PERMISSION_DENIED,
              "user CacheList");
  kiln_status_clear(&st);
  kiln_server_stats s;
  expect_code(kiln_client_stats(c, &s, &st), &st, KILN_RPC_PERMISSION_DENIED, "user Stats");
  /* A user's own work is served. */
  kiln_status_clear(&st);
  kiln_remote_compile_options co = {.backend = "interp"};
  kiln_remote_executable *exe = NULL;
  ck_assert_msg(kiln_client_compile_text(c, negate_text, strlen(negate_text), &co, &exe, &st) == 0,
                "user compile: %s", st.msg);
  kiln_remote_executable_free(exe);
  kiln_client_close(c);
  /* The admin may. */
  c = connect_ok(server.addr, good("tok-root"));
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_cache_list(c, NULL, 0, 0, &l, &st) == 0, "admin list: %s", st.msg);
  kiln_server_cache_list_clear(&l);
  kiln_client_close(c);
  good_client_served();
}
END_TEST

START_TEST(test_user_cannot_read_another_users_buffer) {
  kiln_client *alice = connect_ok(server.addr, good("tok-alice"));
  kiln_client *bob = connect_ok(server.addr, good("tok-bob"));
  char *h = put(alice, 3.0f);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_literal *got = NULL;
  expect_code(kiln_client_get_buffer(bob, h, NULL, &got, &st), &st, KILN_RPC_NOT_FOUND,
              "bob reading alice's handle");
  int64_t released = -1, unknown = -1;
  const char *hs[1] = {h};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_release_buffers(bob, hs, 1, &released, &unknown, &st), 0);
  ck_assert_int_eq(released, 0);
  ck_assert_int_eq(unknown, 1);
  /* Still alice's, untouched. */
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_get_buffer(alice, h, NULL, &got, &st) == 0, "alice: %s", st.msg);
  ck_assert(((const float *)got->data)[0] == 3.0f);
  kiln_literal_destroy(got);
  ck_assert_int_eq(kiln_client_release_buffers(alice, hs, 1, &released, NULL, &st), 0);
  ck_assert_int_eq(released, 1);
  free(h);
  kiln_client_close(alice);
  kiln_client_close(bob);
  good_client_served();
}
END_TEST

START_TEST(test_spoofed_kiln_client_header_ignored) {
  kiln_client *alice = connect_ok(server.addr, good("tok-alice"));
  /* bob's token, alice's name in kiln-client: still bob. */
  creds w = good("tok-bob");
  w.client_id = "alice";
  kiln_client *spoof = connect_ok(server.addr, w);
  char *h = put(alice, 5.0f);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_literal *got = NULL;
  expect_code(kiln_client_get_buffer(spoof, h, NULL, &got, &st), &st, KILN_RPC_NOT_FOUND,
              "bob naming himself alice");
  /* What the spoofer uploads is bob's: another bob connection sees it. */
  char *hb = put(spoof, 7.0f);
  creds wb = good("tok-bob");
  wb.client_id = "somebody-else";
  kiln_client *bob = connect_ok(server.addr, wb);
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_get_buffer(bob, hb, NULL, &got, &st) == 0, "bob: %s", st.msg);
  ck_assert(((const float *)got->data)[0] == 7.0f);
  kiln_literal_destroy(got);
  const char *hs[2] = {h, hb};
  ck_assert_int_eq(kiln_client_release_buffers(alice, hs, 1, NULL, NULL, &st), 0);
  ck_assert_int_eq(kiln_client_release_buffers(bob, hs + 1, 1, NULL, NULL, &st), 0);
  free(h);
  free(hb);
  kiln_client_close(alice);
  kiln_client_close(spoof);
  kiln_client_close(bob);
  good_client_served();
}
END_TEST

/* A token's own quotas: client quota (memory=8) cannot store a 16-byte vector,
 * while alice (the server-wide quota) can. */
START_TEST(test_per_token_quota) {
  kiln_client *q = connect_ok(server.addr, good("tok-quota"));
  kiln_literal *x = vector4(1.0f);
  kiln_remote_buffer b;
  kiln_status st;
  kiln_status_clear(&st);
  expect_code(kiln_client_put_buffer(q, x, NULL, &b, &st), &st, KILN_RPC_RESOURCE_EXHAUSTED,
              "a put over the token's quota");
  ck_assert_msg(strstr(st.msg, "quota 8"), "%s", st.msg);
  kiln_literal_destroy(x);
  kiln_client_close(q);
  kiln_client *alice = connect_ok(server.addr, good("tok-alice"));
  free(put(alice, 2.0f));
  kiln_client_close(alice);
  good_client_served();
}
END_TEST

START_TEST(test_malformed_token_files) {
  static const struct {
    const char *file, *where, *what;
  } cases[] = {
      {"bad1", "bad1:2", "role must be"},
      {"bad2", "bad2:1", "memory-bytes"},
      {"bad3", "bad3:1", "64 hex digits"},
      {"bad4", "bad4:1", "memory=0: expected bytes from 1"},
      {"bad5", "tokens", "client 'alice' has two tokens with different quotas"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *argv[] = {(char *)itest_kilnd_path(),
                    (char *)"--listen",
                    (char *)"127.0.0.1:0",
                    (char *)"--metrics-listen",
                    (char *)"off",
                    (char *)"--tokens",
                    (char *)path(cases[i].file),
                    NULL};
    char *out = NULL, *err = NULL;
    int status = itest_run(argv, &out, &err);
    ck_assert_msg(status != 0, "kilnd started with %s", cases[i].file);
    ck_assert_msg(err && strstr(err, cases[i].where) && strstr(err, cases[i].what),
                  "%s: stderr does not name %s (%s): %s", cases[i].file, cases[i].where,
                  cases[i].what, err ? err : "");
    ck_assert_msg(out == NULL || strstr(out, "listening") == NULL, "it listened: %s", out);
    free(out);
    free(err);
  }
  good_client_served();
}
END_TEST

/* Mutual TLS without tokens: the certificate's subject is the identity,
 * whatever kiln-client says. */
START_TEST(test_mtls_subject_is_identity) {
  itest_kilnd k;
  const char *extra[] = {"--tls-cert",      path("srv.crt"), "--tls-key", path("srv.key"),
                         "--tls-client-ca", path("ca.crt"),  NULL};
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  creds w1 = good(NULL), w2 = good(NULL);
  w1.client_id = "one";
  w2.client_id = "two";
  kiln_client *c1 = connect_ok(k.addr, w1), *c2 = connect_ok(k.addr, w2);
  char *h = put(c1, 9.0f);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_literal *got = NULL;
  ck_assert_msg(kiln_client_get_buffer(c2, h, NULL, &got, &st) == 0,
                "the same certificate under another kiln-client: %s", st.msg);
  ck_assert(((const float *)got->data)[0] == 9.0f);
  kiln_literal_destroy(got);
  /* No roles without tokens: Stats is served. */
  kiln_server_stats s;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_stats(c2, &s, &st), 0);
  kiln_server_stats_clear(&s);
  /* h stays live: a server exiting with cpu buffers must free them
   * before their devices (it crashed there once). */
  free(h);
  kiln_client_close(c1);
  kiln_client_close(c2);
  ck_assert_int_eq(itest_kilnd_stop(&k, SIGTERM, 30), 0);
  good_client_served();
}
END_TEST

/* The kiln command: --tls-ca, --tls-cert/--tls-key and --token, or
 * KILN_TOKEN. */
START_TEST(test_cli_flags_and_env) {
  const char *cli = getenv("KILN_CLI");
  ck_assert_msg(cli && cli[0], "KILN_CLI is not set");
  char *argv[] = {(char *)cli,
                  (char *)"stats",
                  (char *)"--server",
                  server.addr,
                  (char *)"--tls-ca",
                  (char *)path("ca.crt"),
                  (char *)"--tls-cert",
                  (char *)path("cli.crt"),
                  (char *)"--tls-key",
                  (char *)path("cli.key"),
                  (char *)"--token",
                  (char *)"tok-root",
                  NULL};
  char *out = NULL, *err = NULL;
  ck_assert_msg(itest_run(argv, &out, &err) == 0, "kiln stats: %s", err ? err : "");
  ck_assert_ptr_nonnull(strstr(out, "server "));
  free(out);
  free(err);
  argv[10] = NULL; /* no --token: KILN_TOKEN */
  setenv("KILN_TOKEN", "tok-alice", 1);
  ck_assert_int_ne(itest_run(argv, &out, &err), 0);
  ck_assert_msg(err && strstr(err, "PERMISSION_DENIED"), "stderr: %s", err ? err : "");
  free(out);
  free(err);
  unsetenv("KILN_TOKEN");
  ck_assert_int_ne(itest_run(argv, &out, &err), 0);
  ck_assert_msg(err && strstr(err, "UNAUTHENTICATED"), "stderr: %s", err ? err : "");
  free(out);
  free(err);
  good_client_served();
}
END_TEST

/* ---- the health port ---------------------------------------------------------------- */

START_TEST(test_health_port_plaintext_without_token) {
  ck_assert_msg(health_addr[0], "kilnd printed no health address");
  kiln_client *c = connect_ok(health_addr, (creds){.plaintext = true});
  bool serving = false;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_health(c, NULL, &serving, &st) == 0, "health: %s", st.msg);
  ck_assert(serving);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_health(c, "kiln.v1.Kiln", &serving, &st), 0);
  /* Nothing else, even with a valid token. */
  kiln_client_close(c);
  c = connect_ok(health_addr, (creds){.plaintext = true, .token = "tok-root"});
  kiln_server_stats s;
  kiln_status_clear(&st);
  expect_code(kiln_client_stats(c, &s, &st), &st, KILN_RPC_UNIMPLEMENTED,
              "Stats on the health port");
  kiln_status_clear(&st);
  kiln_remote_executable *exe = NULL;
  expect_code(kiln_client_compile_text(c, negate_text, strlen(negate_text), NULL, &exe, &st), &st,
              KILN_RPC_UNIMPLEMENTED, "Compile on the health port");
  kiln_client_close(c);
  good_client_served();
}
END_TEST

/* ---- reload ------------------------------------------------------------------------- */

typedef struct runner {
  kiln_client *c;
  const char *id;
  int done, failed;
  char msg[256];
} runner;

static void *run_for_2s(void *arg) {
  runner *r = arg;
  kiln_literal *x = vector4(1.0f);
  kiln_remote_arg args[1] = {{.literal = x}};
  double end = itest_now() + 2.0;
  while (itest_now() < end) {
    kiln_remote_result res;
    kiln_status st;
    kiln_status_clear(&st);
    if (kiln_client_execute(r->c, r->id, args, 1, NULL, &res, &st) != 0) {
      r->failed++;
      snprintf(r->msg, sizeof r->msg, "%.60s: %.180s", st.where, st.msg);
      continue;
    }
    kiln_remote_result_free(&res);
    r->done++;
  }
  kiln_literal_destroy(x);
  return NULL;
}

/* SIGHUP with new files: a connection made before keeps being served
 * (a thread executes on it throughout), new connections get the new
 * certificate (of CA2: a client trusting only CA is refused, one trusting
 * CA2 is served). */
START_TEST(test_sighup_reload_keeps_calls) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cd '%s' && cp srv.crt live.crt && cp srv.key live.key", dir);
  ck_assert_int_eq(sh(cmd), 0);
  itest_kilnd k;
  const char *extra[] = {
      "--tls-cert", path("live.crt"), "--tls-key", path("live.key"), "--interp-devices", "2", NULL};
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  kiln_client *before = connect_ok(k.addr, (creds){0});
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_compile_options co = {.backend = "interp"};
  kiln_remote_executable *exe = NULL;
  ck_assert_int_eq(
      kiln_client_compile_text(before, negate_text, strlen(negate_text), &co, &exe, &st), 0);
  /* A thread keeps executing on the old connection through the reload. */
  runner r = {.c = before, .id = exe->id};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, run_for_2s, &r), 0);
  usleep(300000);
  snprintf(cmd, sizeof cmd, "cd '%s' && cp srv2.crt live.crt && cp srv2.key live.key", dir);
  ck_assert_int_eq(sh(cmd), 0);
  kill(k.pid, SIGHUP);
  pthread_join(t, NULL);
  ck_assert_msg(r.failed == 0 && r.done > 0,
                "executions on the old connection during the reload: "
                "%d done, %d failed (%s)",
                r.done, r.failed, r.msg);
  /* The parent's own connection, made before, still works too. */
  bool serving = false;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_health(before, NULL, &serving, &st), 0);
  kiln_remote_executable_free(exe);
  kiln_client_close(before);
  expect_refused_handshake(k.addr, (creds){0});
  kiln_client *after = connect_ok(k.addr, (creds){.ca = path("ca2.crt")});
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_health(after, NULL, &serving, &st), 0);
  ck_assert(serving);
  kiln_client_close(after);
  /* A broken file on the next SIGHUP keeps the working certificate. */
  snprintf(cmd, sizeof cmd, "cd '%s' && cp srv.key live.crt", dir);
  ck_assert_int_eq(sh(cmd), 0);
  kill(k.pid, SIGHUP);
  usleep(300000);
  after = connect_ok(k.addr, (creds){.ca = path("ca2.crt")});
  kiln_client_close(after);
  ck_assert(itest_kilnd_alive(&k));
  ck_assert_int_eq(itest_kilnd_stop(&k, SIGTERM, 30), 0);
  good_client_served();
}
END_TEST

/* A compile over connection c; 0 or its rpc code. */
static kiln_rpc_code compile_code(kiln_client *c) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_compile_options co = {.backend = "interp"};
  kiln_remote_executable *exe = NULL;
  int rc = kiln_client_compile_text(c, negate_text, strlen(negate_text), &co, &exe, &st);
  if (rc == 0) kiln_remote_executable_free(exe);
  return rc == 0 ? KILN_RPC_OK : kiln_rpc_status_code(&st);
}

/* SIGHUP reads the token file again: a token added is accepted, a token
 * removed is refused from the next call on, on connections made before
 * too; a file that no longer parses keeps the tokens that were. */
START_TEST(test_sighup_reloads_tokens) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cd '%s' && cp tokens live-tokens", dir);
  ck_assert_int_eq(sh(cmd), 0);
  itest_kilnd k;
  const char *extra[] = {"--tokens", path("live-tokens"), NULL};
  ck_assert_int_eq(itest_kilnd_start(&k, extra), 0);
  kiln_client *alice = connect_ok(k.addr, (creds){.plaintext = true, .token = "tok-alice"});
  kiln_client *carol = connect_ok(k.addr, (creds){.plaintext = true, .token = "tok-carol"});
  ck_assert_int_eq(compile_code(alice), KILN_RPC_OK);
  ck_assert_int_eq(compile_code(carol), KILN_RPC_UNAUTHENTICATED);
  snprintf(cmd, sizeof cmd,
           "cd '%s' && d() { printf %%s \"$1\" | openssl dgst -sha256 -r | cut -c1-64; } && "
           "{ echo \"sha256:$(d tok-carol) carol user\"; "
           "echo \"sha256:$(d tok-root) root admin\"; } > live-tokens.new && "
           "mv live-tokens.new live-tokens",
           dir);
  ck_assert_int_eq(sh(cmd), 0);
  ck_assert_int_eq(kill(k.pid, SIGHUP), 0);
  double t0 = itest_now();
  while (compile_code(carol) != KILN_RPC_OK && itest_now() - t0 < 10) usleep(50000);
  ck_assert_int_eq(compile_code(carol), KILN_RPC_OK);
  ck_assert_int_eq(compile_code(alice), KILN_RPC_UNAUTHENTICATED);
  /* A broken file: carol stays. */
  snprintf(cmd, sizeof cmd, "cd '%s' && cp bad1 live-tokens", dir);
  ck_assert_int_eq(sh(cmd), 0);
  ck_assert_int_eq(kill(k.pid, SIGHUP), 0);
  usleep(300000);
  ck_assert_int_eq(compile_code(carol), KILN_RPC_OK);
  ck_assert_int_eq(compile_code(alice), KILN_RPC_UNAUTHENTICATED);
  kiln_client_close(alice);
  kiln_client_close(carol);
  ck_assert(itest_kilnd_alive(&k));
  int status = itest_kilnd_stop(&k, SIGTERM, 30);
  ck_assert_msg(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "kilnd status %d",
                status);
  char log[600];
  snprintf(log, sizeof log, "grep -q 'tokens not reloaded, the old ones stay' '%s/kilnd.err'",
           k.dir);
  ck_assert_int_eq(sh(log), 0);
}
END_TEST

static Suite *security_suite(void) {
  Suite *s = suite_create("security");
  TCase *tls = tcase_create("tls");
  tcase_set_timeout(tls, 120);
  tcase_add_test(tls, test_good_client);
  tcase_add_test(tls, test_plaintext_client_refused);
  tcase_add_test(tls, test_wrong_ca_refused);
  tcase_add_test(tls, test_mtls_without_client_cert_refused);
  tcase_add_test(tls, test_client_cert_of_another_ca_refused);
  tcase_add_test(tls, test_expired_server_cert_refused);
  tcase_add_test(tls, test_sighup_reload_keeps_calls);
  tcase_add_test(tls, test_mtls_subject_is_identity);
  suite_add_tcase(s, tls);
  TCase *tok = tcase_create("tokens");
  tcase_set_timeout(tok, 120);
  tcase_add_test(tok, test_no_token_unauthenticated);
  tcase_add_test(tok, test_wrong_token_unauthenticated);
  tcase_add_test(tok, test_user_token_on_admin_calls);
  tcase_add_test(tok, test_user_cannot_read_another_users_buffer);
  tcase_add_test(tok, test_spoofed_kiln_client_header_ignored);
  tcase_add_test(tok, test_per_token_quota);
  tcase_add_test(tok, test_malformed_token_files);
  tcase_add_test(tok, test_health_port_plaintext_without_token);
  tcase_add_test(tok, test_cli_flags_and_env);
  tcase_add_test(tok, test_sighup_reloads_tokens);
  suite_add_tcase(s, tok);
  return s;
}

int main(void) {
  itest_require_kilnd("test_security");
  if (sh("openssl version >/dev/null 2>&1") != 0) {
    printf("test_security: skipped: no openssl command\n");
    return 77;
  }
  snprintf(dir, sizeof dir, "/tmp/kiln-security-XXXXXX");
  if (mkdtemp(dir) == NULL) return 1;
  if (make_files() != 0) {
    fprintf(stderr, "test_security: openssl failed; see %s/openssl.log\n", dir);
    return 1;
  }
  const char *extra[] = {"--tls-cert",
                         path("srv.crt"),
                         "--tls-key",
                         path("srv.key"),
                         "--tls-client-ca",
                         path("ca.crt"),
                         "--tokens",
                         path("tokens"),
                         "--health-listen",
                         "127.0.0.1:0",
                         "--interp-devices",
                         "2",
                         NULL};
  if (itest_kilnd_start(&server, extra)) return 1;
  find_health_addr(&server, health_addr, sizeof health_addr);
  int rc = itest_run_suite("test_security", security_suite(), &server);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (rc == 0) sh(cmd);
  return rc;
}
