/* Global arrays, as PJRT has them: a global argument cut into the shard
 * each device's parameter takes (zero padding past the array's end), the
 * devices' result shards put back together into the global result, and the
 * count of the collectives a per-device program runs.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/rewrite.h"
#include "compiler/spmd/spmd.h"
#include "compiler/spmd/spmd_internal.h"

const char *kiln_spmd_kind_name(kiln_spmd_kind k) {
  static const char *const names[KILN_SPMD_NKINDS] = {"all-reduce", "all-gather", "all-to-all",
                                                      "collective-permute", "reduce-scatter"};
  return (unsigned)k < KILN_SPMD_NKINDS ? names[k] : "?";
}

/* Copies between a global array and device dev's shard under t
 * (to_global: shard -> global), a run of the innermost dim at a time: the
 * part of each shard row inside the array is contiguous on both sides. */
static void copy_shard(const kiln_shape *g, const spmd_tiling *t, int64_t dev, void *global,
                       void *shard, bool to_global) {
  uint32_t r = g->rank;
  size_t es = kiln_dtype_size(g->dtype);
  if (r == 0) {
    if (to_global)
      memcpy(global, shard, es);
    else
      memcpy(shard, global, es);
    return;
  }
  int64_t ld[SPMD_MAX_RANK], off[SPMD_MAX_RANK], idx[SPMD_MAX_RANK], gstride[SPMD_MAX_RANK];
  int64_t rows = 1, s = 1;
  for (uint32_t d = r; d-- > 0;) {
    gstride[d] = s;
    s *= g->dims[d];
  }
  for (uint32_t d = 0; d < r; d++) {
    ld[d] = kiln__shard_size(g->dims[d], t->tiles[d]);
    off[d] = kiln__tiling_coord(t, dev, d) * ld[d];
    idx[d] = 0;
    if (d + 1 < r) rows *= ld[d];
  }
  uint32_t last = r - 1;
  int64_t run = g->dims[last] - off[last];
  if (run > ld[last]) run = ld[last];
  if (run <= 0) return; /* the shard lies past the array: all padding */
  for (int64_t i = 0; i < rows; i++) {
    bool in = true;
    int64_t gi = off[last];
    for (uint32_t d = 0; d < last; d++) {
      int64_t x = off[d] + idx[d];
      in = in && x < g->dims[d];
      gi += x * gstride[d];
    }
    if (in) {
      char *gp = (char *)global + (size_t)gi * es;
      char *sp = (char *)shard + (size_t)(i * ld[last]) * es;
      if (to_global)
        memcpy(gp, sp, (size_t)run * es);
      else
        memcpy(sp, gp, (size_t)run * es);
    }
    for (uint32_t d = last; d-- > 0;) {
      if (++idx[d] < ld[d]) break;
      idx[d] = 0;
    }
  }
}

int kiln_spmd_shard_arg(const kiln_spmd_program *p, uint32_t param, const kiln_literal *global,
                        int64_t device, kiln_literal **out, kiln_status *st) {
  *out = NULL;
  if (param >= p->nparams || device < 0 || device >= p->partitions)
    return kiln_status_set(st, KILN_EINVAL, "spmd", "no parameter %u on device %lld", param,
                           (long long)device);
  const kiln_shape *g = &p->param_shapes[param];
  if (!kiln_shape_is_array(g)) return kiln_literal_clone(NULL, global, out, st);
  if (!kiln_shape_same_dims(g, &global->shape) || global->shape.dtype != g->dtype)
    return kiln_status_set(st, KILN_EINVAL, "spmd",
                           "argument %u does not have the parameter's shape", param);
  kiln_arena *a = kiln_arena_create();
  spmd_tiling *t;
  int rc = a ? kiln__tiling_from_sharding(a, p->param_shardings[param], g->rank, p->partitions,
                                          "spmd", &t, st)
             : kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
  if (rc == 0) {
    int64_t dims[SPMD_MAX_RANK];
    for (uint32_t d = 0; d < g->rank; d++) dims[d] = kiln__shard_size(g->dims[d], t->tiles[d]);
    kiln_shape ls;
    if (kiln_shape_make_array(a, &ls, g->dtype, dims, g->rank))
      rc = kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
    else if ((rc = kiln_literal_create(NULL, &ls, 0, out, st)) == 0)
      copy_shard(g, t, device, global->data, (*out)->data, false);
  }
  kiln_arena_destroy(a);
  return rc;
}

/* Fills the global array `dst` from the devices' shards elem (i, or the
 * whole result when not a tuple). */
static int assemble_one(const kiln_spmd_program *p, kiln_arena *a, uint32_t i,
                        kiln_literal *const *outs, kiln_literal *dst, kiln_status *st) {
  const kiln_shape *g = &p->result_shapes[i];
  if (!kiln_shape_is_array(g)) return 0; /* replicated: the caller copies device 0's */
  spmd_tiling *t;
  int rc =
      kiln__tiling_from_sharding(a, p->result_shardings[i], g->rank, p->partitions, "spmd", &t, st);
  if (rc) return rc;
  for (int64_t k = 0; k < p->partitions; k++) {
    if (t->pos[k] % t->rep != 0) continue; /* another device holds this tile */
    const kiln_literal *src = p->result_is_tuple ? outs[k]->elems[i] : outs[k];
    int64_t want = 1;
    for (uint32_t d = 0; d < g->rank; d++) want *= kiln__shard_size(g->dims[d], t->tiles[d]);
    if (src == NULL || kiln_literal_elements(src) != want || src->shape.dtype != g->dtype)
      return kiln_status_set(st, KILN_EINTERNAL, "spmd",
                             "device %lld returned a shard of the wrong shape for result %u",
                             (long long)k, i);
    copy_shard(g, t, k, dst->data, src->data, true);
  }
  return 0;
}

int kiln_spmd_assemble(const kiln_spmd_program *p, kiln_literal *const *outs, kiln_literal **out,
                       kiln_status *st) {
  *out = NULL;
  for (int64_t k = 0; k < p->partitions; k++)
    if (outs[k] == NULL ||
        (p->result_is_tuple && (outs[k]->elems == NULL || outs[k]->shape.rank != p->nresults)))
      return kiln_status_set(st, KILN_EINTERNAL, "spmd", "device %lld returned no result",
                             (long long)k);
  kiln_arena *a = kiln_arena_create();
  if (a == NULL) return kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
  int rc = 0;
  if (p->result_is_tuple) {
    kiln_shape ts;
    if (kiln_shape_make_tuple(a, &ts, p->result_shapes, p->nresults))
      rc = kiln_status_set(st, KILN_ENOMEM, "spmd", "out of memory");
    if (rc == 0) rc = kiln_literal_create(NULL, &ts, 0, out, st);
    for (uint32_t i = 0; rc == 0 && i < p->nresults; i++) {
      if (!kiln_shape_is_array(&p->result_shapes[i])) {
        /* Replicated non-array element: device 0's. */
        kiln_literal *c;
        if ((rc = kiln_literal_clone((*out)->own, outs[0]->elems[i], &c, st)) == 0)
          (*out)->elems[i] = c;
        continue;
      }
      rc = assemble_one(p, a, i, outs, (*out)->elems[i], st);
    }
  } else {
    rc = kiln_literal_create(NULL, &p->result_shapes[0], 0, out, st);
    if (rc == 0) rc = assemble_one(p, a, 0, outs, *out, st);
  }
  if (rc) {
    kiln_literal_destroy(*out);
    *out = NULL;
  }
  kiln_arena_destroy(a);
  return rc;
}

static int64_t bytes_of(const kiln_shape *s) {
  if (kiln_shape_is_tuple(s)) {
    int64_t b = 0;
    for (uint32_t i = 0; i < s->rank; i++) b += bytes_of(&s->tuple[i]);
    return b;
  }
  int64_t b = kiln_shape_bytes(s);
  return b > 0 ? b : 0;
}

void kiln_spmd_count_collectives(const kiln_module *m, kiln_spmd_stats *stats) {
  memset(stats, 0, sizeof *stats);
  /* only computations that run: those the entry reaches (a region body
   * propagation replaced by a split copy is left behind unused) */
  uint32_t *order = NULL, norder = 0;
  bool *live = kiln_calloc(m->ncomps + 1, sizeof *live);
  if (live && kiln_module_post_order(m, &order, &norder) == 0)
    for (uint32_t i = 0; i < norder; i++)
      if (order[i] < m->ncomps) live[order[i]] = true;
  bool all = live == NULL || order == NULL;
  kiln_free(order);
  for (uint32_t i = 0; i < m->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[i];
    if (ins->comp == KILN_NO_ID || (!all && (ins->comp >= m->ncomps || !live[ins->comp]))) continue;
    int k;
    bool result = false;
    switch (ins->op) {
    case KILN_OP_ALL_REDUCE: k = KILN_SPMD_ALL_REDUCE; break;
    case KILN_OP_ALL_GATHER: k = KILN_SPMD_ALL_GATHER, result = true; break;
    case KILN_OP_ALL_TO_ALL: k = KILN_SPMD_ALL_TO_ALL; break;
    case KILN_OP_COLLECTIVE_PERMUTE: k = KILN_SPMD_COLLECTIVE_PERMUTE; break;
    case KILN_OP_REDUCE_SCATTER: k = KILN_SPMD_REDUCE_SCATTER; break;
    default: continue;
    }
    stats->count[k]++;
    if (result) {
      stats->bytes[k] += bytes_of(&ins->shape);
    } else {
      for (uint32_t o = 0; o < ins->noperands; o++)
        stats->bytes[k] += bytes_of(&m->instrs[ins->operands[o]]->shape);
    }
  }
  kiln_free(live);
}
