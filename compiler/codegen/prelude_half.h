/* The f16/bf16 block of every target's prelude: emit.h's helpers that load,
 * round and store f16 and bf16 values held in f32 while computed, written
 * (like prelude_body.h, after which it is appended) in the subset of C
 * that both C11 and CUDA C++ accept.
 *
 * Every helper is branch-free, a few integer operations and at most one
 * f32 add, so that GCC vectorizes the elementwise loops that call them
 * (a branch or a floating-point select would keep it from doing so under
 * -ftrapping-math): the selects are integer ones on the bit patterns.
 * Values are rounded at the subnormal quantum by adding and subtracting
 * 0.5f, whose f32 ulp (2^-24) is exactly f16's quantum, so the sum rounds
 * to nearest even at the right bit under the default rounding mode; the
 * same add recovers the subnormal's mantissa from the bits of the sum.
 */
#ifndef KILN_COMPILER_CODEGEN_PRELUDE_HALF_H
#define KILN_COMPILER_CODEGEN_PRELUDE_HALF_H

/* clang-format off */
#define KILN__PRELUDE_HALF \
    "/* f16 and bf16 held in f32 (emit.h) */\n" \
    "KI float kh2f(uint16_t h) {\n" \
    "  uint32_t a = (uint32_t)h & 0x7fffu, s = ((uint32_t)h & 0x8000u) << 16;\n" \
    "  uint32_t r = (a << 13) + 0x38000000u;\n" \
    "  uint32_t sub = kf32bits(kbf32(a | 0x3f000000u) - 0.5f);\n" \
    "  r = a < 0x0400u ? sub : r;\n" \
    "  r = a >= 0x7c00u ? 0x7f800000u : r;\n" \
    "  r = a > 0x7c00u ? 0x7fc00000u : r;\n" \
    "  return kbf32(r | s);\n" \
    "}\n" \
    "KI float kb2f(uint16_t h) {\n" \
    "  uint32_t u = (uint32_t)h << 16;\n" \
    "  return kbf32((u & 0x7fffffffu) > 0x7f800000u ? (u & 0x80000000u) | 0x7fc00000u : u);\n" \
    "}\n" \
    "KI float krhf(float x) {\n" \
    "  uint32_t u = kf32bits(x), s = u & 0x80000000u, e = u & 0x7f800000u;\n" \
    "  e = e < 0x38800000u ? 0x38800000u : e;\n" \
    "  float m = kbf32((e + 0x06800000u) | s);\n" \
    "  uint32_t r = kf32bits((x + m) - m) | s;\n" \
    "  return kbf32((u ^ s) - 0x477ff000u < 0x38001000u ? s | 0x7f800000u : r);\n" \
    "}\n" \
    "KI uint16_t kf2h(float x) {\n" \
    "  uint32_t u = kf32bits(x), a = u & 0x7fffffffu, s = (u >> 16) & 0x8000u;\n" \
    "  uint32_t r = (a - 0x38000000u) >> 13;\n" \
    "  uint32_t sub = kf32bits(kbf32(a) + 0.5f) - 0x3f000000u;\n" \
    "  r = a < 0x38800000u ? sub : r;\n" \
    "  r = a >= 0x47800000u ? 0x7c00u : r;\n" \
    "  r = a > 0x7f800000u ? 0x7e00u : r;\n" \
    "  return (uint16_t)(s | r);\n" \
    "}\n" \
    "KI uint16_t kf2b(float x) {\n" \
    "  uint32_t u = kf32bits(x);\n" \
    "  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) & 0x8000u) | 0x7fc0u : u >> 16);\n" \
    "}\n" \
    "\n"
/* clang-format on */

#endif /* KILN_COMPILER_CODEGEN_PRELUDE_HALF_H */
