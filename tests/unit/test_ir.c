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

/* The op-class columns of ops.def, pinned: for each class, exactly these
 * ops (every op is looked at, so a row that drifts is caught both ways). */
static bool in_list(kiln_opcode op, const kiln_opcode *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (list[i] == op) return true;
  return false;
}

#define CHECK_CLASS(pred, ...) \
  do { \
    static const kiln_opcode want[] = {__VA_ARGS__}; \
    for (int i = 0; i < KILN_OP_COUNT; i++) \
      ck_assert_msg((pred((kiln_opcode)i)) == \
                        in_list((kiln_opcode)i, want, sizeof want / sizeof *want), \
                    "%s: %s", #pred, kiln_opcode_name((kiln_opcode)i)); \
  } while (0)

static bool impure(kiln_opcode op) { return !kiln_opcode_is_pure(op); }
static bool indexing(kiln_opcode op) { return kiln_opcode_flags(op) & KILN_OPF_INDEXING; }
static bool reduction(kiln_opcode op) { return kiln_opcode_family(op) == KILN_FAM_REDUCTION; }
static bool channel(kiln_opcode op) { return kiln_opcode_family(op) == KILN_FAM_CHANNEL; }
static bool movement(kiln_opcode op) { return kiln_opcode_family(op) == KILN_FAM_MOVEMENT; }
static bool compute(kiln_opcode op) {
  return kiln_opcode_family(op) == KILN_FAM_COMPUTE || kiln_opcode_family(op) == KILN_FAM_REDUCTION;
}
static bool elementwise_not_e(kiln_opcode op) {
  return kiln_opcode_is_elementwise_family(op) && !(kiln_opcode_flags(op) & KILN_OPF_ELEMENTWISE);
}
static bool e_not_elementwise(kiln_opcode op) {
  return !kiln_opcode_is_elementwise_family(op) && (kiln_opcode_flags(op) & KILN_OPF_ELEMENTWISE);
}

START_TEST(test_opcode_classes) {
  /* Representative rows. */
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_NEGATE), KILN_FAM_UNARY);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_BITCAST_CONVERT), KILN_FAM_UNARY);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_ADD), KILN_FAM_BINARY);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_ATAN2), KILN_FAM_BINARY);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_COMPARE), KILN_FAM_COMPARE);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_SELECT), KILN_FAM_TERNARY);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_CLAMP), KILN_FAM_TERNARY);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_PARAMETER), KILN_FAM_LEAF);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_GET_TUPLE_ELEMENT), KILN_FAM_TUPLE);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_WHILE), KILN_FAM_CONTROL);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_RNG_BIT_GENERATOR), KILN_FAM_RANDOM);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_AFTER_ALL), KILN_FAM_TOKEN);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_ALL_REDUCE), KILN_FAM_COLLECTIVE);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_INVALID), KILN_FAM_NONE);
  ck_assert_int_eq(kiln_opcode_family(KILN_OP_COUNT), KILN_FAM_NONE);
  ck_assert(kiln_opcode_is_pure(KILN_OP_ADD) && kiln_opcode_is_pure(KILN_OP_WHILE));
  ck_assert(kiln_opcode_is_pure(KILN_OP_REPLICA_ID));
  ck_assert(!kiln_opcode_is_pure(KILN_OP_COUNT));
  ck_assert(kiln_opcode_has_side_effects(KILN_OP_OUTFEED));
  ck_assert(kiln_opcode_has_side_effects(KILN_OP_CUSTOM_CALL));
  ck_assert(!kiln_opcode_has_side_effects(KILN_OP_RNG_BIT_GENERATOR));
  ck_assert(!kiln_opcode_has_side_effects(KILN_OP_ADD));
  ck_assert(!kiln_opcode_has_side_effects(KILN_OP_COUNT));
  /* Whole classes. Elementwise families are exactly the E ops plus
   * bitcast-convert (which may change the shape). */
  CHECK_CLASS(elementwise_not_e, KILN_OP_BITCAST_CONVERT);
  for (int i = 0; i < KILN_OP_COUNT; i++)
    ck_assert_msg(!e_not_elementwise((kiln_opcode)i), "%s", kiln_opcode_name((kiln_opcode)i));
  CHECK_CLASS(
      impure, KILN_OP_INVALID, KILN_OP_RNG, KILN_OP_RNG_BIT_GENERATOR,
      KILN_OP_RNG_GET_AND_UPDATE_STATE, KILN_OP_OPTIMIZATION_BARRIER, KILN_OP_DOMAIN,
      KILN_OP_AFTER_ALL, KILN_OP_ADD_DEPENDENCY, KILN_OP_CUSTOM_CALL, KILN_OP_ASYNC_START,
      KILN_OP_ASYNC_UPDATE, KILN_OP_ASYNC_DONE, KILN_OP_INFEED, KILN_OP_OUTFEED, KILN_OP_SEND,
      KILN_OP_SEND_DONE, KILN_OP_RECV, KILN_OP_RECV_DONE, KILN_OP_COPY_START, KILN_OP_COPY_DONE,
      KILN_OP_ALL_REDUCE, KILN_OP_ALL_REDUCE_START, KILN_OP_ALL_REDUCE_DONE, KILN_OP_ALL_GATHER,
      KILN_OP_ALL_GATHER_START, KILN_OP_ALL_GATHER_DONE, KILN_OP_REDUCE_SCATTER, KILN_OP_ALL_TO_ALL,
      KILN_OP_RAGGED_ALL_TO_ALL, KILN_OP_COLLECTIVE_PERMUTE, KILN_OP_COLLECTIVE_PERMUTE_START,
      KILN_OP_COLLECTIVE_PERMUTE_DONE, KILN_OP_COLLECTIVE_BROADCAST);
  CHECK_CLASS(kiln_opcode_has_side_effects, KILN_OP_CUSTOM_CALL, KILN_OP_RNG,
              KILN_OP_RNG_GET_AND_UPDATE_STATE, KILN_OP_INFEED, KILN_OP_OUTFEED, KILN_OP_SEND,
              KILN_OP_SEND_DONE, KILN_OP_RECV, KILN_OP_RECV_DONE);
  CHECK_CLASS(channel, KILN_OP_INFEED, KILN_OP_OUTFEED, KILN_OP_SEND, KILN_OP_SEND_DONE,
              KILN_OP_RECV, KILN_OP_RECV_DONE);
  CHECK_CLASS(movement, KILN_OP_IOTA, KILN_OP_BITCAST, KILN_OP_BROADCAST, KILN_OP_RESHAPE,
              KILN_OP_DYNAMIC_RESHAPE, KILN_OP_TRANSPOSE, KILN_OP_SLICE, KILN_OP_DYNAMIC_SLICE,
              KILN_OP_DYNAMIC_UPDATE_SLICE, KILN_OP_CONCATENATE, KILN_OP_PAD, KILN_OP_REVERSE,
              KILN_OP_GET_DIMENSION_SIZE, KILN_OP_SET_DIMENSION_SIZE);
  CHECK_CLASS(compute, KILN_OP_DOT, KILN_OP_CONVOLUTION, KILN_OP_REDUCE, KILN_OP_REDUCE_WINDOW,
              KILN_OP_SELECT_AND_SCATTER, KILN_OP_MAP, KILN_OP_SORT, KILN_OP_GATHER,
              KILN_OP_SCATTER, KILN_OP_FFT, KILN_OP_CHOLESKY, KILN_OP_TRIANGULAR_SOLVE,
              KILN_OP_TOPK, KILN_OP_BATCH_NORM_TRAINING, KILN_OP_BATCH_NORM_INFERENCE,
              KILN_OP_BATCH_NORM_GRAD);
  CHECK_CLASS(reduction, KILN_OP_REDUCE, KILN_OP_REDUCE_WINDOW, KILN_OP_DOT, KILN_OP_CONVOLUTION,
              KILN_OP_MAP);
  CHECK_CLASS(indexing, KILN_OP_BITCAST, KILN_OP_BROADCAST, KILN_OP_RESHAPE, KILN_OP_TRANSPOSE,
              KILN_OP_SLICE, KILN_OP_DYNAMIC_SLICE, KILN_OP_DYNAMIC_UPDATE_SLICE,
              KILN_OP_CONCATENATE, KILN_OP_PAD, KILN_OP_REVERSE, KILN_OP_IOTA, KILN_OP_GATHER,
              KILN_OP_BITCAST_CONVERT, KILN_OP_OPTIMIZATION_BARRIER, KILN_OP_REPLICA_ID,
              KILN_OP_PARTITION_ID);
  /* Foldable: every E op, and these. */
  for (int i = 0; i < KILN_OP_COUNT; i++)
    if (kiln_opcode_flags((kiln_opcode)i) & KILN_OPF_ELEMENTWISE)
      ck_assert_msg(kiln_opcode_is_foldable((kiln_opcode)i), "%s", kiln_opcode_name(i));
  static const kiln_opcode fold[] = {KILN_OP_BITCAST_CONVERT,
                                     KILN_OP_BROADCAST,
                                     KILN_OP_RESHAPE,
                                     KILN_OP_TRANSPOSE,
                                     KILN_OP_SLICE,
                                     KILN_OP_DYNAMIC_SLICE,
                                     KILN_OP_DYNAMIC_UPDATE_SLICE,
                                     KILN_OP_CONCATENATE,
                                     KILN_OP_PAD,
                                     KILN_OP_REVERSE,
                                     KILN_OP_GET_TUPLE_ELEMENT,
                                     KILN_OP_DOT,
                                     KILN_OP_CONVOLUTION,
                                     KILN_OP_REDUCE,
                                     KILN_OP_REDUCE_WINDOW,
                                     KILN_OP_SELECT_AND_SCATTER,
                                     KILN_OP_MAP,
                                     KILN_OP_SORT,
                                     KILN_OP_GATHER,
                                     KILN_OP_SCATTER,
                                     KILN_OP_FFT,
                                     KILN_OP_CHOLESKY,
                                     KILN_OP_TRIANGULAR_SOLVE};
  for (int i = 0; i < KILN_OP_COUNT; i++) {
    kiln_opcode op = (kiln_opcode)i;
    bool want = (kiln_opcode_flags(op) & KILN_OPF_ELEMENTWISE) ||
                in_list(op, fold, sizeof fold / sizeof *fold);
    ck_assert_msg(kiln_opcode_is_foldable(op) == want, "foldable: %s", kiln_opcode_name(op));
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
  for (int i = 0; i < 5000; i++)
    ck_assert_ptr_nonnull(kiln_module_add_instr(m, c, KILN_OP_ADD, NULL));
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
  tcase_add_test(tc, test_opcode_classes);
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
