/* GEMM steps through OpenBLAS, split over the device pool.
 *
 * OpenBLAS runs single-threaded (cpu_backend.c sets it); parallelism comes
 * from cutting the batched product into independent pieces: whole batches
 * when there are enough of them, otherwise row blocks of C (or column
 * blocks when C is wide), each one cblas call on a row-major sub-view.
 * Small products run inline: waking the pool would cost more than they do.
 * f32 pieces with few rows skip OpenBLAS's packing (cpu_gemm_small.c);
 * other f32 pieces large enough run oneDNN's sgemm (cpu_gemm_dnnl.c), which
 * was faster than OpenBLAS's on every model shape measured.
 *
 * A step with an epilogue (bias, activation, residual add... of a fusion)
 * runs it on each piece of C right after the piece's cblas call, while the
 * piece is still in this core's cache, instead of in a second pass over C
 * from memory, when the pieces are whole rows or whole batches; a product
 * cut into column blocks runs its epilogue after all of them, split over
 * the pool by rows, C still in cache.
 *
 * Each piece runs with denormals flushed to zero (x86 MXCSR FTZ and DAZ,
 * restored afterwards), as XLA's CPU backend runs: a softmax output full
 * of tiny probabilities otherwise slows sgemm down a hundredfold. Results
 * differ from the interpreter's only where a value is below FLT_MIN.
 */
#include <cblas.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define FLUSH_DENORMALS 1
#endif

#include "executor/cpu/cpu.h"

#define INLINE_FLOPS 2.0e6 /* below this, one thread does it all */
/* The same for products the unpacked tiles take. Measured on an idle
 * 2-core machine: a GRU step's 32x256x256 products (4.2e6 flops) split
 * over both threads ran gru_scan in 18 ms against 23.5 ms on one; under a
 * load of 8 the split lost, which an idle server does not have. */
#define SMALL_INLINE_FLOPS 4.0e6
#define MIN_BLOCK 32 /* rows or columns per piece, at least */

typedef struct gemm_job {
  const kiln_gemm *g;
  const char *a, *b;
  char *c;
  size_t esize;
  int64_t batches_per;   /* batches per chunk when splitting batches */
  int64_t nparts, block; /* pieces per batch and their size along m or n */
  bool split_n;
  const kiln__cpu_epilogue *epi; /* NULL: none */
} gemm_job;

static void gemm_one(const kiln_gemm *g, const void *a, const void *b, void *c, int64_t m,
                     int64_t n) {
  enum CBLAS_TRANSPOSE ta = g->trans_a ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE tb = g->trans_b ? CblasTrans : CblasNoTrans;
  if (m == 0 || n == 0) return;
  if (g->k == 0) { /* no products: C = beta C (and not a NaN-preserving 0 * C) */
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        if (g->dtype == KILN_F32) {
          float *p = (float *)c + i * g->ldc + j;
          *p = g->beta == 0 ? 0.0f : (float)g->beta * *p;
        } else {
          double *p = (double *)c + i * g->ldc + j;
          *p = g->beta == 0 ? 0.0 : g->beta * *p;
        }
      }
    return;
  }
  if (g->dtype == KILN_F32 && !g->trans_b &&
      kiln__cpu_sgemm_small(m, n, g->k, g->trans_a, (float)g->alpha, a, g->lda, b, g->ldb,
                            (float)g->beta, c, g->ldc))
    return;
  if (g->dtype == KILN_F32 &&
      kiln__cpu_sgemm_dnnl(g->trans_a, g->trans_b, m, n, g->k, (float)g->alpha, a, g->lda, b,
                           g->ldb, (float)g->beta, c, g->ldc))
    return;
  if (g->dtype == KILN_F32)
    cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)g->k, (float)g->alpha, a,
                (blasint)g->lda, b, (blasint)g->ldb, (float)g->beta, c, (blasint)g->ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)g->k, g->alpha, a,
                (blasint)g->lda, b, (blasint)g->ldb, g->beta, c, (blasint)g->ldc);
}

/* Batch `bi`, rows [m0, m0+m) and columns [n0, n0+n) of C. */
static void gemm_piece(const gemm_job *j, int64_t bi, int64_t m0, int64_t m, int64_t n0,
                       int64_t n) {
  const kiln_gemm *g = j->g;
  int64_t ao = bi * g->stride_a + (g->trans_a ? m0 : m0 * g->lda);
  int64_t bo = bi * g->stride_b + (g->trans_b ? n0 * g->ldb : n0);
  int64_t co = bi * g->stride_c + m0 * g->ldc + n0;
  gemm_one(g, j->a + (size_t)ao * j->esize, j->b + (size_t)bo * j->esize,
           j->c + (size_t)co * j->esize, m, n);
  /* C is dense when there is an epilogue (checked at load): rows
   * [m0, m0+m) of batch bi are one range of its iterations. */
  if (j->epi && !j->split_n) {
    int64_t first = bi * g->m * g->n + m0 * g->n, u = j->epi->unit;
    j->epi->fn(j->epi->bufs, first / u, (first + m * g->n) / u);
  }
}

static void gemm_chunk_body(const gemm_job *j, uint64_t chunk) {
  const kiln_gemm *g = j->g;
  if (j->nparts == 1) {
    int64_t b0 = (int64_t)chunk * j->batches_per;
    int64_t b1 = b0 + j->batches_per < g->batch ? b0 + j->batches_per : g->batch;
    for (int64_t bi = b0; bi < b1; bi++) gemm_piece(j, bi, 0, g->m, 0, g->n);
    return;
  }
  int64_t bi = (int64_t)chunk / j->nparts, part = (int64_t)chunk % j->nparts;
  int64_t dim = j->split_n ? g->n : g->m, lo = part * j->block;
  int64_t len = dim - lo < j->block ? dim - lo : j->block;
  if (len <= 0) return;
  if (j->split_n)
    gemm_piece(j, bi, 0, g->m, lo, len);
  else
    gemm_piece(j, bi, lo, len, 0, g->n);
}

static void gemm_chunk(void *ctx, uint64_t chunk) {
#ifdef FLUSH_DENORMALS
  unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
  gemm_chunk_body(ctx, chunk);
  _mm_setcsr(csr);
#else
  gemm_chunk_body(ctx, chunk);
#endif
}

/* The epilogue over all of C, after a product cut into column blocks (or
 * one oneDNN ran: cpu_bgemm.c). */
typedef struct epi_job {
  const kiln__cpu_epilogue *epi;
  int64_t chunk, end;
} epi_job;

static void epi_chunk(void *ctx, uint64_t c) {
  const epi_job *j = ctx;
  int64_t b = (int64_t)c * j->chunk, e = j->end - b > j->chunk ? b + j->chunk : j->end;
  j->epi->fn(j->epi->bufs, b, e);
}

void kiln__cpu_gemm_epilogue(kiln__cpu_pool *pool, const kiln_gemm *g,
                             const kiln__cpu_epilogue *epi) {
  int64_t n = g->batch * g->m * g->n / epi->unit, threads = kiln__cpu_pool_threads(pool);
  epi_job j = {.epi = epi, .chunk = (n + threads - 1) / threads, .end = n};
  if (threads == 1 || n < 2) {
    epi->fn(epi->bufs, 0, n);
    return;
  }
  kiln__cpu_pool_run(pool, epi_chunk, &j, (uint64_t)((n + j.chunk - 1) / j.chunk));
}

void kiln__cpu_gemm(kiln__cpu_pool *pool, const kiln_gemm *g, const void *a, const void *b, void *c,
                    const kiln__cpu_epilogue *epi) {
  if (g->batch == 0 || g->m == 0 || g->n == 0) return;
  gemm_job j = {.g = g,
                .a = a,
                .b = b,
                .c = c,
                .esize = kiln_dtype_size(g->dtype),
                .batches_per = 1,
                .nparts = 1,
                .epi = epi};
  int64_t threads = kiln__cpu_pool_threads(pool);
  double flops = 2.0 * (double)g->batch * (double)g->m * (double)g->n * (double)g->k;
  /* The unpacked tiles do a small product in a few tens of microseconds,
   * about what handing half of it to a worker costs on a loaded machine. */
  bool small = g->dtype == KILN_F32 && !g->trans_b && kiln__cpu_sgemm_small_takes(g->m, g->n, g->k);
  if (threads == 1 || flops < (small ? SMALL_INLINE_FLOPS : INLINE_FLOPS)) {
    j.batches_per = g->batch;
    gemm_chunk(&j, 0);
    return;
  }
  uint64_t nchunks;
  if (g->batch >= threads) {
    int64_t want = g->batch < 4 * threads ? g->batch : 4 * threads;
    j.batches_per = (g->batch + want - 1) / want;
    nchunks = (uint64_t)((g->batch + j.batches_per - 1) / j.batches_per);
  } else {
    int64_t parts = (threads + g->batch - 1) / g->batch;
    /* Column pieces each pack only their share of B, which for a wide B
     * costs less than keeping the epilogue in the pieces (measured: an
     * MLP layer, 256 x 1024 x 1024, ran 15% slower cut into rows). */
    j.split_n = g->n > g->m;
    int64_t dim = j.split_n ? g->n : g->m;
    int64_t most = (dim + MIN_BLOCK - 1) / MIN_BLOCK;
    if (parts > most) parts = most;
    j.block = (dim + parts - 1) / parts;
    j.nparts = (dim + j.block - 1) / j.block;
    nchunks = (uint64_t)(g->batch * j.nparts);
  }
  kiln__cpu_pool_run(pool, gemm_chunk, &j, nchunks);
  if (epi && j.split_n) kiln__cpu_gemm_epilogue(pool, g, epi);
}
