/* Differential tests of the simplification passes against the reference
 * interpreter: a module runs on deterministic random arguments before and
 * after each pass (algsimp, constfold, cse, dce, while_licm, unroll, scatter_merge) and after all
 * of them in pipeline order, and the results must be identical bit for bit
 * (the passes never reassociate). The modules: the conformance corpus (those
 * the interpreter runs on one device; skipped with a message when the
 * corpus is absent), the inputs of the pass golden files, the hand-written
 * modules below, and modules from the random program generator.
 *
 * Float arguments include -0, +0, infinities and NaN now and then, since
 * those are exactly where a wrong identity shows.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/fp16.h"
#include "common/sbuf.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/pass.h"
#include "tests/support/golden.h"
#include "tests/support/progen.h"

static const char *const sequences[] = {
    "algsimp",       "constfold",
    "cse",           "dce",
    "while_licm",    "unroll",
    "scatter_merge", "unroll inline algsimp constfold cse dce scatter_merge while_licm",
};
#define NSEQ (sizeof sequences / sizeof sequences[0])

/* ---- arguments ---------------------------------------------------------- */

static uint64_t next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double random_float(uint64_t *s, bool specials) {
  uint64_t r = next(s);
  if (specials) {
    switch (r % 32) {
    case 0: return -0.0;
    case 1: return 0.0;
    case 2: return INFINITY;
    case 3: return -INFINITY;
    case 4: return NAN;
    case 5: return 1.0;
    default: break;
    }
  }
  /* Multiples of 1/64 in [-4, 4): exact in every float type. */
  return ((double)((r >> 8) % 512) - 256.0) / 64.0;
}

static void fill(kiln_literal *lit, uint64_t *s, bool specials) {
  if (kiln_shape_is_tuple(&lit->shape)) {
    for (uint32_t i = 0; i < lit->shape.rank; i++) fill(lit->elems[i], s, specials);
    return;
  }
  if (!kiln_shape_is_array(&lit->shape)) return;
  kiln_dtype t = lit->shape.dtype;
  int64_t n = kiln_literal_elements(lit);
  for (int64_t i = 0; i < n; i++) {
    uint64_t r = next(s);
    if (kiln_dtype_is_float(t) || kiln_dtype_is_complex(t))
      kiln_literal_set_f64(lit, i, random_float(s, specials));
    else if (t == KILN_PRED)
      kiln_literal_set_u64(lit, i, r & 1);
    else if (kiln_dtype_is_signed_int(t))
      kiln_literal_set_s64(lit, i, (int64_t)(r % 16) - 8);
    else
      kiln_literal_set_u64(lit, i, r % 16);
  }
}

/* One heap literal per entry parameter; false when a parameter cannot be
 * made (a token, a missing parameter). */
static bool make_args(const kiln_module *m, uint64_t seed, bool specials, kiln_literal ***out,
                      uint32_t *nout) {
  const kiln_computation *e = kiln_module_entry(m);
  uint32_t n = kiln_computation_nparams(m, e);
  kiln_literal **args = calloc(n ? n : 1, sizeof *args);
  uint64_t s = seed;
  for (uint32_t i = 0; i < n; i++) {
    const kiln_instr *p = kiln_computation_param(m, e, i);
    kiln_status st;
    kiln_status_clear(&st);
    if (p == NULL || kiln_shape_is_token(&p->shape) ||
        kiln_literal_create(NULL, &p->shape, (size_t)64 << 20, &args[i], &st)) {
      for (uint32_t j = 0; j < i; j++) kiln_literal_destroy(args[j]);
      free(args);
      return false;
    }
    fill(args[i], &s, specials);
  }
  *out = args;
  *nout = n;
  return true;
}

static void free_args(kiln_literal **args, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) kiln_literal_destroy(args[i]);
  free(args);
}

/* ---- running ------------------------------------------------------------ */

static int run(const kiln_module *m, kiln_literal **args, uint32_t n, kiln_literal **out,
               kiln_status *st) {
  kiln_interp_options o = {0};
  o.max_while_iterations = 5000;
  o.max_live_bytes = (size_t)1 << 30;
  o.timeout_seconds = 20;
  kiln_status_clear(st);
  return kiln_interp_run(m, (const kiln_literal *const *)args, n, &o, out, st);
}

/* Runs the named passes in order on m, verifying after each. */
static void apply(kiln_module *m, const char *seq, const char *what) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", seq);
  for (char *save = NULL, *name = strtok_r(buf, " ", &save); name;
       name = strtok_r(NULL, " ", &save)) {
    const kiln_pass *p = kiln_pipeline_find(name);
    ck_assert_msg(p != NULL, "no pass %s", name);
    kiln_status st;
    kiln_status_clear(&st);
    kiln_arena *scratch = kiln_arena_create();
    kiln_pass_ctx ctx = {kiln_target_default(), scratch, &st, 2, 0, NULL};
    int rc = p->run(m, &ctx);
    kiln_arena_destroy(scratch);
    ck_assert_msg(rc == 0, "%s: %s failed: %s: %s", what, name, st.where, st.msg);
    rc = kiln_module_verify(m, NULL, &st);
    if (rc) {
      char *text = kiln_module_print(m, NULL);
      fprintf(stderr, "---- %s: after %s ----\n%s", what, name, text);
      ck_abort_msg("%s: after %s: %s: %.300s", what, name, st.where, st.msg);
    }
  }
}

static char *show(const kiln_literal *lit) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_literal_print(&b, lit, true);
  char *s = kiln_sbuf_detach(&b, NULL);
  if (s && strlen(s) > 2000) s[2000] = '\0';
  return s;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Checks every sequence on module text; returns false (with a reason in
 * why) when the original does not run on the interpreter. A module slow on
 * the interpreter (a big convolution) is checked with the whole sequence
 * only, on one set of arguments, to keep the suite quick. */
static bool check_module(const char *text, size_t len, const char *what, uint64_t seed, char *why,
                         size_t whysize) {
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_module_parse_text(text, len, what, NULL, &m, &st) || kiln_module_verify(m, NULL, &st)) {
    snprintf(why, whysize, "does not verify: %s", st.msg);
    kiln_module_destroy(m);
    return false;
  }
  bool ran = false;
  for (int specials = 0; specials < 2; specials++) {
    kiln_literal **args = NULL, *want = NULL;
    uint32_t nargs = 0;
    if (!make_args(m, seed + (uint64_t)specials, specials, &args, &nargs)) {
      snprintf(why, whysize, "parameters cannot be generated");
      break;
    }
    double t0 = now();
    if (run(m, args, nargs, &want, &st)) {
      snprintf(why, whysize, "interpreter: %s", st.msg);
      free_args(args, nargs);
      continue;
    }
    bool slow = now() - t0 > 0.25;
    ran = true;
    for (size_t q = slow ? NSEQ - 1 : 0; q < NSEQ; q++) {
      kiln_module *c = NULL;
      ck_assert_int_eq(kiln_module_clone(m, &c), 0);
      char label[512];
      snprintf(label, sizeof label, "%s [%s]%s", what, sequences[q], specials ? " specials" : "");
      apply(c, sequences[q], label);
      kiln_literal *got = NULL;
      int rc = run(c, args, nargs, &got, &st);
      if (rc) {
        char *after = kiln_module_print(c, NULL);
        fprintf(stderr, "---- %s: module after ----\n%s", label, after);
        ck_abort_msg("%s: no longer runs: %s: %.300s", label, st.where, st.msg);
      }
      if (!kiln_literal_equal(want, got)) {
        char *a = show(want), *b = show(got), *after = kiln_module_print(c, NULL);
        fprintf(stderr, "---- %s: results differ\n  before: %s\n  after:  %s\n%s", label, a, b,
                after);
        ck_abort_msg("%s: results differ (details on stderr)", label);
      }
      kiln_literal_destroy(got);
      kiln_module_destroy(c);
    }
    kiln_literal_destroy(want);
    free_args(args, nargs);
    if (slow) break;
  }
  /* What the interpreter cannot run must still come out of every sequence
   * verified. */
  for (size_t q = 0; q < NSEQ && !ran; q++) {
    kiln_module *c = NULL;
    ck_assert_int_eq(kiln_module_clone(m, &c), 0);
    char label[512];
    snprintf(label, sizeof label, "%s [%s]", what, sequences[q]);
    apply(c, sequences[q], label);
    kiln_module_destroy(c);
  }
  kiln_module_destroy(m);
  return ran;
}

/* ---- file-based modules (corpus and goldens) ---------------------------- */

static char **files;
static int nfiles, ncorpus;
static char corpus_dir[1024];

static void add_files(const char *dir) {
  char **list = NULL;
  int n = kiln_golden_list(dir, &list);
  for (int i = 0; i < n; i++) {
    files = realloc(files, (size_t)(nfiles + 1) * sizeof *files);
    files[nfiles++] = strdup(list[i]);
  }
  if (n > 0) kiln_golden_free_list(list, n);
}

START_TEST(test_file) {
  size_t len;
  char *text = kiln_golden_read(files[_i], &len);
  ck_assert_msg(text != NULL, "cannot read %s", files[_i]);
  char why[1200];
  if (!check_module(text, len, files[_i], 1000 + (uint64_t)_i, why, sizeof why))
    fprintf(stderr, "skip %s: %s\n", files[_i], why);
  free(text);
}
END_TEST

/* The golden inputs must all run: they are written for the interpreter. */
START_TEST(test_golden_inputs_run) {
  for (int i = ncorpus; i < nfiles; i++) {
    size_t len;
    char *text = kiln_golden_read(files[i], &len);
    ck_assert_ptr_nonnull(text);
    kiln_module *m = NULL;
    kiln_status st;
    kiln_status_clear(&st);
    ck_assert_int_eq(kiln_module_parse_text(text, len, files[i], NULL, &m, &st), 0);
    kiln_literal **args;
    uint32_t nargs;
    ck_assert(make_args(m, 7, false, &args, &nargs));
    kiln_literal *out = NULL;
    bool rng = strstr(text, "rng(") != NULL || strstr(text, "custom-call") != NULL ||
               strstr(text, "c64") != NULL;
    int rc = run(m, args, nargs, &out, &st);
    ck_assert_msg(rc == 0 || rng, "%s does not run: %s", files[i], st.msg);
    kiln_literal_destroy(out);
    free_args(args, nargs);
    kiln_module_destroy(m);
    free(text);
  }
}
END_TEST

/* ---- hand-written modules ----------------------------------------------- */

static const char *const own_modules[] = {
    /* Every algebraic rewrite at once, on arguments with -0, inf and NaN. */
    "HloModule identities\n"
    "addf { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }\n"
    "mini { a = s32[] parameter(0)  b = s32[] parameter(1)  ROOT s = s32[] minimum(a, b) }\n"
    "ENTRY main {\n"
    "  x = f32[6] parameter(0)\n  i = s32[6] parameter(1)\n  p = pred[6] parameter(2)\n"
    "  nz = f32[] constant(-0)  nzb = f32[6] broadcast(nz), dimensions={}\n"
    "  pz = f32[] constant(0)  pzb = f32[6] broadcast(pz), dimensions={}\n"
    "  one = f32[] constant(1)  oneb = f32[6] broadcast(one), dimensions={}\n"
    "  a1 = f32[6] add(x, nzb)  a2 = f32[6] add(x, pzb)  s1 = f32[6] subtract(x, pzb)\n"
    "  s2 = f32[6] subtract(x, nzb)  m1 = f32[6] multiply(oneb, x)  d1 = f32[6] divide(x, oneb)\n"
    "  q = f32[] constant(0.25)  qb = f32[6] broadcast(q), dimensions={}\n"
    "  d2 = f32[6] divide(x, qb)  big = f32[] constant(1.7014118e+38)\n"
    "  bb = f32[6] broadcast(big), dimensions={}  d3 = f32[6] divide(x, bb)\n"
    "  two = f32[] constant(2)  twob = f32[6] broadcast(two), dimensions={}\n"
    "  pw = f32[6] power(x, twob)  pw1 = f32[6] power(x, oneb)  pw0 = f32[6] power(x, pzb)\n"
    "  n1 = f32[6] negate(x)  n2 = f32[6] negate(n1)  mx = f32[6] maximum(x, x)\n"
    "  sel = f32[6] select(p, x, x)  r0 = f32[6] reduce(x, nz), dimensions={}, to_apply=addf\n"
    "  r1 = f32[6] reduce(x, pz), dimensions={}, to_apply=addf\n"
    "  imax = s32[] constant(2147483647)\n"
    "  r2 = s32[6] reduce(i, imax), dimensions={}, to_apply=mini\n"
    "  zi = s32[] constant(0)  zib = s32[6] broadcast(zi), dimensions={}\n"
    "  im = s32[6] multiply(i, zib)  is = s32[6] subtract(i, i)  ix = s32[6] xor(i, i)\n"
    "  ic = pred[6] compare(i, i), direction=LE  ic2 = pred[6] compare(i, i), direction=LT\n"
    "  two_i = s32[] constant(2)  tib = s32[6] broadcast(two_i), dimensions={}\n"
    "  ip = s32[6] power(i, tib)  idv = s32[6] divide(i, tib)\n"
    "  pa = pred[6] and(p, p)  t = pred[] constant(true)  tb = pred[6] broadcast(t), "
    "dimensions={}\n"
    "  po = pred[6] or(p, tb)  px = pred[6] xor(p, tb)\n"
    "  ROOT r = (f32[6], f32[6], f32[6], f32[6], f32[6], f32[6], f32[6], f32[6], f32[6], "
    "f32[6], f32[6], f32[6], f32[6], f32[6], f32[6], f32[6], s32[6], s32[6], s32[6], "
    "s32[6], pred[6], pred[6], s32[6], s32[6], pred[6], pred[6], pred[6]) tuple(a1, a2, s1, s2, "
    "m1, d1, d2, d3, pw, pw1, pw0, n2, mx, sel, r0, r1, im, is, ix, r2, ic, ic2, ip, idv, "
    "pa, po, px)\n"
    "}\n",
    /* Narrow floats: division by a power of two and pow(x, 2) in bf16/f16. */
    "HloModule narrow\n"
    "ENTRY main {\n"
    "  x = bf16[8] parameter(0)  y = f16[8] parameter(1)\n"
    "  c = bf16[] constant(0.125)  cb = bf16[8] broadcast(c), dimensions={}\n"
    "  d = bf16[8] divide(x, cb)\n"
    "  h = f16[] constant(1024)  hb = f16[8] broadcast(h), dimensions={}\n"
    "  e = f16[8] divide(y, hb)  two = f16[] constant(2)  tb = f16[8] broadcast(two), "
    "dimensions={}\n"
    "  p = f16[8] power(y, tb)\n"
    "  ROOT r = (bf16[8], f16[8], f16[8]) tuple(d, e, p)\n"
    "}\n",
    /* Shape chains on real data. */
    "HloModule shapes\n"
    "ENTRY main {\n"
    "  x = f32[2,3,4] parameter(0)\n"
    "  t1 = f32[4,2,3] transpose(x), dimensions={2,0,1}\n"
    "  t2 = f32[3,4,2] transpose(t1), dimensions={2,0,1}\n"
    "  r1 = f32[12,2] reshape(t2)  r2 = f32[6,4] reshape(r1)\n"
    "  s1 = f32[5,4] slice(r2), slice={[1:6], [0:4]}\n"
    "  s2 = f32[2,2] slice(s1), slice={[1:5:2], [1:4:2]}\n"
    "  b1 = f32[2,3,2] broadcast(s2), dimensions={0,2}\n"
    "  b2 = f32[5,2,3,2] broadcast(b1), dimensions={1,2,3}\n"
    "  ROOT r = (f32[6,4], f32[5,2,3,2]) tuple(r2, b2)\n"
    "}\n",
    /* A loop with invariant work, a loop-carried counter and a nested loop. */
    "HloModule loops\n"
    "cond { s = (s32[], f32[3], f32[3]) parameter(0)  i = s32[] get-tuple-element(s), index=0\n"
    "  n = s32[] constant(4)  ROOT lt = pred[] compare(i, n), direction=LT }\n"
    "body { s = (s32[], f32[3], f32[3]) parameter(0)  i = s32[] get-tuple-element(s), index=0\n"
    "  a = f32[3] get-tuple-element(s), index=1  w = f32[3] get-tuple-element(s), index=2\n"
    "  e = f32[3] exponential(w)  c = f32[] constant(0.5)  cb = f32[3] broadcast(c), "
    "dimensions={}\n"
    "  m = f32[3] multiply(e, cb)  a2 = f32[3] add(a, m)  a3 = f32[3] multiply(a2, cb)\n"
    "  one = s32[] constant(1)  i2 = s32[] add(i, one)\n"
    "  ROOT t = (s32[], f32[3], f32[3]) tuple(i2, a3, w) }\n"
    "ENTRY main { x = f32[3] parameter(0)  w = f32[3] parameter(1)  z = s32[] constant(0)\n"
    "  init = (s32[], f32[3], f32[3]) tuple(z, x, w)\n"
    "  l = (s32[], f32[3], f32[3]) while(init), condition=cond, body=body\n"
    "  ROOT r = ((s32[], f32[3], f32[3]), f32[3]) tuple(l, x) }\n",
    /* jax.random's threefry loop, in small: five trips of two rounds of u32
     * add, rotate (shift-left | shift-right-logical by 32 - r, rotation
     * amounts carried in the state and swapped each trip) and xor, the key
     * injected with the trip counter; then the bits made a float in [1, 2). */
    "HloModule threefry\n"
    "cond { s = (s32[], u32[16], u32[16], u32[2], u32[2], u32[]) parameter(0)\n"
    "  i = s32[] get-tuple-element(s), index=0  n = s32[] constant(5)\n"
    "  ROOT lt = pred[] compare(i, n), direction=LT }\n"
    "body { s = (s32[], u32[16], u32[16], u32[2], u32[2], u32[]) parameter(0)\n"
    "  i = s32[] get-tuple-element(s), index=0  x = u32[16] get-tuple-element(s), index=1\n"
    "  y = u32[16] get-tuple-element(s), index=2  ra = u32[2] get-tuple-element(s), index=3\n"
    "  rb = u32[2] get-tuple-element(s), index=4  k = u32[] get-tuple-element(s), index=5\n"
    "  thirty2 = u32[] constant(32)\n"
    "  r0s = u32[1] slice(ra), slice={[0:1]}  r0 = u32[] reshape(r0s)\n"
    "  r0b = u32[16] broadcast(r0), dimensions={}  r0c = u32[] subtract(thirty2, r0)\n"
    "  r0cb = u32[16] broadcast(r0c), dimensions={}\n"
    "  a1 = u32[16] add(x, y)  l1 = u32[16] shift-left(y, r0b)\n"
    "  h1 = u32[16] shift-right-logical(y, r0cb)  o1 = u32[16] or(l1, h1)\n"
    "  y1 = u32[16] xor(a1, o1)\n"
    "  r1s = u32[1] slice(ra), slice={[1:2]}  r1 = u32[] reshape(r1s)\n"
    "  r1b = u32[16] broadcast(r1), dimensions={}  r1c = u32[] subtract(thirty2, r1)\n"
    "  r1cb = u32[16] broadcast(r1c), dimensions={}\n"
    "  a2 = u32[16] add(a1, y1)  l2 = u32[16] shift-left(y1, r1b)\n"
    "  h2 = u32[16] shift-right-logical(y1, r1cb)  o2 = u32[16] or(l2, h2)\n"
    "  y2 = u32[16] xor(a2, o2)\n"
    "  kb = u32[16] broadcast(k), dimensions={}  a3 = u32[16] add(a2, kb)\n"
    "  one = s32[] constant(1)  i2 = s32[] add(i, one)  iu = u32[] convert(i2)\n"
    "  ib = u32[16] broadcast(iu), dimensions={}  y3 = u32[16] add(y2, ib)\n"
    "  ROOT t = (s32[], u32[16], u32[16], u32[2], u32[2], u32[]) tuple(i2, a3, y3, rb, ra, k) }\n"
    "ENTRY main { x = u32[16] parameter(0)  k = u32[] parameter(1)\n"
    "  z = s32[] constant(0)  y = u32[16] iota(), iota_dimension=0\n"
    "  ra = u32[2] constant({13, 15})  rb = u32[2] constant({26, 6})\n"
    "  init = (s32[], u32[16], u32[16], u32[2], u32[2], u32[]) tuple(z, x, y, ra, rb, k)\n"
    "  l = (s32[], u32[16], u32[16], u32[2], u32[2], u32[]) while(init), condition=cond, "
    "body=body\n"
    "  p = u32[16] get-tuple-element(l), index=1  q = u32[16] get-tuple-element(l), index=2\n"
    "  w = u32[16] xor(p, q)  nine = u32[] constant(9)  nb = u32[16] broadcast(nine), "
    "dimensions={}\n"
    "  m = u32[16] shift-right-logical(w, nb)  e = u32[] constant(1065353216)\n"
    "  eb = u32[16] broadcast(e), dimensions={}  bits = u32[16] or(m, eb)\n"
    "  f = f32[16] bitcast-convert(bits)\n"
    "  ROOT r = (u32[16], u32[16], f32[16]) tuple(p, q, f) }\n",
};
#define NOWN (sizeof own_modules / sizeof own_modules[0])

START_TEST(test_own) {
  char why[1200], what[64];
  snprintf(what, sizeof what, "own module %d", _i);
  bool ran = check_module(own_modules[_i], strlen(own_modules[_i]), what, 77 + (uint64_t)_i, why,
                          sizeof why);
  ck_assert_msg(ran, "%s: %.300s", what, why);
}
END_TEST

/* ---- generated modules -------------------------------------------------- */

/* Seeds per loop iteration: 25, or KILN_PASSES_DIFF_SEEDS for a longer
 * hunt (the seed range then starts at KILN_PASSES_DIFF_FIRST). */
static int seeds_per_iter(void) {
  const char *e = getenv("KILN_PASSES_DIFF_SEEDS");
  return e && atoi(e) > 0 ? atoi(e) : 25;
}

START_TEST(test_progen) {
  int per = seeds_per_iter();
  const char *first = getenv("KILN_PASSES_DIFF_FIRST");
  uint64_t base = first ? strtoull(first, NULL, 10) : 0;
  for (int k = 0; k < per; k++) {
    uint64_t seed = base + (uint64_t)_i * (uint64_t)per + (uint64_t)k + 1;
    kiln_progen_options o = {0};
    o.seed = seed;
    o.ninstrs = 8 + (int)(seed % 23);
    o.nparams = 1 + (int)(seed % 3);
    o.dtype = seed % 3 == 2 ? KILN_F64 : KILN_F32;
    char *text = kiln_progen_text(&o);
    ck_assert_ptr_nonnull(text);
    char why[1200], what[64];
    snprintf(what, sizeof what, "progen seed %llu", (unsigned long long)seed);
    bool ran = check_module(text, strlen(text), what, seed, why, sizeof why);
    if (!ran) fprintf(stderr, "---- %s ----\n%s", what, text);
    ck_assert_msg(ran, "%s: %.300s", what, why);
    kiln_free(text);
  }
}
END_TEST

/* ---- scale -------------------------------------------------------------- */

/* A module of about n instructions that gives every pass work: identities,
 * duplicates, constant chains, and a loop with n/8 invariant values. */
static char *big_module(int n) {
  kiln_sbuf b = KILN_SBUF_INIT;
  int nl = n / 8;
  kiln_sbuf_printf(&b, "HloModule big\ncond { s = (s32[], f32[4], f32[4]) parameter(0)\n"
                       "  i = s32[] get-tuple-element(s), index=0  k = s32[] constant(3)\n"
                       "  ROOT lt = pred[] compare(i, k), direction=LT }\n"
                       "body { s = (s32[], f32[4], f32[4]) parameter(0)\n"
                       "  i = s32[] get-tuple-element(s), index=0\n"
                       "  a0 = f32[4] get-tuple-element(s), index=1\n"
                       "  w = f32[4] get-tuple-element(s), index=2\n");
  for (int i = 0; i < nl; i++)
    kiln_sbuf_printf(&b, "  e%d = f32[4] %s(%s)  a%d = f32[4] add(a%d, e%d)\n", i,
                     i % 2 ? "sine" : "cosine", i % 3 ? "w" : "a0", i + 1, i, i);
  kiln_sbuf_printf(&b,
                   "  one = s32[] constant(1)  i2 = s32[] add(i, one)\n"
                   "  ROOT t = (s32[], f32[4], f32[4]) tuple(i2, a%d, w) }\n"
                   "ENTRY main { p = f32[4] parameter(0)\n"
                   "  nz = f32[] constant(-0)  zb = f32[4] broadcast(nz), dimensions={}\n"
                   "  c0 = f32[4] constant({1, 2, 3, 4})\n  v0 = f32[4] add(p, zb)\n",
                   nl);
  int nc = n / 4, ne = n / 2;
  for (int i = 0; i < nc; i++)
    kiln_sbuf_printf(&b, "  c%d = f32[4] multiply(c%d, c%d)\n", i + 1, i, i);
  for (int i = 0; i < ne / 4; i++)
    kiln_sbuf_printf(&b,
                     "  x%d = f32[4] negate(v%d)  y%d = f32[4] negate(v%d)\n"
                     "  s%d = f32[4] add(x%d, zb)  v%d = f32[4] multiply(s%d, y%d)\n",
                     i, i, i, i, i, i, i + 1, i, i);
  kiln_sbuf_printf(&b,
                   "  z = s32[] constant(0)\n"
                   "  init = (s32[], f32[4], f32[4]) tuple(z, v%d, c%d)\n"
                   "  l = (s32[], f32[4], f32[4]) while(init), condition=cond, body=body\n"
                   "  ROOT r = f32[4] get-tuple-element(l), index=1 }\n",
                   ne / 4, nc);
  return kiln_sbuf_detach(&b, NULL);
}

static double time_passes(int n, const char *name) {
  char *text = big_module(n);
  ck_assert_ptr_nonnull(text);
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "big", NULL, &m, &st) == 0, "%s",
                st.msg);
  const kiln_pass *p = kiln_pipeline_find(name);
  kiln_pass_ctx ctx = {kiln_target_default(), NULL, &st, 2, 0, NULL};
  double t0 = now();
  ck_assert_int_eq(p->run(m, &ctx), 0);
  double t = now() - t0;
  ck_assert_int_eq(kiln_module_verify(m, NULL, &st), 0);
  kiln_module_destroy(m);
  kiln_free(text);
  return t;
}

/* Every pass is (close to) linear: 8x the module takes well under 8^2
 * times as long (caches make even linear passes a little superlinear at
 * these sizes, and the bounds leave room for a loaded machine or a
 * sanitizer build). Times are the best of three to damp noise. */
START_TEST(test_scale) {
  static const char *const names[] = {"algsimp", "constfold", "cse", "dce", "while_licm"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    double small = 1e9, large = 1e9;
    for (int r = 0; r < 3; r++) {
      double a = time_passes(4000, names[i]), b = time_passes(32000, names[i]);
      small = a < small ? a : small;
      large = b < large ? b : large;
    }
    fprintf(stderr, "%s: 4000 instrs %.2f ms, 32000 instrs %.2f ms\n", names[i], small * 1e3,
            large * 1e3);
    ck_assert_msg(large < 5.0 && large < 40 * small + 0.1, "%s: %.3f s vs %.3f s", names[i], large,
                  small);
  }
}
END_TEST

/* ---- suite -------------------------------------------------------------- */

static void find_files(void) {
  const char *env = getenv("KILN_CORPUS_DIR");
  snprintf(corpus_dir, sizeof corpus_dir, "%s",
           env && *env ? env : KILN_SOURCE_DIR "/../shared/corpus/xla-hlo");
  add_files(corpus_dir);
  ncorpus = nfiles;
  if (ncorpus == 0) fprintf(stderr, "corpus not found at %s: corpus modules skipped\n", corpus_dir);
  static const char *const dirs[] = {"algsimp",    "constfold", "cse",
                                     "while_licm", "unroll",    "scatter_merge"};
  for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/golden/passes/%s", KILN_SOURCE_DIR, dirs[d]);
    add_files(dir);
  }
}

int main(void) {
  find_files();
  Suite *s = suite_create("passes_diff");
  TCase *tf = tcase_create("files");
  tcase_set_timeout(tf, 240);
  tcase_add_loop_test(tf, test_file, 0, nfiles);
  tcase_add_test(tf, test_golden_inputs_run);
  suite_add_tcase(s, tf);
  TCase *to = tcase_create("own");
  tcase_set_timeout(to, 60);
  tcase_add_loop_test(to, test_own, 0, (int)NOWN);
  suite_add_tcase(s, to);
  TCase *tp = tcase_create("progen");
  tcase_set_timeout(tp, 240);
  tcase_add_loop_test(tp, test_progen, 0, 8);
  suite_add_tcase(s, tp);
  TCase *tz = tcase_create("scale");
  tcase_set_timeout(tz, 240);
  tcase_add_test(tz, test_scale);
  suite_add_tcase(s, tz);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  for (int i = 0; i < nfiles; i++) free(files[i]);
  free(files);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
