/* Row reductions inside loop kernels (see row_reduce.h): the plan of which
 * members a row kernel computes once per row.
 *
 * Each member gets the set of ways it is read, propagated from the roots
 * towards the inputs (users before operands):
 *  ROW   at an index of the current row: the output's dims, every dim but
 *        the minor one equal to the row's;
 *  KROW  at the row itself: the dims of size > 1 are the output's other
 *        than the minor one, in order, and equal to the row's;
 *  ANY   at anything else.
 * A member read only one way passes that to its operands when its op maps
 * the index in a way that keeps it (elementwise ops keep the index; a
 * reshape that only adds or drops dims of size 1 and a broadcast that keeps
 * the dims of size > 1 in order keep KROW; a row broadcast turns ROW into
 * KROW; a row reduce turns KROW into ROW); everything else reads its
 * operands ANY. */
#include "compiler/passes/row_reduce.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

#define M_ROW 1u
#define M_KROW 2u
#define M_ANY 4u
#define MAXR 64

int kiln__row_minor(const kiln_shape *out) {
  if (!kiln_shape_is_array(out) || out->rank < 2 || out->rank > MAXR) return -1;
  int64_t m2m[MAXR];
  kiln_shape_minor_to_major(out, m2m);
  int64_t md = m2m[0];
  if (md < 0 || md >= out->rank || out->dims[md] < KILN__ROW_MIN) return -1;
  return (int)md;
}

typedef struct slot {
  kiln_id id;
  uint32_t i;
} slot;

static int cmp_slot(const void *a, const void *b) {
  kiln_id x = ((const slot *)a)->id, y = ((const slot *)b)->id;
  return x < y ? -1 : x > y;
}

/* Member index of id, or -1. */
static int64_t member(const slot *s, uint32_t n, kiln_id id) {
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (s[mid].id < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && s[lo].id == id ? (int64_t)s[lo].i : -1;
}

/* Sizes of s's dims of size > 1, dim `skip` left out; their count, or -1
 * when s is not an array of at most MAXR dims. */
static int big_sizes(const kiln_shape *s, int skip, int64_t *out) {
  if (!kiln_shape_is_array(s) || s->rank > MAXR) return -1;
  int n = 0;
  for (uint32_t d = 0; d < s->rank; d++)
    if ((int)d != skip && s->dims[d] != 1) out[n++] = s->dims[d];
  return n;
}

static bool same_sizes(const int64_t *a, int na, const int64_t *b, int nb) {
  return na >= 0 && na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* Whether a value of shape s read at KROW has the row's big dims. */
static bool row_shaped(const kiln_shape *s, const int64_t *rb, int nrb) {
  int64_t b[MAXR];
  int nb = big_sizes(s, -1, b);
  return same_sizes(b, nb, rb, nrb);
}

/* Whether broadcast x maps its operand's dims of size > 1, in order, onto
 * x's dims of size > 1 other than `skip` (-1: none), in order, and every
 * one of those is covered. */
static bool bcast_keeps(const kiln_module *m, const kiln_instr *x, int skip) {
  const kiln_instr *a = m->instrs[x->operands[0]];
  const kiln_i64s *dl = kiln_instr_attr_ints(x, KILN_ATTR_DIMENSIONS);
  if (!kiln_shape_is_array(&a->shape) || !kiln_shape_is_array(&x->shape) || dl == NULL ||
      dl->n != a->shape.rank)
    return false;
  uint32_t next = 0; /* the next big dim of x to be covered */
  for (uint32_t i = 0; i < a->shape.rank; i++) {
    if (a->shape.dims[i] == 1) continue;
    int64_t d = dl->v[i];
    if (d < 0 || d >= x->shape.rank || d == skip || x->shape.dims[d] != a->shape.dims[i])
      return false;
    while (next < x->shape.rank && ((int)next == skip || x->shape.dims[next] == 1)) next++;
    if ((int64_t)next != d) return false;
    next++;
  }
  while (next < x->shape.rank && ((int)next == skip || x->shape.dims[next] == 1)) next++;
  return next == x->shape.rank;
}

/* Whether reduce x reduces exactly dim md of an input with out's dims. */
static bool row_reduce(const kiln_module *m, const kiln_instr *x, const kiln_shape *out, int md) {
  if (x->op != KILN_OP_REDUCE || x->noperands != 2 || x->ncalled != 1 ||
      !kiln_shape_is_array(&x->shape))
    return false;
  const kiln_i64s *dl = kiln_instr_attr_ints(x, KILN_ATTR_DIMENSIONS);
  const kiln_shape *in = &m->instrs[x->operands[0]]->shape;
  return dl && dl->n == 1 && dl->v[0] == md && kiln_shape_is_array(in) &&
         kiln_shape_same_dims(in, out);
}

static bool elementwise(const kiln_instr *x) {
  return (kiln_opcode_flags(x->op) & KILN_OPF_ELEMENTWISE) != 0;
}

int kiln__row_plan(const kiln_module *m, const kiln_id *members, uint32_t n, const kiln_id *roots,
                   uint32_t nroots, const kiln_shape *out, uint8_t *role, uint32_t *stranded,
                   bool *in_row) {
  memset(role, 0, n);
  if (in_row) memset(in_row, 0, n * sizeof *in_row);
  *stranded = 0;
  int md = kiln__row_minor(out);
  slot *s = kiln_malloc((n ? n : 1) * sizeof *s);
  uint8_t *mode = kiln_calloc(n ? n : 1, 1), *dep = kiln_calloc(n ? n : 1, 1);
  int rc = s && mode && dep ? 0 : KILN_ENOMEM;
  if (rc) goto out_free;
  for (uint32_t i = 0; i < n; i++) s[i] = (slot){members[i], i};
  qsort(s, n, sizeof *s, cmp_slot);
  /* dep: computed from a member reduce. Members must come in order. */
  bool ordered = true;
  for (uint32_t i = 0; i < n && ordered; i++) {
    const kiln_instr *x = m->instrs[members[i]];
    dep[i] = x->op == KILN_OP_REDUCE;
    for (uint32_t k = 0; k < x->noperands; k++) {
      int64_t o = member(s, n, x->operands[k]);
      if (o < 0) continue;
      if ((uint64_t)o >= i)
        ordered = false;
      else
        dep[i] |= dep[o];
    }
  }
  int64_t rb[MAXR];
  int nrb = md >= 0 ? big_sizes(out, md, rb) : -1;
  if (ordered && md >= 0) {
    for (uint32_t r = 0; r < nroots; r++) {
      int64_t x = member(s, n, roots[r]);
      if (x >= 0)
        mode[x] |= kiln_shape_is_array(&m->instrs[roots[r]]->shape) &&
                           kiln_shape_same_dims(&m->instrs[roots[r]]->shape, out)
                       ? M_ROW
                       : M_ANY;
    }
  }
  for (uint32_t i = n; ordered && md >= 0 && i-- > 0;) {
    const kiln_instr *x = m->instrs[members[i]];
    uint8_t mx = mode[i], give = M_ANY; /* what x's operands receive */
    if (mx == 0) continue;
    if (mx == M_ROW && elementwise(x)) {
      give = M_ROW;
    } else if (mx == M_ROW && x->op == KILN_OP_BROADCAST && x->noperands == 1 &&
               kiln_shape_same_dims(&x->shape, out) && bcast_keeps(m, x, md)) {
      int64_t o = member(s, n, x->operands[0]);
      if (o >= 0 && dep[o]) {
        role[i] = KILN__ROW_BCAST;
        give = M_KROW;
      }
    } else if (mx == M_KROW && elementwise(x)) {
      give = M_KROW;
    } else if (mx == M_KROW && x->op == KILN_OP_RESHAPE && x->noperands == 1) {
      if (row_shaped(&m->instrs[x->operands[0]]->shape, rb, nrb)) give = M_KROW;
    } else if (mx == M_KROW && x->op == KILN_OP_BROADCAST && x->noperands == 1) {
      if (bcast_keeps(m, x, -1)) give = M_KROW;
    } else if (mx == M_KROW && row_reduce(m, x, out, md) && row_shaped(&x->shape, rb, nrb)) {
      role[i] = KILN__ROW_REDUCE;
      give = M_ROW;
    }
    for (uint32_t k = 0; k < x->noperands; k++) {
      int64_t o = member(s, n, x->operands[k]);
      if (o < 0) continue;
      const kiln_shape *os = &m->instrs[x->operands[k]]->shape;
      bool scalar = kiln_shape_is_array(os) && os->rank == 0;
      /* A scalar operand of an elementwise op is read at the empty index. */
      mode[o] |= scalar && give != M_ANY ? M_KROW : give;
    }
  }
  for (uint32_t i = 0; i < n; i++) {
    const kiln_instr *x = m->instrs[members[i]];
    if (in_row) in_row[i] = ordered && md >= 0 && mode[i] == M_ROW;
    bool is_root = false;
    for (uint32_t r = 0; r < nroots && !is_root; r++) is_root = roots[r] == members[i];
    if (x->op == KILN_OP_REDUCE && !is_root && role[i] != KILN__ROW_REDUCE) (*stranded)++;
  }
out_free:
  kiln_free(s);
  kiln_free(mode);
  kiln_free(dep);
  return rc;
}
