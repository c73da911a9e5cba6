/* Values on the wire: shapes, literals and buffer descriptions between
 * libkiln's types and the kiln.v1 messages.
 *
 * Encoding builds protobuf-c messages in a scratch arena that point at the
 * caller's shapes and data (nothing is copied until the message is packed).
 * Decoding treats the server's replies as input like any other: every enum,
 * size and count is checked, and a reply that does not hold together is a
 * DATA_LOSS error naming the field, never a crash. Literals reuse the proto
 * codec's decoder (the one the server applies to requests), then become
 * heap literals by handing them the arena they were decoded into.
 */
#include <string.h>

#include "clients/c/client_internal.h"
#include "common/alloc.h"
#include "compiler/ir/proto_internal.h"

#define NEW(a, T, init_fn, out) \
  do { \
    (out) = kiln_arena_alloc((a), sizeof(T)); \
    if ((out) == NULL) return KILN_ENOMEM; \
    init_fn(out); \
  } while (0)

/* ---- encoding ------------------------------------------------------------------- */

static int enc_shape(kiln_arena *a, const kiln_shape *s, unsigned depth, Kiln__V1__Shape **out) {
  if (depth > KILN_PROTO_MAX_TUPLE_DEPTH) return KILN_ELIMIT;
  Kiln__V1__Shape *ps;
  NEW(a, Kiln__V1__Shape, kiln__v1__shape__init, ps);
  *out = ps;
  /* hlo.proto's ElementType mirrors types.def number for number. */
  ps->element_type = (Kiln__V1__ElementType)s->dtype;
  if (kiln_shape_is_tuple(s)) {
    if (s->rank == 0) return 0;
    ps->tuple_shapes = kiln_arena_calloc(a, s->rank, sizeof *ps->tuple_shapes);
    if (ps->tuple_shapes == NULL) return KILN_ENOMEM;
    ps->n_tuple_shapes = s->rank;
    for (uint32_t i = 0; i < s->rank; i++) {
      int rc = enc_shape(a, &s->tuple[i], depth + 1, &ps->tuple_shapes[i]);
      if (rc) return rc;
    }
    return 0;
  }
  if (!kiln_shape_is_array(s)) return 0;
  ps->n_dimensions = s->rank;
  ps->dimensions = s->rank ? s->dims : NULL;
  if (s->dynamic) {
    ps->is_dynamic_dimension =
        kiln_arena_calloc(a, s->rank ? s->rank : 1, sizeof(protobuf_c_boolean));
    if (ps->is_dynamic_dimension == NULL) return KILN_ENOMEM;
    ps->n_is_dynamic_dimension = s->rank;
    for (uint32_t i = 0; i < s->rank; i++) ps->is_dynamic_dimension[i] = s->dynamic[i] != 0;
  }
  if (s->layout) {
    Kiln__V1__Layout *pl;
    NEW(a, Kiln__V1__Layout, kiln__v1__layout__init, pl);
    pl->n_minor_to_major = s->layout->rank;
    pl->minor_to_major = s->layout->rank ? s->layout->minor_to_major : NULL;
    pl->tail = (char *)(s->layout->tail ? s->layout->tail : "");
    pl->memory_space = s->layout->memory_space;
    ps->layout = pl;
  }
  return 0;
}

int kiln__shape_encode(kiln_arena *a, const kiln_shape *s, Kiln__V1__Shape **out) {
  return enc_shape(a, s, 0, out);
}

static int enc_literal(kiln_arena *a, const kiln_literal *lit, bool with_shape, unsigned depth,
                       Kiln__V1__Literal **out) {
  if (depth > KILN_PROTO_MAX_TUPLE_DEPTH) return KILN_ELIMIT;
  Kiln__V1__Literal *pl;
  NEW(a, Kiln__V1__Literal, kiln__v1__literal__init, pl);
  *out = pl;
  int rc;
  if (with_shape && (rc = enc_shape(a, &lit->shape, 0, &pl->shape))) return rc;
  if (kiln_shape_is_tuple(&lit->shape)) {
    if (lit->shape.rank == 0) return 0;
    pl->tuple_literals = kiln_arena_calloc(a, lit->shape.rank, sizeof *pl->tuple_literals);
    if (pl->tuple_literals == NULL) return KILN_ENOMEM;
    pl->n_tuple_literals = lit->shape.rank;
    for (uint32_t i = 0; i < lit->shape.rank; i++)
      if ((rc = enc_literal(a, lit->elems[i], false, depth + 1, &pl->tuple_literals[i]))) return rc;
    return 0;
  }
  /* Little-endian hosts only: the data goes out as it is in memory. */
  pl->data.len = lit->nbytes;
  pl->data.data = lit->nbytes ? lit->data : NULL;
  if (lit->dynamic_sizes && lit->shape.rank) {
    pl->n_dynamic_sizes = lit->shape.rank;
    pl->dynamic_sizes = lit->dynamic_sizes;
  }
  return 0;
}

int kiln__literal_encode(kiln_arena *a, const kiln_literal *lit, Kiln__V1__Literal **out) {
  return enc_literal(a, lit, true, 0, out);
}

/* ---- decoding ------------------------------------------------------------------- */

static int bad(kiln_status *st, const char *what, const char *msg) {
  return kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server sent a malformed %s: %s", what, msg);
}

static int dec_layout(kiln_arena *a, const Kiln__V1__Layout *pl, kiln_shape *s, const char *what,
                      kiln_status *st) {
  if (pl->n_minor_to_major != s->rank) return bad(st, what, "layout rank differs from the shape's");
  kiln_layout *l = kiln_arena_calloc(a, 1, sizeof *l);
  if (l == NULL) return kiln__client_oom(st);
  l->rank = s->rank;
  if (s->rank) {
    l->minor_to_major = kiln_arena_alloc(a, s->rank * sizeof(int64_t));
    uint8_t *seen = kiln_arena_calloc(a, s->rank, 1);
    if (l->minor_to_major == NULL || seen == NULL) return kiln__client_oom(st);
    for (uint32_t i = 0; i < s->rank; i++) {
      int64_t d = pl->minor_to_major[i];
      if (d < 0 || d >= (int64_t)s->rank || seen[d])
        return bad(st, what, "layout is not a permutation of the dimensions");
      seen[d] = 1;
      l->minor_to_major[i] = d;
    }
  }
  if (pl->tail && pl->tail[0] && (l->tail = kiln_arena_strdup(a, pl->tail)) == NULL)
    return kiln__client_oom(st);
  l->memory_space = pl->memory_space;
  s->layout = l;
  return 0;
}

static int dec_shape(kiln_arena *a, const Kiln__V1__Shape *ps, const char *what, unsigned depth,
                     kiln_shape *out, kiln_status *st) {
  if (depth > KILN_PROTO_MAX_TUPLE_DEPTH) return bad(st, what, "tuple shapes nested too deep");
  int t = (int)ps->element_type;
  if (t == KILN_TUPLE) {
    kiln_shape *elems = NULL;
    if (ps->n_tuple_shapes > UINT32_MAX / 2) return bad(st, what, "too many tuple elements");
    if (ps->n_tuple_shapes) {
      elems = kiln_arena_calloc(a, ps->n_tuple_shapes, sizeof *elems);
      if (elems == NULL) return kiln__client_oom(st);
    }
    for (size_t i = 0; i < ps->n_tuple_shapes; i++) {
      int rc = dec_shape(a, ps->tuple_shapes[i], what, depth + 1, &elems[i], st);
      if (rc) return rc;
    }
    if (kiln_shape_make_tuple(a, out, elems, (uint32_t)ps->n_tuple_shapes))
      return kiln__client_oom(st);
    return 0;
  }
  if (t <= KILN_INVALID || t >= KILN_DTYPE_COUNT || t == KILN_OPAQUE)
    return bad(st, what, "element type out of range");
  if (ps->n_tuple_shapes) return bad(st, what, "an array shape with tuple elements");
  if (t == KILN_TOKEN) {
    if (ps->n_dimensions) return bad(st, what, "a token with dimensions");
    return kiln_shape_make_array(a, out, KILN_TOKEN, NULL, 0) ? kiln__client_oom(st) : 0;
  }
  if (ps->n_dimensions > 64) return bad(st, what, "rank over 64");
  for (size_t i = 0; i < ps->n_dimensions; i++)
    if (ps->dimensions[i] < 0 || ps->dimensions[i] > KILN_PROTO_MAX_DIM)
      return bad(st, what, "dimension size out of range");
  if (kiln_shape_make_array(a, out, (kiln_dtype)t, ps->dimensions, (uint32_t)ps->n_dimensions))
    return kiln__client_oom(st);
  if (kiln_shape_bytes(out) < 0) return bad(st, what, "size overflows");
  if (ps->n_is_dynamic_dimension) {
    if (ps->n_is_dynamic_dimension != ps->n_dimensions)
      return bad(st, what, "dynamic flags differ in number from the dimensions");
    out->dynamic = kiln_arena_calloc(a, out->rank ? out->rank : 1, 1);
    if (out->dynamic == NULL) return kiln__client_oom(st);
    for (uint32_t i = 0; i < out->rank; i++) out->dynamic[i] = ps->is_dynamic_dimension[i] != 0;
  }
  return ps->layout ? dec_layout(a, ps->layout, out, what, st) : 0;
}

int kiln__shape_decode(kiln_arena *a, const Kiln__V1__Shape *ps, const char *what, kiln_shape *out,
                       kiln_status *st) {
  memset(out, 0, sizeof *out);
  if (ps == NULL) return bad(st, what, "no shape");
  return dec_shape(a, ps, what, 0, out, st);
}

int kiln__literal_decode(const Kiln__V1__Literal *pl, const char *what, kiln_literal **out,
                         kiln_status *st) {
  *out = NULL;
  kiln_arena *a = kiln_arena_create();
  if (a == NULL) return kiln__client_oom(st);
  kiln_status local;
  kiln_status_clear(&local);
  kiln_literal *lit;
  int rc = kiln__proto_literal_decode(a, pl, what, &lit, &local);
  if (rc == KILN_ENOMEM) {
    rc = kiln__client_oom(st);
  } else if (rc) {
    rc = kiln__client_fail(st, KILN_RPC_DATA_LOSS, "the server sent a malformed literal: %s%s%s",
                           local.where, local.where[0] ? ": " : "", local.msg);
  } else {
    lit->own = a; /* the literal and everything it points to live in a */
    *out = lit;
    return 0;
  }
  kiln_arena_destroy(a);
  return rc;
}

int kiln__remote_buffer_decode(const Kiln__V1__BufferInfo *pi, kiln_remote_buffer *b,
                               kiln_status *st) {
  memset(b, 0, sizeof *b);
  if (pi == NULL) return bad(st, "buffer description", "none sent");
  if (pi->handle == NULL || pi->handle[0] == '\0')
    return bad(st, "buffer description", "no handle");
  b->arena = kiln_arena_create();
  if (b->arena == NULL) return kiln__client_oom(st);
  int rc = kiln__shape_decode(b->arena, pi->shape, "buffer shape", &b->shape, st);
  if (rc == 0 && !kiln_shape_is_array(&b->shape))
    rc = bad(st, "buffer description", "the shape is not an array");
  if (rc == 0 && pi->size_bytes != kiln_shape_bytes(&b->shape))
    rc = bad(st, "buffer description", "size_bytes differs from the shape's size");
  if (rc == 0 && (b->handle = kiln_arena_strdup(b->arena, pi->handle)) == NULL)
    rc = kiln__client_oom(st);
  if (rc) {
    kiln_remote_buffer_clear(b);
    return rc;
  }
  b->size_bytes = pi->size_bytes;
  b->device = pi->device;
  return 0;
}

void kiln_remote_buffer_clear(kiln_remote_buffer *b) {
  if (b == NULL) return;
  kiln_arena_destroy(b->arena);
  memset(b, 0, sizeof *b);
}
