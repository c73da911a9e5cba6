/* Unit tests of the roofline cost model (compiler/passes/cost.c): exact
 * flops, bytes and times of single instructions, candidate fusions and
 * fusion instructions on small modules, and the peak-bytes measure of a
 * computation order (with the scheduler's before/after numbers). */
#include <math.h>

#include "compiler/passes/cost.h"
#include "test_fusion_harness.h"

/* A target with round numbers: 1 GFLOP/s, 1 GB/s, 1 us per launch. */
static const kiln_target T = {
    .name = "test", .backend = "cpu", .peak_flops = 1e9, .bandwidth = 1e9, .launch_overhead = 1e-6};

static kiln_module *parse(const char *text) {
  kiln_module *m = fh_parse(text, strlen(text), "cost.hlo");
  fh_verify(m, "cost.hlo");
  return m;
}

/* Instruction `name` of the entry computation. */
static const kiln_instr *find(const kiln_module *m, const char *name) {
  const kiln_computation *comp = kiln_module_entry(m);
  for (uint32_t i = 0; i < comp->ninstrs; i++)
    if (strcmp(m->instrs[comp->instrs[i]]->name, name) == 0) return m->instrs[comp->instrs[i]];
  ck_abort_msg("no instruction %s", name);
  return NULL;
}

#define ASSERT_NEAR(a, b) \
  ck_assert_msg(fabs((double)(a) - (double)(b)) <= 1e-12 * (fabs((double)(b)) + 1e-30), \
                "%s = %.17g, expected %.17g", #a, (double)(a), (double)(b))

static const char *k_mod =
    "HloModule m\n"
    "add_f32 {\n"
    "  a = f32[] parameter(0)\n"
    "  b = f32[] parameter(1)\n"
    "  ROOT s = f32[] add(a, b)\n"
    "}\n"
    "ENTRY main {\n"
    "  x = f32[1000] parameter(0)\n"
    "  y = f32[1000] parameter(1)\n"
    "  s = f32[] parameter(2)\n"
    "  a = f32[1000] add(x, y)\n"
    "  e = f32[1000] exponential(a)\n"
    "  q = f32[1000] divide(e, x)\n"
    "  sb = f32[1000] broadcast(s), dimensions={}\n"
    "  m = f32[1000] multiply(q, sb)\n"
    "  l = f32[32,64] parameter(3)\n"
    "  r = f32[64,128] parameter(4)\n"
    "  d = f32[32,128] dot(l, r), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    "  zero = f32[] constant(0)\n"
    "  red = f32[32] reduce(d, zero), dimensions={1}, to_apply=add_f32\n"
    "  sl = f32[10] slice(x), slice={[0:10]}\n"
    "  v = f32[10] parameter(5)\n"
    "  ve = f32[10] exponential(v)\n"
    "  vb = f32[10,100] broadcast(ve), dimensions={0}\n"
    "  ROOT o = (f32[1000], f32[32], f32[10], f32[10,100]) tuple(m, red, sl, vb)\n"
    "}\n";

START_TEST(test_op_flops) {
  ck_assert(kiln_cost_op_flops(KILN_OP_ADD) == 1);
  ck_assert(kiln_cost_op_flops(KILN_OP_SELECT) == 1);
  ck_assert(kiln_cost_op_flops(KILN_OP_CONVERT) == 1);
  ck_assert(kiln_cost_op_flops(KILN_OP_DIVIDE) == 4);
  ck_assert(kiln_cost_op_flops(KILN_OP_SQRT) == 4);
  ck_assert(kiln_cost_op_flops(KILN_OP_EXP) == 16);
  ck_assert(kiln_cost_op_flops(KILN_OP_TANH) == 16);
  ck_assert(kiln_cost_op_flops(KILN_OP_POWER) == 16);
  ck_assert(kiln_cost_op_flops(KILN_OP_BROADCAST) == 0);
  ck_assert(kiln_cost_op_flops(KILN_OP_DOT) == 0);
  ASSERT_NEAR(kiln_cost_time(&T, 2e9, 1e9), 2.0 + 1e-6); /* compute-bound */
  ASSERT_NEAR(kiln_cost_time(&T, 1e9, 3e9), 3.0 + 1e-6); /* memory-bound */
}
END_TEST

START_TEST(test_instr_costs) {
  kiln_module *m = (kiln_module *)parse(k_mod);
  kiln_cost c;
  /* add: 1000 flops; reads 2 x 4000 bytes, writes 4000. */
  kiln_cost_instr(m, find(m, "a"), &T, &c);
  ASSERT_NEAR(c.flops, 1000);
  ASSERT_NEAR(c.bytes, 12000);
  ASSERT_NEAR(c.seconds, 12e-6 + 1e-6);
  ck_assert_int_eq(c.kernels, 1);
  kiln_cost_instr(m, find(m, "e"), &T, &c);
  ASSERT_NEAR(c.flops, 16000);
  ASSERT_NEAR(c.bytes, 8000);
  ASSERT_NEAR(c.seconds, 16e-6 + 1e-6);
  /* dot: 2*K per output element = 2*64*32*128; bytes of both operands and the result. */
  kiln_cost_instr(m, find(m, "d"), &T, &c);
  ASSERT_NEAR(c.flops, 2.0 * 64 * 32 * 128);
  ASSERT_NEAR(c.bytes, (32.0 * 64 + 64 * 128 + 32 * 128) * 4);
  /* reduce: the reducer's one add per input element; the scalar init is read too. */
  kiln_cost_instr(m, find(m, "red"), &T, &c);
  ASSERT_NEAR(c.flops, 32.0 * 128);
  ASSERT_NEAR(c.bytes, 32.0 * 128 * 4 + 4 + 32 * 4);
  /* slice: reads only the sliced part. */
  kiln_cost_instr(m, find(m, "sl"), &T, &c);
  ASSERT_NEAR(c.flops, 0);
  ASSERT_NEAR(c.bytes, 80);
  /* broadcast: no flops, reads the scalar, writes the array. */
  kiln_cost_instr(m, find(m, "sb"), &T, &c);
  ASSERT_NEAR(c.flops, 0);
  ASSERT_NEAR(c.bytes, 4004);
  /* no kernel: parameter, constant, tuple. */
  kiln_cost_instr(m, find(m, "x"), &T, &c);
  ck_assert(c.seconds == 0 && c.kernels == 0 && c.bytes == 0);
  kiln_cost_instr(m, find(m, "zero"), &T, &c);
  ck_assert(c.seconds == 0 && c.kernels == 0);
  kiln_cost_instr(m, find(m, "o"), &T, &c);
  ck_assert(c.seconds == 0 && c.kernels == 0);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_group_costs) {
  kiln_module *m = (kiln_module *)parse(k_mod);
  kiln_id a = find(m, "a")->id, e = find(m, "e")->id, q = find(m, "q")->id;
  kiln_id sb = find(m, "sb")->id, mm = find(m, "m")->id;
  kiln_cost c;
  /* add -> exp -> divide(., x) -> multiply(., broadcast(s)) as one kernel:
   * reads x, y (x once although used twice) and s; writes m. Flops 1+16+4+1
   * per element; intermediates are free. */
  kiln_id g[] = {a, e, q, sb, mm};
  ck_assert_int_eq(kiln_cost_group(m, g, 5, &mm, 1, &T, &c), 0);
  ASSERT_NEAR(c.flops, 22000);
  ASSERT_NEAR(c.bytes, 4000 + 4000 + 4 + 4000);
  ASSERT_NEAR(c.seconds, 22e-6 + 1e-6);
  ck_assert_int_eq(c.kernels, 1);
  /* Separately: five kernels (broadcast and each op), much more traffic. */
  double sum = 0;
  for (int i = 0; i < 5; i++) {
    kiln_cost one;
    kiln_cost_instr(m, m->instrs[g[i]], &T, &one);
    sum += one.seconds;
  }
  ck_assert(c.seconds < sum);
  /* A second output costs its write: a and m both written. */
  kiln_id roots[] = {a, mm};
  ck_assert_int_eq(kiln_cost_group(m, g, 5, roots, 2, &T, &c), 0);
  ASSERT_NEAR(c.bytes, 4000 + 4000 + 4 + 4000 + 4000);
  /* Under a broadcast a producer runs once per output element: exp of 10
   * values broadcast 100 times costs 16 * 1000 flops, not 16 * 10. */
  kiln_id ve = find(m, "ve")->id, vb = find(m, "vb")->id;
  kiln_id g2[] = {ve, vb};
  ck_assert_int_eq(kiln_cost_group(m, g2, 2, &vb, 1, &T, &c), 0);
  ASSERT_NEAR(c.flops, 16000);
  ASSERT_NEAR(c.bytes, 40 + 4000);
  /* An input fusion: dot result reduced; the reduce reads each element once. */
  kiln_id red = find(m, "red")->id, zero = find(m, "zero")->id;
  kiln_id g3[] = {red, zero};
  ck_assert_int_eq(kiln_cost_group(m, g3, 2, &red, 1, &T, &c), 0);
  ASSERT_NEAR(c.flops, 32.0 * 128);
  ASSERT_NEAR(c.bytes, 32.0 * 128 * 4 + 32 * 4);
  kiln_module_destroy(m);
}
END_TEST

START_TEST(test_fusion_instr_cost) {
  /* A fusion instruction costs what its fused body costs as one kernel. */
  kiln_module *m = parse("HloModule m\n"
                         "f {\n"
                         "  p0 = f32[256] parameter(0)\n"
                         "  p1 = f32[] parameter(1)\n"
                         "  b = f32[256] broadcast(p1), dimensions={}\n"
                         "  e = f32[256] exponential(p0)\n"
                         "  ROOT r = f32[256] multiply(e, b)\n"
                         "}\n"
                         "ENTRY main {\n"
                         "  x = f32[256] parameter(0)\n"
                         "  s = f32[] parameter(1)\n"
                         "  ROOT fu = f32[256] fusion(x, s), kind=kLoop, calls=f\n"
                         "}\n");
  kiln_cost c;
  kiln_cost_instr(m, find(m, "fu"), &T, &c);
  ASSERT_NEAR(c.flops, 17 * 256);
  ASSERT_NEAR(c.bytes, 1024 + 4 + 1024);
  ASSERT_NEAR(c.seconds, 17 * 256e-9 + 1e-6); /* compute-bound */
  kiln_module_destroy(m);
}
END_TEST

static const char *k_interleaved =
    "HloModule m\n"
    "add_f32 {\n"
    "  a = f32[] parameter(0)\n"
    "  b = f32[] parameter(1)\n"
    "  ROOT s = f32[] add(a, b)\n"
    "}\n"
    "ENTRY main {\n"
    "  x = f32[128,128] parameter(0)\n"
    "  y = f32[128,128] parameter(1)\n"
    "  zero = f32[] constant(0)\n"
    "  a1 = f32[128,128] exponential(x)\n"
    "  b1 = f32[128,128] exponential(y)\n"
    "  a2 = f32[128,128] tanh(a1)\n"
    "  b2 = f32[128,128] tanh(b1)\n"
    "  ra = f32[128] reduce(a2, zero), dimensions={1}, to_apply=add_f32\n"
    "  rb = f32[128] reduce(b2, zero), dimensions={1}, to_apply=add_f32\n"
    "  t = (f32[128], f32[128]) tuple(ra, rb)\n"
    "  g = f32[128] get-tuple-element(t), index=0\n"
    "  ROOT s = f32[128] add(g, rb)\n"
    "}\n";

START_TEST(test_peak_bytes) {
  kiln_module *m = parse(k_interleaved);
  uint32_t e = m->entry;
  /* a1 + b1 + a2 live at once (tanh reads a1 while making a2): 3 x 64 KiB;
   * then b1, a2, b2 again 3 x 64 KiB. The tuple and get-tuple-element make
   * nothing new. */
  ck_assert_int_eq(kiln_cost_peak_bytes(m, e, NULL), 3 * 65536);
  /* Each chain finished before the next: at most 2 x 64 KiB plus a 512-byte
   * reduction result. */
  const kiln_computation *c = m->comps[e];
  kiln_id order[32];
  const char *names[] = {"x", "y", "zero", "a1", "a2", "ra", "b1", "b2", "rb", "t", "g", "s"};
  ck_assert_uint_eq(c->ninstrs, 12);
  for (int i = 0; i < 12; i++) order[i] = find(m, names[i])->id;
  ck_assert_int_eq(kiln_cost_peak_bytes(m, e, order), 2 * 65536 + 512);
  /* The scheduler finds that order (or one as good) and reports it. */
  int64_t before = kiln_cost_peak_bytes(m, e, NULL);
  fh_run_pass(m, kiln_pass_schedule, "schedule", NULL, 2);
  int64_t after = kiln_cost_peak_bytes(m, e, NULL);
  fprintf(stderr, "schedule: peak live bytes %lld before, %lld after\n", (long long)before,
          (long long)after);
  ck_assert_int_eq(after, 2 * 65536 + 512);
  ck_assert_int_eq(m->is_scheduled, 1);
  fh_verify(m, "scheduled");
  kiln_module_destroy(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cost");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_op_flops);
  tcase_add_test(tc, test_instr_costs);
  tcase_add_test(tc, test_group_costs);
  tcase_add_test(tc, test_fusion_instr_cost);
  tcase_add_test(tc, test_peak_bytes);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
