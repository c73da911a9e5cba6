/* Transforms of random programs from the generator (tests/support/progen):
 * gradients and forward derivatives against central finite differences in
 * f64, vjp against jvp by the dot-product identity, and vmap against
 * stacking the program over the batch with random in_axes/out_axes. A
 * failing seed prints its program; KILN_PROGEN_SEEDS sets how many seeds
 * each test runs (default 100). */
#include "tests/support/progen.h"
#include "tests/unit/test_transform_harness.h"

static int nseeds(void) {
  const char *e = getenv("KILN_PROGEN_SEEDS");
  int n = e ? atoi(e) : 100;
  return n > 0 ? n : 100;
}

static char *program(uint64_t seed, bool diff, bool scalar, int nparams, kiln_dtype t) {
  kiln_progen_options o = {.seed = seed,
                           .ninstrs = 10 + (int)(seed % 8),
                           .nparams = nparams,
                           .dtype = t,
                           .families = 0,
                           .differentiable = diff,
                           .scalar_output = scalar,
                           .max_dim = 3};
  char *text = kiln_progen_text(&o);
  ck_assert_ptr_nonnull(text);
  if (getenv("KILN_PROGEN_PRINT"))
    fprintf(stderr, "seed %llu:\n%s\n", (unsigned long long)seed, text);
  return text;
}

START_TEST(test_random_grad) {
  for (int s = 1; s <= nseeds(); s++) {
    int np = 1 + s % 3;
    char *text = program(1000 + s, true, true, np, KILN_F64);
    char spec[64] = "grad:wrt=0";
    for (int i = 1; i < np; i++)
      snprintf(spec + strlen(spec), sizeof spec - strlen(spec), ",%d", i);
    tx_case = text;
    tx_check_grad(text, spec, s, -1, 1);
    kiln_free(text);
  }
}
END_TEST

START_TEST(test_random_jvp_and_vjp) {
  for (int s = 1; s <= nseeds(); s++) {
    char *text = program(2000 + s, true, false, 1 + s % 3, KILN_F64);
    tx_case = text;
    tx_check_jvp(text, s, -1, 1);
    tx_check_vjp_dot(text, s, -1, 1);
    kiln_free(text);
  }
}
END_TEST

/* A random in_axes per parameter (at least one batched) and out_axes per
 * output. */
static void random_vmap(uint64_t pseed, bool diff) {
  char *text = program(pseed, diff, false, 1 + pseed % 3, KILN_F64);
  kiln_module *m = tx_parse(text);
  const kiln_computation *e = kiln_module_entry(m);
  uint32_t np = kiln_computation_nparams(m, e);
  uint32_t nl = 1;
  const kiln_shape *rs = &kiln_computation_root(m, e)->shape;
  if (kiln_shape_is_tuple(rs)) nl = rs->rank; /* progen roots are flat */
  uint64_t r = pseed * 31 + 7;
  int64_t in[TX_MAX], out[64];
  char spec[512];
  int o = snprintf(spec, sizeof spec, "vmap:in_axes=");
  bool any = false;
  for (uint32_t i = 0; i < np; i++) {
    const kiln_shape *ps = &kiln_computation_param(m, e, i)->shape;
    int pick = (int)tx_rand(&r, 0, 3);
    if (i == np - 1 && !any) pick = 1;
    in[i] = pick == 0 ? TX_NONE : pick == 1 ? 0 : (int64_t)ps->rank; /* none, first, last */
    any |= in[i] != TX_NONE;
    o += in[i] == TX_NONE
             ? snprintf(spec + o, sizeof spec - o, "%snone", i ? "," : "")
             : snprintf(spec + o, sizeof spec - o, "%s%lld", i ? "," : "", (long long)in[i]);
  }
  o += snprintf(spec + o, sizeof spec - o, ",out_axes=");
  for (uint32_t j = 0; j < nl && j < 64; j++) {
    out[j] = tx_rand(&r, 0, 2) < 1 ? 0 : -1;
    o += snprintf(spec + o, sizeof spec - o, "%s%lld", j ? "," : "", (long long)out[j]);
  }
  snprintf(spec + o, sizeof spec - o, ",size=%d", 2 + (int)(pseed % 2));
  tx_case = text;
  tx_check_vmap(text, spec, in, out, pseed);
  kiln_module_destroy(m);
  kiln_free(text);
}

START_TEST(test_random_vmap) {
  for (int s = 1; s <= nseeds(); s++) {
    random_vmap(3000 + s, false);
    random_vmap(4000 + s, true);
  }
}
END_TEST

START_TEST(test_random_vmap_of_grad) {
  for (int s = 1; s <= nseeds() / 4 + 1; s++) {
    char *text = program(5000 + s, true, true, 2, KILN_F64);
    const char *specs[] = {"grad:wrt=0,1", NULL};
    kiln_module *g = tx_apply_list(text, specs, NULL);
    char *gt = kiln_module_print(g, NULL);
    const int64_t in[] = {0, TX_NONE}, out[] = {0, 0, 0};
    tx_case = text;
    tx_check_vmap(gt, "vmap:in_axes=0,none,size=2", in, out, s);
    kiln_free(gt);
    kiln_module_destroy(g);
    kiln_free(text);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("transform_random");
  TCase *tc = tcase_create("random");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_random_grad);
  tcase_add_test(tc, test_random_jvp_and_vjp);
  tcase_add_test(tc, test_random_vmap);
  tcase_add_test(tc, test_random_vmap_of_grad);
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
