/* Collectives across the interpreter's device mesh (interp_mesh.c): each
 * device works out its group from the replica groups as XLA reads them
 * (sharding.h), meets the members at the rendezvous, and computes its own
 * result from their operands, written to be obviously right:
 *
 * - all-reduce: element i is to_apply folded over the members' element i
 *   in rank order (the same order on every member, so results agree);
 * - all-gather: the members' operands concatenated along `dimensions`;
 * - reduce-scatter: the all-reduce, of which this rank keeps block `rank`
 *   along `dimensions`;
 * - all-to-all: with `dimensions`, block j of the result is block `rank` of
 *   member j's operand; without, result element j is member j's operand
 *   number `rank`;
 * - collective-permute: the operand of the member whose pair targets this
 *   device, zeros when none does;
 * - collective-broadcast: rank 0's operand.
 * The -start forms compute at the start (the rendezvous is synchronous);
 * -done only unpacks.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/eval/interp_internal.h"
#include "compiler/ir/sharding.h"

typedef struct coll {
  kiln__interp_ctx *c;
  const kiln_instr *ins;
  const kiln_collective_group *g;
  const kiln_literal *const *const *peer; /* peer[j][k]: member j's operand k */
  uint32_t nops;
} coll;

static int fail(const coll *x, int code, const char *what) {
  return kiln__interp_fail(x->c, x->ins, code, "%s %s: %s", kiln_opcode_name(x->ins->op),
                           x->ins->name, what);
}

/* Result element k of a result that is one array (k == 0) or a tuple. */
static kiln_literal *res_of(kiln_literal *r, uint32_t k, uint32_t nops) {
  if (nops == 1 && !kiln_shape_is_tuple(&r->shape)) return r;
  return kiln_shape_is_tuple(&r->shape) && k < r->shape.rank ? r->elems[k] : NULL;
}

/* Every member's operand k has the dims of this device's. */
static int check_peers(const coll *x, uint32_t k) {
  const kiln_literal *mine = x->peer[x->g->rank][k];
  if (!kiln_shape_is_array(&mine->shape)) return fail(x, KILN_EUNIMPL, "operands must be arrays");
  for (int64_t j = 0; j < x->g->n; j++) {
    const kiln_literal *o = x->peer[j][k];
    if (o->shape.dtype != mine->shape.dtype || !kiln__interp_same_dims(&o->shape, &mine->shape))
      return fail(x, KILN_EINVAL, "the members' operands differ in shape");
  }
  return 0;
}

static int reduce_dim(const coll *x, int64_t *d, const kiln_literal *op) {
  const kiln_i64s *dims = kiln_instr_attr_ints(x->ins, KILN_ATTR_DIMENSIONS);
  if (dims == NULL || dims->n != 1 || dims->v[0] < 0 || dims->v[0] >= (int64_t)op->shape.rank)
    return fail(x, KILN_EINVAL, "needs dimensions={d} naming one operand dimension");
  *d = dims->v[0];
  return 0;
}

/* Folds to_apply over the members at source element si into dst[di]. */
static int fold(const coll *x, uint32_t comp, uint32_t k, int64_t si, kiln_literal *dst,
                int64_t di) {
  kiln__interp_scalar acc = kiln__interp_scalar_load(x->peer[0][k], si);
  for (int64_t j = 1; j < x->g->n; j++) {
    kiln__interp_scalar a[2] = {acc, kiln__interp_scalar_load(x->peer[j][k], si)};
    int rc = kiln__interp_call_scalar(x->c, x->ins, comp, a, 2, &acc, 1);
    if (rc) return rc;
  }
  kiln__interp_scalar_store(dst, di, acc);
  return 0;
}

static int all_reduce(const coll *x, kiln_literal *r) {
  uint32_t comp;
  int rc = kiln__interp_called(x->c, x->ins, 0, &comp);
  for (uint32_t k = 0; k < x->nops && rc == 0; k++) {
    kiln_literal *dst = res_of(r, k, x->nops);
    if (dst == NULL) return fail(x, KILN_EINVAL, "result does not match the operands");
    if ((rc = check_peers(x, k))) return rc;
    int64_t n = kiln_shape_elements(&dst->shape);
    if (n != kiln_shape_elements(&x->peer[0][k]->shape))
      return fail(x, KILN_EINVAL, "result and operand differ in size");
    for (int64_t i = 0; i < n && rc == 0; i++) rc = fold(x, comp, k, i, dst, i);
  }
  return rc;
}

/* For every element of dst (row-major index idx), calls back with the
 * source member and element; dst dim d is split into blocks of `chunk`. */
typedef int (*block_fn)(const coll *x, uint32_t k, int64_t block, int64_t src_i, kiln_literal *dst,
                        int64_t di, void *arg);

static int for_blocks(const coll *x, uint32_t k, kiln_literal *dst, const kiln_literal *src,
                      int64_t d, int64_t dst_chunk, int64_t src_off, block_fn fn, void *arg) {
  uint32_t rank = dst->shape.rank;
  if (rank != src->shape.rank || rank > KILN_INTERP_MAX_RANK)
    return fail(x, KILN_EINVAL, "result and operand ranks differ");
  int64_t idx[KILN_INTERP_MAX_RANK] = {0}, sstr[KILN_INTERP_MAX_RANK];
  kiln__interp_strides(&src->shape, sstr);
  int64_t n = kiln_shape_elements(&dst->shape);
  for (int64_t di = 0; di < n; di++) {
    int64_t block = idx[d] / dst_chunk, si = 0;
    for (uint32_t e = 0; e < rank; e++) {
      int64_t v = e == (uint32_t)d ? src_off + idx[e] % dst_chunk : idx[e];
      if (v < 0 || v >= src->shape.dims[e]) return fail(x, KILN_EINVAL, "block out of range");
      si += v * sstr[e];
    }
    int rc = fn(x, k, block, si, dst, di, arg);
    if (rc) return rc;
    kiln__interp_next_index(idx, dst->shape.dims, rank);
  }
  return 0;
}

static int copy_from_block(const coll *x, uint32_t k, int64_t block, int64_t si, kiln_literal *dst,
                           int64_t di, void *arg) {
  (void)arg;
  if (block >= x->g->n) return fail(x, KILN_EINVAL, "more blocks than members");
  kiln__interp_copy_elem(dst, di, x->peer[block][k], si);
  return 0;
}

static int fold_block(const coll *x, uint32_t k, int64_t block, int64_t si, kiln_literal *dst,
                      int64_t di, void *arg) {
  (void)block;
  return fold(x, *(uint32_t *)arg, k, si, dst, di);
}

/* all-gather (mode 0), reduce-scatter (1) and all-to-all with a dim (2). */
static int blocked(const coll *x, kiln_literal *r, int mode) {
  int64_t n = x->g->n;
  uint32_t comp = 0;
  int rc = mode == 1 ? kiln__interp_called(x->c, x->ins, 0, &comp) : 0;
  for (uint32_t k = 0; k < x->nops && rc == 0; k++) {
    kiln_literal *dst = res_of(r, k, x->nops);
    if (dst == NULL) return fail(x, KILN_EINVAL, "result does not match the operands");
    if ((rc = check_peers(x, k))) return rc;
    const kiln_literal *src = x->peer[x->g->rank][k];
    int64_t d = 0;
    if ((rc = reduce_dim(x, &d, src))) return rc;
    if (dst->shape.rank != src->shape.rank) return fail(x, KILN_EINVAL, "result rank differs");
    int64_t sd = src->shape.dims[d], rd = dst->shape.dims[d];
    if (mode == 0) {
      if (rd != sd * n) return fail(x, KILN_EINVAL, "result dimension is not members x operand's");
      rc = for_blocks(x, k, dst, src, d, sd, 0, copy_from_block, NULL);
    } else if (mode == 1) {
      if (rd * n != sd) return fail(x, KILN_EINVAL, "operand dimension is not members x result's");
      rc = for_blocks(x, k, dst, src, d, rd, x->g->rank * rd, fold_block, &comp);
    } else {
      if (sd % n || rd != sd)
        return fail(x, KILN_EINVAL, "split dimension does not divide by members");
      rc = for_blocks(x, k, dst, src, d, sd / n, x->g->rank * (sd / n), copy_from_block, NULL);
    }
  }
  return rc;
}

static int all_to_all(const coll *x, kiln_literal *r) {
  if (kiln_instr_attr_ints(x->ins, KILN_ATTR_DIMENSIONS)) return blocked(x, r, 2);
  /* Tuple form: one operand per member. */
  if ((int64_t)x->nops != x->g->n)
    return fail(x, KILN_EINVAL, "without dimensions it needs one operand per group member");
  for (int64_t j = 0; j < x->g->n; j++) {
    kiln_literal *dst = res_of(r, (uint32_t)j, x->nops);
    if (dst == NULL) return fail(x, KILN_EINVAL, "result does not match the operands");
    int rc = kiln__interp_lit_copy_into(x->c, x->ins, r->own, dst, x->peer[j][x->g->rank]);
    if (rc) return rc;
  }
  return 0;
}

static int permute(const coll *x, kiln_literal *r) {
  if (x->nops != 1) return fail(x, KILN_EUNIMPL, "takes one operand on a mesh");
  const kiln_i64s *p = kiln_instr_attr_ints(x->ins, KILN_ATTR_SOURCE_TARGET_PAIRS);
  int64_t me = x->g->ids[x->g->rank];
  for (uint32_t i = 0; p && i + 1 < p->n; i += 2) {
    for (uint32_t j = 0; j < i; j += 2)
      if (p->v[j] == p->v[i] || p->v[j + 1] == p->v[i + 1])
        return fail(x, KILN_EINVAL, "source_target_pairs repeat a source or a target");
    if (p->v[i + 1] != me) continue;
    for (int64_t m = 0; m < x->g->n; m++)
      if (x->g->ids[m] == p->v[i])
        return kiln__interp_lit_copy_into(x->c, x->ins, r->own, r, x->peer[m][0]);
    return fail(x, KILN_EINVAL, "a source of source_target_pairs is not a device of the mesh");
  }
  return 0; /* nobody sends here: zeros */
}

static int broadcast(const coll *x, kiln_literal *r) {
  for (uint32_t k = 0; k < x->nops; k++) {
    kiln_literal *dst = res_of(r, k, x->nops);
    if (dst == NULL) return fail(x, KILN_EINVAL, "result does not match the operands");
    int rc = kiln__interp_lit_copy_into(x->c, x->ins, r->own, dst, x->peer[0][k]);
    if (rc) return rc;
  }
  return 0;
}

static int compute(const coll *x, kiln_literal *r) {
  switch (x->ins->op) {
  case KILN_OP_ALL_REDUCE:
  case KILN_OP_ALL_REDUCE_START: return all_reduce(x, r);
  case KILN_OP_ALL_GATHER:
  case KILN_OP_ALL_GATHER_START: return blocked(x, r, 0);
  case KILN_OP_REDUCE_SCATTER: return blocked(x, r, 1);
  case KILN_OP_ALL_TO_ALL: return all_to_all(x, r);
  case KILN_OP_COLLECTIVE_PERMUTE:
  case KILN_OP_COLLECTIVE_PERMUTE_START: return permute(x, r);
  case KILN_OP_COLLECTIVE_BROADCAST: return broadcast(x, r);
  default: return fail(x, KILN_EUNIMPL, "is not supported on the interpreter's mesh");
  }
}

int kiln__interp_eval_collective_mesh(kiln__interp_ctx *c, const kiln_instr *ins,
                                      const kiln_literal *const *ops, kiln_literal **out) {
  kiln_interp_mesh *mh = c->opts.mesh;
  int64_t R = kiln__interp_mesh_replicas(mh), P = kiln__interp_mesh_partitions(mh);
  int64_t me = c->opts.replica_id * P + c->opts.partition_id;
  kiln_arena *a = kiln_arena_create();
  if (a == NULL) return kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  kiln_collective_group g;
  kiln_literal *r = NULL;
  const kiln_literal *const **peer = NULL;
  int rc = kiln_collective_group_of(ins, R, P, me, a, &g, c->st);
  if (rc) goto out;
  bool start =
      (ins->op == KILN_OP_ALL_GATHER_START || ins->op == KILN_OP_COLLECTIVE_PERMUTE_START) &&
      kiln_shape_is_tuple(&ins->shape) && ins->shape.rank >= 2;
  const kiln_shape *rs = start ? &ins->shape.tuple[1] : &ins->shape;
  if ((rc = kiln__interp_lit_new(c, ins, rs, &r))) goto out;
  peer = kiln_arena_calloc(a, (size_t)(g.n ? g.n : 1), sizeof *peer);
  if (peer == NULL) {
    rc = kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
    goto out;
  }
  if ((rc = kiln__interp_mesh_enter(c, ins, g.members, g.n, ops, ins->noperands, peer))) goto out;
  coll x = {.c = c, .ins = ins, .g = &g, .peer = peer, .nops = ins->noperands};
  rc = compute(&x, r);
  int rc2 = kiln__interp_mesh_leave(c, ins, g.members, g.n);
  if (rc == 0) rc = rc2;
  if (rc == 0 && start) {
    rc = kiln__interp_start_value(c, ins, ops, ins->noperands, r, out);
    goto out;
  }
  if (rc == 0) {
    *out = r;
    r = NULL;
  }
out:
  if (r) kiln__interp_lit_free(c, r);
  kiln_arena_destroy(a);
  return rc;
}
