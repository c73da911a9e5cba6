/* Call inlining: every `call` is replaced by a copy of its computation's
 * instructions in the caller, the callee's parameters bound to the call's
 * operands and the call's users pointed at the copied root.
 *
 * JAX wraps the jax.nn functions (relu, gelu, softmax...) in calls of their
 * own; left as calls, the fusion pass sees a program cut at each one (a
 * call is never fused), so a convolution's bias add and its relu run as
 * two passes over memory instead of one. Copying the body in place lets
 * every later pass see through it. Numerics are unchanged: the same
 * instructions run on the same values.
 *
 * Left alone: a call whose value several instructions read (a relu that
 * both the forward pass and its gradient read: stored once, it is read
 * once by each, where inlined the fusion pass may copy its body into every
 * reader, measured 12% slower on a ResNet block's gradient; a tuple of
 * integer arrays read through get-tuple-elements of distinct elements,
 * each read once, is inlined), calls with
 * control edges (their order would have to be carried over to the
 * copies), calls of a computation that has control edges itself, and,
 * once the copies of one computation have added
 * INLINE_BUDGET instructions, the rest (a chain of calls that each call
 * the next twice would otherwise grow exponentially). Copied calls inside
 * a callee are inlined in turn, since the walk visits the appended copies
 * too. The callee itself stays in the module, unreferenced, as dce leaves
 * unreferenced computations.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/build.h"
#include "compiler/ir/rewrite.h"
#include "compiler/passes/passes.h"

#define INLINE_BUDGET 65536 /* instructions copied into one computation, at most */

static bool has_control(const kiln_module *m, const kiln_computation *c) {
  for (uint32_t i = 0; i < c->ninstrs; i++)
    if (m->instrs[c->instrs[i]]->ncontrol) return true;
  return false;
}

/* Whether some instruction of comp names `id` as a control predecessor. */
static bool is_control_pred(const kiln_module *m, const kiln_computation *c, kiln_id id) {
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *x = m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < x->ncontrol; k++)
      if (x->control_preds[k] == id) return true;
  }
  return false;
}

/* Reads of id's value in comp (the root counts as one). */
static uint32_t uses(const kiln_module *m, const kiln_computation *c, kiln_id id) {
  uint32_t n = c->root == id;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *x = m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < x->noperands; k++) n += x->operands[k] == id;
  }
  return n;
}

/* Whether the call `id` of comp returns a tuple of integer arrays that
 * every reader reads through a get-tuple-element, each of a different
 * element and each read once itself: jax.random's threefry2x32 returns its
 * two u32 words so, and inlined, the rounds fuse with what makes floats of
 * the bits. The copy leaves each element with one reader, as a call read
 * once has. Tuples of floats (the residuals a jvp'd call returns for the
 * backward pass, a GRU cell's state) keep their calls: inlined, fusion
 * decided otherwise around them and a transformer LM step measured up to
 * 20% slower, a scan's body gained kernels. */
static bool read_by_element(const kiln_module *m, const kiln_computation *c, kiln_id id) {
  const kiln_instr *call = m->instrs[id];
  if (c->root == id || !kiln_shape_is_tuple(&call->shape)) return false;
  for (uint32_t i = 0; i < call->shape.rank; i++) {
    const kiln_shape *e = &call->shape.tuple[i];
    if (!kiln_shape_is_array(e) ||
        !(kiln_dtype_is_signed_int(e->dtype) || kiln_dtype_is_unsigned_int(e->dtype)))
      return false;
  }
  uint64_t seen = 0;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *x = m->instrs[c->instrs[i]];
    for (uint32_t k = 0; k < x->noperands; k++) {
      if (x->operands[k] != id) continue;
      int64_t e = kiln_instr_attr_int(x, KILN_ATTR_INDEX, -1);
      if (x->op != KILN_OP_GET_TUPLE_ELEMENT || e < 0 || e >= 64 || (seen >> e & 1) ||
          uses(m, c, x->id) > 1)
        return false;
      seen |= (uint64_t)1 << e;
    }
  }
  return true;
}

/* Whether call can be copied in place at all (whatever its readers). */
static bool can_inline(const kiln_module *m, uint32_t comp, const kiln_instr *call) {
  if (call->op != KILN_OP_CALL || call->ncalled != 1 || call->called[0] >= m->ncomps ||
      call->called[0] == comp || call->ncontrol)
    return false;
  const kiln_computation *callee = m->comps[call->called[0]];
  return callee->root != KILN_NO_ID && !has_control(m, callee) &&
         !is_control_pred(m, m->comps[comp], call->id);
}

static bool inlinable(const kiln_module *m, uint32_t comp, const kiln_instr *call) {
  return can_inline(m, comp, call) &&
         (uses(m, m->comps[comp], call->id) <= 1 || read_by_element(m, m->comps[comp], call->id));
}

/* Copies call's computation into `comp` and points the call's users at the
 * copied root; *copied grows by the instructions added. */
static int inline_one(kiln__tx *tx, uint32_t comp, const kiln_instr *call, uint32_t *copied) {
  kiln_module *m = tx->m;
  const kiln_computation *c = m->comps[call->called[0]];
  kiln__b b = {tx, comp};
  uint32_t nmap = m->ninstrs;
  kiln_id *map = kiln_malloc(((size_t)nmap + 1) * sizeof *map);
  if (map == NULL) return kiln__tx_oom(tx);
  kiln_id ops[64], *big = NULL;
  int rc = 0;
  for (uint32_t k = 0; rc == 0 && k < c->ninstrs; k++) {
    const kiln_instr *src = m->instrs[c->instrs[k]];
    if (src->id >= nmap) {
      rc = kiln__tx_fail(tx, KILN_EINTERNAL, src, "inline: instruction added during the copy");
      break;
    }
    if (src->op == KILN_OP_PARAMETER) {
      if (src->param_number < 0 || src->param_number >= call->noperands) {
        rc = kiln__tx_fail(tx, KILN_EINVAL, call, "call parameter %lld out of range (%u operands)",
                           (long long)src->param_number, call->noperands);
        break;
      }
      map[src->id] = call->operands[src->param_number];
      continue;
    }
    kiln_id *o = ops;
    if (src->noperands > 64) {
      kiln_free(big);
      o = big = kiln_malloc(src->noperands * sizeof *big);
      if (big == NULL) {
        rc = kiln__tx_oom(tx);
        break;
      }
    }
    for (uint32_t j = 0; j < src->noperands; j++) {
      kiln_id x = src->operands[j];
      /* Operands come first in a computation's order (verified input). */
      if (x >= nmap || m->instrs[x]->comp != call->called[0]) {
        rc = kiln__tx_fail(tx, KILN_EINVAL, src, "inline: operand %u is not in the callee", j);
        break;
      }
      o[j] = map[x];
    }
    if (rc) break;
    map[src->id] = kiln__b_clone_same(&b, src, o, src->noperands);
    if (!kiln__tx_ok(tx)) rc = tx->err;
    (*copied)++;
  }
  if (rc == 0) kiln_replace_all_uses(m, comp, call->id, map[c->root]);
  kiln_free(big);
  kiln_free(map);
  return rc;
}

static int inline_comp(kiln__tx *tx, uint32_t comp, bool *keep) {
  kiln_module *m = tx->m;
  uint32_t copied = 0;
  bool any = false;
  int rc = 0;
  /* ninstrs is read again each time: copies are appended and visited. */
  for (uint32_t i = 0; rc == 0 && i < m->comps[comp]->ninstrs; i++) {
    const kiln_instr *call = m->instrs[m->comps[comp]->instrs[i]];
    if (!inlinable(m, comp, call)) continue;
    if (copied + m->comps[call->called[0]]->ninstrs > INLINE_BUDGET) break;
    if ((rc = kiln__tx_poll(tx)) != 0) break;
    rc = inline_one(tx, comp, call, &copied);
    if (rc == 0 && call->id < m->ninstrs) keep[call->id] = false;
    any = true;
  }
  if (rc == 0 && any) {
    kiln_computation_compact(m, comp, keep);
    rc = kiln_computation_sort(m, comp, tx->st);
  }
  return rc;
}

bool kiln__inline_can(const kiln_module *m, uint32_t comp, const kiln_instr *call) {
  return can_inline(m, comp, call);
}

int kiln__inline_call(kiln__tx *tx, uint32_t comp, kiln_id call) {
  kiln_module *m = tx->m;
  uint32_t copied = 0;
  int rc = inline_one(tx, comp, m->instrs[call], &copied);
  if (rc) return rc;
  bool *keep = kiln_malloc(((size_t)m->ninstrs + 1) * sizeof *keep);
  if (keep == NULL) return kiln__tx_oom(tx);
  for (size_t i = 0; i < m->ninstrs; i++) keep[i] = i != call;
  kiln_computation_compact(m, comp, keep);
  rc = kiln_computation_sort(m, comp, tx->st);
  kiln_free(keep);
  return rc;
}

int kiln_pass_inline(kiln_module *m, const kiln_pass_ctx *ctx) {
  kiln__tx tx;
  int rc = kiln__tx_init(&tx, m, "inline", ctx->st);
  uint32_t ncomps = m->ncomps;
  for (uint32_t c = 0; rc == 0 && c < ncomps; c++) {
    bool calls = false;
    for (uint32_t i = 0; i < m->comps[c]->ninstrs && !calls; i++)
      calls = m->instrs[m->comps[c]->instrs[i]]->op == KILN_OP_CALL;
    if (!calls) continue;
    /* keep[] covers the instructions the copies add. */
    size_t n = (size_t)m->ninstrs + INLINE_BUDGET + 1;
    bool *keep = kiln_malloc(n * sizeof *keep);
    if (keep == NULL) {
      rc = kiln__tx_oom(&tx);
      break;
    }
    for (size_t i = 0; i < n; i++) keep[i] = true;
    rc = inline_comp(&tx, c, keep);
    kiln_free(keep);
  }
  kiln__tx_fini(&tx);
  return rc;
}
