/* Reductions and ops driven by a called scalar computation: reduce (variadic),
 * reduce-window, select-and-scatter, sort (variadic, stable), and top-k.
 *
 * Every combination goes through kiln__interp_call_scalar, so the reducer's own
 * element types decide the arithmetic and rounding (a bf16 reducer rounds
 * after every step, as XLA's does), and the result is converted to the
 * declared result type once at the end. Elements are combined in row-major
 * order of the reduced (or window) positions, starting from the init value,
 * which is applied once; padding and base-dilation holes of a window are
 * skipped, not combined. A reduce over a bounded-dynamic operand combines only
 * the elements within its runtime sizes, which is what XLA's dynamic padder
 * arranges.
 */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/eval/interp_internal.h"

#define R KILN_INTERP_MAX_RANK

static int bad(kiln__interp_ctx *c, const kiln_instr *ins, const char *what) {
  return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: %s", kiln_opcode_name(ins->op), ins->name,
                           what);
}

/* Result array number k of an op with n results (a tuple when n > 1). */
static kiln_literal *part(kiln_literal *r, uint32_t n, uint32_t k) {
  return n == 1 ? r : r->elems[k];
}

static const kiln_shape *part_shape(const kiln_shape *s, uint32_t n, uint32_t k) {
  if (n == 1) return s;
  return kiln_shape_is_tuple(s) && s->rank == n ? &s->tuple[k] : NULL;
}

/* Checks n array inputs of equal dims and n scalar inits (ops[n..2n)), and
 * finds the reducer's accumulator types. */
static int inputs_and_inits(kiln__interp_ctx *c, const kiln_instr *ins,
                            const kiln_literal *const *ops, uint32_t n, uint32_t comp,
                            kiln__interp_scalar *init) {
  for (uint32_t k = 0; k < n; k++) {
    int rc = kiln__interp_need_array(c, ins, ops[k], "input");
    if (rc) return rc;
    if (!kiln__interp_same_dims(&ops[k]->shape, &ops[0]->shape))
      return bad(c, ins, "inputs differ in dims");
    const kiln_literal *iv = ops[n + k];
    if (!kiln_shape_is_array(&iv->shape) || kiln_literal_elements(iv) != 1)
      return bad(c, ins, "init values must be scalars");
    if (!kiln__interp_dtype_computable(ops[k]->shape.dtype) ||
        !kiln__interp_dtype_computable(iv->shape.dtype))
      return kiln__interp_fail(c, ins, KILN_EUNIMPL,
                               "%s %s: element type %s has no arithmetic in the "
                               "interpreter",
                               kiln_opcode_name(ins->op), ins->name,
                               kiln_dtype_name(ops[k]->shape.dtype));
    kiln_dtype t;
    rc = kiln__interp_comp_result_dtype(c, ins, comp, n == 1 ? 0 : k, &t);
    if (rc) return rc;
    init[k] = kiln__interp_scalar_convert(kiln__interp_scalar_load(iv, 0), t);
  }
  return 0;
}

/* Allocates the n scalar buffers a reducer call needs: args (2n), outs (n),
 * inits (n). */
static kiln__interp_scalar *scratch(kiln__interp_ctx *c, const kiln_instr *ins, uint32_t n) {
  kiln__interp_scalar *s = kiln_calloc(4 * (size_t)n + 1, sizeof *s);
  if (s == NULL) kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  return s;
}

/* ---- reduce ------------------------------------------------------------- */

typedef struct reduce_plan {
  uint32_t rank, nkeep, nred;
  uint32_t keep[R], red[R];
  int64_t kdims[R], rsize[R], st[R];
} reduce_plan;

static int plan_reduce(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *in,
                       uint32_t n, reduce_plan *p) {
  const kiln_i64s *dl = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  bool red[R] = {false};
  p->rank = in->shape.rank;
  for (uint32_t i = 0; dl && i < dl->n; i++) {
    if (dl->v[i] < 0 || dl->v[i] >= p->rank || red[dl->v[i]])
      return bad(c, ins, "dimensions must be distinct dims of the input");
    red[dl->v[i]] = true;
  }
  p->nkeep = p->nred = 0;
  for (uint32_t d = 0; d < p->rank; d++) {
    if (red[d]) {
      p->red[p->nred] = d;
      p->rsize[p->nred++] = kiln__interp_dyn_size(in, d);
    } else {
      p->keep[p->nkeep] = d;
      p->kdims[p->nkeep++] = in->shape.dims[d];
    }
  }
  kiln__interp_strides(&in->shape, p->st);
  for (uint32_t k = 0; k < n; k++) {
    const kiln_shape *s = part_shape(&ins->shape, n, k);
    if (s == NULL || !kiln_shape_is_array(s) || s->rank != p->nkeep)
      return bad(c, ins, "result shape does not match the kept input dims");
    for (uint32_t i = 0; i < p->nkeep; i++)
      if (s->dims[i] != p->kdims[i]) return bad(c, ins, "result dims differ from the kept dims");
  }
  return 0;
}

static int reduce_one(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *const *ops,
                      uint32_t n, uint32_t comp, const reduce_plan *p, int64_t base,
                      kiln__interp_scalar *acc, kiln__interp_scalar *args) {
  int64_t ridx[R] = {0};
  for (uint32_t i = 0; i < p->nred; i++)
    if (p->rsize[i] == 0) return 0;
  do {
    int64_t off = base;
    for (uint32_t i = 0; i < p->nred; i++) off += ridx[i] * p->st[p->red[i]];
    for (uint32_t k = 0; k < n; k++) {
      args[k] = acc[k];
      args[n + k] = kiln__interp_scalar_load(ops[k], off);
    }
    int rc = kiln__interp_call_scalar(c, ins, comp, args, 2 * n, acc, n);
    if (rc) return rc;
  } while (kiln__interp_next_index(ridx, p->rsize, p->nred));
  return 0;
}

int kiln__interp_eval_reduce(kiln__interp_ctx *c, const kiln_instr *ins,
                             const kiln_literal *const *ops, kiln_literal **out) {
  if (ins->noperands % 2) return bad(c, ins, "needs as many init values as inputs");
  uint32_t n = ins->noperands / 2, comp = 0;
  int rc = kiln__interp_called(c, ins, 0, &comp);
  kiln__interp_scalar *s = rc ? NULL : scratch(c, ins, n);
  if (s == NULL) return rc ? rc : KILN_ENOMEM;
  kiln__interp_scalar *init = s, *acc = s + n, *args = s + 2 * n;
  reduce_plan p;
  rc = inputs_and_inits(c, ins, ops, n, comp, init);
  if (rc == 0) rc = plan_reduce(c, ins, ops[0], n, &p);
  if (rc == 0) rc = kiln__interp_lit_result(c, ins, out);
  if (rc) goto out;
  int64_t kidx[R] = {0}, count = kiln_shape_elements(part_shape(&ins->shape, n, 0));
  for (int64_t o = 0; o < count && rc == 0; o++) {
    int64_t base = 0;
    for (uint32_t i = 0; i < p.nkeep; i++) base += kidx[i] * p.st[p.keep[i]];
    memcpy(acc, init, n * sizeof *acc);
    rc = reduce_one(c, ins, ops, n, comp, &p, base, acc, args);
    for (uint32_t k = 0; rc == 0 && k < n; k++)
      kiln__interp_scalar_store(part(*out, n, k), o, acc[k]);
    kiln__interp_next_index(kidx, p.kdims, p.nkeep);
  }
  if (rc == 0 && ops[0]->dynamic_sizes) {
    int64_t sz[R];
    for (uint32_t i = 0; i < p.nkeep; i++) sz[i] = kiln__interp_dyn_size(ops[0], p.keep[i]);
    for (uint32_t k = 0; rc == 0 && k < n; k++)
      rc = kiln__interp_dyn_set(c, ins, (*out)->own, part(*out, n, k), sz);
  }
out:
  kiln_free(s);
  if (rc && *out) {
    kiln__interp_lit_free(c, *out);
    *out = NULL;
  }
  return rc;
}

/* ---- windows ------------------------------------------------------------ */

typedef struct window_plan {
  uint32_t rank;
  const kiln_window_dim *w;
  const int64_t *in_dims;
  int64_t in_st[R], wsize[R], out_dims[R];
} window_plan;

static int plan_window(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_shape *in,
                       window_plan *p) {
  const kiln_attr *a = kiln_instr_attr(ins, KILN_ATTR_WINDOW);
  const kiln_window *w = a ? a->v.window : NULL;
  if (w == NULL || w->rank != in->rank) return bad(c, ins, "window must have one entry per dim");
  p->rank = in->rank;
  p->w = w->dims;
  p->in_dims = in->dims;
  kiln__interp_strides(in, p->in_st);
  for (uint32_t d = 0; d < p->rank; d++) {
    const kiln_window_dim *wd = &w->dims[d];
    if (wd->size < 0 || wd->stride < 1 || wd->lhs_dilate < 1 || wd->rhs_dilate < 1)
      return bad(c, ins, "window sizes, strides and dilations must be positive");
    int64_t padded =
        (in->dims[d] > 0 ? (in->dims[d] - 1) * wd->lhs_dilate + 1 : 0) + wd->pad_lo + wd->pad_hi;
    int64_t eff = wd->size > 0 ? (wd->size - 1) * wd->rhs_dilate + 1 : 0;
    p->out_dims[d] = padded < eff ? 0 : (padded - eff) / wd->stride + 1;
    p->wsize[d] = wd->size;
  }
  return 0;
}

/* Linear input index of window position widx for output position oidx, or
 * -1 when it falls on padding or a base-dilation hole. */
static int64_t window_at(const window_plan *p, const int64_t *oidx, const int64_t *widx) {
  int64_t off = 0;
  for (uint32_t d = 0; d < p->rank; d++) {
    const kiln_window_dim *wd = &p->w[d];
    int64_t pos = oidx[d] * wd->stride + widx[d] * wd->rhs_dilate - wd->pad_lo;
    if (pos < 0 || pos % wd->lhs_dilate) return -1;
    pos /= wd->lhs_dilate;
    if (pos >= p->in_dims[d]) return -1;
    off += pos * p->in_st[d];
  }
  return off;
}

static bool window_empty(const window_plan *p) {
  for (uint32_t d = 0; d < p->rank; d++)
    if (p->wsize[d] == 0) return true;
  return false;
}

int kiln__interp_eval_reduce_window(kiln__interp_ctx *c, const kiln_instr *ins,
                                    const kiln_literal *const *ops, kiln_literal **out) {
  if (ins->noperands % 2) return bad(c, ins, "needs as many init values as inputs");
  uint32_t n = ins->noperands / 2, comp = 0;
  int rc = kiln__interp_called(c, ins, 0, &comp);
  kiln__interp_scalar *s = rc ? NULL : scratch(c, ins, n);
  if (s == NULL) return rc ? rc : KILN_ENOMEM;
  kiln__interp_scalar *init = s, *acc = s + n, *args = s + 2 * n;
  window_plan p;
  rc = inputs_and_inits(c, ins, ops, n, comp, init);
  if (rc == 0) rc = plan_window(c, ins, &ops[0]->shape, &p);
  for (uint32_t k = 0; rc == 0 && k < n; k++) {
    const kiln_shape *rs = part_shape(&ins->shape, n, k);
    if (rs == NULL || !kiln_shape_is_array(rs) || rs->rank != p.rank ||
        memcmp(rs->dims, p.out_dims, p.rank * sizeof *rs->dims))
      rc = bad(c, ins, "result dims do not match the window");
  }
  if (rc == 0) rc = kiln__interp_lit_result(c, ins, out);
  if (rc) goto out;
  int64_t oidx[R] = {0}, count = kiln_shape_elements(part_shape(&ins->shape, n, 0));
  for (int64_t o = 0; o < count && rc == 0; o++) {
    memcpy(acc, init, n * sizeof *acc);
    int64_t widx[R] = {0};
    if (!window_empty(&p)) {
      do {
        int64_t at = window_at(&p, oidx, widx);
        if (at < 0) continue;
        for (uint32_t k = 0; k < n; k++) {
          args[k] = acc[k];
          args[n + k] = kiln__interp_scalar_load(ops[k], at);
        }
        rc = kiln__interp_call_scalar(c, ins, comp, args, 2 * n, acc, n);
      } while (rc == 0 && kiln__interp_next_index(widx, p.wsize, p.rank));
    }
    for (uint32_t k = 0; rc == 0 && k < n; k++)
      kiln__interp_scalar_store(part(*out, n, k), o, acc[k]);
    kiln__interp_next_index(oidx, p.out_dims, p.rank);
  }
out:
  kiln_free(s);
  if (rc && *out) {
    kiln__interp_lit_free(c, *out);
    *out = NULL;
  }
  return rc;
}

/* select-and-scatter: for each window (one per source element) pick the
 * element `select` prefers, scanning in row-major order and keeping the
 * current pick while select(current, candidate) holds; then combine the
 * source element into the result there with `scatter`. */
int kiln__interp_eval_select_and_scatter(kiln__interp_ctx *c, const kiln_instr *ins,
                                         const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0], *src = ops[1], *iv = ops[2];
  uint32_t sel = 0, sca = 0;
  int rc = kiln__interp_called(c, ins, 0, &sel);
  if (rc == 0) rc = kiln__interp_called(c, ins, 1, &sca);
  if (rc == 0) rc = kiln__interp_need_array(c, ins, a, "operand");
  if (rc == 0) rc = kiln__interp_need_array(c, ins, src, "source");
  if (rc) return rc;
  if (!kiln_shape_is_array(&iv->shape) || kiln_literal_elements(iv) != 1)
    return bad(c, ins, "init value must be a scalar");
  if (!kiln__interp_same_dims(&a->shape, &ins->shape))
    return bad(c, ins,
               "result dims differ from "
               "the operand's");
  if (!kiln__interp_dtype_computable(a->shape.dtype) ||
      !kiln__interp_dtype_computable(src->shape.dtype))
    return kiln__interp_fail(c, ins, KILN_EUNIMPL,
                             "select-and-scatter %s: element type has no "
                             "arithmetic in the interpreter",
                             ins->name);
  window_plan p;
  rc = plan_window(c, ins, &a->shape, &p);
  if (rc) return rc;
  if (src->shape.rank != p.rank || memcmp(src->shape.dims, p.out_dims, p.rank * sizeof(int64_t)))
    return bad(c, ins, "source dims do not match the windows of the operand");
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  kiln_literal *r = *out;
  kiln__interp_scalar init = kiln__interp_scalar_load(iv, 0);
  int64_t total = kiln_literal_elements(r);
  for (int64_t i = 0; i < total; i++) kiln__interp_scalar_store(r, i, init);
  int64_t oidx[R] = {0}, count = kiln_literal_elements(src);
  for (int64_t o = 0; o < count && rc == 0; o++) {
    int64_t widx[R] = {0}, best = -1;
    kiln__interp_scalar bv = init;
    if (!window_empty(&p)) {
      do {
        int64_t at = window_at(&p, oidx, widx);
        if (at < 0) continue;
        kiln__interp_scalar cv = kiln__interp_scalar_load(a, at);
        if (best < 0) {
          best = at;
          bv = cv;
          continue;
        }
        kiln__interp_scalar args[2] = {bv, cv}, keep;
        rc = kiln__interp_call_scalar(c, ins, sel, args, 2, &keep, 1);
        if (rc == 0 && !kiln__interp_scalar_truthy(keep)) {
          best = at;
          bv = cv;
        }
      } while (rc == 0 && kiln__interp_next_index(widx, p.wsize, p.rank));
    }
    if (rc == 0 && best >= 0) {
      kiln__interp_scalar args[2] = {kiln__interp_scalar_load(r, best),
                                     kiln__interp_scalar_load(src, o)},
                          v;
      rc = kiln__interp_call_scalar(c, ins, sca, args, 2, &v, 1);
      if (rc == 0) kiln__interp_scalar_store(r, best, v);
    }
    kiln__interp_next_index(oidx, p.out_dims, p.rank);
  }
  if (rc) {
    kiln__interp_lit_free(c, r);
    *out = NULL;
  }
  return rc;
}

/* ---- sort --------------------------------------------------------------- */

typedef struct sort_ctx {
  kiln__interp_ctx *c;
  const kiln_instr *ins;
  uint32_t comp, n;
  const kiln_literal *const *ops;
  int64_t base, step;        /* linear index of slice element j: base + j*step */
  kiln__interp_scalar *args; /* 2n */
  bool largest;              /* top-k: order by total order, descending */
} sort_ctx;

/* Whether element j must come before element i. */
static int less(sort_ctx *s, int64_t j, int64_t i, bool *out) {
  if (s->comp == UINT32_MAX) {
    kiln__interp_scalar a = kiln__interp_scalar_load(s->ops[0], s->base + j * s->step);
    kiln__interp_scalar b = kiln__interp_scalar_load(s->ops[0], s->base + i * s->step);
    kiln_instr cmp = {.op = KILN_OP_COMPARE};
    kiln_attr at[2] = {{.key = KILN_ATTR_DIRECTION, .v.i = s->largest ? KILN_CMP_GT : KILN_CMP_LT},
                       {.key = KILN_ATTR_TYPE, .v.s = "TOTALORDER"}};
    cmp.attrs = at;
    cmp.nattrs = 2;
    kiln__interp_scalar r;
    const char *why = "";
    kiln__interp_scalar ab[2] = {a, b};
    if (kiln__interp_scalar_op(&cmp, KILN_OP_COMPARE, ab, 2, KILN_PRED, &r, &why))
      return kiln__interp_fail(s->c, s->ins, KILN_EUNIMPL, "%s %s: %s",
                               kiln_opcode_name(s->ins->op), s->ins->name, why);
    *out = r.v.u != 0;
    return 0;
  }
  for (uint32_t k = 0; k < s->n; k++) {
    s->args[2 * k] = kiln__interp_scalar_load(s->ops[k], s->base + j * s->step);
    s->args[2 * k + 1] = kiln__interp_scalar_load(s->ops[k], s->base + i * s->step);
  }
  kiln__interp_scalar r;
  int rc = kiln__interp_call_scalar(s->c, s->ins, s->comp, s->args, 2 * s->n, &r, 1);
  if (rc == 0) *out = kiln__interp_scalar_truthy(r);
  return rc;
}

/* Stable bottom-up merge sort of perm[0..len) (an element from the right run
 * goes first only when it is strictly less). */
static int merge_sort(sort_ctx *s, int64_t *perm, int64_t *tmp, int64_t len) {
  for (int64_t width = 1; width < len; width *= 2) {
    for (int64_t lo = 0; lo < len; lo += 2 * width) {
      int64_t mid = lo + width < len ? lo + width : len;
      int64_t hi = lo + 2 * width < len ? lo + 2 * width : len;
      int64_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi) {
        bool lt = false;
        int rc = less(s, perm[j], perm[i], &lt);
        if (rc) return rc;
        tmp[k++] = lt ? perm[j++] : perm[i++];
      }
      while (i < mid) tmp[k++] = perm[i++];
      while (j < hi) tmp[k++] = perm[j++];
    }
    memcpy(perm, tmp, (size_t)len * sizeof *perm);
  }
  return 0;
}

int kiln__interp_eval_sort(kiln__interp_ctx *c, const kiln_instr *ins,
                           const kiln_literal *const *ops, kiln_literal **out) {
  uint32_t n = ins->noperands, comp = 0;
  int rc = kiln__interp_called(c, ins, 0, &comp);
  for (uint32_t k = 0; rc == 0 && k < n; k++) {
    rc = kiln__interp_need_array(c, ins, ops[k], "operand");
    if (rc == 0 && !kiln__interp_same_dims(&ops[k]->shape, &ops[0]->shape))
      rc = bad(c, ins, "operands differ in dims");
    const kiln_shape *rs = part_shape(&ins->shape, n, k);
    if (rc == 0 &&
        (rs == NULL || !kiln_shape_is_array(rs) || !kiln__interp_same_dims(rs, &ops[k]->shape) ||
         rs->dtype != ops[k]->shape.dtype))
      rc = bad(c, ins, "result shapes must equal the operands'");
  }
  if (rc) return rc;
  const kiln_shape *s0 = &ops[0]->shape;
  const kiln_i64s *dl = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  int64_t d = dl && dl->n == 1 ? dl->v[0] : (int64_t)s0->rank - 1;
  if (s0->rank == 0 || d < 0 || d >= s0->rank) return bad(c, ins, "sort dimension out of range");
  int64_t len = s0->dims[d], st[R], idx[R] = {0}, odims[R];
  kiln__interp_strides(s0, st);
  for (uint32_t k = 0; k < s0->rank; k++) odims[k] = k == d ? 1 : s0->dims[k];
  int64_t *perm = kiln_calloc((size_t)len * 2 + 1, sizeof *perm);
  kiln__interp_scalar *args = kiln_calloc(2 * (size_t)n, sizeof *args);
  if (perm == NULL || args == NULL) rc = kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  if (rc == 0) rc = kiln__interp_lit_result(c, ins, out);
  sort_ctx sc = {c, ins, comp, n, ops, 0, st[d], args, false};
  if (rc == 0 && len > 0 && kiln_literal_elements(ops[0]) > 0) {
    do {
      sc.base = kiln__interp_linear(idx, st, s0->rank);
      for (int64_t j = 0; j < len; j++) perm[j] = j;
      rc = merge_sort(&sc, perm, perm + len, len);
      for (uint32_t k = 0; rc == 0 && k < n; k++)
        for (int64_t j = 0; j < len; j++)
          kiln__interp_copy_elem(part(*out, n, k), sc.base + j * st[d], ops[k],
                                 sc.base + perm[j] * st[d]);
    } while (rc == 0 && kiln__interp_next_index(idx, odims, s0->rank));
  }
  for (uint32_t k = 0; rc == 0 && k < n; k++)
    if (ops[k]->dynamic_sizes) rc = kiln__interp_dyn_inherit(c, ins, part(*out, n, k), ops[k]);
  kiln_free(perm);
  kiln_free(args);
  if (rc && *out) {
    kiln__interp_lit_free(c, *out);
    *out = NULL;
  }
  return rc;
}

/* top-k along the last dim: (values, s32 indices), largest first by default
 * (total order for floats), ties keeping the lower index first. */
int kiln__interp_eval_topk(kiln__interp_ctx *c, const kiln_instr *ins,
                           const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  int rc = kiln__interp_need_array(c, ins, a, "operand");
  if (rc) return rc;
  const kiln_shape *s = &ins->shape, *s0 = &a->shape;
  int64_t k = kiln_instr_attr_int(ins, KILN_ATTR_K, -1);
  bool largest = kiln_instr_attr_int(ins, KILN_ATTR_LARGEST, 1) != 0;
  if (s0->rank == 0 || !kiln_shape_is_tuple(s) || s->rank != 2 || k < 0 ||
      k > s0->dims[s0->rank - 1])
    return bad(c, ins, "needs k <= the last dim and a (values, indices) result");
  for (uint32_t j = 0; j < 2; j++) {
    const kiln_shape *e = &s->tuple[j];
    bool ok = kiln_shape_is_array(e) && e->rank == s0->rank;
    for (uint32_t q = 0; ok && q < s0->rank; q++)
      ok = e->dims[q] == (q + 1 == s0->rank ? k : s0->dims[q]);
    if (!ok) return bad(c, ins, "result dims must be the operand's with k last");
  }
  if (s->tuple[0].dtype != s0->dtype) return bad(c, ins, "values must keep the operand's type");
  if (!kiln__interp_dtype_computable(s0->dtype))
    return kiln__interp_fail(c, ins, KILN_EUNIMPL, "topk %s: element type has no order here",
                             ins->name);
  int64_t len = s0->dims[s0->rank - 1], rows = len ? kiln_literal_elements(a) / len : 0;
  int64_t *perm = kiln_calloc((size_t)len * 2 + 1, sizeof *perm);
  if (perm == NULL) return kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  rc = kiln__interp_lit_result(c, ins, out);
  sort_ctx sc = {c, ins, UINT32_MAX, 1, ops, 0, 1, NULL, largest};
  for (int64_t row = 0; rc == 0 && row < rows; row++) {
    sc.base = row * len;
    for (int64_t j = 0; j < len; j++) perm[j] = j;
    rc = merge_sort(&sc, perm, perm + len, len);
    for (int64_t j = 0; rc == 0 && j < k; j++) {
      kiln__interp_copy_elem((*out)->elems[0], row * k + j, a, row * len + perm[j]);
      kiln__interp_scalar_store((*out)->elems[1], row * k + j,
                                (kiln__interp_scalar){.t = KILN_S64, .v.s = perm[j]});
    }
  }
  kiln_free(perm);
  if (rc && *out) {
    kiln__interp_lit_free(c, *out);
    *out = NULL;
  }
  return rc;
}
