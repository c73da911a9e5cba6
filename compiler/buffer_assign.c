/* Buffer assignment (see buffer_assign.h for the model).
 *
 * Four phases over one walk of the program computations:
 *  1. visit: give every instruction its leaves' buffer groups, number the
 *     positions, record each group's first definition and last use, and
 *     collect in-place candidates (result group, operand group, position);
 *  2. merge: take candidates in position order and let a result share its
 *     operand's group when the operand's group dies right there; then let
 *     each conditional branch's root share the conditional's result group
 *     when the root's buffer is the branch's own (no copy out of a branch);
 *  3. claim: entry result leaves become output slots (or take over a donated
 *     parameter whose last use is before them);
 *  4. place: sweep positions, allocating temporaries best-fit from a free
 *     list at their definition and freeing them after their last use.
 * Groups merge through a union-find; the representative carries the range.
 */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/buffer_assign.h"

#define MAXR 64

typedef struct group {
  kiln_slot_kind kind;
  uint32_t index, leaf; /* PARAM: parameter, leaf; OUTPUT: result leaf */
  uint64_t size;
  int64_t def, last;
  uint32_t parent;
  uint32_t loop;     /* a while's state: 1 + the while's id; 0 otherwise */
  int64_t loop_last; /* last use inside that while's body */
  bool entry_def;    /* defined by an entry instruction (output candidate) */
  bool fixed;        /* parameter or constant: never written in place */
  uint32_t slot;
} group;

typedef struct cand {
  int64_t pos;
  uint32_t res, opnd; /* groups */
  bool check_layout_only;
} cand;

/* A conditional branch's root leaf that may be the conditional's result
 * leaf itself (phase 2b): the branch then writes its result in place. */
typedef struct broot {
  uint32_t res, root; /* groups */
  int64_t from, to;   /* the branch's positions, its result copy at `to` */
} broot;

typedef struct ba_ctx {
  const kiln_module *m;
  const kiln_buffer_options *o;
  kiln_status *st;
  group *g;
  size_t ng, gcap;
  uint32_t *lg; /* leaf groups, concatenated */
  size_t nlg, lgcap;
  uint32_t *lstart, *nleaves; /* per instruction */
  uint32_t *scratch;          /* per instruction: group or KILN_NO_SLOT */
  cand *c;
  size_t nc, ccap;
  broot *br;
  size_t nbr, brcap;
  uint32_t *bodies; /* stack of while ids whose bodies are being visited */
  uint32_t nbodies;
  uint32_t *comp_seen;
  int64_t *wpos;       /* per while: position of the copies into its state; else -1 */
  int64_t *ipos;       /* per instruction: the position it runs at; else -1 */
  uint32_t *out_group; /* per result leaf: a separate output group, or KILN_NO_SLOT */
  int64_t pos;
  uint64_t align;
} ba_ctx;

/* ---- layout predicates -------------------------------------------------- */

/* The dims of size > 1, major to minor. */
static uint32_t phys_order(const kiln_shape *s, int64_t *out) {
  int64_t m2m[MAXR];
  if (s->rank > MAXR) return 0;
  kiln_shape_minor_to_major(s, m2m);
  uint32_t n = 0;
  for (uint32_t i = s->rank; i-- > 0;)
    if (m2m[i] >= 0 && m2m[i] < s->rank && s->dims[m2m[i]] != 1) out[n++] = m2m[i];
  return n;
}

static bool row_major(const kiln_shape *s) {
  int64_t o[MAXR];
  uint32_t n = phys_order(s, o);
  for (uint32_t i = 1; i < n; i++)
    if (o[i] < o[i - 1]) return false;
  return true;
}

bool kiln__reshape_is_bitcast(const kiln_shape *from, const kiln_shape *to) {
  if (!kiln_shape_is_array(from) || !kiln_shape_is_array(to)) return false;
  if (kiln_shape_elements(from) != kiln_shape_elements(to)) return false;
  return row_major(from) && row_major(to);
}

bool kiln__transpose_is_bitcast(const kiln_shape *from, const kiln_shape *to, const int64_t *perm) {
  int64_t a[MAXR], b[MAXR];
  if (from->rank != to->rank || from->rank > MAXR) return false;
  uint32_t na = phys_order(from, a), nb = phys_order(to, b);
  if (na != nb) return false;
  for (uint32_t i = 0; i < nb; i++)
    if (perm[b[i]] != a[i]) return false;
  return true;
}

bool kiln__same_layout(const kiln_shape *a, const kiln_shape *b) {
  int64_t x[MAXR], y[MAXR];
  if (!kiln_shape_is_array(a) || !kiln_shape_is_array(b) || !kiln_shape_same_dims(a, b))
    return false;
  uint32_t nx = phys_order(a, x), ny = phys_order(b, y);
  return nx == ny && memcmp(x, y, nx * sizeof *x) == 0;
}

static bool single_device(const kiln_module *m) {
  return m->replica_count <= 1 && m->num_partitions <= 1;
}

bool kiln__is_alias_op(const kiln_module *m, const kiln_instr *ins) {
  if (ins->noperands < 1) return false;
  const kiln_shape *a = &m->instrs[ins->operands[0]]->shape, *r = &ins->shape;
  switch (ins->op) {
  case KILN_OP_BITCAST: return kiln_shape_is_array(a) && kiln_shape_bytes(a) == kiln_shape_bytes(r);
  case KILN_OP_RESHAPE: return a->dtype == r->dtype && kiln__reshape_is_bitcast(a, r);
  case KILN_OP_TRANSPOSE: {
    const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
    return p && p->n == r->rank && kiln__transpose_is_bitcast(a, r, p->v);
  }
  case KILN_OP_COPY:
    return kiln_shape_is_tuple(a) ? kiln_shape_equal(a, r, false)
                                  : a->dtype == r->dtype && kiln__same_layout(a, r);
  case KILN_OP_BITCAST_CONVERT:
    return r->dtype != KILN_PRED && kiln_dtype_size(a->dtype) == kiln_dtype_size(r->dtype) &&
           kiln_dtype_bits(a->dtype) == kiln_dtype_bits(r->dtype) && kiln__same_layout(a, r);
  case KILN_OP_OPTIMIZATION_BARRIER:
  case KILN_OP_DOMAIN:
  case KILN_OP_ADD_DEPENDENCY: return true;
  case KILN_OP_ALL_REDUCE:
  case KILN_OP_ALL_GATHER:
  case KILN_OP_REDUCE_SCATTER:
  case KILN_OP_ALL_TO_ALL:
  case KILN_OP_COLLECTIVE_BROADCAST:
    return single_device(m) && ins->noperands == 1 && kiln_shape_is_array(a) &&
           kiln__same_layout(a, r) && a->dtype == r->dtype;
  default: return false;
  }
}

/* In a fused computation, whether everything that depends on parameter
 * `pnum` is an elementwise op of the result's dims (so every element of the
 * parameter is read only for the same element of the result). */
static bool fused_param_elementwise(const kiln_module *m, uint32_t comp, int64_t pnum,
                                    const kiln_shape *rs) {
  const kiln_computation *c = m->comps[comp];
  bool *dep = kiln_calloc(m->ninstrs ? m->ninstrs : 1, sizeof *dep);
  if (dep == NULL) return false;
  bool ok = true;
  for (uint32_t i = 0; i < c->ninstrs && ok; i++) {
    const kiln_instr *x = m->instrs[c->instrs[i]];
    if (x->op == KILN_OP_PARAMETER) {
      dep[x->id] = x->param_number == pnum;
      continue;
    }
    bool d = false;
    for (uint32_t j = 0; j < x->noperands; j++) d |= dep[x->operands[j]];
    if (!d) continue;
    dep[x->id] = true;
    ok = (kiln_opcode_flags(x->op) & KILN_OPF_ELEMENTWISE) && kiln_shape_is_array(&x->shape) &&
         kiln_shape_same_dims(&x->shape, rs);
    for (uint32_t j = 0; ok && j < x->noperands; j++) {
      const kiln_shape *os = &m->instrs[x->operands[j]]->shape;
      ok = !dep[x->operands[j]] || kiln_shape_same_dims(os, rs);
    }
  }
  kiln_free(dep);
  return ok;
}

/* A fused dynamic-update-slice may write over its operand when that is
 * parameter k read by nothing else (the update never sees the writes). */
static bool fused_dus_operand(const kiln_module *m, const kiln_computation *c,
                              const kiln_instr *root, uint32_t k) {
  const kiln_instr *op = m->instrs[root->operands[0]];
  if (op->op != KILN_OP_PARAMETER || op->param_number != (int64_t)k) return false;
  uint32_t uses = 0;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *x = m->instrs[c->instrs[i]];
    for (uint32_t j = 0; j < x->noperands; j++) uses += x->operands[j] == op->id;
  }
  return uses == 1;
}

bool kiln__can_write_over(const kiln_module *m, const kiln_instr *ins, uint32_t k) {
  if (k >= ins->noperands) return false;
  const kiln_shape *a = &m->instrs[ins->operands[k]]->shape, *r = &ins->shape;
  if (!kiln_shape_is_array(r) || !kiln_shape_is_array(a)) return false;
  if (kiln_shape_is_dynamic(a) || kiln_shape_is_dynamic(r)) return false;
  if (!kiln__same_layout(a, r) || a->dtype != r->dtype) return false;
  if (ins->op == KILN_OP_FUSION) {
    if (ins->ncalled != 1 || ins->called[0] >= m->ncomps) return false;
    const kiln_computation *c = m->comps[ins->called[0]];
    const kiln_instr *root = kiln_computation_root(m, c);
    if (root == NULL || !kiln_shape_is_array(&root->shape)) return false;
    if (root->op == KILN_OP_DYNAMIC_UPDATE_SLICE) return fused_dus_operand(m, c, root, k);
    return fused_param_elementwise(m, ins->called[0], k, r);
  }
  return (kiln_opcode_flags(ins->op) & KILN_OPF_ELEMENTWISE) && ins->op != KILN_OP_MAP;
}

/* ---- groups and leaves -------------------------------------------------- */

static uint32_t count_leaves(const kiln_shape *s) {
  if (!kiln_shape_is_tuple(s)) return 1;
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->rank; i++) n += count_leaves(&s->tuple[i]);
  return n;
}

/* Leaf k of s (depth-first); *k is consumed. */
static const kiln_shape *leaf_shape(const kiln_shape *s, uint32_t *k) {
  if (!kiln_shape_is_tuple(s)) return (*k)-- == 0 ? s : NULL;
  for (uint32_t i = 0; i < s->rank; i++) {
    const kiln_shape *r = leaf_shape(&s->tuple[i], k);
    if (r) return r;
  }
  return NULL;
}

static uint32_t find(ba_ctx *b, uint32_t x) {
  while (b->g[x].parent != x) {
    b->g[x].parent = b->g[b->g[x].parent].parent;
    x = b->g[x].parent;
  }
  return x;
}

static int oom(ba_ctx *b) {
  return kiln_status_set(b->st, KILN_ENOMEM, "buffer assignment", "out of memory");
}

static int new_group(ba_ctx *b, kiln_slot_kind kind, uint64_t size, uint32_t *out) {
  if (kiln_grow((void **)&b->g, &b->gcap, b->ng + 1, sizeof *b->g)) return oom(b);
  uint32_t id = (uint32_t)b->ng++;
  b->g[id] = (group){.kind = kind,
                     .size = size,
                     .def = b->pos,
                     .last = b->pos,
                     .parent = id,
                     .slot = KILN_NO_SLOT,
                     .loop_last = -1};
  *out = id;
  return 0;
}

static void use(ba_ctx *b, uint32_t gid, int64_t pos) {
  group *g = &b->g[gid];
  if (pos > g->last) g->last = pos;
  if (g->loop) {
    for (uint32_t i = 0; i < b->nbodies; i++)
      if (b->bodies[i] + 1 == g->loop && pos > g->loop_last) g->loop_last = pos;
  }
}

static void use_instr(ba_ctx *b, kiln_id id, int64_t pos) {
  for (uint32_t i = 0; i < b->nleaves[id]; i++) use(b, b->lg[b->lstart[id] + i], pos);
}

static int set_leaves_from(ba_ctx *b, kiln_id id, kiln_id src, uint32_t first, uint32_t n) {
  if (kiln_grow((void **)&b->lg, &b->lgcap, b->nlg + n + 1, sizeof *b->lg)) return oom(b);
  uint32_t s = b->lstart[src] + first;
  b->lstart[id] = (uint32_t)b->nlg;
  b->nleaves[id] = n;
  for (uint32_t i = 0; i < n; i++) b->lg[b->nlg + i] = b->lg[s + i];
  b->nlg += n;
  return 0;
}

/* New groups for ins's leaves, except where keep[k] names a group leaf k
 * shares instead (keep NULL: none). */
static int leaves_keeping(ba_ctx *b, const kiln_instr *ins, kiln_slot_kind kind,
                          const uint32_t *keep) {
  uint32_t n = count_leaves(&ins->shape);
  if (kiln_grow((void **)&b->lg, &b->lgcap, b->nlg + n + 1, sizeof *b->lg)) return oom(b);
  b->lstart[ins->id] = (uint32_t)b->nlg;
  b->nleaves[ins->id] = n;
  for (uint32_t k = 0; k < n; k++) {
    if (keep && keep[k] != KILN_NO_SLOT) {
      b->lg[b->nlg++] = keep[k];
      continue;
    }
    uint32_t kk = k, gid;
    const kiln_shape *ls = leaf_shape(&ins->shape, &kk);
    int64_t bytes = ls && kiln_shape_is_array(ls) ? kiln_shape_bytes(ls) : 0;
    if (bytes < 0) return kiln_status_set(b->st, KILN_ELIMIT, ins->name, "buffer size overflows");
    if (new_group(b, kind, (uint64_t)bytes, &gid)) return KILN_ENOMEM;
    b->g[gid].fixed = kind != KILN_SLOT_TEMP;
    b->lg[b->nlg++] = gid;
  }
  return 0;
}

static int fresh_leaves(ba_ctx *b, const kiln_instr *ins, kiln_slot_kind kind) {
  return leaves_keeping(b, ins, kind, NULL);
}

static int add_cand(ba_ctx *b, uint32_t res, uint32_t opnd) {
  if (kiln_grow((void **)&b->c, &b->ccap, b->nc + 1, sizeof *b->c)) return oom(b);
  b->c[b->nc++] = (cand){b->pos, res, opnd, false};
  return 0;
}

/* ---- phase 1: visit ----------------------------------------------------- */

static int visit(ba_ctx *b, uint32_t comp, kiln_id caller, bool is_entry);

static int bad_comp(ba_ctx *b, const kiln_instr *ins, uint32_t i) {
  return kiln_status_set(b->st, KILN_EINVAL, ins->name, "%s: called computation %u is invalid",
                         kiln_opcode_name(ins->op), i);
}

/* Runs computation `comp` with its parameters bound to the leaves of `args`
 * (instructions, in parameter order). */
static int visit_nested(ba_ctx *b, const kiln_instr *ins, uint32_t comp) {
  if (comp >= b->m->ncomps) return bad_comp(b, ins, comp);
  if (b->comp_seen[comp]++)
    return kiln_status_set(b->st, KILN_EINVAL, ins->name,
                           "computation %s runs from more than one place", b->m->comps[comp]->name);
  return visit(b, comp, ins->id, false);
}

/* Per leaf of while w's state: the operand's group when the body returns
 * that leaf unchanged (element j of its root tuple is element j of its
 * parameter), else KILN_NO_SLOT. Such a leaf is never written by the loop,
 * so it stays in the operand's buffer: no copy in, none back, no slot of
 * its own. Its last use is at least the copies after the body, so nothing
 * in the body writes over it in place. */
static int passthrough_groups(ba_ctx *b, const kiln_instr *w, uint32_t **out) {
  const kiln_module *m = b->m;
  kiln_id op = w->operands[0];
  uint32_t n = b->nleaves[op];
  uint32_t *keep = kiln_malloc((n ? n : 1) * sizeof *keep);
  if (keep == NULL) return oom(b);
  memset(keep, 0xff, (n ? n : 1) * sizeof *keep);
  *out = keep;
  const kiln_instr *root = kiln_computation_root(m, m->comps[w->called[1]]);
  if (!kiln_shape_is_tuple(&w->shape) || n != count_leaves(&w->shape) || root == NULL ||
      root->op != KILN_OP_TUPLE || root->noperands != w->shape.rank)
    return 0;
  uint32_t leaf = 0;
  for (uint32_t j = 0; j < w->shape.rank; leaf += count_leaves(&w->shape.tuple[j]), j++) {
    if (!kiln_shape_is_array(&w->shape.tuple[j])) continue;
    const kiln_instr *g = m->instrs[root->operands[j]];
    if (g->op != KILN_OP_GET_TUPLE_ELEMENT || kiln_instr_attr_int(g, KILN_ATTR_INDEX, -1) != j)
      continue;
    const kiln_instr *p = m->instrs[g->operands[0]];
    if (p->op == KILN_OP_PARAMETER && p->comp == w->called[1] && p->param_number == 0)
      keep[leaf] = b->lg[b->lstart[op] + leaf];
  }
  return 0;
}

static int visit_while(ba_ctx *b, const kiln_instr *ins) {
  if (ins->ncalled != 2 || ins->noperands != 1) return bad_comp(b, ins, 0);
  if (ins->called[1] >= b->m->ncomps) return bad_comp(b, ins, ins->called[1]);
  use_instr(b, ins->operands[0], b->pos);
  uint32_t *keep = NULL;
  int rc = passthrough_groups(b, ins, &keep);
  if (rc == 0) rc = leaves_keeping(b, ins, KILN_SLOT_TEMP, keep);
  /* A state leaf may take over the buffer of its operand leaf when that
   * dies here (a candidate like an in-place write): no copy in. */
  const kiln_instr *op = b->m->instrs[ins->operands[0]];
  for (uint32_t i = 0; rc == 0 && i < b->nleaves[ins->id]; i++) {
    if (keep[i] != KILN_NO_SLOT) continue;
    uint32_t g = b->lg[b->lstart[ins->id] + i];
    b->g[g].loop = ins->id + 1;
    if (i < b->nleaves[op->id]) rc = add_cand(b, g, b->lg[b->lstart[op->id] + i]);
  }
  kiln_free(keep);
  if (rc) return rc;
  rc = visit_nested(b, ins, ins->called[0]);
  if (rc) return rc;
  b->bodies[b->nbodies++] = ins->id;
  rc = visit_nested(b, ins, ins->called[1]);
  if (rc) return rc;
  b->pos++; /* the copies of the body's result into the state */
  const kiln_instr *root = kiln_computation_root(b->m, b->m->comps[ins->called[1]]);
  /* A state leaf the result passes through is read by those copies: it
   * must keep its value to the end of the body. Being written by them is
   * not a read, so the state itself is used only after the body. */
  use_instr(b, root->id, b->pos);
  b->nbodies--;
  use_instr(b, ins->id, b->pos);
  b->wpos[ins->id] = b->pos;
  return 0;
}

/* A call's result is its computation's root: the call's leaves are the
 * root's buffers, so nothing is copied out of the called program. */
static int visit_call(ba_ctx *b, const kiln_instr *ins) {
  if (ins->ncalled != 1) return bad_comp(b, ins, 0);
  for (uint32_t j = 0; j < ins->noperands; j++) use_instr(b, ins->operands[j], b->pos);
  int rc = visit_nested(b, ins, ins->called[0]);
  if (rc) return rc;
  b->pos++;
  const kiln_instr *root = kiln_computation_root(b->m, b->m->comps[ins->called[0]]);
  if (count_leaves(&root->shape) != count_leaves(&ins->shape) ||
      b->nleaves[root->id] != count_leaves(&ins->shape))
    return kiln_status_set(b->st, KILN_EINVAL, ins->name,
                           "call: the called computation's result has another shape");
  if ((rc = set_leaves_from(b, ins->id, root->id, 0, b->nleaves[root->id]))) return rc;
  use_instr(b, ins->id, b->pos);
  return 0;
}

/* Each branch's root leaves are candidates for the conditional's result
 * buffers (alias_branch_roots), so that the branch writes its result there
 * instead of copying it at its end. */
static int visit_branches(ba_ctx *b, const kiln_instr *ins) {
  for (uint32_t j = 0; j < ins->noperands; j++) use_instr(b, ins->operands[j], b->pos);
  int rc = fresh_leaves(b, ins, KILN_SLOT_TEMP);
  for (uint32_t i = 0; rc == 0 && i < ins->ncalled; i++) {
    int64_t from = b->pos + 1;
    rc = visit_nested(b, ins, ins->called[i]);
    if (rc) break;
    b->pos++;
    const kiln_instr *root = kiln_computation_root(b->m, b->m->comps[ins->called[i]]);
    use_instr(b, root->id, b->pos);
    uint32_t n = b->nleaves[ins->id];
    if (b->nleaves[root->id] != n) continue; /* lowering refuses it */
    if (kiln_grow((void **)&b->br, &b->brcap, b->nbr + n + 1, sizeof *b->br)) return oom(b);
    for (uint32_t k = 0; k < n; k++)
      b->br[b->nbr++] =
          (broot){b->lg[b->lstart[ins->id] + k], b->lg[b->lstart[root->id] + k], from, b->pos};
  }
  if (rc == 0) use_instr(b, ins->id, b->pos);
  return rc;
}

/* Other operands reading the same buffer as operand k must read it at the
 * written position too. */
static bool others_elementwise(ba_ctx *b, const kiln_instr *ins, uint32_t k) {
  uint32_t g = b->lg[b->lstart[ins->operands[k]]];
  for (uint32_t j = 0; j < ins->noperands; j++) {
    if (j == k) continue;
    kiln_id o = ins->operands[j];
    for (uint32_t i = 0; i < b->nleaves[o]; i++)
      if (b->lg[b->lstart[o] + i] == g && !kiln__can_write_over(b->m, ins, j)) return false;
  }
  return true;
}

static int visit_plain(ba_ctx *b, const kiln_instr *ins) {
  for (uint32_t j = 0; j < ins->noperands; j++) use_instr(b, ins->operands[j], b->pos);
  int rc = fresh_leaves(b, ins, KILN_SLOT_TEMP);
  if (rc) return rc;
  uint64_t sb = b->o && b->o->scratch_bytes ? b->o->scratch_bytes[ins->id] : 0;
  if (sb && (rc = new_group(b, KILN_SLOT_TEMP, sb, &b->scratch[ins->id]))) return rc;
  uint32_t res0 = b->lg[b->lstart[ins->id]];
  switch (ins->op) {
  case KILN_OP_DYNAMIC_UPDATE_SLICE:
    if (kiln__same_layout(&b->m->instrs[ins->operands[0]]->shape, &ins->shape) &&
        b->m->instrs[ins->operands[0]]->shape.dtype == ins->shape.dtype &&
        others_elementwise(b, ins, 0))
      return add_cand(b, res0, b->lg[b->lstart[ins->operands[0]]]);
    return 0;
  case KILN_OP_SCATTER: {
    uint32_t n = (ins->noperands - 1) / 2;
    for (uint32_t k = 0; k < n && k < b->nleaves[ins->id]; k++)
      if (kiln__same_layout(&b->m->instrs[ins->operands[k]]->shape, kiln_shape_is_tuple(&ins->shape)
                                                                        ? &ins->shape.tuple[k]
                                                                        : &ins->shape) &&
          others_elementwise(b, ins, k) &&
          (rc = add_cand(b, b->lg[b->lstart[ins->id] + k], b->lg[b->lstart[ins->operands[k]]])))
        return rc;
    return 0;
  }
  default: break;
  }
  for (uint32_t k = 0; k < ins->noperands; k++) {
    if (b->nleaves[ins->operands[k]] != 1 || !kiln__can_write_over(b->m, ins, k)) continue;
    if (!others_elementwise(b, ins, k)) continue;
    if ((rc = add_cand(b, res0, b->lg[b->lstart[ins->operands[k]]]))) return rc;
  }
  return 0;
}

static int visit_instr(ba_ctx *b, const kiln_instr *ins, kiln_id caller, bool is_entry) {
  const kiln_module *m = b->m;
  for (uint32_t j = 0; j < ins->noperands; j++)
    if (ins->operands[j] >= m->ninstrs || b->lstart[ins->operands[j]] == KILN_NO_SLOT)
      return kiln_status_set(b->st, KILN_EINVAL, ins->name, "operand %u is not defined before", j);
  if (kiln_shape_is_dynamic(&ins->shape))
    return kiln_status_set(b->st, KILN_EUNIMPL, ins->name,
                           "bounded-dynamic shapes are not supported by code generation");
  switch (ins->op) {
  case KILN_OP_PARAMETER: {
    if (is_entry) return fresh_leaves(b, ins, KILN_SLOT_PARAM);
    const kiln_instr *c = m->instrs[caller];
    uint32_t argi = c->op == KILN_OP_CONDITIONAL ? 0 : (uint32_t)ins->param_number;
    if (c->op == KILN_OP_WHILE) return set_leaves_from(b, ins->id, c->id, 0, b->nleaves[c->id]);
    if (c->op == KILN_OP_CONDITIONAL) {
      for (uint32_t i = 0; i < c->ncalled; i++)
        if (c->called[i] == ins->comp) argi = i + 1;
    }
    if (argi >= c->noperands) return kiln_status_set(b->st, KILN_EINVAL, ins->name, "no argument");
    kiln_id a = c->operands[argi];
    return set_leaves_from(b, ins->id, a, 0, b->nleaves[a]);
  }
  case KILN_OP_CONSTANT: return fresh_leaves(b, ins, KILN_SLOT_CONSTANT);
  case KILN_OP_TUPLE: {
    uint32_t start = (uint32_t)b->nlg, n = 0;
    for (uint32_t j = 0; j < ins->noperands; j++) {
      kiln_id o = ins->operands[j];
      if (kiln_grow((void **)&b->lg, &b->lgcap, b->nlg + b->nleaves[o] + 1, sizeof *b->lg))
        return oom(b);
      for (uint32_t i = 0; i < b->nleaves[o]; i++) b->lg[b->nlg++] = b->lg[b->lstart[o] + i];
      n += b->nleaves[o];
    }
    b->lstart[ins->id] = start;
    b->nleaves[ins->id] = n;
    return 0;
  }
  case KILN_OP_GET_TUPLE_ELEMENT: {
    const kiln_shape *ts = &m->instrs[ins->operands[0]]->shape;
    int64_t idx = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, -1);
    if (!kiln_shape_is_tuple(ts) || idx < 0 || idx >= ts->rank)
      return kiln_status_set(b->st, KILN_EINVAL, ins->name, "tuple index out of range");
    uint32_t first = 0;
    for (int64_t i = 0; i < idx; i++) first += count_leaves(&ts->tuple[i]);
    return set_leaves_from(b, ins->id, ins->operands[0], first, count_leaves(&ts->tuple[idx]));
  }
  case KILN_OP_WHILE: return visit_while(b, ins);
  case KILN_OP_CONDITIONAL: return visit_branches(b, ins);
  case KILN_OP_CALL: return visit_call(b, ins);
  case KILN_OP_AFTER_ALL: return fresh_leaves(b, ins, KILN_SLOT_TEMP);
  default: break;
  }
  if (kiln__is_alias_op(m, ins))
    return set_leaves_from(b, ins->id, ins->operands[0], 0, b->nleaves[ins->operands[0]]);
  return visit_plain(b, ins);
}

static int visit(ba_ctx *b, uint32_t comp, kiln_id caller, bool is_entry) {
  const kiln_computation *c = b->m->comps[comp];
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *ins = b->m->instrs[c->instrs[i]];
    int64_t start = ++b->pos;
    b->ipos[ins->id] = start;
    int rc = visit_instr(b, ins, caller, is_entry);
    if (rc) return rc;
    if (is_entry && b->nleaves[ins->id]) {
      /* A call's result was defined inside the called program, a
       * conditional's before its branches. */
      int64_t from = ins->op == KILN_OP_CALL || ins->op == KILN_OP_CONDITIONAL ? start : b->pos;
      for (uint32_t k = 0; k < b->nleaves[ins->id]; k++) {
        group *g = &b->g[b->lg[b->lstart[ins->id] + k]];
        if (g->def >= from && g->def <= b->pos && g->kind == KILN_SLOT_TEMP && !g->loop)
          g->entry_def = true;
      }
    }
  }
  if (c->root == KILN_NO_ID || b->lstart[c->root] == KILN_NO_SLOT)
    return kiln_status_set(b->st, KILN_EINVAL, c->name, "computation has no root");
  return 0;
}

/* ---- phase 2: in place -------------------------------------------------- */

static void merge_into(ba_ctx *b, uint32_t res, uint32_t opnd) {
  group *r = &b->g[res], *o = &b->g[opnd];
  r->parent = opnd;
  if (r->loop) { /* a loop's state taking over its operand's dead buffer */
    o->loop = r->loop;
    o->loop_last = r->loop_last;
  } else if (o->loop && r->last > o->loop_last) {
    o->loop_last = r->last;
  }
  if (r->last > o->last) o->last = r->last;
  o->entry_def |= r->entry_def;
}

static void try_merge(ba_ctx *b, const cand *c) {
  uint32_t r = find(b, c->res), o = find(b, c->opnd);
  if (r == o || b->g[r].kind != KILN_SLOT_TEMP || b->g[o].kind != KILN_SLOT_TEMP) return;
  if (b->g[o].fixed || b->g[r].size != b->g[o].size || b->g[r].def != c->pos) return;
  if (b->g[r].loop && b->g[o].loop) return; /* an outer loop's state stays its own */
  /* The loop state may be overwritten inside its body only when its last
   * read in the body is here; elsewhere only a dead buffer. */
  bool ok = b->g[o].loop ? b->g[o].loop_last == c->pos : b->g[o].last == c->pos;
  if (ok) merge_into(b, r, o);
}

/* The candidates of one instruction are adjacent; of those, the ones over
 * a loop state leaf go first: writing the state in place saves the copy
 * back at the end of every iteration, a dead temporary saves nothing. */
static void do_merges(ba_ctx *b) {
  for (size_t i = 0; i < b->nc;) {
    size_t j = i;
    while (j < b->nc && b->c[j].pos == b->c[i].pos && b->c[j].res == b->c[i].res) j++;
    for (int state = 1; state >= 0; state--)
      for (size_t k = i; k < j; k++)
        if ((b->g[find(b, b->c[k].opnd)].loop != 0) == (state == 1)) try_merge(b, &b->c[k]);
    i = j;
  }
}

/* ---- phase 2b: conditional results in place ---------------------------- */

/* A branch root leaf becomes the conditional's result leaf when its buffer
 * is a temporary of the branch's own: first written inside the branch, read
 * no later than the branch's result copy, not a loop's state, and not
 * already taken (a root that returns one buffer twice, or a value from
 * outside the branch, keeps its copy). Only one branch runs, so the result
 * buffer, live across all of them, is free inside each. */
static void alias_branch_roots(ba_ctx *b) {
  for (size_t i = 0; i < b->nbr; i++) {
    const broot *c = &b->br[i];
    uint32_t r = find(b, c->root), d = find(b, c->res);
    group *gr = &b->g[r], *gd = &b->g[d];
    if (r == d || gr->kind != KILN_SLOT_TEMP || gd->kind != KILN_SLOT_TEMP) continue;
    if (gr->fixed || gr->loop || gr->size != gd->size) continue;
    if (gr->def < c->from || gr->last > c->to || gd->def >= c->from || gd->last < c->to) continue;
    gr->parent = d;
  }
}

/* A while whose body result feeds a state leaf from another state leaf
 * (after in-place merges) copies through a staging buffer. */
static int add_stages(ba_ctx *b) {
  for (uint32_t id = 0; id < b->m->ninstrs; id++) {
    if (b->wpos[id] < 0) continue;
    const kiln_instr *w = b->m->instrs[id];
    const kiln_instr *root = kiln_computation_root(b->m, b->m->comps[w->called[1]]);
    uint64_t stage = 0;
    for (uint32_t i = 0; i < b->nleaves[id]; i++) {
      uint32_t src = find(b, b->lg[b->lstart[root->id] + i]);
      uint32_t dst = find(b, b->lg[b->lstart[id] + i]);
      if (src != dst && b->g[src].loop == id + 1 && b->g[dst].size > stage) stage = b->g[dst].size;
    }
    if (stage == 0) continue;
    if (new_group(b, KILN_SLOT_TEMP, stage, &b->scratch[id])) return KILN_ENOMEM;
    b->g[b->scratch[id]].def = b->g[b->scratch[id]].last = b->wpos[id];
  }
  return 0;
}

/* ---- phase 3: results --------------------------------------------------- */

/* Whether an in-place candidate lets group g's first value be written over
 * group p at position pos (the last read of p). */
static bool writes_over(ba_ctx *b, uint32_t g, uint32_t p, int64_t pos) {
  if (b->g[p].last != pos) return false;
  for (size_t i = 0; i < b->nc; i++)
    if (b->c[i].pos == pos && find(b, b->c[i].res) == g && find(b, b->c[i].opnd) == p) return true;
  return false;
}

/* The group of the entry parameter leaf donated to result leaf o, or
 * KILN_NO_SLOT. */
static uint32_t donated_param(ba_ctx *b, uint32_t o) {
  const kiln_module *m = b->m;
  const kiln_computation *e = kiln_module_entry(m);
  for (uint32_t a = 0; a < m->naliases; a++) {
    const kiln_alias *al = &m->aliases[a];
    uint32_t out = al->output_index.n ? (uint32_t)al->output_index.v[0] : 0;
    if (al->output_index.n > 1 || al->param_index.n > 1 || out != o) continue;
    const kiln_instr *p = kiln_computation_param(m, e, al->param_number);
    uint32_t leaf = al->param_index.n ? (uint32_t)al->param_index.v[0] : 0;
    if (p == NULL || leaf >= b->nleaves[p->id]) continue;
    return b->lg[b->lstart[p->id] + leaf];
  }
  return KILN_NO_SLOT;
}

static int claim_results(ba_ctx *b, kiln_buffer_assignment *ba) {
  const kiln_module *m = b->m;
  const kiln_computation *e = kiln_module_entry(m);
  kiln_id root = e->root;
  uint32_t n = b->nleaves[root];
  ba->nresults = n;
  ba->result_slots = kiln_arena_calloc(ba->arena, n ? n : 1, sizeof *ba->result_slots);
  b->out_group = kiln_malloc((n ? n : 1) * sizeof *b->out_group);
  if (ba->result_slots == NULL || b->out_group == NULL) return oom(b);
  memset(b->out_group, 0xff, (n ? n : 1) * sizeof *b->out_group);
  for (uint32_t o = 0; o < n; o++) {
    uint32_t g = find(b, b->lg[b->lstart[root] + o]);
    group *gr = &b->g[g];
    uint32_t pg = donated_param(b, o);
    if (pg != KILN_NO_SLOT) {
      /* The producer may write straight into the donated buffer when the
       * parameter is dead before the producer's buffer is first written. */
      pg = find(b, pg);
      if (gr->kind == KILN_SLOT_TEMP && gr->entry_def && !gr->loop &&
          (b->g[pg].last < gr->def || writes_over(b, g, pg, gr->def))) {
        gr->parent = pg;
        if (gr->last > b->g[pg].last) b->g[pg].last = gr->last;
      }
      continue;
    }
    /* The state of a loop the entry runs may be the output buffer itself:
     * the loop then writes the result in place. */
    bool entry_loop = gr->loop && m->instrs[gr->loop - 1]->comp == m->entry;
    if (gr->kind == KILN_SLOT_TEMP && (gr->loop ? entry_loop : gr->entry_def)) {
      gr->kind = KILN_SLOT_OUTPUT;
      gr->index = o;
      continue;
    }
    /* A parameter, constant, loop state or another result's buffer: the
     * value is copied into an output slot of its own at the end. */
    uint32_t og;
    int rc = new_group(b, KILN_SLOT_OUTPUT, b->g[g].size, &og);
    if (rc) return rc;
    b->g[og].index = o;
    b->g[og].fixed = true;
    b->out_group[o] = og;
  }
  return 0;
}

/* ---- phase 4: placement ------------------------------------------------- */

typedef struct block {
  uint64_t off, size;
} block;

typedef struct freelist {
  block *b;
  size_t n, cap;
  uint64_t top;
} freelist;

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int fl_alloc(freelist *f, uint64_t size, uint64_t *off) {
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < f->n; i++)
    if (f->b[i].size >= size && (best == SIZE_MAX || f->b[i].size < f->b[best].size)) best = i;
  if (best != SIZE_MAX) {
    *off = f->b[best].off;
    f->b[best].off += size;
    f->b[best].size -= size;
    if (f->b[best].size == 0)
      memmove(&f->b[best], &f->b[best + 1], (f->n - best - 1) * sizeof *f->b), f->n--;
    return 0;
  }
  /* Grow the arena, starting inside a free block that ends at the top. */
  if (f->n && f->b[f->n - 1].off + f->b[f->n - 1].size == f->top) {
    *off = f->b[f->n - 1].off;
    f->n--;
  } else {
    *off = f->top;
  }
  f->top = *off + size;
  return 0;
}

static int fl_free(freelist *f, uint64_t off, uint64_t size) {
  size_t i = 0;
  while (i < f->n && f->b[i].off < off) i++;
  if (kiln_grow((void **)&f->b, &f->cap, f->n + 1, sizeof *f->b)) return KILN_ENOMEM;
  memmove(&f->b[i + 1], &f->b[i], (f->n - i) * sizeof *f->b);
  f->b[i] = (block){off, size};
  f->n++;
  if (i + 1 < f->n && f->b[i].off + f->b[i].size == f->b[i + 1].off) {
    f->b[i].size += f->b[i + 1].size;
    memmove(&f->b[i + 1], &f->b[i + 2], (f->n - i - 2) * sizeof *f->b);
    f->n--;
  }
  if (i > 0 && f->b[i - 1].off + f->b[i - 1].size == f->b[i].off) {
    f->b[i - 1].size += f->b[i].size;
    memmove(&f->b[i], &f->b[i + 1], (f->n - i - 1) * sizeof *f->b);
    f->n--;
  }
  return 0;
}

typedef struct keyed {
  int64_t key;
  uint32_t id;
} keyed;

static int cmp_keyed(const void *x, const void *y) {
  const keyed *a = x, *b = y;
  if (a->key != b->key) return a->key < b->key ? -1 : 1;
  return a->id < b->id ? -1 : a->id > b->id;
}

static int place_temps(ba_ctx *b, kiln_buffer_assignment *ba) {
  keyed *byd = kiln_malloc((b->ng + 1) * sizeof *byd),
        *byl = kiln_malloc((b->ng + 1) * sizeof *byl);
  freelist f = {0};
  int rc = 0;
  if (byd == NULL || byl == NULL) {
    rc = oom(b);
    goto out;
  }
  size_t n = 0;
  for (uint32_t i = 0; i < b->ng; i++) {
    if (find(b, i) != i || b->g[i].kind != KILN_SLOT_TEMP) continue;
    byd[n] = (keyed){b->g[i].def, i};
    byl[n++] = (keyed){b->g[i].last, i};
  }
  qsort(byd, n, sizeof *byd, cmp_keyed);
  qsort(byl, n, sizeof *byl, cmp_keyed);
  uint64_t live = 0, peak = 0;
  size_t di = 0, li = 0;
  while (di < n) {
    int64_t pos = byd[di].key;
    for (; di < n && byd[di].key == pos; di++) {
      group *g = &b->g[byd[di].id];
      uint64_t sz = round_up(g->size ? g->size : 1, b->align);
      fl_alloc(&f, sz, &ba->slots[g->slot].offset);
      live += sz;
    }
    if (live > peak) peak = live;
    int64_t next = di < n ? byd[di].key : INT64_MAX;
    for (; li < n && byl[li].key < next; li++) {
      group *g = &b->g[byl[li].id];
      uint64_t sz = round_up(g->size ? g->size : 1, b->align);
      if (fl_free(&f, ba->slots[g->slot].offset, sz)) {
        rc = oom(b);
        goto out;
      }
      live -= sz;
    }
  }
  ba->temp_bytes = f.top;
  ba->peak_bytes = peak;
out:
  kiln_free(byd);
  kiln_free(byl);
  kiln_free(f.b);
  return rc;
}

/* One slot per group representative; constants get blob offsets. */
static int make_slots(ba_ctx *b, kiln_buffer_assignment *ba) {
  ba->slots = kiln_arena_calloc(ba->arena, b->ng + 1, sizeof *ba->slots);
  ba->slot_def = kiln_arena_calloc(ba->arena, b->ng + 1, sizeof *ba->slot_def);
  ba->slot_last = kiln_arena_calloc(ba->arena, b->ng + 1, sizeof *ba->slot_last);
  if (ba->slots == NULL || ba->slot_def == NULL || ba->slot_last == NULL) return oom(b);
  uint64_t cbytes = 0;
  for (uint32_t i = 0; i < b->ng; i++) {
    if (find(b, i) != i) continue;
    group *g = &b->g[i];
    g->slot = ba->nslots++;
    kiln_slot *s = &ba->slots[g->slot];
    *s = (kiln_slot){.kind = g->kind, .index = g->index, .leaf = g->leaf, .size = g->size};
    ba->slot_def[g->slot] = g->def;
    ba->slot_last[g->slot] = g->last;
    if (g->kind == KILN_SLOT_CONSTANT) {
      s->offset = cbytes;
      cbytes += round_up(g->size, b->align);
    }
  }
  ba->constant_bytes = cbytes;
  for (uint32_t i = 0; i < b->ng; i++) b->g[i].slot = b->g[find(b, i)].slot;
  return 0;
}

static void number_params(ba_ctx *b) {
  const kiln_computation *e = kiln_module_entry(b->m);
  for (uint32_t i = 0; i < e->ninstrs; i++) {
    const kiln_instr *p = b->m->instrs[e->instrs[i]];
    if (p->op != KILN_OP_PARAMETER) continue;
    for (uint32_t k = 0; k < b->nleaves[p->id]; k++) {
      group *g = &b->g[b->lg[b->lstart[p->id] + k]];
      g->index = (uint32_t)p->param_number;
      g->leaf = k;
    }
  }
}

static int finish(ba_ctx *b, kiln_buffer_assignment *ba) {
  const kiln_module *m = b->m;
  uint32_t n = m->ninstrs ? m->ninstrs : 1;
  ba->leaf_start = kiln_arena_calloc(ba->arena, n, sizeof(uint32_t));
  ba->nleaves = kiln_arena_calloc(ba->arena, n, sizeof(uint32_t));
  ba->scratch_slot = kiln_arena_calloc(ba->arena, n, sizeof(uint32_t));
  ba->leaf_slots = kiln_arena_calloc(ba->arena, b->nlg + 1, sizeof(uint32_t));
  ba->instr_pos = kiln_arena_calloc(ba->arena, n, sizeof(int64_t));
  if (!ba->leaf_start || !ba->nleaves || !ba->scratch_slot || !ba->leaf_slots || !ba->instr_pos)
    return oom(b);
  memcpy(ba->instr_pos, b->ipos, m->ninstrs * sizeof(int64_t));
  ba->alignment = b->align;
  memcpy(ba->leaf_start, b->lstart, m->ninstrs * sizeof(uint32_t));
  memcpy(ba->nleaves, b->nleaves, m->ninstrs * sizeof(uint32_t));
  for (size_t i = 0; i < b->nlg; i++) ba->leaf_slots[i] = b->g[b->lg[i]].slot;
  for (uint32_t i = 0; i < m->ninstrs; i++)
    ba->scratch_slot[i] = b->scratch[i] == KILN_NO_SLOT ? KILN_NO_SLOT : b->g[b->scratch[i]].slot;
  kiln_id root = kiln_module_entry(m)->root;
  for (uint32_t o = 0; o < ba->nresults; o++)
    ba->result_slots[o] = b->out_group[o] != KILN_NO_SLOT ? b->g[b->out_group[o]].slot
                                                          : b->g[b->lg[b->lstart[root] + o]].slot;
  return 0;
}

/* Donated parameters: the caller reads result leaf o from parameter p's
 * buffer. The value gets there by a copy at the end of the program, unless
 * its producer can write there directly. */
static void apply_donations(ba_ctx *b, kiln_buffer_assignment *ba) {
  for (uint32_t o = 0; o < ba->nresults; o++) {
    uint32_t pg = donated_param(b, o);
    if (pg != KILN_NO_SLOT) ba->result_slots[o] = b->g[pg].slot;
  }
}

int kiln_buffer_assign(const kiln_module *m, const kiln_buffer_options *o,
                       kiln_buffer_assignment **out, kiln_status *st) {
  *out = NULL;
  const kiln_computation *e = kiln_module_entry(m);
  if (e == NULL)
    return kiln_status_set(st, KILN_EINVAL, "buffer assignment", "module has no entry");
  ba_ctx b = {.m = m, .o = o, .st = st, .align = o && o->alignment ? o->alignment : 64};
  size_t n = m->ninstrs ? m->ninstrs : 1;
  b.lstart = kiln_malloc(n * sizeof *b.lstart);
  b.nleaves = kiln_calloc(n, sizeof *b.nleaves);
  b.scratch = kiln_malloc(n * sizeof *b.scratch);
  b.bodies = kiln_malloc(n * sizeof *b.bodies);
  b.comp_seen = kiln_calloc(m->ncomps ? m->ncomps : 1, sizeof *b.comp_seen);
  b.wpos = kiln_malloc(n * sizeof *b.wpos);
  b.ipos = kiln_malloc(n * sizeof *b.ipos);
  kiln_buffer_assignment *ba = kiln_calloc(1, sizeof *ba);
  int rc = 0;
  if (!b.lstart || !b.nleaves || !b.scratch || !b.bodies || !b.comp_seen || !b.wpos || !b.ipos ||
      !ba || !(ba->arena = kiln_arena_create())) {
    rc = oom(&b);
    goto out;
  }
  memset(b.lstart, 0xff, n * sizeof *b.lstart);
  memset(b.scratch, 0xff, n * sizeof *b.scratch);
  for (size_t i = 0; i < n; i++) b.wpos[i] = b.ipos[i] = -1;
  b.comp_seen[m->entry] = 1;
  rc = visit(&b, m->entry, KILN_NO_ID, true);
  if (rc) goto out;
  b.pos++;
  use_instr(&b, e->root, b.pos);
  number_params(&b);
  do_merges(&b);
  alias_branch_roots(&b);
  if ((rc = add_stages(&b))) goto out;
  if ((rc = claim_results(&b, ba))) goto out;
  if ((rc = make_slots(&b, ba))) goto out;
  if ((rc = place_temps(&b, ba))) goto out;
  if ((rc = finish(&b, ba))) goto out;
  apply_donations(&b, ba);
out:
  kiln_free(b.g);
  kiln_free(b.lg);
  kiln_free(b.lstart);
  kiln_free(b.nleaves);
  kiln_free(b.scratch);
  kiln_free(b.c);
  kiln_free(b.br);
  kiln_free(b.bodies);
  kiln_free(b.comp_seen);
  kiln_free(b.wpos);
  kiln_free(b.ipos);
  kiln_free(b.out_group);
  if (rc) {
    kiln_buffer_assignment_destroy(ba);
    return rc;
  }
  *out = ba;
  return 0;
}

void kiln_buffer_assignment_destroy(kiln_buffer_assignment *ba) {
  if (ba == NULL) return;
  kiln_arena_destroy(ba->arena);
  kiln_free(ba);
}

const uint32_t *kiln_buffer_leaves(const kiln_buffer_assignment *ba, kiln_id id, uint32_t *n) {
  *n = ba->nleaves[id];
  return *n ? &ba->leaf_slots[ba->leaf_start[id]] : NULL;
}
