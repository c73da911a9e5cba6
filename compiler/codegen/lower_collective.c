/* Lowering collectives to collective steps (KILN_STEP_COLLECTIVE).
 *
 * A module for replicas x partitions devices compiles once; each step
 * carries its replica groups resolved for every device of that mesh
 * (sharding.h's group function), so a rank only looks its own row up at
 * run time. One step per operand (a tuple all-reduce becomes one
 * rendezvous per leaf; the tuple all-to-all, whose operands are the
 * members' blocks, is one step). The -start forms run the collective
 * (their result is element 1 of the start's tuple, element 0 the operands'
 * copies); the -done forms copy that element out. replica-id and
 * partition-id are steps on a mesh of more than one device (kernels
 * return 0 on one). The reduction of all-reduce and reduce-scatter must be
 * a binary add, multiply, maximum, minimum, and or or of its parameters.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/lower_internal.h"
#include "compiler/ir/sharding.h"

static int64_t mesh_replicas(const kiln_module *m) {
  return m->replica_count > 1 ? m->replica_count : 1;
}
static int64_t mesh_partitions(const kiln_module *m) {
  return m->num_partitions > 1 ? m->num_partitions : 1;
}

static kiln_opcode sync_op(kiln_opcode op) {
  switch (op) {
  case KILN_OP_ALL_REDUCE_START: return KILN_OP_ALL_REDUCE;
  case KILN_OP_ALL_GATHER_START: return KILN_OP_ALL_GATHER;
  case KILN_OP_COLLECTIVE_PERMUTE_START: return KILN_OP_COLLECTIVE_PERMUTE;
  default: return op;
  }
}

bool kiln__lower_is_collective(const kiln_module *m, const kiln_instr *ins) {
  switch (ins->op) {
  case KILN_OP_REPLICA_ID:
  case KILN_OP_PARTITION_ID: return mesh_replicas(m) * mesh_partitions(m) > 1;
  case KILN_OP_ALL_REDUCE:
  case KILN_OP_ALL_REDUCE_START:
  case KILN_OP_ALL_REDUCE_DONE:
  case KILN_OP_ALL_GATHER:
  case KILN_OP_ALL_GATHER_START:
  case KILN_OP_ALL_GATHER_DONE:
  case KILN_OP_REDUCE_SCATTER:
  case KILN_OP_ALL_TO_ALL:
  case KILN_OP_COLLECTIVE_PERMUTE:
  case KILN_OP_COLLECTIVE_PERMUTE_START:
  case KILN_OP_COLLECTIVE_PERMUTE_DONE:
  case KILN_OP_COLLECTIVE_BROADCAST: return true;
  default: return false;
  }
}

static int oom(kiln__lctx *c) {
  return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
}

/* Element types the cpu backend's collective steps reduce: those its
 * kernels compute on. */
static bool reducible(kiln_dtype t) { return kiln__emit_dtype_ok(t); }

/* The reduction opcode of ins's to_apply: root = op(p0, p1). */
static int reduction_of(kiln__lctx *c, const kiln_instr *ins, kiln_dtype dt, uint32_t *out) {
  const kiln_module *m = c->m;
  if (ins->ncalled < 1 || ins->called[0] >= m->ncomps)
    return kiln__lower_fail(c, ins, KILN_EINVAL, "needs a reduction computation");
  const kiln_computation *cp = m->comps[ins->called[0]];
  const kiln_instr *root = kiln_computation_root(m, cp);
  kiln_opcode op = root ? root->op : KILN_OP_INVALID;
  bool known = op == KILN_OP_ADD || op == KILN_OP_MULTIPLY || op == KILN_OP_MAXIMUM ||
               op == KILN_OP_MINIMUM || op == KILN_OP_AND || op == KILN_OP_OR;
  bool params = false;
  if (known && root->noperands == 2) {
    const kiln_instr *a = m->instrs[root->operands[0]], *b = m->instrs[root->operands[1]];
    params = a->op == KILN_OP_PARAMETER && b->op == KILN_OP_PARAMETER &&
             a->param_number != b->param_number && root->shape.dtype == dt;
  }
  if (!known || !params)
    return kiln__lower_fail(c, ins, KILN_EUNIMPL,
                            "the %s backend reduces only with add, multiply, maximum, minimum, "
                            "and or or of the two parameters",
                            c->g->mod.target->name);
  if (kiln_dtype_is_float(dt) && (op == KILN_OP_AND || op == KILN_OP_OR))
    return kiln__lower_fail(c, ins, KILN_EINVAL, "and/or of floating-point values");
  if (!reducible(dt))
    return kiln__lower_fail(c, ins, KILN_EUNIMPL, "the %s backend cannot reduce %s",
                            c->g->mod.target->name, kiln_dtype_name(dt));
  *out = op;
  return 0;
}

/* Rows of shape s more major than dim d in its physical layout; 0 when r's
 * layout orders the dims differently. */
static uint64_t rows_above(const kiln_shape *s, const kiln_shape *r, int64_t d) {
  int64_t a[KILN__EMIT_MAXR], b[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(s, a);
  kiln_shape_minor_to_major(r, b);
  if (memcmp(a, b, s->rank * sizeof *a) != 0) return 0;
  uint64_t rows = 1;
  uint32_t p = 0;
  while (p < s->rank && a[p] != d) p++;
  for (uint32_t q = p + 1; q < s->rank; q++) rows *= (uint64_t)s->dims[a[q]];
  return rows;
}

/* The groups of ins for every device into k (members, source). */
static int resolve_groups(kiln__lctx *c, const kiln_instr *ins, kiln_coll *k) {
  int64_t R = mesh_replicas(c->m), P = mesh_partitions(c->m), ndev = R * P;
  k->replicas = (uint32_t)R;
  k->partitions = (uint32_t)P;
  kiln_arena *a = c->e->arena;
  bool permute = sync_op(ins->op) == KILN_OP_COLLECTIVE_PERMUTE;
  const kiln_i64s *pairs = kiln_instr_attr_ints(ins, KILN_ATTR_SOURCE_TARGET_PAIRS);
  if (permute && (k->source = kiln_arena_calloc(a, (size_t)ndev, sizeof *k->source)) == NULL)
    return oom(c);
  for (int64_t d = 0; d < ndev; d++) {
    kiln_collective_group g;
    int rc = kiln_collective_group_of(ins, R, P, d, c->scratch, &g, c->st);
    if (rc) return rc;
    if (d == 0) {
      k->gsize = (uint32_t)g.n;
      k->members = kiln_arena_calloc(a, (size_t)(ndev * g.n), sizeof *k->members);
      if (k->members == NULL) return oom(c);
    } else if (g.n != (int64_t)k->gsize) {
      return kiln__lower_fail(c, ins, KILN_EUNIMPL, "groups of different sizes");
    }
    for (int64_t j = 0; j < g.n; j++) k->members[d * g.n + j] = (uint32_t)g.members[j];
    if (!permute) continue;
    k->source[d] = -1;
    int64_t me = g.ids[g.rank];
    for (uint32_t i = 0; pairs && i + 1 < pairs->n; i += 2) {
      if (pairs->v[i + 1] != me) continue;
      for (int64_t j = 0; j < g.n; j++)
        if (g.ids[j] == pairs->v[i]) k->source[d] = (int32_t)g.members[j];
      if (k->source[d] < 0)
        return kiln__lower_fail(c, ins, KILN_EINVAL,
                                "source %lld of source_target_pairs is not a device of the mesh",
                                (long long)pairs->v[i]);
    }
  }
  return 0;
}

/* The array leaves (shapes and slots) of value `id` from leaf `first` on. */
static const uint32_t *leaves_of(kiln__lctx *c, kiln_id id, uint32_t *n) {
  return kiln_buffer_leaves(c->ba, id, n);
}

static int emit(kiln__lctx *c, uint32_t prog, const kiln_coll *k, const uint32_t *args,
                uint32_t nargs) {
  kiln_step s = {.kind = KILN_STEP_COLLECTIVE, .nargs = nargs, .coll = *k};
  s.args = kiln_arena_memdup(c->e->arena, args, nargs * sizeof *args);
  s.coll.outer =
      kiln_arena_memdup(c->e->arena, k->outer, (k->nops ? k->nops : 1) * sizeof *k->outer);
  if (s.args == NULL || s.coll.outer == NULL) return oom(c);
  return kiln__lower_step(c, prog, &s);
}

static int id_step(kiln__lctx *c, uint32_t prog, const kiln_instr *ins) {
  kiln_coll k = {.op = ins->op};
  int64_t ndev = mesh_replicas(c->m) * mesh_partitions(c->m);
  k.replicas = (uint32_t)mesh_replicas(c->m);
  k.partitions = (uint32_t)mesh_partitions(c->m);
  k.gsize = 1;
  k.members = kiln_arena_calloc(c->e->arena, (size_t)ndev, sizeof *k.members);
  if (k.members == NULL) return oom(c);
  for (int64_t d = 0; d < ndev; d++) k.members[d] = (uint32_t)d;
  uint32_t n;
  const uint32_t *res = leaves_of(c, ins->id, &n);
  if (n != 1 || ins->shape.dtype != KILN_U32)
    return kiln__lower_fail(c, ins, KILN_EINVAL, "result must be u32[]");
  uint64_t none = 0;
  k.outer = &none;
  return emit(c, prog, &k, res, 1);
}

/* -done: element 1 of a start's tuple (or the whole value when the start
 * is not such a tuple) copied into the done's slots. */
static int done_copies(kiln__lctx *c, uint32_t prog, const kiln_instr *ins) {
  const kiln_instr *st = c->m->instrs[ins->operands[0]];
  uint32_t ns, nd, first = 0;
  const uint32_t *src = leaves_of(c, st->id, &ns);
  const uint32_t *dst = leaves_of(c, ins->id, &nd);
  const kiln_shape *ss = &st->shape;
  if (kiln_shape_is_tuple(ss) && ss->rank >= 2 && !kiln_shape_equal(ss, &ins->shape, true))
    first = kiln__lower_leaf_shapes(&ss->tuple[0], NULL, 0);
  const kiln_shape *ls[KILN__EMIT_MAXR * 4];
  uint32_t nl = kiln__lower_leaf_shapes(&ins->shape, ls, KILN__EMIT_MAXR * 4);
  if (first + nd > ns || nl != nd || nd > KILN__EMIT_MAXR * 4)
    return kiln__lower_fail(c, ins, KILN_EINVAL, "does not match its start's result");
  for (uint32_t i = 0; i < nd; i++) {
    int64_t b = kiln_shape_bytes(ls[i]);
    int rc = kiln__lower_copy(c, prog, dst[i], src[first + i], (uint64_t)(b > 0 ? b : 0));
    if (rc) return rc;
  }
  return 0;
}

int kiln__lower_collective(kiln__lctx *c, uint32_t prog, const kiln_instr *ins) {
  switch (ins->op) {
  case KILN_OP_REPLICA_ID:
  case KILN_OP_PARTITION_ID: return id_step(c, prog, ins);
  case KILN_OP_ALL_REDUCE_DONE:
  case KILN_OP_ALL_GATHER_DONE:
  case KILN_OP_COLLECTIVE_PERMUTE_DONE: return done_copies(c, prog, ins);
  default: break;
  }
  kiln_opcode op = sync_op(ins->op);
  uint32_t nops = ins->noperands, nres, nin_total = 0;
  if (nops == 0 || nops > KILN__EMIT_MAXR * 4)
    return kiln__lower_fail(c, ins, KILN_EUNIMPL, "takes 1 to %d operands", KILN__EMIT_MAXR * 4);
  const uint32_t *res = leaves_of(c, ins->id, &nres);
  /* The result leaves: all of them, or element 1 of a start's tuple (whose
   * element 0 receives the operands). */
  const kiln_shape *rs = &ins->shape;
  uint32_t first = 0;
  bool start = op != ins->op && kiln_shape_is_tuple(rs) && rs->rank >= 2 &&
               ins->op != KILN_OP_ALL_REDUCE_START;
  if (start) {
    first = kiln__lower_leaf_shapes(&rs->tuple[0], NULL, 0);
    rs = &rs->tuple[1];
  }
  const kiln_shape *ls[KILN__EMIT_MAXR * 4];
  uint32_t nl = kiln__lower_leaf_shapes(rs, ls, KILN__EMIT_MAXR * 4);
  if (nl != nops || first + nl > nres)
    return kiln__lower_fail(c, ins, KILN_EUNIMPL, "needs one array result per operand");
  uint32_t in[KILN__EMIT_MAXR * 4];
  const kiln_shape *is[KILN__EMIT_MAXR * 4];
  for (uint32_t i = 0; i < nops; i++) {
    const kiln_instr *o = c->m->instrs[ins->operands[i]];
    uint32_t n;
    const uint32_t *sl = leaves_of(c, o->id, &n);
    if (n != 1 || !kiln_shape_is_array(&o->shape) || !kiln_shape_is_array(ls[i]) ||
        o->shape.dtype != ls[i]->dtype)
      return kiln__lower_fail(c, ins, KILN_EUNIMPL, "operands must be arrays of the result's type");
    in[i] = sl[0];
    is[i] = &o->shape;
    nin_total++;
  }
  /* Element 0 of a start: copies of the operands. */
  for (uint32_t i = 0; start && i < first && i < nops; i++) {
    int64_t b = kiln_shape_bytes(is[i]);
    int rc = kiln__lower_copy(c, prog, res[i], in[i], (uint64_t)(b > 0 ? b : 0));
    if (rc) return rc;
  }
  kiln_coll k = {.op = op};
  int rc = resolve_groups(c, ins, &k);
  if (rc) return rc;
  const kiln_i64s *dims = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  bool blocked = op == KILN_OP_ALL_GATHER || op == KILN_OP_REDUCE_SCATTER ||
                 (op == KILN_OP_ALL_TO_ALL && dims != NULL);
  if (op == KILN_OP_ALL_TO_ALL && dims == NULL) { /* the tuple form: one step */
    uint32_t args[KILN__EMIT_MAXR * 8];
    uint64_t rows[KILN__EMIT_MAXR * 4] = {0};
    for (uint32_t i = 0; i < nops; i++) {
      args[i] = in[i];
      args[nops + i] = res[first + i];
    }
    k.dtype = is[0]->dtype;
    k.nops = nops;
    k.outer = rows;
    if (nops != k.gsize)
      return kiln__lower_fail(c, ins, KILN_EINVAL,
                              "without dimensions it needs one operand per member");
    return emit(c, prog, &k, args, 2 * nops);
  }
  for (uint32_t i = 0; i < nops; i++) {
    uint64_t rows = 1;
    if (blocked) {
      if (dims == NULL || dims->n != 1 || dims->v[0] < 0 || dims->v[0] >= (int64_t)is[i]->rank ||
          ls[i]->rank != is[i]->rank)
        return kiln__lower_fail(c, ins, KILN_EINVAL,
                                "needs dimensions={d} naming one operand dimension");
      rows = rows_above(is[i], ls[i], dims->v[0]);
      if (rows == 0)
        return kiln__lower_fail(c, ins, KILN_EUNIMPL, "operand and result layouts differ");
    }
    k.dtype = is[i]->dtype;
    k.nops = 1;
    k.outer = &rows;
    k.reduce = 0;
    if ((op == KILN_OP_ALL_REDUCE || op == KILN_OP_REDUCE_SCATTER) &&
        (rc = reduction_of(c, ins, is[i]->dtype, &k.reduce)))
      return rc;
    uint32_t args[2] = {in[i], res[first + i]};
    if ((rc = emit(c, prog, &k, args, 2))) return rc;
  }
  (void)nin_total;
  return 0;
}
