/* Rematerialization under a memory budget (compiler/passes/remat.c).
 *
 * The program is the training step of a deep MLP: the gradient, by Kiln's
 * grad transform, of sum(h_L * h_L) with h_i = silu(h_{i-1} W_i + b_i).
 * Without checkpoints its backward pass keeps every layer's pre-activation
 * and sigmoid alive; per-layer checkpointing (each layer a call marked
 * _kiln_checkpoint) keeps only the layer inputs and recomputes each layer's
 * forward once. The pass must reach budgets between the smallest peak and
 * the unconstrained one: buffer assignment's own peak under the budget,
 * results bit-equal to the program without a budget (on the interpreter
 * and on the cpu backend: the recomputed values are the same operations on
 * the same inputs), and, at the checkpointed program's peak, no more extra
 * flops than checkpointing spends. A budget it cannot meet is KILN_ELIMIT
 * naming the smallest peak, which is then met; a budget above the peak
 * changes nothing. */
#include <check.h>
#include <inttypes.h>

#include "compiler/compile.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/cost.h"
#include "executor/run.h"
#include "tests/unit/test_transform_harness.h"

#define MAXL 16

/* x[32,64] through `layers` SiLU layers, loss = sum(h * h); `mark` is the
 * calls' extra attribute text. */
static char *mlp_text(int layers, const char *mark) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(
      &b, "HloModule mlp\n"
          "add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }\n"
          "layer { x = f32[32,64] parameter(0)  w = f32[64,64] parameter(1)  b = f32[64] "
          "parameter(2)\n"
          "  d = f32[32,64] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
          "  bb = f32[32,64] broadcast(b), dimensions={1}  a = f32[32,64] add(d, bb)\n"
          "  s = f32[32,64] logistic(a)  ROOT h = f32[32,64] multiply(a, s) }\n"
          "ENTRY main { h0 = f32[32,64] parameter(0)\n");
  for (int i = 1; i <= layers; i++)
    kiln_sbuf_printf(&b, "  w%d = f32[64,64] parameter(%d)  b%d = f32[64] parameter(%d)\n", i, i, i,
                     layers + i);
  for (int i = 1; i <= layers; i++)
    kiln_sbuf_printf(&b, "  h%d = f32[32,64] call(h%d, w%d, b%d), to_apply=layer%s\n", i, i - 1, i,
                     i, mark);
  kiln_sbuf_printf(&b,
                   "  sq = f32[32,64] multiply(h%d, h%d)  zero = f32[] constant(0)\n"
                   "  ROOT loss = f32[] reduce(sq, zero), dimensions={0,1}, to_apply=add }\n",
                   layers, layers);
  char *r = strdup(kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return r;
}

static kiln_module *mlp_grad(int layers, bool checkpointed) {
  char *text =
      mlp_text(layers, checkpointed ? ", frontend_attributes={_kiln_checkpoint=\"true\"}" : "");
  char spec[256] = "grad:wrt=1";
  for (int i = 2; i <= 2 * layers; i++)
    snprintf(spec + strlen(spec), sizeof spec - strlen(spec), ",%d", i);
  kiln_module *g = tx_apply(text, spec);
  free(text);
  return g;
}

/* The pipeline on a clone of m under `budget`; the module and the stats. */
static kiln_module *pipelined(const kiln_module *m, uint64_t budget, kiln_remat_stats *stats,
                              int *rc_out, kiln_status *st) {
  kiln_module *c = NULL;
  ck_assert_int_eq(kiln_module_clone(m, &c), 0);
  kiln_pipeline_options po = {
      .opt_level = 2, .verify_each = true, .memory_budget = budget, .remat = stats};
  kiln_status_clear(st);
  *rc_out = kiln_pipeline_run(c, &po, NULL, NULL, st);
  return c;
}

/* Flops of a module's ENTRY as the cost model counts them (calls
 * included). */
static double module_flops(const kiln_module *m) {
  const kiln_computation *e = kiln_module_entry(m);
  double f = 0;
  for (uint32_t i = 0; i < e->ninstrs; i++) {
    kiln_cost c;
    kiln_cost_instr(m, m->instrs[e->instrs[i]], kiln_target_default(), &c);
    f += c.flops;
  }
  return f;
}

static int compile_budget(const kiln_module *m, uint64_t budget, kiln_executable **e,
                          kiln_compile_report *rep, kiln_status *st) {
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.memory_budget = budget;
  kiln_status_clear(st);
  return kiln_compile(m, &o, e, rep, st);
}

static kiln_literal *run_cpu(const kiln_executable *e, kiln_literal **args, uint32_t n) {
  kiln_literal *out = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_run_executable(e, NULL, NULL, (const kiln_literal *const *)args, n, &out, &st);
  ck_assert_msg(rc == 0, "cpu run: %s: %s", st.where, st.msg);
  return out;
}

static void expect_bit_equal(const kiln_literal *a, const kiln_literal *b, const char *what) {
  const kiln_literal *la[2 * MAXL + 2], *lb[2 * MAXL + 2];
  uint32_t na = tx_leaves(a, la, 2 * MAXL + 2), nb = tx_leaves(b, lb, 2 * MAXL + 2);
  ck_assert_uint_eq(na, nb);
  for (uint32_t i = 0; i < na; i++) {
    int64_t bytes = kiln_shape_bytes(&la[i]->shape);
    ck_assert_int_eq(bytes, kiln_shape_bytes(&lb[i]->shape));
    ck_assert_msg(memcmp(la[i]->data, lb[i]->data, (size_t)bytes) == 0, "%s: leaf %u differs", what,
                  i);
  }
}

/* Under budgets from the checkpointed program's peak to just under the
 * unconstrained one: the peak fits, the results are bit-equal on the cpu
 * backend and on the interpreter, and at the checkpointed peak the extra
 * flops are at most checkpointing's. */
static void check_depth(int layers) {
  kiln_module *g0 = mlp_grad(layers, false), *gck = mlp_grad(layers, true);
  kiln_status st;
  kiln_executable *e0 = NULL, *eck = NULL;
  kiln_compile_report r0, rck;
  ck_assert_msg(compile_budget(g0, 0, &e0, &r0, &st) == 0, "%s", st.msg);
  ck_assert_msg(compile_budget(gck, 0, &eck, &rck, &st) == 0, "%s", st.msg);
  kiln_remat_stats s;
  int rc;
  kiln_module *p0 = pipelined(g0, 0, &s, &rc, &st), *pck = pipelined(gck, 0, &s, &rc, &st);
  double f0 = module_flops(p0), fck = module_flops(pck);
  fprintf(stderr,
          "L=%d: peak %" PRIu64 " bytes plain, %" PRIu64
          " checkpointed per layer (+%.0f flops of %.0f)\n",
          layers, r0.peak_bytes, rck.peak_bytes, fck - f0, f0);
  ck_assert_msg(rck.peak_bytes < r0.peak_bytes, "checkpointing lowers nothing");
  uint32_t n;
  kiln_literal **args = tx_params_rand(g0, 11, -0.3, 0.3, &n);
  kiln_literal *want_cpu = run_cpu(e0, args, n), *want_interp = tx_run(p0, args, n);
  uint64_t budgets[3] = {rck.peak_bytes, (rck.peak_bytes + r0.peak_bytes) / 2, r0.peak_bytes - 1};
  for (int k = 0; k < 3; k++) {
    kiln_executable *e = NULL;
    kiln_compile_report r;
    rc = compile_budget(g0, budgets[k], &e, &r, &st);
    ck_assert_msg(rc == 0, "L=%d budget %" PRIu64 ": %s: %s", layers, budgets[k], st.where, st.msg);
    fprintf(stderr,
            "  budget %" PRIu64 ": peak %" PRIu64 " -> %" PRIu64 " (%u recomputed, %u moved, +%.0f "
            "flops)\n",
            budgets[k], r.remat.peak_before, r.remat.peak_after, r.remat.recomputed, r.remat.moved,
            r.remat.extra_flops);
    ck_assert_uint_eq(r.remat.peak_before, r0.peak_bytes);
    ck_assert_uint_le(r.peak_bytes, budgets[k]);
    ck_assert_uint_eq(r.peak_bytes, r.remat.peak_after);
    if (k == 0)
      ck_assert_msg(r.remat.extra_flops <= fck - f0,
                    "L=%d: %.0f extra flops, per-layer checkpointing needs %.0f", layers,
                    r.remat.extra_flops, fck - f0);
    kiln_literal *got = run_cpu(e, args, n);
    expect_bit_equal(got, want_cpu, "cpu");
    kiln_literal_destroy(got);
    kiln_module *p = pipelined(g0, budgets[k], &s, &rc, &st);
    ck_assert_msg(rc == 0, "%s", st.msg);
    ck_assert_uint_le(s.peak_after, budgets[k]);
    got = tx_run(p, args, n);
    expect_bit_equal(got, want_interp, "interp");
    kiln_literal_destroy(got);
    kiln_module_destroy(p);
    kiln_executable_destroy(e);
  }
  kiln_literal_destroy(want_cpu);
  kiln_literal_destroy(want_interp);
  tx_free_args(args, n);
  kiln_module_destroy(p0);
  kiln_module_destroy(pck);
  kiln_executable_destroy(e0);
  kiln_executable_destroy(eck);
  kiln_module_destroy(g0);
  kiln_module_destroy(gck);
}

/* A budget under every reachable peak: KILN_ELIMIT naming the smallest
 * peak reached, which is then a budget that is met. */
START_TEST(test_unmeetable) {
  kiln_module *g = mlp_grad(12, false);
  kiln_status st;
  kiln_executable *e = NULL;
  kiln_compile_report r;
  int rc = compile_budget(g, 4096, &e, &r, &st);
  ck_assert_int_eq(rc, KILN_ELIMIT);
  ck_assert_str_eq(st.where, "memory_budget");
  fprintf(stderr, "%s\n", st.msg);
  const char *at = strstr(st.msg, "reaches ");
  ck_assert_ptr_nonnull(at);
  unsigned long long least = strtoull(at + strlen("reaches "), NULL, 10);
  ck_assert_uint_gt(least, 4096);
  ck_assert_uint_lt(least, r.remat.peak_before);
  ck_assert_uint_eq(r.remat.peak_before, r.remat.peak_before);
  rc = compile_budget(g, least, &e, &r, &st);
  ck_assert_msg(rc == 0, "the smallest peak named, %llu, is not met: %s", least, st.msg);
  ck_assert_uint_le(r.peak_bytes, least);
  kiln_executable_destroy(e);
  kiln_module_destroy(g);
}
END_TEST

/* A budget at or above the peak changes nothing: the same module out. */
START_TEST(test_budget_above_peak) {
  kiln_module *g = mlp_grad(6, false);
  kiln_status st;
  kiln_remat_stats s0, s1;
  int rc;
  kiln_module *p0 = pipelined(g, 0, &s0, &rc, &st);
  ck_assert_int_eq(rc, 0);
  ck_assert_uint_eq(s0.peak_before, 0); /* no budget: the pass does not run */
  kiln_executable *e = NULL;
  kiln_compile_report r;
  ck_assert_int_eq(compile_budget(g, 0, &e, &r, &st), 0);
  kiln_executable_destroy(e);
  kiln_module *p1 = pipelined(g, r.peak_bytes, &s1, &rc, &st);
  ck_assert_int_eq(rc, 0);
  ck_assert_uint_eq(s1.peak_before, r.peak_bytes);
  ck_assert_uint_eq(s1.peak_after, r.peak_bytes);
  ck_assert_uint_eq(s1.recomputed + s1.moved, 0);
  size_t n0, n1;
  char *t0 = kiln_module_print(p0, &n0), *t1 = kiln_module_print(p1, &n1);
  ck_assert_str_eq(t0, t1);
  kiln_free(t0);
  kiln_free(t1);
  kiln_module_destroy(p0);
  kiln_module_destroy(p1);
  kiln_module_destroy(g);
}
END_TEST

START_TEST(test_mlp_8) { check_depth(8); }
END_TEST

START_TEST(test_mlp_16) { check_depth(16); }
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("remat");
  TCase *tc = tcase_create("remat");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_unmeetable);
  tcase_add_test(tc, test_budget_above_peak);
  tcase_add_test(tc, test_mlp_8);
  tcase_add_test(tc, test_mlp_16);
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
