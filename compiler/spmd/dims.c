/* How a tiling passes through an op, both ways: the result tiling an op
 * gets from one operand's tiling (forward), and the tiling an operand needs
 * for the op to compute a given result tiling locally (backward). The
 * propagation pass uses both to spread shardings; the partitioner uses the
 * backward direction to decide what to reshard each operand to.
 *
 * The ops covered are those whose result dims correspond to operand dims:
 * elementwise (and the annotation custom calls), broadcast, transpose,
 * reshape (dims that split or merge cleanly), reduce, dot and convolution
 * (through their loops: batch, free and contracting dims), reduce-window
 * (every dim: the partitioner exchanges halos along windowed ones), and
 * slice, pad, reverse and concatenate (along the dims they leave alone),
 * gather (the indices' batch dims, and the table's dims the result takes
 * whole) and scatter (the indexed dim, and whole window dims shared with
 * the updates). NULL means the op has no such correspondence for that
 * operand.
 */
#include <string.h>

#include "compiler/ir/sharding.h"
#include "compiler/spmd/spmd_internal.h"

static const int64_t ident[SPMD_MAX_RANK] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

static const kiln_i64s no_dims = {NULL, 0};

/* dimensions={...}; an empty list may be stored as no attribute. */
static const kiln_i64s *dims_attr(const kiln_instr *ins) {
  const kiln_i64s *d = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  return d ? d : &no_dims;
}

static const kiln_shape *op_shape(const kiln_module *m, const kiln_instr *ins, uint32_t k) {
  return &m->instrs[ins->operands[k]]->shape;
}

static bool is_annotation(const kiln_instr *ins) {
  return ins->op == KILN_OP_CUSTOM_CALL && ins->noperands == 1 &&
         kiln_custom_call_is_annotation(kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET));
}

/* Elementwise in the partitioner's sense: result element i from operand
 * elements i of operands of the result's dims. */
static bool elementwise(const kiln_module *m, const kiln_instr *ins, uint32_t k) {
  /* an all-reduce (in a partially manual region's body: over manual axes)
   * combines the same elements of its devices: split along the others as
   * its operand */
  bool ar = ins->op == KILN_OP_ALL_REDUCE && ins->noperands == 1;
  if (!(kiln_opcode_flags(ins->op) & KILN_OPF_ELEMENTWISE) && !is_annotation(ins) && !ar)
    return false;
  const kiln_shape *s = op_shape(m, ins, k);
  return kiln_shape_is_array(s) && kiln_shape_same_dims(s, &ins->shape);
}

/* The dims an op moves or cuts (they must stay whole): touched[d]. */
static bool touched_dims(const kiln_module *m, const kiln_instr *ins, bool *touched) {
  uint32_t r = ins->shape.rank;
  for (uint32_t d = 0; d < r; d++) touched[d] = false;
  switch (ins->op) {
  case KILN_OP_SLICE: {
    const kiln_i64s *sl = kiln_instr_attr_ints(ins, KILN_ATTR_SLICE);
    const kiln_shape *in = op_shape(m, ins, 0);
    if (sl == NULL || sl->n != 3 * r) return false;
    for (uint32_t d = 0; d < r; d++)
      touched[d] = sl->v[3 * d] != 0 || sl->v[3 * d + 1] != in->dims[d] || sl->v[3 * d + 2] != 1;
    return true;
  }
  case KILN_OP_PAD: {
    const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_PADDING);
    if (p == NULL || p->n != 3 * r) return false;
    for (uint32_t d = 0; d < r; d++) touched[d] = p->v[3 * d] || p->v[3 * d + 1] || p->v[3 * d + 2];
    return true;
  }
  case KILN_OP_REVERSE:
  case KILN_OP_CONCATENATE: {
    const kiln_i64s *ds = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
    if (ds == NULL) return false;
    for (uint32_t i = 0; i < ds->n; i++)
      if (ds->v[i] >= 0 && ds->v[i] < (int64_t)r) touched[ds->v[i]] = true;
    return true;
  }
  default: return false;
  }
}

/* A gather whose batch dims (the result dims that are not offset dims)
 * follow the index dims (all but index_vector_dim), in order:
 * map[j] = the index dim of result dim j, or -1 (offset dims). False for
 * gathers with operand batching dims. */
static bool gather_map(const kiln_module *m, const kiln_instr *ins, int64_t *map) {
  if (ins->op != KILN_OP_GATHER || ins->noperands != 2) return false;
  const kiln_i64s *ob = kiln_instr_attr_ints(ins, KILN_ATTR_OPERAND_BATCHING_DIMS);
  if (ob && ob->n) return false;
  const kiln_i64s *off = kiln_instr_attr_ints(ins, KILN_ATTR_OFFSET_DIMS);
  const kiln_shape *idx = op_shape(m, ins, 1);
  int64_t ivd = kiln_instr_attr_int(ins, KILN_ATTR_INDEX_VECTOR_DIM, idx->rank);
  uint32_t r = ins->shape.rank;
  bool is_off[SPMD_MAX_RANK] = {false};
  for (uint32_t i = 0; off && i < off->n; i++) {
    if (off->v[i] < 0 || off->v[i] >= (int64_t)r) return false;
    is_off[off->v[i]] = true;
  }
  int64_t next = 0;
  for (uint32_t j = 0; j < r; j++) {
    if (is_off[j]) {
      map[j] = -1;
      continue;
    }
    if (next == ivd) next++;
    if (next >= (int64_t)idx->rank) return false;
    map[j] = next++;
  }
  return true;
}

int kiln__indexed_dim(const kiln_module *m, const kiln_instr *ins, const spmd_tiling *t) {
  bool gather = ins->op == KILN_OP_GATHER;
  if ((!gather && ins->op != KILN_OP_SCATTER) || ins->noperands != (gather ? 2u : 3u) ||
      ins->ncalled > 1)
    return -1;
  const kiln_shape *os = op_shape(m, ins, 0), *is = op_shape(m, ins, 1);
  if (!kiln_shape_is_array(os) || !kiln_shape_is_array(is) || os->rank != t->rank ||
      !kiln_dtype_is_integral(is->dtype))
    return -1;
  const kiln_i64s *map = kiln_instr_attr_ints(ins, gather ? KILN_ATTR_START_INDEX_MAP
                                                          : KILN_ATTR_SCATTER_DIMS_TO_OPERAND_DIMS);
  const kiln_i64s *ob = kiln_instr_attr_ints(ins, gather ? KILN_ATTR_OPERAND_BATCHING_DIMS
                                                         : KILN_ATTR_INPUT_BATCHING_DIMS);
  if (map == NULL || map->n != 1 || (ob && ob->n)) return -1;
  int d = -1;
  for (uint32_t k = 0; k < t->rank; k++)
    if (t->tiles[k] > 1) {
      if (d >= 0) return -1;
      d = (int)k;
    }
  if (d < 0 || map->v[0] != d) return -1;
  if (gather) {
    const kiln_i64s *ss = kiln_instr_attr_ints(ins, KILN_ATTR_SLICE_SIZES);
    return ss && ss->n == os->rank && ss->v[d] == 1 ? d : -1;
  }
  /* the window along d: one element (d inserted, or a window dim of size 1) */
  const kiln_i64s *ins_d = kiln_instr_attr_ints(ins, KILN_ATTR_INSERTED_WINDOW_DIMS);
  const kiln_i64s *uw = kiln_instr_attr_ints(ins, KILN_ATTR_UPDATE_WINDOW_DIMS);
  const kiln_shape *us = op_shape(m, ins, 2);
  bool inserted[SPMD_MAX_RANK] = {false};
  for (uint32_t i = 0; ins_d && i < ins_d->n; i++)
    if (ins_d->v[i] >= 0 && ins_d->v[i] < (int64_t)os->rank) inserted[ins_d->v[i]] = true;
  if (inserted[d]) return d;
  uint32_t w = 0;
  for (uint32_t k = 0; k < (uint32_t)d; k++) w += !inserted[k];
  if (!kiln_shape_is_array(us) || uw == NULL || w >= uw->n || uw->v[w] < 0 ||
      uw->v[w] >= (int64_t)us->rank)
    return -1;
  return us->dims[uw->v[w]] == 1 ? d : -1;
}

/* Gather result dims that take a whole operand dim no index names (its
 * slice the whole dim, not in start_index_map): pass[j] = that operand
 * dim, else -1 (batch dims, collapsed or partial slices). The offset dims
 * take the operand's dims that are not collapsed, in order. False when
 * gather_map fails. */
static bool gather_pass(const kiln_module *m, const kiln_instr *ins, int64_t *pass) {
  int64_t gm[SPMD_MAX_RANK];
  if (!gather_map(m, ins, gm)) return false;
  const kiln_shape *os = op_shape(m, ins, 0);
  const kiln_i64s *ss = kiln_instr_attr_ints(ins, KILN_ATTR_SLICE_SIZES);
  const kiln_i64s *cd = kiln_instr_attr_ints(ins, KILN_ATTR_COLLAPSED_SLICE_DIMS);
  const kiln_i64s *sim = kiln_instr_attr_ints(ins, KILN_ATTR_START_INDEX_MAP);
  if (!kiln_shape_is_array(os) || os->rank > SPMD_MAX_RANK || ss == NULL || ss->n != os->rank)
    return false;
  bool collapsed[SPMD_MAX_RANK] = {false}, indexed[SPMD_MAX_RANK] = {false};
  for (uint32_t i = 0; cd && i < cd->n; i++)
    if (cd->v[i] >= 0 && cd->v[i] < (int64_t)os->rank) collapsed[cd->v[i]] = true;
  for (uint32_t i = 0; sim && i < sim->n; i++)
    if (sim->v[i] >= 0 && sim->v[i] < (int64_t)os->rank) indexed[sim->v[i]] = true;
  uint32_t d = 0;
  for (uint32_t j = 0; j < ins->shape.rank; j++) {
    pass[j] = -1;
    if (gm[j] >= 0) continue;
    while (d < os->rank && collapsed[d]) d++;
    if (d >= os->rank) return false;
    if (!indexed[d] && ss->v[d] == os->dims[d] && ins->shape.dims[j] == os->dims[d]) pass[j] = d;
    d++;
  }
  return true;
}

bool kiln__gather_plan(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                       const spmd_tiling *lt0, const spmd_tiling *lt1, const spmd_tiling *want,
                       spmd_tiling **tt, spmd_tiling **ti, spmd_tiling **tr) {
  int64_t gm[SPMD_MAX_RANK], pass[SPMD_MAX_RANK];
  const kiln_shape *out = &ins->shape;
  if (want == NULL || !kiln_shape_is_array(out) || out->rank > SPMD_MAX_RANK ||
      want->rank != out->rank || !gather_map(m, ins, gm) || !gather_pass(m, ins, pass))
    return false;
  const kiln_shape *os = op_shape(m, ins, 0), *is = op_shape(m, ins, 1);
  if (!kiln_shape_is_array(is) || is->rank > SPMD_MAX_RANK) return false;
  int64_t keep[SPMD_MAX_RANK], tmap[SPMD_MAX_RANK], imap[SPMD_MAX_RANK];
  for (uint32_t d = 0; d < os->rank; d++) tmap[d] = -1;
  for (uint32_t d = 0; d < is->rank; d++) imap[d] = -1;
  for (uint32_t j = 0; j < out->rank; j++) {
    keep[j] = gm[j] >= 0 || pass[j] >= 0 ? (int64_t)j : -1;
    if (pass[j] >= 0) tmap[pass[j]] = j;
    if (gm[j] >= 0) imap[gm[j]] = j;
  }
  spmd_tiling *r0 = lt0 ? NULL : kiln__tiling_replicated(a, os->rank, want->n);
  spmd_tiling *r1 = lt1 ? NULL : kiln__tiling_replicated(a, is->rank, want->n);
  const spmd_tiling *from0 = lt0 ? lt0 : r0, *from1 = lt1 ? lt1 : r1;
  if (from0 == NULL || from1 == NULL) return false;
  /* the result tilings the result, the table and the indices offer */
  const spmd_tiling *cand[3] = {want, kiln__spmd_fwd(a, m, ins, 0, from0),
                                kiln__spmd_fwd(a, m, ins, 1, from1)};
  int64_t tb = kiln_shape_bytes(os), ib = kiln_shape_bytes(is), ob = kiln_shape_bytes(out);
  int64_t best = -1;
  for (int c = 0; c < 3; c++) {
    if (cand[c] == NULL) continue;
    spmd_tiling *r = kiln__tiling_derive(a, cand[c], keep, out->rank);
    spmd_tiling *t = r ? kiln__tiling_derive(a, r, tmap, os->rank) : NULL;
    spmd_tiling *i = r ? kiln__tiling_derive(a, r, imap, is->rank) : NULL;
    if (t == NULL || i == NULL) return false;
    int64_t cost = kiln__reshard_cost(from0, t, tb) + kiln__reshard_cost(from1, i, ib) +
                   kiln__reshard_cost(r, want, ob);
    if (best < 0 || cost < best) {
      best = cost;
      *tt = t, *ti = i, *tr = r;
    }
  }
  return best >= 0;
}

int kiln__gather_split(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                       const spmd_tiling *t, spmd_tiling **rt) {
  int64_t pass[SPMD_MAX_RANK];
  if (t == NULL || !kiln_shape_is_array(&ins->shape) || ins->shape.rank > SPMD_MAX_RANK ||
      !gather_pass(m, ins, pass))
    return -1;
  bool fold[SPMD_MAX_RANK] = {false};
  for (uint32_t j = 0; j < ins->shape.rank; j++)
    if (pass[j] >= 0 && pass[j] < (int64_t)t->rank) fold[pass[j]] = true;
  spmd_tiling *only = kiln__tiling_fold(a, t, fold);
  int d = only ? kiln__indexed_dim(m, ins, only) : -1;
  if (d < 0) return -1;
  *rt = kiln__tiling_derive(a, t, pass, ins->shape.rank);
  return *rt ? d : -1;
}

/* For each operand dim of a scatter (one operand, no batching dims):
 * whether it is the window's whole dim and no index names it
 * (pass[d]: the updates dim of its window, else -1), and whether indices
 * name it (indexed[d]). False for the other scatters. */
static bool scatter_pass(const kiln_module *m, const kiln_instr *ins, int64_t *pass,
                         bool *indexed) {
  if (ins->op != KILN_OP_SCATTER || ins->noperands != 3 || ins->ncalled > 1) return false;
  const kiln_shape *os = op_shape(m, ins, 0), *is = op_shape(m, ins, 1), *us = op_shape(m, ins, 2);
  if (!kiln_shape_is_array(os) || !kiln_shape_is_array(is) || !kiln_shape_is_array(us) ||
      os->rank > SPMD_MAX_RANK || !kiln_dtype_is_integral(is->dtype))
    return false;
  const kiln_i64s *map = kiln_instr_attr_ints(ins, KILN_ATTR_SCATTER_DIMS_TO_OPERAND_DIMS);
  const kiln_i64s *ib = kiln_instr_attr_ints(ins, KILN_ATTR_INPUT_BATCHING_DIMS);
  const kiln_i64s *iw = kiln_instr_attr_ints(ins, KILN_ATTR_INSERTED_WINDOW_DIMS);
  const kiln_i64s *uw = kiln_instr_attr_ints(ins, KILN_ATTR_UPDATE_WINDOW_DIMS);
  if (ib && ib->n) return false;
  bool inserted[SPMD_MAX_RANK] = {false};
  for (uint32_t d = 0; d < os->rank; d++) indexed[d] = false;
  for (uint32_t i = 0; iw && i < iw->n; i++)
    if (iw->v[i] >= 0 && iw->v[i] < (int64_t)os->rank) inserted[iw->v[i]] = true;
  for (uint32_t i = 0; map && i < map->n; i++)
    if (map->v[i] >= 0 && map->v[i] < (int64_t)os->rank) indexed[map->v[i]] = true;
  uint32_t w = 0;
  for (uint32_t d = 0; d < os->rank; d++) {
    pass[d] = -1;
    if (inserted[d]) continue;
    if (uw == NULL || w >= uw->n || uw->v[w] < 0 || uw->v[w] >= (int64_t)us->rank) return false;
    int64_t u = uw->v[w++];
    if (!indexed[d] && us->dims[u] == os->dims[d]) pass[d] = u;
  }
  return true;
}

bool kiln__scatter_plan(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                        const spmd_tiling *t, int *d, spmd_tiling **tu) {
  int64_t pass[SPMD_MAX_RANK];
  bool indexed[SPMD_MAX_RANK];
  *d = -1;
  if (t == NULL || !scatter_pass(m, ins, pass, indexed)) return false;
  const kiln_shape *os = op_shape(m, ins, 0), *us = op_shape(m, ins, 2);
  if (t->rank != os->rank) return false;
  bool other = false, any = false;
  for (uint32_t k = 0; k < t->rank; k++) {
    if (t->tiles[k] <= 1) continue;
    any = true;
    if (pass[k] < 0) other = true;
  }
  if (!any) return false;
  if (other) {
    /* the indexed dim split (kiln__indexed_dim asks of it alone) and
     * passthrough dims */
    bool fold[SPMD_MAX_RANK] = {false};
    for (uint32_t k = 0; k < t->rank; k++) fold[k] = pass[k] >= 0;
    spmd_tiling *only = kiln__tiling_fold(a, t, fold);
    if (only == NULL || (*d = kiln__indexed_dim(m, ins, only)) < 0) return false;
  }
  int64_t um[SPMD_MAX_RANK];
  for (uint32_t u = 0; u < us->rank; u++) um[u] = -1;
  for (uint32_t k = 0; k < os->rank; k++)
    if (pass[k] >= 0) um[pass[k]] = k;
  *tu = kiln__tiling_derive(a, t, um, us->rank);
  return *tu != NULL;
}

bool kiln__scatter_partial(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                           const spmd_tiling *const *lt, spmd_tiling **tb, spmd_tiling **ti,
                           bool *dims) {
  int64_t pass[SPMD_MAX_RANK];
  bool indexed[SPMD_MAX_RANK];
  if (lt[2] == NULL || ins->ncalled != 1 || !scatter_pass(m, ins, pass, indexed)) return false;
  const kiln_computation *c = m->comps[ins->called[0]];
  const kiln_instr *r = c->root != KILN_NO_ID ? m->instrs[c->root] : NULL;
  if (r == NULL || r->op != KILN_OP_ADD || r->noperands != 2 ||
      m->instrs[r->operands[0]]->op != KILN_OP_PARAMETER ||
      m->instrs[r->operands[1]]->op != KILN_OP_PARAMETER || r->operands[0] == r->operands[1] ||
      ins->shape.dtype == KILN_PRED)
    return false;
  const kiln_shape *os = op_shape(m, ins, 0), *is = op_shape(m, ins, 1), *us = op_shape(m, ins, 2);
  if (us->rank > SPMD_MAX_RANK || is->rank > SPMD_MAX_RANK || lt[2]->rank != us->rank) return false;
  const kiln_i64s *uw = kiln_instr_attr_ints(ins, KILN_ATTR_UPDATE_WINDOW_DIMS);
  int64_t ivd = kiln_instr_attr_int(ins, KILN_ATTR_INDEX_VECTOR_DIM, is->rank);
  bool window[SPMD_MAX_RANK] = {false};
  for (uint32_t i = 0; uw && i < uw->n; i++)
    if (uw->v[i] >= 0 && uw->v[i] < (int64_t)us->rank) window[uw->v[i]] = true;
  /* updates scatter dims <-> the indices' dims but the index vector's */
  int64_t um[SPMD_MAX_RANK], im[SPMD_MAX_RANK];
  uint32_t next = 0;
  for (uint32_t i = 0; i < is->rank; i++) im[i] = -1;
  for (uint32_t u = 0; u < us->rank; u++) {
    um[u] = window[u] ? -1 : (int64_t)u;
    if (window[u]) continue;
    if (next == ivd) next++;
    if (next >= is->rank) return false;
    im[next++] = u;
  }
  *tb = kiln__tiling_derive(a, lt[2], um, us->rank);
  if (*tb == NULL || kiln__tiling_is_replicated(*tb)) return false;
  for (uint32_t u = 0; u < us->rank; u++) {
    dims[u] = (*tb)->tiles[u] > 1;
    if (dims[u] && us->dims[u] % (*tb)->tiles[u] != 0) return false; /* no padded ids */
  }
  *ti = kiln__tiling_derive(a, *tb, im, is->rank);
  spmd_tiling *rep = kiln__tiling_replicated(a, os->rank, lt[2]->n);
  spmd_tiling *irep = kiln__tiling_replicated(a, is->rank, lt[2]->n);
  if (*ti == NULL || rep == NULL || irep == NULL) return false;
  const spmd_tiling *l0 = lt[0] ? lt[0] : rep, *l1 = lt[1] ? lt[1] : irep;
  /* partial scatters: the operand whole, one all-reduce of it; against
   * gathering the updates and indices whole */
  int64_t ob = kiln_shape_bytes(os), ub = kiln_shape_bytes(us), ib = kiln_shape_bytes(is);
  int64_t partial = ob + kiln__reshard_cost(l0, rep, ob) + kiln__reshard_cost(l1, *ti, ib);
  int64_t gathered = kiln__reshard_cost(lt[2], kiln__tiling_replicated(a, us->rank, lt[2]->n), ub) +
                     kiln__reshard_cost(l1, irep, ib) + kiln__reshard_cost(l0, rep, ob);
  return partial < gathered;
}

/* Reshape map with the tile counts of `t` (on the source side) checked:
 * map[j] = source dim, or -1 when its count does not divide cleanly. */
static void reshape_map(const kiln_shape *from, const kiln_shape *to, const spmd_tiling *t,
                        int64_t *map) {
  int64_t lim[SPMD_MAX_RANK];
  kiln__reshape_dims(from, to, map, lim);
  for (uint32_t j = 0; j < to->rank; j++) {
    if (map[j] < 0) continue;
    int64_t c = t->tiles[map[j]];
    if (c > 1 && lim[j] >= 0 && lim[j] % c != 0) map[j] = -1;
  }
}

spmd_tiling *kiln__spmd_fwd(kiln_arena *a, const kiln_module *m, const kiln_instr *ins, uint32_t k,
                            const spmd_tiling *tk) {
  const kiln_shape *out = &ins->shape;
  if (!kiln_shape_is_array(out) || out->rank > SPMD_MAX_RANK || k >= ins->noperands) return NULL;
  const kiln_shape *in = op_shape(m, ins, k);
  if (!kiln_shape_is_array(in) || in->rank != tk->rank) return NULL;
  int64_t map[SPMD_MAX_RANK];
  if (elementwise(m, ins, k)) return kiln__tiling_derive(a, tk, ident, out->rank);
  switch (ins->op) {
  case KILN_OP_BROADCAST: {
    const kiln_i64s *ds = dims_attr(ins);
    if (k != 0 || ds->n != in->rank) return NULL;
    for (uint32_t j = 0; j < out->rank; j++) map[j] = -1;
    for (uint32_t i = 0; i < ds->n; i++)
      if (ds->v[i] >= 0 && ds->v[i] < (int64_t)out->rank) map[ds->v[i]] = i;
    return kiln__tiling_derive(a, tk, map, out->rank);
  }
  case KILN_OP_TRANSPOSE: {
    const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
    if (p == NULL || p->n != out->rank) return NULL;
    return kiln__tiling_derive(a, tk, p->v, out->rank);
  }
  case KILN_OP_RESHAPE:
    if (in->rank == 0) return NULL;
    reshape_map(in, out, tk, map);
    return kiln__tiling_derive(a, tk, map, out->rank);
  case KILN_OP_REDUCE: {
    const kiln_i64s *ds = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
    if (ins->noperands != 2 || k != 0 || ds == NULL) return NULL;
    bool red[SPMD_MAX_RANK] = {false};
    for (uint32_t i = 0; i < ds->n; i++)
      if (ds->v[i] >= 0 && ds->v[i] < (int64_t)in->rank) red[ds->v[i]] = true;
    uint32_t j = 0;
    for (uint32_t d = 0; d < in->rank; d++)
      if (!red[d]) map[j++] = d;
    if (j != out->rank) return NULL;
    return kiln__tiling_derive(a, tk, map, out->rank);
  }
  case KILN_OP_GATHER: {
    if (k == 1) return gather_map(m, ins, map) ? kiln__tiling_derive(a, tk, map, out->rank) : NULL;
    /* the table's splits of dims the result takes whole */
    if (k != 0 || !gather_pass(m, ins, map)) return NULL;
    spmd_tiling *t = kiln__tiling_derive(a, tk, map, out->rank);
    return t && !kiln__tiling_is_replicated(t) ? t : NULL;
  }
  case KILN_OP_SCATTER: { /* split along the indexed dim or whole windows: local scatters */
    int d;
    spmd_tiling *tu;
    if (k == 0)
      return kiln__scatter_plan(a, m, ins, tk, &d, &tu)
                 ? kiln__tiling_derive(a, tk, ident, out->rank)
                 : NULL;
    int64_t pass[SPMD_MAX_RANK];
    bool indexed[SPMD_MAX_RANK];
    if (k != 2 || !scatter_pass(m, ins, pass, indexed)) return NULL;
    spmd_tiling *t = kiln__tiling_derive(a, tk, pass, out->rank);
    return t && !kiln__tiling_is_replicated(t) ? t : NULL;
  }
  case KILN_OP_REDUCE_WINDOW: /* windows along split dims: halo exchange */
    if (ins->noperands != 2 || k != 0 || in->rank != out->rank) return NULL;
    return kiln__tiling_derive(a, tk, ident, out->rank);
  case KILN_OP_DOT:
  case KILN_OP_CONVOLUTION: {
    spmd_loop loops[SPMD_MAX_RANK * 2];
    uint32_t nl;
    if (!kiln__contraction_loops(m, ins, loops, &nl) || nl > SPMD_MAX_RANK || k > 1) return NULL;
    /* windows pass the input's splits to the result (halo exchange),
     * never the kernel's */
    for (uint32_t j = 0; j < nl; j++)
      map[j] = loops[j].fixed && k ? -1 : k ? loops[j].r : loops[j].l;
    spmd_tiling *it = kiln__tiling_derive(a, tk, map, nl);
    if (it == NULL) return NULL;
    int64_t omap[SPMD_MAX_RANK];
    for (uint32_t j = 0; j < out->rank; j++) omap[j] = -1;
    for (uint32_t j = 0; j < nl; j++)
      if (loops[j].o >= 0) omap[loops[j].o] = j;
    return kiln__tiling_derive(a, it, omap, out->rank);
  }
  default: break;
  }
  bool touched[SPMD_MAX_RANK];
  if (in->rank == out->rank && touched_dims(m, ins, touched))
    return kiln__tiling_fold(a, tk, touched);
  return NULL;
}

spmd_tiling *kiln__spmd_bwd(kiln_arena *a, const kiln_module *m, const kiln_instr *ins, uint32_t k,
                            const spmd_tiling *tout) {
  const kiln_shape *out = &ins->shape;
  if (!kiln_shape_is_array(out) || k >= ins->noperands || tout->rank != out->rank) return NULL;
  const kiln_shape *in = op_shape(m, ins, k);
  if (!kiln_shape_is_array(in) || in->rank > SPMD_MAX_RANK) return NULL;
  int64_t map[SPMD_MAX_RANK];
  if (elementwise(m, ins, k)) return kiln__tiling_derive(a, tout, ident, in->rank);
  switch (ins->op) {
  case KILN_OP_BROADCAST: {
    const kiln_i64s *ds = dims_attr(ins);
    if (k != 0 || ds->n != in->rank) return NULL;
    return kiln__tiling_derive(a, tout, ds->v, in->rank);
  }
  case KILN_OP_TRANSPOSE: {
    const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
    if (p == NULL || p->n != in->rank) return NULL;
    for (uint32_t j = 0; j < p->n; j++) map[p->v[j]] = j;
    return kiln__tiling_derive(a, tout, map, in->rank);
  }
  case KILN_OP_RESHAPE:
    if (out->rank == 0) return NULL;
    reshape_map(out, in, tout, map);
    return kiln__tiling_derive(a, tout, map, in->rank);
  case KILN_OP_REDUCE: {
    const kiln_i64s *ds = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
    if (ins->noperands != 2 || k != 0 || ds == NULL) return NULL;
    bool red[SPMD_MAX_RANK] = {false};
    for (uint32_t i = 0; i < ds->n; i++)
      if (ds->v[i] >= 0 && ds->v[i] < (int64_t)in->rank) red[ds->v[i]] = true;
    int64_t j = 0;
    for (uint32_t d = 0; d < in->rank; d++) map[d] = red[d] ? -1 : j++;
    return kiln__tiling_derive(a, tout, map, in->rank);
  }
  case KILN_OP_REDUCE_WINDOW:
    if (ins->noperands != 2 || k != 0 || in->rank != out->rank) return NULL;
    return kiln__tiling_derive(a, tout, ident, in->rank);
  case KILN_OP_SCATTER: {
    int d;
    spmd_tiling *tu;
    if ((k != 0 && k != 2) || !kiln__scatter_plan(a, m, ins, tout, &d, &tu)) return NULL;
    return k == 0 ? kiln__tiling_derive(a, tout, ident, in->rank) : tu;
  }
  case KILN_OP_GATHER: {
    /* The table split along the dims the result takes whole (else whole),
     * the indices as the result's batch dims. */
    int64_t gm[SPMD_MAX_RANK];
    if (!gather_map(m, ins, gm)) return NULL;
    for (uint32_t d = 0; d < in->rank; d++) map[d] = -1;
    if (k == 0) {
      if (!gather_pass(m, ins, gm)) return kiln__tiling_replicated(a, in->rank, tout->n);
      for (uint32_t j = 0; j < out->rank; j++)
        if (gm[j] >= 0) map[gm[j]] = j;
      return kiln__tiling_derive(a, tout, map, in->rank);
    }
    for (uint32_t j = 0; j < out->rank; j++)
      if (gm[j] >= 0) map[gm[j]] = j;
    return kiln__tiling_derive(a, tout, map, in->rank);
  }
  case KILN_OP_DOT:
  case KILN_OP_CONVOLUTION: {
    spmd_loop loops[SPMD_MAX_RANK * 2];
    uint32_t nl;
    if (!kiln__contraction_loops(m, ins, loops, &nl) || nl > SPMD_MAX_RANK || k > 1) return NULL;
    for (uint32_t j = 0; j < nl; j++) map[j] = loops[j].fixed && k ? -1 : loops[j].o;
    spmd_tiling *it = kiln__tiling_derive(a, tout, map, nl);
    if (it == NULL) return NULL;
    int64_t imap[SPMD_MAX_RANK];
    for (uint32_t d = 0; d < in->rank; d++) imap[d] = -1;
    for (uint32_t j = 0; j < nl; j++) {
      int64_t d = k ? loops[j].r : loops[j].l;
      if (d >= 0) imap[d] = j;
    }
    return kiln__tiling_derive(a, it, imap, in->rank);
  }
  default: break;
  }
  bool touched[SPMD_MAX_RANK];
  if (in->rank == out->rank && touched_dims(m, ins, touched))
    return kiln__tiling_fold(a, tout, touched);
  return NULL;
}
