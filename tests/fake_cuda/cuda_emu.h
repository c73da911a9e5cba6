/* Built into the host emulation of a cubin's CUDA C (test_cuda_fake): the
 * generated source's own head (its typedefs and limits, written for NVRTC)
 * is replaced by this one, which gives host C++ the same vocabulary and
 * makes blockIdx, threadIdx, blockDim and gridDim variables that the fake
 * driver sets before it runs each thread of a launch (kemu_set). */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

struct kemu_dim3 {
  unsigned x, y, z;
};
static kemu_dim3 blockIdx, threadIdx, blockDim, gridDim;
extern "C" __attribute__((visibility("default"))) void kemu_set(unsigned b, unsigned t, unsigned g,
                                                                unsigned bd) {
  blockIdx = {b, 0, 0};
  threadIdx = {t, 0, 0};
  gridDim = {g, 1, 1};
  blockDim = {bd, 1, 1};
}
#define __global__
#define __device__
#define __restrict__ __restrict
#define KI static inline __attribute__((unused))
#define KCLZ64(x) __builtin_clzll((unsigned long long)(x))
static inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
