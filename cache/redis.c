/* The Redis tier: one Redis string per entry, shared by every server that
 * points at the same Redis, through hiredis's blocking API. Three
 * topologies, one code path:
 *
 *   single    "host:port", "redis://...", "unix:/path": one node.
 *   cluster   "redis-cluster://host:port[,host:port...]" (seed nodes): keys
 *             are routed by hash slot to the primary that serves them,
 *             from a slot map read with CLUSTER SLOTS; MOVED updates the
 *             map and is followed, ASK is followed once after ASKING.
 *   sentinel  "redis-sentinel://host:port[,host:port...]/MASTER": the
 *             sentinels name the current primary of MASTER; every key goes
 *             there, and a failover is followed when the sentinels name
 *             another one.
 *
 * The idea is that Redis is an optimization, never a dependency. Every
 * operation borrows a connection from its node's small pool and is bounded
 * by timeout_ms (socket timeouts on connect, send and receive). When a
 * connection breaks or times out its node goes down: the node's pool is
 * emptied, callers of that node get KILN_EUNAVAIL at once without touching
 * the network (the tiered cache then serves from its local tiers), and one
 * background thread per node reconnects with backoff (50 ms doubling to
 * 1 s) until PING answers. Connections borrowed before an outage carry the
 * old epoch and are closed when returned, so no request reuses a socket
 * from before a restart. An error reply (OOM under noeviction, READONLY,
 * WRONGTYPE) leaves the connection usable: it is a counted fault, not an
 * outage; only LOADING takes a node down.
 *
 * In the cluster and sentinel topologies one more thread keeps the map: it
 * rereads it at start, after a MOVED, when a node goes down or answers
 * READONLY / CLUSTERDOWN / TRYAGAIN (a failover under way), every second
 * while some slot has no live primary, and every 30 s otherwise. Until the
 * map names a live primary, operations on its slots are faults, as when a
 * single Redis is down. Nothing wrong can be served meanwhile: values are
 * sealed entries that the tiered cache verifies.
 *
 * Layout: "<prefix>exe:<hex>" holds a value (SET .. EX ttl), and
 * "<prefix>lock:<hex>" a random token (SET NX PX) released by a
 * compare-and-delete script, for single flight across servers. In a cluster
 * the hex is a hash tag, "<prefix>exe:{<hex>}" and "<prefix>lock:{<hex>}",
 * so an entry and its lock live in one slot; the single and sentinel
 * layouts are unchanged, so existing shared caches keep their entries. A
 * lock always carries an expiry: one found without (kiln never sets one)
 * counts as free and is taken over by the next try_lock.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/redis_slots.h"
#include "cache/store.h"
#include "common/alloc.h"
#include "common/log.h"

#define DEFAULT_PORT 6379
#define DEFAULT_SENTINEL_PORT 26379
#define DEFAULT_TIMEOUT_MS 200
#define DEFAULT_POOL 4
#define MAX_POOL 256
#define MAX_PREFIX 256
#define MAX_TOKEN 512
#define MAX_SEEDS 64
#define MAX_NODES 128 /* nodes a store ever learns of; NO_NODE marks an unserved slot */
#define NO_NODE 0xFF
#define MAX_HOPS 5 /* redirections followed for one operation */
#define MAX_MASTER_NAME 128
#define KEY_HEX 64
/* Redis refuses bulk strings over proto-max-bulk-len (512 MiB by default)
 * by closing the connection; refuse them here instead. */
#define MAX_VALUE ((size_t)512 << 20)
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000
#define REFRESH_MIN_MS 100       /* between two map reads */
#define REFRESH_DEGRADED_MS 1000 /* while some slot has no live primary */
#define REFRESH_IDLE_MS 30000

typedef enum topology { TOPO_SINGLE, TOPO_CLUSTER, TOPO_SENTINEL } topology;

typedef struct addr {
  char *host; /* IPv6 without brackets */
  int port;
} addr;

/* What a URL names. */
typedef struct target {
  topology topo;
  addr hosts[MAX_SEEDS]; /* single: one (none for a unix socket); else the seeds or sentinels */
  size_t nhosts;
  char *path;     /* unix socket path (single only), or NULL */
  char *user;     /* ACL user (AUTH user password), or NULL */
  char *password; /* or NULL */
  char *master;   /* sentinel: the master set's name */
  int db;
} target;

struct redis_store;

/* One Redis server and its connection pool. */
typedef struct node {
  struct redis_store *s;
  char *host; /* NULL for a unix socket */
  int port;
  char *path;
  char where[300]; /* "redis HOST:PORT" or "redis unix:PATH": status where and log lines */
  char addr[280];  /* "HOST:PORT" for metrics */

  pthread_mutex_t mu;   /* guards the pool and the state below */
  pthread_cond_t freed; /* a connection came back, or the node changed state */
  pthread_cond_t wake;  /* for the reconnect thread: the node went down, or stops */
  redisContext **idle;  /* pool_max + 1 slots; only connections of the current epoch */
  uint32_t nidle;
  uint32_t nconns; /* open or opening, of any epoch: idle + borrowed */
  uint64_t epoch;  /* bumped by every outage */
  bool up, stopping;
  char down_why[512]; /* the error that started the current outage */
  pthread_t thread;
  bool thread_started;

  _Atomic uint64_t requests, errors, redirects, latency_us;
} node;

typedef struct redis_store {
  kiln_cache_store base;
  target t;
  char *prefix;
  char where[300]; /* the store's name in messages: its one node, or the topology */
  uint32_t ttl_s, timeout_ms, pool_max;

  pthread_mutex_t mu; /* guards the counters and the map below */
  uint64_t hits, misses, puts, faults;
  node *nodes[MAX_NODES]; /* grows only; freed at destroy */
  uint32_t nnodes;
  uint8_t slot_node[KILN__REDIS_SLOTS]; /* index into nodes, or NO_NODE */
  bool map_known;                       /* a map was read at least once */
  pthread_cond_t refresh_wake;
  bool refresh_wanted, stopping;
  uint64_t map_reads, map_failures;
  char map_why[512]; /* why the last map read failed */
  pthread_t refresher;
  bool refresher_started;
} redis_store;

typedef struct lease {
  redisContext *c;
  uint64_t epoch; /* the node's epoch when c was opened or borrowed */
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
  for (size_t i = 0; i < t->nhosts; i++) kiln_free(t->hosts[i].host);
  kiln_free(t->path);
  kiln_free(t->user);
  kiln_free(t->password);
  kiln_free(t->master);
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

/* Splits "host[:port]" or "[v6][:port]" at hp[0..n) into *a (port
 * defaulting to defport). */
static int parse_hostport(const char *url, const char *hp, size_t n, int defport, addr *a,
                          kiln_status *st) {
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
  if (hostn >= KILN__REDIS_HOST_MAX)
    return url_error(st, url, "host is longer than %d bytes", KILN__REDIS_HOST_MAX - 1);
  a->port = defport;
  if (port) {
    long v = parse_uint(port, portn, 1, 65535);
    if (portn == 0) return url_error(st, url, "port is empty");
    if (v == -1) return url_error(st, url, "port '%.*s' is not a number", (int)portn, port);
    if (v < 0)
      return url_error(st, url, "port '%.*s' is out of range (1 to 65535)", (int)portn, port);
    a->port = (int)v;
  }
  a->host = kiln_strndup(host, hostn);
  return a->host ? 0 : kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
}

/* "host:port[,host:port...]" at hp[0..n) into t->hosts. */
static int parse_hostlist(const char *url, const char *hp, size_t n, int defport, target *t,
                          kiln_status *st) {
  const char *end = hp + n;
  for (const char *p = hp;;) {
    const char *comma = memchr(p, ',', (size_t)(end - p));
    const char *stop = comma ? comma : end;
    if (t->nhosts == MAX_SEEDS) return url_error(st, url, "more than %d hosts", MAX_SEEDS);
    int rc = parse_hostport(url, p, (size_t)(stop - p), defport, &t->hosts[t->nhosts], st);
    if (rc) return rc;
    t->nhosts++;
    if (!comma) return 0;
    p = comma + 1;
  }
}

/* A master set's name: what SENTINEL accepts, no spaces or controls. */
static bool master_name_ok(const char *s, size_t n) {
  if (n == 0 || n > MAX_MASTER_NAME) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_' || c == '.'))
      return false;
  }
  return true;
}

/* [userinfo@]host[:port][,host[:port]...][/db-or-master][?db=N] */
static int parse_tcp(const char *url, const char *rest, target *t, kiln_status *st) {
  const char *end = rest + strcspn(rest, "/?");
  const char *at = NULL;
  for (const char *p = rest; p < end; p++)
    if (*p == '@') at = p;
  int rc = 0;
  if (at) rc = parse_userinfo(url, rest, (size_t)(at - rest), t, st);
  const char *hp = at ? at + 1 : rest;
  if (rc) return rc;
  if (t->topo == TOPO_SINGLE) {
    rc = parse_hostport(url, hp, (size_t)(end - hp), DEFAULT_PORT, &t->hosts[0], st);
    if (rc) return rc;
    t->nhosts = 1;
  } else {
    int defport = t->topo == TOPO_SENTINEL ? DEFAULT_SENTINEL_PORT : DEFAULT_PORT;
    if ((rc = parse_hostlist(url, hp, (size_t)(end - hp), defport, t, st))) return rc;
  }
  const char *next = end;
  if (*next == '/') {
    size_t n = strcspn(next + 1, "?");
    if (t->topo == TOPO_SENTINEL) {
      if (!master_name_ok(next + 1, n))
        return url_error(st, url, "master name '%.*s' is not 1 to %d of [A-Za-z0-9._-]",
                         (int)(n > 200 ? 200 : n), next + 1, MAX_MASTER_NAME);
      t->master = kiln_strndup(next + 1, n);
      if (!t->master) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
    } else if (n > 0) {
      if (t->topo == TOPO_CLUSTER) return url_error(st, url, "a Redis Cluster has only database 0");
      if ((rc = parse_db(url, next + 1, n, t, st))) return rc;
    }
    next += 1 + n;
  }
  if (t->topo == TOPO_SENTINEL && !t->master)
    return url_error(st, url,
                     "name the master set after the sentinels, as in "
                     "redis-sentinel://host:26379/mymaster");
  if (*next == '?' && t->topo == TOPO_CLUSTER)
    return url_error(st, url, "a Redis Cluster has only database 0");
  return *next == '?' ? parse_query(url, next + 1, t, st) : 0;
}

static int parse_url(const char *url, target *t, kiln_status *st) {
  memset(t, 0, sizeof *t);
  if (!url || !url[0]) return kiln_status_set(st, KILN_EINVAL, NULL, "redis url is empty");
  if (strncmp(url, "unix://", 7) == 0) return parse_unix(url, url + 7, t, st);
  if (strncmp(url, "unix:", 5) == 0) return parse_unix(url, url + 5, t, st);
  if (url[0] == '/') return parse_unix(url, url, t, st);
  const char *sep = strstr(url, "://");
  if (!sep) return parse_tcp(url, url, t, st);
  size_t n = (size_t)(sep - url);
  if (n == 5 && strncasecmp(url, "redis", 5) == 0) return parse_tcp(url, sep + 3, t, st);
  if (n == 13 && strncasecmp(url, "redis-cluster", 13) == 0) {
    t->topo = TOPO_CLUSTER;
    return parse_tcp(url, sep + 3, t, st);
  }
  if (n == 14 && strncasecmp(url, "redis-sentinel", 14) == 0) {
    t->topo = TOPO_SENTINEL;
    return parse_tcp(url, sep + 3, t, st);
  }
  if (n == 6 && strncasecmp(url, "rediss", 6) == 0)
    return url_error(st, url, "TLS (rediss://) is not supported");
  return url_error(st, url,
                   "scheme '%.*s' is not supported (use redis://, redis-cluster://, "
                   "redis-sentinel://, unix: or host:port)",
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

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
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
static void describe_io(uint32_t timeout_ms, const redisContext *c, char *buf, size_t n) {
  if (c->err == REDIS_ERR_IO &&
      (strstr(c->errstr, "temporarily unavailable") || strstr(c->errstr, "timed out") ||
       strstr(c->errstr, "would block")))
    snprintf(buf, n, "no answer within %u ms", timeout_ms);
  else if (c->err == REDIS_ERR_EOF)
    snprintf(buf, n, "connection closed by the server");
  else
    snprintf(buf, n, "%s", c->errstr[0] ? c->errstr : "connection error");
}

/* Runs a setup command; false with err filled when it failed. */
static bool setup_command(uint32_t timeout_ms, redisContext *c, const char *what, char *err,
                          size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  redisReply *rep = redisvCommand(c, fmt, ap);
  va_end(ap);
  char why[256];
  bool ok = false;
  if (!rep) {
    describe_io(timeout_ms, c, why, sizeof why);
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

/* A new connection to host:port (or path) with timeouts, then AUTH (data
 * nodes: not sentinel), SELECT (select) and PING (ping); NULL with err
 * filled. */
static redisContext *connect_to(const redis_store *s, const char *host, int port, const char *path,
                                bool sentinel, bool select, bool ping, char *err, size_t n) {
  struct timeval tv = ms_tv(s->timeout_ms);
  sigset_t old;
  pipe_block(&old);
  redisContext *c =
      path ? redisConnectUnixWithTimeout(path, tv) : redisConnectWithTimeout(host, port, tv);
  bool ok = false;
  char why[256];
  if (!c) {
    snprintf(err, n, "connect: out of memory");
  } else if (c->err) {
    describe_io(s->timeout_ms, c, why, sizeof why);
    snprintf(err, n, "connect: %s", why);
  } else if (redisSetTimeout(c, tv) != REDIS_OK) {
    snprintf(err, n, "setting the socket timeout: %s", c->errstr);
  } else {
    if (!path) redisEnableKeepAlive(c);
    ok = true;
    const target *t = &s->t;
    if (sentinel)
      ; /* sentinels are asked without the data nodes' credentials */
    else if (t->password && t->user)
      ok = setup_command(s->timeout_ms, c, "AUTH", err, n, "AUTH %s %s", t->user, t->password);
    else if (t->password)
      ok = setup_command(s->timeout_ms, c, "AUTH", err, n, "AUTH %s", t->password);
    if (ok && select && t->db != 0)
      ok = setup_command(s->timeout_ms, c, "SELECT", err, n, "SELECT %d", t->db);
    if (ok && ping) ok = setup_command(s->timeout_ms, c, "PING", err, n, "PING");
  }
  pipe_restore(&old);
  if (!ok && c) {
    redisFree(c);
    c = NULL;
  }
  return c;
}

static redisContext *open_conn(const node *nd, bool ping, char *err, size_t n) {
  return connect_to(nd->s, nd->host, nd->port, nd->path, false, true, ping, err, n);
}

static void want_refresh(redis_store *s);

/* Takes the node down unless it already went down since epoch (a second
 * failure of the same outage is not news). Logs the outage once. */
static void mark_down(node *nd, uint64_t epoch, const char *why) {
  pthread_mutex_lock(&nd->mu);
  bool news = nd->up && nd->epoch == epoch;
  if (news) {
    nd->up = false;
    nd->epoch++;
    snprintf(nd->down_why, sizeof nd->down_why, "%s", why);
    for (uint32_t i = 0; i < nd->nidle; i++) redisFree(nd->idle[i]);
    nd->nconns -= nd->nidle;
    nd->nidle = 0;
    pthread_cond_signal(&nd->wake);
    pthread_cond_broadcast(&nd->freed);
  }
  pthread_mutex_unlock(&nd->mu);
  if (news) {
    kiln_log(KILN_LOG_WARN, "kiln cache", "%s unreachable: %s; serving from local tiers", nd->where,
             why);
    want_refresh(nd->s);
  }
}

/* Counts a fault and records it; returns KILN_EUNAVAIL. */
static int fault(redis_store *s, const char *where, kiln_status *st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fault(redis_store *s, const char *where, kiln_status *st, const char *fmt, ...) {
  pthread_mutex_lock(&s->mu);
  s->faults++;
  pthread_mutex_unlock(&s->mu);
  char msg[KILN_STATUS_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return kiln_status_set(st, KILN_EUNAVAIL, where, "%s", msg);
}

/* A connection for one operation: an idle one, a new one while the pool has
 * room, or the next one returned within timeout_ms. While the node is down
 * it fails at once. */
static int borrow(node *nd, const char *what, lease *l, kiln_status *st) {
  redis_store *s = nd->s;
  struct timespec deadline = deadline_after(s->timeout_ms);
  char why[sizeof nd->down_why];
  pthread_mutex_lock(&nd->mu);
  for (;;) {
    if (!nd->up || nd->stopping) {
      snprintf(why, sizeof why, "%s", nd->down_why);
      pthread_mutex_unlock(&nd->mu);
      return fault(s, nd->where, st, "%s: redis is down (%s); reconnecting in the background", what,
                   why);
    }
    if (nd->nidle > 0) {
      l->c = nd->idle[--nd->nidle];
      l->epoch = nd->epoch;
      pthread_mutex_unlock(&nd->mu);
      return 0;
    }
    if (nd->nconns < s->pool_max) break;
    if (pthread_cond_timedwait(&nd->freed, &nd->mu, &deadline) == ETIMEDOUT) {
      pthread_mutex_unlock(&nd->mu);
      return fault(s, nd->where, st, "%s: no free connection within %u ms (pool of %u)", what,
                   s->timeout_ms, s->pool_max);
    }
  }
  nd->nconns++;
  l->epoch = nd->epoch;
  pthread_mutex_unlock(&nd->mu);
  l->c = open_conn(nd, false, why, sizeof why);
  if (l->c) return 0;
  pthread_mutex_lock(&nd->mu);
  nd->nconns--;
  pthread_cond_signal(&nd->freed);
  pthread_mutex_unlock(&nd->mu);
  mark_down(nd, l->epoch, why);
  return fault(s, nd->where, st, "%s: %s", what, why);
}

/* Returns a connection to the pool, or closes it when it broke or predates
 * the current epoch. */
static void give_back(node *nd, lease *l, bool broken) {
  redisContext *drop = NULL;
  pthread_mutex_lock(&nd->mu);
  if (broken || !nd->up || nd->stopping || l->epoch != nd->epoch) {
    drop = l->c;
    nd->nconns--;
  } else {
    nd->idle[nd->nidle++] = l->c;
  }
  pthread_cond_signal(&nd->freed);
  pthread_mutex_unlock(&nd->mu);
  if (drop) redisFree(drop);
  l->c = NULL;
}

/* Sends the formatted command cmd[0..len) to nd (after ASKING when asking)
 * and reads its reply. 0 with *out, which may be an error reply;
 * KILN_EUNAVAIL after counting a fault when no reply came (the node is then
 * down). */
static int exchange(node *nd, const char *cmd, size_t len, bool asking, redisReply **out,
                    const char *what, kiln_status *st) {
  *out = NULL;
  lease l;
  int rc = borrow(nd, what, &l, st);
  if (rc) return rc;
  atomic_fetch_add(&nd->requests, 1);
  uint64_t t0 = now_us();
  sigset_t old;
  pipe_block(&old);
  bool sent = (!asking || redisAppendCommand(l.c, "ASKING") == REDIS_OK) &&
              redisAppendFormattedCommand(l.c, cmd, len) == REDIS_OK;
  void *r1 = NULL, *r2 = NULL;
  if (sent && asking) {
    if (redisGetReply(l.c, &r1) != REDIS_OK) sent = false;
    if (r1) freeReplyObject(r1);
  }
  if (sent && redisGetReply(l.c, &r2) != REDIS_OK) r2 = NULL;
  pipe_restore(&old);
  atomic_fetch_add(&nd->latency_us, now_us() - t0);
  redisReply *rep = sent ? r2 : NULL;
  if (!rep) {
    char why[256];
    describe_io(nd->s->timeout_ms, l.c, why, sizeof why);
    give_back(nd, &l, true);
    atomic_fetch_add(&nd->errors, 1);
    mark_down(nd, l.epoch, why);
    return fault(nd->s, nd->where, st, "%s: %s", what, why);
  }
  /* LOADING: Redis refuses every command until its data set is read; let
   * the reconnect thread wait for it rather than every request. */
  if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "LOADING", 7) == 0) {
    give_back(nd, &l, false);
    mark_down(nd, l.epoch, rep->str);
  } else {
    give_back(nd, &l, false);
  }
  *out = rep;
  return 0;
}

/* ---- nodes -------------------------------------------------------------------- */

static void *reconnect_main(void *arg);

static int node_init_sync(node *nd) {
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca)) return -1;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int rc = pthread_mutex_init(&nd->mu, NULL);
  if (!rc) rc = pthread_cond_init(&nd->freed, &ca);
  if (!rc) rc = pthread_cond_init(&nd->wake, &ca);
  pthread_condattr_destroy(&ca);
  return rc;
}

static void node_free(node *nd) {
  if (!nd) return;
  pthread_mutex_lock(&nd->mu);
  nd->stopping = true;
  pthread_cond_signal(&nd->wake);
  pthread_cond_broadcast(&nd->freed);
  pthread_mutex_unlock(&nd->mu);
  if (nd->thread_started) pthread_join(nd->thread, NULL);
  for (uint32_t i = 0; i < nd->nidle; i++) redisFree(nd->idle[i]);
  pthread_cond_destroy(&nd->wake);
  pthread_cond_destroy(&nd->freed);
  pthread_mutex_destroy(&nd->mu);
  kiln_free(nd->host);
  kiln_free(nd->path);
  kiln_free(nd->idle);
  kiln_free(nd);
}

/* A node for host:port (or path), connected once now when connect_now (a
 * healthy Redis is up from the first request, and a missing one is reported
 * at start), with its reconnect thread running. NULL when out of memory or
 * threads. */
static node *node_new(redis_store *s, const char *host, int port, const char *path,
                      bool connect_now) {
  node *nd = kiln_calloc(1, sizeof *nd);
  if (!nd) return NULL;
  nd->s = s;
  nd->port = port;
  nd->host = host ? kiln_strdup(host) : NULL;
  nd->path = path ? kiln_strdup(path) : NULL;
  nd->idle = kiln_calloc(s->pool_max + 1, sizeof *nd->idle);
  if ((host && !nd->host) || (path && !nd->path) || !nd->idle || node_init_sync(nd) != 0) {
    kiln_free(nd->host);
    kiln_free(nd->path);
    kiln_free(nd->idle);
    kiln_free(nd);
    return NULL;
  }
  if (path) {
    snprintf(nd->where, sizeof nd->where, "redis unix:%s", path);
    snprintf(nd->addr, sizeof nd->addr, "unix:%s", path);
  } else {
    bool v6 = strchr(host, ':') != NULL;
    snprintf(nd->addr, sizeof nd->addr, v6 ? "[%s]:%d" : "%s:%d", host, port);
    snprintf(nd->where, sizeof nd->where, "redis %s", nd->addr);
  }
  if (connect_now) {
    char err[512];
    redisContext *c = open_conn(nd, true, err, sizeof err);
    if (c) {
      nd->idle[nd->nidle++] = c;
      nd->nconns = 1;
      nd->up = true;
    } else {
      snprintf(nd->down_why, sizeof nd->down_why, "%s", err);
      kiln_log(KILN_LOG_WARN, "kiln cache", "%s unreachable: %s; serving from local tiers",
               nd->where, err);
    }
  } else {
    snprintf(nd->down_why, sizeof nd->down_why, "not connected yet");
  }
  if (pthread_create(&nd->thread, NULL, reconnect_main, nd) != 0) {
    node_free(nd);
    return NULL;
  }
  nd->thread_started = true;
  return nd;
}

/* The index of the node at host:port, added (and connecting in the
 * background) when it is new; -1 when the table is full or out of memory.
 * Called with s->mu held. */
static int node_index_locked(redis_store *s, const char *host, int port) {
  for (uint32_t i = 0; i < s->nnodes; i++)
    if (s->nodes[i]->host && s->nodes[i]->port == port && strcmp(s->nodes[i]->host, host) == 0)
      return (int)i;
  if (s->nnodes == MAX_NODES) return -1;
  node *nd = node_new(s, host, port, NULL, false);
  if (!nd) return -1; /* it starts down: its reconnect thread connects it at once */
  s->nodes[s->nnodes] = nd;
  return (int)s->nnodes++;
}

/* ---- the reconnect thread --------------------------------------------------- */

/* Sleeps until the node is down, then tries a connection (with PING) with
 * backoff until one answers; that connection opens the new epoch's pool. */
static void *reconnect_main(void *arg) {
  node *nd = arg;
  uint32_t backoff = BACKOFF_MIN_MS;
  pthread_mutex_lock(&nd->mu);
  while (!nd->stopping) {
    if (nd->up) {
      backoff = BACKOFF_MIN_MS;
      pthread_cond_wait(&nd->wake, &nd->mu);
      continue;
    }
    pthread_mutex_unlock(&nd->mu);
    char err[512];
    redisContext *c = open_conn(nd, true, err, sizeof err);
    pthread_mutex_lock(&nd->mu);
    if (c && !nd->stopping) {
      nd->idle[nd->nidle++] = c;
      nd->nconns++;
      nd->up = true;
      bool was_connected = strcmp(nd->down_why, "not connected yet") != 0;
      pthread_cond_broadcast(&nd->freed);
      pthread_mutex_unlock(&nd->mu);
      if (was_connected) kiln_log(KILN_LOG_INFO, "kiln cache", "%s reachable again", nd->where);
      want_refresh(nd->s);
      pthread_mutex_lock(&nd->mu);
      continue;
    }
    if (c) {
      redisFree(c);
      break;
    }
    struct timespec deadline = deadline_after(backoff);
    while (!nd->stopping && pthread_cond_timedwait(&nd->wake, &nd->mu, &deadline) != ETIMEDOUT) {
    }
    backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
  }
  pthread_mutex_unlock(&nd->mu);
  return NULL;
}

/* ---- the slot map (cluster and sentinel) -------------------------------------- */

static void want_refresh(redis_store *s) {
  if (s->t.topo == TOPO_SINGLE) return;
  pthread_mutex_lock(&s->mu);
  s->refresh_wanted = true;
  pthread_cond_signal(&s->refresh_wake);
  pthread_mutex_unlock(&s->mu);
}

typedef struct map_build {
  redis_store *s;
  const char *answered_host; /* for ranges whose address is empty */
  int answered_port;
  uint8_t map[KILN__REDIS_SLOTS];
  bool full; /* the node table is full */
} map_build;

static int add_range(void *ctx, uint16_t first, uint16_t last, const char *host, int port) {
  map_build *b = ctx;
  if (!host[0]) {
    host = b->answered_host;
    port = b->answered_port;
  }
  pthread_mutex_lock(&b->s->mu);
  int i = node_index_locked(b->s, host, port);
  pthread_mutex_unlock(&b->s->mu);
  if (i < 0) {
    b->full = true;
    return 1;
  }
  memset(b->map + first, i, (size_t)(last - first) + 1);
  return 0;
}

/* Asks one server for the map: CLUSTER SLOTS on a cluster node, SENTINEL
 * get-master-addr-by-name on a sentinel. 0 with b->map filled; -1 with why. */
static int read_map_from(redis_store *s, const char *host, int port, map_build *b, char *why,
                         size_t whyn) {
  bool sentinel = s->t.topo == TOPO_SENTINEL;
  /* Sentinels have no databases and usually no password of their own; data
   * nodes get the URL's credentials (a cluster has no SELECT). */
  redisContext *c = connect_to(s, host, port, NULL, sentinel, false, false, why, whyn);
  if (!c) return -1;
  sigset_t old;
  pipe_block(&old);
  redisReply *rep = sentinel ? redisCommand(c, "SENTINEL get-master-addr-by-name %s", s->t.master)
                             : redisCommand(c, "CLUSTER SLOTS");
  pipe_restore(&old);
  int rc = -1;
  if (!rep) {
    describe_io(s->timeout_ms, c, why, whyn);
  } else if (sentinel) {
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
        rep->element[0]->type == REDIS_REPLY_STRING &&
        rep->element[1]->type == REDIS_REPLY_STRING) {
      long p = parse_uint(rep->element[1]->str, rep->element[1]->len, 1, 65535);
      if (p > 0 && rep->element[0]->len > 0 && rep->element[0]->len < KILN__REDIS_HOST_MAX &&
          !memchr(rep->element[0]->str, 0, rep->element[0]->len)) {
        rc = add_range(b, 0, KILN__REDIS_SLOTS - 1, rep->element[0]->str, (int)p) ? -1 : 0;
        if (rc) snprintf(why, whyn, "too many nodes");
      } else {
        snprintf(why, whyn, "the sentinel named an unusable address for '%s'", s->t.master);
      }
    } else if (rep->type == REDIS_REPLY_NIL) {
      snprintf(why, whyn, "the sentinel does not know master '%s'", s->t.master);
    } else {
      snprintf(why, whyn, "SENTINEL get-master-addr-by-name answered %s",
               rep->type == REDIS_REPLY_ERROR ? rep->str : "something unexpected");
    }
  } else {
    b->answered_host = host;
    b->answered_port = port;
    rc = kiln__redis_walk_slots(rep, add_range, b, why, whyn);
    if (rc && b->full) snprintf(why, whyn, "the cluster has more than %d nodes", MAX_NODES);
    if (rc) rc = -1;
  }
  if (rep) freeReplyObject(rep);
  redisFree(c);
  return rc;
}

/* One map read: from the seeds (sentinels) in turn, then (cluster) from
 * every node learnt so far, until one answers. */
static void refresh_map(redis_store *s) {
  map_build b;
  memset(&b, 0, sizeof b);
  b.s = s;
  char why[512] = "no server to ask";
  bool ok = false;
  for (size_t i = 0; i < s->t.nhosts && !ok; i++) {
    memset(b.map, NO_NODE, sizeof b.map);
    ok = read_map_from(s, s->t.hosts[i].host, s->t.hosts[i].port, &b, why, sizeof why) == 0;
  }
  if (!ok && s->t.topo == TOPO_CLUSTER) {
    pthread_mutex_lock(&s->mu);
    uint32_t n = s->nnodes;
    pthread_mutex_unlock(&s->mu);
    for (uint32_t i = 0; i < n && !ok; i++) {
      node *nd = s->nodes[i]; /* entries below nnodes never change */
      memset(b.map, NO_NODE, sizeof b.map);
      ok = read_map_from(s, nd->host, nd->port, &b, why, sizeof why) == 0;
    }
  }
  pthread_mutex_lock(&s->mu);
  s->map_reads++;
  if (ok) {
    memcpy(s->slot_node, b.map, sizeof b.map);
    s->map_known = true;
  } else {
    s->map_failures++;
    bool news = strcmp(s->map_why, why) != 0;
    snprintf(s->map_why, sizeof s->map_why, "%s", why);
    pthread_mutex_unlock(&s->mu);
    if (news)
      kiln_log(KILN_LOG_WARN, "kiln cache", "%s: cannot read the %s: %s", s->where,
               s->t.topo == TOPO_SENTINEL ? "current master" : "slot map", why);
    return;
  }
  pthread_mutex_unlock(&s->mu);
}

/* Whether every slot has a primary that is up. */
static bool map_healthy(redis_store *s) {
  pthread_mutex_lock(&s->mu);
  bool ok = s->map_known;
  uint8_t seen[MAX_NODES] = {0};
  for (size_t i = 0; ok && i < KILN__REDIS_SLOTS; i++) {
    uint8_t k = s->slot_node[i];
    if (k == NO_NODE) {
      ok = false;
    } else if (!seen[k]) {
      seen[k] = 1;
      node *nd = s->nodes[k];
      pthread_mutex_lock(&nd->mu);
      ok = nd->up;
      pthread_mutex_unlock(&nd->mu);
    }
  }
  pthread_mutex_unlock(&s->mu);
  return ok;
}

/* Rereads the map when asked (at most every REFRESH_MIN_MS), every
 * REFRESH_DEGRADED_MS while it is not healthy, and every REFRESH_IDLE_MS. */
static void *refresher_main(void *arg) {
  redis_store *s = arg;
  for (;;) {
    uint32_t wait_ms = map_healthy(s) ? REFRESH_IDLE_MS : REFRESH_DEGRADED_MS;
    struct timespec min = deadline_after(REFRESH_MIN_MS);
    struct timespec deadline = deadline_after(wait_ms);
    pthread_mutex_lock(&s->mu);
    while (!s->stopping && pthread_cond_timedwait(&s->refresh_wake, &s->mu, &min) != ETIMEDOUT) {
    }
    while (!s->stopping && !s->refresh_wanted &&
           pthread_cond_timedwait(&s->refresh_wake, &s->mu, &deadline) != ETIMEDOUT) {
    }
    bool stop = s->stopping;
    s->refresh_wanted = false;
    pthread_mutex_unlock(&s->mu);
    if (stop) return NULL;
    refresh_map(s);
  }
}

/* Waits up to ms for every node the map names to connect (at start, so a
 * healthy cluster serves from the first request). */
static void await_nodes(redis_store *s, uint32_t ms) {
  struct timespec deadline = deadline_after(ms);
  pthread_mutex_lock(&s->mu);
  uint32_t n = s->nnodes;
  pthread_mutex_unlock(&s->mu);
  for (uint32_t i = 0; i < n; i++) {
    node *nd = s->nodes[i];
    pthread_mutex_lock(&nd->mu);
    while (!nd->up && !nd->stopping &&
           pthread_cond_timedwait(&nd->freed, &nd->mu, &deadline) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&nd->mu);
  }
}

/* The node serving slot; NULL when the map names none. */
static node *route(redis_store *s, uint16_t slot) {
  if (s->t.topo == TOPO_SINGLE) return s->nodes[0];
  pthread_mutex_lock(&s->mu);
  uint8_t k = s->slot_node[slot];
  node *nd = k == NO_NODE ? NULL : s->nodes[k];
  pthread_mutex_unlock(&s->mu);
  return nd;
}

/* ---- commands ------------------------------------------------------------------- */

/* Runs one command on the node serving key (or on pinned), following
 * redirections. 0 with *out (never an error reply; the caller frees it with
 * freeReplyObject); KILN_EUNAVAIL after counting a fault. `what` names the
 * command and key for messages. */
static int vcommand(redis_store *s, node *pinned, const char *key, redisReply **out,
                    kiln_status *st, const char *what, const char *fmt, va_list ap) {
  *out = NULL;
  char *cmd = NULL;
  int len = redisvFormatCommand(&cmd, fmt, ap);
  if (len < 0) return kiln_status_set(st, KILN_ENOMEM, s->where, "%s: out of memory", what);
  uint16_t slot = s->t.topo == TOPO_CLUSTER && key ? kiln__redis_slot(key, strlen(key)) : 0;
  node *nd = pinned ? pinned : route(s, slot);
  bool asking = false;
  int rc = 0;
  for (int hop = 0;; hop++) {
    if (!nd) {
      want_refresh(s);
      rc = fault(s, s->where, st, "%s: no live primary is known for slot %u; rereading the map",
                 what, (unsigned)slot);
      break;
    }
    redisReply *rep;
    rc = exchange(nd, cmd, (size_t)len, asking, &rep, what, st);
    if (rc) break;
    if (rep->type != REDIS_REPLY_ERROR) {
      *out = rep;
      break;
    }
    kiln__redis_redirect rd;
    if (s->t.topo == TOPO_CLUSTER && !pinned &&
        kiln__redis_parse_redirect(rep->str, rep->len, &rd)) {
      atomic_fetch_add(&nd->redirects, 1);
      if (hop >= MAX_HOPS) {
        rc = fault(s, nd->where, st, "%s: more than %d redirections (last: %.*s)", what, MAX_HOPS,
                   (int)rep->len, rep->str);
        freeReplyObject(rep);
        break;
      }
      pthread_mutex_lock(&s->mu);
      int k = node_index_locked(s, rd.host[0] ? rd.host : nd->host, rd.port);
      if (k >= 0 && !rd.ask) s->slot_node[rd.slot] = (uint8_t)k;
      node *to = k >= 0 ? s->nodes[k] : NULL;
      pthread_mutex_unlock(&s->mu);
      if (!rd.ask) want_refresh(s);
      freeReplyObject(rep);
      /* A node just learnt of is still connecting: this request is then a
       * fault (borrow does not wait for it) and later ones find it up. */
      nd = to;
      asking = rd.ask;
      continue;
    }
    atomic_fetch_add(&nd->errors, 1);
    rc = fault(s, nd->where, st, "%s: %.*s", what, (int)rep->len, rep->str);
    if (strncmp(rep->str, "READONLY", 8) == 0 || strncmp(rep->str, "CLUSTERDOWN", 11) == 0 ||
        strncmp(rep->str, "TRYAGAIN", 8) == 0 || strncmp(rep->str, "MASTERDOWN", 10) == 0)
      want_refresh(s);
    freeReplyObject(rep);
    break;
  }
  redisFreeCommand(cmd);
  return rc;
}

static int command(redis_store *s, const char *key, redisReply **out, kiln_status *st,
                   const char *what, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vcommand(s, NULL, key, out, st, what, fmt, ap);
  va_end(ap);
  return rc;
}

static int node_command(redis_store *s, node *nd, redisReply **out, kiln_status *st,
                        const char *what, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vcommand(s, nd, NULL, out, st, what, fmt, ap);
  va_end(ap);
  return rc;
}

/* A reply of a type the command cannot return (a proxy, a module): a fault
 * with a message; the connection stays. */
static int unexpected(redis_store *s, redisReply *rep, const char *what, kiln_status *st) {
  int type = rep->type;
  freeReplyObject(rep);
  return fault(s, s->where, st, "%s: unexpected reply type %d", what, type);
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

/* "<prefix><kind>:<hex>" (a cluster: "<prefix><kind>:{<hex>}") into buf
 * (MAX_PREFIX + 80 bytes), after checking the key. */
static int make_key(const redis_store *s, const char *kind, const char *hex, char *buf,
                    kiln_status *st) {
  if (!is_key_hex(hex))
    return kiln_status_set(st, KILN_EINVAL, s->where, "key '%.80s' is not %d lowercase hex digits",
                           hex ? hex : "(null)", KEY_HEX);
  snprintf(buf, MAX_PREFIX + 80, s->t.topo == TOPO_CLUSTER ? "%s%s:{%s}" : "%s%s:%s", s->prefix,
           kind, hex);
  return 0;
}

static void count(redis_store *s, uint64_t *counter) {
  pthread_mutex_lock(&s->mu);
  (*counter)++;
  pthread_mutex_unlock(&s->mu);
}

/* GET of a full Redis key (on nd when given); stats only when counted
 * (listing does not). */
static int get_value(redis_store *s, node *nd, const char *key, bool counted, uint8_t **val,
                     size_t *len, kiln_status *st) {
  char what[MAX_PREFIX + 96];
  snprintf(what, sizeof what, "GET %s", key);
  redisReply *rep;
  int rc = nd ? node_command(s, nd, &rep, st, what, "GET %s", key)
              : command(s, key, &rep, st, what, "GET %s", key);
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
  return rc ? rc : get_value(s, NULL, key, true, val, len, st);
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
    rc = command(s, key, &rep, st, what, "SET %s %b EX %u", key, val, len, s->ttl_s);
  else
    rc = command(s, key, &rep, st, what, "SET %s %b", key, val, len);
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
  if ((rc = command(s, key, &rep, st, what, "DEL %s", key))) return rc;
  if (rep->type != REDIS_REPLY_INTEGER) return unexpected(s, rep, what, st);
  long long n = rep->integer;
  freeReplyObject(rep);
  return n > 0 ? 0 : KILN_ENOTFOUND;
}

/* The hex of a listed Redis key, or NULL when it is not one of ours. */
static const char *listed_hex(const redis_store *s, const redisReply *k) {
  size_t plen = strlen(s->prefix) + 4; /* "<prefix>exe:" */
  bool tagged = s->t.topo == TOPO_CLUSTER;
  size_t want = plen + KEY_HEX + (tagged ? 2 : 0);
  if (k->type != REDIS_REPLY_STRING || k->len != want) return NULL;
  if (tagged && (k->str[plen] != '{' || k->str[want - 1] != '}')) return NULL;
  const char *hex = k->str + plen + (tagged ? 1 : 0);
  for (int i = 0; i < KEY_HEX; i++)
    if (!((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f'))) return NULL;
  return hex;
}

/* SCANs one node for "<prefix>exe:*" and calls fn for each entry; an entry
 * that expires between SCAN and GET is skipped. *stop set when fn stopped. */
static int list_node(redis_store *s, node *nd, kiln_cache_list_fn fn, void *ctx, int *stop,
                     kiln_status *st) {
  char pattern[2 * MAX_PREFIX + 8], cursor[32] = "0";
  size_t n = 0;
  for (const char *p = s->prefix; *p; p++) {
    if (strchr("*?[]\\{}", *p)) pattern[n++] = '\\';
    pattern[n++] = *p;
  }
  snprintf(pattern + n, sizeof pattern - n, "exe:*");
  do {
    redisReply *rep;
    int rc = node_command(s, nd, &rep, st, "SCAN", "SCAN %s MATCH %s COUNT 256", cursor, pattern);
    if (rc) return rc;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING || rep->element[0]->len >= sizeof cursor ||
        rep->element[1]->type != REDIS_REPLY_ARRAY)
      return unexpected(s, rep, "SCAN", st);
    snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
    redisReply *keys = rep->element[1];
    for (size_t i = 0; i < keys->elements && !*stop; i++) {
      const redisReply *k = keys->element[i];
      const char *hex = listed_hex(s, k);
      if (!hex) continue;
      char hexcopy[KEY_HEX + 1];
      memcpy(hexcopy, hex, KEY_HEX);
      hexcopy[KEY_HEX] = 0;
      uint8_t *val = NULL;
      size_t len = 0;
      rc = get_value(s, nd, k->str, false, &val, &len, st);
      if (rc == KILN_ENOTFOUND) continue;
      if (rc) {
        freeReplyObject(rep);
        return rc;
      }
      *stop = fn(ctx, hexcopy, val, len);
      kiln_free(val);
    }
    freeReplyObject(rep);
  } while (!*stop && strcmp(cursor, "0") != 0);
  return 0;
}

/* Lists every entry: the one node, or each primary of the map once. */
static int redis_list(kiln_cache_store *base, kiln_cache_list_fn fn, void *ctx, kiln_status *st) {
  redis_store *s = (redis_store *)base;
  if (s->t.topo == TOPO_SINGLE) {
    int stop = 0;
    return list_node(s, s->nodes[0], fn, ctx, &stop, st);
  }
  node *primaries[MAX_NODES];
  uint32_t np = 0;
  bool seen[MAX_NODES] = {0}, gaps = false;
  pthread_mutex_lock(&s->mu);
  for (size_t i = 0; i < KILN__REDIS_SLOTS; i++) {
    uint8_t k = s->slot_node[i];
    if (k == NO_NODE) {
      gaps = true;
    } else if (!seen[k]) {
      seen[k] = true;
      primaries[np++] = s->nodes[k];
    }
  }
  pthread_mutex_unlock(&s->mu);
  if (gaps) {
    want_refresh(s);
    return fault(s, s->where, st, "listing: some slots have no known primary; rereading the map");
  }
  int stop = 0;
  for (uint32_t i = 0; i < np && !stop; i++) {
    int rc = list_node(s, primaries[i], fn, ctx, &stop, st);
    if (rc) return rc;
  }
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
  pthread_mutex_unlock(&s->mu);
  out->up = map_healthy(s); /* one Redis: its map names node 0 everywhere */
}

static size_t redis_nodes(kiln_cache_store *base, kiln_cache_node_stats *out, size_t cap) {
  redis_store *s = (redis_store *)base;
  pthread_mutex_lock(&s->mu);
  uint32_t n = s->nnodes;
  uint32_t slots[MAX_NODES] = {0};
  for (size_t i = 0; i < KILN__REDIS_SLOTS; i++)
    if (s->slot_node[i] != NO_NODE) slots[s->slot_node[i]]++;
  pthread_mutex_unlock(&s->mu);
  for (uint32_t i = 0; i < n && i < cap; i++) {
    node *nd = s->nodes[i];
    kiln_cache_node_stats *o = &out[i];
    memset(o, 0, sizeof *o);
    snprintf(o->addr, sizeof o->addr, "%s", nd->addr);
    pthread_mutex_lock(&nd->mu);
    o->up = nd->up;
    pthread_mutex_unlock(&nd->mu);
    o->slots = s->t.topo == TOPO_SINGLE ? KILN__REDIS_SLOTS : slots[i];
    o->requests = atomic_load(&nd->requests);
    o->errors = atomic_load(&nd->errors);
    o->redirects = atomic_load(&nd->redirects);
    o->latency_us = atomic_load(&nd->latency_us);
  }
  return n;
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
  if ((rc = command(s, key, &rep, st, what, "EVAL %s 1 %s %s %u", lock_take_script, key, token,
                    ttl_ms)))
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
  if ((rc = command(s, key, &rep, st, what, "SET %s %s PX %u", key, token, ttl_ms))) return rc;
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
  if ((rc = command(s, key, &rep, st, what, "EVAL %s 1 %s %s", lock_release_script, key, token)))
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
  if ((rc = command(s, key, &rep, st, what, "PTTL %s", key))) return rc;
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
  pthread_cond_signal(&s->refresh_wake);
  pthread_mutex_unlock(&s->mu);
  if (s->refresher_started) pthread_join(s->refresher, NULL);
  for (uint32_t i = 0; i < s->nnodes; i++) node_free(s->nodes[i]);
  pthread_cond_destroy(&s->refresh_wake);
  pthread_mutex_destroy(&s->mu);
  target_free(&s->t);
  kiln_free(s->prefix);
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
    .nodes = redis_nodes,
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
  if (cfg->db > 0) {
    if (t->topo == TOPO_CLUSTER)
      return kiln_status_set(st, KILN_EINVAL, NULL, "a Redis Cluster has only database 0");
    t->db = cfg->db;
  }
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
  if (!rc) rc = pthread_cond_init(&s->refresh_wake, &ca);
  pthread_condattr_destroy(&ca);
  return rc;
}

/* "redis cluster h:p,h:p" or "redis sentinel h:p,... master M". */
static void name_store(redis_store *s) {
  const target *t = &s->t;
  size_t n = (size_t)snprintf(s->where, sizeof s->where, "redis %s",
                              t->topo == TOPO_CLUSTER ? "cluster" : "sentinel");
  for (size_t i = 0; i < t->nhosts && n < sizeof s->where; i++)
    n += (size_t)snprintf(s->where + n, sizeof s->where - n,
                          strchr(t->hosts[i].host, ':') ? "%s[%s]:%d" : "%s%s:%d", i ? "," : " ",
                          t->hosts[i].host, t->hosts[i].port);
  if (t->topo == TOPO_SENTINEL && n < sizeof s->where)
    snprintf(s->where + n, sizeof s->where - n, " master %s", t->master);
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
  if (s) s->prefix = kiln_strdup(cfg->prefix ? cfg->prefix : "kiln:v1:");
  if (!s || !s->prefix || init_sync(s) != 0) {
    if (s) kiln_free(s->prefix);
    kiln_free(s);
    target_free(&t);
    return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  }
  s->base.ops = &redis_ops;
  s->t = t;
  s->ttl_s = cfg->ttl_s;
  s->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS;
  s->pool_max = cfg->pool ? cfg->pool : DEFAULT_POOL;
  memset(s->slot_node, NO_NODE, sizeof s->slot_node);
  if (t.topo == TOPO_SINGLE) {
    node *nd = node_new(s, t.path ? NULL : t.hosts[0].host, t.hosts[0].port, t.path, true);
    if (!nd) {
      redis_destroy(&s->base);
      return kiln_status_set(st, KILN_EINTERNAL, NULL, "cannot start the redis reconnect thread");
    }
    s->nodes[s->nnodes++] = nd;
    memset(s->slot_node, 0, sizeof s->slot_node);
    s->map_known = true;
    snprintf(s->where, sizeof s->where, "%s", nd->where);
  } else {
    name_store(s);
    /* The first map now, so a healthy cluster serves from the first
     * request; a cluster down at start is not an error, as for one Redis. */
    refresh_map(s);
    await_nodes(s, s->timeout_ms);
    if (pthread_create(&s->refresher, NULL, refresher_main, s) != 0) {
      redis_destroy(&s->base);
      return kiln_status_set(st, KILN_EINTERNAL, NULL, "cannot start the redis map thread");
    }
    s->refresher_started = true;
  }
  *out = &s->base;
  return 0;
}
