/* The cpu backend's topk, sort, complex elementwise ops, fft and prefix
 * scans (cumulative reduce-windows), int8 and bf16 matmuls against the
 * reference interpreter.
 *
 * Each case is an HLO module generated from a seed (random dims, the
 * dimension to sort or transform, layouts, element types, k, direction),
 * compiled with kiln_compile, run on a cpu device and by the interpreter on
 * the same arguments. Arguments include the values that break a careless
 * ordering or complex formula: NaN of both signs, -0, infinities, ties.
 * topk and sort move values, so their results must be bit-identical
 * (NaNs included), and so must scans, which fold the same elements in the
 * same order as the window form; complex arithmetic and fft are within the tolerances of
 * tests/support/tolerance.h (KILN_TOL_C64_REL, KILN_TOL_C128_REL,
 * kiln_tol_fft) relative to the largest magnitude of the result. Bad
 * inputs (topk or sort of complex keys) must be refused with a status that
 * names the instruction and the reason.
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "executor/cpu/cpu.h"
#include "executor/run.h"
#include "tests/support/tolerance.h"

static kiln_status st;

static uint64_t rng(uint64_t *s) {
  *s = *s * 6364136223846793005u + 1442695040888963407u;
  return *s >> 33;
}

static double special(uint64_t r) {
  static const double v[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, -NAN, 1.0, -1.0};
  return v[r % 8];
}

/* Floats: mostly eighths in [-2, 2] (many ties), one in eight special;
 * PLAIN leaves the specials out (for arithmetic whose NaN signs the two
 * sides need not agree on), NO_NAN keeps the signed zeros and infinities.
 * EXTREME fills integers across their whole range, half of them at its
 * ends (the largest products a dot can form); LOPSIDED puts seven in eight
 * at the end whose products are largest (min when signed, max when not),
 * so that a dot's sums run far past 2^24 and wrap past 2^31. */
enum { SPECIALS, PLAIN, NO_NAN, EXTREME, LOPSIDED };
static void fill(kiln_literal *l, uint64_t *seed, int plain) {
  if (l->shape.dtype == KILN_TUPLE) {
    for (uint32_t i = 0; i < l->shape.rank; i++) fill(l->elems[i], seed, plain);
    return;
  }
  int64_t n = kiln_literal_elements(l);
  kiln_dtype t = l->shape.dtype;
  for (int64_t i = 0; i < n; i++) {
    uint64_t r = rng(seed);
    double f = (double)((int64_t)(r % 33) - 16) / 8.0;
    if (plain != PLAIN && r % 8 == 0) f = special(r >> 8);
    if (plain == NO_NAN && isnan(f)) f = -0.0;
    if ((plain == EXTREME || plain == LOPSIDED) &&
        (kiln_dtype_is_signed_int(t) || kiln_dtype_is_unsigned_int(t))) {
      unsigned bits = kiln_dtype_bits(t);
      uint64_t mask = bits >= 64 ? UINT64_MAX : (UINT64_C(1) << bits) - 1, v = (r >> 8) & mask;
      bool end = plain == EXTREME ? r % 4 == 0 : r % 8 != 0;
      if (end) v = kiln_dtype_is_signed_int(t) ? (mask >> 1) + 1 : mask; /* min, or max */
      if (plain == EXTREME && r % 4 == 1) v = kiln_dtype_is_signed_int(t) ? mask >> 1 : 0;
      if (kiln_dtype_is_signed_int(t) && bits < 64 && (v >> (bits - 1)))
        kiln_literal_set_s64(l, i, (int64_t)v - (int64_t)(mask + 1));
      else
        kiln_literal_set_u64(l, i, v);
    } else if (t == KILN_PRED)
      kiln_literal_set_u64(l, i, r & 1);
    else if (kiln_dtype_is_float(t))
      kiln_literal_set_f64(l, i, f);
    else if (kiln_dtype_is_unsigned_int(t))
      kiln_literal_set_u64(l, i, r % 13 == 0 ? UINT64_MAX : r % 11);
    else if (kiln_dtype_is_signed_int(t))
      kiln_literal_set_s64(l, i, r % 13 == 0 ? INT64_MIN : (int64_t)(r % 11) - 5);
    else if (kiln_dtype_is_complex(t))
      kiln_literal_set_c128(l, i, f, (double)((int64_t)(r >> 12) % 33 - 16) / 8.0);
  }
}

/* ---- comparing ---------------------------------------------------------- */

static double max_mag(const kiln_literal *l) {
  double m = 0;
  int64_t n = kiln_literal_elements(l);
  for (int64_t i = 0; i < n; i++) {
    double re, im = 0;
    if (kiln_dtype_is_complex(l->shape.dtype))
      kiln_literal_get_c128(l, i, &re, &im);
    else
      re = kiln_literal_get_f64(l, i);
    if (isfinite(re) && fabs(re) > m) m = fabs(re);
    if (isfinite(im) && fabs(im) > m) m = fabs(im);
  }
  return m;
}

static bool close_to(double a, double b, double tol) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  if (isinf(a) || isinf(b)) return a == b;
  return fabs(a - b) <= tol;
}

/* rel < 0: bit-exact. Else floats and complex within rel * max(1, max |want|). */
static void compare(const kiln_literal *want, const kiln_literal *got, const char *path, double rel,
                    kiln_sbuf *why) {
  if (!kiln_shape_equal(&want->shape, &got->shape, false)) {
    kiln_sbuf_printf(why, "%s: shapes differ", path);
    return;
  }
  if (want->shape.dtype == KILN_TUPLE) {
    for (uint32_t i = 0; i < want->shape.rank && kiln_sbuf_str(why)[0] == '\0'; i++) {
      char sub[64];
      snprintf(sub, sizeof sub, "%s{%u}", path, i);
      compare(want->elems[i], got->elems[i], sub, rel, why);
    }
    return;
  }
  kiln_dtype t = want->shape.dtype;
  int64_t n = kiln_literal_elements(want);
  double tol = rel * fmax(1.0, max_mag(want));
  for (int64_t i = 0; i < n; i++) {
    if (rel >= 0 && kiln_dtype_is_complex(t)) {
      double ar, ai, br, bi;
      kiln_literal_get_c128(want, i, &ar, &ai);
      kiln_literal_get_c128(got, i, &br, &bi);
      if (close_to(ar, br, tol) && close_to(ai, bi, tol)) continue;
      kiln_sbuf_printf(why, "%s[%lld]: interp (%.9g, %.9g), cpu (%.9g, %.9g), tolerance %g", path,
                       (long long)i, ar, ai, br, bi, tol);
      return;
    }
    if (rel >= 0 && kiln_dtype_is_float(t)) {
      double a = kiln_literal_get_f64(want, i), b = kiln_literal_get_f64(got, i);
      if (close_to(a, b, tol)) continue;
      kiln_sbuf_printf(why, "%s[%lld]: interp %.9g, cpu %.9g, tolerance %g", path, (long long)i, a,
                       b, tol);
      return;
    }
    size_t w = kiln_dtype_size(t);
    const uint8_t *a = (const uint8_t *)want->data + (size_t)i * w;
    const uint8_t *b = (const uint8_t *)got->data + (size_t)i * w;
    if (memcmp(a, b, w) != 0) {
      double x = kiln_dtype_is_complex(t) ? 0 : kiln_literal_get_f64(want, i);
      double y = kiln_dtype_is_complex(t) ? 0 : kiln_literal_get_f64(got, i);
      kiln_sbuf_printf(why, "%s[%lld]: interp %.9g, cpu %.9g (bits differ)", path, (long long)i, x,
                       y);
      return;
    }
  }
}

/* Runs `text` on both backends for seeds 1..nseeds; the results must agree
 * (rel as in compare). */
static void agree(const char *text, double rel, int plain, int nseeds) {
  kiln_module *m = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st) == 0,
                "parse: %s: %s\n%s", st.where, st.msg, text);
  kiln_executable *e = NULL;
  kiln_status_clear(&st);
  int rc = kiln_compile(m, NULL, &e, NULL, &st);
  ck_assert_msg(rc == 0, "compile: %s: %s: %s\n%s", kiln_err_name(rc), st.where, st.msg, text);
  const kiln_computation *en = kiln_module_entry(m);
  uint32_t np = kiln_computation_nparams(m, en);
  ck_assert_uint_le(np, 4);
  kiln_run_options ro = {.max_while_iterations = 1000, .timeout_seconds = 60};
  for (int seed = 1; seed <= nseeds; seed++) {
    kiln_literal *args[4] = {0}, *want = NULL, *got = NULL;
    uint64_t s = (uint64_t)seed * 7919u;
    for (uint32_t i = 0; i < np; i++) {
      const kiln_instr *p = kiln_computation_param(m, en, i);
      ck_assert(kiln_literal_create(NULL, &p->shape, 64u << 20, &args[i], &st) == 0);
      fill(args[i], &s, plain);
    }
    kiln_status_clear(&st);
    rc = kiln_run_module_with(m, "interp", NULL, NULL, &ro, (const kiln_literal *const *)args, np,
                              &want, &st);
    ck_assert_msg(rc == 0, "interp: %s: %s\n%s", st.where, st.msg, text);
    kiln_status_clear(&st);
    rc = kiln_run_executable(e, NULL, &ro, (const kiln_literal *const *)args, np, &got, &st);
    ck_assert_msg(rc == 0, "cpu: %s: %s\n%s", st.where, st.msg, text);
    kiln_sbuf why = KILN_SBUF_INIT;
    compare(want, got, "result", rel, &why);
    ck_assert_msg(kiln_sbuf_str(&why)[0] == '\0', "seed %d: %s\n%s", seed, kiln_sbuf_str(&why),
                  text);
    kiln_sbuf_free(&why);
    kiln_literal_destroy(want);
    kiln_literal_destroy(got);
    for (uint32_t i = 0; i < np; i++) kiln_literal_destroy(args[i]);
  }
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
}

/* kiln_compile must refuse `text` with KILN_EUNIMPL and a message that
 * contains `needle`. */
static void refused(const char *text, const char *needle) {
  kiln_module *m = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st) == 0,
                "parse: %s: %s", st.where, st.msg);
  kiln_executable *e = NULL;
  kiln_status_clear(&st);
  int rc = kiln_compile(m, NULL, &e, NULL, &st);
  ck_assert_msg(rc != 0, "compiled, but should be refused:\n%s", text);
  ck_assert_msg(strstr(st.msg, needle) != NULL, "message '%s' lacks '%s'", st.msg, needle);
  kiln_module_destroy(m);
}

/* ---- generating --------------------------------------------------------- */

static const char *const ordered_types[] = {"f32", "f64", "f16", "bf16", "s8",  "s16", "s32",
                                            "s64", "u8",  "u16", "u32",  "u64", "pred"};
#define NORDERED (sizeof ordered_types / sizeof *ordered_types)

static void put_dims(kiln_sbuf *b, const int64_t *dims, uint32_t r) {
  kiln_sbuf_puts(b, "[");
  for (uint32_t i = 0; i < r; i++) kiln_sbuf_printf(b, "%s%lld", i ? "," : "", (long long)dims[i]);
  kiln_sbuf_puts(b, "]");
}

/* A random minor-to-major layout of rank r. */
static void put_layout(kiln_sbuf *b, uint32_t r, uint64_t *s) {
  int64_t p[8];
  for (uint32_t i = 0; i < r; i++) p[i] = i;
  for (uint32_t i = r; i > 1; i--) {
    uint32_t j = (uint32_t)(rng(s) % i);
    int64_t t = p[i - 1];
    p[i - 1] = p[j];
    p[j] = t;
  }
  kiln_sbuf_puts(b, "{");
  for (uint32_t i = 0; i < r; i++) kiln_sbuf_printf(b, "%s%lld", i ? "," : "", (long long)p[i]);
  kiln_sbuf_puts(b, "}");
}

static void put_shape(kiln_sbuf *b, const char *t, const int64_t *dims, uint32_t r, uint64_t *s) {
  kiln_sbuf_puts(b, t);
  put_dims(b, dims, r);
  put_layout(b, r, s);
}

/* ---- topk --------------------------------------------------------------- */

static void topk_module(kiln_sbuf *b, uint64_t *s) {
  uint32_t r = 1 + (uint32_t)(rng(s) % 3);
  int64_t dims[3];
  for (uint32_t i = 0; i < r; i++) dims[i] = 1 + (int64_t)(rng(s) % 6);
  dims[r - 1] = 1 + (int64_t)(rng(s) % 40);
  int64_t k = (int64_t)(rng(s) % (uint64_t)(dims[r - 1] + 1));
  const char *t = ordered_types[rng(s) % NORDERED];
  bool largest = rng(s) % 3 != 0;
  int64_t od[3];
  memcpy(od, dims, sizeof od);
  od[r - 1] = k;
  kiln_sbuf_puts(b, "HloModule t\nENTRY e {\n  p = ");
  put_shape(b, t, dims, r, s);
  kiln_sbuf_puts(b, " parameter(0)\n  ROOT k = (");
  put_shape(b, t, od, r, s);
  kiln_sbuf_puts(b, ", ");
  put_shape(b, "s32", od, r, s);
  kiln_sbuf_printf(b, ") topk(p), k=%lld, largest=%s\n}\n", (long long)k,
                   largest ? "true" : "false");
}

START_TEST(test_topk_random) {
  uint64_t s = 12345;
  for (int i = 0; i < 40; i++) {
    kiln_sbuf b = KILN_SBUF_INIT;
    topk_module(&b, &s);
    agree(kiln_sbuf_str(&b), -1, SPECIALS, 2);
    kiln_sbuf_free(&b);
  }
}
END_TEST

/* The benchmark's shape: rows wide enough to split across threads. */
START_TEST(test_topk_wide) {
  agree("HloModule t\nENTRY e {\n  p = f32[300,1000] parameter(0)\n"
        "  ROOT k = (f32[300,5], s32[300,5]) topk(p), k=5, largest=true\n}\n",
        -1, SPECIALS, 2);
  agree("HloModule t\nENTRY e {\n  p = bf16[7,513] parameter(0)\n"
        "  ROOT k = (bf16[7,513], s32[7,513]) topk(p), k=513, largest=false\n}\n",
        -1, SPECIALS, 1);
}
END_TEST

START_TEST(test_topk_refused) {
  refused("HloModule t\nENTRY e {\n  p = c64[4,8] parameter(0)\n"
          "  ROOT k = (c64[4,2], s32[4,2]) topk(p), k=2\n}\n",
          "topk");
  refused("HloModule t\nENTRY e {\n  p = c64[4,8] parameter(0)\n"
          "  ROOT k = (c64[4,2], s32[4,2]) topk(p), k=2\n}\n",
          "no order");
}
END_TEST

/* ---- sort --------------------------------------------------------------- */

/* A sort of 1-3 operands (keys first) along a random dim, with the
 * standard comparators JAX writes: LT/GT, total order or not, on the first
 * operand; or a lexicographic one over the first two. */
static void sort_module(kiln_sbuf *b, uint64_t *s) {
  uint32_t r = 1 + (uint32_t)(rng(s) % 3), n = 1 + (uint32_t)(rng(s) % 3);
  int64_t dims[3];
  for (uint32_t i = 0; i < r; i++) dims[i] = 1 + (int64_t)(rng(s) % 7);
  uint32_t d = (uint32_t)(rng(s) % r);
  dims[d] = 1 + (int64_t)(rng(s) % 50);
  const char *t[3];
  for (uint32_t q = 0; q < n; q++) t[q] = ordered_types[rng(s) % NORDERED];
  if (n > 1 && rng(s) % 2) t[n - 1] = "s32"; /* the argsort form: keys, iota */
  const char *dir = rng(s) % 2 ? "LT" : "GT";
  bool total = rng(s) % 2, lex = n > 1 && rng(s) % 4 == 0, stable = rng(s) % 2;
  kiln_sbuf_puts(b, "HloModule t\ncmp {\n");
  for (uint32_t q = 0; q < n; q++)
    kiln_sbuf_printf(b, "  a%u = %s[] parameter(%u)\n  b%u = %s[] parameter(%u)\n", q, t[q], 2 * q,
                     q, t[q], 2 * q + 1);
  bool fl = t[0][0] == 'f' || t[0][0] == 'b';
  const char *ty0 = total && fl ? ", type=TOTALORDER" : "";
  if (!lex) {
    kiln_sbuf_printf(b, "  ROOT c = pred[] compare(a0, b0), direction=%s%s\n}\n", dir, ty0);
  } else {
    kiln_sbuf_printf(b,
                     "  l0 = pred[] compare(a0, b0), direction=%s%s\n"
                     "  e0 = pred[] compare(a0, b0), direction=EQ%s\n"
                     "  l1 = pred[] compare(a1, b1), direction=%s\n"
                     "  t1 = pred[] and(e0, l1)\n  ROOT c = pred[] or(l0, t1)\n}\n",
                     dir, ty0, ty0, dir);
  }
  kiln_sbuf_puts(b, "ENTRY e {\n");
  for (uint32_t q = 0; q < n; q++) {
    kiln_sbuf_printf(b, "  p%u = ", q);
    put_shape(b, t[q], dims, r, s);
    kiln_sbuf_printf(b, " parameter(%u)\n", q);
  }
  kiln_sbuf_puts(b, "  ROOT s = ");
  if (n > 1) kiln_sbuf_puts(b, "(");
  for (uint32_t q = 0; q < n; q++) {
    if (q) kiln_sbuf_puts(b, ", ");
    put_shape(b, t[q], dims, r, s);
  }
  if (n > 1) kiln_sbuf_puts(b, ")");
  kiln_sbuf_puts(b, " sort(");
  for (uint32_t q = 0; q < n; q++) kiln_sbuf_printf(b, "%sp%u", q ? ", " : "", q);
  kiln_sbuf_printf(b, "), dimensions={%u}, is_stable=%s, to_apply=cmp\n}\n", d,
                   stable ? "true" : "false");
}

START_TEST(test_sort_random) {
  uint64_t s = 777;
  for (int i = 0; i < 60; i++) {
    kiln_sbuf b = KILN_SBUF_INIT;
    sort_module(&b, &s);
    /* rows with NaN take the merge of pairs, rows without the radix sort */
    agree(kiln_sbuf_str(&b), -1, i % 2 ? NO_NAN : SPECIALS, 2);
    kiln_sbuf_free(&b);
  }
}
END_TEST

/* jnp.argsort as JAX exports it: keys and an iota, total order on f32. */
START_TEST(test_sort_argsort) {
  agree("HloModule t\ncmp {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
        "  c = s32[] parameter(2)\n  d = s32[] parameter(3)\n"
        "  ROOT lt = pred[] compare(a, b), direction=LT, type=TOTALORDER\n}\n"
        "ENTRY e {\n  p = f32[64,300] parameter(0)\n  i = s32[64,300] iota(), iota_dimension=1\n"
        "  s = (f32[64,300], s32[64,300]) sort(p, i), dimensions={1}, is_stable=true, "
        "to_apply=cmp\n  ROOT g = s32[64,300] get-tuple-element(s), index=1\n}\n",
        -1, SPECIALS, 2);
  /* LT without total order: rows without NaN (radix, -0 equal to +0) and
   * with (the merge); GT on bf16 keys. */
  const char *lt = "HloModule t\ncmp {\n  a = @[] parameter(0)\n  b = @[] parameter(1)\n"
                   "  c = s32[] parameter(2)\n  d = s32[] parameter(3)\n"
                   "  ROOT lt = pred[] compare(a, b), direction=~\n}\n"
                   "ENTRY e {\n  p = @[32,700] parameter(0)\n  q = s32[32,700] parameter(1)\n"
                   "  ROOT s = (@[32,700], s32[32,700]) sort(p, q), dimensions={1}, "
                   "to_apply=cmp\n}\n";
  for (int v = 0; v < 4; v++) {
    kiln_sbuf b = KILN_SBUF_INIT;
    for (const char *c = lt; *c; c++) {
      if (*c == '@')
        kiln_sbuf_puts(&b, v < 2 ? "f32" : "bf16");
      else if (*c == '~')
        kiln_sbuf_puts(&b, v < 2 ? "LT" : "GT");
      else
        kiln_sbuf_printf(&b, "%c", *c);
    }
    agree(kiln_sbuf_str(&b), -1, v % 2 ? NO_NAN : SPECIALS, 2);
    kiln_sbuf_free(&b);
  }
}
END_TEST

/* ---- complex elementwise ------------------------------------------------ */

/* A chain over c64 or c128 operands of random dims and layouts: every op
 * the interpreter defines on complex values, conversions both ways, a
 * select on an EQ/NE compare, and a complex sum. */
static void complex_module(kiln_sbuf *b, uint64_t *s) {
  uint32_t r = 1 + (uint32_t)(rng(s) % 3);
  int64_t dims[3];
  for (uint32_t i = 0; i < r; i++) dims[i] = 1 + (int64_t)(rng(s) % 9);
  bool wide = rng(s) % 2;
  const char *c = wide ? "c128" : "c64", *re = wide ? "f64" : "f32", *oc = wide ? "c64" : "c128";
  kiln_sbuf sh = KILN_SBUF_INIT, rs = KILN_SBUF_INIT, os = KILN_SBUF_INIT, is = KILN_SBUF_INIT;
  kiln_sbuf_puts(&sh, c);
  put_dims(&sh, dims, r);
  kiln_sbuf_puts(&rs, re);
  put_dims(&rs, dims, r);
  kiln_sbuf_puts(&os, oc);
  put_dims(&os, dims, r);
  kiln_sbuf_puts(&is, "s32");
  put_dims(&is, dims, r);
  const char *S = kiln_sbuf_str(&sh), *R = kiln_sbuf_str(&rs), *O = kiln_sbuf_str(&os),
             *I = kiln_sbuf_str(&is);
  kiln_sbuf_printf(b,
                   "HloModule t\nsum {\n  x = %s[] parameter(0)\n  y = %s[] parameter(1)\n"
                   "  ROOT z = %s[] add(x, y)\n}\nENTRY e {\n",
                   c, c, c);
  kiln_sbuf_printf(b, "  a = ");
  put_shape(b, c, dims, r, s);
  kiln_sbuf_printf(b, " parameter(0)\n  bb = ");
  put_shape(b, c, dims, r, s);
  kiln_sbuf_printf(b, " parameter(1)\n  f = ");
  put_shape(b, re, dims, r, s);
  kiln_sbuf_printf(b, " parameter(2)\n  n = ");
  put_shape(b, "s32", dims, r, s);
  kiln_sbuf_printf(b, " parameter(3)\n");
  kiln_sbuf_printf(b,
                   "  ad = %s add(a, bb)\n  sb = %s subtract(ad, bb)\n  mu = %s multiply(sb, a)\n"
                   "  dv = %s divide(mu, bb)\n  ng = %s negate(dv)\n  ab = %s abs(ng)\n"
                   "  rl = %s real(mu)\n  im = %s imag(dv)\n  s1 = %s add(rl, im)\n"
                   "  s2 = %s add(s1, ab)\n  s3 = %s add(s2, f)\n  cx = %s complex(s3, f)\n"
                   "  ca = %s convert(n)\n  cf = %s convert(f)\n  c1 = %s add(cx, ca)\n"
                   "  c2 = %s multiply(c1, cf)\n  eq = pred%s compare(a, bb), direction=EQ\n"
                   "  ne = pred%s compare(c2, cx), direction=NE\n"
                   "  se = %s select(ne, c2, dv)\n  sl = %s select(eq, se, mu)\n"
                   "  oc = %s convert(sl)\n  bk = %s convert(oc)\n  fr = %s convert(sl)\n"
                   "  ir = %s convert(bk)\n  k = %s[] constant((0, 0))\n",
                   S, S, S, S, S, R, R, R, R, R, R, S, S, S, S, S, I + 3, I + 3, S, S, O, S, R, I,
                   c);
  kiln_sbuf_printf(b, "  rd = %s[] reduce(sl, k), dimensions={", c);
  for (uint32_t i = 0; i < r; i++) kiln_sbuf_printf(b, "%s%u", i ? "," : "", i);
  kiln_sbuf_printf(b,
                   "}, to_apply=sum\n  ROOT t = (%s, %s, %s, %s, pred%s, %s[]) tuple(bk, fr, ir, "
                   "ng, eq, rd)\n}\n",
                   S, R, I, S, I + 3, c);
  kiln_sbuf_free(&sh);
  kiln_sbuf_free(&rs);
  kiln_sbuf_free(&os);
  kiln_sbuf_free(&is);
}

/* c64 multiply on every pair of special parts (kc64mul: the textbook
 * product and Annex G's recovery through integer masks) is C's x * y, as
 * the interpreter computes it: every part bit-equal, NaNs as NaNs. */
START_TEST(test_complex_multiply_specials) {
  static const double v[] = {0.0, -0.0, 1.0, -2.5, 3e38, INFINITY, -INFINITY, NAN};
  enum { NV = sizeof v / sizeof *v, N = NV * NV * NV * NV };
  char text[200];
  snprintf(text, sizeof text,
           "HloModule t\nENTRY e {\n  a = c64[%d] parameter(0)\n  b = c64[%d] parameter(1)\n"
           "  ROOT m = c64[%d] multiply(a, b)\n}\n",
           N, N, N);
  kiln_module *m = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st), 0);
  kiln_executable *e = NULL;
  ck_assert_int_eq(kiln_compile(m, NULL, &e, NULL, &st), 0);
  const kiln_computation *en = kiln_module_entry(m);
  kiln_literal *args[2], *want = NULL, *got = NULL;
  for (uint32_t k = 0; k < 2; k++) {
    const kiln_instr *p = kiln_computation_param(m, en, k);
    ck_assert_int_eq(kiln_literal_create(NULL, &p->shape, 1u << 20, &args[k], &st), 0);
  }
  for (int i = 0; i < N; i++) {
    kiln_literal_set_c128(args[0], i, v[i % NV], v[i / NV % NV]);
    kiln_literal_set_c128(args[1], i, v[i / (NV * NV) % NV], v[i / (NV * NV * NV)]);
  }
  kiln_run_options ro = {.max_while_iterations = 10, .timeout_seconds = 60};
  ck_assert_int_eq(kiln_run_module_with(m, "interp", NULL, NULL, &ro,
                                        (const kiln_literal *const *)args, 2, &want, &st),
                   0);
  ck_assert_int_eq(
      kiln_run_executable(e, NULL, &ro, (const kiln_literal *const *)args, 2, &got, &st), 0);
  for (int i = 0; i < N; i++) {
    double wr, wi, gr, gi;
    kiln_literal_get_c128(want, i, &wr, &wi);
    kiln_literal_get_c128(got, i, &gr, &gi);
    bool same_re = isnan(wr) ? isnan(gr) : memcmp(&wr, &gr, sizeof wr) == 0;
    bool same_im = isnan(wi) ? isnan(gi) : memcmp(&wi, &gi, sizeof wi) == 0;
    ck_assert_msg(same_re && same_im, "(%g%+gi) * (%g%+gi): want %g%+gi, got %g%+gi", v[i % NV],
                  v[i / NV % NV], v[i / (NV * NV) % NV], v[i / (NV * NV * NV)], wr, wi, gr, gi);
  }
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  kiln_literal_destroy(args[0]);
  kiln_literal_destroy(args[1]);
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_complex_random) {
  uint64_t s = 4242;
  for (int i = 0; i < 16; i++) {
    kiln_sbuf b = KILN_SBUF_INIT;
    complex_module(&b, &s);
    agree(kiln_sbuf_str(&b), KILN_TOL_C128_REL, PLAIN, 2);
    kiln_sbuf_free(&b);
  }
}
END_TEST

/* jnp.argsort's comparator as JAX 0.10 exports it: each key canonicalized
 * (NaN as +NaN, -0 as +0), then LT in total order. */
static const char jax_argsort[] =
    "HloModule t\nregion {\n  c = s32[] parameter(2)\n  d = s32[] parameter(3)\n"
    "  a = @[] parameter(0)\n  ne.2 = pred[] compare(a, a), direction=NE\n"
    "  nan = @[] constant(nan)\n  zero = @[] constant(0)\n"
    "  eq.2 = pred[] compare(a, zero), direction=EQ\n  s4 = @[] select(eq.2, zero, a)\n"
    "  s5 = @[] select(ne.2, nan, s4)\n  b = @[] parameter(1)\n"
    "  ne.3 = pred[] compare(b, b), direction=NE\n  eq.3 = pred[] compare(b, zero), direction=EQ\n"
    "  s6 = @[] select(eq.3, zero, b)\n  s7 = @[] select(ne.3, nan, s6)\n"
    "  ROOT lt = pred[] compare(s5, s7), direction=LT, type=TOTALORDER\n}\n"
    "ENTRY e {\n  x = @[16,333] parameter(0)\n  i = s32[16,333] iota(), iota_dimension=1\n"
    "  ROOT s = (@[16,333], s32[16,333]) sort(x, i), dimensions={1}, is_stable=true, "
    "to_apply=region\n}\n";

START_TEST(test_sort_jax_comparator) {
  const char *types[] = {"f32", "bf16", "f16"};
  for (int v = 0; v < 3; v++) {
    kiln_sbuf b = KILN_SBUF_INIT;
    for (const char *c = jax_argsort; *c; c++) {
      if (*c == '@')
        kiln_sbuf_puts(&b, types[v]);
      else
        kiln_sbuf_printf(&b, "%c", *c);
    }
    agree(kiln_sbuf_str(&b), -1, SPECIALS, 2);
    kiln_sbuf_free(&b);
  }
}
END_TEST

START_TEST(test_sort_refused) {
  refused("HloModule t\ncmp {\n  a = c64[] parameter(0)\n  b = c64[] parameter(1)\n"
          "  ROOT lt = pred[] compare(a, b), direction=LT\n}\nENTRY e {\n"
          "  p = c64[4,8] parameter(0)\n  ROOT s = c64[4,8] sort(p), dimensions={1}, "
          "to_apply=cmp\n}\n",
          "compare lt: complex values compare only with EQ or NE");
}
END_TEST

START_TEST(test_complex_refused) {
  refused("HloModule t\nENTRY e {\n  a = c64[4] parameter(0)\n  b = c64[4] parameter(1)\n"
          "  ROOT c = pred[4] compare(a, b), direction=LT\n}\n",
          "only with EQ or NE");
  refused("HloModule t\nENTRY e {\n  a = c64[4] parameter(0)\n  ROOT c = c64[4] sqrt(a)\n}\n",
          "sqrt");
}
END_TEST

/* ---- fft ---------------------------------------------------------------- */

static const char *const fft_types[] = {"FFT", "IFFT", "RFFT", "IRFFT"};

/* A random fft: rank 1-4, 1-3 transformed dims, lengths odd, even and
 * powers of two, random layouts of operand and result. *points: the
 * transform's size (product of the lengths). */
static void fft_module(kiln_sbuf *b, uint64_t *s, int64_t *points) {
  uint32_t r = 1 + (uint32_t)(rng(s) % 4), nf = 1 + (uint32_t)(rng(s) % (r < 3 ? r : 3));
  int type = (int)(rng(s) % 4);
  bool wide = rng(s) % 2;
  static const int64_t lens[] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 17, 30, 64};
  int64_t len[4], in[4], out[4];
  *points = 1;
  for (uint32_t d = 0; d < r; d++) {
    bool t = d + nf >= r;
    len[d] = t ? lens[rng(s) % (sizeof lens / sizeof *lens)] : 1 + (int64_t)(rng(s) % 4);
    if (t) *points *= len[d];
    in[d] = out[d] = len[d];
  }
  if (type == 2) out[r - 1] = len[r - 1] / 2 + 1;
  if (type == 3) in[r - 1] = len[r - 1] / 2 + 1;
  const char *c = wide ? "c128" : "c64", *re = wide ? "f64" : "f32";
  kiln_sbuf_puts(b, "HloModule t\nENTRY e {\n  p = ");
  put_shape(b, type == 2 ? re : c, in, r, s);
  kiln_sbuf_puts(b, " parameter(0)\n  ROOT f = ");
  put_shape(b, type == 3 ? re : c, out, r, s);
  kiln_sbuf_printf(b, " fft(p), fft_type=%s, fft_length={", fft_types[type]);
  for (uint32_t d = r - nf; d < r; d++)
    kiln_sbuf_printf(b, "%s%lld", d > r - nf ? "," : "", (long long)len[d]);
  kiln_sbuf_puts(b, "}\n}\n");
  (void)wide;
}

static void fft_random(uint64_t seed, int n) {
  uint64_t s = seed;
  for (int i = 0; i < n; i++) {
    kiln_sbuf b = KILN_SBUF_INIT;
    int64_t points;
    fft_module(&b, &s, &points);
    bool c64 = strstr(kiln_sbuf_str(&b), "c64") != NULL;
    agree(kiln_sbuf_str(&b), kiln_tol_fft(points, c64), PLAIN, 2);
    kiln_sbuf_free(&b);
  }
}

START_TEST(test_fft_random) { fft_random(99, 40); }
END_TEST

/* The same modules through the direct DFT, as on a machine without FFTW. */
START_TEST(test_fft_without_fftw) {
  setenv("KILN_NO_FFTW", "1", 1);
  fft_random(99, 12);
}
END_TEST

/* jnp.fft.rfft, a filter, irfft: the round trip of a real signal. */
START_TEST(test_fft_roundtrip) {
  agree("HloModule t\nENTRY e {\n  x = f32[8,256] parameter(0)\n  h = c64[8,129] parameter(1)\n"
        "  f = c64[8,129] fft(x), fft_type=RFFT, fft_length={256}\n"
        "  g = c64[8,129] multiply(f, h)\n"
        "  ROOT y = f32[8,256] fft(g), fft_type=IRFFT, fft_length={256}\n}\n",
        kiln_tol_fft(256, 1), PLAIN, 2);
  agree("HloModule t\nENTRY e {\n  x = c128[2,16,8,4] parameter(0)\n"
        "  f = c128[2,16,8,4] fft(x), fft_type=FFT, fft_length={16,8,4}\n"
        "  ROOT y = c128[2,16,8,4] fft(f), fft_type=IFFT, fft_length={16,8,4}\n}\n",
        kiln_tol_fft(512, 0), PLAIN, 1);
}
END_TEST

/* The plan goes through FFTW when the library is there. */
START_TEST(test_fft_plan_uses_fftw) {
  void *h = dlopen("libfftw3f.so.3", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "test_fft_plan_uses_fftw: libfftw3f.so.3 not found, skipped\n");
    return;
  }
  dlclose(h);
  kiln_fft f = {.type = KILN_FFT_FORWARD,
                .dtype = KILN_C64,
                .rank = 2,
                .nfft = 1,
                .len = {3, 8},
                .in_dims = {3, 8},
                .in_strides = {8, 1},
                .out_dims = {3, 8},
                .out_strides = {1, 3}};
  char why[200];
  ck_assert_msg(kiln_fft_check(&f, 192, 192, why, sizeof why), "%s", why);
  ck_assert(!kiln_fft_check(&f, 192, 100, why, sizeof why));
  ck_assert_ptr_nonnull(strstr(why, "result"));
  kiln__cpu_fft *p = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__cpu_fft_create(&f, &p, "test", &st), 0);
  ck_assert(kiln__cpu_fft_uses_library(p));
  kiln__cpu_fft_destroy(p);
}
END_TEST

/* Multi-dim ffts of dense row-major arrays (what JAX exports) run as a
 * line pass and column passes (cpu_fft.c): every type, 2 and 3
 * transformed dims, batch dims, odd lengths and lengths that leave a
 * partial block of columns (blocks are 64 bytes of a row). */
START_TEST(test_fft_passes) {
  static const char *const mods[] = {
      "c64[3,17,30] fft(p), fft_type=FFT, fft_length={17,30}; c64[3,17,30]",
      "c64[2,5,12,7] fft(p), fft_type=IFFT, fft_length={5,12,7}; c64[2,5,12,7]",
      "c64[4,9,9] fft(p), fft_type=RFFT, fft_length={9,16}; f32[4,9,16]",
      "f32[4,9,16] fft(p), fft_type=IRFFT, fft_length={9,16}; c64[4,9,9]",
      "f32[3,7,5,9] fft(p), fft_type=IRFFT, fft_length={7,5,9}; c64[3,7,5,5]",
      "c128[64,48] fft(p), fft_type=FFT, fft_length={64,48}; c128[64,48]",
      "c128[2,6,10,4] fft(p), fft_type=RFFT, fft_length={6,10,7}; f64[2,6,10,7]",
      "c128[6,1,33] fft(p), fft_type=IFFT, fft_length={1,33}; c128[6,1,33]",
      "f64[2,3,8,30] fft(p), fft_type=IRFFT, fft_length={8,30}; c128[2,3,8,16]",
      "c64[2,16,64] fft(p), fft_type=FFT, fft_length={16,64}; c64[2,16,64]",
  };
  for (size_t i = 0; i < sizeof mods / sizeof *mods; i++) {
    char text[512], res[128], op[64];
    const char *semi = strchr(mods[i], ';');
    snprintf(res, sizeof res, "%.*s", (int)(semi - mods[i]), mods[i]);
    snprintf(op, sizeof op, "%s", semi + 2);
    snprintf(text, sizeof text, "HloModule t\nENTRY e {\n  p = %s parameter(0)\n  ROOT f = %s\n}\n",
             op, res);
    int64_t points = 1;
    const char *l = strstr(res, "fft_length={") + strlen("fft_length={");
    for (char *end; *l && *l != '}'; l = *end == ',' ? end + 1 : end)
      points *= strtoll(l, &end, 10);
    agree(text, kiln_tol_fft(points, strstr(text, "c64") != NULL), PLAIN, 2);
  }
}
END_TEST

/* The pass form is chosen for dense row-major arrays only, and its result
 * does not depend on how the pool splits the chunks. */
START_TEST(test_fft_passes_plan) {
  void *h = dlopen("libfftw3f.so.3", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "test_fft_passes_plan: libfftw3f.so.3 not found, skipped\n");
    return;
  }
  dlclose(h);
  kiln_fft f = {.type = KILN_FFT_INVERSE,
                .dtype = KILN_C64,
                .rank = 3,
                .nfft = 2,
                .len = {3, 17, 12},
                .in_dims = {3, 17, 12},
                .in_strides = {204, 12, 1},
                .out_dims = {3, 17, 12},
                .out_strides = {204, 12, 1}};
  enum { N = 3 * 17 * 12 };
  float *in = kiln_malloc(2 * N * sizeof *in), *want = kiln_malloc(2 * N * sizeof *want);
  float *one = kiln_malloc(2 * N * sizeof *one), *many = kiln_malloc(2 * N * sizeof *many);
  ck_assert(in && want && one && many);
  uint64_t s = 5;
  for (int i = 0; i < 2 * N; i++) in[i] = (float)((double)(rng(&s) % 2001) / 1000.0 - 1.0);
  ck_assert_int_eq(kiln_fft_reference(&f, in, want), 0);
  kiln__cpu_fft *p = NULL;
  kiln__cpu_pool *pool = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__cpu_fft_create(&f, &p, "test", &st), 0);
  ck_assert(kiln__cpu_fft_uses_passes(p));
  ck_assert_int_eq(kiln__cpu_pool_create(3, &pool, &st), 0);
  ck_assert_int_eq(kiln__cpu_fft_run(p, NULL, in, one, &st), 0);
  ck_assert_int_eq(kiln__cpu_fft_run(p, pool, in, many, &st), 0);
  ck_assert_mem_eq(one, many, 2 * N * sizeof *one);
  double worst = 0, top = 1;
  for (int i = 0; i < 2 * N; i++) {
    worst = fmax(worst, fabs((double)one[i] - want[i]));
    top = fmax(top, fabs((double)want[i]));
  }
  ck_assert_msg(worst / top <= kiln_tol_fft(17 * 12, 1), "error %g", worst / top);
  kiln__cpu_fft_destroy(p);
  /* The same transform with a transposed result: one guru plan. */
  f.out_strides[0] = 1;
  f.out_strides[1] = 3;
  f.out_strides[2] = 51;
  ck_assert_int_eq(kiln__cpu_fft_create(&f, &p, "test", &st), 0);
  ck_assert(kiln__cpu_fft_uses_library(p));
  ck_assert(!kiln__cpu_fft_uses_passes(p));
  kiln__cpu_fft_destroy(p);
  kiln__cpu_pool_destroy(pool);
  kiln_free(in);
  kiln_free(want);
  kiln_free(one);
  kiln_free(many);
}
END_TEST

/* With KILN_FFTW_PLANNER=measure and a kernel cache directory, what the
 * planner measured is written there as FFTW wisdom (for later processes,
 * whose default plans use it), and the measured plans are as right. */
START_TEST(test_fft_wisdom_file) {
  void *h = dlopen("libfftw3f.so.3", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "test_fft_wisdom_file: libfftw3f.so.3 not found, skipped\n");
    return;
  }
  dlclose(h);
  char dir[] = "/tmp/kiln-wisdom-XXXXXX", path[64], cmd[96];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  setenv("KILN_KERNEL_CACHE_DIR", dir, 1);
  setenv("KILN_FFTW_PLANNER", "measure", 1);
  agree("HloModule t\nENTRY e {\n  p = f32[4,64] parameter(0)\n"
        "  ROOT f = c64[4,33] fft(p), fft_type=RFFT, fft_length={64}\n}\n",
        kiln_tol_fft(64, 1), PLAIN, 1);
  snprintf(path, sizeof path, "%s/fftw3f.wisdom", dir);
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "no %s", path);
  char head[32] = "";
  ck_assert_ptr_nonnull(fgets(head, sizeof head, f));
  fclose(f);
  ck_assert_msg(strstr(head, "fftw") != NULL, "%s starts with '%s'", path, head);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_fft_refused) {
  refused("HloModule t\nENTRY e {\n  p = f32[4,8] parameter(0)\n"
          "  ROOT f = c128[4,5] fft(p), fft_type=RFFT, fft_length={8}\n}\n",
          "does not match the inferred shape");
  refused("HloModule t\nENTRY e {\n  p = c64[1,1,1,1,1,1,1,1,1,4] parameter(0)\n"
          "  ROOT f = c64[1,1,1,1,1,1,1,1,1,4] fft(p), fft_type=FFT, fft_length={4}\n}\n",
          "the cpu backend cannot compile this fft: operand and result ranks must be equal and 1 "
          "to 8");
}
END_TEST

/* A cumulative reduce-window over a random array: the scan kernel when the
 * window is the whole dimension with low padding, the window form for the
 * reversed (high padding) and shorter windows. */
static void scan_module(kiln_sbuf *b, uint64_t *s) {
  static const char *const types[] = {"f32", "f64", "f16", "bf16", "s32", "s8"};
  static const char *const ops[] = {"add", "maximum", "minimum", "multiply"};
  uint32_t r = 1 + (uint32_t)(rng(s) % 3), sd = (uint32_t)(rng(s) % r);
  int64_t dims[3];
  for (uint32_t i = 0; i < r; i++) dims[i] = 1 + (int64_t)(rng(s) % 7);
  dims[sd] = 2 + (int64_t)(rng(s) % 60);
  const char *t = types[rng(s) % 6], *op = ops[rng(s) % 4];
  int form = (int)(rng(s) % 4); /* 0, 1: scan; 2: reversed; 3: a shorter window */
  int init = (int)(rng(s) % 3) - 1;
  kiln_sbuf_printf(b,
                   "HloModule t\nf {\n  a = %s[] parameter(0)\n  b = %s[] parameter(1)\n"
                   "  ROOT c = %s[] %s(a, b)\n}\nENTRY e {\n  p = ",
                   t, t, t, op);
  put_shape(b, t, dims, r, s);
  kiln_sbuf_printf(b, " parameter(0)\n  z = %s[] constant(%d)\n  ROOT w = ", t, init);
  put_shape(b, t, dims, r, s);
  kiln_sbuf_puts(b, " reduce-window(p, z), window={size=");
  for (uint32_t d = 0; d < r; d++) {
    int64_t n = d != sd ? 1 : form == 3 ? (dims[d] + 1) / 2 : dims[d];
    kiln_sbuf_printf(b, "%s%lld", d ? "x" : "", (long long)n);
  }
  kiln_sbuf_puts(b, " pad=");
  for (uint32_t d = 0; d < r; d++) {
    int64_t n = d != sd ? 0 : form == 3 ? (dims[d] + 1) / 2 - 1 : dims[d] - 1;
    if (form == 2 && d == sd)
      kiln_sbuf_printf(b, "%s0_%lld", d ? "x" : "", (long long)n);
    else
      kiln_sbuf_printf(b, "%s%lld_0", d ? "x" : "", (long long)n);
  }
  kiln_sbuf_puts(b, "}, to_apply=f\n}\n");
}

START_TEST(test_scan_random) {
  uint64_t s = 4242;
  for (int i = 0; i < 40; i++) {
    kiln_sbuf b = KILN_SBUF_INIT;
    scan_module(&b, &s);
    agree(kiln_sbuf_str(&b), -1, SPECIALS, 2);
    kiln_sbuf_free(&b);
  }
}
END_TEST

/* cumsum and cummax as JAX writes them: long rows split across threads, and
 * a scan along the major dimension. */
START_TEST(test_scan_wide) {
  agree("HloModule t\nf {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
        "  ROOT c = f32[] add(a, b)\n}\nENTRY e {\n  p = f32[24,1500] parameter(0)\n"
        "  z = f32[] constant(0)\n  ROOT w = f32[24,1500] reduce-window(p, z), "
        "window={size=1x1500 pad=0_0x1499_0}, to_apply=f\n}\n",
        -1, PLAIN, 1);
  agree("HloModule t\nf {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
        "  ROOT c = f32[] maximum(a, b)\n}\nENTRY e {\n  p = f32[300,200] parameter(0)\n"
        "  z = f32[] constant(-inf)\n  ROOT w = f32[300,200] reduce-window(p, z), "
        "window={size=300x1 pad=299_0x0_0}, to_apply=f\n}\n",
        -1, SPECIALS, 1);
}
END_TEST

/* Integer dots: 8-bit operands whose sums stay below 2^24 run as an f32
 * GEMM (exact), the others as the integer kernel or loop; every result is
 * bit-equal to the interpreter's, with operands at the ends of their range.
 * K runs past the f32 bound (1024 for s8 x s8) so both sides of it run. */
static void idot_module(kiln_sbuf *b, uint64_t *s) {
  static const char *const ops[] = {"s8", "u8", "s32", "s16"};
  static const char *const res[] = {"s32", "s64", "u32"};
  const char *lt = ops[rng(s) % 4], *rt = rng(s) % 2 ? lt : ops[rng(s) % 2];
  const char *ot = res[rng(s) % 3];
  int64_t m = 1 + (int64_t)(rng(s) % 9), n = 1 + (int64_t)(rng(s) % 9);
  static const int64_t ks[] = {1, 7, 64, 255, 256, 259, 1024, 1031};
  int64_t k = ks[rng(s) % 8];
  bool batch = rng(s) % 3 == 0, tl = rng(s) % 2, tr = rng(s) % 2;
  kiln_sbuf_puts(b, "HloModule t\nENTRY e {\n");
  int64_t ld[3], rd[3], od[3];
  uint32_t r = 0;
  if (batch) ld[r] = rd[r] = od[r] = 3, r++;
  ld[r] = tl ? k : m, ld[r + 1] = tl ? m : k;
  rd[r] = tr ? n : k, rd[r + 1] = tr ? k : n;
  od[r] = m, od[r + 1] = n;
  kiln_sbuf_puts(b, "  a = ");
  put_shape(b, lt, ld, r + 2, s);
  kiln_sbuf_puts(b, " parameter(0)\n  c = ");
  put_shape(b, rt, rd, r + 2, s);
  kiln_sbuf_puts(b, " parameter(1)\n  ROOT d = ");
  put_shape(b, ot, od, r + 2, s);
  kiln_sbuf_printf(b, " dot(a, c), %slhs_contracting_dims={%u}, rhs_contracting_dims={%u}\n}\n",
                   batch ? "lhs_batch_dims={0}, rhs_batch_dims={0}, " : "", r + (tl ? 0 : 1),
                   r + (tr ? 1 : 0));
}

START_TEST(test_idot_random) {
  uint64_t s = 777;
  for (int i = 0; i < 48; i++) {
    kiln_sbuf b = KILN_SBUF_INIT;
    idot_module(&b, &s);
    agree(kiln_sbuf_str(&b), -1, EXTREME, 2);
    kiln_sbuf_free(&b);
  }
}
END_TEST

/* jax.random's threefry2x32 as JAX exports it for the CPU (a while loop of
 * five trips, four rounds each, the rotation amounts carried in the state
 * and swapped each trip, the key schedule added with the trip counter),
 * over counters made from a u64 iota split in two words, then the bits made
 * uniform floats, a bernoulli draw and a dropout select. The loop is
 * unrolled and the whole chain fused; every result is bit-equal to the
 * interpreter's (u32 arithmetic, and float steps that are exact). */
static const char *const threefry_text =
    "HloModule threefry\n"
    "rounds {\n"
    "  x = u32[64,32] parameter(0)  y = u32[64,32] parameter(1)  r = u32[4] parameter(2)\n"
    "  c32 = u32[] constant(32)\n"
    "  s0 = u32[1] slice(r), slice={[0:1]}  q0 = u32[] reshape(s0)\n"
    "  b0 = u32[64,32] broadcast(q0), dimensions={}  d0 = u32[] subtract(c32, q0)\n"
    "  e0 = u32[64,32] broadcast(d0), dimensions={}\n"
    "  a0 = u32[64,32] add(x, y)  l0 = u32[64,32] shift-left(y, b0)\n"
    "  h0 = u32[64,32] shift-right-logical(y, e0)  o0 = u32[64,32] or(l0, h0)\n"
    "  y0 = u32[64,32] xor(a0, o0)\n"
    "  s1 = u32[1] slice(r), slice={[1:2]}  q1 = u32[] reshape(s1)\n"
    "  b1 = u32[64,32] broadcast(q1), dimensions={}  d1 = u32[] subtract(c32, q1)\n"
    "  e1 = u32[64,32] broadcast(d1), dimensions={}\n"
    "  a1 = u32[64,32] add(a0, y0)  l1 = u32[64,32] shift-left(y0, b1)\n"
    "  h1 = u32[64,32] shift-right-logical(y0, e1)  o1 = u32[64,32] or(l1, h1)\n"
    "  y1 = u32[64,32] xor(a1, o1)\n"
    "  s2 = u32[1] slice(r), slice={[2:3]}  q2 = u32[] reshape(s2)\n"
    "  b2 = u32[64,32] broadcast(q2), dimensions={}  d2 = u32[] subtract(c32, q2)\n"
    "  e2 = u32[64,32] broadcast(d2), dimensions={}\n"
    "  a2 = u32[64,32] add(a1, y1)  l2 = u32[64,32] shift-left(y1, b2)\n"
    "  h2 = u32[64,32] shift-right-logical(y1, e2)  o2 = u32[64,32] or(l2, h2)\n"
    "  y2 = u32[64,32] xor(a2, o2)\n"
    "  s3 = u32[1] slice(r), slice={[3:4]}  q3 = u32[] reshape(s3)\n"
    "  b3 = u32[64,32] broadcast(q3), dimensions={}  d3 = u32[] subtract(c32, q3)\n"
    "  e3 = u32[64,32] broadcast(d3), dimensions={}\n"
    "  a3 = u32[64,32] add(a2, y2)  l3 = u32[64,32] shift-left(y2, b3)\n"
    "  h3 = u32[64,32] shift-right-logical(y2, e3)  o3 = u32[64,32] or(l3, h3)\n"
    "  y3 = u32[64,32] xor(a3, o3)\n"
    "  ROOT t = (u32[64,32], u32[64,32]) tuple(a3, y3)\n"
    "}\n"
    "cond {\n"
    "  s = (s32[], u32[64,32], u32[64,32], u32[], u32[], u32[], u32[4], u32[4]) parameter(0)\n"
    "  i = s32[] get-tuple-element(s), index=0  n = s32[] constant(5)\n"
    "  ROOT lt = pred[] compare(i, n), direction=LT\n"
    "}\n"
    "body {\n"
    "  s = (s32[], u32[64,32], u32[64,32], u32[], u32[], u32[], u32[4], u32[4]) parameter(0)\n"
    "  i = s32[] get-tuple-element(s), index=0\n"
    "  x = u32[64,32] get-tuple-element(s), index=1  y = u32[64,32] get-tuple-element(s), "
    "index=2\n"
    "  k0 = u32[] get-tuple-element(s), index=3  k1 = u32[] get-tuple-element(s), index=4\n"
    "  k2 = u32[] get-tuple-element(s), index=5\n"
    "  ra = u32[4] get-tuple-element(s), index=6  rb = u32[4] get-tuple-element(s), index=7\n"
    "  c = (u32[64,32], u32[64,32]) call(x, y, ra), to_apply=rounds\n"
    "  cx = u32[64,32] get-tuple-element(c), index=0  cy = u32[64,32] get-tuple-element(c), "
    "index=1\n"
    "  kb0 = u32[64,32] broadcast(k0), dimensions={}  nx = u32[64,32] add(cx, kb0)\n"
    "  kb1 = u32[64,32] broadcast(k1), dimensions={}  ny0 = u32[64,32] add(cy, kb1)\n"
    "  one = s32[] constant(1)  i2 = s32[] add(i, one)  iu = u32[] convert(i2)\n"
    "  ib = u32[64,32] broadcast(iu), dimensions={}  ny = u32[64,32] add(ny0, ib)\n"
    "  ROOT t = (s32[], u32[64,32], u32[64,32], u32[], u32[], u32[], u32[4], u32[4]) "
    "tuple(i2, nx, ny, k1, k2, k0, rb, ra)\n"
    "}\n"
    "ENTRY main {\n"
    "  key = u32[2] parameter(0)  xin = f32[64,32] parameter(1)\n"
    "  ks0 = u32[1] slice(key), slice={[0:1]}  k0 = u32[] reshape(ks0)\n"
    "  ks1 = u32[1] slice(key), slice={[1:2]}  k1 = u32[] reshape(ks1)\n"
    "  kx = u32[] xor(k0, k1)  parity = u32[] constant(466688986)  k2 = u32[] xor(kx, parity)\n"
    "  io = u64[64,32] iota(), iota_dimension=0  w = u64[] constant(32)\n"
    "  wb = u64[64,32] broadcast(w), dimensions={}  im = u64[64,32] multiply(io, wb)\n"
    "  jo = u64[64,32] iota(), iota_dimension=1  ctr = u64[64,32] add(im, jo)\n"
    "  sh = u64[] constant(32)  shb = u64[64,32] broadcast(sh), dimensions={}\n"
    "  hi64 = u64[64,32] shift-right-logical(ctr, shb)  hi = u32[64,32] convert(hi64)\n"
    "  lo = u32[64,32] convert(ctr)\n"
    "  kb0 = u32[64,32] broadcast(k0), dimensions={}  x0 = u32[64,32] add(hi, kb0)\n"
    "  kb1 = u32[64,32] broadcast(k1), dimensions={}  y0 = u32[64,32] add(lo, kb1)\n"
    "  z = s32[] constant(0)\n"
    "  ra = u32[4] constant({13, 15, 26, 6})  rb = u32[4] constant({17, 29, 16, 24})\n"
    "  init = (s32[], u32[64,32], u32[64,32], u32[], u32[], u32[], u32[4], u32[4]) "
    "tuple(z, x0, y0, k1, k2, k0, ra, rb)\n"
    "  l = (s32[], u32[64,32], u32[64,32], u32[], u32[], u32[], u32[4], u32[4]) while(init), "
    "condition=cond, body=body\n"
    "  p = u32[64,32] get-tuple-element(l), index=1  q = u32[64,32] get-tuple-element(l), "
    "index=2\n"
    "  bits = u32[64,32] xor(p, q)  nine = u32[] constant(9)\n"
    "  nb = u32[64,32] broadcast(nine), dimensions={}  mant = u32[64,32] "
    "shift-right-logical(bits, nb)\n"
    "  e = u32[] constant(1065353216)  eb = u32[64,32] broadcast(e), dimensions={}\n"
    "  fb = u32[64,32] or(mant, eb)  f = f32[64,32] bitcast-convert(fb)\n"
    "  fone = f32[] constant(1)  fob = f32[64,32] broadcast(fone), dimensions={}\n"
    "  u = f32[64,32] subtract(f, fob)\n"
    "  pk = f32[] constant(0.9)  pkb = f32[64,32] broadcast(pk), dimensions={}\n"
    "  keep = pred[64,32] compare(u, pkb), direction=LT\n"
    "  zero = f32[] constant(0)  zb = f32[64,32] broadcast(zero), dimensions={}\n"
    "  drop = f32[64,32] select(keep, xin, zb)\n"
    "  ROOT r = (u32[64,32], f32[64,32], f32[64,32]) tuple(bits, u, drop)\n"
    "}\n";

/* An int8-quantized matmul as JAX writes it (the activations rounded,
 * clipped to [-127, 127] and converted to s8, an s8 x s8 -> s32 dot, the
 * sums dequantized by a per-column scale), with the weights stored either
 * way and batched, and a u8 lhs: the dot is one integer GEMM step (oneDNN's
 * int8 matmul where the CPU has VNNI), bit-equal to the interpreter. */
static void int8_matmul_module(kiln_sbuf *b, int variant) {
  int64_t m = 48, k = 300, n = 40;
  kiln_sbuf_puts(b, "HloModule q\nENTRY e {\n");
  kiln_sbuf_printf(b, "  x = f32[%lld,%lld] parameter(0)\n", (long long)m, (long long)k);
  if (variant == 1) /* weights [N, K] */
    kiln_sbuf_printf(b, "  w = s8[%lld,%lld] parameter(1)\n", (long long)n, (long long)k);
  else if (variant == 2) /* batched: [2, K, N] */
    kiln_sbuf_printf(b, "  w = s8[2,%lld,%lld] parameter(1)\n", (long long)k, (long long)n);
  else
    kiln_sbuf_printf(b, "  w = s8[%lld,%lld] parameter(1)\n", (long long)k, (long long)n);
  kiln_sbuf_printf(b, "  sc = f32[%lld] parameter(2)\n", (long long)n);
  kiln_sbuf_printf(b,
                   "  c64 = f32[] constant(64)  c64b = f32[%lld,%lld] broadcast(c64), "
                   "dimensions={}\n"
                   "  xm = f32[%lld,%lld] multiply(x, c64b)  xr = f32[%lld,%lld] "
                   "round-nearest-even(xm)\n",
                   (long long)m, (long long)k, (long long)m, (long long)k, (long long)m,
                   (long long)k);
  const char *qt = variant == 3 ? "u8" : "s8";
  const char *lo = variant == 3 ? "0" : "-127", *hi = variant == 3 ? "255" : "127";
  kiln_sbuf_printf(b,
                   "  lo = f32[] constant(%s)  hi = f32[] constant(%s)\n"
                   "  xc = f32[%lld,%lld] clamp(lo, xr, hi)  xq = %s[%lld,%lld] convert(xc)\n",
                   lo, hi, (long long)m, (long long)k, qt, (long long)m, (long long)k);
  if (variant == 1)
    kiln_sbuf_printf(b,
                     "  d = s32[%lld,%lld] dot(xq, w), lhs_contracting_dims={1}, "
                     "rhs_contracting_dims={1}\n",
                     (long long)m, (long long)n);
  else if (variant == 2)
    kiln_sbuf_printf(b,
                     "  xb = %s[2,%lld,%lld] broadcast(xq), dimensions={1,2}\n"
                     "  d3 = s32[2,%lld,%lld] dot(xb, w), lhs_batch_dims={0}, "
                     "rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}\n"
                     "  ds = s32[1,%lld,%lld] slice(d3), slice={[1:2], [0:%lld], [0:%lld]}\n"
                     "  d = s32[%lld,%lld] reshape(ds)\n",
                     qt, (long long)m, (long long)k, (long long)m, (long long)n, (long long)m,
                     (long long)n, (long long)m, (long long)n, (long long)m, (long long)n);
  else
    kiln_sbuf_printf(b,
                     "  d = s32[%lld,%lld] dot(xq, w), lhs_contracting_dims={1}, "
                     "rhs_contracting_dims={0}\n",
                     (long long)m, (long long)n);
  kiln_sbuf_printf(b,
                   "  df = f32[%lld,%lld] convert(d)  scb = f32[%lld,%lld] broadcast(sc), "
                   "dimensions={1}\n"
                   "  ds2 = f32[%lld,%lld] multiply(df, scb)  c64o = f32[%lld,%lld] "
                   "broadcast(c64), dimensions={}\n"
                   "  ds3 = f32[%lld,%lld] divide(ds2, c64o)\n"
                   "  ROOT r = (s32[%lld,%lld], f32[%lld,%lld]) tuple(d, ds3)\n}\n",
                   (long long)m, (long long)n, (long long)m, (long long)n, (long long)m,
                   (long long)n, (long long)m, (long long)n, (long long)m, (long long)n,
                   (long long)m, (long long)n, (long long)m, (long long)n);
}

START_TEST(test_int8_matmul) {
  kiln_sbuf b = KILN_SBUF_INIT;
  int8_matmul_module(&b, _i);
  agree(kiln_sbuf_str(&b), -1, EXTREME, 2);
  kiln_sbuf_free(&b);
}
END_TEST

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif

/* On a CPU with VNNI an int8 GEMM runs through oneDNN, not the loop (builds
 * with oneDNN, without sanitizers). */
START_TEST(test_igemm_library) {
#if defined(KILN_HAVE_DNNL) && !defined(TEST_ASAN) && defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512vnni")) {
    fprintf(stderr, "test_igemm_library: skipped, the CPU has no AVX-512 VNNI\n");
    return;
  }
  kiln_gemm g = {.dtype = KILN_S8,
                 .batch = 1,
                 .m = 64,
                 .n = 32,
                 .k = 128,
                 .lda = 128,
                 .ldb = 32,
                 .ldc = 32,
                 .stride_a = 64 * 128,
                 .stride_b = 128 * 32,
                 .stride_c = 64 * 32,
                 .alpha = 1,
                 .beta = 0};
  ck_assert(kiln__cpu_igemm_uses_library(&g));
  g.dtype = KILN_U8;
  g.trans_b = 1;
  g.ldb = 128;
  ck_assert(kiln__cpu_igemm_uses_library(&g));
#else
  fprintf(stderr, "test_igemm_library: skipped (no oneDNN, a sanitizer build or not x86)\n");
#endif
}
END_TEST

/* 8-bit integer dots (s8 or u8 x s8 -> s32, the integer GEMM step) of
 * random shapes, layouts and batch dims (none, one or two; the rhs's
 * leading or trailing), K on both sides of 514 (past it an s8 lhs is
 * shifted into u8 by Kiln: cpu_igemm.c), lopsided operands so that sums
 * pass 2^24 and wrap: bit-equal to the interpreter. _i = 1 runs oneDNN's
 * VNNI kernels (ONEDNN_MAX_CPU_ISA, read when oneDNN is opened: in fork
 * mode, in this test's process), as a CPU without AMX does. */
static void int8_dot_module(kiln_sbuf *b, uint64_t *s) {
  static const int64_t ks[] = {5, 300, 514, 515, 1031, 4097};
  const char *lt = rng(s) % 3 == 0 ? "u8" : "s8";
  int64_t m = 1 + (int64_t)(rng(s) % 24), n = 1 + (int64_t)(rng(s) % 24);
  int64_t k = ks[rng(s) % 6];
  uint32_t nb = (uint32_t)(rng(s) % (k > 1100 ? 2 : 3));
  bool tl = rng(s) % 2, tr = rng(s) % 2, rb_last = rng(s) % 2;
  int64_t bd[2] = {1 + (int64_t)(rng(s) % 3), 1 + (int64_t)(rng(s) % 2)};
  int64_t ld[4], rd[4], od[4];
  uint32_t r = 0;
  for (uint32_t i = 0; i < nb; i++) ld[r] = od[r] = bd[i], r++;
  ld[r] = tl ? k : m, ld[r + 1] = tl ? m : k;
  od[r] = m, od[r + 1] = n;
  uint32_t rb0 = rb_last ? 2 : 0, rf = rb_last ? 0 : nb; /* rhs: batch dims first or last */
  for (uint32_t i = 0; i < nb; i++) rd[rb0 + i] = bd[i];
  rd[rf] = tr ? n : k, rd[rf + 1] = tr ? k : n;
  kiln_sbuf_puts(b, "HloModule t\nENTRY e {\n  a = ");
  put_shape(b, lt, ld, r + 2, s);
  kiln_sbuf_puts(b, " parameter(0)\n  c = ");
  put_shape(b, "s8", rd, r + 2, s);
  kiln_sbuf_puts(b, " parameter(1)\n  ROOT d = ");
  put_shape(b, "s32", od, r + 2, s);
  kiln_sbuf_puts(b, " dot(a, c), ");
  if (nb) {
    kiln_sbuf_puts(b, "lhs_batch_dims={");
    for (uint32_t i = 0; i < nb; i++) kiln_sbuf_printf(b, "%s%u", i ? "," : "", i);
    kiln_sbuf_puts(b, "}, rhs_batch_dims={");
    for (uint32_t i = 0; i < nb; i++) kiln_sbuf_printf(b, "%s%u", i ? "," : "", rb0 + i);
    kiln_sbuf_puts(b, "}, ");
  }
  kiln_sbuf_printf(b, "lhs_contracting_dims={%u}, rhs_contracting_dims={%u}\n}\n", r + (tl ? 0 : 1),
                   rf + (tr ? 1 : 0));
}

START_TEST(test_int8_dot_random) {
  if (_i == 1) setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI", 0);
  uint64_t s = 4242 + (uint64_t)_i;
  for (int i = 0; i < 16; i++) {
    kiln_sbuf b = KILN_SBUF_INIT;
    int8_dot_module(&b, &s);
    agree(kiln_sbuf_str(&b), -1, LOPSIDED, 1);
    kiln_sbuf_free(&b);
  }
}
END_TEST

/* bf16 matmuls as JAX writes them (operands converted to bf16, the dot in
 * bf16 or with an f32 result, a GELU-style epilogue): one bf16 GEMM step
 * (operands kept bf16, f32 sums) in builds with oneDNN. Eighths in
 * [-2, 2] make every product and partial sum exact in f32, so the result
 * is the interpreter's bit for bit whatever order the GEMM sums in.
 * Variants: weights [K, N]; [N, K]; batched [2, M, K] x [2, K, N]; an f32
 * result. */
static void bf16_matmul_module(kiln_sbuf *b, int variant) {
  int64_t m = 40, k = 96, n = 72;
  const char *rt = variant == 3 ? "f32" : "bf16";
  kiln_sbuf_puts(b, "HloModule bm\nENTRY e {\n");
  if (variant == 2) {
    kiln_sbuf_printf(b,
                     "  x = f32[2,%lld,%lld] parameter(0)  w = f32[2,%lld,%lld] parameter(1)\n"
                     "  xb = bf16[2,%lld,%lld] convert(x)  wb = bf16[2,%lld,%lld] convert(w)\n"
                     "  d = %s[2,%lld,%lld] dot(xb, wb), lhs_batch_dims={0}, rhs_batch_dims={0}, "
                     "lhs_contracting_dims={2}, rhs_contracting_dims={1}\n"
                     "  df = f32[2,%lld,%lld] convert(d)  t = f32[2,%lld,%lld] tanh(df)\n"
                     "  ROOT r = (%s[2,%lld,%lld], f32[2,%lld,%lld]) tuple(d, t)\n}\n",
                     (long long)m, (long long)k, (long long)k, (long long)n, (long long)m,
                     (long long)k, (long long)k, (long long)n, rt, (long long)m, (long long)n,
                     (long long)m, (long long)n, (long long)m, (long long)n, rt, (long long)m,
                     (long long)n, (long long)m, (long long)n);
    return;
  }
  bool nk = variant == 1;
  kiln_sbuf_printf(b,
                   "  x = f32[%lld,%lld] parameter(0)  w = f32[%lld,%lld] parameter(1)\n"
                   "  xb = bf16[%lld,%lld] convert(x)  wb = bf16[%lld,%lld] convert(w)\n"
                   "  d = %s[%lld,%lld] dot(xb, wb), lhs_contracting_dims={1}, "
                   "rhs_contracting_dims={%d}\n"
                   "  df = f32[%lld,%lld] convert(d)  t = f32[%lld,%lld] tanh(df)\n"
                   "  ROOT r = (%s[%lld,%lld], f32[%lld,%lld]) tuple(d, t)\n}\n",
                   (long long)m, (long long)k, (long long)(nk ? n : k), (long long)(nk ? k : n),
                   (long long)m, (long long)k, (long long)(nk ? n : k), (long long)(nk ? k : n), rt,
                   (long long)m, (long long)n, nk ? 1 : 0, (long long)m, (long long)n, (long long)m,
                   (long long)n, rt, (long long)m, (long long)n, (long long)m, (long long)n);
}

/* Whether program p of e (or one it runs) has a GEMM step of type t. */
static bool has_gemm(const kiln_executable *e, kiln_dtype t) {
  for (uint32_t p = 0; p < e->nprograms; p++)
    for (uint32_t i = 0; i < e->programs[p].nsteps; i++) {
      const kiln_step *s = &e->programs[p].steps[i];
      if (s->kind == KILN_STEP_GEMM && s->gemm.dtype == t) return true;
    }
  return false;
}

START_TEST(test_bf16_matmul) {
  kiln_sbuf b = KILN_SBUF_INIT;
  bf16_matmul_module(&b, _i);
  /* tanh of exact sums: the f32 helper against libm in double */
  agree(kiln_sbuf_str(&b), 4 * KILN_TOL_ULP_TANH * KILN_TOL_F32_EPS, PLAIN, 2);
#ifdef KILN_HAVE_DNNL
  kiln_module *m = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(kiln_sbuf_str(&b), b.len, "t.hlo", NULL, &m, &st), 0);
  kiln_executable *e = NULL;
  ck_assert_int_eq(kiln_compile(m, NULL, &e, NULL, &st), 0);
  ck_assert_msg(has_gemm(e, KILN_BF16), "no bf16 GEMM step:\n%s", kiln_sbuf_str(&b));
  ck_assert_msg(!has_gemm(e, KILN_F32), "an f32 GEMM step too:\n%s", kiln_sbuf_str(&b));
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
#endif
  kiln_sbuf_free(&b);
}
END_TEST

/* On a CPU with avx512_bf16 a bf16 GEMM runs through oneDNN (builds with
 * oneDNN, without sanitizers); elsewhere it is widened to an f32 GEMM. */
START_TEST(test_bgemm_library) {
#if defined(KILN_HAVE_DNNL) && !defined(TEST_ASAN) && defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16")) {
    fprintf(stderr, "test_bgemm_library: skipped, the CPU has no AVX-512 BF16\n");
    return;
  }
  kiln_gemm g = {.dtype = KILN_BF16,
                 .batch = 2,
                 .m = 64,
                 .n = 32,
                 .k = 128,
                 .lda = 128,
                 .ldb = 32,
                 .ldc = 32,
                 .stride_a = 64 * 128,
                 .stride_b = 128 * 32,
                 .stride_c = 64 * 32,
                 .alpha = 1,
                 .beta = 0};
  ck_assert(kiln__cpu_bgemm_uses_library(&g));
  g.trans_a = 1;
  g.lda = 64;
  ck_assert(kiln__cpu_bgemm_uses_library(&g));
#else
  fprintf(stderr, "test_bgemm_library: skipped (no oneDNN, a sanitizer build or not x86)\n");
#endif
}
END_TEST

/* f32 -> s8, s16 and s32 conversions (computed in float lanes, kf2sf) at
 * the edges: eighths in [-2, 2] scaled by 2^30, 2^14 and 2^6 reach exactly
 * -2^31 .. 2^31 (2^31 saturates), and NaN and infinities. */
START_TEST(test_convert_f32_to_int) {
  agree("HloModule cv\nENTRY e {\n  x = f32[64] parameter(0)\n"
        "  a = f32[] constant(1073741824)  ab = f32[64] broadcast(a), dimensions={}\n"
        "  b = f32[] constant(16384)  bb = f32[64] broadcast(b), dimensions={}\n"
        "  c = f32[] constant(64.5)  cb = f32[64] broadcast(c), dimensions={}\n"
        "  xa = f32[64] multiply(x, ab)  xb = f32[64] multiply(x, bb)  xc = f32[64] multiply(x, "
        "cb)\n"
        "  i32 = s32[64] convert(xa)  i16 = s16[64] convert(xb)  i8 = s8[64] convert(xc)\n"
        "  ROOT r = (s32[64], s16[64], s8[64]) tuple(i32, i16, i8)\n}\n",
        -1, SPECIALS, 4);
}
END_TEST

START_TEST(test_threefry_loop) { agree(threefry_text, -1, EXTREME, 3); }
END_TEST

int main(void) {
  Suite *s = suite_create("cpu_ops");
  TCase *tc = tcase_create("topk");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_topk_random);
  tcase_add_test(tc, test_topk_wide);
  tcase_add_test(tc, test_topk_refused);
  suite_add_tcase(s, tc);
  tc = tcase_create("sort");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_sort_random);
  tcase_add_test(tc, test_sort_argsort);
  tcase_add_test(tc, test_sort_jax_comparator);
  tcase_add_test(tc, test_sort_refused);
  suite_add_tcase(s, tc);
  tc = tcase_create("complex");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_complex_random);
  tcase_add_test(tc, test_complex_multiply_specials);
  tcase_add_test(tc, test_complex_refused);
  suite_add_tcase(s, tc);
  tc = tcase_create("fft");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_fft_random);
  tcase_add_test(tc, test_fft_without_fftw);
  tcase_add_test(tc, test_fft_roundtrip);
  tcase_add_test(tc, test_fft_plan_uses_fftw);
  tcase_add_test(tc, test_fft_passes);
  tcase_add_test(tc, test_fft_passes_plan);
  tcase_add_test(tc, test_fft_wisdom_file);
  tcase_add_test(tc, test_fft_refused);
  tcase_add_test(tc, test_scan_random);
  tcase_add_test(tc, test_scan_wide);
  tcase_add_test(tc, test_idot_random);
  tcase_add_test(tc, test_threefry_loop);
  tcase_add_loop_test(tc, test_int8_matmul, 0, 4);
  tcase_add_test(tc, test_igemm_library);
  tcase_add_loop_test(tc, test_bf16_matmul, 0, 4);
  tcase_add_test(tc, test_bgemm_library);
  tcase_add_test(tc, test_convert_f32_to_int);
  suite_add_tcase(s, tc);
  tc = tcase_create("int8");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, test_int8_dot_random, 0, 2);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
