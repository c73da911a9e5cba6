/* Differentiation (grad, vjp, jvp) per op: gradients and forward
 * derivatives against central finite differences in f64, vjp against jvp by
 * the dot-product identity, JAX's values at the edge points, and the error
 * messages for what cannot be differentiated. */
#include "tests/unit/test_transform_harness.h"

#define ADD_F64 "add { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT s = f64[] add(a, b) }\n"
#define MAX_F64 \
  "mx { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT s = f64[] maximum(a, b) }\n"
#define MIN_F64 \
  "mn { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT s = f64[] minimum(a, b) }\n"
#define MUL_F64 \
  "ml { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT s = f64[] multiply(a, b) }\n"
#define REP_F64 "rep { a = f64[] parameter(0)  ROOT b = f64[] parameter(1) }\n"
#define GE_F64 \
  "ge { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT c = pred[] compare(a, b), " \
  "direction=GE }\n"
/* argmax as jnp.argmax exports it: the value picks b unless a is greater
 * (or NaN), the index takes the smaller one at ties */
#define ARGMAX_JAX \
  "amax { a = f64[] parameter(0)  i = s32[] parameter(1)  b = f64[] parameter(2)  j = s32[] " \
  "parameter(3)\n" \
  "  gt = pred[] compare(a, b), direction=GT  nn = pred[] compare(a, a), direction=NE  g = " \
  "pred[] or(gt, nn)\n" \
  "  eq = pred[] compare(a, b), direction=EQ  lt = pred[] compare(i, j), direction=LT  t = " \
  "pred[] and(eq, lt)\n" \
  "  pk = pred[] or(g, t)  v = f64[] select(g, a, b)  k = s32[] select(pk, i, j)\n" \
  "  ROOT r = (f64[], s32[]) tuple(v, k) }\n"
/* argmin whose value and index follow one pick (the first minimum) */
#define ARGMIN_F64 \
  "amin { a = f64[] parameter(0)  i = s32[] parameter(1)  b = f64[] parameter(2)  j = s32[] " \
  "parameter(3)\n" \
  "  lt = pred[] compare(a, b), direction=LT  eq = pred[] compare(a, b), direction=EQ\n" \
  "  il = pred[] compare(i, j), direction=LT  t = pred[] and(eq, il)  pk = pred[] or(lt, t)\n" \
  "  v = f64[] select(pk, a, b)  k = s32[] select(pk, i, j)  ROOT r = (f64[], s32[]) tuple(v, k) " \
  "}\n"
/* a sum and a max in one reduce, with a constant inside the reducer */
#define SUMMAX_F64 \
  "smx { a = f64[] parameter(0)  c = f64[] parameter(1)  b = f64[] parameter(2)  d = f64[] " \
  "parameter(3)\n" \
  "  h = f64[] constant(0.5)  s = f64[] add(a, b)  m = f64[] maximum(c, d)  hm = f64[] " \
  "multiply(m, h)\n" \
  "  m2 = f64[] add(hm, hm)  ROOT r = (f64[], f64[]) tuple(s, m2) }\n"
#define HELPERS ADD_F64 MAX_F64 MIN_F64 MUL_F64 REP_F64 GE_F64 ARGMAX_JAX ARGMIN_F64 SUMMAX_F64

/* sum(op(x)) over f64[2,3], and op(x) itself, for a unary op. */
static void unary_case(const char *op, double lo, double hi) {
  char scalar[1024], vec[512];
  snprintf(scalar, sizeof scalar,
           "HloModule m\n" ADD_F64
           "ENTRY main { x = f64[2,3] parameter(0)  y = f64[2,3] %s(x)  z = f64[] constant(0)\n"
           "  ROOT r = f64[] reduce(y, z), dimensions={0,1}, to_apply=add }\n",
           op);
  snprintf(vec, sizeof vec,
           "HloModule m\nENTRY main { x = f64[2,3] parameter(0)  ROOT y = f64[2,3] %s(x) }\n", op);
  tx_check_grad(scalar, "grad", 11, lo, hi);
  tx_check_jvp(vec, 12, lo, hi);
  tx_check_vjp_dot(vec, 13, lo, hi);
}

START_TEST(test_unary_ops) {
  static const struct {
    const char *op;
    double lo, hi;
  } ops[] = {
      {"abs", 0.1, 1},
      {"abs", -1, -0.1},
      {"cbrt", 0.2, 2},
      {"cosine", -2, 2},
      {"erf", -1, 1},
      {"exponential", -1, 1},
      {"exponential-minus-one", -1, 1},
      {"log", 0.2, 2},
      {"log-plus-one", -0.5, 1},
      {"logistic", -2, 2},
      {"negate", -1, 1},
      {"rsqrt", 0.2, 2},
      {"sqrt", 0.2, 2},
      {"sine", -2, 2},
      {"tan", -1, 1},
      {"tanh", -2, 2},
      {"copy", -1, 1},
      {"floor", 0.1, 0.9},
      {"ceil", 0.1, 0.9},
      {"sign", 0.1, 1},
      {"round-nearest-afz", 0.1, 0.4},
      {"round-nearest-even", 0.6, 0.9},
  };
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    unary_case(ops[i].op, ops[i].lo, ops[i].hi);
}
END_TEST

static void binary_case(const char *op, double lo, double hi) {
  char scalar[1024], vec[512];
  snprintf(scalar, sizeof scalar,
           "HloModule m\n" ADD_F64
           "ENTRY main { x = f64[4] parameter(0)  y = f64[4] parameter(1)  w = f64[4] %s(x, y)\n"
           "  z = f64[] constant(0)  ROOT r = f64[] reduce(w, z), dimensions={0}, to_apply=add }\n",
           op);
  snprintf(vec, sizeof vec,
           "HloModule m\nENTRY main { x = f64[4] parameter(0)  y = f64[4] parameter(1)  ROOT w = "
           "f64[4] %s(x, y) }\n",
           op);
  tx_check_grad(scalar, "grad:wrt=0,1", 21, lo, hi);
  tx_check_jvp(vec, 22, lo, hi);
  tx_check_vjp_dot(vec, 23, lo, hi);
}

START_TEST(test_binary_ops) {
  static const struct {
    const char *op;
    double lo, hi;
  } ops[] = {
      {"add", -1, 1},     {"subtract", -1, 1}, {"multiply", -1, 1},
      {"divide", 0.5, 2}, {"maximum", -1, 1},  {"minimum", -1, 1},
      {"power", 0.5, 2},  {"atan2", 0.2, 1},   {"remainder", 0.3, 2},
  };
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    binary_case(ops[i].op, ops[i].lo, ops[i].hi);
}
END_TEST

/* Runs grad(text) on the literal arguments and compares the printed result. */
static void expect_grad(const char *text, const char *spec, const char *want, const char *a0,
                        const char *a1, const char *a2) {
  kiln_module *g = tx_apply(text, spec);
  const char *at[3] = {a0, a1, a2};
  kiln_literal *args[3] = {NULL};
  uint32_t n = 0;
  for (; n < 3 && at[n]; n++) {
    kiln_status st;
    kiln_status_clear(&st);
    ck_assert_msg(kiln_literal_parse_text(at[n], strlen(at[n]), &args[n], &st) == 0, "%s: %s",
                  at[n], st.msg);
  }
  kiln_literal *r = tx_run(g, args, n);
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_literal_print(&b, r, true);
  /* NaN's sign is the platform's business; JAX prints nan */
  char got[512];
  size_t o = 0;
  for (const char *p = kiln_sbuf_str(&b); *p && o + 1 < sizeof got; p++)
    if (!(p[0] == '-' && strncmp(p + 1, "nan", 3) == 0)) got[o++] = *p;
  got[o] = 0;
  ck_assert_str_eq(got, want);
  kiln_sbuf_free(&b);
  kiln_literal_destroy(r);
  for (uint32_t i = 0; i < n; i++) kiln_literal_destroy(args[i]);
  kiln_module_destroy(g);
}

START_TEST(test_edge_points_like_jax) {
  const char *absm = "HloModule m\nENTRY e { x = f64[] parameter(0)  ROOT a = f64[] abs(x) }\n";
  expect_grad(absm, "grad", "(f64[], f64[]) (0, 1)", "f64[] 0", NULL, NULL);
  expect_grad(absm, "grad", "(f64[], f64[]) (0, 1)", "f64[] -0", NULL, NULL);
  const char *maxm = "HloModule m\nENTRY e { x = f64[] parameter(0)  y = f64[] parameter(1)  ROOT "
                     "a = f64[] maximum(x, y) }\n";
  expect_grad(maxm, "grad:wrt=0,1", "(f64[], f64[], f64[]) (1, 0.5, 0.5)", "f64[] 1", "f64[] 1",
              NULL);
  expect_grad(maxm, "grad:wrt=0,1", "(f64[], f64[], f64[]) (2, 0, 1)", "f64[] 1", "f64[] 2", NULL);
  const char *minm = "HloModule m\nENTRY e { x = f64[] parameter(0)  y = f64[] parameter(1)  ROOT "
                     "a = f64[] minimum(x, y) }\n";
  expect_grad(minm, "grad:wrt=0,1", "(f64[], f64[], f64[]) (1, 0.5, 0.5)", "f64[] 1", "f64[] 1",
              NULL);
  const char *sq = "HloModule m\nENTRY e { x = f64[] parameter(0)  ROOT a = f64[] sqrt(x) }\n";
  expect_grad(sq, "grad", "(f64[], f64[]) (0, inf)", "f64[] 0", NULL, NULL);
  const char *pw = "HloModule m\nENTRY e { x = f64[] parameter(0)  y = f64[] parameter(1)  ROOT a "
                   "= f64[] power(x, y) }\n";
  expect_grad(pw, "grad:wrt=0,1", "(f64[], f64[], f64[]) (0, 0, 0)", "f64[] 0", "f64[] 2", NULL);
  expect_grad(pw, "grad:wrt=0,1", "(f64[], f64[], f64[]) (0, 1, 0)", "f64[] 0", "f64[] 1", NULL);
  /* d/dx at x = y = 0 is 0 * 0^-1: NaN, as in JAX */
  kiln_module *pg = tx_apply(pw, "grad:wrt=0,1");
  kiln_literal *pa[2] = {tx_lit_dims(KILN_F64, NULL, 0), tx_lit_dims(KILN_F64, NULL, 0)};
  kiln_literal *pr = tx_run(pg, pa, 2);
  ck_assert(isnan(kiln_literal_get_f64(pr->elems[1], 0)));
  ck_assert(kiln_literal_get_f64(pr->elems[2], 0) == 0);
  kiln_literal_destroy(pr);
  kiln_literal_destroy(pa[0]);
  kiln_literal_destroy(pa[1]);
  kiln_module_destroy(pg);
  const char *cl = "HloModule m\nENTRY e { lo = f64[] parameter(0)  x = f64[] parameter(1)  hi = "
                   "f64[] parameter(2)\n"
                   "  ROOT c = f64[] clamp(lo, x, hi) }\n";
  expect_grad(cl, "grad:wrt=0,1,2", "(f64[], f64[], f64[], f64[]) (1, 0, 0, 0)", "f64[] 1",
              "f64[] 1", "f64[] 2");
  expect_grad(cl, "grad:wrt=0,1,2", "(f64[], f64[], f64[], f64[]) (2, 0, 0, 0)", "f64[] 1",
              "f64[] 2", "f64[] 2");
  expect_grad(cl, "grad:wrt=0,1,2", "(f64[], f64[], f64[], f64[]) (1.5, 0, 1, 0)", "f64[] 1",
              "f64[] 1.5", "f64[] 2");
  expect_grad(cl, "grad:wrt=0,1,2", "(f64[], f64[], f64[], f64[]) (1, 1, 0, 0)", "f64[] 1",
              "f64[] 0.5", "f64[] 2");
  expect_grad(cl, "grad:wrt=0,1,2", "(f64[], f64[], f64[], f64[]) (2, 0, 0, 1)", "f64[] 1",
              "f64[] 2.5", "f64[] 2");
  const char *rmax =
      "HloModule m\n" MAX_F64 "ENTRY e { x = f64[4] parameter(0)  z = f64[] constant(-inf)\n"
      "  ROOT r = f64[] reduce(x, z), dimensions={0}, to_apply=mx }\n";
  expect_grad(rmax, "grad", "(f64[], f64[4]) (3, {0, 0.5, 0.5, 0})", "f64[4]{0} {1, 3, 3, 2}", NULL,
              NULL);
  const char *rmin =
      "HloModule m\n" MIN_F64 "ENTRY e { x = f64[3] parameter(0)  z = f64[] constant(inf)\n"
      "  ROOT r = f64[] reduce(x, z), dimensions={0}, to_apply=mn }\n";
  expect_grad(rmin, "grad", "(f64[], f64[3]) (1, {0.5, 0.5, 0})", "f64[3]{0} {1, 1, 3}", NULL,
              NULL);
  const char *prod =
      "HloModule m\n" MUL_F64 "ENTRY e { x = f64[3] parameter(0)  z = f64[] constant(1)\n"
      "  ROOT r = f64[] reduce(x, z), dimensions={0}, to_apply=ml }\n";
  expect_grad(prod, "grad", "(f64[], f64[3]) (0, {0, 3, 0})", "f64[3]{0} {1, 0, 3}", NULL, NULL);
  expect_grad(prod, "grad", "(f64[], f64[3]) (0, {0, 0, 0})", "f64[3]{0} {1, 0, 0}", NULL, NULL);
  expect_grad(prod, "grad", "(f64[], f64[3]) (24, {12, 8, 6})", "f64[3]{0} {2, 3, 4}", NULL, NULL);
  const char *rw =
      "HloModule m\n" MAX_F64 ADD_F64
      "ENTRY e { x = f64[4] parameter(0)  z = f64[] constant(-inf)  zero = f64[] constant(0)\n"
      "  w = f64[3] reduce-window(x, z), window={size=2}, to_apply=mx\n"
      "  ROOT r = f64[] reduce(w, zero), dimensions={0}, to_apply=add }\n";
  expect_grad(rw, "grad", "(f64[], f64[4]) (9, {0, 2, 1, 0})", "f64[4]{0} {1, 3, 3, 2}", NULL,
              NULL);
  const char *sel = "HloModule m\nENTRY e { p = pred[] parameter(0)  a = f64[] parameter(1)  b = "
                    "f64[] parameter(2)\n"
                    "  ROOT s = f64[] select(p, a, b) }\n";
  expect_grad(sel, "grad:wrt=1,2", "(f64[], f64[], f64[]) (1, 1, 0)", "pred[] true", "f64[] 1",
              "f64[] 2");
  const char *at = "HloModule m\nENTRY e { x = f64[] parameter(0)  y = f64[] parameter(1)  ROOT a "
                   "= f64[] atan2(x, y) }\n";
  expect_grad(at, "grad:wrt=0,1", "(f64[], f64[], f64[]) (0, nan, nan)", "f64[] 0", "f64[] 0",
              NULL);
}
END_TEST

/* The scalar version of a case sums f(...) weighted by a ramp along the
 * first dimension, so that every output element counts differently. */
static void shape_case(const char *body, const char *out_shape, const char *dims_attr,
                       const char *wrt) {
  char scalar[4096], vec[4096], inner[2048];
  /* the scalar version: the body's root becomes an ordinary instruction */
  snprintf(inner, sizeof inner, "%s", body);
  char *root = strstr(inner, "ROOT ");
  ck_assert_ptr_nonnull(root);
  memset(root, ' ', 5);
  snprintf(
      scalar, sizeof scalar,
      "HloModule m\n" HELPERS "ENTRY main {\n%s"
      "  q.wt = s32%s iota(), iota_dimension=0  q.wf = f64%s convert(q.wt)\n"
      "  q.one = f64[] constant(1)  q.ob = f64%s broadcast(q.one), dimensions={}\n"
      "  q.wp = f64%s add(q.wf, q.ob)  q.prod = f64%s multiply(y, q.wp)  q.z = f64[] constant(0)\n"
      "  ROOT q.r = f64[] reduce(q.prod, q.z), dimensions=%s, to_apply=add }\n",
      inner, out_shape, out_shape, out_shape, out_shape, out_shape, dims_attr);
  snprintf(vec, sizeof vec, "HloModule m\n" HELPERS "ENTRY main {\n%s}\n", body);
  tx_case = body;
  tx_check_grad(scalar, wrt, 31, -1, 1);
  tx_check_jvp(vec, 32, -1, 1);
  tx_check_vjp_dot(vec, 33, -1, 1);
}

START_TEST(test_shape_ops) {
  shape_case("  x = f64[3] parameter(0)\n  ROOT y = f64[2,3,4] broadcast(x), dimensions={1}\n",
             "[2,3,4]", "{0,1,2}", "grad");
  shape_case("  x = f64[3,2] parameter(0)\n  ROOT y = f64[2,4,3] broadcast(x), dimensions={2,0}\n",
             "[2,4,3]", "{0,1,2}", "grad");
  shape_case("  x = f64[2,3] parameter(0)\n  ROOT y = f64[3,2] reshape(x)\n", "[3,2]", "{0,1}",
             "grad");
  shape_case(
      "  x = f64[2,3,4] parameter(0)\n  ROOT y = f64[4,2,3] transpose(x), dimensions={2,0,1}\n",
      "[4,2,3]", "{0,1,2}", "grad");
  shape_case(
      "  x = f64[7,5] parameter(0)\n  ROOT y = f64[3,2] slice(x), slice={[1:6:2], [0:4:3]}\n",
      "[3,2]", "{0,1}", "grad");
  shape_case("  x = f64[3,2] parameter(0)  v = f64[] parameter(1)\n  ROOT y = f64[8,2] pad(x, v), "
             "padding=1_2_1x-1_1\n",
             "[8,2]", "{0,1}", "grad:wrt=0,1");
  shape_case("  x = f64[2,3] parameter(0)  w = f64[2,1] parameter(1)\n  ROOT y = f64[2,7] "
             "concatenate(x, w, x), dimensions={1}\n",
             "[2,7]", "{0,1}", "grad:wrt=0,1");
  shape_case("  x = f64[2,3] parameter(0)\n  ROOT y = f64[2,3] reverse(x), dimensions={0,1}\n",
             "[2,3]", "{0,1}", "grad");
  shape_case("  x = f64[5,4] parameter(0)  i = s32[] constant(3)  j = s32[] constant(1)\n"
             "  ROOT y = f64[3,2] dynamic-slice(x, i, j), dynamic_slice_sizes={3,2}\n",
             "[3,2]", "{0,1}", "grad");
  shape_case("  x = f64[5,4] parameter(0)  u = f64[2,2] parameter(1)  i = s32[] constant(4)  j = "
             "s32[] constant(1)\n"
             "  ROOT y = f64[5,4] dynamic-update-slice(x, u, i, j)\n",
             "[5,4]", "{0,1}", "grad:wrt=0,1");
  shape_case(
      "  x = f64[2,3] parameter(0)  k = s32[] constant(2)  kb = s32[2,3] broadcast(k), "
      "dimensions={}\n"
      "  ii = s32[2,3] iota(), iota_dimension=1  p = pred[2,3] compare(ii, kb), direction=LT\n"
      "  n = f64[2,3] negate(x)\n  ROOT y = f64[2,3] select(p, x, n)\n",
      "[2,3]", "{0,1}", "grad");
  shape_case("  x = f64[2,3] parameter(0)  lo = f64[] parameter(1)  hi = f64[] constant(0.5)\n"
             "  ROOT y = f64[2,3] clamp(lo, x, hi)\n",
             "[2,3]", "{0,1}", "grad:wrt=0,1");
  /* through f32: finite differences in f64 would see f32 rounding */
  tx_dot_rtol = 1e-6;
  tx_check_vjp_dot("HloModule m\nENTRY main {  x = f64[2,3] parameter(0)  c = f32[2,3] convert(x)\n"
                   "  d = f32[2,3] multiply(c, c)  ROOT y = f64[2,3] convert(d) }\n",
                   34, -1, 1);
}
END_TEST

START_TEST(test_dot_ops) {
  /* a matmul's gradients are dots whose results are already in the
   * parameters' order: dx = ct . w^T and dw = x^T . ct, no transposes for
   * the compiler to materialize */
  const char *mm =
      "HloModule m\nENTRY main { x = f32[4,3] parameter(0)  w = f32[3,5] parameter(1)\n"
      "  ROOT y = f32[4,5] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0} }\n";
  kiln_module *v = tx_apply(mm, "vjp");
  char *text = kiln_module_print(v, NULL);
  ck_assert_msg(strstr(text, "transpose(") == NULL, "%s", text);
  ck_assert_msg(
      strstr(
          text,
          "f32[4,3] dot(%cotangent.6, %w.4), lhs_contracting_dims={1}, rhs_contracting_dims={1}") !=
          NULL,
      "%s", text);
  ck_assert_msg(
      strstr(
          text,
          "f32[3,5] dot(%x.3, %cotangent.6), lhs_contracting_dims={0}, rhs_contracting_dims={0}") !=
          NULL,
      "%s", text);
  kiln_free(text);
  kiln_module_destroy(v);
  shape_case("  x = f64[2,3] parameter(0)  w = f64[3,4] parameter(1)\n"
             "  ROOT y = f64[2,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n",
             "[2,4]", "{0,1}", "grad:wrt=0,1");
  shape_case("  x = f64[3,2,5] parameter(0)  w = f64[4,5,3] parameter(1)\n"
             "  ROOT y = f64[5,2,4] dot(x, w), lhs_batch_dims={2}, rhs_batch_dims={1}, "
             "lhs_contracting_dims={0}, rhs_contracting_dims={2}\n",
             "[5,2,4]", "{0,1,2}", "grad:wrt=0,1");
  shape_case(
      "  x = f64[2,3,4] parameter(0)  w = f64[4,3,2] parameter(1)\n"
      "  ROOT y = f64[2,2] dot(x, w), lhs_contracting_dims={1,2}, rhs_contracting_dims={1,0}\n",
      "[2,2]", "{0,1}", "grad:wrt=0,1");
  shape_case("  x = f64[3] parameter(0)  w = f64[3] parameter(1)\n"
             "  y0 = f64[] dot(x, w), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
             "  ROOT y = f64[1] reshape(y0)\n",
             "[1]", "{0}", "grad:wrt=0,1");
  shape_case("  x = f64[2] parameter(0)  w = f64[3] parameter(1)\n"
             "  ROOT y = f64[2,3] dot(x, w)\n",
             "[2,3]", "{0,1}", "grad:wrt=0,1");
}
END_TEST

START_TEST(test_convolution) {
  shape_case("  x = f64[2,5,5,3] parameter(0)  k = f64[3,3,3,4] parameter(1)\n"
             "  ROOT y = f64[2,5,5,4] convolution(x, k), window={size=3x3 pad=1_1x1_1}, "
             "dim_labels=b01f_01io->b01f\n",
             "[2,5,5,4]", "{0,1,2,3}", "grad:wrt=0,1");
  shape_case("  x = f64[2,3,7,6] parameter(0)  k = f64[4,3,2,3] parameter(1)\n"
             "  ROOT y = f64[2,4,4,2] convolution(x, k), window={size=2x3 stride=2x1 pad=0_1x0_0 "
             "rhs_dilate=1x2}, dim_labels=bf01_oi01->bf01\n",
             "[2,4,4,2]", "{0,1,2,3}", "grad:wrt=0,1");
  shape_case("  x = f64[1,4,3] parameter(0)  k = f64[2,3,2] parameter(1)\n"
             "  ROOT y = f64[1,8,2] convolution(x, k), window={size=2 pad=1_1 lhs_dilate=2}, "
             "dim_labels=b0f_0io->b0f\n",
             "[1,8,2]", "{0,1,2}", "grad:wrt=0,1");
  shape_case("  x = f64[2,4,6] parameter(0)  k = f64[3,2,6] parameter(1)\n"
             "  ROOT y = f64[2,4,6] convolution(x, k), window={size=3 pad=1_1}, "
             "dim_labels=b0f_0io->b0f, feature_group_count=3\n",
             "[2,4,6]", "{0,1,2}", "grad:wrt=0,1");
  shape_case("  x = f64[5,2,3] parameter(0)  k = f64[4,2,2] parameter(1)\n"
             "  ROOT y = f64[4,3,3] convolution(x, k), window={size=2 stride=2 pad=1_0}, "
             "dim_labels=0fb_o0i->f0b\n",
             "[4,3,3]", "{0,1,2}", "grad:wrt=0,1");
}
END_TEST

START_TEST(test_reductions) {
  shape_case("  x = f64[3,4] parameter(0)  z = f64[] constant(0)\n"
             "  ROOT y = f64[4] reduce(x, z), dimensions={0}, to_apply=add\n",
             "[4]", "{0}", "grad");
  shape_case("  x = f64[3,4] parameter(0)  z = f64[] parameter(1)\n"
             "  ROOT y = f64[3] reduce(x, z), dimensions={1}, to_apply=add\n",
             "[3]", "{0}", "grad:wrt=0,1");
  shape_case("  x = f64[3,4,2] parameter(0)  z = f64[] constant(-inf)\n"
             "  ROOT y = f64[4] reduce(x, z), dimensions={0,2}, to_apply=mx\n",
             "[4]", "{0}", "grad");
  shape_case("  x = f64[3,4] parameter(0)  z = f64[] constant(1)  one = f64[] constant(1)\n"
             "  ob = f64[3,4] broadcast(one), dimensions={}  xx = f64[3,4] add(x, ob)\n"
             "  ROOT y = f64[4] reduce(xx, z), dimensions={0}, to_apply=ml\n",
             "[4]", "{0}", "grad");
  shape_case(
      "  x = f64[7] parameter(0)  z = f64[] constant(0)\n"
      "  ROOT y = f64[4] reduce-window(x, z), window={size=3 stride=2 pad=1_1}, to_apply=add\n",
      "[4]", "{0}", "grad");
  shape_case("  x = f64[4,5] parameter(0)  z = f64[] constant(0)\n"
             "  ROOT y = f64[2,3] reduce-window(x, z), window={size=2x2 stride=1x2 pad=0_0x0_1 "
             "rhs_dilate=2x1}, to_apply=add\n",
             "[2,3]", "{0,1}", "grad");
  shape_case(
      "  x = f64[4] parameter(0)  z = f64[] constant(0)\n"
      "  ROOT y = f64[9] reduce-window(x, z), window={size=2 pad=1_2 lhs_dilate=2}, to_apply=add\n",
      "[9]", "{0}", "grad");
  shape_case("  x = f64[6,4] parameter(0)  z = f64[] constant(-inf)\n"
             "  ROOT y = f64[3,3] reduce-window(x, z), window={size=2x2 stride=2x1}, to_apply=mx\n",
             "[3,3]", "{0,1}", "grad");
  shape_case(
      "  x = f64[5] parameter(0)  z = f64[] constant(-inf)\n"
      "  ROOT y = f64[3] reduce-window(x, z), window={size=3 stride=2 pad=1_1}, to_apply=mx\n",
      "[3]", "{0}", "grad");
  /* max/min windows with dilations (holes and padding never win) */
  shape_case(
      "  x = f64[7] parameter(0)  z = f64[] constant(-inf)\n"
      "  ROOT y = f64[5] reduce-window(x, z), window={size=3 pad=1_1 rhs_dilate=2}, to_apply=mx\n",
      "[5]", "{0}", "grad");
  shape_case(
      "  x = f64[4] parameter(0)  z = f64[] constant(-inf)\n"
      "  ROOT y = f64[6] reduce-window(x, z), window={size=2 pad=0_0 lhs_dilate=2}, to_apply=mx\n",
      "[6]", "{0}", "grad");
  shape_case("  x = f64[4,5] parameter(0)  z = f64[] constant(inf)\n"
             "  ROOT y = f64[4,2] reduce-window(x, z), window={size=2x2 stride=2x1 pad=1_1x0_0 "
             "lhs_dilate=2x1 rhs_dilate=1x3}, to_apply=mn\n",
             "[4,2]", "{0,1}", "grad");
}
END_TEST

START_TEST(test_variadic_reductions) {
  /* the value of jnp.argmax's reduce: its derivative is the picked element's */
  shape_case("  x = f64[3,5] parameter(0)  io = s32[3,5] iota(), iota_dimension=1\n"
             "  ninf = f64[] constant(-inf)  z = s32[] constant(0)\n"
             "  am = (f64[3], s32[3]) reduce(x, io, ninf, z), dimensions={1}, to_apply=amax\n"
             "  ROOT y = f64[3] get-tuple-element(am), index=0\n",
             "[3]", "{0}", "grad");
  /* over two dims of six elements (padded to eight), the init a parameter */
  shape_case("  x = f64[3,4,2] parameter(0)  io = s32[3,4,2] iota(), iota_dimension=0\n"
             "  big = f64[] parameter(1)  z = s32[] constant(0)\n"
             "  am = (f64[4], s32[4]) reduce(x, io, big, z), dimensions={0,2}, to_apply=amin\n"
             "  ROOT y = f64[4] get-tuple-element(am), index=0\n",
             "[4]", "{0}", "grad:wrt=0,1");
  /* two float outputs at once: a sum and a max */
  shape_case(
      "  x = f64[4,3] parameter(0)  w = f64[4,3] parameter(1)  z = f64[] constant(0)\n"
      "  ninf = f64[] constant(-inf)\n"
      "  sm = (f64[3], f64[3]) reduce(x, w, z, ninf), dimensions={0}, to_apply=smx\n"
      "  s = f64[3] get-tuple-element(sm), index=0  m = f64[3] get-tuple-element(sm), index=1\n"
      "  ROOT y = f64[3] multiply(s, m)\n",
      "[3]", "{0}", "grad:wrt=0,1");
  /* a tie: the whole derivative goes to the element the index names */
  const char *tie = "HloModule m\n" ARGMIN_F64
                    "ENTRY e { x = f64[4] parameter(0)  io = s32[4] iota(), iota_dimension=0\n"
                    "  inf = f64[] constant(inf)  z = s32[] constant(0)\n"
                    "  am = (f64[], s32[]) reduce(x, io, inf, z), dimensions={0}, to_apply=amin\n"
                    "  ROOT v = f64[] get-tuple-element(am), index=0 }\n";
  expect_grad(tie, "grad", "(f64[], f64[4]) (1, {0, 1, 0, 0})", "f64[4] {3, 1, 1, 2}", NULL, NULL);
  expect_grad(tie, "grad", "(f64[], f64[4]) (-1, {0, 0, 0, 1})", "f64[4] {3, 1, 1, -1}", NULL,
              NULL);
  /* both outputs, the index among them: it takes (and passes back) nothing */
  const char *both =
      "HloModule m\n" ARGMAX_JAX
      "ENTRY e { x = f64[2,5] parameter(0)  io = s32[2,5] iota(), iota_dimension=1\n"
      "  ninf = f64[] constant(-inf)  z = s32[] constant(0)\n"
      "  ROOT am = (f64[2], s32[2]) reduce(x, io, ninf, z), dimensions={1}, to_apply=amax }\n";
  tx_check_jvp(both, 91, -1, 1);
  tx_check_vjp_dot(both, 92, -1, 1);
  kiln_module *v = tx_apply(both, "vjp");
  char *sig = tx_signature(v);
  ck_assert_str_eq(sig, "(f64[2,5], f64[2], s32[2]) -> (f64[2], s32[2], f64[2,5])");
  free(sig);
  kiln_literal *args[3] = {NULL};
  const char *at[3] = {"f64[2,5] {{0, 4, 1, 4, 2}, {-1, -2, 7, 3, 0}}", "f64[2] {10, 20}",
                       "s32[2] {5, 6}"};
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(kiln_literal_parse_text(at[i], strlen(at[i]), &args[i], NULL), 0);
  kiln_literal *r = tx_run(v, args, 3);
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_literal_print(&b, r, true);
  /* jnp.argmax's reducer takes the value of the later of two tied maxima */
  ck_assert_str_eq(
      kiln_sbuf_str(&b),
      "(f64[2], s32[2], f64[2,5]) ({4, 7}, {1, 2}, {{0, 0, 0, 10, 0}, {0, 0, 20, 0, 0}})");
  kiln_sbuf_free(&b);
  kiln_literal_destroy(r);
  for (int i = 0; i < 3; i++) kiln_literal_destroy(args[i]);
  kiln_module_destroy(v);
}
END_TEST

START_TEST(test_sort_and_topk) {
#define LT_F64 \
  "lt { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT c = pred[] compare(a, b), " \
  "direction=LT }\n"
#define LT_KEYS \
  "ltk { a = f64[] parameter(0)  b = f64[] parameter(1)  c = f64[] parameter(2)  d = f64[] " \
  "parameter(3)\n" \
  "  ROOT r = pred[] compare(a, b), direction=LT }\n"
  const char *one =
      "HloModule m\n" ADD_F64 LT_F64 "ENTRY main { x = f64[3,4] parameter(0)  ROOT y = f64[3,4] "
      "sort(x), dimensions={1}, to_apply=lt }\n";
  tx_check_jvp(one, 101, -1, 1);
  tx_check_vjp_dot(one, 102, -1, 1);
  const char *sone =
      "HloModule m\n" ADD_F64 LT_F64
      "ENTRY main { x = f64[3,4] parameter(0)  y = f64[3,4] sort(x), dimensions={0}, to_apply=lt\n"
      "  w = f64[3,4] iota(), iota_dimension=0  p = f64[3,4] multiply(y, w)  s = f64[3,4] sine(p)\n"
      "  z = f64[] constant(0)  ROOT r = f64[] reduce(s, z), dimensions={0,1}, to_apply=add }\n";
  tx_check_grad(sone, "grad", 103, -1, 1);
  /* values sorted by keys: both move with the keys' permutation */
  const char *kv =
      "HloModule m\n" ADD_F64 LT_KEYS
      "ENTRY main { k = f64[5] parameter(0)  v = f64[5] parameter(1)\n"
      "  ROOT s = (f64[5], f64[5]) sort(k, v), dimensions={0}, is_stable=true, to_apply=ltk }\n";
  tx_check_jvp(kv, 104, -1, 1);
  tx_check_vjp_dot(kv, 105, -1, 1);
  /* the derivative follows the element: x = {3, 1, 2}, weights 1, 2, 3 */
  const char *w =
      "HloModule m\n" ADD_F64 LT_F64
      "ENTRY main { x = f64[3] parameter(0)  y = f64[3] sort(x), dimensions={0}, to_apply=lt\n"
      "  c = f64[3] constant({1, 2, 3})  p = f64[3] multiply(y, c)  z = f64[] constant(0)\n"
      "  ROOT r = f64[] reduce(p, z), dimensions={0}, to_apply=add }\n";
  expect_grad(w, "grad", "(f64[], f64[3]) (14, {3, 1, 2})", "f64[3] {3, 1, 2}", NULL, NULL);
  /* topk: values carry derivatives, indices none */
  const char *tk = "HloModule m\nENTRY main { x = f64[2,5] parameter(0)\n"
                   "  ROOT t = (f64[2,3], s32[2,3]) topk(x), k=3, largest=true }\n";
  tx_check_jvp(tk, 106, -1, 1);
  tx_check_vjp_dot(tk, 107, -1, 1);
  shape_case("  x = f64[2,5] parameter(0)  t = (f64[2,3], s32[2,3]) topk(x), k=3, largest=true\n"
             "  ROOT y = f64[2,3] get-tuple-element(t), index=0\n",
             "[2,3]", "{0,1}", "grad");
}
END_TEST

START_TEST(test_gather_scatter) {
  /* jnp.take / x[idx] along rows, with an out-of-range index (clamped) */
  shape_case("  x = f64[5,3] parameter(0)  i = s32[4] constant({4, 0, 7, 4})\n"
             "  ROOT y = f64[4,3] gather(x, i), offset_dims={1}, collapsed_slice_dims={0}, "
             "start_index_map={0}, index_vector_dim=1, slice_sizes={1,3}\n",
             "[4,3]", "{0,1}", "grad");
  shape_case("  x = f64[4,5] parameter(0)  i = s32[2,2] constant({{1, 3}, {2, 0}})\n"
             "  ROOT y = f64[2,2,2] gather(x, i), offset_dims={1,2}, collapsed_slice_dims={}, "
             "start_index_map={0,1}, index_vector_dim=1, slice_sizes={2,2}\n",
             "[2,2,2]", "{0,1,2}", "grad");
  /* x.at[idx].add(u) with a repeated and an out-of-range index */
  shape_case(
      "  x = f64[5,3] parameter(0)  i = s32[4,1] constant({{1}, {3}, {1}, {9}})  u = f64[4,3] "
      "parameter(1)\n"
      "  ROOT y = f64[5,3] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0}, "
      "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add\n",
      "[5,3]", "{0,1}", "grad:wrt=0,1");
  /* x.at[idx].multiply(u), .max(u), .min(u) with a repeated and an out-of-range index */
  static const char *const comb[] = {"ml", "mx", "mn"};
  for (int i = 0; i < 3; i++) {
    char body[1024];
    snprintf(
        body, sizeof body,
        "  x = f64[5,3] parameter(0)  i = s32[4,1] constant({{1}, {3}, {1}, {9}})  u = f64[4,3] "
        "parameter(1)\n"
        "  ROOT y = f64[5,3] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%s\n",
        comb[i]);
    shape_case(body, "[5,3]", "{0,1}", "grad:wrt=0,1");
  }
  /* zeros among the multiplied updates: no division by them */
  const char *mulz =
      "HloModule m\n" ADD_F64 MUL_F64 "ENTRY e { x = f64[3] parameter(0)  i = s32[3,1] "
      "constant({{0}, {0}, {2}})  u = f64[3] parameter(1)\n"
      "  y = f64[3] scatter(x, i, u), update_window_dims={}, inserted_window_dims={0}, "
      "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=ml\n"
      "  z = f64[] constant(0)  ROOT r = f64[] reduce(y, z), dimensions={0}, to_apply=add }\n";
  expect_grad(mulz, "grad:wrt=0,1", "(f64[], f64[3], f64[3]) (4, {0, 1, 3}, {2, 0, 1})",
              "f64[3] {1, 1, 1}", "f64[3] {0, 2, 3}", NULL);
  expect_grad(mulz, "grad:wrt=0,1", "(f64[], f64[3], f64[3]) (1, {0, 1, 0}, {0, 0, 1})",
              "f64[3] {1, 1, 1}", "f64[3] {0, 0, 0}", NULL);
  /* ties of a max: shared equally by the operand and the updates, as in JAX */
  const char *maxt =
      "HloModule m\n" ADD_F64 MAX_F64 "ENTRY e { x = f64[3] parameter(0)  i = s32[3,1] "
      "constant({{0}, {0}, {1}})  u = f64[3] parameter(1)\n"
      "  y = f64[3] scatter(x, i, u), update_window_dims={}, inserted_window_dims={0}, "
      "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=mx\n"
      "  z = f64[] constant(0)  ROOT r = f64[] reduce(y, z), dimensions={0}, to_apply=add }\n";
  expect_grad(maxt, "grad:wrt=0,1", "(f64[], f64[3], f64[3]) (8, {0, 0.5, 1}, {0.5, 0.5, 0.5})",
              "f64[3] {1, 5, 0}", "f64[3] {3, 3, 5}", NULL);
  /* x.at[idx].set(u) with a repeated index: only the winner gets a gradient */
  shape_case(
      "  x = f64[5,3] parameter(0)  i = s32[3,1] constant({{1}, {3}, {1}})  u = f64[3,3] "
      "parameter(1)\n"
      "  ROOT y = f64[5,3] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0}, "
      "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=rep\n",
      "[5,3]", "{0,1}", "grad:wrt=0,1");
}
END_TEST

START_TEST(test_select_and_scatter) {
  shape_case("  x = f64[6] parameter(0)  s = f64[3] parameter(1)  z = f64[] constant(0)\n"
             "  ROOT y = f64[6] select-and-scatter(x, s, z), window={size=2 stride=2}, select=ge, "
             "scatter=add\n",
             "[6]", "{0}", "grad:wrt=1");
}
END_TEST

static const char *k_fori =
    "HloModule m\n" ADD_F64
    "body { p = (s32[], f64[3], f64[3]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
    "  x = f64[3] get-tuple-element(p), index=1  w = f64[3] get-tuple-element(p), index=2\n"
    "  one = s32[] constant(1)  i1 = s32[] add(i, one)  s = f64[3] sine(x)  m = f64[3] multiply(s, "
    "w)\n"
    "  x1 = f64[3] add(m, x)  ROOT t = (s32[], f64[3], f64[3]) tuple(i1, x1, w) }\n"
    "cond { p = (s32[], f64[3], f64[3]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
    "  n = s32[] constant(4)  ROOT c = pred[] compare(i, n), direction=LT }\n"
    "ENTRY main { x = f64[3] parameter(0)  w = f64[3] parameter(1)  z = s32[] constant(0)\n"
    "  t = (s32[], f64[3], f64[3]) tuple(z, x, w)\n"
    "  l = (s32[], f64[3], f64[3]) while(t), condition=cond, body=body\n"
    "  y = f64[3] get-tuple-element(l), index=1  zero = f64[] constant(0)\n"
    "  ROOT r = f64[] reduce(y, zero), dimensions={0}, to_apply=add }\n";

START_TEST(test_while_known_trip_count) {
  tx_check_grad(k_fori, "grad:wrt=0,1", 41, -1, 1);
  tx_check_jvp(k_fori, 42, -1, 1);
  tx_check_vjp_dot(k_fori, 43, -1, 1);
  /* an upper bound carried in the state, as lax.fori_loop with traced
   * bounds writes it */
  const char *carried =
      "HloModule m\n" ADD_F64
      "body { p = (s32[], s32[], f64[2]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
      "  n = s32[] get-tuple-element(p), index=1  x = f64[2] get-tuple-element(p), index=2\n"
      "  one = s32[] constant(1)  i1 = s32[] add(one, i)  x1 = f64[2] multiply(x, x)\n"
      "  ROOT t = (s32[], s32[], f64[2]) tuple(i1, n, x1) }\n"
      "cond { p = (s32[], s32[], f64[2]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
      "  n = s32[] get-tuple-element(p), index=1  ROOT c = pred[] compare(n, i), direction=GT }\n"
      "ENTRY main { x = f64[2] parameter(0)  a = s32[] constant(1)  b = s32[] constant(3)\n"
      "  t = (s32[], s32[], f64[2]) tuple(a, b, x)  l = (s32[], s32[], f64[2]) while(t), "
      "condition=cond, body=body\n"
      "  y = f64[2] get-tuple-element(l), index=2  zero = f64[] constant(0)\n"
      "  ROOT r = f64[] reduce(y, zero), dimensions={0}, to_apply=add }\n";
  tx_check_grad(carried, "grad", 44, 0.5, 1.2);
  /* zero iterations */
  char zero[4096];
  snprintf(zero, sizeof zero, "%s", k_fori);
  char *p = strstr(zero, "z = s32[] constant(0)");
  memcpy(p, "z = s32[] constant(9)", 21);
  tx_check_grad(zero, "grad:wrt=0,1", 45, -1, 1);
}
END_TEST

START_TEST(test_conditional_and_call) {
  const char *cond =
      "HloModule m\n" ADD_F64 "tb { x = f64[3] parameter(0)  ROOT s = f64[3] sine(x) }\n"
      "fb { x = (f64[3], f64[]) parameter(0)  a = f64[3] get-tuple-element(x), index=0\n"
      "  b = f64[] get-tuple-element(x), index=1  bb = f64[3] broadcast(b), dimensions={}\n"
      "  ROOT m = f64[3] multiply(a, bb) }\n"
      "ENTRY main { p = f64[] parameter(0)  x = f64[3] parameter(1)  zero = f64[] constant(0)\n"
      "  c = pred[] compare(p, zero), direction=GT  t = (f64[3], f64[]) tuple(x, p)\n"
      "  y = f64[3] conditional(c, x, t), true_computation=tb, false_computation=fb\n"
      "  ROOT r = f64[] reduce(y, zero), dimensions={0}, to_apply=add }\n";
  tx_check_grad(cond, "grad:wrt=0,1", 51, 0.1, 1);   /* true branch */
  tx_check_grad(cond, "grad:wrt=0,1", 52, -1, -0.1); /* false branch */
  tx_check_jvp(cond, 53, -1, -0.1);
  tx_check_vjp_dot(cond, 54, 0.1, 1);
  const char *idx =
      "HloModule m\n"
      "b0 { x = f64[2] parameter(0)  ROOT s = f64[2] exponential(x) }\n"
      "b1 { x = f64[2] parameter(0)  ROOT s = f64[2] multiply(x, x) }\n"
      "b2 { x = f64[2] parameter(0)  ROOT s = f64[2] negate(x) }\n"
      "ENTRY main { i = s32[] parameter(0)  x = f64[2] parameter(1)\n"
      "  ROOT y = f64[2] conditional(i, x, x, x), branch_computations={b0, b1, b2} }\n";
  for (uint64_t s = 60; s < 64; s++) {
    tx_check_jvp(idx, s, -1, 1);
    tx_check_vjp_dot(idx, s, -1, 1);
  }
  const char *call =
      "HloModule m\n" ADD_F64 "f { a = f64[3] parameter(0)  b = f64[3] parameter(1)  t = f64[3] "
      "tanh(a)  ROOT m = f64[3] multiply(t, b) }\n"
      "ENTRY main { x = f64[3] parameter(0)  y = f64[3] parameter(1)  c = f64[3] call(x, y), "
      "to_apply=f\n"
      "  d = f64[3] call(c, x), to_apply=f  zero = f64[] constant(0)\n"
      "  ROOT r = f64[] reduce(d, zero), dimensions={0}, to_apply=add }\n";
  tx_check_grad(call, "grad:wrt=0,1", 71, -1, 1);
  tx_check_jvp(call, 72, -1, 1);
  tx_check_vjp_dot(call, 73, -1, 1);
}
END_TEST

START_TEST(test_checkpoint) {
  const char *mlp = "HloModule m\n" ADD_F64 "ENTRY main { x = f64[4,3] parameter(0)  w = f64[3,5] "
                    "parameter(1)  v = f64[5,2] parameter(2)\n"
                    "  h = f64[4,5] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}  "
                    "a = f64[4,5] tanh(h)\n"
                    "  e = f64[4,5] exponential(a)  o = f64[4,2] dot(e, v), "
                    "lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
                    "  s = f64[4,2] sine(o)  zero = f64[] constant(0)\n"
                    "  ROOT r = f64[] reduce(s, zero), dimensions={0,1}, to_apply=add }\n";
  const char *plain[] = {"grad:wrt=1,2", NULL}, *ck[] = {"checkpoint", "grad:wrt=1,2", NULL};
  kiln_transform_stats s0, s1;
  kiln_module *g0 = tx_apply_list(mlp, plain, &s0), *g1 = tx_apply_list(mlp, ck, &s1);
  uint32_t n;
  kiln_literal **args = tx_params_rand(g0, 81, -1, 1, &n);
  kiln_literal *r0 = tx_run(g0, args, n), *r1 = tx_run(g1, args, n);
  const kiln_literal *l0[8], *l1[8];
  ck_assert_uint_eq(tx_leaves(r0, l0, 8), 3);
  ck_assert_uint_eq(tx_leaves(r1, l1, 8), 3);
  for (int i = 0; i < 3; i++)
    tx_expect_lit_close(l1[i], l0[i], 1e-12, 1e-12, "checkpointed gradient");
  /* without: tanh(h), exp(.) and the logits live across; with: only inputs */
  ck_assert_uint_ge(s0.saved_values, 3);
  ck_assert_uint_eq(s1.saved_values, 0);
  ck_assert_int_gt(s0.saved_bytes, s1.saved_bytes);
  kiln_literal_destroy(r0);
  kiln_literal_destroy(r1);
  tx_free_args(args, n);
  kiln_module_destroy(g0);
  kiln_module_destroy(g1);
  tx_check_grad(mlp, "grad:wrt=0,1,2", 82, -1, 1);
}
END_TEST

START_TEST(test_errors) {
  const char *cc = "HloModule m\nENTRY main { x = f64[3] parameter(0)\n"
                   "  c.1 = f64[3] custom-call(x), custom_call_target=\"my_kernel\"  ROOT y = "
                   "f64[3] negate(c.1) }\n";
  tx_expect_fail(
      cc, "jvp", KILN_EUNIMPL,
      "main/c.1: jvp: custom-call target \"my_kernel\" (main/c.1) has no derivative rule: its body "
      "is "
      "opaque to the transforms (write it with HLO ops, or keep it off the differentiated path)");
  tx_expect_fail(cc, "vjp", KILN_EUNIMPL,
                 "vjp: custom-call target \"my_kernel\" (main/c.1) has no derivative rule");
  tx_expect_fail(cc, "vmap:size=2", KILN_EUNIMPL,
                 "vmap: custom-call target \"my_kernel\" (main/c.1) has no batching rule: its body "
                 "is opaque to the "
                 "transforms");
  /* a sort off the differentiated path is fine */
  const char *off = "HloModule m\n"
                    "lt { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT c = pred[] "
                    "compare(a, b), direction=LT }\n"
                    "ENTRY main { x = f64[3] parameter(0)  c = f64[3] parameter(1)  s = f64[3] "
                    "sort(c), dimensions={0}, to_apply=lt\n"
                    "  m = f64[3] multiply(s, x)  ROOT y = f64[3] negate(m) }\n";
  kiln_module_destroy(tx_apply(off, "jvp:wrt=0"));
  kiln_module_destroy(tx_apply(off, "vjp:wrt=0"));
  const char *vec =
      "HloModule m\nENTRY main { x = f64[3] parameter(0)  ROOT y = f64[3] sine(x) }\n";
  tx_expect_fail(vec, "grad", KILN_EINVAL,
                 "grad: output 0 is f64[3]; grad needs a floating-point scalar output");
  tx_expect_fail(vec, "grad:wrt=1", KILN_EINVAL,
                 "grad: wrt parameter 1 does not exist (ENTRY main takes 1 parameter)");
  tx_expect_fail(vec, "vjp:output=2", KILN_EINVAL,
                 "vjp: output 2 does not exist (ENTRY main has 1 output)");
  const char *intp = "HloModule m\nENTRY main { x = s32[] parameter(0)  f = f64[] convert(x)  ROOT "
                     "y = f64[] sine(f) }\n";
  tx_expect_fail(intp, "grad", KILN_EINVAL,
                 "grad: parameter 0 is s32[]; gradients need floating-point parameters");
  const char *loop =
      "HloModule m\n"
      "body { p = (f64[], f64[]) parameter(0)  x = f64[] get-tuple-element(p), index=0\n"
      "  l = f64[] get-tuple-element(p), index=1  h = f64[] constant(0.5)  y = f64[] multiply(x, "
      "h)\n"
      "  ROOT t = (f64[], f64[]) tuple(y, l) }\n"
      "cond { p = (f64[], f64[]) parameter(0)  x = f64[] get-tuple-element(p), index=0\n"
      "  l = f64[] get-tuple-element(p), index=1  ROOT c = pred[] compare(x, l), direction=GT }\n"
      "ENTRY main { x = f64[] parameter(0)  l = f64[] constant(0.1)  t = (f64[], f64[]) tuple(x, "
      "l)\n"
      "  w.1 = (f64[], f64[]) while(t), condition=cond, body=body\n"
      "  ROOT y = f64[] get-tuple-element(w.1), index=0 }\n";
  tx_expect_fail(loop, "grad", KILN_EINVAL,
                 "main/w.1: grad: while w.1 has no trip count known at compile time");
  /* forward mode needs no trip count */
  tx_check_jvp(loop, 91, 0.5, 2);
}
END_TEST

START_TEST(test_integer_and_pred_values) {
  /* integer outputs get zero tangents; integer parameters zero cotangents */
  const char *mixed =
      "HloModule m\n"
      "ENTRY main { x = f64[3] parameter(0)  k = s32[3] parameter(1)  kf = f64[3] convert(k)\n"
      "  m = f64[3] multiply(x, kf)  f = s32[3] convert(x)  p = pred[3] compare(x, kf), "
      "direction=LT\n"
      "  ROOT t = (f64[3], s32[3], pred[3]) tuple(m, f, p) }\n";
  tx_check_jvp(mixed, 101, -2, 2);
  tx_check_vjp_dot(mixed, 102, -2, 2);
  kiln_module *j = tx_apply(mixed, "jvp");
  char *text = kiln_module_print(j, NULL);
  ck_assert_ptr_nonnull(strstr(text, "-> (f64[3], s32[3], pred[3], f64[3], s32[3], pred[3])"));
  kiln_free(text);
  kiln_module_destroy(j);
}
END_TEST

START_TEST(test_signatures) {
  const char *two =
      "HloModule m, entry_computation_layout={(f64[2]{0}, f64[])->(f64[2]{0}, f64[])}\n"
      "ENTRY main { x = f64[2] parameter(0)  a = f64[] parameter(1)  ab = f64[2] broadcast(a), "
      "dimensions={}\n"
      "  y = f64[2] multiply(x, ab)  s = f64[] multiply(a, a)  ROOT t = (f64[2], f64[]) tuple(y, "
      "s) }\n";
  const struct {
    const char *spec, *sig;
  } cases[] = {
      {"jvp", "(f64[2], f64[], f64[2], f64[]) -> (f64[2], f64[], f64[2], f64[])"},
      {"jvp:wrt=1", "(f64[2], f64[], f64[]) -> (f64[2], f64[], f64[2], f64[])"},
      {"vjp", "(f64[2], f64[], f64[2], f64[]) -> (f64[2], f64[], f64[2], f64[])"},
      {"vjp:wrt=1,output=0", "(f64[2], f64[], f64[2]) -> (f64[2], f64[], f64[])"},
      {"grad:output=1", "(f64[2], f64[]) -> (f64[], f64[2])"},
      {"grad:wrt=1,0,output=1", "(f64[2], f64[]) -> (f64[], f64[], f64[2])"},
      {"checkpoint", "(f64[2], f64[]) -> (f64[2], f64[])"},
      {"vmap:in_axes=0,none,size=5", "(f64[5,2], f64[]) -> (f64[5,2], f64[5])"},
      {"vmap:in_axes=1,0,out_axes=1,0,size=5", "(f64[2,5], f64[5]) -> (f64[2,5], f64[5])"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kiln_module *m = tx_apply(two, cases[i].spec);
    char *sig = tx_signature(m);
    ck_assert_msg(strcmp(sig, cases[i].sig) == 0, "%s: %s", cases[i].spec, sig);
    ck_assert_ptr_null(m->entry_layout);
    free(sig);
    kiln_module_destroy(m);
  }
}
END_TEST

START_TEST(test_spec_parse) {
  kiln_transform t;
  kiln_status st;
  char buf[256];
  const struct {
    const char *in, *canon;
  } ok[] = {
      {"grad", "grad"},
      {"grad:wrt=0,1", "grad:wrt=0,1"},
      {"grad:wrt=0,output=1", "grad:wrt=0,output=1"},
      {"vjp:wrt=0", "vjp:wrt=0"},
      {"jvp", "jvp"},
      {"jvp:wrt=0", "jvp:wrt=0"},
      {"vmap:in_axes=0,none,1", "vmap:in_axes=0,none,1"},
      {"vmap:in_axes=0,out_axes=1", "vmap:in_axes=0,out_axes=1"},
      {"vmap:out_axes=-1,none,in_axes=-2", "vmap:in_axes=-2,out_axes=-1,none"},
      {"vmap:size=3,in_axes=none,1", "vmap:in_axes=none,1,size=3"},
      {"checkpoint", "checkpoint"},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    kiln_status_clear(&st);
    ck_assert_msg(kiln_transform_parse(ok[i].in, &t, &st) == 0, "%s: %s", ok[i].in, st.msg);
    kiln_transform_format(&t, buf, sizeof buf);
    ck_assert_str_eq(buf, ok[i].canon);
  }
  ck_assert_int_eq(kiln_transform_parse("vmap:in_axes=0,none,1", &t, NULL), 0);
  ck_assert_uint_eq(t.nin_axes, 3);
  ck_assert(t.in_axes[1] == KILN_AXIS_NONE);
  ck_assert_int_eq(t.in_axes[2], 1);
  ck_assert_int_eq(kiln_transform_parse("grad", &t, NULL), 0);
  ck_assert_int_eq(t.output, -1);
  ck_assert_uint_eq(t.nwrt, 0);
  const struct {
    const char *in, *msg;
  } bad[] = {
      {"hess", "unknown transform 'hess' (expected grad, vjp, jvp, vmap, checkpoint or autocast, "
               "optionally followed by ':' and options)"},
      {"", "unknown transform '' (expected grad, vjp, jvp, vmap, checkpoint or autocast, "
           "optionally followed by ':' and options)"},
      {"grad:", "grad: nothing follows ':' (grad takes wrt and output)"},
      {"grad:wrt=a", "grad: wrt entry 'a' is not a parameter number (a non-negative integer)"},
      {"grad:wrt=-1", "grad: wrt entry '-1' is not a parameter number (a non-negative integer)"},
      {"grad:wrt=0,0", "grad: parameter 0 is listed twice in wrt"},
      {"grad:wrt=", "grad: wrt needs a value"},
      {"grad:wrt=0,", "grad: wrt needs a value"},
      {"grad:in_axes=0", "grad: unknown option 'in_axes' (grad takes wrt and output)"},
      {"grad:output=1,2", "grad: output takes one output number"},
      {"jvp:output=0", "jvp: unknown option 'output' (jvp takes wrt)"},
      {"vmap:in_axes=x", "vmap: in_axes entry 'x' is not an integer or none"},
      {"vmap:0",
       "vmap: option '0' has no key (write key=value; vmap takes in_axes, out_axes and size)"},
      {"vmap:size=0", "vmap: size '0' is not a batch size (a positive integer)"},
      {"checkpoint:wrt=0", "checkpoint: unknown option 'wrt' (checkpoint takes no options)"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kiln_status_clear(&st);
    ck_assert_int_eq(kiln_transform_parse(bad[i].in, &t, &st), KILN_EINVAL);
    ck_assert_str_eq(st.msg, bad[i].msg);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("transform_ad");
  TCase *tc = tcase_create("ad");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_spec_parse);
  tcase_add_test(tc, test_unary_ops);
  tcase_add_test(tc, test_binary_ops);
  tcase_add_test(tc, test_edge_points_like_jax);
  tcase_add_test(tc, test_shape_ops);
  tcase_add_test(tc, test_dot_ops);
  tcase_add_test(tc, test_convolution);
  tcase_add_test(tc, test_reductions);
  tcase_add_test(tc, test_variadic_reductions);
  tcase_add_test(tc, test_sort_and_topk);
  tcase_add_test(tc, test_gather_scatter);
  tcase_add_test(tc, test_select_and_scatter);
  tcase_add_test(tc, test_while_known_trip_count);
  tcase_add_test(tc, test_conditional_and_call);
  tcase_add_test(tc, test_checkpoint);
  tcase_add_test(tc, test_errors);
  tcase_add_test(tc, test_integer_and_pred_values);
  tcase_add_test(tc, test_signatures);
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
