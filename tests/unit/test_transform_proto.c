/* The wire form of transforms (compiler/transforms/transform_proto.c):
 * every spec the CLI accepts survives spec -> kiln_transform ->
 * kiln.v1.Transform -> bytes -> kiln.v1.Transform -> kiln_transform with
 * its meaning (the canonical spec text is the same); grad carries
 * with_value; vmap sizes are inferred from argument shapes; malformed
 * messages are INVALID and fields that cannot be honoured are
 * UNIMPLEMENTED, naming the field; grad without its value drops it. */
#include <check.h>
#include <string.h>

#include "common/alloc.h"
#include "common/arena.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/transforms/transform_proto.h"

/* Through the bytes of the wire and back. */
static void roundtrip(const char *spec, const char *want) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_arena *a = kiln_arena_create();
  Kiln__V1__Transform **pts;
  int bad;
  const char *specs[1] = {spec};
  ck_assert_msg(kiln_transform_specs_to_proto(a, specs, 1, NULL, 0, &pts, &bad, &st) == 0, "%s: %s",
                spec, st.msg);
  size_t n = protobuf_c_message_get_packed_size(&pts[0]->base);
  uint8_t *buf = kiln_malloc(n + 1);
  protobuf_c_message_pack(&pts[0]->base, buf);
  Kiln__V1__Transform *back = kiln__v1__transform__unpack(NULL, n, buf);
  ck_assert_ptr_nonnull(back);
  kiln_transform t;
  bool drop = true;
  ck_assert_msg(kiln_transform_from_proto(back, "t", &t, &drop, &st) == 0, "%s: %s", spec, st.msg);
  ck_assert_msg(!drop, "%s: a spec's grad keeps its value", spec);
  char text[256];
  kiln_transform_format(&t, text, sizeof text);
  ck_assert_msg(strcmp(text, want) == 0, "%s came back as %s, want %s", spec, text, want);
  kiln__v1__transform__free_unpacked(back, NULL);
  kiln_free(buf);
  kiln_arena_destroy(a);
}

START_TEST(test_every_spec_roundtrips) {
  static const char *const cases[][2] = {
      {"grad", "grad"},
      {"grad:wrt=0,1", "grad:wrt=0,1"},
      {"grad:wrt=2,output=1", "grad:wrt=2,output=1"},
      {"grad:output=0", "grad:output=0"},
      {"vjp", "vjp"},
      {"vjp:wrt=1,output=2", "vjp:wrt=1,output=2"},
      {"jvp", "jvp"},
      {"jvp:wrt=0,3", "jvp:wrt=0,3"},
      {"vmap", "vmap"},
      {"vmap:in_axes=0,none,-1", "vmap:in_axes=0,none,-1"},
      {"vmap:in_axes=none,2,out_axes=1,none", "vmap:in_axes=none,2,out_axes=1,none"},
      {"vmap:size=8", "vmap:size=8"},
      {"vmap:in_axes=1,size=3", "vmap:in_axes=1,size=3"},
      {"checkpoint", "checkpoint"},
      {"autocast:bf16", "autocast:bf16"},
      {"autocast:f16", "autocast:f16"},
      {"autocast:f16,loss_scale=none", "autocast:f16,loss_scale=none"},
      {"autocast:bf16,loss_scale=dynamic,growth_interval=7",
       "autocast:bf16,loss_scale=dynamic,growth_interval=7"},
      {"autocast:f16,loss_scale=dynamic", "autocast:f16"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) roundtrip(cases[i][0], cases[i][1]);
}
END_TEST

START_TEST(test_grad_carries_with_value_and_output) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_arena *a = kiln_arena_create();
  kiln_transform t;
  ck_assert_int_eq(kiln_transform_parse("grad:wrt=1,output=2", &t, &st), 0);
  Kiln__V1__Transform *pt;
  ck_assert_int_eq(kiln_transform_to_proto(a, &t, &pt, &st), 0);
  ck_assert_int_eq(pt->kind_case, KILN__V1__TRANSFORM__KIND_GRAD);
  ck_assert(pt->grad->with_value);
  ck_assert(pt->grad->has_output);
  ck_assert_int_eq(pt->grad->output, 2);
  ck_assert_int_eq(pt->grad->n_wrt, 1);
  ck_assert_int_eq(pt->grad->wrt[0], 1);
  kiln_arena_destroy(a);
}
END_TEST

START_TEST(test_sizes_inferred_from_arguments) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_arena *a = kiln_arena_create();
  kiln_shape s0, s1;
  const int64_t d0[2] = {5, 3}, d1[1] = {3};
  ck_assert_int_eq(kiln_shape_make_array(a, &s0, KILN_F32, d0, 2), 0);
  ck_assert_int_eq(kiln_shape_make_array(a, &s1, KILN_F32, d1, 1), 0);
  const kiln_shape *args[2] = {&s0, &s1};
  const char *specs[2] = {"grad", "vmap:in_axes=0,none"};
  Kiln__V1__Transform **pts;
  int bad;
  ck_assert_int_eq(kiln_transform_specs_to_proto(a, specs, 2, args, 2, &pts, &bad, &st), 0);
  ck_assert_int_eq(pts[1]->vmap->axis_size, 5);
  /* no shapes given: the size stays for the server to refuse */
  ck_assert_int_eq(kiln_transform_specs_to_proto(a, specs, 2, NULL, 0, &pts, &bad, &st), 0);
  ck_assert_int_eq(pts[1]->vmap->axis_size, 0);
  /* shapes given, none usable: the local error */
  ck_assert_int_eq(kiln_transform_specs_to_proto(a, specs, 2, args, 0, &pts, &bad, &st),
                   KILN_EINVAL);
  ck_assert_int_eq(bad, -1);
  /* a bad spec is named by index */
  kiln_status_clear(&st);
  const char *worse[2] = {"grad", "vmap:frob=1"};
  ck_assert_int_eq(kiln_transform_specs_to_proto(a, worse, 2, NULL, 0, &pts, &bad, &st),
                   KILN_EINVAL);
  ck_assert_int_eq(bad, 1);
  ck_assert_msg(strstr(st.msg, "frob") != NULL, "%s", st.msg);
  kiln_arena_destroy(a);
}
END_TEST

/* Decodes pt and expects code with `field` in the status's where. */
static void refused(Kiln__V1__Transform *pt, int code, const char *field) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_transform t;
  bool drop;
  ck_assert_int_eq(kiln_transform_from_proto(pt, "options.transforms[0]", &t, &drop, &st), code);
  ck_assert_msg(strstr(st.where, field) != NULL, "where '%s' does not name %s", st.where, field);
}

START_TEST(test_refusals_name_the_field) {
  Kiln__V1__Transform pt = KILN__V1__TRANSFORM__INIT;
  refused(&pt, KILN_EINVAL, "options.transforms[0]");
  Kiln__V1__GradTransform g = KILN__V1__GRAD_TRANSFORM__INIT;
  pt.kind_case = KILN__V1__TRANSFORM__KIND_GRAD;
  pt.grad = &g;
  g.has_aux = true;
  refused(&pt, KILN_EUNIMPL, "grad.has_aux");
  g.has_aux = false;
  g.output = 3; /* without has_output */
  refused(&pt, KILN_EINVAL, "grad.output");
  g.output = 0;
  int64_t twice[2] = {1, 1}, neg[1] = {-1};
  g.wrt = twice;
  g.n_wrt = 2;
  refused(&pt, KILN_EINVAL, "grad.wrt");
  g.wrt = neg;
  g.n_wrt = 1;
  refused(&pt, KILN_EINVAL, "grad.wrt");

  Kiln__V1__VmapTransform v = KILN__V1__VMAP_TRANSFORM__INIT;
  pt.kind_case = KILN__V1__TRANSFORM__KIND_VMAP;
  pt.vmap = &v;
  v.axis_size = -2;
  refused(&pt, KILN_EINVAL, "vmap.axis_size");
  v.axis_size = 0;
  Kiln__V1__VmapAxis ax = KILN__V1__VMAP_AXIS__INIT, *axes[1] = {&ax};
  ax.axis = 1000;
  v.in_axes = axes;
  v.n_in_axes = 1;
  refused(&pt, KILN_EINVAL, "vmap.in_axes");
  ax.axis = 2;
  ax.not_mapped = true;
  refused(&pt, KILN_EINVAL, "vmap.in_axes");

  Kiln__V1__CheckpointTransform c = KILN__V1__CHECKPOINT_TRANSFORM__INIT;
  pt.kind_case = KILN__V1__TRANSFORM__KIND_CHECKPOINT;
  pt.checkpoint = &c;
  c.policy = "dots_saveable";
  refused(&pt, KILN_EUNIMPL, "checkpoint.policy");
}
END_TEST

START_TEST(test_grad_without_value) {
  const char *text = "HloModule g\n"
                     "ENTRY main { x = f32[] parameter(0)  y = f32[] parameter(1)\n"
                     "  ROOT m = f32[] multiply(x, y) }\n";
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m;
  ck_assert_int_eq(kiln_module_parse_text(text, strlen(text), "g", NULL, &m, &st), 0);
  Kiln__V1__GradTransform g = KILN__V1__GRAD_TRANSFORM__INIT;
  int64_t wrt[2] = {0, 1};
  g.wrt = wrt;
  g.n_wrt = 2;
  Kiln__V1__Transform pt = KILN__V1__TRANSFORM__INIT;
  pt.kind_case = KILN__V1__TRANSFORM__KIND_GRAD;
  pt.grad = &g;
  kiln_transform t;
  bool drop = false;
  ck_assert_int_eq(kiln_transform_from_proto(&pt, "t", &t, &drop, &st), 0);
  ck_assert(drop);
  ck_assert_int_eq(kiln_transforms_apply(m, &t, 1, &st), 0);
  ck_assert_int_eq(kiln_transform_drop_value(m, &st), 0);
  ck_assert_msg(kiln_module_verify(m, NULL, &st) == 0, "%s", st.msg);
  const kiln_instr *root = kiln_computation_root(m, kiln_module_entry(m));
  ck_assert_int_eq(root->op, KILN_OP_TUPLE);
  ck_assert_int_eq(root->noperands, 2); /* (dx, dy), no value */
  kiln_module_destroy(m);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("transform_proto");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_every_spec_roundtrips);
  tcase_add_test(tc, test_grad_carries_with_value_and_output);
  tcase_add_test(tc, test_sizes_inferred_from_arguments);
  tcase_add_test(tc, test_refusals_name_the_field);
  tcase_add_test(tc, test_grad_without_value);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
