/* Unit tests for the canonical HLO text printer (text_print.c,
 * text_print_literal.c).
 *
 * Three layers: literals of every element type against exact strings;
 * modules built with the IR builder against exact text (no parser needed);
 * and, with the parser, the golden files under tests/golden/ (input, then
 * the canonical text in a trailing EXPECTED comment) and the conformance
 * corpus, each checked for print -> parse -> print being a fixed point.
 */
#include <check.h>
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/fp16.h"
#include "common/sbuf.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/text.h"

/* ---- literal helpers ---------------------------------------------------- */

/* An assertion that talks to Check only when it fails: Check's own
 * assertions write to a pipe each time, too slow in loops over 10^5 values. */
#define QUIET_ASSERT(cond, ...) \
  do { \
    if (!(cond)) ck_abort_msg(__VA_ARGS__); \
  } while (0)

static kiln_literal *make_lit(kiln_dtype t, const int64_t *dims, uint32_t rank) {
  kiln_arena *a = kiln_arena_create();
  ck_assert_ptr_nonnull(a);
  kiln_shape s;
  ck_assert_int_eq(kiln_shape_make_array(a, &s, t, dims, rank), 0);
  kiln_literal *lit = NULL;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &lit, &st), 0);
  kiln_arena_destroy(a);
  return lit;
}

static char *lit_text(const kiln_literal *lit, bool with_shape) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_literal_print(&b, lit, with_shape);
  QUIET_ASSERT(!kiln_sbuf_failed(&b), "out of memory printing a literal");
  if (b.data == NULL) kiln_sbuf_putn(&b, "", 0);
  return kiln_sbuf_detach(&b, NULL);
}

#define CHECK_LIT(lit, ws, want) \
  do { \
    char *got_ = lit_text((lit), (ws)); \
    ck_assert_str_eq(got_, (want)); \
    kiln_free(got_); \
  } while (0)

/* A scalar f64-valued literal of type t holding v, printed without shape. */
static void check_scalar(kiln_dtype t, double v, const char *want) {
  kiln_literal *lit = make_lit(t, NULL, 0);
  kiln_literal_set_f64(lit, 0, v);
  CHECK_LIT(lit, false, want);
  kiln_literal_destroy(lit);
}

static void check_f32_bits(uint32_t bits, const char *want) {
  kiln_literal *lit = make_lit(KILN_F32, NULL, 0);
  memcpy(lit->data, &bits, 4);
  CHECK_LIT(lit, false, want);
  kiln_literal_destroy(lit);
}

static void check_byte(kiln_dtype t, uint8_t byte, const char *want) {
  kiln_literal *lit = make_lit(t, NULL, 0);
  ((uint8_t *)lit->data)[0] = byte;
  CHECK_LIT(lit, false, want);
  kiln_literal_destroy(lit);
}

static void check_u16(kiln_dtype t, uint16_t bits, const char *want) {
  kiln_literal *lit = make_lit(t, NULL, 0);
  memcpy(lit->data, &bits, 2);
  CHECK_LIT(lit, false, want);
  kiln_literal_destroy(lit);
}

/* ---- literal tests ------------------------------------------------------ */

START_TEST(test_lit_f32) {
  check_scalar(KILN_F32, 0.1, "0.1");
  check_scalar(KILN_F32, 1e30, "1e+30");
  check_scalar(KILN_F32, 1.0, "1");
  check_scalar(KILN_F32, 100.0, "100");
  check_scalar(KILN_F32, 1.5, "1.5");
  check_scalar(KILN_F32, -2.25, "-2.25");
  check_scalar(KILN_F32, 0.001, "0.001");
  check_scalar(KILN_F32, 0.0001, "0.0001");
  check_scalar(KILN_F32, 0.00001, "1e-05");
  check_scalar(KILN_F32, 16777216.0, "16777216");
  check_scalar(KILN_F32, 123456789.0, "123456790"); /* nearest f32 is 123456792 */
  check_scalar(KILN_F32, 1.0 / 3.0, "0.33333334");
  check_scalar(KILN_F32, FLT_MAX, "3.4028235e+38");
  check_scalar(KILN_F32, -FLT_MAX, "-3.4028235e+38");
  check_scalar(KILN_F32, FLT_MIN, "1.1754944e-38");
  check_f32_bits(0x00000001u, "1e-45"); /* smallest subnormal */
  check_f32_bits(0x00000003u, "4e-45");
  check_f32_bits(0x007fffffu, "1.1754942e-38"); /* largest subnormal */
  check_f32_bits(0x80000000u, "-0");
  check_f32_bits(0x00000000u, "0");
  check_f32_bits(0x7f800000u, "inf");
  check_f32_bits(0xff800000u, "-inf");
  check_f32_bits(0x7fc00000u, "nan");
  check_f32_bits(0xffc00000u, "-nan");
  check_f32_bits(0x7f800001u, "nan"); /* payloads are not printed */
}
END_TEST

START_TEST(test_lit_f64) {
  check_scalar(KILN_F64, 0.1, "0.1");
  check_scalar(KILN_F64, 1.0 / 3.0, "0.3333333333333333");
  check_scalar(KILN_F64, 2.0 / 3.0, "0.6666666666666666");
  check_scalar(KILN_F64, DBL_MAX, "1.7976931348623157e+308");
  check_scalar(KILN_F64, DBL_MIN, "2.2250738585072014e-308");
  check_scalar(KILN_F64, 4.9406564584124654e-324, "5e-324");
  check_scalar(KILN_F64, 1e16, "1e+16");
  check_scalar(KILN_F64, 9007199254740992.0, "9007199254740992");
  check_scalar(KILN_F64, 123.456, "123.456");
  check_scalar(KILN_F64, 1e-300, "1e-300");
  check_scalar(KILN_F64, -0.0, "-0");
  check_scalar(KILN_F64, INFINITY, "inf");
  check_scalar(KILN_F64, -INFINITY, "-inf");
  check_scalar(KILN_F64, NAN, "nan");
  check_scalar(KILN_F64, 0.30000000000000004, "0.30000000000000004");
}
END_TEST

START_TEST(test_lit_f16_bf16) {
  check_scalar(KILN_F16, 65504, "65500"); /* the max: 65500 reads back to it */
  check_scalar(KILN_F16, -65504, "-65500");
  check_scalar(KILN_F16, 2048, "2048");
  check_scalar(KILN_F16, 2050, "2050");
  check_scalar(KILN_F16, 0.1, "0.1"); /* stored 0.0999755859375 */
  check_scalar(KILN_F16, 1.0 / 3.0, "0.3333");
  check_scalar(KILN_F16, 1.0009765625, "1.001"); /* 1 + 2^-10 */
  check_u16(KILN_F16, 0x0001, "6e-08");          /* 2^-24 */
  check_u16(KILN_F16, 0x03ff, "6.1e-05");        /* largest subnormal */
  check_u16(KILN_F16, 0x0400, "6.104e-05");      /* smallest normal 2^-14 */
  check_u16(KILN_F16, 0x8000, "-0");
  check_u16(KILN_F16, 0x7c00, "inf");
  check_u16(KILN_F16, 0xfc00, "-inf");
  check_u16(KILN_F16, 0x7e00, "nan");
  check_scalar(KILN_BF16, 1.0078125, "1.01"); /* 1 + 2^-7, shortest in bf16 */
  check_scalar(KILN_BF16, 0.1, "0.1");
  check_scalar(KILN_BF16, 3.3895313892515355e38, "3.39e+38"); /* bf16 max */
  check_scalar(KILN_BF16, -3.39e38, "-3.39e+38");
  check_scalar(KILN_BF16, 1.0, "1");
  check_scalar(KILN_BF16, 3.140625, "3.14");
  check_scalar(KILN_BF16, 256, "256");
  check_scalar(KILN_BF16, 257, "256");
  check_scalar(KILN_BF16, 259, "260");
  check_u16(KILN_BF16, 0x0001, "9e-41"); /* smallest subnormal 2^-133 */
  check_u16(KILN_BF16, 0x8000, "-0");
  check_u16(KILN_BF16, 0x7f80, "inf");
  check_u16(KILN_BF16, 0xffc0, "-nan");
}
END_TEST

START_TEST(test_lit_small_floats) {
  check_byte(KILN_F8E4M3FN, 0x7e, "450"); /* 448, the max */
  check_byte(KILN_F8E4M3FN, 0xfe, "-450");
  check_byte(KILN_F8E4M3FN, 0x7d, "420"); /* 416 */
  check_byte(KILN_F8E4M3FN, 0x7f, "nan");
  check_byte(KILN_F8E4M3FN, 0x01, "0.002"); /* 2^-9 */
  check_byte(KILN_F8E4M3FN, 0x38, "1");
  check_byte(KILN_F8E5M2, 0x3c, "1");
  check_byte(KILN_F8E5M2, 0x7b, "60000"); /* 57344, the max */
  check_byte(KILN_F8E5M2, 0x7c, "inf");
  check_byte(KILN_F8E5M2, 0x01, "2e-05"); /* 2^-16, next up 2^-15 */
  check_byte(KILN_F8E4M3B11FNUZ, 0x80, "nan");
  check_byte(KILN_F8E4M3B11FNUZ, 0x58, "1"); /* e=11 */
  check_byte(KILN_F8E5M2FNUZ, 0x80, "nan");
  check_byte(KILN_F8E5M2FNUZ, 0x40, "1"); /* e=16 */
  check_byte(KILN_F8E4M3FNUZ, 0x40, "1"); /* e=8 */
  check_byte(KILN_F8E4M3FNUZ, 0x7f, "240");
  check_byte(KILN_F8E4M3, 0x38, "1");
  check_byte(KILN_F8E4M3, 0x78, "inf");
  check_byte(KILN_F8E3M4, 0x30, "1");
  check_byte(KILN_F8E3M4, 0x31, "1.06"); /* 1 + 1/16 */
  check_byte(KILN_F4E2M1FN, 0x07, "6");
  check_byte(KILN_F4E2M1FN, 0x01, "0.5");
  check_byte(KILN_F4E2M1FN, 0x0b, "-1.5");
  check_byte(KILN_F8E8M0FNU, 127, "1");
  check_byte(KILN_F8E8M0FNU, 130, "8");
  check_byte(KILN_F8E8M0FNU, 0xff, "nan");
  check_byte(KILN_F8E8M0FNU, 0, "6e-39"); /* 2^-127 */
}
END_TEST

START_TEST(test_lit_integers) {
  int64_t d2[] = {2};
  kiln_literal *lit = make_lit(KILN_S64, d2, 1);
  kiln_literal_set_s64(lit, 0, INT64_MIN);
  kiln_literal_set_s64(lit, 1, INT64_MAX);
  CHECK_LIT(lit, false, "{-9223372036854775808, 9223372036854775807}");
  CHECK_LIT(lit, true, "s64[2] {-9223372036854775808, 9223372036854775807}");
  kiln_literal_destroy(lit);

  lit = make_lit(KILN_U64, d2, 1);
  kiln_literal_set_u64(lit, 0, 0);
  kiln_literal_set_u64(lit, 1, UINT64_MAX);
  CHECK_LIT(lit, false, "{0, 18446744073709551615}");
  kiln_literal_destroy(lit);

  static const struct {
    kiln_dtype t;
    int64_t lo, hi;
    const char *want;
  } cases[] = {
      {KILN_S2, -2, 1, "{-2, 1}"},
      {KILN_S4, -8, 7, "{-8, 7}"},
      {KILN_S8, -128, 127, "{-128, 127}"},
      {KILN_S16, -32768, 32767, "{-32768, 32767}"},
      {KILN_S32, INT32_MIN, INT32_MAX, "{-2147483648, 2147483647}"},
      {KILN_U2, 0, 3, "{0, 3}"},
      {KILN_U4, 0, 15, "{0, 15}"},
      {KILN_U8, 0, 255, "{0, 255}"},
      {KILN_U16, 0, 65535, "{0, 65535}"},
      {KILN_U32, 0, UINT32_MAX, "{0, 4294967295}"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    lit = make_lit(cases[i].t, d2, 1);
    kiln_literal_set_s64(lit, 0, cases[i].lo);
    kiln_literal_set_s64(lit, 1, cases[i].hi);
    CHECK_LIT(lit, false, cases[i].want);
    kiln_literal_destroy(lit);
  }
}
END_TEST

START_TEST(test_lit_pred_complex) {
  int64_t d3[] = {3};
  kiln_literal *lit = make_lit(KILN_PRED, d3, 1);
  kiln_literal_set_s64(lit, 0, 1);
  kiln_literal_set_s64(lit, 2, 1);
  CHECK_LIT(lit, true, "pred[3] {true, false, true}");
  kiln_literal_destroy(lit);

  lit = make_lit(KILN_PRED, NULL, 0);
  CHECK_LIT(lit, false, "false");
  kiln_literal_destroy(lit);

  int64_t d2[] = {2};
  lit = make_lit(KILN_C64, d2, 1);
  kiln_literal_set_c128(lit, 0, 1.5, -2);
  kiln_literal_set_c128(lit, 1, 0.1, 3.4028234663852886e38);
  CHECK_LIT(lit, false, "{(1.5, -2), (0.1, 3.4028235e+38)}");
  kiln_literal_destroy(lit);

  lit = make_lit(KILN_C128, NULL, 0);
  kiln_literal_set_c128(lit, 0, 0.1, -1e300);
  CHECK_LIT(lit, true, "c128[] (0.1, -1e+300)");
  kiln_literal_destroy(lit);
}
END_TEST

START_TEST(test_lit_arrays) {
  int64_t d23[] = {2, 3};
  kiln_literal *lit = make_lit(KILN_F32, d23, 2);
  for (int i = 0; i < 6; i++) kiln_literal_set_f64(lit, i, i + 1);
  CHECK_LIT(lit, false, "{{1, 2, 3}, {4, 5, 6}}");
  CHECK_LIT(lit, true, "f32[2,3] {{1, 2, 3}, {4, 5, 6}}");
  kiln_literal_destroy(lit);

  int64_t d222[] = {2, 2, 2};
  lit = make_lit(KILN_S32, d222, 3);
  for (int i = 0; i < 8; i++) kiln_literal_set_s64(lit, i, i);
  CHECK_LIT(lit, false, "{{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}}");
  kiln_literal_destroy(lit);

  int64_t d0[] = {0};
  lit = make_lit(KILN_F32, d0, 1);
  CHECK_LIT(lit, true, "f32[0] {}");
  kiln_literal_destroy(lit);

  int64_t d20[] = {2, 0};
  lit = make_lit(KILN_F32, d20, 2);
  CHECK_LIT(lit, false, "{{}, {}}");
  kiln_literal_destroy(lit);

  int64_t d03[] = {0, 3};
  lit = make_lit(KILN_F32, d03, 2);
  CHECK_LIT(lit, false, "{}");
  kiln_literal_destroy(lit);

  int64_t d1111[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  lit = make_lit(KILN_U8, d1111, 11); /* deeper than the on-stack scratch */
  kiln_literal_set_s64(lit, 0, 7);
  CHECK_LIT(lit, false, "{{{{{{{{{{{7}}}}}}}}}}}");
  kiln_literal_destroy(lit);

  lit = make_lit(KILN_F32, NULL, 0);
  kiln_literal_set_f64(lit, 0, 2.5);
  CHECK_LIT(lit, true, "f32[] 2.5");
  kiln_literal_destroy(lit);
}
END_TEST

START_TEST(test_lit_layout_dynamic) {
  kiln_arena *a = kiln_arena_create();
  int64_t d2[] = {2}, m2m[] = {0};
  kiln_shape s;
  ck_assert_int_eq(kiln_shape_make_array(a, &s, KILN_F32, d2, 1), 0);
  kiln_layout lay = {.minor_to_major = m2m, .rank = 1};
  s.layout = &lay;
  kiln_literal *lit = NULL;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &lit, &st), 0);
  kiln_literal_set_f64(lit, 0, 1);
  kiln_literal_set_f64(lit, 1, 2);
  CHECK_LIT(lit, true, "f32[2]{0} {1, 2}");
  kiln_literal_destroy(lit);

  /* s32[<=4] holding 2 elements: only those print. */
  int64_t d4[] = {4};
  uint8_t dyn[] = {1};
  ck_assert_int_eq(kiln_shape_make_array(a, &s, KILN_S32, d4, 1), 0);
  s.dynamic = dyn;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &lit, &st), 0);
  for (int i = 0; i < 4; i++) kiln_literal_set_s64(lit, i, i + 1);
  int64_t rt[] = {2};
  lit->dynamic_sizes = rt;
  CHECK_LIT(lit, true, "s32[<=4] {1, 2}");
  lit->dynamic_sizes = NULL;
  CHECK_LIT(lit, false, "{1, 2, 3, 4}");
  kiln_literal_destroy(lit);

  /* s32[2,<=3] holding 2x1: strides follow the bound. */
  int64_t d23[] = {2, 3};
  uint8_t dyn2[] = {0, 1};
  ck_assert_int_eq(kiln_shape_make_array(a, &s, KILN_S32, d23, 2), 0);
  s.dynamic = dyn2;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &lit, &st), 0);
  for (int i = 0; i < 6; i++) kiln_literal_set_s64(lit, i, i);
  int64_t rt2[] = {2, 1};
  lit->dynamic_sizes = rt2;
  CHECK_LIT(lit, false, "{{0}, {3}}");
  lit->dynamic_sizes = NULL;
  kiln_literal_destroy(lit);
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(test_lit_tuples) {
  kiln_arena *a = kiln_arena_create();
  kiln_shape el[3], inner[2], t;
  int64_t d2[] = {2};
  ck_assert_int_eq(kiln_shape_make_array(a, &el[0], KILN_S32, NULL, 0), 0);
  ck_assert_int_eq(kiln_shape_make_array(a, &inner[0], KILN_F32, d2, 1), 0);
  ck_assert_int_eq(kiln_shape_make_tuple(a, &inner[1], NULL, 0), 0);
  ck_assert_int_eq(kiln_shape_make_tuple(a, &el[1], inner, 2), 0);
  ck_assert_int_eq(kiln_shape_make_array(a, &el[2], KILN_PRED, NULL, 0), 0);
  ck_assert_int_eq(kiln_shape_make_tuple(a, &t, el, 3), 0);
  kiln_literal *lit = NULL;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_literal_create(NULL, &t, 0, &lit, &st), 0);
  kiln_literal_set_s64(lit->elems[0], 0, -1);
  kiln_literal_set_f64(lit->elems[1]->elems[0], 0, 0.5);
  kiln_literal_set_f64(lit->elems[1]->elems[0], 1, 1e-7);
  kiln_literal_set_s64(lit->elems[2], 0, 1);
  CHECK_LIT(lit, false, "(-1, ({0.5, 1e-07}, ()), true)");
  CHECK_LIT(lit, true, "(s32[], (f32[2], ()), pred[]) (-1, ({0.5, 1e-07}, ()), true)");
  kiln_literal_destroy(lit);
  kiln_arena_destroy(a);
}
END_TEST

/* Significant digits of a printed number: no sign, point, exponent or
 * leading zeros, nor the trailing zeros of a plain integer ("100"). */
static int sig_digits(const char *s) {
  int nd = 0, trailing_zeros = 0;
  bool seen = false;
  for (const char *p = s[0] == '-' ? s + 1 : s; *p && *p != 'e'; p++) {
    if (*p == '.') continue;
    if (*p != '0') seen = true;
    if (seen) {
      nd++;
      trailing_zeros = *p == '0' ? trailing_zeros + 1 : 0;
    }
  }
  if (!strchr(s, '.') && !strchr(s, 'e')) nd -= trailing_zeros;
  return nd;
}

/* Every f16 and bf16 bit pattern prints as text that converts back to the
 * same pattern (NaNs to a NaN), and no shorter text would. */
static bool f16_family_reads_back(kiln_dtype t, uint16_t h, const char *s) {
  double x = strtod(s, NULL);
  uint16_t back = t == KILN_F16 ? kiln_f64_to_f16(x) : kiln_f64_to_bf16(x);
  return back == h;
}

START_TEST(test_lit_exhaustive_16bit) {
  kiln_dtype types[] = {KILN_F16, KILN_BF16};
  for (int k = 0; k < 2; k++) {
    kiln_literal *lit = make_lit(types[k], NULL, 0);
    for (uint32_t bits = 0; bits <= 0xffff; bits++) {
      uint16_t h = (uint16_t)bits;
      memcpy(lit->data, &h, 2);
      char *s = lit_text(lit, false);
      double v = types[k] == KILN_F16 ? kiln_f16_to_f64(h) : kiln_bf16_to_f64(h);
      if (isnan(v)) {
        QUIET_ASSERT(strcmp(s, "nan") == 0 || strcmp(s, "-nan") == 0, "NaN printed as %s", s);
      } else if (!f16_family_reads_back(types[k], h, s)) {
        ck_abort_msg("%s bits 0x%04x printed as %s, which reads back differently",
                     kiln_dtype_name(types[k]), bits, s);
      }
      /* Shortest: one significant digit fewer must not read back. */
      if (isfinite(v) && v != 0) {
        char shorter[64];
        int nd = sig_digits(s);
        if (nd > 1) {
          snprintf(shorter, sizeof shorter, "%.*e", nd - 2, fabs(v));
          uint16_t habs = (uint16_t)(h & 0x7fff);
          QUIET_ASSERT(!f16_family_reads_back(types[k], habs, shorter),
                       "%s bits 0x%04x: %s is shorter than %s", kiln_dtype_name(types[k]), bits,
                       shorter, s);
        }
      }
      kiln_free(s);
    }
    kiln_literal_destroy(lit);
  }
}
END_TEST

/* Random f32 and f64 bit patterns read back exactly. */
START_TEST(test_lit_roundtrip_random) {
  uint64_t x = 0x9e3779b97f4a7c15ull;
  kiln_literal *l32 = make_lit(KILN_F32, NULL, 0), *l64 = make_lit(KILN_F64, NULL, 0);
  for (int i = 0; i < 50000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    uint32_t b32 = (uint32_t)x;
    float f;
    memcpy(&f, &b32, 4);
    memcpy(l32->data, &b32, 4);
    double d;
    memcpy(&d, &x, 8);
    memcpy(l64->data, &x, 8);
    char *s = lit_text(l32, false);
    if (!isnan(f)) {
      float back = strtof(s, NULL);
      QUIET_ASSERT(memcmp(&back, &f, 4) == 0, "f32 %a printed as %s", (double)f, s);
      /* Never longer than the first correctly rounded "%.*e" that reads
       * back, and the same number when as long. */
      if (isfinite(f) && f != 0) {
        char ref[64];
        int p = 1;
        for (; p < 9; p++) {
          snprintf(ref, sizeof ref, "%.*e", p - 1, (double)f);
          if (strtof(ref, NULL) == f) break;
        }
        snprintf(ref, sizeof ref, "%.*e", p - 1, (double)f);
        int nd = sig_digits(s);
        QUIET_ASSERT(nd <= p, "f32 %a printed as %s, longer than %s", (double)f, s, ref);
        if (nd == p)
          QUIET_ASSERT(strtod(s, NULL) == strtod(ref, NULL), "f32 %a printed as %s, not %s",
                       (double)f, s, ref);
      }
    }
    kiln_free(s);
    s = lit_text(l64, false);
    if (!isnan(d)) {
      double back = strtod(s, NULL);
      QUIET_ASSERT(memcmp(&back, &d, 8) == 0, "f64 %a printed as %s", d, s);
    }
    kiln_free(s);
  }
  kiln_literal_destroy(l32);
  kiln_literal_destroy(l64);
}
END_TEST

/* ---- module helpers ------------------------------------------------------ */

static char *module_text(const kiln_module *m) {
  size_t len = 0;
  char *s = kiln_module_print(m, &len);
  ck_assert_ptr_nonnull(s);
  ck_assert_uint_eq(len, strlen(s));
  return s;
}

#define CHECK_MODULE(m, want) \
  do { \
    char *got_ = module_text(m); \
    ck_assert_str_eq(got_, (want)); \
    kiln_free(got_); \
  } while (0)

static void set_shape(kiln_module *m, kiln_instr *ins, kiln_dtype t, const int64_t *dims,
                      uint32_t rank) {
  ck_assert_int_eq(kiln_shape_make_array(m->arena, &ins->shape, t, dims, rank), 0);
}

static kiln_instr *param(kiln_module *m, uint32_t c, const char *name, int64_t n, kiln_dtype t,
                         const int64_t *dims, uint32_t rank) {
  kiln_instr *p = kiln_module_add_instr(m, c, KILN_OP_PARAMETER, name);
  ck_assert_ptr_nonnull(p);
  p->param_number = n;
  set_shape(m, p, t, dims, rank);
  return p;
}

static kiln_instr *op2(kiln_module *m, uint32_t c, kiln_opcode op, const char *name, kiln_id a,
                       kiln_id b, kiln_dtype t, const int64_t *dims, uint32_t rank) {
  kiln_instr *ins = kiln_module_add_instr(m, c, op, name);
  ck_assert_ptr_nonnull(ins);
  kiln_id ops[2] = {a, b};
  ck_assert_int_eq(kiln_instr_set_operands(m, ins, ops, b == KILN_NO_ID ? 1 : 2), 0);
  set_shape(m, ins, t, dims, rank);
  return ins;
}

static uint32_t add_comp(kiln_module *m, const char *name) {
  uint32_t id;
  ck_assert_int_eq(kiln_module_add_computation(m, name, &id), 0);
  return id;
}

static void set_entry(kiln_module *m, uint32_t c) {
  m->entry = c;
  m->comps[c]->is_entry = true;
}

/* The scalar add reducer "add" (x, y) -> f32[]. */
static uint32_t add_reducer(kiln_module *m, const char *name) {
  uint32_t c = add_comp(m, name);
  kiln_instr *x = param(m, c, "x", 0, KILN_F32, NULL, 0);
  kiln_instr *y = param(m, c, "y", 1, KILN_F32, NULL, 0);
  op2(m, c, KILN_OP_ADD, "sum", x->id, y->id, KILN_F32, NULL, 0);
  return c;
}

static kiln_instr *constant_f32(kiln_module *m, uint32_t c, const char *name, double v) {
  kiln_instr *k = kiln_module_add_instr(m, c, KILN_OP_CONSTANT, name);
  set_shape(m, k, KILN_F32, NULL, 0);
  kiln_status st = {0};
  ck_assert_int_eq(kiln_literal_create(m->arena, &k->shape, 0, &k->literal, &st), 0);
  kiln_literal_set_f64(k->literal, 0, v);
  return k;
}

/* ---- module tests -------------------------------------------------------- */

START_TEST(test_module_reduce) {
  kiln_module *m = kiln_module_create("reduce_mod");
  uint32_t add = add_reducer(m, "add");
  uint32_t e = add_comp(m, "main");
  set_entry(m, e);
  int64_t d816[] = {8, 16}, d8[] = {8};
  kiln_instr *p = param(m, e, "p", 0, KILN_F32, d816, 2);
  int64_t m2m[] = {1, 0};
  p->shape.layout = kiln_arena_calloc(m->arena, 1, sizeof(kiln_layout));
  p->shape.layout->minor_to_major = m2m;
  p->shape.layout->rank = 2;
  kiln_instr *z = constant_f32(m, e, "zero", 0);
  kiln_instr *r = op2(m, e, KILN_OP_REDUCE, "r", p->id, z->id, KILN_F32, d8, 1);
  int64_t dims[] = {1};
  ck_assert_int_eq(kiln_instr_set_attr_ints(m, r, KILN_ATTR_DIMENSIONS, dims, 1), 0);
  ck_assert_int_eq(kiln_instr_set_called(m, r, &add, 1), 0);
  CHECK_MODULE(m, "HloModule reduce_mod\n"
                  "\n"
                  "%add (x: f32[], y: f32[]) -> f32[] {\n"
                  "  %x = f32[] parameter(0)\n"
                  "  %y = f32[] parameter(1)\n"
                  "  ROOT %sum = f32[] add(%x, %y)\n"
                  "}\n"
                  "\n"
                  "ENTRY %main (p: f32[8,16]{1,0}) -> f32[8] {\n"
                  "  %p = f32[8,16]{1,0} parameter(0)\n"
                  "  %zero = f32[] constant(0)\n"
                  "  ROOT %r = f32[8] reduce(%p, %zero), dimensions={1}, to_apply=%add\n"
                  "}\n");
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_module_header) {
  kiln_module *m = kiln_module_create("h");
  m->is_scheduled = 1;
  kiln_program_shape *ps = kiln_arena_calloc(m->arena, 1, sizeof *ps);
  ps->nparams = 2;
  ps->params = kiln_arena_calloc(m->arena, 2, sizeof(kiln_shape));
  int64_t d2[] = {2}, m2m[] = {0};
  kiln_shape_make_array(m->arena, &ps->params[0], KILN_F32, d2, 1);
  kiln_layout lay = {.minor_to_major = m2m, .rank = 1};
  ps->params[0].layout = &lay;
  kiln_shape_make_array(m->arena, &ps->params[1], KILN_S32, NULL, 0);
  kiln_shape_make_array(m->arena, &ps->result, KILN_F32, d2, 1);
  ps->result.layout = &lay;
  m->entry_layout = ps;
  kiln_alias al[2];
  int64_t zero = 0, one = 1;
  al[0] = (kiln_alias){.output_index = {&zero, 1}, .param_number = 0, .kind = KILN_ALIAS_MUST};
  al[1] = (kiln_alias){.output_index = {&one, 1},
                       .param_number = 1,
                       .param_index = {&one, 1},
                       .kind = KILN_ALIAS_MAY};
  m->aliases = al;
  m->naliases = 2;
  m->has_aliases = true;
  m->replica_count = 2;
  m->num_partitions = 4;
  kiln_raw_attr extra[2] = {{"allow_spmd_sharding_propagation_to_output", "{true}"},
                            {"frontend_attributes", "{xla.sdy=\"x\"}"}};
  m->header_extra = extra;
  m->nheader_extra = 2;
  CHECK_MODULE(m, "HloModule h, is_scheduled=true, "
                  "entry_computation_layout={(f32[2]{0}, s32[])->f32[2]{0}}, "
                  "input_output_alias={ {0}: (0, {}, must-alias), {1}: (1, {1}) }, "
                  "replica_count=2, num_partitions=4, "
                  "allow_spmd_sharding_propagation_to_output={true}, "
                  "frontend_attributes={xla.sdy=\"x\"}\n");
  m->naliases = 0;
  m->is_scheduled = 0;
  m->entry_layout = NULL;
  m->replica_count = m->num_partitions = 0;
  m->nheader_extra = 0;
  CHECK_MODULE(m, "HloModule h, is_scheduled=false, input_output_alias={}\n");
  m->has_aliases = false;
  m->is_scheduled = -1;
  CHECK_MODULE(m, "HloModule h\n");
  kiln_module_destroy(m);
}
END_TEST

/* Builds one instruction carrying an attribute of every kind. */
START_TEST(test_module_attr_kinds) {
  kiln_module *m = kiln_module_create("attrs");
  uint32_t e = add_comp(m, "e");
  set_entry(m, e);
  int64_t d4[] = {4};
  kiln_instr *p = param(m, e, "p", 0, KILN_F32, d4, 1);
  kiln_instr *x = op2(m, e, KILN_OP_CUSTOM_CALL, "x", p->id, KILN_NO_ID, KILN_F32, d4, 1);
  kiln_arena *a = m->arena;
  /* added out of order on purpose: printing sorts by table order */
  kiln_attr *at = kiln_instr_add_attr(m, x, KILN_ATTR_UNKNOWN);
  at->name = "zeta";
  at->v.s = "{z}";
  at = kiln_instr_add_attr(m, x, KILN_ATTR_METADATA);
  at->v.s = "{op_name=\"a/b\" source_line=3}";
  at = kiln_instr_add_attr(m, x, KILN_ATTR_UNKNOWN);
  at->name = "alpha";
  at->v.s = "7";
  kiln_instr_set_attr_int(m, x, KILN_ATTR_INDEX, -1);
  kiln_instr_set_attr_int(m, x, KILN_ATTR_INDICES_ARE_SORTED, 1);
  kiln_instr_set_attr_int(m, x, KILN_ATTR_UNIQUE_INDICES, 0);
  at = kiln_instr_add_attr(m, x, KILN_ATTR_EPSILON);
  at->v.f = 0.001;
  int64_t dims[] = {1, 0};
  kiln_instr_set_attr_ints(m, x, KILN_ATTR_DIMENSIONS, dims, 2);
  kiln_instr_set_attr_ints(m, x, KILN_ATTR_FFT_LENGTH, NULL, 0);
  int64_t sl[] = {0, 2, 1, 1, 5, 2};
  kiln_instr_set_attr_ints(m, x, KILN_ATTR_SLICE, sl, 6);
  int64_t pad[] = {0, 0, 0, 1, 2, 1};
  kiln_instr_set_attr_ints(m, x, KILN_ATTR_PADDING, pad, 6);
  int64_t pairs[] = {0, 1, 1, 0};
  kiln_instr_set_attr_ints(m, x, KILN_ATTR_SOURCE_TARGET_PAIRS, pairs, 4);
  at = kiln_instr_add_attr(m, x, KILN_ATTR_WINDOW);
  at->v.window = kiln_arena_calloc(a, 1, sizeof(kiln_window));
  at->v.window->rank = 2;
  at->v.window->dims = kiln_arena_calloc(a, 2, sizeof(kiln_window_dim));
  at->v.window->dims[0] = (kiln_window_dim){3, 2, 1, 1, 1, 1, false};
  at->v.window->dims[1] = (kiln_window_dim){3, 2, 0, 1, 1, 2, true};
  at = kiln_instr_add_attr(m, x, KILN_ATTR_DIM_LABELS);
  kiln_conv_dims *cd = kiln_arena_calloc(a, 1, sizeof *cd);
  static int64_t in_sp[] = {1, 2}, k_sp[] = {0, 1}, out_sp[] = {1, 2};
  *cd = (kiln_conv_dims){.in_batch = 0,
                         .in_feature = 3,
                         .kernel_in = 2,
                         .kernel_out = 3,
                         .out_batch = 0,
                         .out_feature = 3,
                         .nspatial = 2,
                         .in_spatial = in_sp,
                         .kernel_spatial = k_sp,
                         .out_spatial = out_sp};
  at->v.conv = cd;
  kiln_instr_set_attr_int(m, x, KILN_ATTR_DIRECTION, KILN_CMP_GE);
  at = kiln_instr_add_attr(m, x, KILN_ATTR_REPLICA_GROUPS);
  kiln_replica_groups *g = kiln_arena_calloc(a, 1, sizeof *g);
  static int64_t g0[] = {0, 1}, g1[] = {2, 3};
  static kiln_i64s groups[] = {{g0, 2}, {g1, 2}};
  g->ngroups = 2;
  g->groups = groups;
  at->v.groups = g;
  at = kiln_instr_add_attr(m, x, KILN_ATTR_SHARDING);
  kiln_sharding *sh = kiln_arena_calloc(a, 1, sizeof *sh);
  sh->kind = KILN_SHARD_MAXIMAL;
  sh->device = 1;
  at->v.sharding = sh;
  kiln_instr_set_attr_str(m, x, KILN_ATTR_KIND, "kLoop");
  kiln_instr_set_attr_str(m, x, KILN_ATTR_CUSTOM_CALL_TARGET, "tar\"get\\\n\t\r\x01");
  kiln_instr_set_attr_str(m, x, KILN_ATTR_BACKEND_CONFIG, "{\"a\":1}");
  kiln_instr_set_attr_str(m, x, KILN_ATTR_FRONTEND_ATTRIBUTES, "{_xla=\"x\"}");
  kiln_instr_set_attr_str(m, x, KILN_ATTR_ORIGIN, "{{\"o\"}}");
  kiln_instr_set_attr_str(m, x, KILN_ATTR_OPERAND_PRECISION, "{highest,default}");
  kiln_instr_set_control(m, x, &p->id, 1);
  uint32_t called[] = {e};
  kiln_instr_set_called(m, x, called, 1);
  CHECK_MODULE(m, "HloModule attrs\n"
                  "\n"
                  "ENTRY %e (p: f32[4]) -> f32[4] {\n"
                  "  %p = f32[4] parameter(0)\n"
                  "  ROOT %x = f32[4] custom-call(%p), dimensions={1,0}, index=-1, "
                  "slice={[0:2:1], [1:5:2]}, padding=0_0_0x1_2_1, "
                  "window={size=3x3 stride=2x2 pad=1_1x0_1 rhs_dilate=1x2 rhs_reversal=0x1}, "
                  "dim_labels=b01f_01io->b01f, operand_precision={highest,default}, "
                  "indices_are_sorted=true, unique_indices=false, direction=GE, "
                  "fft_length={}, epsilon=0.001, replica_groups={{0,1},{2,3}}, "
                  "source_target_pairs={{0,1},{1,0}}, kind=kLoop, "
                  "custom_call_target=\"tar\\\"get\\\\\\n\\t\\r\\001\", "
                  "called_computations={%e}, control-predecessors={%p}, "
                  "sharding={maximal device=1}, backend_config={\"a\":1}, "
                  "frontend_attributes={_xla=\"x\"}, "
                  "metadata={op_name=\"a/b\" source_line=3}, origin={{\"o\"}}, zeta={z}, "
                  "alpha=7\n"
                  "}\n");
  kiln_module_destroy(m);
}
END_TEST

/* Verbatim values print on one line: comments dropped and whitespace runs
 * collapsed outside strings; strings untouched. */
START_TEST(test_module_verbatim_one_line) {
  kiln_module *m = kiln_module_create("v");
  uint32_t e = add_comp(m, "e");
  set_entry(m, e);
  kiln_instr *p = param(m, e, "p", 0, KILN_F32, NULL, 0);
  kiln_instr_set_attr_str(m, p, KILN_ATTR_BACKEND_CONFIG,
                          "{\"kind\":\"__triton\",\n    \"cfg\":{\"a\":  \"x  y\n\"}}");
  kiln_instr_set_attr_str(m, p, KILN_ATTR_METADATA,
                          "{op_name=\"a  /* b */ c\" // note\n\t source_line=3 /* c */}");
  kiln_attr *at = kiln_instr_add_attr(m, p, KILN_ATTR_UNKNOWN);
  at->name = "u";
  at->v.s = "{\r\n  1,\n  2\n}";
  CHECK_MODULE(m, "HloModule v\n"
                  "\n"
                  "ENTRY %e (p: f32[]) -> f32[] {\n"
                  "  ROOT %p = f32[] parameter(0), "
                  "backend_config={\"kind\":\"__triton\", \"cfg\":{\"a\": \"x  y\n\"}}, "
                  "metadata={op_name=\"a  /* b */ c\" source_line=3 }, u={ 1, 2 }\n"
                  "}\n");
  kiln_module_destroy(m);
}
END_TEST

static kiln_sharding *new_sharding(kiln_module *m, kiln_sharding_kind k) {
  kiln_sharding *s = kiln_arena_calloc(m->arena, 1, sizeof *s);
  s->kind = k;
  return s;
}

static kiln_i64s ints(kiln_module *m, const int64_t *v, uint32_t n) {
  kiln_i64s r = {kiln_arena_memdup(m->arena, v, n * sizeof *v), n};
  return r;
}

static char *sharding_text(kiln_module *m, kiln_sharding *s) {
  kiln_instr *ins = m->instrs[0];
  kiln_attr *at = kiln_instr_add_attr(m, ins, KILN_ATTR_SHARDING);
  at->v.sharding = s;
  char *t = module_text(m);
  char *p = strstr(t, "sharding=");
  ck_assert_ptr_nonnull(p);
  p += strlen("sharding=");
  char *nl = strchr(p, '\n');
  *nl = '\0';
  char *r = kiln_strdup(p);
  kiln_free(t);
  return r;
}

#define CHECK_SHARDING(m, s, want) \
  do { \
    char *got_ = sharding_text((m), (s)); \
    ck_assert_str_eq(got_, (want)); \
    kiln_free(got_); \
  } while (0)

START_TEST(test_module_shardings) {
  kiln_module *m = kiln_module_create("s");
  uint32_t e = add_comp(m, "e");
  set_entry(m, e);
  param(m, e, "p", 0, KILN_F32, NULL, 0);
  CHECK_SHARDING(m, new_sharding(m, KILN_SHARD_REPLICATED), "{replicated}");
  CHECK_SHARDING(m, new_sharding(m, KILN_SHARD_MANUAL), "{manual}");
  CHECK_SHARDING(m, new_sharding(m, KILN_SHARD_UNKNOWN), "{unknown}");
  kiln_sharding *s = new_sharding(m, KILN_SHARD_TILED);
  int64_t td[] = {2, 1, 2}, dev[] = {0, 1, 2, 3};
  s->tile_dims = ints(m, td, 3);
  s->devices = ints(m, dev, 4);
  s->last_tile_dim_replicate = true;
  CHECK_SHARDING(m, s, "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}");
  s = new_sharding(m, KILN_SHARD_TILED);
  int64_t t22[] = {2, 2}, r4[] = {4}, perm[] = {1, 0};
  s->tile_dims = ints(m, t22, 2);
  s->iota_reshape = ints(m, r4, 1);
  CHECK_SHARDING(m, s, "{devices=[2,2]<=[4]}");
  s->iota_reshape = ints(m, t22, 2);
  s->iota_perm = ints(m, perm, 2);
  CHECK_SHARDING(m, s, "{devices=[2,2]<=[2,2]T(1,0)}");
  s = new_sharding(m, KILN_SHARD_TILED);
  s->tile_dims = ints(m, td, 3);
  s->iota_reshape = ints(m, r4, 1);
  int64_t ltd[] = {KILN_SHARD_MANUAL, KILN_SHARD_REPLICATED};
  s->last_tile_dims = ints(m, ltd, 2);
  CHECK_SHARDING(m, s, "{devices=[2,1,2]<=[4] last_tile_dims={manual, replicated}}");
  s = new_sharding(m, KILN_SHARD_TUPLE);
  s->nelems = 2;
  s->elems = kiln_arena_calloc(m->arena, 2, sizeof *s->elems);
  s->elems[0].kind = KILN_SHARD_REPLICATED;
  s->elems[1].kind = KILN_SHARD_MAXIMAL;
  s->elems[1].device = 0;
  s->elems[1].extra = "metadata={op_name=\"q\"}";
  CHECK_SHARDING(m, s, "{{replicated}, {maximal device=0 metadata={op_name=\"q\"}}}");
  s = new_sharding(m, KILN_SHARD_REPLICATED);
  s->extra = "metadata={op_name=\"r\"}";
  CHECK_SHARDING(m, s, "{replicated metadata={op_name=\"r\"}}");
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_module_replica_groups_iota) {
  kiln_module *m = kiln_module_create("g");
  uint32_t e = add_comp(m, "e");
  set_entry(m, e);
  kiln_instr *p = param(m, e, "p", 0, KILN_F32, NULL, 0);
  kiln_instr *ar = op2(m, e, KILN_OP_ALL_GATHER, "ag", p->id, KILN_NO_ID, KILN_F32, NULL, 0);
  kiln_attr *at = kiln_instr_add_attr(m, ar, KILN_ATTR_REPLICA_GROUPS);
  kiln_replica_groups *g = kiln_arena_calloc(m->arena, 1, sizeof *g);
  int64_t s[] = {2, 2}, perm[] = {1, 0};
  g->iota = true;
  g->iota_shape = ints(m, s, 2);
  g->iota_reshape = ints(m, s, 2);
  g->iota_perm = ints(m, perm, 2);
  at->v.groups = g;
  kiln_instr *ar2 = op2(m, e, KILN_OP_ALL_GATHER, "ag2", p->id, KILN_NO_ID, KILN_F32, NULL, 0);
  at = kiln_instr_add_attr(m, ar2, KILN_ATTR_REPLICA_GROUPS);
  at->v.groups = kiln_arena_calloc(m->arena, 1, sizeof *g);
  kiln_instr *ar3 = op2(m, e, KILN_OP_ALL_GATHER, "ag3", p->id, KILN_NO_ID, KILN_F32, NULL, 0);
  at = kiln_instr_add_attr(m, ar3, KILN_ATTR_REPLICA_GROUPS);
  g = kiln_arena_calloc(m->arena, 1, sizeof *g);
  int64_t r4[] = {4};
  g->iota = true;
  g->iota_shape = ints(m, s, 2);
  g->iota_reshape = ints(m, r4, 1);
  at->v.groups = g;
  CHECK_MODULE(m, "HloModule g\n"
                  "\n"
                  "ENTRY %e (p: f32[]) -> f32[] {\n"
                  "  %p = f32[] parameter(0)\n"
                  "  %ag = f32[] all-gather(%p), replica_groups=[2,2]<=[2,2]T(1,0)\n"
                  "  %ag2 = f32[] all-gather(%p), replica_groups={}\n"
                  "  ROOT %ag3 = f32[] all-gather(%p), replica_groups=[2,2]<=[4]\n"
                  "}\n");
  kiln_module_destroy(m);
}
END_TEST

/* Called-computation roles, control flow and async sugar. */
START_TEST(test_module_called_roles) {
  kiln_module *m = kiln_module_create("roles");
  uint32_t add = add_reducer(m, "add");
  uint32_t cond = add_comp(m, "cond");
  kiln_instr *cp = param(m, cond, "cp", 0, KILN_F32, NULL, 0);
  kiln_instr *cc = kiln_module_add_instr(m, cond, KILN_OP_CONSTANT, "t");
  set_shape(m, cc, KILN_PRED, NULL, 0);
  kiln_status st = {0};
  kiln_literal_create(m->arena, &cc->shape, 0, &cc->literal, &st);
  kiln_literal_set_s64(cc->literal, 0, 1);
  (void)cp;
  uint32_t e = add_comp(m, "main");
  set_entry(m, e);
  kiln_instr *p = param(m, e, "p", 0, KILN_F32, NULL, 0);
  kiln_instr *b = param(m, e, "b", 1, KILN_PRED, NULL, 0);
  kiln_instr *i = param(m, e, "i", 2, KILN_S32, NULL, 0);
  kiln_instr *w = op2(m, e, KILN_OP_WHILE, "w", p->id, KILN_NO_ID, KILN_F32, NULL, 0);
  uint32_t wc[] = {cond, add};
  kiln_instr_set_called(m, w, wc, 2);
  kiln_instr *c1 = op2(m, e, KILN_OP_CONDITIONAL, "c1", b->id, p->id, KILN_F32, NULL, 0);
  uint32_t tf[] = {add, cond};
  kiln_instr_set_called(m, c1, tf, 2);
  kiln_instr *c2 = op2(m, e, KILN_OP_CONDITIONAL, "c2", i->id, p->id, KILN_F32, NULL, 0);
  kiln_instr_set_called(m, c2, tf, 2);
  kiln_instr *ss = op2(m, e, KILN_OP_SELECT_AND_SCATTER, "ss", p->id, p->id, KILN_F32, NULL, 0);
  kiln_instr_set_called(m, ss, tf, 2);
  kiln_instr *fu = op2(m, e, KILN_OP_FUSION, "fu", p->id, p->id, KILN_F32, NULL, 0);
  kiln_instr_set_called(m, fu, &add, 1);
  kiln_instr_set_attr_str(m, fu, KILN_ATTR_KIND, "kLoop");
  kiln_instr *cu = op2(m, e, KILN_OP_CUSTOM_CALL, "cu", p->id, KILN_NO_ID, KILN_F32, NULL, 0);
  kiln_instr_set_called(m, cu, tf, 2);
  kiln_instr *ca = op2(m, e, KILN_OP_CALL, "ca", p->id, p->id, KILN_F32, NULL, 0);
  kiln_instr_set_called(m, ca, &add, 1);
  kiln_instr *as = op2(m, e, KILN_OP_ASYNC_START, "as", p->id, KILN_NO_ID, KILN_F32, NULL, 0);
  as->async_op = KILN_OP_NEGATE;
  kiln_instr *au = op2(m, e, KILN_OP_ASYNC_UPDATE, "au", as->id, KILN_NO_ID, KILN_F32, NULL, 0);
  au->async_op = KILN_OP_NEGATE;
  kiln_instr *ad = op2(m, e, KILN_OP_ASYNC_DONE, "ad", au->id, KILN_NO_ID, KILN_F32, NULL, 0);
  ad->async_op = KILN_OP_NEGATE;
  kiln_instr *ad2 = op2(m, e, KILN_OP_ASYNC_DONE, "ad2", au->id, KILN_NO_ID, KILN_F32, NULL, 0);
  kiln_instr_set_called(m, ad2, &add, 1);
  kiln_id cps[] = {ad->id, w->id};
  kiln_instr_set_control(m, ad2, cps, 2);
  e = add_comp(m, "unused");
  CHECK_MODULE(m, "HloModule roles\n"
                  "\n"
                  "%add (x: f32[], y: f32[]) -> f32[] {\n"
                  "  %x = f32[] parameter(0)\n"
                  "  %y = f32[] parameter(1)\n"
                  "  ROOT %sum = f32[] add(%x, %y)\n"
                  "}\n"
                  "\n"
                  "%cond (cp: f32[]) -> pred[] {\n"
                  "  %cp = f32[] parameter(0)\n"
                  "  ROOT %t = pred[] constant(true)\n"
                  "}\n"
                  "\n"
                  "ENTRY %main (p: f32[], b: pred[], i: s32[]) -> f32[] {\n"
                  "  %p = f32[] parameter(0)\n"
                  "  %b = pred[] parameter(1)\n"
                  "  %i = s32[] parameter(2)\n"
                  "  %w = f32[] while(%p), condition=%cond, body=%add\n"
                  "  %c1 = f32[] conditional(%b, %p), true_computation=%add, "
                  "false_computation=%cond\n"
                  "  %c2 = f32[] conditional(%i, %p), branch_computations={%add, %cond}\n"
                  "  %ss = f32[] select-and-scatter(%p, %p), select=%add, scatter=%cond\n"
                  "  %fu = f32[] fusion(%p, %p), kind=kLoop, calls=%add\n"
                  "  %cu = f32[] custom-call(%p), called_computations={%add, %cond}\n"
                  "  %ca = f32[] call(%p, %p), to_apply=%add\n"
                  "  %as = f32[] negate-start(%p)\n"
                  "  %au = f32[] negate-update(%as)\n"
                  "  %ad = f32[] negate-done(%au)\n"
                  "  ROOT %ad2 = f32[] async-done(%au), calls=%add, "
                  "control-predecessors={%ad, %w}\n"
                  "}\n"
                  "\n"
                  "%unused {\n"
                  "}\n");
  kiln_module_destroy(m);
}
END_TEST

/* Root not last, parameters out of order, tuple/token/dynamic shapes,
 * unknown shapes, names that need sanitising. */
START_TEST(test_module_shapes_names) {
  kiln_module *m = kiln_module_create("9 lives");
  uint32_t e = add_comp(m, "entry comp");
  set_entry(m, e);
  kiln_instr *p1 = param(m, e, "b", 1, KILN_S32, NULL, 0);
  int64_t d42[] = {4, 2};
  kiln_instr *p0 = param(m, e, "0a", 0, KILN_S32, d42, 2);
  p0->shape.dynamic = kiln_arena_calloc(m->arena, 2, 1);
  p0->shape.dynamic[0] = 1;
  int64_t m2m[] = {0, 1};
  p0->shape.layout = kiln_arena_calloc(m->arena, 1, sizeof(kiln_layout));
  p0->shape.layout->minor_to_major = m2m;
  p0->shape.layout->rank = 2;
  p0->shape.layout->tail = "T(8,128)";
  kiln_instr *tok = kiln_module_add_instr(m, e, KILN_OP_AFTER_ALL, "tok");
  set_shape(m, tok, KILN_TOKEN, NULL, 0);
  kiln_instr *t = kiln_module_add_instr(m, e, KILN_OP_TUPLE, "my tuple!");
  kiln_id ops[] = {p0->id, p1->id, tok->id};
  kiln_instr_set_operands(m, t, ops, 3);
  kiln_shape el[3];
  el[0] = p0->shape;
  el[1] = p1->shape;
  el[2] = tok->shape;
  kiln_shape_make_tuple(m->arena, &t->shape, el, 3);
  kiln_instr *u = kiln_module_add_instr(m, e, KILN_OP_ABS, "");
  kiln_instr_set_operands(m, u, &p1->id, 1); /* shape left unknown */
  m->comps[e]->root = t->id;
  char *want;
  int n = asprintf(&want,
                   "HloModule _9_lives.m0\n"
                   "\n"
                   "ENTRY %%entry_comp.c0 (%%0a: s32[<=4,2]{0,1:T(8,128)}, b: s32[]) -> "
                   "(s32[<=4,2]{0,1:T(8,128)}, s32[], token[]) {\n"
                   "  %%b = s32[] parameter(1)\n"
                   "  %%0a = s32[<=4,2]{0,1:T(8,128)} parameter(0)\n"
                   "  %%tok = token[] after-all()\n"
                   "  ROOT %%my_tuple_.%u = (s32[<=4,2]{0,1:T(8,128)}, s32[], token[]) "
                   "tuple(%%0a, %%b, %%tok)\n"
                   "  %%_.%u = abs(%%b)\n"
                   "}\n",
                   (unsigned)t->id, (unsigned)u->id);
  ck_assert_int_gt(n, 0);
  CHECK_MODULE(m, want);
  free(want);
  /* The root's shape unknown: no signature. */
  m->comps[e]->root = u->id;
  char *got = module_text(m);
  ck_assert_ptr_nonnull(strstr(got, "ENTRY %entry_comp.c0 {\n"));
  ck_assert_ptr_nonnull(strstr(got, "  ROOT %_."));
  kiln_free(got);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_module_constants) {
  kiln_module *m = kiln_module_create("k");
  uint32_t e = add_comp(m, "e");
  set_entry(m, e);
  kiln_instr *k = kiln_module_add_instr(m, e, KILN_OP_CONSTANT, "k");
  int64_t d22[] = {2, 2};
  set_shape(m, k, KILN_BF16, d22, 2);
  kiln_status st = {0};
  kiln_literal_create(m->arena, &k->shape, 0, &k->literal, &st);
  kiln_literal_set_f64(k->literal, 0, 1.0078125);
  kiln_literal_set_f64(k->literal, 1, -INFINITY);
  kiln_literal_set_f64(k->literal, 2, 0.1);
  kiln_literal_set_f64(k->literal, 3, 1e30);
  kiln_instr *io = kiln_module_add_instr(m, e, KILN_OP_IOTA, "io");
  set_shape(m, io, KILN_S32, d22, 2);
  kiln_instr_set_attr_int(m, io, KILN_ATTR_IOTA_DIMENSION, 1);
  CHECK_MODULE(m, "HloModule k\n"
                  "\n"
                  "ENTRY %e () -> s32[2,2] {\n"
                  "  %k = bf16[2,2] constant({{1.01, -inf}, {0.1, 1e+30}})\n"
                  "  ROOT %io = s32[2,2] iota(), iota_dimension=1\n"
                  "}\n");
  kiln_module_destroy(m);
}
END_TEST

/* A big module prints in time linear in its size: 400k instructions in one
 * computation, each naming its predecessor, plus a 1M-element constant. */
START_TEST(test_module_large_linear) {
  kiln_module *m = kiln_module_create("big");
  uint32_t e = add_comp(m, "e");
  set_entry(m, e);
  int64_t d[] = {1 << 20};
  kiln_instr *k = kiln_module_add_instr(m, e, KILN_OP_CONSTANT, "k");
  set_shape(m, k, KILN_F32, d, 1);
  kiln_status st = {0};
  ck_assert_int_eq(kiln_literal_create(m->arena, &k->shape, 0, &k->literal, &st), 0);
  for (int64_t i = 0; i < d[0]; i++) kiln_literal_set_f64(k->literal, i, (double)i * 0.25);
  kiln_instr *prev = k;
  for (int i = 0; i < 400000; i++) {
    char name[32];
    snprintf(name, sizeof name, "n.%d", i);
    prev = op2(m, e, KILN_OP_NEGATE, name, prev->id, KILN_NO_ID, KILN_F32, d, 1);
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  size_t len = 0;
  char *s = kiln_module_print(m, &len);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ck_assert_ptr_nonnull(s);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  ck_assert_msg(secs < 20, "printing took %.1f s", secs);
  ck_assert_ptr_nonnull(strstr(s, "  ROOT %n.399999 = f32[1048576] negate(%n.399998)\n}\n"));
  ck_assert_ptr_nonnull(strstr(s, "constant({0, 0.25, 0.5, 0.75, 1, 1.25,"));
  kiln_free(s);
  kiln_module_destroy(m);
}
END_TEST

/* Builder mistakes print as something visibly wrong, never crash. */
START_TEST(test_module_broken_builder) {
  kiln_module *m = kiln_module_create("broken");
  uint32_t e = add_comp(m, "e");
  kiln_instr *p = param(m, e, "p", 0, KILN_F32, NULL, 0);
  kiln_instr *x = op2(m, e, KILN_OP_WHILE, "x", p->id, 999, KILN_F32, NULL, 0);
  uint32_t bad[] = {77};
  kiln_instr_set_called(m, x, bad, 1); /* while with one computation */
  kiln_id ctl[] = {555};
  kiln_instr_set_control(m, x, ctl, 1);
  kiln_instr_add_attr(m, x, KILN_ATTR_WINDOW);
  kiln_instr_add_attr(m, x, KILN_ATTR_DIM_LABELS);
  kiln_instr_add_attr(m, x, KILN_ATTR_REPLICA_GROUPS);
  kiln_instr_add_attr(m, x, KILN_ATTR_SHARDING);
  kiln_instr_add_attr(m, x, KILN_ATTR_CUSTOM_CALL_TARGET);
  kiln_instr_add_attr(m, x, KILN_ATTR_BACKEND_CONFIG);
  kiln_instr_add_attr(m, x, KILN_ATTR_INVALID);
  kiln_instr_set_attr_int(m, x, KILN_ATTR_DIRECTION, 42);
  int64_t odd[] = {1, 2};
  kiln_instr_set_attr_ints(m, x, KILN_ATTR_SLICE, odd, 2);    /* not triples */
  kiln_instr_set_attr_ints(m, x, KILN_ATTR_PADDING, NULL, 0); /* a scalar's: left out */
  m->comps[e]->root = 12345;
  CHECK_MODULE(m, "HloModule broken\n"
                  "\n"
                  "%e (p: f32[]) -> f32[] {\n"
                  "  %p = f32[] parameter(0)\n"
                  "  ROOT %x = f32[] while(%p, %_invalid_id.999), slice={}, window={}, "
                  "dim_labels=, direction=42, replica_groups={}, custom_call_target=\"\", "
                  "called_computations={%_invalid_computation.c77}, "
                  "control-predecessors={%_invalid_id.555}, sharding={}, backend_config=\n"
                  "}\n");
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_module_print_oom) {
  kiln_module *m = kiln_module_create("oom");
  add_reducer(m, "add");
  /* Fail every allocation from the first on: printing returns NULL, never
   * crashes, and leaks nothing (checked under ASan). */
  for (long n = 1; n < 8; n++) {
    kiln_alloc_fail_after(n);
    size_t len = 1;
    char *s = kiln_module_print(m, &len);
    kiln_alloc_fail_after(0);
    if (s)
      kiln_free(s);
    else
      ck_assert_uint_eq(len, 0);
  }
  kiln_module_destroy(m);
}
END_TEST

/* ---- golden files and the corpus (need the parser) ------------------------ */

#define MAX_FILES 512
static char *golden_files[MAX_FILES];
static int ngolden;
static char *corpus_files[MAX_FILES];
static int ncorpus;
static char corpus_dir[1024];

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int list_hlo(const char *dir, char **out, int max) {
  DIR *d = opendir(dir);
  if (d == NULL) return -1;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL && n < max) {
    size_t l = strlen(de->d_name);
    if (l > 4 && strcmp(de->d_name + l - 4, ".hlo") == 0) {
      char path[2048];
      snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
      out[n++] = strdup(path);
    }
  }
  closedir(d);
  qsort(out, (size_t)n, sizeof *out, cmp_str);
  return n;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  *len = (size_t)n;
  return buf;
}

/* Parses `text` or fails the test with the parser's message. */
static kiln_module *parse_or_fail(const char *text, size_t len, const char *file, int no_infer) {
  kiln_parse_options o = {0};
  o.no_infer = no_infer;
  kiln_module *m = NULL;
  kiln_status st = {0};
  int rc = kiln_module_parse_text(text, len, file, &o, &m, &st);
  if (rc != 0) {
    char msg[2048];
    kiln_status_format(&st, msg, sizeof msg);
    ck_abort_msg("parse of %s failed: %s", file, msg);
  }
  return m;
}

/* First line where a and b differ, for readable failures. */
static void assert_same_text(const char *what, const char *file, const char *want,
                             const char *got) {
  if (strcmp(want, got) == 0) return;
  int line = 1;
  const char *a = want, *b = got, *la = want, *lb = got;
  while (*a && *a == *b) {
    if (*a == '\n') {
      line++;
      la = a + 1;
      lb = b + 1;
    }
    a++;
    b++;
  }
  const char *ea = strchr(la, '\n'), *eb = strchr(lb, '\n');
  int na = ea ? (int)(ea - la) : (int)strlen(la), nb = eb ? (int)(eb - lb) : (int)strlen(lb);
  ck_abort_msg("%s: %s differs at line %d:\n  want: %.*s\n  got:  %.*s", file, what, line, na, la,
               nb, lb);
}

/* print(parse(text)) == print(parse(print(parse(text)))); returns the first
 * printing (caller frees). */
static char *check_fixed_point(const char *text, size_t len, const char *file, int no_infer) {
  kiln_module *m = parse_or_fail(text, len, file, no_infer);
  size_t plen = 0;
  char *p1 = kiln_module_print(m, &plen);
  ck_assert_ptr_nonnull(p1);
  kiln_module_destroy(m);
  char where[2100];
  snprintf(where, sizeof where, "%s (re-parsed print)", file);
  kiln_module *m2 = parse_or_fail(p1, plen, where, no_infer);
  char *p2 = kiln_module_print(m2, NULL);
  ck_assert_ptr_nonnull(p2);
  kiln_module_destroy(m2);
  assert_same_text("second print", file, p1, p2);
  kiln_free(p2);
  return p1;
}

START_TEST(test_golden) {
  const char *file = golden_files[_i];
  size_t len;
  char *text = read_file(file, &len);
  const char *tag = "/* EXPECTED\n";
  char *exp = NULL;
  for (char *p = strstr(text, tag); p; p = strstr(p + 1, tag)) exp = p;
  ck_assert_msg(exp != NULL, "%s has no EXPECTED block", file);
  char *body = exp + strlen(tag);
  char *end = strstr(body, "\n*/");
  ck_assert_msg(end != NULL, "%s: EXPECTED block is not closed", file);
  char *want = strndup(body, (size_t)(end + 1 - body)); /* with the last newline */
  char *got = check_fixed_point(text, len, file, 1);
  assert_same_text("canonical text", file, want, got);
  kiln_free(got);
  free(want);
  free(text);
}
END_TEST

/* Each corpus module: parsed as written (missing shapes stay missing) and
 * parsed with shape inference, both a fixed point of print and parse. */
START_TEST(test_corpus_as_written) {
  const char *file = corpus_files[_i];
  size_t len;
  char *text = read_file(file, &len);
  kiln_free(check_fixed_point(text, len, file, 1));
  free(text);
}
END_TEST

START_TEST(test_corpus_inferred) {
  const char *file = corpus_files[_i];
  size_t len;
  char *text = read_file(file, &len);
  char *got = check_fixed_point(text, len, file, 0);
  /* With inference every instruction has its shape, so every computation
   * prints its signature. */
  for (const char *l = got; l; l = strchr(l, '\n')) {
    l += *l == '\n';
    if (*l == '%' || strncmp(l, "ENTRY ", 6) == 0)
      ck_assert_msg(strstr(l, ") -> ") != NULL && strstr(l, ") -> ") < strchr(l, '\n'),
                    "%s: computation without a signature: %.60s", file, l);
  }
  kiln_free(got);
  free(text);
}
END_TEST

static void find_files(void) {
  ngolden = list_hlo(KILN_SOURCE_DIR "/tests/golden", golden_files, MAX_FILES);
  if (ngolden < 0) ngolden = 0;
  const char *env = getenv("KILN_CORPUS_DIR");
  snprintf(corpus_dir, sizeof corpus_dir, "%s",
           env && *env ? env : KILN_SOURCE_DIR "/../shared/corpus/xla-hlo");
  ncorpus = list_hlo(corpus_dir, corpus_files, MAX_FILES);
  if (ncorpus <= 0) {
    fprintf(stderr, "test_print: no corpus at %s: corpus round-trip skipped\n", corpus_dir);
    ncorpus = 0;
  }
}

static Suite *print_suite(void) {
  Suite *s = suite_create("print");
  TCase *lit = tcase_create("literal");
  tcase_set_timeout(lit, 120);
  tcase_add_test(lit, test_lit_f32);
  tcase_add_test(lit, test_lit_f64);
  tcase_add_test(lit, test_lit_f16_bf16);
  tcase_add_test(lit, test_lit_small_floats);
  tcase_add_test(lit, test_lit_integers);
  tcase_add_test(lit, test_lit_pred_complex);
  tcase_add_test(lit, test_lit_arrays);
  tcase_add_test(lit, test_lit_layout_dynamic);
  tcase_add_test(lit, test_lit_tuples);
  tcase_add_test(lit, test_lit_exhaustive_16bit);
  tcase_add_test(lit, test_lit_roundtrip_random);
  suite_add_tcase(s, lit);

  TCase *mod = tcase_create("module");
  tcase_set_timeout(mod, 120);
  tcase_add_test(mod, test_module_reduce);
  tcase_add_test(mod, test_module_header);
  tcase_add_test(mod, test_module_attr_kinds);
  tcase_add_test(mod, test_module_shardings);
  tcase_add_test(mod, test_module_verbatim_one_line);
  tcase_add_test(mod, test_module_replica_groups_iota);
  tcase_add_test(mod, test_module_called_roles);
  tcase_add_test(mod, test_module_shapes_names);
  tcase_add_test(mod, test_module_constants);
  tcase_add_test(mod, test_module_large_linear);
  tcase_add_test(mod, test_module_broken_builder);
  tcase_add_test(mod, test_module_print_oom);
  suite_add_tcase(s, mod);

  TCase *gold = tcase_create("golden");
  tcase_set_timeout(gold, 120);
  tcase_add_loop_test(gold, test_golden, 0, ngolden);
  suite_add_tcase(s, gold);

  TCase *corp = tcase_create("corpus");
  tcase_set_timeout(corp, 120);
  tcase_add_loop_test(corp, test_corpus_as_written, 0, ncorpus);
  tcase_add_loop_test(corp, test_corpus_inferred, 0, ncorpus);
  suite_add_tcase(s, corp);
  return s;
}

int main(void) {
  find_files();
  SRunner *sr = srunner_create(print_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  for (int i = 0; i < ngolden; i++) free(golden_files[i]);
  for (int i = 0; i < ncorpus; i++) free(corpus_files[i]);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
