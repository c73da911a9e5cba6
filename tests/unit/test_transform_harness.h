/* Helpers shared by the transform suites: build modules from HLO text,
 * apply transform specs, run them on the interpreter, and the numerical
 * oracles the transforms are checked against: central finite differences
 * in f64, the dot-product identity between vjp and jvp, and stacking the
 * function over a batch for vmap. */
#ifndef KILN_TESTS_UNIT_TEST_TRANSFORM_HARNESS_H
#define KILN_TESTS_UNIT_TEST_TRANSFORM_HARNESS_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/transforms/transform.h"

#define TX_MAX 16

/* What the current check is about, for failure messages. */
static const char *tx_case = "";
/* Relative tolerance of the dot-product identity (f64 programs). */
static double tx_dot_rtol = 1e-9;

static inline kiln_module *tx_parse(const char *text) {
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st);
  ck_assert_msg(rc == 0, "parse: %s: %s\n%s", st.where, st.msg, text);
  rc = kiln_module_verify(m, NULL, &st);
  ck_assert_msg(rc == 0, "verify: %s: %s\n%s", st.where, st.msg, text);
  return m;
}

static inline void tx_dump(const kiln_module *m) {
  char *t = kiln_module_print(m, NULL);
  fprintf(stderr, "%s\n", t ? t : "(null)");
  kiln_free(t);
}

/* "(f64[2], f64[]) -> (f64[], f64[2])": the ENTRY's parameter and result
 * shapes. malloc'd. */
static inline char *tx_signature(const kiln_module *m) {
  const kiln_computation *e = kiln_module_entry(m);
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_putc(&b, '(');
  uint32_t n = kiln_computation_nparams(m, e);
  for (uint32_t i = 0; i < n; i++) {
    if (i) kiln_sbuf_puts(&b, ", ");
    kiln_shape_print_short(&b, &kiln_computation_param(m, e, i)->shape);
  }
  kiln_sbuf_puts(&b, ") -> ");
  kiln_shape_print_short(&b, &kiln_computation_root(m, e)->shape);
  char *r = strdup(kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return r;
}

/* Applies the specs (NULL-terminated list) to a copy parsed from text; the
 * result is verified. */
static inline kiln_module *tx_apply_list(const char *text, const char *const *specs,
                                         kiln_transform_stats *stats) {
  kiln_module *m = tx_parse(text);
  kiln_transform ts[TX_MAX];
  uint32_t n = 0;
  kiln_status st;
  kiln_status_clear(&st);
  for (; specs[n]; n++) {
    ck_assert(n < TX_MAX);
    ck_assert_msg(kiln_transform_parse(specs[n], &ts[n], &st) == 0, "%s: %s", specs[n], st.msg);
  }
  int rc = kiln_transforms_apply_stats(m, ts, n, stats, &st);
  ck_assert_msg(rc == 0, "transform %s: %s: %s", specs[0], st.where, st.msg);
  rc = kiln_module_verify(m, NULL, &st);
  if (rc) tx_dump(m);
  ck_assert_msg(rc == 0, "verify after %s: %s: %s", specs[0], st.where, st.msg);
  return m;
}

static inline kiln_module *tx_apply(const char *text, const char *spec) {
  const char *specs[] = {spec, NULL};
  return tx_apply_list(text, specs, NULL);
}

/* The transform's failure: its code, and "where: msg" containing part. */
static inline void tx_expect_fail(const char *text, const char *spec, int code, const char *part) {
  kiln_module *m = tx_parse(text);
  kiln_transform t;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_transform_parse(spec, &t, &st) == 0, "%s", st.msg);
  int rc = kiln_transforms_apply(m, &t, 1, &st);
  char full[KILN_STATUS_WHERE_MAX + KILN_STATUS_MSG_MAX + 4];
  snprintf(full, sizeof full, "%s: %s", st.where, st.msg);
  ck_assert_msg(rc == code, "expected %s, got %s: %s", kiln_err_name(code), kiln_err_name(rc),
                full);
  ck_assert_msg(strstr(full, part) != NULL, "message \"%s\" lacks \"%s\"", full, part);
  kiln_module_destroy(m);
}

/* ---- literals ------------------------------------------------------------- */

static inline kiln_literal *tx_lit(const kiln_shape *s) {
  kiln_literal *l = NULL;
  kiln_status st;
  ck_assert_int_eq(kiln_literal_create(NULL, s, 0, &l, &st), 0);
  return l;
}

static inline kiln_literal *tx_lit_dims(kiln_dtype t, const int64_t *dims, uint32_t rank) {
  kiln_arena *a = kiln_arena_create();
  kiln_shape s;
  ck_assert_int_eq(kiln_shape_make_array(a, &s, t, dims, rank), 0);
  kiln_literal *l = tx_lit(&s);
  kiln_arena_destroy(a);
  return l;
}

/* xorshift in [lo, hi) */
static inline double tx_rand(uint64_t *s, double lo, double hi) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return lo + (hi - lo) * (double)(*s >> 11) / 9007199254740992.0;
}

/* A random literal of shape s: floats in [lo, hi), ints in [0, 3), preds. */
static inline kiln_literal *tx_lit_rand(const kiln_shape *s, uint64_t *seed, double lo, double hi) {
  kiln_literal *l = tx_lit(s);
  if (kiln_shape_is_tuple(s)) {
    for (uint32_t i = 0; i < s->rank; i++) {
      kiln_literal *e = tx_lit_rand(&s->tuple[i], seed, lo, hi);
      ck_assert_int_eq(kiln_literal_clone(l->own, e, &l->elems[i], NULL), 0);
      kiln_literal_destroy(e);
    }
    return l;
  }
  int64_t n = kiln_literal_elements(l);
  for (int64_t i = 0; i < n; i++) {
    if (kiln_dtype_is_float(s->dtype))
      kiln_literal_set_f64(l, i, tx_rand(seed, lo, hi));
    else
      kiln_literal_set_s64(l, i, (int64_t)tx_rand(seed, 0, 3));
  }
  return l;
}

static inline kiln_literal *tx_clone(const kiln_literal *a) {
  kiln_literal *l = NULL;
  ck_assert_int_eq(kiln_literal_clone(NULL, a, &l, NULL), 0);
  return l;
}

/* ---- running -------------------------------------------------------------- */

static inline kiln_literal *tx_run(const kiln_module *m, kiln_literal *const *args, uint32_t n) {
  kiln_literal *out = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_interp_run(m, (const kiln_literal *const *)args, n, NULL, &out, &st);
  if (rc) tx_dump(m);
  ck_assert_msg(rc == 0, "run: %s: %s", st.where, st.msg);
  return out;
}

/* Leaves of a literal, depth-first. */
static inline uint32_t tx_leaves(const kiln_literal *l, const kiln_literal **out, uint32_t max) {
  if (!kiln_shape_is_tuple(&l->shape)) {
    ck_assert(max >= 1);
    out[0] = l;
    return 1;
  }
  uint32_t n = 0;
  for (uint32_t i = 0; i < l->shape.rank; i++) n += tx_leaves(l->elems[i], out + n, max - n);
  return n;
}

static inline kiln_literal **tx_params_rand(const kiln_module *m, uint64_t seed, double lo,
                                            double hi, uint32_t *n) {
  const kiln_computation *e = kiln_module_entry(m);
  *n = kiln_computation_nparams(m, e);
  kiln_literal **a = calloc(*n + 1, sizeof *a);
  for (uint32_t i = 0; i < *n; i++)
    a[i] = tx_lit_rand(&kiln_computation_param(m, e, i)->shape, &seed, lo, hi);
  return a;
}

static inline void tx_free_args(kiln_literal **a, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) kiln_literal_destroy(a[i]);
  free(a);
}

static inline bool tx_close(double got, double want, double rtol, double atol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= atol + rtol * fabs(want);
}

static inline void tx_expect_lit_close(const kiln_literal *got, const kiln_literal *want,
                                       double rtol, double atol, const char *what) {
  ck_assert_msg(kiln_shape_same_dims(&got->shape, &want->shape), "%s: shapes differ", what);
  int64_t n = kiln_literal_elements(want);
  for (int64_t i = 0; i < n; i++) {
    double g = kiln_literal_get_f64(got, i), w = kiln_literal_get_f64(want, i);
    ck_assert_msg(tx_close(g, w, rtol, atol), "%s: element %lld is %.17g, expected %.17g", what,
                  (long long)i, g, w);
  }
}

/* ---- oracles -------------------------------------------------------------- */

/* f(args) with param p element i moved by d: the scalar output `out`. */
static inline double tx_eval_shift(const kiln_module *f, kiln_literal **args, uint32_t n,
                                   uint32_t p, int64_t i, double d, uint32_t out) {
  double x = kiln_literal_get_f64(args[p], i);
  kiln_literal_set_f64(args[p], i, x + d);
  kiln_literal *r = tx_run(f, args, n);
  kiln_literal_set_f64(args[p], i, x);
  const kiln_literal *lv[64];
  uint32_t nl = tx_leaves(r, lv, 64);
  ck_assert(out < nl);
  double v = kiln_literal_get_f64(lv[out], 0);
  kiln_literal_destroy(r);
  return v;
}

/* grad(f) against central differences in f64: every element of every wrt
 * parameter. `spec` is the grad spec ("grad", "grad:wrt=0,1"). */
static inline void tx_check_grad(const char *text, const char *spec, uint64_t seed, double lo,
                                 double hi) {
  kiln_module *f = tx_parse(text), *g = tx_apply(text, spec);
  kiln_transform t;
  ck_assert_int_eq(kiln_transform_parse(spec, &t, NULL), 0);
  uint32_t n;
  kiln_literal **args = tx_params_rand(f, seed, lo, hi, &n);
  kiln_literal *r = tx_run(g, args, n);
  const kiln_literal *lv[64];
  uint32_t nl = tx_leaves(r, lv, 64);
  uint32_t nw = t.nwrt ? t.nwrt : 1;
  ck_assert_uint_eq(nl, 1 + nw);
  uint32_t out = t.output >= 0 ? (uint32_t)t.output : 0;
  /* the value */
  kiln_literal *fv = tx_run(f, args, n);
  const kiln_literal *fl[64];
  tx_leaves(fv, fl, 64);
  ck_assert_msg(
      tx_close(kiln_literal_get_f64(lv[0], 0), kiln_literal_get_f64(fl[out], 0), 1e-12, 1e-12),
      "value differs");
  kiln_literal_destroy(fv);
  for (uint32_t w = 0; w < nw; w++) {
    uint32_t p = t.nwrt ? (uint32_t)t.wrt[w] : 0;
    int64_t ne = kiln_literal_elements(args[p]);
    for (int64_t i = 0; i < ne; i++) {
      double h = 1e-6 * fmax(1.0, fabs(kiln_literal_get_f64(args[p], i)));
      double fd =
          (tx_eval_shift(f, args, n, p, i, h, out) - tx_eval_shift(f, args, n, p, i, -h, out)) /
          (2 * h);
      double got = kiln_literal_get_f64(lv[1 + w], i);
      ck_assert_msg(tx_close(got, fd, 1e-5, 1e-6),
                    "%s: d/dparam%u[%lld] = %.12g, finite differences %.12g\n%s", spec, p,
                    (long long)i, got, fd, tx_case);
    }
  }
  kiln_literal_destroy(r);
  tx_free_args(args, n);
  kiln_module_destroy(f);
  kiln_module_destroy(g);
}

/* jvp(f) against central differences along a random tangent of all
 * parameters (jvp with default wrt). */
static inline void tx_check_jvp(const char *text, uint64_t seed, double lo, double hi) {
  kiln_module *f = tx_parse(text), *j = tx_apply(text, "jvp");
  uint32_t n;
  kiln_literal **args = tx_params_rand(f, seed, lo, hi, &n);
  kiln_literal **all = calloc(2 * n + 1, sizeof *all);
  uint64_t s2 = seed * 7 + 1;
  for (uint32_t i = 0; i < n; i++) {
    all[i] = args[i];
    all[n + i] = tx_lit_rand(&args[i]->shape, &s2, -1, 1);
  }
  kiln_literal *r = tx_run(j, all, 2 * n);
  const kiln_literal *lv[128];
  uint32_t nl = tx_leaves(r, lv, 128), m = nl / 2;
  double h = 1e-6;
  kiln_literal **plus = calloc(n + 1, sizeof *plus), **minus = calloc(n + 1, sizeof *minus);
  for (uint32_t i = 0; i < n; i++) {
    plus[i] = tx_clone(args[i]);
    minus[i] = tx_clone(args[i]);
    if (!kiln_dtype_is_float(args[i]->shape.dtype)) continue;
    for (int64_t e = 0; e < kiln_literal_elements(args[i]); e++) {
      double x = kiln_literal_get_f64(args[i], e), t = kiln_literal_get_f64(all[n + i], e);
      kiln_literal_set_f64(plus[i], e, x + h * t);
      kiln_literal_set_f64(minus[i], e, x - h * t);
    }
  }
  kiln_literal *rp = tx_run(f, plus, n), *rm = tx_run(f, minus, n), *r0 = tx_run(f, args, n);
  const kiln_literal *pl[64], *ml[64], *zl[64];
  ck_assert_uint_eq(tx_leaves(rp, pl, 64), m);
  tx_leaves(rm, ml, 64);
  tx_leaves(r0, zl, 64);
  for (uint32_t o = 0; o < m; o++) {
    tx_expect_lit_close(lv[o], zl[o], 1e-12, 1e-12, "jvp primal");
    if (!kiln_dtype_is_float(zl[o]->shape.dtype)) continue;
    for (int64_t e = 0; e < kiln_literal_elements(zl[o]); e++) {
      double fd = (kiln_literal_get_f64(pl[o], e) - kiln_literal_get_f64(ml[o], e)) / (2 * h);
      double got = kiln_literal_get_f64(lv[m + o], e);
      ck_assert_msg(tx_close(got, fd, 1e-5, 1e-6),
                    "jvp output %u[%lld] = %.12g, finite differences %.12g\n%s", o, (long long)e,
                    got, fd, tx_case);
    }
  }
  kiln_literal_destroy(rp);
  kiln_literal_destroy(rm);
  kiln_literal_destroy(r0);
  kiln_literal_destroy(r);
  for (uint32_t i = 0; i < n; i++) {
    kiln_literal_destroy(plus[i]);
    kiln_literal_destroy(minus[i]);
    kiln_literal_destroy(all[n + i]);
  }
  free(plus);
  free(minus);
  free(all);
  tx_free_args(args, n);
  kiln_module_destroy(f);
  kiln_module_destroy(j);
}

static inline double tx_dot(const kiln_literal *a, const kiln_literal *b) {
  double s = 0;
  if (!kiln_dtype_is_float(a->shape.dtype)) return 0;
  for (int64_t i = 0; i < kiln_literal_elements(a); i++)
    s += kiln_literal_get_f64(a, i) * kiln_literal_get_f64(b, i);
  return s;
}

/* <vjp(u), v> = <u, jvp(v)> for random u, v (all parameters, all outputs). */
static inline void tx_check_vjp_dot(const char *text, uint64_t seed, double lo, double hi) {
  kiln_module *f = tx_parse(text), *j = tx_apply(text, "jvp"), *v = tx_apply(text, "vjp");
  uint32_t n;
  kiln_literal **args = tx_params_rand(f, seed, lo, hi, &n);
  kiln_literal *r0 = tx_run(f, args, n);
  const kiln_literal *ol[64];
  uint32_t m = tx_leaves(r0, ol, 64);
  uint64_t s2 = seed * 13 + 5;
  kiln_literal **ja = calloc(2 * n + 1, sizeof *ja), **va = calloc(n + m + 1, sizeof *va);
  for (uint32_t i = 0; i < n; i++) {
    ja[i] = va[i] = args[i];
    ja[n + i] = tx_lit_rand(&args[i]->shape, &s2, -1, 1);
  }
  for (uint32_t o = 0; o < m; o++) va[n + o] = tx_lit_rand(&ol[o]->shape, &s2, -1, 1);
  kiln_literal *jr = tx_run(j, ja, 2 * n), *vr = tx_run(v, va, n + m);
  const kiln_literal *jl[128], *vl[128];
  ck_assert_uint_eq(tx_leaves(jr, jl, 128), 2 * m);
  ck_assert_uint_eq(tx_leaves(vr, vl, 128), m + n);
  double lhs = 0, rhs = 0, scale = 0;
  for (uint32_t i = 0; i < n; i++) {
    lhs += tx_dot(vl[m + i], ja[n + i]);
    scale += fabs(tx_dot(vl[m + i], ja[n + i]));
  }
  for (uint32_t o = 0; o < m; o++) rhs += tx_dot(va[n + o], jl[m + o]);
  ck_assert_msg(fabs(lhs - rhs) <= tx_dot_rtol * (1 + scale),
                "<vjp(u), v> = %.17g but <u, jvp(v)> = %.17g\n%s", lhs, rhs, tx_case);
  kiln_literal_destroy(jr);
  kiln_literal_destroy(vr);
  kiln_literal_destroy(r0);
  for (uint32_t i = 0; i < n; i++) kiln_literal_destroy(ja[n + i]);
  for (uint32_t o = 0; o < m; o++) kiln_literal_destroy(va[n + o]);
  free(ja);
  free(va);
  tx_free_args(args, n);
  kiln_module_destroy(f);
  kiln_module_destroy(j);
  kiln_module_destroy(v);
}

/* Element (b at `axis`) of a literal: the sub-array with that dim removed. */
static inline kiln_literal *tx_take(const kiln_literal *a, int64_t axis, int64_t b) {
  const kiln_shape *s = &a->shape;
  int64_t dims[16];
  uint32_t r = 0;
  for (uint32_t d = 0; d < s->rank; d++)
    if ((int64_t)d != axis) dims[r++] = s->dims[d];
  kiln_literal *o = tx_lit_dims(s->dtype, dims, r);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; d++) outer *= s->dims[d];
  for (uint32_t d = (uint32_t)axis + 1; d < s->rank; d++) inner *= s->dims[d];
  size_t es = kiln_dtype_size(s->dtype);
  for (int64_t i = 0; i < outer; i++)
    memcpy((char *)o->data + (size_t)(i * inner) * es,
           (const char *)a->data + (size_t)((i * s->dims[axis] + b) * inner) * es,
           (size_t)inner * es);
  return o;
}

#define TX_NONE (-100) /* an axis that is "none" */

/* vmap(f) with the given in_axes/out_axes (arrays of axes, TX_NONE: none;
 * negative axes count from the end) equals running f on every batch
 * element. */
static inline void tx_check_vmap(const char *text, const char *spec, const int64_t *in_axes,
                                 const int64_t *out_axes, uint64_t seed) {
  kiln_module *f = tx_parse(text), *v = tx_apply(text, spec);
  uint32_t n;
  kiln_literal **args = tx_params_rand(v, seed, 0.1, 1.0, &n);
  int64_t bsize = -1, *ia = calloc(n + 1, sizeof *ia);
  for (uint32_t i = 0; i < n; i++) {
    ia[i] =
        in_axes[i] == TX_NONE || in_axes[i] >= 0 ? in_axes[i] : in_axes[i] + args[i]->shape.rank;
    if (ia[i] != TX_NONE) bsize = args[i]->shape.dims[ia[i]];
  }
  ck_assert(bsize > 0);
  kiln_literal *r = tx_run(v, args, n);
  const kiln_literal *rl[64];
  uint32_t m = tx_leaves(r, rl, 64);
  kiln_literal **sl = calloc(n + 1, sizeof *sl);
  for (int64_t b = 0; b < bsize; b++) {
    for (uint32_t i = 0; i < n; i++)
      sl[i] = ia[i] != TX_NONE ? tx_take(args[i], ia[i], b) : tx_clone(args[i]);
    kiln_literal *one = tx_run(f, sl, n);
    const kiln_literal *ol[64];
    ck_assert_uint_eq(tx_leaves(one, ol, 64), m);
    for (uint32_t o = 0; o < m; o++) {
      int64_t oa = out_axes[o] == TX_NONE || out_axes[o] >= 0 ? out_axes[o]
                                                              : out_axes[o] + rl[o]->shape.rank;
      kiln_literal *got = oa != TX_NONE ? tx_take(rl[o], oa, b) : tx_clone(rl[o]);
      char what[64];
      snprintf(what, sizeof what, "vmap output %u, batch %lld", o, (long long)b);
      tx_expect_lit_close(got, ol[o], 1e-12, 1e-12, what);
      kiln_literal_destroy(got);
    }
    kiln_literal_destroy(one);
    for (uint32_t i = 0; i < n; i++) kiln_literal_destroy(sl[i]);
  }
  free(sl);
  free(ia);
  kiln_literal_destroy(r);
  tx_free_args(args, n);
  kiln_module_destroy(f);
  kiln_module_destroy(v);
}

#endif /* KILN_TESTS_UNIT_TEST_TRANSFORM_HARNESS_H */
