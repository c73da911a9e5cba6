/* Bounded dynamic shapes ("<=N" dims) on the cpu backend against the
 * interpreter.
 *
 * Each module is compiled once (kiln_compile, codegen/dyn_pad.c) and the
 * one executable runs for every runtime size from 1 to the bound; the
 * interpreter runs the same arguments. Padding is filled with NaN, so a
 * reduction or contraction that read it would show. Results must agree in
 * their runtime sizes and in every valid element (padding is unspecified).
 * Then: what code generation refuses names the instruction, the executable
 * keeps its dynamic signature through serialization, and arguments that do
 * not fit their bounds are refused (kiln_literal_fit_bounds). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sbuf.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "executor/run.h"

static kiln_status st;

static kiln_module *parse(const char *text) {
  kiln_module *m = NULL;
  kiln_status_clear(&st);
  if (kiln_module_parse_text(text, strlen(text), "dyn.hlo", NULL, &m, &st) != 0) return NULL;
  return m;
}

/* Arguments for m's parameters: dims at the bounds, runtime size `n` in
 * every "<=" dim, valid elements small values from `seed`, padding NaN
 * (floats) or 99 (integers). An s32[] parameter gets n. */
static void make_args(const kiln_module *m, int64_t n, uint64_t seed, kiln_literal **args,
                      uint32_t *nargs) {
  const kiln_computation *c = kiln_module_entry(m);
  *nargs = kiln_computation_nparams(m, c);
  for (uint32_t p = 0; p < *nargs; p++) {
    const kiln_shape *s = &kiln_computation_param(m, c, p)->shape;
    kiln_status_clear(&st);
    ck_assert_int_eq(kiln_literal_create(NULL, s, 0, &args[p], &st), 0);
    kiln_literal *l = args[p];
    if (s->rank == 0 && s->dtype == KILN_S32) {
      kiln_literal_set_s64(l, 0, n);
      continue;
    }
    bool dyn = kiln_shape_is_dynamic(s);
    if (dyn) {
      l->dynamic_sizes = calloc(s->rank, sizeof(int64_t)); /* freed by free_args */
      for (uint32_t d = 0; d < s->rank; d++) l->dynamic_sizes[d] = s->dynamic[d] ? n : s->dims[d];
    }
    int64_t total = kiln_literal_elements(l), idx[8] = {0};
    for (int64_t i = 0; i < total; i++) {
      bool pad = false;
      for (uint32_t d = 0; dyn && d < s->rank; d++) pad |= idx[d] >= l->dynamic_sizes[d];
      seed = seed * 6364136223846793005u + 1442695040888963407u;
      double v = (double)((int64_t)((seed >> 33) % 17) - 8) / 8.0;
      if (kiln_dtype_is_float(s->dtype))
        kiln_literal_set_f64(l, i, pad ? NAN : v);
      else
        kiln_literal_set_s64(l, i, pad ? 99 : (int64_t)(v * 8));
      for (uint32_t d = s->rank; d-- > 0;) {
        if (++idx[d] < s->dims[d]) break;
        idx[d] = 0;
      }
    }
  }
}

static void free_args(kiln_literal **args, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    free(args[i]->dynamic_sizes);
    args[i]->dynamic_sizes = NULL;
    kiln_literal_destroy(args[i]);
  }
}

static int64_t size_at(const kiln_literal *l, uint32_t d) {
  return l->dynamic_sizes ? l->dynamic_sizes[d] : l->shape.dims[d];
}

/* Runtime sizes equal, and every element inside them within tolerance. */
static void compare(const kiln_literal *want, const kiln_literal *got, const char *path,
                    kiln_sbuf *why) {
  if (!kiln_shape_equal(&want->shape, &got->shape, false)) {
    kiln_sbuf_printf(why, "%s: shapes differ", path);
    return;
  }
  const kiln_shape *s = &want->shape;
  if (s->dtype == KILN_TUPLE) {
    for (uint32_t i = 0; i < s->rank && kiln_sbuf_str(why)[0] == '\0'; i++) {
      char sub[64];
      snprintf(sub, sizeof sub, "%s{%u}", path, i);
      compare(want->elems[i], got->elems[i], sub, why);
    }
    return;
  }
  for (uint32_t d = 0; d < s->rank; d++)
    if (size_at(want, d) != size_at(got, d)) {
      kiln_sbuf_printf(why, "%s: dim %u has runtime size %lld on interp, %lld on cpu", path, d,
                       (long long)size_at(want, d), (long long)size_at(got, d));
      return;
    }
  int64_t total = kiln_literal_elements(want), idx[8] = {0};
  for (int64_t i = 0; i < total; i++) {
    bool pad = false;
    for (uint32_t d = 0; d < s->rank; d++) pad |= idx[d] >= size_at(want, d);
    for (uint32_t d = s->rank; d-- > 0;) {
      if (++idx[d] < s->dims[d]) break;
      idx[d] = 0;
    }
    if (pad) continue;
    double a = kiln_literal_get_f64(want, i), b = kiln_literal_get_f64(got, i);
    if (a == b || fabs(a - b) <= 2e-5 * (1 + fabs(a))) continue;
    kiln_sbuf_printf(why, "%s[%lld]: interp %.9g, cpu %.9g", path, (long long)i, a, b);
    return;
  }
}

/* One compile; every size 1..bound through it and through the
 * interpreter. Returns the executable for further checks. */
static kiln_executable *agree(const char *text, int64_t bound) {
  kiln_module *m = parse(text);
  ck_assert_msg(m != NULL, "parse: %s: %s", st.where, st.msg);
  kiln_executable *e = NULL;
  kiln_status_clear(&st);
  int rc = kiln_compile(m, NULL, &e, NULL, &st);
  ck_assert_msg(rc == 0, "compile: %s: %s", st.where, st.msg);
  ck_assert_ptr_nonnull(e->dyn);
  kiln_run_options ro = {.timeout_seconds = 30};
  for (int64_t n = 1; n <= bound; n++) {
    kiln_literal *args[8], *want = NULL, *got = NULL;
    uint32_t na;
    make_args(m, n, (uint64_t)n, args, &na);
    kiln_status_clear(&st);
    rc = kiln_run_module_with(m, "interp", NULL, NULL, &ro, (const kiln_literal *const *)args, na,
                              &want, &st);
    ck_assert_msg(rc == 0, "interp n=%lld: %s: %s", (long long)n, st.where, st.msg);
    kiln_status_clear(&st);
    rc = kiln_run_executable(e, NULL, &ro, (const kiln_literal *const *)args, na, &got, &st);
    ck_assert_msg(rc == 0, "cpu n=%lld: %s: %s", (long long)n, st.where, st.msg);
    kiln_sbuf why = KILN_SBUF_INIT;
    compare(want, got, "result", &why);
    ck_assert_msg(kiln_sbuf_str(&why)[0] == '\0', "n=%lld: %s", (long long)n, kiln_sbuf_str(&why));
    kiln_sbuf_free(&why);
    kiln_literal_destroy(want);
    kiln_literal_destroy(got);
    free_args(args, na);
  }
  kiln_module_destroy(m);
  return e;
}

static const char add[] = "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
                          "  ROOT c = f32[] add(a, b)\n}\n"
                          "max {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
                          "  ROOT c = f32[] maximum(a, b)\n}\n";

static char *with_reducers(const char *entry) {
  size_t n = strlen(add) + strlen(entry) + 32;
  char *t = malloc(n);
  snprintf(t, n, "HloModule dyn\n%s%s", add, entry);
  return t;
}

/* A batch of 1..128 rows through one MLP layer: dot, bias, tanh, a
 * per-row sum, the mean over the rows (a reduction over the dynamic dim)
 * and the row count. */
START_TEST(test_mlp_batch_1_to_128) {
  char *t = with_reducers(
      "ENTRY main {\n"
      "  x = f32[<=128,64] parameter(0)\n"
      "  w = f32[64,32] parameter(1)\n"
      "  b = f32[32] parameter(2)\n"
      "  d = f32[<=128,32] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
      "  bb = f32[<=128,32] broadcast(b), dimensions={1}\n"
      "  s = f32[<=128,32] add(d, bb)\n"
      "  h = f32[<=128,32] tanh(s)\n"
      "  z = f32[] constant(0)\n"
      "  r = f32[<=128] reduce(h, z), dimensions={1}, to_apply=add\n"
      "  c = f32[32] reduce(h, z), dimensions={0}, to_apply=add\n"
      "  n = s32[] get-dimension-size(h), dimensions={0}\n"
      "  nf = f32[] convert(n)\n"
      "  nb = f32[32] broadcast(nf), dimensions={}\n"
      "  mean = f32[32] divide(c, nb)\n"
      "  ROOT t = (f32[<=128,32], f32[<=128], f32[32], s32[]) tuple(h, r, mean, n)\n"
      "}\n");
  kiln_executable *e = agree(t, 128);
  /* the caller's signature: x's rows and the two results' rows */
  ck_assert_uint_eq(e->dyn->nuser_params, 3);
  ck_assert_uint_eq(e->dyn->nsize_params, 1);
  ck_assert_uint_eq(e->dyn->nsize_results, 2);
  kiln_executable_destroy(e);
  free(t);
}
END_TEST

/* Contractions and reductions over the dynamic dim, transposes and
 * reshapes that keep or merge it. */
START_TEST(test_reduce_dot_reshape) {
  char *t =
      with_reducers("ENTRY main {\n"
                    "  x = f32[<=16,8] parameter(0)\n"
                    "  g = f32[8,8] dot(x, x), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
                    "  ninf = f32[] constant(-inf)\n"
                    "  mx = f32[8] reduce(x, ninf), dimensions={0}, to_apply=max\n"
                    "  tr = f32[8,<=16] transpose(x), dimensions={1,0}\n"
                    "  e = f32[8,<=16] exponential(tr)\n"
                    "  z = f32[] constant(0)\n"
                    "  se = f32[8] reduce(e, z), dimensions={1}, to_apply=add\n"
                    "  r3 = f32[<=16,2,4] reshape(x)\n"
                    "  fl = f32[<=128] reshape(x)\n"
                    "  sf = f32[] reduce(fl, z), dimensions={0}, to_apply=add\n"
                    "  ROOT t = (f32[8,8], f32[8], f32[8], f32[<=16,2,4], f32[<=128], f32[]) "
                    "tuple(g, mx, se, r3, fl, sf)\n"
                    "}\n");
  kiln_executable_destroy(agree(t, 16));
  free(t);
}
END_TEST

/* set-dimension-size on a static array (the size a parameter), then
 * dynamic-reshape of the rows into one dim and a slice that keeps the
 * dynamic dim whole. */
START_TEST(test_set_size_and_dynamic_reshape) {
  char *t = with_reducers("ENTRY main {\n"
                          "  x = f32[16,4] parameter(0)\n"
                          "  n = s32[] parameter(1)\n"
                          "  y = f32[<=16,4] set-dimension-size(x, n), dimensions={0}\n"
                          "  z = f32[] constant(0)\n"
                          "  s = f32[4] reduce(y, z), dimensions={0}, to_apply=add\n"
                          "  k = s32[] get-dimension-size(y), dimensions={0}\n"
                          "  four = s32[] constant(4)\n"
                          "  k4 = s32[] multiply(k, four)\n"
                          "  f = f32[<=64] dynamic-reshape(y, k4)\n"
                          "  sl = f32[<=16,2] slice(y), slice={[0:16], [1:3]}\n"
                          "  mid = f32[<=10,4] slice(y), slice={[3:13], [0:4]}\n"
                          "  sm = f32[4] reduce(mid, z), dimensions={0}, to_apply=add\n"
                          "  ROOT t = (f32[4], f32[<=64], f32[<=16,2], s32[], f32[<=10,4], f32[4]) "
                          "tuple(s, f, sl, k, mid, sm)\n"
                          "}\n");
  kiln_executable *e = agree(t, 16);
  ck_assert_uint_eq(e->dyn->nsize_params, 0); /* the size is the caller's own parameter */
  kiln_executable_destroy(e);
  free(t);
}
END_TEST

/* Two runtime-sized operands in elementwise ops, compare and select, and
 * the data movements that leave the dynamic dim whole: concatenate, pad
 * and reverse of the other dim, broadcast into a larger rank; then a
 * masked reduction of the padded value. */
START_TEST(test_elementwise_and_movement) {
  char *t = with_reducers(
      "ENTRY main {\n"
      "  x = f32[<=16,4] parameter(0)\n"
      "  y = f32[<=16,4] parameter(1)\n"
      "  a = f32[<=16,4] add(x, y)\n"
      "  c = pred[<=16,4] compare(x, y), direction=GT\n"
      "  s = f32[<=16,4] select(c, x, a)\n"
      "  i = s32[<=16,4] convert(s)\n"
      "  cc = f32[<=16,8] concatenate(x, y), dimensions={1}\n"
      "  z = f32[] constant(0)\n"
      "  pd = f32[<=16,7] pad(x, z), padding=0_0x1_2\n"
      "  rv = f32[<=16,4] reverse(y), dimensions={1}\n"
      "  b = f32[3,<=16,4] broadcast(rv), dimensions={1,2}\n"
      "  ninf = f32[] constant(-inf)\n"
      "  mx = f32[7] reduce(pd, ninf), dimensions={0}, to_apply=max\n"
      "  sb = f32[3,4] reduce(b, z), dimensions={1}, to_apply=add\n"
      "  ROOT t = (f32[<=16,4], s32[<=16,4], f32[<=16,8], f32[<=16,7], f32[3,<=16,4], f32[7], "
      "f32[3,4]) tuple(s, i, cc, pd, b, mx, sb)\n"
      "}\n");
  kiln_executable *e = agree(t, 16);
  ck_assert_uint_eq(e->dyn->nsize_params, 2);
  ck_assert_uint_eq(e->dyn->nsize_results, 5);
  kiln_executable_destroy(e);
  free(t);
}
END_TEST

/* A call (JAX wraps jax.nn functions in them) is inlined first, so the
 * runtime size flows through its body. */
START_TEST(test_through_a_call) {
  char *t = with_reducers("act {\n  p = f32[<=8,4] parameter(0)\n"
                          "  ROOT a = f32[<=8,4] tanh(p)\n}\n"
                          "ENTRY main {\n  x = f32[<=8,4] parameter(0)\n"
                          "  k = f32[<=8,4] call(x), to_apply=act\n  z = f32[] constant(0)\n"
                          "  s = f32[4] reduce(k, z), dimensions={0}, to_apply=add\n"
                          "  ROOT t = (f32[<=8,4], f32[4]) tuple(k, s)\n}\n");
  kiln_executable_destroy(agree(t, 8));
  free(t);
}
END_TEST

/* A loop whose state holds a runtime-sized array (and grows a second one
 * with set-dimension-size and dynamic-update-slice, as a stack): the sizes
 * travel with the state through the condition and the body. */
START_TEST(test_while_carries_sizes) {
  char *t = with_reducers(
      "cond {\n  s = (s32[], f32[<=16,4], f32[<=4,4]) parameter(0)\n"
      "  i = s32[] get-tuple-element(s), index=0\n  three = s32[] constant(3)\n"
      "  ROOT lt = pred[] compare(i, three), direction=LT\n}\n"
      "body {\n  s = (s32[], f32[<=16,4], f32[<=4,4]) parameter(0)\n"
      "  i = s32[] get-tuple-element(s), index=0\n"
      "  a = f32[<=16,4] get-tuple-element(s), index=1\n"
      "  st = f32[<=4,4] get-tuple-element(s), index=2\n"
      "  half = f32[] constant(0.5)\n  hb = f32[<=16,4] broadcast(half), dimensions={}\n"
      "  m = f32[<=16,4] multiply(a, hb)\n  e = f32[<=16,4] tanh(m)\n"
      "  z = f32[] constant(0)\n  r = f32[4] reduce(e, z), dimensions={0}, to_apply=add\n"
      "  row = f32[1,4] reshape(r)\n  zero = s32[] constant(0)\n"
      "  k = s32[] get-dimension-size(st), dimensions={0}\n"
      "  pushed = f32[<=4,4] dynamic-update-slice(st, row, k, zero)\n"
      "  one = s32[] constant(1)\n  k1 = s32[] add(k, one)\n"
      "  st2 = f32[<=4,4] set-dimension-size(pushed, k1), dimensions={0}\n"
      "  i1 = s32[] add(i, one)\n"
      "  ROOT o = (s32[], f32[<=16,4], f32[<=4,4]) tuple(i1, e, st2)\n}\n"
      "ENTRY main {\n  x = f32[<=16,4] parameter(0)\n  zero = s32[] constant(0)\n"
      "  nan = f32[] constant(nan)\n  buf = f32[4,4] broadcast(nan), dimensions={}\n"
      "  empty = f32[<=4,4] set-dimension-size(buf, zero), dimensions={0}\n"
      "  init = (s32[], f32[<=16,4], f32[<=4,4]) tuple(zero, x, empty)\n"
      "  w = (s32[], f32[<=16,4], f32[<=4,4]) while(init), condition=cond, body=body\n"
      "  y = f32[<=16,4] get-tuple-element(w), index=1\n"
      "  stack = f32[<=4,4] get-tuple-element(w), index=2\n"
      "  z = f32[] constant(0)\n  sy = f32[4] reduce(y, z), dimensions={0}, to_apply=add\n"
      "  ss = f32[4] reduce(stack, z), dimensions={0}, to_apply=add\n"
      "  ROOT t = (f32[<=16,4], f32[<=4,4], f32[4], f32[4]) tuple(y, stack, sy, ss)\n}\n");
  kiln_executable *e = agree(t, 16);
  ck_assert_uint_eq(e->dyn->nsize_results, 2);
  kiln_executable_destroy(e);
  free(t);
}
END_TEST

/* A conditional whose branches take and return runtime-sized arrays in
 * tuples; the selector comes from the runtime size itself. */
START_TEST(test_conditional_carries_sizes) {
  char *t = with_reducers(
      "small {\n  p = (f32[<=16,4]) parameter(0)\n"
      "  a = f32[<=16,4] get-tuple-element(p), index=0\n"
      "  n = f32[<=16,4] negate(a)\n  ROOT r = (f32[<=16,4], f32[<=16,4]) tuple(n, a)\n}\n"
      "big {\n  p = (f32[<=16,4]) parameter(0)\n"
      "  a = f32[<=16,4] get-tuple-element(p), index=0\n"
      "  e = f32[<=16,4] exponential(a)\n"
      "  ROOT r = (f32[<=16,4], f32[<=16,4]) tuple(e, e)\n}\n"
      "ENTRY main {\n  x = f32[<=16,4] parameter(0)\n"
      "  n = s32[] get-dimension-size(x), dimensions={0}\n  eight = s32[] constant(8)\n"
      "  sel = pred[] compare(n, eight), direction=LT\n"
      "  arg = (f32[<=16,4]) tuple(x)\n"
      "  c = (f32[<=16,4], f32[<=16,4]) conditional(sel, arg, arg), "
      "true_computation=small, false_computation=big\n"
      "  y = f32[<=16,4] get-tuple-element(c), index=0\n"
      "  z = f32[] constant(0)\n  s = f32[4] reduce(y, z), dimensions={0}, to_apply=add\n"
      "  ROOT t = (f32[<=16,4], f32[4]) tuple(y, s)\n}\n");
  kiln_executable_destroy(agree(t, 16));
  free(t);
}
END_TEST

static void refused(const char *entry, const char *name) {
  char *t = with_reducers(entry);
  kiln_module *m = parse(t);
  ck_assert_msg(m != NULL, "parse: %s: %s", st.where, st.msg);
  kiln_executable *e = NULL;
  kiln_status_clear(&st);
  int rc = kiln_compile(m, NULL, &e, NULL, &st);
  ck_assert_int_eq(rc, KILN_EUNIMPL);
  ck_assert_ptr_null(e);
  ck_assert_msg(strstr(st.msg, name) != NULL, "'%s' not named in: %s: %s", name, st.where, st.msg);
  kiln_module_destroy(m);
  free(t);
}

START_TEST(test_unsupported_ops_are_refused) {
  refused("ENTRY main {\n  x = f32[<=8,4] parameter(0)\n"
          "  ROOT rv = f32[<=8,4] reverse(x), dimensions={0}\n}\n",
          "rv");
  refused("ENTRY main {\n  x = f32[<=8,4] parameter(0)\n"
          "  ROOT sp = f32[<=4,2,4] reshape(x)\n}\n",
          "sp");
  refused("ENTRY main {\n  x = f32[<=8,4] parameter(0)\n  z = f32[] constant(0)\n"
          "  ROOT pd = f32[<=10,4] pad(x, z), padding=1_1x0_0\n}\n",
          "pd");
  refused("ENTRY main {\n  x = f32[<=8,4] parameter(0)\n  z = f32[] constant(0)\n"
          "  ROOT win = f32[<=8,4] reduce-window(x, z), window={size=2x1 pad=1_0x0_0}, "
          "to_apply=add\n}\n",
          "win");
}
END_TEST

/* What code generation refuses the interpreter runs: reverse of a
 * runtime-sized dim reverses the valid rows only. */
START_TEST(test_interp_reverses_valid_rows) {
  kiln_module *m = parse("HloModule r\nENTRY e {\n  x = f32[<=4] parameter(0)\n"
                         "  ROOT rv = f32[<=4] reverse(x), dimensions={0}\n}\n");
  ck_assert_ptr_nonnull(m);
  kiln_literal *x = NULL, *got = NULL;
  ck_assert_int_eq(kiln_literal_parse_text("f32[<=4] {1, 2, 3}", 18, &x, &st), 0);
  ck_assert_int_eq(x->dynamic_sizes[0], 3);
  kiln_run_options ro = {.timeout_seconds = 30};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_run_module_with(m, "interp", NULL, NULL, &ro,
                                        (const kiln_literal *const *)&x, 1, &got, &st),
                   0);
  ck_assert_int_eq(got->dynamic_sizes[0], 3);
  ck_assert_int_eq(kiln_literal_get_f64(got, 0), 3);
  ck_assert_int_eq(kiln_literal_get_f64(got, 2), 1);
  kiln_literal_destroy(got);
  kiln_literal_destroy(x);
  kiln_module_destroy(m);
}
END_TEST

/* The dynamic signature survives serialization, and the loaded copy runs. */
START_TEST(test_serialized_executable_keeps_sizes) {
  char *t = with_reducers("ENTRY main {\n  x = f32[<=8,4] parameter(0)\n  z = f32[] constant(0)\n"
                          "  e = f32[<=8,4] exponential(x)\n"
                          "  ROOT s = f32[<=8] reduce(e, z), dimensions={1}, to_apply=add\n}\n");
  kiln_module *m = parse(t);
  kiln_executable *e = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_compile(m, NULL, &e, NULL, &st), 0);
  uint8_t *blob = NULL;
  size_t len = 0;
  ck_assert_int_eq(kiln_executable_serialize(e, &blob, &len, &st), 0);
  kiln_literal *args[1], *got = NULL;
  uint32_t na;
  make_args(m, 3, 7, args, &na);
  kiln_run_options ro = {.timeout_seconds = 30};
  kiln_status_clear(&st);
  int rc = kiln_run_executable_blob(blob, len, NULL, &ro, (const kiln_literal *const *)args, na,
                                    &got, &st);
  ck_assert_msg(rc == 0, "%s: %s", st.where, st.msg);
  ck_assert_ptr_nonnull(got->dynamic_sizes);
  ck_assert_int_eq(got->dynamic_sizes[0], 3);
  ck_assert(!isnan(kiln_literal_get_f64(got, 2)));
  kiln_literal_destroy(got);
  /* a damaged table (a size naming a dim x does not have) is refused */
  kiln_executable *d = NULL;
  ck_assert_int_eq(kiln_executable_deserialize(blob, len, &d, &st), 0);
  ck_assert_uint_eq(d->dyn->nsize_params, 1);
  ck_assert_uint_eq(d->dyn->size_params[0].dim, 0);
  d->dyn->size_params[0].dim = 5;
  uint8_t *bad = NULL;
  size_t nbad = 0;
  ck_assert_int_eq(kiln_executable_serialize(d, &bad, &nbad, &st), 0);
  kiln_executable *d2 = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_executable_deserialize(bad, nbad, &d2, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.where, "size_params") || strstr(st.msg, "size_params"), "%s: %s",
                st.where, st.msg);
  free(bad);
  kiln_executable_destroy(d);
  free(blob);
  free_args(args, na);
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
  free(t);
}
END_TEST

/* A static array of fewer rows fits a "<=" parameter (padded, its rows
 * the runtime size); more rows than the bound, or a static dim that
 * differs, are refused naming the dim. */
START_TEST(test_fit_bounds) {
  kiln_module *m = parse("HloModule f\nENTRY e {\n  ROOT x = f32[<=8,3] parameter(0)\n}\n");
  const kiln_shape *want = &kiln_computation_root(m, kiln_module_entry(m))->shape;
  kiln_literal *small = NULL;
  ck_assert_int_eq(kiln_literal_parse_text("f32[2,3] {{1,2,3},{4,5,6}}", 26, &small, &st), 0);
  const kiln_literal *fit = NULL;
  ck_assert_int_eq(kiln_literal_fit_bounds(NULL, small, want, &fit, &st), 0);
  ck_assert(kiln_shape_equal(&fit->shape, want, false));
  ck_assert_int_eq(fit->dynamic_sizes[0], 2);
  ck_assert_int_eq(fit->dynamic_sizes[1], 3);
  ck_assert_int_eq(kiln_literal_get_f64(fit, 3), 4); /* row 1 starts at 3: the bound's stride */
  ck_assert_int_eq(kiln_literal_get_f64(fit, 6), 0); /* padding */
  kiln_literal_destroy((kiln_literal *)fit);
  kiln_literal_destroy(small);
  kiln_literal *big = NULL;
  kiln_status_clear(&st);
  const char *nine = "f32[9,3] {{0,0,0},{0,0,0},{0,0,0},{0,0,0},{0,0,0},{0,0,0},{0,0,0},"
                     "{0,0,0},{0,0,0}}";
  ck_assert_int_eq(kiln_literal_parse_text(nine, strlen(nine), &big, &st), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_literal_fit_bounds(NULL, big, want, &fit, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "over its bound 8") != NULL, "%s", st.msg);
  kiln_literal_destroy(big);
  kiln_literal *wide = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_literal_parse_text("f32[1,2] {{1,2}}", 16, &wide, &st), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_literal_fit_bounds(NULL, wide, want, &fit, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "dimension 1") != NULL, "%s", st.msg);
  kiln_literal_destroy(wide);
  kiln_module_destroy(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("dynamic");
  TCase *tc = tcase_create("cpu_vs_interp");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_mlp_batch_1_to_128);
  tcase_add_test(tc, test_reduce_dot_reshape);
  tcase_add_test(tc, test_set_size_and_dynamic_reshape);
  tcase_add_test(tc, test_elementwise_and_movement);
  tcase_add_test(tc, test_through_a_call);
  tcase_add_test(tc, test_while_carries_sizes);
  tcase_add_test(tc, test_conditional_carries_sizes);
  tcase_add_test(tc, test_unsupported_ops_are_refused);
  tcase_add_test(tc, test_interp_reverses_valid_rows);
  tcase_add_test(tc, test_serialized_executable_keeps_sizes);
  tcase_add_test(tc, test_fit_bounds);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
