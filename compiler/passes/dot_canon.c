/* Dot canonicalization: rewrites every floating-point dot into a (batched)
 * matrix product that code generation runs as one GEMM step, whatever its
 * dimension numbers and operand layouts.
 *
 * The canonical dot reads lhs as [batch..., M, K] or [batch..., K, M] and
 * rhs as [batch..., K, N] or [batch..., N, K] (batch dims leading, in the
 * order lhs lists them; M, N, K each one dim: the free dims of a side
 * merged, in ascending order as the result lists them, and the contracting
 * dims merged, in one order both sides share) and writes
 * [batch..., M, N]. For each side:
 *  - the dims are permuted into that order by a `transpose`, omitted when
 *    the operand already is in it; the choice between the two orders, and
 *    the order of the contracting pairs, follow the operand's physical
 *    layout where it can, so that the transpose is a pure relabelling
 *    (layout turns it into a bitcast) and the GEMM runs with a transpose
 *    flag instead of a copy. Otherwise the transpose is a copy, which
 *    fusion may merge into the operand's producer;
 *  - several free or contracting dims (or none) become one by a
 *    row-major `reshape` (a bitcast after layout);
 *  - bf16 and f16 operands are converted to f32, and the product
 *    accumulates in f32 (as XLA's CPU backend does); the result is
 *    converted back to the dot's type. On the cpu target with oneDNN a dot
 *    of two bf16 operands keeps them bf16 (bf16_gemm): its f32 product is
 *    one bf16 GEMM step (exact products, f32 sums), converted back after.
 * The result is reshaped back to the dot's dims. An 8-bit integer dot
 * on the cpu target with an s8 or u8 lhs, an s8 rhs and an s32 result
 * becomes an integer GEMM in the GEMM form, its operands in their own types
 * (int8_gemm); another whose sums stay below 2^24 is exact as an f32 GEMM
 * and becomes one (exact_in_f32). Other integer dots stay loop kernels (no BLAS for them) but get
 * the same form with K minor on both sides, [batch..., M, K] x [batch..., N, K], so that each
 * result element is one contiguous inner product the C compiler vectorizes. A dot that already has
 * its form (one free dim or none per side, one contracting dim, batch dims physically major, f32 or
 * f64, or K minor for integers) is left alone, as are dots of other types (f8, complex, mixed),
 * dynamic shapes and empty arrays, and fused computations (already past this point). */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/passes.h"

#define MAXR 32

typedef struct side {
  const kiln_instr *op;
  const kiln_i64s *b, *c;
  uint32_t rank, nb, nc, nf;
  int64_t free[MAXR]; /* free dims, ascending */
  int64_t phys[MAXR]; /* logical dims, physically major to minor */
} side;

typedef struct plan {
  uint32_t ord[MAXR]; /* contracting pairs in this order */
  int64_t q[2][MAXR]; /* per side: the transposed order of its dims */
  bool fc[2];         /* per side: free group before contracting group */
  bool copy[2];       /* per side: the transpose moves bytes */
} plan;

static int oom(const kiln_pass_ctx *ctx) {
  return kiln_status_set(ctx->st, KILN_ENOMEM, "dot_canon", "out of memory");
}

/* Fills s for operand `op` with batch dims b and contracting dims c;
 * false when the numbers are out of range or repeat. */
static bool side_init(side *s, const kiln_instr *op, const kiln_i64s *b, const kiln_i64s *c) {
  const kiln_shape *sh = &op->shape;
  s->op = op;
  s->b = b;
  s->c = c;
  s->rank = sh->rank;
  s->nb = b ? b->n : 0;
  s->nc = c ? c->n : 0;
  if (sh->rank > MAXR || s->nb + s->nc > sh->rank) return false;
  bool seen[MAXR] = {false};
  for (uint32_t i = 0; i < s->nb + s->nc; i++) {
    int64_t d = i < s->nb ? b->v[i] : c->v[i - s->nb];
    if (d < 0 || d >= sh->rank || seen[d]) return false;
    seen[d] = true;
  }
  s->nf = 0;
  for (uint32_t d = 0; d < sh->rank; d++)
    if (!seen[d]) s->free[s->nf++] = d;
  int64_t m2m[MAXR];
  kiln_shape_minor_to_major(sh, m2m);
  for (uint32_t k = 0; k < sh->rank; k++) s->phys[k] = m2m[sh->rank - 1 - k];
  return true;
}

/* The order of side s's dims for contracting order ord, free group first
 * or not. */
static void side_order(const side *s, const uint32_t *ord, bool free_first, int64_t *q) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->nb; i++) q[n++] = s->b->v[i];
  for (uint32_t g = 0; g < 2; g++) {
    if ((g == 0) == free_first)
      for (uint32_t i = 0; i < s->nf; i++) q[n++] = s->free[i];
    else
      for (uint32_t i = 0; i < s->nc; i++) q[n++] = s->c->v[ord[i]];
  }
}

/* Picks the group order of side s for ord: the one its physical order
 * already is, if any (no copy), else the one that keeps its minor dim
 * minor, else the default; `strict` accepts only the default. */
static void side_pick(const side *s, const uint32_t *ord, bool dflt_free_first, bool strict,
                      int64_t *q, bool *fc, bool *copy) {
  for (uint32_t t = 0; t < (strict ? 1u : 2u); t++) {
    bool ff = t == 0 ? dflt_free_first : !dflt_free_first;
    side_order(s, ord, ff, q);
    if (memcmp(q, s->phys, s->rank * sizeof *q) == 0) {
      *fc = ff;
      *copy = false;
      return;
    }
  }
  /* A copy either way: the order that keeps the physically minor dim
   * minor, when only one does, moves whole runs of elements instead of
   * single ones (the GEMM then reads its operand with a transpose flag). */
  bool ff = dflt_free_first;
  if (!strict) {
    int64_t alt[MAXR];
    side_order(s, ord, !ff, alt);
    side_order(s, ord, ff, q);
    int64_t minor = s->phys[s->rank - 1];
    if (q[s->rank - 1] != minor && alt[s->rank - 1] == minor) ff = !ff;
  }
  side_order(s, ord, ff, q);
  *fc = ff;
  *copy = true;
}

/* Contracting pairs sorted by where side s stores its dims. */
static void order_by(const side *s, uint32_t *ord) {
  uint32_t n = 0;
  for (uint32_t k = 0; k < s->rank; k++)
    for (uint32_t i = 0; i < s->nc; i++)
      if (s->c->v[i] == s->phys[k] && n < s->nc) ord[n++] = i;
  if (n != s->nc) /* not a permutation (the verifier refuses such layouts) */
    for (uint32_t i = 0; i < s->nc; i++) ord[i] = i;
}

/* `loop`: the dot stays a loop kernel (integers), which vectorizes when
 * both sides keep K minor ([M, K] and [N, K]); a GEMM takes either order. */
static void make_plan(const side *l, const side *r, bool loop, plan *p) {
  uint32_t cand[3][MAXR];
  for (uint32_t i = 0; i < l->nc; i++) cand[0][i] = i;
  order_by(l, cand[1]);
  order_by(r, cand[2]);
  int best = -1;
  for (uint32_t k = 0; k < 3; k++) {
    plan t;
    memcpy(t.ord, cand[k], l->nc * sizeof *t.ord);
    side_pick(l, t.ord, true, loop, t.q[0], &t.fc[0], &t.copy[0]);
    side_pick(r, t.ord, loop, loop, t.q[1], &t.fc[1], &t.copy[1]);
    int cost = t.copy[0] + t.copy[1];
    if (best < 0 || cost < best) {
      best = cost;
      *p = t;
    }
  }
}

static bool is_identity(const int64_t *q, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    if (q[i] != (int64_t)i) return false;
  return true;
}

static kiln_instr *add(kiln_module *m, uint32_t comp, kiln_opcode op, const kiln_instr *d,
                       const char *what) {
  char buf[160];
  snprintf(buf, sizeof buf, "%.100s.%s.%u", d->name, what, (unsigned)m->ninstrs);
  return kiln_module_add_instr(m, comp, op, buf);
}

static bool same_ints(const kiln_i64s *a, const int64_t *v, uint32_t n) {
  uint32_t an = a ? a->n : 0;
  if (v == NULL) n = 0;
  return an == n && (n == 0 || memcmp(a->v, v, n * sizeof *v) == 0);
}

/* Instruction `op` of operand x with dtype t and dims (layout `lay`, or
 * none; permutation `perm` for a transpose): one this pass already made
 * in comp (ids from `first` on) when it has all of these, so that the dots
 * reading one value share its reshapes and copies, else a new one. */
static kiln_id unary(kiln_module *m, uint32_t comp, kiln_id first, kiln_opcode op,
                     const kiln_instr *d, const char *what, kiln_id x, kiln_dtype t,
                     const int64_t *dims, uint32_t rank, const kiln_layout *lay,
                     const int64_t *perm) {
  kiln_shape s;
  if (kiln_shape_make_array(m->arena, &s, t, dims, rank)) return KILN_NO_ID;
  s.layout = (kiln_layout *)lay;
  const kiln_computation *c = m->comps[comp];
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *u = m->instrs[c->instrs[i]];
    if (u->id < first || u->op != op || u->noperands != 1 || u->operands[0] != x ||
        !kiln_shape_equal(&u->shape, &s, false) || (lay == NULL) != (u->shape.layout == NULL) ||
        (lay && !kiln_shape_equal(&u->shape, &s, true)))
      continue;
    if (op == KILN_OP_TRANSPOSE &&
        !same_ints(kiln_instr_attr_ints(u, KILN_ATTR_DIMENSIONS), perm, rank))
      continue;
    return u->id;
  }
  kiln_instr *u = add(m, comp, op, d, what);
  if (u == NULL || kiln_instr_set_operands(m, u, &x, 1) || kiln_instr_set_shape(m, u, &s))
    return KILN_NO_ID;
  if (perm && kiln_instr_set_attr_ints(m, u, KILN_ATTR_DIMENSIONS, perm, rank)) return KILN_NO_ID;
  return u->id;
}

/* The row-major layout of a rank-r array, in m's arena (NULL: no memory). */
static const kiln_layout *row_major(kiln_module *m, uint32_t r) {
  kiln_layout *lay = kiln_arena_calloc(m->arena, 1, sizeof *lay);
  int64_t *v = kiln_arena_alloc(m->arena, (r ? r : 1) * sizeof *v);
  if (lay == NULL || v == NULL) return NULL;
  for (uint32_t i = 0; i < r; i++) v[i] = (int64_t)r - 1 - i;
  lay->minor_to_major = v;
  lay->rank = r;
  return lay;
}

/* The canonical operand of side k; fills its batch and contracting dims
 * in the new dot and the size of its free group (1 when none). */
static int side_build(kiln_module *m, uint32_t comp, kiln_id first, const kiln_instr *d,
                      const side *s, const plan *p, uint32_t k, kiln_dtype t, kiln_id *out,
                      int64_t *nb_dims, int64_t *cdim, int64_t *fsize) {
  const kiln_shape *sh = &s->op->shape;
  kiln_id x = s->op->id;
  if (sh->dtype != t) {
    /* Elementwise: keeps the operand's layout, so p's choice still holds. */
    x = unary(m, comp, first, KILN_OP_CONVERT, d, "f32", x, t, sh->dims, sh->rank, sh->layout,
              NULL);
    if (x == KILN_NO_ID) return KILN_ENOMEM;
  }
  int64_t csize = 1;
  *fsize = 1;
  for (uint32_t i = 0; i < s->nc; i++) csize *= sh->dims[s->c->v[i]];
  for (uint32_t i = 0; i < s->nf; i++) *fsize *= sh->dims[s->free[i]];
  bool reshape = s->nc != 1 || s->nf > 1;
  if (!reshape && !p->copy[k]) {
    /* Already a matrix the GEMM reads as it is stored. */
    for (uint32_t i = 0; i < s->nb; i++) nb_dims[i] = s->b->v[i];
    *cdim = s->c->v[0];
    *out = x;
    return 0;
  }
  const int64_t *q = p->q[k];
  int64_t dims[MAXR];
  if (!is_identity(q, s->rank)) {
    for (uint32_t i = 0; i < s->rank; i++) dims[i] = sh->dims[q[i]];
    x = unary(m, comp, first, KILN_OP_TRANSPOSE, d, "transpose", x, t, dims, s->rank, NULL, q);
    if (x == KILN_NO_ID) return KILN_ENOMEM;
  } else if (p->copy[k]) {
    /* The logical order is right but the bytes are not (a layout written
     * in the input): a copy into row-major, which layout keeps. */
    const kiln_layout *rm = row_major(m, s->rank);
    x = rm ? unary(m, comp, first, KILN_OP_COPY, d, "copy", x, t, sh->dims, s->rank, rm, NULL)
           : KILN_NO_ID;
    if (x == KILN_NO_ID) return KILN_ENOMEM;
  }
  for (uint32_t i = 0; i < s->nb; i++) {
    dims[i] = sh->dims[s->b->v[i]];
    nb_dims[i] = i;
  }
  uint32_t n = s->nb;
  bool ff = p->fc[k];
  if (ff && s->nf) dims[n++] = *fsize;
  *cdim = n;
  dims[n++] = csize;
  if (!ff && s->nf) dims[n++] = *fsize;
  if (reshape) {
    x = unary(m, comp, first, KILN_OP_RESHAPE, d, "reshape", x, t, dims, n, NULL, NULL);
    if (x == KILN_NO_ID) return KILN_ENOMEM;
  }
  *out = x;
  return 0;
}

/* The type the GEMM runs in (an integer dot: its own type, for the loop
 * kernel), or KILN_INVALID to leave d alone. */
static kiln_dtype gemm_type(kiln_dtype l, kiln_dtype r, kiln_dtype o) {
  if (l == KILN_F64 && r == KILN_F64 && o == KILN_F64) return KILN_F64;
  if (l == o && r == o && (kiln_dtype_is_signed_int(o) || kiln_dtype_is_unsigned_int(o))) return o;
  bool lf = l == KILN_F32 || l == KILN_BF16 || l == KILN_F16;
  bool rf = r == KILN_F32 || r == KILN_BF16 || r == KILN_F16;
  bool of = o == KILN_F32 || o == KILN_BF16 || o == KILN_F16;
  return lf && rf && of ? KILN_F32 : KILN_INVALID;
}

/* An integer dot of 8-bit operands whose every partial sum is an integer
 * below 2^24 in magnitude (contracted length x largest |product|) is
 * computed exactly by an f32 GEMM: each product and sum is representable,
 * so the result is the integer one bit for bit, in any order, and the dot
 * runs at BLAS speed instead of as an integer loop (int8-quantized
 * matmuls). The result must hold it without wrapping: s32 or s64, or
 * u32/u64 when no operand is signed (a negative operand would wrap there). */
static bool exact_in_f32(const kiln_instr *d, const kiln_shape *a, const kiln_shape *b) {
  kiln_dtype o = d->shape.dtype;
  bool la = a->dtype == KILN_S8 || a->dtype == KILN_U8,
       lb = b->dtype == KILN_S8 || b->dtype == KILN_U8;
  bool sig = a->dtype == KILN_S8 || b->dtype == KILN_S8;
  if (!la || !lb) return false;
  if (!(o == KILN_S32 || o == KILN_S64 || (!sig && (o == KILN_U32 || o == KILN_U64)))) return false;
  const kiln_i64s *c = kiln_instr_attr_ints(d, KILN_ATTR_LHS_CONTRACTING_DIMS);
  double k = 1;
  for (uint32_t i = 0; c && i < c->n; i++) {
    if (c->v[i] < 0 || c->v[i] >= a->rank) return false;
    k *= (double)a->dims[c->v[i]];
  }
  double ma = a->dtype == KILN_S8 ? 128 : 255, mb = b->dtype == KILN_S8 ? 128 : 255;
  return k * ma * mb <= 16777216.0;
}

/* An 8-bit dot the cpu backend runs as one integer GEMM (oneDNN's int8
 * matmul, s32 accumulation: VNNI on AVX-512; builds with oneDNN only):
 * lhs s8 or u8, rhs s8, s32 result. It takes the GEMM form (either order per side, transpose flags
 * instead of copies) with the operands kept in their types. The result
 * wraps as the s32 sum does, whatever K is. */
static bool int8_gemm(const kiln_pass_ctx *ctx, const kiln_instr *d, const kiln_shape *a,
                      const kiln_shape *b) {
#ifdef KILN_HAVE_DNNL
  const kiln_target *tg = ctx->target ? ctx->target : kiln_target_default();
  return tg && tg->backend && strcmp(tg->backend, "cpu") == 0 && d->shape.dtype == KILN_S32 &&
         (a->dtype == KILN_S8 || a->dtype == KILN_U8) && b->dtype == KILN_S8;
#else
  (void)ctx, (void)d, (void)a, (void)b;
  return false;
#endif
}

/* A dot of two bf16 operands into bf16 or f32 that the cpu backend runs as
 * one bf16 GEMM (oneDNN's bf16 matmul, f32 accumulation; builds with
 * oneDNN only, widened to an f32 GEMM at run time where it cannot run):
 * the operands stay bf16, half the bytes, and the product is f32. */
static bool bf16_gemm(const kiln_pass_ctx *ctx, const kiln_instr *d, const kiln_shape *a,
                      const kiln_shape *b) {
#ifdef KILN_HAVE_DNNL
  const kiln_target *tg = ctx->target ? ctx->target : kiln_target_default();
  kiln_dtype o = d->shape.dtype;
  return tg && tg->backend && strcmp(tg->backend, "cpu") == 0 && a->dtype == KILN_BF16 &&
         b->dtype == KILN_BF16 && (o == KILN_BF16 || o == KILN_F32);
#else
  (void)ctx, (void)d, (void)a, (void)b;
  return false;
#endif
}

static bool usable(const kiln_shape *s) {
  return kiln_shape_is_array(s) && !kiln_shape_is_dynamic(s) && s->rank <= MAXR &&
         kiln_shape_elements(s) > 0;
}

/* Rewrites dot d of computation comp; *done says whether it did. */
static int canon_dot(kiln_module *m, const kiln_pass_ctx *ctx, uint32_t comp, kiln_id first,
                     kiln_instr *d, bool *done) {
  *done = false;
  if (d->noperands != 2 || d->ncontrol || !usable(&d->shape)) return 0;
  const kiln_instr *a = m->instrs[d->operands[0]], *b = m->instrs[d->operands[1]];
  if (!usable(&a->shape) || !usable(&b->shape)) return 0;
  kiln_dtype t = gemm_type(a->shape.dtype, b->shape.dtype, d->shape.dtype);
  bool i8 = int8_gemm(ctx, d, &a->shape, &b->shape);
  bool bf = !i8 && bf16_gemm(ctx, d, &a->shape, &b->shape);
  if (i8)
    t = KILN_S32;
  else if (exact_in_f32(d, &a->shape, &b->shape))
    t = KILN_F32;
  if (t == KILN_INVALID) return 0;
  /* The type each operand is read in: t, or its own for an int8 or bf16 GEMM. */
  kiln_dtype ta = i8 || bf ? a->shape.dtype : t, tb = i8 || bf ? b->shape.dtype : t;
  side l, r;
  if (!side_init(&l, a, kiln_instr_attr_ints(d, KILN_ATTR_LHS_BATCH_DIMS),
                 kiln_instr_attr_ints(d, KILN_ATTR_LHS_CONTRACTING_DIMS)) ||
      !side_init(&r, b, kiln_instr_attr_ints(d, KILN_ATTR_RHS_BATCH_DIMS),
                 kiln_instr_attr_ints(d, KILN_ATTR_RHS_CONTRACTING_DIMS)) ||
      l.nb != r.nb || l.nc != r.nc || d->shape.rank != l.nb + l.nf + r.nf)
    return 0;
  plan p;
  bool loop = t != KILN_F32 && t != KILN_F64 && !i8;
  make_plan(&l, &r, loop, &p);
  bool same_type = a->shape.dtype == ta && b->shape.dtype == tb && d->shape.dtype == t;
  if (same_type && l.nc == 1 && l.nf <= 1 && r.nf <= 1 && !p.copy[0] && !p.copy[1])
    return 0; /* a GEMM already */
  kiln_id ops[2];
  int64_t lb[MAXR], rb[MAXR], lc, rc, mdim, ndim;
  int err = side_build(m, comp, first, d, &l, &p, 0, ta, &ops[0], lb, &lc, &mdim);
  if (err == 0) err = side_build(m, comp, first, d, &r, &p, 1, tb, &ops[1], rb, &rc, &ndim);
  if (err) return err;
  /* The product: [batch..., M?, N?]. */
  int64_t dims[MAXR];
  uint32_t n = 0;
  for (uint32_t i = 0; i < l.nb; i++) dims[n++] = a->shape.dims[l.b->v[i]];
  if (l.nf) dims[n++] = mdim;
  if (r.nf) dims[n++] = ndim;
  bool same_dims =
      n == d->shape.rank && (n == 0 || memcmp(dims, d->shape.dims, n * sizeof *dims) == 0);
  kiln_instr *g = kiln_instr_clone(m, comp, d, ops, 2, NULL, NULL);
  kiln_shape gs;
  if (g == NULL || kiln_shape_make_array(m->arena, &gs, t, dims, n)) return KILN_ENOMEM;
  if (same_dims) gs.layout = d->shape.layout;
  char buf[160];
  snprintf(buf, sizeof buf, "%.100s.gemm.%u", d->name, (unsigned)g->id);
  g->name = kiln_arena_strdup(m->arena, buf);
  if (g->name == NULL || kiln_instr_set_shape(m, g, &gs) ||
      (l.nb && kiln_instr_set_attr_ints(m, g, KILN_ATTR_LHS_BATCH_DIMS, lb, l.nb)) ||
      (r.nb && kiln_instr_set_attr_ints(m, g, KILN_ATTR_RHS_BATCH_DIMS, rb, r.nb)) ||
      kiln_instr_set_attr_ints(m, g, KILN_ATTR_LHS_CONTRACTING_DIMS, &lc, 1) ||
      kiln_instr_set_attr_ints(m, g, KILN_ATTR_RHS_CONTRACTING_DIMS, &rc, 1))
    return KILN_ENOMEM;
  if (!same_dims) { /* a sharding describes the old dims: the reshape's users keep theirs */
    uint32_t k = 0;
    for (uint32_t i = 0; i < g->nattrs; i++)
      if (g->attrs[i].key != KILN_ATTR_SHARDING) g->attrs[k++] = g->attrs[i];
    g->nattrs = k;
  }
  kiln_id y = g->id;
  const kiln_shape *ds = &d->shape;
  if (!same_dims) {
    const kiln_layout *lay = ds->dtype == t ? ds->layout : NULL;
    y = unary(m, comp, first, KILN_OP_RESHAPE, d, "reshape", y, t, ds->dims, ds->rank, lay, NULL);
    if (y == KILN_NO_ID) return KILN_ENOMEM;
  }
  if (ds->dtype != t) {
    y = unary(m, comp, first, KILN_OP_CONVERT, d, "convert", y, ds->dtype, ds->dims, ds->rank,
              ds->layout, NULL);
    if (y == KILN_NO_ID) return KILN_ENOMEM;
  }
  kiln_replace_all_uses(m, comp, d->id, y);
  *done = true;
  return 0;
}

int kiln_pass_dot_canon(kiln_module *m, const kiln_pass_ctx *ctx) {
  bool *fused = kiln_calloc(m->ncomps ? m->ncomps : 1, sizeof *fused);
  bool *keep = NULL;
  int rc = 0;
  if (fused == NULL) return oom(ctx);
  for (uint32_t c = 0; c < m->ncomps; c++) {
    const kiln_computation *comp = m->comps[c];
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const kiln_instr *x = m->instrs[comp->instrs[i]];
      if (x->op == KILN_OP_FUSION && x->ncalled == 1 && x->called[0] < m->ncomps)
        fused[x->called[0]] = true;
    }
  }
  for (uint32_t c = 0; c < m->ncomps && rc == 0; c++) {
    if (fused[c]) continue;
    uint32_t n = m->comps[c]->ninstrs;
    kiln_id first = m->ninstrs;
    bool any = false;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
      kiln_instr *x = m->instrs[m->comps[c]->instrs[i]];
      bool done = false;
      if (x->op == KILN_OP_DOT) rc = canon_dot(m, ctx, c, first, x, &done);
      any |= done;
    }
    if (rc || !any) continue;
    /* Drop the dots replaced (nothing reads them now) and restore order. */
    kiln_computation *comp = m->comps[c];
    kiln_free(keep);
    keep = kiln_calloc(m->ninstrs, sizeof *keep);
    uint32_t *uses = kiln_calloc(m->ninstrs, sizeof *uses);
    if (keep == NULL || uses == NULL) {
      kiln_free(uses);
      rc = KILN_ENOMEM;
      break;
    }
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const kiln_instr *u = m->instrs[comp->instrs[i]];
      keep[u->id] = true;
      for (uint32_t k = 0; k < u->noperands; k++) uses[u->operands[k]]++;
      for (uint32_t k = 0; k < u->ncontrol; k++) uses[u->control_preds[k]]++;
    }
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const kiln_instr *u = m->instrs[comp->instrs[i]];
      if (u->op == KILN_OP_DOT && uses[u->id] == 0 && u->id != comp->root) keep[u->id] = false;
    }
    kiln_computation_compact(m, c, keep);
    kiln_free(uses);
    rc = kiln_computation_sort(m, c, ctx->st);
  }
  kiln_free(keep);
  kiln_free(fused);
  if (rc == KILN_ENOMEM) return oom(ctx);
  return rc;
}
