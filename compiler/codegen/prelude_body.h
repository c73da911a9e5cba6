/* The body of every target's prelude: emit.h's helper contract
 * (KILN__PRELUDE_HELPERS) written once in the subset of C that both C11
 * and CUDA C++ accept, so that every target computes the same bits. A
 * target's prelude opens with its own head, which provides the vocabulary
 * (emit.h) and defines:
 *   KI        the qualifiers of a helper ("static inline" and unused);
 *   KCLZ64(x) the leading zero bits of a nonzero uint64_t, as an int;
 * and then appends KILN__PRELUDE_BODY.
 */
#ifndef KILN_COMPILER_CODEGEN_PRELUDE_BODY_H
#define KILN_COMPILER_CODEGEN_PRELUDE_BODY_H

/* clang-format off */
/* Rounding, selects and finiteness tests that GCC vectorizes (emit.h states
 * their contract). floorf, ceilf and roundf are not inlined as vector
 * instructions under -ftrapping-math, and a float select whose operands GCC
 * sinks into a branch (calls to libmvec's unmasked sinf/cosf above all)
 * stops if-conversion: rint (which GCC vectorizes) plus an exact
 * correction, and selects on the bits, keep such loops straight-line.
 * Exact, so bit-equal to the interpreter's libm calls, NaN included.
 * x86 has no vector integer division: 32-bit quotients go through double
 * (exact: both operands and the quotient fit in 53 bits, and a quotient's
 * rounding error, under 2^-21 / |b|, cannot cross an integer, each at
 * least 1 / |b| from a non-integral quotient), except for a divisor GCC
 * knows, which it turns into shifts and multiplies. */
#define KILN__PRELUDE_ROUNDING \
    /* KIA: a helper too large for -O2's inliner (light kernels, compile.c) \
     * that must still be inlined, or the loop calling it stays scalar */ \
    "#if defined(__GNUC__) && !defined(__CUDACC__)\n" \
    "#define KIA KI __attribute__((always_inline))\n" \
    "#else\n" \
    "#define KIA KI\n" \
    "#endif\n" \
    "KI float kfloorf(float x) { float r = rintf(x); return r - (r > x ? 1.0f : 0.0f); }\n" \
    "KI double kfloord(double x) { double r = rint(x); return r - (r > x ? 1.0 : 0.0); }\n" \
    "KI float kceilf(float x) { return -kfloorf(-x); }\n" \
    "KI double kceild(double x) { return -kfloord(-x); }\n" \
    "KI float kroundf(float x) {\n" \
    "  float a = fabsf(x), f = kfloorf(a);\n" \
    "  f = f + (a - f >= 0.5f ? 1.0f : 0.0f);\n" \
    "  return kbf32(kf32bits(f) | (kf32bits(x) & 0x80000000u));\n" \
    "}\n" \
    "KI double kroundd(double x) {\n" \
    "  double a = fabs(x), f = kfloord(a);\n" \
    "  f = f + (a - f >= 0.5 ? 1.0 : 0.0);\n" \
    "  return kbf64(kf64bits(f) | (kf64bits(x) & 0x8000000000000000ull));\n" \
    "}\n" \
    "KI float kself(uint8_t c, float a, float b) {\n" \
    "  uint32_t m = 0u - (uint32_t)(c != 0);\n" \
    "  return kbf32((kf32bits(a) & m) | (kf32bits(b) & ~m));\n" \
    "}\n" \
    "KI double kseld(uint8_t c, double a, double b) {\n" \
    "  uint64_t m = 0ull - (uint64_t)(c != 0);\n" \
    "  return kbf64((kf64bits(a) & m) | (kf64bits(b) & ~m));\n" \
    "}\n" \
    "KI uint8_t kfinitef(float x) { return (uint8_t)((kf32bits(x) & 0x7fffffffu) < 0x7f800000u); }\n" \
    "KI uint8_t kfinited(double x) {\n" \
    "  return (uint8_t)((kf64bits(x) & 0x7fffffffffffffffull) < 0x7ff0000000000000ull);\n" \
    "}\n" \
    "KI int32_t ktotf(float x) {\n" \
    "  uint32_t u = kf32bits(x);\n" \
    "  u = (u & 0x7fffffffu) > 0x7f800000u ? u | 0x00400000u : u;\n" \
    "  int32_t k = (int32_t)u;\n" \
    "  return k < 0 ? k ^ 0x7fffffff : k;\n" \
    "}\n" \
    "#if defined(__GNUC__) && !defined(__CUDACC__)\n" \
    "#define KCONSTP(x) __builtin_constant_p(x)\n" \
    "#else\n" \
    "#define KCONSTP(x) 0\n" \
    "#endif\n" \
    "KI int32_t kdivs32v(int32_t a, int32_t b) {\n" \
    "  if (KCONSTP(b)) return b == 0 ? -1 : (a == INT32_MIN && b == -1) ? a : a / b;\n" \
    "  int32_t d = (b == 0) | ((a == INT32_MIN) & (b == -1)) ? 1 : b;\n" \
    "  int32_t q = (int32_t)((double)a / (double)d);\n" \
    "  return b == 0 ? -1 : q;\n" \
    "}\n" \
    "KI int32_t krems32v(int32_t a, int32_t b) {\n" \
    "  if (KCONSTP(b)) return b == 0 ? a : (a == INT32_MIN && b == -1) ? 0 : a % b;\n" \
    "  int32_t d = (b == 0) | ((a == INT32_MIN) & (b == -1)) ? 1 : b;\n" \
    "  int32_t q = (int32_t)((double)a / (double)d);\n" \
    "  uint32_t r = (uint32_t)a - (uint32_t)q * (uint32_t)d;\n" \
    "  return b == 0 ? a : (int32_t)r;\n" \
    "}\n" \
    "KI uint32_t kdivu32v(uint32_t a, uint32_t b) {\n" \
    "  if (KCONSTP(b)) return b == 0 ? 0xffffffffu : a / b;\n" \
    "  uint32_t q = (uint32_t)(int64_t)((double)a / (double)(b == 0 ? 1u : b));\n" \
    "  return b == 0 ? 0xffffffffu : q;\n" \
    "}\n" \
    "KIA float katan2f(float y, float x) {\n" \
    "  double ax = fabs((double)x), ay = fabs((double)y);\n" \
    "  double mx = ax > ay ? ax : ay, mn = ax > ay ? ay : ax;\n" \
    "  double t = mn / kseld(mx == 0.0, 1.0, mx);\n" \
    "  t = kseld(mn == INFINITY, 1.0, t); /* both infinite: pi/4 */\n" \
    "  uint8_t big = t > 0x1.a827999fcef32p-2; /* tan(pi/8) */\n" \
    "  double u = kseld(big, (t - 1.0) / (t + 1.0), t), z = u * u;\n" \
    "  double p = -0x1.642c8590b2164p-5; /* atan(u) = u + u z P(z): Taylor to u^23 */\n" \
    "  p = p * z + 0x1.8618618618618p-5; /* 1/21 */\n" \
    "  p = p * z - 0x1.af286bca1af28p-5; /* 1/19 */\n" \
    "  p = p * z + 0x1.e1e1e1e1e1e1ep-5; /* 1/17 */\n" \
    "  p = p * z - 0x1.1111111111111p-4; /* 1/15 */\n" \
    "  p = p * z + 0x1.3b13b13b13b14p-4; /* 1/13 */\n" \
    "  p = p * z - 0x1.745d1745d1746p-4; /* 1/11 */\n" \
    "  p = p * z + 0x1.c71c71c71c71cp-4; /* 1/9 */\n" \
    "  p = p * z - 0x1.2492492492492p-3; /* 1/7 */\n" \
    "  p = p * z + 0x1.999999999999ap-3; /* 1/5 */\n" \
    "  p = p * z - 0x1.5555555555555p-2; /* 1/3 */\n" \
    "  double r = u + u * z * p + kseld(big, 0x1.921fb54442d18p-1, 0.0);\n" \
    "  r = kseld(ay > ax, 0x1.921fb54442d18p+0 - r, r);\n" \
    "  r = kseld((uint8_t)(kf32bits(x) >> 31), 0x1.921fb54442d18p+1 - r, r);\n" \
    "  float f = (float)r;\n" \
    "  f = kbf32(kf32bits(f) | (kf32bits(y) & 0x80000000u));\n" \
    "  return kself(x != x || y != y, x + y, f);\n" \
    "}\n" \
    "KI uint32_t kremu32v(uint32_t a, uint32_t b) {\n" \
    "  if (KCONSTP(b)) return b == 0 ? a : a % b;\n" \
    "  uint32_t d = b == 0 ? 1u : b;\n" \
    "  uint32_t q = (uint32_t)(int64_t)((double)a / (double)d);\n" \
    "  return b == 0 ? a : a - q * d;\n" \
    "}\n"

#define KILN__PRELUDE_BODY \
    "KI float kbf32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }\n" \
    "KI double kbf64(uint64_t u) { double f; memcpy(&f, &u, 8); return f; }\n" \
    "KI uint32_t kf32bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }\n" \
    "KI uint64_t kf64bits(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }\n" \
    "KI double kh2d(uint16_t h) {\n" \
    "  uint32_t e = (h >> 10) & 31u, m = h & 1023u; double v;\n" \
    "  if (e == 0) v = (double)m * 0x1p-24;\n" \
    "  else if (e == 31) v = m ? NAN : INFINITY;\n" \
    "  else v = kbf64(((uint64_t)(e + 1008) << 52) | ((uint64_t)m << 42));\n" \
    "  return (h & 0x8000u) ? -v : v;\n" \
    "}\n" \
    "KI double kb2d(uint16_t h) {\n" \
    "  if ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu)) return (h & 0x8000u) ? -NAN : NAN;\n" \
    "  return (double)kbf32((uint32_t)h << 16);\n" \
    "}\n" \
    "/* double -> nearest value of a narrow format (ties to even), as a double */\n" \
    "KI double kround(double x, int emin, int mb, double maxv, double up, double down) {\n" \
    "  uint64_t b = kf64bits(x), s = b & 0x8000000000000000ull, a = b ^ s;\n" \
    "  if (a >= 0x7ff0000000000000ull) return x;\n" \
    "  if ((int)(a >> 52) - 1023 >= emin) {\n" \
    "    int sh = 52 - mb;\n" \
    "    a = (a + ((1ull << (sh - 1)) - 1) + ((a >> sh) & 1)) & ~((1ull << sh) - 1);\n" \
    "  } else {\n" \
    "    a = kf64bits(rint(kbf64(a) * up) * down);\n" \
    "  }\n" \
    "  if (kbf64(a) > maxv) a = 0x7ff0000000000000ull;\n" \
    "  return kbf64(a | s);\n" \
    "}\n" \
    "KI double krh(double x) { return kround(x, -14, 10, 65504.0, 0x1p24, 0x1p-24); }\n" \
    "KI double krb(double x) { return kround(x, -126, 7, 0x1.fep127, 0x1p133, 0x1p-133); }\n" \
    /* An f32 to its nearest bf16 (ties to even), branch-free so a convert loop \
     * vectorizes: the same value as krb((double)x), f32 subnormals included \
     * (bf16's quantum there is 2^-133, bit 16 of the f32's), overflow carrying \
     * into infinity; a NaN stays a NaN of its sign. */ \
    "KI float krbf(float x) {\n" \
    "  uint32_t u = kf32bits(x);\n" \
    "  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;\n" \
    "  uint32_t q = (u | 0x00400000u) & 0xffff0000u;\n" \
    "  return kbf32((u & 0x7fffffffu) > 0x7f800000u ? q : r);\n" \
    "}\n" \
    "KI uint16_t kd2h(double x) {\n" \
    "  uint64_t b = kf64bits(x), a = b & 0x7fffffffffffffffull;\n" \
    "  uint16_t s = (uint16_t)((b >> 48) & 0x8000u);\n" \
    "  if (a > 0x7ff0000000000000ull) return s | 0x7e00u;\n" \
    "  int e = (int)(a >> 52) - 1023;\n" \
    "  if (e > 15) return s | 0x7c00u;\n" \
    "  if (e < -14) return s | (uint16_t)(kbf64(a) * 0x1p24);\n" \
    "  return s | (uint16_t)((e + 15) << 10) | (uint16_t)((a >> 42) & 1023u);\n" \
    "}\n" \
    "KI uint16_t kd2b(double x) {\n" \
    "  if (x != x) return signbit(x) ? 0xffc0u : 0x7fc0u;\n" \
    "  return (uint16_t)(kf32bits((float)x) >> 16);\n" \
    "}\n" \
    "KI int64_t ktot(double x) { int64_t k = (int64_t)kf64bits(x); return k < 0 ? k ^ INT64_MAX : " \
    "k; }\n" \
    "KI double ksign(double x) { return x != x ? x : copysign(x != 0 ? 1.0 : 0.0, x); }\n" \
    "KI float ksignf(float x) { return x != x ? x : copysignf(x != 0 ? 1.0f : 0.0f, x); }\n" \
    "KI double klogistic(double x) { return 1.0 / (1.0 + exp(-x)); }\n" \
    "KI double krsqrt(double x) { return 1.0 / sqrt(x); }\n" \
    "KI double kpowd(double a, double b) { return (a == 1 || b == 0) ? 1.0 : pow(a, b); }\n" \
    /* max, min and clamp pass a NaN operand through (the first NaN in  \
     * operand order), picked by bit masks rather than nested selects:   \
     * after a max with a constant GCC threads the selects of what reads  \
     * the result (klogf) into branches, and the loop stops vectorizing. */ \
    "KI uint32_t knanm(float a) { return 0u - (uint32_t)(a != a); }\n" \
    "KI uint64_t knanmd(double a) { return 0u - (uint64_t)(a != a); }\n" \
    "KI float kpickf(uint32_t m, float a, float b) {\n" \
    "  return kbf32((kf32bits(a) & m) | (kf32bits(b) & ~m));\n" \
    "}\n" \
    "KI double kpickd(uint64_t m, double a, double b) {\n" \
    "  return kbf64((kf64bits(a) & m) | (kf64bits(b) & ~m));\n" \
    "}\n" \
    "KI float kmaxf(float a, float b) {\n" \
    "  float m = a < b ? b : a; m = kpickf(knanm(b), b, m); return kpickf(knanm(a), a, m);\n" \
    "}\n" \
    "KI float kminf(float a, float b) {\n" \
    "  float m = b < a ? b : a; m = kpickf(knanm(b), b, m); return kpickf(knanm(a), a, m);\n" \
    "}\n" \
    "KI double kmaxd(double a, double b) {\n" \
    "  double m = a < b ? b : a; m = kpickd(knanmd(b), b, m); return kpickd(knanmd(a), a, m);\n" \
    "}\n" \
    "KI double kmind(double a, double b) {\n" \
    "  double m = b < a ? b : a; m = kpickd(knanmd(b), b, m); return kpickd(knanmd(a), a, m);\n" \
    "}\n" \
    "KI float kclampf(float l, float x, float h) {\n" \
    "  float y = x < l ? l : x; y = y < h ? y : h;\n" \
    "  y = kpickf(knanm(h), h, y); y = kpickf(knanm(x), x, y); return kpickf(knanm(l), l, y);\n" \
    "}\n" \
    "KI double kclampd(double l, double x, double h) {\n" \
    "  double y = x < l ? l : x; y = y < h ? y : h;\n" \
    "  y = kpickd(knanmd(h), h, y); y = kpickd(knanmd(x), x, y);\n" \
    "  return kpickd(knanmd(l), l, y);\n" \
    "}\n" \
    "KI int64_t kclampi(int64_t v, int64_t hi) { return v < 0 ? 0 : v > hi ? hi : v; }\n" \
    "KI int64_t kf2s(double x, int w) {\n" \
    "  if (x != x) return 0;\n" \
    "  double hi = (double)(1ull << (w - 1));\n" \
    "  if (x >= hi) return w == 64 ? INT64_MAX : (int64_t)((1ull << (w - 1)) - 1);\n" \
    "  if (x <= -hi) return w == 64 ? INT64_MIN : -(int64_t)(1ull << (w - 1));\n" \
    "  return (int64_t)x;\n" \
    "}\n" \
    "KI int32_t kf2sf(float x, int w) {\n" \
    "  float hi = (float)(1u << (w - 1));\n" \
    "  int32_t top = (int32_t)((1u << (w - 1)) - 1u);\n" \
    "  return x != x ? 0 : x >= hi ? top : x <= -hi ? -top - 1 : (int32_t)x;\n" \
    "}\n" \
    "KI uint64_t kf2u(double x, int w) {\n" \
    "  if (x != x || x <= 0) return 0;\n" \
    "  if (x >= (w == 64 ? 0x1p64 : (double)(1ull << w))) return w == 64 ? UINT64_MAX : (1ull << " \
    "w) - 1;\n" \
    "  return (uint64_t)x;\n" \
    "}\n" \
    "KI int32_t kdivs32(int32_t a, int32_t b) { return b == 0 ? -1 : (a == INT32_MIN && b == -1) ? " \
    "a : a / b; }\n" \
    "KI int32_t krems32(int32_t a, int32_t b) { return b == 0 ? a : (a == INT32_MIN && b == -1) ? " \
    "0 : a % b; }\n" \
    "KI int64_t kdivs64(int64_t a, int64_t b) { return b == 0 ? -1 : (a == INT64_MIN && b == -1) ? " \
    "a : a / b; }\n" \
    "KI int64_t krems64(int64_t a, int64_t b) { return b == 0 ? a : (a == INT64_MIN && b == -1) ? " \
    "0 : a % b; }\n" \
    "KI uint64_t kdivu64(uint64_t a, uint64_t b) { return b == 0 ? UINT64_MAX : a / b; }\n" \
    "KI uint64_t kremu64(uint64_t a, uint64_t b) { return b == 0 ? a : a % b; }\n" \
    "KI uint64_t kipow(uint64_t x, uint64_t y, int neg) {\n" \
    "  if (x == 1 || y == 0) return 1; if (neg) return 0;\n" \
    "  uint64_t r = 1; while (y) { if (y & 1) r *= x; x *= x; y >>= 1; } return r;\n" \
    "}\n" \
    "KI uint64_t kclz(uint64_t x, int w) { return x == 0 ? (uint64_t)w : " \
    "(uint64_t)(KCLZ64(x) - (64 - w)); }\n" \
    "#define KSHIFTS(W) \\\n" \
    "KI uint##W##_t kshl##W(uint##W##_t x, uint##W##_t y) { return y >= W ? 0 : (uint##W##_t)(x << " \
    "y); } \\\n" \
    "KI uint##W##_t kshrl##W(uint##W##_t x, uint##W##_t y) { return y >= W ? 0 : (uint##W##_t)(x " \
    ">> y); } \\\n" \
    "KI uint##W##_t kshra##W(uint##W##_t x, uint##W##_t y) { \\\n" \
    "  int##W##_t s = (int##W##_t)x; return y >= W ? (uint##W##_t)(s < 0 ? -1 : 0) : " \
    "(uint##W##_t)(s >> y); }\n" \
    "KSHIFTS(8) KSHIFTS(16) KSHIFTS(32) KSHIFTS(64)\n" \
    "/* reduce-precision on the bits of a format with se exponent, sm mantissa bits */\n" \
    "KI uint64_t krpbits(uint64_t bits, int se, int sm, long long eb, long long mb) {\n" \
    "  if (eb < 1 || mb < 0) return bits;\n" \
    "  uint64_t sign = 1ull << (se + sm), expm = ((1ull << se) - 1) << sm;\n" \
    "  if (mb < sm) {\n" \
    "    uint64_t last = 1ull << (sm - mb), bias = (last >> 1) - 1 + ((bits & last) ? 1 : 0);\n" \
    "    bits = (bits + bias) & ~(last - 1);\n" \
    "  }\n" \
    "  if (eb < se) {\n" \
    "    uint64_t sb = (1ull << (se - 1)) - 1, rb = (1ull << (eb - 1)) - 1;\n" \
    "    uint64_t e = bits & expm, s = bits & sign;\n" \
    "    if (e > ((sb + rb) << sm)) bits = s | expm;\n" \
    "    else if (e <= ((sb - rb) << sm)) bits = s;\n" \
    "  }\n" \
    "  return bits;\n" \
    "}\n" \
    "KI float krpf(float x, long long eb, long long mb) {\n" \
    "  if (x != x) return mb > 0 || eb < 1 || mb < 0 ? x : copysignf(INFINITY, x);\n" \
    "  return kbf32((uint32_t)krpbits(kf32bits(x), 8, 23, eb, mb));\n" \
    "}\n" \
    "KI double krpd(double x, long long eb, long long mb) {\n" \
    "  if (x != x) return mb > 0 || eb < 1 || mb < 0 ? x : copysign(INFINITY, x);\n" \
    "  return kbf64(krpbits(kf64bits(x), 11, 52, eb, mb));\n" \
    "}\n" \
    "KI double krph(double x, long long eb, long long mb) {\n" \
    "  if (x != x) return mb > 0 || eb < 1 || mb < 0 ? x : copysign(INFINITY, x);\n" \
    "  return kh2d((uint16_t)krpbits(kd2h(x), 5, 10, eb, mb));\n" \
    "}\n" \
    "KI double krpb(double x, long long eb, long long mb) {\n" \
    "  if (x != x) return mb > 0 || eb < 1 || mb < 0 ? x : copysign(INFINITY, x);\n" \
    "  return kb2d((uint16_t)krpbits(kd2b(x), 8, 7, eb, mb));\n" \
    "}\n" \
    "/* f32 math in f32, branch-free so that kernel loops vectorize (error bounds: emit.h) */\n" \
    "KI float kldexpf(float p, int32_t n) {\n" \
    "  int32_t a = n >> 1, b = n - a;\n" \
    "  return p * kbf32((uint32_t)(a + 127) << 23) * kbf32((uint32_t)(b + 127) << 23);\n" \
    "}\n" \
    "KI float kexpf(float x) {\n" \
    "  float y = x < -104.0f ? -104.0f : x;\n" \
    "  y = y > 89.0f ? 89.0f : y;\n" \
    "  float n = (y * 0x1.715476p+0f + 0x1.8p23f) - 0x1.8p23f;\n" \
    "  float r = (y - n * 0x1.62e400p-1f) - n * 0x1.7f7d1cp-20f;\n" \
    "  float p = 0x1.a01a02p-13f;\n" \
    "  p = p * r + 0x1.6c16c2p-10f;\n" \
    "  p = p * r + 0x1.111112p-7f;\n" \
    "  p = p * r + 0x1.555556p-5f;\n" \
    "  p = p * r + 0x1.555556p-3f;\n" \
    "  p = p * r + 0.5f;\n" \
    "  p = p * r * r + r;\n" \
    "  float e = kldexpf(p + 1.0f, (int32_t)n);\n" \
    "  return x != x ? x : e;\n" \
    "}\n" \
    "/* log(1 + f) for f in [sqrt(1/2) - 1, sqrt(2) - 1]: 2s + s R(s^2), s = f / (2 + f) */\n" \
    "KI float klog1pm(float f) {\n" \
    "  float s = f / (2.0f + f), z = s * s, hf = 0.5f * f * f;\n" \
    "  float R = 0x1.c71c72p-3f; /* 2/9 */\n" \
    "  R = R * z + 0x1.24924ap-2f; /* 2/7 */\n" \
    "  R = R * z + 0x1.99999ap-2f; /* 2/5 */\n" \
    "  R = R * z + 0x1.555556p-1f; /* 2/3 */\n" \
    "  R = R * z;\n" \
    "  return f - (hf - s * (hf + R));\n" \
    "}\n" \
    "KI float klogf(float x) {\n" \
    "  float sub = x < 0x1p-126f ? 1.0f : 0.0f;\n" \
    "  uint32_t u = kf32bits(x * (1.0f + sub * (0x1p23f - 1.0f)));\n" \
    "  uint32_t ix = u + (0x3f800000u - 0x3f3504f3u);\n" \
    "  float kf = (float)((int32_t)(ix >> 23) - 127) - 23.0f * sub;\n" \
    "  float f = kbf32((ix & 0x007fffffu) + 0x3f3504f3u) - 1.0f;\n" \
    "  float r = kf * 0x1.62e400p-1f + (klog1pm(f) + kf * 0x1.7f7d1cp-20f);\n" \
    "  float sp = x < 0 ? NAN : x; /* +inf, NaN: themselves */\n" \
    "  sp = x == 0 ? -INFINITY : sp;\n" \
    "  uint32_t ok = 0u - (uint32_t)(kf32bits(x) - 1u < 0x7f7fffffu); /* positive, finite */\n" \
    "  return kbf32((kf32bits(r) & ok) | (kf32bits(sp) & ~ok));\n" \
    "}\n" \
    "KI float klog1pf(float x) {\n" \
    "  float u = 1.0f + x;\n" \
    "  float c = (x - (u - 1.0f)) / u;\n" \
    "  float r = klogf(u);\n" \
    "  c = u == INFINITY ? 0.0f : c;\n" \
    "  c = u <= 0 ? 0.0f : c;\n" \
    "  return r + c;\n" \
    "}\n" \
    "KI float kexpm1f(float x) {\n" \
    "  float y = x < -30.0f ? -30.0f : x;\n" \
    "  y = y > 30.0f ? 30.0f : y;\n" \
    "  float n = (y * 0x1.715476p+0f + 0x1.8p23f) - 0x1.8p23f;\n" \
    "  float r = (y - n * 0x1.62e400p-1f) - n * 0x1.7f7d1cp-20f;\n" \
    "  float p = 0x1.a01a02p-16f; /* 1/9! */\n" \
    "  p = p * r + 0x1.a01a02p-13f;\n" \
    "  p = p * r + 0x1.6c16c2p-10f;\n" \
    "  p = p * r + 0x1.111112p-7f;\n" \
    "  p = p * r + 0x1.555556p-5f;\n" \
    "  p = p * r + 0x1.555556p-3f;\n" \
    "  p = p * r + 0.5f;\n" \
    "  p = p * r * r + r; /* expm1(r) */\n" \
    "  float t = kbf32((uint32_t)((int32_t)n + 127) << 23);\n" \
    "  float e = p * t + (t - 1.0f);\n" \
    "  e = x > 20.0f ? kexpf(x) : e;\n" \
    "  return x != x ? x : e;\n" \
    "}\n" \
    "KI float ktanhf(float x) {\n" \
    "  float a = fabsf(x);\n" \
    "  a = a > 10.0f ? 10.0f : a;\n" \
    /* kexpm1f's arithmetic for y = 2|x| in [0, 20], without its paths for \
     * large and NaN arguments (which a branch-free loop would compute for \
     * every element): the same value, at half the cost. */ \
    "  float y = 2.0f * a;\n" \
    "  float n = (y * 0x1.715476p+0f + 0x1.8p23f) - 0x1.8p23f;\n" \
    "  float r = (y - n * 0x1.62e400p-1f) - n * 0x1.7f7d1cp-20f;\n" \
    "  float p = 0x1.a01a02p-16f;\n" \
    "  p = p * r + 0x1.a01a02p-13f;\n" \
    "  p = p * r + 0x1.6c16c2p-10f;\n" \
    "  p = p * r + 0x1.111112p-7f;\n" \
    "  p = p * r + 0x1.555556p-5f;\n" \
    "  p = p * r + 0x1.555556p-3f;\n" \
    "  p = p * r + 0.5f;\n" \
    "  p = p * r * r + r;\n" \
    "  float s = kbf32((uint32_t)((int32_t)n + 127) << 23);\n" \
    "  float e = p * s + (s - 1.0f);\n" \
    "  e = a != a ? a : e;\n" \
    "  float t = e / (e + 2.0f);\n" \
    "  return kbf32(kf32bits(t) | (kf32bits(x) & 0x80000000u));\n" \
    "}\n" \
    "KI float klogisticf(float x) {\n" \
    "  float e = kexpf(-fabsf(x));\n" \
    "  return (x >= 0 ? 1.0f : e) / (1.0f + e);\n" \
    "}\n" \
    "KI float kerff(float x) {\n" \
    "  float a = fabsf(x), z = a * a;\n" \
    "  float p = -0x1.4383e6p-17f;\n" \
    "  p = p * z + 0x1.d82684p-14f;\n" \
    "  p = p * z + -0x1.bcbe98p-11f;\n" \
    "  p = p * z + 0x1.5628eep-8f;\n" \
    "  p = p * z + -0x1.b829a8p-6f;\n" \
    "  p = p * z + 0x1.ce2f08p-4f;\n" \
    "  p = p * z + -0x1.812746p-2f;\n" \
    "  p = p * z + 0x1.20dd76p+0f;\n" \
    "  float small = a * p;\n" \
    "  float b = a > 4.0f ? 4.0f : a < 1.0f ? 1.0f : a;\n" \
    "  float t = 1.0f / b;\n" \
    "  float q = 0x1.f72c4cp-6f;\n" \
    "  q = q * t + -0x1.700556p-3f;\n" \
    "  q = q * t + 0x1.c0b884p-2f;\n" \
    "  q = q * t + -0x1.12e46ap-1f;\n" \
    "  q = q * t + 0x1.e80554p-3f;\n" \
    "  q = q * t + 0x1.d7e5bap-3f;\n" \
    "  q = q * t + -0x1.80e474p-2f;\n" \
    "  q = q * t + 0x1.507d66p-6f;\n" \
    "  q = q * t + 0x1.1fa006p-1f;\n" \
    "  q = q * t + 0x1.fbe460p-14f;\n" \
    "  float big = 1.0f - kexpf(-b * b) * q;\n" \
    "  float r = a < 1.0f ? small : big;\n" \
    "  r = a >= 4.0f ? 1.0f : r;\n" \
    "  r = x != x ? x : r;\n" \
    "  return kbf32(kf32bits(r) | (kf32bits(x) & 0x80000000u));\n" \
    "}\n" \
    KILN__PRELUDE_ROUNDING \
    "\n"
/* clang-format on */

#endif /* KILN_COMPILER_CODEGEN_PRELUDE_BODY_H */
