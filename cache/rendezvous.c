/* The id rendezvous through Redis (rendezvous.h), on hiredis's blocking
 * API with a connection of its own per call: a rendezvous happens once per
 * mesh, so there is nothing to pool, and an id must not wait behind the
 * cache tier's traffic or its outage handling.
 */
#include "cache/rendezvous.h"

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct timeval tv_of(double s) {
  if (s < 0.001) s = 0.001;
  struct timeval tv = {.tv_sec = (time_t)s,
                       .tv_usec = (suseconds_t)((s - (double)(time_t)s) * 1e6)};
  return tv;
}

static int connect_to(const char *addr, double left, redisContext **out, kiln_status *st) {
  *out = NULL;
  char host[256];
  const char *colon = addr ? strrchr(addr, ':') : NULL;
  if (colon == NULL || colon == addr || (size_t)(colon - addr) >= sizeof host)
    return kiln_status_set(st, KILN_EINVAL, "rendezvous", "'%.100s' is not HOST:PORT",
                           addr ? addr : "");
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = '\0';
  int port = atoi(colon + 1);
  struct timeval tv = tv_of(left);
  redisContext *c = redisConnectWithTimeout(host, port, tv);
  if (c == NULL || c->err) {
    kiln_status_set(st, KILN_EUNAVAIL, "rendezvous", "Redis at %.100s cannot be reached: %.200s",
                    addr, c ? c->errstr : "out of memory");
    if (c) redisFree(c);
    return KILN_EUNAVAIL;
  }
  redisSetTimeout(c, tv);
  *out = c;
  return 0;
}

/* GET key: 1 and the value in id when it is there, 0 when not, else a
 * KILN_E* code. */
static int get_id(redisContext *c, const kiln_rendezvous_options *o, uint8_t *id, kiln_status *st) {
  redisReply *r = redisCommand(c, "GET %s", o->key);
  if (r == NULL)
    return kiln_status_set(st, KILN_EUNAVAIL, "rendezvous", "Redis at %.100s: %.200s", o->redis,
                           c->errstr);
  int rc = 0;
  if (r->type == REDIS_REPLY_NIL) {
    rc = 0;
  } else if (r->type != REDIS_REPLY_STRING) {
    rc = kiln_status_set(st, KILN_EUNAVAIL, "rendezvous",
                         "Redis at %.100s answered GET %.100s "
                         "with %.200s",
                         o->redis, o->key,
                         r->type == REDIS_REPLY_ERROR ? r->str : "a reply that is not a string");
  } else if (r->len != o->id_bytes) {
    rc = kiln_status_set(st, KILN_EINVAL, "rendezvous", "%.100s holds %zu bytes, not a %zu-byte id",
                         o->key, (size_t)r->len, o->id_bytes);
  } else {
    memcpy(id, r->str, o->id_bytes);
    rc = 1;
  }
  freeReplyObject(r);
  return rc;
}

static int publish(redisContext *c, const kiln_rendezvous_options *o, uint8_t *id,
                   kiln_status *st) {
  int rc = o->mint(o->mint_ctx, id, o->id_bytes, st);
  if (rc) return rc;
  uint32_t ttl = o->ttl_s ? o->ttl_s : 300;
  redisReply *r = redisCommand(c, "SET %s %b NX EX %u", o->key, id, o->id_bytes, ttl);
  if (r == NULL)
    return kiln_status_set(st, KILN_EUNAVAIL, "rendezvous", "Redis at %.100s: %.200s", o->redis,
                           c->errstr);
  bool set = r->type == REDIS_REPLY_STATUS;
  bool exists = r->type == REDIS_REPLY_NIL;
  if (!set && !exists)
    rc = kiln_status_set(st, KILN_EUNAVAIL, "rendezvous",
                         "Redis at %.100s refused SET %.100s: "
                         "%.200s",
                         o->redis, o->key,
                         r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected reply");
  freeReplyObject(r);
  if (rc || set) return rc;
  /* another minter was first: its id is the mesh's */
  rc = get_id(c, o, id, st);
  if (rc == 1) return 0;
  if (rc == 0)
    rc = kiln_status_set(st, KILN_EUNAVAIL, "rendezvous",
                         "%.100s existed at SET NX and was gone at GET (expired?)", o->key);
  return rc;
}

int kiln_rendezvous_id(const kiln_rendezvous_options *o, uint8_t *id, kiln_status *st) {
  if (o == NULL || o->key == NULL || o->key[0] == '\0' || id == NULL || o->id_bytes == 0 ||
      o->id_bytes > KILN_RENDEZVOUS_ID_MAX || (o->rank == 0 && o->mint == NULL))
    return kiln_status_set(st, KILN_EINVAL, "rendezvous",
                           "a rendezvous needs a key, an id size of 1 to %d bytes and, for rank "
                           "0, a minter",
                           KILN_RENDEZVOUS_ID_MAX);
  double timeout = o->timeout_s > 0 ? o->timeout_s : 30;
  double poll = o->poll_s > 0 ? o->poll_s : 0.02;
  double t0 = now_s(), deadline = t0 + timeout;
  redisContext *c = NULL;
  int rc = connect_to(o->redis, timeout, &c, st);
  if (rc) return rc;
  if (o->rank == 0) {
    rc = publish(c, o, id, st);
    redisFree(c);
    return rc;
  }
  for (;;) {
    redisSetTimeout(c, tv_of(deadline - now_s()));
    rc = get_id(c, o, id, st);
    if (rc == 1) {
      rc = 0;
      break;
    }
    if (rc < 0) break;
    double left = deadline - now_s();
    if (left <= 0) {
      rc = kiln_status_set(st, KILN_EDEADLINE, "rendezvous",
                           "rank %u waited %.1f s for rank 0 to publish the id at %.100s in Redis "
                           "%.100s; none came",
                           o->rank, now_s() - t0, o->key, o->redis);
      break;
    }
    double s = poll < left ? poll : left;
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
  }
  redisFree(c);
  return rc;
}
