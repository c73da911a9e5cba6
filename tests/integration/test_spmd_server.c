/* SPMD through kilnd (docs/spmd.md, "kilnd"): a real kilnd with four cpu
 * devices compiles global (sharded) programs into partitioned executables
 * and runs them gang-scheduled on global arrays, runs per-device programs
 * on arrays per device, keys its cache by the mesh, refuses what it cannot
 * do naming the field, and never deadlocks gangs against each other or
 * against single-device runs.
 *
 * Every partitioned result is compared with the same module run
 * unpartitioned on the server's interpreter (device_count 1).
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clients/c/kiln.h"
#include "common/alloc.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/text.h"
#include "compiler/spmd/spmd.h"
#include "tests/integration/itest.h"
#include "tests/support/testargs.h"

static itest_kilnd server;

static kiln_client *connect_as(const char *id) {
  kiln_client_options o = {.client_id = id};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_client *c = NULL;
  int rc = kiln_client_connect(server.addr, &o, &c, &st);
  ck_assert_msg(rc == 0, "connect %s: %s: %s", server.addr, st.where, st.msg);
  return c;
}

#define EXPECT_CODE(call, code, word) \
  do { \
    kiln_status_clear(&st); \
    int rc_ = (call); \
    ck_assert_msg(rc_ != 0 && kiln_rpc_status_code(&st) == (code), \
                  "%s: expected %s, got rc %d %s: %s", #call, kiln_rpc_code_name(code), rc_, \
                  st.where, st.msg); \
    ck_assert_msg(strstr(st.msg, (word)) != NULL, "%s: '%s' does not name %s", #call, st.msg, \
                  (word)); \
  } while (0)

/* A data-parallel step: batch split 4 ways, the weight gradient
 * all-reduced. */
static const char dp_hlo[] =
    "HloModule dp\n"
    "ENTRY e {\n x = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}\n"
    " w = f32[8,4] parameter(1), sharding={replicated}\n"
    " dy = f32[16,4] parameter(2), sharding={devices=[4,1]<=[4]}\n"
    " y = f32[16,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    " t = f32[16,4] tanh(y)\n"
    " g = f32[8,4] dot(x, dy), lhs_contracting_dims={0}, rhs_contracting_dims={0}, "
    "sharding={replicated}\n"
    " ROOT o = (f32[16,4], f32[8,4]) tuple(t, g)\n}\n";

/* The same step split 2 ways. */
static const char dp2_hlo[] =
    "HloModule dp2\n"
    "ENTRY e {\n x = f32[16,8] parameter(0), sharding={devices=[2,1]<=[2]}\n"
    " w = f32[8,4] parameter(1), sharding={replicated}\n"
    " y = f32[16,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    " ROOT t = f32[16,4] tanh(y), sharding={replicated}\n}\n";

/* A Megatron MLP: column- then row-parallel, one all-reduce. */
static const char megatron_hlo[] =
    "HloModule megatron\n"
    "relu {\n a = f32[8,32] parameter(0)\n z = f32[] constant(0)\n"
    " zb = f32[8,32] broadcast(z), dimensions={}\n ROOT m = f32[8,32] maximum(a, zb)\n}\n"
    "ENTRY e {\n x = f32[8,16] parameter(0), sharding={replicated}\n"
    " w1 = f32[16,32] parameter(1), sharding={devices=[1,4]<=[4]}\n"
    " w2 = f32[32,16] parameter(2), sharding={devices=[4,1]<=[4]}\n"
    " h = f32[8,32] dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    " r = f32[8,32] call(h), to_apply=relu\n"
    " y = f32[8,16] dot(r, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    " ROOT o = f32[8,16] custom-call(y), custom_call_target=\"Sharding\", "
    "sharding={replicated}\n}\n";

/* A per-device program: a cross-replica sum and the replica's id. */
static const char perdev_hlo[] =
    "HloModule pd, replica_count=4\n"
    "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b)\n}\n"
    "ENTRY e {\n x = f32[4] parameter(0)\n"
    " s = f32[4] all-reduce(x), replica_groups={}, to_apply=add\n"
    " id = u32[] replica-id()\n ROOT t = (f32[4], u32[]) tuple(s, id)\n}\n";

static int64_t four[1] = {4};
static const kiln_shape f32_4 = {.dtype = KILN_F32, .rank = 1, .dims = four};

static kiln_remote_executable *compile(kiln_client *c, const char *text, const char *backend,
                                       int32_t devices) {
  kiln_remote_compile_options o = {.backend = backend, .device_count = devices};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_executable *e = NULL;
  int rc = kiln_client_compile_text(c, text, strlen(text), &o, &e, &st);
  ck_assert_msg(rc == 0, "compile on %s x%d: %s: %s", backend, devices, st.where, st.msg);
  return e;
}

static void random_args(const char *text, uint64_t seed, kiln_literal ***args, uint32_t *n) {
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st), 0);
  ck_assert_int_eq(kiln_test_args_random(m, seed, args, n, &st), 0);
  kiln_module_destroy(m);
}

static void run(kiln_client *c, const kiln_remote_executable *e, kiln_literal *const *args,
                uint32_t n, const kiln_remote_execute_options *o, kiln_remote_result *r) {
  kiln_remote_arg ra[16];
  ck_assert_uint_le(n, 16);
  for (uint32_t i = 0; i < n; i++) ra[i] = (kiln_remote_arg){.literal = args[i]};
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_client_execute(c, e->id, ra, n, o, r, &st);
  ck_assert_msg(rc == 0, "execute: %s: %s", st.where, st.msg);
}

static void expect_close(const kiln_literal *a, const kiln_literal *b, const char *what) {
  ck_assert_msg(kiln_shape_same_dims(&a->shape, &b->shape) && a->shape.dtype == b->shape.dtype,
                "%s: shapes differ", what);
  int64_t n = kiln_literal_elements(a);
  for (int64_t i = 0; i < n; i++) {
    double x = kiln_literal_get_f64(a, i), y = kiln_literal_get_f64(b, i);
    ck_assert_msg(fabs(x - y) <= 1e-4 * (1 + fabs(x) + fabs(y)), "%s: element %lld: %g vs %g", what,
                  (long long)i, x, y);
  }
}

/* text partitioned `devices` ways on `backend` equals it unpartitioned on
 * the interpreter. */
static void check_global(const char *text, const char *backend, int32_t devices) {
  kiln_client *c = connect_as("spmd-global");
  kiln_remote_executable *ref = compile(c, text, "interp", 1);
  kiln_remote_executable *e = compile(c, text, backend, devices);
  ck_assert_int_eq(e->device_count, devices);
  ck_assert(!e->per_device);
  ck_assert_int_eq(e->num_partitions, devices);
  ck_assert_uint_eq(e->nparams, ref->nparams);
  ck_assert_uint_eq(e->noutputs, ref->noutputs);
  kiln_literal **args;
  uint32_t n;
  random_args(text, 7, &args, &n);
  kiln_remote_result want, got;
  run(c, ref, args, n, NULL, &want);
  run(c, e, args, n, NULL, &got);
  ck_assert_uint_eq(got.noutputs, want.noutputs);
  for (uint32_t i = 0; i < got.noutputs; i++)
    expect_close(got.outputs[i].literal, want.outputs[i].literal, backend);
  ck_assert_uint_eq(got.ndevice_ids, (uint32_t)devices);
  /* a cpu gang on distinct devices; an interpreter mesh in one slot */
  for (uint32_t i = 0; strcmp(backend, "cpu") == 0 && i < got.ndevice_ids; i++)
    for (uint32_t k = 0; k < i; k++) ck_assert_int_ne(got.device_ids[i], got.device_ids[k]);
  kiln_remote_result_free(&want);
  kiln_remote_result_free(&got);
  kiln_test_args_free(args, n);
  kiln_remote_executable_free(e);
  kiln_remote_executable_free(ref);
  kiln_client_close(c);
}

/* A global program on 2 replicas of 2 partitions (mesh_shape [2, 2], or
 * the module's replica_count 2): each replica runs it on its own two
 * devices from its own arguments (grouped by replica) or from shared ones,
 * and returns its global result, equal to the unpartitioned run on them. */
static void check_global_replicas(const char *backend) {
  kiln_client *c = connect_as("spmd-replicas");
  kiln_remote_executable *ref = compile(c, dp2_hlo, "interp", 1);
  int64_t m22[2] = {2, 2};
  kiln_remote_compile_options o = {
      .backend = backend, .device_count = 4, .mesh_shape = m22, .nmesh_shape = 2};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_executable *e = NULL, *e2 = NULL;
  ck_assert_msg(kiln_client_compile_text(c, dp2_hlo, strlen(dp2_hlo), &o, &e, &st) == 0, "%s",
                st.msg);
  ck_assert(!e->per_device);
  ck_assert_int_eq(e->replica_count, 2);
  ck_assert_int_eq(e->num_partitions, 2);
  char rep[sizeof dp2_hlo + 32];
  snprintf(rep, sizeof rep, "HloModule dp2, replica_count=2%s", dp2_hlo + strlen("HloModule dp2"));
  kiln_remote_compile_options o2 = {.backend = backend, .device_count = 4};
  ck_assert_msg(kiln_client_compile_text(c, rep, strlen(rep), &o2, &e2, &st) == 0, "%s", st.msg);
  ck_assert_int_eq(e2->replica_count, 2);
  kiln_literal **a0, **a1, *both[4];
  uint32_t n;
  random_args(dp2_hlo, 3, &a0, &n);
  random_args(dp2_hlo, 4, &a1, &n);
  ck_assert_uint_eq(n, 2);
  both[0] = a0[0], both[1] = a0[1], both[2] = a1[0], both[3] = a1[1];
  kiln_remote_result w0, w1, got, shared;
  run(c, ref, a0, n, NULL, &w0);
  run(c, ref, a1, n, NULL, &w1);
  run(c, e, both, 4, NULL, &got);
  ck_assert_uint_eq(got.noutputs, 2);
  expect_close(got.outputs[0].literal, w0.outputs[0].literal, "replica 0");
  expect_close(got.outputs[1].literal, w1.outputs[0].literal, "replica 1");
  ck_assert_uint_eq(got.ndevice_ids, 4);
  run(c, e2, a1, n, NULL, &shared);
  ck_assert_uint_eq(shared.noutputs, 2);
  expect_close(shared.outputs[0].literal, w1.outputs[0].literal, "shared, replica 0");
  expect_close(shared.outputs[1].literal, w1.outputs[0].literal, "shared, replica 1");
  /* three arguments are neither shared nor grouped by replica */
  kiln_remote_arg ra[3] = {{.literal = a0[0]}, {.literal = a0[1]}, {.literal = a1[0]}};
  kiln_remote_result bad;
  EXPECT_CODE(kiln_client_execute(c, e->id, ra, 3, NULL, &bad, &st), KILN_RPC_INVALID_ARGUMENT,
              "replica");
  kiln_remote_result_free(&w0);
  kiln_remote_result_free(&w1);
  kiln_remote_result_free(&got);
  kiln_remote_result_free(&shared);
  kiln_test_args_free(a0, n);
  kiln_test_args_free(a1, n);
  kiln_remote_executable_free(e);
  kiln_remote_executable_free(e2);
  kiln_remote_executable_free(ref);
  kiln_client_close(c);
}

START_TEST(test_global_replicas_cpu) { check_global_replicas("cpu"); }
END_TEST

START_TEST(test_global_replicas_interp) { check_global_replicas("interp"); }
END_TEST

START_TEST(test_data_parallel_cpu) { check_global(dp_hlo, "cpu", 4); }
END_TEST

START_TEST(test_data_parallel_interp) { check_global(dp_hlo, "interp", 4); }
END_TEST

START_TEST(test_megatron_cpu) { check_global(megatron_hlo, "cpu", 4); }
END_TEST

START_TEST(test_megatron_interp) { check_global(megatron_hlo, "interp", 4); }
END_TEST

START_TEST(test_two_of_four) { check_global(dp2_hlo, "cpu", 2); }
END_TEST

/* Server buffers work with SPMD programs: a global argument by handle, a
 * global output and a per-device output kept on the server. */
/* Optimization level 3 includes auto-sharding: an MLP with no shardings,
 * compiled for 4 devices, is planned by the server (GLPK), partitioned and
 * equals the unpartitioned run; at level 2 the same request is a per-device
 * program (every device runs it whole). */
static const char plain_mlp_hlo[] =
    "HloModule plain_mlp\n"
    "ENTRY e {\n x = f32[64,32] parameter(0)\n w1 = f32[32,64] parameter(1)\n"
    " w2 = f32[64,16] parameter(2)\n"
    " h = f32[64,64] dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    " t = f32[64,64] tanh(h)\n"
    " ROOT y = f32[64,16] dot(t, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n";

START_TEST(test_auto_shard_level3) {
  if (!kiln_spmd_auto_available()) return; /* built without GLPK */
  kiln_client *c = connect_as("spmd-auto");
  kiln_remote_executable *ref = compile(c, plain_mlp_hlo, "interp", 1);
  kiln_remote_compile_options o = {
      .backend = "cpu", .device_count = 4, .has_optimization_level = true, .optimization_level = 3};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_executable *e = NULL;
  ck_assert_msg(kiln_client_compile_text(c, plain_mlp_hlo, strlen(plain_mlp_hlo), &o, &e, &st) == 0,
                "compile -O3 x4: %s: %s", st.where, st.msg);
  ck_assert(!e->per_device);
  ck_assert_int_eq(e->num_partitions, 4);
  kiln_literal **args;
  uint32_t n;
  random_args(plain_mlp_hlo, 11, &args, &n);
  kiln_remote_result want, got;
  run(c, ref, args, n, NULL, &want);
  run(c, e, args, n, NULL, &got);
  ck_assert_uint_eq(got.noutputs, 1);
  expect_close(got.outputs[0].literal, want.outputs[0].literal, "auto-sharded");
  kiln_remote_result_free(&want);
  kiln_remote_result_free(&got);
  kiln_remote_executable_free(e);
  o.optimization_level = 2;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_compile_text(c, plain_mlp_hlo, strlen(plain_mlp_hlo), &o, &e, &st),
                   0);
  ck_assert(e->per_device);
  kiln_remote_executable_free(e);
  /* a mesh of more axes than the planner takes is refused, naming it */
  int64_t m5[5] = {1, 1, 1, 1, 4};
  o.optimization_level = 3, o.mesh_shape = m5, o.nmesh_shape = 5;
  kiln_status_clear(&st);
  e = NULL;
  ck_assert_int_ne(kiln_client_compile_text(c, plain_mlp_hlo, strlen(plain_mlp_hlo), &o, &e, &st),
                   0);
  ck_assert_int_eq(kiln_rpc_status_code(&st), KILN_RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "auto-sharding takes at most 4") != NULL, "%s: %s", st.where,
                st.msg);
  kiln_test_args_free(args, n);
  kiln_remote_executable_free(ref);
  kiln_client_close(c);
}
END_TEST

START_TEST(test_buffers) {
  kiln_client *c = connect_as("spmd-buffers");
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_executable *ref = compile(c, dp2_hlo, "interp", 1);
  kiln_remote_executable *e = compile(c, dp2_hlo, "cpu", 2);
  kiln_literal **args;
  uint32_t n;
  random_args(dp2_hlo, 9, &args, &n);
  kiln_remote_buffer xb = {0};
  ck_assert_int_eq(kiln_client_put_buffer(c, args[0], NULL, &xb, &st), 0);
  kiln_remote_arg ra[2] = {{.handle = xb.handle}, {.literal = args[1]}};
  bool keep[1] = {true};
  kiln_remote_execute_options xo = {.keep_on_server = keep, .nkeep = 1};
  kiln_remote_result r, want;
  ck_assert_msg(kiln_client_execute(c, e->id, ra, 2, &xo, &r, &st) == 0, "%s", st.msg);
  ck_assert_ptr_nonnull(r.outputs[0].buffer.handle);
  kiln_literal *got = NULL;
  ck_assert_int_eq(kiln_client_get_buffer(c, r.outputs[0].buffer.handle, NULL, &got, &st), 0);
  run(c, ref, args, n, NULL, &want);
  expect_close(got, want.outputs[0].literal, "kept global output");
  kiln_literal_destroy(got);
  kiln_remote_result_free(&r);
  kiln_remote_result_free(&want);
  /* per device: device 2's sum kept, the rest inline */
  kiln_remote_executable *pd = compile(c, perdev_hlo, "cpu", 0);
  kiln_literal *x = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &f32_4, 0, &x, NULL), 0);
  for (int i = 0; i < 4; i++) ((float *)x->data)[i] = (float)i;
  kiln_remote_arg xa[1] = {{.literal = x}};
  bool keep4[5] = {false, false, false, false, true};
  kiln_remote_execute_options po = {.keep_on_server = keep4, .nkeep = 5};
  ck_assert_msg(kiln_client_execute(c, pd->id, xa, 1, &po, &r, &st) == 0, "%s", st.msg);
  ck_assert_uint_eq(r.noutputs, 8);
  ck_assert_ptr_nonnull(r.outputs[4].buffer.handle);
  ck_assert_ptr_null(r.outputs[4].literal);
  ck_assert_int_eq(kiln_client_get_buffer(c, r.outputs[4].buffer.handle, NULL, &got, &st), 0);
  for (int i = 0; i < 4; i++) ck_assert_float_eq(((const float *)got->data)[i], (float)(4 * i));
  kiln_literal_destroy(got);
  kiln_remote_result_free(&r);
  kiln_literal_destroy(x);
  kiln_remote_executable_free(pd);
  kiln_remote_buffer_clear(&xb);
  kiln_test_args_free(args, n);
  kiln_remote_executable_free(e);
  kiln_remote_executable_free(ref);
  kiln_client_close(c);
}
END_TEST

/* The per-device program on 4 devices: one argument for all, or one per
 * device; outputs grouped by device. */
START_TEST(test_per_device) {
  kiln_client *c = connect_as("spmd-perdev");
  const char *backends[2] = {"cpu", "interp"};
  for (int b = 0; b < 2; b++) {
    kiln_remote_executable *e = compile(c, perdev_hlo, backends[b], 0);
    ck_assert_int_eq(e->device_count, 4);
    ck_assert(e->per_device);
    ck_assert_int_eq(e->replica_count, 4);
    kiln_literal *x[4];
    for (int k = 0; k < 4; k++) {
      ck_assert_int_eq(kiln_literal_create(NULL, &f32_4, 0, &x[k], NULL), 0);
      for (int i = 0; i < 4; i++) ((float *)x[k]->data)[i] = (float)(10 * k + i);
    }
    kiln_remote_result r;
    run(c, e, x, 4, NULL, &r);
    ck_assert_uint_eq(r.noutputs, 8);
    for (int k = 0; k < 4; k++) {
      const float *s = r.outputs[2 * k].literal->data;
      for (int i = 0; i < 4; i++) ck_assert_float_eq(s[i], (float)(60 + 4 * i));
      ck_assert_uint_eq(*(const uint32_t *)r.outputs[2 * k + 1].literal->data, (uint32_t)k);
    }
    kiln_remote_result_free(&r);
    run(c, e, x, 1, NULL, &r); /* every device gets x[0] */
    ck_assert_uint_eq(r.noutputs, 8);
    ck_assert_float_eq(((const float *)r.outputs[6].literal->data)[3], 12.0f);
    kiln_remote_result_free(&r);
    for (int k = 0; k < 4; k++) kiln_literal_destroy(x[k]);
    kiln_remote_executable_free(e);
  }
  kiln_client_close(c);
}
END_TEST

/* The cache key holds the mesh: the same module on 4 and 2 devices or on
 * two mesh shapes are different executables; the same request twice is
 * one. */
START_TEST(test_cache_key_mesh) {
  kiln_client *c = connect_as("spmd-cache");
  kiln_remote_executable *a = compile(c, dp2_hlo, "cpu", 2);
  kiln_remote_executable *b = compile(c, dp2_hlo, "cpu", 2);
  ck_assert_str_eq(a->id, b->id);
  ck_assert_int_eq(b->cache_source, KILN_REMOTE_SOURCE_MEMORY);
  kiln_remote_executable *one = compile(c, dp2_hlo, "cpu", 1);
  ck_assert_str_ne(a->id, one->id);
  const char *pd = "HloModule pdm\nENTRY e {\n x = f32[4] parameter(0)\n"
                   " ROOT p = u32[] partition-id()\n}\n";
  kiln_remote_compile_options o = {.backend = "interp", .device_count = 4};
  int64_t m22[2] = {2, 2}, m4[1] = {4};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_executable *flat = NULL, *sq = NULL;
  o.mesh_shape = m4, o.nmesh_shape = 1;
  ck_assert_int_eq(kiln_client_compile_text(c, pd, strlen(pd), &o, &flat, &st), 0);
  o.mesh_shape = m22, o.nmesh_shape = 2;
  ck_assert_int_eq(kiln_client_compile_text(c, pd, strlen(pd), &o, &sq, &st), 0);
  ck_assert_str_ne(flat->id, sq->id);
  ck_assert_int_eq(flat->num_partitions, 4);
  ck_assert_int_eq(sq->replica_count, 2);
  ck_assert_int_eq(sq->num_partitions, 2);
  /* [R, P] = [2, 2]: device K = replica * 2 + partition runs partition K % 2 */
  kiln_literal *x = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &f32_4, 0, &x, NULL), 0);
  kiln_remote_result r;
  run(c, sq, &x, 1, NULL, &r);
  ck_assert_uint_eq(r.noutputs, 4);
  for (uint32_t k = 0; k < 4; k++)
    ck_assert_uint_eq(*(const uint32_t *)r.outputs[k].literal->data, k % 2);
  kiln_remote_result_free(&r);
  kiln_literal_destroy(x);
  kiln_remote_executable_free(flat);
  kiln_remote_executable_free(sq);
  kiln_remote_executable_free(one);
  kiln_remote_executable_free(b);
  kiln_remote_executable_free(a);
  kiln_client_close(c);
}
END_TEST

/* What cannot run is refused, naming the field. */
START_TEST(test_hostile) {
  kiln_client *c = connect_as("spmd-hostile");
  kiln_status st;
  kiln_remote_executable *e = NULL;
  kiln_remote_compile_options o = {.backend = "cpu", .device_count = 8};
  /* more partitions than the server has devices */
  EXPECT_CODE(kiln_client_compile_text(c, dp_hlo, strlen(dp_hlo), &o, &e, &st),
              KILN_RPC_INVALID_ARGUMENT, "device_count");
  /* a mesh whose product is not the device count */
  int64_t m3[1] = {3};
  o.device_count = 4, o.mesh_shape = m3, o.nmesh_shape = 1;
  EXPECT_CODE(kiln_client_compile_text(c, dp_hlo, strlen(dp_hlo), &o, &e, &st),
              KILN_RPC_INVALID_ARGUMENT, "mesh_shape");
  /* shardings over 4 devices partitioned 2 ways */
  o.device_count = 2, o.mesh_shape = NULL, o.nmesh_shape = 0;
  EXPECT_CODE(kiln_client_compile_text(c, dp_hlo, strlen(dp_hlo), &o, &e, &st),
              KILN_RPC_INVALID_ARGUMENT, "devices");
  /* a per-device program whose replica count is not the device count */
  o.device_count = 2;
  EXPECT_CODE(kiln_client_compile_text(c, perdev_hlo, strlen(perdev_hlo), &o, &e, &st),
              KILN_RPC_INVALID_ARGUMENT, "device_count");
  /* a mesh shape other than the per-device module's own */
  int64_t m22[2] = {2, 2};
  o.device_count = 4, o.mesh_shape = m22, o.nmesh_shape = 2;
  EXPECT_CODE(kiln_client_compile_text(c, perdev_hlo, strlen(perdev_hlo), &o, &e, &st),
              KILN_RPC_INVALID_ARGUMENT, "mesh_shape");
  o.mesh_shape = NULL, o.nmesh_shape = 0;
  /* an interpreter mesh past its bound */
  o.backend = "interp", o.device_count = 128;
  EXPECT_CODE(kiln_client_compile_text(c, dp_hlo, strlen(dp_hlo), &o, &e, &st),
              KILN_RPC_INVALID_ARGUMENT, "device_count");
  o.backend = "cpu";
  /* a global program on replicas whose shardings name more partitions
   * than the replicas leave it, and device counts the replicas do not
   * divide */
  char rep[sizeof dp_hlo + 32];
  snprintf(rep, sizeof rep, "HloModule dp, replica_count=2%s", dp_hlo + strlen("HloModule dp"));
  o.device_count = 4;
  EXPECT_CODE(kiln_client_compile_text(c, rep, strlen(rep), &o, &e, &st), KILN_RPC_INVALID_ARGUMENT,
              "2 partitions");
  o.device_count = 3;
  EXPECT_CODE(kiln_client_compile_text(c, rep, strlen(rep), &o, &e, &st), KILN_RPC_INVALID_ARGUMENT,
              "replicas");
  int64_t m13[2] = {2, 2};
  o.device_count = 4, o.mesh_shape = m13, o.nmesh_shape = 2;
  char rep4[sizeof dp_hlo + 32];
  snprintf(rep4, sizeof rep4, "HloModule dp, replica_count=4%s", dp_hlo + strlen("HloModule dp"));
  EXPECT_CODE(kiln_client_compile_text(c, rep4, strlen(rep4), &o, &e, &st),
              KILN_RPC_INVALID_ARGUMENT, "mesh_shape");
  o.mesh_shape = NULL, o.nmesh_shape = 0;
  /* bad device_ids */
  kiln_remote_executable *g = compile(c, dp_hlo, "cpu", 4);
  kiln_literal **args;
  uint32_t n;
  random_args(dp_hlo, 3, &args, &n);
  kiln_remote_arg ra[3];
  for (uint32_t i = 0; i < n; i++) ra[i] = (kiln_remote_arg){.literal = args[i]};
  kiln_remote_result r;
  int32_t twice[4] = {0, 0, 1, 2}, three[3] = {0, 1, 2}, far[4] = {0, 1, 2, 9};
  kiln_remote_execute_options xo = {.device_ids = twice, .ndevice_ids = 4};
  EXPECT_CODE(kiln_client_execute(c, g->id, ra, n, &xo, &r, &st), KILN_RPC_INVALID_ARGUMENT,
              "device_ids");
  xo.device_ids = three, xo.ndevice_ids = 3;
  EXPECT_CODE(kiln_client_execute(c, g->id, ra, n, &xo, &r, &st), KILN_RPC_INVALID_ARGUMENT,
              "device_ids");
  xo.device_ids = far, xo.ndevice_ids = 4;
  EXPECT_CODE(kiln_client_execute(c, g->id, ra, n, &xo, &r, &st), KILN_RPC_INVALID_ARGUMENT,
              "device_ids");
  /* global arguments of the wrong count or shape */
  EXPECT_CODE(kiln_client_execute(c, g->id, ra, 2, NULL, &r, &st), KILN_RPC_INVALID_ARGUMENT,
              "arguments");
  kiln_remote_arg swapped[3] = {ra[1], ra[0], ra[2]};
  EXPECT_CODE(kiln_client_execute(c, g->id, swapped, 3, NULL, &r, &st), KILN_RPC_INVALID_ARGUMENT,
              "argument 0");
  /* a permutation of every device is honoured, in its order */
  int32_t rev[4] = {3, 2, 1, 0};
  xo.device_ids = rev, xo.ndevice_ids = 4;
  run(c, g, args, n, &xo, &r);
  ck_assert_uint_eq(r.ndevice_ids, 4);
  for (int k = 0; k < 4; k++) ck_assert_int_eq(r.device_ids[k], rev[k]);
  kiln_remote_result_free(&r);
  /* two devices named among four: honoured, in order */
  kiln_remote_executable *two = compile(c, dp2_hlo, "cpu", 2);
  int32_t pair[2] = {3, 1};
  xo.device_ids = pair, xo.ndevice_ids = 2;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_client_execute(c, two->id, ra, 2, &xo, &r, &st) == 0, "%s", st.msg);
  ck_assert_uint_eq(r.ndevice_ids, 2);
  ck_assert_int_eq(r.device_ids[0], 3);
  ck_assert_int_eq(r.device_ids[1], 1);
  kiln_remote_result_free(&r);
  /* an interpreter mesh runs in one slot: no choice to make */
  kiln_remote_executable *im = compile(c, dp2_hlo, "interp", 2);
  int32_t ipair[2] = {4, 4};
  xo.device_ids = ipair;
  EXPECT_CODE(kiln_client_execute(c, im->id, ra, 2, &xo, &r, &st), KILN_RPC_INVALID_ARGUMENT,
              "device_ids");
  kiln_remote_executable_free(im);
  /* per-device arguments neither shared nor one group per device */
  kiln_remote_executable *pd = compile(c, perdev_hlo, "cpu", 0);
  kiln_literal *x = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &f32_4, 0, &x, NULL), 0);
  kiln_remote_arg xs[3] = {{.literal = x}, {.literal = x}, {.literal = x}};
  EXPECT_CODE(kiln_client_execute(c, pd->id, xs, 3, NULL, &r, &st), KILN_RPC_INVALID_ARGUMENT,
              "arguments");
  kiln_literal_destroy(x);
  kiln_remote_executable_free(pd);
  kiln_remote_executable_free(two);
  kiln_test_args_free(args, n);
  kiln_remote_executable_free(g);
  kiln_client_close(c);
}
END_TEST

/* Runs the kiln command (KILN_CLI); its exit status. */
static int cli(const char *const *args, char **out, char **err) {
  const char *path = getenv("KILN_CLI");
  ck_assert_msg(path && path[0], "KILN_CLI is not set");
  char *argv[32];
  int n = 0;
  argv[n++] = (char *)path;
  for (int i = 0; args[i] && n < 31; i++) argv[n++] = (char *)args[i];
  argv[n] = NULL;
  return itest_run(argv, out, err);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* kiln run --server with a mesh prints what the local run prints: a
 * per-device program with --device-args device by device, a global program
 * partitioned by --partitions; a mesh too large for the server is refused
 * naming device_count. */
START_TEST(test_cli_remote_mesh) {
  char dir[] = "/tmp/kiln-spmd-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char pd[64], dp[64];
  snprintf(pd, sizeof pd, "%s/pd.hlo", dir);
  snprintf(dp, sizeof dp, "%s/dp.hlo", dir);
  write_file(pd, perdev_hlo);
  write_file(dp, dp2_hlo);
  char *out, *err, *lout, *lerr;
  const char *remote[] = {"run",
                          pd,
                          "--server",
                          server.addr,
                          "--arg",
                          "f32[4] {1, 2, 3, 4}",
                          "--device-args",
                          "2",
                          "f32[4] {10, 10, 10, 10}",
                          NULL};
  const char *local[] = {
      "run", pd, "--arg", "f32[4] {1, 2, 3, 4}", "--device-args", "2", "f32[4] {10, 10, 10, 10}",
      NULL};
  ck_assert_msg(cli(remote, &out, &err) == 0, "remote: %s", err);
  ck_assert_msg(cli(local, &lout, &lerr) == 0, "local: %s", lerr);
  ck_assert_str_eq(out, lout);
  ck_assert_ptr_nonnull(strstr(out, "device 3:\nf32[4] {13, 16, 19, 22}\nu32[] 3\n"));
  free(out), free(err), free(lout), free(lerr);
  /* partial sums reorder additions: the same numbers within a tolerance */
  const char *gr[] = {"run",           dp,  "--server", server.addr, "--partitions", "2",
                      "--random-args", "5", NULL};
  const char *gl[] = {"run", dp, "--partitions", "2", "--random-args", "5", NULL};
  ck_assert_msg(cli(gr, &out, &err) == 0, "remote global: %s", err);
  ck_assert_msg(cli(gl, &lout, &lerr) == 0, "local global: %s", lerr);
  ck_assert(strncmp(out, "f32[16,4] {", 11) == 0 && strncmp(lout, "f32[16,4] {", 11) == 0);
  int nums = 0;
  for (char *p = out + 11, *q = lout + 11; *p && *q;) {
    if (!strchr("-0123456789", *p)) {
      p++, q++;
      continue;
    }
    char *pe, *qe;
    double x = strtod(p, &pe), y = strtod(q, &qe);
    ck_assert_msg(pe > p && qe > q && fabs(x - y) <= 1e-5 * (1 + fabs(x)), "%g vs %g", x, y);
    p = pe, q = qe, nums++;
  }
  ck_assert_int_eq(nums, 64);
  free(out), free(err), free(lout), free(lerr);
  /* a global program on 2 replicas of 2 partitions: each replica's result */
  const char *rr[] = {"run",          dp,  "--server",      server.addr, "--replicas", "2",
                      "--partitions", "2", "--random-args", "5",         NULL};
  const char *rl[] = {"run",           dp,  "--replicas", "2", "--partitions", "2",
                      "--random-args", "5", NULL};
  ck_assert_msg(cli(rr, &out, &err) == 0, "remote replicas: %s", err);
  ck_assert_msg(cli(rl, &lout, &lerr) == 0, "local replicas: %s", lerr);
  ck_assert_msg(strncmp(out, "replica 0:\nf32[16,4] {", 22) == 0, "%s", out);
  ck_assert_msg(strncmp(lout, "replica 0:\nf32[16,4] {", 22) == 0, "%s", lout);
  char *r1 = strstr(out, "replica 1:\nf32[16,4] {"), *l1 = strstr(lout, "replica 1:\nf32[16,4] {");
  ck_assert_ptr_nonnull(r1);
  ck_assert_ptr_nonnull(l1);
  /* the same arguments on both replicas: the same result twice */
  ck_assert_int_eq(strlen(r1 + 11), r1 - out - 11);
  ck_assert_int_eq(strncmp(out + 11, r1 + 11, strlen(r1 + 11)), 0);
  free(out), free(err), free(lout), free(lerr);
  const char *big[] = {"run",           dp,  "--server", server.addr, "--partitions", "8",
                       "--random-args", "5", NULL};
  ck_assert_int_ne(cli(big, &out, &err), 0);
  ck_assert_msg(strstr(err, "device_count") != NULL, "%s", err);
  free(out), free(err);
  unlink(pd);
  unlink(dp);
  rmdir(dir);
}
END_TEST

/* Gangs of 4 and 2 and single-device runs from several clients at once on
 * 4 devices: every call completes (the scheduler claims a gang's devices
 * all at once, so two gangs never hold part of the devices each). */
typedef struct worker_arg {
  const char *text;
  int32_t devices;
  int runs;
  int failures;
  char why[256];
} worker_arg;

static void *worker(void *p) {
  worker_arg *w = p;
  char id[32];
  snprintf(id, sizeof id, "spmd-gang-%d", w->devices);
  kiln_client_options co = {.client_id = id};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_client *c = NULL;
  if (kiln_client_connect(server.addr, &co, &c, &st)) {
    w->failures = w->runs;
    snprintf(w->why, sizeof w->why, "connect: %.200s", st.msg);
    return NULL;
  }
  kiln_remote_compile_options o = {.backend = "cpu", .device_count = w->devices};
  kiln_remote_executable *e = NULL;
  if (kiln_client_compile_text(c, w->text, strlen(w->text), &o, &e, &st)) {
    w->failures = w->runs;
    snprintf(w->why, sizeof w->why, "compile: %.200s", st.msg);
    kiln_client_close(c);
    return NULL;
  }
  kiln_literal **args;
  uint32_t n;
  kiln_module *m = NULL;
  kiln_module_parse_text(w->text, strlen(w->text), "t.hlo", NULL, &m, &st);
  kiln_test_args_random(m, 1, &args, &n, &st);
  kiln_module_destroy(m);
  kiln_remote_arg ra[4];
  for (uint32_t i = 0; i < n; i++) ra[i] = (kiln_remote_arg){.literal = args[i]};
  kiln_remote_execute_options xo = {.deadline_ms = 60000};
  for (int i = 0; i < w->runs; i++) {
    kiln_remote_result r;
    kiln_status_clear(&st);
    if (kiln_client_execute(c, e->id, ra, n, &xo, &r, &st)) {
      w->failures++;
      snprintf(w->why, sizeof w->why, "execute: %.40s: %.180s", st.where, st.msg);
    } else {
      kiln_remote_result_free(&r);
    }
  }
  kiln_test_args_free(args, n);
  kiln_remote_executable_free(e);
  kiln_client_close(c);
  return NULL;
}

START_TEST(test_gangs_do_not_deadlock) {
  worker_arg w[5] = {{megatron_hlo, 4, 12, 0, ""},
                     {dp_hlo, 4, 12, 0, ""},
                     {dp2_hlo, 2, 12, 0, ""},
                     {dp2_hlo, 2, 12, 0, ""},
                     {dp2_hlo, 1, 24, 0, ""}};
  pthread_t t[5];
  for (int i = 0; i < 5; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, worker, &w[i]), 0);
  for (int i = 0; i < 5; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 5; i++)
    ck_assert_msg(w[i].failures == 0, "worker %d (%d devices): %d failures, last %s", i,
                  w[i].devices, w[i].failures, w[i].why);
}
END_TEST

int main(void) {
  itest_require_kilnd("test_spmd_server");
  const char *extra[] = {"--cpu-devices", "4", NULL};
  if (itest_kilnd_start(&server, extra)) return 1;
  Suite *s = suite_create("spmd_server");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_data_parallel_cpu);
  tcase_add_test(tc, test_data_parallel_interp);
  tcase_add_test(tc, test_megatron_cpu);
  tcase_add_test(tc, test_megatron_interp);
  tcase_add_test(tc, test_two_of_four);
  tcase_add_test(tc, test_global_replicas_cpu);
  tcase_add_test(tc, test_global_replicas_interp);
  tcase_add_test(tc, test_per_device);
  tcase_add_test(tc, test_buffers);
  tcase_add_test(tc, test_auto_shard_level3);
  tcase_add_test(tc, test_cache_key_mesh);
  tcase_add_test(tc, test_hostile);
  tcase_add_test(tc, test_cli_remote_mesh);
  tcase_add_test(tc, test_gangs_do_not_deadlock);
  suite_add_tcase(s, tc);
  return itest_run_suite("test_spmd_server", s, &server);
}
