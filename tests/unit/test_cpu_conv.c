/* Differential tests of the CONV step (compiler/codegen/conv_step.c,
 * executor/cpu/cpu_conv.c) against the reference interpreter.
 *
 * Random convolution configurations: dim_labels permutations of lhs,
 * kernel and output, parameter layouts that are not row-major, 0 to 3
 * spatial dimensions, strides, padding of either sign, lhs dilation
 * (transposed convolutions), rhs dilation, feature groups (depthwise
 * included) and batch groups (weight gradients). Each module is compiled
 * for cpu and run there, and run by the interpreter (compiler/eval, the
 * oracle) on the same arguments.
 *
 * Tolerance: |cpu - interp| <= 1e-5 * (1 + |interp|). Arguments are
 * multiples of 1/8 in [-2, 2], so every product is a multiple of 1/64 and
 * every partial sum here is exact in f32: any difference beyond the
 * tolerance is a wrong index or a missing term, not rounding.
 *
 * With oneDNN in the build the suite also checks that each f32 convolution
 * became a CONV step and that its plan runs through the library (no silent
 * fallback to the direct loop).
 *
 * Long-kernel 1-D convolutions (weight gradients as JAX writes them: the
 * kernel is an activation, the output a few taps) run as sgemm calls;
 * random ones of those check that path, in every build that has CONV steps
 * (sanitizer builds included: it does not use oneDNN).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sbuf.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "executor/backend.h"
#include "executor/cpu/cpu.h"
#include "executor/run.h"

static kiln_status st;

/* Whether CONV steps run through oneDNN here: not in sanitizer builds
 * (executor/cpu/cpu_conv.c says why). */
#if defined(KILN_HAVE_DNNL) && !defined(__SANITIZE_ADDRESS__)
#define LIBRARY 1
#else
#define LIBRARY 0
#endif

static uint64_t rng(uint64_t *s) {
  *s = *s * 6364136223846793005u + 1442695040888963407u;
  return *s >> 33;
}

static int64_t pick(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(rng(s) % (uint64_t)(hi - lo + 1));
}

static void shuffle(uint64_t *s, char *v, int n) {
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(rng(s) % (uint64_t)(i + 1));
    char t = v[i];
    v[i] = v[j];
    v[j] = t;
  }
}

/* One random configuration. */
typedef struct cfg {
  int ns;
  int64_t n, c, o, fg, bg;
  int64_t in[3], k[3], out[3], stride[3], lo[3], hi[3], ld[3], rd[3];
  char lhs[6], rhs[6], res[6]; /* dim_labels per operand, e.g. "b01f" */
  bool lhs_layout, rhs_layout;
} cfg;

static int64_t out_size(const cfg *g, int i) {
  int64_t padded = g->lo[i] + g->hi[i] + (g->in[i] - 1) * g->ld[i] + 1;
  int64_t window = (g->k[i] - 1) * g->rd[i] + 1;
  return padded < window ? 0 : (padded - window) / g->stride[i] + 1;
}

static void make_cfg(uint64_t *s, cfg *g) {
  memset(g, 0, sizeof *g);
  int64_t r = pick(s, 0, 9);
  g->ns = r == 0 ? 0 : r == 9 ? 3 : r < 4 ? 1 : 2;
  g->fg = g->bg = 1;
  int64_t kind = pick(s, 0, 5); /* 0-2 plain, 3 feature groups, 4 depthwise, 5 batch groups */
  int64_t per = pick(s, 1, 3);
  if (kind == 3) g->fg = pick(s, 2, 3);
  if (kind == 4) g->fg = pick(s, 2, 4), per = 1;
  if (kind == 5) g->bg = pick(s, 2, 3);
  g->c = per * g->fg;
  g->o = g->fg * g->bg * pick(s, 1, 3);
  g->n = g->bg * pick(s, 1, 2);
  for (int i = 0; i < g->ns; i++) {
    for (;;) {
      g->in[i] = pick(s, 1, g->ns == 3 ? 4 : 7);
      g->k[i] = pick(s, 1, 3);
      g->stride[i] = pick(s, 1, 3);
      g->lo[i] = pick(s, -1, 2);
      g->hi[i] = pick(s, -1, 2);
      g->ld[i] = pick(s, 0, 2) == 0 ? pick(s, 2, 3) : 1;
      g->rd[i] = pick(s, 0, 3) == 0 ? 2 : 1;
      if ((g->out[i] = out_size(g, i)) > 0) break;
    }
  }
  const char *sp = "012";
  char l[6] = {'b', 'f'}, k[6] = {'o', 'i'}, o[6] = {'b', 'f'};
  for (int i = 0; i < g->ns; i++) l[2 + i] = k[2 + i] = o[2 + i] = sp[i];
  shuffle(s, l, g->ns + 2);
  shuffle(s, k, g->ns + 2);
  shuffle(s, o, g->ns + 2);
  memcpy(g->lhs, l, 6);
  memcpy(g->rhs, k, 6);
  memcpy(g->res, o, 6);
  g->lhs_layout = pick(s, 0, 2) == 0;
  g->rhs_layout = pick(s, 0, 2) == 0;
}

/* Whether some input element lies inside the padded input in every
 * spatial dimension (else the output is all zeros and the step leaves it
 * to the direct loop). */
static bool reads_input(const cfg *g) {
  for (int i = 0; i < g->ns; i++) {
    int64_t P = g->lo[i] + g->hi[i] + (g->in[i] - 1) * g->ld[i] + 1;
    bool any = false;
    for (int64_t j = 0; j < g->in[i] && !any; j++)
      any = g->lo[i] + j * g->ld[i] >= 0 && g->lo[i] + j * g->ld[i] < P;
    if (!any) return false;
  }
  return true;
}

/* The size of the dimension labelled `ch` of an operand. */
static int64_t size_of(const cfg *g, char ch, int which) {
  if (ch >= '0' && ch <= '2') {
    int i = ch - '0';
    return which == 0 ? g->in[i] : which == 1 ? g->k[i] : g->out[i];
  }
  switch (ch) {
  case 'b': return which == 0 ? g->n : g->n / g->bg;
  case 'f': return which == 0 ? g->c : g->o;
  case 'o': return g->o;
  case 'i': return g->c / g->fg;
  }
  return -1;
}

static void shape_text(kiln_sbuf *b, const cfg *g, const char *labels, int which, bool layout) {
  int n = g->ns + 2;
  kiln_sbuf_printf(b, "f32[");
  for (int i = 0; i < n; i++)
    kiln_sbuf_printf(b, "%s%lld", i ? "," : "", (long long)size_of(g, labels[i], which));
  kiln_sbuf_printf(b, "]");
  if (layout) { /* minor-to-major in order: the first dimension is the fastest */
    kiln_sbuf_printf(b, "{");
    for (int i = 0; i < n; i++) kiln_sbuf_printf(b, "%s%d", i ? "," : "", i);
    kiln_sbuf_printf(b, "}");
  }
}

static void module_text(kiln_sbuf *b, const cfg *g) {
  kiln_sbuf_printf(b, "HloModule conv\nENTRY e {\n  a = ");
  shape_text(b, g, g->lhs, 0, g->lhs_layout);
  kiln_sbuf_printf(b, " parameter(0)\n  k = ");
  shape_text(b, g, g->rhs, 1, g->rhs_layout);
  kiln_sbuf_printf(b, " parameter(1)\n  ROOT c = ");
  shape_text(b, g, g->res, 2, false);
  kiln_sbuf_printf(b, " convolution(a, k)");
  if (g->ns > 0) {
    kiln_sbuf_printf(b, ", window={size=");
    for (int i = 0; i < g->ns; i++) kiln_sbuf_printf(b, "%s%lld", i ? "x" : "", (long long)g->k[i]);
    kiln_sbuf_printf(b, " stride=");
    for (int i = 0; i < g->ns; i++)
      kiln_sbuf_printf(b, "%s%lld", i ? "x" : "", (long long)g->stride[i]);
    kiln_sbuf_printf(b, " pad=");
    for (int i = 0; i < g->ns; i++)
      kiln_sbuf_printf(b, "%s%lld_%lld", i ? "x" : "", (long long)g->lo[i], (long long)g->hi[i]);
    kiln_sbuf_printf(b, " lhs_dilate=");
    for (int i = 0; i < g->ns; i++)
      kiln_sbuf_printf(b, "%s%lld", i ? "x" : "", (long long)g->ld[i]);
    kiln_sbuf_printf(b, " rhs_dilate=");
    for (int i = 0; i < g->ns; i++)
      kiln_sbuf_printf(b, "%s%lld", i ? "x" : "", (long long)g->rd[i]);
    kiln_sbuf_printf(b, "}");
  }
  int n = g->ns + 2;
  kiln_sbuf_printf(b, ", dim_labels=%.*s_%.*s->%.*s", n, g->lhs, n, g->rhs, n, g->res);
  if (g->fg > 1) kiln_sbuf_printf(b, ", feature_group_count=%lld", (long long)g->fg);
  if (g->bg > 1) kiln_sbuf_printf(b, ", batch_group_count=%lld", (long long)g->bg);
  kiln_sbuf_printf(b, "\n}\n");
}

static void fill(kiln_literal *l, uint64_t *seed) {
  int64_t n = kiln_literal_elements(l);
  for (int64_t i = 0; i < n; i++)
    kiln_literal_set_f64(l, i, (double)((int64_t)(rng(seed) % 33) - 16) / 8.0);
}

static int gemm_steps; /* CONV steps of the last run_case that run as sgemm */
static int bwd_steps;  /* ... and as oneDNN's backward data (transposed convolutions) */

/* The CONV steps of program 0, and how many of them a library runs. */
static void count_conv(const kiln_executable *e, int *steps, int *library) {
  *steps = *library = gemm_steps = bwd_steps = 0;
  for (uint32_t i = 0; i < e->programs[0].nsteps; i++) {
    const kiln_step *s = &e->programs[0].steps[i];
    if (s->kind != KILN_STEP_CONV) continue;
    (*steps)++;
    kiln__cpu_conv *p = NULL;
    ck_assert_int_eq(kiln__cpu_conv_create(s->conv, &p, "test", &st), 0);
    *library += kiln__cpu_conv_uses_library(p);
    gemm_steps += kiln__cpu_conv_uses_gemm(p);
    bwd_steps += kiln__cpu_conv_uses_bwd(p);
    kiln__cpu_conv_destroy(p);
  }
}

/* Compiles and runs `text` on both backends; returns the failure or "". */
static void run_case(const char *text, uint64_t seed, kiln_sbuf *why, int *steps, int *library) {
  kiln_module *m = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "conv.hlo", NULL, &m, &st) == 0,
                "parse: %s: %s\n%s", st.where, st.msg, text);
  const kiln_computation *en = kiln_module_entry(m);
  kiln_literal *args[2];
  for (uint32_t i = 0; i < 2; i++) {
    const kiln_instr *p = kiln_computation_param(m, en, i);
    ck_assert_int_eq(kiln_literal_create(NULL, &p->shape, 64u << 20, &args[i], &st), 0);
    fill(args[i], &seed);
  }
  kiln_run_options ro = {.max_while_iterations = 1000, .timeout_seconds = 60};
  kiln_literal *want = NULL, *got = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_run_module_with(m, "interp", NULL, NULL, &ro,
                                     (const kiln_literal *const *)args, 2, &want, &st) == 0,
                "interp: %s: %s\n%s", st.where, st.msg, text);
  kiln_executable *e = NULL;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_compile(m, NULL, &e, NULL, &st) == 0, "compile: %s: %s\n%s", st.where, st.msg,
                text);
  count_conv(e, steps, library);
  kiln_status_clear(&st);
  ck_assert_msg(
      kiln_run_executable(e, NULL, &ro, (const kiln_literal *const *)args, 2, &got, &st) == 0,
      "cpu: %s: %s\n%s", st.where, st.msg, text);
  ck_assert(kiln_shape_equal(&want->shape, &got->shape, false));
  int64_t n = kiln_literal_elements(want);
  for (int64_t i = 0; i < n; i++) {
    double a = kiln_literal_get_f64(want, i), b = kiln_literal_get_f64(got, i);
    if (fabs(a - b) > 1e-5 * (1 + fabs(a))) {
      kiln_sbuf_printf(why, "element %lld: interp %.9g, cpu %.9g", (long long)i, a, b);
      break;
    }
  }
  kiln_executable_destroy(e);
  kiln_literal_destroy(want);
  kiln_literal_destroy(got);
  for (int i = 0; i < 2; i++) kiln_literal_destroy(args[i]);
  kiln_module_destroy(m);
}

/* Whether the step is a transposed convolution backward data can take:
 * lhs dilation, window stride 1, no batch groups, and padding within the
 * kernel's reach (cpu_conv.c, plan_bwd). */
static bool bwd_form(const cfg *g) {
  bool dilated = false;
  if (g->ns == 0 || g->bg != 1) return false;
  for (int i = 0; i < g->ns; i++) {
    int64_t reach = (g->k[i] - 1) * g->rd[i];
    if (g->stride[i] != 1 || reach - g->lo[i] < 0 || reach - g->hi[i] + g->ld[i] <= 0) return false;
    dilated |= g->ld[i] > 1;
  }
  return dilated;
}

START_TEST(random_configurations) {
  uint64_t seed = 0x5eed0000u + (uint64_t)_i;
  int total_steps = 0, total_library = 0, total_bwd = 0;
  for (int round = 0; round < 40; round++) {
    cfg g;
    make_cfg(&seed, &g);
    kiln_sbuf text = KILN_SBUF_INIT, why = KILN_SBUF_INIT;
    module_text(&text, &g);
    int steps, library;
    run_case(kiln_sbuf_str(&text), seed, &why, &steps, &library);
    ck_assert_msg(kiln_sbuf_str(&why)[0] == '\0', "%s\n%s", kiln_sbuf_str(&why),
                  kiln_sbuf_str(&text));
#ifdef KILN_HAVE_DNNL
    ck_assert_msg(steps == 1, "not a CONV step:\n%s", kiln_sbuf_str(&text));
    ck_assert_msg(library == (LIBRARY && reads_input(&g)), "CONV step %s oneDNN:\n%s",
                  library ? "through" : "not through", kiln_sbuf_str(&text));
    ck_assert_msg(bwd_steps == (LIBRARY && reads_input(&g) && bwd_form(&g)),
                  "CONV step %s backward data:\n%s", bwd_steps ? "as" : "not as",
                  kiln_sbuf_str(&text));
    total_bwd += bwd_steps;
#else
    (void)reads_input, (void)bwd_form;
    ck_assert_msg(steps == 0, "a CONV step without oneDNN:\n%s", kiln_sbuf_str(&text));
#endif
    total_steps += steps;
    total_library += library;
    kiln_sbuf_free(&text);
    kiln_sbuf_free(&why);
  }
  (void)gemm_steps;
#if LIBRARY
  /* most configurations read some input: the library path is exercised */
  ck_assert_int_gt(total_library, 20);
#endif
  (void)total_steps, (void)total_library, (void)total_bwd;
}
END_TEST

/* Random transposed convolutions (lhs dilation, window stride 1) as
 * conv_transpose and strided convolutions' input gradients write them:
 * every dim_labels permutation and layout, padding of either sign, kernel
 * dilation, feature groups. Those whose padding lies within the kernel's
 * reach run as oneDNN's backward data, the others staged; both against the
 * interpreter. */
START_TEST(transposed_configurations) {
  uint64_t seed = 0x7a45000u + (uint64_t)_i;
  int total_bwd = 0;
  for (int round = 0; round < 30; round++) {
    cfg g;
    do {
      make_cfg(&seed, &g);
    } while (g.ns == 0);
    g.n = pick(&seed, 1, 3), g.bg = 1;
    g.o = g.fg * pick(&seed, 1, 4);
    for (int i = 0; i < g.ns; i++) {
      g.stride[i] = 1;
      g.ld[i] = i == 0 || pick(&seed, 0, 1) ? pick(&seed, 2, 3) : 1;
      g.k[i] = pick(&seed, 1, 4);
      g.lo[i] = pick(&seed, -1, 3), g.hi[i] = pick(&seed, -1, 3);
      while ((g.out[i] = out_size(&g, i)) <= 0) g.hi[i]++;
    }
    kiln_sbuf text = KILN_SBUF_INIT, why = KILN_SBUF_INIT;
    module_text(&text, &g);
    int steps, library;
    run_case(kiln_sbuf_str(&text), seed, &why, &steps, &library);
    ck_assert_msg(kiln_sbuf_str(&why)[0] == '\0', "%s\n%s", kiln_sbuf_str(&why),
                  kiln_sbuf_str(&text));
#ifdef KILN_HAVE_DNNL
    ck_assert_msg(steps == 1, "not a CONV step:\n%s", kiln_sbuf_str(&text));
    ck_assert_msg(bwd_steps == (LIBRARY && reads_input(&g) && bwd_form(&g)),
                  "CONV step %s backward data:\n%s", bwd_steps ? "as" : "not as",
                  kiln_sbuf_str(&text));
#endif
    total_bwd += bwd_steps;
    kiln_sbuf_free(&text);
    kiln_sbuf_free(&why);
  }
#if LIBRARY
  ck_assert_int_gt(total_bwd, 10); /* the backward-data path is exercised */
#endif
  (void)total_bwd;
}
END_TEST

/* The shapes of the convnet of issue 11 and of its gradient, as JAX writes
 * them (NHWC activations, HWIO kernels, weight gradients f01b_i01o->01bf). */
START_TEST(jax_convnet_shapes) {
  static const char *const cases[] = {
      "HloModule m\nENTRY e {\n  a = f32[4,12,12,3] parameter(0)\n"
      "  k = f32[3,3,3,8] parameter(1)\n  ROOT c = f32[4,12,12,8] convolution(a, k), "
      "window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f\n}\n",
      "HloModule m\nENTRY e {\n  a = f32[4,12,12,8] parameter(0)\n"
      "  k = f32[3,3,16,8] parameter(1)\n  ROOT c = f32[4,12,12,16] convolution(a, k), "
      "window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01oi->b01f\n}\n",
      "HloModule m\nENTRY e {\n  a = f32[4,12,12,3] parameter(0)\n"
      "  k = f32[4,12,12,8] parameter(1)\n  ROOT c = f32[3,3,3,8] convolution(a, k), "
      "window={size=12x12 pad=1_1x1_1}, dim_labels=f01b_i01o->01bf\n}\n",
      /* stride-2 input gradient: lhs dilation */
      "HloModule m\nENTRY e {\n  a = f32[2,6,6,8] parameter(0)\n"
      "  k = f32[3,3,4,8] parameter(1)\n  ROOT c = f32[2,12,12,4] convolution(a, k), "
      "window={size=3x3 pad=1_2x1_2 lhs_dilate=2x2}, dim_labels=b01f_01oi->b01f\n}\n",
      /* a dilated 1-D conv net (WaveNet): forward, input gradient, and the
       * weight gradient whose kernel is the output gradient (sgemm) */
      "HloModule m\nENTRY e {\n  a = f32[2,256,8] parameter(0)\n"
      "  k = f32[3,8,16] parameter(1)\n  ROOT c = f32[2,256,16] convolution(a, k), "
      "window={size=3 pad=4_4 rhs_dilate=4}, dim_labels=b0f_0io->b0f\n}\n",
      "HloModule m\nENTRY e {\n  a = f32[2,256,16] parameter(0)\n"
      "  k = f32[3,8,16] parameter(1)\n  ROOT c = f32[2,256,8] convolution(a, k), "
      "window={size=3 pad=4_4 rhs_dilate=4}, dim_labels=b0f_0oi->b0f\n}\n",
      "HloModule m\nENTRY e {\n  a = f32[2,256,8] parameter(0)\n"
      "  k = f32[2,256,16] parameter(1)\n  ROOT c = f32[3,8,16] convolution(a, k), "
      "window={size=256 stride=4 pad=4_4}, dim_labels=f0b_i0o->0bf\n}\n",
      "HloModule m\nENTRY e {\n  a = f32[2,256,8] parameter(0)\n"
      "  k = f32[2,256,16] parameter(1)\n  ROOT c = f32[1,8,16] convolution(a, k), "
      "window={size=256}, dim_labels=f0b_i0o->0bf\n}\n",
      /* convnet_grad's second weight gradient, smaller: a 32x32 "kernel" */
      "HloModule m\nENTRY e {\n  a = f32[2,32,32,4] parameter(0)\n"
      "  k = f32[2,32,32,8] parameter(1)\n  ROOT c = f32[3,3,4,8] convolution(a, k), "
      "window={size=32x32 pad=1_1x1_1}, dim_labels=f01b_i01o->01bf\n}\n",
      /* lax.conv_transpose stride 2, SAME, 4x4 kernel (oneDNN backward data) */
      "HloModule m\nENTRY e {\n  a = f32[2,8,8,8] parameter(0)\n"
      "  k = f32[4,4,8,4] parameter(1)\n  ROOT c = f32[2,16,16,4] convolution(a, k), "
      "window={size=4x4 pad=2_2x2_2 lhs_dilate=2x2}, dim_labels=b01f_01io->b01f\n}\n",
      /* depthwise transposed, and 1-D with kernel dilation, NCW */
      "HloModule m\nENTRY e {\n  a = f32[2,5,5,6] parameter(0)\n"
      "  k = f32[3,3,1,6] parameter(1)\n  ROOT c = f32[2,9,9,6] convolution(a, k), "
      "window={size=3x3 pad=1_1x1_1 lhs_dilate=2x2}, dim_labels=b01f_01io->b01f, "
      "feature_group_count=6\n}\n",
      "HloModule m\nENTRY e {\n  a = f32[2,4,10] parameter(0)\n"
      "  k = f32[5,4,3] parameter(1)\n  ROOT c = f32[2,5,31] convolution(a, k), "
      "window={size=3 pad=3_4 lhs_dilate=3 rhs_dilate=2}, dim_labels=bf0_oi0->bf0\n}\n",
  };
  static const int gemm_form[] = {0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0};
  static const int bwd_form[] = {0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 1, 1};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kiln_sbuf why = KILN_SBUF_INIT;
    int steps, library;
    run_case(cases[i], 7 + i, &why, &steps, &library);
    ck_assert_msg(kiln_sbuf_str(&why)[0] == '\0', "%s\n%s", kiln_sbuf_str(&why), cases[i]);
#ifdef KILN_HAVE_DNNL
    ck_assert_int_eq(steps, 1);
    ck_assert_int_eq(library, LIBRARY || gemm_form[i]);
    ck_assert_int_eq(gemm_steps, gemm_form[i]);
    ck_assert_int_eq(bwd_steps, LIBRARY && bwd_form[i]);
#else
    (void)gemm_form, (void)bwd_form;
    ck_assert_int_eq(steps, 0);
#endif
    kiln_sbuf_free(&why);
  }
}
END_TEST

/* Random long-kernel convolutions, 1 to 3 spatial dimensions: kernels of
 * 64 positions or more (the last dimension 32 or more), outputs of a few
 * positions, strides, padding of either sign, kernel dilation, every
 * dim_labels permutation and layout. Those whose batch or spatial
 * dimension is innermost in the lhs (and so on) run as sgemm, the rest
 * through oneDNN; both against the interpreter. */
START_TEST(long_kernel_configurations) {
  uint64_t seed = 0x10a9000u + (uint64_t)_i;
  int total_gemm = 0;
  for (int round = 0; round < 24; round++) {
    cfg g;
    memset(&g, 0, sizeof g);
    int64_t r = pick(&seed, 0, 5);
    g.ns = r < 3 ? 1 : r < 5 ? 2 : 3;
    g.fg = g.bg = 1;
    g.n = pick(&seed, 4, 12);
    g.c = pick(&seed, 1, 4);
    g.o = pick(&seed, 4, 12);
    for (int i = 0; i < g.ns; i++) {
      bool last = i == g.ns - 1;
      for (;;) {
        g.k[i] = g.ns == 1   ? pick(&seed, 64, 96)
                 : last      ? pick(&seed, 32, 36)
                 : g.ns == 2 ? pick(&seed, 2, 4)
                             : pick(&seed, 1, 3);
        g.rd[i] = pick(&seed, 0, 3) == 0 ? 2 : 1;
        g.ld[i] = 1;
        g.stride[i] = pick(&seed, 1, 4);
        g.lo[i] = pick(&seed, -3, 6);
        g.hi[i] = pick(&seed, -3, 6);
        int64_t window = (g.k[i] - 1) * g.rd[i] + 1;
        g.in[i] = window - g.lo[i] - g.hi[i] + pick(&seed, 0, g.ns == 1 ? 7 : 2) * g.stride[i];
        if (g.in[i] >= 1 && (g.out[i] = out_size(&g, i)) > 0) break;
      }
    }
    const char *sp = "012";
    char l[6] = {'b', 'f'}, k[6] = {'o', 'i'}, o[6] = {'b', 'f'};
    for (int i = 0; i < g.ns; i++) l[2 + i] = k[2 + i] = o[2 + i] = sp[i];
    shuffle(&seed, l, g.ns + 2);
    shuffle(&seed, k, g.ns + 2);
    shuffle(&seed, o, g.ns + 2);
    if (pick(&seed, 0, 1) == 0) { /* as JAX writes weight gradients: f01b_i01o->01bf */
      l[0] = 'f', k[0] = 'i', l[g.ns + 1] = 'b', k[g.ns + 1] = 'o';
      o[g.ns] = 'b', o[g.ns + 1] = 'f';
      for (int i = 0; i < g.ns; i++) l[1 + i] = k[1 + i] = o[i] = sp[i];
    }
    memcpy(g.lhs, l, 6);
    memcpy(g.rhs, k, 6);
    memcpy(g.res, o, 6);
    g.lhs_layout = pick(&seed, 0, 2) == 0;
    g.rhs_layout = pick(&seed, 0, 2) == 0;
    kiln_sbuf text = KILN_SBUF_INIT, why = KILN_SBUF_INIT;
    module_text(&text, &g);
    int steps, library;
    run_case(kiln_sbuf_str(&text), seed, &why, &steps, &library);
    ck_assert_msg(kiln_sbuf_str(&why)[0] == '\0', "%s\n%s", kiln_sbuf_str(&why),
                  kiln_sbuf_str(&text));
#ifdef KILN_HAVE_DNNL
    ck_assert_msg(steps == 1, "not a CONV step:\n%s", kiln_sbuf_str(&text));
    ck_assert_msg(gemm_steps || library == (LIBRARY && reads_input(&g)), "CONV step %s oneDNN:\n%s",
                  library ? "through" : "not through", kiln_sbuf_str(&text));
    total_gemm += gemm_steps;
#endif
    kiln_sbuf_free(&text);
    kiln_sbuf_free(&why);
  }
#ifdef KILN_HAVE_DNNL
  ck_assert_int_gt(total_gemm, 4); /* the sgemm path is exercised */
#endif
  (void)total_gemm;
}
END_TEST

/* f64 keeps the loop kernel; the direct loop of the step agrees too. */
START_TEST(f64_and_reference) {
  const char *text = "HloModule m\nENTRY e {\n  a = f64[2,5,5,3] parameter(0)\n"
                     "  k = f64[3,3,3,4] parameter(1)\n  ROOT c = f64[2,2,2,4] convolution(a, k), "
                     "window={size=3x3 stride=2x2 pad=0_1x1_0}, dim_labels=b01f_01io->b01f\n}\n";
  kiln_sbuf why = KILN_SBUF_INIT;
  int steps, library;
  run_case(text, 3, &why, &steps, &library);
  ck_assert_msg(kiln_sbuf_str(&why)[0] == '\0', "%s", kiln_sbuf_str(&why));
  ck_assert_int_eq(steps, 0);
  kiln_sbuf_free(&why);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cpu_conv");
  TCase *tc = tcase_create("differential");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, random_configurations, 0, 4);
  tcase_add_loop_test(tc, long_kernel_configurations, 0, 3);
  tcase_add_loop_test(tc, transposed_configurations, 0, 3);
  tcase_add_test(tc, jax_convnet_shapes);
  tcase_add_test(tc, f64_and_reference);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
