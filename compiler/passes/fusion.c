/* Fusion: groups instructions of each program computation (the entry, while
 * conditions and bodies, conditional branches, called computations) into
 * `fusion` instructions that the code generator runs as one kernel each.
 *
 * The idea, per computation, visiting instructions from the root back to
 * the parameters (every user is visited before its operands):
 *  - An instruction still needed on its own becomes the root of a group:
 *    kLoop for a loop op (elementwise, broadcast, reshape, transpose, slice,
 *    iota) or a reduce-window (a pooling window computes its producers as
 *    it reads them: a convolution's bias and relu are never stored), kInput
 *    for an array-shaped reduce.
 *  - The group grows greedily through its operands, highest position first:
 *    a loop-fusible producer joins when the roofline model (cost.h) says
 *    the fused kernel is faster. A producer whose every use is inside the
 *    group disappears, so it joins when T(group + p) < T(group) + T(p); one
 *    that other instructions still need is duplicated, so it joins only
 *    when T(group + p) < T(group) (a broadcast of a small operand does, an
 *    expensive elementwise producer does not, since the model charges its
 *    recomputation).
 *  - A dot whose only users are the group's elementwise epilogue (same
 *    dimensions as the dot, e.g. bias add then relu) joins a single-root
 *    kLoop group, which becomes kOutput: the backend runs the GEMM and then
 *    the epilogue. Nothing is fused into a dot's operands.
 *  - A reduce joins a kLoop group as a row reduce when the group's kernel
 *    can compute it once per row of the output (compiler/passes/row_reduce.h:
 *    it reduces exactly the output's minor dim of an input with the
 *    output's dims, and is read only through broadcasts along that dim,
 *    reshapes of size-1 dims and elementwise ops on its own dims), every use
 *    of it is in the group (a reduce is never computed twice), and the model
 *    says so (cost.c charges such a broadcast once per row). Chains of them
 *    (softmax: max, exp, sum, divide; layernorm: mean, variance, normalize)
 *    become one kernel that reads each row from memory once. From then on
 *    nothing joins that group, or merges with it, unless every reduce in it
 *    still has that form; no dot joins it.
 *  - When visiting a value that several groups read (siblings), groups with
 *    the same iteration space (kLoop: same root dimensions; kInput: same
 *    reduce input dimensions and reduced dimensions) merge into one
 *    multi-output fusion (tuple root, users through get-tuple-element) when
 *    the model says one kernel reading the shared operands once is faster
 *    and the merged kernel would not feed itself (checked in the graph
 *    whose nodes are the groups). The shared value may then be absorbed
 *    into the merged group like any producer.
 *  - A dynamic-update-slice whose operand is laid out as its result roots
 *    a kLoop group that the code generator writes in place (only the
 *    update's elements): into it join the loop ops computing the update
 *    (a transposing reshape, an activation), as the model decides, but not
 *    its operand, its start indices, anything reading the operand (which
 *    the kernel overwrites while it runs) or a bitcast of a value stored
 *    anyway (that update is copied as it is). It merges with no sibling.
 * Never fused: parameters, while/conditional/call, custom calls,
 * collectives, anything with side effects (rng included), instructions with
 * control dependencies, tuples, dynamic shapes, non-scalar constants.
 *
 * Groups are sets of instruction ids of the original computation; only at
 * the end is each group of two or more instructions written out: a new
 * computation fused_computation.N (parameters in operand order, members
 * cloned in computation order, root = the group root or a tuple of roots),
 * a fusion instruction in place of the root, and the instructions no longer
 * needed by anything dropped. Decisions never reassociate arithmetic, so
 * the interpreter's results stay bit-identical.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/deadline.h"
#include "common/sbuf.h"
#include "compiler/buffer_assign.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/cost.h"
#include "compiler/passes/passes.h"
#include "compiler/passes/row_reduce.h"

#define NO_GROUP UINT32_MAX
#define NO_POS UINT32_MAX
#define MAX_MEMBERS \
  512                  /* instructions in one fused kernel (an unrolled threefry + erf_inv: ~400) */
#define MAX_SIBLINGS 8 /* consumer groups of one value tried for merging */
#define ROWS_MAXR 64   /* rank of a row kernel's outputs compared for layout */

typedef enum fkind { K_LOOP, K_INPUT, K_OUTPUT } fkind;
static const char *const kind_names[] = {"kLoop", "kInput", "kOutput"};

typedef struct group {
  fkind kind;
  kiln_id *mem; /* members (original ids), first the root(s) */
  uint32_t nmem, capm;
  kiln_id *roots; /* values the kernel writes, by position */
  uint32_t nroots, capr;
  kiln_cost cost;       /* of the group as one kernel */
  uint32_t merged_into; /* NO_GROUP while alive */
  kiln_id dot;          /* kOutput: the dot member */
  uint32_t nred;        /* kLoop: row reduces among the members */
  bool dus;             /* root: an in-place dynamic-update-slice (dus_ok) */
} group;

/* Analysis state for one computation. */
typedef struct fctx {
  kiln_module *m;
  const kiln_target *t;
  /* Scratch of the computation being fused, reset before the next one:
   * its per-instruction arrays are as long as the module, so keeping them
   * for every program computation made the pass's memory grow with the
   * square of the module (a chain of N nested calls). */
  kiln_arena *a;
  kiln_status *st;
  uint32_t comp;
  const kiln_users *users;
  uint32_t nids;     /* instructions when the analysis began: arrays' size */
  kiln_id *clone;    /* per instruction: its copy in the fused computation */
  uint32_t *pos;     /* per instruction: position in comp, or NO_POS */
  uint8_t *state;    /* 0 unvisited, 1 kept on its own, 2 absorbed */
  bool *ctrl_succ;   /* is a control predecessor of something */
  uint32_t *root_of; /* group whose root it is (before merges), or NO_GROUP */
  group *g;
  uint32_t ng, capg;
  uint32_t *mhead; /* per instruction: its first membership, or NO_GROUP */
  struct memb {
    uint32_t group, next; /* a group holding the instruction; the next membership */
  } * mb;
  uint32_t nmb, capmb;
  uint32_t *stamp, stampv; /* visited marks for searches */
  kiln_id *stack;
  kiln_sbuf *explain; /* kiln__pass_explain(): decisions are written there */
} fctx;

/* ---- small helpers -------------------------------------------------------- */

static int oom(fctx *f) { return kiln_status_set(f->st, KILN_ENOMEM, "fusion", "out of memory"); }

/* One line of `kiln explain` (nothing unless asked). */
static void explain(fctx *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void explain(fctx *f, const char *fmt, ...) {
  if (f->explain == NULL) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  kiln_sbuf_puts(f->explain, line);
  kiln_sbuf_putc(f->explain, '\n');
}

/* "1.23us (flops 1e3, bytes 4e3)" */
static const char *cost_text(char *buf, size_t n, const kiln_cost *c) {
  snprintf(buf, n, "%.3gus (%.3g flops, %.3g bytes, %d kernel%s)", c->seconds * 1e6, c->flops,
           c->bytes, c->kernels, c->kernels == 1 ? "" : "s");
  return buf;
}

/* Grows an arena array to hold `need` elements. */
static int grow(kiln_arena *a, void **p, uint32_t *cap, uint32_t need, size_t elem) {
  if (need <= *cap) return 0;
  uint32_t nc = *cap ? *cap * 2 : 8;
  while (nc < need) nc *= 2;
  void *q = kiln_arena_alloc(a, (size_t)nc * elem);
  if (q == NULL) return KILN_ENOMEM;
  if (*cap) memcpy(q, *p, (size_t)*cap * elem);
  *p = q;
  *cap = nc;
  return 0;
}

static uint32_t find(const fctx *f, uint32_t g) {
  while (f->g[g].merged_into != NO_GROUP) g = f->g[g].merged_into;
  return g;
}

static bool in_group(const fctx *f, kiln_id x, uint32_t g) {
  for (uint32_t e = f->mhead[x]; e != NO_GROUP; e = f->mb[e].next)
    if (find(f, f->mb[e].group) == g) return true;
  return false;
}

static bool is_static_array(const kiln_shape *s) {
  return kiln_shape_is_array(s) && !kiln_shape_is_dynamic(s);
}

static bool in_comp(const fctx *f, kiln_id id) { return id < f->nids && f->pos[id] != NO_POS; }

/* Instructions that must stay where they are: the root, values nobody uses
 * (dead code is not this pass's business), side effects and anything
 * ordered by control edges. */
static bool must_stay(const fctx *f, const kiln_instr *x) {
  uint32_t nu;
  kiln_users_of(f->users, x->id, &nu);
  return x->id == f->m->comps[f->comp]->root || nu == 0 || x->ncontrol || f->ctrl_succ[x->id] ||
         (kiln_opcode_flags(x->op) & KILN_OPF_SIDE_EFFECT);
}

static bool basic_ok(const fctx *f, const kiln_instr *x) {
  return is_static_array(&x->shape) && x->ncontrol == 0 && !f->ctrl_succ[x->id];
}

/* Ops a loop kernel computes per output element. */
static bool loop_op(const kiln_instr *x) {
  switch (x->op) {
  case KILN_OP_BROADCAST:
  case KILN_OP_RESHAPE:
  case KILN_OP_TRANSPOSE:
  case KILN_OP_SLICE:
  case KILN_OP_IOTA: return true;
  case KILN_OP_CONSTANT: return kiln_shape_elements(&x->shape) == 1;
  default: return (kiln_opcode_flags(x->op) & KILN_OPF_ELEMENTWISE) != 0;
  }
}

static bool blas_type(const fctx *f, kiln_dtype t) {
  if (t == KILN_F32 || t == KILN_F64) return true;
  bool cuda = f->t->backend && strcmp(f->t->backend, "cuda") == 0;
  return cuda && (t == KILN_F16 || t == KILN_BF16);
}

/* ---- memberships and groups --------------------------------------------- */

static int add_member(fctx *f, uint32_t g, kiln_id x) {
  group *G = &f->g[g];
  if (grow(f->a, (void **)&G->mem, &G->capm, G->nmem + 1, sizeof *G->mem) ||
      grow(f->a, (void **)&f->mb, &f->capmb, f->nmb + 1, sizeof *f->mb))
    return oom(f);
  G->mem[G->nmem++] = x;
  f->mb[f->nmb] = (struct memb){g, f->mhead[x]};
  f->mhead[x] = f->nmb++;
  return 0;
}

static int new_group(fctx *f, kiln_id root, fkind kind, uint32_t *out) {
  if (grow(f->a, (void **)&f->g, &f->capg, f->ng + 1, sizeof *f->g)) return oom(f);
  uint32_t g = f->ng++;
  group *G = &f->g[g];
  memset(G, 0, sizeof *G);
  G->kind = kind;
  G->merged_into = NO_GROUP;
  G->dot = KILN_NO_ID;
  G->dus = f->m->instrs[root]->op == KILN_OP_DYNAMIC_UPDATE_SLICE;
  if (grow(f->a, (void **)&G->roots, &G->capr, 1, sizeof *G->roots)) return oom(f);
  G->roots[G->nroots++] = root;
  int rc = add_member(f, g, root);
  if (rc) return rc;
  kiln_cost_instr(f->m, f->m->instrs[root], f->t, &f->g[g].cost);
  f->root_of[root] = g;
  *out = g;
  char cb[128];
  explain(f, "  group %u (%s) rooted at %s: %s", g, kind_names[kind], f->m->instrs[root]->name,
          cost_text(cb, sizeof cb, &f->g[g].cost));
  return 0;
}

/* Cost of group g's members plus `extra` (KILN_ID none) as one kernel
 * writing `roots`. */
static int cost_of(fctx *f, const kiln_id *mem, uint32_t n, kiln_id extra, const kiln_id *roots,
                   uint32_t nroots, kiln_cost *out) {
  kiln_id *tmp = kiln_malloc(((size_t)n + 1) * sizeof *tmp);
  if (tmp == NULL) return oom(f);
  memcpy(tmp, mem, (size_t)n * sizeof *tmp);
  if (extra != KILN_NO_ID) tmp[n++] = extra;
  int rc = kiln_cost_group(f->m, tmp, n, roots, nroots, f->t, out);
  kiln_free(tmp);
  return rc ? oom(f) : 0;
}

/* a beats b: clearly faster, or as fast while moving fewer bytes (a scalar
 * constant folded into a compute-bound kernel). */
static bool better(const kiln_cost *a, const kiln_cost *b) {
  double tol = 1e-9 * (b->seconds > 0 ? b->seconds : 1e-30);
  if (a->seconds < b->seconds - tol) return true;
  return a->seconds <= b->seconds + tol && a->bytes < b->bytes;
}

static void sum_cost(kiln_cost *a, const kiln_cost *b) {
  a->flops += b->flops;
  a->bytes += b->bytes;
  a->seconds += b->seconds;
  a->kernels += b->kernels;
}

/* Whether x would still be needed on its own if it joined group gt
 * (NO_GROUP: joined nothing). A user not visited yet and in no group may
 * still need x: assume it does. */
static bool would_be_needed(const fctx *f, kiln_id x, uint32_t gt) {
  if (must_stay(f, f->m->instrs[x])) return true;
  uint32_t nu;
  const kiln_id *us = kiln_users_of(f->users, x, &nu);
  for (uint32_t i = 0; i < nu; i++) {
    kiln_id u = us[i];
    bool any = false;
    for (uint32_t e = f->mhead[u]; e != NO_GROUP; e = f->mb[e].next) {
      uint32_t g = find(f, f->mb[e].group);
      any = true;
      if (g != gt && !in_group(f, x, g)) return true;
    }
    if (f->state[u] == 1 && f->root_of[u] == NO_GROUP) return true; /* kept, unfused */
    if (!any && f->state[u] != 2) return true;
  }
  return false;
}

/* ---- decisions ------------------------------------------------------------ */

/* Sorts ids by position (insertion sort: groups are small). */
static void sort_by_pos(const fctx *f, kiln_id *v, uint32_t n) {
  for (uint32_t i = 1; i < n; i++) {
    kiln_id x = v[i];
    uint32_t j = i;
    while (j > 0 && f->pos[v[j - 1]] > f->pos[x]) {
      v[j] = v[j - 1];
      j--;
    }
    v[j] = x;
  }
}

static bool uses(const kiln_instr *u, kiln_id x) {
  for (uint32_t k = 0; k < u->noperands; k++)
    if (u->operands[k] == x) return true;
  return false;
}

/* A dot may join group g as its GEMM when everything in g computed from
 * the dot is an elementwise op over the dot's dimensions (the epilogue),
 * nothing in g feeds the dot, and the backend multiplies that type. */
static int output_ok(fctx *f, uint32_t g, const kiln_instr *d, bool *ok) {
  group *G = &f->g[g];
  *ok = false;
  if (G->kind != K_LOOP || G->nroots != 1 || d->noperands != 2 || !blas_type(f, d->shape.dtype))
    return 0;
  for (uint32_t k = 0; k < d->noperands; k++)
    if (in_group(f, d->operands[k], g)) return 0;
  kiln_id *v = kiln_malloc(((size_t)G->nmem + 1) * sizeof *v);
  bool *dep = kiln_calloc((size_t)G->nmem + 1, sizeof *dep);
  if (v == NULL || dep == NULL) {
    kiln_free(v);
    kiln_free(dep);
    return oom(f);
  }
  memcpy(v, G->mem, (size_t)G->nmem * sizeof *v);
  sort_by_pos(f, v, G->nmem);
  bool good = true;
  for (uint32_t i = 0; i < G->nmem && good; i++) {
    const kiln_instr *u = f->m->instrs[v[i]];
    dep[i] = uses(u, d->id);
    for (uint32_t j = 0; j < i && !dep[i]; j++) dep[i] = dep[j] && uses(u, v[j]);
    if (dep[i])
      good = (kiln_opcode_flags(u->op) & KILN_OPF_ELEMENTWISE) &&
             kiln_shape_same_dims(&u->shape, &d->shape);
  }
  kiln_free(v);
  kiln_free(dep);
  *ok = good;
  return 0;
}

/* Whether the loop kernel of mem[0..n) plus `extra` (KILN_NO_ID: none)
 * writing `roots` computes every reduce among them once per row
 * (row_reduce.h). */
static int rows_ok(fctx *f, const kiln_id *mem, uint32_t n, kiln_id extra, const kiln_id *roots,
                   uint32_t nroots, bool *ok) {
  *ok = false;
  kiln_id *tmp = kiln_malloc(((size_t)n + 1) * sizeof *tmp);
  uint8_t *role = kiln_malloc((size_t)n + 1);
  int rc = 0;
  if (tmp == NULL || role == NULL) {
    rc = oom(f);
    goto out_free;
  }
  memcpy(tmp, mem, (size_t)n * sizeof *tmp);
  if (extra != KILN_NO_ID) tmp[n++] = extra;
  sort_by_pos(f, tmp, n);
  uint32_t stranded = 0;
  if (kiln__row_plan(f->m, tmp, n, roots, nroots, &f->m->instrs[roots[0]]->shape, role, &stranded,
                     NULL)) {
    rc = oom(f);
    goto out_free;
  }
  *ok = stranded == 0;
  /* The code generator takes its rows from the first output's layout. */
  const kiln_shape *s0 = &f->m->instrs[roots[0]]->shape;
  for (uint32_t r = 1; r < nroots && *ok; r++) {
    const kiln_shape *sr = &f->m->instrs[roots[r]]->shape;
    int64_t a[ROWS_MAXR], b[ROWS_MAXR];
    if (!kiln_shape_is_array(s0) || !kiln_shape_is_array(sr) || sr->rank != s0->rank ||
        sr->rank > ROWS_MAXR) {
      *ok = false;
      break;
    }
    kiln_shape_minor_to_major(s0, a);
    kiln_shape_minor_to_major(sr, b);
    *ok = memcmp(a, b, s0->rank * sizeof *a) == 0;
  }
out_free:
  kiln_free(tmp);
  kiln_free(role);
  return rc;
}

/* A row reduce: one input reduced over one dim (row_reduce.h decides the
 * rest, for the kernel it would join). */
static bool reduce_op(const kiln_instr *x) {
  return x->op == KILN_OP_REDUCE && x->noperands == 2 && x->ncalled == 1;
}

/* A dynamic-update-slice that the code generator writes in place when it
 * roots a fusion: its operand laid out as its result. */
static bool dus_ok(const fctx *f, const kiln_instr *x) {
  if (x->op != KILN_OP_DYNAMIC_UPDATE_SLICE || x->noperands < 3) return false;
  const kiln_shape *a = &f->m->instrs[x->operands[0]]->shape;
  return a->dtype == x->shape.dtype && kiln__same_layout(a, &x->shape);
}

/* Whether x is just the bytes of a value that exists anyway: an alias op
 * (a reshape that is a bitcast) of a parameter or of something that is not
 * itself a loop op read only by x (which would join with it). */
static bool bytes_of_stored(const fctx *f, const kiln_instr *x) {
  if (!kiln__is_alias_op(f->m, x)) return false;
  const kiln_instr *o = f->m->instrs[x->operands[0]];
  uint32_t nu;
  kiln_users_of(f->users, o->id, &nu);
  return !in_comp(f, o->id) || o->op == KILN_OP_PARAMETER || !loop_op(o) ||
         kiln__is_alias_op(f->m, o) || nu != 1;
}

/* Into a dynamic-update-slice's group only what computes its update joins,
 * never a value that is just the bytes of one stored anyway (the update is
 * then copied from it as it is, kiln__kernel_window_copy), never the
 * operand or the start indices, and nothing that reads the operand (which
 * the kernel overwrites in place while it runs). */
static bool dus_member_ok(const fctx *f, const group *G, const kiln_instr *x) {
  const kiln_instr *root = f->m->instrs[G->roots[0]];
  if (!loop_op(x) || bytes_of_stored(f, x)) return false;
  for (uint32_t k = 0; k < root->noperands; k++)
    if (k != 1 && root->operands[k] == x->id) return false;
  return !uses(x, root->operands[0]);
}

/* Whether producer p may structurally join group g (the model not asked). */
static int eligible(fctx *f, uint32_t g, kiln_id p, bool *ok) {
  *ok = false;
  if (!in_comp(f, p) || f->state[p] != 0 || in_group(f, p, g)) return 0;
  const kiln_instr *x = f->m->instrs[p];
  const group *G = &f->g[g];
  if (x->op == KILN_OP_PARAMETER || !basic_ok(f, x) || G->nmem >= MAX_MEMBERS) return 0;
  if (G->dus) {
    *ok = dus_member_ok(f, G, x);
    return 0;
  }
  if (x->op == KILN_OP_DOT) return G->nred ? 0 : output_ok(f, g, x, ok);
  /* A reduce joins a loop kernel that reads it only along its rows, and
   * nothing joins that kernel that would make it read a reduce otherwise. */
  bool red = G->kind == K_LOOP && reduce_op(x);
  *ok = (loop_op(x) || red) && !(G->kind == K_OUTPUT && uses(f->m->instrs[G->dot], p));
  if (*ok && (red || G->nred)) return rows_ok(f, G->mem, G->nmem, p, G->roots, G->nroots, ok);
  return 0;
}

static int join(fctx *f, uint32_t g, kiln_id p, const kiln_cost *after) {
  int rc = add_member(f, g, p);
  if (rc) return rc;
  f->g[g].cost = *after;
  if (f->m->instrs[p]->op == KILN_OP_DOT) {
    f->g[g].kind = K_OUTPUT;
    f->g[g].dot = p;
  }
  if (f->g[g].kind == K_LOOP && f->m->instrs[p]->op == KILN_OP_REDUCE) f->g[g].nred++;
  return 0;
}

/* Tries to add producer p to group g; *added says whether it joined. */
static int try_add(fctx *f, uint32_t g, kiln_id p, bool *added) {
  *added = false;
  bool ok;
  int rc = eligible(f, g, p, &ok);
  if (rc || !ok) return rc;
  const kiln_instr *x = f->m->instrs[p];
  bool stays = would_be_needed(f, p, g);
  /* A GEMM is never computed twice, nor a reduce. */
  if ((x->op == KILN_OP_DOT || x->op == KILN_OP_REDUCE) && stays) {
    explain(f,
            "    - %s stays out of group %u: still needed elsewhere, and a %s is never "
            "computed twice",
            x->name, g, kiln_opcode_name(x->op));
    return 0;
  }
  kiln_cost after, before = f->g[g].cost;
  if ((rc = cost_of(f, f->g[g].mem, f->g[g].nmem, p, f->g[g].roots, f->g[g].nroots, &after)))
    return rc;
  if (!stays) {
    kiln_cost own;
    kiln_cost_instr(f->m, x, f->t, &own);
    sum_cost(&before, &own);
  }
  bool win = better(&after, &before);
  if (f->explain) {
    char ca[128], cb[128];
    explain(f, "    %c %s %s group %u: fused %s %s %s as %s", win ? '+' : '-', x->name,
            win ? "joins" : "stays out of", g, cost_text(ca, sizeof ca, &after),
            win ? "beats" : "does not beat", cost_text(cb, sizeof cb, &before),
            stays ? "the group alone (it is still needed elsewhere, so it would be computed twice)"
                  : "the group and it apart");
  }
  if (!win) return 0;
  if ((rc = join(f, g, p, &after))) return rc;
  *added = true;
  return 0;
}

/* Grows group g through the operands of `seed`, highest position first, so
 * that a producer is weighed after the users that may join before it. */
static int grow_group(fctx *f, uint32_t g, kiln_id seed) {
  kiln_id *c = NULL;
  uint32_t nc = 0, capc = 0;
  int rc = 0;
  kiln_id next = seed;
  for (;;) {
    const kiln_instr *x = f->m->instrs[next];
    if (x->op != KILN_OP_DOT) {
      for (uint32_t k = 0; k < x->noperands; k++) {
        kiln_id o = x->operands[k];
        if (!in_comp(f, o) || in_group(f, o, g)) continue;
        if (grow(f->a, (void **)&c, &capc, nc + 1, sizeof *c)) return oom(f);
        c[nc++] = o;
      }
    }
    bool added = false;
    while (nc && !added) {
      uint32_t best = 0;
      for (uint32_t i = 1; i < nc; i++)
        if (f->pos[c[i]] > f->pos[c[best]]) best = i;
      next = c[best];
      c[best] = c[--nc];
      if ((rc = try_add(f, g, next, &added))) return rc;
    }
    if (!added) return 0;
  }
}

static kiln_id first_root(const fctx *f, uint32_t g) { return f->g[g].roots[0]; }

/* Whether groups a and b can share one loop nest. */
static bool same_space(const fctx *f, uint32_t a, uint32_t b) {
  const group *A = &f->g[a], *B = &f->g[b];
  if (A->kind != B->kind || A->kind == K_OUTPUT || A->dus || B->dus ||
      A->nmem + B->nmem > MAX_MEMBERS)
    return false;
  const kiln_instr *ra = f->m->instrs[first_root(f, a)], *rb = f->m->instrs[first_root(f, b)];
  if (A->kind == K_LOOP) return kiln_shape_same_dims(&ra->shape, &rb->shape);
  const kiln_i64s *da = kiln_instr_attr_ints(ra, KILN_ATTR_DIMENSIONS);
  const kiln_i64s *db = kiln_instr_attr_ints(rb, KILN_ATTR_DIMENSIONS);
  if (da == NULL || db == NULL || da->n != db->n ||
      (da->n && memcmp(da->v, db->v, da->n * sizeof *da->v)))
    return false;
  return kiln_shape_same_dims(&f->m->instrs[ra->operands[0]]->shape,
                              &f->m->instrs[rb->operands[0]]->shape);
}

#define REACH_BUDGET 4096 /* nodes one merge check may visit before refusing */

/* Whether group a's outputs may reach group b's inputs in the graph where
 * every group is one node (what the program would be with both written
 * out): merging them would then make a kernel that feeds itself. Entering a
 * group (at any member) reaches all of its outputs, and a multi-output
 * group's roots can sit before some of its members, so positions bound
 * nothing here: the walk is a plain search, cut off (answering yes) after
 * REACH_BUDGET nodes. A duplicated instruction's original is taken as
 * present, which can only refuse a merge, never allow a bad one.
 *
 * Merges are the only step that needs this. Every other step adds
 * producers below the instruction being visited, and nothing can reach
 * those from a group: every group root is an instruction already visited,
 * an edge leads to a later instruction, and leaving a group lands on a
 * root. */
static bool reaches(fctx *f, uint32_t a, uint32_t b) {
  const group *A = &f->g[a];
  uint32_t mark = ++f->stampv, top = 0, seen = 0;
  for (uint32_t i = 0; i < A->nroots; i++) {
    f->stamp[A->roots[i]] = mark;
    f->stack[top++] = A->roots[i];
  }
  while (top) {
    kiln_id v = f->stack[--top];
    if (++seen > REACH_BUDGET) return true;
    uint32_t nu;
    const kiln_id *us = kiln_users_of(f->users, v, &nu);
    for (uint32_t i = 0; i < nu; i++) {
      kiln_id w = us[i];
      if (!in_comp(f, w)) continue;
      if (in_group(f, w, b)) return true;
      if (f->stamp[w] != mark) {
        f->stamp[w] = mark;
        f->stack[top++] = w;
      }
      for (uint32_t e = f->mhead[w]; e != NO_GROUP; e = f->mb[e].next) {
        const group *G = &f->g[find(f, f->mb[e].group)];
        for (uint32_t r = 0; r < G->nroots; r++) {
          kiln_id x = G->roots[r];
          if (f->stamp[x] == mark) continue;
          f->stamp[x] = mark;
          f->stack[top++] = x;
        }
      }
    }
  }
  return false;
}

/* Merges sibling b into a when one multi-output kernel is faster. */
static int try_merge(fctx *f, uint32_t a, uint32_t b) {
  if (!same_space(f, a, b) || reaches(f, a, b) || reaches(f, b, a)) return 0;
  group *A = &f->g[a], *B = &f->g[b];
  uint32_t n = A->nmem, nr = A->nroots + B->nroots;
  kiln_id *mem = kiln_malloc(((size_t)A->nmem + B->nmem) * sizeof *mem);
  kiln_id *roots = kiln_arena_alloc(f->a, (size_t)nr * sizeof *roots);
  if (mem == NULL || roots == NULL) {
    kiln_free(mem);
    return oom(f);
  }
  memcpy(mem, A->mem, (size_t)A->nmem * sizeof *mem);
  for (uint32_t i = 0; i < B->nmem; i++)
    if (!in_group(f, B->mem[i], a)) mem[n++] = B->mem[i];
  memcpy(roots, A->roots, (size_t)A->nroots * sizeof *roots);
  memcpy(roots + A->nroots, B->roots, (size_t)B->nroots * sizeof *roots);
  sort_by_pos(f, roots, nr);
  kiln_cost merged, apart = A->cost;
  bool rows = true;
  int rc = A->nred || B->nred ? rows_ok(f, mem, n, KILN_NO_ID, roots, nr, &rows) : 0;
  if (rc || !rows) {
    kiln_free(mem);
    return rc;
  }
  rc = cost_of(f, mem, n, KILN_NO_ID, roots, nr, &merged);
  sum_cost(&apart, &B->cost);
  if (rc == 0 && f->explain) {
    char ca[128], cb[128];
    bool win = better(&merged, &apart);
    explain(f, "  %s sibling groups %u and %u: one kernel %s %s two %s",
            win ? "merge" : "keep apart", a, b, cost_text(ca, sizeof ca, &merged),
            win ? "beats" : "does not beat", cost_text(cb, sizeof cb, &apart));
  }
  if (rc == 0 && better(&merged, &apart)) {
    uint32_t cap = n;
    kiln_id *keep = kiln_arena_alloc(f->a, (size_t)cap * sizeof *keep);
    if (keep == NULL) {
      rc = oom(f);
    } else {
      memcpy(keep, mem, (size_t)n * sizeof *keep);
      A->mem = keep;
      A->nmem = A->capm = n;
      A->roots = roots;
      A->nroots = A->capr = nr;
      A->cost = merged;
      A->nred += B->nred;
      B->merged_into = a;
    }
  }
  kiln_free(mem);
  return rc;
}

/* Groups that read x from outside (x is not one of their members), at
 * most MAX_SIBLINGS; *all says whether that is every one of them. */
static uint32_t consumer_groups(const fctx *f, kiln_id x, uint32_t *out, bool *all) {
  uint32_t n = 0, nu;
  const kiln_id *us = kiln_users_of(f->users, x, &nu);
  *all = true;
  for (uint32_t i = 0; i < nu; i++) {
    for (uint32_t e = f->mhead[us[i]]; e != NO_GROUP; e = f->mb[e].next) {
      uint32_t g = find(f, f->mb[e].group), j;
      if (in_group(f, x, g)) continue;
      for (j = 0; j < n && out[j] != g; j++) {
      }
      if (j < n) continue;
      if (n == MAX_SIBLINGS) {
        *all = false;
        return n;
      }
      out[n++] = g;
    }
  }
  return n;
}

static int merge_siblings(fctx *f, kiln_id x) {
  uint32_t cg[MAX_SIBLINGS];
  bool all;
  uint32_t n = consumer_groups(f, x, cg, &all);
  for (uint32_t i = 0; i < n; i++) {
    for (uint32_t j = i + 1; j < n; j++) {
      uint32_t a = find(f, cg[i]), b = find(f, cg[j]);
      if (a == b) continue;
      int rc = try_merge(f, a, b);
      if (rc) return rc;
    }
  }
  return 0;
}

static bool root_kind(const fctx *f, const kiln_instr *x, fkind *k) {
  if (!basic_ok(f, x)) return false;
  if (x->op == KILN_OP_REDUCE && x->noperands == 2) {
    *k = K_INPUT;
    return true;
  }
  *k = K_LOOP;
  if (dus_ok(f, x)) return true;
  /* A pooling window reads its producers in place (a convolution's bias
   * and relu are computed as the window reads them, not stored first); a
   * prefix scan is a kernel of its own (one pass per row, codegen). */
  uint32_t sd;
  return loop_op(x) || (x->op == KILN_OP_REDUCE_WINDOW && x->noperands == 2 &&
                        !kiln_reduce_window_is_scan(f->m, x, &sd));
}

#define MAX_CONE 32

/* The cone of x: x and the loop-fusible producers used only inside the
 * cone, highest position first (what x's own kernel would absorb). */
static uint32_t cone_of(fctx *f, kiln_id x, kiln_id *cone) {
  uint32_t n = 0;
  cone[n++] = x;
  uint32_t mark = ++f->stampv;
  f->stamp[x] = mark;
  for (uint32_t i = 0; i < n && n < MAX_CONE; i++) {
    const kiln_instr *ins = f->m->instrs[cone[i]];
    for (uint32_t k = 0; k < ins->noperands && n < MAX_CONE; k++) {
      kiln_id o = ins->operands[k];
      if (!in_comp(f, o) || f->stamp[o] == mark || f->state[o] != 0) continue;
      const kiln_instr *oi = f->m->instrs[o];
      if (oi->op == KILN_OP_PARAMETER || !basic_ok(f, oi) || !loop_op(oi) || must_stay(f, oi))
        continue;
      uint32_t nu;
      const kiln_id *us = kiln_users_of(f->users, o, &nu);
      bool inside = true;
      for (uint32_t j = 0; j < nu && inside; j++) inside = f->stamp[us[j]] == mark;
      if (!inside) continue;
      f->stamp[o] = mark;
      cone[n++] = o;
    }
  }
  sort_by_pos(f, cone, n);
  for (uint32_t i = 0; i < n / 2; i++) {
    kiln_id t = cone[i];
    cone[i] = cone[n - 1 - i];
    cone[n - 1 - i] = t;
  }
  return n;
}

/* Fuses x, with its cone, into every group that reads it, when recomputing
 * them in each costs less than the one kernel they would otherwise form
 * (so an expensive producer is duplicated only when the model says so);
 * *done says whether it did. Only when every use of x is in those groups. */
static int fuse_into_all(fctx *f, kiln_id x, const uint32_t *cg, uint32_t n, bool *done) {
  *done = false;
  const kiln_instr *ins = f->m->instrs[x];
  if (n < 2 || ins->op == KILN_OP_DOT || must_stay(f, ins)) return 0;
  uint32_t nu;
  const kiln_id *us = kiln_users_of(f->users, x, &nu);
  for (uint32_t i = 0; i < nu; i++)
    if (f->mhead[us[i]] == NO_GROUP || (f->state[us[i]] == 1 && f->root_of[us[i]] == NO_GROUP))
      return 0;
  kiln_id cone[MAX_CONE];
  uint32_t nc = cone_of(f, x, cone);
  kiln_cost after[MAX_SIBLINGS], sum_after = {0}, before;
  int rc = cost_of(f, cone, nc, KILN_NO_ID, &x, 1, &before);
  for (uint32_t i = 0; i < n && rc == 0; i++) {
    const group *G = &f->g[cg[i]];
    bool ok;
    if (G->nred) return 0; /* row kernels take their producers one by one */
    for (uint32_t c = 0; c < nc && rc == 0; c++) {
      if ((rc = eligible(f, cg[i], cone[c], &ok)) || !ok) return rc;
    }
    if (G->nmem + nc > MAX_MEMBERS) return 0;
    kiln_id *tmp = kiln_malloc(((size_t)G->nmem + nc) * sizeof *tmp);
    if (tmp == NULL) return oom(f);
    memcpy(tmp, G->mem, (size_t)G->nmem * sizeof *tmp);
    memcpy(tmp + G->nmem, cone, (size_t)nc * sizeof *tmp);
    rc = cost_of(f, tmp, G->nmem + nc, KILN_NO_ID, G->roots, G->nroots, &after[i]);
    kiln_free(tmp);
    sum_cost(&sum_after, &after[i]);
    sum_cost(&before, &G->cost);
  }
  if (rc || !better(&sum_after, &before)) return rc;
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t c = 0; c < nc; c++)
      if ((rc = join(f, cg[i], cone[c], &after[i]))) return rc;
  f->state[x] = 2;
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t c = 0; c < nc; c++)
      if ((rc = grow_group(f, cg[i], cone[c]))) return rc;
  *done = true;
  return 0;
}

/* One visit, from the root towards the parameters. */
static int visit(fctx *f, kiln_id x) {
  int rc;
  uint32_t nu;
  kiln_users_of(f->users, x, &nu);
  if (nu > 1 && (rc = merge_siblings(f, x))) return rc;
  if (!would_be_needed(f, x, NO_GROUP)) {
    f->state[x] = 2;
    return 0;
  }
  uint32_t cg[MAX_SIBLINGS];
  bool all, done;
  uint32_t ncg = consumer_groups(f, x, cg, &all);
  /* Every use inside one group (after merging): absorb x there. */
  if (ncg == 1 && !would_be_needed(f, x, cg[0])) {
    if ((rc = try_add(f, cg[0], x, &done))) return rc;
    if (done) {
      f->state[x] = 2;
      return grow_group(f, cg[0], x);
    }
  }
  if (all && (rc = fuse_into_all(f, x, cg, ncg, &done))) return rc;
  if (all && done) return 0;
  f->state[x] = 1;
  fkind k;
  uint32_t g = NO_GROUP;
  if (!root_kind(f, f->m->instrs[x], &k)) return 0;
  if ((rc = new_group(f, x, k, &g))) return rc;
  return grow_group(f, g, x);
}

/* ---- names -------------------------------------------------------------- */

/* A set of names (open addressing), to make new names unique. */
typedef struct nameset {
  const char **v;
  uint32_t cap, n;
} nameset;

static uint32_t hash_str(const char *s) {
  uint32_t h = 2166136261u;
  while (*s) h = (h ^ (uint8_t)*s++) * 16777619u;
  return h;
}

static bool ns_has(const nameset *ns, const char *s) {
  if (ns->cap == 0) return false;
  for (uint32_t i = hash_str(s) & (ns->cap - 1);; i = (i + 1) & (ns->cap - 1)) {
    if (ns->v[i] == NULL) return false;
    if (strcmp(ns->v[i], s) == 0) return true;
  }
}

static int ns_add(kiln_arena *a, nameset *ns, const char *s) {
  if (2 * (ns->n + 1) > ns->cap) {
    uint32_t nc = ns->cap ? ns->cap * 2 : 64;
    const char **nv = kiln_arena_calloc(a, nc, sizeof *nv);
    if (nv == NULL) return KILN_ENOMEM;
    for (uint32_t i = 0; i < ns->cap; i++) {
      if (ns->v[i] == NULL) continue;
      uint32_t j = hash_str(ns->v[i]) & (nc - 1);
      while (nv[j]) j = (j + 1) & (nc - 1);
      nv[j] = ns->v[i];
    }
    ns->v = nv;
    ns->cap = nc;
  }
  uint32_t j = hash_str(s) & (ns->cap - 1);
  while (ns->v[j]) j = (j + 1) & (ns->cap - 1);
  ns->v[j] = s;
  ns->n++;
  return 0;
}

/* `base`, or base.N with the smallest N >= *counter that is free; the name
 * is added to the set. NULL on out-of-memory. */
static const char *ns_unique(kiln_arena *a, nameset *ns, const char *base, uint32_t *counter) {
  char buf[256];
  if (*counter == 0 && !ns_has(ns, base)) {
    snprintf(buf, sizeof buf, "%s", base);
  } else {
    do {
      if (*counter == 0) *counter = 1;
      snprintf(buf, sizeof buf, "%s.%u", base, (unsigned)(*counter)++);
    } while (ns_has(ns, buf));
  }
  if (*counter == 0) *counter = 1;
  char *s = kiln_arena_strdup(a, buf);
  return s && ns_add(a, ns, s) == 0 ? s : NULL;
}

/* ---- writing groups out ------------------------------------------------- */

typedef struct names {
  kiln_arena *a;  /* comps' table and names: they outlive each computation's scratch */
  nameset comps;  /* computation names of the module */
  uint32_t ncomp; /* counter for fused_computation.N */
  nameset parent; /* instruction names of the computation being fused */
  uint32_t nfusion, ngte;
} names;

static bool materialized(const fctx *f, uint32_t g) {
  return f->g[g].merged_into == NO_GROUP && (f->g[g].nmem > 1 || f->g[g].nroots > 1);
}

/* Whether x is a root of a group that becomes a fusion instruction. */
static bool replaced_root(const fctx *f, kiln_id x) {
  return f->root_of[x] != NO_GROUP && materialized(f, find(f, f->root_of[x]));
}

/* Final liveness, now that every group is known: x stays in the parent
 * when something outside the fused copies reads it. */
static void final_needed(fctx *f, const kiln_id *order, uint32_t n, bool *need) {
  for (uint32_t i = n; i-- > 0;) {
    kiln_id x = order[i];
    bool nd = must_stay(f, f->m->instrs[x]) || f->root_of[x] != NO_GROUP;
    uint32_t nu;
    const kiln_id *us = kiln_users_of(f->users, x, &nu);
    for (uint32_t k = 0; k < nu && !nd; k++) {
      kiln_id u = us[k];
      if (!in_comp(f, u)) continue;
      if (need[u] && !replaced_root(f, u)) nd = true;
      for (uint32_t e = f->mhead[u]; e != NO_GROUP && !nd; e = f->mb[e].next)
        if (!in_group(f, x, find(f, f->mb[e].group))) nd = true;
    }
    need[x] = nd;
  }
}

/* The fused computation of group G: parameters for the external operands
 * `ext` (in order), the members cloned in computation order, and the root
 * (a tuple of the roots for a multi-output group). */
static int fused_body(fctx *f, const group *G, const kiln_id *ext, uint32_t next, names *nm,
                      uint32_t *fc, kiln_instr **rootp) {
  kiln_module *m = f->m;
  const kiln_id *mem = G->mem;
  const char *cname = ns_unique(nm->a, &nm->comps, "fused_computation", &nm->ncomp);
  if (cname == NULL || kiln_module_add_computation(m, cname, fc)) return oom(f);
  nameset inner = {0};
  uint32_t zero = 0;
  for (uint32_t i = 0; i < G->nmem; i++)
    if (ns_add(f->a, &inner, m->instrs[mem[i]]->name)) return oom(f);
  for (uint32_t k = 0; k < next; k++) {
    char base[32];
    snprintf(base, sizeof base, "param_%u", (unsigned)k);
    zero = 0;
    const char *pn = ns_unique(f->a, &inner, base, &zero);
    kiln_instr *p = pn ? kiln_module_add_instr(m, *fc, KILN_OP_PARAMETER, pn) : NULL;
    if (p == NULL || kiln_instr_set_shape(m, p, &m->instrs[ext[k]]->shape)) return oom(f);
    p->param_number = k;
    f->clone[ext[k]] = p->id;
  }
  kiln_id ops[64], *opv = ops;
  for (uint32_t i = 0; i < G->nmem; i++) {
    const kiln_instr *x = m->instrs[mem[i]];
    if (x->noperands > 64 && (opv = kiln_arena_alloc(f->a, x->noperands * sizeof *opv)) == NULL)
      return oom(f);
    for (uint32_t k = 0; k < x->noperands; k++) opv[k] = f->clone[x->operands[k]];
    kiln_instr *c = kiln_instr_clone(m, *fc, x, opv, x->noperands, NULL, x->name);
    if (c == NULL) return oom(f);
    f->clone[x->id] = c->id;
    opv = ops;
  }
  kiln_instr *root;
  if (G->nroots == 1) {
    root = m->instrs[f->clone[G->roots[0]]];
  } else {
    zero = 0;
    const char *tn = ns_unique(f->a, &inner, "tuple", &zero);
    kiln_shape *ss = kiln_arena_alloc(f->a, G->nroots * sizeof *ss);
    kiln_id *rs = kiln_arena_alloc(f->a, G->nroots * sizeof *rs);
    if (tn == NULL || ss == NULL || rs == NULL) return oom(f);
    for (uint32_t r = 0; r < G->nroots; r++) {
      rs[r] = f->clone[G->roots[r]];
      ss[r] = m->instrs[G->roots[r]]->shape;
    }
    kiln_shape ts;
    root = kiln_module_add_instr(m, *fc, KILN_OP_TUPLE, tn);
    if (root == NULL || kiln_shape_make_tuple(m->arena, &ts, ss, G->nroots) ||
        kiln_instr_set_operands(m, root, rs, G->nroots) || kiln_instr_set_shape(m, root, &ts))
      return oom(f);
  }
  m->comps[*fc]->root = root->id;
  *rootp = root;
  return 0;
}

/* Writes group g as a fused computation and a fusion instruction in the
 * parent (appended; the caller orders it). *first is the fusion's id; for a
 * multi-output group its get-tuple-elements follow it, one per root. */
static int write_group(fctx *f, uint32_t g, names *nm, kiln_id *first) {
  kiln_module *m = f->m;
  group *G = &f->g[g];
  kiln_id *mem = G->mem;
  sort_by_pos(f, mem, G->nmem);
  /* External operands, in order of first use. */
  kiln_id *ext = kiln_arena_alloc(f->a, ((size_t)G->nmem * 4 + 1) * sizeof *ext);
  uint32_t next = 0, extcap = G->nmem * 4 + 1;
  if (ext == NULL) return oom(f);
  uint32_t member = ++f->stampv, seen = ++f->stampv;
  for (uint32_t i = 0; i < G->nmem; i++) f->stamp[mem[i]] = member;
  for (uint32_t i = 0; i < G->nmem; i++) {
    const kiln_instr *x = m->instrs[mem[i]];
    for (uint32_t k = 0; k < x->noperands; k++) {
      kiln_id o = x->operands[k];
      if (f->stamp[o] == member || f->stamp[o] == seen) continue;
      f->stamp[o] = seen;
      if (grow(f->a, (void **)&ext, &extcap, next + 1, sizeof *ext)) return oom(f);
      ext[next++] = o;
    }
  }
  uint32_t fc = 0;
  kiln_instr *root = NULL;
  int rc = fused_body(f, G, ext, next, nm, &fc, &root);
  if (rc) return rc;
  const char *fn = ns_unique(f->a, &nm->parent, "fusion", &nm->nfusion);
  kiln_instr *fu = fn ? kiln_module_add_instr(m, f->comp, KILN_OP_FUSION, fn) : NULL;
  if (fu == NULL || kiln_instr_set_operands(m, fu, ext, next) ||
      kiln_instr_set_called(m, fu, &fc, 1) || kiln_instr_set_shape(m, fu, &root->shape) ||
      kiln_instr_set_attr_str(m, fu, KILN_ATTR_KIND, kind_names[G->kind]))
    return oom(f);
  *first = fu->id;
  if (f->explain) {
    char cb[128];
    kiln_sbuf ms = KILN_SBUF_INIT;
    for (uint32_t i = 0; i < G->nmem && i < 16; i++)
      kiln_sbuf_printf(&ms, "%s%s", i ? ", " : "", m->instrs[mem[i]]->name);
    if (G->nmem > 16) kiln_sbuf_printf(&ms, ", ... (%u in all)", G->nmem);
    explain(f, "  => %s (%s, %u instructions, %u output%s): %s; members %s", fn,
            kind_names[G->kind], G->nmem, G->nroots, G->nroots == 1 ? "" : "s",
            cost_text(cb, sizeof cb, &G->cost), kiln_sbuf_str(&ms));
    kiln_sbuf_free(&ms);
  }
  if (G->nroots == 1) return 0;
  for (uint32_t r = 0; r < G->nroots; r++) {
    const char *gn = ns_unique(f->a, &nm->parent, "get-tuple-element", &nm->ngte);
    kiln_instr *gte = gn ? kiln_module_add_instr(m, f->comp, KILN_OP_GET_TUPLE_ELEMENT, gn) : NULL;
    if (gte == NULL || kiln_instr_set_operands(m, gte, first, 1) ||
        kiln_instr_set_shape(m, gte, &m->instrs[G->roots[r]]->shape) ||
        kiln_instr_set_attr_int(m, gte, KILN_ATTR_INDEX, r))
      return oom(f);
  }
  return 0;
}

/* Writes every group of the analysed computation out, puts each fusion at
 * its (last) root's position, drops what is no longer needed, and restores
 * a topological order. */
static int finish(fctx *f, names *nm) {
  kiln_module *m = f->m;
  kiln_computation *c = m->comps[f->comp];
  uint32_t n = c->ninstrs;
  kiln_id *old = kiln_arena_memdup(f->a, c->instrs, (size_t)n * sizeof *old);
  bool *need = kiln_arena_calloc(f->a, f->nids, sizeof *need);
  kiln_id *emit = kiln_arena_alloc(f->a, (size_t)f->nids * sizeof *emit);
  if (old == NULL || need == NULL || emit == NULL) return oom(f);
  final_needed(f, old, n, need);
  nm->parent = (nameset){0};
  nm->nfusion = nm->ngte = 0;
  for (uint32_t i = 0; i < n; i++)
    if (ns_add(f->a, &nm->parent, m->instrs[old[i]]->name)) return oom(f);
  for (uint32_t i = 0; i < f->nids; i++) emit[i] = KILN_NO_ID;
  bool any = false;
  for (uint32_t i = 0; i < n; i++) {
    kiln_id r = old[i];
    uint32_t g = f->root_of[r] == NO_GROUP ? NO_GROUP : find(f, f->root_of[r]);
    /* Each group once, at its first root, so that names follow the order. */
    if (g == NO_GROUP || !materialized(f, g) || f->g[g].roots[0] != r) continue;
    kiln_id first;
    int rc = write_group(f, g, nm, &first);
    if (rc) return rc;
    emit[f->g[g].roots[f->g[g].nroots - 1]] = first;
    any = true;
  }
  if (!any) return 0;
  kiln_id *map = kiln_malloc((size_t)m->ninstrs * sizeof *map);
  if (map == NULL) return oom(f);
  for (uint32_t i = 0; i < m->ninstrs; i++) map[i] = i;
  for (uint32_t g = 0; g < f->ng; g++) {
    if (!materialized(f, g)) continue;
    const group *G = &f->g[g];
    kiln_id first = emit[G->roots[G->nroots - 1]];
    for (uint32_t r = 0; r < G->nroots; r++)
      map[G->roots[r]] = G->nroots == 1 ? first : first + 1 + r;
  }
  /* New order, in place: the created instructions sit after the old ones in
   * c->instrs, so the array has room for them. */
  uint32_t out = 0;
  for (uint32_t i = 0; i < n; i++) {
    kiln_id x = old[i];
    if (emit[x] != KILN_NO_ID) {
      const kiln_instr *fu = m->instrs[emit[x]];
      uint32_t k = kiln_shape_is_tuple(&fu->shape) ? fu->shape.rank : 0;
      for (uint32_t j = 0; j <= k; j++) c->instrs[out++] = emit[x] + j;
    }
    if (need[x] && !replaced_root(f, x)) {
      c->instrs[out++] = x;
    } else {
      m->instrs[x]->comp = KILN_NO_ID;
    }
  }
  c->ninstrs = out;
  kiln_remap_operands(m, f->comp, map);
  kiln_free(map);
  return kiln_computation_sort(m, f->comp, f->st);
}

/* ---- driver --------------------------------------------------------------- */

static int fuse_computation(fctx *f, names *nm) {
  kiln_module *m = f->m;
  kiln_computation *c = m->comps[f->comp];
  uint32_t n = f->nids = m->ninstrs;
  f->pos = kiln_arena_alloc(f->a, (size_t)n * sizeof *f->pos);
  f->state = kiln_arena_calloc(f->a, n, 1);
  f->ctrl_succ = kiln_arena_calloc(f->a, n, sizeof *f->ctrl_succ);
  f->root_of = kiln_arena_alloc(f->a, (size_t)n * sizeof *f->root_of);
  f->mhead = kiln_arena_alloc(f->a, (size_t)n * sizeof *f->mhead);
  f->stamp = kiln_arena_calloc(f->a, n, sizeof *f->stamp);
  f->stack = kiln_arena_alloc(f->a, (size_t)n * sizeof *f->stack);
  f->clone = kiln_arena_alloc(f->a, (size_t)n * sizeof *f->clone);
  if (!f->pos || !f->state || !f->ctrl_succ || !f->root_of || !f->mhead || !f->stamp || !f->stack ||
      !f->clone)
    return oom(f);
  f->stampv = 0;
  f->g = NULL;
  f->ng = f->capg = 0;
  f->mb = NULL;
  f->nmb = f->capmb = 0;
  for (uint32_t i = 0; i < n; i++) {
    f->pos[i] = NO_POS;
    f->root_of[i] = f->mhead[i] = NO_GROUP;
  }
  for (uint32_t i = 0; i < c->ninstrs; i++) f->pos[c->instrs[i]] = i;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *x = m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < x->ncontrol; k++)
      if (x->control_preds[k] < n) f->ctrl_succ[x->control_preds[k]] = true;
  }
  explain(f, "computation %s (%u instructions):", c->name, c->ninstrs);
  for (uint32_t i = c->ninstrs; i-- > 0;) {
    int rc = visit(f, c->instrs[i]);
    /* A long computation takes seconds: the Compile's deadline and its
     * cancellation are seen within it, every 256 roots. */
    if (rc == 0 && (i & 255) == 0) rc = kiln__deadline_check("fusion", f->st);
    if (rc) return rc;
  }
  return finish(f, nm);
}

/* Computations that run as programs: the entry and, transitively, while
 * conditions and bodies, conditional branches and called computations. */
static uint32_t program_comps(const kiln_module *m, uint32_t *out) {
  uint32_t n = 0;
  if (m->entry >= m->ncomps) return 0;
  bool *seen = kiln_calloc(m->ncomps, sizeof *seen);
  if (seen == NULL) return UINT32_MAX;
  out[n++] = m->entry;
  seen[m->entry] = true;
  for (uint32_t i = 0; i < n; i++) {
    const kiln_computation *c = m->comps[out[i]];
    for (uint32_t j = 0; j < c->ninstrs; j++) {
      const kiln_instr *x = m->instrs[c->instrs[j]];
      if (x->op != KILN_OP_WHILE && x->op != KILN_OP_CONDITIONAL && x->op != KILN_OP_CALL) continue;
      for (uint32_t k = 0; k < x->ncalled; k++) {
        uint32_t cc = x->called[k];
        if (cc < m->ncomps && !seen[cc]) {
          seen[cc] = true;
          out[n++] = cc;
        }
      }
    }
  }
  kiln_free(seen);
  return n;
}

int kiln_pass_fusion(kiln_module *m, const kiln_pass_ctx *ctx) {
  fctx f = {0};
  f.m = m;
  f.st = ctx->st;
  f.t = ctx->target ? ctx->target : kiln_target_default();
  f.explain = kiln__pass_explain();
  if (f.explain)
    explain(&f,
            "fusion on target %s: a kernel costs max(flops / %.3g flop/s, bytes / %.3g B/s) + "
            "%.3gus launch; + joins, - stays out",
            f.t->name, f.t->peak_flops, f.t->bandwidth, f.t->launch_overhead * 1e6);
  uint32_t ncomps = m->ncomps;
  uint32_t *progs = kiln_malloc((ncomps ? ncomps : 1) * sizeof *progs);
  kiln_users *users = NULL;
  names nm = {0};
  nm.a = kiln_arena_create();
  f.a = kiln_arena_create();
  int rc = 0;
  if (progs == NULL || nm.a == NULL || f.a == NULL || kiln_users_build(m, &users)) {
    rc = oom(&f);
    goto out_free;
  }
  f.users = users;
  uint32_t np = program_comps(m, progs);
  if (np == UINT32_MAX) {
    rc = oom(&f);
    goto out_free;
  }
  for (uint32_t i = 0; i < m->ncomps; i++)
    if (ns_add(nm.a, &nm.comps, m->comps[i]->name)) {
      rc = oom(&f);
      goto out_free;
    }
  for (uint32_t i = 0; i < np && rc == 0; i++) {
    f.comp = progs[i];
    kiln_arena_reset(f.a);
    if ((rc = fuse_computation(&f, &nm)) == 0) rc = kiln__deadline_check("fusion", f.st);
  }
out_free:
  kiln_users_destroy(users);
  kiln_arena_destroy(f.a);
  kiln_arena_destroy(nm.a);
  kiln_free(progs);
  return rc;
}
