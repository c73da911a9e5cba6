/* Unit tests for the IR <-> kiln.v1.Module codec (compiler/ir/proto_*.c).
 *
 * Four layers: the schema mirrors the .def tables; modules built with the
 * IR builder (every attribute kind, every literal storage class, nested
 * tuples, odd id orders) survive encode -> decode field by field and print
 * identically; hostile messages (garbage, truncation, every id, index, enum,
 * size and depth check) fail with their exact messages, and allocation
 * failures anywhere turn into KILN_ENOMEM; and every module of the
 * conformance corpus goes text -> IR -> proto -> IR -> text unchanged.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/fp16.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/proto_codec.h"
#include "compiler/ir/proto_internal.h"
#include "compiler/ir/text.h"
#include "kiln/v1/hlo.pb-c.h"
#include "kiln/v1/kiln.pb-c.h"

#if __has_include("compiler/ir/text_print.c")
#define HAVE_PRINTER 1
#else
#define HAVE_PRINTER 0
#endif
#if __has_include("compiler/ir/text_parse.c")
#define HAVE_PARSER 1
#else
#define HAVE_PARSER 0
#endif

/* ---- structural equality, reporting the first difference ------------------ */

typedef struct diff {
  char where[512];
  bool found;
} diff;

static bool differ(diff *df, const char *fmt, const char *a, const char *b) {
  if (!df->found) {
    df->found = true;
    snprintf(df->where, sizeof df->where, fmt, a, b);
  }
  return false;
}

#define SAME(cond, what) \
  do { \
    if (!(cond)) return differ(df, "%s%s", ctx, " " what); \
  } while (0)

static bool same_i64s(const int64_t *a, uint32_t na, const int64_t *b, uint32_t nb) {
  return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static bool same_str(const char *a, const char *b) {
  if (a == NULL || b == NULL) return a == b;
  return strcmp(a, b) == 0;
}

static bool same_shape(diff *df, const char *ctx, const kiln_shape *a, const kiln_shape *b) {
  SAME(kiln_shape_equal(a, b, true), "shape");
  if (kiln_shape_is_tuple(a)) {
    for (uint32_t i = 0; i < a->rank; i++)
      if (!same_shape(df, ctx, &a->tuple[i], &b->tuple[i])) return false;
    return true;
  }
  SAME((a->layout == NULL) == (b->layout == NULL), "layout presence");
  if (a->layout) {
    SAME(same_i64s(a->layout->minor_to_major, a->layout->rank, b->layout->minor_to_major,
                   b->layout->rank),
         "minor_to_major");
    SAME(same_str(a->layout->tail, b->layout->tail), "layout tail");
    SAME(a->layout->memory_space == b->layout->memory_space, "memory space");
  }
  return true;
}

static bool same_literal(diff *df, const char *ctx, const kiln_literal *a, const kiln_literal *b) {
  SAME((a == NULL) == (b == NULL), "literal presence");
  if (a == NULL) return true;
  if (!same_shape(df, ctx, &a->shape, &b->shape)) return false;
  SAME(kiln_literal_equal(a, b), "literal data");
  if (kiln_shape_is_tuple(&a->shape)) {
    for (uint32_t i = 0; i < a->shape.rank; i++)
      if (!same_literal(df, ctx, a->elems[i], b->elems[i])) return false;
    return true;
  }
  SAME((a->dynamic_sizes == NULL) == (b->dynamic_sizes == NULL), "dynamic sizes presence");
  if (a->dynamic_sizes)
    SAME(same_i64s(a->dynamic_sizes, a->shape.rank, b->dynamic_sizes, b->shape.rank),
         "dynamic sizes");
  return true;
}

static bool same_sharding(diff *df, const char *ctx, const kiln_sharding *a,
                          const kiln_sharding *b) {
  SAME(a->kind == b->kind && a->device == b->device, "sharding kind/device");
  SAME(same_i64s(a->tile_dims.v, a->tile_dims.n, b->tile_dims.v, b->tile_dims.n), "tile_dims");
  SAME(same_i64s(a->devices.v, a->devices.n, b->devices.v, b->devices.n), "devices");
  SAME(same_i64s(a->iota_reshape.v, a->iota_reshape.n, b->iota_reshape.v, b->iota_reshape.n),
       "iota_reshape");
  SAME(same_i64s(a->iota_perm.v, a->iota_perm.n, b->iota_perm.v, b->iota_perm.n), "iota_perm");
  SAME(a->last_tile_dim_replicate == b->last_tile_dim_replicate, "last_tile_dim_replicate");
  SAME(
      same_i64s(a->last_tile_dims.v, a->last_tile_dims.n, b->last_tile_dims.v, b->last_tile_dims.n),
      "last_tile_dims");
  SAME(same_str(a->extra, b->extra), "sharding extra");
  SAME(a->nelems == b->nelems, "sharding elements");
  for (uint32_t i = 0; i < a->nelems; i++)
    if (!same_sharding(df, ctx, &a->elems[i], &b->elems[i])) return false;
  return true;
}

static bool same_attr(diff *df, const char *ctx, const kiln_attr *a, const kiln_attr *b) {
  SAME(a->key == b->key && same_str(a->name, b->name), "attribute key");
  switch (kiln_attr_key_kind(a->key)) {
  case KILN_AK_INT:
  case KILN_AK_BOOL:
  case KILN_AK_CMP_DIR: SAME(a->v.i == b->v.i, "int value"); return true;
  case KILN_AK_FLOAT:
    SAME(memcmp(&a->v.f, &b->v.f, sizeof a->v.f) == 0, "float value");
    return true;
  case KILN_AK_INTS:
  case KILN_AK_SLICE:
  case KILN_AK_PADDING:
  case KILN_AK_PAIRS:
    SAME(same_i64s(a->v.ints.v, a->v.ints.n, b->v.ints.v, b->v.ints.n), "ints value");
    return true;
  case KILN_AK_WINDOW:
    SAME(a->v.window->rank == b->v.window->rank, "window rank");
    SAME(a->v.window->rank == 0 || memcmp(a->v.window->dims, b->v.window->dims,
                                          a->v.window->rank * sizeof(kiln_window_dim)) == 0,
         "window dims");
    return true;
  case KILN_AK_DIM_LABELS: {
    const kiln_conv_dims *x = a->v.conv, *y = b->v.conv;
    SAME(x->in_batch == y->in_batch && x->in_feature == y->in_feature &&
             x->kernel_in == y->kernel_in && x->kernel_out == y->kernel_out &&
             x->out_batch == y->out_batch && x->out_feature == y->out_feature,
         "conv dims");
    SAME(same_i64s(x->in_spatial, x->nspatial, y->in_spatial, y->nspatial) &&
             same_i64s(x->kernel_spatial, x->nspatial, y->kernel_spatial, y->nspatial) &&
             same_i64s(x->out_spatial, x->nspatial, y->out_spatial, y->nspatial),
         "conv spatial dims");
    return true;
  }
  case KILN_AK_REPLICA_GROUPS: {
    const kiln_replica_groups *x = a->v.groups, *y = b->v.groups;
    SAME(x->iota == y->iota, "replica groups iota");
    SAME(
        same_i64s(x->iota_shape.v, x->iota_shape.n, y->iota_shape.v, y->iota_shape.n) &&
            same_i64s(x->iota_reshape.v, x->iota_reshape.n, y->iota_reshape.v, y->iota_reshape.n) &&
            same_i64s(x->iota_perm.v, x->iota_perm.n, y->iota_perm.v, y->iota_perm.n),
        "replica groups iota form");
    SAME(x->ngroups == y->ngroups, "replica group count");
    for (uint32_t i = 0; i < x->ngroups; i++)
      SAME(same_i64s(x->groups[i].v, x->groups[i].n, y->groups[i].v, y->groups[i].n),
           "replica group");
    return true;
  }
  case KILN_AK_SHARDING: return same_sharding(df, ctx, a->v.sharding, b->v.sharding);
  case KILN_AK_IDENT:
  case KILN_AK_STRING:
  case KILN_AK_OPAQUE: SAME(same_str(a->v.s, b->v.s), "string value"); return true;
  }
  return true;
}

static bool same_instr(diff *df, const kiln_instr *a, const kiln_instr *b) {
  char ctx[300];
  snprintf(ctx, sizeof ctx, "instruction %u (%s):", a->id, a->name);
  SAME(a->id == b->id && a->comp == b->comp, "id/computation");
  SAME(a->op == b->op && a->async_op == b->async_op, "opcode");
  SAME(same_str(a->name, b->name), "name");
  if (!same_shape(df, ctx, &a->shape, &b->shape)) return false;
  SAME(a->noperands == b->noperands &&
           (a->noperands == 0 ||
            memcmp(a->operands, b->operands, a->noperands * sizeof(kiln_id)) == 0),
       "operands");
  SAME(a->ncalled == b->ncalled &&
           (a->ncalled == 0 || memcmp(a->called, b->called, a->ncalled * sizeof(uint32_t)) == 0),
       "called");
  SAME(a->ncontrol == b->ncontrol &&
           (a->ncontrol == 0 ||
            memcmp(a->control_preds, b->control_preds, a->ncontrol * sizeof(kiln_id)) == 0),
       "control predecessors");
  SAME(a->nattrs == b->nattrs, "attribute count");
  for (uint32_t i = 0; i < a->nattrs; i++)
    if (!same_attr(df, ctx, &a->attrs[i], &b->attrs[i])) return false;
  if (!same_literal(df, ctx, a->literal, b->literal)) return false;
  SAME(a->param_number == b->param_number, "parameter number");
  SAME(a->line == b->line && a->col == b->col, "source position");
  return true;
}

static bool same_header(diff *df, const kiln_module *a, const kiln_module *b) {
  const char *ctx = "header:";
  SAME(same_str(a->name, b->name), "module name");
  SAME(a->entry == b->entry, "entry");
  SAME((a->entry_layout == NULL) == (b->entry_layout == NULL), "entry layout presence");
  if (a->entry_layout) {
    SAME(a->entry_layout->nparams == b->entry_layout->nparams, "entry layout params");
    for (uint32_t i = 0; i < a->entry_layout->nparams; i++)
      if (!same_shape(df, ctx, &a->entry_layout->params[i], &b->entry_layout->params[i]))
        return false;
    if (!same_shape(df, ctx, &a->entry_layout->result, &b->entry_layout->result)) return false;
  }
  SAME(a->is_scheduled == b->is_scheduled, "is_scheduled");
  SAME(a->has_aliases == b->has_aliases && a->naliases == b->naliases, "aliases");
  for (uint32_t i = 0; i < a->naliases; i++) {
    const kiln_alias *x = &a->aliases[i], *y = &b->aliases[i];
    SAME(same_i64s(x->output_index.v, x->output_index.n, y->output_index.v, y->output_index.n) &&
             x->param_number == y->param_number && x->kind == y->kind &&
             same_i64s(x->param_index.v, x->param_index.n, y->param_index.v, y->param_index.n),
         "alias entry");
  }
  SAME(a->replica_count == b->replica_count && a->num_partitions == b->num_partitions,
       "replica_count/num_partitions");
  SAME(a->nheader_extra == b->nheader_extra, "header extras");
  for (uint32_t i = 0; i < a->nheader_extra; i++)
    SAME(same_str(a->header_extra[i].name, b->header_extra[i].name) &&
             same_str(a->header_extra[i].text, b->header_extra[i].text),
         "header extra");
  return true;
}

static bool same_module(diff *df, const kiln_module *a, const kiln_module *b) {
  if (!same_header(df, a, b)) return false;
  const char *ctx = "module:";
  SAME(a->ncomps == b->ncomps && a->ninstrs == b->ninstrs, "sizes");
  for (uint32_t c = 0; c < a->ncomps; c++) {
    const kiln_computation *x = a->comps[c], *y = b->comps[c];
    SAME(x->id == y->id && same_str(x->name, y->name), "computation name");
    SAME(x->ninstrs == y->ninstrs &&
             memcmp(x->instrs, y->instrs, x->ninstrs * sizeof(kiln_id)) == 0,
         "computation order");
    SAME(x->root == y->root && x->is_entry == y->is_entry, "root/entry");
    SAME(x->line == y->line && x->col == y->col, "computation position");
  }
  for (uint32_t i = 0; i < a->ninstrs; i++)
    if (!same_instr(df, a->instrs[i], b->instrs[i])) return false;
  return true;
}

/* ---- helpers ---------------------------------------------------------------------------- */

static kiln_module *roundtrip(const kiln_module *m) {
  uint8_t *buf = NULL;
  size_t len = 0;
  kiln_status st = {0};
  int rc = kiln_module_to_proto(m, &buf, &len, &st);
  ck_assert_msg(rc == 0, "encode: %s", st.msg);
  kiln_module *back = NULL;
  rc = kiln_module_from_proto(buf, len, &back, &st);
  ck_assert_msg(rc == 0, "decode: %s", st.msg);
  kiln_free(buf);
  return back;
}

static void check_roundtrip(const kiln_module *m) {
  kiln_module *back = roundtrip(m);
  diff df = {.found = false};
  ck_assert_msg(same_module(&df, m, back), "differs at %s", df.where);
#if HAVE_PRINTER
  char *t1 = kiln_module_print(m, NULL), *t2 = kiln_module_print(back, NULL);
  ck_assert_ptr_nonnull(t1);
  ck_assert_ptr_nonnull(t2);
  ck_assert_str_eq(t2, t1);
  kiln_free(t1);
  kiln_free(t2);
#endif
  /* Encoding is deterministic: the decoded module encodes to the same bytes. */
  uint8_t *b1, *b2;
  size_t n1, n2;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_module_to_proto(m, &b1, &n1, &st), 0);
  ck_assert_int_eq(kiln_module_to_proto(back, &b2, &n2, &st), 0);
  ck_assert_uint_eq(n1, n2);
  ck_assert(memcmp(b1, b2, n1) == 0);
  kiln_free(b1);
  kiln_free(b2);
  kiln_module_destroy(back);
}

static kiln_shape arr(kiln_module *m, kiln_dtype t, const int64_t *dims, uint32_t rank) {
  kiln_shape s;
  ck_assert_int_eq(kiln_shape_make_array(m->arena, &s, t, dims, rank), 0);
  return s;
}

static kiln_shape scalar(kiln_module *m, kiln_dtype t) { return arr(m, t, NULL, 0); }

static kiln_instr *instr(kiln_module *m, uint32_t comp, kiln_opcode op, const char *name,
                         kiln_shape s, const kiln_id *ops, uint32_t nops) {
  kiln_instr *ins = kiln_module_add_instr(m, comp, op, name);
  ck_assert_ptr_nonnull(ins);
  ck_assert_int_eq(kiln_instr_set_shape(m, ins, &s), 0);
  if (nops) ck_assert_int_eq(kiln_instr_set_operands(m, ins, ops, nops), 0);
  return ins;
}

static kiln_instr *param(kiln_module *m, uint32_t comp, const char *name, kiln_shape s, int64_t n) {
  kiln_instr *ins = instr(m, comp, KILN_OP_PARAMETER, name, s, NULL, 0);
  ins->param_number = n;
  return ins;
}

/* A constant holding `lit` (cloned into the module). */
static kiln_instr *constant(kiln_module *m, uint32_t comp, const char *name, kiln_literal *lit) {
  kiln_instr *ins = instr(m, comp, KILN_OP_CONSTANT, name, lit->shape, NULL, 0);
  kiln_status st = {0};
  ck_assert_int_eq(kiln_literal_clone(m->arena, lit, &ins->literal, &st), 0);
  kiln_literal_destroy(lit);
  return ins;
}

static kiln_literal *new_lit(const kiln_shape *s) {
  kiln_literal *lit = NULL;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_literal_create(NULL, s, 0, &lit, &st), 0);
  return lit;
}

static int64_t *i64dup(kiln_module *m, const int64_t *v, uint32_t n) {
  return kiln_arena_memdup(m->arena, v, n * sizeof *v);
}

static kiln_i64s list(kiln_module *m, const int64_t *v, uint32_t n) {
  kiln_i64s l = {n ? i64dup(m, v, n) : NULL, n};
  return l;
}

/* ---- schema ------------------------------------------------------------------------------ */

START_TEST(test_enums_mirror_tables) {
  const ProtobufCEnumDescriptor *d;
  char want[80];
  d = &kiln__v1__element_type__descriptor;
  ck_assert_uint_eq(d->n_values, KILN_DTYPE_COUNT);
#define X(e, s, bits, bytes, kind) \
  snprintf(want, sizeof want, "ELEMENT_TYPE_%s", #e); \
  ck_assert_str_eq(protobuf_c_enum_descriptor_get_value(d, KILN_##e)->name, want);
#include "compiler/ir/types.def"
#undef X
  d = &kiln__v1__opcode__descriptor;
  ck_assert_uint_eq(d->n_values, KILN_OP_COUNT);
#define X(e, s, arity, family, flags) \
  snprintf(want, sizeof want, "OPCODE_%s", #e); \
  ck_assert_str_eq(protobuf_c_enum_descriptor_get_value(d, KILN_OP_##e)->name, want);
#include "compiler/ir/ops.def"
#undef X
  d = &kiln__v1__attr_key__descriptor;
  ck_assert_uint_eq(d->n_values, KILN_ATTR_COUNT);
#define X(e, s, kind) \
  snprintf(want, sizeof want, "ATTR_KEY_%s", #e); \
  ck_assert_str_eq(protobuf_c_enum_descriptor_get_value(d, KILN_ATTR_##e)->name, want);
#include "compiler/ir/attrs.def"
#undef X
  ck_assert_uint_eq(kiln__v1__sharding_kind__descriptor.n_values, KILN_SHARD_TUPLE + 1);
  ck_assert_uint_eq(kiln__v1__comparison_direction__descriptor.n_values, KILN_CMP_LT + 1);
}
END_TEST

START_TEST(test_service_schema) {
  /* The service is described for the server to come; its shape is part of
   * the contract clients are written against. */
  const ProtobufCServiceDescriptor *s = &kiln__v1__kiln__descriptor;
  ck_assert_str_eq(s->name, "kiln.v1.Kiln");
  ck_assert_uint_eq(s->n_methods, 12);
  const char *want[] = {"Compile",    "CompileStream",  "Execute",     "PutBuffer",
                        "GetBuffer",  "ReleaseBuffers", "Stats",       "CacheList",
                        "CacheEvict", "CacheExport",    "CacheImport", "RegisterKernel"};
  for (unsigned i = 0; i < 12; i++) ck_assert_str_eq(s->methods[i].name, want[i]);
  ck_assert_str_eq(s->methods[1].input->name, "kiln.v1.CompileRequest");
  ck_assert_str_eq(s->methods[1].output->name, "kiln.v1.CompileProgress");
  ck_assert_str_eq(s->methods[3].input->name, "kiln.v1.PutBufferChunk");
  ck_assert_str_eq(s->methods[4].output->name, "kiln.v1.BufferChunk");
  ck_assert_str_eq(s->methods[9].output->name, "kiln.v1.CacheExportResponse");
  ck_assert_str_eq(s->methods[10].input->name, "kiln.v1.CacheImportRequest");
  ck_assert_str_eq(s->methods[11].input->name, "kiln.v1.RegisterKernelRequest");
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field_by_name(&kiln__v1__argument__descriptor, "literal");
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_eq(f->descriptor, &kiln__v1__literal__descriptor);
  /* The SPMD fields of CompileResponse (docs/spmd.md), by number. */
  const char *spmd[] = {"per_device", "replica_count", "num_partitions"};
  for (unsigned i = 0; i < 3; i++) {
    f = protobuf_c_message_descriptor_get_field_by_name(&kiln__v1__compile_response__descriptor,
                                                        spmd[i]);
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(f->id, 13 + i);
  }
}
END_TEST

/* ---- builder modules round trip ------------------------------------------------------------- */

START_TEST(test_roundtrip_minimal) {
  kiln_module *m = kiln_module_create("tiny");
  uint32_t c;
  ck_assert_int_eq(kiln_module_add_computation(m, "main", &c), 0);
  m->entry = c;
  m->comps[c]->is_entry = true;
  int64_t d2[] = {2};
  kiln_instr *x = param(m, c, "x", arr(m, KILN_F32, d2, 1), 0);
  kiln_id ops[] = {x->id, x->id};
  kiln_instr *r = instr(m, c, KILN_OP_ADD, "r", arr(m, KILN_F32, d2, 1), ops, 2);
  m->comps[c]->root = r->id;
  check_roundtrip(m);

  /* The message itself, field by field. */
  uint8_t *buf;
  size_t len;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_module_to_proto(m, &buf, &len, &st), 0);
  Kiln__V1__Module *pm = kiln__v1__module__unpack(NULL, len, buf);
  ck_assert_ptr_nonnull(pm);
  ck_assert_str_eq(pm->name, "tiny");
  ck_assert_int_eq(pm->entry_computation_index, 0);
  ck_assert_int_eq(pm->is_scheduled, KILN__V1__TRISTATE__TRISTATE_UNSET);
  ck_assert_ptr_null(pm->entry_computation_layout);
  ck_assert_uint_eq(pm->n_computations, 1);
  const Kiln__V1__Computation *pc = pm->computations[0];
  ck_assert_str_eq(pc->name, "main");
  ck_assert(pc->is_entry);
  ck_assert_int_eq(pc->root_id, 1);
  ck_assert_uint_eq(pc->n_instructions, 2);
  const Kiln__V1__Instruction *pi = pc->instructions[1];
  ck_assert_int_eq(pi->id, 1);
  ck_assert_int_eq(pi->opcode, KILN__V1__OPCODE__OPCODE_ADD);
  ck_assert_int_eq(pi->async_op, KILN__V1__OPCODE__OPCODE_INVALID);
  ck_assert_str_eq(pi->name, "r");
  ck_assert_int_eq(pi->shape->element_type, KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_F32);
  ck_assert_uint_eq(pi->shape->n_dimensions, 1);
  ck_assert_int_eq(pi->shape->dimensions[0], 2);
  ck_assert_ptr_null(pi->shape->layout);
  ck_assert_uint_eq(pi->n_operands, 2);
  ck_assert_int_eq(pi->operands[0], 0);
  ck_assert_int_eq(pi->operands[1], 0);
  ck_assert_ptr_null(pi->literal);
  ck_assert_int_eq(pc->instructions[0]->opcode, KILN__V1__OPCODE__OPCODE_PARAMETER);
  kiln__v1__module__free_unpacked(pm, NULL);
  kiln_free(buf);
  kiln_module_destroy(m);
}
END_TEST

/* Constants of every storage class, including nested tuples, an empty
 * tuple, a zero-element array and a bounded-dynamic literal. */
static void add_literal_constants(kiln_module *m, uint32_t c) {
  static const kiln_dtype all[] = {
      KILN_PRED, KILN_S2,  KILN_S4,   KILN_S8,     KILN_S16,      KILN_S32,    KILN_S64,   KILN_U2,
      KILN_U4,   KILN_U8,  KILN_U16,  KILN_U32,    KILN_U64,      KILN_F16,    KILN_BF16,  KILN_F32,
      KILN_F64,  KILN_C64, KILN_C128, KILN_F8E5M2, KILN_F8E4M3FN, KILN_F8E4M3, KILN_F8E3M4};
  int64_t d3[] = {3};
  for (size_t k = 0; k < sizeof all / sizeof *all; k++) {
    kiln_shape s = arr(m, all[k], d3, 1);
    kiln_literal *lit = new_lit(&s);
    for (int64_t i = 0; i < 3; i++) {
      if (kiln_dtype_is_complex(all[k]))
        kiln_literal_set_c128(lit, i, 1.5 * (double)i, -0.25);
      else if (kiln_dtype_is_float(all[k]))
        kiln_literal_set_f64(lit, i, i == 2 ? -INFINITY : 0.5 + (double)i);
      else
        kiln_literal_set_s64(lit, i, -i);
    }
    char name[32];
    snprintf(name, sizeof name, "c.%s", kiln_dtype_name(all[k]));
    constant(m, c, name, lit);
  }
  /* NaN payload bits survive. */
  kiln_shape f32 = scalar(m, KILN_F32);
  kiln_literal *nan = new_lit(&f32);
  uint32_t bits = 0x7fc00123u;
  memcpy(nan->data, &bits, 4);
  constant(m, c, "c.nan", nan);

  /* ((f32[2], (s32[], pred[])), ()) */
  int64_t d2[] = {2};
  kiln_shape inner_e[2] = {scalar(m, KILN_S32), scalar(m, KILN_PRED)};
  kiln_shape inner, outer_e[2], outer, empty;
  ck_assert_int_eq(kiln_shape_make_tuple(m->arena, &inner, inner_e, 2), 0);
  outer_e[0] = arr(m, KILN_F32, d2, 1);
  outer_e[1] = inner;
  kiln_shape first;
  ck_assert_int_eq(kiln_shape_make_tuple(m->arena, &first, outer_e, 2), 0);
  ck_assert_int_eq(kiln_shape_make_tuple(m->arena, &empty, NULL, 0), 0);
  kiln_shape top_e[2] = {first, empty};
  ck_assert_int_eq(kiln_shape_make_tuple(m->arena, &outer, top_e, 2), 0);
  kiln_literal *t = new_lit(&outer);
  kiln_literal_set_f64(t->elems[0]->elems[0], 0, 1.0);
  kiln_literal_set_f64(t->elems[0]->elems[0], 1, 2.0);
  kiln_literal_set_s64(t->elems[0]->elems[1]->elems[0], 0, 7);
  kiln_literal_set_s64(t->elems[0]->elems[1]->elems[1], 0, 1);
  constant(m, c, "c.tuple", t);

  int64_t d02[] = {0, 2};
  kiln_shape z = arr(m, KILN_F32, d02, 2);
  constant(m, c, "c.empty", new_lit(&z));

  int64_t d4[] = {4};
  kiln_shape dyn = arr(m, KILN_S32, d4, 1);
  dyn.dynamic = kiln_arena_calloc(m->arena, 1, 1);
  dyn.dynamic[0] = 1;
  kiln_literal *dl = new_lit(&dyn);
  kiln_literal_set_s64(dl, 0, 5);
  dl->dynamic_sizes = kiln_arena_calloc(dl->own, 1, sizeof(int64_t));
  dl->dynamic_sizes[0] = 1;
  constant(m, c, "c.dynamic", dl);
}

static kiln_attr *attr(kiln_module *m, kiln_instr *ins, kiln_attr_key k) {
  kiln_attr *a = kiln_instr_add_attr(m, ins, k);
  ck_assert_ptr_nonnull(a);
  return a;
}

/* One attribute of every kind attrs.def has, on a handful of instructions. */
static void add_all_attribute_kinds(kiln_module *m, uint32_t c, kiln_id x) {
  int64_t d8[] = {8, 8};
  kiln_shape s = arr(m, KILN_F32, d8, 2);
  kiln_id ops[] = {x, x};
  kiln_instr *ins = instr(m, c, KILN_OP_CUSTOM_CALL, "everything", s, ops, 2);
  int64_t dims[] = {1, 0};
  ck_assert_int_eq(kiln_instr_set_attr_ints(m, ins, KILN_ATTR_DIMENSIONS, dims, 2), 0);  /* INTS */
  ck_assert_int_eq(kiln_instr_set_attr_ints(m, ins, KILN_ATTR_FFT_LENGTH, NULL, 0), 0);  /* {} */
  ck_assert_int_eq(kiln_instr_set_attr_int(m, ins, KILN_ATTR_INDEX, -3), 0);             /* INT */
  ck_assert_int_eq(kiln_instr_set_attr_int(m, ins, KILN_ATTR_INDICES_ARE_SORTED, 1), 0); /* BOOL */
  attr(m, ins, KILN_ATTR_EPSILON)->v.f = 0.001;                                          /* FLOAT */
  attr(m, ins, KILN_ATTR_DIRECTION)->v.i = KILN_CMP_GE; /* CMP_DIR */
  int64_t sl[] = {0, 2, 1, 1, 5, 2};
  ck_assert_int_eq(kiln_instr_set_attr_ints(m, ins, KILN_ATTR_SLICE, sl, 6), 0); /* SLICE */
  int64_t pad[] = {0, 0, 0, 1, 2, 1};
  ck_assert_int_eq(kiln_instr_set_attr_ints(m, ins, KILN_ATTR_PADDING, pad, 6), 0); /* PADDING */
  int64_t pairs[] = {0, 1, 1, 0};
  ck_assert_int_eq(kiln_instr_set_attr_ints(m, ins, KILN_ATTR_SOURCE_TARGET_PAIRS, pairs, 4), 0);
  kiln_window *w = kiln_arena_calloc(m->arena, 1, sizeof *w);
  w->rank = 2;
  w->dims = kiln_arena_calloc(m->arena, 2, sizeof *w->dims);
  w->dims[0] = (kiln_window_dim){3, 2, 1, 1, 1, 2, false};
  w->dims[1] = (kiln_window_dim){3, 1, 0, 1, 2, 1, true};
  attr(m, ins, KILN_ATTR_WINDOW)->v.window = w; /* WINDOW */
  kiln_conv_dims *cd = kiln_arena_calloc(m->arena, 1, sizeof *cd);
  int64_t sp_in[] = {1, 2}, sp_k[] = {0, 1}, sp_o[] = {2, 1};
  *cd = (kiln_conv_dims){
      0, 3, 2, 3, 0, 3, 2, i64dup(m, sp_in, 2), i64dup(m, sp_k, 2), i64dup(m, sp_o, 2)};
  attr(m, ins, KILN_ATTR_DIM_LABELS)->v.conv = cd; /* DIM_LABELS */
  kiln_replica_groups *g = kiln_arena_calloc(m->arena, 1, sizeof *g);
  int64_t g0[] = {0, 1}, g1[] = {2, 3};
  g->ngroups = 2;
  g->groups = kiln_arena_calloc(m->arena, 2, sizeof *g->groups);
  g->groups[0] = list(m, g0, 2);
  g->groups[1] = list(m, g1, 2);
  attr(m, ins, KILN_ATTR_REPLICA_GROUPS)->v.groups = g; /* REPLICA_GROUPS */
  kiln_sharding *sh = kiln_arena_calloc(m->arena, 1, sizeof *sh);
  int64_t td[] = {2, 1, 2}, devs[] = {0, 1, 2, 3};
  sh->kind = KILN_SHARD_TILED;
  sh->tile_dims = list(m, td, 3);
  sh->devices = list(m, devs, 4);
  sh->last_tile_dim_replicate = true;
  sh->extra = "metadata={op_name=\"s\"}";
  attr(m, ins, KILN_ATTR_SHARDING)->v.sharding = sh;                             /* SHARDING */
  ck_assert_int_eq(kiln_instr_set_attr_str(m, ins, KILN_ATTR_KIND, "kLoop"), 0); /* IDENT */
  ck_assert_int_eq(
      kiln_instr_set_attr_str(m, ins, KILN_ATTR_CUSTOM_CALL_TARGET, "my \"target\" \xc3\xa9"),
      0); /* STRING */
  ck_assert_int_eq(kiln_instr_set_attr_str(m, ins, KILN_ATTR_BACKEND_CONFIG, "{\"a\":1}"), 0);
  kiln_attr *u1 = attr(m, ins, KILN_ATTR_UNKNOWN); /* UNKNOWN */
  u1->name = "mystery";
  u1->v.s = "{1,2}";
  kiln_attr *u2 = attr(m, ins, KILN_ATTR_UNKNOWN);
  u2->name = "other";
  u2->v.s = "x";

  /* The other forms: iota replica groups, iota and tuple shardings. */
  kiln_instr *ar = instr(m, c, KILN_OP_ALL_GATHER, "ag", s, &x, 1);
  kiln_replica_groups *gi = kiln_arena_calloc(m->arena, 1, sizeof *gi);
  int64_t is[] = {2, 2}, ir[] = {2, 2}, ip[] = {1, 0};
  gi->iota = true;
  gi->iota_shape = list(m, is, 2);
  gi->iota_reshape = list(m, ir, 2);
  gi->iota_perm = list(m, ip, 2);
  attr(m, ar, KILN_ATTR_REPLICA_GROUPS)->v.groups = gi;
  kiln_sharding *tup = kiln_arena_calloc(m->arena, 1, sizeof *tup);
  tup->kind = KILN_SHARD_TUPLE;
  tup->nelems = 3;
  tup->elems = kiln_arena_calloc(m->arena, 3, sizeof *tup->elems);
  tup->elems[0].kind = KILN_SHARD_MAXIMAL;
  tup->elems[0].device = 1;
  tup->elems[1].kind = KILN_SHARD_TILED;
  tup->elems[1].tile_dims = list(m, td, 3);
  int64_t r4[] = {4};
  tup->elems[1].iota_reshape = list(m, r4, 1);
  int64_t ltd[] = {KILN_SHARD_MANUAL};
  tup->elems[1].last_tile_dims = list(m, ltd, 1);
  tup->elems[2].kind = KILN_SHARD_MANUAL;
  attr(m, ar, KILN_ATTR_SHARDING)->v.sharding = tup;
  ck_assert_int_eq(kiln_instr_set_attr_int(m, ar, KILN_ATTR_CHANNEL_ID, 0), 0); /* a zero int */
}

static kiln_module *build_rich(void) {
  kiln_module *m = kiln_module_create("rich_module");
  uint32_t add, main_c, body;
  ck_assert_int_eq(kiln_module_add_computation(m, "add.clone", &add), 0);
  ck_assert_int_eq(kiln_module_add_computation(m, "main", &main_c), 0);
  kiln_shape f32 = scalar(m, KILN_F32);
  kiln_instr *ax = param(m, add, "x", f32, 0);
  kiln_instr *ay = param(m, add, "y", f32, 1);
  kiln_id xy[] = {ax->id, ay->id};
  kiln_instr *sum = instr(m, add, KILN_OP_ADD, "sum", f32, xy, 2);
  m->comps[add]->root = sum->id;
  m->comps[add]->line = 3;
  m->comps[add]->col = 1;

  /* A layout with a tail and memory space, and a bounded-dynamic dim. */
  int64_t d816[] = {8, 16};
  kiln_shape p0s = arr(m, KILN_F32, d816, 2);
  kiln_layout *l = kiln_arena_calloc(m->arena, 1, sizeof *l);
  int64_t m2m[] = {0, 1};
  *l = (kiln_layout){i64dup(m, m2m, 2), 2, "T(8,128)S(1)", 1};
  p0s.layout = l;
  kiln_instr *p0 = param(m, main_c, "p0", p0s, 0);
  p0->line = 7;
  p0->col = 3;
  int64_t d4[] = {4};
  kiln_shape p1s = arr(m, KILN_S32, d4, 1);
  p1s.dynamic = kiln_arena_calloc(m->arena, 1, 1);
  p1s.dynamic[0] = 1;
  kiln_instr *p1 = param(m, main_c, "p1", p1s, 1);
  kiln_instr *tok =
      instr(m, main_c, KILN_OP_AFTER_ALL, "tok", (kiln_shape){.dtype = KILN_TOKEN}, NULL, 0);
  add_literal_constants(m, main_c);
  add_all_attribute_kinds(m, main_c, p0->id);

  int64_t d8[] = {8};
  kiln_instr *zero = instr(m, main_c, KILN_OP_CONSTANT, "zero", f32, NULL, 0);
  kiln_status st = {0};
  ck_assert_int_eq(kiln_literal_create(m->arena, &f32, 0, &zero->literal, &st), 0);
  kiln_id rops[] = {p0->id, zero->id};
  kiln_instr *red = instr(m, main_c, KILN_OP_REDUCE, "red", arr(m, KILN_F32, d8, 1), rops, 2);
  ck_assert_int_eq(kiln_instr_set_called(m, red, &add, 1), 0);
  int64_t one[] = {1};
  ck_assert_int_eq(kiln_instr_set_attr_ints(m, red, KILN_ATTR_DIMENSIONS, one, 1), 0);
  ck_assert_int_eq(kiln_instr_set_control(m, red, &tok->id, 1), 0);

  /* An async pair written with the "negate-start" sugar, and a computation
   * created after main whose instructions interleave with main's ids. */
  ck_assert_int_eq(kiln_module_add_computation(m, "body", &body), 0);
  kiln_instr *bp = param(m, body, "bp", f32, 0);
  kiln_instr *neg = instr(m, body, KILN_OP_NEGATE, "neg", f32, &bp->id, 1);
  kiln_shape st_e[2] = {f32, f32}, st_s;
  ck_assert_int_eq(kiln_shape_make_tuple(m->arena, &st_s, st_e, 2), 0);
  kiln_instr *as = instr(m, main_c, KILN_OP_ASYNC_START, "neg-start", st_s, &zero->id, 1);
  as->async_op = KILN_OP_NEGATE;
  ck_assert_int_eq(kiln_instr_set_called(m, as, &body, 1), 0);
  kiln_instr *ad = instr(m, main_c, KILN_OP_ASYNC_DONE, "neg-done", f32, &as->id, 1);
  ad->async_op = KILN_OP_NEGATE;
  ck_assert_int_eq(kiln_instr_set_called(m, ad, &body, 1), 0);
  m->comps[body]->root = neg->id;
  kiln_id tops[] = {red->id, ad->id, p1->id};
  kiln_shape te[3] = {red->shape, f32, p1->shape}, ts;
  ck_assert_int_eq(kiln_shape_make_tuple(m->arena, &ts, te, 3), 0);
  kiln_instr *root = instr(m, main_c, KILN_OP_TUPLE, "out", ts, tops, 3);
  m->comps[main_c]->root = root->id;
  m->comps[main_c]->is_entry = true;
  m->entry = main_c;
  /* main lists `out` before `neg-done` (ids stay as created): the order a
   * computation gives is kept, not derived from ids. */
  kiln_computation *mc = m->comps[main_c];
  kiln_id t = mc->instrs[mc->ninstrs - 1];
  mc->instrs[mc->ninstrs - 1] = mc->instrs[mc->ninstrs - 2];
  mc->instrs[mc->ninstrs - 2] = t;

  /* The header. */
  kiln_program_shape *ps = kiln_arena_calloc(m->arena, 1, sizeof *ps);
  ps->nparams = 2;
  ps->params = kiln_arena_calloc(m->arena, 2, sizeof *ps->params);
  ck_assert_int_eq(kiln_shape_copy(m->arena, &ps->params[0], &p0->shape), 0);
  ck_assert_int_eq(kiln_shape_copy(m->arena, &ps->params[1], &p1->shape), 0);
  ck_assert_int_eq(kiln_shape_copy(m->arena, &ps->result, &ts), 0);
  m->entry_layout = ps;
  m->is_scheduled = 1;
  m->has_aliases = true;
  m->naliases = 2;
  m->aliases = kiln_arena_calloc(m->arena, 2, sizeof *m->aliases);
  int64_t zero_i[] = {0};
  m->aliases[0] = (kiln_alias){list(m, zero_i, 1), 0, {NULL, 0}, KILN_ALIAS_MUST};
  m->aliases[1] = (kiln_alias){list(m, one, 1), 1, list(m, zero_i, 1), KILN_ALIAS_MAY};
  m->replica_count = 2;
  m->num_partitions = 4;
  m->nheader_extra = 1;
  m->header_extra = kiln_arena_calloc(m->arena, 1, sizeof *m->header_extra);
  m->header_extra[0] = (kiln_raw_attr){"frontend_attributes", "{a=\"b\"}"};
  return m;
}

START_TEST(test_roundtrip_rich) {
  kiln_module *m = build_rich();
  check_roundtrip(m);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_roundtrip_header_variants) {
  /* No entry, is_scheduled false, an empty alias list that was written,
   * a computation without a marked root, an instruction whose shape was
   * never inferred. */
  kiln_module *m = kiln_module_create("h");
  uint32_t c;
  ck_assert_int_eq(kiln_module_add_computation(m, "f", &c), 0);
  kiln_instr *ins = kiln_module_add_instr(m, c, KILN_OP_PARTITION_ID, "pid");
  ck_assert_ptr_nonnull(ins);
  m->is_scheduled = 0;
  m->has_aliases = true;
  check_roundtrip(m);
  kiln_module *back = roundtrip(m);
  ck_assert_uint_eq(back->entry, KILN_NO_ID);
  ck_assert_uint_eq(back->comps[0]->root, KILN_NO_ID);
  ck_assert_int_eq(back->instrs[0]->shape.dtype, KILN_INVALID);
  ck_assert_int_eq(back->is_scheduled, 0);
  ck_assert(back->has_aliases);
  kiln_module_destroy(back);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_literal_wire_format) {
  /* Literal data is little-endian row-major whatever the layout; tuple
   * elements carry no shape of their own. */
  kiln_module *m = kiln_module_create("lit");
  uint32_t c;
  ck_assert_int_eq(kiln_module_add_computation(m, "main", &c), 0);
  int64_t d22[] = {2, 2};
  kiln_shape s = arr(m, KILN_S16, d22, 2);
  kiln_layout *l = kiln_arena_calloc(m->arena, 1, sizeof *l);
  int64_t m2m[] = {0, 1};
  *l = (kiln_layout){i64dup(m, m2m, 2), 2, NULL, 0};
  s.layout = l;
  kiln_literal *lit = new_lit(&s);
  for (int i = 0; i < 4; i++) kiln_literal_set_s64(lit, i, 0x0102 * (i + 1));
  constant(m, c, "k", lit);
  kiln_shape e[1] = {scalar(m, KILN_F32)}, ts;
  ck_assert_int_eq(kiln_shape_make_tuple(m->arena, &ts, e, 1), 0);
  kiln_literal *tl = new_lit(&ts);
  kiln_literal_set_f64(tl->elems[0], 0, 1.0);
  constant(m, c, "t", tl);

  uint8_t *buf;
  size_t len;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_module_to_proto(m, &buf, &len, &st), 0);
  Kiln__V1__Module *pm = kiln__v1__module__unpack(NULL, len, buf);
  ck_assert_ptr_nonnull(pm);
  const Kiln__V1__Literal *pl = pm->computations[0]->instructions[0]->literal;
  ck_assert_ptr_nonnull(pl);
  static const uint8_t want[] = {0x02, 0x01, 0x04, 0x02, 0x06, 0x03, 0x08, 0x04};
  ck_assert_uint_eq(pl->data.len, 8);
  ck_assert(memcmp(pl->data.data, want, 8) == 0);
  ck_assert_uint_eq(pl->shape->layout->n_minor_to_major, 2);
  ck_assert_int_eq(pl->shape->layout->minor_to_major[0], 0);
  const Kiln__V1__Literal *pt = pm->computations[0]->instructions[1]->literal;
  ck_assert_uint_eq(pt->n_tuple_literals, 1);
  ck_assert_ptr_null(pt->tuple_literals[0]->shape);
  static const uint8_t one_f32[] = {0x00, 0x00, 0x80, 0x3f};
  ck_assert_uint_eq(pt->tuple_literals[0]->data.len, 4);
  ck_assert(memcmp(pt->tuple_literals[0]->data.data, one_f32, 4) == 0);
  kiln__v1__module__free_unpacked(pm, NULL);
  kiln_free(buf);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_literal_decode_standalone) {
  /* The helper Execute arguments will use: a Literal message on its own. */
  Kiln__V1__Shape s = KILN__V1__SHAPE__INIT;
  int64_t dims[] = {2};
  s.element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_U8;
  s.n_dimensions = 1;
  s.dimensions = dims;
  Kiln__V1__Literal l = KILN__V1__LITERAL__INIT;
  uint8_t data[] = {7, 9};
  l.shape = &s;
  l.data.len = 2;
  l.data.data = data;
  kiln_arena *a = kiln_arena_create();
  kiln_literal *lit = NULL;
  kiln_status st = {0};
  ck_assert_int_eq(kiln__proto_literal_decode(a, &l, "arguments[1].literal", &lit, &st), 0);
  ck_assert_int_eq(kiln_literal_get_s64(lit, 1), 9);
  l.data.len = 1;
  ck_assert_int_eq(kiln__proto_literal_decode(a, &l, "arguments[1].literal", &lit, &st),
                   KILN_EINVAL);
  ck_assert_str_eq(st.msg, "arguments[1].literal.data: 1 bytes, but u8[2] takes 2");
  kiln_arena_destroy(a);
}
END_TEST

/* ---- hostile messages ---------------------------------------------------------------------- */

/* A small valid module written directly as protobuf-c structs, for tests
 * to break one field at a time:
 *   computations[0] "main" (entry): 0 p0 = f32[2] parameter(0),
 *     1 p1 = f32[2] parameter(1), 2 sum = f32[2] add(0, 1), ROOT 2
 *   computations[1] "aux": 3 k = f32[] constant, ROOT 3 */
typedef struct fixture {
  Kiln__V1__Module m;
  Kiln__V1__Computation c[2];
  Kiln__V1__Computation *cp[2];
  Kiln__V1__Instruction i[4];
  Kiln__V1__Instruction *c0[3], *c1[1];
  Kiln__V1__Shape vec, sc;
  int64_t dims[1];
  int64_t ops[2];
  Kiln__V1__Literal lit;
  uint8_t data[4];
  Kiln__V1__Attribute at;
  Kiln__V1__Attribute *atp[2];
} fixture;

static void fixture_init(fixture *f) {
  memset(f, 0, sizeof *f);
  kiln__v1__module__init(&f->m);
  f->m.name = "m";
  f->dims[0] = 2;
  kiln__v1__shape__init(&f->vec);
  f->vec.element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_F32;
  f->vec.n_dimensions = 1;
  f->vec.dimensions = f->dims;
  kiln__v1__shape__init(&f->sc);
  f->sc.element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_F32;
  static const char *names[] = {"p0", "p1", "sum", "k"};
  for (int k = 0; k < 4; k++) {
    kiln__v1__instruction__init(&f->i[k]);
    f->i[k].id = k;
    f->i[k].name = (char *)names[k];
    f->i[k].shape = k == 3 ? &f->sc : &f->vec;
  }
  f->i[0].opcode = f->i[1].opcode = KILN__V1__OPCODE__OPCODE_PARAMETER;
  f->i[1].parameter_number = 1;
  f->i[2].opcode = KILN__V1__OPCODE__OPCODE_ADD;
  f->ops[0] = 0;
  f->ops[1] = 1;
  f->i[2].n_operands = 2;
  f->i[2].operands = f->ops;
  f->i[3].opcode = KILN__V1__OPCODE__OPCODE_CONSTANT;
  kiln__v1__literal__init(&f->lit);
  f->lit.shape = &f->sc;
  f->lit.data.len = 4;
  f->lit.data.data = f->data;
  f->i[3].literal = &f->lit;
  kiln__v1__attribute__init(&f->at);
  f->atp[0] = f->atp[1] = &f->at;
  for (int k = 0; k < 2; k++) kiln__v1__computation__init(&f->c[k]);
  f->c[0].name = "main";
  f->c[0].is_entry = true;
  f->c[0].root_id = 2;
  f->c0[0] = &f->i[0];
  f->c0[1] = &f->i[1];
  f->c0[2] = &f->i[2];
  f->c[0].n_instructions = 3;
  f->c[0].instructions = f->c0;
  f->c[1].name = "aux";
  f->c[1].root_id = 3;
  f->c1[0] = &f->i[3];
  f->c[1].n_instructions = 1;
  f->c[1].instructions = f->c1;
  f->cp[0] = &f->c[0];
  f->cp[1] = &f->c[1];
  f->m.n_computations = 2;
  f->m.computations = f->cp;
  f->m.entry_computation_index = 0;
}

/* Attaches the fixture's one attribute to `sum` (twice when `twice`). */
static void fixture_attr(fixture *f, Kiln__V1__AttrKey key, bool twice) {
  f->at.key = key;
  f->i[2].n_attributes = twice ? 2 : 1;
  f->i[2].attributes = f->atp;
}

static int decode_msg(const Kiln__V1__Module *pm, kiln_status *st, kiln_module **out) {
  size_t n = kiln__v1__module__get_packed_size(pm);
  uint8_t *buf = malloc(n ? n : 1);
  ck_assert_uint_eq(kiln__v1__module__pack(pm, buf), n);
  int rc = kiln_module_from_proto(buf, n, out, st);
  free(buf);
  return rc;
}

#define EXPECT_ERROR(pm, want) \
  do { \
    kiln_status st_ = {0}; \
    kiln_module *m_ = NULL; \
    ck_assert_int_eq(decode_msg((pm), &st_, &m_), KILN_EINVAL); \
    ck_assert_int_eq(st_.code, KILN_EINVAL); \
    ck_assert_ptr_null(m_); \
    ck_assert_str_eq(st_.msg, (want)); \
  } while (0)

START_TEST(test_fixture_is_valid) {
  fixture f;
  fixture_init(&f);
  kiln_status st = {0};
  kiln_module *m = NULL;
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0);
  ck_assert_uint_eq(m->ninstrs, 4);
  ck_assert_uint_eq(m->entry, 0);
  ck_assert_uint_eq(m->comps[1]->root, 3);
  ck_assert_int_eq(m->instrs[2]->op, KILN_OP_ADD);
  ck_assert_int_eq(m->instrs[1]->param_number, 1);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_garbage_and_truncation) {
  kiln_status st = {0};
  kiln_module *m = NULL;
  static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff};
  ck_assert_int_eq(kiln_module_from_proto(junk, sizeof junk, &m, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "not a valid kiln.v1.Module message");
  ck_assert_ptr_null(m);

  /* Field 2 (computations) with a wrong wire type: protobuf-c's refusal. */
  static const uint8_t wrong_type[] = {0x10, 0x01};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_from_proto(wrong_type, sizeof wrong_type, &m, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "not a valid kiln.v1.Module message");

  /* Nothing at all is a module with no name. */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_from_proto(NULL, 0, &m, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "name: empty");

  /* Every prefix of a real module either decodes or fails cleanly; cutting
   * the last byte breaks the last field. */
  kiln_module *rich = build_rich();
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(kiln_module_to_proto(rich, &buf, &len, &st), 0);
  kiln_module_destroy(rich);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_from_proto(buf, len - 1, &m, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "not a valid kiln.v1.Module message");
  for (size_t n = 0; n < len; n++) {
    kiln_status_clear(&st);
    int rc = kiln_module_from_proto(buf, n, &m, &st);
    ck_assert(rc == 0 || rc == KILN_EINVAL);
    if (rc == 0)
      kiln_module_destroy(m);
    else
      ck_assert_ptr_null(m);
  }
  /* Flipping each byte in turn: never a crash. */
  for (size_t n = 0; n < len; n++) {
    buf[n] ^= 0x5a;
    kiln_status_clear(&st);
    int rc = kiln_module_from_proto(buf, len, &m, &st);
    ck_assert(rc == 0 || rc == KILN_EINVAL);
    if (rc == 0) kiln_module_destroy(m);
    buf[n] ^= 0x5a;
  }
  kiln_free(buf);
}
END_TEST

START_TEST(test_bad_ids) {
  fixture f;
  fixture_init(&f);
  f.ops[1] = 99;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].operands[1]: id 99 out of range "
                     "(module has 4 instructions)");
  f.ops[1] = -1;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].operands[1]: id -1 out of range "
                     "(module has 4 instructions)");
  f.ops[1] = 3;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].operands[1]: id 3 is in computations[1] "
                     "(aux), not in this computation (main)");
  fixture_init(&f);
  f.i[1].id = 0;
  EXPECT_ERROR(&f.m, "computations[0].instructions[1].id: id 0 already used by "
                     "computations[0].instructions[0]");
  fixture_init(&f);
  f.i[3].id = 4;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].id: id 4 out of range "
                     "(module has 4 instructions)");
  fixture_init(&f);
  f.c[0].root_id = 3;
  EXPECT_ERROR(&f.m, "computations[0].root_id: id 3 is in computations[1] (aux), not in this "
                     "computation (main)");
  f.c[0].root_id = 7;
  EXPECT_ERROR(&f.m, "computations[0].root_id: id 7 out of range (module has 4 instructions)");
  fixture_init(&f);
  int64_t called[] = {1, 2};
  f.i[2].n_called_computations = 2;
  f.i[2].called_computations = called;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].called_computations[1]: index 2 out of "
                     "range (module has 2 computations)");
  fixture_init(&f);
  int64_t ctl[] = {0, 3};
  f.i[2].n_control_predecessors = 2;
  f.i[2].control_predecessors = ctl;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].control_predecessors[1]: id 3 is in "
                     "computations[1] (aux), not in this computation (main)");
  fixture_init(&f);
  f.m.entry_computation_index = 2;
  EXPECT_ERROR(&f.m, "entry_computation_index: 2 out of range (module has 2 computations)");
  f.m.entry_computation_index = -2;
  EXPECT_ERROR(&f.m, "entry_computation_index: -2 out of range (module has 2 computations)");
}
END_TEST

START_TEST(test_bad_enums) {
  fixture f;
  fixture_init(&f);
  f.i[2].opcode = (Kiln__V1__Opcode)999;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].opcode: 999 is not a kiln.v1.Opcode value");
  f.i[2].opcode = KILN__V1__OPCODE__OPCODE_INVALID;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].opcode: OPCODE_INVALID is not an operation");
  fixture_init(&f);
  f.i[2].async_op = (Kiln__V1__Opcode)-5;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].async_op: -5 is not a kiln.v1.Opcode value");
  f.i[2].async_op = KILN__V1__OPCODE__OPCODE_NEGATE;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].async_op: set on add (only async-start, "
                     "async-update and async-done wrap an op)");
  fixture_init(&f);
  f.vec.element_type = (Kiln__V1__ElementType)77;
  EXPECT_ERROR(&f.m, "computations[0].instructions[0].shape.element_type: 77 is not a "
                     "kiln.v1.ElementType value");
  fixture_init(&f);
  f.m.is_scheduled = (Kiln__V1__Tristate)3;
  EXPECT_ERROR(&f.m, "is_scheduled: 3 is not a kiln.v1.Tristate value");
  fixture_init(&f);
  Kiln__V1__InputOutputAlias al = KILN__V1__INPUT_OUTPUT_ALIAS__INIT, *alp = &al;
  al.kind = (Kiln__V1__AliasKind)2;
  f.m.n_input_output_alias = 1;
  f.m.input_output_alias = &alp;
  EXPECT_ERROR(&f.m, "input_output_alias[0].kind: 2 is not a kiln.v1.AliasKind value");
  fixture_init(&f);
  fixture_attr(&f, (Kiln__V1__AttrKey)500, false);
  f.at.value_case = KILN__V1__ATTRIBUTE__VALUE_I;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0].key: 500 is not a "
                     "kiln.v1.AttrKey value");
  fixture_attr(&f, KILN__V1__ATTR_KEY__ATTR_KEY_DIRECTION, false);
  f.at.i = 6;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0].i: 6 is not a "
                     "kiln.v1.ComparisonDirection value");
  fixture_attr(&f, KILN__V1__ATTR_KEY__ATTR_KEY_IS_STABLE, false);
  f.at.i = 2;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0].i: 2 is not a boolean "
                     "(0 or 1)");
  Kiln__V1__Sharding sh = KILN__V1__SHARDING__INIT;
  fixture_attr(&f, KILN__V1__ATTR_KEY__ATTR_KEY_SHARDING, false);
  f.at.value_case = KILN__V1__ATTRIBUTE__VALUE_SHARDING;
  f.at.sharding = &sh;
  sh.kind = (Kiln__V1__ShardingKind)6;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0].sharding.kind: 6 is not a "
                     "kiln.v1.ShardingKind value");
  Kiln__V1__ShardingKind ltd[] = {KILN__V1__SHARDING_KIND__SHARDING_KIND_MANUAL,
                                  (Kiln__V1__ShardingKind)9};
  sh.kind = KILN__V1__SHARDING_KIND__SHARDING_KIND_TILED;
  sh.n_last_tile_dims = 2;
  sh.last_tile_dims = ltd;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0].sharding.last_tile_dims[1]: "
                     "9 is not a kiln.v1.ShardingKind value");
}
END_TEST

START_TEST(test_bad_attributes) {
  fixture f;
  fixture_init(&f);
  fixture_attr(&f, KILN__V1__ATTR_KEY__ATTR_KEY_DIMENSIONS, false);
  f.at.value_case = KILN__V1__ATTRIBUTE__VALUE_S;
  f.at.s = "{1}";
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0]: key dimensions "
                     "(ATTR_KEY_DIMENSIONS) takes its value in ints, but s is set");
  f.at.value_case = KILN__V1__ATTRIBUTE__VALUE__NOT_SET;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0]: key dimensions "
                     "(ATTR_KEY_DIMENSIONS) takes its value in ints, but nothing is set");
  Kiln__V1__Int64List il = KILN__V1__INT64_LIST__INIT;
  int64_t v[] = {0, 2, 1, 4};
  il.n_values = 4;
  il.values = v;
  f.at.value_case = KILN__V1__ATTRIBUTE__VALUE_INTS;
  f.at.ints = &il;
  kiln_status st = {0};
  kiln_module *m = NULL;
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0); /* dimensions={0,2,1,4} */
  kiln_module_destroy(m);
  fixture_attr(&f, KILN__V1__ATTR_KEY__ATTR_KEY_SLICE, false);
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0].ints.values: 4 values, not a "
                     "multiple of 3 (start, limit, stride triples)");
  il.n_values = 3;
  fixture_attr(&f, KILN__V1__ATTR_KEY__ATTR_KEY_SOURCE_TARGET_PAIRS, false);
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0].ints.values: 3 values, not a "
                     "multiple of 2 (source, target pairs)");
  fixture_attr(&f, KILN__V1__ATTR_KEY__ATTR_KEY_DIMENSIONS, true);
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[1].key: dimensions appears twice");
  fixture_attr(&f, KILN__V1__ATTR_KEY__ATTR_KEY_INVALID, false);
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0].key: ATTR_KEY_INVALID is not "
                     "an attribute");
  fixture_attr(&f, KILN__V1__ATTR_KEY__ATTR_KEY_UNKNOWN, true);
  f.at.value_case = KILN__V1__ATTRIBUTE__VALUE_S;
  f.at.s = "x";
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0].name: empty (required for "
                     "ATTR_KEY_UNKNOWN)");
  f.at.name = "foo";
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0); /* unknown attributes may repeat */
  ck_assert_uint_eq(m->instrs[2]->nattrs, 2);
  ck_assert_str_eq(m->instrs[2]->attrs[1].name, "foo");
  kiln_module_destroy(m);
  fixture_attr(&f, KILN__V1__ATTR_KEY__ATTR_KEY_KIND, false);
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0].name: set for kind (only "
                     "ATTR_KEY_UNKNOWN has a name)");
  fixture_init(&f);
  Kiln__V1__ConvolutionDimensions cd = KILN__V1__CONVOLUTION_DIMENSIONS__INIT;
  cd.n_input_spatial_dimensions = 2;
  cd.input_spatial_dimensions = v;
  cd.n_kernel_spatial_dimensions = 2;
  cd.kernel_spatial_dimensions = v;
  cd.n_output_spatial_dimensions = 1;
  cd.output_spatial_dimensions = v;
  fixture_attr(&f, KILN__V1__ATTR_KEY__ATTR_KEY_DIM_LABELS, false);
  f.at.value_case = KILN__V1__ATTRIBUTE__VALUE_CONV;
  f.at.conv = &cd;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0].conv: input, kernel and "
                     "output have 2, 2 and 1 spatial dimensions");
  Kiln__V1__Sharding sh = KILN__V1__SHARDING__INIT, el = KILN__V1__SHARDING__INIT, *elp = &el;
  sh.n_tuple_shardings = 1;
  sh.tuple_shardings = &elp;
  fixture_attr(&f, KILN__V1__ATTR_KEY__ATTR_KEY_SHARDING, false);
  f.at.value_case = KILN__V1__ATTRIBUTE__VALUE_SHARDING;
  f.at.sharding = &sh;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].attributes[0].sharding.tuple_shardings: "
                     "only a SHARDING_KIND_TUPLE sharding has elements");
}
END_TEST

START_TEST(test_bad_shapes) {
  fixture f;
  fixture_init(&f);
  f.dims[0] = -1;
  EXPECT_ERROR(&f.m, "computations[0].instructions[0].shape.dimensions[0]: size -1 is negative");
  f.dims[0] = (INT64_C(1) << 40) + 1;
  EXPECT_ERROR(&f.m, "computations[0].instructions[0].shape.dimensions[0]: size 1099511627777 "
                     "is over the limit of 2^40");
  f.dims[0] = INT64_MAX;
  EXPECT_ERROR(&f.m, "computations[0].instructions[0].shape.dimensions[0]: size "
                     "9223372036854775807 is over the limit of 2^40");
  fixture_init(&f);
  int64_t big[] = {INT64_C(1) << 20, INT64_C(1) << 20, 2};
  f.vec.n_dimensions = 3;
  f.vec.dimensions = big;
  EXPECT_ERROR(&f.m, "computations[0].instructions[0].shape.dimensions: more than 2^40 elements "
                     "in all");
  int64_t edge[] = {INT64_C(1) << 20, INT64_C(1) << 20, 1, 0, INT64_C(1) << 40};
  f.vec.n_dimensions = 5;
  f.vec.dimensions = edge; /* 2^40 elements, then 0: fine */
  kiln_status st = {0};
  kiln_module *m = NULL;
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0);
  kiln_module_destroy(m);

  fixture_init(&f);
  protobuf_c_boolean dyn[] = {1, 0};
  f.vec.n_is_dynamic_dimension = 2;
  f.vec.is_dynamic_dimension = dyn;
  EXPECT_ERROR(&f.m, "computations[0].instructions[0].shape.is_dynamic_dimension: 2 flags for 1 "
                     "dimensions");
  fixture_init(&f);
  Kiln__V1__Layout l = KILN__V1__LAYOUT__INIT;
  int64_t m2m[] = {1};
  l.n_minor_to_major = 1;
  l.minor_to_major = m2m;
  f.vec.layout = &l;
  EXPECT_ERROR(&f.m, "computations[0].instructions[0].shape.layout.minor_to_major[0]: dimension 1 "
                     "out of range for rank 1");
  l.n_minor_to_major = 0;
  EXPECT_ERROR(&f.m, "computations[0].instructions[0].shape.layout.minor_to_major: 0 entries for "
                     "a shape of rank 1");
  fixture_init(&f);
  f.sc.element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_TOKEN;
  f.sc.n_dimensions = 1;
  f.sc.dimensions = f.dims;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].shape.dimensions: token has no dimensions");
  fixture_init(&f);
  Kiln__V1__Shape e = KILN__V1__SHAPE__INIT, *ep = &e;
  f.vec.n_tuple_shapes = 1;
  f.vec.tuple_shapes = &ep;
  EXPECT_ERROR(&f.m, "computations[0].instructions[0].shape.tuple_shapes: only a tuple has "
                     "element shapes, not f32");
  f.vec.element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_TUPLE;
  EXPECT_ERROR(&f.m, "computations[0].instructions[0].shape.dimensions: a tuple has no "
                     "dimensions");
  f.vec.n_dimensions = 0;
  e.element_type = (Kiln__V1__ElementType)40;
  EXPECT_ERROR(&f.m, "computations[0].instructions[0].shape.tuple_shapes[0].element_type: 40 is "
                     "not a kiln.v1.ElementType value");
}
END_TEST

/* Test-owned blocks, freed together at the end of a test. */
static void *blocks[16];
static int nblocks;

static void *keep(void *p) {
  ck_assert_int_lt(nblocks, 16);
  blocks[nblocks++] = p;
  return p;
}

static void free_blocks(void) {
  while (nblocks) free(blocks[--nblocks]);
}

/* A chain of `depth` nested one-element tuples around f32[]. */
static Kiln__V1__Shape *nested_tuple(int depth) {
  Kiln__V1__Shape *s = keep(calloc((size_t)depth + 1, sizeof *s));
  Kiln__V1__Shape **ptrs = keep(calloc((size_t)depth + 1, sizeof *ptrs));
  for (int k = 0; k <= depth; k++) {
    kiln__v1__shape__init(&s[k]);
    ptrs[k] = &s[k];
  }
  for (int k = 0; k < depth; k++) {
    s[k].element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_TUPLE;
    s[k].n_tuple_shapes = 1;
    s[k].tuple_shapes = &ptrs[k + 1];
  }
  s[depth].element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_F32;
  return s;
}

/* Bytes are prepended into a buffer filled from its end. */
typedef struct rbuf {
  uint8_t *base;
  size_t start, cap;
} rbuf;

static void prepend(rbuf *b, const uint8_t *p, size_t n) {
  ck_assert_uint_ge(b->start, n);
  b->start -= n;
  memcpy(b->base + b->start, p, n);
}

/* A length-delimited field `tag` around everything prepended so far. */
static void wrap(rbuf *b, uint8_t tag) {
  uint8_t v[12];
  size_t len = b->cap - b->start, n = 0;
  v[n++] = tag;
  do {
    v[n++] = (uint8_t)((len & 0x7f) | (len > 0x7f ? 0x80 : 0));
    len >>= 7;
  } while (len);
  prepend(b, v, n);
}

/* Module{computations: [{instructions: [{shape: (((...f32[]...)))}]}]} with
 * `depth` tuple levels, serialized without protobuf-c (whose packer would
 * recurse as deep as the message). */
static uint8_t *deep_module_bytes(int depth, size_t *len) {
  rbuf b = {NULL, 0, (size_t)depth * 8 + 64};
  b.base = malloc(b.cap);
  b.start = b.cap;
  static const uint8_t f32[] = {0x08, KILN_F32}, tuple[] = {0x08, KILN_TUPLE};
  prepend(&b, f32, 2);
  for (int k = 0; k < depth; k++) {
    wrap(&b, 0x2a); /* Shape.tuple_shapes = 5 */
    prepend(&b, tuple, 2);
  }
  wrap(&b, 0x2a); /* Instruction.shape = 5 */
  wrap(&b, 0x12); /* Computation.instructions = 2 */
  wrap(&b, 0x12); /* Module.computations = 2 */
  *len = b.cap - b.start;
  memmove(b.base, b.base + b.start, *len);
  return b.base;
}

START_TEST(test_deep_nesting) {
  fixture f;
  fixture_init(&f);
  f.i[0].shape = nested_tuple(64);
  kiln_status st = {0};
  kiln_module *m = NULL;
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0);
  kiln_module_destroy(m);
  f.i[0].shape = nested_tuple(65);
  EXPECT_ERROR(&f.m, "computations[0].instructions[0].shape: tuple shapes nested deeper than 64 "
                     "levels");
  /* Far deeper than protobuf-c's unpacker (or packer) could take on the
   * stack; written byte by byte. */
  size_t len;
  uint8_t *deep = deep_module_bytes(200000, &len);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_from_proto(deep, len, &m, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg,
                   "computations[0].instructions[0].shape.tuple_shapes[0].tuple_shapes[0]."
                   "tuple_shapes[0].tuple_shapes[0].tuple_shapes[0].tuple_shapes[0]."
                   "tuple_shapes[0].tuple_shapes[0].tuple_shapes[0].tuple_shapes[0]...: messages "
                   "nested deeper than 100 levels");
  free(deep);

  /* Literals and shardings have their own depth. */
  fixture_init(&f);
  Kiln__V1__Literal *ls = keep(calloc(70, sizeof *ls));
  Kiln__V1__Literal **lp = keep(calloc(70, sizeof *lp));
  for (int k = 0; k < 70; k++) {
    kiln__v1__literal__init(&ls[k]);
    lp[k] = &ls[k];
    if (k < 69) {
      ls[k].n_tuple_literals = 1;
      ls[k].tuple_literals = &lp[k + 1];
    }
  }
  ls[69].data.len = 4;
  ls[69].data.data = f.data;
  ls[0].shape = nested_tuple(69);
  f.i[3].literal = &ls[0];
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal.shape: tuple shapes nested deeper "
                     "than 64 levels");
  free_blocks();
}
END_TEST

START_TEST(test_unpack_budget) {
  /* 1.5 MB of empty instruction messages would unpack into ~110 MB. */
  rbuf b = {NULL, 0, (size_t)3 << 19};
  b.base = malloc(b.cap);
  b.start = b.cap;
  static const uint8_t empty_instr[] = {0x12, 0x00};
  while (b.start > 16) prepend(&b, empty_instr, 2);
  wrap(&b, 0x12);
  size_t len = b.cap - b.start;
  kiln_status st = {0};
  kiln_module *m = NULL;
  ck_assert_int_eq(kiln_module_from_proto(b.base + b.start, len, &m, &st), KILN_ELIMIT);
  char want[200];
  snprintf(want, sizeof want,
           "a %zu-byte kiln.v1.Module needs more than %zu bytes to unpack; too many empty "
           "messages",
           len, ((size_t)16 << 20) + len * 32);
  ck_assert_str_eq(st.msg, want);
  ck_assert_ptr_null(m);
  free(b.base);
}
END_TEST

START_TEST(test_bad_literals) {
  fixture f;
  fixture_init(&f);
  f.lit.data.len = 3;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal.data: 3 bytes, but f32[] takes 4");
  fixture_init(&f);
  f.i[3].literal = NULL;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal: missing (a constant needs its "
                     "value)");
  fixture_init(&f);
  f.i[2].literal = &f.lit;
  EXPECT_ERROR(&f.m, "computations[0].instructions[2].literal: set on add (only a constant has a "
                     "literal)");
  fixture_init(&f);
  f.lit.shape = NULL;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal.shape: missing");
  fixture_init(&f);
  Kiln__V1__Shape ps = KILN__V1__SHAPE__INIT;
  int64_t d3[] = {3};
  ps.element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_PRED;
  ps.n_dimensions = 1;
  ps.dimensions = d3;
  uint8_t pd[] = {1, 0, 2};
  f.lit.shape = &ps;
  f.lit.data.len = 3;
  f.lit.data.data = pd;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal.data: element 2 (byte 0x02) is not "
                     "a valid pred (0 or 1)");
  ps.element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_S4;
  pd[2] = 0x08;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal.data: element 2 (byte 0x08) is not "
                     "a valid s4 (sign-extended, one per byte)");
  pd[2] = 0xf8; /* -8 */
  kiln_status st = {0};
  kiln_module *m = NULL;
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0);
  ck_assert_int_eq(kiln_literal_get_s64(m->instrs[3]->literal, 2), -8);
  kiln_module_destroy(m);
  int64_t dsz[] = {4};
  f.lit.n_dynamic_sizes = 1;
  f.lit.dynamic_sizes = dsz;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal.dynamic_sizes[0]: size 4 is outside "
                     "0..3");
  /* A tuple literal: element counts and element shapes must agree. */
  fixture_init(&f);
  Kiln__V1__Shape *tp[2] = {&f.sc, &f.sc}, ts = KILN__V1__SHAPE__INIT;
  ts.element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_TUPLE;
  ts.n_tuple_shapes = 2;
  ts.tuple_shapes = tp;
  Kiln__V1__Literal tl = KILN__V1__LITERAL__INIT, e0 = KILN__V1__LITERAL__INIT;
  Kiln__V1__Literal *ep[2] = {&e0, &e0};
  e0.data.len = 4;
  e0.data.data = f.data;
  tl.shape = &ts;
  tl.n_tuple_literals = 1;
  tl.tuple_literals = ep;
  f.i[3].literal = &tl;
  f.i[3].shape = &ts;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal.tuple_literals: 1 elements, but the "
                     "shape has 2");
  tl.n_tuple_literals = 2;
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0);
  kiln_module_destroy(m);
  e0.shape = &f.vec;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal.tuple_literals[0].shape: differs "
                     "from the tuple's element shape");
  e0.shape = &f.sc;
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0);
  kiln_module_destroy(m);
  tl.data.len = 1;
  tl.data.data = f.data;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal.data: a tuple literal has no data "
                     "of its own");
}
END_TEST

START_TEST(test_bad_strings) {
  fixture f;
  fixture_init(&f);
  f.m.name = "";
  EXPECT_ERROR(&f.m, "name: empty");
  fixture_init(&f);
  f.c[1].name = "";
  EXPECT_ERROR(&f.m, "computations[1].name: empty");
  fixture_init(&f);
  f.i[1].name = "";
  EXPECT_ERROR(&f.m, "computations[0].instructions[1].name: empty");
  f.i[1].name = "bad\xff";
  EXPECT_ERROR(&f.m, "computations[0].instructions[1].name: not valid UTF-8");
  f.i[1].name = "\xc0\xaf"; /* overlong '/' */
  EXPECT_ERROR(&f.m, "computations[0].instructions[1].name: not valid UTF-8");
  f.i[1].name = "\xed\xa0\x80"; /* a surrogate */
  EXPECT_ERROR(&f.m, "computations[0].instructions[1].name: not valid UTF-8");
  f.i[1].name = "caf\xc3\xa9 \xf0\x9f\x94\xa5";
  kiln_status st = {0};
  kiln_module *m = NULL;
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0);
  kiln_module_destroy(m);

  /* An embedded NUL, which protobuf-c alone would silently cut at: patch
   * the packed bytes of name "p0" (tag 0x22, length 2) into "p\0". */
  fixture_init(&f);
  size_t n = kiln__v1__module__get_packed_size(&f.m);
  uint8_t *buf = malloc(n);
  kiln__v1__module__pack(&f.m, buf);
  uint8_t *hit = NULL;
  for (size_t k = 0; k + 3 < n; k++)
    if (buf[k] == 0x22 && buf[k + 1] == 2 && buf[k + 2] == 'p' && buf[k + 3] == '0') {
      hit = buf + k;
      break;
    }
  ck_assert_ptr_nonnull(hit);
  hit[3] = 0;
  ck_assert_int_eq(kiln_module_from_proto(buf, n, &m, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "computations[0].instructions[0].name: contains a NUL character");
  free(buf);

  fixture_init(&f);
  Kiln__V1__HeaderAttribute h = KILN__V1__HEADER_ATTRIBUTE__INIT, *hp = &h;
  f.m.n_header_attributes = 1;
  f.m.header_attributes = &hp;
  EXPECT_ERROR(&f.m, "header_attributes[0].name: empty");
}
END_TEST

START_TEST(test_encode_refusals) {
  kiln_module *m = kiln_module_create("m");
  uint32_t c;
  ck_assert_int_eq(kiln_module_add_computation(m, "main", &c), 0);
  kiln_instr *ins = kiln_module_add_instr(m, c, KILN_OP_PARTITION_ID, "p");
  ck_assert_int_eq(kiln_instr_set_attr_str(m, ins, KILN_ATTR_METADATA, "{op_name=\"\xff\"}"), 0);
  uint8_t *buf = (uint8_t *)"x";
  size_t len = 7;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_module_to_proto(m, &buf, &len, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "computations[0].instructions[0].attributes[0].s: not valid UTF-8");
  ck_assert_ptr_null(buf);
  ck_assert_uint_eq(len, 0);

  /* Tuples deeper than the decoder takes are refused on the way out too. */
  kiln_shape s = scalar(m, KILN_F32);
  for (int k = 0; k < 65; k++) {
    kiln_shape t;
    ck_assert_int_eq(kiln_shape_make_tuple(m->arena, &t, &s, 1), 0);
    s = t;
  }
  kiln_instr *deep = instr(m, c, KILN_OP_PARAMETER, "deep", s, NULL, 0);
  ck_assert_ptr_nonnull(deep);
  ck_assert_int_eq(kiln_instr_set_attr_str(m, ins, KILN_ATTR_METADATA, "{}"), 0);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_to_proto(m, &buf, &len, &st), KILN_ELIMIT);
  ck_assert_str_eq(st.where, "main/deep");
  ck_assert_str_eq(st.msg, "tuples nested deeper than 64 levels, the limit of kiln.v1.Module");
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_out_of_memory) {
  kiln_module *m = build_rich();
  uint8_t *good;
  size_t good_len;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_module_to_proto(m, &good, &good_len, &st), 0);
  /* Fail the n-th allocation for every n until both directions get through. */
  bool enc_done = false, dec_done = false;
  for (long n = 1; !(enc_done && dec_done) && n < 100000; n++) {
    if (!enc_done) {
      uint8_t *buf = NULL;
      size_t len = 0;
      kiln_status_clear(&st);
      kiln_alloc_fail_after(n);
      int rc = kiln_module_to_proto(m, &buf, &len, &st);
      kiln_alloc_fail_after(0);
      ck_assert_msg(rc == 0 || rc == KILN_ENOMEM, "encode, allocation %ld: %d %s", n, rc, st.msg);
      if (rc == 0) {
        ck_assert_uint_eq(len, good_len);
        kiln_free(buf);
        enc_done = true;
      }
    }
    if (!dec_done) {
      kiln_module *back = NULL;
      kiln_status_clear(&st);
      kiln_alloc_fail_after(n);
      int rc = kiln_module_from_proto(good, good_len, &back, &st);
      kiln_alloc_fail_after(0);
      ck_assert_msg(rc == 0 || rc == KILN_ENOMEM, "decode, allocation %ld: %d %s", n, rc, st.msg);
      if (rc == KILN_ENOMEM) {
        ck_assert_ptr_null(back);
        ck_assert_str_eq(st.msg, "out of memory decoding a module");
      } else {
        kiln_module_destroy(back);
        dec_done = true;
      }
    }
  }
  ck_assert(enc_done && dec_done);
  kiln_free(good);
  kiln_module_destroy(m);
}
END_TEST

/* ---- the corpus ---------------------------------------------------------------------------- */

static const char *corpus_dir(void) {
  const char *env = getenv("KILN_CORPUS_DIR");
  return env && env[0] ? env : KILN_SOURCE_DIR "/../shared/corpus/xla-hlo";
}

static char *read_file(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  if (fp == NULL) return NULL;
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  size_t got = fread(buf, 1, (size_t)n, fp);
  fclose(fp);
  buf[got] = '\0';
  *len = got;
  return buf;
}

START_TEST(test_corpus_roundtrip) {
#if HAVE_PARSER && HAVE_PRINTER
  DIR *dir = opendir(corpus_dir());
  if (dir == NULL) {
    fprintf(stderr, "test_proto: corpus %s not found; skipping the corpus round trip\n",
            corpus_dir());
    return;
  }
  int done = 0, failures = 0;
  struct dirent *de;
  while ((de = readdir(dir)) != NULL) {
    size_t nl = strlen(de->d_name);
    if (nl < 5 || strcmp(de->d_name + nl - 4, ".hlo") != 0) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", corpus_dir(), de->d_name);
    size_t len;
    char *text = read_file(path, &len);
    ck_assert_ptr_nonnull(text);
    kiln_parse_options opts = {.no_infer = 1};
    kiln_module *m = NULL;
    kiln_status st = {0};
    if (kiln_module_parse_text(text, len, de->d_name, &opts, &m, &st) != 0) {
      fprintf(stderr, "test_proto: %s does not parse (%s: %s); not a codec matter\n", de->d_name,
              st.where, st.msg);
      free(text);
      continue;
    }
    uint8_t *buf;
    size_t blen;
    kiln_module *back = NULL;
    if (kiln_module_to_proto(m, &buf, &blen, &st) != 0 ||
        kiln_module_from_proto(buf, blen, &back, &st) != 0) {
      fprintf(stderr, "test_proto: %s: %s\n", de->d_name, st.msg);
      failures++;
    } else {
      diff df = {.found = false};
      char *t1 = kiln_module_print(m, NULL), *t2 = kiln_module_print(back, NULL);
      if (!same_module(&df, m, back) || strcmp(t1, t2) != 0) {
        fprintf(stderr, "test_proto: %s changed in the round trip (%s)\n", de->d_name,
                df.found ? df.where : "printed text differs");
        failures++;
      }
      kiln_free(t1);
      kiln_free(t2);
      kiln_free(buf);
      kiln_module_destroy(back);
    }
    kiln_module_destroy(m);
    free(text);
    done++;
  }
  closedir(dir);
  fprintf(stderr, "test_proto: %d corpus modules round-tripped, %d failed\n", done, failures);
  ck_assert_int_eq(failures, 0);
#else
  fprintf(stderr, "test_proto: no text parser/printer in this tree; skipping the corpus\n");
#endif
}
END_TEST

/* A literal with a dimension of size 0 holds no data, so nothing in the
 * message pays for the "{}" the printer writes per index of the dims before
 * it (fuzz_proto: f32[2^20,2^20,0,...] printed for ever, and its strides
 * overflowed; then f32[2,39,16,18,19,2,1,1,0,...], 3 million arrays, took
 * 14 s). The decoder bounds a message's arrays before anything prints. */
START_TEST(test_literal_empty_arrays) {
  fixture f;
  fixture_init(&f);
  Kiln__V1__Shape es = KILN__V1__SHAPE__INIT;
  /* 2^40 "{}" (the product before the zero is within the limit on
   * elements), and dims after the zero whose product overflowed the
   * printer's strides. */
  int64_t dims[5] = {1 << 20, 1 << 20, 0, INT64_C(1) << 40, INT64_C(1) << 40};
  es.element_type = KILN__V1__ELEMENT_TYPE__ELEMENT_TYPE_F32;
  es.n_dimensions = 5;
  es.dimensions = dims;
  f.lit.shape = &es;
  f.lit.data.len = 0;
  f.i[3].shape = &es;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal.shape: constant k: "
                     "f32[1048576,1048576,0,1099511627776,1099511627776] writes 1099512676353 "
                     "arrays ({...}) for 0 elements; the literals of one message may write 65536 "
                     "arrays beyond 64 per element, 0 are taken");
  /* f32[65535,0] writes 65536 arrays, the budget; one more is over it. */
  es.n_dimensions = 2;
  dims[0] = 65536;
  dims[1] = 0;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal.shape: constant k: f32[65536,0] "
                     "writes 65537 arrays ({...}) for 0 elements; the literals of one message may "
                     "write 65536 arrays beyond 64 per element, 0 are taken");
  dims[0] = 65535;
  kiln_status st = {0};
  kiln_module *m = NULL;
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0);
  kiln_module_destroy(m);
  /* Within it: decodes, and prints one {} per index. */
  es.n_dimensions = 3;
  dims[0] = 2;
  dims[1] = 3;
  dims[2] = 0;
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0);
#if HAVE_PRINTER
  char *text = kiln_module_print(m, NULL);
  ck_assert_ptr_nonnull(text);
  ck_assert_ptr_nonnull(strstr(text, "f32[2,3,0] constant({{{}, {}, {}}, {{}, {}, {}}})"));
  kiln_free(text);
#endif
  kiln_module_destroy(m);
  /* The budget is the message's: two constants of 32768 arrays fit (p0 and
   * k, decoded in id order), and one more array between them does not. */
  es.n_dimensions = 2;
  dims[0] = 32767;
  dims[1] = 0;
  f.i[0].opcode = KILN__V1__OPCODE__OPCODE_CONSTANT;
  f.i[0].shape = &es;
  f.i[0].literal = &f.lit;
  f.i[2].opcode = KILN__V1__OPCODE__OPCODE_TUPLE; /* the decoder checks no operand shapes */
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0);
  kiln_module_destroy(m);
  Kiln__V1__Shape one = es;
  int64_t dims1[1] = {0};
  one.n_dimensions = 1;
  one.dimensions = dims1;
  Kiln__V1__Literal lit1 = f.lit;
  lit1.shape = &one;
  f.i[1].opcode = KILN__V1__OPCODE__OPCODE_CONSTANT;
  f.i[1].parameter_number = 0;
  f.i[1].shape = &one;
  f.i[1].literal = &lit1;
  EXPECT_ERROR(&f.m, "computations[1].instructions[0].literal.shape: constant k: f32[32767,0] "
                     "writes 32768 arrays ({...}) for 0 elements; the literals of one message may "
                     "write 65536 arrays beyond 64 per element, 32769 are taken");
  /* Elements pay for their arrays: f32[70000,1,1] (140001 arrays) decodes. */
  fixture_init(&f);
  int64_t kd[3] = {70000, 1, 1};
  es.n_dimensions = 3;
  es.dimensions = kd;
  uint8_t *zeros = calloc(70000, 4);
  f.lit.shape = &es;
  f.lit.data.len = 70000 * 4;
  f.lit.data.data = zeros;
  f.i[3].shape = &es;
  ck_assert_int_eq(decode_msg(&f.m, &st, &m), 0);
  kiln_module_destroy(m);
  free(zeros);
}
END_TEST

static Suite *proto_suite(void) {
  Suite *s = suite_create("proto");
  TCase *tc = tcase_create("schema");
  tcase_add_test(tc, test_enums_mirror_tables);
  tcase_add_test(tc, test_service_schema);
  suite_add_tcase(s, tc);
  tc = tcase_create("roundtrip");
  tcase_add_test(tc, test_roundtrip_minimal);
  tcase_add_test(tc, test_roundtrip_rich);
  tcase_add_test(tc, test_roundtrip_header_variants);
  tcase_add_test(tc, test_literal_wire_format);
  tcase_add_test(tc, test_literal_decode_standalone);
  suite_add_tcase(s, tc);
  tc = tcase_create("hostile");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_fixture_is_valid);
  tcase_add_test(tc, test_garbage_and_truncation);
  tcase_add_test(tc, test_bad_ids);
  tcase_add_test(tc, test_bad_enums);
  tcase_add_test(tc, test_bad_attributes);
  tcase_add_test(tc, test_bad_shapes);
  tcase_add_test(tc, test_deep_nesting);
  tcase_add_test(tc, test_bad_literals);
  tcase_add_test(tc, test_literal_empty_arrays);
  tcase_add_test(tc, test_unpack_budget);
  tcase_add_test(tc, test_bad_strings);
  tcase_add_test(tc, test_encode_refusals);
  tcase_add_test(tc, test_out_of_memory);
  suite_add_tcase(s, tc);
  tc = tcase_create("corpus");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_corpus_roundtrip);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(proto_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
