/* Exact conversions for the narrow floating-point types (f16, bf16).
 *
 * Values are stored as their bit patterns (uint16_t). Conversions from wider
 * types round to nearest, ties to even, in one step (no double rounding),
 * overflow to infinity, keep NaN a NaN, and produce subnormals where the
 * format has them. This is the rounding XLA applies after every bf16/f16 op.
 */
#ifndef KILN_COMMON_FP16_H
#define KILN_COMMON_FP16_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

double kiln_f16_to_f64(uint16_t h);
double kiln_bf16_to_f64(uint16_t h);
uint16_t kiln_f64_to_f16(double x);
uint16_t kiln_f64_to_bf16(double x);

/* Round a double to a binary IEEE-like format with `ebits` exponent and
 * `mbits` stored mantissa bits (f16: 5,10; bf16: 8,7; f32: 8,23) and return
 * the rounded value as a double. Used to emulate narrow arithmetic. */
double kiln_round_to_format(double x, int ebits, int mbits);

/* Encode/decode such a format's bit pattern (sign, exponent, mantissa). */
uint32_t kiln_encode_ieee(double x, int ebits, int mbits);
double kiln_decode_ieee(uint32_t bits, int ebits, int mbits);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMMON_FP16_H */
