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
 * Each step gets its plan once, at load: the guru interface takes the
 * transformed dims and the batch dims with the step's element strides as
 * they lie in memory, so no layout needs a copy. Plans are made with
 * FFTW_ESTIMATE | FFTW_UNALIGNED on scratch arrays (not touched under
 * ESTIMATE) and run with the new-array execute functions on each run's
 * buffers, which FFTW allows from several threads at once; planning itself
 * is not thread-safe in FFTW and takes a process-wide lock. c2r overwrites
 * its input, so IRFFT (and an operand sharing the result's memory) runs
 * from a copy. FFTW does not normalize: the inverses scale by 1/N after.
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
#define FFTW_ESTIMATE (1U << 6)

typedef void *(*plan_dft_fn)(int, const fftw_iodim64 *, int, const fftw_iodim64 *, void *, void *,
                             int, unsigned);
typedef void *(*plan_r2c_fn)(int, const fftw_iodim64 *, int, const fftw_iodim64 *, void *, void *,
                             unsigned);
typedef void (*exec_fn)(void *, void *, void *);
typedef void (*destroy_fn)(void *);

typedef struct fftw_lib {
  bool ok;
  plan_dft_fn plan_dft;
  plan_r2c_fn plan_r2c, plan_c2r;
  exec_fn exec_dft, exec_r2c, exec_c2r;
  destroy_fn destroy;
} fftw_lib;

static fftw_lib libs[2]; /* [0] double (c128), [1] single (c64) */
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
  void *p[7] = {sym(h, prefix, "plan_guru64_dft"),     sym(h, prefix, "plan_guru64_dft_r2c"),
                sym(h, prefix, "plan_guru64_dft_c2r"), sym(h, prefix, "execute_dft"),
                sym(h, prefix, "execute_dft_r2c"),     sym(h, prefix, "execute_dft_c2r"),
                sym(h, prefix, "destroy_plan")};
  for (int i = 0; i < 7; i++)
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
  l->ok = true; /* the handle stays open for the process's life */
}

static void open_libs(void) {
  const char *off = getenv("KILN_NO_FFTW");
  if (off && *off && strcmp(off, "0") != 0) return;
  open_lib(&libs[0], "libfftw3.so.3", "fftw_");
  open_lib(&libs[1], "libfftw3f.so.3", "fftwf_");
}

/* ---- plans ------------------------------------------------------------------ */

struct kiln__cpu_fft {
  kiln_fft f;
  const fftw_lib *lib; /* NULL: the direct DFT */
  void *plan;
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

static void make_plan(kiln__cpu_fft *p) {
  const kiln_fft *f = &p->f;
  const fftw_lib *l = &libs[f->dtype == KILN_C64 ? 1 : 0];
  if (!l->ok) return;
  fftw_iodim64 dims[KILN_FFT_MAX_NFFT], batch[KILN_FFT_MAX_RANK];
  uint32_t nb = f->rank - f->nfft;
  for (uint32_t d = 0; d < f->rank; d++) {
    fftw_iodim64 io = {(ptrdiff_t)f->len[d], (ptrdiff_t)f->in_strides[d],
                       (ptrdiff_t)f->out_strides[d]};
    if (d < nb)
      batch[d] = io;
    else
      dims[d - nb] = io;
  }
  /* Scratch arrays only for the planner (ESTIMATE does not touch them). */
  void *in = kiln_malloc(p->in_bytes ? p->in_bytes : 16);
  void *out = kiln_malloc(p->out_bytes ? p->out_bytes : 16);
  unsigned flags = FFTW_ESTIMATE | FFTW_UNALIGNED;
  void *plan = NULL;
  if (in && out) {
    pthread_mutex_lock(&plan_mu);
    switch ((kiln_fft_type)f->type) {
    case KILN_FFT_FORWARD:
    case KILN_FFT_INVERSE:
      plan = l->plan_dft((int)f->nfft, dims, (int)nb, batch, in, out,
                         f->type == KILN_FFT_FORWARD ? FFTW_FORWARD : FFTW_BACKWARD, flags);
      break;
    case KILN_FFT_REAL_FORWARD:
      plan = l->plan_r2c((int)f->nfft, dims, (int)nb, batch, in, out, flags);
      break;
    case KILN_FFT_REAL_INVERSE:
      plan = l->plan_c2r((int)f->nfft, dims, (int)nb, batch, in, out, flags);
      break;
    }
    pthread_mutex_unlock(&plan_mu);
  }
  kiln_free(in);
  kiln_free(out);
  if (plan) {
    p->lib = l;
    p->plan = plan;
  }
}

int kiln__cpu_fft_create(const kiln_fft *f, kiln__cpu_fft **out, const char *where,
                         kiln_status *st) {
  pthread_once(&libs_once, open_libs);
  kiln__cpu_fft *p = kiln_calloc(1, sizeof *p);
  if (p == NULL) return kiln_status_set(st, KILN_ENOMEM, where, "out of memory");
  p->f = *f;
  uint64_t c = f->dtype == KILN_C64 ? 8 : 16;
  p->in_bytes = span_bytes(f->in_dims, f->in_strides, f->rank,
                           f->type == KILN_FFT_REAL_FORWARD ? c / 2 : c);
  p->out_bytes = span_bytes(f->out_dims, f->out_strides, f->rank,
                            f->type == KILN_FFT_REAL_INVERSE ? c / 2 : c);
  p->scale = 1;
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
    pthread_mutex_unlock(&plan_mu);
  }
  kiln_free(p);
}

bool kiln__cpu_fft_uses_library(const kiln__cpu_fft *p) { return p->plan != NULL; }

/* ---- running ---------------------------------------------------------------- */

/* Multiplies every result element (both parts of a complex one) by s. */
static void scale_out(const kiln_fft *f, void *out, double s) {
  int64_t idx[KILN_FFT_MAX_RANK] = {0}, n = 1;
  uint32_t r = f->rank;
  for (uint32_t d = 0; d < r; d++) n *= f->out_dims[d];
  bool real = f->type == KILN_FFT_REAL_INVERSE, c64 = f->dtype == KILN_C64;
  int64_t parts = real ? 1 : 2;
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

int kiln__cpu_fft_run(const kiln__cpu_fft *p, const void *in, void *out, kiln_status *st) {
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
  if (f->type == KILN_FFT_REAL_INVERSE || overlap) {
    if ((copy = kiln_malloc(p->in_bytes ? p->in_bytes : 16)) == NULL)
      return kiln_status_set(st, KILN_ENOMEM, "fft", "out of memory for the operand's copy");
    memcpy(copy, in, p->in_bytes);
    src = copy;
  }
  switch ((kiln_fft_type)f->type) {
  case KILN_FFT_FORWARD:
  case KILN_FFT_INVERSE: p->lib->exec_dft(p->plan, src, out); break;
  case KILN_FFT_REAL_FORWARD: p->lib->exec_r2c(p->plan, src, out); break;
  case KILN_FFT_REAL_INVERSE: p->lib->exec_c2r(p->plan, src, out); break;
  }
  kiln_free(copy);
  if (p->scale != 1) scale_out(f, out, p->scale);
  return 0;
}
