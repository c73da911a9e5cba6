/* Tests for CPU code generation: every op family compiled to native code,
 * loaded with memfd_create + dlopen, run on buffers laid out by the slot
 * table (test_codegen_harness.h) and compared with the reference
 * interpreter on random inputs with edge values; layouts; fusions; control
 * flow; the executor end to end; and the compiler's refusals and failure
 * modes (unsupported ops, the C compiler failing or hanging, no temporary
 * files left, no client string in generated source); and the prelude
 * contract (emit.h): the C prelude defines every listed helper with its
 * signature, and generated code calls nothing else; and the ULP bounds of
 * the prelude's f32 math, measured over a dense sweep of f32 inputs.
 * Tolerances against the interpreter are those of tests/support/tolerance.h
 * (per-op ULP bounds for f32 exp/log/log1p/expm1/tanh/logistic/erf, a
 * size-scaled bound for reassociated reductions; everything else exact).
 */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sbuf.h"
#include "compiler/codegen/c_target.h"
#include "compiler/codegen/emit.h"
#include "compiler/passes/passes.h"
#include "test_codegen_harness.h"
#include "tests/support/tolerance.h"

#if defined(__has_include)
#if __has_include("executor/run.h")
#include "executor/cpu/cpu.h"
#include "executor/run.h"
#define HAVE_EXECUTOR 1
#endif
#endif

#define N "17"

/* ---- elementwise, per element type -------------------------------------- */

static const char *const float_unary[] = {"abs",
                                          "cbrt",
                                          "ceil",
                                          "cosine",
                                          "exponential",
                                          "exponential-minus-one",
                                          "floor",
                                          "log",
                                          "log-plus-one",
                                          "logistic",
                                          "negate",
                                          "round-nearest-afz",
                                          "round-nearest-even",
                                          "rsqrt",
                                          "sign",
                                          "sine",
                                          "sqrt",
                                          "tan",
                                          "tanh",
                                          "copy",
                                          NULL};
static const char *const float_binary[] = {"add",     "subtract", "multiply", "divide", "remainder",
                                           "maximum", "minimum",  "atan2",    "power",  NULL};
static const char *const int_unary[] = {
    "abs", "negate", "not", "sign", "popcnt", "count-leading-zeros", "copy", NULL};
static const char *const int_binary[] = {"add",
                                         "subtract",
                                         "multiply",
                                         "divide",
                                         "remainder",
                                         "maximum",
                                         "minimum",
                                         "and",
                                         "or",
                                         "xor",
                                         "shift-left",
                                         "shift-right-arithmetic",
                                         "shift-right-logical",
                                         "power",
                                         NULL};
static const char *const uint_unary[] = {"negate", "not", "popcnt", "count-leading-zeros",
                                         "copy",   NULL};
static const char *const pred_unary[] = {"not", "copy", NULL};
static const char *const pred_binary[] = {"and", "or", "xor", "maximum", "minimum", NULL};
static const char *const dirs[] = {"EQ", "NE", "GE", "GT", "LE", "LT", NULL};

static char *elementwise_module(const char *t) {
  kiln_sbuf b = KILN_SBUF_INIT, root = KILN_SBUF_INIT, shapes = KILN_SBUF_INIT;
  bool f = t[0] == 'f' || t[0] == 'b', pred = strcmp(t, "pred") == 0;
  const char *const *un = f             ? float_unary
                          : pred        ? pred_unary
                          : t[0] == 'u' ? uint_unary
                                        : int_unary;
  const char *const *bin = f ? float_binary : pred ? pred_binary : int_binary;
  int k = 0;
  kiln_sbuf_printf(&b,
                   "HloModule ew\nENTRY main {\n  a = %s[" N "] parameter(0)\n  b = %s[" N
                   "] parameter(1)\n  c = pred[" N "] parameter(2)\n",
                   t, t);
  for (int i = 0; un[i]; i++, k++) {
    kiln_sbuf_printf(&b, "  r%d = %s[" N "] %s(a)\n", k, t, un[i]);
    kiln_sbuf_printf(&root, "%sr%d", k ? ", " : "", k);
    kiln_sbuf_printf(&shapes, "%s%s[" N "]", k ? ", " : "", t);
  }
  for (int i = 0; bin[i]; i++, k++) {
    kiln_sbuf_printf(&b, "  r%d = %s[" N "] %s(a, b)\n", k, t, bin[i]);
    kiln_sbuf_printf(&root, ", r%d", k);
    kiln_sbuf_printf(&shapes, ", %s[" N "]", t);
  }
  for (int i = 0; dirs[i]; i++, k++) {
    kiln_sbuf_printf(&b, "  r%d = pred[" N "] compare(a, b), direction=%s%s\n", k, dirs[i],
                     f && i % 2 ? ", type=TOTALORDER" : "");
    kiln_sbuf_printf(&root, ", r%d", k);
    kiln_sbuf_printf(&shapes, ", pred[" N "]");
  }
  kiln_sbuf_printf(&b, "  r%d = %s[" N "] select(c, a, b)\n", k, t);
  kiln_sbuf_printf(&root, ", r%d", k++);
  kiln_sbuf_printf(&shapes, ", %s[" N "]", t);
  if (!pred) {
    kiln_sbuf_printf(&b, "  lo = %s[] constant(%s)\n  hi = %s[] constant(%s)\n", t,
                     t[0] == 'u' ? "3" : "-3", t, t[0] == 'u' ? "30" : "4");
    kiln_sbuf_printf(&b, "  r%d = %s[" N "] clamp(lo, a, hi)\n", k, t);
    kiln_sbuf_printf(&root, ", r%d", k++);
    kiln_sbuf_printf(&shapes, ", %s[" N "]", t);
  }
  if (f) {
    kiln_sbuf_printf(&b, "  r%d = pred[" N "] is-finite(a)\n", k);
    kiln_sbuf_printf(&root, ", r%d", k++);
    kiln_sbuf_printf(&shapes, ", pred[" N "]");
    kiln_sbuf_printf(
        &b, "  r%d = %s[" N "] reduce-precision(a), exponent_bits=5, mantissa_bits=2\n", k, t);
    kiln_sbuf_printf(&root, ", r%d", k++);
    kiln_sbuf_printf(&shapes, ", %s[" N "]", t);
  }
  kiln_sbuf_printf(&b, "  ROOT out = (%s) tuple(%s)\n}\n", kiln_sbuf_str(&shapes),
                   kiln_sbuf_str(&root));
  kiln_sbuf_free(&root);
  kiln_sbuf_free(&shapes);
  return kiln_sbuf_detach(&b, NULL);
}

static const char *const types[] = {"pred", "s8",  "s16", "s32",  "s64", "u8",  "u16",
                                    "u32",  "u64", "f16", "bf16", "f32", "f64", NULL};

START_TEST(elementwise_every_type) {
  char *hlo = elementwise_module(types[_i]);
  cg_check(hlo, true);
  kiln_free(hlo);
}
END_TEST

START_TEST(convert_every_pair) {
  const char *from = types[_i];
  kiln_sbuf b = KILN_SBUF_INIT, root = KILN_SBUF_INIT, shapes = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b, "HloModule cv\nENTRY main {\n  a = %s[" N "] parameter(0)\n", from);
  for (int j = 0; types[j]; j++) {
    kiln_sbuf_printf(&b, "  r%d = %s[" N "] convert(a)\n", j, types[j]);
    kiln_sbuf_printf(&root, "%sr%d", j ? ", " : "", j);
    kiln_sbuf_printf(&shapes, "%s%s[" N "]", j ? ", " : "", types[j]);
  }
  kiln_sbuf_printf(&b, "  ROOT out = (%s) tuple(%s)\n}\n", kiln_sbuf_str(&shapes),
                   kiln_sbuf_str(&root));
  char *hlo = kiln_sbuf_detach(&b, NULL);
  cg_check(hlo, true);
  kiln_free(hlo);
  kiln_sbuf_free(&root);
  kiln_sbuf_free(&shapes);
}
END_TEST

START_TEST(bitcast_convert_same_width) {
  cg_check("HloModule bc\nENTRY main {\n"
           "  a = f32[9] parameter(0)\n  b = f16[9] parameter(1)\n  c = bf16[9] parameter(2)\n"
           "  d = f64[9] parameter(3)\n  e = s8[9] parameter(4)\n"
           "  x = f32[9] multiply(a, a)\n  r0 = s32[9] bitcast-convert(x)\n"
           "  y = f16[9] negate(b)\n  r1 = u16[9] bitcast-convert(y)\n"
           "  z = bf16[9] add(c, c)\n  r2 = s16[9] bitcast-convert(z)\n"
           "  w = f64[9] sqrt(d)\n  r3 = u64[9] bitcast-convert(w)\n"
           "  r4 = u8[9] bitcast-convert(e)\n  r5 = f32[9] bitcast-convert(r0)\n"
           "  ROOT t = (s32[9], u16[9], s16[9], u64[9], u8[9], f32[9]) tuple(r0, r1, r2, r3, r4, "
           "r5)\n}\n",
           false);
}
END_TEST

START_TEST(integer_edges_exact) {
  /* Division and remainder by zero and INT_MIN / -1, shifts past the width,
   * and saturating float->int conversion of NaN and infinities. */
  const char *hlo = "HloModule edges\nENTRY main {\n"
                    "  a = s32[6] constant({-2147483648, 7, -7, 5, 0, 1})\n"
                    "  b = s32[6] constant({-1, 0, 2, 33, -1, 32})\n"
                    "  d = s32[6] divide(a, b)\n  r = s32[6] remainder(a, b)\n"
                    "  l = s32[6] shift-left(a, b)\n  sa = s32[6] shift-right-arithmetic(a, b)\n"
                    "  sl = s32[6] shift-right-logical(a, b)\n"
                    "  f = f32[6] constant({nan, inf, -inf, 3e9, -3e9, -0.9})\n"
                    "  c8 = s8[6] convert(f)\n  cu = u32[6] convert(f)\n  c64 = s64[6] convert(f)\n"
                    "  ROOT t = (s32[6], s32[6], s32[6], s32[6], s32[6], s8[6], u32[6], s64[6]) "
                    "tuple(d, r, l, sa, sl, c8, cu, c64)\n}\n";
  kiln_executable *e = cg_check_full(hlo, 1, false, 0, 0, true);
  kiln_literal *out;
  cg_execute(e, NULL, &out);
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_literal_print(&b, out, false);
  ck_assert_str_eq(kiln_sbuf_str(&b),
                   "({-2147483648, -1, -3, 0, 0, 0}, {0, 7, -1, 5, 0, 1}, "
                   "{0, 7, -28, 0, 0, 0}, {-1, 7, -2, 0, 0, 0}, {0, 7, 1073741822, 0, 0, 0}, "
                   "{0, 127, -128, 127, -128, 0}, {0, 4294967295, 0, 3000000000, 0, 0}, "
                   "{0, 9223372036854775807, -9223372036854775808, 3000000000, -3000000000, 0})");
  kiln_sbuf_free(&b);
  kiln_literal_destroy(out);
  kiln_executable_destroy(e);
}
END_TEST

/* ---- data movement and layouts ------------------------------------------ */

START_TEST(movement_ops) {
  cg_check("HloModule mv\nENTRY main {\n"
           "  p0 = f32[6,8] parameter(0)\n  p1 = f32[8] parameter(1)\n"
           "  b = f32[6,8] broadcast(p1), dimensions={1}\n  a = f32[6,8] add(p0, b)\n"
           "  s = f32[3,3] slice(a), slice={[1:6:2], [2:8:2]}\n"
           "  r = f32[3,3] reverse(s), dimensions={0,1}\n"
           "  c = f32[6,3] concatenate(r, s), dimensions={0}\n  pv = f32[] constant(7)\n"
           "  p = f32[9,9] pad(c, pv), padding=1_2x1_3_1\n  rs = f32[27,3] reshape(p)\n"
           "  t = f32[3,27] transpose(rs), dimensions={1,0}\n"
           "  io = s32[3,27] iota(), iota_dimension=1\n  iof = f32[3,27] convert(io)\n"
           "  ROOT m = f32[3,27] multiply(t, iof)\n}\n",
           false);
}
END_TEST

START_TEST(layouts_honoured) {
  /* Column-major parameters and results, transposes that are bitcasts,
   * reshapes that are not, and a copy that changes the layout. */
  cg_check("HloModule lay\nENTRY main {\n"
           "  p0 = f32[5,7]{0,1} parameter(0)\n  p1 = f32[5,7]{1,0} parameter(1)\n"
           "  a = f32[5,7]{0,1} add(p0, p1)\n  t = f32[7,5]{1,0} transpose(a), dimensions={1,0}\n"
           "  c = f32[7,5]{0,1} copy(t)\n  r = f32[35]{0} reshape(c)\n"
           "  p2 = f32[2,3,4]{0,2,1} parameter(2)\n  n = f32[2,3,4]{2,1,0} negate(p2)\n"
           "  m = f32[4,3,2]{1,0,2} transpose(p2), dimensions={2,1,0}\n"
           "  ROOT o = (f32[35]{0}, f32[7,5]{1,0}, f32[2,3,4]{2,1,0}, f32[4,3,2]{1,0,2}) tuple(r, "
           "t, n, m)\n}\n",
           false);
}
END_TEST

START_TEST(dynamic_slices_clamp) {
  const char *hlo =
      "HloModule dyn\nENTRY main {\n"
      "  p0 = f32[6,8] parameter(0)\n  i = s32[] parameter(1)\n  j = s32[] parameter(2)\n"
      "  ds = f32[3,4] dynamic-slice(p0, i, j), dynamic_slice_sizes={3,4}\n"
      "  n = f32[3,4] negate(ds)\n"
      "  u = f32[6,8] dynamic-update-slice(p0, n, j, i)\n"
      "  ROOT t = (f32[3,4], f32[6,8]) tuple(ds, u)\n}\n";
  for (uint64_t seed = 1; seed < 6; seed++) cg_check_full(hlo, seed, true, 1e-6, 0, false);
}
END_TEST

START_TEST(dynamic_update_in_place) {
  /* The operand dies at the update: the result takes its slot and only the
   * update is written (no copy step). */
  const char *hlo =
      "HloModule dus\nENTRY main {\n"
      "  p0 = f32[64,16] parameter(0)\n  e = f32[64,16] exponential(p0)\n"
      "  u = f32[2,16] parameter(1)\n  i = s32[] parameter(2)\n  z = s32[] constant(0)\n"
      "  d = f32[64,16] dynamic-update-slice(e, u, i, z)\n"
      "  ROOT s = f32[64,16] negate(d)\n}\n";
  /* exp within KILN_TOL_ULP_EXP ULPs (tolerance.h), and negate exact. */
  kiln_executable *e = cg_check_full(hlo, 3, false, 1e-6, 0, true);
  for (uint32_t i = 0; i < e->programs[0].nsteps; i++)
    ck_assert_int_ne(e->programs[0].steps[i].kind, KILN_STEP_COPY);
  kiln_executable_destroy(e);
}
END_TEST

START_TEST(gather_and_scatter) {
  cg_check("HloModule gs\nadd { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] "
           "add(a, b) }\n"
           "ENTRY main {\n"
           "  p0 = f32[5,4] parameter(0)\n  idx = s32[3] parameter(1)\n"
           "  g = f32[3,4] gather(p0, idx), offset_dims={1}, collapsed_slice_dims={0}, "
           "start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}\n"
           "  i2 = s32[3,1] reshape(idx)\n  up = f32[3,4] parameter(2)\n"
           "  s = f32[5,4] scatter(p0, i2, up), update_window_dims={1}, inserted_window_dims={0}, "
           "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add\n"
           "  ROOT t = (f32[3,4], f32[5,4]) tuple(g, s)\n}\n",
           false);
  /* Indices out of range: gather clamps, scatter skips the window. */
  cg_check_full(
      "HloModule gs2\nmx { a = s32[] parameter(0)  b = s32[] parameter(1)  ROOT s = s32[] "
      "maximum(a, b) }\n"
      "ENTRY main {\n"
      "  p0 = s32[7,3] parameter(0)\n  idx = s32[4,2] parameter(1)\n"
      "  g = s32[4,2,2] gather(p0, idx), offset_dims={1,2}, collapsed_slice_dims={}, "
      "start_index_map={0,1}, index_vector_dim=1, slice_sizes={2,2}\n"
      "  up = s32[4,2,2] parameter(2)\n"
      "  s = s32[7,3] scatter(p0, idx, up), update_window_dims={1,2}, inserted_window_dims={}, "
      "scatter_dims_to_operand_dims={0,1}, index_vector_dim=1, to_apply=mx\n"
      "  ROOT t = (s32[4,2,2], s32[7,3]) tuple(g, s)\n}\n",
      9, true, 0, 0, false);
}
END_TEST

START_TEST(scatter_blocks_keep_update_order) {
  /* Windows one row wide: the kernel runs in blocks of rows, each walking
   * every update. Repeated and out-of-range rows; combiners for which the
   * order of the updates shows (the last one wins; a subtraction). */
  const char *hlo =
      "HloModule sb\nlast { a = f32[] parameter(0)  ROOT b = f32[] parameter(1) }\n"
      "sub { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] subtract(a, b) }\n"
      "ENTRY main {\n"
      "  p0 = f32[40,16] parameter(0)\n  raw = s32[64] parameter(1)\n"
      "  k = s32[] constant(44)  kb = s32[64] broadcast(k), dimensions={}\n"
      "  r = s32[64] remainder(raw, kb)  idx = s32[64,1] reshape(r)\n"
      "  up = f32[64,16] parameter(2)\n"
      "  s1 = f32[40,16] scatter(p0, idx, up), update_window_dims={1}, inserted_window_dims={0}, "
      "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=last\n"
      "  s2 = f32[40,16] scatter(p0, idx, up), update_window_dims={1}, inserted_window_dims={0}, "
      "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=sub\n"
      "  q = f32[3,40,4] parameter(3)  uq = f32[64,3,4] parameter(4)\n"
      "  s3 = f32[3,40,4] scatter(q, idx, uq), update_window_dims={1,2}, "
      "inserted_window_dims={1}, scatter_dims_to_operand_dims={1}, index_vector_dim=1, "
      "to_apply=sub\n"
      "  n = f32[40,3] parameter(5)  un = f32[64,3] parameter(6)\n"
      "  s4 = f32[40,3] scatter(n, idx, un), update_window_dims={1}, inserted_window_dims={0}, "
      "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=sub\n"
      "  ROOT t = (f32[40,16], f32[40,16], f32[3,40,4], f32[40,3]) tuple(s1, s2, s3, s4)\n}\n";
  for (uint64_t seed = 1; seed < 4; seed++) {
    kiln_executable *e = cg_check_full(hlo, seed, false, 0, 0, true);
    uint32_t by_range[8] = {0};
    for (uint32_t i = 0; i < e->programs[0].nsteps; i++) {
      const kiln_step *st = &e->programs[0].steps[i];
      if (st->kind == KILN_STEP_KERNEL && st->range < 8) by_range[st->range]++;
    }
    ck_assert_uint_eq(by_range[4], 2); /* 16-wide windows: 4 blocks of 10 rows */
    ck_assert_uint_eq(by_range[3], 1); /* 12-element windows: 3 blocks of 14 */
    ck_assert_uint_ge(by_range[1], 1); /* 3-wide windows: one sequential pass */
    kiln_executable_destroy(e);
  }
}
END_TEST

START_TEST(sort_stable_multi_operand) {
  cg_check(
      "HloModule srt\n"
      "cmp { a = f32[] parameter(0)  b = f32[] parameter(1)  c = s32[] parameter(2)  d = s32[] "
      "parameter(3)\n"
      "  ROOT lt = pred[] compare(a, b), direction=LT, type=TOTALORDER }\n"
      "ENTRY main {\n  p0 = f32[4,33] parameter(0)\n  io = s32[4,33] iota(), iota_dimension=1\n"
      "  r = f32[4,33] round-nearest-even(p0)\n"
      "  ROOT s = (f32[4,33], s32[4,33]) sort(r, io), dimensions={1}, is_stable=true, "
      "to_apply=cmp\n}\n",
      true);
  cg_check("HloModule srt0\n"
           "cmp { a = s16[] parameter(0)  b = s16[] parameter(1)  ROOT gt = pred[] compare(a, b), "
           "direction=GT }\n"
           "ENTRY main {\n  p0 = s16[9,3]{0,1} parameter(0)\n"
           "  ROOT s = s16[9,3]{0,1} sort(p0), dimensions={0}, to_apply=cmp\n}\n",
           true);
}
END_TEST

START_TEST(select_and_scatter) {
  /* The gradient of a max pool: overlapping and padded windows, and a
   * first-position tie break (GE keeps the current pick). */
  cg_check(
      "HloModule sas\n"
      "ge { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT c = pred[] compare(a, b), "
      "direction=GE }\n"
      "add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }\n"
      "ENTRY main {\n  x = f32[6,7] parameter(0)\n  r = f32[6,7] round-nearest-even(x)\n"
      "  s = f32[3,4] parameter(1)\n  z = f32[] constant(0)\n"
      "  ROOT g = f32[6,7] select-and-scatter(r, s, z), window={size=3x3 stride=2x2 pad=1_1x1_1}, "
      "select=ge, scatter=add\n}\n",
      false);
}
END_TEST

/* ---- reductions and contractions ---------------------------------------- */

/* Random reduction shapes against the interpreter: rank 1-4, dims up to
 * 70 (so that rows are long enough for the vector lanes, with tails), a
 * random set of reduced dims, a random layout, f32/f64/s32/bf16 and add,
 * max or min, with a fused producer; reassociated float sums within
 * kiln_tol_reduce_f32 of the number reduced (tolerance.h), the rest exact
 * or within the f32 tolerance. */
START_TEST(reductions_random) {
  static const char *const rtypes[] = {"f32", "f32", "f64", "s32", "bf16"};
  static const char *const ops[] = {"add", "maximum", "minimum"};
  uint64_t rng = 0x9e3779b97f4a7c15ull + (uint64_t)_i;
  for (int it = 0; it < 12; it++) {
#define RND(n) ((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 33) % (n)
    uint32_t rank = 1 + (uint32_t)RND(4);
    int64_t dims[4], n = 1;
    for (uint32_t d = 0; d < rank; d++) {
      dims[d] = d + 1 == rank ? 1 + (int64_t)RND(70) : 1 + (int64_t)RND(rank > 2 ? 6 : 12);
      n *= dims[d];
    }
    uint32_t redmask = 1 + (uint32_t)RND((1u << rank) - 1), m2m[4];
    for (uint32_t d = 0; d < rank; d++) m2m[d] = rank - 1 - d;
    if (rank > 1 && RND(3) == 0) { /* swap the two most minor dims in the layout */
      m2m[0] = rank - 2;
      m2m[1] = rank - 1;
    }
    const char *t = rtypes[RND(5)], *op = ops[RND(3)];
    char in[128] = "", out[128] = "", lay[64] = "", redl[64] = "", olay[64] = "";
    int64_t nred = 1;
    uint32_t orank = 0;
    for (uint32_t d = 0; d < rank; d++) {
      snprintf(in + strlen(in), sizeof in - strlen(in), "%s%lld", d ? "," : "", (long long)dims[d]);
      snprintf(lay + strlen(lay), sizeof lay - strlen(lay), "%s%u", d ? "," : "", m2m[d]);
      if (redmask & (1u << d)) {
        nred *= dims[d];
        snprintf(redl + strlen(redl), sizeof redl - strlen(redl), "%s%u", redl[0] ? "," : "", d);
      } else {
        snprintf(out + strlen(out), sizeof out - strlen(out), "%s%lld", orank ? "," : "",
                 (long long)dims[d]);
        orank++;
      }
    }
    for (uint32_t d = 0; d < orank; d++)
      snprintf(olay + strlen(olay), sizeof olay - strlen(olay), "%s%u", d ? "," : "",
               orank - 1 - d);
    const char *init = strcmp(op, "add") == 0 ? "0" : strcmp(op, "maximum") == 0 ? "-inf" : "inf";
    if (t[0] == 's')
      init = strcmp(op, "add") == 0       ? "0"
             : strcmp(op, "maximum") == 0 ? "-2147483648"
                                          : "2147483647";
    char hlo[2048];
    snprintf(hlo, sizeof hlo,
             "HloModule rr\nr { a = %s[] parameter(0)  b = %s[] parameter(1)  ROOT s = %s[] "
             "%s(a, b) }\n"
             "ENTRY main {\n  p = %s[%s]{%s} parameter(0)\n  q = %s[%s]{%s} multiply(p, p)\n"
             "  y = %s[%s]{%s} add(q, p)\n  z = %s[] constant(%s)\n"
             "  ROOT o = %s[%s]{%s} reduce(y, z), dimensions={%s}, to_apply=r\n}\n",
             t, t, t, op, t, in, lay, t, in, lay, t, in, lay, t, init, t, out, olay, redl);
    double tol = strcmp(t, "f32") == 0 ? kiln_tol_reduce_f32(nred) : 1e-9;
    cg_check_full(hlo, 100 + (uint64_t)it, false, tol, 0, false);
    cg_check_full(hlo, 200 + (uint64_t)it, false, tol, 2, false);
    (void)n;
#undef RND
  }
}
END_TEST

START_TEST(reductions) {
  cg_check("HloModule red\nadd { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] "
           "add(a, b) }\n"
           "am { a = f32[] parameter(0)  ai = s32[] parameter(1)  b = f32[] parameter(2)  bi = "
           "s32[] parameter(3)\n"
           "  gt = pred[] compare(a, b), direction=GT  v = f32[] select(gt, a, b)  i = s32[] "
           "select(gt, ai, bi)\n"
           "  ROOT t = (f32[], s32[]) tuple(v, i) }\n"
           "ENTRY main {\n  p0 = f32[4,6,5] parameter(0)\n  z = f32[] constant(0)\n"
           "  r = f32[4,5] reduce(p0, z), dimensions={1}, to_apply=add\n"
           "  r2 = f32[] reduce(p0, z), dimensions={0,1,2}, to_apply=add\n"
           "  io = s32[4,6,5] iota(), iota_dimension=2\n  ninf = f32[] constant(-inf)\n  zi = "
           "s32[] constant(0)\n"
           "  am = (f32[4,6], s32[4,6]) reduce(p0, io, ninf, zi), dimensions={2}, to_apply=am\n"
           "  ROOT t = (f32[4,5], f32[], (f32[4,6], s32[4,6])) tuple(r, r2, am)\n}\n",
           false);
  cg_check("HloModule redbf\nadd { a = bf16[] parameter(0)  b = bf16[] parameter(1)  ROOT s = "
           "bf16[] add(a, b) }\n"
           "ENTRY main {\n  p0 = bf16[3,40] parameter(0)\n  z = bf16[] constant(0)\n"
           "  ROOT r = bf16[3] reduce(p0, z), dimensions={1}, to_apply=add\n}\n",
           false);
}
END_TEST

/* ---- row kernels: softmax, log-softmax, layernorm, rmsnorm -------------- */
/* (The norms go through size-1 dims and back, as JAX exports them.) */

/* Kernel steps of program 0. */
static uint32_t kernel_steps(const kiln_executable *e) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < e->programs[0].nsteps; i++)
    n += e->programs[0].steps[i].kind == KILN_STEP_KERNEL;
  return n;
}

/* One of the four patterns over random shapes, layouts and types, reduced
 * over one dim: compared with the interpreter, and, when that dim is the
 * physically minor one and long enough for the row form, compiled to one
 * kernel (the reduces computed once per row, kernel_loop.c). */
START_TEST(row_fusions_random) {
  static const char *const rtypes[] = {"f32", "f32", "bf16"};
  uint64_t rng = 0x2545f4914f6cdd1dull + (uint64_t)_i * 977;
  for (int it = 0; it < 6; it++) {
#define RND(n) ((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 33) % (n)
    int pat = (int)((_i + it) % 4);
    uint32_t rank = 2 + (uint32_t)RND(2), m2m[3];
    int64_t dims[3];
    for (uint32_t d = 0; d < rank; d++) dims[d] = 1 + (int64_t)RND(d + 1 == rank ? 90 : 7);
    for (uint32_t d = 0; d < rank; d++) m2m[d] = rank - 1 - d;
    if (RND(3) == 0) { /* the two most minor dims swapped in the layout */
      m2m[0] = rank - 2;
      m2m[1] = rank - 1;
    }
    if (RND(4) == 0) dims[m2m[0]] = 1 + (int64_t)RND(7); /* short rows */
    uint32_t rd = RND(3) == 0 ? (uint32_t)RND(rank) : m2m[0];
    const char *t = rtypes[RND(3)];
    char S[64] = "", L[32] = "", R[64] = "", R1[64] = "", K[32] = "", ALL[32] = "";
    for (uint32_t d = 0; d < rank; d++) {
      const char *c = d ? "," : "";
      snprintf(S + strlen(S), sizeof S - strlen(S), "%s%lld", c, (long long)dims[d]);
      snprintf(L + strlen(L), sizeof L - strlen(L), "%s%u", c, m2m[d]);
      snprintf(R1 + strlen(R1), sizeof R1 - strlen(R1), "%s%lld", c,
               (long long)(d == rd ? 1 : dims[d]));
      snprintf(ALL + strlen(ALL), sizeof ALL - strlen(ALL), "%s%u", c, d);
      if (d == rd) continue;
      snprintf(R + strlen(R), sizeof R - strlen(R), "%s%lld", R[0] ? "," : "", (long long)dims[d]);
      snprintf(K + strlen(K), sizeof K - strlen(K), "%s%u", K[0] ? "," : "", d);
    }
    char hlo[4096];
    int o = snprintf(hlo, sizeof hlo,
                     "HloModule rows\nmx { a = %s[] parameter(0)  b = %s[] parameter(1)  ROOT m = "
                     "%s[] maximum(a, b) }\nad { a = %s[] parameter(0)  b = %s[] parameter(1)  "
                     "ROOT s = %s[] add(a, b) }\nENTRY main {\n  p = %s[%s]{%s} parameter(0)\n"
                     "  z = %s[] constant(0)\n",
                     t, t, t, t, t, t, t, S, L, t);
#define ADD(...) o += snprintf(hlo + o, sizeof hlo - (size_t)o, __VA_ARGS__)
    if (pat <= 1) { /* softmax, log-softmax */
      ADD("  ninf = %s[] constant(-inf)\n  m = %s[%s] reduce(p, ninf), dimensions={%u}, "
          "to_apply=mx\n",
          t, t, R, rd);
      ADD("  mb = %s[%s]{%s} broadcast(m), dimensions={%s}\n  d = %s[%s]{%s} subtract(p, mb)\n", t,
          S, L, K, t, S, L);
      ADD("  e = %s[%s]{%s} exponential(d)\n  s = %s[%s] reduce(e, z), dimensions={%u}, "
          "to_apply=ad\n",
          t, S, L, t, R, rd);
      if (pat == 0) {
        ADD("  sb = %s[%s]{%s} broadcast(s), dimensions={%s}\n  ROOT o = %s[%s]{%s} divide(e, "
            "sb)\n}\n",
            t, S, L, K, t, S, L);
      } else {
        ADD("  ls = %s[%s] log(s)\n  lb = %s[%s]{%s} broadcast(ls), dimensions={%s}\n"
            "  ROOT o = %s[%s]{%s} subtract(d, lb)\n}\n",
            t, R, t, S, L, K, t, S, L);
      }
    } else { /* layernorm, rmsnorm: through reshapes to a size-1 dim, as JAX writes them */
      ADD("  g = %s[%lld] parameter(1)\n  gb = %s[%s]{%s} broadcast(g), dimensions={%u}\n", t,
          (long long)dims[rd], t, S, L, rd);
      ADD("  nc = %s[] constant(%lld)\n  nb = %s[%s] broadcast(nc), dimensions={}\n"
          "  ec = %s[] constant(1e-05)\n  eb = %s[%s] broadcast(ec), dimensions={}\n",
          t, (long long)dims[rd], t, R, t, t, R);
      const char *x = "p";
      if (pat == 2) {
        ADD("  s1 = %s[%s] reduce(p, z), dimensions={%u}, to_apply=ad\n  mean = %s[%s] "
            "divide(s1, nb)\n",
            t, R, rd, t, R);
        ADD("  mr = %s[%s] reshape(mean)\n  mr2 = %s[%s] broadcast(mr), dimensions={%s}\n"
            "  mr3 = %s[%s] reshape(mr2)\n  mbc = %s[%s]{%s} broadcast(mr3), dimensions={%s}\n"
            "  c = %s[%s]{%s} subtract(p, mbc)\n",
            t, R1, t, R1, ALL, t, R, t, S, L, K, t, S, L);
        x = "c";
      }
      ADD("  sq = %s[%s]{%s} multiply(%s, %s)\n  v = %s[%s] reduce(sq, z), dimensions={%u}, "
          "to_apply=ad\n",
          t, S, L, x, x, t, R, rd);
      ADD("  var = %s[%s] divide(v, nb)\n  ve = %s[%s] add(var, eb)\n  rs = %s[%s] rsqrt(ve)\n", t,
          R, t, R, t, R);
      ADD("  rr = %s[%s] reshape(rs)\n  rr2 = %s[%s] broadcast(rr), dimensions={%s}\n"
          "  rr3 = %s[%s] reshape(rr2)\n  rb = %s[%s]{%s} broadcast(rr3), dimensions={%s}\n",
          t, R1, t, R1, ALL, t, R, t, S, L, K);
      ADD("  y = %s[%s]{%s} multiply(%s, rb)\n  ROOT o = %s[%s]{%s} multiply(y, gb)\n}\n", t, S, L,
          x, t, S, L);
    }
#undef ADD
    ck_assert_int_lt(o, (int)sizeof hlo);
    /* Two reassociated reductions of about |x| <= 10 feed each result. */
    double tol = 8 * kiln_tol_reduce_f32(dims[rd]) + 8 * KILN_TOL_ULP_MAX * KILN_TOL_F32_EPS;
    cg_check_full(hlo, 300 + (uint64_t)it, false, tol, 0, false);
    kiln_executable *e = cg_check_full(hlo, 400 + (uint64_t)it, false, tol, 2, true);
    if (rd == m2m[0] && dims[rd] >= 8)
      ck_assert_msg(kernel_steps(e) == 1, "%u kernels for\n%s", kernel_steps(e), hlo);
    kiln_executable_destroy(e);
#undef RND
  }
}
END_TEST

/* A reduce over the major dim of a transpose (per-example gradients summed
 * over the batch, f32[600,50] from f32[5,600,50]{1,2,0}) compiles, on cpu,
 * to one kernel over rows of the input's minor dim (50 of them, 600
 * long), not one iteration per output element, and agrees exactly with
 * the interpreter (the same combination order). */
START_TEST(reduce_major_transposed_rows) {
  static const char hlo[] =
      "HloModule t\nad { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) "
      "}\nENTRY main {\n  a = f32[5,600,50]{1,2,0} parameter(0)\n  s = f32[5] parameter(1)\n"
      "  b = f32[5,600,50]{1,2,0} broadcast(s), dimensions={0}\n"
      "  m = f32[5,600,50]{1,2,0} multiply(a, b)\n  z = f32[] constant(0)\n"
      "  ROOT r = f32[600,50]{1,0} reduce(m, z), dimensions={0}, to_apply=ad\n}\n";
  kiln_executable *e = cg_check_full(hlo, 11, false, 0, 2, true);
  uint32_t n = 0;
  for (uint32_t i = 0; i < e->programs[0].nsteps; i++)
    if (e->programs[0].steps[i].kind == KILN_STEP_KERNEL) {
      n++;
      ck_assert_uint_eq(e->programs[0].steps[i].range, 50);
    }
  ck_assert_uint_eq(n, 1);
  kiln_executable_destroy(e);
}
END_TEST

START_TEST(reduce_window_padded_dilated) {
  cg_check("HloModule rw\nmx { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] "
           "maximum(a, b) }\n"
           "add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }\n"
           "ENTRY main {\n  p0 = f32[1,7,7,2] parameter(0)\n  ninf = f32[] constant(-inf)\n  z = "
           "f32[] constant(0)\n"
           "  a = f32[1,4,4,2] reduce-window(p0, ninf), window={size=1x3x3x1 stride=1x2x2x1 "
           "pad=0_0x1_1x1_1x0_0}, to_apply=mx\n"
           "  b = f32[1,14,2,2] reduce-window(p0, z), window={size=1x3x2x1 stride=1x1x3x1 "
           "pad=0_0x2_1x0_1x0_0 lhs_dilate=1x2x1x1 rhs_dilate=1x1x2x1}, to_apply=add\n"
           "  ROOT t = (f32[1,4,4,2], f32[1,14,2,2]) tuple(a, b)\n}\n",
           false);
}
END_TEST

/* Pooling and reduces that keep the minor dim run in the rows form
 * (kernel_loop.c, rows_window): per output row, whole input rows combined
 * window position by window position. Max and sum pools with padding,
 * window dilation and a fused bias and relu producer (at -O2), a mean
 * over the spatial dims of NHWC, a reduce of a middle and a major dim, and
 * a window over the minor dim (left to the general form); NaN and
 * infinities in the inputs; the results are the interpreter's bits. */
START_TEST(pooling_rows) {
  cg_check("HloModule pool\nmx { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] "
           "maximum(a, b) }\n"
           "add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }\n"
           "ENTRY main {\n  x = f32[2,9,9,16] parameter(0)\n  bias = f32[16] parameter(1)\n"
           "  y = f32[3,5,4,12] parameter(2)\n"
           "  bb = f32[2,9,9,16] broadcast(bias), dimensions={3}\n"
           "  s = f32[2,9,9,16] add(x, bb)\n  z = f32[] constant(0)\n"
           "  zb = f32[2,9,9,16] broadcast(z), dimensions={}\n"
           "  h = f32[2,9,9,16] maximum(s, zb)\n  ninf = f32[] constant(-inf)\n"
           "  a = f32[2,5,5,16] reduce-window(h, ninf), window={size=1x3x3x1 stride=1x2x2x1 "
           "pad=0_0x1_1x1_1x0_0}, to_apply=mx\n"
           "  b = f32[2,7,8,16] reduce-window(x, z), window={size=1x2x2x1 stride=1x1x1x1 "
           "rhs_dilate=1x2x1x1}, to_apply=add\n"
           "  m = f32[2,16] reduce(h, z), dimensions={1,2}, to_apply=add\n"
           "  r = f32[5,12] reduce(y, z), dimensions={0,2}, to_apply=add\n"
           "  c = f32[3,5,4,6] reduce-window(y, ninf), window={size=1x1x1x2 stride=1x1x1x2}, "
           "to_apply=mx\n"
           "  ROOT t = (f32[2,5,5,16], f32[2,7,8,16], f32[2,16], f32[5,12], f32[3,5,4,6]) "
           "tuple(a, b, m, r, c)\n}\n",
           true);
}
END_TEST

START_TEST(dots) {
  /* GEMM steps (plain, batched, transposed operands, column-major result)
   * and kernels (integers, bf16). */
  kiln_executable *e = cg_check_full(
      "HloModule dots\nENTRY main {\n"
      "  a = f32[4,6] parameter(0)\n  b = f32[6,5] parameter(1)\n"
      "  d0 = f32[4,5] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
      "  at = f32[4,6]{0,1} parameter(2)\n  bt = f32[6,5]{0,1} parameter(3)\n"
      "  d1 = f32[4,5]{0,1} dot(at, bt), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
      "  x = f64[2,6,4] parameter(4)\n  y = f64[2,5,6] parameter(5)\n"
      "  d2 = f64[2,4,5] dot(x, y), lhs_batch_dims={0}, rhs_batch_dims={0}, "
      "lhs_contracting_dims={1}, rhs_contracting_dims={2}\n"
      "  v = f32[6] parameter(6)\n  d3 = f32[4] dot(a, v), lhs_contracting_dims={1}, "
      "rhs_contracting_dims={0}\n"
      "  ia = s32[3,4] parameter(7)\n  ib = s32[4,2] parameter(8)\n"
      "  d4 = s32[3,2] dot(ia, ib), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
      "  ha = bf16[3,4] parameter(9)\n  hb = bf16[4,2] parameter(10)\n"
      "  d5 = bf16[3,2] dot(ha, hb), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
      "  ROOT t = (f32[4,5], f32[4,5]{0,1}, f64[2,4,5], f32[4], s32[3,2], bf16[3,2]) tuple(d0, d1, "
      "d2, d3, d4, d5)\n}\n",
      5, false, 1e-5, 0, true);
  uint32_t gemms = 0;
  for (uint32_t i = 0; i < e->programs[0].nsteps; i++)
    gemms += e->programs[0].steps[i].kind == KILN_STEP_GEMM;
  ck_assert_uint_eq(gemms, 4);
  kiln_executable_destroy(e);
}
END_TEST

/* The GEMM steps of program 0, in order, into g (at most n); returns how
 * many there are. */
static uint32_t gemm_steps(const kiln_executable *e, kiln_gemm *g, uint32_t n) {
  uint32_t k = 0;
  for (uint32_t i = 0; i < e->programs[0].nsteps; i++)
    if (e->programs[0].steps[i].kind == KILN_STEP_GEMM) {
      if (k < n) g[k] = e->programs[0].steps[i].gemm;
      k++;
    }
  return k;
}

/* After the pipeline every floating-point dot is a GEMM step, whatever its
 * dimension numbers: a projection of [batch, seq, d] (two lhs free dims,
 * merged by a bitcast), attention scores and context (batch dims {0,2}:
 * the operands are transposed first), a weight gradient (two contracting
 * dims) and a bf16 dot (run in f32). Small shapes run against the
 * interpreter; the transformer's own shapes are checked for the plan. */
START_TEST(dots_become_gemms) {
  static const char small[] =
      "HloModule dg\nENTRY main {\n"
      "  x = f32[2,6,8] parameter(0)\n  w = f32[8,5] parameter(1)\n"
      "  d0 = f32[2,6,5] dot(x, w), lhs_contracting_dims={2}, rhs_contracting_dims={0}\n"
      "  q = f32[2,6,3,4] parameter(2)\n  k = f32[2,6,3,4] parameter(3)\n"
      "  v = f32[2,6,3,4] parameter(4)\n"
      "  s = f32[2,3,6,6] dot(q, k), lhs_batch_dims={0,2}, rhs_batch_dims={0,2}, "
      "lhs_contracting_dims={3}, rhs_contracting_dims={3}\n"
      "  c = f32[2,3,6,4] dot(s, v), lhs_batch_dims={0,1}, rhs_batch_dims={0,2}, "
      "lhs_contracting_dims={3}, rhs_contracting_dims={1}\n"
      "  dy = f32[2,6,5] parameter(5)\n"
      "  dw = f32[8,5] dot(x, dy), lhs_contracting_dims={0,1}, rhs_contracting_dims={0,1}\n"
      "  hx = bf16[2,6,8] parameter(6)\n  hw = bf16[8,5] parameter(7)\n"
      "  h = bf16[2,6,5] dot(hx, hw), lhs_contracting_dims={2}, rhs_contracting_dims={0}\n"
      "  ROOT t = (f32[2,6,5], f32[2,3,6,4], f32[8,5], bf16[2,6,5]) tuple(d0, c, dw, h)\n}\n";
  kiln_gemm g[8];
  kiln_executable *e = cg_check_full(small, 3, false, 1e-5, 2, true);
  ck_assert_uint_eq(gemm_steps(e, g, 8), 5);
  kiln_executable_destroy(e);

  static const char big[] =
      "HloModule tb\nENTRY main {\n"
      "  x = f32[8,128,256] parameter(0)\n  w = f32[256,256] parameter(1)\n"
      "  p = f32[8,128,256] dot(x, w), lhs_contracting_dims={2}, rhs_contracting_dims={0}\n"
      "  r = f32[8,128,4,64] reshape(p)\n"
      "  s = f32[8,4,128,128] dot(r, r), lhs_batch_dims={0,2}, rhs_batch_dims={0,2}, "
      "lhs_contracting_dims={3}, rhs_contracting_dims={3}\n"
      "  c = f32[8,4,128,64] dot(s, r), lhs_batch_dims={0,1}, rhs_batch_dims={0,2}, "
      "lhs_contracting_dims={3}, rhs_contracting_dims={1}\n"
      "  ROOT t = (f32[8,128,256], f32[8,4,128,64]) tuple(p, c)\n}\n";
  /* Integer dots stay loops, K made minor on both sides; extreme values
   * wrap as the interpreter's do (32-bit and narrower accumulate in
   * uint32_t, 64-bit in uint64_t). */
  static const char ints[] =
      "HloModule di\nENTRY main {\n"
      "  x = s32[2,6,8] parameter(0)\n  w = s32[8,5] parameter(1)\n"
      "  d0 = s32[2,6,5] dot(x, w), lhs_contracting_dims={2}, rhs_contracting_dims={0}\n"
      "  a = u8[3,7,4] parameter(2)\n  b = u8[4,7,2] parameter(3)\n"
      "  d1 = u8[3,2] dot(a, b), lhs_contracting_dims={1,2}, rhs_contracting_dims={1,0}\n"
      "  c = s64[5,9] parameter(4)\n  e = s64[9,3] parameter(5)\n"
      "  d2 = s64[5,3] dot(c, e), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
      "  ROOT t = (s32[2,6,5], u8[3,2], s64[5,3]) tuple(d0, d1, d2)\n}\n";
  for (uint64_t seed = 1; seed < 4; seed++) cg_check_full(ints, seed, true, 0, 2, false);

  kiln_module *m = cg_parse(big);
  e = cg_compile(m, 2);
  ck_assert_uint_eq(gemm_steps(e, g, 8), 3);
  /* the projection: one [1024,256] x [256,256] product, no copy in front */
  ck_assert(g[0].batch == 1 && g[0].m == 1024 && g[0].n == 256 && g[0].k == 256);
  ck_assert_uint_eq(e->programs[0].steps[0].kind, KILN_STEP_GEMM);
  /* scores and context: 32 heads of 128x128x64 and 128x64x128 */
  ck_assert(g[1].batch == 32 && g[1].m == 128 && g[1].n == 128 && g[1].k == 64);
  ck_assert(g[2].batch == 32 && g[2].m == 128 && g[2].n == 64 && g[2].k == 128);
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
}
END_TEST

/* A dot operand whose written layout (JAX writes one on a transpose: the
 * bitcast of its operand) keeps the logical order the GEMM wants but not
 * the bytes: dot_canon copies it, once for both dots that read it, into
 * an order that keeps its minor dim minor, and both run as GEMMs; an
 * operand whose minor dim is a batch dim is copied into row-major (a
 * `copy`: the logical order is already the GEMM's). Results agree with the
 * interpreter. */
START_TEST(written_layout_operand_gemm) {
  static const char hlo[] =
      "HloModule wl\nENTRY main {\n"
      "  x = f32[2,6,12] parameter(0)\n  r = f32[2,6,3,4] reshape(x)\n"
      "  t = f32[2,3,4,6]{2,1,3,0} transpose(r), dimensions={0,2,3,1}\n"
      "  s = f32[2,3,6,5] parameter(1)\n  u = f32[2,3,6,7] parameter(2)\n"
      "  c = f32[2,3,4,5] dot(t, s), lhs_batch_dims={0,1}, rhs_batch_dims={0,1}, "
      "lhs_contracting_dims={3}, rhs_contracting_dims={2}\n"
      "  d = f32[2,3,4,7] dot(t, u), lhs_batch_dims={0,1}, rhs_batch_dims={0,1}, "
      "lhs_contracting_dims={3}, rhs_contracting_dims={2}\n"
      "  v = f32[2,3,4,6]{0,3,2,1} parameter(3)\n"
      "  w = f32[2,3,4,5] dot(v, s), lhs_batch_dims={0,1}, rhs_batch_dims={0,1}, "
      "lhs_contracting_dims={3}, rhs_contracting_dims={2}\n"
      "  ROOT o = (f32[2,3,4,5], f32[2,3,4,7], f32[2,3,4,5]) tuple(c, d, w)\n}\n";
  kiln_gemm g[4];
  for (uint64_t seed = 1; seed < 3; seed++) {
    kiln_executable *e = cg_check_full(hlo, seed, false, 1e-5, 2, true);
    ck_assert_uint_eq(gemm_steps(e, g, 4), 3);
    for (int j = 0; j < 3; j++) ck_assert(g[j].batch == 6 && g[j].k == 6);
    kiln_executable_destroy(e);
  }
  /* One transpose of t, shared by the two dots, and one copy of v. */
  kiln_module *m = cg_parse(hlo);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_pass_ctx ctx = {.st = &st, .opt_level = 2};
  kiln_id first = m->ninstrs;
  ck_assert_int_eq(kiln_pass_dot_canon(m, &ctx), 0);
  const kiln_computation *ent = kiln_module_entry(m);
  uint32_t copies = 0, transposes = 0;
  for (uint32_t i = 0; i < ent->ninstrs; i++) {
    const kiln_instr *x = m->instrs[ent->instrs[i]];
    if (x->id < first) continue;
    if (x->op == KILN_OP_TRANSPOSE) {
      transposes++;
      const kiln_i64s *p = kiln_instr_attr_ints(x, KILN_ATTR_DIMENSIONS);
      ck_assert(p && p->n == 4 && p->v[3] == 2);
    }
    if (x->op == KILN_OP_COPY) {
      copies++;
      ck_assert(kiln_shape_is_row_major(&x->shape));
    }
  }
  ck_assert_uint_eq(transposes, 1);
  ck_assert_uint_eq(copies, 1);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(convolutions) {
  cg_check("HloModule conv\nENTRY main {\n  p0 = f32[2,6,6,3] parameter(0)\n  p1 = f32[3,3,3,4] "
           "parameter(1)\n"
           "  a = f32[2,6,6,4] convolution(p0, p1), window={size=3x3 pad=1_1x1_1}, "
           "dim_labels=b01f_01io->b01f\n"
           "  g = f32[2,4,6,6] parameter(2)\n  k = f32[4,2,3,3] parameter(3)\n"
           "  b = f32[2,4,3,3] convolution(g, k), window={size=3x3 stride=2x2 pad=1_1x1_1 "
           "rhs_dilate=1x1}, "
           "dim_labels=bf01_oi01->bf01, feature_group_count=2\n"
           "  ROOT t = (f32[2,6,6,4], f32[2,4,3,3]) tuple(a, b)\n}\n",
           false);
}
END_TEST

START_TEST(map_calls_computation) {
  cg_check("HloModule mp\nf { x = f32[] parameter(0)  y = s32[] parameter(1)  c = f32[] convert(y) "
           " ROOT m = f32[] multiply(x, c) }\n"
           "ENTRY main {\n  a = f32[12] parameter(0)\n  b = s32[12] parameter(1)\n"
           "  ROOT m = f32[12] map(a, b), dimensions={0}, to_apply=f\n}\n",
           false);
}
END_TEST

/* ---- fusions ------------------------------------------------------------ */

static const char fusion_hlo[] =
    "HloModule fu\nadd { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) "
    "}\n"
    "f1 { a = f32[4,6] parameter(0)  b = f32[6] parameter(1)  bb = f32[4,6] broadcast(b), "
    "dimensions={1}\n"
    "  m = f32[4,6] multiply(a, bb)  ROOT e = f32[4,6] tanh(m) }\n"
    "f2 { a = f32[4,6] parameter(0)  e = f32[4,6] exponential(a)  z = f32[] constant(0)\n"
    "  ROOT r = f32[4] reduce(e, z), dimensions={1}, to_apply=add }\n"
    "f3 { a = f32[4,5] parameter(0)  b = f32[5,6] parameter(1)  c = f32[6] parameter(2)\n"
    "  d = f32[4,6] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    "  cb = f32[4,6] broadcast(c), dimensions={1}  s = f32[4,6] add(d, cb)  z = f32[] constant(0)\n"
    "  zb = f32[4,6] broadcast(z), dimensions={}  ROOT r = f32[4,6] maximum(s, zb) }\n"
    "f4 { a = f32[4,6] parameter(0)  n = f32[4,6] negate(a)  t = f32[6,4] transpose(a), "
    "dimensions={1,0}\n"
    "  z = f32[] constant(0)  r = f32[4] reduce(a, z), dimensions={1}, to_apply=add\n"
    "  ROOT tt = (f32[4,6], f32[6,4], f32[4]) tuple(n, t, r) }\n"
    "f5 { a = f32[3] parameter(0)  k = f32[3] constant({1.5, -2, 0.25})  ROOT m = f32[3] "
    "multiply(a, k) }\n"
    "f6 { a = f32[8,6] parameter(0)  u = f32[1,6] parameter(1)  i = s32[] parameter(2)  z = s32[] "
    "constant(0)\n"
    "  e = f32[1,6] exponential(u)  ROOT d = f32[8,6] dynamic-update-slice(a, e, i, z) }\n"
    "ENTRY main {\n  p0 = f32[4,6] parameter(0)\n  p1 = f32[6] parameter(1)\n"
    "  p2 = f32[4,5] parameter(2)\n  p3 = f32[5,6] parameter(3)\n  p4 = f32[3] parameter(4)\n"
    "  p5 = f32[8,6] parameter(5)\n  p6 = s32[] parameter(6)\n"
    "  a = f32[4,6] fusion(p0, p1), kind=kLoop, calls=f1\n"
    "  b = f32[4] fusion(a), kind=kInput, calls=f2\n"
    "  c = f32[4,6] fusion(p2, p3, p1), kind=kOutput, calls=f3\n"
    "  d = (f32[4,6], f32[6,4], f32[4]) fusion(c), kind=kLoop, calls=f4\n"
    "  e = f32[3] fusion(p4), kind=kLoop, calls=f5\n"
    "  n5 = f32[8,6] negate(p5)\n  s = f32[1,6] slice(p0), slice={[0:1], [0:6]}\n"
    "  g = f32[8,6] fusion(n5, s, p6), kind=kLoop, calls=f6\n"
    "  ROOT t = (f32[4], f32[4,6], (f32[4,6], f32[6,4], f32[4]), f32[3], f32[8,6]) tuple(b, a, d, "
    "e, g)\n}\n";

START_TEST(fusion_kinds) {
  kiln_executable *e = cg_check_full(fusion_hlo, 11, false, 1e-5, 0, true);
  uint32_t gemm = 0, copies = 0;
  for (uint32_t i = 0; i < e->programs[0].nsteps; i++) {
    gemm += e->programs[0].steps[i].kind == KILN_STEP_GEMM;
    copies += e->programs[0].steps[i].kind == KILN_STEP_COPY;
  }
  ck_assert_uint_eq(gemm, 1);   /* kOutput: GEMM + epilogue */
  ck_assert_uint_eq(copies, 0); /* the fused update writes over its dead operand */
  kiln_executable_destroy(e);
}
END_TEST

/* ---- control flow ------------------------------------------------------- */

START_TEST(while_loop) {
  cg_check(
      "HloModule wl\n"
      "cond { p = (s32[], f32[4], f32[4]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
      "  n = s32[] constant(5)  ROOT lt = pred[] compare(i, n), direction=LT }\n"
      "body { p = (s32[], f32[4], f32[4]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
      "  x = f32[4] get-tuple-element(p), index=1  y = f32[4] get-tuple-element(p), index=2\n"
      "  one = s32[] constant(1)  i2 = s32[] add(i, one)  h = f32[] constant(0.5)\n"
      "  hb = f32[4] broadcast(h), dimensions={}  x2 = f32[4] multiply(x, hb)  x3 = f32[4] add(x2, "
      "y)\n"
      "  ROOT t = (s32[], f32[4], f32[4]) tuple(i2, y, x3) }\n"
      "ENTRY main {\n  p0 = f32[4] parameter(0)\n  p1 = f32[4] parameter(1)\n  z = s32[] "
      "constant(0)\n"
      "  t = (s32[], f32[4], f32[4]) tuple(z, p0, p1)\n"
      "  w = (s32[], f32[4], f32[4]) while(t), condition=cond, body=body\n"
      "  g1 = f32[4] get-tuple-element(w), index=1\n  g2 = f32[4] get-tuple-element(w), index=2\n"
      "  ROOT r = (f32[4], f32[4]) tuple(g1, g2)\n}\n",
      false);
}
END_TEST

START_TEST(while_swaps_state) {
  /* The body's result permutes the state: copies go through staging. */
  cg_check(
      "HloModule sw\n"
      "cond { p = (s32[], f32[3], f32[3]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
      "  n = s32[] constant(3)  ROOT lt = pred[] compare(i, n), direction=LT }\n"
      "body { p = (s32[], f32[3], f32[3]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
      "  x = f32[3] get-tuple-element(p), index=1  y = f32[3] get-tuple-element(p), index=2\n"
      "  one = s32[] constant(1)  i2 = s32[] add(i, one)\n"
      "  ROOT t = (s32[], f32[3], f32[3]) tuple(i2, y, x) }\n"
      "ENTRY main {\n  p0 = f32[3] parameter(0)\n  p1 = f32[3] parameter(1)\n  z = s32[] "
      "constant(0)\n"
      "  t = (s32[], f32[3], f32[3]) tuple(z, p0, p1)\n"
      "  ROOT w = (s32[], f32[3], f32[3]) while(t), condition=cond, body=body\n}\n",
      false);
}
END_TEST

START_TEST(while_passthrough_not_overwritten) {
  /* x's last read in the body is sine(x), but x also passes through to the
   * result: sine must not write over the state leaf x lives in. */
  cg_check(
      "HloModule pt\n"
      "cond { p = (s32[], f32[5], f32[5]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
      "  n = s32[] constant(3)  ROOT lt = pred[] compare(i, n), direction=LT }\n"
      "body { p = (s32[], f32[5], f32[5]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
      "  x = f32[5] get-tuple-element(p), index=1  y = f32[5] get-tuple-element(p), index=2\n"
      "  s = f32[5] sine(x)  a = f32[5] add(s, y)  one = s32[] constant(1)  i2 = s32[] add(i, "
      "one)\n"
      "  ROOT t = (s32[], f32[5], f32[5]) tuple(i2, x, a) }\n"
      "ENTRY main {\n  p0 = f32[5] parameter(0)\n  p1 = f32[5] parameter(1)\n  z = s32[] "
      "constant(0)\n"
      "  t = (s32[], f32[5], f32[5]) tuple(z, p0, p1)\n"
      "  ROOT w = (s32[], f32[5], f32[5]) while(t), condition=cond, body=body\n}\n",
      false);
}
END_TEST

START_TEST(scan_moves_no_arrays) {
  /* lax.scan as JAX exports it: slices and updates through calls, the
   * weights passed through. A step copies at most the counter. */
  const char *hlo =
      "HloModule sc\n"
      "ds { a = f32[8,16] parameter(0)  i = s32[] parameter(1)  z = s32[] constant(0)\n"
      "  s = f32[1,16] dynamic-slice(a, i, z), dynamic_slice_sizes={1,16}\n"
      "  ROOT r = f32[16] reshape(s) }\n"
      "dus { a = f32[8,16] parameter(0)  u = f32[16] parameter(1)  i = s32[] parameter(2)\n"
      "  z = s32[] constant(0)  r = f32[1,16] reshape(u)\n"
      "  ROOT d = f32[8,16] dynamic-update-slice(a, r, i, z) }\n"
      "cond { p = (s32[], f32[16], f32[8,16], f32[8,16], f32[16]) parameter(0)\n"
      "  i = s32[] get-tuple-element(p), index=0  n = s32[] constant(8)\n"
      "  ROOT lt = pred[] compare(i, n), direction=LT }\n"
      "body { p = (s32[], f32[16], f32[8,16], f32[8,16], f32[16]) parameter(0)\n"
      "  i = s32[] get-tuple-element(p), index=0  h = f32[16] get-tuple-element(p), index=1\n"
      "  ys = f32[8,16] get-tuple-element(p), index=2\n"
      "  xs = f32[8,16] get-tuple-element(p), index=3  w = f32[16] get-tuple-element(p), index=4\n"
      "  x = f32[16] call(xs, i), to_apply=ds  y = f32[16] multiply(x, w)  h2 = f32[16] add(y, h)\n"
      "  ys2 = f32[8,16] call(ys, h2, i), to_apply=dus  one = s32[] constant(1)\n"
      "  i2 = s32[] add(i, one)\n"
      "  ROOT t = (s32[], f32[16], f32[8,16], f32[8,16], f32[16]) tuple(i2, h2, ys2, xs, w) }\n"
      "ENTRY main {\n  xs = f32[8,16] parameter(0)\n  w = f32[16] parameter(1)\n"
      "  h = f32[16] parameter(2)  z = s32[] constant(0)  zf = f32[] constant(0)\n"
      "  ys = f32[8,16] broadcast(zf), dimensions={}\n"
      "  t = (s32[], f32[16], f32[8,16], f32[8,16], f32[16]) tuple(z, h, ys, xs, w)\n"
      "  l = (s32[], f32[16], f32[8,16], f32[8,16], f32[16]) while(t), condition=cond, "
      "body=body\n"
      "  l1 = f32[16] get-tuple-element(l), index=1  l2 = f32[8,16] get-tuple-element(l), "
      "index=2\n"
      "  ROOT r = (f32[16], f32[8,16]) tuple(l1, l2)\n}\n";
  for (int opt = 0; opt <= 2; opt += 2) {
    kiln_executable *e = cg_check_full(hlo, 5, false, 1e-6, opt, true);
    for (uint32_t p = 1; p < e->nprograms; p++)
      for (uint32_t i = 0; i < e->programs[p].nsteps; i++) {
        const kiln_step *s = &e->programs[p].steps[i];
        if (s->kind == KILN_STEP_COPY)
          ck_assert_msg(s->range <= 4, "program %u copies %llu bytes", p,
                        (unsigned long long)s->range);
      }
    kiln_executable_destroy(e);
  }
}
END_TEST

START_TEST(conditional_and_call) {
  const char *hlo =
      "HloModule cd\nb0 { p = f32[3] parameter(0)  ROOT n = f32[3] negate(p) }\n"
      "b1 { p = f32[3] parameter(0)  ROOT n = f32[3] exponential(p) }\n"
      "b2 { p = f32[3] parameter(0)  ROOT n = f32[3] sine(p) }\n"
      "c1 { x = f32[3] parameter(0)  y = f32[3] parameter(1)  ROOT m = f32[3] multiply(x, y) }\n"
      "ENTRY main {\n  p0 = f32[3] parameter(0)\n  k = s32[] parameter(1)\n  q = pred[] "
      "parameter(2)\n"
      "  c = f32[3] conditional(k, p0, p0, p0), branch_computations={b0, b1, b2}\n"
      "  d = f32[3] conditional(q, p0, c), true_computation=b1, false_computation=b0\n"
      "  e = f32[3] call(c, d), to_apply=c1\n"
      "  f = f32[3] call(e, c), to_apply=c1\n"
      "  ROOT t = (f32[3], f32[3], f32[3], f32[3]) tuple(c, d, e, f)\n}\n";
  for (uint64_t seed = 1; seed < 8; seed++) cg_check_full(hlo, seed, true, 1e-6, 0, false);
}
END_TEST

START_TEST(tuple_parameters_and_passthrough) {
  cg_check(
      "HloModule tp\nENTRY main {\n  p = (f32[3], (s32[2], pred[4])) parameter(0)\n"
      "  a = f32[3] get-tuple-element(p), index=0\n  t = (s32[2], pred[4]) get-tuple-element(p), "
      "index=1\n"
      "  b = s32[2] get-tuple-element(t), index=0\n  k = f32[2] constant({1, 2})\n"
      "  ROOT r = (f32[3], (s32[2], pred[4]), s32[2], f32[2], f32[3]) tuple(a, t, b, k, a)\n}\n",
      false);
}
END_TEST

static const char mlp_hlo[] =
    "HloModule mlp\nmax { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT m = f32[] "
    "maximum(a, b) }\n"
    "add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }\n"
    "ENTRY main {\n  x = f32[32,784] parameter(0)\n  w1 = f32[784,128] parameter(1)\n  b1 = "
    "f32[128] parameter(2)\n"
    "  w2 = f32[128,10] parameter(3)\n  b2 = f32[10] parameter(4)\n"
    "  h = f32[32,128] dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    "  bb1 = f32[32,128] broadcast(b1), dimensions={1}\n  h1 = f32[32,128] add(h, bb1)\n"
    "  z = f32[] constant(0)\n  zb = f32[32,128] broadcast(z), dimensions={}\n  r = f32[32,128] "
    "maximum(h1, zb)\n"
    "  o = f32[32,10] dot(r, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    "  bb2 = f32[32,10] broadcast(b2), dimensions={1}\n  l = f32[32,10] add(o, bb2)\n"
    "  ninf = f32[] constant(-inf)\n  mx = f32[32] reduce(l, ninf), dimensions={1}, to_apply=max\n"
    "  mxb = f32[32,10] broadcast(mx), dimensions={0}\n  sh = f32[32,10] subtract(l, mxb)\n"
    "  e = f32[32,10] exponential(sh)\n  s = f32[32] reduce(e, z), dimensions={1}, to_apply=add\n"
    "  sb = f32[32,10] broadcast(s), dimensions={0}\n  ROOT p = f32[32,10] divide(e, sb)\n}\n";

/* The same programs through the whole pipeline (fusion, layout assignment,
 * scheduling) before code generation. */
START_TEST(full_pipeline) {
  const char *const mods[] = {fusion_hlo, mlp_hlo};
  for (size_t i = 0; i < sizeof mods / sizeof *mods; i++)
    cg_check_full(mods[i], 21, false, 1e-5, 2, false);
}
END_TEST

/* ---- refusals and failures ---------------------------------------------- */

static int compile_status(const char *hlo, const kiln_compile_options *o, kiln_status *st) {
  kiln_module *m = cg_parse(hlo);
  kiln_executable *e = NULL;
  kiln_status_clear(st);
  int rc = kiln_compile(m, o, &e, NULL, st);
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
  return rc;
}

/* The generated C of `hlo` (the pipeline's kernels.c, from a dump), in a
 * static buffer that the next call overwrites. */
static const char *kernels_source(const char *hlo) {
  static char src[1 << 20];
  char dir[] = "/tmp/kiln-cgsrc-XXXXXX", path[300], cmd[400];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.dump_dir = dir;
  kiln_status st;
  ck_assert_msg(compile_status(hlo, &o, &st) == 0, "%s: %s", st.where, st.msg);
  snprintf(path, sizeof path, "%s/kernels.c", dir);
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(src, 1, sizeof src - 1, f);
  fclose(f);
  src[n] = 0;
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
  return src;
}

/* The row kernel of a softmax, in its source: one kernel; exp written once
 * (the sum's pass keeps it in a row temporary that the output loop reads);
 * the output loop over the row calls no reducer. */
START_TEST(row_kernel_source) {
  const char *hlo =
      "HloModule sm\nmx { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT m = f32[] "
      "maximum(a, b) }\nad { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] "
      "add(a, b) }\nENTRY main {\n  p = f32[64,256] parameter(0)\n  ninf = f32[] constant(-inf)\n"
      "  m = f32[64] reduce(p, ninf), dimensions={1}, to_apply=mx\n"
      "  mb = f32[64,256] broadcast(m), dimensions={0}\n  d = f32[64,256] subtract(p, mb)\n"
      "  e = f32[64,256] exponential(d)\n  z = f32[] constant(0)\n"
      "  s = f32[64] reduce(e, z), dimensions={1}, to_apply=ad\n"
      "  sb = f32[64,256] broadcast(s), dimensions={0}\n  ROOT o = f32[64,256] divide(e, sb)\n}\n";
  const char *src = kernels_source(hlo);
  const char *k0 = strstr(src, "void kiln_kernel_0");
  ck_assert_ptr_nonnull(k0);
  ck_assert_ptr_null(strstr(src, "void kiln_kernel_1"));
  int exps = 0;
  for (const char *q = k0; (q = strstr(q, "kexpf(")) != NULL; q++) exps++;
  ck_assert_int_eq(exps, 1);
  const char *row = strstr(k0, "for (int64_t j = 0;");
  ck_assert_ptr_nonnull(row);
  for (const char *q = row; (q = strstr(q, "kf")) != NULL; q++)
    ck_assert_msg(!isdigit((unsigned char)q[2]), "a reducer in the loop over the row:\n%s", row);
  cg_check_full(hlo, 5, false, 8 * kiln_tol_reduce_f32(256), 2, false);
}
END_TEST

/* A computation of one value for the whole kernel (Adam's bias correction
 * 1 - 0.9^t of a step count t) is computed once, before the loop over the
 * elements, and the loop reads its variable. */
START_TEST(scalar_hoisted_before_loop) {
  const char *hlo =
      "HloModule adam\nENTRY main {\n  p = f32[64,128] parameter(0)\n  m = f32[64,128] "
      "parameter(1)\n  t = f32[1] parameter(2)\n  b = f32[1] constant({0.9})\n"
      "  bt = f32[1] power(b, t)\n  one = f32[1] constant({1})\n  c = f32[1] subtract(one, bt)\n"
      "  cs = f32[] reshape(c)\n  cb = f32[64,128] broadcast(cs), dimensions={}\n"
      "  mh = f32[64,128] divide(m, cb)\n  ROOT o = f32[64,128] subtract(p, mh)\n}\n";
  const char *src = kernels_source(hlo);
  const char *k0 = strstr(src, "void kiln_kernel_0");
  ck_assert_ptr_nonnull(k0);
  const char *pw = strstr(k0, "kpowd("), *loop = strstr(k0, "for (");
  ck_assert_ptr_nonnull(pw);
  ck_assert_ptr_nonnull(loop);
  ck_assert_msg(pw < loop, "the power is computed in the loop:\n%s", k0);
  ck_assert_ptr_null(strstr(loop, "kpowd("));
  cg_check_full(hlo, 9, false, 4 * KILN_TOL_F32_EPS, 2, false);
}
END_TEST

/* A reduce over the major dim of a transposed value (a per-example
 * gradient's batch sum): the kept dims run in the input's order, rows of
 * its minor dim (j, 24 long) innermost, so the loop reads the input
 * consecutively into accumulators on the stack, and each output is then
 * stored where the output's layout puts it. */
START_TEST(reduce_rows_permuted) {
  const char *hlo =
      "HloModule permred\nad { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] "
      "add(a, b) }\nENTRY main {\n  p = f32[16,8,24] parameter(0)\n  s = f32[16] parameter(1)\n"
      "  t = f32[16,24,8]{1,2,0} transpose(p), dimensions={0,2,1}\n"
      "  sb = f32[16,24,8]{1,2,0} broadcast(s), dimensions={0}\n"
      "  m = f32[16,24,8]{1,2,0} multiply(t, sb)\n  z = f32[] constant(0)\n"
      "  ROOT r = f32[24,8] reduce(m, z), dimensions={0}, to_apply=ad\n}\n";
  const char *src = kernels_source(hlo);
  /* The input is read at r * 192 + o1 * 24 + j, j the fastest. */
  ck_assert_msg(strstr(src, "for (int64_t j = 0; j < 24LL; j++)") != NULL, "no row loop:\n%s", src);
  ck_assert_msg(strstr(src, "o1 * 24 + j]") != NULL, "not in the input's order:\n%s", src);
  ck_assert_msg(strstr(src, "[j * 8 + o1] = a0[") != NULL, "not stored by the output's layout:\n%s",
                src);
  cg_check_full(hlo, 11, false, 4 * kiln_tol_reduce_f32(16), 2, false);
}
END_TEST

/* A reduce over dims {1,2} of a [4,64,32]{1,2,0} value: dim 1 is the
 * physically minor one, so its loop is innermost and runs in vector lanes,
 * though dim 2 comes after it logically. */
START_TEST(reduce_loops_physical_order) {
  const char *hlo =
      "HloModule po\nad { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] "
      "add(a, b) }\nENTRY main {\n  p = f32[4,64,32]{1,2,0} parameter(0)\n"
      "  q = f32[4,64,32]{1,2,0} multiply(p, p)\n  z = f32[] constant(0)\n"
      "  ROOT r = f32[4] reduce(q, z), dimensions={1,2}, to_apply=ad\n}\n";
  const char *src = kernels_source(hlo);
  ck_assert_ptr_nonnull(strstr(src, "l < 16; l++)"));
  ck_assert_ptr_nonnull(strstr(src, "o0 * 2048 + (r"));
  cg_check_full(hlo, 13, false, 4 * kiln_tol_reduce_f32(2048), 2, false);
}
END_TEST

/* A divide by a value computed once per row multiplies by its reciprocal
 * (emit_elementwise.c), except where the reciprocal would be subnormal
 * and flushed to zero: here every row's divisor is at least 1e38. */
START_TEST(row_divide_reciprocal) {
  const char *hlo =
      "HloModule rd\nmx { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT m = f32[] "
      "maximum(a, b) }\nENTRY main {\n  p = f32[8,64] parameter(0)\n"
      "  c37 = f32[] constant(1e37)\n  c38 = f32[] constant(1e38)\n"
      "  b37 = f32[8,64] broadcast(c37), dimensions={}\n"
      "  b38 = f32[8,64] broadcast(c38), dimensions={}\n  a = f32[8,64] abs(p)\n"
      "  t = f32[8,64] multiply(a, b37)\n  q = f32[8,64] add(t, b38)\n"
      "  ninf = f32[] constant(-inf)\n  m = f32[8] reduce(q, ninf), dimensions={1}, to_apply=mx\n"
      "  mb = f32[8,64] broadcast(m), dimensions={0}\n  n = f32[8,64] multiply(p, b37)\n"
      "  ROOT o = f32[8,64] divide(n, mb)\n}\n";
  const char *src = kernels_source(hlo);
  ck_assert_ptr_nonnull(strstr(src, "0x1p126f ? "));
  ck_assert_ptr_nonnull(strstr(src, "KWIDE;"));
  /* As a cpu run computes: subnormal results flushed to zero. */
  unsigned saved = kiln__cpu_flush_denormals();
  cg_check_full(hlo, 7, false, 4 * KILN_TOL_F32_EPS, 2, false);
  kiln__cpu_restore_denormals(saved);
}
END_TEST

/* A kernel that computes exp (or another transcendental) per element is
 * bound by its arithmetic and declared KWIDE (512-bit vectors), whether a
 * reduce (a logsumexp's sum of exps, along rows and along columns) or an
 * elementwise kernel; one of adds and a max only is not. Results as the
 * interpreter's either way. */
START_TEST(transcendental_kernels_wide) {
  const char *lse =
      "HloModule lse\nad { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] "
      "add(a, b) }\nENTRY main {\n  p = f32[32,64] parameter(0)\n  q = f32[64] parameter(1)\n"
      "  qb = f32[32,64] broadcast(q), dimensions={1}\n  x = f32[32,64] add(p, qb)\n"
      "  e = f32[32,64] exponential(x)\n  z = f32[] constant(0)\n"
      "  r = f32[32] reduce(e, z), dimensions={1}, to_apply=ad\n"
      "  c = f32[64] reduce(e, z), dimensions={0}, to_apply=ad\n"
      "  ROOT t = (f32[32], f32[64]) tuple(r, c)\n}\n";
  const char *src = kernels_source(lse);
  ck_assert_msg(strstr(src, "KWIDE;") != NULL, "the logsumexp kernels are not wide");
  cg_check_full(lse, 5, false, 1e-5, 2, false);
  src = kernels_source("HloModule ew\nENTRY main {\n  p = f32[256] parameter(0)\n"
                       "  ROOT t = f32[256] tanh(p)\n}\n");
  ck_assert_msg(strstr(src, "KWIDE;") != NULL, "the tanh kernel is not wide");
  const char *plain =
      "HloModule pl\nmx { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT m = f32[] "
      "maximum(a, b) }\nENTRY main {\n  p = f32[32,64] parameter(0)\n  q = f32[64] parameter(1)\n"
      "  qb = f32[32,64] broadcast(q), dimensions={1}\n  x = f32[32,64] add(p, qb)\n"
      "  z = f32[] constant(-inf)\n"
      "  ROOT c = f32[64] reduce(x, z), dimensions={0}, to_apply=mx\n}\n";
  src = kernels_source(plain);
  ck_assert_msg(strstr(src, "KWIDE;") == NULL, "a kernel without a transcendental is wide");
  cg_check_full(plain, 5, false, 0, 2, false);
}
END_TEST

START_TEST(unsupported_ops_named) {
  kiln_status st;
  int rc =
      compile_status("HloModule u\nENTRY main {\n  p = f32[4] parameter(0)\n"
                     "  ROOT c.3 = f32[4] custom-call(p), custom_call_target=\"my_target\"\n}\n",
                     NULL, &st);
  ck_assert_int_eq(rc, KILN_EUNIMPL);
  ck_assert_str_eq(st.where, "main/c.3");
  ck_assert_str_eq(st.msg, "the cpu backend cannot compile custom-call main/c.3 yet");
  rc = compile_status("HloModule u\nENTRY main {\n  p = c64[4] parameter(0)\n"
                      "  ROOT n = c64[4] sqrt(p)\n}\n",
                      NULL, &st);
  ck_assert_int_eq(rc, KILN_EUNIMPL);
  ck_assert_str_eq(st.msg, "the cpu backend cannot compile sqrt main/n on c64 values");
  rc = compile_status("HloModule u\nENTRY main {\n  p = f32[8] parameter(0)\n"
                      "  ROOT r = f32[8] rng-bit-generator(p), algorithm=rng_default\n}\n",
                      NULL, &st);
  rc = compile_status("HloModule u\nENTRY main {\n  p = bf16[5,5] parameter(0)\n"
                      "  ROOT ch = bf16[5,5] cholesky(p), lower=true\n}\n",
                      NULL, &st);
  ck_assert_int_eq(rc, KILN_EUNIMPL);
  ck_assert_str_eq(st.msg, "cholesky main/ch: the cpu backend cannot compile this cholesky: "
                           "cholesky of bf16 values is not supported yet (f32 and f64 are)");
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.target = "interp"; /* a row without a code generator */
  rc = compile_status("HloModule u\nENTRY main {\n  ROOT p = f32[8] parameter(0)\n}\n", &o, &st);
  ck_assert_int_eq(rc, KILN_EUNIMPL);
  o.target = "vax";
  rc = compile_status("HloModule u\nENTRY main {\n  ROOT p = f32[8] parameter(0)\n}\n", &o, &st);
  ck_assert_int_eq(rc, KILN_ENOTFOUND);
  ck_assert_msg(strncmp(st.msg, "unknown target 'vax' (known: cpu, ", 34) == 0, "%s", st.msg);
}
END_TEST

static const char simple_hlo[] =
    "HloModule s\nENTRY main {\n  p = f32[8] parameter(0)\n  ROOT e = f32[8] exponential(p)\n}\n";

static void write_script(const char *path, const char *body) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(body, f);
  fclose(f);
  chmod(path, 0755);
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

START_TEST(compiler_failure_and_timeout) {
  char dir[] = "/tmp/kiln-cgtest-XXXXXX", bad[300], slow[300], tmp[300];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(bad, sizeof bad, "%s/badcc", dir);
  snprintf(slow, sizeof slow, "%s/slowcc", dir);
  snprintf(tmp, sizeof tmp, "%s/tmp", dir);
  mkdir(tmp, 0700);
  setenv("TMPDIR", tmp, 1);
  write_script(
      bad, "#!/bin/sh\ncat >/dev/null\necho 'kernels.c:1: error: something broke' >&2\nexit 3\n");
  write_script(slow, "#!/bin/sh\nsleep 30\n");
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  kiln_status st;
  o.cc = bad;
  ck_assert_int_eq(compile_status(simple_hlo, &o, &st), KILN_EINTERNAL);
  ck_assert_ptr_nonnull(
      strstr(st.msg, "the C compiler failed (status 3): kernels.c:1: error: something broke"));
  o.cc = slow;
  o.cc_timeout_s = 0.5;
  ck_assert_int_eq(compile_status(simple_hlo, &o, &st), KILN_ELIMIT);
  ck_assert_str_eq(st.msg, "the C compiler took longer than 0 s");
  o.cc = "/nonexistent/kiln-cc";
  ck_assert_int_eq(compile_status(simple_hlo, &o, &st), KILN_ENOTFOUND);
  /* KILN_CC is honoured when no compiler is given. */
  o.cc = NULL;
  o.cc_timeout_s = 0;
  setenv("KILN_CC", bad, 1);
  ck_assert_int_eq(compile_status(simple_hlo, &o, &st), KILN_EINTERNAL);
  unsetenv("KILN_CC");
  ck_assert_int_eq(compile_status(simple_hlo, &o, &st), 0);
  ck_assert_int_eq(count_entries(tmp), 0); /* no temporary files left */
  unlink(bad);
  unlink(slow);
  rmdir(tmp);
  rmdir(dir);
}
END_TEST

START_TEST(no_client_strings_in_source) {
  char dir[] = "/tmp/kiln-cgsrc-XXXXXX", path[300];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  const char *hlo = "HloModule evil_module\n"
                    "evil_reducer_name { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = "
                    "f32[] add(a, b) }\n"
                    "ENTRY main {\n  system_rm_rf = f32[8] parameter(0), "
                    "metadata={op_name=\"__asm__ injected\"}\n"
                    "  z = f32[] constant(0)\n"
                    "  evil_instruction_name = f32[] reduce(system_rm_rf, z), dimensions={0}, "
                    "to_apply=evil_reducer_name\n"
                    "  ROOT r = f32[] sine(evil_instruction_name)\n}\n";
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.dump_dir = dir;
  kiln_status st;
  ck_assert_int_eq(compile_status(hlo, &o, &st), 0);
  snprintf(path, sizeof path, "%s/kernels.c", dir);
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  static char src[1 << 20];
  size_t n = fread(src, 1, sizeof src - 1, f);
  fclose(f);
  src[n] = 0;
  ck_assert_ptr_null(strstr(src, "evil"));
  ck_assert_ptr_null(strstr(src, "system_rm_rf"));
  ck_assert_ptr_null(strstr(src, "injected"));
  ck_assert_ptr_nonnull(strstr(src, "kiln_kernel_0"));
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* ---- f32 math in f32: ULP bounds ----------------------------------------- */

static double ref_logistic(double x) { return 1.0 / (1.0 + exp(-x)); }

/* Each prelude f32 helper, compiled as a kernel over a dense sweep of f32
 * inputs (every 4099th bit pattern, so every binade of both signs, NaNs
 * and infinities included, plus [-6, 6] by 2^-15 and the edges), against
 * the correctly rounded result (libm in double, rounded once: what the
 * interpreter computes), within its bound of tolerance.h. */
START_TEST(f32_math_ulp_bounds) {
  static const struct {
    const char *op;
    double (*ref)(double);
    uint32_t bound;
  } fns[] = {
      {"exponential", exp, KILN_TOL_ULP_EXP},
      {"log", log, KILN_TOL_ULP_LOG},
      {"log-plus-one", log1p, KILN_TOL_ULP_LOG1P},
      {"exponential-minus-one", expm1, KILN_TOL_ULP_EXPM1},
      {"tanh", tanh, KILN_TOL_ULP_TANH},
      {"logistic", ref_logistic, KILN_TOL_ULP_LOGISTIC},
      {"erf", erf, KILN_TOL_ULP_ERF},
      {"sine", sin, KILN_TOL_ULP_SIN},
      {"cosine", cos, KILN_TOL_ULP_COS},
      {"tan", tan, KILN_TOL_ULP_TAN},
  };
  enum { NF = sizeof fns / sizeof fns[0] };
  static const float edges[] = {0.0f,    -0.0f,     INFINITY,   -INFINITY, NAN,       1.0f,
                                -1.0f,   0x1p-149f, -0x1p-149f, 0x1p-126f, 88.72f,    88.73f,
                                -103.9f, -104.1f,   20.0f,      30.0f,     -30.0f,    4.0f,
                                -4.0f,   10.0f,     -10.0f,     0x1p-24f,  -0x1p-24f, 3e38f};
  int64_t n = 0, cap = (int64_t)(UINT32_MAX / 4099u) + 1 + 393216 + 32;
  float *x = kiln_malloc((size_t)cap * sizeof *x);
  ck_assert_ptr_nonnull(x);
  for (uint64_t u = 0; u <= UINT32_MAX; u += 4099u) {
    uint32_t b = (uint32_t)u;
    memcpy(&x[n++], &b, 4);
  }
  for (int i = -196608; i < 196608; i++) x[n++] = (float)i * 0x1p-15f;
  for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) x[n++] = edges[i];
  kiln_sbuf b = KILN_SBUF_INIT, root = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b, "HloModule ulp\nENTRY main {\n  a = f32[%lld] parameter(0)\n", (long long)n);
  for (int i = 0; i < NF; i++) {
    kiln_sbuf_printf(&b, "  r%d = f32[%lld] %s(a)\n", i, (long long)n, fns[i].op);
    kiln_sbuf_printf(&root, "%sf32[%lld]", i ? ", " : "", (long long)n);
  }
  kiln_sbuf_printf(&b, "  ROOT t = (%s) tuple(", kiln_sbuf_str(&root));
  for (int i = 0; i < NF; i++) kiln_sbuf_printf(&b, "%sr%d", i ? ", " : "", i);
  kiln_sbuf_puts(&b, ")\n}\n");
  kiln_module *m = cg_parse(kiln_sbuf_str(&b));
  kiln_executable *e = cg_compile(m, 0);
  kiln_literal *arg = NULL, *got = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_literal_create(NULL,
                                       &kiln_computation_param(m, kiln_module_entry(m), 0)->shape,
                                       0, &arg, &st),
                   0);
  for (int64_t i = 0; i < n; i++) kiln_literal_set_f64(arg, i, x[i]);
  cg_execute(e, &arg, &got);
  for (int f = 0; f < NF; f++) {
    const kiln_literal *out = got->elems[f];
    uint32_t worst = 0;
    float at = 0;
    for (int64_t i = 0; i < n; i++) {
      float want = (float)fns[f].ref((double)x[i]);
      uint32_t d = kiln_tol_ulp_f32((float)kiln_literal_get_f64(out, i), want);
      if (d > worst) {
        worst = d;
        at = x[i];
      }
    }
    ck_assert_msg(worst <= fns[f].bound, "f32 %s: %u ULPs at %a (bound %u): %a vs %a", fns[f].op,
                  worst, (double)at, fns[f].bound, (double)(float)kiln_literal_get_f64(out, 0),
                  (double)(float)fns[f].ref(at));
  }
  kiln_literal_destroy(arg);
  kiln_literal_destroy(got);
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
  kiln_sbuf_free(&b);
  kiln_sbuf_free(&root);
  kiln_free(x);
}
END_TEST

/* f32 -> bf16 converts (krbf, branch-free) against the interpreter, bit for
 * bit: for every bf16 value the f32s at its rounding boundaries (low half
 * 0x7fff, 0x8000, 0x8001, and 0 and 0xffff), so every tie, every carry into
 * the exponent, f32 subnormals, overflow to infinity and NaNs of both
 * signs (a NaN only needs to stay a NaN of its sign). */
START_TEST(bf16_convert_rounding) {
  static const uint32_t lows[] = {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
  int64_t n = 65536 * 5;
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b,
                   "HloModule bf\nENTRY main {\n  a = f32[%lld] parameter(0)\n"
                   "  ROOT r = bf16[%lld] convert(a)\n}\n",
                   (long long)n, (long long)n);
  kiln_module *m = cg_parse(kiln_sbuf_str(&b));
  kiln_executable *e = cg_compile(m, 0);
  kiln_literal *arg = NULL, *got = NULL, *want = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_literal_create(NULL,
                                       &kiln_computation_param(m, kiln_module_entry(m), 0)->shape,
                                       0, &arg, &st),
                   0);
  uint32_t *in = arg->data;
  for (uint32_t hi = 0; hi < 65536; hi++)
    for (int k = 0; k < 5; k++) in[hi * 5 + (uint32_t)k] = hi << 16 | lows[k];
  cg_execute(e, &arg, &got);
  ck_assert_int_eq(kiln_interp_run(m, (const kiln_literal *const *)&arg, 1, NULL, &want, &st), 0);
  const uint16_t *g = got->data, *w = want->data;
  for (int64_t i = 0; i < n; i++) {
    bool gnan = (g[i] & 0x7f80u) == 0x7f80u && (g[i] & 0x7fu);
    bool wnan = (w[i] & 0x7f80u) == 0x7f80u && (w[i] & 0x7fu);
    if (wnan) {
      ck_assert_msg(gnan && (g[i] & 0x8000u) == (w[i] & 0x8000u), "%08x: %04x, want a NaN %04x",
                    in[i], g[i], w[i]);
      continue;
    }
    ck_assert_msg(g[i] == w[i], "f32 %08x -> bf16 %04x, the interpreter %04x", in[i], g[i], w[i]);
  }
  kiln_literal_destroy(arg);
  kiln_literal_destroy(got);
  kiln_literal_destroy(want);
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
  kiln_sbuf_free(&b);
}
END_TEST

/* ---- the prelude contract ----------------------------------------------- */

static bool listed(const char *name, size_t n) {
  for (const kiln__prelude_helper *h = kiln__prelude_helpers; h->name; h++)
    if (strlen(h->name) == n && strncmp(h->name, name, n) == 0) return true;
  return false;
}

START_TEST(prelude_defines_every_helper) {
  /* The prelude, then each listed signature declared again (a conflicting
   * type is an error) and every name used (one never defined is an error
   * under -Werror), compiled by the system C compiler. */
  const kiln__cg_target *t = &kiln__c_target;
  char path[] = "/tmp/kiln-prelude-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  FILE *f = fdopen(fd, "w");
  ck_assert_ptr_nonnull(f);
  fputs(t->prelude, f);
  int n = 0;
  for (const kiln__prelude_helper *h = kiln__prelude_helpers; h->name; h++, n++)
    fprintf(f, "%s %s;\n", t->helper_qual, h->signature);
  fputs("void kiln_contract_use(void) {\n", f);
  for (const kiln__prelude_helper *h = kiln__prelude_helpers; h->name; h++)
    fprintf(f, "  (void)%s;\n", h->name);
  fputs("}\n", f);
  fclose(f);
  ck_assert_int_ge(n, 40);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "cc -std=c11 -fsyntax-only -Werror -x c %s", path);
  int rc = system(cmd);
  unlink(path);
  ck_assert_msg(rc == 0, "the C prelude does not define every listed helper (%s)", cmd);
  /* The other way round: every function the prelude defines outright is
   * listed (KSHIFTS' templates expand to the listed kshl8 ... kshra64). */
  for (const char *p = strstr(t->prelude, "\nKI "); p; p = strstr(p + 1, "\nKI ")) {
    const char *paren = strchr(p + 4, '('), *name = paren;
    while (name > p && (isalnum((unsigned char)name[-1]) || name[-1] == '_')) name--;
    if (name[-1] == '#') continue; /* a template: kshl##W */
    ck_assert_msg(listed(name, (size_t)(paren - name)), "prelude helper %.*s is not in emit.h",
                  (int)(paren - name), name);
  }
}
END_TEST

/* Whether the identifier s[0..n) called in generated code is part of the
 * contract: a listed helper, a standard function, the target's popcount,
 * a keyword, or a name the emitter made up (kf<N>, kless<N>,
 * kiln_kernel_<N>, the sort's LESS macro). */
static bool callable(const char *s, size_t n) {
  static const char *const fixed[] = {"if", "for", "while", "switch", "return", "sizeof", "LESS"};
  static const char *const numbered[] = {"kf", "kless", "kiln_kernel_"};
  if (listed(s, n)) return true;
  for (const char *const *q = kiln__emit_std_funcs; *q; q++)
    if (strlen(*q) == n && strncmp(*q, s, n) == 0) return true;
  if (strlen(kiln__c_target.popcount64) == n && strncmp(kiln__c_target.popcount64, s, n) == 0)
    return true;
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
    if (strlen(fixed[i]) == n && strncmp(fixed[i], s, n) == 0) return true;
  for (size_t i = 0; i < sizeof numbered / sizeof *numbered; i++) {
    size_t k = strlen(numbered[i]);
    if (n <= k || strncmp(numbered[i], s, k) != 0) continue;
    while (k < n && isdigit((unsigned char)s[k])) k++;
    if (k == n) return true;
  }
  return false;
}

/* Compiles hlo with its source dumped and checks that the source is the
 * C prelude followed by code that calls only what the contract allows. */
static void check_calls(const char *hlo) {
  char dir[] = "/tmp/kiln-cgcalls-XXXXXX", path[300];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.dump_dir = dir;
  kiln_status st;
  ck_assert_msg(compile_status(hlo, &o, &st) == 0, "%s: %s", st.where, st.msg);
  snprintf(path, sizeof path, "%s/kernels.c", dir);
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  static char src[1 << 22];
  size_t len = fread(src, 1, sizeof src - 1, f);
  fclose(f);
  src[len] = 0;
  unlink(path);
  rmdir(dir);
  size_t np = strlen(kiln__c_target.prelude);
  ck_assert_msg(len > np && memcmp(src, kiln__c_target.prelude, np) == 0,
                "the source does not open with the prelude");
  int calls = 0;
  for (const char *p = src + np; *p;) {
    if (isdigit((unsigned char)*p)) { /* a number, suffixes and exponents included */
      while (isalnum((unsigned char)*p) || *p == '.' || *p == '_') p++;
      continue;
    }
    if (!isalpha((unsigned char)*p) && *p != '_') {
      p++;
      continue;
    }
    const char *id = p;
    while (isalnum((unsigned char)*p) || *p == '_') p++;
    const char *q = p;
    while (*q == ' ') q++;
    if (*q != '(') continue;
    calls++;
    ck_assert_msg(callable(id, (size_t)(p - id)), "generated code calls %.*s, not in the contract",
                  (int)(p - id), id);
  }
  ck_assert_int_gt(calls, 0);
}

START_TEST(generated_code_calls_only_contract) {
  for (int i = 0; types[i]; i++) {
    char *hlo = elementwise_module(types[i]);
    check_calls(hlo);
    kiln_free(hlo);
  }
  check_calls(fusion_hlo);
  check_calls(
      "HloModule mix\n"
      "add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }\n"
      "cmp { a = f32[] parameter(0)  b = f32[] parameter(1)  c = s32[] parameter(2)  d = s32[] "
      "parameter(3)\n  ROOT lt = pred[] compare(a, b), direction=LT, type=TOTALORDER }\n"
      "ge { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT c = pred[] compare(a, b), "
      "direction=GE }\n"
      "ENTRY main {\n"
      "  p0 = f32[5,4] parameter(0)\n  idx = s32[3] parameter(1)\n  up = f32[3,4] parameter(2)\n"
      "  g = f32[3,4] gather(p0, idx), offset_dims={1}, collapsed_slice_dims={0}, "
      "start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}\n"
      "  i2 = s32[3,1] reshape(idx)\n"
      "  s = f32[5,4] scatter(p0, i2, up), update_window_dims={1}, inserted_window_dims={0}, "
      "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add\n"
      "  io = s32[5,4] iota(), iota_dimension=1\n"
      "  so = (f32[5,4], s32[5,4]) sort(s, io), dimensions={1}, is_stable=true, to_apply=cmp\n"
      "  x = f32[6,7] parameter(3)\n  src = f32[3,4] parameter(4)\n  z = f32[] constant(0)\n"
      "  sas = f32[6,7] select-and-scatter(x, src, z), window={size=3x3 stride=2x2 "
      "pad=1_1x1_1}, select=ge, scatter=add\n"
      "  rw = f32[3,4] reduce-window(x, z), window={size=2x2 stride=2x2 pad=0_0x0_1}, "
      "to_apply=add\n"
      "  bias = f32[7] reduce(x, z), dimensions={0}, to_apply=add\n"
      "  row = f32[6] reduce(x, z), dimensions={1}, to_apply=add\n"
      "  w = f32[3,3,1,2] parameter(5)\n  x4 = f32[1,6,7,1] reshape(x)\n"
      "  cv = f32[1,6,7,2] convolution(x4, w), window={size=3x3 pad=1_1x1_1}, "
      "dim_labels=b01f_01io->b01f\n"
      "  j = s32[] parameter(6)\n  nu = f32[3,4] negate(up)\n"
      "  ds = f32[2,4] dynamic-slice(p0, j, j), dynamic_slice_sizes={2,4}\n"
      "  dus = f32[5,4] dynamic-update-slice(p0, ds, j, j)\n"
      "  a = s32[4,3] parameter(7)\n  b = s32[3,2] parameter(8)\n"
      "  d = s32[4,2] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
      "  ROOT t = (f32[3,4], (f32[5,4], s32[5,4]), f32[6,7], f32[3,4], f32[7], f32[6], "
      "f32[1,6,7,2], f32[3,4], f32[5,4], s32[4,2]) tuple(g, so, sas, rw, bias, row, cv, nu, dus, "
      "d)\n}\n");
}
END_TEST

START_TEST(out_of_memory_everywhere) {
  /* Every allocation of a compile failing in turn: KILN_ENOMEM, no crash,
   * no leak (the sanitizer build checks the last two). */
  kiln_module *m = cg_parse(fusion_hlo);
  kiln_status st;
  for (long k = 1;; k++) {
    kiln_executable *e = NULL;
    kiln_status_clear(&st);
    kiln_alloc_fail_after(k);
    int rc = kiln_compile(m, NULL, &e, NULL, &st);
    kiln_alloc_fail_after(0);
    if (rc == 0) {
      kiln_executable_destroy(e);
      break;
    }
    ck_assert_msg(rc == KILN_ENOMEM, "allocation %ld: %s: %s", k, st.where, st.msg);
    ck_assert_ptr_null(e);
  }
  kiln_module_destroy(m);
}
END_TEST

/* ---- the executable and the executor ------------------------------------ */

START_TEST(serialized_executable_runs) {
  kiln_executable *e = cg_check_full(fusion_hlo, 2, false, 1e-5, 0, true);
  uint8_t *blob, *blob2;
  size_t len, len2;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_executable_serialize(e, &blob, &len, &st), 0);
  kiln_executable *back;
  ck_assert_int_eq(kiln_executable_deserialize(blob, len, &back, &st), 0);
  ck_assert_int_eq(kiln_executable_serialize(back, &blob2, &len2, &st), 0);
  ck_assert_uint_eq(len, len2);
  ck_assert_int_eq(memcmp(blob, blob2, len), 0);
  kiln_free(blob);
  kiln_free(blob2);
  kiln_executable_destroy(back);
  kiln_executable_destroy(e);
}
END_TEST

#ifdef HAVE_EXECUTOR
static void executor_matches(const char *hlo, uint64_t seed) {
  kiln_module *m = cg_parse(hlo);
  kiln_executable *e = cg_compile(m, 2);
  const kiln_computation *ent = kiln_module_entry(m);
  uint32_t np = kiln_computation_nparams(m, ent);
  kiln_literal *args[16];
  kiln_status st;
  kiln_status_clear(&st);
  for (uint32_t i = 0; i < np; i++) {
    ck_assert_int_eq(
        kiln_literal_create(NULL, &kiln_computation_param(m, ent, i)->shape, 0, &args[i], &st), 0);
    cg_fill(args[i], &seed, false);
  }
  kiln_literal *want, *got;
  ck_assert_int_eq(kiln_interp_run(m, (const kiln_literal *const *)args, np, NULL, &want, &st), 0);
  int rc = kiln_run_executable(e, NULL, NULL, (const kiln_literal *const *)args, np, &got, &st);
  ck_assert_msg(rc == 0, "executor: %s: %s", st.where, st.msg);
  char why[512];
  ck_assert_msg(cg_diff(got, want, 1e-5, why, sizeof why) < 0, "executor mismatch: %s", why);
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  for (uint32_t i = 0; i < np; i++) kiln_literal_destroy(args[i]);
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
}

START_TEST(executor_end_to_end) {
  executor_matches(fusion_hlo, 4);
  executor_matches(
      "HloModule big\nENTRY main {\n  a = f32[300,200] parameter(0)\n  b = f32[200] parameter(1)\n"
      "  bb = f32[300,200] broadcast(b), dimensions={1}\n  t = f32[300,200] tanh(a)\n"
      "  ROOT m = f32[300,200] multiply(t, bb)\n}\n",
      3);
}
END_TEST

/* Slices of slices with an op between them (so the simplifier cannot merge
 * them) compose index components longer than an index holds inline; they
 * used to be cut short into C that did not compile (associative_scan's
 * odd/even slicing, 5 levels deep). Eight levels, fused into one kernel. */
START_TEST(executor_nested_strided_slices) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, "HloModule nested_slices\nENTRY main {\n  x = f32[8,512] parameter(0)\n");
  const char *prev = "x";
  char name[16];
  int w = 512;
  for (int i = 1; i <= 8; i++, w /= 2) {
    kiln_sbuf_printf(&b, "  s%d = f32[8,%d] slice(%s), slice={[0:8], [%d:%d:2]}\n", i, w / 2, prev,
                     i % 2, w);
    kiln_sbuf_printf(&b, "  n%d = f32[8,%d] negate(s%d)\n", i, w / 2, i);
    snprintf(name, sizeof name, "n%d", i);
    prev = name;
  }
  kiln_sbuf_printf(&b, "  ROOT r = f32[8,%d] add(%s, %s)\n}\n", w, prev, prev);
  executor_matches(kiln_sbuf_str(&b), 5);
  kiln_sbuf_free(&b);
}
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("codegen");
  TCase *tc = tcase_create("ops");
  tcase_set_timeout(tc, 240);
  tcase_add_loop_test(tc, elementwise_every_type, 0, 13);
  tcase_add_loop_test(tc, convert_every_pair, 0, 13);
  tcase_add_test(tc, bitcast_convert_same_width);
  tcase_add_test(tc, f32_math_ulp_bounds);
  tcase_add_test(tc, bf16_convert_rounding);
  tcase_add_test(tc, integer_edges_exact);
  tcase_add_test(tc, movement_ops);
  tcase_add_test(tc, layouts_honoured);
  tcase_add_test(tc, dynamic_slices_clamp);
  tcase_add_test(tc, dynamic_update_in_place);
  tcase_add_test(tc, gather_and_scatter);
  tcase_add_test(tc, scatter_blocks_keep_update_order);
  tcase_add_test(tc, sort_stable_multi_operand);
  tcase_add_test(tc, select_and_scatter);
  tcase_add_test(tc, reductions);
  tcase_add_loop_test(tc, reductions_random, 0, 4);
  tcase_add_loop_test(tc, row_fusions_random, 0, 8);
  tcase_add_test(tc, reduce_major_transposed_rows);
  tcase_add_test(tc, reduce_window_padded_dilated);
  tcase_add_test(tc, pooling_rows);
  tcase_add_test(tc, dots);
  tcase_add_test(tc, dots_become_gemms);
  tcase_add_test(tc, written_layout_operand_gemm);
  tcase_add_test(tc, convolutions);
  tcase_add_test(tc, map_calls_computation);
  tcase_add_test(tc, fusion_kinds);
  tcase_add_test(tc, while_loop);
  tcase_add_test(tc, while_swaps_state);
  tcase_add_test(tc, while_passthrough_not_overwritten);
  tcase_add_test(tc, scan_moves_no_arrays);
  tcase_add_test(tc, conditional_and_call);
  tcase_add_test(tc, tuple_parameters_and_passthrough);
  tcase_add_test(tc, full_pipeline);
  suite_add_tcase(s, tc);
  TCase *tf = tcase_create("failures");
  tcase_set_timeout(tf, 240);
  tcase_add_test(tf, unsupported_ops_named);
  tcase_add_test(tf, compiler_failure_and_timeout);
  tcase_add_test(tf, no_client_strings_in_source);
  tcase_add_test(tf, row_kernel_source);
  tcase_add_test(tf, scalar_hoisted_before_loop);
  tcase_add_test(tf, reduce_rows_permuted);
  tcase_add_test(tf, reduce_loops_physical_order);
  tcase_add_test(tf, row_divide_reciprocal);
  tcase_add_test(tf, transcendental_kernels_wide);
  tcase_add_test(tf, serialized_executable_runs);
  tcase_add_test(tf, out_of_memory_everywhere);
#ifdef HAVE_EXECUTOR
  tcase_add_test(tf, executor_end_to_end);
  tcase_add_test(tf, executor_nested_strided_slices);
#endif
  suite_add_tcase(s, tf);
  TCase *tk = tcase_create("contract");
  tcase_set_timeout(tk, 240);
  tcase_add_test(tk, prelude_defines_every_helper);
  tcase_add_test(tk, generated_code_calls_only_contract);
  suite_add_tcase(s, tk);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
