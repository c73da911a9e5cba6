/* Unit tests for the interpreter's structured ops: data movement with
 * XLA's index clamping, dot and convolution, gather and scatter, reductions
 * and windows, sort and top-k, linear algebra, fft, batch norm and the bit
 * generators. Expected values are worked out by hand (the bit generators'
 * from the Random123 known-answer vectors). */
#include <check.h>
#include <stdlib.h>

#include "tests/unit/test_interp_harness.h"

#define ADD_F32 \
  "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b) }\n"
#define ADD_S32 \
  "add { a = s32[] parameter(0)\n b = s32[] parameter(1)\n ROOT s = s32[] add(a, b) }\n"
#define MAX_F32 \
  "max { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] maximum(a, b) }\n"

/* ---- data movement ------------------------------------------------------ */

START_TEST(test_dynamic_slice_clamps) {
  const char *ds = "HloModule m\nENTRY e { a = s32[5] parameter(0)\n i = s32[] parameter(1)\n"
                   " ROOT d = s32[2] dynamic-slice(a, i), dynamic_slice_sizes={2} }\n";
  expect(ds, "s32[2] {3, 4}", "s32[5] {0, 1, 2, 3, 4}", "s32[] 4", NULL);
  expect(ds, "s32[2] {0, 1}", "s32[5] {0, 1, 2, 3, 4}", "s32[] -2", NULL);
  expect(ds, "s32[2] {2, 3}", "s32[5] {0, 1, 2, 3, 4}", "s32[] 2", NULL);
  const char *dus = "HloModule m\nENTRY e { a = s32[5] parameter(0)\n u = s32[2] parameter(1)\n"
                    " i = u32[] parameter(2)\n ROOT d = s32[5] dynamic-update-slice(a, u, i) }\n";
  expect(dus, "s32[5] {0, 0, 0, 7, 8}", "s32[5] {0, 0, 0, 0, 0}", "s32[2] {7, 8}", "u32[] 10",
         NULL);
  expect(dus, "s32[5] {0, 7, 8, 0, 0}", "s32[5] {0, 0, 0, 0, 0}", "s32[2] {7, 8}", "u32[] 1", NULL);
  expect("HloModule m\nENTRY e { a = s32[3,3] parameter(0)\n i = s32[] constant(5)\n"
         " j = s32[] constant(-1)\n ROOT d = s32[2,2] dynamic-slice(a, i, j), "
         "dynamic_slice_sizes={2,2} }\n",
         "s32[2,2] {{4, 5}, {7, 8}}", "s32[3,3] {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}", NULL);
}
END_TEST

START_TEST(test_shape_ops) {
  expect("HloModule m\nENTRY e { a = s32[2,3] parameter(0)\n"
         " t = s32[3,2] transpose(a), dimensions={1,0}\n"
         " r = s32[2,3] reverse(a), dimensions={1}\n"
         " h = s32[3,2] reshape(a)\n"
         " ROOT o = (s32[3,2], s32[2,3], s32[3,2]) tuple(t, r, h) }\n",
         "(s32[3,2], s32[2,3], s32[3,2]) ({{1, 4}, {2, 5}, {3, 6}}, {{3, 2, 1}, {6, 5, 4}}, "
         "{{1, 2}, {3, 4}, {5, 6}})",
         "s32[2,3] {{1, 2, 3}, {4, 5, 6}}", NULL);
  expect("HloModule m\nENTRY e { a = s32[2] parameter(0)\n b = s32[1] parameter(1)\n"
         " c = s32[3] concatenate(a, b), dimensions={0}\n"
         " i = s32[2,3] iota(), iota_dimension=1\n"
         " br = s32[2,3] broadcast(a), dimensions={0}\n"
         " x = s32[6] iota(), iota_dimension=0\n"
         " sl = s32[3] slice(x), slice={[1:6:2]}\n"
         " ROOT o = (s32[3], s32[2,3], s32[2,3], s32[3]) tuple(c, i, br, sl) }\n",
         "(s32[3], s32[2,3], s32[2,3], s32[3]) ({1, 2, 3}, {{0, 1, 2}, {0, 1, 2}}, "
         "{{1, 1, 1}, {2, 2, 2}}, {1, 3, 5})",
         "s32[2] {1, 2}", "s32[1] {3}", NULL);
  expect("HloModule m\nENTRY e { a = s32[2] parameter(0)\n z = s32[] constant(0)\n"
         " p = s32[6] pad(a, z), padding=1_2_1\n b = s32[3] parameter(1)\n"
         " q = s32[2] pad(b, z), padding=-1_0\n ROOT o = (s32[6], s32[2]) tuple(p, q) }\n",
         "(s32[6], s32[2]) ({0, 1, 0, 2, 0, 0}, {2, 3})", "s32[2] {1, 2}", "s32[3] {1, 2, 3}",
         NULL);
}
END_TEST

START_TEST(test_bitcast_reads_physical_layout) {
  /* {1,0} stores rows; {0,1} reads columns first: the bitcast transposes. */
  expect("HloModule m\nENTRY e { a = f32[2,3]{1,0} parameter(0)\n"
         " ROOT b = f32[3,2]{0,1} bitcast(a) }\n",
         "f32[3,2] {{1, 4}, {2, 5}, {3, 6}}", "f32[2,3] {{1, 2, 3}, {4, 5, 6}}", NULL);
  expect("HloModule m\nENTRY e { a = f32[2,3]{1,0} parameter(0)\n"
         " ROOT b = f32[6]{0} bitcast(a) }\n",
         "f32[6] {1, 2, 3, 4, 5, 6}", "f32[2,3] {{1, 2, 3}, {4, 5, 6}}", NULL);
  expect("HloModule m\nENTRY e { a = f32[2,3]{0,1} parameter(0)\n"
         " ROOT b = f32[6]{0} bitcast(a) }\n",
         "f32[6] {1, 4, 2, 5, 3, 6}", "f32[2,3] {{1, 2, 3}, {4, 5, 6}}", NULL);
}
END_TEST

START_TEST(test_dimension_sizes) {
  expect("HloModule m\nENTRY e { a = s32[4,3] parameter(0)\n n = s32[] constant(2)\n"
         " d = s32[<=4,3] set-dimension-size(a, n), dimensions={0}\n"
         " g0 = s32[] get-dimension-size(d), dimensions={0}\n"
         " g1 = s32[] get-dimension-size(d), dimensions={1}\n"
         " z = s32[] constant(0)\n"
         " r = s32[3] reduce(d, z), dimensions={0}, to_apply=add\n"
         " ROOT t = (s32[], s32[], s32[3]) tuple(g0, g1, r) }\n" ADD_S32,
         "(s32[], s32[], s32[3]) (2, 3, {5, 7, 9})",
         "s32[4,3] {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 12}}", NULL);
}
END_TEST

/* ---- dot and convolution ------------------------------------------------ */

START_TEST(test_dot) {
  expect("HloModule m\nENTRY e { a = f32[2,2,3] parameter(0)\n b = f32[2,3,1] parameter(1)\n"
         " ROOT d = f32[2,2,1] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
         "rhs_batch_dims={0}, rhs_contracting_dims={1} }\n",
         "f32[2,2,1] {{{6}, {15}}, {{2}, {3}}}",
         "f32[2,2,3] {{{1, 2, 3}, {4, 5, 6}}, {{1, 0, 0}, {0, 1, 0}}}",
         "f32[2,3,1] {{{1}, {1}, {1}}, {{2}, {3}, {4}}}", NULL);
  expect("HloModule m\nENTRY e { a = f32[2,3] parameter(0)\n b = f32[3,2] parameter(1)\n"
         " ROOT d = f32[2,2] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0} }\n",
         "f32[2,2] {{4, 5}, {10, 11}}", "f32[2,3] {{1, 2, 3}, {4, 5, 6}}",
         "f32[3,2] {{1, 0}, {0, 1}, {1, 1}}", NULL);
  /* Outer product (no contracting dims) and integer wraparound. */
  expect("HloModule m\nENTRY e { a = s32[2] parameter(0)\n b = s32[2] parameter(1)\n"
         " o = s32[2,2] dot(a, b)\n"
         " w = s32[] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
         " ROOT t = (s32[2,2], s32[]) tuple(o, w) }\n",
         "(s32[2,2], s32[]) ({{0, 65536}, {0, 65536}}, 65536)", "s32[2] {65536, 65536}",
         "s32[2] {65536, 1}", NULL);
}
END_TEST

START_TEST(test_dot_operands_take_result_type) {
  /* As XLA: f32 operands are converted to the bf16 result type first
   * (1.00390625 -> 1), so the sum is 3, not round(3.01171875) = 3.015625. */
  expect("HloModule m\nENTRY e { a = f32[3] parameter(0)\n b = f32[3] parameter(1)\n"
         " ROOT d = bf16[] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0} }\n",
         "bf16[] 3", "f32[3] {1.00390625, 1.00390625, 1.00390625}", "f32[3] {1, 1, 1}", NULL);
  /* Accumulation is exact until the one rounding at the end: f32 sum of
   * 1 + 2^-24 + 2^-24 is 1 + 2^-23, where f32 steps would give 1. */
  expect("HloModule m\nENTRY e { a = f32[3] parameter(0)\n b = f32[3] parameter(1)\n"
         " ROOT d = f32[] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0} }\n",
         "f32[] 1.0000001", "f32[3] {1, 5.96046448e-08, 5.96046448e-08}", "f32[3] {1, 1, 1}", NULL);
}
END_TEST

static const char *conv1d(const char *window, const char *out) {
  static char buf[512];
  snprintf(buf, sizeof buf,
           "HloModule m\nENTRY e { a = f32[1,1,5] parameter(0)\n k = f32[1,1,3] parameter(1)\n"
           " ROOT c = %s convolution(a, k), window={%s}, dim_labels=bf0_oi0->bf0 }\n",
           out, window);
  return buf;
}

START_TEST(test_convolution_1d) {
  const char *in = "f32[1,1,5] {{{1, 2, 3, 4, 5}}}", *k = "f32[1,1,3] {{{1, 2, 3}}}";
  expect(conv1d("size=3", "f32[1,1,3]"), "f32[1,1,3] {{{14, 20, 26}}}", in, k, NULL);
  expect(conv1d("size=3 pad=1_1", "f32[1,1,5]"), "f32[1,1,5] {{{8, 14, 20, 26, 14}}}", in, k, NULL);
  expect(conv1d("size=3 stride=2 pad=1_1", "f32[1,1,3]"), "f32[1,1,3] {{{8, 20, 14}}}", in, k,
         NULL);
  expect(conv1d("size=3 rhs_dilate=2", "f32[1,1,1]"), "f32[1,1,1] {{{22}}}", in, k, NULL);
  expect(conv1d("size=3 lhs_dilate=2", "f32[1,1,7]"), "f32[1,1,7] {{{7, 4, 11, 6, 15, 8, 19}}}", in,
         k, NULL);
  expect(conv1d("size=3 rhs_reversal=1", "f32[1,1,3]"), "f32[1,1,3] {{{10, 16, 22}}}", in, k, NULL);
}
END_TEST

START_TEST(test_convolution_groups_and_2d) {
  expect("HloModule m\nENTRY e { a = f32[1,2,3] parameter(0)\n k = f32[2,1,1] parameter(1)\n"
         " ROOT c = f32[1,2,3] convolution(a, k), window={size=1}, dim_labels=bf0_oi0->bf0, "
         "feature_group_count=2 }\n",
         "f32[1,2,3] {{{10, 20, 30}, {400, 500, 600}}}", "f32[1,2,3] {{{1, 2, 3}, {4, 5, 6}}}",
         "f32[2,1,1] {{{10}}, {{100}}}", NULL);
  expect("HloModule m\nENTRY e { a = f32[2,1,1] parameter(0)\n k = f32[2,1,1] parameter(1)\n"
         " ROOT c = f32[1,2,1] convolution(a, k), window={size=1}, dim_labels=bf0_oi0->bf0, "
         "batch_group_count=2 }\n",
         "f32[1,2,1] {{{3}, {50}}}", "f32[2,1,1] {{{3}}, {{5}}}", "f32[2,1,1] {{{1}}, {{10}}}",
         NULL);
  expect("HloModule m\nENTRY e { a = f32[1,2,2,1] parameter(0)\n k = f32[2,2,1,1] parameter(1)\n"
         " ROOT c = f32[1,1,1,1] convolution(a, k), window={size=2x2}, "
         "dim_labels=b01f_01io->b01f }\n",
         "f32[1,1,1,1] {{{{30}}}}", "f32[1,2,2,1] {{{{1}, {2}}, {{3}, {4}}}}",
         "f32[2,2,1,1] {{{{1}}, {{2}}}, {{{3}}, {{4}}}}", NULL);
}
END_TEST

/* ---- gather and scatter ------------------------------------------------- */

static const char *const operand33 = "s32[3,3] {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}";

START_TEST(test_gather) {
  const char *rows = "HloModule m\nENTRY e { a = s32[3,3] parameter(0)\n i = s32[2] parameter(1)\n"
                     " ROOT g = s32[2,3] gather(a, i), offset_dims={1}, collapsed_slice_dims={0}, "
                     "start_index_map={0}, index_vector_dim=1, slice_sizes={1,3} }\n";
  expect(rows, "s32[2,3] {{1, 2, 3}, {7, 8, 9}}", operand33, "s32[2] {0, 2}", NULL);
  expect(rows, "s32[2,3] {{7, 8, 9}, {1, 2, 3}}", operand33, "s32[2] {5, -1}", NULL); /* clamped */
  expect("HloModule m\nENTRY e { a = s32[3,3] parameter(0)\n i = s32[1,2] parameter(1)\n"
         " ROOT g = s32[1,2,2] gather(a, i), offset_dims={1,2}, collapsed_slice_dims={}, "
         "start_index_map={0,1}, index_vector_dim=1, slice_sizes={2,2} }\n",
         "s32[1,2,2] {{{5, 6}, {8, 9}}}", operand33, "s32[1,2] {{2, 2}}", NULL);
  expect("HloModule m\nENTRY e { a = s32[2,3] parameter(0)\n i = s32[2,1] parameter(1)\n"
         " ROOT g = s32[2] gather(a, i), offset_dims={}, collapsed_slice_dims={1}, "
         "start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, "
         "index_vector_dim=1, slice_sizes={1,1} }\n",
         "s32[2] {3, 4}", "s32[2,3] {{1, 2, 3}, {4, 5, 6}}", "s32[2,1] {{2}, {0}}", NULL);
}
END_TEST

static const char *scatter_text(const char *combiner) {
  static char buf[1024];
  snprintf(buf, sizeof buf,
           "HloModule m\n%s"
           "ENTRY e { a = s32[3,3] parameter(0)\n i = s32[2] parameter(1)\n u = s32[2,3] "
           "parameter(2)\n"
           " ROOT s = s32[3,3] scatter(a, i, u), update_window_dims={1}, inserted_window_dims={0}, "
           "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=f }\n",
           combiner);
  return buf;
}

START_TEST(test_scatter) {
  const char *add = scatter_text(
      "f { a = s32[] parameter(0)\n b = s32[] parameter(1)\n ROOT s = s32[] add(a, b) }\n");
  const char *upd = "s32[2,3] {{10, 20, 30}, {70, 80, 90}}";
  expect(add, "s32[3,3] {{11, 22, 33}, {4, 5, 6}, {77, 88, 99}}", operand33, "s32[2] {0, 2}", upd,
         NULL);
  expect(add, "s32[3,3] {{1, 2, 3}, {84, 105, 126}, {7, 8, 9}}", operand33, "s32[2] {1, 1}", upd,
         NULL);
  /* A window that does not fit is skipped whole (no clamping). */
  expect(add, "s32[3,3] {{1, 2, 3}, {14, 25, 36}, {7, 8, 9}}", operand33, "s32[2] {1, 3}", upd,
         NULL);
  expect(add, "s32[3,3] {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}", operand33, "s32[2] {-1, 7}", upd, NULL);
  /* Updates apply in order: with an overwriting combiner the last wins. */
  const char *last = scatter_text(
      "f { a = s32[] parameter(0)\n b = s32[] parameter(1)\n ROOT s = s32[] copy(b) }\n");
  expect(last, "s32[3,3] {{1, 2, 3}, {70, 80, 90}, {7, 8, 9}}", operand33, "s32[2] {1, 1}", upd,
         NULL);
}
END_TEST

/* ---- reductions and windows --------------------------------------------- */

START_TEST(test_reduce_variadic_argmax) {
  expect("HloModule m\n"
         "argmax { av = f32[] parameter(0)\n ai = s32[] parameter(1)\n bv = f32[] parameter(2)\n"
         " bi = s32[] parameter(3)\n gt = pred[] compare(av, bv), direction=GT\n"
         " eq = pred[] compare(av, bv), direction=EQ\n lt = pred[] compare(ai, bi), direction=LT\n"
         " tie = pred[] and(eq, lt)\n keep = pred[] or(gt, tie)\n v = f32[] select(keep, av, bv)\n"
         " i = s32[] select(keep, ai, bi)\n ROOT t = (f32[], s32[]) tuple(v, i) }\n"
         "ENTRY e { x = f32[2,4] parameter(0)\n ix = s32[2,4] iota(), iota_dimension=1\n"
         " ninf = f32[] constant(-inf)\n z = s32[] constant(0)\n"
         " ROOT r = (f32[2], s32[2]) reduce(x, ix, ninf, z), dimensions={1}, to_apply=argmax }\n",
         "(f32[2], s32[2]) ({7, 9}, {1, 0})", "f32[2,4] {{3, 7, 7, 1}, {9, 2, 9, 0}}", NULL);
}
END_TEST

START_TEST(test_reduce_general_reducer) {
  /* A reducer that calls another computation runs through literals. */
  expect("HloModule m\n" ADD_F32 "wrap { a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
         " ROOT c = f32[] call(a, b), to_apply=add }\n"
         "ENTRY e { x = f32[2,3] parameter(0)\n z = f32[] constant(10)\n"
         " ROOT r = f32[3] reduce(x, z), dimensions={0}, to_apply=wrap }\n",
         "f32[3] {15, 17, 19}", "f32[2,3] {{1, 2, 3}, {4, 5, 6}}", NULL);
  expect("HloModule m\n" ADD_F32 "ENTRY e { x = f32[2,3] parameter(0)\n z = f32[] constant(0)\n"
         " ROOT r = f32[] reduce(x, z), dimensions={0,1}, to_apply=add }\n",
         "f32[] 21", "f32[2,3] {{1, 2, 3}, {4, 5, 6}}", NULL);
}
END_TEST

START_TEST(test_reduce_window) {
  expect("HloModule m\n" MAX_F32 "ENTRY e { x = f32[4] parameter(0)\n n = f32[] constant(-inf)\n"
         " ROOT r = f32[3] reduce-window(x, n), window={size=2 stride=2 pad=1_1}, to_apply=max }\n",
         "f32[3] {1, 3, 5}", "f32[4] {1, 3, 2, 5}", NULL);
  expect("HloModule m\n" ADD_F32 "ENTRY e { x = f32[2,3] parameter(0)\n z = f32[] constant(0)\n"
         " ROOT r = f32[1,2] reduce-window(x, z), window={size=2x2}, to_apply=add }\n",
         "f32[1,2] {{12, 16}}", "f32[2,3] {{1, 2, 3}, {4, 5, 6}}", NULL);
  expect("HloModule m\n" ADD_F32 "ENTRY e { x = f32[3] parameter(0)\n z = f32[] constant(0)\n"
         " ROOT r = f32[4] reduce-window(x, z), window={size=2 lhs_dilate=2}, to_apply=add }\n",
         "f32[4] {1, 2, 2, 3}", "f32[3] {1, 2, 3}", NULL);
  expect("HloModule m\n" ADD_F32 "ENTRY e { x = f32[4] parameter(0)\n z = f32[] constant(0)\n"
         " ROOT r = f32[2] reduce-window(x, z), window={size=2 rhs_dilate=2}, to_apply=add }\n",
         "f32[2] {4, 6}", "f32[4] {1, 2, 3, 4}", NULL);
  /* The init value enters once per window; padding adds nothing. */
  expect("HloModule m\n" ADD_F32 "ENTRY e { x = f32[4] parameter(0)\n z = f32[] constant(10)\n"
         " ROOT r = f32[2] reduce-window(x, z), window={size=2 stride=2 pad=1_0}, to_apply=add }\n",
         "f32[2] {11, 15}", "f32[4] {1, 2, 3, 4}", NULL);
}
END_TEST

START_TEST(test_select_and_scatter) {
  const char *comps = "ge { a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
                      " ROOT c = pred[] compare(a, b), direction=GE }\n" ADD_F32;
  char buf[1024];
  snprintf(buf, sizeof buf,
           "HloModule m\n%sENTRY e { x = f32[6] parameter(0)\n s = f32[2] parameter(1)\n"
           " z = f32[] constant(0)\n ROOT r = f32[6] select-and-scatter(x, s, z), "
           "window={size=3 stride=3}, select=ge, scatter=add }\n",
           comps);
  expect(buf, "f32[6] {0, 2, 0, 6, 0, 0}", "f32[6] {1, 9, 3, 7, 5, 6}", "f32[2] {2, 6}", NULL);
  expect(buf, "f32[6] {2, 0, 0, 6, 0, 0}", "f32[6] {5, 5, 5, 7, 5, 6}", "f32[2] {2, 6}", NULL);
  snprintf(buf, sizeof buf,
           "HloModule m\n%sENTRY e { x = f32[2] parameter(0)\n s = f32[2] parameter(1)\n"
           " z = f32[] constant(0)\n ROOT r = f32[2] select-and-scatter(x, s, z), "
           "window={size=2 pad=1_0}, select=ge, scatter=add }\n",
           comps);
  expect(buf, "f32[2] {10, 20}", "f32[2] {1, 2}", "f32[2] {10, 20}", NULL);
}
END_TEST

START_TEST(test_map) {
  expect("HloModule m\nf { x = f32[] parameter(0)\n y = f32[] parameter(1)\n"
         " p = f32[] multiply(x, y)\n o = f32[] constant(1)\n ROOT r = f32[] add(p, o) }\n"
         "ENTRY e { a = f32[3] parameter(0)\n b = f32[3] parameter(1)\n"
         " ROOT m = f32[3] map(a, b), dimensions={0}, to_apply=f }\n",
         "f32[3] {3, 7, 13}", "f32[3] {1, 2, 3}", "f32[3] {2, 3, 4}", NULL);
}
END_TEST

/* ---- sort and top-k ----------------------------------------------------- */

START_TEST(test_sort) {
  const char *cmp =
      "lt { a = f32[] parameter(0)\n b = f32[] parameter(1)\n c = s32[] parameter(2)\n"
      " d = s32[] parameter(3)\n ROOT r = pred[] compare(a, b), direction=LT }\n";
  char buf[1024];
  snprintf(buf, sizeof buf,
           "HloModule m\n%sENTRY e { k = f32[5] parameter(0)\n v = s32[5] parameter(1)\n"
           " ROOT s = (f32[5], s32[5]) sort(k, v), dimensions={0}, is_stable=true, to_apply=lt }\n",
           cmp);
  expect(buf, "(f32[5], s32[5]) ({1, 1, 2, 3, 3}, {1, 3, 2, 0, 4})", "f32[5] {3, 1, 2, 1, 3}",
         "s32[5] {0, 1, 2, 3, 4}", NULL);
  expect("HloModule m\ngt { a = s32[] parameter(0)\n b = s32[] parameter(1)\n"
         " ROOT r = pred[] compare(a, b), direction=GT }\n"
         "ENTRY e { k = s32[2,3] parameter(0)\n"
         " ROOT s = s32[2,3] sort(k), dimensions={0}, to_apply=gt }\n",
         "s32[2,3] {{4, 2, 6}, {1, 0, 3}}", "s32[2,3] {{1, 2, 3}, {4, 0, 6}}", NULL);
  expect("HloModule m\nlt { a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
         " ROOT r = pred[] compare(a, b), direction=LT, type=TOTALORDER }\n"
         "ENTRY e { k = f32[5] parameter(0)\n"
         " ROOT s = f32[5] sort(k), dimensions={0}, to_apply=lt }\n",
         "f32[5] {-inf, -0, 0, 2, nan}", "f32[5] {nan, 0, 2, -0, -inf}", NULL);
}
END_TEST

START_TEST(test_topk) {
  expect("HloModule m\nENTRY e { x = f32[2,5] parameter(0)\n"
         " ROOT t = (f32[2,2], s32[2,2]) topk(x), k=2, largest=true }\n",
         "(f32[2,2], s32[2,2]) ({{5, 5}, {9, 8}}, {{1, 3}, {4, 0}})",
         "f32[2,5] {{1, 5, 3, 5, 2}, {8, 1, 2, 3, 9}}", NULL);
}
END_TEST

/* ---- linear algebra, fft, batch norm ------------------------------------ */

START_TEST(test_cholesky_and_triangular_solve) {
  expect("HloModule m\nENTRY e { a = f64[2,2] parameter(0)\n"
         " ROOT c = f64[2,2] cholesky(a), lower=true }\n",
         "f64[2,2] {{2, 0}, {1, 1.4142135623730951}}", "f64[2,2] {{4, 2}, {2, 3}}", NULL);
  expect("HloModule m\nENTRY e { a = f64[2,2] parameter(0)\n"
         " ROOT c = f64[2,2] cholesky(a), lower=false }\n",
         "f64[2,2] {{2, 1}, {0, 1.4142135623730951}}", "f64[2,2] {{4, 2}, {2, 3}}", NULL);
  const char *ts = "HloModule m\nENTRY e { a = f32[2,2] parameter(0)\n b = f32[2,1] parameter(1)\n"
                   " ROOT x = f32[2,1] triangular-solve(a, b), left_side=true, lower=true, "
                   "transpose_a=%s }\n";
  char buf[512];
  snprintf(buf, sizeof buf, ts, "NO_TRANSPOSE");
  expect(buf, "f32[2,1] {{1}, {2}}", "f32[2,2] {{2, 99}, {1, 1}}", "f32[2,1] {{2}, {3}}", NULL);
  snprintf(buf, sizeof buf, ts, "TRANSPOSE");
  expect(buf, "f32[2,1] {{-0.5}, {3}}", "f32[2,2] {{2, 99}, {1, 1}}", "f32[2,1] {{2}, {3}}", NULL);
  /* x * a = b with a upper triangular and a unit diagonal. */
  expect("HloModule m\nENTRY e { a = f32[2,2] parameter(0)\n b = f32[1,2] parameter(1)\n"
         " ROOT x = f32[1,2] triangular-solve(a, b), left_side=false, lower=false, "
         "unit_diagonal=true, transpose_a=NO_TRANSPOSE }\n",
         "f32[1,2] {{1, 1}}", "f32[2,2] {{7, 2}, {99, 7}}", "f32[1,2] {{1, 3}}", NULL);
}
END_TEST

START_TEST(test_fft) {
  expect("HloModule m\nENTRY e { x = c64[4] parameter(0)\n"
         " ROOT f = c64[4] fft(x), fft_type=FFT, fft_length={4} }\n",
         "c64[4] {(1, 0), (0, -1), (-1, 0), (0, 1)}", "c64[4] {(0, 0), (1, 0), (0, 0), (0, 0)}",
         NULL);
  expect("HloModule m\nENTRY e { x = f32[4] parameter(0)\n"
         " r = c64[3] fft(x), fft_type=RFFT, fft_length={4}\n"
         " i = f32[4] fft(r), fft_type=IRFFT, fft_length={4}\n"
         " ROOT t = (c64[3], f32[4]) tuple(r, i) }\n",
         "(c64[3], f32[4]) ({(10, 0), (-2, 2), (-2, 0)}, {1, 2, 3, 4})", "f32[4] {1, 2, 3, 4}",
         NULL);
}
END_TEST

START_TEST(test_batch_norm) {
  expect("HloModule m\nENTRY e { x = f32[2,2] parameter(0)\n s = f32[2] constant({1, 2})\n"
         " o = f32[2] constant({0, 1})\n"
         " ROOT t = (f32[2,2], f32[2], f32[2]) batch-norm-training(x, s, o), epsilon=0, "
         "feature_index=1 }\n",
         "(f32[2,2], f32[2], f32[2]) ({{-1, -1}, {1, 3}}, {2, 3}, {1, 1})",
         "f32[2,2] {{1, 2}, {3, 4}}", NULL);
  expect(
      "HloModule m\nENTRY e { x = f32[2,2] parameter(0)\n s = f32[2] constant({1, 1})\n"
      " o = f32[2] constant({0, 0})\n m = f32[2] constant({2, 3})\n v = f32[2] constant({4, 1})\n"
      " ROOT y = f32[2,2] batch-norm-inference(x, s, o, m, v), epsilon=0, feature_index=1 }\n",
      "f32[2,2] {{-0.5, -1}, {0.5, 1}}", "f32[2,2] {{1, 2}, {3, 4}}", NULL);
}
END_TEST

/* ---- random numbers ----------------------------------------------------- */

START_TEST(test_rng_bit_generator_threefry_kat) {
  /* Random123 threefry2x32-20: key (13198a2e, 03707344), counter
   * (243f6a88, 85a308d3) -> (c4923a9c, 483df7a0). */
  expect("HloModule m\nENTRY e { s = u64[2] parameter(0)\n"
         " ROOT r = (u64[2], u64[1]) rng-bit-generator(s), algorithm=rng_three_fry }\n",
         "(u64[2], u64[1]) ({247824715720788526, 9629550131187509897}, {5205589014174907036})",
         "u64[2] {247824715720788526, 9629550131187509896}", NULL);
  /* All zeros -> (6b200159, 99ba4efe); a u32[2] takes one word per half. */
  expect("HloModule m\nENTRY e { s = u64[2] parameter(0)\n"
         " ROOT r = (u64[2], u32[2]) rng-bit-generator(s), algorithm=rng_three_fry }\n",
         "(u64[2], u32[2]) ({0, 1}, {1797259609, 2579123966})", "u64[2] {0, 0}", NULL);
}
END_TEST

START_TEST(test_rng_bit_generator_philox_kat) {
  /* Random123 philox4x32-10: counter (243f6a88, 85a308d3, 13198a2e,
   * 03707344), key (a4093822, 299f31d0) -> (d16cfe09, 94fdcceb, 5001e420,
   * 24126ea1). A three-word state is (key, counter low, counter high). */
  expect("HloModule m\nENTRY e { s = u64[3] parameter(0)\n"
         " ROOT r = (u64[3], u32[4]) rng-bit-generator(s), algorithm=rng_philox }\n",
         "(u64[3], u32[4]) ({2999170649027065890, 9629550131187509897, 247824715720788526}, "
         "{3513581065, 2499661035, 1342301216, 605187745})",
         "u64[3] {2999170649027065890, 9629550131187509896, 247824715720788526}", NULL);
  /* All zeros -> (6627e8d5, e169c58d, bc57ac4c, 9b00dbd8); rng_default is
   * Philox; a two-word state keeps (key, counter low). */
  expect("HloModule m\nENTRY e { s = u64[2] parameter(0)\n"
         " ROOT r = (u64[2], u32[4]) rng-bit-generator(s), algorithm=rng_default }\n",
         "(u64[2], u32[4]) ({0, 1}, {1713891541, 3781805453, 3159862348, 2600524760})",
         "u64[2] {0, 0}", NULL);
}
END_TEST

START_TEST(test_rng_distributions) {
  const char *u = "HloModule m\nENTRY e { a = f32[] constant(2)\n b = f32[] constant(3)\n"
                  " ROOT r = f32[1000] rng(a, b), distribution=rng_uniform }\n";
  kiln_module *m = parse_ok(u);
  kiln_literal *r1 = NULL, *r2 = NULL;
  kiln_status st;
  ck_assert_int_eq(kiln_interp_run(m, NULL, 0, NULL, &r1, &st), 0);
  ck_assert_int_eq(kiln_interp_run(m, NULL, 0, NULL, &r2, &st), 0);
  ck_assert(kiln_literal_equal(r1, r2)); /* deterministic */
  double lo = 9, hi = 0;
  for (int i = 0; i < 1000; i++) {
    double v = kiln_literal_get_f64(r1, i);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  ck_assert(lo >= 2 && lo < 2.05 && hi < 3 && hi > 2.95);
  kiln_literal_destroy(r1);
  kiln_literal_destroy(r2);
  kiln_module_destroy(m);
  expect("HloModule m\nENTRY e { a = s32[] constant(5)\n b = s32[] constant(6)\n"
         " ROOT r = s32[3] rng(a, b), distribution=rng_uniform }\n",
         "s32[3] {5, 5, 5}", NULL);
}
END_TEST

int main(void) {
  Suite *s = suite_create("interp_ops");
  TCase *tc = tcase_create("ops");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_dynamic_slice_clamps);
  tcase_add_test(tc, test_shape_ops);
  tcase_add_test(tc, test_bitcast_reads_physical_layout);
  tcase_add_test(tc, test_dimension_sizes);
  tcase_add_test(tc, test_dot);
  tcase_add_test(tc, test_dot_operands_take_result_type);
  tcase_add_test(tc, test_convolution_1d);
  tcase_add_test(tc, test_convolution_groups_and_2d);
  tcase_add_test(tc, test_gather);
  tcase_add_test(tc, test_scatter);
  tcase_add_test(tc, test_reduce_variadic_argmax);
  tcase_add_test(tc, test_reduce_general_reducer);
  tcase_add_test(tc, test_reduce_window);
  tcase_add_test(tc, test_select_and_scatter);
  tcase_add_test(tc, test_map);
  tcase_add_test(tc, test_sort);
  tcase_add_test(tc, test_topk);
  tcase_add_test(tc, test_cholesky_and_triangular_solve);
  tcase_add_test(tc, test_fft);
  tcase_add_test(tc, test_batch_norm);
  tcase_add_test(tc, test_rng_bit_generator_threefry_kat);
  tcase_add_test(tc, test_rng_bit_generator_philox_kat);
  tcase_add_test(tc, test_rng_distributions);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
