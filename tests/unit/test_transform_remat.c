/* Checkpointing as memory, not just as a count: the gradient of an MLP with
 * every layer checkpointed is compiled by the whole pipeline (fusion,
 * layout, scheduling, buffer assignment) and must need strictly fewer peak
 * temporary bytes than the same gradient without checkpoints, while the
 * interpreter gives the same gradients for both. */
#include "compiler/compile.h"
#include "tests/unit/test_transform_harness.h"

#define NLAYERS 4

/* x[64,128] through NLAYERS SiLU layers h = a * logistic(a), a = h W + b,
 * loss = sum(h * h). Without checkpoints the backward pass keeps a and
 * logistic(a) of every layer alive; with them it keeps only the layer
 * inputs and recomputes one layer at a time. `mark` is the call's extra
 * attribute text. */
static char *mlp_text(const char *mark) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(
      &b, "HloModule mlp\n"
          "add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }\n"
          "layer { x = f32[64,128] parameter(0)  w = f32[128,128] parameter(1)  b = f32[128] "
          "parameter(2)\n"
          "  d = f32[64,128] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
          "  bb = f32[64,128] broadcast(b), dimensions={1}  a = f32[64,128] add(d, bb)\n"
          "  s = f32[64,128] logistic(a)  ROOT h = f32[64,128] multiply(a, s) }\n"
          "ENTRY main { h0 = f32[64,128] parameter(0)\n");
  for (int i = 1; i <= NLAYERS; i++)
    kiln_sbuf_printf(&b, "  w%d = f32[128,128] parameter(%d)  b%d = f32[128] parameter(%d)\n", i, i,
                     i, NLAYERS + i);
  for (int i = 1; i <= NLAYERS; i++)
    kiln_sbuf_printf(&b, "  h%d = f32[64,128] call(h%d, w%d, b%d), to_apply=layer%s\n", i, i - 1, i,
                     i, mark);
  kiln_sbuf_printf(&b,
                   "  sq = f32[64,128] multiply(h%d, h%d)  zero = f32[] constant(0)\n"
                   "  ROOT loss = f32[] reduce(sq, zero), dimensions={0,1}, to_apply=add }\n",
                   NLAYERS, NLAYERS);
  char *r = strdup(kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return r;
}

static uint64_t compiled_peak(const kiln_module *m) {
  kiln_executable *e = NULL;
  kiln_compile_report rep;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_compile(m, NULL, &e, &rep, &st);
  ck_assert_msg(rc == 0, "compile: %s: %s", st.where, st.msg);
  kiln_executable_destroy(e);
  return rep.peak_bytes;
}

START_TEST(test_checkpoint_lowers_peak_bytes) {
  char *plain = mlp_text(""), *ck = mlp_text(", frontend_attributes={_kiln_checkpoint=\"true\"}");
  const char *spec = "grad:wrt=1,2,3,4,5,6,7,8";
  kiln_module *g0 = tx_apply(plain, spec), *g1 = tx_apply(ck, spec);
  uint32_t n;
  kiln_literal **args = tx_params_rand(g0, 7, -0.2, 0.2, &n);
  kiln_literal *r0 = tx_run(g0, args, n), *r1 = tx_run(g1, args, n);
  const kiln_literal *l0[16], *l1[16];
  ck_assert_uint_eq(tx_leaves(r0, l0, 16), 1 + 2 * NLAYERS);
  ck_assert_uint_eq(tx_leaves(r1, l1, 16), 1 + 2 * NLAYERS);
  /* The same operations on the same values: equal up to f32 summation order. */
  for (int i = 0; i < 1 + 2 * NLAYERS; i++)
    tx_expect_lit_close(l1[i], l0[i], 1e-5, 1e-7, "checkpointed gradient");
  uint64_t p0 = compiled_peak(g0), p1 = compiled_peak(g1);
  fprintf(stderr, "mlp grad peak bytes: %llu without checkpoints, %llu with\n",
          (unsigned long long)p0, (unsigned long long)p1);
  ck_assert_msg(p1 < p0, "checkpointed peak %llu is not below %llu", (unsigned long long)p1,
                (unsigned long long)p0);
  kiln_literal_destroy(r0);
  kiln_literal_destroy(r1);
  tx_free_args(args, n);
  kiln_module_destroy(g0);
  kiln_module_destroy(g1);
  free(plain);
  free(ck);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("transform_remat");
  TCase *tc = tcase_create("remat");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_checkpoint_lowers_peak_bytes);
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
