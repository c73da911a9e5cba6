/* Unit tests for the rewriting helpers (users, replacement, compaction,
 * sorting, cloning, call-graph order), the pass manager and DCE. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/pass.h"

static kiln_module *parse(const char *text) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  int rc = kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st);
  ck_assert_msg(rc == 0, "%s: %s", st.where, st.msg);
  return m;
}

static char *print(const kiln_module *m) { return kiln_module_print(m, NULL); }

static kiln_instr *find(const kiln_module *m, const char *name) {
  for (uint32_t i = 0; i < m->ninstrs; i++)
    if (strcmp(m->instrs[i]->name, name) == 0) return m->instrs[i];
  ck_abort_msg("no instruction %s", name);
  return NULL;
}

static const char *k_mod =
    "HloModule m\n"
    "add { x = f32[] parameter(0)  y = f32[] parameter(1)  ROOT s = f32[] add(x, y) }\n"
    "ENTRY main {\n"
    "  p = f32[4] parameter(0)\n"
    "  n = f32[4] negate(p)\n"
    "  dead = f32[4] exponential(n)\n"
    "  dead2 = f32[4] add(dead, dead)\n"
    "  z = f32[] constant(0)\n"
    "  ROOT r = f32[] reduce(n, z), dimensions={0}, to_apply=add\n"
    "}\n";

START_TEST(test_users_and_replace) {
  kiln_module *m = parse(k_mod);
  kiln_users *u;
  ck_assert_int_eq(kiln_users_build(m, &u), 0);
  uint32_t n;
  const kiln_id *us = kiln_users_of(u, find(m, "dead")->id, &n);
  ck_assert_uint_eq(n, 2);
  ck_assert_uint_eq(us[0], find(m, "dead2")->id);
  us = kiln_users_of(u, find(m, "n")->id, &n);
  ck_assert_uint_eq(n, 2);
  kiln_users_destroy(u);
  kiln_instr *p = find(m, "p"), *neg = find(m, "n");
  kiln_replace_all_uses(m, neg->comp, neg->id, p->id);
  ck_assert_uint_eq(find(m, "r")->operands[0], p->id);
  ck_assert_uint_eq(find(m, "dead")->operands[0], p->id);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_dce_pipeline) {
  kiln_module *m = parse(k_mod);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_pipeline_options o = {0};
  o.verify_each = true;
  o.opt_level = 2;
  kiln_pass_timing t[32];
  uint32_t nt = 32;
  int prc = kiln_pipeline_run(m, &o, t, &nt, &st);
  ck_assert_msg(prc == 0, "%s: %s", st.where, st.msg);
  ck_assert_uint_ge(nt, 1);
  char *txt = print(m);
  ck_assert_ptr_null(strstr(txt, "dead"));
  ck_assert_ptr_nonnull(strstr(txt, "negate"));
  kiln_free(txt);
  ck_assert_int_eq(kiln_module_verify(m, NULL, &st), 0);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_dce_keeps_side_effects) {
  kiln_module *m = parse(
      "HloModule m\n"
      "ENTRY main {\n"
      "  p = f32[2] parameter(0)\n"
      "  t = token[] after-all()\n"
      "  o = token[] outfeed(p, t), outfeed_shape=f32[2]{0}\n"
      "  c = f32[2] custom-call(p), custom_call_target=\"foo\", custom_call_has_side_effect=true\n"
      "  d = f32[2] custom-call(p), custom_call_target=\"bar\"\n"
      "  ROOT r = f32[2] negate(p)\n"
      "}\n");
  kiln_status st;
  kiln_status_clear(&st);
  kiln_pass_ctx ctx = {kiln_target_default(), NULL, &st, 2, 0, NULL};
  ck_assert_int_eq(kiln_pipeline_find("dce")->run(m, &ctx), 0);
  char *txt = print(m);
  ck_assert_ptr_nonnull(strstr(txt, "outfeed"));
  ck_assert_ptr_nonnull(strstr(txt, "\"foo\""));
  ck_assert_ptr_null(strstr(txt, "\"bar\""));
  kiln_free(txt);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_clone_module_prints_same) {
  kiln_module *m = parse(k_mod);
  kiln_module *c;
  ck_assert_int_eq(kiln_module_clone(m, &c), 0);
  char *a = print(m), *b = print(c);
  ck_assert_str_eq(a, b);
  kiln_free(a);
  kiln_free(b);
  kiln_module_destroy(m);
  kiln_module_destroy(c);
}
END_TEST

START_TEST(test_clone_computation_and_sort) {
  kiln_module *m = parse(k_mod);
  uint32_t nc;
  ck_assert_int_eq(kiln_computation_clone(m, 0, "add2", &nc), 0);
  kiln_computation *c2 = m->comps[nc];
  ck_assert_uint_eq(c2->ninstrs, 3);
  ck_assert_str_eq(kiln_computation_root(m, c2)->name, "s");
  ck_assert_uint_eq(kiln_computation_root(m, c2)->operands[1], c2->instrs[1]);
  /* Reverse the entry's order, then sort: operands come first again. */
  kiln_computation *e = kiln_module_entry(m);
  for (uint32_t i = 0; i < e->ninstrs / 2; i++) {
    kiln_id t = e->instrs[i];
    e->instrs[i] = e->instrs[e->ninstrs - 1 - i];
    e->instrs[e->ninstrs - 1 - i] = t;
  }
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_computation_sort(m, e->id, &st), 0);
  ck_assert_int_eq(kiln_module_verify(m, NULL, &st), 0);
  /* A cycle is reported, not looped on. */
  find(m, "n")->operands[0] = find(m, "dead")->id;
  ck_assert_int_eq(kiln_computation_sort(m, e->id, &st), KILN_EINVAL);
  ck_assert_ptr_nonnull(strstr(st.msg, "cycle in computation main"));
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_post_order_and_dot) {
  kiln_module *m = parse(k_mod);
  uint32_t *order, n;
  ck_assert_int_eq(kiln_module_post_order(m, &order, &n), 0);
  ck_assert_uint_eq(n, 2);
  ck_assert_str_eq(m->comps[order[0]]->name, "add");
  ck_assert_str_eq(m->comps[order[1]]->name, "main");
  kiln_free(order);
  size_t len;
  char *dot = kiln_module_to_dot(m, &len);
  ck_assert_ptr_nonnull(strstr(dot, "digraph \"m\""));
  ck_assert_ptr_nonnull(strstr(dot, "label=\"ENTRY main\""));
  ck_assert_uint_eq(strlen(dot), len);
  kiln_free(dot);
  kiln_module_destroy(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rewrite");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_users_and_replace);
  tcase_add_test(tc, test_dce_pipeline);
  tcase_add_test(tc, test_dce_keeps_side_effects);
  tcase_add_test(tc, test_clone_module_prints_same);
  tcase_add_test(tc, test_clone_computation_and_sort);
  tcase_add_test(tc, test_post_order_and_dot);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
