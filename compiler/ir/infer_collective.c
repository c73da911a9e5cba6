/* Shape inference for collectives: all-reduce, all-gather, reduce-scatter,
 * all-to-all, ragged-all-to-all, collective-permute, collective-broadcast
 * and their -start/-done forms.
 *
 * all-gather and reduce-scatter change one dimension by the group size. It
 * comes from replica_groups (list or iota form); with no groups written it is
 * the module's replica count (times partitions with use_global_device_ids),
 * and when the module does not say either, it is read back from the written
 * result shape (the operand dimension must divide it evenly). Replica groups
 * must partition the devices: no id twice, and for the shape-changing ops
 * every group of one size.
 */
#include <stdlib.h>
#include <string.h>

#include "compiler/ir/infer_internal.h"

bool kiln__is_collective_op(kiln_opcode op) {
  switch (op) {
  case KILN_OP_ALL_REDUCE:
  case KILN_OP_ALL_REDUCE_START:
  case KILN_OP_ALL_REDUCE_DONE:
  case KILN_OP_ALL_GATHER:
  case KILN_OP_ALL_GATHER_START:
  case KILN_OP_ALL_GATHER_DONE:
  case KILN_OP_REDUCE_SCATTER:
  case KILN_OP_ALL_TO_ALL:
  case KILN_OP_RAGGED_ALL_TO_ALL:
  case KILN_OP_COLLECTIVE_PERMUTE:
  case KILN_OP_COLLECTIVE_PERMUTE_START:
  case KILN_OP_COLLECTIVE_PERMUTE_DONE:
  case KILN_OP_COLLECTIVE_BROADCAST: return true;
  default: return false;
  }
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static int check_iota_groups(kiln__ictx *cx, const kiln_replica_groups *g, int64_t *size) {
  if (g->iota_shape.n != 2 || !g->iota_shape.v || g->iota_shape.v[0] <= 0 ||
      g->iota_shape.v[1] <= 0)
    return kiln__fail(cx, "replica_groups: the iota form needs a shape [groups,size] of positive "
                          "sizes");
  int64_t total, prod = 1;
  if (!kiln__mul(g->iota_shape.v[0], g->iota_shape.v[1], &total))
    return kiln__fail(cx, "replica_groups: the iota shape overflows");
  if (g->iota_reshape.n && !g->iota_reshape.v) return kiln__fail(cx, "replica_groups: bad iota");
  for (uint32_t i = 0; i < g->iota_reshape.n; i++)
    if (g->iota_reshape.v[i] <= 0 || !kiln__mul(prod, g->iota_reshape.v[i], &prod))
      return kiln__fail(cx, "replica_groups: the iota reshape dims must be positive");
  if (g->iota_reshape.n && prod != total)
    return kiln__fail(cx,
                      "replica_groups: the iota reshape %s has %lld devices but the groups "
                      "hold %lld",
                      kiln__ints(cx, g->iota_reshape.v, g->iota_reshape.n), (long long)prod,
                      (long long)total);
  if (g->iota_perm.n) {
    if (g->iota_perm.n != g->iota_reshape.n || !g->iota_perm.v)
      return kiln__fail(cx, "replica_groups: the iota transpose has %u entries, expected %u",
                        (unsigned)g->iota_perm.n, (unsigned)g->iota_reshape.n);
    int rc = kiln__check_dims(cx, "replica_groups transpose", g->iota_perm.v, g->iota_perm.n,
                              g->iota_perm.n);
    if (rc) return rc;
  }
  *size = g->iota_shape.v[1];
  return 0;
}

/* *size: the members per group, or 0 when it cannot be known here. */
static int check_groups(kiln__ictx *cx, bool equal_sizes, int64_t *size) {
  const kiln_attr *a = kiln_instr_attr(cx->ins, KILN_ATTR_REPLICA_GROUPS);
  const kiln_replica_groups *g = a ? a->v.groups : NULL;
  *size = 0;
  if (g && g->iota) return check_iota_groups(cx, g, size);
  if (g && g->ngroups) {
    if (g->groups == NULL) return kiln__fail(cx, "replica_groups: the group list is missing");
    size_t total = 0;
    for (uint32_t i = 0; i < g->ngroups; i++) {
      if (g->groups[i].n == 0 || g->groups[i].v == NULL)
        return kiln__fail(cx, "replica_groups: group %u is empty", (unsigned)i);
      if (equal_sizes && g->groups[i].n != g->groups[0].n)
        return kiln__fail(cx, "replica_groups: group %u has %u members but group 0 has %u",
                          (unsigned)i, (unsigned)g->groups[i].n, (unsigned)g->groups[0].n);
      total += g->groups[i].n;
    }
    int64_t *ids = kiln_arena_calloc(cx->tmp, total, sizeof *ids);
    if (ids == NULL) return kiln__oom(cx);
    size_t k = 0;
    for (uint32_t i = 0; i < g->ngroups; i++)
      for (uint32_t j = 0; j < g->groups[i].n; j++) {
        if (g->groups[i].v[j] < 0)
          return kiln__fail(cx, "replica_groups: id %lld is negative",
                            (long long)g->groups[i].v[j]);
        ids[k++] = g->groups[i].v[j];
      }
    qsort(ids, total, sizeof *ids, cmp_i64);
    for (size_t i = 1; i < total; i++)
      if (ids[i] == ids[i - 1])
        return kiln__fail(cx, "replica_groups: id %lld appears twice", (long long)ids[i]);
    *size = g->groups[0].n;
    return 0;
  }
  int64_t global = kiln_instr_attr_int(cx->ins, KILN_ATTR_USE_GLOBAL_DEVICE_IDS, 0);
  int64_t r = cx->m->replica_count, p = cx->m->num_partitions;
  if (r > 0) *size = global ? (p > 0 && kiln__mul(r, p, &r) ? r : 0) : r;
  return 0;
}

static int check_pairs(kiln__ictx *cx) {
  const kiln_i64s *v = kiln_instr_attr_ints(cx->ins, KILN_ATTR_SOURCE_TARGET_PAIRS);
  if (v == NULL || v->n == 0) return 0;
  if (v->n % 2 || v->v == NULL) return kiln__fail(cx, "source_target_pairs must hold pairs");
  for (uint32_t i = 0; i < v->n; i += 2) {
    if (v->v[i] < 0 || v->v[i + 1] < 0)
      return kiln__fail(cx, "source_target_pairs: pair {%lld,%lld} has a negative id",
                        (long long)v->v[i], (long long)v->v[i + 1]);
    for (uint32_t j = 0; j < i; j += 2) {
      if (v->v[j] == v->v[i])
        return kiln__fail(cx, "source_target_pairs: source %lld appears twice", (long long)v->v[i]);
      if (v->v[j + 1] == v->v[i + 1])
        return kiln__fail(cx, "source_target_pairs: target %lld appears twice",
                          (long long)v->v[i + 1]);
    }
  }
  return 0;
}

static int all_arrays(kiln__ictx *cx, uint32_t lo) {
  int rc = kiln__expect_operands(cx, lo, -1);
  for (uint32_t i = 0; !rc && i < cx->ins->noperands; i++) rc = kiln__expect_array(cx, i, NULL);
  return rc;
}

/* A scalar binary reducer over the operands' element type. */
static int check_collective_reducer(kiln__ictx *cx) {
  kiln__sig g;
  int rc;
  if ((rc = kiln__expect_called(cx, 1)) || (rc = kiln__called_sig(cx, 0, "to_apply", &g)))
    return rc;
  if (g.nparams != 2)
    return kiln__fail(cx, "to_apply %%%s takes %u parameters, expected 2", g.c->name,
                      (unsigned)g.nparams);
  const kiln_shape *r = g.result;
  if (!kiln_shape_is_array(r) || r->rank != 0)
    return kiln__fail(cx, "to_apply %%%s returns %s, expected a scalar", g.c->name,
                      kiln__sh(cx, r));
  for (uint32_t i = 0; i < 2; i++)
    if (!kiln__compatible(g.params[i], r, false))
      return kiln__fail(cx, "to_apply %%%s parameter %u has type %s but it returns %s", g.c->name,
                        (unsigned)i, kiln__sh(cx, g.params[i]), kiln__sh(cx, r));
  for (uint32_t i = 0; i < cx->ins->noperands; i++)
    if (!kiln__same_type_ignoring_fp(kiln__oshape(cx, i)->dtype, r->dtype))
      return kiln__fail(cx, "%s has type %s but to_apply %%%s reduces %s", kiln__on(cx, i),
                        kiln__sh(cx, kiln__oshape(cx, i)), g.c->name, kiln_dtype_name(r->dtype));
  return 0;
}

static int operands_or_tuple(kiln__ictx *cx, kiln_shape *out) {
  uint32_t n = cx->ins->noperands;
  if (n == 1) return kiln__copy(cx, out, kiln__oshape(cx, 0));
  const kiln_shape **el = kiln_arena_calloc(cx->tmp, n, sizeof *el);
  if (el == NULL) return kiln__oom(cx);
  for (uint32_t i = 0; i < n; i++) el[i] = kiln__oshape(cx, i);
  return kiln__make_tuple(cx, out, el, n);
}

/* The result the written shape gives for operand i (for reading the group
 * size back), or NULL. */
static const kiln_shape *written_result(kiln__ictx *cx, uint32_t i) {
  const kiln_shape *w = cx->written;
  if (w == NULL) return NULL;
  if (cx->ins->op == KILN_OP_ALL_GATHER_START) {
    if (!kiln_shape_is_tuple(w) || w->rank < 2) return NULL;
    w = &w->tuple[1];
  }
  if (cx->ins->noperands == 1) return kiln_shape_is_array(w) ? w : NULL;
  return kiln_shape_is_tuple(w) && i < w->rank ? &w->tuple[i] : NULL;
}

/* all-gather (grow) and reduce-scatter (shrink) of dimension d by the group
 * size. */
static int resize_dim(kiln__ictx *cx, kiln_shape *out, bool grow) {
  int rc;
  int64_t size = 0;
  kiln_i64s d = {0};
  uint32_t n = cx->ins->noperands;
  if ((rc = all_arrays(cx, 1)) || (rc = check_groups(cx, true, &size)) ||
      (rc = kiln__attr_ints(cx, KILN_ATTR_DIMENSIONS, true, &d)))
    return rc;
  if (d.n != 1)
    return kiln__fail(cx, "dimensions=%s must name exactly one dimension",
                      kiln__ints(cx, d.v, d.n));
  for (uint32_t i = 0; i < n; i++)
    if ((rc = kiln__check_dims(cx, "dimensions", d.v, 1, kiln__oshape(cx, i)->rank))) return rc;
  int64_t dim = d.v[0];
  if (size == 0) {
    /* Unknown group size: read it back from the written result. */
    const kiln_shape *s = kiln__oshape(cx, 0), *w = written_result(cx, 0);
    if (w == NULL) return kiln__need_written(cx, "the group size is not known");
    int64_t a = s->dims[dim], b = w->rank == s->rank ? w->dims[dim] : -1;
    int64_t big = grow ? b : a, small = grow ? a : b;
    if (small <= 0 || big < 0 || big % small)
      return kiln__fail(cx, "the result %s is not %s of %s along dimension %lld", kiln__sh(cx, w),
                        grow ? "a whole multiple" : "an even split", kiln__on(cx, 0),
                        (long long)dim);
    size = big / small;
  }
  kiln_shape *per = kiln_arena_calloc(cx->out, n, sizeof *per);
  if (per == NULL) return kiln__oom(cx);
  for (uint32_t i = 0; i < n; i++) {
    const kiln_shape *s = kiln__oshape(cx, i);
    if ((rc = kiln__copy(cx, &per[i], s))) return rc;
    if (grow) {
      if (!kiln__mul(s->dims[dim], size, &per[i].dims[dim]))
        return kiln__fail(cx, "the gathered dimension of %s overflows", kiln__on(cx, i));
    } else {
      if (s->dims[dim] % size)
        return kiln__fail(cx,
                          "%s dimension %lld has size %lld, not a multiple of the group size "
                          "%lld",
                          kiln__on(cx, i), (long long)dim, (long long)s->dims[dim],
                          (long long)size);
      per[i].dims[dim] = s->dims[dim] / size;
    }
  }
  if (n == 1) {
    *out = per[0];
    return 0;
  }
  memset(out, 0, sizeof *out);
  out->dtype = KILN_TUPLE;
  out->rank = n;
  out->tuple = per;
  return 0;
}

static int infer_all_gather_start(kiln__ictx *cx, kiln_shape *out) {
  kiln_shape in, res;
  int rc;
  if ((rc = resize_dim(cx, &res, true)) || (rc = operands_or_tuple(cx, &in))) return rc;
  const kiln_shape *el[2] = {&in, &res};
  return kiln__with_context(cx, out, el, 2);
}

static int infer_all_to_all(kiln__ictx *cx, kiln_shape *out) {
  int rc;
  int64_t size = 0;
  if ((rc = all_arrays(cx, 1)) || (rc = check_groups(cx, true, &size))) return rc;
  kiln_i64s dv = {0};
  if ((rc = kiln__attr_ints(cx, KILN_ATTR_DIMENSIONS, false, &dv))) return rc;
  const kiln_i64s *d = kiln_instr_has_attr(cx->ins, KILN_ATTR_DIMENSIONS) ? &dv : NULL;
  if (d) {
    if (cx->ins->noperands != 1)
      return kiln__fail(cx, "with a split dimension it takes 1 operand, found %u",
                        (unsigned)cx->ins->noperands);
    if (d->n != 1)
      return kiln__fail(cx, "dimensions=%s must name exactly one dimension",
                        kiln__ints(cx, d->v, d->n));
    const kiln_shape *s = kiln__oshape(cx, 0);
    if ((rc = kiln__check_dims(cx, "dimensions", d->v, 1, s->rank))) return rc;
    if (size > 0 && s->dims[d->v[0]] % size)
      return kiln__fail(
          cx, "%s dimension %lld has size %lld, not a multiple of the group size %lld",
          kiln__on(cx, 0), (long long)d->v[0], (long long)s->dims[d->v[0]], (long long)size);
    return kiln__copy(cx, out, s);
  }
  for (uint32_t i = 1; i < cx->ins->noperands; i++)
    if (!kiln__compatible(kiln__oshape(cx, i), kiln__oshape(cx, 0), false))
      return kiln__fail(cx, "%s has shape %s but %s has shape %s", kiln__on(cx, i),
                        kiln__sh(cx, kiln__oshape(cx, i)), kiln__on(cx, 0),
                        kiln__sh(cx, kiln__oshape(cx, 0)));
  const kiln_shape **el = kiln_arena_calloc(cx->tmp, cx->ins->noperands, sizeof *el);
  if (el == NULL) return kiln__oom(cx);
  for (uint32_t i = 0; i < cx->ins->noperands; i++) el[i] = kiln__oshape(cx, i);
  return kiln__make_tuple(cx, out, el, cx->ins->noperands);
}

static int infer_ragged_all_to_all(kiln__ictx *cx, kiln_shape *out) {
  int rc;
  int64_t size = 0;
  if ((rc = all_arrays(cx, 6)) || (rc = check_groups(cx, false, &size))) return rc;
  const kiln_shape *in = kiln__oshape(cx, 0), *o = kiln__oshape(cx, 1);
  if (!kiln__same_type_ignoring_fp(in->dtype, o->dtype) || in->rank != o->rank)
    return kiln__fail(cx, "%s (the output buffer) has shape %s but %s has shape %s",
                      kiln__on(cx, 1), kiln__sh(cx, o), kiln__on(cx, 0), kiln__sh(cx, in));
  for (uint32_t i = 2; i < 6; i++)
    if (!kiln_dtype_is_integral(kiln__oshape(cx, i)->dtype))
      return kiln__fail(cx, "%s holds offsets or sizes and must have an integer type, found %s",
                        kiln__on(cx, i), kiln__sh(cx, kiln__oshape(cx, i)));
  return kiln__copy(cx, out, o);
}

static int infer_collective_permute(kiln__ictx *cx, kiln_shape *out, bool start) {
  int rc;
  uint32_t n = cx->ins->noperands;
  if (n != 1 && n != 4)
    return kiln__fail(cx, "takes 1 operand (or 4 in the in-place form), found %u", (unsigned)n);
  if ((rc = kiln__expect_array(cx, 0, NULL)) || (rc = check_pairs(cx))) return rc;
  const kiln_shape *res = kiln__oshape(cx, 0);
  if (n == 4) {
    res = kiln__oshape(cx, 1);
    if (!kiln__compatible(res, kiln__oshape(cx, 0), true))
      return kiln__fail(cx, "%s (the output buffer) has shape %s but %s has shape %s",
                        kiln__on(cx, 1), kiln__sh(cx, res), kiln__on(cx, 0),
                        kiln__sh(cx, kiln__oshape(cx, 0)));
  }
  if (!start) return kiln__copy(cx, out, res);
  const kiln_shape *el[2] = {kiln__oshape(cx, 0), res};
  return kiln__with_context(cx, out, el, 2);
}

/* all-gather-done, collective-permute-done: element 1 of their start. */
static int infer_done(kiln__ictx *cx, kiln_shape *out, kiln_opcode start) {
  const kiln_instr *p = kiln__operand(cx, 0);
  if (p->op != start)
    return kiln__fail(cx, "%s must be produced by %s, found %s", kiln__on(cx, 0),
                      kiln_opcode_name(start), kiln_opcode_name(p->op));
  if (start == KILN_OP_ALL_REDUCE_START) return kiln__copy(cx, out, &p->shape);
  if (!kiln_shape_is_tuple(&p->shape) || p->shape.rank < 2)
    return kiln__fail(cx, "%s has shape %s, expected a tuple of 2 or more elements",
                      kiln__on(cx, 0), kiln__sh(cx, &p->shape));
  return kiln__copy(cx, out, &p->shape.tuple[1]);
}

int kiln__infer_collective(kiln__ictx *cx, kiln_shape *out) {
  int rc;
  int64_t size = 0;
  switch (cx->ins->op) {
  case KILN_OP_ALL_REDUCE:
  case KILN_OP_ALL_REDUCE_START:
    if ((rc = all_arrays(cx, 1)) || (rc = check_groups(cx, false, &size)) ||
        (rc = check_collective_reducer(cx)))
      return rc;
    return operands_or_tuple(cx, out);
  case KILN_OP_ALL_REDUCE_DONE: return infer_done(cx, out, KILN_OP_ALL_REDUCE_START);
  case KILN_OP_ALL_GATHER: return resize_dim(cx, out, true);
  case KILN_OP_ALL_GATHER_START: return infer_all_gather_start(cx, out);
  case KILN_OP_ALL_GATHER_DONE: return infer_done(cx, out, KILN_OP_ALL_GATHER_START);
  case KILN_OP_REDUCE_SCATTER:
    if ((rc = all_arrays(cx, 1)) || (rc = check_collective_reducer(cx))) return rc;
    return resize_dim(cx, out, false);
  case KILN_OP_ALL_TO_ALL: return infer_all_to_all(cx, out);
  case KILN_OP_RAGGED_ALL_TO_ALL: return infer_ragged_all_to_all(cx, out);
  case KILN_OP_COLLECTIVE_PERMUTE: return infer_collective_permute(cx, out, false);
  case KILN_OP_COLLECTIVE_PERMUTE_START: return infer_collective_permute(cx, out, true);
  case KILN_OP_COLLECTIVE_PERMUTE_DONE:
    return infer_done(cx, out, KILN_OP_COLLECTIVE_PERMUTE_START);
  case KILN_OP_COLLECTIVE_BROADCAST:
    if ((rc = all_arrays(cx, 1)) || (rc = check_groups(cx, false, &size))) return rc;
    return operands_or_tuple(cx, out);
  default: return kiln__fail(cx, "no shape rule for this op");
  }
}
