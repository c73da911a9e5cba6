/* GELU, tanh form, as gelu.c, with tanh(y) = 1 - 2 / (e^(2y) + 1) through
 * the vectorizable exp below instead of libm's tanhf. */
/* exp for the bench's user kernels in a form GCC vectorizes (libm's expf
 * and tanhf are calls it cannot): x = k ln2 + r with |r| <= ln2/2, e^r by
 * its Taylor series to r^7 (relative error under 2e-7 there), 2^k put into
 * the exponent bits. Inputs are clamped to [-126 ln 2, 127 ln 2]: the
 * results stay finite and normal. */
#include <stdint.h>
#include <string.h>

static inline float fast_expf(float x) {
  /* k = round(x / ln 2): adding 1.5 * 2^23 leaves the rounded integer in
   * the low mantissa bits (for |x| < 2^21; no branch, so the loop
   * vectorizes: GCC will not if-convert float compares under its default
   * -ftrapping-math), then clamped as an integer, x with it */
  float kf = x * 1.4426950408889634f + 12582912.0f;
  int32_t kb;
  memcpy(&kb, &kf, sizeof kb);
  int32_t k = kb - 0x4B400000;
  int32_t lo = -(int32_t)(k < -126), hi = -(int32_t)(k > 127); /* all-ones masks */
  k = (k & ~(lo | hi)) | (-126 & lo) | (127 & hi);
  float xc = (float)k * 0.6931471805599453f;
  int32_t xb, cb;
  memcpy(&xb, &x, sizeof xb);
  memcpy(&cb, &xc, sizeof cb);
  xb = (xb & ~(lo | hi)) | (cb & (lo | hi));
  memcpy(&x, &xb, sizeof x);
  float r = x - (float)k * 0.693145751953125f - (float)k * 1.428606765330187e-06f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits = (k + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end) {
  const float *x = bufs[0];
  float *out = bufs[1];
  const float c = 0.7978845608028654f; /* sqrt(2/pi) */
  for (int64_t i = begin; i < end; i++) {
    float v = x[i];
    float t = 1.0f - 2.0f / (fast_expf(2.0f * c * (v + 0.044715f * v * v * v)) + 1.0f);
    out[i] = 0.5f * v * (1.0f + t);
  }
}
