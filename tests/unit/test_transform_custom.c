/* Custom derivative rules (compiler/transforms/custom.c): calls whose
 * frontend attributes name a custom_jvp or custom_vjp rule are
 * differentiated with the rule, not with the primal's body, under jvp,
 * vjp/grad and after vmap; rules are checked like any untrusted input.
 * The rules below are deliberately not the primal's true derivative (3 t;
 * twice the true cotangent) so that a test tells which one ran. */
#include "tests/unit/test_transform_harness.h"

/* sum(log(1 + exp(x))) with the JVP rule t -> 3 t. */
static const char *JVP_MOD =
    "HloModule m\n"
    "P { x = f64[3] parameter(0)  one = f64[] constant(1)  b = f64[3] broadcast(one), "
    "dimensions={}\n"
    "  e = f64[3] exponential(x)  s = f64[3] add(b, e)  ROOT l = f64[3] log(s) }\n"
    "J { x = f64[3] parameter(0)  t = f64[3] parameter(1)\n"
    "  y = f64[3] call(x), to_apply=P\n"
    "  three = f64[] constant(3)  b = f64[3] broadcast(three), dimensions={}\n"
    "  dt = f64[3] multiply(t, b)  ROOT r = (f64[3], f64[3]) tuple(y, dt) }\n"
    "add { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT c = f64[] add(a, b) }\n"
    "ENTRY main { x = f64[3] parameter(0)\n"
    "  y = f64[3] call(x), to_apply=P, frontend_attributes={_kiln_custom_jvp=\"J\"}\n"
    "  z = f64[] constant(0)  ROOT s = f64[] reduce(y, z), dimensions={0}, to_apply=add }\n";

/* The same call, elementwise output, for jvp and vmap. */
static const char *JVP_EW =
    "HloModule m\n"
    "P { x = f64[3] parameter(0)  ROOT l = f64[3] sine(x) }\n"
    "J { x = f64[3] parameter(0)  t = f64[3] parameter(1)\n"
    "  y = f64[3] sine(x)\n"
    "  three = f64[] constant(3)  b = f64[3] broadcast(three), dimensions={}\n"
    "  dt = f64[3] multiply(t, b)  ROOT r = (f64[3], f64[3]) tuple(y, dt) }\n"
    "ENTRY main { x = f64[3] parameter(0)\n"
    "  ROOT y = f64[3] call(x), to_apply=P, frontend_attributes={_kiln_custom_jvp=\"J\"} }\n";

/* sum(sin(x) * w) with a custom_vjp whose residual is cos(x) and whose
 * backward pass doubles x's cotangent; w is closed over (nargs 1). */
static const char *VJP_MOD =
    "HloModule m\n"
    "P { x = f64[3] parameter(0)  w = f64[3] parameter(1)  s = f64[3] sine(x)\n"
    "  ROOT y = f64[3] multiply(s, w) }\n"
    "F { x = f64[3] parameter(0)  w = f64[3] parameter(1)  s = f64[3] sine(x)\n"
    "  y = f64[3] multiply(s, w)  c = f64[3] cosine(x)  r = (f64[3]) tuple(c)\n"
    "  ROOT o = (f64[3], (f64[3])) tuple(y, r) }\n"
    "B { x = f64[3] parameter(0)  w = f64[3] parameter(1)  r = (f64[3]) parameter(2)\n"
    "  ct = f64[3] parameter(3)  c = f64[3] get-tuple-element(r), index=0\n"
    "  two = f64[] constant(2)  b = f64[3] broadcast(two), dimensions={}\n"
    "  a = f64[3] multiply(c, ct)  a2 = f64[3] multiply(a, w)  g = f64[3] multiply(a2, b)\n"
    "  ROOT o = (f64[3]) tuple(g) }\n"
    "add { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT c = f64[] add(a, b) }\n"
    "ENTRY main { x = f64[3] parameter(0)  w = f64[3] parameter(1)\n"
    "  y = f64[3] call(x, w), to_apply=P, frontend_attributes={_kiln_custom_vjp_fwd=\"F\","
    "_kiln_custom_vjp_bwd=\"B\",_kiln_custom_nargs=\"1\"}\n"
    "  z = f64[] constant(0)  ROOT s = f64[] reduce(y, z), dimensions={0}, to_apply=add }\n";

static kiln_literal *vec3(double a, double b, double c) {
  int64_t d = 3;
  kiln_literal *l = tx_lit_dims(KILN_F64, &d, 1);
  kiln_literal_set_f64(l, 0, a);
  kiln_literal_set_f64(l, 1, b);
  kiln_literal_set_f64(l, 2, c);
  return l;
}

/* Output leaf k of running m on args. */
static double leaf_at(const kiln_literal *r, uint32_t k, int64_t i) {
  const kiln_literal *lv[8];
  uint32_t n = tx_leaves(r, lv, 8);
  ck_assert_uint_lt(k, n);
  return kiln_literal_get_f64(lv[k], i);
}

START_TEST(test_custom_jvp_under_grad_and_jvp) {
  kiln_module *g = tx_apply(JVP_MOD, "grad");
  kiln_literal *args[1] = {vec3(-1, 0.5, 30)};
  kiln_literal *r = tx_run(g, args, 1);
  for (int64_t i = 0; i < 3; i++) ck_assert_double_eq_tol(leaf_at(r, 1, i), 3.0, 1e-12);
  ck_assert_double_eq_tol(leaf_at(r, 0, 0), log1p(exp(-1.0)) + log1p(exp(0.5)) + log1p(exp(30.0)),
                          1e-9);
  kiln_literal_destroy(r);
  kiln_module_destroy(g);

  kiln_module *j = tx_apply(JVP_EW, "jvp");
  kiln_literal *jargs[2] = {args[0], vec3(1, 2, -4)};
  r = tx_run(j, jargs, 2);
  ck_assert_double_eq_tol(leaf_at(r, 0, 1), sin(0.5), 1e-12);
  ck_assert_double_eq_tol(leaf_at(r, 1, 2), -12.0, 1e-12);
  kiln_literal_destroy(r);
  kiln_module_destroy(j);

  /* vmap first: the rule is batched with the primal and still used */
  const char *specs[] = {"vmap:size=2", "jvp", NULL};
  kiln_module *vj = tx_apply_list(JVP_EW, specs, NULL);
  int64_t d[2] = {2, 3};
  kiln_literal *bx = tx_lit_dims(KILN_F64, d, 2), *bt = tx_lit_dims(KILN_F64, d, 2);
  for (int64_t i = 0; i < 6; i++) {
    kiln_literal_set_f64(bx, i, 0.1 * (double)i);
    kiln_literal_set_f64(bt, i, (double)i);
  }
  kiln_literal *bargs[2] = {bx, bt};
  r = tx_run(vj, bargs, 2);
  for (int64_t i = 0; i < 6; i++) {
    ck_assert_double_eq_tol(leaf_at(r, 0, i), sin(0.1 * (double)i), 1e-12);
    ck_assert_double_eq_tol(leaf_at(r, 1, i), 3.0 * (double)i, 1e-12);
  }
  kiln_literal_destroy(r);
  kiln_literal_destroy(bx);
  kiln_literal_destroy(bt);
  kiln_module_destroy(vj);
  kiln_literal_destroy(args[0]);
  kiln_literal_destroy(jargs[1]);
}
END_TEST

START_TEST(test_custom_vjp_under_grad) {
  kiln_module *g = tx_apply(VJP_MOD, "grad");
  kiln_literal *args[2] = {vec3(0.3, -1.2, 2.0), vec3(1.5, -2.0, 0.25)};
  kiln_literal *r = tx_run(g, args, 2);
  double x[3] = {0.3, -1.2, 2.0}, w[3] = {1.5, -2.0, 0.25};
  for (int64_t i = 0; i < 3; i++)
    ck_assert_double_eq_tol(leaf_at(r, 1, i), 2.0 * cos(x[i]) * w[i], 1e-12);
  kiln_literal_destroy(r);
  kiln_module_destroy(g);
  /* vmap, then vjp: the batched fwd and bwd are the rule */
  const char *specs[] = {"vmap:in_axes=0,none,size=2", "vjp:wrt=0", NULL};
  kiln_module *vg = tx_apply_list(VJP_MOD, specs, NULL);
  int64_t d[2] = {2, 3}, one = 2;
  kiln_literal *bx = tx_lit_dims(KILN_F64, d, 2), *ct = tx_lit_dims(KILN_F64, &one, 1);
  for (int64_t i = 0; i < 6; i++) kiln_literal_set_f64(bx, i, x[i % 3] + (double)(i / 3));
  kiln_literal_set_f64(ct, 0, 1.0);
  kiln_literal_set_f64(ct, 1, -0.5);
  kiln_literal *vargs[3] = {bx, args[1], ct};
  r = tx_run(vg, vargs, 3);
  for (int64_t i = 0; i < 6; i++) {
    double c = i / 3 ? -0.5 : 1.0;
    ck_assert_double_eq_tol(leaf_at(r, 1, i), 2.0 * cos(x[i % 3] + (double)(i / 3)) * w[i % 3] * c,
                            1e-12);
  }
  kiln_literal_destroy(r);
  kiln_literal_destroy(bx);
  kiln_literal_destroy(ct);
  kiln_module_destroy(vg);
  kiln_literal_destroy(args[0]);
  kiln_literal_destroy(args[1]);
}
END_TEST

/* text with the first occurrence of `from` replaced by `to`; malloc'd. */
static char *edit(const char *text, const char *from, const char *to) {
  const char *p = strstr(text, from);
  ck_assert_msg(p != NULL, "no \"%s\" in the module", from);
  size_t n = strlen(text) - strlen(from) + strlen(to) + 1;
  char *out = malloc(n);
  snprintf(out, n, "%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
  return out;
}

static void expect_edit_fail(const char *text, const char *from, const char *to, const char *spec,
                             const char *part) {
  char *t = edit(text, from, to);
  tx_expect_fail(t, spec, KILN_EINVAL, part);
  free(t);
}

START_TEST(test_rules_are_untrusted) {
  expect_edit_fail(JVP_MOD, "_kiln_custom_jvp=\"J\"", "_kiln_custom_jvp=\"nope\"", "grad",
                   "frontend attribute _kiln_custom_jvp names computation \"nope\", which is not "
                   "in the module");
  expect_edit_fail(JVP_MOD, "_kiln_custom_jvp=\"J\"", "_kiln_custom_jvp=\"main\"", "grad",
                   "names the ENTRY computation");
  expect_edit_fail(JVP_MOD, "_kiln_custom_jvp=\"J\"", "_kiln_custom_jvp=J", "grad",
                   "must be a quoted computation name");
  char *t = edit(JVP_MOD, "dt = f64[3] multiply(t, b)", "dt = f64[3] multiply(x, b)");
  expect_edit_fail(t, "t = f64[3] parameter(1)", "t = f64[2] parameter(1)", "grad",
                   "parameter 1 of custom_jvp computation J has shape f64[2], expected f64[3]");
  free(t);
  expect_edit_fail(JVP_MOD, "_kiln_custom_jvp=\"J\"",
                   "_kiln_custom_jvp=\"J\",_kiln_custom_vjp_fwd=\"P\"", "grad",
                   "both a custom_jvp rule");
  expect_edit_fail(VJP_MOD, "_kiln_custom_vjp_bwd=\"B\",", "", "grad",
                   "needs both _kiln_custom_vjp_fwd and _kiln_custom_vjp_bwd");
  expect_edit_fail(VJP_MOD, "_kiln_custom_nargs=\"1\"", "_kiln_custom_nargs=\"7\"", "grad",
                   "_kiln_custom_nargs must be a quoted integer from 0 to 2");
  expect_edit_fail(VJP_MOD, "ROOT o = (f64[3]) tuple(g)", "ROOT o = (f64[3], f64[3]) tuple(g, g)",
                   "grad", "custom_vjp bwd computation B must return a tuple of 1 elements");
  expect_edit_fail(VJP_MOD, "ROOT o = (f64[3], (f64[3])) tuple(y, r)",
                   "ROOT o = (f64[3], f64[3]) tuple(y, c)", "grad",
                   "parameter 2 of custom_vjp bwd computation B has shape (f64[3]), expected "
                   "f64[3]");
  expect_edit_fail(VJP_MOD, "ct = f64[3] parameter(3)",
                   "ct = f64[3] parameter(3)  q = f64[] "
                   "parameter(4)",
                   "grad", "takes 5 parameters, expected 4");
  /* a rule that calls itself through its own custom rule */
  expect_edit_fail(
      JVP_MOD, "  y = f64[3] call(x), to_apply=P\n",
      "  y = f64[3] call(x), to_apply=P, frontend_attributes={_kiln_custom_jvp=\"J\"}\n", "grad",
      "rule computation J refers back to itself");
  /* forward mode of a custom_vjp function, and differentiating a value the
   * rule closed over: refused as JAX refuses them */
  tx_expect_fail(VJP_MOD, "jvp:wrt=0", KILN_EINVAL,
                 "forward-mode differentiation (jvp) of a custom_vjp function");
  tx_expect_fail(VJP_MOD, "grad:wrt=1", KILN_EINVAL, "with respect to a value it closed over");
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("transform_custom");
  TCase *tc = tcase_create("custom");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_custom_jvp_under_grad_and_jvp);
  tcase_add_test(tc, test_custom_vjp_under_grad);
  tcase_add_test(tc, test_rules_are_untrusted);
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
