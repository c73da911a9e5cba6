/* How closely the compiled backends must agree with the reference
 * interpreter, in one place (the headers of test_codegen.c and
 * test_difftest.c point here).
 *
 * The interpreter is the oracle. It computes f32 transcendentals in double
 * and rounds once (so it is correctly rounded but for rare ties), and it
 * combines a reduction's inputs one at a time in row-major order. The cpu
 * backend instead computes f32 exp, log, log1p, expm1, tanh, logistic, erf
 * and atan2 with the prelude's vectorizable helpers (emit.h states their
 * bounds), and sums a row in several vector lanes and partial
 * accumulators combined at the end, as XLA does. So:
 *  - an f32 elementwise result of one of those ops is within
 *    KILN_TOL_ULP_<OP> units in the last place of the interpreter's
 *    (counted as the distance between the two bit patterns);
 *  - a chain of ops compounds those bounds with each op's conditioning:
 *    tests of chains use a relative tolerance, a small multiple of
 *    KILN_TOL_F32_EPS times the sum of the bounds involved;
 *  - a reassociated f32 reduction over n elements is within
 *    kiln_tol_reduce_f32(n) relative to max(1, |result|), for inputs of
 *    magnitude about 1 (the tests' random inputs): each order's rounding
 *    error is at most about n * eps * sum|x|, and for random signs it grows
 *    like sqrt(n) in practice; the bound allows 4 (n + 1) eps.
 *  - f16 and bf16 values are held in f32 and every op's f32 result is
 *    rounded to nearest even back to the narrow type (emit.h): add,
 *    subtract, multiply, divide, sqrt, conversions and the exact ops are
 *    bit-equal to the interpreter's; exp, expm1, log, log1p, logistic,
 *    tanh, erf, sin, cos, tan (the f32 helpers above, a few f32 ULPs) and
 *    rsqrt (in double, then through f32) land on the other side of a
 *    narrow rounding boundary only when the exact value lies within those
 *    few f32 ULPs of it, so they are within KILN_TOL_ULP_HALF_<OP> units
 *    of the narrow type (kiln_tol_ulp_16), and rarely off at all;
 * Integers, predicates and every op not listed stay bit-exact.
 */
#ifndef KILN_TESTS_SUPPORT_TOLERANCE_H
#define KILN_TESTS_SUPPORT_TOLERANCE_H

#include <stdint.h>

#define KILN_TOL_F32_EPS 0x1p-23 /* one ULP of f32 at 1 */

/* ULPs of the f32 result, helper by helper (emit.h, c_target.c). */
#define KILN_TOL_ULP_EXP 2
#define KILN_TOL_ULP_LOG 2
#define KILN_TOL_ULP_LOG1P 2
#define KILN_TOL_ULP_EXPM1 2
#define KILN_TOL_ULP_TANH 3
#define KILN_TOL_ULP_LOGISTIC 3
#define KILN_TOL_ULP_ERF 3
/* sin, cos, tan: glibc's vector math library (libmvec) on x86-64. */
#define KILN_TOL_ULP_SIN 2
#define KILN_TOL_ULP_COS 2
#define KILN_TOL_ULP_TAN 3
/* atan2: katan2f, computed in double and rounded once (emit.h). */
#define KILN_TOL_ULP_ATAN2 1
#define KILN_TOL_ULP_MAX 3 /* the largest of the above */

/* Units of the narrow type of an f16 or bf16 result, op by op (a few f32
 * ULPs, then one rounding to the narrow type: at most one boundary
 * crossed). */
#define KILN_TOL_ULP_HALF_EXP 1
#define KILN_TOL_ULP_HALF_EXPM1 1
#define KILN_TOL_ULP_HALF_LOG 1
#define KILN_TOL_ULP_HALF_LOG1P 1
#define KILN_TOL_ULP_HALF_LOGISTIC 1
#define KILN_TOL_ULP_HALF_TANH 1
#define KILN_TOL_ULP_HALF_ERF 1
#define KILN_TOL_ULP_HALF_SIN 1
#define KILN_TOL_ULP_HALF_COS 1
#define KILN_TOL_ULP_HALF_TAN 1
#define KILN_TOL_ULP_HALF_RSQRT 1
#define KILN_TOL_ULP_HALF_MAX 1 /* the largest of the above */

/* The distance in units of the narrow type between two f16 (bf16 = 0) or
 * bf16 (bf16 = 1) bit patterns, on the same monotone scale as
 * kiln_tol_ulp_f32: 0 for two NaNs, UINT32_MAX when only one is NaN. */
static inline uint32_t kiln_tol_ulp_16(uint16_t a, uint16_t b, int bf16) {
  uint16_t em = bf16 ? 0x7f80u : 0x7c00u;
  int an = (a & em) == em && (a & ~em & 0x7fffu), bn = (b & em) == em && (b & ~em & 0x7fffu);
  if (an || bn) return an && bn ? 0 : UINT32_MAX;
  int32_t ka = (a & 0x8000u) ? -(int32_t)(a & 0x7fffu) - 1 : (int32_t)a;
  int32_t kb = (b & 0x8000u) ? -(int32_t)(b & 0x7fffu) - 1 : (int32_t)b;
  return (uint32_t)(ka > kb ? ka - kb : kb - ka);
}

/* Relative tolerance (of max(1, |result|)) of an f32 reduction over n
 * reassociated elements. */
static inline double kiln_tol_reduce_f32(int64_t n) {
  return 4.0 * (double)(n + 1) * KILN_TOL_F32_EPS;
}

/* The distance in ULPs between two f32 values: the difference of their
 * bit patterns mapped to a monotone integer scale (so that -0 and +0 are
 * 1 apart and the sign change costs nothing extra); 0 for two NaNs, and
 * UINT32_MAX when only one is NaN. */
static inline uint32_t kiln_tol_ulp_f32(float a, float b) {
  if (a != a || b != b) return (a != a && b != b) ? 0 : UINT32_MAX;
  union {
    float f;
    uint32_t u;
  } x = {a}, y = {b};
  int64_t ka = (x.u & 0x80000000u) ? -(int64_t)(x.u & 0x7fffffffu) - 1 : (int64_t)x.u;
  int64_t kb = (y.u & 0x80000000u) ? -(int64_t)(y.u & 0x7fffffffu) - 1 : (int64_t)y.u;
  int64_t d = ka > kb ? ka - kb : kb - ka;
  return d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
}

/* JAX's special functions (gammaln, digamma, erfinv, erf, i0e, logit: the
 * elementwise expansions jax.scipy.special lowers to, chains of floor,
 * reflection through sin/cos, log, log1p, exp and selects), relative to
 * max(1, |interp|): each transcendental within its ULP bound above, the
 * chains' cancellations (gammaln near 1 and 2, the reflection near the
 * poles) amplifying them. Measured by test_cpu_special.c over its sweep
 * (2026-12-01): gammaln 8 eps (at -5.004), digamma 4 (at -6.7), erfinv,
 * erf and logit 1, i0e 0; the bound allows twice the worst. */
#define KILN_TOL_SPECIAL_REL (16 * KILN_TOL_F32_EPS)

/* Complex elementwise ops (c64, c128) on the cpu backend are computed in
 * double _Complex with the C library's formulas, as the interpreter
 * computes them, each c64 result rounded to float parts: results agree to
 * a few ULP of the result's largest magnitude (the interpreter may keep a
 * c64 chain's intermediate on a different side of a rounding tie). The
 * relative tolerances, of max(1, max |result|): */
#define KILN_TOL_C64_REL (8 * KILN_TOL_F32_EPS)
#define KILN_TOL_C128_REL 1e-6 /* covers a c64 leg in a c128 chain, as f32 eps */

/* An FFT of n points through FFTW (a different summation order from the
 * interpreter's direct DFT): relative to max(1, max |result|),
 * a few eps times log2(n) + 1 for FFTW and n eps for the direct sum. */
static inline double kiln_tol_fft(int64_t n, int c64) {
  double eps = c64 ? (double)KILN_TOL_F32_EPS : 0x1p-52;
  return 8.0 * (double)(n + 1) * eps;
}

#endif /* KILN_TESTS_SUPPORT_TOLERANCE_H */
