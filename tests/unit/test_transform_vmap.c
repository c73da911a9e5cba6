/* vmap: the batched program equals running the program on every batch
 * element (the interpreter is the oracle), per op, with in_axes none/0/1
 * and out_axes, through loops (batched predicates included), conditionals
 * and calls; batch sizes inferred from arguments; errors. */
#include "tests/unit/test_transform_harness.h"

#define HELPERS \
  "add { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT s = f64[] add(a, b) }\n" \
  "mx { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT s = f64[] maximum(a, b) }\n" \
  "rep { a = f64[] parameter(0)  ROOT b = f64[] parameter(1) }\n" \
  "ge { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT c = pred[] compare(a, b), " \
  "direction=GE }\n" \
  "lt { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT c = pred[] compare(a, b), " \
  "direction=LT }\n"

#define N TX_NONE

/* vmap of the ENTRY `body` with batch size 3: in/out axes as given. */
static void vcase(const char *body, const int64_t *in, uint32_t nin, const int64_t *out,
                  uint32_t nout) {
  char text[8192], spec[256];
  snprintf(text, sizeof text, "HloModule m\n" HELPERS "ENTRY main {\n%s}\n", body);
  int o = snprintf(spec, sizeof spec, "vmap:in_axes=");
  for (uint32_t i = 0; i < nin; i++)
    o += in[i] == N ? snprintf(spec + o, sizeof spec - o, "%snone", i ? "," : "")
                    : snprintf(spec + o, sizeof spec - o, "%s%lld", i ? "," : "", (long long)in[i]);
  if (nout) {
    o += snprintf(spec + o, sizeof spec - o, ",out_axes=");
    for (uint32_t i = 0; i < nout; i++)
      o += out[i] == N
               ? snprintf(spec + o, sizeof spec - o, "%snone", i ? "," : "")
               : snprintf(spec + o, sizeof spec - o, "%s%lld", i ? "," : "", (long long)out[i]);
  }
  snprintf(spec + o, sizeof spec - o, ",size=3");
  int64_t zeros[16] = {0};
  tx_case = body;
  tx_check_vmap(text, spec, in, nout ? out : zeros, 7);
}

#define V(body, ...) \
  do { \
    const int64_t in_[] = {__VA_ARGS__}; \
    vcase(body, in_, sizeof in_ / sizeof in_[0], NULL, 0); \
  } while (0)

START_TEST(test_elementwise) {
  const char *un = "  x = f64[2,4] parameter(0)  ROOT y = f64[2,4] tanh(x)\n";
  V(un, 0);
  V(un, 1);
  V(un, 2);
  V(un, -1);
  const char *bin =
      "  x = f64[4] parameter(0)  y = f64[4] parameter(1)  ROOT z = f64[4] divide(x, y)\n";
  V(bin, 0, 0);
  V(bin, 0, N);
  V(bin, N, 1);
  const char *cl = "  lo = f64[] parameter(0)  x = f64[4] parameter(1)  hi = f64[] constant(0.6)\n"
                   "  ROOT y = f64[4] clamp(lo, x, hi)\n";
  V(cl, 0, N);
  V(cl, N, 1);
  V(cl, 0, 0);
  const char *sel = "  a = f64[4] parameter(0)  b = f64[4] parameter(1)  p = pred[4] compare(a, "
                    "b), direction=LT\n"
                    "  c = s32[4] convert(a)  s = f64[4] select(p, a, b)  ROOT y = (f64[4], "
                    "s32[4]) tuple(s, c)\n";
  V(sel, 0, N);
  V(sel, N, 0);
  const char *cv = "  x = f64[4] parameter(0)  f = f32[4] convert(x)  ROOT y = f64[4] convert(f)\n";
  V(cv, 0);
}
END_TEST

START_TEST(test_out_axes) {
  const char *two =
      "  x = f64[2] parameter(0)  a = f64[] parameter(1)  ab = f64[2] broadcast(a), dimensions={}\n"
      "  y = f64[2] multiply(x, ab)  s = f64[] multiply(a, a)  ROOT t = (f64[2], f64[]) tuple(y, "
      "s)\n";
  const int64_t in1[] = {0, N}, out1[] = {1, N};
  vcase(two, in1, 2, out1, 2); /* s does not depend on the batch */
  const int64_t in2[] = {1, 0}, out2[] = {-1, 0};
  vcase(two, in2, 2, out2, 2);
  const int64_t in3[] = {N, 0}, out3[] = {0, 0};
  vcase(two, in3, 2, out3, 2); /* y batched through a only */
  const int64_t in4[] = {0, N}, out4[] = {1, 0};
  vcase(two, in4, 2, out4, 2); /* s unbatched, broadcast along the batch */
}
END_TEST

START_TEST(test_shape_ops) {
  V("  x = f64[3] parameter(0)\n  ROOT y = f64[2,3,4] broadcast(x), dimensions={1}\n", 0);
  V("  x = f64[3,2] parameter(0)\n  ROOT y = f64[2,4,3] broadcast(x), dimensions={2,0}\n", 1);
  V("  x = f64[2,3] parameter(0)\n  ROOT y = f64[3,2] reshape(x)\n", 1);
  V("  x = f64[2,3,4] parameter(0)\n  ROOT y = f64[4,2,3] transpose(x), dimensions={2,0,1}\n", 3);
  V("  x = f64[7,5] parameter(0)\n  ROOT y = f64[3,2] slice(x), slice={[1:6:2], [0:4:3]}\n", 1);
  V("  x = f64[3,2] parameter(0)  v = f64[] parameter(1)\n  ROOT y = f64[8,2] pad(x, v), "
    "padding=1_2_1x-1_1\n",
    0, N);
  V("  x = f64[3,2] parameter(0)  v = f64[] parameter(1)\n  ROOT y = f64[8,2] pad(x, v), "
    "padding=1_2_1x-1_1\n",
    N, 0);
  V("  x = f64[3,2] parameter(0)  v = f64[] parameter(1)\n  ROOT y = f64[8,2] pad(x, v), "
    "padding=1_2_1x-1_1\n",
    2, 0);
  V("  x = f64[2,3] parameter(0)  w = f64[2,1] parameter(1)\n  ROOT y = f64[2,7] concatenate(x, w, "
    "x), dimensions={1}\n",
    0, N);
  V("  x = f64[2,3] parameter(0)\n  ROOT y = f64[2,3] reverse(x), dimensions={0,1}\n", 1);
  /* iota and constants stay unbatched until they meet a batched value */
  V("  x = f64[4] parameter(0)  i = s32[4] iota(), iota_dimension=0  f = f64[4] convert(i)\n"
    "  c = f64[4] constant({1, 2, 3, 4})  g = f64[4] add(f, c)  h = f64[4] multiply(g, x)\n"
    "  ROOT t = (f64[4], f64[4]) tuple(g, h)\n",
    0);
}
END_TEST

START_TEST(test_dot) {
  const char *mm =
      "  x = f64[2,3] parameter(0)  w = f64[3,4] parameter(1)\n"
      "  ROOT y = f64[2,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n";
  V(mm, 0, 0);
  V(mm, 0, N);
  V(mm, N, 1);
  V(mm, 2, 2);
  const char *bd = "  x = f64[3,2,5] parameter(0)  w = f64[4,5,3] parameter(1)\n"
                   "  ROOT y = f64[5,2,4] dot(x, w), lhs_batch_dims={2}, rhs_batch_dims={1}, "
                   "lhs_contracting_dims={0}, rhs_contracting_dims={2}\n";
  V(bd, 1, N);
  V(bd, N, 3);
  V(bd, 0, 0);
}
END_TEST

START_TEST(test_reductions) {
  const char *r = "  x = f64[3,4] parameter(0)  z = f64[] parameter(1)\n"
                  "  ROOT y = f64[4] reduce(x, z), dimensions={0}, to_apply=add\n";
  V(r, 0, N);
  V(r, 2, N);
  V(r, N, 0); /* a batched init */
  V(r, 1, 0);
  V("  x = f64[3,4] parameter(0)  z = f64[] constant(-inf)\n  ROOT y = f64[3] reduce(x, z), "
    "dimensions={1}, to_apply=mx\n",
    1);
  V("  x = f64[3,4] parameter(0)  z = f64[] parameter(1)\n  ROOT y = f64[3] reduce(x, z), "
    "dimensions={1}, to_apply=mx\n",
    0, 0);
  V("  x = f64[7] parameter(0)  z = f64[] constant(0)\n"
    "  ROOT y = f64[4] reduce-window(x, z), window={size=3 stride=2 pad=1_1}, to_apply=add\n",
    1);
  V("  x = f64[6,4] parameter(0)  z = f64[] parameter(1)\n"
    "  ROOT y = f64[3,3] reduce-window(x, z), window={size=2x2 stride=2x1}, to_apply=mx\n",
    0, 0);
  V("  x = f64[6] parameter(0)  s = f64[3] parameter(1)  z = f64[] constant(0)\n"
    "  ROOT y = f64[6] select-and-scatter(x, s, z), window={size=2 stride=2}, select=ge, "
    "scatter=add\n",
    0, N);
  V("  x = f64[6] parameter(0)  s = f64[3] parameter(1)  z = f64[] constant(0)\n"
    "  ROOT y = f64[6] select-and-scatter(x, s, z), window={size=2 stride=2}, select=ge, "
    "scatter=add\n",
    N, 0);
  V("  x = f64[5] parameter(0)  k = s32[5] iota(), iota_dimension=0\n"
    "  ROOT s = (f64[5], s32[5]) sort(x, k), dimensions={0}, to_apply=lt2\n"
    "}\nlt2 { a = f64[] parameter(0)  b = f64[] parameter(1)  c = s32[] parameter(2)  d = s32[] "
    "parameter(3)\n"
    "  ROOT r = pred[] compare(a, b), direction=LT\n",
    1);
  V("  x = f64[4] parameter(0)  y = f64[4] parameter(1)\n  ROOT m = f64[4] map(x, y), "
    "dimensions={0}, to_apply=mx\n",
    0, N);
}
END_TEST

START_TEST(test_indexing) {
  const char *ds = "  x = f64[5,4] parameter(0)  i = s32[] parameter(1)  j = s32[] parameter(2)\n"
                   "  ROOT y = f64[3,2] dynamic-slice(x, i, j), dynamic_slice_sizes={3,2}\n";
  V(ds, 0, N, N);
  V(ds, N, 0, N);
  V(ds, 1, 0, 0);
  const char *dus = "  x = f64[5,4] parameter(0)  u = f64[2,3] parameter(1)  i = s32[] "
                    "parameter(2)  j = s32[] parameter(3)\n"
                    "  ROOT y = f64[5,4] dynamic-update-slice(x, u, i, j)\n";
  V(dus, 0, N, N, N);
  V(dus, N, 0, N, N);
  V(dus, N, N, 0, N);
  V(dus, 1, 2, 0, 0);
  /* starts past the end are clamped the same way batched and not */
  V("  x = f64[5,4] parameter(0)  u = f64[2,3] parameter(1)  i = s32[] parameter(2)  two = s32[] "
    "constant(2)\n"
    "  k = s32[] multiply(i, two)  ROOT y = f64[5,4] dynamic-update-slice(x, u, k, k)\n",
    N, N, 0);
  const char *g = "  x = f64[5,3] parameter(0)  i = s32[4] parameter(1)\n"
                  "  ROOT y = f64[4,3] gather(x, i), offset_dims={1}, collapsed_slice_dims={0}, "
                  "start_index_map={0}, index_vector_dim=1, slice_sizes={1,3}\n";
  V(g, 0, N);
  V(g, N, 0);
  V(g, 2, 1);
  const char *sc =
      "  x = f64[5,3] parameter(0)  i = s32[4,1] parameter(1)  u = f64[4,3] parameter(2)\n"
      "  ROOT y = f64[5,3] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0}, "
      "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add\n";
  V(sc, 0, N, N);
  V(sc, N, 0, N);
  V(sc, N, N, 2);
  V(sc, 1, 1, 0);
}
END_TEST

START_TEST(test_convolution) {
  const char *cv = "  x = f64[2,5,5,3] parameter(0)  k = f64[3,3,3,4] parameter(1)\n"
                   "  ROOT y = f64[2,5,5,4] convolution(x, k), window={size=3x3 pad=1_1x1_1}, "
                   "dim_labels=b01f_01io->b01f\n";
  V(cv, 0, N);
  V(cv, 1, N);
  V(cv, N, 0);
  V(cv, N, 4);
  V(cv, 0, 0);
  const char *gr = "  x = f64[2,4,6] parameter(0)  k = f64[3,2,6] parameter(1)\n"
                   "  ROOT y = f64[2,4,6] convolution(x, k), window={size=3 pad=1_1}, "
                   "dim_labels=b0f_0io->b0f, feature_group_count=3\n";
  V(gr, 0, N);
}
END_TEST

static const char *k_loop =
    "  x = f64[3] parameter(0)  n = s32[] parameter(1)  z = s32[] constant(0)\n"
    "  t = (s32[], s32[], f64[3]) tuple(z, n, x)\n"
    "  l = (s32[], s32[], f64[3]) while(t), condition=cond, body=body\n"
    "  ROOT y = f64[3] get-tuple-element(l), index=2\n"
    "}\n"
    "body { p = (s32[], s32[], f64[3]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
    "  n = s32[] get-tuple-element(p), index=1  x = f64[3] get-tuple-element(p), index=2\n"
    "  one = s32[] constant(1)  i1 = s32[] add(i, one)  s = f64[3] sine(x)  c = f64[] "
    "constant(1.5)\n"
    "  cb = f64[3] broadcast(c), dimensions={}  x1 = f64[3] multiply(s, cb)\n"
    "  ROOT t = (s32[], s32[], f64[3]) tuple(i1, n, x1) }\n"
    "cond { p = (s32[], s32[], f64[3]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
    "  n = s32[] get-tuple-element(p), index=1  ROOT c = pred[] compare(i, n), direction=LT \n";

START_TEST(test_while) {
  V(k_loop, 0, N); /* batched state, shared trip count */
  V(k_loop, N, 0); /* a batched trip count: the predicate is batched */
  V(k_loop, 1, 0);
}
END_TEST

START_TEST(test_conditional_and_call) {
  const char *cd =
      "  p = s32[] parameter(0)  x = f64[3] parameter(1)  y = f64[] parameter(2)  one = s32[] "
      "constant(1)\n"
      "  c = pred[] compare(p, one), direction=LT  t = (f64[3], f64[]) tuple(x, y)\n"
      "  ROOT r = f64[3] conditional(c, x, t), true_computation=tb, false_computation=fb\n"
      "}\n"
      "tb { x = f64[3] parameter(0)  ROOT s = f64[3] sine(x) }\n"
      "fb { x = (f64[3], f64[]) parameter(0)  a = f64[3] get-tuple-element(x), index=0\n"
      "  b = f64[] get-tuple-element(x), index=1  bb = f64[3] broadcast(b), dimensions={}\n"
      "  ROOT m = f64[3] multiply(a, bb) \n";
  V(cd, N, 0, N);
  V(cd, N, N, 0);
  V(cd, 0, N, N); /* a batched predicate: both branches, selected */
  V(cd, 0, 1, 0);
  const char *ix = "  i = s32[] parameter(0)  x = f64[2] parameter(1)  two = s32[] constant(2)  k "
                   "= s32[] multiply(i, two)\n"
                   "  m = s32[] constant(1)  j = s32[] subtract(k, m)\n"
                   "  ROOT y = f64[2] conditional(j, x, x, x), branch_computations={b0, b1, b2}\n"
                   "}\n"
                   "b0 { x = f64[2] parameter(0)  ROOT s = f64[2] exponential(x) }\n"
                   "b1 { x = f64[2] parameter(0)  ROOT s = f64[2] multiply(x, x) }\n"
                   "b2 { x = f64[2] parameter(0)  ROOT s = f64[2] negate(x) \n";
  V(ix, 0, N); /* indices -1, 1, 3: out of range runs the last branch */
  V(ix, 0, 0);
  const char *cl = "  x = f64[3] parameter(0)  y = f64[3] parameter(1)  c = (f64[3], f64[3]) "
                   "call(x, y), to_apply=f\n"
                   "  ROOT d = f64[3] get-tuple-element(c), index=1\n"
                   "}\n"
                   "f { a = f64[3] parameter(0)  b = f64[3] parameter(1)  t = f64[3] tanh(a)\n"
                   "  m = f64[3] multiply(t, b)  ROOT r = (f64[3], f64[3]) tuple(a, m) \n";
  V(cl, 0, N);
  V(cl, N, 0);
}
END_TEST

START_TEST(test_infer_sizes_and_errors) {
  const char *text =
      "HloModule m\nENTRY main { x = f64[2] parameter(0)  a = f64[] parameter(1)\n"
      "  ab = f64[2] broadcast(a), dimensions={}  ROOT y = f64[2] multiply(x, ab) }\n";
  kiln_transform t[2];
  kiln_status st;
  kiln_arena *ar = kiln_arena_create();
  kiln_shape s0, s1;
  int64_t d0[] = {2, 7, 5}, d1[] = {7, 5};
  kiln_shape_make_array(ar, &s0, KILN_F64, d0, 3);
  kiln_shape_make_array(ar, &s1, KILN_F64, d1, 2);
  const kiln_shape *args[] = {&s0, &s1};
  /* [vmap:in_axes=1,0 (inner), vmap:in_axes=2,1 (outer)]: outer takes dim 2
   * of x (5), inner then dim 1 of what is left (7) */
  ck_assert_int_eq(kiln_transform_parse("vmap:in_axes=1,0", &t[0], NULL), 0);
  ck_assert_int_eq(kiln_transform_parse("vmap:in_axes=2,1", &t[1], NULL), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_transforms_infer_sizes(t, 2, args, 2, &st), 0);
  ck_assert_int_eq(t[1].axis_size, 5);
  ck_assert_int_eq(t[0].axis_size, 7);
  kiln_module *m = tx_parse(text);
  ck_assert_int_eq(kiln_transforms_apply(m, t, 2, &st), 0);
  char *sig = tx_signature(m);
  ck_assert_str_eq(sig, "(f64[2,7,5], f64[7,5]) -> f64[5,7,2]");
  free(sig);
  kiln_module_destroy(m);
  ck_assert_int_eq(kiln_transform_parse("vmap:in_axes=0,none,size=3", &t[0], NULL), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_transforms_infer_sizes(t, 1, args, 2, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "vmap: argument 0 has batch size 2 but the transform says size=3");
  kiln_arena_destroy(ar);

  tx_expect_fail(text, "vmap:in_axes=0", KILN_EINVAL,
                 "vmap: the batch size is not known (give size=N, or arguments to infer it from)");
  tx_expect_fail(text, "vmap:in_axes=0,0,0,size=2", KILN_EINVAL,
                 "vmap: in_axes has 3 entries but ENTRY main takes 2 parameters");
  tx_expect_fail(text, "vmap:in_axes=none,none,size=2", KILN_EINVAL,
                 "vmap: no parameter is batched (in_axes are all none)");
  tx_expect_fail(
      text, "vmap:in_axes=2,size=2", KILN_EINVAL,
      "vmap: in_axes 2 is out of range for parameter 0 (rank 2 with the batch dimension)");
  tx_expect_fail(
      text, "vmap:in_axes=0,none,out_axes=none,size=2", KILN_EINVAL,
      "vmap: output 0 depends on a batched input; out_axes none needs an unbatched output");
  const char *cc =
      "HloModule m\nENTRY main { x = f64[3] parameter(0)\n"
      "  c = f64[3] custom-call(x), custom_call_target=\"foo\"  ROOT y = f64[3] sine(c) }\n";
  tx_expect_fail(cc, "vmap:size=2", KILN_EUNIMPL,
                 "vmap: custom-call target \"foo\" (main/c) has no batching rule: its body is "
                 "opaque to the transforms");
  const char *rng = "HloModule m\nENTRY main { a = f64[] parameter(0)  b = f64[] constant(1)\n"
                    "  ROOT r = f64[3] rng(a, b), distribution=rng_uniform }\n";
  tx_expect_fail(rng, "vmap:size=2", KILN_EUNIMPL,
                 "vmap: op rng (main/r) cannot take a batched operand");
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("transform_vmap");
  TCase *tc = tcase_create("vmap");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_elementwise);
  tcase_add_test(tc, test_out_axes);
  tcase_add_test(tc, test_shape_ops);
  tcase_add_test(tc, test_dot);
  tcase_add_test(tc, test_reductions);
  tcase_add_test(tc, test_indexing);
  tcase_add_test(tc, test_convolution);
  tcase_add_test(tc, test_while);
  tcase_add_test(tc, test_conditional_and_call);
  tcase_add_test(tc, test_infer_sizes_and_errors);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
