/* Tests for buffer assignment: aliasing of tuples, get-tuple-element,
 * bitcasts and layout-preserving reshapes/transposes; in-place reuse of
 * dead operands; offset reuse after a buffer dies (best fit); results as
 * output slots; donated parameters; while state shared by the loop's
 * condition, body and result; conditional branches writing their roots
 * into the conditional's result; and the refusals.
 */
#include <check.h>
#include <string.h>

#include "compiler/buffer_assign.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"

static kiln_module *parse(const char *text) {
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st) == 0, "%s",
                st.msg);
  return m;
}

static kiln_buffer_assignment *assign(const kiln_module *m) {
  kiln_buffer_assignment *ba = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_buffer_assign(m, NULL, &ba, &st);
  ck_assert_msg(rc == 0, "%s: %s", st.where, st.msg);
  return ba;
}

static kiln_id id_of(const kiln_module *m, const char *name) {
  for (uint32_t i = 0; i < m->ninstrs; i++)
    if (m->instrs[i]->comp != KILN_NO_ID && strcmp(m->instrs[i]->name, name) == 0) return i;
  ck_abort_msg("no instruction %s", name);
  return 0;
}

static uint32_t slot_of(const kiln_module *m, const kiln_buffer_assignment *ba, const char *name,
                        uint32_t leaf) {
  uint32_t n;
  const uint32_t *s = kiln_buffer_leaves(ba, id_of(m, name), &n);
  ck_assert_uint_lt(leaf, n);
  return s[leaf];
}

START_TEST(elementwise_chain_in_place_into_output) {
  kiln_module *m = parse("HloModule t\nENTRY main {\n  p = f32[256] parameter(0)\n"
                         "  a = f32[256] exponential(p)\n  b = f32[256] negate(a)\n"
                         "  c = f32[256] sine(b)\n  ROOT d = f32[256] add(c, p)\n}\n");
  kiln_buffer_assignment *ba = assign(m);
  uint32_t d = slot_of(m, ba, "d", 0);
  ck_assert_uint_eq(slot_of(m, ba, "a", 0), d);
  ck_assert_uint_eq(slot_of(m, ba, "b", 0), d);
  ck_assert_uint_eq(slot_of(m, ba, "c", 0), d);
  ck_assert_int_eq(ba->slots[d].kind, KILN_SLOT_OUTPUT);
  ck_assert_int_eq(ba->slots[slot_of(m, ba, "p", 0)].kind, KILN_SLOT_PARAM);
  ck_assert_uint_eq(ba->temp_bytes, 0);
  ck_assert_uint_eq(ba->nresults, 1);
  ck_assert_uint_eq(ba->result_slots[0], d);
  kiln_buffer_assignment_destroy(ba);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(parameters_never_written) {
  /* p dies at a, but parameters belong to the caller. */
  kiln_module *m = parse("HloModule t\nENTRY main {\n  p = f32[16] parameter(0)\n"
                         "  a = f32[16] exponential(p)\n  ROOT b = f32[16] negate(a)\n}\n");
  kiln_buffer_assignment *ba = assign(m);
  ck_assert_uint_ne(slot_of(m, ba, "a", 0), slot_of(m, ba, "p", 0));
  kiln_buffer_assignment_destroy(ba);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(dead_buffers_reused_best_fit) {
  /* x (16 KiB) dies at y; z of the same size then takes x's offset. w is
   * live alongside z and goes elsewhere. */
  kiln_module *m = parse("HloModule t\nadd { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT "
                         "s = f32[] add(a, b) }\n"
                         "ENTRY main {\n  p = f32[64] parameter(0)\n  zero = f32[] constant(0)\n"
                         "  x = f32[64,64] broadcast(p), dimensions={1}\n"
                         "  y = f32[64] reduce(x, zero), dimensions={0}, to_apply=add\n"
                         "  z = f32[64,64] broadcast(y), dimensions={0}\n"
                         "  w = f32[64] reduce(z, zero), dimensions={1}, to_apply=add\n"
                         "  v = f32[64,64] broadcast(w), dimensions={1}\n"
                         "  ROOT r = f32[64] reduce(v, zero), dimensions={0}, to_apply=add\n}\n");
  kiln_buffer_assignment *ba = assign(m);
  const kiln_slot *x = &ba->slots[slot_of(m, ba, "x", 0)], *z = &ba->slots[slot_of(m, ba, "z", 0)];
  const kiln_slot *v = &ba->slots[slot_of(m, ba, "v", 0)];
  ck_assert_int_eq(x->kind, KILN_SLOT_TEMP);
  ck_assert_uint_eq(x->size, 16384);
  ck_assert_uint_eq(z->offset, x->offset);
  ck_assert_uint_eq(v->offset, x->offset);
  /* x/z/v share 16 KiB; y dies at z before w is made, so w takes y's
   * offset too. */
  ck_assert_uint_eq(ba->slots[slot_of(m, ba, "w", 0)].offset,
                    ba->slots[slot_of(m, ba, "y", 0)].offset);
  ck_assert_uint_eq(ba->temp_bytes, 16384 + 256);
  ck_assert_uint_le(ba->peak_bytes, ba->temp_bytes);
  ck_assert_uint_ge(ba->peak_bytes, 16384 + 256);
  ck_assert_int_eq(ba->slots[slot_of(m, ba, "zero", 0)].kind, KILN_SLOT_CONSTANT);
  ck_assert_uint_eq(ba->constant_bytes, 64);
  kiln_buffer_assignment_destroy(ba);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(aliases_share_slots) {
  kiln_module *m = parse(
      "HloModule t\nENTRY main {\n  p = f32[4,6] parameter(0)\n  e = f32[4,6] exponential(p)\n"
      "  r = f32[24] reshape(e)\n  bc = s32[24] bitcast-convert(r)\n"
      "  q = f32[4,6]{0,1} parameter(1)\n  t = f32[6,4]{1,0} transpose(q), dimensions={1,0}\n"
      "  in = (s32[24], f32[6,4]) tuple(bc, t)\n  tu = (f32[24], (s32[24], f32[6,4])) tuple(r, "
      "in)\n"
      "  g = (s32[24], f32[6,4]) get-tuple-element(tu), index=1\n"
      "  g1 = f32[6,4] get-tuple-element(g), index=1\n"
      "  ROOT o = (f32[6,4], f32[4,6]) tuple(g1, e)\n}\n");
  kiln_buffer_assignment *ba = assign(m);
  uint32_t e = slot_of(m, ba, "e", 0);
  ck_assert_uint_eq(slot_of(m, ba, "r", 0), e);
  ck_assert_uint_eq(slot_of(m, ba, "bc", 0), e);
  ck_assert_uint_eq(slot_of(m, ba, "t", 0), slot_of(m, ba, "q", 0));
  ck_assert_uint_eq(slot_of(m, ba, "g1", 0), slot_of(m, ba, "q", 0));
  uint32_t n;
  kiln_buffer_leaves(ba, id_of(m, "tu"), &n);
  ck_assert_uint_eq(n, 3);
  ck_assert_uint_eq(slot_of(m, ba, "tu", 1), e);
  ck_assert_uint_eq(slot_of(m, ba, "g", 0), e);
  /* The transposed parameter is a result: read from the parameter, copied
   * into an output slot later; e is a fresh value and becomes output 1. */
  ck_assert_int_eq(ba->slots[ba->result_slots[0]].kind, KILN_SLOT_OUTPUT);
  ck_assert_uint_eq(ba->result_slots[1], e);
  ck_assert_int_eq(ba->slots[e].kind, KILN_SLOT_OUTPUT);
  ck_assert_uint_eq(ba->slots[e].index, 1);
  kiln_buffer_assignment_destroy(ba);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(donated_parameter_written_in_place) {
  kiln_module *m = parse("HloModule t, input_output_alias={ {}: (0, {}, must-alias) }\n"
                         "ENTRY main {\n  p = f32[32] parameter(0)\n  q = f32[32] parameter(1)\n"
                         "  a = f32[32] multiply(p, q)\n  ROOT b = f32[32] add(a, q)\n}\n");
  kiln_buffer_assignment *ba = assign(m);
  uint32_t p = slot_of(m, ba, "p", 0);
  ck_assert_uint_eq(ba->result_slots[0], p);
  ck_assert_uint_eq(slot_of(m, ba, "a", 0), p);
  ck_assert_uint_eq(slot_of(m, ba, "b", 0), p);
  ck_assert_uint_eq(ba->temp_bytes, 0);
  kiln_buffer_assignment_destroy(ba);
  kiln_module_destroy(m);
  /* Read after the producer: the value goes to a temporary and is copied
   * into the donated buffer at the end. */
  m = parse("HloModule t, input_output_alias={ {0}: (0, {}, may-alias) }\n"
            "ENTRY main {\n  p = f32[32] parameter(0)\n  a = f32[32] exponential(p)\n"
            "  b = f32[32] add(a, p)\n  ROOT r = (f32[32], f32[32]) tuple(a, b)\n}\n");
  ba = assign(m);
  ck_assert_uint_eq(ba->result_slots[0], slot_of(m, ba, "p", 0));
  ck_assert_uint_ne(slot_of(m, ba, "a", 0), slot_of(m, ba, "p", 0));
  ck_assert_int_eq(ba->slots[slot_of(m, ba, "b", 0)].kind, KILN_SLOT_OUTPUT);
  kiln_buffer_assignment_destroy(ba);
  kiln_module_destroy(m);
}
END_TEST

static const char loop_hlo[] =
    "HloModule t\n"
    "cond { p = (s32[], f32[64]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
    "  n = s32[] constant(4)  ROOT lt = pred[] compare(i, n), direction=LT }\n"
    "body { p = (s32[], f32[64]) parameter(0)  i = s32[] get-tuple-element(p), index=0\n"
    "  x = f32[64] get-tuple-element(p), index=1  one = s32[] constant(1)  i2 = s32[] add(i, one)\n"
    "  x2 = f32[64] sine(x)  ROOT t = (s32[], f32[64]) tuple(i2, x2) }\n"
    "ENTRY main {\n  p0 = f32[64] parameter(0)\n  z = s32[] constant(0)\n"
    "  t = (s32[], f32[64]) tuple(z, p0)\n  w = (s32[], f32[64]) while(t), condition=cond, "
    "body=body\n"
    "  ROOT r = f32[64] get-tuple-element(w), index=1\n}\n";

START_TEST(while_state_shared_and_updated_in_place) {
  kiln_module *m = parse(loop_hlo);
  kiln_buffer_assignment *ba = assign(m);
  uint32_t n;
  const uint32_t *w = kiln_buffer_leaves(ba, id_of(m, "w"), &n);
  ck_assert_uint_eq(n, 2);
  /* The body's and the condition's parameters are the state. */
  const kiln_computation *body = kiln_module_find_computation(m, "body");
  const kiln_computation *cond = kiln_module_find_computation(m, "cond");
  uint32_t nb, nc;
  const uint32_t *bp = kiln_buffer_leaves(ba, kiln_computation_param(m, body, 0)->id, &nb);
  const uint32_t *cp = kiln_buffer_leaves(ba, kiln_computation_param(m, cond, 0)->id, &nc);
  ck_assert_uint_eq(nb, 2);
  ck_assert_uint_eq(nc, 2);
  ck_assert_int_eq(memcmp(bp, w, 2 * sizeof *w), 0);
  ck_assert_int_eq(memcmp(cp, w, 2 * sizeof *w), 0);
  /* sine(x) is x's last read in the body: it writes the state in place. */
  uint32_t x2 = KILN_NO_SLOT;
  for (uint32_t i = 0; i < body->ninstrs; i++)
    if (strcmp(m->instrs[body->instrs[i]]->name, "x2") == 0)
      x2 = kiln_buffer_leaves(ba, body->instrs[i], &nb)[0];
  ck_assert_uint_eq(x2, w[1]);
  /* r is an alias of the state, which the entry runs: the state is the
   * output buffer itself, nothing is copied out. */
  ck_assert_int_eq(ba->slots[w[1]].kind, KILN_SLOT_OUTPUT);
  ck_assert_uint_eq(ba->result_slots[0], w[1]);
  /* p0, a parameter, is copied into the state. */
  ck_assert_uint_ne(slot_of(m, ba, "p0", 0), w[1]);
  kiln_buffer_assignment_destroy(ba);
  kiln_module_destroy(m);
}
END_TEST

/* A lax.scan as JAX exports it: the body calls a computation that slices
 * the input, one that updates the stacked output, and passes the weights
 * through. */
static const char scan_hlo[] =
    "HloModule t\n"
    "ds { a = f32[8,16] parameter(0)  i = s32[] parameter(1)  z = s32[] constant(0)\n"
    "  s = f32[1,16] dynamic-slice(a, i, z), dynamic_slice_sizes={1,16}\n"
    "  ROOT r = f32[16] reshape(s) }\n"
    "dus { a = f32[8,16] parameter(0)  u = f32[16] parameter(1)  i = s32[] parameter(2)\n"
    "  z = s32[] constant(0)  r = f32[1,16] reshape(u)\n"
    "  ROOT d = f32[8,16] dynamic-update-slice(a, r, i, z) }\n"
    "cond { p = (s32[], f32[8,16], f32[8,16], f32[16]) parameter(0)\n"
    "  i = s32[] get-tuple-element(p), index=0  n = s32[] constant(8)\n"
    "  ROOT lt = pred[] compare(i, n), direction=LT }\n"
    "body { p = (s32[], f32[8,16], f32[8,16], f32[16]) parameter(0)\n"
    "  i = s32[] get-tuple-element(p), index=0  ys = f32[8,16] get-tuple-element(p), index=1\n"
    "  xs = f32[8,16] get-tuple-element(p), index=2  w = f32[16] get-tuple-element(p), index=3\n"
    "  x = f32[16] call(xs, i), to_apply=ds  y = f32[16] multiply(x, w)\n"
    "  ys2 = f32[8,16] call(ys, y, i), to_apply=dus  one = s32[] constant(1)\n"
    "  i2 = s32[] add(i, one)\n"
    "  ROOT t = (s32[], f32[8,16], f32[8,16], f32[16]) tuple(i2, ys2, xs, w) }\n"
    "ENTRY main {\n  xs = f32[8,16] parameter(0)\n  w = f32[16] parameter(1)\n"
    "  z = s32[] constant(0)  zf = f32[] constant(0)\n"
    "  ys = f32[8,16] broadcast(zf), dimensions={}\n"
    "  t = (s32[], f32[8,16], f32[8,16], f32[16]) tuple(z, ys, xs, w)\n"
    "  l = (s32[], f32[8,16], f32[8,16], f32[16]) while(t), condition=cond, body=body\n"
    "  ROOT r = f32[8,16] get-tuple-element(l), index=1\n}\n";

START_TEST(scan_state_in_place_and_passed_through) {
  kiln_module *m = parse(scan_hlo);
  kiln_buffer_assignment *ba = assign(m);
  uint32_t n;
  const uint32_t *l = kiln_buffer_leaves(ba, id_of(m, "l"), &n);
  ck_assert_uint_eq(n, 4);
  /* xs and w pass through the body: the loop reads the parameters'
   * buffers, nothing is copied into a state slot of their own. */
  ck_assert_int_eq(ba->slots[l[2]].kind, KILN_SLOT_PARAM);
  ck_assert_int_eq(ba->slots[l[3]].kind, KILN_SLOT_PARAM);
  ck_assert_uint_eq(l[2], slot_of(m, ba, "xs", 0));
  ck_assert_uint_eq(l[3], slot_of(m, ba, "w", 0));
  /* The stacked output is the loop's own state, in the buffer of its
   * initial value (which dies at the loop: no copy in) and in the output
   * buffer (no copy out). */
  ck_assert_int_eq(ba->slots[l[1]].kind, KILN_SLOT_OUTPUT);
  ck_assert_uint_eq(ba->result_slots[0], l[1]);
  ck_assert_uint_eq(slot_of(m, ba, "ys", 0), l[1]);
  /* A call's result is the called root's buffer, and the update writes
   * the stacked output in place, so the body's result is the state. */
  const kiln_computation *body = kiln_module_find_computation(m, "body");
  const kiln_computation *dus = kiln_module_find_computation(m, "dus");
  const uint32_t *root = kiln_buffer_leaves(ba, body->root, &n);
  ck_assert_uint_eq(n, 4);
  ck_assert_uint_eq(root[1], l[1]);
  ck_assert_uint_eq(kiln_buffer_leaves(ba, dus->root, &n)[0], l[1]);
  kiln_buffer_assignment_destroy(ba);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(call_result_is_root_buffer) {
  kiln_module *m = parse("HloModule t\n"
                         "f { a = f32[32] parameter(0)  ROOT e = f32[32] exponential(a) }\n"
                         "g { a = f32[32] parameter(0)  b = f32[32] parameter(1)\n"
                         "  ROOT t = (f32[32], f32[32]) tuple(b, a) }\n"
                         "ENTRY main {\n  p = f32[32] parameter(0)\n  q = f32[32] parameter(1)\n"
                         "  c = f32[32] call(p), to_apply=f\n"
                         "  d = (f32[32], f32[32]) call(c, q), to_apply=g\n"
                         "  d0 = f32[32] get-tuple-element(d), index=0\n"
                         "  d1 = f32[32] get-tuple-element(d), index=1\n"
                         "  ROOT s = f32[32] add(d0, d1)\n}\n");
  kiln_buffer_assignment *ba = assign(m);
  const kiln_computation *f = kiln_module_find_computation(m, "f");
  uint32_t n;
  ck_assert_uint_eq(slot_of(m, ba, "c", 0), kiln_buffer_leaves(ba, f->root, &n)[0]);
  /* A call that returns its arguments is their buffers. */
  ck_assert_uint_eq(slot_of(m, ba, "d", 0), slot_of(m, ba, "q", 0));
  ck_assert_uint_eq(slot_of(m, ba, "d", 1), slot_of(m, ba, "c", 0));
  ck_assert_int_eq(ba->slots[slot_of(m, ba, "s", 0)].kind, KILN_SLOT_OUTPUT);
  kiln_buffer_assignment_destroy(ba);
  kiln_module_destroy(m);
}
END_TEST

/* Each branch writes its root into the conditional's result buffers unless
 * the root is not the branch's own buffer: a parameter passed through, one
 * buffer returned twice (its second leaf), a constant. */
START_TEST(conditional_branches_write_result_in_place) {
  kiln_module *m = parse(
      "HloModule t\n"
      "b0 { x0 = f32[4] parameter(0)  e0 = f32[4] exponential(x0)\n"
      "  n0 = f32[4] negate(x0)  ROOT t0 = (f32[4], f32[4]) tuple(e0, n0) }\n"
      "b1 { x1 = f32[4] parameter(0)  ROOT t1 = (f32[4], f32[4]) tuple(x1, x1) }\n"
      "b2 { x2 = f32[4] parameter(0)  s2 = f32[4] sine(x2)\n"
      "  ROOT t2 = (f32[4], f32[4]) tuple(s2, s2) }\n"
      "b3 { x3 = f32[4] parameter(0)  k3 = f32[4] constant({1, 2, 3, 4})\n"
      "  c3 = f32[4] cosine(x3)  ROOT t3 = (f32[4], f32[4]) tuple(k3, c3) }\n"
      "ENTRY main {\n  i = s32[] parameter(0)\n  p = f32[4] parameter(1)\n"
      "  c = (f32[4], f32[4]) conditional(i, p, p, p, p), branch_computations={b0, b1, b2, b3}\n"
      "  c0 = f32[4] get-tuple-element(c), index=0\n"
      "  c1 = f32[4] get-tuple-element(c), index=1\n"
      "  ROOT s = f32[4] add(c0, c1)\n}\n");
  kiln_buffer_assignment *ba = assign(m);
  uint32_t r0 = slot_of(m, ba, "c", 0), r1 = slot_of(m, ba, "c", 1);
  ck_assert_uint_ne(r0, r1);
  ck_assert_uint_eq(slot_of(m, ba, "e0", 0), r0);
  ck_assert_uint_eq(slot_of(m, ba, "n0", 0), r1);
  ck_assert_uint_eq(slot_of(m, ba, "x1", 0), slot_of(m, ba, "p", 0));
  ck_assert_uint_eq(slot_of(m, ba, "s2", 0), r0);
  ck_assert_uint_ne(slot_of(m, ba, "k3", 0), r0);
  ck_assert_int_eq(ba->slots[slot_of(m, ba, "k3", 0)].kind, KILN_SLOT_CONSTANT);
  ck_assert_uint_eq(slot_of(m, ba, "c3", 0), r1);
  kiln_buffer_assignment_destroy(ba);
  kiln_module_destroy(m);
  /* A conditional that is the entry's result: the branches write the
   * output buffer, no temporaries at all. */
  m = parse(
      "HloModule t\n"
      "u0 { y0 = f32[64] parameter(0)  ROOT z0 = f32[64] exponential(y0) }\n"
      "u1 { y1 = f32[64] parameter(0)  ROOT z1 = f32[64] tanh(y1) }\n"
      "ENTRY main {\n  q = pred[] parameter(0)\n  a = f32[64] parameter(1)\n"
      "  ROOT d = f32[64] conditional(q, a, a), true_computation=u0, false_computation=u1\n}\n");
  ba = assign(m);
  uint32_t d = slot_of(m, ba, "d", 0);
  ck_assert_int_eq(ba->slots[d].kind, KILN_SLOT_OUTPUT);
  ck_assert_uint_eq(ba->result_slots[0], d);
  ck_assert_uint_eq(slot_of(m, ba, "z0", 0), d);
  ck_assert_uint_eq(slot_of(m, ba, "z1", 0), d);
  ck_assert_uint_eq(ba->temp_bytes, 0);
  kiln_buffer_assignment_destroy(ba);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(refusals) {
  kiln_module *m = parse("HloModule t\nENTRY main {\n  p = f32[<=8] parameter(0)\n"
                         "  ROOT n = f32[<=8] negate(p)\n}\n");
  kiln_buffer_assignment *ba = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_assign(m, NULL, &ba, &st), KILN_EUNIMPL);
  ck_assert_str_eq(st.msg, "bounded-dynamic shapes are not supported by code generation");
  ck_assert_ptr_null(ba);
  kiln_module_destroy(m);
  /* One computation run by two calls: the compiler inlines (or clones) it
   * first; buffer assignment alone refuses. */
  m = parse("HloModule t\nf { x = f32[4] parameter(0)  ROOT n = f32[4] negate(x) }\n"
            "ENTRY main {\n  p = f32[4] parameter(0)\n  a = f32[4] call(p), to_apply=f\n"
            "  ROOT b = f32[4] call(a), to_apply=f\n}\n");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_buffer_assign(m, NULL, &ba, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "computation f runs from more than one place");
  kiln_executable *e = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_compile(m, NULL, &e, NULL, &st), 0);
  ck_assert_uint_eq(e->nprograms, 1); /* both calls inlined into the entry */
  kiln_executable_destroy(e);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(layout_predicates) {
  int64_t d23[2] = {2, 3}, d32[2] = {3, 2}, d6[1] = {6}, d231[3] = {2, 3, 1};
  kiln_shape a, b, c, d;
  kiln_arena *ar = kiln_arena_create();
  kiln_shape_make_array(ar, &a, KILN_F32, d23, 2);
  kiln_shape_make_array(ar, &b, KILN_F32, d6, 1);
  kiln_shape_make_array(ar, &c, KILN_F32, d231, 3);
  kiln_shape_make_array(ar, &d, KILN_F32, d32, 2);
  ck_assert(kiln__reshape_is_bitcast(&a, &b));
  ck_assert(kiln__reshape_is_bitcast(&a, &c));
  int64_t perm[2] = {1, 0};
  ck_assert(!kiln__transpose_is_bitcast(&a, &d, perm));
  d.layout = kiln_arena_calloc(ar, 1, sizeof *d.layout);
  d.layout->rank = 2;
  d.layout->minor_to_major = kiln_arena_calloc(ar, 2, sizeof(int64_t));
  d.layout->minor_to_major[0] = 0;
  d.layout->minor_to_major[1] = 1;
  ck_assert(kiln__transpose_is_bitcast(&a, &d, perm));
  ck_assert(!kiln__reshape_is_bitcast(&d, &b));
  ck_assert(!kiln__same_layout(&a, &d));
  ck_assert(kiln__same_layout(&a, &a));
  kiln_arena_destroy(ar);
}
END_TEST

int main(void) {
  Suite *s = suite_create("buffer_assign");
  TCase *tc = tcase_create("assign");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, elementwise_chain_in_place_into_output);
  tcase_add_test(tc, parameters_never_written);
  tcase_add_test(tc, dead_buffers_reused_best_fit);
  tcase_add_test(tc, aliases_share_slots);
  tcase_add_test(tc, donated_parameter_written_in_place);
  tcase_add_test(tc, while_state_shared_and_updated_in_place);
  tcase_add_test(tc, scan_state_in_place_and_passed_through);
  tcase_add_test(tc, call_result_is_root_buffer);
  tcase_add_test(tc, conditional_branches_write_result_in_place);
  tcase_add_test(tc, refusals);
  tcase_add_test(tc, layout_predicates);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
