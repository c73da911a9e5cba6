/* The C compiler driver: SHA-256, the split into content-named units, the
 * parallel build, the kernel cache (hits, its bound, a corrupt or foreign
 * file ignored) and the time limit over the whole build. */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/codegen/c_target.h"
#include "compiler/codegen/cc_internal.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "executor/run.h"

static void hex_of(const char *msg, size_t len, char *out) {
  uint8_t d[KILN__SHA256_LEN];
  kiln__sha256_of(msg, len, d);
  kiln__hex(d, sizeof d, out);
}

START_TEST(sha256_vectors) {
  char h[65];
  hex_of("", 0, h);
  ck_assert_str_eq(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  hex_of("abc", 3, h);
  ck_assert_str_eq(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  hex_of(m, strlen(m), h);
  ck_assert_str_eq(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  /* A million 'a' in uneven pieces. */
  static char a[1000];
  memset(a, 'a', sizeof a);
  kiln__sha256 s;
  kiln__sha256_init(&s);
  for (size_t done = 0, k = 1; done < 1000000; k = k % 997 + 1) {
    size_t n = done + k > 1000000 ? 1000000 - done : k;
    kiln__sha256_update(&s, a, n);
    done += n;
  }
  uint8_t d[32];
  kiln__sha256_final(&s, d);
  kiln__hex(d, 32, h);
  ck_assert_str_eq(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}
END_TEST

/* ---- the split --------------------------------------------------------- */

static const char prelude[] = "#include <stdint.h>\n";

/* Kernels 0 and 2 are the same kernel calling the same helper under two
 * numbers; kernel 1 calls a helper that calls another. */
static const char funcs_a[] =
    "static inline float kf0(float p0, float p1) {\n  return p0 + p1;\n}\n\n"
    "static inline float kf1(float p0, float p1) {\n  return p0 + p1;\n}\n\n"
    "static inline float kf2(float p0) {\n  return kf0(p0, 1.0f);\n}\n\n";
static const char kernels_a[] =
    "void kiln_kernel_0(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  float *b0 = (float *)bufs[0];\n  b0[0] = kf0(b0[0], 0x1p3f);\n}\n\n"
    "void kiln_kernel_1(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  float *b0 = (float *)bufs[0];\n  b0[1] = kf2(b0[1]);\n}\n\n"
    "void kiln_kernel_2(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  float *b0 = (float *)bufs[0];\n  b0[0] = kf1(b0[0], 0x1p3f);\n}\n\n"
    "void kiln_kernel_3(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  float *b0 = (float *)bufs[0];\n  b0[2] = 3;\n}\n\n";
/* The same kernels elsewhere: kernel 1 of a is kernel 0 here. */
static const char funcs_b[] =
    "static inline float kf0(float p0, float p1) {\n  return p0 + p1;\n}\n\n"
    "static inline float kf1(float p0) {\n  return kf0(p0, 1.0f);\n}\n\n";
static const char kernels_b[] =
    "void kiln_kernel_0(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  float *b0 = (float *)bufs[0];\n  b0[1] = kf1(b0[1]);\n}\n\n"
    "void kiln_kernel_1(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  float *b0 = (float *)bufs[0];\n  b0[2] = 3;\n}\n\n"
    "void kiln_kernel_2(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  float *b0 = (float *)bufs[0];\n  b0[0] = kf0(b0[0], 0x1p3f);\n}\n\n";

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

START_TEST(split_names_by_content) {
  kiln__cc_program pa = {prelude, funcs_a, kernels_a, 4, NULL, NULL, NULL, 0};
  kiln__cc_program pb = {prelude, funcs_b, kernels_b, 3, NULL, NULL, NULL, 0};
  kiln__cc_split a, b;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__cc_split_program(&pa, 2, 64, NULL, &a, &st), 0);
  ck_assert_int_eq(kiln__cc_split_program(&pb, 2, 64, NULL, &b, &st), 0);
  ck_assert_uint_eq(a.ndistinct, 3);
  ck_assert_uint_eq(b.ndistinct, 3);
  ck_assert_uint_ge(a.nunits, 2);
  ck_assert_str_eq(a.sym[0], a.sym[2]); /* identical kernels: one symbol */
  ck_assert_str_ne(a.sym[0], a.sym[1]);
  ck_assert_str_eq(a.sym[1], b.sym[0]); /* independent of where a kernel lands */
  ck_assert_str_eq(a.sym[3], b.sym[1]);
  ck_assert_str_eq(a.sym[0], b.sym[2]);
  /* Each distinct kernel is defined in exactly one unit, renamed. */
  uint32_t kernels = 0;
  for (uint32_t u = 0; u < a.nunits; u++) {
    ck_assert_ptr_null(strstr(a.units[u].src, "kiln_kernel_"));
    ck_assert_ptr_null(strstr(a.units[u].src, "kf1("));
    ck_assert(strncmp(a.units[u].src, prelude, strlen(prelude)) == 0);
    kernels += a.units[u].nkernels;
  }
  ck_assert_uint_eq(kernels, 3);
  for (uint32_t k = 0; k < 4; k++) {
    int defs = 0;
    char def[64];
    snprintf(def, sizeof def, "void %s(", a.sym[k]);
    for (uint32_t u = 0; u < a.nunits; u++) defs += strstr(a.units[u].src, def) != NULL;
    ck_assert_int_eq(defs, 1);
  }
  /* The same kernels make the same units, whatever their order. */
  ck_assert_uint_eq(b.nunits, a.nunits);
  ck_assert_uint_le(a.nunits, 3);
  char *ta[8], *tb[8];
  for (uint32_t u = 0; u < a.nunits; u++) ta[u] = a.units[u].src, tb[u] = b.units[u].src;
  qsort(ta, a.nunits, sizeof *ta, cmp_str);
  qsort(tb, b.nunits, sizeof *tb, cmp_str);
  for (uint32_t u = 0; u < a.nunits; u++) ck_assert_str_eq(ta[u], tb[u]);
  kiln__cc_split_free(&a);
  kiln__cc_split_free(&b);
  /* Below 8 KiB of kernels a module is one unit, however many compilers. */
  ck_assert_int_eq(kiln__cc_split_program(&pa, 16, 0, NULL, &a, &st), 0);
  ck_assert_uint_eq(a.nunits, 1);
  ck_assert_uint_eq(a.units[0].nkernels, 3);
  kiln__cc_split_free(&a);
  /* Source that is not what the emitter writes is an error, not a crash. */
  kiln__cc_program bad = {prelude, funcs_a, kernels_a, 5, NULL, NULL, NULL, 0};
  ck_assert_int_eq(kiln__cc_split_program(&bad, 2, 0, NULL, &a, &st), KILN_EINTERNAL);
  kiln__cc_program wrong = {prelude, funcs_a, kernels_b + 1, 2, NULL, NULL, NULL, 0};
  ck_assert_int_eq(kiln__cc_split_program(&wrong, 2, 0, NULL, &a, &st), KILN_EINTERNAL);
}
END_TEST

/* Classes mixed: a small module's tiny kernels join the light class's
 * unit (with one compiler every kernel shares one unit), and a kernel of
 * another class than its unit's is declared first with its attribute. */
START_TEST(split_mixes_classes_with_attrs) {
  static const uint8_t cls[] = {KILN__CC_TINY, KILN__CC_LIGHT, KILN__CC_TINY, KILN__CC_HEAVY};
  static const char *const attrs[] = {"ATTR_HEAVY", "ATTR_LIGHT", "ATTR_TINY"};
  kiln__cc_program pa = {prelude, funcs_a, kernels_a, 4, cls, NULL, NULL, 0};
  kiln__cc_split a;
  kiln_status st;
  kiln_status_clear(&st);
  /* Apart: one unit per class, no attribute anywhere. */
  ck_assert_int_eq(kiln__cc_split_program(&pa, 2, 0, NULL, &a, &st), 0);
  ck_assert_uint_eq(a.nunits, 3);
  ck_assert_uint_eq(a.nmixed, 0);
  for (uint32_t u = 0; u < a.nunits; u++) ck_assert_ptr_null(strstr(a.units[u].src, "ATTR_"));
  kiln__cc_split_free(&a);
  /* Two compilers: the heavy unit alone, the tiny kernel with the light. */
  char decl[128];
  ck_assert_int_eq(kiln__cc_split_program(&pa, 2, 0, attrs, &a, &st), 0);
  ck_assert_uint_eq(a.nunits, 2);
  ck_assert_uint_eq(a.nmixed, 1);
  for (uint32_t u = 0; u < a.nunits; u++) {
    const kiln__cc_unit *un = &a.units[u];
    if (un->cls == KILN__CC_HEAVY) {
      ck_assert_uint_eq(un->nkernels, 1);
      ck_assert_uint_eq(un->classes, 1u << KILN__CC_HEAVY);
      ck_assert_ptr_null(strstr(un->src, "ATTR_"));
      continue;
    }
    ck_assert_uint_eq(un->cls, KILN__CC_LIGHT);
    ck_assert_uint_eq(un->classes, (1u << KILN__CC_LIGHT) | (1u << KILN__CC_TINY));
    ck_assert_uint_eq(un->nkernels, 2);
    snprintf(decl, sizeof decl, "void %s(void *const *, int64_t, int64_t) ATTR_TINY;\n", a.sym[0]);
    const char *d = strstr(un->src, decl);
    ck_assert_ptr_nonnull(d);
    char def[64];
    snprintf(def, sizeof def, "void %s(", a.sym[0]);
    ck_assert_ptr_eq(strstr(un->src, def), d);         /* declared before it is defined */
    ck_assert_ptr_null(strstr(un->src, "ATTR_LIGHT")); /* the unit's own flags */
    ck_assert_ptr_null(strstr(un->src, "ATTR_HEAVY"));
  }
  kiln__cc_split_free(&a);
  /* One compiler: one unit, the light class's, the others declared. */
  ck_assert_int_eq(kiln__cc_split_program(&pa, 1, 0, attrs, &a, &st), 0);
  ck_assert_uint_eq(a.nunits, 1);
  ck_assert_uint_eq(a.units[0].cls, KILN__CC_LIGHT);
  ck_assert_uint_eq(a.units[0].nkernels, 3);
  ck_assert_ptr_nonnull(strstr(a.units[0].src, "ATTR_TINY;"));
  snprintf(decl, sizeof decl, "void %s(void *const *, int64_t, int64_t) ATTR_HEAVY;\n", a.sym[3]);
  ck_assert_ptr_nonnull(strstr(a.units[0].src, decl));
  kiln__cc_split_free(&a);
  /* Tiny kernels of more than 2 KiB keep a unit of their own when two
   * compilers may run, and join the others' with one. */
  kiln_sbuf big = KILN_SBUF_INIT;
  kiln_sbuf_puts(&big, "void kiln_kernel_0(void *const *bufs, int64_t begin, int64_t end) {\n");
  for (int l = 0; l < 100; l++) kiln_sbuf_printf(&big, "  ((float *)bufs[0])[%d] += %d;\n", l, l);
  kiln_sbuf_puts(&big, "}\n\nvoid kiln_kernel_1(void *const *bufs, int64_t begin, int64_t end) {\n"
                       "  ((float *)bufs[0])[0] = 1;\n}\n\n");
  static const uint8_t tl[] = {KILN__CC_TINY, KILN__CC_LIGHT};
  kiln__cc_program pbig = {prelude, "", kiln_sbuf_str(&big), 2, tl, NULL, NULL, 0};
  ck_assert_int_eq(kiln__cc_split_program(&pbig, 2, 0, attrs, &a, &st), 0);
  ck_assert_uint_eq(a.nunits, 2);
  ck_assert_uint_eq(a.nmixed, 0);
  kiln__cc_split_free(&a);
  ck_assert_int_eq(kiln__cc_split_program(&pbig, 1, 0, attrs, &a, &st), 0);
  ck_assert_uint_eq(a.nunits, 1);
  ck_assert_uint_eq(a.nmixed, 1);
  kiln__cc_split_free(&a);
  kiln_sbuf_free(&big);
  /* Tiny kernels alone stay one tiny unit, without attributes. */
  static const uint8_t all_tiny[] = {KILN__CC_TINY, KILN__CC_TINY, KILN__CC_TINY, KILN__CC_TINY};
  pa.cls = all_tiny;
  ck_assert_int_eq(kiln__cc_split_program(&pa, 1, 0, attrs, &a, &st), 0);
  ck_assert_uint_eq(a.nunits, 1);
  ck_assert_uint_eq(a.units[0].cls, KILN__CC_TINY);
  ck_assert_ptr_null(strstr(a.units[0].src, "ATTR_"));
  kiln__cc_split_free(&a);
}
END_TEST

/* A unit's prelude holds the helpers its kernels call, transitively, and
 * every other line (a macro may name a helper: it stays, and so does the
 * helper); a helper defined inside a macro is the macro's. */
static const char trim_prelude[] = "typedef int i32;\n"
                                   "#define KI static inline\n"
                                   "#define KM(x) kmac(x)\n"
                                   "KI int ka(int x) { return x + 1; }\n"
                                   "KI int kb(int x) {\n  return ka(x) * 2;\n}\n"
                                   "KI int kunused(int x) {\n  return x;\n}\n"
                                   "KI int kmac(int x) { return x; }\n"
                                   "#define KDEF(W) \\\nKI int kdef##W(int x) { return x; }\n"
                                   "KDEF(1)\n"
                                   "KI int klast(int x) { return x - 1; }\n";
static const char trim_kernels[] =
    "void kiln_kernel_0(void *const *bufs, int64_t begin, int64_t end) {\n"
    "  ((int *)bufs[0])[0] = kb(1);\n}\n\n";

START_TEST(unit_prelude_holds_what_it_calls) {
  kiln__cc_program p = {trim_prelude, "", trim_kernels, 1, NULL, NULL, NULL, 0};
  kiln__cc_split s;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__cc_split_program(&p, 1, 0, NULL, &s, &st), 0);
  ck_assert_uint_eq(s.nunits, 1);
  const char *u = s.units[0].src;
  static const char *const kept[] = {"typedef int i32;\n",
                                     "#define KM(x) kmac(x)\n",
                                     "KI int ka(int x) { return x + 1; }\n",
                                     "KI int kb(int x) {\n  return ka(x) * 2;\n}\n",
                                     "KI int kmac(int x) { return x; }\n",
                                     "#define KDEF(W) \\\nKI int kdef##W(int x) { return x; }\n",
                                     "KDEF(1)\n"};
  const char *at = u;
  for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) { /* in the prelude's order */
    const char *f = strstr(at, kept[i]);
    ck_assert_msg(f != NULL, "missing: %s", kept[i]);
    at = f + strlen(kept[i]);
  }
  ck_assert_ptr_null(strstr(u, "kunused"));
  ck_assert_ptr_null(strstr(u, "klast"));
  kiln__cc_split_free(&s);
  /* A helper without its closing brace: the prelude is kept whole. */
  static const char broken[] = "KI int ka(int x) {\n  return x;\nKI int kb(int x) { return x; }\n";
  p.prelude = broken;
  ck_assert_int_eq(kiln__cc_split_program(&p, 1, 0, NULL, &s, &st), 0);
  ck_assert(strncmp(s.units[0].src, broken, strlen(broken)) == 0);
  kiln__cc_split_free(&s);
}
END_TEST

/* The C target's prelude, trimmed for a kernel that names any one of its
 * helpers, declares everything that helper calls: the unit compiles with
 * implicit declarations as errors (cc.c compiles with -w, which would hide
 * them until the shared object failed to load). */
START_TEST(c_prelude_trimmed_for_each_helper_compiles) {
  const char *pre = kiln__c_target.prelude;
  int helpers = 0;
  bool continued = false;
  for (const char *l = pre; *l;) {
    const char *eol = strchr(l, '\n');
    if (eol == NULL) eol = l + strlen(l);
    bool fn = !continued && strncmp(l, "KI ", 3) == 0;
    continued = eol > l && eol[-1] == '\\';
    if (fn) {
      const char *paren = memchr(l, '(', (size_t)(eol - l)), *e = paren;
      ck_assert_ptr_nonnull(paren);
      while (e > l && e[-1] == ' ') e--;
      const char *b = e;
      while (b > l && (isalnum((unsigned char)b[-1]) || b[-1] == '_')) b--;
      char kernel[256];
      snprintf(kernel, sizeof kernel,
               "void kiln_kernel_0(void *const *bufs, int64_t begin, int64_t end) {\n"
               "  (void)%.*s;\n}\n\n",
               (int)(e - b), b);
      kiln__cc_program p = {pre, "", kernel, 1, NULL, NULL, NULL, 0};
      kiln__cc_split s;
      kiln_status st;
      kiln_status_clear(&st);
      ck_assert_int_eq(kiln__cc_split_program(&p, 1, 0, NULL, &s, &st), 0);
      ck_assert_uint_lt(s.units[0].len, strlen(pre) + strlen(kernel)); /* trimmed */
      char path[] = "/tmp/kiln-trim-XXXXXX", cmd[400];
      int fd = mkstemp(path);
      ck_assert_int_ge(fd, 0);
      ck_assert_int_eq(write(fd, s.units[0].src, s.units[0].len), (ssize_t)s.units[0].len);
      close(fd);
      snprintf(cmd, sizeof cmd,
               "cc -fsyntax-only -Werror=implicit-function-declaration -Werror=implicit-int "
               "-x c %s 2>&1 | grep -m3 error",
               path);
      ck_assert_msg(system(cmd) != 0, "%.*s: the trimmed prelude does not compile (%s)",
                    (int)(e - b), b, cmd);
      unlink(path);
      kiln__cc_split_free(&s);
      helpers++;
    }
    l = *eol ? eol + 1 : eol;
  }
  ck_assert_int_gt(helpers, 40);
}
END_TEST

START_TEST(split_large_program_content_defined) {
  /* 400 distinct kernels of ~1 KiB: many units, each within 1.5 targets. */
  kiln_sbuf k = KILN_SBUF_INIT;
  for (int i = 0; i < 400; i++) {
    kiln_sbuf_printf(&k, "void kiln_kernel_%d(void *const *bufs, int64_t begin, int64_t end) {\n",
                     i);
    for (int l = 0; l < 30; l++) kiln_sbuf_printf(&k, "  ((float *)bufs[0])[%d] += %d;\n", l, i);
    kiln_sbuf_puts(&k, "}\n\n");
  }
  kiln__cc_program p = {prelude, "", kiln_sbuf_str(&k), 400, NULL, NULL, NULL, 0};
  kiln__cc_split s;
  kiln_status st;
  ck_assert_int_eq(kiln__cc_split_program(&p, 2, 32768, NULL, &s, &st), 0);
  ck_assert_uint_ge(s.nunits, 8);
  for (uint32_t u = 0; u < s.nunits; u++) ck_assert_uint_le(s.units[u].len, 32768 + 16384 + 4096);
  kiln__cc_split_free(&s);
  kiln_sbuf_free(&k);
}
END_TEST

/* ---- builds through kiln_compile --------------------------------------- */

/* Several kernels that do not fuse: a reduce, a sort, elementwise work. */
static const char multi_hlo[] =
    "HloModule m\n"
    "add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }\n"
    "lt { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT l = pred[] compare(a, b), "
    "direction=LT }\n"
    "ENTRY main {\n  p = f32[64,32] parameter(0)\n  e = f32[64,32] exponential(p)\n"
    "  z = f32[] constant(0)\n  r = f32[64] reduce(e, z), dimensions={1}, to_apply=add\n"
    "  s = f32[64] sort(r), dimensions={0}, to_apply=lt\n"
    "  t = f32[64] tanh(s)\n  ROOT o = (f32[64], f32[64,32]) tuple(t, e)\n}\n";

static kiln_module *parse(const char *hlo) {
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_module_parse_text(hlo, strlen(hlo), "t.hlo", NULL, &m, &st) == 0, "%s",
                st.msg);
  return m;
}

static int compile(const char *hlo, const kiln_compile_options *o, kiln_compile_report *r,
                   kiln_executable **out, kiln_status *st) {
  kiln_module *m = parse(hlo);
  kiln_executable *e = NULL;
  kiln_status_clear(st);
  int rc = kiln_compile(m, o, &e, r, st);
  if (out)
    *out = e;
  else
    kiln_executable_destroy(e);
  kiln_module_destroy(m);
  return rc;
}

START_TEST(cache_hit_same_code) {
  setenv("KILN_CC_UNIT_BYTES", "512", 1); /* several units of a small module */
  kiln__cc_cache_clear();
  kiln__cc_cache_set_limit(UINT64_C(64) << 20);
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.cc_jobs = 2;
  kiln_compile_report r1, r2, r3;
  kiln_executable *e1, *e2, *e3;
  kiln_status st;
  ck_assert_int_eq(compile(multi_hlo, &o, &r1, &e1, &st), 0);
  ck_assert_uint_ge(r1.nkernels, 2);
  ck_assert_uint_ge(r1.cc_units, 2);
  ck_assert_uint_eq(r1.cc_units_cached, 0);
  ck_assert_int_eq(compile(multi_hlo, &o, &r2, &e2, &st), 0);
  ck_assert_uint_eq(r2.cc_units_cached, r2.cc_units); /* every unit reused */
  o.no_kernel_cache = true;                           /* compiled afresh, the same units */
  ck_assert_int_eq(compile(multi_hlo, &o, &r3, &e3, &st), 0);
  ck_assert_uint_eq(r3.cc_units_cached, 0);
  /* The same objects make the same shared object. */
  ck_assert_uint_eq(e1->ncode, e2->ncode);
  ck_assert_int_eq(memcmp(e1->code, e2->code, e1->ncode), 0);
  ck_assert_uint_eq(e1->ncode, e3->ncode);
  ck_assert_int_eq(memcmp(e1->code, e3->code, e1->ncode), 0);
  kiln_executable_destroy(e1);
  kiln_executable_destroy(e2);
  kiln_executable_destroy(e3);
  kiln__cc_cache_stats cs;
  kiln__cc_cache_stats_get(&cs);
  ck_assert_uint_ge(cs.hits, r2.cc_units);
  /* The bound: set below one object, everything goes. */
  kiln__cc_cache_set_limit(100);
  kiln__cc_cache_stats_get(&cs);
  ck_assert_uint_le(cs.bytes, 100);
  ck_assert_uint_eq(cs.entries, 0);
  ck_assert_uint_gt(cs.evictions, 0);
  o.no_kernel_cache = false;
  ck_assert_int_eq(compile(multi_hlo, &o, &r2, NULL, &st), 0);
  ck_assert_uint_eq(r2.cc_units_cached, 0);
  kiln__cc_cache_stats_get(&cs);
  ck_assert_uint_le(cs.bytes, 100);
  kiln__cc_cache_set_limit(UINT64_C(64) << 20);
}
END_TEST

static int list_objects(const char *dir, char names[][300], int max) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strstr(e->d_name, ".o") && n < max) snprintf(names[n++], 300, "%s/%s", dir, e->d_name);
  closedir(d);
  return n;
}

START_TEST(disk_cache_and_corrupt_file) {
  setenv("KILN_CC_UNIT_BYTES", "512", 1);
  char dir[] = "/tmp/kiln-kcache-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  kiln__cc_cache_clear();
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.kernel_cache_dir = dir;
  kiln_compile_report r;
  kiln_status st;
  ck_assert_int_eq(compile(multi_hlo, &o, &r, NULL, &st), 0);
  char names[32][300];
  int n = list_objects(dir, names, 32);
  ck_assert_int_eq(n, (int)r.cc_units);
  /* Another process (here: an empty memory cache) finds them on disk. */
  kiln__cc_cache_clear();
  ck_assert_int_eq(compile(multi_hlo, &o, &r, NULL, &st), 0);
  ck_assert_uint_eq(r.cc_units_cached, r.cc_units);
  kiln__cc_cache_stats cs;
  kiln__cc_cache_stats_get(&cs);
  ck_assert_uint_eq(cs.disk_hits, r.cc_units);
  /* A flipped byte, a truncated file, a file others may write: misses. */
  kiln__cc_cache_clear();
  FILE *f = fopen(names[0], "r+b");
  ck_assert_ptr_nonnull(f);
  fseek(f, 100, SEEK_SET);
  int c = fgetc(f);
  fseek(f, 100, SEEK_SET);
  fputc(c ^ 0x55, f);
  fclose(f);
  if (n > 1) ck_assert_int_eq(truncate(names[1], 20), 0);
  if (n > 2) chmod(names[2], 0666);
  kiln_executable *e = NULL;
  ck_assert_int_eq(compile(multi_hlo, &o, &r, &e, &st), 0);
  kiln__cc_cache_stats_get(&cs);
  uint32_t bad = n > 2 ? 3 : (uint32_t)n;
  ck_assert_uint_eq(cs.disk_rejected, bad);
  ck_assert_uint_eq(r.cc_units_cached, r.cc_units - bad);
  kiln_executable_destroy(e);
  /* They were replaced by good ones, the one others could write too: each
   * put renames a fresh 0600 file over the rejected one. */
  kiln__cc_cache_clear();
  ck_assert_int_eq(compile(multi_hlo, &o, &r, NULL, &st), 0);
  ck_assert_uint_eq(r.cc_units_cached, r.cc_units);
  if (n > 2) {
    struct stat sb;
    ck_assert_int_eq(stat(names[2], &sb), 0);
    ck_assert_int_eq(sb.st_mode & 077, 0);
  }
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
  kiln__cc_cache_clear();
}
END_TEST

static uint64_t object_bytes(const char *dir) {
  char names[64][300];
  int n = list_objects(dir, names, 64);
  uint64_t total = 0;
  for (int i = 0; i < n; i++) {
    struct stat sb;
    ck_assert_int_eq(stat(names[i], &sb), 0);
    total += (uint64_t)sb.st_size;
  }
  return total;
}

static void object_path(const char *dir, int k, char *out, size_t size) {
  uint8_t key[KILN__SHA256_LEN] = {(uint8_t)k};
  char hex[2 * KILN__SHA256_LEN + 1];
  kiln__hex(key, sizeof key, hex);
  snprintf(out, size, "%s/%s.o", dir, hex);
}

START_TEST(disk_cache_bounded_lru) {
  char dir[] = "/tmp/kiln-kcache-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  kiln__cc_cache_clear();
  kiln__cc_cache_set_dir_limit(0); /* no bound: nothing is removed */
  uint8_t obj[1000];
  memset(obj, 0x5a, sizeof obj);
  for (int k = 0; k < 4; k++) kiln__cc_cache_put(dir, (uint8_t[KILN__SHA256_LEN]){k}, obj, 1000);
  uint64_t one = object_bytes(dir) / 4; /* an object and its header */
  ck_assert_uint_gt(one, 1000);
  /* Objects 0..3 used long ago, in that order; then a hit on object 0
   * from another process (an empty memory cache) makes it the newest. */
  char path[400], stale[400];
  for (int k = 0; k < 4; k++) {
    struct timespec t[2] = {{.tv_sec = 1000000 + k}, {.tv_sec = 1000000 + k}};
    object_path(dir, k, path, sizeof path);
    ck_assert_int_eq(utimensat(AT_FDCWD, path, t, 0), 0);
  }
  kiln__cc_cache_clear();
  uint8_t *got = NULL;
  size_t len = 0;
  ck_assert(kiln__cc_cache_get(dir, (uint8_t[KILN__SHA256_LEN]){0}, &got, &len));
  ck_assert_uint_eq(len, 1000);
  kiln_free(got);
  struct stat sb;
  object_path(dir, 0, path, sizeof path);
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_gt(sb.st_mtime, 1000000 + 3);
  /* A temporary file a killed process left an hour ago. */
  snprintf(stale, sizeof stale, "%s/.tmp-1-1", dir);
  FILE *f = fopen(stale, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  struct timespec old[2] = {{.tv_sec = 1000000}, {.tv_sec = 1000000}};
  ck_assert_int_eq(utimensat(AT_FDCWD, stale, old, 0), 0);
  /* Bound: four objects. The fifth put trims to 7/8 of it (three fit):
   * objects 1 and 2, the least recently used, go. */
  kiln__cc_cache_set_dir_limit(4 * one);
  kiln__cc_cache_put(dir, (uint8_t[KILN__SHA256_LEN]){4}, obj, 1000);
  ck_assert_uint_le(object_bytes(dir), 4 * one / 8 * 7);
  int left[5] = {1, 0, 0, 1, 1};
  for (int k = 0; k < 5; k++) {
    object_path(dir, k, path, sizeof path);
    ck_assert_msg((stat(path, &sb) == 0) == left[k], "object %d", k);
  }
  ck_assert_int_ne(stat(stale, &sb), 0);
  kiln__cc_cache_stats cs;
  kiln__cc_cache_stats_get(&cs);
  ck_assert_uint_eq(cs.disk_evictions, 2);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
  kiln__cc_cache_set_dir_limit(UINT64_C(1) << 30);
  kiln__cc_cache_clear();
}
END_TEST

static void write_script(const char *path, const char *body) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(body, f);
  fclose(f);
  chmod(path, 0755);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

START_TEST(units_run_concurrently_and_time_limit) {
  setenv("KILN_CC_UNIT_BYTES", "512", 1);
  char dir[] = "/tmp/kiln-ccpar-XXXXXX", script[300], slow[300], marks[300];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(script, sizeof script, "%s/parcc", dir);
  snprintf(slow, sizeof slow, "%s/slowcc", dir);
  snprintf(marks, sizeof marks, "%s/marks", dir);
  mkdir(marks, 0700);
  /* A compile of a unit (-c) waits until two are running at once. */
  char body[1200];
  snprintf(body, sizeof body,
           "#!/bin/sh\ncase \" $* \" in *\" -c \"*)\n  touch %s/$$\n  i=0\n"
           "  while [ $(ls %s | wc -l) -lt 2 ]; do\n    i=$((i+1)); [ $i -gt 200 ] && "
           "{ echo 'ran alone' >&2; exit 9; }\n    sleep 0.05\n  done;;\nesac\nexec cc \"$@\"\n",
           marks, marks);
  write_script(script, body);
  write_script(slow, "#!/bin/sh\ncase \" $* \" in *\" -c \"*) sleep 30;; esac\nexec cc \"$@\"\n");
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.cc = script;
  o.cc_jobs = 2;
  o.no_kernel_cache = true;
  kiln_compile_report r;
  kiln_status st;
  ck_assert_msg(compile(multi_hlo, &o, &r, NULL, &st) == 0, "%s", st.msg);
  ck_assert_uint_ge(r.cc_units, 2);
  ck_assert_uint_eq(r.cc_jobs, 2);
  ck_assert_uint_gt(r.cc_cpu_ms, 0);
  /* One at a time, the first would wait alone: the failure names its unit. */
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -f %s/*", marks);
  ck_assert_int_eq(system(cmd), 0);
  o.cc_jobs = 1;
  ck_assert_int_eq(compile(multi_hlo, &o, &r, NULL, &st), KILN_EINTERNAL);
  ck_assert_ptr_nonnull(strstr(st.msg, "the C compiler failed (status 9): ran alone"));
  ck_assert_ptr_nonnull(strstr(st.msg, "translation unit"));
  /* The limit covers the whole parallel build. */
  o.cc = slow;
  o.cc_jobs = 4;
  o.cc_timeout_s = 1;
  double t0 = now_s();
  ck_assert_int_eq(compile(multi_hlo, &o, &r, NULL, &st), KILN_ELIMIT);
  ck_assert_double_lt(now_s() - t0, 10);
  ck_assert_str_eq(st.msg, "the C compiler took longer than 1 s");
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* The flags of every unit compile_flags' compiler was asked to compile,
 * in order, one per line ("-O1\n-O3\n"). */
static void compile_flags_as(const char *hlo, const char *version, char *out, size_t size) {
  char dir[] = "/tmp/kiln-ccflags-XXXXXX", script[300], log[300], body[900];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(script, sizeof script, "%s/cc", dir);
  snprintf(log, sizeof log, "%s/log", dir);
  char fake[300] = "";
  if (version)
    snprintf(fake, sizeof fake, "[ \"$1\" = --version ] && { echo '%s'; exit 0; }\n", version);
  snprintf(body, sizeof body,
           "#!/bin/sh\n%scase \" $* \" in *\" -c \"*) echo \"$1\" >> %s;; esac\nexec cc \"$@\"\n",
           fake, log);
  write_script(script, body);
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.cc = script;
  o.no_kernel_cache = true;
  kiln_compile_report r;
  kiln_status st;
  ck_assert_msg(compile(hlo, &o, &r, NULL, &st) == 0, "%s", st.msg);
  FILE *f = fopen(log, "r");
  size_t n = f ? fread(out, 1, size - 1, f) : 0;
  if (f) fclose(f);
  out[n] = 0;
  unlink(log);
  unlink(script);
  rmdir(dir);
}

static void compile_flags(const char *hlo, char *out, size_t size) {
  compile_flags_as(hlo, NULL, out, size);
}

/* A small module with a tiny kernel (16 elements) and a light one (256 x
 * 256, once per run). */
static const char tiny_and_light_hlo[] =
    "HloModule tl\nENTRY main {\n  p = f32[16] parameter(0)\n  q = f32[256,256] parameter(1)\n"
    "  e = f32[16] exponential(p)\n  t = f32[256,256] tanh(q)\n"
    "  ROOT o = (f32[16], f32[256,256]) tuple(e, t)\n}\n";

/* GCC compiles the two in one unit at the light flags (the tiny kernel
 * carries -O1 as an optimize attribute); a compiler that is not GCC by its
 * --version gets a unit per class, as clang ignores the attribute. */
START_TEST(small_module_one_unit_under_gcc) {
  char flags[256];
  compile_flags(tiny_and_light_hlo, flags, sizeof flags);
  ck_assert_str_eq(flags, "-O2\n");
  compile_flags_as(tiny_and_light_hlo, "clang version 99.0.0", flags, sizeof flags);
  ck_assert(strcmp(flags, "-O1\n-O2\n") == 0 || strcmp(flags, "-O2\n-O1\n") == 0);
}
END_TEST

/* A kernel's flags follow what its run costs (compile.c): a few KiB once
 * per run -O1, up to 4 MiB per argument once per run -O2, more -O3, and
 * whatever runs in a loop body -O3; a call runs as often as its caller. */
START_TEST(kernel_classes_choose_flags) {
  char flags[256];
  compile_flags("HloModule t\nENTRY main {\n  p = f32[16] parameter(0)\n"
                "  ROOT e = f32[16] exponential(p)\n}\n",
                flags, sizeof flags);
  ck_assert_str_eq(flags, "-O1\n");
  compile_flags("HloModule l\nENTRY main {\n  p = f32[256,256] parameter(0)\n"
                "  ROOT e = f32[256,256] exponential(p)\n}\n",
                flags, sizeof flags);
  ck_assert_str_eq(flags, "-O2\n");
  compile_flags("HloModule h\nENTRY main {\n  p = f32[2048,1024] parameter(0)\n"
                "  ROOT e = f32[2048,1024] exponential(p)\n}\n",
                flags, sizeof flags);
  ck_assert_str_eq(flags, "-O3\n");
  compile_flags("HloModule c\nf {\n  a = f32[16] parameter(0)\n"
                "  ROOT e = f32[16] exponential(a)\n}\n"
                "ENTRY main {\n  p = f32[16] parameter(0)\n"
                "  ROOT c = f32[16] call(p), to_apply=f\n}\n",
                flags, sizeof flags);
  ck_assert_str_eq(flags, "-O1\n");
  compile_flags("HloModule w\n"
                "cond {\n  p = (s32[], f32[16]) parameter(0)\n"
                "  i = s32[] get-tuple-element(p), index=0\n  n = s32[] constant(50)\n"
                "  ROOT l = pred[] compare(i, n), direction=LT\n}\n"
                "body {\n  p = (s32[], f32[16]) parameter(0)\n"
                "  i = s32[] get-tuple-element(p), index=0\n"
                "  x = f32[16] get-tuple-element(p), index=1\n  one = s32[] constant(1)\n"
                "  j = s32[] add(i, one)\n  y = f32[16] exponential(x)\n"
                "  ROOT t = (s32[], f32[16]) tuple(j, y)\n}\n"
                "ENTRY main {\n  x = f32[16] parameter(0)\n  z = s32[] constant(0)\n"
                "  t = (s32[], f32[16]) tuple(z, x)\n"
                "  w = (s32[], f32[16]) while(t), condition=cond, body=body\n"
                "  ROOT r = f32[16] get-tuple-element(w), index=1\n}\n",
                flags, sizeof flags);
  ck_assert_ptr_nonnull(strstr(flags, "-O3\n"));
}
END_TEST

/* A GEMM's epilogue kernel (bias, activation) is classed like a kernel
 * step over its arguments: in the entry over 64 KiB, -O2; in a loop body,
 * -O3 (it ran at -O1, scalar, wherever it was). A compiler that is not GCC
 * gets one unit per class, so each class's flags show. */
START_TEST(gemm_epilogue_classed_as_its_runs) {
  char flags[256];
  compile_flags_as("HloModule g\nENTRY main {\n  a = f32[64,256] parameter(0)\n"
                   "  b = f32[256,256] parameter(1)\n  c = f32[64,256] parameter(2)\n"
                   "  d = f32[64,256] dot(a, b), lhs_contracting_dims={1}, "
                   "rhs_contracting_dims={0}\n"
                   "  s = f32[64,256] add(d, c)\n  ROOT t = f32[64,256] tanh(s)\n}\n",
                   "clang version 99.0.0", flags, sizeof flags);
  ck_assert_str_eq(flags, "-O2\n");
  compile_flags_as("HloModule w\n"
                   "cond {\n  p = (s32[], f32[16,16], f32[16,16]) parameter(0)\n"
                   "  i = s32[] get-tuple-element(p), index=0\n  n = s32[] constant(50)\n"
                   "  ROOT l = pred[] compare(i, n), direction=LT\n}\n"
                   "body {\n  p = (s32[], f32[16,16], f32[16,16]) parameter(0)\n"
                   "  i = s32[] get-tuple-element(p), index=0\n"
                   "  x = f32[16,16] get-tuple-element(p), index=1\n"
                   "  w = f32[16,16] get-tuple-element(p), index=2\n  one = s32[] constant(1)\n"
                   "  j = s32[] add(i, one)\n"
                   "  d = f32[16,16] dot(x, w), lhs_contracting_dims={1}, "
                   "rhs_contracting_dims={0}\n"
                   "  y = f32[16,16] tanh(d)\n"
                   "  ROOT t = (s32[], f32[16,16], f32[16,16]) tuple(j, y, w)\n}\n"
                   "ENTRY main {\n  x = f32[16,16] parameter(0)\n  w = f32[16,16] parameter(1)\n"
                   "  z = s32[] constant(0)\n"
                   "  t = (s32[], f32[16,16], f32[16,16]) tuple(z, x, w)\n"
                   "  l = (s32[], f32[16,16], f32[16,16]) while(t), condition=cond, body=body\n"
                   "  ROOT r = f32[16,16] get-tuple-element(l), index=1\n}\n",
                   "clang version 99.0.0", flags, sizeof flags);
  ck_assert_str_eq(flags, "-O3\n");
}
END_TEST

/* The fast link (no start files, no libc) falls back to the driver's own
 * when the compiler refuses it; either way the kernels load and run. */
START_TEST(link_falls_back_to_the_drivers_own) {
  char dir[] = "/tmp/kiln-cclink-XXXXXX", script[300], log[300], body[900];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(script, sizeof script, "%s/cc", dir);
  snprintf(log, sizeof log, "%s/log", dir);
  snprintf(body, sizeof body,
           "#!/bin/sh\ncase \" $* \" in *\" -nostdlib \"*) echo lean >> %s; exit 3;; "
           "*\" -shared \"*) echo full >> %s;; esac\nexec cc \"$@\"\n",
           log, log);
  write_script(script, body);
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.cc = script;
  o.no_kernel_cache = true;
  kiln_compile_report r;
  kiln_status st;
  kiln_executable *e = NULL;
  ck_assert_msg(compile(multi_hlo, &o, &r, &e, &st) == 0, "%s", st.msg);
  ck_assert_uint_gt(e->ncode, 0);
  kiln_executable_destroy(e);
  char got[64] = {0};
  FILE *f = fopen(log, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(got, 1, sizeof got - 1, f);
  fclose(f);
  got[n] = 0;
  ck_assert_str_eq(got, "lean\nfull\n");
  /* The fast link itself, by the real compiler. */
  o.cc = NULL;
  ck_assert_msg(compile(multi_hlo, &o, &r, &e, &st) == 0, "%s", st.msg);
  ck_assert_uint_gt(e->ncode, 0);
  kiln_executable_destroy(e);
  unlink(log);
  unlink(script);
  rmdir(dir);
}
END_TEST

/* The link names libm, libmvec and libgcc only when an object leaves a
 * symbol undefined that they define: f32 exp is the prelude's own, f32
 * sine libmvec's. Either way the kernels load and compute f(x). */
static void link_and_run(const char *op, double (*f)(double), bool want_libs) {
  char dir[] = "/tmp/kiln-cclibs-XXXXXX", script[300], log[300], body[1400], hlo[300];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(script, sizeof script, "%s/cc", dir);
  snprintf(log, sizeof log, "%s/log", dir);
  snprintf(body, sizeof body,
           "#!/bin/sh\ncase \" $* \" in *\" -shared \"*) case \" $* \" in *\" -lm \"*) echo libs "
           ">> %s;; *) echo none >> %s;; esac;; esac\nexec cc \"$@\"\n",
           log, log);
  write_script(script, body);
  snprintf(hlo, sizeof hlo,
           "HloModule l\nENTRY main {\n  p = f32[4096] parameter(0)\n"
           "  ROOT e = f32[4096] %s(p)\n}\n",
           op);
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.cc = script;
  o.no_kernel_cache = true;
  kiln_compile_report r;
  kiln_status st;
  kiln_executable *e = NULL;
  ck_assert_msg(compile(hlo, &o, &r, &e, &st) == 0, "%s", st.msg);
  char got[64] = {0};
  FILE *lf = fopen(log, "r");
  ck_assert_ptr_nonnull(lf);
  size_t n = fread(got, 1, sizeof got - 1, lf);
  fclose(lf);
  got[n] = 0;
  ck_assert_str_eq(got, want_libs ? "libs\n" : "none\n");
  kiln_module *m = parse(hlo);
  const kiln_instr *pi = kiln_computation_param(m, kiln_module_entry(m), 0);
  kiln_literal *arg = NULL, *out = NULL;
  ck_assert_int_eq(kiln_literal_create(NULL, &pi->shape, 0, &arg, &st), 0);
  for (int64_t i = 0; i < 4096; i++) kiln_literal_set_f64(arg, i, (double)(i - 2048) / 512);
  ck_assert_msg(
      kiln_run_executable(e, NULL, NULL, (const kiln_literal *const *)&arg, 1, &out, &st) == 0,
      "%s", st.msg);
  for (int64_t i = 0; i < 4096; i++) {
    double x = kiln_literal_get_f64(arg, i), y = kiln_literal_get_f64(out, i);
    ck_assert_msg(fabs(y - f(x)) <= 1e-6 * (1 + fabs(f(x))), "%s(%g): %g", op, x, y);
  }
  kiln_literal_destroy(arg);
  kiln_literal_destroy(out);
  kiln_module_destroy(m);
  kiln_executable_destroy(e);
  unlink(log);
  unlink(script);
  rmdir(dir);
}

START_TEST(link_names_libraries_only_when_needed) {
  link_and_run("exponential", exp, false);
  link_and_run("sine", sin, true);
}
END_TEST

/* ---- the C prelude's own declarations ------------------------------------ */

/* Writes the C target's prelude, then tail, to a new file; path: its name. */
static void write_prelude_file(char *path, const char *tail) {
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  FILE *f = fdopen(fd, "w");
  ck_assert_ptr_nonnull(f);
  fputs(kiln__c_target.prelude, f);
  fputs(tail, f);
  ck_assert_int_eq(fclose(f), 0);
}

/* The assembly of file (its .file and .ident lines dropped), compiled with
 * flags; kiln_malloc'd. */
static char *assembly(const char *file, const char *flags) {
  char out[] = "/tmp/kiln-prelude-s-XXXXXX", cmd[600];
  int fd = mkstemp(out);
  ck_assert_int_ge(fd, 0);
  close(fd);
  snprintf(cmd, sizeof cmd, "cc -O2 -fno-math-errno -ffp-contract=off %s -S -o %s -x c %s", flags,
           out, file);
  ck_assert_msg(system(cmd) == 0, "%s", cmd);
  FILE *f = fopen(out, "r");
  ck_assert_ptr_nonnull(f);
  kiln_sbuf b = KILN_SBUF_INIT;
  char line[1024];
  while (fgets(line, sizeof line, f))
    if (!strstr(line, "\t.file\t") && !strstr(line, "\t.ident\t")) kiln_sbuf_puts(&b, line);
  fclose(f);
  unlink(out);
  size_t n;
  char *s = kiln_sbuf_detach(&b, &n);
  ck_assert_ptr_nonnull(s);
  return s;
}

/* With GCC and clang the prelude declares the vocabulary itself instead
 * of including the system headers (a third of a small unit's compile). Its
 * declarations must agree with the headers' (the headers included after
 * them: a conflicting type is an error), and code using the vocabulary
 * must compile to the same instructions either way. */
START_TEST(prelude_declares_as_the_headers_do) {
  static const char *const macros[] = {
      "INT8_MIN",  "INT8_MAX",  "INT16_MIN", "INT16_MAX",  "INT32_MIN",  "INT32_MAX",
      "INT64_MIN", "INT64_MAX", "UINT8_MAX", "UINT16_MAX", "UINT32_MAX", "UINT64_MAX",
      "INT64_C",   "UINT64_C",  "NAN",       "INFINITY",   "HUGE_VAL",   "isnan",
      "isinf",     "isfinite",  "signbit",   "complex",    "CMPLX",      "CMPLXF"};
  kiln_sbuf tail = KILN_SBUF_INIT;
  for (size_t i = 0; i < sizeof macros / sizeof *macros; i++)
    kiln_sbuf_printf(&tail, "#undef %s\n", macros[i]);
  kiln_sbuf_puts(&tail, "#include <complex.h>\n#include <math.h>\n#include <stdint.h>\n"
                        "#include <string.h>\n");
  char both[] = "/tmp/kiln-prelude-XXXXXX", cmd[300];
  write_prelude_file(both, kiln_sbuf_str(&tail));
  kiln_sbuf_free(&tail);
  snprintf(cmd, sizeof cmd, "cc -std=c11 -fsyntax-only -Werror -x c %s", both);
  int rc = system(cmd);
  unlink(both);
  ck_assert_msg(rc == 0, "the prelude's declarations conflict with the headers' (%s)", cmd);

  static const char use[] =
      "double kt(double x, double y, float f, double _Complex z, void *d, const void *s) {\n"
      "  double r = fabs(x) + ceil(x) + floor(x) + round(x) + rint(x) + sqrt(x) + cbrt(x) +\n"
      "      cos(x) + sin(x) + tan(x) + tanh(x) + erf(x) + exp(x) + expm1(x) + log(x) +\n"
      "      log1p(x) + atan2(x, y) + fmod(x, y) + pow(x, y) + copysign(x, y) + cabs(z) +\n"
      "      creal(z) + cimag(z) + creal(cexp(z)) + nan(\"\") + frexp(x, (int *)d);\n"
      "  float g = fabsf(f) + ceilf(f) + floorf(f) + roundf(f) + rintf(f) + sqrtf(f) +\n"
      "      fmodf(f, f) + expf(f) + logf(f) + copysignf(f, f) + powf(f, f) + erff(f);\n"
      "  memcpy(d, s, 8);\n"
      "  memset(d, 1, 3);\n"
      "  int64_t i = INT64_MAX - (int64_t)x;\n"
      "  uint32_t u = UINT32_MAX ^ (uint32_t)f;\n"
      "  return r + g + (double)i + (double)u + isfinite(x) + isinf(x) + isinf(f) + isnan(y) +\n"
      "         signbit(x) + signbit(f) + INT32_MIN + (double)UINT64_MAX + (double)INT64_MIN +\n"
      "         NAN + INFINITY + creal(CMPLX(x, y)) + INT8_MIN + UINT16_MAX + INT64_C(3);\n"
      "}\n";
  char file[] = "/tmp/kiln-prelude-XXXXXX";
  write_prelude_file(file, use);
  char *lean = assembly(file, "");
  char *headers = assembly(file, "-DKILN_SYSTEM_HEADERS");
  unlink(file);
  ck_assert_msg(strstr(lean, "kt") != NULL, "no code for kt");
  ck_assert_str_eq(lean, headers);
  kiln_free(lean);
  kiln_free(headers);
}
END_TEST

Suite *cc_suite(void) {
  Suite *s = suite_create("cc");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, sha256_vectors);
  tcase_add_test(tc, split_names_by_content);
  tcase_add_test(tc, split_mixes_classes_with_attrs);
  tcase_add_test(tc, unit_prelude_holds_what_it_calls);
  tcase_add_test(tc, c_prelude_trimmed_for_each_helper_compiles);
  tcase_add_test(tc, split_large_program_content_defined);
  tcase_add_test(tc, cache_hit_same_code);
  tcase_add_test(tc, disk_cache_and_corrupt_file);
  tcase_add_test(tc, disk_cache_bounded_lru);
  tcase_add_test(tc, units_run_concurrently_and_time_limit);
  tcase_add_test(tc, prelude_declares_as_the_headers_do);
  tcase_add_test(tc, kernel_classes_choose_flags);
  tcase_add_test(tc, gemm_epilogue_classed_as_its_runs);
  tcase_add_test(tc, small_module_one_unit_under_gcc);
  tcase_add_test(tc, link_falls_back_to_the_drivers_own);
  tcase_add_test(tc, link_names_libraries_only_when_needed);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(cc_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
