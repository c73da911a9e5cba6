/* Unit tests for the module verifier (kiln_module_verify): structural errors
 * built with the IR builder (text cannot express most of them), per-op
 * errors and XLA's leniencies from HLO text, the module header checks, the
 * conformance corpus (every module must verify), and hostile input: every
 * id and count mutated, allocation failures injected; none may crash. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"

/* ---- builder helpers ---------------------------------------------------- */

typedef struct bm {
  kiln_module *m;
  uint32_t main;
} bm;

static bm new_module(void) {
  bm b;
  b.m = kiln_module_create("m");
  ck_assert_ptr_nonnull(b.m);
  ck_assert_int_eq(kiln_module_add_computation(b.m, "main", &b.main), 0);
  b.m->entry = b.main;
  b.m->comps[b.main]->is_entry = true;
  return b;
}

static kiln_instr *add(kiln_module *m, uint32_t c, kiln_opcode op, const char *name, kiln_dtype t,
                       const int64_t *dims, uint32_t rank, const kiln_id *ops, uint32_t nops) {
  kiln_instr *ins = kiln_module_add_instr(m, c, op, name);
  ck_assert_ptr_nonnull(ins);
  kiln_shape s;
  ck_assert_int_eq(kiln_shape_make_array(m->arena, &s, t, dims, rank), 0);
  ck_assert_int_eq(kiln_instr_set_shape(m, ins, &s), 0);
  if (nops) ck_assert_int_eq(kiln_instr_set_operands(m, ins, ops, nops), 0);
  return ins;
}

static const int64_t D4[1] = {4};

static kiln_instr *param(kiln_module *m, uint32_t c, const char *name, int64_t num) {
  kiln_instr *p = add(m, c, KILN_OP_PARAMETER, name, KILN_F32, D4, 1, NULL, 0);
  p->param_number = num;
  return p;
}

/* "where|message", or "ok". */
static char *verdict(const kiln_module *m, const kiln_verify_options *o) {
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_module_verify(m, o, &st);
  kiln_sbuf b = KILN_SBUF_INIT;
  if (rc == 0) {
    ck_assert_int_eq(st.code, 0);
    kiln_sbuf_puts(&b, "ok");
  } else {
    ck_assert_int_eq(rc, st.code);
    kiln_sbuf_printf(&b, "%s|%s", st.where, st.msg);
  }
  return kiln_sbuf_detach(&b, NULL);
}

#define CHECK_VERDICT(m, o, want) \
  do { \
    char *got_ = verdict((m), (o)); \
    ck_assert_str_eq(got_, (want)); \
    kiln_free(got_); \
  } while (0)

/* ---- structure ------------------------------------------------------------- */

START_TEST(test_valid_builder_module) {
  bm b = new_module();
  kiln_instr *p = param(b.m, b.main, "p", 0);
  kiln_instr *q = param(b.m, b.main, "q", 1);
  kiln_id ops[2] = {p->id, q->id};
  add(b.m, b.main, KILN_OP_ADD, "sum", KILN_F32, D4, 1, ops, 2);
  CHECK_VERDICT(b.m, NULL, "ok");
  kiln_module_destroy(b.m);
}
END_TEST

START_TEST(test_empty_computation) {
  bm b = new_module();
  param(b.m, b.main, "p", 0);
  uint32_t e;
  ck_assert_int_eq(kiln_module_add_computation(b.m, "empty", &e), 0);
  CHECK_VERDICT(b.m, NULL, "empty|computation %empty has no instructions");
  kiln_module_destroy(b.m);
}
END_TEST

START_TEST(test_root_not_in_computation) {
  bm b = new_module();
  param(b.m, b.main, "p", 0);
  uint32_t o;
  ck_assert_int_eq(kiln_module_add_computation(b.m, "other", &o), 0);
  kiln_instr *q = param(b.m, o, "q", 0);
  b.m->comps[b.main]->root = q->id;
  CHECK_VERDICT(b.m, NULL,
                "main|computation %main has root id 1, which is not one of its instructions");
  b.m->comps[b.main]->root = 77;
  CHECK_VERDICT(b.m, NULL,
                "main|computation %main has root id 77, which is not one of its instructions");
  kiln_module_destroy(b.m);
}
END_TEST

START_TEST(test_param_gap_and_duplicate) {
  bm b = new_module();
  param(b.m, b.main, "p0", 0);
  param(b.m, b.main, "p2", 2);
  CHECK_VERDICT(b.m, NULL,
                "main/p2|parameter: number 2 is out of range: %main has 2 parameters, numbered 0 "
                "to 1");
  b.m->instrs[1]->param_number = 0;
  CHECK_VERDICT(b.m, NULL, "main/p2|parameter: number 0 is already used by %p0");
  b.m->instrs[1]->param_number = -1;
  CHECK_VERDICT(b.m, NULL,
                "main/p2|parameter: number -1 is out of range: %main has 2 parameters, numbered "
                "0 to 1");
  kiln_module_destroy(b.m);
}
END_TEST

START_TEST(test_entry_checks) {
  bm b = new_module();
  param(b.m, b.main, "p", 0);
  b.m->entry = KILN_NO_ID;
  CHECK_VERDICT(b.m, NULL,
                "main|computation %main is marked ENTRY but the module does not name "
                "it as its entry");
  b.m->comps[b.main]->is_entry = false;
  CHECK_VERDICT(b.m, NULL, "|module has no ENTRY computation");
  uint32_t o;
  ck_assert_int_eq(kiln_module_add_computation(b.m, "other", &o), 0);
  param(b.m, o, "q", 0);
  b.m->entry = b.main;
  b.m->comps[o]->is_entry = true;
  CHECK_VERDICT(b.m, NULL, "other|module has two ENTRY computations: %main and %other");
  kiln_module_destroy(b.m);
  kiln_module *m = kiln_module_create("m");
  CHECK_VERDICT(m, NULL, "|module has no computations");
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_duplicate_names) {
  bm b = new_module();
  param(b.m, b.main, "p", 0);
  kiln_instr *q = param(b.m, b.main, "q", 1);
  q->name = "p";
  CHECK_VERDICT(b.m, NULL, "main/p|instruction name %p is used twice in computation %main");
  q->name = "q";
  uint32_t o;
  ck_assert_int_eq(kiln_module_add_computation(b.m, "main", &o), 0);
  param(b.m, o, "r", 0);
  CHECK_VERDICT(b.m, NULL, "main|computation name %main is used twice");
  kiln_module_destroy(b.m);
}
END_TEST

START_TEST(test_operand_from_other_computation) {
  bm b = new_module();
  kiln_instr *p = param(b.m, b.main, "p", 0);
  uint32_t o;
  ck_assert_int_eq(kiln_module_add_computation(b.m, "other", &o), 0);
  kiln_instr *q = param(b.m, o, "q", 0);
  kiln_id ops[2] = {p->id, q->id};
  add(b.m, b.main, KILN_OP_ADD, "sum", KILN_F32, D4, 1, ops, 2);
  CHECK_VERDICT(b.m, NULL, "main/sum|add: operand 1 (%q) belongs to computation %other, not %main");
  kiln_module_destroy(b.m);
}
END_TEST

START_TEST(test_use_before_def) {
  bm b = new_module();
  kiln_instr *x = add(b.m, b.main, KILN_OP_NEGATE, "neg", KILN_F32, D4, 1, NULL, 0);
  kiln_instr *p = param(b.m, b.main, "p", 0);
  ck_assert_int_eq(kiln_instr_set_operands(b.m, x, &p->id, 1), 0);
  CHECK_VERDICT(b.m, NULL, "main/neg|negate: operand 0 (%p) is used before its definition");
  kiln_id self = x->id;
  ck_assert_int_eq(kiln_instr_set_operands(b.m, x, &self, 1), 0);
  CHECK_VERDICT(b.m, NULL, "main/neg|negate: operand 0 is the instruction itself");
  kiln_id bad = 1234;
  ck_assert_int_eq(kiln_instr_set_operands(b.m, x, &bad, 1), 0);
  CHECK_VERDICT(b.m, NULL, "main/neg|negate: operand 0 has id 1234, which is not an instruction");
  ck_assert_int_eq(kiln_instr_set_operands(b.m, x, NULL, 0), 0);
  ck_assert_int_eq(kiln_instr_set_control(b.m, x, &p->id, 1), 0);
  CHECK_VERDICT(b.m, NULL,
                "main/neg|negate: control predecessor 0 (%p) is used before its definition");
  kiln_module_destroy(b.m);
}
END_TEST

START_TEST(test_recursion) {
  bm b = new_module();
  kiln_instr *p = param(b.m, b.main, "p", 0);
  uint32_t ca, cb;
  ck_assert_int_eq(kiln_module_add_computation(b.m, "a", &ca), 0);
  ck_assert_int_eq(kiln_module_add_computation(b.m, "b", &cb), 0);
  kiln_instr *pa = param(b.m, ca, "pa", 0);
  kiln_instr *pb = param(b.m, cb, "pb", 0);
  kiln_instr *call_main = add(b.m, b.main, KILN_OP_CALL, "c0", KILN_F32, D4, 1, &p->id, 1);
  kiln_instr *call_a = add(b.m, ca, KILN_OP_CALL, "ca", KILN_F32, D4, 1, &pa->id, 1);
  kiln_instr *call_b = add(b.m, cb, KILN_OP_CALL, "cb", KILN_F32, D4, 1, &pb->id, 1);
  kiln_instr_set_called(b.m, call_main, &ca, 1);
  kiln_instr_set_called(b.m, call_a, &cb, 1);
  kiln_instr_set_called(b.m, call_b, &ca, 1);
  CHECK_VERDICT(b.m, NULL, "b/cb|call: recursive call: %a -> %b -> %a");
  kiln_instr_set_called(b.m, call_b, &cb, 1);
  CHECK_VERDICT(b.m, NULL, "b/cb|call: recursive call: %b -> %b");
  uint32_t nowhere = 42;
  kiln_instr_set_called(b.m, call_b, &nowhere, 1);
  CHECK_VERDICT(b.m, NULL, "b/cb|call: called computation 0 has id 42, which does not exist");
  kiln_module_destroy(b.m);
}
END_TEST

/* ---- nesting depth ----------------------------------------------------------------- */

/* A chain of `depth` nested calls (the entry calls c<depth-1>, ... c0),
 * or with whiles: body<i> runs the while over cond<i-1>/body<i-1>. */
static char *deep_text(const char *kind, int depth) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, "HloModule deep\n");
  if (strcmp(kind, "call") == 0) {
    kiln_sbuf_puts(&b, "c0 {\n  p = f32[] parameter(0)\n  ROOT r = f32[] sine(p)\n}\n");
    for (int i = 1; i < depth; i++)
      kiln_sbuf_printf(
          &b, "c%d {\n  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), to_apply=c%d\n}\n", i,
          i - 1);
    kiln_sbuf_printf(&b,
                     "ENTRY main {\n  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), "
                     "to_apply=c%d\n}\n",
                     depth - 1);
  } else {
    const char *S = "(s32[], f32[])";
    for (int i = 0; i < depth; i++) {
      kiln_sbuf_printf(&b,
                       "cond%d {\n  s = %s parameter(0)\n  i = s32[] get-tuple-element(s), "
                       "index=0\n  two = s32[] constant(2)\n  ROOT lt = pred[] compare(i, two), "
                       "direction=LT\n}\n",
                       i, S);
      kiln_sbuf_printf(&b,
                       "body%d {\n  s = %s parameter(0)\n  i = s32[] get-tuple-element(s), "
                       "index=0\n",
                       i, S);
      if (i == 0)
        kiln_sbuf_puts(&b, "  x0 = f32[] get-tuple-element(s), index=1\n  x = f32[] sine(x0)\n");
      else
        kiln_sbuf_printf(&b,
                         "  w = %s while(s), condition=cond%d, body=body%d\n  x = f32[] "
                         "get-tuple-element(w), index=1\n",
                         S, i - 1, i - 1);
      kiln_sbuf_printf(&b,
                       "  one = s32[] constant(1)\n  i1 = s32[] add(i, one)\n  ROOT t = %s "
                       "tuple(i1, x)\n}\n",
                       S);
    }
    kiln_sbuf_printf(&b,
                     "ENTRY main {\n  p = f32[] parameter(0)\n  z = s32[] constant(0)\n  s = %s "
                     "tuple(z, p)\n  w = %s while(s), condition=cond%d, body=body%d\n  ROOT r = "
                     "f32[] get-tuple-element(w), index=1\n}\n",
                     S, S, depth - 1, depth - 1);
  }
  return kiln_sbuf_detach(&b, NULL);
}

static kiln_module *parse_deep(const char *kind, int depth) {
  char *text = deep_text(kind, depth);
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "deep", NULL, &m, &st) == 0, "%s: %s",
                st.where, st.msg);
  kiln_free(text);
  return m;
}

START_TEST(test_nesting_limit) {
  kiln_module *m = parse_deep("call", 256); /* the entry and 256 below it */
  CHECK_VERDICT(m, NULL, "ok");
  kiln_verify_options o = {.max_nesting = 255};
  CHECK_VERDICT(m, &o,
                "main|computations nest 256 deep (calls, whiles, conditionals, fusions and the "
                "other called computations), more than the limit of 255 (max-nesting): %main -> "
                "%c255 -> %c254 -> %c253 -> %c252 -> %c251 -> ... (248 more) -> %c2 -> %c1 -> %c0");
  kiln_module_destroy(m);
  m = parse_deep("call", 5000); /* the size that overflowed the lowering's stack */
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_verify(m, NULL, &st), KILN_EVERIFY);
  ck_assert_ptr_nonnull(strstr(st.msg, "nest 5000 deep"));
  ck_assert_ptr_nonnull(strstr(st.msg, "limit of 256 (max-nesting)"));
  o.max_nesting = 5000; /* above the cap: counts as the cap */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_verify(m, &o, &st), KILN_EVERIFY);
  ck_assert_ptr_nonnull(strstr(st.msg, "limit of 4096"));
  kiln_module_destroy(m);
  m = parse_deep("while", 1000);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_verify(m, NULL, &st), KILN_EVERIFY);
  ck_assert_ptr_nonnull(strstr(st.msg, "nest 1000 deep"));
  ck_assert_ptr_nonnull(strstr(st.msg, "%main -> %body999 -> %body998"));
  o.max_nesting = 1000;
  CHECK_VERDICT(m, &o, "ok");
  kiln_module_destroy(m);
}
END_TEST

/* Many computations side by side are no nesting at all: 3000 whiles in a
 * row in the entry is depth 1. */
START_TEST(test_wide_is_not_deep) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, "HloModule wide\nc {\n  p = f32[] parameter(0)\n  ROOT r = f32[] sine(p)\n}\n"
                     "ENTRY main {\n  x0 = f32[] parameter(0)\n");
  for (int i = 1; i <= 3000; i++)
    kiln_sbuf_printf(&b, "  x%d = f32[] call(x%d), to_apply=c\n", i, i - 1);
  kiln_sbuf_puts(&b, "  ROOT r = f32[] negate(x3000)\n}\n");
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(kiln_sbuf_str(&b), b.len, "wide", NULL, &m, &st), 0);
  kiln_sbuf_free(&b);
  kiln_verify_options o = {.max_nesting = 1};
  CHECK_VERDICT(m, &o, "ok");
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_absurd_shapes) {
  bm b = new_module();
  kiln_instr *p = param(b.m, b.main, "p", 0);
  p->shape.dims[0] = -3;
  CHECK_VERDICT(b.m, NULL, "main/p|parameter: result shape: dimension 0 has size -3");
  int64_t big[2] = {(int64_t)1 << 30, (int64_t)1 << 20};
  kiln_shape s;
  ck_assert_int_eq(kiln_shape_make_array(b.m->arena, &s, KILN_F32, big, 2), 0);
  p->shape = s;
  CHECK_VERDICT(b.m, NULL,
                "main/p|parameter: result shape: f32[1073741824,1048576] has 1125899906842624 "
                "elements, over the limit of 1099511627776");
  big[0] = big[1] = INT64_MAX / 2;
  ck_assert_int_eq(kiln_shape_make_array(b.m->arena, &s, KILN_F32, big, 2), 0);
  p->shape = s;
  CHECK_VERDICT(b.m, NULL,
                "main/p|parameter: result shape: f32[4611686018427387903,4611686018427387903] has "
                "more elements than an int64 holds");
  int64_t small[1] = {100};
  ck_assert_int_eq(kiln_shape_make_array(b.m->arena, &s, KILN_F32, small, 1), 0);
  p->shape = s;
  kiln_verify_options o = {.max_elements = 50};
  CHECK_VERDICT(b.m, &o,
                "main/p|parameter: result shape: f32[100] has 100 elements, over the limit of 50");
  CHECK_VERDICT(b.m, NULL, "ok");
  p->shape.dtype = (kiln_dtype)999;
  CHECK_VERDICT(b.m, NULL, "main/p|parameter: result shape: element type 999 is not valid");
  p->shape.dtype = KILN_INVALID;
  CHECK_VERDICT(b.m, NULL, "main/p|parameter: the instruction has no result shape");
  kiln_module_destroy(b.m);
}
END_TEST

START_TEST(test_bad_layout) {
  bm b = new_module();
  kiln_instr *p = param(b.m, b.main, "p", 0);
  int64_t d2[2] = {2, 3}, mm[2] = {1, 1};
  kiln_shape s;
  kiln_layout l = {.minor_to_major = mm, .rank = 2};
  ck_assert_int_eq(kiln_shape_make_array(b.m->arena, &s, KILN_F32, d2, 2), 0);
  s.layout = &l;
  p->shape = s;
  CHECK_VERDICT(b.m, NULL,
                "main/p|parameter: result shape: the layout is not a permutation of the 2 "
                "dimensions");
  mm[0] = 0;
  CHECK_VERDICT(b.m, NULL, "ok");
  l.rank = 1;
  CHECK_VERDICT(b.m, NULL, "main/p|parameter: result shape: the layout has 1 entries for rank 2");
  kiln_module_destroy(b.m);
}
END_TEST

START_TEST(test_instruction_tables) {
  bm b = new_module();
  param(b.m, b.main, "p", 0);
  kiln_instr *q = param(b.m, b.main, "q", 1);
  kiln_computation *c = b.m->comps[b.main];
  c->instrs[1] = 0; /* p listed twice, q not at all */
  CHECK_VERDICT(b.m, NULL, "main|instruction %p is listed twice (in %main and %main)");
  c->ninstrs = 1;
  CHECK_VERDICT(b.m, NULL, "q|instruction %q is not listed in its computation %main");
  c->ninstrs = 2;
  c->instrs[1] = 9;
  CHECK_VERDICT(b.m, NULL, "main|computation %main lists instruction id 9, which does not exist");
  c->instrs[1] = q->id;
  q->comp = 5;
  CHECK_VERDICT(b.m, NULL, "q|instruction %q belongs to computation id 5, which does not exist");
  q->comp = b.main;
  CHECK_VERDICT(b.m, NULL, "ok");
  kiln_module_destroy(b.m);
}
END_TEST

/* A pass removes an instruction by dropping it from its computation's list
 * and setting its comp to KILN_NO_ID (rewrite.h); it may stay in the table
 * but no one may use it. */
START_TEST(test_removed_instructions) {
  bm b = new_module();
  kiln_instr *p = param(b.m, b.main, "p", 0);
  kiln_instr *dead = add(b.m, b.main, KILN_OP_NEGATE, "dead", KILN_F32, D4, 1, &p->id, 1);
  kiln_instr *n = add(b.m, b.main, KILN_OP_NEGATE, "n", KILN_F32, D4, 1, &p->id, 1);
  kiln_computation *c = b.m->comps[b.main];
  c->instrs[1] = n->id;
  c->ninstrs = 2;
  dead->comp = KILN_NO_ID;
  dead->shape.dtype = KILN_INVALID; /* not looked at */
  CHECK_VERDICT(b.m, NULL, "ok");
  ck_assert_int_eq(kiln_instr_set_operands(b.m, n, &dead->id, 1), 0);
  CHECK_VERDICT(b.m, NULL, "main/n|negate: operand 0 (%dead) was removed from its computation");
  c->instrs[1] = dead->id;
  CHECK_VERDICT(b.m, NULL, "main|instruction %dead is listed in %main but was removed from it");
  kiln_module_destroy(b.m);
}
END_TEST

START_TEST(test_calls_on_non_calling_op) {
  bm b = new_module();
  kiln_instr *p = param(b.m, b.main, "p", 0);
  kiln_instr *n = add(b.m, b.main, KILN_OP_NEGATE, "n", KILN_F32, D4, 1, &p->id, 1);
  uint32_t self = b.main;
  kiln_instr_set_called(b.m, n, &self, 1);
  /* The call graph pass sees the self-call first. */
  CHECK_VERDICT(b.m, NULL, "main/n|negate: recursive call: %main -> %main");
  uint32_t o;
  ck_assert_int_eq(kiln_module_add_computation(b.m, "o", &o), 0);
  param(b.m, o, "r", 0);
  kiln_instr_set_called(b.m, n, &o, 1);
  CHECK_VERDICT(b.m, NULL, "main/n|negate: takes no called computations, found 1");
  kiln_module_destroy(b.m);
}
END_TEST

START_TEST(test_constant_literal) {
  bm b = new_module();
  kiln_instr *k = add(b.m, b.main, KILN_OP_CONSTANT, "k", KILN_F32, D4, 1, NULL, 0);
  CHECK_VERDICT(b.m, NULL, "main/k|constant: the constant has no literal value");
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_literal_create(b.m->arena, &k->shape, 0, &k->literal, &st), 0);
  CHECK_VERDICT(b.m, NULL, "ok");
  k->literal->nbytes = 3;
  CHECK_VERDICT(b.m, NULL, "main/k|constant: the literal's data does not match its shape");
  k->literal->nbytes = 16;
  k->shape.dims[0] = 5;
  CHECK_VERDICT(b.m, NULL,
                "main/k|constant: result shape f32[5] does not match the inferred shape f32[4]");
  kiln_module_destroy(b.m);
}
END_TEST

/* ---- per-op and module checks from text ----------------------------------------- */

#define HEAD \
  "HloModule t\n" \
  "sum {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n" \
  " ROOT s = f32[] add(a, b)\n}\n" \
  "bsum {\n a = bf16[] parameter(0)\n b = bf16[] parameter(1)\n" \
  " ROOT s = bf16[] add(a, b)\n}\n" \
  "neg {\n p = f32[4] parameter(0)\n ROOT n = f32[4] negate(p)\n}\n"

typedef struct vcase {
  const char *text;
  const char *want;
} vcase;

static const vcase vcases[] = {
    /* A written result that disagrees with inference. */
    {HEAD "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = f32[3] negate(v)\n}\n",
     "main/x|negate: result shape f32[3] does not match the inferred shape f32[4]"},
    {HEAD "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = s32[4] negate(v)\n}\n",
     "main/x|negate: result shape s32[4] does not match the inferred shape f32[4]"},
    /* Mixed precision: a reduce may produce bf16 from an f32 reducer (corpus
     * 068), an add may be written in another float type; data movement may not. */
    {HEAD "ENTRY main {\n v = f32[4] parameter(0)\n z = f32[] constant(0)\n"
          " ROOT x = bf16[] reduce(v, z), dimensions={0}, to_apply=sum\n}\n",
     "ok"},
    {HEAD "ENTRY main {\n v = bf16[4] parameter(0)\n z = bf16[] constant(0)\n"
          " ROOT x = f32[] reduce(v, z), dimensions={0}, to_apply=sum\n}\n",
     "ok"},
    {HEAD "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = bf16[4] add(v, v)\n}\n", "ok"},
    {HEAD "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = (bf16[4]) tuple(v)\n}\n",
     "main/x|tuple: result shape (bf16[4]) does not match the inferred shape (f32[4])"},
    {HEAD "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = bf16[4] call(v), to_apply=neg\n}\n",
     "main/x|call: result shape bf16[4] does not match the inferred shape f32[4]"},
    /* A written shape may be more dynamic than inferred, never less. */
    {HEAD "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = f32[<=4] negate(v)\n}\n", "ok"},
    {HEAD "ENTRY main {\n v = f32[4] parameter(0)\n n = s32[] constant(2)\n"
          " ROOT x = f32[4] set-dimension-size(v, n), dimensions={0}\n}\n",
     "main/x|set-dimension-size: result shape f32[4] does not match the inferred shape f32[<=4]"},
    /* compare written as pred: fine; with a layout: layouts are ignored. */
    {HEAD "ENTRY main {\n v = f32[2,4]{0,1} parameter(0)\n"
          " ROOT x = pred[2,4]{1,0} compare(v, v), direction=EQ\n}\n",
     "ok"},
    /* A reducer with the wrong signature. */
    {HEAD "ENTRY main {\n v = f32[4] parameter(0)\n z = f32[] constant(0)\n"
          " ROOT x = f32[] reduce(v, z), dimensions={0}, to_apply=neg\n}\n",
     "main/x|reduce: to_apply %neg takes 1 parameters, expected 2"},
    {HEAD "ENTRY main {\n v = f32[4] parameter(0)\n z = s32[] constant(0)\n"
          " ROOT x = s32[] reduce(v, z), dimensions={0}, to_apply=bsum\n}\n",
     "main/x|reduce: init value 0 has type s32[] but to_apply %bsum accumulates bf16[]"},
    /* Operand counts. */
    {HEAD "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = f32[4] negate(v, v)\n}\n",
     "main/x|negate: takes 1 operands, found 2"},
    {HEAD "ENTRY main {\n v = f32[4] parameter(0)\n"
          " ROOT x = f32[4] concatenate(), dimensions={0}\n}\n",
     "main/x|concatenate: takes at least 1 operands, found 0"},
    /* Errors inside called computations are found too. */
    {"HloModule t\nbad {\n p = f32[4] parameter(0)\n ROOT n = s32[4] negate(p)\n}\n"
     "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = s32[4] call(v), to_apply=bad\n}\n",
     "bad/n|negate: result shape s32[4] does not match the inferred shape f32[4]"},
    /* entry_computation_layout: checked when the counts match; ignored
     * otherwise, as real tooling does (corpus 103). */
    {"HloModule t, entry_computation_layout={(f32[4]{0})->f32[4]{0}}\n"
     "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = f32[4] negate(v)\n}\n",
     "ok"},
    {"HloModule t, entry_computation_layout={(f32[5]{0})->f32[4]{0}}\n"
     "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = f32[4] negate(v)\n}\n",
     "main|entry_computation_layout: parameter 0 is f32[5] but parameter %v has shape f32[4]"},
    {"HloModule t, entry_computation_layout={(f32[4]{0})->s32[4]{0}}\n"
     "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = f32[4] negate(v)\n}\n",
     "main|entry_computation_layout: the result is s32[4] but root %x has shape f32[4]"},
    {"HloModule t, entry_computation_layout={(f32[5]{0})->s32[]}\n"
     "ENTRY main {\n v = f32[4] parameter(0)\n w = f32[4] parameter(1)\n"
     " ROOT x = f32[4] add(v, w)\n}\n",
     "ok"},
    /* input_output_alias. */
    {"HloModule t, input_output_alias={ {}: (0, {}, must-alias) }\n"
     "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = f32[4] negate(v)\n}\n",
     "ok"},
    {"HloModule t, input_output_alias={ {0}: (0, {}) }\n"
     "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = f32[4] negate(v)\n}\n",
     "|input_output_alias: output {0} is not an index into the result"},
    {"HloModule t, input_output_alias={ {}: (1, {}) }\n"
     "ENTRY main {\n v = f32[4] parameter(0)\n ROOT x = f32[4] negate(v)\n}\n",
     "|input_output_alias: output {} names parameter 1, but the entry has 1 parameters"},
    {"HloModule t, input_output_alias={ {}: (0, {}) }\n"
     "ENTRY main {\n v = f32[5] parameter(0)\n ROOT x = f32[4] slice(v), slice={[0:4]}\n}\n",
     "|input_output_alias: output {} and parameter 0 at {} differ in size"},
    /* Async chains (sugar and generic). */
    {"HloModule t\nENTRY main {\n i = f32[] constant(42)\n"
     " s = ((f32[]), f32[], u32[]) negate-start(i)\n"
     " u = ((f32[]), f32[], u32[]) negate-update(s)\n ROOT d = f32[] negate-done(u)\n}\n",
     "ok"},
    {"HloModule t\nENTRY main {\n i = f32[] constant(42)\n"
     " s = ((f32[]), s32[], u32[]) negate-start(i)\n ROOT d = s32[] negate-done(s)\n}\n",
     "main/s|negate-start: result shape ((f32[]), s32[], u32[]) does not match the inferred shape "
     "((f32[]), f32[], u32[])"},
    {"HloModule t\nENTRY main {\n i = f32[] constant(42)\n"
     " s = ((f32[]), f32[], u32[]) negate-start(i)\n ROOT d = f32[] abs-done(s)\n}\n",
     "main/d|abs-done: operand 0 (%s) wraps negate but this instruction wraps abs"},
    /* While with a body that changes the state's shape. */
    {"HloModule t\n"
     "c {\n p = (s32[]) parameter(0)\n ROOT t = pred[] constant(true)\n}\n"
     "b {\n p = (s32[]) parameter(0)\n ROOT t = (s32[], s32[]) tuple(p, p)\n}\n"
     "ENTRY main {\n z = s32[] constant(0)\n i = (s32[]) tuple(z)\n"
     " ROOT w = (s32[]) while(i), condition=c, body=b\n}\n",
     "b/t|tuple: result shape (s32[], s32[]) does not match the inferred shape ((s32[]), (s32[]))"},
    {"HloModule t\n"
     "c {\n p = (s32[]) parameter(0)\n ROOT t = pred[] constant(true)\n}\n"
     "b {\n p = (s32[]) parameter(0)\n ROOT t = ((s32[]), (s32[])) tuple(p, p)\n}\n"
     "ENTRY main {\n z = s32[] constant(0)\n i = (s32[]) tuple(z)\n"
     " ROOT w = (s32[]) while(i), condition=c, body=b\n}\n",
     "main/w|while: body %b returns ((s32[]), (s32[])) but takes (s32[])"},
};

enum { NVCASES = sizeof vcases / sizeof vcases[0] };

START_TEST(test_verify_text_case) {
  const vcase *c = &vcases[_i];
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_module_parse_text(c->text, strlen(c->text), "case", NULL, &m, &st);
  if (rc) fprintf(stderr, "case %d does not parse: %s: %s\n", _i, st.where, st.msg);
  ck_assert_int_eq(rc, 0);
  char *got = verdict(m, NULL);
  if (strcmp(got, c->want) != 0)
    fprintf(stderr, "case %d\n  want: %s\n  got:  %s\n", _i, c->want, got);
  ck_assert_str_eq(got, c->want);
  kiln_free(got);
  kiln_module_destroy(m);
}
END_TEST

/* ---- the corpus -------------------------------------------------------------------- */

static const char *corpus_dir(void) {
  const char *d = getenv("KILN_CORPUS_DIR");
  return d && *d ? d : KILN_SOURCE_DIR "/../shared/corpus/xla-hlo";
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = kiln_malloc(n > 0 ? (size_t)n : 1);
  size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
  fclose(f);
  if (buf == NULL || got != (size_t)n) {
    kiln_free(buf);
    return NULL;
  }
  *len = got;
  return buf;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The .hlo files of the corpus, sorted; 0 when the corpus is absent. */
static size_t corpus_files(char ***out) {
  DIR *d = opendir(corpus_dir());
  *out = NULL;
  if (d == NULL) return 0;
  size_t n = 0, cap = 0;
  char **v = NULL;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name);
    if (l < 5 || strcmp(e->d_name + l - 4, ".hlo") != 0) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 128;
      v = realloc(v, cap * sizeof *v);
      ck_assert_ptr_nonnull(v);
    }
    v[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(v, n, sizeof *v, cmp_names);
  *out = v;
  return n;
}

static kiln_module *parse_corpus_file(const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", corpus_dir(), name);
  size_t len = 0;
  char *text = read_file(path, &len);
  ck_assert_msg(text != NULL, "cannot read %s", path);
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_module_parse_text(text, len, name, NULL, &m, &st);
  kiln_free(text);
  ck_assert_msg(rc == 0, "%s does not parse: %s: %s", name, st.where, st.msg);
  return m;
}

START_TEST(test_corpus_verifies) {
  char **files;
  size_t n = corpus_files(&files);
  if (n == 0) {
    fprintf(stderr, "test_corpus_verifies: skipped, no corpus at %s (set KILN_CORPUS_DIR)\n",
            corpus_dir());
    return;
  }
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    kiln_module *m = parse_corpus_file(files[i]);
    kiln_status st;
    kiln_status_clear(&st);
    if (kiln_module_verify(m, NULL, &st) != 0) {
      fprintf(stderr, "%s: %s: %s\n", files[i], st.where, st.msg);
      bad++;
    }
    kiln_module_destroy(m);
    free(files[i]);
  }
  free(files);
  ck_assert_msg(bad == 0, "%zu corpus modules fail to verify", bad);
}
END_TEST

/* ---- hostile input ----------------------------------------------------------------------- */

/* A tiny deterministic generator (xorshift). */
static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static int64_t wild(uint64_t *s) {
  static const int64_t v[] = {
      -1, 0, 1, 2, 3, 7, 64, 1000, INT32_MAX, (int64_t)UINT32_MAX, INT64_MAX, INT64_MIN};
  return v[rnd(s) % (sizeof v / sizeof v[0])];
}

/* One random corruption of an id, a count-free field or an attribute. */
static void mutate(kiln_module *m, uint64_t *s) {
  kiln_instr *ins = m->instrs[rnd(s) % m->ninstrs];
  switch (rnd(s) % 9) {
  case 0:
    if (ins->noperands) ins->operands[rnd(s) % ins->noperands] = (kiln_id)wild(s);
    break;
  case 1:
    if (ins->ncalled) ins->called[rnd(s) % ins->ncalled] = (uint32_t)wild(s);
    break;
  case 2: ins->param_number = wild(s); break;
  case 3:
    if (kiln_shape_is_array(&ins->shape) && ins->shape.rank)
      ins->shape.dims[rnd(s) % ins->shape.rank] = wild(s);
    break;
  case 4:
    if (ins->nattrs) {
      kiln_attr *a = &ins->attrs[rnd(s) % ins->nattrs];
      kiln_attr_kind k = kiln_attr_key_kind(a->key);
      if (k == KILN_AK_INT || k == KILN_AK_BOOL || k == KILN_AK_CMP_DIR)
        a->v.i = wild(s);
      else if ((k == KILN_AK_INTS || k == KILN_AK_SLICE || k == KILN_AK_PADDING) && a->v.ints.n)
        a->v.ints.v[rnd(s) % a->v.ints.n] = wild(s);
      else if (k == KILN_AK_WINDOW && a->v.window && a->v.window->rank)
        a->v.window->dims[rnd(s) % a->v.window->rank].stride = wild(s);
    }
    break;
  case 5: ins->op = (kiln_opcode)(rnd(s) % (KILN_OP_COUNT + 2)); break;
  case 6: m->comps[rnd(s) % m->ncomps]->root = (kiln_id)wild(s); break;
  case 7:
    if (ins->ncontrol)
      ins->control_preds[0] = (kiln_id)wild(s);
    else if (ins->noperands > 1)
      ins->noperands--;
    break;
  case 8: m->entry = (uint32_t)(rnd(s) % (m->ncomps + 1)); break;
  }
}

START_TEST(test_mutated_corpus_never_crashes) {
  char **files;
  size_t n = corpus_files(&files);
  if (n == 0) {
    fprintf(stderr, "test_mutated_corpus_never_crashes: skipped, no corpus\n");
    return;
  }
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  const char *env = getenv("KILN_VERIFY_MUTATION_ROUNDS"); /* more for soak runs */
  int rounds = env && atoi(env) > 0 ? atoi(env) : 40;
  for (size_t i = 0; i < n; i++) {
    for (int round = 0; round < rounds; round++) {
      kiln_module *m = parse_corpus_file(files[i]);
      int k = 1 + (int)(rnd(&seed) % 3);
      for (int j = 0; j < k; j++) mutate(m, &seed);
      kiln_status st;
      kiln_status_clear(&st);
      int rc = kiln_module_verify(m, NULL, &st);
      ck_assert(rc == 0 || (rc < 0 && st.code == rc && st.msg[0]));
      /* Inference alone must be just as safe on every instruction. */
      kiln_arena *a = kiln_arena_create();
      for (uint32_t id = 0; id < m->ninstrs; id++) {
        kiln_shape out;
        kiln_status_clear(&st);
        (void)kiln_infer_shape(m, m->instrs[id], a, &out, &st);
      }
      kiln_arena_destroy(a);
      kiln_module_destroy(m);
    }
    free(files[i]);
  }
  free(files);
}
END_TEST

START_TEST(test_out_of_memory) {
  const char *text = vcases[2].text;
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(text, strlen(text), "t", NULL, &m, &st), 0);
  for (long n = 1; n < 200; n++) {
    kiln_status_clear(&st);
    kiln_alloc_fail_after(n);
    int rc = kiln_module_verify(m, NULL, &st);
    kiln_alloc_fail_after(0);
    ck_assert(rc == 0 || rc == KILN_ENOMEM);
    if (rc == 0) break;
  }
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_null_module) {
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_verify(NULL, NULL, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "kiln_module_verify: NULL module");
}
END_TEST

int main(void) {
  Suite *s = suite_create("verify");
  TCase *tc = tcase_create("structure");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_valid_builder_module);
  tcase_add_test(tc, test_empty_computation);
  tcase_add_test(tc, test_root_not_in_computation);
  tcase_add_test(tc, test_param_gap_and_duplicate);
  tcase_add_test(tc, test_entry_checks);
  tcase_add_test(tc, test_duplicate_names);
  tcase_add_test(tc, test_operand_from_other_computation);
  tcase_add_test(tc, test_use_before_def);
  tcase_add_test(tc, test_recursion);
  tcase_add_test(tc, test_absurd_shapes);
  tcase_add_test(tc, test_bad_layout);
  tcase_add_test(tc, test_instruction_tables);
  tcase_add_test(tc, test_removed_instructions);
  tcase_add_test(tc, test_calls_on_non_calling_op);
  tcase_add_test(tc, test_constant_literal);
  tcase_add_test(tc, test_nesting_limit);
  tcase_add_test(tc, test_wide_is_not_deep);
  tcase_add_test(tc, test_null_module);
  suite_add_tcase(s, tc);
  TCase *tt = tcase_create("text");
  tcase_set_timeout(tt, 60);
  tcase_add_loop_test(tt, test_verify_text_case, 0, NVCASES);
  suite_add_tcase(s, tt);
  TCase *tk = tcase_create("corpus");
  tcase_set_timeout(tk, 600);
  tcase_add_test(tk, test_corpus_verifies);
  tcase_add_test(tk, test_mutated_corpus_never_crashes);
  tcase_add_test(tk, test_out_of_memory);
  suite_add_tcase(s, tk);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
