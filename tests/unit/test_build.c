/* Unit tests for the instruction builder shared by the passes and the
 * transforms (compiler/ir/build.h): the one conversion of scalar constants
 * for every element type, names that stay unique in their computation,
 * explicit shapes and splats that keep layouts, sticky errors, purity. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/build.h"
#include "compiler/ir/text.h"

static kiln_module *parse(const char *text) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  int rc = kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st);
  ck_assert_msg(rc == 0, "%s: %s", st.where, st.msg);
  return m;
}

static kiln_instr *find(const kiln_module *m, const char *name) {
  for (uint32_t i = 0; i < m->ninstrs; i++)
    if (m->instrs[i]->name && strcmp(m->instrs[i]->name, name) == 0) return m->instrs[i];
  ck_abort_msg("no instruction %s", name);
  return NULL;
}

/* A session over a one-parameter module, building into its entry. */
typedef struct fixture {
  kiln_module *m;
  kiln__tx tx;
  kiln__b b;
  kiln_status st;
} fixture;

static void setup(fixture *f) {
  f->m = parse("HloModule m\nENTRY main { ROOT p = f32[2] parameter(0) }\n");
  kiln_status_clear(&f->st);
  ck_assert_int_eq(kiln__tx_init(&f->tx, f->m, "test", &f->st), 0);
  f->b = (kiln__b){&f->tx, f->m->entry};
}

static void teardown(fixture *f) {
  kiln__tx_fini(&f->tx);
  kiln_module_destroy(f->m);
}

static const kiln_literal *lit_of(fixture *f, kiln_id id) {
  ck_assert_uint_ne(id, KILN_NO_ID);
  const kiln_instr *c = f->m->instrs[id];
  ck_assert_int_eq(c->op, KILN_OP_CONSTANT);
  ck_assert_ptr_nonnull(c->literal);
  ck_assert_uint_eq(c->shape.rank, 0);
  ck_assert_int_eq(c->literal->shape.dtype, c->shape.dtype);
  return c->literal;
}

static uint16_t bits16(fixture *f, kiln_id id) {
  const kiln_literal *l = lit_of(f, id);
  ck_assert_uint_eq(l->nbytes, 2);
  uint16_t h;
  memcpy(&h, l->data, 2);
  return h;
}

static uint64_t u64_of(fixture *f, kiln_id id) {
  const kiln_literal *l = lit_of(f, id);
  ck_assert_uint_eq(l->nbytes, 8);
  uint64_t v;
  memcpy(&v, l->data, 8);
  return v;
}

static int64_t s64_of(fixture *f, kiln_id id) { return (int64_t)u64_of(f, id); }

START_TEST(test_scalar_complex) {
  fixture f;
  setup(&f);
  double re, im;
  /* Not truncated to an integer, imaginary part zero. */
  kiln_literal_get_c128(lit_of(&f, kiln__b_scalar(&f.b, KILN_C64, 0.5)), 0, &re, &im);
  ck_assert(re == 0.5 && im == 0);
  kiln_literal_get_c128(lit_of(&f, kiln__b_scalar(&f.b, KILN_C128, -2.25)), 0, &re, &im);
  ck_assert(re == -2.25 && im == 0);
  kiln_literal_get_c128(lit_of(&f, kiln__b_scalar(&f.b, KILN_C128, 0.1)), 0, &re, &im);
  ck_assert(re == 0.1);
  kiln_literal_get_c128(lit_of(&f, kiln__b_scalar(&f.b, KILN_C64, 0.1)), 0, &re, &im);
  ck_assert(re == (double)(float)0.1 && im == 0);
  kiln_literal_get_c128(lit_of(&f, kiln__b_iscalar(&f.b, KILN_C64, -7)), 0, &re, &im);
  ck_assert(re == -7 && im == 0);
  /* 2^24 + 1 is not a float: nearest even is 2^24. */
  kiln_literal_get_c128(lit_of(&f, kiln__b_iscalar(&f.b, KILN_C64, (1 << 24) + 1)), 0, &re, &im);
  ck_assert(re == 16777216.0 && im == 0);
  kiln_literal_get_c128(lit_of(&f, kiln__b_uscalar(&f.b, KILN_C128, UINT64_C(1) << 60)), 0, &re,
                        &im);
  ck_assert(re == ldexp(1, 60) && im == 0);
  ck_assert_int_eq(f.tx.err, 0);
  teardown(&f);
}
END_TEST

START_TEST(test_scalar_u64_above_2_63) {
  fixture f;
  setup(&f);
  /* Doubles at and above 2^63 are exact u64 values. */
  ck_assert_uint_eq(u64_of(&f, kiln__b_scalar(&f.b, KILN_U64, ldexp(1, 63))), UINT64_C(1) << 63);
  ck_assert_uint_eq(u64_of(&f, kiln__b_scalar(&f.b, KILN_U64, ldexp(1, 63) + ldexp(1, 12))),
                    (UINT64_C(1) << 63) + 4096);
  ck_assert_uint_eq(u64_of(&f, kiln__b_scalar(&f.b, KILN_U64, 18446744073709549568.0)),
                    UINT64_C(18446744073709549568));
  /* Past the top and below zero: saturated, as convert does. */
  ck_assert_uint_eq(u64_of(&f, kiln__b_scalar(&f.b, KILN_U64, ldexp(1, 64))), UINT64_MAX);
  ck_assert_uint_eq(u64_of(&f, kiln__b_scalar(&f.b, KILN_U64, -1.0)), 0);
  ck_assert_uint_eq(u64_of(&f, kiln__b_scalar(&f.b, KILN_U64, NAN)), 0);
  /* Integers: exact, wrapped. */
  ck_assert_uint_eq(u64_of(&f, kiln__b_uscalar(&f.b, KILN_U64, UINT64_MAX)), UINT64_MAX);
  ck_assert_uint_eq(u64_of(&f, kiln__b_uscalar(&f.b, KILN_U64, (UINT64_C(1) << 63) + 1)),
                    (UINT64_C(1) << 63) + 1);
  ck_assert_uint_eq(u64_of(&f, kiln__b_iscalar(&f.b, KILN_U64, -1)), UINT64_MAX);
  const kiln_literal *l = lit_of(&f, kiln__b_iscalar(&f.b, KILN_U32, -1));
  ck_assert_uint_eq(kiln_literal_get_u64(l, 0), UINT32_MAX);
  l = lit_of(&f, kiln__b_uscalar(&f.b, KILN_U8, 0x1ff));
  ck_assert_uint_eq(kiln_literal_get_u64(l, 0), 0xff);
  ck_assert_int_eq(f.tx.err, 0);
  teardown(&f);
}
END_TEST

START_TEST(test_scalar_s64_extremes) {
  fixture f;
  setup(&f);
  ck_assert(s64_of(&f, kiln__b_iscalar(&f.b, KILN_S64, INT64_MIN)) == INT64_MIN);
  ck_assert(s64_of(&f, kiln__b_iscalar(&f.b, KILN_S64, INT64_MAX)) == INT64_MAX);
  ck_assert(s64_of(&f, kiln__b_scalar(&f.b, KILN_S64, -ldexp(1, 63))) == INT64_MIN);
  /* 2^63 is one past INT64_MAX: saturated, not wrapped to INT64_MIN. */
  ck_assert(s64_of(&f, kiln__b_scalar(&f.b, KILN_S64, ldexp(1, 63))) == INT64_MAX);
  ck_assert(s64_of(&f, kiln__b_scalar(&f.b, KILN_S64, -INFINITY)) == INT64_MIN);
  ck_assert(s64_of(&f, kiln__b_scalar(&f.b, KILN_S64, INFINITY)) == INT64_MAX);
  ck_assert(s64_of(&f, kiln__b_scalar(&f.b, KILN_S64, NAN)) == 0);
  ck_assert(s64_of(&f, kiln__b_scalar(&f.b, KILN_S64, ldexp(1, 62) + ldexp(1, 10))) ==
            (INT64_C(1) << 62) + 1024);
  /* Narrower types: truncation toward zero, saturation to their range;
   * integers wrap. */
  const kiln_literal *l = lit_of(&f, kiln__b_scalar(&f.b, KILN_S8, -3.7));
  ck_assert_int_eq(kiln_literal_get_s64(l, 0), -3);
  l = lit_of(&f, kiln__b_scalar(&f.b, KILN_S32, 1e10));
  ck_assert_int_eq(kiln_literal_get_s64(l, 0), INT32_MAX);
  l = lit_of(&f, kiln__b_scalar(&f.b, KILN_S32, -1e10));
  ck_assert_int_eq(kiln_literal_get_s64(l, 0), INT32_MIN);
  l = lit_of(&f, kiln__b_iscalar(&f.b, KILN_S8, 200));
  ck_assert_int_eq(kiln_literal_get_s64(l, 0), -56);
  /* s64 extremes into floats: rounded once. */
  l = lit_of(&f, kiln__b_iscalar(&f.b, KILN_F64, INT64_MIN));
  ck_assert(kiln_literal_get_f64(l, 0) == -ldexp(1, 63));
  l = lit_of(&f, kiln__b_iscalar(&f.b, KILN_F32, INT64_MAX));
  ck_assert(kiln_literal_get_f64(l, 0) == ldexp(1, 63));
  ck_assert_int_eq(f.tx.err, 0);
  teardown(&f);
}
END_TEST

START_TEST(test_scalar_f16_bf16_nearest_even) {
  fixture f;
  setup(&f);
  /* f16 (10 mantissa bits) around 1: ulp 2^-10, halfway 2^-11. */
  ck_assert_uint_eq(bits16(&f, kiln__b_scalar(&f.b, KILN_F16, 1.0)), 0x3c00);
  ck_assert_uint_eq(bits16(&f, kiln__b_scalar(&f.b, KILN_F16, 1 + ldexp(1, -11))), 0x3c00);
  ck_assert_uint_eq(bits16(&f, kiln__b_scalar(&f.b, KILN_F16, 1 + 3 * ldexp(1, -11))), 0x3c02);
  /* Just above halfway: up. Through f32 (which drops the 2^-30) this would
   * be a tie and round down: the conversion must be one step. */
  ck_assert_uint_eq(bits16(&f, kiln__b_scalar(&f.b, KILN_F16, 1 + ldexp(1, -11) + ldexp(1, -30))),
                    0x3c01);
  ck_assert_uint_eq(bits16(&f, kiln__b_scalar(&f.b, KILN_F16, -2.0)), 0xc000);
  ck_assert_uint_eq(bits16(&f, kiln__b_scalar(&f.b, KILN_F16, 65519.0)), 0x7bff); /* max */
  ck_assert_uint_eq(bits16(&f, kiln__b_scalar(&f.b, KILN_F16, 65520.0)), 0x7c00); /* tie: inf */
  ck_assert_uint_eq(bits16(&f, kiln__b_scalar(&f.b, KILN_F16, ldexp(1, -24))), 0x0001);
  ck_assert_uint_eq(bits16(&f, kiln__b_scalar(&f.b, KILN_F16, ldexp(1, -25))), 0x0000); /* tie */
  ck_assert_uint_eq(bits16(&f, kiln__b_iscalar(&f.b, KILN_F16, 2049)), 0x6800);         /* 2048 */
  ck_assert_uint_eq(bits16(&f, kiln__b_iscalar(&f.b, KILN_F16, 2051)), 0x6802);         /* 2052 */
  /* bf16 (7 mantissa bits) around 1: halfway 2^-8. */
  ck_assert_uint_eq(bits16(&f, kiln__b_scalar(&f.b, KILN_BF16, 1 + ldexp(1, -8))), 0x3f80);
  ck_assert_uint_eq(bits16(&f, kiln__b_scalar(&f.b, KILN_BF16, 1 + 3 * ldexp(1, -8))), 0x3f82);
  ck_assert_uint_eq(bits16(&f, kiln__b_scalar(&f.b, KILN_BF16, 1 + ldexp(1, -8) + ldexp(1, -40))),
                    0x3f81);
  /* bf16 from integers past 2^53: 2^56 + 2^48 is a tie (ulp 2^49), one more
   * is above it. Through double the +1 would be lost. */
  ck_assert_uint_eq(
      bits16(&f, kiln__b_iscalar(&f.b, KILN_BF16, (INT64_C(1) << 56) + (INT64_C(1) << 48))),
      0x5b80);
  ck_assert_uint_eq(
      bits16(&f, kiln__b_iscalar(&f.b, KILN_BF16, (INT64_C(1) << 56) + (INT64_C(1) << 48) + 1)),
      0x5b81);
  ck_assert_uint_eq(
      bits16(&f, kiln__b_iscalar(&f.b, KILN_BF16, -((INT64_C(1) << 56) + (INT64_C(1) << 48) + 1))),
      0xdb81);
  ck_assert_uint_eq(
      bits16(&f, kiln__b_uscalar(&f.b, KILN_BF16, (UINT64_C(1) << 63) + (UINT64_C(1) << 55) + 1)),
      0x5f01);
  /* f32 from an integer past 2^53, same idea (ulp 2^33 at 2^56). */
  const kiln_literal *l =
      lit_of(&f, kiln__b_iscalar(&f.b, KILN_F32, (INT64_C(1) << 56) + (INT64_C(1) << 32) + 1));
  ck_assert(kiln_literal_get_f64(l, 0) == ldexp(1, 56) + ldexp(1, 33));
  ck_assert_int_eq(f.tx.err, 0);
  teardown(&f);
}
END_TEST

START_TEST(test_scalar_pred) {
  fixture f;
  setup(&f);
  ck_assert(kiln_literal_get_pred(lit_of(&f, kiln__b_scalar(&f.b, KILN_PRED, 0.5)), 0));
  ck_assert(kiln_literal_get_pred(lit_of(&f, kiln__b_scalar(&f.b, KILN_PRED, -3)), 0));
  ck_assert(kiln_literal_get_pred(lit_of(&f, kiln__b_scalar(&f.b, KILN_PRED, NAN)), 0));
  ck_assert(!kiln_literal_get_pred(lit_of(&f, kiln__b_scalar(&f.b, KILN_PRED, 0)), 0));
  ck_assert(!kiln_literal_get_pred(lit_of(&f, kiln__b_scalar(&f.b, KILN_PRED, -0.0)), 0));
  ck_assert(kiln_literal_get_pred(lit_of(&f, kiln__b_iscalar(&f.b, KILN_PRED, 2)), 0));
  ck_assert(
      kiln_literal_get_pred(lit_of(&f, kiln__b_uscalar(&f.b, KILN_PRED, UINT64_C(1) << 63)), 0));
  ck_assert(!kiln_literal_get_pred(lit_of(&f, kiln__b_iscalar(&f.b, KILN_PRED, 0)), 0));
  /* Stored as one 0/1 byte. */
  const kiln_literal *l = lit_of(&f, kiln__b_iscalar(&f.b, KILN_PRED, 256));
  ck_assert_uint_eq(l->nbytes, 1);
  ck_assert_uint_eq(*(const uint8_t *)l->data, 1);
  ck_assert_int_eq(f.tx.err, 0);
  teardown(&f);
}
END_TEST

START_TEST(test_scalar_other_floats) {
  fixture f;
  setup(&f);
  const kiln_literal *l = lit_of(&f, kiln__b_scalar(&f.b, KILN_F32, 0.1));
  ck_assert(kiln_literal_get_f64(l, 0) == (double)(float)0.1);
  l = lit_of(&f, kiln__b_scalar(&f.b, KILN_F64, 0.1));
  ck_assert(kiln_literal_get_f64(l, 0) == 0.1);
  l = lit_of(&f, kiln__b_scalar(&f.b, KILN_F32, -INFINITY));
  ck_assert(isinf(kiln_literal_get_f64(l, 0)) && kiln_literal_get_f64(l, 0) < 0);
  l = lit_of(&f, kiln__b_scalar(&f.b, KILN_F64, -0.0));
  ck_assert(signbit(kiln_literal_get_f64(l, 0)));
  l = lit_of(&f, kiln__b_uscalar(&f.b, KILN_F64, UINT64_MAX));
  ck_assert(kiln_literal_get_f64(l, 0) == ldexp(1, 64));
  ck_assert_int_eq(f.tx.err, 0);
  teardown(&f);
}
END_TEST

/* Names: "<op>.<id>", with a suffix when a parsed name already holds it;
 * copies keep the source's name only when asked and free. */
START_TEST(test_names_unique) {
  /* Three instructions: the next id is 3, and "constant.3" is taken. */
  kiln_module *m = parse("HloModule m\n"
                         "ENTRY main {\n"
                         "  p = f32[2] parameter(0)\n"
                         "  constant.3 = f32[] constant(1)\n"
                         "  ROOT add.4 = f32[2] add(p, p)\n"
                         "}\n");
  kiln__tx tx;
  ck_assert_int_eq(kiln__tx_init(&tx, m, "test", NULL), 0);
  kiln__b b = {&tx, m->entry};
  ck_assert_uint_eq(m->ninstrs, 3);
  kiln_id c = kiln__b_scalar(&b, KILN_F32, 2);
  ck_assert_str_eq(m->instrs[c]->name, "constant.3.1");
  kiln_id p = find(m, "p")->id;
  kiln_id a = kiln__b_bin(&b, KILN_OP_ADD, p, p); /* id 4: "add.4" is taken */
  ck_assert_str_eq(m->instrs[a]->name, "add.4.1");
  kiln_id n = kiln__b_neg(&b, a);
  ck_assert_str_eq(m->instrs[n]->name, "negate.5");
  /* A copy into another computation keeps the name there ... */
  uint32_t other;
  ck_assert_int_eq(kiln__b_new_comp(&tx, "other", &other), 0);
  kiln__b ob = {&tx, other};
  kiln_shape s;
  ck_assert_int_eq(kiln_shape_make_array(m->arena, &s, KILN_F32, (int64_t[]){2}, 1), 0);
  kiln_id q = kiln__b_param(&ob, 0, &s, NULL);
  kiln_id k = kiln__b_clone_keep_name(&ob, m->instrs[n], &q, 1);
  ck_assert_str_eq(m->instrs[k]->name, "negate.5");
  /* ... but not a second time, nor where it is taken. */
  kiln_id k2 = kiln__b_clone_keep_name(&ob, m->instrs[n], &k, 1);
  ck_assert_str_ne(m->instrs[k2]->name, "negate.5");
  kiln_id k3 = kiln__b_clone_keep_name(&b, m->instrs[n], &a, 1);
  char want[32];
  snprintf(want, sizeof want, "negate.%u", (unsigned)k3);
  ck_assert_str_eq(m->instrs[k3]->name, want);
  kiln_id pc = kiln__b_clone_keep_name(&b, find(m, "p"), NULL, 0); /* "p" taken: opcode name */
  snprintf(want, sizeof want, "parameter.%u", (unsigned)pc);
  ck_assert_str_eq(m->instrs[pc]->name, want);
  /* The ordinary copy is renamed: the source's base and its own id. */
  kiln_id k4 = kiln__b_clone_same(&ob, m->instrs[n], &k, 1);
  snprintf(want, sizeof want, "negate.%u", (unsigned)k4);
  ck_assert_str_eq(m->instrs[k4]->name, want);
  ck_assert_int_eq(tx.err, 0);
  /* No two instructions of a computation share a name. */
  for (uint32_t ci = 0; ci < m->ncomps; ci++) {
    const kiln_computation *comp = m->comps[ci];
    for (uint32_t i = 0; i < comp->ninstrs; i++)
      for (uint32_t j = i + 1; j < comp->ninstrs; j++)
        ck_assert_str_ne(m->instrs[comp->instrs[i]]->name, m->instrs[comp->instrs[j]]->name);
  }
  kiln__tx_fini(&tx);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_make_and_splat_keep_layout) {
  kiln_module *m = parse("HloModule m\n"
                         "ENTRY main { ROOT p = f32[2,3]{0,1} parameter(0) }\n");
  kiln__tx tx;
  ck_assert_int_eq(kiln__tx_init(&tx, m, "test", NULL), 0);
  kiln__b b = {&tx, m->entry};
  const kiln_shape *ps = &find(m, "p")->shape;
  kiln_id c = kiln__b_scalar(&b, KILN_F32, 1);
  ck_assert_uint_eq(kiln__b_splat(&b, c, &m->instrs[c]->shape), c); /* scalar: itself */
  kiln_id sp = kiln__b_splat(&b, c, ps);
  ck_assert_uint_ne(sp, KILN_NO_ID);
  const kiln_instr *bc = m->instrs[sp];
  ck_assert_int_eq(bc->op, KILN_OP_BROADCAST);
  ck_assert(kiln_shape_equal(&bc->shape, ps, true));
  const kiln_i64s *dims = kiln_instr_attr_ints(bc, KILN_ATTR_DIMENSIONS);
  ck_assert_ptr_nonnull(dims);
  ck_assert_uint_eq(dims->n, 0);
  kiln_id p = find(m, "p")->id;
  kiln_shape t;
  ck_assert_int_eq(kiln_shape_make_tuple(m->arena, &t, ps, 1), 0);
  kiln_instr *tu = kiln__b_make(&b, KILN_OP_TUPLE, &t, &p, 1);
  ck_assert_ptr_nonnull(tu);
  ck_assert(kiln_shape_equal(&tu->shape, &t, true));
  kiln__tx_fini(&tx);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_errors_sticky) {
  fixture f;
  setup(&f);
  kiln_shape tup;
  ck_assert_int_eq(kiln_shape_make_tuple(f.m->arena, &tup, NULL, 0), 0);
  ck_assert_uint_eq(kiln__b_scalar(&f.b, KILN_TUPLE, 1), KILN_NO_ID);
  ck_assert_int_eq(f.tx.err, KILN_EINTERNAL);
  ck_assert_int_eq(f.st.code, KILN_EINTERNAL);
  ck_assert_ptr_nonnull(strstr(f.st.msg, "test: internal error"));
  uint32_t n0 = f.m->ninstrs;
  ck_assert_uint_eq(kiln__b_scalar(&f.b, KILN_F32, 1), KILN_NO_ID);
  ck_assert_ptr_null(kiln__b_make(&f.b, KILN_OP_TUPLE, &tup, NULL, 0));
  ck_assert_uint_eq(f.m->ninstrs, n0);
  teardown(&f);
}
END_TEST

START_TEST(test_purity) {
  kiln_module *m = parse("HloModule m\n"
                         "add { x = f32[] parameter(0)  y = f32[] parameter(1)"
                         "  ROOT s = f32[] add(x, y) }\n"
                         "noisy { x = f32[] parameter(0)  y = f32[] parameter(1)"
                         "  r = f32[] rng(x, y), distribution=rng_uniform"
                         "  ROOT s = f32[] add(r, y) }\n"
                         "ENTRY main {\n"
                         "  p = f32[4] parameter(0)\n"
                         "  z = f32[] constant(0)\n"
                         "  n = f32[4] negate(p)\n"
                         "  r1 = f32[] reduce(n, z), dimensions={0}, to_apply=add\n"
                         "  r2 = f32[] reduce(n, z), dimensions={0}, to_apply=noisy\n"
                         "  t = token[] after-all()\n"
                         "  o = token[] outfeed(n, t)\n"
                         "  ROOT q = (f32[], f32[]) tuple(r1, r2)\n"
                         "}\n");
  bool *impure = kiln__impure_computations(m);
  ck_assert_ptr_nonnull(impure);
  ck_assert(!impure[kiln_module_find_computation(m, "add")->id]);
  ck_assert(impure[kiln_module_find_computation(m, "noisy")->id]);
  ck_assert(impure[m->entry]);
  ck_assert(kiln__instr_is_pure(m, find(m, "n"), impure));
  ck_assert(kiln__instr_is_pure(m, find(m, "z"), impure));
  ck_assert(kiln__instr_is_pure(m, find(m, "r1"), impure));
  ck_assert(!kiln__instr_is_pure(m, find(m, "r2"), impure));
  ck_assert(kiln__instr_is_pure(m, find(m, "r2"), NULL)); /* not asked about callees */
  ck_assert(!kiln__instr_is_pure(m, find(m, "t"), impure));
  ck_assert(!kiln__instr_is_pure(m, find(m, "o"), impure));
  kiln_free(impure);
  kiln_module_destroy(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("build");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_scalar_complex);
  tcase_add_test(tc, test_scalar_u64_above_2_63);
  tcase_add_test(tc, test_scalar_s64_extremes);
  tcase_add_test(tc, test_scalar_f16_bf16_nearest_even);
  tcase_add_test(tc, test_scalar_pred);
  tcase_add_test(tc, test_scalar_other_floats);
  tcase_add_test(tc, test_names_unique);
  tcase_add_test(tc, test_make_and_splat_keep_layout);
  tcase_add_test(tc, test_errors_sticky);
  tcase_add_test(tc, test_purity);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
