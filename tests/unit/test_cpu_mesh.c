/* Per-device programs on the cpu backend's mesh (collective steps,
 * executor/cpu/cpu_collective.c, and the gang rendezvous, executor/comm.c),
 * checked against the interpreter's mesh (the oracle) on the same programs:
 * every collective on 1, 2, 4 and 8 devices, their async forms, element
 * types and reductions, gathered and split dims that are not the leading
 * one, collectives in a while loop, replica-id and partition-id on a
 * replicas x partitions mesh, and ranks that fail, stop early or run past
 * a limit while their peers wait (they are released, never hang).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/text.h"
#include "executor/backend.h"
#include "executor/run.h"

static kiln_module *parse_ok(const char *text) {
  kiln_status st = {0};
  kiln_module *m = NULL;
  int rc = kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st);
  ck_assert_msg(rc == 0, "parse failed: %s: %s\n%s", st.where, st.msg, text);
  return m;
}

/* Runs text (no arguments) on R x P devices of backend and prints every
 * device's result, "|"-separated, into out. */
static int run_on(const char *backend, const char *text, uint32_t R, uint32_t P,
                  const kiln_run_options *ro, char *out, size_t size, kiln_status *st) {
  kiln_module *m = parse_ok(text);
  uint32_t n = R * P;
  kiln_literal **outs = kiln_calloc(n, sizeof *outs);
  kiln_status_clear(st);
  kiln_run_options def = {.timeout_seconds = 30};
  int rc = kiln_run_module_mesh(m, backend, ro ? ro : &def, R, P, NULL, 0, outs, st);
  out[0] = 0;
  kiln_sbuf b = KILN_SBUF_INIT;
  for (uint32_t k = 0; k < n; k++) {
    if (rc == 0) {
      if (k) kiln_sbuf_putc(&b, '|');
      kiln_literal_print(&b, outs[k], false);
    } else {
      ck_assert_ptr_null(outs[k]);
    }
    kiln_literal_destroy(outs[k]);
  }
  if (rc == 0) snprintf(out, size, "%s", kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  kiln_free(outs);
  kiln_module_destroy(m);
  return rc;
}

/* The cpu mesh gives what the interpreter's gives, device by device. */
static void same_as_interp(const char *text, uint32_t R, uint32_t P) {
  static char want[65536], got[65536];
  kiln_status st;
  int rc = run_on("interp", text, R, P, NULL, want, sizeof want, &st);
  ck_assert_msg(rc == 0, "interp, %u x %u: %s: %s\n%s", R, P, st.where, st.msg, text);
  rc = run_on("cpu", text, R, P, NULL, got, sizeof got, &st);
  ck_assert_msg(rc == 0, "cpu, %u x %u: %s: %s\n%s", R, P, st.where, st.msg, text);
  ck_assert_msg(strcmp(got, want) == 0, "%u x %u:\n%s\ncpu    %s\ninterp %s", R, P, text, got,
                want);
}

static const char prelude[] =
    "HloModule c\n"
    "add {\n x = s32[] parameter(0)\n y = s32[] parameter(1)\n ROOT s = s32[] add(x, y)\n}\n"
    "max {\n x = s32[] parameter(0)\n y = s32[] parameter(1)\n ROOT s = s32[] maximum(x, y)\n}\n";

/* ENTRY with %id = this device's replica id (s32), %v = s32[n] with
 * element i = id * n + i, %one = s32[1] {id}, %m = s32[2,n] rows v and
 * v * 3, then `body` (every "N" replaced by n) whose last line is the ROOT. */
static void program(char *text, size_t size, int n, const char *body) {
  char b[4096];
  size_t j = 0;
  for (const char *p = body; *p && j + 8 < sizeof b; p++) {
    if (*p == 'N' && (p == body || p[-1] == '[' || p[-1] == ',' || p[-1] == '{'))
      j += (size_t)snprintf(b + j, sizeof b - j, "%d", n);
    else
      b[j++] = *p;
  }
  b[j] = 0;
  snprintf(text, size,
           "%sENTRY e {\n id0 = u32[] replica-id()\n id = s32[] convert(id0)\n"
           " nn = s32[] constant(%d)\n idn = s32[] multiply(id, nn)\n"
           " b = s32[%d] broadcast(idn), dimensions={}\n"
           " io = s32[%d] iota(), iota_dimension=0\n v = s32[%d] add(b, io)\n"
           " one = s32[1] reshape(id)\n three = s32[%d] constant({%s})\n"
           " v3 = s32[%d] multiply(v, three)\n r0 = s32[1,%d] reshape(v)\n"
           " r1 = s32[1,%d] reshape(v3)\n m = s32[2,%d] concatenate(r0, r1), dimensions={0}\n%s}\n",
           prelude, n, n, n, n, n,
           n == 1   ? "3"
           : n == 2 ? "3,3"
           : n == 4 ? "3,3,3,3"
                    : "3,3,3,3,3,3,3,3",
           n, n, n, n, b);
}

static void each(const char *body, int n) {
  char text[8192];
  program(text, sizeof text, n, body);
  same_as_interp(text, (uint32_t)n, 1);
}

static const char *const bodies[] = {
    " ROOT r = s32[N] all-reduce(v), replica_groups={}, to_apply=add\n",
    " ROOT r = s32[N] all-reduce(v), replica_groups={}, to_apply=max\n",
    " s = s32[N] all-reduce-start(v), replica_groups={}, to_apply=add\n"
    " ROOT r = s32[N] all-reduce-done(s)\n",
    " ROOT r = (s32[N], s32[2,N]) all-reduce(v, m), replica_groups={}, to_apply=add\n",
    " ROOT r = s32[N] all-gather(one), replica_groups={}, dimensions={0}\n",
    " s = (s32[1], s32[N]) all-gather-start(one), replica_groups={}, dimensions={0}\n"
    " ROOT r = s32[N] all-gather-done(s)\n",
    " ROOT r = s32[2,NN] all-gather(m), replica_groups={}, dimensions={1}\n",
    " ROOT r = s32[1] reduce-scatter(v), replica_groups={}, dimensions={0}, to_apply=add\n",
    " ROOT r = s32[2,1] reduce-scatter(m), replica_groups={}, dimensions={1}, to_apply=max\n",
    " ROOT r = s32[N] all-to-all(v), replica_groups={}, dimensions={0}\n",
    " ROOT r = s32[2,N] all-to-all(m), replica_groups={}, dimensions={1}\n",
    " ROOT r = s32[1] collective-broadcast(one), replica_groups={}\n",
    " ROOT r = s32[2,N] collective-broadcast(m), replica_groups={}\n",
};

START_TEST(test_each_collective) {
  static const int sizes[] = {1, 2, 4, 8};
  for (size_t si = 0; si < 4; si++) {
    int n = sizes[si];
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
      char body[1024];
      /* NN: n * n columns */
      const char *nn = strstr(bodies[i], "NN");
      if (nn) {
        snprintf(body, sizeof body, "%.*s%d%s", (int)(nn - bodies[i]), bodies[i], n * n, nn + 2);
        each(body, n);
      } else {
        each(bodies[i], n);
      }
    }
    /* collective-permute around the ring and along a line, sync and async */
    char pairs[256] = "", line[256] = "", body[1024];
    size_t pl = 0, ll = 0;
    for (int k = 0; k < n; k++) {
      pl += (size_t)snprintf(pairs + pl, sizeof pairs - pl, "%s{%d,%d}", k ? "," : "", k,
                             (k + 1) % n);
      if (k + 1 < n)
        ll += (size_t)snprintf(line + ll, sizeof line - ll, "%s{%d,%d}", k ? "," : "", k, k + 1);
    }
    snprintf(body, sizeof body,
             " ROOT r = s32[N] collective-permute(v), source_target_pairs={%s}\n", pairs);
    each(body, n);
    snprintf(body, sizeof body,
             " s = (s32[1], s32[1]) collective-permute-start(one), source_target_pairs={%s}\n"
             " ROOT r = s32[1] collective-permute-done(s)\n",
             pairs);
    each(body, n);
    snprintf(body, sizeof body,
             " ROOT r = s32[2,N] collective-permute(m), source_target_pairs={%s}\n", line);
    each(body, n);
    /* the tuple all-to-all: one operand per member */
    char ops[512] = "", shapes[512] = "";
    size_t ol = 0, sl = 0;
    for (int k = 0; k < n; k++) {
      ol += (size_t)snprintf(ops + ol, sizeof ops - ol, "%sone", k ? ", " : "");
      sl += (size_t)snprintf(shapes + sl, sizeof shapes - sl, "%ss32[1]", k ? ", " : "");
    }
    snprintf(body, sizeof body, " ROOT r = (%s) all-to-all(%s), replica_groups={}\n", shapes, ops);
    each(body, n);
  }
}
END_TEST

/* Reductions over element types (the steps' own folds), in rank order. */
START_TEST(test_types_and_reductions) {
  static const struct {
    const char *type, *op;
  } cases[] = {
      {"f32", "add"}, {"f32", "multiply"}, {"f32", "minimum"}, {"f64", "maximum"},
      {"f16", "add"}, {"bf16", "add"},     {"s8", "multiply"}, {"u16", "maximum"},
      {"u64", "add"}, {"s64", "minimum"},  {"s32", "and"},     {"u32", "or"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    for (int n = 1; n <= 8; n *= 2) {
      char text[4096];
      const char *t = cases[i].type;
      snprintf(text, sizeof text,
               "HloModule c\nred {\n x = %s[] parameter(0)\n y = %s[] parameter(1)\n"
               " ROOT s = %s[] %s(x, y)\n}\n"
               "ENTRY e {\n id0 = u32[] replica-id()\n io = u32[5] iota(), iota_dimension=0\n"
               " b = u32[5] broadcast(id0), dimensions={}\n three = u32[5] constant({3,1,4,1,5})\n"
               " x0 = u32[5] multiply(b, three)\n x1 = u32[5] add(x0, io)\n x = %s[5] convert(x1)\n"
               " hf = f32[5] constant({0.5, 1.5, 0.25, 2, 0.75})\n h = %s[5] convert(hf)\n"
               " y = %s[5] add(x, h)\n"
               " ROOT r = %s[5] all-reduce(y), replica_groups={}, to_apply=red\n}\n",
               t, t, t, cases[i].op, t, t, t, t);
      same_as_interp(text, (uint32_t)n, 1);
    }
  }
  /* pred: and / or */
  for (int n = 1; n <= 8; n *= 2) {
    char text[2048];
    for (int o = 0; o < 2; o++) {
      snprintf(
          text, sizeof text,
          "HloModule c\nred {\n x = pred[] parameter(0)\n y = pred[] parameter(1)\n"
          " ROOT s = pred[] %s(x, y)\n}\n"
          "ENTRY e {\n id0 = u32[] replica-id()\n io = u32[4] iota(), iota_dimension=0\n"
          " b = u32[4] broadcast(id0), dimensions={}\n c = pred[4] compare(b, io), direction=GE\n"
          " ROOT r = pred[4] all-reduce(c), replica_groups={}, to_apply=red\n}\n",
          o ? "or" : "and");
      same_as_interp(text, (uint32_t)n, 1);
    }
  }
}
END_TEST

/* Subgroups, partition-id and replica-id on replicas x partitions. */
START_TEST(test_partitions) {
  char text[4096];
  static const char *const groups[] = {
      "replica_groups=[2,4]<=[8], use_global_device_ids=true",
      "replica_groups=mesh['r'=2,'p'=4] {'r'}, use_global_device_ids=true",
      "replica_groups={{0,2},{1,3},{4,6},{5,7}}, use_global_device_ids=true",
  };
  for (int i = 0; i < 3; i++) {
    snprintf(text, sizeof text,
             "%sENTRY e {\n p0 = u32[] partition-id()\n p = s32[] convert(p0)\n"
             " r0 = u32[] replica-id()\n r = s32[] convert(r0)\n ten = s32[] constant(10)\n"
             " rt = s32[] multiply(r, ten)\n x = s32[] add(p, rt)\n"
             " ROOT s = (s32[], u32[], u32[]) all-reduce(x), channel_id=1, %s, to_apply=add\n}\n",
             prelude, groups[i]);
    /* ROOT of a tuple shape with one operand is not an all-reduce form:
     * keep the all-reduce an array and return the ids beside it. */
    char *root = strstr(text, " ROOT s = (s32[], u32[], u32[]) all-reduce");
    ck_assert_ptr_nonnull(root);
    char fixed[4096];
    snprintf(fixed, sizeof fixed, "%.*s s = s32[] all-reduce%s", (int)(root - text), text,
             root + strlen(" ROOT s = (s32[], u32[], u32[]) all-reduce"));
    char *end = strrchr(fixed, '}');
    snprintf(end, sizeof fixed - (size_t)(end - fixed),
             " ROOT t = (s32[], u32[], u32[]) tuple(s, p0, r0)\n}\n");
    same_as_interp(fixed, 2, 4);
  }
  snprintf(
      text, sizeof text,
      "%sENTRY e {\n p0 = u32[] partition-id()\n r0 = u32[] replica-id()\n"
      " ten = u32[] constant(10)\n rt = u32[] multiply(r0, ten)\n x = u32[] add(p0, rt)\n"
      " ROOT s = u32[] collective-permute(x), channel_id=1, source_target_pairs={{0,1},{1,0}}\n}\n",
      prelude);
  same_as_interp(text, 2, 2);
  same_as_interp(text, 4, 2);
}
END_TEST

/* A collective in a while loop: consecutive generations of one step. */
START_TEST(test_while_loop) {
  char text[4096];
  snprintf(text, sizeof text,
           "%scond {\n s = (s32[], s32[3]) parameter(0)\n i = s32[] get-tuple-element(s), index=0\n"
           " k = s32[] constant(5)\n ROOT c = pred[] compare(i, k), direction=LT\n}\n"
           "body {\n s = (s32[], s32[3]) parameter(0)\n i = s32[] get-tuple-element(s), index=0\n"
           " x = s32[3] get-tuple-element(s), index=1\n one = s32[] constant(1)\n"
           " i1 = s32[] add(i, one)\n r = s32[3] all-reduce(x), replica_groups={}, to_apply=add\n"
           " g = s32[3] collective-permute(r), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}\n"
           " y = s32[3] add(g, x)\n ROOT t = (s32[], s32[3]) tuple(i1, y)\n}\n"
           "ENTRY e {\n id0 = u32[] replica-id()\n id = s32[] convert(id0)\n"
           " b = s32[3] broadcast(id), dimensions={}\n io = s32[3] iota(), iota_dimension=0\n"
           " v = s32[3] add(b, io)\n z = s32[] constant(0)\n t = (s32[], s32[3]) tuple(z, v)\n"
           " w = (s32[], s32[3]) while(t), condition=cond, body=body\n"
           " ROOT o = s32[3] get-tuple-element(w), index=1\n}\n",
           prelude);
  same_as_interp(text, 4, 1);
}
END_TEST

/* A rank that stops before a collective its peers wait in, a rank that
 * runs past a limit, and a timeout: the peers are released with an error
 * and the caller hears the rank whose failure it is. */
START_TEST(test_failing_ranks) {
  char text[4096], got[256];
  kiln_status st;
  snprintf(text, sizeof text,
           "%sbody {\n a = s32[] parameter(0)\n ROOT r = s32[] all-reduce(a), replica_groups={}, "
           "to_apply=add\n}\nskip {\n a = s32[] parameter(0)\n ROOT r = s32[] copy(a)\n}\n"
           "ENTRY e {\n id0 = u32[] replica-id()\n z = u32[] constant(0)\n"
           " c = pred[] compare(id0, z), direction=EQ\n one = s32[] constant(1)\n"
           " ROOT r = s32[] conditional(c, one, one), true_computation=body, "
           "false_computation=skip\n}\n",
           prelude);
  ck_assert_int_eq(run_on("cpu", text, 2, 1, NULL, got, sizeof got, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "rank 0") && strstr(st.msg, "finished before reaching"), "%s",
                st.msg);
  /* Rank 1 loops past the iteration limit while rank 0 waits in the
   * all-reduce: rank 1's limit is the error, rank 0 is released. */
  snprintf(
      text, sizeof text,
      "%scond {\n s = s32[] parameter(0)\n id0 = u32[] replica-id()\n z = u32[] constant(0)\n"
      " ROOT c = pred[] compare(id0, z), direction=NE\n}\n"
      "body {\n s = s32[] parameter(0)\n one = s32[] constant(1)\n ROOT t = s32[] add(s, one)\n}\n"
      "ENTRY e {\n z = s32[] constant(0)\n w = s32[] while(z), condition=cond, body=body\n"
      " ROOT r = s32[] all-reduce(w), replica_groups={}, to_apply=add\n}\n",
      prelude);
  kiln_run_options lim = {.max_while_iterations = 1000, .timeout_seconds = 30};
  ck_assert_int_eq(run_on("cpu", text, 2, 1, &lim, got, sizeof got, &st), KILN_ELIMIT);
  ck_assert_msg(strstr(st.msg, "rank 1") && strstr(st.msg, "iterations"), "%s", st.msg);
  /* A timeout stops both the looping rank and the waiting one. */
  kiln_run_options tmo = {.max_while_iterations = UINT64_MAX, .timeout_seconds = 0.5};
  ck_assert_int_eq(run_on("cpu", text, 4, 1, &tmo, got, sizeof got, &st), KILN_ELIMIT);
  ck_assert_msg(strstr(st.msg, "time limit"), "%s", st.msg);
  /* A raised cancel flag releases a rank waiting in a collective. */
  atomic_int cancel = 1;
  kiln_run_options can = {.cancel = &cancel, .max_while_iterations = UINT64_MAX};
  ck_assert_int_eq(run_on("cpu", text, 2, 1, &can, got, sizeof got, &st), KILN_ECANCELED);
  /* Groups that put a device in two of them are refused before any rank runs. */
  snprintf(text, sizeof text,
           "%sENTRY e {\n one = s32[] constant(1)\n"
           " ROOT r = s32[] all-reduce(one), replica_groups={{0,1},{1,2}}, to_apply=add\n}\n",
           prelude);
  ck_assert_int_eq(run_on("cpu", text, 3, 1, NULL, got, sizeof got, &st), KILN_EVERIFY);
  ck_assert_msg(strstr(st.msg, "twice"), "%s", st.msg);
  /* A reduction that is not one binary op is not compiled. */
  snprintf(text, sizeof text,
           "HloModule c\nred {\n x = s32[] parameter(0)\n y = s32[] parameter(1)\n"
           " s = s32[] add(x, y)\n ROOT t = s32[] multiply(s, s)\n}\n"
           "ENTRY e {\n one = s32[] constant(1)\n"
           " ROOT r = s32[] all-reduce(one), replica_groups={}, to_apply=red\n}\n");
  ck_assert_int_eq(run_on("cpu", text, 2, 1, NULL, got, sizeof got, &st), KILN_EUNIMPL);
  /* Backends that run no executables or do not exist. */
  ck_assert_int_ne(run_on("nope", text, 2, 1, NULL, got, sizeof got, &st), 0);
}
END_TEST

/* The buffer API: one executable loaded on a communicator of 4 cpu
 * devices, a gang launch on device buffers, an all-reduce in a while loop
 * run twice on the same mesh load (the rendezvous is per launch). A mesh
 * program run on one device alone fails saying what it needs. */
START_TEST(test_buffer_gang) {
  static const char text[] =
      "HloModule c, replica_count=4\n"
      "add {\n x = f32[] parameter(0)\n y = f32[] parameter(1)\n ROOT s = f32[] add(x, y)\n}\n"
      "ENTRY e {\n p = f32[64] parameter(0)\n"
      " ROOT r = f32[64] all-reduce(p), replica_groups={}, to_apply=add\n}\n";
  kiln_module *m = parse_ok(text);
  kiln_executable *e = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_compile(m, NULL, &e, NULL, &st), 0);
  kiln_backend *b = NULL;
  kiln_backend_options bo = {.ndevices = 4};
  ck_assert_int_eq(kiln_backend_create("cpu", &bo, &b, &st), 0);
  kiln_device *devs[4];
  for (uint32_t k = 0; k < 4; k++) devs[k] = kiln_backend_device(b, k);
  kiln_comm *comm = NULL;
  kiln_mesh *mesh = NULL;
  ck_assert_int_eq(kiln_comm_create(b, devs, 4, &comm, &st), 0);
  ck_assert_int_eq(kiln_comm_load(comm, e, &mesh, &st), 0);
  kiln_buffer *in[4], *out[4] = {0};
  kiln_buffer *const *args[4];
  kiln_buffer **res[4];
  for (uint32_t k = 0; k < 4; k++) {
    float v[64];
    for (int i = 0; i < 64; i++) v[i] = (float)(k * 100 + (uint32_t)i);
    ck_assert_int_eq(kiln_buffer_alloc(devs[k], sizeof v, &in[k], &st), 0);
    ck_assert_int_eq(kiln_buffer_write(in[k], 0, v, sizeof v, &st), 0);
    args[k] = &in[k];
    res[k] = &out[k];
  }
  for (int round = 0; round < 2; round++) {
    ck_assert_msg(kiln_mesh_execute(mesh, args, 1, NULL, res, 1, &st) == 0, "%s", st.msg);
    for (uint32_t k = 0; k < 4; k++) {
      float v[64];
      ck_assert_int_eq(kiln_buffer_read(out[k], 0, v, sizeof v, &st), 0);
      for (int i = 0; i < 64; i++) ck_assert_float_eq(v[i], (float)(600 + 4 * i));
      kiln_buffer_free(out[k]);
      out[k] = NULL;
    }
  }
  /* Alone on one device, the same executable refuses to run. */
  kiln_literal *lit = NULL, *arg = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &e->param_shapes[0], 0, &arg, &st), 0);
  const kiln_literal *one[1] = {arg};
  ck_assert_int_eq(kiln_run_executable(e, NULL, NULL, one, 1, &lit, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "4 replicas x 1 partitions") != NULL, "%s", st.msg);
  kiln_literal_destroy(arg);
  for (uint32_t k = 0; k < 4; k++) kiln_buffer_free(in[k]);
  kiln_mesh_destroy(mesh);
  kiln_comm_destroy(comm);
  kiln_backend_destroy(b);
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cpu_mesh");
  TCase *tc = tcase_create("collectives");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_each_collective);
  tcase_add_test(tc, test_types_and_reductions);
  tcase_add_test(tc, test_partitions);
  tcase_add_test(tc, test_while_loop);
  tcase_add_test(tc, test_failing_ranks);
  tcase_add_test(tc, test_buffer_gang);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
