/* Helpers shared by the fusion/layout/schedule suites: parse and verify
 * modules, run one pass with a context, make deterministic random
 * arguments, and compare the interpreter's results before and after. */
#ifndef KILN_TESTS_UNIT_TEST_FUSION_HARNESS_H
#define KILN_TESTS_UNIT_TEST_FUSION_HARNESS_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/pass.h"
#include "compiler/passes/passes.h"

static inline kiln_module *fh_parse(const char *text, size_t len, const char *file) {
  kiln_module *m = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_module_parse_text(text, len, file, NULL, &m, &st);
  ck_assert_msg(rc == 0, "%s: parse failed: %s: %s", file, st.where, st.msg);
  return m;
}

static inline void fh_verify(const kiln_module *m, const char *what) {
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_module_verify(m, NULL, &st);
  if (rc != 0) {
    char *t = kiln_module_print(m, NULL);
    ck_abort_msg("%s: verify failed: %s: %s\n%s", what, st.where, st.msg, t ? t : "");
  }
}

static inline char *fh_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  ck_assert(buf != NULL);
  ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  *len = (size_t)n;
  return buf;
}

/* Runs one pass; fails the test with the pass's message on error. */
static inline void fh_run_pass(kiln_module *m, kiln_pass_fn fn, const char *name,
                               const kiln_target *t, int opt_level) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_arena *a = kiln_arena_create();
  ck_assert(a != NULL);
  kiln_pass_ctx ctx = {t ? t : kiln_target_default(), a, &st, opt_level, 0, NULL};
  int rc = fn(m, &ctx);
  kiln_arena_destroy(a);
  ck_assert_msg(rc == 0, "pass %s failed: %s: %s", name, st.where, st.msg);
}

/* xorshift64*: deterministic across platforms. */
static inline uint64_t fh_rand(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

static inline void fh_fill(kiln_literal *lit, uint64_t *seed) {
  if (kiln_shape_is_tuple(&lit->shape)) {
    for (uint32_t i = 0; i < lit->shape.rank; i++) fh_fill(lit->elems[i], seed);
    return;
  }
  if (!kiln_shape_is_array(&lit->shape)) return;
  int64_t n = kiln_literal_elements(lit);
  kiln_dtype t = lit->shape.dtype;
  for (int64_t i = 0; i < n; i++) {
    uint64_t r = fh_rand(seed);
    if (t == KILN_PRED) {
      kiln_literal_set_u64(lit, i, r & 1);
    } else if (kiln_dtype_is_float(t) || kiln_dtype_is_complex(t)) {
      /* Multiples of 1/64 in [-2, 2): exact in every float type. */
      kiln_literal_set_f64(lit, i, ((double)(int64_t)(r % 257) - 128.0) / 64.0);
    } else if (kiln_dtype_is_unsigned_int(t)) {
      kiln_literal_set_u64(lit, i, r % 7);
    } else {
      kiln_literal_set_s64(lit, i, (int64_t)(r % 11) - 5);
    }
  }
}

/* Random arguments for the entry's parameters; *n receives the count.
 * NULL when a parameter's shape cannot be made (tokens are made empty). */
static inline kiln_literal **fh_args(const kiln_module *m, uint64_t seed, uint32_t *n) {
  const kiln_computation *e = kiln_module_entry(m);
  uint32_t np = kiln_computation_nparams(m, e);
  kiln_literal **args = calloc(np ? np : 1, sizeof *args);
  ck_assert(args != NULL);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (uint32_t i = 0; i < np; i++) {
    const kiln_instr *p = kiln_computation_param(m, e, i);
    kiln_status st;
    kiln_status_clear(&st);
    if (p == NULL || kiln_literal_create(NULL, &p->shape, (size_t)1 << 28, &args[i], &st) != 0) {
      for (uint32_t j = 0; j < i; j++) kiln_literal_destroy(args[j]);
      free(args);
      return NULL;
    }
    fh_fill(args[i], &s);
  }
  *n = np;
  return args;
}

static inline void fh_free_args(kiln_literal **args, uint32_t n) {
  if (args == NULL) return;
  for (uint32_t i = 0; i < n; i++) kiln_literal_destroy(args[i]);
  free(args);
}

/* Runs the entry on args; NULL when the interpreter refuses (rc in *rc). */
static inline kiln_literal *fh_interp(const kiln_module *m, kiln_literal **args, uint32_t n,
                                      int *rc, kiln_status *st) {
  kiln_interp_options o = {0};
  o.max_while_iterations = 100000;
  o.timeout_seconds = 20;
  kiln_literal *out = NULL;
  kiln_status_clear(st);
  *rc = kiln_interp_run(m, (const kiln_literal *const *)args, n, &o, &out, st);
  return *rc ? NULL : out;
}

static inline char *fh_lit_text(const kiln_literal *l) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_literal_print(&b, l, true);
  char *s = kiln_sbuf_detach(&b, NULL);
  return s ? s : kiln_strdup("(out of memory)");
}

#endif /* KILN_TESTS_UNIT_TEST_FUSION_HARNESS_H */
