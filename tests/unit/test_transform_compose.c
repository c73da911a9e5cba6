/* Compositions of transforms: Hessian-vector products (jvp of grad) on a
 * quadratic form, grad of grad against finite differences, Hessians
 * (vmap of jvp of grad), per-example gradients (vmap of grad), and every
 * transform applied to the output of another, checked with the same
 * oracles as single transforms (the transformed program is printed and
 * treated as a new input). */
#include "tests/unit/test_transform_harness.h"

#define ADD_F64 "add { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT s = f64[] add(a, b) }\n"

/* The module text after applying specs (NULL-terminated). malloc'd. */
static char *after(const char *text, const char *const *specs) {
  kiln_module *m = tx_apply_list(text, specs, NULL);
  char *t = kiln_module_print(m, NULL);
  char *r = strdup(t);
  kiln_free(t);
  kiln_module_destroy(m);
  return r;
}

#define AFTER(text, ...) after(text, (const char *const[]){__VA_ARGS__, NULL})

/* f(x) = 1/2 x'Ax + b'x for a fixed A (not symmetric) and b. */
static const char *k_quad =
    "HloModule q\n" ADD_F64 "ENTRY main { x = f64[3] parameter(0)\n"
    "  a = f64[3,3] constant({{2, 1, 0}, {3, 4, -1}, {0.5, -2, 5}})  b = f64[3] constant({1, -1, "
    "2})\n"
    "  ax = f64[3] dot(a, x), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    "  q = f64[] dot(x, ax), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
    "  h = f64[] constant(0.5)  hq = f64[] multiply(h, q)\n"
    "  bx = f64[] dot(b, x), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
    "  ROOT f = f64[] add(hq, bx) }\n";

static const double k_A[3][3] = {{2, 1, 0}, {3, 4, -1}, {0.5, -2, 5}};

START_TEST(test_hvp_quadratic) {
  /* hvp = jvp(grad): (x, v) -> (f, g, g.v, Hv) with H = (A + A')/2 */
  const char *specs[] = {"grad", "jvp", NULL};
  kiln_module *m = tx_apply_list(k_quad, specs, NULL);
  char *sig = tx_signature(m);
  ck_assert_str_eq(sig, "(f64[3], f64[3]) -> (f64[], f64[3], f64[], f64[3])");
  free(sig);
  uint64_t seed = 5;
  int64_t three = 3;
  for (int trial = 0; trial < 4; trial++) {
    kiln_literal *a[2] = {tx_lit_dims(KILN_F64, &three, 1), tx_lit_dims(KILN_F64, &three, 1)};
    double x[3], v[3];
    for (int i = 0; i < 3; i++) {
      kiln_literal_set_f64(a[0], i, x[i] = tx_rand(&seed, -2, 2));
      kiln_literal_set_f64(a[1], i, v[i] = tx_rand(&seed, -2, 2));
    }
    kiln_literal *r = tx_run(m, a, 2);
    const kiln_literal *l[8];
    ck_assert_uint_eq(tx_leaves(r, l, 8), 4);
    for (int i = 0; i < 3; i++) {
      double hv = 0, g = (i == 0 ? 1 : i == 1 ? -1 : 2);
      for (int j = 0; j < 3; j++) {
        hv += 0.5 * (k_A[i][j] + k_A[j][i]) * v[j];
        g += 0.5 * (k_A[i][j] + k_A[j][i]) * x[j];
      }
      ck_assert(tx_close(kiln_literal_get_f64(l[3], i), hv, 1e-13, 1e-13));
      ck_assert(tx_close(kiln_literal_get_f64(l[1], i), g, 1e-13, 1e-13));
    }
    kiln_literal_destroy(r);
    kiln_literal_destroy(a[0]);
    kiln_literal_destroy(a[1]);
  }
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_hessian_is_vmap_of_hvp) {
  /* H = vmap(hvp, in_axes=(none, 0)) over the identity's rows */
  const char *specs[] = {"grad", "jvp", "vmap:in_axes=none,0,size=3", NULL};
  kiln_module *m = tx_apply_list(k_quad, specs, NULL);
  char *sig = tx_signature(m);
  ck_assert_str_eq(sig, "(f64[3], f64[3,3]) -> (f64[3], f64[3,3], f64[3], f64[3,3])");
  free(sig);
  int64_t three = 3, nine[2] = {3, 3};
  kiln_literal *a[2] = {tx_lit_dims(KILN_F64, &three, 1), tx_lit_dims(KILN_F64, nine, 2)};
  for (int i = 0; i < 3; i++) {
    kiln_literal_set_f64(a[0], i, 0.25 * i - 0.3);
    kiln_literal_set_f64(a[1], i * 3 + i, 1);
  }
  kiln_literal *r = tx_run(m, a, 2);
  const kiln_literal *l[8];
  ck_assert_uint_eq(tx_leaves(r, l, 8), 4);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++)
      ck_assert(tx_close(kiln_literal_get_f64(l[3], i * 3 + j), 0.5 * (k_A[i][j] + k_A[j][i]),
                         1e-13, 1e-13));
  kiln_literal_destroy(r);
  kiln_literal_destroy(a[0]);
  kiln_literal_destroy(a[1]);
  kiln_module_destroy(m);
  /* a nonlinear function: the Hessian against finite differences of its
   * gradient program, row by row */
  const char *nl =
      "HloModule n\n" ADD_F64
      "ENTRY main { x = f64[3] parameter(0)  s = f64[3] sine(x)  e = f64[3] exponential(x)\n"
      "  p = f64[3] multiply(s, e)  q = f64[3] multiply(p, x)  z = f64[] constant(0)\n"
      "  r = f64[] reduce(q, z), dimensions={0}, to_apply=add  ROOT t = f64[] tanh(r) }\n";
  kiln_module *h = tx_apply_list(nl, specs, NULL);
  const char *gs[] = {"grad", NULL};
  kiln_module *g = tx_apply_list(nl, gs, NULL);
  kiln_literal *b[2] = {tx_lit_dims(KILN_F64, &three, 1), tx_lit_dims(KILN_F64, nine, 2)};
  for (int i = 0; i < 3; i++) {
    kiln_literal_set_f64(b[0], i, 0.2 * i - 0.1);
    kiln_literal_set_f64(b[1], i * 3 + i, 1);
  }
  kiln_literal *hr = tx_run(h, b, 2);
  const kiln_literal *hl[8];
  tx_leaves(hr, hl, 8);
  for (int j = 0; j < 3; j++) {
    double eps = 1e-6, x0 = kiln_literal_get_f64(b[0], j);
    kiln_literal_set_f64(b[0], j, x0 + eps);
    kiln_literal *gp = tx_run(g, b, 1);
    kiln_literal_set_f64(b[0], j, x0 - eps);
    kiln_literal *gm = tx_run(g, b, 1);
    kiln_literal_set_f64(b[0], j, x0);
    for (int i = 0; i < 3; i++) {
      double fd = (kiln_literal_get_f64(gp->elems[1], i) - kiln_literal_get_f64(gm->elems[1], i)) /
                  (2 * eps);
      ck_assert_msg(tx_close(kiln_literal_get_f64(hl[3], j * 3 + i), fd, 1e-6, 1e-8), "H[%d][%d]",
                    j, i);
    }
    kiln_literal_destroy(gp);
    kiln_literal_destroy(gm);
  }
  kiln_literal_destroy(hr);
  kiln_literal_destroy(b[0]);
  kiln_literal_destroy(b[1]);
  kiln_module_destroy(h);
  kiln_module_destroy(g);
}
END_TEST

START_TEST(test_grad_of_grad) {
  /* f(x) = sin(x) x^3 + exp(x/2): grad:output=1 of grad is f'' */
  const char *f =
      "HloModule s\nENTRY main { x = f64[] parameter(0)  s = f64[] sine(x)  x2 = f64[] multiply(x, "
      "x)\n"
      "  x3 = f64[] multiply(x2, x)  a = f64[] multiply(s, x3)  h = f64[] constant(0.5)\n"
      "  xh = f64[] multiply(x, h)  e = f64[] exponential(xh)  ROOT r = f64[] add(a, e) }\n";
  char *g = AFTER(f, "grad");
  tx_check_grad(g, "grad:output=1", 3, -2, 2);
  /* third order, through the same door */
  char *gg = AFTER(f, "grad", "grad:output=1");
  tx_check_grad(gg, "grad:output=1", 4, -2, 2);
  free(g);
  free(gg);
  /* through a loop: grad of grad needs the trip counts of the loops the
   * first grad built */
  const char *loop =
      "HloModule l\n"
      "body { p = (s32[], f64[]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
      "  x = f64[] get-tuple-element(p), index=1  one = s32[] constant(1)  i1 = s32[] add(i, one)\n"
      "  s = f64[] sine(x)  y = f64[] multiply(s, x)  ROOT t = (s32[], f64[]) tuple(i1, y) }\n"
      "cond { p = (s32[], f64[]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
      "  n = s32[] constant(3)  ROOT c = pred[] compare(i, n), direction=LT }\n"
      "ENTRY main { x = f64[] parameter(0)  z = s32[] constant(0)  t = (s32[], f64[]) tuple(z, x)\n"
      "  l = (s32[], f64[]) while(t), condition=cond, body=body  ROOT y = f64[] "
      "get-tuple-element(l), index=1 }\n";
  char *lg = AFTER(loop, "grad");
  tx_check_grad(lg, "grad:output=1", 5, 0.5, 1.5);
  tx_check_jvp(lg, 6, 0.5, 1.5);
  free(lg);
}
END_TEST

static const char *k_loss =
    "HloModule l\n" ADD_F64 "ENTRY main { x = f64[4] parameter(0)  w = f64[4,2] parameter(1)\n"
    "  h = f64[2] dot(x, w), lhs_contracting_dims={0}, rhs_contracting_dims={0}  t = f64[2] "
    "tanh(h)\n"
    "  q = f64[2] multiply(t, t)  z = f64[] constant(0)  ROOT r = f64[] reduce(q, z), "
    "dimensions={0}, to_apply=add }\n";

START_TEST(test_vmap_of_grad) {
  /* per-example gradients: [grad, vmap] is vmap(grad(f)) */
  char *g = AFTER(k_loss, "grad:wrt=0,1");
  const int64_t in[] = {0, TX_NONE}, out[] = {0, 0, 0};
  tx_check_vmap(g, "vmap:in_axes=0,none,size=5", in, out, 9);
  const int64_t in2[] = {1, 2}, out2[] = {0, 1, 2};
  tx_check_vmap(g, "vmap:in_axes=1,2,out_axes=0,1,2,size=3", in2, out2, 10);
  free(g);
  /* and the composition applied in one go gives the same program */
  const char *specs[] = {"grad:wrt=0,1", "vmap:in_axes=0,none,size=5", NULL};
  kiln_module *m = tx_apply_list(k_loss, specs, NULL);
  char *sig = tx_signature(m);
  ck_assert_str_eq(sig, "(f64[5,4], f64[4,2]) -> (f64[5], f64[5,4], f64[5,4,2])");
  free(sig);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_transforms_of_transforms) {
  /* jvp and vjp of a batched program; vmap of jvp and vjp programs */
  char *v = AFTER(k_loss, "vmap:in_axes=0,none,size=3");
  tx_check_jvp(v, 11, -1, 1);
  tx_check_vjp_dot(v, 12, -1, 1);
  free(v);
  char *j = AFTER(k_loss, "jvp");
  const int64_t in[] = {0, TX_NONE, 0, TX_NONE}, out[] = {0, 0};
  tx_check_vmap(j, "vmap:in_axes=0,none,0,none,size=3", in, out, 13);
  tx_check_jvp(j, 14, -1, 1); /* second-order forward */
  free(j);
  char *vj = AFTER(k_loss, "vjp");
  const int64_t in3[] = {TX_NONE, 0, 0}, out3[] = {0, 0, 0};
  tx_check_vmap(vj, "vmap:in_axes=none,0,0,size=4", in3, out3, 15);
  tx_check_vjp_dot(vj, 16, -1, 1);
  free(vj);
  /* checkpoint composes: the same gradients inside vmap */
  const char *ck[] = {"checkpoint", "grad:wrt=1", "vmap:in_axes=0,none,size=2", NULL};
  const char *pl[] = {"grad:wrt=1", "vmap:in_axes=0,none,size=2", NULL};
  kiln_module *a = tx_apply_list(k_loss, ck, NULL), *b = tx_apply_list(k_loss, pl, NULL);
  uint32_t n;
  kiln_literal **args = tx_params_rand(a, 17, -1, 1, &n);
  kiln_literal *ra = tx_run(a, args, n), *rb = tx_run(b, args, n);
  const kiln_literal *la[4], *lb[4];
  tx_leaves(ra, la, 4);
  tx_leaves(rb, lb, 4);
  tx_expect_lit_close(la[1], lb[1], 1e-13, 1e-13, "checkpointed per-example gradient");
  kiln_literal_destroy(ra);
  kiln_literal_destroy(rb);
  tx_free_args(args, n);
  kiln_module_destroy(a);
  kiln_module_destroy(b);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("transform_compose");
  TCase *tc = tcase_create("compose");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_hvp_quadratic);
  tcase_add_test(tc, test_hessian_is_vmap_of_hvp);
  tcase_add_test(tc, test_grad_of_grad);
  tcase_add_test(tc, test_vmap_of_grad);
  tcase_add_test(tc, test_transforms_of_transforms);
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
