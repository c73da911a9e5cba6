/* The LAPACK step (KILN_STEP_LINALG): building it from a LAPACK custom call,
 * a cholesky or a triangular-solve, and checking one that came in a blob.
 *
 * What the call computes is kiln_lapack (compiler/ir/lapack.h); the step
 * adds where each argument's elements are: per logical dimension its
 * element stride, read from the layout. LAPACK wants column-major matrices
 * (the layout JAX asks for); the runtime copies each matrix of the batch
 * into a column-major work array whatever its layout, so a layout the
 * layout pass chose differently is still the same step.
 */
#include <stdio.h>
#include <string.h>

#include "compiler/codegen/lower_internal.h"

#define MAX_STRIDE ((int64_t)1 << 40)

static void strides_of(const kiln_shape *s, int64_t *st) {
  int64_t m2m[KILN_LINALG_MAX_RANK], acc = 1;
  kiln_shape_minor_to_major(s, m2m);
  for (uint32_t k = 0; k < s->rank; k++) {
    st[m2m[k]] = acc;
    acc *= s->dims[m2m[k]];
  }
}

const char *kiln__linalg_plan(const kiln_module *m, const kiln_instr *ins, kiln_linalg *g,
                              char *why, size_t nwhy) {
  memset(g, 0, sizeof *g);
  if (ins->op != KILN_OP_CUSTOM_CALL && ins->noperands > 0) {
    kiln_dtype dt = m->instrs[ins->operands[0]]->shape.dtype;
    if (dt != KILN_F32 && dt != KILN_F64) {
      snprintf(why, nwhy, "%s of %s values is not supported yet (f32 and f64 are)",
               kiln_opcode_name(ins->op), kiln_dtype_name(dt));
      return why;
    }
  }
  if (kiln_lapack_describe(m, ins, &g->l, why, nwhy)) return why;
  uint32_t nops = ins->noperands;
  for (uint32_t i = 0; i < g->l.nargs; i++) {
    const kiln_shape *s = i < nops                         ? &m->instrs[ins->operands[i]]->shape
                          : ins->shape.dtype == KILN_TUPLE ? &ins->shape.tuple[i - nops]
                                                           : &ins->shape;
    if (s->rank > KILN_LINALG_MAX_RANK) {
      snprintf(why, nwhy, "argument %u has rank %u (at most %d)", i, s->rank, KILN_LINALG_MAX_RANK);
      return why;
    }
    strides_of(s, g->strides[i]);
  }
  return NULL;
}

bool kiln_linalg_check(const kiln_linalg *g, uint32_t nargs, const uint64_t *slot_bytes, char *why,
                       size_t nwhy) {
  if (!kiln_lapack_check(&g->l, why, nwhy)) return false;
  if (nargs != g->l.nargs) {
    snprintf(why, nwhy, "%s takes %u slots, %u given", kiln_lapack_kind_name(g->l.kind), g->l.nargs,
             nargs);
    return false;
  }
  for (uint32_t i = 0; i < nargs; i++) {
    uint32_t dt, r;
    int64_t d[KILN_LINALG_MAX_RANK];
    kiln_lapack_arg_dims(&g->l, i, &dt, &r, d);
    __int128 last = 0;
    bool empty = false;
    for (uint32_t k = 0; k < r; k++) {
      int64_t s = g->strides[i][k];
      if (s < 0 || s >= MAX_STRIDE) {
        snprintf(why, nwhy, "argument %u: stride %lld of dim %u out of range", i, (long long)s, k);
        return false;
      }
      if (d[k] == 0)
        empty = true;
      else
        last += (__int128)(d[k] - 1) * s;
    }
    __int128 bytes = empty ? 0 : (last + 1) * (__int128)kiln_dtype_size((kiln_dtype)dt);
    if (bytes > (__int128)slot_bytes[i]) {
      snprintf(why, nwhy, "argument %u spans %lld bytes, its slot has %llu", i, (long long)bytes,
               (unsigned long long)slot_bytes[i]);
      return false;
    }
  }
  return true;
}
