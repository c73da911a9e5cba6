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

static int run_static(kiln_loaded *ld, const kiln_literal *const *args,
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

/* ---- bounded-dynamic programs ------------------------------------------- */

/* The array leaves of a literal, depth-first, into out (k of them). */
static void leaves_of(kiln_literal *lit, kiln_literal **out, uint32_t *k, uint32_t max) {
  if (lit->shape.dtype == KILN_TUPLE) {
    for (uint32_t i = 0; i < lit->shape.rank; i++) leaves_of(lit->elems[i], out, k, max);
  } else if (*k < max) {
    out[(*k)++] = lit;
  }
}

static bool dims_match(const kiln_shape *a, const kiln_shape *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (uint32_t i = 0; i < a->rank; i++)
    if (a->dtype == KILN_TUPLE ? !dims_match(&a->tuple[i], &b->tuple[i]) : a->dims[i] != b->dims[i])
      return false;
  return true;
}

static int64_t clamp_size(int64_t v, int64_t bound) { return v < 0 ? 0 : v > bound ? bound : v; }

/* The caller's result: the padded program's first element, with the
 * runtime sizes it returned after it (kiln_exe_dynamic). Sizes equal to
 * the bounds leave dynamic_sizes NULL, as the interpreter does. */
static int user_result(const kiln_exe_dynamic *d, kiln_literal *res, kiln_literal **out,
                       kiln_status *st) {
  kiln_literal *u = NULL;
  int rc = kiln_literal_create(NULL, &d->user_result, 0, &u, st);
  if (rc) return rc;
  uint32_t n = d->nuser_results, k = 0, j = 0;
  kiln_literal **to = kiln_calloc(n + 1, sizeof *to), **from = kiln_calloc(n + 1, sizeof *from);
  if (to == NULL || from == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, "run", "out of memory");
    goto out;
  }
  leaves_of(u, to, &k, n);
  leaves_of(res->elems[0], from, &j, n);
  for (uint32_t i = 0; i < k && i < j; i++)
    if (to[i]->nbytes == from[i]->nbytes && to[i]->nbytes)
      memcpy(to[i]->data, from[i]->data, to[i]->nbytes);
  for (uint32_t i = 0; i < d->nsize_results; i++) {
    const kiln_dyn_dim *z = &d->size_results[i];
    kiln_literal *leaf = z->leaf < k ? to[z->leaf] : NULL;
    if (leaf == NULL || z->dim >= leaf->shape.rank) continue; /* checked at load */
    int64_t bound = leaf->shape.dims[z->dim];
    int64_t v = clamp_size(*(const int32_t *)res->elems[1 + i]->data, bound);
    if (v == bound) continue;
    if (leaf->dynamic_sizes == NULL) {
      leaf->dynamic_sizes = kiln_arena_alloc(u->own, leaf->shape.rank * sizeof(int64_t));
      if (leaf->dynamic_sizes == NULL) {
        rc = kiln_status_set(st, KILN_ENOMEM, "run", "out of memory");
        goto out;
      }
      memcpy(leaf->dynamic_sizes, leaf->shape.dims, leaf->shape.rank * sizeof(int64_t));
    }
    leaf->dynamic_sizes[z->dim] = v;
  }
  *out = u;
  u = NULL;
out:
  kiln_free(to);
  kiln_free(from);
  kiln_literal_destroy(u);
  return rc;
}

/* A program with bounded-dynamic shapes: the caller's arguments (at their
 * bounds, with their runtime sizes) are passed as they are, then the sizes
 * as s32[] scalars; the result's sizes come back the same way. */
static int run_dynamic(kiln_loaded *ld, const kiln_literal *const *args,
                       const kiln_run_options *opts, kiln_literal **out, kiln_status *st) {
  const kiln_executable *e = ld->exe;
  const kiln_exe_dynamic *d = e->dyn;
  kiln_literal *views = kiln_calloc(e->nparams + 1, sizeof *views);
  const kiln_literal **argv = kiln_calloc(e->nparams + 1, sizeof *argv);
  int32_t *sizes = kiln_calloc(d->nsize_params + 1, sizeof *sizes);
  kiln_literal *res = NULL;
  int rc = 0;
  if (views == NULL || argv == NULL || sizes == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, "run", "out of memory");
    goto out;
  }
  for (uint32_t p = 0; p < d->nuser_params; p++) {
    const kiln_shape *want = &d->user_param_shapes[p];
    if (!dims_match(&args[p]->shape, want)) {
      rc = shape_mismatch(p, &args[p]->shape, want, st);
      goto out;
    }
    views[p] = *args[p];
    views[p].shape = e->param_shapes[p];
    views[p].dynamic_sizes = NULL;
    argv[p] = &views[p];
  }
  for (uint32_t i = 0; i < d->nsize_params; i++) {
    const kiln_dyn_dim *z = &d->size_params[i];
    const kiln_literal *a = args[z->leaf];
    int64_t bound = a->shape.dims[z->dim];
    sizes[i] = (int32_t)clamp_size(a->dynamic_sizes ? a->dynamic_sizes[z->dim] : bound, bound);
    kiln_literal *v = &views[d->nuser_params + i];
    v->shape = e->param_shapes[d->nuser_params + i];
    v->data = &sizes[i];
    v->nbytes = sizeof sizes[i];
    argv[d->nuser_params + i] = v;
  }
  if ((rc = run_static(ld, argv, opts, &res, st)) == 0) rc = user_result(d, res, out, st);
out:
  kiln_literal_destroy(res);
  kiln_free(views);
  kiln_free(argv);
  kiln_free(sizes);
  return rc;
}

int kiln__cpu_run_literals(kiln_loaded *ld, const kiln_literal *const *args,
                           const kiln_run_options *opts, kiln_literal **out, kiln_status *st) {
  if (ld->exe->dyn) return run_dynamic(ld, args, opts, out, st);
  return run_static(ld, args, opts, out, st);
}
