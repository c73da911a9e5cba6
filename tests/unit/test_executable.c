/* Tests for the executable's blob form: round trips that re-serialize to
 * the same bytes, and hostile blobs (truncated at every length, bytes
 * flipped, counts, offsets and ids out of range, recursion, other
 * versions) that must fail with a message naming the field, never crash.
 */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"

static void array_shape(kiln_arena *a, kiln_shape *s, kiln_dtype t, int64_t d0, int64_t d1,
                        bool layout) {
  int64_t dims[2] = {d0, d1};
  ck_assert_int_eq(kiln_shape_make_array(a, s, t, dims, 2), 0);
  if (layout) {
    s->layout = kiln_arena_calloc(a, 1, sizeof *s->layout);
    s->layout->rank = 2;
    s->layout->minor_to_major = kiln_arena_calloc(a, 2, sizeof(int64_t));
    s->layout->minor_to_major[0] = 0;
    s->layout->minor_to_major[1] = 1;
    s->layout->tail = "T(8,128)";
  }
}

static uint32_t *ids(kiln_arena *a, uint32_t n, ...) {
  uint32_t *v = kiln_arena_calloc(a, n + 1, sizeof *v);
  va_list ap;
  va_start(ap, n);
  for (uint32_t i = 0; i < n; i++) v[i] = va_arg(ap, uint32_t);
  va_end(ap);
  return v;
}

/* A small executable touching every field: a tuple parameter, a layout
 * with a tail, all slot kinds, a GEMM, a copy, a kernel, a while loop with
 * two nested programs, a conditional, a convolution and an fft. */
static kiln_executable *sample(void) {
  kiln_executable *e = kiln_executable_create();
  ck_assert_ptr_nonnull(e);
  kiln_arena *a = e->arena;
  e->target = "cpu-x86-64-v3";
  for (int i = 0; i < 32; i++) e->key[i] = (uint8_t)(i * 7);
  e->nparams = 2;
  e->param_shapes = kiln_arena_calloc(a, 2, sizeof(kiln_shape));
  array_shape(a, &e->param_shapes[0], KILN_F32, 4, 4, true);
  kiln_shape leaves[2];
  array_shape(a, &leaves[0], KILN_S32, 1, 1, false);
  array_shape(a, &leaves[1], KILN_PRED, 2, 1, false);
  ck_assert_int_eq(kiln_shape_make_tuple(a, &e->param_shapes[1], leaves, 2), 0);
  array_shape(a, &e->result_shape, KILN_F32, 4, 4, false);
  e->nparam_leaves = 3;
  e->params = kiln_arena_calloc(a, 3, sizeof(kiln_binding));
  e->params[0] = (kiln_binding){e->param_shapes[0], 0};
  e->params[1] = (kiln_binding){leaves[0], 1};
  e->params[2] = (kiln_binding){leaves[1], 2};
  e->nresults = 1;
  e->results = kiln_arena_calloc(a, 1, sizeof(kiln_binding));
  e->results[0] = (kiln_binding){e->result_shape, 5};
  e->nslots = 6;
  e->slots = kiln_arena_calloc(a, 6, sizeof(kiln_slot));
  e->slots[0] = (kiln_slot){KILN_SLOT_PARAM, 0, 0, 0, 64};
  e->slots[1] = (kiln_slot){KILN_SLOT_PARAM, 1, 0, 0, 4};
  e->slots[2] = (kiln_slot){KILN_SLOT_PARAM, 1, 1, 0, 2};
  e->slots[3] = (kiln_slot){KILN_SLOT_TEMP, 0, 0, 64, 64};
  e->slots[4] = (kiln_slot){KILN_SLOT_CONSTANT, 0, 0, 0, 64};
  e->slots[5] = (kiln_slot){KILN_SLOT_OUTPUT, 0, 0, 0, 64};
  e->temp_bytes = 128;
  e->peak_bytes = 64;
  e->nconstants = 64;
  e->constants = kiln_arena_calloc(a, 64, 1);
  for (int i = 0; i < 64; i++) e->constants[i] = (uint8_t)(255 - i);
  e->nprograms = 5;
  e->programs = kiln_arena_calloc(a, 5, sizeof(kiln_program));
  kiln_step *s = kiln_arena_calloc(a, 5, sizeof *s);
  s[0] = (kiln_step){
      .kind = KILN_STEP_KERNEL, .kernel = 1, .range = 16, .args = ids(a, 3, 0, 4, 3), .nargs = 3};
  s[1] = (kiln_step){.kind = KILN_STEP_GEMM, .args = ids(a, 3, 0, 4, 5), .nargs = 3};
  s[1].gemm = (kiln_gemm){KILN_F32, 1, 4, 4, 4, 4, 4, 4, 16, 16, 16, 1, 0, 1.0, -0.0};
  s[2] = (kiln_step){.kind = KILN_STEP_COPY, .range = 64, .args = ids(a, 2, 3, 5), .nargs = 2};
  s[3] = (kiln_step){
      .kind = KILN_STEP_WHILE, .args = ids(a, 1, 2), .nargs = 1, .sub = ids(a, 2, 1, 2), .nsub = 2};
  s[4] = (kiln_step){.kind = KILN_STEP_CONDITIONAL,
                     .args = ids(a, 1, 1),
                     .nargs = 1,
                     .sub = ids(a, 2, 2, 3),
                     .nsub = 2};
  e->programs[0] = (kiln_program){s, 5};
  kiln_step *k = kiln_arena_calloc(a, 1, sizeof *k);
  k[0] = (kiln_step){
      .kind = KILN_STEP_KERNEL, .kernel = 0, .range = 1, .args = ids(a, 1, 2), .nargs = 1};
  e->programs[1] = (kiln_program){k, 1};
  e->programs[2] = (kiln_program){NULL, 0};
  kiln_step *c = kiln_arena_calloc(a, 1, sizeof *c);
  c[0] = (kiln_step){.kind = KILN_STEP_CALL, .sub = ids(a, 1, 3), .nsub = 1};
  e->programs[2] = (kiln_program){c, 1};
  /* A convolution: lhs [b 1, f 4, x 4] in slot 0, kernel [o 2, i 4, x 2]
   * in the constants, out [1, 2, 3] in the temporary slot 3. */
  kiln_step *v = kiln_arena_calloc(a, 2, sizeof *v);
  kiln_conv *cv = kiln_arena_calloc(a, 1, sizeof *cv);
  *cv = (kiln_conv){.dtype = KILN_F32,
                    .nspatial = 1,
                    .feature_groups = 1,
                    .batch_groups = 1,
                    .lhs_dims = {1, 4, 4},
                    .lhs_strides = {16, 4, 1},
                    .rhs_dims = {2, 4, 2},
                    .rhs_strides = {8, 2, 1},
                    .out_dims = {1, 2, 3},
                    .out_strides = {6, 3, 1},
                    .stride = {1},
                    .lhs_dilate = {1},
                    .rhs_dilate = {1}};
  v[0] = (kiln_step){.kind = KILN_STEP_CONV, .args = ids(a, 3, 0, 4, 3), .nargs = 3, .conv = cv};
  /* An fft of c64[2,4] along its last dim: slot 0 to slot 3. */
  kiln_fft *ft = kiln_arena_calloc(a, 1, sizeof *ft);
  *ft = (kiln_fft){.type = KILN_FFT_FORWARD,
                   .dtype = KILN_C64,
                   .rank = 2,
                   .nfft = 1,
                   .len = {2, 4},
                   .in_dims = {2, 4},
                   .in_strides = {4, 1},
                   .out_dims = {2, 4},
                   .out_strides = {1, 2}};
  v[1] = (kiln_step){.kind = KILN_STEP_FFT, .args = ids(a, 2, 0, 3), .nargs = 2, .fft = ft};
  e->programs[3] = (kiln_program){v, 2};
  /* Program 4: an all-reduce and a collective-permute on 2 devices. */
  kiln_step *cs = kiln_arena_calloc(a, 2, sizeof *cs);
  uint64_t *rows = kiln_arena_calloc(a, 1, sizeof *rows);
  rows[0] = 1;
  int32_t *src = kiln_arena_calloc(a, 2, sizeof *src);
  src[0] = 1;
  src[1] = 0;
  kiln_coll ar = {.op = KILN_OP_ALL_REDUCE,
                  .reduce = KILN_OP_ADD,
                  .dtype = KILN_F32,
                  .replicas = 2,
                  .partitions = 1,
                  .nops = 1,
                  .gsize = 2,
                  .members = ids(a, 4, 0, 1, 0, 1),
                  .outer = rows};
  cs[0] =
      (kiln_step){.kind = KILN_STEP_COLLECTIVE, .args = ids(a, 2, 3, 5), .nargs = 2, .coll = ar};
  kiln_coll cp = ar;
  cp.op = KILN_OP_COLLECTIVE_PERMUTE;
  cp.reduce = 0;
  cp.members = ids(a, 4, 0, 1, 0, 1);
  cp.source = src;
  cs[1] =
      (kiln_step){.kind = KILN_STEP_COLLECTIVE, .args = ids(a, 2, 3, 5), .nargs = 2, .coll = cp};
  e->programs[4] = (kiln_program){cs, 2};
  e->nkernels = 2;
  e->ncode = 100;
  e->code = kiln_arena_calloc(a, 100, 1);
  memcpy(e->code, "\177ELF", 4);
  return e;
}

/* Recomputes the trailing checksum (64-bit FNV-1a of everything before
 * it), so that a test can reach the field checks behind it. */
static void reseal(uint8_t *b, size_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i + 8 < len; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  for (int i = 0; i < 8; i++) b[len - 8 + i] = (uint8_t)(h >> (8 * i));
}

static uint8_t *blob_of(const kiln_executable *e, size_t *len) {
  uint8_t *b;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_executable_serialize(e, &b, len, &st), 0);
  return b;
}

static int load(const uint8_t *b, size_t len, kiln_status *st) {
  kiln_executable *e = NULL;
  kiln_status_clear(st);
  int rc = kiln_executable_deserialize(b, len, &e, st);
  if (rc == 0) ck_assert_ptr_nonnull(e);
  if (rc) ck_assert_ptr_null(e);
  kiln_executable_destroy(e);
  return rc;
}

START_TEST(round_trip_bit_identical) {
  kiln_executable *e = sample();
  size_t len, len2;
  uint8_t *b = blob_of(e, &len);
  kiln_executable *back = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_executable_deserialize(b, len, &back, &st), 0);
  ck_assert_str_eq(back->target, "cpu-x86-64-v3");
  ck_assert_str_eq(back->compiler_version, KILN_COMPILER_VERSION);
  ck_assert_uint_eq(back->nparam_leaves, 3);
  ck_assert_str_eq(back->param_shapes[0].layout->tail, "T(8,128)");
  ck_assert_int_eq(back->param_shapes[1].dtype, KILN_TUPLE);
  ck_assert_uint_eq(back->programs[0].steps[1].gemm.trans_a, 1);
  ck_assert(signbit(back->programs[0].steps[1].gemm.beta));
  ck_assert_int_eq(memcmp(back->code, e->code, 100), 0);
  uint8_t *b2 = blob_of(back, &len2);
  ck_assert_uint_eq(len, len2);
  ck_assert_int_eq(memcmp(b, b2, len), 0);
  kiln_free(b);
  kiln_free(b2);
  kiln_executable_destroy(back);
  kiln_executable_destroy(e);
}
END_TEST

START_TEST(every_truncation_fails_cleanly) {
  kiln_executable *e = sample();
  size_t len;
  uint8_t *b = blob_of(e, &len);
  kiln_status st;
  for (size_t n = 0; n < len; n++) {
    uint8_t *cut = malloc(n ? n : 1);
    memcpy(cut, b, n);
    ck_assert_int_eq(load(cut, n, &st), KILN_EINVAL);
    ck_assert_str_eq(st.where, "executable blob");
    free(cut);
  }
  ck_assert_int_eq(load(b, len, &st), 0);
  kiln_free(b);
  kiln_executable_destroy(e);
}
END_TEST

START_TEST(flipped_bytes_never_crash) {
  kiln_executable *e = sample();
  size_t len;
  uint8_t *b = blob_of(e, &len);
  uint64_t seed = 99;
  kiln_status st;
  for (int round = 0; round < 20000; round++) {
    uint8_t *m = malloc(len);
    memcpy(m, b, len);
    int flips = 1 + round % 4;
    for (int f = 0; f < flips; f++) {
      seed = seed * 6364136223846793005ull + 1;
      size_t at = (size_t)(seed >> 33) % len;
      m[at] ^= (uint8_t)(1u << ((seed >> 20) % 8));
    }
    if (memcmp(m, b, len) == 0) { /* two flips of one bit undid each other */
      free(m);
      continue;
    }
    ck_assert_int_eq(load(m, len, &st), KILN_EINVAL); /* the checksum sees it */
    reseal(m, len);
    int rc = load(m, len, &st); /* and behind it, the field checks */
    ck_assert(rc == 0 || rc == KILN_EINVAL || rc == KILN_ENOMEM);
    free(m);
  }
  kiln_free(b);
  kiln_executable_destroy(e);
}
END_TEST

/* Mutates the sample, serializes, and expects the load to fail with a
 * message containing `want`. */
static void expect_rejected(void (*mutate)(kiln_executable *), const char *want) {
  kiln_executable *e = sample();
  mutate(e);
  size_t len;
  uint8_t *b = blob_of(e, &len);
  kiln_status st;
  ck_assert_int_eq(load(b, len, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, want) != NULL, "message '%s' lacks '%s'", st.msg, want);
  kiln_free(b);
  kiln_executable_destroy(e);
}

static void slot_past_arena(kiln_executable *e) { e->slots[3].offset = 100; }
static void slot_id(kiln_executable *e) { e->programs[0].steps[0].args[1] = 6; }
static void result_slot(kiln_executable *e) { e->results[0].slot = 77; }
static void kernel_id(kiln_executable *e) { e->programs[1].steps[0].kernel = 2; }
static void recursion(kiln_executable *e) { e->programs[2].steps[0].sub[0] = 2; }
static void program_id(kiln_executable *e) { e->programs[0].steps[3].sub[1] = 5; }
static void gemm_too_big(kiln_executable *e) { e->programs[0].steps[1].gemm.m = 5; }
static void copy_too_big(kiln_executable *e) { e->programs[0].steps[2].range = 65; }
static void param_leaf(kiln_executable *e) { e->slots[2].leaf = 2; }
static void param_index(kiln_executable *e) { e->slots[1].index = 2; }
static void output_index(kiln_executable *e) { e->slots[5].index = 1; }
static void constant_range(kiln_executable *e) { e->slots[4].size = 65; }
static void while_subs(kiln_executable *e) { e->programs[0].steps[3].nsub = 1; }
static void no_programs(kiln_executable *e) { e->nprograms = 0; }
static void bad_layout(kiln_executable *e) { e->param_shapes[0].layout->minor_to_major[1] = 0; }
static void leaves_count(kiln_executable *e) { e->nparam_leaves = 2; }
static void result_small(kiln_executable *e) { e->slots[5].size = 8; }
static kiln_coll *coll(kiln_executable *e, uint32_t i) { return &e->programs[4].steps[i].coll; }
static void coll_member(kiln_executable *e) { coll(e, 0)->members[1] = 7; }
static void coll_disagree(kiln_executable *e) {
  coll(e, 0)->members[2] = 1, coll(e, 0)->members[3] = 0;
}
static void coll_reduce(kiln_executable *e) { coll(e, 0)->reduce = KILN_OP_AND; }
static void coll_rows(kiln_executable *e) { coll(e, 0)->outer[0] = 3; }
static void coll_source(kiln_executable *e) { coll(e, 1)->source[0] = 5; }
static void coll_mesh(kiln_executable *e) { coll(e, 0)->replicas = 0; }
static void coll_op(kiln_executable *e) { coll(e, 0)->op = KILN_OP_ADD; }
static void coll_args(kiln_executable *e) { e->programs[4].steps[0].nargs = 1; }
static void coll_dtype(kiln_executable *e) { coll(e, 0)->dtype = KILN_TUPLE; }

static kiln_conv *conv_of(kiln_executable *e) { return e->programs[3].steps[0].conv; }
static void conv_out_size(kiln_executable *e) { conv_of(e)->out_dims[2] = 4; }
static void conv_past_slot(kiln_executable *e) { conv_of(e)->lhs_strides[1] = 100; }
static void conv_spatial(kiln_executable *e) { conv_of(e)->nspatial = 9; }
static void conv_dtype(kiln_executable *e) { conv_of(e)->dtype = KILN_S32; }
static void conv_groups(kiln_executable *e) { conv_of(e)->feature_groups = 0; }
static void conv_features(kiln_executable *e) { conv_of(e)->feature_groups = 2; }
static void conv_stride(kiln_executable *e) { conv_of(e)->stride[0] = 0; }
static void conv_negative(kiln_executable *e) { conv_of(e)->rhs_strides[1] = -2; }
static void conv_args(kiln_executable *e) { e->programs[3].steps[0].nargs = 2; }

static kiln_fft *fft_of(kiln_executable *e) { return e->programs[3].steps[1].fft; }
static void fft_type(kiln_executable *e) { fft_of(e)->type = 4; }
static void fft_dtype(kiln_executable *e) { fft_of(e)->dtype = KILN_F32; }
static void fft_nfft(kiln_executable *e) { fft_of(e)->nfft = 3; }
static void fft_dims(kiln_executable *e) { fft_of(e)->out_dims[1] = 3; }
static void fft_past_slot(kiln_executable *e) { fft_of(e)->out_strides[0] = 9; }
static void fft_len(kiln_executable *e) { fft_of(e)->len[1] = 0; }
static void fft_args(kiln_executable *e) { e->programs[3].steps[1].nargs = 1; }

START_TEST(bad_fft_steps_named) {
  expect_rejected(fft_type, "fft step in program 3: fft type 4 (0..3)");
  expect_rejected(fft_dtype, "fft step in program 3: element type");
  expect_rejected(fft_nfft, "fft step in program 3: 3 transformed dims");
  expect_rejected(fft_dims, "fft step in program 3: dimension 1: operand 4 and result 3");
  expect_rejected(fft_past_slot,
                  "fft step in program 3: operand spans 64 bytes of 64, result 128 of 64");
  expect_rejected(fft_len, "fft step in program 3: dimension 1: length 0");
  expect_rejected(fft_args, "fft step in program 3: needs 2 slots (operand, result)");
}
END_TEST

START_TEST(bad_conv_steps_named) {
  expect_rejected(conv_out_size,
                  "conv step in program 3: out spatial dimension 0 has size 4, the window gives 3");
  expect_rejected(conv_past_slot, "conv step in program 3: lhs spans 1216 bytes, its slot has 64");
  expect_rejected(conv_spatial, "conv step in program 3: 9 spatial dimensions (at most 3)");
  expect_rejected(conv_dtype, "conv step in program 3: element type");
  expect_rejected(conv_groups, "conv step in program 3: feature_groups 0");
  expect_rejected(conv_features, "do not fit the groups (2, 1)");
  expect_rejected(conv_stride, "conv step in program 3: window dimension 0: stride 0");
  expect_rejected(conv_negative, "conv step in program 3: rhs dimension 1: size 4, stride -2");
  expect_rejected(conv_args, "conv step in program 3: needs 3 slots (lhs, rhs, out)");
}
END_TEST

START_TEST(out_of_range_fields_named) {
  expect_rejected(slot_past_arena, "slot 3: lies outside the temporary arena");
  expect_rejected(slot_id, "step slot in program 0: out of range");
  expect_rejected(result_slot, "result binding 0: slot out of range");
  expect_rejected(kernel_id, "kernel step in program 1: kernel out of range");
  expect_rejected(recursion, "nested program of program 2: must be a later program");
  expect_rejected(program_id, "nested program of program 0: must be a later program");
  expect_rejected(gemm_too_big, "gemm step in program 0: bad type, dims or operands");
  expect_rejected(copy_too_big, "copy step in program 0: copies past the end of a slot");
  expect_rejected(param_leaf, "slot 2: names a parameter leaf that does not exist");
  expect_rejected(param_index, "slot 1: names a parameter that does not exist");
  expect_rejected(output_index, "slot 5: names a result that does not exist");
  expect_rejected(constant_range, "slot 4: lies outside the constants");
  expect_rejected(while_subs, "while step in program 0: needs 2 programs and a predicate");
  expect_rejected(no_programs, "an executable needs an entry program");
  expect_rejected(bad_layout, "layout minor_to_major at offset");
  expect_rejected(leaves_count, "differs from the parameter shapes' leaves");
  expect_rejected(result_small, "result binding 0: slot is smaller than the result");
  expect_rejected(coll_member, "collective step in program 4: a group member is outside the mesh");
  expect_rejected(coll_disagree, "collective step in program 4: members disagree on their group");
  expect_rejected(coll_reduce, "collective step in program 4: unknown reduction");
  expect_rejected(coll_rows, "collective step in program 4: rows do not divide the operand");
  expect_rejected(coll_source, "collective step in program 4: a source is outside the mesh");
  expect_rejected(coll_mesh, "bad replicas, partitions or group size");
  expect_rejected(coll_op, "collective step in program 4: unknown collective");
  expect_rejected(coll_args,
                  "collective step in program 4: needs its operands and as many results");
  expect_rejected(coll_dtype, "collective step in program 4: bad element type");
}
END_TEST

START_TEST(header_checks) {
  kiln_executable *e = sample();
  size_t len;
  uint8_t *b = blob_of(e, &len);
  kiln_status st;
  b[0] = 'X';
  ck_assert_int_eq(load(b, len, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "magic at offset 0: not a Kiln executable");
  b[0] = 'K';
  b[8] = KILN_EXE_FORMAT_VERSION + 1; /* format version, little-endian u32 after the magic */
  ck_assert_int_eq(load(b, len, &st), KILN_EINVAL);
  char want[128];
  snprintf(want, sizeof want,
           "format version at offset 12: unsupported format version %u (expected %u)",
           KILN_EXE_FORMAT_VERSION + 1, KILN_EXE_FORMAT_VERSION);
  ck_assert_str_eq(st.msg, want);
  b[8] = KILN_EXE_FORMAT_VERSION;
  ck_assert_int_eq(load(b, len, &st), 0);
  b[len - 1] ^= 1;
  ck_assert_int_eq(load(b, len, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "checksum at offset 12: the blob is damaged (checksum mismatch)");
  b[len - 1] ^= 1;
  /* One byte more before the checksum. */
  uint8_t *longer = malloc(len + 1);
  memcpy(longer, b, len - 8);
  longer[len - 8] = 0;
  reseal(longer, len + 1);
  ck_assert_int_eq(load(longer, len + 1, &st), KILN_EINVAL);
  ck_assert_ptr_nonnull(strstr(st.msg, "trailing bytes after the code"));
  /* A count claiming more items than bytes left is refused before any
   * allocation: nparams is the u32 after magic, version, two strings and
   * the key. */
  memcpy(longer, b, len);
  size_t at = 8 + 4 + 4 + strlen(KILN_COMPILER_VERSION) + 4 + strlen("cpu-x86-64-v3") + 32;
  memset(longer + at, 0xff, 4);
  reseal(longer, len);
  ck_assert_int_eq(load(longer, len, &st), KILN_EINVAL);
  ck_assert_ptr_nonnull(strstr(st.msg, "nparams at offset"));
  ck_assert_ptr_nonnull(strstr(st.msg, "count exceeds the bytes left"));
  ck_assert_int_eq(load(NULL, 5, &st), KILN_EINVAL);
  free(longer);
  kiln_free(b);
  kiln_executable_destroy(e);
}
END_TEST

START_TEST(out_of_memory_is_reported) {
  kiln_executable *e = sample();
  size_t len;
  uint8_t *b = blob_of(e, &len);
  kiln_status st;
  for (long n = 1; n < 200; n++) {
    kiln_alloc_fail_after(n);
    kiln_executable *x = NULL;
    kiln_status_clear(&st);
    int rc = kiln_executable_deserialize(b, len, &x, &st);
    kiln_alloc_fail_after(0);
    ck_assert(rc == 0 || rc == KILN_ENOMEM);
    if (rc == 0) {
      kiln_executable_destroy(x);
      break;
    }
  }
  kiln_free(b);
  kiln_executable_destroy(e);
}
END_TEST

int main(void) {
  Suite *s = suite_create("executable");
  TCase *tc = tcase_create("blob");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, round_trip_bit_identical);
  tcase_add_test(tc, every_truncation_fails_cleanly);
  tcase_add_test(tc, flipped_bytes_never_crash);
  tcase_add_test(tc, out_of_range_fields_named);
  tcase_add_test(tc, bad_conv_steps_named);
  tcase_add_test(tc, bad_fft_steps_named);
  tcase_add_test(tc, header_checks);
  tcase_add_test(tc, out_of_memory_is_reported);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
