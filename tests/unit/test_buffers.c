/* Unit tests for the server's buffer store: random hex handles, ownership
 * (a foreign handle is exactly as unknown as a made-up one), references that
 * outlive release, take-on-acquire for donation, per-client and total quotas
 * with reservations, per-client handle limits, client records that go
 * away with their last byte, and the stored arrays themselves: device
 * buffers with their shape and layout, viewed as literals in place. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "compiler/ir/ir.h"
#include "executor/backend.h"
#include "executor/buffers.h"

static kiln_status st;
static kiln_backend *cpu; /* device memory for the stored arrays, one per test process */

/* Made before each test and destroyed after it (a checked fixture, in the
 * test's own process), never lazily: test_threads allocates from four
 * threads at once. */
static void make_backend(void) {
  ck_assert_int_eq(
      kiln_backend_create("cpu", &(kiln_backend_options){.ndevices = 2, .threads_per_device = 1},
                          &cpu, NULL),
      0);
}

static void destroy_backend(void) {
  kiln_backend_destroy(cpu);
  cpu = NULL;
}

static kiln_device *device(void) { return kiln_backend_device(cpu, 0); }

/* A cpu device buffer holding f32[n], every element v. */
static kiln_buffer *f32buf(int64_t n, float v) {
  kiln_buffer *b = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(device(), (size_t)n * 4, &b, NULL), 0);
  float *h = kiln_buffer_host(b, true);
  for (int64_t i = 0; i < n; i++) h[i] = v;
  return b;
}

static const kiln_shape *f32shape(int64_t n) {
  static int64_t dims[64];
  static kiln_shape s[64];
  static int k;
  k = (k + 1) % 64;
  dims[k] = n;
  s[k] = (kiln_shape){.dtype = KILN_F32, .rank = 1, .dims = &dims[k]};
  return &s[k];
}

/* The buffer and shape arguments of kiln_buffer_store_add for f32[n] = v. */
#define f32s(n, v) f32buf((n), (v)), f32shape(n)

static float first(const kiln_stored *b, int64_t i) {
  return ((const float *)kiln_buffer_host(b->buf, false))[i];
}

static kiln_buffer_store *store(uint64_t client_quota, uint64_t total, uint32_t maxbufs) {
  kiln_buffer_store_options o = {.client_quota_bytes = client_quota,
                                 .total_quota_bytes = total,
                                 .max_buffers_per_client = maxbufs};
  kiln_buffer_store *s = NULL;
  ck_assert_int_eq(kiln_buffer_store_create(&o, &s, NULL), 0);
  return s;
}

static bool is_hex32(const char *h) {
  if (strlen(h) != 32) return false;
  for (int i = 0; i < 32; i++)
    if (!((h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f'))) return false;
  return true;
}

START_TEST(test_handles_are_random_hex) {
  char a[33], b[33];
  ck_assert_int_eq(kiln_random_hex128(a), 0);
  ck_assert_int_eq(kiln_random_hex128(b), 0);
  ck_assert(is_hex32(a) && is_hex32(b));
  ck_assert_str_ne(a, b);
  kiln_buffer_store *s = store(0, 0, 0);
  kiln_stored *x = NULL, *y = NULL;
  ck_assert_int_eq(kiln_buffer_store_add(s, "alice", f32s(4, 1), 0, "w", false, &x, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_add(s, "alice", f32s(4, 2), 1, NULL, false, &y, &st), 0);
  ck_assert(is_hex32(x->handle));
  ck_assert_str_ne(x->handle, y->handle);
  ck_assert_str_eq(x->label, "w");
  ck_assert_str_eq(y->label, "");
  ck_assert_int_eq(y->device, 1);
  ck_assert_uint_eq(x->bytes, 16);
  kiln_buffer_store_unref(s, x);
  kiln_buffer_store_unref(s, y);
  kiln_buffer_store_destroy(s); /* frees what is still stored */
}
END_TEST

START_TEST(test_foreign_and_unknown_handles) {
  kiln_buffer_store *s = store(0, 0, 0);
  kiln_stored *x = NULL, *got = NULL;
  ck_assert_int_eq(kiln_buffer_store_add(s, "alice", f32s(2, 3), 0, NULL, false, &x, &st), 0);
  char h[33];
  strcpy(h, x->handle);
  kiln_buffer_store_unref(s, x);

  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_store_acquire(s, "bob", h, false, &got, &st), KILN_ENOTFOUND);
  ck_assert_ptr_null(got);
  char want[128];
  snprintf(want, sizeof want, "unknown buffer handle '%s'", h);
  ck_assert_str_eq(st.msg, want);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_store_acquire(s, "alice", "not-a-handle", false, &got, &st),
                   KILN_ENOTFOUND);
  ck_assert_str_eq(st.msg, "unknown buffer handle 'not-a-handle'");
  char upper[33];
  for (int i = 0; i < 33; i++) upper[i] = (char)(h[i] >= 'a' && h[i] <= 'f' ? h[i] - 32 : h[i]);
  ck_assert_int_eq(kiln_buffer_store_acquire(s, "alice", upper, false, &got, NULL),
                   strcmp(upper, h) == 0 ? 0 : KILN_ENOTFOUND);
  kiln_buffer_store_unref(s, got);
  got = NULL;
  ck_assert_int_eq(kiln_buffer_store_release(s, "bob", h, NULL), KILN_ENOTFOUND);
  ck_assert_int_eq(kiln_buffer_store_acquire(s, "alice", h, false, &got, &st), 0);
  ck_assert_float_eq(first(got, 1), 3.0f);
  kiln_buffer_store_unref(s, got);
  kiln_buffer_store_destroy(s);
}
END_TEST

START_TEST(test_release_while_held) {
  kiln_buffer_store *s = store(0, 0, 0);
  kiln_stored *x = NULL, *held = NULL;
  ck_assert_int_eq(kiln_buffer_store_add(s, "c", f32s(256, 7), 0, NULL, false, &x, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_acquire(s, "c", x->handle, false, &held, &st), 0);
  kiln_buffer_store_unref(s, x);
  uint64_t bytes = 0;
  ck_assert_int_eq(kiln_buffer_store_release(s, "c", held->handle, &bytes), 0);
  ck_assert_uint_eq(bytes, 1024);
  kiln_buffer_store_totals t;
  kiln_buffer_store_get_totals(s, &t);
  ck_assert_uint_eq(t.live_buffers, 0);
  ck_assert_uint_eq(t.live_bytes, 1024); /* still held: still charged */
  ck_assert_uint_eq(kiln_buffer_store_client_bytes(s, "c"), 1024);
  ck_assert_float_eq(first(held, 255), 7.0f);
  ck_assert_int_eq(kiln_buffer_store_release(s, "c", held->handle, NULL), KILN_ENOTFOUND);
  kiln_buffer_store_unref(s, held);
  kiln_buffer_store_get_totals(s, &t);
  ck_assert_uint_eq(t.live_bytes, 0);
  ck_assert_uint_eq(t.clients, 0);
  kiln_buffer_store_destroy(s);
}
END_TEST

static void sleep_ms(long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A client idle past the lease loses its handles; one that used the store
 * or touched its lease keeps them; a reference held across the expiry
 * keeps the array (and its charge) until it is returned. */
START_TEST(test_lease_expiry) {
  kiln_buffer_store *s = store(0, 0, 0);
  kiln_stored *a1 = NULL, *b1 = NULL, *held = NULL;
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32s(4, 1), 0, NULL, false, &a1, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32s(8, 2), 0, NULL, false, NULL, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_add(s, "b", f32s(4, 3), 0, NULL, false, &b1, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_acquire(s, "a", a1->handle, false, &held, &st), 0);
  kiln_buffer_store_unref(s, a1);
  uint64_t bytes = 99;
  ck_assert_uint_eq(kiln_buffer_store_expire(s, INT64_C(10000000000), &bytes), 0);
  ck_assert_uint_eq(bytes, 0);
  sleep_ms(60);
  kiln_buffer_store_touch(s, "b");
  kiln_buffer_store_touch(s, "nobody"); /* makes no record */
  ck_assert_uint_eq(kiln_buffer_store_expire(s, INT64_C(30000000), &bytes), 2);
  ck_assert_uint_eq(bytes, 48);
  kiln_buffer_store_totals t;
  kiln_buffer_store_get_totals(s, &t);
  ck_assert_uint_eq(t.live_buffers, 1);
  ck_assert_uint_eq(t.clients, 2); /* a still holds the acquired one */
  ck_assert_uint_eq(kiln_buffer_store_client_bytes(s, "a"), 16);
  ck_assert_float_eq(first(held, 3), 1.0f);
  ck_assert_int_eq(kiln_buffer_store_acquire(s, "a", held->handle, false, &a1, &st),
                   KILN_ENOTFOUND);
  kiln_buffer_store_unref(s, held);
  ck_assert_uint_eq(kiln_buffer_store_client_bytes(s, "a"), 0);
  /* b used its buffer: that renews too */
  sleep_ms(60);
  ck_assert_int_eq(kiln_buffer_store_acquire(s, "b", b1->handle, false, &held, &st), 0);
  kiln_buffer_store_unref(s, held);
  ck_assert_uint_eq(kiln_buffer_store_expire(s, INT64_C(30000000), NULL), 0);
  sleep_ms(60);
  ck_assert_uint_eq(kiln_buffer_store_expire(s, INT64_C(30000000), NULL), 1);
  kiln_buffer_store_unref(s, b1);
  kiln_buffer_store_get_totals(s, &t);
  ck_assert_uint_eq(t.live_buffers, 0);
  ck_assert_uint_eq(t.live_bytes, 0);
  ck_assert_uint_eq(t.clients, 0);
  kiln_buffer_store_destroy(s);
}
END_TEST

START_TEST(test_take_for_donation) {
  kiln_buffer_store *s = store(0, 0, 0);
  kiln_stored *x = NULL, *taken = NULL, *again = NULL;
  ck_assert_int_eq(kiln_buffer_store_add(s, "c", f32s(4, 1), 0, NULL, false, &x, &st), 0);
  char h[33];
  strcpy(h, x->handle);
  kiln_buffer_store_unref(s, x);
  ck_assert_int_eq(kiln_buffer_store_acquire(s, "c", h, true, &taken, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_acquire(s, "c", h, false, &again, NULL), KILN_ENOTFOUND);
  kiln_buffer_store_totals t;
  kiln_buffer_store_get_totals(s, &t);
  ck_assert_uint_eq(t.live_buffers, 0);
  ck_assert_uint_eq(t.live_bytes, 16);
  kiln_buffer_store_unref(s, taken); /* the only reference: frees it */
  kiln_buffer_store_get_totals(s, &t);
  ck_assert_uint_eq(t.live_bytes, 0);
  kiln_buffer_store_destroy(s);
}
END_TEST

START_TEST(test_client_quota) {
  kiln_buffer_store *s = store(100, 0, 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32s(20, 0), 0, NULL, false, NULL, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32s(6, 0), 0, NULL, false, NULL, &st),
                   KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "client memory quota exceeded: 80 bytes in use, 24 more requested, "
                           "quota 100");
  /* Another client has its own quota. */
  ck_assert_int_eq(kiln_buffer_store_add(s, "b", f32s(25, 0), 0, NULL, false, NULL, NULL), 0);
  /* Reservations count, and turn into the charge. */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_store_reserve(s, "a", 20, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_reserve(s, "a", 1, &st), KILN_ELIMIT);
  ck_assert_uint_eq(kiln_buffer_store_client_bytes(s, "a"), 100);
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32s(5, 0), 0, NULL, true, NULL, &st), 0);
  ck_assert_uint_eq(kiln_buffer_store_client_bytes(s, "a"), 100);
  kiln_buffer_store_unreserve(s, "a", 0);
  ck_assert_int_eq(kiln_buffer_store_reserve(s, "a", 1000, NULL), KILN_ELIMIT);
  ck_assert_int_eq(kiln_buffer_store_reserve(s, "a", UINT64_MAX, NULL), KILN_ELIMIT);
  kiln_buffer_store_destroy(s);
}
END_TEST

/* Per-client overrides (a token's memory= and buffers=) replace the
 * store-wide quota and count for that client only. */
START_TEST(test_client_quota_overrides) {
  kiln_buffer_store *s = store(100, 0, 2);
  kiln_client_quota q[] = {{.client = "a", .memory_bytes = 200, .buffers = 3},
                           {.client = "c", .buffers = 1}};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_store_set_quotas(s, q, 2, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32s(40, 0), 0, NULL, false, NULL, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32s(1, 0), 0, NULL, false, NULL, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32s(1, 0), 0, NULL, false, NULL, &st), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32s(1, 0), 0, NULL, false, NULL, &st),
                   KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "client already holds 3 buffers (the limit)");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_store_add(s, "b", f32s(40, 0), 0, NULL, false, NULL, &st),
                   KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "client memory quota exceeded: 0 bytes in use, 160 more requested, "
                           "quota 100");
  /* c keeps the store-wide memory quota, with its own count. */
  ck_assert_int_eq(kiln_buffer_store_add(s, "c", f32s(1, 0), 0, NULL, false, NULL, NULL), 0);
  ck_assert_int_eq(kiln_buffer_store_add(s, "c", f32s(1, 0), 0, NULL, false, NULL, NULL),
                   KILN_ELIMIT);
  ck_assert_int_eq(kiln_buffer_store_set_quotas(s, NULL, 0, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_add(s, "c", f32s(1, 0), 0, NULL, false, NULL, NULL), 0);
  kiln_buffer_store_destroy(s);
}
END_TEST

START_TEST(test_total_quota_and_unreserve) {
  kiln_buffer_store *s = store(0, 64, 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_store_reserve(s, "a", 40, &st), 0);
  ck_assert_int_eq(kiln_buffer_store_reserve(s, "b", 40, &st), KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "server buffer memory exhausted: 40 bytes in use, 40 more requested, "
                           "limit 64");
  kiln_buffer_store_unreserve(s, "a", 40);
  kiln_buffer_store_totals t;
  kiln_buffer_store_get_totals(s, &t);
  ck_assert_uint_eq(t.live_bytes, 0);
  ck_assert_uint_eq(t.clients, 0);
  ck_assert_int_eq(kiln_buffer_store_reserve(s, "b", 40, NULL), 0);
  /* A failed add returns its reservation. */
  ck_assert_int_eq(
      kiln_buffer_store_add(s, "b", f32buf(10, 0), f32shape(4), 0, NULL, true, NULL, NULL),
      KILN_EINVAL);
  kiln_buffer_store_get_totals(s, &t);
  ck_assert_uint_eq(t.live_bytes, 0);
  kiln_buffer_store_destroy(s);
}
END_TEST

START_TEST(test_buffer_count_limit) {
  kiln_buffer_store *s = store(0, 0, 2);
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32s(1, 0), 0, NULL, false, NULL, NULL), 0);
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32s(1, 0), 0, NULL, false, NULL, NULL), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32s(1, 0), 0, NULL, false, NULL, &st),
                   KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "client already holds 2 buffers (the limit)");
  kiln_buffer_store_totals t;
  kiln_buffer_store_get_totals(s, &t);
  ck_assert_uint_eq(t.live_buffers, 2);
  ck_assert_uint_eq(t.live_bytes, 8);
  kiln_buffer_store_destroy(s);
}
END_TEST

START_TEST(test_tuples_refused) {
  kiln_buffer_store *s = store(0, 0, 0);
  kiln_arena *a = kiln_arena_create();
  kiln_shape e, t;
  ck_assert_int_eq(kiln_shape_make_array(a, &e, KILN_F32, NULL, 0), 0);
  ck_assert_int_eq(kiln_shape_make_tuple(a, &t, &e, 1), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_store_add(s, "a", f32buf(1, 0), &t, 0, NULL, false, NULL, &st),
                   KILN_EINVAL);
  ck_assert_str_eq(st.msg, "only arrays can be stored");
  /* the buffer must be the array's size */
  kiln_status_clear(&st);
  ck_assert_int_eq(
      kiln_buffer_store_add(s, "a", f32buf(3, 0), f32shape(4), 0, NULL, false, NULL, &st),
      KILN_EINVAL);
  ck_assert_str_eq(st.msg, "a buffer of 12 bytes cannot hold an array of 16 bytes");
  kiln_buffer_store_totals tot;
  kiln_buffer_store_get_totals(s, &tot);
  ck_assert_uint_eq(tot.live_bytes, 0);
  kiln_arena_destroy(a);
  kiln_buffer_store_destroy(s);
}
END_TEST

/* Stored arrays are device buffers with their layout; a row-major one is
 * viewed as a literal in place, another is not. */
START_TEST(test_device_buffers) {
  kiln_buffer_store *s = store(0, 0, 0);
  kiln_stored *x = NULL;
  kiln_buffer *buf = f32buf(6, 2.5f);
  ck_assert_int_eq(kiln_buffer_store_add(s, "c", buf, f32shape(6), 1, "w", false, &x, &st), 0);
  ck_assert_ptr_eq(x->buf, buf);
  ck_assert_uint_eq(x->bytes, 24);
  ck_assert_int_eq(x->device, 1);
  ck_assert_uint_eq(x->shape->rank, 1);
  ck_assert_int_eq(x->shape->dims[0], 6);
  kiln_literal view;
  ck_assert_int_eq(kiln_stored_view(x, &view, &st), 0);
  ck_assert_ptr_eq(view.data, kiln_buffer_host(buf, false)); /* no copy */
  ck_assert_uint_eq(view.nbytes, 24);
  ck_assert_int_eq(kiln_literal_elements(&view), 6);
  kiln_buffer_store_unref(s, x);

  /* f32[2,3]{0,1}: column-major bytes keep their layout */
  int64_t dims[2] = {2, 3}, m2m[2] = {0, 1};
  kiln_layout lo = {.minor_to_major = m2m, .rank = 2, .tail = "T(8,128)"};
  kiln_shape cm = {.dtype = KILN_F32, .rank = 2, .dims = dims, .layout = &lo};
  ck_assert_int_eq(kiln_buffer_store_add(s, "c", f32buf(6, 1), &cm, 0, NULL, false, &x, &st), 0);
  m2m[0] = 1; /* copied, not borrowed */
  ck_assert(x->shape->layout != NULL && x->shape->layout != &lo);
  ck_assert_int_eq(x->shape->layout->minor_to_major[0], 0);
  ck_assert_str_eq(x->shape->layout->tail, "T(8,128)");
  ck_assert(!kiln_shape_is_row_major(x->shape));
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_stored_view(x, &view, &st), KILN_EUNIMPL);
  ck_assert_ptr_null(view.data);
  /* read back row-major: physical a00 a10 a01 a11 a02 a12 */
  float phys[6] = {0, 10, 1, 11, 2, 12}, logical[6];
  ck_assert_int_eq(kiln_buffer_write(x->buf, 0, phys, sizeof phys, &st), 0);
  ck_assert_int_eq(kiln_array_read_row_major(x->buf, x->shape, logical, &st), 0);
  const float want[6] = {0, 1, 2, 10, 11, 12};
  ck_assert_mem_eq(logical, want, sizeof want);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_array_read_row_major(x->buf, f32shape(5), logical, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "a buffer of 24 bytes does not hold an array of 20 bytes");
  kiln_buffer_store_unref(s, x);
  kiln_buffer_store_destroy(s);
}
END_TEST

/* Many handles: the table grows and every handle stays findable. */
START_TEST(test_many_buffers) {
  kiln_buffer_store *s = store(0, 0, 0);
  enum { N = 3000 };
  static char handles[N][33];
  for (int i = 0; i < N; i++) {
    kiln_stored *b = NULL;
    ck_assert_int_eq(kiln_buffer_store_add(s, i % 2 ? "odd" : "even", f32s(1, (float)i), 0, NULL,
                                           false, &b, NULL),
                     0);
    strcpy(handles[i], b->handle);
    kiln_buffer_store_unref(s, b);
  }
  for (int i = 0; i < N; i++) {
    kiln_stored *b = NULL;
    ck_assert_int_eq(
        kiln_buffer_store_acquire(s, i % 2 ? "odd" : "even", handles[i], false, &b, NULL), 0);
    ck_assert_float_eq(first(b, 0), (float)i);
    kiln_buffer_store_unref(s, b);
  }
  for (int i = 0; i < N; i += 2)
    ck_assert_int_eq(kiln_buffer_store_release(s, "even", handles[i], NULL), 0);
  kiln_buffer_store_totals t;
  kiln_buffer_store_get_totals(s, &t);
  ck_assert_uint_eq(t.live_buffers, N / 2);
  ck_assert_uint_eq(t.clients, 1);
  kiln_buffer_store_destroy(s);
}
END_TEST

static void *hammer(void *arg) {
  kiln_buffer_store *s = arg;
  char name[32];
  snprintf(name, sizeof name, "t%lu", (unsigned long)pthread_self() % 7);
  for (int i = 0; i < 500; i++) {
    kiln_stored *b = NULL, *c = NULL;
    if (kiln_buffer_store_add(s, name, f32s(8, 1), 0, NULL, false, &b, NULL) != 0) continue;
    if (kiln_buffer_store_acquire(s, name, b->handle, i % 2 == 0, &c, NULL) == 0)
      kiln_buffer_store_unref(s, c);
    kiln_buffer_store_release(s, name, b->handle, NULL);
    kiln_buffer_store_unref(s, b);
  }
  return NULL;
}

START_TEST(test_threads) {
  kiln_buffer_store *s = store(1 << 20, 0, 0);
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, hammer, s);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  kiln_buffer_store_totals t;
  kiln_buffer_store_get_totals(s, &t);
  ck_assert_uint_eq(t.live_buffers, 0);
  ck_assert_uint_eq(t.live_bytes, 0);
  ck_assert_uint_eq(t.clients, 0);
  kiln_buffer_store_destroy(s);
}
END_TEST

START_TEST(test_out_of_memory) {
  for (long n = 1; n < 12; n++) {
    kiln_buffer_store *s = NULL;
    kiln_buffer *buf = f32buf(4, 0);
    kiln_alloc_fail_after(n);
    int rc = kiln_buffer_store_create(NULL, &s, NULL);
    if (rc == 0)
      rc = kiln_buffer_store_add(s, "a", buf, f32shape(4), 0, "label", false, NULL, NULL);
    else
      kiln_buffer_free(buf);
    kiln_alloc_fail_after(0);
    ck_assert(rc == 0 || rc == KILN_ENOMEM);
    if (s) {
      kiln_buffer_store_totals t;
      kiln_buffer_store_get_totals(s, &t);
      ck_assert_uint_eq(t.live_bytes, rc == 0 ? 16 : 0);
    }
    kiln_buffer_store_destroy(s);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("buffers");
  TCase *tc = tcase_create("store");
  tcase_add_checked_fixture(tc, make_backend, destroy_backend);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_handles_are_random_hex);
  tcase_add_test(tc, test_foreign_and_unknown_handles);
  tcase_add_test(tc, test_release_while_held);
  tcase_add_test(tc, test_take_for_donation);
  tcase_add_test(tc, test_lease_expiry);
  tcase_add_test(tc, test_client_quota);
  tcase_add_test(tc, test_client_quota_overrides);
  tcase_add_test(tc, test_total_quota_and_unreserve);
  tcase_add_test(tc, test_buffer_count_limit);
  tcase_add_test(tc, test_tuples_refused);
  tcase_add_test(tc, test_device_buffers);
  tcase_add_test(tc, test_many_buffers);
  tcase_add_test(tc, test_threads);
  tcase_add_test(tc, test_out_of_memory);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
