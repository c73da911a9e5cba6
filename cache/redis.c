/* The Redis tier: one Redis string per entry, shared by every server that
 * points at the same Redis, through hiredis's blocking API.
 *
 * The idea is that Redis is an optimization, never a dependency. Every
 * operation borrows a connection from a small pool and is bounded by
 * timeout_ms (socket timeouts on connect, send and receive). When a
 * connection breaks or times out the store goes down: the pool is emptied,
 * callers get KILN_EUNAVAIL at once without touching the network, and one
 * background thread reconnects with backoff (50 ms doubling to 1 s) until
 * PING answers, then puts the store back up. Connections borrowed before an
 * outage carry the old epoch and are closed when returned, so no request
 * reuses a socket from before a restart. An error reply (OOM under
 * noeviction, READONLY, WRONGTYPE) leaves the connection usable: it is a
 * counted fault, not an outage; only LOADING (Redis is reading its data set
 * and will refuse everything for a while) takes the store down. Each outage
 * and each recovery is logged once.
 *
 * Layout: "<prefix>exe:<hex>" holds a value (SET .. EX ttl), and
 * "<prefix>lock:<hex>" a random token (SET NX PX) released by a
 * compare-and-delete script, for single flight across servers. A lock
 * always carries an expiry: one found without (kiln never sets one) counts
 * as free and is taken over by the next try_lock.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/store.h"
#include "common/alloc.h"

#define DEFAULT_PORT 6379
#define DEFAULT_TIMEOUT_MS 200
#define DEFAULT_POOL 4
#define MAX_POOL 256
#define MAX_PREFIX 256
#define MAX_TOKEN 512
#define KEY_HEX 64
/* Redis refuses bulk strings over proto-max-bulk-len (512 MiB by default)
 * by closing the connection; refuse them here instead. */
#define MAX_VALUE ((size_t)512 << 20)
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000

/* What a URL names. */
typedef struct target {
  char *host; /* TCP host, IPv6 without brackets; NULL for a unix socket */
  int port;
  char *path;     /* unix socket path, or NULL */
  char *user;     /* ACL user (AUTH user password), or NULL */
  char *password; /* or NULL */
  int db;
} target;

typedef struct redis_store {
  kiln_cache_store base;
  target t;
  char *prefix;
  char where[300]; /* "redis HOST:PORT" or "redis unix:PATH": status where and log lines */
  uint32_t ttl_s, timeout_ms, pool_max;

  pthread_mutex_t mu;   /* guards everything below */
  pthread_cond_t freed; /* a connection came back, or the store changed state */
  pthread_cond_t wake;  /* for the reconnect thread: the store went down, or stops */
  redisContext **idle;  /* pool_max + 1 slots; only connections of the current epoch */
  uint32_t nidle;
  uint32_t nconns; /* open or opening, of any epoch: idle + borrowed */
  uint64_t epoch;  /* bumped by every outage */
  bool up, stopping;
  char down_why[512]; /* the error that started the current outage */
  uint64_t hits, misses, puts, faults;
  pthread_t thread;
  bool thread_started;
} redis_store;

typedef struct lease {
  redisContext *c;
  uint64_t epoch; /* the store's epoch when c was opened or borrowed */
} lease;

static const char lock_release_script[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end";

/* SET NX PX, except that a lock without an expiry is taken over: kiln
 * never sets one, so it is a leftover (a hand-made key, an older client)
 * that would otherwise hold every server off the key for good. */
static const char lock_take_script[] =
    "local t = redis.call('pttl', KEYS[1]) "
    "if t == -2 or t == -1 then redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2]) return 1 end "
    "return 0";

/* ---- URL ------------------------------------------------------------------ */

static int url_error(kiln_status *st, const char *url, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int url_error(kiln_status *st, const char *url, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return kiln_status_set(st, KILN_EINVAL, NULL, "redis url '%s': %s", url, msg);
}

/* Non-negative decimal in [lo, hi] spelled by s[0..n); -1 when it is not
 * all digits, -2 when out of range. */
static long parse_uint(const char *s, size_t n, long lo, long hi) {
  if (n == 0) return -1;
  long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    if (v > hi) continue; /* keep scanning for non-digits */
    v = v * 10 + (s[i] - '0');
  }
  return v < lo || v > hi ? -2 : v;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* kiln_malloc'd copy of s[0..n) with %XX escapes decoded; NULL with *bad
 * for a malformed escape, NULL alone when out of memory. */
static char *percent_decode(const char *s, size_t n, bool *bad) {
  *bad = false;
  char *out = kiln_malloc(n + 1);
  if (!out) return NULL;
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '%') {
      out[j++] = s[i];
      continue;
    }
    int hi = i + 1 < n ? hexval(s[i + 1]) : -1;
    int lo = i + 2 < n ? hexval(s[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
      kiln_free(out);
      *bad = true;
      return NULL;
    }
    out[j++] = (char)(hi * 16 + lo);
    i += 2;
  }
  out[j] = 0;
  return out;
}

static void target_free(target *t) {
  kiln_free(t->host);
  kiln_free(t->path);
  kiln_free(t->user);
  kiln_free(t->password);
  memset(t, 0, sizeof *t);
}

static int parse_db(const char *url, const char *s, size_t n, target *t, kiln_status *st) {
  long v = parse_uint(s, n, 0, 2147483647L);
  if (v == -1) return url_error(st, url, "database '%.*s' is not a number", (int)n, s);
  if (v < 0) return url_error(st, url, "database '%.*s' is out of range", (int)n, s);
  t->db = (int)v;
  return 0;
}

/* "db=N[&...]": the one parameter there is. */
static int parse_query(const char *url, const char *q, target *t, kiln_status *st) {
  while (*q) {
    size_t n = strcspn(q, "&");
    const char *eq = memchr(q, '=', n);
    if (!eq || eq - q != 2 || strncmp(q, "db", 2) != 0)
      return url_error(st, url, "parameter '%.*s' is not supported (only db=N)", (int)n, q);
    int rc = parse_db(url, eq + 1, n - 3, t, st);
    if (rc) return rc;
    q += n;
    if (*q == '&') q++;
  }
  return 0;
}

static int parse_unix(const char *url, const char *p, target *t, kiln_status *st) {
  size_t n = strcspn(p, "?");
  if (n == 0) return url_error(st, url, "socket path is empty");
  t->path = kiln_strndup(p, n);
  if (!t->path) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  return p[n] == '?' ? parse_query(url, p + n + 1, t, st) : 0;
}

/* "[user:]password@" (redis-cli's form: without a colon it is the password). */
static int parse_userinfo(const char *url, const char *u, size_t n, target *t, kiln_status *st) {
  const char *colon = memchr(u, ':', n);
  const char *pw = colon ? colon + 1 : u;
  size_t pwn = n - (size_t)(pw - u);
  bool bad = false;
  if (colon && colon > u) {
    t->user = percent_decode(u, (size_t)(colon - u), &bad);
    if (!t->user) goto fail;
  }
  if (pwn > 0) {
    t->password = percent_decode(pw, pwn, &bad);
    if (!t->password) goto fail;
  }
  return 0;
fail:
  if (bad) return url_error(st, url, "the credentials hold a malformed %%-escape");
  return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
}

/* Splits "host[:port]" or "[v6][:port]" at hp[0..n). */
static int parse_hostport(const char *url, const char *hp, size_t n, target *t, kiln_status *st) {
  const char *host = hp, *port = NULL;
  size_t hostn = n, portn = 0;
  if (n > 0 && hp[0] == '[') {
    const char *close = memchr(hp, ']', n);
    if (!close) return url_error(st, url, "missing ']' after the IPv6 address");
    host = hp + 1;
    hostn = (size_t)(close - host);
    const char *after = close + 1;
    if (after < hp + n) {
      if (*after != ':') return url_error(st, url, "expected ':' after ']'");
      port = after + 1;
      portn = (size_t)(hp + n - port);
    }
  } else {
    const char *colon = memchr(hp, ':', n);
    if (colon) {
      if (memchr(colon + 1, ':', (size_t)(hp + n - colon - 1)))
        return url_error(st, url, "an IPv6 address needs brackets, as in [::1]:6379");
      hostn = (size_t)(colon - hp);
      port = colon + 1;
      portn = (size_t)(hp + n - port);
    }
  }
  if (hostn == 0) return url_error(st, url, "host is empty");
  if (port) {
    long v = parse_uint(port, portn, 1, 65535);
    if (portn == 0) return url_error(st, url, "port is empty");
    if (v == -1) return url_error(st, url, "port '%.*s' is not a number", (int)portn, port);
    if (v < 0)
      return url_error(st, url, "port '%.*s' is out of range (1 to 65535)", (int)portn, port);
    t->port = (int)v;
  }
  t->host = kiln_strndup(host, hostn);
  return t->host ? 0 : kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
}

/* [userinfo@]host[:port][/db][?db=N] */
static int parse_tcp(const char *url, const char *rest, target *t, kiln_status *st) {
  const char *end = rest + strcspn(rest, "/?");
  const char *at = NULL;
  for (const char *p = rest; p < end; p++)
    if (*p == '@') at = p;
  int rc = 0;
  if (at) rc = parse_userinfo(url, rest, (size_t)(at - rest), t, st);
  const char *hp = at ? at + 1 : rest;
  if (!rc) rc = parse_hostport(url, hp, (size_t)(end - hp), t, st);
  if (rc) return rc;
  const char *next = end;
  if (*next == '/') {
    size_t n = strcspn(next + 1, "?");
    if (n > 0 && (rc = parse_db(url, next + 1, n, t, st))) return rc;
    next += 1 + n;
  }
  return *next == '?' ? parse_query(url, next + 1, t, st) : 0;
}

static int parse_url(const char *url, target *t, kiln_status *st) {
  memset(t, 0, sizeof *t);
  t->port = DEFAULT_PORT;
  if (!url || !url[0]) return kiln_status_set(st, KILN_EINVAL, NULL, "redis url is empty");
  if (strncmp(url, "unix://", 7) == 0) return parse_unix(url, url + 7, t, st);
  if (strncmp(url, "unix:", 5) == 0) return parse_unix(url, url + 5, t, st);
  if (url[0] == '/') return parse_unix(url, url, t, st);
  const char *sep = strstr(url, "://");
  if (!sep) return parse_tcp(url, url, t, st);
  size_t n = (size_t)(sep - url);
  if (n == 5 && strncasecmp(url, "redis", 5) == 0) return parse_tcp(url, sep + 3, t, st);
  if (n == 6 && strncasecmp(url, "rediss", 6) == 0)
    return url_error(st, url, "TLS (rediss://) is not supported");
  return url_error(st, url, "scheme '%.*s' is not supported (use redis://, unix: or host:port)",
                   (int)n, url);
}

/* ---- connections ------------------------------------------------------------ */

static struct timeval ms_tv(uint32_t ms) {
  struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

static struct timespec deadline_after(uint32_t ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* hiredis writes with write(2): a peer that closed its end raises SIGPIPE,
 * which would kill a process that did not ignore it. Block it on this thread
 * around each exchange and drop any it raised. */
static void pipe_block(sigset_t *old) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, old);
}

static void pipe_restore(const sigset_t *old) {
  if (!sigismember(old, SIGPIPE)) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    struct timespec zero = {0, 0};
    while (sigtimedwait(&set, NULL, &zero) > 0) {
    }
  }
  pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* What went wrong on a context, in words (a timeout says so). */
static void describe_io(const redis_store *s, const redisContext *c, char *buf, size_t n) {
  if (c->err == REDIS_ERR_IO &&
      (strstr(c->errstr, "temporarily unavailable") || strstr(c->errstr, "timed out") ||
       strstr(c->errstr, "would block")))
    snprintf(buf, n, "no answer within %u ms", s->timeout_ms);
  else if (c->err == REDIS_ERR_EOF)
    snprintf(buf, n, "connection closed by the server");
  else
    snprintf(buf, n, "%s", c->errstr[0] ? c->errstr : "connection error");
}

/* Runs a setup command; false with err filled when it failed. */
static bool setup_command(const redis_store *s, redisContext *c, const char *what, char *err,
                          size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  redisReply *rep = redisvCommand(c, fmt, ap);
  va_end(ap);
  char why[256];
  bool ok = false;
  if (!rep) {
    describe_io(s, c, why, sizeof why);
    snprintf(err, n, "%s: %s", what, why);
  } else if (rep->type == REDIS_REPLY_ERROR) {
    snprintf(err, n, "%s: %.*s", what, (int)rep->len, rep->str);
  } else if (rep->type != REDIS_REPLY_STATUS) {
    snprintf(err, n, "%s: unexpected reply type %d", what, rep->type);
  } else {
    ok = true;
  }
  if (rep) freeReplyObject(rep);
  return ok;
}

/* A new connection with timeouts, AUTH and SELECT done (and PING when
 * ping); NULL with err filled. */
static redisContext *open_conn(const redis_store *s, bool ping, char *err, size_t n) {
  struct timeval tv = ms_tv(s->timeout_ms);
  sigset_t old;
  pipe_block(&old);
  redisContext *c = s->t.path ? redisConnectUnixWithTimeout(s->t.path, tv)
                              : redisConnectWithTimeout(s->t.host, s->t.port, tv);
  bool ok = false;
  char why[256];
  if (!c) {
    snprintf(err, n, "connect: out of memory");
  } else if (c->err) {
    describe_io(s, c, why, sizeof why);
    snprintf(err, n, "connect: %s", why);
  } else if (redisSetTimeout(c, tv) != REDIS_OK) {
    snprintf(err, n, "setting the socket timeout: %s", c->errstr);
  } else {
    if (!s->t.path) redisEnableKeepAlive(c);
    ok = true;
    if (s->t.password && s->t.user)
      ok = setup_command(s, c, "AUTH", err, n, "AUTH %s %s", s->t.user, s->t.password);
    else if (s->t.password)
      ok = setup_command(s, c, "AUTH", err, n, "AUTH %s", s->t.password);
    if (ok && s->t.db != 0) ok = setup_command(s, c, "SELECT", err, n, "SELECT %d", s->t.db);
    if (ok && ping) ok = setup_command(s, c, "PING", err, n, "PING");
  }
  pipe_restore(&old);
  if (!ok && c) {
    redisFree(c);
    c = NULL;
  }
  return c;
}

/* Takes the store down unless it already went down since epoch (a second
 * failure of the same outage is not news). Logs the outage once. */
static void mark_down(redis_store *s, uint64_t epoch, const char *why) {
  pthread_mutex_lock(&s->mu);
  bool news = s->up && s->epoch == epoch;
  if (news) {
    s->up = false;
    s->epoch++;
    snprintf(s->down_why, sizeof s->down_why, "%s", why);
    for (uint32_t i = 0; i < s->nidle; i++) redisFree(s->idle[i]);
    s->nconns -= s->nidle;
    s->nidle = 0;
    pthread_cond_signal(&s->wake);
    pthread_cond_broadcast(&s->freed);
  }
  pthread_mutex_unlock(&s->mu);
  if (news)
    fprintf(stderr, "kiln cache: %s unreachable: %s; serving from local tiers\n", s->where, why);
}

/* Counts a fault and records it; returns KILN_EUNAVAIL. */
static int fault(redis_store *s, kiln_status *st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fault(redis_store *s, kiln_status *st, const char *fmt, ...) {
  pthread_mutex_lock(&s->mu);
  s->faults++;
  pthread_mutex_unlock(&s->mu);
  char msg[KILN_STATUS_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return kiln_status_set(st, KILN_EUNAVAIL, s->where, "%s", msg);
}

/* A connection for one operation: an idle one, a new one while the pool has
 * room, or the next one returned within timeout_ms. While the store is down
 * it fails at once. */
static int borrow(redis_store *s, const char *what, lease *l, kiln_status *st) {
  struct timespec deadline = deadline_after(s->timeout_ms);
  char why[sizeof s->down_why];
  pthread_mutex_lock(&s->mu);
  for (;;) {
    if (!s->up || s->stopping) {
      snprintf(why, sizeof why, "%s", s->down_why);
      pthread_mutex_unlock(&s->mu);
      return fault(s, st, "%s: redis is down (%s); reconnecting in the background", what, why);
    }
    if (s->nidle > 0) {
      l->c = s->idle[--s->nidle];
      l->epoch = s->epoch;
      pthread_mutex_unlock(&s->mu);
      return 0;
    }
    if (s->nconns < s->pool_max) break;
    if (pthread_cond_timedwait(&s->freed, &s->mu, &deadline) == ETIMEDOUT) {
      pthread_mutex_unlock(&s->mu);
      return fault(s, st, "%s: no free connection within %u ms (pool of %u)", what, s->timeout_ms,
                   s->pool_max);
    }
  }
  s->nconns++;
  l->epoch = s->epoch;
  pthread_mutex_unlock(&s->mu);
  l->c = open_conn(s, false, why, sizeof why);
  if (l->c) return 0;
  pthread_mutex_lock(&s->mu);
  s->nconns--;
  pthread_cond_signal(&s->freed);
  pthread_mutex_unlock(&s->mu);
  mark_down(s, l->epoch, why);
  return fault(s, st, "%s: %s", what, why);
}

/* Returns a connection to the pool, or closes it when it broke or predates
 * the current epoch. */
static void give_back(redis_store *s, lease *l, bool broken) {
  redisContext *drop = NULL;
  pthread_mutex_lock(&s->mu);
  if (broken || !s->up || s->stopping || l->epoch != s->epoch) {
    drop = l->c;
    s->nconns--;
  } else {
    s->idle[s->nidle++] = l->c;
  }
  pthread_cond_signal(&s->freed);
  pthread_mutex_unlock(&s->mu);
  if (drop) redisFree(drop);
  l->c = NULL;
}

/* Runs one command. 0 with *out (never an error reply; the caller frees it
 * with freeReplyObject); KILN_EUNAVAIL after counting a fault. `what` names
 * the command and key for messages. */
static int command(redis_store *s, redisReply **out, kiln_status *st, const char *what,
                   const char *fmt, ...) {
  *out = NULL;
  lease l;
  int rc = borrow(s, what, &l, st);
  if (rc) return rc;
  sigset_t old;
  pipe_block(&old);
  va_list ap;
  va_start(ap, fmt);
  redisReply *rep = redisvCommand(l.c, fmt, ap);
  va_end(ap);
  pipe_restore(&old);
  if (!rep) {
    char why[256];
    describe_io(s, l.c, why, sizeof why);
    give_back(s, &l, true);
    mark_down(s, l.epoch, why);
    return fault(s, st, "%s: %s", what, why);
  }
  if (rep->type == REDIS_REPLY_ERROR) {
    rc = fault(s, st, "%s: %.*s", what, (int)rep->len, rep->str);
    /* LOADING: Redis refuses every command until its data set is read; let
     * the reconnect thread wait for it rather than every request. */
    if (strncmp(rep->str, "LOADING", 7) == 0) mark_down(s, l.epoch, rep->str);
    freeReplyObject(rep);
    give_back(s, &l, false);
    return rc;
  }
  give_back(s, &l, false);
  *out = rep;
  return 0;
}

/* A reply of a type the command cannot return (a proxy, a module): a fault
 * with a message; the connection stays. */
static int unexpected(redis_store *s, redisReply *rep, const char *what, kiln_status *st) {
  int type = rep->type;
  freeReplyObject(rep);
  return fault(s, st, "%s: unexpected reply type %d", what, type);
}

/* ---- the reconnect thread --------------------------------------------------- */

/* Sleeps until the store is down, then tries a connection (with PING) with
 * backoff until one answers; that connection opens the new epoch's pool. */
static void *reconnect_main(void *arg) {
  redis_store *s = arg;
  uint32_t backoff = BACKOFF_MIN_MS;
  pthread_mutex_lock(&s->mu);
  while (!s->stopping) {
    if (s->up) {
      backoff = BACKOFF_MIN_MS;
      pthread_cond_wait(&s->wake, &s->mu);
      continue;
    }
    pthread_mutex_unlock(&s->mu);
    char err[512];
    redisContext *c = open_conn(s, true, err, sizeof err);
    pthread_mutex_lock(&s->mu);
    if (c && !s->stopping) {
      s->idle[s->nidle++] = c;
      s->nconns++;
      s->up = true;
      pthread_cond_broadcast(&s->freed);
      pthread_mutex_unlock(&s->mu);
      fprintf(stderr, "kiln cache: %s reachable again\n", s->where);
      pthread_mutex_lock(&s->mu);
      continue;
    }
    if (c) {
      redisFree(c);
      break;
    }
    struct timespec deadline = deadline_after(backoff);
    while (!s->stopping && pthread_cond_timedwait(&s->wake, &s->mu, &deadline) != ETIMEDOUT) {
    }
    backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* ---- the vtable ---------------------------------------------------------------- */

static bool is_key_hex(const char *hex) {
  if (!hex) return false;
  for (int i = 0; i < KEY_HEX; i++) {
    char c = hex[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return hex[KEY_HEX] == 0;
}

/* "<prefix><kind>:<hex>" into buf (MAX_PREFIX + 80 bytes), after checking
 * the key. */
static int make_key(const redis_store *s, const char *kind, const char *hex, char *buf,
                    kiln_status *st) {
  if (!is_key_hex(hex))
    return kiln_status_set(st, KILN_EINVAL, s->where, "key '%.80s' is not %d lowercase hex digits",
                           hex ? hex : "(null)", KEY_HEX);
  snprintf(buf, MAX_PREFIX + 80, "%s%s:%s", s->prefix, kind, hex);
  return 0;
}

static void count(redis_store *s, uint64_t *counter) {
  pthread_mutex_lock(&s->mu);
  (*counter)++;
  pthread_mutex_unlock(&s->mu);
}

/* GET of a full Redis key; stats only when counted (listing does not). */
static int get_value(redis_store *s, const char *key, bool counted, uint8_t **val, size_t *len,
                     kiln_status *st) {
  char what[MAX_PREFIX + 96];
  snprintf(what, sizeof what, "GET %s", key);
  redisReply *rep;
  int rc = command(s, &rep, st, what, "GET %s", key);
  if (rc) return rc;
  if (rep->type == REDIS_REPLY_NIL) {
    freeReplyObject(rep);
    if (counted) count(s, &s->misses);
    return KILN_ENOTFOUND;
  }
  if (rep->type != REDIS_REPLY_STRING) return unexpected(s, rep, what, st);
  size_t n = rep->len;
  *val = kiln_malloc(n ? n : 1);
  if (!*val) {
    freeReplyObject(rep);
    return kiln_status_set(st, KILN_ENOMEM, s->where, "%s: out of memory for %zu bytes", what, n);
  }
  memcpy(*val, rep->str, rep->len);
  *len = rep->len;
  freeReplyObject(rep);
  if (counted) count(s, &s->hits);
  return 0;
}

static int redis_get(kiln_cache_store *base, const char *key_hex, uint8_t **val, size_t *len,
                     kiln_status *st) {
  redis_store *s = (redis_store *)base;
  *val = NULL;
  *len = 0;
  char key[MAX_PREFIX + 80];
  int rc = make_key(s, "exe", key_hex, key, st);
  return rc ? rc : get_value(s, key, true, val, len, st);
}

static int redis_put(kiln_cache_store *base, const char *key_hex, const uint8_t *val, size_t len,
                     kiln_status *st) {
  redis_store *s = (redis_store *)base;
  char key[MAX_PREFIX + 80], what[MAX_PREFIX + 96];
  int rc = make_key(s, "exe", key_hex, key, st);
  if (rc) return rc;
  if (len > MAX_VALUE)
    return kiln_status_set(st, KILN_ELIMIT, s->where,
                           "value of %zu bytes for %s is over the limit of %zu bytes", len, key,
                           MAX_VALUE);
  if (!val) val = (const uint8_t *)"";
  snprintf(what, sizeof what, "SET %s", key);
  redisReply *rep;
  if (s->ttl_s)
    rc = command(s, &rep, st, what, "SET %s %b EX %u", key, val, len, s->ttl_s);
  else
    rc = command(s, &rep, st, what, "SET %s %b", key, val, len);
  if (rc) return rc;
  if (rep->type != REDIS_REPLY_STATUS) return unexpected(s, rep, what, st);
  freeReplyObject(rep);
  count(s, &s->puts);
  return 0;
}

static int redis_del(kiln_cache_store *base, const char *key_hex, kiln_status *st) {
  redis_store *s = (redis_store *)base;
  char key[MAX_PREFIX + 80], what[MAX_PREFIX + 96];
  int rc = make_key(s, "exe", key_hex, key, st);
  if (rc) return rc;
  snprintf(what, sizeof what, "DEL %s", key);
  redisReply *rep;
  if ((rc = command(s, &rep, st, what, "DEL %s", key))) return rc;
  if (rep->type != REDIS_REPLY_INTEGER) return unexpected(s, rep, what, st);
  long long n = rep->integer;
  freeReplyObject(rep);
  return n > 0 ? 0 : KILN_ENOTFOUND;
}

/* Calls fn for each "<prefix>exe:<hex>" found by SCAN; an entry that expires
 * between SCAN and GET is skipped. */
static int redis_list(kiln_cache_store *base, kiln_cache_list_fn fn, void *ctx, kiln_status *st) {
  redis_store *s = (redis_store *)base;
  char pattern[2 * MAX_PREFIX + 8], cursor[32] = "0";
  size_t n = 0;
  for (const char *p = s->prefix; *p; p++) {
    if (strchr("*?[]\\", *p)) pattern[n++] = '\\';
    pattern[n++] = *p;
  }
  snprintf(pattern + n, sizeof pattern - n, "exe:*");
  size_t plen = strlen(s->prefix) + 4;
  int stop = 0;
  do {
    redisReply *rep;
    int rc = command(s, &rep, st, "SCAN", "SCAN %s MATCH %s COUNT 256", cursor, pattern);
    if (rc) return rc;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING || rep->element[0]->len >= sizeof cursor ||
        rep->element[1]->type != REDIS_REPLY_ARRAY)
      return unexpected(s, rep, "SCAN", st);
    snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
    redisReply *keys = rep->element[1];
    for (size_t i = 0; i < keys->elements && !stop; i++) {
      const redisReply *k = keys->element[i];
      if (k->type != REDIS_REPLY_STRING || k->len != plen + KEY_HEX || !is_key_hex(k->str + plen))
        continue;
      uint8_t *val = NULL;
      size_t len = 0;
      rc = get_value(s, k->str, false, &val, &len, st);
      if (rc == KILN_ENOTFOUND) continue;
      if (rc) {
        freeReplyObject(rep);
        return rc;
      }
      stop = fn(ctx, k->str + plen, val, len);
      kiln_free(val);
    }
    freeReplyObject(rep);
  } while (!stop && strcmp(cursor, "0") != 0);
  return 0;
}

static void redis_stats(kiln_cache_store *base, kiln_cache_store_stats *out) {
  redis_store *s = (redis_store *)base;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&s->mu);
  out->hits = s->hits;
  out->misses = s->misses;
  out->puts = s->puts;
  out->faults = s->faults;
  out->up = s->up;
  pthread_mutex_unlock(&s->mu);
}

static int check_token(const redis_store *s, const char *token, kiln_status *st) {
  if (!token || !token[0] || strlen(token) > MAX_TOKEN)
    return kiln_status_set(st, KILN_EINVAL, s->where, "lock token must be 1 to %d bytes",
                           MAX_TOKEN);
  return 0;
}

static int redis_try_lock(kiln_cache_store *base, const char *key_hex, const char *token,
                          uint32_t ttl_ms, bool *acquired, kiln_status *st) {
  redis_store *s = (redis_store *)base;
  *acquired = false;
  char key[MAX_PREFIX + 80], what[MAX_PREFIX + 96];
  int rc = make_key(s, "lock", key_hex, key, st);
  if (!rc) rc = check_token(s, token, st);
  if (rc) return rc;
  if (ttl_ms == 0) return kiln_status_set(st, KILN_EINVAL, s->where, "lock ttl is 0 ms");
  snprintf(what, sizeof what, "EVAL (take) %s", key);
  redisReply *rep;
  if ((rc = command(s, &rep, st, what, "EVAL %s 1 %s %s %u", lock_take_script, key, token, ttl_ms)))
    return rc;
  if (rep->type != REDIS_REPLY_INTEGER) return unexpected(s, rep, what, st);
  *acquired = rep->integer == 1;
  freeReplyObject(rep);
  return 0;
}

static int redis_take_over(kiln_cache_store *base, const char *key_hex, const char *token,
                           uint32_t ttl_ms, kiln_status *st) {
  redis_store *s = (redis_store *)base;
  char key[MAX_PREFIX + 80], what[MAX_PREFIX + 96];
  int rc = make_key(s, "lock", key_hex, key, st);
  if (!rc) rc = check_token(s, token, st);
  if (rc) return rc;
  if (ttl_ms == 0) return kiln_status_set(st, KILN_EINVAL, s->where, "lock ttl is 0 ms");
  snprintf(what, sizeof what, "SET %s PX", key);
  redisReply *rep;
  if ((rc = command(s, &rep, st, what, "SET %s %s PX %u", key, token, ttl_ms))) return rc;
  if (rep->type != REDIS_REPLY_STATUS) return unexpected(s, rep, what, st);
  freeReplyObject(rep);
  return 0;
}

static int redis_unlock(kiln_cache_store *base, const char *key_hex, const char *token,
                        kiln_status *st) {
  redis_store *s = (redis_store *)base;
  char key[MAX_PREFIX + 80], what[MAX_PREFIX + 96];
  int rc = make_key(s, "lock", key_hex, key, st);
  if (!rc) rc = check_token(s, token, st);
  if (rc) return rc;
  snprintf(what, sizeof what, "EVAL (release) %s", key);
  redisReply *rep;
  if ((rc = command(s, &rep, st, what, "EVAL %s 1 %s %s", lock_release_script, key, token)))
    return rc;
  if (rep->type != REDIS_REPLY_INTEGER) return unexpected(s, rep, what, st);
  freeReplyObject(rep);
  return 0;
}

static int redis_locked(kiln_cache_store *base, const char *key_hex, bool *held, kiln_status *st) {
  redis_store *s = (redis_store *)base;
  *held = false;
  char key[MAX_PREFIX + 80], what[MAX_PREFIX + 96];
  int rc = make_key(s, "lock", key_hex, key, st);
  if (rc) return rc;
  snprintf(what, sizeof what, "PTTL %s", key);
  redisReply *rep;
  if ((rc = command(s, &rep, st, what, "PTTL %s", key))) return rc;
  if (rep->type != REDIS_REPLY_INTEGER) return unexpected(s, rep, what, st);
  /* -2: no such key; -1: no expiry, a leftover that try_lock takes over. */
  *held = rep->integer >= 0;
  freeReplyObject(rep);
  return 0;
}

static void redis_destroy(kiln_cache_store *base) {
  redis_store *s = (redis_store *)base;
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  pthread_cond_signal(&s->wake);
  pthread_cond_broadcast(&s->freed);
  pthread_mutex_unlock(&s->mu);
  if (s->thread_started) pthread_join(s->thread, NULL);
  for (uint32_t i = 0; i < s->nidle; i++) redisFree(s->idle[i]);
  pthread_cond_destroy(&s->wake);
  pthread_cond_destroy(&s->freed);
  pthread_mutex_destroy(&s->mu);
  target_free(&s->t);
  kiln_free(s->prefix);
  kiln_free(s->idle);
  kiln_free(s);
}

static const kiln_cache_store_ops redis_ops = {
    .name = "redis",
    .get = redis_get,
    .put = redis_put,
    .del = redis_del,
    .list = redis_list,
    .stats = redis_stats,
    .try_lock = redis_try_lock,
    .take_over = redis_take_over,
    .unlock = redis_unlock,
    .locked = redis_locked,
    .destroy = redis_destroy,
};

/* ---- create --------------------------------------------------------------------- */

/* The URL and the config's overrides into a target; checks the limits. */
static int resolve_config(const kiln_cache_redis_config *cfg, target *t, kiln_status *st) {
  int rc = parse_url(cfg->url, t, st);
  if (rc) return rc;
  if (cfg->password && cfg->password[0]) {
    kiln_free(t->password);
    t->password = kiln_strdup(cfg->password);
    if (!t->password) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  }
  if (cfg->db > 0) t->db = cfg->db;
  if (cfg->prefix && strlen(cfg->prefix) > MAX_PREFIX)
    return kiln_status_set(st, KILN_EINVAL, NULL, "redis key prefix is longer than %d bytes",
                           MAX_PREFIX);
  if (cfg->pool > MAX_POOL)
    return kiln_status_set(st, KILN_EINVAL, NULL, "redis pool of %u connections is over %d",
                           cfg->pool, MAX_POOL);
  return 0;
}

static int init_sync(redis_store *s) {
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca)) return -1;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int rc = pthread_mutex_init(&s->mu, NULL);
  if (!rc) rc = pthread_cond_init(&s->freed, &ca);
  if (!rc) rc = pthread_cond_init(&s->wake, &ca);
  pthread_condattr_destroy(&ca);
  return rc;
}

int kiln_cache_redis_create(const kiln_cache_redis_config *cfg, kiln_cache_store **out,
                            kiln_status *st) {
  *out = NULL;
  if (!cfg) return kiln_status_set(st, KILN_EINVAL, NULL, "redis url is empty");
  target t;
  int rc = resolve_config(cfg, &t, st);
  if (rc) {
    target_free(&t);
    return rc;
  }
  redis_store *s = kiln_calloc(1, sizeof *s);
  uint32_t pool = cfg->pool ? cfg->pool : DEFAULT_POOL;
  if (s) s->idle = kiln_calloc(pool + 1, sizeof *s->idle);
  if (s) s->prefix = kiln_strdup(cfg->prefix ? cfg->prefix : "kiln:v1:");
  if (!s || !s->idle || !s->prefix || init_sync(s) != 0) {
    if (s) {
      kiln_free(s->idle);
      kiln_free(s->prefix);
    }
    kiln_free(s);
    target_free(&t);
    return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  }
  s->base.ops = &redis_ops;
  s->t = t;
  s->ttl_s = cfg->ttl_s;
  s->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS;
  s->pool_max = pool;
  if (t.path)
    snprintf(s->where, sizeof s->where, "redis unix:%s", t.path);
  else
    snprintf(s->where, sizeof s->where, strchr(t.host, ':') ? "redis [%s]:%d" : "redis %s:%d",
             t.host, t.port);
  /* One connection now: a healthy Redis is up from the first request, and a
   * missing one is reported at start rather than by the first request. */
  char err[512];
  redisContext *c = open_conn(s, true, err, sizeof err);
  if (c) {
    s->idle[s->nidle++] = c;
    s->nconns = 1;
    s->up = true;
  } else {
    snprintf(s->down_why, sizeof s->down_why, "%s", err);
    fprintf(stderr, "kiln cache: %s unreachable: %s; serving from local tiers\n", s->where, err);
  }
  if (pthread_create(&s->thread, NULL, reconnect_main, s) != 0) {
    redis_destroy(&s->base);
    return kiln_status_set(st, KILN_EINTERNAL, NULL, "cannot start the redis reconnect thread");
  }
  s->thread_started = true;
  *out = &s->base;
  return 0;
}
