/* Binding host literals to a cpu executable's parameters and results.
 *
 * Literals are row-major whatever their shape's layout says; a binding may
 * ask for another physical order (layout assignment chose it to make a
 * transpose free). A leaf already in the binding's order is passed to the
 * run in place, zero-copy, both ways: parameters point at the caller's
 * literal data, and output slots at the result literal's storage. Other
 * leaves go through a temporary buffer in the binding's order, and so do
 * parameter leaves donated to a result: the caller's literal is const.
 */
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "executor/cpu/cpu.h"

static void copy_elem(char *dst, const char *src, size_t esize) {
  switch (esize) {
  case 1: *dst = *src; break;
  case 2: memcpy(dst, src, 2); break;
  case 4: memcpy(dst, src, 4); break;
  case 8: memcpy(dst, src, 8); break;
  default: memcpy(dst, src, esize); break;
  }
}

void kiln__cpu_relayout(void *dst, const void *src, const kiln_shape *shape, int to_physical) {
  uint32_t rank = shape->rank;
  size_t esize = kiln_dtype_size(shape->dtype);
  int64_t n = kiln_shape_elements(shape);
  if (n <= 0) return;
  int64_t stride[64], idx[64] = {0}, m2m[64];
  kiln_shape_minor_to_major(shape, m2m);
  int64_t acc = 1;
  for (uint32_t i = 0; i < rank; i++) {
    stride[m2m[i]] = acc;
    acc *= shape->dims[m2m[i]];
  }
  /* Walk logical (row-major) order, keeping the physical offset. */
  int64_t phys = 0;
  for (int64_t lin = 0; lin < n; lin++) {
    char *d = (char *)dst + (size_t)(to_physical ? phys : lin) * esize;
    const char *s = (const char *)src + (size_t)(to_physical ? lin : phys) * esize;
    copy_elem(d, s, esize);
    for (uint32_t k = rank; k-- > 0;) {
      phys += stride[k];
      if (++idx[k] < shape->dims[k]) break;
      phys -= stride[k] * idx[k];
      idx[k] = 0;
    }
  }
}

/* Array leaves of a literal, depth-first (tokens have none). */
static void flatten(const kiln_literal *lit, const kiln_literal **out, uint32_t *k, uint32_t max) {
  if (lit->shape.dtype == KILN_TUPLE) {
    for (uint32_t i = 0; i < lit->shape.rank; i++) flatten(lit->elems[i], out, k, max);
  } else if (lit->shape.dtype != KILN_TOKEN && *k < max) {
    out[(*k)++] = lit;
  }
}

static int shape_mismatch(uint32_t p, const kiln_shape *got, const kiln_shape *want,
                          kiln_status *st) {
  kiln_sbuf a = KILN_SBUF_INIT, b = KILN_SBUF_INIT;
  kiln_shape_print_short(&a, got);
  kiln_shape_print_short(&b, want);
  int rc = kiln_status_set(st, KILN_EINVAL, "run", "argument %u: %.200s given, %.200s expected", p,
                           kiln_sbuf_str(&a), kiln_sbuf_str(&b));
  kiln_sbuf_free(&a);
  kiln_sbuf_free(&b);
  return rc;
}

/* Points params[] at the argument leaves, through a relayout where the
 * binding's layout is not row-major (temps[i] then owns the copy). */
static int bind_params(const kiln__cpu_loaded *l, const kiln_literal *const *args,
                       const void **params, void **temps, kiln_status *st) {
  const kiln_executable *e = l->exe;
  for (uint32_t p = 0; p < e->nparams; p++)
    if (!kiln_shape_equal(&args[p]->shape, &e->param_shapes[p], false))
      return shape_mismatch(p, &args[p]->shape, &e->param_shapes[p], st);
  const kiln_literal **leaves = kiln_calloc(e->nparam_leaves + 1, sizeof *leaves);
  if (leaves == NULL) return kiln_status_set(st, KILN_ENOMEM, "run", "out of memory");
  uint32_t k = 0;
  for (uint32_t p = 0; p < e->nparams; p++) flatten(args[p], leaves, &k, e->nparam_leaves);
  int rc = 0;
  for (uint32_t i = 0; i < e->nparam_leaves && rc == 0; i++) {
    const kiln_literal *leaf = leaves[i];
    const kiln_shape *bs = &e->params[i].shape;
    size_t bytes = (size_t)kiln_shape_bytes(bs);
    if (leaf->nbytes < bytes || (bytes > 0 && leaf->data == NULL)) {
      rc = kiln_status_set(st, KILN_EINVAL, "run",
                           "parameter leaf %u: %zu bytes of data, %zu needed", i, leaf->nbytes,
                           bytes);
    } else if (leaf->dynamic_sizes) {
      for (uint32_t d = 0; d < bs->rank && rc == 0; d++)
        if (leaf->dynamic_sizes[d] != bs->dims[d])
          rc = kiln_status_set(st, KILN_EUNIMPL, "run",
                               "parameter leaf %u: dynamic size %lld below its bound %lld", i,
                               (long long)leaf->dynamic_sizes[d], (long long)bs->dims[d]);
    }
    if (rc) break;
    params[i] = leaf->data;
    bool relayout = !kiln_shape_is_row_major(bs);
    if ((!relayout && !l->donated[i]) || bytes == 0) continue;
    void *raw;
    void *t = kiln__cpu_aligned_alloc(bytes, &raw);
    if (t == NULL) {
      rc =
          kiln_status_set(st, KILN_ENOMEM, "run", "out of memory relayouting parameter leaf %u", i);
      break;
    }
    temps[i] = raw;
    if (relayout)
      kiln__cpu_relayout(t, leaf->data, bs, 1);
    else
      memcpy(t, leaf->data, bytes); /* donated: the program writes it */
    params[i] = t;
  }
  kiln_free(leaves);
  return rc;
}

int kiln__cpu_run_literals(kiln_loaded *ld, const kiln_literal *const *args,
                           const kiln_run_options *opts, kiln_literal **out, kiln_status *st) {
  kiln__cpu_loaded *l = ld->ctx;
  const kiln_executable *e = ld->exe;
  uint32_t np = e->nparam_leaves, nr = e->nresults;
  kiln_literal *res = NULL;
  const kiln_literal **rleaves = kiln_calloc(nr + 1, sizeof *rleaves);
  const void **params = kiln_calloc(np + 1, sizeof *params);
  void **ptemps = kiln_calloc(np + 1, sizeof *ptemps);
  void **results = kiln_calloc(nr + 1, sizeof *results);
  void **rtemps = kiln_calloc(nr + 1, sizeof *rtemps);
  int rc = KILN_ENOMEM;
  if (!rleaves || !params || !ptemps || !results || !rtemps) {
    kiln_status_set(st, rc, "run", "out of memory");
    goto out_free;
  }
  if ((rc = bind_params(l, args, params, ptemps, st)) != 0) goto out_free;
  if ((rc = kiln_literal_create(NULL, &e->result_shape, l->dev->max_temp_bytes, &res, st)) != 0)
    goto out_free;
  uint32_t k = 0;
  flatten(res, rleaves, &k, nr);
  for (uint32_t i = 0; i < nr; i++) {
    const kiln_shape *bs = &e->results[i].shape;
    results[i] = rleaves[i]->data;
    if (kiln_shape_is_row_major(bs) || kiln_shape_bytes(bs) == 0) continue;
    results[i] = kiln__cpu_aligned_alloc((size_t)kiln_shape_bytes(bs), &rtemps[i]);
    if (results[i] == NULL) {
      rc = kiln_status_set(st, KILN_ENOMEM, "run", "out of memory for result leaf %u", i);
      goto out_free;
    }
  }
  if ((rc = kiln__cpu_run(l, params, results, opts, st)) != 0) goto out_free;
  for (uint32_t i = 0; i < nr; i++)
    if (rtemps[i]) kiln__cpu_relayout(rleaves[i]->data, results[i], &e->results[i].shape, 0);
  *out = res;
  res = NULL;
out_free:
  kiln_literal_destroy(res);
  for (uint32_t i = 0; ptemps && i < np; i++) kiln_free(ptemps[i]);
  for (uint32_t i = 0; rtemps && i < nr; i++) kiln_free(rtemps[i]);
  kiln_free(rleaves);
  kiln_free(params);
  kiln_free(ptemps);
  kiln_free(results);
  kiln_free(rtemps);
  return rc;
}
