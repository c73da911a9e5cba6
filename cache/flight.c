/* get_or_build: one build per key at a time, in this process and across
 * servers sharing Redis.
 *
 * In this process a table of flights (one per key being built) sits under
 * the cache mutex. The first caller to miss registers a flight and builds;
 * later callers find the flight and sleep on its condition variable until
 * the builder hands the result over, or until their deadline, after which
 * they build themselves. The builder hands the bytes over directly (one
 * copy kept on the flight, freed by the last waiter), so waiters are served
 * even when the result is not stored: no memory tier, a build under
 * min_compile_ns, a store that failed. A failed build wakes the waiters
 * empty-handed; they race to register a new flight and one of them builds.
 *
 * Across servers the builder (only it: its own waiters ride on its flight)
 * first takes the Redis lock of the key (SET NX PX with a random token).
 * When another server holds it, the builder polls: the entry appearing in
 * Redis is the result; the lock vanishing without an entry means the
 * holder died or failed, so it tries to take the lock itself; a deadline
 * passed or a Redis fault means building here without the lock. A lock
 * never outlives lock_ttl_ms unless something is wrong (no expiry, a hung
 * holder, a hand-set key): without an expiry it is taken over at once, and
 * one still held lock_ttl_ms after the wait began is taken over then, so a
 * Compile without a deadline still never waits forever. A holder stores
 * before it unlocks, so after seeing the lock gone, and after taking it,
 * Redis is read once more before building.
 */
#include <errno.h>
#include <openssl/rand.h>
#include <string.h>
#include <time.h>

#include "cache/tiered.h"
#include "common/alloc.h"

struct kiln__flight {
  char key[KILN_CACHE_HEX_LEN + 1];
  kiln__flight *next;
  pthread_cond_t cv; /* CLOCK_MONOTONIC, to wait until a deadline */
  int refs;          /* waiters still holding the flight */
  bool done;         /* the builder finished; the flight left the table */
  int rc;            /* 0: meta/payload hold the result */
  kiln_cache_meta meta;
  uint8_t *payload; /* the waiters' copy; freed with the flight */
  size_t len;
};

/* ---- the flight table (c->mu held) ---------------------------------------- */

static kiln__flight *flight_find(kiln_cache *c, const char *hex) {
  for (kiln__flight *f = c->flights; f; f = f->next)
    if (strcmp(f->key, hex) == 0) return f;
  return NULL;
}

static kiln__flight *flight_add(kiln_cache *c, const char *hex) {
  kiln__flight *f = kiln_calloc(1, sizeof *f);
  if (f == NULL) return NULL;
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&f->cv, &attr);
  pthread_condattr_destroy(&attr);
  memcpy(f->key, hex, sizeof f->key);
  f->next = c->flights;
  c->flights = f;
  return f;
}

static void flight_unlink(kiln_cache *c, kiln__flight *f) {
  for (kiln__flight **p = &c->flights; *p; p = &(*p)->next) {
    if (*p == f) {
      *p = f->next;
      return;
    }
  }
}

static void flight_free(kiln__flight *f) {
  pthread_cond_destroy(&f->cv);
  kiln_free(f->payload);
  kiln_free(f);
}

/* The builder's last act: hand res (when rc is 0) to every waiter. */
static void flight_finish(kiln_cache *c, kiln__flight *f, int rc, const kiln_cache_result *res) {
  pthread_mutex_lock(&c->mu);
  flight_unlink(c, f); /* no new waiters from here on */
  int waiters = f->refs;
  pthread_mutex_unlock(&c->mu);
  uint8_t *copy = NULL;
  if (rc == 0 && waiters > 0) {
    /* Copied outside the lock: a payload may be megabytes. */
    copy = kiln_malloc(res->len ? res->len : 1);
    if (copy)
      memcpy(copy, res->payload, res->len);
    else
      rc = KILN_ENOMEM; /* the waiters build themselves */
  }
  pthread_mutex_lock(&c->mu);
  f->done = true;
  f->rc = rc;
  if (rc == 0) {
    f->meta = res->meta;
    f->payload = copy;
    f->len = res->len;
  }
  pthread_cond_broadcast(&f->cv);
  bool last = f->refs == 0;
  pthread_mutex_unlock(&c->mu);
  if (last) flight_free(f);
}

enum { WAIT_GOT, WAIT_RETRY, WAIT_TIMEOUT, WAIT_ENOMEM };

/* Waits on f (c->mu held, refs taken by the caller, dropped here). */
static int flight_wait(kiln_cache *c, kiln__flight *f, int64_t deadline_ns,
                       kiln_cache_result *res) {
  struct timespec abs = {.tv_sec = deadline_ns / 1000000000, .tv_nsec = deadline_ns % 1000000000};
  while (!f->done) {
    if (deadline_ns == 0) {
      pthread_cond_wait(&f->cv, &c->mu);
    } else if (pthread_cond_timedwait(&f->cv, &c->mu, &abs) == ETIMEDOUT) {
      break;
    }
  }
  int out = WAIT_TIMEOUT;
  if (f->done && f->rc == 0) {
    uint8_t *p = kiln_malloc(f->len ? f->len : 1);
    if (p) {
      memcpy(p, f->payload, f->len);
      res->source = KILN_CACHE_SRC_SINGLE_FLIGHT;
      res->meta = f->meta;
      res->payload = p;
      res->len = f->len;
      out = WAIT_GOT;
    } else {
      out = WAIT_ENOMEM;
    }
  } else if (f->done) {
    out = WAIT_RETRY;
  }
  f->refs--;
  if (f->done && f->refs == 0) flight_free(f);
  return out;
}

/* ---- building --------------------------------------------------------------- */

/* Runs build and fills res (source COMPILED) with the meta of key. */
static int run_build(kiln_cache *c, const kiln_cache_key *key, kiln_cache_build_fn build, void *ctx,
                     kiln_cache_result *res, kiln_status *st) {
  uint8_t *payload = NULL;
  size_t len = 0;
  uint32_t kind = 0;
  uint64_t peak = 0, ns = 0;
  int rc = build(ctx, &payload, &len, &kind, &peak, &ns, st);
  pthread_mutex_lock(&c->mu);
  c->builds++;
  pthread_mutex_unlock(&c->mu);
  if (rc != 0 || (payload == NULL && len > 0)) {
    kiln_free(payload);
    return kiln_status_set(st, rc < 0 ? rc : KILN_EINTERNAL, "cache build",
                           "the build of key %.16s... failed", key->hex);
  }
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  memset(res, 0, sizeof *res);
  memcpy(res->meta.key, key->digest, KILN_CACHE_DIGEST_LEN);
  memcpy(res->meta.parts, key->parts, sizeof res->meta.parts);
  res->meta.kind = kind;
  res->meta.compile_ns = ns;
  res->meta.peak_bytes = peak;
  res->meta.created_unix_ms = (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
  res->source = KILN_CACHE_SRC_COMPILED;
  res->payload = payload;
  res->len = len;
  return 0;
}

/* Stores a fresh build unless it was too fast to be worth it. */
static void keep(kiln_cache *c, const kiln_cache_result *res, bool refresh) {
  if (res->meta.compile_ns < c->min_compile_ns) {
    pthread_mutex_lock(&c->mu);
    c->skipped_fast++;
    pthread_mutex_unlock(&c->mu);
    if (refresh) {
      /* The caller asked for this build to replace the entry: drop the old one. */
      char hex[KILN_CACHE_HEX_LEN + 1];
      kiln_cache_to_hex(res->meta.key, KILN_CACHE_DIGEST_LEN, hex);
      kiln__cache_forget(c, hex);
    }
    return;
  }
  kiln__cache_store_all(c, &res->meta, res->payload, res->len);
}

static int build_and_keep(kiln_cache *c, const kiln_cache_key *key, bool store, bool refresh,
                          kiln_cache_build_fn build, void *ctx, kiln_cache_result *res,
                          kiln_status *st) {
  int rc = run_build(c, key, build, ctx, res, st);
  if (rc == 0 && store) keep(c, res, refresh);
  return rc;
}

/* ---- across servers ------------------------------------------------------------ */

enum { CROSS_BUILD, CROSS_GOT };

static void sleep_until(int64_t until_ns) {
  int64_t left = until_ns - kiln__cache_mono_ns();
  if (left <= 0) return;
  struct timespec ts = {.tv_sec = left / 1000000000, .tv_nsec = left % 1000000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void make_token(char out[33]) {
  uint8_t r[16];
  if (RAND_bytes(r, sizeof r) != 1) {
    int64_t t = kiln__cache_mono_ns();
    for (size_t i = 0; i < sizeof r; i++) r[i] = (uint8_t)((uint64_t)t >> (8 * (i % 8)) ^ i * 31);
  }
  kiln_cache_to_hex(r, sizeof r, out);
}

enum { POLL_GOT, POLL_FREE, POLL_TIMEOUT, POLL_FAULT };

/* Polls while another server holds the lock, until until_ns: POLL_GOT with
 * res filled, POLL_FREE when the lock vanished (worth another try),
 * POLL_TIMEOUT, or POLL_FAULT when Redis failed (build here now). */
static int poll_holder(kiln_cache *c, kiln_cache_store *r, const kiln_cache_key *key,
                       int64_t until_ns, kiln_cache_result *res) {
  for (;;) {
    int64_t wake = kiln__cache_mono_ns() + (int64_t)c->wait_poll_ms * 1000000;
    if (wake > until_ns) wake = until_ns;
    sleep_until(wake);
    int rc = kiln__cache_redis_fetch(c, key->digest, res);
    if (rc == 0) {
      res->source = KILN_CACHE_SRC_SINGLE_FLIGHT;
      return POLL_GOT;
    }
    if (rc != KILN_ENOTFOUND) return POLL_FAULT;
    if (kiln__cache_mono_ns() >= until_ns) return POLL_TIMEOUT;
    bool held = false;
    if (r->ops->locked(r, key->hex, &held, NULL) != 0) return POLL_FAULT;
    if (!held) return POLL_FREE;
  }
}

/* The waiting hook of this thread (cache.h). */
static _Thread_local kiln_cache_wait_fn wait_hook;
static _Thread_local void *wait_hook_arg;

void kiln_cache_set_wait_hook(kiln_cache_wait_fn fn, void *arg) {
  wait_hook = fn;
  wait_hook_arg = arg;
}

static void tell_wait(bool other_server) {
  if (wait_hook) wait_hook(wait_hook_arg, other_server);
}

/* Takes the lock under token, once it is ours look in Redis again: the
 * holder may have stored just before. */
static int take_and_fetch(kiln_cache *c, kiln_cache_store *r, const kiln_cache_key *key,
                          const char *token, bool waited, bool *locked, kiln_cache_result *res) {
  int rc = kiln__cache_redis_fetch(c, key->digest, res);
  if (rc == 0) {
    r->ops->unlock(r, key->hex, token, NULL);
    res->source = waited ? KILN_CACHE_SRC_SINGLE_FLIGHT : KILN_CACHE_SRC_REDIS;
    return CROSS_GOT;
  }
  *locked = true;
  return CROSS_BUILD;
}

/* The builder's Redis protocol: CROSS_GOT when another server's result was
 * found (res filled), else CROSS_BUILD with *locked when this call holds
 * the lock under token and must unlock after storing.
 *
 * Every wait here ends: at the caller's deadline (then build without the
 * lock, leaving the holder's), and in any case after lock_ttl_ms, the
 * longest a live holder keeps a lock: a lock still there then is held past
 * its expiry (a holder that hangs, a key set by hand with a long life) and
 * is taken over. A lock without an expiry is taken over at once by try_lock. */
static int cross_server(kiln_cache *c, const kiln_cache_key *key, int64_t deadline_ns,
                        const char *token, bool *locked, kiln_cache_result *res) {
  kiln_cache_store *r = c->tier[KILN_CACHE_TIER_REDIS];
  *locked = false;
  if (r == NULL || r->ops->try_lock == NULL || r->ops->unlock == NULL || r->ops->locked == NULL)
    return CROSS_BUILD;
  bool waited = false;
  int64_t stale_ns = 0; /* when a lock still held counts as held past its expiry */
  for (;;) {
    bool acquired = false;
    if (r->ops->try_lock(r, key->hex, token, c->lock_ttl_ms, &acquired, NULL) != 0)
      return CROSS_BUILD;
    if (acquired) return take_and_fetch(c, r, key, token, waited, locked, res);
    if (!waited) {
      waited = true;
      stale_ns = kiln__cache_mono_ns() + (int64_t)c->lock_ttl_ms * 1000000;
      pthread_mutex_lock(&c->mu);
      c->lock_waits++;
      pthread_mutex_unlock(&c->mu);
      tell_wait(true);
    }
    bool caller_first = deadline_ns != 0 && deadline_ns < stale_ns;
    int p = poll_holder(c, r, key, caller_first ? deadline_ns : stale_ns, res);
    if (p == POLL_GOT) return CROSS_GOT;
    if (p == POLL_FAULT || (p == POLL_TIMEOUT && caller_first)) return CROSS_BUILD;
    if (p == POLL_TIMEOUT) {
      if (r->ops->take_over == NULL ||
          r->ops->take_over(r, key->hex, token, c->lock_ttl_ms, NULL) != 0)
        return CROSS_BUILD;
      pthread_mutex_lock(&c->mu);
      c->lock_takeovers++;
      pthread_mutex_unlock(&c->mu);
      return take_and_fetch(c, r, key, token, waited, locked, res);
    }
    /* POLL_FREE: try again. */
  }
}

/* ---- the entry point ----------------------------------------------------------- */

/* The builder of flight f: builds (or finds the result after all), stores,
 * and hands over to f's waiters. */
static int lead(kiln_cache *c, kiln__flight *f, const kiln_cache_key *key, int64_t deadline_ns,
                kiln_cache_build_fn build, void *ctx, kiln_cache_result *res, kiln_status *st) {
  /* A build of this key may have finished between our miss and the flight. */
  if (kiln__cache_lookup(c, key->digest, KILN__TIERS_LOCAL, false, res) == 0) {
    res->source = KILN_CACHE_SRC_SINGLE_FLIGHT;
    flight_finish(c, f, 0, res);
    return 0;
  }
  char token[33];
  make_token(token);
  bool locked = false;
  if (cross_server(c, key, deadline_ns, token, &locked, res) == CROSS_GOT) {
    flight_finish(c, f, 0, res);
    return 0;
  }
  int rc = run_build(c, key, build, ctx, res, st);
  if (rc == 0) keep(c, res, false);
  if (locked) {
    kiln_cache_store *r = c->tier[KILN_CACHE_TIER_REDIS];
    r->ops->unlock(r, key->hex, token, NULL);
  }
  flight_finish(c, f, rc, res);
  if (rc != 0) memset(res, 0, sizeof *res);
  return rc;
}

int kiln_cache_get_or_build(kiln_cache *c, const kiln_cache_key *key, kiln_cache_policy policy,
                            int64_t deadline_ns, kiln_cache_build_fn build, void *ctx,
                            kiln_cache_result *res, kiln_status *st) {
  memset(res, 0, sizeof *res);
  if (build == NULL)
    return kiln_status_set(st, KILN_EINVAL, "cache", "get_or_build without a build function");
  /* The hex the stores see is derived from the digest, whatever key->hex says. */
  kiln_cache_key k = *key;
  kiln_cache_to_hex(k.digest, KILN_CACHE_DIGEST_LEN, k.hex);
  if (policy == KILN_CACHE_POLICY_BYPASS)
    return build_and_keep(c, &k, false, false, build, ctx, res, st);
  if (policy == KILN_CACHE_POLICY_REFRESH)
    return build_and_keep(c, &k, true, true, build, ctx, res, st);
  if (policy == KILN_CACHE_POLICY_LOCAL) {
    /* No flight and no Redis lock: nothing of it is shared. */
    if (kiln__cache_lookup(c, k.digest, KILN__TIERS_LOCAL, true, res) == 0) return 0;
    int rc = run_build(c, &k, build, ctx, res, st);
    if (rc == 0 && res->meta.compile_ns >= c->min_compile_ns)
      kiln__cache_store_local(c, &res->meta, res->payload, res->len);
    return rc;
  }
  if (kiln__cache_lookup(c, k.digest, KILN__TIERS_ALL, true, res) == 0) return 0;
  bool counted = false;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    kiln__flight *f = flight_find(c, k.hex);
    if (f == NULL) {
      f = flight_add(c, k.hex);
      pthread_mutex_unlock(&c->mu);
      if (f == NULL) return build_and_keep(c, &k, true, false, build, ctx, res, st);
      return lead(c, f, &k, deadline_ns, build, ctx, res, st);
    }
    if (!counted) {
      counted = true;
      c->single_flight_waits++;
      tell_wait(false);
    }
    f->refs++;
    int w = flight_wait(c, f, deadline_ns, res);
    pthread_mutex_unlock(&c->mu);
    if (w == WAIT_GOT) return 0;
    if (w == WAIT_ENOMEM)
      return kiln_status_set(st, KILN_ENOMEM, "cache", "copying a result of %.16s...", k.hex);
    if (w == WAIT_TIMEOUT) return build_and_keep(c, &k, true, false, build, ctx, res, st);
    /* WAIT_RETRY: that build failed; take over or wait for whoever did. */
  }
}
