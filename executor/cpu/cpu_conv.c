/* The CONV step on the cpu backend, through oneDNN's convolution.
 *
 * At load each step gets a plan: oneDNN memory descriptors built from the
 * step's per-role sizes and strides (so every dim_labels permutation and
 * layout is described as it lies in memory, without a copy), and the
 * primitives, made once. What oneDNN cannot take directly is transformed:
 *  - negative padding crops the input: the view starts further in and is
 *    shorter, padding what is left is non-negative;
 *  - lhs dilation with window stride 1 (conv_transpose, the input gradient
 *    of a strided convolution) runs as the backward data of the forward
 *    convolution it transposes, weights flipped (plan_bwd): no products of
 *    the dilation's zeros;
 *  - other lhs dilation (transposed convolution, used by gradients) and batch
 *    groups (weight gradients) stage the input into a scratch buffer with
 *    one strided reorder: the holes of the dilation are zeros, and batch
 *    group g of the input becomes feature group g of the staged input
 *    ([batch/G, G*C, spatial...], channels innermost), after which both are
 *    grouped convolutions (weights [G, O/G, I, spatial...]);
 *  - 0 spatial dimensions become one of size 1.
 * When oneDNN's descriptors for the operands as they lie give only a
 * reference implementation, the plan lets oneDNN choose the layouts and
 * reorders in and out. Scratchpads are the plan's user's: every run
 * allocates its own buffers and memory objects, so runs may overlap.
 * Without oneDNN in the build (or for a step it refuses) the plan is the
 * direct loop of compiler/codegen/conv_step.c, which is correct but slow.
 *
 * One form goes to OpenBLAS instead: a convolution whose kernel is large
 * and whose output is small, as JAX writes a weight gradient (the "kernel"
 * is the output gradient, as large as the activation, the "batch" is the
 * input channels and the output's few positions are the kernel taps).
 * oneDNN runs that as a direct convolution with a 2048-wide (or 32x32)
 * kernel, ten times slower than its arithmetic allows. Here each output
 * position y is out[:, :, y] = sum over lhs features z and kernel
 * positions k inside the input of lhs[:, z, y*stride - pad + k*dilation] .
 * rhs[:, z, k]: one sgemm per (y, z, kernel row) whose K is the valid run
 * of the last spatial dimension, accumulating (kiln__cpu_gemm, split over
 * the pool when large enough).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "executor/cpu/cpu.h"
#include "executor/cpu/cpu_dnnl.h"

/* The GEMM plan of a long-kernel convolution (see above). Spatial
 * dimension L = ns - 1 (the last) is the run of each call's K; the others
 * are looped over. */
typedef struct gemm_plan {
  bool on;
  bool swap;                /* C is stored transposed: compute C^T = rhs^T lhs^T */
  int ns;                   /* spatial dimensions */
  kiln_gemm g;              /* batch 1; k, beta and operands set per call */
  int64_t ls_z, rs_z;       /* element strides between lhs / rhs features */
  int64_t ls_k, rs_k;       /* between positions of L's kernel (lhs: times the dilation) */
  int64_t nz;               /* lhs features */
  int64_t cr, cc, csr, csc; /* C's rows, columns and their strides (zeroing) */
  /* per spatial dimension: strides of lhs, rhs and out, sizes, window */
  int64_t ls[KILN_CONV_MAX_SPATIAL], rs[KILN_CONV_MAX_SPATIAL], os[KILN_CONV_MAX_SPATIAL];
  int64_t in[KILN_CONV_MAX_SPATIAL], kw[KILN_CONV_MAX_SPATIAL], ow[KILN_CONV_MAX_SPATIAL];
  int64_t st[KILN_CONV_MAX_SPATIAL], lo[KILN_CONV_MAX_SPATIAL], rd[KILN_CONV_MAX_SPATIAL];
} gemm_plan;

#define GEMM_MIN_KERNEL 64 /* kernel positions, at least */
/* Positions of the last kernel dimension, at least: each call's K. Below
 * it oneDNN does better (resnet_block_grad's 16x16 "kernel": oneDNN about
 * 2 ms, K=16 calls not faster); convnet_grad's 32x32 runs 3.5x faster. */
#define GEMM_MIN_RUN 32
#define GEMM_MAX_OUT 64      /* output positions, at most */
#define GEMM_MAX_CALLS 65536 /* output positions x lhs features x kernel rows, at most */
#define GEMM_MIN_MN 16       /* out batch x out features, at least: a matrix, not a vector */
#define BLAS_MAX ((int64_t)1 << 31)

/* How a rows x cols matrix with element strides (sr, sc) is given to a
 * row-major BLAS: *trans and *ld; false when neither stride is a unit. */
static bool blas_view(int64_t rows, int64_t cols, int64_t sr, int64_t sc, uint8_t *trans,
                      int64_t *ld) {
  if (sc == 1 || cols == 1) { /* row-major as it lies */
    *trans = 0;
    *ld = rows == 1 ? (cols > 0 ? cols : 1) : sr;
    return *ld >= cols && *ld >= 1 && *ld < BLAS_MAX;
  }
  if (sr == 1 || rows == 1) { /* its transpose is row-major */
    *trans = 1;
    *ld = cols == 1 ? (rows > 0 ? rows : 1) : sc;
    return *ld >= rows && *ld >= 1 && *ld < BLAS_MAX;
  }
  return false;
}

/* Whether c is the long-kernel form and its operands suit BLAS; fills q. */
static bool plan_gemm(const kiln_conv *c, gemm_plan *q) {
  memset(q, 0, sizeof *q);
  if (c->dtype != KILN_F32 || c->nspatial < 1 || c->feature_groups != 1 || c->batch_groups != 1)
    return false;
  int ns = (int)c->nspatial, L = ns - 1;
  int64_t kprod = 1, oprod = 1;
  for (int i = 0; i < ns; i++) {
    if (c->lhs_dilate[i] != 1 || c->out_dims[2 + i] < 1) return false;
    kprod *= c->rhs_dims[2 + i], oprod *= c->out_dims[2 + i];
    if (kprod > BLAS_MAX || oprod > GEMM_MAX_OUT) return false;
  }
  int64_t B = c->out_dims[0], O = c->out_dims[1], rd = c->rhs_dilate[L], kl = c->rhs_dims[2 + L];
  if (kprod < GEMM_MIN_KERNEL || kl < GEMM_MIN_RUN || B < 1 || O < 1 || B * O < GEMM_MIN_MN ||
      (__int128)oprod * c->lhs_dims[1] * (kprod / kl) > GEMM_MAX_CALLS ||
      rd >= BLAS_MAX / (c->lhs_strides[2 + L] + 1))
    return false;
  q->ls_k = rd * c->lhs_strides[2 + L]; /* the dilation spaces the input taps only */
  q->rs_k = c->rhs_strides[2 + L];
  /* A = lhs (B x K, strides ls0, ls_k), Bm = rhs (K x O, strides rs_k,
   * rs0), C = out (B x O, strides os0, os1); swapped: A = rhs^T (O x K),
   * Bm = lhs^T (K x B), C^T (O x B). The widest K is kl. */
  kiln_gemm *g = &q->g;
  g->dtype = KILN_F32;
  g->batch = 1;
  g->alpha = 1;
  uint8_t tc;
  int64_t ldc;
  if (blas_view(B, O, c->out_strides[0], c->out_strides[1], &tc, &ldc) && tc == 0) {
    g->m = B, g->n = O, g->ldc = ldc;
    if (!blas_view(B, kl, c->lhs_strides[0], q->ls_k, &g->trans_a, &g->lda) ||
        !blas_view(kl, O, q->rs_k, c->rhs_strides[0], &g->trans_b, &g->ldb))
      return false;
  } else if (blas_view(O, B, c->out_strides[1], c->out_strides[0], &tc, &ldc) && tc == 0) {
    q->swap = true;
    g->m = O, g->n = B, g->ldc = ldc;
    if (!blas_view(O, kl, c->rhs_strides[0], q->rs_k, &g->trans_a, &g->lda) ||
        !blas_view(kl, B, q->ls_k, c->lhs_strides[0], &g->trans_b, &g->ldb))
      return false;
  } else {
    return false;
  }
  q->ns = ns;
  for (int i = 0; i < ns; i++) {
    q->ls[i] = c->lhs_strides[2 + i], q->rs[i] = c->rhs_strides[2 + i];
    q->os[i] = c->out_strides[2 + i];
    q->in[i] = c->lhs_dims[2 + i], q->kw[i] = c->rhs_dims[2 + i], q->ow[i] = c->out_dims[2 + i];
    q->st[i] = c->stride[i], q->lo[i] = c->pad_lo[i], q->rd[i] = c->rhs_dilate[i];
  }
  q->ls_z = c->lhs_strides[1], q->rs_z = c->rhs_strides[1], q->nz = c->lhs_dims[1];
  q->cr = B, q->cc = O, q->csr = c->out_strides[0], q->csc = c->out_strides[1];
  q->on = true;
  return true;
}

static int64_t div_floor(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* Output tap y (one index per spatial dimension): C = sum over lhs
 * features z and kernel rows (every spatial dimension but the last) whose
 * input row lies inside, one call each over the last dimension's valid
 * run. */
static void run_gemm_tap(const gemm_plan *q, kiln__cpu_pool *pool, const float *lhs,
                         const float *rhs, float *cy, const int64_t *y) {
  int L = q->ns - 1;
  int64_t p0 = y[L] * q->st[L] - q->lo[L]; /* input position of the last kernel position 0 */
  int64_t k0 = p0 >= 0 ? 0 : div_floor(-p0 + q->rd[L] - 1, q->rd[L]);
  int64_t k1 = div_floor(q->in[L] - 1 - p0, q->rd[L]) + 1;
  if (k1 > q->kw[L]) k1 = q->kw[L];
  int64_t rows = 1;
  for (int i = 0; i < L; i++) rows *= q->kw[i];
  bool first = true;
  for (int64_t r = 0; r < rows && k0 < k1; r++) {
    int64_t loff = (p0 + k0 * q->rd[L]) * q->ls[L], roff = k0 * q->rs_k, rest = r;
    bool inside = true;
    for (int i = L; i-- > 0 && inside;) {
      int64_t kk = rest % q->kw[i], p = y[i] * q->st[i] - q->lo[i] + kk * q->rd[i];
      rest /= q->kw[i];
      inside = p >= 0 && p < q->in[i];
      if (inside) loff += p * q->ls[i], roff += kk * q->rs[i];
    }
    if (!inside) continue;
    for (int64_t z = 0; z < q->nz; z++) {
      kiln_gemm g = q->g;
      g.k = k1 - k0;
      g.beta = first ? 0 : 1;
      const float *a = lhs + z * q->ls_z + loff, *b = rhs + z * q->rs_z + roff;
      if (q->swap)
        kiln__cpu_gemm(pool, &g, b, a, cy, NULL);
      else
        kiln__cpu_gemm(pool, &g, a, b, cy, NULL);
      first = false;
    }
  }
  if (first) /* no input under the window: zeros */
    for (int64_t i = 0; i < q->cr; i++)
      for (int64_t j = 0; j < q->cc; j++) cy[i * q->csr + j * q->csc] = 0.0f;
}

static void run_gemm(const gemm_plan *q, kiln__cpu_pool *pool, const float *lhs, const float *rhs,
                     float *out) {
  int64_t taps = 1;
  for (int i = 0; i < q->ns; i++) taps *= q->ow[i];
  for (int64_t t = 0; t < taps; t++) {
    int64_t y[KILN_CONV_MAX_SPATIAL] = {0}, rest = t, off = 0;
    for (int i = q->ns; i-- > 0;) {
      y[i] = rest % q->ow[i];
      rest /= q->ow[i];
      off += y[i] * q->os[i];
    }
    run_gemm_tap(q, pool, lhs, rhs, out + off, y);
  }
}

#if KILN__DNNL
enum { P_STAGE, P_SRC, P_WEI, P_CONV, P_DST, NPRIM };

struct kiln__cpu_conv {
  kiln_conv c;
  gemm_plan gemm;
  bool library;
  bool bwd;                     /* a transposed convolution run as backward data (see plan_bwd) */
  size_t flip_bytes;            /* bwd: the flipped weights, [G][C/G][O/G][k...] dense */
  bool stage_zero;              /* the staged input has holes: zero it first */
  int64_t lhs_off;              /* elements into the lhs where the (cropped) view starts */
  int64_t stage_off;            /* elements into the staged buffer where the input goes */
  dnnl_primitive_t prim[NPRIM]; /* NULL: not needed */
  /* memory descriptors: user lhs view, staged buffer view (reorder dst),
   * conv input as the operand lies (user view or staged), and as the
   * primitive takes it; the same for weights and output */
  dnnl_memory_desc_t lhs_md, stage_md, src_md, conv_src_md;
  dnnl_memory_desc_t wei_md, conv_wei_md, dst_md, conv_dst_md;
  dnnl_memory_desc_t scratch_md[NPRIM];
  size_t stage_bytes, src_bytes, wei_bytes, dst_bytes, scratch_bytes;
};

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static dnnl_status_t strided(dnnl_memory_desc_t *md, int n, const dnnl_dims_t dims,
                             const dnnl_dims_t strides) {
  return kiln__dnnl_md_strided(md, n, dims, dnnl_f32, strides);
}

static dnnl_status_t any(dnnl_memory_desc_t *md, int n, const dnnl_dims_t dims) {
  return kiln__dnnl_md_any(md, n, dims, dnnl_f32);
}

/* Makes the primitive of pd into p->prim[k] with its scratchpad; pd is
 * destroyed. */
static dnnl_status_t take_prim(kiln__cpu_conv *p, int k, dnnl_primitive_desc_t pd) {
  dnnl_status_t s = kiln__dnnl_prim_create(&p->prim[k], pd, &p->scratch_md[k]);
  size_t n = p->scratch_md[k].ndims > 0 ? kiln__dnnl.memory_desc_get_size(&p->scratch_md[k]) : 0;
  if (n > p->scratch_bytes) p->scratch_bytes = n;
  return s;
}

static dnnl_status_t reorder(kiln__cpu_conv *p, int k, const dnnl_memory_desc_t *from,
                             const dnnl_memory_desc_t *to) {
  dnnl_primitive_desc_t pd;
  dnnl_status_t s = kiln__dnnl_reorder_pd(&pd, from, to);
  return s == dnnl_success ? take_prim(p, k, pd) : s;
}

/* Per spatial dimension after cropping. */
typedef struct geo {
  int n;                              /* spatial dims given to oneDNN (>= 1) */
  int64_t in[KILN_CONV_MAX_SPATIAL];  /* input elements kept */
  int64_t ext[KILN_CONV_MAX_SPATIAL]; /* their extent once dilated */
  dnnl_dims_t lo, hi, st, dil;        /* as oneDNN takes them */
  int64_t k[KILN_CONV_MAX_SPATIAL], out[KILN_CONV_MAX_SPATIAL];
  int64_t ls[KILN_CONV_MAX_SPATIAL], ks[KILN_CONV_MAX_SPATIAL], os[KILN_CONV_MAX_SPATIAL];
  int64_t ld[KILN_CONV_MAX_SPATIAL];
} geo;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Crops negative padding into the view; false when no input is left. */
static bool crop(const kiln_conv *c, geo *g, int64_t *off) {
  *off = 0;
  memset(g, 0, sizeof *g);
  g->n = c->nspatial ? (int)c->nspatial : 1;
  for (int i = 0; i < g->n; i++) {
    bool on = (uint32_t)i < c->nspatial;
    int64_t I = on ? c->lhs_dims[2 + i] : 1, d = on ? c->lhs_dilate[i] : 1;
    int64_t lo = on ? c->pad_lo[i] : 0, hi = on ? c->pad_hi[i] : 0;
    int64_t P = lo + (I - 1) * d + 1 + hi; /* the padded, dilated input */
    int64_t j0 = lo >= 0 ? 0 : ceil_div(-lo, d);
    if (P <= 0 || P - 1 - lo < 0) return false;
    int64_t j1 = (P - 1 - lo) / d;
    if (j1 > I - 1) j1 = I - 1;
    if (j1 < j0) return false;
    g->in[i] = j1 - j0 + 1;
    g->ext[i] = (g->in[i] - 1) * d + 1;
    g->lo[i] = lo + j0 * d;
    g->hi[i] = P - g->lo[i] - g->ext[i];
    g->ld[i] = d;
    g->k[i] = on ? c->rhs_dims[2 + i] : 1;
    g->out[i] = on ? c->out_dims[2 + i] : 1;
    g->ls[i] = on ? c->lhs_strides[2 + i] : 1;
    g->ks[i] = on ? c->rhs_strides[2 + i] : 1;
    g->os[i] = on ? c->out_strides[2 + i] : 1;
    g->st[i] = on ? c->stride[i] : 1;
    g->dil[i] = on ? c->rhs_dilate[i] - 1 : 0;
    *off += j0 * g->ls[i];
  }
  return true;
}

/* The input as the convolution reads it: the lhs view, or the staged one. */
static dnnl_status_t plan_input(kiln__cpu_conv *p, geo *g) {
  const kiln_conv *c = &p->c;
  int64_t G = c->batch_groups, N = c->lhs_dims[0], C = c->lhs_dims[1];
  bool stage = G > 1, pad = false;
  for (int i = 0; i < g->n; i++) {
    int64_t window = (g->k[i] - 1) * (g->dil[i] + 1) + 1;
    stage |= g->ld[i] > 1;
    pad |= g->lo[i] >= window || g->hi[i] >= window; /* oneDNN wants less padding */
  }
  stage |= pad;
  dnnl_dims_t dims = {0}, str = {0};
  if (!stage) {
    dims[0] = N, dims[1] = C, str[0] = c->lhs_strides[0], str[1] = c->lhs_strides[1];
    for (int i = 0; i < g->n; i++) dims[2 + i] = g->in[i], str[2 + i] = g->ls[i];
    return strided(&p->src_md, 2 + g->n, dims, str);
  }
  /* Staged: [N/G][in*ld...][G][C] dense (a dilated dimension is kept
   * in*ld long, not (in-1)*ld+1, so that oneDNN's stride check, which
   * takes size times stride as a dimension's extent, sees no overlap);
   * the conv reads [N/G, G*C, ext...] of it. */
  /* With `pad` the padding is zeros in the buffer too (lo before, hi
   * after each dimension) and the conv pads nothing. */
  int64_t B = N / G, inner = G * C, sp[KILN_CONV_MAX_SPATIAL], run = inner;
  for (int i = g->n; i-- > 0;) {
    sp[i] = run;
    run *= g->in[i] * g->ld[i] + (pad ? g->lo[i] + g->hi[i] : 0);
  }
  dims[0] = B, dims[1] = inner, str[0] = run, str[1] = 1;
  p->stage_off = 0;
  for (int i = 0; i < g->n; i++) {
    dims[2 + i] = g->ext[i] + (pad ? g->lo[i] + g->hi[i] : 0), str[2 + i] = sp[i];
    if (pad) p->stage_off += g->lo[i] * sp[i], g->lo[i] = g->hi[i] = 0;
  }
  dnnl_status_t s = strided(&p->src_md, 2 + g->n, dims, str);
  p->stage_bytes = (size_t)B * (size_t)run * sizeof(float);
  p->stage_zero = pad;
  for (int i = 0; i < g->n; i++) p->stage_zero |= g->ld[i] > 1;
  /* The reorder: lhs as [G, B, C, in...] into the staged buffer. */
  dnnl_dims_t ud = {0}, us = {0}, ss = {0};
  ud[0] = G, ud[1] = B, ud[2] = C;
  us[0] = B * c->lhs_strides[0], us[1] = c->lhs_strides[0], us[2] = c->lhs_strides[1];
  ss[0] = C, ss[1] = run, ss[2] = 1;
  for (int i = 0; i < g->n; i++) {
    ud[3 + i] = g->in[i];
    us[3 + i] = g->ls[i];
    ss[3 + i] = sp[i] * g->ld[i];
  }
  if (s == dnnl_success) s = strided(&p->lhs_md, 3 + g->n, ud, us);
  if (s == dnnl_success) s = strided(&p->stage_md, 3 + g->n, ud, ss);
  if (s == dnnl_success) s = reorder(p, P_STAGE, &p->lhs_md, &p->stage_md);
  return s;
}

static dnnl_status_t plan_weights_output(kiln__cpu_conv *p, const geo *g) {
  const kiln_conv *c = &p->c;
  int64_t G = c->feature_groups * c->batch_groups, O = c->rhs_dims[0];
  dnnl_dims_t dims = {0}, str = {0};
  int j = 0;
  if (G > 1) dims[j] = G, str[j++] = (O / G) * c->rhs_strides[0];
  dims[j] = O / G, str[j++] = c->rhs_strides[0];
  dims[j] = c->rhs_dims[1], str[j++] = c->rhs_strides[1];
  for (int i = 0; i < g->n; i++) dims[j] = g->k[i], str[j++] = g->ks[i];
  dnnl_status_t s = strided(&p->wei_md, j, dims, str);
  dims[0] = c->out_dims[0], dims[1] = O, str[0] = c->out_strides[0], str[1] = c->out_strides[1];
  for (int i = 0; i < g->n; i++) dims[2 + i] = g->out[i], str[2 + i] = g->os[i];
  if (s == dnnl_success) s = strided(&p->dst_md, 2 + g->n, dims, str);
  return s;
}

/* The convolution primitive descriptor with src/dst as given (as_is) or
 * chosen by oneDNN; weights always chosen. */
static dnnl_status_t conv_pd(kiln__cpu_conv *p, const geo *g, bool as_is,
                             dnnl_primitive_desc_t *pd) {
  dnnl_memory_desc_t src = p->src_md, wei, dst = p->dst_md;
  dnnl_status_t s = any(&wei, p->wei_md.ndims, p->wei_md.dims);
  if (!as_is && s == dnnl_success) s = any(&src, src.ndims, src.dims);
  if (!as_is && s == dnnl_success) s = any(&dst, dst.ndims, dst.dims);
  dnnl_convolution_desc_t cd;
  if (s == dnnl_success)
    s = kiln__dnnl.dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference,
                                                         dnnl_convolution_direct, &src, &wei, NULL,
                                                         &dst, g->st, g->dil, g->lo, g->hi);
  return s == dnnl_success ? kiln__dnnl_pd_create(pd, &cd, true) : s;
}

typedef dnnl_status_t (*pd_fn)(kiln__cpu_conv *p, const void *g, bool as_is,
                               dnnl_primitive_desc_t *pd);

static dnnl_status_t fwd_pd(kiln__cpu_conv *p, const void *g, bool as_is,
                            dnnl_primitive_desc_t *pd) {
  return conv_pd(p, g, as_is, pd);
}

/* The primitive f describes with the operands as they lie, or with the
 * layouts oneDNN chooses when as they lie gives only its reference
 * implementation; its memory descriptors and the reorders in and out. `in`
 * and `out` query what the primitive reads and writes (src and dst
 * forward, diff_dst and diff_src backward). */
static dnnl_status_t plan_prim(kiln__cpu_conv *p, const void *g, pd_fn f, dnnl_query_t in,
                               dnnl_query_t out) {
  dnnl_primitive_desc_t pd = NULL, alt = NULL;
  dnnl_status_t s = f(p, g, true, &pd);
  if (s != dnnl_success || kiln__dnnl_pd_is_ref(pd)) {
    if (f(p, g, false, &alt) == dnnl_success && !kiln__dnnl_pd_is_ref(alt)) {
      if (pd) kiln__dnnl.primitive_desc_destroy(pd);
      pd = alt;
      s = dnnl_success;
    } else if (alt) {
      kiln__dnnl.primitive_desc_destroy(alt);
    }
  }
  if (s != dnnl_success) return s;
  p->conv_src_md = *kiln__dnnl.primitive_desc_query_md(pd, in, 0);
  p->conv_wei_md = *kiln__dnnl.primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  p->conv_dst_md = *kiln__dnnl.primitive_desc_query_md(pd, out, 0);
  if ((s = take_prim(p, P_CONV, pd)) != dnnl_success) return s;
  if (!kiln__dnnl.memory_desc_equal(&p->src_md, &p->conv_src_md)) {
    p->src_bytes = kiln__dnnl.memory_desc_get_size(&p->conv_src_md);
    if ((s = reorder(p, P_SRC, &p->src_md, &p->conv_src_md)) != dnnl_success) return s;
  }
  if (!kiln__dnnl.memory_desc_equal(&p->wei_md, &p->conv_wei_md)) {
    p->wei_bytes = kiln__dnnl.memory_desc_get_size(&p->conv_wei_md);
    if ((s = reorder(p, P_WEI, &p->wei_md, &p->conv_wei_md)) != dnnl_success) return s;
  }
  if (!kiln__dnnl.memory_desc_equal(&p->dst_md, &p->conv_dst_md)) {
    p->dst_bytes = kiln__dnnl.memory_desc_get_size(&p->conv_dst_md);
    if ((s = reorder(p, P_DST, &p->conv_dst_md, &p->dst_md)) != dnnl_success) return s;
  }
  return dnnl_success;
}

static dnnl_status_t plan_conv(kiln__cpu_conv *p, const geo *g) {
  return plan_prim(p, g, fwd_pd, dnnl_query_src_md, dnnl_query_dst_md);
}

static void release(kiln__cpu_conv *p) {
  for (int k = 0; k < NPRIM; k++)
    if (p->prim[k]) kiln__dnnl.primitive_destroy(p->prim[k]);
  memset(p->prim, 0, sizeof p->prim);
  memset(p->scratch_md, 0, sizeof p->scratch_md);
  p->library = p->bwd = p->stage_zero = false;
  p->lhs_off = p->stage_off = 0;
  p->stage_bytes = p->src_bytes = p->wei_bytes = p->dst_bytes = p->scratch_bytes = 0;
  p->flip_bytes = 0;
}

/* Whether oneDNN takes c (f32; feature and batch groups not both; some
 * input inside the window: when padding and cropping leave none, the
 * output is zeros and the direct loop writes them). */
/* Elements of an operand, and whether its strides could be a layout:
 * more elements than its span means they overlap (a hostile step), which
 * the direct loop survives and a library need not. */
static bool distinct(const int64_t *dims, const int64_t *strides, uint32_t n) {
  __int128 count = 1, last = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (dims[i] == 0) return false;
    count *= dims[i];
    if (count > ((__int128)1 << 62)) return false; /* more than any slot holds */
    last += (__int128)(dims[i] - 1) * strides[i];
  }
  return count <= last + 1;
}

/* The staged input's bytes stay far from overflowing size_t. */
static bool stage_fits(const kiln_conv *c, const geo *g) {
  __int128 n = (__int128)c->lhs_dims[0] * c->lhs_dims[1] * (int64_t)sizeof(float);
  for (int i = 0; i < g->n && n <= ((__int128)1 << 40); i++)
    n *= (__int128)g->in[i] * g->ld[i] + g->lo[i] + g->hi[i];
  return n <= ((__int128)1 << 40);
}

/* ---- transposed convolution as backward data ---------------------------
 *
 * A convolution with lhs dilation d and window stride 1 (conv_transpose,
 * and the input gradient of a strided convolution) computes
 *   out[y] = sum over lhs positions x and kernel taps k with
 *            x*d - lo + k*r = y   of   lhs[x] . rhs[k]
 * per spatial dimension. Writing k = K-1-k' (the kernel flipped) this is
 * y = x*d - pl + k'*r with pl = (K-1)r - lo: exactly the data gradient of a
 * forward convolution with stride d, kernel dilation r, padding pl before
 * and (K-1)r - hi after, whose source is `out`, whose destination is the
 * lhs, and whose weights are the kernel flipped with its input and output
 * features exchanged. oneDNN's backward-data primitive does only the
 * products of real input elements, where the staged form (the input
 * spread out with zeros, then a forward convolution) multiplies d^n - 1
 * zeros for every element of a d-dilated n-dimensional input. The flipped
 * weights are written at each run (they are a run-time operand), dense
 * [G][C/G][O/G][k...]; positions of `out` no tap reaches are zeros, as the
 * primitive writes them. Padding oneDNN does not take (pl < 0: the output
 * starts before the first tap's reach; (K-1)r - hi <= -d) keeps the staged
 * form. */
typedef struct bwd_geo {
  int n;
  dnnl_dims_t st, dil, lo, hi;
} bwd_geo;

static bool bwd_geometry(const kiln_conv *c, bwd_geo *b) {
  memset(b, 0, sizeof *b);
  if (c->nspatial < 1 || c->batch_groups != 1) return false;
  bool dilated = false;
  b->n = (int)c->nspatial;
  for (int i = 0; i < b->n; i++) {
    /* kiln_conv_check bounds every term below 2^31: no overflow */
    int64_t d = c->lhs_dilate[i], r = c->rhs_dilate[i], reach = (c->rhs_dims[2 + i] - 1) * r;
    if (c->stride[i] != 1 || c->rhs_dims[2 + i] < 1) return false;
    b->st[i] = d, b->dil[i] = r - 1;
    b->lo[i] = reach - c->pad_lo[i], b->hi[i] = reach - c->pad_hi[i];
    if (b->lo[i] < 0 || b->hi[i] + d <= 0) return false;
    dilated |= d > 1;
  }
  return dilated;
}

static dnnl_status_t bwd_pd(kiln__cpu_conv *p, const void *geo_, bool as_is,
                            dnnl_primitive_desc_t *pd) {
  const bwd_geo *b = geo_;
  dnnl_memory_desc_t diff_src = p->dst_md, wei, diff_dst = p->src_md;
  dnnl_status_t s = any(&wei, p->wei_md.ndims, p->wei_md.dims);
  if (!as_is && s == dnnl_success) s = any(&diff_src, diff_src.ndims, diff_src.dims);
  if (!as_is && s == dnnl_success) s = any(&diff_dst, diff_dst.ndims, diff_dst.dims);
  dnnl_convolution_desc_t cd;
  if (s == dnnl_success)
    s = kiln__dnnl.dilated_convolution_backward_data_desc_init(
        &cd, dnnl_convolution_direct, &diff_src, &wei, &diff_dst, b->st, b->dil, b->lo, b->hi);
  /* No forward hint: the convolution's backward data takes none. */
  return s == dnnl_success ? kiln__dnnl_pd_create(pd, &cd, true) : s;
}

/* Plans c as backward data; false (nothing kept) when it is not that form
 * or oneDNN refuses it. */
static bool plan_bwd(kiln__cpu_conv *p) {
  const kiln_conv *c = &p->c;
  bwd_geo b;
  if (!bwd_geometry(c, &b)) return false;
  int n = b.n;
  int64_t G = c->feature_groups, O = c->rhs_dims[0], Cg = c->rhs_dims[1];
  dnnl_dims_t dims = {0}, str = {0};
  /* diff_dst: the lhs as it lies, [N, C, x...] */
  for (int i = 0; i < 2 + n; i++) dims[i] = c->lhs_dims[i], str[i] = c->lhs_strides[i];
  dnnl_status_t s = strided(&p->src_md, 2 + n, dims, str);
  /* diff_src: the output as it lies, [N, O, y...] */
  for (int i = 0; i < 2 + n; i++) dims[i] = c->out_dims[i], str[i] = c->out_strides[i];
  if (s == dnnl_success) s = strided(&p->dst_md, 2 + n, dims, str);
  /* weights: the flipped kernel, dense [G,] C/G, O/G, k... */
  int j = 0, nd = (G > 1) + 2 + n;
  if (G > 1) dims[j++] = G;
  dims[j++] = Cg, dims[j++] = O / G;
  for (int i = 0; i < n; i++) dims[j++] = c->rhs_dims[2 + i];
  int64_t run = 1;
  for (int i = nd; i-- > 0;) str[i] = run, run *= dims[i];
  if (s == dnnl_success) s = strided(&p->wei_md, nd, dims, str);
  p->flip_bytes = (size_t)run * sizeof(float);
  p->bwd = true;
  p->library = true;
  p->lhs_off = 0;
  if (s == dnnl_success)
    s = plan_prim(p, &b, bwd_pd, dnnl_query_diff_dst_md, dnnl_query_diff_src_md);
  if (s != dnnl_success) release(p);
  return s == dnnl_success;
}

/* The kernel flipped, features exchanged: w[g][i][o][k] = rhs[g*O/G + o][i][K-1-k]. */
static void flip_weights(const kiln_conv *c, const float *rhs, float *w) {
  int n = (int)c->nspatial;
  int64_t G = c->feature_groups, Og = c->rhs_dims[0] / G, Cg = c->rhs_dims[1], taps = 1;
  for (int i = 0; i < n; i++) taps *= c->rhs_dims[2 + i];
  for (int64_t g = 0; g < G; g++)
    for (int64_t ic = 0; ic < Cg; ic++)
      for (int64_t oc = 0; oc < Og; oc++) {
        const float *src = rhs + (g * Og + oc) * c->rhs_strides[0] + ic * c->rhs_strides[1];
        float *dst = w + ((g * Cg + ic) * Og + oc) * taps;
        for (int64_t t = 0; t < taps; t++) {
          int64_t rest = t, off = 0;
          for (int i = n; i-- > 0;) {
            int64_t K = c->rhs_dims[2 + i];
            off += (K - 1 - rest % K) * c->rhs_strides[2 + i];
            rest /= K;
          }
          dst[t] = src[off];
        }
      }
}

static void plan_library(kiln__cpu_conv *p) {
  const kiln_conv *c = &p->c;
  geo g;
  uint32_t nd = c->nspatial + 2;
  if (kiln__dnnl_get() == NULL || c->dtype != KILN_F32 ||
      (c->feature_groups > 1 && c->batch_groups > 1) || !crop(c, &g, &p->lhs_off) ||
      !distinct(c->lhs_dims, c->lhs_strides, nd) || !distinct(c->rhs_dims, c->rhs_strides, nd) ||
      !distinct(c->out_dims, c->out_strides, nd) || !stage_fits(c, &g))
    return;
  const char *env = getenv("KILN_CPU_CONV_BWD"); /* "0": the staged form only (to compare) */
  if (!(env && strcmp(env, "0") == 0) && plan_bwd(p)) return;
  crop(c, &g, &p->lhs_off); /* plan_bwd's failure reset the offset */
  p->library = true;
  if (plan_input(p, &g) != dnnl_success || plan_weights_output(p, &g) != dnnl_success ||
      plan_conv(p, &g) != dnnl_success)
    release(p);
}

void kiln__cpu_conv_destroy(kiln__cpu_conv *p) {
  if (p == NULL) return;
  release(p);
  kiln_free(p);
}

/* One primitive of the plan: from (src_arg) to (dst_arg), with weights
 * when wmd is not NULL and the scratchpad when it has one. */
static dnnl_status_t exec(dnnl_primitive_t prim, const dnnl_memory_desc_t *from, void *src,
                          int src_arg, const dnnl_memory_desc_t *wmd, const void *wei,
                          const dnnl_memory_desc_t *to, void *dst, int dst_arg,
                          const dnnl_memory_desc_t *smd, void *scratch) {
  kiln__dnnl_arg args[4];
  int n = 0;
  args[n++] = (kiln__dnnl_arg){src_arg, from, src};
  if (wmd) args[n++] = (kiln__dnnl_arg){DNNL_ARG_WEIGHTS, wmd, wei};
  args[n++] = (kiln__dnnl_arg){dst_arg, to, dst};
  if (smd->ndims > 0) args[n++] = (kiln__dnnl_arg){DNNL_ARG_SCRATCHPAD, smd, scratch};
  return kiln__dnnl_exec(prim, args, n);
}

static int run_library(const kiln__cpu_conv *p, const void *lhs, const void *rhs, void *out,
                       kiln_status *st) {
  size_t at[6], total = 0;
  size_t sizes[6] = {p->stage_bytes, p->src_bytes,     p->wei_bytes,
                     p->dst_bytes,   p->scratch_bytes, p->flip_bytes};
  for (int i = 0; i < 6; i++) {
    at[i] = total;
    total += align64(sizes[i]);
  }
  void *raw = NULL;
  char *buf = total ? kiln__cpu_aligned_alloc(total, &raw) : NULL;
  if (total && buf == NULL) return kiln_status_set(st, KILN_ENOMEM, "conv", "out of memory");
  char *stage = buf + at[0], *src = buf + at[1], *wei = buf + at[2], *dst = buf + at[3];
  char *scratch = buf + at[4], *flip = buf + at[5];
  dnnl_status_t rc = dnnl_success;
  void *x = (float *)lhs + p->lhs_off;
  if (p->prim[P_STAGE]) {
    if (p->stage_zero) memset(stage, 0, p->stage_bytes);
    rc = exec(p->prim[P_STAGE], &p->lhs_md, x, DNNL_ARG_FROM, NULL, NULL, &p->stage_md,
              (float *)stage + p->stage_off, DNNL_ARG_TO, &p->scratch_md[P_STAGE], scratch);
    x = stage;
  }
  if (rc == dnnl_success && p->prim[P_SRC]) {
    rc = exec(p->prim[P_SRC], &p->src_md, x, DNNL_ARG_FROM, NULL, NULL, &p->conv_src_md, src,
              DNNL_ARG_TO, &p->scratch_md[P_SRC], scratch);
    x = src;
  }
  const void *w = rhs;
  if (p->bwd) {
    flip_weights(&p->c, rhs, (float *)flip);
    w = flip;
  }
  if (rc == dnnl_success && p->prim[P_WEI]) {
    rc = exec(p->prim[P_WEI], &p->wei_md, (void *)w, DNNL_ARG_FROM, NULL, NULL, &p->conv_wei_md,
              wei, DNNL_ARG_TO, &p->scratch_md[P_WEI], scratch);
    w = wei;
  }
  void *y = p->prim[P_DST] ? (void *)dst : out;
  if (rc == dnnl_success)
    rc = exec(p->prim[P_CONV], &p->conv_src_md, x, p->bwd ? DNNL_ARG_DIFF_DST : DNNL_ARG_SRC,
              &p->conv_wei_md, w, &p->conv_dst_md, y, p->bwd ? DNNL_ARG_DIFF_SRC : DNNL_ARG_DST,
              &p->scratch_md[P_CONV], scratch);
  if (rc == dnnl_success && p->prim[P_DST])
    rc = exec(p->prim[P_DST], &p->conv_dst_md, dst, DNNL_ARG_FROM, NULL, NULL, &p->dst_md, out,
              DNNL_ARG_TO, &p->scratch_md[P_DST], scratch);
  kiln_free(raw);
  if (rc != dnnl_success)
    return kiln_status_set(st, KILN_EINTERNAL, "conv", "oneDNN convolution: status %d", (int)rc);
  return 0;
}

#else /* no oneDNN, or a sanitizer build */

struct kiln__cpu_conv {
  kiln_conv c;
  gemm_plan gemm;
  bool library; /* always false */
};

static void plan_library(kiln__cpu_conv *p) { (void)p; }

void kiln__cpu_conv_destroy(kiln__cpu_conv *p) { kiln_free(p); }

static int run_library(const kiln__cpu_conv *p, const void *lhs, const void *rhs, void *out,
                       kiln_status *st) {
  (void)p, (void)lhs, (void)rhs, (void)out;
  return kiln_status_set(st, KILN_EINTERNAL, "conv", "%s", kiln__dnnl_why());
}

#endif

int kiln__cpu_conv_create(const kiln_conv *c, kiln__cpu_conv **out, const char *where,
                          kiln_status *st) {
  kiln__cpu_conv *p = kiln_calloc(1, sizeof *p);
  if (p == NULL) return kiln_status_set(st, KILN_ENOMEM, where, "out of memory");
  p->c = *c;
  if (!plan_gemm(c, &p->gemm)) plan_library(p);
  *out = p;
  return 0;
}

bool kiln__cpu_conv_uses_library(const kiln__cpu_conv *p) {
  return p && (p->library || p->gemm.on);
}

bool kiln__cpu_conv_uses_gemm(const kiln__cpu_conv *p) { return p && p->gemm.on; }

bool kiln__cpu_conv_uses_bwd(const kiln__cpu_conv *p) {
#if KILN__DNNL
  return p && p->bwd;
#else
  (void)p;
  return false;
#endif
}

int kiln__cpu_conv_run(const kiln__cpu_conv *p, kiln__cpu_pool *pool, const void *lhs,
                       const void *rhs, void *out, kiln_status *st) {
  if (p->gemm.on) {
    run_gemm(&p->gemm, pool, lhs, rhs, out);
    return 0;
  }
  if (p->library) return run_library(p, lhs, rhs, out, st);
  kiln_conv_reference(&p->c, lhs, rhs, out);
  return 0;
}
