/* Scheduling: a sequential order for every computation that runs as a
 * program (everything but fused computations, whose order is irrelevant to
 * a loop kernel), chosen to lower the peak of live temporary bytes, then
 * is_scheduled=true.
 *
 * Memory is measured as kiln_cost_peak_bytes does: a value occupies its
 * bytes from its definition to its last use; tuple, get-tuple-element and
 * bitcast only extend their operands' lives; parameters and constants cost
 * nothing. Three orders are compared and the lowest peak wins (ties keep
 * the order already there, so a good input order is never disturbed):
 *  - the current order;
 *  - a list scheduler: among the instructions whose operands, control
 *    predecessors and (for side effects) earlier side effects are done,
 *    take the one with the best net effect on live bytes (bytes it frees by
 *    being the last user of its operands, minus the bytes it allocates);
 *    ties go to the earlier instruction of the current order;
 *  - a depth-first post-order from the root, operands first, each operand
 *    subtree finished before the next starts (what a recursive evaluator
 *    does; good for trees of reductions).
 * Dependencies are always kept: operands before users, control
 * predecessors before dependents, and side-effecting instructions
 * (including collectives, custom calls and rng) in their original relative
 * order.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/passes/cost.h"
#include "compiler/passes/passes.h"

typedef struct sctx {
  const kiln_module *m;
  const kiln_computation *c;
  uint32_t n;
  uint32_t *local;  /* per module instruction id: index in c, or UINT32_MAX */
  uint32_t *pstart; /* CSR of predecessors (edges counted with multiplicity) */
  uint32_t *preds;
  uint32_t *sstart; /* CSR of successors */
  uint32_t *succs;
  int64_t *bytes; /* own bytes per local index */
  bool *alias;    /* tuple / get-tuple-element / bitcast */
} sctx;

static bool ordered(const kiln_instr *x) {
  unsigned f = kiln_opcode_flags(x->op);
  return (f & (KILN_OPF_SIDE_EFFECT | KILN_OPF_COLLECTIVE | KILN_OPF_ASYNC)) != 0;
}

static bool is_alias_op(kiln_opcode op) {
  return op == KILN_OP_TUPLE || op == KILN_OP_GET_TUPLE_ELEMENT || op == KILN_OP_BITCAST;
}

static int64_t own_bytes(const kiln_instr *x) {
  if (is_alias_op(x->op) || x->op == KILN_OP_PARAMETER || x->op == KILN_OP_CONSTANT) return 0;
  /* kiln_shape_bytes is 0 for tuples: sum their leaves. */
  const kiln_shape *s = &x->shape;
  if (kiln_shape_is_array(s)) {
    int64_t b = kiln_shape_bytes(s);
    return b > 0 ? b : 0;
  }
  int64_t sum = 0;
  for (uint32_t i = 0; kiln_shape_is_tuple(s) && i < s->rank; i++) {
    int64_t b = kiln_shape_is_array(&s->tuple[i]) ? kiln_shape_bytes(&s->tuple[i]) : 0;
    sum += b > 0 ? b : 0;
  }
  return sum;
}

/* Builds predecessor and successor lists of computation c. */
static int build(sctx *s) {
  const kiln_module *m = s->m;
  const kiln_computation *c = s->c;
  uint32_t n = s->n, ne = 0, last = UINT32_MAX;
  for (uint32_t i = 0; i < n; i++) {
    const kiln_instr *x = m->instrs[c->instrs[i]];
    ne += x->noperands + x->ncontrol + 1;
  }
  s->pstart = kiln_calloc(n + 1, sizeof *s->pstart);
  s->preds = kiln_malloc((ne ? ne : 1) * sizeof *s->preds);
  s->sstart = kiln_calloc(n + 1, sizeof *s->sstart);
  s->succs = kiln_malloc((ne ? ne : 1) * sizeof *s->succs);
  s->bytes = kiln_malloc((n ? n : 1) * sizeof *s->bytes);
  s->alias = kiln_calloc(n ? n : 1, sizeof *s->alias);
  if (!s->pstart || !s->preds || !s->sstart || !s->succs || !s->bytes || !s->alias)
    return KILN_ENOMEM;
  uint32_t e = 0;
  for (uint32_t i = 0; i < n; i++) {
    const kiln_instr *x = m->instrs[c->instrs[i]];
    s->pstart[i] = e;
    for (uint32_t k = 0; k < x->noperands + x->ncontrol; k++) {
      kiln_id d = k < x->noperands ? x->operands[k] : x->control_preds[k - x->noperands];
      if (d < m->ninstrs && s->local[d] != UINT32_MAX) s->preds[e++] = s->local[d];
    }
    if (ordered(x)) {
      if (last != UINT32_MAX) s->preds[e++] = last;
      last = i;
    }
    s->bytes[i] = own_bytes(x);
    s->alias[i] = is_alias_op(x->op);
  }
  s->pstart[n] = e;
  for (uint32_t j = 0; j < e; j++) s->sstart[s->preds[j] + 1]++;
  for (uint32_t i = 0; i < n; i++) s->sstart[i + 1] += s->sstart[i];
  uint32_t *fill = kiln_calloc(n ? n : 1, sizeof *fill);
  if (fill == NULL) return KILN_ENOMEM;
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t j = s->pstart[i]; j < s->pstart[i + 1]; j++) {
      uint32_t p = s->preds[j];
      s->succs[s->sstart[p] + fill[p]++] = i;
    }
  kiln_free(fill);
  return 0;
}

/* ---- the list scheduler -------------------------------------------------- */

/* Bytes freed if x ran now: operands whose every remaining reference is
 * x's (an alias operand passes this on to its own operands, one level). */
static int64_t freed_by(const sctx *s, uint32_t x, const uint32_t *refs) {
  const kiln_instr *ins = s->m->instrs[s->c->instrs[x]];
  int64_t f = 0;
  for (uint32_t k = 0; k < ins->noperands; k++) {
    kiln_id d = ins->operands[k];
    if (d >= s->m->ninstrs || s->local[d] == UINT32_MAX) continue;
    uint32_t o = s->local[d], mine = 0;
    bool first = true;
    for (uint32_t j = 0; j < ins->noperands; j++) {
      if (ins->operands[j] != d) continue;
      mine++;
      if (j < k) first = false;
    }
    if (!first || refs[o] != mine) continue;
    if (!s->alias[o]) {
      f += s->bytes[o];
      continue;
    }
    const kiln_instr *a = s->m->instrs[d];
    for (uint32_t j = 0; j < a->noperands; j++) {
      kiln_id q = a->operands[j];
      if (q < s->m->ninstrs && s->local[q] != UINT32_MAX && refs[s->local[q]] == 1)
        f += s->bytes[s->local[q]];
    }
  }
  return f;
}

/* Drops one reference to v; an alias whose last reference goes drops its
 * references on its operands (iteratively: alias chains may be long). */
static void drop_ref(const sctx *s, uint32_t v, uint32_t *refs, uint32_t *stack) {
  uint32_t top = 0;
  stack[top++] = v;
  while (top) {
    uint32_t x = stack[--top];
    if (refs[x] == 0 || --refs[x] > 0 || !s->alias[x]) continue;
    const kiln_instr *a = s->m->instrs[s->c->instrs[x]];
    for (uint32_t j = 0; j < a->noperands; j++) {
      kiln_id q = a->operands[j];
      if (q < s->m->ninstrs && s->local[q] != UINT32_MAX) stack[top++] = s->local[q];
    }
  }
}

static int list_schedule(const sctx *s, kiln_id *out) {
  uint32_t n = s->n;
  uint32_t *indeg = kiln_calloc(n ? n : 1, sizeof *indeg);
  uint32_t *refs = kiln_calloc(n ? n : 1, sizeof *refs);
  uint32_t *ready = kiln_malloc((n ? n : 1) * sizeof *ready);
  uint32_t *stack = kiln_malloc(((size_t)s->pstart[n] + n + 1) * sizeof *stack);
  if (!indeg || !refs || !ready || !stack) {
    kiln_free(indeg);
    kiln_free(refs);
    kiln_free(ready);
    kiln_free(stack);
    return KILN_ENOMEM;
  }
  const kiln_module *m = s->m;
  for (uint32_t i = 0; i < n; i++) {
    indeg[i] = s->pstart[i + 1] - s->pstart[i];
    const kiln_instr *x = m->instrs[s->c->instrs[i]];
    refs[i]++; /* its definition, dropped once it ran if nothing uses it */
    for (uint32_t k = 0; k < x->noperands; k++)
      if (x->operands[k] < m->ninstrs && s->local[x->operands[k]] != UINT32_MAX)
        refs[s->local[x->operands[k]]]++;
  }
  if (s->c->root < m->ninstrs && s->local[s->c->root] != UINT32_MAX) refs[s->local[s->c->root]]++;
  uint32_t nready = 0;
  for (uint32_t i = 0; i < n; i++)
    if (indeg[i] == 0) ready[nready++] = i;
  for (uint32_t step = 0; step < n && nready; step++) {
    uint32_t best = 0;
    int64_t best_score = INT64_MIN;
    for (uint32_t r = 0; r < nready; r++) {
      uint32_t x = ready[r];
      int64_t score = freed_by(s, x, refs) - s->bytes[x];
      if (score > best_score || (score == best_score && x < ready[best])) {
        best = r;
        best_score = score;
      }
    }
    uint32_t x = ready[best];
    ready[best] = ready[--nready];
    out[step] = s->c->instrs[x];
    const kiln_instr *ins = m->instrs[s->c->instrs[x]];
    for (uint32_t k = 0; k < ins->noperands; k++)
      if (ins->operands[k] < m->ninstrs && s->local[ins->operands[k]] != UINT32_MAX)
        drop_ref(s, s->local[ins->operands[k]], refs, stack);
    drop_ref(s, x, refs, stack);
    for (uint32_t j = s->sstart[x]; j < s->sstart[x + 1]; j++)
      if (--indeg[s->succs[j]] == 0) ready[nready++] = s->succs[j];
  }
  kiln_free(indeg);
  kiln_free(refs);
  kiln_free(ready);
  kiln_free(stack);
  return 0;
}

/* ---- depth-first post-order ------------------------------------------------ */

static int dfs_schedule(const sctx *s, kiln_id *out) {
  uint32_t n = s->n, nout = 0;
  uint8_t *state = kiln_calloc(n ? n : 1, 1);
  uint32_t *stack = kiln_malloc((n ? n : 1) * sizeof *stack);
  uint32_t *next = kiln_calloc(n ? n : 1, sizeof *next);
  if (!state || !stack || !next) {
    kiln_free(state);
    kiln_free(stack);
    kiln_free(next);
    return KILN_ENOMEM;
  }
  /* From the root first, then whatever it does not reach, in order. */
  uint32_t root = s->c->root < s->m->ninstrs ? s->local[s->c->root] : UINT32_MAX;
  for (uint32_t t = 0; t <= n; t++) {
    uint32_t start = t == 0 ? root : t - 1;
    if (start >= n || state[start]) continue;
    uint32_t top = 0;
    stack[top++] = start;
    state[start] = 1;
    while (top) {
      uint32_t x = stack[top - 1];
      if (next[x] < s->pstart[x + 1] - s->pstart[x]) {
        uint32_t p = s->preds[s->pstart[x] + next[x]++];
        if (state[p] == 0) {
          state[p] = 1;
          stack[top++] = p;
        }
      } else {
        state[x] = 2;
        out[nout++] = s->c->instrs[x];
        top--;
      }
    }
  }
  kiln_free(state);
  kiln_free(stack);
  kiln_free(next);
  return 0;
}

static void free_sctx(sctx *s) {
  kiln_free(s->pstart);
  kiln_free(s->preds);
  kiln_free(s->sstart);
  kiln_free(s->succs);
  kiln_free(s->bytes);
  kiln_free(s->alias);
}

static int schedule_comp(kiln_module *m, uint32_t comp, uint32_t *local) {
  kiln_computation *c = m->comps[comp];
  sctx s = {m, c, c->ninstrs, local, NULL, NULL, NULL, NULL, NULL, NULL};
  for (uint32_t i = 0; i < s.n; i++) local[c->instrs[i]] = i;
  kiln_id *a = kiln_malloc((s.n ? s.n : 1) * sizeof *a);
  kiln_id *b = kiln_malloc((s.n ? s.n : 1) * sizeof *b);
  int rc = (a && b) ? build(&s) : KILN_ENOMEM;
  if (rc == 0) rc = list_schedule(&s, a);
  if (rc == 0) rc = dfs_schedule(&s, b);
  if (rc == 0) {
    int64_t p0 = kiln_cost_peak_bytes(m, comp, NULL);
    int64_t pa = kiln_cost_peak_bytes(m, comp, a);
    int64_t pb = kiln_cost_peak_bytes(m, comp, b);
    if (p0 < 0 || pa < 0 || pb < 0) {
      rc = KILN_ENOMEM;
    } else if (pa < p0 && pa <= pb) {
      memcpy(c->instrs, a, s.n * sizeof *a);
    } else if (pb < p0) {
      memcpy(c->instrs, b, s.n * sizeof *b);
    }
  }
  for (uint32_t i = 0; i < s.n; i++) local[c->instrs[i]] = UINT32_MAX;
  free_sctx(&s);
  kiln_free(a);
  kiln_free(b);
  return rc;
}

int kiln_pass_schedule(kiln_module *m, const kiln_pass_ctx *ctx) {
  bool *fused = kiln_calloc(m->ncomps ? m->ncomps : 1, sizeof *fused);
  uint32_t *local = kiln_malloc((m->ninstrs ? m->ninstrs : 1) * sizeof *local);
  int rc = 0;
  if (fused == NULL || local == NULL) {
    rc = KILN_ENOMEM;
    goto out_free;
  }
  for (uint32_t i = 0; i < m->ninstrs; i++) local[i] = UINT32_MAX;
  for (uint32_t i = 0; i < m->ninstrs; i++) {
    const kiln_instr *x = m->instrs[i];
    if (x->comp != KILN_NO_ID && x->op == KILN_OP_FUSION)
      for (uint32_t k = 0; k < x->ncalled; k++)
        if (x->called[k] < m->ncomps) fused[x->called[k]] = true;
  }
  for (uint32_t c = 0; c < m->ncomps && rc == 0; c++)
    if (!fused[c]) rc = schedule_comp(m, c, local);
  if (rc == 0) m->is_scheduled = 1;
out_free:
  kiln_free(fused);
  kiln_free(local);
  return rc ? kiln_status_set(ctx->st, rc, "schedule", "out of memory") : 0;
}
