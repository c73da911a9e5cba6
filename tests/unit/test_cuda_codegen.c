/* The CUDA target without a GPU: the shared emitter's kernels as CUDA C,
 * compiled by NVRTC (compiler/codegen/nvrtc.c) into cubins, and the
 * executables that carry them.
 *
 * Every kernel of a differential corpus (random programs of
 * tests/support/progen.c; KILN_CUDA_SEEDS=N for more), of programs exported
 * from JAX (tests/data/jax) and of the XLA corpus (KILN_CORPUS_DIR: refused
 * programs allowed, NVRTC failures not) is compiled for sm_90, or for the
 * cuda target named by env KILN_CUDA_TARGET (scripts/gpu-check.sh sets it
 * to the detected GPU's row, e.g. cuda-sm_90); each cubin must be an ELF
 * file of machine EM_CUDA (190) whose e_flags name that sm (sm_80 for
 * that row). NVRTC's arguments are checked: a virtual
 * architecture is refused, a compile error is located at its line and
 * kernel, a deadline is kept. Cases that need libnvrtc skip, saying so,
 * where it is not installed. Running the kernels needs a GPU: that is
 * scripts/gpu-check.sh, not this suite.
 */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/codegen/cuda_target.h"
#include "compiler/codegen/emit.h"
#include "compiler/codegen/executable.h"
#include "compiler/codegen/nvrtc.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "compiler/target.h"
#include "tests/support/progen.h"

#define EM_CUDA 190

/* The corpus target: env KILN_CUDA_TARGET (any spelling of a cuda row)
 * or cuda-sm_90; *sm receives its number (90). */
static const char *corpus_target(int *sm) {
  const char *env = getenv("KILN_CUDA_TARGET");
  const kiln_target *t = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_target_resolve("cuda", env && env[0] ? env : "cuda-sm_90", &t, &st) == 0,
                "KILN_CUDA_TARGET: %s", st.msg);
  ck_assert_msg(t->isa && strncmp(t->isa, "sm_", 3) == 0, "%s", t->name);
  *sm = atoi(t->isa + 3);
  return t->name;
}

static bool have_nvrtc(void) {
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln__nvrtc_version(NULL, NULL, &st) == 0) return true;
  fprintf(stderr, "skipped: %s\n", st.msg);
  return false;
}

/* The sm an ELF cubin is for, from e_flags (ABI 8 and later keep it in
 * bits 8..15, older ones in bits 0..7); -1 when it is not a CUDA ELF. */
static int cubin_sm(const uint8_t *b, size_t n) {
  if (n < 64 || memcmp(b, "\177ELF", 4) != 0 || b[4] != 2 /* ELFCLASS64 */) return -1;
  uint16_t machine = (uint16_t)(b[18] | b[19] << 8);
  if (machine != EM_CUDA) return -1;
  uint32_t flags =
      (uint32_t)b[48] | (uint32_t)b[49] << 8 | (uint32_t)b[50] << 16 | (uint32_t)b[51] << 24;
  return b[8] >= 8 ? (int)((flags >> 8) & 0xff) : (int)(flags & 0xff);
}

/* Compiles module text for target; 0, or the status code (EUNIMPL: a
 * refusal, whose message must say so). */
static int compile_text(const char *text, const char *name, const char *target, int want_sm,
                        kiln_status *st) {
  kiln_module *m = NULL;
  kiln_status_clear(st);
  ck_assert_msg(kiln_module_parse_text(text, strlen(text), name, NULL, &m, st) == 0, "%s: %s", name,
                st->msg);
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.target = target;
  kiln_executable *e = NULL;
  int rc = kiln_compile(m, &o, &e, NULL, st);
  kiln_module_destroy(m);
  if (rc) return rc;
  ck_assert_int_eq(e->code_kind, KILN_CODE_CUBIN);
  const kiln_target *want = NULL;
  ck_assert_int_eq(kiln_target_resolve("cuda", target, &want, NULL), 0);
  ck_assert_str_eq(e->target, want->name);
  ck_assert_msg(cubin_sm(e->code, e->ncode) == want_sm, "%s: a cubin for sm %d, not %d", name,
                cubin_sm(e->code, e->ncode), want_sm);
  /* the executable carries its cubin through serialization */
  uint8_t *blob = NULL;
  size_t nblob = 0;
  ck_assert_int_eq(kiln_executable_serialize(e, &blob, &nblob, st), 0);
  kiln_executable *back = NULL;
  ck_assert_int_eq(kiln_executable_deserialize(blob, nblob, &back, st), 0);
  ck_assert_int_eq(back->code_kind, KILN_CODE_CUBIN);
  ck_assert_uint_eq(back->ncode, e->ncode);
  ck_assert(memcmp(back->code, e->code, e->ncode) == 0);
  kiln_executable_destroy(back);
  kiln_free(blob);
  kiln_executable_destroy(e);
  return 0;
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = kiln_malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    kiln_free(b);
    b = NULL;
  }
  if (b) b[n] = '\0';
  fclose(f);
  return b;
}

START_TEST(progen_corpus_compiles_for_sm_90) {
  if (!have_nvrtc()) return;
  int seeds = getenv("KILN_CUDA_SEEDS") ? atoi(getenv("KILN_CUDA_SEEDS")) : 24;
  int ok = 0, refused = 0, sm;
  const char *target = corpus_target(&sm);
  for (int s = 1; s <= seeds; s++) {
    kiln_progen_options o = {0};
    o.seed = (uint64_t)s;
    o.ninstrs = 8 + s % 17;
    o.nparams = 1 + s % 3;
    o.dtype = s % 4 == 3 ? KILN_F64 : KILN_F32;
    char *text = kiln_progen_text(&o);
    ck_assert_ptr_nonnull(text);
    char name[32];
    snprintf(name, sizeof name, "progen-%d.hlo", s);
    kiln_status st;
    int rc = compile_text(text, name, target, sm, &st);
    if (rc == KILN_EUNIMPL) {
      ck_assert_msg(strstr(st.msg, "the cuda backend cannot compile") != NULL ||
                        strstr(st.msg, "cuda") != NULL,
                    "seed %d: a refusal that does not name the target: %s", s, st.msg);
      refused++;
    } else {
      ck_assert_msg(rc == 0, "seed %d: %s: %s\n%s", s, st.where, st.msg, text);
      ok++;
    }
    kiln_free(text);
  }
  fprintf(stderr, "progen: %d compiled for %s, %d refused\n", ok, target, refused);
  ck_assert_int_gt(ok, seeds / 2);
}
END_TEST

START_TEST(jax_programs_compile_for_sm_90) {
  if (!have_nvrtc()) return;
  static const char *const files[] = {"layernorm_softmax", "mlp_grad", "transformer", "embedding",
                                      "gru_scan"};
  int sm;
  const char *target = corpus_target(&sm);
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/jax/%s.hlo", KILN_SOURCE_DIR, files[i]);
    char *text = read_file(path);
    ck_assert_msg(text != NULL, "cannot read %s", path);
    kiln_status st;
    int rc = compile_text(text, path, target, sm, &st);
    ck_assert_msg(rc == 0, "%s: %s: %s", path, st.where, st.msg);
    kiln_free(text);
  }
}
END_TEST

/* The XLA corpus (env KILN_CORPUS_DIR): whatever the CUDA target emits,
 * NVRTC compiles; a program may be refused (an op the target has not,
 * a mesh it needs), never fail in NVRTC (KILN_EINTERNAL). */
START_TEST(xla_corpus_never_fails_in_nvrtc) {
  if (!have_nvrtc()) return;
  const char *dir = getenv("KILN_CORPUS_DIR");
  DIR *d = dir ? opendir(dir) : NULL;
  if (d == NULL) {
    fprintf(stderr, "skipped: KILN_CORPUS_DIR is not set or not a folder\n");
    return;
  }
  int ok = 0, refused = 0, sm;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    size_t n = strlen(de->d_name);
    if (n < 5 || strcmp(de->d_name + n - 4, ".hlo") != 0) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    char *text = read_file(path);
    if (text == NULL) continue;
    kiln_module *m = NULL;
    kiln_status st;
    kiln_status_clear(&st);
    if (kiln_module_parse_text(text, strlen(text), path, NULL, &m, &st) == 0) {
      kiln_compile_options o;
      kiln_compile_options_init(&o);
      o.target = corpus_target(&sm);
      kiln_executable *e = NULL;
      int rc = kiln_compile(m, &o, &e, NULL, &st);
      ck_assert_msg(rc != KILN_EINTERNAL, "%s: %s: %s", path, st.where, st.msg);
      if (rc == 0) {
        ck_assert_int_eq(cubin_sm(e->code, e->ncode), 90);
        ok++;
      } else {
        refused++;
      }
      kiln_executable_destroy(e);
      kiln_module_destroy(m);
    }
    kiln_free(text);
  }
  closedir(d);
  fprintf(stderr, "corpus: %d compiled for sm_%d, %d refused\n", ok, sm, refused);
  ck_assert_int_gt(ok, 0);
}
END_TEST

static const char small[] = "HloModule m\n"
                            "ENTRY e {\n"
                            "  a = f32[64] parameter(0)\n"
                            "  b = f16[64] convert(a)\n"
                            "  c = f16[64] multiply(b, b)\n"
                            "  d = bf16[64] convert(c)\n"
                            "  ROOT r = f32[64] convert(d)\n"
                            "}\n";

START_TEST(sm_80_row_gives_an_sm_80_cubin) {
  if (!have_nvrtc()) return;
  kiln_status st;
  ck_assert_int_eq(compile_text(small, "small.hlo", "sm_80", 80, &st), 0);
}
END_TEST

START_TEST(virtual_architecture_is_refused) {
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__nvrtc_check_arch("compute_90", &st), KILN_EINVAL);
  ck_assert(strstr(st.msg, "virtual") != NULL);
  ck_assert_int_eq(kiln__nvrtc_check_arch("sm_9x", &st), KILN_EINVAL);
  ck_assert_int_eq(kiln__nvrtc_check_arch(NULL, &st), KILN_EINVAL);
  ck_assert_int_eq(kiln__nvrtc_check_arch("sm_90", &st), 0);
  ck_assert_int_eq(kiln__nvrtc_check_arch("sm_100", &st), 0);
  uint8_t *cubin = NULL;
  size_t n = 0;
  kiln__nvrtc_options o = {.arch = "compute_90"};
  ck_assert_int_eq(kiln__nvrtc_compile(&o, "x", 1, &cubin, &n, &st), KILN_EINVAL);
  ck_assert_ptr_null(cubin);
}
END_TEST

START_TEST(compile_error_is_located) {
  if (!have_nvrtc()) return;
  static const char src[] = "typedef long long int64_t;\n"
                            "extern \"C\" __global__ void kiln_kernel_0(void *const *bufs, "
                            "int64_t begin, int64_t end) {\n"
                            "}\n"
                            "\n"
                            "extern \"C\" __global__ void kiln_kernel_1(void *const *bufs, "
                            "int64_t begin, int64_t end) {\n"
                            "  undefined_thing = 1;\n"
                            "}\n";
  kiln__nvrtc_options o = {.arch = "sm_90"};
  uint8_t *cubin = NULL;
  size_t n = 0;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__nvrtc_compile(&o, src, strlen(src), &cubin, &n, &st), KILN_EINTERNAL);
  ck_assert_str_eq(st.where, "kiln_kernels.cu:6");
  ck_assert_msg(strstr(st.msg, "kiln_kernel_1") && strstr(st.msg, "undefined_thing"), "%s", st.msg);
  ck_assert_ptr_null(cubin);
}
END_TEST

START_TEST(deadline_is_kept) {
  if (!have_nvrtc()) return;
  static const char src[] = "extern \"C\" __global__ void kiln_kernel_0() {}\n";
  kiln__nvrtc_options o = {.arch = "sm_90", .timeout_s = 1e-4};
  uint8_t *cubin = NULL;
  size_t n = 0;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__nvrtc_compile(&o, src, strlen(src), &cubin, &n, &st), KILN_ELIMIT);
  ck_assert(strstr(st.msg, "limit") != NULL);
  o.timeout_s = 60;
  ck_assert_int_eq(kiln__nvrtc_compile(&o, src, strlen(src), &cubin, &n, &st), 0);
  ck_assert_int_eq(cubin_sm(cubin, n), 90);
  kiln_free(cubin);
}
END_TEST

/* emit.h's prelude contract on the CUDA target: its prelude, then every
 * listed signature declared again (a conflicting one does not compile) and
 * called from a kernel, so that NVRTC type-checks each helper's use. */
START_TEST(cuda_prelude_defines_every_helper) {
  if (!have_nvrtc()) return;
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, kiln__cuda_target.prelude);
  uint32_t n = 0;
  /* The complex helpers are owed only by targets with complex element
   * types (emit.h); the CUDA target refuses c64/c128. */
  for (const kiln__prelude_helper *h = kiln__prelude_helpers; h->name; h++)
    if (!strstr(h->signature, "_Complex")) {
      kiln_sbuf_printf(&b, "%s %s;\n", kiln__cuda_target.helper_qual, h->signature);
      n++;
    }
  kiln_sbuf_puts(&b, "extern \"C\" __global__ void kiln_kernel_0(void *const *bufs, int64_t begin, "
                     "int64_t end) {\n  double *o = (double *)bufs[0];\n");
  kiln_sbuf_printf(&b,
                   "  o[0] = kh2d(0x3c00u) + kb2d(0x3f80u) + krh(1.0) + krb(1.0) + "
                   "(double)kd2h(1.0) + (double)kd2b(1.0) + (double)ktot(-0.0) + "
                   "(double)%s(7ull) + (double)kclz(1, 32) + kexpf(1.0f) + kerff(0.5f);\n}\n",
                   kiln__cuda_target.popcount64);
  ck_assert(!kiln_sbuf_failed(&b));
  kiln__nvrtc_options o = {.arch = "sm_90"};
  uint8_t *cubin = NULL;
  size_t nc = 0;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln__nvrtc_compile(&o, b.data, b.len, &cubin, &nc, &st);
  ck_assert_msg(rc == 0, "the CUDA prelude breaks the contract (%u helpers): %s: %s", n, st.where,
                st.msg);
  ck_assert_int_eq(cubin_sm(cubin, nc), 90);
  kiln_free(cubin);
  kiln_sbuf_free(&b);
}
END_TEST

START_TEST(interp_target_has_no_code_generator) {
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_module_parse_text(small, strlen(small), "s.hlo", NULL, &m, &st), 0);
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.target = "compute_90";
  kiln_executable *e = NULL;
  ck_assert_int_ne(kiln_compile(m, &o, &e, NULL, &st), 0);
  ck_assert_ptr_null(e);
  kiln_module_destroy(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cuda_codegen");
  TCase *c = tcase_create("nvrtc");
  tcase_set_timeout(c, 300);
  tcase_add_test(c, progen_corpus_compiles_for_sm_90);
  tcase_add_test(c, jax_programs_compile_for_sm_90);
  tcase_add_test(c, xla_corpus_never_fails_in_nvrtc);
  tcase_add_test(c, sm_80_row_gives_an_sm_80_cubin);
  tcase_add_test(c, virtual_architecture_is_refused);
  tcase_add_test(c, compile_error_is_located);
  tcase_add_test(c, deadline_is_kept);
  tcase_add_test(c, interp_target_has_no_code_generator);
  tcase_add_test(c, cuda_prelude_defines_every_helper);
  suite_add_tcase(s, c);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
