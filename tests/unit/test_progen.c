/* Tests for the random program generator (tests/support/progen.c): every
 * module it writes parses, verifies and runs on the interpreter; it is
 * deterministic; each family shows up; differentiable mode keeps to smooth
 * ops; scalar_output gives a scalar root; bounds keep results finite. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "tests/support/progen.h"
#include "tests/support/testargs.h"

/* The options used for seed s in the bulk test: every combination of
 * dtype, mode and output kind comes up. */
static kiln_progen_options options_for(uint64_t s) {
  kiln_progen_options o = {0};
  o.seed = s;
  o.ninstrs = 6 + (int)(s % 19);
  o.nparams = 1 + (int)(s % 3);
  o.dtype = s % 4 == 3 ? KILN_F64 : KILN_F32;
  o.differentiable = s % 5 == 1;
  o.scalar_output = s % 7 == 2;
  o.max_dim = s % 11 == 0 ? 9 : 0;
  return o;
}

static bool all_finite(const kiln_literal *lit) {
  if (kiln_shape_is_tuple(&lit->shape)) {
    for (uint32_t i = 0; i < lit->shape.rank; i++)
      if (!all_finite(lit->elems[i])) return false;
    return true;
  }
  if (!kiln_shape_is_array(&lit->shape) || !kiln_dtype_is_float(lit->shape.dtype)) return true;
  int64_t n = kiln_literal_elements(lit);
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(kiln_literal_get_f64(lit, i))) return false;
  return true;
}

/* Parses, verifies and runs one generated module; fails the test with the
 * seed and the text on any error. Returns the module (caller destroys). */
static kiln_module *check_one(const kiln_progen_options *o, bool run) {
  char *text = kiln_progen_text(o);
  ck_assert_ptr_nonnull(text);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  int rc = kiln_module_parse_text(text, strlen(text), "progen.hlo", NULL, &m, &st);
  ck_assert_msg(rc == 0, "seed %llu: parse: %s: %s\n%s", (unsigned long long)o->seed, st.where,
                st.msg, text);
  rc = kiln_module_verify(m, NULL, &st);
  ck_assert_msg(rc == 0, "seed %llu: verify: %s: %s\n%s", (unsigned long long)o->seed, st.where,
                st.msg, text);
  if (run) {
    kiln_literal **args;
    uint32_t n;
    ck_assert_int_eq(kiln_test_args_random(m, o->seed, &args, &n, &st), 0);
    kiln_literal *out = NULL;
    rc = kiln_interp_run(m, (const kiln_literal *const *)args, n, NULL, &out, &st);
    ck_assert_msg(rc == 0, "seed %llu: interp: %s: %s\n%s", (unsigned long long)o->seed, st.where,
                  st.msg, text);
    ck_assert_msg(all_finite(out), "seed %llu: a result is not finite\n%s",
                  (unsigned long long)o->seed, text);
    kiln_literal_destroy(out);
    kiln_test_args_free(args, n);
  }
  kiln_free(text);
  return m;
}

/* 2,000 seeds, split over four tests so each stays well inside its timeout. */
static void bulk(uint64_t first, uint64_t count) {
  for (uint64_t s = first; s < first + count; s++) {
    kiln_progen_options o = options_for(s);
    kiln_module_destroy(check_one(&o, true));
  }
}

START_TEST(test_bulk_0) { bulk(0, 500); }
END_TEST
START_TEST(test_bulk_1) { bulk(500, 500); }
END_TEST
START_TEST(test_bulk_2) { bulk(1000, 500); }
END_TEST
START_TEST(test_bulk_3) { bulk(1500, 500); }
END_TEST

START_TEST(test_deterministic) {
  kiln_progen_options o = options_for(42);
  char *a = kiln_progen_text(&o), *b = kiln_progen_text(&o);
  ck_assert_str_eq(a, b);
  o.seed = 43;
  char *c = kiln_progen_text(&o);
  ck_assert_str_ne(a, c);
  ck_assert(strncmp(a, "HloModule progen_42\n", 20) == 0);
  kiln_free(a);
  kiln_free(b);
  kiln_free(c);
}
END_TEST

/* Each family alone, over 60 seeds, verifies and writes its op. */
START_TEST(test_each_family) {
  static const struct {
    unsigned bit;
    const char *op;
  } fam[] = {
      {KILN_PROGEN_ELEMENTWISE, " add("},
      {KILN_PROGEN_BROADCAST, " broadcast("},
      {KILN_PROGEN_RESHAPE, " reshape("},
      {KILN_PROGEN_TRANSPOSE, " transpose("},
      {KILN_PROGEN_SLICE, " slice("},
      {KILN_PROGEN_CONCATENATE, " concatenate("},
      {KILN_PROGEN_PAD, " pad("},
      {KILN_PROGEN_DOT, " dot("},
      {KILN_PROGEN_REDUCE, " reduce("},
      {KILN_PROGEN_REDUCE_WINDOW, " reduce-window("},
      {KILN_PROGEN_SELECT, " select("},
      {KILN_PROGEN_WHILE, " while("},
      {KILN_PROGEN_CONDITIONAL, " conditional("},
      {KILN_PROGEN_DYNAMIC_SLICE, " dynamic-slice("},
      {KILN_PROGEN_GATHER, " gather("},
  };
  for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
    int seen = 0;
    for (uint64_t s = 0; s < 60; s++) {
      kiln_progen_options o = options_for(s * 31 + f);
      o.families = fam[f].bit;
      kiln_module_destroy(check_one(&o, true));
      char *text = kiln_progen_text(&o);
      seen += strstr(text, fam[f].op) != NULL;
      kiln_free(text);
    }
    ck_assert_msg(seen >= 30, "family %s appears in only %d of 60 modules", fam[f].op, seen);
  }
}
END_TEST

/* Differentiable mode writes none of the non-smooth ops, and compares only
 * iota with constants. */
START_TEST(test_differentiable_is_smooth) {
  static const char *const banned[] = {" abs(",    " sign(",    " floor(",   " ceil(",
                                       " round-",  " maximum(", " minimum(", " clamp(",
                                       "maximum_", "minimum_",  "multiply_"};
  for (uint64_t s = 0; s < 300; s++) {
    kiln_progen_options o = options_for(s);
    o.differentiable = true;
    o.ninstrs = 20;
    kiln_module_destroy(check_one(&o, s < 100));
    char *text = kiln_progen_text(&o);
    for (size_t b = 0; b < sizeof banned / sizeof banned[0]; b++)
      ck_assert_msg(strstr(text, banned[b]) == NULL, "seed %llu writes %s\n%s",
                    (unsigned long long)s, banned[b], text);
    for (const char *p = text; (p = strstr(p, " compare(")) != NULL; p++) {
      /* the first operand of a compare in the ENTRY is an iota */
      char name[32];
      ck_assert(sscanf(p, " compare(%31[^,]", name) == 1);
      if (strcmp(name, "i") == 0) continue; /* the while condition's counter */
      char def[48];
      snprintf(def, sizeof def, "  %s = s32[", name);
      const char *d = strstr(text, def);
      ck_assert_msg(d != NULL, "seed %llu: compare on %s, not an iota\n%s", (unsigned long long)s,
                    name, text);
      ck_assert_msg(strstr(d, "iota()") < strchr(d, '\n'), "seed %llu: %s is not an iota",
                    (unsigned long long)s, name);
    }
    kiln_free(text);
  }
}
END_TEST

START_TEST(test_scalar_output) {
  for (uint64_t s = 0; s < 200; s++) {
    kiln_progen_options o = options_for(s);
    o.scalar_output = true;
    o.differentiable = s % 2 == 0;
    kiln_module *m = check_one(&o, s < 50);
    const kiln_computation *e = kiln_module_entry(m);
    const kiln_shape *root = &m->instrs[e->root]->shape;
    ck_assert_msg(kiln_shape_is_array(root) && root->rank == 0, "seed %llu: root not scalar",
                  (unsigned long long)s);
    ck_assert_int_eq(root->dtype, o.dtype == KILN_F64 ? KILN_F64 : KILN_F32);
    kiln_module_destroy(m);
  }
}
END_TEST

START_TEST(test_out_of_memory) {
  kiln_progen_options o = options_for(7);
  o.ninstrs = 20;
  char *ref = kiln_progen_text(&o);
  ck_assert_ptr_nonnull(ref);
  int failures = 0;
  for (long n = 1; n < 400; n++) {
    kiln_alloc_fail_after(n);
    char *t = kiln_progen_text(&o);
    kiln_alloc_fail_after(0);
    if (t == NULL)
      failures++;
    else
      ck_assert_str_eq(t, ref); /* no partial output passed off as whole */
    kiln_free(t);
  }
  ck_assert_int_gt(failures, 0);
  kiln_free(ref);
}
END_TEST

int main(void) {
  Suite *s = suite_create("progen");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_bulk_0);
  tcase_add_test(tc, test_bulk_1);
  tcase_add_test(tc, test_bulk_2);
  tcase_add_test(tc, test_bulk_3);
  tcase_add_test(tc, test_deterministic);
  tcase_add_test(tc, test_each_family);
  tcase_add_test(tc, test_differentiable_is_smooth);
  tcase_add_test(tc, test_scalar_output);
  tcase_add_test(tc, test_out_of_memory);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
