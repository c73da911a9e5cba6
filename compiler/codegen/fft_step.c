/* The fft step (KILN_STEP_FFT): building it from an HLO fft, checking one
 * that came in a blob, and the direct DFT that is its reference semantics
 * and the fallback of a backend without an FFT library.
 *
 * As for convolutions, layouts only say where each logical dimension
 * lives: the step keeps each dimension's size and element stride for the
 * operand and the result, so any layout is the same step, and FFTW's guru
 * interface takes the strides as they are (executor/cpu/cpu_fft.c).
 */
#include <complex.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/lower_internal.h"

/* CMPLX is C11, but clang with glibc does not define it (as in
 * compiler/eval/interp_internal.h). */
#if defined(__clang__) && !defined(CMPLX)
#define CMPLX(x, y) __builtin_complex((double)(x), (double)(y))
#endif

#define MAX_EXTENT ((int64_t)1 << 31)
#define MAX_STRIDE ((int64_t)1 << 40)

static bool in_range(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v < hi; }

static void strides_of(const kiln_shape *s, int64_t *st) {
  int64_t m2m[KILN_FFT_MAX_RANK], acc = 1;
  kiln_shape_minor_to_major(s, m2m);
  for (uint32_t k = 0; k < s->rank; k++) {
    st[m2m[k]] = acc;
    acc *= s->dims[m2m[k]];
  }
}

/* The operand's and result's sizes of dim d given the lengths. */
static void side_dims(const kiln_fft *f, uint32_t d, int64_t *in, int64_t *out) {
  bool last = d + 1 == f->rank;
  *in = f->type == KILN_FFT_REAL_INVERSE && last ? f->len[d] / 2 + 1 : f->len[d];
  *out = f->type == KILN_FFT_REAL_FORWARD && last ? f->len[d] / 2 + 1 : f->len[d];
}

static __int128 span(const int64_t *dims, const int64_t *strides, uint32_t n) {
  __int128 last = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (dims[i] == 0) return 0;
    last += (__int128)(dims[i] - 1) * strides[i];
  }
  return last + 1;
}

/* Bytes of one element of the operand (in) or the result. */
static uint64_t elem_bytes(const kiln_fft *f, bool in) {
  uint64_t c = f->dtype == KILN_C64 ? 8 : 16;
  bool real = in ? f->type == KILN_FFT_REAL_FORWARD : f->type == KILN_FFT_REAL_INVERSE;
  return real ? c / 2 : c;
}

bool kiln_fft_check(const kiln_fft *f, uint64_t in_bytes, uint64_t out_bytes, char *why,
                    size_t nwhy) {
#define NO(...) return snprintf(why, nwhy, __VA_ARGS__), false
  if (f->type > KILN_FFT_REAL_INVERSE) NO("fft type %u (0..3)", f->type);
  if (f->dtype != KILN_C64 && f->dtype != KILN_C128)
    NO("element type %u (c64 or c128 only)", f->dtype);
  if (f->rank < 1 || f->rank > KILN_FFT_MAX_RANK)
    NO("rank %u (1 .. %d)", f->rank, KILN_FFT_MAX_RANK);
  if (f->nfft < 1 || f->nfft > KILN_FFT_MAX_NFFT || f->nfft > f->rank)
    NO("%u transformed dims (1 .. %d, at most the rank %u)", f->nfft, KILN_FFT_MAX_NFFT, f->rank);
  for (uint32_t d = 0; d < f->rank; d++) {
    bool t = d + f->nfft >= f->rank;
    if (!in_range(f->len[d], t ? 1 : 0, MAX_EXTENT))
      NO("dimension %u: length %lld", d, (long long)f->len[d]);
    int64_t wi, wo;
    side_dims(f, d, &wi, &wo);
    if (f->in_dims[d] != wi || f->out_dims[d] != wo)
      NO("dimension %u: operand %lld and result %lld, length %lld gives %lld and %lld", d,
         (long long)f->in_dims[d], (long long)f->out_dims[d], (long long)f->len[d], (long long)wi,
         (long long)wo);
    if (!in_range(f->in_strides[d], 0, MAX_STRIDE) || !in_range(f->out_strides[d], 0, MAX_STRIDE))
      NO("dimension %u: strides %lld and %lld", d, (long long)f->in_strides[d],
         (long long)f->out_strides[d]);
  }
  __int128 ib = span(f->in_dims, f->in_strides, f->rank) * elem_bytes(f, true);
  __int128 ob = span(f->out_dims, f->out_strides, f->rank) * elem_bytes(f, false);
  if (ib > (__int128)in_bytes || ob > (__int128)out_bytes)
    NO("operand spans %llu bytes of %llu, result %llu of %llu", (unsigned long long)ib,
       (unsigned long long)in_bytes, (unsigned long long)ob, (unsigned long long)out_bytes);
  return true;
#undef NO
}

const char *kiln__fft_plan(const kiln_module *m, const kiln_instr *ins, kiln_fft *f) {
  if (ins->noperands != 1) return "needs one operand";
  const kiln_shape *is = &m->instrs[ins->operands[0]]->shape, *os = &ins->shape;
  if (!kiln_shape_is_array(is) || !kiln_shape_is_array(os) || is->dynamic || os->dynamic)
    return "operand and result must be static arrays";
  const char *type = kiln_instr_attr_str(ins, KILN_ATTR_FFT_TYPE);
  const kiln_i64s *len = kiln_instr_attr_ints(ins, KILN_ATTR_FFT_LENGTH);
  int kind = !type                    ? -1
             : !strcmp(type, "FFT")   ? KILN_FFT_FORWARD
             : !strcmp(type, "IFFT")  ? KILN_FFT_INVERSE
             : !strcmp(type, "RFFT")  ? KILN_FFT_REAL_FORWARD
             : !strcmp(type, "IRFFT") ? KILN_FFT_REAL_INVERSE
                                      : -1;
  if (kind < 0) return "fft_type must be FFT, IFFT, RFFT or IRFFT";
  if (is->rank < 1 || is->rank > KILN_FFT_MAX_RANK || os->rank != is->rank)
    return "operand and result ranks must be equal and 1 to 8";
  if (len == NULL || len->n < 1 || len->n > KILN_FFT_MAX_NFFT || len->n > is->rank)
    return "fft_length must give 1 to 3 lengths, no more than the rank";
  kiln_dtype cplx = kind == KILN_FFT_REAL_FORWARD ? os->dtype : is->dtype;
  kiln_dtype real = cplx == KILN_C64 ? KILN_F32 : KILN_F64;
  bool types_ok = cplx == KILN_C64 || cplx == KILN_C128;
  if (kind == KILN_FFT_REAL_FORWARD)
    types_ok = types_ok && is->dtype == real;
  else if (kind == KILN_FFT_REAL_INVERSE)
    types_ok = types_ok && os->dtype == real;
  else
    types_ok = types_ok && os->dtype == is->dtype;
  if (!types_ok) return "element types must be c64/f32 or c128/f64 as the fft_type says";
  memset(f, 0, sizeof *f);
  f->type = (uint32_t)kind;
  f->dtype = cplx;
  f->rank = is->rank;
  f->nfft = (uint32_t)len->n;
  for (uint32_t d = 0; d < f->rank; d++) {
    bool t = d + f->nfft >= f->rank;
    f->len[d] = t ? len->v[d + f->nfft - f->rank] : is->dims[d];
    if (t && f->len[d] < 1) return "fft_length values must be at least 1";
    f->in_dims[d] = is->dims[d];
    f->out_dims[d] = os->dims[d];
  }
  strides_of(is, f->in_strides);
  strides_of(os, f->out_strides);
  int64_t ib = kiln_shape_bytes(is), ob = kiln_shape_bytes(os);
  char why[200];
  if (ib < 0 || ob < 0 || !kiln_fft_check(f, (uint64_t)ib, (uint64_t)ob, why, sizeof why))
    return "operand or result dims do not match fft_length";
  return NULL;
}

/* ---- the direct DFT ----------------------------------------------------- */

/* exp(sign 2 pi i t / n), exact at quarter turns (the interpreter's). */
static double complex twiddle(int sign, int64_t t, int64_t n) {
  if ((4 * t) % n == 0) {
    static const double complex quarter[4] = {1, I, -1, -I};
    int64_t q = (4 * t) / n;
    return quarter[(sign > 0 ? q : 4 - q) % 4];
  }
  return cexp(sign * 2.0 * M_PI * I * (double)t / (double)n);
}

/* In place along dim d of the row-major array x of dims; line is n long. */
static void dft_dim(double complex *x, const int64_t *dims, uint32_t rank, uint32_t d, int sign,
                    double complex *line) {
  int64_t n = dims[d], stride = 1, outer = 1;
  for (uint32_t k = d + 1; k < rank; k++) stride *= dims[k];
  for (uint32_t k = 0; k < d; k++) outer *= dims[k];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t s = 0; s < stride; s++) {
      double complex *p = x + o * n * stride + s;
      for (int64_t k = 0; k < n; k++) {
        double complex acc = 0;
        for (int64_t j = 0; j < n; j++) acc += p[j * stride] * twiddle(sign, (j * k) % n, n);
        line[k] = acc;
      }
      for (int64_t k = 0; k < n; k++) p[k * stride] = line[k];
    }
}

static bool next_index(int64_t *idx, const int64_t *dims, uint32_t r) {
  for (uint32_t d = r; d-- > 0;) {
    if (++idx[d] < dims[d]) return true;
    idx[d] = 0;
  }
  return false;
}

static int64_t offset(const int64_t *idx, const int64_t *st, uint32_t r) {
  int64_t o = 0;
  for (uint32_t d = 0; d < r; d++) o += idx[d] * st[d];
  return o;
}

int kiln_fft_reference(const kiln_fft *f, const void *in, void *out) {
  uint32_t r = f->rank;
  int64_t total = 1, longest = 1;
  for (uint32_t d = 0; d < r; d++) {
    total *= f->len[d];
    if (f->len[d] > longest) longest = f->len[d];
  }
  int64_t outn = 1;
  for (uint32_t d = 0; d < r; d++) outn *= f->out_dims[d];
  if (total == 0 || outn == 0) return 0;
  double complex *x = kiln_calloc((size_t)total, sizeof *x);
  double complex *line = kiln_calloc((size_t)longest, sizeof *line);
  if (x == NULL || line == NULL) {
    kiln_free(x);
    kiln_free(line);
    return KILN_ENOMEM;
  }
  bool c64 = f->dtype == KILN_C64;
  int64_t idx[KILN_FFT_MAX_RANK] = {0};
  for (int64_t i = 0; i < total; i++) {
    if (idx[r - 1] < f->in_dims[r - 1]) {
      int64_t o = offset(idx, f->in_strides, r);
      if (f->type == KILN_FFT_REAL_FORWARD)
        x[i] = c64 ? (double)((const float *)in)[o] : ((const double *)in)[o];
      else if (c64)
        x[i] = CMPLX(((const float *)in)[2 * o], ((const float *)in)[2 * o + 1]);
      else
        x[i] = CMPLX(((const double *)in)[2 * o], ((const double *)in)[2 * o + 1]);
    }
    next_index(idx, f->len, r);
  }
  int sign = f->type == KILN_FFT_FORWARD || f->type == KILN_FFT_REAL_FORWARD ? -1 : 1;
  double scale = 1;
  bool irfft = f->type == KILN_FFT_REAL_INVERSE;
  for (uint32_t d = r - f->nfft; d < r; d++) {
    if (irfft && d + 1 == r) continue; /* the real axis goes last */
    dft_dim(x, f->len, r, d, sign, line);
    scale *= (double)f->len[d];
  }
  if (irfft) {
    /* Complete the Hermitian half spectrum along the last dim, then invert. */
    int64_t n = f->len[r - 1], half = f->in_dims[r - 1], lines = total / n;
    for (int64_t l = 0; l < lines; l++)
      for (int64_t k = half; k < n; k++) x[l * n + k] = conj(x[l * n + n - k]);
    dft_dim(x, f->len, r, r - 1, sign, line);
    scale *= (double)n;
  }
  bool inverse = f->type == KILN_FFT_INVERSE || irfft;
  int64_t fst[KILN_FFT_MAX_RANK], acc = 1;
  for (uint32_t d = r; d-- > 0;) {
    fst[d] = acc;
    acc *= f->len[d];
  }
  memset(idx, 0, sizeof idx);
  for (int64_t i = 0; i < outn; i++) {
    double complex v = x[offset(idx, fst, r)];
    if (inverse) v /= scale;
    int64_t o = offset(idx, f->out_strides, r);
    if (irfft) {
      if (c64)
        ((float *)out)[o] = (float)creal(v);
      else
        ((double *)out)[o] = creal(v);
    } else if (c64) {
      ((float *)out)[2 * o] = (float)creal(v);
      ((float *)out)[2 * o + 1] = (float)cimag(v);
    } else {
      ((double *)out)[2 * o] = creal(v);
      ((double *)out)[2 * o + 1] = cimag(v);
    }
    next_index(idx, f->out_dims, r);
  }
  kiln_free(x);
  kiln_free(line);
  return 0;
}
