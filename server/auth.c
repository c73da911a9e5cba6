/* Transport security and caller identity (see auth.h).
 *
 * The certificate files are read and checked here (the key must match the
 * certificate) before the core sees them, on start-up and on SIGHUP; the
 * core's fetcher callback only hands over a config already built, under a
 * mutex, so it never blocks a handshake on the disk. Tokens are kept as
 * SHA-256 digests only: the table never holds a token, and a presented
 * token is hashed and compared with every digest without an early exit.
 * SIGHUP reads the token file again into a new table swapped in under a
 * read-write lock (lookups read); a file that fails to parse keeps the old.
 */
#include "server/auth.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <grpc/support/alloc.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "common/alloc.h"
#include "executor/buffers.h"
#include "executor/scheduler.h"
#include "server/server.h"

#define DIGEST_LEN 32
#define TOKEN_MAX 4096
#define FILE_MAX_MIB 4 /* certificate, key and token files */
#define PORT_PROPERTY "kiln_port"

typedef struct token_entry {
  uint8_t digest[DIGEST_LEN];
  char client[KILND_CLIENT_MAX + 1];
  kilnd_role role;
  /* The line's own quotas (0: the server-wide value); has_quota when any. */
  uint64_t memory_bytes;
  uint32_t buffers, queued;
  bool has_quota;
} token_entry;

struct kilnd_auth {
  pthread_rwlock_t tokens_mu; /* guards tokens/ntokens/cap: SIGHUP swaps them */
  token_entry *tokens;
  size_t ntokens, cap;
  bool with_tokens;  /* --tokens given at start; fixed for the server's life */
  bool tls;          /* --tls-cert given */
  bool client_certs; /* --tls-client-ca given: verified client certificates */
  pthread_mutex_t mu;
  grpc_ssl_server_certificate_config *pending; /* for the next handshake */
};

/* ---- tokens -------------------------------------------------------------------------- */

static int hexval(int ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  ch = tolower(ch);
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  return -1;
}

static char *next_field(char **s) {
  char *p = *s;
  while (*p == ' ' || *p == '\t') p++;
  if (*p == '\0') return *s = p, NULL;
  char *start = p;
  while (*p && *p != ' ' && *p != '\t') p++;
  if (*p) *p++ = '\0';
  *s = p;
  return start;
}

/* A quota value: decimal from 1, with (bytes) an optional K/M/G/T (powers
 * of 1000) or Ki/Mi/Gi/Ti (powers of 1024) suffix. -1 for anything else. */
static int parse_quota(const char *v, bool bytes, uint64_t *out) {
  uint64_t n = 0;
  const char *p = v;
  if (*p < '0' || *p > '9') return -1;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (n > (UINT64_MAX - 9) / 10) return -1;
    n = n * 10 + (uint64_t)(*p - '0');
  }
  if (*p && bytes) {
    static const char units[] = "KMGT";
    const char *u = strchr(units, *p);
    if (u == NULL) return -1;
    bool binary = p[1] == 'i';
    if (p[binary ? 2 : 1] != '\0') return -1;
    for (int i = 0; i <= u - units; i++) {
      uint64_t m = binary ? 1024 : 1000;
      if (n > UINT64_MAX / m) return -1;
      n *= m;
    }
    p += binary ? 2 : 1;
  }
  if (*p != '\0' || n == 0) return -1;
  *out = n;
  return 0;
}

static int parse_token_line(kilnd_auth *a, char *line, const char *where, kiln_status *st) {
  char *s = line;
  char *digest = next_field(&s);
  if (digest == NULL) return 0; /* blank */
  char *client = next_field(&s), *role = next_field(&s);
  if (client == NULL || role == NULL)
    return kiln_status_set(st, KILN_EINVAL, where,
                           "expected 'sha256:<64 hex digits> CLIENT ROLE [key=value...]'");
  token_entry e;
  memset(&e, 0, sizeof e);
  if (strncmp(digest, "sha256:", 7) != 0 || strlen(digest + 7) != 2 * DIGEST_LEN)
    return kiln_status_set(st, KILN_EINVAL, where,
                           "the digest must be 'sha256:' and 64 hex digits, not '%.80s'", digest);
  for (int i = 0; i < DIGEST_LEN; i++) {
    int hi = hexval((unsigned char)digest[7 + 2 * i]),
        lo = hexval((unsigned char)digest[8 + 2 * i]);
    if (hi < 0 || lo < 0)
      return kiln_status_set(st, KILN_EINVAL, where, "the digest holds a non-hex character");
    e.digest[i] = (uint8_t)(hi << 4 | lo);
  }
  size_t n = strlen(client);
  if (n > KILND_CLIENT_MAX)
    return kiln_status_set(st, KILN_EINVAL, where, "client name longer than %d bytes",
                           KILND_CLIENT_MAX);
  for (size_t k = 0; k < n; k++)
    if ((unsigned char)client[k] < 0x21 || (unsigned char)client[k] > 0x7e)
      return kiln_status_set(st, KILN_EINVAL, where, "client name must be printable ASCII");
  memcpy(e.client, client, n + 1);
  if (strcmp(role, "user") == 0)
    e.role = KILND_ROLE_USER;
  else if (strcmp(role, "admin") == 0)
    e.role = KILND_ROLE_ADMIN;
  else
    return kiln_status_set(st, KILN_EINVAL, where, "role must be 'user' or 'admin', not '%.32s'",
                           role);
  for (char *q; (q = next_field(&s)) != NULL;) {
    char *eq = strchr(q, '=');
    if (eq == NULL || eq == q || eq[1] == '\0')
      return kiln_status_set(st, KILN_EINVAL, where, "expected key=value, found '%.64s'", q);
    *eq = '\0';
    const char *v = eq + 1;
    uint64_t val;
    if (strcmp(q, "memory") == 0) {
      if (parse_quota(v, true, &val))
        return kiln_status_set(st, KILN_EINVAL, where,
                               "memory=%.32s: expected bytes from 1, with an optional K, M, G, "
                               "T, Ki, Mi, Gi or Ti suffix",
                               v);
      e.memory_bytes = val;
    } else if (strcmp(q, "buffers") == 0 || strcmp(q, "queue") == 0) {
      if (parse_quota(v, false, &val) || val > UINT32_MAX)
        return kiln_status_set(st, KILN_EINVAL, where, "%s=%.32s: expected a count from 1 to %u", q,
                               v, UINT32_MAX);
      if (q[0] == 'b')
        e.buffers = (uint32_t)val;
      else
        e.queued = (uint32_t)val;
    } else {
      return kiln_status_set(st, KILN_EINVAL, where,
                             "unknown quota '%.32s' (memory=BYTES, buffers=N, queue=N)", q);
    }
    e.has_quota = true;
  }
  for (size_t i = 0; i < a->ntokens; i++)
    if (memcmp(a->tokens[i].digest, e.digest, DIGEST_LEN) == 0)
      return kiln_status_set(st, KILN_EINVAL, where, "the same digest appears twice");
  if (kiln_grow((void **)&a->tokens, &a->cap, a->ntokens + 1, sizeof *a->tokens))
    return kiln_status_set(st, KILN_ENOMEM, where, "out of memory");
  a->tokens[a->ntokens++] = e;
  return 0;
}

static int parse_tokens(kilnd_auth *a, const char *text, const char *filename, kiln_status *st) {
  char *copy = kiln_strdup(text);
  if (copy == NULL) return kiln_status_set(st, KILN_ENOMEM, filename, "out of memory");
  int rc = 0;
  unsigned lineno = 0;
  for (char *line = copy, *next; line && rc == 0; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    lineno++;
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    size_t n = strlen(line);
    if (n && line[n - 1] == '\r') line[n - 1] = '\0';
    char where[320];
    snprintf(where, sizeof where, "%.256s:%u", filename, lineno);
    rc = parse_token_line(a, line, where, st);
  }
  kiln_free(copy);
  if (rc == 0 && a->ntokens == 0)
    rc = kiln_status_set(st, KILN_EINVAL, filename, "the token file holds no tokens");
  return rc;
}

/* ---- certificates -------------------------------------------------------------------- */

/* Checks that `cert` holds a certificate and `key` the private key that
 * matches it, as the core would find out only at the first handshake. */
static int check_pair(const char *cert, const char *key, const kilnd_config *cfg, kiln_status *st) {
  BIO *cb = BIO_new_mem_buf(cert, -1), *kb = BIO_new_mem_buf(key, -1);
  X509 *x = cb ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
  EVP_PKEY *k = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
  int rc = 0;
  if (x == NULL)
    rc = kiln_status_set(st, KILN_EINVAL, cfg->tls_cert, "no PEM certificate in the file");
  else if (k == NULL)
    rc = kiln_status_set(st, KILN_EINVAL, cfg->tls_key, "no PEM private key in the file");
  else if (X509_check_private_key(x, k) != 1)
    rc = kiln_status_set(st, KILN_EINVAL, cfg->tls_key, "the key does not match %s", cfg->tls_cert);
  X509_free(x);
  EVP_PKEY_free(k);
  BIO_free(cb);
  BIO_free(kb);
  return rc;
}

static int check_ca(const char *pem, const char *path, kiln_status *st) {
  BIO *b = BIO_new_mem_buf(pem, -1);
  X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
  int rc = x ? 0 : kiln_status_set(st, KILN_EINVAL, path, "no PEM certificate in the file");
  X509_free(x);
  BIO_free(b);
  return rc;
}

static int load_certificates(const kilnd_config *cfg, grpc_ssl_server_certificate_config **out,
                             kiln_status *st) {
  *out = NULL;
  char *cert = NULL, *key = NULL, *ca = NULL;
  int rc = kilnd_read_file(cfg->tls_cert, "certificate file", FILE_MAX_MIB, &cert, st);
  if (rc == 0) rc = kilnd_read_file(cfg->tls_key, "key file", FILE_MAX_MIB, &key, st);
  if (rc == 0 && cfg->tls_client_ca[0])
    rc = kilnd_read_file(cfg->tls_client_ca, "client CA file", FILE_MAX_MIB, &ca, st);
  if (rc == 0) rc = check_pair(cert, key, cfg, st);
  if (rc == 0 && ca) rc = check_ca(ca, cfg->tls_client_ca, st);
  if (rc == 0) {
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    /* The core 1.51 asserts that a fetched config has root certificates
     * even when it requests no client certificate; then they are never
     * used for anything, so the server's own chain stands in for them. */
    *out = grpc_ssl_server_certificate_config_create(ca ? ca : cert, &pair, 1);
    if (*out == NULL) rc = kiln_status_set(st, KILN_EINTERNAL, "tls", "cannot build the config");
  }
  if (key) OPENSSL_cleanse(key, strlen(key));
  kiln_free(cert);
  kiln_free(key);
  kiln_free(ca);
  return rc;
}

/* Called by the core at each new handshake (and once when the port is
 * added): a config loaded since the last call replaces the old one. */
static grpc_ssl_certificate_config_reload_status
fetch_config(void *user, grpc_ssl_server_certificate_config **config) {
  kilnd_auth *a = user;
  pthread_mutex_lock(&a->mu);
  grpc_ssl_server_certificate_config *p = a->pending;
  a->pending = NULL;
  pthread_mutex_unlock(&a->mu);
  if (p == NULL) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  *config = p; /* the core owns it now */
  return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

/* The tokens' quotas, one entry per client (tokens of one client must agree),
 * handed to the buffer store and the scheduler. */
static int apply_quotas(kilnd *srv, const token_entry *t, size_t n, kiln_status *st) {
  kiln_client_quota *q = n ? kiln_calloc(n, sizeof *q) : NULL;
  if (n && q == NULL) return kiln_status_set(st, KILN_ENOMEM, "tokens", "out of memory");
  size_t nq = 0;
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    size_t j = 0;
    while (j < i && strcmp(t[j].client, t[i].client) != 0) j++;
    if (j < i) {
      if (t[j].memory_bytes != t[i].memory_bytes || t[j].buffers != t[i].buffers ||
          t[j].queued != t[i].queued)
        rc = kiln_status_set(st, KILN_EINVAL, "tokens",
                             "client '%.64s' has two tokens with different quotas", t[i].client);
      continue;
    }
    if (!t[i].has_quota) continue;
    q[nq++] = (kiln_client_quota){.client = t[i].client,
                                  .memory_bytes = t[i].memory_bytes,
                                  .buffers = t[i].buffers,
                                  .queued = t[i].queued};
  }
  if (rc == 0 && srv->buffers) rc = kiln_buffer_store_set_quotas(srv->buffers, q, nq, st);
  if (rc == 0 && srv->sched) rc = kiln_sched_set_quotas(srv->sched, q, nq, st);
  kiln_free(q);
  return rc;
}

int kilnd_auth_apply_quotas(kilnd *srv, kiln_status *st) {
  kilnd_auth *a = srv->auth;
  if (a == NULL || !a->with_tokens) return 0;
  pthread_rwlock_rdlock(&a->tokens_mu);
  int rc = apply_quotas(srv, a->tokens, a->ntokens, st);
  pthread_rwlock_unlock(&a->tokens_mu);
  return rc;
}

/* Reads the token file into a table of its own and swaps it in; a file
 * that fails to parse leaves the old table. */
static void reload_tokens(kilnd *srv) {
  kilnd_auth *a = srv->auth;
  kilnd_auth fresh;
  memset(&fresh, 0, sizeof fresh);
  kiln_status st;
  kiln_status_clear(&st);
  char *text = NULL;
  int rc = kilnd_read_file(srv->cfg.tokens, "token file", FILE_MAX_MIB, &text, &st);
  if (rc == 0) rc = parse_tokens(&fresh, text, srv->cfg.tokens, &st);
  kiln_free(text);
  if (rc == 0) rc = apply_quotas(srv, fresh.tokens, fresh.ntokens, &st);
  if (rc) {
    char msg[KILN_STATUS_MSG_MAX + KILN_STATUS_WHERE_MAX + 16];
    kiln_status_format(&st, msg, sizeof msg);
    kilnd_log("SIGHUP: tokens not reloaded, the old ones stay: %s", msg);
    OPENSSL_cleanse(fresh.tokens, fresh.ntokens * sizeof *fresh.tokens);
    kiln_free(fresh.tokens);
    return;
  }
  pthread_rwlock_wrlock(&a->tokens_mu);
  token_entry *old = a->tokens;
  size_t nold = a->ntokens;
  a->tokens = fresh.tokens;
  a->ntokens = fresh.ntokens;
  a->cap = fresh.cap;
  pthread_rwlock_unlock(&a->tokens_mu);
  OPENSSL_cleanse(old, nold * sizeof *old);
  kiln_free(old);
  kilnd_log("SIGHUP: %zu tokens reloaded from %s", fresh.ntokens, srv->cfg.tokens);
}

void kilnd_auth_reload(kilnd *srv) {
  kilnd_auth *a = srv->auth;
  if (a && a->with_tokens) reload_tokens(srv);
  if (a == NULL || !a->tls) {
    kilnd_log("SIGHUP: no TLS certificates to reload");
    return;
  }
  kiln_status st;
  kiln_status_clear(&st);
  grpc_ssl_server_certificate_config *cfg;
  if (load_certificates(&srv->cfg, &cfg, &st)) {
    char msg[KILN_STATUS_MSG_MAX + KILN_STATUS_WHERE_MAX + 16];
    kiln_status_format(&st, msg, sizeof msg);
    kilnd_log("SIGHUP: certificates not reloaded, the old ones stay: %s", msg);
    return;
  }
  pthread_mutex_lock(&a->mu);
  grpc_ssl_server_certificate_config *old = a->pending;
  a->pending = cfg;
  pthread_mutex_unlock(&a->mu);
  if (old) grpc_ssl_server_certificate_config_destroy(old);
  kilnd_log("SIGHUP: certificates reloaded; new connections use them");
}

/* ---- life ---------------------------------------------------------------------------- */

int kilnd_auth_create(kilnd *srv, kiln_status *st) {
  const kilnd_config *cfg = &srv->cfg;
  kilnd_auth *a = kiln_calloc(1, sizeof *a);
  if (a == NULL) return kiln_status_set(st, KILN_ENOMEM, "auth", "out of memory");
  pthread_mutex_init(&a->mu, NULL);
  pthread_rwlock_init(&a->tokens_mu, NULL);
  srv->auth = a;
  if (cfg->tls_cert[0] || cfg->tls_key[0]) {
    if (!cfg->tls_cert[0] || !cfg->tls_key[0])
      return kiln_status_set(st, KILN_EINVAL, cfg->tls_cert[0] ? "tls-key" : "tls-cert",
                             "--tls-cert and --tls-key go together");
    a->tls = true;
    a->client_certs = cfg->tls_client_ca[0] != '\0';
    int rc = load_certificates(cfg, &a->pending, st);
    if (rc) return rc;
  } else if (cfg->tls_client_ca[0]) {
    return kiln_status_set(st, KILN_EINVAL, "tls-client-ca", "needs --tls-cert and --tls-key");
  }
  if (cfg->tokens[0]) {
    char *text = NULL;
    int rc = kilnd_read_file(cfg->tokens, "token file", FILE_MAX_MIB, &text, st);
    if (rc == 0) rc = parse_tokens(a, text, cfg->tokens, st);
    kiln_free(text);
    if (rc) return rc;
    a->with_tokens = true;
  }
  if (a->ntokens == 0 && !a->client_certs)
    kilnd_log("warning: unauthenticated: any client may connect and name itself with kiln-client "
              "metadata (give --tokens or --tls-client-ca to authenticate clients)");
  if (a->ntokens && !a->tls)
    kilnd_log("warning: --tokens without --tls-cert: tokens cross the network in plaintext");
  return 0;
}

void kilnd_auth_destroy(kilnd *srv) {
  kilnd_auth *a = srv->auth;
  if (a == NULL) return;
  if (a->pending) grpc_ssl_server_certificate_config_destroy(a->pending);
  OPENSSL_cleanse(a->tokens, a->ntokens * sizeof *a->tokens);
  kiln_free(a->tokens);
  pthread_rwlock_destroy(&a->tokens_mu);
  pthread_mutex_destroy(&a->mu);
  kiln_free(a);
  srv->auth = NULL;
}

grpc_server_credentials *kilnd_auth_main_credentials(kilnd *srv, kiln_status *st) {
  kilnd_auth *a = srv->auth;
  if (!a->tls) return grpc_insecure_server_credentials_create();
  grpc_ssl_server_credentials_options *o =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          a->client_certs ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                          : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
          fetch_config, a);
  grpc_server_credentials *creds = o ? grpc_ssl_server_credentials_create_with_options(o) : NULL;
  if (creds == NULL) kiln_status_set(st, KILN_EINTERNAL, "tls", "cannot create TLS credentials");
  return creds;
}

/* The health port's processor: marks the call, never refuses (the
 * validation point does, with a message). Runs on gRPC's threads. */
static void mark_health(void *state, grpc_auth_context *ctx, const grpc_metadata *md, size_t nmd,
                        grpc_process_auth_metadata_done_cb cb, void *user) {
  (void)state;
  (void)md;
  (void)nmd;
  grpc_auth_context_add_cstring_property(ctx, PORT_PROPERTY, "health");
  cb(user, NULL, 0, NULL, 0, GRPC_STATUS_OK, NULL);
}

grpc_server_credentials *kilnd_auth_health_credentials(kilnd *srv) {
  (void)srv;
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
  grpc_auth_metadata_processor p = {.process = mark_health, .destroy = NULL, .state = NULL};
  grpc_server_credentials_set_auth_metadata_processor(creds, p);
  return creds;
}

/* ---- identity ------------------------------------------------------------------------ */

static bool key_is(const grpc_metadata *md, const char *key) {
  size_t n = strlen(key);
  return GRPC_SLICE_LENGTH(md->key) == n && memcmp(GRPC_SLICE_START_PTR(md->key), key, n) == 0;
}

static const grpc_slice *find_md(const kilnd_call *c, const char *key) {
  for (size_t i = 0; i < c->md.count; i++)
    if (key_is(&c->md.metadata[i], key)) return &c->md.metadata[i].value;
  return NULL;
}

/* The first value of property `name`, copied into buf; false when none. */
static bool property(grpc_auth_context *ctx, const char *name, char *buf, size_t size) {
  grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ctx, name);
  const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
  if (p == NULL || p->value_length >= size) return false;
  memcpy(buf, p->value, p->value_length);
  buf[p->value_length] = '\0';
  return true;
}

static bool printable(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) return false;
  return true;
}

/* The kiln-client value, else the peer's address without its port. */
static int header_identity(kilnd_call *c, kiln_status *st) {
  const grpc_slice *v = find_md(c, "kiln-client");
  if (v) {
    size_t n = GRPC_SLICE_LENGTH(*v);
    const uint8_t *p = GRPC_SLICE_START_PTR(*v);
    if (n == 0 || n > KILND_CLIENT_MAX)
      return kiln_status_set(st, KILN_EINVAL, "kiln-client",
                             "metadata value must have 1 to %d characters, not %zu",
                             KILND_CLIENT_MAX, n);
    for (size_t k = 0; k < n; k++)
      if (p[k] < 0x21 || p[k] > 0x7e)
        return kiln_status_set(st, KILN_EINVAL, "kiln-client",
                               "metadata value must be printable ASCII without spaces");
    memcpy(c->client, p, n);
    c->client[n] = '\0';
    return 0;
  }
  char *peer = grpc_call_get_peer(c->call);
  snprintf(c->client, sizeof c->client, "%s", peer ? peer : "unknown");
  gpr_free(peer);
  /* "ipv4:127.0.0.1:5000" / "ipv6:[::1]:5000" -> without ":port" */
  if (strncmp(c->client, "ipv4:", 5) == 0 || strncmp(c->client, "ipv6:", 5) == 0) {
    char *colon = strrchr(c->client, ':');
    if (colon && colon > c->client + 4) *colon = '\0';
  }
  return 0;
}

/* The token of `authorization: Bearer T`, checked against every entry. */
static int token_identity(kilnd_call *c, kiln_status *st) {
  kilnd_auth *a = c->srv->auth;
  const grpc_slice *v = find_md(c, "authorization");
  if (v == NULL)
    return kiln_status_set(st, KILND_EUNAUTH, "authorization",
                           "this server needs 'authorization: Bearer TOKEN' metadata");
  size_t n = GRPC_SLICE_LENGTH(*v);
  const char *p = (const char *)GRPC_SLICE_START_PTR(*v);
  if (n < 8 || strncasecmp(p, "Bearer ", 7) != 0)
    return kiln_status_set(st, KILND_EUNAUTH, "authorization",
                           "the authorization metadata must be 'Bearer TOKEN'");
  p += 7;
  n -= 7;
  if (n > TOKEN_MAX)
    return kiln_status_set(st, KILND_EUNAUTH, "authorization", "token longer than %d bytes",
                           TOKEN_MAX);
  uint8_t d[DIGEST_LEN];
  unsigned dlen = 0;
  if (!EVP_Digest(p, n, d, &dlen, EVP_sha256(), NULL) || dlen != DIGEST_LEN)
    return kiln_status_set(st, KILN_EINTERNAL, "authorization", "cannot hash the token");
  /* Every entry is compared in full, so the time does not tell which
   * entry, or how much of a digest, matched. */
  pthread_rwlock_rdlock(&a->tokens_mu);
  size_t found = a->ntokens;
  for (size_t i = 0; i < a->ntokens; i++) {
    int diff = CRYPTO_memcmp(a->tokens[i].digest, d, DIGEST_LEN);
    size_t mask = (size_t)0 - (size_t)(diff == 0);
    found = (found & ~mask) | (i & mask);
  }
  bool known = found != a->ntokens;
  if (known) {
    memcpy(c->client, a->tokens[found].client, sizeof c->client);
    c->role = a->tokens[found].role;
  }
  pthread_rwlock_unlock(&a->tokens_mu);
  if (!known) return kiln_status_set(st, KILND_EUNAUTH, "authorization", "unknown token");
  return 0;
}

int kilnd_auth_identify(kilnd_call *c, kiln_status *st) {
  kilnd *srv = c->srv;
  kilnd_auth *a = srv->auth;
  bool health = c->method->id == KILND_M_HEALTH_CHECK;
  c->role = KILND_ROLE_OPEN;
  char subject[512] = "";
  bool cert = false;
  if (srv->cfg.health_listen[0] || (a && a->client_certs)) {
    grpc_auth_context *ctx = grpc_call_auth_context(c->call);
    char port[16];
    bool on_health = ctx && property(ctx, PORT_PROPERTY, port, sizeof port);
    if (ctx && a && a->client_certs) {
      cert = (property(ctx, GRPC_X509_SUBJECT_PROPERTY_NAME, subject, sizeof subject) &&
              strlen(subject) <= KILND_CLIENT_MAX && printable(subject)) ||
             (property(ctx, GRPC_X509_CN_PROPERTY_NAME, subject, sizeof subject) &&
              strlen(subject) <= KILND_CLIENT_MAX && printable(subject));
    }
    if (ctx) grpc_auth_context_release(ctx);
    if (on_health) {
      snprintf(c->client, sizeof c->client, "health-probe");
      if (!health)
        return kiln_status_set(st, KILN_EUNIMPL, c->method->path,
                               "the health port serves only grpc.health.v1");
      return 0;
    }
  }
  if (a && a->with_tokens) {
    /* Probes on the main port need no token either: health tells nothing
     * about anyone's work. */
    if (health && find_md(c, "authorization") == NULL) {
      snprintf(c->client, sizeof c->client, "health-probe");
      return 0;
    }
    return token_identity(c, st);
  }
  if (a && a->client_certs) {
    if (!cert)
      return kiln_status_set(st, KILND_EUNAUTH, "tls",
                             "the client certificate has no usable subject");
    snprintf(c->client, sizeof c->client, "%s", subject);
    return 0;
  }
  return header_identity(c, st);
}
