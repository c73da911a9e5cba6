/* The NCCL id rendezvous through Redis (cache/rendezvous.c) against a real
 * redis-server, with a fake communicator: each rank "initializes" from the
 * id it got, and the mesh is whole when every rank holds rank 0's bytes.
 * Rank 0 mints with NCCL's ncclGetUniqueId where libnccl loads (no GPU
 * needed), else with made-up bytes. Waiting ranks see the id published
 * late; a rank whose rank 0 never comes gets KILN_EDEADLINE at its
 * deadline, never a hang; two minters agree (SET NX); a value of another
 * size and an unreachable Redis are clear statuses. Without redis-server
 * the cases that need it skip, saying so.
 */
#include <check.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/rendezvous.h"
#include "tests/support/redis_server.h"
#ifdef KILN_HAVE_CUDA
#include "executor/cuda/nccl.h"
#endif

#define ID_BYTES 128

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int fake_mint(void *ctx, uint8_t *id, size_t n, kiln_status *st) {
  (void)st;
  unsigned seed = ctx ? *(unsigned *)ctx : 7;
  for (size_t i = 0; i < n; i++) id[i] = (uint8_t)rand_r(&seed);
  return 0;
}

/* NCCL's minter where it loads, else the fake one. */
static kiln_rendezvous_mint_fn minter(void) {
#ifdef KILN_HAVE_CUDA
  uint8_t id[ID_BYTES];
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_nccl_mint_id(NULL, id, sizeof id, &st) == 0) return kiln_nccl_mint_id;
  fprintf(stderr, "NCCL cannot mint here (%s): made-up ids\n", st.msg);
#endif
  return fake_mint;
}

static kiln_test_redis *start_redis(void) {
  const char *why = NULL;
  if (!kiln_test_redis_available(&why)) {
    fprintf(stderr, "skipped: %s\n", why);
    return NULL;
  }
  kiln_test_redis *r = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_test_redis_start(NULL, &r, &st) == 0, "redis-server: %s", st.msg);
  return r;
}

/* The fake communicator: one per rank, made from the id it got. */
typedef struct fake_comm {
  kiln_rendezvous_options o;
  uint32_t delay_ms; /* before the rank arrives */
  uint8_t id[ID_BYTES];
  int rc;
  kiln_status st;
} fake_comm;

static void *rank_main(void *arg) {
  fake_comm *c = arg;
  if (c->delay_ms) usleep(c->delay_ms * 1000u);
  kiln_status_clear(&c->st);
  c->rc = kiln_rendezvous_id(&c->o, c->id, &c->st);
  return NULL;
}

START_TEST(ranks_agree_on_rank_0s_id) {
  kiln_test_redis *r = start_redis();
  if (r == NULL) return;
  enum { N = 4 };
  fake_comm c[N];
  pthread_t t[N];
  memset(c, 0, sizeof c);
  for (uint32_t i = 0; i < N; i++) {
    c[i].o = (kiln_rendezvous_options){.redis = kiln_test_redis_addr(r),
                                       .key = "kiln:nccl:mesh-a:1",
                                       .rank = i,
                                       .id_bytes = ID_BYTES,
                                       .timeout_s = 10,
                                       .ttl_s = 60,
                                       .mint = minter()};
    c[i].delay_ms = i == 0 ? 300 : 0; /* the others wait for rank 0 */
    pthread_create(&t[i], NULL, rank_main, &c[i]);
  }
  for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < N; i++) {
    ck_assert_msg(c[i].rc == 0, "rank %d: %s", i, c[i].st.msg);
    ck_assert(memcmp(c[i].id, c[0].id, ID_BYTES) == 0);
  }
  /* the id has its TTL */
  redisReply *ttl = kiln_test_redis_command(r, "TTL %s", "kiln:nccl:mesh-a:1");
  ck_assert_ptr_nonnull(ttl);
  ck_assert(ttl->type == REDIS_REPLY_INTEGER && ttl->integer > 0 && ttl->integer <= 60);
  freeReplyObject(ttl);
  kiln_test_redis_destroy(r);
}
END_TEST

START_TEST(two_minters_agree) {
  kiln_test_redis *r = start_redis();
  if (r == NULL) return;
  unsigned s1 = 1, s2 = 2;
  uint8_t a[ID_BYTES], b[ID_BYTES];
  kiln_status st;
  kiln_status_clear(&st);
  kiln_rendezvous_options o = {.redis = kiln_test_redis_addr(r),
                               .key = "kiln:nccl:mesh-b:1",
                               .rank = 0,
                               .id_bytes = ID_BYTES,
                               .mint = fake_mint,
                               .mint_ctx = &s1};
  ck_assert_int_eq(kiln_rendezvous_id(&o, a, &st), 0);
  o.mint_ctx = &s2; /* a restarted rank 0 of the same generation */
  ck_assert_int_eq(kiln_rendezvous_id(&o, b, &st), 0);
  ck_assert(memcmp(a, b, ID_BYTES) == 0);
  kiln_test_redis_destroy(r);
}
END_TEST

START_TEST(missing_rank_0_is_a_deadline) {
  kiln_test_redis *r = start_redis();
  if (r == NULL) return;
  uint8_t id[ID_BYTES];
  kiln_status st;
  kiln_status_clear(&st);
  kiln_rendezvous_options o = {.redis = kiln_test_redis_addr(r),
                               .key = "kiln:nccl:mesh-c:1",
                               .rank = 2,
                               .id_bytes = ID_BYTES,
                               .timeout_s = 0.3};
  double t0 = now_s();
  ck_assert_int_eq(kiln_rendezvous_id(&o, id, &st), KILN_EDEADLINE);
  double took = now_s() - t0;
  ck_assert_msg(took >= 0.25 && took < 3, "took %.2f s", took);
  ck_assert_msg(strstr(st.msg, "rank 2") && strstr(st.msg, "kiln:nccl:mesh-c:1"), "%s", st.msg);
  /* a value that is not an id */
  redisReply *set = kiln_test_redis_command(r, "SET %s %s", "kiln:nccl:mesh-d:1", "short");
  ck_assert_ptr_nonnull(set);
  freeReplyObject(set);
  o.key = "kiln:nccl:mesh-d:1";
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_rendezvous_id(&o, id, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "not a 128-byte id"), "%s", st.msg);
  kiln_test_redis_destroy(r);
}
END_TEST

START_TEST(unreachable_redis_and_bad_options) {
  uint8_t id[ID_BYTES];
  kiln_status st;
  kiln_status_clear(&st);
  kiln_rendezvous_options o = {
      .redis = "127.0.0.1:1", .key = "k", .rank = 1, .id_bytes = ID_BYTES, .timeout_s = 1};
  ck_assert_int_eq(kiln_rendezvous_id(&o, id, &st), KILN_EUNAVAIL);
  ck_assert_msg(strstr(st.msg, "cannot be reached"), "%s", st.msg);
  o.rank = 0; /* rank 0 without a minter */
  ck_assert_int_eq(kiln_rendezvous_id(&o, id, &st), KILN_EINVAL);
  o.redis = "nocolon";
  o.mint = fake_mint;
  ck_assert_int_eq(kiln_rendezvous_id(&o, id, &st), KILN_EINVAL);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rendezvous");
  TCase *c = tcase_create("redis");
  tcase_set_timeout(c, 60);
  tcase_add_test(c, ranks_agree_on_rank_0s_id);
  tcase_add_test(c, two_minters_agree);
  tcase_add_test(c, missing_rank_0_is_a_deadline);
  tcase_add_test(c, unreachable_redis_and_bad_options);
  suite_add_tcase(s, c);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
