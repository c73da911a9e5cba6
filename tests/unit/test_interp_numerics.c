/* Unit tests for the interpreter's element numerics: rounding of narrow
 * floats after every op, integer wraparound and XLA's edge definitions
 * (division by zero, INT_MIN / -1, shifts past the width), NaN propagation,
 * total-order comparison, conversions and the unary functions. Expected
 * values are worked out by hand from XLA's definitions. */
#include <check.h>
#include <stdlib.h>

#include "tests/unit/test_interp_harness.h"

/* Module text for `ROOT r = RT op(a, b)` over parameters of type T. */
static char *binary(const char *t, const char *rt, const char *op, const char *extra) {
  static char buf[1024];
  snprintf(buf, sizeof buf,
           "HloModule m\nENTRY e { a = %s parameter(0)\n b = %s parameter(1)\n"
           " ROOT r = %s %s(a, b)%s }\n",
           t, t, rt, op, extra ? extra : "");
  return buf;
}

static char *unary(const char *t, const char *rt, const char *op, const char *extra) {
  static char buf[1024];
  snprintf(buf, sizeof buf, "HloModule m\nENTRY e { a = %s parameter(0)\n ROOT r = %s %s(a)%s }\n",
           t, rt, op, extra ? extra : "");
  return buf;
}

START_TEST(test_bf16_rounds_after_each_op) {
  /* 1 + 2^-8 is halfway between 1 and the next bf16 (1 + 2^-7): ties to even -> 1. */
  expect(binary("bf16[]", "bf16[]", "add", NULL), "bf16[] 1", "bf16[] 1", "bf16[] 0.00390625",
         NULL);
  /* 1 + 3*2^-8 is halfway between 1+2^-7 and 1+2^-6: ties to even -> 1+2^-6. */
  expect(binary("bf16[]", "bf16[]", "add", NULL), "bf16[] 1.016", "bf16[] 1", "bf16[] 0.01171875",
         NULL);
  /* Rounded per op: (1 + 2^-8) + 2^-8 adds to 1 twice, not 1 + 2^-7 once. */
  expect("HloModule m\nENTRY e { a = bf16[] parameter(0)\n b = bf16[] parameter(1)\n"
         " s = bf16[] add(a, b)\n ROOT r = bf16[] add(s, b) }\n",
         "bf16[] 1", "bf16[] 1", "bf16[] 0.00390625", NULL);
  /* f16: 2048 + 1 is a tie between 2048 and 2050 -> 2048; 2048 + 3 -> 2052. */
  expect(binary("f16[2]", "f16[2]", "add", NULL), "f16[2] {2048, 2052}", "f16[2] {2048, 2048}",
         "f16[2] {1, 3}", NULL);
  /* f16 overflow to infinity, and multiply rounding. */
  expect(binary("f16[2]", "f16[2]", "multiply", NULL), "f16[2] {inf, 1.001}",
         "f16[2] {300, 1.0009765625}", "f16[2] {300, 1}", NULL);
  /* f32 keeps single rounding: 1 + 2^-24 -> 1; 16777216 + 1 -> 16777216. */
  expect(binary("f32[2]", "f32[2]", "add", NULL), "f32[2] {1, 16777216}", "f32[2] {1, 16777216}",
         "f32[2] {5.96046448e-08, 1}", NULL);
}
END_TEST

START_TEST(test_integer_wraparound) {
  expect(binary("s32[]", "s32[]", "add", NULL), "s32[] -2147483648", "s32[] 2147483647", "s32[] 1",
         NULL);
  expect(binary("u8[2]", "u8[2]", "add", NULL), "u8[2] {0, 254}", "u8[2] {255, 255}",
         "u8[2] {1, 255}", NULL);
  expect(binary("s8[3]", "s8[3]", "multiply", NULL), "s8[3] {-112, 0, -128}",
         "s8[3] {12, 16, -128}", "s8[3] {12, 16, 1}", NULL);
  expect(binary("u32[]", "u32[]", "subtract", NULL), "u32[] 4294967295", "u32[] 0", "u32[] 1",
         NULL);
  expect(unary("s32[2]", "s32[2]", "negate", NULL), "s32[2] {-2147483648, -5}",
         "s32[2] {-2147483648, 5}", NULL);
  expect(unary("s8[2]", "s8[2]", "abs", NULL), "s8[2] {-128, 7}", "s8[2] {-128, -7}", NULL);
  expect(binary("s64[]", "s64[]", "add", NULL), "s64[] -9223372036854775808",
         "s64[] 9223372036854775807", "s64[] 1", NULL);
}
END_TEST

START_TEST(test_integer_division_edges) {
  expect(binary("s32[4]", "s32[4]", "divide", NULL), "s32[4] {-1, -2147483648, -3, 3}",
         "s32[4] {7, -2147483648, -7, -7}", "s32[4] {0, -1, 2, -2}", NULL);
  expect(binary("u32[2]", "u32[2]", "divide", NULL), "u32[2] {4294967295, 3}", "u32[2] {7, 7}",
         "u32[2] {0, 2}", NULL);
  expect(binary("u8[]", "u8[]", "divide", NULL), "u8[] 255", "u8[] 9", "u8[] 0", NULL);
  expect(binary("s32[4]", "s32[4]", "remainder", NULL), "s32[4] {7, 0, -1, -1}",
         "s32[4] {7, -2147483648, -7, -7}", "s32[4] {0, -1, 2, -2}", NULL);
  expect(binary("s8[2]", "s8[2]", "divide", NULL), "s8[2] {-128, -1}", "s8[2] {-128, 5}",
         "s8[2] {-1, 0}", NULL);
  /* Float remainder is fmod: the sign of the dividend. */
  expect(binary("f32[2]", "f32[2]", "remainder", NULL), "f32[2] {-1, 1}", "f32[2] {-7, 7}",
         "f32[2] {2, -2}", NULL);
}
END_TEST

START_TEST(test_shifts) {
  expect(binary("s32[4]", "s32[4]", "shift-left", NULL), "s32[4] {8, 0, 0, -2147483648}",
         "s32[4] {1, 1, 1, 1}", "s32[4] {3, 32, -1, 31}", NULL);
  expect(binary("s32[4]", "s32[4]", "shift-right-arithmetic", NULL), "s32[4] {-4, -1, 0, -1}",
         "s32[4] {-16, -16, 16, -1}", "s32[4] {2, 32, 40, 99}", NULL);
  expect(binary("s32[3]", "s32[3]", "shift-right-logical", NULL),
         "s32[3] {1073741820, 0, 2147483647}", "s32[3] {-16, -16, -1}", "s32[3] {2, 32, 1}", NULL);
  expect(binary("u8[3]", "u8[3]", "shift-left", NULL), "u8[3] {254, 0, 128}", "u8[3] {255, 255, 1}",
         "u8[3] {1, 8, 7}", NULL);
  expect(binary("u8[2]", "u8[2]", "shift-right-arithmetic", NULL), "u8[2] {255, 224}",
         "u8[2] {128, 128}", "u8[2] {9, 2}", NULL);
}
END_TEST

START_TEST(test_max_min_nan) {
  expect(binary("f32[4]", "f32[4]", "maximum", NULL), "f32[4] {nan, nan, 2, -0}",
         "f32[4] {nan, 1, 2, -0}", "f32[4] {1, nan, -inf, 0}", NULL);
  expect(binary("f32[3]", "f32[3]", "minimum", NULL), "f32[3] {nan, nan, -inf}",
         "f32[3] {nan, 1, 2}", "f32[3] {1, nan, -inf}", NULL);
  expect(binary("bf16[2]", "bf16[2]", "maximum", NULL), "bf16[2] {nan, 3}", "bf16[2] {1, 3}",
         "bf16[2] {nan, 2}", NULL);
  expect(binary("s32[2]", "s32[2]", "maximum", NULL), "s32[2] {3, -1}", "s32[2] {3, -5}",
         "s32[2] {-2, -1}", NULL);
  expect(binary("u32[2]", "u32[2]", "minimum", NULL), "u32[2] {3, 1}", "u32[2] {3, 4294967295}",
         "u32[2] {4, 1}", NULL);
  /* clamp propagates NaN from any of its operands */
  expect("HloModule m\nENTRY e { lo = f32[] parameter(0)\n x = f32[3] parameter(1)\n"
         " hi = f32[] parameter(2)\n ROOT c = f32[3] clamp(lo, x, hi) }\n",
         "f32[3] {0, 5, nan}", "f32[] 0", "f32[3] {-3, 7, nan}", "f32[] 5", NULL);
  expect("HloModule m\nENTRY e { lo = s32[3] parameter(0)\n x = s32[3] parameter(1)\n"
         " hi = s32[3] parameter(2)\n ROOT c = s32[3] clamp(lo, x, hi) }\n",
         "s32[3] {0, 3, 5}", "s32[3] {0, 0, 0}", "s32[3] {-3, 3, 9}", "s32[3] {5, 5, 5}", NULL);
}
END_TEST

START_TEST(test_compare_total_order) {
  const char *lt = binary("f32[6]", "pred[6]", "compare", ", direction=LT, type=TOTALORDER");
  expect(lt, "pred[6] {true, true, true, false, true, false}",
         "f32[6] {-nan, -inf, -0, 0, inf, nan}", "f32[6] {-inf, -0, 0, -0, nan, nan}", NULL);
  /* Default (partial) order: NaN is unordered, -0 == 0. */
  const char *eq = binary("f32[3]", "pred[3]", "compare", ", direction=EQ");
  expect(eq, "pred[3] {false, true, true}", "f32[3] {nan, -0, 1}", "f32[3] {nan, 0, 1}", NULL);
  const char *ne = binary("f32[2]", "pred[2]", "compare", ", direction=NE");
  expect(ne, "pred[2] {true, false}", "f32[2] {nan, 1}", "f32[2] {nan, 1}", NULL);
  const char *eqt = binary("f32[2]", "pred[2]", "compare", ", direction=EQ, type=TOTALORDER");
  expect(eqt, "pred[2] {true, false}", "f32[2] {nan, -0}", "f32[2] {nan, 0}", NULL);
  const char *ge = binary("u8[2]", "pred[2]", "compare", ", direction=GE");
  expect(ge, "pred[2] {true, false}", "u8[2] {200, 1}", "u8[2] {100, 2}", NULL);
  const char *gt = binary("s8[2]", "pred[2]", "compare", ", direction=GT");
  expect(gt, "pred[2] {false, true}", "s8[2] {-56, 1}", "s8[2] {100, -2}", NULL);
}
END_TEST

START_TEST(test_convert) {
  expect(unary("f32[6]", "s32[6]", "convert", NULL),
         "s32[6] {1, -1, 0, 2147483647, -2147483648, 0}",
         "f32[6] {1.9, -1.9, nan, 3e9, -inf, -0.5}", NULL);
  expect(unary("f32[3]", "u8[3]", "convert", NULL), "u8[3] {0, 255, 200}",
         "f32[3] {-5, 1000, 200.7}", NULL);
  expect(unary("s32[3]", "s8[3]", "convert", NULL), "s8[3] {-1, 0, 127}", "s32[3] {255, 256, 127}",
         NULL);
  expect(unary("f32[2]", "bf16[2]", "convert", NULL), "bf16[2] {1, 1.01}",
         "f32[2] {1.00390625, 1.005859375}", NULL);
  expect(unary("s32[2]", "f16[2]", "convert", NULL), "f16[2] {2048, inf}", "s32[2] {2049, 70000}",
         NULL);
  expect(unary("f32[3]", "pred[3]", "convert", NULL), "pred[3] {false, true, true}",
         "f32[3] {0, -2, nan}", NULL);
  expect(unary("f32[2]", "u32[2]", "bitcast-convert", NULL), "u32[2] {1065353216, 3221225472}",
         "f32[2] {1, -2}", NULL);
  expect(unary("u32[]", "u8[4]", "bitcast-convert", NULL), "u8[4] {4, 3, 2, 1}", "u32[] 16909060",
         NULL);
}
END_TEST

START_TEST(test_rounding_and_sign) {
  expect(unary("f32[6]", "f32[6]", "round-nearest-afz", NULL), "f32[6] {3, -3, 1, -0, 2, -2}",
         "f32[6] {2.5, -2.5, 0.5, -0.4, 1.5, -1.5}", NULL);
  expect(unary("f32[6]", "f32[6]", "round-nearest-even", NULL), "f32[6] {2, -2, 0, -0, 2, -2}",
         "f32[6] {2.5, -2.5, 0.5, -0.4, 1.5, -1.5}", NULL);
  expect(unary("f32[5]", "f32[5]", "sign", NULL), "f32[5] {-1, -0, 0, 1, nan}",
         "f32[5] {-3, -0, 0, 0.1, nan}", NULL);
  expect(unary("s32[3]", "s32[3]", "sign", NULL), "s32[3] {-1, 0, 1}", "s32[3] {-9, 0, 4}", NULL);
  expect(unary("f32[4]", "pred[4]", "is-finite", NULL), "pred[4] {true, false, false, false}",
         "f32[4] {1, inf, -inf, nan}", NULL);
  expect(unary("f32[2]", "f32[2]", "floor", NULL), "f32[2] {-2, 1}", "f32[2] {-1.5, 1.5}", NULL);
  expect(unary("f32[2]", "f32[2]", "ceil", NULL), "f32[2] {-1, 2}", "f32[2] {-1.5, 1.5}", NULL);
}
END_TEST

START_TEST(test_bit_ops) {
  expect(unary("s32[3]", "s32[3]", "popcnt", NULL), "s32[3] {32, 1, 0}", "s32[3] {-1, 8, 0}", NULL);
  expect(unary("u8[3]", "u8[3]", "count-leading-zeros", NULL), "u8[3] {8, 0, 7}",
         "u8[3] {0, 255, 1}", NULL);
  expect(unary("s32[2]", "s32[2]", "count-leading-zeros", NULL), "s32[2] {0, 31}", "s32[2] {-1, 1}",
         NULL);
  expect(unary("s8[2]", "s8[2]", "not", NULL), "s8[2] {-1, 0}", "s8[2] {0, -1}", NULL);
  expect(unary("pred[2]", "pred[2]", "not", NULL), "pred[2] {true, false}", "pred[2] {false, true}",
         NULL);
  expect(binary("u8[]", "u8[]", "xor", NULL), "u8[] 15", "u8[] 240", "u8[] 255", NULL);
  expect(binary("pred[2]", "pred[2]", "and", NULL), "pred[2] {false, true}", "pred[2] {true, true}",
         "pred[2] {false, true}", NULL);
}
END_TEST

START_TEST(test_power) {
  expect(binary("s32[6]", "s32[6]", "power", NULL), "s32[6] {1, 1, 0, 0, 1024, -8}",
         "s32[6] {1, 5, 2, -1, 2, -2}", "s32[6] {-3, 0, -1, -1, 10, 3}", NULL);
  expect(binary("u8[]", "u8[]", "power", NULL), "u8[] 0", "u8[] 2", "u8[] 8", NULL);
  expect(binary("f32[4]", "f32[4]", "power", NULL), "f32[4] {1, 1, 0.25, -nan}",
         "f32[4] {1, nan, 2, -2}", "f32[4] {nan, 0, -2, 0.5}", NULL);
}
END_TEST

START_TEST(test_transcendentals) {
  expect(binary("f32[4]", "f32[4]", "atan2", NULL), "f32[4] {0.7853982, 3.1415927, -0, 1.5707964}",
         "f32[4] {1, 0, -0, 1}", "f32[4] {1, -1, 1, 0}", NULL);
  expect(unary("f32[3]", "f32[3]", "cbrt", NULL), "f32[3] {3, -2, 0}", "f32[3] {27, -8, 0}", NULL);
  expect(unary("f64[2]", "f64[2]", "logistic", NULL), "f64[2] {0.5, 0.7310585786300049}",
         "f64[2] {0, 1}", NULL);
  expect(unary("f64[2]", "f64[2]", "exponential-minus-one", NULL),
         "f64[2] {1.00000000005e-10, 1.718281828459045}", "f64[2] {1e-10, 1}", NULL);
  expect(unary("f64[2]", "f64[2]", "log-plus-one", NULL), "f64[2] {9.999999999500001e-11, 0}",
         "f64[2] {1e-10, 0}", NULL);
  expect(unary("f64[2]", "f64[2]", "erf", NULL), "f64[2] {0, 0.8427007929497149}", "f64[2] {0, 1}",
         NULL);
  expect(unary("f32[2]", "f32[2]", "rsqrt", NULL), "f32[2] {0.5, inf}", "f32[2] {4, 0}", NULL);
}
END_TEST

START_TEST(test_reduce_precision) {
  /* To bf16's format: 1 + 2^-8 ties to 1; 1 + 3*2^-8 -> 1 + 2^-6. */
  expect(unary("f32[2]", "f32[2]", "reduce-precision", ", exponent_bits=8, mantissa_bits=7"),
         "f32[2] {1, 1.015625}", "f32[2] {1.00390625, 1.01171875}", NULL);
  /* To f16's range: overflow to inf, below the smallest normal to zero,
   * NaN kept. */
  expect(unary("f32[4]", "f32[4]", "reduce-precision", ", exponent_bits=5, mantissa_bits=10"),
         "f32[4] {inf, -0, 1, nan}", "f32[4] {70000, -1e-6, 1, nan}", NULL);
}
END_TEST

START_TEST(test_complex_basics) {
  expect("HloModule m\nENTRY e { a = f32[2] parameter(0)\n b = f32[2] parameter(1)\n"
         " z = c64[2] complex(a, b)\n w = c64[2] multiply(z, z)\n"
         " re = f32[2] real(w)\n im = f32[2] imag(w)\n ab = f32[2] abs(z)\n"
         " ROOT t = (f32[2], f32[2], f32[2]) tuple(re, im, ab) }\n",
         "(f32[2], f32[2], f32[2]) ({-7, 4}, {24, 0}, {5, 2})", "f32[2] {3, 2}", "f32[2] {4, 0}",
         NULL);
  expect_fail(unary("c64[2]", "c64[2]", "sine", NULL), KILN_EUNIMPL, "not supported on complex",
              "c64[2] {(1, 0), (0, 1)}", NULL);
}
END_TEST

START_TEST(test_select_and_storage_only_types) {
  expect("HloModule m\nENTRY e { p = pred[3] parameter(0)\n a = s32[3] parameter(1)\n"
         " b = s32[3] parameter(2)\n ROOT s = s32[3] select(p, a, b) }\n",
         "s32[3] {1, 20, 3}", "pred[3] {true, false, true}", "s32[3] {1, 2, 3}",
         "s32[3] {10, 20, 30}", NULL);
  expect_fail(binary("f8e4m3fn[2]", "f8e4m3fn[2]", "add", NULL), KILN_EUNIMPL,
              "no arithmetic for its", "f8e4m3fn[2] {1, 2}", "f8e4m3fn[2] {1, 2}", NULL);
}
END_TEST

START_TEST(test_stochastic_convert) {
  /* Fraction 0.5 of u8 range is 128: random 127 rounds up, 128 does not. */
  expect("HloModule m\nENTRY e { a = f32[4] parameter(0)\n r = u32[4] parameter(1)\n"
         " ROOT c = s8[4] stochastic-convert(a, r) }\n",
         "s8[4] {2, 1, -2, 127}", "f32[4] {1.5, 1.5, -1.5, 1000}",
         "u32[4] {2147483647, 2147483648, 0, 0}", NULL);
}
END_TEST

int main(void) {
  Suite *s = suite_create("interp_numerics");
  TCase *tc = tcase_create("numerics");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_bf16_rounds_after_each_op);
  tcase_add_test(tc, test_integer_wraparound);
  tcase_add_test(tc, test_integer_division_edges);
  tcase_add_test(tc, test_shifts);
  tcase_add_test(tc, test_max_min_nan);
  tcase_add_test(tc, test_compare_total_order);
  tcase_add_test(tc, test_convert);
  tcase_add_test(tc, test_rounding_and_sign);
  tcase_add_test(tc, test_bit_ops);
  tcase_add_test(tc, test_power);
  tcase_add_test(tc, test_transcendentals);
  tcase_add_test(tc, test_reduce_precision);
  tcase_add_test(tc, test_complex_basics);
  tcase_add_test(tc, test_select_and_storage_only_types);
  tcase_add_test(tc, test_stochastic_convert);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
