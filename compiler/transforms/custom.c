/* User-defined derivative rules: calls carrying jax.custom_jvp and
 * jax.custom_vjp rules as frontend attributes.
 *
 * A client that traces a custom_jvp or custom_vjp function emits its primal
 * as an ordinary call and names the rule's computations, which live in the
 * same module, in the call's frontend attributes:
 *
 *   call(o0..o(n-1)), to_apply=P, frontend_attributes={
 *     _kiln_custom_jvp="J"                         (custom_jvp), or
 *     _kiln_custom_vjp_fwd="F", _kiln_custom_vjp_bwd="B"   (custom_vjp),
 *     _kiln_custom_nargs="k"}                      (optional, default n)
 *
 * with, for the first k operands (the function's explicit arguments; the
 * others are values the function closed over, which may not be
 * differentiated, as in JAX) and the call's shape S:
 *
 *   J(o0..o(n-1), t0..t(k-1)) -> (S, S)        the primal and its tangent
 *   F(o0..o(n-1)) -> (S, R)                    the primal and residuals R
 *   B(o0..o(n-1), R, ct: S) -> (ct_o0..ct_o(k-1))
 *
 * The rules use them instead of differentiating P: forward mode calls J
 * with the operands' tangents; reverse mode calls F in the forward pass,
 * keeps R, and calls B with the cotangent (custom_vjp), or for custom_jvp
 * copies J with zero tangents into the forward pass and transposes that
 * copy with respect to the tangents (J is linear in them), which is how
 * JAX derives a VJP from a JVP rule. jvp of a custom_vjp call is an error,
 * as in JAX. vmap batches P and every rule computation with all operands
 * batched and keeps the attributes, naming the batched computations, so a
 * later grad still finds the rule. Without a transform reaching it the
 * call is a plain call of P.
 *
 * The attributes come from requests: names that are missing, computations
 * whose signatures do not match the call, and rules that refer to
 * themselves (which would make the rules recurse without end) are
 * KILN_EINVAL naming the call and what is wrong.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arena.h"
#include "common/sbuf.h"
#include "compiler/transforms/rules.h"

#define B (&c->b)

#define ATTR_JVP "_kiln_custom_jvp"
#define ATTR_FWD "_kiln_custom_vjp_fwd"
#define ATTR_BWD "_kiln_custom_vjp_bwd"
#define ATTR_NARGS "_kiln_custom_nargs"
#define NAME_MAX_LEN 200

typedef enum { CUSTOM_NONE, CUSTOM_JVP, CUSTOM_VJP } custom_kind;

typedef struct custom_info {
  custom_kind kind;
  uint32_t nargs;         /* explicit arguments: operands 0 .. nargs-1 */
  uint32_t jvp, fwd, bwd; /* computation ids, KILN_NO_ID when absent */
} custom_info;

/* The value of key in a frontend_attributes text ({a="x",b="y"}): 1 and
 * the value copied to out, 0 when the key is absent, -1 when it is there
 * but its value is not a quoted string of at most NAME_MAX_LEN chars. */
static int attr_value(const char *fa, const char *key, char *out, size_t size) {
  size_t kl = strlen(key);
  for (const char *p = fa; (p = strstr(p, key)) != NULL; p += kl) {
    bool starts = p == fa || p[-1] == '{' || p[-1] == ',' || p[-1] == ' ';
    if (!starts || p[kl] != '=') continue;
    const char *v = p + kl + 1;
    if (*v != '"') return -1;
    v++;
    const char *end = strchr(v, '"');
    if (end == NULL || (size_t)(end - v) >= size || end - v > NAME_MAX_LEN) return -1;
    memcpy(out, v, (size_t)(end - v));
    out[end - v] = '\0';
    return 1;
  }
  return 0;
}

static bool has_custom_attr(const kiln_instr *ins) {
  if (ins->op != KILN_OP_CALL) return false;
  const char *fa = kiln_instr_attr_str(ins, KILN_ATTR_FRONTEND_ATTRIBUTES);
  return fa != NULL && strstr(fa, "_kiln_custom_") != NULL;
}

bool kiln__tf_is_custom(const kiln_instr *ins) { return has_custom_attr(ins); }

static const char *kind_name(custom_kind k) {
  return k == CUSTOM_JVP ? "custom_jvp" : "custom_vjp";
}

/* Reads one named computation of the attributes. */
static int named_comp(kiln__tx *tx, const kiln_instr *ins, const char *fa, const char *key,
                      uint32_t *out) {
  char name[NAME_MAX_LEN + 1];
  *out = KILN_NO_ID;
  int r = attr_value(fa, key, name, sizeof name);
  if (r == 0) return 0;
  if (r < 0)
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: frontend attribute %s must be a quoted computation name "
                         "of at most %d characters",
                         tx->name, ins->name, key, NAME_MAX_LEN);
  const kiln_computation *f = kiln_module_find_computation(tx->m, name);
  if (f == NULL)
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: frontend attribute %s names computation \"%s\", which is "
                         "not in the module",
                         tx->name, ins->name, key, name);
  if (f->is_entry || f->id == tx->m->entry)
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: frontend attribute %s names the ENTRY computation %s",
                         tx->name, ins->name, key, name);
  *out = f->id;
  return 0;
}

static void shape_text(const kiln_shape *s, char *buf, size_t size) {
  kiln_sbuf sb = KILN_SBUF_INIT;
  kiln_shape_print_short(&sb, s);
  snprintf(buf, size, "%s", kiln_sbuf_failed(&sb) ? "?" : kiln_sbuf_str(&sb));
  kiln_sbuf_free(&sb);
}

/* Checks that parameter p of computation f has shape want. */
static int check_param(kiln__tx *tx, const kiln_instr *ins, const kiln_computation *f,
                       const char *role, uint32_t p, const kiln_shape *want) {
  const kiln_instr *pi = kiln_computation_param(tx->m, f, p);
  if (pi == NULL)
    return kiln__tx_fail(tx, KILN_EINVAL, ins, "%s: call %s: %s computation %s has no parameter %u",
                         tx->name, ins->name, role, f->name, p);
  if (!kiln_shape_equal(&pi->shape, want, false)) {
    char a[128], b[128];
    shape_text(&pi->shape, a, sizeof a);
    shape_text(want, b, sizeof b);
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: parameter %u of %s computation %s has shape %s, expected %s",
                         tx->name, ins->name, p, role, f->name, a, b);
  }
  return 0;
}

/* Checks that f's root is a tuple of n elements of the given shapes. */
static int check_root(kiln__tx *tx, const kiln_instr *ins, const kiln_computation *f,
                      const char *role, const kiln_shape *const *want, uint32_t n) {
  const kiln_instr *r = kiln_computation_root(tx->m, f);
  if (r == NULL || !kiln_shape_is_tuple(&r->shape) || r->shape.rank != n)
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: %s computation %s must return a tuple of %u elements",
                         tx->name, ins->name, role, f->name, n);
  for (uint32_t i = 0; i < n; i++) {
    if (want[i] == NULL || kiln_shape_equal(&r->shape.tuple[i], want[i], false)) continue;
    char a[128], b[128];
    shape_text(&r->shape.tuple[i], a, sizeof a);
    shape_text(want[i], b, sizeof b);
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: element %u of what %s computation %s returns has shape %s, "
                         "expected %s",
                         tx->name, ins->name, i, role, f->name, a, b);
  }
  return 0;
}

static const kiln_shape *op_shape(const kiln__tx *tx, const kiln_instr *ins, uint32_t k) {
  return &tx->m->instrs[ins->operands[k]]->shape;
}

/* Whether computation `rule` reaches itself by calls and by the rule
 * attributes of calls (a rule that would make the rules recurse): a walk
 * over computations with an explicit worklist, each visited once. */
static int check_acyclic(kiln__tx *tx, const kiln_instr *ins, uint32_t rule) {
  if (rule == KILN_NO_ID) return 0;
  const kiln_module *m = tx->m;
  uint8_t *seen = kiln_arena_calloc(tx->scratch, m->ncomps + 1, 1);
  uint32_t *work = kiln_arena_calloc(tx->scratch, m->ncomps + 1, sizeof *work);
  if (seen == NULL || work == NULL) return kiln__tx_oom(tx);
  uint32_t nwork = 0;
  work[nwork++] = rule;
  seen[rule] = 1;
  bool cycle = false;
  while (nwork && !cycle) {
    const kiln_computation *f = m->comps[work[--nwork]];
    for (uint32_t i = 0; i < f->ninstrs && !cycle; i++) {
      const kiln_instr *x = m->instrs[f->instrs[i]];
      uint32_t next[3], nn = 0;
      for (uint32_t j = 0; j < x->ncalled; j++) {
        uint32_t g = x->called[j];
        if (g == rule) cycle = true;
        if (g < m->ncomps && !seen[g]) {
          seen[g] = 1;
          work[nwork++] = g;
        }
      }
      if (!has_custom_attr(x)) continue;
      const char *fa = kiln_instr_attr_str(x, KILN_ATTR_FRONTEND_ATTRIBUTES);
      const char *keys[3] = {ATTR_JVP, ATTR_FWD, ATTR_BWD};
      for (uint32_t k = 0; k < 3; k++) {
        char name[NAME_MAX_LEN + 1];
        if (attr_value(fa, keys[k], name, sizeof name) != 1) continue;
        const kiln_computation *g = kiln_module_find_computation(m, name);
        if (g != NULL) next[nn++] = g->id;
      }
      for (uint32_t k = 0; k < nn; k++) {
        if (next[k] == rule) cycle = true;
        if (next[k] < m->ncomps && !seen[next[k]]) {
          seen[next[k]] = 1;
          work[nwork++] = next[k];
        }
      }
    }
  }
  if (cycle)
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: rule computation %s refers back to itself through its "
                         "calls and custom rules",
                         tx->name, ins->name, m->comps[rule]->name);
  return 0;
}

/* Reads and checks the rule of call ins. */
static int custom_read(kiln__tx *tx, const kiln_instr *ins, custom_info *ci) {
  memset(ci, 0, sizeof *ci);
  ci->jvp = ci->fwd = ci->bwd = KILN_NO_ID;
  const char *fa = kiln_instr_attr_str(ins, KILN_ATTR_FRONTEND_ATTRIBUTES);
  if (fa == NULL || ins->ncalled != 1 || ins->op != KILN_OP_CALL)
    return kiln__tx_fail(tx, KILN_EINVAL, ins, "%s: %s is not a call with a custom rule", tx->name,
                         ins->name);
  if (named_comp(tx, ins, fa, ATTR_JVP, &ci->jvp) || named_comp(tx, ins, fa, ATTR_FWD, &ci->fwd) ||
      named_comp(tx, ins, fa, ATTR_BWD, &ci->bwd))
    return tx->err;
  bool jvp = ci->jvp != KILN_NO_ID, fwd = ci->fwd != KILN_NO_ID, bwd = ci->bwd != KILN_NO_ID;
  if (jvp && (fwd || bwd))
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: both a custom_jvp rule (%s) and a custom_vjp rule (%s/%s) "
                         "are given; give one",
                         tx->name, ins->name, ATTR_JVP, ATTR_FWD, ATTR_BWD);
  if (fwd != bwd)
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: a custom_vjp rule needs both %s and %s (only %s is given)",
                         tx->name, ins->name, ATTR_FWD, ATTR_BWD, fwd ? ATTR_FWD : ATTR_BWD);
  if (!jvp && !fwd)
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: frontend attributes name no custom rule (%s, or %s and %s)",
                         tx->name, ins->name, ATTR_JVP, ATTR_FWD, ATTR_BWD);
  ci->kind = jvp ? CUSTOM_JVP : CUSTOM_VJP;
  uint32_t n = ins->noperands;
  ci->nargs = n;
  char nb[32];
  int r = attr_value(fa, ATTR_NARGS, nb, sizeof nb);
  if (r != 0) {
    char *end = NULL;
    long v = r > 0 ? strtol(nb, &end, 10) : -1;
    if (r < 0 || end == nb || *end != '\0' || v < 0 || v > (long)n)
      return kiln__tx_fail(tx, KILN_EINVAL, ins,
                           "%s: call %s: frontend attribute %s must be a quoted integer from 0 to "
                           "%u (the call's operand count)",
                           tx->name, ins->name, ATTR_NARGS, n);
    ci->nargs = (uint32_t)v;
  }
  const kiln_shape *S = &ins->shape;
  if (ci->kind == CUSTOM_JVP) {
    const kiln_computation *J = tx->m->comps[ci->jvp];
    if (kiln_computation_nparams(tx->m, J) != n + ci->nargs)
      return kiln__tx_fail(tx, KILN_EINVAL, ins,
                           "%s: call %s: custom_jvp computation %s takes %u parameters, expected "
                           "%u (the %u operands, then the tangents of the first %u)",
                           tx->name, ins->name, J->name, kiln_computation_nparams(tx->m, J),
                           n + ci->nargs, n, ci->nargs);
    for (uint32_t k = 0; k < n + ci->nargs; k++)
      if (check_param(tx, ins, J, "custom_jvp", k, op_shape(tx, ins, k < n ? k : k - n)))
        return tx->err;
    const kiln_shape *want[2] = {S, S};
    if (check_root(tx, ins, J, "custom_jvp", want, 2)) return tx->err;
    return check_acyclic(tx, ins, ci->jvp);
  }
  const kiln_computation *F = tx->m->comps[ci->fwd], *Bk = tx->m->comps[ci->bwd];
  if (kiln_computation_nparams(tx->m, F) != n)
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: custom_vjp fwd computation %s takes %u parameters, expected "
                         "%u (the call's operands)",
                         tx->name, ins->name, F->name, kiln_computation_nparams(tx->m, F), n);
  for (uint32_t k = 0; k < n; k++)
    if (check_param(tx, ins, F, "custom_vjp fwd", k, op_shape(tx, ins, k))) return tx->err;
  const kiln_shape *want[2] = {S, NULL};
  if (check_root(tx, ins, F, "custom_vjp fwd", want, 2)) return tx->err;
  const kiln_shape *R = &kiln_computation_root(tx->m, F)->shape.tuple[1];
  if (kiln_computation_nparams(tx->m, Bk) != n + 2)
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: custom_vjp bwd computation %s takes %u parameters, expected "
                         "%u (the call's operands, the residuals, the cotangent)",
                         tx->name, ins->name, Bk->name, kiln_computation_nparams(tx->m, Bk), n + 2);
  for (uint32_t k = 0; k < n; k++)
    if (check_param(tx, ins, Bk, "custom_vjp bwd", k, op_shape(tx, ins, k))) return tx->err;
  if (check_param(tx, ins, Bk, "custom_vjp bwd", n, R) ||
      check_param(tx, ins, Bk, "custom_vjp bwd", n + 1, S))
    return tx->err;
  const kiln_shape **cts = kiln_arena_calloc(tx->scratch, ci->nargs + 1, sizeof *cts);
  if (cts == NULL) return kiln__tx_oom(tx);
  for (uint32_t k = 0; k < ci->nargs; k++) cts[k] = op_shape(tx, ins, k);
  if (check_root(tx, ins, Bk, "custom_vjp bwd", cts, ci->nargs)) return tx->err;
  if (check_acyclic(tx, ins, ci->fwd) || check_acyclic(tx, ins, ci->bwd)) return tx->err;
  return 0;
}

static int closed_over(kiln__tx *tx, const kiln_instr *ins, const custom_info *ci, uint32_t k) {
  return kiln__tx_fail(tx, KILN_EINVAL, ins,
                       "%s: call %s: differentiation of a %s function with respect to a value it "
                       "closed over (operand %u; the rule covers only its %u explicit arguments): "
                       "pass the value as an argument",
                       tx->name, ins->name, kind_name(ci->kind), k, ci->nargs);
}

static kiln_id param_of(const kiln__tx *tx, const kiln_computation *f, uint32_t n) {
  const kiln_instr *p = kiln_computation_param(tx->m, f, n);
  return p ? p->id : KILN_NO_ID;
}

/* ---- forward mode --------------------------------------------------------- */

static int jvp_custom(kiln__ad *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  custom_info ci;
  if (custom_read(tx, ins, &ci)) return tx->err;
  if (ci.kind == CUSTOM_VJP)
    return kiln__tx_fail(tx, KILN_EINVAL, ins,
                         "%s: call %s: forward-mode differentiation (jvp) of a custom_vjp "
                         "function is not supported (as in JAX: give it a custom_jvp rule)",
                         tx->name, ins->name);
  uint32_t n = ins->noperands;
  for (uint32_t k = ci.nargs; k < n; k++)
    if (kiln__T(c, ins, k) != KILN_NO_ID) return closed_over(tx, ins, &ci, k);
  kiln_id *ops = kiln__b_ids(tx, n + ci.nargs);
  if (ops == NULL) return tx->err;
  for (uint32_t k = 0; k < n; k++) ops[k] = kiln__X(c, ins, k);
  for (uint32_t k = 0; k < ci.nargs; k++) ops[n + k] = kiln__ad_tmat(c, ins, k);
  kiln_id call = kiln__b_call(B, ci.jvp, ops, n + ci.nargs);
  c->prim[kiln__ad_slot(c, ins->id)] = kiln__b_gte(B, call, 0);
  c->tan[kiln__ad_slot(c, ins->id)] = kiln__b_gte(B, call, 1);
  return tx->err;
}

/* ---- reverse mode --------------------------------------------------------- */

/* What the forward pass keeps for the backward one. */
typedef struct custom_save {
  custom_info ci;
  kiln__ad *jvp_copy; /* custom_jvp: the forward copy of J */
  kiln_id res;        /* custom_vjp: F's residuals */
} custom_save;

static int fwd_custom(kiln__ad *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  custom_save *sv = kiln_arena_calloc(tx->scratch, 1, sizeof *sv);
  if (sv == NULL) return kiln__tx_oom(tx);
  if (custom_read(tx, ins, &sv->ci)) return tx->err;
  uint32_t n = ins->noperands, na = sv->ci.nargs;
  for (uint32_t k = na; k < n; k++)
    if (kiln__ad_wants(c, ins, k)) return closed_over(tx, ins, &sv->ci, k);
  kiln_id *ops = kiln__b_ids(tx, n + na);
  uint8_t *act = kiln_arena_calloc(tx->scratch, n + na + 1, 1);
  if (ops == NULL || act == NULL) return tx->err ? tx->err : kiln__tx_oom(tx);
  for (uint32_t k = 0; k < n; k++) ops[k] = kiln__X(c, ins, k);
  if (sv->ci.kind == CUSTOM_VJP) {
    kiln_id call = kiln__b_call(B, sv->ci.fwd, ops, n);
    c->prim[kiln__ad_slot(c, ins->id)] = kiln__b_gte(B, call, 0);
    sv->res = kiln__b_gte(B, call, 1);
  } else {
    /* J with zero tangents, active in the tangents only: its tangent
     * output is linear in them, and the backward pass transposes it. */
    for (uint32_t k = 0; k < na; k++) {
      ops[n + k] = kiln__b_zeros(B, op_shape(tx, ins, k));
      act[n + k] = kiln__ad_wants(c, ins, k);
    }
    const kiln_computation *J = tx->m->comps[sv->ci.jvp];
    sv->jvp_copy = kiln_arena_calloc(tx->scratch, 1, sizeof *sv->jvp_copy);
    if (sv->jvp_copy == NULL) return kiln__tx_oom(tx);
    if (kiln__ad_init(sv->jvp_copy, tx, c->b.comp, J) || kiln__vjp_forward(sv->jvp_copy, ops, act))
      return tx->err;
    const kiln_instr *root = kiln_computation_root(tx->m, J);
    kiln_id r = sv->jvp_copy->prim[kiln__ad_slot(sv->jvp_copy, root->id)];
    c->prim[kiln__ad_slot(c, ins->id)] = kiln__b_gte(B, r, 0);
  }
  c->aux[kiln__ad_slot(c, ins->id)] = sv;
  return tx->err;
}

static int vjp_custom(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  kiln__tx *tx = c->tx;
  custom_save *sv = c->aux[kiln__ad_slot(c, ins->id)];
  if (sv == NULL)
    return kiln__tx_fail(tx, KILN_EINTERNAL, ins, "%s: internal error: custom rule of %s not saved",
                         tx->name, ins->name);
  uint32_t n = ins->noperands, na = sv->ci.nargs;
  ct = kiln__ad_mat(B, ct, &ins->shape);
  if (sv->ci.kind == CUSTOM_VJP) {
    kiln_id *ops = kiln__b_ids(tx, n + 2);
    if (ops == NULL) return tx->err;
    for (uint32_t k = 0; k < n; k++) ops[k] = kiln__X(c, ins, k);
    ops[n] = sv->res;
    ops[n + 1] = ct;
    kiln_id call = kiln__b_call(B, sv->ci.bwd, ops, n + 2);
    for (uint32_t k = 0; k < na && tx->err == 0; k++)
      if (kiln__ad_wants(c, ins, k)) kiln__ad_accum(c, ins, k, kiln__b_gte(B, call, k));
    return tx->err;
  }
  kiln__ad *J = sv->jvp_copy;
  kiln_id seed[2] = {kiln__b_zeros(B, &ins->shape), ct};
  if (kiln__vjp_backward(J, kiln__b_tuple(B, seed, 2))) return tx->err;
  for (uint32_t k = 0; k < na && tx->err == 0; k++) {
    kiln_id pid = param_of(tx, J->src, n + k);
    if (pid != KILN_NO_ID) kiln__ad_accum(c, ins, k, J->cot[kiln__ad_slot(J, pid)]);
  }
  return tx->err;
}

/* ---- batching ------------------------------------------------------------- */

/* A new computation: f batched with every parameter batched, its root
 * batched everywhere; KILN_NO_ID on error. */
static uint32_t batch_all(kiln__bt *c, const kiln_computation *f) {
  kiln__tx *tx = c->tx;
  uint32_t np = kiln_computation_nparams(tx->m, f);
  const kiln_shape **ps = kiln_arena_calloc(tx->scratch, np + 1, sizeof *ps);
  kiln__bsig **sigs = kiln_arena_calloc(tx->scratch, np + 1, sizeof *sigs);
  if (ps == NULL || sigs == NULL) return kiln__tx_oom(tx), KILN_NO_ID;
  for (uint32_t k = 0; k < np; k++) {
    const kiln_instr *p = kiln_computation_param(tx->m, f, k);
    if (p == NULL)
      return kiln__tx_fail(tx, KILN_EINVAL, NULL, "%s: computation %s has no parameter %u",
                           tx->name, f->name, k),
             KILN_NO_ID;
    ps[k] = &p->shape;
    sigs[k] = kiln__bsig_make(tx, &p->shape, true);
  }
  const kiln_instr *root = kiln_computation_root(tx->m, f);
  if (root == NULL)
    return kiln__tx_fail(tx, KILN_EINVAL, NULL, "%s: computation %s has no root", tx->name,
                         f->name),
           KILN_NO_ID;
  kiln__bsig *want = kiln__bsig_make(tx, &root->shape, true);
  if (tx->err) return KILN_NO_ID;
  return kiln__bt_comp(c, f, ps, sigs, np, want, "vmap", NULL);
}

static int batch_custom(kiln__bt *c, const kiln_instr *ins) {
  kiln__tx *tx = c->tx;
  custom_info ci;
  if (custom_read(tx, ins, &ci)) return tx->err;
  uint32_t n = ins->noperands;
  kiln_id *ops = kiln__b_ids(tx, n);
  if (ops == NULL) return tx->err;
  for (uint32_t k = 0; k < n; k++) ops[k] = kiln__bt_operand(c, ins, k);
  uint32_t p = batch_all(c, kiln_module_computation(tx->m, ins->called[0]));
  uint32_t r1 = batch_all(c, tx->m->comps[ci.kind == CUSTOM_JVP ? ci.jvp : ci.fwd]);
  uint32_t r2 = ci.kind == CUSTOM_VJP ? batch_all(c, tx->m->comps[ci.bwd]) : KILN_NO_ID;
  if (tx->err) return tx->err;
  char fa[3 * NAME_MAX_LEN + 200];
  if (ci.kind == CUSTOM_JVP)
    snprintf(fa, sizeof fa, "{%s=\"%s\",%s=\"%u\"}", ATTR_JVP, tx->m->comps[r1]->name, ATTR_NARGS,
             ci.nargs);
  else
    snprintf(fa, sizeof fa, "{%s=\"%s\",%s=\"%s\",%s=\"%u\"}", ATTR_FWD, tx->m->comps[r1]->name,
             ATTR_BWD, tx->m->comps[r2]->name, ATTR_NARGS, ci.nargs);
  kiln_id call = kiln__b_call(B, p, ops, n);
  if (call != KILN_NO_ID &&
      kiln_instr_set_attr_str(tx->m, kiln__b_ins(tx, call), KILN_ATTR_FRONTEND_ATTRIBUTES, fa))
    return kiln__tx_oom(tx);
  kiln__bt_set(c, ins, call, true);
  return tx->err;
}

const kiln__rule kiln__tf_custom_rule = {
    .jvp = jvp_custom,
    .vjp = vjp_custom,
    .fwd = fwd_custom,
    .batch = batch_custom,
    .own_primal = true,
};
