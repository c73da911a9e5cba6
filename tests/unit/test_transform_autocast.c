/* autocast (compiler/transforms/autocast.c) and the dynamic loss scaling it
 * hands to a grad (transform.c): the spec grammar and its errors; the
 * rewrite itself (every f32 dot and convolution, in the ENTRY and in the
 * computations it calls, takes bf16/f16 operands and keeps its f32 result;
 * nothing else changes type); the autocast program on the interpreter
 * within bf16 tolerance of the f32 one; grad of an autocast program; and
 * the loss-scaled grad: unscaled gradients equal to the plain grad's, zero
 * gradients and a halved scale on overflow, the scale doubled after
 * growth_interval finite steps. */
#include "test_transform_harness.h"

/* A dense layer with a softmax, and a reduction over its result. */
static const char *const dense = "HloModule dense\n"
                                 "max_f {\n"
                                 "  a = f32[] parameter(0)\n"
                                 "  b = f32[] parameter(1)\n"
                                 "  ROOT m = f32[] maximum(a, b)\n"
                                 "}\n"
                                 "add_f {\n"
                                 "  a = f32[] parameter(0)\n"
                                 "  b = f32[] parameter(1)\n"
                                 "  ROOT s = f32[] add(a, b)\n"
                                 "}\n"
                                 "ENTRY main {\n"
                                 "  x = f32[4,8] parameter(0)\n"
                                 "  w = f32[8,5] parameter(1)\n"
                                 "  d = f32[4,5] dot(x, w), lhs_contracting_dims={1}, "
                                 "rhs_contracting_dims={0}\n"
                                 "  ninf = f32[] constant(-inf)\n"
                                 "  mx = f32[4] reduce(d, ninf), dimensions={1}, to_apply=max_f\n"
                                 "  mb = f32[4,5] broadcast(mx), dimensions={0}\n"
                                 "  z = f32[4,5] subtract(d, mb)\n"
                                 "  e = f32[4,5] exponential(z)\n"
                                 "  zero = f32[] constant(0)\n"
                                 "  s = f32[4] reduce(e, zero), dimensions={1}, to_apply=add_f\n"
                                 "  sb = f32[4,5] broadcast(s), dimensions={0}\n"
                                 "  p = f32[4,5] divide(e, sb)\n"
                                 "  l = f32[] reduce(p, zero), dimensions={0,1}, "
                                 "to_apply=add_f\n"
                                 "  ROOT t = (f32[], f32[4,5]) tuple(l, p)\n"
                                 "}\n";

/* A scalar loss of a two-layer product, for grads. */
static const char *const loss = "HloModule loss\n"
                                "add_f {\n"
                                "  a = f32[] parameter(0)\n"
                                "  b = f32[] parameter(1)\n"
                                "  ROOT s = f32[] add(a, b)\n"
                                "}\n"
                                "ENTRY main {\n"
                                "  w = f32[3,4] parameter(0)\n"
                                "  x = f32[2,3] parameter(1)\n"
                                "  d = f32[2,4] dot(x, w), lhs_contracting_dims={1}, "
                                "rhs_contracting_dims={0}\n"
                                "  t = f32[2,4] tanh(d)\n"
                                "  q = f32[2,4] multiply(t, t)\n"
                                "  zero = f32[] constant(0)\n"
                                "  ROOT l = f32[] reduce(q, zero), dimensions={0,1}, "
                                "to_apply=add_f\n"
                                "}\n";

/* A dot inside a called computation, and a convolution in the ENTRY. */
static const char *const nested = "HloModule nested\n"
                                  "inner {\n"
                                  "  a = f32[2,3] parameter(0)\n"
                                  "  b = f32[3,2] parameter(1)\n"
                                  "  ROOT d = f32[2,2] dot(a, b), lhs_contracting_dims={1}, "
                                  "rhs_contracting_dims={0}\n"
                                  "}\n"
                                  "ENTRY main {\n"
                                  "  a = f32[2,3] parameter(0)\n"
                                  "  b = f32[3,2] parameter(1)\n"
                                  "  img = f32[1,5,5,2] parameter(2)\n"
                                  "  k = f32[3,3,2,4] parameter(3)\n"
                                  "  c = f32[2,2] call(a, b), to_apply=inner\n"
                                  "  v = f32[1,3,3,4] convolution(img, k), window={size=3x3}, "
                                  "dim_labels=b01f_01io->b01f\n"
                                  "  ROOT t = (f32[2,2], f32[1,3,3,4]) tuple(c, v)\n"
                                  "}\n";

static void expect_spec(const char *spec, kiln_dtype t, bool ls, int64_t gi) {
  kiln_transform tr;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_transform_parse(spec, &tr, &st) == 0, "%s: %s", spec, st.msg);
  ck_assert_int_eq(tr.kind, KILN_TRANSFORM_AUTOCAST);
  ck_assert_int_eq(tr.cast_to, t);
  ck_assert_int_eq(tr.loss_scale, ls);
  ck_assert_int_eq(tr.growth_interval, gi);
}

static void expect_bad_spec(const char *spec, const char *part) {
  kiln_transform tr;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_transform_parse(spec, &tr, &st) == KILN_EINVAL, "%s parsed", spec);
  ck_assert_msg(strstr(st.msg, part) != NULL, "%s: \"%s\" lacks \"%s\"", spec, st.msg, part);
}

START_TEST(test_spec) {
  expect_spec("autocast:bf16", KILN_BF16, false, 0);
  expect_spec("autocast:f16", KILN_F16, true, 0);
  expect_spec("autocast:f16,loss_scale=none", KILN_F16, false, 0);
  expect_spec("autocast:bf16,loss_scale=dynamic,growth_interval=10", KILN_BF16, true, 10);
  expect_bad_spec("autocast", "narrow type");
  expect_bad_spec("autocast:", "narrow type");
  expect_bad_spec("autocast:f32", "'f32' is not bf16 or f16");
  expect_bad_spec("autocast:f16,loss_scale=sometimes", "not dynamic or none");
  expect_bad_spec("autocast:f16,growth_interval=0", "not a positive step count");
  expect_bad_spec("autocast:f16,growth_interval=1,growth_interval=2", "given twice");
  expect_bad_spec("autocast:bf16,wrt=0", "unknown option 'wrt=0'");
  char buf[96];
  kiln_transform tr;
  ck_assert_int_eq(kiln_transform_parse("autocast:f16,growth_interval=5", &tr, NULL), 0);
  kiln_transform_format(&tr, buf, sizeof buf);
  ck_assert_str_eq(buf, "autocast:f16,growth_interval=5");
}
END_TEST

/* Every dot and convolution takes converts to `narrow` and gives f32; the
 * only instructions of type `narrow` are converts; want_dots rewritten. */
static void check_types(const kiln_module *m, kiln_dtype narrow, uint32_t want_dots) {
  uint32_t dots = 0;
  for (uint32_t c = 0; c < m->ncomps; c++) {
    const kiln_computation *comp = m->comps[c];
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const kiln_instr *ins = m->instrs[comp->instrs[i]];
      if (ins->op == KILN_OP_DOT || ins->op == KILN_OP_CONVOLUTION) {
        ck_assert_msg(ins->shape.dtype == KILN_F32, "%s: result is not f32", ins->name);
        for (uint32_t k = 0; k < 2; k++) {
          const kiln_instr *o = m->instrs[ins->operands[k]];
          ck_assert_msg(o->shape.dtype == narrow && o->op == KILN_OP_CONVERT,
                        "%s: operand %u is not a convert to %s", ins->name, k,
                        kiln_dtype_name(narrow));
        }
        dots++;
      } else if (kiln_shape_is_array(&ins->shape) && ins->shape.dtype == narrow) {
        ck_assert_msg(ins->op == KILN_OP_CONVERT, "%s: %s computes in %s", ins->name,
                      kiln_opcode_name(ins->op), kiln_dtype_name(narrow));
      }
    }
  }
  ck_assert_uint_eq(dots, want_dots);
}

/* f32 vs autocast on the interpreter: every output within rtol of the
 * largest magnitude of that output. */
static void check_close(const char *text, const char *spec, double tol) {
  kiln_module *f = tx_parse(text), *g = tx_apply(text, spec);
  uint32_t n;
  kiln_literal **args = tx_params_rand(f, 17, -1, 1, &n);
  kiln_literal *rf = tx_run(f, args, n), *rg = tx_run(g, args, n);
  const kiln_literal *lf[8], *lg[8];
  uint32_t nf = tx_leaves(rf, lf, 8), ng = tx_leaves(rg, lg, 8);
  ck_assert_uint_eq(nf, ng);
  bool differs = false;
  for (uint32_t j = 0; j < nf; j++) {
    int64_t ne = kiln_literal_elements(lf[j]);
    double big = 0;
    for (int64_t i = 0; i < ne; i++) big = fmax(big, fabs(kiln_literal_get_f64(lf[j], i)));
    for (int64_t i = 0; i < ne; i++) {
      double a = kiln_literal_get_f64(lf[j], i), b = kiln_literal_get_f64(lg[j], i);
      ck_assert_msg(fabs(a - b) <= tol * fmax(big, 1e-6), "%s output %u element %lld: %g vs %g",
                    spec, j, (long long)i, b, a);
      differs |= a != b;
    }
  }
  /* the narrow inputs round: some element must move, or nothing was cast */
  ck_assert_msg(differs, "%s: the result equals the f32 one exactly", spec);
  kiln_literal_destroy(rf);
  kiln_literal_destroy(rg);
  tx_free_args(args, n);
  kiln_module_destroy(f);
  kiln_module_destroy(g);
}

START_TEST(test_rewrite_dense) {
  kiln_module *m = tx_apply(dense, "autocast:bf16");
  check_types(m, KILN_BF16, 1);
  kiln_module_destroy(m);
  check_close(dense, "autocast:bf16", 1e-2);
  check_close(dense, "autocast:f16", 2e-3);
}
END_TEST

START_TEST(test_rewrite_nested_and_conv) {
  kiln_module *m = tx_apply(nested, "autocast:f16");
  check_types(m, KILN_F16, 2);
  kiln_module_destroy(m);
  check_close(nested, "autocast:bf16", 2e-2);
}
END_TEST

/* grad(autocast(f)) and autocast(grad(f)): gradients near the f32 ones. */
START_TEST(test_grad_of_autocast) {
  const char *a[] = {"autocast:bf16", "grad", NULL};
  const char *b[] = {"grad", "autocast:bf16", NULL};
  kiln_module *f = tx_apply(loss, "grad");
  for (int v = 0; v < 2; v++) {
    kiln_module *g = tx_apply_list(loss, v ? b : a, NULL);
    uint32_t n;
    kiln_literal **args = tx_params_rand(f, 5, -1, 1, &n);
    kiln_literal *rf = tx_run(f, args, n), *rg = tx_run(g, args, n);
    const kiln_literal *lf[4], *lg[4];
    ck_assert_uint_eq(tx_leaves(rf, lf, 4), 2);
    ck_assert_uint_eq(tx_leaves(rg, lg, 4), 2);
    tx_expect_lit_close(lg[0], lf[0], 2e-2, 2e-2, "value");
    tx_expect_lit_close(lg[1], lf[1], 3e-2, 3e-2, "gradient");
    kiln_literal_destroy(rf);
    kiln_literal_destroy(rg);
    tx_free_args(args, n);
    kiln_module_destroy(g);
  }
  kiln_module_destroy(f);
}
END_TEST

static kiln_literal *scalar_lit(kiln_dtype t, double v) {
  kiln_shape s = {.dtype = t};
  kiln_literal *l = tx_lit(&s);
  kiln_literal_set_f64(l, 0, v);
  return l;
}

/* grad(autocast:f16(f))(w, x, scale, good) with the given scale and count;
 * leaves of the result into out[0..5). */
static kiln_literal *run_scaled(const kiln_module *g, kiln_literal **args, double scale,
                                int64_t good) {
  kiln_literal *a[4] = {args[0], args[1], scalar_lit(KILN_F32, scale),
                        scalar_lit(KILN_S32, (double)good)};
  kiln_literal *r = tx_run(g, a, 4);
  kiln_literal_destroy(a[2]);
  kiln_literal_destroy(a[3]);
  return r;
}

START_TEST(test_loss_scaling) {
  const char *specs[] = {"autocast:f16,growth_interval=3", "grad", NULL};
  kiln_module *g = tx_apply_list(loss, specs, NULL);
  char *sig = tx_signature(g);
  ck_assert_str_eq(sig, "(f32[3,4], f32[2,3], f32[], s32[]) -> (f32[], f32[3,4], f32[], s32[])");
  free(sig);
  const char *plain[] = {"autocast:f16,loss_scale=none", "grad", NULL};
  kiln_module *p = tx_apply_list(loss, plain, NULL);
  uint32_t n;
  kiln_literal **args = tx_params_rand(p, 9, -1, 1, &n);
  kiln_literal *rp = tx_run(p, args, n);
  const kiln_literal *lp[4], *lg[8];
  ck_assert_uint_eq(tx_leaves(rp, lp, 4), 2);

  /* a finite step: the plain gradient, the count goes up */
  kiln_literal *r = run_scaled(g, args, 1024, 0);
  ck_assert_uint_eq(tx_leaves(r, lg, 8), 4);
  tx_expect_lit_close(lg[0], lp[0], 0, 0, "value");
  tx_expect_lit_close(lg[1], lp[1], 1e-3, 1e-4, "unscaled gradient");
  ck_assert_double_eq(kiln_literal_get_f64(lg[2], 0), 1024);
  ck_assert_int_eq((int)kiln_literal_get_f64(lg[3], 0), 1);
  kiln_literal_destroy(r);

  /* the third finite step in a row doubles the scale and resets the count */
  r = run_scaled(g, args, 1024, 2);
  tx_leaves(r, lg, 8);
  ck_assert_double_eq(kiln_literal_get_f64(lg[2], 0), 2048);
  ck_assert_int_eq((int)kiln_literal_get_f64(lg[3], 0), 0);
  kiln_literal_destroy(r);

  /* an overflowing scale (f16 tops out at 65504): zero gradients, the
   * update skipped, the scale halved, the count reset */
  r = run_scaled(g, args, 1e30, 2);
  tx_leaves(r, lg, 8);
  for (int64_t i = 0; i < kiln_literal_elements(lg[1]); i++)
    ck_assert_double_eq(kiln_literal_get_f64(lg[1], i), 0);
  ck_assert_double_eq_tol(kiln_literal_get_f64(lg[2], 0), 5e29, 1e24);
  ck_assert_int_eq((int)kiln_literal_get_f64(lg[3], 0), 0);
  kiln_literal_destroy(r);

  kiln_literal_destroy(rp);
  tx_free_args(args, n);
  kiln_module_destroy(p);
  kiln_module_destroy(g);
}
END_TEST

/* bf16 takes no loss scaling unless asked; vjp never does; the scale goes
 * to the grad right after the autocast only. */
START_TEST(test_loss_scaling_placement) {
  const char *a[] = {"autocast:bf16", "grad", NULL};
  kiln_module *m = tx_apply_list(loss, a, NULL);
  char *sig = tx_signature(m);
  ck_assert_str_eq(sig, "(f32[3,4], f32[2,3]) -> (f32[], f32[3,4])");
  free(sig);
  kiln_module_destroy(m);
  const char *b[] = {"autocast:f16", "vjp:wrt=0", NULL};
  m = tx_apply_list(loss, b, NULL);
  sig = tx_signature(m);
  ck_assert_str_eq(sig, "(f32[3,4], f32[2,3], f32[]) -> (f32[], f32[3,4])");
  free(sig);
  kiln_module_destroy(m);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("transform_autocast");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_spec);
  tcase_add_test(tc, test_rewrite_dense);
  tcase_add_test(tc, test_rewrite_nested_and_conv);
  tcase_add_test(tc, test_grad_of_autocast);
  tcase_add_test(tc, test_loss_scaling);
  tcase_add_test(tc, test_loss_scaling_placement);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
