/* Unit tests for the cache key (cache/key.c).
 *
 * Modules are parsed from text and verified, then keyed. Variants that
 * differ only in what must not matter (names, metadata, whitespace and
 * comments, the order of independent instructions, the module name) must
 * share the key; variants that differ in what the program computes or how
 * it is called must not, and the components that differ must be exactly the
 * expected ones. The canonical text of one module is checked line by line,
 * one key is pinned, and every module of the conformance corpus gets a key
 * of its own that survives print -> parse.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/entry.h"
#include "cache/key.h"
#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/codegen/executable.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "tests/support/golden.h"

/* ---- helpers ------------------------------------------------------------ */

static kiln_module *parse_ok(const char *text) {
  kiln_module *m = NULL;
  kiln_status st = {0};
  int rc = kiln_module_parse_text(text, strlen(text), "test.hlo", NULL, &m, &st);
  ck_assert_msg(rc == 0, "parse: %s: %s", st.where, st.msg);
  rc = kiln_module_verify(m, NULL, &st);
  ck_assert_msg(rc == 0, "verify: %s: %s", st.where, st.msg);
  return m;
}

static const kiln_cache_key_inputs cpu_inputs = {"cpu", "x86-64-v3", "opt=2\n"};

static kiln_cache_key key_with(const char *text, const kiln_cache_key_inputs *in) {
  kiln_module *m = parse_ok(text);
  kiln_cache_key k;
  kiln_status st = {0};
  int rc = kiln_cache_key_compute(m, in, &k, &st);
  ck_assert_msg(rc == 0, "key: %s: %s", st.where, st.msg);
  kiln_module_destroy(m);
  return k;
}

static kiln_cache_key key_of(const char *text) { return key_with(text, &cpu_inputs); }

/* Bit i set when component i differs. */
static unsigned diff_mask(const kiln_cache_key *a, const kiln_cache_key *b) {
  unsigned mask = 0;
  for (int i = 0; i < KILN_CACHE_NPARTS; i++)
    if (memcmp(a->parts[i], b->parts[i], KILN_CACHE_DIGEST_LEN) != 0) mask |= 1u << i;
  return mask;
}

#define M (1u << KILN_CACHE_PART_MODULE)
#define SIG (1u << KILN_CACHE_PART_SIGNATURE)
#define OPT (1u << KILN_CACHE_PART_OPTIONS)
#define TGT (1u << KILN_CACHE_PART_TARGET)

/* The keys differ exactly in `mask`; kiln_cache_key_diff names the first. */
static void expect_diff(const kiln_cache_key *a, const kiln_cache_key *b, unsigned mask,
                        const char *what) {
  unsigned got = diff_mask(a, b);
  ck_assert_msg(got == mask, "%s: components differing 0x%x, expected 0x%x", what, got, mask);
  int first = __builtin_ctz(mask);
  ck_assert_int_eq(kiln_cache_key_diff(a, b), first);
  ck_assert_str_eq(kiln_cache_part_name(kiln_cache_key_diff(a, b)), kiln_cache_part_name(first));
  ck_assert_str_ne(a->hex, b->hex);
}

static void expect_same(const kiln_cache_key *a, const kiln_cache_key *b, const char *what) {
  ck_assert_msg(diff_mask(a, b) == 0, "%s: components differing 0x%x", what, diff_mask(a, b));
  ck_assert_int_eq(kiln_cache_key_diff(a, b), KILN_CACHE_NPARTS);
  ck_assert_str_eq(a->hex, b->hex);
}

/* text with every occurrence of `from` replaced by `to` (at least one). */
static char *subst(const char *text, const char *from, const char *to) {
  kiln_sbuf b = KILN_SBUF_INIT;
  size_t nf = strlen(from);
  int n = 0;
  for (const char *p = text;;) {
    const char *q = strstr(p, from);
    if (q == NULL) {
      kiln_sbuf_puts(&b, p);
      break;
    }
    kiln_sbuf_putn(&b, p, (size_t)(q - p));
    kiln_sbuf_puts(&b, to);
    p = q + nf;
    n++;
  }
  ck_assert_msg(n > 0, "'%s' not found in the module", from);
  ck_assert(!kiln_sbuf_failed(&b));
  return kiln_sbuf_detach(&b, NULL);
}

static kiln_cache_key key_subst(const char *text, const char *from, const char *to) {
  char *t = subst(text, from, to);
  kiln_cache_key k = key_of(t);
  kiln_free(t);
  return k;
}

static char *canonical_text(const char *text) {
  kiln_module *m = parse_ok(text);
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_canonical_module(m, &b, &st), 0);
  kiln_module_destroy(m);
  return kiln_sbuf_detach(&b, NULL);
}

/* ---- the modules -------------------------------------------------------- */

static const char base[] =
    "HloModule base, entry_computation_layout={(f32[3,3]{1,0}, f32[3,3]{1,0})->(f32[3]{0}, "
    "pred[3,3]{1,0})}\n"
    "\n"
    "%sum (x: f32[], y: f32[]) -> f32[] {\n"
    "  %x = f32[] parameter(0)\n"
    "  %y = f32[] parameter(1)\n"
    "  ROOT %s = f32[] add(%x, %y)\n"
    "}\n"
    "\n"
    "ENTRY %main (p0: f32[3,3], p1: f32[3,3]) -> (f32[3], pred[3,3]) {\n"
    "  %p0 = f32[3,3]{1,0} parameter(0), sharding={replicated}\n"
    "  %p1 = f32[3,3]{1,0} parameter(1)\n"
    "  %neg = f32[3,3]{1,0} negate(%p0), metadata={op_name=\"jit(f)/neg\" "
    "source_file=\"f.py\" source_line=3}\n"
    "  %ex = f32[3,3]{1,0} exponential(%p1)\n"
    "  %diff = f32[3,3]{1,0} subtract(%neg, %ex), sharding={replicated "
    "metadata={op_name=\"x\"}}\n"
    "  %zero = f32[] constant(0)\n"
    "  %red = f32[3]{0} reduce(%diff, %zero), dimensions={0}, to_apply=%sum\n"
    "  %cmp = pred[3,3]{1,0} compare(%neg, %ex), direction=LT\n"
    "  ROOT %out = (f32[3]{0}, pred[3,3]{1,0}) tuple(%red, %cmp)\n"
    "}\n";

/* What the module component of `base` hashes. */
static const char base_canonical[] =
    "HloModule m\n"
    "\n"
    "%c0 (v0: f32[], v1: f32[]) -> f32[] {\n"
    "  %v0 = f32[] parameter(0)\n"
    "  %v1 = f32[] parameter(1)\n"
    "  ROOT %v2 = f32[] add(%v0, %v1)\n"
    "}\n"
    "\n"
    "ENTRY %c1 (v0: f32[3,3], v2: f32[3,3]) -> (f32[3], pred[3,3]) {\n"
    "  %v0 = f32[3,3] parameter(0), sharding={replicated}\n"
    "  %v1 = f32[3,3] negate(%v0)\n"
    "  %v2 = f32[3,3] parameter(1)\n"
    "  %v3 = f32[3,3] exponential(%v2)\n"
    "  %v4 = f32[3,3] subtract(%v1, %v3), sharding={replicated}\n"
    "  %v5 = f32[] constant(0)\n"
    "  %v6 = f32[3] reduce(%v4, %v5), dimensions={0}, to_apply=%c0\n"
    "  %v7 = pred[3,3] compare(%v1, %v3), direction=LT\n"
    "  ROOT %v8 = (f32[3], pred[3,3]) tuple(%v6, %v7)\n"
    "}\n";

/* A small one-computation module. */
static const char simple[] = "HloModule simple\n"
                             "\n"
                             "ENTRY %e (a: f32[2,3]) -> f32[2,3] {\n"
                             "  %a = f32[2,3]{1,0} parameter(0)\n"
                             "  ROOT %n = f32[2,3]{1,0} negate(%a)\n"
                             "}\n";

/* ---- canonical text ----------------------------------------------------- */

START_TEST(test_canonical_text) {
  char *got = canonical_text(base);
  char *diff = kiln_golden_diff(base_canonical, got);
  ck_assert_msg(diff == NULL, "%s", diff ? diff : "");
  kiln_free(got);
}
END_TEST

/* The canonical text is itself a module with the same key. */
START_TEST(test_canonical_text_reparses) {
  char *canon = canonical_text(base);
  kiln_cache_key a = key_of(base), b = key_of(canon);
  expect_same(&a, &b, "canonical text re-parsed");
  char *again = canonical_text(canon);
  ck_assert_str_eq(canon, again);
  kiln_free(again);
  kiln_free(canon);
}
END_TEST

/* ---- what must not change the key --------------------------------------- */

START_TEST(test_same_renamed_instructions) {
  kiln_cache_key a = key_of(base);
  char *t1 = subst(base, "%neg", "%negate.17");
  char *t2 = subst(t1, "p0", "arg_0.1");
  char *t3 = subst(t2, "%x", "%lhs");
  kiln_cache_key b = key_of(t3);
  expect_same(&a, &b, "renamed instructions");
  kiln_free(t1);
  kiln_free(t2);
  kiln_free(t3);
}
END_TEST

START_TEST(test_same_renamed_computations) {
  kiln_cache_key a = key_of(base);
  char *t1 = subst(base, "%sum", "%region_0.4");
  char *t2 = subst(t1, "%main", "%main.12");
  kiln_cache_key b = key_of(t2);
  expect_same(&a, &b, "renamed computations");
  kiln_free(t1);
  kiln_free(t2);
}
END_TEST

START_TEST(test_same_reordered_independent) {
  kiln_cache_key a = key_of(base);
  /* exponential before negate, the constant first, compare before reduce */
  static const char reordered[] =
      "HloModule base, entry_computation_layout={(f32[3,3]{1,0}, f32[3,3]{1,0})->(f32[3]{0}, "
      "pred[3,3]{1,0})}\n"
      "%sum (x: f32[], y: f32[]) -> f32[] {\n"
      "  %y = f32[] parameter(1)\n"
      "  %x = f32[] parameter(0)\n"
      "  ROOT %s = f32[] add(%x, %y)\n"
      "}\n"
      "ENTRY %main (p0: f32[3,3], p1: f32[3,3]) -> (f32[3], pred[3,3]) {\n"
      "  %zero = f32[] constant(0)\n"
      "  %p1 = f32[3,3]{1,0} parameter(1)\n"
      "  %ex = f32[3,3]{1,0} exponential(%p1)\n"
      "  %p0 = f32[3,3]{1,0} parameter(0), sharding={replicated}\n"
      "  %neg = f32[3,3]{1,0} negate(%p0), metadata={op_name=\"jit(f)/neg\" "
      "source_file=\"f.py\" source_line=3}\n"
      "  %cmp = pred[3,3]{1,0} compare(%neg, %ex), direction=LT\n"
      "  %diff = f32[3,3]{1,0} subtract(%neg, %ex), sharding={replicated "
      "metadata={op_name=\"x\"}}\n"
      "  %red = f32[3]{0} reduce(%diff, %zero), dimensions={0}, to_apply=%sum\n"
      "  ROOT %out = (f32[3]{0}, pred[3,3]{1,0}) tuple(%red, %cmp)\n"
      "}\n";
  kiln_cache_key b = key_of(reordered);
  expect_same(&a, &b, "reordered instructions");
}
END_TEST

/* Computations listed in another order are the same module. */
START_TEST(test_same_reordered_computations) {
  static const char two[] = "HloModule two\n"
                            "%mx (a: f32[], b: f32[]) -> f32[] {\n"
                            "  %a = f32[] parameter(0)\n"
                            "  %b = f32[] parameter(1)\n"
                            "  ROOT %m = f32[] maximum(%a, %b)\n"
                            "}\n"
                            "%ad (a: f32[], b: f32[]) -> f32[] {\n"
                            "  %a = f32[] parameter(0)\n"
                            "  %b = f32[] parameter(1)\n"
                            "  ROOT %s = f32[] add(%a, %b)\n"
                            "}\n"
                            "ENTRY %e (p: f32[4]) -> (f32[], f32[]) {\n"
                            "  %p = f32[4]{0} parameter(0)\n"
                            "  %z = f32[] constant(0)\n"
                            "  %r1 = f32[] reduce(%p, %z), dimensions={0}, to_apply=%ad\n"
                            "  %r2 = f32[] reduce(%p, %z), dimensions={0}, to_apply=%mx\n"
                            "  ROOT %t = (f32[], f32[]) tuple(%r1, %r2)\n"
                            "}\n";
  /* the same computations listed the other way round, named otherwise */
  static const char other[] = "HloModule two\n"
                              "%f1 (a: f32[], b: f32[]) -> f32[] {\n"
                              "  %a = f32[] parameter(0)\n"
                              "  %b = f32[] parameter(1)\n"
                              "  ROOT %s = f32[] add(%a, %b)\n"
                              "}\n"
                              "%f2 (a: f32[], b: f32[]) -> f32[] {\n"
                              "  %a = f32[] parameter(0)\n"
                              "  %b = f32[] parameter(1)\n"
                              "  ROOT %m = f32[] maximum(%a, %b)\n"
                              "}\n"
                              "ENTRY %e (p: f32[4]) -> (f32[], f32[]) {\n"
                              "  %p = f32[4]{0} parameter(0)\n"
                              "  %z = f32[] constant(0)\n"
                              "  %r1 = f32[] reduce(%p, %z), dimensions={0}, to_apply=%f1\n"
                              "  %r2 = f32[] reduce(%p, %z), dimensions={0}, to_apply=%f2\n"
                              "  ROOT %t = (f32[], f32[]) tuple(%r1, %r2)\n"
                              "}\n";
  kiln_cache_key a = key_of(two), b = key_of(other);
  expect_same(&a, &b, "computations in another order");
  char *s1 = subst(two, "to_apply=%ad", "to_apply=%zz");
  char *s2 = subst(s1, "to_apply=%mx", "to_apply=%ad");
  char *s3 = subst(s2, "to_apply=%zz", "to_apply=%mx");
  kiln_cache_key c = key_of(s3);
  expect_diff(&a, &c, M, "reduces swapped");
  kiln_free(s1);
  kiln_free(s2);
  kiln_free(s3);
}
END_TEST

START_TEST(test_same_metadata) {
  kiln_cache_key a = key_of(base);
  kiln_cache_key b = key_subst(base, "op_name=\"jit(f)/neg\"", "op_name=\"jit(g)/negate\"");
  expect_same(&a, &b, "changed metadata");
  b = key_subst(base, ", metadata={op_name=\"jit(f)/neg\" source_file=\"f.py\" source_line=3}", "");
  expect_same(&a, &b, "removed metadata");
  b = key_subst(base, "exponential(%p1)", "exponential(%p1), metadata={op_name=\"e\"}");
  expect_same(&a, &b, "added metadata");
  b = key_subst(base, "{replicated metadata={op_name=\"x\"}}", "{replicated}");
  expect_same(&a, &b, "metadata removed from a sharding");
  b = key_subst(base, "{op_name=\"x\"}", "{op_name=\"y\" source_line=9}");
  expect_same(&a, &b, "metadata changed in a sharding");
  b = key_subst(base, "direction=LT", "direction=LT, statistics={visualizing_index=1}");
  expect_same(&a, &b, "statistics");
}
END_TEST

START_TEST(test_same_whitespace_comments) {
  kiln_cache_key a = key_of(base);
  char *t1 = subst(base, "\n  %", "\n\n  /* a comment */   %");
  char *t2 = subst(t1, ", ", " ,\t");
  char *t3 = subst(t2, "}\n", "} // trailing\n");
  kiln_cache_key b = key_of(t3);
  expect_same(&a, &b, "whitespace and comments");
  kiln_free(t1);
  kiln_free(t2);
  kiln_free(t3);
}
END_TEST

/* A default layout written out or left to the default: one program. */
START_TEST(test_same_default_layouts) {
  kiln_cache_key a = key_of(base);
  char *t1 = subst(base, "{1,0}", "");
  char *t2 = subst(t1, "f32[3]{0}", "f32[3]");
  char *t3 = subst(t2,
                   "HloModule base, entry_computation_layout={(f32[3,3], f32[3,3])->(f32[3], "
                   "pred[3,3])}",
                   "HloModule base");
  kiln_cache_key b = key_of(t2), c = key_of(t3);
  expect_same(&a, &b, "default layouts left out");
  expect_same(&a, &c, "an entry layout of defaults left out");
  kiln_free(t1);
  kiln_free(t2);
  kiln_free(t3);
}
END_TEST

START_TEST(test_same_module_name) {
  kiln_cache_key a = key_of(base);
  kiln_cache_key b = key_subst(base, "HloModule base", "HloModule jit_other_name.7");
  expect_same(&a, &b, "module name");
}
END_TEST

/* NULL options and "" are the same text; a NULL target is "". */
START_TEST(test_same_null_inputs) {
  kiln_cache_key_inputs n = {"interp", NULL, NULL}, e = {"interp", "", ""};
  kiln_cache_key a = key_with(simple, &n), b = key_with(simple, &e);
  expect_same(&a, &b, "NULL and empty inputs");
}
END_TEST

/* ---- what must change it ------------------------------------------------ */

START_TEST(test_diff_dtype) {
  kiln_cache_key a = key_of(simple), b = key_subst(simple, "f32", "f64");
  expect_diff(&a, &b, M | SIG, "parameter and result dtype");
  char *t = subst(base, "%zero = f32[] constant(0)",
                  "%z = f64[] constant(0)\n  %zero = f32[] convert(%z)");
  a = key_of(t);
  b = key_subst(t, "f64[]", "f16[]");
  expect_diff(&a, &b, M, "an inner instruction");
  kiln_free(t);
}
END_TEST

START_TEST(test_diff_dim) {
  kiln_cache_key a = key_of(simple), b = key_subst(simple, "[2,3]", "[2,4]");
  expect_diff(&a, &b, M | SIG, "a dim");
  b = key_subst(simple, "[2,3]", "[2,<=3]");
  expect_diff(&a, &b, M | SIG, "a dynamic dim");
}
END_TEST

START_TEST(test_diff_layout) {
  kiln_cache_key a = key_of(simple);
  kiln_cache_key b = key_subst(simple, "%a = f32[2,3]{1,0}", "%a = f32[2,3]{0,1}");
  expect_diff(&a, &b, M | SIG, "a parameter layout");
  a = key_of(base);
  b = key_subst(base, "%ex = f32[3,3]{1,0}", "%ex = f32[3,3]{0,1}");
  expect_diff(&a, &b, M, "an inner layout");
  b = key_subst(base, "->(f32[3]{0},", "->(f32[3]{0:T(128)},");
  expect_diff(&a, &b, M | SIG, "the entry layout");
}
END_TEST

START_TEST(test_diff_sharding) {
  kiln_cache_key a = key_of(base);
  kiln_cache_key b = key_subst(base, "parameter(0), sharding={replicated}",
                               "parameter(0), sharding={devices=[1,2]0,1}");
  expect_diff(&a, &b, M | SIG, "a parameter sharding");
  kiln_cache_key c = key_subst(base, "parameter(0), sharding={replicated}",
                               "parameter(0), sharding={devices=[1,2]1,0}");
  expect_diff(&b, &c, M | SIG, "a tile assignment");
  b = key_subst(base, "{replicated metadata", "{maximal device=1 metadata");
  expect_diff(&a, &b, M, "an inner sharding");
  b = key_subst(base, "tuple(%red, %cmp)",
                "tuple(%red, %cmp), sharding={{replicated}, {maximal device=0}}");
  expect_diff(&a, &b, M | SIG, "the result sharding");
}
END_TEST

/* Two spellings of one device assignment are one key; a different
 * assignment, replication or subgroup kind is another. */
START_TEST(test_sharding_spellings) {
  static const char *const P0 = "parameter(0), sharding={replicated}";
  struct {
    const char *x, *y;
    bool same;
  } cases[] = {
      {"{devices=[2,4]<=[8]}", "{devices=[2,4]0,1,2,3,4,5,6,7}", true},
      {"{devices=[4,2]<=[2,4]T(1,0)}", "{devices=[4,2]0,4,1,5,2,6,3,7}", true},
      {"{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
       "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dims={replicated}}", true},
      {"{devices=[1,1,4]<=[4] last_tile_dim_replicate}", "{replicated}", true},
      {"{devices=[4,2]<=[2,4]T(1,0)}", "{devices=[4,2]<=[8]}", false},
      {"{devices=[2,1,2]<=[4] last_tile_dims={manual}}",
       "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", false},
      {"{devices=[2,2]<=[4]}", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char x[128], y[128];
    snprintf(x, sizeof x, "parameter(0), sharding=%s", cases[i].x);
    snprintf(y, sizeof y, "parameter(0), sharding=%s", cases[i].y);
    kiln_cache_key a = key_subst(base, P0, x), b = key_subst(base, P0, y);
    if (cases[i].same)
      expect_same(&a, &b, cases[i].x);
    else
      expect_diff(&a, &b, M | SIG, cases[i].x);
  }
}
END_TEST

/* compile().as_text()'s debug sections only resolve metadata: no key change. */
START_TEST(test_debug_sections_ignored) {
  kiln_cache_key a = key_of(base);
  char *t = subst(base, "\n%sum",
                  "\nFileNames\n1 \"f.py\"\n\nStackFrames\n1 {file_location_id=1 "
                  "parent_frame_id=1}\n\n%sum");
  kiln_cache_key b = key_of(t);
  kiln_free(t);
  expect_same(&a, &b, "debug sections");
}
END_TEST

START_TEST(test_diff_constant) {
  kiln_cache_key a = key_of(base), b = key_subst(base, "constant(0)", "constant(1)");
  expect_diff(&a, &b, M, "a constant");
  b = key_subst(base, "constant(0)", "constant(-0)");
  expect_diff(&a, &b, M, "zero and negative zero");
}
END_TEST

START_TEST(test_diff_attribute) {
  kiln_cache_key a = key_of(base), b = key_subst(base, "dimensions={0}", "dimensions={1}");
  expect_diff(&a, &b, M, "reduce dimensions");
  b = key_subst(base, "direction=LT", "direction=GT");
  expect_diff(&a, &b, M, "comparison direction");
  b = key_subst(base, "direction=LT", "direction=LT, frontend_attributes={_xla_x=\"1\"}");
  expect_diff(&a, &b, M, "frontend attributes");
  b = key_subst(base, "exponential(%p1)", "exponential(%p1), backend_config={\"a\":1}");
  expect_diff(&a, &b, M, "backend config");
}
END_TEST

START_TEST(test_diff_operands) {
  kiln_cache_key a = key_of(base),
                 b = key_subst(base, "subtract(%neg, %ex)", "subtract(%ex, %neg)");
  expect_diff(&a, &b, M, "swapped subtract operands");
  b = key_subst(base, "tuple(%red, %cmp)", "tuple(%red, %cmp), control-predecessors={%ex}");
  expect_diff(&a, &b, M, "a control edge");
}
END_TEST

START_TEST(test_diff_header) {
  kiln_cache_key a = key_of(simple);
  kiln_cache_key b = key_subst(simple, "HloModule simple",
                               "HloModule simple, input_output_alias={ {}: (0, {}, may-alias) }");
  expect_diff(&a, &b, M | SIG, "an alias");
  kiln_cache_key c = key_subst(simple, "HloModule simple",
                               "HloModule simple, input_output_alias={ {}: (0, {}, must-alias) }");
  expect_diff(&b, &c, M | SIG, "may and must alias");
  b = key_subst(simple, "HloModule simple", "HloModule simple, replica_count=2");
  expect_diff(&a, &b, M, "replica count");
  b = key_subst(simple, "HloModule simple", "HloModule simple, num_partitions=2");
  expect_diff(&a, &b, M, "partition count");
}
END_TEST

/* Nothing but annotations is dropped: an unused instruction is part of the
 * module as written. */
START_TEST(test_diff_dead_instruction) {
  kiln_cache_key a = key_of(simple);
  kiln_cache_key b = key_subst(simple, "  ROOT", "  %dead = f32[2,3]{1,0} abs(%a)\n  ROOT");
  expect_diff(&a, &b, M, "an unused instruction");
}
END_TEST

START_TEST(test_diff_options_target) {
  kiln_cache_key a = key_of(base);
  kiln_cache_key_inputs in = cpu_inputs;
  in.options = "opt=3\n";
  kiln_cache_key b = key_with(base, &in);
  expect_diff(&a, &b, OPT, "options");
  in = cpu_inputs;
  in.options = NULL;
  b = key_with(base, &in);
  expect_diff(&a, &b, OPT, "no options");
  in = cpu_inputs;
  in.target = "x86-64-v4";
  b = key_with(base, &in);
  expect_diff(&a, &b, TGT, "target");
  in = cpu_inputs;
  in.backend = "interp";
  in.target = NULL;
  b = key_with(base, &in);
  expect_diff(&a, &b, TGT, "backend");
}
END_TEST

/* ---- components, errors, scale ------------------------------------------ */

static void expect_part(const kiln_cache_key *k, int part, const char *text) {
  uint8_t want[KILN_CACHE_DIGEST_LEN];
  kiln_cache_sha256(text, strlen(text), want);
  ck_assert_msg(memcmp(k->parts[part], want, sizeof want) == 0, "%s is not the hash of '%s'",
                kiln_cache_part_name(part), text);
}

START_TEST(test_component_texts) {
  kiln_cache_key k = key_of(simple);
  expect_part(&k, KILN_CACHE_PART_OPTIONS, "opt=2\n");
  expect_part(&k, KILN_CACHE_PART_TARGET, "cpu/x86-64-v3");
  char version[256];
  snprintf(version, sizeof version,
           "compiler=%s\nexe_format=%u\ncache_entry=%u\ncanonical_form=3\n", KILN_COMPILER_VERSION,
           (unsigned)KILN_EXE_FORMAT_VERSION, (unsigned)KILN_CACHE_ENTRY_VERSION);
  expect_part(&k, KILN_CACHE_PART_VERSION, version);
  expect_part(&k, KILN_CACHE_PART_SIGNATURE,
              "params 1\nparam 0 f32[2,3] sharding=none\n"
              "result f32[2,3] sharding=none\n");
  char *canon = canonical_text(simple);
  expect_part(&k, KILN_CACHE_PART_MODULE, canon);
  kiln_free(canon);
  kiln_cache_key again = k;
  kiln_cache_key_from_parts(&again);
  ck_assert_str_eq(again.hex, k.hex);
}
END_TEST

/* A code compiler's identity (NVRTC's version and flags for cuda) joins
 * the ISA in the target text; none keeps the plain text. */
START_TEST(test_code_target_text) {
  char a[KILN_CACHE_TEXT_MAX], b[KILN_CACHE_TEXT_MAX], c[KILN_CACHE_TEXT_MAX];
  kiln_cache_code_target_text("sm_90", "nvrtc 13.0;--fmad=false", a);
  ck_assert_str_eq(a, "sm_90;nvrtc 13.0;--fmad=false");
  kiln_cache_code_target_text("sm_90", "nvrtc 12.8;--fmad=false", b);
  ck_assert_str_ne(a, b);
  kiln_cache_code_target_text("sm_90", NULL, c);
  ck_assert_str_eq(c, "sm_90");
  kiln_cache_code_target_text("x86-64-v3", "", c);
  ck_assert_str_eq(c, "x86-64-v3");
}
END_TEST

/* Pins the key of `simple` under cpu_inputs. It must change when the
 * canonical form, a component's text, a version or the way parts combine
 * changes on purpose: update it then (and bump CANONICAL_FORM_VERSION in
 * key.c when the canonical form changed), never otherwise. */
START_TEST(test_golden_key) {
  kiln_cache_key k = key_of(simple);
  /* Changed on purpose with executable format version 7 (the bounded-dynamic
   * signature). */
  ck_assert_str_eq(k.hex, "53c8dbdd5e7d7adb6e8171ec3dc069d4f0d02bdcb0084135ded73d1eef7ea8ce");
}
END_TEST

START_TEST(test_errors) {
  kiln_module *m = parse_ok(simple);
  kiln_cache_key k;
  kiln_status st = {0};
  kiln_cache_key_inputs nob = {NULL, NULL, NULL};
  ck_assert_int_eq(kiln_cache_key_compute(m, &nob, &k, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, "cache key");
  ck_assert_str_eq(st.msg, "no module, inputs, backend or output");
  ck_assert_int_eq(kiln_cache_key_compute(NULL, &cpu_inputs, &k, NULL), KILN_EINVAL);
  ck_assert_int_eq(kiln_cache_key_compute(m, NULL, &k, NULL), KILN_EINVAL);
  ck_assert_int_eq(kiln_cache_key_compute(m, &cpu_inputs, NULL, NULL), KILN_EINVAL);
  kiln_sbuf b = KILN_SBUF_INIT;
  ck_assert_int_eq(kiln_cache_canonical_module(NULL, &b, NULL), KILN_EINVAL);
  kiln_module_destroy(m);

  kiln_module *empty = kiln_module_create("empty");
  ck_assert_ptr_nonnull(empty);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_cache_canonical_module(empty, &b, &st), 0);
  ck_assert_str_eq(kiln_sbuf_str(&b), "HloModule m\n");
  ck_assert_int_eq(kiln_cache_key_compute(empty, &cpu_inputs, &k, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "the module has no ENTRY");
  for (size_t i = 0; i < sizeof k.digest; i++) ck_assert_int_eq(k.digest[i], 0);
  kiln_sbuf_free(&b);
  kiln_module_destroy(empty);
}
END_TEST

/* A module the builder got wrong (a cycle, an operand out of range, an
 * instruction listed twice) still gets a text, without hanging. */
START_TEST(test_broken_builder) {
  kiln_module *m = kiln_module_create("broken");
  uint32_t c = 0;
  ck_assert_int_eq(kiln_module_add_computation(m, "e", &c), 0);
  m->entry = c;
  m->comps[c]->is_entry = true;
  kiln_instr *x = kiln_module_add_instr(m, c, KILN_OP_NEGATE, "x");
  kiln_instr *y = kiln_module_add_instr(m, c, KILN_OP_NEGATE, "y");
  kiln_id xo[] = {y->id}, yo[] = {x->id, 999};
  ck_assert_int_eq(kiln_instr_set_operands(m, x, xo, 1), 0);
  ck_assert_int_eq(kiln_instr_set_operands(m, y, yo, 2), 0);
  ck_assert_int_eq(kiln_instr_set_control(m, x, xo, 1), 0);
  m->comps[c]->root = x->id;
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_canonical_module(m, &b, &st), 0);
  ck_assert_ptr_nonnull(strstr(kiln_sbuf_str(&b), "ROOT %v1 = negate(%v0)"));
  kiln_cache_key k;
  ck_assert_int_eq(kiln_cache_key_compute(m, &cpu_inputs, &k, &st), 0);
  kiln_sbuf_free(&b);
  kiln_module_destroy(m);
}
END_TEST

/* Every allocation failure is KILN_ENOMEM, never a crash or a wrong key. */
START_TEST(test_out_of_memory) {
  kiln_module *m = parse_ok(base);
  kiln_cache_key want, k;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_cache_key_compute(m, &cpu_inputs, &want, &st), 0);
  int failures = 0;
  for (long n = 1;; n++) {
    kiln_status_clear(&st);
    kiln_alloc_fail_after(n);
    int rc = kiln_cache_key_compute(m, &cpu_inputs, &k, &st);
    kiln_alloc_fail_after(0);
    if (rc == 0) {
      ck_assert_str_eq(k.hex, want.hex);
      break;
    }
    ck_assert_int_eq(rc, KILN_ENOMEM);
    ck_assert_int_eq(st.code, KILN_ENOMEM);
    ck_assert_str_eq(k.hex, "");
    failures++;
  }
  ck_assert_int_gt(failures, 3);
  kiln_module_destroy(m);
}
END_TEST

/* A chain far deeper than a recursive walk could take. */
START_TEST(test_deep_chain) {
  enum { N = 100000 };
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b,
                 "HloModule chain\nENTRY %e (p: f32[]) -> f32[] {\n  %p = f32[] parameter(0)\n");
  kiln_sbuf_puts(&b, "  %n0 = f32[] negate(%p)\n");
  for (int i = 1; i < N; i++) kiln_sbuf_printf(&b, "  %%n%d = f32[] negate(%%n%d)\n", i, i - 1);
  kiln_sbuf_printf(&b, "  ROOT %%r = f32[] add(%%n%d, %%p)\n}\n", N - 1);
  ck_assert(!kiln_sbuf_failed(&b));
  kiln_cache_key a = key_of(kiln_sbuf_str(&b));
  char *canon = canonical_text(kiln_sbuf_str(&b));
  kiln_cache_key c = key_of(canon);
  expect_same(&a, &c, "deep chain re-parsed");
  ck_assert_ptr_nonnull(strstr(canon, "  ROOT %v100001 = f32[] add(%v100000, %v0)\n"));
  kiln_free(canon);
  kiln_sbuf_free(&b);
}
END_TEST

/* ---- the conformance corpus --------------------------------------------- */

static char corpus_dir[1024];

static int corpus_files(char ***paths) {
  const char *env = getenv("KILN_CORPUS_DIR");
  snprintf(corpus_dir, sizeof corpus_dir, "%s",
           env && *env ? env : KILN_SOURCE_DIR "/../shared/corpus/xla-hlo");
  int n = kiln_golden_list(corpus_dir, paths);
  if (n <= 0) {
    fprintf(stderr, "test_cache_key: no corpus at %s: corpus keys skipped\n", corpus_dir);
    return 0;
  }
  return n;
}

static int by_hex(const void *a, const void *b) {
  return strcmp(((const kiln_cache_key *)a)->hex, ((const kiln_cache_key *)b)->hex);
}

/* Every corpus module: a key of its own, and the same key after
 * print -> parse. */
START_TEST(test_corpus) {
  char **paths = NULL;
  int n = corpus_files(&paths);
  kiln_cache_key *keys = kiln_calloc(n ? (size_t)n : 1, sizeof *keys);
  ck_assert_ptr_nonnull(keys);
  for (int i = 0; i < n; i++) {
    char *text = kiln_golden_read(paths[i], NULL);
    ck_assert_msg(text != NULL, "cannot read %s", paths[i]);
    kiln_module *m = parse_ok(text);
    kiln_status st = {0};
    ck_assert_msg(kiln_cache_key_compute(m, &cpu_inputs, &keys[i], &st) == 0, "%s: %s", paths[i],
                  st.msg);
    char *printed = kiln_module_print(m, NULL);
    ck_assert_ptr_nonnull(printed);
    kiln_cache_key again = key_of(printed);
    ck_assert_msg(strcmp(again.hex, keys[i].hex) == 0, "%s: key changed by print -> parse",
                  paths[i]);
    char *canon = canonical_text(text);
    kiln_cache_key from_canon = key_of(canon);
    ck_assert_msg(diff_mask(&from_canon, &keys[i]) == 0,
                  "%s: key changed by canonical text -> parse (0x%x)", paths[i],
                  diff_mask(&from_canon, &keys[i]));
    kiln_free(canon);
    kiln_free(printed);
    kiln_module_destroy(m);
    free(text);
  }
  qsort(keys, (size_t)n, sizeof *keys, by_hex);
  for (int i = 1; i < n; i++)
    ck_assert_msg(strcmp(keys[i - 1].hex, keys[i].hex) != 0, "two corpus modules share key %s",
                  keys[i].hex);
  kiln_free(keys);
  if (n) kiln_golden_free_list(paths, n);
}
END_TEST

static Suite *key_suite(void) {
  Suite *s = suite_create("cache_key");
  TCase *canon = tcase_create("canonical");
  tcase_set_timeout(canon, 60);
  tcase_add_test(canon, test_canonical_text);
  tcase_add_test(canon, test_canonical_text_reparses);
  tcase_add_test(canon, test_component_texts);
  tcase_add_test(canon, test_golden_key);
  tcase_add_test(canon, test_code_target_text);
  tcase_add_test(canon, test_sharding_spellings);
  tcase_add_test(canon, test_debug_sections_ignored);
  suite_add_tcase(s, canon);

  TCase *same = tcase_create("same");
  tcase_set_timeout(same, 60);
  tcase_add_test(same, test_same_renamed_instructions);
  tcase_add_test(same, test_same_renamed_computations);
  tcase_add_test(same, test_same_reordered_independent);
  tcase_add_test(same, test_same_reordered_computations);
  tcase_add_test(same, test_same_metadata);
  tcase_add_test(same, test_same_whitespace_comments);
  tcase_add_test(same, test_same_module_name);
  tcase_add_test(same, test_same_default_layouts);
  tcase_add_test(same, test_same_null_inputs);
  suite_add_tcase(s, same);

  TCase *diff = tcase_create("differs");
  tcase_set_timeout(diff, 60);
  tcase_add_test(diff, test_diff_dtype);
  tcase_add_test(diff, test_diff_dim);
  tcase_add_test(diff, test_diff_layout);
  tcase_add_test(diff, test_diff_sharding);
  tcase_add_test(diff, test_diff_constant);
  tcase_add_test(diff, test_diff_attribute);
  tcase_add_test(diff, test_diff_operands);
  tcase_add_test(diff, test_diff_header);
  tcase_add_test(diff, test_diff_dead_instruction);
  tcase_add_test(diff, test_diff_options_target);
  suite_add_tcase(s, diff);

  TCase *edge = tcase_create("edges");
  tcase_set_timeout(edge, 300);
  tcase_add_test(edge, test_errors);
  tcase_add_test(edge, test_broken_builder);
  tcase_add_test(edge, test_out_of_memory);
  tcase_add_test(edge, test_deep_chain);
  suite_add_tcase(s, edge);

  TCase *corp = tcase_create("corpus");
  tcase_set_timeout(corp, 300);
  tcase_add_test(corp, test_corpus);
  suite_add_tcase(s, corp);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(key_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
