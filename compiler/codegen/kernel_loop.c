/* Kernel frames and loop kernels (see kernel.h), for any target: the
 * entry function around a body, and the loops around the emitter's values,
 * whose loops over the step's range come from the target's wrappers.
 *
 * A loop kernel first tries the flat form, one iteration per output
 * element in physical order, where an elementwise chain over buffers of the
 * output's layout reads b[i] and vectorizes. When the body needs the
 * logical index (broadcasts, transposes, windows...) and the innermost
 * physical dim is long enough, it is written again in the row form: one
 * iteration per row, an inner counted loop over the innermost dim, so the
 * index arithmetic happens once per row and the inner loop stays simple.
 * In the row form, the kernel's row reductions (compiler/passes/row_reduce.h:
 * softmax's max and sum, layernorm's mean and variance) and the broadcasts
 * of their results are computed once per row, in computation order, before
 * the inner loop, each bound to a C variable; each reduce's loop is one
 * pass over the row, read from cache after the first, and a value two
 * passes share is kept in a row temporary on the stack.
 * A reduce over the physically major dims of its input (a bias gradient)
 * accumulates in its output instead, one input row at a time, so that it
 * reads memory in order rather than down columns; several such reduces
 * over the same rows (a layernorm's two parameter gradients) share them.
 * A kernel with row reductions is declared with the target's wide_decl
 * (512-bit vectors on x86 with GCC): its passes over a row are bound by
 * the arithmetic (exp), not by memory, and GCC otherwise stops at 256.
 * Pooling (a reduce-window that does not window the minor dim) and a
 * reduce that keeps the minor dim (a mean over NHWC's spatial dims) run
 * per output row too, the loops over the window or the reduced dims
 * outside and the loop over the row innermost, so that it vectorizes.
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/buffer_assign.h"
#include "compiler/codegen/kernel.h"
#include "compiler/passes/cost.h"
#include "compiler/passes/row_reduce.h"

int kiln__codegen_init(kiln__codegen *g, const kiln_module *m, const kiln__cg_target *target,
                       kiln_status *st) {
  memset(g, 0, sizeof *g);
  g->st = st;
  kiln_sbuf_init(&g->kernels);
  return kiln__emit_mod_init(&g->mod, m, target, st);
}

void kiln__codegen_free(kiln__codegen *g) {
  kiln__emit_mod_free(&g->mod);
  kiln_sbuf_free(&g->kernels);
  kiln_free(g->used);
  g->used = NULL;
}

char *kiln__codegen_source(kiln__codegen *g, size_t *len) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, g->mod.target->prelude);
  kiln_sbuf_puts(&b, kiln_sbuf_str(&g->mod.funcs));
  kiln_sbuf_puts(&b, kiln_sbuf_str(&g->kernels));
  if (kiln_sbuf_failed(&g->mod.funcs) || kiln_sbuf_failed(&g->kernels)) {
    kiln_sbuf_free(&b);
    return NULL;
  }
  return kiln_sbuf_detach(&b, len);
}

/* ---- kernel frames ------------------------------------------------------ */

int kiln__kernel_begin(kiln__codegen *g, const kiln__kernel_spec *k, kiln_sbuf *body,
                       kiln__emit_fn *f, int indent) {
  int rc = kiln__emit_fn_init(f, &g->mod, body, indent);
  for (uint32_t i = 0; rc == 0 && i < k->nbinds; i++) {
    const kiln__kbind *b = &k->binds[i];
    rc = kiln__emit_bind(f, b->id, b->args, b->shapes, NULL, b->nleaves);
  }
  return rc;
}

/* Whether kernel k computes a transcendental function (exp, log, tanh...:
 * the ops the cost model counts at 16 flops) per element: such a loop is
 * bound by its arithmetic, not by memory, and runs 1.4-1.5x faster in
 * 512-bit vectors than in the 256 GCC stops at (an exp or a sum of exps
 * over 64K-256K floats, hot, single-threaded), so it gets the target's
 * wide_decl as row kernels do. The walk stops at the kernel's inputs. */
static bool arith_bound(const kiln__codegen *g, const kiln__kernel_spec *k) {
  const kiln_module *m = g->mod.m;
  uint32_t ni = m->ninstrs;
  if (k->root >= ni) return false;
  uint8_t *seen = kiln_calloc(ni, 1);
  kiln_id *stack = kiln_malloc(ni * sizeof *stack);
  bool found = false;
  if (seen == NULL || stack == NULL) goto out_free; /* only a hint lost */
  for (uint32_t i = 0; i < k->nbinds; i++)
    if (k->binds[i].id < ni) seen[k->binds[i].id] = 1;
  uint32_t top = 0;
  if (!seen[k->root]) stack[top++] = k->root, seen[k->root] = 1;
  while (top && !found) {
    const kiln_instr *ins = m->instrs[stack[--top]];
    found = kiln_cost_op_flops(ins->op) >= 16;
    for (uint32_t o = 0; o < ins->noperands; o++) {
      kiln_id x = ins->operands[o];
      if (x < ni && !seen[x]) stack[top++] = x, seen[x] = 1;
    }
  }
out_free:
  kiln_free(seen);
  kiln_free(stack);
  return found;
}

/* Appends "<kernel_qual>void kiln_kernel_N(...) { <pointer declarations>
 * <body> }", after a declaration with the target's wide_decl on the same
 * line when g->wide (which it clears) or the kernel is arith_bound. */
void kiln__kernel_finish(kiln__codegen *g, const kiln__kernel_spec *k, const char *body,
                         uint64_t range) {
  const kiln__cg_target *tg = g->mod.target;
  kiln_sbuf *b = &g->kernels;
  if (tg->wide_decl && (g->wide || arith_bound(g, k)))
    kiln_sbuf_printf(b, "%svoid kiln_kernel_%u(void *const *bufs, int64_t begin, int64_t end)%s; ",
                     tg->kernel_qual, g->nkernels, tg->wide_decl);
  g->wide = false;
  kiln_sbuf_printf(b, "%svoid kiln_kernel_%u(void *const *bufs, int64_t begin, int64_t end) {\n",
                   tg->kernel_qual, g->nkernels);
  for (uint32_t a = 0; a < k->nargs; a++) {
    const char *t = kiln__stype(&g->mod, k->arg_dtype[a]);
    bool noalias = !(k->arg_shared && k->arg_shared[a]);
    const char *q = noalias ? tg->restrict_qual : "", *sp = noalias ? " " : "";
    if (k->arg_out[a])
      kiln_sbuf_printf(b, "  %s *%s%sb%u = (%s *)bufs[%u];\n", t, q, sp, a, t, a);
    else
      kiln_sbuf_printf(b, "  const %s *%s%sb%u = (const %s *)bufs[%u];\n", t, q, sp, a, t, a);
  }
  /* A step never runs a kernel past its own range, whatever it is told. */
  kiln_sbuf_printf(b, "  if (end > %lldLL) end = %lldLL;\n", (long long)range, (long long)range);
  kiln_sbuf_puts(b, body);
  kiln_sbuf_puts(b, "}\n\n");
  g->nkernels++;
}

/* Writes "const int64_t <prefix><d> = ..." for every logical dim d of s
 * from the physical linear index `lin` (the minor dim too unless
 * skip_minor). */
void kiln__kernel_decompose(kiln_sbuf *b, const kiln_shape *s, const char *lin, uint32_t skip_minor,
                            const char *prefix, int indent) {
  int64_t m2m[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(s, m2m);
  char cur[64];
  snprintf(cur, sizeof cur, "%s", lin);
  uint32_t r = s->rank;
  for (uint32_t k = skip_minor ? 1 : 0; k < r; k++) {
    int64_t d = m2m[k];
    for (int i = 0; i < indent; i++) kiln_sbuf_puts(b, "  ");
    if (s->dims[d] == 1)
      kiln_sbuf_printf(b, "const int64_t %s%lld = 0;\n", prefix, (long long)d);
    else if (k + 1 == r)
      kiln_sbuf_printf(b, "const int64_t %s%lld = %s;\n", prefix, (long long)d, cur);
    else {
      kiln_sbuf_printf(b, "const int64_t %s%lld = %s %% %lld, q%s%lld = %s / %lld;\n", prefix,
                       (long long)d, cur, (long long)s->dims[d], prefix, (long long)d, cur,
                       (long long)s->dims[d]);
      snprintf(cur, sizeof cur, "q%s%lld", prefix, (long long)d);
    }
  }
}

/* ---- loop kernels ------------------------------------------------------- */

static uint32_t count_leaves(const kiln_shape *s) {
  if (!kiln_shape_is_tuple(s)) return 1;
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->rank; i++) n += count_leaves(&s->tuple[i]);
  return n;
}

/* Follows tuple instructions down to the instruction that produces leaf
 * *leaf of id's value, so that a kernel computes only the outputs it
 * stores (a multi-output fusion's outputs may differ in dims). */
static kiln_id producer(const kiln_module *m, kiln_id id, uint32_t *leaf) {
  for (;;) {
    const kiln_instr *ins = m->instrs[id];
    if (ins->op != KILN_OP_TUPLE) return id;
    uint32_t j = 0;
    for (; j < ins->noperands; j++) {
      uint32_t n = count_leaves(&m->instrs[ins->operands[j]]->shape);
      if (*leaf < n) break;
      *leaf -= n;
    }
    if (j == ins->noperands) return id;
    id = ins->operands[j];
  }
}

/* Emits the stores of the outputs at index x. */
static int store_outputs(kiln__emit_fn *f, const kiln__kernel_spec *k, const kiln__ix *x) {
  for (uint32_t o = 0; o < k->nouts; o++) {
    const uint32_t *vars;
    uint32_t n, leaf = k->out_leaf[o];
    kiln_id id = producer(f->mod->m, k->root, &leaf);
    int rc = kiln__emit_value(f, id, x, &vars, &n);
    if (rc) return rc;
    if (leaf >= n) return KILN_EINTERNAL;
    char off[512], v[16], e[64];
    kiln__ix_offset(f, x, k->out_shape[o], off, sizeof off);
    snprintf(v, sizeof v, "v%u", vars[leaf]);
    kiln__emit_store_expr(k->out_shape[o]->dtype, v, e, sizeof e);
    kiln__emit_line(f, "b%u[%s] = %s;", k->out_arg[o], off, e);
  }
  return 0;
}

static int minor_dim(const kiln_shape *s) {
  int64_t m2m[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(s, m2m);
  return (int)m2m[0];
}

/* ---- row reductions (compiler/passes/row_reduce.h) ---------------------- */

/* The values kernel k computes (not its inputs), every one after its
 * operands: a post-order walk from the root that stops at bound inputs. */
static int kernel_members(kiln__emit_fn *f, kiln_id root, kiln_id **out, uint32_t *n) {
  const kiln_module *m = f->mod->m;
  uint32_t ni = m->ninstrs;
  uint8_t *state = kiln_calloc(ni ? ni : 1, 1);
  uint32_t *next = kiln_calloc(ni ? ni : 1, sizeof *next);
  kiln_id *stack = kiln_malloc((ni ? ni : 1) * sizeof *stack);
  kiln_id *mem = kiln_malloc((ni ? ni : 1) * sizeof *mem);
  uint32_t top = 0, nm = 0;
  if (state == NULL || next == NULL || stack == NULL || mem == NULL || root >= ni) {
    kiln_free(state);
    kiln_free(next);
    kiln_free(stack);
    kiln_free(mem);
    return root >= ni ? KILN_EINTERNAL : KILN_ENOMEM;
  }
  stack[top++] = root;
  state[root] = 1;
  while (top) {
    kiln_id x = stack[top - 1];
    const kiln_instr *ins = m->instrs[x];
    bool leaf = f->in_first[x] != KILN__NO_INPUT || ins->op == KILN_OP_PARAMETER;
    if (!leaf && next[x] < ins->noperands) {
      kiln_id o = ins->operands[next[x]++];
      if (o < ni && state[o] == 0) {
        state[o] = 1;
        stack[top++] = o;
      }
      continue;
    }
    top--;
    if (!leaf) mem[nm++] = x;
  }
  kiln_free(state);
  kiln_free(next);
  kiln_free(stack);
  *out = mem;
  *n = nm;
  return 0;
}

#define ROW_TEMP_BYTES 32768 /* row temporaries of one kernel, on the stack */

/* Row temporaries: the passes over the row are each hoisted reduce's
 * input loop, in computation order, then the output loop. A value that a
 * pass computes and a later one reads again (an elementwise member read
 * only at the row position of the loop, row_reduce.h) is stored into a row
 * array by the first and loaded by the later ones, rather than recomputed
 * with everything below it (softmax's exp, layernorm's output under the
 * softmax). pass[i] receives the pass that stores member i, or UINT32_MAX. */
static int row_temps(const kiln_module *m, const kiln_id *mem, uint32_t n, const uint8_t *role,
                     const bool *in_row, const kiln_id *roots, uint32_t nroots, int64_t row_bytes,
                     uint32_t *pass) {
  uint32_t ni = m->ninstrs;
  uint32_t *at = kiln_malloc((ni ? ni : 1) * sizeof *at), *first = kiln_malloc((n ? n : 1) * 4);
  uint32_t *seen = kiln_calloc(n ? n : 1, sizeof *seen), *stack = kiln_malloc((n ? n : 1) * 4);
  int rc = at && first && seen && stack ? 0 : KILN_ENOMEM;
  if (rc) goto out_free;
  for (uint32_t i = 0; i < ni; i++) at[i] = UINT32_MAX;
  for (uint32_t i = 0; i < n; i++) {
    at[mem[i]] = i;
    first[i] = pass[i] = UINT32_MAX;
  }
  int64_t budget = ROW_TEMP_BYTES;
  uint32_t np = 0; /* passes so far */
  for (uint32_t q = 0; q <= n; q++) {
    if (q < n && role[q] != KILN__ROW_REDUCE) continue;
    /* Pass np reads the reduce's input, or (q == n) the roots. */
    uint32_t top = 0, stamp = np + 1;
    const kiln_id *from = q < n ? &m->instrs[mem[q]]->operands[0] : roots;
    for (uint32_t r = 0; r < (q < n ? 1u : nroots); r++) {
      uint32_t x = from[r] < ni ? at[from[r]] : UINT32_MAX;
      if (x != UINT32_MAX && seen[x] != stamp) {
        seen[x] = stamp;
        stack[top++] = x;
      }
    }
    while (top) {
      uint32_t x = stack[--top];
      const kiln_instr *ins = m->instrs[mem[x]];
      if (role[x] != KILN__ROW_NONE) continue; /* bound before this pass */
      if (first[x] != UINT32_MAX) {
        bool ew = (kiln_opcode_flags(ins->op) & KILN_OPF_ELEMENTWISE) != 0;
        if (pass[x] != UINT32_MAX) continue; /* kept already */
        if (ew && in_row[x] && budget >= row_bytes) {
          pass[x] = first[x];
          budget -= row_bytes;
          continue;
        }
      } else {
        first[x] = np;
      }
      for (uint32_t k = 0; k < ins->noperands; k++) {
        uint32_t o = ins->operands[k] < ni ? at[ins->operands[k]] : UINT32_MAX;
        if (o != UINT32_MAX && seen[o] != stamp) {
          seen[o] = stamp;
          stack[top++] = o;
        }
      }
    }
    np++;
  }
out_free:
  kiln_free(at);
  kiln_free(first);
  kiln_free(seen);
  kiln_free(stack);
  return rc;
}

/* Declares the row temporaries of members with a pass (row_temps):
 * b<nargs + i>, in the compute type; (*targ)[i] is member i's argument
 * number and (*tshape)[i] the shape it is read through (the output's
 * layout, every dim but the row's of size 1, so that its offset is the
 * position in the row). */
static int declare_temps(kiln__emit_fn *f, const kiln__kernel_spec *k, const kiln_id *mem,
                         uint32_t n, const uint32_t *pass, int md, uint32_t **targ,
                         kiln_shape **tshape) {
  const kiln_module *m = f->mod->m;
  const kiln_shape *s = k->out_shape[0];
  int64_t len = s->dims[md];
  uint32_t ntemp = 0;
  *targ = kiln_arena_alloc(f->arena, (n ? n : 1) * sizeof **targ);
  *tshape = kiln_arena_alloc(f->arena, (n ? n : 1) * sizeof **tshape);
  int64_t *tdims = kiln_arena_alloc(f->arena, (size_t)s->rank * sizeof *tdims);
  if (*targ == NULL || *tshape == NULL || tdims == NULL) return KILN_ENOMEM;
  for (uint32_t d = 0; d < s->rank; d++) tdims[d] = (int)d == md ? len : 1;
  for (uint32_t i = 0; i < n; i++) {
    if (pass[i] == UINT32_MAX) continue;
    kiln_dtype t = m->instrs[mem[i]]->shape.dtype;
    if (t == KILN_F16 || t == KILN_BF16) t = KILN_F32; /* held in f32 */
    kiln_shape *ts = &(*tshape)[i];
    *ts = *s;
    ts->dtype = t;
    ts->dims = tdims;
    ts->dynamic = NULL;
    (*targ)[i] = k->nargs + ntemp++;
    kiln__emit_line(f, "%s b%u[%lld];", kiln__ctype(f->mod, t), (*targ)[i], (long long)len);
  }
  return 0;
}

/* In the row form: computes the kernel's row reductions, and the row
 * broadcasts of their results, once per row into `pre` (the code before
 * the loop over the row), in computation order, and binds each to its C
 * variable so that the loop over the row reads it for free; the values the
 * passes share go through row temporaries (row_temps). */
static int hoist_rows(kiln__codegen *g, const kiln__kernel_spec *k, kiln__emit_fn *f,
                      kiln_sbuf *pre) {
  const kiln_module *m = g->mod.m;
  const kiln_shape *s = k->out_shape[0];
  int md = kiln__row_minor(s);
  if (md < 0 || k->nouts > KILN__EMIT_MAXR) return 0;
  kiln_id *mem = NULL, roots[KILN__EMIT_MAXR];
  uint32_t n = 0, stranded = 0, *pass = NULL, *store = NULL;
  for (uint32_t o = 0; o < k->nouts; o++) {
    uint32_t leaf = k->out_leaf[o];
    roots[o] = producer(m, k->root, &leaf);
  }
  uint8_t *role = NULL;
  bool *in_row = NULL;
  int rc = kernel_members(f, k->root, &mem, &n);
  if (rc == 0) {
    role = kiln_malloc(n ? n : 1);
    in_row = kiln_malloc((n ? n : 1) * sizeof *in_row);
    pass = kiln_malloc((n ? n : 1) * sizeof *pass);
    store = kiln_malloc((m->ninstrs ? m->ninstrs : 1) * sizeof *store);
    if (role == NULL || in_row == NULL || pass == NULL || store == NULL) rc = KILN_ENOMEM;
  }
  if (rc == 0) rc = kiln__row_plan(m, mem, n, roots, k->nouts, s, role, &stranded, in_row);
  for (uint32_t i = 0; rc == 0 && i < n; i++)
    if (role[i] == KILN__ROW_REDUCE) g->wide = true;
  int64_t len = s->dims[md];
  if (rc == 0) rc = row_temps(m, mem, n, role, in_row, roots, k->nouts, len * 8, pass);
  if (rc) goto out_free;
  for (uint32_t i = 0; i < m->ninstrs; i++) store[i] = KILN__NO_INPUT;
  kiln_sbuf *body = f->out;
  int indent = f->indent;
  f->out = pre;
  f->indent = 2;
  f->row_dim = (uint32_t)md;
  uint32_t *targ;
  kiln_shape *tshape;
  uint8_t *inv = kiln_arena_alloc(f->arena, m->ninstrs ? m->ninstrs : 1);
  if (inv == NULL) {
    rc = KILN_ENOMEM;
    goto out_restore;
  }
  memset(inv, 0, m->ninstrs ? m->ninstrs : 1);
  f->row_invariant = inv;
  if ((rc = declare_temps(f, k, mem, n, pass, md, &targ, &tshape))) goto out_restore;
  uint32_t np = 0;
  for (uint32_t i = 0; i < n && rc == 0; i++) {
    if (role[i] == KILN__ROW_NONE) continue;
    const kiln_instr *x = m->instrs[mem[i]];
    if (role[i] == KILN__ROW_REDUCE) {
      f->row_store = store;
      for (uint32_t j = 0; j < n; j++)
        if (pass[j] == np) store[mem[j]] = targ[j];
    }
    kiln__ix y;
    if ((rc = kiln__ix_new(f, x->shape.rank, &y))) break;
    for (uint32_t d = 0, j = 0; d < s->rank; d++) {
      if ((int)d != md)
        kiln__ix_set(&y, j++, "o%u", d);
      else if (role[i] == KILN__ROW_BCAST)
        kiln__ix_set(&y, j++, "0");
    }
    uint32_t v;
    if ((rc = kiln__emit_value1(f, x->id, &y, &v))) break;
    char name[16];
    const char *nm = name;
    snprintf(name, sizeof name, "v%u", v);
    rc = kiln__emit_bind(f, x->id, NULL, NULL, &nm, 1);
    inv[x->id] = 1;
    if (role[i] != KILN__ROW_REDUCE) continue;
    /* Later passes load what this one stored. */
    f->row_store = NULL;
    for (uint32_t j = 0; j < n && rc == 0; j++) {
      if (pass[j] != np) continue;
      const kiln_shape *ts = &tshape[j];
      store[mem[j]] = KILN__NO_INPUT;
      rc = kiln__emit_bind(f, mem[j], &targ[j], &ts, NULL, 1);
    }
    np++;
  }
out_restore:
  f->row_store = NULL;
  f->out = body;
  f->indent = indent;
out_free:
  kiln_free(mem);
  kiln_free(role);
  kiln_free(in_row);
  kiln_free(pass);
  kiln_free(store);
  if (rc == KILN_ENOMEM) return kiln_status_set(g->st, rc, "codegen", "out of memory");
  return rc;
}

/* Whether member ins of a kernel has one value whatever the element: a
 * single element computed, through ops that read no index, from kernel
 * inputs and from members that have one value too (ok[], by id). */
static bool one_value(const kiln__emit_fn *f, const kiln_instr *ins, const uint8_t *ok) {
  const kiln_module *m = f->mod->m;
  uint32_t fl = kiln_opcode_flags(ins->op);
  if (kiln_shape_is_tuple(&ins->shape) || kiln_shape_elements(&ins->shape) != 1) return false;
  if (fl & (KILN_OPF_RANDOM | KILN_OPF_SIDE_EFFECT)) return false;
  switch (ins->op) {
  case KILN_OP_CONSTANT:
  case KILN_OP_BROADCAST:
  case KILN_OP_RESHAPE:
  case KILN_OP_BITCAST:
  case KILN_OP_COPY:
  case KILN_OP_SLICE:
  case KILN_OP_TRANSPOSE: break;
  default:
    if (!(fl & KILN_OPF_ELEMENTWISE)) return false;
  }
  for (uint32_t k = 0; k < ins->noperands; k++) {
    kiln_id o = ins->operands[k];
    if (o >= m->ninstrs) return false;
    if (f->in_first[o] == KILN__NO_INPUT && !ok[o]) return false;
  }
  return true;
}

/* Computes once, before the loop over the elements (into *top), the
 * members that have one value for the whole kernel (one_value: Adam's bias
 * corrections 1 - b^t of a step count, a learning rate times a scalar)
 * and binds each to its C variable, so that the loop reads it instead of
 * computing it again per element; only computations and the reads of
 * one-element inputs are hoisted, not the constants and reshapes of
 * constants, which cost nothing in the loop. A read left in the loop is a
 * load through a pointer the compiler must assume the stores may change
 * (the restrict of a local pointer is not honoured as a parameter's is):
 * past ten of them GCC gives up its run-time alias checks and the loop
 * stays scalar (Horner's rule unrolled, sixteen coefficients). */
static int hoist_scalars(kiln__codegen *g, const kiln__kernel_spec *k, kiln__emit_fn *f,
                         kiln_sbuf *top) {
  const kiln_module *m = g->mod.m;
  kiln_id *mem = NULL;
  uint32_t n = 0;
  int rc = kernel_members(f, k->root, &mem, &n);
  uint8_t *ok = rc == 0 ? kiln_calloc(m->ninstrs ? m->ninstrs : 1, 1) : NULL;
  if (rc == 0 && ok == NULL) rc = KILN_ENOMEM;
  kiln_sbuf *body = f->out;
  int indent = f->indent;
  f->out = top;
  f->indent = 1;
  for (uint32_t i = 0; rc == 0 && i < n; i++) {
    const kiln_instr *x = m->instrs[mem[i]];
    if (!one_value(f, x, ok)) continue;
    ok[x->id] = 1;
    bool load = false;
    for (uint32_t j = 0; j < x->noperands; j++)
      load |= x->operands[j] < m->ninstrs && f->in_first[x->operands[j]] != KILN__NO_INPUT;
    if (x->op == KILN_OP_CONSTANT ||
        (!load && (x->op == KILN_OP_CONVERT || !(kiln_opcode_flags(x->op) & KILN_OPF_ELEMENTWISE))))
      continue;
    kiln__ix y;
    if ((rc = kiln__ix_new(f, x->shape.rank, &y))) break;
    for (uint32_t d = 0; d < x->shape.rank; d++) kiln__ix_set(&y, d, "0");
    uint32_t v;
    if ((rc = kiln__emit_value1(f, x->id, &y, &v))) break;
    char name[16];
    const char *nm = name;
    snprintf(name, sizeof name, "v%u", v);
    rc = kiln__emit_bind(f, x->id, NULL, NULL, &nm, 1);
  }
  f->out = body;
  f->indent = indent;
  kiln_free(mem);
  kiln_free(ok);
  if (rc == KILN_ENOMEM) return kiln_status_set(g->st, rc, "codegen", "out of memory");
  return rc;
}

/* One form of the loop kernel; *used says whether the body read the
 * logical index (flat form) so the caller may prefer rows. */
static int loop_body(kiln__codegen *g, const kiln__kernel_spec *k, bool rows, kiln_sbuf *out,
                     bool *used) {
  const kiln_shape *s = k->out_shape[0];
  uint32_t r = s->rank;
  kiln_sbuf body = KILN_SBUF_INIT, pre = KILN_SBUF_INIT, top = KILN_SBUF_INIT;
  kiln__emit_fn f;
  int indent = rows ? 3 : 2;
  int rc = kiln__kernel_begin(g, k, &body, &f, indent);
  kiln__ix x;
  if (rc == 0) rc = hoist_scalars(g, k, &f, &top);
  if (rc == 0 && f.rc) rc = f.rc;
  if (rc == 0 && rows) rc = hoist_rows(g, k, &f, &pre);
  if (rc == 0 && f.rc) rc = f.rc;
  if (rc == 0) rc = kiln__ix_new(&f, r, &x);
  if (rc) goto out;
  int md = r ? minor_dim(s) : 0;
  int64_t minor = r ? s->dims[md] : 1;
  char lin[96];
  if (rows)
    snprintf(lin, sizeof lin, "(r * %lld + j)", (long long)minor);
  else
    snprintf(lin, sizeof lin, "i");
  for (uint32_t d = 0; d < r; d++) {
    if (rows && (int)d == md)
      kiln__ix_set(&x, d, "j");
    else
      kiln__ix_set(&x, d, "o%u", d);
  }
  x.root = true;
  x.lin = lin;
  x.lin_shape = s;
  rc = store_outputs(&f, k, &x);
  if (rc == 0 && f.rc) rc = f.rc;
  if (rc) goto out;
  *used = f.used_root;
  char loop[256];
  g->mod.target->range_loop(loop, sizeof loop, rows ? "r" : "i");
  kiln_sbuf_puts(out, kiln_sbuf_str(&top));
  /* Iteration i writes the outputs at i alone and no argument shares
   * memory with another (all restrict), so the iterations are independent;
   * GCC 12 does not draw that from restrict pointers that are locals, and
   * without being told it leaves a loop that gathers (an indexed read)
   * scalar. */
  bool shared = false;
  for (uint32_t a = 0; a < k->nargs; a++) shared |= k->arg_shared && k->arg_shared[a];
  if (!rows && !shared && g->mod.target->code == KILN__CODE_SO)
    kiln_sbuf_puts(out, "  #pragma GCC ivdep\n");
  kiln_sbuf_printf(out, "  %s {\n", loop);
  if (rows) {
    kiln__kernel_decompose(out, s, "r", 1, "o", 2);
    kiln_sbuf_puts(out, kiln_sbuf_str(&pre));
    kiln_sbuf_printf(out, "    for (int64_t j = 0; j < %lld; j++) {\n", (long long)minor);
    kiln_sbuf_puts(out, kiln_sbuf_str(&body));
    kiln_sbuf_puts(out, "    }\n  }\n");
  } else {
    if (f.used_root) kiln__kernel_decompose(out, s, "i", 0, "o", 2);
    kiln_sbuf_puts(out, kiln_sbuf_str(&body));
    kiln_sbuf_puts(out, "  }\n");
  }
out:
  kiln__emit_fn_free(&f);
  kiln_sbuf_free(&body);
  kiln_sbuf_free(&pre);
  kiln_sbuf_free(&top);
  return rc;
}

/* ---- reductions over major dims ----------------------------------------- */

static bool plain_type(kiln_dtype t) {
  switch (t) {
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

/* Most outputs the row form of a reduce over major dims accumulates. */
#define MAX_ROW_OUTS 8

/* Whether output `o` of the kernel is a reduce the row form can store: one
 * reduce of one input, every type the same and held in the buffer as it is
 * computed (the accumulator lives in the output between rows), an output
 * that no input shares, and in the input's layout the reduced dims all
 * more major than the kept ones. The kept ones may change order in the
 * output's layout (a reduce of a transpose): reduce_rows then runs over
 * the outputs in the input's order, so that consecutive iterations still
 * read consecutive input elements, and stores each where the output's
 * layout puts it. */
static const kiln_instr *rows_reduce1(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t o,
                                      bool *red) {
  const kiln_module *m = g->mod.m;
  uint32_t leaf = k->out_leaf[o];
  if (k->arg_shared && k->arg_shared[k->out_arg[o]]) return NULL;
  const kiln_instr *r = m->instrs[producer(m, k->root, &leaf)];
  if (r->op != KILN_OP_REDUCE || r->noperands != 2 || r->ncalled != 1 || leaf != 0 ||
      r->called[0] >= m->ncomps)
    return NULL;
  const kiln_shape *os = k->out_shape[o], *in = &m->instrs[r->operands[0]]->shape;
  const kiln_shape *init = &m->instrs[r->operands[1]]->shape;
  const kiln_computation *c = m->comps[r->called[0]];
  const kiln_instr *p0 = kiln_computation_param(m, c, 0), *p1 = kiln_computation_param(m, c, 1);
  kiln_dtype t = os->dtype;
  if (!plain_type(t) || !kiln_shape_is_array(&r->shape) || !kiln_shape_is_array(in) ||
      !kiln_shape_is_array(init) || r->shape.dtype != t || in->dtype != t || init->dtype != t ||
      p0 == NULL || p1 == NULL || !kiln_shape_is_array(&p0->shape) ||
      !kiln_shape_is_array(&p1->shape) || p0->shape.dtype != t || p1->shape.dtype != t ||
      kiln_computation_nparams(m, c) != 2)
    return NULL;
  const kiln_i64s *dl = kiln_instr_attr_ints(r, KILN_ATTR_DIMENSIONS);
  if (dl == NULL || dl->n == 0 || dl->n >= in->rank || os->rank + dl->n != in->rank) return NULL;
  memset(red, 0, in->rank * sizeof *red);
  for (uint32_t i = 0; i < dl->n; i++) {
    if (dl->v[i] < 0 || dl->v[i] >= in->rank || red[dl->v[i]]) return NULL;
    red[dl->v[i]] = true;
  }
  int64_t im[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(in, im);
  for (uint32_t q = 0; q < in->rank; q++)
    if (red[im[q]] == (q < os->rank)) return NULL;
  return r;
}

/* The reduces of every output when all of them can run in the row form
 * together (each as rows_reduce1 accepts, over one input shape and layout,
 * the same reduced dims and one output layout: a bias gradient and a
 * layernorm's scale gradient share their rows); *n of them into rs. */
static bool rows_reduces(kiln__codegen *g, const kiln__kernel_spec *k, bool *red,
                         const kiln_instr **rs, uint32_t *n) {
  const kiln_module *m = g->mod.m;
  if (k->nouts == 0 || k->nouts > MAX_ROW_OUTS) return false;
  for (uint32_t o = 0; o < k->nouts; o++) {
    bool red1[KILN__EMIT_MAXR];
    const kiln_instr *r = rows_reduce1(g, k, o, o ? red1 : red);
    if (r == NULL) return false;
    for (uint32_t j = 0; j < o; j++) /* two outputs of one reduce: not the row form */
      if (rs[j] == r) return false;
    rs[o] = r;
    if (o == 0) continue;
    const kiln_shape *in0 = &m->instrs[rs[0]->operands[0]]->shape;
    const kiln_shape *in = &m->instrs[r->operands[0]]->shape;
    if (!kiln_shape_equal(in0, in, true) ||
        !kiln_shape_equal(k->out_shape[0], k->out_shape[o], true) ||
        memcmp(red, red1, in->rank * sizeof *red) != 0)
      return false;
  }
  *n = k->nouts;
  return true;
}

/* The row form of reduces over major dims: the outputs [begin, end) take
 * their init values, then each reduced position, in row-major order, is
 * combined into all of them. Every output still combines its inputs in the
 * interpreter's order, but consecutive iterations read consecutive inputs
 * and the inner loop vectorizes, where one output at a time would walk its
 * column with a stride of a whole row. Several outputs share the loops and
 * the values their inputs have in common. */
/* Bytes of stack the cpu row form's accumulators take at most, per
 * invocation (all outputs together). */
#define ROW_ACC_BYTES 16384

/* The cpu row form of reduce_rows, whose range is rows of the input's
 * minor dim (kept, `minor` long, the loop over it innermost, so that it
 * vectorizes where one flat index decomposed per element does not). The
 * accumulators of a reduce of a transpose are a stack block in the
 * input's order, `cr` rows at a time, each output stored where its layout
 * puts it once its rows are done; otherwise they are the output rows
 * themselves. `vs` is the output in the input's order, `perm` whether
 * that differs from its layout. Combination order as reduce_rows. */
static int reduce_rows_cpu(kiln__codegen *g, const kiln__kernel_spec *k,
                           const kiln_instr *const *rs, uint32_t nr, const bool *red,
                           const kiln_shape *vs, bool perm, int64_t cr, kiln__emit_fn *f) {
  const kiln_module *m = g->mod.m;
  const kiln_shape *os = k->out_shape[0];
  const kiln_instr *in = m->instrs[rs[0]->operands[0]];
  const char *t = kiln__ctype(&g->mod, os->dtype);
  int md = minor_dim(&in->shape), vmd = minor_dim(vs);
  int64_t minor = in->shape.dims[md];
  uint32_t fn[MAX_ROW_OUTS], init[MAX_ROW_OUTS], marks[KILN__EMIT_MAXR + 2], nl = 0;
  kiln__ix s0 = {0}, y, ox;
  int rc = 0;
  for (uint32_t o = 0; o < nr && rc == 0; o++) {
    rc = kiln__emit_comp_fn(&g->mod, rs[o]->called[0], rs[o], &fn[o]);
    if (rc == 0) rc = kiln__emit_value1(f, rs[o]->operands[1], &s0, &init[o]);
  }
  if (rc == 0) rc = kiln__ix_new(f, in->shape.rank, &y);
  if (rc == 0) rc = kiln__ix_new(f, os->rank, &ox);
  if (rc) return rc;
  for (uint32_t d = 0; d < os->rank; d++) {
    if ((int)d == vmd)
      kiln__ix_set(&ox, d, "j");
    else
      kiln__ix_set(&ox, d, "o%u", d);
  }
  char at[512];
  kiln__ix_offset(f, &ox, os, at, sizeof at);
  /* acc<o>(w, j): the accumulator of the output at row w, position j. */
  char acc[MAX_ROW_OUTS][96];
  uint32_t chunk =
      kiln__emit_open(f, "for (int64_t w0 = begin; w0 < end; w0 += %lldLL)", (long long)cr);
  kiln__emit_line(f, "const int64_t w1 = w0 + %lldLL < end ? w0 + %lldLL : end;", (long long)cr,
                  (long long)cr);
  for (uint32_t o = 0; o < nr; o++) {
    if (perm) {
      kiln__emit_line(f, "%s a%u[%lld];", t, o, (long long)(cr * minor));
      snprintf(acc[o], sizeof acc[o], "a%u[(w - w0) * %lldLL + j]", o, (long long)minor);
    } else {
      snprintf(acc[o], sizeof acc[o], "b%u[w * %lldLL + j]", k->out_arg[o], (long long)minor);
    }
  }
  const char *rows = "for (int64_t w = w0; w < w1; w++)";
  uint32_t mk = kiln__emit_open(f, "%s", rows);
  uint32_t mj = kiln__emit_open(f, "for (int64_t j = 0; j < %lldLL; j++)", (long long)minor);
  for (uint32_t o = 0; o < nr; o++) kiln__emit_line(f, "%s = v%u;", acc[o], init[o]);
  kiln__emit_close(f, mj, NULL);
  kiln__emit_close(f, mk, NULL);
  for (uint32_t d = 0, j = 0; d < in->shape.rank; d++) {
    if (!red[d] && (int)d == md) {
      kiln__ix_set(&y, d, "j");
      j++;
      continue;
    }
    if (!red[d]) {
      kiln__ix_set(&y, d, "o%u", j++);
      continue;
    }
    uint32_t rv = kiln__emit_newvar(f);
    marks[nl++] = kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", rv, rv,
                                  (long long)in->shape.dims[d], rv);
    kiln__ix_set(&y, d, "r%u", rv);
  }
  marks[nl++] = kiln__emit_open(f, "%s", rows);
  kiln__kernel_decompose(f->out, vs, "w", 1, "o", f->indent);
  marks[nl++] = kiln__emit_open(f, "for (int64_t j = 0; j < %lldLL; j++)", (long long)minor);
  for (uint32_t o = 0; o < nr && rc == 0; o++) {
    uint32_t v, a = kiln__emit_newvar(f);
    rc = kiln__emit_value1(f, rs[o]->operands[0], &y, &v);
    if (rc == 0) {
      uint32_t args[2] = {a, v};
      kiln__emit_line(f, "%s v%u = %s;", t, a, acc[o]);
      kiln__emit_call_fn(f, fn[o], args, 2, &a, 1);
      kiln__emit_line(f, "%s = v%u;", acc[o], a);
    }
  }
  while (nl-- > 0) kiln__emit_close(f, marks[nl], NULL);
  if (perm) {
    mk = kiln__emit_open(f, "%s", rows);
    kiln__kernel_decompose(f->out, vs, "w", 1, "o", f->indent);
    mj = kiln__emit_open(f, "for (int64_t j = 0; j < %lldLL; j++)", (long long)minor);
    for (uint32_t o = 0; o < nr; o++)
      kiln__emit_line(f, "b%u[%s] = %s;", k->out_arg[o], at, acc[o]);
    kiln__emit_close(f, mj, NULL);
    kiln__emit_close(f, mk, NULL);
  }
  kiln__emit_close(f, chunk, NULL);
  return rc;
}

static int reduce_rows(kiln__codegen *g, const kiln__kernel_spec *k, const kiln_instr *const *rs,
                       uint32_t nr, const bool *red, kiln_sbuf *out, uint64_t *range) {
  const kiln_module *m = g->mod.m;
  const kiln_shape *os = k->out_shape[0];
  const kiln_instr *in = m->instrs[rs[0]->operands[0]];
  const char *t = kiln__ctype(&g->mod, os->dtype);
  uint32_t fn[MAX_ROW_OUTS], init[MAX_ROW_OUTS], marks[KILN__EMIT_MAXR + 1], nl = 0;
  kiln__emit_fn f;
  kiln__ix s0 = {0}, y;
  int rc = kiln__kernel_begin(g, k, out, &f, 1);
  *range = (uint64_t)kiln_shape_elements(os);
  if (rc) goto out;
  /* The order of the loop over the outputs: the output's layout, or the
   * kept dims in the input's (a reduce of a transpose); then `at` is where
   * output i goes in the buffer. */
  kiln_shape vs = *os;
  kiln_layout vl = {0};
  int64_t vm[KILN__EMIT_MAXR], im[KILN__EMIT_MAXR];
  bool perm = false;
  kiln_shape_minor_to_major(&in->shape, im);
  for (uint32_t q = 0, j = 0; q < in->shape.rank; q++) {
    if (red[im[q]]) continue;
    int64_t od = 0; /* the output dim of input dim im[q] */
    for (int64_t d = 0; d < im[q]; d++) od += !red[d];
    vm[j++] = od;
  }
  int64_t om[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(os, om);
  for (uint32_t q = 0; q < os->rank; q++) perm |= vm[q] != om[q];
  if (perm) {
    vl.minor_to_major = vm;
    vl.rank = os->rank;
    vs.layout = &vl;
  }
  /* On cpu, rows of the input's minor dim when it is 8 or longer and, for
   * a transpose, one of them fits the stack; cr rows at a time, whose
   * accumulators stay in cache (4 times the stack's bytes when they are
   * the output's). */
  int64_t minor = in->shape.dims[minor_dim(&in->shape)];
  int64_t cr = (int64_t)(ROW_ACC_BYTES / (kiln_dtype_size(os->dtype) * nr)) / minor;
  if (!perm) cr = cr * 4 > 1 ? cr * 4 : 1;
  if (g->mod.target->code == KILN__CODE_SO && minor >= 8 && cr >= 1) {
    *range /= (uint64_t)minor;
    rc = reduce_rows_cpu(g, k, rs, nr, red, &vs, perm, cr, &f);
    if (rc == 0 && f.rc) rc = f.rc;
    goto out;
  }
  for (uint32_t o = 0; o < nr && rc == 0; o++) {
    rc = kiln__emit_comp_fn(&g->mod, rs[o]->called[0], rs[o], &fn[o]);
    if (rc == 0) rc = kiln__emit_value1(&f, rs[o]->operands[1], &s0, &init[o]);
  }
  if (rc == 0) rc = kiln__ix_new(&f, in->shape.rank, &y);
  if (rc) goto out;
  char loop[256], at[512] = "i";
  g->mod.target->range_loop(loop, sizeof loop, "i");
  kiln__ix ox;
  if (perm) {
    if ((rc = kiln__ix_new(&f, os->rank, &ox))) goto out;
    for (uint32_t d = 0; d < os->rank; d++) kiln__ix_set(&ox, d, "o%u", d);
    kiln__ix_offset(&f, &ox, os, at, sizeof at);
  }
  uint32_t mark = kiln__emit_open(&f, "%s", loop);
  if (perm) kiln__kernel_decompose(f.out, &vs, "i", 0, "o", f.indent);
  for (uint32_t o = 0; o < nr; o++)
    kiln__emit_line(&f, "b%u[%s] = v%u;", k->out_arg[o], at, init[o]);
  kiln__emit_close(&f, mark, NULL);
  for (uint32_t d = 0, j = 0; d < in->shape.rank; d++) {
    if (!red[d]) {
      kiln__ix_set(&y, d, "o%u", j++);
      continue;
    }
    uint32_t rv = kiln__emit_newvar(&f);
    marks[nl++] = kiln__emit_open(&f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", rv, rv,
                                  (long long)in->shape.dims[d], rv);
    kiln__ix_set(&y, d, "r%u", rv);
  }
  marks[nl++] = kiln__emit_open(&f, "%s", loop);
  kiln__kernel_decompose(f.out, &vs, "i", 0, "o", f.indent);
  for (uint32_t o = 0; o < nr && rc == 0; o++) {
    uint32_t v, acc = kiln__emit_newvar(&f), ob = k->out_arg[o];
    rc = kiln__emit_value1(&f, rs[o]->operands[0], &y, &v);
    if (rc == 0) {
      uint32_t args[2] = {acc, v};
      kiln__emit_line(&f, "%s v%u = b%u[%s];", t, acc, ob, at);
      kiln__emit_call_fn(&f, fn[o], args, 2, &acc, 1);
      kiln__emit_line(&f, "b%u[%s] = v%u;", ob, at, acc);
    }
  }
  while (nl-- > 0) kiln__emit_close(&f, marks[nl], NULL);
  if (rc == 0 && f.rc) rc = f.rc;
out:
  kiln__emit_fn_free(&f);
  return rc;
}

/* ---- reduce-window over rows --------------------------------------------- */

/* For rows_window: the input dim each output dim of reduce r reads (the
 * kept dims in order); false unless the output's minor physical dim is
 * the input's and is kept. */
static bool reduce_kept(const kiln_instr *r, const kiln_shape *in, const kiln_shape *os,
                        int64_t *in_dim) {
  const kiln_i64s *dl = kiln_instr_attr_ints(r, KILN_ATTR_DIMENSIONS);
  bool red[KILN__EMIT_MAXR] = {false};
  if (dl == NULL || dl->n == 0 || in->rank > KILN__EMIT_MAXR || os->rank + dl->n != in->rank)
    return false;
  for (uint32_t i = 0; i < dl->n; i++) {
    if (dl->v[i] < 0 || dl->v[i] >= in->rank || red[dl->v[i]]) return false;
    red[dl->v[i]] = true;
  }
  for (uint32_t d = 0, j = 0; d < in->rank; d++)
    if (!red[d]) in_dim[j++] = d;
  return os->rank >= 1 && in_dim[minor_dim(os)] == minor_dim(in);
}

/* Whether the kernel's one output is a reduce-window (pooling) whose
 * window spans one element of the output's minor physical dim, which is
 * also its input's, or a reduce that keeps its input's minor dim as the
 * output's (a mean over the spatial dims of NHWC): then each output row
 * is the combination, window position by window position, of whole input
 * rows, and the loop over the row can be the innermost one, where it
 * vectorizes (the general form loops over the window inside every
 * element). Types as rows_reduce1 wants them: the accumulator lives in
 * the output. */
static const kiln_instr *rows_window(kiln__codegen *g, const kiln__kernel_spec *k) {
  const kiln_module *m = g->mod.m;
  uint32_t leaf = k->out_leaf[0];
  if (k->nouts != 1 || (k->arg_shared && k->arg_shared[k->out_arg[0]])) return NULL;
  const kiln_instr *r = m->instrs[producer(m, k->root, &leaf)];
  if ((r->op != KILN_OP_REDUCE_WINDOW && r->op != KILN_OP_REDUCE) || r->noperands != 2 ||
      r->ncalled != 1 || leaf != 0 || r->called[0] >= m->ncomps)
    return NULL;
  const kiln_shape *os = k->out_shape[0], *in = &m->instrs[r->operands[0]]->shape;
  const kiln_shape *init = &m->instrs[r->operands[1]]->shape;
  const kiln_computation *c = m->comps[r->called[0]];
  const kiln_instr *p0 = kiln_computation_param(m, c, 0), *p1 = kiln_computation_param(m, c, 1);
  const kiln_attr *wa = kiln_instr_attr(r, KILN_ATTR_WINDOW);
  const kiln_window *w = wa ? wa->v.window : NULL;
  kiln_dtype t = os->dtype;
  if (!plain_type(t) || !kiln_shape_is_array(&r->shape) || !kiln_shape_is_array(in) ||
      !kiln_shape_is_array(init) || init->rank != 0 || r->shape.dtype != t || in->dtype != t ||
      init->dtype != t || p0 == NULL || p1 == NULL || !kiln_shape_is_array(&p0->shape) ||
      !kiln_shape_is_array(&p1->shape) || p0->shape.dtype != t || p1->shape.dtype != t ||
      kiln_computation_nparams(m, c) != 2 || os->rank < 2 || os->rank > KILN__EMIT_MAXR ||
      in->rank > KILN__EMIT_MAXR)
    return NULL;
  int md = minor_dim(os);
  if (r->op == KILN_OP_REDUCE) {
    int64_t in_dim[KILN__EMIT_MAXR];
    return reduce_kept(r, in, os, in_dim) && os->dims[md] >= 8 ? r : NULL;
  }
  if (w == NULL || w->rank != in->rank || in->rank != os->rank) return NULL;
  if (minor_dim(in) != md || in->dims[md] != os->dims[md] || os->dims[md] < 8) return NULL;
  for (uint32_t d = 0; d < w->rank; d++) {
    const kiln_window_dim *wd = &w->dims[d];
    if (wd->lhs_dilate != 1 || wd->reversal || wd->size < 1) return NULL;
    if ((int)d == md &&
        (wd->size != 1 || wd->stride != 1 || wd->pad_lo || wd->pad_hi || wd->rhs_dilate != 1))
      return NULL;
  }
  return r;
}

/* The rows form of rows_window's reduce-window: per output row, the row
 * takes the init value, then for each window position (skipping those in
 * the padding) the input row there is combined into it, element by
 * element. Every output still combines its window in the interpreter's
 * order (row-major over the window). */
static int window_rows(kiln__codegen *g, const kiln__kernel_spec *k, const kiln_instr *rw,
                       kiln_sbuf *out) {
  const kiln_module *m = g->mod.m;
  const kiln_shape *os = k->out_shape[0];
  const kiln_instr *in = m->instrs[rw->operands[0]];
  bool reduce = rw->op == KILN_OP_REDUCE;
  const kiln_window *w = reduce ? NULL : kiln_instr_attr(rw, KILN_ATTR_WINDOW)->v.window;
  const char *t = kiln__ctype(&g->mod, os->dtype);
  int md = minor_dim(os);
  int64_t in_dim[KILN__EMIT_MAXR], out_dim[KILN__EMIT_MAXR]; /* reduce: kept dims both ways */
  if (reduce) {
    reduce_kept(rw, &in->shape, os, in_dim);
    for (uint32_t d = 0; d < in->shape.rank; d++) out_dim[d] = -1;
    for (uint32_t j = 0; j < os->rank; j++) out_dim[in_dim[j]] = j;
  }
  int in_md = reduce ? (int)in_dim[md] : md;
  long long minor = (long long)os->dims[md];
  uint32_t ob = k->out_arg[0], fn, init, marks[KILN__EMIT_MAXR + 2], nl = 0;
  kiln__emit_fn f;
  kiln__ix s0 = {0}, y;
  int rc = kiln__kernel_begin(g, k, out, &f, 1);
  if (rc == 0) rc = kiln__emit_comp_fn(&g->mod, rw->called[0], rw, &fn);
  if (rc == 0) rc = kiln__ix_new(&f, in->shape.rank, &y);
  if (rc) goto out;
  char loop[256];
  g->mod.target->range_loop(loop, sizeof loop, "r");
  marks[nl++] = kiln__emit_open(&f, "%s", loop);
  kiln__kernel_decompose(f.out, os, "r", 1, "o", f.indent);
  if ((rc = kiln__emit_value1(&f, rw->operands[1], &s0, &init))) goto out;
  kiln__emit_line(&f, "for (int64_t j = 0; j < %lld; j++) b%u[r * %lld + j] = v%u;", minor, ob,
                  minor, init);
  kiln_sbuf skip = KILN_SBUF_INIT;
  for (uint32_t d = 0; d < in->shape.rank; d++) {
    if ((int)d == in_md) {
      kiln__ix_set(&y, d, "j");
      continue;
    }
    if (reduce && out_dim[d] >= 0) {
      kiln__ix_set(&y, d, "o%lld", (long long)out_dim[d]);
      continue;
    }
    if (reduce) { /* a reduced dim: all of it, in order */
      uint32_t rv = kiln__emit_newvar(&f);
      marks[nl++] = kiln__emit_open(&f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", rv, rv,
                                    (long long)in->shape.dims[d], rv);
      kiln__ix_set(&y, d, "r%u", rv);
      continue;
    }
    const kiln_window_dim *wd = &w->dims[d];
    uint32_t rv = kiln__emit_newvar(&f);
    marks[nl++] = kiln__emit_open(&f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", rv, rv,
                                  (long long)wd->size, rv);
    char pos[KILN__IX_LEN];
    kiln__ix_var(&f, pos, "o%u * %lld + r%u * %lld - %lld", d, (long long)wd->stride, rv,
                 (long long)wd->rhs_dilate, (long long)wd->pad_lo);
    if (wd->pad_lo != 0 || wd->pad_hi != 0)
      kiln_sbuf_printf(&skip, "%s(uint64_t)%s >= %lluu", skip.len ? " || " : "", pos,
                       (unsigned long long)in->shape.dims[d]);
    kiln__ix_set(&y, d, "%s", pos);
  }
  if (skip.len) kiln__emit_line(&f, "if (%s) continue;", kiln_sbuf_str(&skip));
  kiln_sbuf_free(&skip);
  marks[nl++] = kiln__emit_open(&f, "for (int64_t j = 0; j < %lld; j++)", minor);
  uint32_t v, acc = kiln__emit_newvar(&f);
  rc = kiln__emit_value1(&f, in->id, &y, &v);
  if (rc == 0) {
    uint32_t args[2] = {acc, v};
    kiln__emit_line(&f, "%s v%u = b%u[r * %lld + j];", t, acc, ob, minor);
    kiln__emit_call_fn(&f, fn, args, 2, &acc, 1);
    kiln__emit_line(&f, "b%u[r * %lld + j] = v%u;", ob, minor, acc);
  }
  while (nl-- > 0) kiln__emit_close(&f, marks[nl], NULL);
  if (rc == 0 && f.rc) rc = f.rc;
out:
  kiln__emit_fn_free(&f);
  return rc;
}

int kiln__kernel_loop(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t *kernel,
                      uint64_t *range) {
  const kiln_shape *s = k->out_shape[0];
  bool red[KILN__EMIT_MAXR];
  const kiln_instr *rs[MAX_ROW_OUTS];
  uint32_t nr;
  if (g->mod.target->coop_kernel) {
    kiln_sbuf out = KILN_SBUF_INIT;
    int rc = g->mod.target->coop_kernel(g, k, &out, range);
    if (rc == 0) {
      *kernel = g->nkernels;
      kiln__kernel_finish(g, k, kiln_sbuf_str(&out), *range);
    }
    kiln_sbuf_free(&out);
    if (rc <= 0) return rc;
  }
  if (rows_reduces(g, k, red, rs, &nr)) {
    kiln_sbuf out = KILN_SBUF_INIT;
    int rc = reduce_rows(g, k, rs, nr, red, &out, range);
    if (rc == 0) {
      *kernel = g->nkernels;
      kiln__kernel_finish(g, k, kiln_sbuf_str(&out), *range);
    }
    kiln_sbuf_free(&out);
    return rc;
  }
  int64_t n = kiln_shape_elements(s);
  const kiln_instr *rw = n > 0 ? rows_window(g, k) : NULL;
  if (rw) {
    kiln_sbuf out = KILN_SBUF_INIT;
    int rc = window_rows(g, k, rw, &out);
    if (rc == 0) {
      *range = (uint64_t)(n / s->dims[minor_dim(s)]);
      *kernel = g->nkernels;
      kiln__kernel_finish(g, k, kiln_sbuf_str(&out), *range);
    }
    kiln_sbuf_free(&out);
    return rc;
  }
  kiln_sbuf out = KILN_SBUF_INIT;
  bool used = false;
  g->wide = false;
  int rc = loop_body(g, k, false, &out, &used);
  int64_t minor = s->rank ? s->dims[minor_dim(s)] : 1;
  *range = (uint64_t)(n > 0 ? n : 0);
  if (rc == 0 && used && s->rank >= 2 && minor >= 8 && n > 0) {
    kiln_sbuf_reset(&out);
    rc = loop_body(g, k, true, &out, &used);
    *range = (uint64_t)(n / minor);
  }
  if (rc == 0) {
    *kernel = g->nkernels;
    kiln__kernel_finish(g, k, kiln_sbuf_str(&out), *range);
  }
  kiln_sbuf_free(&out);
  return rc;
}
