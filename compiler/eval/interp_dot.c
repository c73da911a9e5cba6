/* Contractions: dot (any batch and contracting dims) and convolution (dim
 * labels, padding, strides, lhs/rhs dilation, window reversal, feature and
 * batch groups).
 *
 * As in XLA, operands are first converted to the result's element type (so a
 * dot of f32 operands with a bf16 result multiplies bf16 values). Products are
 * then accumulated without intermediate rounding: in double for floats
 * (rounded once when stored), in 64-bit wrapping arithmetic for integers
 * (wrapped to the result width when stored), in double complex for complex.
 * Operands are converted once into flat scratch arrays of these accumulator
 * types before the loops.
 */
#include <complex.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/eval/interp_internal.h"

#define R KILN_INTERP_MAX_RANK

typedef enum acc_kind { ACC_FLOAT, ACC_INT, ACC_COMPLEX } acc_kind;

/* One operand converted to the result type, flattened. */
typedef struct flat {
  acc_kind kind;
  double *f;         /* ACC_FLOAT */
  uint64_t *u;       /* ACC_INT */
  double complex *z; /* ACC_COMPLEX */
} flat;

static int bad(kiln__interp_ctx *c, const kiln_instr *ins, const char *what) {
  return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: %s", kiln_opcode_name(ins->op), ins->name,
                           what);
}

static acc_kind kind_of(kiln_dtype t) {
  if (kiln_dtype_is_float(t)) return ACC_FLOAT;
  if (kiln_dtype_is_complex(t)) return ACC_COMPLEX;
  return ACC_INT;
}

static int flatten(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *a, kiln_dtype to,
                   flat *out) {
  memset(out, 0, sizeof *out);
  out->kind = kind_of(to);
  int64_t n = kiln_literal_elements(a);
  size_t cnt = (size_t)(n > 0 ? n : 1);
  if (out->kind == ACC_FLOAT)
    out->f = kiln_calloc(cnt, sizeof *out->f);
  else if (out->kind == ACC_INT)
    out->u = kiln_calloc(cnt, sizeof *out->u);
  else
    out->z = kiln_calloc(cnt, sizeof *out->z);
  if (!out->f && !out->u && !out->z) return kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  for (int64_t i = 0; i < n; i++) {
    kiln__interp_scalar v = kiln__interp_scalar_convert(kiln__interp_scalar_load(a, i), to);
    if (out->kind == ACC_FLOAT)
      out->f[i] = v.v.f;
    else if (out->kind == ACC_INT)
      out->u[i] = kiln_dtype_is_signed_int(to) ? (uint64_t)v.v.s : v.v.u;
    else
      out->z[i] = CMPLX(v.v.f, v.im);
  }
  return 0;
}

static void flat_free(flat *f) {
  kiln_free(f->f);
  kiln_free(f->u);
  kiln_free(f->z);
}

typedef struct acc {
  double f;
  uint64_t u;
  double complex z;
} acc;

static void acc_add(acc *a, const flat *l, int64_t li, const flat *r, int64_t ri) {
  switch (l->kind) {
  case ACC_FLOAT: a->f += l->f[li] * r->f[ri]; break;
  case ACC_INT: a->u += l->u[li] * r->u[ri]; break;
  case ACC_COMPLEX: a->z += l->z[li] * r->z[ri]; break;
  }
}

static void acc_store(kiln_literal *res, int64_t i, const acc *a) {
  switch (kind_of(res->shape.dtype)) {
  case ACC_FLOAT: kiln_literal_set_f64(res, i, a->f); break;
  case ACC_INT: kiln_literal_set_u64(res, i, a->u); break;
  case ACC_COMPLEX: kiln_literal_set_c128(res, i, creal(a->z), cimag(a->z)); break;
  }
}

static int prepare(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *const *ops,
                   flat *l, flat *r) {
  memset(l, 0, sizeof *l);
  memset(r, 0, sizeof *r);
  int rc = kiln__interp_need_array(c, ins, ops[0], "lhs");
  if (rc == 0) rc = kiln__interp_need_array(c, ins, ops[1], "rhs");
  if (rc == 0) rc = kiln__interp_need_array(c, ins, &(kiln_literal){.shape = ins->shape}, "result");
  if (rc) return rc;
  kiln_dtype t = ins->shape.dtype;
  if (!kiln__interp_dtype_computable(t) || !kiln__interp_dtype_computable(ops[0]->shape.dtype) ||
      !kiln__interp_dtype_computable(ops[1]->shape.dtype))
    return kiln__interp_fail(c, ins, KILN_EUNIMPL,
                             "%s %s: element type %s has no arithmetic in the "
                             "interpreter",
                             kiln_opcode_name(ins->op), ins->name, kiln_dtype_name(t));
  return 0;
}

/* ---- dot ---------------------------------------------------------------- */

static const kiln_i64s *dims_attr(const kiln_instr *ins, kiln_attr_key k) {
  static const kiln_i64s none = {NULL, 0};
  const kiln_i64s *l = kiln_instr_attr_ints(ins, k);
  return l ? l : &none;
}

/* Marks the dims of `l` in `used` (rank `rank`); false when out of range or repeated. */
static bool mark(const kiln_i64s *l, uint32_t rank, uint8_t *used) {
  for (uint32_t i = 0; i < l->n; i++) {
    if (l->v[i] < 0 || l->v[i] >= rank || used[l->v[i]]) return false;
    used[l->v[i]] = 1;
  }
  return true;
}

int kiln__interp_eval_dot(kiln__interp_ctx *c, const kiln_instr *ins,
                          const kiln_literal *const *ops, kiln_literal **out) {
  flat l, r;
  int rc = prepare(c, ins, ops, &l, &r);
  if (rc) return rc;
  const kiln_shape *ls = &ops[0]->shape, *rs = &ops[1]->shape, *os = &ins->shape;
  const kiln_i64s *lb = dims_attr(ins, KILN_ATTR_LHS_BATCH_DIMS);
  const kiln_i64s *rb = dims_attr(ins, KILN_ATTR_RHS_BATCH_DIMS);
  const kiln_i64s *lc = dims_attr(ins, KILN_ATTR_LHS_CONTRACTING_DIMS);
  const kiln_i64s *rcn = dims_attr(ins, KILN_ATTR_RHS_CONTRACTING_DIMS);
  uint8_t lu[R] = {0}, ru[R] = {0};
  if (lb->n != rb->n || lc->n != rcn->n || !mark(lb, ls->rank, lu) || !mark(lc, ls->rank, lu) ||
      !mark(rb, rs->rank, ru) || !mark(rcn, rs->rank, ru))
    return bad(c, ins, "batch and contracting dims must be distinct dims, as many on each side");
  int64_t csize[R];
  for (uint32_t i = 0; i < lb->n; i++)
    if (ls->dims[lb->v[i]] != rs->dims[rb->v[i]]) return bad(c, ins, "batch dim sizes differ");
  for (uint32_t i = 0; i < lc->n; i++) {
    if (ls->dims[lc->v[i]] != rs->dims[rcn->v[i]])
      return bad(c, ins, "contracting dim sizes differ");
    /* A runtime-sized contraction runs over the valid elements only (the
     * smaller size when both sides have one): padding adds nothing. */
    int64_t a = kiln__interp_dyn_size(ops[0], (uint32_t)lc->v[i]);
    int64_t b = kiln__interp_dyn_size(ops[1], (uint32_t)rcn->v[i]);
    csize[i] = a < b ? a : b;
  }
  /* Result dims: batch, lhs free, rhs free; each maps to an operand dim. */
  int64_t lmap[R], rmap[R]; /* result dim -> lhs / rhs dim, -1 when none */
  uint32_t k = 0;
  for (uint32_t i = 0; i < lb->n; i++, k++) lmap[k] = lb->v[i], rmap[k] = rb->v[i];
  for (uint32_t d = 0; d < ls->rank; d++)
    if (!lu[d]) lmap[k] = d, rmap[k++] = -1;
  for (uint32_t d = 0; d < rs->rank; d++)
    if (!ru[d]) lmap[k] = -1, rmap[k++] = d;
  if (k != os->rank) return bad(c, ins, "result rank is not batch + free dims");
  for (uint32_t i = 0; i < k; i++)
    if (os->dims[i] != (lmap[i] >= 0 ? ls->dims[lmap[i]] : rs->dims[rmap[i]]))
      return bad(c, ins, "result dims do not match the operands");
  rc = flatten(c, ins, ops[0], os->dtype, &l);
  if (rc == 0) rc = flatten(c, ins, ops[1], os->dtype, &r);
  if (rc == 0) rc = kiln__interp_lit_result(c, ins, out);
  if (rc) goto out;
  int64_t lst[R], rst[R], idx[R] = {0}, n = kiln_literal_elements(*out);
  kiln__interp_strides(ls, lst);
  kiln__interp_strides(rs, rst);
  for (int64_t o = 0; o < n; o++) {
    int64_t lbase = 0, rbase = 0, ci[R] = {0};
    for (uint32_t i = 0; i < k; i++) {
      if (lmap[i] >= 0) lbase += idx[i] * lst[lmap[i]];
      if (rmap[i] >= 0) rbase += idx[i] * rst[rmap[i]];
    }
    acc a = {0, 0, 0};
    bool empty = false;
    for (uint32_t i = 0; i < lc->n; i++) empty |= csize[i] == 0;
    if (!empty) {
      do {
        int64_t li = lbase, ri = rbase;
        for (uint32_t i = 0; i < lc->n; i++) {
          li += ci[i] * lst[lc->v[i]];
          ri += ci[i] * rst[rcn->v[i]];
        }
        acc_add(&a, &l, li, &r, ri);
      } while (kiln__interp_next_index(ci, csize, lc->n));
    }
    acc_store(*out, o, &a);
    kiln__interp_next_index(idx, os->dims, os->rank);
  }
  if (ops[0]->dynamic_sizes || ops[1]->dynamic_sizes) {
    int64_t sz[R]; /* batch and free dims keep their operand's runtime size */
    for (uint32_t i = 0; i < k; i++)
      sz[i] = lmap[i] >= 0 ? kiln__interp_dyn_size(ops[0], (uint32_t)lmap[i])
                           : kiln__interp_dyn_size(ops[1], (uint32_t)rmap[i]);
    rc = kiln__interp_dyn_set(c, ins, (*out)->own, *out, sz);
  }
out:
  flat_free(&l);
  flat_free(&r);
  if (rc && *out) {
    kiln__interp_lit_free(c, *out);
    *out = NULL;
  }
  return rc;
}

/* ---- convolution -------------------------------------------------------- */

typedef struct conv_plan {
  const kiln_conv_dims *d;
  kiln_window_dim w[R];
  int64_t fgc, bgc, in_z, in_b, out_z, ifgs, ofgs, bgs, depth_mult;
  int64_t ksizes[R];
} conv_plan;

static int plan_conv(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_shape *ls,
                     const kiln_shape *rs, conv_plan *p) {
  const kiln_attr *da = kiln_instr_attr(ins, KILN_ATTR_DIM_LABELS);
  const kiln_conv_dims *d = da ? da->v.conv : NULL;
  if (d == NULL || ls->rank != d->nspatial + 2 || rs->rank != d->nspatial + 2 ||
      ins->shape.rank != d->nspatial + 2)
    return bad(c, ins, "dim_labels must describe operands of rank spatial + 2");
  p->d = d;
  uint32_t ns = d->nspatial, r = ns + 2;
  int64_t all[] = {d->in_batch,   d->in_feature, d->kernel_in,
                   d->kernel_out, d->out_batch,  d->out_feature};
  for (size_t i = 0; i < 6; i++)
    if (all[i] < 0 || all[i] >= r) return bad(c, ins, "dim_labels out of range");
  for (uint32_t i = 0; i < ns; i++)
    if (d->in_spatial[i] < 0 || d->in_spatial[i] >= r || d->kernel_spatial[i] < 0 ||
        d->kernel_spatial[i] >= r || d->out_spatial[i] < 0 || d->out_spatial[i] >= r)
      return bad(c, ins, "dim_labels out of range");
  const kiln_attr *wa = kiln_instr_attr(ins, KILN_ATTR_WINDOW);
  const kiln_window *w = wa ? wa->v.window : NULL;
  if (w && w->rank != ns) return bad(c, ins, "window must have one entry per spatial dim");
  for (uint32_t i = 0; i < ns; i++) {
    p->ksizes[i] = rs->dims[d->kernel_spatial[i]];
    kiln_window_dim def = {.size = p->ksizes[i], .stride = 1, .lhs_dilate = 1, .rhs_dilate = 1};
    p->w[i] = w ? w->dims[i] : def;
    if (p->w[i].size != p->ksizes[i] || p->w[i].stride < 1 || p->w[i].lhs_dilate < 1 ||
        p->w[i].rhs_dilate < 1)
      return bad(c, ins, "window must match the kernel, with positive strides and dilations");
  }
  p->fgc = kiln_instr_attr_int(ins, KILN_ATTR_FEATURE_GROUP_COUNT, 1);
  p->bgc = kiln_instr_attr_int(ins, KILN_ATTR_BATCH_GROUP_COUNT, 1);
  p->in_z = ls->dims[d->in_feature];
  p->in_b = ls->dims[d->in_batch];
  p->out_z = rs->dims[d->kernel_out];
  if (p->fgc < 1 || p->bgc < 1 || p->in_z % p->fgc || p->out_z % p->fgc || p->in_b % p->bgc ||
      p->out_z % p->bgc)
    return bad(c, ins, "group counts must divide the feature and batch sizes");
  p->ifgs = p->in_z / p->fgc;
  p->ofgs = p->out_z / p->fgc;
  p->bgs = p->in_b / p->bgc;
  p->depth_mult = p->bgc > 1 ? p->out_z / p->bgc : 1;
  const kiln_shape *os = &ins->shape;
  if (rs->dims[d->kernel_in] != p->ifgs)
    return bad(c, ins, "kernel input features must be the input features per group");
  if (os->dims[d->out_batch] != p->bgs || os->dims[d->out_feature] != p->out_z)
    return bad(c, ins, "result batch or feature size does not match the operands");
  for (uint32_t i = 0; i < ns; i++) {
    const kiln_window_dim *wd = &p->w[i];
    int64_t in = ls->dims[d->in_spatial[i]];
    int64_t padded = (in > 0 ? (in - 1) * wd->lhs_dilate + 1 : 0) + wd->pad_lo + wd->pad_hi;
    int64_t eff = wd->size > 0 ? (wd->size - 1) * wd->rhs_dilate + 1 : 0;
    int64_t o = padded < eff ? 0 : (padded - eff) / wd->stride + 1;
    if (os->dims[d->out_spatial[i]] != o) return bad(c, ins, "result spatial dims do not match");
  }
  return 0;
}

/* One output element, following XLA's definition of grouped convolution. */
static void conv_one(const conv_plan *p, const kiln_shape *ls, const int64_t *lst,
                     const int64_t *rst, const flat *l, const flat *r, const int64_t *o, acc *a) {
  const kiln_conv_dims *d = p->d;
  uint32_t ns = d->nspatial;
  int64_t oz = o[d->out_feature], ob = o[d->out_batch];
  int64_t fgi = oz / p->ofgs, bgi = oz / p->depth_mult;
  int64_t lb = (ob + (bgi * p->bgs) % p->in_b) * lst[d->in_batch];
  int64_t rb = oz * rst[d->kernel_out];
  int64_t k[R] = {0};
  for (uint32_t i = 0; i < ns; i++)
    if (p->ksizes[i] == 0) return;
  do {
    int64_t loff = lb, roff = rb;
    bool skip = false;
    for (uint32_t i = 0; i < ns && !skip; i++) {
      const kiln_window_dim *wd = &p->w[i];
      int64_t u = o[d->out_spatial[i]] * wd->stride - wd->pad_lo + k[i] * wd->rhs_dilate;
      if (u < 0 || u % wd->lhs_dilate) {
        skip = true;
        break;
      }
      int64_t li = u / wd->lhs_dilate;
      if (li >= ls->dims[d->in_spatial[i]]) skip = true;
      loff += li * lst[d->in_spatial[i]];
      roff += (wd->reversal ? p->ksizes[i] - 1 - k[i] : k[i]) * rst[d->kernel_spatial[i]];
    }
    if (skip) continue;
    for (int64_t z = 0; z < p->ifgs; z++) {
      int64_t iz = fgi * p->ifgs + z;
      acc_add(a, l, loff + iz * lst[d->in_feature], r, roff + z * rst[d->kernel_in]);
    }
  } while (kiln__interp_next_index(k, p->ksizes, ns));
}

int kiln__interp_eval_convolution(kiln__interp_ctx *c, const kiln_instr *ins,
                                  const kiln_literal *const *ops, kiln_literal **out) {
  flat l, r;
  int rc = prepare(c, ins, ops, &l, &r);
  if (rc) return rc;
  const kiln_shape *ls = &ops[0]->shape, *rs = &ops[1]->shape, *os = &ins->shape;
  conv_plan p;
  rc = plan_conv(c, ins, ls, rs, &p);
  if (rc) return rc;
  rc = flatten(c, ins, ops[0], os->dtype, &l);
  if (rc == 0) rc = flatten(c, ins, ops[1], os->dtype, &r);
  if (rc == 0) rc = kiln__interp_lit_result(c, ins, out);
  if (rc) goto out;
  int64_t lst[R], rst[R], o[R] = {0}, n = kiln_literal_elements(*out);
  kiln__interp_strides(ls, lst);
  kiln__interp_strides(rs, rst);
  for (int64_t i = 0; i < n; i++) {
    acc a = {0, 0, 0};
    conv_one(&p, ls, lst, rst, &l, &r, o, &a);
    acc_store(*out, i, &a);
    kiln__interp_next_index(o, os->dims, os->rank);
  }
out:
  flat_free(&l);
  flat_free(&r);
  if (rc && *out) {
    kiln__interp_lit_free(c, *out);
    *out = NULL;
  }
  return rc;
}
