/* End-to-end tests of the cpu backend against the reference interpreter.
 *
 * Each module is compiled (kiln_compile), run on a cpu device and run by
 * the interpreter on the same generated arguments; the results must agree:
 * bit for bit for integers and predicates, within a small tolerance for
 * floats (BLAS and the C compiler may associate sums differently). Inline
 * modules cover elementwise chains, shape ops, dot, reduce, while,
 * conditional, call and tuples; the corpus case runs every corpus module
 * the cpu target compiles (KILN_CORPUS_DIR, skipped when absent). */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "executor/backend.h"
#include "executor/run.h"

static kiln_status st;

static kiln_module *parse(const char *text, size_t len, const char *name) {
  kiln_module *m = NULL;
  kiln_status_clear(&st);
  if (kiln_module_parse_text(text, len, name, NULL, &m, &st) != 0) return NULL;
  return m;
}

/* ---- arguments ---------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
  *s = *s * 6364136223846793005u + 1442695040888963407u;
  return *s >> 33;
}

/* Values every element type holds exactly: floats in [-2, 2] by 1/8, small
 * integers, random predicates. */
static void fill(kiln_literal *l, uint64_t *seed) {
  if (l->shape.dtype == KILN_TUPLE) {
    for (uint32_t i = 0; i < l->shape.rank; i++) fill(l->elems[i], seed);
    return;
  }
  if (!kiln_dtype_is_array(l->shape.dtype)) return;
  int64_t n = kiln_literal_elements(l);
  kiln_dtype t = l->shape.dtype;
  for (int64_t i = 0; i < n; i++) {
    uint64_t r = rng_next(seed);
    if (t == KILN_PRED)
      kiln_literal_set_u64(l, i, r & 1);
    else if (kiln_dtype_is_float(t))
      kiln_literal_set_f64(l, i, (double)((int64_t)(r % 33) - 16) / 8.0);
    else if (kiln_dtype_is_unsigned_int(t))
      kiln_literal_set_u64(l, i, r % 11);
    else if (kiln_dtype_is_signed_int(t))
      kiln_literal_set_s64(l, i, (int64_t)(r % 11) - 5);
    else if (kiln_dtype_is_complex(t))
      kiln_literal_set_c128(l, i, (double)(r % 9) - 4, (double)(r / 9 % 9) - 4);
  }
}

/* One argument per entry parameter; false when one cannot be made. */
static bool make_args(const kiln_module *m, uint64_t seed, kiln_literal **args, uint32_t *n) {
  const kiln_computation *e = kiln_module_entry(m);
  *n = kiln_computation_nparams(m, e);
  if (*n > 16) return false;
  for (uint32_t i = 0; i < *n; i++) {
    const kiln_instr *p = kiln_computation_param(m, e, i);
    args[i] = NULL;
    if (p == NULL || kiln_shape_is_dynamic(&p->shape) ||
        kiln_literal_create(NULL, &p->shape, 64u << 20, &args[i], &st) != 0) {
      for (uint32_t j = 0; j <= i; j++) kiln_literal_destroy(args[j]);
      return false;
    }
    fill(args[i], &seed);
  }
  return true;
}

/* ---- comparing ---------------------------------------------------------- */

static double tolerance(kiln_dtype t) {
  switch (t) {
  case KILN_F64: return 1e-10;
  case KILN_F32: return 2e-5;
  case KILN_F16: return 2e-3;
  case KILN_BF16: return 1.6e-2;
  default: return 0.13; /* f8 types */
  }
}

/* Empty when equal, else a description of the first difference. */
static void compare(const kiln_literal *want, const kiln_literal *got, const char *path,
                    kiln_sbuf *why) {
  if (!kiln_shape_equal(&want->shape, &got->shape, false)) {
    kiln_sbuf_printf(why, "%s: shapes differ", path);
    return;
  }
  if (want->shape.dtype == KILN_TUPLE) {
    for (uint32_t i = 0; i < want->shape.rank && kiln_sbuf_str(why)[0] == '\0'; i++) {
      char sub[64];
      snprintf(sub, sizeof sub, "%s{%u}", path, i);
      compare(want->elems[i], got->elems[i], sub, why);
    }
    return;
  }
  kiln_dtype t = want->shape.dtype;
  if (!kiln_dtype_is_array(t)) return;
  int64_t n = kiln_literal_elements(want);
  for (int64_t i = 0; i < n; i++) {
    if (kiln_dtype_is_float(t)) {
      double a = kiln_literal_get_f64(want, i), b = kiln_literal_get_f64(got, i);
      if (isnan(a) && isnan(b)) continue;
      if (a == b) continue;
      if (!isinf(a) && !isinf(b) && fabs(a - b) <= tolerance(t) * (1 + fabs(a))) continue;
      kiln_sbuf_printf(why, "%s[%lld]: interp %.9g, cpu %.9g", path, (long long)i, a, b);
      return;
    }
    if (kiln_dtype_is_complex(t)) {
      double ar, ai, br, bi;
      kiln_literal_get_c128(want, i, &ar, &ai);
      kiln_literal_get_c128(got, i, &br, &bi);
      double tol = (t == KILN_C64 ? 2e-5 : 1e-10) * (1 + fabs(ar) + fabs(ai));
      if ((fabs(ar - br) <= tol || (isnan(ar) && isnan(br))) &&
          (fabs(ai - bi) <= tol || (isnan(ai) && isnan(bi))))
        continue;
      kiln_sbuf_printf(why, "%s[%lld]: interp (%g, %g), cpu (%g, %g)", path, (long long)i, ar, ai,
                       br, bi);
      return;
    }
    if (kiln_literal_get_u64(want, i) != kiln_literal_get_u64(got, i)) {
      kiln_sbuf_printf(why, "%s[%lld]: interp %lld, cpu %lld", path, (long long)i,
                       (long long)kiln_literal_get_s64(want, i),
                       (long long)kiln_literal_get_s64(got, i));
      return;
    }
  }
}

typedef enum outcome {
  SAME,
  DIFFERENT,
  CPU_UNSUPPORTED, /* the cpu target refuses an op or type (KILN_EUNIMPL) */
  COMPILE_FAILED,  /* kiln_compile failed otherwise */
  RUN_FAILED,      /* compiled, but loading or running failed */
  ORACLE_FAILED,   /* the interpreter cannot run it: nothing to compare */
} outcome;

/* Runs m on both backends with arguments from `seed`; *why says what
 * differed or failed. */
static outcome run_both(const kiln_module *m, uint64_t seed, kiln_sbuf *why) {
  kiln_literal *args[16];
  uint32_t n;
  if (!make_args(m, seed, args, &n)) {
    kiln_sbuf_printf(why, "no arguments");
    return ORACLE_FAILED;
  }
  kiln_literal *want = NULL, *got = NULL;
  kiln_run_options ro = {.max_while_iterations = 1000000, .timeout_seconds = 30};
  outcome o;
  kiln_status_clear(&st);
  if (kiln_run_module_with(m, "interp", NULL, NULL, &ro, (const kiln_literal *const *)args, n,
                           &want, &st) != 0) {
    kiln_sbuf_printf(why, "interp: %s: %s", st.where, st.msg);
    o = ORACLE_FAILED;
    goto out;
  }
  kiln_status_clear(&st);
  kiln_executable *e = NULL;
  int rc = kiln_compile(m, NULL, &e, NULL, &st);
  if (rc) {
    kiln_sbuf_printf(why, "compile: %s: %s: %.300s", kiln_err_name(rc), st.where, st.msg);
    o = rc == KILN_EUNIMPL ? CPU_UNSUPPORTED : COMPILE_FAILED;
    goto out;
  }
  rc = kiln_run_executable(e, NULL, &ro, (const kiln_literal *const *)args, n, &got, &st);
  kiln_executable_destroy(e);
  if (rc) {
    kiln_sbuf_printf(why, "cpu run: %s: %s: %.300s", kiln_err_name(rc), st.where, st.msg);
    o = RUN_FAILED;
    goto out;
  }
  compare(want, got, "result", why);
  o = kiln_sbuf_str(why)[0] ? DIFFERENT : SAME;
out:
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  for (uint32_t i = 0; i < n; i++) kiln_literal_destroy(args[i]);
  return o;
}

/* The module must run on cpu and agree with interp for three seeds. */
static void agree(const char *text) {
  kiln_module *m = parse(text, strlen(text), "t.hlo");
  ck_assert_msg(m != NULL, "parse: %s: %s", st.where, st.msg);
  for (uint64_t seed = 1; seed <= 3; seed++) {
    kiln_sbuf why = KILN_SBUF_INIT;
    outcome o = run_both(m, seed, &why);
    ck_assert_msg(o == SAME, "seed %llu: %s\n%s", (unsigned long long)seed, kiln_sbuf_str(&why),
                  text);
    kiln_sbuf_free(&why);
  }
  kiln_module_destroy(m);
}

/* ---- inline modules ------------------------------------------------------ */

START_TEST(test_elementwise_chains) {
  agree("HloModule m\nENTRY e {\n  a = f32[64,33] parameter(0)\n  b = f32[64,33] parameter(1)\n"
        "  c = f32[64,33] multiply(a, b)\n  d = f32[64,33] subtract(c, a)\n"
        "  e = f32[64,33] exponential(d)\n  f = f32[64,33] tanh(e)\n"
        "  ROOT g = f32[64,33] maximum(f, b)\n}\n");
  agree("HloModule m\nENTRY e {\n  a = s32[1000] parameter(0)\n  b = s32[1000] parameter(1)\n"
        "  c = s32[1000] multiply(a, b)\n  d = s32[1000] divide(c, b)\n"
        "  e = s32[1000] remainder(a, b)\n  f = s32[1000] add(d, e)\n"
        "  ROOT g = s32[1000] shift-left(f, b)\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f64[17] parameter(0)\n  b = f64[17] parameter(1)\n"
        "  p = pred[17] compare(a, b), direction=LT\n  s = f64[17] select(p, a, b)\n"
        "  c = f32[17] convert(s)\n  h = bf16[17] convert(c)\n  ROOT r = f32[17] convert(h)\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f16[300] parameter(0)\n  b = f16[300] parameter(1)\n"
        "  c = f16[300] add(a, b)\n  ROOT d = f16[300] multiply(c, a)\n}\n");
  agree("HloModule m\nENTRY e {\n  a = u8[50] parameter(0)\n  b = u8[50] parameter(1)\n"
        "  c = u8[50] subtract(a, b)\n  ROOT d = u8[50] xor(c, b)\n}\n");
}
END_TEST

START_TEST(test_shape_ops) {
  agree("HloModule m\nENTRY e {\n  a = f32[4,6] parameter(0)\n"
        "  t = f32[6,4] transpose(a), dimensions={1,0}\n  r = f32[3,8] reshape(t)\n"
        "  b = f32[2,3,8] broadcast(r), dimensions={1,2}\n"
        "  s = f32[2,2,4] slice(b), slice={[0:2], [1:3], [2:6]}\n"
        "  ROOT c = f32[2,2,12] concatenate(s, s, s), dimensions={2}\n}\n");
  agree("HloModule m\nENTRY e {\n  a = s32[3,5] parameter(0)\n  z = s32[] constant(7)\n"
        "  p = s32[5,14] pad(a, z), padding=1_1x2_3_1\n  r = s32[5,14] reverse(p), dimensions={0}\n"
        "  i = s32[5,14] iota(), iota_dimension=1\n  ROOT o = s32[5,14] add(r, i)\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f32[8,8] parameter(0)\n  i = s32[] parameter(1)\n"
        "  j = s32[] parameter(2)\n  ROOT d = f32[3,4] dynamic-slice(a, i, j), "
        "dynamic_slice_sizes={3,4}\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f32[8,8] parameter(0)\n  u = f32[2,3] parameter(1)\n"
        "  i = s32[] parameter(2)\n  ROOT d = f32[8,8] dynamic-update-slice(a, u, i, i)\n}\n");
  /* In place (the operand is a temporary that dies there): updates with rows
   * of 8 or more are copied a row at a time, row- and column-major, the
   * update's layout differing from the result's, start indices clamped (the
   * s32 arguments are in [-5, 5]). */
  agree("HloModule m\nENTRY e {\n  a = f32[12,40] parameter(0)\n  b = f32[12,40] add(a, a)\n"
        "  u = f32[3,24] parameter(1)\n  i = s32[] parameter(2)\n  j = s32[] parameter(3)\n"
        "  ROOT d = f32[12,40] dynamic-update-slice(b, u, i, j)\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f32[12,40]{0,1} parameter(0)\n"
        "  b = f32[12,40]{0,1} add(a, a)\n  u = f32[10,3]{0,1} parameter(1)\n"
        "  i = s32[] parameter(2)\n  j = s32[] parameter(3)\n"
        "  ROOT d = f32[12,40]{0,1} dynamic-update-slice(b, u, i, j)\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f32[12,40]{0,1} parameter(0)\n"
        "  b = f32[12,40]{0,1} add(a, a)\n  u = f32[10,9]{1,0} parameter(1)\n"
        "  i = s32[] parameter(2)\n  j = s32[] parameter(3)\n"
        "  ROOT d = f32[12,40]{0,1} dynamic-update-slice(b, u, i, j)\n}\n");
  agree("HloModule m\nENTRY e {\n  a = s32[2,5,9] parameter(0)\n  b = s32[2,5,9] add(a, a)\n"
        "  u = s32[2,2,9] parameter(1)\n  i = s32[] parameter(2)\n"
        "  ROOT d = s32[2,5,9] dynamic-update-slice(b, u, i, i, i)\n}\n");
}
END_TEST

/* dynamic-slice and in-place dynamic-update-slice between buffers of one
 * layout are copies of contiguous runs (kiln__kernel_window_copy): runs of
 * whole minor dims, several runs per window, runs longer than one
 * iteration's piece (2 x 16384 and 16384 + 3616 elements), column-major,
 * start indices of s32, u64 and s8 (clamped: the integer arguments are in
 * [-5, 5] or [0, 10]), one start vector, bf16 and pred bits, an update of
 * a parameter (copied first) and of a temporary (in place). */
START_TEST(test_window_copy) {
  agree("HloModule m\nENTRY e {\n  a = f32[7,5,16] parameter(0)\n  i = s32[] parameter(1)\n"
        "  j = s32[] parameter(2)\n  ROOT d = f32[2,5,16] dynamic-slice(a, i, j, j), "
        "dynamic_slice_sizes={2,5,16}\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f32[16,5,9]{0,1,2} parameter(0)\n  i = s32[] parameter(1)\n"
        "  ROOT d = f32[16,5,3]{0,1,2} dynamic-slice(a, i, i, i), "
        "dynamic_slice_sizes={16,5,3}\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f32[3,4,40] parameter(0)\n  i = u64[] parameter(1)\n"
        "  j = u64[] parameter(2)\n  ROOT d = f32[2,3,24] dynamic-slice(a, i, j, j), "
        "dynamic_slice_sizes={2,3,24}\n}\n");
  agree("HloModule m\nENTRY e {\n  a = bf16[3,128,256] parameter(0)\n  i = s8[] parameter(1)\n"
        "  z = s8[] constant(0)\n  ROOT d = bf16[1,128,256] dynamic-slice(a, i, z, z), "
        "dynamic_slice_sizes={1,128,256}\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f32[3,100,200] parameter(0)\n  i = s32[] parameter(1)\n"
        "  ROOT d = f32[1,100,200] dynamic-slice(a, i, i, i), "
        "dynamic_slice_sizes={1,100,200}\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f32[6,4,32] parameter(0)\n  v = s32[3] parameter(1)\n"
        "  ROOT d = f32[2,4,16] dynamic-slice(a, v), dynamic_slice_sizes={2,4,16}\n}\n");
  agree(
      "HloModule m\nENTRY e {\n  a = f32[6,4,32] parameter(0)\n  u = f32[2,4,32] parameter(1)\n"
      "  i = s32[] parameter(2)\n  ROOT d = f32[6,4,32] dynamic-update-slice(a, u, i, i, i)\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f32[6,4,32] parameter(0)\n  b = f32[6,4,32] add(a, a)\n"
        "  u = f32[2,3,20] parameter(1)\n  i = s32[] parameter(2)\n  j = s32[] parameter(3)\n"
        "  ROOT d = f32[6,4,32] dynamic-update-slice(b, u, i, j, j)\n}\n");
  agree("HloModule m\nENTRY e {\n  a = pred[5,3,64] parameter(0)\n  b = pred[5,3,64] not(a)\n"
        "  u = pred[1,3,64] parameter(1)\n  i = u64[] parameter(2)\n"
        "  ROOT d = pred[5,3,64] dynamic-update-slice(b, u, i, i, i)\n}\n");
}
END_TEST

/* A fori_loop of Horner's rule over 16 coefficients whose body calls its
 * step (unrolled, one kernel reading 16 one-element inputs, hoisted out of
 * its loop), and loops of 40 trips (not unrolled) writing a transposed or
 * computed update into their state in place (the update's producers fused
 * into the update), one whose update reads the state itself. */
static const char *const loop_state_fmt =
    "HloModule m\n"
    "body {\n  s = (s32[], f32[40,50,40], f32[40,50]) parameter(0)\n"
    "  i = s32[] get-tuple-element(s), index=0\n"
    "  ys = f32[40,50,40] get-tuple-element(s), index=1\n"
    "  h = f32[40,50] get-tuple-element(s), index=2\n  z = s32[] constant(0)\n"
    "  %s\n"
    "  ys2 = f32[40,50,40] dynamic-update-slice(ys, u, i, z, z)\n"
    "  h2 = f32[40,50] negate(h)\n  one = s32[] constant(1)\n  i2 = s32[] add(i, one)\n"
    "  ROOT t = (s32[], f32[40,50,40], f32[40,50]) tuple(i2, ys2, h2)\n}\n"
    "cond {\n  s = (s32[], f32[40,50,40], f32[40,50]) parameter(0)\n"
    "  i = s32[] get-tuple-element(s), index=0\n  n = s32[] constant(40)\n"
    "  ROOT lt = pred[] compare(i, n), direction=LT\n}\n"
    "ENTRY e {\n  h = f32[40,50] parameter(0)\n  y0 = f32[40,50,40] parameter(1)\n"
    "  ys = f32[40,50,40] add(y0, y0)\n  z = s32[] constant(0)\n"
    "  init = (s32[], f32[40,50,40], f32[40,50]) tuple(z, ys, h)\n"
    "  w = (s32[], f32[40,50,40], f32[40,50]) while(init), condition=cond, body=body\n"
    "  ROOT r = f32[40,50,40] get-tuple-element(w), index=1\n}\n";

START_TEST(test_loop_bodies) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b,
                   "HloModule m\n"
                   "step {\n  x = f32[1000] parameter(0)\n  c = f32[16] parameter(1)\n"
                   "  i = s32[] parameter(2)\n  y = f32[1000] parameter(3)\n"
                   "  one = s32[] constant(1)\n  i2 = s32[] add(i, one)\n"
                   "  m = f32[1000] multiply(y, x)\n"
                   "  d = f32[1] dynamic-slice(c, i), dynamic_slice_sizes={1}\n"
                   "  q = f32[] reshape(d)\n  bq = f32[1000] broadcast(q), dimensions={}\n"
                   "  a = f32[1000] add(m, bq)\n  ROOT t = (s32[], f32[1000]) tuple(i2, a)\n}\n"
                   "cond {\n  s = (s32[], s32[], f32[1000], f32[1000], f32[16]) parameter(0)\n"
                   "  i = s32[] get-tuple-element(s), index=0\n  n = s32[] constant(16)\n"
                   "  ROOT lt = pred[] compare(i, n), direction=LT\n}\n"
                   "body {\n  s = (s32[], s32[], f32[1000], f32[1000], f32[16]) parameter(0)\n"
                   "  i = s32[] get-tuple-element(s), index=0\n"
                   "  j = s32[] get-tuple-element(s), index=1\n"
                   "  y = f32[1000] get-tuple-element(s), index=2\n"
                   "  x = f32[1000] get-tuple-element(s), index=3\n"
                   "  c = f32[16] get-tuple-element(s), index=4\n"
                   "  r = (s32[], f32[1000]) call(x, c, j, y), to_apply=step\n"
                   "  j2 = s32[] get-tuple-element(r), index=0\n"
                   "  y2 = f32[1000] get-tuple-element(r), index=1\n"
                   "  one = s32[] constant(1)\n  i2 = s32[] add(i, one)\n"
                   "  ROOT t = (s32[], s32[], f32[1000], f32[1000], f32[16]) tuple(i2, j2, y2, x, "
                   "c)\n}\n"
                   "ENTRY e {\n  x = f32[1000] parameter(0)\n  c = f32[16] parameter(1)\n"
                   "  z = s32[] constant(0)\n  zf = f32[] constant(0)\n"
                   "  y = f32[1000] broadcast(zf), dimensions={}\n"
                   "  init = (s32[], s32[], f32[1000], f32[1000], f32[16]) tuple(z, z, y, x, c)\n"
                   "  w = (s32[], s32[], f32[1000], f32[1000], f32[16]) while(init), "
                   "condition=cond, body=body\n"
                   "  ROOT r = f32[1000] get-tuple-element(w), index=2\n}\n");
  agree(kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  static const char *const updates[] = {
      /* a transposing reshape: one fused kernel, written in place */
      "ht = f32[50,40] transpose(h), dimensions={1,0}\n  u = f32[1,50,40] reshape(ht)",
      /* computed: tanh of the transpose plus one */
      "ht = f32[50,40] transpose(h), dimensions={1,0}\n  th = f32[50,40] tanh(ht)\n"
      "  k = f32[] constant(1)\n  kb = f32[50,40] broadcast(k), dimensions={}\n"
      "  a = f32[50,40] add(th, kb)\n  u = f32[1,50,40] reshape(a)",
      /* the update reads the state it is written into */
      "sl = f32[1,50,40] slice(ys), slice={[2:3], [0:50], [0:40]}\n"
      "  u = f32[1,50,40] negate(sl)",
  };
  for (size_t k = 0; k < sizeof updates / sizeof *updates; k++) {
    kiln_sbuf t = KILN_SBUF_INIT;
    kiln_sbuf_printf(&t, loop_state_fmt, updates[k]);
    agree(kiln_sbuf_str(&t));
    kiln_sbuf_free(&t);
  }
}
END_TEST

START_TEST(test_dot) {
  agree("HloModule m\nENTRY e {\n  a = f32[64,48] parameter(0)\n  b = f32[48,80] parameter(1)\n"
        "  ROOT d = f32[64,80] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f64[5,7] parameter(0)\n  b = f64[9,7] parameter(1)\n"
        "  ROOT d = f64[5,9] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={1}\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f32[3,4,5] parameter(0)\n  b = f32[3,5,6] parameter(1)\n"
        "  ROOT d = f32[3,4,6] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, "
        "lhs_contracting_dims={2}, rhs_contracting_dims={1}\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f32[7,3] parameter(0)\n  b = f32[7] parameter(1)\n"
        "  ROOT d = f32[3] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n}\n");
  agree("HloModule m\nENTRY e {\n  a = s32[4,5] parameter(0)\n  b = s32[5,2] parameter(1)\n"
        "  ROOT d = s32[4,2] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n");
  /* dot feeding elementwise ops */
  agree("HloModule m\nENTRY e {\n  a = f32[32,32] parameter(0)\n  b = f32[32,32] parameter(1)\n"
        "  d = f32[32,32] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
        "  ROOT r = f32[32,32] add(d, a)\n}\n");
}
END_TEST

/* Dots over random dimension numbers: 0-2 batch, contracting and free
 * dims per side in random positions and pairings, random operand and
 * result layouts, each element type the dot canonicalization handles
 * (f32, f64, bf16, f16, bf16 operands with an f32 result) and s32 (left
 * to the loop form). The argument values (multiples of 1/8 in [-2, 2])
 * make every product and partial sum exact in f32, so the results agree
 * within the per-type tolerances above whatever the summation order; bf16
 * and f16 results are rounded once from an exact f32 sum, as the
 * interpreter rounds its exact double sum. */
static void perm_of(uint64_t *s, int64_t *p, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) p[i] = i;
  for (uint32_t i = n; i > 1; i--) {
    uint32_t j = (uint32_t)(rng_next(s) % i);
    int64_t t = p[i - 1];
    p[i - 1] = p[j];
    p[j] = t;
  }
}

static void put_list(kiln_sbuf *b, const char *name, const int64_t *v, uint32_t n) {
  kiln_sbuf_printf(b, ", %s={", name);
  for (uint32_t i = 0; i < n; i++) kiln_sbuf_printf(b, "%s%lld", i ? "," : "", (long long)v[i]);
  kiln_sbuf_puts(b, "}");
}

static void put_shape(kiln_sbuf *b, const char *t, const int64_t *dims, uint32_t n, uint64_t *s,
                      bool layout) {
  kiln_sbuf_printf(b, "%s[", t);
  for (uint32_t i = 0; i < n; i++) kiln_sbuf_printf(b, "%s%lld", i ? "," : "", (long long)dims[i]);
  kiln_sbuf_puts(b, "]");
  if (!layout || n < 2) return;
  int64_t m2m[8];
  perm_of(s, m2m, n);
  kiln_sbuf_puts(b, "{");
  for (uint32_t i = 0; i < n; i++) kiln_sbuf_printf(b, "%s%lld", i ? "," : "", (long long)m2m[i]);
  kiln_sbuf_puts(b, "}");
}

static void random_dot(uint64_t *s, kiln_sbuf *b) {
  static const char *const types[][2] = {{"f32", "f32"}, {"f64", "f64"},  {"bf16", "bf16"},
                                         {"f16", "f16"}, {"bf16", "f32"}, {"s32", "s32"}};
  uint32_t ty = (uint32_t)(rng_next(s) % 6);
  uint32_t nb = rng_next(s) % 3, nc = rng_next(s) % 3, nf[2];
  nf[0] = rng_next(s) % 3;
  nf[1] = rng_next(s) % 3;
  int64_t bs[2], cs[2], pos[2][8], dims[2][8], bd[2][2], cd[2][2], out[8];
  uint32_t rank[2], no = 0;
  for (uint32_t i = 0; i < nb; i++) bs[i] = 1 + (int64_t)(rng_next(s) % 4);
  for (uint32_t i = 0; i < nc; i++) cs[i] = rng_next(s) % 4 ? 1 + (int64_t)(rng_next(s) % 6) : 19;
  for (uint32_t k = 0; k < 2; k++) {
    rank[k] = nb + nc + nf[k];
    perm_of(s, pos[k], rank[k]);
    for (uint32_t i = 0; i < nb; i++) dims[k][pos[k][i]] = bs[i], bd[k][i] = pos[k][i];
    for (uint32_t i = 0; i < nc; i++) dims[k][pos[k][nb + i]] = cs[i], cd[k][i] = pos[k][nb + i];
    for (uint32_t i = nb + nc; i < rank[k]; i++)
      dims[k][pos[k][i]] = 1 + (int64_t)(rng_next(s) % 7);
  }
  for (uint32_t i = 0; i < nb; i++) out[no++] = bs[i];
  for (uint32_t k = 0; k < 2; k++)
    for (uint32_t d = 0; d < rank[k]; d++) {
      bool used = false;
      for (uint32_t i = 0; i < nb + nc; i++) used |= pos[k][i] == d;
      if (!used) out[no++] = dims[k][d];
    }
  kiln_sbuf_puts(b, "HloModule m\nENTRY e {\n  a = ");
  put_shape(b, types[ty][0], dims[0], rank[0], s, rng_next(s) % 2);
  kiln_sbuf_puts(b, " parameter(0)\n  b = ");
  put_shape(b, types[ty][0], dims[1], rank[1], s, rng_next(s) % 2);
  kiln_sbuf_puts(b, " parameter(1)\n  ROOT d = ");
  put_shape(b, types[ty][1], out, no, s, rng_next(s) % 3 == 0);
  kiln_sbuf_puts(b, " dot(a, b)");
  if (nb) put_list(b, "lhs_batch_dims", bd[0], nb);
  if (nb) put_list(b, "rhs_batch_dims", bd[1], nb);
  put_list(b, "lhs_contracting_dims", cd[0], nc);
  put_list(b, "rhs_contracting_dims", cd[1], nc);
  kiln_sbuf_puts(b, "\n}\n");
}

START_TEST(test_dot_random) {
  uint64_t s = 12345;
  for (int i = 0; i < 60; i++) {
    kiln_sbuf text = KILN_SBUF_INIT, why = KILN_SBUF_INIT;
    random_dot(&s, &text);
    kiln_module *m = parse(kiln_sbuf_str(&text), text.len, "t.hlo");
    ck_assert_msg(m != NULL, "parse: %s: %s\n%s", st.where, st.msg, kiln_sbuf_str(&text));
    outcome o = run_both(m, (uint64_t)i + 1, &why);
    ck_assert_msg(o == SAME, "case %d: %s\n%s", i, kiln_sbuf_str(&why), kiln_sbuf_str(&text));
    kiln_module_destroy(m);
    kiln_sbuf_free(&text);
    kiln_sbuf_free(&why);
  }
}
END_TEST

/* Reshapes between random factorizations of a size (with size-1 dims
 * coming and going), random layouts, fused with a broadcast along the
 * result's minor dim and elementwise adds, and a second reshape as the
 * root: the operand index is computed group by group (emit_shape.c), which
 * must agree with the interpreter's whole-index arithmetic. */
static uint32_t random_factoring(uint64_t *s, const int64_t *f, uint32_t nf, int64_t *dims) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < nf; i++) {
    if (n == 0 || rng_next(s) % 2) dims[n++] = 1;
    dims[n - 1] *= f[i];
    if (rng_next(s) % 5 == 0) dims[n++] = 1;
  }
  return n;
}

START_TEST(test_reshape_random) {
  uint64_t s = 777;
  for (int i = 0; i < 40; i++) {
    int64_t f[6], a[16], b[16], c[16];
    uint32_t nf = 1 + (uint32_t)(rng_next(&s) % 6);
    for (uint32_t k = 0; k < nf; k++) f[k] = 1 + (int64_t)(rng_next(&s) % 5);
    uint32_t na = random_factoring(&s, f, nf, a), nb = random_factoring(&s, f, nf, b);
    uint32_t nc = random_factoring(&s, f, nf, c);
    kiln_sbuf t = KILN_SBUF_INIT, why = KILN_SBUF_INIT;
    kiln_sbuf_puts(&t, "HloModule m\nENTRY e {\n  a = ");
    put_shape(&t, "f32", a, na, &s, rng_next(&s) % 2);
    kiln_sbuf_puts(&t, " parameter(0)\n  y = ");
    put_shape(&t, "f32", b, nb, &s, rng_next(&s) % 2);
    kiln_sbuf_printf(&t,
                     " parameter(1)\n  v = f32[%lld] parameter(2)\n  r = ", (long long)b[nb - 1]);
    put_shape(&t, "f32", b, nb, &s, false);
    kiln_sbuf_puts(&t, " reshape(a)\n  w = ");
    put_shape(&t, "f32", b, nb, &s, false);
    kiln_sbuf_printf(&t, " broadcast(v), dimensions={%u}\n  x = ", nb - 1);
    put_shape(&t, "f32", b, nb, &s, false);
    kiln_sbuf_puts(&t, " add(r, y)\n  z = ");
    put_shape(&t, "f32", b, nb, &s, false);
    kiln_sbuf_puts(&t, " add(x, w)\n  ROOT o = ");
    put_shape(&t, "f32", c, nc, &s, rng_next(&s) % 2);
    kiln_sbuf_puts(&t, " reshape(z)\n}\n");
    kiln_module *m = parse(kiln_sbuf_str(&t), t.len, "t.hlo");
    ck_assert_msg(m != NULL, "parse: %s: %s\n%s", st.where, st.msg, kiln_sbuf_str(&t));
    outcome o = run_both(m, (uint64_t)i + 1, &why);
    ck_assert_msg(o == SAME, "case %d: %s\n%s", i, kiln_sbuf_str(&why), kiln_sbuf_str(&t));
    kiln_module_destroy(m);
    kiln_sbuf_free(&t);
    kiln_sbuf_free(&why);
  }
}
END_TEST

/* A cpu run flushes denormal results to zero, as XLA's CPU backend does,
 * and leaves the calling thread's floating-point state as it found it. */
START_TEST(test_denormals_flushed) {
  const char *text = "HloModule m\nENTRY e {\n  a = f32[64] parameter(0)\n"
                     "  b = f32[64] parameter(1)\n  ROOT c = f32[64] multiply(a, b)\n}\n";
  kiln_module *m = parse(text, strlen(text), "t.hlo");
  ck_assert_ptr_nonnull(m);
  kiln_literal *args[2] = {NULL, NULL}, *out = NULL;
  const kiln_computation *e = kiln_module_entry(m);
  for (uint32_t k = 0; k < 2; k++) {
    ck_assert_int_eq(
        kiln_literal_create(NULL, &kiln_computation_param(m, e, k)->shape, 0, &args[k], &st), 0);
    for (int64_t i = 0; i < 64; i++) kiln_literal_set_f64(args[k], i, k ? 1e-10 : 1e-30);
  }
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_run_module(m, "cpu", NULL, (const kiln_literal *const *)args, 2, &out, &st),
                   0);
  for (int64_t i = 0; i < 64; i++) ck_assert(kiln_literal_get_f64(out, i) == 0.0);
  volatile float x = 1e-30f, y = 1e-10f;
  ck_assert(x * y != 0.0f); /* this thread still computes denormals */
  kiln_literal_destroy(out);
  for (int k = 0; k < 2; k++) kiln_literal_destroy(args[k]);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_reduce) {
  static const char add[] = "add {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n"
                            "  ROOT s = f32[] add(x, y)\n}\n";
  char text[1024];
  snprintf(text, sizeof text,
           "HloModule m\n%sENTRY e {\n  a = f32[40,50] parameter(0)\n  z = f32[] constant(0)\n"
           "  ROOT r = f32[50] reduce(a, z), dimensions={0}, to_apply=add\n}\n",
           add);
  agree(text);
  snprintf(text, sizeof text,
           "HloModule m\n%sENTRY e {\n  a = f32[40,50] parameter(0)\n  z = f32[] constant(0)\n"
           "  ROOT r = f32[] reduce(a, z), dimensions={0,1}, to_apply=add\n}\n",
           add);
  agree(text);
  agree("HloModule m\nmax {\n  x = s32[] parameter(0)\n  y = s32[] parameter(1)\n"
        "  ROOT s = s32[] maximum(x, y)\n}\nENTRY e {\n  a = s32[6,7,8] parameter(0)\n"
        "  z = s32[] constant(-100)\n"
        "  ROOT r = s32[6,8] reduce(a, z), dimensions={1}, to_apply=max\n}\n");
  /* Reductions over the physically major dims run in the row form
   * (accumulating into the output a row at a time): a fused input, two
   * reduced dims, a column-major input, a range the pool splits. */
  snprintf(text, sizeof text,
           "HloModule m\n%sENTRY e {\n  a = f32[30,7,1100] parameter(0)\n"
           "  b = f32[30,7,1100] parameter(1)\n  m = f32[30,7,1100] multiply(a, b)\n"
           "  z = f32[] constant(0.5)\n"
           "  ROOT r = f32[1100] reduce(m, z), dimensions={0,1}, to_apply=add\n}\n",
           add);
  agree(text);
  snprintf(text, sizeof text,
           "HloModule m\n%sENTRY e {\n  a = f32[40,50]{0,1} parameter(0)\n  z = f32[] constant(0)\n"
           "  ROOT r = f32[40] reduce(a, z), dimensions={1}, to_apply=add\n}\n",
           add);
  agree(text);
  /* Two reduces over the same major dims in one kernel (a layernorm's
   * bias and scale gradients): the row form accumulates both. */
  snprintf(text, sizeof text,
           "HloModule m\n%sENTRY e {\n  a = f32[6,9,70] parameter(0)\n"
           "  b = f32[6,9,70] parameter(1)\n  c = f32[6,9,70] add(a, b)\n"
           "  d = f32[6,9,70] multiply(c, a)\n  z = f32[] constant(0)\n"
           "  r = f32[70] reduce(c, z), dimensions={0,1}, to_apply=add\n"
           "  s = f32[70] reduce(d, z), dimensions={0,1}, to_apply=add\n"
           "  ROOT t = (f32[70], f32[70]) tuple(r, s)\n}\n",
           add);
  agree(text);
  agree("HloModule m\nmax {\n  x = s32[] parameter(0)\n  y = s32[] parameter(1)\n"
        "  ROOT s = s32[] maximum(x, y)\n}\nENTRY e {\n  a = s32[9,4,33] parameter(0)\n"
        "  z = s32[] constant(-100)\n"
        "  ROOT r = s32[4,33] reduce(a, z), dimensions={0}, to_apply=max\n}\n");
  /* A reduce over major dims of a transpose (vmapped per-example
   * gradients summed over the batch): on cpu the row form accumulates on
   * the stack in the input's order, a few rows at a time (600 long: 6 of
   * them, 9 blocks over 50 rows), and stores each where the output's
   * layout puts it; a fused scale per reduced position; two outputs. */
  snprintf(text, sizeof text,
           "HloModule m\n%sENTRY e {\n  a = f32[5,600,50]{1,2,0} parameter(0)\n"
           "  s = f32[5] parameter(1)\n  b = f32[5,600,50]{1,2,0} broadcast(s), dimensions={0}\n"
           "  m = f32[5,600,50]{1,2,0} multiply(a, b)\n  z = f32[] constant(0.25)\n"
           "  ROOT r = f32[600,50]{1,0} reduce(m, z), dimensions={0}, to_apply=add\n}\n",
           add);
  agree(text);
  snprintf(text, sizeof text,
           "HloModule m\n%sENTRY e {\n  a = f32[3,4,24,40]{2,3,1,0} parameter(0)\n"
           "  m = f32[3,4,24,40]{2,3,1,0} multiply(a, a)\n  z = f32[] constant(0)\n"
           "  r = f32[24,40] reduce(a, z), dimensions={0,1}, to_apply=add\n"
           "  s = f32[24,40] reduce(m, z), dimensions={0,1}, to_apply=add\n"
           "  ROOT t = (f32[24,40], f32[24,40]) tuple(r, s)\n}\n",
           add);
  agree(text);
  /* Integer and f64 transposes; rows too long for the stack (5000
   * elements) keep the flat form. */
  agree("HloModule m\nmax {\n  x = s32[] parameter(0)\n  y = s32[] parameter(1)\n"
        "  ROOT s = s32[] maximum(x, y)\n}\nENTRY e {\n  a = s32[7,9,16]{1,2,0} parameter(0)\n"
        "  z = s32[] constant(-100)\n"
        "  ROOT r = s32[9,16]{1,0} reduce(a, z), dimensions={0}, to_apply=max\n}\n");
  agree("HloModule m\nadd {\n  x = f64[] parameter(0)\n  y = f64[] parameter(1)\n"
        "  ROOT s = f64[] add(x, y)\n}\nENTRY e {\n  a = f64[3,5000,2]{1,2,0} parameter(0)\n"
        "  z = f64[] constant(0)\n"
        "  ROOT r = f64[5000,2]{1,0} reduce(a, z), dimensions={0}, to_apply=add\n}\n");
}
END_TEST

START_TEST(test_control_flow) {
  agree(
      "HloModule m\ncond {\n  s = (s32[], f32[8]) parameter(0)\n"
      "  i = s32[] get-tuple-element(s), index=0\n  n = s32[] constant(10)\n"
      "  ROOT p = pred[] compare(i, n), direction=LT\n}\n"
      "body {\n  s = (s32[], f32[8]) parameter(0)\n  i = s32[] get-tuple-element(s), index=0\n"
      "  v = f32[8] get-tuple-element(s), index=1\n  one = s32[] constant(1)\n"
      "  j = s32[] add(i, one)\n  w = f32[8] add(v, v)\n  ROOT t = (s32[], f32[8]) tuple(j, w)\n}\n"
      "ENTRY e {\n  v = f32[8] parameter(0)\n  z = s32[] constant(0)\n"
      "  t = (s32[], f32[8]) tuple(z, v)\n"
      "  ROOT w = (s32[], f32[8]) while(t), condition=cond, body=body\n}\n");
  agree("HloModule m\nt {\n  x = f32[4] parameter(0)\n  ROOT y = f32[4] negate(x)\n}\n"
        "f {\n  x = f32[4] parameter(0)\n  ROOT y = f32[4] exponential(x)\n}\n"
        "ENTRY e {\n  p = pred[] parameter(0)\n  a = f32[4] parameter(1)\n"
        "  ROOT c = f32[4] conditional(p, a, a), true_computation=t, false_computation=f\n}\n");
  agree("HloModule m\nb0 {\n  x = s32[3] parameter(0)\n  ROOT y = s32[3] negate(x)\n}\n"
        "b1 {\n  x = s32[3] parameter(0)\n  ROOT y = s32[3] add(x, x)\n}\n"
        "b2 {\n  x = s32[3] parameter(0)\n  ROOT y = s32[3] multiply(x, x)\n}\n"
        "ENTRY e {\n  i = s32[] parameter(0)\n  a = s32[3] parameter(1)\n"
        "  ROOT c = s32[3] conditional(i, a, a, a), branch_computations={b0, b1, b2}\n}\n");
  agree("HloModule m\nsq {\n  x = f32[5] parameter(0)\n  ROOT y = f32[5] multiply(x, x)\n}\n"
        "ENTRY e {\n  a = f32[5] parameter(0)\n  c = f32[5] call(a), to_apply=sq\n"
        "  ROOT t = (f32[5], f32[5]) tuple(c, a)\n}\n");
}
END_TEST

/* Conditionals whose branches write their roots straight into the
 * conditional's result (buffer assignment) and those that still copy: the
 * lax.switch pattern (three fused branches over the same operand, results
 * the entry's outputs), tuple results with a parameter passed through, one
 * buffer returned twice and a constant, a conditional nested in a branch,
 * and a conditional in a while body whose result is the loop state. The
 * s32 selectors are in [-5, 5]: out of range picks the last branch. */
START_TEST(test_conditional_in_place) {
  agree("HloModule m\n"
        "s0 {\n  x = f32[64,33] parameter(0)\n  ROOT y = f32[64,33] sine(x)\n}\n"
        "s1 {\n  x = f32[64,33] parameter(0)\n  c = f32[64,33] cosine(x)\n"
        "  k = f32[] constant(2)\n  b = f32[64,33] broadcast(k), dimensions={}\n"
        "  ROOT y = f32[64,33] multiply(c, b)\n}\n"
        "s2 {\n  x = f32[64,33] parameter(0)\n  t = f32[64,33] tanh(x)\n"
        "  k = f32[] constant(1)\n  b = f32[64,33] broadcast(k), dimensions={}\n"
        "  ROOT y = f32[64,33] subtract(t, b)\n}\n"
        "l0 {\n  x = f32[64,33] parameter(0)\n  ROOT y = f32[64,33] exponential(x)\n}\n"
        "l1 {\n  x = f32[64,33] parameter(0)\n  ROOT y = f32[64,33] negate(x)\n}\n"
        "ENTRY e {\n  i = s32[] parameter(0)\n  a = f32[64,33] parameter(1)\n"
        "  c = f32[64,33] conditional(i, a, a, a), branch_computations={s0, s1, s2}\n"
        "  z = s32[] constant(1)\n  p = pred[] compare(i, z), direction=GT\n"
        "  d = f32[64,33] conditional(p, a, a), true_computation=l0, false_computation=l1\n"
        "  ROOT t = (f32[64,33], f32[64,33]) tuple(c, d)\n}\n");
  agree("HloModule m\n"
        "b0 {\n  x = f32[40] parameter(0)\n  e = f32[40] exponential(x)\n"
        "  n = f32[40] negate(x)\n  ROOT t = (f32[40], f32[40]) tuple(e, n)\n}\n"
        "b1 {\n  x = f32[40] parameter(0)\n  ROOT t = (f32[40], f32[40]) tuple(x, x)\n}\n"
        "b2 {\n  x = f32[40] parameter(0)\n  s = f32[40] sine(x)\n"
        "  ROOT t = (f32[40], f32[40]) tuple(s, s)\n}\n"
        "b3 {\n  x = f32[40] parameter(0)\n  k = f32[] constant(3)\n"
        "  b = f32[40] broadcast(k), dimensions={}\n  c = f32[40] cosine(x)\n"
        "  ROOT t = (f32[40], f32[40]) tuple(b, c)\n}\n"
        "ENTRY e {\n  i = s32[] parameter(0)\n  a = f32[40] parameter(1)\n"
        "  c = (f32[40], f32[40]) conditional(i, a, a, a, a), "
        "branch_computations={b0, b1, b2, b3}\n"
        "  c0 = f32[40] get-tuple-element(c), index=0\n"
        "  c1 = f32[40] get-tuple-element(c), index=1\n"
        "  s = f32[40] add(c0, c1)\n  ROOT r = (f32[40], f32[40], f32[40]) tuple(s, c1, a)\n}\n");
  agree("HloModule m\n"
        "in0 {\n  x = f32[24] parameter(0)\n  ROOT y = f32[24] multiply(x, x)\n}\n"
        "in1 {\n  x = f32[24] parameter(0)\n  ROOT y = f32[24] abs(x)\n}\n"
        "o1 {\n  x = (f32[24], pred[]) parameter(0)\n"
        "  v = f32[24] get-tuple-element(x), index=0\n"
        "  q = pred[] get-tuple-element(x), index=1\n"
        "  w = f32[24] exponential(v)\n"
        "  ROOT y = f32[24] conditional(q, w, w), true_computation=in0, false_computation=in1\n}\n"
        "oa {\n  x = (f32[24], pred[]) parameter(0)\n"
        "  v = f32[24] get-tuple-element(x), index=0\n  ROOT y = f32[24] negate(v)\n}\n"
        "ENTRY e {\n  p = pred[] parameter(0)\n  q = pred[] parameter(1)\n"
        "  a = f32[24] parameter(2)\n  t = (f32[24], pred[]) tuple(a, q)\n"
        "  ROOT c = f32[24] conditional(p, t, t), true_computation=o1, false_computation=oa\n}\n");
  agree("HloModule m\n"
        "tw {\n  x = f32[16] parameter(0)\n  ROOT y = f32[16] add(x, x)\n}\n"
        "fw {\n  x = f32[16] parameter(0)\n  k = f32[] constant(1)\n"
        "  b = f32[16] broadcast(k), dimensions={}\n  ROOT y = f32[16] subtract(x, b)\n}\n"
        "cond {\n  s = (s32[], f32[16]) parameter(0)\n  i = s32[] get-tuple-element(s), index=0\n"
        "  n = s32[] constant(6)\n  ROOT p = pred[] compare(i, n), direction=LT\n}\n"
        "body {\n  s = (s32[], f32[16]) parameter(0)\n  i = s32[] get-tuple-element(s), index=0\n"
        "  v = f32[16] get-tuple-element(s), index=1\n  two = s32[] constant(2)\n"
        "  r = s32[] remainder(i, two)\n  z = s32[] constant(0)\n"
        "  p = pred[] compare(r, z), direction=EQ\n"
        "  w = f32[16] conditional(p, v, v), true_computation=tw, false_computation=fw\n"
        "  one = s32[] constant(1)\n  j = s32[] add(i, one)\n"
        "  ROOT t = (s32[], f32[16]) tuple(j, w)\n}\n"
        "ENTRY e {\n  v = f32[16] parameter(0)\n  z = s32[] constant(0)\n"
        "  t = (s32[], f32[16]) tuple(z, v)\n"
        "  ROOT w = (s32[], f32[16]) while(t), condition=cond, body=body\n}\n");
}
END_TEST

/* Row scatters as jax.ops.segment_sum / segment_max export them: one
 * scalar index per update row, rows repeated about 20 times each, indices
 * out of range (negative, past the end) skipped, and a combiner that keeps
 * the last update, for which the order of the updates shows. They run in
 * a loop: the first launch of a kernel runs its whole range inline (the
 * cost probe: every update walked in order), the later ones are split over
 * the pool (each invocation walks the lists of its blocks of rows, from
 * the updates sorted by block). */
/* Sibling scatters over the same ids (a segment sum, an s32 segment count
 * and a segment product of a computed update) merge into one variadic
 * scatter (scatter_merge.c) whose row kernels bucket the ids once and
 * apply the three combiners per update row, on several threads. */
START_TEST(test_scatter_merged) {
  agree("HloModule m\n"
        "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
        "  ROOT c = f32[] add(a, b)\n}\n"
        "iadd {\n  a = s32[] parameter(0)\n  b = s32[] parameter(1)\n"
        "  ROOT c = s32[] add(a, b)\n}\n"
        "mul {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
        "  ROOT c = f32[] multiply(a, b)\n}\n"
        "ENTRY e {\n  d = f32[5000,32] parameter(0)\n  p = s32[5000] parameter(1)\n"
        "  a = s32[5000] abs(p)\n  k = s32[] constant(203)\n"
        "  bk = s32[5000] broadcast(k), dimensions={}\n  r = s32[5000] remainder(a, bk)\n"
        "  idx = s32[5000,1] reshape(r)\n  z = f32[] constant(0)\n"
        "  zb = f32[200,32] broadcast(z), dimensions={}\n  iz = s32[] constant(0)\n"
        "  izb = s32[200,32] broadcast(iz), dimensions={}\n  one = s32[] constant(1)\n"
        "  ones = s32[5000,32] broadcast(one), dimensions={}\n  f = f32[] constant(1)\n"
        "  fb = f32[200,32] broadcast(f), dimensions={}\n  t = f32[5000,32] tanh(d)\n"
        "  g = f32[] constant(0.01)\n  gb = f32[5000,32] broadcast(g), dimensions={}\n"
        "  u0 = f32[5000,32] multiply(t, gb)\n  fu = f32[5000,32] broadcast(f), dimensions={}\n"
        "  u = f32[5000,32] add(u0, fu)\n"
        "  s = f32[200,32] scatter(zb, idx, d), update_window_dims={1}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add\n"
        "  c = s32[200,32] scatter(izb, idx, ones), update_window_dims={1}, "
        "inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, "
        "to_apply=iadd\n"
        "  m = f32[200,32] scatter(fb, idx, u), update_window_dims={1}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=mul\n"
        "  ROOT o = (f32[200,32], s32[200,32], f32[200,32]) tuple(s, c, m)\n}\n");
}
END_TEST

START_TEST(test_scatter_rows) {
  agree("HloModule m\n"
        "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
        "  ROOT c = f32[] add(a, b)\n}\n"
        "max {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
        "  ROOT c = f32[] maximum(a, b)\n}\n"
        "last {\n  a = f32[] parameter(0)\n  ROOT b = f32[] parameter(1)\n}\n"
        "cond {\n  st = (s32[], f32[6000,64], s32[6000,1], f32[300,64], f32[300,64], "
        "f32[300,64]) parameter(0)\n  i = s32[] get-tuple-element(st), index=0\n"
        "  n = s32[] constant(4)\n  ROOT lt = pred[] compare(i, n), direction=LT\n}\n"
        "body {\n  st = (s32[], f32[6000,64], s32[6000,1], f32[300,64], f32[300,64], "
        "f32[300,64]) parameter(0)\n  i = s32[] get-tuple-element(st), index=0\n"
        "  d = f32[6000,64] get-tuple-element(st), index=1\n"
        "  idx = s32[6000,1] get-tuple-element(st), index=2\n"
        "  s = f32[300,64] get-tuple-element(st), index=3\n"
        "  x = f32[300,64] get-tuple-element(st), index=4\n"
        "  l = f32[300,64] get-tuple-element(st), index=5\n"
        "  s2 = f32[300,64] scatter(s, idx, d), update_window_dims={1}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add\n"
        "  x2 = f32[300,64] scatter(x, idx, d), update_window_dims={1}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=max\n"
        "  l2 = f32[300,64] scatter(l, idx, d), update_window_dims={1}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=last\n"
        "  one = s32[] constant(1)\n  j = s32[] add(i, one)\n"
        "  ROOT t = (s32[], f32[6000,64], s32[6000,1], f32[300,64], f32[300,64], f32[300,64]) "
        "tuple(j, d, idx, s2, x2, l2)\n}\n"
        "ENTRY e {\n  d = f32[6000,64] parameter(0)\n  p = s32[6000] parameter(1)\n"
        "  o = f32[300,64] parameter(2)\n"
        "  io = s32[6000] iota(), iota_dimension=0\n  k7 = s32[] constant(7)\n"
        "  b7 = s32[6000] broadcast(k7), dimensions={}\n  m = s32[6000] multiply(io, b7)\n"
        "  a = s32[6000] add(m, p)\n  k = s32[] constant(310)\n"
        "  bk = s32[6000] broadcast(k), dimensions={}\n  r = s32[6000] remainder(a, bk)\n"
        "  idx = s32[6000,1] reshape(r)\n  z = f32[] constant(0)\n"
        "  zb = f32[300,64] broadcast(z), dimensions={}\n"
        "  ni = f32[] constant(-inf)\n  nb = f32[300,64] broadcast(ni), dimensions={}\n"
        "  c = s32[] constant(0)\n"
        "  st = (s32[], f32[6000,64], s32[6000,1], f32[300,64], f32[300,64], f32[300,64]) "
        "tuple(c, d, idx, zb, nb, o)\n"
        "  w = (s32[], f32[6000,64], s32[6000,1], f32[300,64], f32[300,64], f32[300,64]) "
        "while(st), condition=cond, body=body\n"
        "  w3 = f32[300,64] get-tuple-element(w), index=3\n"
        "  w4 = f32[300,64] get-tuple-element(w), index=4\n"
        "  w5 = f32[300,64] get-tuple-element(w), index=5\n"
        "  ROOT t = (f32[300,64], f32[300,64], f32[300,64]) tuple(w3, w4, w5)\n}\n");
}
END_TEST

/* A scan as JAX exports it: a while whose state carries the counter, h, the
 * stacked outputs, the stacked inputs and two loop-invariant weights; each
 * step slices x out of xs, runs h' = tanh(0.01 (x W + h U)) through a call
 * (dots of 12 rows: the unpacked small-GEMM tiles, with a masked column
 * edge at 152) and writes h' into ys in place. */
START_TEST(test_scan_loop) {
  agree(
      "HloModule m\n"
      "step {\n  x = f32[12,152] parameter(0)\n  h = f32[12,152] parameter(1)\n"
      "  w = f32[152,152] parameter(2)\n  u = f32[152,152] parameter(3)\n"
      "  a = f32[12,152] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
      "  b = f32[12,152] dot(h, u), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
      "  c = f32[12,152] add(a, b)\n  k = f32[] constant(0.01)\n"
      "  kb = f32[12,152] broadcast(k), dimensions={}\n  d = f32[12,152] multiply(c, kb)\n"
      "  ROOT t = f32[12,152] tanh(d)\n}\n"
      "body {\n  s = (s32[], f32[12,152], f32[6,12,152], f32[6,12,152], f32[152,152], "
      "f32[152,152]) "
      "parameter(0)\n"
      "  i = s32[] get-tuple-element(s), index=0\n  h = f32[12,152] get-tuple-element(s), index=1\n"
      "  ys = f32[6,12,152] get-tuple-element(s), index=2\n"
      "  xs = f32[6,12,152] get-tuple-element(s), index=3\n"
      "  w = f32[152,152] get-tuple-element(s), index=4\n"
      "  u = f32[152,152] get-tuple-element(s), index=5\n  z = s32[] constant(0)\n"
      "  xd = f32[1,12,152] dynamic-slice(xs, i, z, z), dynamic_slice_sizes={1,12,152}\n"
      "  x = f32[12,152] reshape(xd)\n"
      "  hn = f32[12,152] call(x, h, w, u), to_apply=step\n"
      "  hr = f32[1,12,152] reshape(hn)\n"
      "  yn = f32[6,12,152] dynamic-update-slice(ys, hr, i, z, z)\n"
      "  one = s32[] constant(1)\n  j = s32[] add(i, one)\n"
      "  ROOT r = (s32[], f32[12,152], f32[6,12,152], f32[6,12,152], f32[152,152], f32[152,152]) "
      "tuple(j, hn, yn, xs, w, u)\n}\n"
      "cond {\n  s = (s32[], f32[12,152], f32[6,12,152], f32[6,12,152], f32[152,152], "
      "f32[152,152]) "
      "parameter(0)\n"
      "  i = s32[] get-tuple-element(s), index=0\n  n = s32[] constant(6)\n"
      "  ROOT p = pred[] compare(i, n), direction=LT\n}\n"
      "ENTRY e {\n  h0 = f32[12,152] parameter(0)\n  xs = f32[6,12,152] parameter(1)\n"
      "  w = f32[152,152] parameter(2)\n  u = f32[152,152] parameter(3)\n"
      "  z = s32[] constant(0)\n  f = f32[] constant(0)\n"
      "  ys = f32[6,12,152] broadcast(f), dimensions={}\n"
      "  t = (s32[], f32[12,152], f32[6,12,152], f32[6,12,152], f32[152,152], f32[152,152]) "
      "tuple(z, h0, ys, xs, w, u)\n"
      "  l = (s32[], f32[12,152], f32[6,12,152], f32[6,12,152], f32[152,152], f32[152,152]) "
      "while(t), condition=cond, body=body\n"
      "  hf = f32[12,152] get-tuple-element(l), index=1\n"
      "  yf = f32[6,12,152] get-tuple-element(l), index=2\n"
      "  ROOT o = (f32[12,152], f32[6,12,152]) tuple(hf, yf)\n}\n");
}
END_TEST

/* A scan whose step multiplies xs[idx] by a loop-invariant w: the
 * scan_dots pass turns it into one product over all steps before the loop
 * when the loop runs at least as many times as xs has steps. Checked
 * against interp with the step index i, reversed, and past the end (the
 * dynamic-slice clamps it, and so must the slice of the product); with x
 * on either side of the dot; and with fewer trips than steps (left alone). */
static void scan_dots_case(const char *idx, int trips, bool x_rhs) {
  char text[4096];
  const char *dot = x_rhs ? "  a0 = f32[256,8] dot(w, x), lhs_contracting_dims={0}, "
                            "rhs_contracting_dims={1}\n"
                            "  n0 = f32[256,8] negate(a0)\n" /* not a transpose of a dot */
                            "  a = f32[8,256] transpose(n0), dimensions={1,0}\n"
                          : "  a = f32[8,256] dot(x, w), lhs_contracting_dims={1}, "
                            "rhs_contracting_dims={0}\n";
  snprintf(text, sizeof text,
           "HloModule m\n"
           "body {\n  s = (s32[], f32[8,256], f32[6,8,256], f32[256,256]) parameter(0)\n"
           "  i = s32[] get-tuple-element(s), index=0\n"
           "  h = f32[8,256] get-tuple-element(s), index=1\n"
           "  xs = f32[6,8,256] get-tuple-element(s), index=2\n"
           "  w = f32[256,256] get-tuple-element(s), index=3\n"
           "  z = s32[] constant(0)\n  k = s32[] constant(5)\n  ix = s32[] %s\n"
           "  xd = f32[1,8,256] dynamic-slice(xs, ix, z, z), dynamic_slice_sizes={1,8,256}\n"
           "  x = f32[8,256] reshape(xd)\n%s"
           "  c = f32[8,256] add(a, h)\n  t = f32[8,256] tanh(c)\n"
           "  one = s32[] constant(1)\n  j = s32[] add(i, one)\n"
           "  ROOT r = (s32[], f32[8,256], f32[6,8,256], f32[256,256]) tuple(j, t, xs, w)\n}\n"
           "cond {\n  s = (s32[], f32[8,256], f32[6,8,256], f32[256,256]) parameter(0)\n"
           "  i = s32[] get-tuple-element(s), index=0\n  n = s32[] constant(%d)\n"
           "  ROOT p = pred[] compare(i, n), direction=LT\n}\n"
           "ENTRY e {\n  h0 = f32[8,256] parameter(0)\n  xs = f32[6,8,256] parameter(1)\n"
           "  w = f32[256,256] parameter(2)\n  z = s32[] constant(0)\n"
           "  t = (s32[], f32[8,256], f32[6,8,256], f32[256,256]) tuple(z, h0, xs, w)\n"
           "  l = (s32[], f32[8,256], f32[6,8,256], f32[256,256]) while(t), condition=cond, "
           "body=body\n"
           "  ROOT hf = f32[8,256] get-tuple-element(l), index=1\n}\n",
           idx, dot, trips);
  agree(text);
}

START_TEST(test_scan_dots) {
  for (int rhs = 0; rhs < 2; rhs++) {
    scan_dots_case("add(i, z)", 6, rhs);
    scan_dots_case("subtract(k, i)", 6, rhs); /* a reverse scan */
    scan_dots_case("add(i, k)", 9, rhs);      /* clamped to the last step */
    scan_dots_case("add(i, z)", 4, rhs);      /* fewer trips than steps */
  }
  /* Batch dimensions: the product's step dimension follows them. */
  agree("HloModule m\n"
        "body {\n  s = (s32[], f32[2,4,256], f32[5,2,4,256], f32[2,256,256]) parameter(0)\n"
        "  i = s32[] get-tuple-element(s), index=0\n"
        "  h = f32[2,4,256] get-tuple-element(s), index=1\n"
        "  xs = f32[5,2,4,256] get-tuple-element(s), index=2\n"
        "  w = f32[2,256,256] get-tuple-element(s), index=3\n  z = s32[] constant(0)\n"
        "  xd = f32[1,2,4,256] dynamic-slice(xs, i, z, z, z), dynamic_slice_sizes={1,2,4,256}\n"
        "  x = f32[2,4,256] reshape(xd)\n"
        "  a = f32[2,4,256] dot(x, w), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
        "rhs_batch_dims={0}, rhs_contracting_dims={1}\n"
        "  c = f32[2,4,256] add(a, h)\n  t = f32[2,4,256] tanh(c)\n"
        "  one = s32[] constant(1)\n  j = s32[] add(i, one)\n"
        "  ROOT r = (s32[], f32[2,4,256], f32[5,2,4,256], f32[2,256,256]) tuple(j, t, xs, w)\n}\n"
        "cond {\n  s = (s32[], f32[2,4,256], f32[5,2,4,256], f32[2,256,256]) parameter(0)\n"
        "  i = s32[] get-tuple-element(s), index=0\n  n = s32[] constant(5)\n"
        "  ROOT p = pred[] compare(i, n), direction=LT\n}\n"
        "ENTRY e {\n  h0 = f32[2,4,256] parameter(0)\n  xs = f32[5,2,4,256] parameter(1)\n"
        "  w = f32[2,256,256] parameter(2)\n  z = s32[] constant(0)\n"
        "  t = (s32[], f32[2,4,256], f32[5,2,4,256], f32[2,256,256]) tuple(z, h0, xs, w)\n"
        "  l = (s32[], f32[2,4,256], f32[5,2,4,256], f32[2,256,256]) while(t), condition=cond, "
        "body=body\n"
        "  ROOT hf = f32[2,4,256] get-tuple-element(l), index=1\n}\n");
}
END_TEST

/* An SGD update through a transposed gradient, w - lr * transpose(x^T g):
 * algsimp swaps the dot's operands so the GEMM writes the update's order
 * (the transpose's layout {0,1} dropped); with batch dims too. */
START_TEST(test_transpose_of_dot) {
  agree("HloModule m\nENTRY e {\n  x = f32[40,24] parameter(0)\n  g = f32[40,56] parameter(1)\n"
        "  w = f32[56,24] parameter(2)\n"
        "  d = f32[24,56] dot(x, g), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
        "  t = f32[56,24]{0,1} transpose(d), dimensions={1,0}\n  k = f32[] constant(0.001)\n"
        "  kb = f32[56,24] broadcast(k), dimensions={}\n  u = f32[56,24]{0,1} multiply(t, kb)\n"
        "  ROOT n = f32[56,24] subtract(w, u)\n}\n");
  agree("HloModule m\nENTRY e {\n  a = f32[3,4,5,6] parameter(0)\n  b = f32[3,6,7] parameter(1)\n"
        "  d = f32[3,4,5,7] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={3}, "
        "rhs_batch_dims={0}, rhs_contracting_dims={1}\n"
        "  ROOT t = f32[3,7,4,5]{1,2,3,0} transpose(d), dimensions={0,3,1,2}\n}\n");
}
END_TEST

/* The cpu backend honours the run options through kiln_run_module_with. */
START_TEST(test_run_limits) {
  const char *text = "HloModule m\ncond {\n  s = s32[] parameter(0)\n"
                     "  ROOT p = pred[] constant(true)\n}\nbody {\n  s = s32[] parameter(0)\n"
                     "  one = s32[] constant(1)\n  ROOT t = s32[] add(s, one)\n}\n"
                     "ENTRY e {\n  z = s32[] constant(0)\n"
                     "  ROOT w = s32[] while(z), condition=cond, body=body\n}\n";
  kiln_module *m = parse(text, strlen(text), "t.hlo");
  ck_assert_ptr_nonnull(m);
  kiln_run_options ro = {.max_while_iterations = 1000};
  kiln_literal *out = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_run_module_with(m, "cpu", NULL, NULL, &ro, NULL, 0, &out, &st),
                   KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "while loop ran past 1000 iterations");
  ck_assert_ptr_null(out);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_run_module(m, "gpu", NULL, NULL, 0, &out, &st), KILN_ENOTFOUND);
  ck_assert_str_eq(st.msg, "unknown backend 'gpu' (known: cpu, interp)");
  kiln_module_destroy(m);
}
END_TEST

/* ---- the corpus ---------------------------------------------------------- */

static const char *corpus_dir(void) {
  static char path[1024];
  const char *env = getenv("KILN_CORPUS_DIR");
  if (env && *env) return env;
  snprintf(path, sizeof path, "%s/../shared/corpus/xla-hlo", KILN_SOURCE_DIR);
  return path;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  *len = fread(buf, 1, (size_t)n, f);
  buf[*len] = '\0';
  fclose(f);
  return buf;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

static int is_hlo(const struct dirent *d) {
  size_t n = strlen(d->d_name);
  return n > 4 && strcmp(d->d_name + n - 4, ".hlo") == 0;
}

START_TEST(test_corpus_agrees) {
  const char *dir = corpus_dir();
  struct dirent **names;
  int n = scandir(dir, &names, is_hlo, by_name);
  if (n <= 0) {
    printf("corpus directory %s not found; skipping (set KILN_CORPUS_DIR)\n", dir);
    return;
  }
  int counts[ORACLE_FAILED + 1] = {0};
  kiln_sbuf failures = KILN_SBUF_INIT;
  for (int i = 0; i < n; i++) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
    size_t len;
    char *text = slurp(path, &len);
    kiln_module *m = text ? parse(text, len, names[i]->d_name) : NULL;
    outcome o = ORACLE_FAILED;
    kiln_sbuf why = KILN_SBUF_INIT;
    if (m) o = run_both(m, 7, &why);
    counts[o]++;
    if (o == DIFFERENT || o == RUN_FAILED || o == COMPILE_FAILED)
      kiln_sbuf_printf(&failures, "  %s: %s\n", names[i]->d_name, kiln_sbuf_str(&why));
    kiln_sbuf_free(&why);
    kiln_module_destroy(m);
    free(text);
    free(names[i]);
  }
  free(names);
  printf("corpus on cpu: %d agree with interp, %d differ, %d fail to run, %d fail to compile, "
         "%d not supported by the cpu target, %d not runnable by interp\n%s",
         counts[SAME], counts[DIFFERENT], counts[RUN_FAILED], counts[COMPILE_FAILED],
         counts[CPU_UNSUPPORTED], counts[ORACLE_FAILED], kiln_sbuf_str(&failures));
  /* Compiler failures are reported above for the compiler's own tests to
   * pin down; a wrong result or a failing run is the executor's business. */
  ck_assert_msg(counts[DIFFERENT] == 0 && counts[RUN_FAILED] == 0,
                "cpu results differ from interp or fail to run:\n%s", kiln_sbuf_str(&failures));
  ck_assert_int_gt(counts[SAME], 40);
  kiln_sbuf_free(&failures);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cpu_e2e");
  TCase *tc = tcase_create("modules");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_elementwise_chains);
  tcase_add_test(tc, test_shape_ops);
  tcase_add_test(tc, test_window_copy);
  tcase_add_test(tc, test_loop_bodies);
  tcase_add_test(tc, test_dot);
  tcase_add_test(tc, test_dot_random);
  tcase_add_test(tc, test_reshape_random);
  tcase_add_test(tc, test_denormals_flushed);
  tcase_add_test(tc, test_reduce);
  tcase_add_test(tc, test_control_flow);
  tcase_add_test(tc, test_conditional_in_place);
  tcase_add_test(tc, test_scatter_merged);
  tcase_add_test(tc, test_scatter_rows);
  tcase_add_test(tc, test_scan_loop);
  tcase_add_test(tc, test_scan_dots);
  tcase_add_test(tc, test_transpose_of_dot);
  tcase_add_test(tc, test_run_limits);
  suite_add_tcase(s, tc);
  tc = tcase_create("corpus");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_corpus_agrees);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
