/* Load: 16 clients, each on its own connection and thread, send 1,000
 * mixed requests apiece (compiles, executions, uploads, downloads,
 * releases) and every one must succeed with the right answer.
 *
 * The mix is deterministic per client. Executions run one shared program
 * (a*x + y over f32[1024], 4 KiB in and out) with small integers, so
 * results are exact; downloads compare every byte with what was uploaded;
 * compiles alternate between the shared program (a cache hit) and a
 * program of the client's own (a real compile on the interpreter backend).
 * At the end every client releases what it still holds and the server must
 * be back to the buffers it had before.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "clients/c/kiln.h"
#include "tests/integration/itest.h"

#define NCLIENTS 16
#define NREQUESTS 1000
#define N 1024
#define MAX_HELD 32

static itest_kilnd server;

static const char shared_text[] = "HloModule load_axpy\n"
                                  "ENTRY main {\n"
                                  "  a = f32[] parameter(0)\n"
                                  "  x = f32[1024] parameter(1)\n"
                                  "  y = f32[1024] parameter(2)\n"
                                  "  ab = f32[1024] broadcast(a), dimensions={}\n"
                                  "  ax = f32[1024] multiply(ab, x)\n"
                                  "  ROOT r = f32[1024] add(ax, y)\n"
                                  "}\n";

typedef struct held {
  char handle[128];
  uint64_t seed;
  size_t n; /* elements (u32) */
} held;

typedef struct worker {
  int id;
  kiln_client *c;
  uint64_t rng;
  char *shared_id;
  held held[MAX_HELD];
  int nheld;
  int errors;
  char first_error[1600];
  long counts[5]; /* compile, execute, put, get, release */
} worker;

static uint64_t next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void error(worker *w, const char *what, const kiln_status *st) {
  if (w->errors++ == 0)
    snprintf(w->first_error, sizeof w->first_error, "client %d: %s: %s: %s", w->id, what,
             st ? st->where : "", st ? st->msg : "");
}

static void fill(uint32_t *v, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) v[i] = (uint32_t)(seed * 2654435761u + i * 40503u);
}

static void do_compile(worker *w, int i) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_executable *e = NULL;
  if (i % 2 == 0) {
    if (kiln_client_compile_text(w->c, shared_text, sizeof shared_text - 1, NULL, &e, &st)) {
      error(w, "compile shared", &st);
      return;
    }
    if (strcmp(e->id, w->shared_id) != 0) error(w, "compile shared: another id", NULL);
  } else {
    char text[512];
    snprintf(text, sizeof text,
             "HloModule own_%d_%d\nENTRY main {\n  x = f32[4] parameter(0)\n"
             "  c = f32[] constant(%d)\n  cb = f32[4] broadcast(c), dimensions={}\n"
             "  ROOT r = f32[4] add(x, cb)\n}\n",
             w->id, i, w->id * 10000 + i);
    kiln_remote_compile_options o = {.backend = "interp"};
    if (kiln_client_compile_text(w->c, text, strlen(text), &o, &e, &st)) {
      error(w, "compile own", &st);
      return;
    }
    if (e->nparams != 1) error(w, "compile own: wrong signature", NULL);
  }
  kiln_remote_executable_free(e);
}

static void do_execute(worker *w, kiln_literal *a, kiln_literal *x, kiln_literal *y) {
  float av = (float)(next(&w->rng) % 8);
  ((float *)a->data)[0] = av;
  float *xv = x->data, *yv = y->data;
  for (int k = 0; k < N; k++) {
    xv[k] = (float)(int)(next(&w->rng) % 64);
    yv[k] = (float)(int)(next(&w->rng) % 64) - 32;
  }
  kiln_remote_arg args[3] = {{.literal = a}, {.literal = x}, {.literal = y}};
  kiln_remote_result r;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_execute(w->c, w->shared_id, args, 3, NULL, &r, &st)) {
    error(w, "execute", &st);
    return;
  }
  const kiln_literal *out = r.noutputs == 1 ? r.outputs[0].literal : NULL;
  if (out == NULL || out->nbytes != N * 4) {
    error(w, "execute: wrong output", NULL);
  } else {
    const float *o = out->data;
    for (int k = 0; k < N; k++)
      if (o[k] != av * xv[k] + yv[k]) {
        error(w, "execute: wrong value", NULL);
        break;
      }
  }
  kiln_remote_result_free(&r);
}

static void do_put(worker *w) {
  if (w->nheld == MAX_HELD) return;
  size_t n = 1 + next(&w->rng) % 16384; /* up to 64 KiB */
  uint64_t seed = next(&w->rng);
  uint32_t *v = malloc(n * 4);
  fill(v, n, seed);
  kiln_arena *ar = kiln_arena_create();
  kiln_shape shape;
  int64_t dim = (int64_t)n;
  kiln_shape_make_array(ar, &shape, KILN_U32, &dim, 1);
  kiln_remote_buffer info;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_put_buffer_raw(w->c, &shape, v, n * 4, NULL, &info, &st)) {
    error(w, "put", &st);
  } else {
    held *h = &w->held[w->nheld++];
    snprintf(h->handle, sizeof h->handle, "%s", info.handle);
    h->seed = seed;
    h->n = n;
    kiln_remote_buffer_clear(&info);
  }
  kiln_arena_destroy(ar);
  free(v);
}

static void do_get(worker *w) {
  if (w->nheld == 0) {
    do_put(w);
    return;
  }
  held *h = &w->held[next(&w->rng) % (uint64_t)w->nheld];
  uint32_t *want = malloc(h->n * 4), *got = malloc(h->n * 4);
  fill(want, h->n, h->seed);
  size_t nbytes;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_get_buffer_raw(w->c, h->handle, NULL, got, h->n * 4, &nbytes, NULL, &st))
    error(w, "get", &st);
  else if (nbytes != h->n * 4 || memcmp(want, got, nbytes) != 0)
    error(w, "get: data differs from what was put", NULL);
  free(want);
  free(got);
}

static void do_release(worker *w) {
  if (w->nheld == 0) {
    do_put(w);
    return;
  }
  int k = (int)(next(&w->rng) % (uint64_t)w->nheld);
  const char *h[1] = {w->held[k].handle};
  int64_t released;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_release_buffers(w->c, h, 1, &released, NULL, &st))
    error(w, "release", &st);
  else if (released != 1)
    error(w, "release: the handle was not released", NULL);
  w->held[k] = w->held[--w->nheld];
}

static void *run_worker(void *arg) {
  worker *w = arg;
  char id[32];
  snprintf(id, sizeof id, "load-%d", w->id);
  kiln_client_options o = {.client_id = id};
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_connect(server.addr, &o, &w->c, &st)) {
    error(w, "connect", &st);
    return NULL;
  }
  kiln_remote_executable *e = NULL;
  if (kiln_client_compile_text(w->c, shared_text, sizeof shared_text - 1, NULL, &e, &st)) {
    error(w, "first compile", &st);
    kiln_client_close(w->c);
    return NULL;
  }
  w->shared_id = strdup(e->id);
  kiln_remote_executable_free(e);
  kiln_literal *a, *x, *y;
  kiln_arena *ar = kiln_arena_create();
  kiln_shape s0, s1;
  int64_t n = N;
  kiln_shape_make_array(ar, &s0, KILN_F32, NULL, 0);
  kiln_shape_make_array(ar, &s1, KILN_F32, &n, 1);
  kiln_literal_create(NULL, &s0, 0, &a, NULL);
  kiln_literal_create(NULL, &s1, 0, &x, NULL);
  kiln_literal_create(NULL, &s1, 0, &y, NULL);
  for (int i = 0; i < NREQUESTS; i++) {
    int kind = (int)(next(&w->rng) % 10);
    if (kind == 0)
      do_compile(w, i), w->counts[0]++;
    else if (kind <= 4)
      do_execute(w, a, x, y), w->counts[1]++;
    else if (kind <= 6)
      do_put(w), w->counts[2]++;
    else if (kind <= 8)
      do_get(w), w->counts[3]++;
    else
      do_release(w), w->counts[4]++;
  }
  while (w->nheld) do_release(w);
  kiln_literal_destroy(a);
  kiln_literal_destroy(x);
  kiln_literal_destroy(y);
  kiln_arena_destroy(ar);
  free(w->shared_id);
  kiln_client_close(w->c);
  return NULL;
}

static int64_t live_buffers(void) {
  kiln_client *c;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_connect(server.addr, NULL, &c, &st) == 0, "%s", st.msg);
  kiln_server_stats s;
  ck_assert_msg(kiln_client_stats(c, &s, &st) == 0, "%s", st.msg);
  int64_t live = s.live_buffers;
  kiln_server_stats_clear(&s);
  kiln_client_close(c);
  return live;
}

START_TEST(test_mixed_load) {
  int64_t live0 = live_buffers();
  static worker w[NCLIENTS];
  pthread_t t[NCLIENTS];
  double t0 = itest_now();
  for (int i = 0; i < NCLIENTS; i++) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].id = i;
    w[i].rng = 1000 + (uint64_t)i;
    ck_assert_int_eq(pthread_create(&t[i], NULL, run_worker, &w[i]), 0);
  }
  int errors = 0;
  long counts[5] = {0};
  const char *first = NULL;
  for (int i = 0; i < NCLIENTS; i++) {
    pthread_join(t[i], NULL);
    errors += w[i].errors;
    if (w[i].errors && first == NULL) first = w[i].first_error;
    for (int k = 0; k < 5; k++) counts[k] += w[i].counts[k];
  }
  double secs = itest_now() - t0;
  printf("test_load: %d clients x %d requests in %.2f s (%.0f req/s): %ld compiles, %ld "
         "executes, %ld puts, %ld gets, %ld releases; %d errors\n",
         NCLIENTS, NREQUESTS, secs, NCLIENTS * NREQUESTS / secs, counts[0], counts[1], counts[2],
         counts[3], counts[4], errors);
  ck_assert_msg(errors == 0, "%d errors; first: %s", errors, first);
  ck_assert_int_eq(live_buffers(), live0);
}
END_TEST

/* One kiln_client shared by 8 threads: calls on it need no lock. */
typedef struct sharer {
  kiln_client *c;
  const char *id;
  int n, errors;
  char first_error[1200];
} sharer;

static void *share_worker(void *arg) {
  sharer *w = arg;
  kiln_status st;
  kiln_arena *ar = kiln_arena_create();
  kiln_shape s0, s1;
  int64_t n = N;
  kiln_shape_make_array(ar, &s0, KILN_F32, NULL, 0);
  kiln_shape_make_array(ar, &s1, KILN_F32, &n, 1);
  kiln_literal *a, *x;
  kiln_literal_create(NULL, &s0, 0, &a, NULL);
  kiln_literal_create(NULL, &s1, 0, &x, NULL);
  ((float *)a->data)[0] = 2;
  for (int k = 0; k < N; k++) ((float *)x->data)[k] = (float)k;
  for (int i = 0; i < w->n; i++) {
    kiln_status_clear(&st);
    kiln_remote_arg args[3] = {{.literal = a}, {.literal = x}, {.literal = x}};
    kiln_remote_result r;
    if (kiln_client_execute(w->c, w->id, args, 3, NULL, &r, &st)) {
      if (w->errors++ == 0) snprintf(w->first_error, sizeof w->first_error, "%s", st.msg);
      continue;
    }
    if (((const float *)r.outputs[0].literal->data)[N - 1] != 3.0f * (N - 1) && w->errors++ == 0)
      snprintf(w->first_error, sizeof w->first_error, "wrong value");
    kiln_remote_result_free(&r);
    kiln_remote_buffer h;
    if (kiln_client_put_buffer(w->c, x, NULL, &h, &st) == 0) {
      const char *hs[1] = {h.handle};
      kiln_client_release_buffers(w->c, hs, 1, NULL, NULL, &st);
      kiln_remote_buffer_clear(&h);
    } else if (w->errors++ == 0) {
      snprintf(w->first_error, sizeof w->first_error, "put: %s", st.msg);
    }
  }
  kiln_literal_destroy(a);
  kiln_literal_destroy(x);
  kiln_arena_destroy(ar);
  return NULL;
}

START_TEST(test_shared_client) {
  kiln_client *c;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_connect(server.addr, NULL, &c, &st), 0);
  kiln_remote_executable *e;
  ck_assert_int_eq(kiln_client_compile_text(c, shared_text, sizeof shared_text - 1, NULL, &e, &st),
                   0);
  sharer w[8];
  pthread_t t[8];
  for (int i = 0; i < 8; i++) {
    w[i] = (sharer){.c = c, .id = e->id, .n = 250};
    ck_assert_int_eq(pthread_create(&t[i], NULL, share_worker, &w[i]), 0);
  }
  for (int i = 0; i < 8; i++) {
    pthread_join(t[i], NULL);
    ck_assert_msg(w[i].errors == 0, "thread %d: %d errors; first: %s", i, w[i].errors,
                  w[i].first_error);
  }
  kiln_remote_executable_free(e);
  kiln_client_close(c);
}
END_TEST

int main(void) {
  itest_require_kilnd("test_load");
  const char *extra[] = {"--cpu-devices", "2", NULL};
  if (itest_kilnd_start(&server, extra)) return 1;
  Suite *s = suite_create("load");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_mixed_load);
  tcase_add_test(tc, test_shared_client);
  suite_add_tcase(s, tc);
  return itest_run_suite("test_load", s, &server);
}
