/* The convolution step (KILN_STEP_CONV): building it from an HLO
 * convolution, checking one that came in a blob, and the direct loop that
 * is its reference semantics.
 *
 * The idea: dim_labels and layouts only say where each role's dimension
 * lives in memory, so the step keeps, per operand, the size and element
 * stride of each role (batch, feature, spatial...) and nothing else. Every
 * permutation and every layout is then the same step, and a backend
 * describes the operands to its library with strides (oneDNN takes them
 * as they are) instead of rearranging data.
 */
#include <stdio.h>
#include <string.h>

#include "compiler/codegen/lower_internal.h"

#define MAX_EXTENT ((int64_t)1 << 31) /* sizes, group counts, window values */
#define MAX_STRIDE ((int64_t)1 << 40) /* element strides */

static int64_t out_size(int64_t in, int64_t k, int64_t stride, int64_t lo, int64_t hi, int64_t ld,
                        int64_t rd) {
  int64_t padded = lo + hi + (in > 0 ? (in - 1) * ld + 1 : 0);
  int64_t window = k > 0 ? (k - 1) * rd + 1 : 0;
  if (in == 0 || k == 0 || padded < window) return 0;
  return (padded - window) / stride + 1;
}

/* Elements an operand spans (0 when it is empty); no overflow given the
 * bounds checked before. */
static __int128 span(const int64_t *dims, const int64_t *strides, uint32_t n) {
  __int128 last = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (dims[i] == 0) return 0;
    last += (__int128)(dims[i] - 1) * strides[i];
  }
  return last + 1;
}

static bool in_range(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v < hi; }

bool kiln_conv_check(const kiln_conv *c, uint64_t lhs_bytes, uint64_t rhs_bytes, uint64_t out_bytes,
                     char *why, size_t nwhy) {
#define NO(...) return snprintf(why, nwhy, __VA_ARGS__), false
  if (c->dtype != KILN_F32 && c->dtype != KILN_F64)
    NO("element type %d (f32 or f64 only)", (int)c->dtype);
  if (c->nspatial > KILN_CONV_MAX_SPATIAL)
    NO("%u spatial dimensions (at most %d)", c->nspatial, KILN_CONV_MAX_SPATIAL);
  uint32_t n = c->nspatial + 2;
  if (!in_range(c->feature_groups, 1, MAX_EXTENT) || !in_range(c->batch_groups, 1, MAX_EXTENT))
    NO("feature_groups %lld, batch_groups %lld (1 .. 2^31)", (long long)c->feature_groups,
       (long long)c->batch_groups);
  const int64_t *dims[3] = {c->lhs_dims, c->rhs_dims, c->out_dims};
  const int64_t *strides[3] = {c->lhs_strides, c->rhs_strides, c->out_strides};
  static const char *const name[3] = {"lhs", "rhs", "out"};
  for (int k = 0; k < 3; k++)
    for (uint32_t i = 0; i < n; i++)
      if (!in_range(dims[k][i], 0, MAX_EXTENT) || !in_range(strides[k][i], 0, MAX_STRIDE))
        NO("%s dimension %u: size %lld, stride %lld", name[k], i, (long long)dims[k][i],
           (long long)strides[k][i]);
  for (uint32_t i = 0; i < c->nspatial; i++)
    if (!in_range(c->stride[i], 1, MAX_EXTENT) || !in_range(c->lhs_dilate[i], 1, MAX_EXTENT) ||
        !in_range(c->rhs_dilate[i], 1, MAX_EXTENT) ||
        !in_range(c->pad_lo[i], -MAX_EXTENT, MAX_EXTENT) ||
        !in_range(c->pad_hi[i], -MAX_EXTENT, MAX_EXTENT))
      NO("window dimension %u: stride %lld, padding %lld_%lld, dilation %lld/%lld", i,
         (long long)c->stride[i], (long long)c->pad_lo[i], (long long)c->pad_hi[i],
         (long long)c->lhs_dilate[i], (long long)c->rhs_dilate[i]);
  int64_t fg = c->feature_groups, bg = c->batch_groups, O = c->rhs_dims[0];
  if (c->lhs_dims[1] != c->rhs_dims[1] * fg || O % fg || O % bg || c->lhs_dims[0] % bg)
    NO("lhs features %lld, kernel %lld -> %lld, batch %lld do not fit the groups (%lld, %lld)",
       (long long)c->lhs_dims[1], (long long)c->rhs_dims[1], (long long)O,
       (long long)c->lhs_dims[0], (long long)fg, (long long)bg);
  if (c->out_dims[0] != c->lhs_dims[0] / bg || c->out_dims[1] != O)
    NO("out batch %lld and features %lld (expected %lld and %lld)", (long long)c->out_dims[0],
       (long long)c->out_dims[1], (long long)(c->lhs_dims[0] / bg), (long long)O);
  for (uint32_t i = 0; i < c->nspatial; i++) {
    int64_t want = out_size(c->lhs_dims[2 + i], c->rhs_dims[2 + i], c->stride[i], c->pad_lo[i],
                            c->pad_hi[i], c->lhs_dilate[i], c->rhs_dilate[i]);
    if (c->out_dims[2 + i] != want)
      NO("out spatial dimension %u has size %lld, the window gives %lld", i,
         (long long)c->out_dims[2 + i], (long long)want);
  }
  uint64_t have[3] = {lhs_bytes, rhs_bytes, out_bytes};
  size_t es = kiln_dtype_size(c->dtype);
  for (int k = 0; k < 3; k++) {
    __int128 need = span(dims[k], strides[k], n) * (__int128)es;
    if (need > (__int128)have[k])
      NO("%s spans %llu bytes, its slot has %llu", name[k], (unsigned long long)need,
         (unsigned long long)have[k]);
  }
#undef NO
  return true;
}

/* ---- the direct loop ---------------------------------------------------- */

typedef struct ref_geo {
  int64_t in[3], k[3], out[3], st[3], lo[3], ld[3], rd[3];
  int64_t ls[3], rs[3], os[3]; /* strides of the spatial dims */
} ref_geo;

static double load(kiln_dtype t, const void *p, int64_t i) {
  return t == KILN_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

void kiln_conv_reference(const kiln_conv *c, const void *lhs, const void *rhs, void *out) {
  ref_geo g;
  for (int i = 0; i < 3; i++) {
    bool on = (uint32_t)i < c->nspatial;
    g.in[i] = on ? c->lhs_dims[2 + i] : 1;
    g.k[i] = on ? c->rhs_dims[2 + i] : 1;
    g.out[i] = on ? c->out_dims[2 + i] : 1;
    g.st[i] = on ? c->stride[i] : 1;
    g.lo[i] = on ? c->pad_lo[i] : 0;
    g.ld[i] = on ? c->lhs_dilate[i] : 1;
    g.rd[i] = on ? c->rhs_dilate[i] : 1;
    g.ls[i] = on ? c->lhs_strides[2 + i] : 0;
    g.rs[i] = on ? c->rhs_strides[2 + i] : 0;
    g.os[i] = on ? c->out_strides[2 + i] : 0;
  }
  int64_t O = c->rhs_dims[0], ci = c->rhs_dims[1];
  int64_t ofg = O / c->feature_groups, obg = O / c->batch_groups, bgs = c->out_dims[0];
  kiln_dtype t = c->dtype;
  for (int64_t b = 0; b < c->out_dims[0]; b++)
    for (int64_t o = 0; o < O; o++) {
      int64_t lb = b + (o / obg) * bgs, f0 = (o / ofg) * ci;
      for (int64_t y0 = 0; y0 < g.out[0]; y0++)
        for (int64_t y1 = 0; y1 < g.out[1]; y1++)
          for (int64_t y2 = 0; y2 < g.out[2]; y2++) {
            int64_t y[3] = {y0, y1, y2};
            double acc = 0;
            for (int64_t k0 = 0; k0 < g.k[0]; k0++)
              for (int64_t k1 = 0; k1 < g.k[1]; k1++)
                for (int64_t k2 = 0; k2 < g.k[2]; k2++) {
                  int64_t kk[3] = {k0, k1, k2}, loff = lb * c->lhs_strides[0];
                  int64_t roff = o * c->rhs_strides[0];
                  bool hole = false;
                  for (int i = 0; i < 3 && !hole; i++) {
                    int64_t u = y[i] * g.st[i] - g.lo[i] + kk[i] * g.rd[i];
                    hole = u < 0 || u % g.ld[i] != 0 || u / g.ld[i] >= g.in[i];
                    loff += (hole ? 0 : u / g.ld[i]) * g.ls[i];
                    roff += kk[i] * g.rs[i];
                  }
                  if (hole) continue;
                  for (int64_t z = 0; z < ci; z++)
                    acc += load(t, lhs, loff + (f0 + z) * c->lhs_strides[1]) *
                           load(t, rhs, roff + z * c->rhs_strides[1]);
                }
            int64_t oi = b * c->out_strides[0] + o * c->out_strides[1] + y0 * g.os[0] +
                         y1 * g.os[1] + y2 * g.os[2];
            if (t == KILN_F32)
              ((float *)out)[oi] = (float)acc;
            else
              ((double *)out)[oi] = acc;
          }
    }
}

/* ---- from the instruction ----------------------------------------------- */

/* Element strides of shape s's dimensions under its layout (row-major when
 * it has none). */
static bool dim_strides(const kiln_shape *s, int64_t *out) {
  const kiln_layout *l = s->layout;
  int64_t step = 1;
  if (l == NULL || l->rank == 0 || l->minor_to_major == NULL) {
    for (uint32_t i = s->rank; i-- > 0;) {
      out[i] = step;
      step *= s->dims[i];
    }
    return true;
  }
  if (l->rank != s->rank) return false;
  for (uint32_t i = 0; i < l->rank; i++) {
    int64_t d = l->minor_to_major[i];
    if (d < 0 || (uint32_t)d >= s->rank) return false;
    out[d] = step;
    step *= s->dims[d];
  }
  return true;
}

bool kiln__conv_plan(const kiln_module *m, const kiln_instr *ins, kiln_conv *c) {
  if (ins->op != KILN_OP_CONVOLUTION || ins->noperands != 2) return false;
  const kiln_shape *ls = &m->instrs[ins->operands[0]]->shape;
  const kiln_shape *rs = &m->instrs[ins->operands[1]]->shape, *os = &ins->shape;
  const kiln_attr *da = kiln_instr_attr(ins, KILN_ATTR_DIM_LABELS);
  const kiln_attr *wa = kiln_instr_attr(ins, KILN_ATTR_WINDOW);
  const kiln_conv_dims *d = da ? da->v.conv : NULL;
  const kiln_window *w = wa ? wa->v.window : NULL;
  if (os->dtype != KILN_F32 || ls->dtype != os->dtype || rs->dtype != os->dtype || d == NULL ||
      d->nspatial > KILN_CONV_MAX_SPATIAL || ls->rank != d->nspatial + 2 || rs->rank != ls->rank ||
      os->rank != ls->rank || (w && w->rank != d->nspatial) || os->dynamic || ls->dynamic ||
      rs->dynamic)
    return false;
  int64_t lst[KILN_CONV_MAX_DIMS], rst[KILN_CONV_MAX_DIMS], ost[KILN_CONV_MAX_DIMS];
  if (!dim_strides(ls, lst) || !dim_strides(rs, rst) || !dim_strides(os, ost)) return false;
  memset(c, 0, sizeof *c);
  c->dtype = os->dtype;
  c->nspatial = d->nspatial;
  c->feature_groups = kiln_instr_attr_int(ins, KILN_ATTR_FEATURE_GROUP_COUNT, 1);
  c->batch_groups = kiln_instr_attr_int(ins, KILN_ATTR_BATCH_GROUP_COUNT, 1);
  int64_t lrole[KILN_CONV_MAX_DIMS] = {d->in_batch, d->in_feature};
  int64_t rrole[KILN_CONV_MAX_DIMS] = {d->kernel_out, d->kernel_in};
  int64_t orole[KILN_CONV_MAX_DIMS] = {d->out_batch, d->out_feature};
  for (uint32_t i = 0; i < d->nspatial; i++) {
    lrole[2 + i] = d->in_spatial[i];
    rrole[2 + i] = d->kernel_spatial[i];
    orole[2 + i] = d->out_spatial[i];
  }
  for (uint32_t i = 0; i < d->nspatial + 2; i++) {
    if (lrole[i] < 0 || lrole[i] >= ls->rank || rrole[i] < 0 || rrole[i] >= rs->rank ||
        orole[i] < 0 || orole[i] >= os->rank)
      return false;
    c->lhs_dims[i] = ls->dims[lrole[i]];
    c->lhs_strides[i] = lst[lrole[i]];
    c->rhs_dims[i] = rs->dims[rrole[i]];
    c->rhs_strides[i] = rst[rrole[i]];
    c->out_dims[i] = os->dims[orole[i]];
    c->out_strides[i] = ost[orole[i]];
  }
  for (uint32_t i = 0; i < d->nspatial; i++) {
    const kiln_window_dim *wd = w ? &w->dims[i] : NULL;
    if (wd && (wd->reversal || wd->size != c->rhs_dims[2 + i])) return false;
    c->stride[i] = wd ? wd->stride : 1;
    c->pad_lo[i] = wd ? wd->pad_lo : 0;
    c->pad_hi[i] = wd ? wd->pad_hi : 0;
    c->lhs_dilate[i] = wd ? wd->lhs_dilate : 1;
    c->rhs_dilate[i] = wd ? wd->rhs_dilate : 1;
  }
  char why[160];
  int64_t lb = kiln_shape_bytes(ls), rb = kiln_shape_bytes(rs), ob = kiln_shape_bytes(os);
  if (lb < 0 || rb < 0 || ob < 0) return false;
  if (kiln_shape_elements(os) == 0) return false; /* nothing to compute: leave it to the loop */
  return kiln_conv_check(c, (uint64_t)lb, (uint64_t)rb, (uint64_t)ob, why, sizeof why);
}
