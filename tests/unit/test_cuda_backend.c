/* The cuda backend's pieces that need no GPU (executor/cuda/cuda_alloc.c):
 * the caching allocator's size classes, reuse and byte budget over a fake
 * device (host memory, with a failure switch), the launch grid, the
 * CUresult -> status mapping and the architecture rule; and, through the
 * registry, that a machine without a driver has no "cuda" backend and
 * says why. Running on a GPU is test_cuda_diff.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "compiler/codegen/nvrtc.h"
#include "compiler/compile.h"
#include "compiler/ir/text.h"
#include "executor/backend.h"

#ifdef KILN_HAVE_CUDA
#include "executor/cuda/cuda.h"
#include "executor/cuda/cuda_alloc.h"

/* ---- a fake device for the allocator -------------------------------------- */

typedef struct fake_dev {
  int allocs, frees;
  uint64_t held;     /* bytes the fake has handed out */
  uint64_t capacity; /* raw allocations past it fail as out of memory */
} fake_dev;

/* Each fake block remembers its size in 16 bytes before the address. */
static int fake_alloc(void *ctx, uint64_t bytes, uint64_t *ptr, kiln_status *st) {
  fake_dev *f = ctx;
  if (f->held + bytes > f->capacity)
    return kiln_status_set(st, KILN_ELIMIT, "fake",
                           "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY");
  char *p = malloc(bytes + 16);
  ck_assert_ptr_nonnull(p);
  memcpy(p, &bytes, sizeof bytes);
  f->allocs++;
  f->held += bytes;
  *ptr = (uint64_t)(uintptr_t)(p + 16);
  return 0;
}

static void fake_free(void *ctx, uint64_t ptr) {
  fake_dev *f = ctx;
  char *p = (char *)(uintptr_t)ptr - 16;
  uint64_t bytes;
  memcpy(&bytes, p, sizeof bytes);
  f->frees++;
  f->held -= bytes;
  free(p);
}

START_TEST(size_classes) {
  uint64_t r;
  uint32_t list;
  ck_assert(kiln__cuda_size_class(0, &r, &list));
  ck_assert_uint_eq(r, 512);
  ck_assert_uint_eq(list, 0);
  ck_assert(kiln__cuda_size_class(512, &r, &list));
  ck_assert_uint_eq(r, 512);
  ck_assert(kiln__cuda_size_class(513, &r, &list));
  ck_assert_uint_eq(r, 1024);
  ck_assert_uint_eq(list, 1);
  ck_assert(kiln__cuda_size_class(UINT64_C(1) << 20, &r, &list));
  ck_assert_uint_eq(r, UINT64_C(1) << 20);
  ck_assert_uint_eq(list, KILN__CUDA_NSMALL - 1);
  ck_assert(kiln__cuda_size_class((UINT64_C(1) << 20) + 1, &r, &list));
  ck_assert_uint_eq(r, UINT64_C(2) << 20);
  ck_assert_uint_eq(list, KILN__CUDA_NSMALL);
  ck_assert(kiln__cuda_size_class((UINT64_C(5) << 20) + 7, &r, &list));
  ck_assert_uint_eq(r, UINT64_C(6) << 20);
  ck_assert(!kiln__cuda_size_class(UINT64_MAX, &r, &list));
  /* every class covers its request and is below twice it (small) */
  for (uint64_t b = 1; b < (UINT64_C(3) << 20); b = b * 3 + 1) {
    ck_assert(kiln__cuda_size_class(b, &r, &list));
    ck_assert_uint_ge(r, b);
    if (b > 512 && b <= (UINT64_C(1) << 20)) ck_assert_uint_lt(r, 2 * b);
  }
}
END_TEST

START_TEST(freed_blocks_are_reused_by_class) {
  fake_dev f = {.capacity = UINT64_C(1) << 30};
  kiln__cuda_allocator a;
  kiln__cuda_allocator_init(&a, UINT64_C(1) << 30, fake_alloc, fake_free, &f, "fake:0", "budget");
  kiln_status st;
  kiln_status_clear(&st);
  kiln__cuda_block *x, *y, *z;
  ck_assert_int_eq(kiln__cuda_allocator_get(&a, 1000, &x, &st), 0);
  ck_assert_uint_eq(x->bytes, 1024);
  ck_assert_uint_eq(x->asked, 1000);
  uint64_t px = x->ptr;
  kiln__cuda_allocator_put(&a, x);
  ck_assert_uint_eq(a.live, 0);
  ck_assert_uint_eq(a.cached, 1024);
  /* same class: the same block, no new raw allocation */
  ck_assert_int_eq(kiln__cuda_allocator_get(&a, 600, &y, &st), 0);
  ck_assert_uint_eq(y->ptr, px);
  ck_assert_int_eq(f.allocs, 1);
  /* another class: a new one */
  ck_assert_int_eq(kiln__cuda_allocator_get(&a, 3 << 20, &z, &st), 0);
  ck_assert_uint_eq(z->bytes, UINT64_C(4) << 20);
  ck_assert_int_eq(f.allocs, 2);
  ck_assert_uint_eq(a.live, 1024 + (UINT64_C(4) << 20));
  ck_assert_uint_eq(a.peak, a.live);
  kiln__cuda_allocator_put(&a, y);
  kiln__cuda_allocator_put(&a, z);
  /* a large block is reused only for its exact class */
  kiln__cuda_block *w;
  ck_assert_int_eq(kiln__cuda_allocator_get(&a, 5 << 20, &w, &st), 0);
  ck_assert_int_eq(f.allocs, 3);
  kiln__cuda_allocator_put(&a, w);
  kiln__cuda_allocator_fini(&a);
  ck_assert_int_eq(f.frees, 3);
  ck_assert_uint_eq(a.cached, 0);
}
END_TEST

START_TEST(budget_releases_the_cache_then_refuses) {
  fake_dev f = {.capacity = UINT64_C(1) << 30};
  kiln__cuda_allocator a;
  uint64_t budget = UINT64_C(8) << 20;
  kiln__cuda_allocator_init(&a, budget, fake_alloc, fake_free, &f, "fake:0",
                            "the test budget (KILN_CUDA_MEMORY_BYTES)");
  kiln_status st;
  kiln_status_clear(&st);
  kiln__cuda_block *x, *y, *z;
  ck_assert_int_eq(kiln__cuda_allocator_get(&a, 4 << 20, &x, &st), 0);
  kiln__cuda_allocator_put(&a, x); /* 4 MiB cached */
  ck_assert_int_eq(kiln__cuda_allocator_get(&a, 6 << 20, &y, &st), 0);
  /* 6 + 4 cached would pass 8: the cache went first */
  ck_assert_int_eq(f.frees, 1);
  ck_assert_uint_eq(a.cached, 0);
  ck_assert_uint_le(a.live + a.cached, budget);
  /* 6 live + 4 more cannot fit at all: RESOURCE_EXHAUSTED naming the budget */
  ck_assert_int_eq(kiln__cuda_allocator_get(&a, 3 << 20, &z, &st), KILN_ELIMIT);
  ck_assert_ptr_null(z);
  ck_assert_msg(strstr(st.msg, "KILN_CUDA_MEMORY_BYTES") != NULL, "%s", st.msg);
  ck_assert_msg(strstr(st.msg, "8388608") != NULL, "%s", st.msg);
  ck_assert_uint_eq(a.live, UINT64_C(6) << 20); /* nothing leaked by the refusal */
  /* larger than the whole budget */
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__cuda_allocator_get(&a, 64 << 20, &z, &st), KILN_ELIMIT);
  kiln__cuda_allocator_put(&a, y);
  kiln__cuda_allocator_fini(&a);
  ck_assert_int_eq(f.allocs, f.frees);
}
END_TEST

START_TEST(device_out_of_memory_retries_after_trimming) {
  fake_dev f = {.capacity = UINT64_C(4) << 20};
  kiln__cuda_allocator a;
  kiln__cuda_allocator_init(&a, UINT64_C(1) << 30, fake_alloc, fake_free, &f, "fake:0", "budget");
  kiln_status st;
  kiln_status_clear(&st);
  kiln__cuda_block *x, *y;
  ck_assert_int_eq(kiln__cuda_allocator_get(&a, 3 << 20, &x, &st), 0); /* class 4 MiB */
  kiln__cuda_allocator_put(&a, x);
  /* the device is full of the cached block: it is released and the
   * allocation tried again */
  ck_assert_int_eq(kiln__cuda_allocator_get(&a, 1 << 20, &y, &st), 0);
  ck_assert_int_eq(f.frees, 1);
  ck_assert_uint_eq(f.held, UINT64_C(1) << 20);
  f.capacity = 0; /* now the device has nothing left, cache or not */
  kiln__cuda_block *z;
  ck_assert_int_eq(kiln__cuda_allocator_get(&a, 5 << 20, &z, &st), KILN_ELIMIT);
  ck_assert_msg(strstr(st.msg, "CUDA_ERROR_OUT_OF_MEMORY") != NULL, "%s", st.msg);
  kiln__cuda_allocator_put(&a, y);
  kiln__cuda_allocator_fini(&a);
  ck_assert_int_eq(f.allocs, f.frees);
}
END_TEST

START_TEST(grid_covers_the_range_within_limits) {
  uint32_t g, b;
  kiln__cuda_grid(0, 132, 1024, &g, &b);
  ck_assert_uint_eq(g, 0);
  kiln__cuda_grid(1, 132, 1024, &g, &b); /* a single-iteration kernel: one warp */
  ck_assert_uint_eq(g, 1);
  ck_assert_uint_eq(b, 32);
  kiln__cuda_grid(100, 132, 1024, &g, &b);
  ck_assert_uint_eq(g, 1);
  ck_assert_uint_eq(b, 128);
  kiln__cuda_grid(1000, 132, 1024, &g, &b);
  ck_assert_uint_eq(b, 256);
  ck_assert_uint_eq(g, 4);
  kiln__cuda_grid(UINT64_C(1) << 40, 132, 1024, &g, &b); /* capped: grid-stride does the rest */
  ck_assert_uint_eq(b, 256);
  ck_assert_uint_eq(g, 132 * 16);
  kiln__cuda_grid(1000, 132, 96, &g, &b); /* the kernel's own limit, in whole warps */
  ck_assert_uint_eq(b, 96);
  ck_assert_uint_eq(g, 11);
  kiln__cuda_grid(1000, 0, 0, &g, &b); /* nonsense limits still launch something valid */
  ck_assert_uint_ge(b, 1);
  ck_assert_uint_ge(g, 1);
}
END_TEST

START_TEST(driver_errors_become_statuses_naming_the_call) {
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__cuda_error(0, "cuLaunchKernel", NULL, NULL, "cuda:0", &st), 0);
  ck_assert_int_eq(st.code, 0);
  ck_assert_int_eq(kiln__cuda_error(2, "cuMemAlloc_v2", "CUDA_ERROR_OUT_OF_MEMORY", "out of memory",
                                    "cuda:0", &st),
                   KILN_ELIMIT);
  ck_assert_str_eq(st.where, "cuda:0");
  ck_assert_str_eq(st.msg, "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__cuda_error(700, "cuEventSynchronize", NULL, NULL, NULL, &st),
                   KILN_EINTERNAL);
  ck_assert_msg(strstr(st.msg, "cuEventSynchronize failed: CUresult 700") != NULL, "%s", st.msg);
  ck_assert_int_eq(kiln__cuda_error_code(209), KILN_EUNIMPL); /* no binary for this GPU */
  ck_assert_int_eq(kiln__cuda_error_code(200), KILN_EINVAL);  /* invalid image */
  ck_assert_int_eq(kiln__cuda_error_code(500), KILN_EINVAL);  /* kernel not found */
  ck_assert_int_eq(kiln__cuda_error_code(100), KILN_EUNAVAIL);
  ck_assert_int_eq(kiln__cuda_error_code(999), KILN_EINTERNAL);
}
END_TEST

START_TEST(architectures) {
  int ma, mi;
  ck_assert(kiln__cuda_arch_parse("sm_90", &ma, &mi));
  ck_assert_int_eq(ma, 9);
  ck_assert_int_eq(mi, 0);
  ck_assert(kiln__cuda_arch_parse("sm_100", &ma, &mi));
  ck_assert_int_eq(ma, 10);
  ck_assert_int_eq(mi, 0);
  ck_assert(kiln__cuda_arch_parse("sm_86", &ma, &mi));
  ck_assert_int_eq(mi, 6);
  ck_assert(!kiln__cuda_arch_parse("compute_90", &ma, &mi));
  ck_assert(!kiln__cuda_arch_parse("sm_9", &ma, &mi));
  ck_assert(!kiln__cuda_arch_parse("sm_9x", &ma, &mi));
  ck_assert(!kiln__cuda_arch_parse(NULL, &ma, &mi));
  ck_assert(kiln__cuda_arch_runs(8, 0, 8, 6)); /* sm_80 code on an sm_86 GPU */
  ck_assert(!kiln__cuda_arch_runs(8, 6, 8, 0));
  ck_assert(!kiln__cuda_arch_runs(8, 0, 9, 0)); /* another major: no */
  ck_assert(kiln__cuda_arch_runs(9, 0, 9, 0));
}
END_TEST

/* A real cubin from NVRTC passes the check; every cut of it and a header
 * pointing outside it fail (cuModuleLoadData would read past the end). */
START_TEST(cubins_are_checked_before_the_driver_sees_them) {
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln__nvrtc_version(NULL, NULL, &st) != 0) {
    fprintf(stderr, "skipped: %s\n", st.msg);
    return;
  }
  static const char text[] = "HloModule m\nENTRY e {\n  p = f32[64] parameter(0)\n"
                             "  ROOT a = f32[64] add(p, p)\n}\n";
  kiln_module *m = NULL;
  ck_assert_int_eq(kiln_module_parse_text(text, strlen(text), "m.hlo", NULL, &m, &st), 0);
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.target = "cuda-sm_90";
  kiln_executable *e = NULL;
  ck_assert_msg(kiln_compile(m, &o, &e, NULL, &st) == 0, "%s", st.msg);
  kiln_module_destroy(m);
  char why[160];
  ck_assert_msg(kiln__cuda_cubin_check(e->code, e->ncode, why, sizeof why), "%s", why);
  for (uint64_t cut = 0; cut < e->ncode; cut += 1 + cut / 3)
    ck_assert_msg(!kiln__cuda_cubin_check(e->code, cut, why, sizeof why), "cut at %llu passed",
                  (unsigned long long)cut);
  uint8_t *bad = kiln_malloc(e->ncode);
  memcpy(bad, e->code, e->ncode);
  memset(bad + 40, 0x7f, 8); /* e_shoff */
  ck_assert(!kiln__cuda_cubin_check(bad, e->ncode, why, sizeof why));
  ck_assert_msg(strstr(why, "section headers") != NULL, "%s", why);
  memcpy(bad, e->code, e->ncode);
  bad[18] = 62; /* EM_X86_64: a host object, not a cubin */
  ck_assert(!kiln__cuda_cubin_check(bad, e->ncode, why, sizeof why));
  ck_assert_msg(strstr(why, "machine 62") != NULL, "%s", why);
  kiln_free(bad);
  kiln_executable_destroy(e);
}
END_TEST

/* Without a driver (CI): no cuda backend, and every way of asking for it
 * says why. With a GPU: it is registered and opens. */
START_TEST(registry_has_cuda_only_with_a_gpu) {
  kiln_status st;
  kiln_status_clear(&st);
  uint32_t n = kiln_cuda_device_count(&st);
  kiln_backend *b = NULL;
  kiln_status bst;
  kiln_status_clear(&bst);
  int rc = kiln_backend_create("cuda", NULL, &b, &bst);
  char why[600];
  const char *target = NULL;
  kiln_status tst;
  kiln_status_clear(&tst);
  if (n == 0) {
    fprintf(stderr, "no GPU here (%s): checking that cuda is absent\n", st.msg);
    ck_assert_uint_eq(kiln_backend_caps("cuda"), 0);
    ck_assert_int_eq(rc, KILN_EUNAVAIL);
    ck_assert_msg(strstr(bst.msg, "no CUDA devices") != NULL, "%s", bst.msg);
    ck_assert(kiln_backend_why_absent("cuda", why, sizeof why));
    ck_assert_msg(strstr(why, st.msg) != NULL, "%s", why);
    ck_assert_int_eq(kiln_backend_default_target("cuda", &target, &tst), KILN_EUNAVAIL);
  } else {
    ck_assert_msg(rc == 0, "%s", bst.msg);
    ck_assert_uint_ne(kiln_backend_caps("cuda") & KILN_BACKEND_LOADS, 0);
    ck_assert_uint_eq(kiln_backend_device_count(b), n);
    ck_assert(!kiln_backend_why_absent("cuda", why, sizeof why));
    ck_assert_int_eq(kiln_backend_default_target("cuda", &target, &tst), 0);
    ck_assert_msg(target && strncmp(target, "cuda-sm_", 8) == 0, "%s", target ? target : "NULL");
    /* a buffer round trip, zero-filled first */
    kiln_buffer *buf = NULL;
    ck_assert_int_eq(kiln_buffer_alloc(kiln_backend_device(b, 0), 3000, &buf, &bst), 0);
    unsigned char in[3000], out[3000];
    memset(out, 7, sizeof out);
    ck_assert_int_eq(kiln_buffer_read(buf, 0, out, sizeof out, &bst), 0);
    for (size_t i = 0; i < sizeof out; i++) ck_assert_uint_eq(out[i], 0);
    for (size_t i = 0; i < sizeof in; i++) in[i] = (unsigned char)(i * 31 + 1);
    ck_assert_int_eq(kiln_buffer_write(buf, 0, in, sizeof in, &bst), 0);
    ck_assert_int_eq(kiln_buffer_read(buf, 0, out, sizeof out, &bst), 0);
    ck_assert(memcmp(in, out, sizeof in) == 0);
    ck_assert_ptr_null(kiln_buffer_host(buf, false));
    kiln_buffer_free(buf);
    kiln_backend_destroy(b);
  }
  /* the fixed backends are there either way */
  ck_assert_uint_ne(kiln_backend_caps("cpu") & KILN_BACKEND_LOADS, 0);
  ck_assert_int_eq(kiln_backend_default_target("cpu", &target, &tst), 0);
  ck_assert_ptr_null(target);
  ck_assert(!kiln_backend_why_absent("cpu", why, sizeof why));
  ck_assert(!kiln_backend_why_absent("nonsense", why, sizeof why));
}
END_TEST

int main(void) {
  Suite *s = suite_create("cuda_backend");
  TCase *c = tcase_create("pure");
  tcase_add_test(c, size_classes);
  tcase_add_test(c, freed_blocks_are_reused_by_class);
  tcase_add_test(c, budget_releases_the_cache_then_refuses);
  tcase_add_test(c, device_out_of_memory_retries_after_trimming);
  tcase_add_test(c, grid_covers_the_range_within_limits);
  tcase_add_test(c, driver_errors_become_statuses_naming_the_call);
  tcase_add_test(c, architectures);
  tcase_add_test(c, cubins_are_checked_before_the_driver_sees_them);
  tcase_add_test(c, registry_has_cuda_only_with_a_gpu);
  suite_add_tcase(s, c);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
#else
int main(void) {
  printf("cuda_backend: built without the CUDA device pool (no cuda.h): nothing to test\n");
  return 0;
}
#endif
