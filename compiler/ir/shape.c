/* Shapes: predicates, sizes, equality, copies and the text form. A shape's
 * arrays live in an arena; copies are deep. */
#include <stdint.h>
#include <string.h>

#include "compiler/ir/ir.h"

bool kiln_shape_is_array(const kiln_shape *s) { return kiln_dtype_is_array(s->dtype); }
bool kiln_shape_is_tuple(const kiln_shape *s) { return s->dtype == KILN_TUPLE; }
bool kiln_shape_is_token(const kiln_shape *s) { return s->dtype == KILN_TOKEN; }
bool kiln_shape_is_scalar(const kiln_shape *s) { return kiln_shape_is_array(s) && s->rank == 0; }

bool kiln_shape_is_dynamic(const kiln_shape *s) {
  if (kiln_shape_is_tuple(s)) {
    for (uint32_t i = 0; i < s->rank; i++)
      if (kiln_shape_is_dynamic(&s->tuple[i])) return true;
    return false;
  }
  if (s->dynamic == NULL) return false;
  for (uint32_t i = 0; i < s->rank; i++)
    if (s->dynamic[i]) return true;
  return false;
}

int64_t kiln_shape_elements(const kiln_shape *s) {
  if (!kiln_shape_is_array(s)) return 0;
  int64_t n = 1;
  for (uint32_t i = 0; i < s->rank; i++) {
    int64_t d = s->dims[i];
    if (d < 0) return -1;
    if (d != 0 && n > INT64_MAX / d) return -1;
    n *= d;
  }
  return n;
}

int64_t kiln_shape_leaves(const kiln_shape *s) {
  if (!kiln_shape_is_array(s)) return 0;
  int64_t n = 1;
  for (uint32_t i = 0; i < s->rank; i++) {
    int64_t d = s->dims[i];
    if (d < 0) return -1;
    if (d == 0) break;
    if (n > INT64_MAX / d) return -1;
    n *= d;
  }
  return n;
}

int64_t kiln_shape_literal_arrays(const kiln_shape *s) {
  if (!kiln_shape_is_array(s)) return 0;
  int64_t total = 0, level = 1; /* arrays at depth d: the product of dims[0..d) */
  for (uint32_t d = 0; d < s->rank; d++) {
    if (total > INT64_MAX - level) return -1;
    total += level;
    if (s->dims[d] < 0) return -1;
    if (s->dims[d] == 0) return total;
    if (d + 1 < s->rank && level > INT64_MAX / s->dims[d]) return -1;
    level *= s->dims[d];
  }
  return total;
}

int64_t kiln_shape_bytes(const kiln_shape *s) {
  if (!kiln_shape_is_array(s)) return 0;
  int64_t n = kiln_shape_elements(s);
  int64_t e = (int64_t)kiln_dtype_size(s->dtype);
  if (n < 0 || (e != 0 && n > INT64_MAX / e)) return -1;
  return n * e;
}

bool kiln_shape_same_dims(const kiln_shape *a, const kiln_shape *b) {
  if (a->rank != b->rank) return false;
  for (uint32_t i = 0; i < a->rank; i++) {
    if (a->dims[i] != b->dims[i]) return false;
    bool da = a->dynamic && a->dynamic[i], db = b->dynamic && b->dynamic[i];
    if (da != db) return false;
  }
  return true;
}

void kiln_shape_minor_to_major(const kiln_shape *s, int64_t *out) {
  if (s->layout && s->layout->rank == s->rank && s->layout->minor_to_major) {
    memcpy(out, s->layout->minor_to_major, s->rank * sizeof *out);
    return;
  }
  for (uint32_t i = 0; i < s->rank; i++) out[i] = (int64_t)s->rank - 1 - i;
}

bool kiln_shape_is_row_major(const kiln_shape *s) {
  const kiln_layout *l = s->layout;
  if (l == NULL || l->rank != s->rank || l->minor_to_major == NULL) return true;
  for (uint32_t i = 0; i < s->rank; i++)
    if (l->minor_to_major[i] != (int64_t)s->rank - 1 - i) return false;
  return true;
}

static bool layouts_equal(const kiln_shape *a, const kiln_shape *b) {
  for (uint32_t i = 0; i < a->rank; i++) {
    int64_t da = a->layout && a->layout->rank == a->rank ? a->layout->minor_to_major[i]
                                                         : (int64_t)a->rank - 1 - i;
    int64_t db = b->layout && b->layout->rank == b->rank ? b->layout->minor_to_major[i]
                                                         : (int64_t)b->rank - 1 - i;
    if (da != db) return false;
  }
  const char *ta = a->layout ? a->layout->tail : NULL;
  const char *tb = b->layout ? b->layout->tail : NULL;
  if ((ta == NULL) != (tb == NULL)) return false;
  return ta == NULL || strcmp(ta, tb) == 0;
}

bool kiln_shape_equal(const kiln_shape *a, const kiln_shape *b, bool layouts) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  if (kiln_shape_is_tuple(a)) {
    for (uint32_t i = 0; i < a->rank; i++)
      if (!kiln_shape_equal(&a->tuple[i], &b->tuple[i], layouts)) return false;
    return true;
  }
  if (!kiln_shape_is_array(a)) return true;
  if (!kiln_shape_same_dims(a, b)) return false;
  return !layouts || layouts_equal(a, b);
}

int kiln_shape_copy(kiln_arena *a, kiln_shape *dst, const kiln_shape *src) {
  kiln_shape out = *src;
  out.dims = NULL;
  out.dynamic = NULL;
  out.layout = NULL;
  out.tuple = NULL;
  if (kiln_shape_is_tuple(src)) {
    if (src->rank) {
      out.tuple = kiln_arena_calloc(a, src->rank, sizeof *out.tuple);
      if (out.tuple == NULL) return KILN_ENOMEM;
      for (uint32_t i = 0; i < src->rank; i++) {
        int rc = kiln_shape_copy(a, &out.tuple[i], &src->tuple[i]);
        if (rc) return rc;
      }
    }
    *dst = out;
    return 0;
  }
  if (src->rank) {
    out.dims = kiln_arena_memdup(a, src->dims, src->rank * sizeof *src->dims);
    if (out.dims == NULL) return KILN_ENOMEM;
    if (src->dynamic) {
      out.dynamic = kiln_arena_memdup(a, src->dynamic, src->rank);
      if (out.dynamic == NULL) return KILN_ENOMEM;
    }
  }
  if (src->layout) {
    kiln_layout *l = kiln_arena_alloc(a, sizeof *l);
    if (l == NULL) return KILN_ENOMEM;
    *l = *src->layout;
    if (l->rank) {
      l->minor_to_major =
          kiln_arena_memdup(a, src->layout->minor_to_major, l->rank * sizeof *l->minor_to_major);
      if (l->minor_to_major == NULL) return KILN_ENOMEM;
    }
    if (src->layout->tail) {
      l->tail = kiln_arena_strdup(a, src->layout->tail);
      if (l->tail == NULL) return KILN_ENOMEM;
    }
    out.layout = l;
  }
  *dst = out;
  return 0;
}

int kiln_shape_make_array(kiln_arena *a, kiln_shape *out, kiln_dtype t, const int64_t *dims,
                          uint32_t rank) {
  memset(out, 0, sizeof *out);
  out->dtype = t;
  out->rank = rank;
  if (rank) {
    out->dims = kiln_arena_memdup(a, dims, rank * sizeof *dims);
    if (out->dims == NULL) return KILN_ENOMEM;
  }
  return 0;
}

int kiln_shape_make_tuple(kiln_arena *a, kiln_shape *out, const kiln_shape *elems, uint32_t n) {
  memset(out, 0, sizeof *out);
  out->dtype = KILN_TUPLE;
  out->rank = n;
  if (n == 0) return 0;
  out->tuple = kiln_arena_calloc(a, n, sizeof *out->tuple);
  if (out->tuple == NULL) return KILN_ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    int rc = kiln_shape_copy(a, &out->tuple[i], &elems[i]);
    if (rc) return rc;
  }
  return 0;
}

const kiln_shape *kiln_shape_subshape(const kiln_shape *s, const int64_t *index, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    if (!kiln_shape_is_tuple(s) || index[i] < 0 || index[i] >= (int64_t)s->rank) return NULL;
    s = &s->tuple[index[i]];
  }
  return s;
}

static void print_shape(kiln_sbuf *b, const kiln_shape *s, bool with_layout) {
  if (kiln_shape_is_tuple(s)) {
    kiln_sbuf_putc(b, '(');
    for (uint32_t i = 0; i < s->rank; i++) {
      if (i) kiln_sbuf_puts(b, ", ");
      print_shape(b, &s->tuple[i], with_layout);
    }
    kiln_sbuf_putc(b, ')');
    return;
  }
  kiln_sbuf_puts(b, kiln_dtype_name(s->dtype));
  kiln_sbuf_putc(b, '[');
  for (uint32_t i = 0; i < s->rank; i++) {
    if (i) kiln_sbuf_putc(b, ',');
    if (s->dynamic && s->dynamic[i]) kiln_sbuf_puts(b, "<=");
    kiln_sbuf_printf(b, "%lld", (long long)s->dims[i]);
  }
  kiln_sbuf_putc(b, ']');
  if (with_layout && s->layout) {
    kiln_sbuf_putc(b, '{');
    for (uint32_t i = 0; i < s->layout->rank; i++) {
      if (i) kiln_sbuf_putc(b, ',');
      kiln_sbuf_printf(b, "%lld", (long long)s->layout->minor_to_major[i]);
    }
    if (s->layout->tail) {
      kiln_sbuf_putc(b, ':');
      kiln_sbuf_puts(b, s->layout->tail);
    }
    kiln_sbuf_putc(b, '}');
  }
}

void kiln_shape_print(kiln_sbuf *b, const kiln_shape *s) { print_shape(b, s, true); }
void kiln_shape_print_short(kiln_sbuf *b, const kiln_shape *s) { print_shape(b, s, false); }
