/* Shardings and replica groups (compiler/ir/sharding.c, the parser's
 * forms of them, the proto codec) and per-device programs on the
 * interpreter's device mesh (compiler/eval/interp_mesh.c,
 * interp_collective.c).
 *
 * Every form XLA writes goes text -> module -> text -> module and through
 * the proto, printing the same each time; explicit and iota spellings of
 * one assignment compare equal and others do not; the mesh replica-group
 * form expands to the groups it means; and each collective, in each
 * replica-group mode and its async forms, gives the hand-computed result on
 * 1, 2, 4 and 8 devices.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/arena.h"
#include "common/sbuf.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/proto_codec.h"
#include "compiler/ir/sharding.h"
#include "compiler/ir/text.h"

static kiln_module *parse_ok(const char *text) {
  kiln_status st = {0};
  kiln_module *m = NULL;
  int rc = kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, &st);
  ck_assert_msg(rc == 0, "parse failed: %s: %s\n%s", st.where, st.msg, text);
  return m;
}

static int parse_err(const char *text, kiln_status *st) {
  kiln_module *m = NULL;
  kiln_status_clear(st);
  int rc = kiln_module_parse_text(text, strlen(text), "t.hlo", NULL, &m, st);
  kiln_module_destroy(m);
  return rc;
}

static char *print(const kiln_module *m) {
  char *s = kiln_module_print(m, NULL);
  ck_assert_ptr_nonnull(s);
  return s;
}

/* ---- round trips ---------------------------------------------------------- */

static const char all_forms[] =
    "HloModule forms, num_partitions=8\n"
    "\n"
    "FileNames\n"
    "1 \"/tmp/f.py\"\n"
    "\n"
    "FunctionNames\n"
    "1 \"f\"\n"
    "\n"
    "FileLocations\n"
    "1 {file_name_id=1 function_name_id=1 line=3 end_line=3 column=1 end_column=9}\n"
    "\n"
    "StackFrames\n"
    "1 {file_location_id=1 parent_frame_id=1}\n"
    "\n"
    "add {\n"
    "  x = f32[] parameter(0)\n"
    "  y = f32[] parameter(1)\n"
    "  ROOT s = f32[] add(x, y)\n"
    "}\n"
    "\n"
    "ENTRY e {\n"
    "  a = f32[8,8] parameter(0), sharding={replicated}\n"
    "  b = f32[8,8] parameter(1), sharding={maximal device=3}\n"
    "  c = f32[8,8] parameter(2), sharding={manual}\n"
    "  d = f32[8,8] parameter(3), sharding={unknown}\n"
    "  e1 = f32[8,8] parameter(4), sharding={devices=[2,4]0,1,2,3,4,5,6,7}\n"
    "  e2 = f32[8,8] parameter(5), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}\n"
    "  e3 = f32[8,8] parameter(6), sharding={devices=[4,1,2]<=[2,4]T(1,0) "
    "last_tile_dim_replicate}\n"
    "  e4 = f32[8,8] parameter(7), sharding={devices=[2,1,2,2]<=[8] last_tile_dims={manual, "
    "replicated}}\n"
    "  e5 = f32[8,8] parameter(8), sharding={devices=[2,1,4]0,2,4,6,1,3,5,7 "
    "last_tile_dims={manual}}\n"
    "  r1 = f32[8,8] all-reduce(a), replica_groups={{0,1},{2,3}}, to_apply=add\n"
    "  r2 = f32[8,8] all-reduce(a), channel_id=1, replica_groups=[2,4]<=[8], "
    "use_global_device_ids=true, to_apply=add\n"
    "  r3 = f32[8,8] all-reduce(a), channel_id=2, replica_groups=[4,2]<=[2,4]T(1,0), "
    "use_global_device_ids=true, to_apply=add\n"
    "  r4 = f32[8,8] all-reduce(a), channel_id=3, replica_groups=mesh['x'=2,'y'=4] {'y'}, "
    "use_global_device_ids=true, to_apply=add\n"
    "  r5 = f32[8,8] all-reduce(a), channel_id=4, replica_groups={}, to_apply=add\n"
    "  ROOT t = (f32[8,8], f32[8,8], f32[8,8], f32[8,8], f32[8,8], f32[8,8]) tuple(r1, r2, r3, r4, "
    "r5, e5), "
    "sharding={{replicated}, {maximal device=0}, {devices=[8,1]<=[8]}, {manual}, {unknown}, "
    "{devices=[2,4]<=[4,2]T(1,0) metadata={op_name=\"x\"}}}\n"
    "}\n";

START_TEST(test_roundtrip_text_and_proto) {
  kiln_module *m = parse_ok(all_forms);
  ck_assert_uint_eq(m->nsections, 4);
  ck_assert_str_eq(m->sections[3].name, "StackFrames");
  char *t1 = print(m);
  kiln_module *m2 = parse_ok(t1);
  char *t2 = print(m2);
  ck_assert_str_eq(t1, t2);
  ck_assert_ptr_nonnull(strstr(t1, "devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate"));
  ck_assert_ptr_nonnull(strstr(t1, "last_tile_dims={manual, replicated}"));
  ck_assert_ptr_nonnull(strstr(t1, "\nStackFrames\n1 {file_location_id=1 parent_frame_id=1}\n"));
  /* The mesh form is kept as the iota list it denotes. */
  ck_assert_ptr_nonnull(strstr(t1, "replica_groups=[2,4]<=[8], use_global_device_ids"));
  uint8_t *buf = NULL;
  size_t len = 0;
  kiln_status st = {0};
  ck_assert_int_eq(kiln_module_to_proto(m2, &buf, &len, &st), 0);
  kiln_module *m3 = NULL;
  ck_assert_msg(kiln_module_from_proto(buf, len, &m3, &st) == 0, "%s", st.msg);
  char *t3 = print(m3);
  ck_assert_str_eq(t1, t3);
  kiln_free(buf);
  kiln_free(t1);
  kiln_free(t2);
  kiln_free(t3);
  kiln_module_destroy(m);
  kiln_module_destroy(m2);
  kiln_module_destroy(m3);
}
END_TEST

START_TEST(test_bad_forms_named) {
  kiln_status st;
  static const char *const bad[][2] = {
      {"replica_groups=mesh['x'=2] {'z'}", "is not a mesh axis"},
      {"replica_groups=mesh['x'=2,'x'=2] {'x'}", "appears twice"},
      {"replica_groups=mesh['x'=4] {'x':(3)2}", "does not divide"},
      {"replica_groups=mesh['x'=4] {'x', 'x'}", "named twice"},
      {"replica_groups=mesh[x=4] {'x'}", "quoted mesh axis"},
      {"replica_groups=[2,4]<=[6]", "has 6 devices, expected 8"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char text[512];
    snprintf(text, sizeof text,
             "HloModule b\nadd {\n x = f32[] parameter(0)\n y = f32[] parameter(1)\n"
             " ROOT s = f32[] add(x, y)\n}\nENTRY e {\n a = f32[4] parameter(0)\n"
             " ROOT r = f32[4] all-reduce(a), channel_id=1, %s, use_global_device_ids=true, "
             "to_apply=add\n}\n",
             bad[i][0]);
    ck_assert_int_ne(parse_err(text, &st), 0);
    ck_assert_msg(strstr(st.msg, bad[i][1]) != NULL, "%s: got '%s'", bad[i][0], st.msg);
  }
}
END_TEST

/* ---- denotations ---------------------------------------------------------- */

static const kiln_sharding *param_sharding(const kiln_module *m, int64_t n) {
  const kiln_instr *p = kiln_computation_param(m, kiln_module_entry(m), n);
  const kiln_attr *a = kiln_instr_attr(p, KILN_ATTR_SHARDING);
  return a ? a->v.sharding : NULL;
}

static bool shardings_equal(const char *x, const char *y) {
  char text[512];
  snprintf(
      text, sizeof text,
      "HloModule s\nENTRY e {\n a = f32[8,8] parameter(0), sharding=%s\n"
      " b = f32[8,8] parameter(1), sharding=%s\n ROOT t = (f32[8,8], f32[8,8]) tuple(a, b)\n}\n",
      x, y);
  kiln_module *m = parse_ok(text);
  bool eq = kiln_sharding_equal(param_sharding(m, 0), param_sharding(m, 1));
  ck_assert(eq == kiln_sharding_equal(param_sharding(m, 1), param_sharding(m, 0)));
  kiln_module_destroy(m);
  return eq;
}

START_TEST(test_sharding_equal) {
  ck_assert(shardings_equal("{devices=[2,4]<=[8]}", "{devices=[2,4]0,1,2,3,4,5,6,7}"));
  ck_assert(shardings_equal("{devices=[4,2]<=[2,4]T(1,0)}", "{devices=[4,2]0,4,1,5,2,6,3,7}"));
  ck_assert(
      shardings_equal("{devices=[2,2,2]<=[2,2,2]T(2,0,1)}", "{devices=[2,2,2]0,2,4,6,1,3,5,7}"));
  ck_assert(shardings_equal("{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
                            "{devices=[2,1,4]<=[8] last_tile_dims={replicated}}"));
  ck_assert(shardings_equal("{devices=[1,1,8]<=[8] last_tile_dim_replicate}", "{replicated}"));
  ck_assert(shardings_equal("{replicated metadata={op_name=\"a\"}}", "{replicated}"));
  ck_assert(shardings_equal("{maximal device=2}", "{maximal device=2}"));
  ck_assert(!shardings_equal("{maximal device=2}", "{maximal device=3}"));
  ck_assert(!shardings_equal("{devices=[4,2]<=[2,4]T(1,0)}", "{devices=[4,2]<=[8]}"));
  ck_assert(!shardings_equal("{devices=[2,4]<=[8]}", "{devices=[4,2]<=[8]}"));
  ck_assert(!shardings_equal("{devices=[2,1,4]<=[8] last_tile_dims={manual}}",
                             "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"));
  ck_assert(!shardings_equal("{manual}", "{replicated}"));
  ck_assert(!shardings_equal("{unknown}", "{manual}"));
  ck_assert(kiln_sharding_equal(NULL, NULL));
}
END_TEST

START_TEST(test_sharding_canonical) {
  kiln_module *m =
      parse_ok("HloModule s\nENTRY e {\n ROOT a = f32[8,8] parameter(0), "
               "sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dims={replicated}}\n}\n");
  kiln_arena *a = kiln_arena_create();
  const kiln_sharding *s = param_sharding(m, 0);
  kiln_sharding *c = kiln_sharding_canonical(a, s);
  ck_assert_ptr_nonnull(c);
  ck_assert_int_eq(c->kind, KILN_SHARD_TILED);
  ck_assert_uint_eq(c->iota_reshape.n, 0);
  ck_assert(c->last_tile_dim_replicate);
  ck_assert_uint_eq(c->last_tile_dims.n, 0);
  static const int64_t want[] = {0, 4, 1, 5, 2, 6, 3, 7};
  ck_assert_uint_eq(c->devices.n, 8);
  for (int i = 0; i < 8; i++) ck_assert_int_eq(c->devices.v[i], want[i]);
  ck_assert(kiln_sharding_equal(c, s));
  kiln_arena_destroy(a);
  kiln_module_destroy(m);
}
END_TEST

/* The groups of `rg` as "{0,1},{2,3}". */
static void groups_text(const char *rg, char *out, size_t size) {
  char text[512];
  snprintf(text, sizeof text,
           "HloModule g\nadd {\n x = f32[] parameter(0)\n y = f32[] parameter(1)\n"
           " ROOT s = f32[] add(x, y)\n}\nENTRY e {\n a = f32[4] parameter(0)\n"
           " ROOT r = f32[4] all-reduce(a), channel_id=1, replica_groups=%s, "
           "use_global_device_ids=true, to_apply=add\n}\n",
           rg);
  kiln_module *m = parse_ok(text);
  const kiln_instr *r = kiln_computation_root(m, kiln_module_entry(m));
  kiln_arena *a = kiln_arena_create();
  int64_t *ids, ng, sz;
  kiln_status st = {0};
  ck_assert_int_eq(
      kiln_replica_groups_expand(kiln_instr_attr(r, KILN_ATTR_REPLICA_GROUPS)->v.groups, a, &ids,
                                 &ng, &sz, &st),
      0);
  size_t n = 0;
  out[0] = 0;
  for (int64_t g = 0; g < ng; g++) {
    n += (size_t)snprintf(out + n, size - n, "%s{", g ? "," : "");
    for (int64_t i = 0; i < sz; i++)
      n += (size_t)snprintf(out + n, size - n, "%s%lld", i ? "," : "", (long long)ids[g * sz + i]);
    n += (size_t)snprintf(out + n, size - n, "}");
  }
  kiln_arena_destroy(a);
  kiln_module_destroy(m);
}

START_TEST(test_replica_group_forms) {
  char g[256];
  groups_text("{{0,2},{1,3}}", g, sizeof g);
  ck_assert_str_eq(g, "{0,2},{1,3}");
  groups_text("[2,4]<=[8]", g, sizeof g);
  ck_assert_str_eq(g, "{0,1,2,3},{4,5,6,7}");
  groups_text("[4,2]<=[2,4]T(1,0)", g, sizeof g);
  ck_assert_str_eq(g, "{0,4},{1,5},{2,6},{3,7}");
  groups_text("mesh['stage'=2,'local'=4] {'local'}", g, sizeof g);
  ck_assert_str_eq(g, "{0,1,2,3},{4,5,6,7}");
  groups_text("mesh['stage'=2,'local'=4] {'stage'}", g, sizeof g);
  ck_assert_str_eq(g, "{0,4},{1,5},{2,6},{3,7}");
  groups_text("mesh['a'=2,'b'=2,'c'=2] {'c','a'}", g, sizeof g);
  ck_assert_str_eq(g, "{0,4,1,5},{2,6,3,7}");
  groups_text("mesh['x'=4] {'x':(2)2}", g, sizeof g);
  ck_assert_str_eq(g, "{0,2},{1,3}");
  groups_text("mesh['x'=8] {'x':(1)2}", g, sizeof g);
  ck_assert_str_eq(g, "{0,1},{2,3},{4,5},{6,7}");
  groups_text("mesh['x'=2,'y'=2] {}", g, sizeof g);
  ck_assert_str_eq(g, "{0},{1},{2},{3}");
}
END_TEST

/* The members device `dev` meets in the root of `text` on R x P. */
static void members(const char *attrs, int64_t R, int64_t P, int64_t dev, char *out, size_t size) {
  char text[512];
  snprintf(text, sizeof text,
           "HloModule g\nadd {\n x = f32[] parameter(0)\n y = f32[] parameter(1)\n"
           " ROOT s = f32[] add(x, y)\n}\nENTRY e {\n a = f32[4] parameter(0)\n"
           " ROOT r = f32[4] all-reduce(a), %s, to_apply=add\n}\n",
           attrs);
  kiln_module *m = parse_ok(text);
  const kiln_instr *r = kiln_computation_root(m, kiln_module_entry(m));
  kiln_arena *a = kiln_arena_create();
  kiln_collective_group g;
  kiln_status st = {0};
  ck_assert_msg(kiln_collective_group_of(r, R, P, dev, a, &g, &st) == 0, "%s", st.msg);
  size_t n = (size_t)snprintf(out, size, "r%lld:", (long long)g.rank);
  for (int64_t i = 0; i < g.n; i++)
    n += (size_t)snprintf(out + n, size - n, "%s%lld", i ? "," : "", (long long)g.members[i]);
  kiln_arena_destroy(a);
  kiln_module_destroy(m);
}

START_TEST(test_group_modes) {
  char g[128];
  /* Cross-replica: replica ids, within the device's partition. */
  members("replica_groups={{0,1}}", 2, 2, 3, g, sizeof g);
  ck_assert_str_eq(g, "r1:1,3");
  /* Cross-replica-and-partition: every partition of the listed replicas. */
  members("channel_id=1, replica_groups={{1,0}}", 2, 2, 1, g, sizeof g);
  ck_assert_str_eq(g, "r3:2,3,0,1");
  /* Flattened ids. */
  members("channel_id=1, replica_groups={{3,1},{0,2}}, use_global_device_ids=true", 2, 2, 1, g,
          sizeof g);
  ck_assert_str_eq(g, "r1:3,1");
  /* No groups: everyone of the mode's id space. */
  members("replica_groups={}", 4, 1, 2, g, sizeof g);
  ck_assert_str_eq(g, "r2:0,1,2,3");
  kiln_status st = {0};
  kiln_module *m =
      parse_ok("HloModule g\nadd {\n x = f32[] parameter(0)\n y = f32[] parameter(1)\n"
               " ROOT s = f32[] add(x, y)\n}\nENTRY e {\n a = f32[4] parameter(0)\n"
               " ROOT r = f32[4] all-reduce(a), replica_groups={{0,1},{1,2}}, to_apply=add\n}\n");
  kiln_arena *a = kiln_arena_create();
  kiln_collective_group cg;
  ck_assert_int_eq(kiln_collective_group_of(kiln_computation_root(m, kiln_module_entry(m)), 3, 1, 0,
                                            a, &cg, &st),
                   KILN_EINVAL);
  ck_assert_ptr_nonnull(strstr(st.msg, "in two replica groups"));
  kiln_arena_destroy(a);
  kiln_module_destroy(m);
}
END_TEST

/* ---- the interpreter's mesh ----------------------------------------------- */

/* Runs `text` with no arguments on R x P and returns every device's
 * result printed, "|"-separated. */
static int run_mesh(const char *text, uint32_t R, uint32_t P, char *out, size_t size,
                    kiln_status *st) {
  kiln_module *m = parse_ok(text);
  uint32_t n = R * P;
  kiln_literal **outs = kiln_calloc(n, sizeof *outs);
  kiln_status_clear(st);
  kiln_interp_options o = {.timeout_seconds = 20};
  int rc = kiln_interp_run_mesh(m, R, P, NULL, 0, &o, outs, st);
  out[0] = 0;
  kiln_sbuf b = KILN_SBUF_INIT;
  for (uint32_t k = 0; rc == 0 && k < n; k++) {
    if (k) kiln_sbuf_putc(&b, '|');
    kiln_literal_print(&b, outs[k], false);
    kiln_literal_destroy(outs[k]);
  }
  if (rc == 0) snprintf(out, size, "%s", kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  kiln_free(outs);
  kiln_module_destroy(m);
  return rc;
}

static const char prelude[] =
    "HloModule c\n"
    "add {\n x = s32[] parameter(0)\n y = s32[] parameter(1)\n ROOT s = s32[] add(x, y)\n}\n"
    "max {\n x = s32[] parameter(0)\n y = s32[] parameter(1)\n ROOT s = s32[] maximum(x, y)\n}\n";

/* ENTRY with %id = this device's replica id (s32) and %v = s32[n] with
 * element i = id * n + i, then `body` whose last line is the ROOT. */
static void program(char *text, size_t size, int n, const char *body) {
  snprintf(text, size,
           "%sENTRY e {\n id0 = u32[] replica-id()\n id = s32[] convert(id0)\n"
           " nn = s32[] constant(%d)\n idn = s32[] multiply(id, nn)\n b = s32[%d] broadcast(idn), "
           "dimensions={}\n"
           " io = s32[%d] iota(), iota_dimension=0\n v = s32[%d] add(b, io)\n one = s32[1] "
           "reshape(id)\n%s}\n",
           prelude, n, n, n, n, body);
}

static void expect_devices(const char *body, int n, const char *const *want) {
  char text[4096], got[4096];
  program(text, sizeof text, n, body);
  kiln_status st;
  int rc = run_mesh(text, (uint32_t)n, 1, got, sizeof got, &st);
  ck_assert_msg(rc == 0, "%d devices: %s: %s", n, st.where, st.msg);
  char expect[4096] = "";
  size_t len = 0;
  for (int k = 0; k < n; k++)
    len += (size_t)snprintf(expect + len, sizeof expect - len, "%s%s", k ? "|" : "", want[k]);
  ck_assert_msg(strcmp(got, expect) == 0, "%d devices, body\n%s\ngot    %s\nwanted %s", n, body,
                got, expect);
}

static void fmt_list(char *out, size_t size, const int64_t *v, int n) {
  size_t len = (size_t)snprintf(out, size, "{");
  for (int i = 0; i < n; i++)
    len += (size_t)snprintf(out + len, size - len, "%s%lld", i ? ", " : "", (long long)v[i]);
  snprintf(out + len, size - len, "}");
}

/* Replaces every "N" in body with n (bodies are written for any size). */
static void expect_n(const char *body, int n, const char *const *want) {
  char b[2048];
  size_t j = 0;
  for (const char *p = body; *p && j + 8 < sizeof b; p++) {
    if (*p == 'N' && (p == body || p[-1] == '[' || p[-1] == ',' || p[-1] == '{'))
      j += (size_t)snprintf(b + j, sizeof b - j, "%d", n);
    else
      b[j++] = *p;
  }
  b[j] = 0;
  expect_devices(b, n, want);
}

START_TEST(test_mesh_each_collective) {
  static const int sizes[] = {1, 2, 4, 8};
  for (size_t si = 0; si < 4; si++) {
    int n = sizes[si];
    char ws[8][512];
    const char *want[8];
    for (int k = 0; k < n; k++) want[k] = ws[k];
    int64_t v[64];
    /* all-reduce, sum and async */
    for (int i = 0; i < n; i++) v[i] = (int64_t)n * (n - 1) / 2 * n + (int64_t)n * i;
    for (int k = 0; k < n; k++) fmt_list(ws[k], 512, v, n);
    expect_n(" ROOT r = s32[N] all-reduce(v), replica_groups={}, to_apply=add\n", n, want);
    expect_n(" s = s32[N] all-reduce-start(v), replica_groups={}, to_apply=add\n"
             " ROOT r = s32[N] all-reduce-done(s)\n",
             n, want);
    /* all-reduce, max: the last device's values */
    for (int i = 0; i < n; i++) v[i] = (int64_t)(n - 1) * n + i;
    for (int k = 0; k < n; k++) fmt_list(ws[k], 512, v, n);
    expect_n(" ROOT r = s32[N] all-reduce(v), replica_groups={}, to_apply=max\n", n, want);
    /* all-gather of each device's id, sync and async */
    for (int i = 0; i < n; i++) v[i] = i;
    for (int k = 0; k < n; k++) fmt_list(ws[k], 512, v, n);
    expect_n(" ROOT r = s32[N] all-gather(one), replica_groups={}, dimensions={0}\n", n, want);
    expect_n(" s = (s32[1], s32[N]) all-gather-start(one), replica_groups={}, dimensions={0}\n"
             " ROOT r = s32[N] all-gather-done(s)\n",
             n, want);
    /* reduce-scatter: rank r keeps element r of the sum */
    for (int k = 0; k < n; k++) {
      int64_t x = (int64_t)n * (n - 1) / 2 * n + (int64_t)n * k;
      fmt_list(ws[k], 512, &x, 1);
    }
    expect_n(
        " ROOT r = s32[1] reduce-scatter(v), replica_groups={}, dimensions={0}, to_apply=add\n", n,
        want);
    /* all-to-all: device r gets element r of every device, in device order */
    for (int k = 0; k < n; k++) {
      for (int j = 0; j < n; j++) v[j] = (int64_t)j * n + k;
      fmt_list(ws[k], 512, v, n);
    }
    expect_n(" ROOT r = s32[N] all-to-all(v), replica_groups={}, dimensions={0}\n", n, want);
    /* collective-permute around the ring, sync and async */
    char pairs[256] = "";
    size_t pl = 0;
    for (int k = 0; k < n; k++)
      pl += (size_t)snprintf(pairs + pl, sizeof pairs - pl, "%s{%d,%d}", k ? "," : "", k,
                             (k + 1) % n);
    for (int k = 0; k < n; k++) {
      int64_t x = (k + n - 1) % n;
      fmt_list(ws[k], 512, &x, 1);
    }
    char body[1024];
    snprintf(body, sizeof body,
             " ROOT r = s32[1] collective-permute(one), source_target_pairs={%s}\n", pairs);
    expect_n(body, n, want);
    snprintf(body, sizeof body,
             " s = (s32[1], s32[1]) collective-permute-start(one), source_target_pairs={%s}\n"
             " ROOT r = s32[1] collective-permute-done(s)\n",
             pairs);
    expect_n(body, n, want);
    /* collective-permute that nobody sends to device 0 (a line, not a ring): zeros there */
    if (n > 1) {
      pl = 0;
      for (int k = 0; k + 1 < n; k++)
        pl += (size_t)snprintf(pairs + pl, sizeof pairs - pl, "%s{%d,%d}", k ? "," : "", k, k + 1);
      for (int k = 0; k < n; k++) {
        int64_t x = k ? k - 1 : 0;
        fmt_list(ws[k], 512, &x, 1);
      }
      snprintf(body, sizeof body,
               " ROOT r = s32[1] collective-permute(one), source_target_pairs={%s}\n", pairs);
      expect_n(body, n, want);
    }
    /* collective-broadcast from rank 0 */
    for (int k = 0; k < n; k++) {
      int64_t x = 0;
      fmt_list(ws[k], 512, &x, 1);
    }
    expect_n(" ROOT r = s32[1] collective-broadcast(one), replica_groups={}\n", n, want);
  }
}
END_TEST

/* Subgroups, partitions and the async-free iota forms on a 2 x 4 mesh. */
START_TEST(test_mesh_partitions) {
  char text[2048], got[2048];
  kiln_status st;
  /* Partition-id summed across partitions of each replica (iota groups,
   * flattened ids), plus 10 x replica-id. */
  snprintf(text, sizeof text,
           "%sENTRY e {\n p0 = u32[] partition-id()\n p = s32[] convert(p0)\n"
           " r0 = u32[] replica-id()\n r = s32[] convert(r0)\n ten = s32[] constant(10)\n"
           " rt = s32[] multiply(r, ten)\n x = s32[] add(p, rt)\n"
           " ROOT s = s32[] all-reduce(x), channel_id=1, replica_groups=[2,4]<=[8], "
           "use_global_device_ids=true, to_apply=add\n}\n",
           prelude);
  ck_assert_int_eq(run_mesh(text, 2, 4, got, sizeof got, &st), 0);
  ck_assert_str_eq(got, "6|6|6|6|46|46|46|46");
  /* Across replicas within a partition (the transposed iota). */
  snprintf(text, sizeof text,
           "%sENTRY e {\n p0 = u32[] partition-id()\n p = s32[] convert(p0)\n"
           " r0 = u32[] replica-id()\n r = s32[] convert(r0)\n ten = s32[] constant(10)\n"
           " rt = s32[] multiply(r, ten)\n x = s32[] add(p, rt)\n"
           " ROOT s = s32[] all-reduce(x), channel_id=1, replica_groups=mesh['r'=2,'p'=4] {'r'}, "
           "use_global_device_ids=true, to_apply=add\n}\n",
           prelude);
  ck_assert_int_eq(run_mesh(text, 2, 4, got, sizeof got, &st), 0);
  ck_assert_str_eq(got, "10|12|14|16|10|12|14|16");
  /* Cross-partition collective-permute: partition pairs, within each replica. */
  snprintf(
      text, sizeof text,
      "%sENTRY e {\n p0 = u32[] partition-id()\n r0 = u32[] replica-id()\n"
      " ten = u32[] constant(10)\n rt = u32[] multiply(r0, ten)\n x = u32[] add(p0, rt)\n"
      " ROOT s = u32[] collective-permute(x), channel_id=1, source_target_pairs={{0,1},{1,0}}\n}\n",
      prelude);
  ck_assert_int_eq(run_mesh(text, 2, 2, got, sizeof got, &st), 0);
  ck_assert_str_eq(got, "1|0|11|10");
}
END_TEST

/* A device that never reaches a collective its peers wait in makes them
 * fail naming it, never hang; a group mismatch fails too. */
START_TEST(test_mesh_failures) {
  char text[2048], got[256];
  kiln_status st;
  snprintf(text, sizeof text,
           "%sbody {\n a = s32[] parameter(0)\n ROOT r = s32[] all-reduce(a), replica_groups={}, "
           "to_apply=add\n}\nskip {\n a = s32[] parameter(0)\n ROOT r = s32[] copy(a)\n}\n"
           "ENTRY e {\n id0 = u32[] replica-id()\n z = u32[] constant(0)\n"
           " c = pred[] compare(id0, z), direction=EQ\n one = s32[] constant(1)\n"
           " ROOT r = s32[] conditional(c, one, one), true_computation=body, "
           "false_computation=skip\n}\n",
           prelude);
  ck_assert_int_eq(run_mesh(text, 2, 1, got, sizeof got, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "device 0") && strstr(st.msg, "finished before reaching"), "%s",
                st.msg);
  /* An error in one device's collective reaches the caller, lowest device first. */
  snprintf(text, sizeof text,
           "%sENTRY e {\n one = s32[] constant(1)\n"
           " ROOT r = s32[] all-reduce(one), replica_groups={{0,1},{1,2}}, to_apply=add\n}\n",
           prelude);
  ck_assert_int_eq(run_mesh(text, 3, 1, got, sizeof got, &st), KILN_EINVAL);
  ck_assert_msg(strstr(st.msg, "device 0:") && strstr(st.msg, "two replica groups"), "%s", st.msg);
  kiln_interp_options o = {0};
  kiln_literal *outs[1];
  ck_assert_int_eq(kiln_interp_run_mesh(NULL, 1, 1, NULL, 0, &o, outs, &st), KILN_EINVAL);
  kiln_module *m = parse_ok(text);
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_interp_run_mesh(m, 0, 1, NULL, 0, &o, outs, &st), KILN_EINVAL);
  kiln_module_destroy(m);
}
END_TEST

/* Shardy's markers and with_sharding_constraint run as identities. */
START_TEST(test_annotations_identity) {
  char text[2048], got[256];
  kiln_status st;
  snprintf(
      text, sizeof text,
      "HloModule a, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<[\"x\"=2]>}}\n"
      "ENTRY e {\n c = s32[2] constant({3, 4})\n"
      " s = s32[2] custom-call(c), custom_call_target=\"Sharding\", sharding={devices=[2]<=[2]}\n"
      " ROOT r = s32[2] custom-call(s), custom_call_target=\"xla.sdy.FuncResultSharding\", "
      "custom_call_has_side_effect=true, "
      "frontend_attributes={xla.sdy.sharding=\"#sdy.sharding_per_value<[<@mesh, "
      "[{\\\"x\\\"}]>]>\"}\n}\n");
  ck_assert_int_eq(run_mesh(text, 1, 1, got, sizeof got, &st), 0);
  ck_assert_str_eq(got, "{3, 4}");
}
END_TEST

static Suite *sharding_suite(void) {
  Suite *s = suite_create("sharding");
  TCase *tc = tcase_create("forms");
  tcase_add_test(tc, test_roundtrip_text_and_proto);
  tcase_add_test(tc, test_bad_forms_named);
  tcase_add_test(tc, test_sharding_equal);
  tcase_add_test(tc, test_sharding_canonical);
  tcase_add_test(tc, test_replica_group_forms);
  tcase_add_test(tc, test_group_modes);
  suite_add_tcase(s, tc);
  tc = tcase_create("mesh");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_mesh_each_collective);
  tcase_add_test(tc, test_mesh_partitions);
  tcase_add_test(tc, test_mesh_failures);
  tcase_add_test(tc, test_annotations_identity);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(sharding_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
