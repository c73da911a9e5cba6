/* Data movement as index arithmetic: the value of a movement op at index I
 * is its operand's value at an index computed from I (broadcast, reshape,
 * transpose, bitcast, slice, reverse, dynamic-slice, gather), or one of
 * several operands' values chosen by a condition on I (concatenate, pad,
 * dynamic-update-slice), computed inside the branch that needs it so that
 * no read ever goes out of bounds. Start indices are clamped as XLA does.
 */
#include <stdio.h>
#include <string.h>

#include "compiler/buffer_assign.h"
#include "compiler/codegen/emit.h"

static const kiln_instr *opnd(kiln__emit_fn *f, const kiln_instr *ins, uint32_t j) {
  return f->mod->m->instrs[ins->operands[j]];
}

static int need(kiln__emit_fn *f, const kiln_instr *ins, bool ok, const char *what) {
  if (ok) return 0;
  return kiln__emit_fail(f, ins, KILN_EINVAL, "%s %s: %s", kiln_opcode_name(ins->op), ins->name,
                         what);
}

/* The operand's value at index y, copied into a new variable of ins's type. */
static int forward(kiln__emit_fn *f, const kiln_instr *ins, uint32_t j, const kiln__ix *y,
                   uint32_t *var) {
  return kiln__emit_value1(f, ins->operands[j], y, var);
}

static int broadcast(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  const kiln_instr *a = opnd(f, ins, 0);
  const kiln_i64s *dl = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  uint32_t r = a->shape.rank;
  int rc = need(f, ins, (dl ? dl->n : 0) == r, "dimensions must name every operand dim");
  kiln__ix y;
  if (rc || (rc = kiln__ix_new(f, r, &y))) return rc;
  for (uint32_t k = 0; k < r; k++) {
    if (dl->v[k] < 0 || dl->v[k] >= x->rank) return need(f, ins, false, "dimension out of range");
    kiln__ix_set(&y, k, "%s", a->shape.dims[k] == 1 ? "0" : kiln__ix_get(f, x, (uint32_t)dl->v[k]));
  }
  return forward(f, ins, 0, &y, var);
}

/* Dims other than those of size 1, in order. */
static uint32_t big_dims(const kiln_shape *s, uint32_t *out) {
  uint32_t n = 0;
  for (uint32_t d = 0; d < s->rank; d++)
    if (s->dims[d] != 1) out[n++] = d;
  return n;
}

/* The operand index of a reshape, one group of dims at a time: the dims
 * of both shapes are cut where their running products agree, and each
 * group's components come from its own linear index alone. A trailing dim
 * that the reshape keeps ([1024,1024] -> [8,128,1024]) thus maps one to
 * one, with no division or remainder that would stop the C compiler from
 * vectorizing the minor loop. Empty shapes take the whole-index form. */
static int reshape_groups(kiln__emit_fn *f, const kiln__ix *x, const kiln_shape *as,
                          const kiln_shape *rs, kiln__ix *y) {
  int rc;
  char lin[1024];
  if (kiln_shape_elements(as) == 0) {
    kiln__ix_linear(f, x, rs->dims, lin, sizeof lin);
    return kiln__ix_split(f, lin, as->dims, as->rank, y);
  }
  if ((rc = kiln__ix_new(f, as->rank, y))) return rc;
  uint32_t i = 0, j = 0;
  while (i < as->rank || j < rs->rank) {
    uint32_t i0 = i, j0 = j;
    int64_t pa = 1, pr = 1;
    /* Take at least one dim from a side that still has any, then grow the
     * smaller product until they agree (they must: equal totals). */
    if (i < as->rank) pa *= as->dims[i++];
    if (j < rs->rank) pr *= rs->dims[j++];
    while (pa != pr && (i < as->rank || j < rs->rank)) {
      if ((pa < pr && i < as->rank) || j >= rs->rank)
        pa *= as->dims[i++];
      else
        pr *= rs->dims[j++];
    }
    /* Trailing size-1 dims join the group they follow. */
    while (i < as->rank && as->dims[i] == 1 && (j >= rs->rank || rs->dims[j] != 1)) i++;
    while (j < rs->rank && rs->dims[j] == 1 && (i >= as->rank || as->dims[i] != 1)) j++;
    kiln__ix sub = *x;
    sub.rank = j - j0;
    sub.c = x->c + j0;
    kiln__ix_linear(f, &sub, rs->dims + j0, lin, sizeof lin);
    kiln__ix part;
    if ((rc = kiln__ix_split(f, lin, as->dims + i0, i - i0, &part))) return rc;
    for (uint32_t d = i0; d < i; d++) kiln__ix_set(y, d, "%s", part.c[d - i0]);
  }
  return 0;
}

static int reshape(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  const kiln_instr *a = opnd(f, ins, 0);
  const kiln_shape *as = &a->shape, *rs = &ins->shape;
  uint32_t ab[KILN__EMIT_MAXR], rb[KILN__EMIT_MAXR];
  uint32_t na = big_dims(as, ab), nr = big_dims(rs, rb);
  kiln__ix y;
  int rc;
  bool same = na == nr;
  for (uint32_t i = 0; same && i < na; i++) same = as->dims[ab[i]] == rs->dims[rb[i]];
  if (same) {
    /* Only size-1 dims come or go: components map one to one. */
    if ((rc = kiln__ix_new(f, as->rank, &y))) return rc;
    for (uint32_t d = 0; d < as->rank; d++) kiln__ix_set(&y, d, "0");
    for (uint32_t i = 0; i < na; i++) kiln__ix_set(&y, ab[i], "%s", kiln__ix_get(f, x, rb[i]));
  } else if ((rc = reshape_groups(f, x, as, rs, &y))) {
    return rc;
  }
  if (x->lin && kiln__reshape_is_bitcast(as, rs) && kiln__same_layout(x->lin_shape, rs)) {
    y.lin = x->lin;
    y.lin_shape = as;
  }
  return forward(f, ins, 0, &y, var);
}

static int transpose(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  const kiln_instr *a = opnd(f, ins, 0);
  const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  uint32_t r = ins->shape.rank;
  kiln__ix y;
  int rc = need(f, ins, p && p->n == r && a->shape.rank == r, "dimensions must permute the dims");
  if (rc || (rc = kiln__ix_new(f, r, &y))) return rc;
  for (uint32_t k = 0; k < r; k++) {
    if (p->v[k] < 0 || p->v[k] >= r) return need(f, ins, false, "dimension out of range");
    kiln__ix_set(&y, (uint32_t)p->v[k], "%s", kiln__ix_get(f, x, k));
  }
  if (x->lin && kiln__transpose_is_bitcast(&a->shape, &ins->shape, p->v) &&
      kiln__same_layout(x->lin_shape, &ins->shape)) {
    y.lin = x->lin;
    y.lin_shape = &a->shape;
  }
  return forward(f, ins, 0, &y, var);
}

/* Splits a physical offset into logical components in shape s's layout. */
static int split_physical(kiln__emit_fn *f, const char *off, const kiln_shape *s, kiln__ix *y) {
  int64_t m2m[KILN__EMIT_MAXR], pd[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(s, m2m);
  uint32_t r = s->rank;
  for (uint32_t k = 0; k < r; k++) pd[k] = s->dims[m2m[r - 1 - k]]; /* major to minor */
  kiln__ix phys;
  int rc = kiln__ix_split(f, off, pd, r, &phys);
  if (rc || (rc = kiln__ix_new(f, r, y))) return rc;
  for (uint32_t k = 0; k < r; k++) kiln__ix_set(y, (uint32_t)m2m[r - 1 - k], "%s", phys.c[k]);
  return 0;
}

static int bitcast(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  const kiln_instr *a = opnd(f, ins, 0);
  int rc = need(f, ins,
                a->shape.dtype == ins->shape.dtype &&
                    kiln_shape_elements(&a->shape) == kiln_shape_elements(&ins->shape),
                "element types and counts must agree");
  if (rc) return rc;
  char off[1024];
  kiln__ix_offset(f, x, &ins->shape, off, sizeof off);
  kiln__ix y;
  if ((rc = split_physical(f, off, &a->shape, &y))) return rc;
  if (x->lin && kiln__same_layout(x->lin_shape, &ins->shape)) {
    y.lin = x->lin;
    y.lin_shape = &a->shape;
  }
  return forward(f, ins, 0, &y, var);
}

static int slice(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  const kiln_i64s *sl = kiln_instr_attr_ints(ins, KILN_ATTR_SLICE);
  uint32_t r = ins->shape.rank;
  kiln__ix y;
  int rc = need(f, ins, sl && sl->n == 3 * r, "slice needs one range per dim");
  if (rc || (rc = kiln__ix_new(f, r, &y))) return rc;
  for (uint32_t d = 0; d < r; d++) {
    long long st = sl->v[3 * d], step = sl->v[3 * d + 2];
    const char *c = kiln__ix_get(f, x, d);
    if (step == 1 && st == 0)
      kiln__ix_set(&y, d, "%s", c);
    else if (step == 1)
      kiln__ix_set(&y, d, "(%s + %lld)", c, st);
    else
      kiln__ix_set(&y, d, "(%lld + %s * %lld)", st, c, step);
  }
  return forward(f, ins, 0, &y, var);
}

static int reverse(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  const kiln_i64s *dl = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  uint32_t r = ins->shape.rank;
  kiln__ix y;
  int rc = kiln__ix_new(f, r, &y);
  if (rc) return rc;
  for (uint32_t d = 0; d < r; d++) {
    bool rev = false;
    for (uint32_t i = 0; dl && i < dl->n; i++) rev |= dl->v[i] == d;
    if (rev)
      kiln__ix_set(&y, d, "(%lld - %s)", (long long)ins->shape.dims[d] - 1, kiln__ix_get(f, x, d));
    else
      kiln__ix_set(&y, d, "%s", kiln__ix_get(f, x, d));
  }
  return forward(f, ins, 0, &y, var);
}

static int iota(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  int64_t d = kiln_instr_attr_int(ins, KILN_ATTR_IOTA_DIMENSION, 0);
  int rc = need(f, ins, ins->shape.rank == 0 || (d >= 0 && d < ins->shape.rank),
                "iota_dimension out of range");
  if (rc) return rc;
  char src[KILN__IX_LEN + 16], e[256];
  snprintf(src, sizeof src, "(int64_t)%s", ins->shape.rank ? kiln__ix_get(f, x, (uint32_t)d) : "0");
  if ((rc = kiln__emit_convert_expr(f, ins, src, KILN_S64, ins->shape.dtype, e, sizeof e)))
    return rc;
  *var = kiln__emit_newvar(f);
  kiln__emit_line(f, "%s v%u = %s;", kiln__ctype(f->mod, ins->shape.dtype), *var, e);
  return 0;
}

/* An integer value (variable v of type t) as an int64 index expression,
 * unsigned values past INT64_MAX saturating as the interpreter reads them. */
static void as_index(uint32_t v, kiln_dtype t, char *dst, size_t n) {
  if (t == KILN_U64)
    snprintf(dst, n, "(v%u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v%u)", v, v);
  else
    snprintf(dst, n, "(int64_t)v%u", v);
}

/* Start index k of a dynamic-slice/update: operand first+k (scalars) or
 * element k of one vector operand; clamped to [0, hi]. */
static int start_index(kiln__emit_fn *f, const kiln_instr *ins, uint32_t first, uint32_t rank,
                       uint32_t k, int64_t hi, char dst[KILN__IX_LEN]) {
  uint32_t nidx = ins->noperands - first, v;
  kiln__ix s0 = {0}, vk;
  int rc;
  const kiln_instr *src;
  if (nidx == 1 && rank != 1 && opnd(f, ins, first)->shape.rank == 1) {
    src = opnd(f, ins, first);
    if ((rc = kiln__ix_new(f, 1, &vk))) return rc;
    kiln__ix_set(&vk, 0, "%u", k);
    rc = kiln__emit_value1(f, src->id, &vk, &v);
  } else {
    if ((rc = need(f, ins, nidx == rank, "needs one start index per dim"))) return rc;
    src = opnd(f, ins, first + k);
    rc = kiln__emit_value1(f, src->id, &s0, &v);
  }
  if (rc) return rc;
  if ((rc = need(f, ins, kiln_dtype_is_integral(src->shape.dtype),
                 "start indices must be integers")))
    return rc;
  char e[128];
  as_index(v, src->shape.dtype, e, sizeof e);
  kiln__ix_var(f, dst, "kclampi(%s, %lld)", e, (long long)hi);
  return 0;
}

static int dynamic_slice(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x,
                         uint32_t *var) {
  const kiln_instr *a = opnd(f, ins, 0);
  uint32_t r = a->shape.rank;
  kiln__ix y;
  int rc = need(f, ins, ins->shape.rank == r, "result rank differs from the operand's");
  if (rc || (rc = kiln__ix_new(f, r, &y))) return rc;
  for (uint32_t d = 0; d < r; d++) {
    char s[KILN__IX_LEN];
    int64_t hi = a->shape.dims[d] - ins->shape.dims[d];
    if ((rc = need(f, ins, hi >= 0, "slice larger than the operand"))) return rc;
    if ((rc = start_index(f, ins, 1, r, d, hi, s))) return rc;
    kiln__ix_set(&y, d, "(%s + %s)", s, kiln__ix_get(f, x, d));
  }
  return forward(f, ins, 0, &y, var);
}

/* Declares "T v<N>;" for a value assigned in branches. */
static uint32_t declare(kiln__emit_fn *f, kiln_dtype t) {
  uint32_t v = kiln__emit_newvar(f);
  kiln__emit_line(f, "%s v%u;", kiln__ctype(f->mod, t), v);
  return v;
}

static int dynamic_update_slice(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x,
                                uint32_t *var) {
  const kiln_instr *a = opnd(f, ins, 0), *u = opnd(f, ins, 1);
  uint32_t r = a->shape.rank;
  char st[KILN__EMIT_MAXR][KILN__IX_LEN];
  int rc = need(f, ins, u->shape.rank == r, "update rank differs from the operand's");
  for (uint32_t d = 0; rc == 0 && d < r; d++) {
    int64_t hi = a->shape.dims[d] - u->shape.dims[d];
    rc = need(f, ins, hi >= 0, "update larger than the operand");
    if (rc == 0) rc = start_index(f, ins, 2, r, d, hi, st[d]);
  }
  if (rc) return rc;
  kiln_sbuf cond = KILN_SBUF_INIT;
  kiln__ix y;
  if ((rc = kiln__ix_new(f, r, &y))) return rc;
  for (uint32_t d = 0; d < r; d++) {
    char rel[KILN__IX_LEN];
    kiln__ix_var(f, rel, "%s - %s", kiln__ix_get(f, x, d), st[d]);
    kiln__ix_set(&y, d, "%s", rel);
    kiln_sbuf_printf(&cond, "%s(uint64_t)%s < %lluu", d ? " && " : "", rel,
                     (unsigned long long)u->shape.dims[d]);
  }
  *var = declare(f, ins->shape.dtype);
  uint32_t v, mark = kiln__emit_open(f, "if (%s)", r ? kiln_sbuf_str(&cond) : "1");
  kiln_sbuf_free(&cond);
  if ((rc = forward(f, ins, 1, &y, &v))) return rc;
  kiln__emit_line(f, "v%u = v%u;", *var, v);
  kiln__emit_close(f, mark, NULL);
  mark = kiln__emit_open(f, "else");
  if ((rc = forward(f, ins, 0, x, &v))) return rc;
  kiln__emit_line(f, "v%u = v%u;", *var, v);
  kiln__emit_close(f, mark, NULL);
  return 0;
}

static int concatenate(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  const kiln_i64s *dl = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  int rc = need(f, ins, dl && dl->n == 1 && dl->v[0] >= 0 && dl->v[0] < ins->shape.rank,
                "needs one dimension");
  if (rc) return rc;
  uint32_t d = (uint32_t)dl->v[0];
  const char *c = kiln__ix_get(f, x, d);
  *var = declare(f, ins->shape.dtype);
  int64_t at = 0;
  for (uint32_t j = 0; j < ins->noperands; j++) {
    int64_t len = opnd(f, ins, j)->shape.dims[d];
    bool last = j + 1 == ins->noperands;
    uint32_t mark =
        last ? kiln__emit_open(f, j ? "else" : "")
             : kiln__emit_open(f, "%sif (%s < %lld)", j ? "else " : "", c, (long long)(at + len));
    kiln__ix y;
    uint32_t v;
    if ((rc = kiln__ix_new(f, x->rank, &y))) return rc;
    for (uint32_t k = 0; k < x->rank; k++)
      kiln__ix_set(&y, k, k == d && at ? "(%s - %lld)" : "%s", kiln__ix_get(f, x, k),
                   (long long)at);
    if ((rc = forward(f, ins, j, &y, &v))) return rc;
    kiln__emit_line(f, "v%u = v%u;", *var, v);
    kiln__emit_close(f, mark, NULL);
    at += len;
  }
  return 0;
}

static int pad(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  const kiln_instr *a = opnd(f, ins, 0);
  const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_PADDING);
  uint32_t r = a->shape.rank;
  int rc = need(f, ins, (p ? p->n : 0) == 3 * r || r == 0, "padding needs one entry per dim");
  if (rc) return rc;
  uint32_t pv;
  kiln__ix s0 = {0}, y;
  if ((rc = forward(f, ins, 1, &s0, &pv))) return rc;
  if ((rc = kiln__ix_new(f, r, &y))) return rc;
  kiln_sbuf cond = KILN_SBUF_INIT;
  for (uint32_t d = 0; d < r; d++) {
    long long lo = p->v[3 * d], in = p->v[3 * d + 2] + 1, dim = a->shape.dims[d];
    char t[KILN__IX_LEN];
    if (lo)
      kiln__ix_var(f, t, "%s - %lld", kiln__ix_get(f, x, d), lo);
    else
      snprintf(t, sizeof t, "%s", kiln__ix_get(f, x, d));
    if (in == 1) {
      kiln__ix_set(&y, d, "%s", t);
      kiln_sbuf_printf(&cond, "%s(uint64_t)%s < %lluu", cond.len ? " && " : "", t,
                       (unsigned long long)dim);
    } else {
      kiln__ix_set(&y, d, "(%s / %lld)", t, in);
      kiln_sbuf_printf(&cond, "%s%s >= 0 && %s %% %lld == 0 && %s / %lld < %lld",
                       cond.len ? " && " : "", t, t, in, t, in, dim);
    }
  }
  *var = kiln__emit_newvar(f);
  kiln__emit_line(f, "%s v%u = v%u;", kiln__ctype(f->mod, ins->shape.dtype), *var, pv);
  uint32_t v, mark = kiln__emit_open(f, "if (%s)", cond.len ? kiln_sbuf_str(&cond) : "1");
  kiln_sbuf_free(&cond);
  if ((rc = forward(f, ins, 0, &y, &v))) return rc;
  kiln__emit_line(f, "v%u = v%u;", *var, v);
  kiln__emit_close(f, mark, NULL);
  return 0;
}

static bool has(const kiln_i64s *l, int64_t v) {
  for (uint32_t i = 0; l && i < l->n; i++)
    if (l->v[i] == v) return true;
  return false;
}

static const kiln_i64s *ints(const kiln_instr *ins, kiln_attr_key k) {
  static const kiln_i64s none = {NULL, 0};
  const kiln_i64s *l = kiln_instr_attr_ints(ins, k);
  return l ? l : &none;
}

/* Reads start index component k of the index vector at batch position
 * given by result components (the dims of x that are not offset dims). */
static int gather_start(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x,
                        const uint32_t *bdims, int64_t ivd, uint32_t k, uint32_t *v) {
  const kiln_instr *ind = opnd(f, ins, 1);
  kiln__ix y;
  int rc = kiln__ix_new(f, ind->shape.rank, &y);
  if (rc) return rc;
  for (uint32_t d = 0, j = 0; d < ind->shape.rank; d++) {
    if ((int64_t)d == ivd)
      kiln__ix_set(&y, d, "%u", k);
    else
      kiln__ix_set(&y, d, "%s", kiln__ix_get(f, x, bdims[j++]));
  }
  return kiln__emit_value1(f, ind->id, &y, v);
}

static int gather(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  const kiln_instr *a = opnd(f, ins, 0), *ind = opnd(f, ins, 1);
  uint32_t ar = a->shape.rank, orank = ins->shape.rank;
  const kiln_i64s *offd = ints(ins, KILN_ATTR_OFFSET_DIMS),
                  *coll = ints(ins, KILN_ATTR_COLLAPSED_SLICE_DIMS);
  const kiln_i64s *map = ints(ins, KILN_ATTR_START_INDEX_MAP),
                  *sizes = ints(ins, KILN_ATTR_SLICE_SIZES);
  const kiln_i64s *obatch = ints(ins, KILN_ATTR_OPERAND_BATCHING_DIMS);
  const kiln_i64s *ibatch = ints(ins, KILN_ATTR_START_INDICES_BATCHING_DIMS);
  int64_t ivd = kiln_instr_attr_int(ins, KILN_ATTR_INDEX_VECTOR_DIM, ind->shape.rank);
  int rc = need(
      f, ins, sizes->n == ar && kiln_dtype_is_integral(ind->shape.dtype) && obatch->n == ibatch->n,
      "malformed gather");
  if (rc) return rc;
  uint32_t bdims[KILN__EMIT_MAXR], nb = 0;
  for (uint32_t d = 0; d < orank; d++)
    if (!has(offd, d)) bdims[nb++] = d;
  char st[KILN__EMIT_MAXR][KILN__IX_LEN];
  for (uint32_t d = 0; d < ar; d++) snprintf(st[d], KILN__IX_LEN, "0");
  for (uint32_t k = 0; k < map->n; k++) {
    uint32_t v;
    if ((rc = need(f, ins, map->v[k] >= 0 && map->v[k] < ar, "start_index_map out of range")))
      return rc;
    if ((rc = gather_start(f, ins, x, bdims, ivd, k, &v))) return rc;
    char e[128];
    as_index(v, ind->shape.dtype, e, sizeof e);
    kiln__ix_var(f, st[map->v[k]], "%s", e);
  }
  for (uint32_t k = 0; k < obatch->n; k++) {
    int64_t b = ibatch->v[k];
    if ((rc = need(f, ins, b >= 0 && b != ivd && obatch->v[k] >= 0 && obatch->v[k] < ar,
                   "batching dims out of range")))
      return rc;
    snprintf(st[obatch->v[k]], KILN__IX_LEN, "%s", kiln__ix_get(f, x, bdims[b < ivd ? b : b - 1]));
  }
  kiln__ix y;
  if ((rc = kiln__ix_new(f, ar, &y))) return rc;
  for (uint32_t d = 0, j = 0; d < ar; d++) {
    char c[KILN__IX_LEN];
    kiln__ix_var(f, c, "kclampi(%s, %lld)", st[d], (long long)(a->shape.dims[d] - sizes->v[d]));
    if (has(coll, d) || has(obatch, d)) {
      kiln__ix_set(&y, d, "%s", c);
      continue;
    }
    if ((rc = need(f, ins, j < offd->n && offd->v[j] >= 0 && offd->v[j] < orank, "offset dims")))
      return rc;
    kiln__ix_set(&y, d, "(%s + %s)", c, kiln__ix_get(f, x, (uint32_t)offd->v[j++]));
  }
  return forward(f, ins, 0, &y, var);
}

static int bitcast_convert(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x,
                           uint32_t *var) {
  const kiln_instr *a = opnd(f, ins, 0);
  if (kiln_dtype_bits(a->shape.dtype) != kiln_dtype_bits(ins->shape.dtype))
    return kiln__emit_fail(f, ins, KILN_EUNIMPL,
                           "the %s backend cannot compile bitcast-convert %s between widths "
                           "%d and %d yet",
                           f->mod->target->name, ins->name, kiln_dtype_bits(a->shape.dtype),
                           kiln_dtype_bits(ins->shape.dtype));
  return kiln__emit_elementwise(f, ins, x, var);
}

int kiln__emit_movement(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  if (!kiln_shape_is_array(&ins->shape))
    return kiln__emit_fail(f, ins, KILN_EUNIMPL, "the %s backend cannot compile tuple-shaped %s %s",
                           f->mod->target->name, kiln_opcode_name(ins->op), ins->name);
  switch (ins->op) {
  case KILN_OP_BROADCAST: return broadcast(f, ins, x, var);
  case KILN_OP_RESHAPE: return reshape(f, ins, x, var);
  case KILN_OP_TRANSPOSE: return transpose(f, ins, x, var);
  case KILN_OP_BITCAST: return bitcast(f, ins, x, var);
  case KILN_OP_SLICE: return slice(f, ins, x, var);
  case KILN_OP_REVERSE: return reverse(f, ins, x, var);
  case KILN_OP_IOTA: return iota(f, ins, x, var);
  case KILN_OP_DYNAMIC_SLICE: return dynamic_slice(f, ins, x, var);
  case KILN_OP_DYNAMIC_UPDATE_SLICE: return dynamic_update_slice(f, ins, x, var);
  case KILN_OP_CONCATENATE: return concatenate(f, ins, x, var);
  case KILN_OP_PAD: return pad(f, ins, x, var);
  case KILN_OP_GATHER: return gather(f, ins, x, var);
  case KILN_OP_BITCAST_CONVERT: return bitcast_convert(f, ins, x, var);
  case KILN_OP_OPTIMIZATION_BARRIER: return forward(f, ins, 0, x, var);
  case KILN_OP_REPLICA_ID:
  case KILN_OP_PARTITION_ID:
    *var = kiln__emit_newvar(f);
    kiln__emit_line(f, "%s v%u = 0;", kiln__ctype(f->mod, ins->shape.dtype), *var);
    return 0;
  default: break;
  }
  return kiln__emit_fail(f, ins, KILN_EUNIMPL, "the %s backend cannot compile %s %s yet",
                         f->mod->target->name, kiln_opcode_name(ins->op), ins->name);
}

int kiln__emit_dus_target(kiln__emit_fn *f, const kiln_instr *dus, const kiln__ix *u, uint32_t *var,
                          kiln__ix *target) {
  const kiln_instr *a = opnd(f, dus, 0), *up = opnd(f, dus, 1);
  uint32_t r = a->shape.rank;
  int rc =
      need(f, dus, up->shape.rank == r && u->rank == r, "update rank differs from the operand's");
  if (rc == 0) rc = kiln__ix_new(f, r, target);
  for (uint32_t d = 0; rc == 0 && d < r; d++) {
    char st[KILN__IX_LEN];
    int64_t hi = a->shape.dims[d] - up->shape.dims[d];
    rc = need(f, dus, hi >= 0, "update larger than the operand");
    if (rc == 0) rc = start_index(f, dus, 2, r, d, hi, st);
    if (rc == 0) kiln__ix_set(target, d, "(%s + %s)", st, kiln__ix_get(f, u, d));
  }
  if (rc) return rc;
  return forward(f, dus, 1, u, var);
}
