/* Shape and literal conversion for replies and uploads (see convert.h).
 * Tuple nesting is bounded by the IR itself (the decoders refuse deeper
 * input), so the recursion here is bounded too.
 */
#include "server/convert.h"

#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "executor/buffers.h"

Kiln__V1__Shape *kilnd_shape_to_proto(kiln_arena *a, const kiln_shape *s) {
  Kiln__V1__Shape *ps = kiln_arena_alloc(a, sizeof *ps);
  if (ps == NULL) return NULL;
  kiln__v1__shape__init(ps);
  ps->element_type = (Kiln__V1__ElementType)s->dtype;
  if (kiln_shape_is_tuple(s)) {
    ps->n_tuple_shapes = s->rank;
    ps->tuple_shapes = kiln_arena_calloc(a, s->rank ? s->rank : 1, sizeof *ps->tuple_shapes);
    if (ps->tuple_shapes == NULL) return NULL;
    for (uint32_t i = 0; i < s->rank; i++)
      if ((ps->tuple_shapes[i] = kilnd_shape_to_proto(a, &s->tuple[i])) == NULL) return NULL;
    return ps;
  }
  ps->n_dimensions = s->rank;
  ps->dimensions = s->rank ? s->dims : NULL;
  if (s->dynamic) {
    ps->n_is_dynamic_dimension = s->rank;
    ps->is_dynamic_dimension = kiln_arena_calloc(a, s->rank, sizeof(protobuf_c_boolean));
    if (ps->is_dynamic_dimension == NULL) return NULL;
    for (uint32_t i = 0; i < s->rank; i++) ps->is_dynamic_dimension[i] = s->dynamic[i] != 0;
  }
  if (s->layout) {
    Kiln__V1__Layout *pl = kiln_arena_alloc(a, sizeof *pl);
    if (pl == NULL) return NULL;
    kiln__v1__layout__init(pl);
    pl->n_minor_to_major = s->layout->rank;
    pl->minor_to_major = s->layout->rank ? s->layout->minor_to_major : NULL;
    pl->tail = (char *)(s->layout->tail ? s->layout->tail : "");
    pl->memory_space = s->layout->memory_space;
    ps->layout = pl;
  }
  return ps;
}

static Kiln__V1__Literal *literal_rec(kiln_arena *a, const kiln_literal *lit, bool with_shape) {
  Kiln__V1__Literal *pl = kiln_arena_alloc(a, sizeof *pl);
  if (pl == NULL) return NULL;
  kiln__v1__literal__init(pl);
  if (with_shape && (pl->shape = kilnd_shape_to_proto(a, &lit->shape)) == NULL) return NULL;
  if (kiln_shape_is_tuple(&lit->shape)) {
    uint32_t n = lit->shape.rank;
    pl->n_tuple_literals = n;
    pl->tuple_literals = kiln_arena_calloc(a, n ? n : 1, sizeof *pl->tuple_literals);
    if (pl->tuple_literals == NULL) return NULL;
    for (uint32_t i = 0; i < n; i++)
      if ((pl->tuple_literals[i] = literal_rec(a, lit->elems[i], false)) == NULL) return NULL;
    return pl;
  }
  /* Literal data is little-endian on the wire, as the IR keeps it on the
   * little-endian hosts kilnd runs on. */
  _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kilnd assumes a little-endian host");
  pl->data.len = lit->nbytes;
  pl->data.data = lit->nbytes ? lit->data : NULL;
  if (lit->dynamic_sizes) {
    pl->n_dynamic_sizes = lit->shape.rank;
    pl->dynamic_sizes = lit->dynamic_sizes;
  }
  return pl;
}

Kiln__V1__Literal *kilnd_literal_to_proto(kiln_arena *a, const kiln_literal *lit) {
  return literal_rec(a, lit, true);
}

static int dims_from_proto(const Kiln__V1__Shape *ps, uint64_t max_elements, const char *path,
                           kiln_status *st) {
  uint64_t elems = 1; /* saturates at max_elements + 1 */
  bool empty = false;
  for (size_t i = 0; i < ps->n_dimensions; i++) {
    int64_t d = ps->dimensions[i];
    if (d < 0 || d > (INT64_C(1) << 40))
      return kiln_status_set(st, KILN_EINVAL, path, "dimension %zu has size %lld", i, (long long)d);
    if (d == 0)
      empty = true;
    else if (elems > max_elements / (uint64_t)d)
      elems = max_elements + 1;
    else
      elems *= (uint64_t)d;
  }
  if (!empty && elems > max_elements)
    return kiln_status_set(st, KILN_ELIMIT, path,
                           "shape has more than %llu elements (max-elements)",
                           (unsigned long long)max_elements);
  return 0;
}

static int layout_from_proto(kiln_arena *a, const Kiln__V1__Layout *pl, kiln_shape *s,
                             const char *path, kiln_status *st) {
  if (pl == NULL || pl->n_minor_to_major == 0) return 0;
  if (pl->n_minor_to_major != s->rank)
    return kiln_status_set(st, KILN_EINVAL, path, "layout has %zu entries for rank %u",
                           pl->n_minor_to_major, s->rank);
  uint64_t seen = 0;
  for (size_t i = 0; i < pl->n_minor_to_major; i++) {
    int64_t d = pl->minor_to_major[i];
    if (d < 0 || d >= (int64_t)s->rank || (seen >> d & 1))
      return kiln_status_set(st, KILN_EINVAL, path, "layout is not a permutation of 0..%u",
                             s->rank - 1);
    seen |= UINT64_C(1) << d;
  }
  kiln_layout *l = kiln_arena_calloc(a, 1, sizeof *l);
  if (l == NULL) return KILN_ENOMEM;
  l->rank = s->rank;
  l->minor_to_major = kiln_arena_memdup(a, pl->minor_to_major, s->rank * sizeof(int64_t));
  if (l->minor_to_major == NULL) return KILN_ENOMEM;
  s->layout = l;
  return 0;
}

int kilnd_array_shape_from_proto(kiln_arena *a, const Kiln__V1__Shape *ps, uint64_t max_elements,
                                 const char *path, kiln_shape *out, kiln_status *st) {
  memset(out, 0, sizeof *out);
  if (ps == NULL) return kiln_status_set(st, KILN_EINVAL, path, "no shape");
  int t = (int)ps->element_type;
  if (t < 0 || t >= KILN_DTYPE_COUNT || !kiln_dtype_is_array((kiln_dtype)t))
    return kiln_status_set(st, KILN_EINVAL, path, "element type %d is not an array type", t);
  if (ps->n_tuple_shapes)
    return kiln_status_set(st, KILN_EINVAL, path, "tuple shapes cannot be stored as buffers");
  if (ps->n_dimensions > 64)
    return kiln_status_set(st, KILN_EINVAL, path, "rank %zu exceeds 64", ps->n_dimensions);
  for (size_t i = 0; i < ps->n_is_dynamic_dimension; i++)
    if (ps->is_dynamic_dimension[i])
      return kiln_status_set(st, KILN_EINVAL, path, "dynamic dimensions cannot be stored");
  int rc = dims_from_proto(ps, max_elements, path, st);
  if (rc) return rc;
  rc = kiln_shape_make_array(a, out, (kiln_dtype)t, ps->dimensions, (uint32_t)ps->n_dimensions);
  if (rc) return kiln_status_set(st, rc, path, "out of memory");
  rc = layout_from_proto(a, ps->layout, out, path, st);
  if (rc == KILN_ENOMEM) return kiln_status_set(st, rc, path, "out of memory");
  return rc;
}

void kilnd_shape_str(const kiln_shape *s, char *buf, size_t size) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_shape_print_short(&b, s);
  snprintf(buf, size, "%s", b.failed || b.data == NULL ? "?" : b.data);
  kiln_sbuf_free(&b);
}

Kiln__V1__BufferInfo *kilnd_buffer_info(kiln_arena *a, const kiln_stored *b) {
  Kiln__V1__BufferInfo *bi = kiln_arena_alloc(a, sizeof *bi);
  if (bi == NULL) return NULL;
  kiln__v1__buffer_info__init(bi);
  bi->handle = (char *)b->handle;
  bi->size_bytes = (int64_t)b->bytes;
  bi->device = b->device;
  /* GetBuffer sends row-major bytes whatever the device layout is */
  kiln_shape logical = *b->shape;
  if (!kiln_shape_is_row_major(&logical)) logical.layout = NULL;
  bi->shape = kilnd_shape_to_proto(a, &logical);
  return bi->shape ? bi : NULL;
}
