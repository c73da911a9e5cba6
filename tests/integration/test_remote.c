/* libkiln against a real kilnd: compile and execute agree with the local
 * reference interpreter, buffers round-trip exactly (64 MiB and more,
 * through chunked streams), handles, donation and kept outputs work, errors
 * come back with the right gRPC code, stats and /metrics tell the truth,
 * health says SERVING, transforms compiled through libkiln (vmap sizes
 * inferred from argument shapes too) agree bit for bit with the same
 * transforms applied in process, and the kiln command's --server mode
 * matches its local mode (target names included).
 *
 * One kilnd serves the whole suite; Check runs each case in a forked
 * child, which connects on its own.
 */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "clients/c/kiln.h"
#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/proto_codec.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/transforms/transform.h"
#include "tests/integration/itest.h"
#include "tests/support/progen.h"
#include "tests/support/testargs.h"

static itest_kilnd server;

static kiln_client *connect_as(const char *id) {
  kiln_client_options o = {.client_id = id};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_client *c = NULL;
  int rc = kiln_client_connect(server.addr, &o, &c, &st);
  ck_assert_msg(rc == 0, "connect %s: %s: %s", server.addr, st.where, st.msg);
  return c;
}

static char *slurp(const char *rel, size_t *len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", KILN_SOURCE_DIR, rel);
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  *len = (size_t)n;
  return buf;
}

static kiln_literal *lit(const char *text) {
  kiln_literal *l;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_literal_parse_text(text, strlen(text), &l, &st) == 0, "%s", st.msg);
  return l;
}

/* The value as text, without a layout: literal data is row-major
 * whatever layout the server reports with it. */
static char *lit_text(const kiln_literal *l) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_literal plain = *l;
  if (kiln_shape_is_array(&plain.shape)) plain.shape.layout = NULL;
  kiln_literal_print(&b, &plain, true);
  char *s = strdup(kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return s;
}

#define ASSERT_LIT(l, text) \
  do { \
    char *got_ = lit_text(l); \
    ck_assert_msg(strcmp(got_, text) == 0, "got %s, want %s", got_, text); \
    free(got_); \
  } while (0)

static kiln_remote_executable *compile_text(kiln_client *c, const char *text, const char *backend) {
  kiln_remote_compile_options o = {.backend = backend};
  kiln_remote_executable *e = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_client_compile_text(c, text, strlen(text), &o, &e, &st);
  ck_assert_msg(rc == 0, "compile (%s): %s: %s", backend ? backend : "default", st.where, st.msg);
  return e;
}

/* ---- health ---------------------------------------------------------------------- */

START_TEST(test_health) {
  kiln_client *c = connect_as("health");
  bool serving = false;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_health(c, "", &serving, &st), 0);
  ck_assert(serving);
  ck_assert_int_eq(kiln_client_health(c, "kiln.v1.Kiln", &serving, &st), 0);
  ck_assert(serving);
  kiln_client_close(c);
}
END_TEST

/* ---- compile and execute ------------------------------------------------------------ */

START_TEST(test_axpy) {
  kiln_client *c = connect_as("axpy");
  size_t len;
  char *text = slurp("examples/axpy.hlo", &len);
  const char *backends[] = {"interp", "cpu"};
  for (int b = 0; b < 2; b++) {
    kiln_remote_executable *e = compile_text(c, text, backends[b]);
    ck_assert_uint_eq(e->nparams, 3);
    ck_assert_uint_eq(e->noutputs, 1);
    kiln_sbuf sb = KILN_SBUF_INIT;
    kiln_shape_print_short(&sb, &e->params[1]);
    ck_assert_str_eq(kiln_sbuf_str(&sb), "f32[4]");
    kiln_sbuf_free(&sb);
    kiln_literal *a = lit("f32[] 2"), *x = lit("f32[4] {1, 2, 3, 4}"),
                 *y = lit("f32[4] {10, 20, 30, 40}");
    kiln_remote_arg args[3] = {{.literal = a}, {.literal = x}, {.literal = y}};
    kiln_remote_result r;
    kiln_status st;
    kiln_status_clear(&st);
    ck_assert_msg(kiln_client_execute(c, e->id, args, 3, NULL, &r, &st) == 0, "%s: %s", st.where,
                  st.msg);
    ck_assert_uint_eq(r.noutputs, 1);
    ck_assert_ptr_nonnull(r.outputs[0].literal);
    ASSERT_LIT(r.outputs[0].literal, "f32[4] {12, 24, 36, 48}");
    kiln_remote_result_free(&r);
    kiln_literal_destroy(a);
    kiln_literal_destroy(x);
    kiln_literal_destroy(y);
    kiln_remote_executable_free(e);
  }
  free(text);
  kiln_client_close(c);
}
END_TEST

/* Relative closeness for the native backend, exactness otherwise. */
static bool leaves_match(const kiln_literal *want, const kiln_literal *got, bool exact, char *why,
                         size_t n) {
  if (!kiln_shape_equal(&want->shape, &got->shape, false)) {
    snprintf(why, n, "shapes differ");
    return false;
  }
  if (exact || !kiln_dtype_is_float(want->shape.dtype)) {
    if (kiln_literal_equal(want, got)) return true;
    snprintf(why, n, "values differ");
    return false;
  }
  int64_t k = kiln_literal_elements(want);
  for (int64_t i = 0; i < k; i++) {
    double w = kiln_literal_get_f64(want, i), g = kiln_literal_get_f64(got, i);
    if (isnan(w) && isnan(g)) continue;
    if (!(fabs(w - g) <= 1e-4 * fmax(1.0, fabs(w)))) {
      snprintf(why, n, "element %lld: want %.9g, got %.9g", (long long)i, w, g);
      return false;
    }
  }
  return true;
}

/* Runs module text locally on the interpreter and remotely on `backend`,
 * with the same pseudo-random arguments, and compares every output. */
static void check_against_interp(kiln_client *c, const char *text, const char *backend,
                                 uint64_t seed, const char *label) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m;
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), label, NULL, &m, &st) == 0, "%s: %s",
                label, st.msg);
  kiln_literal **args;
  uint32_t nargs;
  ck_assert_int_eq(kiln_test_args_random(m, seed, &args, &nargs, &st), 0);
  kiln_literal *want;
  ck_assert_msg(kiln_interp_run(m, (const kiln_literal *const *)args, nargs, NULL, &want, &st) == 0,
                "%s: local: %s", label, st.msg);
  kiln_remote_executable *e = compile_text(c, text, backend);
  kiln_remote_arg *rargs = calloc(nargs ? nargs : 1, sizeof *rargs);
  for (uint32_t i = 0; i < nargs; i++) rargs[i].literal = args[i];
  kiln_remote_result r;
  int rc = kiln_client_execute(c, e->id, rargs, nargs, NULL, &r, &st);
  ck_assert_msg(rc == 0, "%s on %s: %s: %s", label, backend, st.where, st.msg);
  bool tuple = kiln_shape_is_tuple(&want->shape);
  ck_assert_uint_eq(r.noutputs, tuple ? want->shape.rank : 1);
  for (uint32_t i = 0; i < r.noutputs; i++) {
    char why[256];
    const kiln_literal *w = tuple ? want->elems[i] : want;
    ck_assert_ptr_nonnull(r.outputs[i].literal);
    ck_assert_msg(
        leaves_match(w, r.outputs[i].literal, strcmp(backend, "interp") == 0, why, sizeof why),
        "%s on %s, output %u: %s", label, backend, i, why);
  }
  kiln_remote_result_free(&r);
  kiln_remote_executable_free(e);
  free(rargs);
  kiln_literal_destroy(want);
  kiln_test_args_free(args, nargs);
  kiln_module_destroy(m);
}

START_TEST(test_examples_match_interp) {
  kiln_client *c = connect_as("examples");
  const char *files[] = {"examples/axpy.hlo", "examples/mlp.hlo"};
  for (int i = 0; i < 2; i++) {
    size_t len;
    char *text = slurp(files[i], &len);
    check_against_interp(c, text, "interp", 7, files[i]);
    check_against_interp(c, text, "cpu", 7, files[i]);
    free(text);
  }
  /* count_loop takes an s32 bound: random args give [-8, 8). */
  size_t len;
  char *text = slurp("examples/count_loop.hlo", &len);
  check_against_interp(c, text, "interp", 3, "count_loop");
  free(text);
  kiln_client_close(c);
}
END_TEST

START_TEST(test_generated_match_interp) {
  kiln_client *c = connect_as("progen");
  for (uint64_t seed = 1; seed <= 24; seed++) {
    kiln_progen_options o = {.seed = seed, .ninstrs = 12, .nparams = 2, .dtype = KILN_F32};
    char *text = kiln_progen_text(&o);
    ck_assert_ptr_nonnull(text);
    char label[32];
    snprintf(label, sizeof label, "progen seed %llu", (unsigned long long)seed);
    check_against_interp(c, text, "interp", seed, label);
    kiln_free(text);
  }
  kiln_client_close(c);
}
END_TEST

START_TEST(test_cache_and_proto) {
  kiln_client *c = connect_as("cache");
  size_t len;
  char *text = slurp("examples/axpy.hlo", &len);
  kiln_remote_executable *e1 = compile_text(c, text, "interp");
  kiln_remote_executable *e2 = compile_text(c, text, "interp");
  ck_assert_str_eq(e1->id, e2->id);
  ck_assert_int_ne(e2->cache_source, KILN_REMOTE_SOURCE_COMPILED);
  /* The same module as a proto is the same program. */
  kiln_module *m;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(text, len, "axpy", NULL, &m, &st), 0);
  kiln_remote_compile_options o = {.backend = "interp"};
  kiln_remote_executable *e3 = NULL;
  ck_assert_msg(kiln_client_compile_module(c, m, &o, &e3, &st) == 0, "%s", st.msg);
  ck_assert_str_eq(e3->id, e1->id);
  uint8_t *buf;
  size_t blen;
  ck_assert_int_eq(kiln_module_to_proto(m, &buf, &blen, &st), 0);
  kiln_remote_executable *e4 = NULL;
  ck_assert_msg(kiln_client_compile_proto(c, buf, blen, &o, &e4, &st) == 0, "%s", st.msg);
  ck_assert_str_eq(e4->id, e1->id);
  kiln_free(buf);
  kiln_module_destroy(m);
  kiln_remote_executable_free(e1);
  kiln_remote_executable_free(e2);
  kiln_remote_executable_free(e3);
  kiln_remote_executable_free(e4);
  free(text);
  kiln_client_close(c);
}
END_TEST

START_TEST(test_builder) {
  /* f(x, y) = sum(x * y) + 1 */
  kiln_builder *b = kiln_builder_create("dot1");
  int64_t dims[1] = {3};
  kiln_id x = kiln_builder_parameter(b, KILN_F32, dims, 1, "x");
  kiln_id y = kiln_builder_parameter(b, KILN_F32, dims, 1, "y");
  kiln_id xy = kiln_builder_binary(b, KILN_OP_MULTIPLY, x, y);
  int64_t rdims[1] = {0};
  kiln_id s = kiln_builder_reduce_sum(b, xy, rdims, 1);
  kiln_id one = kiln_builder_scalar(b, KILN_F32, 1);
  kiln_id root = kiln_builder_binary(b, KILN_OP_ADD, s, one);
  kiln_module *m;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_builder_finish(b, root, &m, &st) == 0, "%s: %s", st.where, st.msg);
  kiln_builder_destroy(b);

  kiln_client *c = connect_as("builder");
  kiln_remote_compile_options o = {0};
  kiln_remote_executable *e = NULL;
  ck_assert_msg(kiln_client_compile_module(c, m, &o, &e, &st) == 0, "%s", st.msg);
  kiln_literal *lx = lit("f32[3] {1, 2, 3}"), *ly = lit("f32[3] {4, 5, 6}");
  kiln_remote_arg args[2] = {{.literal = lx}, {.literal = ly}};
  kiln_remote_result r;
  ck_assert_msg(kiln_client_execute(c, e->id, args, 2, NULL, &r, &st) == 0, "%s", st.msg);
  ASSERT_LIT(r.outputs[0].literal, "f32[] 33");
  kiln_remote_result_free(&r);
  kiln_literal_destroy(lx);
  kiln_literal_destroy(ly);
  kiln_remote_executable_free(e);
  kiln_module_destroy(m);
  kiln_client_close(c);

  /* A mistake is reported by finish, naming the instruction. */
  b = kiln_builder_create("bad");
  int64_t d4[1] = {4};
  x = kiln_builder_parameter(b, KILN_F32, dims, 1, "x");
  y = kiln_builder_parameter(b, KILN_F32, d4, 1, "y");
  kiln_id z = kiln_builder_binary(b, KILN_OP_ADD, x, y);
  ck_assert_uint_eq(z, KILN_NO_ID);
  ck_assert_uint_eq(kiln_builder_unary(b, KILN_OP_NEGATE, z), KILN_NO_ID);
  kiln_status_clear(&st);
  ck_assert_int_ne(kiln_builder_finish(b, z, &m, &st), 0);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(st.msg, "f32[3]") && strstr(st.msg, "f32[4]"), "message: %s", st.msg);
  kiln_builder_destroy(b);
}
END_TEST

/* ---- buffers ----------------------------------------------------------------------- */

START_TEST(test_buffer_roundtrip_large) {
  kiln_client *c = connect_as("big");
  /* 64 MiB and 12 bytes: many chunks and a short last one. */
  int64_t n = (INT64_C(64) << 20) / 4 + 3;
  kiln_shape shape;
  kiln_arena *a = kiln_arena_create();
  ck_assert_int_eq(kiln_shape_make_array(a, &shape, KILN_F32, &n, 1), 0);
  size_t bytes = (size_t)n * 4;
  uint32_t *data = malloc(bytes);
  for (int64_t i = 0; i < n; i++) data[i] = (uint32_t)(i * 2654435761u);
  kiln_remote_buffer info;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_put_options po = {.label = "big"};
  ck_assert_msg(kiln_client_put_buffer_raw(c, &shape, data, bytes, &po, &info, &st) == 0, "%s: %s",
                st.where, st.msg);
  ck_assert_int_eq(info.size_bytes, (int64_t)bytes);
  ck_assert(kiln_shape_equal(&info.shape, &shape, false));

  uint32_t *back = malloc(bytes);
  size_t got;
  kiln_remote_buffer info2;
  ck_assert_msg(kiln_client_get_buffer_raw(c, info.handle, NULL, back, bytes, &got, &info2, &st) ==
                    0,
                "%s", st.msg);
  ck_assert_uint_eq(got, bytes);
  ck_assert(memcmp(back, data, bytes) == 0);
  ck_assert_str_eq(info2.handle, info.handle);
  kiln_remote_buffer_clear(&info2);

  /* As a literal, with small chunks asked of the server. */
  kiln_literal *l;
  kiln_remote_get_options go = {.chunk_bytes = 65536};
  ck_assert_msg(kiln_client_get_buffer(c, info.handle, &go, &l, &st) == 0, "%s", st.msg);
  ck_assert_uint_eq(l->nbytes, bytes);
  ck_assert(memcmp(l->data, data, bytes) == 0);
  kiln_literal_destroy(l);

  /* A destination too small is refused before anything is written past it. */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_get_buffer_raw(c, info.handle, NULL, back, 16, &got, NULL, &st),
                   KILN_ELIMIT);
  ck_assert_int_eq(kiln_rpc_status_code(&st), KILN_RPC_RESOURCE_EXHAUSTED);

  int64_t released, unknown;
  const char *h[1] = {info.handle};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_release_buffers(c, h, 1, &released, &unknown, &st), 0);
  ck_assert_int_eq(released, 1);
  ck_assert_int_eq(unknown, 0);
  ck_assert_int_eq(kiln_client_release_buffers(c, h, 1, &released, &unknown, &st), 0);
  ck_assert_int_eq(released, 0);
  ck_assert_int_eq(unknown, 1);
  ck_assert_int_eq(kiln_client_get_buffer(c, info.handle, NULL, &l, &st), KILN_ENOTFOUND);
  ck_assert_int_eq(kiln_rpc_status_code(&st), KILN_RPC_NOT_FOUND);
  kiln_remote_buffer_clear(&info);
  free(back);
  free(data);
  kiln_arena_destroy(a);
  kiln_client_close(c);
}
END_TEST

START_TEST(test_buffer_small_and_empty) {
  kiln_client *c = connect_as("small");
  kiln_status st;
  kiln_status_clear(&st);
  const char *values[] = {"f32[0] {}", "s8[] -3", "pred[3] {true, false, true}",
                          "f64[2,2] {{1.5, -2}, {0, 1e+300}}", "bf16[2] {1, -0.5}"};
  for (int i = 0; i < 5; i++) {
    kiln_literal *l = lit(values[i]), *back;
    kiln_remote_buffer info;
    ck_assert_msg(kiln_client_put_buffer(c, l, NULL, &info, &st) == 0, "%s: %s", values[i], st.msg);
    kiln_remote_get_options go = {.release = true};
    ck_assert_msg(kiln_client_get_buffer(c, info.handle, &go, &back, &st) == 0, "%s: %s", values[i],
                  st.msg);
    ASSERT_LIT(back, values[i]);
    /* release=true: gone after the download. */
    kiln_literal *again;
    ck_assert_int_eq(kiln_client_get_buffer(c, info.handle, NULL, &again, &st), KILN_ENOTFOUND);
    kiln_status_clear(&st);
    kiln_literal_destroy(back);
    kiln_literal_destroy(l);
    kiln_remote_buffer_clear(&info);
  }
  kiln_client_close(c);
}
END_TEST

START_TEST(test_execute_with_handles) {
  kiln_client *c = connect_as("handles");
  size_t len;
  char *text = slurp("examples/axpy.hlo", &len);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_executable *e = compile_text(c, text, NULL);
  kiln_literal *a = lit("f32[] 3"), *x = lit("f32[4] {1, 2, 3, 4}"),
               *y = lit("f32[4] {1, 1, 1, 1}");
  kiln_remote_buffer hx, hy;
  ck_assert_int_eq(kiln_client_put_buffer(c, x, NULL, &hx, &st), 0);
  ck_assert_int_eq(kiln_client_put_buffer(c, y, NULL, &hy, &st), 0);
  kiln_remote_arg args[3] = {{.literal = a}, {.handle = hx.handle}, {.handle = hy.handle}};
  bool keep[1] = {true};
  kiln_remote_execute_options xo = {.keep_on_server = keep, .nkeep = 1};
  kiln_remote_result r;
  ck_assert_msg(kiln_client_execute(c, e->id, args, 3, &xo, &r, &st) == 0, "%s", st.msg);
  ck_assert_uint_eq(r.noutputs, 1);
  ck_assert_ptr_null(r.outputs[0].literal);
  ck_assert_ptr_nonnull(r.outputs[0].buffer.handle);
  kiln_literal *out;
  ck_assert_int_eq(kiln_client_get_buffer(c, r.outputs[0].buffer.handle, NULL, &out, &st), 0);
  ASSERT_LIT(out, "f32[4] {4, 7, 10, 13}");
  kiln_literal_destroy(out);

  /* The kept output feeds the next step; y is donated and gone after. */
  kiln_remote_arg args2[3] = {{.literal = a},
                              {.handle = r.outputs[0].buffer.handle},
                              {.handle = hy.handle, .donate = true}};
  kiln_remote_result r2;
  ck_assert_msg(kiln_client_execute(c, e->id, args2, 3, NULL, &r2, &st) == 0, "%s", st.msg);
  ASSERT_LIT(r2.outputs[0].literal, "f32[4] {13, 22, 31, 40}");
  ck_assert_int_eq(kiln_client_get_buffer(c, hy.handle, NULL, &out, &st), KILN_ENOTFOUND);
  kiln_status_clear(&st);
  /* x was not donated: still there. */
  ck_assert_int_eq(kiln_client_get_buffer(c, hx.handle, NULL, &out, &st), 0);
  ASSERT_LIT(out, "f32[4] {1, 2, 3, 4}");
  kiln_literal_destroy(out);
  const char *hs[2] = {hx.handle, r.outputs[0].buffer.handle};
  int64_t released;
  ck_assert_int_eq(kiln_client_release_buffers(c, hs, 2, &released, NULL, &st), 0);
  ck_assert_int_eq(released, 2);
  kiln_remote_result_free(&r);
  kiln_remote_result_free(&r2);
  kiln_remote_buffer_clear(&hx);
  kiln_remote_buffer_clear(&hy);
  kiln_literal_destroy(a);
  kiln_literal_destroy(x);
  kiln_literal_destroy(y);
  kiln_remote_executable_free(e);
  free(text);
  kiln_client_close(c);
}
END_TEST

/* ---- errors ------------------------------------------------------------------------ */

#define EXPECT_CODE(call, code) \
  do { \
    kiln_status_clear(&st); \
    int rc_ = (call); \
    ck_assert_msg(rc_ != 0 && kiln_rpc_status_code(&st) == (code), \
                  "%s: expected %s, got rc %d %s: %s", #call, kiln_rpc_code_name(code), rc_, \
                  st.where, st.msg); \
    ck_assert_msg(st.msg[0] != '\0', "%s: empty message", #call); \
  } while (0)

START_TEST(test_errors) {
  kiln_client *c = connect_as("errors");
  kiln_status st;
  kiln_remote_executable *e = NULL;
  kiln_remote_compile_options o = {0};
  const char *garbage = "this is not HLO";
  EXPECT_CODE(kiln_client_compile_text(c, garbage, strlen(garbage), &o, &e, &st),
              KILN_RPC_INVALID_ARGUMENT);
  const char *bad = "HloModule m\nENTRY e {\n  a = f32[3] parameter(0)\n  b = f32[4] parameter(1)\n"
                    "  ROOT c = f32[3] add(a, b)\n}\n";
  EXPECT_CODE(kiln_client_compile_text(c, bad, strlen(bad), &o, &e, &st),
              KILN_RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "c") != NULL, "message names nothing: %s", st.msg);
  const uint8_t junk[] = {0xff, 0xff, 0xff, 0x01, 0x02};
  EXPECT_CODE(kiln_client_compile_proto(c, junk, sizeof junk, &o, &e, &st),
              KILN_RPC_INVALID_ARGUMENT);
  const char *tr[1] = {"frobnicate"};
  kiln_remote_compile_options ot = {.transforms = tr, .ntransforms = 1};
  EXPECT_CODE(kiln_client_compile_text(c, bad, strlen(bad), &ot, &e, &st),
              KILN_RPC_INVALID_ARGUMENT);

  kiln_remote_result r;
  EXPECT_CODE(kiln_client_execute(c, "no-such-executable", NULL, 0, NULL, &r, &st),
              KILN_RPC_NOT_FOUND);
  size_t len;
  char *text = slurp("examples/axpy.hlo", &len);
  e = compile_text(c, text, "interp");
  kiln_literal *a = lit("f32[] 2"), *x = lit("f32[4] {1, 2, 3, 4}"),
               *x5 = lit("f32[5] {1, 2, 3, 4, 5}"), *xi = lit("s32[4] {1, 2, 3, 4}");
  kiln_remote_arg two[2] = {{.literal = a}, {.literal = x}};
  EXPECT_CODE(kiln_client_execute(c, e->id, two, 2, NULL, &r, &st), KILN_RPC_INVALID_ARGUMENT);
  kiln_remote_arg wrong_dims[3] = {{.literal = a}, {.literal = x5}, {.literal = x}};
  EXPECT_CODE(kiln_client_execute(c, e->id, wrong_dims, 3, NULL, &r, &st),
              KILN_RPC_INVALID_ARGUMENT);
  kiln_remote_arg wrong_type[3] = {{.literal = a}, {.literal = xi}, {.literal = x}};
  EXPECT_CODE(kiln_client_execute(c, e->id, wrong_type, 3, NULL, &r, &st),
              KILN_RPC_INVALID_ARGUMENT);
  kiln_remote_arg unknown[3] = {{.literal = a}, {.handle = "no-such-handle"}, {.literal = x}};
  EXPECT_CODE(kiln_client_execute(c, e->id, unknown, 3, NULL, &r, &st), KILN_RPC_NOT_FOUND);
  kiln_literal *out;
  EXPECT_CODE(kiln_client_get_buffer(c, "no-such-handle", NULL, &out, &st), KILN_RPC_NOT_FOUND);

  /* Another client's handle is unknown here, and left alone. */
  kiln_client *other = connect_as("errors-other");
  kiln_remote_buffer hb;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_put_buffer(other, x, NULL, &hb, &st), 0);
  EXPECT_CODE(kiln_client_get_buffer(c, hb.handle, NULL, &out, &st), KILN_RPC_NOT_FOUND);
  kiln_remote_arg foreign[3] = {{.literal = a}, {.handle = hb.handle}, {.literal = x}};
  EXPECT_CODE(kiln_client_execute(c, e->id, foreign, 3, NULL, &r, &st), KILN_RPC_NOT_FOUND);
  int64_t released, unknown_n;
  const char *h[1] = {hb.handle};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_release_buffers(c, h, 1, &released, &unknown_n, &st), 0);
  ck_assert_int_eq(released, 0);
  ck_assert_int_eq(unknown_n, 1);
  ck_assert_int_eq(kiln_client_get_buffer(other, hb.handle, NULL, &out, &st), 0);
  ASSERT_LIT(out, "f32[4] {1, 2, 3, 4}");
  kiln_literal_destroy(out);
  ck_assert_int_eq(kiln_client_release_buffers(other, h, 1, &released, NULL, &st), 0);
  ck_assert_int_eq(released, 1);
  kiln_remote_buffer_clear(&hb);
  kiln_client_close(other);

  kiln_literal_destroy(a);
  kiln_literal_destroy(x);
  kiln_literal_destroy(x5);
  kiln_literal_destroy(xi);
  kiln_remote_executable_free(e);
  free(text);
  kiln_client_close(c);

  /* Nobody listening: UNAVAILABLE from connect. */
  kiln_client *none;
  kiln_client_options co = {.connect_timeout_ms = 2000};
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_connect("127.0.0.1:1", &co, &none, &st), KILN_EUNAVAIL);
  ck_assert_int_eq(kiln_rpc_status_code(&st), KILN_RPC_UNAVAILABLE);
}
END_TEST

/* ---- stats and metrics ----------------------------------------------------------------- */

/* ---- transforms: libkiln's requests against kiln_transforms_apply in process ---------- */

static const char *const TX_PROGRAM =
    "HloModule tx\n"
    "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] add(a, b)\n}\n"
    "ENTRY main {\n  x = f32[3] parameter(0)\n  y = f32[3] parameter(1)\n"
    "  m = f32[3] multiply(x, y)\n  t = f32[3] tanh(x)\n  s = f32[3] add(m, t)\n"
    "  z = f32[] constant(0)\n  ROOT r = f32[] reduce(s, z), dimensions={0}, to_apply=add\n}\n";

/* Applies `local` specs in process and sends `remote` specs (with the
 * parameter shapes of the locally transformed program as arg_shapes when
 * infer is set, so that a vmap without size=N takes it from them, as `kiln
 * run` does), runs both on the same arguments and wants the same
 * signature and bit-identical outputs. */
static void check_transforms(kiln_client *c, const char *const *local, const char *const *remote,
                             uint32_t n, bool infer, uint64_t seed) {
  char label[256] = "";
  for (uint32_t i = 0; i < n; i++)
    snprintf(label + strlen(label), sizeof label - strlen(label), "%s%s", i ? " " : "", remote[i]);
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m;
  ck_assert_int_eq(kiln_module_parse_text(TX_PROGRAM, strlen(TX_PROGRAM), "tx", NULL, &m, &st), 0);
  ck_assert_int_eq(kiln_module_verify(m, NULL, &st), 0);
  kiln_transform ts[8];
  for (uint32_t i = 0; i < n; i++)
    ck_assert_msg(kiln_transform_parse(local[i], &ts[i], &st) == 0, "%s: %s", local[i], st.msg);
  ck_assert_msg(kiln_transforms_apply(m, ts, n, &st) == 0, "%s: local: %s", label, st.msg);
  kiln_literal **args;
  uint32_t nargs;
  ck_assert_int_eq(kiln_test_args_random(m, seed, &args, &nargs, &st), 0);
  kiln_literal *want;
  ck_assert_msg(kiln_interp_run(m, (const kiln_literal *const *)args, nargs, NULL, &want, &st) == 0,
                "%s: local run: %s", label, st.msg);

  const kiln_shape *shapes[16];
  for (uint32_t i = 0; i < nargs && i < 16; i++) shapes[i] = &args[i]->shape;
  kiln_remote_compile_options o = {.backend = "interp",
                                   .transforms = remote,
                                   .ntransforms = n,
                                   .arg_shapes = infer ? shapes : NULL,
                                   .narg_shapes = infer ? nargs : 0};
  kiln_remote_executable *e = NULL;
  ck_assert_msg(kiln_client_compile_text(c, TX_PROGRAM, strlen(TX_PROGRAM), &o, &e, &st) == 0,
                "%s: compile: %s: %s", label, st.where, st.msg);
  ck_assert_msg(e->nparams == nargs, "%s: %u parameters remotely, %u locally", label, e->nparams,
                nargs);
  for (uint32_t i = 0; i < nargs; i++)
    ck_assert_msg(kiln_shape_equal(&e->params[i], &args[i]->shape, false),
                  "%s: parameter %u differs", label, i);
  kiln_remote_arg rargs[16];
  for (uint32_t i = 0; i < nargs; i++) rargs[i] = (kiln_remote_arg){.literal = args[i]};
  kiln_remote_result r;
  ck_assert_msg(kiln_client_execute(c, e->id, rargs, nargs, NULL, &r, &st) == 0,
                "%s: execute: %s: %s", label, st.where, st.msg);
  bool tuple = kiln_shape_is_tuple(&want->shape);
  ck_assert_msg(r.noutputs == (tuple ? want->shape.rank : 1), "%s: %u outputs remotely, %u locally",
                label, r.noutputs, tuple ? want->shape.rank : 1);
  for (uint32_t i = 0; i < r.noutputs; i++) {
    char why[256];
    ck_assert_msg(
        leaves_match(tuple ? want->elems[i] : want, r.outputs[i].literal, true, why, sizeof why),
        "%s: output %u: %s", label, i, why);
  }
  kiln_remote_result_free(&r);
  kiln_remote_executable_free(e);
  kiln_literal_destroy(want);
  kiln_test_args_free(args, nargs);
  kiln_module_destroy(m);
}

START_TEST(test_transforms_match_in_process) {
  kiln_client *c = connect_as("transforms");
  static const char *const lists[][4] = {
      {"grad"},
      {"grad:wrt=0,1"},
      {"grad:wrt=1"},
      {"jvp"},
      {"jvp:wrt=1"},
      {"vjp"},
      {"vjp:wrt=0,output=0"},
      {"checkpoint", "grad"},
      {"jvp:wrt=0", "grad:wrt=0,2,output=1"},
      {"grad", "jvp"},
      {"vmap:size=3"},
      {"vmap:in_axes=0,none,size=2"},
      {"grad:wrt=0,1", "vmap:in_axes=none,0,size=4"},
      {"grad", "jvp", "vmap:in_axes=none,none,0,none,size=3"},
  };
  for (size_t k = 0; k < sizeof lists / sizeof lists[0]; k++) {
    uint32_t n = 0;
    while (n < 4 && lists[k][n]) n++;
    check_transforms(c, lists[k], lists[k], n, false, 40 + k);
  }
  /* vmap without size=N: the client infers it from the argument shapes */
  const char *sized[] = {"grad:wrt=0,1", "vmap:in_axes=0,none,size=5"};
  const char *unsized[] = {"grad:wrt=0,1", "vmap:in_axes=0,none"};
  check_transforms(c, sized, unsized, 2, true, 7);
  const char *vs[] = {"vmap:size=2"}, *vu[] = {"vmap"};
  check_transforms(c, vs, vu, 1, true, 8);

  /* ... and without shapes to infer from it is the server's refusal */
  kiln_remote_compile_options o = {.backend = "interp", .transforms = vu, .ntransforms = 1};
  kiln_remote_executable *e = NULL;
  kiln_status st;
  EXPECT_CODE(kiln_client_compile_text(c, TX_PROGRAM, strlen(TX_PROGRAM), &o, &e, &st),
              KILN_RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "batch size") != NULL, "message: %s", st.msg);
  /* a bad spec: refused before sending, naming it */
  const char *bad[] = {"vmap:in_axes=x"};
  o.transforms = bad;
  EXPECT_CODE(kiln_client_compile_text(c, TX_PROGRAM, strlen(TX_PROGRAM), &o, &e, &st),
              KILN_RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "vmap:in_axes=x") != NULL, "message: %s", st.msg);
  kiln_client_close(c);
}
END_TEST

START_TEST(test_stats) {
  kiln_client *c = connect_as("stats");
  kiln_server_stats s0, s1;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_stats(c, &s0, &st), 0);
  ck_assert(s0.server_version[0] != '\0');
  ck_assert(s0.uptime_ns > 0);
  size_t len;
  char *text = slurp("examples/axpy.hlo", &len);
  kiln_remote_executable *e = compile_text(c, text, "interp");
  kiln_literal *a = lit("f32[] 2"), *x = lit("f32[4] {1, 2, 3, 4}");
  kiln_remote_arg args[3] = {{.literal = a}, {.literal = x}, {.literal = x}};
  for (int i = 0; i < 5; i++) {
    kiln_remote_result r;
    ck_assert_int_eq(kiln_client_execute(c, e->id, args, 3, NULL, &r, &st), 0);
    kiln_remote_result_free(&r);
  }
  kiln_remote_buffer hb;
  ck_assert_int_eq(kiln_client_put_buffer(c, x, NULL, &hb, &st), 0);
  ck_assert_int_eq(kiln_client_stats(c, &s1, &st), 0);
  ck_assert_int_ge(s1.executions - s0.executions, 5);
  ck_assert_int_eq(s1.live_buffers - s0.live_buffers, 1);
  ck_assert_int_eq(s1.live_buffer_bytes - s0.live_buffer_bytes, 16);
  ck_assert_uint_gt(s1.ncounters, 0);
  ck_assert_uint_gt(s1.ndevices, 0);
  const char *h[1] = {hb.handle};
  ck_assert_int_eq(kiln_client_release_buffers(c, h, 1, NULL, NULL, &st), 0);
  int64_t live0 = s0.live_buffers;
  kiln_server_stats_clear(&s0);
  kiln_server_stats_clear(&s1);
  ck_assert_int_eq(kiln_client_stats(c, &s1, &st), 0);
  ck_assert_int_eq(s1.live_buffers, live0);
  kiln_server_stats_clear(&s1);
  kiln_remote_buffer_clear(&hb);
  kiln_literal_destroy(a);
  kiln_literal_destroy(x);
  kiln_remote_executable_free(e);
  free(text);
  kiln_client_close(c);
}
END_TEST

START_TEST(test_metrics) {
  ck_assert_msg(server.metrics[0] != '\0', "kilnd printed no metrics address");
  /* Some traffic first, so that the counters have something to say. */
  kiln_client *c = connect_as("metrics");
  kiln_server_stats s;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_client_stats(c, &s, &st), 0);
  kiln_server_stats_clear(&s);
  kiln_remote_result r;
  kiln_client_execute(c, "no-such-executable", NULL, 0, NULL, &r, &st);
  kiln_client_close(c);

  int status;
  char *body;
  size_t len;
  ck_assert_int_eq(itest_http_get(server.metrics, "/metrics", &status, &body, &len), 0);
  ck_assert_int_eq(status, 200);
  itest_metrics m;
  char err[256];
  ck_assert_msg(itest_metrics_parse(body, &m, err, sizeof err) == 0, "/metrics: %s", err);
  ck_assert_uint_gt(m.n, 10);
  ck_assert_uint_gt(m.ntypes, 5);
  ck_assert_msg(itest_metrics_value(&m, "kiln_requests_total", "method=\"Stats\"") >= 1,
                "no Stats request counted");
  ck_assert_msg(itest_metrics_sum(&m, "kiln_request_errors_total") >= 1,
                "the NOT_FOUND Execute is not counted as an error");
  ck_assert(!isnan(itest_metrics_value(&m, "kiln_live_buffers", NULL)));
  itest_metrics_free(&m);
  free(body);
  ck_assert_int_eq(itest_http_get(server.metrics, "/no-such-page", &status, &body, &len), 0);
  ck_assert_int_eq(status, 404);
  free(body);
}
END_TEST

/* ---- the kiln command --------------------------------------------------------------------- */

static int kiln_cmd(const char *const *args, char **out, char **err) {
  const char *cli = getenv("KILN_CLI");
  ck_assert_msg(cli && cli[0], "KILN_CLI is not set");
  char *argv[32];
  int n = 0;
  argv[n++] = (char *)cli;
  for (int i = 0; args[i] && n < 31; i++) argv[n++] = (char *)args[i];
  argv[n] = NULL;
  return itest_run(argv, out, err);
}

START_TEST(test_cli_remote) {
  char axpy[1024], bad[1024];
  snprintf(axpy, sizeof axpy, "%s/examples/axpy.hlo", KILN_SOURCE_DIR);
  snprintf(bad, sizeof bad, "%s/tests/integration/data/bad_shape.hlo", KILN_SOURCE_DIR);
  char *out, *err, *lout, *lerr;
  const char *local[] = {"run",   axpy,
                         "--arg", "f32[] 2",
                         "--arg", "f32[4] {1, 2, 3, 4}",
                         "--arg", "f32[4] {10, 20, 30, 40}",
                         NULL};
  ck_assert_int_eq(kiln_cmd(local, &lout, &lerr), 0);
  const char *remote[] = {"run",      axpy,
                          "--arg",    "f32[] 2",
                          "--arg",    "f32[4] {1, 2, 3, 4}",
                          "--arg",    "f32[4] {10, 20, 30, 40}",
                          "--server", server.addr,
                          NULL};
  ck_assert_msg(kiln_cmd(remote, &out, &err) == 0, "stderr: %s", err);
  ck_assert_str_eq(out, lout);
  ck_assert_str_eq(out, "f32[4] {12, 24, 36, 48}\n");
  free(out), free(err), free(lout), free(lerr);

  const char *random_local[] = {"run", axpy, "--random-args", "5", NULL};
  const char *random_remote[] = {"run",       axpy,        "--random-args", "5", "--server",
                                 server.addr, "--backend", "interp",        NULL};
  ck_assert_int_eq(kiln_cmd(random_local, &lout, &lerr), 0);
  ck_assert_msg(kiln_cmd(random_remote, &out, &err) == 0, "stderr: %s", err);
  ck_assert_str_eq(out, lout);
  free(out), free(err), free(lout), free(lerr);

  const char *check_ok[] = {"check", axpy, "--server", server.addr, NULL};
  ck_assert_int_eq(kiln_cmd(check_ok, &out, &err), 0);
  ck_assert_str_eq(out, "");
  ck_assert_str_eq(err, "");
  free(out), free(err);
  const char *check_bad[] = {"check", "--server", server.addr, bad, NULL};
  ck_assert_int_eq(kiln_cmd(check_bad, &out, &err), 1);
  /* Exactly what a local check prints. */
  char *lbad_out, *lbad_err;
  const char *check_local[] = {"check", bad, NULL};
  ck_assert_int_eq(kiln_cmd(check_local, &lbad_out, &lbad_err), 1);
  ck_assert_str_eq(err, lbad_err);
  char *lbad_err_copy = strdup(lbad_err);
  char prefix[1100];
  snprintf(prefix, sizeof prefix, "%s:7:8: error: main/c: add: ", bad);
  ck_assert_msg(strncmp(err, prefix, strlen(prefix)) == 0, "stderr: %s", err);
  free(out), free(err), free(lbad_out), free(lbad_err);

  const char *compile[] = {"compile", axpy, "--server", server.addr, "--backend", "interp", NULL};
  ck_assert_msg(kiln_cmd(compile, &out, &err) == 0, "stderr: %s", err);
  ck_assert_msg(strncmp(out, "executable ", 11) == 0, "stdout: %s", out);
  ck_assert_msg(strstr(out, "signature (f32[], f32[4]{0}, f32[4]{0}) -> f32[4]{0}\n") ||
                    strstr(out, "signature (f32[], f32[4], f32[4]) -> f32[4]\n"),
                "stdout: %s", out);
  free(out), free(err);

  /* Local compile: the native compiler in process; a refused module gets
   * the same diagnostic as check. */
  const char *compile_local[] = {"compile", axpy, NULL};
  ck_assert_msg(kiln_cmd(compile_local, &out, &err) == 0, "stderr: %s", err);
  snprintf(prefix, sizeof prefix, "%s: compiled for cpu: ", axpy);
  ck_assert_msg(strncmp(out, prefix, strlen(prefix)) == 0, "stdout: %s", out);
  free(out), free(err);
  const char *compile_bad[] = {"compile", bad, NULL};
  ck_assert_int_eq(kiln_cmd(compile_bad, &out, &err), 1);
  ck_assert_str_eq(err, lbad_err_copy);
  free(out), free(err);
  const char *compile_bad_remote[] = {"compile", bad, "--server", server.addr, NULL};
  ck_assert_int_eq(kiln_cmd(compile_bad_remote, &out, &err), 1);
  ck_assert_str_eq(err, lbad_err_copy);
  free(out), free(err);
  free(lbad_err_copy);

  const char *bench[] = {"bench", axpy, "--server", server.addr, "--iters", "5", NULL};
  ck_assert_msg(kiln_cmd(bench, &out, &err) == 0, "stderr: %s", err);
  ck_assert_msg(strstr(out, "\"mode\": \"remote-buffers\"") && strstr(out, "\"run_us_median\": "),
                "stdout: %s", out);
  free(out), free(err);

  const char *stats[] = {"stats", "--server", server.addr, "--counters", NULL};
  ck_assert_msg(kiln_cmd(stats, &out, &err) == 0, "stderr: %s", err);
  ck_assert_msg(strncmp(out, "server ", 7) == 0, "stdout: %s", out);
  free(out), free(err);

  const char *unreachable[] = {"run", axpy, "--random-args", "0", "--server", "127.0.0.1:1", NULL};
  ck_assert_int_eq(kiln_cmd(unreachable, &out, &err), 1);
  ck_assert_msg(strstr(err, "cannot connect") != NULL, "stderr: %s", err);
  free(out), free(err);
  const char *usage[] = {"run", axpy, "--server", "nowhere", NULL};
  ck_assert_int_eq(kiln_cmd(usage, &out, &err), 2);
  free(out), free(err);
}
END_TEST

/* Target names resolve alike in process and on the server (one resolver,
 * compiler/target.h): for every spelling, `kiln compile --target T` exits
 * alike both ways, the executables record the same canonical target, and
 * the server's cache key is the one `kiln cache explain --target T`
 * computes; a bad name gets the same diagnostic and exit code both ways. */
static bool host_runs_isa(const char *isa) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  if (strcmp(isa, "x86-64-v3") == 0) return __builtin_cpu_supports("x86-64-v3");
  return true;
#elif defined(__x86_64__)
  return strcmp(isa, "x86-64-v3") != 0;
#else
  return strncmp(isa, "x86-64", 6) != 0;
#endif
}

static kiln_executable *read_executable(const char *path) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  static uint8_t buf[1 << 20];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  ck_assert_uint_lt(len, sizeof buf);
  kiln_executable *e = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_executable_deserialize(buf, len, &e, &st) == 0, "%s: %s", path, st.msg);
  return e;
}

/* The hex key on the "cache SOURCE KEY" line of a remote compile. */
static void cache_key_of(const char *out, char key[65]) {
  const char *p = strstr(out, "\ncache ");
  ck_assert_msg(p != NULL, "stdout: %s", out);
  p = strchr(p + 7, ' ');
  ck_assert_msg(p != NULL && strlen(p + 1) >= 64, "stdout: %s", out);
  snprintf(key, 65, "%.64s", p + 1);
}

/* A mesh run goes to the server, which refuses a mesh larger than its
 * devices (this one has one cpu device) naming device_count, rather than
 * running it on one device. */
START_TEST(test_cli_mesh_refused) {
  char axpy[1024];
  snprintf(axpy, sizeof axpy, "%s/examples/axpy.hlo", KILN_SOURCE_DIR);
  const char *flags[][3] = {{"--partitions", "2", NULL}, {"--replicas", "2", NULL}};
  for (size_t i = 0; i < 2; i++) {
    char *out, *err;
    const char *cmd[] = {"run",       axpy,       "--random-args", "0", flags[i][0],
                         flags[i][1], "--server", server.addr,     NULL};
    ck_assert_int_eq(kiln_cmd(cmd, &out, &err), 1);
    ck_assert_str_eq(out, "");
    ck_assert_msg(strstr(err, "options.device_count: 2 devices for one run, but this server has 1 "
                              "cpu devices") != NULL,
                  "%s", err);
    free(out), free(err);
  }
}
END_TEST

START_TEST(test_cli_targets) {
  char axpy[1024], dir[] = "/tmp/kiln-targets-XXXXXX";
  snprintf(axpy, sizeof axpy, "%s/examples/axpy.hlo", KILN_SOURCE_DIR);
  ck_assert_ptr_nonnull(mkdtemp(dir));
  const char *good[][3] = {
      {"x86-64-v3", "cpu-x86-64-v3", "x86-64-v3"},
      {"cpu-x86-64-v3", "cpu-x86-64-v3", "x86-64-v3"},
      {"x86-64", "cpu-x86-64", "x86-64"},
      {"cpu-x86-64", "cpu-x86-64", "x86-64"},
      {"native", "cpu", "native"},
      {"cpu", "cpu", "native"},
      {"cpu-native", "cpu", "native"},
  };
  int ran = 0;
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    if (!host_runs_isa(good[i][2])) continue;
    ran++;
    char lpath[512], rpath[512], *lout, *lerr, *rout, *rerr, *xout, *xerr;
    snprintf(lpath, sizeof lpath, "%s/local-%zu.kexe", dir, i);
    snprintf(rpath, sizeof rpath, "%s/remote-%zu.kexe", dir, i);
    const char *local[] = {"compile", axpy, "--target", good[i][0], "-o", lpath, NULL};
    const char *remote[] = {"compile", axpy,  "--target", good[i][0],  "--backend", "cpu",
                            "-o",      rpath, "--server", server.addr, NULL};
    ck_assert_msg(kiln_cmd(local, &lout, &lerr) == 0, "%s: %s", good[i][0], lerr);
    ck_assert_msg(kiln_cmd(remote, &rout, &rerr) == 0, "%s: %s", good[i][0], rerr);
    char want[1200];
    snprintf(want, sizeof want, "%s: compiled for %s: ", axpy, good[i][1]);
    ck_assert_msg(strncmp(lout, want, strlen(want)) == 0, "%s: %s", good[i][0], lout);
    kiln_executable *le = read_executable(lpath), *re = read_executable(rpath);
    ck_assert_str_eq(le->target, good[i][1]);
    ck_assert_str_eq(re->target, good[i][1]);
    kiln_executable_destroy(le);
    kiln_executable_destroy(re);
    /* the key kilnd used is the one computed here for the same spelling */
    char key[65], line[1200];
    cache_key_of(rout, key);
    const char *explain[] = {"cache", "explain", axpy, axpy, "--target", good[i][0], NULL};
    ck_assert_msg(kiln_cmd(explain, &xout, &xerr) == 0, "%s: %s", good[i][0], xerr);
    snprintf(line, sizeof line, "%s  %s\n", key, axpy);
    ck_assert_msg(strncmp(xout, line, strlen(line)) == 0, "%s: %s vs %s", good[i][0], xout, line);
    free(lout), free(lerr), free(rout), free(rerr), free(xout), free(xerr);
  }
  ck_assert_int_ge(ran, 3);

  const char *bad[] = {"z80", "cuda-sm_90", "sm_90", "x86-64-v9", "CPU", "interp"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *lout, *lerr, *rout, *rerr;
    const char *local[] = {"compile", axpy, "--target", bad[i], "--backend", "cpu", NULL};
    const char *remote[] = {"compile", axpy,       "--target",  bad[i], "--backend",
                            "cpu",     "--server", server.addr, NULL};
    int lrc = kiln_cmd(local, &lout, &lerr), rrc = kiln_cmd(remote, &rout, &rerr);
    ck_assert_msg(lrc == 1 && rrc == 1, "%s: exit %d in process, %d with --server", bad[i], lrc,
                  rrc);
    ck_assert_str_eq(lerr, rerr);
    char want[1200];
    snprintf(want, sizeof want, "%s: error: options.target: ", axpy);
    ck_assert_msg(strncmp(lerr, want, strlen(want)) == 0, "%s: %s", bad[i], lerr);
    ck_assert_msg(strstr(lerr, "cpu-x86-64-v3") != NULL, "no list of targets: %s", lerr);
    ck_assert_str_eq(lout, "");
    free(lout), free(lerr), free(rout), free(rerr);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *remote_suite(void) {
  Suite *s = suite_create("remote");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_health);
  tcase_add_test(tc, test_axpy);
  tcase_add_test(tc, test_examples_match_interp);
  tcase_add_test(tc, test_generated_match_interp);
  tcase_add_test(tc, test_transforms_match_in_process);
  tcase_add_test(tc, test_cache_and_proto);
  tcase_add_test(tc, test_builder);
  tcase_add_test(tc, test_buffer_roundtrip_large);
  tcase_add_test(tc, test_buffer_small_and_empty);
  tcase_add_test(tc, test_execute_with_handles);
  tcase_add_test(tc, test_errors);
  tcase_add_test(tc, test_stats);
  tcase_add_test(tc, test_metrics);
  tcase_add_test(tc, test_cli_remote);
  tcase_add_test(tc, test_cli_targets);
  tcase_add_test(tc, test_cli_mesh_refused);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  itest_require_kilnd("test_remote");
  if (itest_kilnd_start(&server, NULL)) return 1;
  return itest_run_suite("test_remote", remote_suite(), &server);
}
