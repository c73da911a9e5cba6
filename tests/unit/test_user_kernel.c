/* User kernels (compiler/codegen/user_kernel.c and its users): the
 * signature parser's errors with their columns; registration refusing a
 * bad name, an empty or oversized source, source that does not compile
 * (with the compiler's message) and source that does not define the
 * kernel; objects kept by source digest; a program calling a kernel
 * (element-wise and block-indexed) equal to the same program in HLO ops on
 * the cpu backend, after serialization too; grad through a custom_vjp
 * whose forward pass calls the kernel; calls that do not match the
 * signature, kernels not registered or not allowed, and the interpreter,
 * refused naming the instruction; the cache-key text following the
 * source. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "compiler/codegen/user_kernel.h"
#include "compiler/compile.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/transforms/transform.h"
#include "executor/run.h"

/* out = a * x + y, element-wise over 1000 floats. */
static const char SAXPY[] =
    "#include <stdint.h>\n"
    "void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  const float *a = bufs[0], *x = bufs[1], *y = bufs[2];\n"
    "  float *out = bufs[3];\n"
    "  for (int64_t i = begin; i < end; i++) out[i] = a[i] * x[i] + y[i];\n"
    "}\n";
#define SAXPY_SIG "f32[1000], f32[1000], f32[1000] -> f32[1000]"

/* Block-indexed: row b of a f32[8,128] summed into out[b], and the row's
 * maximum into the second result. */
static const char ROWSUM[] =
    "#include <stdint.h>\n"
    "void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  const float *x = bufs[0];\n"
    "  float *sum = bufs[1], *mx = bufs[2];\n"
    "  for (int64_t b = begin; b < end; b++) {\n"
    "    float s = 0, m = x[b * 128];\n"
    "    for (int j = 0; j < 128; j++) {\n"
    "      s += x[b * 128 + j];\n"
    "      if (x[b * 128 + j] > m) m = x[b * 128 + j];\n"
    "    }\n"
    "    sum[b] = s;\n"
    "    mx[b] = m;\n"
    "  }\n"
    "}\n";

/* Element-wise square, for the custom_vjp. */
static const char SQUARE[] =
    "#include <stdint.h>\n"
    "void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  const double *x = bufs[0];\n"
    "  double *y = bufs[1];\n"
    "  for (int64_t i = begin; i < end; i++) y[i] = x[i] * x[i];\n"
    "}\n";

static const char SAXPY_KERNEL_HLO[] =
    "HloModule k\n"
    "ENTRY main {\n"
    "  a = f32[1000] parameter(0)\n"
    "  x = f32[1000] parameter(1)\n"
    "  y = f32[1000] parameter(2)\n"
    "  s = f32[1000] custom-call(a, x, y), custom_call_target=\"kiln.user.saxpy\"\n"
    "  ROOT r = f32[1000] tanh(s)\n"
    "}\n";

static const char SAXPY_OPS_HLO[] = "HloModule k\n"
                                    "ENTRY main {\n"
                                    "  a = f32[1000] parameter(0)\n"
                                    "  x = f32[1000] parameter(1)\n"
                                    "  y = f32[1000] parameter(2)\n"
                                    "  m = f32[1000] multiply(a, x)\n"
                                    "  s = f32[1000] add(m, y)\n"
                                    "  ROOT r = f32[1000] tanh(s)\n"
                                    "}\n";

static const char ROWSUM_KERNEL_HLO[] =
    "HloModule k\n"
    "ENTRY main {\n"
    "  x = f32[8,128] parameter(0)\n"
    "  ROOT t = (f32[8], f32[8]) custom-call(x), custom_call_target=\"kiln.user.rows\"\n"
    "}\n";

static const char ROWSUM_OPS_HLO[] =
    "HloModule k\n"
    "add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT c = f32[] add(a, b) }\n"
    "max { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT c = f32[] maximum(a, b) }\n"
    "ENTRY main {\n"
    "  x = f32[8,128] parameter(0)\n"
    "  z = f32[] constant(0)\n"
    "  n = f32[] constant(-inf)\n"
    "  s = f32[8] reduce(x, z), dimensions={1}, to_apply=add\n"
    "  m = f32[8] reduce(x, n), dimensions={1}, to_apply=max\n"
    "  ROOT t = (f32[8], f32[8]) tuple(s, m)\n"
    "}\n";

/* sum(sin(x^2)) where x^2 is the user kernel inside a custom_vjp: F calls
 * it and keeps x, B computes 2 x ct in HLO. */
static const char VJP_KERNEL_HLO[] =
    "HloModule m\n"
    "P { x = f64[64] parameter(0)\n"
    "  ROOT y = f64[64] custom-call(x), custom_call_target=\"kiln.user.square\" }\n"
    "F { x = f64[64] parameter(0)\n"
    "  y = f64[64] custom-call(x), custom_call_target=\"kiln.user.square\"\n"
    "  r = (f64[64]) tuple(x)  ROOT o = (f64[64], (f64[64])) tuple(y, r) }\n"
    "B { x = f64[64] parameter(0)  r = (f64[64]) parameter(1)  ct = f64[64] parameter(2)\n"
    "  xr = f64[64] get-tuple-element(r), index=0\n"
    "  two = f64[] constant(2)  b = f64[64] broadcast(two), dimensions={}\n"
    "  g0 = f64[64] multiply(xr, ct)  g = f64[64] multiply(g0, b)\n"
    "  ROOT o = (f64[64]) tuple(g) }\n"
    "add { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT c = f64[] add(a, b) }\n"
    "ENTRY main { x = f64[64] parameter(0)\n"
    "  y = f64[64] call(x), to_apply=P, frontend_attributes={_kiln_custom_vjp_fwd=\"F\","
    "_kiln_custom_vjp_bwd=\"B\"}\n"
    "  s = f64[64] sine(y)\n"
    "  z = f64[] constant(0)  ROOT l = f64[] reduce(s, z), dimensions={0}, to_apply=add }\n";

static const char VJP_OPS_HLO[] =
    "HloModule m\n"
    "add { a = f64[] parameter(0)  b = f64[] parameter(1)  ROOT c = f64[] add(a, b) }\n"
    "ENTRY main { x = f64[64] parameter(0)\n"
    "  y = f64[64] multiply(x, x)\n"
    "  s = f64[64] sine(y)\n"
    "  z = f64[] constant(0)  ROOT l = f64[] reduce(s, z), dimensions={0}, to_apply=add }\n";

static kiln_module *parse(const char *text) {
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st) == 0, "%s",
                st.msg);
  ck_assert_msg(kiln_module_verify(m, NULL, &st) == 0, "%s", st.msg);
  return m;
}

static kiln_literal *vec(kiln_dtype t, const int64_t *dims, uint32_t rank, double scale,
                         double shift) {
  kiln_shape s = {.dtype = t, .rank = rank, .dims = (int64_t *)dims};
  kiln_literal *l = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &s, 0, &l, NULL), 0);
  int64_t n = kiln_literal_elements(l);
  for (int64_t i = 0; i < n; i++) kiln_literal_set_f64(l, i, sin((double)i * scale) + shift);
  return l;
}

static kiln_user_kernels *registry_with(const char *name, const char *src, const char *sig) {
  kiln_user_kernels *r = kiln_user_kernels_create();
  ck_assert_ptr_nonnull(r);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_user_kernel_options o = {.check_link = true};
  ck_assert_msg(kiln_user_kernels_register(r, name, src, strlen(src), sig, &o, NULL, NULL, &st) ==
                    0,
                "%s: %s", st.where, st.msg);
  return r;
}

static kiln_executable *compile_with(const kiln_module *m, const kiln_user_kernels *r) {
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.user_kernels = r;
  kiln_executable *e = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_compile(m, &o, &e, NULL, &st) == 0, "%s: %s", st.where, st.msg);
  return e;
}

static int compile_fails(const kiln_module *m, const kiln_user_kernels *r, kiln_status *st) {
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.user_kernels = r;
  kiln_executable *e = NULL;
  kiln_status_clear(st);
  int rc = kiln_compile(m, &o, &e, NULL, st);
  ck_assert_ptr_null(e);
  return rc;
}

static kiln_literal *run_exe(const kiln_executable *e, kiln_literal **args, uint32_t n) {
  kiln_literal *out = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(
      kiln_run_executable(e, NULL, NULL, (const kiln_literal *const *)args, n, &out, &st) == 0,
      "%s: %s", st.where, st.msg);
  return out;
}

static kiln_literal *run_interp(const kiln_module *m, kiln_literal **args, uint32_t n) {
  kiln_literal *out = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_interp_run(m, (const kiln_literal *const *)args, n, NULL, &out, &st) == 0,
                "%s: %s", st.where, st.msg);
  return out;
}

static void assert_close(const kiln_literal *a, const kiln_literal *b, double tol) {
  ck_assert_int_eq(kiln_literal_elements(a), kiln_literal_elements(b));
  for (int64_t i = 0; i < kiln_literal_elements(a); i++)
    ck_assert_msg(fabs(kiln_literal_get_f64(a, i) - kiln_literal_get_f64(b, i)) <= tol,
                  "element %lld: %.9g vs %.9g", (long long)i, kiln_literal_get_f64(a, i),
                  kiln_literal_get_f64(b, i));
}

/* ---- signatures ---------------------------------------------------------- */

START_TEST(test_signature_parse) {
  kiln_user_kernel_sig g;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_user_kernel_sig_parse(SAXPY_SIG, &g, &st), 0);
  ck_assert_uint_eq(g.nin, 3);
  ck_assert_uint_eq(g.nout, 1);
  ck_assert_uint_eq(g.grid, 0);
  ck_assert_uint_eq(kiln_user_kernel_sig_range(&g), 1000);
  ck_assert_int_eq(kiln_user_kernel_sig_parse("f32[8,128]->f32[8],s32[8];grid=8", &g, &st), 0);
  ck_assert_uint_eq(g.nout, 2);
  ck_assert_int_eq(g.out[1].dtype, KILN_S32);
  ck_assert_uint_eq(kiln_user_kernel_sig_range(&g), 8);
  ck_assert_int_eq(kiln_user_kernel_sig_parse(" -> f64[] ; elementwise", &g, &st), 0);
  ck_assert_uint_eq(g.nin, 0);
  ck_assert_uint_eq(kiln_user_kernel_sig_range(&g), 1);

  static const struct {
    const char *text, *where, *says;
  } bad[] = {
      {"f32[4] f32[4]", "signature:1:8", "'->'"},
      {"q32[4] -> f32[4]", "signature:1:1", "element type"},
      {"f32[4 -> f32[4]", "signature:1:7", "',' or ']'"},
      {"f32[4] -> ", "signature:1:11", "at least one result"},
      {"f32[4] -> f32[4]; grid=0", "signature:1:24", "grid="},
      {"f32[4] -> f32[4]; tiles", "signature:1:19", "'elementwise' or 'grid=N'"},
      {"f32[4] -> f32[4] x", "signature:1:18", "unexpected text"},
      {"f32[1,1,1,1,1,1,1,1,1] -> f32[1]", "signature:1:21", "more than 8"},
      {"f32[4] -> f32[5]", "signature", "element count"},
      {"f32(4) -> f32[4]", "signature:1:4", "'['"},
      {"token[] -> f32[4]", "signature:1:1", "element type"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    kiln_status_clear(&st);
    ck_assert_int_eq(kiln_user_kernel_sig_parse(bad[i].text, &g, &st), KILN_EINVAL);
    ck_assert_msg(strcmp(st.where, bad[i].where) == 0, "%s: where %s, expected %s", bad[i].text,
                  st.where, bad[i].where);
    ck_assert_msg(strstr(st.msg, bad[i].says) != NULL, "%s: %s", bad[i].text, st.msg);
  }
  char many[2048] = "";
  for (int i = 0; i < 17; i++) strcat(many, i ? ",f32[1]" : "f32[1]");
  strcat(many, "->f32[1]");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_user_kernel_sig_parse(many, &g, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "more than 16") != NULL, "%s", st.msg);
}
END_TEST

/* ---- registration -------------------------------------------------------- */

START_TEST(test_register_errors) {
  kiln_user_kernels *r = kiln_user_kernels_create();
  kiln_status st;
  kiln_user_kernel_options o = {.check_link = true};
  kiln_status_clear(&st);
  ck_assert_int_eq(
      kiln_user_kernels_register(r, "9lives", SAXPY, strlen(SAXPY), SAXPY_SIG, &o, NULL, NULL, &st),
      KILN_EINVAL);
  ck_assert_str_eq(st.where, "name");
  kiln_status_clear(&st);
  ck_assert_int_eq(
      kiln_user_kernels_register(r, "a.b", SAXPY, strlen(SAXPY), SAXPY_SIG, &o, NULL, NULL, &st),
      KILN_EINVAL);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_user_kernels_register(r, "k", SAXPY, 0, SAXPY_SIG, &o, NULL, NULL, &st),
                   KILN_EINVAL);
  ck_assert_ptr_nonnull(strstr(st.msg, "empty"));
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_user_kernels_register(r, "k", SAXPY, strlen(SAXPY), "f32[1000] -> ", &o,
                                              NULL, NULL, &st),
                   KILN_EINVAL);
  ck_assert_ptr_nonnull(strstr(st.where, "signature:1:"));

  /* too big: the source, and the object */
  kiln_user_kernel_options small = {.max_source = 64};
  kiln_status_clear(&st);
  ck_assert_int_eq(
      kiln_user_kernels_register(r, "k", SAXPY, strlen(SAXPY), SAXPY_SIG, &small, NULL, NULL, &st),
      KILN_ELIMIT);
  ck_assert_ptr_nonnull(strstr(st.msg, "over the limit of 64"));
  kiln_user_kernel_options tiny_obj = {.max_object = 100};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_user_kernels_register(r, "k", SAXPY, strlen(SAXPY), SAXPY_SIG, &tiny_obj,
                                              NULL, NULL, &st),
                   KILN_ELIMIT);
  ck_assert_ptr_nonnull(strstr(st.msg, "compiled object"));

  /* a compile error comes back with the compiler's own words */
  static const char broken[] =
      "#include <stdint.h>\n"
      "void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end) {\n"
      "  undeclared_thing = 1;\n"
      "}\n";
  kiln_status_clear(&st);
  ck_assert_int_eq(
      kiln_user_kernels_register(r, "k", broken, strlen(broken), SAXPY_SIG, &o, NULL, NULL, &st),
      KILN_EINVAL);
  ck_assert_str_eq(st.where, "kernel source");
  ck_assert_msg(strstr(st.msg, "undeclared_thing") != NULL, "%s", st.msg);
  /* in the client's terms: its file and function, not the renamed symbol */
  ck_assert_msg(strstr(st.msg, "kernel.c:3:") != NULL && strstr(st.msg, "<stdin>") == NULL, "%s",
                st.msg);
  ck_assert_msg(strstr(st.msg, "kiln_user_kernel") != NULL, "%s", st.msg);

  /* source that compiles but does not define the kernel: the link names it */
  static const char other[] =
      "#include <stdint.h>\n"
      "void something_else(void *const *bufs, int64_t begin, int64_t end) { (void)bufs; }\n";
  kiln_status_clear(&st);
  ck_assert_int_eq(
      kiln_user_kernels_register(r, "k", other, strlen(other), SAXPY_SIG, &o, NULL, NULL, &st),
      KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "kiln_user_kernel") != NULL, "%s", st.msg);
  ck_assert_ptr_null(kiln_user_kernels_find(r, "k"));
  ck_assert_uint_eq(kiln_user_kernels_compiles(r), 0); /* none was kept */
  kiln_user_kernels_destroy(r);
}
END_TEST

START_TEST(test_register_cached_by_digest) {
  kiln_user_kernels *r = kiln_user_kernels_create();
  kiln_status st;
  kiln_status_clear(&st);
  const kiln_user_kernel *a = NULL, *b = NULL, *c = NULL;
  bool cached = true;
  ck_assert_int_eq(kiln_user_kernels_register(r, "saxpy", SAXPY, strlen(SAXPY), SAXPY_SIG, NULL, &a,
                                              &cached, &st),
                   0);
  ck_assert(!cached);
  ck_assert_uint_eq(kiln_user_kernels_compiles(r), 1);
  /* the same source under another name and signature: no compile */
  ck_assert_int_eq(kiln_user_kernels_register(r, "other", SAXPY, strlen(SAXPY),
                                              "f32[10],f32[10],f32[10]->f32[10]", NULL, &b, &cached,
                                              &st),
                   0);
  ck_assert(cached);
  ck_assert_uint_eq(kiln_user_kernels_compiles(r), 1);
  ck_assert_ptr_eq(a->obj, b->obj);
  ck_assert_str_eq(a->digest, b->digest);
  ck_assert_int_eq(strncmp(a->symbol, "kiln_user_", 10), 0);
  /* other source: compiled, another digest */
  ck_assert_int_eq(kiln_user_kernels_register(r, "saxpy", SQUARE, strlen(SQUARE),
                                              "f64[64] -> f64[64]", NULL, &c, &cached, &st),
                   0);
  ck_assert(!cached);
  ck_assert_uint_eq(kiln_user_kernels_compiles(r), 2);
  ck_assert_str_ne(a->digest, c->digest);
  ck_assert_ptr_eq(kiln_user_kernels_find(r, "saxpy"), c); /* the newest registration */
  ck_assert_ptr_eq(kiln_user_kernels_find(r, "other"), b);
  ck_assert_ptr_null(kiln_user_kernels_find(r, "nothing"));
  kiln_user_kernels_destroy(r);
}
END_TEST

/* ---- programs ------------------------------------------------------------ */

START_TEST(test_elementwise_equals_hlo_ops) {
  kiln_user_kernels *r = registry_with("saxpy", SAXPY, SAXPY_SIG);
  kiln_module *mk = parse(SAXPY_KERNEL_HLO), *mo = parse(SAXPY_OPS_HLO);
  int64_t d = 1000;
  kiln_literal *args[3] = {vec(KILN_F32, &d, 1, 0.1, 0), vec(KILN_F32, &d, 1, 0.37, 0.5),
                           vec(KILN_F32, &d, 1, 0.05, -0.2)};
  kiln_executable *e = compile_with(mk, r);
  kiln_executable *eo = compile_with(mo, NULL);
  kiln_literal *got = run_exe(e, args, 3), *want = run_exe(eo, args, 3);
  kiln_literal *ref = run_interp(mo, args, 3);
  assert_close(got, want, 1e-6);
  assert_close(got, ref, 1e-6);
  /* the executable carries the kernel: it runs after a round trip */
  uint8_t *blob = NULL;
  size_t len = 0;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_executable_serialize(e, &blob, &len, &st), 0);
  kiln_literal *again = NULL;
  ck_assert_msg(kiln_run_executable_blob(blob, len, NULL, NULL, (const kiln_literal *const *)args,
                                         3, &again, &st) == 0,
                "%s", st.msg);
  assert_close(again, want, 0);
  kiln_free(blob);
  kiln_literal_destroy(again);
  kiln_literal_destroy(got);
  kiln_literal_destroy(want);
  kiln_literal_destroy(ref);
  for (int i = 0; i < 3; i++) kiln_literal_destroy(args[i]);
  kiln_executable_destroy(e);
  kiln_executable_destroy(eo);
  kiln_module_destroy(mk);
  kiln_module_destroy(mo);
  kiln_user_kernels_destroy(r);
}
END_TEST

START_TEST(test_block_indexed_equals_hlo_ops) {
  kiln_user_kernels *r = registry_with("rows", ROWSUM, "f32[8,128] -> f32[8], f32[8]; grid=8");
  kiln_module *mk = parse(ROWSUM_KERNEL_HLO), *mo = parse(ROWSUM_OPS_HLO);
  int64_t d[2] = {8, 128};
  kiln_literal *args[1] = {vec(KILN_F32, d, 2, 0.013, 0.25)};
  kiln_executable *e = compile_with(mk, r);
  kiln_literal *got = run_exe(e, args, 1), *want = run_interp(mo, args, 1);
  const kiln_literal *g[2], *w[2];
  ck_assert_uint_eq(got->shape.rank, 2);
  for (uint32_t k = 0; k < 2; k++) {
    g[k] = got->elems[k];
    w[k] = want->elems[k];
    assert_close(g[k], w[k], 1e-4);
  }
  kiln_literal_destroy(got);
  kiln_literal_destroy(want);
  kiln_literal_destroy(args[0]);
  kiln_executable_destroy(e);
  kiln_module_destroy(mk);
  kiln_module_destroy(mo);
  kiln_user_kernels_destroy(r);
}
END_TEST

static kiln_module *grad_of(const char *text) {
  kiln_module *m = parse(text);
  kiln_transform t;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_transform_parse("grad", &t, &st), 0);
  ck_assert_msg(kiln_transforms_apply(m, &t, 1, &st) == 0, "%s: %s", st.where, st.msg);
  return m;
}

START_TEST(test_grad_through_vjp) {
  kiln_user_kernels *r = registry_with("square", SQUARE, "f64[64] -> f64[64]");
  kiln_module *gk = grad_of(VJP_KERNEL_HLO), *go = grad_of(VJP_OPS_HLO);
  int64_t d = 64;
  kiln_literal *args[1] = {vec(KILN_F64, &d, 1, 0.3, 0.1)};
  kiln_executable *e = compile_with(gk, r);
  kiln_literal *got = run_exe(e, args, 1), *want = run_interp(go, args, 1);
  ck_assert_uint_eq(got->shape.rank, 2);
  assert_close(got->elems[0], want->elems[0], 1e-12);
  assert_close(got->elems[1], want->elems[1], 1e-12);
  /* and it is the true derivative, 2 x cos(x^2) */
  const kiln_literal *gx = got->elems[1];
  for (int64_t i = 0; i < 64; i++) {
    double x = kiln_literal_get_f64(args[0], i);
    ck_assert_double_eq_tol(kiln_literal_get_f64(gx, i), 2 * x * cos(x * x), 1e-12);
  }
  kiln_literal_destroy(got);
  kiln_literal_destroy(want);
  kiln_literal_destroy(args[0]);
  kiln_executable_destroy(e);
  kiln_module_destroy(gk);
  kiln_module_destroy(go);
  kiln_user_kernels_destroy(r);
}
END_TEST

/* Without a custom_vjp the kernel is opaque: grad and vmap say so. */
START_TEST(test_transforms_refuse_bare_call) {
  static const char *const specs[] = {"grad", "vmap:in_axes=0,size=2"};
  for (size_t i = 0; i < 2; i++) {
    kiln_module *m = parse("HloModule k\nadd { a = f64[] parameter(0)  b = f64[] parameter(1)\n"
                           "  ROOT c = f64[] add(a, b) }\n"
                           "ENTRY main { x = f64[64] parameter(0)\n"
                           "  y = f64[64] custom-call(x), custom_call_target=\"kiln.user.square\"\n"
                           "  z = f64[] constant(0)\n"
                           "  ROOT l = f64[] reduce(y, z), dimensions={0}, to_apply=add }\n");
    kiln_transform t;
    kiln_status st;
    kiln_status_clear(&st);
    ck_assert_int_eq(kiln_transform_parse(specs[i], &t, &st), 0);
    ck_assert_int_eq(kiln_transforms_apply(m, &t, 1, &st), KILN_EUNIMPL);
    ck_assert_msg(strstr(st.msg, "kiln.user.square") != NULL && strstr(st.msg, "opaque") != NULL,
                  "%s: %s", specs[i], st.msg);
    kiln_module_destroy(m);
  }
}
END_TEST

START_TEST(test_calls_refused) {
  kiln_user_kernels *r = registry_with("saxpy", SAXPY, SAXPY_SIG);
  kiln_status st;
  kiln_module *mk = parse(SAXPY_KERNEL_HLO);
  /* no registry: user kernels are off */
  ck_assert_int_eq(compile_fails(mk, NULL, &st), KILN_EUNIMPL);
  ck_assert_msg(strstr(st.msg, "user kernels are off") != NULL, "%s", st.msg);
  /* the interpreter runs no compiled code */
  int64_t d = 1000;
  kiln_literal *args[3] = {vec(KILN_F32, &d, 1, 1, 0), vec(KILN_F32, &d, 1, 1, 0),
                           vec(KILN_F32, &d, 1, 1, 0)};
  kiln_literal *out = NULL;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_interp_run(mk, (const kiln_literal *const *)args, 3, NULL, &out, &st),
                   KILN_EUNIMPL);
  ck_assert_msg(strstr(st.msg, "interpreter runs no compiled code") != NULL, "%s", st.msg);
  for (int i = 0; i < 3; i++) kiln_literal_destroy(args[i]);
  kiln_module_destroy(mk);

  static const struct {
    const char *hlo;
    int code;
    const char *says;
  } bad[] = {
      {"HloModule k\nENTRY main { a = f32[1000] parameter(0)\n"
       "  ROOT s = f32[1000] custom-call(a), custom_call_target=\"kiln.user.nope\" }\n",
       KILN_ENOTFOUND, "\"nope\" is not registered"},
      {"HloModule k\nENTRY main { a = f32[1000] parameter(0)\n"
       "  ROOT s = f32[1000] custom-call(a), custom_call_target=\"kiln.user.a;b\" }\n",
       KILN_EINVAL, "not a valid user kernel name"},
      {"HloModule k\nENTRY main { a = f32[1000] parameter(0)\n"
       "  ROOT s = f32[1000] custom-call(a), custom_call_target=\"kiln.user.saxpy\" }\n",
       KILN_EINVAL, "takes 3 operands, the call passes 1"},
      {"HloModule k\nENTRY main { a = f32[1000] parameter(0)  b = f32[999] parameter(1)\n"
       "  ROOT s = f32[1000] custom-call(a, a, b), custom_call_target=\"kiln.user.saxpy\" }\n",
       KILN_EINVAL, "operand 2 must be f32[1000] (row-major)"},
      {"HloModule k\nENTRY main { a = f32[1000] parameter(0)\n"
       "  ROOT s = f64[1000] custom-call(a, a, a), custom_call_target=\"kiln.user.saxpy\" }\n",
       KILN_EINVAL, "result 0 must be f32[1000] (row-major)"},
      {"HloModule k\nENTRY main { a = f32[1000] parameter(0)\n"
       "  ROOT s = (f32[1000], f32[1000]) custom-call(a, a, a), "
       "custom_call_target=\"kiln.user.saxpy\" }\n",
       KILN_EINVAL, "has 1 results, the call declares 2"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    kiln_module *m = parse(bad[i].hlo);
    ck_assert_int_eq(compile_fails(m, r, &st), bad[i].code);
    ck_assert_msg(strstr(st.msg, bad[i].says) != NULL, "case %zu: %s", i, st.msg);
    ck_assert_msg(strstr(st.msg, "custom-call s") != NULL || strstr(st.where, "s") != NULL,
                  "case %zu names no instruction: %s: %s", i, st.where, st.msg);
    kiln_module_destroy(m);
  }
  kiln_user_kernels_destroy(r);
}
END_TEST

START_TEST(test_cache_key_follows_source) {
  kiln_user_kernels *r = registry_with("saxpy", SAXPY, SAXPY_SIG);
  kiln_module *mk = parse(SAXPY_KERNEL_HLO), *mo = parse(SAXPY_OPS_HLO);
  kiln_status st;
  kiln_status_clear(&st);
  char *k1 = NULL, *k2 = NULL, *none = NULL;
  ck_assert_int_eq(kiln_user_kernels_key(r, mk, &k1, &st), 0);
  ck_assert_int_eq(kiln_user_kernels_key(r, mo, &none, &st), 0);
  ck_assert_str_eq(none, "");
  ck_assert_ptr_nonnull(strstr(k1, "saxpy="));
  ck_assert_ptr_nonnull(strstr(k1, kiln_user_kernels_find(r, "saxpy")->digest));
  /* the same name with other source: another key */
  static const char v2[] =
      "#include <stdint.h>\n"
      "void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end) {\n"
      "  const float *a = bufs[0], *x = bufs[1], *y = bufs[2];\n"
      "  float *out = bufs[3];\n"
      "  for (int64_t i = begin; i < end; i++) out[i] = a[i] * x[i] - y[i];\n"
      "}\n";
  ck_assert_int_eq(
      kiln_user_kernels_register(r, "saxpy", v2, strlen(v2), SAXPY_SIG, NULL, NULL, NULL, &st), 0);
  ck_assert_int_eq(kiln_user_kernels_key(r, mk, &k2, &st), 0);
  ck_assert_str_ne(k1, k2);
  /* and the executable follows: it computes the new kernel */
  int64_t d = 1000;
  kiln_literal *args[3] = {vec(KILN_F32, &d, 1, 0.1, 0), vec(KILN_F32, &d, 1, 0.2, 0),
                           vec(KILN_F32, &d, 1, 0.3, 0.1)};
  kiln_executable *e = compile_with(mk, r);
  kiln_literal *got = run_exe(e, args, 3);
  for (int64_t i = 0; i < d; i++) {
    double a = kiln_literal_get_f64(args[0], i), x = kiln_literal_get_f64(args[1], i),
           y = kiln_literal_get_f64(args[2], i);
    ck_assert_double_eq_tol(kiln_literal_get_f64(got, i), tanh((float)(a * x) - y), 1e-5);
  }
  kiln_user_kernels_destroy(NULL);
  kiln_free(none);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_user_kernels_key(NULL, mk, &none, &st), KILN_EUNIMPL);
  ck_assert_ptr_null(none);
  kiln_literal_destroy(got);
  for (int i = 0; i < 3; i++) kiln_literal_destroy(args[i]);
  kiln_executable_destroy(e);
  kiln_free(k1);
  kiln_free(k2);
  kiln_free(none);
  kiln_module_destroy(mk);
  kiln_module_destroy(mo);
  kiln_user_kernels_destroy(r);
}
END_TEST

/* out[i] = a[i] + 100 i over the row-major order: what the kernel sees
 * tells its buffers' layout. */
static const char RAMP[] =
    "#include <stdint.h>\n"
    "void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  const float *a = bufs[0];\n"
    "  float *out = bufs[1];\n"
    "  for (int64_t i = begin; i < end; i++) out[i] = a[i] + 100.0f * (float)i;\n"
    "}\n";

/* Operands and results of other layouts (a parameter's, a transpose made
 * a bitcast, a result written column-major) reach the kernel row-major. */
START_TEST(test_layouts_row_major) {
  kiln_user_kernels *r = registry_with("ramp", RAMP, "f32[2,3] -> f32[2,3]");
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_user_kernels_register(r, "ramp_t", RAMP, strlen(RAMP),
                                              "f32[3,2] -> f32[3,2]", NULL, NULL, NULL, &st),
                   0);
  static const struct {
    const char *hlo;
    double want[6];
  } cases[] = {
      {"HloModule k\nENTRY main { a = f32[2,3]{0,1} parameter(0)\n"
       "  ROOT s = f32[2,3] custom-call(a), custom_call_target=\"kiln.user.ramp\" }\n",
       {1, 102, 203, 304, 405, 506}},
      {"HloModule k\nENTRY main { a = f32[2,3] parameter(0)\n"
       "  t = f32[3,2]{0,1} transpose(a), dimensions={1,0}\n"
       "  ROOT s = f32[3,2] custom-call(t), custom_call_target=\"kiln.user.ramp_t\" }\n",
       {1, 104, 202, 305, 403, 506}},
      {"HloModule k\nENTRY main { a = f32[2,3] parameter(0)\n"
       "  s = f32[2,3]{0,1} custom-call(a), custom_call_target=\"kiln.user.ramp\"\n"
       "  ROOT n = f32[2,3]{0,1} negate(s) }\n",
       {-1, -102, -203, -304, -405, -506}},
  };
  int64_t d[2] = {2, 3};
  kiln_shape sh = {.dtype = KILN_F32, .rank = 2, .dims = d};
  kiln_literal *a = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &sh, 0, &a, NULL), 0);
  for (int i = 0; i < 6; i++) kiln_literal_set_f64(a, i, i + 1);
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    kiln_module *m = parse(cases[c].hlo);
    kiln_executable *e = compile_with(m, r);
    kiln_literal *got = run_exe(e, &a, 1);
    for (int i = 0; i < 6; i++)
      ck_assert_msg(kiln_literal_get_f64(got, i) == cases[c].want[i], "case %zu element %d: %g", c,
                    i, kiln_literal_get_f64(got, i));
    kiln_literal_destroy(got);
    kiln_executable_destroy(e);
    kiln_module_destroy(m);
  }
  kiln_literal_destroy(a);
  kiln_user_kernels_destroy(r);
}
END_TEST

/* CUDA C is compile-checked by NVRTC where libnvrtc loads, and skipped
 * with the reason where it does not: both are answers, never a crash. */
START_TEST(test_cuda_check_or_skip) {
  static const char good[] =
      "extern \"C\" __global__ void kiln_user_kernel(void *const *bufs, long long begin, "
      "long long end) {\n"
      "  long long i = begin + blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
      "  if (i < end) ((float *)bufs[1])[i] = 2.0f * ((const float *)bufs[0])[i];\n"
      "}\n";
  static const char bad[] = "extern \"C\" __global__ void kiln_user_kernel() { nope; }\n";
  char out[KILN_STATUS_MSG_MAX + 16];
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_user_kernel_cuda_check(good, strlen(good), NULL, 60, out, sizeof out, &st),
                   0);
  if (strncmp(out, "skipped: ", 9) == 0) {
    fprintf(stderr, "test_cuda_check_or_skip: no libnvrtc here (%s)\n", out);
    return;
  }
  ck_assert_str_eq(out, "ok");
  ck_assert_int_eq(kiln_user_kernel_cuda_check(bad, strlen(bad), NULL, 60, out, sizeof out, &st),
                   KILN_EINVAL);
  ck_assert_str_eq(st.where, "cuda_source");
  ck_assert_msg(strstr(st.msg, "nope") != NULL, "%s", st.msg);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("user_kernel");
  TCase *t = tcase_create("core");
  tcase_set_timeout(t, 120);
  tcase_add_test(t, test_signature_parse);
  tcase_add_test(t, test_register_errors);
  tcase_add_test(t, test_register_cached_by_digest);
  tcase_add_test(t, test_elementwise_equals_hlo_ops);
  tcase_add_test(t, test_block_indexed_equals_hlo_ops);
  tcase_add_test(t, test_grad_through_vjp);
  tcase_add_test(t, test_calls_refused);
  tcase_add_test(t, test_transforms_refuse_bare_call);
  tcase_add_test(t, test_cache_key_follows_source);
  tcase_add_test(t, test_cuda_check_or_skip);
  tcase_add_test(t, test_layouts_row_major);
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  SRunner *r = srunner_create(suite());
  srunner_set_fork_status(r, CK_FORK);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
