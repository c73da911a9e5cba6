/* The cpu backend's exact rounding, selection, total-order comparison and
 * 32-bit integer division (the vectorizable prelude forms: kfloorf ...
 * kdivs32v, emit.h), and the special functions JAX builds from them,
 * against the reference interpreter.
 *
 * floor, ceil, round-nearest-afz, round-nearest-even, is-finite, select,
 * TOTALORDER compares and integer divide/remainder are exact: the cpu
 * results must equal the interpreter's bit for bit (a NaN result only has
 * to be a NaN) over sweeps that hold every binade of both signs, the
 * halfway cases, the edges of the range where floats stop having
 * fractions (2^23, 2^52), subnormals, infinities and NaNs of both signs
 * (signalling ones too), and for division every divisor class: 0, -1 with
 * INT_MIN, constants (which GCC turns into shifts) and unknown divisors
 * (which go through double). f16 and bf16 are swept over all 65536 bit
 * patterns. The cpu backend flushes subnormal arguments to zero (as XLA
 * does), so the interpreter runs on the arguments so flushed.
 *
 * atan2 (katan2f, computed without libm) is within KILN_TOL_ULP_ATAN2 of
 * the correctly rounded value, exact at the edges; c64 divide (kc64div)
 * follows C's x / y at every pair of special parts; complex selects and
 * EQ/NE compares move and compare every pair of special parts exactly.
 *
 * tests/data/special/special_f32.hlo is jax.scipy.special's gammaln,
 * digamma, erfinv, erf, i0e and logit as JAX lowers them (export.py next
 * to it): chains of floor, sin/cos/log/log1p/exp with reflection selects.
 * Those run f32 transcendentals within a few ULP (tolerance.h), so each
 * result must be within KILN_TOL_SPECIAL_REL of the interpreter's, relative
 * to max(1, |interp|); infinities and NaNs must match exactly. The inputs
 * sweep [-8, 8] by 2^-8, [-1, 1] by 2^-10, bit patterns across every
 * binade, and the edges: 0, -0, the negative integers (the poles of
 * gammaln and digamma), +-1 (erfinv's infinities), subnormals, huge values,
 * +-inf and NaN.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "executor/run.h"
#include "tests/support/tolerance.h"

static kiln_status st;

/* ---- running a module on both backends ---------------------------------- */

typedef struct {
  kiln_module *m;
  kiln_executable *e;
} program;

static program build(const char *text) {
  program p = {0};
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &p.m, &st) == 0,
                "parse: %s: %s\n%s", st.where, st.msg, text);
  kiln_status_clear(&st);
  int rc = kiln_compile(p.m, NULL, &p.e, NULL, &st);
  ck_assert_msg(rc == 0, "compile: %s: %s: %s\n%s", kiln_err_name(rc), st.where, st.msg, text);
  return p;
}

static void drop(program *p) {
  kiln_executable_destroy(p->e);
  kiln_module_destroy(p->m);
}

static kiln_literal *param_literal(const program *p, uint32_t i) {
  const kiln_instr *in = kiln_computation_param(p->m, kiln_module_entry(p->m), i);
  kiln_literal *l = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_literal_create(NULL, &in->shape, 256u << 20, &l, &st), 0);
  return l;
}

/* The cpu backend runs with denormals flushed to zero (MXCSR FTZ and DAZ,
 * as XLA does: executor/cpu/cpu.h), so an f32 or f64 subnormal argument
 * reads as a zero of its sign, and so does a bf16 one (which reaches
 * double through f32). flushed(l) is l so flushed, for the interpreter. */
static kiln_literal *flushed(const kiln_literal *l) {
  kiln_literal *c = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_literal_create(NULL, &l->shape, 256u << 20, &c, &st), 0);
  size_t w = kiln_dtype_size(l->shape.dtype);
  int64_t n = kiln_literal_elements(l);
  memcpy(c->data, l->data, (size_t)n * w);
  for (int64_t i = 0; i < n; i++) {
    uint8_t *p = (uint8_t *)c->data + (size_t)i * w;
    if (l->shape.dtype == KILN_F32) {
      uint32_t u;
      memcpy(&u, p, 4);
      if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
      memcpy(p, &u, 4);
    } else if (l->shape.dtype == KILN_F64) {
      uint64_t u;
      memcpy(&u, p, 8);
      if ((u & UINT64_C(0x7ff0000000000000)) == 0) u &= UINT64_C(0x8000000000000000);
      memcpy(p, &u, 8);
    } else if (l->shape.dtype == KILN_BF16) {
      uint16_t u;
      memcpy(&u, p, 2);
      if ((u & 0x7f80u) == 0) u &= 0x8000u;
      memcpy(p, &u, 2);
    }
  }
  return c;
}

/* Runs p on args with the interpreter (*want; on the arguments flushed
 * when flush) and the cpu (*got). */
static void run_both(const program *p, kiln_literal **args, uint32_t n, kiln_literal **want,
                     kiln_literal **got, bool flush) {
  kiln_run_options ro = {.max_while_iterations = 1000, .timeout_seconds = 120};
  kiln_literal *ia[4] = {0};
  ck_assert_uint_le(n, 4);
  for (uint32_t i = 0; i < n; i++) ia[i] = flush ? flushed(args[i]) : args[i];
  kiln_status_clear(&st);
  int rc = kiln_run_module_with(p->m, "interp", NULL, NULL, &ro, (const kiln_literal *const *)ia, n,
                                want, &st);
  for (uint32_t i = 0; i < n && flush; i++) kiln_literal_destroy(ia[i]);
  ck_assert_msg(rc == 0, "interp: %s: %s", st.where, st.msg);
  kiln_status_clear(&st);
  rc = kiln_run_executable(p->e, NULL, &ro, (const kiln_literal *const *)args, n, got, &st);
  ck_assert_msg(rc == 0, "cpu: %s: %s", st.where, st.msg);
}

static bool is_nan_bits(kiln_dtype t, const uint8_t *p) {
  switch (t) {
  case KILN_F16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
  }
  case KILN_BF16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
  }
  case KILN_F32: {
    float f;
    memcpy(&f, p, 4);
    return f != f;
  }
  case KILN_F64: {
    double d;
    memcpy(&d, p, 8);
    return d != d;
  }
  default: return false;
  }
}

/* want and got (arrays or a tuple of them) equal bit for bit, except that
 * a NaN only has to meet a NaN; names the first difference. */
static void same_bits(const kiln_literal *want, const kiln_literal *got, const char *what,
                      const kiln_literal *arg) {
  ck_assert(kiln_shape_equal(&want->shape, &got->shape, false));
  if (want->shape.dtype == KILN_TUPLE) {
    for (uint32_t i = 0; i < want->shape.rank; i++) {
      char sub[96];
      snprintf(sub, sizeof sub, "%s{%u}", what, i);
      same_bits(want->elems[i], got->elems[i], sub, arg);
    }
    return;
  }
  kiln_dtype t = want->shape.dtype;
  size_t w = kiln_dtype_size(t);
  int64_t n = kiln_literal_elements(want);
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *a = (const uint8_t *)want->data + (size_t)i * w;
    const uint8_t *b = (const uint8_t *)got->data + (size_t)i * w;
    if (memcmp(a, b, w) == 0 || (is_nan_bits(t, a) && is_nan_bits(t, b))) continue;
    double x = arg && kiln_literal_elements(arg) == n ? kiln_literal_get_f64(arg, i) : 0;
    ck_abort_msg("%s[%lld] (argument %a): interp %a, cpu %a", what, (long long)i, x,
                 kiln_literal_get_f64(want, i), kiln_literal_get_f64(got, i));
  }
}

/* ---- sweeps ------------------------------------------------------------- */

static uint64_t rng(uint64_t *s) {
  *s = *s * 6364136223846793005u + 1442695040888963407u;
  return *s >> 29;
}

/* f32 rounding edges: halves and their neighbours, where floats stop
 * having fractions, the extremes, zeros, infinities and NaNs of both signs
 * (a signalling one too). */
static const uint32_t f32_edge_bits[] = {
    0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
    0xff800001u, 0x7fbfffffu, 0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu, 0x00800000u,
    0x7f7fffffu, 0xff7fffffu, 0x3f000000u, 0xbf000000u, 0x3effffffu, 0xbeffffffu, 0x3f000001u,
    0xbf000001u, 0x3fc00000u, 0xbfc00000u, 0x40200000u, 0xc0200000u, 0x4b000000u, 0xcb000000u,
    0x4affffffu, 0xcaffffffu, 0x4b000001u, 0xcb000001u, 0x4b800000u, 0x4a800001u, 0xca800001u,
    0x3f800000u, 0xbf800000u, 0x3f7fffffu, 0xbf7fffffu, 0x3f800001u, 0xbf800001u};

/* n f32 values: the edges, then quarters over [-1024, 1024), then bit
 * patterns spread over the whole range. */
static void f32_sweep(float *x, int64_t n) {
  int64_t k = 0;
  for (size_t i = 0; i < sizeof f32_edge_bits / sizeof *f32_edge_bits && k < n; i++)
    memcpy(&x[k++], &f32_edge_bits[i], 4);
  for (int64_t q = -4096; q < 4096 && k < n; q++) x[k++] = (float)q * 0.25f;
  uint64_t left = (uint64_t)(n - k), step = left ? (UINT64_C(1) << 32) / left : 1;
  for (uint64_t u = 0; k < n; u += step) {
    uint32_t b = (uint32_t)(u + (u >> 20));
    memcpy(&x[k++], &b, 4);
  }
}

static const char *rounding_module(const char *t, int64_t n) {
  static char text[4096];
  snprintf(text, sizeof text,
           "HloModule rounding\nENTRY main {\n"
           "  x = %s[%lld] parameter(0)\n"
           "  fl = %s[%lld] floor(x)\n"
           "  ce = %s[%lld] ceil(x)\n"
           "  ra = %s[%lld] round-nearest-afz(x)\n"
           "  re = %s[%lld] round-nearest-even(x)\n"
           "  fi = pred[%lld] is-finite(x)\n"
           "  z = %s[] constant(0)\n"
           "  zb = %s[%lld] broadcast(z), dimensions={}\n"
           "  neg = pred[%lld] compare(x, zb), direction=LT\n"
           "  sel = %s[%lld] select(neg, fl, ce)\n"
           "  ROOT r = (%s[%lld], %s[%lld], %s[%lld], %s[%lld], pred[%lld], %s[%lld]) "
           "tuple(fl, ce, ra, re, fi, sel)\n}\n",
           t, (long long)n, t, (long long)n, t, (long long)n, t, (long long)n, t, (long long)n,
           (long long)n, t, t, (long long)n, (long long)n, t, (long long)n, t, (long long)n, t,
           (long long)n, t, (long long)n, t, (long long)n, (long long)n, t, (long long)n);
  return text;
}

/* ---- exact ops ---------------------------------------------------------- */

START_TEST(rounding_f32_exact) {
  enum { N = 1 << 16 };
  program p = build(rounding_module("f32", N));
  kiln_literal *x = param_literal(&p, 0), *want = NULL, *got = NULL;
  f32_sweep(x->data, N);
  run_both(&p, &x, 1, &want, &got, true);
  same_bits(want, got, "f32 rounding", x);
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  kiln_literal_destroy(x);
  drop(&p);
}
END_TEST

/* f64: the f32 sweep widened, and doubles at the 2^52 edge and random bit
 * patterns. */
START_TEST(rounding_f64_exact) {
  enum { N = 1 << 15 };
  program p = build(rounding_module("f64", N));
  kiln_literal *x = param_literal(&p, 0), *want = NULL, *got = NULL;
  float *f = kiln_malloc(N * sizeof *f);
  ck_assert_ptr_nonnull(f);
  f32_sweep(f, N);
  double *d = x->data;
  uint64_t s = 7;
  for (int64_t i = 0; i < N; i++) d[i] = f[i];
  static const double edges[] = {0x1p52,
                                 -0x1p52,
                                 0x1p52 - 0.5,
                                 -0x1p52 + 0.5,
                                 0x1p52 + 1,
                                 0x1p51 + 0.5,
                                 -0x1p51 - 0.5,
                                 0x1p53,
                                 DBL_MAX,
                                 -DBL_MAX,
                                 0x1p-1074,
                                 -0x1p-1074,
                                 0.49999999999999994,
                                 -0.49999999999999994};
  for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) d[i] = edges[i];
  for (int64_t i = N / 2; i < N; i++) {
    uint64_t b = rng(&s) << 32 ^ rng(&s);
    memcpy(&d[i], &b, 8);
  }
  run_both(&p, &x, 1, &want, &got, true);
  same_bits(want, got, "f64 rounding", x);
  kiln_free(f);
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  kiln_literal_destroy(x);
  drop(&p);
}
END_TEST

/* f16 and bf16 (values held in double): every bit pattern. */
START_TEST(rounding_half_exact) {
  const char *types[] = {"f16", "bf16"};
  for (int t = 0; t < 2; t++) {
    program p = build(rounding_module(types[t], 65536));
    kiln_literal *x = param_literal(&p, 0), *want = NULL, *got = NULL;
    uint16_t *h = x->data;
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    run_both(&p, &x, 1, &want, &got, true);
    same_bits(want, got, types[t], x);
    kiln_literal_destroy(want);
    kiln_literal_destroy(got);
    kiln_literal_destroy(x);
    drop(&p);
  }
}
END_TEST

/* Selects move bits (NaN payloads, the sign of zero), and TOTALORDER
 * compares order -NaN < -inf < -0 < +0 < +inf < NaN, signalling NaNs as
 * the interpreter orders them: every pair of the f32 edges, in every
 * direction. */
START_TEST(select_and_total_order) {
  enum { E = sizeof f32_edge_bits / sizeof *f32_edge_bits, N = E * E };
  static const char *dirs[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b,
                   "HloModule order\nENTRY main {\n  x = f32[%d] parameter(0)\n"
                   "  y = f32[%d] parameter(1)\n",
                   N, N);
  for (int d = 0; d < 6; d++) {
    kiln_sbuf_printf(&b, "  c%d = pred[%d] compare(x, y), direction=%s, type=TOTALORDER\n", d, N,
                     dirs[d]);
    kiln_sbuf_printf(&b, "  s%d = f32[%d] select(c%d, x, y)\n", d, N, d);
  }
  kiln_sbuf_printf(&b,
                   "  ROOT r = (pred[%d], pred[%d], pred[%d], pred[%d], pred[%d], pred[%d], "
                   "f32[%d], f32[%d], f32[%d], f32[%d], f32[%d], f32[%d]) "
                   "tuple(c0, c1, c2, c3, c4, c5, s0, s1, s2, s3, s4, s5)\n}\n",
                   N, N, N, N, N, N, N, N, N, N, N, N);
  program p = build(kiln_sbuf_str(&b));
  kiln_literal *args[2] = {param_literal(&p, 0), param_literal(&p, 1)}, *want = NULL, *got = NULL;
  uint32_t *x = args[0]->data, *y = args[1]->data;
  for (int i = 0; i < E; i++)
    for (int j = 0; j < E; j++) {
      x[i * E + j] = f32_edge_bits[i];
      y[i * E + j] = f32_edge_bits[j];
    }
  run_both(&p, args, 2, &want, &got, false);
  same_bits(want, got, "total order", NULL);
  /* and a select moves bits: each result is one of its operands exactly,
   * a signalling NaN's payload and the sign of a zero included (the
   * interpreter, in double, quiets signalling NaNs) */
  for (uint32_t o = 6; o < 12; o++) {
    const uint32_t *r = got->elems[o]->data;
    const uint8_t *c = got->elems[o - 6]->data;
    for (int i = 0; i < N; i++)
      ck_assert_msg(r[i] == (c[i] ? x[i] : y[i]), "select %u [%d]: %08x of %08x, %08x", o - 6, i,
                    r[i], x[i], y[i]);
  }
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  kiln_literal_destroy(args[0]);
  kiln_literal_destroy(args[1]);
  drop(&p);
  kiln_sbuf_free(&b);
}
END_TEST

/* Integer divide and remainder of 32 bits and narrower: unknown divisors
 * (through double), constant ones (2, 7, -1, 0), and the edges 0, -1,
 * INT_MIN, INT_MAX, UINT_MAX in both operands. */
START_TEST(int_division_32) {
  enum { N = 1 << 15 };
  static const char *types[] = {"s32", "u32", "s16", "u8", "s8"};
  static const char *consts[] = {"2", "7", "-1", "0"};
  for (int t = 0; t < 5; t++) {
    bool uns = types[t][0] == 'u';
    kiln_sbuf b = KILN_SBUF_INIT, tup = KILN_SBUF_INIT, names = KILN_SBUF_INIT;
    const char *T = types[t];
    kiln_sbuf_printf(&b,
                     "HloModule idiv\nENTRY main {\n  a = %s[%d] parameter(0)\n"
                     "  b = %s[%d] parameter(1)\n  q = %s[%d] divide(a, b)\n"
                     "  r = %s[%d] remainder(a, b)\n",
                     T, N, T, N, T, N, T, N);
    kiln_sbuf_printf(&tup, "%s[%d], %s[%d]", T, N, T, N);
    kiln_sbuf_puts(&names, "q, r");
    for (int c = 0; c < 4; c++) {
      if (uns && consts[c][0] == '-') continue;
      kiln_sbuf_printf(&b,
                       "  k%d = %s[] constant(%s)\n  kb%d = %s[%d] broadcast(k%d), dimensions={}\n"
                       "  q%d = %s[%d] divide(a, kb%d)\n  r%d = %s[%d] remainder(a, kb%d)\n",
                       c, T, consts[c], c, T, N, c, c, T, N, c, c, T, N, c);
      kiln_sbuf_printf(&tup, ", %s[%d], %s[%d]", T, N, T, N);
      kiln_sbuf_printf(&names, ", q%d, r%d", c, c);
    }
    kiln_sbuf_printf(&b, "  ROOT t = (%s) tuple(%s)\n}\n", kiln_sbuf_str(&tup),
                     kiln_sbuf_str(&names));
    program p = build(kiln_sbuf_str(&b));
    kiln_literal *args[2] = {param_literal(&p, 0), param_literal(&p, 1)}, *want = NULL, *got = NULL;
    static const int64_t edges[] = {0,    1,   -1,  2,      -2,    7,     INT32_MIN, INT32_MAX,
                                    -128, 127, 255, -32768, 32767, 65535, 3,         -3};
    uint64_t s = 11 + (uint64_t)t;
    for (int i = 0; i < N; i++) {
      for (int k = 0; k < 2; k++) {
        uint64_t r = rng(&s);
        int64_t v = (int64_t)(int32_t)(uint32_t)(r >> 3);
        if (r % 4 == 0) v = edges[(r >> 40) % (sizeof edges / sizeof *edges)];
        if (r % 4 == 1) v %= 1000;
        if (uns)
          kiln_literal_set_u64(args[k], i, (uint64_t)v);
        else
          kiln_literal_set_s64(args[k], i, v);
      }
    }
    run_both(&p, args, 2, &want, &got, false);
    same_bits(want, got, T, NULL);
    kiln_literal_destroy(want);
    kiln_literal_destroy(got);
    kiln_literal_destroy(args[0]);
    kiln_literal_destroy(args[1]);
    drop(&p);
    kiln_sbuf_free(&b);
    kiln_sbuf_free(&tup);
    kiln_sbuf_free(&names);
  }
}
END_TEST

/* atan2 (katan2f) over every pair of a set of f32 values (the edges, then
 * bit patterns across every binade of both signs) against libm's atan2 in
 * double rounded once: within KILN_TOL_ULP_ATAN2, and exactly C99's value
 * at zeros, infinities and NaNs. Subnormal arguments read as zeros of
 * their sign and subnormal results flush to zero (FTZ/DAZ, as XLA). */
static float flush_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  memcpy(&f, &u, 4);
  return f;
}

START_TEST(atan2_ulp_bound) {
  enum { V = 320, N = V * V };
  float vals[V];
  int k = 0;
  for (size_t i = 0; i < sizeof f32_edge_bits / sizeof *f32_edge_bits; i++)
    memcpy(&vals[k++], &f32_edge_bits[i], 4);
  for (uint64_t u = 0; k < V; u += (UINT64_C(1) << 32) / 279) {
    uint32_t b = (uint32_t)(u + 12345u);
    memcpy(&vals[k++], &b, 4);
  }
  char text[512];
  snprintf(text, sizeof text,
           "HloModule at\nENTRY main {\n  y = f32[%d] parameter(0)\n  x = f32[%d] parameter(1)\n"
           "  ROOT r = f32[%d] atan2(y, x)\n}\n",
           N, N, N);
  program p = build(text);
  kiln_literal *args[2] = {param_literal(&p, 0), param_literal(&p, 1)}, *got = NULL;
  float *y = args[0]->data, *x = args[1]->data;
  for (int i = 0; i < V; i++)
    for (int j = 0; j < V; j++) {
      y[i * V + j] = vals[i];
      x[i * V + j] = vals[j];
    }
  kiln_run_options ro = {.timeout_seconds = 120};
  kiln_status_clear(&st);
  ck_assert_int_eq(
      kiln_run_executable(p.e, NULL, &ro, (const kiln_literal *const *)args, 2, &got, &st), 0);
  const float *r = got->data;
  uint32_t worst = 0;
  int at = 0;
  for (int i = 0; i < N; i++) {
    float yf = flush_f32(y[i]), xf = flush_f32(x[i]);
    float want = flush_f32((float)atan2((double)yf, (double)xf));
    bool special = yf == 0 || xf == 0 || isinf(yf) || isinf(xf) || isnan(yf) || isnan(xf);
    uint32_t d = kiln_tol_ulp_f32(r[i], want);
    if (special || isnan(want))
      ck_assert_msg(d == 0, "atan2(%a, %a): cpu %a, want %a", (double)y[i], (double)x[i],
                    (double)r[i], (double)want);
    if (d > worst) {
      worst = d;
      at = i;
    }
  }
  fprintf(stderr, "test_cpu_special: atan2: worst %u ULP at (%a, %a)\n", worst, (double)y[at],
          (double)x[at]);
  ck_assert_msg(worst <= KILN_TOL_ULP_ATAN2, "atan2(%a, %a): %u ULP (bound %d)", (double)y[at],
                (double)x[at], worst, KILN_TOL_ULP_ATAN2);
  kiln_literal_destroy(got);
  kiln_literal_destroy(args[0]);
  kiln_literal_destroy(args[1]);
  drop(&p);
}
END_TEST

/* c64 divide (kc64div: the textbook quotient in double and Annex G's
 * recovery through integer masks) on every pair of special parts, against
 * C's x / y (libgcc's __divdc3, Smith's method) as the interpreter computes
 * it: NaN parts where it has NaN parts, its infinities exactly, finite
 * parts within KILN_TOL_C64_REL of the larger part (the two formulas round
 * differently; the sign of a zero part may differ). */
START_TEST(c64_divide_specials) {
  static const double v[] = {0.0, -0.0, 1.0, -2.5, 3e38, 1e-30, INFINITY, -INFINITY, NAN};
  enum { NV = sizeof v / sizeof *v, N = NV * NV * NV * NV };
  char text[200];
  snprintf(text, sizeof text,
           "HloModule t\nENTRY e {\n  a = c64[%d] parameter(0)\n  b = c64[%d] parameter(1)\n"
           "  ROOT q = c64[%d] divide(a, b)\n}\n",
           N, N, N);
  program p = build(text);
  kiln_literal *args[2] = {param_literal(&p, 0), param_literal(&p, 1)}, *want = NULL, *got = NULL;
  for (int i = 0; i < N; i++) {
    kiln_literal_set_c128(args[0], i, v[i % NV], v[i / NV % NV]);
    kiln_literal_set_c128(args[1], i, v[i / (NV * NV) % NV], v[i / (NV * NV * NV)]);
  }
  run_both(&p, args, 2, &want, &got, false);
  for (int i = 0; i < N; i++) {
    double w[2], g[2];
    kiln_literal_get_c128(want, i, &w[0], &w[1]);
    kiln_literal_get_c128(got, i, &g[0], &g[1]);
    double scale = 1.0;
    for (int k = 0; k < 2; k++)
      if (isfinite(w[k])) scale = fmax(scale, fabs(w[k]));
    for (int k = 0; k < 2; k++) {
      bool ok = isnan(w[k])   ? isnan(g[k])
                : isinf(w[k]) ? g[k] == w[k]
                              : isfinite(g[k]) && fabs(g[k] - w[k]) <= KILN_TOL_C64_REL * scale;
      ck_assert_msg(ok, "(%g%+gi) / (%g%+gi): interp %g%+gi, cpu %g%+gi", v[i % NV], v[i / NV % NV],
                    v[i / (NV * NV) % NV], v[i / (NV * NV * NV)], w[0], w[1], g[0], g[1]);
    }
  }
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  kiln_literal_destroy(args[0]);
  kiln_literal_destroy(args[1]);
  drop(&p);
}
END_TEST

/* Complex selects move whole values part by part (kcsel, on integer masks,
 * so that the loop vectorizes), chosen by EQ and NE compares of complex
 * values: every pair of c64 values whose parts are zeros of both signs,
 * finite values, infinities and a NaN with a payload. The compares must be
 * the interpreter's (and C's: both parts equal), each selected value one
 * of its operands bit for bit (the sign of a zero, the NaN's payload), in
 * c64 and, converted, in c128. */
START_TEST(complex_select_and_compare) {
  static const uint32_t parts[] = {0x00000000u, 0x80000000u, 0x3f800000u, 0xc0200000u,
                                   0x7f800000u, 0xff800000u, 0x7fc01234u};
  enum { NP = sizeof parts / sizeof *parts, N = NP * NP * NP * NP };
  char text[640];
  snprintf(
      text, sizeof text,
      "HloModule t\nENTRY e {\n  x = c64[%d] parameter(0)\n  y = c64[%d] parameter(1)\n"
      "  eq = pred[%d] compare(x, y), direction=EQ\n"
      "  ne = pred[%d] compare(x, y), direction=NE\n"
      "  s = c64[%d] select(eq, x, y)\n  t = c64[%d] select(ne, y, x)\n"
      "  xd = c128[%d] convert(x)\n  yd = c128[%d] convert(y)\n"
      "  u = c128[%d] select(eq, yd, xd)\n"
      "  ROOT r = (pred[%d], pred[%d], c64[%d], c64[%d], c128[%d]) tuple(eq, ne, s, t, u)\n}\n",
      N, N, N, N, N, N, N, N, N, N, N, N, N, N);
  program p = build(text);
  kiln_literal *args[2] = {param_literal(&p, 0), param_literal(&p, 1)}, *want = NULL, *got = NULL;
  uint32_t *x = args[0]->data, *y = args[1]->data; /* re, im, re, im, ... */
  for (int i = 0; i < N; i++) {
    x[2 * i] = parts[i % NP];
    x[2 * i + 1] = parts[i / NP % NP];
    y[2 * i] = parts[i / (NP * NP) % NP];
    y[2 * i + 1] = parts[i / (NP * NP * NP)];
  }
  run_both(&p, args, 2, &want, &got, false);
  same_bits(want->elems[0], got->elems[0], "complex EQ", NULL);
  same_bits(want->elems[1], got->elems[1], "complex NE", NULL);
  const uint8_t *eq = got->elems[0]->data, *ne = got->elems[1]->data;
  const uint32_t *s = got->elems[2]->data, *t = got->elems[3]->data;
  const double *u = got->elems[4]->data;
  for (int i = 0; i < N; i++) {
    float xr, xi, yr, yi;
    memcpy(&xr, &x[2 * i], 4);
    memcpy(&xi, &x[2 * i + 1], 4);
    memcpy(&yr, &y[2 * i], 4);
    memcpy(&yi, &y[2 * i + 1], 4);
    bool e = xr == yr && xi == yi;
    ck_assert_msg(eq[i] == e && ne[i] == !e, "(%g%+gi) vs (%g%+gi): EQ %d, NE %d", xr, xi, yr, yi,
                  eq[i], ne[i]);
    const uint32_t *se = e ? &x[2 * i] : &y[2 * i], *te = e ? &x[2 * i] : &y[2 * i];
    ck_assert_msg(s[2 * i] == se[0] && s[2 * i + 1] == se[1] && t[2 * i] == te[0] &&
                      t[2 * i + 1] == te[1],
                  "select [%d]: %08x %08x and %08x %08x, want %08x %08x", i, s[2 * i], s[2 * i + 1],
                  t[2 * i], t[2 * i + 1], se[0], se[1]);
    float ur = e ? yr : xr, ui = e ? yi : xi;
    bool ok = isnan(ur) ? isnan(u[2 * i]) : u[2 * i] == ur && !signbit(u[2 * i]) == !signbit(ur);
    ok = ok && (isnan(ui) ? isnan(u[2 * i + 1])
                          : u[2 * i + 1] == ui && !signbit(u[2 * i + 1]) == !signbit(ui));
    ck_assert_msg(ok, "c128 select [%d]: %a%+ai, want %a%+ai", i, u[2 * i], u[2 * i + 1],
                  (double)ur, (double)ui);
  }
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  kiln_literal_destroy(args[0]);
  kiln_literal_destroy(args[1]);
  drop(&p);
}
END_TEST

/* ---- JAX's special functions -------------------------------------------- */

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
  long n = ftell(f);
  ck_assert_int_ge(n, 0);
  rewind(f);
  char *s = kiln_malloc((size_t)n + 1);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(fread(s, 1, (size_t)n, f), (size_t)n);
  s[n] = 0;
  fclose(f);
  return s;
}

START_TEST(jax_special_functions) {
  static const char *names[] = {"gammaln", "digamma", "erfinv", "erf", "i0e", "logit"};
  enum { N = 8192 };
  char *text = read_text(KILN_SOURCE_DIR "/tests/data/special/special_f32.hlo");
  program p = build(text);
  kiln_literal *x = param_literal(&p, 0), *want = NULL, *got = NULL;
  float *v = x->data;
  int64_t k = 0;
  static const float edges[] = {
      0.0f,   -0.0f, INFINITY,   -INFINITY,   NAN,        -NAN,       1.0f,    -1.0f,    2.0f,
      0.5f,   -0.5f, 0x1p-149f,  -0x1p-149f,  0x1p-126f,  -0x1p-126f, FLT_MAX, -FLT_MAX, 1e30f,
      -1e30f, 1e10f, 0.9999999f, -0.9999999f, 1.4616321f, 1e-20f,     -1e-20f};
  for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) v[k++] = edges[i];
  for (int i = 1; i <= 40; i++) v[k++] = (float)-i; /* the poles */
  for (int i = -2048; i < 2048; i++) v[k++] = (float)i * 0x1p-8f;
  for (int i = -1024; i < 1024; i++) v[k++] = (float)i * 0x1p-10f;
  int64_t left = N - k;
  for (int64_t i = 0; k < N; i++) {
    uint32_t b = (uint32_t)(((uint64_t)i << 32) / (uint64_t)left);
    memcpy(&v[k++], &b, 4);
  }
  run_both(&p, &x, 1, &want, &got, true);
  for (uint32_t o = 0; o < 6; o++) {
    const kiln_literal *w = want->elems[o], *g = got->elems[o];
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < N; i++) {
      double a = kiln_literal_get_f64(w, i), b = kiln_literal_get_f64(g, i);
      if (isnan(a) || isnan(b) || isinf(a) || isinf(b)) {
        ck_assert_msg((isnan(a) && isnan(b)) || a == b, "%s(%a): interp %a, cpu %a", names[o],
                      (double)v[i], a, b);
        continue;
      }
      double e = fabs(a - b) / fmax(1.0, fabs(a));
      if (e > worst) {
        worst = e;
        at = i;
      }
    }
    fprintf(stderr, "test_cpu_special: %s: worst %.3g relative at %a\n", names[o], worst,
            (double)v[at]);
    ck_assert_msg(worst <= KILN_TOL_SPECIAL_REL,
                  "%s(%a): interp %a, cpu %a: %g relative (bound %g)", names[o], (double)v[at],
                  kiln_literal_get_f64(w, at), kiln_literal_get_f64(g, at), worst,
                  KILN_TOL_SPECIAL_REL);
  }
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  kiln_literal_destroy(x);
  drop(&p);
  kiln_free(text);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cpu_special");
  TCase *tc = tcase_create("exact");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, rounding_f32_exact);
  tcase_add_test(tc, rounding_f64_exact);
  tcase_add_test(tc, rounding_half_exact);
  tcase_add_test(tc, select_and_total_order);
  tcase_add_test(tc, int_division_32);
  suite_add_tcase(s, tc);
  tc = tcase_create("special");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, atan2_ulp_bound);
  tcase_add_test(tc, c64_divide_specials);
  tcase_add_test(tc, complex_select_and_compare);
  tcase_add_test(tc, jax_special_functions);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
