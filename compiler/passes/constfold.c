/* Constant folding: an instruction whose operands are all constants is
 * evaluated at compile time and becomes a constant.
 *
 * The value comes from the reference interpreter, so folding can never
 * disagree with it: the instruction (with clones of its constant operands
 * and of the computations it calls) is copied into a small module of its
 * own and run there. The instruction is then turned into a constant in
 * place, keeping its id, name and users.
 *
 * Not folded: anything impure (see ir/build.h) or calling into control flow
 * (while, conditional, call, fusion); results that are tuples, dynamic, or
 * over FOLD_MAX_BYTES (a constant is data the module must carry); work
 * estimated over FOLD_MAX_WORK element operations (compile time is bounded
 * deterministically, not by a clock); iota and broadcasts of a scalar
 * (cheaper to compute than to store), and what reads them, except an
 * instruction of HEAVY_WORK_PER_ELEMENT operations per element or more (an
 * fft or a dot of a scalar splat costs more to run than to store); bitcast
 * (its meaning depends on layouts). When the interpreter refuses an instruction (an unsupported
 * type, a limit), it is left as it is.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/passes.h"

#define FOLD_MAX_BYTES (1 << 20)
#define FOLD_MAX_WORK (1 << 22)
#define HEAVY_WORK_PER_ELEMENT 8 /* operations per element read or written */

static double elems(const kiln_shape *s) {
  if (!kiln_shape_is_array(s)) return 0;
  double n = 1;
  for (uint32_t i = 0; i < s->rank; i++) n *= (double)s->dims[i];
  return n;
}

static double window_size(const kiln_instr *ins) {
  const kiln_attr *a = kiln_instr_attr(ins, KILN_ATTR_WINDOW);
  double n = 1;
  if (a && a->v.window)
    for (uint32_t i = 0; i < a->v.window->rank; i++) n *= (double)a->v.window->dims[i].size;
  return n;
}

/* Element operations the interpreter will spend, roughly. */
static double work(const kiln_module *m, const kiln_instr *ins) {
  double res = elems(&ins->shape), w = res;
  for (uint32_t k = 0; k < ins->noperands; k++) w += elems(&m->instrs[ins->operands[k]]->shape);
  const kiln_shape *s0 = ins->noperands ? &m->instrs[ins->operands[0]]->shape : NULL;
  switch (ins->op) {
  case KILN_OP_DOT: {
    const kiln_i64s *c = kiln_instr_attr_ints(ins, KILN_ATTR_LHS_CONTRACTING_DIMS);
    double k = 1;
    for (uint32_t i = 0; c && i < c->n; i++)
      if (c->v[i] >= 0 && c->v[i] < (int64_t)s0->rank) k *= (double)s0->dims[c->v[i]];
    return w + res * k;
  }
  case KILN_OP_CONVOLUTION: {
    const kiln_shape *kern = &m->instrs[ins->operands[1]]->shape;
    const kiln_attr *a = kiln_instr_attr(ins, KILN_ATTR_DIM_LABELS);
    double out_f = 1;
    if (a && a->v.conv && a->v.conv->kernel_out >= 0 && a->v.conv->kernel_out < kern->rank)
      out_f = (double)kern->dims[a->v.conv->kernel_out];
    return w + res * elems(kern) / (out_f > 0 ? out_f : 1);
  }
  case KILN_OP_REDUCE_WINDOW: return w + res * window_size(ins);
  case KILN_OP_SELECT_AND_SCATTER: return w + 2 * elems(s0) * window_size(ins);
  case KILN_OP_SORT:
  case KILN_OP_FFT: return w + w * log2(w + 2);
  case KILN_OP_CHOLESKY:
  case KILN_OP_TRIANGULAR_SOLVE:
    return w + res * (s0 && s0->rank ? (double)s0->dims[s0->rank - 1] : 1);
  default: return w;
  }
}

static bool is_literal(const kiln_instr *o) {
  return o->op == KILN_OP_CONSTANT && o->literal != NULL && !kiln_shape_is_dynamic(&o->shape);
}

/* Whether o is a broadcast of a scalar constant (which stays unfolded). */
static bool is_scalar_splat(const kiln_module *m, const kiln_instr *o) {
  if (o->op != KILN_OP_BROADCAST || o->noperands != 1 || o->operands[0] >= m->ninstrs ||
      kiln_shape_is_dynamic(&o->shape))
    return false;
  const kiln_instr *c = m->instrs[o->operands[0]];
  return is_literal(c) && c->shape.rank == 0;
}

/* Whether ins spends many operations per element it reads and writes (an
 * fft, a dot, a convolution, a sort): such an instruction of constants and
 * scalar broadcasts is folded too, as the transposed fft of a sum's
 * all-ones cotangent, which would otherwise run at every execution. */
static bool is_heavy(const kiln_module *m, const kiln_instr *ins) {
  double io = elems(&ins->shape);
  for (uint32_t k = 0; k < ins->noperands; k++) io += elems(&m->instrs[ins->operands[k]]->shape);
  return work(m, ins) >= HEAVY_WORK_PER_ELEMENT * io;
}

static bool wants_folding(const kiln_module *m, const kiln_instr *ins, const bool *impure) {
  if (!kiln_opcode_is_foldable(ins->op) || ins->noperands == 0 ||
      !kiln__instr_is_pure(m, ins, impure))
    return false;
  if (!kiln_shape_is_array(&ins->shape) || kiln_shape_is_dynamic(&ins->shape)) return false;
  int64_t bytes = kiln_shape_bytes(&ins->shape);
  if (bytes < 0 || bytes > FOLD_MAX_BYTES) return false;
  bool splats = false;
  for (uint32_t k = 0; k < ins->noperands; k++) {
    if (ins->operands[k] >= m->ninstrs) return false;
    const kiln_instr *o = m->instrs[ins->operands[k]];
    if (is_scalar_splat(m, o))
      splats = true;
    else if (!is_literal(o))
      return false;
  }
  if (ins->op == KILN_OP_BROADCAST && m->instrs[ins->operands[0]]->shape.rank == 0) return false;
  if (splats && !is_heavy(m, ins)) return false;
  return work(m, ins) <= FOLD_MAX_WORK;
}

/* Scratch reused across evaluations. */
typedef struct folder {
  kiln_module *m;
  const bool *impure;
  uint32_t *cmap;  /* computation id -> id in the evaluation module */
  uint32_t *stamp; /* computation id -> evaluation that copied it */
  uint32_t *list;  /* computations to copy */
  kiln_id *imap;   /* instruction id -> id in the evaluation module */
  uint32_t gen;
} folder;

/* Adds computation c to the list unless this evaluation has it already. */
static void enlist(folder *f, uint32_t c, uint32_t *n) {
  if (f->stamp[c] == f->gen) return;
  f->stamp[c] = f->gen;
  f->list[(*n)++] = c;
}

/* Lists the computations reachable from ins's calls; false when one of
 * them holds control flow (unbounded work) or a call is malformed. */
static bool list_callees(folder *f, const kiln_instr *ins, uint32_t *n) {
  const kiln_module *m = f->m;
  *n = 0;
  f->gen++;
  for (uint32_t i = 0; i < ins->ncalled; i++) {
    if (ins->called[i] >= m->ncomps) return false;
    enlist(f, ins->called[i], n);
  }
  for (uint32_t top = 0; top < *n; top++) {
    const kiln_computation *c = m->comps[f->list[top]];
    for (uint32_t i = 0; i < c->ninstrs; i++) {
      const kiln_instr *x = m->instrs[c->instrs[i]];
      if (x->op == KILN_OP_WHILE || x->op == KILN_OP_CONDITIONAL || x->op == KILN_OP_CALL ||
          x->op == KILN_OP_FUSION)
        return false;
      for (uint32_t k = 0; k < x->ncalled; k++) {
        if (x->called[k] >= m->ncomps) return false;
        enlist(f, x->called[k], n);
      }
    }
  }
  return true;
}

/* Copies the computations ins calls, transitively, into mm; *ok is false
 * when they cannot be evaluated (then nothing is an error). */
static int copy_callees(folder *f, kiln_module *mm, const kiln_instr *ins, bool *ok) {
  kiln_module *m = f->m;
  uint32_t n;
  *ok = false;
  if (!list_callees(f, ins, &n)) return 0;
  for (uint32_t k = 0; k < n; k++)
    if (kiln_module_add_computation(mm, m->comps[f->list[k]]->name, &f->cmap[f->list[k]]))
      return KILN_ENOMEM;
  kiln_id ops[64];
  for (uint32_t k = 0; k < n; k++) {
    const kiln_computation *c = m->comps[f->list[k]];
    for (uint32_t i = 0; i < c->ninstrs; i++) {
      const kiln_instr *x = m->instrs[c->instrs[i]];
      if (x->noperands > 64) return 0;
      for (uint32_t j = 0; j < x->noperands; j++) {
        if (x->operands[j] >= m->ninstrs || m->instrs[x->operands[j]]->comp != c->id) return 0;
        ops[j] = f->imap[x->operands[j]];
      }
      kiln_instr *y = kiln_instr_clone(mm, f->cmap[c->id], x, ops, x->noperands, f->cmap, NULL);
      if (y == NULL) return KILN_ENOMEM;
      f->imap[x->id] = y->id;
    }
    if (c->root >= m->ninstrs || m->instrs[c->root]->comp != c->id) return 0;
    mm->comps[f->cmap[c->id]]->root = f->imap[c->root];
  }
  *ok = true;
  return 0;
}

/* Evaluates ins in a module of its own; *out is NULL when the interpreter
 * refused it. */
static int evaluate(folder *f, const kiln_instr *ins, kiln_literal **out) {
  *out = NULL;
  kiln_module *mm = kiln_module_create("constfold");
  if (mm == NULL) return KILN_ENOMEM;
  bool ok = false;
  int rc = copy_callees(f, mm, ins, &ok);
  uint32_t e;
  if (rc || !ok || (rc = kiln_module_add_computation(mm, "constfold.entry", &e))) goto out_free;
  kiln_id ops[64];
  if (ins->noperands > 64) goto out_free;
  for (uint32_t k = 0; k < ins->noperands; k++) {
    char name[32];
    const kiln_instr *o = f->m->instrs[ins->operands[k]];
    kiln_id scalar[1];
    uint32_t nscalar = 0;
    if (o->op == KILN_OP_BROADCAST) { /* a scalar splat (wants_folding) */
      snprintf(name, sizeof name, "operand.%u.scalar", (unsigned)k);
      kiln_instr *c = kiln_instr_clone(mm, e, f->m->instrs[o->operands[0]], NULL, 0, NULL, name);
      if (c == NULL) goto out_oom;
      scalar[nscalar++] = c->id;
    }
    snprintf(name, sizeof name, "operand.%u", (unsigned)k);
    kiln_instr *c = kiln_instr_clone(mm, e, o, scalar, nscalar, NULL, name);
    if (c == NULL) goto out_oom;
    ops[k] = c->id;
  }
  kiln_instr *x = kiln_instr_clone(mm, e, ins, ops, ins->noperands, f->cmap, "folded");
  if (x == NULL) goto out_oom;
  mm->entry = e;
  mm->comps[e]->is_entry = true;
  mm->comps[e]->root = x->id;
  kiln_interp_options o = {0};
  o.max_live_bytes = (size_t)64 << 20;
  o.max_while_iterations = 1;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_interp_run(mm, NULL, 0, &o, out, &st)) *out = NULL;
  goto out_free;
out_oom:
  rc = KILN_ENOMEM;
out_free:
  kiln_module_destroy(mm);
  return rc;
}

/* Turns ins into a constant holding v; metadata and sharding stay. */
static int become_constant(kiln_module *m, kiln_instr *ins, const kiln_literal *v) {
  kiln_literal *lit;
  if (kiln_literal_clone(m->arena, v, &lit, NULL)) return KILN_ENOMEM;
  if (kiln_shape_copy(m->arena, &lit->shape, &ins->shape)) return KILN_ENOMEM;
  ins->op = KILN_OP_CONSTANT;
  ins->async_op = KILN_OP_INVALID;
  ins->operands = NULL;
  ins->noperands = 0;
  ins->called = NULL;
  ins->ncalled = 0;
  uint32_t n = 0;
  for (uint32_t i = 0; i < ins->nattrs; i++)
    if (ins->attrs[i].key == KILN_ATTR_METADATA || ins->attrs[i].key == KILN_ATTR_SHARDING)
      ins->attrs[n++] = ins->attrs[i];
  ins->nattrs = n;
  ins->literal = lit;
  return 0;
}

int kiln_pass_constfold(kiln_module *m, const kiln_pass_ctx *ctx) {
  folder f = {0};
  f.m = m;
  size_t nc = m->ncomps ? m->ncomps : 1, ni = m->ninstrs ? m->ninstrs : 1;
  bool *impure = kiln__impure_computations(m);
  f.impure = impure;
  f.cmap = kiln_calloc(nc, sizeof *f.cmap);
  f.stamp = kiln_calloc(nc, sizeof *f.stamp);
  f.list = kiln_calloc(nc, sizeof *f.list);
  f.imap = kiln_calloc(ni, sizeof *f.imap);
  int rc = KILN_ENOMEM;
  if (!impure || !f.cmap || !f.stamp || !f.list || !f.imap) goto out_free;
  rc = 0;
  for (uint32_t c = 0; c < m->ncomps && rc == 0; c++) {
    kiln_computation *comp = m->comps[c];
    for (uint32_t i = 0; i < comp->ninstrs && rc == 0; i++) {
      kiln_instr *ins = m->instrs[comp->instrs[i]];
      if (!wants_folding(m, ins, impure)) continue;
      kiln_literal *v = NULL;
      rc = evaluate(&f, ins, &v);
      if (rc == 0 && v && kiln_shape_same_dims(&v->shape, &ins->shape) &&
          v->shape.dtype == ins->shape.dtype && v->dynamic_sizes == NULL)
        rc = become_constant(m, ins, v);
      kiln_literal_destroy(v);
    }
  }
out_free:
  kiln_free(impure);
  kiln_free(f.cmap);
  kiln_free(f.stamp);
  kiln_free(f.list);
  kiln_free(f.imap);
  if (rc) return kiln_status_set(ctx->st, rc, "constfold", "out of memory");
  return 0;
}
