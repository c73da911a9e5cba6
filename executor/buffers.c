/* The buffer store: handle table, per-client accounting and quotas.
 *
 * Two chained hash tables under one mutex: handles -> entries (keyed by the
 * handle's 16 random bytes, so the first 8 of them are already a uniform
 * hash) and client names -> client records (a seeded FNV-1a, so a client
 * cannot aim its names at one chain). A client record exists while it is
 * charged anything or owns an entry, and is freed when both drop to zero:
 * a stream of clients with ever-new names leaves nothing behind.
 *
 * Invariant: client->charged == reserved bytes + the bytes of every entry of
 * that client not yet freed (in the table or only held by references).
 */
#include "executor/buffers.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "compiler/ir/ir.h"
#include "executor/backend.h"

typedef struct client {
  char *name;
  uint64_t charged;  /* see the invariant above */
  uint32_t nbufs;    /* entries in the table */
  uint32_t nentries; /* entries not yet freed */
  int64_t seen_ns;   /* monotonic time of the client's last use of the store or touch */
  struct client *next;
} client;

typedef struct entry {
  kiln_stored pub;  /* first: a kiln_stored * is an entry * */
  kiln_shape shape; /* pub.shape points here; dims and layout in one block */
  void *shape_mem;
  uint8_t key[16];
  client *owner;
  uint32_t refs;
  bool in_table;
  struct entry *next;
} entry;

struct kiln_buffer_store {
  pthread_mutex_t mu;
  kiln_buffer_store_options o;
  entry **ebuckets; /* power of two */
  size_t nebuckets, nentries_table;
  client **cbuckets; /* power of two */
  size_t ncbuckets, nclients;
  uint64_t total_charged;
  uint64_t seed;
  kiln_quota_table *quotas; /* per-client overrides of o's quotas, or NULL */
};

/* ---- random handles ----------------------------------------------------------------- */

static int random_bytes(uint8_t *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(buf + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return KILN_EIO;
    got += (size_t)r;
  }
  return 0;
}

static void to_hex(const uint8_t *b, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * n] = '\0';
}

int kiln_random_hex128(char out[KILN_HANDLE_HEX_LEN + 1]) {
  uint8_t b[16];
  int rc = random_bytes(b, sizeof b);
  if (rc) return rc;
  to_hex(b, sizeof b, out);
  return 0;
}

/* Strictly 32 lowercase hex digits, as the store writes them. */
static bool parse_handle(const char *h, uint8_t key[16]) {
  if (h == NULL || strlen(h) != KILN_HANDLE_HEX_LEN) return false;
  for (int i = 0; i < KILN_HANDLE_HEX_LEN; i++) {
    char c = h[i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return false;
    if (i % 2 == 0)
      key[i / 2] = (uint8_t)(v << 4);
    else
      key[i / 2] |= (uint8_t)v;
  }
  return true;
}

static uint64_t key_hash(const uint8_t key[16]) {
  uint64_t h;
  memcpy(&h, key, sizeof h);
  return h;
}

static uint64_t name_hash(const kiln_buffer_store *s, const char *name) {
  uint64_t h = 1469598103934665603ull ^ s->seed;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 1099511628211ull;
  }
  return h ^ (h >> 29);
}

/* ---- tables ------------------------------------------------------------------------ */

/* Doubles a chained table when it holds more entries than buckets. On
 * out-of-memory the table simply stays as it is (longer chains). */
#define GROW_TABLE(T, buckets, nbuckets, count, hashexpr) \
  do { \
    if ((count) < (nbuckets)) break; \
    size_t nn = (nbuckets)*2; \
    T **nb = kiln_calloc(nn, sizeof *nb); \
    if (nb == NULL) break; \
    for (size_t i = 0; i < (nbuckets); i++) { \
      T *it = (buckets)[i]; \
      while (it) { \
        T *next = it->next; \
        size_t b = (size_t)(hashexpr) & (nn - 1); \
        it->next = nb[b]; \
        nb[b] = it; \
        it = next; \
      } \
    } \
    kiln_free(buckets); \
    (buckets) = nb; \
    (nbuckets) = nn; \
  } while (0)

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static client *client_find(kiln_buffer_store *s, const char *name) {
  client *c = s->cbuckets[name_hash(s, name) & (s->ncbuckets - 1)];
  while (c && strcmp(c->name, name) != 0) c = c->next;
  return c;
}

static client *client_get(kiln_buffer_store *s, const char *name) {
  client *c = client_find(s, name);
  if (c) {
    c->seen_ns = now_ns();
    return c;
  }
  c = kiln_calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->seen_ns = now_ns();
  c->name = kiln_strdup(name);
  if (c->name == NULL) {
    kiln_free(c);
    return NULL;
  }
  GROW_TABLE(client, s->cbuckets, s->ncbuckets, s->nclients, name_hash(s, it->name));
  size_t b = name_hash(s, name) & (s->ncbuckets - 1);
  c->next = s->cbuckets[b];
  s->cbuckets[b] = c;
  s->nclients++;
  return c;
}

/* Frees the record once nothing is charged to it and it owns nothing. */
static void client_maybe_free(kiln_buffer_store *s, client *c) {
  if (c->charged != 0 || c->nentries != 0) return;
  client **pp = &s->cbuckets[name_hash(s, c->name) & (s->ncbuckets - 1)];
  while (*pp != c) pp = &(*pp)->next;
  *pp = c->next;
  s->nclients--;
  kiln_free(c->name);
  kiln_free(c);
}

static entry *entry_find(kiln_buffer_store *s, const uint8_t key[16], entry ***where) {
  entry **pp = &s->ebuckets[key_hash(key) & (s->nebuckets - 1)];
  while (*pp && memcmp((*pp)->key, key, 16) != 0) pp = &(*pp)->next;
  if (where) *where = pp;
  return *pp;
}

static void entry_unlink(kiln_buffer_store *s, entry **pp) {
  entry *e = *pp;
  *pp = e->next;
  e->next = NULL;
  e->in_table = false;
  e->owner->nbufs--;
  s->nentries_table--;
}

/* ---- quota ------------------------------------------------------------------------- */

/* The client's memory quota and buffer limit: its own, else the store's. */
static uint64_t quota_bytes(const kiln_buffer_store *s, const client *c) {
  const kiln_client_quota *q = kiln_quota_table_find(s->quotas, c->name);
  return q && q->memory_bytes ? q->memory_bytes : s->o.client_quota_bytes;
}

static uint32_t max_buffers(const kiln_buffer_store *s, const client *c) {
  const kiln_client_quota *q = kiln_quota_table_find(s->quotas, c->name);
  return q && q->buffers ? q->buffers : s->o.max_buffers_per_client;
}

static int charge(kiln_buffer_store *s, client *c, uint64_t bytes, kiln_status *st) {
  const kiln_buffer_store_options *o = &s->o;
  uint64_t quota = quota_bytes(s, c);
  if (quota && (bytes > quota || c->charged > quota - bytes))
    return kiln_status_set(st, KILN_ELIMIT, "buffers",
                           "client memory quota exceeded: %llu bytes in use, %llu more "
                           "requested, quota %llu",
                           (unsigned long long)c->charged, (unsigned long long)bytes,
                           (unsigned long long)quota);
  if (o->total_quota_bytes &&
      (bytes > o->total_quota_bytes || s->total_charged > o->total_quota_bytes - bytes))
    return kiln_status_set(st, KILN_ELIMIT, "buffers",
                           "server buffer memory exhausted: %llu bytes in use, %llu more "
                           "requested, limit %llu",
                           (unsigned long long)s->total_charged, (unsigned long long)bytes,
                           (unsigned long long)o->total_quota_bytes);
  c->charged += bytes;
  s->total_charged += bytes;
  return 0;
}

static void uncharge(kiln_buffer_store *s, client *c, uint64_t bytes) {
  c->charged -= bytes < c->charged ? bytes : c->charged;
  s->total_charged -= bytes < s->total_charged ? bytes : s->total_charged;
}

/* ---- the store --------------------------------------------------------------------- */

int kiln_buffer_store_create(const kiln_buffer_store_options *o, kiln_buffer_store **out,
                             kiln_status *st) {
  *out = NULL;
  kiln_buffer_store *s = kiln_calloc(1, sizeof *s);
  if (s == NULL) goto out_nomem;
  if (o) s->o = *o;
  s->nebuckets = 64;
  s->ncbuckets = 16;
  s->ebuckets = kiln_calloc(s->nebuckets, sizeof *s->ebuckets);
  s->cbuckets = kiln_calloc(s->ncbuckets, sizeof *s->cbuckets);
  if (s->ebuckets == NULL || s->cbuckets == NULL) goto out_free;
  if (random_bytes((uint8_t *)&s->seed, sizeof s->seed)) s->seed = (uint64_t)(uintptr_t)s;
  pthread_mutex_init(&s->mu, NULL);
  *out = s;
  return 0;
out_free:
  kiln_free(s->ebuckets);
  kiln_free(s->cbuckets);
  kiln_free(s);
out_nomem:
  return kiln_status_set(st, KILN_ENOMEM, "buffers", "out of memory creating the buffer store");
}

static void entry_free(entry *e) {
  kiln_buffer_free(e->pub.buf);
  kiln_free(e->shape_mem);
  kiln_free(e->pub.label);
  kiln_free(e);
}

void kiln_buffer_store_destroy(kiln_buffer_store *s) {
  if (s == NULL) return;
  for (size_t i = 0; i < s->nebuckets; i++)
    for (entry *e = s->ebuckets[i], *next; e; e = next) {
      next = e->next;
      entry_free(e);
    }
  for (size_t i = 0; i < s->ncbuckets; i++)
    for (client *c = s->cbuckets[i], *next; c; c = next) {
      next = c->next;
      kiln_free(c->name);
      kiln_free(c);
    }
  kiln_free(s->ebuckets);
  kiln_free(s->cbuckets);
  kiln_quota_table_free(s->quotas);
  pthread_mutex_destroy(&s->mu);
  kiln_free(s);
}

int kiln_buffer_store_set_quotas(kiln_buffer_store *s, const kiln_client_quota *q, size_t n,
                                 kiln_status *st) {
  kiln_quota_table *t;
  int rc = kiln_quota_table_make(q, n, &t, st);
  if (rc) return rc;
  pthread_mutex_lock(&s->mu);
  kiln_quota_table *old = s->quotas;
  s->quotas = t;
  pthread_mutex_unlock(&s->mu);
  kiln_quota_table_free(old);
  return 0;
}

int kiln_buffer_store_reserve(kiln_buffer_store *s, const char *client_name, uint64_t bytes,
                              kiln_status *st) {
  pthread_mutex_lock(&s->mu);
  int rc;
  client *c = client_get(s, client_name);
  if (c == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, "buffers", "out of memory");
  } else {
    rc = charge(s, c, bytes, st);
    client_maybe_free(s, c);
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static void unreserve_locked(kiln_buffer_store *s, const char *client_name, uint64_t bytes) {
  client *c = client_find(s, client_name);
  if (c) {
    uncharge(s, c, bytes);
    client_maybe_free(s, c);
  }
}

void kiln_buffer_store_unreserve(kiln_buffer_store *s, const char *client_name, uint64_t bytes) {
  pthread_mutex_lock(&s->mu);
  unreserve_locked(s, client_name, bytes);
  pthread_mutex_unlock(&s->mu);
}

/* Copies array shape src into e->shape: dims, dynamic flags and layout in
 * one allocation (an arena per entry would cost a block per buffer). */
static bool entry_shape(entry *e, const kiln_shape *src) {
  uint32_t r = src->rank;
  const kiln_layout *lo = src->layout;
  size_t tail = lo && lo->tail ? strlen(lo->tail) + 1 : 0;
  size_t lr = lo ? lo->rank : 0;
  size_t n = (size_t)r * sizeof(int64_t) + (lo ? sizeof(kiln_layout) + lr * sizeof(int64_t) : 0) +
             r + tail + 1;
  char *m = kiln_malloc(n);
  if (m == NULL) return false;
  e->shape_mem = m;
  e->shape = (kiln_shape){.dtype = src->dtype, .rank = r};
  e->shape.layout = lo ? (kiln_layout *)m : NULL;
  if (lo) {
    *e->shape.layout = *lo;
    m += sizeof(kiln_layout);
  }
  e->shape.dims = (int64_t *)m;
  if (r) memcpy(m, src->dims, r * sizeof(int64_t));
  m += r * sizeof(int64_t);
  if (lo) {
    e->shape.layout->minor_to_major = (int64_t *)m;
    if (lr) memcpy(m, lo->minor_to_major, lr * sizeof(int64_t));
    m += lr * sizeof(int64_t);
  }
  if (src->dynamic) {
    e->shape.dynamic = (uint8_t *)m;
    memcpy(m, src->dynamic, r);
  }
  m += r;
  if (tail) {
    memcpy(m, lo->tail, tail);
    e->shape.layout->tail = m;
  }
  e->pub.shape = &e->shape;
  return true;
}

static entry *entry_new(kiln_buffer *buf, const kiln_shape *shape, int32_t device,
                        const char *label) {
  entry *e = kiln_calloc(1, sizeof *e);
  if (e == NULL) return NULL;
  e->pub.label = kiln_strdup(label ? label : "");
  if (e->pub.label == NULL || !entry_shape(e, shape) || random_bytes(e->key, sizeof e->key) != 0) {
    kiln_free(e->pub.label);
    kiln_free(e->shape_mem);
    kiln_free(e);
    return NULL;
  }
  to_hex(e->key, sizeof e->key, e->pub.handle);
  e->pub.buf = buf;
  e->pub.bytes = kiln_buffer_size(buf);
  e->pub.device = device;
  return e;
}

/* Under the lock: charges (unless reserved) and links e into the table. */
static int insert_locked(kiln_buffer_store *s, const char *client_name, entry *e, bool reserved,
                         kiln_status *st) {
  client *c = client_get(s, client_name);
  if (c == NULL) return kiln_status_set(st, KILN_ENOMEM, "buffers", "out of memory");
  int rc = 0;
  uint32_t limit = max_buffers(s, c);
  if (limit && c->nbufs >= limit)
    rc = kiln_status_set(st, KILN_ELIMIT, "buffers", "client already holds %u buffers (the limit)",
                         c->nbufs);
  else if (!reserved)
    rc = charge(s, c, e->pub.bytes, st);
  if (rc) {
    client_maybe_free(s, c);
    return rc;
  }
  /* 128 random bits do not collide in practice; a repeat would be a broken
   * random source, which must not silently alias two buffers. */
  if (entry_find(s, e->key, NULL) != NULL) {
    if (!reserved) uncharge(s, c, e->pub.bytes);
    client_maybe_free(s, c);
    return kiln_status_set(st, KILN_EINTERNAL, "buffers", "random source repeated a handle");
  }
  GROW_TABLE(entry, s->ebuckets, s->nebuckets, s->nentries_table, key_hash(it->key));
  size_t b = key_hash(e->key) & (s->nebuckets - 1);
  e->next = s->ebuckets[b];
  s->ebuckets[b] = e;
  e->owner = c;
  e->in_table = true;
  e->refs = 1;
  c->nbufs++;
  c->nentries++;
  s->nentries_table++;
  return 0;
}

int kiln_buffer_store_add(kiln_buffer_store *s, const char *client_name, kiln_buffer *buf,
                          const kiln_shape *shape, int32_t device, const char *label, bool reserved,
                          kiln_stored **out, kiln_status *st) {
  if (out) *out = NULL;
  int rc = 0;
  entry *e = NULL;
  uint64_t size = kiln_buffer_size(buf);
  if (buf == NULL || shape == NULL || !kiln_shape_is_array(shape))
    rc = kiln_status_set(st, KILN_EINVAL, "buffers", "only arrays can be stored");
  else if (kiln_shape_bytes(shape) < 0 || (uint64_t)kiln_shape_bytes(shape) != size)
    rc = kiln_status_set(st, KILN_EINVAL, "buffers",
                         "a buffer of %llu bytes cannot hold an array of %lld bytes",
                         (unsigned long long)size, (long long)kiln_shape_bytes(shape));
  else if ((e = entry_new(buf, shape, device, label)) == NULL)
    rc = kiln_status_set(st, KILN_ENOMEM, "buffers", "out of memory storing a buffer");
  if (rc) {
    if (reserved && buf) kiln_buffer_store_unreserve(s, client_name, size);
    kiln_buffer_free(buf);
    return rc;
  }
  pthread_mutex_lock(&s->mu);
  rc = insert_locked(s, client_name, e, reserved, st);
  if (rc == 0 && out) {
    e->refs++;
    *out = &e->pub;
  }
  if (rc && reserved) unreserve_locked(s, client_name, e->pub.bytes);
  pthread_mutex_unlock(&s->mu);
  if (rc) entry_free(e);
  return rc;
}

int kiln_stored_view(const kiln_stored *b, kiln_literal *view, kiln_status *st) {
  memset(view, 0, sizeof *view);
  void *host = kiln_buffer_host(b->buf, false);
  if (host == NULL)
    return kiln_status_set(st, KILN_EUNIMPL, "buffers", "buffer '%.8s...' is not in host memory",
                           b->handle);
  if (!kiln_shape_is_row_major(b->shape))
    return kiln_status_set(st, KILN_EUNIMPL, "buffers",
                           "buffer '%.8s...' is not laid out row-major", b->handle);
  view->shape = *b->shape;
  view->data = host;
  view->nbytes = (size_t)b->bytes;
  return 0;
}

static int not_found(kiln_status *st, const char *handle) {
  return kiln_status_set(st, KILN_ENOTFOUND, "buffers", "unknown buffer handle '%.64s'",
                         handle ? handle : "");
}

/* Under the lock: the entry of `handle` if `client_name` owns it. */
static entry *lookup_owned(kiln_buffer_store *s, const char *client_name, const char *handle,
                           entry ***where) {
  uint8_t key[16];
  if (!parse_handle(handle, key)) return NULL;
  entry *e = entry_find(s, key, where);
  if (e == NULL || strcmp(e->owner->name, client_name) != 0) return NULL;
  e->owner->seen_ns = now_ns();
  return e;
}

int kiln_buffer_store_acquire(kiln_buffer_store *s, const char *client_name, const char *handle,
                              bool take, kiln_stored **out, kiln_status *st) {
  *out = NULL;
  pthread_mutex_lock(&s->mu);
  entry **pp;
  entry *e = lookup_owned(s, client_name, handle, &pp);
  if (e) {
    e->refs++;
    if (take) {
      entry_unlink(s, pp);
      e->refs--; /* the table's reference passes to the caller */
    }
    *out = &e->pub;
  }
  pthread_mutex_unlock(&s->mu);
  return e ? 0 : not_found(st, handle);
}

/* Under the lock: drops one reference; the last frees the entry's charge
 * and returns the entry for the caller to free outside the lock. */
static entry *unref_locked(kiln_buffer_store *s, entry *e) {
  if (--e->refs > 0) return NULL;
  client *c = e->owner;
  uncharge(s, c, e->pub.bytes);
  c->nentries--;
  client_maybe_free(s, c);
  return e;
}

void kiln_buffer_store_unref(kiln_buffer_store *s, kiln_stored *b) {
  if (b == NULL) return;
  pthread_mutex_lock(&s->mu);
  entry *dead = unref_locked(s, (entry *)b);
  pthread_mutex_unlock(&s->mu);
  if (dead) entry_free(dead);
}

int kiln_buffer_store_release(kiln_buffer_store *s, const char *client_name, const char *handle,
                              uint64_t *bytes) {
  if (bytes) *bytes = 0;
  pthread_mutex_lock(&s->mu);
  entry **pp;
  entry *e = lookup_owned(s, client_name, handle, &pp);
  entry *dead = NULL;
  if (e) {
    if (bytes) *bytes = e->pub.bytes;
    entry_unlink(s, pp);
    dead = unref_locked(s, e);
  }
  pthread_mutex_unlock(&s->mu);
  if (dead) entry_free(dead);
  return e ? 0 : KILN_ENOTFOUND;
}

void kiln_buffer_store_touch(kiln_buffer_store *s, const char *client_name) {
  pthread_mutex_lock(&s->mu);
  client *c = client_find(s, client_name);
  if (c) c->seen_ns = now_ns();
  pthread_mutex_unlock(&s->mu);
}

/* Under the lock: unlinks every table entry of a client idle since before
 * `cutoff`; the entries no one else holds go on *dead for freeing outside. */
static uint64_t expire_locked(kiln_buffer_store *s, int64_t cutoff, entry **dead, uint64_t *bytes) {
  uint64_t n = 0;
  for (size_t i = 0; i < s->nebuckets; i++) {
    entry **pp = &s->ebuckets[i];
    while (*pp) {
      entry *e = *pp;
      if (e->owner->seen_ns >= cutoff) {
        pp = &e->next;
        continue;
      }
      n++;
      *bytes += e->pub.bytes;
      entry_unlink(s, pp); /* *pp is now the next entry */
      if (unref_locked(s, e)) {
        e->next = *dead;
        *dead = e;
      }
    }
  }
  return n;
}

uint64_t kiln_buffer_store_expire(kiln_buffer_store *s, int64_t idle_ns, uint64_t *bytes) {
  uint64_t freed = 0, n = 0;
  entry *dead = NULL;
  pthread_mutex_lock(&s->mu);
  int64_t cutoff = now_ns() - idle_ns;
  bool any = false;
  for (size_t i = 0; i < s->ncbuckets && !any; i++)
    for (client *c = s->cbuckets[i]; c && !any; c = c->next)
      any = c->nbufs > 0 && c->seen_ns < cutoff;
  if (any) n = expire_locked(s, cutoff, &dead, &freed);
  pthread_mutex_unlock(&s->mu);
  while (dead) {
    entry *next = dead->next;
    entry_free(dead);
    dead = next;
  }
  if (bytes) *bytes = freed;
  return n;
}

uint64_t kiln_buffer_store_client_bytes(kiln_buffer_store *s, const char *client_name) {
  pthread_mutex_lock(&s->mu);
  client *c = client_find(s, client_name);
  uint64_t n = c ? c->charged : 0;
  pthread_mutex_unlock(&s->mu);
  return n;
}

void kiln_buffer_store_get_totals(kiln_buffer_store *s, kiln_buffer_store_totals *out) {
  pthread_mutex_lock(&s->mu);
  out->live_buffers = s->nentries_table;
  out->live_bytes = s->total_charged;
  out->clients = s->nclients;
  pthread_mutex_unlock(&s->mu);
}

/* dst (row-major) from src (laid out by shape's minor_to_major): walks the
 * logical order, keeping the physical offset with an odometer. */
static void to_row_major(char *dst, const char *src, const kiln_shape *shape) {
  uint32_t rank = shape->rank;
  size_t esize = kiln_dtype_size(shape->dtype);
  int64_t n = kiln_shape_elements(shape);
  if (n <= 0 || rank == 0 || rank > 64) {
    if (n > 0) memcpy(dst, src, (size_t)n * esize);
    return;
  }
  int64_t m2m[64], stride[64], idx[64] = {0};
  kiln_shape_minor_to_major(shape, m2m);
  int64_t acc = 1;
  for (uint32_t i = 0; i < rank; i++) {
    stride[m2m[i]] = acc;
    acc *= shape->dims[m2m[i]];
  }
  int64_t phys = 0;
  for (int64_t lin = 0; lin < n; lin++) {
    memcpy(dst + (size_t)lin * esize, src + (size_t)phys * esize, esize);
    for (uint32_t k = rank; k-- > 0;) {
      phys += stride[k];
      if (++idx[k] < shape->dims[k]) break;
      phys -= stride[k] * idx[k];
      idx[k] = 0;
    }
  }
}

int kiln_array_read_row_major(const kiln_buffer *buf, const kiln_shape *shape, void *dst,
                              kiln_status *st) {
  int64_t bytes = kiln_shape_bytes(shape);
  if (bytes < 0 || (uint64_t)bytes != kiln_buffer_size(buf))
    return kiln_status_set(st, KILN_EINVAL, "buffers",
                           "a buffer of %zu bytes does not hold an array of %lld bytes",
                           kiln_buffer_size(buf), (long long)bytes);
  if (kiln_shape_is_row_major(shape)) return kiln_buffer_read(buf, 0, dst, (size_t)bytes, st);
  char *tmp = kiln_malloc(bytes ? (size_t)bytes : 1);
  if (tmp == NULL) return kiln_status_set(st, KILN_ENOMEM, "buffers", "out of memory");
  int rc = kiln_buffer_read(buf, 0, tmp, (size_t)bytes, st);
  if (rc == 0) to_row_major(dst, tmp, shape);
  kiln_free(tmp);
  return rc;
}
