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
 * on every load. FFTW_MEASURE (KILN_FFTW_PLANNER=measure) times candidate
 * algorithms at load (0.1-0.5 s per new size on a busy machine) and finds
 * plans up to 30% faster for 1-D lines; they may differ between loads,
 * and so may the last bits of the results, which is why it is opt-in.
 * What it measured is FFTW's wisdom: kept by FFTW for the process, and
 * with KILN_KERNEL_CACHE_DIR set, written to fftw3f.wisdom / fftw3.wisdom
 * there and read by every later process, whose plans then use any
 * measured plan the wisdom holds for their problem (FFTW_WISDOM_ONLY, no
 * timing) and ESTIMATE for the rest, whatever the planner setting. Multi-
 * dim transforms run as passes (below), which ESTIMATE plans well.
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
#include <unistd.h>

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
#define FFTW_WISDOM_ONLY (1U << 21)
#define FFTW_MEASURE 0U

typedef void *(*plan_dft_fn)(int, const fftw_iodim64 *, int, const fftw_iodim64 *, void *, void *,
                             int, unsigned);
typedef void *(*plan_r2c_fn)(int, const fftw_iodim64 *, int, const fftw_iodim64 *, void *, void *,
                             unsigned);
typedef void (*exec_fn)(void *, void *, void *);
typedef void (*destroy_fn)(void *);
typedef int (*align_fn)(const void *);
typedef int (*wisdom_fn)(const char *);

typedef struct fftw_lib {
  bool ok;
  plan_dft_fn plan_dft;
  plan_r2c_fn plan_r2c, plan_c2r;
  exec_fn exec_dft, exec_r2c, exec_c2r;
  destroy_fn destroy;
  align_fn alignment_of;
  wisdom_fn import_wisdom, export_wisdom; /* optional: NULL when absent */
  char wisdom[4096];                      /* its wisdom file; "": none */
  bool wisdom_new;                        /* measured plans not saved yet */
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
  void *w[2] = {sym(h, prefix, "import_wisdom_from_filename"),
                sym(h, prefix, "export_wisdom_to_filename")};
  if (w[0] && w[1]) {
    memcpy(&l->import_wisdom, &w[0], sizeof w[0]);
    memcpy(&l->export_wisdom, &w[1], sizeof w[1]);
  }
  l->ok = true; /* the handle stays open for the process's life */
}

/* Wisdom (FFTW's record of the plans it measured) in the kernel cache
 * directory, one file per precision: read at open, so that every plan
 * measured once, by any process, is had for free afterwards. */
static void open_wisdom(fftw_lib *l, const char *file) {
  const char *dir = getenv("KILN_KERNEL_CACHE_DIR");
  if (!l->ok || !l->import_wisdom || dir == NULL || *dir == '\0') return;
  int n = snprintf(l->wisdom, sizeof l->wisdom, "%s/%s", dir, file);
  if (n < 0 || (size_t)n >= sizeof l->wisdom) {
    l->wisdom[0] = '\0';
    return;
  }
  l->import_wisdom(l->wisdom); /* 0 when there is none yet or it is stale */
}

/* Writes the process's wisdom to l's file when plans were measured: to a
 * temporary name, then renamed over it, so that a reader never sees half
 * a file. Under plan_mu. */
static void save_wisdom(fftw_lib *l) {
  if (!l->wisdom_new || l->wisdom[0] == '\0') return;
  l->wisdom_new = false;
  char tmp[4160];
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", l->wisdom, (long)getpid());
  if (l->export_wisdom(tmp) && rename(tmp, l->wisdom) == 0) return;
  remove(tmp);
}

static void open_libs(void) {
  const char *off = getenv("KILN_NO_FFTW");
  if (off && *off && strcmp(off, "0") != 0) return;
  const char *pl = getenv("KILN_FFTW_PLANNER");
  if (pl && strcmp(pl, "measure") == 0) planner = FFTW_MEASURE;
  open_lib(&libs[0], "libfftw3.so.3", "fftw_");
  open_lib(&libs[1], "libfftw3f.so.3", "fftwf_");
  open_wisdom(&libs[0], "fftw3.wisdom");
  open_wisdom(&libs[1], "fftw3f.wisdom");
}

/* After plans for f were made: with FFTW_MEASURE they may have taught
 * the planner something, which goes to the wisdom file. Under plan_mu. */
static void measured(const kiln_fft *f) {
  fftw_lib *l = &libs[f->dtype == KILN_C64 ? 1 : 0];
  if (planner != FFTW_MEASURE) return;
  l->wisdom_new = true;
  save_wisdom(l);
}

/* The planner flags to try first: the configured planner, or by default a
 * measured plan that wisdom already holds (FFTW_WISDOM_ONLY: NULL when it
 * holds none, and then FFTW_ESTIMATE). */
static unsigned first_flags(void) {
  return planner == FFTW_MEASURE ? FFTW_MEASURE : FFTW_MEASURE | FFTW_WISDOM_ONLY;
}

/* out = CALL, CALL naming its flags FL: first with first_flags(), then,
 * if that gave no plan, with the configured planner. */
#define PLAN_BEST(out, CALL) \
  do { \
    unsigned FL = first_flags(); \
    if ((out = (CALL)) == NULL && FL != planner) { \
      FL = planner; \
      out = (CALL); \
    } \
  } while (0)

/* ---- plans ------------------------------------------------------------------ */

/* One FFTW plan of the pass form for arrays of the planned alignment
 * (SIMD) and one for any arrays. */
typedef struct fplan {
  void *al, *un;
  int align_in, align_out; /* fftw_alignment_of the planned arrays */
} fplan;

/* A column pass (the pass form, below): 1-D transforms of length n down
 * one dim of a dense row-major complex array, outer x n x inner elements,
 * done V columns at a time through a transposed scratch block. */
typedef struct col_pass {
  int64_t n, inner, outer;
  int64_t v, vtail;       /* columns of a block, and of the last block of a row (0: as v) */
  void *plan, *plan_tail; /* v (vtail) contiguous lines of n, scratch to scratch */
  double scale;           /* applied as the block is written back (1: none) */
} col_pass;

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
  /* The pass form (nfft >= 2, dense row-major operand and result): a line
   * pass over the contiguous last dim and a column pass per other
   * transformed dim; plan and plan_unaligned are then NULL. */
  bool passes;
  fplan line, line_tail;               /* per_rows lines, and the last chunk's */
  int64_t rows, per_rows;              /* lines of the line pass; per chunk */
  uint64_t line_in, line_out;          /* bytes between lines */
  col_pass col[KILN_FFT_MAX_NFFT - 1]; /* in the order they run */
  uint32_t ncol;
  uint64_t work_bytes; /* IRFFT: the complex array the columns run on */
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
    p->plan = NULL;
    if (keep) PLAN_BEST(p->plan, plan_one(f, l, in, out, FL | keep));
    p->plan_unaligned =
        keep ? plan_one(f, l, in, out, FFTW_ESTIMATE | FFTW_UNALIGNED | keep) : NULL;
    p->keeps_input = keep && p->plan && p->plan_unaligned;
    if (!p->keeps_input) {
      if (p->plan) l->destroy(p->plan);
      if (p->plan_unaligned) l->destroy(p->plan_unaligned);
      PLAN_BEST(p->plan, plan_one(f, l, in, out, FL));
      p->plan_unaligned = plan_one(f, l, in, out, FFTW_ESTIMATE | FFTW_UNALIGNED);
    }
    p->align_in = l->alignment_of(in);
    p->align_out = l->alignment_of(out);
    measured(f);
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

/* ---- the pass form ---------------------------------------------------------
 *
 * FFTW_ESTIMATE plans a multi-dim transform well along the contiguous last
 * dim but poorly down the others: it loops over the columns one at a time,
 * each a transform with a large stride (a 16 x 256 x 256 c64 fft2 ran 8x
 * slower than the FFTW_MEASURE plan, which takes ~0.3 s to find). So when
 * the operand and result are dense row-major (what JAX gives), a transform
 * of two or three dims runs as passes, the way pocketfft and ducc do: the
 * line pass, 1-D transforms of the contiguous last dim (c2c, r2c or c2r)
 * from one plan over a chunk of lines; then, for every other transformed
 * dim, a column pass that copies V columns at a time (64 bytes of each
 * row) into a transposed scratch block, runs V contiguous 1-D transforms
 * there and copies them back. Every block is in cache, and ESTIMATE plans
 * of contiguous lines are close to MEASURE's. The inverses' 1/N is applied
 * as a column pass writes back (the first one of an IRFFT, whose columns
 * run before its c2r lines, on a complex copy of the operand). Chunks of
 * lines and of blocks go to the pool; each chunk's blocks run in order
 * through the same plans, so results do not depend on the split. */

#define PASS_CHUNKS 16

static bool dense_row_major(const int64_t *dims, const int64_t *st, uint32_t r) {
  int64_t acc = 1;
  for (uint32_t d = r; d-- > 0;) {
    if (dims[d] != 1 && st[d] != acc) return false;
    acc *= dims[d];
  }
  return true;
}

static int fft_sign(const kiln_fft *f) {
  return f->type == KILN_FFT_FORWARD || f->type == KILN_FFT_REAL_FORWARD ? FFTW_FORWARD
                                                                         : FFTW_BACKWARD;
}

/* count lines of the last dim, in to out. Under plan_mu. */
static void *plan_lines(const kiln_fft *f, const fftw_lib *l, int64_t count, void *in, void *out,
                        unsigned flags) {
  uint32_t r = f->rank;
  fftw_iodim64 dim = {(ptrdiff_t)f->len[r - 1], 1, 1};
  fftw_iodim64 many = {(ptrdiff_t)count, (ptrdiff_t)f->in_dims[r - 1],
                       (ptrdiff_t)f->out_dims[r - 1]};
  switch ((kiln_fft_type)f->type) {
  case KILN_FFT_FORWARD:
  case KILN_FFT_INVERSE: return l->plan_dft(1, &dim, 1, &many, in, out, fft_sign(f), flags);
  case KILN_FFT_REAL_FORWARD: return l->plan_r2c(1, &dim, 1, &many, in, out, flags);
  case KILN_FFT_REAL_INVERSE: return l->plan_c2r(1, &dim, 1, &many, in, out, flags);
  }
  return NULL;
}

/* Both plans of count lines. Under plan_mu. */
static bool make_fplan(const kiln__cpu_fft *p, const fftw_lib *l, int64_t count, fplan *fp) {
  const kiln_fft *f = &p->f;
  uint64_t ib = (uint64_t)count * p->line_in, ob = (uint64_t)count * p->line_out;
  void *in = aligned(ib), *out = aligned(ob);
  if (in && out) {
    PLAN_BEST(fp->al, plan_lines(f, l, count, in, out, FL));
    fp->un = plan_lines(f, l, count, in, out, FFTW_ESTIMATE | FFTW_UNALIGNED);
    fp->align_in = l->alignment_of(in);
    fp->align_out = l->alignment_of(out);
  }
  free(in);
  free(out);
  return fp->al && fp->un;
}

static uint64_t complex_bytes(const kiln_fft *f) { return f->dtype == KILN_C64 ? 8 : 16; }

/* v contiguous lines of n complex, scratch to scratch. Under plan_mu. */
static void *plan_block(const kiln_fft *f, const fftw_lib *l, int64_t n, int64_t v) {
  uint64_t bytes = (uint64_t)(n * v) * complex_bytes(f);
  void *a = aligned(bytes), *b = aligned(bytes), *plan = NULL;
  if (a && b) {
    fftw_iodim64 dim = {(ptrdiff_t)n, 1, 1}, many = {(ptrdiff_t)v, (ptrdiff_t)n, (ptrdiff_t)n};
    PLAN_BEST(plan, l->plan_dft(1, &dim, 1, &many, a, b, fft_sign(f), FL));
  }
  free(a);
  free(b);
  return plan;
}

static void destroy_passes(kiln__cpu_fft *p, const fftw_lib *l) {
  void *all[4 + 2 * (KILN_FFT_MAX_NFFT - 1)] = {p->line.al, p->line.un, p->line_tail.al,
                                                p->line_tail.un};
  for (uint32_t c = 0; c < p->ncol; c++) {
    all[4 + 2 * c] = p->col[c].plan;
    all[5 + 2 * c] = p->col[c].plan_tail;
  }
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    if (all[i]) l->destroy(all[i]);
  memset(&p->line, 0, sizeof p->line);
  memset(&p->line_tail, 0, sizeof p->line_tail);
  memset(p->col, 0, sizeof p->col);
}

/* The pass form's plans, if the step has that form; false: use the guru
 * plan (make_plan). */
static bool make_passes(kiln__cpu_fft *p) {
  const kiln_fft *f = &p->f;
  uint32_t r = f->rank, nb = r - f->nfft;
  const fftw_lib *l = &libs[f->dtype == KILN_C64 ? 1 : 0];
  if (!l->ok || f->nfft < 2 || !dense_row_major(f->in_dims, f->in_strides, r) ||
      !dense_row_major(f->out_dims, f->out_strides, r))
    return false;
  uint64_t c = complex_bytes(f);
  bool real_in = f->type == KILN_FFT_REAL_FORWARD, real_out = f->type == KILN_FFT_REAL_INVERSE;
  /* The complex array the columns run on: the result's, or for IRFFT the
   * operand's dims (the half spectrum). */
  const int64_t *w = real_out ? f->in_dims : f->out_dims;
  p->rows = 1;
  for (uint32_t d = 0; d + 1 < r; d++) p->rows *= f->len[d];
  if (p->rows == 0) return false;
  p->per_rows = (p->rows + PASS_CHUNKS - 1) / PASS_CHUNKS;
  p->line_in = (uint64_t)f->in_dims[r - 1] * (real_in ? c / 2 : c);
  p->line_out = (uint64_t)f->out_dims[r - 1] * (real_out ? c / 2 : c);
  p->work_bytes = real_out ? (uint64_t)p->rows * (uint64_t)w[r - 1] * c : 0;
  int64_t v = (int64_t)(64 / c);
  pthread_mutex_lock(&plan_mu);
  bool ok = make_fplan(p, l, p->per_rows, &p->line);
  int64_t tail = p->rows % p->per_rows;
  if (ok && tail) ok = make_fplan(p, l, tail, &p->line_tail);
  /* Column passes, innermost dim first; IRFFT's run before its lines. */
  p->ncol = 0;
  for (uint32_t d = r - 1; ok && d-- > nb;) {
    col_pass *cp = &p->col[p->ncol++];
    cp->n = w[d];
    cp->inner = 1;
    cp->outer = 1;
    for (uint32_t k = d + 1; k < r; k++) cp->inner *= w[k];
    for (uint32_t k = 0; k < d; k++) cp->outer *= w[k];
    cp->v = cp->inner < v ? cp->inner : v;
    cp->vtail = cp->inner % cp->v;
    cp->scale = 1;
    cp->plan = plan_block(f, l, cp->n, cp->v);
    if (cp->vtail) cp->plan_tail = plan_block(f, l, cp->n, cp->vtail);
    ok = cp->plan && (!cp->vtail || cp->plan_tail);
  }
  if (!ok) destroy_passes(p, l);
  measured(f);
  pthread_mutex_unlock(&plan_mu);
  if (!ok) return false;
  if (p->scale != 1) p->col[real_out ? 0 : p->ncol - 1].scale = p->scale;
  p->passes = true;
  p->lib = l;
  return true;
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
  if (!make_passes(p)) make_plan(p);
  *out = p;
  return 0;
}

void kiln__cpu_fft_destroy(kiln__cpu_fft *p) {
  if (p == NULL) return;
  if (p->plan || p->passes) {
    pthread_mutex_lock(&plan_mu);
    if (p->passes) {
      destroy_passes(p, p->lib);
    } else {
      p->lib->destroy(p->plan);
      p->lib->destroy(p->plan_unaligned);
    }
    pthread_mutex_unlock(&plan_mu);
  }
  kiln_free(p);
}

bool kiln__cpu_fft_uses_library(const kiln__cpu_fft *p) { return p->plan != NULL || p->passes; }

bool kiln__cpu_fft_uses_passes(const kiln__cpu_fft *p) { return p->passes; }

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

/* ---- running the pass form ---------------------------------------------- */

static void exec_plan(const kiln__cpu_fft *p, void *plan, void *in, void *out) {
  switch ((kiln_fft_type)p->f.type) {
  case KILN_FFT_FORWARD:
  case KILN_FFT_INVERSE: p->lib->exec_dft(plan, in, out); break;
  case KILN_FFT_REAL_FORWARD: p->lib->exec_r2c(plan, in, out); break;
  case KILN_FFT_REAL_INVERSE: p->lib->exec_c2r(plan, in, out); break;
  }
}

typedef struct line_job {
  const kiln__cpu_fft *p;
  char *in, *out;
} line_job;

static void line_chunk(void *ctx, uint64_t c) {
  const line_job *j = ctx;
  const kiln__cpu_fft *p = j->p;
  int64_t lo = (int64_t)c * p->per_rows;
  const fplan *fp = p->rows - lo < p->per_rows ? &p->line_tail : &p->line;
  char *in = j->in + (uint64_t)lo * p->line_in, *out = j->out + (uint64_t)lo * p->line_out;
  bool same =
      p->lib->alignment_of(in) == fp->align_in && p->lib->alignment_of(out) == fp->align_out;
  exec_plan(p, same ? fp->al : fp->un, in, out);
}

/* Copies v columns of n complex (T: float or double parts) at src, rows
 * `inner` elements apart, into v contiguous lines at a, and back from b
 * times s. */
#define GATHER_SCATTER(T, NAME) \
  static void gather_##NAME(const T *src, int64_t inner, int64_t n, int64_t v, T *a) { \
    for (int64_t k = 0; k < n; k++) { \
      const T *row = src + 2 * k * inner; \
      for (int64_t q = 0; q < v; q++) { \
        a[2 * (q * n + k)] = row[2 * q]; \
        a[2 * (q * n + k) + 1] = row[2 * q + 1]; \
      } \
    } \
  } \
  static void scatter_##NAME(const T *b, int64_t inner, int64_t n, int64_t v, T s, T *dst) { \
    for (int64_t k = 0; k < n; k++) { \
      T *row = dst + 2 * k * inner; \
      if (s == 1) \
        for (int64_t q = 0; q < v; q++) { \
          row[2 * q] = b[2 * (q * n + k)]; \
          row[2 * q + 1] = b[2 * (q * n + k) + 1]; \
        } \
      else \
        for (int64_t q = 0; q < v; q++) { \
          row[2 * q] = b[2 * (q * n + k)] * s; \
          row[2 * q + 1] = b[2 * (q * n + k) + 1] * s; \
        } \
    } \
  }
GATHER_SCATTER(float, f)
GATHER_SCATTER(double, d)
#undef GATHER_SCATTER

typedef struct col_job {
  const kiln__cpu_fft *p;
  const col_pass *cp;
  const char *src;
  char *dst;
  char *scratch;  /* two blocks per chunk */
  uint64_t block; /* bytes of one */
  int64_t nblocks, per;
} col_job;

static void col_chunk(void *ctx, uint64_t c) {
  const col_job *j = ctx;
  const col_pass *cp = j->cp;
  bool c64 = j->p->f.dtype == KILN_C64;
  char *a = j->scratch + 2 * c * j->block, *b = a + j->block;
  int64_t nblk = (cp->inner + cp->v - 1) / cp->v, lo = (int64_t)c * j->per;
  int64_t hi = lo + j->per < j->nblocks ? lo + j->per : j->nblocks;
  for (int64_t i = lo; i < hi; i++) {
    int64_t o = i / nblk, c0 = i % nblk * cp->v;
    int64_t v = cp->inner - c0 < cp->v ? cp->inner - c0 : cp->v;
    int64_t at = o * cp->n * cp->inner + c0; /* complex elements */
    void *plan = v == cp->v ? cp->plan : cp->plan_tail;
    if (c64) {
      gather_f((const float *)j->src + 2 * at, cp->inner, cp->n, v, (float *)a);
      j->p->lib->exec_dft(plan, a, b);
      scatter_f((const float *)b, cp->inner, cp->n, v, (float)cp->scale, (float *)j->dst + 2 * at);
    } else {
      gather_d((const double *)j->src + 2 * at, cp->inner, cp->n, v, (double *)a);
      j->p->lib->exec_dft(plan, a, b);
      scatter_d((const double *)b, cp->inner, cp->n, v, cp->scale, (double *)j->dst + 2 * at);
    }
  }
}

static void spread(kiln__cpu_pool *pool, kiln__cpu_task_fn fn, void *ctx, uint64_t chunks) {
  if (chunks > 1 && pool && kiln__cpu_pool_threads(pool) > 1)
    kiln__cpu_pool_run(pool, fn, ctx, chunks);
  else
    for (uint64_t c = 0; c < chunks; c++) fn(ctx, c);
}

static int run_cols(const kiln__cpu_fft *p, const col_pass *cp, kiln__cpu_pool *pool,
                    const void *src, void *dst, kiln_status *st) {
  int64_t nblocks = cp->outer * ((cp->inner + cp->v - 1) / cp->v);
  if (nblocks == 0) return 0;
  int64_t chunks = nblocks < PASS_CHUNKS ? nblocks : PASS_CHUNKS;
  col_job j = {p,       cp,
               src,     dst,
               NULL,    (uint64_t)(cp->n * cp->v) * complex_bytes(&p->f),
               nblocks, (nblocks + chunks - 1) / chunks};
  j.block = (j.block + 63) / 64 * 64;
  chunks = (nblocks + j.per - 1) / j.per;
  if ((j.scratch = aligned(2 * (uint64_t)chunks * j.block)) == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "fft", "out of memory for the column blocks");
  spread(pool, col_chunk, &j, (uint64_t)chunks);
  free(j.scratch);
  return 0;
}

static int run_passes(const kiln__cpu_fft *p, kiln__cpu_pool *pool, const void *in, void *out,
                      kiln_status *st) {
  uint64_t line_chunks = (uint64_t)((p->rows + p->per_rows - 1) / p->per_rows);
  int rc = 0;
  if (p->f.type == KILN_FFT_REAL_INVERSE) {
    /* Columns from the operand into a complex copy, then c2r lines (which
     * may overwrite it) into the result. */
    char *work = aligned(p->work_bytes);
    if (work == NULL)
      return kiln_status_set(st, KILN_ENOMEM, "fft", "out of memory for the half spectrum");
    for (uint32_t c = 0; c < p->ncol && rc == 0; c++)
      rc = run_cols(p, &p->col[c], pool, c == 0 ? in : work, work, st);
    line_job lj = {p, work, out};
    if (rc == 0) spread(pool, line_chunk, &lj, line_chunks);
    free(work);
    return rc;
  }
  /* Lines from the operand (a copy if it shares the result's memory)
   * into the result, then the columns there in place. */
  bool overlap = (const char *)in < (const char *)out + p->out_bytes &&
                 (const char *)out < (const char *)in + p->in_bytes;
  void *src = (void *)in, *copy = NULL;
  if (overlap) {
    if ((copy = aligned(p->in_bytes)) == NULL)
      return kiln_status_set(st, KILN_ENOMEM, "fft", "out of memory for the operand's copy");
    memcpy(copy, in, p->in_bytes);
    src = copy;
  }
  line_job lj = {p, src, out};
  spread(pool, line_chunk, &lj, line_chunks);
  free(copy);
  for (uint32_t c = 0; c < p->ncol && rc == 0; c++)
    rc = run_cols(p, &p->col[c], pool, out, out, st);
  return rc;
}

int kiln__cpu_fft_run(const kiln__cpu_fft *p, kiln__cpu_pool *pool, const void *in, void *out,
                      kiln_status *st) {
  const kiln_fft *f = &p->f;
  if (p->passes) return run_passes(p, pool, in, out, st);
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
