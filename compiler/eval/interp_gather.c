/* gather and scatter, with batching dims, per XLA's operation semantics.
 *
 * Both read a start index vector for each "batch" position of the indices
 * array (the dims other than index_vector_dim), map it onto operand dims
 * (start_index_map / scatter_dims_to_operand_dims), add the batching dims'
 * own positions, and then walk a window. gather clamps each start so the
 * whole slice stays inside the operand; scatter skips an update window that
 * would not fit entirely, and applies updates in order (scatter positions in
 * row-major order, then the window in row-major order), each through the
 * to_apply combiner, so duplicate indices combine as XLA's evaluator does.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/eval/interp_internal.h"

#define R KILN_INTERP_MAX_RANK

static int bad(kiln__interp_ctx *c, const kiln_instr *ins, const char *what) {
  return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: %s", kiln_opcode_name(ins->op), ins->name,
                           what);
}

static const kiln_i64s *ints(const kiln_instr *ins, kiln_attr_key k) {
  static const kiln_i64s none = {NULL, 0};
  const kiln_i64s *l = kiln_instr_attr_ints(ins, k);
  return l ? l : &none;
}

/* How start indices are read. */
typedef struct index_plan {
  const kiln_literal *ind;
  uint32_t irank, nbatch; /* indices rank; its dims other than the vector dim */
  int64_t ivd;            /* index_vector_dim; == irank: implicit trailing 1 */
  int64_t ist[R];
  const kiln_i64s *map, *obatch, *ibatch;
} index_plan;

static int plan_indices(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *ind,
                        uint32_t oprank, kiln_attr_key map_key, kiln_attr_key obatch_key,
                        kiln_attr_key ibatch_key, index_plan *p) {
  int rc = kiln__interp_need_array(c, ins, ind, "indices");
  if (rc) return rc;
  if (!kiln_dtype_is_integral(ind->shape.dtype)) return bad(c, ins, "indices must be integers");
  p->ind = ind;
  p->irank = ind->shape.rank;
  p->ivd = kiln_instr_attr_int(ins, KILN_ATTR_INDEX_VECTOR_DIM, p->irank);
  if (p->ivd < 0 || p->ivd > p->irank) return bad(c, ins, "index_vector_dim out of range");
  p->nbatch = p->irank - (p->ivd < p->irank ? 1 : 0);
  int64_t vlen = p->ivd < p->irank ? ind->shape.dims[p->ivd] : 1;
  p->map = ints(ins, map_key);
  p->obatch = ints(ins, obatch_key);
  p->ibatch = ints(ins, ibatch_key);
  if ((int64_t)p->map->n != vlen) return bad(c, ins, "index vectors must name one dim per entry");
  for (uint32_t k = 0; k < p->map->n; k++)
    if (p->map->v[k] < 0 || p->map->v[k] >= oprank) return bad(c, ins, "index map out of range");
  if (p->obatch->n != p->ibatch->n) return bad(c, ins, "batching dims must pair up");
  for (uint32_t k = 0; k < p->obatch->n; k++)
    if (p->obatch->v[k] < 0 || p->obatch->v[k] >= oprank || p->ibatch->v[k] < 0 ||
        p->ibatch->v[k] >= p->irank || p->ibatch->v[k] == p->ivd)
      return bad(c, ins, "batching dims out of range");
  kiln__interp_strides(&ind->shape, p->ist);
  return 0;
}

/* Start position in the operand for batch position g (nbatch entries). */
static void start_at(const index_plan *p, const int64_t *g, uint32_t oprank, int64_t *start) {
  int64_t ii[R];
  uint32_t j = 0;
  for (uint32_t d = 0; d < p->irank; d++) ii[d] = (int64_t)d == p->ivd ? 0 : g[j++];
  for (uint32_t d = 0; d < oprank; d++) start[d] = 0;
  for (uint32_t k = 0; k < p->map->n; k++) {
    if (p->ivd < p->irank) ii[p->ivd] = k;
    kiln__interp_scalar v =
        kiln__interp_scalar_load(p->ind, kiln__interp_linear(ii, p->ist, p->irank));
    start[p->map->v[k]] = kiln__interp_scalar_as_s64(v);
  }
  for (uint32_t k = 0; k < p->obatch->n; k++) {
    int64_t b = p->ibatch->v[k];
    start[p->obatch->v[k]] = g[b < p->ivd ? b : b - 1];
  }
}

/* The operand dims that are neither `skip1` nor `skip2`, in order. */
static uint32_t window_dims(uint32_t rank, const kiln_i64s *skip1, const kiln_i64s *skip2,
                            int64_t *out) {
  uint32_t n = 0;
  for (uint32_t d = 0; d < rank; d++)
    if (!kiln__interp_ints_has(skip1, d) && !kiln__interp_ints_has(skip2, d)) out[n++] = d;
  return n;
}

int kiln__interp_eval_gather(kiln__interp_ctx *c, const kiln_instr *ins,
                             const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *a = ops[0];
  const kiln_shape *os = &ins->shape;
  int rc = kiln__interp_need_array(c, ins, a, "operand");
  if (rc == 0) rc = kiln__interp_need_array(c, ins, &(kiln_literal){.shape = *os}, "result");
  if (rc) return rc;
  if (a->shape.dtype != os->dtype) return bad(c, ins, "result type differs from the operand's");
  uint32_t ar = a->shape.rank;
  index_plan p;
  rc = plan_indices(c, ins, ops[1], ar, KILN_ATTR_START_INDEX_MAP, KILN_ATTR_OPERAND_BATCHING_DIMS,
                    KILN_ATTR_START_INDICES_BATCHING_DIMS, &p);
  if (rc) return rc;
  const kiln_i64s *offd = ints(ins, KILN_ATTR_OFFSET_DIMS);
  const kiln_i64s *coll = ints(ins, KILN_ATTR_COLLAPSED_SLICE_DIMS);
  const kiln_i64s *sizes = ints(ins, KILN_ATTR_SLICE_SIZES);
  int64_t wd[R];
  uint32_t nw = window_dims(ar, coll, p.obatch, wd);
  if (sizes->n != ar || nw != offd->n || offd->n + p.nbatch != os->rank)
    return bad(c, ins, "slice sizes, offset dims and result rank do not fit together");
  for (uint32_t d = 0; d < ar; d++)
    if (sizes->v[d] < 0 || sizes->v[d] > a->shape.dims[d]) return bad(c, ins, "slice too large");
  uint8_t is_off[R] = {0};
  for (uint32_t j = 0; j < offd->n; j++) {
    if (offd->v[j] < 0 || offd->v[j] >= os->rank || is_off[offd->v[j]]++ ||
        os->dims[offd->v[j]] != sizes->v[wd[j]])
      return bad(c, ins, "offset dims do not match the slice sizes");
  }
  int64_t bdims[R];
  uint32_t nb = 0;
  for (uint32_t d = 0; d < os->rank; d++)
    if (!is_off[d]) bdims[nb++] = d;
  for (uint32_t d = 0, j = 0; d < p.irank; d++)
    if ((int64_t)d != p.ivd && ops[1]->shape.dims[d] != os->dims[bdims[j++]])
      return bad(c, ins, "batch dims of the result differ from the indices'");
  rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  int64_t ast[R], o[R] = {0}, n = kiln_literal_elements(*out);
  kiln__interp_strides(&a->shape, ast);
  for (int64_t i = 0; i < n; i++) {
    int64_t g[R], start[R], src = 0;
    for (uint32_t j = 0; j < nb; j++) g[j] = o[bdims[j]];
    start_at(&p, g, ar, start);
    for (uint32_t d = 0; d < ar; d++) {
      int64_t hi = a->shape.dims[d] - sizes->v[d];
      start[d] = start[d] < 0 ? 0 : start[d] > hi ? hi : start[d]; /* XLA clamps */
    }
    for (uint32_t j = 0; j < nw; j++) start[wd[j]] += o[offd->v[j]];
    src = kiln__interp_linear(start, ast, ar);
    kiln__interp_copy_elem(*out, i, a, src);
    kiln__interp_next_index(o, os->dims, os->rank);
  }
  return 0;
}

/* ---- scatter ------------------------------------------------------------ */

typedef struct scatter_plan {
  uint32_t n, ar;
  index_plan ip;
  int64_t wd[R], nw;      /* operand window dims, in order */
  int64_t uwd[R], usd[R]; /* update window dims, update scatter dims */
  int64_t nus;
  int64_t wsize[R];           /* per operand dim: window extent */
  int64_t wdims[R], sdims[R]; /* iteration extents */
} scatter_plan;

static int plan_scatter(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *const *ops,
                        scatter_plan *p) {
  uint32_t n = p->n;
  const kiln_literal *a = ops[0], *u = ops[n + 1];
  p->ar = a->shape.rank;
  for (uint32_t k = 0; k < n; k++) {
    int rc = kiln__interp_need_array(c, ins, ops[k], "input");
    if (rc == 0) rc = kiln__interp_need_array(c, ins, ops[n + 1 + k], "updates");
    if (rc) return rc;
    if (!kiln__interp_same_dims(&ops[k]->shape, &a->shape) ||
        !kiln__interp_same_dims(&ops[n + 1 + k]->shape, &u->shape))
      return bad(c, ins, "inputs (and updates) must agree in dims");
    if (!kiln__interp_dtype_computable(ops[k]->shape.dtype))
      return kiln__interp_fail(c, ins, KILN_EUNIMPL,
                               "scatter %s: element type has no arithmetic "
                               "in the interpreter",
                               ins->name);
  }
  int rc =
      plan_indices(c, ins, ops[n], p->ar, KILN_ATTR_SCATTER_DIMS_TO_OPERAND_DIMS,
                   KILN_ATTR_INPUT_BATCHING_DIMS, KILN_ATTR_SCATTER_INDICES_BATCHING_DIMS, &p->ip);
  if (rc) return rc;
  const kiln_i64s *uw = ints(ins, KILN_ATTR_UPDATE_WINDOW_DIMS);
  const kiln_i64s *iw = ints(ins, KILN_ATTR_INSERTED_WINDOW_DIMS);
  p->nw = window_dims(p->ar, iw, p->ip.obatch, p->wd);
  if ((int64_t)uw->n != p->nw || uw->n + p->ip.nbatch != u->shape.rank)
    return bad(c, ins, "update window dims do not fit the operand and updates");
  uint8_t is_w[R] = {0};
  for (uint32_t j = 0; j < uw->n; j++) {
    if (uw->v[j] < 0 || uw->v[j] >= u->shape.rank || is_w[uw->v[j]]++)
      return bad(c, ins, "update window dims out of range");
    p->uwd[j] = uw->v[j];
    p->wdims[j] = u->shape.dims[uw->v[j]];
  }
  p->nus = 0;
  for (uint32_t d = 0; d < u->shape.rank; d++)
    if (!is_w[d]) p->usd[p->nus++] = d;
  for (uint32_t d = 0, j = 0; d < p->ip.irank; d++) {
    if ((int64_t)d == p->ip.ivd) continue;
    if (ops[n]->shape.dims[d] != u->shape.dims[p->usd[j]])
      return bad(c, ins, "update scatter dims differ from the indices' batch dims");
    p->sdims[j++] = ops[n]->shape.dims[d];
  }
  for (uint32_t d = 0; d < p->ar; d++) p->wsize[d] = 1;
  for (int64_t j = 0; j < p->nw; j++) {
    p->wsize[p->wd[j]] = p->wdims[j];
    if (p->wdims[j] > a->shape.dims[p->wd[j]]) return bad(c, ins, "update window too large");
  }
  return 0;
}

int kiln__interp_eval_scatter(kiln__interp_ctx *c, const kiln_instr *ins,
                              const kiln_literal *const *ops, kiln_literal **out) {
  if (ins->noperands % 2 == 0) return bad(c, ins, "needs inputs, indices and as many updates");
  scatter_plan p = {.n = (ins->noperands - 1) / 2};
  uint32_t comp = 0, n = p.n;
  int rc = kiln__interp_called(c, ins, 0, &comp);
  if (rc == 0) rc = plan_scatter(c, ins, ops, &p);
  if (rc) return rc;
  const kiln_literal *a = ops[0], *u = ops[n + 1];
  kiln__interp_scalar *args = kiln_calloc(3 * (size_t)n, sizeof *args);
  if (args == NULL) return kiln__interp_fail(c, ins, KILN_ENOMEM, "out of memory");
  rc = kiln__interp_lit_result(c, ins, out);
  for (uint32_t k = 0; rc == 0 && k < n; k++) {
    kiln_literal *dst =
        n == 1 ? *out
               : (kiln_shape_is_tuple(&(*out)->shape) && (*out)->shape.rank == n ? (*out)->elems[k]
                                                                                 : NULL);
    rc = dst ? kiln__interp_lit_copy_into(c, ins, (*out)->own, dst, ops[k])
             : bad(c, ins, "result must be a tuple of the inputs' shapes");
  }
  int64_t ast[R], ust[R], g[R] = {0};
  kiln__interp_strides(&a->shape, ast);
  kiln__interp_strides(&u->shape, ust);
  bool any = true;
  for (int64_t j = 0; j < p.nus; j++) any &= p.sdims[j] > 0;
  for (int64_t j = 0; j < p.nw; j++) any &= p.wdims[j] > 0;
  while (rc == 0 && any) {
    int64_t start[R], ubase = 0;
    start_at(&p.ip, g, p.ar, start);
    bool fits = true;
    for (uint32_t d = 0; d < p.ar; d++)
      fits &= start[d] >= 0 && start[d] <= a->shape.dims[d] - p.wsize[d];
    for (int64_t j = 0; j < p.nus; j++) ubase += g[j] * ust[p.usd[j]];
    int64_t w[R] = {0};
    while (fits && rc == 0) {
      int64_t pos[R], ui = ubase;
      memcpy(pos, start, p.ar * sizeof *pos);
      for (int64_t j = 0; j < p.nw; j++) {
        pos[p.wd[j]] += w[j];
        ui += w[j] * ust[p.uwd[j]];
      }
      int64_t ai = kiln__interp_linear(pos, ast, p.ar);
      for (uint32_t k = 0; k < n; k++) {
        kiln_literal *dst = n == 1 ? *out : (*out)->elems[k];
        args[k] = kiln__interp_scalar_load(dst, ai);
        args[n + k] = kiln__interp_scalar_load(ops[n + 1 + k], ui);
      }
      rc = kiln__interp_call_scalar(c, ins, comp, args, 2 * n, args + 2 * n, n);
      for (uint32_t k = 0; rc == 0 && k < n; k++)
        kiln__interp_scalar_store(n == 1 ? *out : (*out)->elems[k], ai, args[2 * n + k]);
      if (!kiln__interp_next_index(w, p.wdims, (uint32_t)p.nw)) break;
    }
    if (!kiln__interp_next_index(g, p.sdims, (uint32_t)p.nus)) break;
  }
  kiln_free(args);
  if (rc && *out) {
    kiln__interp_lit_free(c, *out);
    *out = NULL;
  }
  return rc;
}
