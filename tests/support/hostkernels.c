/* The kernels of a cpu executable in the test process (hostkernels.h). */
#include "tests/support/hostkernels.h"

#include <check.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/alloc.h"

kiln_test_kernel_fn *kiln_test_cpu_kernels(const kiln_executable *e, void **dl) {
  *dl = NULL;
  kiln_test_kernel_fn *fns = kiln_calloc(e->nkernels + 1, sizeof *fns);
  ck_assert_ptr_nonnull(fns);
  if (e->nkernels == 0) return fns;
  int fd = memfd_create("fake-cuda-kernels", MFD_CLOEXEC);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, e->code, e->ncode), (ssize_t)e->ncode);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(*dl != NULL, "%s", dlerror());
  close(fd);
  for (uint32_t i = 0; i < e->nkernels; i++) {
    char name[32];
    snprintf(name, sizeof name, "kiln_kernel_%u", i);
    void *sym = dlsym(*dl, name);
    ck_assert_ptr_nonnull(sym);
    memcpy(&fns[i], &sym, sizeof sym);
  }
  return fns;
}

bool kiln_test_same_program(const kiln_executable *a, const kiln_executable *b) {
  if (a->nprograms != b->nprograms || a->nkernels != b->nkernels || a->nslots != b->nslots ||
      a->temp_bytes != b->temp_bytes)
    return false;
  for (uint32_t i = 0; i < a->nslots; i++)
    if (a->slots[i].kind != b->slots[i].kind || a->slots[i].offset != b->slots[i].offset ||
        a->slots[i].size != b->slots[i].size || a->slots[i].index != b->slots[i].index)
      return false;
  for (uint32_t p = 0; p < a->nprograms; p++) {
    const kiln_program *x = &a->programs[p], *y = &b->programs[p];
    if (x->nsteps != y->nsteps) return false;
    for (uint32_t i = 0; i < x->nsteps; i++) {
      const kiln_step *s = &x->steps[i], *t = &y->steps[i];
      if (s->kind != t->kind || s->kernel != t->kernel || s->range != t->range ||
          s->nargs != t->nargs || s->nsub != t->nsub ||
          (s->nargs && memcmp(s->args, t->args, s->nargs * sizeof *s->args)) ||
          (s->nsub && memcmp(s->sub, t->sub, s->nsub * sizeof *s->sub)))
        return false;
    }
  }
  return true;
}
