/* The roofline cost model (see cost.h): per-instruction flops and bytes,
 * candidate fusions as sets of instructions, and the peak-memory measure of
 * a computation order used by the scheduler.
 *
 * The figures are deliberately simple and deterministic: fusion decisions
 * compare two costs computed the same way, so only ratios matter, and a
 * golden test that pins a decision must not depend on rounding noise. */
#include "compiler/passes/cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/passes/row_reduce.h"

#define MAX_DEPTH 16 /* nesting of while/call/conditional/fusion followed */

double kiln_cost_op_flops(kiln_opcode op) {
  switch (op) {
  case KILN_OP_DIVIDE:
  case KILN_OP_REMAINDER:
  case KILN_OP_SQRT:
  case KILN_OP_RSQRT:
  case KILN_OP_CBRT: return 4;
  case KILN_OP_EXP:
  case KILN_OP_EXPM1:
  case KILN_OP_LOG:
  case KILN_OP_LOG1P:
  case KILN_OP_LOGISTIC:
  case KILN_OP_TANH:
  case KILN_OP_SIN:
  case KILN_OP_COS:
  case KILN_OP_TAN:
  case KILN_OP_ATAN2:
  case KILN_OP_POWER:
  case KILN_OP_ERF: return 16;
  default: return (kiln_opcode_flags(op) & KILN_OPF_ELEMENTWISE) ? 1 : 0;
  }
}

double kiln_cost_time(const kiln_target *t, double flops, double bytes) {
  double c = t->peak_flops > 0 ? flops / t->peak_flops : 0;
  double b = t->bandwidth > 0 ? bytes / t->bandwidth : 0;
  return (c > b ? c : b) + t->launch_overhead;
}

/* Ops that launch no kernel: they name, group or reinterpret values. */
static bool no_kernel(kiln_opcode op) {
  switch (op) {
  case KILN_OP_PARAMETER:
  case KILN_OP_CONSTANT:
  case KILN_OP_TUPLE:
  case KILN_OP_GET_TUPLE_ELEMENT:
  case KILN_OP_BITCAST:
  case KILN_OP_AFTER_ALL:
  case KILN_OP_ADD_DEPENDENCY:
  case KILN_OP_OPTIMIZATION_BARRIER:
  case KILN_OP_DOMAIN:
  case KILN_OP_GET_DIMENSION_SIZE:
  case KILN_OP_REPLICA_ID:
  case KILN_OP_PARTITION_ID: return true;
  default: return false;
  }
}

static double shape_bytes(const kiln_shape *s, int depth) {
  if (kiln_shape_is_array(s)) {
    int64_t b = kiln_shape_bytes(s);
    return b > 0 ? (double)b : 0;
  }
  double sum = 0;
  if (kiln_shape_is_tuple(s) && depth < MAX_DEPTH)
    for (uint32_t i = 0; i < s->rank; i++) sum += shape_bytes(&s->tuple[i], depth + 1);
  return sum;
}

/* Elements of an array shape (of the first leaf of a tuple); at least 1. */
static double elems(const kiln_shape *s) {
  for (int d = 0; kiln_shape_is_tuple(s) && s->rank > 0 && d < MAX_DEPTH; d++) s = &s->tuple[0];
  if (!kiln_shape_is_array(s)) return 1;
  int64_t n = kiln_shape_elements(s);
  return n > 0 ? (double)n : 1;
}

static const kiln_instr *operand(const kiln_module *m, const kiln_instr *ins, uint32_t k) {
  if (k >= ins->noperands || ins->operands[k] >= m->ninstrs) return NULL;
  return m->instrs[ins->operands[k]];
}

static double operand_elems(const kiln_module *m, const kiln_instr *ins, uint32_t k) {
  const kiln_instr *o = operand(m, ins, k);
  return o ? elems(&o->shape) : 1;
}

/* Flops of one run of a scalar computation (a reducer); at least 1. */
static double comp_flops(const kiln_module *m, const kiln_instr *ins, uint32_t k) {
  if (k >= ins->ncalled || ins->called[k] >= m->ncomps) return 1;
  const kiln_computation *c = m->comps[ins->called[k]];
  double f = 0;
  for (uint32_t i = 0; i < c->ninstrs; i++) f += kiln_cost_op_flops(m->instrs[c->instrs[i]]->op);
  return f > 1 ? f : 1;
}

static double product_of_dims(const kiln_shape *s, const kiln_i64s *dims) {
  double p = 1;
  if (dims == NULL || !kiln_shape_is_array(s)) return p;
  for (uint32_t i = 0; i < dims->n; i++)
    if (dims->v[i] >= 0 && dims->v[i] < s->rank) p *= (double)s->dims[dims->v[i]];
  return p;
}

static double window_size(const kiln_instr *ins) {
  const kiln_attr *a = kiln_instr_attr(ins, KILN_ATTR_WINDOW);
  double w = 1;
  if (a && a->v.window)
    for (uint32_t i = 0; i < a->v.window->rank; i++) w *= (double)a->v.window->dims[i].size;
  return w;
}

static double conv_flops(const kiln_module *m, const kiln_instr *ins) {
  const kiln_attr *a = kiln_instr_attr(ins, KILN_ATTR_DIM_LABELS);
  const kiln_instr *k = operand(m, ins, 1);
  if (a == NULL || a->v.conv == NULL || k == NULL || !kiln_shape_is_array(&k->shape))
    return 2 * elems(&ins->shape);
  const kiln_conv_dims *cd = a->v.conv;
  double per = 1;
  if (cd->kernel_in >= 0 && cd->kernel_in < k->shape.rank)
    per *= (double)k->shape.dims[cd->kernel_in];
  for (uint32_t i = 0; i < cd->nspatial; i++)
    if (cd->kernel_spatial[i] >= 0 && cd->kernel_spatial[i] < k->shape.rank)
      per *= (double)k->shape.dims[cd->kernel_spatial[i]];
  return 2 * per * elems(&ins->shape);
}

static void cost_add(kiln_cost *a, const kiln_cost *b) {
  a->flops += b->flops;
  a->bytes += b->bytes;
  a->seconds += b->seconds;
  a->kernels += b->kernels;
}

static void instr_cost(const kiln_module *m, const kiln_instr *ins, const kiln_target *t, int depth,
                       kiln_cost *out);

/* One pass through every instruction of a called computation. */
static void called_cost(const kiln_module *m, uint32_t comp, const kiln_target *t, int depth,
                        kiln_cost *out) {
  if (comp >= m->ncomps || depth >= MAX_DEPTH) return;
  const kiln_computation *c = m->comps[comp];
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_cost one;
    instr_cost(m, m->instrs[c->instrs[i]], t, depth + 1, &one);
    cost_add(out, &one);
  }
}

/* Flops of `ins` run on its own over its whole result. */
static double standalone_flops(const kiln_module *m, const kiln_instr *ins) {
  switch (ins->op) {
  case KILN_OP_REDUCE: return operand_elems(m, ins, 0) * comp_flops(m, ins, 0);
  case KILN_OP_REDUCE_WINDOW: return elems(&ins->shape) * window_size(ins) * comp_flops(m, ins, 0);
  case KILN_OP_MAP: return elems(&ins->shape) * comp_flops(m, ins, 0);
  case KILN_OP_SCATTER: return operand_elems(m, ins, ins->noperands - 1) * comp_flops(m, ins, 0);
  case KILN_OP_SELECT_AND_SCATTER: return operand_elems(m, ins, 0) * window_size(ins);
  case KILN_OP_DOT: {
    const kiln_instr *l = operand(m, ins, 0);
    double k =
        l ? product_of_dims(&l->shape, kiln_instr_attr_ints(ins, KILN_ATTR_LHS_CONTRACTING_DIMS))
          : 1;
    return 2 * k * elems(&ins->shape);
  }
  case KILN_OP_CONVOLUTION: return conv_flops(m, ins);
  case KILN_OP_SORT: {
    double n = operand_elems(m, ins, 0);
    return n * (n > 2 ? log2(n) : 1) * (ins->noperands ? ins->noperands : 1);
  }
  default: return elems(&ins->shape) * kiln_cost_op_flops(ins->op);
  }
}

/* Bytes `ins` reads of operand `o` when run on its own. */
static double read_bytes(const kiln_instr *ins, const kiln_instr *o) {
  double full = shape_bytes(&o->shape, 0);
  if ((ins->op == KILN_OP_SLICE || ins->op == KILN_OP_DYNAMIC_SLICE) && ins->operands[0] == o->id) {
    double part = shape_bytes(&ins->shape, 0);
    return part < full ? part : full;
  }
  return full;
}

static bool seen_before(const kiln_instr *ins, uint32_t k) {
  for (uint32_t j = 0; j < k; j++)
    if (ins->operands[j] == ins->operands[k]) return true;
  return false;
}

static int group_cost(const kiln_module *m, const kiln_id *members, uint32_t n,
                      const kiln_id *roots, uint32_t nroots, const kiln_target *t, kiln_cost *out);

static void instr_cost(const kiln_module *m, const kiln_instr *ins, const kiln_target *t, int depth,
                       kiln_cost *out) {
  memset(out, 0, sizeof *out);
  if (no_kernel(ins->op)) return;
  switch (ins->op) {
  case KILN_OP_WHILE:
  case KILN_OP_CALL:
  case KILN_OP_CONDITIONAL:
    for (uint32_t k = 0; k < ins->ncalled; k++) called_cost(m, ins->called[k], t, depth, out);
    return;
  default: break;
  }
  if (ins->op == KILN_OP_FUSION && ins->ncalled == 1 && ins->called[0] < m->ncomps &&
      depth < MAX_DEPTH) {
    /* Flops of the fused body as one kernel; bytes from the fusion's own
     * operands and result. */
    const kiln_computation *c = m->comps[ins->called[0]];
    kiln_id *mem = kiln_malloc((c->ninstrs ? c->ninstrs : 1) * sizeof *mem);
    const kiln_instr *root = kiln_computation_root(m, c);
    uint32_t nm = 0;
    if (mem && root) {
      for (uint32_t i = 0; i < c->ninstrs; i++)
        if (m->instrs[c->instrs[i]]->op != KILN_OP_PARAMETER) mem[nm++] = c->instrs[i];
      const kiln_id *roots = &root->id;
      uint32_t nroots = 1;
      if (root->op == KILN_OP_TUPLE) {
        roots = root->operands;
        nroots = root->noperands;
      }
      kiln_cost g;
      if (group_cost(m, mem, nm, roots, nroots, t, &g) == 0) out->flops = g.flops;
    }
    kiln_free(mem);
  } else {
    out->flops = standalone_flops(m, ins);
  }
  for (uint32_t k = 0; k < ins->noperands; k++) {
    const kiln_instr *o = operand(m, ins, k);
    if (o && !seen_before(ins, k)) out->bytes += read_bytes(ins, o);
  }
  out->bytes += shape_bytes(&ins->shape, 0);
  out->seconds = kiln_cost_time(t, out->flops, out->bytes);
  out->kernels = 1;
}

void kiln_cost_instr(const kiln_module *m, const kiln_instr *ins, const kiln_target *t,
                     kiln_cost *out) {
  instr_cost(m, ins, t, 0, out);
}

/* ---- groups ------------------------------------------------------------- */

static int cmp_id(const void *a, const void *b) {
  kiln_id x = *(const kiln_id *)a, y = *(const kiln_id *)b;
  return x < y ? -1 : x > y;
}

/* Index of id in the sorted set, or -1. */
static int64_t find(const kiln_id *set, uint32_t n, kiln_id id) {
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (set[mid] < id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < n && set[lo] == id ? (int64_t)lo : -1;
}

/* How many elements of operand k instruction j reads when j itself is
 * evaluated `cj` times: a loop op reads one element per evaluation; a
 * reduction reads its whole input per output element it produces; any
 * other op reads its operand as a whole buffer. */
static double reads_of(const kiln_module *m, const kiln_instr *j, uint32_t k, double cj) {
  double ej = elems(&j->shape);
  if (j->op == KILN_OP_REDUCE && k < j->noperands / 2) return cj * operand_elems(m, j, k) / ej;
  switch (j->op) {
  case KILN_OP_BROADCAST:
  case KILN_OP_RESHAPE:
  case KILN_OP_TRANSPOSE:
  case KILN_OP_SLICE:
  case KILN_OP_DYNAMIC_SLICE:
  case KILN_OP_PAD:
  case KILN_OP_CONCATENATE:
  case KILN_OP_REVERSE:
  case KILN_OP_BITCAST:
  case KILN_OP_TUPLE:
  case KILN_OP_REDUCE: return cj;
  default: break;
  }
  if (kiln_opcode_flags(j->op) & KILN_OPF_ELEMENTWISE) return cj;
  return operand_elems(m, j, k) * cj / ej;
}

/* Members in an order where every member comes after its member operands
 * (iterative DFS post-order over member edges). */
static int topo(const kiln_module *m, const kiln_id *set, uint32_t n, uint32_t *order) {
  uint8_t *state = kiln_calloc(n ? n : 1, 1);
  uint32_t *stack = kiln_malloc((n ? n : 1) * sizeof *stack);
  uint32_t *next = kiln_calloc(n ? n : 1, sizeof *next);
  int rc = (state && stack && next) ? 0 : KILN_ENOMEM;
  uint32_t nout = 0;
  for (uint32_t s = 0; s < n && rc == 0; s++) {
    if (state[s]) continue;
    uint32_t top = 0;
    stack[top++] = s;
    state[s] = 1;
    while (top) {
      uint32_t x = stack[top - 1];
      const kiln_instr *ins = m->instrs[set[x]];
      if (next[x] < ins->noperands) {
        int64_t o = find(set, n, ins->operands[next[x]++]);
        if (o >= 0 && state[o] == 0) {
          state[o] = 1;
          stack[top++] = (uint32_t)o;
        }
      } else {
        state[x] = 2;
        order[nout++] = x;
        top--;
      }
    }
  }
  kiln_free(state);
  kiln_free(stack);
  kiln_free(next);
  return rc;
}

static int group_cost(const kiln_module *m, const kiln_id *members, uint32_t n,
                      const kiln_id *roots, uint32_t nroots, const kiln_target *t, kiln_cost *out) {
  memset(out, 0, sizeof *out);
  kiln_id *set = kiln_malloc((n ? n : 1) * sizeof *set);
  uint32_t *order = kiln_malloc((n ? n : 1) * sizeof *order);
  double *count = kiln_calloc(n ? n : 1, sizeof *count);
  uint8_t *row_role = NULL; /* per position in order: KILN__ROW_* */
  /* Per external operand: bytes read; one slot per member operand edge. */
  int rc = KILN_ENOMEM;
  if (set == NULL || order == NULL || count == NULL) goto out_free;
  memcpy(set, members, n * sizeof *set);
  qsort(set, n, sizeof *set, cmp_id);
  if ((rc = topo(m, set, n, order))) goto out_free;
  /* A row kernel computes its row broadcasts once per row (row_reduce.h). */
  bool reduces = false;
  for (uint32_t i = 0; i < n && !reduces; i++) {
    reduces = m->instrs[set[i]]->op == KILN_OP_REDUCE;
    for (uint32_t r = 0; r < nroots && reduces; r++) reduces = roots[r] != set[i];
  }
  if (reduces && nroots > 0 && roots[0] < m->ninstrs) {
    kiln_id *ids = kiln_malloc(n * sizeof *ids);
    uint32_t stranded;
    rc = KILN_ENOMEM;
    if (ids == NULL || (row_role = kiln_malloc(n)) == NULL) {
      kiln_free(ids);
      goto out_free;
    }
    for (uint32_t i = 0; i < n; i++) ids[i] = set[order[i]];
    rc = kiln__row_plan(m, ids, n, roots, nroots, &m->instrs[roots[0]]->shape, row_role, &stranded,
                        NULL);
    kiln_free(ids);
    if (rc) goto out_free;
  }
  for (uint32_t r = 0; r < nroots; r++) {
    int64_t x = find(set, n, roots[r]);
    if (x >= 0) {
      double e = elems(&m->instrs[roots[r]]->shape);
      if (e > count[x]) count[x] = e;
    }
    if (x >= 0) out->bytes += shape_bytes(&m->instrs[roots[r]]->shape, 0);
  }
  for (uint32_t i = n; i-- > 0;) {
    uint32_t x = order[i];
    const kiln_instr *j = m->instrs[set[x]];
    if (count[x] == 0) count[x] = elems(&j->shape); /* reaches no root: run once */
    out->flops += standalone_flops(m, j) / elems(&j->shape) * count[x];
    for (uint32_t k = 0; k < j->noperands; k++) {
      int64_t o = find(set, n, j->operands[k]);
      if (o < 0) continue;
      double r = row_role && row_role[i] == KILN__ROW_BCAST
                     ? count[x] * operand_elems(m, j, k) / elems(&j->shape)
                     : reads_of(m, j, k, count[x]);
      if (r > count[o]) count[o] = r;
    }
  }
  /* External operands, each read once: only the sliced part when every
   * use slices it. */
  for (uint32_t x = 0; x < n; x++) {
    const kiln_instr *j = m->instrs[set[x]];
    for (uint32_t k = 0; k < j->noperands; k++) {
      kiln_id e = j->operands[k];
      if (e >= m->ninstrs || find(set, n, e) >= 0) continue;
      bool first = true; /* count e at its first use edge only */
      double sliced = 0, full = shape_bytes(&m->instrs[e]->shape, 0);
      bool all_sliced = true;
      for (uint32_t y = 0; y < n && first; y++) {
        const kiln_instr *u = m->instrs[set[y]];
        for (uint32_t q = 0; q < u->noperands; q++) {
          if (u->operands[q] != e) continue;
          if (y < x || (y == x && q < k)) {
            first = false;
            break;
          }
          if ((u->op == KILN_OP_SLICE || u->op == KILN_OP_DYNAMIC_SLICE) && q == 0) {
            sliced += shape_bytes(&u->shape, 0);
          } else {
            all_sliced = false;
          }
        }
      }
      if (first) out->bytes += all_sliced && sliced < full ? sliced : full;
    }
  }
  out->seconds = kiln_cost_time(t, out->flops, out->bytes);
  out->kernels = 1;
  rc = 0;
out_free:
  kiln_free(set);
  kiln_free(order);
  kiln_free(count);
  kiln_free(row_role);
  return rc;
}

int kiln_cost_group(const kiln_module *m, const kiln_id *members, uint32_t nmembers,
                    const kiln_id *roots, uint32_t nroots, const kiln_target *t, kiln_cost *out) {
  return group_cost(m, members, nmembers, roots, nroots, t, out);
}

/* ---- peak memory of an order -------------------------------------------- */

static bool is_alias(kiln_opcode op) {
  return op == KILN_OP_TUPLE || op == KILN_OP_GET_TUPLE_ELEMENT || op == KILN_OP_BITCAST;
}

static int64_t own_bytes(const kiln_instr *ins) {
  if (is_alias(ins->op) || ins->op == KILN_OP_PARAMETER || ins->op == KILN_OP_CONSTANT) return 0;
  return (int64_t)shape_bytes(&ins->shape, 0);
}

/* Drops one reference to x; when none is left, x's bytes are freed and, for
 * an alias, the references it held on its operands. */
static void release(const kiln_module *m, kiln_id x, uint32_t *refs, int64_t *live,
                    kiln_id *stack) {
  uint32_t top = 0;
  stack[top++] = x;
  while (top) {
    kiln_id v = stack[--top];
    if (refs[v] == 0 || --refs[v] > 0) continue;
    const kiln_instr *ins = m->instrs[v];
    *live -= own_bytes(ins);
    if (is_alias(ins->op))
      for (uint32_t k = 0; k < ins->noperands; k++)
        if (ins->operands[k] < m->ninstrs) stack[top++] = ins->operands[k];
  }
}

int64_t kiln_cost_peak_bytes(const kiln_module *m, uint32_t comp, const kiln_id *order) {
  if (comp >= m->ncomps) return 0;
  const kiln_computation *c = m->comps[comp];
  if (order == NULL) order = c->instrs;
  size_t edges = 0;
  for (uint32_t i = 0; i < c->ninstrs; i++) edges += m->instrs[c->instrs[i]]->noperands;
  uint32_t *refs = kiln_calloc(m->ninstrs ? m->ninstrs : 1, sizeof *refs);
  kiln_id *stack = kiln_malloc((edges + c->ninstrs + 1) * sizeof *stack);
  if (refs == NULL || stack == NULL) {
    kiln_free(refs);
    kiln_free(stack);
    return -1;
  }
  /* One reference per use edge, one for being defined (dropped right after
   * the definition when nothing uses it), one more for the root. */
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[c->instrs[i]];
    refs[ins->id]++;
    for (uint32_t k = 0; k < ins->noperands; k++)
      if (ins->operands[k] < m->ninstrs && m->instrs[ins->operands[k]]->comp == comp)
        refs[ins->operands[k]]++;
  }
  if (c->root < m->ninstrs) refs[c->root]++;
  int64_t live = 0, peak = 0;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[order[i]];
    live += own_bytes(ins);
    if (live > peak) peak = live;
    for (uint32_t k = 0; k < ins->noperands; k++)
      if (ins->operands[k] < m->ninstrs && m->instrs[ins->operands[k]]->comp == comp)
        release(m, ins->operands[k], refs, &live, stack);
    release(m, ins->id, refs, &live, stack); /* the definition's own reference */
  }
  kiln_free(refs);
  kiln_free(stack);
  return peak;
}
