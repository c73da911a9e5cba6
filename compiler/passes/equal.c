/* Structural equality and hashing of attributes and instructions.
 *
 * Equality walks every attribute kind's value (lists, windows, convolution
 * numbers, replica groups, shardings, strings) field by field; hashing
 * mixes the same fields, so that a hash table of instructions finds equal
 * ones with one comparison in the common case. Attribute lists are
 * unordered sets (one attribute per key), so their hashes are combined with
 * a commutative sum; so are the operands of commutative binary ops.
 */
#include "compiler/passes/equal.h"

#include <string.h>

/* ---- hashing ------------------------------------------------------------ */

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t acc = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) acc = (acc ^ b[i]) * 0x100000001b3ull;
  return mix(h, acc ^ n);
}

static uint64_t hash_str(uint64_t h, const char *s) {
  return s ? hash_bytes(h, s, strlen(s)) : mix(h, 0x5a5a);
}

static uint64_t hash_ints(uint64_t h, const kiln_i64s *v) {
  h = mix(h, v->n);
  for (uint32_t i = 0; i < v->n; i++) h = mix(h, (uint64_t)v->v[i]);
  return h;
}

static uint64_t hash_shape(uint64_t h, const kiln_shape *s) {
  h = mix(h, (uint64_t)s->dtype * 131 + s->rank);
  if (kiln_shape_is_tuple(s)) {
    for (uint32_t i = 0; i < s->rank; i++) h = hash_shape(h, &s->tuple[i]);
  } else if (kiln_shape_is_array(s)) {
    for (uint32_t i = 0; i < s->rank; i++) h = mix(h, (uint64_t)s->dims[i]);
  }
  return h;
}

uint64_t kiln__literal_hash(const kiln_literal *lit) {
  uint64_t h = hash_shape(0x1f, &lit->shape);
  if (kiln_shape_is_tuple(&lit->shape)) {
    for (uint32_t i = 0; i < lit->shape.rank; i++) h = mix(h, kiln__literal_hash(lit->elems[i]));
    return h;
  }
  return hash_bytes(h, lit->data, lit->nbytes);
}

uint64_t kiln__attr_hash(const kiln_attr *a) {
  uint64_t h = mix(0x77, a->key);
  if (a->key == KILN_ATTR_UNKNOWN) h = hash_str(h, a->name);
  switch (kiln_attr_key_kind(a->key)) {
  case KILN_AK_INT:
  case KILN_AK_BOOL:
  case KILN_AK_CMP_DIR: return mix(h, (uint64_t)a->v.i);
  case KILN_AK_FLOAT: return hash_bytes(h, &a->v.f, sizeof a->v.f);
  case KILN_AK_INTS:
  case KILN_AK_SLICE:
  case KILN_AK_PADDING:
  case KILN_AK_PAIRS: return hash_ints(h, &a->v.ints);
  case KILN_AK_IDENT:
  case KILN_AK_STRING:
  case KILN_AK_OPAQUE: return hash_str(h, a->v.s);
  case KILN_AK_WINDOW: return mix(h, a->v.window ? a->v.window->rank : 0);
  case KILN_AK_DIM_LABELS:
    return a->v.conv ? mix(h, (uint64_t)a->v.conv->in_feature * 7 + a->v.conv->nspatial) : h;
  case KILN_AK_REPLICA_GROUPS: return mix(h, a->v.groups ? a->v.groups->ngroups : 0);
  case KILN_AK_SHARDING: return mix(h, a->v.sharding ? (uint64_t)a->v.sharding->kind : 99);
  }
  return h;
}

/* ---- equality ----------------------------------------------------------- */

static bool str_eq(const char *a, const char *b) {
  if (a == NULL || b == NULL) return a == b;
  return strcmp(a, b) == 0;
}

static bool ints_eq(const kiln_i64s *a, const kiln_i64s *b) {
  return a->n == b->n && (a->n == 0 || memcmp(a->v, b->v, a->n * sizeof *a->v) == 0);
}

static bool window_eq(const kiln_window *a, const kiln_window *b) {
  if (a == NULL || b == NULL) return a == b;
  if (a->rank != b->rank) return false;
  for (uint32_t i = 0; i < a->rank; i++) {
    const kiln_window_dim *x = &a->dims[i], *y = &b->dims[i];
    if (x->size != y->size || x->stride != y->stride || x->pad_lo != y->pad_lo ||
        x->pad_hi != y->pad_hi || x->lhs_dilate != y->lhs_dilate ||
        x->rhs_dilate != y->rhs_dilate || x->reversal != y->reversal)
      return false;
  }
  return true;
}

static bool conv_eq(const kiln_conv_dims *a, const kiln_conv_dims *b) {
  if (a == NULL || b == NULL) return a == b;
  size_t n = a->nspatial * sizeof(int64_t);
  return a->in_batch == b->in_batch && a->in_feature == b->in_feature &&
         a->kernel_in == b->kernel_in && a->kernel_out == b->kernel_out &&
         a->out_batch == b->out_batch && a->out_feature == b->out_feature &&
         a->nspatial == b->nspatial &&
         (n == 0 || (memcmp(a->in_spatial, b->in_spatial, n) == 0 &&
                     memcmp(a->kernel_spatial, b->kernel_spatial, n) == 0 &&
                     memcmp(a->out_spatial, b->out_spatial, n) == 0));
}

static bool groups_eq(const kiln_replica_groups *a, const kiln_replica_groups *b) {
  if (a == NULL || b == NULL) return a == b;
  if (a->iota != b->iota || a->ngroups != b->ngroups || !ints_eq(&a->iota_shape, &b->iota_shape) ||
      !ints_eq(&a->iota_reshape, &b->iota_reshape) || !ints_eq(&a->iota_perm, &b->iota_perm))
    return false;
  for (uint32_t i = 0; i < a->ngroups; i++)
    if (!ints_eq(&a->groups[i], &b->groups[i])) return false;
  return true;
}

static bool sharding_eq(const kiln_sharding *a, const kiln_sharding *b) {
  if (a == NULL || b == NULL) return a == b;
  if (a->kind != b->kind || a->device != b->device || a->nelems != b->nelems ||
      a->last_tile_dim_replicate != b->last_tile_dim_replicate ||
      !ints_eq(&a->tile_dims, &b->tile_dims) || !ints_eq(&a->devices, &b->devices) ||
      !ints_eq(&a->iota_reshape, &b->iota_reshape) || !ints_eq(&a->iota_perm, &b->iota_perm) ||
      !ints_eq(&a->last_tile_dims, &b->last_tile_dims) || !str_eq(a->extra, b->extra))
    return false;
  for (uint32_t i = 0; i < a->nelems; i++)
    if (!sharding_eq(&a->elems[i], &b->elems[i])) return false;
  return true;
}

bool kiln__attr_equal(const kiln_attr *a, const kiln_attr *b) {
  if (a->key != b->key) return false;
  if (a->key == KILN_ATTR_UNKNOWN && !str_eq(a->name, b->name)) return false;
  switch (kiln_attr_key_kind(a->key)) {
  case KILN_AK_INT:
  case KILN_AK_BOOL:
  case KILN_AK_CMP_DIR: return a->v.i == b->v.i;
  case KILN_AK_FLOAT: return memcmp(&a->v.f, &b->v.f, sizeof a->v.f) == 0;
  case KILN_AK_INTS:
  case KILN_AK_SLICE:
  case KILN_AK_PADDING:
  case KILN_AK_PAIRS: return ints_eq(&a->v.ints, &b->v.ints);
  case KILN_AK_IDENT:
  case KILN_AK_STRING:
  case KILN_AK_OPAQUE: return str_eq(a->v.s, b->v.s);
  case KILN_AK_WINDOW: return window_eq(a->v.window, b->v.window);
  case KILN_AK_DIM_LABELS: return conv_eq(a->v.conv, b->v.conv);
  case KILN_AK_REPLICA_GROUPS: return groups_eq(a->v.groups, b->v.groups);
  case KILN_AK_SHARDING: return sharding_eq(a->v.sharding, b->v.sharding);
  }
  return false;
}

/* ---- instructions ------------------------------------------------------- */

static bool ignored(const kiln_attr *a) { return a->key == KILN_ATTR_METADATA; }

static uint32_t counted_attrs(const kiln_instr *ins) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < ins->nattrs; i++) n += !ignored(&ins->attrs[i]);
  return n;
}

/* Every attribute of a has an equal one in b, and the counts agree; with
 * at most one attribute per key (unknown keys aside) that is set equality. */
static bool attrs_eq(const kiln_instr *a, const kiln_instr *b) {
  if (counted_attrs(a) != counted_attrs(b)) return false;
  for (uint32_t i = 0; i < a->nattrs; i++) {
    if (ignored(&a->attrs[i])) continue;
    bool found = false;
    for (uint32_t j = 0; j < b->nattrs && !found; j++)
      found = kiln__attr_equal(&a->attrs[i], &b->attrs[j]);
    if (!found) return false;
  }
  return true;
}

static bool commutes(const kiln_instr *ins) {
  return ins->noperands == 2 && (kiln_opcode_flags(ins->op) & KILN_OPF_COMMUTATIVE);
}

static bool operands_eq(const kiln_instr *a, const kiln_instr *b) {
  if (a->noperands != b->noperands) return false;
  if (a->noperands == 0 ||
      memcmp(a->operands, b->operands, a->noperands * sizeof *a->operands) == 0)
    return true;
  return commutes(a) && a->operands[0] == b->operands[1] && a->operands[1] == b->operands[0];
}

bool kiln__instr_equal(const kiln_instr *a, const kiln_instr *b) {
  if (a->op != b->op || a->async_op != b->async_op || a->param_number != b->param_number ||
      a->ncalled != b->ncalled || !operands_eq(a, b) ||
      !kiln_shape_equal(&a->shape, &b->shape, true))
    return false;
  if (a->ncalled && memcmp(a->called, b->called, a->ncalled * sizeof *a->called) != 0) return false;
  if ((a->literal == NULL) != (b->literal == NULL)) return false;
  if (a->literal && !kiln_literal_equal(a->literal, b->literal)) return false;
  return attrs_eq(a, b);
}

uint64_t kiln__instr_hash(const kiln_instr *a) {
  uint64_t h = mix((uint64_t)a->op * 1000003u + (uint64_t)a->async_op, (uint64_t)a->param_number);
  h = hash_shape(h, &a->shape);
  if (commutes(a)) {
    kiln_id x = a->operands[0], y = a->operands[1];
    h = mix(mix(h, x < y ? x : y), x < y ? y : x);
  } else {
    for (uint32_t i = 0; i < a->noperands; i++) h = mix(h, a->operands[i]);
  }
  for (uint32_t i = 0; i < a->ncalled; i++) h = mix(h, a->called[i]);
  uint64_t attrs = 0;
  for (uint32_t i = 0; i < a->nattrs; i++)
    if (!ignored(&a->attrs[i])) attrs += kiln__attr_hash(&a->attrs[i]);
  h = mix(h, attrs);
  if (a->literal) h = mix(h, kiln__literal_hash(a->literal));
  return h;
}
