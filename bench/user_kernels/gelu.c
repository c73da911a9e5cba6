/* GELU, tanh form (jax.nn.gelu(approximate=True)), element-wise over
 * f32[N]: out = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). A user
 * kernel for bench/bench_user_kernel.py. */
#include <math.h>
#include <stdint.h>

void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end) {
  const float *x = bufs[0];
  float *out = bufs[1];
  const float c = 0.7978845608028654f; /* sqrt(2/pi) */
  for (int64_t i = begin; i < end; i++) {
    float v = x[i];
    out[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
  }
}
