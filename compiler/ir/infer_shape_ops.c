/* Shape inference for data movement: broadcast, reshape, dynamic-reshape,
 * transpose, slice, dynamic-slice, dynamic-update-slice, concatenate, pad,
 * reverse, iota, bitcast, get/set-dimension-size.
 *
 * broadcast, reshape, dynamic-reshape, iota and bitcast take their result
 * dimensions from the written shape (HLO carries no other record of them):
 * inference checks the written dimensions against the operand and returns
 * them with the element type the operand dictates. Sizes are combined with
 * checked arithmetic: attribute values may be anything.
 */
#include <string.h>

#include "compiler/ir/infer_internal.h"

#define MAX_RANK 4096 /* larger ranks are refused before stack arrays are sized */

static int written_array(kiln__ictx *cx, const char *why, const kiln_shape **out) {
  if (cx->written == NULL) return kiln__need_written(cx, why);
  if (!kiln_shape_is_array(cx->written))
    return kiln__fail(cx, "result must be an array, found %s", kiln__sh(cx, cx->written));
  *out = cx->written;
  return 0;
}

static int rank_ok(kiln__ictx *cx, uint32_t rank) {
  if (rank <= MAX_RANK) return 0;
  return kiln__fail(cx, "rank %u is over the supported %u", (unsigned)rank, MAX_RANK);
}

static int single_dim(kiln__ictx *cx, int64_t rank, int64_t *d) {
  kiln_i64s v = {0};
  int rc = kiln__attr_ints(cx, KILN_ATTR_DIMENSIONS, true, &v);
  if (rc) return rc;
  if (v.n != 1)
    return kiln__fail(cx, "dimensions=%s must name exactly one dimension",
                      kiln__ints(cx, v.v, v.n));
  if ((rc = kiln__check_dims(cx, "dimensions", v.v, 1, rank))) return rc;
  *d = v.v[0];
  return 0;
}

static int infer_broadcast(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *w = NULL, *s = kiln__oshape(cx, 0);
  kiln_i64s dims = {0};
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_DIMENSIONS, false, &dims)) ||
      (rc = written_array(cx, "the broadcast dimensions", &w)))
    return rc;
  if (dims.n != s->rank)
    return kiln__fail(cx, "dimensions=%s has %u entries but %s has rank %u",
                      kiln__ints(cx, dims.v, dims.n), (unsigned)dims.n, kiln__on(cx, 0),
                      (unsigned)s->rank);
  if ((rc = kiln__check_dims(cx, "dimensions", dims.v, dims.n, w->rank))) return rc;
  for (uint32_t i = 0; i < dims.n; i++)
    if (s->dims[i] != w->dims[dims.v[i]])
      return kiln__fail(cx, "%s dimension %u has size %lld but result dimension %lld has size %lld",
                        kiln__on(cx, 0), (unsigned)i, (long long)s->dims[i], (long long)dims.v[i],
                        (long long)w->dims[dims.v[i]]);
  if ((rc = kiln__make_array(cx, out, s->dtype, w->dims, w->dynamic, w->rank))) return rc;
  /* Mapped dimensions are dynamic exactly when the operand's are. */
  for (uint32_t i = 0; i < dims.n; i++) {
    bool d = kiln__is_dyn(s, i);
    if (d && out->dynamic == NULL) {
      out->dynamic = kiln_arena_calloc(cx->out, w->rank, 1);
      if (out->dynamic == NULL) return kiln__oom(cx);
    }
    if (out->dynamic) out->dynamic[dims.v[i]] = d;
  }
  return 0;
}

static int infer_reshape(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *w = NULL, *s = kiln__oshape(cx, 0);
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) || (rc = written_array(cx, "the new dimensions", &w)))
    return rc;
  int64_t a = kiln_shape_elements(s), b = kiln_shape_elements(w);
  if (a != b)
    return kiln__fail(cx, "%s has %lld elements but the result %s has %lld", kiln__on(cx, 0),
                      (long long)a, kiln__sh(cx, w), (long long)b);
  return kiln__make_array(cx, out, s->dtype, w->dims, w->dynamic, w->rank);
}

static int infer_dynamic_reshape(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *w, *s;
  int rc;
  if ((rc = kiln__expect_operands(cx, 1, -1)) || (rc = kiln__expect_array(cx, 0, NULL)) ||
      (rc = written_array(cx, "the new dimension bounds", &w)))
    return rc;
  s = kiln__oshape(cx, 0);
  if (cx->ins->noperands - 1 != w->rank)
    return kiln__fail(cx, "the result has rank %u, so %u size operands are expected, found %u",
                      (unsigned)w->rank, (unsigned)w->rank, (unsigned)cx->ins->noperands - 1);
  for (uint32_t i = 1; i < cx->ins->noperands; i++) {
    const kiln_shape *d = kiln__oshape(cx, i);
    if (!(kiln_shape_is_array(d) && d->rank == 0 && d->dtype == KILN_S32))
      return kiln__fail(cx, "%s is a dimension size and must be s32[], found %s", kiln__on(cx, i),
                        kiln__sh(cx, d));
  }
  int64_t a = kiln_shape_elements(s), b = kiln_shape_elements(w);
  if (a != b)
    return kiln__fail(cx, "%s has %lld elements but the result bounds %s have %lld",
                      kiln__on(cx, 0), (long long)a, kiln__sh(cx, w), (long long)b);
  return kiln__make_array(cx, out, s->dtype, w->dims, w->dynamic, w->rank);
}

static int infer_transpose(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *s = kiln__oshape(cx, 0);
  kiln_i64s p = {0};
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_DIMENSIONS, true, &p)) || (rc = rank_ok(cx, s->rank)))
    return rc;
  if (p.n != s->rank)
    return kiln__fail(cx, "dimensions=%s is not a permutation of the %u dimensions of %s",
                      kiln__ints(cx, p.v, p.n), (unsigned)s->rank, kiln__on(cx, 0));
  if ((rc = kiln__check_dims(cx, "dimensions", p.v, p.n, s->rank))) return rc;
  int64_t dims[MAX_RANK];
  uint8_t dyn[MAX_RANK];
  for (uint32_t i = 0; i < p.n; i++) {
    dims[i] = s->dims[p.v[i]];
    dyn[i] = kiln__is_dyn(s, (uint32_t)p.v[i]);
  }
  return kiln__make_array(cx, out, s->dtype, dims, dyn, s->rank);
}

static int infer_slice(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *s = kiln__oshape(cx, 0);
  kiln_i64s v = {0};
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_SLICE, true, &v)) || (rc = rank_ok(cx, s->rank)))
    return rc;
  if (v.n != 3 * s->rank)
    return kiln__fail(cx, "slice has %u ranges but %s has rank %u", (unsigned)(v.n / 3),
                      kiln__on(cx, 0), (unsigned)s->rank);
  int64_t dims[MAX_RANK];
  uint8_t dyn[MAX_RANK];
  for (uint32_t i = 0; i < s->rank; i++) {
    int64_t lo = v.v[3 * i], hi = v.v[3 * i + 1], st = v.v[3 * i + 2];
    if (lo < 0) return kiln__fail(cx, "dimension %u: start %lld is negative", i, (long long)lo);
    if (hi > s->dims[i])
      return kiln__fail(cx, "dimension %u: limit %lld is over the size %lld of %s", i,
                        (long long)hi, (long long)s->dims[i], kiln__on(cx, 0));
    if (lo > hi)
      return kiln__fail(cx, "dimension %u: start %lld is after limit %lld", i, (long long)lo,
                        (long long)hi);
    if (st <= 0)
      return kiln__fail(cx, "dimension %u: stride %lld must be positive", i, (long long)st);
    dims[i] = (hi - lo) / st + ((hi - lo) % st != 0);
    /* Slicing one element out of a dynamic dimension makes it static. */
    dyn[i] = dims[i] != 1 && kiln__is_dyn(s, i);
  }
  return kiln__make_array(cx, out, s->dtype, dims, dyn, s->rank);
}

/* Start indices: either N scalars of one integer type (N = rank of the
 * operand), or the old form, one integer vector of N elements. */
static int check_start_indices(kiln__ictx *cx, uint32_t first, uint32_t rank) {
  uint32_t n = cx->ins->noperands - first;
  if (n >= 1 && kiln_shape_is_array(kiln__oshape(cx, first)) &&
      kiln__oshape(cx, first)->rank == 1) {
    const kiln_shape *v = kiln__oshape(cx, first);
    if (n != 1)
      return kiln__fail(cx,
                        "%s is a vector of start indices, so it must be the only one; found %u "
                        "index operands",
                        kiln__on(cx, first), (unsigned)n);
    if (!kiln_dtype_is_integral(v->dtype))
      return kiln__fail(cx, "%s holds start indices and must have an integer type, found %s",
                        kiln__on(cx, first), kiln__sh(cx, v));
    if (v->dims[0] != rank)
      return kiln__fail(cx, "%s has %lld start indices but the operand has rank %u",
                        kiln__on(cx, first), (long long)v->dims[0], (unsigned)rank);
    return 0;
  }
  if (n != rank)
    return kiln__fail(cx, "takes %u start indices (the rank of operand 0), found %u",
                      (unsigned)rank, (unsigned)n);
  for (uint32_t i = first; i < cx->ins->noperands; i++) {
    const kiln_shape *x = kiln__oshape(cx, i);
    if (!(kiln_shape_is_array(x) && x->rank == 0 && kiln_dtype_is_integral(x->dtype)))
      return kiln__fail(cx, "%s is a start index and must be an integer scalar, found %s",
                        kiln__on(cx, i), kiln__sh(cx, x));
    if (x->dtype != kiln__oshape(cx, first)->dtype)
      return kiln__fail(cx, "%s has type %s but %s has type %s; start indices must have one type",
                        kiln__on(cx, i), kiln__sh(cx, x), kiln__on(cx, first),
                        kiln__sh(cx, kiln__oshape(cx, first)));
  }
  return 0;
}

static int infer_dynamic_slice(kiln__ictx *cx, kiln_shape *out) {
  kiln_i64s sz = {0};
  int rc;
  if ((rc = kiln__expect_operands(cx, 2, -1)) || (rc = kiln__expect_array(cx, 0, NULL))) return rc;
  const kiln_shape *s = kiln__oshape(cx, 0);
  if ((rc = check_start_indices(cx, 1, s->rank)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_DYNAMIC_SLICE_SIZES, true, &sz)))
    return rc;
  if (sz.n != s->rank)
    return kiln__fail(cx, "dynamic_slice_sizes=%s has %u entries but %s has rank %u",
                      kiln__ints(cx, sz.v, sz.n), (unsigned)sz.n, kiln__on(cx, 0),
                      (unsigned)s->rank);
  for (uint32_t i = 0; i < sz.n; i++) {
    if (sz.v[i] < 0)
      return kiln__fail(cx, "dimension %u: slice size %lld is negative", i, (long long)sz.v[i]);
    if (sz.v[i] > s->dims[i])
      return kiln__fail(cx, "dimension %u: slice size %lld is over the size %lld of %s", i,
                        (long long)sz.v[i], (long long)s->dims[i], kiln__on(cx, 0));
  }
  return kiln__make_array(cx, out, s->dtype, sz.v, NULL, s->rank);
}

static int infer_dynamic_update_slice(kiln__ictx *cx, kiln_shape *out) {
  int rc;
  if ((rc = kiln__expect_operands(cx, 3, -1)) || (rc = kiln__expect_array(cx, 0, NULL)) ||
      (rc = kiln__expect_array(cx, 1, "update")))
    return rc;
  const kiln_shape *s = kiln__oshape(cx, 0), *u = kiln__oshape(cx, 1);
  if ((rc = check_start_indices(cx, 2, s->rank))) return rc;
  if (u->rank != s->rank)
    return kiln__fail(cx, "%s (the update) has rank %u but %s has rank %u", kiln__on(cx, 1),
                      (unsigned)u->rank, kiln__on(cx, 0), (unsigned)s->rank);
  if (!kiln__same_type_ignoring_fp(u->dtype, s->dtype))
    return kiln__fail(cx, "%s has type %s but %s has type %s", kiln__on(cx, 1), kiln__sh(cx, u),
                      kiln__on(cx, 0), kiln__sh(cx, s));
  for (uint32_t i = 0; i < s->rank; i++)
    if (u->dims[i] > s->dims[i])
      return kiln__fail(cx, "dimension %u: the update has size %lld, over the size %lld of %s", i,
                        (long long)u->dims[i], (long long)s->dims[i], kiln__on(cx, 0));
  if ((rc = kiln__copy(cx, out, s))) return rc;
  for (uint32_t i = 0; i < s->rank; i++) {
    if (kiln__is_dyn(u, i) && u->dims[i] == s->dims[i]) {
      if (out->dynamic == NULL && !(out->dynamic = kiln_arena_calloc(cx->out, s->rank, 1)))
        return kiln__oom(cx);
      out->dynamic[i] = 1;
    }
  }
  return 0;
}

static int infer_concatenate(kiln__ictx *cx, kiln_shape *out) {
  int rc;
  int64_t d = 0;
  if ((rc = kiln__expect_operands(cx, 1, -1))) return rc;
  for (uint32_t i = 0; i < cx->ins->noperands; i++)
    if ((rc = kiln__expect_array(cx, i, NULL))) return rc;
  const kiln_shape *s = kiln__oshape(cx, 0);
  if ((rc = single_dim(cx, s->rank, &d)) || (rc = rank_ok(cx, s->rank))) return rc;
  int64_t dims[MAX_RANK];
  uint8_t dyn[MAX_RANK];
  kiln_dtype t = s->dtype;
  for (uint32_t k = 0; k < s->rank; k++) {
    dims[k] = s->dims[k];
    dyn[k] = kiln__is_dyn(s, k);
  }
  for (uint32_t i = 1; i < cx->ins->noperands; i++) {
    const kiln_shape *o = kiln__oshape(cx, i);
    if (!kiln__same_type_ignoring_fp(o->dtype, s->dtype))
      return kiln__fail(cx, "%s has type %s but %s has type %s", kiln__on(cx, i), kiln__sh(cx, o),
                        kiln__on(cx, 0), kiln__sh(cx, s));
    if (o->rank != s->rank)
      return kiln__fail(cx, "%s has rank %u but %s has rank %u", kiln__on(cx, i), (unsigned)o->rank,
                        kiln__on(cx, 0), (unsigned)s->rank);
    for (uint32_t k = 0; k < s->rank; k++) {
      if (k != d && o->dims[k] != s->dims[k])
        return kiln__fail(cx, "%s has shape %s but %s has shape %s; only dimension %lld may differ",
                          kiln__on(cx, i), kiln__sh(cx, o), kiln__on(cx, 0), kiln__sh(cx, s),
                          (long long)d);
      dyn[k] |= kiln__is_dyn(o, k);
    }
    if (!kiln__add(dims[d], o->dims[d], &dims[d]))
      return kiln__fail(cx, "the concatenated dimension %lld overflows", (long long)d);
    t = kiln__higher_precision(t, o->dtype);
  }
  return kiln__make_array(cx, out, t, dims, dyn, s->rank);
}

static int infer_pad(kiln__ictx *cx, kiln_shape *out) {
  kiln_i64s p = {0};
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) || (rc = kiln__expect_array(cx, 1, "padding value")))
    return rc;
  const kiln_shape *s = kiln__oshape(cx, 0), *v = kiln__oshape(cx, 1);
  if ((rc = kiln__attr_ints(cx, KILN_ATTR_PADDING, true, &p)) || (rc = rank_ok(cx, s->rank)))
    return rc;
  if (v->rank != 0)
    return kiln__fail(cx, "%s is the padding value and must be a scalar, found %s", kiln__on(cx, 1),
                      kiln__sh(cx, v));
  if (!kiln__same_type_ignoring_fp(v->dtype, s->dtype))
    return kiln__fail(cx, "%s has type %s but %s has type %s", kiln__on(cx, 1), kiln__sh(cx, v),
                      kiln__on(cx, 0), kiln__sh(cx, s));
  if (p.n != 3 * s->rank)
    return kiln__fail(cx, "padding has %u dimensions but %s has rank %u", (unsigned)(p.n / 3),
                      kiln__on(cx, 0), (unsigned)s->rank);
  int64_t dims[MAX_RANK];
  uint8_t dyn[MAX_RANK];
  for (uint32_t i = 0; i < s->rank; i++) {
    int64_t lo = p.v[3 * i], hi = p.v[3 * i + 1], in = p.v[3 * i + 2], n = s->dims[i], r;
    if (in < 0)
      return kiln__fail(cx, "dimension %u: interior padding %lld is negative", i, (long long)in);
    if (!kiln__mul(n > 0 ? n - 1 : 0, in, &r) || !kiln__add(r, n, &r) || !kiln__add(r, lo, &r) ||
        !kiln__add(r, hi, &r))
      return kiln__fail(cx, "dimension %u: the padded size overflows", i);
    if (r < 0)
      return kiln__fail(cx,
                        "dimension %u: padding %lld_%lld_%lld of size %lld gives a negative "
                        "size %lld",
                        i, (long long)lo, (long long)hi, (long long)in, (long long)n, (long long)r);
    dims[i] = r;
    dyn[i] = kiln__is_dyn(s, i);
  }
  return kiln__make_array(cx, out, kiln__higher_precision(s->dtype, v->dtype), dims, dyn, s->rank);
}

static int infer_reverse(kiln__ictx *cx, kiln_shape *out) {
  kiln_i64s d = {0};
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_DIMENSIONS, true, &d)) ||
      (rc = kiln__check_dims(cx, "dimensions", d.v, d.n, kiln__oshape(cx, 0)->rank)))
    return rc;
  return kiln__copy(cx, out, kiln__oshape(cx, 0));
}

static int infer_iota(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *w = NULL;
  int64_t d = 0;
  int rc;
  if ((rc = written_array(cx, "iota has no operands", &w)) ||
      (rc = kiln__attr_int(cx, KILN_ATTR_IOTA_DIMENSION, true, 0, &d)))
    return rc;
  if (w->rank == 0)
    return kiln__fail(cx, "the result must have rank 1 or more, found %s", kiln__sh(cx, w));
  if (d < 0 || d >= w->rank)
    return kiln__fail(cx, "iota_dimension %lld is out of range for the result %s", (long long)d,
                      kiln__sh(cx, w));
  return kiln__copy(cx, out, w);
}

static int infer_bitcast(kiln__ictx *cx, kiln_shape *out) {
  const kiln_shape *w = NULL;
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) ||
      (rc = written_array(cx, "bitcast reinterprets", &w)))
    return rc;
  const kiln_shape *s = kiln__oshape(cx, 0);
  int64_t a = kiln_shape_elements(s), b = kiln_shape_elements(w), ab, bb;
  if (a < 0 || b < 0 || !kiln__mul(a, kiln_dtype_bits(s->dtype), &ab) ||
      !kiln__mul(b, kiln_dtype_bits(w->dtype), &bb))
    return kiln__fail(cx, "the size of %s or of the result overflows", kiln__on(cx, 0));
  if (ab != bb)
    return kiln__fail(cx, "%s %s has %lld bits of data but the result %s has %lld", kiln__on(cx, 0),
                      kiln__sh(cx, s), (long long)ab, kiln__sh(cx, w), (long long)bb);
  return kiln__copy(cx, out, w);
}

static int infer_get_dimension_size(kiln__ictx *cx, kiln_shape *out) {
  int64_t d = 0;
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL)) ||
      (rc = single_dim(cx, kiln__oshape(cx, 0)->rank, &d)))
    return rc;
  if (kiln__oshape(cx, 0)->dims[d] > INT32_MAX)
    return kiln__fail(cx, "dimension %lld of %s is over the s32 range", (long long)d,
                      kiln__on(cx, 0));
  return kiln__make_array(cx, out, KILN_S32, NULL, NULL, 0);
}

static int infer_set_dimension_size(kiln__ictx *cx, kiln_shape *out) {
  int64_t d = 0;
  int rc;
  if ((rc = kiln__expect_array(cx, 0, NULL))) return rc;
  const kiln_shape *s = kiln__oshape(cx, 0), *v = kiln__oshape(cx, 1);
  if ((rc = single_dim(cx, s->rank, &d))) return rc;
  if (!(kiln_shape_is_array(v) && v->rank == 0 && v->dtype == KILN_S32))
    return kiln__fail(cx, "%s is the size and must be s32[], found %s", kiln__on(cx, 1),
                      kiln__sh(cx, v));
  if (s->dims[d] > INT32_MAX)
    return kiln__fail(cx, "dimension %lld of %s is over the s32 range", (long long)d,
                      kiln__on(cx, 0));
  if ((rc = kiln__copy(cx, out, s))) return rc;
  if (out->dynamic == NULL && !(out->dynamic = kiln_arena_calloc(cx->out, s->rank, 1)))
    return kiln__oom(cx);
  out->dynamic[d] = 1;
  return 0;
}

int kiln__infer_data_movement(kiln__ictx *cx, kiln_shape *out) {
  switch (cx->ins->op) {
  case KILN_OP_BROADCAST: return infer_broadcast(cx, out);
  case KILN_OP_RESHAPE: return infer_reshape(cx, out);
  case KILN_OP_DYNAMIC_RESHAPE: return infer_dynamic_reshape(cx, out);
  case KILN_OP_TRANSPOSE: return infer_transpose(cx, out);
  case KILN_OP_SLICE: return infer_slice(cx, out);
  case KILN_OP_DYNAMIC_SLICE: return infer_dynamic_slice(cx, out);
  case KILN_OP_DYNAMIC_UPDATE_SLICE: return infer_dynamic_update_slice(cx, out);
  case KILN_OP_CONCATENATE: return infer_concatenate(cx, out);
  case KILN_OP_PAD: return infer_pad(cx, out);
  case KILN_OP_REVERSE: return infer_reverse(cx, out);
  case KILN_OP_IOTA: return infer_iota(cx, out);
  case KILN_OP_BITCAST: return infer_bitcast(cx, out);
  case KILN_OP_GET_DIMENSION_SIZE: return infer_get_dimension_size(cx, out);
  case KILN_OP_SET_DIMENSION_SIZE: return infer_set_dimension_size(cx, out);
  default: return kiln__fail(cx, "no shape rule for this op");
  }
}
