/* Cooperative reductions of the CUDA target (cuda_target.h): a kernel
 * whose outputs are reduces (variadic too: argmax; several over the same
 * input dims and reduced dims: a multi-output fusion's sum and max) over
 * at least KILN__CUDA_COOP_MIN elements per output is written as a block
 * per output element instead of a thread per output element with a
 * sequential loop.
 *
 * Block-stride loop over the outputs [begin, end) (blockIdx.x, step
 * gridDim.x: uniform in a block, so every thread reaches every barrier);
 * for each, thread t combines the reduced positions t, t + blockDim.x, ...
 * in the input's physical order (consecutive threads read consecutive
 * elements when the reduced dims are the minor ones), then the warp
 * combines its 32 partials by __shfl_down_sync (16, 8, 4, 2, 1), lane 0 of
 * each warp leaves its partial in shared memory, and after __syncthreads
 * warp 0 combines those the same way; its lane 0 combines the init value
 * with the total and stores it. A partial carries a flag saying whether
 * its thread saw any element, so the init value is combined exactly once
 * and threads past the reduced extent add nothing, whatever the block size
 * (whole warps: the launch geometry of cuda_backend.c gives 256 threads).
 *
 * The order of combination differs from the interpreter's (row-major, one
 * at a time): exact for integers, min, max, and/or (associative and
 * commutative, as XLA requires of a reducer); a float sum is reassociated,
 * within tests/support/tolerance.h's kiln_tol_reduce_f32. f16/bf16
 * accumulators (rounded after every step) keep the sequential form, whose
 * order is the interpreter's.
 *
 * The kernel declares static shared memory (KSHARED, one 32-entry array
 * per accumulator and one of flags): that is how the launch knows it is
 * cooperative (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES > 0). The names it
 * writes start with "kc" (the emitter's own are v<N>, x<N>, r<N>, o<N>).
 */
#include <stdio.h>
#include <string.h>

#include "compiler/codegen/cuda_target.h"
#include "compiler/codegen/kernel.h"

#define MAX_ACCS 8 /* accumulators of all the kernel's reduces */
#define MAX_REDS 4 /* reduces of one input space in a kernel (a multi-output fusion) */

static uint32_t leaves_of(const kiln_shape *s) {
  if (!kiln_shape_is_tuple(s)) return 1;
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->rank; i++) n += leaves_of(&s->tuple[i]);
  return n;
}

/* The instruction behind leaf *leaf of id's value, through tuples. */
static kiln_id producer(const kiln_module *m, kiln_id id, uint32_t *leaf) {
  for (;;) {
    const kiln_instr *ins = m->instrs[id];
    if (ins->op != KILN_OP_TUPLE) return id;
    uint32_t j = 0;
    for (; j < ins->noperands; j++) {
      uint32_t n = leaves_of(&m->instrs[ins->operands[j]]->shape);
      if (*leaf < n) break;
      *leaf -= n;
    }
    if (j == ins->noperands) return id;
    id = ins->operands[j];
  }
}

static bool coop_type(kiln_dtype t) {
  switch (t) {
  case KILN_PRED:
  case KILN_S8:
  case KILN_S16:
  case KILN_S32:
  case KILN_S64:
  case KILN_U8:
  case KILN_U16:
  case KILN_U32:
  case KILN_U64:
  case KILN_F32:
  case KILN_F64: return true;
  default: return false;
  }
}

typedef struct coop_red {
  const kiln_instr *r;
  uint32_t n, first; /* its accumulators: [first, first + n) of the kernel's */
  uint32_t fn;       /* its reducer's helper (kf<N>) */
} coop_red;

typedef struct coop_plan {
  coop_red red[MAX_REDS];
  uint32_t nred, nacc;
  uint32_t acc_of[MAX_ACCS]; /* per kernel output: the accumulator it stores */
  kiln_dtype t[MAX_ACCS];
  bool reduced[KILN__EMIT_MAXR];
  const kiln_shape *in; /* the input space every reduce shares */
  int64_t extent;       /* reduced positions per output */
} coop_plan;

/* Whether a and b are arrays of the same dims in the same layout (their
 * element types may differ). */
static bool same_space(const kiln_shape *a, const kiln_shape *b) {
  if (!kiln_shape_is_array(a) || !kiln_shape_is_array(b) || a->rank != b->rank ||
      a->rank > KILN__EMIT_MAXR ||
      (a->rank && memcmp(a->dims, b->dims, a->rank * sizeof *a->dims) != 0))
    return false;
  int64_t ma[KILN__EMIT_MAXR], mb[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(a, ma);
  kiln_shape_minor_to_major(b, mb);
  return memcmp(ma, mb, a->rank * sizeof *ma) == 0;
}

/* Adds reduce r (accumulators and types) to the plan: false when the
 * cooperative form does not take it. */
static bool plan_reduce(const kiln_module *m, coop_plan *p, const kiln_instr *r) {
  if (r->op != KILN_OP_REDUCE || r->noperands % 2 || r->noperands == 0 || r->ncalled != 1 ||
      r->called[0] >= m->ncomps || p->nred == MAX_REDS || p->nacc + r->noperands / 2 > MAX_ACCS)
    return false;
  uint32_t n = r->noperands / 2;
  const kiln_computation *c = m->comps[r->called[0]];
  if (kiln_computation_nparams(m, c) != 2 * n) return false;
  const kiln_shape *in0 = &m->instrs[r->operands[0]]->shape;
  if (!kiln_shape_is_array(in0) || in0->rank > KILN__EMIT_MAXR) return false;
  if (p->in == NULL) p->in = in0;
  const kiln_i64s *dl = kiln_instr_attr_ints(r, KILN_ATTR_DIMENSIONS);
  bool red[KILN__EMIT_MAXR] = {false};
  if (dl == NULL || dl->n == 0) return false;
  for (uint32_t i = 0; i < dl->n; i++) {
    if (dl->v[i] < 0 || dl->v[i] >= in0->rank || red[dl->v[i]]) return false;
    red[dl->v[i]] = true;
  }
  if (p->nred == 0) memcpy(p->reduced, red, sizeof red);
  if (memcmp(p->reduced, red, sizeof red) != 0) return false;
  for (uint32_t a = 0; a < n; a++) {
    const kiln_shape *in = &m->instrs[r->operands[a]]->shape;
    const kiln_shape *init = &m->instrs[r->operands[n + a]]->shape;
    const kiln_shape *res = n == 1 && !kiln_shape_is_tuple(&r->shape) ? &r->shape
                            : kiln_shape_is_tuple(&r->shape) && a < r->shape.rank
                                ? &r->shape.tuple[a]
                                : NULL;
    const kiln_instr *pa = kiln_computation_param(m, c, a);
    const kiln_instr *pb = kiln_computation_param(m, c, n + a);
    if (res == NULL || pa == NULL || pb == NULL || !kiln_shape_is_array(in) ||
        !kiln_shape_is_array(init) || !kiln_shape_is_array(res) ||
        !kiln_shape_is_array(&pa->shape) || !kiln_shape_is_array(&pb->shape) || init->rank != 0 ||
        pa->shape.rank != 0 || pb->shape.rank != 0 || in->rank != p->in->rank ||
        (in->rank && memcmp(in->dims, p->in->dims, in->rank * sizeof *in->dims) != 0))
      return false;
    kiln_dtype t = in->dtype;
    if (!coop_type(t) || init->dtype != t || res->dtype != t || pa->shape.dtype != t ||
        pb->shape.dtype != t)
      return false;
    p->t[p->nacc + a] = t;
  }
  p->red[p->nred].r = r;
  p->red[p->nred].n = n;
  p->red[p->nred].first = p->nacc;
  p->nred++;
  p->nacc += n;
  return true;
}

/* Whether kernel k is one the cooperative form computes (the file's head). */
static bool coop_plan_for(const kiln__codegen *g, const kiln__kernel_spec *k, coop_plan *p) {
  const kiln_module *m = g->mod.m;
  memset(p, 0, sizeof *p);
  if (k->nouts == 0 || k->nouts > MAX_ACCS) return false;
  for (uint32_t o = 0; o < k->nouts; o++) {
    uint32_t leaf = k->out_leaf[o];
    if (k->arg_shared && k->arg_shared[k->out_arg[o]]) return false;
    if (!same_space(k->out_shape[o], k->out_shape[0])) return false;
    const kiln_instr *r = m->instrs[producer(m, k->root, &leaf)];
    uint32_t j = 0;
    while (j < p->nred && p->red[j].r != r) j++;
    if (j == p->nred && !plan_reduce(m, p, r)) return false;
    if (leaf >= p->red[j].n) return false;
    p->acc_of[o] = p->red[j].first + leaf;
    if (k->out_shape[o]->dtype != p->t[p->acc_of[o]]) return false;
  }
  p->extent = 1;
  for (uint32_t d = 0; d < p->in->rank; d++)
    if (p->reduced[d]) p->extent *= p->in->dims[d];
  int64_t outs = kiln_shape_elements(k->out_shape[0]);
  if (p->extent < KILN__CUDA_COOP_MIN || outs < 1) return false;
  /* Reduced dims that are all major (a bias gradient): many outputs are
   * better served by a thread each walking down its column (consecutive
   * threads, consecutive columns: the shared row form). */
  int64_t m2m[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(p->in, m2m);
  return p->reduced[m2m[0]] || outs < 1024;
}

/* The shuffle of accumulator a's value `v` down by kcs into a new v<dst>
 * (types under 32 bits travel as int). */
static void shuffle(kiln__emit_fn *f, const coop_plan *p, uint32_t a, uint32_t dst, uint32_t v) {
  const char *t = kiln__ctype(f->mod, p->t[a]);
  if (kiln_dtype_bits(p->t[a]) < 32)
    kiln__emit_line(f, "%s v%u = (%s)__shfl_down_sync(0xffffffffu, (int32_t)v%u, kcs);", t, dst, t,
                    v);
  else
    kiln__emit_line(f, "%s v%u = __shfl_down_sync(0xffffffffu, v%u, kcs);", t, dst, v);
}

/* For every reduce: acc[] = kch ? reducer(acc[], x[]) : x[]. */
static void merge(kiln__emit_fn *f, const coop_plan *p, const uint32_t *acc, const uint32_t *x) {
  uint32_t mk = kiln__emit_open(f, "if (kch)");
  for (uint32_t j = 0; j < p->nred; j++) {
    const coop_red *rd = &p->red[j];
    uint32_t args[2 * MAX_ACCS];
    for (uint32_t a = 0; a < rd->n; a++) {
      args[a] = acc[rd->first + a];
      args[rd->n + a] = x[rd->first + a];
    }
    kiln__emit_call_fn(f, rd->fn, args, 2 * rd->n, acc + rd->first, rd->n);
  }
  kiln__emit_close(f, mk, NULL);
  mk = kiln__emit_open(f, "else");
  for (uint32_t a = 0; a < p->nacc; a++) kiln__emit_line(f, "v%u = v%u;", acc[a], x[a]);
  kiln__emit_close(f, mk, NULL);
}

/* The warp's partials combined into lane 0's. */
static void warp_combine(kiln__emit_fn *f, const coop_plan *p, const uint32_t *acc) {
  uint32_t mk = kiln__emit_open(f, "for (unsigned kcs = 16; kcs > 0; kcs >>= 1)");
  uint32_t got[MAX_ACCS];
  for (uint32_t a = 0; a < p->nacc; a++) {
    got[a] = kiln__emit_newvar(f);
    shuffle(f, p, a, got[a], acc[a]);
  }
  kiln__emit_line(f, "int kcg = __shfl_down_sync(0xffffffffu, kch, kcs);");
  uint32_t in = kiln__emit_open(f, "if (kcg && kclane + kcs < 32u)");
  merge(f, p, acc, got);
  kiln__emit_line(f, "kch = 1;");
  kiln__emit_close(f, in, NULL);
  kiln__emit_close(f, mk, NULL);
}

/* Sets y's reduced components from kcq, the reduced positions' linear
 * number in the input's physical order (minor first). */
static void split_reduced(kiln__emit_fn *f, const coop_plan *p, kiln__ix *y) {
  const kiln_shape *in = p->in;
  int64_t m2m[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(in, m2m);
  uint32_t left = 0;
  for (uint32_t d = 0; d < in->rank; d++) left += p->reduced[d];
  char cur[32] = "kcq";
  for (uint32_t j = 0; j < in->rank; j++) {
    int64_t d = m2m[j];
    if (!p->reduced[d]) continue;
    if (--left == 0) {
      kiln__ix_set(y, (uint32_t)d, "%s", cur);
      break;
    }
    kiln__emit_line(f, "const int64_t kcr%lld = %s %% %lldLL, kcn%lld = %s / %lldLL;", (long long)d,
                    cur, (long long)in->dims[d], (long long)d, cur, (long long)in->dims[d]);
    kiln__ix_set(y, (uint32_t)d, "kcr%lld", (long long)d);
    snprintf(cur, sizeof cur, "kcn%lld", (long long)d);
  }
}

static int coop_body(kiln__codegen *g, const kiln__kernel_spec *k, coop_plan *p, kiln_sbuf *out) {
  const kiln_shape *in = p->in, *os = k->out_shape[0];
  kiln__emit_fn f;
  kiln__ix y, s0 = {0};
  uint32_t acc[MAX_ACCS], x[MAX_ACCS], res[MAX_ACCS];
  int rc = kiln__kernel_begin(g, k, out, &f, 1);
  for (uint32_t j = 0; j < p->nred && rc == 0; j++)
    rc = kiln__emit_comp_fn(&g->mod, p->red[j].r->called[0], p->red[j].r, &p->red[j].fn);
  if (rc == 0) rc = kiln__ix_new(&f, in->rank, &y);
  if (rc) goto done;
  for (uint32_t a = 0; a < p->nacc; a++)
    kiln__emit_line(&f, "KSHARED(%s, kcv%u, 32);", kiln__ctype(&g->mod, p->t[a]), a);
  kiln__emit_line(&f, "KSHARED(int, kchs, 32);");
  kiln__emit_line(&f, "const unsigned kclane = threadIdx.x & 31u, kcwarp = threadIdx.x >> 5, "
                      "kcnw = (blockDim.x + 31u) >> 5;");
  uint32_t rows = kiln__emit_open(
      &f, "for (int64_t i = begin + (int64_t)blockIdx.x; i < end; i += (int64_t)gridDim.x)");
  kiln__kernel_decompose(f.out, os, "i", 0, "o", f.indent);
  for (uint32_t a = 0; a < p->nacc; a++) {
    acc[a] = kiln__emit_newvar(&f);
    kiln__emit_line(&f, "%s v%u = 0;", kiln__ctype(&g->mod, p->t[a]), acc[a]);
  }
  kiln__emit_line(&f, "int kch = 0;");
  /* this thread's share of the reduced positions */
  uint32_t q = kiln__emit_open(&f,
                               "for (int64_t kcq = threadIdx.x; kcq < %lldLL; kcq += "
                               "blockDim.x)",
                               (long long)p->extent);
  split_reduced(&f, p, &y);
  for (uint32_t d = 0, j = 0; d < in->rank; d++)
    if (!p->reduced[d]) kiln__ix_set(&y, d, "o%u", j++);
  for (uint32_t j = 0; j < p->nred && rc == 0; j++)
    for (uint32_t a = 0; a < p->red[j].n && rc == 0; a++)
      rc = kiln__emit_value1(&f, p->red[j].r->operands[a], &y, &x[p->red[j].first + a]);
  if (rc) goto done;
  merge(&f, p, acc, x);
  kiln__emit_line(&f, "kch = 1;");
  kiln__emit_close(&f, q, NULL);
  warp_combine(&f, p, acc);
  uint32_t w = kiln__emit_open(&f, "if (kclane == 0)");
  for (uint32_t a = 0; a < p->nacc; a++) kiln__emit_line(&f, "kcv%u[kcwarp] = v%u;", a, acc[a]);
  kiln__emit_line(&f, "kchs[kcwarp] = kch;");
  kiln__emit_close(&f, w, NULL);
  kiln__emit_line(&f, "__syncthreads();");
  w = kiln__emit_open(&f, "if (kcwarp == 0)");
  kiln__emit_line(&f, "kch = kclane < kcnw ? kchs[kclane] : 0;");
  uint32_t h = kiln__emit_open(&f, "if (kch)");
  for (uint32_t a = 0; a < p->nacc; a++) kiln__emit_line(&f, "v%u = kcv%u[kclane];", acc[a], a);
  kiln__emit_close(&f, h, NULL);
  warp_combine(&f, p, acc);
  uint32_t l0 = kiln__emit_open(&f, "if (kclane == 0)");
  /* reducer(init, total), or init alone when the extent is empty */
  for (uint32_t j = 0; j < p->nred && rc == 0; j++) {
    const coop_red *rd = &p->red[j];
    uint32_t args[2 * MAX_ACCS];
    for (uint32_t a = 0; a < rd->n && rc == 0; a++) {
      uint32_t v;
      rc = kiln__emit_value1(&f, rd->r->operands[rd->n + a], &s0, &v);
      res[rd->first + a] = kiln__emit_newvar(&f);
      kiln__emit_line(&f, "%s v%u = v%u;", kiln__ctype(&g->mod, p->t[rd->first + a]),
                      res[rd->first + a], v);
      args[a] = res[rd->first + a];
      args[rd->n + a] = acc[rd->first + a];
    }
    if (rc) break;
    uint32_t hk = kiln__emit_open(&f, "if (kch)");
    kiln__emit_call_fn(&f, rd->fn, args, 2 * rd->n, res + rd->first, rd->n);
    kiln__emit_close(&f, hk, NULL);
  }
  if (rc) goto done;
  for (uint32_t o = 0; o < k->nouts; o++) {
    char v[16], e[64];
    snprintf(v, sizeof v, "v%u", res[p->acc_of[o]]);
    kiln__emit_store_expr(k->out_shape[o]->dtype, v, e, sizeof e);
    kiln__emit_line(&f, "b%u[i] = %s;", k->out_arg[o], e);
  }
  kiln__emit_close(&f, l0, NULL);
  kiln__emit_close(&f, w, NULL);
  kiln__emit_line(&f, "__syncthreads();"); /* kcv and kchs are reused by the next output */
  kiln__emit_close(&f, rows, NULL);
  if (f.rc) rc = f.rc;
done:
  kiln__emit_fn_free(&f);
  return rc;
}

int kiln__cuda_coop_kernel(kiln__codegen *g, const kiln__kernel_spec *k, kiln_sbuf *out,
                           uint64_t *range) {
  coop_plan p;
  if (!coop_plan_for(g, k, &p)) return 1;
  int rc = coop_body(g, k, &p, out);
  if (rc == 0) *range = (uint64_t)kiln_shape_elements(k->out_shape[0]);
  return rc;
}
