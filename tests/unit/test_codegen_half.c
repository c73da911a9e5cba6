/* Differential tests of f16 and bf16 elementwise code on the cpu backend
 * against the reference interpreter.
 *
 * The backend holds f16/bf16 values in f32 and rounds every op's f32 result
 * to nearest even back to the narrow type (emit.h, prelude_half.h); the
 * interpreter computes in double and rounds once. So add, subtract,
 * multiply, divide, sqrt, conversions, comparisons and the exact ops must
 * agree bit for bit, and the transcendentals computed with the f32 helpers
 * within tests/support/tolerance.h's KILN_TOL_ULP_HALF_<OP> units of the
 * narrow type (and rarely off at all). Inputs: every one of the 65536 bit
 * patterns for unary ops (NaNs, infinities, subnormals and the largest
 * finite values included); for binary ops random bit patterns plus pairs
 * built to land exactly on rounding ties (sums a half unit off, products
 * one bit too long), on overflow to infinity and on subnormal results;
 * chains of ops whose result changes if any intermediate keeps more
 * precision than its type; conversions from f32 and f64 at and around
 * every narrow midpoint (a double rounded through f32 first would land on
 * the wrong side); and reductions with an f16 reducer. Each program runs
 * at opt level 0 (one kernel per op) and 2 (the chain fused in one loop).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fp16.h"
#include "common/sbuf.h"
#include "test_codegen_harness.h"
#include "tests/support/tolerance.h"

typedef struct fmt {
  const char *name; /* HLO spelling */
  kiln_dtype t;
  bool bf;          /* bf16 */
  int mb;           /* explicit mantissa bits */
  uint16_t maxfin;  /* largest finite pattern */
  uint16_t minnorm; /* smallest normal pattern */
} fmt;

static const fmt fmts[] = {
    {"f16", KILN_F16, false, 10, 0x7bffu, 0x0400u},
    {"bf16", KILN_BF16, true, 7, 0x7f7fu, 0x0080u},
};

static double h_val(const fmt *f, uint16_t v) {
  return f->bf ? kiln_bf16_to_f64(v) : kiln_f16_to_f64(v);
}

/* The nearest pattern of format f to x (the interpreter's rounding). */
static uint16_t h_bits(const fmt *f, double x) {
  return f->bf ? kiln_f64_to_bf16(x) : kiln_f64_to_f16(x);
}

static kiln_literal *new_param(const kiln_module *m, uint32_t i) {
  kiln_literal *l = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_literal_create(NULL,
                                       &kiln_computation_param(m, kiln_module_entry(m), i)->shape,
                                       0, &l, &st),
                   0);
  return l;
}

/* One result leaf's expectations: its tolerance in narrow units (narrow
 * leaves) and the largest count of elements allowed off at all. */
typedef struct leaf_tol {
  uint32_t ulps;
  int64_t max_off;
} leaf_tol;

/* Compares leaf k of got and want element by element: narrow floats
 * within tol (NaN matching NaN, any sign; otherwise the same bits when
 * tol is 0), other types bit for bit. */
static void check_leaf(const kiln_literal *got, const kiln_literal *want, uint32_t k, leaf_tol tol,
                       const char *what) {
  kiln_dtype t = want->shape.dtype;
  ck_assert_int_eq(got->shape.dtype, t);
  int64_t n = kiln_literal_elements(want), off = 0;
  size_t es = kiln_dtype_size(t);
  for (int64_t i = 0; i < n; i++) {
    if (t == KILN_F16 || t == KILN_BF16) {
      uint16_t g, w;
      memcpy(&g, (const uint8_t *)got->data + i * 2, 2);
      memcpy(&w, (const uint8_t *)want->data + i * 2, 2);
      uint32_t d = kiln_tol_ulp_16(g, w, t == KILN_BF16);
      ck_assert_msg(d <= tol.ulps, "%s, result %u element %lld: %04x, the interpreter %04x", what,
                    k, (long long)i, g, w);
      off += d != 0;
    } else if (t == KILN_F32 || t == KILN_F64) {
      double g = kiln_literal_get_f64(got, i), w = kiln_literal_get_f64(want, i);
      bool same = isnan(w) ? isnan(g)
                           : memcmp((const uint8_t *)got->data + i * es,
                                    (const uint8_t *)want->data + i * es, es) == 0;
      ck_assert_msg(same, "%s, result %u element %lld: %a, the interpreter %a", what, k,
                    (long long)i, g, w);
    } else {
      ck_assert_msg(memcmp((const uint8_t *)got->data + i * es,
                           (const uint8_t *)want->data + i * es, es) == 0,
                    "%s, result %u element %lld: %llu, the interpreter %llu", what, k, (long long)i,
                    (unsigned long long)kiln_literal_get_u64(got, i),
                    (unsigned long long)kiln_literal_get_u64(want, i));
    }
  }
  ck_assert_msg(off <= tol.max_off,
                "%s, result %u: %lld of %lld elements off by a unit (at most %lld)", what, k,
                (long long)off, (long long)n, (long long)tol.max_off);
}

/* Compiles hlo at opt level 0 and 2, runs it on args with the harness and
 * the interpreter, and checks every result leaf against tols[]. */
static void run_both(const char *hlo, kiln_literal *const *args, uint32_t nargs,
                     const leaf_tol *tols, uint32_t nleaves, const char *what) {
  kiln_module *m = cg_parse(hlo);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_literal *want = NULL;
  ck_assert_msg(kiln_interp_run(m, (const kiln_literal *const *)args, nargs, NULL, &want, &st) == 0,
                "interp: %s: %s", st.where, st.msg);
  for (int opt = 0; opt <= 2; opt += 2) {
    kiln_executable *e = cg_compile(m, opt);
    kiln_literal *got = NULL;
    cg_execute(e, args, &got);
    const kiln_literal *gl[64], *wl[64];
    uint32_t ng = cg_leaves(got, gl, 0), nw = cg_leaves(want, wl, 0);
    ck_assert_uint_eq(ng, nw);
    ck_assert_uint_eq(nw, nleaves);
    char w[96];
    snprintf(w, sizeof w, "%s at opt level %d", what, opt);
    for (uint32_t k = 0; k < nw; k++) check_leaf(gl[k], wl[k], k, tols[k], w);
    kiln_literal_destroy(got);
    kiln_executable_destroy(e);
  }
  kiln_literal_destroy(want);
  kiln_module_destroy(m);
}

/* ---- unary ops over every bit pattern ----------------------------------- */

typedef struct unop {
  const char *hlo;  /* "%s" for the operand */
  const char *type; /* result type, NULL: the operand's */
  uint32_t ulps;
} unop;

START_TEST(unary_every_value) {
  const fmt *f = &fmts[_i];
  const char *other = f->bf ? "f16" : "bf16";
  const unop ops[] = {
      {"abs(a)", NULL, 0},
      {"negate(a)", NULL, 0},
      {"sign(a)", NULL, 0},
      {"ceil(a)", NULL, 0},
      {"floor(a)", NULL, 0},
      {"round-nearest-afz(a)", NULL, 0},
      {"round-nearest-even(a)", NULL, 0},
      {"sqrt(a)", NULL, 0},
      {"cbrt(a)", NULL, 0},
      {"copy(a)", NULL, 0},
      {"is-finite(a)", "pred", 0},
      {"convert(a)", "f32", 0},
      {"convert(a)", "f64", 0},
      {"convert(a)", other, 0},
      {"convert(a)", "s32", 0},
      {"convert(a)", "s8", 0},
      {"convert(a)", "u16", 0},
      {"bitcast-convert(n)", "u16", 0}, /* n = negate(a): a computed value's bits */
      {"reduce-precision(a), exponent_bits=5, mantissa_bits=2", NULL, 0},
      {"reduce-precision(a), exponent_bits=4, mantissa_bits=3", NULL, 0},
      {"exponential(a)", NULL, KILN_TOL_ULP_HALF_EXP},
      {"exponential-minus-one(a)", NULL, KILN_TOL_ULP_HALF_EXPM1},
      {"log(a)", NULL, KILN_TOL_ULP_HALF_LOG},
      {"log-plus-one(a)", NULL, KILN_TOL_ULP_HALF_LOG1P},
      {"logistic(a)", NULL, KILN_TOL_ULP_HALF_LOGISTIC},
      {"tanh(a)", NULL, KILN_TOL_ULP_HALF_TANH},
      {"erf(a)", NULL, KILN_TOL_ULP_HALF_ERF},
      {"sine(a)", NULL, KILN_TOL_ULP_HALF_SIN},
      {"cosine(a)", NULL, KILN_TOL_ULP_HALF_COS},
      {"tan(a)", NULL, KILN_TOL_ULP_HALF_TAN},
      {"rsqrt(a)", NULL, KILN_TOL_ULP_HALF_RSQRT},
  };
  enum { NOPS = sizeof ops / sizeof ops[0] };
  kiln_sbuf b = KILN_SBUF_INIT, shapes = KILN_SBUF_INIT, names = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b, "HloModule un\nENTRY main {\n  a = %s[65536] parameter(0)\n", f->name);
  kiln_sbuf_printf(&b, "  n = %s[65536] negate(a)\n", f->name);
  leaf_tol tols[NOPS];
  for (int i = 0; i < NOPS; i++) {
    const char *t = ops[i].type ? ops[i].type : f->name;
    kiln_sbuf_printf(&b, "  r%d = %s[65536] %s\n", i, t, ops[i].hlo);
    kiln_sbuf_printf(&shapes, "%s%s[65536]", i ? ", " : "", t);
    kiln_sbuf_printf(&names, "%sr%d", i ? ", " : "", i);
    /* A rounding boundary within a few f32 ULPs of the exact value: far
     * fewer than 1 in 256 of the values. */
    tols[i] = (leaf_tol){ops[i].ulps, ops[i].ulps ? 256 : 0};
  }
  kiln_sbuf_printf(&b, "  ROOT t = (%s) tuple(%s)\n}\n", kiln_sbuf_str(&shapes),
                   kiln_sbuf_str(&names));
  kiln_module *m = cg_parse(kiln_sbuf_str(&b));
  kiln_literal *a = new_param(m, 0);
  for (uint32_t v = 0; v < 65536; v++) {
    uint16_t h = (uint16_t)v;
    memcpy((uint8_t *)a->data + v * 2, &h, 2);
  }
  kiln_module_destroy(m);
  run_both(kiln_sbuf_str(&b), &a, 1, tols, NOPS, f->name);
  kiln_literal_destroy(a);
  kiln_sbuf_free(&b);
  kiln_sbuf_free(&shapes);
  kiln_sbuf_free(&names);
}
END_TEST

/* ---- binary ops, ties, overflow, chains --------------------------------- */

static uint64_t rng(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 17;
}

/* A random finite normal pattern of f with a biased exponent in
 * [emin, emax], either sign. */
static uint16_t rand_normal(const fmt *f, uint64_t *s, int emin, int emax) {
  int e = emin + (int)(rng(s) % (uint64_t)(emax - emin + 1));
  uint16_t m = (uint16_t)(rng(s) & ((1u << f->mb) - 1));
  uint16_t sign = (rng(s) & 1) ? 0x8000u : 0;
  return (uint16_t)(sign | (uint16_t)(e << f->mb) | m);
}

/* Fills pairs (x[i], y[i]) for i < n: random patterns, then cases built to
 * hit ties (sums of a value and an odd multiple of its half unit; products
 * of an odd P-bit significand and 3), overflow and subnormal results. */
static void binary_inputs(const fmt *f, uint16_t *x, uint16_t *y, int64_t n) {
  uint64_t s = 0x5eedu + (uint64_t)f->bf;
  int emax = f->bf ? 254 : 30;
  double big = h_val(f, f->maxfin);
  double unit = ldexp(1.0, -f->mb); /* a unit at 1 */
  for (int64_t i = 0; i < n; i++) {
    int kind = (int)(i % 8);
    if (i < n / 4 || kind == 0) { /* any patterns: NaNs, infinities, subnormals */
      x[i] = (uint16_t)rng(&s);
      y[i] = (uint16_t)rng(&s);
    } else if (kind == 1 || kind == 2) { /* x +- an odd multiple of half x's unit */
      x[i] = rand_normal(f, &s, 2, emax - 1);
      int ex;
      frexp(fabs(h_val(f, x[i])), &ex);
      double half = ldexp(1.0, ex - 1 - f->mb - 1);
      double k = (double)(2 * (int)(rng(&s) % 3) + 1);
      y[i] = h_bits(f, (rng(&s) & 1 ? -1 : 1) * k * half);
      if (h_val(f, y[i]) == 0) y[i] = 1; /* below the subnormals: the smallest */
    } else if (kind == 3) {              /* (2^P-1 + odd) * 3: a product one bit too long */
      int P = f->mb + 1;
      double m1 = ldexp(1.0, P - 1) + (double)(2 * (rng(&s) % (1u << (P - 2))) + 1);
      int e1 = (int)(rng(&s) % 12) - 6, e2 = (int)(rng(&s) % 12) - 6;
      x[i] = h_bits(f, ldexp(m1, e1 - P + 1));
      y[i] = h_bits(f, ldexp(3.0, e2) * ((rng(&s) & 1) ? -1 : 1));
    } else if (kind == 4) { /* near the largest finite value: ties into infinity */
      x[i] = (uint16_t)(f->maxfin - (rng(&s) % 4));
      double ulp = big * unit / (2 - unit);
      y[i] = h_bits(f, ulp * (double)(rng(&s) % 4) / 2.0);
      if (rng(&s) & 1) x[i] ^= 0x8000u, y[i] ^= 0x8000u;
    } else if (kind == 5) { /* products and quotients into the subnormals */
      x[i] = (uint16_t)(rng(&s) % (uint64_t)(f->minnorm * 4));
      y[i] = h_bits(f, ldexp(1.0, -(int)(rng(&s) % 4)) * (1 + (double)(rng(&s) % 4) * unit));
    } else if (kind == 6) { /* close values: cancellation */
      x[i] = rand_normal(f, &s, 1, emax);
      y[i] = (uint16_t)(x[i] + (uint16_t)(rng(&s) % 5) - 2);
    } else { /* moderate values */
      x[i] = rand_normal(f, &s, emax / 2 - 4, emax / 2 + 4);
      y[i] = rand_normal(f, &s, emax / 2 - 4, emax / 2 + 4);
    }
  }
}

START_TEST(binary_ties_overflow_chains) {
  const fmt *f = &fmts[_i];
  enum { NB = 16384 };
  const char *t = f->name;
  static const char *const bin[] = {"add",     "subtract", "multiply", "divide", "remainder",
                                    "maximum", "minimum",  "atan2",    "power"};
  enum { NBIN = sizeof bin / sizeof bin[0] };
  static const char *const dirs[] = {"EQ", "NE", "GE", "GT", "LE", "LT"};
  kiln_sbuf b = KILN_SBUF_INIT, shapes = KILN_SBUF_INIT, names = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b,
                   "HloModule bin\nENTRY main {\n  a = %s[%d] parameter(0)\n"
                   "  b = %s[%d] parameter(1)\n  p = pred[%d] parameter(2)\n",
                   t, NB, t, NB, NB);
  int k = 0;
#define OUT(ty) \
  do { \
    kiln_sbuf_printf(&shapes, "%s%s[%d]", k ? ", " : "", ty, NB); \
    kiln_sbuf_printf(&names, "%sr%d", k ? ", " : "", k); \
    k++; \
  } while (0)
  for (int i = 0; i < NBIN; i++) {
    kiln_sbuf_printf(&b, "  r%d = %s[%d] %s(a, b)\n", k, t, NB, bin[i]);
    OUT(t);
  }
  for (int i = 0; i < 6; i++) {
    kiln_sbuf_printf(&b, "  r%d = pred[%d] compare(a, b), direction=%s%s\n", k, NB, dirs[i],
                     i % 2 ? ", type=TOTALORDER" : "");
    OUT("pred");
  }
  kiln_sbuf_printf(&b, "  r%d = %s[%d] select(p, a, b)\n", k, t, NB);
  OUT(t);
  kiln_sbuf_printf(&b, "  r%d = %s[%d] clamp(b, a, b)\n", k, t, NB);
  OUT(t);
  /* Chains: any intermediate carried wider than its type changes them. */
  kiln_sbuf_printf(&b, "  s = %s[%d] add(a, b)\n  r%d = %s[%d] subtract(s, a)\n", t, NB, k, t, NB);
  OUT(t);
  kiln_sbuf_printf(&b, "  m = %s[%d] multiply(a, b)\n  r%d = %s[%d] divide(m, b)\n", t, NB, k, t,
                   NB);
  OUT(t);
  kiln_sbuf_printf(&b,
                   "  aa = %s[%d] multiply(a, a)\n  bb = %s[%d] multiply(b, b)\n"
                   "  h = %s[%d] add(aa, bb)\n  r%d = %s[%d] sqrt(h)\n",
                   t, NB, t, NB, t, NB, k, t, NB);
  OUT(t);
  kiln_sbuf_printf(&b,
                   "  e = %s[%d] exponential(a)\n  em = %s[%d] multiply(e, b)\n"
                   "  r%d = f32[%d] convert(em)\n",
                   t, NB, t, NB, k, NB);
  OUT("f32");
#undef OUT
  kiln_sbuf_printf(&b, "  ROOT t = (%s) tuple(%s)\n}\n", kiln_sbuf_str(&shapes),
                   kiln_sbuf_str(&names));
  leaf_tol tols[64];
  for (int i = 0; i < k; i++) tols[i] = (leaf_tol){0, 0};
  kiln_module *m = cg_parse(kiln_sbuf_str(&b));
  kiln_literal *args[3] = {new_param(m, 0), new_param(m, 1), new_param(m, 2)};
  kiln_module_destroy(m);
  binary_inputs(f, args[0]->data, args[1]->data, NB);
  uint8_t *p = args[2]->data;
  for (int i = 0; i < NB; i++) p[i] = (uint8_t)((i * 7) % 3 == 0);
  /* The exp chain's f32 result is compared separately: within the
   * product's narrow unit of the interpreter's. */
  m = cg_parse(kiln_sbuf_str(&b));
  kiln_status st;
  kiln_status_clear(&st);
  kiln_literal *want = NULL;
  ck_assert_int_eq(kiln_interp_run(m, (const kiln_literal *const *)args, 3, NULL, &want, &st), 0);
  for (int opt = 0; opt <= 2; opt += 2) {
    kiln_executable *e = cg_compile(m, opt);
    kiln_literal *got = NULL;
    cg_execute(e, args, &got);
    char w[64];
    snprintf(w, sizeof w, "%s at opt level %d", t, opt);
    for (int i = 0; i < k - 1; i++)
      check_leaf(got->elems[i], want->elems[i], (uint32_t)i, tols[i], w);
    int64_t off = 0;
    for (int i = 0; i < NB; i++) {
      uint16_t g = h_bits(f, kiln_literal_get_f64(got->elems[k - 1], i));
      uint16_t x = h_bits(f, kiln_literal_get_f64(want->elems[k - 1], i));
      uint32_t d = kiln_tol_ulp_16(g, x, f->bf);
      /* e^a within a unit, then one more rounding: two units at most */
      ck_assert_msg(d <= 2 * KILN_TOL_ULP_HALF_EXP, "%s: exp chain element %d: %04x vs %04x", w, i,
                    g, x);
      off += d != 0;
    }
    ck_assert_msg(off <= NB / 64, "%s: exp chain %lld of %d off", w, (long long)off, NB);
    kiln_literal_destroy(got);
    kiln_executable_destroy(e);
  }
  kiln_literal_destroy(want);
  kiln_module_destroy(m);
  for (int i = 0; i < 3; i++) kiln_literal_destroy(args[i]);
  kiln_sbuf_free(&b);
  kiln_sbuf_free(&shapes);
  kiln_sbuf_free(&names);
}
END_TEST

/* ---- conversions at every rounding boundary ------------------------------ */

/* f32 and f64 -> f16/bf16 at and around every narrow midpoint of both
 * signs: the midpoint itself (ties to even), a hair above and below it (an
 * f64 one 2^-40 relative off, which rounding through f32 first would move
 * onto the tie), and f32 neighbours; plus integers through f32. */
START_TEST(convert_boundaries) {
  const fmt *f = &fmts[_i];
  const int64_t per = 6;
  int64_t n = 0, cap = 2 * 32768 * per + 64;
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b,
                   "HloModule cv\nENTRY main {\n  d = f64[%lld] parameter(0)\n"
                   "  s = f32[%lld] parameter(1)\n  i = s32[%lld] parameter(2)\n"
                   "  r0 = %s[%lld] convert(d)\n  r1 = %s[%lld] convert(s)\n"
                   "  r2 = %s[%lld] convert(i)\n  ROOT t = (%s[%lld], %s[%lld], %s[%lld]) "
                   "tuple(r0, r1, r2)\n}\n",
                   (long long)cap, (long long)cap, (long long)cap, f->name, (long long)cap, f->name,
                   (long long)cap, f->name, (long long)cap, f->name, (long long)cap, f->name,
                   (long long)cap, f->name, (long long)cap);
  kiln_module *m = cg_parse(kiln_sbuf_str(&b));
  kiln_literal *args[3] = {new_param(m, 0), new_param(m, 1), new_param(m, 2)};
  kiln_module_destroy(m);
  double *d = args[0]->data;
  float *s = args[1]->data;
  int32_t *iv = args[2]->data;
  for (uint32_t h = 0; h <= f->maxfin; h++) {
    double lo = h_val(f, (uint16_t)h);
    double hi =
        h == f->maxfin ? lo + (lo - h_val(f, (uint16_t)(h - 1))) : h_val(f, (uint16_t)(h + 1));
    double mid = (lo + hi) / 2;
    for (int sg = 0; sg < 2; sg++) {
      double q = sg ? -1 : 1;
      double v[6] = {mid, mid * (1 + 0x1p-40), mid * (1 - 0x1p-40), lo, mid, mid};
      float fm = (float)mid;
      float fv[6] = {fm,        nextafterf(fm, INFINITY),        nextafterf(fm, 0),
                     (float)lo, nextafterf((float)lo, INFINITY), (float)hi};
      for (int k = 0; k < per; k++) {
        d[n] = q * v[k];
        s[n] = (float)q * fv[k];
        iv[n] = (int32_t)(q * fmin(mid * 1024, 2e9));
        n++;
      }
    }
  }
  static const double edge[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, -NAN, 1e300, -1e300, 1e-300};
  while (n < cap) {
    double e = edge[n % (int64_t)(sizeof edge / sizeof edge[0])];
    d[n] = e;
    s[n] = (float)e;
    iv[n] = (int32_t)(n * 2654435761u);
    n++;
  }
  const leaf_tol tols[3] = {{0, 0}, {0, 0}, {0, 0}};
  run_both(kiln_sbuf_str(&b), args, 3, tols, 3, f->name);
  for (int i = 0; i < 3; i++) kiln_literal_destroy(args[i]);
  kiln_sbuf_free(&b);
}
END_TEST

/* ---- reductions ------------------------------------------------------------ */

/* A reducer in f16/bf16 rounds after every step (the interpreter's order,
 * so bit for bit); the f32 accumulation JAX writes for a sum of f16 values
 * (convert, reduce in f32, convert back) within a unit of the narrow type
 * (the f32 sum is reassociated). */
START_TEST(reductions_narrow_reducer) {
  const fmt *f = &fmts[_i];
  const char *t = f->name;
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b,
                   "HloModule red\nadd { x = %s[] parameter(0)  y = %s[] parameter(1)  ROOT s = "
                   "%s[] add(x, y) }\n"
                   "mx { x = %s[] parameter(0)  y = %s[] parameter(1)  ROOT s = %s[] maximum(x, y) "
                   "}\n"
                   "addf { x = f32[] parameter(0)  y = f32[] parameter(1)  ROOT s = f32[] add(x, "
                   "y) }\n"
                   "ENTRY main {\n  a = %s[24,300] parameter(0)\n  z = %s[] constant(0)\n"
                   "  ninf = %s[] constant(-inf)\n  zf = f32[] constant(0)\n"
                   "  r0 = %s[24] reduce(a, z), dimensions={1}, to_apply=add\n"
                   "  r1 = %s[300] reduce(a, z), dimensions={0}, to_apply=add\n"
                   "  r2 = %s[24] reduce(a, ninf), dimensions={1}, to_apply=mx\n"
                   "  af = f32[24,300] convert(a)\n"
                   "  sf = f32[24] reduce(af, zf), dimensions={1}, to_apply=addf\n"
                   "  r3 = %s[24] convert(sf)\n"
                   "  ROOT t = (%s[24], %s[300], %s[24], %s[24]) tuple(r0, r1, r2, r3)\n}\n",
                   t, t, t, t, t, t, t, t, t, t, t, t, t, t, t, t, t);
  kiln_module *m = cg_parse(kiln_sbuf_str(&b));
  kiln_literal *a = new_param(m, 0);
  kiln_module_destroy(m);
  uint64_t s = 7;
  for (int i = 0; i < 24 * 300; i++) {
    double v = (double)((int64_t)(rng(&s) % 2001) - 1000) / 64.0;
    uint16_t h = h_bits(f, v);
    memcpy((uint8_t *)a->data + i * 2, &h, 2);
  }
  const leaf_tol tols[4] = {{0, 0}, {0, 0}, {0, 0}, {1, 24}};
  run_both(kiln_sbuf_str(&b), &a, 1, tols, 4, t);
  kiln_literal_destroy(a);
  kiln_sbuf_free(&b);
}
END_TEST

/* ---- generated code ------------------------------------------------------- */

/* An f16 chain is computed in float and rounded by krhf after each op: no
 * double arithmetic and no per-element call to the double-based helpers
 * (the old path, 10-40 times slower) in its kernel. */
START_TEST(chain_computes_in_float) {
  const char *hlo = "HloModule c\nENTRY main {\n  a = f16[4096] parameter(0)\n"
                    "  b = bf16[4096] parameter(1)\n"
                    "  e = f16[4096] exponential(a)\n  m = f16[4096] multiply(e, a)\n"
                    "  s = f16[4096] sqrt(m)\n  t = bf16[4096] tanh(b)\n"
                    "  u = bf16[4096] add(t, b)\n  c = f16[4096] convert(u)\n"
                    "  ROOT r = f16[4096] subtract(s, c)\n}\n";
  char dir[] = "/tmp/kiln-half-XXXXXX", path[300], cmd[400];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.dump_dir = dir;
  kiln_module *m = cg_parse(hlo);
  kiln_executable *e = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_compile(m, &o, &e, NULL, &st) == 0, "%s: %s", st.where, st.msg);
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
  snprintf(path, sizeof path, "%s/kernels.c", dir);
  FILE *fp = fopen(path, "rb");
  ck_assert_ptr_nonnull(fp);
  static char src[1 << 20];
  size_t n = fread(src, 1, sizeof src - 1, fp);
  fclose(fp);
  src[n] = 0;
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
  const char *body = strstr(src, "void kiln_kernel_0");
  ck_assert_ptr_nonnull(body);
  ck_assert_ptr_null(strstr(src, "void kiln_kernel_1")); /* one fused loop */
  ck_assert_msg(strstr(body, "krhf(") && strstr(body, "krbf(") && strstr(body, "kh2f(") &&
                    strstr(body, "kb2f(") && strstr(body, "kf2h(") && strstr(body, "kexpf(") &&
                    strstr(body, "ktanhf("),
                "the kernel does not compute in f32 with krhf/krbf rounding:\n%s", body);
  ck_assert_msg(!strstr(body, "double") && !strstr(body, "krh(") && !strstr(body, "krb(") &&
                    !strstr(body, "kh2d(") && !strstr(body, "kd2h("),
                "the kernel computes in double:\n%s", body);
}
END_TEST

int main(void) {
  Suite *s = suite_create("codegen_half");
  TCase *tc = tcase_create("half");
  tcase_set_timeout(tc, 240);
  tcase_add_loop_test(tc, unary_every_value, 0, 2);
  tcase_add_loop_test(tc, binary_ties_overflow_chains, 0, 2);
  tcase_add_loop_test(tc, convert_boundaries, 0, 2);
  tcase_add_loop_test(tc, reductions_narrow_reducer, 0, 2);
  tcase_add_test(tc, chain_computes_in_float);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
