/* Unit tests for the cpu backend's runtime, on executables built by hand.
 *
 * The kernels are a small C file compiled here once (cc -shared -fPIC) into
 * a code object; each test assembles a kiln_executable around it (slots,
 * steps, bindings) and runs it: elementwise add, a blocked reduction,
 * while/conditional/call control flow, layouts and tuples at the boundary,
 * donation, buffers (and their recycling), concurrency, several devices, GEMM steps against a
 * naive triple loop, and hostile tables that must fail with a status.
 * A last case prints the runtime's overheads. */
#include <cblas.h>
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/thread.h"
#include "compiler/codegen/executable.h"
#include "executor/backend.h"
#include "executor/cpu/cpu.h"
#include "executor/cpu/cpu_blas.h"
#include "executor/run.h"

/* ---- the code object ---------------------------------------------------- */

static const char kernels_src[] =
    "#include <stdint.h>\n"
    "typedef void *const *B;\n"
    /* 0: z = x + y (f32) */
    "void kiln_kernel_0(B b, int64_t lo, int64_t hi) {\n"
    "  const float *x = b[0], *y = b[1]; float *z = b[2];\n"
    "  for (int64_t i = lo; i < hi; i++) z[i] = x[i] + y[i];\n}\n"
    /* 1: partial sums of 1024-element blocks: p[i] = sum x[block i], n = *b[2] */
    "void kiln_kernel_1(B b, int64_t lo, int64_t hi) {\n"
    "  const float *x = b[0]; double *p = b[1]; int64_t n = *(const int64_t *)b[2];\n"
    "  for (int64_t i = lo; i < hi; i++) { double s = 0;\n"
    "    for (int64_t j = i * 1024; j < n && j < (i + 1) * 1024; j++) s += x[j];\n"
    "    p[i] = s; }\n}\n"
    /* 2: out = (float) sum p[0..nb) */
    "void kiln_kernel_2(B b, int64_t lo, int64_t hi) {\n"
    "  const double *p = b[0]; int64_t nb = *(const int64_t *)b[2]; double s = 0;\n"
    "  for (int64_t i = 0; i < nb; i++) s += p[i];\n"
    "  *(float *)b[1] = (float)s;\n}\n"
    /* 3: pred = counter < limit */
    "void kiln_kernel_3(B b, int64_t lo, int64_t hi) {\n"
    "  *(uint8_t *)b[2] = *(const int32_t *)b[0] < *(const int32_t *)b[1];\n}\n"
    /* 4: counter += 1 */
    "void kiln_kernel_4(B b, int64_t lo, int64_t hi) { *(int32_t *)b[0] += 1; }\n"
    /* 5: nothing (launch overhead) */
    "void kiln_kernel_5(B b, int64_t lo, int64_t hi) { (void)b; (void)lo; (void)hi; }\n"
    /* 6: z = x (f32 elementwise copy) */
    "void kiln_kernel_6(B b, int64_t lo, int64_t hi) {\n"
    "  const float *x = b[0]; float *z = b[1];\n"
    "  for (int64_t i = lo; i < hi; i++) z[i] = x[i];\n}\n"
    /* 7: tuple in, tuple out: o0[i] = 2 x[i], o1 = s + 1 */
    "void kiln_kernel_7(B b, int64_t lo, int64_t hi) {\n"
    "  const float *x = b[0]; float *o = b[2];\n"
    "  for (int64_t i = lo; i < hi; i++) o[i] = 2 * x[i];\n"
    "  if (lo == 0) *(int32_t *)b[3] = *(const int32_t *)b[1] + 1;\n}\n"
    /* 8: pred = 1 (while true) */
    "void kiln_kernel_8(B b, int64_t lo, int64_t hi) { *(uint8_t *)b[0] = 1; }\n"
    /* 9: x[i] *= 3 in place (f32) */
    "void kiln_kernel_9(B b, int64_t lo, int64_t hi) {\n"
    "  float *x = b[0]; for (int64_t i = lo; i < hi; i++) x[i] *= 3;\n}\n";
#define NKERNELS 10

static const char mul_src[] = "#include <stdint.h>\n"
                              "void kiln_kernel_0(void *const *b, int64_t lo, int64_t hi) {\n"
                              "  const float *x = b[0], *y = b[1]; float *z = b[2];\n"
                              "  for (int64_t i = lo; i < hi; i++) z[i] = x[i] * y[i];\n}\n";

static uint8_t *g_code, *g_code_mul;
static size_t g_ncode, g_ncode_mul;

/* cc -shared -fPIC on `text`; the shared object's bytes in *code. */
static void build_so(const char *text, uint8_t **code, size_t *ncode) {
  char dir[] = "/tmp/kiln-cpu-rt-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char src[128], so[128], cmd[512];
  snprintf(src, sizeof src, "%s/k.c", dir);
  snprintf(so, sizeof so, "%s/k.so", dir);
  FILE *f = fopen(src, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "cc -O2 -shared -fPIC -o %s %s", so, src);
  ck_assert_int_eq(system(cmd), 0);
  f = fopen(so, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  *ncode = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  *code = malloc(*ncode);
  ck_assert_uint_eq(fread(*code, 1, *ncode, f), *ncode);
  fclose(f);
  unlink(src);
  unlink(so);
  rmdir(dir);
}

/* Compiles the kernels once per test process (before the forks). */
static void compile_code(void) {
  build_so(kernels_src, &g_code, &g_ncode);
  build_so(mul_src, &g_code_mul, &g_ncode_mul);
}

static void free_code(void) {
  free(g_code);
  free(g_code_mul);
}

/* ---- building executables ------------------------------------------------ */

#define MAXS 64
#define MAXP 16
#define MAXSTEPS 16

typedef struct xb {
  kiln_executable *e;
  kiln_slot slots[MAXS];
  uint32_t nslots;
  kiln_step steps[MAXP][MAXSTEPS];
  uint32_t nsteps[MAXP];
  uint32_t nprograms;
  kiln_shape params[8];
  uint32_t nparams;
  kiln_binding pb[MAXS], rb[MAXS];
  uint32_t npb, nrb;
  bool have_result;
} xb;

static xb *xb_new(void) {
  xb *b = calloc(1, sizeof *b);
  b->e = kiln_executable_create();
  ck_assert_ptr_nonnull(b->e);
  b->e->target = "cpu";
  b->e->code = g_code;
  b->e->ncode = g_ncode;
  b->e->nkernels = NKERNELS;
  b->nprograms = 1;
  return b;
}

/* An array shape in the executable's arena; m2m NULL for the default layout. */
static kiln_shape shp(xb *b, kiln_dtype t, uint32_t rank, const int64_t *dims, const int64_t *m2m) {
  kiln_shape s;
  ck_assert_int_eq(kiln_shape_make_array(b->e->arena, &s, t, dims, rank), 0);
  if (m2m) {
    s.layout = kiln_arena_calloc(b->e->arena, 1, sizeof *s.layout);
    s.layout->rank = rank;
    s.layout->minor_to_major = kiln_arena_memdup(b->e->arena, m2m, rank * sizeof(int64_t));
  }
  return s;
}

static kiln_shape tup(xb *b, const kiln_shape *elems, uint32_t n) {
  kiln_shape s;
  ck_assert_int_eq(kiln_shape_make_tuple(b->e->arena, &s, elems, n), 0);
  return s;
}

static uint32_t slot(xb *b, kiln_slot_kind kind, uint32_t index, uint32_t leaf, uint64_t off,
                     uint64_t size) {
  ck_assert_uint_lt(b->nslots, MAXS);
  b->slots[b->nslots] = (kiln_slot){kind, index, leaf, off, size};
  return b->nslots++;
}

static uint32_t temp(xb *b, uint64_t size) {
  uint64_t off = (b->e->temp_bytes + 63) & ~UINT64_C(63);
  b->e->temp_bytes = off + size;
  return slot(b, KILN_SLOT_TEMP, 0, 0, off, size);
}

static uint32_t constant(xb *b, const void *data, uint64_t size) {
  uint64_t off = b->e->nconstants;
  uint8_t *blob = kiln_arena_alloc(b->e->arena, off + size + 1);
  if (off) memcpy(blob, b->e->constants, off);
  memcpy(blob + off, data, size);
  b->e->constants = blob;
  b->e->nconstants = off + size;
  return slot(b, KILN_SLOT_CONSTANT, 0, 0, off, size);
}

static void leaves(const kiln_shape *s, const kiln_shape **out, uint32_t *n) {
  if (s->dtype == KILN_TUPLE)
    for (uint32_t i = 0; i < s->rank; i++) leaves(&s->tuple[i], out, n);
  else
    out[(*n)++] = s;
}

/* Adds entry parameter `s`; returns the slot of its first leaf (leaves get
 * consecutive slots). */
static uint32_t param(xb *b, kiln_shape s) {
  uint32_t p = b->nparams++, first = b->nslots, n = 0;
  b->params[p] = s;
  const kiln_shape *ls[16];
  leaves(&s, ls, &n);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t sl = slot(b, KILN_SLOT_PARAM, p, i, 0, (uint64_t)kiln_shape_bytes(ls[i]));
    b->pb[b->npb++] = (kiln_binding){*ls[i], sl};
  }
  return first;
}

/* Sets the entry result `s`; returns the output slot of its first leaf. */
static uint32_t result(xb *b, kiln_shape s) {
  uint32_t first = b->nslots, n = 0;
  b->e->result_shape = s;
  const kiln_shape *ls[16];
  leaves(&s, ls, &n);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t sl = slot(b, KILN_SLOT_OUTPUT, i, 0, 0, (uint64_t)kiln_shape_bytes(ls[i]));
    b->rb[b->nrb++] = (kiln_binding){*ls[i], sl};
  }
  b->have_result = true;
  return first;
}

static uint32_t program(xb *b) { return b->nprograms++; }

static kiln_step *step(xb *b, uint32_t prog, kiln_step_kind kind, const uint32_t *args,
                       uint32_t nargs, const uint32_t *sub, uint32_t nsub) {
  ck_assert_uint_lt(b->nsteps[prog], MAXSTEPS);
  kiln_step *s = &b->steps[prog][b->nsteps[prog]++];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  /* Room for 8 ids, so tests can rewrite a step into another kind. */
  s->args = kiln_arena_calloc(b->e->arena, nargs > 8 ? nargs : 8, sizeof *s->args);
  if (nargs) memcpy(s->args, args, nargs * sizeof *args);
  s->nargs = nargs;
  s->sub = kiln_arena_calloc(b->e->arena, nsub > 8 ? nsub : 8, sizeof *s->sub);
  if (nsub) memcpy(s->sub, sub, nsub * sizeof *sub);
  s->nsub = nsub;
  return s;
}

static kiln_step *kernel(xb *b, uint32_t prog, uint32_t k, uint64_t range, const uint32_t *args,
                         uint32_t nargs) {
  kiln_step *s = step(b, prog, KILN_STEP_KERNEL, args, nargs, NULL, 0);
  s->kernel = k;
  s->range = range;
  return s;
}

static void copy(xb *b, uint32_t prog, uint32_t dst, uint32_t src, uint64_t bytes) {
  step(b, prog, KILN_STEP_COPY, (uint32_t[]){dst, src}, 2, NULL, 0)->range = bytes;
}

/* Moves the tables into the executable (its arena owns them) and frees b. */
static kiln_executable *finish(xb *b) {
  kiln_executable *e = b->e;
  kiln_arena *a = e->arena;
  e->slots = kiln_arena_memdup(a, b->slots, b->nslots * sizeof *b->slots + 1);
  e->nslots = b->nslots;
  e->programs = kiln_arena_calloc(a, b->nprograms, sizeof *e->programs);
  for (uint32_t p = 0; p < b->nprograms; p++) {
    e->programs[p].steps = kiln_arena_memdup(a, b->steps[p], b->nsteps[p] * sizeof(kiln_step) + 1);
    e->programs[p].nsteps = b->nsteps[p];
  }
  e->nprograms = b->nprograms;
  e->param_shapes = kiln_arena_memdup(a, b->params, b->nparams * sizeof *b->params + 1);
  e->nparams = b->nparams;
  e->params = kiln_arena_memdup(a, b->pb, b->npb * sizeof *b->pb + 1);
  e->nparam_leaves = b->npb;
  e->results = kiln_arena_memdup(a, b->rb, b->nrb * sizeof *b->rb + 1);
  e->nresults = b->nrb;
  if (!b->have_result) e->result_shape = tup(b, NULL, 0);
  free(b);
  return e;
}

/* ---- running ------------------------------------------------------------ */

static kiln_status st;

static kiln_backend *cpu(uint32_t ndevices, uint32_t threads) {
  kiln_backend_options o = {.ndevices = ndevices, .threads_per_device = threads};
  kiln_backend *be = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_backend_create("cpu", &o, &be, &st) == 0, "%s", st.msg);
  return be;
}

static kiln_literal *lit(kiln_dtype t, uint32_t rank, const int64_t *dims) {
  kiln_shape s = {.dtype = t, .rank = rank, .dims = (int64_t *)dims};
  kiln_literal *l = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &l, &st), 0);
  return l;
}

static kiln_literal *f32s(int64_t n, float (*f)(int64_t)) {
  kiln_literal *l = lit(KILN_F32, 1, (int64_t[]){n});
  for (int64_t i = 0; i < n; i++) ((float *)l->data)[i] = f(i);
  return l;
}

static kiln_literal *s32(int32_t v) {
  kiln_literal *l = lit(KILN_S32, 0, NULL);
  *(int32_t *)l->data = v;
  return l;
}

static kiln_literal *pred(bool v) {
  kiln_literal *l = lit(KILN_PRED, 0, NULL);
  *(uint8_t *)l->data = v;
  return l;
}

/* Loads e on a fresh backend and runs it; returns the status code. */
static int run_on(kiln_backend *be, uint32_t dev, const kiln_executable *e,
                  const kiln_literal *const *args, uint32_t nargs, const kiln_run_options *o,
                  kiln_literal **out) {
  kiln_loaded *l = NULL;
  kiln_status_clear(&st);
  *out = NULL;
  int rc = kiln_device_load(kiln_backend_device(be, dev), e, &l, &st);
  if (rc == 0) rc = kiln_loaded_run(l, args, nargs, o, out, &st);
  kiln_loaded_destroy(l);
  return rc;
}

static int run1(const kiln_executable *e, uint32_t threads, const kiln_literal *const *args,
                uint32_t nargs, const kiln_run_options *o, kiln_literal **out) {
  kiln_backend *be = cpu(1, threads);
  int rc = run_on(be, 0, e, args, nargs, o, out);
  kiln_backend_destroy(be);
  return rc;
}

static int load_rc(const kiln_executable *e, uint64_t max_temp) {
  kiln_backend_options o = {.ndevices = 1, .threads_per_device = 1, .max_temp_bytes = max_temp};
  kiln_backend *be = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_backend_create("cpu", &o, &be, &st), 0);
  kiln_loaded *l = NULL;
  int rc = kiln_device_load(kiln_backend_device(be, 0), e, &l, &st);
  if (rc == 0) ck_assert_ptr_nonnull(l);
  kiln_loaded_destroy(l);
  kiln_backend_destroy(be);
  return rc;
}

static float fi(int64_t i) { return (float)(i % 1000) * 0.5f; }
static float gi(int64_t i) { return (float)(i % 7) - 3.0f; }

/* z = x + y over n elements. */
static kiln_executable *add_exe(int64_t n) {
  xb *b = xb_new();
  uint32_t x = param(b, shp(b, KILN_F32, 1, (int64_t[]){n}, NULL));
  uint32_t y = param(b, shp(b, KILN_F32, 1, (int64_t[]){n}, NULL));
  uint32_t z = result(b, shp(b, KILN_F32, 1, (int64_t[]){n}, NULL));
  kernel(b, 0, 0, (uint64_t)n, (uint32_t[]){x, y, z}, 3);
  return finish(b);
}

static void check_add(int64_t n, uint32_t threads) {
  kiln_executable *e = add_exe(n);
  kiln_literal *x = f32s(n, fi), *y = f32s(n, gi), *out = NULL;
  const kiln_literal *args[] = {x, y};
  ck_assert_msg(run1(e, threads, args, 2, NULL, &out) == 0, "%s", st.msg);
  ck_assert_int_eq(out->shape.dims[0], n);
  for (int64_t i = 0; i < n; i++) ck_assert_float_eq(((float *)out->data)[i], fi(i) + gi(i));
  kiln_literal_destroy(out);
  kiln_literal_destroy(x);
  kiln_literal_destroy(y);
  kiln_executable_destroy(e);
}

START_TEST(test_add) {
  check_add(1000, 1);
  check_add(1000, 4);
  check_add(1 << 20, 1);
  check_add(1 << 20, 3); /* split over the pool */
  check_add(0, 2);
}
END_TEST

/* sum(x) through a temporary of per-block partial sums and two constants. */
START_TEST(test_reduction) {
  const int64_t n = 1000003, nb = (n + 1023) / 1024;
  xb *b = xb_new();
  uint32_t x = param(b, shp(b, KILN_F32, 1, (int64_t[]){n}, NULL));
  uint32_t out = result(b, shp(b, KILN_F32, 0, NULL, NULL));
  uint32_t parts = temp(b, (uint64_t)nb * 8);
  uint32_t cn = constant(b, &n, 8), cnb = constant(b, &nb, 8);
  kernel(b, 0, 1, (uint64_t)nb, (uint32_t[]){x, parts, cn}, 3);
  kernel(b, 0, 2, 1, (uint32_t[]){parts, out, cnb}, 3);
  kiln_executable *e = finish(b);
  kiln_literal *xl = f32s(n, fi), *res = NULL;
  double want = 0;
  for (int64_t i = 0; i < n; i++) want += fi(i);
  for (uint32_t threads = 1; threads <= 4; threads += 3) {
    const kiln_literal *args[] = {xl};
    ck_assert_msg(run1(e, threads, args, 1, NULL, &res) == 0, "%s", st.msg);
    ck_assert_float_eq(*(float *)res->data, (float)want);
    kiln_literal_destroy(res);
  }
  kiln_literal_destroy(xl);
  kiln_executable_destroy(e);
}
END_TEST

/* counter = 0; while (counter < limit) counter += 1; return counter */
static kiln_executable *counter_exe(bool forever) {
  xb *b = xb_new();
  uint32_t limit = param(b, shp(b, KILN_S32, 0, NULL, NULL));
  uint32_t out = result(b, shp(b, KILN_S32, 0, NULL, NULL));
  uint32_t counter = temp(b, 4), p = temp(b, 1);
  int32_t zero = 0;
  uint32_t czero = constant(b, &zero, 4);
  uint32_t cond = program(b), body = program(b);
  copy(b, 0, counter, czero, 4);
  step(b, 0, KILN_STEP_WHILE, (uint32_t[]){p}, 1, (uint32_t[]){cond, body}, 2);
  copy(b, 0, out, counter, 4);
  if (forever)
    kernel(b, cond, 8, 1, (uint32_t[]){p}, 1);
  else
    kernel(b, cond, 3, 1, (uint32_t[]){counter, limit, p}, 3);
  kernel(b, body, 4, 1, (uint32_t[]){counter}, 1);
  return finish(b);
}

START_TEST(test_while_counter) {
  kiln_executable *e = counter_exe(false);
  int32_t limits[] = {0, 1, 17, 100000, -5};
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    kiln_literal *a = s32(limits[i]), *res = NULL;
    const kiln_literal *args[] = {a};
    ck_assert_msg(run1(e, 2, args, 1, NULL, &res) == 0, "%s", st.msg);
    ck_assert_int_eq(*(int32_t *)res->data, limits[i] > 0 ? limits[i] : 0);
    kiln_literal_destroy(res);
    kiln_literal_destroy(a);
  }
  /* Iteration limit: exactly max iterations of the body are allowed. */
  kiln_literal *a = s32(100), *res = NULL;
  const kiln_literal *args[] = {a};
  kiln_run_options o = {.max_while_iterations = 100};
  ck_assert_int_eq(run1(e, 1, args, 1, &o, &res), 0);
  ck_assert_int_eq(*(int32_t *)res->data, 100);
  kiln_literal_destroy(res);
  o.max_while_iterations = 99;
  ck_assert_int_eq(run1(e, 1, args, 1, &o, &res), KILN_ELIMIT);
  ck_assert_ptr_null(res);
  ck_assert_str_eq(st.msg, "while loop ran past 99 iterations");
  kiln_literal_destroy(a);
  kiln_executable_destroy(e);
}
END_TEST

START_TEST(test_while_timeout) {
  kiln_executable *e = counter_exe(true);
  kiln_literal *a = s32(0), *res = NULL;
  const kiln_literal *args[] = {a};
  kiln_run_options o = {.timeout_seconds = 0.2};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ck_assert_int_eq(run1(e, 1, args, 1, &o, &res), KILN_ELIMIT);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  ck_assert_str_eq(st.msg, "time limit exceeded");
  ck_assert_double_lt(s, 5.0);
  /* Without a timeout the default iteration limit (1e9) ends it; a small
   * limit shows the loop is bounded. */
  o = (kiln_run_options){.max_while_iterations = 1000};
  ck_assert_int_eq(run1(e, 1, args, 1, &o, &res), KILN_ELIMIT);
  kiln_literal_destroy(a);
  kiln_executable_destroy(e);
}
END_TEST

/* A cancel flag raised while the loop runs stops it between iterations. */
static void *raise_later(void *arg) {
  usleep(100000);
  atomic_store((atomic_int *)arg, 1);
  return NULL;
}

START_TEST(test_while_cancel) {
  kiln_executable *e = counter_exe(true);
  kiln_literal *a = s32(0), *res = NULL;
  const kiln_literal *args[] = {a};
  static atomic_int cancel;
  kiln_run_options o = {.cancel = &cancel};
  pthread_t t;
  pthread_create(&t, NULL, raise_later, &cancel);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ck_assert_int_eq(run1(e, 1, args, 1, &o, &res), KILN_ECANCELED);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  pthread_join(t, NULL);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  ck_assert_str_eq(st.msg, "cancelled");
  ck_assert_ptr_null(res);
  ck_assert_double_gt(s, 0.05);
  ck_assert_double_lt(s, 5.0);
  kiln_literal_destroy(a);
  kiln_executable_destroy(e);
}
END_TEST

/* Branch k copies constant k+1 into the result; selector is param 0. */
static kiln_executable *cond_exe(kiln_dtype sel, uint32_t nbranches) {
  xb *b = xb_new();
  uint32_t s = param(b, shp(b, sel, 0, NULL, NULL));
  uint32_t out = result(b, shp(b, KILN_S32, 0, NULL, NULL));
  uint32_t subs[8];
  for (uint32_t k = 0; k < nbranches; k++) {
    int32_t v = (int32_t)k + 1;
    uint32_t c = constant(b, &v, 4);
    subs[k] = program(b);
    copy(b, subs[k], out, c, 4);
  }
  step(b, 0, KILN_STEP_CONDITIONAL, (uint32_t[]){s}, 1, subs, nbranches);
  return finish(b);
}

static int32_t run_cond(const kiln_executable *e, kiln_literal *sel) {
  kiln_literal *res = NULL;
  const kiln_literal *args[] = {sel};
  ck_assert_msg(run1(e, 1, args, 1, NULL, &res) == 0, "%s", st.msg);
  int32_t v = *(int32_t *)res->data;
  kiln_literal_destroy(res);
  kiln_literal_destroy(sel);
  return v;
}

START_TEST(test_conditional_and_call) {
  kiln_executable *e = cond_exe(KILN_PRED, 2);
  ck_assert_int_eq(run_cond(e, pred(true)), 1);
  ck_assert_int_eq(run_cond(e, pred(false)), 2);
  kiln_executable_destroy(e);
  e = cond_exe(KILN_S32, 3);
  ck_assert_int_eq(run_cond(e, s32(0)), 1);
  ck_assert_int_eq(run_cond(e, s32(1)), 2);
  ck_assert_int_eq(run_cond(e, s32(2)), 3);
  ck_assert_int_eq(run_cond(e, s32(3)), 3); /* out of range: the last */
  ck_assert_int_eq(run_cond(e, s32(-1)), 3);
  ck_assert_int_eq(run_cond(e, s32(INT32_MIN)), 3);
  kiln_executable_destroy(e);

  /* call: program 1 adds, program 0 calls it twice through a nested call. */
  xb *b = xb_new();
  uint32_t x = param(b, shp(b, KILN_F32, 1, (int64_t[]){4}, NULL));
  uint32_t z = result(b, shp(b, KILN_F32, 1, (int64_t[]){4}, NULL));
  uint32_t inner = program(b), outer = program(b);
  kernel(b, inner, 0, 4, (uint32_t[]){x, x, z}, 3);
  step(b, outer, KILN_STEP_CALL, NULL, 0, (uint32_t[]){inner}, 1);
  step(b, 0, KILN_STEP_CALL, NULL, 0, (uint32_t[]){outer}, 1);
  e = finish(b);
  kiln_literal *xl = f32s(4, fi), *res = NULL;
  const kiln_literal *args[] = {xl};
  ck_assert_int_eq(run1(e, 1, args, 1, NULL, &res), 0);
  for (int i = 0; i < 4; i++) ck_assert_float_eq(((float *)res->data)[i], 2 * fi(i));
  kiln_literal_destroy(res);
  kiln_literal_destroy(xl);
  kiln_executable_destroy(e);
}
END_TEST

/* A column-major parameter and/or result: the runtime relayouts at the
 * boundary, the kernel copies raw bytes. */
START_TEST(test_layouts) {
  int64_t dims[] = {2, 3}, col[] = {0, 1};
  for (int variant = 0; variant < 4; variant++) {
    bool pcol = variant & 1, rcol = variant & 2;
    xb *b = xb_new();
    uint32_t x = param(b, shp(b, KILN_F32, 2, dims, pcol ? col : NULL));
    uint32_t z = result(b, shp(b, KILN_F32, 2, dims, rcol ? col : NULL));
    kernel(b, 0, 6, 6, (uint32_t[]){x, z}, 2);
    kiln_executable *e = finish(b);
    kiln_literal *xl = lit(KILN_F32, 2, dims), *res = NULL;
    for (int i = 0; i < 6; i++) ((float *)xl->data)[i] = (float)i; /* {{0,1,2},{3,4,5}} */
    const kiln_literal *args[] = {xl};
    ck_assert_msg(run1(e, 1, args, 1, NULL, &res) == 0, "%s", st.msg);
    /* Same layouts: identity. Different: the bytes of one order read in the other. */
    static const float same[] = {0, 1, 2, 3, 4, 5};
    static const float p_col_r_row[] = {0, 3, 1, 4, 2, 5}; /* column-major bytes read row-major */
    static const float p_row_r_col[] = {0, 2, 4, 1, 3, 5};
    const float *want = pcol == rcol ? same : pcol ? p_col_r_row : p_row_r_col;
    for (int i = 0; i < 6; i++) ck_assert_float_eq(((float *)res->data)[i], want[i]);
    ck_assert_float_eq(((float *)xl->data)[1], 1.0f); /* caller's data untouched */
    kiln_literal_destroy(res);
    kiln_literal_destroy(xl);
    kiln_executable_destroy(e);
  }
}
END_TEST

START_TEST(test_tuples) {
  xb *b = xb_new();
  kiln_shape in[2] = {shp(b, KILN_F32, 1, (int64_t[]){3}, NULL), shp(b, KILN_S32, 0, NULL, NULL)};
  uint32_t x = param(b, tup(b, in, 2));
  uint32_t o = result(b, tup(b, in, 2));
  kernel(b, 0, 7, 3, (uint32_t[]){x, x + 1, o, o + 1}, 4);
  kiln_executable *e = finish(b);
  kiln_literal *t = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &e->param_shapes[0], 0, &t, &st), 0);
  for (int i = 0; i < 3; i++) ((float *)t->elems[0]->data)[i] = (float)i + 0.5f;
  *(int32_t *)t->elems[1]->data = 41;
  kiln_literal *res = NULL;
  const kiln_literal *args[] = {t};
  ck_assert_msg(run1(e, 2, args, 1, NULL, &res) == 0, "%s", st.msg);
  ck_assert_uint_eq(res->shape.dtype, KILN_TUPLE);
  ck_assert_float_eq(((float *)res->elems[0]->data)[2], 5.0f);
  ck_assert_int_eq(*(int32_t *)res->elems[1]->data, 42);
  kiln_literal_destroy(res);

  /* Argument checks happen before anything runs. */
  kiln_literal *wrong = f32s(3, fi);
  const kiln_literal *bad[] = {wrong};
  ck_assert_int_eq(run1(e, 1, bad, 1, NULL, &res), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "argument 0: f32[3] given, (f32[3], s32[]) expected");
  ck_assert_int_eq(run1(e, 1, args, 0, NULL, &res), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "the executable takes 1 parameter, 0 given");
  const kiln_literal *none[] = {NULL};
  ck_assert_int_eq(run1(e, 1, none, 1, NULL, &res), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "argument 0 is missing");
  kiln_literal_destroy(wrong);
  kiln_literal_destroy(t);
  kiln_executable_destroy(e);
}
END_TEST

/* A result bound to a donated parameter's slot: the program writes the
 * parameter in place; the caller's literal must not change. */
START_TEST(test_donation) {
  xb *b = xb_new();
  kiln_shape s = shp(b, KILN_F32, 1, (int64_t[]){5}, NULL);
  uint32_t x = param(b, s);
  b->e->result_shape = s;
  b->rb[b->nrb++] = (kiln_binding){s, x};
  b->have_result = true;
  kernel(b, 0, 9, 5, (uint32_t[]){x}, 1);
  kiln_executable *e = finish(b);
  kiln_literal *xl = f32s(5, fi), *res = NULL;
  const kiln_literal *args[] = {xl};
  ck_assert_msg(run1(e, 1, args, 1, NULL, &res) == 0, "%s", st.msg);
  for (int i = 0; i < 5; i++) {
    ck_assert_float_eq(((float *)res->data)[i], 3 * fi(i));
    ck_assert_float_eq(((float *)xl->data)[i], fi(i));
  }
  kiln_literal_destroy(res);
  kiln_literal_destroy(xl);
  kiln_executable_destroy(e);
}
END_TEST

START_TEST(test_execute_buffers) {
  const int64_t n = 64;
  kiln_executable *e = add_exe(n);
  kiln_backend *be = cpu(2, 2);
  kiln_device *d = kiln_backend_device(be, 1);
  kiln_loaded *l = NULL;
  ck_assert_int_eq(kiln_device_load(d, e, &l, &st), 0);
  ck_assert_ptr_eq(kiln_loaded_executable(l), e);
  kiln_buffer *x = NULL, *y = NULL, *out[2] = {NULL};
  ck_assert_int_eq(kiln_buffer_alloc(d, n * 4, &x, &st), 0);
  ck_assert_int_eq(kiln_buffer_alloc(d, n * 4, &y, &st), 0);
  float hx[64], hy[64], hz[64];
  for (int i = 0; i < n; i++) hx[i] = fi(i), hy[i] = gi(i);
  ck_assert_int_eq(kiln_buffer_write(x, 0, hx, sizeof hx, &st), 0);
  ck_assert_int_eq(kiln_buffer_write(y, 0, hy, sizeof hy, &st), 0);
  kiln_buffer *args[] = {x, y};
  ck_assert_int_eq(kiln_loaded_execute(l, args, 2, NULL, out, 1, &st), 0);
  ck_assert_uint_eq(kiln_buffer_size(out[0]), n * 4);
  ck_assert_int_eq(kiln_buffer_read(out[0], 0, hz, sizeof hz, &st), 0);
  for (int i = 0; i < n; i++) ck_assert_float_eq(hz[i], hx[i] + hy[i]);
  kiln_buffer_free(out[0]);

  /* Wrong counts, sizes and devices. */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_execute(l, args, 1, NULL, out, 1, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "the executable takes 2 parameter leaves, 1 buffers given");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_execute(l, args, 2, NULL, out, 2, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "the executable returns 1 result leaves, room for 2 given");
  kiln_buffer *small = NULL, *other = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(d, 8, &small, &st), 0);
  ck_assert_int_eq(kiln_buffer_alloc(kiln_backend_device(be, 0), n * 4, &other, &st), 0);
  kiln_buffer *bad1[] = {x, small}, *bad2[] = {other, y};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_execute(l, bad1, 2, NULL, out, 1, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "parameter leaf 1: buffer has 8 bytes, expected 256");
  ck_assert_ptr_null(out[0]);
  /* A sibling cpu device's buffer is host memory the executable's device
   * addresses too: taken as it is. Another backend's is refused. */
  ck_assert_int_eq(kiln_buffer_write(other, 0, hx, sizeof hx, &st), 0);
  ck_assert_int_eq(kiln_loaded_execute(l, bad2, 2, NULL, out, 1, &st), 0);
  ck_assert_int_eq(kiln_buffer_read(out[0], 0, hz, sizeof hz, &st), 0);
  for (int i = 0; i < n; i++) ck_assert_float_eq(hz[i], hx[i] + hy[i]);
  kiln_buffer_free(out[0]);
  kiln_backend *ib = NULL;
  ck_assert_int_eq(kiln_backend_create("interp", NULL, &ib, &st), 0);
  kiln_buffer *foreign = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(kiln_backend_device(ib, 0), n * 4, &foreign, &st), 0);
  kiln_buffer *bad3[] = {foreign, y};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_execute(l, bad3, 2, NULL, out, 1, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "parameter leaf 0: buffer lives on interp:0, the executable on cpu:1");
  ck_assert_ptr_null(out[0]);
  kiln_buffer_free(foreign);
  kiln_backend_destroy(ib);
  kiln_buffer_free(small);
  kiln_buffer_free(other);
  kiln_buffer_free(x);
  kiln_buffer_free(y);
  kiln_loaded_destroy(l);
  kiln_backend_destroy(be);
  kiln_executable_destroy(e);
}
END_TEST

/* Large buffers come back from the device's cache: a recycled buffer
 * still reads as zeroes (whole, around a partial write, and as a run's
 * argument), and a run's result reuses the memory of a freed one. */
START_TEST(test_buffer_recycling) {
  const int64_t n = 1 << 18; /* 1 MiB of f32: above the cache's lower bound */
  const size_t bytes = (size_t)n * 4;
  kiln_backend *be = cpu(1, 2);
  kiln_device *d = kiln_backend_device(be, 0);
  float *h = malloc(bytes), *hy = malloc(bytes);
  ck_assert_ptr_nonnull(h);
  ck_assert_ptr_nonnull(hy);
  kiln_buffer *a = NULL, *b = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(d, bytes, &a, &st), 0);
  void *mem = a->mem;
  memset(h, 0xab, bytes);
  ck_assert_int_eq(kiln_buffer_write(a, 0, h, bytes, &st), 0);
  kiln_buffer_free(a);
  ck_assert_int_eq(kiln_buffer_alloc(d, bytes, &b, &st), 0);
  ck_assert_ptr_eq(b->mem, mem);
  ck_assert_int_eq(kiln_buffer_read(b, 0, h, bytes, &st), 0);
  for (int64_t i = 0; i < n; i++) ck_assert_float_eq(h[i], 0.0f);

  /* A partial write into a recycled buffer keeps zeroes around it. */
  memset(h, 0xab, bytes);
  ck_assert_int_eq(kiln_buffer_write(b, 0, h, bytes, &st), 0);
  kiln_buffer_free(b);
  ck_assert_int_eq(kiln_buffer_alloc(d, bytes, &b, &st), 0);
  ck_assert_ptr_eq(b->mem, mem);
  float seven = 7.0f;
  ck_assert_int_eq(kiln_buffer_write(b, 40, &seven, 4, &st), 0);
  ck_assert_int_eq(kiln_buffer_read(b, 0, h, bytes, &st), 0);
  for (int64_t i = 0; i < n; i++) ck_assert_float_eq(h[i], i == 10 ? 7.0f : 0.0f);

  /* A recycled, never written buffer as an argument: x = 0, so z = y. */
  kiln_executable *e = add_exe(n);
  kiln_loaded *l = NULL;
  ck_assert_int_eq(kiln_device_load(d, e, &l, &st), 0);
  memset(h, 0xab, bytes);
  ck_assert_int_eq(kiln_buffer_write(b, 0, h, bytes, &st), 0);
  kiln_buffer_free(b);
  kiln_buffer *x = NULL, *y = NULL, *out[1] = {NULL};
  ck_assert_int_eq(kiln_buffer_alloc(d, bytes, &x, &st), 0);
  ck_assert_ptr_eq(x->mem, mem);
  ck_assert_int_eq(kiln_buffer_alloc(d, bytes, &y, &st), 0);
  for (int64_t i = 0; i < n; i++) hy[i] = gi(i);
  ck_assert_int_eq(kiln_buffer_write(y, 0, hy, bytes, &st), 0);
  kiln_buffer *args[] = {x, y};
  ck_assert_int_eq(kiln_loaded_execute(l, args, 2, NULL, out, 1, &st), 0);
  ck_assert_int_eq(kiln_buffer_read(out[0], 0, h, bytes, &st), 0);
  for (int64_t i = 0; i < n; i++) ck_assert_float_eq(h[i], gi(i));

  /* The next run's result takes the freed result's memory. */
  void *out_mem = out[0]->mem;
  kiln_buffer_free(out[0]);
  for (int64_t i = 0; i < n; i++) h[i] = fi(i);
  ck_assert_int_eq(kiln_buffer_write(x, 0, h, bytes, &st), 0);
  ck_assert_int_eq(kiln_loaded_execute(l, args, 2, NULL, out, 1, &st), 0);
  ck_assert_ptr_eq(out[0]->mem, out_mem);
  ck_assert_int_eq(kiln_buffer_read(out[0], 0, h, bytes, &st), 0);
  for (int64_t i = 0; i < n; i++) ck_assert_float_eq(h[i], fi(i) + gi(i));
  kiln_buffer_free(out[0]);
  kiln_buffer_free(x);
  kiln_buffer_free(y);
  kiln_loaded_destroy(l);
  kiln_executable_destroy(e);
  kiln_backend_destroy(be);
  free(h);
  free(hy);
}
END_TEST

/* OpenBLAS core selection: a core the user set is never overridden, and a
 * suggestion is only ever one of the two cores kiln knows to ask for. */
START_TEST(test_blas_core) {
  ck_assert_ptr_nonnull(kiln_cpu_blas_core());
  ck_assert_int_gt((int)strlen(kiln_cpu_blas_core()), 0);
  ck_assert_int_eq(setenv("OPENBLAS_CORETYPE", "Prescott", 1), 0);
  ck_assert_ptr_null(kiln_cpu_blas_better_core());
  char *argv[] = {"not-a-program", NULL};
  kiln_cpu_blas_select_core(argv); /* returns: nothing to change */
  ck_assert_str_eq(getenv("OPENBLAS_CORETYPE"), "Prescott");
  ck_assert_int_eq(unsetenv("OPENBLAS_CORETYPE"), 0);
  const char *better = kiln_cpu_blas_better_core();
  if (better) {
    ck_assert_msg(strcmp(better, "SkylakeX") == 0 || strcmp(better, "Haswell") == 0, "%s", better);
    ck_assert_str_ne(better, kiln_cpu_blas_core());
  }
}
END_TEST

/* ---- concurrency and devices -------------------------------------------- */

typedef struct worker_arg {
  kiln_loaded *l;
  int32_t base;
  int failures;
} worker_arg;

static void *hammer(void *p) {
  worker_arg *w = p;
  for (int32_t i = 0; i < 200; i++) {
    kiln_literal *a = s32(w->base + i % 50), *res = NULL;
    const kiln_literal *args[] = {a};
    kiln_status s;
    kiln_status_clear(&s);
    if (kiln_loaded_run(w->l, args, 1, NULL, &res, &s) != 0 ||
        *(int32_t *)res->data != w->base + i % 50)
      w->failures++;
    kiln_literal_destroy(res);
    kiln_literal_destroy(a);
  }
  return NULL;
}

START_TEST(test_concurrent_runs) {
  /* The while counter keeps its state in the temporary arena: runs sharing
   * an arena would corrupt each other's counts. */
  kiln_executable *e = counter_exe(false);
  kiln_backend *be = cpu(1, 3);
  kiln_loaded *l = NULL;
  ck_assert_int_eq(kiln_device_load(kiln_backend_device(be, 0), e, &l, &st), 0);
  pthread_t t[6];
  worker_arg w[6];
  for (int i = 0; i < 6; i++) {
    w[i] = (worker_arg){l, 1000 * (i + 1), 0};
    ck_assert_int_eq(pthread_create(&t[i], NULL, hammer, &w[i]), 0);
  }
  for (int i = 0; i < 6; i++) {
    pthread_join(t[i], NULL);
    ck_assert_int_eq(w[i].failures, 0);
  }
  kiln_loaded_destroy(l);
  kiln_backend_destroy(be);
  kiln_executable_destroy(e);
}
END_TEST

typedef struct add_arg {
  kiln_loaded *l;
  int failures;
} add_arg;

static void *hammer_add(void *p) {
  add_arg *w = p;
  const int64_t n = 1 << 18;
  kiln_literal *x = f32s(n, fi), *y = f32s(n, gi);
  const kiln_literal *args[] = {x, y};
  for (int r = 0; r < 20; r++) {
    kiln_literal *res = NULL;
    kiln_status s;
    kiln_status_clear(&s);
    if (kiln_loaded_run(w->l, args, 2, NULL, &res, &s) != 0) {
      w->failures++;
      continue;
    }
    for (int64_t i = 0; i < n; i += 997)
      if (((float *)res->data)[i] != fi(i) + gi(i)) w->failures++;
    kiln_literal_destroy(res);
  }
  kiln_literal_destroy(x);
  kiln_literal_destroy(y);
  return NULL;
}

START_TEST(test_devices_side_by_side) {
  /* Four devices of two threads, one loaded copy each, all running at once;
   * plus two threads sharing device 0's pool. */
  kiln_executable *e = add_exe(1 << 18);
  kiln_backend *be = cpu(4, 2);
  kiln_loaded *l[4];
  for (uint32_t d = 0; d < 4; d++)
    ck_assert_int_eq(kiln_device_load(kiln_backend_device(be, d), e, &l[d], &st), 0);
  pthread_t t[5];
  add_arg w[5];
  for (int i = 0; i < 5; i++) {
    w[i] = (add_arg){l[i % 4], 0};
    ck_assert_int_eq(pthread_create(&t[i], NULL, hammer_add, &w[i]), 0);
  }
  for (int i = 0; i < 5; i++) {
    pthread_join(t[i], NULL);
    ck_assert_int_eq(w[i].failures, 0);
  }
  for (int d = 0; d < 4; d++) kiln_loaded_destroy(l[d]);
  kiln_backend_destroy(be);
  kiln_executable_destroy(e);
}
END_TEST

START_TEST(test_serialized_roundtrip) {
  kiln_executable *e = counter_exe(false);
  uint8_t *blob = NULL;
  size_t len = 0;
  ck_assert_msg(kiln_executable_serialize(e, &blob, &len, &st) == 0, "%s", st.msg);
  kiln_literal *a = s32(33), *res = NULL;
  const kiln_literal *args[] = {a};
  kiln_status_clear(&st);
  ck_assert_msg(kiln_run_executable_blob(blob, len, NULL, NULL, args, 1, &res, &st) == 0, "%s",
                st.msg);
  ck_assert_int_eq(*(int32_t *)res->data, 33);
  kiln_literal_destroy(res);
  /* A truncated blob is a status. */
  kiln_status_clear(&st);
  ck_assert_int_ne(kiln_run_executable_blob(blob, len / 2, NULL, NULL, args, 1, &res, &st), 0);
  ck_assert_ptr_null(res);
  ck_assert_int_ne(st.code, 0);
  kiln_free(blob);
  kiln_literal_destroy(a);
  kiln_executable_destroy(e);
}
END_TEST

/* ---- GEMM --------------------------------------------------------------- */

/* C = alpha op(A) op(B) + beta C0 for every batch, naive, in double. */
static void naive_gemm(const kiln_gemm *g, const double *a, const double *b, const double *c0,
                       double *c) {
  for (int64_t bi = 0; bi < g->batch; bi++)
    for (int64_t i = 0; i < g->m; i++)
      for (int64_t j = 0; j < g->n; j++) {
        double s = 0;
        for (int64_t k = 0; k < g->k; k++) {
          double av = g->trans_a ? a[bi * g->stride_a + k * g->lda + i]
                                 : a[bi * g->stride_a + i * g->lda + k];
          double bv = g->trans_b ? b[bi * g->stride_b + j * g->ldb + k]
                                 : b[bi * g->stride_b + k * g->ldb + j];
          s += av * bv;
        }
        int64_t ci = bi * g->stride_c + i * g->ldc + j;
        c[ci] = g->alpha * s + (g->beta != 0 ? g->beta * c0[ci] : 0);
      }
}

static int64_t span(int64_t batch, int64_t rows, int64_t cols, int64_t ld, int64_t stride) {
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

/* Runs one GEMM step (C starts as a copy of parameter 2) and compares. */
static void check_gemm(kiln_gemm g, uint32_t threads) {
  size_t es = kiln_dtype_size(g.dtype);
  int64_t na = span(g.batch, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.stride_a);
  int64_t nb = span(g.batch, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.stride_b);
  int64_t nc = span(g.batch, g.m, g.n, g.ldc, g.stride_c);
  xb *b = xb_new();
  uint32_t A = param(b, shp(b, g.dtype, 1, &na, NULL));
  uint32_t B = param(b, shp(b, g.dtype, 1, &nb, NULL));
  uint32_t C0 = param(b, shp(b, g.dtype, 1, &nc, NULL));
  uint32_t C = result(b, shp(b, g.dtype, 1, &nc, NULL));
  copy(b, 0, C, C0, (uint64_t)nc * es);
  step(b, 0, KILN_STEP_GEMM, (uint32_t[]){A, B, C}, 3, NULL, 0)->gemm = g;
  kiln_executable *e = finish(b);
  kiln_literal *la = lit(g.dtype, 1, &na), *lb = lit(g.dtype, 1, &nb), *lc = lit(g.dtype, 1, &nc);
  double *da = malloc(na * 8), *db = malloc(nb * 8), *dc = malloc(nc * 8), *want = malloc(nc * 8);
  for (int64_t i = 0; i < na; i++) da[i] = (double)((i * 7) % 11) - 5.0;
  for (int64_t i = 0; i < nb; i++) db[i] = (double)((i * 5) % 13) * 0.25 - 1.5;
  for (int64_t i = 0; i < nc; i++) dc[i] = want[i] = (double)(i % 5);
  for (int64_t i = 0; i < na; i++) kiln_literal_set_f64(la, i, da[i]);
  for (int64_t i = 0; i < nb; i++) kiln_literal_set_f64(lb, i, db[i]);
  for (int64_t i = 0; i < nc; i++) kiln_literal_set_f64(lc, i, dc[i]);
  naive_gemm(&g, da, db, dc, want);
  kiln_literal *res = NULL;
  const kiln_literal *args[] = {la, lb, lc};
  ck_assert_msg(run1(e, threads, args, 3, NULL, &res) == 0, "%s", st.msg);
  double tol = g.dtype == KILN_F32 ? 1e-4 : 1e-10;
  for (int64_t i = 0; i < nc; i++) {
    double got = kiln_literal_get_f64(res, i);
    ck_assert_msg(fabs(got - want[i]) <= tol * (1 + fabs(want[i])),
                  "C[%lld] = %g, expected %g (m %lld n %lld k %lld ta %d tb %d batch %lld)",
                  (long long)i, got, want[i], (long long)g.m, (long long)g.n, (long long)g.k,
                  g.trans_a, g.trans_b, (long long)g.batch);
  }
  kiln_literal_destroy(res);
  kiln_literal_destroy(la);
  kiln_literal_destroy(lb);
  kiln_literal_destroy(lc);
  free(da), free(db), free(dc), free(want);
  kiln_executable_destroy(e);
}

static kiln_gemm gemm_of(kiln_dtype t, int64_t batch, int64_t m, int64_t n, int64_t k, int ta,
                         int tb, int64_t pad) {
  kiln_gemm g = {.dtype = t,
                 .batch = batch,
                 .m = m,
                 .n = n,
                 .k = k,
                 .trans_a = (uint8_t)ta,
                 .trans_b = (uint8_t)tb,
                 .alpha = 1,
                 .beta = 0};
  g.lda = (ta ? m : k) + pad;
  g.ldb = (tb ? k : n) + pad;
  g.ldc = n + pad;
  g.stride_a = (ta ? k : m) * g.lda + pad;
  g.stride_b = (tb ? n : k) * g.ldb + pad;
  g.stride_c = m * g.ldc + pad;
  return g;
}

START_TEST(test_gemm_shapes) {
  kiln_dtype types[] = {KILN_F32, KILN_F64};
  for (int t = 0; t < 2; t++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        check_gemm(gemm_of(types[t], 1, 5, 7, 3, ta, tb, 0), 1);
        check_gemm(gemm_of(types[t], 3, 4, 6, 5, ta, tb, 2), 1);     /* batches, padded lds */
        check_gemm(gemm_of(types[t], 2, 130, 70, 60, ta, tb, 1), 3); /* split over rows */
        check_gemm(gemm_of(types[t], 1, 40, 600, 50, ta, tb, 0), 4); /* split over columns */
        check_gemm(gemm_of(types[t], 9, 33, 31, 40, ta, tb, 3), 2);  /* split over batches */
      }
}
END_TEST

START_TEST(test_gemm_alpha_beta_edges) {
  kiln_gemm g = gemm_of(KILN_F64, 2, 6, 5, 4, 0, 1, 1);
  g.alpha = -0.5;
  g.beta = 2.0;
  check_gemm(g, 1);
  check_gemm(g, 2);
  g = gemm_of(KILN_F32, 1, 3, 4, 0, 0, 0, 0); /* k = 0: C = beta C */
  g.lda = 1;
  g.beta = 3;
  check_gemm(g, 1);
  g.beta = 0;
  check_gemm(g, 1);
  check_gemm(gemm_of(KILN_F32, 1, 1, 1, 1, 0, 0, 0), 1);
  check_gemm(gemm_of(KILN_F32, 1, 512, 512, 512, 0, 0, 0), 2);
}
END_TEST

/* f32 pieces of at most KILN__SMALL_GEMM_M rows with B not transposed (and
 * of the size the tiles take) run through cpu_gemm_small.c's tiles (12 rows
 * by 32 columns, masked edges) on an AVX-512 machine: every row and column
 * remainder, op(A) either way, padded leading dimensions, alpha and beta,
 * split over threads or not, and B just outside the sizes they take. */
START_TEST(test_gemm_small_tiles) {
  int64_t ms[] = {1, 3, 8, 11, 12, 13, 23, 33, KILN__SMALL_GEMM_M, KILN__SMALL_GEMM_M + 1};
  int64_t ns[] = {1, 15, 16, 17, 33, 48, 100};
  for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
      for (int ki = 0; ki < 3; ki++)
        for (int ta = 0; ta < 2; ta++) {
          int64_t n = ns[ni], k = KILN__SMALL_GEMM_MIN_NK / n + (ki == 1 ? 3 : 0);
          if (ki == 2) k = KILN__SMALL_GEMM_MIN_NK / n - 1;   /* just below: OpenBLAS */
          if (ki == 1 && n == 1) k = KILN__SMALL_GEMM_MAX_NK; /* the largest taken */
          kiln_gemm g =
              gemm_of(KILN_F32, 1 + (int64_t)(ni % 2), ms[mi], n, k, ta, 0, (int64_t)(mi % 3));
          if ((mi + (size_t)ki) % 2) {
            g.alpha = -0.5;
            g.beta = 2.0;
          }
          check_gemm(g, 1 + (uint32_t)(ki % 2));
        }
}
END_TEST

/* ---- hostile executables ------------------------------------------------- */

/* A fresh valid add executable to break in one place. */
#define BREAK(stmt, code, message) \
  do { \
    kiln_executable *e_ = add_exe(8); \
    kiln_executable *e = e_; \
    stmt; \
    ck_assert_int_eq(load_rc(e, UINT64_C(1) << 30), code); \
    ck_assert_msg(strncmp(st.msg, message, strlen(message)) == 0, "message: %s", st.msg); \
    kiln_executable_destroy(e_); \
  } while (0)

START_TEST(test_hostile_header_and_code) {
  BREAK(e->format_version = 99, KILN_EINVAL,
        "executable format version 99, this executor runs version 7");
  BREAK(e->target = "cuda-sm_90", KILN_EINVAL,
        "executable compiled for target 'cuda-sm_90', not a cpu target");
  BREAK(e->target = "zx81", KILN_EINVAL, "executable compiled for target 'zx81', not a cpu target");
  BREAK(e->target = NULL, KILN_EINVAL, "executable names no target");
  BREAK(e->target = "", KILN_EINVAL, "executable names no target"); /* not the default */
  BREAK(e->target = "interp", KILN_EINVAL, "executable compiled for target 'interp', not a cpu");
  BREAK(e->code = (uint8_t *)"not an elf at all, not an elf at all, not an elf at all, really!",
        KILN_EINVAL, "the code object is not an ELF shared object");
  BREAK(e->ncode = 10, KILN_EINVAL, "the code object is not an ELF shared object");
  BREAK(e->ncode = 0, KILN_EINVAL, "10 kernels but no code object");
  BREAK(e->nkernels = 11, KILN_EINVAL, "the code object does not export kiln_kernel_10");
  /* Truncated: the loader would map segments past the end and fault. */
  for (size_t cut = 64; cut < g_ncode; cut += g_ncode / 7)
    BREAK(e->ncode = cut, KILN_EINVAL, "the code object's");
  /* Another machine's object. */
  uint8_t *other = malloc(g_ncode);
  memcpy(other, g_code, g_ncode);
  other[18] ^= 0x40; /* e_machine */
  BREAK(e->code = other, KILN_EINVAL, "the code object is not a 64-bit little-endian shared");
  free(other);
  BREAK(e->temp_bytes = UINT64_C(1) << 62, KILN_ELIMIT,
        "executable needs a 4611686018427387904-byte temporary arena, the limit is "
        "1073741824");
}
END_TEST

/* Makes step 0 of the add executable a convolution of x [1, 1, 8] with y
 * as a [1, 1, 8] kernel into z [1, 1, 1] (a dot product); returns it. */
static kiln_conv *as_conv(kiln_executable *e) {
  kiln_step *s = &e->programs[0].steps[0];
  kiln_conv *c = kiln_arena_calloc(e->arena, 1, sizeof *c);
  *c = (kiln_conv){.dtype = KILN_F32,
                   .nspatial = 1,
                   .feature_groups = 1,
                   .batch_groups = 1,
                   .lhs_dims = {1, 1, 8},
                   .lhs_strides = {8, 8, 1},
                   .rhs_dims = {1, 1, 8},
                   .rhs_strides = {8, 8, 1},
                   .out_dims = {1, 1, 1},
                   .out_strides = {1, 1, 1},
                   .stride = {1},
                   .lhs_dilate = {1},
                   .rhs_dilate = {1}};
  s->kind = KILN_STEP_CONV;
  s->conv = c;
  return c;
}

START_TEST(test_conv_step) {
  kiln_executable *e = add_exe(8);
  as_conv(e);
  kiln_literal *x = lit(KILN_F32, 1, (int64_t[]){8}), *y = lit(KILN_F32, 1, (int64_t[]){8});
  float want = 0;
  for (int i = 0; i < 8; i++) {
    ((float *)x->data)[i] = fi(i);
    ((float *)y->data)[i] = gi(i);
    want += fi(i) * gi(i);
  }
  kiln_literal *out = NULL;
  const kiln_literal *args[] = {x, y};
  ck_assert_int_eq(run1(e, 2, args, 2, NULL, &out), 0);
  ck_assert_float_eq(((float *)out->data)[0], want);
  kiln_literal_destroy(out);
  kiln_literal_destroy(x);
  kiln_literal_destroy(y);
  kiln_executable_destroy(e);
}
END_TEST

START_TEST(test_hostile_conv_step) {
  BREAK(as_conv(e);
        e->programs[0].steps[0].conv = NULL, KILN_EINVAL, "conv step without a description");
  BREAK(as_conv(e)->out_dims[2] = 2, KILN_EINVAL,
        "conv: out spatial dimension 0 has size 2, the window gives 1");
  BREAK(as_conv(e)->lhs_strides[2] = 2, KILN_EINVAL, "conv: lhs spans 60 bytes, its slot has 32");
  BREAK(as_conv(e)->nspatial = 4, KILN_EINVAL, "conv: 4 spatial dimensions (at most 3)");
  BREAK(as_conv(e)->dtype = KILN_BF16, KILN_EINVAL, "conv: element type");
  BREAK(as_conv(e); e->programs[0].steps[0].args[2] = 0, KILN_EINVAL,
                    "conv writes slot 0, a parameter or constant");
}
END_TEST

START_TEST(test_hostile_tables) {
  BREAK(e->programs[0].steps[0].args[1] = 99, KILN_EINVAL,
        "argument 1: slot 99 out of range (3 slots)");
  BREAK(e->programs[0].steps[0].kernel = 10, KILN_EINVAL, "kernel 10 out of range (10 kernels)");
  BREAK(e->programs[0].steps[0].kind = (kiln_step_kind)17, KILN_EINVAL, "unknown step kind 17");
  BREAK(e->programs[0].steps[0].sub[0] = 3;
        e->programs[0].steps[0].nsub = 1, KILN_EINVAL, "sub-program 3 out of range (1 programs)");
  BREAK(e->nprograms = 0, KILN_EINVAL, "no entry program");
  BREAK(e->slots[2].index = 5, KILN_EINVAL, "slot 2: result leaf 5 of 1");
  BREAK(e->slots[0].index = 2, KILN_EINVAL, "slot 0: parameter 2 of 2");
  BREAK(e->slots[0].leaf = 1, KILN_EINVAL, "slot 0: parameter 0 has no leaf 1");
  BREAK(e->slots[2].kind = (kiln_slot_kind)9, KILN_EINVAL, "slot 2: unknown kind 9");
  BREAK(e->slots[2].size = 4, KILN_EINVAL, "result 0: slot 2 has 4 bytes, the binding's shape 32");
  BREAK(e->slots[2] = ((kiln_slot){KILN_SLOT_TEMP, 0, 0, 8, 32});
        e->temp_bytes = 16, KILN_EINVAL, "slot 2: bytes [8, +32) outside the 16-byte arena");
  BREAK(e->slots[2] = ((kiln_slot){KILN_SLOT_CONSTANT, 0, 0, UINT64_MAX, 32}), KILN_EINVAL,
        "slot 2: bytes [18446744073709551615, +32) outside the 0-byte constants");
  BREAK(e->results[0].slot = 7, KILN_EINVAL, "result 0: slot 7 out of range (3 slots)");
  BREAK(e->nparam_leaves = 1, KILN_EINVAL, "1 parameter bindings for 2 leaves");
  BREAK(e->params[1].shape.dims[0] = 9, KILN_EINVAL,
        "parameter 1: slot 1 has 32 bytes, the binding's shape 36");
  BREAK(e->params[1].shape.dtype = KILN_S32, KILN_EINVAL,
        "parameter leaf 1: binding shape differs from the entry's");
  BREAK(e->params[1].shape.dims[0] = -1, KILN_EINVAL, "parameter 1: dim 0 is -1");
  BREAK(e->result_shape.dtype = KILN_TUPLE;
        e->result_shape.rank = 0, KILN_EINVAL, "1 result bindings for 0 leaves");
  BREAK(e->params = NULL, KILN_EINVAL, "parameter bindings missing");
  BREAK(e->slots = NULL, KILN_EINVAL, "3 slots missing");
  BREAK(e->programs[0].steps[0].range = UINT64_MAX, KILN_EINVAL, "range 18446744073709551615");
}
END_TEST

START_TEST(test_hostile_steps) {
  /* copy too long, into a parameter; gemm lds and writes; selector sizes. */
  xb *b = xb_new();
  uint32_t x = param(b, shp(b, KILN_F32, 1, (int64_t[]){16}, NULL));
  uint32_t z = result(b, shp(b, KILN_F32, 1, (int64_t[]){16}, NULL));
  uint32_t t2 = temp(b, 2);
  kiln_step *c = step(b, 0, KILN_STEP_COPY, (uint32_t[]){z, x}, 2, NULL, 0);
  c->range = 64;
  kiln_executable *e = finish(b);
  ck_assert_int_eq(load_rc(e, 0), 0);
  c = &e->programs[0].steps[0];
  c->range = 65;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "copy of 65 bytes, slot 1 has 64");
  ck_assert_str_eq(st.where, "program 0 step 0 (copy)");
  c->range = 64;
  c->args[0] = x;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "copy writes slot 0, a parameter or constant");
  c->nargs = 1;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "copy takes 2 slots, 1 given");
  c->nargs = 2;
  c->args[0] = z;

  /* gemm: A = B = x viewed as 4x4, C = z */
  c->kind = KILN_STEP_GEMM;
  c->nargs = 3;
  c->args = kiln_arena_memdup(e->arena, (uint32_t[]){x, x, z}, 12);
  c->gemm = gemm_of(KILN_F32, 1, 4, 4, 4, 0, 0, 0);
  ck_assert_msg(load_rc(e, 0) == 0, "%s", st.msg);
  c->gemm.lda = 3;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "gemm A: leading dimension 3 (at least 4), stride 16");
  c->gemm.lda = 5;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "gemm A spans 76 bytes, slot 0 has 64");
  c->gemm.lda = 4;
  c->gemm.batch = 2;
  c->gemm.stride_c = 8;
  c->gemm.stride_a = c->gemm.stride_b = 0;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "gemm C spans 96 bytes, slot 1 has 64");
  c->gemm = gemm_of(KILN_F32, 1, 4, 4, 4, 0, 0, 0);
  c->gemm.dtype = KILN_S32;
  ck_assert_int_eq(load_rc(e, 0), KILN_EUNIMPL);
  c->gemm.dtype = KILN_F32;
  c->gemm.trans_a = 2;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  c->gemm.trans_a = 0;
  c->gemm.m = (int64_t)1 << 40;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  c->gemm.m = 4;
  c->args[2] = x;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "gemm writes slot 0, a parameter or constant");
  c->args[2] = z;

  /* conditional selector of 2 bytes; while without a predicate. */
  c->kind = KILN_STEP_CONDITIONAL;
  c->args[0] = t2;
  c->nargs = 1;
  c->nsub = 1;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "selector slot 2 has 2 bytes (1 for pred, 4 for s32)");
  c->nsub = 0;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "conditional takes branches and a selector slot, has 0 and 1");
  c->kind = KILN_STEP_WHILE;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "while takes 2 programs and a predicate slot, has 0 and 1");
  /* program 0 running itself */
  c->kind = KILN_STEP_CALL;
  c->nsub = 1;
  c->sub[0] = 0;
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "program 0 runs itself (a cycle)");
  kiln_executable_destroy(e);
}
END_TEST

START_TEST(test_hostile_deep_nesting) {
  /* Programs each calling the next, one level more than the
   * KILN_NESTING_CAPACITY the verifier can ever let through. */
  const uint32_t n = KILN_NESTING_CAPACITY + 2;
  kiln_executable *e = kiln_executable_create();
  e->target = "cpu";
  e->result_shape.dtype = KILN_TUPLE;
  e->nprograms = n;
  e->programs = kiln_arena_calloc(e->arena, n, sizeof *e->programs);
  for (uint32_t p = 0; p + 1 < n; p++) {
    kiln_step *s = kiln_arena_calloc(e->arena, 1, sizeof *s);
    s->kind = KILN_STEP_CALL;
    s->sub = kiln_arena_memdup(e->arena, &(uint32_t){p + 1}, 4);
    s->nsub = 1;
    e->programs[p].steps = s;
    e->programs[p].nsteps = 1;
  }
  ck_assert_int_eq(load_rc(e, 0), KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "programs nest deeper than 4096");
  e->nprograms = n - 1; /* the last program calls one out of range now */
  ck_assert_int_eq(load_rc(e, 0), KILN_EINVAL);
  char want[64];
  snprintf(want, sizeof want, "sub-program %u out of range (%u programs)", n - 1, n - 1);
  ck_assert_str_eq(st.msg, want);
  e->programs[n - 2].nsteps = 0;
  ck_assert_int_eq(load_rc(e, 0), 0); /* exactly the capacity is fine, and runs */
  /* No kernels, no code: a program of nothing runs. */
  kiln_literal *res = NULL;
  ck_assert_int_eq(run1(e, 1, NULL, 0, NULL, &res), 0);
  ck_assert_uint_eq(res->shape.dtype, KILN_TUPLE);
  kiln_literal_destroy(res);
  kiln_executable_destroy(e);
}
END_TEST

START_TEST(test_temp_limit) {
  xb *b = xb_new();
  result(b, shp(b, KILN_F32, 0, NULL, NULL));
  temp(b, UINT64_C(1) << 40);
  kiln_executable *e = finish(b);
  ck_assert_int_eq(load_rc(e, UINT64_C(1) << 30), KILN_ELIMIT);
  ck_assert_str_eq(
      st.msg, "executable needs a 1099511627776-byte temporary arena, the limit is 1073741824");
  kiln_executable_destroy(e);
}
END_TEST

/* Loading executables one after another reuses memfd numbers, hence the
 * /proc/self/fd/N paths: each load must map its own code, not find an
 * earlier object by path. Kernel 0 adds in one code object and multiplies
 * in the other. */
START_TEST(test_reload_distinct_code) {
  kiln_backend *be = cpu(1, 1);
  kiln_literal *x = f32s(4, fi), *y = f32s(4, gi), *res = NULL;
  const kiln_literal *args[] = {x, y};
  for (int round = 0; round < 12; round++) {
    bool mul = round % 2;
    kiln_executable *e = add_exe(4);
    if (mul) {
      e->code = g_code_mul;
      e->ncode = g_ncode_mul;
      e->nkernels = 1;
    }
    ck_assert_msg(run_on(be, 0, e, args, 2, NULL, &res) == 0, "%s", st.msg);
    for (int i = 0; i < 4; i++)
      ck_assert_float_eq(((float *)res->data)[i], mul ? fi(i) * gi(i) : fi(i) + gi(i));
    kiln_literal_destroy(res);
    kiln_executable_destroy(e);
  }
  /* Both loaded at once, too. */
  kiln_executable *ea = add_exe(4), *em = add_exe(4);
  em->code = g_code_mul;
  em->ncode = g_ncode_mul;
  em->nkernels = 1;
  kiln_loaded *la = NULL, *lm = NULL;
  ck_assert_int_eq(kiln_device_load(kiln_backend_device(be, 0), ea, &la, &st), 0);
  ck_assert_int_eq(kiln_device_load(kiln_backend_device(be, 0), em, &lm, &st), 0);
  ck_assert_int_eq(kiln_loaded_run(lm, args, 2, NULL, &res, &st), 0);
  ck_assert_float_eq(((float *)res->data)[3], fi(3) * gi(3));
  kiln_literal_destroy(res);
  ck_assert_int_eq(kiln_loaded_run(la, args, 2, NULL, &res, &st), 0);
  ck_assert_float_eq(((float *)res->data)[3], fi(3) + gi(3));
  kiln_literal_destroy(res);
  kiln_loaded_destroy(la);
  kiln_loaded_destroy(lm);
  kiln_executable_destroy(ea);
  kiln_executable_destroy(em);
  kiln_literal_destroy(x);
  kiln_literal_destroy(y);
  kiln_backend_destroy(be);
}
END_TEST

/* Every allocation of loading and running, failed in turn: each failure is
 * KILN_ENOMEM with nothing leaked (ASan checks), never a crash. */
START_TEST(test_out_of_memory_anywhere) {
  kiln_executable *exes[3] = {counter_exe(false), add_exe(16), NULL};
  {
    int64_t dims[] = {2, 3}, col[] = {0, 1};
    xb *b = xb_new();
    uint32_t x = param(b, shp(b, KILN_F32, 2, dims, col));
    uint32_t z = result(b, shp(b, KILN_F32, 2, dims, col));
    kernel(b, 0, 6, 6, (uint32_t[]){x, z}, 2);
    exes[2] = finish(b);
  }
  kiln_backend *be = cpu(1, 1);
  for (int k = 0; k < 3; k++) {
    kiln_literal *args[2];
    uint32_t nargs = exes[k]->nparams;
    for (uint32_t i = 0; i < nargs; i++) {
      ck_assert_int_eq(kiln_literal_create(NULL, &exes[k]->param_shapes[i], 0, &args[i], &st), 0);
      memset(args[i]->data, 0, args[i]->nbytes);
    }
    bool succeeded = false;
    for (long n = 1; n < 400 && !succeeded; n++) {
      kiln_loaded *l = NULL;
      kiln_literal *res = NULL;
      kiln_status_clear(&st);
      kiln_alloc_fail_after(n);
      int rc = kiln_device_load(kiln_backend_device(be, 0), exes[k], &l, &st);
      if (rc == 0)
        rc = kiln_loaded_run(l, (const kiln_literal *const *)args, nargs, NULL, &res, &st);
      kiln_alloc_fail_after(0);
      ck_assert_msg(rc == 0 || rc == KILN_ENOMEM, "exe %d, failing allocation %ld: %d %s", k, n, rc,
                    st.msg);
      succeeded = rc == 0;
      kiln_literal_destroy(res);
      kiln_loaded_destroy(l);
    }
    ck_assert(succeeded);
    for (uint32_t i = 0; i < nargs; i++) kiln_literal_destroy(args[i]);
    kiln_executable_destroy(exes[k]);
  }
  kiln_backend_destroy(be);
}
END_TEST

/* ---- overheads (printed) ------------------------------------------------- */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double now(void);

/* Busy for *ctx seconds. */
static void busy(void *ctx, uint64_t c) {
  double until = now() + *(const double *)ctx;
  while (now() < until) continue;
  (void)c;
}

/* Best of `reps` timings of fn, in seconds (the machine may be shared). */
#define BEST_OF(reps, out, body) \
  do { \
    out = 1e30; \
    for (int r_ = 0; r_ < (reps); r_++) { \
      double t_ = now(); \
      body; \
      t_ = now() - t_; \
      if (t_ < out) out = t_; \
    } \
  } while (0)

START_TEST(test_overheads) {
  /* Two chunks of 20 us on a pool of two threads: what a split launch
   * costs beyond the 20 us it ideally takes (waking the worker, joining). */
  {
    kiln__cpu_pool *pool = NULL;
    ck_assert_int_eq(kiln__cpu_pool_create(2, &pool, &st), 0);
    double t, work = 20e-6;
    BEST_OF(50, t, for (int i = 0; i < 100; i++) kiln__cpu_pool_run(pool, busy, &work, 2));
    printf("cpu runtime: split launch overhead (2 x 20 us chunks, 2 threads): %.2f us\n",
           (t / 100 - work) * 1e6);
    kiln__cpu_pool_destroy(pool);
  }
  /* An entry of MAXSTEPS empty kernel launches, range 1 (inline). */
  xb *b = xb_new();
  result(b, shp(b, KILN_F32, 0, NULL, NULL));
  for (int i = 0; i < MAXSTEPS; i++) kernel(b, 0, 5, 1, NULL, 0);
  kiln_executable *e = finish(b);
  kiln_backend *be = cpu(1, 0);
  uint32_t threads = kiln_device_threads(kiln_backend_device(be, 0));
  kiln_loaded *l = NULL;
  ck_assert_int_eq(kiln_device_load(kiln_backend_device(be, 0), e, &l, &st), 0);
  kiln_literal *res = NULL;
  int runs = 2000;
  double per_run, empty_run;
  BEST_OF(
      10, per_run, for (int i = 0; i < runs; i++) {
        kiln_loaded_run(l, NULL, 0, NULL, &res, &st);
        kiln_literal_destroy(res);
      });
  per_run /= runs;
  kiln_loaded_destroy(l);
  kiln_executable_destroy(e);
  /* A run with no steps: the fixed cost of a run. */
  b = xb_new();
  result(b, shp(b, KILN_F32, 0, NULL, NULL));
  e = finish(b);
  ck_assert_int_eq(kiln_device_load(kiln_backend_device(be, 0), e, &l, &st), 0);
  BEST_OF(
      10, empty_run, for (int i = 0; i < runs; i++) {
        kiln_loaded_run(l, NULL, 0, NULL, &res, &st);
        kiln_literal_destroy(res);
      });
  empty_run /= runs;
  kiln_loaded_destroy(l);
  kiln_executable_destroy(e);
  printf("cpu runtime (%u threads): run with no steps %.2f us; empty kernel step %.1f ns\n",
         threads, empty_run * 1e6, (per_run - empty_run) / MAXSTEPS * 1e9);

  /* A split launch: 1M-element add forced over the pool vs one thread. */
  const int64_t n = 1 << 22;
  e = add_exe(n);
  kiln_literal *x = f32s(n, fi), *y = f32s(n, gi);
  const kiln_literal *args[] = {x, y};
  ck_assert_int_eq(kiln_device_load(kiln_backend_device(be, 0), e, &l, &st), 0);
  ck_assert_int_eq(kiln_loaded_run(l, args, 2, NULL, &res, &st), 0);
  kiln_literal_destroy(res);
  double add_pool, add_one;
  BEST_OF(20, add_pool, kiln_loaded_run(l, args, 2, NULL, &res, &st); kiln_literal_destroy(res));
  kiln_loaded_destroy(l);
  kiln_backend *one = cpu(1, 1);
  ck_assert_int_eq(kiln_device_load(kiln_backend_device(one, 0), e, &l, &st), 0);
  BEST_OF(20, add_one, kiln_loaded_run(l, args, 2, NULL, &res, &st); kiln_literal_destroy(res));
  kiln_loaded_destroy(l);
  kiln_backend_destroy(one);
  printf("cpu runtime: add of 4M f32 (best of 20): %.2f ms on %u threads, %.2f ms on 1\n",
         add_pool * 1e3, threads, add_one * 1e3);
  kiln_literal_destroy(x);
  kiln_literal_destroy(y);
  kiln_executable_destroy(e);

  /* GEMM 512x512x512 f32 through a step vs cblas_sgemm directly. */
  const int64_t m = 512;
  b = xb_new();
  kiln_shape sq = shp(b, KILN_F32, 2, (int64_t[]){m, m}, NULL);
  uint32_t A = param(b, sq), B = param(b, sq), C = result(b, sq);
  step(b, 0, KILN_STEP_GEMM, (uint32_t[]){A, B, C}, 3, NULL, 0)->gemm =
      gemm_of(KILN_F32, 1, m, m, m, 0, 0, 0);
  e = finish(b);
  kiln_literal *la = lit(KILN_F32, 2, (int64_t[]){m, m}), *lb = lit(KILN_F32, 2, (int64_t[]){m, m});
  for (int64_t i = 0; i < m * m; i++) {
    ((float *)la->data)[i] = fi(i);
    ((float *)lb->data)[i] = gi(i);
  }
  const kiln_literal *gargs[] = {la, lb};
  ck_assert_int_eq(kiln_device_load(kiln_backend_device(be, 0), e, &l, &st), 0);
  ck_assert_int_eq(kiln_loaded_run(l, gargs, 2, NULL, &res, &st), 0);
  kiln_literal_destroy(res);
  int reps = 10;
  double step_s, direct1, directn;
  BEST_OF(reps, step_s, kiln_loaded_run(l, gargs, 2, NULL, &res, &st); kiln_literal_destroy(res));
  float *cc = malloc(m * m * 4);
  int blas_threads = openblas_get_num_threads();
  BEST_OF(reps, direct1,
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1, la->data, m, lb->data,
                      m, 0, cc, m));
  openblas_set_num_threads((int)threads);
  BEST_OF(reps, directn,
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1, la->data, m, lb->data,
                      m, 0, cc, m));
  openblas_set_num_threads(1);
  printf("cpu runtime: gemm 512^3 f32 (best of %d): step %.2f ms (%u threads, whole run); cblas "
         "direct %.2f ms (1 thread), %.2f ms (%u OpenBLAS threads)\n",
         reps, step_s * 1e3, threads, direct1 * 1e3, directn * 1e3, threads);
  ck_assert_int_eq(blas_threads, 1);
  free(cc);
  kiln_loaded_destroy(l);
  kiln_literal_destroy(la);
  kiln_literal_destroy(lb);
  kiln_executable_destroy(e);
  kiln_backend_destroy(be);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cpu_runtime");
  TCase *tc = tcase_create("run");
  tcase_add_unchecked_fixture(tc, compile_code, free_code);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_add);
  tcase_add_test(tc, test_reduction);
  tcase_add_test(tc, test_while_counter);
  tcase_add_test(tc, test_while_timeout);
  tcase_add_test(tc, test_while_cancel);
  tcase_add_test(tc, test_conditional_and_call);
  tcase_add_test(tc, test_layouts);
  tcase_add_test(tc, test_tuples);
  tcase_add_test(tc, test_donation);
  tcase_add_test(tc, test_execute_buffers);
  tcase_add_test(tc, test_buffer_recycling);
  tcase_add_test(tc, test_blas_core);
  tcase_add_test(tc, test_concurrent_runs);
  tcase_add_test(tc, test_devices_side_by_side);
  tcase_add_test(tc, test_serialized_roundtrip);
  tcase_add_test(tc, test_reload_distinct_code);
  suite_add_tcase(s, tc);
  tc = tcase_create("gemm");
  tcase_add_unchecked_fixture(tc, compile_code, free_code);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_gemm_shapes);
  tcase_add_test(tc, test_gemm_alpha_beta_edges);
  tcase_add_test(tc, test_gemm_small_tiles);
  suite_add_tcase(s, tc);
  tc = tcase_create("hostile");
  tcase_add_unchecked_fixture(tc, compile_code, free_code);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_hostile_header_and_code);
  tcase_add_test(tc, test_hostile_tables);
  tcase_add_test(tc, test_conv_step);
  tcase_add_test(tc, test_hostile_conv_step);
  tcase_add_test(tc, test_hostile_steps);
  tcase_add_test(tc, test_hostile_deep_nesting);
  tcase_add_test(tc, test_temp_limit);
  tcase_add_test(tc, test_out_of_memory_anywhere);
  suite_add_tcase(s, tc);
  tc = tcase_create("overheads");
  tcase_add_unchecked_fixture(tc, compile_code, free_code);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_overheads);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
