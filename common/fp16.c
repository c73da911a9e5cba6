/* IEEE narrow-format conversions by exact scaling: a finite double is split
 * into its binade, divided by the format's quantum there (a power of two, so
 * exact), rounded once with rint() (ties to even in the default mode), and
 * re-encoded. */
#include "common/fp16.h"

#include <math.h>

uint32_t kiln_encode_ieee(double x, int ebits, int mbits) {
  uint32_t sign = signbit(x) ? 1u : 0u;
  uint32_t expmax = (1u << ebits) - 1u;
  uint32_t out_sign = sign << (ebits + mbits);
  if (isnan(x)) return out_sign | (expmax << mbits) | (1u << (mbits - 1));
  double a = fabs(x);
  if (isinf(a)) return out_sign | (expmax << mbits);
  if (a == 0.0) return out_sign;
  int bias = (1 << (ebits - 1)) - 1;
  int emin = 1 - bias;
  int e;
  frexp(a, &e);
  int E = e - 1;                                                    /* a = 1.f * 2^E */
  if (E + bias >= (int)expmax) return out_sign | (expmax << mbits); /* past the top binade */
  int qexp = (E < emin ? emin : E) - mbits;
  double v = ldexp(rint(ldexp(a, -qexp)), qexp); /* rounded value, exact */
  if (v == 0.0) return out_sign;
  if (isinf(v)) return out_sign | (expmax << mbits);
  frexp(v, &e);
  E = e - 1;
  if (E < emin) {
    uint32_t mant = (uint32_t)ldexp(v, -(emin - mbits));
    return out_sign | mant;
  }
  if (E + bias >= (int)expmax) return out_sign | (expmax << mbits);
  uint32_t mant = (uint32_t)(ldexp(v, mbits - E) - ldexp(1.0, mbits));
  return out_sign | ((uint32_t)(E + bias) << mbits) | mant;
}

double kiln_decode_ieee(uint32_t bits, int ebits, int mbits) {
  uint32_t expmax = (1u << ebits) - 1u;
  int sign = (bits >> (ebits + mbits)) & 1u;
  uint32_t ex = (bits >> mbits) & expmax;
  uint32_t mant = bits & ((1u << mbits) - 1u);
  int bias = (1 << (ebits - 1)) - 1;
  double v;
  if (ex == expmax) {
    v = mant ? NAN : INFINITY;
  } else if (ex == 0) {
    v = ldexp((double)mant, 1 - bias - mbits);
  } else {
    v = ldexp((double)(mant | (1u << mbits)), (int)ex - bias - mbits);
  }
  return sign ? -v : v;
}

double kiln_round_to_format(double x, int ebits, int mbits) {
  return kiln_decode_ieee(kiln_encode_ieee(x, ebits, mbits), ebits, mbits);
}

double kiln_f16_to_f64(uint16_t h) { return kiln_decode_ieee(h, 5, 10); }
double kiln_bf16_to_f64(uint16_t h) { return kiln_decode_ieee(h, 8, 7); }
uint16_t kiln_f64_to_f16(double x) { return (uint16_t)kiln_encode_ieee(x, 5, 10); }
uint16_t kiln_f64_to_bf16(double x) { return (uint16_t)kiln_encode_ieee(x, 8, 7); }
