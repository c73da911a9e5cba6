/* The SPMD partitioner (compiler/spmd/): tilings, propagation, the per-op
 * rules and global arrays (executor/run_spmd.c).
 *
 * The oracle is the unpartitioned module on the interpreter: every
 * partitioned program, run on a mesh of interpreters (and of cpu devices
 * for a subset) with global arguments sharded and the result assembled,
 * must equal it. Programs come from the random generator
 * (tests/support/progen.c) with random shardings on their parameters and
 * result, on 1, 2, 4 and 8 devices; hand-written ones check the
 * communication the partitioner chooses (one all-reduce for a Megatron MLP,
 * none for a data-parallel forward pass, an all-gather for FSDP) and uneven
 * shards (sizes not divisible by the device count).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/compile.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/sharding.h"
#include "compiler/ir/text.h"
#include "compiler/spmd/spmd.h"
#include "compiler/spmd/spmd_internal.h"
#include "executor/run_spmd.h"
#include "tests/support/progen.h"
#include "tests/support/testargs.h"

static kiln_module *parse_ok(const char *text) {
  kiln_status st = {0};
  kiln_module *m = NULL;
  int rc = kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st);
  ck_assert_msg(rc == 0, "parse failed: %s: %s\n%s", st.where, st.msg, text);
  return m;
}

/* Whether a and b agree within a float tolerance (partial sums reorder
 * additions); *why says where they do not. */
static bool close_enough(const kiln_literal *a, const kiln_literal *b, char *why, size_t n) {
  if (kiln_shape_is_tuple(&a->shape) || kiln_shape_is_tuple(&b->shape)) {
    if (a->shape.rank != b->shape.rank || !a->elems || !b->elems) {
      snprintf(why, n, "tuple arity differs");
      return false;
    }
    for (uint32_t i = 0; i < a->shape.rank; i++)
      if (!close_enough(a->elems[i], b->elems[i], why, n)) return false;
    return true;
  }
  if (!kiln_shape_same_dims(&a->shape, &b->shape) || a->shape.dtype != b->shape.dtype) {
    snprintf(why, n, "shapes differ");
    return false;
  }
  if (!kiln_shape_is_array(&a->shape)) return true;
  int64_t ne = kiln_literal_elements(a);
  bool fl = kiln_dtype_is_float(a->shape.dtype);
  for (int64_t i = 0; i < ne; i++) {
    double x = kiln_literal_get_f64(a, i), y = kiln_literal_get_f64(b, i);
    if (isnan(x) && isnan(y)) continue;
    if (x == y) continue;
    if (fl && fabs(x - y) <= 1e-4 * (1 + fabs(x) + fabs(y))) continue;
    snprintf(why, n, "element %lld: %g vs %g", (long long)i, x, y);
    return false;
  }
  return true;
}

/* ---- tilings ------------------------------------------------------------- */

START_TEST(test_tiling_groups_and_derive) {
  kiln_arena *a = kiln_arena_create();
  kiln_status st = {0};
  /* devices=[2,4]<=[8]: device d at row d/4, column d%4. */
  kiln_sharding s = {.kind = KILN_SHARD_TILED};
  int64_t td[2] = {2, 4}, rs[1] = {8};
  s.tile_dims = (kiln_i64s){td, 2};
  s.iota_reshape = (kiln_i64s){rs, 1};
  spmd_tiling *t;
  ck_assert_int_eq(kiln__tiling_from_sharding(a, &s, 2, 8, "t", &t, &st), 0);
  ck_assert_int_eq(kiln__tiling_coord(t, 6, 0), 1);
  ck_assert_int_eq(kiln__tiling_coord(t, 6, 1), 2);
  bool dims[2] = {false, true};
  int64_t *g, ng, size;
  ck_assert_int_eq(kiln__tiling_groups(a, t, dims, &g, &ng, &size), 0);
  ck_assert_int_eq(ng, 2);
  ck_assert_int_eq(size, 4);
  int64_t want[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  ck_assert_mem_eq(g, want, sizeof want);
  dims[0] = true, dims[1] = false;
  ck_assert_int_eq(kiln__tiling_groups(a, t, dims, &g, &ng, &size), 0);
  int64_t want2[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  ck_assert_mem_eq(g, want2, sizeof want2);
  /* Transposing twice is the identity; folding a dim keeps the devices'
   * other coordinates. */
  int64_t perm[2] = {1, 0};
  spmd_tiling *tt = kiln__tiling_derive(a, kiln__tiling_derive(a, t, perm, 2), perm, 2);
  ck_assert(kiln__tiling_equal(t, tt));
  bool fold[2] = {true, false};
  spmd_tiling *f = kiln__tiling_fold(a, t, fold);
  ck_assert_int_eq(f->tiles[0], 1);
  ck_assert_int_eq(f->rep, 2);
  for (int64_t k = 0; k < 8; k++)
    ck_assert_int_eq(kiln__tiling_coord(f, k, 1), kiln__tiling_coord(t, k, 1));
  ck_assert(kiln__tiling_covers(kiln__tiling_replicated(a, 2, 8), t));
  ck_assert(!kiln__tiling_covers(t, kiln__tiling_replicated(a, 2, 8)));
  /* Round trip through a sharding. */
  spmd_tiling *back;
  ck_assert_int_eq(
      kiln__tiling_from_sharding(a, kiln__tiling_to_sharding(a, f), 2, 8, "t", &back, &st), 0);
  ck_assert(kiln__tiling_equal(f, back));
  /* Manual shardings are refused by name. */
  kiln_sharding man = {.kind = KILN_SHARD_MANUAL};
  ck_assert_int_eq(kiln__tiling_from_sharding(a, &man, 2, 8, "t", &t, &st), KILN_EUNIMPL);
  ck_assert_ptr_nonnull(strstr(st.msg, "manual"));
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(test_sdy_sharding) {
  kiln_module *m = parse_ok(
      "HloModule a, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<[\"x\"=2, \"y\"=4]>}}\n"
      "ENTRY e {\n p = f32[8,8] parameter(0)\n"
      " ROOT r = f32[8,8] custom-call(p), custom_call_target=\"xla.sdy.FuncResultSharding\", "
      "custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding="
      "\"#sdy.sharding_per_value<[<@mesh, [{\\\"y\\\"}, {}]>]>\"}\n}\n");
  kiln_arena *a = kiln_arena_create();
  kiln_status st = {0};
  const kiln_sharding *s;
  const kiln_instr *root = kiln_computation_root(m, kiln_module_entry(m));
  ck_assert_int_eq(kiln__user_sharding(a, m, root, &s, &st), 0);
  ck_assert_ptr_nonnull(s);
  /* {"y"} on dim 0 over mesh x=2,y=4: devices=[4,1,2]<=[2,4]T(1,0). */
  spmd_tiling *t;
  ck_assert_int_eq(kiln__tiling_from_sharding(a, s, 2, 8, "t", &t, &st), 0);
  ck_assert_int_eq(t->tiles[0], 4);
  ck_assert_int_eq(t->tiles[1], 1);
  ck_assert_int_eq(t->rep, 2);
  ck_assert_int_eq(kiln__tiling_coord(t, 1, 0), 1); /* device 1 = (x 0, y 1) */
  ck_assert_int_eq(kiln__tiling_coord(t, 4, 0), 0); /* device 4 = (x 1, y 0) */
  kiln_arena_destroy(a);
  kiln_module_destroy(m);
}
END_TEST

/* ---- hand-written programs ----------------------------------------------- */

/* Partitions `text` over p devices, checks the collectives (counts per
 * kind, -1: not checked) and that the result on the interp mesh equals the
 * unpartitioned one. */
static void check_program(const char *text, int64_t p, const char *backend, int ar, int ag) {
  kiln_module *m = parse_ok(text);
  kiln_status st = {0};
  kiln_literal **args;
  uint32_t n;
  ck_assert_int_eq(kiln_test_args_random(m, 7, &args, &n, &st), 0);
  kiln_literal *want = NULL, *got = NULL;
  ck_assert_msg(kiln_interp_run(m, (const kiln_literal *const *)args, n, NULL, &want, &st) == 0,
                "%s", st.msg);
  kiln_spmd_stats stats;
  int rc = kiln_run_module_global(m, backend, NULL, (uint32_t)p, NULL,
                                  (const kiln_literal *const *)args, n, &got, &stats, &st);
  ck_assert_msg(rc == 0, "%s: %s", st.where, st.msg);
  char why[200];
  ck_assert_msg(close_enough(want, got, why, sizeof why), "%s on %lld devices: %s", backend,
                (long long)p, why);
  if (ar >= 0) ck_assert_int_eq(stats.count[KILN_SPMD_ALL_REDUCE], ar);
  if (ag >= 0) ck_assert_int_eq(stats.count[KILN_SPMD_ALL_GATHER], ag);
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  kiln_test_args_free(args, n);
  kiln_module_destroy(m);
}

/* ---- halo exchange --------------------------------------------------------- */

/* body (an ENTRY's instructions after "x = f32[16,6] parameter(0), split")
 * on P = 2, 4 and 8 devices (the cpu backend on 4), the sharding text
 * "{S}" standing for devices=[P,1]<=[P] ("{S3}": [1,P,1]): equal to the unpartitioned
 * interpreter, with no all-gather and `permutes` collective-permutes (-1:
 * some) on 4 devices. */
static void check_halo(const char *body, int permutes) {
  for (int64_t P = 2; P <= 8; P *= 2) {
    char shard[48], shard3[48], text[2048], out[2048];
    snprintf(shard, sizeof shard, "{devices=[%lld,1]<=[%lld]}", (long long)P, (long long)P);
    snprintf(shard3, sizeof shard3, "{devices=[1,%lld,1]<=[%lld]}", (long long)P, (long long)P);
    snprintf(text, sizeof text,
             "HloModule halo\n"
             "max {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
             " ROOT m = f32[] maximum(a, b)\n}\n"
             "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
             " ROOT s = f32[] add(a, b)\n}\n"
             "ENTRY e {\n x = f32[16,6] parameter(0), sharding={S}\n%s}\n",
             body);
    size_t o = 0;
    for (const char *c = text; *c && o + 48 < sizeof out; c++) {
      if (strncmp(c, "{S}", 3) == 0) {
        o += (size_t)snprintf(out + o, sizeof out - o, "%s", shard);
        c += 2;
      } else if (strncmp(c, "{S3}", 4) == 0) {
        o += (size_t)snprintf(out + o, sizeof out - o, "%s", shard3);
        c += 3;
      } else {
        out[o++] = *c;
      }
    }
    out[o] = '\0';
    kiln_module *m = parse_ok(out);
    kiln_status st = {0};
    kiln_literal **args;
    uint32_t n;
    ck_assert_int_eq(kiln_test_args_random(m, 11, &args, &n, &st), 0);
    kiln_literal *want = NULL;
    ck_assert_msg(kiln_interp_run(m, (const kiln_literal *const *)args, n, NULL, &want, &st) == 0,
                  "%s", st.msg);
    const char *backends[2] = {"interp", "cpu"};
    for (int b = 0; b < (P == 4 ? 2 : 1); b++) {
      kiln_literal *got = NULL;
      kiln_spmd_stats stats;
      int rc = kiln_run_module_global(m, backends[b], NULL, (uint32_t)P, NULL,
                                      (const kiln_literal *const *)args, n, &got, &stats, &st);
      ck_assert_msg(rc == 0, "%s: %s\n%s", st.where, st.msg, out);
      char why[200];
      ck_assert_msg(close_enough(want, got, why, sizeof why), "%s on %lld devices: %s\n%s",
                    backends[b], (long long)P, why, out);
      ck_assert_msg(stats.count[KILN_SPMD_ALL_GATHER] == 0, "%u all-gathers on %lld devices\n%s",
                    stats.count[KILN_SPMD_ALL_GATHER], (long long)P, out);
      if (P == 4 && permutes >= 0)
        ck_assert_int_eq(stats.count[KILN_SPMD_COLLECTIVE_PERMUTE], permutes);
      if (P == 4 && permutes < 0) ck_assert_uint_gt(stats.count[KILN_SPMD_COLLECTIVE_PERMUTE], 0);
      kiln_literal_destroy(got);
    }
    kiln_literal_destroy(want);
    kiln_test_args_free(args, n);
    kiln_module_destroy(m);
  }
}

START_TEST(test_halo_pad) {
  /* one halo from the left neighbour (the edge is the pad value) */
  check_halo(" c = f32[] constant(0.5)\n"
             " ROOT y = f32[19,6] pad(x, c), padding=2_1x0_0, sharding={S}\n",
             -1);
  /* cropping is a negative pad: the halo comes from the right */
  check_halo(" c = f32[] constant(0)\n"
             " ROOT y = f32[13,6] pad(x, c), padding=-1_-2x0_0, sharding={S}\n",
             -1);
}
END_TEST

START_TEST(test_halo_slice_concat) {
  check_halo(" ROOT y = f32[13,6] slice(x), slice={[2:15], [0:6]}, sharding={S}\n", -1);
  check_halo(" z = f32[8,6] parameter(1), sharding={S}\n"
             " ROOT y = f32[24,6] concatenate(x, z), dimensions={0}, sharding={S}\n",
             -1);
  /* a shifted difference, as jnp.diff writes it */
  check_halo(" a = f32[15,6] slice(x), slice={[1:16], [0:6]}, sharding={S}\n"
             " b = f32[15,6] slice(x), slice={[0:15], [0:6]}, sharding={S}\n"
             " ROOT d = f32[15,6] subtract(a, b), sharding={S}\n",
             -1);
}
END_TEST

START_TEST(test_halo_reduce_window) {
  /* "same" max pooling: one halo each way (two permutes), the edges -inf */
  check_halo(" i = f32[] constant(-inf)\n"
             " ROOT y = f32[16,6] reduce-window(x, i), window={size=3x1 pad=1_1x0_0}, "
             "to_apply=max, sharding={S}\n",
             2);
  /* stride 2, window 2: every window within one shard, no communication */
  check_halo(" i = f32[] constant(0)\n"
             " ROOT y = f32[8,6] reduce-window(x, i), window={size=2x1 stride=2x1}, "
             "to_apply=add, sharding={S}\n",
             0);
  /* a valid window 3 wide (the result shorter than the operand) */
  check_halo(" i = f32[] constant(0)\n"
             " ROOT y = f32[14,6] reduce-window(x, i), window={size=3x1}, to_apply=add, "
             "sharding={S}\n",
             -1);
  /* sharded only by propagation from the parameter */
  check_halo(" i = f32[] constant(-inf)\n"
             " r = f32[16,6] reduce-window(x, i), window={size=3x1 pad=1_1x0_0}, to_apply=max\n"
             " ROOT t = f32[16,6] tanh(r), sharding={S}\n",
             2);
}
END_TEST

START_TEST(test_halo_2d_and_uneven) {
  /* both dims split: the corners come with the second exchange */
  check_program("HloModule h2\n"
                "max {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
                " ROOT m = f32[] maximum(a, b)\n}\n"
                "ENTRY e {\n x = f32[8,8] parameter(0), sharding={devices=[2,2]<=[4]}\n"
                " i = f32[] constant(-inf)\n"
                " ROOT y = f32[8,8] reduce-window(x, i), window={size=3x3 pad=1_1x1_1}, "
                "to_apply=max, sharding={devices=[2,2]<=[4]}\n}\n",
                4, "interp", 0, 0);
  /* 15 rows over 4 devices: the last shard padded */
  check_program("HloModule hu\n"
                "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
                " ROOT s = f32[] add(a, b)\n}\n"
                "ENTRY e {\n x = f32[15,3] parameter(0), sharding={devices=[4,1]<=[4]}\n"
                " i = f32[] constant(0)\n c = f32[] constant(1)\n"
                " p = f32[18,3] pad(x, c), padding=1_2x0_0, sharding={devices=[4,1]<=[4]}\n"
                " ROOT y = f32[18,3] reduce-window(p, i), window={size=3x1 pad=1_1x0_0}, "
                "to_apply=add, sharding={devices=[4,1]<=[4]}\n}\n",
                4, "interp", 0, 0);
}
END_TEST

START_TEST(test_halo_convolution) {
  /* a "same" 1-D convolution split along its spatial dim: one halo each
   * way, the kernel whole, no gather */
  check_halo(" xb = f32[1,16,6] reshape(x), sharding={S3}\n"
             " k = f32[3,6,4] parameter(1), sharding={replicated}\n"
             " ROOT y = f32[1,16,4] convolution(xb, k), window={size=3 pad=1_1}, "
             "dim_labels=b0f_0io->b0f, sharding={S3}\n",
             2);
  /* strided, sharded only by propagation from the input */
  check_halo(" xb = f32[1,16,6] reshape(x), sharding={S3}\n"
             " k = f32[2,6,4] parameter(1), sharding={replicated}\n"
             " c = f32[1,8,4] convolution(xb, k), window={size=2 stride=2}, "
             "dim_labels=b0f_0io->b0f\n"
             " ROOT t = f32[1,8,4] tanh(c), sharding={S3}\n",
             0);
  /* valid: the result shorter than the input */
  check_halo(" xb = f32[1,16,6] reshape(x), sharding={S3}\n"
             " k = f32[5,6,2] parameter(1), sharding={replicated}\n"
             " ROOT y = f32[1,12,2] convolution(xb, k), window={size=5}, "
             "dim_labels=b0f_0io->b0f, sharding={S3}\n",
             -1);
  /* 2-D, batch and one spatial dim split */
  check_program("HloModule c2\n"
                "ENTRY e {\n x = f32[2,8,6,3] parameter(0), sharding={devices=[2,2,1,1]<=[4]}\n"
                " k = f32[3,3,3,4] parameter(1), sharding={replicated}\n"
                " ROOT y = f32[2,8,6,4] convolution(x, k), window={size=3x3 pad=1_1x1_1}, "
                "dim_labels=b01f_01io->b01f, sharding={devices=[2,2,1,1]<=[4]}\n}\n",
                4, "interp", 0, 0);
}
END_TEST

/* ---- manual regions (shard_map) ------------------------------------------ */

/* What JAX 0.10 writes for shard_map(psum(tanh(a) @ b), in_specs=(P(None, "x"),
 * P("x", None)), out_specs=OUT) over a mesh MESH with manual axes AXES. */
static void shard_map_text(char *out, size_t n, const char *mesh, const char *axes,
                           const char *out_spec, const char *out_shape, const char *ar) {
  snprintf(out, n,
           "HloModule sm, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<%s>}}\n"
           "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
           " ROOT s = f32[] add(a, b)\n}\n"
           "body {\n a = f32[8,4] parameter(0)\n b = f32[4,4] parameter(1)\n"
           " t = f32[8,4] tanh(a)\n"
           " d = f32[8,4] dot(t, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
           " ROOT r = f32[8,4] %s\n}\n"
           "ENTRY e {\n a = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}\n"
           " b = f32[16,4] parameter(1), sharding={devices=[4,1]<=[4]}\n"
           " g = (f32[8,4], f32[4,4]) custom-call(a, b), "
           "custom_call_target=\"xla.sdy.GlobalToLocalShape\", custom_call_has_side_effect=true, "
           "frontend_attributes={xla.sdy.in_shardings=\"#sdy.sharding_per_value<[<@mesh, [{}, "
           "{\\\"x\\\"}]>, <@mesh, [{\\\"x\\\"}, {}]>]>\",xla.sdy.manual_axes=\"#sdy<manual_axes"
           "{%s}>\"}\n"
           " g0 = f32[8,4] get-tuple-element(g), index=0\n"
           " g1 = f32[4,4] get-tuple-element(g), index=1\n"
           " c = f32[8,4] call(g0, g1), to_apply=body, frontend_attributes={inlineable=\"false\"}\n"
           " ROOT o = %s custom-call(c), custom_call_target=\"xla.sdy.LocalToGlobalShape\", "
           "custom_call_has_side_effect=true, frontend_attributes={xla.sdy.manual_axes="
           "\"#sdy<manual_axes{%s}>\",xla.sdy.out_shardings=\"#sdy.sharding_per_value<[<@mesh, "
           "%s>]>\"}\n}\n",
           mesh, ar, axes, out_shape, axes, out_spec);
}

START_TEST(test_shard_map_region) {
  char text[4096];
  const char *psum = "all-reduce(d), channel_id=1, replica_groups={{0,1,2,3}}, "
                     "use_global_device_ids=true, to_apply=add";
  shard_map_text(text, sizeof text, "[\"x\"=4]", "\\\"x\\\"", "[{}, {}]", "f32[8,4]", psum);
  kiln_module *m = parse_ok(text);
  ck_assert(kiln_spmd_module_is_sharded(m));
  kiln_status st = {0};
  kiln_literal **args;
  uint32_t n;
  ck_assert_int_eq(kiln_test_args_random(m, 5, &args, &n, &st), 0);
  /* the reference: tanh(a) @ b on one device */
  kiln_module *ref = parse_ok("HloModule r\nENTRY e {\n a = f32[8,16] parameter(0)\n"
                              " b = f32[16,4] parameter(1)\n t = f32[8,16] tanh(a)\n"
                              " ROOT d = f32[8,4] dot(t, b), lhs_contracting_dims={1}, "
                              "rhs_contracting_dims={0}\n}\n");
  kiln_literal *want = NULL;
  ck_assert_int_eq(kiln_interp_run(ref, (const kiln_literal *const *)args, n, NULL, &want, &st), 0);
  const char *backends[2] = {"interp", "cpu"};
  for (int b = 0; b < 2; b++) {
    kiln_literal *got = NULL;
    kiln_spmd_stats stats;
    int rc = kiln_run_module_global(m, backends[b], NULL, 4, NULL,
                                    (const kiln_literal *const *)args, n, &got, &stats, &st);
    ck_assert_msg(rc == 0, "%s: %s", st.where, st.msg);
    char why[200];
    ck_assert_msg(close_enough(want, got, why, sizeof why), "%s: %s", backends[b], why);
    /* the body's psum is the only collective: the inputs are already split */
    ck_assert_int_eq(stats.count[KILN_SPMD_ALL_REDUCE], 1);
    ck_assert_int_eq(stats.count[KILN_SPMD_ALL_GATHER], 0);
    kiln_literal_destroy(got);
  }
  kiln_literal_destroy(want);
  kiln_module_destroy(m);
  /* the result split by rows (out_specs P("x")): the per-device partial
   * products, stacked */
  shard_map_text(text, sizeof text, "[\"x\"=4]", "\\\"x\\\"", "[{\\\"x\\\"}, {}]", "f32[32,4]",
                 "negate(d)");
  m = parse_ok(text);
  kiln_literal *got = NULL;
  ck_assert_int_eq(kiln_run_module_global(m, "interp", NULL, 4, NULL,
                                          (const kiln_literal *const *)args, n, &got, NULL, &st),
                   0);
  ck_assert_int_eq(got->shape.dims[0], 32);
  kiln_literal_destroy(got);
  kiln_module_destroy(m);
  /* manual over no axis of its mesh: refused by name */
  shard_map_text(text, sizeof text, "[\"x\"=4]", "", "[{}, {}]", "f32[8,4]", psum);
  m = parse_ok(text);
  kiln_spmd_program *prog = NULL;
  ck_assert_int_eq(kiln_spmd_partition(m, 4, NULL, &prog, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "manual over no axis") != NULL, "%s", st.msg);
  kiln_module_destroy(m);
  kiln_module_destroy(ref);
  kiln_test_args_free(args, n);
}
END_TEST

/* A region manual over x of a mesh x=4, y=2 (device = 2x + y), as JAX 0.10
 * writes shard_map(..., axis_names={"x"}): the body sees its shard along x
 * and the whole of the automatic axis y, and its psum runs over the
 * devices of one y ({0,2,4,6}, {1,3,5,7}). Parameter a arrives split along
 * both axes (rows by y, columns by x) and is gathered along y on the way
 * in; a manual axis minor to an automatic one in a dim is refused by
 * name. */
static void partial_text2(char *out, size_t n, const char *a_in, const char *b_sharding,
                          const char *a_attrs, const char *o_attrs);
static void partial_text(char *out, size_t n, const char *a_in, const char *b_sharding) {
  partial_text2(out, n, a_in, b_sharding, "", "");
}

/* ... with a_attrs after a's sharding and o_attrs after the result's
 * frontend attributes. */
static void partial_text2(char *out, size_t n, const char *a_in, const char *b_sharding,
                          const char *a_attrs, const char *o_attrs) {
  snprintf(out, n,
           "HloModule pm, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<[\"x\"=4, "
           "\"y\"=2]>}}\n"
           "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
           " ROOT s = f32[] add(a, b)\n}\n"
           "body {\n a = f32[8,4] parameter(0)\n b = f32[4,4] parameter(1)\n"
           " t = f32[8,4] tanh(a)\n"
           " d = f32[8,4] dot(t, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
           " ROOT r = f32[8,4] all-reduce(d), channel_id=1, replica_groups={{0,2,4,6},{1,3,5,7}}, "
           "use_global_device_ids=true, to_apply=add\n}\n"
           "ENTRY e {\n a = f32[8,16] parameter(0), sharding={devices=[2,4]<=[4,2]T(1,0)}%s\n"
           " b = f32[16,4] parameter(1), sharding=%s\n"
           " g = (f32[8,4], f32[4,4]) custom-call(a, b), "
           "custom_call_target=\"xla.sdy.GlobalToLocalShape\", custom_call_has_side_effect=true, "
           "frontend_attributes={xla.sdy.in_shardings=\"#sdy.sharding_per_value<[<@mesh, [{?}, "
           "%s]>, <@mesh, [{\\\"x\\\"}, {?}]>]>\",xla.sdy.manual_axes=\"#sdy<manual_axes"
           "{\\\"x\\\"}>\"}\n"
           " g0 = f32[8,4] get-tuple-element(g), index=0\n"
           " g1 = f32[4,4] get-tuple-element(g), index=1\n"
           " c = f32[8,4] call(g0, g1), to_apply=body, frontend_attributes={inlineable=\"false\"}\n"
           " ROOT o = f32[8,4] custom-call(c), custom_call_target=\"xla.sdy.LocalToGlobalShape\", "
           "custom_call_has_side_effect=true, frontend_attributes={xla.sdy.manual_axes="
           "\"#sdy<manual_axes{\\\"x\\\"}>\",xla.sdy.out_shardings=\"#sdy.sharding_per_value<[<@"
           "mesh, [{?}, {?}]>]>\"}%s\n}\n",
           a_attrs, b_sharding, a_in, o_attrs);
}

static const char partial_ref[] =
    "HloModule r\nENTRY e {\n a = f32[8,16] parameter(0)\n"
    " b = f32[16,4] parameter(1)\n t = f32[8,16] tanh(a)\n"
    " ROOT d = f32[8,4] dot(t, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n";

/* The global run of text over p devices on backend equals the reference's
 * on the interpreter; the collectives' counts into *stats. */
static void check_against(const char *text, const char *ref_text, uint32_t p, const char *backend,
                          kiln_spmd_stats *stats) {
  kiln_module *m = parse_ok(text), *ref = parse_ok(ref_text);
  ck_assert(kiln_spmd_module_is_sharded(m));
  kiln_status st = {0};
  kiln_literal **args;
  uint32_t n;
  ck_assert_int_eq(kiln_test_args_random(ref, 5, &args, &n, &st), 0);
  kiln_literal *want = NULL, *got = NULL;
  ck_assert_int_eq(kiln_interp_run(ref, (const kiln_literal *const *)args, n, NULL, &want, &st), 0);
  int rc = kiln_run_module_global(m, backend, NULL, p, NULL, (const kiln_literal *const *)args, n,
                                  &got, stats, &st);
  ck_assert_msg(rc == 0, "%s: %s: %s", backend, st.where, st.msg);
  char why[200];
  ck_assert_msg(close_enough(want, got, why, sizeof why), "%s: %s", backend, why);
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  kiln_test_args_free(args, n);
  kiln_module_destroy(ref);
  kiln_module_destroy(m);
}

START_TEST(test_shard_map_partially_manual) {
  char text[4096];
  const char *backends[2] = {"interp", "cpu"};
  for (int k = 0; k < 2; k++) {
    kiln_spmd_stats stats;
    /* b split by rows along x (and replicated along y) is already the
     * region's b: the psum and a's gather along y are all that moves */
    partial_text(text, sizeof text, "{\\\"x\\\"}",
                 "{devices=[4,1,2]<=[8] last_tile_dim_replicate}");
    check_against(text, partial_ref, 8, backends[k], &stats);
    ck_assert_int_eq(stats.count[KILN_SPMD_ALL_REDUCE], 1);
    ck_assert_int_eq(stats.bytes[KILN_SPMD_ALL_REDUCE], 8 * 4 * 4);
    ck_assert_int_eq(stats.count[KILN_SPMD_ALL_GATHER], 1);
    ck_assert_int_eq(stats.bytes[KILN_SPMD_ALL_GATHER], 8 * 4 * 4);
  }
  /* a's Shardy sharding says its rows are split by y, which the region
   * leaves automatic: the body is split along y as a is (no gather on the
   * way in), its psum moves the shard only, and the result stays split by
   * rows along y */
  for (int k = 0; k < 2; k++) {
    kiln_spmd_stats st2;
    partial_text2(text, sizeof text, "{\\\"x\\\"}", "{replicated}",
                  ", frontend_attributes={xla.sdy.sharding=\"#sdy.sharding<@mesh, [{\\\"y\\\"}, "
                  "{\\\"x\\\"}]>\"}",
                  ", sharding={devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}");
    check_against(text, partial_ref, 8, backends[k], &st2);
    ck_assert_int_eq(st2.count[KILN_SPMD_ALL_REDUCE], 1);
    ck_assert_int_eq(st2.bytes[KILN_SPMD_ALL_REDUCE], 4 * 4 * 4);
    ck_assert_int_eq(st2.count[KILN_SPMD_ALL_GATHER], 0);
  }
  /* an automatic axis named in in_shardings (a's columns split by x, then
   * y) is left out: the region's values are whole along y */
  kiln_spmd_stats stats;
  partial_text(text, sizeof text, "{\\\"x\\\", \\\"y\\\"}", "{replicated}");
  check_against(text, partial_ref, 8, "interp", &stats);
  ck_assert_int_eq(stats.count[KILN_SPMD_ALL_REDUCE], 1);
  kiln_module *m;
  kiln_status st = {0};
  kiln_spmd_program *prog = NULL;
  /* a manual axis minor to an automatic one in a dim: refused by name */
  partial_text(text, sizeof text, "{\\\"y\\\", \\\"x\\\"}", "{replicated}");
  m = parse_ok(text);
  ck_assert_int_eq(kiln_spmd_partition(m, 8, NULL, &prog, &st), KILN_EUNIMPL);
  ck_assert_msg(strstr(st.msg, "not understood") != NULL, "%s", st.msg);
  kiln_module_destroy(m);
}
END_TEST

/* A shard_map of two results (a LocalToGlobalShape of two operands and a
 * tuple of two results), manual over every axis and over x of x=4, y=2:
 * tanh of each device's columns stacked back by columns, and the psum of
 * them over x. With a's Shardy sharding splitting its rows by y, the
 * partially manual body is split along y (no gather in or out, the results
 * kept split as they come out). */
START_TEST(test_shard_map_two_results) {
  const char *ref = "HloModule r\n"
                    "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
                    " ROOT s = f32[] add(a, b)\n}\n"
                    "ENTRY e {\n a = f32[8,16] parameter(0)\n t = f32[8,16] tanh(a)\n"
                    " r = f32[8,4,4] reshape(t)\n z = f32[] constant(0)\n"
                    " s = f32[8,4] reduce(r, z), dimensions={1}, to_apply=add\n"
                    " ROOT o = (f32[8,16], f32[8,4]) tuple(t, s)\n}\n";
  const char *meshes[2] = {"[\"x\"=4]", "[\"x\"=4, \"y\"=2]"};
  const char *groups[2] = {"{{0,1,2,3}}", "{{0,2,4,6},{1,3,5,7}}"};
  const char *asharding[2] = {"{devices=[1,4]<=[4]}", "{devices=[2,4]<=[4,2]T(1,0)}"};
  const char *asdy[2] = {"[{}, {\\\"x\\\"}]", "[{\\\"y\\\"}, {\\\"x\\\"}]"};
  const char *osh[2] = {"{{devices=[1,4]<=[4]}, {replicated}}",
                        "{{devices=[2,4]<=[4,2]T(1,0)}, "
                        "{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}}"};
  for (int k = 0; k < 2; k++) {
    char text[4096];
    snprintf(text, sizeof text,
             "HloModule two, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<%s>}}\n"
             "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
             " ROOT s = f32[] add(a, b)\n}\n"
             "body {\n a = f32[8,4] parameter(0)\n t = f32[8,4] tanh(a)\n"
             " r = f32[8,4] all-reduce(t), channel_id=1, replica_groups=%s, "
             "use_global_device_ids=true, to_apply=add\n"
             " ROOT o = (f32[8,4], f32[8,4]) tuple(t, r)\n}\n"
             "ENTRY e {\n a = f32[8,16] parameter(0), sharding=%s, "
             "frontend_attributes={xla.sdy.sharding=\"#sdy.sharding<@mesh, %s>\"}\n"
             " g = f32[8,4] custom-call(a), custom_call_target=\"xla.sdy.GlobalToLocalShape\", "
             "frontend_attributes={xla.sdy.in_shardings=\"#sdy.sharding_per_value<[<@mesh, [{?}, "
             "{\\\"x\\\"}]>]>\",xla.sdy.manual_axes=\"#sdy<manual_axes{\\\"x\\\"}>\"}\n"
             " c = (f32[8,4], f32[8,4]) call(g), to_apply=body\n"
             " c0 = f32[8,4] get-tuple-element(c), index=0\n"
             " c1 = f32[8,4] get-tuple-element(c), index=1\n"
             " l = (f32[8,16], f32[8,4]) custom-call(c0, c1), "
             "custom_call_target=\"xla.sdy.LocalToGlobalShape\", frontend_attributes={"
             "xla.sdy.manual_axes=\"#sdy<manual_axes{\\\"x\\\"}>\",xla.sdy.out_shardings="
             "\"#sdy.sharding_per_value<[<@mesh, [{?}, {\\\"x\\\"}]>, <@mesh, [{?}, {?}]>]>\"}\n"
             " l0 = f32[8,16] get-tuple-element(l), index=0\n"
             " l1 = f32[8,4] get-tuple-element(l), index=1\n"
             " ROOT o = (f32[8,16], f32[8,4]) tuple(l0, l1), sharding=%s\n}\n",
             meshes[k], groups[k], asharding[k], asdy[k], osh[k]);
    uint32_t p = k ? 8 : 4;
    kiln_spmd_stats stats;
    check_against(text, ref, p, "interp", &stats);
    ck_assert_int_eq(stats.count[KILN_SPMD_ALL_REDUCE], 1);
    /* the psum of the shard only: rows split by y too on the 2-D mesh */
    ck_assert_int_eq(stats.bytes[KILN_SPMD_ALL_REDUCE], k ? 4 * 4 * 4 : 8 * 4 * 4);
    if (k) ck_assert_int_eq(stats.count[KILN_SPMD_ALL_GATHER], 0);
    check_against(text, ref, p, "cpu", &stats);
  }
}
END_TEST

/* XLA's form of the same regions (JAX with jax_use_shardy_partitioner
 * off): a Sharding annotation, SPMDFullToShardShape with {manual} (or a
 * manual subgroup, last_tile_dims={manual, replicated}, for a region manual
 * over some axes), the body (tanh, then a psum over `groups`) on the local
 * shape `local`, SPMDShardToFullShape with the result's sharding. a is
 * f32[8,8] split [2,4] over a mesh x=2, y=4. */
static void gspmd_text(char *out, size_t n, const char *in_sharding, const char *manual,
                       const char *local, const char *groups, const char *out_sharding) {
  snprintf(out, n,
           "HloModule gm\n"
           "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
           " ROOT s = f32[] add(a, b)\n}\n"
           "body {\n a = %s parameter(0)\n t = %s tanh(a)\n"
           " ROOT r = %s all-reduce(t), channel_id=1, replica_groups=%s, "
           "use_global_device_ids=true, to_apply=add\n}\n"
           "ENTRY e {\n a = f32[8,8] parameter(0), sharding={devices=[2,4]<=[8]}\n"
           " s = f32[8,8] custom-call(a), custom_call_target=\"Sharding\", sharding=%s\n"
           " l = %s custom-call(s), custom_call_target=\"SPMDFullToShardShape\", sharding=%s\n"
           " c = %s call(l), to_apply=body\n"
           " m = %s custom-call(c), custom_call_target=\"Sharding\", sharding=%s\n"
           " ROOT o = %s custom-call(m), custom_call_target=\"SPMDShardToFullShape\", "
           "sharding=%s\n}\n",
           local, local, local, groups, in_sharding, local, manual, local, local, manual, local,
           out_sharding);
}

START_TEST(test_shard_map_gspmd_form) {
  char text[4096];
  const char *backends[2] = {"interp", "cpu"};
  /* manual over x (a subgroup): psum over x of tanh of the row halves,
   * whole along y; the input's gather along y, the psum */
  const char *ref = "HloModule r\nENTRY e {\n a = f32[8,8] parameter(0)\n"
                    " t = f32[8,8] tanh(a)\n"
                    " l = f32[4,8] slice(t), slice={[0:4], [0:8]}\n"
                    " h = f32[4,8] slice(t), slice={[4:8], [0:8]}\n"
                    " ROOT r = f32[4,8] add(l, h)\n}\n";
  /* manual over both axes ({manual}): every device's [4,2] tile, summed
   * over all 8; no gather on the way in */
  const char *ref_all = "HloModule r\n"
                        "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
                        " ROOT s = f32[] add(a, b)\n}\n"
                        "ENTRY e {\n a = f32[8,8] parameter(0)\n"
                        " t = f32[8,8] tanh(a)\n"
                        " r = f32[2,4,4,2] reshape(t)\n z = f32[] constant(0)\n"
                        " ROOT s = f32[4,2] reduce(r, z), dimensions={0,2}, to_apply=add\n}\n";
  for (int k = 0; k < 2; k++) {
    kiln_spmd_stats stats;
    gspmd_text(text, sizeof text, "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
               "{devices=[1,1,2,4]<=[8] last_tile_dims={manual, replicated}}", "f32[4,8]",
               "{{0,4},{1,5},{2,6},{3,7}}", "{replicated}");
    check_against(text, ref, 8, backends[k], &stats);
    ck_assert_int_eq(stats.count[KILN_SPMD_ALL_REDUCE], 1);
    ck_assert_int_eq(stats.bytes[KILN_SPMD_ALL_REDUCE], 4 * 8 * 4);
    ck_assert_int_eq(stats.count[KILN_SPMD_ALL_GATHER], 1);
    gspmd_text(text, sizeof text, "{devices=[2,4]<=[8]}", "{manual}", "f32[4,2]",
               "{{0,1,2,3,4,5,6,7}}", "{replicated}");
    check_against(text, ref_all, 8, backends[k], &stats);
    ck_assert_int_eq(stats.count[KILN_SPMD_ALL_REDUCE], 1);
    ck_assert_int_eq(stats.count[KILN_SPMD_ALL_GATHER], 0);
  }
  /* a local shape that is not the operand's shard: refused naming the
   * region's entry */
  gspmd_text(text, sizeof text, "{devices=[2,1,4]<=[8] last_tile_dim_replicate}", "{manual}",
             "f32[4,2]", "{{0,1,2,3,4,5,6,7}}", "{replicated}");
  kiln_module *m = parse_ok(text);
  kiln_status st = {0};
  kiln_spmd_program *prog = NULL;
  ck_assert_int_eq(kiln_spmd_partition(m, 8, NULL, &prog, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "SPMDFullToShardShape") != NULL, "%s", st.msg);
  kiln_module_destroy(m);
  /* a manual annotation on a global value (no region around it) is
   * refused by name */
  m = parse_ok("HloModule man2\nENTRY e {\n x = f32[8] parameter(0), sharding={devices=[4]<=[4]}\n"
               " s = f32[8] custom-call(x), custom_call_target=\"Sharding\", sharding={manual}\n"
               " ROOT n = f32[8] negate(s)\n}\n");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_spmd_partition(m, 4, NULL, &prog, &st), KILN_EUNIMPL);
  ck_assert_msg(strstr(st.msg, "outside a shard_map region") != NULL, "%s", st.msg);
  kiln_module_destroy(m);
  /* {manual} outside a region is still refused by name */
  m = parse_ok("HloModule man\nENTRY e {\n x = f32[8] parameter(0)\n"
               " ROOT n = f32[8] negate(x), sharding={manual}\n}\n");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_spmd_partition(m, 4, NULL, &prog, &st), KILN_EUNIMPL);
  ck_assert_msg(strstr(st.msg, "manual") != NULL, "%s", st.msg);
  kiln_module_destroy(m);
}
END_TEST

static const char megatron[] =
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

START_TEST(test_megatron_one_all_reduce) { check_program(megatron, 4, "interp", 1, 0); }
END_TEST

START_TEST(test_data_parallel_step) {
  /* Forward and the weight gradient of a linear layer, batch split 4 ways:
   * the forward needs no communication, the gradient one all-reduce. */
  check_program("HloModule dp\n"
                "ENTRY e {\n x = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}\n"
                " w = f32[8,4] parameter(1), sharding={replicated}\n"
                " dy = f32[16,4] parameter(2), sharding={devices=[4,1]<=[4]}\n"
                " y = f32[16,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
                " t = f32[16,4] tanh(y)\n"
                " g = f32[8,4] dot(x, dy), lhs_contracting_dims={0}, rhs_contracting_dims={0}, "
                "sharding={replicated}\n"
                " ROOT o = (f32[16,4], f32[8,4]) tuple(t, g)\n}\n",
                4, "interp", 1, 0);
}
END_TEST

START_TEST(test_fsdp_all_gather) {
  /* Weights split along their input dim, batch split: the weight is
   * gathered once, nothing is all-reduced. */
  check_program("HloModule fsdp\n"
                "ENTRY e {\n x = f32[8,16] parameter(0), sharding={devices=[4,1]<=[4]}\n"
                " w = f32[16,8] parameter(1), sharding={devices=[4,1]<=[4]}\n"
                " ROOT y = f32[8,8] dot(x, w), lhs_contracting_dims={1}, "
                "rhs_contracting_dims={0}, sharding={devices=[4,1]<=[4]}\n}\n",
                4, "interp", 0, 1);
}
END_TEST

/* ---- windowed einsum ------------------------------------------------------ */

/* text (its shardings written for p devices) partitioned with windowed
 * einsum forced on (KILN_SPMD_WINDOWED, as every caller without options
 * reads it) and off: on `backend` both equal the unpartitioned
 * interpreter; on, `permutes` collective-permutes, `ar` all-reduces and no
 * all-gather; off, one all-gather and no permute. */
static void check_windowed(const char *text, int64_t p, const char *backend, int permutes, int ar) {
  for (int on = 1; on >= 0; on--) {
    setenv("KILN_SPMD_WINDOWED", on ? "on" : "off", 1);
    kiln_module *m = parse_ok(text);
    kiln_status st = {0};
    kiln_literal **args;
    uint32_t n;
    ck_assert_int_eq(kiln_test_args_random(m, 5, &args, &n, &st), 0);
    kiln_literal *want = NULL, *got = NULL;
    ck_assert_int_eq(kiln_interp_run(m, (const kiln_literal *const *)args, n, NULL, &want, &st), 0);
    kiln_spmd_stats stats;
    int rc = kiln_run_module_global(m, backend, NULL, (uint32_t)p, NULL,
                                    (const kiln_literal *const *)args, n, &got, &stats, &st);
    ck_assert_msg(rc == 0, "%s: %s", st.where, st.msg);
    char why[200];
    ck_assert_msg(close_enough(want, got, why, sizeof why), "%s on %lld, windowed %d: %s", backend,
                  (long long)p, on, why);
    ck_assert_msg(stats.count[KILN_SPMD_COLLECTIVE_PERMUTE] == (uint32_t)(on ? permutes : 0) &&
                      stats.count[KILN_SPMD_ALL_GATHER] == (on ? 0u : 1u) &&
                      stats.count[KILN_SPMD_ALL_REDUCE] == (uint32_t)ar,
                  "%s on %lld, windowed %d: %u permutes, %u all-gathers, %u all-reduces\n%s",
                  backend, (long long)p, on, stats.count[KILN_SPMD_COLLECTIVE_PERMUTE],
                  stats.count[KILN_SPMD_ALL_GATHER], stats.count[KILN_SPMD_ALL_REDUCE], text);
    kiln_literal_destroy(want);
    kiln_literal_destroy(got);
    kiln_test_args_free(args, n);
    kiln_module_destroy(m);
  }
  unsetenv("KILN_SPMD_WINDOWED");
}

/* The dots: the lhs gathered along its rows for a column-split result
 * (the column-parallel matmul of sequence-split activations), the rhs
 * gathered along its columns for a row-split result, on 2, 4 and 8
 * devices (columns 12 over 8: uneven); a batched dot on a 2 x P/2 mesh
 * (the ring along the second axis); rows on one axis and the contraction on
 * the other (the blocks' partial products all-reduced). */
START_TEST(test_windowed_einsum) {
  static const char *backends[2] = {"interp", "cpu"};
  for (int64_t p = 2; p <= 8; p *= 2) {
    for (int b = 0; b < (p == 4 ? 2 : 1); b++) {
      char text[2048];
      snprintf(text, sizeof text,
               "HloModule ag_lhs\n"
               "ENTRY e {\n x = f32[16,8] parameter(0), sharding={devices=[%lld,1]<=[%lld]}\n"
               " w = f32[8,12] parameter(1), sharding={devices=[1,%lld]<=[%lld]}\n"
               " ROOT y = f32[16,12] dot(x, w), lhs_contracting_dims={1}, "
               "rhs_contracting_dims={0}, sharding={devices=[1,%lld]<=[%lld]}\n}\n",
               (long long)p, (long long)p, (long long)p, (long long)p, (long long)p, (long long)p);
      check_windowed(text, p, backends[b], (int)p - 1, 0);
      snprintf(text, sizeof text,
               "HloModule ag_rhs\n"
               "ENTRY e {\n x = f32[16,8] parameter(0), sharding={devices=[%lld,1]<=[%lld]}\n"
               " w = f32[8,16] parameter(1), sharding={devices=[1,%lld]<=[%lld]}\n"
               " t = f32[16,8] tanh(x)\n"
               " ROOT y = f32[16,16] dot(t, w), lhs_contracting_dims={1}, "
               "rhs_contracting_dims={0}, sharding={devices=[%lld,1]<=[%lld]}\n}\n",
               (long long)p, (long long)p, (long long)p, (long long)p, (long long)p, (long long)p);
      check_windowed(text, p, backends[b], (int)p - 1, 0);
      if (p < 4) continue;
      snprintf(text, sizeof text,
               "HloModule batched\n"
               "ENTRY e {\n x = f32[4,16,8] parameter(0), sharding={devices=[2,%lld,1]<=[%lld]}\n"
               " w = f32[4,8,12] parameter(1), sharding={devices=[2,1,%lld]<=[%lld]}\n"
               " ROOT y = f32[4,16,12] dot(x, w), lhs_batch_dims={0}, rhs_batch_dims={0}, "
               "lhs_contracting_dims={2}, rhs_contracting_dims={1}, "
               "sharding={devices=[2,1,%lld]<=[%lld]}\n}\n",
               (long long)p / 2, (long long)p, (long long)p / 2, (long long)p, (long long)p / 2,
               (long long)p);
      check_windowed(text, p, backends[b], (int)p / 2 - 1, 0);
    }
  }
  for (int b = 0; b < 2; b++)
    check_windowed("HloModule contract\n"
                   "ENTRY e {\n x = f32[16,32] parameter(0), sharding={devices=[2,2]<=[4]}\n"
                   " w = f32[32,4] parameter(1), sharding={devices=[2,2]0,2,1,3}\n"
                   " ROOT y = f32[16,4] dot(x, w), lhs_contracting_dims={1}, "
                   "rhs_contracting_dims={0}, sharding={devices=[2,1,2]<=[4] "
                   "last_tile_dim_replicate}\n}\n",
                   4, backends[b], 1, 1);
}
END_TEST

/* The options: AUTO takes the windowed form from windowed_min_bytes of
 * gathered copy on; the per-device program then needs fewer bytes of
 * temporaries than the all-gather plan (the compiler's memory planner). */
START_TEST(test_windowed_einsum_choice) {
  kiln_module *m = parse_ok("HloModule big\n"
                            "ENTRY e {\n x = f32[256,128] parameter(0), "
                            "sharding={devices=[4,1]<=[4]}\n"
                            " w = f32[128,512] parameter(1), sharding={devices=[1,4]<=[4]}\n"
                            " ROOT y = f32[256,512] dot(x, w), lhs_contracting_dims={1}, "
                            "rhs_contracting_dims={0}, sharding={devices=[1,4]<=[4]}\n}\n");
  const int64_t gathered = 256 * 128 * 4;
  struct {
    kiln_spmd_windowed mode;
    int64_t min;
    bool windowed;
  } cases[] = {{KILN_SPMD_WINDOWED_AUTO, gathered, true},
               {KILN_SPMD_WINDOWED_AUTO, gathered + 1, false},
               {KILN_SPMD_WINDOWED_ON, gathered + 1, true},
               {KILN_SPMD_WINDOWED_OFF, 0, false}};
  uint64_t peak[2] = {0, 0};
  for (int i = 0; i < 4; i++) {
    kiln_spmd_options o;
    kiln_spmd_options_init(&o);
    o.windowed = cases[i].mode;
    o.windowed_min_bytes = cases[i].min;
    kiln_status st = {0};
    kiln_spmd_program *prog;
    ck_assert_int_eq(kiln_spmd_partition_opts(m, 1, 4, NULL, &o, &prog, &st), 0);
    bool w = cases[i].windowed;
    ck_assert_int_eq(prog->stats.count[KILN_SPMD_COLLECTIVE_PERMUTE], (w ? 3 : 0));
    ck_assert_int_eq(prog->stats.count[KILN_SPMD_ALL_GATHER], (w ? 0 : 1));
    /* 3 blocks of a quarter vs the gathered array */
    ck_assert_int_eq(prog->stats.bytes[KILN_SPMD_COLLECTIVE_PERMUTE], (w ? 3 * gathered / 4 : 0));
    ck_assert_int_eq(prog->stats.bytes[KILN_SPMD_ALL_GATHER], (w ? 0 : gathered));
    kiln_executable *e;
    kiln_compile_report rep;
    ck_assert_msg(kiln_compile(prog->module, NULL, &e, &rep, &st) == 0, "%s", st.msg);
    peak[w] = rep.peak_bytes;
    kiln_executable_destroy(e);
    kiln_spmd_program_destroy(prog);
  }
  ck_assert_uint_gt(peak[0], 0);
  ck_assert_msg(peak[1] < peak[0], "windowed peak %llu, all-gather peak %llu",
                (unsigned long long)peak[1], (unsigned long long)peak[0]);
  /* the environment's settings, and what it cannot say */
  kiln_spmd_options o;
  setenv("KILN_SPMD_WINDOWED", "off", 1);
  setenv("KILN_SPMD_WINDOWED_BYTES", "64K", 1);
  kiln_spmd_options_init(&o);
  ck_assert_int_eq(o.windowed, KILN_SPMD_WINDOWED_OFF);
  ck_assert_int_eq(o.windowed_min_bytes, 65536);
  setenv("KILN_SPMD_WINDOWED", "sometimes", 1);
  setenv("KILN_SPMD_WINDOWED_BYTES", "12Q", 1);
  kiln_spmd_options_init(&o);
  ck_assert_int_eq(o.windowed, KILN_SPMD_WINDOWED_AUTO);
  ck_assert_int_eq(o.windowed_min_bytes, KILN_SPMD_WINDOWED_MIN_BYTES);
  unsetenv("KILN_SPMD_WINDOWED");
  unsetenv("KILN_SPMD_WINDOWED_BYTES");
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_2d_matmul) {
  check_program("HloModule two_d\n"
                "ENTRY e {\n x = f32[8,16] parameter(0), sharding={devices=[2,1,4]<=[8] "
                "last_tile_dim_replicate}\n"
                " w = f32[16,8] parameter(1), sharding={devices=[1,4,2]<=[2,4]T(1,0) "
                "last_tile_dim_replicate}\n"
                " ROOT y = f32[8,8] dot(x, w), lhs_contracting_dims={1}, "
                "rhs_contracting_dims={0}, sharding={devices=[2,4]<=[8]}\n}\n",
                8, "interp", 0, 0);
}
END_TEST

START_TEST(test_uneven_shards) {
  /* Sizes 5 and 7 over 4 devices: padded shards, masked before reducing. */
  check_program("HloModule uneven\n"
                "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
                " ROOT c = f32[] add(a, b)\n}\n"
                "mx { a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
                " ROOT c = f32[] maximum(a, b)\n}\n"
                "ENTRY e {\n x = f32[5,7] parameter(0), sharding={devices=[4,1]<=[4]}\n"
                " w = f32[7,3] parameter(1), sharding={devices=[4,1]<=[4]}\n"
                " e = f32[5,7] exponential(x)\n"
                " z = f32[] constant(0)\n"
                " s = f32[7] reduce(e, z), dimensions={0}, to_apply=add\n"
                " ninf = f32[] constant(-inf)\n"
                " m = f32[5] reduce(x, ninf), dimensions={1}, to_apply=mx\n"
                " xt = f32[7,5] transpose(x), dimensions={1,0}, sharding={devices=[4,1]<=[4]}\n"
                " y = f32[5,3] dot(e, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
                " ROOT o = (f32[7], f32[5], f32[5,3], f32[7,5]) tuple(s, m, y, xt)\n}\n",
                4, "interp", -1, -1);
}
END_TEST

/* Counts of one kind after partitioning text over p devices, and the
 * result checked on the interp mesh. */
static int count_of(const char *text, int64_t p, kiln_spmd_kind kind) {
  kiln_module *m = parse_ok(text);
  kiln_status st = {0};
  kiln_spmd_program *prog;
  ck_assert_msg(kiln_spmd_partition(m, p, NULL, &prog, &st) == 0, "%s", st.msg);
  int n = (int)prog->stats.count[kind];
  kiln_spmd_program_destroy(prog);
  kiln_module_destroy(m);
  check_program(text, p, "interp", -1, -1);
  return n;
}

START_TEST(test_reshard_collectives) {
  /* Rows to columns: one all-to-all; the same split on other devices: one
   * collective-permute; to replicated: an all-gather. */
  static const char swap[] =
      "HloModule swap\n"
      "ENTRY e {\n x = f32[8,12] parameter(0), sharding={devices=[4,1]<=[4]}\n"
      " n = f32[8,12] negate(x), sharding={devices=[4,1]<=[4]}\n"
      " ROOT y = f32[8,12] custom-call(n), custom_call_target=\"Sharding\", "
      "sharding={devices=[1,4]<=[4]}\n}\n";
  ck_assert_int_eq(count_of(swap, 4, KILN_SPMD_ALL_TO_ALL), 1);
  ck_assert_int_eq(count_of(swap, 4, KILN_SPMD_ALL_GATHER), 0);
  static const char perm[] =
      "HloModule perm\n"
      "ENTRY e {\n x = f32[8,12] parameter(0), sharding={devices=[4,1]<=[4]}\n"
      " n = f32[8,12] negate(x), sharding={devices=[4,1]<=[4]}\n"
      " ROOT y = f32[8,12] custom-call(n), custom_call_target=\"Sharding\", "
      "sharding={devices=[4,1]3,1,0,2}\n}\n";
  ck_assert_int_eq(count_of(perm, 4, KILN_SPMD_COLLECTIVE_PERMUTE), 1);
  static const char gather[] =
      "HloModule gather\n"
      "ENTRY e {\n x = f32[7,12] parameter(0), sharding={devices=[4,1]<=[4]}\n"
      " n = f32[7,12] negate(x), sharding={devices=[4,1]<=[4]}\n"
      " ROOT y = f32[7,12] custom-call(n), custom_call_target=\"Sharding\", "
      "sharding={replicated}\n}\n";
  ck_assert_int_eq(count_of(gather, 4, KILN_SPMD_ALL_GATHER), 1);
}
END_TEST

START_TEST(test_reduce_scatter) {
  /* A row-parallel matmul whose result stays split by rows over the same
   * devices: a reduce-scatter, no all-reduce; likewise a reduce over a
   * split dim whose result is split the other way. */
  static const char rs[] =
      "HloModule rs\n"
      "ENTRY e {\n x = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}\n"
      " w = f32[16,12] parameter(1), sharding={devices=[4,1]<=[4]}\n"
      " ROOT y = f32[8,12] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, "
      "sharding={devices=[4,1]<=[4]}\n}\n";
  ck_assert_int_eq(count_of(rs, 4, KILN_SPMD_REDUCE_SCATTER), 1);
  ck_assert_int_eq(count_of(rs, 4, KILN_SPMD_ALL_REDUCE), 0);
  ck_assert_int_eq(count_of(rs, 4, KILN_SPMD_ALL_GATHER), 0);
  check_program(rs, 4, "cpu", 0, 0);
  static const char red[] =
      "HloModule red\n"
      "mx { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT c = f32[] maximum(a, b)\n}\n"
      "ENTRY e {\n x = f32[8,12] parameter(0), sharding={devices=[2,1]<=[2]}\n"
      " ninf = f32[] constant(-inf)\n"
      " ROOT m = f32[12] reduce(x, ninf), dimensions={0}, to_apply=mx, "
      "sharding={devices=[2]<=[2]}\n}\n";
  ck_assert_int_eq(count_of(red, 2, KILN_SPMD_REDUCE_SCATTER), 1);
  /* The devices of the result's split are not the reduced group's order:
   * all-reduce and slice, still correct. */
  static const char other[] =
      "HloModule other\n"
      "ENTRY e {\n x = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}\n"
      " w = f32[16,12] parameter(1), sharding={devices=[4,1]<=[4]}\n"
      " ROOT y = f32[8,12] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, "
      "sharding={devices=[4,1]3,2,1,0}\n}\n";
  ck_assert_int_eq(count_of(other, 4, KILN_SPMD_REDUCE_SCATTER), 0);
}
END_TEST

START_TEST(test_combiner) {
  /* Two independent gradient all-reduces become one. */
  static const char two[] =
      "HloModule two\n"
      "ENTRY e {\n x = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}\n"
      " dy = f32[16,4] parameter(1), sharding={devices=[4,1]<=[4]}\n"
      " dz = f32[16,2] parameter(2), sharding={devices=[4,1]<=[4]}\n"
      " g1 = f32[8,4] dot(x, dy), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
      " g2 = f32[8,2] dot(x, dz), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
      " ROOT o = (f32[8,4], f32[8,2]) tuple(g1, g2), sharding={{replicated}, {replicated}}\n}\n";
  ck_assert_int_eq(count_of(two, 4, KILN_SPMD_ALL_REDUCE), 1);
}
END_TEST

START_TEST(test_while_split_state) {
  /* The state stays split through the loop: the body runs on shards, the
   * running sum over the split dim is one all-reduce per trip, nothing is
   * gathered. */
  static const char loop[] =
      "HloModule loop\n"
      "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT c = f32[] add(a, b)\n}\n"
      "cond { p = (s32[], f32[10,8], f32[]) parameter(0)\n"
      " i = s32[] get-tuple-element(p), index=0\n n = s32[] constant(3)\n"
      " ROOT c = pred[] compare(i, n), direction=LT\n}\n"
      "body { p = (s32[], f32[10,8], f32[]) parameter(0)\n"
      " i = s32[] get-tuple-element(p), index=0\n x = f32[10,8] get-tuple-element(p), index=1\n"
      " s = f32[] get-tuple-element(p), index=2\n one = s32[] constant(1)\n"
      " i2 = s32[] add(i, one)\n y = f32[10,8] tanh(x)\n z = f32[] constant(0)\n"
      " r = f32[] reduce(y, z), dimensions={0,1}, to_apply=add\n s2 = f32[] add(s, r)\n"
      " ROOT t = (s32[], f32[10,8], f32[]) tuple(i2, y, s2)\n}\n"
      "ENTRY e {\n x = f32[10,8] parameter(0), sharding={devices=[4,1]<=[4]}\n"
      " z = s32[] constant(0)\n f = f32[] constant(0)\n"
      " t = (s32[], f32[10,8], f32[]) tuple(z, x, f)\n"
      " w = (s32[], f32[10,8], f32[]) while(t), condition=cond, body=body\n"
      " y = f32[10,8] get-tuple-element(w), index=1\n"
      " s = f32[] get-tuple-element(w), index=2\n"
      " ROOT o = (f32[10,8], f32[]) tuple(y, s), sharding={{devices=[4,1]<=[4]}, "
      "{replicated}}\n}\n";
  ck_assert_int_eq(count_of(loop, 4, KILN_SPMD_ALL_GATHER), 0);
  ck_assert_int_eq(count_of(loop, 4, KILN_SPMD_ALL_REDUCE), 1);
  check_program(loop, 4, "cpu", 1, 0);
}
END_TEST

START_TEST(test_while_other_states) {
  /* A loop whose state is one array (what lax.while_loop of one array
   * writes): split through the loop, the condition's sum one all-reduce per
   * trip; uneven shards (10 rows on 4) masked. */
  static const char array[] =
      "HloModule loop\n"
      "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT c = f32[] add(a, b)\n}\n"
      "cond { p = f32[10,8] parameter(0)\n z = f32[] constant(0)\n"
      " s = f32[] reduce(p, z), dimensions={0,1}, to_apply=add\n"
      " n = f32[] constant(10)\n ROOT c = pred[] compare(s, n), direction=GT\n}\n"
      "body { p = f32[10,8] parameter(0)\n h = f32[] constant(0.5)\n"
      " b = f32[10,8] broadcast(h), dimensions={}\n m = f32[10,8] multiply(p, b)\n"
      " ROOT r = f32[10,8] subtract(m, b)\n}\n"
      "ENTRY e {\n x = f32[10,8] parameter(0), sharding={devices=[4,1]<=[4]}\n"
      " a = f32[10,8] abs(x)\n"
      " ROOT w = f32[10,8] while(a), condition=cond, body=body, sharding={devices=[4,1]<=[4]}\n}\n";
  ck_assert_int_eq(count_of(array, 4, KILN_SPMD_ALL_GATHER), 0);
  ck_assert_int_eq(count_of(array, 4, KILN_SPMD_ALL_REDUCE), 1);
  check_program(array, 4, "interp", 1, 0);
  check_program(array, 4, "cpu", 1, 0);
  /* A loop whose init is another loop's result and whose body ends in a
   * conditional, not a tuple instruction (and a branch returning its
   * parameter as it is): the state stays split through both loops and
   * both branches. */
  static const char nested[] =
      "HloModule loop2\n"
      "cond { p = (s32[], f32[12,8]) parameter(0)\n"
      " i = s32[] get-tuple-element(p), index=0\n n = s32[] constant(3)\n"
      " ROOT c = pred[] compare(i, n), direction=LT\n}\n"
      "b0 { p = (s32[], f32[12,8]) parameter(0)\n i = s32[] get-tuple-element(p), index=0\n"
      " x = f32[12,8] get-tuple-element(p), index=1\n y = f32[12,8] tanh(x)\n"
      " ROOT t = (s32[], f32[12,8]) tuple(i, y)\n}\n"
      "b1 { ROOT p = (s32[], f32[12,8]) parameter(0)\n}\n"
      "body { p = (s32[], f32[12,8]) parameter(0)\n"
      " i = s32[] get-tuple-element(p), index=0\n x = f32[12,8] get-tuple-element(p), index=1\n"
      " one = s32[] constant(1)\n i2 = s32[] add(i, one)\n"
      " two = f32[] constant(1.5)\n b = f32[12,8] broadcast(two), dimensions={}\n"
      " y = f32[12,8] multiply(x, b)\n t = (s32[], f32[12,8]) tuple(i2, y)\n"
      " k = s32[] constant(2)\n r = s32[] remainder(i, k)\n"
      " ROOT c = (s32[], f32[12,8]) conditional(r, t, t), branch_computations={b0, b1}\n}\n"
      "body1 { p = (s32[], f32[12,8]) parameter(0)\n"
      " i = s32[] get-tuple-element(p), index=0\n x = f32[12,8] get-tuple-element(p), index=1\n"
      " one = s32[] constant(1)\n i2 = s32[] add(i, one)\n y = f32[12,8] sine(x)\n"
      " ROOT t = (s32[], f32[12,8]) tuple(i2, y)\n}\n"
      "ENTRY e {\n x = f32[12,8] parameter(0), sharding={devices=[1,4]<=[4]}\n"
      " z = s32[] constant(0)\n t = (s32[], f32[12,8]) tuple(z, x)\n"
      " w1 = (s32[], f32[12,8]) while(t), condition=cond, body=body1\n"
      " w2 = (s32[], f32[12,8]) while(w1), condition=cond, body=body\n"
      " ROOT y = f32[12,8] get-tuple-element(w2), index=1, sharding={devices=[1,4]<=[4]}\n}\n";
  ck_assert_int_eq(count_of(nested, 4, KILN_SPMD_ALL_GATHER), 0);
  ck_assert_int_eq(count_of(nested, 4, KILN_SPMD_ALL_REDUCE), 0);
  check_program(nested, 4, "interp", 0, 0);
  check_program(nested, 4, "cpu", 0, 0);
}
END_TEST

START_TEST(test_conditional_split) {
  /* A conditional on split operands: each branch computes on the shards
   * (one reduces over the split dim: an all-reduce inside the branch, the
   * program's only one whichever branch runs), the
   * selector whole; a branch that returns its parameter while the result
   * is split otherwise (other devices: a collective-permute) gets its
   * operand resharded on the way in. Both
   * selector values, on 2 and 4 devices. */
  for (int sel = 0; sel < 2; sel++) {
    char text[2048];
    snprintf(text, sizeof text,
             "HloModule cond\n"
             "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT c = f32[] add(a, b)\n}\n"
             "b0 { p = (f32[8,6], f32[6]) parameter(0)\n x = f32[8,6] get-tuple-element(p), "
             "index=0\n v = f32[6] get-tuple-element(p), index=1\n"
             " z = f32[] constant(0)\n s = f32[6] reduce(x, z), dimensions={0}, to_apply=add\n"
             " r = f32[6] add(s, v)\n ROOT o = f32[8,6] broadcast(r), dimensions={1}\n}\n"
             "b1 { p = (f32[8,6], f32[6]) parameter(0)\n x = f32[8,6] get-tuple-element(p), "
             "index=0\n ROOT y = f32[8,6] tanh(x)\n}\n"
             "b2 { ROOT p = f32[8,6] parameter(0)\n}\n"
             "ENTRY e {\n x = f32[8,6] parameter(0), sharding={devices=[4,1]<=[4]}\n"
             " v = f32[6] parameter(1), sharding={replicated}\n"
             " i = s32[] constant(%d)\n t = (f32[8,6], f32[6]) tuple(x, v)\n"
             " c = f32[8,6] conditional(i, t, t), branch_computations={b0, b1}\n"
             " e = f32[8,6] exponential(c)\n"
             " k = pred[] constant(%s)\n"
             " ROOT d = f32[8,6] conditional(k, e, x), true_computation=b2, false_computation=b2, "
             "sharding={devices=[4,1]0,2,1,3}\n}\n",
             sel, sel ? "true" : "false");
    check_program(text, 4, "interp", 1, 0);
    check_program(text, 4, "cpu", 1, 0);
    ck_assert_int_eq(count_of(text, 4, KILN_SPMD_ALL_GATHER), 0);
  }
}
END_TEST

START_TEST(test_convolution_batch_and_features) {
  /* Batch split: no communication. Output features split through the
   * kernel: none either. Input features split: a partial sum, all-reduced
   * (here cheaper than gathering the inputs). */
  static const char batch[] =
      "HloModule conv\n"
      "ENTRY e {\n x = f32[4,6,6,3] parameter(0), sharding={devices=[2,1,1,1]<=[2]}\n"
      " k = f32[3,3,3,8] parameter(1), sharding={replicated}\n"
      " ROOT y = f32[4,6,6,8] convolution(x, k), window={size=3x3 pad=1_1x1_1}, "
      "dim_labels=b01f_01io->b01f\n}\n";
  ck_assert_int_eq(count_of(batch, 2, KILN_SPMD_ALL_GATHER), 0);
  ck_assert_int_eq(count_of(batch, 2, KILN_SPMD_ALL_REDUCE), 0);
  static const char feat[] =
      "HloModule conv\n"
      "ENTRY e {\n x = f32[4,6,6,3] parameter(0), sharding={replicated}\n"
      " k = f32[3,3,3,8] parameter(1), sharding={devices=[1,1,1,4]<=[4]}\n"
      " ROOT y = f32[4,6,6,8] convolution(x, k), window={size=3x3 pad=1_1x1_1}, "
      "dim_labels=b01f_01io->b01f\n}\n";
  ck_assert_int_eq(count_of(feat, 4, KILN_SPMD_ALL_GATHER), 0);
  static const char in[] =
      "HloModule conv\n"
      "ENTRY e {\n x = f32[4,6,6,16] parameter(0), sharding={devices=[1,1,1,2]<=[2]}\n"
      " k = f32[3,3,16,8] parameter(1), sharding={devices=[1,1,2,1]<=[2]}\n"
      " ROOT y = f32[4,6,6,8] convolution(x, k), window={size=3x3 pad=1_1x1_1}, "
      "dim_labels=b01f_01io->b01f, sharding={replicated}\n}\n";
  ck_assert_int_eq(count_of(in, 2, KILN_SPMD_ALL_REDUCE), 1);
  ck_assert_int_eq(count_of(in, 2, KILN_SPMD_ALL_GATHER), 0);
}
END_TEST

START_TEST(test_refusals) {
  kiln_module *m = parse_ok("HloModule man\n"
                            "ENTRY e {\n x = f32[8] parameter(0), sharding={manual}\n"
                            " ROOT n = f32[8] negate(x)\n}\n");
  kiln_status st = {0};
  kiln_spmd_program *prog;
  ck_assert_int_eq(kiln_spmd_partition(m, 4, NULL, &prog, &st), KILN_EUNIMPL);
  ck_assert_ptr_nonnull(strstr(st.msg, "manual"));
  kiln_module_destroy(m);
  /* A sharding naming more devices than the mesh has. */
  m = parse_ok("HloModule big\n"
               "ENTRY e {\n x = f32[8] parameter(0), sharding={devices=[8]<=[8]}\n"
               " ROOT n = f32[8] negate(x)\n}\n");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_spmd_partition(m, 4, NULL, &prog, &st), KILN_EINVAL);
  ck_assert_ptr_nonnull(strstr(st.msg, "8 devices"));
  kiln_module_destroy(m);
  /* Per-device programs are not global ones. */
  m = parse_ok("HloModule pd\n"
               "ENTRY e {\n x = f32[8] parameter(0), sharding={devices=[2]<=[2]}\n"
               " ROOT p = u32[] partition-id()\n}\n");
  ck_assert(!kiln_spmd_module_is_sharded(m));
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_gather_embedding) {
  /* Ids split by batch, the table replicated: no communication. */
  static const char emb[] =
      "HloModule emb\n"
      "ENTRY e {\n t = f32[10,6] parameter(0), sharding={replicated}\n"
      " ids = s32[8,1] parameter(1), sharding={devices=[4,1]<=[4]}\n"
      " ROOT g = f32[8,6] gather(t, ids), offset_dims={1}, collapsed_slice_dims={0}, "
      "start_index_map={0}, index_vector_dim=1, slice_sizes={1,6}\n}\n";
  ck_assert_int_eq(count_of(emb, 4, KILN_SPMD_ALL_GATHER), 0);
  /* A table split along the vocabulary whose rows outweigh the result:
   * each device gathers the ids in its shard, one all-reduce sums them
   * (the uneven ids gathered whole first). */
  check_program("HloModule emb2\n"
                "ENTRY e {\n t = f32[10,6] parameter(0), sharding={devices=[2,1]<=[2]}\n"
                " ids = s32[7] parameter(1), sharding={devices=[2]<=[2]}\n"
                " ROOT g = f32[7,6] gather(t, ids), offset_dims={1}, collapsed_slice_dims={0}, "
                "start_index_map={0}, index_vector_dim=1, slice_sizes={1,6}\n}\n",
                2, "interp", 1, 1);
  /* ... and when the result outweighs the table, the table is gathered */
  check_program("HloModule emb3\n"
                "ENTRY e {\n t = f32[4,6] parameter(0), sharding={devices=[2,1]<=[2]}\n"
                " ids = s32[9] parameter(1), sharding={replicated}\n"
                " ROOT g = f32[9,6] gather(t, ids), offset_dims={1}, collapsed_slice_dims={0}, "
                "start_index_map={0}, index_vector_dim=1, slice_sizes={1,6}\n}\n",
                2, "interp", 0, 1);
}
END_TEST

START_TEST(test_gather_scatter_split_vocabulary) {
  /* A vocabulary of 10 rows split 4 ways (shards of 3, the last padded),
   * ids out of range on both sides (gather clamps them, scatter skips
   * them), repeated ids (scatter adds): the lookup is a masked local
   * gather and one all-reduce, the scatter local, on interp and cpu, and
   * the non-collapsed form (slice kept as a dim of 1) too. */
  static const char text[] =
      "HloModule vocab\n"
      "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT c = f32[] add(a, b)\n}\n"
      "ENTRY e {\n t = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}\n"
      " u = f32[8,6] parameter(1), sharding={replicated}\n"
      " ids = s32[8,1] constant({{-3}, {0}, {4}, {9}, {12}, {5}, {3}, {4}})\n"
      " g = f32[8,6] gather(t, ids), offset_dims={1}, collapsed_slice_dims={0}, "
      "start_index_map={0}, index_vector_dim=1, slice_sizes={1,6}\n"
      " g3 = f32[8,1,6] gather(t, ids), offset_dims={1,2}, collapsed_slice_dims={}, "
      "start_index_map={0}, index_vector_dim=1, slice_sizes={1,6}\n"
      " r = f32[8,6] reshape(g3)\n s = f32[8,6] add(g, r)\n y = f32[8,6] multiply(s, u)\n"
      " z = f32[] constant(0)\n zs = f32[10,6] broadcast(z), dimensions={}\n"
      " d = f32[10,6] scatter(zs, ids, y), update_window_dims={1}, inserted_window_dims={0}, "
      "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add\n"
      " ROOT o = f32[10,6] add(d, t), sharding={devices=[4,1]<=[4]}\n}\n";
  check_program(text, 4, "interp", 1, 0); /* the two lookups' all-reduces combined */
  check_program(text, 4, "cpu", 1, 0);
  ck_assert_int_eq(count_of(text, 4, KILN_SPMD_ALL_TO_ALL), 0);
  ck_assert_int_eq(count_of(text, 4, KILN_SPMD_COLLECTIVE_PERMUTE), 0);
  /* every device gathers from and scatters into its own 3 rows */
  kiln_module *m = parse_ok(text);
  kiln_status st = {0};
  kiln_spmd_program *prog = NULL;
  ck_assert_int_eq(kiln_spmd_partition(m, 4, NULL, &prog, &st), 0);
  int gathers = 0, scatters = 0;
  const kiln_computation *c = kiln_module_entry(prog->module);
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *ins = prog->module->instrs[c->instrs[i]];
    if (ins->op != KILN_OP_GATHER && ins->op != KILN_OP_SCATTER) continue;
    const kiln_shape *t = &prog->module->instrs[ins->operands[0]]->shape;
    if (ins->op == KILN_OP_GATHER) gathers += t->dims[0] == 3;
    if (ins->op == KILN_OP_SCATTER) scatters += t->dims[0] == 3 && ins->shape.dims[0] == 3;
  }
  ck_assert_int_eq(gathers, 2);
  ck_assert_int_eq(scatters, 1);
  kiln_spmd_program_destroy(prog);
  kiln_module_destroy(m);
}
END_TEST

/* Collectives of text partitioned over p devices, all kinds; the result
 * checked against the interpreter on interp (and cpu when p is 4). */
static int total_collectives(const char *text, int64_t p) {
  int n = 0;
  for (int k = 0; k < KILN_SPMD_NKINDS; k++) n += count_of(text, p, (kiln_spmd_kind)k);
  if (p == 4) check_program(text, p, "cpu", -1, -1);
  return n;
}

START_TEST(test_gather_scatter_other_dims) {
  /* jnp.take from a table split along its features: each device gathers
   * its columns (the split passes to the result), no communication; also
   * the non-collapsed form, uneven features (7 over 4), and ids split by
   * batch on one mesh axis with the features on the other (x=2, y=4) */
  static const char feat[] =
      "HloModule feat\n"
      "ENTRY e {\n t = f32[10,8] parameter(0), sharding={devices=[1,4]<=[4]}\n"
      " ids = s32[6,1] parameter(1), sharding={replicated}\n"
      " g = f32[6,8] gather(t, ids), offset_dims={1}, collapsed_slice_dims={0}, "
      "start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}\n"
      " g3 = f32[6,1,8] gather(t, ids), offset_dims={1,2}, collapsed_slice_dims={}, "
      "start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}\n"
      " r = f32[6,8] reshape(g3)\n"
      " ROOT o = f32[6,8] add(g, r)\n}\n";
  ck_assert_int_eq(total_collectives(feat, 4), 0);
  static const char uneven[] =
      "HloModule uneven\n"
      "ENTRY e {\n t = f32[10,7] parameter(0), sharding={devices=[1,4]<=[4]}\n"
      " ids = s32[5] parameter(1), sharding={replicated}\n"
      " ROOT g = f32[5,7] gather(t, ids), offset_dims={1}, collapsed_slice_dims={0}, "
      "start_index_map={0}, index_vector_dim=1, slice_sizes={1,7}, "
      "sharding={devices=[1,4]<=[4]}\n}\n";
  ck_assert_int_eq(total_collectives(uneven, 4), 0);
  static const char two_d[] =
      "HloModule two_d\n"
      "ENTRY e {\n t = f32[10,8] parameter(0), sharding={devices=[1,4,2]<=[2,4]T(1,0) "
      "last_tile_dim_replicate}\n"
      " ids = s32[6] parameter(1), sharding={devices=[2,4]<=[8] last_tile_dim_replicate}\n"
      " ROOT g = f32[6,8] gather(t, ids), offset_dims={1}, collapsed_slice_dims={0}, "
      "start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}\n}\n";
  ck_assert_int_eq(total_collectives(two_d, 8), 0);
  /* asked for whole, the smaller result is gathered rather than the table */
  static const char whole_out[] =
      "HloModule whole_out\n"
      "ENTRY e {\n t = f32[64,8] parameter(0), sharding={devices=[1,4]<=[4]}\n"
      " ids = s32[6] parameter(1), sharding={replicated}\n"
      " ROOT g = f32[6,8] gather(t, ids), offset_dims={1}, collapsed_slice_dims={0}, "
      "start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}, sharding={replicated}\n}\n";
  kiln_module *m = parse_ok(whole_out);
  kiln_status st = {0};
  kiln_spmd_program *prog;
  ck_assert_int_eq(kiln_spmd_partition(m, 4, NULL, &prog, &st), 0);
  ck_assert_int_eq(prog->stats.count[KILN_SPMD_ALL_GATHER], 1);
  ck_assert_int_eq(prog->stats.bytes[KILN_SPMD_ALL_GATHER], 6 * 8 * 4);
  kiln_spmd_program_destroy(prog);
  kiln_module_destroy(m);
  check_program(whole_out, 4, "interp", 0, 1);
  /* a partial slice of a dim no index names does not pass it through:
   * the table is gathered, the result still right */
  check_program("HloModule part\n"
                "ENTRY e {\n t = f32[10,8] parameter(0), sharding={devices=[1,4]<=[4]}\n"
                " ids = s32[6] parameter(1), sharding={replicated}\n"
                " ROOT g = f32[6,4] gather(t, ids), offset_dims={1}, collapsed_slice_dims={0}, "
                "start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}\n}\n",
                4, "interp", 0, -1);
  /* a table split along its vocabulary (2) and its features (4), ids out
   * of range: the masked local lookup keeps the feature split, one
   * all-reduce over the vocabulary of the result's shard; asked split
   * along the features on the same devices, nothing more */
  static const char vf[] =
      "HloModule vf\n"
      "ENTRY e {\n t = f32[16,8] parameter(0), sharding={devices=[2,4]<=[8]}\n"
      " ids = s32[6] constant({-2, 0, 7, 8, 15, 20})\n"
      " ROOT g = f32[6,8] gather(t, ids), offset_dims={1}, collapsed_slice_dims={0}, "
      "start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}, "
      "sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}\n}\n";
  check_program(vf, 8, "interp", 1, 0);
  check_program(vf, 8, "cpu", 1, 0);
  m = parse_ok(vf);
  ck_assert_int_eq(kiln_spmd_partition(m, 8, NULL, &prog, &st), 0);
  ck_assert_int_eq(prog->stats.bytes[KILN_SPMD_ALL_REDUCE], 6 * 2 * 4);
  ck_assert_int_eq(prog->stats.count[KILN_SPMD_ALL_TO_ALL] +
                       prog->stats.count[KILN_SPMD_COLLECTIVE_PERMUTE] +
                       prog->stats.count[KILN_SPMD_REDUCE_SCATTER],
                   0);
  kiln_spmd_program_destroy(prog);
  kiln_module_destroy(m);
  /* a scatter-add of batch-split updates into a small operand (a
   * parameter: its values are added once): partial scatter-adds and one
   * all-reduce of the operand; into a larger one the updates and ids are
   * gathered instead; a scatter that takes the maximum is computed whole */
  static const char part_fmt[] =
      "HloModule part\n"
      "%s { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT c = f32[] %s(a, b)\n}\n"
      "ENTRY e {\n t = f32[%d,16] parameter(0), sharding={replicated}\n"
      " ids = s32[32,1] parameter(1), sharding={devices=[4,1]<=[4]}\n"
      " u = f32[32,16] parameter(2), sharding={devices=[4,1]<=[4]}\n"
      " ROOT d = f32[%d,16] scatter(t, ids, u), update_window_dims={1}, "
      "inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, "
      "to_apply=%s\n}\n";
  char ptext[1024];
  snprintf(ptext, sizeof ptext, part_fmt, "add", "add", 8, 8, "add");
  check_program(ptext, 4, "interp", 1, 0);
  check_program(ptext, 4, "cpu", 1, 0);
  m = parse_ok(ptext);
  ck_assert_int_eq(kiln_spmd_partition(m, 4, NULL, &prog, &st), 0);
  ck_assert_int_eq(prog->stats.bytes[KILN_SPMD_ALL_REDUCE], 8 * 16 * 4);
  kiln_spmd_program_destroy(prog);
  kiln_module_destroy(m);
  snprintf(ptext, sizeof ptext, part_fmt, "add", "add", 64, 64, "add");
  check_program(ptext, 4, "interp", 0, 2);
  snprintf(ptext, sizeof ptext, part_fmt, "mx", "maximum", 8, 8, "mx");
  check_program(ptext, 4, "interp", 0, 2);
  /* the gradient's scatter-add into a table split along its features (and
   * along its vocabulary too, on x=2, y=4): each device scatters its
   * columns of every update, with repeated and out-of-range ids */
  static const char grad[] =
      "HloModule grad\n"
      "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT c = f32[] add(a, b)\n}\n"
      "ENTRY e {\n t = f32[10,8] parameter(0), sharding={SPLIT}\n"
      " u = f32[7,8] parameter(1), sharding={USPLIT}\n"
      " ids = s32[7,1] constant({{-3}, {0}, {4}, {9}, {12}, {4}, {3}})\n"
      " ROOT d = f32[10,8] scatter(t, ids, u), update_window_dims={1}, "
      "inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, "
      "to_apply=add, sharding={SPLIT}\n}\n";
  const char *splits[2][2] = {{"devices=[1,4]<=[4]", "devices=[1,4]<=[4]"},
                              {"devices=[2,4]<=[8]", "devices=[1,4,2]<=[2,4]T(1,0) "
                                                     "last_tile_dim_replicate"}};
  for (int k = 0; k < 2; k++) {
    char text[2048], tmp[2048];
    const char *a = strstr(grad, "{SPLIT}");
    snprintf(tmp, sizeof tmp, "%.*s{%s}%s", (int)(a - grad), grad, splits[k][0], a + 7);
    a = strstr(tmp, "{USPLIT}");
    snprintf(text, sizeof text, "%.*s{%s}%s", (int)(a - tmp), tmp, splits[k][1], a + 8);
    a = strstr(text, "{SPLIT}");
    snprintf(tmp, sizeof tmp, "%.*s{%s}%s", (int)(a - text), text, splits[k][0], a + 7);
    ck_assert_int_eq(total_collectives(tmp, k ? 8 : 4), 0);
    m = parse_ok(tmp);
    ck_assert_int_eq(kiln_spmd_partition(m, k ? 8 : 4, NULL, &prog, &st), 0);
    const kiln_computation *c = kiln_module_entry(prog->module);
    int local = 0;
    for (uint32_t i = 0; i < c->ninstrs; i++) {
      const kiln_instr *ins = prog->module->instrs[c->instrs[i]];
      const kiln_shape *u =
          ins->op == KILN_OP_SCATTER ? &prog->module->instrs[ins->operands[2]]->shape : NULL;
      local +=
          u && u->dims[1] == 2 && ins->shape.dims[1] == 2 && ins->shape.dims[0] == (k ? 5 : 10);
    }
    ck_assert_int_eq(local, 1);
    kiln_spmd_program_destroy(prog);
    kiln_module_destroy(m);
  }
}
END_TEST

START_TEST(test_reduce_init_not_identity) {
  /* sum with init 5 over a split dim: partial sums would add 5 once per
   * device, so the operand is gathered instead. */
  check_program("HloModule init5\n"
                "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
                " ROOT c = f32[] add(a, b)\n}\n"
                "ENTRY e {\n x = f32[8,3] parameter(0), sharding={devices=[4,1]<=[4]}\n"
                " five = f32[] constant(5)\n"
                " ROOT s = f32[3] reduce(x, five), dimensions={0}, to_apply=add\n}\n",
                4, "interp", 0, -1);
}
END_TEST

START_TEST(test_megatron_cpu) { check_program(megatron, 4, "cpu", 1, 0); }
END_TEST

/* ---- replicas x partitions ------------------------------------------------ */

/* Whether every collective of prog (on R x P devices) pairs device k only
 * with devices of k's replica, and with as many as on one replica. */
static void check_groups_within_replicas(const kiln_spmd_program *prog, const kiln_module *one,
                                         int64_t R, int64_t P) {
  kiln_arena *a = kiln_arena_create();
  kiln_status st = {0};
  int checked = 0;
  ck_assert_uint_eq(prog->module->ninstrs, one->ninstrs);
  for (uint32_t i = 0; i < prog->module->ninstrs; i++) {
    const kiln_instr *ins = prog->module->instrs[i];
    bool groups = ins->op == KILN_OP_ALL_REDUCE || ins->op == KILN_OP_ALL_GATHER ||
                  ins->op == KILN_OP_REDUCE_SCATTER || ins->op == KILN_OP_ALL_TO_ALL ||
                  ins->op == KILN_OP_COLLECTIVE_PERMUTE;
    if (ins->comp == KILN_NO_ID || !groups) continue;
    for (int64_t k = 0; k < R * P; k++) {
      kiln_collective_group g, g1;
      ck_assert_msg(kiln_collective_group_of(ins, R, P, k, a, &g, &st) == 0, "%s", st.msg);
      ck_assert_msg(kiln_collective_group_of(one->instrs[i], 1, P, k % P, a, &g1, &st) == 0, "%s",
                    st.msg);
      ck_assert_int_eq(g.n, g1.n);
      ck_assert_int_eq(g.rank, g1.rank);
      for (int64_t j = 0; j < g.n; j++) {
        ck_assert_msg(g.members[j] / P == k / P, "%s: device %lld meets device %lld", ins->name,
                      (long long)k, (long long)g.members[j]);
        ck_assert_int_eq(g.members[j] % P, g1.members[j]);
      }
    }
    checked++;
  }
  ck_assert_int_gt(checked, 0);
  kiln_arena_destroy(a);
}

/* `text` on R replicas of P partitions of `backend`, replica r from its own
 * random arguments: each replica's global result equals the unpartitioned
 * interpreter on its arguments (of ref_text; NULL: text itself), the program moves what one
 * replica's does, and its collectives stay within a replica. */
static void check_replicas(const char *text, const char *ref_text, uint32_t R, uint32_t P,
                           const char *backend) {
  kiln_module *m = parse_ok(text), *ref = ref_text ? parse_ok(ref_text) : m;
  kiln_status st = {0};
  kiln_literal ***args = kiln_calloc(R, sizeof *args), **want = kiln_calloc(R, sizeof *want);
  kiln_literal **got = kiln_calloc(R, sizeof *got);
  const kiln_literal *const **per = kiln_calloc(R, sizeof *per);
  uint32_t n = 0;
  for (uint32_t r = 0; r < R; r++) {
    ck_assert_int_eq(kiln_test_args_random(m, 40 + r, &args[r], &n, &st), 0);
    ck_assert_msg(
        kiln_interp_run(ref, (const kiln_literal *const *)args[r], n, NULL, &want[r], &st) == 0,
        "%s", st.msg);
    per[r] = (const kiln_literal *const *)args[r];
  }
  kiln_spmd_stats stats;
  int rc = kiln_run_module_global_mesh(m, backend, NULL, R, P, NULL, per, n, got, &stats, &st);
  ck_assert_msg(rc == 0, "%s: %s", st.where, st.msg);
  for (uint32_t r = 0; r < R; r++) {
    char why[200];
    ck_assert_msg(close_enough(want[r], got[r], why, sizeof why), "%s, replica %u of %u x %u: %s",
                  backend, r, R, P, why);
  }
  kiln_spmd_program *prog, *one;
  ck_assert_int_eq(kiln_spmd_partition_mesh(m, R, P, NULL, &prog, &st), 0);
  ck_assert_int_eq(kiln_spmd_partition(m, P, NULL, &one, &st), 0);
  ck_assert_int_eq(prog->module->replica_count, R);
  ck_assert_int_eq(prog->module->num_partitions, P);
  ck_assert_mem_eq(&prog->stats, &one->stats, sizeof prog->stats);
  ck_assert_mem_eq(&stats, &one->stats, sizeof stats);
  check_groups_within_replicas(prog, one->module, R, P);
  kiln_spmd_program_destroy(prog);
  kiln_spmd_program_destroy(one);
  for (uint32_t r = 0; r < R; r++) {
    kiln_literal_destroy(want[r]);
    kiln_literal_destroy(got[r]);
    kiln_test_args_free(args[r], n);
  }
  kiln_free(per);
  kiln_free(got);
  kiln_free(want);
  kiln_free(args);
  if (ref != m) kiln_module_destroy(ref);
  kiln_module_destroy(m);
}

START_TEST(test_replicas_global) {
  /* Megatron (one all-reduce), FSDP (an all-gather), a halo (permutes),
   * an all-to-all and a shard_map psum written for one replica, on 2 and
   * 3 replicas, interp and cpu */
  static const char fsdp[] =
      "HloModule fsdp\n"
      "ENTRY e {\n x = f32[8,16] parameter(0), sharding={devices=[4,1]<=[4]}\n"
      " w = f32[16,8] parameter(1), sharding={devices=[4,1]<=[4]}\n"
      " ROOT y = f32[8,8] dot(x, w), lhs_contracting_dims={1}, "
      "rhs_contracting_dims={0}, sharding={devices=[4,1]<=[4]}\n}\n";
  static const char halo[] =
      "HloModule halo\n"
      "ENTRY e {\n x = f32[16,6] parameter(0), sharding={devices=[2,1]<=[2]}\n"
      " a = f32[15,6] slice(x), slice={[1:16], [0:6]}\n"
      " b = f32[15,6] slice(x), slice={[0:15], [0:6]}\n"
      " ROOT d = f32[15,6] subtract(a, b), sharding={devices=[2,1]<=[2]}\n}\n";
  static const char a2a[] = "HloModule a2a\n"
                            "ENTRY e {\n x = f32[8,8] parameter(0), sharding={devices=[4,1]<=[4]}\n"
                            " ROOT y = f32[8,8] negate(x), sharding={devices=[1,4]<=[4]}\n}\n";
  const char *backends[2] = {"interp", "cpu"};
  for (int b = 0; b < 2; b++) {
    check_replicas(megatron, NULL, 2, 4, backends[b]);
    check_replicas(fsdp, NULL, 2, 4, backends[b]);
    check_replicas(halo, NULL, 3, 2, backends[b]);
    check_replicas(a2a, NULL, 2, 4, backends[b]);
  }
  char text[4096];
  shard_map_text(text, sizeof text, "[\"x\"=4]", "\\\"x\\\"", "[{}, {}]", "f32[8,4]",
                 "all-reduce(d), channel_id=1, replica_groups={{0,1,2,3}}, "
                 "use_global_device_ids=true, to_apply=add");
  static const char ref[] = "HloModule r\nENTRY e {\n a = f32[8,16] parameter(0)\n"
                            " b = f32[16,4] parameter(1)\n t = f32[8,16] tanh(a)\n"
                            " ROOT d = f32[8,4] dot(t, b), lhs_contracting_dims={1}, "
                            "rhs_contracting_dims={0}\n}\n";
  check_replicas(text, ref, 2, 4, "interp");
  check_replicas(text, ref, 2, 4, "cpu");
  /* a psum over x of a 2x2 mesh: groups {0,2},{1,3} in each replica */
  shard_map_text(text, sizeof text, "[\"x\"=4]", "\\\"x\\\"", "[{}, {}]", "f32[8,4]",
                 "all-reduce(d), channel_id=1, replica_groups=[2,2]<=[2,2]T(1,0), "
                 "use_global_device_ids=true, to_apply=add");
  kiln_module *m = parse_ok(text);
  kiln_status st = {0};
  kiln_spmd_program *prog;
  ck_assert_int_eq(kiln_spmd_partition_mesh(m, 2, 4, NULL, &prog, &st), 0);
  kiln_spmd_program_destroy(prog);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_replicas_refusals) {
  kiln_status st = {0};
  kiln_spmd_program *prog = NULL;
  kiln_module *m = parse_ok(megatron);
  ck_assert_int_eq(kiln_spmd_partition_mesh(m, 0, 4, NULL, &prog, &st), KILN_EINVAL);
  ck_assert_ptr_nonnull(strstr(st.msg, "replicas"));
  ck_assert_int_eq(kiln_spmd_partition_mesh(m, 2048, 4, NULL, &prog, &st), KILN_EINVAL);
  ck_assert_ptr_null(prog);
  kiln_module_destroy(m);
  /* a body collective over device ids past one replica's partitions */
  char text[4096];
  shard_map_text(text, sizeof text, "[\"x\"=4]", "\\\"x\\\"", "[{}, {}]", "f32[8,4]",
                 "all-reduce(d), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, "
                 "use_global_device_ids=true, to_apply=add");
  m = parse_ok(text);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_spmd_partition_mesh(m, 2, 4, NULL, &prog, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "device id 4 in a program for one replica of 4") != NULL, "%s",
                st.msg);
  ck_assert_ptr_null(prog);
  kiln_module_destroy(m);
  /* replica-id groups of a one-replica program become one group per
   * replica; a permute's (0,0) pair one per replica */
  m = parse_ok("HloModule cr\n"
               "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
               " ROOT s = f32[] add(a, b)\n}\n"
               "ENTRY e {\n x = f32[4] parameter(0)\n"
               " r = f32[4] all-reduce(x), replica_groups={{0}}, to_apply=add\n"
               " ROOT p = f32[4] collective-permute(r), source_target_pairs={{0,0}}\n}\n");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__spmd_replicate(m, 3, 2, &st), 0);
  ck_assert_int_eq(m->replica_count, 3);
  kiln_arena *a = kiln_arena_create();
  const kiln_computation *c = kiln_module_entry(m);
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[c->instrs[i]];
    if (ins->op != KILN_OP_ALL_REDUCE && ins->op != KILN_OP_COLLECTIVE_PERMUTE) continue;
    for (int64_t k = 0; k < 6; k++) {
      kiln_collective_group g;
      ck_assert_msg(kiln_collective_group_of(ins, 3, 2, k, a, &g, &st) == 0, "%s", st.msg);
      if (ins->op == KILN_OP_ALL_REDUCE) {
        ck_assert_int_eq(g.n, 1);
        ck_assert_int_eq(g.members[0], k);
      }
    }
    if (ins->op == KILN_OP_COLLECTIVE_PERMUTE) {
      const kiln_i64s *pairs = kiln_instr_attr_ints(ins, KILN_ATTR_SOURCE_TARGET_PAIRS);
      ck_assert_uint_eq(pairs->n, 6);
      for (uint32_t j = 0; j < 6; j++) ck_assert_int_eq(pairs->v[j], j / 2);
    }
  }
  /* ids above the one replica are refused by name */
  kiln_module_destroy(m);
  m = parse_ok("HloModule cr2\n"
               "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
               " ROOT s = f32[] add(a, b)\n}\n"
               "ENTRY e {\n x = f32[4] parameter(0), sharding={replicated}\n"
               " ROOT r = f32[4] all-reduce(x), replica_groups={{0,1}}, to_apply=add\n}\n");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__spmd_replicate(m, 2, 2, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "r");
  ck_assert_msg(strstr(st.msg, "replica id 1 in a program for one replica") != NULL, "%s", st.msg);
  kiln_arena_destroy(a);
  kiln_module_destroy(m);
}
END_TEST

/* ---- random programs × random shardings ---------------------------------- */

static uint64_t rnd(uint64_t *s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return *s >> 33;
}

/* A random tiled sharding of an array of `shape` over p devices: p's
 * factors of 2 spread over the dims (some left as replication), devices
 * permuted. In the module's arena. */
static kiln_sharding *random_sharding(kiln_module *m, const kiln_shape *shape, int64_t p,
                                      uint64_t *seed) {
  kiln_sharding *s = kiln_arena_calloc(m->arena, 1, sizeof *s);
  uint32_t r = shape->rank;
  int64_t *tiles = kiln_arena_calloc(m->arena, r + 1, sizeof *tiles);
  for (uint32_t d = 0; d <= r; d++) tiles[d] = 1;
  for (int64_t left = p; left > 1; left /= 2) {
    uint32_t d = (uint32_t)(rnd(seed) % (r + 1));
    tiles[d] *= 2;
  }
  bool any = false;
  for (uint32_t d = 0; d < r; d++) any = any || tiles[d] > 1;
  if (!any || rnd(seed) % 5 == 0) {
    s->kind = KILN_SHARD_REPLICATED;
    return s;
  }
  s->kind = KILN_SHARD_TILED;
  s->tile_dims = (kiln_i64s){tiles, r + (tiles[r] > 1)};
  s->last_tile_dim_replicate = tiles[r] > 1;
  int64_t *dev = kiln_arena_alloc(m->arena, (size_t)p * sizeof *dev);
  for (int64_t k = 0; k < p; k++) dev[k] = k;
  for (int64_t k = p - 1; k > 0; k--) {
    int64_t j = (int64_t)(rnd(seed) % (uint64_t)(k + 1)), t = dev[k];
    dev[k] = dev[j], dev[j] = t;
  }
  s->devices = (kiln_i64s){dev, (uint32_t)p};
  return s;
}

static void set_sharding(kiln_module *m, kiln_instr *ins, kiln_sharding *s) {
  kiln_attr *a = kiln_instr_add_attr(m, ins, KILN_ATTR_SHARDING);
  ck_assert_ptr_nonnull(a);
  a->v.sharding = s;
}

/* One random case: program `seed` with random shardings on p devices;
 * whether it ran (the oracle may refuse a generated program). */
static bool random_case_mesh(uint64_t seed, uint32_t R, int64_t p, const char *backend);
static bool random_case(uint64_t seed, int64_t p, const char *backend) {
  return random_case_mesh(seed, 1, p, backend);
}

/* With R replicas, each replica from its own arguments (seed + 1000 r). */
static bool random_case_mesh(uint64_t seed, uint32_t R, int64_t p, const char *backend) {
  kiln_progen_options o = {0};
  o.seed = seed;
  o.ninstrs = 6 + (int)(seed % 13);
  o.nparams = 1 + (int)(seed % 3);
  o.dtype = KILN_F32;
  o.max_dim = seed % 2 ? 8 : 6;
  char *text = kiln_progen_text(&o);
  ck_assert_ptr_nonnull(text);
  kiln_module *m = parse_ok(text);
  uint64_t rs = seed * 977 + (uint64_t)p;
  kiln_computation *c = kiln_module_entry(m);
  kiln_instr *root = kiln_computation_root(m, c);
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_instr *ins = m->instrs[c->instrs[i]];
    bool annotate = ins->op == KILN_OP_PARAMETER || (ins == root) || rnd(&rs) % 6 == 0;
    if (annotate && kiln_shape_is_array(&ins->shape) && ins->op != KILN_OP_CONSTANT)
      set_sharding(m, ins, random_sharding(m, &ins->shape, p, &rs));
  }
  kiln_status st = {0};
  kiln_literal **args[2] = {NULL, NULL}, *want[2] = {NULL, NULL}, *got[2] = {NULL, NULL};
  uint32_t n = 0;
  ck_assert_uint_le(R, 2);
  int wrc = 0;
  for (uint32_t r = 0; r < R && wrc == 0; r++) {
    ck_assert_int_eq(kiln_test_args_random(m, seed + 1000 * r, &args[r], &n, &st), 0);
    wrc = kiln_interp_run(m, (const kiln_literal *const *)args[r], n, NULL, &want[r], &st);
  }
  if (getenv("KILN_SPMD_VERBOSE"))
    fprintf(stderr, "seed %llu: oracle %d %s\n", (unsigned long long)seed, wrc, st.msg);
  if (wrc == 0) {
    size_t dlen;
    char *dump = kiln_module_print(m, &dlen);
    const kiln_literal *const *per[2] = {(const kiln_literal *const *)args[0],
                                         (const kiln_literal *const *)args[R - 1]};
    int rc = R == 1 ? kiln_run_module_global(m, backend, NULL, (uint32_t)p, NULL, per[0], n,
                                             &got[0], NULL, &st)
                    : kiln_run_module_global_mesh(m, backend, NULL, R, (uint32_t)p, NULL, per, n,
                                                  got, NULL, &st);
    ck_assert_msg(rc == 0, "seed %llu, %u x %lld devices, %s: %s: %s\n%s", (unsigned long long)seed,
                  R, (long long)p, backend, st.where, st.msg, dump);
    for (uint32_t r = 0; r < R; r++) {
      char why[200];
      ck_assert_msg(close_enough(want[r], got[r], why, sizeof why),
                    "seed %llu, replica %u of %u x %lld devices, %s: %s\n%s",
                    (unsigned long long)seed, r, R, (long long)p, backend, why, dump);
    }
    kiln_free(dump);
  }
  for (uint32_t r = 0; r < 2; r++) {
    kiln_literal_destroy(want[r]);
    kiln_literal_destroy(got[r]);
    if (args[r]) kiln_test_args_free(args[r], n);
  }
  kiln_module_destroy(m);
  kiln_free(text);
  return wrc == 0;
}

static int nseeds(int dflt) {
  const char *e = getenv("KILN_SPMD_SEEDS");
  int n = e ? atoi(e) : 0;
  return n > 0 ? n : dflt;
}

START_TEST(test_random_interp) {
  static const int64_t ps[4] = {1, 2, 4, 8};
  int n = nseeds(40), ran = 0;
  for (int s = 0; s < n; s++) ran += random_case((uint64_t)s, ps[_i], "interp");
  ck_assert_int_ge(ran, n / 2);
}
END_TEST

START_TEST(test_random_cpu) {
  static const int64_t ps[2] = {2, 4};
  int n = nseeds(3), ran = 0;
  for (int s = 0; s < n; s++) ran += random_case((uint64_t)(100 + s), ps[_i], "cpu");
  ck_assert_int_ge(ran, 1);
}
END_TEST

/* Random programs with windowed einsum forced on: every dot whose operand
 * would be gathered along a dim it does not contract takes the ring. */
START_TEST(test_random_windowed) {
  static const int64_t ps[3] = {2, 4, 8};
  setenv("KILN_SPMD_WINDOWED", "on", 1);
  int n = nseeds(40), ran = 0;
  for (int s = 0; s < n; s++) ran += random_case((uint64_t)(500 + s), ps[_i], "interp");
  unsetenv("KILN_SPMD_WINDOWED");
  ck_assert_int_ge(ran, n / 2);
}
END_TEST

START_TEST(test_random_windowed_cpu) {
  setenv("KILN_SPMD_WINDOWED", "on", 1);
  int n = nseeds(3), ran = 0;
  for (int s = 0; s < n; s++) ran += random_case((uint64_t)(600 + s), 4, "cpu");
  unsetenv("KILN_SPMD_WINDOWED");
  ck_assert_int_ge(ran, 1);
}
END_TEST

START_TEST(test_random_replicas) {
  /* 2 replicas of 1, 2 and 4 partitions, the replicas' arguments differ:
   * a collective that mixed replicas would show */
  static const int64_t ps[3] = {1, 2, 4};
  int n = nseeds(16), ran = 0;
  for (int s = 0; s < n; s++) ran += random_case_mesh((uint64_t)(300 + s), 2, ps[_i], "interp");
  ck_assert_int_ge(ran, n / 2);
}
END_TEST

START_TEST(test_random_replicas_cpu) {
  int n = nseeds(3), ran = 0;
  for (int s = 0; s < n; s++) ran += random_case_mesh((uint64_t)(400 + s), 2, 2, "cpu");
  ck_assert_int_ge(ran, 1);
}
END_TEST

static Suite *spmd_suite(void) {
  Suite *s = suite_create("spmd");
  TCase *tc = tcase_create("tiling");
  tcase_add_test(tc, test_tiling_groups_and_derive);
  tcase_add_test(tc, test_sdy_sharding);
  suite_add_tcase(s, tc);
  tc = tcase_create("programs");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_megatron_one_all_reduce);
  tcase_add_test(tc, test_halo_pad);
  tcase_add_test(tc, test_halo_slice_concat);
  tcase_add_test(tc, test_halo_reduce_window);
  tcase_add_test(tc, test_halo_2d_and_uneven);
  tcase_add_test(tc, test_halo_convolution);
  tcase_add_test(tc, test_shard_map_region);
  tcase_add_test(tc, test_shard_map_partially_manual);
  tcase_add_test(tc, test_shard_map_two_results);
  tcase_add_test(tc, test_shard_map_gspmd_form);
  tcase_add_test(tc, test_data_parallel_step);
  tcase_add_test(tc, test_fsdp_all_gather);
  tcase_add_test(tc, test_2d_matmul);
  tcase_add_test(tc, test_windowed_einsum);
  tcase_add_test(tc, test_windowed_einsum_choice);
  tcase_add_test(tc, test_uneven_shards);
  tcase_add_test(tc, test_reshard_collectives);
  tcase_add_test(tc, test_combiner);
  tcase_add_test(tc, test_reduce_scatter);
  tcase_add_test(tc, test_reduce_init_not_identity);
  tcase_add_test(tc, test_gather_embedding);
  tcase_add_test(tc, test_gather_scatter_split_vocabulary);
  tcase_add_test(tc, test_gather_scatter_other_dims);
  tcase_add_test(tc, test_while_split_state);
  tcase_add_test(tc, test_while_other_states);
  tcase_add_test(tc, test_conditional_split);
  tcase_add_test(tc, test_convolution_batch_and_features);
  tcase_add_test(tc, test_refusals);
  tcase_add_test(tc, test_replicas_global);
  tcase_add_test(tc, test_replicas_refusals);
  suite_add_tcase(s, tc);
  tc = tcase_create("random");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, test_random_interp, 0, 4);
  tcase_add_loop_test(tc, test_random_replicas, 0, 3);
  tcase_add_loop_test(tc, test_random_windowed, 0, 3);
  suite_add_tcase(s, tc);
  tc = tcase_create("cpu");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_megatron_cpu);
  tcase_add_loop_test(tc, test_random_cpu, 0, 2);
  tcase_add_test(tc, test_random_replicas_cpu);
  tcase_add_test(tc, test_random_windowed_cpu);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(spmd_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
