/* Unit tests for the HLO text parser: every accepted form parsed and checked
 * field by field, malformed inputs with their exact error location and
 * message, hostile inputs (every prefix of a module, absurd sizes, deep
 * nesting), and the conformance corpus. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "common/strmap.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/text.h"

/* ---- helpers ------------------------------------------------------------- */

static kiln_module *parse_opts(const char *text, int no_infer) {
  kiln_parse_options o = {0};
  o.no_infer = no_infer;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  int rc = kiln_module_parse_text(text, strlen(text), "t.hlo", &o, &m, &st);
  ck_assert_msg(rc == 0, "parse failed: %s: %s", st.where, st.msg);
  ck_assert_ptr_nonnull(m);
  return m;
}

/* Most tests have every shape written: no inference needed. */
static kiln_module *parse(const char *text) { return parse_opts(text, 1); }

static void expect_error_code(const char *text, int code, const char *where, const char *msg) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = (kiln_module *)1;
  kiln_parse_options o = {0};
  o.no_infer = 1;
  int rc = kiln_module_parse_text(text, strlen(text), "t.hlo", &o, &m, &st);
  ck_assert_msg(rc != 0, "parse of an invalid module succeeded:\n%s", text);
  ck_assert_ptr_null(m);
  ck_assert_int_eq(rc, st.code);
  ck_assert_msg(rc == code, "code %s, expected %s (%s)", kiln_err_name(rc), kiln_err_name(code),
                st.msg);
  char got[2048], want[2048];
  snprintf(got, sizeof got, "%s: %s", st.where, st.msg);
  snprintf(want, sizeof want, "%s: %s", where, msg);
  ck_assert_str_eq(got, want);
}

static void expect_error(const char *text, const char *where, const char *msg) {
  expect_error_code(text, KILN_EPARSE, where, msg);
}

static char *shape_str(const kiln_shape *s) {
  static char buf[4][512];
  static int k;
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_shape_print(&b, s);
  char *out = buf[k++ % 4];
  snprintf(out, 512, "%s", kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return out;
}

static kiln_computation *comp(const kiln_module *m, const char *name) {
  kiln_computation *c = kiln_module_find_computation(m, name);
  ck_assert_msg(c != NULL, "no computation %s", name);
  return c;
}

static kiln_instr *instr(const kiln_module *m, const char *cname, const char *iname) {
  kiln_computation *c = comp(m, cname);
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_instr *ins = m->instrs[c->instrs[i]];
    if (strcmp(ins->name, iname) == 0) return ins;
  }
  ck_abort_msg("no instruction %s in %s", iname, cname);
  return NULL;
}

static const char *opnd(const kiln_module *m, const kiln_instr *ins, uint32_t i) {
  ck_assert_uint_lt(i, ins->noperands);
  return m->instrs[ins->operands[i]]->name;
}

/* The computation's instruction names in list order, space separated. */
static const char *order_str(const kiln_module *m, const kiln_computation *c) {
  static char buf[1024];
  buf[0] = '\0';
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    if (i) strcat(buf, " ");
    strcat(buf, m->instrs[c->instrs[i]]->name);
  }
  return buf;
}

static const kiln_attr *attr_named(const kiln_instr *ins, const char *name) {
  for (uint32_t i = 0; i < ins->nattrs; i++)
    if (ins->attrs[i].key == KILN_ATTR_UNKNOWN && strcmp(ins->attrs[i].name, name) == 0)
      return &ins->attrs[i];
  return NULL;
}

static void ck_ints(const kiln_i64s *v, const int64_t *want, uint32_t n) {
  ck_assert_ptr_nonnull(v);
  ck_assert_uint_eq(v->n, n);
  for (uint32_t i = 0; i < n; i++) ck_assert_int_eq(v->v[i], want[i]);
}
#define CK_INTS(v, ...) \
  do { \
    const int64_t want_[] = {__VA_ARGS__}; \
    ck_ints((v), want_, (uint32_t)(sizeof want_ / sizeof want_[0])); \
  } while (0)

/* ---- modules, computations, names ----------------------------------------- */

START_TEST(test_basic_module) {
  const char *t =
      "HloModule axpy_module, is_scheduled=true, entry_computation_layout={(f32[], "
      "f32[2,4]{1,0})->f32[2,4]{1,0}}, replica_count=2, num_partitions=4,\n"
      "  input_output_alias={ {0}: (1, {}, must-alias), {1, 2}: (0, {3}), {}: (2, {}, may-alias) "
      "},\n"
      "  allow_spmd_sharding_propagation_to_output={true}, frontend_attributes={a=\"b, c\"}\n"
      "\n"
      "%add.clone (x: f32[], y: f32[]) -> f32[] {\n"
      "  %x = f32[] parameter(0)\n"
      "  %y = f32[] parameter(1)\n"
      "  ROOT %sum-1.2 = f32[] add(f32[] %x, f32[] %y)\n"
      "}\n"
      "\n"
      "ENTRY %axpy.v5 (alpha: f32[], x: f32[2,4]) -> f32[2,4] {\n"
      "  %alpha = f32[] parameter(0)\n"
      "  %broadcast = f32[2,4]{1,0} broadcast(f32[] %alpha), dimensions={}\n"
      "  %x = f32[2,4]{1,0} parameter(1)\n"
      "  ROOT %multiply = f32[2,4]{1,0} multiply(f32[2,4]{1,0} %broadcast, %x)\n"
      "}\n";
  kiln_module *m = parse(t);
  ck_assert_str_eq(m->name, "axpy_module");
  ck_assert_int_eq(m->is_scheduled, 1);
  ck_assert_int_eq(m->replica_count, 2);
  ck_assert_int_eq(m->num_partitions, 4);
  ck_assert_ptr_nonnull(m->entry_layout);
  ck_assert_uint_eq(m->entry_layout->nparams, 2);
  ck_assert_str_eq(shape_str(&m->entry_layout->params[0]), "f32[]");
  ck_assert_str_eq(shape_str(&m->entry_layout->params[1]), "f32[2,4]{1,0}");
  ck_assert_str_eq(shape_str(&m->entry_layout->result), "f32[2,4]{1,0}");
  ck_assert(m->has_aliases);
  ck_assert_uint_eq(m->naliases, 3);
  CK_INTS(&m->aliases[0].output_index, 0);
  ck_assert_int_eq(m->aliases[0].param_number, 1);
  ck_assert_uint_eq(m->aliases[0].param_index.n, 0);
  ck_assert_int_eq(m->aliases[0].kind, KILN_ALIAS_MUST);
  CK_INTS(&m->aliases[1].output_index, 1, 2);
  CK_INTS(&m->aliases[1].param_index, 3);
  ck_assert_int_eq(m->aliases[1].kind, KILN_ALIAS_MAY);
  ck_assert_uint_eq(m->aliases[2].output_index.n, 0);
  ck_assert_int_eq(m->aliases[2].param_number, 2);
  ck_assert_int_eq(m->aliases[2].kind, KILN_ALIAS_MAY);
  ck_assert_uint_eq(m->nheader_extra, 2);
  ck_assert_str_eq(m->header_extra[0].name, "allow_spmd_sharding_propagation_to_output");
  ck_assert_str_eq(m->header_extra[0].text, "{true}");
  ck_assert_str_eq(m->header_extra[1].name, "frontend_attributes");
  ck_assert_str_eq(m->header_extra[1].text, "{a=\"b, c\"}");

  ck_assert_uint_eq(m->ncomps, 2);
  ck_assert_uint_eq(m->entry, 1);
  kiln_computation *add = comp(m, "add.clone");
  kiln_computation *e = kiln_module_entry(m);
  ck_assert_str_eq(e->name, "axpy.v5");
  ck_assert(e->is_entry);
  ck_assert(!add->is_entry);
  ck_assert_uint_eq(add->line, 5);
  ck_assert_uint_eq(add->col, 1);
  ck_assert_uint_eq(e->line, 11);
  ck_assert_uint_eq(e->col, 7);
  ck_assert_str_eq(order_str(m, add), "x y sum-1.2");
  ck_assert_str_eq(order_str(m, e), "alpha broadcast x multiply");
  kiln_instr *sum = instr(m, "add.clone", "sum-1.2");
  ck_assert_uint_eq(add->root, sum->id);
  ck_assert_int_eq(sum->op, KILN_OP_ADD);
  ck_assert_int_eq(sum->async_op, KILN_OP_INVALID);
  ck_assert_uint_eq(sum->noperands, 2);
  ck_assert_str_eq(opnd(m, sum, 0), "x");
  ck_assert_str_eq(opnd(m, sum, 1), "y");
  ck_assert_uint_eq(sum->comp, add->id);
  ck_assert_uint_eq(sum->line, 8);
  ck_assert_uint_eq(sum->col, 8);
  /* names are scoped per computation: the two x are different */
  kiln_instr *x1 = instr(m, "add.clone", "x"), *x2 = instr(m, "axpy.v5", "x");
  ck_assert_uint_ne(x1->id, x2->id);
  ck_assert_int_eq(x2->param_number, 1);
  ck_assert_str_eq(shape_str(&x2->shape), "f32[2,4]{1,0}");
  kiln_instr *mul = instr(m, "axpy.v5", "multiply");
  ck_assert_uint_eq(mul->operands[1], x2->id);
  ck_assert_uint_eq(e->root, mul->id);
  kiln_instr *bc = instr(m, "axpy.v5", "broadcast");
  ck_assert_uint_eq(kiln_instr_attr_ints(bc, KILN_ATTR_DIMENSIONS)->n, 0);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_no_root_no_entry) {
  /* No ROOT: the last instruction is the root. No ENTRY: the last
   * computation is the entry. The header name may end with ':'. */
  kiln_module *m = parse("HloModule comments:\n"
                         "c1 { a = f32[] constant(1)\n b = f32[] constant(2) }\n"
                         "c2 {\n  p = s32[] parameter(0)\n  q = s32[] negate(p)\n}\n");
  ck_assert_str_eq(m->name, "comments");
  ck_assert_uint_eq(m->entry, 1);
  ck_assert(m->comps[1]->is_entry);
  ck_assert(!m->comps[0]->is_entry);
  ck_assert_uint_eq(m->comps[0]->root, instr(m, "c1", "b")->id);
  ck_assert_uint_eq(m->comps[1]->root, instr(m, "c2", "q")->id);
  ck_assert_int_eq(m->is_scheduled, -1);
  ck_assert_ptr_null(m->entry_layout);
  ck_assert(!m->has_aliases);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_comments_everywhere) {
  const char *t = "/* module description. */ // and a line comment\n"
                  "HloModule /*x*/ comments, /* a */ replica_count /* b */ = /* c */ 3\n"
                  "ENTRY /*comment*/ c1 {\n"
                  "  /* blah */\n"
                  "  ROOT const1 = /*foo*/f32[1]{0} constant({12345 /*bar*/})\n"
                  "  // trailing\n"
                  "  /* comment */\n"
                  "}\n"
                  "/* something else */\n"
                  "comp2 { a = (f32[], /*index=1*/ s32[ /*d*/ 2 /*e*/ ]{ /*f*/ 0 }) parameter(0)\n"
                  "  b = f32[] get-tuple-element(/*x*/ (f32[], s32[2]) /*y*/ a /*z*/), /*w*/ index "
                  "/*v*/= /*u*/0 }";
  kiln_module *m = parse(t);
  ck_assert_int_eq(m->replica_count, 3);
  kiln_instr *c = instr(m, "c1", "const1");
  ck_assert_str_eq(shape_str(&c->shape), "f32[1]{0}");
  ck_assert_int_eq(kiln_literal_get_s64(c->literal, 0), 12345);
  kiln_instr *a = instr(m, "comp2", "a");
  ck_assert_str_eq(shape_str(&a->shape), "(f32[], s32[2]{0})");
  kiln_instr *b = instr(m, "comp2", "b");
  ck_assert_int_eq(kiln_instr_attr_int(b, KILN_ATTR_INDEX, -1), 0);
  ck_assert_str_eq(opnd(m, b, 0), "a");
  ck_assert_uint_eq(m->entry, 0);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_not_nul_terminated) {
  /* The length bounds the text: what follows must never be read. */
  const char full[] = "HloModule m\nENTRY e { ROOT p = f32[] parameter(0) }GARBAGE{{{";
  size_t len = strlen(full) - strlen("GARBAGE{{{");
  char *copy = malloc(len);
  memcpy(copy, full, len);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  ck_assert_int_eq(kiln_module_parse_text(copy, len, NULL, NULL, &m, &st), 0);
  ck_assert_uint_eq(m->ninstrs, 1);
  kiln_module_destroy(m);
  /* and a cut inside a token is an error pointing at the end */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(copy, len - 1, NULL, NULL, &m, &st), KILN_EPARSE);
  ck_assert_str_eq(st.where, "<input>:2:39");
  ck_assert_str_eq(st.msg, "expected an instruction or '}' in computation e, found end of input");
  free(copy);
}
END_TEST

/* ---- shapes and layouts --------------------------------------------------- */

START_TEST(test_shapes) {
  const char *t = "HloModule m\n"
                  "ENTRY e {\n"
                  "  a = (f32[], (s32[], pred[]), ()) parameter(0)\n"
                  "  b = token[] after-all()\n"
                  "  c = () tuple()\n"
                  "  d = s32[<=4, 2] parameter(1)\n"
                  "  e = (s32[<=4 ,2]) tuple(d)\n"
                  "  f = f32[8,128]{1,0:T(8,128)} parameter(2)\n"
                  "  g = f32[]{:S(1)} parameter(3)\n"
                  "  h = f32[10,30,20]{2,0,1:T(256)} parameter(4)\n"
                  "  i = f32[2,3]{0,1: T(2, 128)(2,1) S(3) } parameter(5)\n"
                  "  j = bf16[0,5]{1,0} parameter(6)\n"
                  "  k = s32[<=4,2]set-dimension-size(d, d), dimensions={0}\n"
                  "  ROOT r = (f32[], token[]) tuple(g, b)\n"
                  "}\n";
  kiln_module *m = parse(t);
  kiln_instr *a = instr(m, "e", "a");
  ck_assert_int_eq(a->shape.dtype, KILN_TUPLE);
  ck_assert_uint_eq(a->shape.rank, 3);
  ck_assert_int_eq(a->shape.tuple[1].dtype, KILN_TUPLE);
  ck_assert_int_eq(a->shape.tuple[1].tuple[1].dtype, KILN_PRED);
  ck_assert_int_eq(a->shape.tuple[2].dtype, KILN_TUPLE);
  ck_assert_uint_eq(a->shape.tuple[2].rank, 0);
  ck_assert_str_eq(shape_str(&a->shape), "(f32[], (s32[], pred[]), ())");
  ck_assert_int_eq(instr(m, "e", "b")->shape.dtype, KILN_TOKEN);
  ck_assert_uint_eq(instr(m, "e", "b")->noperands, 0);
  ck_assert_str_eq(shape_str(&instr(m, "e", "c")->shape), "()");
  kiln_instr *d = instr(m, "e", "d");
  ck_assert_uint_eq(d->shape.rank, 2);
  ck_assert_int_eq(d->shape.dims[0], 4);
  ck_assert_int_eq(d->shape.dims[1], 2);
  ck_assert_ptr_nonnull(d->shape.dynamic);
  ck_assert_int_eq(d->shape.dynamic[0], 1);
  ck_assert_int_eq(d->shape.dynamic[1], 0);
  ck_assert_ptr_null(d->shape.layout);
  ck_assert_str_eq(shape_str(&instr(m, "e", "e")->shape), "(s32[<=4,2])");
  kiln_instr *f = instr(m, "e", "f");
  ck_assert_ptr_nonnull(f->shape.layout);
  ck_assert_uint_eq(f->shape.layout->rank, 2);
  ck_assert_int_eq(f->shape.layout->minor_to_major[0], 1);
  ck_assert_int_eq(f->shape.layout->minor_to_major[1], 0);
  ck_assert_str_eq(f->shape.layout->tail, "T(8,128)");
  ck_assert_int_eq(f->shape.layout->memory_space, 0);
  kiln_instr *g = instr(m, "e", "g");
  ck_assert_uint_eq(g->shape.layout->rank, 0);
  ck_assert_str_eq(g->shape.layout->tail, "S(1)");
  ck_assert_int_eq(g->shape.layout->memory_space, 1);
  ck_assert_str_eq(shape_str(&instr(m, "e", "h")->shape), "f32[10,30,20]{2,0,1:T(256)}");
  kiln_instr *i = instr(m, "e", "i");
  ck_assert_str_eq(i->shape.layout->tail, "T(2,128)(2,1)S(3)");
  ck_assert_int_eq(i->shape.layout->memory_space, 3);
  ck_assert_str_eq(shape_str(&instr(m, "e", "j")->shape), "bf16[0,5]{1,0}");
  ck_assert_int_eq(instr(m, "e", "k")->op, KILN_OP_SET_DIMENSION_SIZE);
  kiln_module_destroy(m);
}
END_TEST

/* ---- forward references and ordering -------------------------------------- */

START_TEST(test_forward_references) {
  const char *t = "HloModule m\n"
                  "ENTRY e {\n"
                  "  ROOT r = f32[] add(s, t)\n"
                  "  s = f32[] negate(p)\n"
                  "  p = f32[] parameter(0)\n"
                  "  u = f32[] constant(1)\n"
                  "  t = f32[] multiply(u, p)\n"
                  "  w = f32[] constant(7)\n"
                  "}\n";
  kiln_module *m = parse(t);
  kiln_computation *c = comp(m, "e");
  /* definitions move up to just before their first use; the rest stays */
  ck_assert_str_eq(order_str(m, c), "p s u t r w");
  ck_assert_uint_eq(c->root, instr(m, "e", "r")->id);
  kiln_instr *r = instr(m, "e", "r");
  ck_assert_str_eq(opnd(m, r, 0), "s");
  ck_assert_str_eq(opnd(m, r, 1), "t");
  /* ids stay in text order */
  ck_assert_uint_lt(r->id, instr(m, "e", "p")->id);
  kiln_module_destroy(m);

  /* an ordered computation is left exactly as written */
  m = parse("HloModule m\nENTRY e {\n a = f32[] parameter(0)\n c = f32[] constant(2)\n"
            " b = f32[] negate(a)\n d = f32[] add(b, c)\n}\n");
  ck_assert_str_eq(order_str(m, comp(m, "e")), "a c b d");
  kiln_module_destroy(m);

  /* control predecessors order too */
  m = parse("HloModule m\nENTRY e {\n a = f32[] constant(1), control-predecessors={b}\n"
            " b = f32[] constant(2)\n ROOT t = (f32[], f32[]) tuple(a, b)\n}\n");
  ck_assert_str_eq(order_str(m, comp(m, "e")), "b a t");
  kiln_instr *a = instr(m, "e", "a");
  ck_assert_uint_eq(a->ncontrol, 1);
  ck_assert_uint_eq(a->control_preds[0], instr(m, "e", "b")->id);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_called_computations) {
  const char *t =
      "HloModule m\n"
      "ENTRY e {\n"
      "  p = f32[4] parameter(0)\n"
      "  z = f32[] constant(0)\n"
      "  t = (f32[4]) tuple(p)\n"
      "  w = (f32[4]) while(t), body=%body, condition=%cond\n"
      "  r = f32[] reduce(p, z), dimensions={0}, to_apply=%sum\n"
      "  b = pred[] constant(true)\n"
      "  c1 = f32[4] conditional(b, p, p), false_computation=neg, true_computation=id\n"
      "  i = s32[] constant(1)\n"
      "  c2 = f32[4] conditional(i, p, p, p), branch_computations={%neg, id, %neg}\n"
      "  s = f32[4] select-and-scatter(p, p, z), window={size=1}, scatter=sum, select=ge\n"
      "  f = f32[4] fusion(p), kind=kLoop, calls=%neg\n"
      "  cc = f32[4] custom-call(p), custom_call_target=\"x\", called_computations={id, neg}\n"
      "  ROOT k = f32[4] call(p), to_apply=id\n"
      "}\n"
      "sum { x = f32[] parameter(0)\n y = f32[] parameter(1)\n ROOT s = f32[] add(x, y) }\n"
      "ge { x = f32[] parameter(0)\n y = f32[] parameter(1)\n ROOT s = pred[] compare(x, y), "
      "direction=GE }\n"
      "cond { x = (f32[4]) parameter(0)\n ROOT c = pred[] constant(false) }\n"
      "body { ROOT x = (f32[4]) parameter(0) }\n"
      "neg { x = f32[4] parameter(0)\n ROOT n = f32[4] negate(x) }\n"
      "id { ROOT x = f32[4] parameter(0) }\n";
  kiln_module *m = parse(t);
  uint32_t sum = comp(m, "sum")->id, ge = comp(m, "ge")->id, cond = comp(m, "cond")->id,
           body = comp(m, "body")->id, neg = comp(m, "neg")->id, id = comp(m, "id")->id;
  ck_assert_uint_eq(m->entry, 0);
  kiln_instr *w = instr(m, "e", "w");
  ck_assert_uint_eq(w->ncalled, 2);
  ck_assert_uint_eq(w->called[0], cond);
  ck_assert_uint_eq(w->called[1], body);
  kiln_instr *r = instr(m, "e", "r");
  ck_assert_uint_eq(r->ncalled, 1);
  ck_assert_uint_eq(r->called[0], sum);
  kiln_instr *c1 = instr(m, "e", "c1");
  ck_assert_uint_eq(c1->ncalled, 2);
  ck_assert_uint_eq(c1->called[0], id);
  ck_assert_uint_eq(c1->called[1], neg);
  kiln_instr *c2 = instr(m, "e", "c2");
  ck_assert_uint_eq(c2->ncalled, 3);
  ck_assert_uint_eq(c2->called[0], neg);
  ck_assert_uint_eq(c2->called[1], id);
  ck_assert_uint_eq(c2->called[2], neg);
  kiln_instr *s = instr(m, "e", "s");
  ck_assert_uint_eq(s->ncalled, 2);
  ck_assert_uint_eq(s->called[0], ge);
  ck_assert_uint_eq(s->called[1], sum);
  kiln_instr *f = instr(m, "e", "f");
  ck_assert_uint_eq(f->ncalled, 1);
  ck_assert_uint_eq(f->called[0], neg);
  ck_assert_str_eq(kiln_instr_attr_str(f, KILN_ATTR_KIND), "kLoop");
  kiln_instr *cc = instr(m, "e", "cc");
  ck_assert_uint_eq(cc->ncalled, 2);
  ck_assert_uint_eq(cc->called[0], id);
  ck_assert_uint_eq(cc->called[1], neg);
  ck_assert_str_eq(kiln_instr_attr_str(cc, KILN_ATTR_CUSTOM_CALL_TARGET), "x");
  kiln_instr *k = instr(m, "e", "k");
  ck_assert_uint_eq(k->called[0], id);
  /* role attributes are not stored as attributes */
  ck_assert_uint_eq(w->nattrs, 0);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_async_sugar) {
  kiln_module *m = parse("HloModule test\n"
                         "ENTRY AsyncOps {\n"
                         "  init = f32[] constant(42.0)\n"
                         "  async-start = ((f32[]), f32[], u32[]) negate-start(init)\n"
                         "  async-update = ((f32[]), f32[], u32[]) negate-update(async-start)\n"
                         "  ROOT async-done = f32[] negate-done(async-update)\n"
                         "  ars = f32[] all-reduce-start(init), to_apply=AsyncOps\n"
                         "  cps = (f32[], f32[]) copy-start(init)\n"
                         "}\n");
  kiln_instr *s = instr(m, "AsyncOps", "async-start");
  ck_assert_int_eq(s->op, KILN_OP_ASYNC_START);
  ck_assert_int_eq(s->async_op, KILN_OP_NEGATE);
  ck_assert_int_eq(instr(m, "AsyncOps", "async-update")->op, KILN_OP_ASYNC_UPDATE);
  ck_assert_int_eq(instr(m, "AsyncOps", "async-update")->async_op, KILN_OP_NEGATE);
  kiln_instr *d = instr(m, "AsyncOps", "async-done");
  ck_assert_int_eq(d->op, KILN_OP_ASYNC_DONE);
  ck_assert_int_eq(d->async_op, KILN_OP_NEGATE);
  ck_assert_uint_eq(comp(m, "AsyncOps")->root, d->id);
  /* full names win over the sugar */
  ck_assert_int_eq(instr(m, "AsyncOps", "ars")->op, KILN_OP_ALL_REDUCE_START);
  ck_assert_int_eq(instr(m, "AsyncOps", "ars")->async_op, KILN_OP_INVALID);
  ck_assert_int_eq(instr(m, "AsyncOps", "cps")->op, KILN_OP_COPY_START);
  kiln_module_destroy(m);
}
END_TEST

/* ---- constants and literals ----------------------------------------------- */

static uint8_t byte_at(const kiln_literal *l, int64_t i) { return ((const uint8_t *)l->data)[i]; }
static uint16_t u16_at(const kiln_literal *l, int64_t i) { return ((const uint16_t *)l->data)[i]; }

START_TEST(test_constants) {
  const char *t = "HloModule m\n"
                  "ENTRY e {\n"
                  "  a = f32[] constant(3e+2)\n"
                  "  b = f32[2,3] constant({ { 1, 2.5, -3 }, {4e-1, inf, -inf} })\n"
                  "  c = f64[2] constant({nan, -0})\n"
                  "  d = pred[3] constant({true, false, true})\n"
                  "  e = c64[2] constant({(1, 2), (-3.5, 4e1)})\n"
                  "  f = (s32[], (f32[2], pred[])) constant((7, ({1, 2}, true)))\n"
                  "  g = s4[2] constant({-8, 7})\n"
                  "  h = u4[2] constant({0, 15})\n"
                  "  i = u8[2] constant({0, 255})\n"
                  "  j = s64[2] constant({-9223372036854775808, 9223372036854775807})\n"
                  "  k = u64[] constant(18446744073709551615)\n"
                  "  l = f16[2] constant({-65504, 1})\n"
                  "  n = bf16[] constant(1.5)\n"
                  "  o = f8e4m3fn[4] constant({448, -1, 0.0625, nan})\n"
                  "  q = f8e5m2[2] constant({57344, inf})\n"
                  "  r = f32[0] constant({})\n"
                  "  s = f32[2,0] constant({ {}, {} })\n"
                  "  u = f32[] constant(0.1)\n"
                  "  v = c128[] constant((1e308, -2))\n"
                  "  w = s32[<=4] constant({1, 2})\n"
                  "  x = f8e8m0fnu[2] constant({1, 0.25})\n"
                  "  y = f4e2m1fn[3] constant({6, -0.5, 1.5})\n"
                  "  z = f8e4m3fnuz[2] constant({-0, 240})\n"
                  "}\n";
  kiln_module *m = parse(t);
  ck_assert(kiln_literal_get_f64(instr(m, "e", "a")->literal, 0) == 300.0);
  kiln_literal *b = instr(m, "e", "b")->literal;
  ck_assert_str_eq(shape_str(&b->shape), "f32[2,3]");
  ck_assert(kiln_literal_get_f64(b, 1) == 2.5);
  ck_assert(kiln_literal_get_f64(b, 2) == -3);
  ck_assert(((float *)b->data)[3] == 0.4f);
  ck_assert(isinf(kiln_literal_get_f64(b, 4)) && kiln_literal_get_f64(b, 4) > 0);
  ck_assert(isinf(kiln_literal_get_f64(b, 5)) && kiln_literal_get_f64(b, 5) < 0);
  kiln_literal *c = instr(m, "e", "c")->literal;
  ck_assert(isnan(kiln_literal_get_f64(c, 0)));
  ck_assert(kiln_literal_get_f64(c, 1) == 0 && signbit(kiln_literal_get_f64(c, 1)));
  kiln_literal *d = instr(m, "e", "d")->literal;
  ck_assert(kiln_literal_get_pred(d, 0) && !kiln_literal_get_pred(d, 1) &&
            kiln_literal_get_pred(d, 2));
  kiln_literal *e = instr(m, "e", "e")->literal;
  double re, im;
  kiln_literal_get_c128(e, 1, &re, &im);
  ck_assert(re == -3.5 && im == 40);
  kiln_literal *f = instr(m, "e", "f")->literal;
  ck_assert_int_eq(f->shape.dtype, KILN_TUPLE);
  ck_assert_int_eq(kiln_literal_get_s64(f->elems[0], 0), 7);
  ck_assert(kiln_literal_get_f64(f->elems[1]->elems[0], 1) == 2);
  ck_assert(kiln_literal_get_pred(f->elems[1]->elems[1], 0));
  ck_assert_int_eq(kiln_literal_get_s64(instr(m, "e", "g")->literal, 0), -8);
  ck_assert_int_eq(kiln_literal_get_s64(instr(m, "e", "g")->literal, 1), 7);
  ck_assert_int_eq(byte_at(instr(m, "e", "g")->literal, 0), 0xf8); /* sign-extended */
  ck_assert_int_eq(kiln_literal_get_u64(instr(m, "e", "h")->literal, 1), 15);
  ck_assert_int_eq(kiln_literal_get_u64(instr(m, "e", "i")->literal, 1), 255);
  ck_assert(kiln_literal_get_s64(instr(m, "e", "j")->literal, 0) == INT64_MIN);
  ck_assert(kiln_literal_get_s64(instr(m, "e", "j")->literal, 1) == INT64_MAX);
  ck_assert(kiln_literal_get_u64(instr(m, "e", "k")->literal, 0) == UINT64_MAX);
  ck_assert_uint_eq(u16_at(instr(m, "e", "l")->literal, 0), 0xfbff);
  ck_assert_uint_eq(u16_at(instr(m, "e", "l")->literal, 1), 0x3c00);
  ck_assert_uint_eq(u16_at(instr(m, "e", "n")->literal, 0), 0x3fc0);
  kiln_literal *o = instr(m, "e", "o")->literal;
  ck_assert_uint_eq(byte_at(o, 0), 0x7e);
  ck_assert_uint_eq(byte_at(o, 1), 0xb8);
  ck_assert_uint_eq(byte_at(o, 2), 0x18);
  ck_assert_uint_eq(byte_at(o, 3), 0x7f);
  kiln_literal *q = instr(m, "e", "q")->literal;
  ck_assert_uint_eq(byte_at(q, 0), 0x7b);
  ck_assert_uint_eq(byte_at(q, 1), 0x7c);
  ck_assert_uint_eq(instr(m, "e", "r")->literal->nbytes, 0);
  ck_assert_uint_eq(instr(m, "e", "s")->literal->nbytes, 0);
  ck_assert(((float *)instr(m, "e", "u")->literal->data)[0] == 0.1f);
  kiln_literal_get_c128(instr(m, "e", "v")->literal, 0, &re, &im);
  ck_assert(re == 1e308 && im == -2);
  kiln_literal *w = instr(m, "e", "w")->literal;
  ck_assert_ptr_nonnull(w->dynamic_sizes);
  ck_assert_int_eq(w->dynamic_sizes[0], 2);
  ck_assert_int_eq(kiln_literal_get_s64(w, 1), 2);
  ck_assert_int_eq(kiln_literal_get_s64(w, 2), 0); /* padding */
  kiln_literal *x = instr(m, "e", "x")->literal;
  ck_assert_uint_eq(byte_at(x, 0), 127);
  ck_assert_uint_eq(byte_at(x, 1), 125);
  kiln_literal *y = instr(m, "e", "y")->literal;
  ck_assert_uint_eq(byte_at(y, 0), 0x7);
  ck_assert_uint_eq(byte_at(y, 1), 0x9);
  ck_assert_uint_eq(byte_at(y, 2), 0x3);
  kiln_literal *z = instr(m, "e", "z")->literal;
  ck_assert_uint_eq(byte_at(z, 0), 0x00); /* fnuz: no negative zero */
  ck_assert_uint_eq(byte_at(z, 1), 0x7f);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_literal_parse_text) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_literal *l = NULL;
  const char *t1 = "f32[2] {1, 2}";
  ck_assert_int_eq(kiln_literal_parse_text(t1, strlen(t1), &l, &st), 0);
  ck_assert_ptr_nonnull(l->own);
  ck_assert_str_eq(shape_str(&l->shape), "f32[2]");
  ck_assert(kiln_literal_get_f64(l, 1) == 2);
  kiln_literal_destroy(l);
  const char *t2 = "(s32[], pred[]) (1, true)";
  ck_assert_int_eq(kiln_literal_parse_text(t2, strlen(t2), &l, &st), 0);
  ck_assert_int_eq(kiln_literal_get_s64(l->elems[0], 0), 1);
  ck_assert(kiln_literal_get_pred(l->elems[1], 0));
  kiln_literal_destroy(l);
  const char *t3 = " bf16[] 1.5 // a comment\n";
  ck_assert_int_eq(kiln_literal_parse_text(t3, strlen(t3), &l, &st), 0);
  ck_assert_uint_eq(u16_at(l, 0), 0x3fc0);
  kiln_literal_destroy(l);
  const char *t4 = "f32[2]{0} {1, 2}";
  ck_assert_int_eq(kiln_literal_parse_text(t4, strlen(t4), &l, &st), 0);
  ck_assert_str_eq(shape_str(&l->shape), "f32[2]{0}");
  kiln_literal_destroy(l);

  const char *bad = "f32[2] {1, 2} 3";
  ck_assert_int_eq(kiln_literal_parse_text(bad, strlen(bad), &l, &st), KILN_EPARSE);
  ck_assert_ptr_null(l);
  ck_assert_str_eq(st.where, "<literal>:1:15");
  ck_assert_str_eq(st.msg, "expected the end of the literal, found '3'");
  kiln_status_clear(&st);
  const char *big = "f32[1000000] {1}";
  ck_assert_int_eq(kiln_literal_parse_text(big, strlen(big), &l, &st), KILN_EPARSE);
  ck_assert_str_eq(st.where, "<literal>:1:14");
  ck_assert_str_eq(st.msg, "literal of shape f32[1000000] has 1000000 elements, more than the 3 "
                           "characters of text left can hold");
  kiln_status_clear(&st);
  const char *u8 = "u8[] 256";
  ck_assert_int_eq(kiln_literal_parse_text(u8, strlen(u8), &l, &st), KILN_ERANGE);
  ck_assert_str_eq(st.where, "<literal>:1:6");
  ck_assert_str_eq(st.msg, "value 256 is out of range for u8 (0..255)");
}
END_TEST

/* ---- attributes ------------------------------------------------------------ */

START_TEST(test_attribute_kinds) {
  const char *t =
      "HloModule m\n"
      "ENTRY e {\n"
      "  p = f32[8,8,3,3] parameter(0), sharding={devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}\n"
      "  g = f32[8] get-tuple-element(p), index=-1, is_stable=true, epsilon=0.001\n"
      "  s = f32[4] slice(p), slice={[0:2], [1:5:2]}\n"
      "  pd = f32[4] pad(p, p), padding=0_0x1_2_1x-1_0\n"
      "  cp = f32[4] collective-permute(p), source_target_pairs={{0,1},{1,0}}, channel_id=5\n"
      "  rw = f32[4] reduce-window(p, p), window={size=3x3 stride=2x1 pad=1_1x0_-1 lhs_dilate=1x2 "
      "rhs_dilate=2x1 rhs_reversal=0x1}, to_apply=e\n"
      "  rw1 = f32[4] reduce-window(p, p), window={size=2 stride=2}, to_apply=e\n"
      "  cv = f32[4] convolution(p, p), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01oi->f01b, "
      "feature_group_count=2\n"
      "  cm = pred[4] compare(p, p), direction=LT, type=TOTALORDER\n"
      "  ar = f32[4] all-reduce(p), replica_groups={{0,1},{2,3}}, to_apply=e\n"
      "  ar2 = f32[4] all-reduce(p), replica_groups={}, to_apply=e\n"
      "  ag = f32[4] all-gather(p), replica_groups=[2,2]<=[4], dimensions={0}\n"
      "  ag2 = f32[4] all-gather(p), replica_groups=[2,4]<=[2,2,2]T(2,1,0), dimensions={0}\n"
      "  cc = f32[4] custom-call(p), custom_call_target=\"__cublas$gemm\", "
      "opaque=\"a\\\"b\\n\\x41\", api_version=API_VERSION_TYPED_FFI,\n"
      "     backend_config={\"alpha\":1,\n      \"s\":\"}{\"},\n     metadata={op_type=\"Add\" "
      "op_name=\"a/b\" source_line=3}, frontend_attributes={_xla=\"x\"}\n"
      "  cc2 = f32[4] custom-call(p), custom_call_target=\"y\", "
      "backend_config=\"{\\\"is_sync\\\":false}\", schedule=SCHEDULE_LATEST, foo={1, {2}}, "
      "bar=[2]<=[2]\n"
      "  ROOT r = f32[4] add(p, p), sharding={replicated}, operand_precision={high,default}\n"
      "}\n";
  kiln_module *m = parse(t);
  kiln_instr *g = instr(m, "e", "g");
  ck_assert_int_eq(kiln_instr_attr_int(g, KILN_ATTR_INDEX, 0), -1);
  ck_assert_int_eq(kiln_instr_attr_int(g, KILN_ATTR_IS_STABLE, 0), 1);
  ck_assert(kiln_instr_attr(g, KILN_ATTR_EPSILON)->v.f == 0.001);
  CK_INTS(kiln_instr_attr_ints(instr(m, "e", "s"), KILN_ATTR_SLICE), 0, 2, 1, 1, 5, 2);
  CK_INTS(kiln_instr_attr_ints(instr(m, "e", "pd"), KILN_ATTR_PADDING), 0, 0, 0, 1, 2, 1, -1, 0, 0);
  kiln_instr *cp = instr(m, "e", "cp");
  CK_INTS(kiln_instr_attr_ints(cp, KILN_ATTR_SOURCE_TARGET_PAIRS), 0, 1, 1, 0);
  ck_assert_int_eq(kiln_instr_attr_int(cp, KILN_ATTR_CHANNEL_ID, 0), 5);

  const kiln_window *w = kiln_instr_attr(instr(m, "e", "rw"), KILN_ATTR_WINDOW)->v.window;
  ck_assert_uint_eq(w->rank, 2);
  ck_assert_int_eq(w->dims[0].size, 3);
  ck_assert_int_eq(w->dims[0].stride, 2);
  ck_assert_int_eq(w->dims[1].stride, 1);
  ck_assert_int_eq(w->dims[0].pad_lo, 1);
  ck_assert_int_eq(w->dims[0].pad_hi, 1);
  ck_assert_int_eq(w->dims[1].pad_lo, 0);
  ck_assert_int_eq(w->dims[1].pad_hi, -1);
  ck_assert_int_eq(w->dims[1].lhs_dilate, 2);
  ck_assert_int_eq(w->dims[0].rhs_dilate, 2);
  ck_assert(!w->dims[0].reversal && w->dims[1].reversal);
  w = kiln_instr_attr(instr(m, "e", "rw1"), KILN_ATTR_WINDOW)->v.window;
  ck_assert_uint_eq(w->rank, 1);
  ck_assert_int_eq(w->dims[0].size, 2);
  ck_assert_int_eq(w->dims[0].stride, 2);
  ck_assert_int_eq(w->dims[0].pad_lo, 0);
  ck_assert_int_eq(w->dims[0].lhs_dilate, 1);
  ck_assert_int_eq(w->dims[0].rhs_dilate, 1);

  kiln_instr *cv = instr(m, "e", "cv");
  const kiln_conv_dims *cd = kiln_instr_attr(cv, KILN_ATTR_DIM_LABELS)->v.conv;
  ck_assert_uint_eq(cd->nspatial, 2);
  ck_assert_int_eq(cd->in_batch, 0);
  ck_assert_int_eq(cd->in_feature, 3);
  ck_assert_int_eq(cd->in_spatial[0], 1);
  ck_assert_int_eq(cd->in_spatial[1], 2);
  ck_assert_int_eq(cd->kernel_out, 2);
  ck_assert_int_eq(cd->kernel_in, 3);
  ck_assert_int_eq(cd->kernel_spatial[0], 0);
  ck_assert_int_eq(cd->kernel_spatial[1], 1);
  ck_assert_int_eq(cd->out_feature, 0);
  ck_assert_int_eq(cd->out_batch, 3);
  ck_assert_int_eq(cd->out_spatial[0], 1);
  ck_assert_int_eq(kiln_instr_attr_int(cv, KILN_ATTR_FEATURE_GROUP_COUNT, 0), 2);

  kiln_instr *cm = instr(m, "e", "cm");
  ck_assert_int_eq(kiln_instr_attr_int(cm, KILN_ATTR_DIRECTION, -1), KILN_CMP_LT);
  ck_assert_str_eq(kiln_instr_attr_str(cm, KILN_ATTR_TYPE), "TOTALORDER");

  const kiln_replica_groups *rg =
      kiln_instr_attr(instr(m, "e", "ar"), KILN_ATTR_REPLICA_GROUPS)->v.groups;
  ck_assert(!rg->iota);
  ck_assert_uint_eq(rg->ngroups, 2);
  CK_INTS(&rg->groups[0], 0, 1);
  CK_INTS(&rg->groups[1], 2, 3);
  rg = kiln_instr_attr(instr(m, "e", "ar2"), KILN_ATTR_REPLICA_GROUPS)->v.groups;
  ck_assert(!rg->iota);
  ck_assert_uint_eq(rg->ngroups, 0);
  rg = kiln_instr_attr(instr(m, "e", "ag"), KILN_ATTR_REPLICA_GROUPS)->v.groups;
  ck_assert(rg->iota);
  CK_INTS(&rg->iota_shape, 2, 2);
  CK_INTS(&rg->iota_reshape, 4);
  ck_assert_uint_eq(rg->iota_perm.n, 0);
  rg = kiln_instr_attr(instr(m, "e", "ag2"), KILN_ATTR_REPLICA_GROUPS)->v.groups;
  CK_INTS(&rg->iota_reshape, 2, 2, 2);
  CK_INTS(&rg->iota_perm, 2, 1, 0);

  kiln_instr *cc = instr(m, "e", "cc");
  ck_assert_str_eq(kiln_instr_attr_str(cc, KILN_ATTR_CUSTOM_CALL_TARGET), "__cublas$gemm");
  ck_assert_str_eq(kiln_instr_attr_str(cc, KILN_ATTR_OPAQUE), "a\"b\nA");
  ck_assert_str_eq(kiln_instr_attr_str(cc, KILN_ATTR_API_VERSION), "API_VERSION_TYPED_FFI");
  ck_assert_str_eq(kiln_instr_attr_str(cc, KILN_ATTR_BACKEND_CONFIG),
                   "{\"alpha\":1,\n      \"s\":\"}{\"}");
  ck_assert_str_eq(kiln_instr_attr_str(cc, KILN_ATTR_METADATA),
                   "{op_type=\"Add\" op_name=\"a/b\" source_line=3}");
  ck_assert_str_eq(kiln_instr_attr_str(cc, KILN_ATTR_FRONTEND_ATTRIBUTES), "{_xla=\"x\"}");
  kiln_instr *cc2 = instr(m, "e", "cc2");
  ck_assert_str_eq(kiln_instr_attr_str(cc2, KILN_ATTR_BACKEND_CONFIG),
                   "\"{\\\"is_sync\\\":false}\"");
  ck_assert_str_eq(attr_named(cc2, "schedule")->v.s, "SCHEDULE_LATEST");
  ck_assert_str_eq(attr_named(cc2, "foo")->v.s, "{1, {2}}");
  ck_assert_str_eq(attr_named(cc2, "bar")->v.s, "[2]<=[2]");
  kiln_instr *r = instr(m, "e", "r");
  ck_assert_str_eq(kiln_instr_attr_str(r, KILN_ATTR_OPERAND_PRECISION), "{high,default}");
  ck_assert_int_eq(kiln_instr_attr(r, KILN_ATTR_SHARDING)->v.sharding->kind, KILN_SHARD_REPLICATED);
  kiln_module_destroy(m);
}
END_TEST

static const kiln_sharding *sharding_of(const char *text) {
  static kiln_module *keep;
  kiln_module_destroy(keep);
  keep = NULL;
  if (text == NULL) return NULL;
  char buf[1024];
  snprintf(buf, sizeof buf, "HloModule m\nENTRY e { ROOT p = f32[4,4] parameter(0), sharding=%s }",
           text);
  keep = parse(buf);
  const kiln_attr *a = kiln_instr_attr(keep->instrs[0], KILN_ATTR_SHARDING);
  ck_assert_ptr_nonnull(a);
  return a->v.sharding;
}

START_TEST(test_sharding_forms) {
  const kiln_sharding *s = sharding_of("{replicated}");
  ck_assert_int_eq(s->kind, KILN_SHARD_REPLICATED);
  ck_assert_ptr_null(s->extra);
  s = sharding_of("{maximal device=1}");
  ck_assert_int_eq(s->kind, KILN_SHARD_MAXIMAL);
  ck_assert_int_eq(s->device, 1);
  s = sharding_of("{devices=[1,2]0,1}");
  ck_assert_int_eq(s->kind, KILN_SHARD_TILED);
  CK_INTS(&s->tile_dims, 1, 2);
  CK_INTS(&s->devices, 0, 1);
  ck_assert(!s->last_tile_dim_replicate);
  s = sharding_of("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}");
  CK_INTS(&s->devices, 0, 1, 2, 3);
  ck_assert(s->last_tile_dim_replicate);
  s = sharding_of("{devices=[2,2]<=[4]}");
  ck_assert_int_eq(s->kind, KILN_SHARD_TILED);
  ck_assert_uint_eq(s->devices.n, 0);
  CK_INTS(&s->iota_reshape, 4);
  ck_assert_uint_eq(s->iota_perm.n, 0);
  s = sharding_of("{devices=[2,2]<=[2,2]T(1,0)}");
  CK_INTS(&s->iota_reshape, 2, 2);
  CK_INTS(&s->iota_perm, 1, 0);
  s = sharding_of("{devices=[2,1,2]<=[4] last_tile_dims={manual}}");
  CK_INTS(&s->last_tile_dims, KILN_SHARD_MANUAL);
  s = sharding_of("{devices=[2,1,1,2]0,2,1,3 last_tile_dims={manual, replicated}}");
  CK_INTS(&s->last_tile_dims, KILN_SHARD_MANUAL, KILN_SHARD_REPLICATED);
  s = sharding_of("{manual}");
  ck_assert_int_eq(s->kind, KILN_SHARD_MANUAL);
  s = sharding_of("{unknown shard_as 1}");
  ck_assert_int_eq(s->kind, KILN_SHARD_UNKNOWN);
  ck_assert_str_eq(s->extra, "shard_as 1");
  s = sharding_of(
      "{{replicated}, {maximal device=0}, {devices=[2]0,1 metadata={op_name=\"a b\"}}}");
  ck_assert_int_eq(s->kind, KILN_SHARD_TUPLE);
  ck_assert_uint_eq(s->nelems, 3);
  ck_assert_int_eq(s->elems[0].kind, KILN_SHARD_REPLICATED);
  ck_assert_int_eq(s->elems[1].kind, KILN_SHARD_MAXIMAL);
  ck_assert_int_eq(s->elems[1].device, 0);
  ck_assert_int_eq(s->elems[2].kind, KILN_SHARD_TILED);
  ck_assert_str_eq(s->elems[2].extra, "metadata={op_name=\"a b\"}");
  s = sharding_of("{}");
  ck_assert_int_eq(s->kind, KILN_SHARD_TUPLE);
  ck_assert_uint_eq(s->nelems, 0);
  s = sharding_of("{replicated metadata={op_name=\"x\"}}");
  ck_assert_int_eq(s->kind, KILN_SHARD_REPLICATED);
  ck_assert_str_eq(s->extra, "metadata={op_name=\"x\"}");
  sharding_of(NULL);
}
END_TEST

/* ---- errors ----------------------------------------------------------------- */

#define HDR "HloModule m\n"

START_TEST(test_error_truncated) {
  expect_error(HDR "ENTRY e {\n  p = f32[] parameter(0)\n", "t.hlo:4:1",
               "expected an instruction or '}' in computation e, found end of input");
  expect_error(HDR "ENTRY e {\n  p = f32[2", "t.hlo:3:12",
               "expected ']' after the dimensions of a shape, found end of input");
  expect_error(HDR "ENTRY e {\n  p = f32[] add(", "t.hlo:3:17",
               "expected an operand name, found end of input");
  expect_error(HDR, "t.hlo:2:1", "expected a computation, found end of input");
  expect_error("", "t.hlo:1:1", "expected 'HloModule', found end of input");
  expect_error(HDR "ENTRY e {}", "t.hlo:2:7", "computation e has no instructions");
}
END_TEST

START_TEST(test_error_syntax) {
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0)\n  ROOT add = f32[] add(x, x}\n}\n",
               "t.hlo:4:28", "expected ')' after operands of add, found '}'");
  expect_error(HDR "ENTRY e {\n  x = f32[] frobnicate(x)\n}\n", "t.hlo:3:13",
               "unknown opcode 'frobnicate'");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0)\n  y = f32[] negate x\n}\n", "t.hlo:4:20",
               "expected '(' after opcode negate, found 'x'");
  expect_error(HDR "ENTRY e {\n  x f32[] parameter(0)\n}\n", "t.hlo:3:5",
               "expected '=' after instruction name x, found 'f32'");
  expect_error(HDR "ENTRY e {\n  x = f33[] parameter(0)\n}\n", "t.hlo:3:7",
               "unknown element type 'f33'");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), dimensions={1,}\n}\n", "t.hlo:3:41",
               "expected an integer, found '}'");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), direction=UP\n}\n", "t.hlo:3:37",
               "unknown comparison direction 'UP' (expected EQ, NE, GE, GT, LE or LT)");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), index=1, index=2\n}\n", "t.hlo:3:36",
               "duplicate attribute index");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), is_stable=maybe\n}\n", "t.hlo:3:37",
               "expected true or false for is_stable, found 'maybe'");
  expect_error(HDR "ENTRY e {\n  w = f32[] while(w), body=e\n}\n", "t.hlo:3:3",
               "w has body= but no condition=");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), window={size=2x2 stride=1}\n}\n",
               "t.hlo:3:34", "window size has 2 dimensions but stride has 1");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), window={siz=2}\n}\n", "t.hlo:3:35",
               "unknown window field 'siz'");
  expect_error(
      HDR "ENTRY e {\n  x = f32[] parameter(0), dim_labels=b01f_01io->b0f\n}\n", "t.hlo:3:38",
      "bad dim_labels b01f_01io->b0f: input, kernel and output have 2, 2 and 1 spatial dimensions");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), dim_labels=b01f_01io->b0x\n}\n",
               "t.hlo:3:38",
               "bad dim_labels b01f_01io->b0x: the output part needs b, f and spatial digits "
               "0..n-1 once each");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), sharding={devices=[2,2]0,1,2}\n}\n",
               "t.hlo:3:37", "sharding lists 3 devices for 4 tiles");
  expect_error(
      HDR "ENTRY e {\n  x = f32[] parameter(0), sharding={devices=[2]0,1 devices=[2]<=[2]}\n}\n",
      "t.hlo:3:52", "sharding gives both devices and devices");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), sharding={maximal}\n}\n", "t.hlo:3:36",
               "maximal sharding needs device=");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), sharding={replicated device=1}\n}\n",
               "t.hlo:3:36", "device= is only for maximal sharding");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), replica_groups=[2,2]<=[8]\n}\n",
               "t.hlo:3:42", "replica_groups: the iota list <=[...] has 8 devices, expected 4");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), custom_call_target=\"a\\qb\"\n}\n",
               "t.hlo:3:48", "bad escape sequence '\\q' in string");
  expect_error(HDR "ENTRY e {\n  x = f32[] constant(1)\n}\nENTRY f {\n  y = f32[] constant(1)\n}\n",
               "t.hlo:5:1", "second ENTRY computation f");
  expect_error("HloModule m, is_scheduled=yes\n", "t.hlo:1:27",
               "expected true or false for is_scheduled, found 'yes'");
  expect_error("HloModule m, input_output_alias={ {0}: (0, {}, might-alias) }\n", "t.hlo:1:48",
               "expected may-alias or must-alias, found 'might-alias'");
}
END_TEST

START_TEST(test_error_names) {
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0)\n  ROOT add.3 = f32[] add(x, %y)\n}\n",
               "t.hlo:4:29", "unknown operand %y in add.3");
  expect_error(HDR "ENTRY main {\n  x = f32[] parameter(0)\n  %x = f32[] parameter(1)\n}\n",
               "t.hlo:4:3", "duplicate instruction name %x in computation main");
  expect_error(HDR "c {\n  x = f32[] parameter(0)\n}\n%c {\n  x = f32[] parameter(0)\n}\n",
               "t.hlo:5:1", "duplicate computation name c");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0)\n  r = f32[] call(x), to_apply=%nope\n}\n",
               "t.hlo:4:31", "unknown computation %nope in to_apply of r");
  expect_error(HDR "ENTRY e {\n  x = f32[] parameter(0), control-predecessors={q}\n}\n",
               "t.hlo:3:49", "unknown control predecessor %q in x");
  expect_error(HDR "ENTRY e {\n  ROOT x = f32[] parameter(0)\n  ROOT y = f32[] parameter(1)\n}\n",
               "t.hlo:4:8", "computation e has a second ROOT y (the first is x)");
  /* operands from another computation are not visible */
  expect_error(HDR "c {\n  a = f32[] parameter(0)\n}\nENTRY e {\n  ROOT b = f32[] negate(a)\n}\n",
               "t.hlo:6:25", "unknown operand %a in b");
}
END_TEST

START_TEST(test_error_cycle) {
  expect_error(HDR "ENTRY main {\n  p = f32[] parameter(0)\n  a = f32[] add(p, c)\n"
                   "  b = f32[] negate(a)\n  c = f32[] negate(b)\n  ROOT r = f32[] negate(c)\n}\n",
               "t.hlo:4:3", "cycle in computation main: a -> c -> b -> a");
  expect_error(HDR "ENTRY main {\n  a = f32[] negate(a)\n}\n", "t.hlo:3:3",
               "cycle in computation main: a -> a");
  expect_error(HDR "ENTRY main {\n  a = f32[] constant(1), control-predecessors={b}\n"
                   "  b = f32[] constant(2), control-predecessors={a}\n}\n",
               "t.hlo:3:3", "cycle in computation main: a -> b -> a");
}
END_TEST

START_TEST(test_error_inferred_shape_limit) {
  /* An inferred shape is held to the same limit as a written one, so that
   * what parses also parses once printed back. */
  const char *text = HDR "ENTRY e {\n  a = f32[2000000] parameter(0)\n"
                         "  b = f32[2000000] parameter(1)\n  ROOT d = dot(a, b)\n}\n";
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  int rc = kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st);
  ck_assert_int_eq(rc, KILN_ELIMIT);
  ck_assert_ptr_null(m);
  ck_assert_str_eq(st.where, "t.hlo:5:8");
  ck_assert_str_eq(st.msg, "the inferred shape f32[2000000,2000000] of d has more than "
                           "1099511627776 elements");
}
END_TEST

START_TEST(test_error_shapes) {
  expect_error_code(HDR "ENTRY e {\n  p = f32[99999999999,99999999999] parameter(0)\n}\n",
                    KILN_ELIMIT, "t.hlo:3:7",
                    "shape f32[99999999999,99999999999] has more than 1099511627776 elements");
  expect_error(HDR "ENTRY e {\n  p = f32[99999999999999999999] parameter(0)\n}\n", "t.hlo:3:11",
               "integer 99999999999999999999 does not fit in 64 bits");
  expect_error(HDR "ENTRY e {\n  p = f32[-1] parameter(0)\n}\n", "t.hlo:3:11",
               "expected a dimension size, found '-1'");
  expect_error(HDR "ENTRY e {\n  p = f32[?] parameter(0)\n}\n", "t.hlo:3:11",
               "unbounded dynamic dimensions ('?') are not supported");
  expect_error(HDR "ENTRY e {\n  p = f32[2,3]{1} parameter(0)\n}\n", "t.hlo:3:15",
               "layout {1} of f32[2,3] lists 1 dimensions, expected 2");
  expect_error(HDR "ENTRY e {\n  p = f32[2,3]{0,0} parameter(0)\n}\n", "t.hlo:3:15",
               "layout {0,0} of f32[2,3] is not a permutation of 0..1");
  expect_error(HDR "ENTRY e {\n  p = f32[2,3]{1,2} parameter(0)\n}\n", "t.hlo:3:15",
               "layout {1,2} of f32[2,3] is not a permutation of 0..1");
  expect_error(HDR "ENTRY e {\n  p = f32[2]{0:T(2} parameter(0)\n}\n", "t.hlo:3:13",
               "unbalanced braces: this '{' is never closed");
  expect_error(HDR "ENTRY e {\n  p = token[2] parameter(0)\n}\n", "t.hlo:3:7",
               "token shape cannot have dimensions");
  /* a small max_elements applies to every shape */
  kiln_parse_options o = {0};
  o.max_elements = 100;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m;
  const char *t = HDR "ENTRY e {\n  p = (f32[10], f32[11,10]) parameter(0)\n}\n";
  ck_assert_int_eq(kiln_module_parse_text(t, strlen(t), "t.hlo", &o, &m, &st), KILN_ELIMIT);
  ck_assert_str_eq(st.where, "t.hlo:3:17");
  ck_assert_str_eq(st.msg, "shape f32[11,10] has more than 100 elements");
}
END_TEST

START_TEST(test_error_constants) {
  expect_error_code(HDR "ENTRY e {\n  c = u8[] constant(300)\n}\n", KILN_ERANGE, "t.hlo:3:21",
                    "value 300 is out of range for u8 (0..255)");
  expect_error_code(HDR "ENTRY e {\n  c = s8[2] constant({1, -129})\n}\n", KILN_ERANGE,
                    "t.hlo:3:26", "value -129 is out of range for s8 (-128..127)");
  expect_error_code(HDR "ENTRY e {\n  c = u32[] constant(-1)\n}\n", KILN_ERANGE, "t.hlo:3:22",
                    "value -1 is out of range for u32 (0..4294967295)");
  expect_error_code(HDR "ENTRY e {\n  c = s4[] constant(8)\n}\n", KILN_ERANGE, "t.hlo:3:21",
                    "value 8 is out of range for s4 (-8..7)");
  expect_error_code(HDR "ENTRY e {\n  c = f8e4m3fn[] constant(500)\n}\n", KILN_ERANGE, "t.hlo:3:27",
                    "value 500 cannot be represented in f8e4m3fn");
  expect_error(HDR "ENTRY e {\n  c = s32[] constant(1.5)\n}\n", "t.hlo:3:22",
               "expected an integer for s32, found '1.5'");
  expect_error(HDR "ENTRY e {\n  c = f32[3] constant({1, 2})\n}\n", "t.hlo:3:28",
               "expected 3 elements in dimension 0 of f32[3], found 2");
  expect_error(HDR "ENTRY e {\n  c = f32[2,2] constant({{1, 2}, {3, 4, 5}})\n}\n", "t.hlo:3:41",
               "expected 2 elements in dimension 1 of f32[2,2], found more");
  expect_error(HDR "ENTRY e {\n  c = f32[2,2] constant({1, 2})\n}\n", "t.hlo:3:26",
               "expected '{' to open a nested array, found '1'");
  expect_error(HDR "ENTRY e {\n  c = s32[<=2] constant({1, 2, 3})\n}\n", "t.hlo:3:32",
               "expected at most 2 elements in dimension 0 of s32[<=2], found more");
  expect_error(HDR "ENTRY e {\n  c = pred[] constant(2)\n}\n", "t.hlo:3:23",
               "expected true or false for pred, found '2'");
  expect_error(HDR "ENTRY e {\n  c = constant(1)\n}\n", "t.hlo:3:7",
               "constant c needs a result shape");
  expect_error(HDR "ENTRY e {\n  c = f32[1000000] constant({1})\n}\n", "t.hlo:3:29",
               "constant c: literal of shape f32[1000000] has 1000000 elements, more than the 7 "
               "characters of text left can hold");
  /* No element, yet one "{}" to write per index before the zero-sized dim
   * (fuzz_proto: printing f32[2^40,2^40,0] did not end): bounded by the text
   * left and by max_elements, before the literal is read. */
  expect_error(HDR "ENTRY e {\n  c = f32[1000,0] constant({{}})\n}\n", "t.hlo:3:28",
               "constant c: literal of shape f32[1000,0] has 1000 elements and empty arrays ({}), "
               "more than the 8 characters of text left can hold");
  expect_error_code(HDR "ENTRY e {\n  c = f32[1073741824,1073741824,0] constant({})\n}\n",
                    KILN_ELIMIT, "t.hlo:3:45",
                    "constant c: literal of shape f32[1073741824,1073741824,0] has more than "
                    "1099511627776 elements and empty arrays ({})");
  /* The strides of a shape with a zero-sized dim first are never formed:
   * f32[0,2^40,2^40] has no element, and its text is one {}. */
  kiln_module *z =
      parse(HDR "ENTRY e {\n  ROOT c = f32[0,1099511627776,1099511627776] constant({})\n}\n");
  char *zt = kiln_module_print(z, NULL);
  ck_assert_ptr_nonnull(strstr(zt, "f32[0,1099511627776,1099511627776] constant({})"));
  kiln_free(zt);
  kiln_module_destroy(z);
  /* Under a small max_elements, the empty arrays count too. */
  kiln_parse_options o = {0};
  o.no_infer = 1;
  o.max_elements = 4;
  const char *t = HDR "ENTRY e {\n  c = f32[5,0] constant({{}, {}, {}, {}, {}})\n}\n";
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = (kiln_module *)1;
  ck_assert_int_eq(kiln_module_parse_text(t, strlen(t), "t.hlo", &o, &m, &st), KILN_ELIMIT);
  ck_assert_ptr_null(m);
  ck_assert_str_eq(st.where, "t.hlo:3:25");
  ck_assert_str_eq(st.msg, "constant c: literal of shape f32[5,0] has more than 4 elements and "
                           "empty arrays ({})");
  o.max_elements = 5;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(t, strlen(t), "t.hlo", &o, &m, &st), 0);
  kiln_module_destroy(m);
  expect_error(HDR "ENTRY e {\n  c = f32[8] constant({...})\n}\n", "t.hlo:3:23",
               "the value of this constant was left out of the text ({...})");
  expect_error(HDR "ENTRY e {\n  c = (f32[], s32[]) constant((1 2))\n}\n", "t.hlo:3:34",
               "expected ',' between tuple literal elements, found '2'");
}
END_TEST

START_TEST(test_error_unterminated) {
  expect_error(HDR "ENTRY e {\n  /* never closed\n  p = f32[] parameter(0)\n}\n", "t.hlo:3:3",
               "unterminated /* comment");
  expect_error(HDR "ENTRY e {\n  p = f32[] parameter(0), custom_call_target=\"abc\n}\n",
               "t.hlo:3:46", "unterminated string");
  expect_error(HDR "ENTRY e {\n  p = f32[] parameter(0), metadata={op_name=\"x\"\n", "t.hlo:3:36",
               "unbalanced braces: this '{' is never closed");
  expect_error(HDR "ENTRY e {\n  p = f32[] parameter(0), foo={(]}\n}\n", "t.hlo:3:33",
               "unbalanced brackets: expected ')' to close '(' at 3:32, found ']'");
  expect_error(HDR "ENTRY e {\n  p = f32[] parameter(0), backend_config=\"a\n}\n", "t.hlo:3:42",
               "unterminated string");
}
END_TEST

START_TEST(test_error_nul_bytes) {
  /* Values are kept as C strings: a NUL inside would silently cut them. */
  static const char t1[] = HDR "ENTRY e {\n  p = f32[] parameter(0), metadata={a=\"x\0y\"}\n}\n";
  static const char t2[] = HDR "ENTRY e {\n  p = f32[] parameter(0), foo=a\0b\n}\n";
  static const char t3[] =
      HDR "ENTRY e {\n  p = f32[] parameter(0), custom_call_target=\"a\\x00\"\n}\n";
  const char *texts[] = {t1, t2, t3};
  size_t lens[] = {sizeof t1 - 1, sizeof t2 - 1, sizeof t3 - 1};
  const char *want[] = {"t.hlo:3:41: NUL byte in a string",
                        "t.hlo:3:32: NUL byte in an attribute value",
                        "t.hlo:3:48: NUL character in a string"};
  for (int i = 0; i < 3; i++) {
    kiln_status st;
    kiln_status_clear(&st);
    kiln_module *m = NULL;
    ck_assert_int_eq(kiln_module_parse_text(texts[i], lens[i], "t.hlo", NULL, &m, &st),
                     KILN_EPARSE);
    char got[2048];
    snprintf(got, sizeof got, "%s: %s", st.where, st.msg);
    ck_assert_str_eq(got, want[i]);
  }
}
END_TEST

START_TEST(test_error_nesting) {
  /* 300 nested tuples: a bounded error, not a stack overflow */
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, HDR "ENTRY e {\n  p = ");
  for (int i = 0; i < 300; i++) kiln_sbuf_putc(&b, '(');
  kiln_sbuf_puts(&b, "f32[]");
  for (int i = 0; i < 300; i++) kiln_sbuf_putc(&b, ')');
  kiln_sbuf_puts(&b, " parameter(0)\n}\n");
  expect_error(kiln_sbuf_str(&b), "t.hlo:3:263", "nesting deeper than 256 levels");
  kiln_sbuf_reset(&b);
  kiln_sbuf_puts(&b, HDR "ENTRY e {\n  p = f32[] parameter(0), foo=");
  for (int i = 0; i < 300; i++) kiln_sbuf_putc(&b, '{');
  expect_error(kiln_sbuf_str(&b), "t.hlo:3:287", "nesting deeper than 256 levels");
  kiln_sbuf_free(&b);
}
END_TEST

START_TEST(test_every_prefix) {
  /* Every prefix of a module that uses most forms: each parses or fails
   * with a located error; none crashes, hangs or leaks (run under ASan). */
  const char *t =
      "/* c */ HloModule m, entry_computation_layout={(f32[2]{0})->f32[2]{0}}, "
      "input_output_alias={ {}: (0, {}, may-alias) }, foo={a}\n"
      "add (x: f32[], y: f32[]) -> f32[] {\n x = f32[] parameter(0)\n y = f32[] parameter(1)\n"
      " ROOT s = f32[] add(f32[] x, y) }\n"
      "ENTRY %e {\n  p = f32[2]{0:T(2)} parameter(0), sharding={devices=[2]<=[2]}\n"
      "  c = (f32[], s32[2]) constant((1.5, {1, -2}))\n"
      "  r = f32[] reduce(p, g), dimensions={0}, to_apply=add, metadata={op_name=\"a\\\"\"}\n"
      "  g = f32[] get-tuple-element(c), index=0 // fwd\n"
      "  w = f32[2] reduce-window(p, g), window={size=2 pad=0_1}, to_apply=add\n"
      "  ROOT o = f32[2] add(p, w), backend_config={\"x\":[1,{2}]}, control-predecessors={r}\n}\n";
  size_t n = strlen(t);
  kiln_parse_options o = {0};
  o.no_infer = 1;
  for (size_t len = 0; len <= n; len++) {
    char *copy = malloc(len ? len : 1);
    memcpy(copy, t, len);
    kiln_status st;
    kiln_status_clear(&st);
    kiln_module *m = NULL;
    int rc = kiln_module_parse_text(copy, len, "p.hlo", &o, &m, &st);
    if (rc == 0) {
      ck_assert_ptr_nonnull(m);
      kiln_module_destroy(m);
    } else {
      ck_assert_ptr_null(m);
      ck_assert_int_eq(rc, st.code);
      ck_assert_msg(strncmp(st.where, "p.hlo:", 6) == 0, "len %zu: where '%s'", len, st.where);
      ck_assert(st.msg[0] != '\0');
    }
    free(copy);
  }
  kiln_module *m = parse(t);
  ck_assert_uint_eq(m->ninstrs, 9);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_out_of_memory) {
  /* Failing each allocation in turn turns into KILN_ENOMEM, never a crash. */
  const char *t =
      HDR "add { x = f32[] parameter(0)\n y = f32[] parameter(1)\n ROOT s = f32[] add(x, y) }\n"
          "ENTRY e {\n p = f32[4]{0} parameter(0), sharding={replicated}\n"
          " z = f32[] constant(0)\n ROOT r = f32[] reduce(p, z), dimensions={0}, to_apply=add,"
          " metadata={op_name=\"a\"}, window={size=2}\n}\n";
  kiln_parse_options o = {0};
  o.no_infer = 1;
  int seen_ok = 0;
  for (long k = 1; k < 400 && !seen_ok; k++) {
    kiln_alloc_fail_after(k);
    kiln_status st;
    kiln_status_clear(&st);
    kiln_module *m = NULL;
    int rc = kiln_module_parse_text(t, strlen(t), "t.hlo", &o, &m, &st);
    kiln_alloc_fail_after(0);
    if (rc == 0) {
      seen_ok = 1;
      kiln_module_destroy(m);
    } else {
      ck_assert_msg(rc == KILN_ENOMEM, "k=%ld: %s %s", k, kiln_err_name(rc), st.msg);
      ck_assert_ptr_null(m);
    }
  }
  ck_assert(seen_ok);
}
END_TEST

/* ---- missing result shapes --------------------------------------------------- */

START_TEST(test_missing_shapes) {
  const char *t = "HloModule InferUnaryShapeTest\n"
                  "ENTRY InferUnaryShape {\n"
                  "  a = f32[2,10]{1,0} parameter(0)\n"
                  "  ROOT v = abs(a)\n"
                  "}\n";
  kiln_module *m = parse_opts(t, 1);
  kiln_instr *v = instr(m, "InferUnaryShape", "v");
  ck_assert_int_eq(v->shape.dtype, KILN_INVALID);
  ck_assert_int_eq(v->op, KILN_OP_ABS);
  kiln_module_destroy(m);

  kiln_status st;
  kiln_status_clear(&st);
  kiln_parse_options o = {0};
  int rc = kiln_module_parse_text(t, strlen(t), "t.hlo", &o, &m, &st);
  ck_assert_msg(rc == 0, "%s: %s", st.where, st.msg);
  ck_assert_str_eq(shape_str(&instr(m, "InferUnaryShape", "v")->shape), "f32[2,10]");
  kiln_module_destroy(m);

  /* shapes flow through called computations: the callee's missing root
   * shape is inferred before the caller's */
  t = "HloModule m\n"
      "ENTRY e {\n  p = s32[3] parameter(0)\n  ROOT c = call(p), to_apply=f\n}\n"
      "f {\n  x = s32[3] parameter(0)\n  ROOT n = negate(x)\n}\n";
  kiln_status_clear(&st);
  rc = kiln_module_parse_text(t, strlen(t), "t.hlo", &o, &m, &st);
  ck_assert_msg(rc == 0, "%s: %s", st.where, st.msg);
  ck_assert_str_eq(shape_str(&instr(m, "f", "n")->shape), "s32[3]");
  ck_assert_str_eq(shape_str(&instr(m, "e", "c")->shape), "s32[3]");
  kiln_module_destroy(m);

  /* an inference failure is a parse error at the instruction */
  t = "HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  q = s32[3] parameter(1)\n"
      "  ROOT a = add(p, q)\n}\n";
  kiln_status_clear(&st);
  rc = kiln_module_parse_text(t, strlen(t), "t.hlo", &o, &m, &st);
  ck_assert_int_ne(rc, 0);
  ck_assert_ptr_null(m);
  ck_assert_str_eq(st.where, "t.hlo:5:8");
  ck_assert_msg(strncmp(st.msg, "cannot infer the shape of a: ", 29) == 0, "%s", st.msg);
}
END_TEST

/* ---- the conformance corpus ----------------------------------------------- */

static const char *corpus_dir(void) {
  static char buf[4096];
  const char *env = getenv("KILN_CORPUS_DIR");
  if (env && *env) return env;
  snprintf(buf, sizeof buf, "%s/../shared/corpus/xla-hlo", KILN_SOURCE_DIR);
  return buf;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc(n > 0 ? (size_t)n : 1);
  *len = fread(b, 1, n > 0 ? (size_t)n : 0, f);
  fclose(f);
  return b;
}

/* Files whose modules leave some result shapes out. */
static bool needs_inference(const char *name) {
  return strncmp(name, "051_", 4) == 0 || strncmp(name, "100_", 4) == 0;
}

static void parse_corpus(int no_infer) {
  const char *dir = corpus_dir();
  DIR *d = opendir(dir);
  if (d == NULL) {
    fprintf(stderr, "test_parse: corpus %s not found, skipping\n", dir);
    return;
  }
  int files = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t nl = strlen(e->d_name);
    if (nl < 4 || strcmp(e->d_name + nl - 4, ".hlo") != 0) continue;
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    size_t len;
    char *text = read_file(path, &len);
    ck_assert_ptr_nonnull(text);
    kiln_parse_options o = {0};
    o.no_infer = no_infer;
    kiln_status st;
    kiln_status_clear(&st);
    kiln_module *m = NULL;
    int rc = kiln_module_parse_text(text, len, e->d_name, &o, &m, &st);
    ck_assert_msg(rc == 0, "%s: %s: %s", e->d_name, st.where, st.msg);
    ck_assert_uint_gt(m->ncomps, 0);
    ck_assert_uint_lt(m->entry, m->ncomps);
    for (uint32_t c = 0; c < m->ncomps; c++) {
      ck_assert_uint_ne(m->comps[c]->root, KILN_NO_ID);
      /* operands come before users */
      kiln_computation *cp = m->comps[c];
      for (uint32_t i = 0; i < cp->ninstrs; i++) {
        kiln_instr *ins = m->instrs[cp->instrs[i]];
        for (uint32_t k = 0; k < ins->noperands; k++) {
          bool before = false;
          for (uint32_t j = 0; j < i; j++) before |= cp->instrs[j] == ins->operands[k];
          ck_assert_msg(before, "%s: operand %u of %s", e->d_name, k, ins->name);
        }
        if (!no_infer)
          ck_assert_int_ne(ins->shape.dtype, KILN_INVALID);
        else if (!needs_inference(e->d_name))
          ck_assert_int_ne(ins->shape.dtype, KILN_INVALID);
      }
    }
    kiln_module_destroy(m);
    free(text);
    files++;
  }
  closedir(d);
  ck_assert_int_gt(files, 0);
}

START_TEST(test_corpus_no_infer) { parse_corpus(1); }
END_TEST

START_TEST(test_corpus_infer) { parse_corpus(0); }
END_TEST

START_TEST(test_corpus_specifics) {
  char path[8192];
  size_t len;
  snprintf(path, sizeof path, "%s/042_while_dynamic_stack.hlo", corpus_dir());
  char *text = read_file(path, &len);
  if (text == NULL) return; /* corpus absent: reported by test_corpus_* */
  kiln_parse_options o = {0};
  o.no_infer = 1;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  ck_assert_int_eq(kiln_module_parse_text(text, len, "042", &o, &m, &st), 0);
  kiln_instr *it = instr(m, "entry", "input_tuple");
  ck_assert_str_eq(shape_str(&it->shape), "(s32[<=4,2])");
  kiln_instr *r = instr(m, "entry", "reduce");
  ck_assert_uint_eq(r->called[0], comp(m, "update_s32")->id);
  kiln_instr *w = instr(m, "entry", "while");
  ck_assert_uint_eq(w->called[0], comp(m, "condition")->id);
  ck_assert_uint_eq(w->called[1], comp(m, "body")->id);
  kiln_module_destroy(m);
  free(text);

  /* 051 leaves out one result shape: inferred from the tuple parameter */
  snprintf(path, sizeof path, "%s/051_while_reduce_scatter_replicas.hlo", corpus_dir());
  text = read_file(path, &len);
  ck_assert_ptr_nonnull(text);
  kiln_parse_options oi = {0};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(text, len, "051", &oi, &m, &st), 0);
  ck_assert_str_eq(shape_str(&instr(m, "cond", "count")->shape), "u32[]");
  kiln_module_destroy(m);
  free(text);

  snprintf(path, sizeof path, "%s/097_fusion_subtract_broadcast_constants.hlo", corpus_dir());
  text = read_file(path, &len);
  ck_assert_ptr_nonnull(text);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(text, len, "097", &o, &m, &st), 0);
  kiln_literal *l = instr(m, "fusion.v3", "constant")->literal;
  ck_assert_int_eq(kiln_literal_elements(l), 6);
  ck_assert(((float *)l->data)[0] == -1.0f);
  ck_assert(((float *)l->data)[3] == 4.1f);
  ck_assert(((float *)l->data)[5] == 4.4f);
  kiln_module_destroy(m);
  free(text);

  snprintf(path, sizeof path, "%s/113_triton_fusion_multiline_backend_config.hlo", corpus_dir());
  text = read_file(path, &len);
  ck_assert_ptr_nonnull(text);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(text, len, "113", &o, &m, &st), 0);
  ck_assert_int_eq(m->is_scheduled, 1);
  const char *bc = kiln_instr_attr_str(instr(m, "e", "triton_gemm__"), KILN_ATTR_BACKEND_CONFIG);
  ck_assert(strncmp(bc, "{\"kind\":\"__triton_gemm\",\n", 25) == 0);
  ck_assert(bc[strlen(bc) - 1] == '}');
  kiln_module_destroy(m);
  free(text);
}
END_TEST

/* ---- size ------------------------------------------------------------------ */

START_TEST(test_large_module) {
  /* 200k instructions written in reverse dependency order: every operand is
   * a forward reference. Linear time keeps this well under the timeout. */
  enum { N = 200000 };
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, HDR "ENTRY e {\n");
  kiln_sbuf_printf(&b, "  ROOT v%d = f32[] negate(v%d)\n", N, N - 1);
  for (int i = N - 1; i > 0; i--) kiln_sbuf_printf(&b, "  v%d = f32[] negate(v%d)\n", i, i - 1);
  kiln_sbuf_puts(&b, "  v0 = f32[] parameter(0)\n}\n");
  ck_assert(!kiln_sbuf_failed(&b));
  clock_t t0 = clock();
  kiln_module *m = parse(kiln_sbuf_str(&b));
  double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  ck_assert_uint_eq(m->ninstrs, N + 1);
  kiln_computation *c = m->comps[0];
  ck_assert_str_eq(m->instrs[c->instrs[0]]->name, "v0");
  ck_assert_str_eq(m->instrs[c->instrs[N]]->name, "v200000");
  ck_assert_uint_eq(c->root, m->instrs[c->instrs[N]]->id);
  ck_assert_msg(secs < 20, "took %.1f s", secs);
  kiln_module_destroy(m);
  kiln_sbuf_free(&b);
}
END_TEST

START_TEST(test_strmap) {
  kiln_strmap map;
  kiln_strmap_init(&map);
  char keys[1000][8];
  for (int i = 0; i < 1000; i++) {
    snprintf(keys[i], sizeof keys[i], "k%d", i);
    ck_assert_int_eq(kiln_strmap_put(&map, keys[i], strlen(keys[i]), (uint32_t)i, NULL), 0);
  }
  uint32_t v;
  ck_assert(kiln_strmap_get(&map, "k517", 4, &v));
  ck_assert_uint_eq(v, 517);
  ck_assert(!kiln_strmap_get(&map, "k1000", 5, &v));
  ck_assert_int_eq(kiln_strmap_put(&map, "k3", 2, 99, &v), 1);
  ck_assert_uint_eq(v, 3);
  kiln_strmap_clear(&map);
  ck_assert(!kiln_strmap_get(&map, "k517", 4, &v));
  ck_assert_int_eq(kiln_strmap_put(&map, "k517", 4, 5, NULL), 0);
  ck_assert(kiln_strmap_get(&map, "k517", 4, &v));
  ck_assert_uint_eq(v, 5);
  ck_assert_uint_eq(map.n, 1);
  kiln_strmap_free(&map);
}
END_TEST

static Suite *parse_suite(void) {
  Suite *s = suite_create("parse");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_basic_module);
  tcase_add_test(tc, test_no_root_no_entry);
  tcase_add_test(tc, test_comments_everywhere);
  tcase_add_test(tc, test_not_nul_terminated);
  tcase_add_test(tc, test_shapes);
  tcase_add_test(tc, test_forward_references);
  tcase_add_test(tc, test_called_computations);
  tcase_add_test(tc, test_async_sugar);
  tcase_add_test(tc, test_constants);
  tcase_add_test(tc, test_literal_parse_text);
  tcase_add_test(tc, test_attribute_kinds);
  tcase_add_test(tc, test_sharding_forms);
  tcase_add_test(tc, test_missing_shapes);
  tcase_add_test(tc, test_strmap);
  suite_add_tcase(s, tc);
  TCase *te = tcase_create("errors");
  tcase_set_timeout(te, 120);
  tcase_add_test(te, test_error_truncated);
  tcase_add_test(te, test_error_syntax);
  tcase_add_test(te, test_error_names);
  tcase_add_test(te, test_error_cycle);
  tcase_add_test(te, test_error_shapes);
  tcase_add_test(te, test_error_inferred_shape_limit);
  tcase_add_test(te, test_error_constants);
  tcase_add_test(te, test_error_unterminated);
  tcase_add_test(te, test_error_nesting);
  tcase_add_test(te, test_error_nul_bytes);
  tcase_add_test(te, test_every_prefix);
  tcase_add_test(te, test_out_of_memory);
  suite_add_tcase(s, te);
  TCase *tk = tcase_create("corpus");
  tcase_set_timeout(tk, 300);
  tcase_add_test(tk, test_corpus_no_infer);
  tcase_add_test(tk, test_corpus_infer);
  tcase_add_test(tk, test_corpus_specifics);
  tcase_add_test(tk, test_large_module);
  suite_add_tcase(s, tk);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(parse_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
