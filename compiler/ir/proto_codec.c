/* IR -> kiln.v1.Module, and the two public entry points of the codec.
 *
 * The encoder builds the protobuf-c message tree in a scratch arena, mostly
 * pointing at the module's own arrays and strings (the arena only holds
 * what needs converting: 32-bit ids widened to int64, byte flags to
 * protobuf booleans), packs it once and drops the arena. The packed bytes
 * then go through the same wire check the decoder applies, so that what
 * Kiln emits is always something Kiln (and any other protobuf runtime,
 * which insists on UTF-8 strings) accepts back.
 *
 * The enums of hlo.proto mirror the .def tables number for number; the
 * static assertions below keep that true, so the mapping both ways is a
 * cast after a range check.
 */
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/proto_codec.h"
#include "compiler/ir/proto_internal.h"

#define X(e, s, bits, bytes, kind) \
  _Static_assert((int)KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_##e == (int)KILN_##e, \
                 "hlo.proto ElementType disagrees with types.def at " #e);
#include "compiler/ir/types.def"
#undef X
#define X(e, s, arity, family, flags) \
  _Static_assert((int)KILN__V1__OPCODE__OPCODE_##e == (int)KILN_OP_##e, \
                 "hlo.proto Opcode disagrees with ops.def at " #e);
#include "compiler/ir/ops.def"
#undef X
#define X(e, s, kind) \
  _Static_assert((int)KILN__V1__ATTR_KEY__ATTR_KEY_##e == (int)KILN_ATTR_##e, \
                 "hlo.proto AttrKey disagrees with attrs.def at " #e);
#include "compiler/ir/attrs.def"
#undef X
_Static_assert((int)KILN__V1__SHARDING_KIND__SHARDING_KIND_TUPLE == (int)KILN_SHARD_TUPLE &&
                   (int)KILN__V1__SHARDING_KIND__SHARDING_KIND_REPLICATED ==
                       (int)KILN_SHARD_REPLICATED,
               "hlo.proto ShardingKind disagrees with kiln_sharding_kind");
_Static_assert((int)KILN__V1__COMPARISON_DIRECTION__COMPARISON_DIRECTION_LT == (int)KILN_CMP_LT,
               "hlo.proto ComparisonDirection disagrees with kiln_cmp_dir");
_Static_assert((int)KILN__V1__ALIAS_KIND__ALIAS_KIND_MUST_ALIAS == (int)KILN_ALIAS_MUST,
               "hlo.proto AliasKind disagrees with kiln_alias_kind");

typedef struct enc {
  kiln_arena *a;
  const kiln_instr *cur; /* for the one error besides out-of-memory */
} enc;

/* The decoder refuses deeper tuples, and protobuf-c's packer recurses once
 * per level: refuse here too, rather than emit what cannot come back. */
static bool too_deep(unsigned depth) { return depth > KILN_PROTO_MAX_TUPLE_DEPTH; }

#define NEW(e, T, init_fn, out) \
  do { \
    (out) = kiln_arena_alloc((e)->a, sizeof(T)); \
    if ((out) == NULL) return KILN_ENOMEM; \
    init_fn(out); \
  } while (0)

/* Arrays of message pointers. */
static int new_ptrs(enc *e, size_t n, void ***out) {
  *out = NULL;
  if (n == 0) return 0;
  *out = kiln_arena_calloc(e->a, n, sizeof(void *));
  return *out ? 0 : KILN_ENOMEM;
}

static char *str(const char *s) { return (char *)(s ? s : ""); }

/* The IR's int64 lists go out as they are (protobuf-c only reads them). */
static void put_i64s(const int64_t *v, uint32_t n, size_t *n_out, int64_t **out) {
  *n_out = n;
  *out = n ? (int64_t *)v : NULL;
}

static int put_ids(enc *e, const uint32_t *v, uint32_t n, size_t *n_out, int64_t **out) {
  *n_out = n;
  *out = NULL;
  if (n == 0) return 0;
  int64_t *w = kiln_arena_alloc(e->a, (size_t)n * sizeof *w);
  if (w == NULL) return KILN_ENOMEM;
  for (uint32_t i = 0; i < n; i++) w[i] = v[i];
  *out = w;
  return 0;
}

static int enc_shape(enc *e, const kiln_shape *s, unsigned depth, Kiln__V1__Shape **out);

static int enc_layout(enc *e, const kiln_layout *l, Kiln__V1__Layout **out) {
  Kiln__V1__Layout *pl;
  NEW(e, Kiln__V1__Layout, kiln__v1__layout__init, pl);
  put_i64s(l->minor_to_major, l->rank, &pl->n_minor_to_major, &pl->minor_to_major);
  pl->tail = str(l->tail);
  pl->memory_space = l->memory_space;
  *out = pl;
  return 0;
}

static int enc_shape(enc *e, const kiln_shape *s, unsigned depth, Kiln__V1__Shape **out) {
  if (too_deep(depth)) return KILN_ELIMIT;
  Kiln__V1__Shape *ps;
  NEW(e, Kiln__V1__Shape, kiln__v1__shape__init, ps);
  *out = ps;
  ps->element_type = (Kiln__V1__ElementType)s->dtype;
  if (kiln_shape_is_tuple(s)) {
    if (new_ptrs(e, s->rank, (void ***)&ps->tuple_shapes)) return KILN_ENOMEM;
    ps->n_tuple_shapes = s->rank;
    for (uint32_t i = 0; i < s->rank; i++) {
      int rc = enc_shape(e, &s->tuple[i], depth + 1, &ps->tuple_shapes[i]);
      if (rc) return rc;
    }
    return 0;
  }
  put_i64s(s->dims, s->rank, &ps->n_dimensions, &ps->dimensions);
  if (kiln_shape_is_dynamic(s)) {
    ps->is_dynamic_dimension = kiln_arena_calloc(e->a, s->rank, sizeof(protobuf_c_boolean));
    if (ps->is_dynamic_dimension == NULL) return KILN_ENOMEM;
    ps->n_is_dynamic_dimension = s->rank;
    for (uint32_t i = 0; i < s->rank; i++) ps->is_dynamic_dimension[i] = s->dynamic[i] != 0;
  }
  return s->layout ? enc_layout(e, s->layout, &ps->layout) : 0;
}

/* Literal data is little-endian on the wire; on a big-endian host each
 * element (each half of a complex one) is reversed into a copy. */
static int enc_data(enc *e, const kiln_literal *lit, ProtobufCBinaryData *out) {
  out->len = lit->nbytes;
  out->data = lit->nbytes ? lit->data : NULL;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  size_t unit = kiln_dtype_size(lit->shape.dtype);
  if (kiln_dtype_is_complex(lit->shape.dtype)) unit /= 2;
  if (unit > 1 && lit->nbytes) {
    uint8_t *w = kiln_arena_alloc(e->a, lit->nbytes);
    if (w == NULL) return KILN_ENOMEM;
    const uint8_t *r = lit->data;
    for (size_t i = 0; i + unit <= lit->nbytes; i += unit)
      for (size_t k = 0; k < unit; k++) w[i + k] = r[i + unit - 1 - k];
    out->data = w;
  }
#else
  (void)e;
#endif
  return 0;
}

/* Tuple elements leave their shape out: it is the parent's tuple_shapes[i]. */
static int enc_literal(enc *e, const kiln_literal *lit, bool with_shape, unsigned depth,
                       Kiln__V1__Literal **out) {
  if (too_deep(depth)) return KILN_ELIMIT;
  Kiln__V1__Literal *pl;
  NEW(e, Kiln__V1__Literal, kiln__v1__literal__init, pl);
  *out = pl;
  int rc = with_shape ? enc_shape(e, &lit->shape, 0, &pl->shape) : 0;
  if (rc) return rc;
  if (kiln_shape_is_tuple(&lit->shape)) {
    if (new_ptrs(e, lit->shape.rank, (void ***)&pl->tuple_literals)) return KILN_ENOMEM;
    pl->n_tuple_literals = lit->shape.rank;
    for (uint32_t i = 0; i < lit->shape.rank; i++) {
      rc = enc_literal(e, lit->elems[i], false, depth + 1, &pl->tuple_literals[i]);
      if (rc) return rc;
    }
    return 0;
  }
  if (lit->dynamic_sizes)
    put_i64s(lit->dynamic_sizes, lit->shape.rank, &pl->n_dynamic_sizes, &pl->dynamic_sizes);
  return enc_data(e, lit, &pl->data);
}

static int enc_sharding(enc *e, const kiln_sharding *s, unsigned depth, Kiln__V1__Sharding **out) {
  if (too_deep(depth)) return KILN_ELIMIT;
  Kiln__V1__Sharding *ps;
  NEW(e, Kiln__V1__Sharding, kiln__v1__sharding__init, ps);
  *out = ps;
  ps->kind = (Kiln__V1__ShardingKind)s->kind;
  ps->device = s->device;
  put_i64s(s->tile_dims.v, s->tile_dims.n, &ps->n_tile_dims, &ps->tile_dims);
  put_i64s(s->devices.v, s->devices.n, &ps->n_devices, &ps->devices);
  put_i64s(s->iota_reshape.v, s->iota_reshape.n, &ps->n_iota_reshape, &ps->iota_reshape);
  put_i64s(s->iota_perm.v, s->iota_perm.n, &ps->n_iota_perm, &ps->iota_perm);
  ps->last_tile_dim_replicate = s->last_tile_dim_replicate;
  if (s->last_tile_dims.n) {
    ps->last_tile_dims = kiln_arena_alloc(e->a, s->last_tile_dims.n * sizeof *ps->last_tile_dims);
    if (ps->last_tile_dims == NULL) return KILN_ENOMEM;
    ps->n_last_tile_dims = s->last_tile_dims.n;
    for (uint32_t i = 0; i < s->last_tile_dims.n; i++)
      ps->last_tile_dims[i] = (Kiln__V1__ShardingKind)s->last_tile_dims.v[i];
  }
  ps->extra = str(s->extra);
  if (new_ptrs(e, s->nelems, (void ***)&ps->tuple_shardings)) return KILN_ENOMEM;
  ps->n_tuple_shardings = s->nelems;
  for (uint32_t i = 0; i < s->nelems; i++) {
    int rc = enc_sharding(e, &s->elems[i], depth + 1, &ps->tuple_shardings[i]);
    if (rc) return rc;
  }
  return 0;
}

static int enc_window(enc *e, const kiln_window *w, Kiln__V1__Window **out) {
  Kiln__V1__Window *pw;
  NEW(e, Kiln__V1__Window, kiln__v1__window__init, pw);
  *out = pw;
  uint32_t n = w ? w->rank : 0;
  if (new_ptrs(e, n, (void ***)&pw->dimensions)) return KILN_ENOMEM;
  pw->n_dimensions = n;
  for (uint32_t i = 0; i < n; i++) {
    const kiln_window_dim *d = &w->dims[i];
    Kiln__V1__WindowDimension *pd;
    NEW(e, Kiln__V1__WindowDimension, kiln__v1__window_dimension__init, pd);
    pd->size = d->size;
    pd->stride = d->stride;
    pd->padding_low = d->pad_lo;
    pd->padding_high = d->pad_hi;
    pd->base_dilation = d->lhs_dilate;
    pd->window_dilation = d->rhs_dilate;
    pd->window_reversal = d->reversal;
    pw->dimensions[i] = pd;
  }
  return 0;
}

static int enc_conv(enc *e, const kiln_conv_dims *c, Kiln__V1__ConvolutionDimensions **out) {
  Kiln__V1__ConvolutionDimensions *pc;
  NEW(e, Kiln__V1__ConvolutionDimensions, kiln__v1__convolution_dimensions__init, pc);
  *out = pc;
  if (c == NULL) return 0;
  pc->input_batch_dimension = c->in_batch;
  pc->input_feature_dimension = c->in_feature;
  pc->kernel_input_feature_dimension = c->kernel_in;
  pc->kernel_output_feature_dimension = c->kernel_out;
  pc->output_batch_dimension = c->out_batch;
  pc->output_feature_dimension = c->out_feature;
  put_i64s(c->in_spatial, c->nspatial, &pc->n_input_spatial_dimensions,
           &pc->input_spatial_dimensions);
  put_i64s(c->kernel_spatial, c->nspatial, &pc->n_kernel_spatial_dimensions,
           &pc->kernel_spatial_dimensions);
  put_i64s(c->out_spatial, c->nspatial, &pc->n_output_spatial_dimensions,
           &pc->output_spatial_dimensions);
  return 0;
}

static int enc_int64_list(enc *e, const kiln_i64s *v, Kiln__V1__Int64List **out) {
  Kiln__V1__Int64List *pv;
  NEW(e, Kiln__V1__Int64List, kiln__v1__int64_list__init, pv);
  put_i64s(v->v, v->n, &pv->n_values, &pv->values);
  *out = pv;
  return 0;
}

static int enc_groups(enc *e, const kiln_replica_groups *g, Kiln__V1__ReplicaGroups **out) {
  Kiln__V1__ReplicaGroups *pg;
  NEW(e, Kiln__V1__ReplicaGroups, kiln__v1__replica_groups__init, pg);
  *out = pg;
  if (g == NULL) return 0;
  pg->iota = g->iota;
  put_i64s(g->iota_shape.v, g->iota_shape.n, &pg->n_iota_shape, &pg->iota_shape);
  put_i64s(g->iota_reshape.v, g->iota_reshape.n, &pg->n_iota_reshape, &pg->iota_reshape);
  put_i64s(g->iota_perm.v, g->iota_perm.n, &pg->n_iota_perm, &pg->iota_perm);
  if (new_ptrs(e, g->ngroups, (void ***)&pg->groups)) return KILN_ENOMEM;
  pg->n_groups = g->ngroups;
  for (uint32_t i = 0; i < g->ngroups; i++) {
    int rc = enc_int64_list(e, &g->groups[i], &pg->groups[i]);
    if (rc) return rc;
  }
  return 0;
}

/* The value goes in the oneof member the key's kind names (see AttrKey in
 * hlo.proto); the decoder insists on the same member. */
static int enc_attr(enc *e, const kiln_attr *at, Kiln__V1__Attribute **out) {
  Kiln__V1__Attribute *pa;
  NEW(e, Kiln__V1__Attribute, kiln__v1__attribute__init, pa);
  *out = pa;
  pa->key = (Kiln__V1__AttrKey)at->key;
  pa->name = str(at->key == KILN_ATTR_UNKNOWN ? at->name : NULL);
  switch (kiln_attr_key_kind(at->key)) {
  case KILN_AK_INT:
  case KILN_AK_BOOL:
  case KILN_AK_CMP_DIR:
    pa->value_case = KILN__V1__ATTRIBUTE__VALUE_I;
    pa->i = at->v.i;
    return 0;
  case KILN_AK_FLOAT:
    pa->value_case = KILN__V1__ATTRIBUTE__VALUE_F;
    pa->f = at->v.f;
    return 0;
  case KILN_AK_INTS:
  case KILN_AK_SLICE:
  case KILN_AK_PADDING:
  case KILN_AK_PAIRS:
    pa->value_case = KILN__V1__ATTRIBUTE__VALUE_INTS;
    return enc_int64_list(e, &at->v.ints, &pa->ints);
  case KILN_AK_WINDOW:
    pa->value_case = KILN__V1__ATTRIBUTE__VALUE_WINDOW;
    return enc_window(e, at->v.window, &pa->window);
  case KILN_AK_DIM_LABELS:
    pa->value_case = KILN__V1__ATTRIBUTE__VALUE_CONV;
    return enc_conv(e, at->v.conv, &pa->conv);
  case KILN_AK_REPLICA_GROUPS:
    pa->value_case = KILN__V1__ATTRIBUTE__VALUE_REPLICA_GROUPS;
    return enc_groups(e, at->v.groups, &pa->replica_groups);
  case KILN_AK_SHARDING: {
    pa->value_case = KILN__V1__ATTRIBUTE__VALUE_SHARDING;
    static const kiln_sharding none = {.kind = KILN_SHARD_REPLICATED};
    return enc_sharding(e, at->v.sharding ? at->v.sharding : &none, 0, &pa->sharding);
  }
  case KILN_AK_IDENT:
  case KILN_AK_STRING:
  case KILN_AK_OPAQUE:
    pa->value_case = KILN__V1__ATTRIBUTE__VALUE_S;
    pa->s = str(at->v.s);
    return 0;
  }
  return 0;
}

static int enc_instr(enc *e, const kiln_instr *ins, Kiln__V1__Instruction **out) {
  Kiln__V1__Instruction *pi;
  NEW(e, Kiln__V1__Instruction, kiln__v1__instruction__init, pi);
  *out = pi;
  pi->id = ins->id;
  pi->opcode = (Kiln__V1__Opcode)ins->op;
  pi->async_op = (Kiln__V1__Opcode)ins->async_op;
  pi->name = str(ins->name);
  e->cur = ins;
  int rc = enc_shape(e, &ins->shape, 0, &pi->shape);
  if (rc) return rc;
  if ((rc = put_ids(e, ins->operands, ins->noperands, &pi->n_operands, &pi->operands)) ||
      (rc = put_ids(e, ins->called, ins->ncalled, &pi->n_called_computations,
                    &pi->called_computations)) ||
      (rc = put_ids(e, ins->control_preds, ins->ncontrol, &pi->n_control_predecessors,
                    &pi->control_predecessors)))
    return rc;
  if (new_ptrs(e, ins->nattrs, (void ***)&pi->attributes)) return KILN_ENOMEM;
  pi->n_attributes = ins->nattrs;
  for (uint32_t i = 0; i < ins->nattrs; i++) {
    rc = enc_attr(e, &ins->attrs[i], &pi->attributes[i]);
    if (rc) return rc;
  }
  if (ins->literal) {
    rc = enc_literal(e, ins->literal, true, 0, &pi->literal);
    if (rc) return rc;
  }
  pi->parameter_number = ins->param_number;
  pi->line = ins->line;
  pi->column = ins->col;
  return 0;
}

static int enc_computation(enc *e, const kiln_module *m, const kiln_computation *c,
                           Kiln__V1__Computation **out) {
  Kiln__V1__Computation *pc;
  NEW(e, Kiln__V1__Computation, kiln__v1__computation__init, pc);
  *out = pc;
  pc->name = str(c->name);
  pc->root_id = c->root == KILN_NO_ID ? -1 : (int64_t)c->root;
  pc->is_entry = c->is_entry;
  pc->line = c->line;
  pc->column = c->col;
  if (new_ptrs(e, c->ninstrs, (void ***)&pc->instructions)) return KILN_ENOMEM;
  pc->n_instructions = c->ninstrs;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    int rc = enc_instr(e, m->instrs[c->instrs[i]], &pc->instructions[i]);
    if (rc) return rc;
  }
  return 0;
}

static int enc_program_shape(enc *e, const kiln_program_shape *p, Kiln__V1__ProgramShape **out) {
  Kiln__V1__ProgramShape *pp;
  NEW(e, Kiln__V1__ProgramShape, kiln__v1__program_shape__init, pp);
  *out = pp;
  if (new_ptrs(e, p->nparams, (void ***)&pp->parameters)) return KILN_ENOMEM;
  pp->n_parameters = p->nparams;
  for (uint32_t i = 0; i < p->nparams; i++) {
    int rc = enc_shape(e, &p->params[i], 0, &pp->parameters[i]);
    if (rc) return rc;
  }
  return enc_shape(e, &p->result, 0, &pp->result);
}

static int enc_header(enc *e, const kiln_module *m, Kiln__V1__Module *pm) {
  e->cur = NULL;
  if (m->entry_layout) {
    int rc = enc_program_shape(e, m->entry_layout, &pm->entry_computation_layout);
    if (rc) return rc;
  }
  pm->is_scheduled = m->is_scheduled < 0    ? KILN__V1__TRISTATE__TRISTATE_UNSET
                     : m->is_scheduled == 0 ? KILN__V1__TRISTATE__TRISTATE_FALSE
                                            : KILN__V1__TRISTATE__TRISTATE_TRUE;
  pm->has_input_output_alias = m->has_aliases;
  if (new_ptrs(e, m->naliases, (void ***)&pm->input_output_alias)) return KILN_ENOMEM;
  pm->n_input_output_alias = m->naliases;
  for (uint32_t i = 0; i < m->naliases; i++) {
    const kiln_alias *al = &m->aliases[i];
    Kiln__V1__InputOutputAlias *pa;
    NEW(e, Kiln__V1__InputOutputAlias, kiln__v1__input_output_alias__init, pa);
    put_i64s(al->output_index.v, al->output_index.n, &pa->n_output_shape_index,
             &pa->output_shape_index);
    pa->parameter_number = al->param_number;
    put_i64s(al->param_index.v, al->param_index.n, &pa->n_parameter_shape_index,
             &pa->parameter_shape_index);
    pa->kind = (Kiln__V1__AliasKind)al->kind;
    pm->input_output_alias[i] = pa;
  }
  pm->replica_count = m->replica_count;
  pm->num_partitions = m->num_partitions;
  if (new_ptrs(e, m->nheader_extra, (void ***)&pm->header_attributes)) return KILN_ENOMEM;
  pm->n_header_attributes = m->nheader_extra;
  for (uint32_t i = 0; i < m->nheader_extra; i++) {
    Kiln__V1__HeaderAttribute *ph;
    NEW(e, Kiln__V1__HeaderAttribute, kiln__v1__header_attribute__init, ph);
    ph->name = str(m->header_extra[i].name);
    ph->text = str(m->header_extra[i].text);
    pm->header_attributes[i] = ph;
  }
  if (new_ptrs(e, m->nsections, (void ***)&pm->debug_sections)) return KILN_ENOMEM;
  pm->n_debug_sections = m->nsections;
  for (uint32_t i = 0; i < m->nsections; i++) {
    Kiln__V1__HeaderAttribute *ph;
    NEW(e, Kiln__V1__HeaderAttribute, kiln__v1__header_attribute__init, ph);
    ph->name = str(m->sections[i].name);
    ph->text = str(m->sections[i].text);
    pm->debug_sections[i] = ph;
  }
  return 0;
}

static int enc_module(enc *e, const kiln_module *m, Kiln__V1__Module *pm) {
  pm->name = str(m->name);
  pm->entry_computation_index = m->entry == KILN_NO_ID ? -1 : (int64_t)m->entry;
  if (new_ptrs(e, m->ncomps, (void ***)&pm->computations)) return KILN_ENOMEM;
  pm->n_computations = m->ncomps;
  for (uint32_t i = 0; i < m->ncomps; i++) {
    int rc = enc_computation(e, m, m->comps[i], &pm->computations[i]);
    if (rc) return rc;
  }
  return enc_header(e, m, pm);
}

int kiln_module_to_proto(const kiln_module *m, uint8_t **buf, size_t *len, kiln_status *st) {
  *buf = NULL;
  *len = 0;
  enc e = {.a = kiln_arena_create()};
  if (e.a == NULL) goto out_oom;
  Kiln__V1__Module pm;
  kiln__v1__module__init(&pm);
  int rc = enc_module(&e, m, &pm);
  if (rc == KILN_ELIMIT) {
    char where[KILN_STATUS_WHERE_MAX] = "";
    if (e.cur) kiln_instr_where(m, e.cur, where, sizeof where);
    kiln_arena_destroy(e.a);
    return kiln_status_set(st, KILN_ELIMIT, where[0] ? where : NULL,
                           "%s nested deeper than %d levels, the limit of kiln.v1.Module",
                           e.cur ? "tuples" : "entry_computation_layout tuples",
                           KILN_PROTO_MAX_TUPLE_DEPTH);
  }
  if (rc) goto out_free_arena_oom;
  size_t n = kiln__v1__module__get_packed_size(&pm);
  uint8_t *out = kiln_malloc(n ? n : 1);
  if (out == NULL) goto out_free_arena_oom;
  size_t packed = kiln__v1__module__pack(&pm, out);
  kiln_arena_destroy(e.a);
  if (packed != n) {
    kiln_free(out);
    return kiln_status_set(st, KILN_EINTERNAL, NULL,
                           "protobuf-c packed %zu bytes of a %zu-byte module", packed, n);
  }
  /* Strings the module holds are not necessarily UTF-8 (text input may
   * carry any bytes inside quotes); refuse rather than emit a message other
   * runtimes reject. */
  rc = kiln__proto_check_wire(&kiln__v1__module__descriptor, out, n, st);
  if (rc) {
    kiln_free(out);
    return rc;
  }
  *buf = out;
  *len = n;
  return 0;
out_free_arena_oom:
  kiln_arena_destroy(e.a);
out_oom:
  return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory encoding module %s",
                         m->name ? m->name : "");
}

int kiln_module_from_proto(const uint8_t *buf, size_t len, kiln_module **out, kiln_status *st) {
  *out = NULL;
  int rc = kiln__proto_check_wire(&kiln__v1__module__descriptor, buf, len, st);
  if (rc) return rc;
  kiln__proto_alloc alloc;
  kiln__proto_alloc_init(&alloc, KILN_PROTO_UNPACK_BUDGET(len));
  static const uint8_t empty[1];
  Kiln__V1__Module *pm = kiln__v1__module__unpack(&alloc.base, len, len ? buf : empty);
  if (pm == NULL) {
    if (alloc.failed)
      return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory decoding a module");
    if (alloc.over_budget)
      return kiln_status_set(st, KILN_ELIMIT, NULL,
                             "a %zu-byte kiln.v1.Module needs more than %zu bytes to unpack; "
                             "too many empty messages",
                             len, KILN_PROTO_UNPACK_BUDGET(len));
    return kiln_status_set(st, KILN_EINVAL, NULL, "not a valid kiln.v1.Module message");
  }
  rc = kiln__proto_module_decode(pm, out, st);
  kiln__v1__module__free_unpacked(pm, &alloc.base);
  return rc;
}
