/* Unit tests for shape inference (kiln_infer_shape), one table row per case:
 * an HLO snippet added to a common module, the instruction %x it defines,
 * and the expected result: the inferred shape, or "where|message" for an
 * error. Rows marked STRIP have their written result shape removed first,
 * so inference works from operands alone (as the parser needs for
 * instructions written without a shape); KEEP rows keep it, as the verifier
 * does, for ops that read part of their result from it. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"

/* Helper computations every case may call. */
#define COMPS \
  "HloModule t\n" \
  "sum {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n" \
  " ROOT s = f32[] add(a, b)\n}\n" \
  "sum3 {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n" \
  " c = f32[] parameter(2)\n ROOT s = f32[] add(a, b)\n}\n" \
  "mul2 {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n" \
  " ROOT s = f32[] multiply(a, b)\n}\n" \
  "lt {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n" \
  " ROOT r = pred[] compare(a, b), direction=LT\n}\n" \
  "lt2 {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n" \
  " c = s32[] parameter(2)\n d = s32[] parameter(3)\n" \
  " ROOT r = pred[] compare(a, b), direction=LT\n}\n" \
  "ge {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n" \
  " ROOT r = pred[] compare(a, b), direction=GE\n}\n" \
  "argmax {\n av = f32[] parameter(0)\n ai = s32[] parameter(1)\n" \
  " bv = f32[] parameter(2)\n bi = s32[] parameter(3)\n" \
  " gt = pred[] compare(av, bv), direction=GT\n v = f32[] select(gt, av, bv)\n" \
  " i = s32[] select(gt, ai, bi)\n ROOT r = (f32[], s32[]) tuple(v, i)\n}\n" \
  "cond {\n p = (s32[], f32[4]) parameter(0)\n" \
  " i = s32[] get-tuple-element(p), index=0\n n = s32[] constant(10)\n" \
  " ROOT c = pred[] compare(i, n), direction=LT\n}\n" \
  "body {\n p = (s32[], f32[4]) parameter(0)\n" \
  " i = s32[] get-tuple-element(p), index=0\n one = s32[] constant(1)\n" \
  " j = s32[] add(i, one)\n x = f32[4] get-tuple-element(p), index=1\n" \
  " ROOT t = (s32[], f32[4]) tuple(j, x)\n}\n" \
  "neg {\n p = f32[4] parameter(0)\n ROOT n = f32[4] negate(p)\n}\n" \
  "absf {\n p = f32[4] parameter(0)\n ROOT n = f32[4] abs(p)\n}\n"

/* Entry parameters every case may use; cases add their own from 11 on. */
#define PARAMS \
  "ENTRY main {\n f = f32[2,3] parameter(0)\n g = f32[2,3] parameter(1)\n" \
  " i = s32[2,3] parameter(2)\n p = pred[2,3] parameter(3)\n" \
  " s = f32[] parameter(4)\n k = s32[] parameter(5)\n" \
  " c = c64[2,3] parameter(6)\n h = bf16[2,3] parameter(7)\n" \
  " u = u32[2,3] parameter(8)\n v = f32[4] parameter(9)\n" \
  " t = token[] parameter(10)\n"

enum { KEEP = 0, STRIP = 1 };

typedef struct icase {
  const char *body; /* instructions; one is named x */
  int strip;
  const char *want; /* shape, or "where|message" */
} icase;

#define E(msg) "main/x|" msg

static const icase cases[] = {
    /* ---- elementwise unary ---- */
    {"x = f32[2,3] exponential(f)", STRIP, "f32[2,3]"},
    {"x = s32[2,3] exponential(i)", STRIP,
     E("exponential: operand 0 (%i) has type s32[2,3], expected a floating-point or complex type")},
    {"x = f32[2,3] abs(c)", STRIP, "f32[2,3]"},
    {"x = s32[2,3] abs(i)", STRIP, "s32[2,3]"},
    {"x = u32[2,3] abs(u)", STRIP,
     E("abs: operand 0 (%u) has type u32[2,3], expected a signed integer, floating-point or "
       "complex type")},
    {"x = pred[2,3] is-finite(h)", STRIP, "pred[2,3]"},
    {"x = pred[2,3] is-finite(c)", STRIP,
     E("is-finite: operand 0 (%c) has type c64[2,3], expected a floating-point type")},
    {"x = f32[2,3] real(c)", STRIP, "f32[2,3]"},
    {"x = f32[2,3] imag(f)", STRIP, "f32[2,3]"},
    {"x = s32[2,3] real(i)", STRIP,
     E("real: operand 0 (%i) has type s32[2,3], expected a floating-point or complex type")},
    {"x = pred[2,3] not(p)", STRIP, "pred[2,3]"},
    {"x = f32[2,3] not(f)", STRIP,
     E("not: operand 0 (%f) has type f32[2,3], expected pred or an integer type")},
    {"x = s32[2,3] popcnt(i)", STRIP, "s32[2,3]"},
    {"x = f32[2,3] count-leading-zeros(f)", STRIP,
     E("count-leading-zeros: operand 0 (%f) has type f32[2,3], expected an integer type")},
    {"x = pred[2,3] negate(p)", STRIP,
     E("negate: operand 0 (%p) has type pred[2,3], expected an arithmetic type (not pred)")},
    {"x = s32[2,3] negate(i)", STRIP, "s32[2,3]"},
    {"x = u32[2,3] sign(u)", STRIP,
     E("sign: operand 0 (%u) has type u32[2,3], expected a signed integer, floating-point or "
       "complex type")},
    {"x = c64[2,3] floor(c)", STRIP,
     E("floor: operand 0 (%c) has type c64[2,3], expected a floating-point type")},
    {"x = bf16[2,3] tanh(h)", STRIP, "bf16[2,3]"},
    {"tp = (f32[2,3], s32[]) tuple(f, k)\n x = (f32[2,3], s32[]) copy(tp)", STRIP,
     "(f32[2,3], s32[])"},
    {"x = s32[2,3] convert(f)", KEEP, "s32[2,3]"},
    {"x = s32[2,3] convert(f)", STRIP,
     E("convert: the result shape must be written for this op (the new element type)")},
    {"x = (s32[2,3]) convert(f)", KEEP, E("convert: result must be an array, found (s32[2,3])")},
    {"x = s32[2,3] bitcast-convert(f)", KEEP, "s32[2,3]"},
    {"x = s16[2,3,2] bitcast-convert(f)", KEEP, "s16[2,3,2]"},
    {"b = u8[2,4] parameter(11)\n x = u32[2] bitcast-convert(b)", KEEP, "u32[2]"},
    {"x = u64[2] bitcast-convert(u)", KEEP,
     E("bitcast-convert: bitcast from u32[2,3] to u64 needs a last dimension of size 2 (the ratio "
       "of bit widths)")},
    {"x = c64[2,3] bitcast-convert(f)", KEEP,
     E("bitcast-convert: cannot bitcast between complex and real types: f32[2,3] to c64")},
    {"x = f32[2,3] reduce-precision(f), exponent_bits=5, mantissa_bits=10", STRIP, "f32[2,3]"},
    {"x = f32[2,3] reduce-precision(f), exponent_bits=0, mantissa_bits=10", STRIP,
     E("reduce-precision: exponent_bits is 0, expected at least 1")},
    {"x = f32[2,3] reduce-precision(f), mantissa_bits=10", STRIP,
     E("reduce-precision: attribute exponent_bits is missing")},
    {"x = bf16[2,3] stochastic-convert(f, u)", KEEP, "bf16[2,3]"},
    {"x = bf16[2,3] stochastic-convert(f, i)", KEEP,
     E("stochastic-convert: operand 1 (%i) holds the random bits and must be unsigned, found "
       "s32[2,3]")},

    /* ---- elementwise binary ---- */
    {"x = f32[2,3] add(f, g)", STRIP, "f32[2,3]"},
    {"x = f32[2,3] add(f, i)", STRIP,
     E("add: operand 1 (%i) has type s32[2,3] but operand 0 (%f) has type f32[2,3]")},
    {"x = f32[2,3] add(f, v)", STRIP,
     E("add: operand 1 (%v) has shape f32[4] but operand 0 (%f) has shape f32[2,3]")},
    {"x = f32[2,3] add(h, f)", STRIP, "f32[2,3]"},
    {"x = pred[2,3] subtract(p, p)", STRIP,
     E("subtract: operand 0 (%p) has type pred[2,3], expected an arithmetic type (not pred)")},
    {"x = pred[2,3] maximum(p, p)", STRIP, "pred[2,3]"},
    {"x = s32[2,3] atan2(i, i)", STRIP,
     E("atan2: operand 0 (%i) has type s32[2,3], expected a floating-point or complex type")},
    {"x = f32[2,3] shift-left(f, g)", STRIP,
     E("shift-left: operand 0 (%f) has type f32[2,3], expected an integer type")},
    {"x = s32[2,3] shift-right-logical(i, i)", STRIP, "s32[2,3]"},
    {"x = pred[2,3] and(p, p)", STRIP, "pred[2,3]"},
    {"x = f32[2,3] or(f, g)", STRIP,
     E("or: operand 0 (%f) has type f32[2,3], expected pred or an integer type")},
    {"x = s32[2,3] remainder(i, i)", STRIP, "s32[2,3]"},
    {"x = f32[2,3] power(f, g)", STRIP, "f32[2,3]"},
    {"x = pred[2,3] compare(f, g), direction=LT", STRIP, "pred[2,3]"},
    {"x = pred[2,3] compare(f, g), direction=LT, type=TOTALORDER", STRIP, "pred[2,3]"},
    {"x = pred[2,3] compare(i, i), direction=LT, type=FLOAT", STRIP,
     E("compare: comparison type FLOAT does not apply to element type s32")},
    {"x = pred[2,3] compare(f, g)", STRIP, E("compare: attribute direction is missing")},
    {"x = c64[2,3] complex(f, g)", STRIP, "c64[2,3]"},
    {"x = c64[2,3] complex(f, h)", STRIP,
     E("complex: operands must be both f32 or both f64, found f32 and bf16")},

    /* ---- elementwise ternary ---- */
    {"x = f32[2,3] select(p, f, g)", STRIP, "f32[2,3]"},
    {"q = pred[] parameter(11)\n x = f32[2,3] select(q, f, g)", STRIP, "f32[2,3]"},
    {"x = f32[2,3] select(f, f, g)", STRIP,
     E("select: operand 0 (%f) is the predicate and must have type pred, found f32[2,3]")},
    {"x = f32[2,3] select(p, f, i)", STRIP,
     E("select: operand 2 (%i) has type s32[2,3] but operand 1 (%f) has type f32[2,3]")},
    {"q = pred[3] parameter(11)\n x = f32[2,3] select(q, f, g)", STRIP,
     E("select: operand 0 (%q) (the predicate) has shape pred[3] but operand 1 (%f) has shape "
       "f32[2,3]; the predicate must be a scalar or have the same dimensions")},
    {"x = f32[2,3] clamp(s, f, s)", STRIP, "f32[2,3]"},
    {"x = f32[2,3] clamp(f, f, g)", STRIP, "f32[2,3]"},
    {"x = f32[2,3] clamp(v, f, s)", STRIP,
     E("clamp: operand 0 (%v) (a bound) has shape f32[4] but operand 1 (%f) has shape f32[2,3]; "
       "a bound must be a scalar or have the same dimensions")},
    {"x = f32[2,3] clamp(k, f, s)", STRIP,
     E("clamp: operand 0 (%k) has type s32[] but operand 1 (%f) has type f32[2,3]")},

    /* ---- data movement ---- */
    {"x = f32[3,4] broadcast(v), dimensions={1}", KEEP, "f32[3,4]"},
    {"x = f32[3,4] broadcast(v), dimensions={1}", STRIP,
     E("broadcast: the result shape must be written for this op (the broadcast dimensions)")},
    {"x = f32[4,3] broadcast(v), dimensions={1}", KEEP,
     E("broadcast: operand 0 (%v) dimension 0 has size 4 but result dimension 1 has size 3")},
    {"x = f32[4,3] broadcast(v), dimensions={2}", KEEP,
     E("broadcast: dimensions {2}: dimension 2 is out of range for rank 2")},
    {"x = f32[4,3] broadcast(s), dimensions={}", KEEP, "f32[4,3]"},
    {"x = f32[6] reshape(f)", KEEP, "f32[6]"},
    {"x = f32[7] reshape(f)", KEEP,
     E("reshape: operand 0 (%f) has 6 elements but the result f32[7] has 7")},
    {"x = f32[3,2] dynamic-reshape(f, k, k)", KEEP, "f32[3,2]"},
    {"x = f32[3,2] dynamic-reshape(f, k)", KEEP,
     E("dynamic-reshape: the result has rank 2, so 2 size operands are expected, found 1")},
    {"x = f32[3,2] transpose(f), dimensions={1,0}", STRIP, "f32[3,2]"},
    {"x = f32[3,2] transpose(f), dimensions={0,0}", STRIP,
     E("transpose: dimensions {0,0}: dimension 0 appears twice")},
    {"x = f32[2,1] slice(f), slice={[0:2], [1:3:2]}", STRIP, "f32[2,1]"},
    {"x = f32[2,1] slice(f), slice={[0:3], [0:3]}", STRIP,
     E("slice: dimension 0: limit 3 is over the size 2 of operand 0 (%f)")},
    {"x = f32[2,1] slice(f), slice={[0:2], [0:3:0]}", STRIP,
     E("slice: dimension 1: stride 0 must be positive")},
    {"x = f32[2,1] slice(f), slice={[0:2]}", STRIP,
     E("slice: slice has 1 ranges but operand 0 (%f) has rank 2")},
    {"x = f32[1,2] dynamic-slice(f, k, k), dynamic_slice_sizes={1,2}", STRIP, "f32[1,2]"},
    {"ix = s32[2] parameter(11)\n x = f32[1,2] dynamic-slice(f, ix), dynamic_slice_sizes={1,2}",
     STRIP, "f32[1,2]"},
    {"x = f32[3,1] dynamic-slice(f, k, k), dynamic_slice_sizes={3,1}", STRIP,
     E("dynamic-slice: dimension 0: slice size 3 is over the size 2 of operand 0 (%f)")},
    {"x = f32[1,2] dynamic-slice(f, k), dynamic_slice_sizes={1,2}", STRIP,
     E("dynamic-slice: takes 2 start indices (the rank of operand 0), found 1")},
    {"j = s64[] parameter(11)\n x = f32[1,2] dynamic-slice(f, k, j), dynamic_slice_sizes={1,2}",
     STRIP,
     E("dynamic-slice: operand 2 (%j) has type s64[] but operand 1 (%k) has type s32[]; start "
       "indices must have one type")},
    {"x = f32[1,2] dynamic-slice(f, s, s), dynamic_slice_sizes={1,2}", STRIP,
     E("dynamic-slice: operand 1 (%s) is a start index and must be an integer scalar, found "
       "f32[]")},
    {"w = f32[1,3] parameter(11)\n x = f32[2,3] dynamic-update-slice(f, w, k, k)", STRIP,
     "f32[2,3]"},
    {"w = f32[3,3] parameter(11)\n x = f32[2,3] dynamic-update-slice(f, w, k, k)", STRIP,
     E("dynamic-update-slice: dimension 0: the update has size 3, over the size 2 of operand 0 "
       "(%f)")},
    {"x = f32[4,3] concatenate(f, g), dimensions={0}", STRIP, "f32[4,3]"},
    {"x = f32[2,6] concatenate(f, h), dimensions={1}", STRIP, "f32[2,6]"},
    {"x = f32[4,3] concatenate(f, v), dimensions={0}", STRIP,
     E("concatenate: operand 1 (%v) has rank 1 but operand 0 (%f) has rank 2")},
    {"w = f32[3,3] parameter(11)\n x = f32[5,3] concatenate(f, w), dimensions={1}", STRIP,
     E("concatenate: operand 1 (%w) has shape f32[3,3] but operand 0 (%f) has shape f32[2,3]; "
       "only dimension 1 may differ")},
    {"x = f32[4,7] pad(f, s), padding=1_1x0_2_1", STRIP, "f32[4,7]"},
    {"x = f32[4,7] pad(f, s), padding=-3_0x0_0", STRIP,
     E("pad: dimension 0: padding -3_0_0 of size 2 gives a negative size -1")},
    {"x = f32[4,7] pad(f, k), padding=0_0x0_0", STRIP,
     E("pad: operand 1 (%k) has type s32[] but operand 0 (%f) has type f32[2,3]")},
    {"x = f32[2,3] reverse(f), dimensions={1}", STRIP, "f32[2,3]"},
    {"x = f32[2,3] reverse(f), dimensions={2}", STRIP,
     E("reverse: dimensions {2}: dimension 2 is out of range for rank 2")},
    {"x = s32[4,5] iota(), iota_dimension=1", KEEP, "s32[4,5]"},
    {"x = s32[4,5] iota(), iota_dimension=2", KEEP,
     E("iota: iota_dimension 2 is out of range for the result s32[4,5]")},
    {"x = s32[4,5] iota(), iota_dimension=0", STRIP,
     E("iota: the result shape must be written for this op (iota has no operands)")},
    {"x = s32[3,2] bitcast(f)", KEEP, "s32[3,2]"},
    {"x = f32[7] bitcast(f)", KEEP,
     E("bitcast: operand 0 (%f) f32[2,3] has 192 bits of data but the result f32[7] has 224")},
    {"x = s32[] get-dimension-size(f), dimensions={1}", STRIP, "s32[]"},
    {"x = s32[] get-dimension-size(f), dimensions={2}", STRIP,
     E("get-dimension-size: dimensions {2}: dimension 2 is out of range for rank 2")},
    {"x = f32[<=2,3] set-dimension-size(f, k), dimensions={0}", STRIP, "f32[<=2,3]"},
    {"x = f32[<=2,3] set-dimension-size(f, s), dimensions={0}", STRIP,
     E("set-dimension-size: operand 1 (%s) is the size and must be s32[], found f32[]")},

    /* ---- dot and convolution ---- */
    {"x = f32[2,2] dot(f, g), lhs_contracting_dims={1}, rhs_contracting_dims={1}", STRIP,
     "f32[2,2]"},
    {"a = f32[5,2,3] parameter(11)\n b = f32[5,3,4] parameter(12)\n"
     " x = f32[5,2,4] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0},"
     " lhs_contracting_dims={2}, rhs_contracting_dims={1}",
     STRIP, "f32[5,2,4]"},
    {"x = f32[3,3] dot(f, g), lhs_contracting_dims={0}, rhs_contracting_dims={0}", STRIP,
     "f32[3,3]"},
    {"x = f32[2,2] dot(f, g), lhs_contracting_dims={1}, rhs_contracting_dims={0}", STRIP,
     E("dot: lhs contracting dim 1 has size 3 but rhs contracting dim 0 has size 2")},
    {"x = f32[2,2] dot(f, g), lhs_contracting_dims={1}, rhs_contracting_dims={2}", STRIP,
     E("dot: rhs contracting dim 2 is out of range for rank 2")},
    {"x = f32[2,3,3] dot(f, g), lhs_batch_dims={0}, lhs_contracting_dims={1},"
     " rhs_contracting_dims={1}",
     STRIP, E("dot: lhs has 1 batch dims but rhs has 0")},
    {"x = s64[2,2] dot(i, i), lhs_contracting_dims={1}, rhs_contracting_dims={1}", KEEP,
     "s64[2,2]"},
    {"x = s8[2,2] dot(i, i), lhs_contracting_dims={1}, rhs_contracting_dims={1}", KEEP,
     E("dot: result type s8 is narrower than the operand type s32")},
    {"in = f32[1,5,5,2] parameter(11)\n kr = f32[3,3,2,4] parameter(12)\n"
     " x = f32[1,5,5,4] convolution(in, kr), window={size=3x3 pad=1_1x1_1},"
     " dim_labels=b01f_01io->b01f",
     STRIP, "f32[1,5,5,4]"},
    {"in = f32[1,5,5,2] parameter(11)\n kr = f32[3,3,2,4] parameter(12)\n"
     " x = f32[1,4,2,4] convolution(in, kr), window={size=3x3 stride=1x2 rhs_dilate=1x2},"
     " dim_labels=b01f_01io->b01f",
     STRIP, "f32[1,3,1,4]"},
    {"in = f32[1,5,5,2] parameter(11)\n kr = f32[3,3,2,4] parameter(12)\n"
     " x = f32[1,5,5,4] convolution(in, kr), window={size=2x2},"
     " dim_labels=b01f_01io->b01f",
     STRIP,
     E("convolution: window dimension 0 has size 2 but the kernel's spatial dimension 0 has "
       "size 3")},
    {"in = f32[1,5,5,2] parameter(11)\n kr = f32[3,3,2,4] parameter(12)\n"
     " x = f32[1,3,3,4] convolution(in, kr), window={size=3x3}, feature_group_count=2,"
     " dim_labels=b01f_01io->b01f",
     STRIP,
     E("convolution: lhs features 2 / feature_group_count 2 must equal the kernel input features "
       "2")},

    /* ---- reductions ---- */
    {"x = f32[2] reduce(f, s), dimensions={1}, to_apply=sum", STRIP, "f32[2]"},
    {"x = f32[2] reduce(h, s), dimensions={1}, to_apply=sum", STRIP, "f32[2]"},
    {"x = f32[2] reduce(f, s), dimensions={1}, to_apply=sum3", STRIP,
     E("reduce: to_apply %sum3 takes 3 parameters, expected 2")},
    {"x = f32[2] reduce(f, s), dimensions={2}, to_apply=sum", STRIP,
     E("reduce: dimensions {2}: dimension 2 is out of range for rank 2")},
    {"x = f32[2] reduce(f, k), dimensions={1}, to_apply=sum", STRIP,
     E("reduce: init value 0 has type s32[] but to_apply %sum accumulates f32[]")},
    {"x = (f32[2], s32[2]) reduce(f, i, s, k), dimensions={1}, to_apply=argmax", STRIP,
     "(f32[2], s32[2])"},
    {"x = (f32[2], s32[2]) reduce(f, i, s, k), dimensions={1}, to_apply=sum", STRIP,
     E("reduce: to_apply %sum takes 2 parameters, expected 4")},
    {"x = f32[2] reduce(f, s, s), dimensions={1}, to_apply=sum", STRIP,
     E("reduce: takes N inputs and N init values (an even count >= 2), found 3 operands")},
    {"x = f32[2] reduce-window(v, s), window={size=2 stride=2}, to_apply=sum", STRIP, "f32[2]"},
    {"x = f32[3,2] reduce-window(f, s), window={size=1x2 pad=1_0x0_0}, to_apply=sum", STRIP,
     "f32[3,2]"},
    {"x = f32[2] reduce-window(v, s), window={size=0}, to_apply=sum", STRIP,
     E("reduce-window: window dimension 0 has size 0, expected > 0")},
    {"x = f32[2] reduce-window(f, s), window={size=2}, to_apply=sum", STRIP,
     E("reduce-window: the window has 1 dimensions but f32[2,3] has 2")},
    {"src = f32[2] parameter(11)\n x = f32[4] select-and-scatter(v, src, s),"
     " window={size=2 stride=2}, select=ge, scatter=sum",
     STRIP, "f32[4]"},
    {"src = f32[3] parameter(11)\n x = f32[4] select-and-scatter(v, src, s),"
     " window={size=2 stride=2}, select=ge, scatter=sum",
     STRIP,
     E("select-and-scatter: operand 1 (%src) (the source) has shape f32[3] but the windows of "
       "operand 0 (%v) give f32[2]")},
    {"src = f32[2] parameter(11)\n x = f32[4] select-and-scatter(v, src, s),"
     " window={size=2 stride=2}, select=sum, scatter=sum",
     STRIP, E("select-and-scatter: select %sum returns f32[], expected pred[]")},
    {"x = f32[2,3] map(f, g), dimensions={0,1}, to_apply=mul2", STRIP, "f32[2,3]"},
    {"x = f32[2,3] map(f), dimensions={0,1}, to_apply=mul2", STRIP,
     E("map: to_apply %mul2 takes 2 parameters, expected 1")},
    {"x = f32[2,3] sort(f), dimensions={1}, to_apply=lt", STRIP, "f32[2,3]"},
    {"x = (f32[2,3], s32[2,3]) sort(f, i), dimensions={1}, to_apply=lt2", STRIP,
     "(f32[2,3], s32[2,3])"},
    {"x = f32[2,3] sort(f), dimensions={1}, to_apply=sum", STRIP,
     E("sort: comparator %sum returns f32[], expected pred[]")},
    {"x = (f32[2,3], s32[2,3]) sort(f, i), dimensions={1}, to_apply=argmax", STRIP,
     E("sort: comparator %argmax returns (f32[], s32[]), expected pred[]")},

    /* ---- gather, scatter ---- */
    {"op = f32[3,4] parameter(11)\n ix = s32[5,1] parameter(12)\n"
     " x = f32[5,4] gather(op, ix), offset_dims={1}, collapsed_slice_dims={0},"
     " start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}",
     STRIP, "f32[5,4]"},
    {"op = f32[3,4] parameter(11)\n ix = s32[5] parameter(12)\n"
     " x = f32[5,2] gather(op, ix), offset_dims={1}, collapsed_slice_dims={0},"
     " start_index_map={0}, index_vector_dim=1, slice_sizes={1,2}",
     STRIP, "f32[5,2]"},
    {"op = f32[2,3,4] parameter(11)\n ix = s32[2,5,1] parameter(12)\n"
     " x = f32[2,5,4] gather(op, ix), offset_dims={2}, collapsed_slice_dims={1},"
     " start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0},"
     " index_vector_dim=2, slice_sizes={1,1,4}",
     STRIP, "f32[2,5,4]"},
    {"op = f32[2,3,4] parameter(11)\n ix = s32[3,5,1] parameter(12)\n"
     " x = f32[2,5,4] gather(op, ix), offset_dims={2}, collapsed_slice_dims={1},"
     " start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0},"
     " index_vector_dim=2, slice_sizes={1,1,4}",
     STRIP, E("gather: indices batching dim 0 has size 3 but operand batching dim 0 has size 2")},
    {"op = f32[3,4] parameter(11)\n ix = s32[5,1] parameter(12)\n"
     " x = f32[5,4] gather(op, ix), offset_dims={1}, collapsed_slice_dims={0},"
     " start_index_map={0}, index_vector_dim=1, slice_sizes={2,4}",
     STRIP,
     E("gather: dimension 0 is collapsed or batching, so its slice size must be 0 or 1, found 2")},
    {"op = f32[3,4] parameter(11)\n ix = f32[5,1] parameter(12)\n"
     " x = f32[5,4] gather(op, ix), offset_dims={1}, collapsed_slice_dims={0},"
     " start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}",
     STRIP,
     E("gather: operand 1 (%ix) holds the indices and must have an integer type, found f32[5,1]")},
    {"op = f32[3,4] parameter(11)\n ix = s32[5,1] parameter(12)\n up = f32[5,4] parameter(13)\n"
     " x = f32[3,4] scatter(op, ix, up), update_window_dims={1}, inserted_window_dims={0},"
     " scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=sum",
     STRIP, "f32[3,4]"},
    {"op = f32[2,3,4] parameter(11)\n ix = s32[2,5,1] parameter(12)\n"
     " up = f32[2,5,4] parameter(13)\n"
     " x = f32[2,3,4] scatter(op, ix, up), update_window_dims={2}, inserted_window_dims={1},"
     " input_batching_dims={0}, scatter_indices_batching_dims={0},"
     " scatter_dims_to_operand_dims={1}, index_vector_dim=2, to_apply=sum",
     STRIP, "f32[2,3,4]"},
    {"op = f32[3,4] parameter(11)\n ix = s32[5,1] parameter(12)\n up = f32[5,5] parameter(13)\n"
     " x = f32[3,4] scatter(op, ix, up), update_window_dims={1}, inserted_window_dims={0},"
     " scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=sum",
     STRIP,
     E("scatter: operand 2 (%up) window dimension 1 has size 5, over the size 4 of operand "
       "dimension 1")},
    {"op = f32[3,4] parameter(11)\n ix = s32[5,1] parameter(12)\n up = f32[6,4] parameter(13)\n"
     " x = f32[3,4] scatter(op, ix, up), update_window_dims={1}, inserted_window_dims={0},"
     " scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=sum",
     STRIP,
     E("scatter: operand 2 (%up) scatter dimension 0 has size 6 but indices dimension 0 has "
       "size 5")},

    /* ---- linear algebra, fft, topk, batch norm ---- */
    {"x = c64[2,3] fft(c), fft_type=FFT, fft_length={3}", STRIP, "c64[2,3]"},
    {"x = c64[2,2] fft(f), fft_type=RFFT, fft_length={3}", STRIP, "c64[2,2]"},
    {"x = f32[2,4] fft(c), fft_type=IRFFT, fft_length={4}", STRIP, "f32[2,4]"},
    {"x = c64[2,3] fft(f), fft_type=FFT, fft_length={3}", STRIP,
     E("fft: FFT needs a complex operand, found f32[2,3]")},
    {"sq = f32[3,3] parameter(11)\n x = f32[3,3] cholesky(sq), lower=true", STRIP, "f32[3,3]"},
    {"x = f32[2,3] cholesky(f), lower=true", STRIP,
     E("cholesky: operand 0 (%f) (a) f32[2,3] is not square in its two minor dimensions")},
    {"sq = f32[3,3] parameter(11)\n b = f32[3,2] parameter(12)\n"
     " x = f32[3,2] triangular-solve(sq, b), left_side=true, lower=true,"
     " transpose_a=NO_TRANSPOSE",
     STRIP, "f32[3,2]"},
    {"sq = f32[3,3] parameter(11)\n b = f32[3,2] parameter(12)\n"
     " x = f32[3,2] triangular-solve(sq, b), left_side=false, lower=true,"
     " transpose_a=NO_TRANSPOSE",
     STRIP,
     E("triangular-solve: a f32[3,3] and b f32[3,2] do not share the solved dimension "
       "(left_side=false)")},
    {"x = (f32[2,2], s32[2,2]) topk(f), k=2, largest=true", STRIP, "(f32[2,2], s32[2,2])"},
    {"x = (f32[2,4], s32[2,4]) topk(f), k=4, largest=true", STRIP,
     E("topk: k=4 is out of range for the last dimension of f32[2,3]")},
    {"sc = f32[3] parameter(11)\n"
     " x = (f32[2,3], f32[3], f32[3]) batch-norm-training(f, sc, sc), epsilon=0.001,"
     " feature_index=1",
     STRIP, "(f32[2,3], f32[3], f32[3])"},
    {"sc = f32[3] parameter(11)\n"
     " x = f32[2,3] batch-norm-inference(f, sc, sc, sc, sc), epsilon=0.001, feature_index=1",
     STRIP, "f32[2,3]"},
    {"sc = f32[3] parameter(11)\n"
     " x = (f32[2,3], f32[3], f32[3]) batch-norm-grad(f, sc, sc, sc, g), epsilon=0.001,"
     " feature_index=1",
     STRIP, "(f32[2,3], f32[3], f32[3])"},
    {"x = (f32[2,3], f32[3], f32[3]) batch-norm-training(f, v, v), epsilon=0.001,"
     " feature_index=1",
     STRIP,
     E("batch-norm-training: operand 1 (%v) (scale) has shape f32[4], expected a vector with one "
       "entry per feature")},

    /* ---- structure and control flow ---- */
    {"x = f32[2] parameter(11)", STRIP,
     E("parameter: the result shape must be written for this op (a parameter declares its "
       "shape)")},
    {"x = f32[2] constant({1, 2})", STRIP, "f32[2]"},
    {"x = (f32[2,3], s32[]) tuple(f, k)", STRIP, "(f32[2,3], s32[])"},
    {"x = () tuple()", STRIP, "()"},
    {"tp = (f32[2,3], s32[]) tuple(f, k)\n x = s32[] get-tuple-element(tp), index=1", STRIP,
     "s32[]"},
    {"tp = (f32[2,3], s32[]) tuple(f, k)\n x = s32[] get-tuple-element(tp), index=2", STRIP,
     E("get-tuple-element: index 2 is out of range for operand 0 (%tp) with 2 elements")},
    {"x = s32[] get-tuple-element(f), index=0", STRIP,
     E("get-tuple-element: operand 0 (%f) must be a tuple, found f32[2,3]")},
    {"w0 = (s32[], f32[4]) tuple(k, v)\n"
     " x = (s32[], f32[4]) while(w0), condition=cond, body=body",
     STRIP, "(s32[], f32[4])"},
    {"w0 = (s32[], f32[2,3]) tuple(k, f)\n"
     " x = (s32[], f32[4]) while(w0), condition=cond, body=body",
     STRIP,
     E("while: body %body takes (s32[], f32[4]) but operand 0 (%w0) (the initial state) has "
       "shape (s32[], f32[2,3])")},
    {"w0 = (s32[], f32[4]) tuple(k, v)\n"
     " x = (s32[], f32[4]) while(w0), condition=body, body=body",
     STRIP, E("while: condition %body returns (s32[], f32[4]), expected pred[]")},
    {"q = pred[] parameter(11)\n"
     " x = f32[4] conditional(q, v, v), true_computation=neg, false_computation=absf",
     STRIP, "f32[4]"},
    {"x = f32[4] conditional(k, v, v, v), branch_computations={neg, absf, neg}", STRIP, "f32[4]"},
    {"x = f32[4] conditional(s, v, v), branch_computations={neg, absf}", STRIP,
     E("conditional: operand 0 (%s) selects the branch and must be pred[] or s32[], found f32[]")},
    {"x = f32[4] conditional(k, v, f), branch_computations={neg, absf}", STRIP,
     E("conditional: branch 1 %absf takes f32[4] but operand 2 (%f) has shape f32[2,3]")},
    {"x = f32[4] call(v), to_apply=neg", STRIP, "f32[4]"},
    {"x = f32[4] call(f), to_apply=neg", STRIP,
     E("call: to_apply %neg parameter 0 has shape f32[4] but operand 0 (%f) has shape f32[2,3]")},
    {"x = f32[4] call(v, v), to_apply=neg", STRIP,
     E("call: to_apply %neg takes 1 parameters but the instruction has 2 operands")},
    {"x = f32[4] fusion(v), kind=kLoop, calls=neg", STRIP, "f32[4]"},
    {"x = f32[7] custom-call(v), custom_call_target=\"foo\"", KEEP, "f32[7]"},
    {"x = f32[7] custom-call(v), custom_call_target=\"foo\"", STRIP,
     E("custom-call: the result shape must be written for this op (a custom call declares its "
       "result)")},
    {"x = ((f32[4]), f32[4], s32[]) async-start(v), calls=neg", KEEP, "((f32[4]), f32[4], s32[])"},
    {"x = ((f32[4]), f32[4], s32[]) async-start(v), calls=neg", STRIP, "((f32[4]), f32[4])"},
    {"x = ((f32[2,3]), f32[4]) async-start(f), calls=neg", STRIP,
     E("async-start: calls %neg parameter 0 has shape f32[4] but operand 0 (%f) has shape "
       "f32[2,3]")},
    {"st = ((f32[4]), f32[4], s32[]) async-start(v), calls=neg\n"
     " x = ((f32[4]), f32[4], s32[]) async-update(st), calls=neg",
     STRIP, "((f32[4]), f32[4], s32[])"},
    {"st = ((f32[4]), f32[4], s32[]) async-start(v), calls=neg\n"
     " x = f32[4] async-done(st), calls=neg",
     STRIP, "f32[4]"},
    {"x = f32[4] async-done(v), calls=neg", STRIP,
     E("async-done: operand 0 (%v) must be an async-start or async-update, found parameter")},
    {"x = ((f32[2,3]), f32[2,3], u32[]) exponential-start(f)", KEEP,
     "((f32[2,3]), f32[2,3], u32[])"},
    {"x = ((f32[2,3]), f32[2,3]) exponential-start(f)", STRIP, "((f32[2,3]), f32[2,3])"},
    {"st = ((f32[2,3]), f32[2,3], u32[]) exponential-start(f)\n"
     " x = f32[2,3] exponential-done(st)",
     STRIP, "f32[2,3]"},
    {"tp = (f32[2,3], s32[]) tuple(f, k)\n x = (f32[2,3], s32[]) opt-barrier(tp)", STRIP,
     "(f32[2,3], s32[])"},

    /* ---- random numbers ---- */
    {"x = f32[2,3] rng(s, s), distribution=rng_uniform", KEEP, "f32[2,3]"},
    {"x = s32[2,3] rng(k, k), distribution=rng_normal", KEEP,
     E("rng: rng_normal cannot produce s32[2,3]")},
    {"x = f32[2,3] rng(s, s), distribution=rng_uniform", STRIP,
     E("rng: the result shape must be written for this op (the shape of the random array)")},
    {"st = u64[2] parameter(11)\n x = (u64[2], u32[2,3]) rng-bit-generator(st),"
     " algorithm=rng_default",
     KEEP, "(u64[2], u32[2,3])"},
    {"st = u64[2] parameter(11)\n x = (u64[3], u32[2,3]) rng-bit-generator(st),"
     " algorithm=rng_default",
     KEEP, "(u64[2], u32[2,3])"},
    {"x = u64[2] rng-get-and-update-state(), delta=1", STRIP, "u64[2]"},

    /* ---- tokens and side effects ---- */
    {"x = token[] after-all(t, t)", STRIP, "token[]"},
    {"x = token[] after-all()", STRIP, "token[]"},
    {"x = f32[4] add-dependency(v, t)", STRIP, "f32[4]"},
    {"x = f32[4] add-dependency(v, v)", STRIP,
     E("add-dependency: operand 1 (%v) must be a token, found f32[4]")},
    {"x = (f32[4], token[]) infeed(t)", KEEP, "(f32[4], token[])"},
    {"x = (f32[4]) infeed(t)", KEEP, E("infeed: result must be (data, token[]), found (f32[4])")},
    {"x = token[] outfeed(v, t)", STRIP, "token[]"},
    {"x = (f32[4], u32[], token[]) send(v, t), channel_id=1", STRIP, "(f32[4], u32[], token[])"},
    {"sd = (f32[4], u32[], token[]) send(v, t), channel_id=1\n x = token[] send-done(sd),"
     " channel_id=1",
     STRIP, "token[]"},
    {"x = token[] send-done(v), channel_id=1", STRIP,
     E("send-done: operand 0 (%v) must be produced by send, found parameter")},
    {"x = (f32[4], u32[], token[]) recv(t), channel_id=1", KEEP, "(f32[4], u32[], token[])"},
    {"rv = (f32[4], u32[], token[]) recv(t), channel_id=1\n"
     " x = (f32[4], token[]) recv-done(rv), channel_id=1",
     STRIP, "(f32[4], token[])"},
    {"x = (f32[4], f32[4], u32[]) copy-start(v)", STRIP, "(f32[4], f32[4], u32[])"},
    {"cs = (f32[4], f32[4], u32[]) copy-start(v)\n x = f32[4] copy-done(cs)", STRIP, "f32[4]"},
    {"x = u32[] replica-id()", STRIP, "u32[]"},
    {"x = u32[] partition-id()", STRIP, "u32[]"},

    /* ---- collectives ---- */
    {"x = f32[4] all-reduce(v), replica_groups={{0,1}}, to_apply=sum", STRIP, "f32[4]"},
    {"x = (f32[4], f32[2,3]) all-reduce(v, f), replica_groups={}, to_apply=sum", STRIP,
     "(f32[4], f32[2,3])"},
    {"x = s32[2,3] all-reduce(i), replica_groups={}, to_apply=sum", STRIP,
     E("all-reduce: operand 0 (%i) has type s32[2,3] but to_apply %sum reduces f32")},
    {"x = f32[4] all-reduce(v), replica_groups={{0,1},{1,2}}, to_apply=sum", STRIP,
     E("all-reduce: replica_groups: id 1 appears twice")},
    {"x = f32[4] all-reduce-start(v), replica_groups={{0,1}}, to_apply=sum", STRIP, "f32[4]"},
    {"st = f32[4] all-reduce-start(v), replica_groups={{0,1}}, to_apply=sum\n"
     " x = f32[4] all-reduce-done(st)",
     STRIP, "f32[4]"},
    {"x = f32[8] all-gather(v), dimensions={0}, replica_groups={{0,1}}", STRIP, "f32[8]"},
    {"x = f32[2,12] all-gather(f), dimensions={1}, replica_groups=[2,4]<=[8]", STRIP, "f32[2,12]"},
    {"x = f32[8] all-gather(v), dimensions={0}, replica_groups={{0,1},{2}}", STRIP,
     E("all-gather: replica_groups: group 1 has 1 members but group 0 has 2")},
    {"x = f32[8] all-gather(v), dimensions={0}, replica_groups={}", STRIP,
     E("all-gather: the result shape must be written for this op (the group size is not known)")},
    {"x = f32[12] all-gather(v), dimensions={0}, replica_groups={}", KEEP, "f32[12]"},
    {"x = f32[10] all-gather(v), dimensions={0}, replica_groups={}", KEEP,
     E("all-gather: the result f32[10] is not a whole multiple of operand 0 (%v) along dimension "
       "0")},
    {"x = (f32[4], f32[8]) all-gather-start(v), dimensions={0}, replica_groups={{0,1}}", STRIP,
     "(f32[4], f32[8])"},
    {"st = (f32[4], f32[8]) all-gather-start(v), dimensions={0}, replica_groups={{0,1}}\n"
     " x = f32[8] all-gather-done(st)",
     STRIP, "f32[8]"},
    {"x = f32[2] reduce-scatter(v), dimensions={0}, replica_groups={{0,1}}, to_apply=sum", STRIP,
     "f32[2]"},
    {"x = f32[2] reduce-scatter(v), dimensions={0}, replica_groups={{0,1,2}}, to_apply=sum", STRIP,
     E("reduce-scatter: operand 0 (%v) dimension 0 has size 4, not a multiple of the group size "
       "3")},
    {"x = f32[4] all-to-all(v), dimensions={0}, replica_groups={{0,1}}", STRIP, "f32[4]"},
    {"x = (f32[4], f32[4]) all-to-all(v, v), replica_groups={{0,1}}", STRIP, "(f32[4], f32[4])"},
    {"x = f32[4] all-to-all(v), dimensions={0}, replica_groups={{0,1,2}}", STRIP,
     E("all-to-all: operand 0 (%v) dimension 0 has size 4, not a multiple of the group size 3")},
    {"o = s64[2] parameter(11)\n"
     " x = f32[4] ragged-all-to-all(v, v, o, o, o, o), replica_groups={{0,1}}",
     STRIP, "f32[4]"},
    {"x = f32[4] collective-permute(v), source_target_pairs={{0,1},{1,0}}", STRIP, "f32[4]"},
    {"x = f32[4] collective-permute(v), source_target_pairs={{0,1},{0,2}}", STRIP,
     E("collective-permute: source_target_pairs: source 0 appears twice")},
    {"x = (f32[4], f32[4]) collective-permute-start(v), source_target_pairs={{0,1},{1,0}}", STRIP,
     "(f32[4], f32[4])"},
    {"x = (f32[4], f32[4], u32[], u32[]) collective-permute-start(v),"
     " source_target_pairs={{0,1},{1,0}}",
     KEEP, "(f32[4], f32[4], u32[], u32[])"},
    {"st = (f32[4], f32[4]) collective-permute-start(v), source_target_pairs={{0,1},{1,0}}\n"
     " x = f32[4] collective-permute-done(st)",
     STRIP, "f32[4]"},
    {"x = f32[4] collective-broadcast(v), replica_groups={{0,1}}", STRIP, "f32[4]"},
    {"x = (f32[4], f32[2,3]) collective-broadcast(v, f), replica_groups={{0,1}}", STRIP,
     "(f32[4], f32[2,3])"},
    {"o = f32[2] parameter(11)\n"
     " x = f32[4] ragged-all-to-all(v, v, o, o, o, o), replica_groups={{0,1}}",
     STRIP,
     E("ragged-all-to-all: operand 2 (%o) holds offsets or sizes and must have an integer type, "
       "found f32[2]")},
    {"x = f32[8] all-gather-done(v)", STRIP,
     E("all-gather-done: operand 0 (%v) must be produced by all-gather-start, found parameter")},
    {"x = f32[4] copy-done(v)", STRIP,
     E("copy-done: operand 0 (%v) must be produced by copy-start, found parameter")},
    {"x = f32[4] fusion(v, f), kind=kLoop, calls=neg", STRIP, "f32[4]"},
    {"x = f32[4] fusion(), kind=kLoop, calls=neg", STRIP,
     E("fusion: calls %neg takes 1 parameters but the instruction has 0 operands")},
};

enum { NCASES = sizeof cases / sizeof cases[0] };

static kiln_instr *find_instr(kiln_module *m, const char *name) {
  for (uint32_t i = 0; i < m->ninstrs; i++)
    if (strcmp(m->instrs[i]->name, name) == 0 && m->instrs[i]->comp == m->entry)
      return m->instrs[i];
  return NULL;
}

/* Runs one case; returns a heap string: the shape, "where|message", or
 * "PARSE ..." when the snippet itself does not parse. */
static char *run_case(const icase *c) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b, "%s%s %s\n ROOT r = token[] after-all()\n}\n", COMPS PARAMS, "", c->body);
  char *text = kiln_sbuf_detach(&b, NULL);
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_parse_options po = {.no_infer = 1};
  int rc = kiln_module_parse_text(text, strlen(text), "case", &po, &m, &st);
  kiln_free(text);
  kiln_sbuf out = KILN_SBUF_INIT;
  if (rc) {
    kiln_sbuf_printf(&out, "PARSE %s: %s", st.where, st.msg);
    return kiln_sbuf_detach(&out, NULL);
  }
  kiln_instr *x = find_instr(m, "x");
  ck_assert_ptr_nonnull(x);
  if (c->strip) memset(&x->shape, 0, sizeof x->shape); /* dtype KILN_INVALID */
  kiln_arena *a = kiln_arena_create();
  kiln_shape s;
  kiln_status_clear(&st);
  rc = kiln_infer_shape(m, x, a, &s, &st);
  if (rc == 0) {
    ck_assert(st.code == 0);
    kiln_shape_print(&out, &s); /* with layouts: inference must leave none */
  } else {
    ck_assert_int_eq(rc, st.code);
    kiln_sbuf_printf(&out, "%s|%s", st.where, st.msg);
  }
  kiln_arena_destroy(a);
  kiln_module_destroy(m);
  return kiln_sbuf_detach(&out, NULL);
}

START_TEST(test_infer_case) {
  const icase *c = &cases[_i];
  char *got = run_case(c);
  if (strcmp(got, c->want) != 0)
    fprintf(stderr, "case %d: %s\n  want: %s\n  got:  %s\n", _i, c->body, c->want, got);
  ck_assert_str_eq(got, c->want);
  kiln_free(got);
}
END_TEST

/* Error codes: a missing written shape is KILN_EINVAL, a bad module is
 * KILN_EVERIFY. */
START_TEST(test_infer_codes) {
  const char *text = COMPS PARAMS " x = s32[2,3] convert(f)\n y = f32[2,3] add(f, i)\n}\n";
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_parse_options po = {.no_infer = 1};
  ck_assert_int_eq(kiln_module_parse_text(text, strlen(text), "t", &po, &m, &st), 0);
  kiln_arena *a = kiln_arena_create();
  kiln_shape s;
  kiln_instr *x = find_instr(m, "x");
  memset(&x->shape, 0, sizeof x->shape);
  ck_assert_int_eq(kiln_infer_shape(m, x, a, &s, &st), KILN_EINVAL);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_infer_shape(m, find_instr(m, "y"), a, &s, &st), KILN_EVERIFY);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_infer_shape(NULL, x, a, &s, &st), KILN_EINVAL);
  kiln_arena_destroy(a);
  kiln_module_destroy(m);
}
END_TEST

/* Hostile ids never crash inference. */
START_TEST(test_infer_garbage_ids) {
  kiln_module *m = kiln_module_create("m");
  uint32_t c;
  ck_assert_int_eq(kiln_module_add_computation(m, "main", &c), 0);
  m->entry = c;
  kiln_instr *x = kiln_module_add_instr(m, c, KILN_OP_ADD, "x");
  kiln_id ids[2] = {7, 0};
  ck_assert_int_eq(kiln_instr_set_operands(m, x, ids, 2), 0);
  kiln_arena *a = kiln_arena_create();
  kiln_shape s;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_infer_shape(m, x, a, &s, &st), KILN_EVERIFY);
  ck_assert_str_eq(st.msg, "add: operand 0 has id 7, which is not an instruction");
  kiln_instr *w = kiln_module_add_instr(m, c, KILN_OP_WHILE, "w");
  kiln_id one = x->id;
  uint32_t bad[2] = {5, 9};
  kiln_instr_set_operands(m, w, &one, 1);
  kiln_instr_set_called(m, w, bad, 2);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_infer_shape(m, w, a, &s, &st), KILN_EVERIFY);
  ck_assert_str_eq(st.msg, "while: operand 0 (%x) has no valid shape");
  x->shape.dtype = KILN_F32;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_infer_shape(m, w, a, &s, &st), KILN_EVERIFY);
  ck_assert_str_eq(st.msg, "while: condition computation id 5 does not exist (the module has 1)");
  kiln_arena_destroy(a);
  kiln_module_destroy(m);
}
END_TEST

/* domain has no text form the tests can write; build it. */
START_TEST(test_infer_domain) {
  kiln_module *m = kiln_module_create("m");
  uint32_t c;
  ck_assert_int_eq(kiln_module_add_computation(m, "main", &c), 0);
  m->entry = c;
  kiln_instr *p = kiln_module_add_instr(m, c, KILN_OP_PARAMETER, "p");
  int64_t d[2] = {2, 3};
  kiln_shape s;
  ck_assert_int_eq(kiln_shape_make_array(m->arena, &s, KILN_S8, d, 2), 0);
  ck_assert_int_eq(kiln_instr_set_shape(m, p, &s), 0);
  kiln_instr *x = kiln_module_add_instr(m, c, KILN_OP_DOMAIN, "x");
  ck_assert_int_eq(kiln_instr_set_operands(m, x, &p->id, 1), 0);
  kiln_arena *a = kiln_arena_create();
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_infer_shape(m, x, a, &s, &st), 0);
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_shape_print(&b, &s);
  ck_assert_str_eq(kiln_sbuf_str(&b), "s8[2,3]");
  kiln_sbuf_free(&b);
  ck_assert_int_eq(kiln_instr_set_operands(m, x, NULL, 0), 0);
  ck_assert_int_eq(kiln_infer_shape(m, x, a, &s, &st), KILN_EVERIFY);
  ck_assert_str_eq(st.where, "main/x");
  ck_assert_str_eq(st.msg, "domain: takes 1 operands, found 0");
  kiln_arena_destroy(a);
  kiln_module_destroy(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("infer");
  TCase *tc = tcase_create("ops");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_infer_case, 0, NCASES);
  tcase_add_test(tc, test_infer_codes);
  tcase_add_test(tc, test_infer_garbage_ids);
  tcase_add_test(tc, test_infer_domain);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
