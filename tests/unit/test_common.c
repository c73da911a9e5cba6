/* Tests for common/: arenas, the string buffer, status records, the
 * allocation hook and the narrow floating-point conversions.
 *
 * The fp16 tests are exhaustive where the input space allows it: every one of
 * the 65536 bit patterns of f16 and bf16 is decoded and re-encoded, and every
 * pair of neighbouring finite values has its midpoint (and the doubles just
 * either side of it) rounded. Independent references check the decoders
 * (bf16 is the top half of an f32; f16 against the compiler's _Float16 where
 * it has one) and a table computed with numpy and ml_dtypes pins the results
 * of tricky doubles.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/arena.h"
#include "common/deadline.h"
#include "common/fp16.h"
#include "common/sbuf.h"
#include "common/status.h"

/* Tests that arm the allocation hook disarm it afterwards, so that they stay
 * independent even when run in one process. */
static void reset_alloc_hook(void) { kiln_alloc_fail_after(0); }

/* ---- arena ------------------------------------------------------------- */

START_TEST(arena_alignment) {
  kiln_arena *a = kiln_arena_create();
  ck_assert_ptr_nonnull(a);
  for (size_t size = 1; size <= 200; size += 7) {
    unsigned char *p = kiln_arena_alloc(a, size);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq((uintptr_t)p % 16, 0);
    memset(p, 0xab, size);
  }
  /* A large block and the allocations after it stay aligned too. */
  ck_assert_uint_eq((uintptr_t)kiln_arena_alloc(a, 100001) % 16, 0);
  ck_assert_uint_eq((uintptr_t)kiln_arena_alloc(a, 3) % 16, 0);
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(arena_used_counts_rounded_sizes) {
  kiln_arena *a = kiln_arena_create();
  ck_assert_uint_eq(kiln_arena_used(a), 0);
  ck_assert_ptr_nonnull(kiln_arena_alloc(a, 1));
  ck_assert_uint_eq(kiln_arena_used(a), 16);
  ck_assert_ptr_nonnull(kiln_arena_alloc(a, 16));
  ck_assert_uint_eq(kiln_arena_used(a), 32);
  ck_assert_ptr_nonnull(kiln_arena_alloc(a, 17));
  ck_assert_uint_eq(kiln_arena_used(a), 64);
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(arena_reset_keeps_one_block) {
  kiln_arena *a = kiln_arena_create();
  kiln_arena_reset(a); /* empty: nothing to keep */
  ck_assert_uint_eq(kiln_arena_used(a), 0);
  unsigned char *first = kiln_arena_alloc(a, 32);
  ck_assert_ptr_nonnull(kiln_arena_alloc(a, 3u << 20)); /* a block of its own */
  for (int i = 0; i < 100; i++) ck_assert_ptr_nonnull(kiln_arena_alloc(a, 1000)); /* a 2nd */
  kiln_arena_reset(a);
  ck_assert_uint_eq(kiln_arena_used(a), 0);
  /* One 64 KiB block survives and is bumped from its start again. */
  unsigned char *again = kiln_arena_alloc(a, 32);
  ck_assert_ptr_nonnull(again);
  ck_assert_uint_eq(kiln_arena_used(a), 32);
  memset(again, 7, 32);
  kiln_arena_reset(a);
  ck_assert_ptr_eq(kiln_arena_alloc(a, 16), again);
  (void)first;
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(arena_large_blocks) {
  kiln_arena *a = kiln_arena_create();
  unsigned char *small1 = kiln_arena_alloc(a, 32);
  memset(small1, 1, 32);
  /* Bigger than a default block: gets a block of its own. */
  size_t big = 3u << 20;
  unsigned char *b = kiln_arena_alloc(a, big);
  ck_assert_ptr_nonnull(b);
  memset(b, 2, big);
  unsigned char *small2 = kiln_arena_alloc(a, 32);
  memset(small2, 3, 32);
  unsigned char *b2 = kiln_arena_alloc(a, big + 5);
  ck_assert_ptr_nonnull(b2);
  memset(b2, 4, big + 5);
  for (size_t i = 0; i < 32; i++) {
    ck_assert_uint_eq(small1[i], 1);
    ck_assert_uint_eq(small2[i], 3);
  }
  for (size_t i = 0; i < big; i += 4093) ck_assert_uint_eq(b[i], 2);
  ck_assert_uint_eq(b[big - 1], 2);
  ck_assert_uint_eq(b2[big + 4], 4);
  ck_assert_uint_eq(kiln_arena_used(a), 32 + big + 32 + big + 16);
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(arena_many_small_allocations) {
  enum { N = 200000 };
  kiln_arena *a = kiln_arena_create();
  uint32_t **ptrs = malloc(N * sizeof *ptrs);
  ck_assert_ptr_nonnull(ptrs);
  for (uint32_t i = 0; i < N; i++) {
    size_t words = 1 + i % 7;
    ptrs[i] = kiln_arena_alloc(a, words * sizeof(uint32_t));
    if (ptrs[i] == NULL) ck_abort_msg("allocation %u failed", i);
    for (size_t w = 0; w < words; w++) ptrs[i][w] = i * 7u + (uint32_t)w;
  }
  /* No allocation overlapped another. */
  for (uint32_t i = 0; i < N; i++) {
    size_t words = 1 + i % 7;
    for (size_t w = 0; w < words; w++)
      if (ptrs[i][w] != i * 7u + (uint32_t)w)
        ck_abort_msg("allocation %u word %zu overwritten", i, w);
  }
  free(ptrs);
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(arena_calloc_zeroes_and_checks_overflow) {
  kiln_arena *a = kiln_arena_create();
  unsigned char *dirty = kiln_arena_alloc(a, 64);
  memset(dirty, 0xff, 64);
  uint64_t *z = kiln_arena_calloc(a, 100, sizeof(uint64_t));
  ck_assert_ptr_nonnull(z);
  for (int i = 0; i < 100; i++) ck_assert_uint_eq(z[i], 0);
  ck_assert_ptr_null(kiln_arena_calloc(a, SIZE_MAX / 2 + 1, 2));
  ck_assert_ptr_null(kiln_arena_calloc(a, SIZE_MAX, SIZE_MAX));
  ck_assert_ptr_null(kiln_arena_calloc(a, (SIZE_MAX >> 4) + 1, 16));
  ck_assert_ptr_null(kiln_arena_alloc(a, SIZE_MAX));
  ck_assert_ptr_null(kiln_arena_alloc(a, SIZE_MAX - 8));
  /* The arena still works after refusing. */
  ck_assert_ptr_nonnull(kiln_arena_calloc(a, 4, 4));
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(arena_dup_helpers) {
  kiln_arena *a = kiln_arena_create();
  char *s = kiln_arena_strdup(a, "reduce.17");
  ck_assert_str_eq(s, "reduce.17");
  char *n = kiln_arena_strndup(a, "parameter(0)", 9);
  ck_assert_str_eq(n, "parameter");
  int64_t dims[3] = {2, -3, 4};
  int64_t *d = kiln_arena_memdup(a, dims, sizeof dims);
  ck_assert_ptr_ne(d, dims);
  ck_assert_int_eq(d[0], 2);
  ck_assert_int_eq(d[1], -3);
  ck_assert_int_eq(d[2], 4);
  ck_assert_str_eq(kiln_arena_strdup(a, ""), "");
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(arena_out_of_memory) {
  kiln_alloc_fail_after(1);
  ck_assert_ptr_null(kiln_arena_create());
  kiln_alloc_fail_after(0);
  kiln_arena *a = kiln_arena_create();
  ck_assert_ptr_nonnull(a);
  kiln_alloc_fail_after(1); /* the first block */
  ck_assert_ptr_null(kiln_arena_alloc(a, 8));
  ck_assert_ptr_null(kiln_arena_strdup(a, "x"));
  kiln_alloc_fail_after(0);
  ck_assert_ptr_nonnull(kiln_arena_alloc(a, 8));
  /* A request that fits the current block needs no allocation. */
  kiln_alloc_fail_after(1);
  ck_assert_ptr_nonnull(kiln_arena_alloc(a, 8));
  ck_assert_ptr_null(kiln_arena_alloc(a, 1 << 20));
  kiln_alloc_fail_after(0);
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(arena_destroy_null) { kiln_arena_destroy(NULL); }
END_TEST

/* ---- sbuf -------------------------------------------------------------- */

START_TEST(sbuf_empty) {
  kiln_sbuf b = KILN_SBUF_INIT;
  ck_assert_str_eq(kiln_sbuf_str(&b), "");
  ck_assert(!kiln_sbuf_failed(&b));
  size_t len = 99;
  char *s = kiln_sbuf_detach(&b, &len);
  ck_assert_ptr_nonnull(s);
  ck_assert_str_eq(s, "");
  ck_assert_uint_eq(len, 0);
  kiln_free(s);
  kiln_sbuf_free(&b);
}
END_TEST

START_TEST(sbuf_growth) {
  kiln_sbuf b;
  kiln_sbuf_init(&b);
  for (int i = 0; i < 10000; i++) kiln_sbuf_putc(&b, (char)('a' + i % 26));
  ck_assert_uint_eq(b.len, 10000);
  ck_assert_uint_ge(b.cap, 10001);
  ck_assert_uint_eq(strlen(kiln_sbuf_str(&b)), 10000);
  for (int i = 0; i < 10000; i++) ck_assert_int_eq(b.data[i], 'a' + i % 26);
  kiln_sbuf_puts(&b, "XYZ");
  kiln_sbuf_putn(&b, "12345", 2);
  ck_assert_str_eq(kiln_sbuf_str(&b) + 10000, "XYZ12");
  kiln_sbuf_reset(&b);
  ck_assert_str_eq(kiln_sbuf_str(&b), "");
  kiln_sbuf_puts(&b, "again");
  ck_assert_str_eq(kiln_sbuf_str(&b), "again");
  kiln_sbuf_free(&b);
  ck_assert_ptr_null(b.data);
}
END_TEST

START_TEST(sbuf_printf) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b, "%%%s.%d = f32[%d,%d]", "add", 3, 8, 16);
  ck_assert_str_eq(kiln_sbuf_str(&b), "%add.3 = f32[8,16]");
  /* Longer than the formatter's stack buffer: takes the second pass. */
  char longs[600];
  memset(longs, 'q', sizeof longs - 1);
  longs[sizeof longs - 1] = '\0';
  kiln_sbuf_reset(&b);
  kiln_sbuf_puts(&b, "<");
  kiln_sbuf_printf(&b, "%s|%d", longs, -42);
  ck_assert_uint_eq(b.len, 1 + 599 + 4);
  ck_assert_int_eq(b.data[0], '<');
  ck_assert_int_eq(b.data[599], 'q');
  ck_assert_str_eq(b.data + 600, "|-42");
  kiln_sbuf_free(&b);
}
END_TEST

START_TEST(sbuf_detach) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, "ENTRY main");
  size_t len = 0;
  char *s = kiln_sbuf_detach(&b, &len);
  ck_assert_str_eq(s, "ENTRY main");
  ck_assert_uint_eq(len, 10);
  /* The buffer is empty and usable again; the string is ours. */
  ck_assert_ptr_null(b.data);
  ck_assert_uint_eq(b.len, 0);
  kiln_sbuf_puts(&b, "x");
  ck_assert_str_eq(kiln_sbuf_str(&b), "x");
  ck_assert_str_eq(s, "ENTRY main");
  kiln_free(s);
  s = kiln_sbuf_detach(&b, NULL);
  ck_assert_str_eq(s, "x");
  kiln_free(s);
}
END_TEST

START_TEST(sbuf_sticky_failure) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, "abc");
  ck_assert(!kiln_sbuf_failed(&b));
  kiln_alloc_fail_after(1);
  char big[100];
  memset(big, 'z', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  kiln_sbuf_puts(&b, big); /* needs to grow: fails */
  ck_assert(kiln_sbuf_failed(&b));
  kiln_alloc_fail_after(0);
  /* Sticky: later appends do nothing even though memory is back. */
  kiln_sbuf_puts(&b, "d");
  kiln_sbuf_printf(&b, "%d", 5);
  kiln_sbuf_putc(&b, 'e');
  ck_assert(kiln_sbuf_failed(&b));
  ck_assert_str_eq(kiln_sbuf_str(&b), "");
  size_t len = 7;
  ck_assert_ptr_null(kiln_sbuf_detach(&b, &len));
  /* Detach released the storage and left a fresh buffer. */
  ck_assert(!kiln_sbuf_failed(&b));
  kiln_sbuf_puts(&b, "ok");
  ck_assert_str_eq(kiln_sbuf_str(&b), "ok");
  kiln_sbuf_free(&b);
}
END_TEST

START_TEST(sbuf_failure_on_first_allocation) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_alloc_fail_after(1);
  kiln_sbuf_printf(&b, "%s", "x");
  kiln_alloc_fail_after(0);
  ck_assert(kiln_sbuf_failed(&b));
  ck_assert_ptr_null(kiln_sbuf_detach(&b, NULL));
  kiln_sbuf_free(&b);
}
END_TEST

/* ---- status ------------------------------------------------------------ */

START_TEST(status_first_error_wins) {
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert(kiln_status_is_ok(&st));
  ck_assert_int_eq(
      kiln_status_set(&st, KILN_EPARSE, "m.hlo:3:14", "expected '%c', found '%s'", ')', "}"),
      KILN_EPARSE);
  ck_assert(!kiln_status_is_ok(&st));
  /* The second error returns its own code but does not overwrite. */
  ck_assert_int_eq(kiln_status_set(&st, KILN_EVERIFY, "main/dot.1", "later"), KILN_EVERIFY);
  ck_assert_int_eq(st.code, KILN_EPARSE);
  ck_assert_str_eq(st.where, "m.hlo:3:14");
  ck_assert_str_eq(st.msg, "expected ')', found '}'");
  kiln_status_clear(&st);
  ck_assert(kiln_status_is_ok(&st));
  ck_assert_str_eq(st.where, "");
  ck_assert_str_eq(st.msg, "");
  kiln_status_set(&st, KILN_EVERIFY, NULL, "no place");
  ck_assert_str_eq(st.where, "");
  ck_assert_str_eq(st.msg, "no place");
}
END_TEST

START_TEST(status_null_is_allowed) {
  ck_assert(kiln_status_is_ok(NULL));
  ck_assert_int_eq(kiln_status_set(NULL, KILN_ENOMEM, "x", "y"), KILN_ENOMEM);
  kiln_status_clear(NULL);
  char buf[16];
  kiln_status_format(NULL, buf, sizeof buf);
  ck_assert_str_eq(buf, "ok");
}
END_TEST

START_TEST(status_format) {
  kiln_status st;
  kiln_status_clear(&st);
  char buf[128];
  kiln_status_format(&st, buf, sizeof buf);
  ck_assert_str_eq(buf, "ok");
  kiln_status_set(&st, KILN_EVERIFY, "main/dot.3",
                  "lhs contracting dim 1 has size %d, rhs dim 0 has size %d", 7, 5);
  kiln_status_format(&st, buf, sizeof buf);
  ck_assert_str_eq(buf,
                   "main/dot.3: error: lhs contracting dim 1 has size 7, rhs dim 0 has size 5");
  kiln_status st2;
  kiln_status_clear(&st2);
  kiln_status_set(&st2, KILN_EIO, "", "cannot open");
  kiln_status_format(&st2, buf, sizeof buf);
  ck_assert_str_eq(buf, "error: cannot open");
  /* Truncates to the buffer, NUL-terminated; size 0 writes nothing. */
  char small[12];
  kiln_status_format(&st, small, sizeof small);
  ck_assert_str_eq(small, "main/dot.3:");
  buf[0] = 'Q';
  kiln_status_format(&st, buf, 0);
  ck_assert_int_eq(buf[0], 'Q');
}
END_TEST

START_TEST(status_long_message_truncated) {
  kiln_status st;
  kiln_status_clear(&st);
  char longs[3000];
  memset(longs, 'm', sizeof longs - 1);
  longs[sizeof longs - 1] = '\0';
  kiln_status_set(&st, KILN_EINVAL, longs, "%s", longs);
  ck_assert_uint_eq(strlen(st.where), KILN_STATUS_WHERE_MAX - 1);
  ck_assert_uint_eq(strlen(st.msg), KILN_STATUS_MSG_MAX - 1);
}
END_TEST

START_TEST(status_names) {
  ck_assert_str_eq(kiln_strerror(0), "ok");
  ck_assert_str_eq(kiln_strerror(KILN_EPARSE), "parse error");
  ck_assert_str_eq(kiln_strerror(KILN_ENOMEM), "out of memory");
  ck_assert_str_eq(kiln_strerror(KILN_ENOTFOUND), "not found");
  ck_assert_str_eq(kiln_strerror(-999), "unknown error");
  ck_assert_str_eq(kiln_err_name(0), "KILN_OK");
  ck_assert_str_eq(kiln_err_name(KILN_EVERIFY), "KILN_EVERIFY");
  ck_assert_str_eq(kiln_err_name(KILN_ELIMIT), "KILN_ELIMIT");
  ck_assert_str_eq(kiln_err_name(12345), "KILN_E?");
  ck_assert_int_eq(KILN_EINVAL, -1);
  ck_assert_int_eq(KILN_ENOTFOUND, -10);
}
END_TEST

/* ---- allocation hook --------------------------------------------------- */

/* Once: only the n-th fails; pending until then. */
START_TEST(alloc_fail_once) {
  kiln_alloc_fail_once(3);
  ck_assert(kiln_alloc_failure_pending());
  void *a = kiln_malloc(8), *b = kiln_malloc(8);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  ck_assert(kiln_alloc_failure_pending());
  ck_assert_ptr_null(kiln_malloc(8));
  ck_assert(!kiln_alloc_failure_pending());
  void *c = kiln_calloc(2, 4), *d = kiln_strdup("x");
  ck_assert_ptr_nonnull(c);
  ck_assert_ptr_nonnull(d);
  kiln_free(a), kiln_free(b), kiln_free(c), kiln_free(d);
  kiln_alloc_fail_after(1); /* sticky is never "pending" */
  ck_assert(!kiln_alloc_failure_pending());
  ck_assert_ptr_null(kiln_malloc(1));
  ck_assert_ptr_null(kiln_malloc(1));
}
END_TEST

/* Armed while four threads allocate: exactly one allocation fails. */
static _Atomic int failures;
static void *alloc_loop(void *arg) {
  (void)arg;
  for (int i = 0; i < 20000; i++) {
    void *p = kiln_malloc(16);
    if (p == NULL) atomic_fetch_add(&failures, 1);
    kiln_free(p);
  }
  return NULL;
}

START_TEST(alloc_fail_once_threads) {
  kiln_alloc_fail_once(30000);
  pthread_t t[4];
  for (int i = 0; i < 4; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, alloc_loop, NULL), 0);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  ck_assert_int_eq(atomic_load(&failures), 1);
  ck_assert(!kiln_alloc_failure_pending());
}
END_TEST

START_TEST(alloc_fail_nth) {
  kiln_alloc_fail_after(3);
  void *p1 = kiln_malloc(8);
  void *p2 = kiln_calloc(2, 8);
  void *p3 = kiln_malloc(8);   /* the 3rd fails */
  void *p4 = kiln_strdup("x"); /* and every one after it */
  void *p5 = kiln_realloc(NULL, 4);
  ck_assert_ptr_nonnull(p1);
  ck_assert_ptr_nonnull(p2);
  ck_assert_ptr_null(p3);
  ck_assert_ptr_null(p4);
  ck_assert_ptr_null(p5);
  kiln_alloc_fail_after(0);
  void *p6 = kiln_malloc(8);
  ck_assert_ptr_nonnull(p6);
  kiln_free(p1);
  kiln_free(p2);
  kiln_free(p6);
  kiln_free(NULL);
}
END_TEST

START_TEST(alloc_fail_each_position) {
  /* Fail the n-th allocation of a sequence of four, for every n. */
  for (long n = 1; n <= 5; n++) {
    kiln_alloc_fail_after(n);
    int got = 0;
    void *p[4];
    for (int i = 0; i < 4; i++) {
      p[i] = kiln_malloc(16);
      got += p[i] != NULL;
    }
    kiln_alloc_fail_after(0);
    ck_assert_int_eq(got, (int)(n - 1 < 4 ? n - 1 : 4));
    for (int i = 0; i < 4; i++) kiln_free(p[i]);
  }
}
END_TEST

START_TEST(alloc_zero_sizes_and_strings) {
  void *z = kiln_malloc(0);
  ck_assert_ptr_nonnull(z);
  kiln_free(z);
  z = kiln_calloc(0, 8);
  ck_assert_ptr_nonnull(z);
  kiln_free(z);
  char *s = kiln_strndup("custom-call", 6);
  ck_assert_str_eq(s, "custom");
  kiln_free(s);
  s = kiln_strdup("tuple");
  ck_assert_str_eq(s, "tuple");
  kiln_free(s);
}
END_TEST

START_TEST(alloc_grow) {
  int *v = NULL;
  size_t cap = 0;
  void *p = v;
  ck_assert_int_eq(kiln_grow(&p, &cap, 5, sizeof(int)), 0);
  ck_assert_uint_eq(cap, 8);
  v = p;
  for (int i = 0; i < 8; i++) v[i] = i;
  ck_assert_int_eq(kiln_grow(&p, &cap, 8, sizeof(int)), 0); /* already enough */
  ck_assert_uint_eq(cap, 8);
  ck_assert_int_eq(kiln_grow(&p, &cap, 9, sizeof(int)), 0);
  ck_assert_uint_eq(cap, 16);
  ck_assert_int_eq(kiln_grow(&p, &cap, 100, sizeof(int)), 0);
  ck_assert_uint_eq(cap, 128);
  v = p;
  for (int i = 0; i < 8; i++) ck_assert_int_eq(v[i], i);
  /* Size overflow is refused before any allocation, leaving *ptr intact. */
  ck_assert_int_eq(kiln_grow(&p, &cap, SIZE_MAX, 1), KILN_ENOMEM);
  ck_assert_int_eq(kiln_grow(&p, &cap, SIZE_MAX / 4, 16), KILN_ENOMEM);
  ck_assert_ptr_eq(p, v);
  ck_assert_uint_eq(cap, 128);
  /* An injected failure also leaves it intact. */
  kiln_alloc_fail_after(1);
  ck_assert_int_eq(kiln_grow(&p, &cap, 1000, sizeof(int)), KILN_ENOMEM);
  kiln_alloc_fail_after(0);
  ck_assert_ptr_eq(p, v);
  ck_assert_uint_eq(cap, 128);
  ck_assert_int_eq(v[7], 7);
  kiln_free(p);
}
END_TEST

/* ---- fp16 -------------------------------------------------------------- */

/* In fork mode every Check assertion reports progress to the parent through
 * a pipe; in loops of millions that would dominate the run (more so under
 * the sanitizers), so these tests test first and call Check only to fail. */
#define EXPECT(cond, ...) \
  do { \
    if (!(cond)) ck_abort_msg(__VA_ARGS__); \
  } while (0)

typedef struct fmt {
  const char *name;
  int ebits, mbits;
  double (*decode)(uint16_t);
  uint16_t (*encode)(double);
} fmt;

static const fmt FMTS[2] = {
    {"f16", 5, 10, kiln_f16_to_f64, kiln_f64_to_f16},
    {"bf16", 8, 7, kiln_bf16_to_f64, kiln_f64_to_bf16},
};

static int is_nan_bits(const fmt *f, uint32_t bits) {
  uint32_t expmax = (1u << f->ebits) - 1u;
  return ((bits >> f->mbits) & expmax) == expmax && (bits & ((1u << f->mbits) - 1u)) != 0;
}

static uint16_t sign_bit(const fmt *f) { return (uint16_t)(1u << (f->ebits + f->mbits)); }

/* The first bit pattern of +inf: one past the largest finite value. */
static uint16_t inf_bits(const fmt *f) { return (uint16_t)(((1u << f->ebits) - 1u) << f->mbits); }

START_TEST(fp16_roundtrip_all_patterns) {
  const fmt *f = &FMTS[_i];
  int nans = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    double d = f->decode((uint16_t)h);
    if (is_nan_bits(f, h)) {
      nans++;
      EXPECT(isnan(d), "%s 0x%04x should decode to NaN", f->name, h);
      uint16_t back = f->encode(d);
      EXPECT(is_nan_bits(f, back), "%s NaN 0x%04x re-encoded as 0x%04x", f->name, h, back);
      EXPECT((back & sign_bit(f)) == (h & sign_bit(f)), "%s NaN 0x%04x lost its sign", f->name, h);
      continue;
    }
    EXPECT(!isnan(d), "%s 0x%04x decoded to NaN", f->name, h);
    EXPECT(!!signbit(d) == !!(h & sign_bit(f)), "%s 0x%04x sign", f->name, h);
    uint16_t back = f->encode(d);
    EXPECT(back == h, "%s 0x%04x -> %a -> 0x%04x", f->name, h, d, back);
    EXPECT(kiln_round_to_format(d, f->ebits, f->mbits) == d || d != d, "%s 0x%04x", f->name, h);
  }
  /* 2 signs x (2^mbits - 1) NaN mantissas. */
  ck_assert_int_eq(nans, 2 * ((1 << f->mbits) - 1));
}
END_TEST

START_TEST(fp16_decode_is_monotonic) {
  /* Positive patterns in increasing order are increasing values: a sanity
   * check that exponent and mantissa are assembled the right way round. */
  const fmt *f = &FMTS[_i];
  double prev = f->decode(0);
  ck_assert(prev == 0.0 && !signbit(prev));
  for (uint32_t h = 1; h <= inf_bits(f); h++) {
    double d = f->decode((uint16_t)h);
    EXPECT(d > prev, "%s 0x%04x = %a not above %a", f->name, h, d, prev);
    EXPECT(f->decode((uint16_t)(h | sign_bit(f))) == -d, "%s 0x%04x: negative differs", f->name,
           h | sign_bit(f));
    prev = d;
  }
  ck_assert(isinf(prev));
}
END_TEST

START_TEST(fp16_midpoints_round_to_even) {
  const fmt *f = &FMTS[_i];
  for (uint32_t h = 0; h < inf_bits(f); h++) {
    double lo = f->decode((uint16_t)h);
    /* Beyond the largest finite value the next step would be lo + ulp;
     * for every other value it is the next pattern's value. */
    double hi = h + 1 < inf_bits(f) ? f->decode((uint16_t)(h + 1))
                                    : lo + (lo - f->decode((uint16_t)(h - 1)));
    uint16_t hi_bits = (uint16_t)(h + 1); /* for the last, +inf: overflow */
    double mid = lo + (hi - lo) / 2;      /* exact in double */
    /* The largest finite value has an odd mantissa, so its tie goes to inf. */
    uint16_t even = (h & 1) ? hi_bits : (uint16_t)h;
    EXPECT(f->encode(mid) == even, "%s midpoint %a -> 0x%04x, want 0x%04x", f->name, mid,
           f->encode(mid), even);
    EXPECT(f->encode(nextafter(mid, INFINITY)) == hi_bits, "%s above %a", f->name, mid);
    EXPECT(f->encode(nextafter(mid, 0.0)) == h, "%s below %a", f->name, mid);
    /* Negative values mirror the positive ones. */
    EXPECT(f->encode(-mid) == (even | sign_bit(f)), "%s midpoint -%a", f->name, mid);
    EXPECT(f->encode(-nextafter(mid, INFINITY)) == (hi_bits | sign_bit(f)), "%s above -%a", f->name,
           mid);
    EXPECT(f->encode(-nextafter(mid, 0.0)) == (h | sign_bit(f)), "%s below -%a", f->name, mid);
  }
}
END_TEST

START_TEST(fp16_overflow_nan_zero_subnormal) {
  const fmt *f = &FMTS[_i];
  uint16_t inf = inf_bits(f), s = sign_bit(f);
  ck_assert_uint_eq(f->encode(INFINITY), inf);
  ck_assert_uint_eq(f->encode(-INFINITY), inf | s);
  ck_assert_uint_eq(f->encode(1e300), inf);
  ck_assert_uint_eq(f->encode(-1e300), inf | s);
  /* Rounding DBL_MAX to the format's quantum overflows the double itself;
   * the answer must still be inf, not garbage from frexp(inf). */
  const double dbl_max = DBL_MAX;
  ck_assert_uint_eq(f->encode(dbl_max), inf);
  ck_assert_uint_eq(f->encode(-dbl_max), inf | s);
  ck_assert(isinf(f->decode(inf)) && f->decode(inf) > 0);
  ck_assert(isinf(f->decode(inf | s)) && f->decode(inf | s) < 0);
  ck_assert(is_nan_bits(f, f->encode(NAN)));
  ck_assert(is_nan_bits(f, f->encode(-NAN)));
  ck_assert(f->encode(-NAN) & s);
  ck_assert_uint_eq(f->encode(0.0), 0);
  ck_assert_uint_eq(f->encode(-0.0), s);
  ck_assert_uint_eq(f->encode(4.9e-324), 0); /* smallest double subnormal */
  ck_assert_uint_eq(f->encode(-4.9e-324), s);
  /* Subnormals: pattern k is k times the smallest. */
  int bias = (1 << (f->ebits - 1)) - 1;
  double tiny = ldexp(1.0, 1 - bias - f->mbits);
  for (uint16_t k = 1; k < (1u << f->mbits); k++) {
    EXPECT(f->decode(k) == k * tiny, "%s subnormal 0x%04x decodes to %a", f->name, k, f->decode(k));
    EXPECT(f->encode(k * tiny) == k, "%s subnormal %a encodes to 0x%04x", f->name, k * tiny,
           f->encode(k * tiny));
  }
  /* The smallest normal, and the largest subnormal rounding up into it. */
  uint16_t min_normal = (uint16_t)(1u << f->mbits);
  ck_assert(f->decode(min_normal) == ldexp(1.0, 1 - bias));
  ck_assert_uint_eq(f->encode(ldexp(1.0, 1 - bias) - tiny / 4), min_normal);
}
END_TEST

START_TEST(bf16_is_top_half_of_f32) {
  /* Independent reference: a bf16 pattern is the top 16 bits of an f32, and
   * rounding an f32 (exact in double) to bf16 is integer round-half-even on
   * the low 16 bits. Check decode for every pattern and encode for a spread
   * of f32 values (all exponents, pseudo-random mantissas). */
  for (uint32_t h = 0; h < 65536; h++) {
    if (is_nan_bits(&FMTS[1], h)) continue;
    uint32_t u = h << 16;
    float fl;
    memcpy(&fl, &u, 4);
    EXPECT(kiln_bf16_to_f64((uint16_t)h) == (double)fl, "0x%04x", h);
  }
  uint32_t x = 12345;
  for (int i = 0; i < 2000000; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    uint32_t u = x;
    if (((u >> 23) & 0xff) == 0xff) continue; /* inf/NaN */
    float fl;
    memcpy(&fl, &u, 4);
    uint32_t want = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    EXPECT(kiln_f64_to_bf16((double)fl) == want, "f32 0x%08x -> 0x%04x, want 0x%04x", u,
           kiln_f64_to_bf16((double)fl), want);
  }
}
END_TEST

START_TEST(f16_matches_compiler_float16) {
#ifdef __FLT16_MAX__
  /* Where the compiler has _Float16, its conversions (correctly rounded from
   * double in GCC's soft-float routines) are a second reference. */
  for (uint32_t h = 0; h < 65536; h++) {
    if (is_nan_bits(&FMTS[0], h)) continue;
    uint16_t b = (uint16_t)h;
    _Float16 v;
    memcpy(&v, &b, 2);
    EXPECT(kiln_f16_to_f64(b) == (double)v, "0x%04x", h);
  }
  uint64_t x = 0x9e3779b97f4a7c15u;
  for (int i = 0; i < 1000000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    /* Doubles in and around f16's range: exponent in [-30, 17]. */
    double d = ldexp((double)(x >> 11) * 0x1p-53 + 1.0, (int)(x % 48) - 30);
    if (x & 1) d = -d;
    _Float16 v = (_Float16)d;
    uint16_t want;
    memcpy(&want, &v, 2);
    EXPECT(kiln_f64_to_f16(d) == want, "%a -> 0x%04x, want 0x%04x", d, kiln_f64_to_f16(d), want);
  }
#endif
}
END_TEST

START_TEST(f32_rounding_matches_float_cast) {
  /* kiln_round_to_format(x, 8, 23) must agree with the hardware's
   * double -> float conversion (round to nearest even, with subnormals). */
  uint64_t x = 0x243f6a8885a308d3u;
  for (int i = 0; i < 1000000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    double d = ldexp((double)(x >> 11) * 0x1p-53 + 1.0, (int)(x % 300) - 160);
    if (x & 1) d = -d;
    double want = (double)(float)d;
    EXPECT(kiln_round_to_format(d, 8, 23) == want, "%a -> %a, want %a", d,
           kiln_round_to_format(d, 8, 23), want);
  }
}
END_TEST

/* Tricky doubles and what they become, computed with numpy 2.4.6 and
 * ml_dtypes 0.6.0: f16 from np.float64(x).astype(np.float16) (numpy rounds
 * double -> half once), bf16 as rounded once from the double, and what
 * ml_dtypes gives for np.float64(x).astype(bfloat16). ml_dtypes converts a
 * double to bf16 through f32, rounding twice; Kiln rounds once, as the header
 * promises. The two differ exactly where the f32 step lands on a bf16 tie
 * (rows marked "double rounding"); Kiln's answer there is the correctly
 * rounded one, checked against an exact rational computation. */
static const struct {
  double x;
  uint16_t f16, bf16, ml_dtypes_bf16;
  const char *why;
} TRICKY[] = {
    {0x1.0000000000000p+0, 0x3c00, 0x3f80, 0x3f80, "one"},
    {0x1.0100000000000p+0, 0x3c04, 0x3f80, 0x3f80, "bf16 tie at 1: to even (down)"},
    {0x1.0300000000000p+0, 0x3c0c, 0x3f82, 0x3f82, "bf16 tie: to even (up)"},
    {0x1.0100000001000p+0, 0x3c04, 0x3f81, 0x3f80, "just above a bf16 tie (double rounding)"},
    {0x1.00ffffffff000p+0, 0x3c04, 0x3f80, 0x3f80, "just below a bf16 tie"},
    {0x1.02fffffc00000p+0, 0x3c0c, 0x3f81, 0x3f82, "just below a bf16 tie (double rounding)"},
    {0x1.0020000000000p+0, 0x3c00, 0x3f80, 0x3f80, "f16 tie at 1: to even (down)"},
    {0x1.0020000000004p+0, 0x3c01, 0x3f80, 0x3f80, "just above an f16 tie"},
    {0x1.0060000000000p+0, 0x3c02, 0x3f80, 0x3f80, "f16 tie: to even (up)"},
    {0x1.999999999999ap-4, 0x2e66, 0x3dcd, 0x3dcd, "0.1"},
    {-0x1.4000000000000p+1, 0xc100, 0xc020, 0xc020, "-2.5"},
    {0x1.9200000000000p+1, 0x4248, 0x4049, 0x4049, "3.140625"},
    {0x1.ffc0000000000p+15, 0x7bff, 0x4780, 0x4780, "f16 max"},
    {0x1.ffdffae147ae1p+15, 0x7bff, 0x4780, 0x4780, "just below f16's overflow threshold"},
    {0x1.ffe0000000000p+15, 0x7c00, 0x4780, 0x4780, "f16 overflow threshold: ties to inf"},
    {0x1.0000000000000p-14, 0x0400, 0x3880, 0x3880, "f16 min normal"},
    {0x1.0000000000000p-24, 0x0001, 0x3380, 0x3380, "f16 min subnormal"},
    {0x1.0000000000000p-25, 0x0000, 0x3300, 0x3300, "half the f16 min subnormal: to zero"},
    {0x1.0000000020000p-25, 0x0001, 0x3300, 0x3300, "just above half the f16 min subnormal"},
    {0x1.8000000000000p-24, 0x0002, 0x33c0, 0x33c0, "f16 subnormal tie: to even (up)"},
    {0x1.fe00000000000p+127, 0x7c00, 0x7f7f, 0x7f7f, "bf16 max"},
    {0x1.ff00000000001p+127, 0x7c00, 0x7f80, 0x7f80, "just above bf16's overflow threshold"},
    {0x1.0000000000000p-133, 0x0000, 0x0001, 0x0001, "bf16 min subnormal"},
    {0x1.0000004000000p-134, 0x0000, 0x0001, 0x0000,
     "just above half the bf16 min subnormal (double rounding)"},
    {0x1.0101000000000p-130, 0x0000, 0x0008, 0x0008, "bf16 subnormal, rounds down"},
    {0x1.7e43c8800759cp+996, 0x7c00, 0x7f80, 0x7f80, "1e300"},
    {-0x1.56e1fc2f8f359p-997, 0x8000, 0x8000, 0x8000, "-1e-300: -0"},
};

START_TEST(fp16_tricky_values_table) {
  int double_rounding_rows = 0;
  for (size_t i = 0; i < sizeof TRICKY / sizeof TRICKY[0]; i++) {
    double x = TRICKY[i].x;
    ck_assert_msg(kiln_f64_to_f16(x) == TRICKY[i].f16, "f16(%a) [%s] = 0x%04x, want 0x%04x", x,
                  TRICKY[i].why, kiln_f64_to_f16(x), TRICKY[i].f16);
    ck_assert_msg(kiln_f64_to_bf16(x) == TRICKY[i].bf16, "bf16(%a) [%s] = 0x%04x, want 0x%04x", x,
                  TRICKY[i].why, kiln_f64_to_bf16(x), TRICKY[i].bf16);
    /* Rounding through f32 first reproduces ml_dtypes' answer. */
    ck_assert_msg(kiln_f64_to_bf16((double)(float)x) == TRICKY[i].ml_dtypes_bf16,
                  "bf16((float)%a) [%s]", x, TRICKY[i].why);
    double_rounding_rows += TRICKY[i].bf16 != TRICKY[i].ml_dtypes_bf16;
  }
  ck_assert_int_eq(double_rounding_rows, 3);
}
END_TEST

/* ---- deadlines ------------------------------------------------------------ */

START_TEST(deadline_checks) {
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__deadline_check("nothing installed", &st), 0);
  atomic_int cancelled = 0;
  kiln_deadline far = {.at_ns = kiln__deadline_now_ns() + INT64_C(60000000000),
                       .cancelled = &cancelled};
  ck_assert_ptr_null(kiln__deadline_install(&far));
  ck_assert_int_eq(kiln__deadline_check("fusion", &st), 0);
  kiln_deadline past = {.at_ns = kiln__deadline_now_ns() - 1, .limit = "the test's limit"};
  ck_assert_ptr_eq(kiln__deadline_install(&past), &far);
  ck_assert_int_eq(kiln__deadline_check("fusion", &st), KILN_EDEADLINE);
  ck_assert_str_eq(st.where, "fusion");
  ck_assert_str_eq(st.msg, "the test's limit passed during fusion");
  ck_assert_ptr_eq(kiln__deadline_install(&far), &past);
  atomic_store(&cancelled, 1);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__deadline_check("grad", &st), KILN_ECANCELED);
  ck_assert_str_eq(st.msg, "the caller cancelled the call during grad");
  kiln_deadline none = {0}; /* no time limit, no flag */
  kiln__deadline_install(&none);
  ck_assert_int_eq(kiln__deadline_check("grad", NULL), 0);
  ck_assert_ptr_eq(kiln__deadline_install(NULL), &none);
}
END_TEST

/* ---- runner ------------------------------------------------------------ */

static Suite *common_suite(void) {
  Suite *s = suite_create("common");

  TCase *deadline = tcase_create("deadline");
  tcase_add_test(deadline, deadline_checks);
  suite_add_tcase(s, deadline);

  TCase *arena = tcase_create("arena");
  tcase_add_checked_fixture(arena, NULL, reset_alloc_hook);
  tcase_add_test(arena, arena_alignment);
  tcase_add_test(arena, arena_used_counts_rounded_sizes);
  tcase_add_test(arena, arena_large_blocks);
  tcase_add_test(arena, arena_reset_keeps_one_block);
  tcase_add_test(arena, arena_many_small_allocations);
  tcase_add_test(arena, arena_calloc_zeroes_and_checks_overflow);
  tcase_add_test(arena, arena_dup_helpers);
  tcase_add_test(arena, arena_out_of_memory);
  tcase_add_test(arena, arena_destroy_null);
  suite_add_tcase(s, arena);

  TCase *sbuf = tcase_create("sbuf");
  tcase_add_checked_fixture(sbuf, NULL, reset_alloc_hook);
  tcase_add_test(sbuf, sbuf_empty);
  tcase_add_test(sbuf, sbuf_growth);
  tcase_add_test(sbuf, sbuf_printf);
  tcase_add_test(sbuf, sbuf_detach);
  tcase_add_test(sbuf, sbuf_sticky_failure);
  tcase_add_test(sbuf, sbuf_failure_on_first_allocation);
  suite_add_tcase(s, sbuf);

  TCase *status = tcase_create("status");
  tcase_add_test(status, status_first_error_wins);
  tcase_add_test(status, status_null_is_allowed);
  tcase_add_test(status, status_format);
  tcase_add_test(status, status_long_message_truncated);
  tcase_add_test(status, status_names);
  suite_add_tcase(s, status);

  TCase *alloc = tcase_create("alloc");
  tcase_add_checked_fixture(alloc, NULL, reset_alloc_hook);
  tcase_add_test(alloc, alloc_fail_nth);
  tcase_add_test(alloc, alloc_fail_once);
  tcase_add_test(alloc, alloc_fail_once_threads);
  tcase_add_test(alloc, alloc_fail_each_position);
  tcase_add_test(alloc, alloc_zero_sizes_and_strings);
  tcase_add_test(alloc, alloc_grow);
  suite_add_tcase(s, alloc);

  TCase *fp = tcase_create("fp16");
  tcase_set_timeout(fp, 120); /* exhaustive loops; slow under sanitizers */
  tcase_add_loop_test(fp, fp16_roundtrip_all_patterns, 0, 2);
  tcase_add_loop_test(fp, fp16_decode_is_monotonic, 0, 2);
  tcase_add_loop_test(fp, fp16_midpoints_round_to_even, 0, 2);
  tcase_add_loop_test(fp, fp16_overflow_nan_zero_subnormal, 0, 2);
  tcase_add_test(fp, bf16_is_top_half_of_f32);
  tcase_add_test(fp, f16_matches_compiler_float16);
  tcase_add_test(fp, f32_rounding_matches_float_cast);
  tcase_add_test(fp, fp16_tricky_values_table);
  suite_add_tcase(s, fp);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(common_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
