/* The FFT step on the cpu backend, through FFTW.
 *
 * FFTW (Debian libfftw3-dev: libfftw3.so.3 for c128, libfftw3f.so.3 for
 * c64) is opened with dlopen at the first plan, not linked: the build
 * needs neither its headers nor its libraries, an executable does not
 * depend on whether the compiling machine had it, and a machine without
 * it still runs every fft, through the direct DFT of
 * compiler/codegen/fft_step.c (correct, O(n^2) per line). The few entry
 * points used are declared here from FFTW's documented ABI (the guru64
 * interface, stable since FFTW 3.2). KILN_NO_FFTW=1 in the environment
 * forces the direct DFT (tests compare the two).
 *
 * Plans are FFTW_ESTIMATE by default: made in microseconds and the same
 * on every load, so results are reproducible bit for bit. FFTW_MEASURE
 * (KILN_FFTW_PLANNER=measure) times candidate algorithms at load: a
 * 16 x 256 x 256 c64 fft2 runs about 3x faster, but its plan takes ~0.1 s
 * per new size and may differ between loads (and so may the last bits of
 * the results), which is why it is not the default.
 *
 * Each step gets its plans once, at load: the guru interface takes the
 * transformed dims and the batch dims with the step's element strides as
 * they lie in memory, so no layout needs a copy. Plans are made with
 * FFTW_ESTIMATE on 64-byte aligned scratch arrays (not touched under
 * ESTIMATE) and run with the new-array execute functions on each run's
 * buffers, which FFTW allows from several threads at once when the new
 * arrays have the planned arrays' alignment (fftw_alignment_of): buffers
 * that do not (a caller's parameter) run through a second plan made with
 * FFTW_UNALIGNED, which gives up SIMD. Planning itself is not thread-safe
 * in FFTW and takes a process-wide lock. When there is a batch, the plans
 * cover one index of the outermost batch dim, and a run spreads those
 * indices over the device's pool in chunks (the same plan for every
 * index, so results do not depend on the split). c2r overwrites
 * its input but for one transformed dim (FFTW_PRESERVE_INPUT), so a
 * multi-dim IRFFT (and an operand sharing the result's memory) runs from a
 * copy. FFTW does not normalize: the inverses scale by 1/N after.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "executor/cpu/cpu.h"

/* ---- FFTW's ABI ----------------------------------------------------------- */

typedef struct fftw_iodim64 {
  ptrdiff_t n, is, os;
} fftw_iodim64;

#define FFTW_FORWARD (-1)
#define FFTW_BACKWARD (+1)
#define FFTW_UNALIGNED (1U << 1)
#define FFTW_PRESERVE_INPUT (1U << 4)
#define FFTW_ESTIMATE (1U << 6)
#define FFTW_MEASURE 0U

typedef void *(*plan_dft_fn)(int, const fftw_iodim64 *, int, const fftw_iodim64 *, void *, void *,
                             int, unsigned);
typedef void *(*plan_r2c_fn)(int, const fftw_iodim64 *, int, const fftw_iodim64 *, void *, void *,
                             unsigned);
typedef void (*exec_fn)(void *, void *, void *);
typedef void (*destroy_fn)(void *);
typedef int (*align_fn)(const void *);

typedef struct fftw_lib {
  bool ok;
  plan_dft_fn plan_dft;
  plan_r2c_fn plan_r2c, plan_c2r;
  exec_fn exec_dft, exec_r2c, exec_c2r;
  destroy_fn destroy;
  align_fn alignment_of;
} fftw_lib;

static fftw_lib libs[2]; /* [0] double (c128), [1] single (c64) */
static unsigned planner = FFTW_ESTIMATE;
static pthread_once_t libs_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t plan_mu = PTHREAD_MUTEX_INITIALIZER;

static void *sym(void *h, const char *prefix, const char *name) {
  char full[64];
  snprintf(full, sizeof full, "%s%s", prefix, name);
  return dlsym(h, full);
}

static void open_lib(fftw_lib *l, const char *file, const char *prefix) {
  void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return;
  void *p[8] = {sym(h, prefix, "plan_guru64_dft"),     sym(h, prefix, "plan_guru64_dft_r2c"),
                sym(h, prefix, "plan_guru64_dft_c2r"), sym(h, prefix, "execute_dft"),
                sym(h, prefix, "execute_dft_r2c"),     sym(h, prefix, "execute_dft_c2r"),
                sym(h, prefix, "destroy_plan"),        sym(h, prefix, "alignment_of")};
  for (int i = 0; i < 8; i++)
    if (p[i] == NULL) {
      dlclose(h);
      return;
    }
  /* POSIX guarantees dlsym's object pointer converts to a function pointer. */
  memcpy(&l->plan_dft, &p[0], sizeof p[0]);
  memcpy(&l->plan_r2c, &p[1], sizeof p[1]);
  memcpy(&l->plan_c2r, &p[2], sizeof p[2]);
  memcpy(&l->exec_dft, &p[3], sizeof p[3]);
  memcpy(&l->exec_r2c, &p[4], sizeof p[4]);
  memcpy(&l->exec_c2r, &p[5], sizeof p[5]);
  memcpy(&l->destroy, &p[6], sizeof p[6]);
  memcpy(&l->alignment_of, &p[7], sizeof p[7]);
  l->ok = true; /* the handle stays open for the process's life */
}

static void open_libs(void) {
  const char *off = getenv("KILN_NO_FFTW");
  if (off && *off && strcmp(off, "0") != 0) return;
  const char *pl = getenv("KILN_FFTW_PLANNER");
  if (pl && strcmp(pl, "measure") == 0) planner = FFTW_MEASURE;
  open_lib(&libs[0], "libfftw3.so.3", "fftw_");
  open_lib(&libs[1], "libfftw3f.so.3", "fftwf_");
}

/* ---- plans ------------------------------------------------------------------ */

struct kiln__cpu_fft {
  kiln_fft f;
  const fftw_lib *lib;          /* NULL: the direct DFT */
  void *plan;                   /* for 64-byte aligned arrays (SIMD) */
  void *plan_unaligned;         /* for any arrays */
  int align_in, align_out;      /* fftw_alignment_of the planned arrays */
  bool keeps_input;             /* c2r planned with FFTW_PRESERVE_INPUT: no copy */
  int64_t outer;                /* indices of the outermost batch dim (1: none) */
  uint64_t in_step, out_step;   /* bytes between them */
  uint64_t in_bytes, out_bytes; /* spans of the operand and result */
  double scale;                 /* 1/N for the inverses, else 1 */
};

static uint64_t span_bytes(const int64_t *dims, const int64_t *st, uint32_t r, uint64_t elem) {
  uint64_t last = 0;
  for (uint32_t d = 0; d < r; d++) {
    if (dims[d] == 0) return 0;
    last += (uint64_t)(dims[d] - 1) * (uint64_t)st[d];
  }
  return (last + 1) * elem;
}

/* One plan on arrays in and out with FFTW flags `flags` (NULL if FFTW
 * takes none). Under plan_mu. */
static void *plan_one(const kiln_fft *f, const fftw_lib *l, void *in, void *out, unsigned flags) {
  fftw_iodim64 dims[KILN_FFT_MAX_NFFT], batch[KILN_FFT_MAX_RANK];
  uint32_t nb = f->rank - f->nfft, first = nb > 0; /* dim 0 of a batch is split by the run */
  for (uint32_t d = first; d < f->rank; d++) {
    fftw_iodim64 io = {(ptrdiff_t)f->len[d], (ptrdiff_t)f->in_strides[d],
                       (ptrdiff_t)f->out_strides[d]};
    if (d < nb)
      batch[d - first] = io;
    else
      dims[d - nb] = io;
  }
  nb -= first;
  switch ((kiln_fft_type)f->type) {
  case KILN_FFT_FORWARD:
  case KILN_FFT_INVERSE:
    return l->plan_dft((int)f->nfft, dims, (int)nb, batch, in, out,
                       f->type == KILN_FFT_FORWARD ? FFTW_FORWARD : FFTW_BACKWARD, flags);
  case KILN_FFT_REAL_FORWARD:
    return l->plan_r2c((int)f->nfft, dims, (int)nb, batch, in, out, flags);
  case KILN_FFT_REAL_INVERSE:
    return l->plan_c2r((int)f->nfft, dims, (int)nb, batch, in, out, flags);
  }
  return NULL;
}

static void *aligned(uint64_t bytes) {
  return aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64 + 64));
}

static void make_plan(kiln__cpu_fft *p) {
  const kiln_fft *f = &p->f;
  const fftw_lib *l = &libs[f->dtype == KILN_C64 ? 1 : 0];
  if (!l->ok) return;
  /* Scratch arrays only for the planner (ESTIMATE does not touch them;
   * MEASURE writes them, which is why they are not the run's buffers). */
  void *in = aligned(p->in_bytes), *out = aligned(p->out_bytes);
  if (in && out) {
    pthread_mutex_lock(&plan_mu);
    /* FFTW keeps a c2r input only for one transformed dim (else NULL) */
    unsigned keep = f->type == KILN_FFT_REAL_INVERSE ? FFTW_PRESERVE_INPUT : 0;
    p->plan = keep ? plan_one(f, l, in, out, planner | keep) : NULL;
    p->plan_unaligned =
        keep ? plan_one(f, l, in, out, FFTW_ESTIMATE | FFTW_UNALIGNED | keep) : NULL;
    p->keeps_input = keep && p->plan && p->plan_unaligned;
    if (!p->keeps_input) {
      if (p->plan) l->destroy(p->plan);
      if (p->plan_unaligned) l->destroy(p->plan_unaligned);
      p->plan = plan_one(f, l, in, out, planner);
      p->plan_unaligned = plan_one(f, l, in, out, FFTW_ESTIMATE | FFTW_UNALIGNED);
    }
    p->align_in = l->alignment_of(in);
    p->align_out = l->alignment_of(out);
    pthread_mutex_unlock(&plan_mu);
  }
  free(in);
  free(out);
  if (p->plan == NULL || p->plan_unaligned == NULL) {
    pthread_mutex_lock(&plan_mu);
    if (p->plan) l->destroy(p->plan);
    if (p->plan_unaligned) l->destroy(p->plan_unaligned);
    pthread_mutex_unlock(&plan_mu);
    p->plan = p->plan_unaligned = NULL;
    return;
  }
  p->lib = l;
}

int kiln__cpu_fft_create(const kiln_fft *f, kiln__cpu_fft **out, const char *where,
                         kiln_status *st) {
  pthread_once(&libs_once, open_libs);
  kiln__cpu_fft *p = kiln_calloc(1, sizeof *p);
  if (p == NULL) return kiln_status_set(st, KILN_ENOMEM, where, "out of memory");
  p->f = *f;
  uint64_t c = f->dtype == KILN_C64 ? 8 : 16;
  p->in_bytes =
      span_bytes(f->in_dims, f->in_strides, f->rank, f->type == KILN_FFT_REAL_FORWARD ? c / 2 : c);
  p->out_bytes = span_bytes(f->out_dims, f->out_strides, f->rank,
                            f->type == KILN_FFT_REAL_INVERSE ? c / 2 : c);
  p->scale = 1;
  p->outer = 1;
  if (f->rank > f->nfft) {
    p->outer = f->len[0];
    p->in_step = (uint64_t)f->in_strides[0] * (f->type == KILN_FFT_REAL_FORWARD ? c / 2 : c);
    p->out_step = (uint64_t)f->out_strides[0] * (f->type == KILN_FFT_REAL_INVERSE ? c / 2 : c);
  }
  if (f->type == KILN_FFT_INVERSE || f->type == KILN_FFT_REAL_INVERSE)
    for (uint32_t d = f->rank - f->nfft; d < f->rank; d++) p->scale /= (double)f->len[d];
  make_plan(p);
  *out = p;
  return 0;
}

void kiln__cpu_fft_destroy(kiln__cpu_fft *p) {
  if (p == NULL) return;
  if (p->plan) {
    pthread_mutex_lock(&plan_mu);
    p->lib->destroy(p->plan);
    p->lib->destroy(p->plan_unaligned);
    pthread_mutex_unlock(&plan_mu);
  }
  kiln_free(p);
}

bool kiln__cpu_fft_uses_library(const kiln__cpu_fft *p) { return p->plan != NULL; }

/* ---- running ---------------------------------------------------------------- */

/* Multiplies every result element (both parts of a complex one) by s. */
static void scale_out(const kiln__cpu_fft *p, void *out, double s) {
  const kiln_fft *f = &p->f;
  int64_t idx[KILN_FFT_MAX_RANK] = {0}, n = 1;
  uint32_t r = f->rank;
  for (uint32_t d = 0; d < r; d++) n *= f->out_dims[d];
  bool real = f->type == KILN_FFT_REAL_INVERSE, c64 = f->dtype == KILN_C64;
  int64_t parts = real ? 1 : 2;
  uint64_t word = c64 ? 4 : 8;
  if (p->out_bytes == (uint64_t)(n * parts) * word) { /* dense: every word is a result part */
    uint64_t words = p->out_bytes / word;
    if (c64) {
      float *o = out, fs = (float)s;
      for (uint64_t i = 0; i < words; i++) o[i] *= fs;
    } else {
      double *o = out;
      for (uint64_t i = 0; i < words; i++) o[i] *= s;
    }
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    int64_t o = 0;
    for (uint32_t d = 0; d < r; d++) o += idx[d] * f->out_strides[d];
    for (int64_t q = 0; q < parts; q++) {
      if (c64)
        ((float *)out)[parts * o + q] *= (float)s;
      else
        ((double *)out)[parts * o + q] *= s;
    }
    for (uint32_t d = r; d-- > 0;) {
      if (++idx[d] < f->out_dims[d]) break;
      idx[d] = 0;
    }
  }
}

typedef struct fft_job {
  const kiln__cpu_fft *p;
  char *in, *out;
  int64_t per; /* outer indices per chunk */
} fft_job;

static void exec_at(const kiln__cpu_fft *p, char *in, char *out) {
  bool same = p->lib->alignment_of(in) == p->align_in && p->lib->alignment_of(out) == p->align_out;
  void *plan = same ? p->plan : p->plan_unaligned;
  switch ((kiln_fft_type)p->f.type) {
  case KILN_FFT_FORWARD:
  case KILN_FFT_INVERSE: p->lib->exec_dft(plan, in, out); break;
  case KILN_FFT_REAL_FORWARD: p->lib->exec_r2c(plan, in, out); break;
  case KILN_FFT_REAL_INVERSE: p->lib->exec_c2r(plan, in, out); break;
  }
}

static void fft_chunk(void *ctx, uint64_t c) {
  const fft_job *j = ctx;
  int64_t lo = (int64_t)c * j->per, hi = lo + j->per < j->p->outer ? lo + j->per : j->p->outer;
  for (int64_t i = lo; i < hi; i++)
    exec_at(j->p, j->in + (uint64_t)i * j->p->in_step, j->out + (uint64_t)i * j->p->out_step);
}

int kiln__cpu_fft_run(const kiln__cpu_fft *p, kiln__cpu_pool *pool, const void *in, void *out,
                      kiln_status *st) {
  const kiln_fft *f = &p->f;
  if (p->plan == NULL) {
    if (kiln_fft_reference(f, in, out) != 0)
      return kiln_status_set(st, KILN_ENOMEM, "fft", "out of memory for the direct DFT");
    return 0;
  }
  /* c2r overwrites its input, and a plan made out of place must run so. */
  bool overlap = (const char *)in < (const char *)out + p->out_bytes &&
                 (const char *)out < (const char *)in + p->in_bytes;
  void *src = (void *)in, *copy = NULL;
  if ((f->type == KILN_FFT_REAL_INVERSE && !p->keeps_input) || overlap) {
    if ((copy = aligned(p->in_bytes)) == NULL)
      return kiln_status_set(st, KILN_ENOMEM, "fft", "out of memory for the operand's copy");
    memcpy(copy, in, p->in_bytes);
    src = copy;
  }
  uint32_t threads = pool ? kiln__cpu_pool_threads(pool) : 1;
  int64_t chunks = p->outer < 4 * (int64_t)threads ? p->outer : 4 * (int64_t)threads;
  fft_job job = {p, src, out, (p->outer + chunks - 1) / chunks};
  chunks = (p->outer + job.per - 1) / job.per;
  if (chunks > 1 && threads > 1)
    kiln__cpu_pool_run(pool, fft_chunk, &job, (uint64_t)chunks);
  else
    for (int64_t c = 0; c < chunks; c++) fft_chunk(&job, (uint64_t)c);
  free(copy);
  if (p->scale != 1) scale_out(p, out, p->scale);
  return 0;
}
