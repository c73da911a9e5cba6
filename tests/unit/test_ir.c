/* Unit tests for the IR core: the type/op/attribute tables, shapes, literals
 * and the module builder. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/ir/ir.h"

static char *shape_text(const kiln_shape *s) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_shape_print(&b, s);
  return kiln_sbuf_detach(&b, NULL);
}

START_TEST(test_dtype_table) {
  kiln_dtype t;
  ck_assert(kiln_dtype_from_name("bf16", 4, &t));
  ck_assert_int_eq(t, KILN_BF16);
  ck_assert_str_eq(kiln_dtype_name(KILN_F8E4M3FN), "f8e4m3fn");
  ck_assert(!kiln_dtype_from_name("f33", 3, &t));
  ck_assert(!kiln_dtype_from_name("tuple", 5, &t)); /* not a text spelling */
  ck_assert(kiln_dtype_from_name("token", 5, &t));
  ck_assert_int_eq(kiln_dtype_size(KILN_C128), 16);
  ck_assert_int_eq(kiln_dtype_size(KILN_S4), 1);
  ck_assert_int_eq(kiln_dtype_bits(KILN_S4), 4);
  ck_assert(kiln_dtype_is_float(KILN_BF16));
  ck_assert(!kiln_dtype_is_float(KILN_C64));
  ck_assert(kiln_dtype_is_signed_int(KILN_S64));
  ck_assert(kiln_dtype_is_unsigned_int(KILN_U8));
  ck_assert(!kiln_dtype_is_integral(KILN_PRED));
  ck_assert(kiln_dtype_is_array(KILN_PRED));
  ck_assert(!kiln_dtype_is_array(KILN_TOKEN));
}
END_TEST

START_TEST(test_opcode_table) {
  kiln_opcode op;
  ck_assert(kiln_opcode_from_name("dynamic-update-slice", 20, &op));
  ck_assert_int_eq(op, KILN_OP_DYNAMIC_UPDATE_SLICE);
  ck_assert_str_eq(kiln_opcode_name(KILN_OP_EXPM1), "exponential-minus-one");
  ck_assert(!kiln_opcode_from_name("invalid", 7, &op));
  ck_assert(!kiln_opcode_from_name("negate-start", 12, &op)); /* sugar, not a name */
  ck_assert(kiln_opcode_from_name("all-reduce-start", 16, &op));
  ck_assert_int_eq(kiln_opcode_arity(KILN_OP_ADD), 2);
  ck_assert_int_eq(kiln_opcode_arity(KILN_OP_TUPLE), -1);
  ck_assert(kiln_opcode_flags(KILN_OP_ADD) & KILN_OPF_ELEMENTWISE);
  ck_assert(kiln_opcode_flags(KILN_OP_ADD) & KILN_OPF_COMMUTATIVE);
  ck_assert(!(kiln_opcode_flags(KILN_OP_SUBTRACT) & KILN_OPF_COMMUTATIVE));
  ck_assert(kiln_opcode_flags(KILN_OP_WHILE) & KILN_OPF_CALLS);
  ck_assert(kiln_opcode_flags(KILN_OP_ALL_GATHER) & KILN_OPF_COLLECTIVE);
  /* Every opcode spelling is unique and maps back to itself. */
  for (int i = 1; i < KILN_OP_COUNT; i++) {
    const char *n = kiln_opcode_name((kiln_opcode)i);
    ck_assert(kiln_opcode_from_name(n, strlen(n), &op));
    ck_assert_int_eq(op, i);
  }
}
END_TEST

START_TEST(test_attr_table) {
  kiln_attr_key k;
  ck_assert(kiln_attr_key_from_name("lhs_contracting_dims", 20, &k));
  ck_assert_int_eq(k, KILN_ATTR_LHS_CONTRACTING_DIMS);
  ck_assert_int_eq(kiln_attr_key_kind(k), KILN_AK_INTS);
  ck_assert_int_eq(kiln_attr_key_kind(KILN_ATTR_WINDOW), KILN_AK_WINDOW);
  ck_assert(!kiln_attr_key_from_name("unknown", 7, &k));
  for (int i = 1; i < KILN_ATTR_UNKNOWN; i++) {
    const char *n = kiln_attr_key_name((kiln_attr_key)i);
    ck_assert(kiln_attr_key_from_name(n, strlen(n), &k));
    ck_assert_int_eq(k, i);
  }
}
END_TEST

START_TEST(test_shape_basics) {
  kiln_arena *a = kiln_arena_create();
  kiln_shape s, t, u;
  int64_t dims[] = {2, 3};
  ck_assert_int_eq(kiln_shape_make_array(a, &s, KILN_F32, dims, 2), 0);
  ck_assert_int_eq(kiln_shape_elements(&s), 6);
  ck_assert_int_eq(kiln_shape_bytes(&s), 24);
  ck_assert(!kiln_shape_is_scalar(&s));
  char *txt = shape_text(&s);
  ck_assert_str_eq(txt, "f32[2,3]");
  free(txt);

  ck_assert_int_eq(kiln_shape_copy(a, &t, &s), 0);
  ck_assert(kiln_shape_equal(&s, &t, true));
  t.dims[1] = 4;
  ck_assert(!kiln_shape_equal(&s, &t, false));
  ck_assert_int_eq(s.dims[1], 3); /* deep copy */

  kiln_shape elems[2];
  elems[0] = s;
  ck_assert_int_eq(kiln_shape_make_array(a, &elems[1], KILN_TOKEN, NULL, 0), 0);
  ck_assert_int_eq(kiln_shape_make_tuple(a, &u, elems, 2), 0);
  txt = shape_text(&u);
  ck_assert_str_eq(txt, "(f32[2,3], token[])");
  free(txt);
  int64_t path[] = {1};
  ck_assert_ptr_eq(kiln_shape_subshape(&u, path, 1), &u.tuple[1]);
  path[0] = 2;
  ck_assert_ptr_null(kiln_shape_subshape(&u, path, 1));
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(test_shape_overflow_and_layout) {
  kiln_arena *a = kiln_arena_create();
  kiln_shape s;
  int64_t dims[] = {99999999999, 99999999999};
  ck_assert_int_eq(kiln_shape_make_array(a, &s, KILN_F32, dims, 2), 0);
  ck_assert_int_eq(kiln_shape_elements(&s), -1);
  ck_assert_int_eq(kiln_shape_bytes(&s), -1);

  int64_t d2[] = {4, 5};
  ck_assert_int_eq(kiln_shape_make_array(a, &s, KILN_BF16, d2, 2), 0);
  int64_t m2m[2];
  kiln_shape_minor_to_major(&s, m2m);
  ck_assert_int_eq(m2m[0], 1);
  ck_assert_int_eq(m2m[1], 0);
  ck_assert(kiln_shape_is_row_major(&s)); /* no layout */
  kiln_layout l = {0};
  int64_t row_major[] = {1, 0};
  l.minor_to_major = row_major;
  l.rank = 2;
  s.layout = &l;
  ck_assert(kiln_shape_is_row_major(&s));
  int64_t order[] = {0, 1};
  l.minor_to_major = order;
  l.tail = "T(8,128)";
  ck_assert(!kiln_shape_is_row_major(&s));
  kiln_shape_minor_to_major(&s, m2m);
  ck_assert_int_eq(m2m[0], 0);
  char *txt = shape_text(&s);
  ck_assert_str_eq(txt, "bf16[4,5]{0,1:T(8,128)}");
  free(txt);
  kiln_shape c;
  ck_assert_int_eq(kiln_shape_copy(a, &c, &s), 0);
  ck_assert_ptr_ne(c.layout, s.layout);
  ck_assert(kiln_shape_equal(&c, &s, true));
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(test_literal_integer_wrap) {
  kiln_arena *a = kiln_arena_create();
  kiln_shape s;
  int64_t n = 4;
  kiln_shape_make_array(a, &s, KILN_S8, &n, 1);
  kiln_literal *lit;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &lit, NULL), 0);
  kiln_literal_set_s64(lit, 0, 127 + 1);
  kiln_literal_set_s64(lit, 1, -129);
  kiln_literal_set_u64(lit, 2, 0xFFu);
  kiln_literal_set_f64(lit, 3, 1e9); /* float -> int saturates */
  ck_assert_int_eq(kiln_literal_get_s64(lit, 0), -128);
  ck_assert_int_eq(kiln_literal_get_s64(lit, 1), 127);
  ck_assert_int_eq(kiln_literal_get_s64(lit, 2), -1);
  ck_assert_int_eq(kiln_literal_get_s64(lit, 3), 127);
  kiln_literal_destroy(lit);

  kiln_shape_make_array(a, &s, KILN_S4, &n, 1);
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &lit, NULL), 0);
  kiln_literal_set_s64(lit, 0, 8);
  kiln_literal_set_s64(lit, 1, -9);
  ck_assert_int_eq(kiln_literal_get_s64(lit, 0), -8);
  ck_assert_int_eq(kiln_literal_get_s64(lit, 1), 7);
  kiln_literal_destroy(lit);

  kiln_shape_make_array(a, &s, KILN_U32, &n, 1);
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &lit, NULL), 0);
  kiln_literal_set_s64(lit, 0, -1);
  ck_assert_uint_eq(kiln_literal_get_u64(lit, 0), 4294967295u);
  kiln_literal_set_f64(lit, 1, NAN);
  ck_assert_uint_eq(kiln_literal_get_u64(lit, 1), 0);
  kiln_literal_set_f64(lit, 2, -3.5);
  ck_assert_uint_eq(kiln_literal_get_u64(lit, 2), 0);
  kiln_literal_destroy(lit);
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(test_literal_float_rounding) {
  kiln_arena *a = kiln_arena_create();
  kiln_shape s;
  int64_t n = 3;
  kiln_shape_make_array(a, &s, KILN_BF16, &n, 1);
  kiln_literal *lit;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &lit, NULL), 0);
  /* 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even -> 1. */
  kiln_literal_set_f64(lit, 0, 1.0 + ldexp(1, -8));
  ck_assert(kiln_literal_get_f64(lit, 0) == 1.0);
  /* 1 + 3*2^-8 is halfway between 1+2^-7 and 1+2^-6: ties to even -> 1+2^-6. */
  kiln_literal_set_f64(lit, 1, 1.0 + 3 * ldexp(1, -8));
  ck_assert(kiln_literal_get_f64(lit, 1) == 1.0 + ldexp(1, -6));
  /* Just above the halfway point rounds up: no double rounding via f32. */
  kiln_literal_set_f64(lit, 2, 1.0 + ldexp(1, -8) + ldexp(1, -40));
  ck_assert(kiln_literal_get_f64(lit, 2) == 1.0 + ldexp(1, -7));
  ck_assert_uint_eq(((uint16_t *)lit->data)[0], 0x3F80);
  kiln_literal_destroy(lit);

  kiln_shape_make_array(a, &s, KILN_F16, &n, 1);
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &lit, NULL), 0);
  kiln_literal_set_f64(lit, 0, 65520.0); /* rounds to inf in f16 */
  ck_assert(isinf(kiln_literal_get_f64(lit, 0)));
  kiln_literal_set_f64(lit, 1, 65519.0); /* rounds down to max */
  ck_assert(kiln_literal_get_f64(lit, 1) == 65504.0);
  kiln_literal_set_f64(lit, 2, ldexp(1, -24)); /* smallest subnormal */
  ck_assert_uint_eq(((uint16_t *)lit->data)[2], 1);
  kiln_literal_destroy(lit);
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(test_literal_tuple_clone_limit) {
  kiln_arena *a = kiln_arena_create();
  kiln_shape e[2], t;
  int64_t n = 2;
  kiln_shape_make_array(a, &e[0], KILN_F32, &n, 1);
  kiln_shape_make_array(a, &e[1], KILN_PRED, NULL, 0);
  kiln_shape_make_tuple(a, &t, e, 2);
  kiln_literal *lit, *copy;
  ck_assert_int_eq(kiln_literal_create(NULL, &t, 0, &lit, NULL), 0);
  kiln_literal_set_f64(lit->elems[0], 1, 2.5);
  kiln_literal_set_u64(lit->elems[1], 0, 1);
  ck_assert_int_eq(kiln_literal_clone(NULL, lit, &copy, NULL), 0);
  ck_assert(kiln_literal_equal(lit, copy));
  kiln_literal_set_f64(copy->elems[0], 1, 3.5);
  ck_assert(!kiln_literal_equal(lit, copy));
  kiln_literal_destroy(copy);
  kiln_literal_destroy(lit);

  kiln_status st;
  kiln_status_clear(&st);
  int64_t big = 1000;
  kiln_shape_make_array(a, &e[0], KILN_F64, &big, 1);
  ck_assert_int_eq(kiln_literal_create(NULL, &e[0], 4096, &lit, &st), KILN_ELIMIT);
  ck_assert_ptr_null(lit);
  ck_assert_str_eq(st.msg, "literal of 1000 elements is over the size limit of 4096 bytes");
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(test_module_builder) {
  kiln_module *m = kiln_module_create("m");
  ck_assert_ptr_nonnull(m);
  uint32_t c;
  ck_assert_int_eq(kiln_module_add_computation(m, "main", &c), 0);
  m->entry = c;
  kiln_instr *p = kiln_module_add_instr(m, c, KILN_OP_PARAMETER, "x");
  kiln_shape s;
  int64_t d = 4;
  kiln_shape_make_array(m->arena, &s, KILN_F32, &d, 1);
  ck_assert_int_eq(kiln_instr_set_shape(m, p, &s), 0);
  p->param_number = 0;
  kiln_instr *neg = kiln_module_add_instr(m, c, KILN_OP_NEGATE, NULL);
  ck_assert_str_eq(neg->name, "negate.1");
  ck_assert_int_eq(kiln_instr_set_operands(m, neg, &p->id, 1), 0);
  kiln_instr *r = kiln_module_add_instr(m, c, KILN_OP_REDUCE, "r");
  int64_t dims[] = {0};
  ck_assert_int_eq(kiln_instr_set_attr_ints(m, r, KILN_ATTR_DIMENSIONS, dims, 1), 0);
  ck_assert_int_eq(kiln_instr_set_attr_int(m, r, KILN_ATTR_CHANNEL_ID, 3), 0);
  ck_assert_int_eq(kiln_instr_set_attr_int(m, r, KILN_ATTR_CHANNEL_ID, 4), 0); /* replaces */
  ck_assert_int_eq(r->nattrs, 2);
  for (int i = 0; i < 10; i++) {
    kiln_attr *u = kiln_instr_add_attr(m, r, KILN_ATTR_UNKNOWN);
    ck_assert_ptr_nonnull(u);
    u->name = "custom";
  }
  ck_assert_int_eq(r->nattrs, 12);
  ck_assert_int_eq(kiln_instr_attr_int(r, KILN_ATTR_CHANNEL_ID, -1), 4);
  ck_assert_int_eq(kiln_instr_attr_ints(r, KILN_ATTR_DIMENSIONS)->v[0], 0);
  ck_assert_ptr_null(kiln_instr_attr_ints(r, KILN_ATTR_SLICE_SIZES));

  kiln_computation *comp = kiln_module_entry(m);
  ck_assert_int_eq(comp->ninstrs, 3);
  ck_assert_ptr_eq(kiln_computation_param(m, comp, 0), p);
  ck_assert_uint_eq(kiln_computation_nparams(m, comp), 1);
  ck_assert_ptr_eq(kiln_computation_root(m, comp), r); /* last when no ROOT */
  comp->root = neg->id;
  ck_assert_ptr_eq(kiln_computation_root(m, comp), neg);
  ck_assert_ptr_eq(kiln_module_find_computation(m, "main"), comp);
  ck_assert_ptr_null(kiln_module_find_computation(m, "nope"));
  char where[64];
  kiln_instr_where(m, neg, where, sizeof where);
  ck_assert_str_eq(where, "main/negate.1");
  /* Many instructions: ids stay stable, pointers too. */
  for (int i = 0; i < 5000; i++) ck_assert_ptr_nonnull(kiln_module_add_instr(m, c, KILN_OP_ADD, NULL));
  ck_assert_ptr_eq(kiln_module_instr(m, neg->id), neg);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_module_oom) {
  /* Every allocation failure in the builder is reported, never a crash. */
  for (long n = 1; n < 40; n++) {
    kiln_alloc_fail_after(n);
    kiln_module *m = kiln_module_create("m");
    if (m) {
      uint32_t c;
      if (kiln_module_add_computation(m, "main", &c) == 0) {
        for (int i = 0; i < 3; i++) (void)kiln_module_add_instr(m, c, KILN_OP_ADD, NULL);
      }
    }
    kiln_alloc_fail_after(0);
    kiln_module_destroy(m);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("ir");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_dtype_table);
  tcase_add_test(tc, test_opcode_table);
  tcase_add_test(tc, test_attr_table);
  tcase_add_test(tc, test_shape_basics);
  tcase_add_test(tc, test_shape_overflow_and_layout);
  tcase_add_test(tc, test_literal_integer_wrap);
  tcase_add_test(tc, test_literal_float_rounding);
  tcase_add_test(tc, test_literal_tuple_clone_limit);
  tcase_add_test(tc, test_module_builder);
  tcase_add_test(tc, test_module_oom);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
