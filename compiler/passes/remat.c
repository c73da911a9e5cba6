/* Rematerialization under a memory budget (XLA's HloRematerialization):
 * when the scheduled ENTRY holds more bytes of temporaries live at once
 * than kiln_pass_ctx.memory_budget, values are computed again (or only
 * later) instead of being kept live across the peak.
 *
 * The measure is buffer assignment itself (the slots and live ranges it
 * would give the program now, with the scratch of GEMM epilogues and sorts),
 * so the peak this pass reaches is the peak the compiled program has.
 * First the ENTRY's calls of pure computations (jax.jit's nested jits) are
 * inlined, so that their values are the ENTRY's too. Then, step by step:
 *  1. place the buffers, find the position of the peak and the ENTRY
 *     instruction P running there;
 *  2. among the values whose temporary is live at the peak, defined before
 *     P, not read by P, and read again after it, weigh each: the bytes its
 *     slot gives back at the peak against the flops of computing it again
 *     just before its first later reader R. Its operands must be there at
 *     R: free (parameters, constants, outputs), live until R anyway, a copy
 *     of the same value made by an earlier step (kept until R, or moved up
 *     to it), computed again too (a chain, a few levels deep: a layer's
 *     activation from the previous layer's recomputed one) or, failing
 *     that, kept live longer, which costs their bytes at the peak;
 *  3. take the value with the most bytes saved per flop (weighted by the
 *     positions over the budget that it spans): a value with no reader
 *     before P is moved after the peak (no flops), the others are cloned
 *     before R and the readers from R on read the clone.
 * Steps repeat until the peak fits, or no value saves anything at the
 * peak (or the peak stops falling): then the budget is refused naming the
 * smallest peak reached. The steps are greedy and the best weighing
 * differs between programs: kiln_pass_remat tries five on copies of the
 * module and keeps the one that meets the budget with the fewest flops.
 *
 * A clone is never cloned again (it may move), and an earlier copy is kept
 * or moved before an original is computed a third time, so the extra flops
 * stay near one forward pass: what per-layer checkpointing costs. The pass
 * runs last, after CSE (which would merge the clones back) and after the
 * schedule it measures. Only pure instructions of the ENTRY move (no side
 * effect, randomness, collective, loop or control edge); loop bodies keep
 * their own order.
 *
 * Checkpoints: the values JAX passes through an optimization barrier
 * (jax.checkpoint's residuals, what its policy saved, e.g. the dots of
 * dots_saveable) are kept, never recomputed; values JAX already recomputes
 * for a checkpoint (op_name .../checkpoint/rematted_computation/...) and
 * the copies this pass makes may move but are not computed a third time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/buffer_assign.h"
#include "compiler/codegen/lower.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/cost.h"
#include "compiler/passes/passes.h"

#define CHAIN_DEPTH 4    /* operands computed again, levels deep */
#define MOVE_MAX 256     /* instructions one move may carry */
#define STALL_STEPS 64   /* steps without a lower peak before giving up */
#define MAX_STEPS 100000 /* an absolute bound */

/* F_KEEP: a checkpoint's residual; F_NOCLONE: already a recomputation;
 * F_PINNED: a control predecessor; F_MOVED: moved once already (a second
 * move would only trade places with what it made the peak). */
enum { F_KEEP = 1, F_NOCLONE = 2, F_PINNED = 4, F_MOVED = 8 };

typedef struct rm {
  kiln_module *m;
  const kiln_pass_ctx *ctx;
  kiln_remat_stats *stats;
  uint32_t comp;
  bool *impure;
  /* Persistent across steps, per instruction id (grown with the module). */
  kiln_id *orig;  /* the value an instruction is a copy of (itself when none) */
  uint8_t *flags; /* F_* */
  size_t cap;
  /* Per step. */
  kiln_buffer_assignment *ba;
  uint32_t n;     /* ENTRY instructions */
  uint32_t *idx;  /* per id: index in the ENTRY order, or UINT32_MAX */
  uint32_t *last; /* per id: index of its last reader, aliases followed; n: the root */
  kiln_id *head;  /* per original: first copy in order; next: the following one */
  kiln_id *next;
  kiln_users *users;
  int64_t qpos;  /* position of the peak */
  uint32_t pidx; /* ENTRY index running there */
  uint64_t peak;
  uint64_t budget;
  /* over[q]: positions before q whose live temporaries exceed the budget
   * (a prefix count, npos + 1 entries). */
  uint32_t *over;
  int64_t npos;
  /* Most live bytes over position ranges: a sparse table, level k holding
   * the maxima of 2^k positions from each (lmax[k * (npos + 1) + q]). */
  int64_t *lmax;
  uint32_t nlev;
  int variant; /* the weighing tried (kiln_pass_remat) */
  bool quiet;  /* a trial: nothing to kiln explain */
  /* The plan of the candidate being weighed. */
  kiln_id *moves, *clones; /* existing copies moved up; values cloned (operands first) */
  uint32_t nmoves, nclones;
  kiln_id *sfrom, *sto; /* readers from j on of sfrom[i] read sto[i] (a copy) */
  uint32_t nsubst;
  uint8_t *mark; /* per id: 1 in moves, 2 in clones */
} rm;

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static bool is_alias(const kiln_module *m, const kiln_instr *x) {
  return x->op == KILN_OP_TUPLE || x->op == KILN_OP_GET_TUPLE_ELEMENT || x->op == KILN_OP_BITCAST ||
         kiln__is_alias_op(m, x);
}

static int grow(rm *r) {
  size_t old = r->cap;
  if (r->m->ninstrs <= old) return 0;
  if (kiln_grow((void **)&r->orig, &r->cap, r->m->ninstrs, sizeof *r->orig)) return KILN_ENOMEM;
  size_t fcap = old;
  if (kiln_grow((void **)&r->flags, &fcap, r->cap, 1)) return KILN_ENOMEM;
  for (size_t i = old; i < r->cap; i++) {
    r->orig[i] = (kiln_id)i;
    r->flags[i] = 0;
  }
  return 0;
}

/* ---- measuring: buffer assignment as compile.c runs it -------------------- */

static void free_step(rm *r) {
  kiln_buffer_assignment_destroy(r->ba);
  r->ba = NULL;
  kiln_users_destroy(r->users);
  r->users = NULL;
  kiln_free(r->idx);
  kiln_free(r->last);
  kiln_free(r->head);
  kiln_free(r->next);
  kiln_free(r->mark);
  kiln_free(r->over);
  r->over = NULL;
  kiln_free(r->lmax);
  r->lmax = NULL;
  kiln_free(r->moves);
  kiln_free(r->clones);
  kiln_free(r->sfrom);
  kiln_free(r->sto);
  r->idx = r->last = NULL;
  r->head = r->next = r->moves = r->clones = r->sfrom = r->sto = NULL;
  r->mark = NULL;
}

typedef struct event {
  int64_t pos;
  int64_t delta;
} event;

static int cmp_event(const void *a, const void *b) {
  const event *x = a, *y = b;
  if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
  return (x->delta > y->delta) - (x->delta < y->delta); /* frees first */
}

/* The peak of live temporaries and where it is (the first position). */
static int find_peak(rm *r) {
  const kiln_buffer_assignment *ba = r->ba;
  event *ev = kiln_malloc((2 * (size_t)ba->nslots + 1) * sizeof *ev);
  if (ev == NULL) return KILN_ENOMEM;
  size_t ne = 0;
  for (uint32_t s = 0; s < ba->nslots; s++) {
    if (ba->slots[s].kind != KILN_SLOT_TEMP) continue;
    int64_t sz = (int64_t)round_up(ba->slots[s].size ? ba->slots[s].size : 1, ba->alignment);
    ev[ne++] = (event){ba->slot_def[s], sz};
    ev[ne++] = (event){ba->slot_last[s] + 1, -sz};
  }
  qsort(ev, ne, sizeof *ev, cmp_event);
  int64_t live = 0, best = 0, at = 0, npos = ne ? ev[ne - 1].pos + 1 : 1;
  r->over = kiln_malloc(((size_t)npos + 2) * sizeof *r->over);
  if (r->over == NULL) {
    kiln_free(ev);
    return KILN_ENOMEM;
  }
  r->npos = npos;
  uint32_t lev = 1;
  while (((int64_t)1 << lev) <= npos + 1) lev++;
  r->nlev = lev;
  r->lmax = kiln_malloc((size_t)lev * ((size_t)npos + 1) * sizeof *r->lmax);
  if (r->lmax == NULL) {
    kiln_free(ev);
    return KILN_ENOMEM;
  }
  r->over[0] = 0;
  int64_t q = 0;
  for (size_t i = 0; i < ne;) {
    int64_t pos = ev[i].pos;
    for (; q < pos && q <= npos; q++) {
      r->over[q + 1] = r->over[q] + ((uint64_t)live > (r->variant == 4 ? 0 : r->budget));
      r->lmax[q] = live;
    }
    for (; i < ne && ev[i].pos == pos; i++) live += ev[i].delta;
    if (live > best) best = live, at = pos;
  }
  for (; q <= npos; q++) {
    r->over[q + 1] = r->over[q] + ((uint64_t)live > (r->variant == 4 ? 0 : r->budget));
    r->lmax[q] = live;
  }
  size_t w = (size_t)npos + 1;
  for (uint32_t k = 1; k < lev; k++)
    for (size_t x = 0; x + ((size_t)1 << k) <= w; x++) {
      int64_t a = r->lmax[(k - 1) * w + x], b = r->lmax[(k - 1) * w + x + ((size_t)1 << (k - 1))];
      r->lmax[k * w + x] = a > b ? a : b;
    }
  kiln_free(ev);
  r->peak = (uint64_t)best;
  r->qpos = at;
  return 0;
}

static int measure(rm *r) {
  free_step(r);
  kiln_module *m = r->m;
  uint64_t *scratch = NULL;
  int rc = kiln__lower_prepare(m, &scratch, r->ctx->st);
  if (rc) return rc;
  kiln_buffer_options bo = {.scratch_bytes = scratch};
  rc = kiln_buffer_assign(m, &bo, &r->ba, r->ctx->st);
  kiln_free(scratch);
  if (rc) return rc;
  if ((rc = grow(r)) || (rc = find_peak(r))) return rc;
  /* Per computation, and the module gains computations (uniquify above,
   * cloned fusions): made again each step. */
  kiln_free(r->impure);
  if ((r->impure = kiln__impure_computations(m)) == NULL) return KILN_ENOMEM;
  const kiln_computation *c = m->comps[r->comp];
  size_t ni = m->ninstrs ? m->ninstrs : 1;
  r->n = c->ninstrs;
  r->idx = kiln_malloc(ni * sizeof *r->idx);
  r->last = kiln_malloc(ni * sizeof *r->last);
  r->head = kiln_malloc(ni * sizeof *r->head);
  r->next = kiln_malloc(ni * sizeof *r->next);
  r->mark = kiln_calloc(ni, 1);
  r->moves = kiln_malloc((MOVE_MAX + CHAIN_DEPTH * 64 + 2) * sizeof *r->moves);
  r->clones = kiln_malloc((MOVE_MAX + CHAIN_DEPTH * 64 + 2) * sizeof *r->clones);
  r->sfrom = kiln_malloc(ni * sizeof *r->sfrom);
  r->sto = kiln_malloc(ni * sizeof *r->sto);
  if (!r->idx || !r->last || !r->head || !r->next || !r->mark || !r->moves || !r->clones ||
      !r->sfrom || !r->sto)
    return KILN_ENOMEM;
  if ((rc = kiln_users_build(m, &r->users))) return rc;
  for (size_t i = 0; i < ni; i++) {
    r->idx[i] = r->last[i] = UINT32_MAX;
    r->head[i] = r->next[i] = KILN_NO_ID;
  }
  r->pidx = 0;
  for (uint32_t i = 0; i < r->n; i++) {
    kiln_id id = c->instrs[i];
    r->idx[id] = i;
    if (r->ba->instr_pos[id] >= 0 && r->ba->instr_pos[id] <= r->qpos) r->pidx = i;
  }
  /* Last readers, backwards: an alias's readers read its operand too. */
  for (uint32_t i = r->n; i-- > 0;) {
    kiln_id id = c->instrs[i];
    uint32_t nu, l = id == c->root ? r->n : 0;
    bool used = id == c->root;
    const kiln_id *u = kiln_users_of(r->users, id, &nu);
    for (uint32_t k = 0; k < nu; k++) {
      if (r->idx[u[k]] == UINT32_MAX) continue;
      uint32_t ul = r->idx[u[k]];
      if (is_alias(m, m->instrs[u[k]]) && r->last[u[k]] != UINT32_MAX && r->last[u[k]] > ul)
        ul = r->last[u[k]];
      if (!used || ul > l) l = ul;
      used = true;
    }
    r->last[id] = used ? l : i;
  }
  for (uint32_t i = r->n; i-- > 0;) {
    kiln_id id = c->instrs[i], o = r->orig[id];
    r->next[id] = r->head[o];
    r->head[o] = id;
  }
  return 0;
}

/* ---- weighing one value --------------------------------------------------- */

/* The bytes of x's temporaries that are not live at the peak. */
static uint64_t dead_bytes_at_peak(const rm *r, kiln_id x) {
  uint32_t n;
  const uint32_t *s = kiln_buffer_leaves(r->ba, x, &n);
  uint64_t b = 0;
  for (uint32_t i = 0; i < n; i++) {
    const kiln_slot *sl = &r->ba->slots[s[i]];
    if (sl->kind != KILN_SLOT_TEMP) continue;
    if (r->ba->slot_def[s[i]] <= r->qpos && r->qpos <= r->ba->slot_last[s[i]]) continue;
    b += round_up(sl->size ? sl->size : 1, r->ba->alignment);
  }
  return b;
}

/* Most live bytes at positions a..b (inclusive; 0 when empty). */
static int64_t live_max(const rm *r, int64_t a, int64_t b) {
  if (a < 0) a = 0;
  if (b > r->npos) b = r->npos;
  if (a > b) return 0;
  uint32_t k = 0;
  while (((int64_t)2 << k) <= b - a + 1) k++;
  size_t w = (size_t)r->npos + 1;
  int64_t x = r->lmax[k * w + (size_t)a], y = r->lmax[k * w + (size_t)(b - ((int64_t)1 << k) + 1)];
  return x > y ? x : y;
}

/* The bytes of x's temporaries. */
static uint64_t temp_bytes(const rm *r, kiln_id x) {
  uint32_t n;
  const uint32_t *s = kiln_buffer_leaves(r->ba, x, &n);
  uint64_t b = 0;
  for (uint32_t i = 0; i < n; i++)
    if (r->ba->slots[s[i]].kind == KILN_SLOT_TEMP)
      b += round_up(r->ba->slots[s[i]].size ? r->ba->slots[s[i]].size : 1, r->ba->alignment);
  return b;
}

/* What keeping x live from its last reader to index j costs: its bytes
 * when that would raise some position there above the peak, else 0. */
static uint64_t extend_cost(const rm *r, kiln_id x, uint32_t j) {
  const kiln_computation *c = r->m->comps[r->comp];
  if (r->last[x] >= j || j >= r->n) return 0;
  int64_t a = r->ba->instr_pos[c->instrs[r->last[x]]] + 1, b = r->ba->instr_pos[c->instrs[j]] - 1;
  uint64_t bytes = temp_bytes(r, x);
  return (uint64_t)live_max(r, a, b) + bytes > r->peak ? bytes : 0;
}

/* The bytes x's own temporary gives back at the peak once nothing after
 * the peak reads it (0 when it is not a temporary live there). */
static uint64_t live_bytes_at_peak(const rm *r, kiln_id x) {
  uint32_t n;
  const uint32_t *s = kiln_buffer_leaves(r->ba, x, &n);
  if (n != 1) return 0;
  const kiln_slot *sl = &r->ba->slots[s[0]];
  if (sl->kind != KILN_SLOT_TEMP) return 0;
  if (!(r->ba->slot_def[s[0]] <= r->qpos && r->qpos <= r->ba->slot_last[s[0]])) return 0;
  return round_up(sl->size ? sl->size : 1, r->ba->alignment);
}

static bool movable(const rm *r, const kiln_instr *x) {
  if (x->comp != r->comp || x->id == r->m->comps[r->comp]->root || x->ncontrol) return false;
  if (r->flags[x->id] & (F_KEEP | F_PINNED)) return false;
  switch (x->op) {
  case KILN_OP_PARAMETER:
  case KILN_OP_CONSTANT:
  case KILN_OP_WHILE:
  case KILN_OP_CONDITIONAL:
  case KILN_OP_CALL: return false;
  default: break;
  }
  if (!kiln_shape_is_array(&x->shape) || is_alias(r->m, x)) return false;
  return kiln__instr_is_pure(r->m, x, r->impure);
}

static bool clonable(const rm *r, const kiln_instr *x) {
  return movable(r, x) && !(r->flags[x->id] & F_NOCLONE) && r->orig[x->id] == x->id;
}

/* Whether x costs nothing to keep: a parameter, constant or output, or an
 * alias of one. */
static bool is_free(const rm *r, kiln_id x) {
  uint32_t n;
  const uint32_t *s = kiln_buffer_leaves(r->ba, x, &n);
  for (uint32_t i = 0; i < n; i++)
    if (r->ba->slots[s[i]].kind == KILN_SLOT_TEMP) return false;
  return true;
}

/* Adds x and the copies it reads from index j on to the moves (they go up
 * to just before j, in their order). false when one cannot move. */
static bool plan_move(rm *r, kiln_id x, uint32_t j) {
  if (r->mark[x] == 1) return true;
  const kiln_instr *ins = r->m->instrs[x];
  if (r->mark[x] || !movable(r, ins) || r->nmoves >= MOVE_MAX) return false;
  for (uint32_t k = 0; k < ins->noperands; k++) {
    kiln_id o = ins->operands[k];
    if (r->idx[o] != UINT32_MAX && r->idx[o] >= j && !plan_move(r, o, j)) return false;
  }
  r->mark[x] = 1;
  r->moves[r->nmoves++] = x;
  return true;
}

typedef struct plan_mark {
  uint32_t nmoves, nclones, nsubst;
} plan_mark;

static plan_mark plan_save(const rm *r) { return (plan_mark){r->nmoves, r->nclones, r->nsubst}; }

static void plan_undo(rm *r, plan_mark p) {
  for (uint32_t i = p.nmoves; i < r->nmoves; i++) r->mark[r->moves[i]] = 0;
  for (uint32_t i = p.nclones; i < r->nclones; i++) r->mark[r->clones[i]] = 0;
  r->nmoves = p.nmoves;
  r->nclones = p.nclones;
  r->nsubst = p.nsubst;
}

static void subst(rm *r, kiln_id from, kiln_id to) {
  if (from == to) return;
  for (uint32_t i = 0; i < r->nsubst; i++)
    if (r->sfrom[i] == from) return;
  r->sfrom[r->nsubst] = from;
  r->sto[r->nsubst++] = to;
}

static void plan_operand(rm *r, kiln_id o, uint32_t j, int depth, uint64_t *bytes, double *flops);

/* Plans a clone of x before index j (its operands first). */
static void plan_clone(rm *r, kiln_id x, uint32_t j, int depth, uint64_t *bytes, double *flops) {
  const kiln_instr *ins = r->m->instrs[x];
  kiln_cost c;
  kiln_cost_instr(r->m, ins, r->ctx->target, &c);
  *flops += c.flops;
  r->mark[x] = 2; /* before its operands: a value reads nothing of itself */
  for (uint32_t k = 0; k < ins->noperands; k++)
    plan_operand(r, ins->operands[k], j, depth, bytes, flops);
  r->clones[r->nclones++] = x;
}

/* How operand o of a value computed again before index j gets there:
 * adds its *bytes at the peak and the *flops, planning moves and clones. */
static void plan_operand(rm *r, kiln_id o, uint32_t j, int depth, uint64_t *bytes, double *flops) {
  if (r->mark[o] || is_free(r, o) || r->idx[o] == UINT32_MAX) return;
  /* A copy of the same value in the plan, live at j anyway, or made after
   * j and able to move up. */
  kiln_id later = KILN_NO_ID, after_peak = KILN_NO_ID;
  for (kiln_id c = r->head[r->orig[o]]; c != KILN_NO_ID; c = r->next[c]) {
    if (r->mark[c] || (r->idx[c] < j && r->last[c] >= j)) {
      subst(r, o, c);
      return;
    }
    if (r->idx[c] > r->pidx && r->idx[c] < j) after_peak = c;
    if (r->idx[c] > j && later == KILN_NO_ID) later = c;
  }
  /* A copy made after the peak and dead before j: kept until j, which
   * costs nothing at the peak. */
  if (after_peak != KILN_NO_ID) {
    subst(r, o, after_peak);
    if (r->variant == 2) *bytes += extend_cost(r, after_peak, j);
    return;
  }
  if (later != KILN_NO_ID) {
    plan_mark pm = plan_save(r);
    if (plan_move(r, later, j)) { /* made after the peak: no bytes there */
      subst(r, o, later);
      return;
    }
    plan_undo(r, pm);
  }
  uint64_t keep = r->idx[o] < r->pidx ? dead_bytes_at_peak(r, o) : 0;
  if (keep == 0) { /* live at the peak already, or made after it: kept longer */
    if (r->variant == 2) *bytes += extend_cost(r, o, j);
    return;
  }
  const kiln_instr *ins = r->m->instrs[o];
  if (depth < (r->variant == 3 ? 0 : CHAIN_DEPTH) && clonable(r, ins) &&
      r->nclones < CHAIN_DEPTH * 64) {
    uint64_t b = 0;
    double f = 0;
    plan_mark pm = plan_save(r);
    plan_clone(r, o, j, depth + 1, &b, &f);
    if (b < keep) {
      *bytes += b;
      *flops += f;
      return;
    }
    plan_undo(r, pm);
  }
  *bytes += keep;
}

typedef struct choice {
  kiln_id v;
  uint32_t j;    /* index of its first reader after the peak */
  bool clone;    /* else moved */
  uint64_t save; /* bytes at the peak */
  double flops;
  double score; /* bytes saved times the over-budget positions it spans, per flop */
} choice;

/* Weighs value v; false when it cannot help. The plan stays in r (marks
 * set) until plan_undo. */
static bool weigh(rm *r, kiln_id v, choice *out) {
  const kiln_instr *x = r->m->instrs[v];
  if (r->idx[v] >= r->pidx || !movable(r, x)) return false;
  uint64_t live = live_bytes_at_peak(r, v);
  if (live == 0) return false;
  uint32_t nu, j = UINT32_MAX;
  bool early = false;
  int64_t from = r->ba->instr_pos[v]; /* freed after its last reader before the peak */
  const kiln_id *u = kiln_users_of(r->users, v, &nu);
  for (uint32_t k = 0; k < nu; k++) {
    uint32_t ui = r->idx[u[k]];
    if (ui == UINT32_MAX) continue;
    if (ui == r->pidx) return false; /* read at the peak */
    if (ui < r->pidx) {
      int64_t up = r->ba->instr_pos[u[k]];
      if (up > from) from = up;
      /* An alias made before the peak and read after it keeps v live. */
      if (is_alias(r->m, r->m->instrs[u[k]]) && r->last[u[k]] >= r->pidx) return false;
      early = true;
    } else if (ui < j) {
      j = ui;
    }
  }
  if (j == UINT32_MAX || (early && !clonable(r, x))) return false;
  if (!early && (r->flags[v] & F_MOVED)) return false;
  r->nmoves = r->nclones = r->nsubst = 0;
  uint64_t cost = 0;
  double flops = 0;
  if (early) {
    plan_clone(r, v, j, 0, &cost, &flops);
  } else {
    r->mark[v] = 1;
    for (uint32_t k = 0; k < x->noperands; k++)
      plan_operand(r, x->operands[k], j, 0, &cost, &flops);
    r->mark[v] = 0;
  }
  if (cost >= live) {
    plan_undo(r, (plan_mark){0, 0, 0});
    return false;
  }
  int64_t to = r->ba->instr_pos[r->m->comps[r->comp]->instrs[j]];
  double span = 1;
  if (from >= 0 && to > from + 1 && to <= r->npos) span = r->over[to] - r->over[from + 1];
  if (span < 1) span = 1;
  if (r->variant == 1) span = 1;
  *out = (choice){v, j, early, live - cost, flops, (double)(live - cost) * span / (flops + 1)};
  return true;
}

static bool better(const choice *a, const choice *b) {
  /* Most bytes per flop over the positions still over the budget (a move,
   * with no flops, first); then the most bytes. */
  if (a->score != b->score) return a->score > b->score;
  return a->save > b->save;
}

/* ---- applying ------------------------------------------------------------- */

/* What a reader from j on reads for value o: its planned substitute (or
 * o), or that one's clone. */
static kiln_id resolve(const kiln_id *sub, const kiln_id *cl, kiln_id o) {
  kiln_id c = sub[o] != KILN_NO_ID ? sub[o] : o;
  return cl[c] != KILN_NO_ID ? cl[c] : c;
}

static int clone_one(rm *r, kiln_id x, const kiln_id *sub, const kiln_id *cl, kiln_id *out) {
  kiln_module *m = r->m;
  const kiln_instr *src = m->instrs[x];
  kiln_id *ops = kiln_malloc((src->noperands + 1) * sizeof *ops);
  if (ops == NULL) return KILN_ENOMEM;
  for (uint32_t k = 0; k < src->noperands; k++) ops[k] = resolve(sub, cl, src->operands[k]);
  char name[256];
  snprintf(name, sizeof name, "%.200s.remat%u", src->name, m->ninstrs);
  kiln_instr *c = kiln_instr_clone(m, r->comp, src, ops, src->noperands, NULL, name);
  kiln_free(ops);
  if (c == NULL) return KILN_ENOMEM;
  if (c->op == KILN_OP_FUSION && c->ncalled == 1 && c->called[0] < m->ncomps) {
    uint32_t fc;
    snprintf(name, sizeof name, "%.200s.remat%u", m->comps[c->called[0]]->name, m->ncomps);
    if (kiln_computation_clone(m, c->called[0], name, &fc)) return KILN_ENOMEM;
    c->called[0] = fc;
  }
  *out = c->id;
  return 0;
}

/* Carries out the plan weigh left for ch: the moved copies, the clones
 * (operands first) and v itself when it moves go just before index j, and
 * the readers from j on read the copies. */
static int apply(rm *r, const choice *ch) {
  kiln_module *m = r->m;
  kiln_computation *c = m->comps[r->comp];
  uint32_t n = r->n;
  size_t ni = m->ninstrs + r->nclones + 1;
  kiln_id *sub = kiln_malloc(ni * sizeof *sub), *cl = kiln_malloc(ni * sizeof *cl);
  kiln_id *made = kiln_malloc((r->nclones + 1) * sizeof *made);
  kiln_id *order = kiln_malloc((n + r->nclones + 1) * sizeof *order);
  bool *moved = kiln_calloc(ni, sizeof *moved);
  int rc = 0;
  if (sub == NULL || cl == NULL || made == NULL || order == NULL || moved == NULL) {
    rc = KILN_ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < ni; i++) sub[i] = cl[i] = KILN_NO_ID;
  for (uint32_t i = 0; i < r->nmoves; i++) moved[r->moves[i]] = true;
  if (!ch->clone) moved[ch->v] = true;
  for (uint32_t i = 0; i < r->nsubst; i++) sub[r->sfrom[i]] = r->sto[i];
  for (uint32_t i = 0; i < r->nclones; i++) { /* operands first */
    kiln_id old = r->clones[i];
    if ((rc = clone_one(r, old, sub, cl, &made[i]))) goto out;
    if ((rc = grow(r))) goto out;
    r->orig[made[i]] = r->orig[old];
    r->flags[made[i]] = r->flags[old] | F_NOCLONE;
    cl[old] = made[i];
  }
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (i == ch->j) {
      for (uint32_t t = 0; t < n; t++)
        if (moved[c->instrs[t]] && c->instrs[t] != ch->v) order[k++] = c->instrs[t];
      for (uint32_t t = 0; t < r->nclones; t++) order[k++] = made[t];
      if (!ch->clone) order[k++] = ch->v;
    }
    if (!moved[c->instrs[i]]) order[k++] = c->instrs[i];
  }
  /* Readers from j on (not the moved or new ones) read the copies. */
  for (uint32_t i = ch->j; i < n; i++) {
    kiln_instr *u = m->instrs[c->instrs[i]];
    if (moved[u->id]) continue;
    for (uint32_t q = 0; q < u->noperands; q++)
      if (u->operands[q] < ni) u->operands[q] = resolve(sub, cl, u->operands[q]);
  }
  if (c->root < ni) c->root = resolve(sub, cl, c->root);
  memcpy(c->instrs, order, k * sizeof *order);
  c->ninstrs = k;
  r->stats->extra_flops += ch->flops;
  r->stats->recomputed += r->nclones;
  r->stats->moved += !ch->clone;
  if (!ch->clone) r->flags[ch->v] |= F_MOVED;
out:
  kiln_free(sub);
  kiln_free(cl);
  kiln_free(made);
  kiln_free(order);
  kiln_free(moved);
  return rc;
}

/* ---- the pass ------------------------------------------------------------- */

static bool names_remat(const kiln_instr *x) {
  const char *md = kiln_instr_attr_str(x, KILN_ATTR_METADATA);
  return md && strstr(md, "rematted_computation") != NULL;
}

/* Checkpoint marks and control edges, once. */
static void mark_flags(rm *r) {
  const kiln_module *m = r->m;
  const kiln_computation *c = m->comps[r->comp];
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *x = m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < x->ncontrol; k++)
      if (x->control_preds[k] < m->ninstrs) r->flags[x->control_preds[k]] |= F_PINNED;
    if (names_remat(x)) r->flags[x->id] |= F_NOCLONE;
    if (x->op == KILN_OP_FUSION && x->ncalled == 1 && x->called[0] < m->ncomps) {
      const kiln_instr *root = kiln_computation_root(m, m->comps[x->called[0]]);
      if (root && names_remat(root)) r->flags[x->id] |= F_NOCLONE;
    }
    if (x->op != KILN_OP_OPTIMIZATION_BARRIER) continue;
    for (uint32_t k = 0; k < x->noperands; k++) {
      const kiln_instr *o = m->instrs[x->operands[k]];
      r->flags[o->id] |= F_KEEP;
      if (o->op == KILN_OP_TUPLE)
        for (uint32_t t = 0; t < o->noperands; t++) r->flags[o->operands[t]] |= F_KEEP;
    }
  }
}

/* Inlines the ENTRY's calls of pure computations (jax.jit's nested jits:
 * a where, a log_softmax), innermost last, so that their values are values
 * of the ENTRY that can be recomputed. A call runs its computation's
 * instructions at its position; in line they run in the same order, and a
 * call's result was its root's buffers anyway. */
static int inline_calls(rm *r) {
  kiln_module *m = r->m;
  for (uint32_t rounds = 0; rounds < 4096; rounds++) {
    kiln_computation *e = m->comps[r->comp];
    kiln_instr *x = NULL;
    uint32_t at = 0;
    for (uint32_t i = 0; i < e->ninstrs && x == NULL; i++) {
      kiln_instr *y = m->instrs[e->instrs[i]];
      if (y->op == KILN_OP_CALL && y->ncalled == 1 && y->called[0] < m->ncomps &&
          y->called[0] != r->comp && !r->impure[y->called[0]] && y->ncontrol == 0 &&
          !(r->flags && y->id < r->cap && (r->flags[y->id] & F_PINNED)))
        x = y, at = i;
    }
    if (x == NULL) return 0;
    const kiln_computation *c = m->comps[x->called[0]];
    uint32_t n0 = e->ninstrs, nc = c->ninstrs;
    size_t ni = m->ninstrs + nc + 1;
    kiln_id *map = kiln_malloc(ni * sizeof *map);
    kiln_id *ops = NULL;
    size_t opcap = 0;
    int rc = map ? 0 : KILN_ENOMEM;
    for (uint32_t i = 0; rc == 0 && i < nc; i++) {
      const kiln_instr *y = m->instrs[c->instrs[i]];
      if (y->op == KILN_OP_PARAMETER) {
        if (y->param_number < 0 || (uint32_t)y->param_number >= x->noperands)
          rc = KILN_EINVAL;
        else
          map[y->id] = x->operands[y->param_number];
        continue;
      }
      if (kiln_grow((void **)&ops, &opcap, y->noperands + 1, sizeof *ops)) {
        rc = KILN_ENOMEM;
        break;
      }
      for (uint32_t k = 0; k < y->noperands; k++) ops[k] = map[y->operands[k]];
      char name[256];
      snprintf(name, sizeof name, "%.120s.%.100s.inl%u", x->name, y->name, m->ninstrs);
      kiln_instr *cl = kiln_instr_clone(m, r->comp, y, ops, y->noperands, NULL, name);
      if (cl == NULL)
        rc = KILN_ENOMEM;
      else
        map[y->id] = cl->id;
    }
    kiln_id root = rc == 0 && c->root < m->ninstrs ? map[c->root] : KILN_NO_ID;
    kiln_free(map);
    kiln_free(ops);
    if (rc == 0 && root == KILN_NO_ID) rc = KILN_EINVAL;
    if (rc) return rc;
    e = m->comps[r->comp];
    kiln_replace_all_uses(m, r->comp, x->id, root);
    /* The clones (appended) take the call's place. */
    uint32_t added = e->ninstrs - n0;
    kiln_id *order = kiln_malloc((e->ninstrs + 1) * sizeof *order);
    if (order == NULL) return KILN_ENOMEM;
    uint32_t k = 0;
    for (uint32_t i = 0; i < at; i++) order[k++] = e->instrs[i];
    for (uint32_t i = 0; i < added; i++) order[k++] = e->instrs[n0 + i];
    for (uint32_t i = at + 1; i < n0; i++) order[k++] = e->instrs[i];
    memcpy(e->instrs, order, k * sizeof *order);
    e->ninstrs = k;
    kiln_free(order);
    x->comp = KILN_NO_ID;
  }
  return 0;
}

/* get-tuple-element of a tuple reads the element itself (an inlined call's
 * result is its root tuple), so that the element's readers are its own. */
static void forward_tuples(rm *r) {
  kiln_module *m = r->m;
  kiln_computation *e = m->comps[r->comp];
  for (uint32_t i = 0; i < e->ninstrs; i++) {
    const kiln_instr *g = m->instrs[e->instrs[i]];
    if (g->op != KILN_OP_GET_TUPLE_ELEMENT || g->noperands != 1) continue;
    const kiln_instr *t = m->instrs[g->operands[0]];
    int64_t k = kiln_instr_attr_int(g, KILN_ATTR_INDEX, -1);
    if (t->op != KILN_OP_TUPLE || k < 0 || k >= t->noperands) continue;
    kiln_replace_all_uses(m, r->comp, g->id, t->operands[k]);
  }
}

static void explain_choice(const rm *r, const choice *ch) {
  struct kiln_sbuf *ex = r->quiet ? NULL : kiln__pass_explain();
  if (ex == NULL) return;
  const kiln_computation *c = r->m->comps[r->comp];
  kiln_sbuf_printf(ex,
                   "remat: peak %llu bytes at %%%s: %s %%%s before %%%s (%llu bytes off the peak, "
                   "%.0f flops)\n",
                   (unsigned long long)r->peak, r->m->instrs[c->instrs[r->pidx]]->name,
                   ch->clone ? "recompute" : "move", r->m->instrs[ch->v]->name,
                   r->m->instrs[c->instrs[ch->j]]->name, (unsigned long long)ch->save, ch->flops);
}

static int run(rm *r, uint64_t budget, kiln_remat_stats *stats) {
  int rc = measure(r);
  if (rc) return rc;
  stats->peak_before = stats->peak_after = r->peak;
  if (r->peak <= budget) return 0;
  if ((rc = inline_calls(r))) return rc;
  forward_tuples(r);
  /* The tuples and elements nothing reads now would keep values live. */
  if ((rc = kiln_pass_dce(r->m, r->ctx)) || (rc = measure(r))) return rc;
  uint64_t best = r->peak;
  uint32_t stall = 0;
  mark_flags(r);
  for (uint32_t step = 0; r->peak > budget && step < MAX_STEPS && stall < STALL_STEPS; step++) {
    const kiln_computation *c = r->m->comps[r->comp];
    choice pick = {0}, ch;
    bool found = false;
    for (uint32_t i = 0; i < r->pidx; i++) {
      if (!weigh(r, c->instrs[i], &ch)) continue;
      plan_undo(r, (plan_mark){0, 0, 0});
      if (!found || better(&ch, &pick)) pick = ch, found = true;
    }
    if (!found) break;
    explain_choice(r, &pick);
    if (!weigh(r, pick.v, &ch)) return KILN_EINTERNAL;
    if ((rc = apply(r, &ch)) || (rc = measure(r))) return rc;
    if (r->peak < best) {
      best = r->peak;
      stall = 0;
    } else {
      stall++;
    }
  }
  stats->peak_after = r->peak > budget ? best : r->peak;
  struct kiln_sbuf *ex = r->quiet ? NULL : kiln__pass_explain();
  if (ex)
    kiln_sbuf_printf(ex,
                     "remat: budget %llu bytes: peak %llu -> %llu bytes of temporaries, %u values "
                     "recomputed (%.0f more flops), %u moved\n",
                     (unsigned long long)budget, (unsigned long long)stats->peak_before,
                     (unsigned long long)r->peak, stats->recomputed, stats->extra_flops,
                     stats->moved);
  if (r->peak > budget)
    return kiln_status_set(r->ctx->st, KILN_ELIMIT, "memory_budget",
                           "a peak of %llu bytes of temporaries cannot be brought under the budget "
                           "of %llu bytes: rematerialization reaches %llu bytes at the least",
                           (unsigned long long)stats->peak_before, (unsigned long long)budget,
                           (unsigned long long)best);
  return 0;
}

/* One run of the steps with weighing `variant` on m; *stats filled. */
static int run_variant(kiln_module *m, const kiln_pass_ctx *ctx, int variant, bool quiet,
                       kiln_remat_stats *stats, kiln_status *st) {
  kiln_pass_ctx c = *ctx;
  c.st = st;
  memset(stats, 0, sizeof *stats);
  stats->budget = ctx->memory_budget;
  rm r = {.m = m,
          .ctx = &c,
          .stats = stats,
          .comp = m->entry,
          .budget = ctx->memory_budget,
          .variant = variant,
          .quiet = quiet};
  int rc = run(&r, ctx->memory_budget, stats);
  const kiln_computation *e = kiln_module_entry(m);
  for (uint32_t i = 0; rc == 0 && i < e->ninstrs; i++) {
    kiln_cost k;
    kiln_cost_instr(m, m->instrs[e->instrs[i]], ctx->target, &k);
    stats->flops += k.flops;
  }
  free_step(&r);
  kiln_free(r.impure);
  kiln_free(r.orig);
  kiln_free(r.flags);
  if (rc && kiln_status_is_ok(st)) kiln_status_set(st, rc, "remat", "out of memory");
  return rc;
}

/* The steps are greedy, and which weighing recomputes least differs from
 * program to program: five are tried on copies of the module (bytes per
 * flop over the over-budget positions a value spans; bytes at the peak
 * per flop; the first, counting what keeping operands longer costs where
 * that raises the peak; the first without chains of recomputed operands;
 * bytes per flop over all the positions a value spans), and the one that meets the budget with the
 * fewest extra flops (else reaches the lowest peak) runs on m. */
#define NVARIANTS 5

int kiln_pass_remat(kiln_module *m, const kiln_pass_ctx *ctx) {
  kiln_remat_stats local = {0}, *stats = ctx->remat ? ctx->remat : &local;
  memset(stats, 0, sizeof *stats);
  stats->budget = ctx->memory_budget;
  if (ctx->memory_budget == 0 || kiln_module_entry(m) == NULL) return 0;
  int best = 0;
  bool best_met = false;
  kiln_remat_stats bs = {0};
  for (int v = 0; v < NVARIANTS; v++) {
    kiln_module *c = NULL;
    if (kiln_module_clone(m, &c))
      return kiln_status_set(ctx->st, KILN_ENOMEM, "remat", "out of memory");
    kiln_status st;
    kiln_status_clear(&st);
    kiln_remat_stats s;
    int rc = run_variant(c, ctx, v, true, &s, &st);
    kiln_module_destroy(c);
    if (rc && rc != KILN_ELIMIT) return kiln_status_set(ctx->st, rc, st.where, "%s", st.msg);
    if (rc == 0 && s.recomputed + s.moved == 0) break; /* under the budget as it is */
    bool better_v = v == 0 || (rc == 0 ? !best_met || s.extra_flops < bs.extra_flops
                                       : !best_met && s.peak_after < bs.peak_after);
    if (better_v) {
      best = v;
      best_met = rc == 0;
      bs = s;
    }
  }
  return run_variant(m, ctx, best, false, stats, ctx->st);
}
