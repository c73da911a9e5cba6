/* Kernel steps for one instruction: which kernel shape (loop, in-place
 * update, scatter, sort, topk) or library call (GEMM, CONV, FFT) computes it, which slots
 * its arguments are, and how fusion parameters and constants bind to them.
 *
 * A fusion is one loop kernel whose body inlines the fused computation
 * (several when a multi-output fusion's outputs differ in dims). A dot of
 * f32/f64 whose operands' layouts are row- or column-major matrices (after
 * leading batch dims) becomes a GEMM step; inside a fusion, the GEMM writes
 * a scratch slot that the epilogue kernel then reads. A dynamic-update-slice
 * (alone or at a fusion's root) whose result shares its operand's slot only
 * writes the update; otherwise the operand is copied first.
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/lower_internal.h"

#define MAXA 1024 /* kernel arguments */

typedef struct kb {
  kiln__lctx *c;
  uint32_t slot[MAXA];
  kiln_dtype dt[MAXA];
  uint8_t out[MAXA], shared[MAXA];
  uint32_t n;
  kiln__kbind binds[MAXA];
  uint32_t nbinds;
  uint32_t out_leaf[MAXA], out_arg[MAXA];
  const kiln_shape *out_shape[MAXA];
  uint32_t nouts;
  bool full;
} kb;

static kb *kb_new(kiln__lctx *c) {
  kb *b = kiln_calloc(1, sizeof *b);
  if (b) b->c = c;
  return b;
}

static uint32_t kb_arg(kb *b, uint32_t slot, kiln_dtype dt, bool out) {
  for (uint32_t i = 0; i < b->n; i++)
    if (b->slot[i] == slot && b->dt[i] == dt) {
      b->out[i] |= out;
      return i;
    }
  if (b->n == MAXA) {
    b->full = true;
    return 0;
  }
  b->slot[b->n] = slot;
  b->dt[b->n] = dt;
  b->out[b->n] = out;
  return b->n++;
}

/* Binds instruction `id` (of a kernel body) to the slots of instruction
 * `src`'s leaves (slots[], when given, replace src's own). */
static int kb_bind(kb *b, kiln_id id, const kiln_instr *src, const uint32_t *slots) {
  kiln__lctx *c = b->c;
  const kiln_shape *ls[MAXA];
  uint32_t ns, nl = kiln__lower_leaf_shapes(&src->shape, ls, MAXA);
  const uint32_t *own = kiln_buffer_leaves(c->ba, src->id, &ns);
  if (slots == NULL) slots = own;
  if (nl > MAXA || (slots == own && ns != nl) || b->nbinds == MAXA)
    return kiln__lower_fail(c, src, KILN_EUNIMPL, "too many kernel inputs");
  uint32_t *args = kiln_arena_alloc(c->scratch, (nl + 1) * sizeof *args);
  const kiln_shape **shapes = kiln_arena_alloc(c->scratch, (nl + 1) * sizeof *shapes);
  if (args == NULL || shapes == NULL)
    return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  for (uint32_t k = 0; k < nl; k++) {
    shapes[k] = ls[k];
    args[k] = kiln_shape_is_array(ls[k]) ? kb_arg(b, slots[k], ls[k]->dtype, false) : 0;
  }
  b->binds[b->nbinds++] = (kiln__kbind){id, nl, args, shapes};
  return 0;
}

static int kb_bind_operands(kb *b, const kiln_instr *ins) {
  for (uint32_t j = 0; j < ins->noperands; j++) {
    const kiln_instr *o = b->c->m->instrs[ins->operands[j]];
    int rc = kb_bind(b, o->id, o, NULL);
    if (rc) return rc;
  }
  return 0;
}

/* Fusion parameters bind to the fusion's operands; array constants inside
 * get constant slots of their own. */
static int kb_bind_fusion(kb *b, const kiln_instr *fu) {
  kiln__lctx *c = b->c;
  const kiln_computation *fc = c->m->comps[fu->called[0]];
  for (uint32_t i = 0; i < fc->ninstrs; i++) {
    const kiln_instr *x = c->m->instrs[fc->instrs[i]];
    int rc = 0;
    if (x->op == KILN_OP_PARAMETER) {
      if (x->param_number < 0 || x->param_number >= fu->noperands)
        return kiln__lower_fail(c, fu, KILN_EINVAL, "fused parameter has no operand");
      rc = kb_bind(b, x->id, c->m->instrs[fu->operands[x->param_number]], NULL);
    } else if (x->op == KILN_OP_CONSTANT &&
               !(kiln_shape_is_array(&x->shape) && kiln_shape_elements(&x->shape) == 1)) {
      uint32_t *slots;
      rc = kiln__lower_const_slot(c, x, &slots);
      if (rc == 0) rc = kb_bind(b, x->id, x, slots);
    }
    if (rc) return rc;
  }
  return 0;
}

static void kb_output(kb *b, uint32_t leaf, uint32_t slot, const kiln_shape *s) {
  if (b->nouts == MAXA) {
    b->full = true;
    return;
  }
  b->out_leaf[b->nouts] = leaf;
  b->out_shape[b->nouts] = s;
  b->out_arg[b->nouts++] = kb_arg(b, slot, s->dtype, true);
}

static kiln__kernel_spec kb_spec(kb *b, kiln_id root) {
  for (uint32_t i = 0; i < b->n; i++) {
    b->shared[i] = 0;
    for (uint32_t j = 0; j < b->n; j++) b->shared[i] |= j != i && b->slot[j] == b->slot[i];
  }
  return (kiln__kernel_spec){b->n, b->dt,    b->out,      b->shared,  b->binds,    b->nbinds,
                             root, b->nouts, b->out_leaf, b->out_arg, b->out_shape};
}

static int kb_step(kb *b, uint32_t prog, uint32_t kernel, uint64_t range) {
  if (range == 0) return 0;
  kiln_step s = {.kind = KILN_STEP_KERNEL, .kernel = kernel, .range = range, .nargs = b->n};
  s.args = kiln_arena_memdup(b->c->e->arena, b->slot, (b->n + 1) * sizeof *b->slot);
  if (s.args == NULL) return kiln_status_set(b->c->st, KILN_ENOMEM, "codegen", "out of memory");
  return kiln__lower_step(b->c, prog, &s);
}

static int kb_check(kb *b, const kiln_instr *ins) {
  if (b->full) return kiln__lower_fail(b->c, ins, KILN_EUNIMPL, "too many kernel arguments");
  return 0;
}

/* ---- loop kernels ------------------------------------------------------- */

typedef int (*bind_fn)(kb *b, const kiln_instr *ins);

/* Loop kernels computing `root`'s value into ins's leaves, one kernel per
 * group of leaves with equal dims. */
static int loop_kernels(kiln__lctx *c, uint32_t prog, const kiln_instr *ins, kiln_id root,
                        bind_fn bind, kiln_id extra, uint32_t extra_slot) {
  const kiln_shape *ls[MAXA];
  uint32_t ns, nl = kiln__lower_leaf_shapes(&ins->shape, ls, MAXA);
  const uint32_t *slots = kiln_buffer_leaves(c->ba, ins->id, &ns);
  if (nl > MAXA || nl != ns) return kiln__lower_fail(c, ins, KILN_EUNIMPL, "too many outputs");
  bool done[MAXA] = {false};
  int rc = 0;
  for (uint32_t i = 0; i < nl && rc == 0; i++) {
    if (done[i] || !kiln_shape_is_array(ls[i])) continue;
    kb *b = kb_new(c);
    if (b == NULL) return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
    rc = bind(b, ins);
    if (rc == 0 && extra != KILN_NO_ID) rc = kb_bind(b, extra, c->m->instrs[extra], &extra_slot);
    for (uint32_t j = i; rc == 0 && j < nl; j++) {
      if (done[j] || !kiln_shape_is_array(ls[j]) || !kiln_shape_same_dims(ls[j], ls[i])) continue;
      kb_output(b, j, slots[j], ls[j]);
      done[j] = true;
    }
    if (rc == 0) rc = kb_check(b, ins);
    if (rc == 0) {
      kiln__kernel_spec k = kb_spec(b, root);
      uint32_t kernel;
      uint64_t range;
      rc = kiln__kernel_loop(c->g, &k, &kernel, &range);
      if (rc == 0) rc = kb_step(b, prog, kernel, range);
    }
    kiln_free(b);
  }
  return rc;
}

/* ---- GEMM --------------------------------------------------------------- */

/* Physical dims major to minor. */
static void major_order(const kiln_shape *s, int64_t *out) {
  int64_t m2m[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(s, m2m);
  for (uint32_t k = 0; k < s->rank; k++) out[k] = m2m[s->rank - 1 - k];
}

/* One side of the product: batch dims b (listed order), contracting dim
 * cd, free dim fd (or -1). *t: stored with the contracting dim major
 * (lhs) / minor (rhs), i.e. transposed relative to the logical matrix. */
static bool side(const kiln_shape *s, const kiln_i64s *b, int64_t cd, int64_t fd, bool lhs,
                 bool *t) {
  int64_t p[KILN__EMIT_MAXR];
  uint32_t nb = b ? b->n : 0;
  if (s->rank != nb + 1 + (fd >= 0) || s->rank > KILN__EMIT_MAXR) return false;
  major_order(s, p);
  for (uint32_t i = 0; i < nb; i++)
    if (p[i] != b->v[i]) return false;
  if (fd < 0) {
    *t = false;
    return true;
  }
  if (p[nb] == fd && p[nb + 1] == cd)
    *t = !lhs;
  else if (p[nb] == cd && p[nb + 1] == fd)
    *t = lhs;
  else
    return false;
  return true;
}

static int64_t free_dim(const kiln_shape *s, const kiln_i64s *b, int64_t cd) {
  for (uint32_t d = 0; d < s->rank; d++) {
    bool used = d == cd;
    for (uint32_t i = 0; b && i < b->n; i++) used |= b->v[i] == d;
    if (!used) return d;
  }
  return -1;
}

bool kiln__gemm_plan(const kiln_module *m, const kiln_instr *d, kiln_gemm *g, bool *swap) {
  if (d->op != KILN_OP_DOT || d->noperands != 2) return false;
  const kiln_shape *ls = &m->instrs[d->operands[0]]->shape, *rs = &m->instrs[d->operands[1]]->shape;
  kiln_dtype t = d->shape.dtype;
  if (t == KILN_F32 && ls->dtype == KILN_BF16 && rs->dtype == KILN_BF16) {
    if (!kiln__gemm_shape(m, d, g, swap)) return false;
    g->dtype = KILN_BF16; /* A and B bf16, C f32 (dot_canon's bf16 GEMM) */
    return true;
  }
  if ((t != KILN_F32 && t != KILN_F64) || ls->dtype != t || rs->dtype != t) return false;
  return kiln__gemm_shape(m, d, g, swap);
}

bool kiln__igemm_plan(const kiln_module *m, const kiln_instr *d, kiln_gemm *g, bool *swap) {
  if (d->op != KILN_OP_DOT || d->noperands != 2 || d->shape.dtype != KILN_S32) return false;
  kiln_dtype lt = m->instrs[d->operands[0]]->shape.dtype;
  kiln_dtype rt = m->instrs[d->operands[1]]->shape.dtype;
  if ((lt != KILN_S8 && lt != KILN_U8) || rt != KILN_S8 || !kiln__gemm_shape(m, d, g, swap))
    return false;
  /* Exchanged (C stored transposed), the rhs is A: both must be s8. */
  if (*swap && lt != KILN_S8) return false;
  g->dtype = *swap ? rt : lt;
  return true;
}

bool kiln__gemm_shape(const kiln_module *m, const kiln_instr *d, kiln_gemm *g, bool *swap) {
  if (d->op != KILN_OP_DOT || d->noperands != 2) return false;
  const kiln_shape *ls = &m->instrs[d->operands[0]]->shape, *rs = &m->instrs[d->operands[1]]->shape;
  const kiln_shape *os = &d->shape;
  kiln_dtype t = os->dtype;
  const kiln_i64s *lb = kiln_instr_attr_ints(d, KILN_ATTR_LHS_BATCH_DIMS);
  const kiln_i64s *rb = kiln_instr_attr_ints(d, KILN_ATTR_RHS_BATCH_DIMS);
  const kiln_i64s *lc = kiln_instr_attr_ints(d, KILN_ATTR_LHS_CONTRACTING_DIMS);
  const kiln_i64s *rc = kiln_instr_attr_ints(d, KILN_ATTR_RHS_CONTRACTING_DIMS);
  uint32_t nb = lb ? lb->n : 0;
  if (!lc || !rc || lc->n != 1 || rc->n != 1 || (rb ? rb->n : 0) != nb) return false;
  int64_t lf = free_dim(ls, lb, lc->v[0]), rf = free_dim(rs, rb, rc->v[0]);
  bool ta, tb, tc;
  if (!side(ls, lb, lc->v[0], lf, true, &ta) || !side(rs, rb, rc->v[0], rf, false, &tb))
    return false;
  /* The result: batch dims 0..nb-1, then M (when lhs has a free dim), then N. */
  int64_t p[KILN__EMIT_MAXR];
  if (os->rank != nb + (lf >= 0) + (rf >= 0) || os->rank > KILN__EMIT_MAXR) return false;
  major_order(os, p);
  for (uint32_t i = 0; i < nb; i++)
    if (p[i] != i) return false;
  tc = lf >= 0 && rf >= 0 && p[nb] == nb + 1;
  int64_t M = lf >= 0 ? ls->dims[lf] : 1, N = rf >= 0 ? rs->dims[rf] : 1, K = ls->dims[lc->v[0]];
  int64_t batch = 1;
  for (uint32_t i = 0; i < nb; i++) batch *= os->dims[i];
  if (M == 0 || N == 0 || K == 0 || batch == 0) return false;
  kiln_gemm x = {.dtype = t, .batch = batch, .m = M, .n = N, .k = K, .alpha = 1.0, .beta = 0.0};
  x.trans_a = ta;
  x.trans_b = tb;
  x.lda = ta ? M : K;
  x.ldb = tb ? K : N;
  x.stride_a = M * K;
  x.stride_b = K * N;
  x.stride_c = M * N;
  if (tc) {
    /* C stored column-major: compute C^T = B^T A^T with the operands exchanged. */
    kiln_gemm y = x;
    y.m = N;
    y.n = M;
    y.trans_a = !tb;
    y.lda = x.ldb;
    y.trans_b = !ta;
    y.ldb = x.lda;
    y.stride_a = x.stride_b;
    y.stride_b = x.stride_a;
    x = y;
  }
  x.ldc = x.n;
  *g = x;
  *swap = tc;
  return true;
}

const kiln_instr *kiln__fusion_gemm_dot(const kiln_module *m, const kiln_instr *f) {
  if (f->op != KILN_OP_FUSION || f->ncalled != 1 || f->called[0] >= m->ncomps) return NULL;
  const kiln_computation *fc = m->comps[f->called[0]];
  const kiln_instr *dot = NULL;
  for (uint32_t i = 0; i < fc->ninstrs; i++) {
    const kiln_instr *x = m->instrs[fc->instrs[i]];
    if (x->op != KILN_OP_DOT) continue;
    if (dot) return NULL; /* one GEMM per fusion */
    dot = x;
  }
  if (dot == NULL) return NULL;
  for (uint32_t j = 0; j < 2; j++) {
    const kiln_instr *p = m->instrs[dot->operands[j]];
    if (p->op != KILN_OP_PARAMETER || p->param_number < 0 || p->param_number >= f->noperands)
      return NULL;
    const kiln_instr *src = m->instrs[f->operands[p->param_number]];
    if (!kiln_shape_equal(&src->shape, &p->shape, true)) return NULL;
  }
  kiln_gemm g;
  bool swap;
  return kiln__gemm_plan(m, dot, &g, &swap) ? dot : NULL;
}

/* An epilogue kernel run on each block of C as soon as the GEMM has
 * written it (see KILN_STEP_GEMM): its kernel, range and arguments. */
typedef struct gemm_epi {
  uint32_t kernel;
  uint64_t range;
  const uint32_t *args;
  uint32_t nargs;
} gemm_epi;

static int gemm_step(kiln__lctx *c, uint32_t prog, const kiln_instr *d, uint32_t a, uint32_t b,
                     uint32_t out, const gemm_epi *epi) {
  kiln_gemm g;
  bool swap;
  if (!kiln__gemm_plan(c->m, d, &g, &swap))
    return kiln__lower_fail(c, d, KILN_EINTERNAL, "not a GEMM");
  uint32_t n = 3 + (epi ? epi->nargs : 0);
  uint32_t *args = kiln_arena_alloc(c->e->arena, n * sizeof *args);
  if (args == NULL) return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  args[0] = swap ? b : a;
  args[1] = swap ? a : b;
  args[2] = out;
  if (epi) memcpy(args + 3, epi->args, epi->nargs * sizeof *args);
  kiln_step s = {.kind = KILN_STEP_GEMM, .nargs = n, .gemm = g, .args = args};
  if (epi) {
    s.kernel = epi->kernel;
    s.range = epi->range;
  }
  return kiln__lower_step(c, prog, &s);
}

static uint32_t leaf0(kiln__lctx *c, kiln_id id) {
  uint32_t n;
  const uint32_t *s = kiln_buffer_leaves(c->ba, id, &n);
  return n ? s[0] : KILN_NO_SLOT;
}

/* An 8-bit integer dot as one integer GEMM step (oneDNN's int8 matmul on
 * the cpu backend); *done false leaves it to the kernels. */
static int igemm_step(kiln__lctx *c, uint32_t prog, const kiln_instr *d, bool *done) {
  *done = false;
  kiln_gemm g;
  bool swap;
  if (strcmp(c->g->mod.target->name, "cpu") != 0 || !kiln__igemm_plan(c->m, d, &g, &swap)) return 0;
  uint32_t a = leaf0(c, d->operands[0]), b = leaf0(c, d->operands[1]), out = leaf0(c, d->id);
  if (a == KILN_NO_SLOT || b == KILN_NO_SLOT || out == KILN_NO_SLOT) return 0;
  uint32_t *args = kiln_arena_alloc(c->e->arena, 3 * sizeof *args);
  if (args == NULL) return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  args[0] = swap ? b : a;
  args[1] = swap ? a : b;
  args[2] = out;
  kiln_step s = {.kind = KILN_STEP_GEMM, .nargs = 3, .gemm = g, .args = args};
  *done = true;
  return kiln__lower_step(c, prog, &s);
}

/* A convolution as one CONV step (through oneDNN on the cpu backend), when
 * the build has the library and the step can describe it; *done false
 * leaves it to the loop kernel. */
static int conv_step(kiln__lctx *c, uint32_t prog, const kiln_instr *ins, bool *done) {
  *done = false;
#ifdef KILN_HAVE_DNNL
  kiln_conv cv;
  if (strcmp(c->g->mod.target->name, "cpu") != 0 || !kiln__conv_plan(c->m, ins, &cv)) return 0;
  uint32_t args[3] = {leaf0(c, ins->operands[0]), leaf0(c, ins->operands[1]), leaf0(c, ins->id)};
  if (args[0] == KILN_NO_SLOT || args[1] == KILN_NO_SLOT || args[2] == KILN_NO_SLOT) return 0;
  kiln_step s = {.kind = KILN_STEP_CONV, .nargs = 3};
  s.args = kiln_arena_memdup(c->e->arena, args, sizeof args);
  s.conv = kiln_arena_memdup(c->e->arena, &cv, sizeof cv);
  if (s.args == NULL || s.conv == NULL)
    return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  *done = true;
  return kiln__lower_step(c, prog, &s);
#else
  (void)c, (void)prog, (void)ins;
  return 0;
#endif
}

/* fft: one FFT step (a library call on cpu); refused with the reason when
 * the instruction does not describe one. */
static int fft_step(kiln__lctx *c, uint32_t prog, const kiln_instr *ins) {
  kiln_fft f;
  const char *why = kiln__fft_plan(c->m, ins, &f);
  if (why)
    return kiln__lower_fail(c, ins, KILN_EUNIMPL, "the %s backend cannot compile this fft: %s",
                            c->g->mod.target->name, why);
  if (strcmp(c->g->mod.target->name, "cpu") != 0)
    return kiln__lower_fail(c, ins, KILN_EUNIMPL, "the %s backend cannot compile fft yet",
                            c->g->mod.target->name);
  if (kiln_shape_elements(&ins->shape) == 0) return 0;
  uint32_t args[2] = {leaf0(c, ins->operands[0]), leaf0(c, ins->id)};
  if (args[0] == KILN_NO_SLOT || args[1] == KILN_NO_SLOT)
    return kiln__lower_fail(c, ins, KILN_EINTERNAL, "operand or result has no slot");
  kiln_step s = {.kind = KILN_STEP_FFT, .nargs = 2};
  s.args = kiln_arena_memdup(c->e->arena, args, sizeof args);
  s.fft = kiln_arena_memdup(c->e->arena, &f, sizeof f);
  if (s.args == NULL || s.fft == NULL)
    return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  return kiln__lower_step(c, prog, &s);
}

/* A LAPACK custom call, cholesky or triangular-solve: one LINALG step (a
 * LAPACK call per matrix on cpu); refused with the reason otherwise. */
static int linalg_step(kiln__lctx *c, uint32_t prog, const kiln_instr *ins) {
  const char *tname = c->g->mod.target->name;
  const char *what = ins->op == KILN_OP_CUSTOM_CALL ? "LAPACK call" : kiln_opcode_name(ins->op);
  if (strcmp(tname, "cpu") != 0)
    return kiln__lower_fail(c, ins, KILN_EUNIMPL, "the %s backend cannot compile %s yet", tname,
                            what);
  kiln_linalg g;
  char why[256];
  if (kiln__linalg_plan(c->m, ins, &g, why, sizeof why))
    return kiln__lower_fail(c, ins, KILN_EUNIMPL, "the %s backend cannot compile this %s: %s",
                            tname, what, why);
  uint32_t args[KILN_LAPACK_MAX_ARGS], nops = ins->noperands, nres;
  const uint32_t *res = kiln_buffer_leaves(c->ba, ins->id, &nres);
  if (nops + nres != g.l.nargs)
    return kiln__lower_fail(c, ins, KILN_EINTERNAL, "result has %u leaves, expected %u", nres,
                            g.l.nargs - nops);
  for (uint32_t i = 0; i < nops; i++) args[i] = leaf0(c, ins->operands[i]);
  for (uint32_t i = 0; i < nres; i++) args[nops + i] = res[i];
  for (uint32_t i = 0; i < g.l.nargs; i++)
    if (args[i] == KILN_NO_SLOT)
      return kiln__lower_fail(c, ins, KILN_EINTERNAL, "operand or result has no slot");
  kiln_step s = {.kind = KILN_STEP_LINALG, .nargs = g.l.nargs};
  s.args = kiln_arena_memdup(c->e->arena, args, g.l.nargs * sizeof *args);
  s.linalg = kiln_arena_memdup(c->e->arena, &g, sizeof g);
  if (s.args == NULL || s.linalg == NULL)
    return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  return kiln__lower_step(c, prog, &s);
}

/* ---- fusions ------------------------------------------------------------ */

static int bind_fusion_cb(kb *b, const kiln_instr *ins) { return kb_bind_fusion(b, ins); }
static int bind_operands_cb(kb *b, const kiln_instr *ins) { return kb_bind_operands(b, ins); }

static const kiln_instr *fused_operand(kiln__lctx *c, const kiln_instr *fu, const kiln_instr *x) {
  if (x->op != KILN_OP_PARAMETER || x->param_number < 0 || x->param_number >= fu->noperands)
    return NULL;
  return c->m->instrs[fu->operands[x->param_number]];
}

/* In-place dynamic-update-slice: copy the operand into the result unless
 * they already share a slot, then write the update. */
static int dus_kernel(kiln__lctx *c, uint32_t prog, const kiln_instr *ins, const kiln_instr *dus,
                      const kiln_instr *operand, bind_fn bind) {
  uint32_t out = leaf0(c, ins->id), src = leaf0(c, operand->id);
  int rc = kiln__lower_copy(c, prog, out, src, (uint64_t)kiln_shape_bytes(&ins->shape));
  kb *b = rc ? NULL : kb_new(c);
  if (rc || b == NULL)
    return rc ? rc : kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  rc = bind(b, ins);
  kb_output(b, 0, out, &ins->shape);
  if (rc == 0) rc = kb_check(b, ins);
  if (rc == 0) {
    kiln__kernel_spec k = kb_spec(b, dus->id);
    uint32_t kernel;
    uint64_t range;
    bool done = false;
    if (dus == ins) rc = kiln__kernel_window_copy(c->g, &k, &kernel, &range, &done);
    if (rc == 0 && !done) rc = kiln__kernel_dus(c->g, &k, dus->id, &kernel, &range);
    if (rc == 0) rc = kb_step(b, prog, kernel, range);
  }
  kiln_free(b);
  return rc;
}

/* dynamic-slice: copies of contiguous runs where the operand's layout is
 * the result's, else a loop kernel. */
static int ds_kernel(kiln__lctx *c, uint32_t prog, const kiln_instr *ins) {
  kb *b = kb_new(c);
  if (b == NULL) return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  int rc = kb_bind_operands(b, ins);
  kb_output(b, 0, leaf0(c, ins->id), &ins->shape);
  if (rc == 0) rc = kb_check(b, ins);
  bool done = false;
  if (rc == 0) {
    kiln__kernel_spec k = kb_spec(b, ins->id);
    uint32_t kernel;
    uint64_t range;
    rc = kiln__kernel_window_copy(c->g, &k, &kernel, &range, &done);
    if (rc == 0 && done) rc = kb_step(b, prog, kernel, range);
  }
  kiln_free(b);
  if (rc || done) return rc;
  return loop_kernels(c, prog, ins, ins->id, bind_operands_cb, KILN_NO_ID, 0);
}

/* scatter: operands copied into the results, then one kernel (or, for a row
 * scatter, one sorting its updates by block and one applying them). */
static int scatter_kernel(kiln__lctx *c, uint32_t prog, const kiln_instr *ins, const kiln_instr *sc,
                          const kiln_instr *const *operands, bind_fn bind) {
  uint32_t n = (sc->noperands - 1) / 2, ns;
  const kiln_shape *ls[MAXA];
  const uint32_t *outs = kiln_buffer_leaves(c->ba, ins->id, &ns);
  uint32_t nl = kiln__lower_leaf_shapes(&ins->shape, ls, MAXA);
  if (ns != n || nl != n || n == 0 || n > MAXA)
    return kiln__lower_fail(c, ins, KILN_EINVAL, "results must match the inputs");
  for (uint32_t k = 0; k < n; k++) {
    if (!kiln__same_layout(&operands[k]->shape, ls[k]))
      return kiln__lower_fail(c, ins, KILN_EUNIMPL,
                              "the %s backend cannot scatter between layouts yet",
                              c->g->mod.target->name);
    int rc = kiln__lower_copy(c, prog, outs[k], leaf0(c, operands[k]->id),
                              (uint64_t)kiln_shape_bytes(ls[k]));
    if (rc) return rc;
  }
  kb *b = kb_new(c);
  if (b == NULL) return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  int rc = bind(b, ins);
  for (uint32_t k = 0; k < n; k++) kb_output(b, k, outs[k], ls[k]);
  if (rc == 0) rc = kb_check(b, ins);
  /* A row scatter has scratch for its updates sorted by block of rows. */
  uint32_t scratch = c->ba->scratch_slot[ins->id];
  uint32_t sarg = scratch != KILN_NO_SLOT ? kb_arg(b, scratch, KILN_S32, true) : 0;
  if (rc == 0) rc = kb_check(b, ins);
  if (rc == 0 && scratch != KILN_NO_SLOT) {
    kiln__kernel_spec k = kb_spec(b, sc->id);
    uint32_t kernels[2];
    uint64_t ranges[2];
    rc = kiln__kernel_scatter_rows(c->g, &k, sarg, kernels, ranges);
    if (rc == 0) rc = kb_step(b, prog, kernels[0], ranges[0]);
    if (rc == 0) rc = kb_step(b, prog, kernels[1], ranges[1]);
  } else if (rc == 0) {
    kiln__kernel_spec k = kb_spec(b, sc->id);
    uint32_t kernel;
    uint64_t range;
    rc = kiln__kernel_scatter(c->g, &k, &kernel, &range);
    if (rc == 0) rc = kb_step(b, prog, kernel, range);
  }
  kiln_free(b);
  return rc;
}

/* Whether fusion fu's epilogue (everything after dot d) can run on each
 * block of C as the GEMM writes it: on the cpu backend; a single array
 * result laid out as the dot's, so that iteration ranges of the epilogue
 * kernel are ranges of C; every value computed from the dot elementwise
 * on the dot's dims, so that a block of the result reads only the same
 * block of C; and a result that is neither GEMM operand, which later
 * blocks still read. */
static bool slots_overlap(const kiln__lctx *c, uint32_t x, uint32_t y) {
  if (x == y) return true;
  if (x >= c->nslots || y >= c->nslots) return true;
  const kiln_slot *a = &c->slots[x], *b = &c->slots[y];
  if (a->kind != b->kind || a->kind != KILN_SLOT_TEMP) return false;
  return a->offset < b->offset + b->size && b->offset < a->offset + a->size;
}

static bool epilogue_fits(kiln__lctx *c, const kiln_instr *fu, const kiln_instr *d, uint32_t sa,
                          uint32_t sb) {
  if (strcmp(c->g->mod.target->name, "cpu") != 0 || !kiln_shape_is_array(&fu->shape) ||
      !kiln_shape_same_dims(&fu->shape, &d->shape) || !kiln__same_layout(&fu->shape, &d->shape))
    return false;
  uint32_t out = leaf0(c, fu->id);
  if (out == KILN_NO_SLOT || sa == KILN_NO_SLOT || sb == KILN_NO_SLOT ||
      slots_overlap(c, out, sa) || slots_overlap(c, out, sb))
    return false;
  const kiln_computation *fc = c->m->comps[fu->called[0]];
  bool *dep = kiln_arena_alloc(c->scratch, (c->m->ninstrs + 1) * sizeof *dep);
  if (dep == NULL) return false;
  memset(dep, 0, (c->m->ninstrs + 1) * sizeof *dep);
  dep[d->id] = true;
  for (uint32_t i = 0; i < fc->ninstrs; i++) {
    const kiln_instr *x = c->m->instrs[fc->instrs[i]];
    if (x == d) continue;
    for (uint32_t j = 0; j < x->noperands; j++) dep[x->id] |= dep[x->operands[j]];
    if (dep[x->id] &&
        (!(kiln_opcode_flags(x->op) & KILN_OPF_ELEMENTWISE) || !kiln_shape_is_array(&x->shape) ||
         !kiln_shape_same_dims(&x->shape, &d->shape)))
      return false;
  }
  return dep[fc->root];
}

/* The GEMM step of fusion fu with its epilogue fused in: the epilogue's
 * loop kernel is made as loop_kernels would make it, but runs inside the
 * GEMM step, over the iterations of each block of C. A kernel whose
 * iterations do not cut C's rows into whole numbers of iterations (it
 * cannot happen for a flat or row-form kernel over the dot's layout, but
 * is checked) is run after the GEMM instead. */
static int gemm_epilogue(kiln__lctx *c, uint32_t prog, const kiln_instr *fu, const kiln_instr *root,
                         const kiln_instr *d, uint32_t sa, uint32_t sb, uint32_t out) {
  kiln_gemm g;
  bool swap;
  if (!kiln__gemm_plan(c->m, d, &g, &swap))
    return kiln__lower_fail(c, d, KILN_EINTERNAL, "not a GEMM");
  kb *b = kb_new(c);
  if (b == NULL) return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  int rc = kb_bind_fusion(b, fu);
  if (rc == 0) rc = kb_bind(b, d->id, d, &out);
  kb_output(b, 0, leaf0(c, fu->id), &fu->shape);
  if (rc == 0) rc = kb_check(b, fu);
  gemm_epi epi = {0};
  if (rc == 0) {
    kiln__kernel_spec k = kb_spec(b, root->id);
    rc = kiln__kernel_loop(c->g, &k, &epi.kernel, &epi.range);
  }
  if (rc == 0) {
    uint64_t total = (uint64_t)kiln_shape_elements(&fu->shape);
    uint64_t unit = epi.range ? total / epi.range : 0;
    epi.args = b->slot;
    epi.nargs = b->n;
    bool blocks = unit > 0 && unit * epi.range == total && g.n % (int64_t)unit == 0;
    if (blocks) {
      rc = gemm_step(c, prog, d, sa, sb, out, &epi);
    } else {
      rc = gemm_step(c, prog, d, sa, sb, out, NULL);
      if (rc == 0) rc = kb_step(b, prog, epi.kernel, epi.range);
    }
  }
  kiln_free(b);
  return rc;
}

static int lower_fusion(kiln__lctx *c, uint32_t prog, const kiln_instr *fu) {
  if (fu->ncalled != 1 || fu->called[0] >= c->m->ncomps)
    return kiln__lower_fail(c, fu, KILN_EINVAL, "fusion needs one computation");
  const kiln_instr *root = kiln_computation_root(c->m, c->m->comps[fu->called[0]]);
  if (root == NULL) return kiln__lower_fail(c, fu, KILN_EINVAL, "fused computation has no root");
  if (root->op == KILN_OP_DYNAMIC_UPDATE_SLICE) {
    const kiln_instr *op = fused_operand(c, fu, c->m->instrs[root->operands[0]]);
    if (op && kiln__same_layout(&op->shape, &fu->shape) && op->shape.dtype == fu->shape.dtype)
      return dus_kernel(c, prog, fu, root, op, bind_fusion_cb);
  }
  if (root->op == KILN_OP_SCATTER) {
    uint32_t n = (root->noperands - 1) / 2;
    const kiln_instr *ops[MAXA];
    bool ok = n > 0 && n <= MAXA;
    for (uint32_t k = 0; ok && k < n; k++)
      ok = (ops[k] = fused_operand(c, fu, c->m->instrs[root->operands[k]])) != NULL;
    if (ok) return scatter_kernel(c, prog, fu, root, ops, bind_fusion_cb);
  }
  const kiln_instr *d = kiln__fusion_gemm_dot(c->m, fu);
  if (d == NULL) return loop_kernels(c, prog, fu, root->id, bind_fusion_cb, KILN_NO_ID, 0);
  const kiln_instr *pa = fused_operand(c, fu, c->m->instrs[d->operands[0]]);
  const kiln_instr *pb = fused_operand(c, fu, c->m->instrs[d->operands[1]]);
  uint32_t out = d == root ? leaf0(c, fu->id) : c->ba->scratch_slot[fu->id];
  if (out == KILN_NO_SLOT) return kiln__lower_fail(c, fu, KILN_EINTERNAL, "no GEMM scratch slot");
  uint32_t sa = leaf0(c, pa->id), sb = leaf0(c, pb->id);
  if (d == root) return gemm_step(c, prog, d, sa, sb, out, NULL);
  /* The epilogue reads the GEMM's result from the scratch slot: in the
   * GEMM's own output pass, block by block, when it can; else after it. */
  if (epilogue_fits(c, fu, d, sa, sb)) return gemm_epilogue(c, prog, fu, root, d, sa, sb, out);
  int rc = gemm_step(c, prog, d, sa, sb, out, NULL);
  if (rc) return rc;
  return loop_kernels(c, prog, fu, root->id, bind_fusion_cb, d->id, out);
}

/* ---- single instructions ------------------------------------------------ */

static int sort_kernel(kiln__lctx *c, uint32_t prog, const kiln_instr *ins) {
  uint32_t n = ins->noperands, ns;
  const kiln_shape *ls[MAXA];
  const uint32_t *outs = kiln_buffer_leaves(c->ba, ins->id, &ns);
  uint32_t nl = kiln__lower_leaf_shapes(&ins->shape, ls, MAXA);
  uint32_t scratch = c->ba->scratch_slot[ins->id];
  if (n == 0 || ns != n || nl != n || n > MAXA)
    return kiln__lower_fail(c, ins, KILN_EINVAL, "results must match the operands");
  if (scratch == KILN_NO_SLOT) return 0; /* nothing to sort */
  kb *b = kb_new(c);
  if (b == NULL) return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  int rc = kb_bind_operands(b, ins);
  for (uint32_t k = 0; k < n; k++) kb_output(b, k, outs[k], ls[k]);
  uint32_t sarg = kb_arg(b, scratch, KILN_S64, true);
  if (rc == 0) rc = kb_check(b, ins);
  if (rc == 0) {
    kiln__kernel_spec k = kb_spec(b, ins->id);
    uint32_t kernel;
    uint64_t range;
    rc = kiln__kernel_sort(c->g, &k, sarg, &kernel, &range);
    if (rc == 0) rc = kb_step(b, prog, kernel, range);
  }
  kiln_free(b);
  return rc;
}

/* topk: the operand bound, the two result leaves the outputs. */
static int topk_kernel(kiln__lctx *c, uint32_t prog, const kiln_instr *ins) {
  uint32_t ns;
  const kiln_shape *ls[MAXA];
  const uint32_t *outs = kiln_buffer_leaves(c->ba, ins->id, &ns);
  uint32_t nl = kiln__lower_leaf_shapes(&ins->shape, ls, MAXA);
  if (ins->noperands != 1 || ns != 2 || nl != 2 || !kiln_shape_is_array(ls[0]) ||
      !kiln_shape_is_array(ls[1]))
    return kiln__lower_fail(c, ins, KILN_EINVAL, "needs one operand and (values, indices)");
  kb *b = kb_new(c);
  if (b == NULL) return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  int rc = kb_bind_operands(b, ins);
  for (uint32_t k = 0; k < 2; k++) kb_output(b, k, outs[k], ls[k]);
  if (rc == 0) rc = kb_check(b, ins);
  if (rc == 0) {
    kiln__kernel_spec k = kb_spec(b, ins->id);
    uint32_t kernel;
    uint64_t range;
    rc = kiln__kernel_topk(c->g, &k, &kernel, &range);
    if (rc == 0) rc = kb_step(b, prog, kernel, range);
  }
  kiln_free(b);
  return rc;
}

/* A kernel of kernel_special.c that takes ins's operands bound and writes
 * its one array result: select-and-scatter, a prefix scan, an integer dot.
 * fn makes the kernel from the spec and ctx. */
typedef int (*special_fn)(kiln__codegen *g, const kiln__kernel_spec *k, const void *ctx,
                          uint32_t *kernel, uint64_t *range);

static int special_kernel(kiln__lctx *c, uint32_t prog, const kiln_instr *ins, special_fn fn,
                          const void *ctx) {
  if (!kiln_shape_is_array(&ins->shape))
    return kiln__lower_fail(c, ins, KILN_EINVAL, "result must be an array");
  kb *b = kb_new(c);
  if (b == NULL) return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  int rc = kb_bind_operands(b, ins);
  kb_output(b, 0, leaf0(c, ins->id), &ins->shape);
  if (rc == 0) rc = kb_check(b, ins);
  if (rc == 0) {
    kiln__kernel_spec k = kb_spec(b, ins->id);
    uint32_t kernel;
    uint64_t range;
    rc = fn(c->g, &k, ctx, &kernel, &range);
    if (rc == 0) rc = kb_step(b, prog, kernel, range);
  }
  kiln_free(b);
  return rc;
}

static int select_scatter_fn(kiln__codegen *g, const kiln__kernel_spec *k, const void *ctx,
                             uint32_t *kernel, uint64_t *range) {
  (void)ctx;
  return kiln__kernel_select_scatter(g, k, kernel, range);
}

/* ctx: the scanned dim (kiln_reduce_window_is_scan). */
static int scan_fn(kiln__codegen *g, const kiln__kernel_spec *k, const void *ctx, uint32_t *kernel,
                   uint64_t *range) {
  return kiln__kernel_scan(g, k, *(const uint32_t *)ctx, kernel, range);
}

/* ctx: the integer dot's kiln__gemm_shape plan. */
static int idot_fn(kiln__codegen *g, const kiln__kernel_spec *k, const void *ctx, uint32_t *kernel,
                   uint64_t *range) {
  return kiln__kernel_idot(g, k, ctx, kernel, range);
}

int kiln__lower_compute(kiln__lctx *c, uint32_t prog, const kiln_instr *ins) {
  switch (ins->op) {
  case KILN_OP_FUSION: return lower_fusion(c, prog, ins);
  case KILN_OP_DOT: {
    kiln_gemm g;
    bool swap;
    if (kiln__gemm_plan(c->m, ins, &g, &swap))
      return gemm_step(c, prog, ins, leaf0(c, ins->operands[0]), leaf0(c, ins->operands[1]),
                       leaf0(c, ins->id), NULL);
    bool done;
    int rc = igemm_step(c, prog, ins, &done);
    if (rc || done) return rc;
    if (kiln__idot_ok(c->m, ins) && kiln__gemm_shape(c->m, ins, &g, &swap) && !swap &&
        !(g.trans_a && g.trans_b))
      return special_kernel(c, prog, ins, idot_fn, &g);
    break;
  }
  case KILN_OP_CONVOLUTION: {
    bool done;
    int rc = conv_step(c, prog, ins, &done);
    if (rc || done) return rc;
    break;
  }
  case KILN_OP_SORT: return sort_kernel(c, prog, ins);
  case KILN_OP_TOPK: return topk_kernel(c, prog, ins);
  case KILN_OP_FFT: return fft_step(c, prog, ins);
  case KILN_OP_CHOLESKY:
  case KILN_OP_TRIANGULAR_SOLVE: return linalg_step(c, prog, ins);
  case KILN_OP_CUSTOM_CALL:
    if (kiln_lapack_is(ins)) return linalg_step(c, prog, ins);
    break;
  case KILN_OP_SELECT_AND_SCATTER: return special_kernel(c, prog, ins, select_scatter_fn, NULL);
  case KILN_OP_REDUCE_WINDOW: {
    uint32_t dim;
    if (kiln_reduce_window_is_scan(c->m, ins, &dim))
      return special_kernel(c, prog, ins, scan_fn, &dim);
    break;
  }
  case KILN_OP_SCATTER: {
    uint32_t n = (ins->noperands - 1) / 2;
    const kiln_instr *ops[MAXA];
    if (n == 0 || n > MAXA || ins->noperands % 2 == 0)
      return kiln__lower_fail(c, ins, KILN_EINVAL, "needs inputs, indices and updates");
    for (uint32_t k = 0; k < n; k++) ops[k] = c->m->instrs[ins->operands[k]];
    return scatter_kernel(c, prog, ins, ins, ops, bind_operands_cb);
  }
  case KILN_OP_DYNAMIC_SLICE:
    if (kiln_shape_is_array(&ins->shape)) return ds_kernel(c, prog, ins);
    break;
  case KILN_OP_DYNAMIC_UPDATE_SLICE: {
    const kiln_instr *op = c->m->instrs[ins->operands[0]];
    if (kiln__same_layout(&op->shape, &ins->shape) && op->shape.dtype == ins->shape.dtype)
      return dus_kernel(c, prog, ins, ins, op, bind_operands_cb);
    break;
  }
  default: break;
  }
  return loop_kernels(c, prog, ins, ins->id, bind_operands_cb, KILN_NO_ID, 0);
}
