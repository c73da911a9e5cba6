/* Lowering: step programs from the scheduled module (each computation's
 * instruction order is its schedule), and the executable's tables.
 *
 * Program 0 runs the entry; every while, conditional and call gets nested
 * programs numbered after the one that runs them. A while's state lives in
 * its slots: the operand is copied in before the loop and the body's
 * result copied back at the end of each iteration (through a staging slot
 * when one state leaf feeds another), each copy only where buffer
 * assignment gave the two values different slots (a leaf passed through,
 * updated in place or taken over needs none). Branches copy their result
 * into the caller's result slots only where buffer assignment did not put
 * the branch root there already (a parameter passed through, a value from
 * outside the branch); a call's result is always in them. The entry ends with
 * copies of result leaves that do not already sit in their output or
 * donated parameter slot.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/deadline.h"
#include "compiler/codegen/lower_internal.h"
#include "compiler/codegen/user_kernel_lower.h"
#include "compiler/ir/debug_print.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/user_kernel.h"

/* ---- preparation -------------------------------------------------------- */

static bool runs_programs(kiln_opcode op) {
  return op == KILN_OP_WHILE || op == KILN_OP_CONDITIONAL || op == KILN_OP_CALL;
}

/* Clones a program computation run from a second place, so that each has
 * one caller (and so its own slots). */
static int uniquify(kiln_module *m, kiln_status *st) {
  size_t cap = 0, scap = 0, ns = 0;
  uint8_t *seen = NULL;
  uint32_t *stack = NULL;
  int rc = 0;
  if (kiln_grow((void **)&seen, &cap, m->ncomps + 1, 1) ||
      kiln_grow((void **)&stack, &scap, 1, sizeof *stack))
    goto oom;
  memset(seen, 0, cap);
  stack[ns++] = m->entry;
  seen[m->entry] = 1;
  while (ns > 0) {
    const kiln_computation *c = m->comps[stack[--ns]];
    for (uint32_t i = 0; i < c->ninstrs; i++) {
      kiln_instr *ins = m->instrs[c->instrs[i]];
      if (!runs_programs(ins->op)) continue;
      for (uint32_t k = 0; k < ins->ncalled; k++) {
        uint32_t cc = ins->called[k];
        if (cc >= m->ncomps) {
          rc = kiln_status_set(st, KILN_EINVAL, ins->name, "called computation out of range");
          goto out;
        }
        if (seen[cc]) {
          char name[64];
          snprintf(name, sizeof name, "clone.%u", m->ncomps);
          if (kiln_computation_clone(m, cc, name, &cc)) goto oom;
          ins->called[k] = cc;
          size_t old = cap;
          if (kiln_grow((void **)&seen, &cap, m->ncomps + 1, 1)) goto oom;
          memset(seen + old, 0, cap - old);
        }
        if (kiln_grow((void **)&stack, &scap, ns + 1, sizeof *stack)) goto oom;
        seen[cc] = 1;
        stack[ns++] = cc;
      }
    }
  }
  goto out;
oom:
  rc = kiln_status_set(st, KILN_ENOMEM, "codegen", "out of memory");
out:
  kiln_free(seen);
  kiln_free(stack);
  return rc;
}

int kiln__lower_prepare(kiln_module *m, uint64_t **scratch, kiln_status *st) {
  *scratch = NULL;
  int rc = uniquify(m, st);
  if (rc) return rc;
  uint64_t *s = kiln_calloc(m->ninstrs ? m->ninstrs : 1, sizeof *s);
  if (s == NULL) return kiln_status_set(st, KILN_ENOMEM, "codegen", "out of memory");
  for (uint32_t i = 0; i < m->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[i];
    if (ins->comp == KILN_NO_ID) continue;
    if (ins->op == KILN_OP_SORT && ins->noperands > 0) {
      int64_t n = kiln_shape_elements(&m->instrs[ins->operands[0]]->shape);
      s[i] = n > 0 ? (uint64_t)n * 16 : 0;
    } else if (ins->op == KILN_OP_SCATTER) {
      s[i] = kiln__scatter_rows_scratch(m, ins); /* the updates sorted by block */
    } else if (ins->op == KILN_OP_FUSION) {
      const kiln_instr *d = kiln__fusion_gemm_dot(m, ins);
      const kiln_instr *root =
          ins->ncalled ? kiln_computation_root(m, m->comps[ins->called[0]]) : NULL;
      if (d && d != root) s[i] = (uint64_t)kiln_shape_bytes(&d->shape);
      if (d == NULL && root && root->op == KILN_OP_SCATTER)
        s[i] = kiln__scatter_rows_scratch(m, root);
    }
  }
  *scratch = s;
  return 0;
}

/* ---- steps and slots ---------------------------------------------------- */

int kiln__lower_fail(kiln__lctx *c, const kiln_instr *ins, int code, const char *fmt, ...) {
  char where[KILN_STATUS_WHERE_MAX], what[KILN_STATUS_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  kiln_instr_where(c->m, ins, where, sizeof where);
  return kiln_status_set(c->st, code, where, "%s %s: %s", kiln_opcode_name(ins->op), where, what);
}

static int oom(kiln__lctx *c) {
  return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
}

static int new_prog(kiln__lctx *c, uint32_t *id) {
  if (kiln_grow((void **)&c->progs, &c->progcap, c->nprogs + 1, sizeof *c->progs)) return oom(c);
  memset(&c->progs[c->nprogs], 0, sizeof *c->progs);
  *id = (uint32_t)c->nprogs++;
  return 0;
}

int kiln__lower_step(kiln__lctx *c, uint32_t prog, const kiln_step *s) {
  kiln__prog *p = &c->progs[prog];
  if (kiln_grow((void **)&p->steps, &p->cap, p->n + 1, sizeof *p->steps)) return oom(c);
  p->steps[p->n++] = *s;
  return 0;
}

static uint32_t *args_of(kiln__lctx *c, const uint32_t *a, uint32_t n) {
  return kiln_arena_memdup(c->e->arena, a, (n ? n : 1) * sizeof *a);
}

int kiln__lower_copy(kiln__lctx *c, uint32_t prog, uint32_t dst, uint32_t src, uint64_t bytes) {
  if (dst == src || bytes == 0) return 0;
  uint32_t a[2] = {dst, src};
  kiln_step s = {.kind = KILN_STEP_COPY, .range = bytes, .nargs = 2};
  if ((s.args = args_of(c, a, 2)) == NULL) return oom(c);
  return kiln__lower_step(c, prog, &s);
}

uint32_t kiln__lower_leaf_shapes(const kiln_shape *s, const kiln_shape **out, uint32_t cap) {
  if (!kiln_shape_is_tuple(s)) {
    if (cap) out[0] = s;
    return 1;
  }
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->rank; i++)
    n += kiln__lower_leaf_shapes(&s->tuple[i], out + (n < cap ? n : cap), n < cap ? cap - n : 0);
  return n;
}

static int64_t leaf_bytes(const kiln_shape *s) {
  return kiln_shape_is_array(s) ? kiln_shape_bytes(s) : 0;
}

/* ---- constants ---------------------------------------------------------- */

static void strides_of(const kiln_shape *s, int64_t *st) {
  int64_t m2m[KILN__EMIT_MAXR], acc = 1;
  kiln_shape_minor_to_major(s, m2m);
  for (uint32_t k = 0; k < s->rank; k++) {
    st[m2m[k]] = acc;
    acc *= s->dims[m2m[k]];
  }
}

/* Writes an array literal's elements into dst in shape s's physical order. */
static void put_physical(uint8_t *dst, const kiln_literal *lit, const kiln_shape *s) {
  size_t es = kiln_dtype_size(s->dtype);
  int64_t n = kiln_literal_elements(lit), st[KILN__EMIT_MAXR], idx[KILN__EMIT_MAXR] = {0};
  if (n <= 0 || lit->nbytes < (size_t)n * es || s->rank > KILN__EMIT_MAXR) return;
  strides_of(s, st);
  for (int64_t i = 0; i < n; i++) {
    int64_t off = 0;
    for (uint32_t d = 0; d < s->rank; d++) off += idx[d] * st[d];
    memcpy(dst + (size_t)off * es, (const uint8_t *)lit->data + (size_t)i * es, es);
    for (uint32_t d = s->rank; d-- > 0;) {
      if (++idx[d] < s->dims[d]) break;
      idx[d] = 0;
    }
  }
}

static const kiln_literal *literal_leaf(const kiln_literal *l, uint32_t *k) {
  if (!kiln_shape_is_tuple(&l->shape)) return (*k)-- == 0 ? l : NULL;
  for (uint32_t i = 0; i < l->shape.rank; i++) {
    const kiln_literal *r = literal_leaf(l->elems[i], k);
    if (r) return r;
  }
  return NULL;
}

static int fill_constant(kiln__lctx *c, const kiln_instr *k, const uint32_t *slots, uint32_t n) {
  const kiln_shape *ls[KILN__EMIT_MAXR];
  if (k->literal == NULL) return kiln__lower_fail(c, k, KILN_EINVAL, "constant without a value");
  uint32_t nl = kiln__lower_leaf_shapes(&k->shape, ls, KILN__EMIT_MAXR);
  if (nl != n || nl > KILN__EMIT_MAXR)
    return kiln__lower_fail(c, k, KILN_EUNIMPL, "constant tuple too large");
  for (uint32_t i = 0; i < n; i++) {
    uint32_t kk = i;
    const kiln_literal *lit = literal_leaf(k->literal, &kk);
    const kiln_slot *s = &c->slots[slots[i]];
    if (lit == NULL || !kiln_shape_is_array(ls[i])) continue;
    if (s->offset + s->size > c->nconsts || (uint64_t)leaf_bytes(ls[i]) > s->size)
      return kiln__lower_fail(c, k, KILN_EINTERNAL, "constant slot too small");
    put_physical(c->consts + s->offset, lit, ls[i]);
  }
  return 0;
}

int kiln__lower_const_slot(kiln__lctx *c, const kiln_instr *k, uint32_t **slots) {
  const kiln_shape *ls[KILN__EMIT_MAXR];
  uint32_t n = kiln__lower_leaf_shapes(&k->shape, ls, KILN__EMIT_MAXR);
  if (n > KILN__EMIT_MAXR) return kiln__lower_fail(c, k, KILN_EUNIMPL, "constant tuple too large");
  uint32_t *out = kiln_arena_alloc(c->scratch, n * sizeof *out);
  if (out == NULL) return oom(c);
  for (uint32_t i = 0; i < n; i++) {
    if (i == 0 && c->const_slot[k->id] != KILN_NO_SLOT) {
      for (uint32_t j = 0; j < n; j++) out[j] = c->const_slot[k->id] + j;
      *slots = out;
      return 0;
    }
    uint64_t size = (uint64_t)leaf_bytes(ls[i]), off = (c->nconsts + 63) / 64 * 64;
    if (kiln_grow((void **)&c->consts, &c->constcap, off + size + 1, 1) ||
        kiln_grow((void **)&c->slots, &c->slotcap, c->nslots + 1, sizeof *c->slots))
      return oom(c);
    memset(c->consts + c->nconsts, 0, off + size - c->nconsts);
    c->nconsts = off + size;
    c->slots[c->nslots] = (kiln_slot){.kind = KILN_SLOT_CONSTANT, .offset = off, .size = size};
    out[i] = (uint32_t)c->nslots++;
  }
  c->const_slot[k->id] = out[0];
  *slots = out;
  return fill_constant(c, k, out, n);
}

static int program_constants(kiln__lctx *c) {
  c->nconsts = c->ba->constant_bytes;
  if (kiln_grow((void **)&c->consts, &c->constcap, c->nconsts + 1, 1)) return oom(c);
  memset(c->consts, 0, c->nconsts);
  for (uint32_t i = 0; i < c->m->ninstrs; i++) {
    const kiln_instr *k = c->m->instrs[i];
    uint32_t n;
    const uint32_t *slots = kiln_buffer_leaves(c->ba, i, &n);
    if (k->op != KILN_OP_CONSTANT || n == 0 || k->comp == KILN_NO_ID) continue;
    int rc = fill_constant(c, k, slots, n);
    if (rc) return rc;
  }
  return 0;
}

/* ---- control flow ------------------------------------------------------- */

static int lower_comp(kiln__lctx *c, uint32_t comp, uint32_t prog);

static const kiln_instr *root_of(kiln__lctx *c, uint32_t comp) {
  return kiln_computation_root(c->m, c->m->comps[comp]);
}

/* lower_comp and lower_while recurse once per level of nested loops and
 * branches (up to --max-nesting, 4096), on threads of 8 MiB: the helpers
 * they call with arrays on the stack stay out of line, so that a level
 * costs a few hundred bytes, not the 2 KiB that overflowed. */
#define KILN_OUT_OF_LINE __attribute__((noinline))

/* Copies the leaves of instruction `src` into slots dst[0..n). */
static KILN_OUT_OF_LINE int copy_leaves(kiln__lctx *c, uint32_t prog, const kiln_instr *shape_of,
                                        kiln_id src, const uint32_t *dst, uint32_t n) {
  const kiln_shape *ls[KILN__EMIT_MAXR * 4];
  uint32_t ns, nl = kiln__lower_leaf_shapes(&shape_of->shape, ls, KILN__EMIT_MAXR * 4);
  const uint32_t *s = kiln_buffer_leaves(c->ba, src, &ns);
  if (ns != n || nl != n)
    return kiln__lower_fail(c, shape_of, KILN_EINTERNAL, "leaf counts differ");
  for (uint32_t i = 0; i < n; i++) {
    int rc = kiln__lower_copy(c, prog, dst[i], s[i], (uint64_t)leaf_bytes(ls[i]));
    if (rc) return rc;
  }
  return 0;
}

/* The body's result into the loop state, a parallel move: a copy runs
 * once no other pending copy still reads its target; a cycle is broken by
 * moving one source into the staging slot first. */
static KILN_OUT_OF_LINE int body_copies(kiln__lctx *c, uint32_t prog, const kiln_instr *w) {
  const kiln_instr *root = root_of(c, w->called[1]);
  const kiln_shape *ls[KILN__EMIT_MAXR * 4];
  uint32_t n, nr, src[KILN__EMIT_MAXR * 4];
  const uint32_t *dst = kiln_buffer_leaves(c->ba, w->id, &n);
  const uint32_t *rs = kiln_buffer_leaves(c->ba, root->id, &nr);
  uint32_t nl = kiln__lower_leaf_shapes(&w->shape, ls, KILN__EMIT_MAXR * 4);
  if (nr != n || nl != n || n > KILN__EMIT_MAXR * 4)
    return kiln__lower_fail(c, w, KILN_EUNIMPL, "loop state has too many leaves");
  bool pending[KILN__EMIT_MAXR * 4];
  uint32_t left = 0, stage = c->ba->scratch_slot[w->id];
  for (uint32_t i = 0; i < n; i++) {
    src[i] = rs[i];
    pending[i] = src[i] != dst[i];
    left += pending[i];
  }
  while (left > 0) {
    uint32_t pick = n;
    for (uint32_t i = 0; i < n && pick == n; i++) {
      if (!pending[i]) continue;
      bool read = false;
      for (uint32_t j = 0; j < n && !read; j++) read = j != i && pending[j] && src[j] == dst[i];
      if (!read) pick = i;
    }
    if (pick == n) { /* only cycles left */
      for (pick = 0; !pending[pick]; pick++) {
      }
      if (stage == KILN_NO_SLOT) return kiln__lower_fail(c, w, KILN_EINTERNAL, "no staging slot");
      int rc = kiln__lower_copy(c, prog, stage, src[pick], (uint64_t)leaf_bytes(ls[pick]));
      if (rc) return rc;
      src[pick] = stage;
      continue;
    }
    int rc = kiln__lower_copy(c, prog, dst[pick], src[pick], (uint64_t)leaf_bytes(ls[pick]));
    if (rc) return rc;
    pending[pick] = false;
    left--;
  }
  return 0;
}

static int lower_while(kiln__lctx *c, uint32_t prog, const kiln_instr *w) {
  uint32_t n, cond, body;
  const uint32_t *state = kiln_buffer_leaves(c->ba, w->id, &n);
  int rc = copy_leaves(c, prog, w, w->operands[0], state, n);
  if (rc || (rc = new_prog(c, &cond)) || (rc = new_prog(c, &body))) return rc;
  if ((rc = lower_comp(c, w->called[0], cond))) return rc;
  if ((rc = lower_comp(c, w->called[1], body))) return rc;
  if ((rc = body_copies(c, body, w))) return rc;
  uint32_t np;
  const uint32_t *pred = kiln_buffer_leaves(c->ba, root_of(c, w->called[0])->id, &np);
  if (np != 1) return kiln__lower_fail(c, w, KILN_EINVAL, "condition must return one pred");
  uint32_t subs[2] = {cond, body};
  kiln_step s = {.kind = KILN_STEP_WHILE, .nargs = 1, .nsub = 2};
  s.args = args_of(c, pred, 1);
  s.sub = args_of(c, subs, 2);
  if (s.args == NULL || s.sub == NULL) return oom(c);
  return kiln__lower_step(c, prog, &s);
}

/* conditional (branches) and call (one computation): nested programs that
 * end by copying their result into ins's slots. */
static int lower_branches(kiln__lctx *c, uint32_t prog, const kiln_instr *ins) {
  uint32_t n, *subs = kiln_arena_alloc(c->e->arena, (ins->ncalled + 1) * sizeof *subs);
  if (subs == NULL) return oom(c);
  const uint32_t *res = kiln_buffer_leaves(c->ba, ins->id, &n);
  for (uint32_t i = 0; i < ins->ncalled; i++) {
    int rc = new_prog(c, &subs[i]);
    if (rc == 0) rc = lower_comp(c, ins->called[i], subs[i]);
    if (rc == 0) rc = copy_leaves(c, subs[i], ins, root_of(c, ins->called[i])->id, res, n);
    if (rc) return rc;
  }
  kiln_step s = {.kind = ins->op == KILN_OP_CALL ? KILN_STEP_CALL : KILN_STEP_CONDITIONAL,
                 .nsub = ins->ncalled,
                 .sub = subs};
  if (ins->op == KILN_OP_CONDITIONAL) {
    uint32_t ns;
    const uint32_t *sel = kiln_buffer_leaves(c->ba, ins->operands[0], &ns);
    if (ns != 1) return kiln__lower_fail(c, ins, KILN_EINVAL, "selector must be a scalar");
    s.nargs = 1;
    if ((s.args = args_of(c, sel, 1)) == NULL) return oom(c);
  }
  return kiln__lower_step(c, prog, &s);
}

/* kiln.debug_print: the value copied on to the result, then a step that
 * prints it; the format travels as constant bytes (debug_print.h), never
 * as code. */
static int lower_debug_print(kiln__lctx *c, uint32_t prog, const kiln_instr *ins) {
  int rc = kiln_debug_print_check(c->m, ins, c->st);
  if (rc) return rc;
  uint32_t ns, nd;
  const uint32_t *src = kiln_buffer_leaves(c->ba, ins->operands[0], &ns);
  const uint32_t *dst = kiln_buffer_leaves(c->ba, ins->id, &nd);
  size_t nfmt;
  const char *fmt = kiln_debug_print_format(ins, &nfmt);
  size_t size = kiln_debug_record_size(&ins->shape, nfmt);
  if (ns != 1 || nd != 1 || size == 0)
    return kiln__lower_fail(c, ins, KILN_EUNIMPL, "debug print of this value");
  uint64_t off = (c->nconsts + 63) / 64 * 64;
  if (kiln_grow((void **)&c->consts, &c->constcap, off + size + 1, 1) ||
      kiln_grow((void **)&c->slots, &c->slotcap, c->nslots + 1, sizeof *c->slots))
    return oom(c);
  memset(c->consts + c->nconsts, 0, off - c->nconsts);
  kiln_debug_record_write(c->consts + off, &ins->shape, fmt, nfmt);
  c->nconsts = off + size;
  c->slots[c->nslots] = (kiln_slot){.kind = KILN_SLOT_CONSTANT, .offset = off, .size = size};
  uint32_t rec = (uint32_t)c->nslots++;
  if ((rc = kiln__lower_copy(c, prog, dst[0], src[0], (uint64_t)leaf_bytes(&ins->shape))))
    return rc;
  uint32_t a[2] = {dst[0], rec};
  kiln_step s = {.kind = KILN_STEP_DEBUG_PRINT, .nargs = 2};
  if ((s.args = args_of(c, a, 2)) == NULL) return oom(c);
  return kiln__lower_step(c, prog, &s);
}

static bool no_step(const kiln_module *m, const kiln_instr *ins) {
  switch (ins->op) {
  case KILN_OP_PARAMETER:
  case KILN_OP_CONSTANT:
  case KILN_OP_TUPLE:
  case KILN_OP_GET_TUPLE_ELEMENT:
  case KILN_OP_AFTER_ALL: return true;
  default: return kiln__is_alias_op(m, ins);
  }
}

/* Steps [from, n) of prog came from instruction id (profiles name them). */
static int mark_origin(kiln__lctx *c, uint32_t prog, size_t from, kiln_id id) {
  kiln__prog *p = &c->progs[prog];
  if (p->n == 0) return 0;
  size_t old = p->ocap;
  if (kiln_grow((void **)&p->origin, &p->ocap, p->n, sizeof *p->origin)) return oom(c);
  for (size_t k = old; k < p->ocap; k++) p->origin[k] = KILN_NO_ID;
  for (size_t k = from; k < p->n; k++) p->origin[k] = id;
  return 0;
}

static int lower_comp(kiln__lctx *c, uint32_t comp, uint32_t prog) {
  const kiln_computation *cp = c->m->comps[comp];
  for (uint32_t i = 0; i < cp->ninstrs; i++) {
    const kiln_instr *ins = c->m->instrs[cp->instrs[i]];
    size_t from = c->progs[prog].n;
    int rc;
    if (no_step(c->m, ins))
      rc = 0;
    else if (ins->op == KILN_OP_WHILE)
      rc = lower_while(c, prog, ins);
    else if (ins->op == KILN_OP_CONDITIONAL || ins->op == KILN_OP_CALL)
      rc = lower_branches(c, prog, ins);
    else if (kiln__lower_is_collective(c->m, ins))
      rc = kiln__lower_collective(c, prog, ins);
    else if (kiln_debug_print_is(ins))
      rc = lower_debug_print(c, prog, ins);
    else if (kiln_user_kernel_call(ins, NULL))
      rc = kiln__lower_user_kernel(c, prog, ins);
    else
      rc = kiln__lower_compute(c, prog, ins);
    if (rc == 0) rc = mark_origin(c, prog, from, ins->id);
    if (rc == 0) rc = kiln__deadline_check("codegen", c->st);
    if (rc) return rc;
  }
  return 0;
}

/* ---- the executable's tables -------------------------------------------- */

static int result_copies(kiln__lctx *c) {
  const kiln_instr *root = root_of(c, c->m->entry);
  const kiln_shape *ls[1024];
  uint32_t n, nl = kiln__lower_leaf_shapes(&root->shape, ls, 1024);
  const uint32_t *src = kiln_buffer_leaves(c->ba, root->id, &n);
  if (n != c->ba->nresults || nl != n || n > 1024)
    return kiln__lower_fail(c, root, KILN_EUNIMPL, "too many result leaves");
  /* Outputs first: a donated parameter may still be read by them. */
  for (int pass = 0; pass < 2; pass++)
    for (uint32_t o = 0; o < n; o++) {
      uint32_t dst = c->ba->result_slots[o];
      bool to_param = c->slots[dst].kind == KILN_SLOT_PARAM;
      if (to_param != (pass == 1)) continue;
      int rc = kiln__lower_copy(c, 0, dst, src[o], (uint64_t)leaf_bytes(ls[o]));
      if (rc) return rc;
    }
  return 0;
}

static int bindings(kiln__lctx *c, const kiln_instr *ins, kiln_binding *out, uint32_t *n) {
  const kiln_shape *ls[1024];
  uint32_t ns, nl = kiln__lower_leaf_shapes(&ins->shape, ls, 1024);
  const uint32_t *slots = kiln_buffer_leaves(c->ba, ins->id, &ns);
  if (nl > 1024 || nl != ns) return kiln__lower_fail(c, ins, KILN_EUNIMPL, "too many leaves");
  for (uint32_t i = 0; i < nl; i++) {
    if (kiln_shape_copy(c->e->arena, &out[*n].shape, ls[i])) return oom(c);
    out[(*n)++].slot = slots[i];
  }
  return 0;
}

static int fill_signature(kiln__lctx *c) {
  kiln_executable *e = c->e;
  const kiln_computation *ent = c->m->comps[c->m->entry];
  const kiln_instr *root = root_of(c, c->m->entry);
  e->nparams = kiln_computation_nparams(c->m, ent);
  e->param_shapes = kiln_arena_calloc(e->arena, e->nparams + 1, sizeof *e->param_shapes);
  uint32_t leaves = 0;
  for (uint32_t i = 0; i < e->nparams; i++) {
    const kiln_instr *p = kiln_computation_param(c->m, ent, i);
    if (p == NULL) return kiln__lower_fail(c, root, KILN_EINVAL, "parameter numbers have holes");
    leaves += kiln__lower_leaf_shapes(&p->shape, NULL, 0);
  }
  e->params = kiln_arena_calloc(e->arena, leaves + 1, sizeof *e->params);
  e->results = kiln_arena_calloc(e->arena, c->ba->nresults + 1, sizeof *e->results);
  if (e->param_shapes == NULL || e->params == NULL || e->results == NULL) return oom(c);
  for (uint32_t i = 0; i < e->nparams; i++) {
    const kiln_instr *p = kiln_computation_param(c->m, ent, i);
    if (kiln_shape_copy(e->arena, &e->param_shapes[i], &p->shape)) return oom(c);
    int rc = bindings(c, p, e->params, &e->nparam_leaves);
    if (rc) return rc;
  }
  if (kiln_shape_copy(e->arena, &e->result_shape, &root->shape)) return oom(c);
  const kiln_shape *ls[1024];
  uint32_t nl = kiln__lower_leaf_shapes(&root->shape, ls, 1024);
  for (uint32_t o = 0; o < nl && o < c->ba->nresults; o++) {
    if (kiln_shape_copy(e->arena, &e->results[o].shape, ls[o])) return oom(c);
    e->results[o].slot = c->ba->result_slots[o];
  }
  e->nresults = c->ba->nresults;
  return 0;
}

/* The op_name="..." of an instruction's metadata, or "". */
static const char *op_name_of(kiln_arena *a, const kiln_instr *ins) {
  const char *md = ins ? kiln_instr_attr_str(ins, KILN_ATTR_METADATA) : NULL;
  const char *p = md ? strstr(md, "op_name=\"") : NULL;
  if (p == NULL) return "";
  p += 9;
  size_t n = 0;
  while (p[n] && p[n] != '"') n += p[n] == '\\' && p[n + 1] ? 2 : 1;
  char *out = kiln_arena_alloc(a, n + 1);
  if (out == NULL) return "";
  memcpy(out, p, n);
  out[n] = 0;
  return out;
}

/* e->step_names / step_op_names from the programs' origins. */
static int step_origins(kiln__lctx *c) {
  kiln_executable *e = c->e;
  e->step_names = kiln_arena_calloc(e->arena, c->nprogs + 1, sizeof *e->step_names);
  e->step_op_names = kiln_arena_calloc(e->arena, c->nprogs + 1, sizeof *e->step_op_names);
  if (e->step_names == NULL || e->step_op_names == NULL) return oom(c);
  for (size_t p = 0; p < c->nprogs; p++) {
    const kiln__prog *pr = &c->progs[p];
    e->step_names[p] = kiln_arena_calloc(e->arena, pr->n + 1, sizeof **e->step_names);
    e->step_op_names[p] = kiln_arena_calloc(e->arena, pr->n + 1, sizeof **e->step_op_names);
    if (e->step_names[p] == NULL || e->step_op_names[p] == NULL) return oom(c);
    for (size_t i = 0; i < pr->n; i++) {
      kiln_id id = i < pr->ocap ? pr->origin[i] : KILN_NO_ID;
      const kiln_instr *ins = id != KILN_NO_ID ? c->m->instrs[id] : NULL;
      char buf[256];
      const char *on = op_name_of(e->arena, ins);
      if (ins == NULL) {
        snprintf(buf, sizeof buf, "result copy");
      } else if (ins->op == KILN_OP_FUSION && ins->ncalled == 1) {
        const kiln_computation *fc = c->m->comps[ins->called[0]];
        const kiln_instr *root = fc->root != KILN_NO_ID ? c->m->instrs[fc->root] : NULL;
        snprintf(buf, sizeof buf, "%.160s fusion(%s)", ins->name,
                 root ? kiln_opcode_name(root->op) : "?");
        /* A GEMM with its epilogue is the dot's work: its name first. */
        const kiln_instr *dot = kiln__fusion_gemm_dot(c->m, ins);
        if (on[0] == 0 && dot) on = op_name_of(e->arena, dot);
        if (on[0] == 0) on = op_name_of(e->arena, root);
      } else {
        snprintf(buf, sizeof buf, "%.160s %s", ins->name, kiln_opcode_name(ins->op));
      }
      e->step_names[p][i] = kiln_arena_strdup(e->arena, buf);
      e->step_op_names[p][i] = on;
      if (e->step_names[p][i] == NULL) return oom(c);
    }
  }
  return 0;
}

static int fill_tables(kiln__lctx *c) {
  kiln_executable *e = c->e;
  e->nslots = (uint32_t)c->nslots;
  e->slots = kiln_arena_memdup(e->arena, c->slots, (c->nslots + 1) * sizeof *c->slots);
  e->nconstants = c->nconsts;
  e->constants = kiln_arena_memdup(e->arena, c->consts, c->nconsts + 1);
  e->temp_bytes = c->ba->temp_bytes;
  e->peak_bytes = c->ba->peak_bytes;
  e->nprograms = (uint32_t)c->nprogs;
  e->programs = kiln_arena_calloc(e->arena, c->nprogs + 1, sizeof *e->programs);
  if (e->slots == NULL || e->constants == NULL || e->programs == NULL) return oom(c);
  for (size_t p = 0; p < c->nprogs; p++) {
    e->programs[p].nsteps = (uint32_t)c->progs[p].n;
    e->programs[p].steps = c->progs[p].n ? kiln_arena_memdup(e->arena, c->progs[p].steps,
                                                             c->progs[p].n * sizeof(kiln_step))
                                         : kiln_arena_calloc(e->arena, 1, sizeof(kiln_step));
    if (e->programs[p].steps == NULL) return oom(c);
  }
  e->nkernels = c->g->nkernels;
  return step_origins(c);
}

static bool rank_ok(const kiln_shape *s) {
  if (!kiln_shape_is_tuple(s)) return s->rank <= KILN__EMIT_MAXR;
  for (uint32_t i = 0; i < s->rank; i++)
    if (!rank_ok(&s->tuple[i])) return false;
  return true;
}

/* Kernels keep per-dim state in fixed arrays: refuse higher ranks up front. */
static int check_ranks(kiln__lctx *c) {
  for (uint32_t i = 0; i < c->m->ninstrs; i++) {
    const kiln_instr *ins = c->m->instrs[i];
    if (ins->comp != KILN_NO_ID && !rank_ok(&ins->shape))
      return kiln__lower_fail(c, ins, KILN_EUNIMPL,
                              "the %s backend cannot compile arrays of rank above %d",
                              c->g->mod.target->name, KILN__EMIT_MAXR);
  }
  return 0;
}

int kiln__lower(const kiln_module *m, const kiln_buffer_assignment *ba, kiln__codegen *g,
                kiln_executable *e, kiln_status *st) {
  kiln__lctx c = {.m = m, .ba = ba, .g = g, .e = e, .st = st};
  uint32_t entry;
  int rc = 0;
  c.scratch = kiln_arena_create();
  c.const_slot = kiln_malloc((m->ninstrs ? m->ninstrs : 1) * sizeof *c.const_slot);
  if (c.scratch == NULL || c.const_slot == NULL ||
      kiln_grow((void **)&c.slots, &c.slotcap, ba->nslots + 1, sizeof *c.slots)) {
    rc = oom(&c);
    goto out;
  }
  memset(c.const_slot, 0xff, (m->ninstrs ? m->ninstrs : 1) * sizeof *c.const_slot);
  memcpy(c.slots, ba->slots, ba->nslots * sizeof *c.slots);
  c.nslots = ba->nslots;
  if ((rc = check_ranks(&c))) goto out;
  if ((rc = program_constants(&c))) goto out;
  if ((rc = new_prog(&c, &entry))) goto out;
  if ((rc = lower_comp(&c, m->entry, entry))) goto out;
  if ((rc = result_copies(&c))) goto out;
  if ((rc = fill_signature(&c))) goto out;
  rc = fill_tables(&c);
out:
  for (size_t p = 0; p < c.nprogs; p++) {
    kiln_free(c.progs[p].steps);
    kiln_free(c.progs[p].origin);
  }
  kiln_free(c.progs);
  kiln_free(c.slots);
  kiln_free(c.consts);
  kiln_free(c.const_slot);
  kiln_arena_destroy(c.scratch);
  return rc;
}
