/* kiln.v1.Module -> IR, checking everything.
 *
 * The message comes from a client and is hostile until proven otherwise:
 * every enum is range-checked (proto3 enums are open, protobuf-c passes any
 * number through), every id and index is checked against what it refers to,
 * every size against the data behind it, and nesting against a depth limit,
 * so that nothing downstream (printer, verifier, passes) can be made to
 * index out of bounds, allocate without limit or recurse without end. The
 * result is structurally sound, not verified: op semantics are the
 * verifier's business.
 *
 * Each error is KILN_EINVAL with the field path in the message, in the
 * notation of the .proto field names:
 * "computations[0].instructions[3].operands[1]: id 99 out of range (module
 * has 12 instructions)".
 *
 * Instructions are created in id order, so that kiln_module_add_instr hands
 * out exactly the ids the message names, and each computation's order is
 * then set from the message.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/proto_internal.h"

#define PATH_MAX_LEN 480

typedef struct owner {
  uint32_t comp; /* UINT32_MAX: no instruction has this id (yet) */
  uint32_t index;
} owner;

typedef struct dec {
  kiln_module *m;
  kiln_arena *a;
  kiln_status *st;
  owner *owners; /* by id */
  uint32_t ninstrs;
  char path[PATH_MAX_LEN + 8];
  size_t plen;
  const char *ins_name; /* the constant whose literal is being decoded, or NULL */
  int64_t extra_arrays; /* of the literals decoded so far (check_arrays); at most the limit */
} dec;

/* ---- paths and errors ----------------------------------------------------- */

/* Paths are built as the decoder descends (every field it enters), so
 * pushing must be cheap: plain copies and a small integer formatter, no
 * printf. A segment that does not fit is left out whole: the path keeps its
 * head. */
static size_t push_seg(dec *d, const char *name, size_t nlen, const char *index, size_t ilen) {
  size_t old = d->plen;
  size_t dot = d->plen && name[0] != '[' ? 1 : 0;
  if (d->plen + dot + nlen + ilen > PATH_MAX_LEN) return old;
  char *p = d->path + d->plen;
  if (dot) *p++ = '.';
  memcpy(p, name, nlen);
  memcpy(p + nlen, index, ilen);
  d->plen += dot + nlen + ilen;
  d->path[d->plen] = '\0';
  return old;
}

/* Enters field `name`. */
static size_t push(dec *d, const char *name) {
  return push_seg(d, name, strnlen(name, PATH_MAX_LEN + 1), "", 0);
}

/* Enters element i of repeated field `name`: "name[i]". */
static size_t push_at(dec *d, const char *name, uint64_t i) {
  char digits[24], index[26];
  size_t nd = 0, n = 0;
  do {
    digits[nd++] = (char)('0' + i % 10);
    i /= 10;
  } while (i);
  index[n++] = '[';
  while (nd) index[n++] = digits[--nd];
  index[n++] = ']';
  return push_seg(d, name, strnlen(name, PATH_MAX_LEN + 1), index, n);
}

static void pop(dec *d, size_t old) {
  d->plen = old;
  d->path[old] = '\0';
}

static int fail(dec *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(dec *d, const char *fmt, ...) {
  char msg[KILN_STATUS_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (d->plen) return kiln_status_set(d->st, KILN_EINVAL, NULL, "%s: %s", d->path, msg);
  return kiln_status_set(d->st, KILN_EINVAL, NULL, "%s", msg);
}

/* fail() for the field `field` below the current path. */
static int fail_at(dec *d, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_at(dec *d, const char *field, const char *fmt, ...) {
  char msg[KILN_STATUS_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t old = push(d, field);
  int rc = fail(d, "%s", msg);
  pop(d, old);
  return rc;
}

static int oom(dec *d) {
  return kiln_status_set(d->st, KILN_ENOMEM, NULL, "out of memory decoding a module");
}

/* ---- small pieces ------------------------------------------------------------- */

static int copy_i64s(dec *d, const int64_t *v, size_t n, kiln_i64s *out) {
  out->v = NULL;
  out->n = 0;
  if (n == 0) return 0;
  if (n > UINT32_MAX) return fail(d, "%zu values are too many", n);
  out->v = kiln_arena_memdup(d->a, v, n * sizeof *v);
  if (out->v == NULL) return oom(d);
  out->n = (uint32_t)n;
  return 0;
}

/* Field `field` (a repeated int64) copied into `out`. */
static int i64s_at(dec *d, const char *field, const int64_t *v, size_t n, kiln_i64s *out) {
  size_t old = push(d, field);
  int rc = copy_i64s(d, v, n, out);
  pop(d, old);
  return rc;
}

/* NULL for "": the IR writes absence as NULL where the proto has "". */
static int opt_str(dec *d, const char *s, const char **out) {
  *out = NULL;
  if (s == NULL || s[0] == '\0') return 0;
  *out = kiln_arena_strdup(d->a, s);
  return *out ? 0 : oom(d);
}

static int need_name(dec *d, const char *s, const char **out) {
  if (s == NULL || s[0] == '\0') return fail_at(d, "name", "empty");
  *out = kiln_arena_strdup(d->a, s);
  return *out ? 0 : oom(d);
}

static bool too_deep(unsigned depth) { return depth > KILN_PROTO_MAX_TUPLE_DEPTH; }

/* ---- shapes ------------------------------------------------------------------------ */

static int dec_layout(dec *d, const Kiln__V1__Layout *pl, const kiln_shape *s, kiln_layout **out) {
  size_t old = push(d, "layout");
  int rc = 0;
  if (pl->n_minor_to_major != s->rank) {
    rc = fail_at(d, "minor_to_major", "%zu entries for a shape of rank %u", pl->n_minor_to_major,
                 s->rank);
    goto out;
  }
  kiln_layout *l = kiln_arena_calloc(d->a, 1, sizeof *l);
  uint8_t *seen = kiln_arena_calloc(d->a, s->rank ? s->rank : 1, 1);
  if (l == NULL || seen == NULL) {
    rc = oom(d);
    goto out;
  }
  for (uint32_t i = 0; i < s->rank; i++) {
    int64_t v = pl->minor_to_major[i];
    if (v < 0 || v >= (int64_t)s->rank || seen[v]) {
      size_t o2 = push_at(d, "minor_to_major", i);
      rc = v < 0 || v >= (int64_t)s->rank
               ? fail(d, "dimension %lld out of range for rank %u", (long long)v, s->rank)
               : fail(d, "dimension %lld listed twice", (long long)v);
      pop(d, o2);
      goto out;
    }
    seen[v] = 1;
  }
  l->rank = s->rank;
  if (s->rank) {
    l->minor_to_major = kiln_arena_memdup(d->a, pl->minor_to_major, s->rank * sizeof(int64_t));
    if (l->minor_to_major == NULL) {
      rc = oom(d);
      goto out;
    }
  }
  if ((rc = opt_str(d, pl->tail, &l->tail))) goto out;
  l->memory_space = pl->memory_space;
  *out = l;
out:
  pop(d, old);
  return rc;
}

static int dec_array_dims(dec *d, const Kiln__V1__Shape *ps, kiln_shape *s) {
  s->rank = (uint32_t)ps->n_dimensions;
  if (s->rank == 0) return 0;
  int64_t elems = 1;
  for (uint32_t i = 0; i < s->rank; i++) {
    int64_t v = ps->dimensions[i];
    size_t old = push_at(d, "dimensions", i);
    int rc = 0;
    if (v < 0)
      rc = fail(d, "size %lld is negative", (long long)v);
    else if (v > KILN_PROTO_MAX_DIM)
      rc = fail(d, "size %lld is over the limit of 2^40", (long long)v);
    pop(d, old);
    if (rc) return rc;
    /* Both factors are at most 2^40, so the check itself cannot overflow. */
    if (v != 0 && elems > KILN_PROTO_MAX_DIM / v)
      return fail_at(d, "dimensions", "more than 2^40 elements in all");
    elems *= v;
  }
  s->dims = kiln_arena_memdup(d->a, ps->dimensions, s->rank * sizeof(int64_t));
  if (s->dims == NULL) return oom(d);
  if (ps->n_is_dynamic_dimension == 0) return 0;
  if (ps->n_is_dynamic_dimension != s->rank)
    return fail_at(d, "is_dynamic_dimension", "%zu flags for %u dimensions",
                   ps->n_is_dynamic_dimension, s->rank);
  bool any = false;
  for (uint32_t i = 0; i < s->rank; i++) any |= ps->is_dynamic_dimension[i] != 0;
  if (!any) return 0; /* all static: the IR writes that as no flags */
  s->dynamic = kiln_arena_alloc(d->a, s->rank);
  if (s->dynamic == NULL) return oom(d);
  for (uint32_t i = 0; i < s->rank; i++) s->dynamic[i] = ps->is_dynamic_dimension[i] != 0;
  return 0;
}

static int dec_shape_rec(dec *d, const Kiln__V1__Shape *ps, kiln_shape *s, unsigned depth,
                         size_t root);

static int dec_tuple_shape(dec *d, const Kiln__V1__Shape *ps, kiln_shape *s, unsigned depth,
                           size_t root) {
  if (ps->n_dimensions) return fail_at(d, "dimensions", "a tuple has no dimensions");
  if (ps->n_is_dynamic_dimension)
    return fail_at(d, "is_dynamic_dimension", "a tuple has no dimensions");
  if (ps->layout) return fail_at(d, "layout", "a tuple has no layout");
  if (ps->n_tuple_shapes > UINT32_MAX - 1) return fail_at(d, "tuple_shapes", "too many elements");
  if (ps->n_tuple_shapes && too_deep(depth + 1)) {
    pop(d, root);
    return fail(d, "tuple shapes nested deeper than %d levels", KILN_PROTO_MAX_TUPLE_DEPTH);
  }
  s->rank = (uint32_t)ps->n_tuple_shapes;
  if (s->rank == 0) return 0;
  s->tuple = kiln_arena_calloc(d->a, s->rank, sizeof *s->tuple);
  if (s->tuple == NULL) return oom(d);
  for (uint32_t i = 0; i < s->rank; i++) {
    size_t old = push_at(d, "tuple_shapes", i);
    int rc = dec_shape_rec(d, ps->tuple_shapes[i], &s->tuple[i], depth + 1, root);
    if (rc) return rc; /* the path stays as the error left it */
    pop(d, old);
  }
  return 0;
}

static int dec_shape_rec(dec *d, const Kiln__V1__Shape *ps, kiln_shape *s, unsigned depth,
                         size_t root) {
  memset(s, 0, sizeof *s);
  if ((unsigned)ps->element_type >= KILN_DTYPE_COUNT)
    return fail_at(d, "element_type", "%d is not a kiln.v1.ElementType value",
                   (int)ps->element_type);
  s->dtype = (kiln_dtype)ps->element_type;
  if (s->dtype == KILN_TUPLE) return dec_tuple_shape(d, ps, s, depth, root);
  if (ps->n_tuple_shapes)
    return fail_at(d, "tuple_shapes", "only a tuple has element shapes, not %s",
                   kiln_dtype_name(s->dtype));
  if (!kiln_dtype_is_array(s->dtype)) {
    if (ps->n_dimensions)
      return fail_at(d, "dimensions", "%s has no dimensions", kiln_dtype_name(s->dtype));
    if (ps->n_is_dynamic_dimension)
      return fail_at(d, "is_dynamic_dimension", "%s has no dimensions", kiln_dtype_name(s->dtype));
    if (ps->layout) return fail_at(d, "layout", "%s has no layout", kiln_dtype_name(s->dtype));
    return 0;
  }
  int rc = dec_array_dims(d, ps, s);
  if (rc) return rc;
  return ps->layout ? dec_layout(d, ps->layout, s, &s->layout) : 0;
}

/* A shape in field `field` of the current message; `ps` may be NULL when
 * `required` is false (an absent shape is an invalid, not-yet-inferred one). */
static int dec_shape_at(dec *d, const char *field, const Kiln__V1__Shape *ps, bool required,
                        kiln_shape *s) {
  memset(s, 0, sizeof *s);
  if (ps == NULL) return required ? fail_at(d, field, "missing") : 0;
  size_t old = push(d, field);
  int rc = dec_shape_rec(d, ps, s, 0, d->plen);
  pop(d, old);
  return rc;
}

/* ---- literals ------------------------------------------------------------------------ */

/* The storage format of ir.h, checked element by element for the types
 * whose bytes have invalid values. */
static int check_elements(dec *d, const kiln_literal *lit) {
  kiln_dtype t = lit->shape.dtype;
  int bits = kiln_dtype_bits(t);
  bool pred = t == KILN_PRED, sint = kiln_dtype_is_signed_int(t) && bits < 8,
       uint = kiln_dtype_is_unsigned_int(t) && bits < 8;
  if (!pred && !sint && !uint) return 0;
  const uint8_t *b = lit->data;
  for (size_t i = 0; i < lit->nbytes; i++) {
    int v = sint ? (int)(int8_t)b[i] : (int)b[i];
    int lo = pred ? 0 : sint ? -(1 << (bits - 1)) : 0;
    int hi = pred ? 1 : sint ? (1 << (bits - 1)) - 1 : (1 << bits) - 1;
    if (v < lo || v > hi)
      return fail_at(d, "data", "element %zu (byte 0x%02x) is not a valid %s%s", i, b[i],
                     kiln_dtype_name(t),
                     pred   ? " (0 or 1)"
                     : sint ? " (sign-extended, one per byte)"
                            : " (zero-extended, one per byte)");
  }
  return 0;
}

/* The size of a literal's text, bounded before anyone prints it: the data
 * pays for the elements, the elements for up to 64 arrays (brace pairs)
 * each, which covers every literal of rank 64 or less that has one, and the
 * arrays beyond that come from a budget per message. Without it a message
 * of a few bytes prints without end: f32[2^20,2^20,0] holds nothing and
 * writes 2^40 "{}". (Dims are checked: elements are at most 2^40.) */
static int check_arrays(dec *d, const kiln_shape *s) {
  int64_t arrays = kiln_shape_literal_arrays(s), elems = kiln_shape_elements(s);
  int64_t paid = elems * KILN_PROTO_ARRAYS_PER_ELEMENT;
  int64_t extra = arrays < 0 ? INT64_MAX : arrays > paid ? arrays - paid : 0;
  if (extra <= KILN_PROTO_MAX_EXTRA_ARRAYS - d->extra_arrays) {
    d->extra_arrays += extra;
    return 0;
  }
  kiln_sbuf sb = KILN_SBUF_INIT;
  kiln_shape_print_short(&sb, s);
  char who[96] = "";
  if (d->ins_name) snprintf(who, sizeof who, "constant %.64s: ", d->ins_name);
  char n[32] = "more than 2^63";
  if (arrays >= 0) snprintf(n, sizeof n, "%lld", (long long)arrays);
  int rc =
      fail_at(d, "shape",
              "%s%s writes %s arrays ({...}) for %lld elements; the literals of one "
              "message may write %lld arrays beyond %d per element, %lld are taken",
              who, kiln_sbuf_str(&sb), n, (long long)elems, (long long)KILN_PROTO_MAX_EXTRA_ARRAYS,
              KILN_PROTO_ARRAYS_PER_ELEMENT, (long long)d->extra_arrays);
  kiln_sbuf_free(&sb);
  return rc;
}

static int dec_array_literal(dec *d, const Kiln__V1__Literal *pl, kiln_literal *lit) {
  const kiln_shape *s = &lit->shape;
  if (pl->n_tuple_literals)
    return fail_at(d, "tuple_literals", "only a tuple literal has elements");
  if (kiln_shape_is_array(s)) {
    int rc = check_arrays(d, s);
    if (rc) return rc;
  }
  int64_t bytes = kiln_shape_bytes(s); /* dims are checked: cannot overflow */
  if (!kiln_shape_is_array(s)) bytes = 0;
  if ((uint64_t)pl->data.len != (uint64_t)bytes) {
    kiln_sbuf sb = KILN_SBUF_INIT;
    kiln_shape_print_short(&sb, s);
    int rc = fail_at(d, "data", "%zu bytes, but %s takes %lld", pl->data.len, kiln_sbuf_str(&sb),
                     (long long)bytes);
    kiln_sbuf_free(&sb);
    return rc;
  }
  lit->nbytes = (size_t)bytes;
  if (kiln_shape_is_array(s)) {
    lit->data = kiln_arena_alloc(d->a, lit->nbytes ? lit->nbytes : 1);
    if (lit->data == NULL) return oom(d);
    if (lit->nbytes) memcpy(lit->data, pl->data.data, lit->nbytes);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    size_t unit = kiln_dtype_size(s->dtype);
    if (kiln_dtype_is_complex(s->dtype)) unit /= 2;
    uint8_t *w = lit->data;
    for (size_t i = 0; unit > 1 && i + unit <= lit->nbytes; i += unit)
      for (size_t k = 0; k < unit / 2; k++) {
        uint8_t t = w[i + k];
        w[i + k] = w[i + unit - 1 - k];
        w[i + unit - 1 - k] = t;
      }
#endif
    int rc = check_elements(d, lit);
    if (rc) return rc;
  }
  if (pl->n_dynamic_sizes == 0) return 0;
  if (!kiln_shape_is_array(s) || pl->n_dynamic_sizes != s->rank)
    return fail_at(d, "dynamic_sizes", "%zu sizes for a shape of rank %u", pl->n_dynamic_sizes,
                   kiln_shape_is_array(s) ? s->rank : 0);
  for (uint32_t i = 0; i < s->rank; i++) {
    int64_t v = pl->dynamic_sizes[i];
    if (v < 0 || v > s->dims[i]) {
      size_t old = push_at(d, "dynamic_sizes", i);
      int rc = fail(d, "size %lld is outside 0..%lld", (long long)v, (long long)s->dims[i]);
      pop(d, old);
      return rc;
    }
  }
  lit->dynamic_sizes = kiln_arena_memdup(d->a, pl->dynamic_sizes, s->rank * sizeof(int64_t));
  return lit->dynamic_sizes ? 0 : oom(d);
}

/* `shape` is the element shape a tuple parent gives, or NULL at the top. */
static int dec_literal_rec(dec *d, const Kiln__V1__Literal *pl, const kiln_shape *shape,
                           unsigned depth, size_t root, kiln_literal **out) {
  kiln_literal *lit = kiln_arena_calloc(d->a, 1, sizeof *lit);
  if (lit == NULL) return oom(d);
  int rc;
  if (shape == NULL || pl->shape != NULL) {
    if ((rc = dec_shape_at(d, "shape", pl->shape, true, &lit->shape))) return rc;
    if (shape && !kiln_shape_equal(&lit->shape, shape, true))
      return fail_at(d, "shape", "differs from the tuple's element shape");
  }
  if (shape && kiln_shape_copy(d->a, &lit->shape, shape)) return oom(d);
  const kiln_shape *s = &lit->shape;
  if (!kiln_shape_is_tuple(s)) {
    if (!kiln_shape_is_array(s) && !kiln_shape_is_token(s))
      return fail_at(d, "shape", "a literal is an array, a tuple or a token, not %s",
                     kiln_dtype_name(s->dtype));
    if ((rc = dec_array_literal(d, pl, lit))) return rc;
    *out = lit;
    return 0;
  }
  if (pl->data.len) return fail_at(d, "data", "a tuple literal has no data of its own");
  if (pl->n_dynamic_sizes) return fail_at(d, "dynamic_sizes", "a tuple literal has no sizes");
  if (pl->n_tuple_literals != s->rank)
    return fail_at(d, "tuple_literals", "%zu elements, but the shape has %u", pl->n_tuple_literals,
                   s->rank);
  if (s->rank && too_deep(depth + 1)) {
    pop(d, root);
    return fail(d, "tuple literals nested deeper than %d levels", KILN_PROTO_MAX_TUPLE_DEPTH);
  }
  if (s->rank) {
    lit->elems = kiln_arena_calloc(d->a, s->rank, sizeof *lit->elems);
    if (lit->elems == NULL) return oom(d);
  }
  for (uint32_t i = 0; i < s->rank; i++) {
    size_t old = push_at(d, "tuple_literals", i);
    rc = dec_literal_rec(d, pl->tuple_literals[i], &s->tuple[i], depth + 1, root, &lit->elems[i]);
    if (rc) return rc;
    pop(d, old);
  }
  *out = lit;
  return 0;
}

int kiln__proto_literal_decode(kiln_arena *a, const Kiln__V1__Literal *pl, const char *path,
                               kiln_literal **out, kiln_status *st) {
  dec d = {.a = a, .st = st};
  d.path[0] = '\0';
  if (path && path[0]) push(&d, path);
  *out = NULL;
  return dec_literal_rec(&d, pl, NULL, 0, d.plen, out);
}

/* ---- attribute values ------------------------------------------------------------------- */

static int dec_sharding_rec(dec *d, const Kiln__V1__Sharding *ps, kiln_sharding *s, unsigned depth,
                            size_t root) {
  memset(s, 0, sizeof *s);
  if ((unsigned)ps->kind > KILN_SHARD_TUPLE)
    return fail_at(d, "kind", "%d is not a kiln.v1.ShardingKind value", (int)ps->kind);
  s->kind = (kiln_sharding_kind)ps->kind;
  s->device = ps->device;
  int rc;
  if ((rc = i64s_at(d, "tile_dims", ps->tile_dims, ps->n_tile_dims, &s->tile_dims)) ||
      (rc = i64s_at(d, "devices", ps->devices, ps->n_devices, &s->devices)) ||
      (rc = i64s_at(d, "iota_reshape", ps->iota_reshape, ps->n_iota_reshape, &s->iota_reshape)) ||
      (rc = i64s_at(d, "iota_perm", ps->iota_perm, ps->n_iota_perm, &s->iota_perm)))
    return rc;
  s->last_tile_dim_replicate = ps->last_tile_dim_replicate;
  if (ps->n_last_tile_dims) {
    if (ps->n_last_tile_dims > UINT32_MAX) return fail_at(d, "last_tile_dims", "too many");
    s->last_tile_dims.v = kiln_arena_alloc(d->a, ps->n_last_tile_dims * sizeof(int64_t));
    if (s->last_tile_dims.v == NULL) return oom(d);
    s->last_tile_dims.n = (uint32_t)ps->n_last_tile_dims;
    for (size_t i = 0; i < ps->n_last_tile_dims; i++) {
      if ((unsigned)ps->last_tile_dims[i] > KILN_SHARD_TUPLE) {
        size_t old = push_at(d, "last_tile_dims", i);
        rc = fail(d, "%d is not a kiln.v1.ShardingKind value", (int)ps->last_tile_dims[i]);
        pop(d, old);
        return rc;
      }
      s->last_tile_dims.v[i] = ps->last_tile_dims[i];
    }
  }
  if ((rc = opt_str(d, ps->extra, &s->extra))) return rc;
  if (ps->n_tuple_shardings == 0) return 0;
  if (s->kind != KILN_SHARD_TUPLE)
    return fail_at(d, "tuple_shardings", "only a SHARDING_KIND_TUPLE sharding has elements");
  if (ps->n_tuple_shardings > UINT32_MAX - 1) return fail_at(d, "tuple_shardings", "too many");
  if (too_deep(depth + 1)) {
    pop(d, root);
    return fail(d, "tuple shardings nested deeper than %d levels", KILN_PROTO_MAX_TUPLE_DEPTH);
  }
  s->nelems = (uint32_t)ps->n_tuple_shardings;
  s->elems = kiln_arena_calloc(d->a, s->nelems, sizeof *s->elems);
  if (s->elems == NULL) return oom(d);
  for (uint32_t i = 0; i < s->nelems; i++) {
    size_t old = push_at(d, "tuple_shardings", i);
    rc = dec_sharding_rec(d, ps->tuple_shardings[i], &s->elems[i], depth + 1, root);
    if (rc) return rc;
    pop(d, old);
  }
  return 0;
}

static int dec_window(dec *d, const Kiln__V1__Window *pw, kiln_window **out) {
  kiln_window *w = kiln_arena_calloc(d->a, 1, sizeof *w);
  if (w == NULL) return oom(d);
  if (pw->n_dimensions > UINT32_MAX) return fail_at(d, "dimensions", "too many");
  w->rank = (uint32_t)pw->n_dimensions;
  if (w->rank) {
    w->dims = kiln_arena_calloc(d->a, w->rank, sizeof *w->dims);
    if (w->dims == NULL) return oom(d);
  }
  for (uint32_t i = 0; i < w->rank; i++) {
    const Kiln__V1__WindowDimension *p = pw->dimensions[i];
    kiln_window_dim *wd = &w->dims[i];
    wd->size = p->size;
    wd->stride = p->stride;
    wd->pad_lo = p->padding_low;
    wd->pad_hi = p->padding_high;
    wd->lhs_dilate = p->base_dilation;
    wd->rhs_dilate = p->window_dilation;
    wd->reversal = p->window_reversal;
  }
  *out = w;
  return 0;
}

static int dec_conv(dec *d, const Kiln__V1__ConvolutionDimensions *pc, kiln_conv_dims **out) {
  kiln_conv_dims *c = kiln_arena_calloc(d->a, 1, sizeof *c);
  if (c == NULL) return oom(d);
  size_t n = pc->n_input_spatial_dimensions;
  if (pc->n_kernel_spatial_dimensions != n || pc->n_output_spatial_dimensions != n)
    return fail(d, "input, kernel and output have %zu, %zu and %zu spatial dimensions", n,
                pc->n_kernel_spatial_dimensions, pc->n_output_spatial_dimensions);
  c->in_batch = pc->input_batch_dimension;
  c->in_feature = pc->input_feature_dimension;
  c->kernel_in = pc->kernel_input_feature_dimension;
  c->kernel_out = pc->kernel_output_feature_dimension;
  c->out_batch = pc->output_batch_dimension;
  c->out_feature = pc->output_feature_dimension;
  kiln_i64s in, k, o;
  int rc;
  if ((rc = copy_i64s(d, pc->input_spatial_dimensions, n, &in)) ||
      (rc = copy_i64s(d, pc->kernel_spatial_dimensions, n, &k)) ||
      (rc = copy_i64s(d, pc->output_spatial_dimensions, n, &o)))
    return rc;
  c->nspatial = in.n;
  c->in_spatial = in.v;
  c->kernel_spatial = k.v;
  c->out_spatial = o.v;
  *out = c;
  return 0;
}

static int dec_groups(dec *d, const Kiln__V1__ReplicaGroups *pg, kiln_replica_groups **out) {
  kiln_replica_groups *g = kiln_arena_calloc(d->a, 1, sizeof *g);
  if (g == NULL) return oom(d);
  g->iota = pg->iota;
  int rc;
  if ((rc = i64s_at(d, "iota_shape", pg->iota_shape, pg->n_iota_shape, &g->iota_shape)) ||
      (rc = i64s_at(d, "iota_reshape", pg->iota_reshape, pg->n_iota_reshape, &g->iota_reshape)) ||
      (rc = i64s_at(d, "iota_perm", pg->iota_perm, pg->n_iota_perm, &g->iota_perm)))
    return rc;
  if (pg->n_groups > UINT32_MAX) return fail_at(d, "groups", "too many");
  g->ngroups = (uint32_t)pg->n_groups;
  if (g->ngroups) {
    g->groups = kiln_arena_calloc(d->a, g->ngroups, sizeof *g->groups);
    if (g->groups == NULL) return oom(d);
  }
  for (uint32_t i = 0; i < g->ngroups; i++) {
    size_t old = push_at(d, "groups", i);
    push(d, "values");
    rc = copy_i64s(d, pg->groups[i]->values, pg->groups[i]->n_values, &g->groups[i]);
    pop(d, old);
    if (rc) return rc;
  }
  *out = g;
  return 0;
}

/* The oneof member each attribute kind uses, and its name for messages. */
static Kiln__V1__Attribute__ValueCase kind_case(kiln_attr_kind k) {
  switch (k) {
  case KILN_AK_INT:
  case KILN_AK_BOOL:
  case KILN_AK_CMP_DIR: return KILN__V1__ATTRIBUTE__VALUE_I;
  case KILN_AK_FLOAT: return KILN__V1__ATTRIBUTE__VALUE_F;
  case KILN_AK_INTS:
  case KILN_AK_SLICE:
  case KILN_AK_PADDING:
  case KILN_AK_PAIRS: return KILN__V1__ATTRIBUTE__VALUE_INTS;
  case KILN_AK_WINDOW: return KILN__V1__ATTRIBUTE__VALUE_WINDOW;
  case KILN_AK_DIM_LABELS: return KILN__V1__ATTRIBUTE__VALUE_CONV;
  case KILN_AK_REPLICA_GROUPS: return KILN__V1__ATTRIBUTE__VALUE_REPLICA_GROUPS;
  case KILN_AK_SHARDING: return KILN__V1__ATTRIBUTE__VALUE_SHARDING;
  case KILN_AK_IDENT:
  case KILN_AK_STRING:
  case KILN_AK_OPAQUE: break;
  }
  return KILN__V1__ATTRIBUTE__VALUE_S;
}

static const char *case_name(Kiln__V1__Attribute__ValueCase c) {
  switch (c) {
  case KILN__V1__ATTRIBUTE__VALUE_I: return "i";
  case KILN__V1__ATTRIBUTE__VALUE_F: return "f";
  case KILN__V1__ATTRIBUTE__VALUE_INTS: return "ints";
  case KILN__V1__ATTRIBUTE__VALUE_S: return "s";
  case KILN__V1__ATTRIBUTE__VALUE_WINDOW: return "window";
  case KILN__V1__ATTRIBUTE__VALUE_CONV: return "conv";
  case KILN__V1__ATTRIBUTE__VALUE_REPLICA_GROUPS: return "replica_groups";
  case KILN__V1__ATTRIBUTE__VALUE_SHARDING: return "sharding";
  default: return "nothing";
  }
}

static int dec_int_value(dec *d, kiln_attr_kind kind, int64_t v) {
  if (kind == KILN_AK_BOOL && v != 0 && v != 1)
    return fail_at(d, "i", "%lld is not a boolean (0 or 1)", (long long)v);
  if (kind == KILN_AK_CMP_DIR && (v < KILN_CMP_EQ || v > KILN_CMP_LT))
    return fail_at(d, "i", "%lld is not a kiln.v1.ComparisonDirection value", (long long)v);
  return 0;
}

static int dec_ints_value(dec *d, kiln_attr_kind kind, const Kiln__V1__Int64List *pv,
                          kiln_i64s *out) {
  size_t group = kind == KILN_AK_PAIRS ? 2 : kind == KILN_AK_INTS ? 1 : 3;
  if (pv->n_values % group)
    return fail_at(d, "ints.values", "%zu values, not a multiple of %zu (%s)", pv->n_values, group,
                   kind == KILN_AK_PAIRS   ? "source, target pairs"
                   : kind == KILN_AK_SLICE ? "start, limit, stride triples"
                                           : "low, high, interior triples");
  return i64s_at(d, "ints.values", pv->values, pv->n_values, out);
}

static int dec_attr_value(dec *d, const Kiln__V1__Attribute *pa, kiln_attr *at) {
  kiln_attr_kind kind = kiln_attr_key_kind(at->key);
  Kiln__V1__Attribute__ValueCase want = kind_case(kind);
  if (pa->value_case != want)
    return fail(
        d, "key %s (%s) takes its value in %s, but %s is set", kiln_attr_key_name(at->key),
        protobuf_c_enum_descriptor_get_value(&kiln__v1__attr_key__descriptor, (int)at->key)->name,
        case_name(want), case_name(pa->value_case));
  size_t old;
  int rc;
  switch (want) {
  case KILN__V1__ATTRIBUTE__VALUE_I: at->v.i = pa->i; return dec_int_value(d, kind, pa->i);
  case KILN__V1__ATTRIBUTE__VALUE_F: at->v.f = pa->f; return 0;
  case KILN__V1__ATTRIBUTE__VALUE_INTS: return dec_ints_value(d, kind, pa->ints, &at->v.ints);
  case KILN__V1__ATTRIBUTE__VALUE_WINDOW:
    old = push(d, "window");
    rc = dec_window(d, pa->window, &at->v.window);
    break;
  case KILN__V1__ATTRIBUTE__VALUE_CONV:
    old = push(d, "conv");
    rc = dec_conv(d, pa->conv, &at->v.conv);
    break;
  case KILN__V1__ATTRIBUTE__VALUE_REPLICA_GROUPS:
    old = push(d, "replica_groups");
    rc = dec_groups(d, pa->replica_groups, &at->v.groups);
    break;
  case KILN__V1__ATTRIBUTE__VALUE_SHARDING:
    at->v.sharding = kiln_arena_calloc(d->a, 1, sizeof *at->v.sharding);
    if (at->v.sharding == NULL) return oom(d);
    old = push(d, "sharding");
    rc = dec_sharding_rec(d, pa->sharding, at->v.sharding, 0, d->plen);
    break;
  default: at->v.s = kiln_arena_strdup(d->a, pa->s ? pa->s : ""); return at->v.s ? 0 : oom(d);
  }
  pop(d, old);
  return rc;
}

/* `seen` marks the keys already present: at most one of each but UNKNOWN. */
static int dec_attr(dec *d, kiln_instr *ins, const Kiln__V1__Attribute *pa, uint8_t *seen) {
  if ((unsigned)pa->key >= KILN_ATTR_COUNT)
    return fail_at(d, "key", "%d is not a kiln.v1.AttrKey value", (int)pa->key);
  kiln_attr_key key = (kiln_attr_key)pa->key;
  if (key == KILN_ATTR_INVALID) return fail_at(d, "key", "ATTR_KEY_INVALID is not an attribute");
  if (key == KILN_ATTR_UNKNOWN && (pa->name == NULL || pa->name[0] == '\0'))
    return fail_at(d, "name", "empty (required for ATTR_KEY_UNKNOWN)");
  if (key != KILN_ATTR_UNKNOWN && pa->name && pa->name[0])
    return fail_at(d, "name", "set for %s (only ATTR_KEY_UNKNOWN has a name)",
                   kiln_attr_key_name(key));
  if (key != KILN_ATTR_UNKNOWN && seen[key])
    return fail_at(d, "key", "%s appears twice", kiln_attr_key_name(key));
  seen[key] = 1;
  /* Decode into a local first: kiln_instr_add_attr hands out a slot that
   * moves when the array grows. */
  kiln_attr at;
  memset(&at, 0, sizeof at);
  at.key = key;
  if (key == KILN_ATTR_UNKNOWN && (at.name = kiln_arena_strdup(d->a, pa->name)) == NULL)
    return oom(d);
  int rc = dec_attr_value(d, pa, &at);
  if (rc) return rc;
  kiln_attr *slot = kiln_instr_add_attr(d->m, ins, key);
  if (slot == NULL) return oom(d);
  *slot = at;
  return 0;
}

/* ---- instructions and computations --------------------------------------------------------- */

/* An instruction reference `v` (operand or control predecessor) at the
 * current path, which must name an instruction of computation `comp`. */
static int check_ref(dec *d, int64_t v, uint32_t comp) {
  if (v < 0 || v >= (int64_t)d->ninstrs)
    return fail(d, "id %lld out of range (module has %u instructions)", (long long)v, d->ninstrs);
  const owner *o = &d->owners[v];
  if (o->comp != comp)
    return fail(d, "id %lld is in computations[%u] (%s), not in this computation (%s)",
                (long long)v, o->comp, d->m->comps[o->comp]->name, d->m->comps[comp]->name);
  return 0;
}

static int dec_refs(dec *d, const char *field, const int64_t *v, size_t n, uint32_t comp,
                    kiln_id **out, uint32_t *nout) {
  *out = NULL;
  *nout = 0;
  if (n == 0) return 0;
  if (n > UINT32_MAX) return fail_at(d, field, "too many");
  kiln_id *ids = kiln_arena_alloc(d->a, n * sizeof *ids);
  if (ids == NULL) return oom(d);
  for (size_t i = 0; i < n; i++) {
    size_t old = push_at(d, field, i);
    int rc = check_ref(d, v[i], comp);
    pop(d, old);
    if (rc) return rc;
    ids[i] = (kiln_id)v[i];
  }
  *out = ids;
  *nout = (uint32_t)n;
  return 0;
}

static int dec_called(dec *d, const Kiln__V1__Instruction *pi, kiln_instr *ins) {
  size_t n = pi->n_called_computations;
  if (n == 0) return 0;
  if (n > UINT32_MAX) return fail_at(d, "called_computations", "too many");
  uint32_t *c = kiln_arena_alloc(d->a, n * sizeof *c);
  if (c == NULL) return oom(d);
  for (size_t i = 0; i < n; i++) {
    int64_t v = pi->called_computations[i];
    if (v < 0 || v >= (int64_t)d->m->ncomps) {
      size_t old = push_at(d, "called_computations", i);
      int rc = fail(d, "index %lld out of range (module has %u computations)", (long long)v,
                    d->m->ncomps);
      pop(d, old);
      return rc;
    }
    c[i] = (uint32_t)v;
  }
  ins->called = c;
  ins->ncalled = (uint32_t)n;
  return 0;
}

static bool is_async_wrapper(kiln_opcode op) {
  return op == KILN_OP_ASYNC_START || op == KILN_OP_ASYNC_UPDATE || op == KILN_OP_ASYNC_DONE;
}

static int dec_opcodes(dec *d, const Kiln__V1__Instruction *pi, kiln_instr *ins) {
  if ((unsigned)pi->opcode >= KILN_OP_COUNT)
    return fail_at(d, "opcode", "%d is not a kiln.v1.Opcode value", (int)pi->opcode);
  if (pi->opcode == KILN__V1__OPCODE__OPCODE_INVALID)
    return fail_at(d, "opcode", "OPCODE_INVALID is not an operation");
  ins->op = (kiln_opcode)pi->opcode;
  if ((unsigned)pi->async_op >= KILN_OP_COUNT)
    return fail_at(d, "async_op", "%d is not a kiln.v1.Opcode value", (int)pi->async_op);
  ins->async_op = (kiln_opcode)pi->async_op;
  if (ins->async_op != KILN_OP_INVALID && !is_async_wrapper(ins->op))
    return fail_at(d, "async_op",
                   "set on %s (only async-start, async-update and async-done "
                   "wrap an op)",
                   kiln_opcode_name(ins->op));
  return 0;
}

static int dec_instr_body(dec *d, const Kiln__V1__Instruction *pi, kiln_instr *ins) {
  int rc;
  if ((rc = dec_opcodes(d, pi, ins))) return rc;
  if (pi->name == NULL || pi->name[0] == '\0') return fail_at(d, "name", "empty");
  if ((rc = dec_shape_at(d, "shape", pi->shape, false, &ins->shape))) return rc;
  if ((rc = dec_refs(d, "operands", pi->operands, pi->n_operands, ins->comp, &ins->operands,
                     &ins->noperands)))
    return rc;
  if ((rc = dec_called(d, pi, ins))) return rc;
  if ((rc = dec_refs(d, "control_predecessors", pi->control_predecessors,
                     pi->n_control_predecessors, ins->comp, &ins->control_preds, &ins->ncontrol)))
    return rc;
  uint8_t seen[KILN_ATTR_COUNT] = {0};
  for (size_t i = 0; i < pi->n_attributes; i++) {
    size_t old = push_at(d, "attributes", i);
    rc = dec_attr(d, ins, pi->attributes[i], seen);
    pop(d, old);
    if (rc) return rc;
  }
  if (ins->op == KILN_OP_CONSTANT && pi->literal == NULL)
    return fail_at(d, "literal", "missing (a constant needs its value)");
  if (ins->op != KILN_OP_CONSTANT && pi->literal != NULL)
    return fail_at(d, "literal", "set on %s (only a constant has a literal)",
                   kiln_opcode_name(ins->op));
  if (pi->literal) {
    size_t old = push(d, "literal");
    d->ins_name = pi->name;
    rc = dec_literal_rec(d, pi->literal, NULL, 0, d->plen, &ins->literal);
    d->ins_name = NULL;
    pop(d, old);
    if (rc) return rc;
  }
  ins->param_number = pi->parameter_number;
  ins->line = pi->line;
  ins->col = pi->column;
  return 0;
}

/* Pass 1: every instruction id names exactly one instruction. */
static int index_ids(dec *d, const Kiln__V1__Module *pm) {
  size_t total = 0;
  for (size_t c = 0; c < pm->n_computations; c++) total += pm->computations[c]->n_instructions;
  if (total >= UINT32_MAX - 1 || pm->n_computations >= UINT32_MAX - 1)
    return fail(d, "%zu instructions in %zu computations are too many", total, pm->n_computations);
  d->ninstrs = (uint32_t)total;
  d->owners = kiln_malloc((total ? total : 1) * sizeof *d->owners);
  if (d->owners == NULL) return oom(d);
  for (size_t i = 0; i < total; i++) d->owners[i].comp = UINT32_MAX;
  for (uint32_t c = 0; c < pm->n_computations; c++) {
    const Kiln__V1__Computation *pc = pm->computations[c];
    for (uint32_t k = 0; k < pc->n_instructions; k++) {
      int64_t id = pc->instructions[k]->id;
      int rc = 0;
      size_t old = push_at(d, "computations", c);
      push_at(d, "instructions", k);
      push(d, "id");
      if (id < 0 || id >= (int64_t)total)
        rc = fail(d, "id %lld out of range (module has %zu instructions)", (long long)id, total);
      else if (d->owners[id].comp != UINT32_MAX)
        rc = fail(d, "id %lld already used by computations[%u].instructions[%u]", (long long)id,
                  d->owners[id].comp, d->owners[id].index);
      pop(d, old);
      if (rc) return rc;
      d->owners[id].comp = c;
      d->owners[id].index = k;
    }
  }
  return 0;
}

/* Computations (names only yet), then instructions in id order, then each
 * computation's instruction order as the message has it. */
static int create_skeleton(dec *d, const Kiln__V1__Module *pm) {
  kiln_module *m = d->m;
  for (uint32_t c = 0; c < pm->n_computations; c++) {
    const Kiln__V1__Computation *pc = pm->computations[c];
    size_t old = push_at(d, "computations", c);
    if (pc->name == NULL || pc->name[0] == '\0') return fail_at(d, "name", "empty");
    pop(d, old);
    if (kiln_module_add_computation(m, pc->name, NULL)) return oom(d);
    m->comps[c]->is_entry = pc->is_entry;
    m->comps[c]->line = pc->line;
    m->comps[c]->col = pc->column;
  }
  for (uint32_t id = 0; id < d->ninstrs; id++) {
    const owner *o = &d->owners[id];
    const Kiln__V1__Instruction *pi = pm->computations[o->comp]->instructions[o->index];
    kiln_instr *ins = kiln_module_add_instr(m, o->comp, KILN_OP_INVALID, pi->name ? pi->name : "");
    if (ins == NULL) return oom(d);
  }
  for (uint32_t c = 0; c < pm->n_computations; c++) {
    const Kiln__V1__Computation *pc = pm->computations[c];
    for (uint32_t k = 0; k < pc->n_instructions; k++)
      m->comps[c]->instrs[k] = (kiln_id)pc->instructions[k]->id;
  }
  return 0;
}

static int dec_computation(dec *d, const Kiln__V1__Computation *pc, kiln_computation *c) {
  for (uint32_t k = 0; k < pc->n_instructions; k++) {
    size_t old = push_at(d, "instructions", k);
    int rc = dec_instr_body(d, pc->instructions[k], d->m->instrs[c->instrs[k]]);
    pop(d, old);
    if (rc) return rc;
  }
  if (pc->root_id == -1) return 0;
  size_t old = push(d, "root_id");
  int rc = check_ref(d, pc->root_id, c->id);
  pop(d, old);
  if (rc) return rc;
  c->root = (kiln_id)pc->root_id;
  return 0;
}

/* ---- the module header ---------------------------------------------------------------------- */

static int dec_program_shape(dec *d, const Kiln__V1__ProgramShape *pp, kiln_program_shape **out) {
  kiln_program_shape *p = kiln_arena_calloc(d->a, 1, sizeof *p);
  if (p == NULL) return oom(d);
  if (pp->n_parameters > UINT32_MAX) return fail_at(d, "parameters", "too many");
  p->nparams = (uint32_t)pp->n_parameters;
  if (p->nparams) {
    p->params = kiln_arena_calloc(d->a, p->nparams, sizeof *p->params);
    if (p->params == NULL) return oom(d);
  }
  for (uint32_t i = 0; i < p->nparams; i++) {
    char field[40];
    snprintf(field, sizeof field, "parameters[%u]", i);
    int rc = dec_shape_at(d, field, pp->parameters[i], true, &p->params[i]);
    if (rc) return rc;
  }
  int rc = dec_shape_at(d, "result", pp->result, true, &p->result);
  if (rc) return rc;
  *out = p;
  return 0;
}

static int dec_alias(dec *d, const Kiln__V1__InputOutputAlias *pa, kiln_alias *al) {
  int rc;
  if ((rc = i64s_at(d, "output_shape_index", pa->output_shape_index, pa->n_output_shape_index,
                    &al->output_index)) ||
      (rc = i64s_at(d, "parameter_shape_index", pa->parameter_shape_index,
                    pa->n_parameter_shape_index, &al->param_index)))
    return rc;
  if ((unsigned)pa->kind > KILN_ALIAS_MUST)
    return fail_at(d, "kind", "%d is not a kiln.v1.AliasKind value", (int)pa->kind);
  al->param_number = pa->parameter_number;
  al->kind = (kiln_alias_kind)pa->kind;
  return 0;
}

static int dec_header(dec *d, const Kiln__V1__Module *pm) {
  kiln_module *m = d->m;
  int rc;
  if (pm->entry_computation_layout) {
    size_t old = push(d, "entry_computation_layout");
    rc = dec_program_shape(d, pm->entry_computation_layout, &m->entry_layout);
    pop(d, old);
    if (rc) return rc;
  }
  if ((unsigned)pm->is_scheduled > KILN__V1__TRISTATE__TRISTATE_TRUE)
    return fail_at(d, "is_scheduled", "%d is not a kiln.v1.Tristate value", (int)pm->is_scheduled);
  m->is_scheduled = pm->is_scheduled == KILN__V1__TRISTATE__TRISTATE_UNSET   ? -1
                    : pm->is_scheduled == KILN__V1__TRISTATE__TRISTATE_FALSE ? 0
                                                                             : 1;
  m->has_aliases = pm->has_input_output_alias;
  if (pm->n_input_output_alias > UINT32_MAX) return fail_at(d, "input_output_alias", "too many");
  if (pm->n_input_output_alias) {
    m->aliases = kiln_arena_calloc(d->a, pm->n_input_output_alias, sizeof *m->aliases);
    if (m->aliases == NULL) return oom(d);
    m->naliases = (uint32_t)pm->n_input_output_alias;
  }
  for (uint32_t i = 0; i < m->naliases; i++) {
    size_t old = push_at(d, "input_output_alias", i);
    rc = dec_alias(d, pm->input_output_alias[i], &m->aliases[i]);
    pop(d, old);
    if (rc) return rc;
  }
  m->replica_count = pm->replica_count;
  m->num_partitions = pm->num_partitions;
  if (pm->n_header_attributes > UINT32_MAX) return fail_at(d, "header_attributes", "too many");
  if (pm->n_header_attributes) {
    m->header_extra = kiln_arena_calloc(d->a, pm->n_header_attributes, sizeof *m->header_extra);
    if (m->header_extra == NULL) return oom(d);
    m->nheader_extra = (uint32_t)pm->n_header_attributes;
  }
  for (uint32_t i = 0; i < m->nheader_extra; i++) {
    const Kiln__V1__HeaderAttribute *ph = pm->header_attributes[i];
    size_t old = push_at(d, "header_attributes", i);
    rc = need_name(d, ph->name, &m->header_extra[i].name);
    if (rc == 0) {
      m->header_extra[i].text = kiln_arena_strdup(d->a, ph->text ? ph->text : "");
      if (m->header_extra[i].text == NULL) rc = oom(d);
    }
    pop(d, old);
    if (rc) return rc;
  }
  if (pm->n_debug_sections > UINT32_MAX) return fail_at(d, "debug_sections", "too many");
  if (pm->n_debug_sections) {
    m->sections = kiln_arena_calloc(d->a, pm->n_debug_sections, sizeof *m->sections);
    if (m->sections == NULL) return oom(d);
    m->nsections = (uint32_t)pm->n_debug_sections;
  }
  for (uint32_t i = 0; i < m->nsections; i++) {
    const Kiln__V1__HeaderAttribute *ph = pm->debug_sections[i];
    size_t old = push_at(d, "debug_sections", i);
    rc = need_name(d, ph->name, &m->sections[i].name);
    if (rc == 0) {
      m->sections[i].text = kiln_arena_strdup(d->a, ph->text ? ph->text : "");
      if (m->sections[i].text == NULL) rc = oom(d);
    }
    pop(d, old);
    if (rc) return rc;
  }
  return 0;
}

static int dec_module(dec *d, const Kiln__V1__Module *pm) {
  int rc;
  if ((rc = index_ids(d, pm)) || (rc = create_skeleton(d, pm))) return rc;
  for (uint32_t c = 0; c < pm->n_computations; c++) {
    size_t old = push_at(d, "computations", c);
    rc = dec_computation(d, pm->computations[c], d->m->comps[c]);
    pop(d, old);
    if (rc) return rc;
  }
  int64_t entry = pm->entry_computation_index;
  if (entry != -1 && (entry < 0 || entry >= (int64_t)pm->n_computations))
    return fail_at(d, "entry_computation_index", "%lld out of range (module has %zu computations)",
                   (long long)entry, pm->n_computations);
  d->m->entry = entry == -1 ? KILN_NO_ID : (uint32_t)entry;
  return dec_header(d, pm);
}

int kiln__proto_module_decode(const Kiln__V1__Module *pm, kiln_module **out, kiln_status *st) {
  *out = NULL;
  dec d = {.st = st};
  d.path[0] = '\0';
  if (pm->name == NULL || pm->name[0] == '\0') return fail_at(&d, "name", "empty");
  d.m = kiln_module_create(pm->name);
  if (d.m == NULL) return oom(&d);
  d.a = d.m->arena;
  int rc = dec_module(&d, pm);
  kiln_free(d.owners);
  if (rc) {
    kiln_module_destroy(d.m);
    return rc;
  }
  *out = d.m;
  return 0;
}
