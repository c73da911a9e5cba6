/* Bounded dynamic shapes for generated code, as XLA's dynamic padder does.
 *
 * A dimension written "<=N" has N elements of storage and a runtime size
 * n <= N; the elements from n on are padding, whose values are unspecified.
 * The interpreter carries the runtime sizes with each literal
 * (compiler/eval). For the code generators this pass makes the program
 * static once, at compile time, so that one executable serves every size
 * up to the bounds:
 *
 * - every runtime size becomes an s32[] value of the program: the entry
 *   takes one more parameter per dynamic dimension of its parameters, and
 *   the sizes follow the dimensions through the instructions that keep,
 *   move or merge them (size[] below, per instruction and dimension);
 * - get-dimension-size becomes that value; set-dimension-size a copy whose
 *   size is the new value (clamped to [0, bound], as the interpreter does);
 * - where padding could reach a valid element it is masked: a reduction
 *   over a dynamic dimension reads select(iota < size, x, init), and a dot
 *   contracting one reads both operands with zeros there;
 * - the result becomes tuple(result, the sizes of its dynamic dimensions).
 *
 * Then every "<=" flag is dropped: the passes and the code generators see
 * a static program. What may carry a dynamic dimension is listed in
 * dyn_instr(); any other op with an operand of a runtime size is refused
 * here, naming the instruction (docs/toolbox.md has the list).
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/dyn_pad.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/verify.h"

typedef struct tsizes {
  uint32_t n, ndims;
  kiln_dyn_dim *dims;
} tsizes;

typedef struct dp {
  kiln__tx tx;
  kiln__b b;
  kiln_module *m;
  kiln_arena *out; /* the executable's arena (the signature) */
  /* size[id]: NULL (every dimension at its bound), or rank ids of s32[]
   * values, KILN_NO_ID where the dimension is at its bound. */
  kiln_id **size;
  uint32_t cap;
  bool *drop; /* replaced instructions, compacted away at the end */
  uint32_t ndrop;
  /* tsz[id]: a tuple whose elements' sizes travel as extra s32[] elements
   * (a while and its body's and condition's parameters): elements
   * 0 .. tsz->n-1 are the program's, element n + j is the size of dim
   * tsz->dims[j].dim of element tsz->dims[j].leaf. */
  struct tsizes **tsz;
  bool *done;                  /* computations rewritten (the entry, loop bodies and conditions) */
  kiln_dyn_dim *pdims, *rdims; /* the boundary's sizes, in order */
  kiln_id *rvals;
  uint32_t npdims, nrdims, pdcap, rdcap;
} dp;

static int grow(dp *p) {
  uint32_t n = p->m->ninstrs;
  if (n <= p->cap) return 0;
  uint32_t cap = n * 2 + 16;
  kiln_id **s = kiln_realloc(p->size, cap * sizeof *s);
  if (s == NULL) return kiln__tx_oom(&p->tx);
  memset(s + p->cap, 0, (cap - p->cap) * sizeof *s);
  p->size = s;
  bool *d = kiln_realloc(p->drop, cap * sizeof *d);
  if (d == NULL) return kiln__tx_oom(&p->tx);
  memset(d + p->cap, 0, (cap - p->cap) * sizeof *d);
  p->drop = d;
  tsizes **t = kiln_realloc(p->tsz, cap * sizeof *t);
  if (t == NULL) return kiln__tx_oom(&p->tx);
  memset(t + p->cap, 0, (cap - p->cap) * sizeof *t);
  p->tsz = t;
  p->cap = cap;
  return 0;
}

static kiln_id size_of(const dp *p, kiln_id id, uint32_t d) {
  if (id >= p->cap || p->size[id] == NULL) return KILN_NO_ID;
  const kiln_shape *s = &p->m->instrs[id]->shape;
  return kiln_shape_is_array(s) && d < s->rank ? p->size[id][d] : KILN_NO_ID;
}

static bool has_sizes(const dp *p, kiln_id id) {
  const kiln_shape *s = &p->m->instrs[id]->shape;
  for (uint32_t d = 0; kiln_shape_is_array(s) && d < s->rank; d++)
    if (size_of(p, id, d) != KILN_NO_ID) return true;
  return false;
}

static int set_size(dp *p, kiln_id id, uint32_t d, kiln_id v) {
  if (v == KILN_NO_ID) return 0;
  int rc = grow(p);
  if (rc) return rc;
  const kiln_shape *s = &p->m->instrs[id]->shape;
  if (!kiln_shape_is_array(s) || d >= s->rank) return 0;
  if (p->size[id] == NULL) {
    p->size[id] = kiln_arena_alloc(p->tx.scratch, s->rank * sizeof(kiln_id));
    if (p->size[id] == NULL) return kiln__tx_oom(&p->tx);
    for (uint32_t k = 0; k < s->rank; k++) p->size[id][k] = KILN_NO_ID;
  }
  p->size[id][d] = v;
  return 0;
}

static kiln_id s32(dp *p, int64_t v) { return kiln__b_iscalar(&p->b, KILN_S32, v); }

static int push_dim(dp *p, kiln_dyn_dim **v, uint32_t *n, uint32_t *cap, uint32_t leaf,
                    uint32_t dim) {
  if (*n == *cap) {
    uint32_t c = *cap * 2 + 8;
    kiln_dyn_dim *g = kiln_realloc(*v, c * sizeof *g);
    if (g == NULL) return kiln__tx_oom(&p->tx);
    *v = g;
    *cap = c;
  }
  (*v)[(*n)++] = (kiln_dyn_dim){leaf, dim};
  return 0;
}

static int unsupported(dp *p, const kiln_instr *ins, const char *why) {
  return kiln__tx_fail(&p->tx, KILN_EUNIMPL, ins,
                       "%s %s: %s; code generation takes a runtime-sized (\"<=\") dimension only "
                       "in the ops listed in docs/toolbox.md (the interp backend runs any)",
                       kiln_opcode_name(ins->op), ins->name, why);
}

/* Replaces ins by `by` (a new instruction) everywhere. */
static void replace(dp *p, kiln_instr *ins, kiln_id by) {
  if (by == KILN_NO_ID || grow(p)) return;
  kiln_replace_all_uses(p->m, ins->comp, ins->id, by);
  p->drop[ins->id] = true;
  p->ndrop++;
}

/* x with the elements at and past `size` along dimension d replaced by
 * the scalar `fill`. */
static kiln_id mask(dp *p, kiln_id x, uint32_t d, kiln_id size, kiln_id fill) {
  const kiln_shape *s = kiln__b_shape(&p->tx, x);
  int64_t dims[64];
  uint32_t r = s->rank < 64 ? s->rank : 64;
  memcpy(dims, s->dims, r * sizeof *dims);
  kiln_id io = kiln__b_iota(&p->b, KILN_S32, dims, r, d);
  kiln_id n = kiln__b_broadcast(&p->b, size, dims, r, NULL, 0);
  kiln_id in = kiln__b_cmp(&p->b, io, n, KILN_CMP_LT);
  kiln_id f = kiln__b_broadcast(&p->b, fill, dims, r, NULL, 0);
  return kiln__b_select(&p->b, in, x, f);
}

/* Elementwise ops: each dimension's size from the first operand of the
 * result's rank that has one. */
static int dyn_elementwise(dp *p, kiln_instr *ins) {
  const kiln_shape *s = &ins->shape;
  if (!kiln_shape_is_array(s)) return unsupported(p, ins, "a tuple result");
  for (uint32_t k = 0; k < ins->noperands; k++) {
    const kiln_shape *o = kiln__b_shape(&p->tx, ins->operands[k]);
    if (has_sizes(p, ins->operands[k]) && o->rank != s->rank)
      return unsupported(p, ins, "an operand of another rank");
  }
  for (uint32_t d = 0; d < s->rank; d++)
    for (uint32_t k = 0; k < ins->noperands; k++) {
      kiln_id v = size_of(p, ins->operands[k], d);
      if (v != KILN_NO_ID) {
        if (set_size(p, ins->id, d, v)) return p->tx.err;
        break;
      }
    }
  return 0;
}

static int dyn_broadcast(dp *p, kiln_instr *ins) {
  const kiln_i64s *dims = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  kiln_id x = ins->operands[0];
  for (uint32_t k = 0; dims && k < dims->n; k++)
    if (set_size(p, ins->id, (uint32_t)dims->v[k], size_of(p, x, k))) return p->tx.err;
  return 0;
}

static int dyn_transpose(dp *p, kiln_instr *ins) {
  const kiln_i64s *perm = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  kiln_id x = ins->operands[0];
  for (uint32_t k = 0; perm && k < perm->n; k++)
    if (set_size(p, ins->id, k, size_of(p, x, (uint32_t)perm->v[k]))) return p->tx.err;
  return 0;
}

/* A reshape keeps the padded layout meaningful when each runtime-sized
 * dimension k either survives whole (output dim j of the same bound, all
 * dims before both spanning the same elements) or is the major end of a
 * run of static dims merged into one output dim (size * their product).
 * Splitting it is refused: the size need not divide. */
static int dyn_reshape(dp *p, kiln_instr *ins) {
  kiln_id x = ins->operands[0];
  const kiln_shape *in = kiln__b_shape(&p->tx, x), *out = &ins->shape;
  for (uint32_t k = 0; k < in->rank; k++) {
    kiln_id v = size_of(p, x, k);
    if (v == KILN_NO_ID) continue;
    int64_t pre = 1, acc = 1;
    for (uint32_t i = 0; i < k; i++) pre *= in->dims[i];
    uint32_t j = 0;
    while (j < out->rank && acc < pre) acc *= out->dims[j++];
    while (j < out->rank && out->dims[j] == 1 && in->dims[k] != 1) j++;
    if (acc != pre || j >= out->rank || out->dims[j] < in->dims[k])
      return unsupported(p, ins, "it splits or moves a runtime-sized dimension");
    if (out->dims[j] == in->dims[k]) {
      if (set_size(p, ins->id, j, v)) return p->tx.err;
      continue;
    }
    int64_t merged = in->dims[k];
    uint32_t r = k + 1;
    for (; r < in->rank && merged < out->dims[j]; r++) {
      if (size_of(p, x, r) != KILN_NO_ID)
        return unsupported(p, ins, "it merges two runtime-sized dimensions");
      merged *= in->dims[r];
    }
    if (merged != out->dims[j] || in->dims[k] == 0)
      return unsupported(p, ins, "it splits or moves a runtime-sized dimension");
    kiln_id n = kiln__b_mul(&p->b, v, s32(p, out->dims[j] / in->dims[k]));
    if (set_size(p, ins->id, j, n)) return p->tx.err;
  }
  return 0;
}

/* dynamic-reshape(x, sizes...): the valid elements of x in row-major order
 * laid out at the new sizes. On padded storage that is a plain reshape of
 * the bounds when both valid regions are row-major prefixes: only
 * dimension 0 of either side may be runtime-sized. */
static int dyn_dynamic_reshape(dp *p, kiln_instr *ins) {
  kiln_id x = ins->operands[0];
  const kiln_shape *in = kiln__b_shape(&p->tx, x), *out = &ins->shape;
  for (uint32_t k = 1; k < in->rank; k++)
    if (size_of(p, x, k) != KILN_NO_ID)
      return unsupported(p, ins, "its operand has a runtime size in a dimension other than 0");
  for (uint32_t k = 1; k < out->rank; k++)
    if (out->dynamic && out->dynamic[k])
      return unsupported(p, ins, "its result is dynamic in a dimension other than 0");
  if (kiln_shape_elements(in) != kiln_shape_elements(out))
    return unsupported(p, ins, "the bounds hold different numbers of elements");
  kiln_id r = kiln__b_reshape(&p->b, x, out->dims, out->rank);
  if (r == KILN_NO_ID) return p->tx.err;
  if (out->rank && out->dynamic && out->dynamic[0] && set_size(p, r, 0, ins->operands[1]))
    return p->tx.err;
  replace(p, ins, r);
  return p->tx.err;
}

/* reduce: runtime-sized reduced dims masked with each input's init; kept
 * dims keep their sizes. */
static int dyn_reduce(dp *p, kiln_instr *ins) {
  const kiln_i64s *dims = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  uint32_t n = ins->noperands / 2;
  kiln_id ops[64];
  if (ins->noperands > 64 || dims == NULL) return unsupported(p, ins, "too many operands");
  memcpy(ops, ins->operands, ins->noperands * sizeof *ops);
  bool masked = false;
  for (uint32_t k = 0; k < n; k++)
    for (uint32_t i = 0; i < dims->n; i++) {
      kiln_id v = size_of(p, ins->operands[k], (uint32_t)dims->v[i]);
      if (v == KILN_NO_ID) continue;
      ops[k] = mask(p, ops[k], (uint32_t)dims->v[i], v, ins->operands[n + k]);
      masked = true;
    }
  kiln_id id = ins->id;
  if (masked) {
    id = kiln__b_clone_same(&p->b, ins, ops, ins->noperands);
    replace(p, ins, id);
    if (p->tx.err) return p->tx.err;
  }
  uint32_t j = 0;
  const kiln_shape *in = kiln__b_shape(&p->tx, ins->operands[0]);
  for (uint32_t d = 0; d < in->rank; d++) {
    bool reduced = false;
    for (uint32_t i = 0; i < dims->n; i++) reduced |= dims->v[i] == (int64_t)d;
    if (reduced) continue;
    for (uint32_t k = 0; k < n; k++) {
      kiln_id v = size_of(p, ins->operands[k], d);
      if (v == KILN_NO_ID) continue;
      if (!kiln_shape_is_array(&ins->shape))
        return unsupported(p, ins, "a variadic reduce keeps a runtime-sized dimension");
      if (set_size(p, id, j, v)) return p->tx.err;
      break;
    }
    j++;
  }
  return 0;
}

static bool listed(const kiln_i64s *l, uint32_t d) {
  for (uint32_t i = 0; l && i < l->n; i++)
    if (l->v[i] == (int64_t)d) return true;
  return false;
}

/* dot: a runtime-sized contraction reads zeros past the size on both
 * sides (padding may hold anything, NaN included); batch and free dims
 * keep their sizes in the result's order (batch, lhs free, rhs free). */
static int dyn_dot(dp *p, kiln_instr *ins) {
  const kiln_i64s *lb = kiln_instr_attr_ints(ins, KILN_ATTR_LHS_BATCH_DIMS);
  const kiln_i64s *lc = kiln_instr_attr_ints(ins, KILN_ATTR_LHS_CONTRACTING_DIMS);
  const kiln_i64s *rb = kiln_instr_attr_ints(ins, KILN_ATTR_RHS_BATCH_DIMS);
  const kiln_i64s *rc = kiln_instr_attr_ints(ins, KILN_ATTR_RHS_CONTRACTING_DIMS);
  if (ins->noperands != 2) return unsupported(p, ins, "a dot of other than two operands");
  kiln_id l = ins->operands[0], r = ins->operands[1], ops[2] = {l, r};
  bool masked = false;
  for (uint32_t i = 0; lc && rc && i < lc->n && i < rc->n; i++) {
    uint32_t a = (uint32_t)lc->v[i], b = (uint32_t)rc->v[i];
    kiln_id v = size_of(p, l, a);
    if (v == KILN_NO_ID) v = size_of(p, r, b);
    if (v == KILN_NO_ID) continue;
    ops[0] = mask(p, ops[0], a, v, kiln__b_scalar(&p->b, kiln__b_shape(&p->tx, l)->dtype, 0));
    ops[1] = mask(p, ops[1], b, v, kiln__b_scalar(&p->b, kiln__b_shape(&p->tx, r)->dtype, 0));
    masked = true;
  }
  kiln_id id = ins->id;
  if (masked) {
    id = kiln__b_clone_same(&p->b, ins, ops, 2);
    replace(p, ins, id);
    if (p->tx.err) return p->tx.err;
  }
  uint32_t j = 0;
  for (uint32_t i = 0; lb && rb && i < lb->n && i < rb->n; i++, j++) {
    kiln_id v = size_of(p, l, (uint32_t)lb->v[i]);
    if (v == KILN_NO_ID) v = size_of(p, r, (uint32_t)rb->v[i]);
    if (set_size(p, id, j, v)) return p->tx.err;
  }
  const kiln_shape *ls = kiln__b_shape(&p->tx, l), *rs = kiln__b_shape(&p->tx, r);
  for (uint32_t d = 0; d < ls->rank; d++)
    if (!listed(lb, d) && !listed(lc, d) && set_size(p, id, j++, size_of(p, l, d)))
      return p->tx.err;
  for (uint32_t d = 0; d < rs->rank; d++)
    if (!listed(rb, d) && !listed(rc, d) && set_size(p, id, j++, size_of(p, r, d)))
      return p->tx.err;
  return 0;
}

static int dyn_get_size(dp *p, kiln_instr *ins) {
  const kiln_i64s *dims = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  kiln_id x = ins->operands[0];
  const kiln_shape *s = kiln__b_shape(&p->tx, x);
  if (dims == NULL || dims->n != 1 || dims->v[0] < 0 || dims->v[0] >= s->rank)
    return unsupported(p, ins, "no dimension");
  uint32_t d = (uint32_t)dims->v[0];
  kiln_id v = size_of(p, x, d);
  if (v == KILN_NO_ID) v = s32(p, s->dims[d]);
  replace(p, ins, v);
  return p->tx.err;
}

static int dyn_set_size(dp *p, kiln_instr *ins) {
  const kiln_i64s *dims = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  kiln_id x = ins->operands[0];
  const kiln_shape *s = kiln__b_shape(&p->tx, x);
  if (dims == NULL || dims->n != 1 || dims->v[0] < 0 || dims->v[0] >= s->rank)
    return unsupported(p, ins, "no dimension");
  uint32_t d = (uint32_t)dims->v[0];
  kiln_id c = kiln__b_un(&p->b, KILN_OP_COPY, x);
  kiln_id lim[3] = {s32(p, 0), ins->operands[1], s32(p, s->dims[d])};
  kiln_id v = kiln__b_op(&p->b, KILN_OP_CLAMP, lim, 3);
  if (c == KILN_NO_ID || v == KILN_NO_ID) return p->tx.err;
  for (uint32_t k = 0; k < s->rank; k++)
    if (set_size(p, c, k, k == d ? v : size_of(p, x, k))) return p->tx.err;
  replace(p, ins, c);
  return p->tx.err;
}

/* slice, pad, reverse, concatenate: a runtime-sized dim must pass through
 * untouched (no padding, not reversed, not the joined dim), or be sliced
 * with stride 1 (its size: what the window holds of the valid elements). */
static int dyn_passthrough(dp *p, kiln_instr *ins) {
  kiln_id x = ins->operands[0];
  const kiln_shape *s = kiln__b_shape(&p->tx, x);
  const kiln_i64s *a = NULL;
  if (ins->op == KILN_OP_SLICE) a = kiln_instr_attr_ints(ins, KILN_ATTR_SLICE);
  if (ins->op == KILN_OP_PAD) a = kiln_instr_attr_ints(ins, KILN_ATTR_PADDING);
  if (ins->op == KILN_OP_REVERSE || ins->op == KILN_OP_CONCATENATE)
    a = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  for (uint32_t d = 0; d < s->rank; d++) {
    kiln_id v = KILN_NO_ID;
    for (uint32_t k = 0; k < ins->noperands && v == KILN_NO_ID; k++)
      if (ins->op == KILN_OP_CONCATENATE || k == 0) v = size_of(p, ins->operands[k], d);
    if (v == KILN_NO_ID) continue;
    bool ok = true;
    if (ins->op == KILN_OP_SLICE && a && a->n == 3 * s->rank && a->v[3 * d + 2] == 1 &&
        (a->v[3 * d] != 0 || a->v[3 * d + 1] != s->dims[d])) {
      /* [start:limit] of a runtime-sized dim: max(0, min(size, limit) - start) */
      kiln_id lim = kiln__b_bin(&p->b, KILN_OP_MINIMUM, v, s32(p, a->v[3 * d + 1]));
      kiln_id len = kiln__b_sub(&p->b, lim, s32(p, a->v[3 * d]));
      v = kiln__b_bin(&p->b, KILN_OP_MAXIMUM, len, s32(p, 0));
      if (v == KILN_NO_ID || set_size(p, ins->id, d, v)) return p->tx.err;
      continue;
    }
    if (ins->op == KILN_OP_SLICE) ok = a && a->n == 3 * s->rank && a->v[3 * d + 2] == 1;
    if (ins->op == KILN_OP_PAD)
      ok = a && a->n == 3 * s->rank && a->v[3 * d] == 0 && a->v[3 * d + 1] == 0 &&
           a->v[3 * d + 2] == 0;
    if (ins->op == KILN_OP_REVERSE || ins->op == KILN_OP_CONCATENATE) ok = !listed(a, d);
    if (!ok) return unsupported(p, ins, "it cuts, pads, reverses or joins a runtime-sized dim");
    if (set_size(p, ins->id, d, v)) return p->tx.err;
  }
  return 0;
}

static int dyn_gte(dp *p, kiln_instr *ins) {
  const kiln_instr *t = p->m->instrs[ins->operands[0]];
  int64_t i = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, -1);
  const tsizes *ts = t->id < p->cap ? p->tsz[t->id] : NULL;
  if (ts && i >= 0 && i < ts->n) {
    for (uint32_t j = 0; j < ts->ndims; j++) {
      if (ts->dims[j].leaf != (uint32_t)i) continue;
      kiln_id v = kiln__b_gte(&p->b, t->id, ts->n + j);
      if (v == KILN_NO_ID || set_size(p, ins->id, ts->dims[j].dim, v)) return p->tx.err;
    }
    return 0;
  }
  if (t->op != KILN_OP_TUPLE || i < 0 || i >= t->noperands) return 0;
  kiln_id e = t->operands[i];
  for (uint32_t d = 0; kiln_shape_is_array(&ins->shape) && d < ins->shape.rank; d++)
    if (set_size(p, ins->id, d, size_of(p, e, d))) return p->tx.err;
  return 0;
}

static bool any_operand_sized(const dp *p, const kiln_instr *ins) {
  for (uint32_t k = 0; k < ins->noperands; k++) {
    kiln_id o = ins->operands[k];
    if (has_sizes(p, o)) return true;
    const kiln_instr *t = p->m->instrs[o];
    if (t->op == KILN_OP_TUPLE)
      for (uint32_t j = 0; j < t->noperands; j++)
        if (has_sizes(p, t->operands[j])) return true;
  }
  return false;
}

static int dyn_instr(dp *p, kiln_instr *ins);

/* Every instruction of computation c, in order (the builder appends to c). */
static int rewrite_comp(dp *p, uint32_t c) {
  kiln_computation *comp = p->m->comps[c];
  uint32_t saved = p->b.comp, n = comp->ninstrs;
  int rc = 0;
  p->b.comp = c;
  p->done[c] = true;
  kiln_id *order = kiln__b_ids(&p->tx, n + 1);
  if (order == NULL) return p->tx.err;
  memcpy(order, comp->instrs, n * sizeof *order);
  for (uint32_t i = 0; i < n && rc == 0; i++) {
    kiln_instr *ins = p->m->instrs[order[i]];
    if (ins->comp == KILN_NO_ID || (order[i] < p->cap && p->drop[order[i]])) continue;
    if ((rc = kiln__tx_poll(&p->tx)) == 0) rc = dyn_instr(p, ins);
  }
  p->b.comp = saved;
  return rc;
}

/* The replaced instructions of c dropped, then c sorted. */
static int finish_comp(dp *p, uint32_t c) {
  int rc = grow(p);
  if (rc) return rc;
  bool *keep = kiln_arena_alloc(p->tx.scratch, p->m->ninstrs + 1);
  if (keep == NULL) return kiln__tx_oom(&p->tx);
  for (uint32_t i = 0; i < p->m->ninstrs; i++) keep[i] = !p->drop[i];
  kiln_computation_compact(p->m, c, keep);
  return kiln_computation_sort(p->m, c, p->tx.st);
}

/* How many instructions call computation c. */
static uint32_t callers(const dp *p, uint32_t c) {
  uint32_t k = 0;
  for (uint32_t i = 0; i < p->m->ninstrs; i++) {
    const kiln_instr *ins = p->m->instrs[i];
    if (ins->comp == KILN_NO_ID) continue;
    for (uint32_t j = 0; j < ins->ncalled; j++) k += ins->called[j] == c;
  }
  return k;
}

/* tuple(x's n elements, then vals[0..nv)) in p->b's computation. */
static kiln_id with_sizes(dp *p, kiln_id x, uint32_t n, const kiln_id *vals, uint32_t nv) {
  kiln_id *xs = kiln__b_ids(&p->tx, n + nv + 1);
  if (xs == NULL) return KILN_NO_ID;
  for (uint32_t i = 0; i < n; i++) xs[i] = kiln__b_gte(&p->b, x, i);
  memcpy(xs + n, vals, nv * sizeof *xs);
  return kiln__b_tuple(&p->b, xs, n + nv);
}

/* The sizes ts names of tuple x's elements (the bound where none). */
static kiln_id *sizes_of_elements(dp *p, kiln_id x, const tsizes *ts) {
  kiln_id *v = kiln__b_ids(&p->tx, ts->ndims + 1);
  if (v == NULL) return NULL;
  const kiln_instr *t = p->m->instrs[x];
  for (uint32_t j = 0; j < ts->ndims; j++) {
    uint32_t i = ts->dims[j].leaf, d = ts->dims[j].dim;
    kiln_id z =
        t->op == KILN_OP_TUPLE && i < t->noperands ? size_of(p, t->operands[i], d) : KILN_NO_ID;
    v[j] = z != KILN_NO_ID ? z : s32(p, p->m->instrs[x]->shape.tuple[i].dims[d]);
  }
  return v;
}

/* The "<=" dims of tuple shape s's array elements; NULL (and an error)
 * when s is no tuple of arrays, or has more than 64. */
static tsizes *tuple_dims(dp *p, const kiln_instr *ins, const kiln_shape *s) {
  if (!kiln_shape_is_tuple(s)) {
    unsupported(p, ins, "a runtime-sized value that is not in a tuple of arrays");
    return NULL;
  }
  tsizes *ts = kiln_arena_calloc(p->tx.scratch, 1, sizeof *ts);
  if (ts == NULL || (ts->dims = kiln_arena_calloc(p->tx.scratch, 64, sizeof *ts->dims)) == NULL) {
    kiln__tx_oom(&p->tx);
    return NULL;
  }
  ts->n = s->rank;
  for (uint32_t i = 0; i < s->rank; i++) {
    const kiln_shape *e = &s->tuple[i];
    if (!kiln_shape_is_array(e)) {
      if (!kiln_shape_is_dynamic(e)) continue;
      unsupported(p, ins, "a nested tuple holds a runtime-sized array");
      return NULL;
    }
    for (uint32_t d = 0; e->dynamic && d < e->rank; d++) {
      if (!e->dynamic[d]) continue;
      if (ts->ndims == 64) {
        unsupported(p, ins, "more than 64 runtime sizes in one tuple");
        return NULL;
      }
      ts->dims[ts->ndims++] = (kiln_dyn_dim){i, d};
    }
  }
  return ts;
}

/* Root of computation c extended with the sizes ts names of its elements. */
static int extend_root(dp *p, uint32_t c, const tsizes *ts) {
  kiln_computation *comp = p->m->comps[c];
  uint32_t saved = p->b.comp;
  p->b.comp = c;
  kiln_id *v = sizes_of_elements(p, comp->root, ts);
  kiln_id root = v ? with_sizes(p, comp->root, ts->n, v, ts->ndims) : KILN_NO_ID;
  p->b.comp = saved;
  if (root == KILN_NO_ID) return p->tx.err ? p->tx.err : kiln__tx_oom(&p->tx);
  comp->root = root;
  return 0;
}

/* conditional(selector, args...): each branch's tuple argument carries
 * its elements' sizes, and so does a tuple result (every branch's root). */
static int dyn_conditional(dp *p, kiln_instr *c) {
  if (!kiln_shape_is_dynamic(&c->shape) && !any_operand_sized(p, c)) return 0;
  if (c->noperands != c->ncalled + 1 || c->ncalled == 0)
    return unsupported(p, c, "no branch per argument");
  for (uint32_t k = 0; k < c->ncalled; k++)
    if (c->called[k] >= p->m->ncomps || callers(p, c->called[k]) != 1 || p->done[c->called[k]])
      return unsupported(p, c, "a branch is shared with another instruction");
  kiln_id *ops = kiln__b_ids(&p->tx, c->noperands + 1);
  if (ops == NULL) return p->tx.err;
  ops[0] = c->operands[0];
  for (uint32_t k = 0; k < c->ncalled; k++) {
    kiln_id a = c->operands[k + 1];
    kiln_instr *par = kiln_computation_param(p->m, p->m->comps[c->called[k]], 0);
    ops[k + 1] = a;
    if (par == NULL) return unsupported(p, c, "a branch without its parameter");
    if (!kiln_shape_is_dynamic(&par->shape) && !has_sizes(p, a)) {
      if (rewrite_comp(p, c->called[k])) return p->tx.err;
      continue;
    }
    tsizes *ts = tuple_dims(p, c, &par->shape);
    if (ts == NULL) return p->tx.err;
    kiln_id *v = sizes_of_elements(p, a, ts);
    ops[k + 1] = v ? with_sizes(p, a, ts->n, v, ts->ndims) : KILN_NO_ID;
    if (ops[k + 1] == KILN_NO_ID || grow(p) ||
        kiln_instr_set_shape(p->m, par, kiln__b_shape(&p->tx, ops[k + 1])))
      return p->tx.err ? p->tx.err : kiln__tx_oom(&p->tx);
    p->tsz[par->id] = ts;
    if (rewrite_comp(p, c->called[k])) return p->tx.err;
  }
  const kiln_shape *rs = &c->shape;
  tsizes *tr = NULL;
  if (kiln_shape_is_dynamic(rs) && (tr = tuple_dims(p, c, rs)) == NULL) return p->tx.err;
  for (uint32_t k = 0; k < c->ncalled; k++) {
    int rc = tr ? extend_root(p, c->called[k], tr) : 0;
    if (rc == 0) rc = finish_comp(p, c->called[k]);
    if (rc) return rc;
  }
  const kiln_shape *ns = tr ? kiln__b_shape(&p->tx, p->m->comps[c->called[0]]->root) : rs;
  kiln_instr *nc = kiln__b_make(&p->b, KILN_OP_CONDITIONAL, ns, ops, c->noperands);
  if (nc == NULL || kiln_instr_set_called(p->m, nc, c->called, c->ncalled) || grow(p))
    return p->tx.err ? p->tx.err : kiln__tx_oom(&p->tx);
  p->tsz[nc->id] = tr;
  replace(p, c, nc->id);
  return p->tx.err;
}

/* while over a tuple state with "<=" elements: the state carries their
 * sizes as extra s32[] elements through the condition and the body (whose
 * root returns the new sizes), and the loop's readers find them there. */
static int dyn_while(dp *p, kiln_instr *w) {
  const kiln_shape *s = &w->shape;
  if (!kiln_shape_is_dynamic(s) && !any_operand_sized(p, w)) return 0;
  if (!kiln_shape_is_tuple(s) || w->ncalled != 2 || w->noperands != 1)
    return unsupported(p, w, "a loop state that is not a tuple of arrays");
  uint32_t cond = w->called[0], body = w->called[1];
  if (cond >= p->m->ncomps || body >= p->m->ncomps || cond == body || callers(p, cond) != 1 ||
      callers(p, body) != 1 || p->done[cond] || p->done[body])
    return unsupported(p, w, "its condition or body is shared with another instruction");
  tsizes *ts = kiln_arena_calloc(p->tx.scratch, 1, sizeof *ts);
  if (ts == NULL || (ts->dims = kiln_arena_calloc(p->tx.scratch, 64, sizeof *ts->dims)) == NULL)
    return kiln__tx_oom(&p->tx);
  ts->n = s->rank;
  for (uint32_t i = 0; i < s->rank; i++) {
    const kiln_shape *e = &s->tuple[i];
    if (!kiln_shape_is_array(e)) {
      if (kiln_shape_is_dynamic(e)) return unsupported(p, w, "a nested tuple in its state");
      continue;
    }
    for (uint32_t d = 0; e->dynamic && d < e->rank; d++) {
      if (!e->dynamic[d]) continue;
      if (ts->ndims == 64) return unsupported(p, w, "more than 64 runtime sizes in its state");
      ts->dims[ts->ndims++] = (kiln_dyn_dim){i, d};
    }
  }
  if (ts->ndims == 0) return unsupported(p, w, "an operand has a runtime size");
  kiln_id *v = sizes_of_elements(p, w->operands[0], ts);
  kiln_id init = v ? with_sizes(p, w->operands[0], ts->n, v, ts->ndims) : KILN_NO_ID;
  if (init == KILN_NO_ID) return p->tx.err ? p->tx.err : kiln__tx_oom(&p->tx);
  const kiln_shape *ns = kiln__b_shape(&p->tx, init);
  uint32_t comps[2] = {cond, body};
  for (int k = 0; k < 2; k++) { /* their parameter takes the wider state */
    kiln_instr *par = kiln_computation_param(p->m, p->m->comps[comps[k]], 0);
    if (par == NULL || kiln_instr_set_shape(p->m, par, ns) || grow(p))
      return p->tx.err ? p->tx.err : kiln__tx_oom(&p->tx);
    p->tsz[par->id] = ts;
    int rc = rewrite_comp(p, comps[k]);
    if (rc) return rc;
  }
  kiln_computation *bc = p->m->comps[body];
  uint32_t saved = p->b.comp;
  p->b.comp = body;
  kiln_id *bv = sizes_of_elements(p, bc->root, ts);
  kiln_id broot = bv ? with_sizes(p, bc->root, ts->n, bv, ts->ndims) : KILN_NO_ID;
  p->b.comp = saved;
  if (broot == KILN_NO_ID) return p->tx.err ? p->tx.err : kiln__tx_oom(&p->tx);
  bc->root = broot;
  int rc = finish_comp(p, cond);
  if (rc == 0) rc = finish_comp(p, body);
  if (rc) return rc;
  kiln_instr *nw = kiln__b_make(&p->b, KILN_OP_WHILE, ns, &init, 1);
  if (nw == NULL || kiln_instr_set_called(p->m, nw, w->called, 2) || grow(p))
    return p->tx.err ? p->tx.err : kiln__tx_oom(&p->tx);
  p->tsz[nw->id] = ts;
  replace(p, w, nw->id);
  return p->tx.err;
}

/* One instruction, its operands already rewritten. */
static int dyn_instr(dp *p, kiln_instr *ins) {
  switch (ins->op) {
  case KILN_OP_GET_DIMENSION_SIZE: return dyn_get_size(p, ins);
  case KILN_OP_SET_DIMENSION_SIZE: return dyn_set_size(p, ins);
  case KILN_OP_DYNAMIC_RESHAPE: return dyn_dynamic_reshape(p, ins);
  case KILN_OP_PARAMETER:
  case KILN_OP_TUPLE: return 0;
  case KILN_OP_GET_TUPLE_ELEMENT: return dyn_gte(p, ins);
  case KILN_OP_WHILE: return dyn_while(p, ins);
  case KILN_OP_CONDITIONAL: return dyn_conditional(p, ins);
  default: break;
  }
  if (!any_operand_sized(p, ins)) return 0;
  if (kiln_opcode_is_elementwise_family(ins->op) && ins->op != KILN_OP_BITCAST_CONVERT)
    return dyn_elementwise(p, ins);
  switch (ins->op) {
  case KILN_OP_MAP: return dyn_elementwise(p, ins);
  case KILN_OP_BITCAST_CONVERT:
    if (ins->noperands == 1 && kiln__b_shape(&p->tx, ins->operands[0])->rank == ins->shape.rank)
      return dyn_elementwise(p, ins);
    return unsupported(p, ins, "it changes the rank");
  case KILN_OP_DYNAMIC_UPDATE_SLICE: /* the operand's sizes; indices clamp to the bounds */
    if (has_sizes(p, ins->operands[1])) return unsupported(p, ins, "the update has a runtime size");
    for (uint32_t d = 0; d < ins->shape.rank; d++)
      if (set_size(p, ins->id, d, size_of(p, ins->operands[0], d))) return p->tx.err;
    return 0;
  case KILN_OP_BROADCAST: return dyn_broadcast(p, ins);
  case KILN_OP_TRANSPOSE: return dyn_transpose(p, ins);
  case KILN_OP_RESHAPE: return dyn_reshape(p, ins);
  case KILN_OP_REDUCE: return dyn_reduce(p, ins);
  case KILN_OP_DOT: return dyn_dot(p, ins);
  case KILN_OP_SLICE:
  case KILN_OP_PAD:
  case KILN_OP_REVERSE:
  case KILN_OP_CONCATENATE: return dyn_passthrough(p, ins);
  default: return unsupported(p, ins, "an operand has a runtime size");
  }
}

static int add_size_params(dp *p, const kiln_computation *c) {
  uint32_t np = kiln_computation_nparams(p->m, c);
  kiln_shape sc;
  if (kiln_shape_make_array(p->tx.scratch, &sc, KILN_S32, NULL, 0)) return kiln__tx_oom(&p->tx);
  uint32_t next = np;
  for (uint32_t i = 0; i < np; i++) {
    kiln_instr *par = kiln_computation_param(p->m, c, i);
    if (par == NULL) return kiln__tx_fail(&p->tx, KILN_EINVAL, NULL, "parameter %u is missing", i);
    const kiln_shape *s = &par->shape;
    if (!kiln_shape_is_dynamic(s)) continue;
    if (!kiln_shape_is_array(s))
      return unsupported(p, par, "a tuple parameter holds a bounded-dynamic array");
    for (uint32_t d = 0; d < s->rank; d++) {
      if (!s->dynamic[d]) continue;
      kiln_id v = kiln__b_param(&p->b, next++, &sc, "size");
      if (v == KILN_NO_ID || set_size(p, par->id, d, v) ||
          push_dim(p, &p->pdims, &p->npdims, &p->pdcap, i, d))
        return p->tx.err ? p->tx.err : kiln__tx_oom(&p->tx);
    }
  }
  return 0;
}

/* The sizes of the result's "<=" dims, leaf by leaf (depth-first). */
static int result_sizes(dp *p, kiln_id id, const kiln_shape *s, uint32_t *leaf) {
  if (kiln_shape_is_tuple(s)) {
    const kiln_instr *t = id != KILN_NO_ID ? p->m->instrs[id] : NULL;
    bool direct = t && t->op == KILN_OP_TUPLE && t->noperands == s->rank;
    for (uint32_t i = 0; i < s->rank; i++) {
      int rc = result_sizes(p, direct ? t->operands[i] : KILN_NO_ID, &s->tuple[i], leaf);
      if (rc) return rc;
    }
    return 0;
  }
  if (!kiln_shape_is_array(s))
    return kiln__tx_fail(&p->tx, KILN_EUNIMPL, NULL,
                         "a bounded-dynamic program returns only arrays (found a token)");
  for (uint32_t d = 0; s->dynamic && d < s->rank; d++) {
    if (!s->dynamic[d]) continue;
    kiln_id v = id != KILN_NO_ID ? size_of(p, id, d) : KILN_NO_ID;
    if (v == KILN_NO_ID) v = s32(p, s->dims[d]);
    if (p->nrdims == p->rdcap) {
      kiln_id *g = kiln_realloc(p->rvals, (p->rdcap * 2 + 8) * sizeof *g);
      if (g == NULL) return kiln__tx_oom(&p->tx);
      p->rvals = g;
    }
    p->rvals[p->nrdims] = v;
    if (push_dim(p, &p->rdims, &p->nrdims, &p->rdcap, *leaf, d)) return p->tx.err;
  }
  (*leaf)++;
  return 0;
}

static void strip(kiln_shape *s) {
  s->dynamic = NULL;
  if (kiln_shape_is_tuple(s))
    for (uint32_t i = 0; i < s->rank; i++) strip(&s->tuple[i]);
}

static bool instr_needs(const kiln_instr *ins) {
  return kiln_shape_is_dynamic(&ins->shape) || ins->op == KILN_OP_GET_DIMENSION_SIZE ||
         ins->op == KILN_OP_SET_DIMENSION_SIZE || ins->op == KILN_OP_DYNAMIC_RESHAPE;
}

bool kiln__dyn_pad_needed(const kiln_module *m) {
  for (uint32_t i = 0; i < m->ninstrs; i++)
    if (m->instrs[i]->comp != KILN_NO_ID && instr_needs(m->instrs[i])) return true;
  return false;
}

/* The caller's signature, copied before the rewrite changes it. */
static int user_signature(dp *p, const kiln_computation *c, kiln_exe_dynamic *d) {
  d->nuser_params = kiln_computation_nparams(p->m, c);
  d->user_param_shapes = kiln_arena_calloc(p->out, d->nuser_params + 1, sizeof(kiln_shape));
  if (d->user_param_shapes == NULL) return kiln__tx_oom(&p->tx);
  for (uint32_t i = 0; i < d->nuser_params; i++) {
    const kiln_instr *par = kiln_computation_param(p->m, c, i);
    if (par == NULL) return kiln__tx_fail(&p->tx, KILN_EINVAL, NULL, "parameter %u is missing", i);
    if (kiln_shape_copy(p->out, &d->user_param_shapes[i], &par->shape)) return kiln__tx_oom(&p->tx);
  }
  const kiln_instr *root = kiln_computation_root(p->m, c);
  if (kiln_shape_copy(p->out, &d->user_result, &root->shape)) return kiln__tx_oom(&p->tx);
  d->nuser_results = kiln__b_leaf_count(&root->shape);
  return 0;
}

static int finish_signature(dp *p, kiln_computation *c, kiln_exe_dynamic *d) {
  uint32_t leaf = 0;
  int rc = result_sizes(p, c->root, &p->m->instrs[c->root]->shape, &leaf);
  if (rc) return rc;
  kiln_id *xs = kiln__b_ids(&p->tx, p->nrdims + 1);
  if (xs == NULL) return p->tx.err;
  xs[0] = c->root;
  memcpy(xs + 1, p->rvals, p->nrdims * sizeof *xs);
  kiln_id t = kiln__b_tuple(&p->b, xs, p->nrdims + 1);
  if (t == KILN_NO_ID) return p->tx.err;
  c->root = t;
  d->nsize_params = p->npdims;
  d->nsize_results = p->nrdims;
  d->size_params = kiln_arena_calloc(p->out, p->npdims + 1, sizeof(kiln_dyn_dim));
  d->size_results = kiln_arena_calloc(p->out, p->nrdims + 1, sizeof(kiln_dyn_dim));
  if (d->size_params == NULL || d->size_results == NULL) return kiln__tx_oom(&p->tx);
  if (p->npdims) memcpy(d->size_params, p->pdims, p->npdims * sizeof(kiln_dyn_dim));
  if (p->nrdims) memcpy(d->size_results, p->rdims, p->nrdims * sizeof(kiln_dyn_dim));
  p->m->entry_layout = NULL; /* it describes the caller's signature */
  return 0;
}

static int rewrite_entry(dp *p, kiln_exe_dynamic *d) {
  kiln_computation *c = p->m->comps[p->m->entry];
  int rc = add_size_params(p, c);
  if (rc) return rc;
  rc = rewrite_comp(p, c->id);
  if (rc == 0 && d) rc = finish_signature(p, c, d);
  if (rc == 0) rc = finish_comp(p, c->id);
  return rc;
}

int kiln__dyn_pad_split_calls(kiln_module *m, kiln_status *st) {
  if (m->entry == KILN_NO_ID) return 0;
  kiln__tx tx;
  int rc = kiln__tx_init(&tx, m, "dynamic shapes", st);
  kiln__b b = {&tx, m->entry};
  kiln_computation *c = m->comps[m->entry];
  uint32_t n = c->ninstrs;
  bool split = false;
  for (uint32_t i = 0; rc == 0 && i < n; i++) {
    kiln_instr *call = m->instrs[c->instrs[i]];
    if (call->op != KILN_OP_CALL || !kiln_shape_is_array(&call->shape)) continue;
    uint32_t users = c->root == call->id;
    for (uint32_t j = 0; j < n; j++) {
      const kiln_instr *u = m->instrs[c->instrs[j]];
      for (uint32_t k = 0; k < u->noperands; k++) users += u->operands[k] == call->id;
    }
    if (users <= 1) continue;
    /* Its readers read a copy instead: the call itself has one reader. */
    kiln_id cp = kiln__b_un(&b, KILN_OP_COPY, call->id);
    if (cp == KILN_NO_ID) break;
    kiln_replace_all_uses(m, m->entry, call->id, cp);
    m->instrs[cp]->operands[0] = call->id;
    split = true;
  }
  rc = tx.err;
  kiln__tx_fini(&tx);
  if (rc == 0 && split) rc = kiln_computation_sort(m, m->entry, st);
  return rc;
}

int kiln__dyn_pad(kiln_module *m, kiln_arena *a, kiln_exe_dynamic **out, kiln_status *st) {
  *out = NULL;
  if (!kiln__dyn_pad_needed(m)) return 0;
  dp p = {.m = m, .out = a};
  int rc = kiln__tx_init(&p.tx, m, "dynamic shapes", st);
  p.b = (kiln__b){&p.tx, m->entry};
  p.done = kiln_calloc(m->ncomps + 1, sizeof *p.done);
  if (rc == 0 && p.done == NULL) rc = kiln__tx_oom(&p.tx);
  kiln_computation *c = m->entry != KILN_NO_ID ? m->comps[m->entry] : NULL;
  kiln_exe_dynamic *d = NULL;
  if (rc == 0 && c && c->root != KILN_NO_ID) {
    bool boundary = kiln_shape_is_dynamic(&m->instrs[c->root]->shape);
    for (uint32_t i = 0; i < c->ninstrs; i++) {
      const kiln_instr *ins = m->instrs[c->instrs[i]];
      boundary |= ins->op == KILN_OP_PARAMETER && kiln_shape_is_dynamic(&ins->shape);
    }
    if (boundary && (d = kiln_arena_calloc(a, 1, sizeof *d)) == NULL) rc = kiln__tx_oom(&p.tx);
    if (rc == 0 && d) rc = user_signature(&p, c, d);
    if (rc == 0) rc = rewrite_entry(&p, d);
  }
  /* What the rewrite did not reach: computations the entry calls other
   * than loops (an inlined callee stays, unreferenced: not reached). */
  uint32_t *order = NULL, nord = 0;
  bool *reached = kiln_calloc(m->ncomps + 1, sizeof *reached);
  if (rc == 0 && (reached == NULL || kiln_module_post_order(m, &order, &nord) != 0))
    rc = kiln__tx_oom(&p.tx);
  for (uint32_t i = 0; rc == 0 && i < nord; i++)
    if (order[i] < m->ncomps) reached[order[i]] = true;
  kiln_free(order);
  for (uint32_t i = 0; rc == 0 && i < m->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[i];
    if (ins->comp != KILN_NO_ID && reached[ins->comp] && !p.done[ins->comp] && instr_needs(ins))
      rc = kiln__tx_fail(&p.tx, KILN_EUNIMPL, ins,
                         "%s %s: code generation takes bounded-dynamic shapes only in the ENTRY "
                         "computation and the loops it runs (the interp backend runs them "
                         "anywhere)",
                         kiln_opcode_name(ins->op), ins->name);
  }
  if (rc == 0)
    for (uint32_t i = 0; i < m->ninstrs; i++) strip(&m->instrs[i]->shape);
  if (rc == 0) {
    kiln_verify_options vo = {.max_nesting = KILN_VERIFY_MAX_NESTING};
    kiln_status vs;
    kiln_status_clear(&vs);
    if (kiln_module_verify(m, &vo, &vs))
      rc = kiln_status_set(st, KILN_EINTERNAL, vs.where, "after the dynamic padder: %s", vs.msg);
  }
  if (rc == 0) *out = d;
  kiln_free(reached);
  kiln_free(p.done);
  kiln_free(p.tsz);
  kiln_free(p.size);
  kiln_free(p.drop);
  kiln_free(p.pdims);
  kiln_free(p.rdims);
  kiln_free(p.rvals);
  kiln__tx_fini(&p.tx);
  return rc;
}
