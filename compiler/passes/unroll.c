/* While-loop unrolling: a loop whose trip count is known at compile time,
 * small, and whose body is elementwise work (with the shape moves and calls
 * around it) becomes that many copies of its body in a row.
 *
 * jax.random's threefry2x32 on CPU is such a loop: five trips of four
 * rounds of u32 adds, rotates and xors over the whole counter array, the
 * rotation amounts and the key schedule carried in the loop state. Run as
 * a loop, each trip reads and writes every array of the state (two u32
 * arrays the size of the random output) and the loop copies its state
 * between trips; unrolled, the trip counter and the rotation amounts are
 * constants (constfold), the twenty rounds are one elementwise chain, and
 * fusion makes the counters, the rounds, the bits-to-float trick and
 * whatever consumes the floats (a bernoulli compare, erf_inv for normal)
 * one loop that keeps every intermediate in registers.
 *
 * A loop qualifies when:
 *  - its trip count follows from its own instructions
 *    (kiln__tf_trip_count_counted: a counter in the state stepped by a
 *    constant from a constant, compared with a bound; backend_config hints
 *    are not taken) and is at most MAX_TRIPS, and trips x body
 *    instructions stays within BUDGET per computation;
 *  - its body's root is a tuple and its condition is pure;
 *  - the body (and what it calls) holds only pure elementwise, movement,
 *    tuple and leaf instructions and calls, without control edges.
 * Calls in the body are copied as their callees' bodies, so that the
 * trips of a jax.lax.fori_loop (whose body calls its step function, and
 * returns the counter with the floats, a tuple the inline pass leaves as
 * a call) become one chain: Horner's rule over sixteen coefficients is
 * then one kernel reading the array once instead of sixteen passes over
 * it; hence up to MAX_TRIPS = 16 trips, the budget bounding the copies.
 * The body runs trips times on the state, so each copy computes what the
 * corresponding trip would: the counter takes the values the loop's would
 * and the condition fails exactly after the last copy. The
 * while's users read the last copy's root; the loop's computations stay in
 * the module, unreferenced (dce leaves those). The copies read their state
 * through get-tuple-element of the previous copy's tuple, which algsimp
 * folds away.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/passes.h"
#include "compiler/transforms/rules.h"

#define MAX_TRIPS 16
#define BUDGET 4096 /* instructions copied into one computation, at most */

/* Whether computation c and those it calls hold only instructions a copy
 * of the body may be made of; *size grows by their count. depth bounds the
 * walk (calls are a DAG in verified modules; this keeps it finite anyway). */
static bool plain(const kiln_module *m, uint32_t c, const bool *impure, uint32_t depth,
                  uint32_t *size) {
  if (c >= m->ncomps || impure[c] || depth > 8) return false;
  const kiln_computation *comp = m->comps[c];
  for (uint32_t i = 0; i < comp->ninstrs; i++) {
    const kiln_instr *x = m->instrs[comp->instrs[i]];
    if (x->ncontrol || !kiln__instr_is_pure(m, x, impure)) return false;
    switch (kiln_opcode_family(x->op)) {
    case KILN_FAM_LEAF:
    case KILN_FAM_TUPLE:
    case KILN_FAM_UNARY:
    case KILN_FAM_BINARY:
    case KILN_FAM_COMPARE:
    case KILN_FAM_TERNARY:
    case KILN_FAM_MOVEMENT:
      if (x->ncalled) return false;
      break;
    case KILN_FAM_CONTROL:
      if (x->op != KILN_OP_CALL || x->ncalled != 1 ||
          !plain(m, x->called[0], impure, depth + 1, size))
        return false;
      break;
    default: return false;
    }
  }
  *size += comp->ninstrs;
  return true;
}

/* The trip count of while w when it qualifies (see the file comment);
 * -1 otherwise. *size: the instructions one copy of the body adds. */
static int64_t trips(const kiln_module *m, const kiln_instr *w, const bool *impure,
                     uint32_t *size) {
  if (w->op != KILN_OP_WHILE || w->ncalled != 2 || w->noperands != 1 || w->ncontrol ||
      !kiln_shape_is_tuple(&w->shape))
    return -1;
  uint32_t cd = w->called[0], bd = w->called[1];
  if (cd >= m->ncomps || bd >= m->ncomps) return -1;
  const kiln_computation *cond = m->comps[cd], *body = m->comps[bd];
  if (kiln_computation_nparams(m, cond) != 1 || kiln_computation_nparams(m, body) != 1) return -1;
  const kiln_instr *br = kiln_computation_root(m, body);
  if (!br || br->op != KILN_OP_TUPLE || br->noperands != w->shape.rank) return -1;
  /* The condition's value is the compare of the counter (its other
   * instructions, pure, cannot change it). */
  if (impure[cd]) return -1;
  /* Counted from the loop itself: a known_trip_count hint that lied would
   * make the copies compute something else than the loop. */
  int64_t n = kiln__tf_trip_count_counted(m, w);
  if (n < 0 || n > MAX_TRIPS) return -1;
  *size = 0;
  return plain(m, bd, impure, 0, size) ? n : -1;
}

/* Appends to `comp` a copy of computation `c` whose parameter k reads
 * args[k], and returns the copy's root (KILN_NO_ID after an error, recorded
 * in tx). A call inside (plain() admitted only pure calls of plain
 * computations) is copied as its callee's body, so that the trips' chains
 * meet in one computation where fusion can join them: a body that calls
 * its step function (jax.lax.fori_loop does) would otherwise leave one
 * call, and one kernel, per trip. map is indexed by instruction id; ids of
 * different computations never collide, and a callee's entries are read
 * only until its copy returns. */
static kiln_id copy_comp(kiln__tx *tx, kiln__b *b, uint32_t c, const kiln_id *args, uint32_t nargs,
                         kiln_id *map, uint32_t nmap, uint32_t depth) {
  kiln_module *m = tx->m;
  const kiln_computation *comp = m->comps[c];
  kiln_id ops[64], *big = NULL, out = KILN_NO_ID;
  if (depth > 8) {
    kiln__tx_fail(tx, KILN_EINTERNAL, NULL, "unroll: calls nested too deeply");
    return KILN_NO_ID;
  }
  for (uint32_t i = 0; i < comp->ninstrs; i++) {
    const kiln_instr *src = m->instrs[comp->instrs[i]];
    if (src->id >= nmap) {
      kiln__tx_fail(tx, KILN_EINTERNAL, src, "unroll: instruction added during the copy");
      goto out_free;
    }
    if (src->op == KILN_OP_PARAMETER) {
      if (src->param_number < 0 || src->param_number >= nargs) {
        kiln__tx_fail(tx, KILN_EINVAL, src, "unroll: parameter %lld out of range (%u operands)",
                      (long long)src->param_number, nargs);
        goto out_free;
      }
      map[src->id] = args[src->param_number];
      continue;
    }
    kiln_id *o = ops;
    if (src->noperands > 64) {
      kiln_free(big);
      o = big = kiln_malloc(src->noperands * sizeof *big);
      if (big == NULL) {
        kiln__tx_oom(tx);
        goto out_free;
      }
    }
    for (uint32_t j = 0; j < src->noperands; j++) {
      kiln_id x = src->operands[j];
      if (x >= nmap || m->instrs[x]->comp != c) {
        kiln__tx_fail(tx, KILN_EINVAL, src, "unroll: operand %u is not in the loop body", j);
        goto out_free;
      }
      o[j] = map[x];
    }
    if (src->op == KILN_OP_CALL && src->ncalled == 1 && src->called[0] < m->ncomps &&
        src->called[0] != c) {
      /* o may be big, which the callee's copy may replace: keep a copy. */
      kiln_id *co = kiln_malloc(((size_t)src->noperands + 1) * sizeof *co);
      if (co == NULL) {
        kiln__tx_oom(tx);
        goto out_free;
      }
      memcpy(co, o, (size_t)src->noperands * sizeof *co);
      kiln_id r = copy_comp(tx, b, src->called[0], co, src->noperands, map, nmap, depth + 1);
      kiln_free(co);
      if (r == KILN_NO_ID) goto out_free;
      map[src->id] = r;
      continue;
    }
    map[src->id] = kiln__b_clone_same(b, src, o, src->noperands);
    if (!kiln__tx_ok(tx)) goto out_free;
  }
  out = map[comp->root];
out_free:
  kiln_free(big);
  return out;
}

/* Appends to `comp` a copy of body computation `bd` reading `state`; the
 * copy's root, or KILN_NO_ID after an error (recorded in tx). */
static kiln_id copy_body(kiln__tx *tx, uint32_t comp, uint32_t bd, kiln_id state) {
  kiln_module *m = tx->m;
  kiln__b b = {tx, comp};
  uint32_t nmap = m->ninstrs;
  kiln_id *map = kiln_malloc(((size_t)nmap + 1) * sizeof *map);
  if (map == NULL) {
    kiln__tx_oom(tx);
    return KILN_NO_ID;
  }
  kiln_id out = copy_comp(tx, &b, bd, &state, 1, map, nmap, 0);
  kiln_free(map);
  return out;
}

/* Unrolls the qualifying loops of computation `comp`. */
static int unroll_comp(kiln__tx *tx, uint32_t comp, const bool *impure) {
  kiln_module *m = tx->m;
  uint32_t copied = 0, n = m->comps[comp]->ninstrs;
  bool any = false;
  /* keep[] covers the instructions the copies add (BUDGET at most). */
  size_t nkeep = (size_t)m->ninstrs + BUDGET + 1;
  bool *keep = kiln_malloc(nkeep * sizeof *keep);
  if (keep == NULL) return kiln__tx_oom(tx);
  for (size_t q = 0; q < nkeep; q++) keep[q] = true;
  int rc = 0;
  for (uint32_t i = 0; rc == 0 && i < n; i++) {
    const kiln_instr *w = m->instrs[m->comps[comp]->instrs[i]];
    uint32_t size = 0;
    int64_t t = w->op == KILN_OP_WHILE ? trips(m, w, impure, &size) : -1;
    if (t < 0 || copied + (uint64_t)t * size > BUDGET) continue;
    if ((rc = kiln__tx_poll(tx)) != 0) break;
    kiln_id wid = w->id, state = w->operands[0];
    uint32_t bd = w->called[1];
    for (int64_t j = 0; j < t && state != KILN_NO_ID; j++) state = copy_body(tx, comp, bd, state);
    if (state == KILN_NO_ID) {
      rc = tx->err ? tx->err : KILN_EINTERNAL;
      break;
    }
    copied += (uint32_t)t * size;
    kiln_replace_all_uses(m, comp, wid, state);
    keep[wid] = false;
    any = true;
  }
  if (rc == 0 && any) {
    kiln_computation_compact(m, comp, keep);
    rc = kiln_computation_sort(m, comp, tx->st);
  }
  kiln_free(keep);
  return rc;
}

int kiln_pass_unroll(kiln_module *m, const kiln_pass_ctx *ctx) {
  kiln__tx tx;
  int rc = kiln__tx_init(&tx, m, "unroll", ctx->st);
  bool *impure = rc == 0 ? kiln__impure_computations(m) : NULL;
  if (rc == 0 && impure == NULL) rc = kiln__tx_oom(&tx);
  uint32_t ncomps = m->ncomps;
  for (uint32_t c = 0; rc == 0 && c < ncomps; c++) {
    bool loops = false;
    for (uint32_t i = 0; i < m->comps[c]->ninstrs && !loops; i++)
      loops = m->instrs[m->comps[c]->instrs[i]]->op == KILN_OP_WHILE;
    if (loops) rc = unroll_comp(&tx, c, impure);
  }
  kiln_free(impure);
  kiln__tx_fini(&tx);
  return rc;
}
