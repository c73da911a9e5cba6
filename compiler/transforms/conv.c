/* Transpose rules of convolution: the cotangents of the input and of the
 * kernel are themselves convolutions, as JAX derives them.
 *
 * Input: convolve the output cotangent with the kernel flipped in space and
 * with its feature roles swapped; the forward strides become base dilation
 * and the forward base dilation becomes the stride, with padding chosen so
 * that every input position sees exactly the windows that read it. Feature
 * groups regroup the kernel so each group maps back to its own inputs.
 *
 * Kernel: convolve the input (batch and feature roles swapped) with the
 * output cotangent as the kernel, so the contraction runs over the batch;
 * forward strides become kernel dilation. Feature groups become batch
 * groups.
 */
#include <string.h>

#include "common/arena.h"
#include "compiler/transforms/rules.h"

#define B (&c->b)

static int64_t dilated(int64_t n, int64_t d) { return n > 0 ? (n - 1) * d + 1 : 0; }

static kiln_conv_dims *dims_copy(kiln__tx *tx, const kiln_conv_dims *s) {
  kiln_conv_dims *d = kiln_arena_calloc(tx->m->arena, 1, sizeof *d);
  uint32_t n = s->nspatial ? s->nspatial : 1;
  if (d == NULL) return NULL;
  *d = *s;
  d->in_spatial = kiln_arena_calloc(tx->m->arena, n, sizeof(int64_t));
  d->kernel_spatial = kiln_arena_calloc(tx->m->arena, n, sizeof(int64_t));
  d->out_spatial = kiln_arena_calloc(tx->m->arena, n, sizeof(int64_t));
  if (d->in_spatial == NULL || d->kernel_spatial == NULL || d->out_spatial == NULL) return NULL;
  return d;
}

static kiln_window *window_new(kiln__tx *tx, uint32_t n) {
  kiln_window *w = kiln_arena_calloc(tx->m->arena, 1, sizeof *w);
  if (w == NULL) return NULL;
  w->rank = n;
  w->dims = kiln_arena_calloc(tx->m->arena, n ? n : 1, sizeof *w->dims);
  return w->dims ? w : NULL;
}

/* A convolution like `src` on new operands with new window, dimension
 * numbers and group counts. */
static kiln_id conv(kiln__ad *c, const kiln_instr *src, kiln_id lhs, kiln_id rhs, kiln_window *w,
                    kiln_conv_dims *cd, int64_t fgc, int64_t bgc) {
  kiln__tx *tx = c->tx;
  kiln_id o[2] = {lhs, rhs};
  kiln_instr *ins = kiln__b_clone_start(B, src, o, 2);
  if (ins == NULL) return KILN_NO_ID;
  /* the result type follows the operands */
  ins->shape.dtype = kiln__b_shape(tx, lhs)->dtype;
  kiln_attr *wa = kiln_instr_add_attr(tx->m, ins, KILN_ATTR_WINDOW);
  kiln_attr *la = kiln_instr_add_attr(tx->m, ins, KILN_ATTR_DIM_LABELS);
  if (wa == NULL || la == NULL) return kiln__tx_oom(tx), KILN_NO_ID;
  wa->v.window = w;
  la->v.conv = cd;
  kiln__b_drop_attr(ins, KILN_ATTR_FEATURE_GROUP_COUNT);
  kiln__b_drop_attr(ins, KILN_ATTR_BATCH_GROUP_COUNT);
  if ((fgc != 1 && kiln_instr_set_attr_int(tx->m, ins, KILN_ATTR_FEATURE_GROUP_COUNT, fgc)) ||
      (bgc != 1 && kiln_instr_set_attr_int(tx->m, ins, KILN_ATTR_BATCH_GROUP_COUNT, bgc)))
    return kiln__tx_oom(tx), KILN_NO_ID;
  return kiln__b_finish(B, ins);
}

/* Splits dimension `axis` of v into (g, n/g) and merges the g part into
 * dimension `into` (as its major part): the kernel regrouping of feature
 * groups, and the batch groups a lowered convolution folds into its features. */
kiln_id kiln__tf_regroup(kiln__b *b, kiln_id v, int64_t axis, int64_t into, int64_t g) {
  kiln__tx *tx = b->tx;
  if (tx->err) return KILN_NO_ID;
  const kiln_shape *s = kiln__b_shape(tx, v);
  uint32_t r = s->rank;
  int64_t *dims = kiln__b_i64s(tx, r + 1), *perm = kiln__b_i64s(tx, r + 1);
  if (dims == NULL || perm == NULL) return KILN_NO_ID;
  /* split: dims with axis -> (g, n/g) */
  for (uint32_t d = 0, o = 0; d < r; d++) {
    if ((int64_t)d == axis) {
      dims[o++] = g;
      dims[o++] = s->dims[d] / g;
    } else {
      dims[o++] = s->dims[d];
    }
  }
  kiln_id x = kiln__b_reshape(b, v, dims, r + 1);
  /* positions in the split value: g at `axis`, others shifted past it */
  int64_t gpos = axis, ipos = into < axis ? into : into + 1;
  /* move g right before `into` */
  uint32_t o = 0;
  for (uint32_t d = 0; d <= r; d++) {
    if ((int64_t)d == gpos) continue;
    if ((int64_t)d == ipos) perm[o++] = gpos;
    perm[o++] = d;
  }
  x = kiln__b_transpose(b, x, perm, r + 1);
  const kiln_shape *t = kiln__b_shape(tx, x);
  if (t == NULL || tx->err) return KILN_NO_ID;
  int64_t at = 0;
  for (uint32_t d = 0; d <= r; d++)
    if (perm[d] == gpos) at = d;
  o = 0;
  for (uint32_t d = 0; d <= r; d++) {
    if ((int64_t)d == at) {
      dims[o++] = t->dims[d] * t->dims[d + 1];
      d++;
    } else {
      dims[o++] = t->dims[d];
    }
  }
  return kiln__b_reshape(b, x, dims, r);
}

static kiln_id lhs_cotangent(kiln__ad *c, const kiln_instr *ins, kiln_id ct,
                             const kiln_conv_dims *cd, const kiln_window *w, int64_t fgc) {
  kiln__tx *tx = c->tx;
  const kiln_shape *xs = &tx->m->instrs[ins->operands[0]]->shape;
  const kiln_shape *ks = &tx->m->instrs[ins->operands[1]]->shape;
  uint32_t ns = cd->nspatial;
  kiln_id k = kiln__b_reverse(B, kiln__X(c, ins, 1), cd->kernel_spatial, ns);
  if (fgc > 1) k = kiln__tf_regroup(B, k, cd->kernel_out, cd->kernel_in, fgc);
  kiln_conv_dims *nd = dims_copy(tx, cd);
  kiln_window *nw = window_new(tx, ns);
  if (nd == NULL || nw == NULL) return kiln__tx_oom(tx), KILN_NO_ID;
  nd->in_batch = cd->out_batch;
  nd->in_feature = cd->out_feature;
  nd->kernel_in = cd->kernel_out;
  nd->kernel_out = cd->kernel_in;
  nd->out_batch = cd->in_batch;
  nd->out_feature = cd->in_feature;
  for (uint32_t i = 0; i < ns; i++) {
    const kiln_window_dim *wd = &w->dims[i];
    nd->in_spatial[i] = cd->out_spatial[i];
    nd->kernel_spatial[i] = cd->kernel_spatial[i];
    nd->out_spatial[i] = cd->in_spatial[i];
    int64_t lhs_d = dilated(xs->dims[cd->in_spatial[i]], wd->lhs_dilate);
    int64_t rhs_d = dilated(ks->dims[cd->kernel_spatial[i]], wd->rhs_dilate);
    int64_t out_d = dilated(ins->shape.dims[cd->out_spatial[i]], wd->stride);
    int64_t before = rhs_d - wd->pad_lo - 1;
    int64_t after = lhs_d + rhs_d - 1 - out_d - before;
    nw->dims[i] = (kiln_window_dim){wd->size,   wd->lhs_dilate, before, after,
                                    wd->stride, wd->rhs_dilate, false};
  }
  return conv(c, ins, ct, k, nw, nd, fgc, 1);
}

static kiln_id rhs_cotangent(kiln__ad *c, const kiln_instr *ins, kiln_id ct,
                             const kiln_conv_dims *cd, const kiln_window *w, int64_t fgc) {
  kiln__tx *tx = c->tx;
  const kiln_shape *xs = &tx->m->instrs[ins->operands[0]]->shape;
  const kiln_shape *ks = &tx->m->instrs[ins->operands[1]]->shape;
  uint32_t ns = cd->nspatial;
  kiln_conv_dims *nd = dims_copy(tx, cd);
  kiln_window *nw = window_new(tx, ns);
  if (nd == NULL || nw == NULL) return kiln__tx_oom(tx), KILN_NO_ID;
  nd->in_batch = cd->in_feature;
  nd->in_feature = cd->in_batch;
  nd->kernel_in = cd->out_batch;
  nd->kernel_out = cd->out_feature;
  nd->out_batch = cd->kernel_in;
  nd->out_feature = cd->kernel_out;
  for (uint32_t i = 0; i < ns; i++) {
    const kiln_window_dim *wd = &w->dims[i];
    nd->in_spatial[i] = cd->in_spatial[i];
    nd->kernel_spatial[i] = cd->out_spatial[i];
    nd->out_spatial[i] = cd->kernel_spatial[i];
    int64_t lhs_d = dilated(xs->dims[cd->in_spatial[i]], wd->lhs_dilate);
    int64_t rhs_d = dilated(ks->dims[cd->kernel_spatial[i]], wd->rhs_dilate);
    int64_t out_d = dilated(ins->shape.dims[cd->out_spatial[i]], wd->stride);
    int64_t hi = (out_d - lhs_d) + (rhs_d - wd->pad_lo - 1);
    nw->dims[i] = (kiln_window_dim){ins->shape.dims[cd->out_spatial[i]],
                                    wd->rhs_dilate,
                                    wd->pad_lo,
                                    hi,
                                    wd->lhs_dilate,
                                    wd->stride,
                                    false};
  }
  return conv(c, ins, kiln__X(c, ins, 0), ct, nw, nd, 1, fgc);
}

int kiln__vjp_convolution(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__tx *tx = c->tx;
  const kiln_attr *la = kiln_instr_attr(ins, KILN_ATTR_DIM_LABELS);
  const kiln_attr *wa = kiln_instr_attr(ins, KILN_ATTR_WINDOW);
  int64_t fgc = kiln_instr_attr_int(ins, KILN_ATTR_FEATURE_GROUP_COUNT, 1);
  int64_t bgc = kiln_instr_attr_int(ins, KILN_ATTR_BATCH_GROUP_COUNT, 1);
  if (la == NULL || la->v.conv == NULL) return kiln__ad_not_diff(c, ins);
  const kiln_conv_dims *cd = la->v.conv;
  kiln_window empty = {0, NULL};
  const kiln_window *w = wa && wa->v.window ? wa->v.window : &empty;
  if (w->rank != cd->nspatial) return kiln__ad_not_diff(c, ins);
  for (uint32_t i = 0; i < w->rank; i++)
    if (w->dims[i].reversal)
      return kiln__tx_fail(tx, KILN_EUNIMPL, ins,
                           "%s: convolution with window reversal has no transpose yet", tx->name);
  if (bgc != 1)
    return kiln__tx_fail(tx, KILN_EUNIMPL, ins,
                         "%s: convolution with batch_group_count %lld has no transpose yet",
                         tx->name, (long long)bgc);
  kiln_dtype t = ins->shape.dtype;
  if (kiln__ad_wants(c, ins, 0))
    kiln__ad_accum(
        c, ins, 0,
        kiln__b_as(B,
                   lhs_cotangent(c, ins,
                                 kiln__b_as(B, ct, kiln__b_shape(tx, kiln__X(c, ins, 1))->dtype),
                                 cd, w, fgc),
                   tx->m->instrs[ins->operands[0]]->shape.dtype));
  if (kiln__ad_wants(c, ins, 1))
    kiln__ad_accum(
        c, ins, 1,
        kiln__b_as(B,
                   rhs_cotangent(c, ins,
                                 kiln__b_as(B, ct, kiln__b_shape(tx, kiln__X(c, ins, 0))->dtype),
                                 cd, w, fgc),
                   tx->m->instrs[ins->operands[1]]->shape.dtype));
  (void)t;
  return tx->err;
}
