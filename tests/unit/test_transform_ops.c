/* The ops the transforms reach by lowering (async wrappers, batch norms,
 * maps, batch-grouped convolutions) and the collectives' transposes:
 * gradients and forward derivatives against central finite differences in
 * f64, vjp against jvp by the dot-product identity, vmap against running
 * every batch element; transposed collectives checked by structure over
 * several devices (the interpreter runs one) and by value over one. Last,
 * the rule table itself: every op has derivative and batching rules, is
 * lowered, or is on the documented list of ops without them; and `kiln
 * bench --transform`. */
#include <sys/wait.h>
#include <unistd.h>

#include "compiler/transforms/rules.h"
#include "tests/unit/test_transform_harness.h"

#define ADD_F64 "add { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT s = f64[] add(a, b) }\n"
#define N TX_NONE

/* grad (wrt all parameters), jvp and the vjp/jvp identity of one module. */
static void diff_all(const char *text, const char *grad_spec, uint64_t seed, double lo, double hi) {
  tx_case = text;
  tx_check_grad(text, grad_spec, seed, lo, hi);
  tx_check_jvp(text, seed + 1, lo, hi);
  tx_check_vjp_dot(text, seed + 2, lo, hi);
}

static void vmap_case(const char *text, const char *spec, const int64_t *in, uint32_t nout) {
  int64_t out[8] = {0};
  ck_assert(nout <= 8);
  tx_case = text;
  tx_check_vmap(text, spec, in, out, 5);
}

/* The last instruction of op `op` in the ENTRY (in a vjp: the backward
 * one), or NULL. */
static const kiln_instr *find_op(const kiln_module *m, kiln_opcode op) {
  const kiln_computation *e = kiln_module_entry(m);
  for (uint32_t i = e->ninstrs; i-- > 0;)
    if (m->instrs[e->instrs[i]]->op == op) return m->instrs[e->instrs[i]];
  return NULL;
}

static void expect_ints(const kiln_instr *ins, kiln_attr_key key, const int64_t *want, uint32_t n) {
  const kiln_i64s *l = kiln_instr_attr_ints(ins, key);
  ck_assert_msg(l != NULL, "%s lacks attribute %d", ins->name, (int)key);
  ck_assert_uint_eq(l->n, n);
  for (uint32_t i = 0; i < n; i++) ck_assert_int_eq(l->v[i], want[i]);
}

/* ---- async wrappers ------------------------------------------------------- */

static const char *k_async =
    "HloModule m\n" ADD_F64 "wrapped { p = f64[4] parameter(0)  q = f64[4] parameter(1)  s = "
    "f64[4] sine(p)  ROOT r = f64[4] multiply(s, q) }\n"
    "ENTRY main { x = f64[4] parameter(0)  y = f64[4] parameter(1)\n"
    "  st = ((f64[4], f64[4]), f64[4], s32[]) async-start(x, y), calls=wrapped\n"
    "  up = ((f64[4], f64[4]), f64[4], s32[]) async-update(st), calls=wrapped\n"
    "  d = f64[4] async-done(up), calls=wrapped\n"
    "  ns = ((f64[4]), f64[4]) tanh-start(d)  nd = f64[4] tanh-done(ns)\n"
    "  e = f64[4] exponential(x)  z = f64[] constant(0)  m = f64[4] multiply(nd, e)\n"
    "  ROOT r = f64[] reduce(m, z), dimensions={0}, to_apply=add }\n";

START_TEST(test_async_wrappers) {
  diff_all(k_async, "grad:wrt=0,1", 11, -1, 1);
  const int64_t in[] = {0, 0}, in2[] = {N, 0};
  vmap_case(k_async, "vmap:size=3", in, 1);
  vmap_case(k_async, "vmap:in_axes=none,0,size=3", in2, 1);
  /* the transformed program runs the wrapped ops synchronously */
  kiln_module *g = tx_apply(k_async, "grad");
  ck_assert_ptr_null(find_op(g, KILN_OP_ASYNC_START));
  ck_assert_ptr_null(find_op(g, KILN_OP_ASYNC_DONE));
  ck_assert_ptr_nonnull(find_op(g, KILN_OP_TANH));
  kiln_module_destroy(g);
  /* a failing transform leaves the entry as it was */
  const char *bad =
      "HloModule m\n"
      "w { p = f64[3] parameter(0)  ROOT c = f64[3] custom-call(p), custom_call_target=\"k\" }\n"
      "ENTRY main { x = f64[3] parameter(0)  st = ((f64[3]), f64[3], s32[]) async-start(x), "
      "calls=w\n"
      "  ROOT d = f64[3] async-done(st), calls=w }\n";
  kiln_module *m = tx_parse(bad);
  kiln_transform t;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_transform_parse("jvp", &t, &st), 0);
  ck_assert_int_eq(kiln_transforms_apply(m, &t, 1, &st), KILN_EUNIMPL);
  ck_assert_msg(strstr(st.msg, "custom-call target \"k\"") != NULL, "%s", st.msg);
  ck_assert_str_eq(kiln_module_entry(m)->name, "main");
  ck_assert_ptr_nonnull(find_op(m, KILN_OP_ASYNC_START));
  kiln_module_destroy(m);
}
END_TEST

/* The -start/-done forms of the collectives and of copy, over one device. */
static const char *k_starts =
    "HloModule m, replica_count=1\n" ADD_F64 "ENTRY main { x = f64[2,3] parameter(0)\n"
    "  ags = (f64[2,3], f64[2,3]) all-gather-start(x), dimensions={1}, replica_groups={{0}}\n"
    "  agd = f64[2,3] all-gather-done(ags)\n"
    "  cps = (f64[2,3], f64[2,3], u32[], u32[]) collective-permute-start(agd), "
    "source_target_pairs={{0,0}}\n"
    "  cpd = f64[2,3] collective-permute-done(cps)\n"
    "  ars = f64[2,3] all-reduce-start(cpd), replica_groups={{0}}, to_apply=add\n"
    "  ard = f64[2,3] all-reduce-done(ars)\n"
    "  cs = (f64[2,3], f64[2,3], u32[]) copy-start(ard)  cd = f64[2,3] copy-done(cs)\n"
    "  s = f64[2,3] sine(cd)  z = f64[] constant(0)\n"
    "  ROOT r = f64[] reduce(s, z), dimensions={0,1}, to_apply=add }\n";

START_TEST(test_collective_starts) {
  diff_all(k_starts, "grad", 21, -1, 1);
  const int64_t in[] = {0};
  vmap_case(k_starts, "vmap:size=2", in, 1);
  const int64_t in1[] = {1};
  vmap_case(k_starts, "vmap:in_axes=1,size=2", in1, 1);
}
END_TEST

/* ---- batch norms ---------------------------------------------------------- */

START_TEST(test_batch_norm) {
  /* sum(y^2) + sum(var) + sum(mean): every output reaches the scalar */
  const char *train =
      "HloModule m\n" ADD_F64 "ENTRY main { x = f64[2,3,4] parameter(0)  sc = f64[3] parameter(1)  "
      "of = f64[3] parameter(2)\n"
      "  bn = (f64[2,3,4], f64[3], f64[3]) batch-norm-training(x, sc, of), epsilon=0.001, "
      "feature_index=1\n"
      "  y = f64[2,3,4] get-tuple-element(bn), index=0  mu = f64[3] get-tuple-element(bn), "
      "index=1\n"
      "  v = f64[3] get-tuple-element(bn), index=2  y2 = f64[2,3,4] multiply(y, y)  z = f64[] "
      "constant(0)\n"
      "  s = f64[] reduce(y2, z), dimensions={0,1,2}, to_apply=add  mv = f64[3] add(mu, v)\n"
      "  s2 = f64[] reduce(mv, z), dimensions={0}, to_apply=add  ROOT r = f64[] add(s, s2) }\n";
  diff_all(train, "grad:wrt=0,1,2", 31, -1, 1);
  const char *infer =
      "HloModule m\n" ADD_F64
      "ENTRY main { x = f64[3,2] parameter(0)  sc = f64[2] parameter(1)  of = f64[2] parameter(2)\n"
      "  mu = f64[2] parameter(3)  v = f64[2] parameter(4)\n"
      "  y = f64[3,2] batch-norm-inference(x, sc, of, mu, v), epsilon=0.01, feature_index=1\n"
      "  y2 = f64[3,2] multiply(y, y)  z = f64[] constant(0)\n"
      "  ROOT s = f64[] reduce(y2, z), dimensions={0,1}, to_apply=add }\n";
  diff_all(infer, "grad:wrt=0,1,2,3,4", 34, 0.2, 1);
  const char *grad =
      "HloModule m\n" ADD_F64 "ENTRY main { x = f64[2,2,3] parameter(0)  sc = f64[2] parameter(1)  "
      "mu = f64[2] parameter(2)\n"
      "  v = f64[2] parameter(3)  dy = f64[2,2,3] parameter(4)\n"
      "  g = (f64[2,2,3], f64[2], f64[2]) batch-norm-grad(x, sc, mu, v, dy), epsilon=0.001, "
      "feature_index=1\n"
      "  gx = f64[2,2,3] get-tuple-element(g), index=0  gs = f64[2] get-tuple-element(g), index=1\n"
      "  go = f64[2] get-tuple-element(g), index=2  gx2 = f64[2,2,3] multiply(gx, gx)  z = f64[] "
      "constant(0)\n"
      "  s = f64[] reduce(gx2, z), dimensions={0,1,2}, to_apply=add  gg = f64[2] multiply(gs, go)\n"
      "  s2 = f64[] reduce(gg, z), dimensions={0}, to_apply=add  ROOT r = f64[] add(s, s2) }\n";
  diff_all(grad, "grad:wrt=0,1,2,3,4", 37, 0.2, 1);
  const int64_t in3[] = {0, N, N}, in5[] = {1, 0, N, N, 0};
  vmap_case(train, "vmap:in_axes=0,none,none,size=3", in3, 1);
  vmap_case(grad, "vmap:in_axes=1,0,none,none,0,size=2", in5, 1);
}
END_TEST

/* ---- map ------------------------------------------------------------------ */

START_TEST(test_map) {
  const char *mp =
      "HloModule m\n" ADD_F64 "f { a = f64[] parameter(0)  b = f64[] parameter(1)  s = f64[] "
      "sine(a)  c = f64[] constant(2)\n"
      "  t = f64[] multiply(s, c)  ROOT r = f64[] multiply(t, b) }\n"
      "ENTRY main { x = f64[2,3] parameter(0)  y = f64[2,3] parameter(1)\n"
      "  mm = f64[2,3] map(x, y), dimensions={0,1}, to_apply=f  z = f64[] constant(0)\n"
      "  ROOT r = f64[] reduce(mm, z), dimensions={0,1}, to_apply=add }\n";
  diff_all(mp, "grad:wrt=0,1", 41, -1, 1);
  const int64_t in[] = {0, N};
  vmap_case(mp, "vmap:in_axes=0,none,size=2", in, 1);
  /* a body that is not elementwise stays a map: batchable, not differentiable */
  const char *loop =
      "HloModule m\n"
      "g { a = f64[] parameter(0)  ROOT c = f64[] custom-call(a), custom_call_target=\"k\" }\n"
      "ENTRY main { x = f64[3] parameter(0)  ROOT mm = f64[3] map(x), dimensions={0}, to_apply=g "
      "}\n";
  tx_expect_fail(
      loop, "jvp", KILN_EUNIMPL,
      "main/mm: jvp: op map (main/mm) is not differentiable: its computation g is not elementwise");
  kiln_module *v = tx_apply(loop, "vmap:size=2");
  ck_assert_ptr_nonnull(find_op(v, KILN_OP_MAP));
  kiln_module_destroy(v);
}
END_TEST

/* ---- batch-grouped convolution -------------------------------------------- */

START_TEST(test_batch_group_convolution) {
  /* the kernel gradient of a depthwise convolution has this form */
  const char *bg = "HloModule m\n" ADD_F64
                   "ENTRY main { x = f64[4,6,2] parameter(0)  k = f64[3,2,4] parameter(1)\n"
                   "  c = f64[2,4,4] convolution(x, k), window={size=3}, dim_labels=b0f_0io->b0f, "
                   "batch_group_count=2\n"
                   "  s = f64[2,4,4] sine(c)  z = f64[] constant(0)\n"
                   "  ROOT r = f64[] reduce(s, z), dimensions={0,1,2}, to_apply=add }\n";
  diff_all(bg, "grad:wrt=0,1", 51, -1, 1);
  const int64_t in[] = {0, N}, in2[] = {N, 2}, in3[] = {1, 0};
  vmap_case(bg, "vmap:in_axes=0,none,size=2", in, 1);
  /* a batched kernel, lowered to feature groups: batched kernels of
   * grouped convolutions, with and without a batched input */
  vmap_case(bg, "vmap:in_axes=none,2,size=2", in2, 1);
  vmap_case(bg, "vmap:in_axes=1,0,size=2", in3, 1);
  /* strided, padded, spatial dims first */
  const char *bg2 = "HloModule m\n" ADD_F64
                    "ENTRY main { x = f64[5,2,3] parameter(0)  k = f64[2,2,6] parameter(1)\n"
                    "  c = f64[3,6,1] convolution(x, k), window={size=2 stride=2 pad=1_0}, "
                    "dim_labels=0fb_0io->0fb, "
                    "batch_group_count=3\n"
                    "  s = f64[3,6,1] multiply(c, c)  z = f64[] constant(0)\n"
                    "  ROOT r = f64[] reduce(s, z), dimensions={0,1,2}, to_apply=add }\n";
  diff_all(bg2, "grad:wrt=0,1", 54, -1, 1);
  /* grad of grad through a depthwise convolution: the inner gradient's
   * batch-grouped kernel convolution is differentiated by the outer one */
  const char *dw = "HloModule m\n" ADD_F64
                   "ENTRY main { x = f64[2,5,2] parameter(0)  k = f64[2,1,2] parameter(1)\n"
                   "  c = f64[2,4,2] convolution(x, k), window={size=2}, dim_labels=b0f_0io->b0f, "
                   "feature_group_count=2\n"
                   "  s = f64[2,4,2] sine(c)  z = f64[] constant(0)\n"
                   "  ROOT r = f64[] reduce(s, z), dimensions={0,1,2}, to_apply=add }\n";
  const int64_t dn[] = {N, 0}, db[] = {0, 0};
  vmap_case(dw, "vmap:in_axes=none,0,size=3", dn, 1);
  vmap_case(dw, "vmap:size=3", db, 1);
  const char *specs[] = {"grad:wrt=1", "jvp", NULL};
  kiln_module *hv = tx_apply_list(dw, specs, NULL);
  kiln_module_destroy(hv);
}
END_TEST

/* ---- triangular-solve ------------------------------------------------------ */

START_TEST(test_triangular_solve) {
  /* a = random + 3 I keeps the solves well conditioned; every combination
   * of side, triangle, transpose and unit diagonal, with a batch dim */
  for (int k = 0; k < 16; k++) {
    bool left = k & 1, lower = k & 2, trans = k & 4, unit = k & 8;
    char text[2048];
    const char *bs = left ? "f64[2,3,2]" : "f64[2,2,3]";
    snprintf(text, sizeof text,
             "HloModule m\n" ADD_F64
             "ENTRY main { a0 = f64[2,3,3] parameter(0)  b = %s parameter(1)\n"
             "  i = f64[3,3] constant({{3,0,0},{0,3,0},{0,0,3}})  ib = f64[2,3,3] broadcast(i), "
             "dimensions={1,2}\n"
             "  a = f64[2,3,3] add(a0, ib)\n"
             "  x = %s triangular-solve(a, b), left_side=%s, lower=%s, unit_diagonal=%s, "
             "transpose_a=%s\n"
             "  s = %s sine(x)  z = f64[] constant(0)\n"
             "  ROOT r = f64[] reduce(s, z), dimensions={0,1,2}, to_apply=add }\n",
             bs, bs, left ? "true" : "false", lower ? "true" : "false", unit ? "true" : "false",
             trans ? "TRANSPOSE" : "NO_TRANSPOSE", bs);
    diff_all(text, "grad:wrt=0,1", 90 + 3 * k, -1, 1);
  }
  const char *ts = "HloModule m\n"
                   "ENTRY main { a0 = f64[3,3] parameter(0)  b = f64[3,2] parameter(1)\n"
                   "  i = f64[3,3] constant({{3,0,0},{0,3,0},{0,0,3}})  a = f64[3,3] add(a0, i)\n"
                   "  ROOT x = f64[3,2] triangular-solve(a, b), left_side=true, lower=true, "
                   "transpose_a=NO_TRANSPOSE }\n";
  const int64_t in[] = {0, N}, in2[] = {N, 1};
  vmap_case(ts, "vmap:in_axes=0,none,size=2", in, 1);
  vmap_case(ts, "vmap:in_axes=none,1,size=2", in2, 1);
}
END_TEST

START_TEST(test_cholesky) {
  for (int lower = 0; lower < 2; lower++) {
    char text[2048];
    /* through a0 a0^T + 3 I (both triangles move) and a1 + 4 I (only the
     * triangle the op reads matters) */
    snprintf(text, sizeof text,
             "HloModule m\n" ADD_F64
             "ENTRY main { a0 = f64[2,3,3] parameter(0)  a1 = f64[2,3,3] parameter(1)\n"
             "  p = f64[2,3,3] dot(a0, a0), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
             "rhs_batch_dims={0}, "
             "rhs_contracting_dims={2}\n"
             "  i = f64[3,3] constant({{1,0,0},{0,1,0},{0,0,1}})  ib = f64[2,3,3] broadcast(i), "
             "dimensions={1,2}\n"
             "  i3 = f64[2,3,3] multiply(ib, ib)  c3 = f64[] constant(3)  b3 = f64[2,3,3] "
             "broadcast(c3), dimensions={}\n"
             "  d3 = f64[2,3,3] multiply(i3, b3)  c4 = f64[] constant(4)  b4 = f64[2,3,3] "
             "broadcast(c4), dimensions={}\n"
             "  d4 = f64[2,3,3] multiply(ib, b4)  s0 = f64[2,3,3] add(p, d3)  s1 = f64[2,3,3] "
             "add(a1, d4)\n"
             "  l0 = f64[2,3,3] cholesky(s0), lower=%s  l1 = f64[2,3,3] cholesky(s1), lower=%s\n"
             "  m = f64[2,3,3] multiply(l0, l1)  s = f64[2,3,3] sine(m)  z = f64[] constant(0)\n"
             "  ROOT r = f64[] reduce(s, z), dimensions={0,1,2}, to_apply=add }\n",
             lower ? "true" : "false", lower ? "true" : "false");
    diff_all(text, "grad:wrt=0,1", 140 + 3 * lower, -1, 1);
  }
  const char *ch =
      "HloModule m\n"
      "ENTRY main { a0 = f64[3,3] parameter(0)  i = f64[3,3] constant({{4,0,0},{0,4,0},{0,0,4}})\n"
      "  a = f64[3,3] add(a0, i)  ROOT l = f64[3,3] cholesky(a), lower=true }\n";
  const int64_t in[] = {1};
  vmap_case(ch, "vmap:in_axes=1,size=2", in, 1);
}
END_TEST

/* ---- collectives ---------------------------------------------------------- */

/* Over one device every collective is an identity (or a copy): values. */
START_TEST(test_collectives_one_device) {
  static const char *ops[] = {
      "f64[2,3] all-gather(x), dimensions={1}, replica_groups={{0}}",
      "f64[2,3] all-gather(x), dimensions={0}",
      "f64[2,3] reduce-scatter(x), dimensions={1}, replica_groups={{0}}, to_apply=add",
      "f64[2,3] all-to-all(x), dimensions={0}, replica_groups={{0}}",
      "f64[2,3] collective-permute(x), source_target_pairs={{0,0}}",
      "f64[2,3] collective-broadcast(x), replica_groups={{0}}",
      "f64[2,3] collective-broadcast(x), replica_groups={}",
      "f64[2,3] all-reduce(x), replica_groups={{0}}, to_apply=add",
  };
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    char text[1024];
    snprintf(text, sizeof text,
             "HloModule m, replica_count=1\n" ADD_F64
             "ENTRY main { x = f64[2,3] parameter(0)  c = %s\n"
             "  s = f64[2,3] sine(c)  z = f64[] constant(0)\n"
             "  ROOT r = f64[] reduce(s, z), dimensions={0,1}, to_apply=add }\n",
             ops[i]);
    diff_all(text, "grad", 60 + 3 * i, -1, 1);
    const int64_t in[] = {0}, in1[] = {1};
    vmap_case(text, "vmap:size=2", in, 1);
    vmap_case(text, "vmap:in_axes=1,size=2", in1, 1);
  }
}
END_TEST

static kiln_module *vjp_of(const char *op_line, const char *xs) {
  static char text[2048];
  snprintf(text, sizeof text,
           "HloModule m, replica_count=4\n" ADD_F64
           "ENTRY main { x = %s parameter(0)\n  ROOT c = %s }\n",
           xs, op_line);
  return tx_apply(text, "vjp");
}

static void expect_groups(const kiln_instr *ins) {
  const kiln_attr *a = kiln_instr_attr(ins, KILN_ATTR_REPLICA_GROUPS);
  ck_assert_ptr_nonnull(a);
  ck_assert_uint_eq(a->v.groups->ngroups, 2);
  ck_assert_int_eq(a->v.groups->groups[0].v[0], 0);
  ck_assert_int_eq(a->v.groups->groups[0].v[1], 1);
  ck_assert_int_eq(a->v.groups->groups[1].v[0], 2);
  ck_assert_int_eq(a->v.groups->groups[1].v[1], 3);
}

/* Over four devices: the transposed program verifies and holds the
 * transposed collective with the expected attributes. */
START_TEST(test_collective_transposes) {
  const int64_t d1[] = {1}, d0[] = {0};
  kiln_module *m =
      vjp_of("f64[2,6] all-gather(x), dimensions={1}, replica_groups={{0,1},{2,3}}", "f64[2,3]");
  const kiln_instr *t = find_op(m, KILN_OP_REDUCE_SCATTER);
  ck_assert_ptr_nonnull(t);
  expect_ints(t, KILN_ATTR_DIMENSIONS, d1, 1);
  expect_groups(t);
  char *sig = tx_signature(m);
  ck_assert_str_eq(sig, "(f64[2,3], f64[2,6]) -> (f64[2,6], f64[2,3])");
  free(sig);
  ck_assert_ptr_nonnull(t->called);
  ck_assert_int_eq(kiln__tf_reducer_kind(m, t->called[0]), KILN__RED_ADD);
  kiln_module_destroy(m);

  m = vjp_of(
      "f64[1,3] reduce-scatter(x), dimensions={0}, replica_groups={{0,1},{2,3}}, to_apply=add",
      "f64[2,3]");
  t = find_op(m, KILN_OP_ALL_GATHER);
  ck_assert_ptr_nonnull(t);
  expect_ints(t, KILN_ATTR_DIMENSIONS, d0, 1);
  expect_groups(t);
  ck_assert_int_eq(t->shape.dims[0], 2);
  kiln_module_destroy(m);

  m = vjp_of("f64[4,3] all-to-all(x), dimensions={0}, replica_groups={{0,1},{2,3}}", "f64[4,3]");
  t = find_op(m, KILN_OP_ALL_TO_ALL);
  ck_assert_ptr_nonnull(t);
  ck_assert_uint_eq(t->noperands, 1);
  /* applied to the cotangent */
  ck_assert(m->instrs[t->operands[0]]->op == KILN_OP_PARAMETER &&
            m->instrs[t->operands[0]]->param_number == 1);
  expect_ints(t, KILN_ATTR_DIMENSIONS, d0, 1);
  kiln_module_destroy(m);

  m = vjp_of("f64[3] collective-permute(x), source_target_pairs={{0,1},{1,2},{2,3}}", "f64[3]");
  t = find_op(m, KILN_OP_COLLECTIVE_PERMUTE);
  ck_assert_ptr_nonnull(t);
  const int64_t inv[] = {1, 0, 2, 1, 3, 2};
  expect_ints(t, KILN_ATTR_SOURCE_TARGET_PAIRS, inv, 6);
  kiln_module_destroy(m);

  m = vjp_of("f64[3] collective-broadcast(x), replica_groups={{0,1},{2,3}}", "f64[3]");
  t = find_op(m, KILN_OP_ALL_REDUCE);
  ck_assert_ptr_nonnull(t);
  expect_groups(t);
  ck_assert_ptr_nonnull(find_op(m, KILN_OP_REPLICA_ID));
  kiln_module_destroy(m);

  /* a max reduce-scatter is not linear */
  tx_expect_fail(
      "HloModule m, replica_count=2\n"
      "mx { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT s = f64[] maximum(a, b) }\n"
      "ENTRY main { x = f64[2,3] parameter(0)\n"
      "  ROOT c = f64[1,3] reduce-scatter(x), dimensions={0}, replica_groups={{0,1}}, to_apply=mx "
      "}\n",
      "vjp", KILN_EINVAL, "vjp: op reduce-scatter (main/c) is not differentiable");
}
END_TEST

/* vmap over four devices: the batch rides along as a leading dimension. */
START_TEST(test_collective_batching) {
  const char *ag =
      "HloModule m, replica_count=4\nENTRY main { x = f64[2,3] parameter(0)\n"
      "  ROOT c = f64[2,6] all-gather(x), dimensions={1}, replica_groups={{0,1},{2,3}} }\n";
  kiln_module *m = tx_apply(ag, "vmap:size=5");
  const kiln_instr *t = find_op(m, KILN_OP_ALL_GATHER);
  const int64_t d2[] = {2};
  ck_assert_ptr_nonnull(t);
  expect_ints(t, KILN_ATTR_DIMENSIONS, d2, 1);
  char *sig = tx_signature(m);
  ck_assert_str_eq(sig, "(f64[5,2,3]) -> f64[5,2,6]");
  free(sig);
  kiln_module_destroy(m);
  const char *rs =
      "HloModule m, replica_count=2\n" ADD_F64 "ENTRY main { x = f64[2,3] parameter(0)\n"
      "  ROOT c = f64[1,3] reduce-scatter(x), dimensions={0}, replica_groups={{0,1}}, to_apply=add "
      "}\n";
  m = tx_apply(rs, "vmap:in_axes=1,size=4");
  sig = tx_signature(m);
  ck_assert_str_eq(sig, "(f64[2,4,3]) -> f64[4,1,3]");
  free(sig);
  const int64_t d1[] = {1};
  expect_ints(find_op(m, KILN_OP_REDUCE_SCATTER), KILN_ATTR_DIMENSIONS, d1, 1);
  kiln_module_destroy(m);
  const char *cp = "HloModule m, replica_count=2\nENTRY main { x = f64[3] parameter(0)\n"
                   "  ROOT c = f64[3] collective-permute(x), source_target_pairs={{0,1},{1,0}} }\n";
  m = tx_apply(cp, "vmap:size=2");
  sig = tx_signature(m);
  ck_assert_str_eq(sig, "(f64[2,3]) -> f64[2,3]");
  free(sig);
  kiln_module_destroy(m);
}
END_TEST

/* ---- kiln bench --transform ----------------------------------------------- */

START_TEST(test_bench_transform) {
  char kiln[4096], dir[] = "/tmp/kiln_txops_XXXXXX", path[4200], cmd[12000], out[4096] = "";
  snprintf(kiln, sizeof kiln, "%s/kiln", KILN_BINARY_DIR);
  FILE *f = fopen(kiln, "rb");
  if (f == NULL) {
    fprintf(stderr, "test_bench_transform: skipped, %s is not built\n", kiln);
    return;
  }
  fclose(f);
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/bn.hlo", dir);
  f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs("HloModule m\n" ADD_F64
        "ENTRY main { x = f64[2,3] parameter(0)  s = f64[2,3] sine(x)  z = f64[] constant(0)\n"
        "  ROOT r = f64[] reduce(s, z), dimensions={0,1}, to_apply=add }\n",
        f);
  fclose(f);
  snprintf(
      cmd, sizeof cmd,
      "'%s' bench '%s' --backend interp --iters 2 --transform grad --transform vmap:size=3 2>&1",
      kiln, path);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  ck_assert_int_eq(pclose(p), 0);
  ck_assert_msg(strstr(out, "\"transforms\": [\"grad\", \"vmap:size=3\"], \"iters\": 2") != NULL,
                "%s", out);
  snprintf(cmd, sizeof cmd, "'%s' bench '%s' --backend interp --transform vmap 2>&1", kiln, path);
  p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  ck_assert_int_eq(WEXITSTATUS(pclose(p)), 2);
  ck_assert_str_eq(
      out, "kiln bench: --transform 'vmap': the arguments are random, so vmap needs its batch size "
           "(size=N)\n");
  remove(path);
  rmdir(dir);
}
END_TEST

/* ---- the rule table ------------------------------------------------------- */

static bool listed(const kiln__no_rule *l, uint32_t n, kiln_opcode op) {
  return kiln__tf_no_rule_why(l, n, op) != NULL;
}

/* ---- complex values and fft ---------------------------------------------- */

/* z = complex(x, y) through holomorphic arithmetic, abs, real and imag,
 * back to a real scalar: gradients against finite differences in x and y
 * (the conventions only show through real parameters and outputs). */
static const char *k_complex =
    "HloModule m\n" ADD_F64 "ENTRY main { x = f64[3] parameter(0)  y = f64[3] parameter(1)\n"
    "  z = c128[3] complex(x, y)  zz = c128[3] multiply(z, z)  zx = c128[3] convert(x)\n"
    "  q = c128[3] divide(zz, zx)  a = f64[3] abs(q)  s = c128[3] subtract(q, z)\n"
    "  re = f64[3] real(s)  im = f64[3] imag(zz)  n = c128[3] negate(z)  ee = f64[3] imag(n)\n"
    "  t = f64[3] add(re, im)  u = f64[3] multiply(t, a)  v = f64[3] add(u, ee)\n"
    "  zero = f64[] constant(0)  ROOT r = f64[] reduce(v, zero), dimensions={0}, to_apply=add }\n";

/* fft of each type, each followed by real and imag parts so that outputs are real. */
#define FFT_CASE(decl, body) \
  "HloModule m\n" ADD_F64 "ENTRY main { " decl "\n" body "\n" \
  "  zero = f64[] constant(0)  ROOT r = f64[] reduce(o, zero), dimensions={0,1}, to_apply=add }\n"

static const char *k_fft =
    FFT_CASE("x = f64[2,4] parameter(0)  y = f64[2,4] parameter(1)",
             "  z = c128[2,4] complex(x, y)  f = c128[2,4] fft(z), fft_type=FFT, fft_length={2,4}\n"
             "  g = c128[2,4] fft(f), fft_type=IFFT, fft_length={4}  h = c128[2,4] multiply(g, f)\n"
             "  re = f64[2,4] real(h)  im = f64[2,4] imag(f)  sq = f64[2,4] multiply(im, im)\n"
             "  o = f64[2,4] add(re, sq)");
static const char *k_rfft_even =
    FFT_CASE("x = f64[2,6] parameter(0)  w = f64[2,4] parameter(1)",
             "  f = c128[2,4] fft(x), fft_type=RFFT, fft_length={6}  a = f64[2,4] abs(f)\n"
             "  im = f64[2,4] imag(f)  m = f64[2,4] multiply(im, w)  o = f64[2,4] add(a, m)");
static const char *k_rfft_odd =
    FFT_CASE("x = f64[3,5] parameter(0)  w = f64[3,3] parameter(1)",
             "  f = c128[3,3] fft(x), fft_type=RFFT, fft_length={3,5}  re = f64[3,3] real(f)\n"
             "  im = f64[3,3] imag(f)  m = f64[3,3] multiply(im, w)  o = f64[3,3] add(re, m)");
static const char *k_irfft_even =
    FFT_CASE("x = f64[2,4] parameter(0)  y = f64[2,4] parameter(1)  w = f64[2,6] parameter(2)",
             "  z = c128[2,4] complex(x, y)  f = f64[2,6] fft(z), fft_type=IRFFT, fft_length={6}\n"
             "  ff = f64[2,6] multiply(f, f)  o = f64[2,6] multiply(ff, w)");
static const char *k_irfft_odd = FFT_CASE(
    "x = f64[2,3] parameter(0)  y = f64[2,3] parameter(1)  w = f64[2,5] parameter(2)",
    "  z = c128[2,3] complex(x, y)  f = f64[2,5] fft(z), fft_type=IRFFT, fft_length={2,5}\n"
    "  ff = f64[2,5] multiply(f, f)  o = f64[2,5] multiply(ff, w)");

START_TEST(test_complex_and_fft) {
  diff_all(k_complex, "grad:wrt=0,1", 41, 0.5, 1.5);
  diff_all(k_fft, "grad:wrt=0,1", 42, -1, 1);
  diff_all(k_rfft_even, "grad:wrt=0,1", 43, -1, 1);
  diff_all(k_rfft_odd, "grad:wrt=0,1", 44, -1, 1);
  diff_all(k_irfft_even, "grad:wrt=0,1,2", 45, -1, 1);
  diff_all(k_irfft_odd, "grad:wrt=0,1,2", 46, -1, 1);
  const int64_t in2[] = {0, 0}, in3[] = {0, 0, 0}, in_mix[] = {1, N};
  vmap_case(k_complex, "vmap:size=3", in2, 1);
  vmap_case(k_fft, "vmap:size=3", in2, 1);
  vmap_case(k_rfft_odd, "vmap:in_axes=1,none,size=2", in_mix, 1);
  vmap_case(k_irfft_even, "vmap:size=2", in3, 1);
  /* vmap of grad: per-example gradients through fft */
  const char *ps[] = {"grad:wrt=0,1", "vmap:size=2", NULL};
  kiln_transform_stats stats;
  kiln_module *pg = tx_apply_list(k_rfft_even, ps, &stats);
  ck_assert_ptr_nonnull(find_op(pg, KILN_OP_FFT));
  kiln_module_destroy(pg);
  /* the transpose of FFT is an FFT of the cotangent (no conjugation) */
  kiln_module *g = tx_apply(k_rfft_even, "grad");
  const kiln_instr *f = find_op(g, KILN_OP_FFT);
  ck_assert_ptr_nonnull(f);
  ck_assert_str_eq(kiln_instr_attr_str(f, KILN_ATTR_FFT_TYPE), "FFT");
  kiln_module_destroy(g);
  /* the transpose of real-to-complex convert is real(), never a
   * complex-to-real convert (XLA has none) */
  kiln_module *gc = tx_apply(k_complex, "grad:wrt=0,1");
  const kiln_computation *e = kiln_module_entry(gc);
  for (uint32_t i = 0; i < e->ninstrs; i++) {
    const kiln_instr *ci = gc->instrs[e->instrs[i]];
    if (ci->op == KILN_OP_CONVERT)
      ck_assert_msg(!kiln_dtype_is_complex(gc->instrs[ci->operands[0]]->shape.dtype) ||
                        kiln_dtype_is_complex(ci->shape.dtype),
                    "%s converts complex to real", ci->name);
  }
  kiln_module_destroy(gc);
  /* sign has no zero derivative on complex values */
  tx_expect_fail("HloModule m\nENTRY main { x = f64[2] parameter(0)  z = c128[2] convert(x)\n"
                 "  s = c128[2] sign(z)  ROOT r = f64[2] real(s) }\n",
                 "jvp", KILN_EUNIMPL,
                 "jvp: op sign (main/s) has no derivative rule on complex values");
  /* grad needs a real output */
  tx_expect_fail("HloModule m\nENTRY main { x = f64[] parameter(0)  ROOT z = c128[] convert(x) }\n",
                 "grad", KILN_EINVAL,
                 "grad: output 0 is c128[]; grad needs a floating-point scalar");
}
END_TEST

START_TEST(test_rule_table_coverage) {
  /* every op: rules, lowered, or documented as without (never both) */
  kiln_sbuf nd = KILN_SBUF_INIT, nb = KILN_SBUF_INIT, nl = KILN_SBUF_INIT;
  for (int op = 0; op < KILN_OP_COUNT; op++) {
    const kiln__rule *r = &kiln__tf_rules[op];
    bool diff = (r->jvp && r->vjp) || r->lowered, bat = r->batch || r->lowered;
    bool ld = listed(kiln__tf_no_derivative, kiln__tf_no_derivative_count, (kiln_opcode)op);
    bool lb = listed(kiln__tf_no_batching, kiln__tf_no_batching_count, (kiln_opcode)op);
    ck_assert_msg(diff != ld, "op %s: derivative rules %d, listed without %d",
                  kiln_opcode_name((kiln_opcode)op), diff, ld);
    ck_assert_msg(bat != lb, "op %s: batching rule %d, listed without %d",
                  kiln_opcode_name((kiln_opcode)op), bat, lb);
    ck_assert_msg(r->lowered == kiln__tf_lowered_op((kiln_opcode)op),
                  "op %s: lowered mark disagrees with lower.c", kiln_opcode_name((kiln_opcode)op));
    if (r->lowered)
      kiln_sbuf_printf(&nl, "%s%s", nl.len ? " " : "", kiln_opcode_name((kiln_opcode)op));
    if (ld) kiln_sbuf_printf(&nd, "%s%s", nd.len ? " " : "", kiln_opcode_name((kiln_opcode)op));
    if (lb) kiln_sbuf_printf(&nb, "%s%s", nb.len ? " " : "", kiln_opcode_name((kiln_opcode)op));
  }
  /* the documented lists, exactly */
  ck_assert_str_eq(
      kiln_sbuf_str(&nd),
      "invalid parameter constant iota count-leading-zeros bitcast-convert is-finite not "
      "popcnt "
      "and compare or shift-left shift-right-arithmetic shift-right-logical xor "
      "stochastic-convert dynamic-reshape get-dimension-size set-dimension-size "
      "custom-call rng rng-bit-generator rng-get-and-update-state after-all "
      "infeed "
      "outfeed send send-done recv recv-done replica-id partition-id ragged-all-to-all");
  ck_assert_str_eq(
      kiln_sbuf_str(&nb),
      "invalid parameter dynamic-reshape set-dimension-size custom-call ragged-all-to-all");
  /* the rows lower.c rewrites (it reads this column, so these are exactly
   * the ops lowered before a transform) */
  ck_assert_str_eq(kiln_sbuf_str(&nl),
                   "convolution map batch-norm-training batch-norm-inference batch-norm-grad "
                   "async-start async-update async-done copy-start copy-done all-reduce-start "
                   "all-reduce-done all-gather-start all-gather-done collective-permute-start "
                   "collective-permute-done");
  kiln_sbuf_free(&nd);
  kiln_sbuf_free(&nb);
  kiln_sbuf_free(&nl);
  /* a refusal names the op and the reason */
  tx_expect_fail("HloModule m\nENTRY main { x = f64[] parameter(0)  one = f64[] constant(1)\n"
                 "  r = f64[3] rng(x, one), distribution=rng_uniform  ROOT y = f64[3] sine(r) }\n",
                 "jvp", KILN_EINVAL,
                 "main/r: jvp: op rng (main/r) is not differentiable: random values");
}
END_TEST

int main(void) {
  Suite *s = suite_create("transform_ops");
  TCase *tc = tcase_create("ops");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_async_wrappers);
  tcase_add_test(tc, test_collective_starts);
  tcase_add_test(tc, test_batch_norm);
  tcase_add_test(tc, test_map);
  tcase_add_test(tc, test_batch_group_convolution);
  tcase_add_test(tc, test_triangular_solve);
  tcase_add_test(tc, test_cholesky);
  tcase_add_test(tc, test_collectives_one_device);
  tcase_add_test(tc, test_collective_transposes);
  tcase_add_test(tc, test_collective_batching);
  tcase_add_test(tc, test_complex_and_fft);
  tcase_add_test(tc, test_rule_table_coverage);
  tcase_add_test(tc, test_bench_transform);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
