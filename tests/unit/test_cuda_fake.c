/* The cuda backend's host side against a fake driver (tests/fake_cuda/,
 * opened through KILN_CUDA_DRIVER): what can be checked without a GPU.
 *
 * The fake keeps device memory in host memory and checks every address
 * the backend gives it against its live allocations; it cannot run a
 * cubin, so each program is compiled twice, for cuda-sm_90 (what the
 * backend loads: its checks, its module and kernel lookups, argument
 * vector, launches, copies, while and conditional steps reading their
 * predicate back, results and relayouts) and for the cpu target, whose
 * kernels the fake calls in place of the cubin's (the two compiles lower
 * to the same steps and kernel numbers; a case where they do not is
 * skipped, saying so). Results are checked against the interpreter with
 * test_difftest's cpu tolerances. Also: errors of driver calls (made to
 * fail by the fake) come back as statuses naming the call, with every
 * context popped and no allocation lost, and the memory budget is kept.
 *
 * The cubin's own CUDA C also runs on the host (tests/fake_cuda/cuda_emu.h:
 * a block's threads as fibers, barriers, warp shuffles, shared memory and
 * atomics emulated): progen programs, the JAX ones, and reductions large
 * enough for the cooperative form (cuda_reduce.c: sums, max, integers,
 * argmax, multi-output fusions), floats within kiln_tol_reduce_f32 of the
 * reduced size; hand-written kernels check the emulator itself and the
 * errors it reports (a barrier a returned thread never reaches, divergent
 * barriers, a shuffle in a partial warp).
 *
 * GEMM steps run through a fake cuBLASLt (tests/fake_cuda/fake_cublaslt.c,
 * opened through KILN_CUBLASLT_LIB): a reference GEMM that rejects what
 * the real library would (layouts that disagree with the transposes,
 * leading dimensions below the rows, attributes of the wrong size, an
 * algorithm used for another problem or at a weaker alignment than it was
 * chosen for, a workspace too small, operands outside a live allocation).
 * Dot programs (random dimension numbers and layouts, batches, epilogues,
 * f64, and the JAX models with dots) must run with no rejection and match
 * the interpreter; every descriptor the backend makes must be destroyed
 * with its executable, the handle with the backend.
 *
 * What this cannot check is the device itself: real stream ordering, the
 * GPU's compiler and math, threads running at once, the cubin, and
 * cuBLASLt's own kernels and heuristics. test_cuda_diff does, on a GPU.
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "executor/backend.h"
#include "tests/support/hostkernels.h"
#include "tests/support/progen.h"
#include "tests/support/testargs.h"
#include "tests/support/tolerance.h"

#if defined(KILN_HAVE_CUDA) && defined(KILN_FAKE_CUDA)

typedef kiln_test_kernel_fn kernel_fn;
typedef struct fake_stats {
  long allocs, frees, bad_addresses, launches, ctx_depth, modules, bad_frees;
  uint64_t live_bytes;
  int max_grid, max_block;
  long coop_launches;
  int coop_max_grid, coop_min_block, coop_max_block;
} fake_stats;

typedef struct fake_blas_stats {
  long handles, descs, layouts, prefs;
  long heuristics, matmuls, tf32_matmuls, batched_matmuls, rejects;
  uint64_t max_workspace;
} fake_blas_stats;

static void *fake, *fake_blas;
static void (*get_blas_stats)(fake_blas_stats *);
static void (*blas_why)(char *, size_t);
static void (*blas_fail)(const char *, long, int);
static void (*set_kernels)(kernel_fn *, unsigned);
static void (*get_stats)(fake_stats *);
static void (*fail_call)(const char *, long, int);
typedef int (*emu_block_fn)(kernel_fn, void *const *, int64_t, int64_t, unsigned, unsigned,
                            unsigned, unsigned, char *, size_t);
static void (*set_emulator)(emu_block_fn);
static void (*set_shared)(const unsigned *);
static const char *(*launch_error)(void);

/* The fake's own handle (the driver loader opened it first). */
static void fake_open(void) {
  ck_assert_uint_ne(kiln_backend_caps("cuda"), 0); /* loads the driver */
  fake = dlopen(KILN_FAKE_CUDA, RTLD_NOW | RTLD_NOLOAD);
  ck_assert_msg(fake != NULL, "%s", dlerror());
  void *p = dlsym(fake, "kiln_fake_cuda_set_kernels");
  memcpy(&set_kernels, &p, sizeof p);
  p = dlsym(fake, "kiln_fake_cuda_stats");
  memcpy(&get_stats, &p, sizeof p);
  p = dlsym(fake, "kiln_fake_cuda_fail");
  memcpy(&fail_call, &p, sizeof p);
  p = dlsym(fake, "kiln_fake_cuda_set_emulator");
  memcpy(&set_emulator, &p, sizeof p);
  p = dlsym(fake, "kiln_fake_cuda_set_shared");
  memcpy(&set_shared, &p, sizeof p);
  p = dlsym(fake, "kiln_fake_cuda_launch_error");
  memcpy(&launch_error, &p, sizeof p);
  ck_assert(set_kernels && get_stats && fail_call && set_emulator && set_shared && launch_error);
  /* The same object the backend opens at its first GEMM (same path). */
  fake_blas = dlopen(KILN_FAKE_CUBLASLT, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(fake_blas != NULL, "%s", dlerror());
  p = dlsym(fake_blas, "kiln_fake_cublaslt_stats");
  memcpy(&get_blas_stats, &p, sizeof p);
  p = dlsym(fake_blas, "kiln_fake_cublaslt_why");
  memcpy(&blas_why, &p, sizeof p);
  p = dlsym(fake_blas, "kiln_fake_cublaslt_fail");
  memcpy(&blas_fail, &p, sizeof p);
  ck_assert(get_blas_stats && blas_why && blas_fail);
}

static fake_blas_stats blas_stats(void) {
  fake_blas_stats s;
  get_blas_stats(&s);
  return s;
}

/* No descriptor outlives its executable, and the fake rejected nothing. */
static void blas_clean(const char *name) {
  fake_blas_stats b = blas_stats();
  char why[256];
  blas_why(why, sizeof why);
  ck_assert_msg(b.rejects == 0, "%s: the fake cuBLASLt rejected a call: %s", name, why);
  ck_assert_int_eq(b.descs, 0);
  ck_assert_int_eq(b.layouts, 0);
  ck_assert_int_eq(b.prefs, 0);
}

static fake_stats stats(void) {
  fake_stats s;
  get_stats(&s);
  return s;
}

/* ---- programs ----------------------------------------------------------------- */

static kiln_module *parse(const char *text) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st) == 0, "%s",
                st.msg);
  ck_assert_msg(kiln_module_verify(m, NULL, &st) == 0, "%s", st.msg);
  return m;
}

static int compile(const kiln_module *m, const char *target, kiln_executable **e, kiln_status *st) {
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.target = target;
  return kiln_compile(m, &o, e, NULL, st);
}

/* The cpu executable's kernels, mapped (memfd + dlopen as the cpu loader
 * does). *dl receives the handle to close. */

/* ---- the cubin's CUDA C on the host ------------------------------------------ */

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = kiln_malloc((size_t)len + 1);
  if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
    kiln_free(b);
    b = NULL;
  }
  if (b) b[len] = '\0';
  if (n) *n = (size_t)len;
  fclose(f);
  return b;
}

/* Per kernel of src, whether it declares shared memory (KSHARED): the
 * nonzero static size the fake reports for it, as ptxas would. */
static void scan_shared(const char *src, uint32_t nkernels, unsigned *shared) {
  for (uint32_t i = 0; i < nkernels; i++) {
    char name[48];
    snprintf(name, sizeof name, "void kiln_kernel_%u(", i);
    const char *at = strstr(src, name), *next = at ? strstr(at + 1, "void kiln_kernel_") : NULL;
    const char *sh = at ? strstr(at, "KSHARED(") : NULL;
    shared[i] = sh && (next == NULL || sh < next) ? 256 : 0;
  }
}

/* The generated kernels.cu in dir, its NVRTC head replaced by
 * tests/fake_cuda/cuda_emu.h, built with the host C++ compiler; the
 * kernels into *fns, the block runner into *run, each kernel's shared
 * memory into shared. false (saying why) when it cannot be built here. */
static bool emu_build(const char *dir, uint32_t nkernels, void **dl, kernel_fn **fns,
                      emu_block_fn *run, unsigned *shared) {
  static const char head_end[] = "#define KCLZ64(x) __clzll((long long)(x))\n";
  char path[512], cmd[2048];
  snprintf(path, sizeof path, "%s/kernels.cu", dir);
  char *src = slurp(path, NULL);
  ck_assert_msg(src != NULL, "no %s", path);
  const char *body = strstr(src, head_end);
  if (body == NULL) {
    fprintf(stderr, "emulation: the CUDA head changed (no KCLZ64 line): skipped\n");
    kiln_free(src);
    return false;
  }
  body += sizeof head_end - 1;
  scan_shared(body, nkernels, shared);
  snprintf(path, sizeof path, "%s/emu.cc", dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "#include \"%s/tests/fake_cuda/cuda_emu.h\"\n%s", KILN_SOURCE_DIR, body);
  fclose(f);
  kiln_free(src);
  snprintf(cmd, sizeof cmd,
           "c++ -std=c++17 -O1 -w -ffp-contract=off -fno-fast-math -shared -fPIC -o %s/emu.so "
           "%s > %s/emu.log 2>&1",
           dir, path, dir);
  if (system(cmd) != 0) {
    snprintf(path, sizeof path, "%s/emu.log", dir);
    char *log = slurp(path, NULL);
    fprintf(stderr, "emulation: the host C++ compiler cannot build it: %.2000s\n", log ? log : "?");
    kiln_free(log);
    return false;
  }
  snprintf(path, sizeof path, "%s/emu.so", dir);
  *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(*dl != NULL, "%s", dlerror());
  *fns = kiln_calloc(nkernels + 1, sizeof **fns);
  for (uint32_t i = 0; i < nkernels; i++) {
    char name[32];
    snprintf(name, sizeof name, "kiln_kernel_%u", i);
    void *sym = dlsym(*dl, name);
    ck_assert_msg(sym != NULL, "emu.so has no %s", name);
    memcpy(&(*fns)[i], &sym, sizeof sym);
  }
  void *sym = dlsym(*dl, "kemu_block");
  ck_assert_ptr_nonnull(sym);
  memcpy(run, &sym, sizeof sym);
  return true;
}

static bool has_step(const kiln_executable *e, kiln_step_kind k) {
  for (uint32_t p = 0; p < e->nprograms; p++)
    for (uint32_t i = 0; i < e->programs[p].nsteps; i++)
      if (e->programs[p].steps[i].kind == k) return true;
  return false;
}

static double max_abs(const kiln_literal *lit) {
  double m = 1;
  int64_t n = kiln_literal_elements(lit);
  for (int64_t i = 0; i < n; i++) {
    double v = fabs(kiln_literal_get_f64(lit, i));
    if (isfinite(v) && v > m) m = v;
  }
  return m;
}

/* > 0: floats of the case may be reassociated reductions over this many elements
 * (tests/support/tolerance.h). */
static int64_t tol_reduce_n;

static bool differs(const kiln_literal *ref, const kiln_literal *got, char *why, size_t n) {
  if (!kiln_shape_equal(&ref->shape, &got->shape, false)) {
    snprintf(why, n, "shapes differ");
    return true;
  }
  if (kiln_shape_is_tuple(&ref->shape)) {
    for (uint32_t i = 0; i < ref->shape.rank; i++)
      if (differs(ref->elems[i], got->elems[i], why, n)) return true;
    return false;
  }
  if (!kiln_shape_is_array(&ref->shape)) return false;
  int64_t count = kiln_literal_elements(ref);
  bool fl = kiln_dtype_is_float(ref->shape.dtype);
  double rtol = ref->shape.dtype == KILN_F64 ? 1e-10 : 2e-5, scale = fl ? max_abs(ref) : 0;
  /* a reassociated f32 reduction over tol_reduce_n elements */
  double rred =
      tol_reduce_n > 0 && ref->shape.dtype == KILN_F32 ? kiln_tol_reduce_f32(tol_reduce_n) : 0;
  for (int64_t i = 0; i < count; i++) {
    if (fl) {
      double x = kiln_literal_get_f64(ref, i), y = kiln_literal_get_f64(got, i);
      if (x == y || (isnan(x) && isnan(y))) continue;
      if (!isnan(x) && !isnan(y) && fabs(x - y) <= rtol * (fabs(x) + scale)) continue;
      if (!isnan(x) && !isnan(y) && fabs(x - y) <= rred * fmax(1, fabs(x))) continue;
      snprintf(why, n, "element %lld: expected %.17g, got %.17g", (long long)i, x, y);
      return true;
    }
    if (kiln_literal_get_u64(ref, i) != kiln_literal_get_u64(got, i)) {
      snprintf(why, n, "element %lld differs", (long long)i);
      return true;
    }
  }
  return false;
}

typedef enum outcome { RAN, REFUSED, LOWERED_APART, NO_REFERENCE } outcome;
static bool emulate;     /* run the cubin's own CUDA C, thread by thread */
static int coop_kernels; /* emulated kernels so far that use shared memory */

/* The module on the fake cuda device (cpu kernels) against the
 * interpreter, arguments args (NULL: random from seed). */
static outcome run_case(kiln_backend *b, const char *text, uint64_t seed, kiln_literal **given,
                        uint32_t ngiven, const char *name) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = parse(text);
  kiln_literal **args = given, *ref = NULL, *got = NULL;
  uint32_t nargs = ngiven;
  if (given == NULL) ck_assert_int_eq(kiln_test_args_random(m, seed, &args, &nargs, &st), 0);
  kiln_interp_options io = {.max_while_iterations = 100000, .timeout_seconds = 60};
  outcome r = NO_REFERENCE;
  kiln_executable *ec = NULL, *eh = NULL;
  kiln_loaded *l = NULL;
  void *dl = NULL;
  kernel_fn *fns = NULL;
  unsigned *shared = NULL;
  if (kiln_interp_run(m, (const kiln_literal *const *)args, nargs, &io, &ref, &st)) goto out;
  char dir[] = "/tmp/kiln-cuda-emu-XXXXXX";
  kiln_compile_options co;
  kiln_compile_options_init(&co);
  co.target = "cuda-sm_90";
  if (emulate) {
    ck_assert_ptr_nonnull(mkdtemp(dir));
    co.dump_dir = dir;
  }
  int rc = kiln_compile(m, &co, &ec, NULL, &st);
  if (rc == 0 && emulate) { /* before loading: the load asks for each kernel's shared memory */
    emu_block_fn run = NULL;
    shared = kiln_calloc(ec->nkernels + 1, sizeof *shared);
    ck_assert_ptr_nonnull(shared);
    if (ec->nkernels > 0 && !emu_build(dir, ec->nkernels, &dl, &fns, &run, shared)) {
      r = LOWERED_APART; /* not buildable here: counted with the skipped */
      goto out;
    }
    for (uint32_t i = 0; i < ec->nkernels; i++) coop_kernels += shared[i] != 0;
    set_kernels(fns, ec->nkernels);
    set_shared(shared);
    set_emulator(run);
  }
  if (rc == 0) rc = kiln_device_load(kiln_backend_device(b, 0), ec, &l, &st);
  if (rc == KILN_EUNIMPL) {
    r = REFUSED;
    goto out;
  }
  ck_assert_msg(rc == 0, "%s: %s: %s\n%.1500s", name, st.where, st.msg, text);
  if (!emulate) {
    ck_assert_msg(compile(m, "cpu", &eh, &st) == 0, "%s: %s", name, st.msg);
    if (!kiln_test_same_program(ec, eh)) {
      fprintf(stderr, "%s: skipped, cpu and cuda lowered it apart\n", name);
      r = LOWERED_APART;
      goto out;
    }
    fns = kiln_test_cpu_kernels(eh, &dl);
    set_kernels(fns, eh->nkernels);
  }
  kiln_run_options ro = {.timeout_seconds = 60, .max_while_iterations = 100000};
  clock_t t0 = clock();
  rc = kiln_loaded_run(l, (const kiln_literal *const *)args, nargs, &ro, &got, &st);
  if (getenv("KILN_CUDA_FAKE_TIMES"))
    fprintf(stderr, "%s: ran in %.2f s of CPU\n", name, (double)(clock() - t0) / CLOCKS_PER_SEC);
  ck_assert_msg(rc == 0, "%s: run: %s: %s (%s)\n%.1500s", name, st.where, st.msg, launch_error(),
                text);
  char why[300];
  ck_assert_msg(!differs(ref, got, why, sizeof why), "%s: %s\n%.1500s", name, why, text);
  r = RAN;
out:
  set_kernels(NULL, 0);
  set_emulator(NULL);
  set_shared(NULL);
  kiln_free(shared);
  if (emulate && strcmp(dir, "/tmp/kiln-cuda-emu-XXXXXX") != 0) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  kiln_literal_destroy(got);
  kiln_loaded_destroy(l);
  if (dl) dlclose(dl);
  kiln_free(fns);
  kiln_executable_destroy(ec);
  kiln_executable_destroy(eh);
  kiln_literal_destroy(ref);
  if (given == NULL) kiln_test_args_free(args, nargs);
  kiln_module_destroy(m);
  fake_stats s = stats();
  ck_assert_int_eq(s.bad_addresses, 0);
  ck_assert_int_eq(s.bad_frees, 0);
  ck_assert_int_eq(s.ctx_depth, 0);
  ck_assert_int_eq(s.modules, 0);
  blas_clean(name);
  return r;
}

static kiln_backend *open_backend(void) {
  fake_open();
  kiln_backend *b = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_backend_create("cuda", NULL, &b, &st) == 0, "%s", st.msg);
  return b;
}

/* After the backend is gone, every device allocation is back. */
static void close_backend(kiln_backend *b) {
  kiln_backend_destroy(b);
  fake_stats s = stats();
  ck_assert_int_eq(s.allocs, s.frees);
  ck_assert_uint_eq(s.live_bytes, 0);
  ck_assert_int_eq(s.ctx_depth, 0);
  ck_assert_int_eq(blas_stats().handles, 0);
}

/* ---- cases ------------------------------------------------------------------- */

START_TEST(the_fake_gpu_is_a_cuda_device) {
  kiln_backend *b = open_backend();
  ck_assert_uint_eq(kiln_backend_device_count(b), 1);
  const char *target = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_backend_default_target("cuda", &target, &st), 0);
  ck_assert_str_eq(target, "cuda-sm_90");
  close_backend(b);
}
END_TEST

START_TEST(progen_corpus_runs_through_the_backend) {
  kiln_backend *b = open_backend();
  int seeds = getenv("KILN_CUDA_FAKE_SEEDS") ? atoi(getenv("KILN_CUDA_FAKE_SEEDS")) : 16;
  int n[4] = {0};
  for (int s = 1; s <= seeds; s++) {
    kiln_progen_options o = {0};
    o.seed = (uint64_t)s;
    o.ninstrs = 8 + s % 17;
    o.nparams = 1 + s % 3;
    o.dtype = s % 4 == 3 ? KILN_F64 : KILN_F32;
    o.families = KILN_PROGEN_ALL & ~KILN_PROGEN_DOT;
    char *text = kiln_progen_text(&o);
    char name[32];
    snprintf(name, sizeof name, "progen seed %d", s);
    n[run_case(b, text, (uint64_t)s, NULL, 0, name)]++;
    kiln_free(text);
  }
  fprintf(stderr, "fake cuda: %d ran, %d refused, %d lowered apart, %d without a reference\n",
          n[RAN], n[REFUSED], n[LOWERED_APART], n[NO_REFERENCE]);
  ck_assert_int_gt(n[RAN], seeds / 2);
  ck_assert_int_gt(stats().launches, 0);
  close_backend(b);
}
END_TEST

static const char ew[] = "HloModule ew\n"
                         "ENTRY e {\n"
                         "  p = f32[300,7] parameter(0)\n"
                         "  q = f32[300,7] parameter(1)\n"
                         "  m = f32[300,7] multiply(p, q)\n"
                         "  ROOT a = f32[300,7] add(m, p)\n"
                         "}\n";
static const char reduce_rows[] = "HloModule red\n"
                                  "add {\n"
                                  "  a = f32[] parameter(0)\n"
                                  "  b = f32[] parameter(1)\n"
                                  "  ROOT c = f32[] add(a, b)\n"
                                  "}\n"
                                  "ENTRY e {\n"
                                  "  p = f32[700,129] parameter(0)\n"
                                  "  z = f32[] constant(0)\n"
                                  "  r = f32[700] reduce(p, z), dimensions={1}, to_apply=add\n"
                                  "  c = f32[129] reduce(p, z), dimensions={0}, to_apply=add\n"
                                  "  e = f32[700,129] exponential(p)\n"
                                  "  ROOT t = (f32[700], f32[129], f32[700,129]) tuple(r, c, e)\n"
                                  "}\n";

/* Reductions large enough for the cooperative form (cuda_reduce.c: a block
 * per output element, warp shuffles and shared memory): rows (a sum and a
 * max of one multi-output fusion), a column of few outputs, everything
 * into a scalar, integers (exact), an init value that is not the identity,
 * and an argmax (variadic). */
static const char coop_reduces[] =
    "HloModule coop\n"
    "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] add(a, b)\n}\n"
    "addi {\n  a = s32[] parameter(0)\n  b = s32[] parameter(1)\n  ROOT c = s32[] add(a, b)\n}\n"
    "mx {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] maximum(a, b)\n}\n"
    "am {\n"
    "  av = f32[] parameter(0)\n  ai = s32[] parameter(1)\n"
    "  bv = f32[] parameter(2)\n  bi = s32[] parameter(3)\n"
    "  gt = pred[] compare(av, bv), direction=GT\n"
    "  eq = pred[] compare(av, bv), direction=EQ\n"
    "  lt = pred[] compare(ai, bi), direction=LT\n"
    "  tie = pred[] and(eq, lt)\n"
    "  pick = pred[] or(gt, tie)\n"
    "  v = f32[] select(pick, av, bv)\n"
    "  i = s32[] select(pick, ai, bi)\n"
    "  ROOT t = (f32[], s32[]) tuple(v, i)\n"
    "}\n"
    "ENTRY e {\n"
    "  p = f32[5,1500] parameter(0)\n"
    "  q = f32[700,3] parameter(1)\n"
    "  k = s32[9,400] parameter(2)\n"
    "  z = f32[] constant(0)\n"
    "  one = f32[] constant(1.5)\n"
    "  zi = s32[] constant(7)\n"
    "  ninf = f32[] constant(-inf)\n"
    "  e = f32[5,1500] exponential(p)\n"
    "  r = f32[5] reduce(e, one), dimensions={1}, to_apply=add\n"
    "  c = f32[3] reduce(q, z), dimensions={0}, to_apply=add\n"
    "  a = f32[] reduce(p, z), dimensions={0,1}, to_apply=add\n"
    "  i = s32[9] reduce(k, zi), dimensions={1}, to_apply=addi\n"
    "  m = f32[5] reduce(p, ninf), dimensions={1}, to_apply=mx\n"
    "  x = f32[7,999] parameter(3)\n"
    "  io = s32[7,999] iota(), iota_dimension=1\n"
    "  z0 = s32[] constant(0)\n"
    "  g = (f32[7], s32[7]) reduce(x, io, ninf, z0), dimensions={1}, to_apply=am\n"
    "  gv = f32[7] get-tuple-element(g), index=0\n"
    "  gi = s32[7] get-tuple-element(g), index=1\n"
    "  ROOT t = (f32[5], f32[3], f32[], s32[9], f32[5], f32[7], s32[7]) tuple(r, c, a, i, m, gv, "
    "gi)\n"
    "}\n";
/* A softmax and a layernorm over long rows (row kernels: a reduce, then
 * its broadcast). */
static const char coop_rows[] =
    "HloModule rows\n"
    "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] add(a, b)\n}\n"
    "mx {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] maximum(a, b)\n}\n"
    "ENTRY e {\n"
    "  x = f32[6,1024] parameter(0)\n"
    "  ninf = f32[] constant(-inf)\n"
    "  z = f32[] constant(0)\n"
    "  m = f32[6] reduce(x, ninf), dimensions={1}, to_apply=mx\n"
    "  mb = f32[6,1024] broadcast(m), dimensions={0}\n"
    "  d = f32[6,1024] subtract(x, mb)\n"
    "  ex = f32[6,1024] exponential(d)\n"
    "  s = f32[6] reduce(ex, z), dimensions={1}, to_apply=add\n"
    "  sb = f32[6,1024] broadcast(s), dimensions={0}\n"
    "  y = f32[6,1024] divide(ex, sb)\n"
    "  lx = f32[4,768] parameter(1)\n"
    "  n = f32[] constant(768)\n"
    "  eps = f32[] constant(1e-5)\n"
    "  ls = f32[4] reduce(lx, z), dimensions={1}, to_apply=add\n"
    "  nb = f32[4] broadcast(n), dimensions={}\n"
    "  mean = f32[4] divide(ls, nb)\n"
    "  lmb = f32[4,768] broadcast(mean), dimensions={0}\n"
    "  ld = f32[4,768] subtract(lx, lmb)\n"
    "  d2 = f32[4,768] multiply(ld, ld)\n"
    "  v = f32[4] reduce(d2, z), dimensions={1}, to_apply=add\n"
    "  var = f32[4] divide(v, nb)\n"
    "  epsb = f32[4] broadcast(eps), dimensions={}\n"
    "  ve = f32[4] add(var, epsb)\n"
    "  rs = f32[4] rsqrt(ve)\n"
    "  rb = f32[4,768] broadcast(rs), dimensions={0}\n"
    "  ly = f32[4,768] multiply(ld, rb)\n"
    "  ROOT t = (f32[6,1024], f32[4,768]) tuple(y, ly)\n"
    "}\n";

/* A JAX program on random arguments (seed 7), scaled by 1/16 where the
 * program is a recurrence: gru_scan's 64 steps of 256-wide products of
 * values in [-1, 1] saturate its gates and amplify rounding, so that two
 * correct summation orders part after a few steps (measured: only the
 * reference GEMM's accumulation changed, in f64 or in f32, and the first
 * difference beyond the tolerance moved from step 9 to step 5). Scaled,
 * the recurrence contracts and the comparison means something. */
static outcome run_jax(kiln_backend *b, const char *text, const char *path) {
  if (strstr(path, "gru_scan") == NULL) return run_case(b, text, 7, NULL, 0, path);
  kiln_module *m = parse(text);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_literal **args = NULL;
  uint32_t nargs = 0;
  ck_assert_int_eq(kiln_test_args_random(m, 7, &args, &nargs, &st), 0);
  kiln_module_destroy(m);
  for (uint32_t a = 0; a < nargs; a++)
    if (kiln_dtype_is_float(args[a]->shape.dtype))
      for (int64_t i = 0; i < kiln_literal_elements(args[a]); i++)
        kiln_literal_set_f64(args[a], i, kiln_literal_get_f64(args[a], i) / 16);
  outcome o = run_case(b, text, 0, args, nargs, path);
  kiln_test_args_free(args, nargs);
  return o;
}

/* The cubin's own CUDA C, built for the host with tests/fake_cuda/cuda_emu.h
 * and run thread by thread over the grid the backend launches (the last
 * thread first): the grid-stride loops, the single-thread guard and the
 * launch geometry, against the interpreter. What it cannot show: the GPU's
 * compiler and math, and threads running at once. */
START_TEST(cuda_kernels_emulated_over_the_grid) {
  if (system("c++ --version > /dev/null 2>&1") != 0) {
    fprintf(stderr, "skipped: no host C++ compiler (c++)\n");
    return;
  }
  kiln_backend *b = open_backend();
  emulate = true;
  int seeds = getenv("KILN_CUDA_FAKE_SEEDS") ? atoi(getenv("KILN_CUDA_FAKE_SEEDS")) : 16;
  int n[4] = {0};
  /* cooperative reductions: blocks of 256 threads as fibers */
  int coop_before = coop_kernels;
  tol_reduce_n = 7500;
  n[run_case(b, coop_reduces, 8, NULL, 0, "cooperative reduces (emulated)")]++;
  ck_assert_int_ge(coop_kernels - coop_before, 5); /* they did run cooperatively */
  /* launched as such: 256 threads, a block per output (the most: 9 of i) */
  fake_stats cs = stats();
  ck_assert_int_ge(cs.coop_launches, 5);
  ck_assert_int_eq(cs.coop_min_block, 256);
  ck_assert_int_eq(cs.coop_max_block, 256);
  ck_assert_int_eq(cs.coop_max_grid, 9);
  for (int s = 1; s <= seeds; s++) {
    kiln_progen_options o = {0};
    o.seed = (uint64_t)s + 1000;
    o.ninstrs = 8 + s % 17;
    o.nparams = 1 + s % 3;
    o.dtype = s % 4 == 3 ? KILN_F64 : KILN_F32;
    o.families = KILN_PROGEN_ALL & ~KILN_PROGEN_DOT;
    o.max_dim = 40; /* ranges past one block, so the grid-stride loop strides */
    char *text = kiln_progen_text(&o);
    char name[48];
    snprintf(name, sizeof name, "progen seed %d (emulated)", s + 1000);
    n[run_case(b, text, (uint64_t)s, NULL, 0, name)]++;
    kiln_free(text);
  }
  /* programs whose ranges span many blocks, a reduction, and the JAX ones */
  n[run_case(b, ew, 5, NULL, 0, "ew (emulated)")]++;
  n[run_case(b, reduce_rows, 6, NULL, 0, "reduce (emulated)")]++;
  tol_reduce_n = 1024;
  n[run_case(b, coop_rows, 9, NULL, 0, "softmax and layernorm (emulated)")]++;
  tol_reduce_n = 0;
  static const char *const files[] = {"layernorm_softmax", "embedding", "gru_scan"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/jax/%s.hlo", KILN_SOURCE_DIR, files[i]);
    char *text = slurp(path, NULL);
    ck_assert_msg(text != NULL, "cannot read %s", path);
    n[run_jax(b, text, path)]++;
    kiln_free(text);
  }
  ck_assert_int_gt(stats().max_grid, 1);
  fprintf(stderr,
          "emulated cuda: %d ran, %d refused, %d not buildable, %d without a reference; %d "
          "cooperative kernels\n",
          n[RAN], n[REFUSED], n[LOWERED_APART], n[NO_REFERENCE], coop_kernels);
  ck_assert_int_gt(n[RAN], seeds / 2);
  fake_stats st = stats();
  ck_assert_int_gt(st.launches, 0);
  emulate = false;
  close_backend(b);
}
END_TEST

/* ---- the emulator itself --------------------------------------------------- */

/* Kernels written by hand in the generated code's vocabulary, for the
 * emulator's cooperative machinery: barriers, warp shuffles, static and
 * dynamic shared memory, atomics, and the errors a GPU would hang or
 * misbehave on. */
static const char emu_kernels[] =
    "#define KCLZ64(x) __clzll((long long)(x))\n"
    /* 0: a block's sum by shuffles and shared memory */
    "extern \"C\" __global__ void kiln_kernel_0(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  float *out = (float *)bufs[0];\n"
    "  const float *in = (const float *)bufs[1];\n"
    "  KSHARED(float, s, 32);\n"
    "  float v = in[blockIdx.x * blockDim.x + threadIdx.x];\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);\n"
    "  if ((threadIdx.x & 31u) == 0) s[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0) {\n"
    "    float t = 0;\n"
    "    for (unsigned w = 0; w < blockDim.x / 32; w++) t += s[w];\n"
    "    out[blockIdx.x] = t;\n"
    "  }\n"
    "}\n"
    /* 1: every lane gets its warp's largest by a butterfly */
    "extern \"C\" __global__ void kiln_kernel_1(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  int32_t *out = (int32_t *)bufs[0];\n"
    "  const int32_t *in = (const int32_t *)bufs[1];\n"
    "  int32_t v = in[threadIdx.x];\n"
    "  for (int m = 16; m > 0; m >>= 1) {\n"
    "    int32_t o = __shfl_xor_sync(0xffffffffu, v, m);\n"
    "    v = o > v ? o : v;\n"
    "  }\n"
    "  out[threadIdx.x] = v;\n"
    "}\n"
    /* 2: thread 5 returns while the others wait */
    "extern \"C\" __global__ void kiln_kernel_2(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  if (threadIdx.x == 5) return;\n"
    "  __syncthreads();\n"
    "}\n"
    /* 3: the last thread returns (it runs first) */
    "extern \"C\" __global__ void kiln_kernel_3(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  if (threadIdx.x == blockDim.x - 1) return;\n"
    "  __syncthreads();\n"
    "}\n"
    /* 4: divergence: two barriers */
    "extern \"C\" __global__ void kiln_kernel_4(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  if (threadIdx.x < 32) {\n"
    "    __syncthreads();\n"
    "  } else {\n"
    "    __syncthreads();\n"
    "  }\n"
    "}\n"
    /* 5: dynamic shared memory, reversed through it */
    "extern \"C\" __global__ void kiln_kernel_5(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  int32_t *out = (int32_t *)bufs[0];\n"
    "  KDYNSHARED(int32_t, d);\n"
    "  d[threadIdx.x] = (int32_t)(blockIdx.x * 1000 + threadIdx.x);\n"
    "  __syncthreads();\n"
    "  out[blockIdx.x * blockDim.x + threadIdx.x] = d[blockDim.x - 1 - threadIdx.x];\n"
    "}\n"
    /* 6: atomics from every thread of the grid */
    "extern \"C\" __global__ void kiln_kernel_6(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  float *f = (float *)bufs[0];\n"
    "  int32_t *i = (int32_t *)bufs[1];\n"
    "  double *g = (double *)bufs[2];\n"
    "  atomicAdd(f, 0.5f);\n"
    "  atomicAdd(i, 2);\n"
    "  atomicAdd(g, 0.25);\n"
    "  atomicMax(i + 1, (int32_t)(blockIdx.x * blockDim.x + threadIdx.x));\n"
    "}\n"
    /* 7: shared memory holds no value before it is written, in every block */
    "extern \"C\" __global__ void kiln_kernel_7(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  float *out = (float *)bufs[0];\n"
    "  KSHARED(float, s, 4);\n"
    "  if (threadIdx.x == 0) out[blockIdx.x] = s[1];\n"
    "  __syncthreads();\n"
    "  s[1] = 1.0f;\n"
    "}\n";

typedef int (*drv_alloc_fn)(uint64_t *, size_t);
typedef int (*drv_free_fn)(uint64_t);
typedef int (*drv_getfn_fn)(void **, void *, const char *);
typedef int (*drv_launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, void *, void **, void **);
static drv_alloc_fn drv_alloc;
static drv_free_fn drv_free;
static drv_getfn_fn drv_getfn;
static drv_launch_fn drv_launch;

static void *drv(const char *name) {
  int (*gpa)(const char *, void **, int, uint64_t, int *) = NULL;
  void *p = dlsym(fake, "cuGetProcAddress_v2");
  ck_assert_ptr_nonnull(p);
  memcpy(&gpa, &p, sizeof p);
  void *fn = NULL;
  int status = 0;
  ck_assert_int_eq(gpa(name, &fn, 12000, 0, &status), 0);
  return fn;
}

/* Launches kernel k of the emulated source over grid x block with shmem
 * dynamic bytes, bufs[] in device memory: the driver's result. */
static int emu_launch(unsigned k, unsigned grid, unsigned block, unsigned shmem, void *const *bufs,
                      unsigned nbufs) {
  uint64_t vec = 0;
  ck_assert_int_eq(drv_alloc(&vec, nbufs * sizeof(void *)), 0);
  memcpy((void *)(uintptr_t)vec, bufs, nbufs * sizeof(void *));
  char name[32];
  snprintf(name, sizeof name, "kiln_kernel_%u", k);
  void *fn = NULL;
  ck_assert_int_eq(drv_getfn(&fn, NULL, name), 0);
  int64_t begin = 0, end = 1;
  void *params[] = {&vec, &begin, &end};
  int r = drv_launch(fn, grid, 1, 1, block, 1, 1, shmem, NULL, params, NULL);
  ck_assert_int_eq(drv_free(vec), 0);
  return r;
}

static void *dev(size_t bytes) {
  uint64_t p = 0;
  ck_assert_int_eq(drv_alloc(&p, bytes), 0);
  return (void *)(uintptr_t)p;
}

START_TEST(the_emulator_runs_cooperative_blocks) {
  if (system("c++ --version > /dev/null 2>&1") != 0) {
    fprintf(stderr, "skipped: no host C++ compiler (c++)\n");
    return;
  }
  fake_open();
  void *p = drv("cuMemAlloc");
  memcpy(&drv_alloc, &p, sizeof p);
  p = drv("cuMemFree");
  memcpy(&drv_free, &p, sizeof p);
  p = drv("cuModuleGetFunction");
  memcpy(&drv_getfn, &p, sizeof p);
  p = drv("cuLaunchKernel");
  memcpy(&drv_launch, &p, sizeof p);
  char dir[] = "/tmp/kiln-cuda-emu-XXXXXX", path[600];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/kernels.cu", dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(emu_kernels, f);
  fclose(f);
  void *dl = NULL;
  kernel_fn *fns = NULL;
  emu_block_fn run = NULL;
  unsigned shared[8];
  ck_assert(emu_build(dir, 8, &dl, &fns, &run, shared));
  ck_assert_uint_ne(shared[0], 0); /* KSHARED seen */
  ck_assert_uint_eq(shared[1], 0);
  set_kernels(fns, 8);
  set_emulator(run);

  /* sums: 3 blocks of 256, the inputs small integers (exact) */
  float *in = dev(768 * sizeof(float)), *sums = dev(3 * sizeof(float));
  for (int i = 0; i < 768; i++) in[i] = (float)(i % 7);
  void *b0[] = {sums, in};
  ck_assert_int_eq(emu_launch(0, 3, 256, 0, b0, 2), 0);
  for (int b = 0; b < 3; b++) {
    float want = 0;
    for (int i = 0; i < 256; i++) want += (float)((b * 256 + i) % 7);
    ck_assert_float_eq(sums[b], want);
  }
  /* butterfly: two warps */
  int32_t *iv = dev(64 * sizeof(int32_t)), *iout = dev(64 * sizeof(int32_t));
  for (int i = 0; i < 64; i++) iv[i] = (i * 37) % 64;
  void *b1[] = {iout, iv};
  ck_assert_int_eq(emu_launch(1, 1, 64, 0, b1, 2), 0);
  for (int w = 0; w < 2; w++) {
    int32_t want = 0;
    for (int i = 0; i < 32; i++) want = iv[w * 32 + i] > want ? iv[w * 32 + i] : want;
    for (int i = 0; i < 32; i++) ck_assert_int_eq(iout[w * 32 + i], want);
  }
  /* errors: a launch that fails, saying why */
  ck_assert_int_eq(emu_launch(2, 2, 64, 0, b1, 2), 719); /* CUDA_ERROR_LAUNCH_FAILED */
  ck_assert_msg(strstr(launch_error(), "returned while the others wait at __syncthreads"), "%s",
                launch_error());
  ck_assert_int_eq(emu_launch(3, 1, 64, 0, b1, 2), 719);
  ck_assert_msg(strstr(launch_error(), "after a thread of its block returned"), "%s",
                launch_error());
  ck_assert_int_eq(emu_launch(4, 1, 64, 0, b1, 2), 719);
  ck_assert_msg(strstr(launch_error(), "divergence"), "%s", launch_error());
  ck_assert_int_eq(emu_launch(1, 1, 48, 0, b1, 2), 719);
  ck_assert_msg(strstr(launch_error(), "partial warp"), "%s", launch_error());
  /* dynamic shared memory; more than a launch gets without opting in is refused */
  int32_t *rev = dev(2 * 128 * sizeof(int32_t));
  void *b5[] = {rev};
  ck_assert_int_eq(emu_launch(5, 2, 128, 128 * sizeof(int32_t), b5, 1), 0);
  for (int b = 0; b < 2; b++)
    for (int t = 0; t < 128; t++) ck_assert_int_eq(rev[b * 128 + t], b * 1000 + 127 - t);
  ck_assert_int_eq(emu_launch(5, 1, 128, 64 << 10, b5, 1), 1); /* CUDA_ERROR_INVALID_VALUE */
  /* atomics */
  float *af = dev(sizeof(float));
  int32_t *ai = dev(2 * sizeof(int32_t));
  double *ad = dev(sizeof(double));
  *af = 0;
  ai[0] = ai[1] = 0;
  *ad = 0;
  void *b6[] = {af, ai, ad};
  ck_assert_int_eq(emu_launch(6, 3, 96, 0, b6, 3), 0);
  ck_assert_float_eq(*af, 144.0f);
  ck_assert_int_eq(ai[0], 576);
  ck_assert_int_eq(ai[1], 287);
  ck_assert_double_eq(*ad, 72.0);
  /* each block's shared memory starts without a value (a NaN) */
  float *un = dev(2 * sizeof(float));
  void *b7[] = {un};
  ck_assert_int_eq(emu_launch(7, 2, 32, 0, b7, 1), 0);
  ck_assert(isnan(un[0]) && isnan(un[1]));

  void *all[] = {in, sums, iv, iout, rev, af, ai, ad, un};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    ck_assert_int_eq(drv_free((uint64_t)(uintptr_t)all[i]), 0);
  set_kernels(NULL, 0);
  set_emulator(NULL);
  dlclose(dl);
  kiln_free(fns);
  snprintf(path, sizeof path, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(path), 0);
  fake_stats st = stats();
  ck_assert_int_eq(st.bad_addresses, 0);
}
END_TEST

/* A while loop whose trip count is a parameter (nothing can unroll it)
 * and a conditional on a parameter: host-driven, reading back the
 * predicate and the selector. */
static const char loops[] = "HloModule loops\n"
                            "cond {\n"
                            "  p = (s32[], s32[], f32[37]) parameter(0)\n"
                            "  i = s32[] get-tuple-element(p), index=0\n"
                            "  n = s32[] get-tuple-element(p), index=1\n"
                            "  ROOT lt = pred[] compare(i, n), direction=LT\n"
                            "}\n"
                            "body {\n"
                            "  p = (s32[], s32[], f32[37]) parameter(0)\n"
                            "  i = s32[] get-tuple-element(p), index=0\n"
                            "  n = s32[] get-tuple-element(p), index=1\n"
                            "  x = f32[37] get-tuple-element(p), index=2\n"
                            "  one = s32[] constant(1)\n"
                            "  j = s32[] add(i, one)\n"
                            "  h = f32[] constant(1.5)\n"
                            "  hb = f32[37] broadcast(h), dimensions={}\n"
                            "  y = f32[37] multiply(x, hb)\n"
                            "  ROOT t = (s32[], s32[], f32[37]) tuple(j, n, y)\n"
                            "}\n"
                            "neg {\n"
                            "  a = f32[37] parameter(0)\n"
                            "  ROOT b = f32[37] negate(a)\n"
                            "}\n"
                            "same {\n"
                            "  a = f32[37] parameter(0)\n"
                            "  ROOT b = f32[37] add(a, a)\n"
                            "}\n"
                            "ENTRY e {\n"
                            "  x = f32[37] parameter(0)\n"
                            "  n = s32[] parameter(1)\n"
                            "  k = pred[] parameter(2)\n"
                            "  z = s32[] constant(0)\n"
                            "  t = (s32[], s32[], f32[37]) tuple(z, n, x)\n"
                            "  w = (s32[], s32[], f32[37]) while(t), condition=cond, body=body\n"
                            "  r = f32[37] get-tuple-element(w), index=2\n"
                            "  ROOT c = f32[37] conditional(k, r, r), true_computation=neg, "
                            "false_computation=same\n"
                            "}\n";

START_TEST(while_and_conditional_are_driven_from_the_host) {
  kiln_backend *b = open_backend();
  kiln_module *m = parse(loops);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_executable *e = NULL;
  ck_assert_msg(compile(m, "cuda-sm_90", &e, &st) == 0, "%s", st.msg);
  ck_assert(has_step(e, KILN_STEP_WHILE));
  ck_assert(has_step(e, KILN_STEP_CONDITIONAL));
  kiln_executable_destroy(e);
  kiln_literal **args = NULL;
  uint32_t nargs = 0;
  ck_assert_int_eq(kiln_test_args_random(m, 3, &args, &nargs, &st), 0);
  ck_assert_uint_eq(nargs, 3);
  for (int trips = 0; trips <= 6; trips += 3)
    for (int branch = 0; branch < 2; branch++) {
      *(int32_t *)args[1]->data = trips;
      *(uint8_t *)args[2]->data = (uint8_t)branch;
      ck_assert_int_eq(run_case(b, loops, 0, args, nargs, "loops"), RAN);
    }
  kiln_test_args_free(args, nargs);
  kiln_module_destroy(m);
  close_backend(b);
}
END_TEST

/* Loads ew on the device with the cpu kernels standing in; *dl, *fns and
 * *eh are the caller's to release. */
static kiln_loaded *load_ew(kiln_backend *b, kiln_executable **ec, kiln_executable **eh, void **dl,
                            kernel_fn **fns) {
  kiln_module *m = parse(ew);
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(compile(m, "cuda-sm_90", ec, &st), 0);
  ck_assert_int_eq(compile(m, "cpu", eh, &st), 0);
  kiln_module_destroy(m);
  ck_assert(kiln_test_same_program(*ec, *eh));
  *fns = kiln_test_cpu_kernels(*eh, dl);
  set_kernels(*fns, (*eh)->nkernels);
  kiln_loaded *l = NULL;
  ck_assert_msg(kiln_device_load(kiln_backend_device(b, 0), *ec, &l, &st) == 0, "%s", st.msg);
  return l;
}

START_TEST(execute_on_buffers_and_copies) {
  kiln_backend *b = open_backend();
  kiln_executable *ec, *eh;
  void *dl;
  kernel_fn *fns;
  kiln_loaded *l = load_ew(b, &ec, &eh, &dl, &fns);
  kiln_device *d = kiln_backend_device(b, 0);
  kiln_status st;
  kiln_status_clear(&st);
  size_t n = 300 * 7;
  float *p = kiln_malloc(n * 4), *q = kiln_malloc(n * 4), *r = kiln_malloc(n * 4);
  for (size_t i = 0; i < n; i++) {
    p[i] = (float)i;
    q[i] = 0.5f;
  }
  kiln_buffer *in[2], *out[1];
  ck_assert_int_eq(kiln_buffer_alloc(d, n * 4, &in[0], &st), 0);
  ck_assert_int_eq(kiln_buffer_alloc(d, n * 4, &in[1], &st), 0);
  /* zero-filled though the fake's memory is not */
  ck_assert_int_eq(kiln_buffer_read(in[0], 0, r, n * 4, &st), 0);
  for (size_t i = 0; i < n; i++) ck_assert_float_eq(r[i], 0);
  ck_assert_int_eq(kiln_buffer_write(in[0], 0, p, n * 4, &st), 0);
  ck_assert_int_eq(kiln_buffer_write(in[1], 0, q, n * 4, &st), 0);
  for (int run = 0; run < 3; run++) {
    ck_assert_msg(kiln_loaded_execute(l, in, 2, NULL, out, 1, &st) == 0, "%s", st.msg);
    ck_assert_int_eq(kiln_buffer_read(out[0], 0, r, n * 4, &st), 0);
    for (size_t i = 0; i < n; i++) ck_assert_float_eq(r[i], p[i] * 0.5f + p[i]);
    kiln_buffer_free(out[0]);
  }
  /* a device copy, and a partial read at an offset */
  kiln_buffer *c = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(d, n * 4, &c, &st), 0);
  ck_assert_int_eq(kiln_buffer_copy(c, 8, in[0], 0, n * 4 - 8, &st), 0);
  float two[2];
  ck_assert_int_eq(kiln_buffer_read(c, 8 + 4 * 10, two, 8, &st), 0);
  ck_assert_float_eq(two[0], 10);
  ck_assert_float_eq(two[1], 11);
  kiln_buffer_free(c);
  kiln_buffer_free(in[0]);
  kiln_buffer_free(in[1]);
  kiln_loaded_destroy(l);
  set_kernels(NULL, 0);
  dlclose(dl);
  kiln_free(fns);
  kiln_free(p);
  kiln_free(q);
  kiln_free(r);
  kiln_executable_destroy(ec);
  kiln_executable_destroy(eh);
  ck_assert_int_eq(stats().bad_addresses, 0);
  close_backend(b);
}
END_TEST

/* A failing driver call is a status naming it; nothing leaks, every
 * context is popped. */
START_TEST(driver_failures_are_statuses_naming_the_call) {
  kiln_backend *b = open_backend();
  kiln_device *d = kiln_backend_device(b, 0);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_buffer *x = NULL;
  fail_call("cuMemAlloc", 0, 2 /* CUDA_ERROR_OUT_OF_MEMORY */);
  ck_assert_int_eq(kiln_buffer_alloc(d, 5000, &x, &st), KILN_ELIMIT);
  ck_assert_msg(strstr(st.msg, "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY") != NULL, "%s",
                st.msg);
  ck_assert_ptr_null(x);
  fail_call("", 0, 0);

  kiln_executable *ec, *eh;
  void *dl;
  kernel_fn *fns;
  kiln_loaded *l = load_ew(b, &ec, &eh, &dl, &fns);
  kiln_literal **args = NULL;
  uint32_t nargs = 0;
  kiln_module *m = parse(ew);
  ck_assert_int_eq(kiln_test_args_random(m, 1, &args, &nargs, &st), 0);
  kiln_module_destroy(m);
  kiln_literal *out = NULL;
  fail_call("cuLaunchKernel", 0, 719 /* CUDA_ERROR_LAUNCH_FAILED */);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_run(l, (const kiln_literal *const *)args, nargs, NULL, &out, &st),
                   KILN_EINTERNAL);
  ck_assert_msg(strstr(st.msg, "cuLaunchKernel failed: CUDA_ERROR_LAUNCH_FAILED") != NULL, "%s",
                st.msg);
  ck_assert_ptr_null(out);
  fail_call("cuEventSynchronize", 0, 700 /* CUDA_ERROR_ILLEGAL_ADDRESS: a kernel faulted */);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_run(l, (const kiln_literal *const *)args, nargs, NULL, &out, &st),
                   KILN_EINTERNAL);
  ck_assert_msg(strstr(st.msg, "cuEventSynchronize") != NULL, "%s", st.msg);
  fail_call("", 0, 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_run(l, (const kiln_literal *const *)args, nargs, NULL, &out, &st),
                   0); /* and the device still runs */
  kiln_literal_destroy(out);
  kiln_loaded_destroy(l);

  /* the module load: a cubin for another GPU */
  fail_call("cuModuleLoadData", 0, 209 /* CUDA_ERROR_NO_BINARY_FOR_GPU */);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_device_load(d, ec, &l, &st), KILN_EUNIMPL);
  ck_assert_msg(strstr(st.msg, "cuModuleLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU") != NULL,
                "%s", st.msg);
  fail_call("", 0, 0);
  kiln_test_args_free(args, nargs);
  set_kernels(NULL, 0);
  dlclose(dl);
  kiln_free(fns);
  kiln_executable_destroy(ec);
  kiln_executable_destroy(eh);
  fake_stats s = stats();
  ck_assert_int_eq(s.modules, 0);
  ck_assert_int_eq(s.ctx_depth, 0);
  close_backend(b);
}
END_TEST

/* A device that fails to open is a status, and the backend is not made. */
START_TEST(a_device_that_fails_to_open_is_a_status) {
  fake_open();
  fail_call("cuStreamCreate", 1, 2 /* out of memory */);
  kiln_backend *b = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_backend_create("cuda", NULL, &b, &st), KILN_ELIMIT);
  ck_assert_msg(strstr(st.msg, "cuStreamCreate failed") != NULL, "%s", st.msg);
  ck_assert_ptr_null(b);
  fake_stats s = stats();
  ck_assert_int_eq(s.ctx_depth, 0);
  ck_assert_int_eq(s.allocs, s.frees);
}
END_TEST

START_TEST(the_budget_is_kept) {
  setenv("KILN_CUDA_MEMORY_BYTES", "1048576", 1);
  kiln_backend *b = open_backend();
  kiln_device *d = kiln_backend_device(b, 0);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_buffer *x = NULL, *y = NULL;
  ck_assert_int_eq(kiln_buffer_alloc(d, 600000, &x, &st), 0);
  ck_assert_int_eq(kiln_buffer_alloc(d, 600000, &y, &st), KILN_ELIMIT);
  ck_assert_msg(strstr(st.msg, "KILN_CUDA_MEMORY_BYTES") != NULL, "%s", st.msg);
  kiln_buffer_free(x);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_alloc(d, 600000, &y, &st), 0); /* the freed block again */
  kiln_buffer_free(y);
  ck_assert_int_eq(stats().allocs, 1);
  close_backend(b);
  unsetenv("KILN_CUDA_MEMORY_BYTES");
}
END_TEST

/* ---- GEMM steps through the fake cuBLASLt ------------------------------------ */

static const char *const dot_cases[][2] = {
    {"batched, rhs stored K-minor (a transpose flag)",
     "HloModule d1\n"
     "ENTRY e {\n"
     "  a = f32[3,17,9]{2,1,0} parameter(0)\n"
     "  b = f32[3,9,33]{1,2,0} parameter(1)\n"
     "  ROOT d = f32[3,17,33]{2,1,0} dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
     "rhs_batch_dims={0}, rhs_contracting_dims={1}\n"
     "}\n"},
    {"lhs contracted on dim 0, result column-major (operands exchanged)",
     "HloModule d2\n"
     "ENTRY e {\n"
     "  a = f32[70,40]{1,0} parameter(0)\n"
     "  b = f32[70,24]{1,0} parameter(1)\n"
     "  ROOT d = f32[40,24]{0,1} dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
     "}\n"},
    {"f64", "HloModule d3\n"
            "ENTRY e {\n"
            "  a = f64[20,11] parameter(0)\n"
            "  b = f64[11,30] parameter(1)\n"
            "  ROOT d = f64[20,30] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
            "}\n"},
    {"matrix times vector",
     "HloModule d4\n"
     "ENTRY e {\n"
     "  a = f32[50,70] parameter(0)\n"
     "  v = f32[70] parameter(1)\n"
     "  ROOT d = f32[50] dot(a, v), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
     "}\n"},
    {"bias and relu after the product (an epilogue)",
     "HloModule d5\n"
     "ENTRY e {\n"
     "  x = f32[64,48] parameter(0)\n"
     "  w = f32[48,80] parameter(1)\n"
     "  bias = f32[80] parameter(2)\n"
     "  d = f32[64,80] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
     "  bb = f32[64,80] broadcast(bias), dimensions={1}\n"
     "  s = f32[64,80] add(d, bb)\n"
     "  z = f32[] constant(0)\n"
     "  zb = f32[64,80] broadcast(z), dimensions={}\n"
     "  ROOT r = f32[64,80] maximum(s, zb)\n"
     "}\n"},
    {"products in a loop (GEMM steps in a while body, an epilogue)",
     "HloModule d7\n"
     "cond {\n"
     "  p = (s32[], f32[8,16], f32[16,16]) parameter(0)\n"
     "  i = s32[] get-tuple-element(p), index=0\n"
     "  n = s32[] constant(5)\n"
     "  ROOT lt = pred[] compare(i, n), direction=LT\n"
     "}\n"
     "body {\n"
     "  p = (s32[], f32[8,16], f32[16,16]) parameter(0)\n"
     "  i = s32[] get-tuple-element(p), index=0\n"
     "  h = f32[8,16] get-tuple-element(p), index=1\n"
     "  w = f32[16,16] get-tuple-element(p), index=2\n"
     "  d = f32[8,16] dot(h, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
     "  y = f32[8,16] tanh(d)\n"
     "  one = s32[] constant(1)\n"
     "  j = s32[] add(i, one)\n"
     "  ROOT t = (s32[], f32[8,16], f32[16,16]) tuple(j, y, w)\n"
     "}\n"
     "ENTRY e {\n"
     "  h0 = f32[8,16] parameter(0)\n"
     "  w = f32[16,16] parameter(1)\n"
     "  z = s32[] constant(0)\n"
     "  t = (s32[], f32[8,16], f32[16,16]) tuple(z, h0, w)\n"
     "  r = (s32[], f32[8,16], f32[16,16]) while(t), condition=cond, body=body\n"
     "  ROOT o = f32[8,16] get-tuple-element(r), index=1\n"
     "}\n"},
    {"two batch dims, both operands K-major",
     "HloModule d6\n"
     "ENTRY e {\n"
     "  a = f32[2,3,7,5]{3,2,1,0} parameter(0)\n"
     "  b = f32[2,3,7,4]{3,2,1,0} parameter(1)\n"
     "  ROOT d = f32[2,3,5,4] dot(a, b), lhs_batch_dims={0,1}, lhs_contracting_dims={2}, "
     "rhs_batch_dims={0,1}, rhs_contracting_dims={2}\n"
     "}\n"},
};

/* GEMM steps of the module's cuda executable, and how many have an epilogue. */
static int gemm_steps(const char *text, int *with_epilogue) {
  kiln_module *m = parse(text);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_executable *e = NULL;
  ck_assert_msg(compile(m, "cuda-sm_90", &e, &st) == 0, "%s", st.msg);
  int n = 0;
  *with_epilogue = 0;
  for (uint32_t p = 0; p < e->nprograms; p++)
    for (uint32_t i = 0; i < e->programs[p].nsteps; i++) {
      const kiln_step *s = &e->programs[p].steps[i];
      if (s->kind != KILN_STEP_GEMM) continue;
      n++;
      if (s->nargs > 3) (*with_epilogue)++;
    }
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
  return n;
}

START_TEST(dot_programs_run_through_cublaslt) {
  kiln_backend *b = open_backend();
  bool cxx = system("c++ --version > /dev/null 2>&1") == 0;
  for (size_t i = 0; i < sizeof dot_cases / sizeof dot_cases[0]; i++) {
    int epi = 0;
    ck_assert_msg(gemm_steps(dot_cases[i][1], &epi) > 0, "%s: no GEMM step", dot_cases[i][0]);
    ck_assert_int_eq(epi, 0); /* the cuda target runs an epilogue as a kernel after the GEMM */
    /* With kernels after the GEMM the cpu target lowers apart (its GEMM
     * steps carry their epilogue): those kernels run emulated. */
    emulate = cxx && strstr(dot_cases[i][0], "epilogue") != NULL;
    outcome o = run_case(b, dot_cases[i][1], 11 + i, NULL, 0, dot_cases[i][0]);
    emulate = false;
    ck_assert_int_eq(o, RAN);
  }
  /* random dimension numbers, layouts and shapes around dots */
  int seeds = getenv("KILN_CUDA_FAKE_SEEDS") ? atoi(getenv("KILN_CUDA_FAKE_SEEDS")) : 12;
  int n[4] = {0};
  for (int s = 1; s <= seeds; s++) {
    kiln_progen_options o = {0};
    o.seed = (uint64_t)s + 5000;
    o.ninstrs = 6 + s % 9;
    o.nparams = 2 + s % 2;
    o.dtype = s % 3 == 2 ? KILN_F64 : KILN_F32;
    o.families = KILN_PROGEN_DOT | KILN_PROGEN_ELEMENTWISE | KILN_PROGEN_BROADCAST |
                 KILN_PROGEN_TRANSPOSE | KILN_PROGEN_RESHAPE;
    char *text = kiln_progen_text(&o);
    char name[48];
    snprintf(name, sizeof name, "progen dot seed %d", s + 5000);
    n[run_case(b, text, (uint64_t)s, NULL, 0, name)]++;
    kiln_free(text);
  }
  fprintf(stderr, "fake cuda dots: %d ran, %d refused, %d lowered apart, %d without a reference\n",
          n[RAN], n[REFUSED], n[LOWERED_APART], n[NO_REFERENCE]);
  ck_assert_int_eq(n[REFUSED], 0);
  ck_assert_int_gt(n[RAN], seeds / 2);
  /* the JAX models with dots: their GEMMs are followed by fused kernels,
   * which the cpu target folds into its GEMM steps, so they run emulated */
  /* (transformer.hlo is left to test_cuda_diff: its reference alone takes
   * the interpreter past a minute under ASan) */
  static const char *const files[] = {"mlp2", "block_small"};
  int jax_ran = 0;
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/jax/%s.hlo", KILN_SOURCE_DIR, files[i]);
    char *text = slurp(path, NULL);
    ck_assert_msg(text != NULL, "cannot read %s", path);
    emulate = cxx;
    outcome o = run_case(b, text, 7, NULL, 0, path);
    emulate = false;
    /* no reference: the interpreter ran past its limit (a sanitizer build) */
    ck_assert_msg(o == RAN || o == NO_REFERENCE || (!cxx && o == LOWERED_APART), "%s: outcome %d",
                  path, o);
    jax_ran += o == RAN;
    kiln_free(text);
  }
  ck_assert_int_gt(jax_ran, 0);
  fake_blas_stats bs = blas_stats();
  fprintf(stderr, "fake cuBLASLt: %ld matmuls (%ld batched), %ld heuristics, workspace %llu\n",
          bs.matmuls, bs.batched_matmuls, bs.heuristics, (unsigned long long)bs.max_workspace);
  ck_assert_int_gt(bs.matmuls, 0);
  ck_assert_int_gt(bs.batched_matmuls, 0);
  ck_assert_int_eq(bs.tf32_matmuls, 0); /* pure f32 unless KILN_CUDA_TF32=1 */
  ck_assert_uint_gt(bs.max_workspace, 0);
  ck_assert_int_eq(bs.handles, 1); /* one per device, made once */
  close_backend(b);
}
END_TEST

/* Loads text on the device with its cpu kernels standing in; the caller
 * releases *ec, *eh, *dl and *fns. */
static int load_text(kiln_backend *b, const char *text, kiln_executable **ec, kiln_executable **eh,
                     void **dl, kernel_fn **fns, kiln_loaded **l, kiln_status *st) {
  kiln_module *m = parse(text);
  ck_assert_int_eq(compile(m, "cuda-sm_90", ec, st), 0);
  ck_assert_int_eq(compile(m, "cpu", eh, st), 0);
  kiln_module_destroy(m);
  ck_assert(kiln_test_same_program(*ec, *eh));
  *fns = kiln_test_cpu_kernels(*eh, dl);
  set_kernels(*fns, (*eh)->nkernels);
  *l = NULL;
  return kiln_device_load(kiln_backend_device(b, 0), *ec, l, st);
}

static void unload_text(kiln_loaded *l, kiln_executable *ec, kiln_executable *eh, void *dl,
                        kernel_fn *fns) {
  kiln_loaded_destroy(l);
  set_kernels(NULL, 0);
  if (dl) dlclose(dl);
  kiln_free(fns);
  kiln_executable_destroy(ec);
  kiln_executable_destroy(eh);
}

static const char dot_plain[] = "HloModule dp\n"
                                "ENTRY e {\n"
                                "  a = f32[4,64] parameter(0)\n"
                                "  b = f32[64,4] parameter(1)\n"
                                "  ROOT d = f32[4,4] dot(a, b), lhs_contracting_dims={1}, "
                                "rhs_contracting_dims={0}\n"
                                "}\n";

/* Every element of a is 1 + 2^-12 and of b 1: the exact product, 64 +
 * 2^-6, is an f32; TF32 keeps 10 mantissa bits and rounds a to 1. */
static float dot_plain_result(kiln_backend *b) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_executable *ec, *eh;
  void *dl;
  kernel_fn *fns;
  kiln_loaded *l;
  ck_assert_msg(load_text(b, dot_plain, &ec, &eh, &dl, &fns, &l, &st) == 0, "%s", st.msg);
  kiln_module *m = parse(dot_plain);
  kiln_literal **args = NULL, *out = NULL;
  uint32_t nargs = 0;
  ck_assert_int_eq(kiln_test_args_random(m, 1, &args, &nargs, &st), 0);
  kiln_module_destroy(m);
  for (int64_t i = 0; i < 256; i++) {
    kiln_literal_set_f64(args[0], i, 1.0 + ldexp(1.0, -12));
    kiln_literal_set_f64(args[1], i, 1.0);
  }
  ck_assert_msg(kiln_loaded_run(l, (const kiln_literal *const *)args, nargs, NULL, &out, &st) == 0,
                "%s", st.msg);
  float r = (float)kiln_literal_get_f64(out, 5);
  kiln_literal_destroy(out);
  kiln_test_args_free(args, nargs);
  unload_text(l, ec, eh, dl, fns);
  return r;
}

START_TEST(tf32_is_used_only_when_allowed) {
  kiln_backend *b = open_backend();
  unsetenv("KILN_CUDA_TF32");
  ck_assert_float_eq(dot_plain_result(b), 64.0f + 1.0f / 64.0f);
  ck_assert_int_eq(blas_stats().tf32_matmuls, 0);
  setenv("KILN_CUDA_TF32", "1", 1); /* read when an executable loads */
  ck_assert_float_eq(dot_plain_result(b), 64.0f);
  ck_assert_int_eq(blas_stats().tf32_matmuls, 1);
  unsetenv("KILN_CUDA_TF32");
  blas_clean("tf32");
  close_backend(b);
}
END_TEST

START_TEST(cublaslt_failures_are_statuses) {
  kiln_backend *b = open_backend();
  kiln_status st;
  kiln_status_clear(&st);
  kiln_executable *ec, *eh;
  void *dl;
  kernel_fn *fns;
  kiln_loaded *l;
  /* the handle, at the first load with a GEMM */
  blas_fail("cublasLtCreate", 0, 1 /* CUBLAS_STATUS_NOT_INITIALIZED */);
  ck_assert_int_eq(load_text(b, dot_plain, &ec, &eh, &dl, &fns, &l, &st), KILN_EUNAVAIL);
  ck_assert_msg(strstr(st.msg, "cublasLtCreate failed: CUBLAS_STATUS_NOT_INITIALIZED") != NULL,
                "%s", st.msg);
  ck_assert_ptr_null(l);
  unload_text(l, ec, eh, dl, fns);
  /* the heuristic finds nothing */
  blas_fail("cublasLtMatmulAlgoGetHeuristic", 0, 15 /* CUBLAS_STATUS_NOT_SUPPORTED */);
  kiln_status_clear(&st);
  ck_assert_int_eq(load_text(b, dot_plain, &ec, &eh, &dl, &fns, &l, &st), KILN_EUNIMPL);
  ck_assert_msg(strstr(st.msg, "cublasLtMatmulAlgoGetHeuristic failed") != NULL, "%s", st.msg);
  ck_assert_msg(strstr(st.where, "gemm 4x4x64") != NULL, "%s", st.where);
  unload_text(l, ec, eh, dl, fns);
  /* a layout cannot be made: what was made is destroyed */
  blas_fail("cublasLtMatrixLayoutCreate", 1, 3 /* CUBLAS_STATUS_ALLOC_FAILED */);
  kiln_status_clear(&st);
  ck_assert_int_eq(load_text(b, dot_plain, &ec, &eh, &dl, &fns, &l, &st), KILN_ELIMIT);
  ck_assert_msg(strstr(st.msg, "cublasLtMatrixLayoutCreate failed") != NULL, "%s", st.msg);
  unload_text(l, ec, eh, dl, fns);
  blas_clean("failed loads");
  /* the matmul itself: the run fails naming it, the device runs on */
  blas_fail("", 0, 0);
  kiln_status_clear(&st);
  ck_assert_msg(load_text(b, dot_plain, &ec, &eh, &dl, &fns, &l, &st) == 0, "%s", st.msg);
  kiln_module *m = parse(dot_plain);
  kiln_literal **args = NULL, *out = NULL;
  uint32_t nargs = 0;
  ck_assert_int_eq(kiln_test_args_random(m, 2, &args, &nargs, &st), 0);
  kiln_module_destroy(m);
  blas_fail("cublasLtMatmul", 0, 13 /* CUBLAS_STATUS_EXECUTION_FAILED */);
  ck_assert_int_eq(kiln_loaded_run(l, (const kiln_literal *const *)args, nargs, NULL, &out, &st),
                   KILN_EINTERNAL);
  ck_assert_msg(strstr(st.msg, "cublasLtMatmul failed: CUBLAS_STATUS_EXECUTION_FAILED") != NULL,
                "%s", st.msg);
  ck_assert_ptr_null(out);
  ck_assert_int_eq(stats().ctx_depth, 0);
  blas_fail("", 0, 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_loaded_run(l, (const kiln_literal *const *)args, nargs, NULL, &out, &st),
                   0);
  kiln_literal_destroy(out);
  kiln_test_args_free(args, nargs);
  unload_text(l, ec, eh, dl, fns);
  blas_clean("matmul failure");
  close_backend(b);
}
END_TEST

/* Without the library only programs with GEMM steps are refused, at load,
 * naming it. (Each test runs in its own process: the library is opened
 * once per process.) */
START_TEST(without_cublaslt_gemm_programs_are_refused_at_load) {
  const char *fork = getenv("CK_FORK");
  if (fork && strcmp(fork, "no") == 0) {
    fprintf(stderr, "skipped: needs a process of its own (CK_FORK=no)\n");
    return;
  }
  setenv("KILN_CUBLASLT_LIB", "/nonexistent/libcublasLt.so.13", 1);
  kiln_backend *b = open_backend();
  kiln_status st;
  kiln_status_clear(&st);
  kiln_executable *ec, *eh;
  void *dl;
  kernel_fn *fns;
  kiln_loaded *l;
  ck_assert_int_eq(load_text(b, dot_plain, &ec, &eh, &dl, &fns, &l, &st), KILN_EUNAVAIL);
  ck_assert_msg(strstr(st.msg, "GEMM steps need cuBLASLt") != NULL &&
                    strstr(st.msg, "/nonexistent/libcublasLt.so.13") != NULL,
                "%s", st.msg);
  unload_text(l, ec, eh, dl, fns);
  ck_assert_int_eq(run_case(b, ew, 3, NULL, 0, "ew without cuBLASLt"), RAN);
  close_backend(b);
  setenv("KILN_CUBLASLT_LIB", KILN_FAKE_CUBLASLT, 1);
}
END_TEST

static kiln_step *first_gemm(kiln_executable *e) {
  for (uint32_t p = 0; p < e->nprograms; p++)
    for (uint32_t i = 0; i < e->programs[p].nsteps; i++)
      if (e->programs[p].steps[i].kind == KILN_STEP_GEMM) return &e->programs[p].steps[i];
  return NULL;
}

/* A GEMM step an executable from elsewhere describes badly is a status at
 * load, before cuBLASLt sees it. */
START_TEST(hostile_gemm_steps_are_refused_at_load) {
  kiln_backend *b = open_backend();
  kiln_device *d = kiln_backend_device(b, 0);
  kiln_module *m = parse(dot_cases[0][1]);
  static const struct {
    int field;
    int64_t value;
    int code;
    const char *says;
  } bad[] = {
      {0, 1, KILN_EINVAL, "leading dimension"},         /* lda below k */
      {1, KILN_S8, KILN_EUNIMPL, "integer GEMM"},       /* dtype */
      {2, 0, KILN_EUNIMPL, "empty contraction"},        /* k 0 */
      {3, 100000, KILN_EINVAL, "spans"},                /* n past C's slot */
      {4, 2, KILN_EINVAL, "transpose flags"},           /* trans_a */
      {5, INT64_C(1) << 40, KILN_EINVAL, "gemm batch"}, /* m past int32 */
      {6, 2, KILN_EINVAL, "takes 3 slots"},             /* nargs */
      {7, 1, KILN_EINVAL, "batches overlap"},           /* stride_c */
      {8, 0, KILN_EUNIMPL, "element type"},             /* dtype pred */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kiln_status st;
    kiln_status_clear(&st);
    kiln_executable *e = NULL;
    ck_assert_int_eq(compile(m, "cuda-sm_90", &e, &st), 0);
    kiln_step *s = first_gemm(e);
    ck_assert_ptr_nonnull(s);
    switch (bad[i].field) {
    case 0: s->gemm.lda = bad[i].value; break;
    case 1: s->gemm.dtype = (kiln_dtype)bad[i].value; break;
    case 2: s->gemm.k = 0; break;
    case 3: s->gemm.n = bad[i].value; break;
    case 4: s->gemm.trans_a = (uint8_t)bad[i].value; break;
    case 5: s->gemm.m = bad[i].value; break;
    case 6: s->nargs = (uint32_t)bad[i].value; break;
    case 7: s->gemm.stride_c = bad[i].value; break;
    case 8: s->gemm.dtype = KILN_PRED; break;
    }
    kiln_loaded *l = NULL;
    ck_assert_int_eq(kiln_device_load(d, e, &l, &st), bad[i].code);
    ck_assert_msg(strstr(st.msg, bad[i].says) != NULL, "case %zu: %s", i, st.msg);
    ck_assert_msg(strstr(st.where, "(gemm)") != NULL, "case %zu: %s", i, st.where);
    ck_assert_ptr_null(l);
    if (bad[i].field == 6) s->nargs = 3;
    kiln_executable_destroy(e);
  }
  kiln_module_destroy(m);
  blas_clean("hostile");
  ck_assert_int_eq(stats().ctx_depth, 0);
  close_backend(b);
}
END_TEST

/* The fake rejects what cuBLASLt would, so that the backend passing it
 * means something: a leading dimension below the rows, an attribute of the
 * wrong size, shapes the transposes do not make agree, a pointer less
 * aligned than the algorithm was chosen for, an operand outside device
 * memory, no current context. (Numbers from library_types.h and
 * cublasLt.h: CUDA_R_32F 0, CUBLAS_COMPUTE_32F 68, BATCH_COUNT 5, TRANSA 3;
 * statuses NOT_INITIALIZED 1, INVALID_VALUE 7, EXECUTION_FAILED 13.) */
typedef int (*proc_fn)(const char *, void **, int, uint64_t, int *);
static void *entry(const char *name) {
  void *p = dlsym(fake, "cuGetProcAddress_v2"), *f = NULL;
  proc_fn get;
  memcpy(&get, &p, sizeof p);
  int q = 0;
  ck_assert_int_eq(get(name, &f, 13000, 0, &q), 0);
  return f;
}
static void *blas_entry(const char *name) {
  void *f = dlsym(fake_blas, name);
  ck_assert_msg(f != NULL, "the fake cuBLASLt has no %s", name);
  return f;
}
#define FN(type, var, get, name) \
  __typeof__(type) var; \
  do { \
    void *p_ = get(name); \
    memcpy(&var, &p_, sizeof p_); \
  } while (0)

START_TEST(the_fake_cublaslt_is_strict) {
  fake_open();
  FN(int (*)(void **, int), retain, entry, "cuDevicePrimaryCtxRetain");
  FN(int (*)(void *), push, entry, "cuCtxPushCurrent");
  FN(int (*)(void **), pop, entry, "cuCtxPopCurrent");
  FN(int (*)(uint64_t *, size_t), mem_alloc, entry, "cuMemAlloc");
  FN(int (*)(uint64_t), mem_free, entry, "cuMemFree");
  FN(int (*)(void **), create, blas_entry, "cublasLtCreate");
  FN(int (*)(void *), destroy, blas_entry, "cublasLtDestroy");
  FN(int (*)(void **, int, uint64_t, uint64_t, int64_t), layout, blas_entry,
     "cublasLtMatrixLayoutCreate");
  FN(int (*)(void *, int, const void *, size_t), layout_set, blas_entry,
     "cublasLtMatrixLayoutSetAttribute");
  FN(int (*)(void *), layout_destroy, blas_entry, "cublasLtMatrixLayoutDestroy");
  FN(int (*)(void **, int, int), desc, blas_entry, "cublasLtMatmulDescCreate");
  FN(int (*)(void *, int, const void *, size_t), desc_set, blas_entry,
     "cublasLtMatmulDescSetAttribute");
  FN(int (*)(void *), desc_destroy, blas_entry, "cublasLtMatmulDescDestroy");
  FN(int (*)(void **), pref, blas_entry, "cublasLtMatmulPreferenceCreate");
  FN(int (*)(void *), pref_destroy, blas_entry, "cublasLtMatmulPreferenceDestroy");
  FN(int (*)(void *, void *, void *, void *, void *, void *, void *, int, void *, int *), heur,
     blas_entry, "cublasLtMatmulAlgoGetHeuristic");
  FN(int (*)(void *, void *, const void *, const void *, void *, const void *, void *, const void *,
             const void *, void *, void *, void *, const void *, void *, size_t, void *),
     matmul, blas_entry, "cublasLtMatmul");

  void *h = NULL, *ctx = NULL;
  ck_assert_int_eq(create(&h), 1); /* no current context */
  ck_assert_int_eq(retain(&ctx, 0), 0);
  ck_assert_int_eq(push(ctx), 0);
  ck_assert_int_eq(create(&h), 0);
  void *bad = NULL, *la = NULL, *lb = NULL, *lb2 = NULL, *lc = NULL, *dsc = NULL, *pf = NULL;
  ck_assert_int_eq(layout(&bad, 0, 10, 5, 9), 7); /* ld 9 below 10 rows */
  ck_assert_int_eq(layout(&la, 0, 10, 5, 10), 0);
  int64_t wide = 2;
  ck_assert_int_eq(layout_set(la, 5, &wide, sizeof wide), 7); /* the batch count is an int32 */
  ck_assert_int_eq(layout(&lb, 0, 6, 7, 6), 0);
  ck_assert_int_eq(layout(&lb2, 0, 5, 7, 5), 0);
  ck_assert_int_eq(layout(&lc, 0, 10, 7, 10), 0);
  ck_assert_int_eq(desc(&dsc, 68, 0), 0);
  int64_t op = 0;
  ck_assert_int_eq(desc_set(dsc, 3, &op, sizeof op), 7); /* TRANSA is an int32 */
  ck_assert_int_eq(pref(&pf), 0);
  _Alignas(16) unsigned char res[256];
  int found = 0;
  ck_assert_int_eq(heur(h, dsc, la, lb, lc, lc, pf, 1, res, &found), 7); /* k 5 against 6 */
  ck_assert_int_eq(heur(h, dsc, la, lb2, lc, lc, pf, 1, res, &found), 0);
  ck_assert_int_eq(found, 1);
  uint64_t mem = 0;
  ck_assert_int_eq(mem_alloc(&mem, 4096), 0);
  char *base = (char *)(uintptr_t)mem;
  float one = 1, zero = 0;
  long bad_before = stats().bad_addresses;
  /* A at 4 bytes past a 256-byte boundary, the heuristic's default alignment */
  ck_assert_int_eq(matmul(h, dsc, &one, base + 4, la, base + 1024, lb2, &zero, base + 2048, lc,
                          base + 2048, lc, res, NULL, 0, NULL),
                   7);
  /* C's 280 bytes run past the allocation */
  ck_assert_int_eq(matmul(h, dsc, &one, base, la, base + 1024, lb2, &zero, base + 3840, lc,
                          base + 3840, lc, res, NULL, 0, NULL),
                   13);
  ck_assert_int_eq(stats().bad_addresses, bad_before + 1);
  ck_assert_int_eq(matmul(h, dsc, &one, base, la, base + 1024, lb2, &zero, base + 2048, lc,
                          base + 2048, lc, res, NULL, 0, NULL),
                   0);
  ck_assert_int_ge(blas_stats().rejects, 6);
  ck_assert_int_eq(mem_free(mem), 0);
  pref_destroy(pf);
  desc_destroy(dsc);
  layout_destroy(la);
  layout_destroy(lb);
  layout_destroy(lb2);
  layout_destroy(lc);
  ck_assert_int_eq(destroy(h), 0);
  void *popped = NULL;
  ck_assert_int_eq(pop(&popped), 0);
  fake_blas_stats bs = blas_stats();
  ck_assert_int_eq(bs.handles + bs.descs + bs.layouts + bs.prefs, 0);
  ck_assert_int_eq(bs.matmuls, 1);
}
END_TEST

int main(void) {
  setenv("KILN_CUDA_DRIVER", KILN_FAKE_CUDA, 1);
  setenv("KILN_CUBLASLT_LIB", KILN_FAKE_CUBLASLT, 1);
  Suite *s = suite_create("cuda_fake");
  TCase *c = tcase_create("fake");
  tcase_set_timeout(c, 300);
  tcase_add_test(c, the_fake_gpu_is_a_cuda_device);
  tcase_add_test(c, progen_corpus_runs_through_the_backend);
  tcase_add_test(c, while_and_conditional_are_driven_from_the_host);
  tcase_add_test(c, cuda_kernels_emulated_over_the_grid);
  tcase_add_test(c, the_emulator_runs_cooperative_blocks);
  tcase_add_test(c, execute_on_buffers_and_copies);
  tcase_add_test(c, driver_failures_are_statuses_naming_the_call);
  tcase_add_test(c, a_device_that_fails_to_open_is_a_status);
  tcase_add_test(c, the_budget_is_kept);
  tcase_add_test(c, dot_programs_run_through_cublaslt);
  tcase_add_test(c, tf32_is_used_only_when_allowed);
  tcase_add_test(c, cublaslt_failures_are_statuses);
  tcase_add_test(c, without_cublaslt_gemm_programs_are_refused_at_load);
  tcase_add_test(c, hostile_gemm_steps_are_refused_at_load);
  tcase_add_test(c, the_fake_cublaslt_is_strict);
  suite_add_tcase(s, c);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
#else
int main(void) {
  printf("cuda_fake: built without the CUDA device pool or the fake driver: nothing to test\n");
  return 0;
}
#endif
