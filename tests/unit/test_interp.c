/* Unit tests for the reference interpreter: control flow, data movement,
 * reductions, contractions and the corpus modules with stated results.
 * (Elementwise numerics live in test_interp_numerics.c.) Each test parses
 * HLO text, runs the ENTRY computation on literal arguments given as text
 * and compares the printed result with the expected text exactly. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/test_interp_harness.h"

/* ---- corpus modules with stated results --------------------------------- */

START_TEST(test_corpus_040_while_fusion) {
  corpus_expect("040_while_fusion_cpu.hlo", "s32[] 3", NULL);
}
END_TEST

START_TEST(test_corpus_041_conditional_token) {
  corpus_expect("041_conditional_token_pred.hlo", "s32[] 42", "pred[] true", NULL);
  corpus_expect("041_conditional_token_pred.hlo", "s32[] 7", "pred[] false", NULL);
}
END_TEST

START_TEST(test_corpus_042_while_dynamic_stack) {
  corpus_expect("042_while_dynamic_stack.hlo", "s32[2] {3, 3}", NULL);
}
END_TEST

START_TEST(test_corpus_043_conditional_dynamic) {
  corpus_expect("043_conditional_dynamic_dim.hlo", "s32[2] {4, 8}",
                "s32[3,2] {{0, 1}, {2, 3}, {4, 5}}", NULL);
}
END_TEST

START_TEST(test_corpus_067_068_bf16_reduce) {
  corpus_expect("067_bf16_reduce_sum.hlo", "bf16[] 44", "bf16[4] {1, 3, -2, 42}", NULL);
  corpus_expect("068_mixed_precision_reduce_f32_to_bf16.hlo", "bf16[] 44", "f32[4] {1, 3, -2, 42}",
                NULL);
}
END_TEST

START_TEST(test_corpus_069_slice_layouts) {
  corpus_expect("069_slice_nondefault_layouts.hlo",
                "f32[2,2,2] {{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}}",
                "f32[2,2,2] {{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}}", NULL);
}
END_TEST

START_TEST(test_corpus_070_async_sugar) {
  corpus_expect("070_async_negate_start_update_done.hlo", "f32[] -42", NULL);
}
END_TEST

START_TEST(test_corpus_072_prefix_sum) {
  char *text = corpus_read("072_reduce_window_prefix_sum_s32.hlo");
  if (text == NULL) return;
  kiln_module *m = parse_ok(text);
  kiln_shape s = {.dtype = KILN_S32, .rank = 1, .dims = (int64_t[]){8192}};
  kiln_literal *arg = NULL, *res = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &arg, NULL), 0);
  for (int i = 0; i < 8192; i++) kiln_literal_set_s64(arg, i, 1);
  kiln_status st;
  kiln_status_clear(&st);
  const kiln_literal *args[1] = {arg};
  ck_assert_msg(kiln_interp_run(m, args, 1, NULL, &res, &st) == 0, "%s", st.msg);
  for (int i = 0; i < 8192; i++) ck_assert_int_eq(kiln_literal_get_s64(res, i), i + 1);
  kiln_literal_destroy(res);
  kiln_literal_destroy(arg);
  kiln_module_destroy(m);
  free(text);
}
END_TEST

START_TEST(test_corpus_073_to_076) {
  corpus_expect("073_add_dependency_token.hlo", "f32[] -156", "f32[] 10", "f32[] 3", NULL);
  corpus_expect("074_bitcast_constant_call.hlo", "s32[] 1", "s32[] 1", NULL);
  corpus_expect("075_bitcast_after_gte_tuple.hlo", "(f32[1,3]) ({{1, 2, 3}})",
                "(f32[3]) ({1, 2, 3})", NULL);
  corpus_expect("076_mof_bitcast_compatible.hlo", "f32[4] {0, 4, 9, 1}", "f32[4] {1, 2, 3, -1}",
                NULL);
}
END_TEST

START_TEST(test_corpus_082_pred_max_truth_table) {
  corpus_expect("082_pred_maximum.hlo", "pred[] false", "pred[] false", "pred[] false", NULL);
  corpus_expect("082_pred_maximum.hlo", "pred[] true", "pred[] false", "pred[] true", NULL);
  corpus_expect("082_pred_maximum.hlo", "pred[] true", "pred[] true", "pred[] false", NULL);
  corpus_expect("082_pred_maximum.hlo", "pred[] true", "pred[] true", "pred[] true", NULL);
}
END_TEST

/* ---- control flow ------------------------------------------------------- */

START_TEST(test_while_counts) {
  expect(
      "HloModule m\n"
      "cond { p = (s32[], s32[]) parameter(0)\n i = s32[] get-tuple-element(p), index=0\n"
      " n = s32[] constant(5)\n ROOT lt = pred[] compare(i, n), direction=LT }\n"
      "body { p = (s32[], s32[]) parameter(0)\n i = s32[] get-tuple-element(p), index=0\n"
      " a = s32[] get-tuple-element(p), index=1\n one = s32[] constant(1)\n"
      " i1 = s32[] add(i, one)\n a1 = s32[] multiply(a, i1)\n ROOT t = (s32[], s32[]) tuple(i1, "
      "a1) }\n"
      "ENTRY e { z = s32[] constant(0)\n o = s32[] constant(1)\n t = (s32[], s32[]) tuple(z, o)\n"
      " ROOT w = (s32[], s32[]) while(t), condition=cond, body=body }\n",
      "(s32[], s32[]) (5, 120)", NULL);
}
END_TEST

static const char *const forever =
    "HloModule m\n"
    "cond { p = s32[] parameter(0)\n ROOT t = pred[] constant(true) }\n"
    "body { p = s32[] parameter(0)\n one = s32[] constant(1)\n ROOT a = s32[] add(p, one) }\n"
    "ENTRY e { z = s32[] constant(0)\n ROOT w = s32[] while(z), condition=cond, body=body }\n";

START_TEST(test_while_iteration_limit) {
  kiln_interp_options o = {.max_while_iterations = 1000};
  expect_fail_opts(forever, &o, KILN_ELIMIT, "while w: still running after 1000 iterations", NULL);
}
END_TEST

START_TEST(test_while_timeout) {
  kiln_interp_options o = {.timeout_seconds = 0.2};
  expect_fail_opts(forever, &o, KILN_ELIMIT, "time limit", NULL);
}
END_TEST

/* A raised cancel flag stops evaluation at the next check, with the time
 * limit's place and its own code. */
START_TEST(test_while_cancel) {
  static atomic_int cancel = 1;
  kiln_interp_options o = {.cancel = &cancel};
  expect_fail_opts(forever, &o, KILN_ECANCELED, "evaluation cancelled", NULL);
}
END_TEST

START_TEST(test_conditional_indexed) {
  const char *hlo = "HloModule m\n"
                    "b0 { p = f32[] parameter(0)\n ROOT n = f32[] negate(p) }\n"
                    "b1 { p = f32[] parameter(0)\n ROOT n = f32[] add(p, p) }\n"
                    "b2 { p = f32[] parameter(0)\n ROOT n = f32[] multiply(p, p) }\n"
                    "ENTRY e { i = s32[] parameter(0)\n x = f32[] constant(3)\n"
                    " ROOT c = f32[] conditional(i, x, x, x), branch_computations={b0, b1, b2} }\n";
  expect(hlo, "f32[] -3", "s32[] 0", NULL);
  expect(hlo, "f32[] 6", "s32[] 1", NULL);
  expect(hlo, "f32[] 9", "s32[] 2", NULL);
  expect(hlo, "f32[] 9", "s32[] 7", NULL); /* out of range: the last branch */
  expect(hlo, "f32[] 9", "s32[] -1", NULL);
}
END_TEST

START_TEST(test_call_and_async_generic) {
  expect(
      "HloModule m\n"
      "f { a = f32[2] parameter(0)\n b = f32[2] parameter(1)\n ROOT s = f32[2] subtract(a, b) }\n"
      "ENTRY e { x = f32[2] parameter(0)\n y = f32[2] constant({1, 1})\n"
      " c = f32[2] call(x, y), to_apply=f\n"
      " s = ((f32[2], f32[2]), f32[2], s32[]) async-start(c, y), calls=f\n"
      " u = ((f32[2], f32[2]), f32[2], s32[]) async-update(s)\n"
      " ROOT d = f32[2] async-done(u) }\n",
      "f32[2] {3, 8}", "f32[2] {5, 10}", NULL);
}
END_TEST

START_TEST(test_copy_start_done_barrier_domain) {
  expect("HloModule m\n"
         "ENTRY e { x = f32[2] parameter(0)\n"
         " s = (f32[2], f32[2], u32[]) copy-start(x)\n d = f32[2] copy-done(s)\n"
         " t = (f32[2]) tuple(d)\n b = (f32[2]) opt-barrier(t)\n g = f32[2] get-tuple-element(b), "
         "index=0\n"
         " ROOT o = f32[2] domain(g), domain={kind=\"sharding\", entry={maximal device=0}, "
         "exit={replicated}} }\n",
         "f32[2] {1.5, 2}", "f32[2] {1.5, 2}", NULL);
}
END_TEST

START_TEST(test_call_depth_limit) {
  expect_fail("HloModule m\n"
              "f { p = s32[] parameter(0)\n ROOT c = s32[] call(p), to_apply=f }\n"
              "ENTRY e { x = s32[] parameter(0)\n ROOT c = s32[] call(x), to_apply=f }\n",
              KILN_ELIMIT, "nest deeper", "s32[] 1", NULL);
}
END_TEST

START_TEST(test_live_bytes_limit) {
  kiln_interp_options o = {.max_live_bytes = 1000};
  expect_fail_opts(
      "HloModule m\n"
      "ENTRY e { x = f32[] parameter(0)\n ROOT b = f32[1000] broadcast(x), dimensions={} }\n",
      &o, KILN_ELIMIT, "e/b: b: result f32[1000] needs 4000 bytes", "f32[] 1", NULL);
  /* Dead values are freed as soon as their last user ran: a chain of
   * 400-byte values fits in 1000 bytes. */
  expect_opts("HloModule m\n"
              "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b) }\n"
              "ENTRY e { x = f32[] parameter(0)\n z = f32[] constant(0)\n"
              " a = f32[100] broadcast(x), dimensions={}\n b = f32[100] negate(a)\n"
              " c = f32[100] negate(b)\n d = f32[100] negate(c)\n"
              " ROOT r = f32[] reduce(d, z), dimensions={0}, to_apply=add }\n",
              &o, "f32[] -100", "f32[] 1", NULL);
}
END_TEST

START_TEST(test_unsupported_ops_named) {
  expect_fail("HloModule m\nENTRY e { t = token[] after-all()\n"
              " ROOT i = ((f32[2]), token[]) infeed(t) }\n",
              KILN_EUNIMPL, "infeed i: host and peer channels", NULL);
  expect_fail("HloModule m\nENTRY e { x = f32[2] parameter(0)\n"
              " ROOT c = f32[2] custom-call(x), custom_call_target=\"my_kernel\" }\n",
              KILN_EUNIMPL, "custom-call c: target \"my_kernel\" is not built in", "f32[2] {1, 2}",
              NULL);
  expect_fail(
      "HloModule m, replica_count=2\nadd { a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
      " ROOT s = f32[] add(a, b) }\n"
      "ENTRY e { x = f32[2] parameter(0)\n"
      " ROOT r = f32[2] all-reduce(x), replica_groups={{0,1}}, to_apply=add }\n",
      KILN_EUNIMPL, "all-reduce r: replica group of 2", "f32[2] {1, 2}", NULL);
}
END_TEST

START_TEST(test_entry_argument_checks) {
  expect_fail("HloModule m\nENTRY e { x = f32[2] parameter(0)\n ROOT n = f32[2] negate(x) }\n",
              KILN_EINVAL, "argument 0 has shape f32[3]; parameter x is f32[2]", "f32[3] {1, 2, 3}",
              NULL);
  expect_fail("HloModule m\nENTRY e { x = f32[2] parameter(0)\n ROOT n = f32[2] negate(x) }\n",
              KILN_EINVAL, "takes 1 parameter(s), 0 given", NULL);
}
END_TEST

/* ---- single-replica collectives, ids, custom calls ------------------------ */

START_TEST(test_single_replica_collectives) {
  const char *hlo =
      "HloModule m\n"
      "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b) }\n"
      "ENTRY e { x = f32[2] parameter(0)\n"
      " ar = f32[2] all-reduce(x), replica_groups={}, to_apply=add\n"
      " ag = f32[2] all-gather(ar), replica_groups={{0}}, dimensions={0}\n"
      " rs = f32[2] reduce-scatter(ag), replica_groups={{0}}, dimensions={0}, to_apply=add\n"
      " a2a = f32[2] all-to-all(rs), replica_groups={{0}}, dimensions={0}\n"
      " cp = f32[2] collective-permute(a2a), source_target_pairs={{0,0}}\n"
      " ars = f32[2] all-reduce-start(cp), replica_groups={{0}}, to_apply=add\n"
      " ard = f32[2] all-reduce-done(ars)\n"
      " ROOT cb = f32[2] collective-broadcast(ard), replica_groups={{0}} }\n";
  expect(hlo, "f32[2] {1, 2}", "f32[2] {1, 2}", NULL);
  expect("HloModule m\nENTRY e { x = f32[2] parameter(0)\n"
         " ROOT cp = f32[2] collective-permute(x), source_target_pairs={} }\n",
         "f32[2] {0, 0}", "f32[2] {1, 2}", NULL);
  kiln_interp_options o = {.replica_id = 3, .partition_id = 5};
  expect_opts("HloModule m\nENTRY e { r = u32[] replica-id()\n p = u32[] partition-id()\n"
              " ROOT t = (u32[], u32[]) tuple(r, p) }\n",
              &o, "(u32[], u32[]) (3, 5)", NULL);
  expect("HloModule m\nENTRY e { x = f32[2] parameter(0)\n"
         " a = f32[2] custom-call(x), custom_call_target=\"Sharding\", sharding={replicated}\n"
         " b = f32[2] custom-call(a), custom_call_target=\"SPMDFullToShardShape\"\n"
         " ROOT c = f32[2] custom-call(b), custom_call_target=\"SPMDShardToFullShape\" }\n",
         "f32[2] {1, 2}", "f32[2] {1, 2}", NULL);
}
END_TEST

START_TEST(test_out_of_memory_anywhere) {
  /* Fail the n-th allocation for every n: each run either succeeds or
   * reports KILN_ENOMEM, never crashes or leaks (the ASan build checks). */
  kiln_module *m = parse_ok(
      "HloModule m\n"
      "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n c = f32[] call(a, b), to_apply=add2 "
      "\n"
      " ROOT s = f32[] add(c, b) }\n"
      "add2 { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b) }\n"
      "cond { p = (s32[], f32[3]) parameter(0)\n i = s32[] get-tuple-element(p), index=0\n"
      " n = s32[] constant(3)\n ROOT lt = pred[] compare(i, n), direction=LT }\n"
      "body { p = (s32[], f32[3]) parameter(0)\n i = s32[] get-tuple-element(p), index=0\n"
      " v = f32[3] get-tuple-element(p), index=1\n one = s32[] constant(1)\n"
      " i1 = s32[] add(i, one)\n z = f32[] constant(0)\n"
      " r = f32[] reduce(v, z), dimensions={0}, to_apply=add\n b = f32[3] broadcast(r), "
      "dimensions={}\n"
      " w = f32[3] add(v, b)\n ROOT t = (s32[], f32[3]) tuple(i1, w) }\n"
      "ENTRY e { x = f32[3] parameter(0)\n z = s32[] constant(0)\n"
      " t = (s32[], f32[3]) tuple(z, x)\n"
      " w = (s32[], f32[3]) while(t), condition=cond, body=body\n"
      " ROOT g = f32[3] get-tuple-element(w), index=1 }\n");
  kiln_shape s = {.dtype = KILN_F32, .rank = 1, .dims = (int64_t[]){3}};
  kiln_literal *arg = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &arg, NULL), 0);
  for (int i = 0; i < 3; i++) kiln_literal_set_f64(arg, i, i + 1);
  const kiln_literal *args[1] = {arg};
  int ok = 0;
  for (long n = 1; n < 400; n++) {
    kiln_literal *res = NULL;
    kiln_status st;
    kiln_status_clear(&st);
    kiln_alloc_fail_after(n);
    int rc = kiln_interp_run(m, args, 1, NULL, &res, &st);
    kiln_alloc_fail_after(0);
    ck_assert_msg(rc == 0 || rc == KILN_ENOMEM, "n=%ld: %s %s", n, kiln_err_name(rc), st.msg);
    if (rc == 0) {
      ok++;
      /* the reducer adds twice its element: +12, +84, +588 */
      ck_assert_double_eq(kiln_literal_get_f64(res, 0), 685);
      ck_assert_double_eq(kiln_literal_get_f64(res, 2), 687);
    }
    kiln_literal_destroy(res);
  }
  ck_assert_int_gt(ok, 0);
  kiln_literal_destroy(arg);
  kiln_module_destroy(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("interp");
  TCase *tc = tcase_create("corpus");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_corpus_040_while_fusion);
  tcase_add_test(tc, test_corpus_041_conditional_token);
  tcase_add_test(tc, test_corpus_042_while_dynamic_stack);
  tcase_add_test(tc, test_corpus_043_conditional_dynamic);
  tcase_add_test(tc, test_corpus_067_068_bf16_reduce);
  tcase_add_test(tc, test_corpus_069_slice_layouts);
  tcase_add_test(tc, test_corpus_070_async_sugar);
  tcase_add_test(tc, test_corpus_072_prefix_sum);
  tcase_add_test(tc, test_corpus_073_to_076);
  tcase_add_test(tc, test_corpus_082_pred_max_truth_table);
  suite_add_tcase(s, tc);
  tc = tcase_create("control");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_while_counts);
  tcase_add_test(tc, test_while_iteration_limit);
  tcase_add_test(tc, test_while_timeout);
  tcase_add_test(tc, test_while_cancel);
  tcase_add_test(tc, test_conditional_indexed);
  tcase_add_test(tc, test_call_and_async_generic);
  tcase_add_test(tc, test_copy_start_done_barrier_domain);
  tcase_add_test(tc, test_call_depth_limit);
  tcase_add_test(tc, test_live_bytes_limit);
  tcase_add_test(tc, test_unsupported_ops_named);
  tcase_add_test(tc, test_entry_argument_checks);
  tcase_add_test(tc, test_single_replica_collectives);
  tcase_add_test(tc, test_out_of_memory_anywhere);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
