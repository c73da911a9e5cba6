/* Unit tests for the shared tier on a Redis Cluster and behind Redis
 * Sentinel (cache/redis.c, cache/redis_slots.c).
 *
 * Offline: CRC16 and hash slots against Redis's documented values, hash
 * tags, MOVED/ASK parsing, CLUSTER SLOTS replies (fed through hiredis's
 * reader) well and badly formed, and the cluster/sentinel URL forms and
 * their messages.
 *
 * With redis-server and redis-cli: a real cluster of three primaries and
 * three replicas on free loopback ports (`redis-cli --cluster create`):
 * entries spread over every primary and are read back; the listing covers
 * every node; a resharding under load (`redis-cli --cluster reshard`) is
 * followed through MOVED/ASK with every read right; a primary SIGKILLed
 * under load: operations on its slots are faults, never wrong values, until
 * its replica's promotion is followed, then all succeed. A primary, a
 * replica and a sentinel: the primary killed, the sentinel's failover is
 * followed.
 */
#include <check.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/redis_slots.h"
#include "cache/store.h"
#include "common/alloc.h"
#include "tests/support/redis_server.h"

extern char **environ;

#define TIMEOUT_MS 300
#define NODES 6
#define KEYS 300

static kiln_status st;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- offline ------------------------------------------------------------------ */

START_TEST(test_crc16_and_slots) {
  /* The CRC16 check value of the XMODEM variant, and slots Redis documents. */
  ck_assert_uint_eq(kiln__redis_crc16((const uint8_t *)"123456789", 9), 0x31C3);
  ck_assert_uint_eq(kiln__redis_slot("foo", 3), 12182);
  ck_assert_uint_eq(kiln__redis_slot("bar", 3), 5061);
  ck_assert_uint_eq(kiln__redis_slot("", 0), 0);
  /* Hash tags: the first {...} with something inside decides. */
  ck_assert_uint_eq(kiln__redis_slot("{user1000}.following", 20),
                    kiln__redis_slot("{user1000}.followers", 20));
  ck_assert_uint_eq(kiln__redis_slot("{user1000}.following", 20), kiln__redis_slot("user1000", 8));
  ck_assert_uint_eq(kiln__redis_slot("foo{}{bar}", 10),
                    kiln__redis_crc16((const uint8_t *)"foo{}{bar}", 10) & 16383);
  ck_assert_uint_eq(kiln__redis_slot("foo{{bar}}zap", 13), kiln__redis_slot("{bar", 4) & 16383);
  ck_assert_uint_eq(kiln__redis_slot("foo{bar}{zap}", 13), kiln__redis_slot("bar", 3));
  ck_assert_uint_eq(kiln__redis_slot("{", 1), kiln__redis_crc16((const uint8_t *)"{", 1) & 16383);
  /* An entry and its lock share the slot of their hex. */
  const char *hex = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  char a[128], b[128];
  snprintf(a, sizeof a, "kiln:v1:exe:{%s}", hex);
  snprintf(b, sizeof b, "kiln:v1:lock:{%s}", hex);
  ck_assert_uint_eq(kiln__redis_slot(a, strlen(a)), kiln__redis_slot(b, strlen(b)));
  ck_assert_uint_eq(kiln__redis_slot(a, strlen(a)), kiln__redis_slot(hex, 64));
}
END_TEST

static bool redirect(const char *s, kiln__redis_redirect *r) {
  return kiln__redis_parse_redirect(s, strlen(s), r);
}

START_TEST(test_redirects) {
  kiln__redis_redirect r;
  ck_assert(redirect("MOVED 3999 127.0.0.1:6381", &r));
  ck_assert(!r.ask);
  ck_assert_uint_eq(r.slot, 3999);
  ck_assert_str_eq(r.host, "127.0.0.1");
  ck_assert_int_eq(r.port, 6381);
  ck_assert(redirect("ASK 16383 ::1:7000", &r));
  ck_assert(r.ask);
  ck_assert_uint_eq(r.slot, 16383);
  ck_assert_str_eq(r.host, "::1");
  ck_assert_int_eq(r.port, 7000);
  ck_assert(redirect("MOVED 0 :7001", &r)); /* a node that does not know its address */
  ck_assert_str_eq(r.host, "");
  ck_assert_int_eq(r.port, 7001);
  const char *bad[] = {"MOVED",
                       "MOVED 3999",
                       "MOVED 16384 h:1",
                       "MOVED x h:1",
                       "MOVED 1 h",
                       "MOVED 1 h:0",
                       "MOVED 1 h:65536",
                       "MOVED 1 h:12x",
                       "MOVED -1 h:1",
                       "ASK 1 h h:1",
                       "ERR MOVED 1 h:1",
                       "moved 1 h:1",
                       "WRONGTYPE Operation against a key",
                       ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(!redirect(bad[i], &r), "'%s' parsed as a redirection", bad[i]);
  char longhost[400] = "MOVED 1 ";
  memset(longhost + 8, 'h', 300);
  strcpy(longhost + 308, ":1");
  ck_assert(!redirect(longhost, &r));
}
END_TEST

/* A reply tree parsed from RESP text by hiredis's own reader. */
static redisReply *resp(const char *text) {
  redisReader *rd = redisReaderCreate();
  ck_assert_int_eq(redisReaderFeed(rd, text, strlen(text)), REDIS_OK);
  void *rep = NULL;
  ck_assert_int_eq(redisReaderGetReply(rd, &rep), REDIS_OK);
  ck_assert_ptr_nonnull(rep);
  redisReaderFree(rd);
  return rep;
}

typedef struct ranges {
  int n;
  uint16_t first[8], last[8];
  char host[8][64];
  int port[8];
} ranges;

static int collect(void *ctx, uint16_t first, uint16_t last, const char *host, int port) {
  ranges *r = ctx;
  if (r->n == 8) return 1;
  r->first[r->n] = first;
  r->last[r->n] = last;
  snprintf(r->host[r->n], sizeof r->host[0], "%s", host);
  r->port[r->n++] = port;
  return 0;
}

static int walk(const char *text, ranges *r, char *why, size_t n) {
  memset(r, 0, sizeof *r);
  redisReply *rep = resp(text);
  int rc = kiln__redis_walk_slots(rep, collect, r, why, n);
  freeReplyObject(rep);
  return rc;
}

START_TEST(test_cluster_slots_reply) {
  ranges r;
  char why[256];
  /* Two ranges, the second primary with a replica and extra fields. */
  ck_assert_int_eq(walk("*2\r\n"
                        "*3\r\n:0\r\n:8191\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n"
                        "*4\r\n:8192\r\n:16383\r\n*2\r\n$0\r\n\r\n:7001\r\n"
                        "*2\r\n$9\r\n127.0.0.1\r\n:7004\r\n",
                        &r, why, sizeof why),
                   0);
  ck_assert_int_eq(r.n, 2);
  ck_assert_uint_eq(r.first[0], 0);
  ck_assert_uint_eq(r.last[0], 8191);
  ck_assert_str_eq(r.host[0], "127.0.0.1");
  ck_assert_int_eq(r.port[0], 7000);
  ck_assert_uint_eq(r.first[1], 8192);
  ck_assert_str_eq(r.host[1], ""); /* the answering node */
  ck_assert_int_eq(r.port[1], 7001);
  /* An empty map (a cluster not yet assigned) is well formed. */
  ck_assert_int_eq(walk("*0\r\n", &r, why, sizeof why), 0);
  ck_assert_int_eq(r.n, 0);
  struct {
    const char *text, *why;
  } bad[] = {
      {"-ERR This instance has cluster support disabled\r\n", "not an array"},
      {"$2\r\nok\r\n", "not an array"},
      {"*1\r\n*2\r\n:0\r\n:1\r\n", "is not [first, last, primary, ...]"},
      {"*1\r\n*3\r\n:5\r\n:4\r\n*2\r\n$1\r\nh\r\n:1\r\n", "out of bounds"},
      {"*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n", "out of bounds"},
      {"*1\r\n*3\r\n:0\r\n:1\r\n*1\r\n$1\r\nh\r\n", "has no primary"},
      {"*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n:1\r\n:1\r\n", "has no primary"},
      {"*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\nh\r\n:0\r\n", "unusable address"},
      {"*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\nh\r\n:70000\r\n", "unusable address"},
      {"*1\r\n*3\r\n$1\r\n0\r\n:1\r\n*2\r\n$1\r\nh\r\n:1\r\n", "is not [first"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = 0;
    ck_assert_int_eq(walk(bad[i].text, &r, why, sizeof why), -1);
    ck_assert_msg(strstr(why, bad[i].why), "case %zu: '%s' lacks '%s'", i, why, bad[i].why);
  }
}
END_TEST

static void expect_url_error(const char *url, const char *msg) {
  kiln_cache_redis_config cfg = {.url = url, .db = -1};
  kiln_cache_store *s = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_redis_create(&cfg, &s, &st), KILN_EINVAL);
  ck_assert_ptr_null(s);
  ck_assert_str_eq(st.msg, msg);
}

START_TEST(test_urls) {
  expect_url_error("redis-cluster://", "redis url 'redis-cluster://': host is empty");
  expect_url_error("redis-cluster://h:1,", "redis url 'redis-cluster://h:1,': host is empty");
  expect_url_error("redis-cluster://h:1,h:x",
                   "redis url 'redis-cluster://h:1,h:x': port 'x' is not a number");
  expect_url_error("redis-cluster://h:1/2",
                   "redis url 'redis-cluster://h:1/2': a Redis Cluster has only database 0");
  expect_url_error("redis-cluster://h:1?db=2",
                   "redis url 'redis-cluster://h:1?db=2': a Redis Cluster has only database 0");
  expect_url_error("redis-sentinel://h:1",
                   "redis url 'redis-sentinel://h:1': name the master set after the sentinels, "
                   "as in redis-sentinel://host:26379/mymaster");
  expect_url_error("redis-sentinel://h:1/",
                   "redis url 'redis-sentinel://h:1/': master name '' is not 1 to 128 of "
                   "[A-Za-z0-9._-]");
  expect_url_error("redis-sentinel://h:1/a b",
                   "redis url 'redis-sentinel://h:1/a b': master name 'a b' is not 1 to 128 of "
                   "[A-Za-z0-9._-]");
  expect_url_error("ftp://h:1", "redis url 'ftp://h:1': scheme 'ftp' is not supported (use "
                                "redis://, redis-cluster://, redis-sentinel://, unix: or "
                                "host:port)");
  char many[2048] = "redis-cluster://";
  for (int i = 0; i < 65; i++) strcat(many, i ? ",h:1" : "h:1");
  kiln_cache_redis_config cfg = {.url = many, .db = -1};
  kiln_cache_store *s = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_redis_create(&cfg, &s, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "more than 64 hosts"), "%s", st.msg);
  cfg = (kiln_cache_redis_config){.url = "redis-cluster://127.0.0.1:1", .db = 3};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_redis_create(&cfg, &s, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "a Redis Cluster has only database 0");
}
END_TEST

/* Nothing listens at the seeds: the store starts, is not up, and every
 * operation is a prompt fault naming the topology. */
START_TEST(test_cluster_down_at_start) {
  char url[128];
  snprintf(url, sizeof url, "redis-cluster://127.0.0.1:%u,127.0.0.1:%u",
           (unsigned)kiln_test_free_port(), (unsigned)kiln_test_free_port());
  kiln_cache_redis_config cfg = {.url = url, .db = -1, .timeout_ms = TIMEOUT_MS};
  kiln_cache_store *s = NULL;
  ck_assert_int_eq(kiln_cache_redis_create(&cfg, &s, &st), 0);
  kiln_cache_store_stats x;
  s->ops->stats(s, &x);
  ck_assert(!x.up);
  uint8_t *val = NULL;
  size_t len = 0;
  double t0 = now_s();
  kiln_status_clear(&st);
  ck_assert_int_eq(s->ops->get(s,
                               "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                               &val, &len, &st),
                   KILN_EUNAVAIL);
  ck_assert_double_lt(now_s() - t0, 0.5);
  ck_assert_msg(strstr(st.msg, "no live primary is known for slot"), "%s", st.msg);
  ck_assert_msg(strncmp(st.where, "redis cluster 127.0.0.1:", 24) == 0, "%s", st.where);
  ck_assert_uint_eq(s->ops->nodes(s, NULL, 0), 0);
  kiln_cache_store_destroy(s);
}
END_TEST

/* ---- a real cluster --------------------------------------------------------------- */

/* Runs argv to completion with its output in a log file; its exit status. */
static int run(const char *const *argv) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/tmp/kiln-redis-cli.log", O_WRONLY | O_CREAT | O_APPEND,
                                   0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static bool have_redis_cli(void) {
  const char *argv[] = {"redis-cli", "--version", NULL};
  return run(argv) == 0;
}

static kiln_test_redis *nodes[NODES];

static char *reply_str(int i, const char *cmd) {
  redisReply *rep = kiln_test_redis_command(nodes[i], cmd);
  char *out = rep && (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS)
                  ? kiln_strdup(rep->str)
                  : NULL;
  if (rep) freeReplyObject(rep);
  return out;
}

/* Whether node i says the cluster is ok. */
static bool cluster_ok(int i) {
  char *info = reply_str(i, "CLUSTER INFO");
  bool ok = info && strstr(info, "cluster_state:ok");
  kiln_free(info);
  return ok;
}

/* Whether node i is a primary now (its own line in CLUSTER NODES). */
static bool is_primary(int i) {
  char *lines = reply_str(i, "CLUSTER NODES");
  bool yes = false;
  for (char *l = lines; l && *l;) {
    char *nl = strchr(l, '\n');
    if (nl) *nl = 0;
    if (strstr(l, "myself") && strstr(l, "master")) yes = true;
    l = nl ? nl + 1 : l + strlen(l);
  }
  kiln_free(lines);
  return yes;
}

/* Whether r is a primary, or a replica whose link to its primary is up. */
static bool replica_synced(kiln_test_redis *r) {
  redisReply *rep = kiln_test_redis_command(r, "INFO replication");
  bool ok = rep && rep->type == REDIS_REPLY_STRING &&
            (strstr(rep->str, "role:master") || strstr(rep->str, "master_link_status:up"));
  if (rep) freeReplyObject(rep);
  return ok;
}

/* Whether the sentinel lists a replica of kilnm that is up. */
static bool sentinel_knows_replica(kiln_test_redis *sentinel) {
  redisReply *rep = kiln_test_redis_command(sentinel, "SENTINEL REPLICAS kilnm");
  bool ok = false;
  for (size_t i = 0; rep && rep->type == REDIS_REPLY_ARRAY && i < rep->elements && !ok; i++) {
    const redisReply *r = rep->element[i];
    /* each replica: a flat array (RESP2) of field, value, ... */
    for (size_t j = 0; r->type == REDIS_REPLY_ARRAY && j + 1 < r->elements; j += 2)
      if (r->element[j]->type == REDIS_REPLY_STRING &&
          r->element[j + 1]->type == REDIS_REPLY_STRING && strcmp(r->element[j]->str, "flags") == 0)
        ok = strcmp(r->element[j + 1]->str, "slave") == 0;
  }
  if (rep) freeReplyObject(rep);
  return ok;
}

/* Six nodes with cluster mode on, made into three primaries and three
 * replicas; waits until every node reports the cluster ok. */
static void start_cluster(void) {
  /* Replicas sync at once (not after the default 5 s diskless delay), so a
   * primary killed early in a test has a replica able to take over. */
  const char *args[] = {"--cluster-enabled",
                        "yes",
                        "--cluster-node-timeout",
                        "1000",
                        "--repl-diskless-sync-delay",
                        "0",
                        NULL};
  for (int i = 0; i < NODES; i++) {
    kiln_status_clear(&st);
    ck_assert_msg(kiln_test_redis_start(args, &nodes[i], &st) == 0, "redis-server: %s", st.msg);
  }
  const char *argv[NODES + 8];
  int n = 0;
  argv[n++] = "redis-cli";
  argv[n++] = "--cluster";
  argv[n++] = "create";
  for (int i = 0; i < NODES; i++) argv[n++] = kiln_test_redis_addr(nodes[i]);
  argv[n++] = "--cluster-replicas";
  argv[n++] = "1";
  argv[n++] = "--cluster-yes";
  argv[n] = NULL;
  ck_assert_int_eq(run(argv), 0);
  double t0 = now_s();
  for (int i = 0; i < NODES; i++)
    while (!cluster_ok(i) || !replica_synced(nodes[i])) {
      ck_assert_msg(now_s() - t0 < 30, "node %d never reported the cluster ok and in sync", i);
      sleep_ms(100);
    }
}

static void stop_cluster(void) {
  for (int i = 0; i < NODES; i++) {
    kiln_test_redis_destroy(nodes[i]);
    nodes[i] = NULL;
  }
}

static kiln_cache_store *open_cluster(int seed) {
  char url[128];
  snprintf(url, sizeof url, "redis-cluster://%s", kiln_test_redis_addr(nodes[seed]));
  kiln_cache_redis_config cfg = {.url = url, .db = -1, .timeout_ms = TIMEOUT_MS, .pool = 4};
  kiln_cache_store *s = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_cache_redis_create(&cfg, &s, &st) == 0, "create: %s", st.msg);
  return s;
}

static void key_hex(int i, char out[65]) {
  for (int j = 0; j < 64; j++) out[j] = "0123456789abcdef"[(i * 7919 + j * 31 + (i >> 3)) & 15];
  snprintf(out + 56, 9, "%08x", (unsigned)i);
}

static void value_of(int i, char *buf, size_t n) {
  snprintf(buf, n, "entry-%d-%s", i, "payload payload payload");
}

/* get of key i: 0 when right, KILN_ENOTFOUND / KILN_EUNAVAIL passed up;
 * a wrong value fails the test. */
static int check_get(kiln_cache_store *s, int i) {
  char hex[65], want[64];
  key_hex(i, hex);
  value_of(i, want, sizeof want);
  uint8_t *val = NULL;
  size_t len = 0;
  kiln_status lst;
  kiln_status_clear(&lst);
  int rc = s->ops->get(s, hex, &val, &len, &lst);
  if (rc == 0) {
    ck_assert_msg(len == strlen(want) && memcmp(val, want, len) == 0, "key %d: wrong value", i);
    kiln_free(val);
  }
  return rc;
}

static void put_all(kiln_cache_store *s) {
  for (int i = 0; i < KEYS; i++) {
    char hex[65], v[64];
    key_hex(i, hex);
    value_of(i, v, sizeof v);
    kiln_status_clear(&st);
    ck_assert_msg(s->ops->put(s, hex, (const uint8_t *)v, strlen(v), &st) == 0, "put %d: %s", i,
                  st.msg);
  }
}

static int count_entry(void *ctx, const char *key_hex, const uint8_t *val, size_t len) {
  (void)key_hex;
  (void)val;
  (void)len;
  (*(int *)ctx)++;
  return 0;
}

START_TEST(test_cluster_spread) {
  start_cluster();
  kiln_cache_store *s = open_cluster(4); /* a replica as the only seed */
  kiln_cache_store_stats x;
  s->ops->stats(s, &x);
  ck_assert(x.up);
  put_all(s);
  for (int i = 0; i < KEYS; i++) ck_assert_int_eq(check_get(s, i), 0);
  kiln_cache_node_stats ns[16];
  size_t n = s->ops->nodes(s, ns, 16);
  ck_assert_uint_ge(n, 3);
  uint32_t slots = 0, primaries = 0;
  for (size_t i = 0; i < n; i++) {
    slots += ns[i].slots;
    if (ns[i].slots) {
      primaries++;
      ck_assert(ns[i].up);
      /* each primary served a share of the 2 * KEYS operations */
      ck_assert_uint_ge(ns[i].requests, KEYS / 6);
      ck_assert_uint_eq(ns[i].errors, 0);
    }
  }
  ck_assert_uint_eq(slots, 16384);
  ck_assert_uint_eq(primaries, 3);
  /* Every entry sits in its own slot on its primary, lock beside it. */
  int listed = 0;
  kiln_status_clear(&st);
  ck_assert_msg(s->ops->list(s, count_entry, &listed, &st) == 0, "list: %s", st.msg);
  ck_assert_int_eq(listed, KEYS);
  char hex[65];
  key_hex(7, hex);
  bool got = false, held = false;
  ck_assert_int_eq(s->ops->try_lock(s, hex, "me", 5000, &got, &st), 0);
  ck_assert(got);
  ck_assert_int_eq(s->ops->locked(s, hex, &held, &st), 0);
  ck_assert(held);
  ck_assert_int_eq(s->ops->unlock(s, hex, "me", &st), 0);
  ck_assert_int_eq(s->ops->locked(s, hex, &held, &st), 0);
  ck_assert(!held);
  ck_assert_int_eq(s->ops->del(s, hex, &st), 0);
  ck_assert_int_eq(check_get(s, 7), KILN_ENOTFOUND);
  kiln_cache_store_destroy(s);
  stop_cluster();
}
END_TEST

typedef struct load {
  kiln_cache_store *s;
  atomic_bool stop;
  atomic_long ok, missing, faults;
} load;

static void *reader(void *arg) {
  load *l = arg;
  for (int i = 0; !atomic_load(&l->stop); i = (i + 1) % KEYS) {
    int rc = check_get(l->s, i);
    if (rc == 0)
      atomic_fetch_add(&l->ok, 1);
    else if (rc == KILN_ENOTFOUND)
      atomic_fetch_add(&l->missing, 1);
    else
      atomic_fetch_add(&l->faults, 1);
  }
  return NULL;
}

static char *node_id(int i) { return reply_str(i, "CLUSTER MYID"); }

START_TEST(test_cluster_reshard_under_load) {
  start_cluster();
  kiln_cache_store *s = open_cluster(0);
  put_all(s);
  int from = -1, to = -1;
  for (int i = 0; i < NODES; i++)
    if (is_primary(i)) {
      if (from < 0)
        from = i;
      else if (to < 0)
        to = i;
    }
  ck_assert(from >= 0 && to >= 0);
  char *fid = node_id(from), *tid = node_id(to);
  load l = {.s = s};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, reader, &l);
  const char *argv[] = {
      "redis-cli",       "--cluster", "reshard",       kiln_test_redis_addr(nodes[0]),
      "--cluster-from",  fid,         "--cluster-to",  tid,
      "--cluster-slots", "2000",      "--cluster-yes", NULL};
  ck_assert_int_eq(run(argv), 0);
  sleep_ms(300);
  atomic_store(&l.stop, true);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  /* Keys move with their slots: none goes missing; every read during the
   * move was right (check_get asserts it) or, rarely, a fault. */
  ck_assert_int_eq(atomic_load(&l.missing), 0);
  ck_assert_int_gt(atomic_load(&l.ok), KEYS);
  for (int i = 0; i < KEYS; i++) ck_assert_int_eq(check_get(s, i), 0);
  kiln_cache_node_stats ns[16];
  size_t n = s->ops->nodes(s, ns, 16);
  uint64_t redirects = 0;
  for (size_t i = 0; i < n && i < 16; i++) redirects += ns[i].redirects;
  ck_assert_uint_gt(redirects, 0);
  kiln_free(fid);
  kiln_free(tid);
  kiln_cache_store_destroy(s);
  stop_cluster();
}
END_TEST

START_TEST(test_cluster_primary_killed) {
  start_cluster();
  kiln_cache_store *s = open_cluster(1);
  put_all(s);
  sleep_ms(500); /* let the replicas catch up (asynchronous replication) */
  int victim = -1;
  for (int i = 0; i < NODES && victim < 0; i++)
    if (is_primary(i)) victim = i;
  load l = {.s = s};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, reader, &l);
  sleep_ms(200);
  kiln_test_redis_kill(nodes[victim]);
  /* The replica takes over after the node timeout (1 s) and an election. */
  double t0 = now_s();
  bool recovered = false;
  while (!recovered && now_s() - t0 < 20) {
    sleep_ms(200);
    recovered = true;
    for (int i = 0; i < KEYS && recovered; i++) recovered = check_get(s, i) == 0;
  }
  atomic_store(&l.stop, true);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  ck_assert_msg(recovered, "reads still fail %.1f s after the primary died", now_s() - t0);
  ck_assert_int_gt(atomic_load(&l.faults), 0); /* the outage was seen, as faults */
  kiln_cache_store_stats x;
  s->ops->stats(s, &x);
  ck_assert(x.up);
  kiln_cache_store_destroy(s);
  stop_cluster();
}
END_TEST

/* ---- sentinel ----------------------------------------------------------------------- */

START_TEST(test_sentinel_failover) {
  kiln_test_redis *primary = NULL, *replica = NULL, *sentinel = NULL;
  const char *pargs[] = {"--repl-diskless-sync-delay", "0", NULL};
  ck_assert_msg(kiln_test_redis_start(pargs, &primary, &st) == 0, "%s", st.msg);
  char port[8];
  snprintf(port, sizeof port, "%u", (unsigned)kiln_test_redis_port(primary));
  const char *rargs[] = {"--replicaof", "127.0.0.1", port, NULL};
  ck_assert_msg(kiln_test_redis_start(rargs, &replica, &st) == 0, "%s", st.msg);
  for (double t0 = now_s(); !replica_synced(replica);) {
    ck_assert_msg(now_s() - t0 < 20, "the replica never synced");
    sleep_ms(100);
  }
  char conf[256];
  snprintf(conf, sizeof conf,
           "sentinel monitor kilnm 127.0.0.1 %s 1\n"
           "sentinel down-after-milliseconds kilnm 500\n"
           "sentinel failover-timeout kilnm 5000\n",
           port);
  const char *sargs[] = {"--sentinel", NULL};
  ck_assert_msg(kiln_test_redis_start_conf(conf, sargs, &sentinel, &st) == 0, "%s", st.msg);
  /* The sentinel learns of the replica from the primary's INFO; a primary
   * killed before that leaves it nothing to promote (on a loaded machine
   * the first INFO can come late). */
  for (double t0 = now_s(); !sentinel_knows_replica(sentinel);) {
    ck_assert_msg(now_s() - t0 < 20, "the sentinel never listed the replica");
    sleep_ms(100);
  }
  char url[128];
  snprintf(url, sizeof url, "redis-sentinel://%s/kilnm", kiln_test_redis_addr(sentinel));
  kiln_cache_redis_config cfg = {.url = url, .db = -1, .timeout_ms = TIMEOUT_MS};
  kiln_cache_store *s = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_cache_redis_create(&cfg, &s, &st) == 0, "%s", st.msg);
  put_all(s);
  for (int i = 0; i < KEYS; i++) ck_assert_int_eq(check_get(s, i), 0);
  kiln_cache_node_stats ns[4];
  ck_assert_uint_eq(s->ops->nodes(s, ns, 4), 1);
  ck_assert_str_eq(ns[0].addr, kiln_test_redis_addr(primary));
  sleep_ms(500);
  kiln_test_redis_kill(primary);
  double t0 = now_s();
  bool recovered = false;
  while (!recovered && now_s() - t0 < 30) {
    sleep_ms(200);
    recovered = true;
    for (int i = 0; i < KEYS && recovered; i++) recovered = check_get(s, i) == 0;
  }
  ck_assert_msg(recovered, "reads still fail %.1f s after the primary died", now_s() - t0);
  /* Writes go to the promoted replica. */
  char hex[65];
  key_hex(KEYS + 1, hex);
  kiln_status_clear(&st);
  ck_assert_msg(s->ops->put(s, hex, (const uint8_t *)"x", 1, &st) == 0, "%s", st.msg);
  size_t n = s->ops->nodes(s, ns, 4);
  bool follows = false;
  for (size_t i = 0; i < n && i < 4; i++)
    if (ns[i].slots && strcmp(ns[i].addr, kiln_test_redis_addr(replica)) == 0) follows = true;
  ck_assert(follows);
  kiln_cache_store_destroy(s);
  kiln_test_redis_destroy(sentinel);
  kiln_test_redis_destroy(replica);
  kiln_test_redis_destroy(primary);
}
END_TEST

int main(void) {
  Suite *su = suite_create("cache_redis_cluster");
  TCase *tc = tcase_create("offline");
  tcase_add_test(tc, test_crc16_and_slots);
  tcase_add_test(tc, test_redirects);
  tcase_add_test(tc, test_cluster_slots_reply);
  tcase_add_test(tc, test_urls);
  tcase_add_test(tc, test_cluster_down_at_start);
  suite_add_tcase(su, tc);
  const char *why = NULL;
  if (kiln_test_redis_available(&why) && have_redis_cli()) {
    TCase *tr = tcase_create("redis-cluster");
    tcase_set_timeout(tr, 120);
    tcase_add_test(tr, test_cluster_spread);
    tcase_add_test(tr, test_cluster_reshard_under_load);
    tcase_add_test(tr, test_cluster_primary_killed);
    tcase_add_test(tr, test_sentinel_failover);
    suite_add_tcase(su, tr);
  } else {
    printf("cache_redis_cluster: skipping the tests that need redis-server and redis-cli: %s\n",
           why ? why : "redis-cli is not installed");
  }
  SRunner *sr = srunner_create(su);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
