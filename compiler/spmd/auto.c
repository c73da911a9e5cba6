/* Auto-sharding: shardings for a module's ENTRY chosen by an integer
 * program, then written onto the module for propagation and the
 * partitioner (spmd.h).
 *
 * Every array instruction of the ENTRY gets a list of strategies: the
 * tilings of its result that map mesh axes onto dims that they divide
 * (replicated included); for a dot or convolution, the tilings of its loops
 * (batch, free and contracting: a split contracting loop is a partial
 * product and an all-reduce, or a reduce-scatter onto an output dim); for a
 * reduce, the tilings of its operand. A user annotation leaves only the
 * strategies with its tiling. What each strategy costs is not estimated
 * but replayed (model.c): the partitioner's rule for the instruction with
 * its operands in the tilings the strategy asks for, and on every edge the
 * collectives the reshard from the producer's tiling to that one inserts.
 * A dot or reduce chooses its loop tiling from the tilings its operands
 * arrive in, so where the plan reshards one of their operands it pins the
 * operand with a sharding annotation (what with_sharding_constraint
 * writes): then the rule sees exactly what the model assumed.
 *
 * The program (one binary x per instruction and strategy, sum 1 each):
 * minimize the rules' seconds plus the reshards' seconds, where an edge's
 * choice pair is linearized by variables y whose row and column sums are
 * the two ends' x (exact for binary x, and a tight relaxation), and one
 * reshard of a producer to one tiling is paid once however many users ask
 * for it (a variable z per producer state and target, above every user's
 * y that needs it: the partitioner remembers reshards). Memory: at every
 * point of the ENTRY's order the shards of the parameters and of the
 * values live there stay within the budget (one budget that no plan can
 * meet is refused before solving: the smallest strategies meet every point
 * at once, if anything does). GLPK solves the LP relaxation, then the
 * integer program within the time limit; a local search over the same
 * objective (one instruction's strategy at a time) polishes the result and
 * stands in when the solver found no plan in time, starting from the
 * relaxation's rounding, the cheapest and the smallest strategies.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/sharding.h"
#include "compiler/spmd/spmd.h"
#include "compiler/spmd/spmd_internal.h"

#ifdef KILN_HAVE_GLPK
#include <glpk.h>
#include <pthread.h>
#endif

#define MAX_STRATS 96 /* per instruction */
#define SCALE 1e6     /* the program's objective in microseconds */
#define NO_NODE UINT32_MAX

void kiln_spmd_auto_options_init(kiln_spmd_auto_options *o) { memset(o, 0, sizeof *o); }

int kiln_spmd_mesh_parse(const char *text, kiln_spmd_auto_options *o, kiln_status *st) {
  uint32_t n = 0;
  const char *p = text;
  while (*p) {
    char *end;
    long long v = strtoll(p, &end, 10);
    if (end == p || v < 1 || v > 4096 || n == KILN_SPMD_MAX_MESH)
      return kiln_status_set(st, KILN_EINVAL, "mesh",
                             "'%s' is not a mesh: up to %d axis sizes from 1 to 4096, as 2x4", text,
                             KILN_SPMD_MAX_MESH);
    o->mesh[n++] = v;
    p = end;
    if (*p == 'x' || *p == ',') {
      p++;
      if (*p == '\0') return kiln_status_set(st, KILN_EINVAL, "mesh", "'%s' ends early", text);
    } else if (*p) {
      return kiln_status_set(st, KILN_EINVAL, "mesh", "'%s': unexpected '%c'", text, *p);
    }
  }
  if (n == 0) return kiln_status_set(st, KILN_EINVAL, "mesh", "an empty mesh");
  o->mesh_rank = n;
  return 0;
}

bool kiln_spmd_auto_available(void) {
#ifdef KILN_HAVE_GLPK
  return true;
#else
  return false;
#endif
}

#ifdef KILN_HAVE_GLPK

/* One way to compute an instruction. */
typedef struct strat {
  spmd_tiling *out;   /* the sharding written on the instruction */
  spmd_tiling **need; /* per operand: the tiling its edge delivers (NULL: no edge) */
  double cost;        /* seconds of the rule itself */
  int64_t mem;        /* bytes of the local result (0: not counted) */
} strat;

typedef struct node {
  kiln_instr *ins;
  uint32_t pos; /* in the ENTRY's order */
  strat *s;
  uint32_t ns;
  bool user; /* annotated by the user: its sharding stays as written */
  bool pin;  /* dot, reduce: operands pinned by annotations where resharded */
  int col;   /* GLPK column of s[0]'s x; 0 when ns == 1 */
  uint32_t pick;
} node;

/* An edge: producer u's value delivered to consumer v (NO_NODE: an op that
 * needs it whole) in the tiling need(v's strategy). */
typedef struct edge {
  uint32_t u, v;
  uint32_t k;    /* v's operand; UINT32_MAX: v's result tiling (a get-tuple-element) */
  uint32_t *tgt; /* per v strategy (one for a sink): index into u's targets */
} edge;

typedef struct target_set {
  spmd_tiling **t;
  uint32_t n, cap;
  double *r; /* r[i * cap + t]: seconds to reshard u's strategy i to target t */
  int *zcol; /* GLPK column of z(i, t), 0: none */
} target_set;

typedef struct ctx {
  kiln_module *m;
  uint32_t comp;
  spmd_model md;
  kiln_arena *a;
  kiln_status *st;
  const kiln_spmd_auto_options *o;
  uint32_t naxes;
  int64_t mesh[KILN_SPMD_MAX_MESH];
  node *nodes;
  uint32_t nn;
  uint32_t *nodeof; /* instruction id -> node, NO_NODE */
  edge *edges;
  uint32_t ne, ecap;
  target_set *tg;  /* per node, as producer */
  uint32_t *tgoff; /* tgoff[u]: u's first target in a numbering of all of them */
  uint32_t ntargets;
  uint32_t dense_edge; /* edges of more strategy pairs get the smaller, looser rows */
  /* Memory (with a budget): at each point a value is made, the nodes live
   * there; and per node the points where it is live. */
  uint32_t **step, *nstep, nsteps;
  uint32_t **live_at, *nlive_at;
} ctx;

static int oom(ctx *x) {
  return kiln_status_set(x->st, KILN_ENOMEM, "auto-shard", "out of memory");
}

static bool is_array(const kiln_shape *s) {
  return kiln_shape_is_array(s) && s->rank <= SPMD_MAX_RANK;
}

static double seconds(const spmd_charge *c) { return kiln__charge_seconds(c); }

static double reshard_s(ctx *x, const kiln_shape *g, const spmd_tiling *from,
                        const spmd_tiling *to) {
  spmd_charge c = {0};
  kiln__model_reshard(&x->md, g, from, to, &c);
  return seconds(&c);
}

/* ---- candidate tilings ---------------------------------------------------- */

/* The tiling putting mesh axis k on dim assign[k] (-1: replicated along
 * it), the axes of one dim major to minor in mesh order. */
static spmd_tiling *mesh_tiling(ctx *x, uint32_t rank, const int *assign) {
  spmd_tiling *t = kiln__tiling_replicated(x->a, rank, x->md.n);
  if (t == NULL) return NULL;
  t->rep = 1;
  for (uint32_t k = 0; k < x->naxes; k++) {
    if (assign[k] >= 0)
      t->tiles[assign[k]] *= x->mesh[k];
    else
      t->rep *= x->mesh[k];
  }
  for (int64_t dev = 0; dev < x->md.n; dev++) {
    int64_t c[KILN_SPMD_MAX_MESH], r = dev;
    for (uint32_t k = x->naxes; k-- > 0;) {
      c[k] = r % x->mesh[k];
      r /= x->mesh[k];
    }
    int64_t pos = 0;
    for (uint32_t d = 0; d < rank; d++) {
      int64_t cd = 0;
      for (uint32_t k = 0; k < x->naxes; k++)
        if (assign[k] == (int)d) cd = cd * x->mesh[k] + c[k];
      pos = pos * t->tiles[d] + cd;
    }
    int64_t rc = 0;
    for (uint32_t k = 0; k < x->naxes; k++)
      if (assign[k] < 0) rc = rc * x->mesh[k] + c[k];
    t->dev[pos * t->rep + rc] = dev;
  }
  for (int64_t i = 0; i < x->md.n; i++) t->pos[t->dev[i]] = i;
  return t;
}

/* The next assignment of axes to dims 0..rank-1 (or -1) after *assign, as
 * an odometer; false after the last. Axes of size 1 stay -1. */
static bool next_assign(const ctx *x, uint32_t rank, int *assign) {
  for (uint32_t k = 0; k < x->naxes; k++) {
    if (x->mesh[k] == 1) continue;
    if (++assign[k] < (int)rank) return true;
    assign[k] = -1;
  }
  return false;
}

/* Whether the axes of `assign` divide the sizes of the dims they split
 * (skip[d]: dim d may not be split). */
static bool divides(const ctx *x, uint32_t rank, const int64_t *sizes, const bool *skip,
                    const int *assign) {
  int64_t t[SPMD_MAX_RANK];
  for (uint32_t d = 0; d < rank; d++) t[d] = 1;
  for (uint32_t k = 0; k < x->naxes; k++)
    if (assign[k] >= 0) {
      if (skip && skip[assign[k]]) return false;
      t[assign[k]] *= x->mesh[k];
    }
  for (uint32_t d = 0; d < rank; d++)
    if (sizes[d] % t[d] != 0) return false;
  return true;
}

/* ---- strategies ------------------------------------------------------------ */

/* A new strategy of v with result `out` into *s; NULL *s when v has one
 * with that result already (plain strategies) or has as many as it may. */
static int add_strat(ctx *x, node *v, spmd_tiling *out, strat **s) {
  *s = NULL;
  if (v->ns == MAX_STRATS) return 0;
  for (uint32_t j = 0; j < v->ns && !v->pin; j++)
    if (kiln__tiling_equal(v->s[j].out, out)) return 0;
  strat *n = &v->s[v->ns];
  n->out = out;
  n->need = kiln_arena_calloc(x->a, v->ins->noperands ? v->ins->noperands : 1, sizeof *n->need);
  if (n->need == NULL) return oom(x);
  n->cost = 0;
  n->mem = 0;
  v->ns++;
  *s = n;
  return 0;
}

static bool counted(const kiln_instr *ins) {
  return !(ins->op == KILN_OP_GET_TUPLE_ELEMENT || ins->op == KILN_OP_BITCAST ||
           (ins->op == KILN_OP_CUSTOM_CALL && kiln_custom_call_is_annotation(kiln_instr_attr_str(
                                                  ins, KILN_ATTR_CUSTOM_CALL_TARGET))));
}

/* A strategy whose operands go to whatever the rule asks given `want`. */
static int plain(ctx *x, node *v, spmd_tiling *want) {
  strat *s;
  int rc = add_strat(x, v, want, &s);
  if (rc || s == NULL) return rc;
  const kiln_instr *ins = v->ins;
  spmd_tiling *lt[64] = {NULL};
  spmd_charge c = {0};
  bool whole;
  kiln__model_rule(&x->md, ins, lt, want, s->need, &whole, &c);
  s->cost = seconds(&c);
  s->mem = counted(ins) ? kiln__shard_bytes(&ins->shape, want) : 0;
  return 0;
}

/* A dot, convolution or reduce with its operands in lt (pinned) and its
 * result in want. */
static int pinned(ctx *x, node *v, spmd_tiling *const *lt, spmd_tiling *want) {
  const kiln_instr *ins = v->ins;
  for (uint32_t j = 0; j < v->ns; j++) { /* the same triple twice */
    bool same = kiln__tiling_equal(v->s[j].out, want);
    for (uint32_t k = 0; same && k < ins->noperands; k++)
      same = lt[k] == NULL ? v->s[j].need[k] == NULL
                           : v->s[j].need[k] && kiln__tiling_equal(v->s[j].need[k], lt[k]);
    if (same) return 0;
  }
  strat *s;
  int rc = add_strat(x, v, want, &s);
  if (rc || s == NULL) return rc;
  spmd_tiling *need[64];
  spmd_charge c = {0};
  bool whole;
  kiln__model_rule(&x->md, ins, lt, want, need, &whole, &c);
  for (uint32_t k = 0; k < ins->noperands; k++) {
    s->need[k] = lt[k];
    const kiln_shape *g = &x->m->instrs[ins->operands[k]]->shape;
    if (lt[k] && need[k]) kiln__model_reshard(&x->md, g, lt[k], need[k], &c);
  }
  s->cost = seconds(&c);
  s->mem = kiln__shard_bytes(&ins->shape, want);
  return 0;
}

/* The result tilings a plain instruction may take: every divisible
 * assignment of axes to dims. */
static int plain_all(ctx *x, node *v) {
  const kiln_shape *s = &v->ins->shape;
  int assign[KILN_SPMD_MAX_MESH];
  for (uint32_t k = 0; k < x->naxes; k++) assign[k] = -1;
  do {
    if (!divides(x, s->rank, s->dims, NULL, assign)) continue;
    spmd_tiling *t = mesh_tiling(x, s->rank, assign);
    if (t == NULL) return oom(x);
    int rc = plain(x, v, t);
    if (rc) return rc;
  } while (v->ns < MAX_STRATS && next_assign(x, s->rank, assign));
  return 0;
}

/* Dot and convolution: every divisible tiling of the loops; the result as
 * the loops give it, or with the contracting loops' axes moved onto an
 * unsplit result dim (the reduce-scatter). */
static int contraction(ctx *x, node *v, const spmd_tiling *user) {
  const kiln_instr *ins = v->ins;
  spmd_loop loops[SPMD_MAX_RANK * 2];
  uint32_t nl;
  if (!kiln__contraction_loops(x->m, ins, loops, &nl) || nl > SPMD_MAX_RANK) return 1;
  const kiln_shape *ls = &x->m->instrs[ins->operands[0]]->shape;
  const kiln_shape *rs = &x->m->instrs[ins->operands[1]]->shape;
  const kiln_shape *os = &ins->shape;
  int64_t sizes[SPMD_MAX_RANK], lm[SPMD_MAX_RANK], rm[SPMD_MAX_RANK], om[SPMD_MAX_RANK];
  bool fixed[SPMD_MAX_RANK];
  for (uint32_t j = 0; j < nl; j++) {
    sizes[j] = loops[j].l >= 0 ? ls->dims[loops[j].l] : rs->dims[loops[j].r];
    fixed[j] = loops[j].fixed;
    if (loops[j].l >= 0) lm[loops[j].l] = j;
    if (loops[j].r >= 0) rm[loops[j].r] = j;
    if (loops[j].o >= 0) om[loops[j].o] = j;
  }
  v->pin = true;
  int assign[KILN_SPMD_MAX_MESH];
  for (uint32_t k = 0; k < x->naxes; k++) assign[k] = -1;
  do {
    if (!divides(x, nl, sizes, fixed, assign)) continue;
    spmd_tiling *it = mesh_tiling(x, nl, assign);
    spmd_tiling *lt[2] = {it ? kiln__tiling_derive(x->a, it, lm, ls->rank) : NULL,
                          it ? kiln__tiling_derive(x->a, it, rm, rs->rank) : NULL};
    spmd_tiling *to = it ? kiln__tiling_derive(x->a, it, om, os->rank) : NULL;
    if (!lt[0] || !lt[1] || !to) return oom(x);
    int rc;
    if (user) {
      if ((rc = pinned(x, v, lt, (spmd_tiling *)user))) return rc;
      continue;
    }
    if ((rc = pinned(x, v, lt, to))) return rc;
    bool ksplit = false;
    for (uint32_t k = 0; k < x->naxes; k++)
      ksplit = ksplit || (assign[k] >= 0 && loops[assign[k]].o < 0);
    for (uint32_t d = 0; ksplit && d < os->rank; d++) {
      int oa[KILN_SPMD_MAX_MESH];
      for (uint32_t k = 0; k < x->naxes; k++)
        oa[k] = assign[k] < 0 ? -1 : loops[assign[k]].o >= 0 ? (int)loops[assign[k]].o : (int)d;
      if (to->tiles[d] != 1 || !divides(x, os->rank, os->dims, NULL, oa)) continue;
      spmd_tiling *w = mesh_tiling(x, os->rank, oa);
      if (w == NULL) return oom(x);
      if ((rc = pinned(x, v, lt, w))) return rc;
    }
  } while (v->ns < MAX_STRATS && next_assign(x, nl, assign));
  return 0;
}

/* Reduce: every divisible tiling of the operand; the result as it gives,
 * or with the reduced dims' axes moved onto an unsplit result dim. */
static int reduction(ctx *x, node *v, const spmd_tiling *user) {
  const kiln_instr *ins = v->ins;
  const kiln_i64s *ds = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  if (ins->noperands != 2 || ds == NULL) return 1;
  const kiln_shape *xs = &x->m->instrs[ins->operands[0]]->shape;
  const kiln_shape *os = &ins->shape;
  int rmap[SPMD_MAX_RANK];
  bool red[SPMD_MAX_RANK] = {false};
  for (uint32_t i = 0; i < ds->n; i++)
    if (ds->v[i] >= 0 && ds->v[i] < (int64_t)xs->rank) red[ds->v[i]] = true;
  int j = 0;
  for (uint32_t d = 0; d < xs->rank; d++) rmap[d] = red[d] ? -1 : j++;
  if (j != (int)os->rank) return 1;
  v->pin = true;
  int assign[KILN_SPMD_MAX_MESH];
  for (uint32_t k = 0; k < x->naxes; k++) assign[k] = -1;
  do {
    if (!divides(x, xs->rank, xs->dims, NULL, assign)) continue;
    spmd_tiling *tx = mesh_tiling(x, xs->rank, assign);
    spmd_tiling *res = tx ? kiln__spmd_fwd(x->a, x->m, ins, 0, tx) : NULL;
    spmd_tiling *lt[2] = {tx, kiln__tiling_replicated(x->a, 0, x->md.n)};
    if (tx == NULL || lt[1] == NULL) return oom(x);
    if (res == NULL) continue;
    int rc;
    if (user) {
      if ((rc = pinned(x, v, lt, (spmd_tiling *)user))) return rc;
      continue;
    }
    if ((rc = pinned(x, v, lt, res))) return rc;
    bool split = false;
    for (uint32_t k = 0; k < x->naxes; k++) split = split || (assign[k] >= 0 && red[assign[k]]);
    for (uint32_t d = 0; split && d < os->rank; d++) {
      int oa[KILN_SPMD_MAX_MESH];
      for (uint32_t k = 0; k < x->naxes; k++)
        oa[k] = assign[k] < 0 ? -1 : red[assign[k]] ? (int)d : rmap[assign[k]];
      if (res->tiles[d] != 1 || !divides(x, os->rank, os->dims, NULL, oa)) continue;
      spmd_tiling *w = mesh_tiling(x, os->rank, oa);
      if (w == NULL) return oom(x);
      if ((rc = pinned(x, v, lt, w))) return rc;
    }
  } while (v->ns < MAX_STRATS && next_assign(x, xs->rank, assign));
  return 0;
}

static int strategies(ctx *x, node *v) {
  kiln_instr *ins = v->ins;
  char where[200];
  kiln_instr_where(x->m, ins, where, sizeof where);
  const kiln_sharding *us;
  int rc = kiln__user_sharding(x->a, x->m, ins, &us, x->st);
  if (rc) return oom(x);
  spmd_tiling *user = NULL;
  if (us &&
      (rc = kiln__tiling_from_sharding(x->a, us, ins->shape.rank, x->md.n, where, &user, x->st)))
    return rc;
  v->user = user != NULL;
  v->s = kiln_arena_calloc(x->a, MAX_STRATS, sizeof *v->s);
  if (v->s == NULL) return oom(x);
  rc = 1; /* no special strategies */
  if (ins->op == KILN_OP_DOT || ins->op == KILN_OP_CONVOLUTION)
    rc = contraction(x, v, user);
  else if (ins->op == KILN_OP_REDUCE && ins->ncalled == 1)
    rc = reduction(x, v, user);
  if (rc < 0) return rc;
  if (rc == 0 && v->ns > 0) return 0;
  v->ns = 0;
  v->pin = false;
  return user ? plain(x, v, user) : plain_all(x, v);
}

/* ---- the graph ------------------------------------------------------------- */

static int add_edge(ctx *x, uint32_t u, uint32_t v, uint32_t k) {
  if (x->ne == x->ecap) {
    uint32_t cap = x->ecap ? 2 * x->ecap : 64;
    edge *e = kiln_arena_alloc(x->a, cap * sizeof *e);
    if (e == NULL) return oom(x);
    if (x->ne) memcpy(e, x->edges, x->ne * sizeof *e);
    x->edges = e;
    x->ecap = cap;
  }
  x->edges[x->ne++] = (edge){u, v, k, NULL};
  return 0;
}

/* The tiling edge e needs when its consumer takes strategy j. */
static spmd_tiling *need_of(ctx *x, const edge *e, uint32_t j) {
  spmd_tiling *t = NULL;
  if (e->v != NO_NODE) {
    const strat *s = &x->nodes[e->v].s[j];
    t = e->k == UINT32_MAX ? s->out : s->need[e->k];
  }
  return t ? t : kiln__tiling_replicated(x->a, x->nodes[e->u].ins->shape.rank, x->md.n);
}

static bool only_gtes(const kiln_users *us, const kiln_instr *t, const kiln_module *m) {
  uint32_t n;
  const kiln_id *u = kiln_users_of(us, t->id, &n);
  for (uint32_t i = 0; i < n; i++)
    if (m->instrs[u[i]]->op != KILN_OP_GET_TUPLE_ELEMENT) return false;
  return true;
}

static int build_graph(ctx *x) {
  kiln_module *m = x->m;
  const kiln_computation *c = m->comps[x->comp];
  x->nodeof = kiln_arena_alloc(x->a, (m->ninstrs + 1) * sizeof *x->nodeof);
  x->nodes = kiln_arena_calloc(x->a, c->ninstrs ? c->ninstrs : 1, sizeof *x->nodes);
  if (x->nodeof == NULL || x->nodes == NULL) return oom(x);
  for (uint32_t i = 0; i <= m->ninstrs; i++) x->nodeof[i] = NO_NODE;
  int rc = 0;
  for (uint32_t i = 0; i < c->ninstrs && rc == 0; i++) {
    kiln_instr *ins = m->instrs[c->instrs[i]];
    if (!is_array(&ins->shape) || ins->noperands > 64) continue;
    node *v = &x->nodes[x->nn];
    v->ins = ins;
    v->pos = i;
    if ((rc = strategies(x, v)) == 0) x->nodeof[ins->id] = x->nn++;
  }
  if (rc) return rc;
  kiln_users *us;
  if (kiln_users_build(m, &us)) return oom(x);
  for (uint32_t i = 0; i < c->ninstrs && rc == 0; i++) {
    const kiln_instr *ins = m->instrs[c->instrs[i]];
    uint32_t v = x->nodeof[ins->id];
    if (v != NO_NODE && ins->op == KILN_OP_GET_TUPLE_ELEMENT) {
      /* An element of a tuple instruction arrives as its operand is. */
      const kiln_instr *t = m->instrs[ins->operands[0]];
      int64_t idx = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, -1);
      if (t->op == KILN_OP_TUPLE && idx >= 0 && idx < t->noperands &&
          x->nodeof[t->operands[idx]] != NO_NODE)
        rc = add_edge(x, x->nodeof[t->operands[idx]], v, UINT32_MAX);
      continue;
    }
    if (v != NO_NODE) {
      for (uint32_t k = 0; k < ins->noperands && rc == 0; k++)
        if (x->nodeof[ins->operands[k]] != NO_NODE && x->nodes[v].s[0].need[k] != NULL)
          rc = add_edge(x, x->nodeof[ins->operands[k]], v, k);
      continue;
    }
    /* Not an array: a tuple its users take apart costs nothing; anything
     * else (loops, sorts, ...) runs whole, on whole operands. */
    if (ins->op == KILN_OP_TUPLE && (ins->id == c->root || only_gtes(us, ins, m))) continue;
    for (uint32_t k = 0; k < ins->noperands && rc == 0; k++)
      if (x->nodeof[ins->operands[k]] != NO_NODE)
        rc = add_edge(x, x->nodeof[ins->operands[k]], NO_NODE, 0);
  }
  kiln_users_destroy(us);
  return rc;
}

/* Each producer's targets (the distinct tilings its edges need) and each
 * edge's target per consumer strategy. */
static int build_targets(ctx *x) {
  x->tg = kiln_arena_calloc(x->a, x->nn ? x->nn : 1, sizeof *x->tg);
  if (x->tg == NULL) return oom(x);
  for (uint32_t i = 0; i < x->ne; i++) {
    edge *e = &x->edges[i];
    target_set *ts = &x->tg[e->u];
    uint32_t nj = e->v == NO_NODE ? 1 : x->nodes[e->v].ns;
    e->tgt = kiln_arena_alloc(x->a, nj * sizeof *e->tgt);
    if (e->tgt == NULL) return oom(x);
    for (uint32_t j = 0; j < nj; j++) {
      spmd_tiling *t = need_of(x, e, j);
      if (t == NULL) return oom(x);
      uint32_t f = 0;
      while (f < ts->n && !kiln__tiling_equal(ts->t[f], t)) f++;
      if (f == ts->n) {
        if (ts->n == ts->cap) {
          uint32_t cap = ts->cap ? 2 * ts->cap : 8;
          spmd_tiling **nt = kiln_arena_alloc(x->a, cap * sizeof *nt);
          if (nt == NULL) return oom(x);
          if (ts->n) memcpy(nt, ts->t, ts->n * sizeof *nt);
          ts->t = nt;
          ts->cap = cap;
        }
        ts->t[ts->n++] = t;
      }
      e->tgt[j] = f;
    }
  }
  if ((x->tgoff = kiln_arena_alloc(x->a, (x->nn ? x->nn : 1) * sizeof *x->tgoff)) == NULL)
    return oom(x);
  for (uint32_t u = 0; u < x->nn; u++) {
    target_set *ts = &x->tg[u];
    const node *p = &x->nodes[u];
    x->tgoff[u] = x->ntargets;
    x->ntargets += ts->n;
    if (ts->n == 0) continue;
    ts->r = kiln_arena_alloc(x->a, (size_t)p->ns * ts->cap * sizeof *ts->r);
    ts->zcol = kiln_arena_calloc(x->a, (size_t)p->ns * ts->cap, sizeof *ts->zcol);
    if (ts->r == NULL || ts->zcol == NULL) return oom(x);
    for (uint32_t i = 0; i < p->ns; i++)
      for (uint32_t t = 0; t < ts->n; t++)
        ts->r[i * ts->cap + t] = reshard_s(x, &p->ins->shape, p->s[i].out, ts->t[t]);
  }
  return 0;
}

/* ---- the integer program ----------------------------------------------------- */

typedef struct lp {
  glp_prob *p;
  int *ia, *ja;
  double *ar;
  size_t nz, cap;
  int rows;
} lp;

static bool lp_put(lp *l, int row, int col, double v) {
  if (l->nz + 1 >= l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 4096;
    int *ia = kiln_realloc(l->ia, cap * sizeof *ia);
    if (ia) l->ia = ia;
    int *ja = kiln_realloc(l->ja, cap * sizeof *ja);
    if (ja) l->ja = ja;
    double *ar = kiln_realloc(l->ar, cap * sizeof *ar);
    if (ar) l->ar = ar;
    if (!ia || !ja || !ar) return false;
    l->cap = cap;
  }
  l->nz++;
  l->ia[l->nz] = row;
  l->ja[l->nz] = col;
  l->ar[l->nz] = v;
  return true;
}

static int lp_cols(lp *l, int n, int kind, double cost) {
  int first = glp_add_cols(l->p, n);
  for (int j = first; j < first + n; j++) {
    glp_set_col_bnds(l->p, j, GLP_DB, 0, 1);
    glp_set_col_kind(l->p, j, kind);
    glp_set_obj_coef(l->p, j, cost);
  }
  return first;
}

static int lp_row(lp *l, int type, double lo, double hi) {
  int r = glp_add_rows(l->p, 1);
  glp_set_row_bnds(l->p, r, type, lo, hi);
  return r;
}

/* z(u, i, t): made on first use; its cost is the reshard's. */
static int zcol(ctx *x, lp *l, uint32_t u, uint32_t i, uint32_t t) {
  target_set *ts = &x->tg[u];
  int *z = &ts->zcol[i * ts->cap + t];
  if (*z == 0) *z = lp_cols(l, 1, GLP_CV, ts->r[i * ts->cap + t] * SCALE);
  return *z;
}

static int xcol(const node *v, uint32_t j) { return v->ns > 1 ? v->col + (int)j : 0; }

/* The rows of edge e: z above what needs it. */
static bool edge_rows(ctx *x, lp *l, const edge *e) {
  const node *pu = &x->nodes[e->u];
  target_set *ts = &x->tg[e->u];
  uint32_t nu = pu->ns, nv = e->v == NO_NODE ? 1 : x->nodes[e->v].ns;
  bool any = false;
  for (uint32_t i = 0; i < nu; i++)
    for (uint32_t j = 0; j < nv; j++) any = any || ts->r[i * ts->cap + e->tgt[j]] > 0;
  if (!any) return true;
  if (nu == 1 && nv == 1) { /* both fixed: paid for sure */
    glp_set_col_bnds(l->p, zcol(x, l, e->u, 0, e->tgt[0]), GLP_FX, 1, 1);
    return true;
  }
  if (nv == 1) { /* z(i, t) >= x_u,i */
    for (uint32_t i = 0; i < nu; i++) {
      if (ts->r[i * ts->cap + e->tgt[0]] <= 0) continue;
      int r = lp_row(l, GLP_LO, 0, 0);
      if (!lp_put(l, r, zcol(x, l, e->u, i, e->tgt[0]), 1) || !lp_put(l, r, xcol(pu, i), -1))
        return false;
    }
    return true;
  }
  const node *pv = &x->nodes[e->v];
  if (nu == 1) { /* z(0, t) >= sum of x_v,j needing t */
    for (uint32_t t = 0; t < ts->n; t++) {
      if (ts->r[t] <= 0) continue;
      int r = 0;
      for (uint32_t j = 0; j < nv; j++) {
        if (e->tgt[j] != t) continue;
        if (r == 0 && (r = lp_row(l, GLP_LO, 0, 0)) && !lp_put(l, r, zcol(x, l, e->u, 0, t), 1))
          return false;
        if (!lp_put(l, r, xcol(pv, j), -1)) return false;
      }
    }
    return true;
  }
  if (nu * nv > x->dense_edge) { /* z(i, t) >= x_u,i + sum of x_v,j needing t - 1 */
    for (uint32_t i = 0; i < nu; i++)
      for (uint32_t t = 0; t < ts->n; t++) {
        if (ts->r[i * ts->cap + t] <= 0) continue;
        int r = 0;
        for (uint32_t j = 0; j < nv; j++) {
          if (e->tgt[j] != t) continue;
          if (r == 0 && (r = lp_row(l, GLP_LO, -1, 0)) &&
              (!lp_put(l, r, zcol(x, l, e->u, i, t), 1) || !lp_put(l, r, xcol(pu, i), -1)))
            return false;
          if (!lp_put(l, r, xcol(pv, j), -1)) return false;
        }
      }
    return true;
  }
  /* y(i, j): row sums x_u,i, column sums x_v,j; z(i, t) >= sum over j
   * needing t of y(i, j). */
  int y = lp_cols(l, (int)(nu * nv), GLP_CV, 0);
  for (uint32_t i = 0; i < nu; i++) {
    int r = lp_row(l, GLP_FX, 0, 0);
    for (uint32_t j = 0; j < nv; j++)
      if (!lp_put(l, r, y + (int)(i * nv + j), 1)) return false;
    if (!lp_put(l, r, xcol(pu, i), -1)) return false;
  }
  for (uint32_t j = 0; j < nv; j++) {
    int r = lp_row(l, GLP_FX, 0, 0);
    for (uint32_t i = 0; i < nu; i++)
      if (!lp_put(l, r, y + (int)(i * nv + j), 1)) return false;
    if (!lp_put(l, r, xcol(pv, j), -1)) return false;
  }
  for (uint32_t i = 0; i < nu; i++)
    for (uint32_t t = 0; t < ts->n; t++) {
      if (ts->r[i * ts->cap + t] <= 0) continue;
      int r = 0;
      for (uint32_t j = 0; j < nv; j++) {
        if (e->tgt[j] != t) continue;
        if (r == 0 && (r = lp_row(l, GLP_LO, 0, 0)) && !lp_put(l, r, zcol(x, l, e->u, i, t), 1))
          return false;
        if (!lp_put(l, r, y + (int)(i * nv + j), -1)) return false;
      }
    }
  return true;
}

/* The memory points: where a value of its own is made, which nodes are
 * live (the parameters always). */
static int build_steps(ctx *x) {
  const kiln_computation *c = x->m->comps[x->comp];
  uint32_t *last;
  bool *cnt;
  if (kiln__model_lifetimes(x->a, x->m, x->comp, &last, &cnt)) return oom(x);
  uint32_t n = c->ninstrs ? c->ninstrs : 1;
  x->step = kiln_arena_calloc(x->a, n, sizeof *x->step);
  x->nstep = kiln_arena_calloc(x->a, n, sizeof *x->nstep);
  x->live_at = kiln_arena_calloc(x->a, x->nn ? x->nn : 1, sizeof *x->live_at);
  x->nlive_at = kiln_arena_calloc(x->a, x->nn ? x->nn : 1, sizeof *x->nlive_at);
  uint32_t *buf = kiln_arena_alloc(x->a, (x->nn ? x->nn : 1) * sizeof *buf);
  if (!x->step || !x->nstep || !x->live_at || !x->nlive_at || !buf) return oom(x);
  for (uint32_t t = 0; t < c->ninstrs; t++) {
    if (!cnt[t] || x->m->instrs[c->instrs[t]]->op == KILN_OP_PARAMETER) continue;
    uint32_t k = 0;
    for (uint32_t v = 0; v < x->nn; v++) {
      const node *p = &x->nodes[v];
      if (cnt[p->pos] && (p->ins->op == KILN_OP_PARAMETER || (p->pos <= t && last[p->pos] >= t)))
        buf[k++] = v;
    }
    if ((x->step[x->nsteps] = kiln_arena_memdup(x->a, buf, (k ? k : 1) * sizeof *buf)) == NULL)
      return oom(x);
    x->nstep[x->nsteps++] = k;
    for (uint32_t i = 0; i < k; i++) x->nlive_at[buf[i]]++;
  }
  for (uint32_t v = 0; v < x->nn; v++) {
    x->live_at[v] =
        kiln_arena_alloc(x->a, (x->nlive_at[v] ? x->nlive_at[v] : 1) * sizeof(uint32_t));
    if (x->live_at[v] == NULL) return oom(x);
    x->nlive_at[v] = 0;
  }
  for (uint32_t t = 0; t < x->nsteps; t++)
    for (uint32_t i = 0; i < x->nstep[t]; i++) {
      uint32_t v = x->step[t][i];
      x->live_at[v][x->nlive_at[v]++] = t;
    }
  return 0;
}

/* Memory rows: at every point, the live shards within the budget. */
static bool memory_rows(ctx *x, lp *l) {
  double budget = (double)x->o->memory_budget;
  for (uint32_t t = 0; t < x->nsteps; t++) {
    double fixed = 0;
    int r = 0;
    for (uint32_t i = 0; i < x->nstep[t]; i++) {
      const node *p = &x->nodes[x->step[t][i]];
      if (p->ns == 1) {
        fixed += (double)p->s[0].mem;
        continue;
      }
      if (r == 0) r = lp_row(l, GLP_UP, 0, 0);
      for (uint32_t j = 0; j < p->ns; j++)
        if (p->s[j].mem && !lp_put(l, r, xcol(p, j), (double)p->s[j].mem)) return false;
    }
    if (r) glp_set_row_bnds(l->p, r, GLP_UP, 0, budget - fixed);
  }
  return true;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the plan's objective and a local search ---------------------------------- */

/* What the program's objective says plan `pick` costs (seconds): the
 * rules' costs and each producer's distinct reshards. */
static double objective(ctx *x, const uint32_t *pick, uint32_t *stamp, uint32_t *gen) {
  double sum = 0;
  (*gen)++;
  for (uint32_t v = 0; v < x->nn; v++) sum += x->nodes[v].s[pick[v]].cost;
  for (uint32_t i = 0; i < x->ne; i++) {
    const edge *e = &x->edges[i];
    const target_set *ts = &x->tg[e->u];
    uint32_t t = e->tgt[e->v == NO_NODE ? 0 : pick[e->v]];
    uint32_t *st = &stamp[x->tgoff[e->u] + t];
    if (*st == *gen) continue;
    *st = *gen;
    sum += ts->r[pick[e->u] * ts->cap + t];
  }
  return sum;
}

/* The peak of plan `pick` at each memory point into at[]; whether it fits. */
static bool plan_memory(ctx *x, const uint32_t *pick, double *at) {
  bool fits = true;
  for (uint32_t t = 0; t < x->nsteps; t++) {
    at[t] = 0;
    for (uint32_t i = 0; i < x->nstep[t]; i++)
      at[t] += (double)x->nodes[x->step[t][i]].s[pick[x->step[t][i]]].mem;
    fits = fits && (x->o->memory_budget <= 0 || at[t] <= (double)x->o->memory_budget);
  }
  return fits;
}

/* Moves one instruction's strategy at a time while that lowers the
 * objective and keeps the plan within the budget; the objective. */
static double improve(ctx *x, uint32_t *pick, double *at, uint32_t *stamp, uint32_t *gen,
                      double deadline) {
  double best = objective(x, pick, stamp, gen);
  double budget = (double)x->o->memory_budget;
  for (int sweep = 0; sweep < 32 && (sweep == 0 || now_s() < deadline); sweep++) {
    bool better = false;
    for (uint32_t v = 0; v < x->nn; v++) {
      const node *p = &x->nodes[v];
      for (uint32_t j = 0; j < p->ns; j++) {
        uint32_t cur = pick[v];
        if (j == cur) continue;
        double delta = (double)(p->s[j].mem - p->s[cur].mem);
        bool fits = true;
        for (uint32_t k = 0; budget > 0 && delta > 0 && fits && k < x->nlive_at[v]; k++)
          fits = at[x->live_at[v][k]] + delta <= budget;
        if (!fits) continue;
        pick[v] = j;
        double o = objective(x, pick, stamp, gen);
        if (o < best * (1 - 1e-12)) {
          best = o;
          better = true;
          for (uint32_t k = 0; k < x->nlive_at[v]; k++) at[x->live_at[v][k]] += delta;
        } else {
          pick[v] = cur;
        }
      }
    }
    if (!better) break;
  }
  return best;
}

/* The cheapest plan local search finds from the starts given (rows of
 * nn picks, NULL rows skipped) and from each instruction's cheapest and
 * smallest strategies, into pick; false when none fits the budget. */
static bool search(ctx *x, uint32_t *const *starts, uint32_t nstarts, uint32_t *pick,
                   double deadline, double *planned) {
  size_t n = x->nn ? x->nn : 1;
  uint32_t *cand = kiln_arena_alloc(x->a, 2 * n * sizeof *cand);
  uint32_t *stamp = kiln_arena_calloc(x->a, x->ntargets ? x->ntargets : 1, sizeof *stamp);
  double *at = kiln_arena_alloc(x->a, (x->nsteps ? x->nsteps : 1) * sizeof *at);
  if (!cand || !stamp || !at) return false;
  for (uint32_t v = 0; v < x->nn; v++) {
    const node *p = &x->nodes[v];
    uint32_t lo = 0, small = 0;
    for (uint32_t j = 1; j < p->ns; j++) {
      if (p->s[j].cost < p->s[lo].cost) lo = j;
      if (p->s[j].mem < p->s[small].mem ||
          (p->s[j].mem == p->s[small].mem && p->s[j].cost < p->s[small].cost))
        small = j;
    }
    cand[v] = lo;
    cand[n + v] = small;
  }
  uint32_t gen = 0;
  double best = INFINITY;
  for (uint32_t s = 0; s < nstarts + 2; s++) {
    uint32_t *row = s < nstarts ? starts[s] : cand + (s - nstarts) * n;
    if (row == NULL || !plan_memory(x, row, at)) continue;
    double o = improve(x, row, at, stamp, &gen, deadline);
    if (o < best) {
      best = o;
      memcpy(pick, row, x->nn * sizeof *pick);
    }
  }
  *planned = best;
  return best < INFINITY;
}

/* The smallest memory any plan needs at its worst point (each instruction
 * in its smallest strategy: the points' sums are smallest at once). */
static int64_t least_memory(ctx *x) {
  double worst = 0;
  for (uint32_t t = 0; t < x->nsteps; t++) {
    double at = 0;
    for (uint32_t i = 0; i < x->nstep[t]; i++) {
      const node *p = &x->nodes[x->step[t][i]];
      int64_t lo = INT64_MAX;
      for (uint32_t j = 0; j < p->ns; j++) lo = p->s[j].mem < lo ? p->s[j].mem : lo;
      at += (double)lo;
    }
    worst = at > worst ? at : worst;
  }
  return (int64_t)worst;
}

static pthread_mutex_t glpk_lock = PTHREAD_MUTEX_INITIALIZER;

static int no_fit(ctx *x) {
  return kiln_status_set(x->st, KILN_ELIMIT, "auto-shard",
                         "no sharding plan over %lld devices fits the memory budget of %lld bytes "
                         "per device (the smallest needs %lld)",
                         (long long)x->md.n, (long long)x->o->memory_budget,
                         (long long)least_memory(x));
}

/* The program's LP relaxation, then its integer optimum within the time
 * limit; a local search polishes whatever plan comes out, and finds one
 * from the relaxation's rounding (or from scratch) when the solver found
 * none in time. Every node's pick. */
static int solve(ctx *x, kiln_spmd_cost *cost) {
  int rc = 0;
  size_t n = x->nn ? x->nn : 1;
  uint32_t *pick = kiln_arena_calloc(x->a, 3 * n, sizeof *pick);
  if (pick == NULL || build_steps(x)) return oom(x);
  uint32_t *lp_pick = NULL, *mip_pick = NULL;
  if (x->o->memory_budget > 0 && least_memory(x) > x->o->memory_budget) return no_fit(x);
  double lim = x->o->time_limit_s > 0 ? x->o->time_limit_s : 10;
  double t0 = now_s();
  pthread_mutex_lock(&glpk_lock);
  glp_term_out(GLP_OFF);
  lp l = {glp_create_prob(), NULL, NULL, NULL, 0, 0, 0};
  glp_set_obj_dir(l.p, GLP_MIN);
  for (uint32_t v = 0; v < x->nn && rc == 0; v++) {
    node *p = &x->nodes[v];
    if (p->ns == 1) continue;
    p->col = lp_cols(&l, (int)p->ns, GLP_BV, 0);
    int r = lp_row(&l, GLP_FX, 1, 1);
    for (uint32_t j = 0; j < p->ns; j++) {
      glp_set_obj_coef(l.p, p->col + (int)j, p->s[j].cost * SCALE);
      if (!lp_put(&l, r, p->col + (int)j, 1)) rc = oom(x);
    }
  }
  for (uint32_t i = 0; i < x->ne && rc == 0; i++)
    if (!edge_rows(x, &l, &x->edges[i])) rc = oom(x);
  if (rc == 0 && x->o->memory_budget > 0 && !memory_rows(x, &l)) rc = oom(x);
  int ncols = glp_get_num_cols(l.p);
  cost->vars = (uint32_t)ncols;
  cost->optimal = true;
  if (rc == 0 && ncols > 0) {
    glp_load_matrix(l.p, (int)l.nz, l.ia, l.ja, l.ar);
    glp_smcp sm;
    glp_init_smcp(&sm);
    sm.msg_lev = GLP_MSG_OFF;
    sm.tm_lim = lim > 1e6 ? INT32_MAX : (int)(lim * 1000) + 1;
    if (glp_simplex(l.p, &sm) == 0 && glp_get_status(l.p) == GLP_OPT) {
      lp_pick = pick + n;
      for (uint32_t v = 0; v < x->nn; v++) {
        node *p = &x->nodes[v];
        for (uint32_t j = 1; p->ns > 1 && j < p->ns; j++)
          if (glp_get_col_prim(l.p, p->col + (int)j) >
              glp_get_col_prim(l.p, p->col + (int)lp_pick[v]))
            lp_pick[v] = j;
      }
      glp_iocp parm;
      glp_init_iocp(&parm);
      parm.msg_lev = GLP_MSG_OFF;
      double left = lim - (now_s() - t0);
      parm.tm_lim = left > 1e6 ? INT32_MAX : left < 0.001 ? 1 : (int)(left * 1000);
      glp_intopt(l.p, &parm);
      int status = glp_mip_status(l.p);
      if (status == GLP_OPT || status == GLP_FEAS) {
        cost->optimal = status == GLP_OPT;
        mip_pick = pick + 2 * n;
        for (uint32_t v = 0; v < x->nn; v++) {
          node *p = &x->nodes[v];
          for (uint32_t j = 0; p->ns > 1 && j < p->ns; j++)
            if (glp_mip_col_val(l.p, p->col + (int)j) > 0.5) mip_pick[v] = j;
        }
      }
    }
    if (mip_pick == NULL) cost->optimal = false;
  }
  glp_delete_prob(l.p);
  glp_free_env();
  pthread_mutex_unlock(&glpk_lock);
  kiln_free(l.ia);
  kiln_free(l.ja);
  kiln_free(l.ar);
  uint32_t *starts[2] = {mip_pick, lp_pick};
  /* The search gets what is left of the limit, and a tenth more. */
  double deadline = t0 + 1.1 * lim;
  if (rc == 0 && !search(x, starts, 2, pick, deadline, &cost->planned_s))
    rc = x->o->memory_budget > 0 ? no_fit(x) : oom(x);
  for (uint32_t v = 0; rc == 0 && v < x->nn; v++) x->nodes[v].pick = pick[v];
  cost->solve_s = now_s() - t0;
  return rc;
}

/* ---- writing the plan ------------------------------------------------------- */

static int set_sharding(kiln_module *m, kiln_instr *ins, kiln_sharding *s) {
  kiln_attr *a = s ? kiln_instr_add_attr(m, ins, KILN_ATTR_SHARDING) : NULL;
  if (a == NULL) return KILN_ENOMEM;
  a->v.sharding = s;
  return 0;
}

/* A loop runs whole: its state replicated (the model charges it so). */
static int replicate_loop(kiln_module *m, kiln_instr *w) {
  uint32_t r = w->shape.rank;
  kiln_sharding *s = kiln_arena_calloc(m->arena, 1, sizeof *s);
  if (s == NULL || (r && (s->elems = kiln_arena_calloc(m->arena, r, sizeof *s->elems)) == NULL))
    return KILN_ENOMEM;
  s->kind = KILN_SHARD_TUPLE;
  s->nelems = r;
  for (uint32_t i = 0; i < r; i++) s->elems[i].kind = KILN_SHARD_REPLICATED;
  return set_sharding(m, w, s);
}

/* The annotation pinning producer u in tiling t (made once per pair). */
typedef struct pin {
  kiln_id u, ann;
  const spmd_tiling *t;
} pin;

static int write_plan(ctx *x) {
  kiln_module *m = x->m;
  kiln__tx tx;
  int rc = kiln__tx_init(&tx, m, "auto-shard", x->st);
  kiln__b b = {&tx, x->comp};
  pin *pins = NULL;
  uint32_t npins = 0, pcap = 0;
  const kiln_computation *c = m->comps[x->comp];
  uint32_t n0 = c->ninstrs;
  for (uint32_t v = 0; v < x->nn && rc == 0; v++) {
    node *p = &x->nodes[v];
    strat *s = &p->s[p->pick];
    if (!p->user && set_sharding(m, p->ins, kiln__tiling_to_sharding(m->arena, s->out)))
      rc = oom(x);
    for (uint32_t k = 0; p->pin && rc == 0 && k < p->ins->noperands; k++) {
      kiln_id o = p->ins->operands[k];
      uint32_t u = x->nodeof[o];
      if (u == NO_NODE || s->need[k] == NULL) continue;
      const strat *su = &x->nodes[u].s[x->nodes[u].pick];
      if (kiln__tiling_equal(su->out, s->need[k])) continue;
      uint32_t f = 0;
      while (f < npins && !(pins[f].u == o && kiln__tiling_equal(pins[f].t, s->need[k]))) f++;
      if (f == npins) {
        if (npins == pcap) {
          pcap = pcap ? 2 * pcap : 16;
          pin *np = kiln_realloc(pins, pcap * sizeof *np);
          if (np == NULL) {
            rc = oom(x);
            break;
          }
          pins = np;
        }
        kiln_instr *a = kiln__b_make(&b, KILN_OP_CUSTOM_CALL, &m->instrs[o]->shape, &o, 1);
        if (a == NULL || kiln_instr_set_attr_str(m, a, KILN_ATTR_CUSTOM_CALL_TARGET, "Sharding") ||
            set_sharding(m, a, kiln__tiling_to_sharding(m->arena, s->need[k]))) {
          rc = oom(x);
          break;
        }
        pins[npins++] = (pin){o, a->id, s->need[k]};
      }
      kiln_id *ops = kiln_arena_memdup(x->a, p->ins->operands, p->ins->noperands * sizeof *ops);
      if (ops == NULL) {
        rc = oom(x);
        break;
      }
      ops[k] = pins[f].ann;
      if (kiln_instr_set_operands(m, p->ins, ops, p->ins->noperands)) rc = oom(x);
    }
  }
  for (uint32_t i = 0; i < n0 && rc == 0; i++) {
    kiln_instr *w = m->instrs[c->instrs[i]];
    if (w->op == KILN_OP_WHILE && !kiln_instr_has_attr(w, KILN_ATTR_SHARDING) &&
        replicate_loop(m, w))
      rc = oom(x);
  }
  kiln_free(pins);
  if (rc == 0 && tx.err) rc = tx.err;
  kiln__tx_fini(&tx);
  if (rc == 0) rc = kiln_computation_sort(m, x->comp, x->st);
  return rc;
}

int kiln_spmd_auto_shard(kiln_module *m, int64_t partitions, const kiln_spmd_auto_options *o,
                         kiln_spmd_cost *cost, kiln_status *st) {
  kiln_spmd_auto_options dflt;
  kiln_spmd_cost scratch;
  if (o == NULL) kiln_spmd_auto_options_init(&dflt), o = &dflt;
  if (cost == NULL) cost = &scratch;
  memset(cost, 0, sizeof *cost);
  if (kiln_module_entry(m) == NULL)
    return kiln_status_set(st, KILN_EINVAL, "auto-shard", "module has no ENTRY computation");
  if (partitions < 1 || partitions > 4096)
    return kiln_status_set(st, KILN_EINVAL, "auto-shard", "partitions must be 1 to 4096");
  ctx x = {.m = m, .comp = m->entry, .st = st, .o = o, .dense_edge = 64};
  x.naxes = o->mesh_rank ? o->mesh_rank : 1;
  int64_t prod = 1;
  for (uint32_t k = 0; k < x.naxes; k++) {
    x.mesh[k] = o->mesh_rank ? o->mesh[k] : partitions;
    if (x.mesh[k] < 1) return kiln_status_set(st, KILN_EINVAL, "mesh", "a mesh axis of size < 1");
    prod *= x.mesh[k];
  }
  if (o->mesh_rank > KILN_SPMD_MAX_MESH || prod != partitions)
    return kiln_status_set(st, KILN_EINVAL, "mesh",
                           "the mesh has %lld devices, not the %lld partitions", (long long)prod,
                           (long long)partitions);
  if (m->is_scheduled == 1)
    return kiln_status_set(st, KILN_EINVAL, "auto-shard",
                           "a scheduled module is a compiled, partitioned program already");
  for (uint32_t i = 0; i < m->ninstrs; i++)
    if (m->instrs[i]->comp != KILN_NO_ID &&
        kiln_opcode_family(m->instrs[i]->op) == KILN_FAM_COLLECTIVE) {
      char where[200];
      kiln_instr_where(m, m->instrs[i], where, sizeof where);
      return kiln_status_set(st, KILN_EINVAL, where,
                             "auto-sharding needs a global program: this one is already per "
                             "device (it has collectives or partition ids)");
    }
  int rc = kiln__spmd_inline_calls(m, m->entry, st);
  if (rc) return rc;
  if ((x.a = kiln_arena_create()) == NULL) return oom(&x);
  kiln__model_init(&x.md, m, x.a, partitions, o);
  if ((rc = build_graph(&x)) == 0 && (rc = build_targets(&x)) == 0 && (rc = solve(&x, cost)) == 0)
    rc = write_plan(&x);
  for (uint32_t v = 0; v < x.nn; v++) cost->choices += x.nodes[v].ns > 1;
  kiln_arena_destroy(x.a);
  if (rc) return rc;
  kiln_spmd_cost c;
  if ((rc = kiln_spmd_plan_cost(m, partitions, o, &c, st))) return rc;
  c.planned_s = cost->planned_s;
  c.solve_s = cost->solve_s;
  c.optimal = cost->optimal;
  c.choices = cost->choices;
  c.vars = cost->vars;
  *cost = c;
  return 0;
}

#else /* !KILN_HAVE_GLPK */

int kiln_spmd_auto_shard(kiln_module *m, int64_t partitions, const kiln_spmd_auto_options *o,
                         kiln_spmd_cost *cost, kiln_status *st) {
  (void)m, (void)partitions, (void)o;
  if (cost) memset(cost, 0, sizeof *cost);
  return kiln_status_set(st, KILN_EUNAVAIL, "auto-shard",
                         "Kiln was built without GLPK (Debian libglpk-dev): no auto-sharding");
}

#endif
