/* The CONV step on the cpu backend, through oneDNN's convolution.
 *
 * At load each step gets a plan: oneDNN memory descriptors built from the
 * step's per-role sizes and strides (so every dim_labels permutation and
 * layout is described as it lies in memory, without a copy), and the
 * primitives, made once. What oneDNN cannot take directly is transformed:
 *  - negative padding crops the input: the view starts further in and is
 *    shorter, padding what is left is non-negative;
 *  - lhs dilation (transposed convolution, used by gradients) and batch
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
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "executor/cpu/cpu.h"

#if defined(__SANITIZE_ADDRESS__)
#define KILN__ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN__ASAN 1
#endif
#endif
#ifndef KILN__ASAN
#define KILN__ASAN 0
#endif

#ifdef KILN_HAVE_DNNL
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include <dnnl.h>

/* oneDNN is opened at the first plan, not linked: its OpenMP runtime
 * (libgomp) reads OMP_WAIT_POLICY when it is loaded, and the default
 * policy keeps oneDNN's idle threads spinning after every primitive,
 * taking the cores from the device pool's kernels that run next (a
 * convnet ran 10x slower so on a loaded 2-core machine). The plan sets
 * the policy to passive first unless the environment already says. */
/* clang-format off */
#define DNNL_FNS(X) \
  X(dnnl_dilated_convolution_forward_desc_init) \
  X(dnnl_engine_create) \
  X(dnnl_memory_create) \
  X(dnnl_memory_desc_equal) \
  X(dnnl_memory_desc_get_size) \
  X(dnnl_memory_desc_init_by_strides) \
  X(dnnl_memory_desc_init_by_tag) \
  X(dnnl_memory_destroy) \
  X(dnnl_primitive_attr_create) \
  X(dnnl_primitive_attr_destroy) \
  X(dnnl_primitive_attr_set_scratchpad_mode) \
  X(dnnl_primitive_create) \
  X(dnnl_primitive_desc_create) \
  X(dnnl_primitive_desc_destroy) \
  X(dnnl_primitive_desc_query) \
  X(dnnl_primitive_desc_query_md) \
  X(dnnl_primitive_destroy) \
  X(dnnl_primitive_execute) \
  X(dnnl_reorder_primitive_desc_create) \
  X(dnnl_stream_create) \
  X(dnnl_stream_destroy) \
  X(dnnl_stream_wait)
/* clang-format on */
#define DECLARE(f) static __typeof__(f) *p_##f;
DNNL_FNS(DECLARE)
#undef DECLARE
#define dnnl_dilated_convolution_forward_desc_init p_dnnl_dilated_convolution_forward_desc_init
#define dnnl_engine_create p_dnnl_engine_create
#define dnnl_memory_create p_dnnl_memory_create
#define dnnl_memory_desc_equal p_dnnl_memory_desc_equal
#define dnnl_memory_desc_get_size p_dnnl_memory_desc_get_size
#define dnnl_memory_desc_init_by_strides p_dnnl_memory_desc_init_by_strides
#define dnnl_memory_desc_init_by_tag p_dnnl_memory_desc_init_by_tag
#define dnnl_memory_destroy p_dnnl_memory_destroy
#define dnnl_primitive_attr_create p_dnnl_primitive_attr_create
#define dnnl_primitive_attr_destroy p_dnnl_primitive_attr_destroy
#define dnnl_primitive_attr_set_scratchpad_mode p_dnnl_primitive_attr_set_scratchpad_mode
#define dnnl_primitive_create p_dnnl_primitive_create
#define dnnl_primitive_desc_create p_dnnl_primitive_desc_create
#define dnnl_primitive_desc_destroy p_dnnl_primitive_desc_destroy
#define dnnl_primitive_desc_query p_dnnl_primitive_desc_query
#define dnnl_primitive_desc_query_md p_dnnl_primitive_desc_query_md
#define dnnl_primitive_destroy p_dnnl_primitive_destroy
#define dnnl_primitive_execute p_dnnl_primitive_execute
#define dnnl_reorder_primitive_desc_create p_dnnl_reorder_primitive_desc_create
#define dnnl_stream_create p_dnnl_stream_create
#define dnnl_stream_destroy p_dnnl_stream_destroy
#define dnnl_stream_wait p_dnnl_stream_wait

enum { P_STAGE, P_SRC, P_WEI, P_CONV, P_DST, NPRIM };

struct kiln__cpu_conv {
  kiln_conv c;
  bool library;
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

static dnnl_engine_t engine;
static dnnl_status_t engine_status = dnnl_runtime_error;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;

/* Opens oneDNN (KILN_DNNL_LIBRARY from the build, else its soname) and
 * makes the cpu engine; engine_status stays an error when it cannot. */
static void make_engine(void) {
  /* kiln and kilnd set OMP_WAIT_POLICY at start (kiln_cpu_blas_select_core);
   * a process that did not (a test, another program linking the executor)
   * gets it here, before oneDNN's runtime first reads it. setenv is not
   * safe against a concurrent getenv, so it is skipped when already set. */
  if (getenv("OMP_WAIT_POLICY") == NULL) setenv("OMP_WAIT_POLICY", "passive", 0);
  void *h = dlopen(KILN_DNNL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return;
  bool ok = true;
#define RESOLVE(f) ok = ok && (*(void **)&p_##f = dlsym(h, #f)) != NULL;
  DNNL_FNS(RESOLVE)
#undef RESOLVE
  if (ok) engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static dnnl_status_t strided(dnnl_memory_desc_t *md, int n, const dnnl_dims_t dims,
                             const dnnl_dims_t strides) {
  return dnnl_memory_desc_init_by_strides(md, n, dims, dnnl_f32, strides);
}

static dnnl_status_t any(dnnl_memory_desc_t *md, int n, const dnnl_dims_t dims) {
  return dnnl_memory_desc_init_by_tag(md, n, dims, dnnl_f32, dnnl_format_tag_any);
}

static dnnl_status_t make_attr(dnnl_primitive_attr_t *attr) {
  dnnl_status_t s = dnnl_primitive_attr_create(attr);
  if (s == dnnl_success)
    s = dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user);
  return s;
}

/* Makes the primitive of pd into p->prim[k] with its scratchpad; pd is
 * destroyed. */
static dnnl_status_t take_prim(kiln__cpu_conv *p, int k, dnnl_primitive_desc_t pd) {
  const dnnl_memory_desc_t *sm = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  if (sm) p->scratch_md[k] = *sm;
  size_t n = sm ? dnnl_memory_desc_get_size(sm) : 0;
  if (n > p->scratch_bytes) p->scratch_bytes = n;
  dnnl_status_t s = dnnl_primitive_create(&p->prim[k], pd);
  dnnl_primitive_desc_destroy(pd);
  return s;
}

static dnnl_status_t reorder(kiln__cpu_conv *p, int k, const dnnl_memory_desc_t *from,
                             const dnnl_memory_desc_t *to) {
  dnnl_primitive_attr_t attr;
  dnnl_primitive_desc_t pd;
  dnnl_status_t s = make_attr(&attr);
  if (s != dnnl_success) return s;
  s = dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, attr);
  dnnl_primitive_attr_destroy(attr);
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

static bool is_ref(dnnl_primitive_desc_t pd) {
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl)
    return true;
  return strncmp(impl, "ref", 3) == 0;
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
    s = dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference,
                                                   dnnl_convolution_direct, &src, &wei, NULL, &dst,
                                                   g->st, g->dil, g->lo, g->hi);
  dnnl_primitive_attr_t attr;
  if (s == dnnl_success) s = make_attr(&attr);
  if (s != dnnl_success) return s;
  s = dnnl_primitive_desc_create(pd, &cd, attr, engine, NULL);
  dnnl_primitive_attr_destroy(attr);
  return s;
}

static dnnl_status_t plan_conv(kiln__cpu_conv *p, const geo *g) {
  dnnl_primitive_desc_t pd = NULL, alt = NULL;
  dnnl_status_t s = conv_pd(p, g, true, &pd);
  if (s != dnnl_success || is_ref(pd)) {
    if (conv_pd(p, g, false, &alt) == dnnl_success && !is_ref(alt)) {
      if (pd) dnnl_primitive_desc_destroy(pd);
      pd = alt;
      s = dnnl_success;
    } else if (alt) {
      dnnl_primitive_desc_destroy(alt);
    }
  }
  if (s != dnnl_success) return s;
  p->conv_src_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
  p->conv_wei_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  p->conv_dst_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
  if ((s = take_prim(p, P_CONV, pd)) != dnnl_success) return s;
  if (!dnnl_memory_desc_equal(&p->src_md, &p->conv_src_md)) {
    p->src_bytes = dnnl_memory_desc_get_size(&p->conv_src_md);
    if ((s = reorder(p, P_SRC, &p->src_md, &p->conv_src_md)) != dnnl_success) return s;
  }
  if (!dnnl_memory_desc_equal(&p->wei_md, &p->conv_wei_md)) {
    p->wei_bytes = dnnl_memory_desc_get_size(&p->conv_wei_md);
    if ((s = reorder(p, P_WEI, &p->wei_md, &p->conv_wei_md)) != dnnl_success) return s;
  }
  if (!dnnl_memory_desc_equal(&p->dst_md, &p->conv_dst_md)) {
    p->dst_bytes = dnnl_memory_desc_get_size(&p->conv_dst_md);
    if ((s = reorder(p, P_DST, &p->conv_dst_md, &p->dst_md)) != dnnl_success) return s;
  }
  return dnnl_success;
}

static void release(kiln__cpu_conv *p) {
  for (int k = 0; k < NPRIM; k++)
    if (p->prim[k]) dnnl_primitive_destroy(p->prim[k]);
  memset(p->prim, 0, sizeof p->prim);
  p->library = false;
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

static void plan_library(kiln__cpu_conv *p) {
  const kiln_conv *c = &p->c;
  geo g;
  uint32_t nd = c->nspatial + 2;
#if KILN__ASAN
  /* LeakSanitizer's tracer faults at exit in a process with oneDNN's
   * OpenMP threads, and oneDNN is not instrumented: sanitizer builds run
   * the direct loop. */
  (void)g, (void)nd;
  return;
#endif
  pthread_once(&engine_once, make_engine);
  if (engine_status != dnnl_success || c->dtype != KILN_F32 ||
      (c->feature_groups > 1 && c->batch_groups > 1) || !crop(c, &g, &p->lhs_off) ||
      !distinct(c->lhs_dims, c->lhs_strides, nd) || !distinct(c->rhs_dims, c->rhs_strides, nd) ||
      !distinct(c->out_dims, c->out_strides, nd) || !stage_fits(c, &g))
    return;
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

static dnnl_status_t exec(dnnl_stream_t s, dnnl_primitive_t prim, const dnnl_memory_desc_t *from,
                          void *src, int src_arg, const dnnl_memory_desc_t *wmd, const void *wei,
                          const dnnl_memory_desc_t *to, void *dst, int dst_arg,
                          const dnnl_memory_desc_t *smd, void *scratch) {
  dnnl_memory_t m[4] = {NULL, NULL, NULL, NULL};
  dnnl_exec_arg_t args[4];
  int n = 0;
  dnnl_status_t st = dnnl_memory_create(&m[0], from, engine, src);
  args[n++] = (dnnl_exec_arg_t){src_arg, m[0]};
  if (st == dnnl_success && wmd) {
    st = dnnl_memory_create(&m[1], wmd, engine, (void *)wei);
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, m[1]};
  }
  if (st == dnnl_success) st = dnnl_memory_create(&m[2], to, engine, dst);
  args[n++] = (dnnl_exec_arg_t){dst_arg, m[2]};
  if (st == dnnl_success && smd->ndims > 0) {
    st = dnnl_memory_create(&m[3], smd, engine, scratch);
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, m[3]};
  }
  if (st == dnnl_success) st = dnnl_primitive_execute(prim, s, n, args);
  if (st == dnnl_success) st = dnnl_stream_wait(s);
  for (int i = 0; i < 4; i++)
    if (m[i]) dnnl_memory_destroy(m[i]);
  return st;
}

static int run_library(const kiln__cpu_conv *p, const void *lhs, const void *rhs, void *out,
                       kiln_status *st) {
  size_t at[5], total = 0;
  size_t sizes[5] = {p->stage_bytes, p->src_bytes, p->wei_bytes, p->dst_bytes, p->scratch_bytes};
  for (int i = 0; i < 5; i++) {
    at[i] = total;
    total += align64(sizes[i]);
  }
  void *raw = NULL;
  char *buf = total ? kiln__cpu_aligned_alloc(total, &raw) : NULL;
  if (total && buf == NULL) return kiln_status_set(st, KILN_ENOMEM, "conv", "out of memory");
  char *stage = buf + at[0], *src = buf + at[1], *wei = buf + at[2], *dst = buf + at[3];
  char *scratch = buf + at[4];
  dnnl_stream_t s;
  dnnl_status_t rc = dnnl_stream_create(&s, engine, dnnl_stream_default_flags);
  if (rc != dnnl_success) {
    kiln_free(raw);
    return kiln_status_set(st, KILN_EINTERNAL, "conv", "oneDNN stream: status %d", (int)rc);
  }
  void *x = (float *)lhs + p->lhs_off;
  if (p->prim[P_STAGE]) {
    if (p->stage_zero) memset(stage, 0, p->stage_bytes);
    rc = exec(s, p->prim[P_STAGE], &p->lhs_md, x, DNNL_ARG_FROM, NULL, NULL, &p->stage_md,
              (float *)stage + p->stage_off, DNNL_ARG_TO, &p->scratch_md[P_STAGE], scratch);
    x = stage;
  }
  if (rc == dnnl_success && p->prim[P_SRC]) {
    rc = exec(s, p->prim[P_SRC], &p->src_md, x, DNNL_ARG_FROM, NULL, NULL, &p->conv_src_md, src,
              DNNL_ARG_TO, &p->scratch_md[P_SRC], scratch);
    x = src;
  }
  const void *w = rhs;
  if (rc == dnnl_success && p->prim[P_WEI]) {
    rc = exec(s, p->prim[P_WEI], &p->wei_md, (void *)rhs, DNNL_ARG_FROM, NULL, NULL,
              &p->conv_wei_md, wei, DNNL_ARG_TO, &p->scratch_md[P_WEI], scratch);
    w = wei;
  }
  void *y = p->prim[P_DST] ? (void *)dst : out;
  if (rc == dnnl_success)
    rc = exec(s, p->prim[P_CONV], &p->conv_src_md, x, DNNL_ARG_SRC, &p->conv_wei_md, w,
              &p->conv_dst_md, y, DNNL_ARG_DST, &p->scratch_md[P_CONV], scratch);
  if (rc == dnnl_success && p->prim[P_DST])
    rc = exec(s, p->prim[P_DST], &p->conv_dst_md, dst, DNNL_ARG_FROM, NULL, NULL, &p->dst_md, out,
              DNNL_ARG_TO, &p->scratch_md[P_DST], scratch);
  dnnl_stream_destroy(s);
  kiln_free(raw);
  if (rc != dnnl_success)
    return kiln_status_set(st, KILN_EINTERNAL, "conv", "oneDNN convolution: status %d", (int)rc);
  return 0;
}

#else /* !KILN_HAVE_DNNL */

struct kiln__cpu_conv {
  kiln_conv c;
  bool library; /* always false */
};

static void plan_library(kiln__cpu_conv *p) { (void)p; }

void kiln__cpu_conv_destroy(kiln__cpu_conv *p) { kiln_free(p); }

static int run_library(const kiln__cpu_conv *p, const void *lhs, const void *rhs, void *out,
                       kiln_status *st) {
  (void)p, (void)lhs, (void)rhs, (void)out;
  return kiln_status_set(st, KILN_EINTERNAL, "conv", "no oneDNN in this build");
}

#endif

int kiln__cpu_conv_create(const kiln_conv *c, kiln__cpu_conv **out, const char *where,
                          kiln_status *st) {
  kiln__cpu_conv *p = kiln_calloc(1, sizeof *p);
  if (p == NULL) return kiln_status_set(st, KILN_ENOMEM, where, "out of memory");
  p->c = *c;
  plan_library(p);
  *out = p;
  return 0;
}

bool kiln__cpu_conv_uses_library(const kiln__cpu_conv *p) { return p && p->library; }

int kiln__cpu_conv_run(const kiln__cpu_conv *p, const void *lhs, const void *rhs, void *out,
                       kiln_status *st) {
  if (p->library) return run_library(p, lhs, rhs, out, st);
  kiln_conv_reference(&p->c, lhs, rhs, out);
  return 0;
}
