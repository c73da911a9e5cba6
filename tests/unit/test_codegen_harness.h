/* Helpers for the code generation suites: compile HLO text, load the code
 * object with memfd_create + dlopen("/proc/self/fd/N"), run the step
 * programs on buffers laid out by the slot table (a small single-threaded
 * stand-in for the executor that calls every kernel in three range chunks,
 * so that range splitting is exercised), random arguments with edge
 * values, and comparison with the reference interpreter (exact for
 * integers, pred, f16 and bf16; a tight relative tolerance for f32/f64). */
#ifndef KILN_TESTS_UNIT_TEST_CODEGEN_HARNESS_H
#define KILN_TESTS_UNIT_TEST_CODEGEN_HARNESS_H

#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/text.h"

static inline kiln_module *cg_parse(const char *text) {
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_module_parse_text(text, strlen(text), "test.hlo", NULL, &m, &st);
  ck_assert_msg(rc == 0, "parse failed: %s: %s\n%s", st.where, st.msg, text);
  return m;
}

static inline kiln_executable *cg_compile(const kiln_module *m, int opt_level) {
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.opt_level = opt_level;
  kiln_executable *e = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_compile(m, &o, &e, NULL, &st);
  ck_assert_msg(rc == 0, "compile failed: %s: %s", st.where, st.msg);
  return e;
}

/* ---- physical layouts --------------------------------------------------- */

static inline void cg_strides(const kiln_shape *s, int64_t *st) {
  int64_t m2m[64], acc = 1;
  kiln_shape_minor_to_major(s, m2m);
  for (uint32_t k = 0; k < s->rank; k++) {
    st[m2m[k]] = acc;
    acc *= s->dims[m2m[k]];
  }
}

/* Row-major element i of shape s -> its physical element offset. */
static inline int64_t cg_phys(const kiln_shape *s, int64_t i) {
  int64_t st[64], off = 0;
  cg_strides(s, st);
  for (uint32_t d = s->rank; d-- > 0;) {
    off += (i % s->dims[d]) * st[d];
    i /= s->dims[d];
  }
  return off;
}

/* ---- the mini executor -------------------------------------------------- */

typedef struct cg_run {
  const kiln_executable *e;
  void *dl;
  kiln_kernel_fn *k;
  uint8_t *temp;
  uint8_t **param_leaf;  /* per flattened parameter leaf */
  uint32_t *param_first; /* per parameter: first flattened leaf */
  uint8_t **out;         /* per result leaf */
  uint64_t iterations;
} cg_run;

static inline void cg_load(cg_run *r, const kiln_executable *e) {
  memset(r, 0, sizeof *r);
  r->e = e;
  r->k = calloc(e->nkernels + 1, sizeof *r->k);
  if (e->nkernels == 0) return; /* no code object, as the cpu loader maps none */
  int fd = memfd_create("kiln-test-code", MFD_CLOEXEC);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, e->code, e->ncode), (ssize_t)e->ncode);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  r->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(r->dl != NULL, "dlopen: %s", dlerror());
  close(fd);
  for (uint32_t i = 0; i < e->nkernels; i++) {
    char name[64];
    snprintf(name, sizeof name, "kiln_kernel_%u", i);
    void *p = dlsym(r->dl, name);
    ck_assert_msg(p != NULL, "missing %s", name);
    memcpy(&r->k[i], &p, sizeof p);
  }
}

static inline void cg_unload(cg_run *r) {
  if (r->dl) dlclose(r->dl);
  free(r->k);
  free(r->temp);
  for (uint32_t i = 0; r->param_leaf && i < r->e->nparam_leaves; i++) free(r->param_leaf[i]);
  for (uint32_t i = 0; r->out && i < r->e->nresults; i++) free(r->out[i]);
  free(r->param_leaf);
  free(r->param_first);
  free(r->out);
}

static inline void *cg_slot(cg_run *r, uint32_t s) {
  const kiln_slot *sl = &r->e->slots[s];
  switch (sl->kind) {
  case KILN_SLOT_TEMP: return r->temp + sl->offset;
  case KILN_SLOT_CONSTANT: return r->e->constants + sl->offset;
  case KILN_SLOT_PARAM: return r->param_leaf[r->param_first[sl->index] + sl->leaf];
  case KILN_SLOT_OUTPUT: return r->out[sl->index];
  }
  return NULL;
}

static inline float cg_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline void cg_gemm(const kiln_gemm *g, const void *a, const void *b, void *c) {
  for (int64_t q = 0; q < g->batch; q++)
    for (int64_t i = 0; i < g->m; i++)
      for (int64_t j = 0; j < g->n; j++) {
        double acc = 0;
        uint32_t iacc = 0; /* integer GEMM (dtype S8 or U8): s32 sums, wrapping */
        for (int64_t k = 0; k < g->k; k++) {
          int64_t ai = q * g->stride_a + (g->trans_a ? k * g->lda + i : i * g->lda + k);
          int64_t bi = q * g->stride_b + (g->trans_b ? j * g->ldb + k : k * g->ldb + j);
          uint32_t bv = (uint32_t)(int32_t)((const int8_t *)b)[bi];
          if (g->dtype == KILN_S8)
            iacc += (uint32_t)(int32_t)((const int8_t *)a)[ai] * bv;
          else if (g->dtype == KILN_U8)
            iacc += (uint32_t)((const uint8_t *)a)[ai] * bv;
          else if (g->dtype == KILN_F32)
            acc += (double)((const float *)a)[ai] * ((const float *)b)[bi];
          else if (g->dtype == KILN_BF16) /* A, B bf16 (the f32 of their upper half), C f32 */
            acc += (double)cg_bf16(((const uint16_t *)a)[ai]) * cg_bf16(((const uint16_t *)b)[bi]);
          else
            acc += ((const double *)a)[ai] * ((const double *)b)[bi];
        }
        int64_t ci = q * g->stride_c + i * g->ldc + j;
        if (g->dtype == KILN_S8 || g->dtype == KILN_U8)
          ((int32_t *)c)[ci] = (int32_t)iacc;
        else if (g->dtype == KILN_F32 || g->dtype == KILN_BF16)
          ((float *)c)[ci] = (float)acc;
        else
          ((double *)c)[ci] = acc;
      }
}

static inline void cg_program(cg_run *r, uint32_t p) {
  const kiln_program *pr = &r->e->programs[p];
  for (uint32_t i = 0; i < pr->nsteps; i++) {
    const kiln_step *s = &pr->steps[i];
    void *ptr[1100];
    ck_assert_uint_le(s->nargs, 1100);
    for (uint32_t a = 0; a < s->nargs; a++) ptr[a] = cg_slot(r, s->args[a]);
    switch (s->kind) {
    case KILN_STEP_KERNEL: {
      int64_t n = (int64_t)s->range, a = n / 3, b = 2 * n / 3;
      r->k[s->kernel](ptr, 0, a);
      r->k[s->kernel](ptr, a, b);
      r->k[s->kernel](ptr, b, n);
      break;
    }
    case KILN_STEP_GEMM:
      cg_gemm(&s->gemm, ptr[0], ptr[1], ptr[2]);
      if (s->nargs > 3) { /* the epilogue, once C is whole (in pieces, as a kernel step) */
        int64_t n = (int64_t)s->range, a = n / 3, b = 2 * n / 3;
        r->k[s->kernel](ptr + 3, 0, a);
        r->k[s->kernel](ptr + 3, a, b);
        r->k[s->kernel](ptr + 3, b, n);
      }
      break;
    case KILN_STEP_COPY: memmove(ptr[0], ptr[1], s->range); break;
    case KILN_STEP_WHILE:
      for (;;) {
        cg_program(r, s->sub[0]);
        if (!*(uint8_t *)cg_slot(r, s->args[0])) break;
        ck_assert_uint_lt(r->iterations++, 1000000);
        cg_program(r, s->sub[1]);
      }
      break;
    case KILN_STEP_CONDITIONAL: {
      const kiln_slot *sl = &r->e->slots[s->args[0]];
      uint32_t b;
      if (sl->size == 1)
        b = *(uint8_t *)ptr[0] ? 0 : 1;
      else {
        int32_t v = *(int32_t *)ptr[0];
        b = v < 0 || (uint32_t)v >= s->nsub ? s->nsub - 1 : (uint32_t)v;
      }
      cg_program(r, s->sub[b]);
      break;
    }
    case KILN_STEP_CALL: cg_program(r, s->sub[0]); break;
    case KILN_STEP_CONV: kiln_conv_reference(s->conv, ptr[0], ptr[1], ptr[2]); break;
    case KILN_STEP_COLLECTIVE: ck_abort_msg("collective steps run on the cpu backend"); break;
    case KILN_STEP_DEBUG_PRINT: break; /* prints only: the value was copied on before it */
    case KILN_STEP_FFT: ck_assert_int_eq(kiln_fft_reference(s->fft, ptr[0], ptr[1]), 0); break;
    case KILN_STEP_LINALG: ck_abort_msg("linalg steps run on the cpu backend (LAPACK)"); break;
    }
  }
}

static inline uint32_t cg_leaves(const kiln_literal *l, const kiln_literal **out, uint32_t n) {
  if (!kiln_shape_is_tuple(&l->shape)) {
    out[n] = l;
    return n + 1;
  }
  for (uint32_t i = 0; i < l->shape.rank; i++) n = cg_leaves(l->elems[i], out, n);
  return n;
}

/* Runs e on row-major argument literals; *out is a new heap literal. */
static inline void cg_execute(const kiln_executable *e, kiln_literal *const *args,
                              kiln_literal **out) {
  cg_run r;
  cg_load(&r, e);
  r.temp = aligned_alloc(64, (e->temp_bytes + 64) / 64 * 64);
  memset(r.temp, 0xcd, e->temp_bytes);
  r.param_leaf = calloc(e->nparam_leaves + 1, sizeof *r.param_leaf);
  r.param_first = calloc(e->nparams + 1, sizeof *r.param_first);
  const kiln_literal *lv[256];
  uint32_t nl = 0;
  for (uint32_t p = 0; p < e->nparams; p++) {
    r.param_first[p] = nl;
    nl = cg_leaves(args[p], lv, nl);
  }
  ck_assert_uint_eq(nl, e->nparam_leaves);
  for (uint32_t i = 0; i < nl; i++) {
    const kiln_shape *s = &e->params[i].shape;
    size_t es = kiln_dtype_size(s->dtype);
    int64_t n = kiln_shape_elements(s);
    r.param_leaf[i] = malloc((size_t)n * es + 8);
    for (int64_t j = 0; j < n; j++)
      memcpy(r.param_leaf[i] + cg_phys(s, j) * es, (const uint8_t *)lv[i]->data + j * es, es);
  }
  r.out = calloc(e->nresults + 1, sizeof *r.out);
  for (uint32_t o = 0; o < e->nresults; o++)
    r.out[o] = malloc((size_t)kiln_shape_bytes(&e->results[o].shape) + 8);
  cg_program(&r, 0);
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_literal_create(NULL, &e->result_shape, 0, out, &st), 0);
  nl = cg_leaves(*out, lv, 0);
  for (uint32_t o = 0; o < nl; o++) {
    const kiln_shape *s = &e->results[o].shape;
    size_t es = kiln_dtype_size(s->dtype);
    const uint8_t *src = cg_slot(&r, e->results[o].slot);
    for (int64_t j = 0; j < kiln_shape_elements(s); j++)
      memcpy((uint8_t *)lv[o]->data + j * es, src + cg_phys(s, j) * es, es);
  }
  cg_unload(&r);
}

/* ---- inputs and comparison ---------------------------------------------- */

static inline uint64_t cg_rand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 17;
}

static inline void cg_fill(kiln_literal *l, uint64_t *seed, bool edges) {
  if (kiln_shape_is_tuple(&l->shape)) {
    for (uint32_t i = 0; i < l->shape.rank; i++) cg_fill(l->elems[i], seed, edges);
    return;
  }
  kiln_dtype t = l->shape.dtype;
  int64_t n = kiln_literal_elements(l);
  for (int64_t i = 0; i < n; i++) {
    uint64_t r = cg_rand(seed);
    if (kiln_dtype_is_float(t)) {
      static const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0, -1.0, 0.5};
      double v = (double)(int64_t)(r % 4001 - 2000) / 200.0;
      if (edges && r % 9 == 0) v = special[(r / 9) % 8];
      kiln_literal_set_f64(l, i, v);
    } else if (t == KILN_PRED) {
      kiln_literal_set_u64(l, i, r & 1);
    } else {
      int w = kiln_dtype_bits(t);
      uint64_t bits = r % 41;
      int64_t v = (int64_t)bits - 20;
      if (edges && r % 7 == 0) {
        uint64_t mx = w == 64 ? UINT64_MAX : (1ull << w) - 1;
        uint64_t pick[] = {0, mx, mx >> 1, (mx >> 1) + 1, 1, (uint64_t)w, (uint64_t)w + 3};
        kiln_literal_set_u64(l, i, pick[(r / 7) % 7]);
        continue;
      }
      kiln_literal_set_s64(l, i, v);
    }
  }
}

static inline bool cg_close(double a, double b, double tol) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  if (a == b) return true;
  if (isinf(a) || isinf(b)) return false;
  return fabs(a - b) <= tol * fmax(1.0, fmax(fabs(a), fabs(b)));
}

/* Compares leafwise; returns the first differing flat index or -1. */
static inline int64_t cg_diff(const kiln_literal *a, const kiln_literal *b, double tol, char *why,
                              size_t n) {
  const kiln_literal *la[256], *lb[256];
  uint32_t na = cg_leaves(a, la, 0), nb = cg_leaves(b, lb, 0);
  if (na != nb) {
    snprintf(why, n, "leaf counts %u vs %u", na, nb);
    return 0;
  }
  for (uint32_t k = 0; k < na; k++) {
    kiln_dtype t = la[k]->shape.dtype;
    int64_t ne = kiln_literal_elements(la[k]);
    if (t != lb[k]->shape.dtype || ne != kiln_literal_elements(lb[k])) {
      snprintf(why, n, "leaf %u: shapes differ", k);
      return 0;
    }
    bool exact = !(t == KILN_F32 || t == KILN_F64);
    for (int64_t i = 0; i < ne; i++) {
      bool ok;
      if (kiln_dtype_is_float(t) && !exact)
        ok = cg_close(kiln_literal_get_f64(la[k], i), kiln_literal_get_f64(lb[k], i), tol);
      else if (kiln_dtype_is_float(t))
        ok = cg_close(kiln_literal_get_f64(la[k], i), kiln_literal_get_f64(lb[k], i), 0);
      else
        ok = kiln_literal_get_u64(la[k], i) == kiln_literal_get_u64(lb[k], i);
      if (!ok) {
        snprintf(why, n, "leaf %u element %lld: %.17g vs %.17g (bits %llx vs %llx)", k,
                 (long long)i, kiln_literal_get_f64(la[k], i), kiln_literal_get_f64(lb[k], i),
                 (unsigned long long)kiln_literal_get_u64(la[k], i),
                 (unsigned long long)kiln_literal_get_u64(lb[k], i));
        return i;
      }
    }
  }
  return -1;
}

/* Compiles `hlo`, runs it with the mini executor on random arguments and
 * compares with the interpreter. Returns the executable (caller destroys)
 * when keep is set. */
static inline kiln_executable *cg_check_full(const char *hlo, uint64_t seed, bool edges, double tol,
                                             int opt_level, bool keep) {
  kiln_module *m = cg_parse(hlo);
  kiln_executable *e = cg_compile(m, opt_level);
  const kiln_computation *ent = kiln_module_entry(m);
  uint32_t np = kiln_computation_nparams(m, ent);
  kiln_literal *args[64] = {NULL};
  kiln_status st;
  kiln_status_clear(&st);
  for (uint32_t i = 0; i < np; i++) {
    ck_assert_int_eq(
        kiln_literal_create(NULL, &kiln_computation_param(m, ent, i)->shape, 0, &args[i], &st), 0);
    cg_fill(args[i], &seed, edges);
  }
  kiln_literal *want = NULL, *got = NULL;
  int rc = kiln_interp_run(m, (const kiln_literal *const *)args, np, NULL, &want, &st);
  ck_assert_msg(rc == 0, "interp: %s: %s", st.where, st.msg);
  cg_execute(e, args, &got);
  char why[512] = "";
  int64_t at = cg_diff(got, want, tol, why, sizeof why);
  if (at >= 0) {
    kiln_sbuf a = KILN_SBUF_INIT, b = KILN_SBUF_INIT;
    kiln_literal_print(&a, got, true);
    kiln_literal_print(&b, want, true);
    ck_abort_msg("mismatch: %s\ngot:  %.1500s\nwant: %.1500s\n%s", why, kiln_sbuf_str(&a),
                 kiln_sbuf_str(&b), hlo);
  }
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  for (uint32_t i = 0; i < np; i++) kiln_literal_destroy(args[i]);
  kiln_module_destroy(m);
  if (keep) return e;
  kiln_executable_destroy(e);
  return NULL;
}

/* At opt level 0 (the module as written) and 2 (the whole pipeline). */
static inline void cg_check(const char *hlo, bool edges) {
  cg_check_full(hlo, 42, edges, 1e-5, 0, false);
  cg_check_full(hlo, 43, edges, 1e-5, 2, false);
}

#endif /* KILN_TESTS_UNIT_TEST_CODEGEN_HARNESS_H */
