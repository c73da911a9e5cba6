/* Hand-written baselines for bench_cpu.py, compiled by the script itself
 * with `cc -O3 -march=native -shared` and called through ctypes, so the
 * baseline gets the best code this machine's compiler makes for it.
 *
 * kiln_bench_triad: the STREAM triad a[i] = b[i] + s * c[i] split over
 * `threads` pthreads (each a contiguous block): three streams of memory,
 * the bandwidth a memory-bound elementwise program can hope for.
 * kiln_bench_sgemm: one direct cblas_sgemm call (row-major, no transposes),
 * what a dot of two matrices costs through OpenBLAS with nothing around it.
 */
#include <cblas.h>
#include <pthread.h>
#include <stdint.h>

typedef struct triad_job {
  float *a;
  const float *b, *c;
  float s;
  int64_t begin, end;
} triad_job;

static void *triad_worker(void *p) {
  triad_job *j = p;
  float *restrict a = j->a;
  const float *restrict b = j->b, *restrict c = j->c;
  const float s = j->s;
  for (int64_t i = j->begin; i < j->end; i++) a[i] = b[i] + s * c[i];
  return NULL;
}

/* A thread that cannot be started has its block done on the caller's. */
void kiln_bench_triad(float *a, const float *b, const float *c, float s, int64_t n, int threads) {
  enum { MAXT = 64 };
  if (threads < 1) threads = 1;
  if (threads > MAXT) threads = MAXT;
  pthread_t tid[MAXT];
  triad_job job[MAXT];
  int started[MAXT] = {0};
  int64_t chunk = (n + threads - 1) / threads;
  chunk = (chunk + 15) & ~(int64_t)15; /* whole cache lines per thread */
  for (int t = 0; t < threads; t++) {
    int64_t lo = t * chunk < n ? t * chunk : n, hi = lo + chunk < n ? lo + chunk : n;
    job[t] = (triad_job){a, b, c, s, lo, hi};
  }
  for (int t = 0; t + 1 < threads; t++)
    if (pthread_create(&tid[t], NULL, triad_worker, &job[t]) == 0)
      started[t] = 1;
    else
      triad_worker(&job[t]);
  triad_worker(&job[threads - 1]);
  for (int t = 0; t + 1 < threads; t++)
    if (started[t]) pthread_join(tid[t], NULL);
}

void kiln_bench_sgemm(int m, int n, int k, const float *a, const float *b, float *c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
}
