/* The cuda backend's collectives through NCCL, without a GPU: the fake
 * driver (tests/fake_cuda/fake_cuda.c, KILN_CUDA_DRIVER) with eight
 * devices and the fake libnccl beside it (fake_nccl.c, KILN_NCCL_LIB),
 * which moves the data between the fake devices of this process and checks
 * every argument the backend passes (buffers and streams of the
 * communicator's device, matching calls on every rank).
 *
 * Per-device programs with collectives are compiled for cuda-sm_90 and
 * for cpu (whose kernels the fake driver calls in place of the cubin's, as
 * test_cuda_fake does), run as a gang on the fake cuda mesh, and compared
 * rank by rank with the cpu mesh on the same program (itself checked
 * against the interpreter by test_cpu_mesh). Also: communicators created
 * once per group and reused; kiln_comm collectives driven from one thread
 * (grouped calls); reductions NCCL cannot do refused at load; NCCL errors
 * and missing peers as statuses naming the call, never a hang; and a mesh
 * across "hosts" (two threads, one device each) agreeing on its id through
 * a real redis-server, including the rendezvous that times out.
 */
#include <check.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "executor/backend.h"
#include "executor/run.h"

#if defined(KILN_HAVE_CUDA) && defined(KILN_FAKE_CUDA) && defined(KILN_FAKE_NCCL)
#include "executor/cuda/cuda.h"
#include "executor/cuda/nccl.h"
#ifdef KILN_TEST_HAVE_CACHE
#include "server/mesh.h"
#include "tests/support/hostkernels.h"
#include "tests/support/redis_server.h"
#endif

#define NDEV 8

typedef kiln_test_kernel_fn kernel_fn;
typedef struct fake_nccl_stats {
  long inits, live_comms, collectives, p2p, groups, bad_args, aborts, destroys;
} fake_nccl_stats;

static void (*set_kernels)(kernel_fn *, unsigned);
static void (*nccl_stats_get)(fake_nccl_stats *);
static void (*nccl_fail)(const char *, long, int);
static void (*cuda_fail)(const char *, long, int);
static double run_timeout = 30; /* a gang run's time limit, seconds */

/* Both fakes' own handles (the backend opened them first). */
static void fakes_open(void) {
  ck_assert_uint_ne(kiln_backend_caps("cuda"), 0);
  void *fc = dlopen(KILN_FAKE_CUDA, RTLD_NOW | RTLD_NOLOAD);
  ck_assert_msg(fc != NULL, "%s", dlerror());
  void *p = dlsym(fc, "kiln_fake_cuda_set_kernels");
  memcpy(&set_kernels, &p, sizeof p);
  p = dlsym(fc, "kiln_fake_cuda_fail");
  memcpy(&cuda_fail, &p, sizeof p);
  kiln_status st;
  kiln_status_clear(&st);
  uint8_t id[KILN_NCCL_ID_BYTES];
  ck_assert_msg(kiln_nccl_mint_id(NULL, id, sizeof id, &st) == 0, "%s", st.msg); /* loads it */
  void *fnl = dlopen(KILN_FAKE_NCCL, RTLD_NOW | RTLD_NOLOAD);
  ck_assert_msg(fnl != NULL, "%s", dlerror());
  p = dlsym(fnl, "kiln_fake_nccl_stats");
  memcpy(&nccl_stats_get, &p, sizeof p);
  p = dlsym(fnl, "kiln_fake_nccl_fail");
  memcpy(&nccl_fail, &p, sizeof p);
  ck_assert(set_kernels && cuda_fail && nccl_stats_get && nccl_fail);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static fake_nccl_stats nstats(void) {
  fake_nccl_stats s;
  nccl_stats_get(&s);
  return s;
}

/* ---- programs on the fake mesh ---------------------------------------------- */

static kiln_module *parse(const char *text) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st) == 0, "%s\n%s",
                st.msg, text);
  ck_assert_msg(kiln_module_verify(m, NULL, &st) == 0, "%s", st.msg);
  return m;
}

static int compile(kiln_module *m, const char *target, kiln_executable **e, kiln_status *st) {
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.target = target;
  return kiln_compile(m, &o, e, NULL, st);
}

/* Prints each rank's result, "|"-separated. */
static void print_ranks(kiln_literal **outs, uint32_t n, char *out, size_t size) {
  kiln_sbuf b = KILN_SBUF_INIT;
  for (uint32_t k = 0; k < n; k++) {
    if (k) kiln_sbuf_putc(&b, '|');
    kiln_literal_print(&b, outs[k], false);
  }
  snprintf(out, size, "%s", kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
}

/* Runs text (no parameters) on R x P fake cuda devices as one gang, twice
 * when `twice` (the second run reuses the communicators). 1 when the two
 * compiles differ (skipped), else the run's code. */
static int run_cuda(const char *text, uint32_t R, uint32_t P, bool twice, char *out, size_t size,
                    kiln_status *st) {
  kiln_module *m = parse(text);
  m->replica_count = R;
  m->num_partitions = P;
  uint32_t n = R * P;
  kiln_executable *e = NULL, *ce = NULL;
  kiln_status_clear(st);
  int rc = compile(m, "cuda-sm_90", &e, st);
  if (rc == 0) rc = compile(m, "cpu", &ce, st);
  kiln_module_destroy(m);
  if (rc) {
    kiln_executable_destroy(e);
    kiln_executable_destroy(ce);
    return rc;
  }
  if (!kiln_test_same_program(e, ce)) {
    kiln_executable_destroy(e);
    kiln_executable_destroy(ce);
    return 1;
  }
  void *dl = NULL;
  kernel_fn *fns = kiln_test_cpu_kernels(ce, &dl);
  set_kernels(fns, ce->nkernels);
  kiln_backend_options bo = {.ndevices = n};
  kiln_backend *b = NULL;
  kiln_comm *comm = NULL;
  kiln_mesh *mesh = NULL;
  kiln_device *devs[NDEV];
  kiln_literal *outs[NDEV] = {0};
  rc = kiln_backend_create("cuda", &bo, &b, st);
  for (uint32_t k = 0; rc == 0 && k < n; k++) devs[k] = kiln_backend_device(b, k);
  if (rc == 0) rc = kiln_comm_create(b, devs, n, &comm, st);
  if (rc == 0) rc = kiln_comm_load(comm, e, &mesh, st);
  kiln_run_options ro = {.timeout_seconds = run_timeout};
  for (int t = 0; rc == 0 && t < (twice ? 2 : 1); t++) {
    for (uint32_t k = 0; k < n; k++) kiln_literal_destroy(outs[k]);
    rc = kiln_mesh_run(mesh, NULL, 0, &ro, outs, st);
  }
  if (rc == 0) print_ranks(outs, n, out, size);
  for (uint32_t k = 0; k < n; k++) kiln_literal_destroy(outs[k]);
  kiln_mesh_destroy(mesh);
  kiln_comm_destroy(comm);
  kiln_backend_destroy(b);
  set_kernels(NULL, 0);
  if (dl) dlclose(dl);
  kiln_free(fns);
  kiln_executable_destroy(e);
  kiln_executable_destroy(ce);
  return rc;
}

static void run_cpu(const char *text, uint32_t R, uint32_t P, char *out, size_t size) {
  kiln_module *m = parse(text);
  kiln_literal *outs[NDEV] = {0};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_run_options ro = {.timeout_seconds = 30};
  int rc = kiln_run_module_mesh(m, "cpu", &ro, R, P, NULL, 0, outs, &st);
  ck_assert_msg(rc == 0, "cpu mesh %u x %u: %s: %s\n%s", R, P, st.where, st.msg, text);
  print_ranks(outs, R * P, out, size);
  for (uint32_t k = 0; k < R * P; k++) kiln_literal_destroy(outs[k]);
  kiln_module_destroy(m);
}

static int skipped;

static void same_as_cpu(const char *text, uint32_t R, uint32_t P) {
  static char want[65536], got[65536];
  kiln_status st;
  run_cpu(text, R, P, want, sizeof want);
  int rc = run_cuda(text, R, P, false, got, sizeof got, &st);
  if (rc == 1) {
    fprintf(stderr, "skipped (the cuda and cpu compiles differ):\n%s", text);
    skipped++;
    return;
  }
  ck_assert_msg(rc == 0, "cuda mesh %u x %u: %s: %s\n%s", R, P, st.where, st.msg, text);
  ck_assert_msg(strcmp(got, want) == 0, "%u x %u:\n%s\ncuda %s\ncpu  %s", R, P, text, got, want);
}

static const char prelude[] =
    "HloModule c\n"
    "add {\n x = s32[] parameter(0)\n y = s32[] parameter(1)\n ROOT s = s32[] add(x, y)\n}\n"
    "max {\n x = s32[] parameter(0)\n y = s32[] parameter(1)\n ROOT s = s32[] maximum(x, y)\n}\n"
    "mul {\n x = s32[] parameter(0)\n y = s32[] parameter(1)\n ROOT s = s32[] multiply(x, y)\n}\n"
    "fadd {\n x = f32[] parameter(0)\n y = f32[] parameter(1)\n ROOT s = f32[] add(x, y)\n}\n"
    "por {\n x = pred[] parameter(0)\n y = pred[] parameter(1)\n ROOT s = pred[] or(x, y)\n}\n"
    "pand {\n x = pred[] parameter(0)\n y = pred[] parameter(1)\n ROOT s = pred[] and(x, y)\n}\n"
    "sand {\n x = s32[] parameter(0)\n y = s32[] parameter(1)\n ROOT s = s32[] and(x, y)\n}\n";

/* ENTRY with %id (s32 replica id), %v = s32[n] {id*n + i}, %one = s32[1]
 * {id}, %m = s32[2,n] rows v and v*3, %f = f32[n] {v / 4}, %p = pred[n]
 * {v % 3 == 0}; then body (its last line the ROOT). */
static void program(char *text, size_t size, int n, const char *body) {
  char three[64] = "";
  for (int i = 0; i < n; i++) strcat(three, i ? ",3" : "3");
  snprintf(text, size,
           "%sENTRY e {\n id0 = u32[] replica-id()\n id = s32[] convert(id0)\n"
           " nn = s32[] constant(%d)\n idn = s32[] multiply(id, nn)\n"
           " b = s32[%d] broadcast(idn), dimensions={}\n"
           " io = s32[%d] iota(), iota_dimension=0\n v = s32[%d] add(b, io)\n"
           " one = s32[1] reshape(id)\n three = s32[%d] constant({%s})\n"
           " v3 = s32[%d] multiply(v, three)\n r0 = s32[1,%d] reshape(v)\n"
           " r1 = s32[1,%d] reshape(v3)\n m = s32[2,%d] concatenate(r0, r1), dimensions={0}\n"
           " vf = f32[%d] convert(v)\n q = f32[] constant(0.25)\n qb = f32[%d] broadcast(q), "
           "dimensions={}\n f = f32[%d] multiply(vf, qb)\n"
           " rem = s32[%d] remainder(v, three)\n z = s32[] constant(0)\n zb = s32[%d] "
           "broadcast(z), dimensions={}\n p = pred[%d] compare(rem, zb), direction=EQ\n%s}\n",
           prelude, n, n, n, n, n, three, n, n, n, n, n, n, n, n, n, n, body);
}

/* body with every N replaced by n and NN by n * n. */
static void expand(char *out, size_t size, const char *body, int n) {
  size_t j = 0;
  for (const char *p = body; *p && j + 12 < size; p++) {
    if (p[0] == 'N' && p[1] == 'N') {
      j += (size_t)snprintf(out + j, size - j, "%d", n * n);
      p++;
    } else if (*p == 'N' && (p[-1] == '[' || p[-1] == ',')) {
      j += (size_t)snprintf(out + j, size - j, "%d", n);
    } else {
      out[j++] = *p;
    }
  }
  out[j] = 0;
}

/* Every collective in one program (one compile per mesh size): the
 * reductions NCCL does on s32, f32 and pred, the async form, several
 * operands at once, rows gathered, scattered and exchanged along a minor
 * dimension (the backend rearranges them through scratch), broadcasts,
 * permutes around the ring and along a line (the first rank gets zeros),
 * and the tuple all-to-all. */
static const char every_collective[] =
    " a1 = s32[N] all-reduce(v), replica_groups={}, to_apply=add\n"
    " a2 = s32[N] all-reduce(v), replica_groups={}, to_apply=max\n"
    " a3 = s32[N] all-reduce(v), replica_groups={}, to_apply=mul\n"
    " a4 = f32[N] all-reduce(f), replica_groups={}, to_apply=fadd\n"
    " a5 = pred[N] all-reduce(p), replica_groups={}, to_apply=por\n"
    " a6 = pred[N] all-reduce(p), replica_groups={}, to_apply=pand\n"
    " s7 = s32[N] all-reduce-start(v), replica_groups={}, to_apply=add\n"
    " a7 = s32[N] all-reduce-done(s7)\n"
    " a8 = (s32[N], s32[2,N]) all-reduce(v, m), replica_groups={}, to_apply=add\n"
    " g1 = s32[N] all-gather(one), replica_groups={}, dimensions={0}\n"
    " g2 = s32[2,NN] all-gather(m), replica_groups={}, dimensions={1}\n"
    " rs1 = s32[1] reduce-scatter(v), replica_groups={}, dimensions={0}, to_apply=add\n"
    " rs2 = s32[2,1] reduce-scatter(m), replica_groups={}, dimensions={1}, to_apply=max\n"
    " t1 = s32[N] all-to-all(v), replica_groups={}, dimensions={0}\n"
    " t2 = s32[2,N] all-to-all(m), replica_groups={}, dimensions={1}\n"
    " b1 = s32[1] collective-broadcast(one), replica_groups={}\n"
    " b2 = s32[2,N] collective-broadcast(m), replica_groups={}\n"
    " p1 = s32[N] collective-permute(v), source_target_pairs={RING}\n"
    " p2 = s32[2,N] collective-permute(m), source_target_pairs={LINE}\n"
    " t3 = (TSHAPES) all-to-all(TOPS), replica_groups={}\n"
    " ROOT out = (s32[N], s32[N], s32[N], f32[N], pred[N], pred[N], s32[N], (s32[N], s32[2,N]), "
    "s32[N], s32[2,NN], s32[1], s32[2,1], s32[N], s32[2,N], s32[1], s32[2,N], s32[N], s32[2,N], "
    "(TSHAPES)) tuple(a1, a2, a3, a4, a5, a6, a7, a8, g1, g2, rs1, rs2, t1, t2, b1, b2, p1, p2, "
    "t3)\n";

/* s with every `key` replaced by `val`. */
static void subst(char *s, size_t size, const char *key, const char *val) {
  char tmp[8192];
  size_t j = 0, kl = strlen(key);
  for (const char *p = s; *p && j + strlen(val) + 1 < sizeof tmp;) {
    if (strncmp(p, key, kl) == 0) {
      j += (size_t)snprintf(tmp + j, sizeof tmp - j, "%s", val);
      p += kl;
    } else {
      tmp[j++] = *p++;
    }
  }
  tmp[j] = 0;
  snprintf(s, size, "%s", tmp);
}

START_TEST(collectives_on_the_fake_mesh_equal_the_cpu_mesh) {
  fakes_open();
  static const int sizes[] = {2, 4};
  char text[16384], body[8192];
  for (size_t si = 0; si < 2; si++) {
    int n = sizes[si];
    char ring[256] = "", line[256] = "", ops[256] = "", shapes[256] = "";
    size_t pl = 0, ll = 0, ol = 0, sl = 0;
    for (int k = 0; k < n; k++) {
      pl +=
          (size_t)snprintf(ring + pl, sizeof ring - pl, "%s{%d,%d}", k ? "," : "", k, (k + 1) % n);
      if (k + 1 < n)
        ll += (size_t)snprintf(line + ll, sizeof line - ll, "%s{%d,%d}", k ? "," : "", k, k + 1);
      ol += (size_t)snprintf(ops + ol, sizeof ops - ol, "%sone", k ? ", " : "");
      sl += (size_t)snprintf(shapes + sl, sizeof shapes - sl, "%ss32[1]", k ? ", " : "");
    }
    expand(body, sizeof body, every_collective, n);
    subst(body, sizeof body, "RING", ring);
    subst(body, sizeof body, "LINE", line);
    subst(body, sizeof body, "TSHAPES", shapes);
    subst(body, sizeof body, "TOPS", ops);
    program(text, sizeof text, n, body);
    same_as_cpu(text, (uint32_t)n, 1);
  }
  /* Groups of a replicas x partitions mesh, and the ids. */
  static const char parts[] =
      "HloModule p\n"
      "add {\n x = u32[] parameter(0)\n y = u32[] parameter(1)\n ROOT s = u32[] add(x, y)\n}\n"
      "ENTRY e {\n r = u32[] replica-id()\n p = u32[] partition-id()\n ten = u32[] constant(10)\n"
      " rt = u32[] multiply(r, ten)\n x = u32[] add(rt, p)\n"
      " a = u32[] all-reduce(x), channel_id=1, replica_groups={{0,1},{2,3}}, "
      "use_global_device_ids=true, to_apply=add\n"
      " b = u32[] all-reduce(x), replica_groups={{0,1}}, to_apply=add\n"
      " c = u32[] collective-permute(x), channel_id=2, source_target_pairs={{0,1},{1,0}}\n"
      " d = u32[] collective-permute(x), source_target_pairs={{1,0}}\n"
      " ROOT t = (u32[], u32[], u32[], u32[], u32[]) tuple(a, b, x, c, d)\n}\n";
  same_as_cpu(parts, 2, 2);
  ck_assert_int_eq(skipped, 0); /* every case must really run */
  ck_assert_int_eq(nstats().bad_args, 0);
}
END_TEST

/* A while loop's collective: the same step, one round per iteration. */
START_TEST(a_collective_in_a_loop_reuses_its_communicator) {
  fakes_open();
  static const char text[] =
      "HloModule w\n"
      "add {\n x = s32[] parameter(0)\n y = s32[] parameter(1)\n ROOT s = s32[] add(x, y)\n}\n"
      "cond {\n s = (s32[], s32[3]) parameter(0)\n i = s32[] get-tuple-element(s), index=0\n"
      " k = s32[] constant(5)\n ROOT c = pred[] compare(i, k), direction=LT\n}\n"
      "body {\n s = (s32[], s32[3]) parameter(0)\n i = s32[] get-tuple-element(s), index=0\n"
      " v = s32[3] get-tuple-element(s), index=1\n"
      " g = s32[3] all-reduce(v), replica_groups={}, to_apply=add\n"
      " one = s32[] constant(1)\n j = s32[] add(i, one)\n ROOT t = (s32[], s32[3]) tuple(j, g)\n}\n"
      "ENTRY e {\n id0 = u32[] replica-id()\n id = s32[] convert(id0)\n"
      " v = s32[3] broadcast(id), dimensions={}\n z = s32[] constant(0)\n"
      " s = (s32[], s32[3]) tuple(z, v)\n"
      " w = (s32[], s32[3]) while(s), condition=cond, body=body\n"
      " ROOT r = s32[3] get-tuple-element(w), index=1\n}\n";
  char want[4096], got[4096];
  kiln_status st;
  run_cpu(text, 4, 1, want, sizeof want);
  fake_nccl_stats before = nstats();
  int rc = run_cuda(text, 4, 1, true, got, sizeof got, &st);
  ck_assert_msg(rc != 1, "the cuda and cpu compiles differ");
  ck_assert_msg(rc == 0, "%s: %s", st.where, st.msg);
  ck_assert_str_eq(got, want);
  fake_nccl_stats after = nstats();
  /* Two runs of five iterations, one communicator of four ranks. */
  ck_assert_int_eq(after.inits - before.inits, 4);
  ck_assert_int_eq(after.collectives - before.collectives, 2 * 5 * 4);
  ck_assert_int_eq(after.live_comms, 0); /* destroyed with the backend */
  ck_assert_int_eq(after.bad_args, 0);
}
END_TEST

/* What NCCL cannot reduce is refused when the program is loaded. */
START_TEST(reductions_nccl_cannot_do_are_refused_at_load) {
  fakes_open();
  static const char *const bad[] = {
      " ROOT r = s32[N] all-reduce(v), replica_groups={}, to_apply=sand\n",
  };
  char text[16384], body[1024];
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    expand(body, sizeof body, bad[i], 2);
    program(text, sizeof text, 2, body);
    char out[256];
    kiln_status st;
    int rc = run_cuda(text, 2, 1, false, out, sizeof out, &st);
    ck_assert_int_eq(rc, KILN_EUNIMPL);
    ck_assert_msg(strstr(st.msg, "NCCL cannot reduce s32 with and") != NULL, "%s", st.msg);
  }
}
END_TEST

/* ---- kiln_comm collectives: one thread, several devices ---------------------- */

static void fill(kiln_buffer *b, uint32_t rank, size_t n) {
  int32_t *v = kiln_malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = (int32_t)(rank * 100 + i);
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_write(b, 0, v, n * sizeof *v, &st), 0);
  kiln_free(v);
}

/* Runs desc's collective on n ranks of backend name; recv read back into
 * out[r] (recv_n elements each). */
static int comm_run(const char *name, uint32_t n, kiln_collective desc, size_t send_n,
                    size_t recv_n, int32_t *out, kiln_status *st) {
  kiln_backend_options bo = {.ndevices = n};
  kiln_backend *b = NULL;
  ck_assert_msg(kiln_backend_create(name, &bo, &b, st) == 0, "%s", st->msg);
  kiln_device *devs[NDEV];
  kiln_buffer *send[NDEV], *recv[NDEV];
  for (uint32_t r = 0; r < n; r++) {
    devs[r] = kiln_backend_device(b, r);
    ck_assert_int_eq(kiln_buffer_alloc(devs[r], send_n * 4, &send[r], st), 0);
    ck_assert_int_eq(kiln_buffer_alloc(devs[r], recv_n * 4, &recv[r], st), 0);
    fill(send[r], r, send_n);
  }
  kiln_comm *c = NULL;
  ck_assert_int_eq(kiln_comm_create(b, devs, n, &c, st), 0);
  desc.send = send;
  desc.recv = recv;
  int rc = kiln_comm_collective(c, &desc, st);
  if (rc == 0) rc = kiln_comm_collective(c, &desc, st); /* the communicator reused */
  for (uint32_t r = 0; rc == 0 && r < n; r++)
    ck_assert_int_eq(kiln_buffer_read(recv[r], 0, out + r * recv_n, recv_n * 4, st), 0);
  kiln_comm_destroy(c);
  for (uint32_t r = 0; r < n; r++) {
    kiln_buffer_free(send[r]);
    kiln_buffer_free(recv[r]);
  }
  kiln_backend_destroy(b);
  return rc;
}

START_TEST(comm_collectives_are_grouped_calls_equal_to_cpu) {
  fakes_open();
  static const uint32_t pairs[] = {0, 2, 2, 1, 1, 0}; /* rank 3 gets zeros */
  const struct {
    int op, reduce;
    size_t count, recv;
  } cases[] = {
      {KILN_OP_ALL_REDUCE, KILN_OP_ADD, 6, 6}, {KILN_OP_ALL_REDUCE, KILN_OP_MAXIMUM, 5, 5},
      {KILN_OP_ALL_GATHER, 0, 3, 12},          {KILN_OP_REDUCE_SCATTER, KILN_OP_ADD, 8, 2},
      {KILN_OP_ALL_TO_ALL, 0, 8, 8},           {KILN_OP_COLLECTIVE_PERMUTE, 0, 4, 4},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    kiln_collective d = {.op = cases[i].op,
                         .dtype = KILN_S32,
                         .reduce_op = cases[i].reduce,
                         .count = cases[i].count,
                         .pairs = pairs,
                         .npairs = 3};
    int32_t want[4 * 12], got[4 * 12];
    kiln_status st;
    kiln_status_clear(&st);
    fake_nccl_stats before = nstats();
    ck_assert_msg(comm_run("cpu", 4, d, cases[i].count, cases[i].recv, want, &st) == 0, "cpu: %s",
                  st.msg);
    ck_assert_msg(comm_run("cuda", 4, d, cases[i].count, cases[i].recv, got, &st) == 0,
                  "cuda, case %zu: %s: %s", i, st.where, st.msg);
    ck_assert_msg(memcmp(got, want, 4 * cases[i].recv * 4) == 0, "case %zu differs", i);
    fake_nccl_stats after = nstats();
    ck_assert_int_eq(after.inits - before.inits, 4);   /* once, for both calls */
    ck_assert_int_ge(after.groups - before.groups, 3); /* the init's and each call's */
    ck_assert_int_eq(after.live_comms, 0);
  }
  ck_assert_int_eq(nstats().bad_args, 0);
}
END_TEST

/* ---- errors -------------------------------------------------------------------- */

START_TEST(nccl_errors_are_statuses_naming_the_call) {
  fakes_open();
  char text[16384], body[1024];
  expand(body, sizeof body, " ROOT r = s32[N] all-reduce(v), replica_groups={}, to_apply=add\n", 2);
  program(text, sizeof text, 2, body);
  char out[1024];
  kiln_status st;
  kiln_status_clear(&st);
  nccl_fail("ncclAllReduce", 0, 3 /* ncclInternalError */);
  int rc = run_cuda(text, 2, 1, false, out, sizeof out, &st);
  nccl_fail("", 0, 0);
  ck_assert_int_eq(rc, KILN_EINTERNAL);
  ck_assert_msg(strstr(st.msg, "ncclAllReduce failed") != NULL, "%s", st.msg);
  /* The init fails: the status names it, and the next run works. */
  nccl_fail("ncclCommInitRankConfig", 1, 2 /* ncclSystemError */);
  rc = run_cuda(text, 2, 1, false, out, sizeof out, &st);
  nccl_fail("", 0, 0);
  ck_assert_int_eq(rc, KILN_EUNAVAIL);
  ck_assert_msg(strstr(st.msg, "ncclCommInitRankConfig failed") != NULL, "%s", st.msg);
  rc = run_cuda(text, 2, 1, false, out, sizeof out, &st);
  ck_assert_msg(rc == 0, "%s", st.msg);
  ck_assert_int_eq(nstats().live_comms, 0);
  /* One thread's grouped calls: the failing ncclGroupEnd is named. */
  kiln_collective d = {.op = KILN_OP_ALL_GATHER, .dtype = KILN_S32, .count = 2};
  int32_t got[4 * 8];
  nccl_fail("ncclGroupEnd", 1, 6 /* ncclRemoteError */); /* the init's group passes */
  kiln_status_clear(&st);
  rc = comm_run("cuda", 4, d, 2, 8, got, &st);
  nccl_fail("", 0, 0);
  ck_assert_int_eq(rc, KILN_EUNAVAIL);
  ck_assert_msg(strstr(st.msg, "ncclGroupEnd failed") != NULL, "%s", st.msg);
  /* No id: UNAVAILABLE naming the call, with or without a status. */
  uint8_t id[KILN_NCCL_ID_BYTES];
  nccl_fail("ncclGetUniqueId", 0, 2);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_nccl_mint_id(NULL, id, sizeof id, &st), KILN_EUNAVAIL);
  ck_assert_msg(strstr(st.msg, "ncclGetUniqueId failed") != NULL, "%s", st.msg);
  nccl_fail("ncclGetUniqueId", 0, 2);
  ck_assert_int_eq(kiln_nccl_mint_id(NULL, id, sizeof id, NULL), KILN_EUNAVAIL);
  nccl_fail("", 0, 0);
  ck_assert_int_eq(nstats().live_comms, 0);
}
END_TEST

/* A collective whose stream never finishes (a peer that never joins, on a
 * GPU): the rank gives up at the run's deadline, aborts its communicator,
 * and the group's next run makes a new one. */
START_TEST(a_stuck_collective_is_aborted_at_the_deadline) {
  fakes_open();
  char text[16384], body[1024];
  expand(body, sizeof body, " ROOT r = s32[N] all-reduce(v), replica_groups={}, to_apply=add\n", 2);
  program(text, sizeof text, 2, body);
  char out[1024];
  kiln_status st;
  fake_nccl_stats before = nstats();
  cuda_fail("cuStreamQuery", 0, 600 /* CUDA_ERROR_NOT_READY */);
  run_timeout = 0.5;
  double t0 = now_s();
  int rc = run_cuda(text, 2, 1, false, out, sizeof out, &st);
  cuda_fail("", 0, 0);
  ck_assert_int_eq(rc, KILN_EDEADLINE);
  ck_assert_msg(strstr(st.msg, "all-reduce through NCCL did not complete") != NULL, "%s", st.msg);
  ck_assert_double_lt(now_s() - t0, 10.0);
  fake_nccl_stats after = nstats();
  ck_assert_int_eq(after.aborts - before.aborts, 2); /* each rank its own */
  ck_assert_int_eq(after.live_comms, 0);
  run_timeout = 30;
  rc = run_cuda(text, 2, 1, false, out, sizeof out, &st);
  ck_assert_msg(rc == 0, "%s", st.msg);
  char want[1024];
  run_cpu(text, 2, 1, want, sizeof want);
  ck_assert_str_eq(out, want);
  ck_assert_int_eq(nstats().inits - after.inits, 2); /* a new communicator */
}
END_TEST

/* A mesh whose other ranks never come: the init gives up at its deadline. */
START_TEST(a_missing_peer_is_a_deadline_not_a_hang) {
  fakes_open();
  kiln_backend_options bo = {.ndevices = 1};
  kiln_backend *b = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_backend_create("cuda", &bo, &b, &st), 0);
  uint8_t id[KILN_NCCL_ID_BYTES];
  ck_assert_int_eq(kiln_nccl_mint_id(NULL, id, sizeof id, &st), 0);
  kiln_device *dev = kiln_backend_device(b, 0);
  kiln_cuda_mesh *m = NULL;
  double t0 = now_s();
  int rc = kiln_cuda_mesh_open(b, id, 2, 0, &dev, 1, 0.3, &m, &st);
  ck_assert_int_eq(rc, KILN_EDEADLINE);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(st.msg, "ncclCommInitRankConfig did not complete") != NULL, "%s", st.msg);
  ck_assert_double_lt(now_s() - t0, 5.0);
  ck_assert_int_eq(nstats().live_comms, 0); /* aborted */
  kiln_backend_destroy(b);
}
END_TEST

/* ---- a mesh across hosts -------------------------------------------------------- */

#ifdef KILN_TEST_HAVE_CACHE
typedef struct host {
  const char *redis, *name;
  uint64_t generation;
  uint32_t rank;
  kilnd_mesh_state state;
  double timeout;
  kiln_backend *b;
  int rc;
  kiln_status st;
  int32_t got[4];
} host;

/* One "host": kilnd's mesh glue (server/mesh.c: the rendezvous through
 * Redis, rank 0 minting, then this host's rank of the communicator on its
 * own device), then an all-reduce of four numbers over the mesh. */
static void *host_main(void *arg) {
  host *h = arg;
  kilnd_mesh_config mc = {.name = h->name,
                          .redis = h->redis,
                          .ranks = 2,
                          .rank = h->rank,
                          .devices = 1,
                          .first_device = h->rank,
                          .generation = h->generation,
                          .timeout_s = h->timeout};
  kilnd_mesh *km = NULL;
  kiln_status_clear(&h->st);
  ck_assert_int_eq(kilnd_mesh_create(&mc, h->b, &km, &h->st), 0);
  ck_assert_int_eq(kilnd_mesh_state_get(km), KILND_MESH_UNUSED);
  kiln_cuda_mesh *m = NULL;
  h->rc = kilnd_mesh_get(km, &m, &h->st);
  h->state = kilnd_mesh_state_get(km);
  kiln_device *dev = kiln_backend_device(h->b, h->rank);
  kiln_buffer *s = NULL, *r = NULL;
  int32_t v[4];
  for (int i = 0; i < 4; i++) v[i] = (int32_t)((h->rank + 1) * 10 + i);
  if (h->rc == 0) h->rc = kiln_buffer_alloc(dev, sizeof v, &s, &h->st);
  if (h->rc == 0) h->rc = kiln_buffer_alloc(dev, sizeof v, &r, &h->st);
  if (h->rc == 0) h->rc = kiln_buffer_write(s, 0, v, sizeof v, &h->st);
  kiln_collective d = {.op = KILN_OP_ALL_REDUCE,
                       .dtype = KILN_S32,
                       .reduce_op = KILN_OP_ADD,
                       .count = 4,
                       .send = &s,
                       .recv = &r};
  if (h->rc == 0) h->rc = kiln_cuda_mesh_collective(m, &d, h->timeout, &h->st);
  if (h->rc == 0) h->rc = kiln_buffer_read(r, 0, h->got, sizeof h->got, &h->st);
  kiln_buffer_free(s);
  kiln_buffer_free(r);
  kilnd_mesh_destroy(km); /* closes the mesh */
  return NULL;
}

START_TEST(two_hosts_agree_on_the_id_through_redis) {
  fakes_open();
  const char *why = NULL;
  if (!kiln_test_redis_available(&why)) {
    fprintf(stderr, "skipped: %s\n", why);
    return;
  }
  kiln_test_redis *redis = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_test_redis_start(NULL, &redis, &st) == 0, "%s", st.msg);
  kiln_backend_options bo = {.ndevices = 2};
  kiln_backend *b = NULL;
  ck_assert_int_eq(kiln_backend_create("cuda", &bo, &b, &st), 0);
  host h[2];
  pthread_t t[2];
  for (uint32_t i = 0; i < 2; i++) {
    h[i] = (host){.redis = kiln_test_redis_addr(redis),
                  .name = "gpu-mesh",
                  .generation = 1,
                  .rank = i,
                  .timeout = 10,
                  .b = b};
    ck_assert_int_eq(pthread_create(&t[i], NULL, host_main, &h[i]), 0);
  }
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 2; i++) {
    ck_assert_msg(h[i].rc == 0, "rank %d: %s: %s", i, h[i].st.where, h[i].st.msg);
    ck_assert_int_eq(h[i].state, KILND_MESH_READY);
    for (int k = 0; k < 4; k++) ck_assert_int_eq(h[i].got[k], 10 + k + 20 + k);
  }
  /* A rank whose first rank never publishes: a clear deadline. */
  host late = {.redis = kiln_test_redis_addr(redis),
               .name = "gpu-mesh",
               .generation = 2,
               .rank = 1,
               .timeout = 0.3,
               .b = b};
  host_main(&late);
  ck_assert_int_eq(late.rc, KILN_EDEADLINE);
  ck_assert_int_eq(late.state, KILND_MESH_FAILED);
  ck_assert_msg(strstr(late.st.msg, "kiln:nccl:gpu-mesh:2") != NULL, "%s", late.st.msg);
  /* Rank 0 alone: the id is published, but its peer never inits. */
  host alone = {.redis = kiln_test_redis_addr(redis),
                .name = "gpu-mesh",
                .generation = 3,
                .rank = 0,
                .timeout = 0.3,
                .b = b};
  host_main(&alone);
  ck_assert_int_eq(alone.rc, KILN_EDEADLINE);
  ck_assert_msg(strstr(alone.st.msg, "ncclCommInitRankConfig") != NULL, "%s", alone.st.msg);
  ck_assert_int_eq(nstats().live_comms, 0);
  kiln_backend_destroy(b);
  kiln_test_redis_destroy(redis);
}
END_TEST
#endif

/* ---- on a GPU, with the real driver and libnccl (scripts/gpu-check.sh) ---- */

/* A mesh of one rank through the real NCCL: its nonblocking init, the
 * collectives on the device's stream, the polled completion. */
START_TEST(real_nccl_one_rank_mesh) {
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_backend_caps("cuda") == 0) {
    char why[256] = "";
    kiln_backend_why_absent("cuda", why, sizeof why);
    fprintf(stderr, "skipped: no GPU (%s)\n", why);
    return;
  }
  uint8_t id[KILN_NCCL_ID_BYTES];
  ck_assert_msg(kiln_nccl_mint_id(NULL, id, sizeof id, &st) == 0, "%s", st.msg);
  kiln_backend *b = NULL;
  ck_assert_msg(kiln_backend_create("cuda", NULL, &b, &st) == 0, "%s", st.msg);
  kiln_device *dev = kiln_backend_device(b, 0);
  kiln_cuda_mesh *m = NULL;
  ck_assert_msg(kiln_cuda_mesh_open(b, id, 1, 0, &dev, 1, 30, &m, &st) == 0, "%s: %s", st.where,
                st.msg);
  kiln_buffer *s = NULL, *r = NULL;
  int32_t v[4] = {1, 2, 3, 4}, got[4] = {0};
  ck_assert_int_eq(kiln_buffer_alloc(dev, sizeof v, &s, &st), 0);
  ck_assert_int_eq(kiln_buffer_alloc(dev, sizeof v, &r, &st), 0);
  ck_assert_int_eq(kiln_buffer_write(s, 0, v, sizeof v, &st), 0);
  static const int ops[] = {KILN_OP_ALL_REDUCE, KILN_OP_ALL_GATHER, KILN_OP_ALL_TO_ALL};
  for (size_t i = 0; i < 3; i++) {
    kiln_collective d = {.op = ops[i],
                         .dtype = KILN_S32,
                         .reduce_op = KILN_OP_ADD,
                         .count = 4,
                         .send = &s,
                         .recv = &r};
    ck_assert_msg(kiln_cuda_mesh_collective(m, &d, 30, &st) == 0, "%s: %s", st.where, st.msg);
    ck_assert_int_eq(kiln_buffer_read(r, 0, got, sizeof got, &st), 0);
    ck_assert_int_eq(memcmp(got, v, sizeof v), 0);
  }
  kiln_buffer_free(s);
  kiln_buffer_free(r);
  kiln_cuda_mesh_close(m);
  kiln_backend_destroy(b);
}
END_TEST

/* Several GPUs: kiln_comm collectives against the cpu backend's. */
START_TEST(real_nccl_comm_collectives) {
  kiln_status st;
  kiln_status_clear(&st);
  uint32_t n = kiln_cuda_device_count(NULL);
  if (n < 2) {
    fprintf(stderr, "skipped: %u GPU(s); kiln_comm collectives need 2\n", n);
    return;
  }
  if (n > 4) n = 4;
  kiln_collective d = {
      .op = KILN_OP_ALL_REDUCE, .dtype = KILN_S32, .reduce_op = KILN_OP_ADD, .count = 8};
  int32_t want[4 * 8], got[4 * 8];
  ck_assert_msg(comm_run("cpu", n, d, 8, 8, want, &st) == 0, "%s", st.msg);
  ck_assert_msg(comm_run("cuda", n, d, 8, 8, got, &st) == 0, "%s: %s", st.where, st.msg);
  ck_assert_int_eq(memcmp(got, want, n * 8 * 4), 0);
}
END_TEST

static int run_real(void) {
  Suite *s = suite_create("cuda_nccl_real");
  TCase *c = tcase_create("real");
  tcase_set_timeout(c, 120);
  tcase_add_test(c, real_nccl_one_rank_mesh);
  tcase_add_test(c, real_nccl_comm_collectives);
  suite_add_tcase(s, c);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}

int main(void) {
  /* KILN_TEST_REAL_NCCL=1: the real driver and libnccl, on a GPU. */
  const char *real = getenv("KILN_TEST_REAL_NCCL");
  if (real && strcmp(real, "1") == 0) return run_real();
  setenv("KILN_CUDA_DRIVER", KILN_FAKE_CUDA, 1);
  setenv("KILN_NCCL_LIB", KILN_FAKE_NCCL, 1);
  setenv("KILN_FAKE_CUDA_DEVICES", "8", 1);
  setenv("KILN_FAKE_NCCL_TIMEOUT", "5", 1);
  Suite *s = suite_create("cuda_nccl");
  TCase *c = tcase_create("nccl");
  tcase_set_timeout(c, 120);
  tcase_add_test(c, collectives_on_the_fake_mesh_equal_the_cpu_mesh);
  tcase_add_test(c, a_collective_in_a_loop_reuses_its_communicator);
  tcase_add_test(c, reductions_nccl_cannot_do_are_refused_at_load);
  tcase_add_test(c, comm_collectives_are_grouped_calls_equal_to_cpu);
  tcase_add_test(c, nccl_errors_are_statuses_naming_the_call);
  tcase_add_test(c, a_stuck_collective_is_aborted_at_the_deadline);
  tcase_add_test(c, a_missing_peer_is_a_deadline_not_a_hang);
#ifdef KILN_TEST_HAVE_CACHE
  tcase_add_test(c, two_hosts_agree_on_the_id_through_redis);
#endif
  suite_add_tcase(s, c);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
#else
int main(void) {
  printf("cuda_nccl: built without the CUDA device pool or the fakes: nothing to test\n");
  return 0;
}
#endif
