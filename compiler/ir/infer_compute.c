/* Shape inference for the computing ops: dot, convolution, reduce,
 * reduce-window, select-and-scatter, map, sort, gather, scatter, fft,
 * cholesky, triangular-solve, topk and the batch-norm family.
 *
 * Reducers (to_apply of reduce, reduce-window, scatter, the scatter of
 * select-and-scatter) are checked by one function following XLA: N
 * accumulators then N values, returning a scalar (N = 1) or a tuple of N
 * scalars; the accumulator may have a different floating-point precision
 * from the inputs and init values (a f32 reducer over bf16 data), which XLA
 * allows. Window arithmetic is checked for overflow: windows come from input.
 */
#include <string.h>

#include "compiler/ir/infer_internal.h"

#define MAX_RANK 4096

static int rank_ok(kiln__ictx *cx, uint32_t rank) {
  if (rank <= MAX_RANK) return 0;
  return kiln__fail(cx, "rank %u is over the supported %u", (unsigned)rank, MAX_RANK);
}

static bool contains(const int64_t *v, uint32_t n, int64_t x) {
  for (uint32_t i = 0; i < n; i++)
    if (v[i] == x) return true;
  return false;
}

static bool is_scalar_of(const kiln_shape *s, kiln_dtype t) {
  return kiln_shape_is_array(s) && s->rank == 0 && s->dtype == t;
}

/* ---- reducers --------------------------------------------------------- */

/* Checks a reducer of n inputs: inits[i] are the init value shapes,
 * types[i] the element types of the reduced inputs. *acc gets the
 * accumulator shapes (n scalars). */
static int check_reducer(kiln__ictx *cx, const kiln__sig *g, const char *role, uint32_t n,
                         const kiln_shape *const *inits, const kiln_dtype *types,
                         const kiln_shape **acc) {
  const char *cn = g->c->name;
  if (g->nparams != 2 * n)
    return kiln__fail(cx, "%s %%%s takes %u parameters, expected %u", role, cn,
                      (unsigned)g->nparams, (unsigned)(2 * n));
  const kiln_shape *r = g->result;
  if (kiln_shape_is_array(r)) {
    if (n != 1)
      return kiln__fail(cx, "%s %%%s returns %s, expected a tuple of %u scalars", role, cn,
                        kiln__sh(cx, r), (unsigned)n);
    acc[0] = r;
  } else if (kiln_shape_is_tuple(r) && r->rank == n) {
    for (uint32_t i = 0; i < n; i++) acc[i] = &r->tuple[i];
  } else {
    return kiln__fail(cx, "%s %%%s returns %s, expected %s%u scalars", role, cn, kiln__sh(cx, r),
                      n == 1 ? "a scalar or a tuple of " : "a tuple of ", (unsigned)n);
  }
  for (uint32_t i = 0; i < n; i++)
    if (!kiln_shape_is_array(acc[i]) || acc[i]->rank != 0)
      return kiln__fail(cx, "%s %%%s returns %s, expected scalars", role, cn, kiln__sh(cx, r));
  for (uint32_t i = 0; i < n; i++) {
    const kiln_shape *p = g->params[i], *v = g->params[n + i];
    if (!kiln__compatible(p, acc[i], false))
      return kiln__fail(cx, "%s %%%s parameter %u has type %s but its result %u has type %s", role,
                        cn, (unsigned)i, kiln__sh(cx, p), (unsigned)i, kiln__sh(cx, acc[i]));
    if (inits && !(kiln_shape_is_array(inits[i]) && inits[i]->rank == 0 &&
                   kiln__same_type_ignoring_fp(inits[i]->dtype, acc[i]->dtype)))
      return kiln__fail(cx, "init value %u has type %s but %s %%%s accumulates %s", (unsigned)i,
                        kiln__sh(cx, inits[i]), role, cn, kiln__sh(cx, acc[i]));
    if (!(kiln_shape_is_array(v) && v->rank == 0 &&
          kiln__same_type_ignoring_fp(v->dtype, types[i])))
      return kiln__fail(cx, "%s %%%s parameter %u has type %s but input %u has element type %s",
                        role, cn, (unsigned)(n + i), kiln__sh(cx, v), (unsigned)i,
                        kiln_dtype_name(types[i]));
    if (!kiln__same_type_ignoring_fp(v->dtype, acc[i]->dtype))
      return kiln__fail(cx, "%s %%%s parameter %u has type %s but its result %u has type %s", role,
                        cn, (unsigned)(n + i), kiln__sh(cx, v), (unsigned)i, kiln__sh(cx, acc[i]));
  }
  return 0;
}

/* ---- windows ----------------------------------------------------------- */

static int window_output(kiln__ictx *cx, const kiln_window *w, const kiln_shape *base,
                         const int64_t *base_dims, uint32_t rank, int64_t *out) {
  if (w->rank != rank)
    return kiln__fail(cx, "the window has %u dimensions but %s has %u", (unsigned)w->rank,
                      base ? kiln__sh(cx, base) : "the input", (unsigned)rank);
  if (rank && w->dims == NULL) return kiln__fail(cx, "the window has no dimensions");
  for (uint32_t i = 0; i < rank; i++) {
    const kiln_window_dim *d = &w->dims[i];
    if (d->size <= 0)
      return kiln__fail(cx, "window dimension %u has size %lld, expected > 0", i,
                        (long long)d->size);
    if (d->stride <= 0)
      return kiln__fail(cx, "window dimension %u has stride %lld, expected > 0", i,
                        (long long)d->stride);
    if (d->lhs_dilate < 1 || d->rhs_dilate < 1)
      return kiln__fail(cx, "window dimension %u has dilation %lld/%lld, expected >= 1", i,
                        (long long)d->lhs_dilate, (long long)d->rhs_dilate);
    int64_t b = base_dims[i], db = 0, pb, dw;
    if (b > 0 && (!kiln__mul(b - 1, d->lhs_dilate, &db) || !kiln__add(db, 1, &db))) goto overflow;
    if (!kiln__add(db, d->pad_lo, &pb) || !kiln__add(pb, d->pad_hi, &pb)) goto overflow;
    if (!kiln__mul(d->size - 1, d->rhs_dilate, &dw) || !kiln__add(dw, 1, &dw)) goto overflow;
    out[i] = pb < dw ? 0 : (pb - dw) / d->stride + 1;
    continue;
  overflow:
    return kiln__fail(cx, "window dimension %u: the padded, dilated size overflows", i);
  }
  return 0;
}

static int get_window(kiln__ictx *cx, bool required, kiln_window *empty, const kiln_window **w) {
  const kiln_attr *a = kiln_instr_attr(cx->ins, KILN_ATTR_WINDOW);
  if (a == NULL || a->v.window == NULL) {
    if (required) return kiln__fail(cx, "attribute window is missing");
    memset(empty, 0, sizeof *empty);
    *w = empty;
    return 0;
  }
  *w = a->v.window;
  return 0;
}

/* ---- dot ---------------------------------------------------------------- */

static int dot_dims(kiln__ictx *cx, const char *side, const kiln_i64s *b, const kiln_i64s *c,
                    uint32_t rank) {
  for (uint32_t k = 0; k < 2; k++) {
    const kiln_i64s *v = k ? c : b;
    const char *what = k ? "contracting" : "batch";
    for (uint32_t i = 0; i < v->n; i++) {
      if (v->v[i] < 0 || v->v[i] >= rank)
        return kiln__fail(cx, "%s %s dim %lld is out of range for rank %u", side, what,
                          (long long)v->v[i], (unsigned)rank);
      if (contains(v->v, i, v->v[i]) || (k && contains(b->v, b->n, v->v[i])))
        return kiln__fail(cx, "%s dim %lld is listed twice in the %s dimension numbers", side,
                          (long long)v->v[i], side);
    }
  }
  return 0;
}

/* The written element type wins when XLA would accept it as a preferred
 * element type: floats may narrow, integers may only widen. */
static int preferred_type(kiln__ictx *cx, kiln_dtype from, kiln_dtype *t) {
  *t = from;
  if (cx->written == NULL || !kiln_shape_is_array(cx->written)) return 0;
  kiln_dtype p = cx->written->dtype;
  if (p == from) return 0;
  if (!kiln_dtype_is_float(from) && kiln_dtype_bits(p) < kiln_dtype_bits(from))
    return kiln__fail(cx, "result type %s is narrower than the operand type %s", kiln_dtype_name(p),
                      kiln_dtype_name(from));
  *t = p;
  return 0;
}

static int infer_dot(kiln__ictx *cx, kiln_shape *out) {
  kiln_i64s lb = {0}, rb = {0}, lc = {0}, rc_ = {0};
  int rc;
  if ((rc = kiln__expect_array(cx, 0, "lhs")) || (rc = kiln__expect_array(cx, 1, "rhs")) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_LHS_BATCH_DIMS, false, &lb)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_RHS_BATCH_DIMS, false, &rb)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_LHS_CONTRACTING_DIMS, false, &lc)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_RHS_CONTRACTING_DIMS, false, &rc_)))
    return rc;
  const kiln_shape *l = kiln__oshape(cx, 0), *r = kiln__oshape(cx, 1);
  if ((rc = rank_ok(cx, l->rank)) || (rc = rank_ok(cx, r->rank)) ||
      (rc = dot_dims(cx, "lhs", &lb, &lc, l->rank)) ||
      (rc = dot_dims(cx, "rhs", &rb, &rc_, r->rank)))
    return rc;
  if (lc.n != rc_.n)
    return kiln__fail(cx, "lhs has %u contracting dims but rhs has %u", (unsigned)lc.n,
                      (unsigned)rc_.n);
  if (lb.n != rb.n)
    return kiln__fail(cx, "lhs has %u batch dims but rhs has %u", (unsigned)lb.n, (unsigned)rb.n);
  for (uint32_t i = 0; i < lc.n; i++)
    if (l->dims[lc.v[i]] != r->dims[rc_.v[i]])
      return kiln__fail(cx,
                        "lhs contracting dim %lld has size %lld but rhs contracting dim %lld "
                        "has size %lld",
                        (long long)lc.v[i], (long long)l->dims[lc.v[i]], (long long)rc_.v[i],
                        (long long)r->dims[rc_.v[i]]);
  for (uint32_t i = 0; i < lb.n; i++)
    if (l->dims[lb.v[i]] != r->dims[rb.v[i]])
      return kiln__fail(cx, "lhs batch dim %lld has size %lld but rhs batch dim %lld has size %lld",
                        (long long)lb.v[i], (long long)l->dims[lb.v[i]], (long long)rb.v[i],
                        (long long)r->dims[rb.v[i]]);
  int64_t dims[2 * MAX_RANK];
  uint8_t dyn[2 * MAX_RANK];
  uint32_t n = 0;
  for (uint32_t i = 0; i < lb.n; i++, n++) {
    dims[n] = l->dims[lb.v[i]];
    dyn[n] = kiln__is_dyn(l, (uint32_t)lb.v[i]);
  }
  for (uint32_t i = 0; i < l->rank; i++)
    if (!contains(lb.v, lb.n, i) && !contains(lc.v, lc.n, i)) {
      dims[n] = l->dims[i];
      dyn[n++] = kiln__is_dyn(l, i);
    }
  for (uint32_t i = 0; i < r->rank; i++)
    if (!contains(rb.v, rb.n, i) && !contains(rc_.v, rc_.n, i)) {
      dims[n] = r->dims[i];
      dyn[n++] = kiln__is_dyn(r, i);
    }
  kiln_dtype t;
  if ((rc = preferred_type(cx, kiln__higher_precision(l->dtype, r->dtype), &t))) return rc;
  return kiln__make_array(cx, out, t, dims, dyn, n);
}

/* ---- convolution ---------------------------------------------------------- */

static int conv_perm(kiln__ictx *cx, const char *what, int64_t a, int64_t b, const int64_t *sp,
                     uint32_t ns) {
  int64_t n = ns + 2;
  uint8_t seen[MAX_RANK + 2] = {0};
  for (int64_t k = 0; k < n; k++) {
    int64_t d = k == 0 ? a : k == 1 ? b : sp[k - 2];
    if (d < 0 || d >= n)
      return kiln__fail(cx, "dim_labels: %s dimension %lld is out of range for rank %lld", what,
                        (long long)d, (long long)n);
    if (seen[d]++)
      return kiln__fail(cx, "dim_labels: %s dimension %lld appears twice", what, (long long)d);
  }
  return 0;
}

static int infer_convolution(kiln__ictx *cx, kiln_shape *out) {
  int rc;
  int64_t fgc = 0, bgc = 0;
  kiln_window empty;
  const kiln_window *w;
  if ((rc = kiln__expect_array(cx, 0, "lhs")) || (rc = kiln__expect_array(cx, 1, "rhs")) ||
      (rc = kiln__attr_int(cx, KILN_ATTR_FEATURE_GROUP_COUNT, false, 1, &fgc)) ||
      (rc = kiln__attr_int(cx, KILN_ATTR_BATCH_GROUP_COUNT, false, 1, &bgc)) ||
      (rc = get_window(cx, false, &empty, &w)))
    return rc;
  const kiln_attr *da = kiln_instr_attr(cx->ins, KILN_ATTR_DIM_LABELS);
  if (da == NULL || da->v.conv == NULL) return kiln__fail(cx, "attribute dim_labels is missing");
  const kiln_conv_dims *d = da->v.conv;
  const kiln_shape *l = kiln__oshape(cx, 0), *r = kiln__oshape(cx, 1);
  uint32_t ns = d->nspatial;
  if (fgc <= 0) return kiln__fail(cx, "feature_group_count is %lld, expected > 0", (long long)fgc);
  if (bgc <= 0) return kiln__fail(cx, "batch_group_count is %lld, expected > 0", (long long)bgc);
  if (fgc > 1 && bgc > 1)
    return kiln__fail(cx, "feature_group_count %lld and batch_group_count %lld cannot both be > 1",
                      (long long)fgc, (long long)bgc);
  if (ns > MAX_RANK || (ns && (!d->in_spatial || !d->kernel_spatial || !d->out_spatial)))
    return kiln__fail(cx, "dim_labels has an invalid number of spatial dimensions");
  if (w->rank != ns)
    return kiln__fail(cx, "the window has %u dimensions but dim_labels has %u spatial dimensions",
                      (unsigned)w->rank, (unsigned)ns);
  if (l->rank != ns + 2)
    return kiln__fail(cx, "%s (lhs) has rank %u, expected %u", kiln__on(cx, 0), (unsigned)l->rank,
                      (unsigned)(ns + 2));
  if (r->rank != ns + 2)
    return kiln__fail(cx, "%s (rhs) has rank %u, expected %u", kiln__on(cx, 1), (unsigned)r->rank,
                      (unsigned)(ns + 2));
  if ((rc = conv_perm(cx, "input", d->in_batch, d->in_feature, d->in_spatial, ns)) ||
      (rc = conv_perm(cx, "kernel", d->kernel_in, d->kernel_out, d->kernel_spatial, ns)) ||
      (rc = conv_perm(cx, "output", d->out_batch, d->out_feature, d->out_spatial, ns)))
    return rc;
  int64_t in_f = l->dims[d->in_feature], in_b = l->dims[d->in_batch];
  int64_t k_in = r->dims[d->kernel_in], k_out = r->dims[d->kernel_out];
  if (k_out % bgc)
    return kiln__fail(cx,
                      "kernel output features %lld are not a multiple of batch_group_count %lld",
                      (long long)k_out, (long long)bgc);
  if (in_f % fgc || in_f / fgc != k_in)
    return kiln__fail(cx,
                      "lhs features %lld / feature_group_count %lld must equal the kernel "
                      "input features %lld",
                      (long long)in_f, (long long)fgc, (long long)k_in);
  if (k_out % fgc)
    return kiln__fail(cx,
                      "kernel output features %lld are not a multiple of feature_group_count "
                      "%lld",
                      (long long)k_out, (long long)fgc);
  if (in_b % bgc)
    return kiln__fail(cx, "lhs batch %lld is not a multiple of batch_group_count %lld",
                      (long long)in_b, (long long)bgc);
  int64_t base[MAX_RANK], sp[MAX_RANK];
  for (uint32_t i = 0; i < ns; i++) {
    base[i] = l->dims[d->in_spatial[i]];
    if (r->dims[d->kernel_spatial[i]] != w->dims[i].size)
      return kiln__fail(cx,
                        "window dimension %u has size %lld but the kernel's spatial dimension "
                        "%lld has size %lld",
                        i, (long long)w->dims[i].size, (long long)d->kernel_spatial[i],
                        (long long)r->dims[d->kernel_spatial[i]]);
  }
  if ((rc = window_output(cx, w, NULL, base, ns, sp))) return rc;
  int64_t dims[MAX_RANK + 2];
  uint8_t dyn[MAX_RANK + 2] = {0};
  dims[d->out_batch] = in_b / bgc;
  dims[d->out_feature] = k_out;
  dyn[d->out_batch] = kiln__is_dyn(l, (uint32_t)d->in_batch);
  for (uint32_t i = 0; i < ns; i++) {
    dims[d->out_spatial[i]] = sp[i];
    dyn[d->out_spatial[i]] = kiln__is_dyn(l, (uint32_t)d->in_spatial[i]) ||
                             kiln__is_dyn(r, (uint32_t)d->kernel_spatial[i]);
  }
  if (kiln__is_dyn(r, (uint32_t)d->kernel_out))
    return kiln__fail(cx, "a dynamic kernel output feature dimension is not supported");
  kiln_dtype t;
  if ((rc = preferred_type(cx, kiln__higher_precision(l->dtype, r->dtype), &t))) return rc;
  return kiln__make_array(cx, out, t, dims, dyn, ns + 2);
}

/* ---- reduce, reduce-window, select-and-scatter ------------------------------ */

/* Splits 2N operands into N inputs and N init values; checks the inputs
 * are arrays of one set of dims. */
static int split_inputs(kiln__ictx *cx, uint32_t *n) {
  uint32_t k = cx->ins->noperands;
  int rc;
  if (k < 2 || k % 2)
    return kiln__fail(cx,
                      "takes N inputs and N init values (an even count >= 2), found %u "
                      "operands",
                      (unsigned)k);
  *n = k / 2;
  for (uint32_t i = 0; i < k; i++)
    if ((rc = kiln__expect_array(cx, i, i < *n ? NULL : "init value"))) return rc;
  for (uint32_t i = 1; i < *n; i++)
    if (!kiln__same_dims(kiln__oshape(cx, i), kiln__oshape(cx, 0)))
      return kiln__fail(cx, "%s has shape %s but %s has shape %s", kiln__on(cx, i),
                        kiln__sh(cx, kiln__oshape(cx, i)), kiln__on(cx, 0),
                        kiln__sh(cx, kiln__oshape(cx, 0)));
  return 0;
}

static int reducer_of_operands(kiln__ictx *cx, uint32_t n, const kiln_shape ***acc) {
  kiln__sig g;
  int rc;
  if ((rc = kiln__expect_called(cx, 1)) || (rc = kiln__called_sig(cx, 0, "to_apply", &g)))
    return rc;
  const kiln_shape **inits = kiln_arena_calloc(cx->tmp, n, sizeof *inits);
  kiln_dtype *types = kiln_arena_calloc(cx->tmp, n, sizeof *types);
  *acc = kiln_arena_calloc(cx->tmp, n, sizeof **acc);
  if (!inits || !types || !*acc) return kiln__oom(cx);
  for (uint32_t i = 0; i < n; i++) {
    inits[i] = kiln__oshape(cx, n + i);
    types[i] = kiln__oshape(cx, i)->dtype;
  }
  return check_reducer(cx, &g, "to_apply", n, inits, types, *acc);
}

/* One shape per reduced input (n == 1 and a scalar reducer: no tuple). */
static int finish_variadic(kiln__ictx *cx, kiln_shape *out, kiln_shape *per, uint32_t n,
                           bool tuple) {
  if (!tuple) {
    *out = per[0];
    return 0;
  }
  memset(out, 0, sizeof *out);
  out->dtype = KILN_TUPLE;
  out->rank = n;
  out->tuple = kiln_arena_calloc(cx->out, n, sizeof *out->tuple);
  if (out->tuple == NULL) return kiln__oom(cx);
  memcpy(out->tuple, per, n * sizeof *per);
  return 0;
}

static int infer_reduce(kiln__ictx *cx, kiln_shape *out) {
  uint32_t n;
  kiln_i64s d = {0};
  const kiln_shape **acc;
  int rc;
  if ((rc = split_inputs(cx, &n))) return rc;
  const kiln_shape *s = kiln__oshape(cx, 0);
  if ((rc = kiln__attr_ints(cx, KILN_ATTR_DIMENSIONS, true, &d)) ||
      (rc = kiln__check_dims(cx, "dimensions", d.v, d.n, s->rank)) || (rc = rank_ok(cx, s->rank)) ||
      (rc = reducer_of_operands(cx, n, &acc)))
    return rc;
  int64_t dims[MAX_RANK];
  uint8_t dyn[MAX_RANK];
  uint32_t r = 0;
  for (uint32_t i = 0; i < s->rank; i++)
    if (!contains(d.v, d.n, i)) {
      dims[r] = s->dims[i];
      dyn[r++] = kiln__is_dyn(s, i);
    }
  kiln_shape *per = kiln_arena_calloc(cx->out, n, sizeof *per);
  if (per == NULL) return kiln__oom(cx);
  for (uint32_t i = 0; i < n; i++)
    if ((rc = kiln__make_array(cx, &per[i], acc[i]->dtype, dims, dyn, r))) return rc;
  kiln__sig g;
  (void)kiln__called_sig(cx, 0, "to_apply", &g);
  return finish_variadic(cx, out, per, n, kiln_shape_is_tuple(g.result));
}

static int infer_reduce_window(kiln__ictx *cx, kiln_shape *out) {
  uint32_t n;
  const kiln_shape **acc;
  const kiln_window *w;
  kiln_window empty;
  int rc;
  if ((rc = split_inputs(cx, &n))) return rc;
  const kiln_shape *s = kiln__oshape(cx, 0);
  if ((rc = get_window(cx, s->rank != 0, &empty, &w)) || (rc = rank_ok(cx, s->rank)) ||
      (rc = reducer_of_operands(cx, n, &acc)))
    return rc;
  int64_t dims[MAX_RANK];
  if ((rc = window_output(cx, w, s, s->dims, s->rank, dims))) return rc;
  kiln_shape *per = kiln_arena_calloc(cx->out, n, sizeof *per);
  if (per == NULL) return kiln__oom(cx);
  for (uint32_t i = 0; i < n; i++)
    if ((rc = kiln__make_array(cx, &per[i], kiln__oshape(cx, n + i)->dtype, dims, s->dynamic,
                               s->rank)))
      return rc;
  kiln__sig g;
  (void)kiln__called_sig(cx, 0, "to_apply", &g);
  return finish_variadic(cx, out, per, n, kiln_shape_is_tuple(g.result));
}

static int infer_select_and_scatter(kiln__ictx *cx, kiln_shape *out) {
  kiln__sig sel, sca;
  const kiln_window *w;
  kiln_window empty;
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) || (rc = kiln__expect_array(cx, 1, "source")) ||
      (rc = kiln__expect_array(cx, 2, "init value")) || (rc = kiln__expect_called(cx, 2)) ||
      (rc = kiln__called_sig(cx, 0, "select", &sel)) ||
      (rc = kiln__called_sig(cx, 1, "scatter", &sca)))
    return rc;
  const kiln_shape *s = kiln__oshape(cx, 0), *src = kiln__oshape(cx, 1);
  if ((rc = get_window(cx, s->rank != 0, &empty, &w)) || (rc = rank_ok(cx, s->rank))) return rc;
  if (sel.nparams != 2)
    return kiln__fail(cx, "select %%%s takes %u parameters, expected 2", sel.c->name,
                      (unsigned)sel.nparams);
  if (!is_scalar_of(sel.result, KILN_PRED))
    return kiln__fail(cx, "select %%%s returns %s, expected pred[]", sel.c->name,
                      kiln__sh(cx, sel.result));
  for (uint32_t i = 0; i < 2; i++) {
    const kiln_shape *p = sel.params[i];
    if (!(kiln_shape_is_array(p) && p->rank == 0 &&
          kiln__same_type_ignoring_fp(p->dtype, s->dtype)))
      return kiln__fail(cx, "select %%%s parameter %u has type %s but %s has element type %s",
                        sel.c->name, i, kiln__sh(cx, p), kiln__on(cx, 0),
                        kiln_dtype_name(s->dtype));
  }
  const kiln_shape *init = kiln__oshape(cx, 2), *acc;
  kiln_dtype st = src->dtype;
  if ((rc = check_reducer(cx, &sca, "scatter", 1, &init, &st, &acc))) return rc;
  int64_t dims[MAX_RANK];
  if ((rc = window_output(cx, w, s, s->dims, s->rank, dims))) return rc;
  bool same = src->rank == s->rank && kiln__same_type_ignoring_fp(src->dtype, s->dtype);
  for (uint32_t i = 0; same && i < s->rank; i++) same = src->dims[i] == dims[i];
  if (!same) {
    kiln_shape ws = {.dtype = s->dtype, .rank = s->rank, .dims = dims};
    return kiln__fail(cx, "%s (the source) has shape %s but the windows of %s give %s",
                      kiln__on(cx, 1), kiln__sh(cx, src), kiln__on(cx, 0), kiln__sh(cx, &ws));
  }
  return kiln__copy(cx, out, s);
}

/* ---- map, sort ------------------------------------------------------------ */

static int infer_map(kiln__ictx *cx, kiln_shape *out) {
  kiln__sig g;
  kiln_i64s d = {0};
  int rc;
  uint32_t n = cx->ins->noperands;
  if ((rc = kiln__expect_operands(cx, 1, -1))) return rc;
  for (uint32_t i = 0; i < n; i++)
    if ((rc = kiln__expect_array(cx, i, NULL))) return rc;
  const kiln_shape *s = kiln__oshape(cx, 0);
  for (uint32_t i = 1; i < n; i++)
    if (!kiln__same_dims(kiln__oshape(cx, i), s))
      return kiln__fail(cx, "%s has shape %s but %s has shape %s", kiln__on(cx, i),
                        kiln__sh(cx, kiln__oshape(cx, i)), kiln__on(cx, 0), kiln__sh(cx, s));
  if ((rc = kiln__attr_ints(cx, KILN_ATTR_DIMENSIONS, false, &d))) return rc;
  if (kiln_instr_has_attr(cx->ins, KILN_ATTR_DIMENSIONS)) {
    bool ok = d.n == s->rank;
    for (uint32_t i = 0; ok && i < d.n; i++) ok = d.v[i] == i;
    if (!ok)
      return kiln__fail(cx, "dimensions=%s must list every dimension of the operands in order",
                        kiln__ints(cx, d.v, d.n));
  }
  if ((rc = kiln__expect_called(cx, 1)) || (rc = kiln__called_sig(cx, 0, "to_apply", &g)))
    return rc;
  if (g.nparams != n)
    return kiln__fail(cx, "to_apply %%%s takes %u parameters, expected %u", g.c->name,
                      (unsigned)g.nparams, (unsigned)n);
  if (!kiln_shape_is_array(g.result) || g.result->rank != 0)
    return kiln__fail(cx, "to_apply %%%s returns %s, expected a scalar", g.c->name,
                      kiln__sh(cx, g.result));
  for (uint32_t i = 0; i < n; i++) {
    const kiln_shape *p = g.params[i];
    if (!(kiln_shape_is_array(p) && p->rank == 0 &&
          kiln__same_type_ignoring_fp(p->dtype, kiln__oshape(cx, i)->dtype)))
      return kiln__fail(cx, "to_apply %%%s parameter %u has type %s but %s has element type %s",
                        g.c->name, i, kiln__sh(cx, p), kiln__on(cx, i),
                        kiln_dtype_name(kiln__oshape(cx, i)->dtype));
  }
  return kiln__make_array(cx, out, g.result->dtype, s->dims, s->dynamic, s->rank);
}

static int infer_sort(kiln__ictx *cx, kiln_shape *out) {
  kiln__sig g;
  kiln_i64s d = {0};
  int rc;
  uint32_t n = cx->ins->noperands;
  if ((rc = kiln__expect_operands(cx, 1, -1))) return rc;
  for (uint32_t i = 0; i < n; i++)
    if ((rc = kiln__expect_array(cx, i, NULL))) return rc;
  const kiln_shape *s = kiln__oshape(cx, 0);
  for (uint32_t i = 1; i < n; i++)
    if (!kiln__same_dims(kiln__oshape(cx, i), s))
      return kiln__fail(cx, "%s has shape %s but %s has shape %s", kiln__on(cx, i),
                        kiln__sh(cx, kiln__oshape(cx, i)), kiln__on(cx, 0), kiln__sh(cx, s));
  if ((rc = kiln__attr_ints(cx, KILN_ATTR_DIMENSIONS, true, &d))) return rc;
  if (d.n != 1)
    return kiln__fail(cx, "dimensions=%s must name exactly one dimension",
                      kiln__ints(cx, d.v, d.n));
  if ((rc = kiln__check_dims(cx, "dimensions", d.v, 1, s->rank))) return rc;
  if ((rc = kiln__expect_called(cx, 1)) || (rc = kiln__called_sig(cx, 0, "comparator", &g)))
    return rc;
  if (g.nparams != 2 * n)
    return kiln__fail(cx, "comparator %%%s takes %u parameters, expected %u", g.c->name,
                      (unsigned)g.nparams, (unsigned)(2 * n));
  if (!is_scalar_of(g.result, KILN_PRED))
    return kiln__fail(cx, "comparator %%%s returns %s, expected pred[]", g.c->name,
                      kiln__sh(cx, g.result));
  for (uint32_t i = 0; i < 2 * n; i++) {
    const kiln_shape *p = g.params[i];
    kiln_dtype t = kiln__oshape(cx, i / 2)->dtype;
    if (!(kiln_shape_is_array(p) && p->rank == 0 && kiln__same_type_ignoring_fp(p->dtype, t)))
      return kiln__fail(cx, "comparator %%%s parameter %u has type %s but %s has element type %s",
                        g.c->name, i, kiln__sh(cx, p), kiln__on(cx, i / 2), kiln_dtype_name(t));
  }
  if (n == 1) return kiln__copy(cx, out, s);
  const kiln_shape **el = kiln_arena_calloc(cx->tmp, n, sizeof *el);
  if (el == NULL) return kiln__oom(cx);
  for (uint32_t i = 0; i < n; i++) el[i] = kiln__oshape(cx, i);
  return kiln__make_tuple(cx, out, el, n);
}

/* ---- gather, scatter ----------------------------------------------------------- */

/* Sorted strictly increasing and in [0, rank). */
static int sorted_dims(kiln__ictx *cx, const char *what, const kiln_i64s *v, int64_t rank) {
  for (uint32_t i = 0; i < v->n; i++) {
    if (v->v[i] < 0 || v->v[i] >= rank)
      return kiln__fail(cx, "%s=%s: dimension %lld is out of range for rank %lld", what,
                        kiln__ints(cx, v->v, v->n), (long long)v->v[i], (long long)rank);
    if (i && v->v[i] <= v->v[i - 1])
      return kiln__fail(cx, "%s=%s must be sorted and without repeats", what,
                        kiln__ints(cx, v->v, v->n));
  }
  return 0;
}

/* Index-side checks shared by gather and scatter: index_vector_dim, the
 * index map into the operand and the batching dims. `idims` receives the
 * indices' dims with the implicit trailing 1 when index_vector_dim equals
 * the rank; returns its length in *irank. */
typedef struct index_spec {
  const char *map_name, *ibatch_name, *obatch_name;
  kiln_i64s map, obatch, ibatch, collapsed;
  int64_t ivd;
} index_spec;

static int check_indices(kiln__ictx *cx, const kiln_shape *op, const kiln_shape *ix,
                         const index_spec *p, int64_t *idims, uint32_t *irank) {
  int rc;
  if (!kiln_dtype_is_integral(ix->dtype))
    return kiln__fail(cx, "%s holds the indices and must have an integer type, found %s",
                      kiln__on(cx, 1), kiln__sh(cx, ix));
  if (p->ivd < 0 || p->ivd > ix->rank)
    return kiln__fail(cx, "index_vector_dim %lld is out of range for the indices %s",
                      (long long)p->ivd, kiln__sh(cx, ix));
  *irank = ix->rank;
  if (ix->rank) memcpy(idims, ix->dims, ix->rank * sizeof *idims);
  if (p->ivd == ix->rank) idims[(*irank)++] = 1;
  if (p->map.n != idims[p->ivd])
    return kiln__fail(cx,
                      "%s has %u entries but index_vector_dim %lld of the indices has size %lld",
                      p->map_name, (unsigned)p->map.n, (long long)p->ivd, (long long)idims[p->ivd]);
  if ((rc = kiln__check_dims(cx, p->map_name, p->map.v, p->map.n, op->rank)) ||
      (rc = sorted_dims(cx, p->obatch_name, &p->obatch, op->rank)))
    return rc;
  for (uint32_t i = 0; i < p->obatch.n; i++) {
    if (contains(p->collapsed.v, p->collapsed.n, p->obatch.v[i]))
      return kiln__fail(cx, "dimension %lld is both collapsed and a batching dim",
                        (long long)p->obatch.v[i]);
    if (contains(p->map.v, p->map.n, p->obatch.v[i]))
      return kiln__fail(cx, "dimension %lld is both a batching dim and in %s",
                        (long long)p->obatch.v[i], p->map_name);
  }
  if (p->ibatch.n != p->obatch.n)
    return kiln__fail(cx, "%s has %u entries but %s has %u", p->ibatch_name, (unsigned)p->ibatch.n,
                      p->obatch_name, (unsigned)p->obatch.n);
  if ((rc = kiln__check_dims(cx, p->ibatch_name, p->ibatch.v, p->ibatch.n, ix->rank))) return rc;
  for (uint32_t i = 0; i < p->ibatch.n; i++) {
    if (p->ibatch.v[i] == p->ivd)
      return kiln__fail(cx, "%s contains index_vector_dim %lld", p->ibatch_name, (long long)p->ivd);
    if (ix->dims[p->ibatch.v[i]] != op->dims[p->obatch.v[i]])
      return kiln__fail(cx,
                        "indices batching dim %lld has size %lld but operand batching dim "
                        "%lld has size %lld",
                        (long long)p->ibatch.v[i], (long long)ix->dims[p->ibatch.v[i]],
                        (long long)p->obatch.v[i], (long long)op->dims[p->obatch.v[i]]);
  }
  return 0;
}

static int infer_gather(kiln__ictx *cx, kiln_shape *out) {
  kiln_i64s off = {0}, sizes = {0};
  index_spec p = {.map_name = "start_index_map",
                  .ibatch_name = "start_indices_batching_dims",
                  .obatch_name = "operand_batching_dims"};
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) || (rc = kiln__expect_array(cx, 1, "start indices")) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_OFFSET_DIMS, false, &off)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_COLLAPSED_SLICE_DIMS, false, &p.collapsed)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_START_INDEX_MAP, false, &p.map)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_OPERAND_BATCHING_DIMS, false, &p.obatch)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_START_INDICES_BATCHING_DIMS, false, &p.ibatch)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_SLICE_SIZES, true, &sizes)) ||
      (rc = kiln__attr_int(cx, KILN_ATTR_INDEX_VECTOR_DIM, true, 0, &p.ivd)))
    return rc;
  const kiln_shape *op = kiln__oshape(cx, 0), *ix = kiln__oshape(cx, 1);
  if ((rc = rank_ok(cx, op->rank)) || (rc = rank_ok(cx, ix->rank + 1))) return rc;
  int64_t idims[MAX_RANK + 1];
  uint32_t irank;
  if ((rc = sorted_dims(cx, "collapsed_slice_dims", &p.collapsed, op->rank)) ||
      (rc = check_indices(cx, op, ix, &p, idims, &irank)))
    return rc;
  if ((uint64_t)off.n + p.collapsed.n + p.obatch.n != op->rank)
    return kiln__fail(cx,
                      "offset_dims (%u), collapsed_slice_dims (%u) and operand_batching_dims "
                      "(%u) must add up to the operand rank %u",
                      (unsigned)off.n, (unsigned)p.collapsed.n, (unsigned)p.obatch.n,
                      (unsigned)op->rank);
  uint32_t out_rank = off.n + irank - 1;
  if ((rc = sorted_dims(cx, "offset_dims", &off, out_rank))) return rc;
  if (sizes.n != op->rank)
    return kiln__fail(cx, "slice_sizes=%s has %u entries but %s has rank %u",
                      kiln__ints(cx, sizes.v, sizes.n), (unsigned)sizes.n, kiln__on(cx, 0),
                      (unsigned)op->rank);
  for (uint32_t i = 0; i < sizes.n; i++) {
    if (sizes.v[i] < 0 || sizes.v[i] > op->dims[i])
      return kiln__fail(cx, "slice size %lld for dimension %u is out of range [0, %lld]",
                        (long long)sizes.v[i], i, (long long)op->dims[i]);
    if ((contains(p.collapsed.v, p.collapsed.n, i) || contains(p.obatch.v, p.obatch.n, i)) &&
        sizes.v[i] > 1)
      return kiln__fail(cx,
                        "dimension %u is collapsed or batching, so its slice size must be 0 or "
                        "1, found %lld",
                        i, (long long)sizes.v[i]);
  }
  int64_t dims[2 * MAX_RANK + 1];
  uint8_t dyn[2 * MAX_RANK + 1];
  uint32_t od = 0, bd = 0;
  for (uint32_t i = 0; i < out_rank; i++) {
    if (contains(off.v, off.n, i)) {
      while (contains(p.collapsed.v, p.collapsed.n, od) || contains(p.obatch.v, p.obatch.n, od))
        od++;
      dims[i] = sizes.v[od];
      dyn[i] = sizes.v[od] == op->dims[od] && kiln__is_dyn(op, od);
      od++;
    } else {
      if (bd == p.ivd) bd++;
      dims[i] = idims[bd];
      dyn[i] = kiln__is_dyn(ix, bd);
      bd++;
    }
  }
  return kiln__make_array(cx, out, op->dtype, dims, dyn, out_rank);
}

/* Each updates operand: window dims bounded by the operand's, scatter dims
 * equal to the indices' (idims, irank as check_indices gives them). */
static int check_scatter_updates(kiln__ictx *cx, const kiln_shape *op, const index_spec *p,
                                 const kiln_i64s *win, const int64_t *idims, uint32_t irank) {
  int rc;
  uint32_t k = cx->ins->noperands, n = k / 2;
  uint32_t urank = irank - 1 + win->n;
  for (uint32_t u = n + 1; u < k; u++) {
    const kiln_shape *up = kiln__oshape(cx, u);
    if (up->rank != urank)
      return kiln__fail(cx, "%s (updates) has rank %u, expected %u", kiln__on(cx, u),
                        (unsigned)up->rank, (unsigned)urank);
    if ((rc = sorted_dims(cx, "update_window_dims", win, up->rank))) return rc;
    uint32_t od = 0, sd = 0;
    for (uint32_t i = 0; i < up->rank; i++) {
      if (contains(win->v, win->n, i)) {
        while (contains(p->collapsed.v, p->collapsed.n, od) ||
               contains(p->obatch.v, p->obatch.n, od))
          od++;
        if (up->dims[i] > op->dims[od])
          return kiln__fail(cx,
                            "%s window dimension %u has size %lld, over the size %lld of "
                            "operand dimension %u",
                            kiln__on(cx, u), i, (long long)up->dims[i], (long long)op->dims[od],
                            od);
        od++;
      } else {
        if (sd == p->ivd) sd++;
        if (up->dims[i] != idims[sd])
          return kiln__fail(cx,
                            "%s scatter dimension %u has size %lld but indices dimension %u "
                            "has size %lld",
                            kiln__on(cx, u), i, (long long)up->dims[i], sd, (long long)idims[sd]);
        sd++;
      }
    }
  }
  return 0;
}

static int infer_scatter(kiln__ictx *cx, kiln_shape *out) {
  kiln_i64s win = {0};
  index_spec p = {.map_name = "scatter_dims_to_operand_dims",
                  .ibatch_name = "scatter_indices_batching_dims",
                  .obatch_name = "input_batching_dims"};
  int rc;
  uint32_t k = cx->ins->noperands;
  if (k < 3 || k % 2 == 0)
    return kiln__fail(cx,
                      "takes N operands, the indices and N updates (an odd count >= 3), found %u",
                      (unsigned)k);
  uint32_t n = k / 2;
  for (uint32_t i = 0; i < k; i++)
    if ((rc = kiln__expect_array(cx, i, i == n ? "indices" : i > n ? "updates" : NULL))) return rc;
  if ((rc = kiln__attr_ints(cx, KILN_ATTR_UPDATE_WINDOW_DIMS, false, &win)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_INSERTED_WINDOW_DIMS, false, &p.collapsed)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_SCATTER_DIMS_TO_OPERAND_DIMS, false, &p.map)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_INPUT_BATCHING_DIMS, false, &p.obatch)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_SCATTER_INDICES_BATCHING_DIMS, false, &p.ibatch)) ||
      (rc = kiln__attr_int(cx, KILN_ATTR_INDEX_VECTOR_DIM, true, 0, &p.ivd)))
    return rc;
  const kiln_shape *op = kiln__oshape(cx, 0), *ix = kiln__oshape(cx, n);
  /* check_indices names operand 1 as the indices; scatter's are operand n. */
  if (!kiln_dtype_is_integral(ix->dtype))
    return kiln__fail(cx, "%s holds the indices and must have an integer type, found %s",
                      kiln__on(cx, n), kiln__sh(cx, ix));
  if ((rc = rank_ok(cx, op->rank)) || (rc = rank_ok(cx, ix->rank + 1))) return rc;
  int64_t idims[MAX_RANK + 1];
  uint32_t irank;
  if ((rc = sorted_dims(cx, "inserted_window_dims", &p.collapsed, op->rank)) ||
      (rc = check_indices(cx, op, ix, &p, idims, &irank)))
    return rc;
  for (uint32_t i = 1; i < n; i++)
    if (!kiln__same_dims(kiln__oshape(cx, i), op))
      return kiln__fail(cx, "%s has shape %s but %s has shape %s", kiln__on(cx, i),
                        kiln__sh(cx, kiln__oshape(cx, i)), kiln__on(cx, 0), kiln__sh(cx, op));
  if ((uint64_t)win.n + p.collapsed.n + p.obatch.n != op->rank)
    return kiln__fail(cx,
                      "update_window_dims (%u), inserted_window_dims (%u) and "
                      "input_batching_dims (%u) must add up to the operand rank %u",
                      (unsigned)win.n, (unsigned)p.collapsed.n, (unsigned)p.obatch.n,
                      (unsigned)op->rank);
  if ((rc = check_scatter_updates(cx, op, &p, &win, idims, irank))) return rc;
  kiln__sig g;
  if ((rc = kiln__expect_called(cx, 1)) || (rc = kiln__called_sig(cx, 0, "to_apply", &g)))
    return rc;
  kiln_shape *inits = kiln_arena_calloc(cx->tmp, n, sizeof *inits);
  const kiln_shape **ip = kiln_arena_calloc(cx->tmp, n, sizeof *ip);
  const kiln_shape **acc = kiln_arena_calloc(cx->tmp, n, sizeof *acc);
  kiln_dtype *types = kiln_arena_calloc(cx->tmp, n, sizeof *types);
  if (!inits || !ip || !acc || !types) return kiln__oom(cx);
  for (uint32_t i = 0; i < n; i++) {
    inits[i].dtype = kiln__oshape(cx, i)->dtype;
    ip[i] = &inits[i];
    types[i] = kiln__oshape(cx, n + 1 + i)->dtype;
  }
  if ((rc = check_reducer(cx, &g, "to_apply", n, ip, types, acc))) return rc;
  if (n == 1) return kiln__copy(cx, out, op);
  const kiln_shape **el = kiln_arena_calloc(cx->tmp, n, sizeof *el);
  if (el == NULL) return kiln__oom(cx);
  for (uint32_t i = 0; i < n; i++) el[i] = kiln__oshape(cx, i);
  return kiln__make_tuple(cx, out, el, n);
}

/* ---- linear algebra, fft, topk, batch norm ---------------------------------------- */

static int infer_fft(kiln__ictx *cx, kiln_shape *out) {
  kiln_i64s len = {0};
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_FFT_LENGTH, true, &len)))
    return rc;
  const char *ty = kiln_instr_attr_str(cx->ins, KILN_ATTR_FFT_TYPE);
  const kiln_shape *s = kiln__oshape(cx, 0);
  if (ty == NULL) return kiln__fail(cx, "attribute fft_type is missing");
  if (len.n < 1 || len.n > 3)
    return kiln__fail(cx, "fft_length=%s must have 1 to 3 entries", kiln__ints(cx, len.v, len.n));
  if (s->rank < len.n)
    return kiln__fail(cx, "an FFT of rank %u needs an operand of rank >= %u, found %s",
                      (unsigned)len.n, (unsigned)len.n, kiln__sh(cx, s));
  uint32_t r0 = s->rank - len.n;
  bool cplx = kiln_dtype_is_complex(s->dtype);
  int rc2;
  if (strcmp(ty, "FFT") == 0 || strcmp(ty, "IFFT") == 0) {
    if (!cplx) return kiln__fail(cx, "%s needs a complex operand, found %s", ty, kiln__sh(cx, s));
    return kiln__copy(cx, out, s);
  }
  if (strcmp(ty, "RFFT") == 0) {
    if (s->dtype != KILN_F32 && s->dtype != KILN_F64)
      return kiln__fail(cx, "RFFT needs an f32 or f64 operand, found %s", kiln__sh(cx, s));
    for (uint32_t i = 0; i < len.n; i++)
      if (s->dims[r0 + i] != len.v[i])
        return kiln__fail(cx, "RFFT: dimension %u has size %lld but fft_length says %lld", r0 + i,
                          (long long)s->dims[r0 + i], (long long)len.v[i]);
    if ((rc2 = kiln__make_array(cx, out, s->dtype == KILN_F32 ? KILN_C64 : KILN_C128, s->dims,
                                s->dynamic, s->rank)))
      return rc2;
    if (len.v[len.n - 1] != 0) out->dims[s->rank - 1] = len.v[len.n - 1] / 2 + 1;
    return 0;
  }
  if (strcmp(ty, "IRFFT") == 0) {
    if (!cplx) return kiln__fail(cx, "IRFFT needs a complex operand, found %s", kiln__sh(cx, s));
    for (uint32_t i = 0; i + 1 < len.n; i++)
      if (s->dims[r0 + i] != len.v[i])
        return kiln__fail(cx, "IRFFT: dimension %u has size %lld but fft_length says %lld", r0 + i,
                          (long long)s->dims[r0 + i], (long long)len.v[i]);
    int64_t last = s->dims[s->rank - 1], want = len.v[len.n - 1] / 2 + 1;
    if ((last != 0 || len.v[len.n - 1] != 0) && last != want)
      return kiln__fail(cx,
                        "IRFFT: the last dimension has size %lld, expected fft_length/2+1 = %lld",
                        (long long)last, (long long)want);
    if ((rc2 = kiln__make_array(cx, out, s->dtype == KILN_C64 ? KILN_F32 : KILN_F64, s->dims,
                                s->dynamic, s->rank)))
      return rc2;
    out->dims[s->rank - 1] = len.v[len.n - 1];
    return 0;
  }
  return kiln__fail(cx, "fft_type %s is not one of FFT, IFFT, RFFT, IRFFT", ty);
}

static int square_minor(kiln__ictx *cx, uint32_t i, const char *who) {
  const kiln_shape *a = kiln__oshape(cx, i);
  if (!kiln_dtype_is_float(a->dtype) && !kiln_dtype_is_complex(a->dtype))
    return kiln__fail(cx, "%s (%s) has type %s, expected a floating-point or complex type",
                      kiln__on(cx, i), who, kiln__sh(cx, a));
  if (a->rank < 2)
    return kiln__fail(cx, "%s (%s) has rank %u, expected >= 2", kiln__on(cx, i), who,
                      (unsigned)a->rank);
  if (a->dims[a->rank - 1] != a->dims[a->rank - 2])
    return kiln__fail(cx, "%s (%s) %s is not square in its two minor dimensions", kiln__on(cx, i),
                      who, kiln__sh(cx, a));
  return 0;
}

static int infer_cholesky(kiln__ictx *cx, kiln_shape *out) {
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) || (rc = square_minor(cx, 0, "a"))) return rc;
  return kiln__copy(cx, out, kiln__oshape(cx, 0));
}

static int infer_triangular_solve(kiln__ictx *cx, kiln_shape *out) {
  int rc;
  int64_t left = 0;
  if ((rc = kiln__expect_array(cx, 0, "a")) || (rc = kiln__expect_array(cx, 1, "b")) ||
      (rc = square_minor(cx, 0, "a")) ||
      (rc = kiln__attr_int(cx, KILN_ATTR_LEFT_SIDE, false, 0, &left)))
    return rc;
  const kiln_shape *a = kiln__oshape(cx, 0), *b = kiln__oshape(cx, 1);
  if (a->dtype != b->dtype)
    return kiln__fail(cx, "%s has type %s but %s has type %s", kiln__on(cx, 1), kiln__sh(cx, b),
                      kiln__on(cx, 0), kiln__sh(cx, a));
  if (b->rank != a->rank)
    return kiln__fail(cx, "%s (b) has rank %u but %s (a) has rank %u", kiln__on(cx, 1),
                      (unsigned)b->rank, kiln__on(cx, 0), (unsigned)a->rank);
  uint32_t r = a->rank;
  if (a->dims[r - 1] != b->dims[left ? r - 2 : r - 1])
    return kiln__fail(cx, "a %s and b %s do not share the solved dimension (left_side=%s)",
                      kiln__sh(cx, a), kiln__sh(cx, b), left ? "true" : "false");
  for (uint32_t i = 0; i + 2 < r; i++)
    if (a->dims[i] != b->dims[i])
      return kiln__fail(cx, "batch dimension %u differs: a %s, b %s", i, kiln__sh(cx, a),
                        kiln__sh(cx, b));
  const char *t = kiln_instr_attr_str(cx->ins, KILN_ATTR_TRANSPOSE_A);
  if (t && strcmp(t, "NO_TRANSPOSE") && strcmp(t, "TRANSPOSE") && strcmp(t, "ADJOINT"))
    return kiln__fail(cx, "transpose_a=%s is not one of NO_TRANSPOSE, TRANSPOSE, ADJOINT", t);
  return kiln__copy(cx, out, b);
}

static int infer_topk(kiln__ictx *cx, kiln_shape *out) {
  int64_t k = 0;
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) || (rc = kiln__attr_int(cx, KILN_ATTR_K, true, 0, &k)))
    return rc;
  const kiln_shape *s = kiln__oshape(cx, 0);
  if (s->rank == 0)
    return kiln__fail(cx, "%s must have rank >= 1, found %s", kiln__on(cx, 0), kiln__sh(cx, s));
  if (k < 0 || k > s->dims[s->rank - 1])
    return kiln__fail(cx, "k=%lld is out of range for the last dimension of %s", (long long)k,
                      kiln__sh(cx, s));
  kiln_shape el[2];
  const kiln_shape *ep[2] = {&el[0], &el[1]};
  if ((rc = kiln__make_array(cx, &el[0], s->dtype, s->dims, s->dynamic, s->rank)) ||
      (rc = kiln__make_array(cx, &el[1], KILN_S32, s->dims, s->dynamic, s->rank)))
    return rc;
  el[0].dims[s->rank - 1] = el[1].dims[s->rank - 1] = k;
  return kiln__make_tuple(cx, out, ep, 2);
}

static int infer_batch_norm(kiln__ictx *cx, kiln_shape *out) {
  static const char *train[] = {"operand", "scale", "offset"};
  static const char *infer[] = {"operand", "scale", "offset", "mean", "variance"};
  static const char *grad[] = {"operand", "scale", "mean", "variance", "grad_output"};
  kiln_opcode op = cx->ins->op;
  const char **roles = op == KILN_OP_BATCH_NORM_TRAINING    ? train
                       : op == KILN_OP_BATCH_NORM_INFERENCE ? infer
                                                            : grad;
  int64_t fi = 0;
  int rc;
  uint32_t n = cx->ins->noperands;
  for (uint32_t i = 0; i < n; i++)
    if ((rc = kiln__expect_array(cx, i, roles[i]))) return rc;
  if ((rc = kiln__attr_int(cx, KILN_ATTR_FEATURE_INDEX, true, 0, &fi))) return rc;
  const kiln_shape *s = kiln__oshape(cx, 0);
  if (s->rank < 1) return kiln__fail(cx, "%s must have rank >= 1", kiln__on(cx, 0));
  if (fi < 0 || fi >= s->rank)
    return kiln__fail(cx, "feature_index %lld is out of range for %s", (long long)fi,
                      kiln__sh(cx, s));
  if (!kiln_dtype_is_float(s->dtype))
    return kiln__fail(cx, "%s has type %s, expected a floating-point type", kiln__on(cx, 0),
                      kiln__sh(cx, s));
  int64_t f = s->dims[fi];
  for (uint32_t i = 1; i < n; i++) {
    const kiln_shape *o = kiln__oshape(cx, i);
    bool full = op == KILN_OP_BATCH_NORM_GRAD && i == 4;
    if (!kiln__same_type_ignoring_fp(o->dtype, s->dtype))
      return kiln__fail(cx, "%s (%s) has type %s but %s has type %s", kiln__on(cx, i), roles[i],
                        kiln__sh(cx, o), kiln__on(cx, 0), kiln__sh(cx, s));
    if (full ? !kiln__same_dims(o, s) : (o->rank != 1 || o->dims[0] != f))
      return kiln__fail(cx, "%s (%s) has shape %s, expected %s", kiln__on(cx, i), roles[i],
                        kiln__sh(cx, o),
                        full ? kiln__sh(cx, s) : "a vector with one entry per feature");
  }
  if (op == KILN_OP_BATCH_NORM_INFERENCE) return kiln__copy(cx, out, s);
  kiln_shape feat;
  if ((rc = kiln__make_array(cx, &feat, s->dtype, &f, NULL, 1))) return rc;
  const kiln_shape *el[3] = {s, &feat, &feat};
  return kiln__make_tuple(cx, out, el, 3);
}

int kiln__infer_compute(kiln__ictx *cx, kiln_shape *out) {
  switch (cx->ins->op) {
  case KILN_OP_DOT: return infer_dot(cx, out);
  case KILN_OP_CONVOLUTION: return infer_convolution(cx, out);
  case KILN_OP_REDUCE: return infer_reduce(cx, out);
  case KILN_OP_REDUCE_WINDOW: return infer_reduce_window(cx, out);
  case KILN_OP_SELECT_AND_SCATTER: return infer_select_and_scatter(cx, out);
  case KILN_OP_MAP: return infer_map(cx, out);
  case KILN_OP_SORT: return infer_sort(cx, out);
  case KILN_OP_GATHER: return infer_gather(cx, out);
  case KILN_OP_SCATTER: return infer_scatter(cx, out);
  case KILN_OP_FFT: return infer_fft(cx, out);
  case KILN_OP_CHOLESKY: return infer_cholesky(cx, out);
  case KILN_OP_TRIANGULAR_SOLVE: return infer_triangular_solve(cx, out);
  case KILN_OP_TOPK: return infer_topk(cx, out);
  case KILN_OP_BATCH_NORM_TRAINING:
  case KILN_OP_BATCH_NORM_INFERENCE:
  case KILN_OP_BATCH_NORM_GRAD: return infer_batch_norm(cx, out);
  default: return kiln__fail(cx, "no shape rule for this op");
  }
}
