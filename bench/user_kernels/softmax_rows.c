/* Softmax along the last axis of f32[ROWS,COLS], one block per row
 * (signature "f32[ROWS,COLS] -> f32[ROWS,COLS]; grid=ROWS"; COLS is given
 * with -DCOLS or defaults to 1024): the row's maximum, the sum of
 * exponentials, the quotient, in three passes over a row in cache. A user
 * kernel for bench/bench_user_kernel.py. */
#include <math.h>
#include <stdint.h>

#ifndef COLS
#define COLS 1024
#endif

void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end) {
  const float *x = bufs[0];
  float *out = bufs[1];
  for (int64_t r = begin; r < end; r++) {
    const float *row = x + r * COLS;
    float *o = out + r * COLS;
    float m = row[0];
    for (int j = 1; j < COLS; j++) m = row[j] > m ? row[j] : m;
    float s = 0.0f;
    for (int j = 0; j < COLS; j++) {
      o[j] = expf(row[j] - m);
      s += o[j];
    }
    float inv = 1.0f / s;
    for (int j = 0; j < COLS; j++) o[j] *= inv;
  }
}
