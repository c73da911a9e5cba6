/* Data movement: iota, broadcast, reshape, transpose, slice, dynamic-slice,
 * dynamic-update-slice, concatenate, pad, reverse, bitcast, and the runtime
 * sizes of bounded-dynamic arrays (get/set-dimension-size, dynamic-reshape).
 *
 * These ops never compute on values: they move element storage (bytes), so
 * they work on every element type, storage-only ones included. Each maps a
 * result multi-index to an operand multi-index; every attribute is checked
 * against the actual operand dims first so that no index can leave its
 * array. Layouts play no part except in bitcast, which reinterprets the
 * physical order given by each shape's minor_to_major.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/eval/interp_internal.h"

#define R KILN_INTERP_MAX_RANK

static int bad(kiln__interp_ctx *c, const kiln_instr *ins, const char *what) {
  return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: %s", kiln_opcode_name(ins->op), ins->name,
                           what);
}

/* Operand 0 and the result are arrays of the same element type. */
static int movable(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *a) {
  int rc = kiln__interp_need_array(c, ins, a, "operand");
  if (rc == 0) rc = kiln__interp_need_array(c, ins, &(kiln_literal){.shape = ins->shape}, "result");
  if (rc == 0 && a->shape.dtype != ins->shape.dtype)
    rc = kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: operand is %s, result %s",
                           kiln_opcode_name(ins->op), ins->name, kiln_dtype_name(a->shape.dtype),
                           kiln_dtype_name(ins->shape.dtype));
  return rc;
}

static const kiln_i64s *ints_attr(const kiln_instr *ins, kiln_attr_key k) {
  static const kiln_i64s none = {NULL, 0};
  const kiln_i64s *l = kiln_instr_attr_ints(ins, k);
  return l ? l : &none;
}

int kiln__interp_eval_iota(kiln__interp_ctx *c, const kiln_instr *ins,
                           const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  const kiln_shape *s = &ins->shape;
  int rc = kiln__interp_need_array(c, ins, &(kiln_literal){.shape = *s}, "result");
  if (rc) return rc;
  int64_t d = kiln_instr_attr_int(ins, KILN_ATTR_IOTA_DIMENSION, 0);
  if (d < 0 || (s->rank && d >= s->rank)) return bad(c, ins, "iota_dimension out of range");
  if (!kiln__interp_dtype_computable(s->dtype)) return bad(c, ins, "result type has no values");
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  int64_t idx[R] = {0}, n = kiln_literal_elements(*out);
  for (int64_t i = 0; i < n; i++) {
    kiln__interp_scalar v = {.t = KILN_S64, .v.s = s->rank ? idx[d] : 0};
    kiln__interp_scalar_store(*out, i, v);
    kiln__interp_next_index(idx, s->dims, s->rank);
  }
  return 0;
}

int kiln__interp_eval_broadcast(kiln__interp_ctx *c, const kiln_instr *ins,
                                const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  int rc = movable(c, ins, a);
  if (rc) return rc;
  const kiln_i64s *dims = ints_attr(ins, KILN_ATTR_DIMENSIONS);
  const kiln_shape *s = &ins->shape;
  if (dims->n != a->shape.rank)
    return bad(c, ins,
               "dimensions must name one result dim per "
               "operand dim");
  for (uint32_t i = 0; i < dims->n; i++)
    if (dims->v[i] < 0 || dims->v[i] >= s->rank || s->dims[dims->v[i]] != a->shape.dims[i])
      return bad(c, ins, "operand dims do not match the result dims they map to");
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  int64_t idx[R] = {0}, st[R], n = kiln_literal_elements(*out);
  kiln__interp_strides(&a->shape, st);
  for (int64_t i = 0; i < n; i++) {
    int64_t src = 0;
    for (uint32_t k = 0; k < dims->n; k++) src += idx[dims->v[k]] * st[k];
    kiln__interp_copy_elem(*out, i, a, src);
    kiln__interp_next_index(idx, s->dims, s->rank);
  }
  if (a->dynamic_sizes) {
    int64_t sz[R];
    for (uint32_t k = 0; k < s->rank; k++) sz[k] = s->dims[k];
    for (uint32_t k = 0; k < dims->n; k++) sz[dims->v[k]] = a->dynamic_sizes[k];
    rc = kiln__interp_dyn_set(c, ins, (*out)->own, *out, sz);
  }
  return rc;
}

/* Runtime sizes through a data movement that keeps some dims whole: a
 * kept dim keeps the operand's size, the others (cut, padded, joined) are
 * at their bound. */
static int keep_sizes(kiln__interp_ctx *c, const kiln_instr *ins, kiln_literal *out,
                      const kiln_literal *a, const bool *touched) {
  if (a->dynamic_sizes == NULL || out->shape.rank != a->shape.rank) return 0;
  int64_t sz[R];
  for (uint32_t k = 0; k < a->shape.rank; k++)
    sz[k] = touched[k] ? out->shape.dims[k] : a->dynamic_sizes[k];
  return kiln__interp_dyn_set(c, ins, out->own, out, sz);
}

/* reshape: a runtime-sized dim that survives whole (same bound, the dims
 * before it spanning the same elements) keeps its size; one that is the
 * major end of static dims merged into one result dim scales by their
 * product. Other reshapes of a runtime-sized dim (splits) leave the
 * result at its bounds; code generation refuses them (codegen/dyn_pad.c). */
static int reshape_sizes(kiln__interp_ctx *c, const kiln_instr *ins, kiln_literal *out,
                         const kiln_literal *a) {
  const kiln_shape *in = &a->shape, *os = &out->shape;
  if (a->dynamic_sizes == NULL) return 0;
  int64_t sz[R];
  for (uint32_t j = 0; j < os->rank; j++) sz[j] = os->dims[j];
  for (uint32_t k = 0; k < in->rank; k++) {
    if (a->dynamic_sizes[k] == in->dims[k]) continue;
    int64_t pre = 1, acc = 1;
    for (uint32_t i = 0; i < k; i++) pre *= in->dims[i];
    uint32_t j = 0;
    while (j < os->rank && acc < pre) acc *= os->dims[j++];
    while (j < os->rank && os->dims[j] == 1 && in->dims[k] != 1) j++;
    if (acc != pre || j >= os->rank || os->dims[j] < in->dims[k] || in->dims[k] == 0) continue;
    int64_t merged = in->dims[k];
    for (uint32_t r = k + 1; r < in->rank && merged < os->dims[j]; r++) merged *= in->dims[r];
    if (merged == os->dims[j]) sz[j] = a->dynamic_sizes[k] * (os->dims[j] / in->dims[k]);
  }
  return kiln__interp_dyn_set(c, ins, out->own, out, sz);
}

int kiln__interp_eval_reshape(kiln__interp_ctx *c, const kiln_instr *ins,
                              const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  int rc = movable(c, ins, a);
  if (rc) return rc;
  if (kiln_shape_elements(&ins->shape) != kiln_literal_elements(a))
    return bad(c, ins, "operand and result have different element counts");
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc == 0 && a->nbytes) memcpy((*out)->data, a->data, a->nbytes);
  if (rc == 0) rc = reshape_sizes(c, ins, *out, a);
  return rc;
}

int kiln__interp_eval_transpose(kiln__interp_ctx *c, const kiln_instr *ins,
                                const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  int rc = movable(c, ins, a);
  if (rc) return rc;
  const kiln_i64s *p = ints_attr(ins, KILN_ATTR_DIMENSIONS);
  const kiln_shape *s = &ins->shape;
  uint8_t seen[R] = {0};
  if (p->n != s->rank || a->shape.rank != s->rank)
    return bad(c, ins,
               "dimensions must be a "
               "permutation of the operand dims");
  for (uint32_t i = 0; i < p->n; i++) {
    if (p->v[i] < 0 || p->v[i] >= s->rank || seen[p->v[i]]++ ||
        a->shape.dims[p->v[i]] != s->dims[i])
      return bad(c, ins, "dimensions must be a permutation matching the result dims");
  }
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  int64_t idx[R] = {0}, st[R], n = kiln_literal_elements(*out);
  kiln__interp_strides(&a->shape, st);
  for (int64_t i = 0; i < n; i++) {
    int64_t src = 0;
    for (uint32_t k = 0; k < s->rank; k++) src += idx[k] * st[p->v[k]];
    kiln__interp_copy_elem(*out, i, a, src);
    kiln__interp_next_index(idx, s->dims, s->rank);
  }
  if (a->dynamic_sizes) {
    int64_t sz[R];
    for (uint32_t k = 0; k < s->rank; k++) sz[k] = a->dynamic_sizes[p->v[k]];
    rc = kiln__interp_dyn_set(c, ins, (*out)->own, *out, sz);
  }
  return rc;
}

/* Copies the box of `a` starting at start[] (with strides) into the result. */
static void copy_box(kiln_literal *r, const kiln_literal *a, const int64_t *start,
                     const int64_t *stride) {
  const kiln_shape *s = &r->shape;
  int64_t idx[R] = {0}, st[R], n = kiln_literal_elements(r);
  kiln__interp_strides(&a->shape, st);
  for (int64_t i = 0; i < n; i++) {
    int64_t src = 0;
    for (uint32_t k = 0; k < s->rank; k++) src += (start[k] + idx[k] * stride[k]) * st[k];
    kiln__interp_copy_elem(r, i, a, src);
    kiln__interp_next_index(idx, s->dims, s->rank);
  }
}

int kiln__interp_eval_slice(kiln__interp_ctx *c, const kiln_instr *ins,
                            const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  int rc = movable(c, ins, a);
  if (rc) return rc;
  const kiln_i64s *sl = ints_attr(ins, KILN_ATTR_SLICE);
  const kiln_shape *s = &ins->shape;
  if (sl->n != 3 * a->shape.rank || s->rank != a->shape.rank)
    return bad(c, ins, "slice must give [start:limit:stride] for every operand dim");
  int64_t start[R], stride[R];
  for (uint32_t k = 0; k < s->rank; k++) {
    int64_t b = sl->v[3 * k], e = sl->v[3 * k + 1], t = sl->v[3 * k + 2];
    if (t < 1 || b < 0 || e > a->shape.dims[k] || b > e || (e - b + t - 1) / t != s->dims[k])
      return kiln__interp_fail(c, ins, KILN_EINVAL,
                               "slice %s: [%lld:%lld:%lld] does not fit dim %u of "
                               "size %lld giving %lld",
                               ins->name, (long long)b, (long long)e, (long long)t, k,
                               (long long)a->shape.dims[k], (long long)s->dims[k]);
    start[k] = b;
    stride[k] = t;
  }
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc == 0) copy_box(*out, a, start, stride);
  if (rc == 0 && a->dynamic_sizes) {
    /* A runtime-sized dim sliced with stride 1 keeps what the window holds
     * of its valid elements; other strides leave the result at its bound. */
    int64_t sz[R];
    for (uint32_t k = 0; k < s->rank; k++) {
      int64_t n = a->dynamic_sizes[k], e = sl->v[3 * k + 1];
      int64_t v = (n < e ? n : e) - start[k];
      sz[k] = stride[k] != 1 ? s->dims[k] : v < 0 ? 0 : v;
    }
    rc = kiln__interp_dyn_set(c, ins, (*out)->own, *out, sz);
  }
  return rc;
}

/* Start indices from scalar operands ops[first..first+rank) (or one 1-D
 * array operand), clamped so that a box of `size` stays inside `dims`. */
static int start_indices(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *const *ops,
                         uint32_t first, const kiln_shape *opshape, const int64_t *size,
                         int64_t *start) {
  uint32_t rank = opshape->rank, nidx = ins->noperands - first;
  const kiln_literal *vec = NULL;
  if (nidx == 1 && rank != 1 && kiln_shape_is_array(&ops[first]->shape) &&
      ops[first]->shape.rank == 1 && ops[first]->shape.dims[0] == rank)
    vec = ops[first];
  else if (nidx != rank)
    return bad(c, ins, "needs one start index per operand dim");
  for (uint32_t k = 0; k < rank; k++) {
    const kiln_literal *l = vec ? vec : ops[first + k];
    if (!kiln_shape_is_array(&l->shape) || !kiln_dtype_is_integral(l->shape.dtype) ||
        (!vec && kiln_literal_elements(l) != 1))
      return bad(c, ins, "start indices must be integer scalars");
    if (size[k] < 0 || size[k] > opshape->dims[k])
      return bad(c, ins, "slice is larger than the operand");
    int64_t v = kiln__interp_scalar_as_s64(kiln__interp_scalar_load(l, vec ? k : 0));
    int64_t hi = opshape->dims[k] - size[k];
    start[k] = v < 0 ? 0 : v > hi ? hi : v; /* XLA clamps */
  }
  return 0;
}

int kiln__interp_eval_dynamic_slice(kiln__interp_ctx *c, const kiln_instr *ins,
                                    const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  int rc = movable(c, ins, a);
  if (rc) return rc;
  const kiln_shape *s = &ins->shape;
  if (s->rank != a->shape.rank) return bad(c, ins, "result rank differs from the operand's");
  int64_t start[R], one[R];
  for (uint32_t k = 0; k < s->rank; k++) one[k] = 1;
  rc = start_indices(c, ins, ops, 1, &a->shape, s->dims, start);
  if (rc == 0) rc = kiln__interp_lit_result(c, ins, out);
  if (rc == 0) copy_box(*out, a, start, one);
  return rc;
}

int kiln__interp_eval_dynamic_update_slice(kiln__interp_ctx *c, const kiln_instr *ins,
                                           const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0], *u = ops[1];
  int rc = movable(c, ins, a);
  if (rc == 0) rc = kiln__interp_need_array(c, ins, u, "update");
  if (rc) return rc;
  if (!kiln__interp_same_dims(&a->shape, &ins->shape) || u->shape.rank != a->shape.rank ||
      u->shape.dtype != a->shape.dtype)
    return bad(c, ins, "operand, update and result must agree in rank and type");
  int64_t start[R];
  rc = start_indices(c, ins, ops, 2, &a->shape, u->shape.dims, start);
  if (rc == 0) rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  kiln_literal *r = *out;
  if (a->nbytes) memcpy(r->data, a->data, a->nbytes);
  int64_t idx[R] = {0}, st[R], n = kiln_literal_elements(u);
  kiln__interp_strides(&a->shape, st);
  for (int64_t i = 0; i < n; i++) {
    int64_t dst = 0;
    for (uint32_t k = 0; k < a->shape.rank; k++) dst += (start[k] + idx[k]) * st[k];
    kiln__interp_copy_elem(r, dst, u, i);
    kiln__interp_next_index(idx, u->shape.dims, u->shape.rank);
  }
  return kiln__interp_dyn_inherit(c, ins, r, a);
}

int kiln__interp_eval_concatenate(kiln__interp_ctx *c, const kiln_instr *ins,
                                  const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_shape *s = &ins->shape;
  const kiln_i64s *dl = ints_attr(ins, KILN_ATTR_DIMENSIONS);
  if (dl->n != 1 || dl->v[0] < 0 || dl->v[0] >= s->rank)
    return bad(c, ins, "needs one concatenation dimension");
  uint32_t d = (uint32_t)dl->v[0];
  int64_t total = 0;
  for (uint32_t j = 0; j < ins->noperands; j++) {
    const kiln_literal *a = ops[j];
    int rc = movable(c, ins, a);
    if (rc) return rc;
    if (a->shape.rank != s->rank) return bad(c, ins, "operand ranks differ");
    for (uint32_t k = 0; k < s->rank; k++)
      if (k != d && a->shape.dims[k] != s->dims[k]) return bad(c, ins, "operand dims differ");
    total += a->shape.dims[d];
  }
  if (total != s->dims[d]) return bad(c, ins, "operand sizes do not add up to the result's");
  int rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  int64_t st[R], off = 0;
  kiln__interp_strides(s, st);
  for (uint32_t j = 0; j < ins->noperands; j++) {
    const kiln_literal *a = ops[j];
    int64_t idx[R] = {0}, n = kiln_literal_elements(a);
    for (int64_t i = 0; i < n; i++) {
      int64_t dst = kiln__interp_linear(idx, st, s->rank) + off * st[d];
      kiln__interp_copy_elem(*out, dst, a, i);
      kiln__interp_next_index(idx, a->shape.dims, a->shape.rank);
    }
    off += a->shape.dims[d];
  }
  bool touched[R] = {0};
  touched[d] = true;
  for (uint32_t j = 0; j < ins->noperands; j++)
    if (ops[j]->dynamic_sizes) return keep_sizes(c, ins, *out, ops[j], touched);
  return 0;
}

int kiln__interp_eval_pad(kiln__interp_ctx *c, const kiln_instr *ins,
                          const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0], *pv = ops[1];
  int rc = movable(c, ins, a);
  if (rc) return rc;
  const kiln_shape *s = &ins->shape;
  const kiln_i64s *p = ints_attr(ins, KILN_ATTR_PADDING);
  if (!kiln_shape_is_array(&pv->shape) || kiln_literal_elements(pv) != 1 ||
      pv->shape.dtype != s->dtype)
    return bad(c, ins, "padding value must be a scalar of the operand's type");
  if (p->n != 3 * a->shape.rank || s->rank != a->shape.rank)
    return bad(c, ins, "padding must give lo_hi_interior for every dim");
  for (uint32_t k = 0; k < s->rank; k++) {
    int64_t lo = p->v[3 * k], hi = p->v[3 * k + 1], in = p->v[3 * k + 2], n = a->shape.dims[k];
    if (in < 0 || lo + hi + n + (n > 0 ? (n - 1) * in : 0) != s->dims[k])
      return bad(c, ins, "padding does not produce the result dims");
  }
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  int64_t n = kiln_literal_elements(*out);
  for (int64_t i = 0; i < n; i++) kiln__interp_copy_elem(*out, i, pv, 0);
  int64_t idx[R] = {0}, st[R];
  kiln__interp_strides(s, st);
  n = kiln_literal_elements(a);
  for (int64_t i = 0; i < n; i++) {
    int64_t dst = 0;
    bool in = true;
    for (uint32_t k = 0; k < s->rank && in; k++) {
      int64_t t = p->v[3 * k] + idx[k] * (p->v[3 * k + 2] + 1);
      in = t >= 0 && t < s->dims[k];
      dst += t * st[k];
    }
    if (in) kiln__interp_copy_elem(*out, dst, a, i);
    kiln__interp_next_index(idx, a->shape.dims, a->shape.rank);
  }
  bool touched[R];
  for (uint32_t k = 0; k < s->rank; k++)
    touched[k] = p->v[3 * k] || p->v[3 * k + 1] || p->v[3 * k + 2];
  return keep_sizes(c, ins, *out, a, touched);
}

int kiln__interp_eval_reverse(kiln__interp_ctx *c, const kiln_instr *ins,
                              const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  int rc = movable(c, ins, a);
  if (rc) return rc;
  const kiln_shape *s = &ins->shape;
  const kiln_i64s *dl = ints_attr(ins, KILN_ATTR_DIMENSIONS);
  if (!kiln__interp_same_dims(&a->shape, s))
    return bad(c, ins, "result dims differ from the operand's");
  bool rev[R] = {false};
  for (uint32_t i = 0; i < dl->n; i++) {
    if (dl->v[i] < 0 || dl->v[i] >= s->rank) return bad(c, ins, "dimension out of range");
    rev[dl->v[i]] = true;
  }
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  int64_t idx[R] = {0}, st[R], n = kiln_literal_elements(a);
  kiln__interp_strides(s, st);
  for (int64_t i = 0; i < n; i++) {
    /* A runtime-sized dim reverses its valid elements; padding stays. */
    int64_t src = 0;
    for (uint32_t k = 0; k < s->rank; k++) {
      int64_t len = kiln__interp_dyn_size(a, k);
      src += (rev[k] && idx[k] < len ? len - 1 - idx[k] : idx[k]) * st[k];
    }
    kiln__interp_copy_elem(*out, i, a, src);
    kiln__interp_next_index(idx, s->dims, s->rank);
  }
  return kiln__interp_dyn_inherit(c, ins, *out, a);
}

/* Physical (layout) order -> position of each logical element, by filling
 * phys[i] with the physical position of logical row-major element i. */
static bool physical_positions(const kiln_shape *s, int64_t *phys) {
  int64_t m2m[R], idx[R] = {0};
  uint8_t seen[R] = {0};
  kiln_shape_minor_to_major(s, m2m);
  for (uint32_t k = 0; k < s->rank; k++)
    if (m2m[k] < 0 || m2m[k] >= s->rank || seen[m2m[k]]++) return false;
  int64_t n = kiln_shape_elements(s);
  for (int64_t i = 0; i < n; i++) {
    int64_t p = 0;
    for (uint32_t k = s->rank; k-- > 0;) p = p * s->dims[m2m[k]] + idx[m2m[k]];
    phys[i] = p;
    kiln__interp_next_index(idx, s->dims, s->rank);
  }
  return true;
}

int kiln__interp_eval_bitcast(kiln__interp_ctx *c, const kiln_instr *ins,
                              const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  int rc = kiln__interp_need_array(c, ins, a, "operand");
  if (rc == 0) rc = kiln__interp_need_array(c, ins, &(kiln_literal){.shape = ins->shape}, "result");
  if (rc) return rc;
  /* The operand's layout is the one its defining instruction declares; an
   * argument literal's own shape may carry none. */
  const kiln_shape *in_s = &a->shape;
  if (ins->noperands == 1 && ins->operands[0] < c->m->ninstrs) {
    const kiln_shape *d = &c->m->instrs[ins->operands[0]]->shape;
    if (kiln_shape_is_array(d) && kiln__interp_same_dims(d, &a->shape) &&
        d->dtype == a->shape.dtype)
      in_s = d;
  }
  int64_t rb = kiln_shape_bytes(&ins->shape);
  if (rb < 0 || (size_t)rb != a->nbytes) return bad(c, ins, "operand and result differ in size");
  int64_t na = kiln_literal_elements(a), nr = kiln_shape_elements(&ins->shape);
  int64_t *pa = kiln_calloc((size_t)(na > 0 ? na : 1), sizeof *pa);
  int64_t *pr = kiln_calloc((size_t)(nr > 0 ? nr : 1), sizeof *pr);
  unsigned char *buf = kiln_malloc(a->nbytes ? a->nbytes : 1);
  if (pa == NULL || pr == NULL || buf == NULL) {
    rc = kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  } else if (!physical_positions(in_s, pa) || !physical_positions(&ins->shape, pr)) {
    rc = bad(c, ins, "a layout is not a permutation of the dims");
  } else {
    rc = kiln__interp_lit_result(c, ins, out);
  }
  if (rc == 0) {
    size_t ea = kiln_dtype_size(a->shape.dtype), er = kiln_dtype_size(ins->shape.dtype);
    for (int64_t i = 0; i < na; i++)
      memcpy(buf + (size_t)pa[i] * ea, (const char *)a->data + (size_t)i * ea, ea);
    for (int64_t i = 0; i < nr; i++)
      memcpy((char *)(*out)->data + (size_t)i * er, buf + (size_t)pr[i] * er, er);
  }
  kiln_free(pa);
  kiln_free(pr);
  kiln_free(buf);
  return rc;
}

static int dim_attr(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *a,
                    uint32_t *d) {
  const kiln_i64s *dl = ints_attr(ins, KILN_ATTR_DIMENSIONS);
  if (!kiln_shape_is_array(&a->shape) || dl->n != 1 || dl->v[0] < 0 || dl->v[0] >= a->shape.rank)
    return bad(c, ins, "needs one dimension of the operand");
  *d = (uint32_t)dl->v[0];
  return 0;
}

int kiln__interp_eval_get_dimension_size(kiln__interp_ctx *c, const kiln_instr *ins,
                                         const kiln_literal *const *ops, kiln_literal **out) {
  uint32_t d;
  int rc = dim_attr(c, ins, ops[0], &d);
  if (rc == 0 && (!kiln_shape_is_array(&ins->shape) || kiln_shape_elements(&ins->shape) != 1 ||
                  !kiln__interp_dtype_computable(ins->shape.dtype)))
    rc = bad(c, ins, "result must be an integer scalar");
  if (rc == 0) rc = kiln__interp_lit_result(c, ins, out);
  if (rc == 0)
    kiln__interp_scalar_store(
        *out, 0, (kiln__interp_scalar){.t = KILN_S64, .v.s = kiln__interp_dyn_size(ops[0], d)});
  return rc;
}

int kiln__interp_eval_set_dimension_size(kiln__interp_ctx *c, const kiln_instr *ins,
                                         const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0], *sz = ops[1];
  uint32_t d;
  int rc = movable(c, ins, a);
  if (rc == 0) rc = dim_attr(c, ins, a, &d);
  if (rc) return rc;
  if (!kiln__interp_same_dims(&a->shape, &ins->shape))
    return bad(c, ins,
               "result dims differ from the "
               "operand's");
  if (!kiln_shape_is_array(&sz->shape) || kiln_literal_elements(sz) != 1 ||
      !kiln_dtype_is_integral(sz->shape.dtype))
    return bad(c, ins, "size must be an integer scalar");
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  if (a->nbytes) memcpy((*out)->data, a->data, a->nbytes);
  int64_t sizes[R];
  for (uint32_t k = 0; k < a->shape.rank; k++) sizes[k] = kiln__interp_dyn_size(a, k);
  sizes[d] = kiln__interp_scalar_as_s64(kiln__interp_scalar_load(sz, 0));
  return kiln__interp_dyn_set(c, ins, (*out)->own, *out, sizes);
}

/* dynamic-reshape: the operand's elements within its runtime sizes, in
 * row-major order, laid out again at the runtime sizes given by the size
 * operands; the result is stored padded to its bounds. */
int kiln__interp_eval_dynamic_reshape(kiln__interp_ctx *c, const kiln_instr *ins,
                                      const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  const kiln_shape *s = &ins->shape;
  int rc = movable(c, ins, a);
  if (rc) return rc;
  if (ins->noperands != 1 + s->rank) return bad(c, ins, "needs one size operand per result dim");
  int64_t rs[R], as[R], ia[R] = {0}, ir[R] = {0}, sta[R], str[R], na = 1, nr = 1;
  for (uint32_t k = 0; k < s->rank; k++) {
    const kiln_literal *l = ops[1 + k];
    if (!kiln_shape_is_array(&l->shape) || kiln_literal_elements(l) != 1 ||
        !kiln_dtype_is_integral(l->shape.dtype))
      return bad(c, ins, "sizes must be integer scalars");
    int64_t v = kiln__interp_scalar_as_s64(kiln__interp_scalar_load(l, 0));
    if (v < 0 || v > s->dims[k]) return bad(c, ins, "a size is outside its bound");
    rs[k] = v;
    nr *= v;
  }
  for (uint32_t k = 0; k < a->shape.rank; k++) {
    as[k] = kiln__interp_dyn_size(a, k);
    na *= as[k];
  }
  if (na != nr) return bad(c, ins, "runtime element counts of operand and result differ");
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  kiln__interp_strides(&a->shape, sta);
  kiln__interp_strides(s, str);
  for (int64_t i = 0; i < nr; i++) {
    kiln__interp_copy_elem(*out, kiln__interp_linear(ir, str, s->rank), a,
                           kiln__interp_linear(ia, sta, a->shape.rank));
    kiln__interp_next_index(ia, as, a->shape.rank);
    kiln__interp_next_index(ir, rs, s->rank);
  }
  return kiln__interp_dyn_set(c, ins, (*out)->own, *out, rs);
}
