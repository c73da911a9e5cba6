/* Loading an executable on a cpu device: check everything, then map code.
 *
 * An executable may come from the cache or the network, so before anything
 * runs every table is checked against every other: format version and
 * target (including the host's ISA level), shapes and bindings, each slot's
 * region (temporary arena, constants, parameter leaf, output), each step's
 * slot ids, kernel index, sizes and sub-programs, and the program graph
 * (no cycles, bounded nesting). After this the run loop can index without
 * checking. Steps that write (GEMM's C, COPY's destination) must target
 * temporary or output slots: parameters are the caller's read-only data and
 * constants belong to the shared executable.
 *
 * The code object is an ELF shared object. It is written into an anonymous
 * memory file (memfd_create) and dlopen-ed through /proc/self/fd/N: no file
 * ever touches the disk. The memfd stays open while the code is loaded:
 * glibc recognises an already loaded object by its path, so the fd number
 * (hence the path) must not be reused by another load before dlclose.
 */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/thread.h"
#include "compiler/ir/debug_print.h"
#include "compiler/target.h"
#include "executor/cpu/cpu.h"

#define MAX_NESTING KILN_NESTING_CAPACITY /* programs inside programs (while in while ...) */
#define MAX_SHAPE_DEPTH 64                /* tuple nesting of entry shapes */
#define MAX_STEP_ARGS 65536u              /* slot ids per step */
#define MAX_KERNELS (1u << 20)
#define MAX_CODE_BYTES (UINT64_C(1) << 30)

static const char *const step_names[] = {"kernel",      "gemm",        "copy",  "while",
                                         "conditional", "call",        "conv",  "collective",
                                         "fft",         "debug-print", "linalg"};

/* ---- shapes and bindings ------------------------------------------------ */

static int check_array_shape(const kiln_shape *s, const char *what, uint32_t i, kiln_status *st) {
  if (!kiln_dtype_is_array(s->dtype) || s->dtype >= KILN_DTYPE_COUNT)
    return kiln_status_set(st, KILN_EINVAL, "load", "%s %u: not an array shape", what, i);
  if (s->rank > 0 && s->dims == NULL)
    return kiln_status_set(st, KILN_EINVAL, "load", "%s %u: rank %u without dims", what, i,
                           s->rank);
  for (uint32_t d = 0; d < s->rank; d++)
    if (s->dims[d] < 0)
      return kiln_status_set(st, KILN_EINVAL, "load", "%s %u: dim %u is %lld", what, i, d,
                             (long long)s->dims[d]);
  if (kiln_shape_bytes(s) < 0)
    return kiln_status_set(st, KILN_ELIMIT, "load", "%s %u: size overflows", what, i);
  if (s->layout) {
    const kiln_layout *l = s->layout;
    if (l->rank != s->rank || (l->rank > 0 && l->minor_to_major == NULL))
      return kiln_status_set(st, KILN_EINVAL, "load", "%s %u: layout of rank %u for rank %u", what,
                             i, l->rank, s->rank);
    uint64_t seen = 0;
    for (uint32_t d = 0; d < l->rank; d++) {
      int64_t v = l->minor_to_major[d];
      if (v < 0 || v >= (int64_t)s->rank || s->rank > 64 || (seen >> v & 1))
        return kiln_status_set(st, KILN_EINVAL, "load", "%s %u: layout is not a permutation", what,
                               i);
      seen |= UINT64_C(1) << v;
    }
  }
  return 0;
}

/* Counts the array leaves of an entry shape (tokens and empty tuples have
 * none), checking its structure. */
static int count_leaves(const kiln_shape *s, uint32_t depth, uint64_t *n, kiln_status *st) {
  if (depth > MAX_SHAPE_DEPTH)
    return kiln_status_set(st, KILN_ELIMIT, "load", "entry shape nested deeper than %d",
                           MAX_SHAPE_DEPTH);
  if (s->dtype == KILN_TUPLE) {
    if (s->rank > 0 && s->tuple == NULL)
      return kiln_status_set(st, KILN_EINVAL, "load", "tuple shape without elements");
    for (uint32_t i = 0; i < s->rank; i++) {
      int rc = count_leaves(&s->tuple[i], depth + 1, n, st);
      if (rc) return rc;
    }
    return 0;
  }
  if (s->dtype == KILN_TOKEN) return 0;
  if (!kiln_dtype_is_array(s->dtype) || s->dtype >= KILN_DTYPE_COUNT)
    return kiln_status_set(st, KILN_EINVAL, "load", "entry shape of element type %d", s->dtype);
  (*n)++;
  return 0;
}

static int check_bindings(const kiln_binding *b, uint32_t n, uint64_t leaves, const char *what,
                          const kiln_executable *e, kiln_status *st) {
  if (n != leaves)
    return kiln_status_set(st, KILN_EINVAL, "load", "%u %s bindings for %llu leaves", n, what,
                           (unsigned long long)leaves);
  if (n > 0 && b == NULL)
    return kiln_status_set(st, KILN_EINVAL, "load", "%s bindings missing", what);
  for (uint32_t i = 0; i < n; i++) {
    int rc = check_array_shape(&b[i].shape, what, i, st);
    if (rc) return rc;
    if (b[i].slot >= e->nslots)
      return kiln_status_set(st, KILN_EINVAL, "load", "%s %u: slot %u out of range (%u slots)",
                             what, i, b[i].slot, e->nslots);
    uint64_t bytes = (uint64_t)kiln_shape_bytes(&b[i].shape);
    if (e->slots[b[i].slot].size != bytes)
      return kiln_status_set(
          st, KILN_EINVAL, "load", "%s %u: slot %u has %llu bytes, the binding's shape %llu", what,
          i, b[i].slot, (unsigned long long)e->slots[b[i].slot].size, (unsigned long long)bytes);
  }
  return 0;
}

/* The flattened array leaf shapes of an entry shape, in order, into out[*k...]. */
static void leaf_shapes(const kiln_shape *s, const kiln_shape **out, uint64_t *k) {
  if (s->dtype == KILN_TUPLE) {
    for (uint32_t i = 0; i < s->rank; i++) leaf_shapes(&s->tuple[i], out, k);
  } else if (s->dtype != KILN_TOKEN) {
    out[(*k)++] = s;
  }
}

static int check_signature(const kiln_executable *e, kiln__cpu_loaded *l, kiln_arena *a,
                           kiln_status *st) {
  if (e->nparams > 0 && e->param_shapes == NULL)
    return kiln_status_set(st, KILN_EINVAL, "load", "%u parameter shapes missing", e->nparams);
  l->leaf_base = kiln_arena_calloc(a, e->nparams + 1, sizeof *l->leaf_base);
  l->donated = kiln_arena_calloc(a, (size_t)e->nparam_leaves + 1, sizeof *l->donated);
  if (l->leaf_base == NULL || l->donated == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  uint64_t leaves = 0;
  for (uint32_t p = 0; p < e->nparams; p++) {
    l->leaf_base[p] = (uint32_t)leaves;
    int rc = count_leaves(&e->param_shapes[p], 0, &leaves, st);
    if (rc) return rc;
    if (leaves > UINT32_MAX)
      return kiln_status_set(st, KILN_ELIMIT, "load", "too many parameter leaves");
  }
  int rc = check_bindings(e->params, e->nparam_leaves, leaves, "parameter", e, st);
  if (rc) return rc;
  /* Each parameter binding must describe the leaf it stands for. */
  const kiln_shape **shapes = kiln_arena_calloc(a, leaves + 1, sizeof *shapes);
  if (shapes == NULL) return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  uint64_t k = 0;
  for (uint32_t p = 0; p < e->nparams; p++) leaf_shapes(&e->param_shapes[p], shapes, &k);
  for (uint32_t i = 0; i < e->nparam_leaves; i++)
    if (!kiln_shape_equal(shapes[i], &e->params[i].shape, false))
      return kiln_status_set(st, KILN_EINVAL, "load",
                             "parameter leaf %u: binding shape differs from the entry's", i);
  uint64_t rleaves = 0;
  if ((rc = count_leaves(&e->result_shape, 0, &rleaves, st)) != 0) return rc;
  if ((rc = check_bindings(e->results, e->nresults, rleaves, "result", e, st)) != 0) return rc;
  const kiln_shape **rshapes = kiln_arena_calloc(a, rleaves + 1, sizeof *rshapes);
  if (rshapes == NULL) return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  k = 0;
  leaf_shapes(&e->result_shape, rshapes, &k);
  for (uint32_t i = 0; i < e->nresults; i++)
    if (!kiln_shape_equal(rshapes[i], &e->results[i].shape, false))
      return kiln_status_set(st, KILN_EINVAL, "load",
                             "result leaf %u: binding shape differs from the entry's", i);
  return 0;
}

/* ---- slots -------------------------------------------------------------- */

static bool fits(uint64_t offset, uint64_t size, uint64_t limit) {
  return offset <= limit && size <= limit - offset;
}

static int check_slots(const kiln_executable *e, kiln_status *st) {
  if (e->nslots > 0 && e->slots == NULL)
    return kiln_status_set(st, KILN_EINVAL, "load", "%u slots missing", e->nslots);
  if (e->nconstants > 0 && e->constants == NULL)
    return kiln_status_set(st, KILN_EINVAL, "load", "constants blob missing");
  for (uint32_t i = 0; i < e->nslots; i++) {
    const kiln_slot *s = &e->slots[i];
    switch (s->kind) {
    case KILN_SLOT_TEMP:
      if (!fits(s->offset, s->size, e->temp_bytes))
        return kiln_status_set(st, KILN_EINVAL, "load",
                               "slot %u: bytes [%llu, +%llu) outside the %llu-byte arena", i,
                               (unsigned long long)s->offset, (unsigned long long)s->size,
                               (unsigned long long)e->temp_bytes);
      break;
    case KILN_SLOT_CONSTANT:
      if (!fits(s->offset, s->size, e->nconstants))
        return kiln_status_set(st, KILN_EINVAL, "load",
                               "slot %u: bytes [%llu, +%llu) outside the %llu-byte constants", i,
                               (unsigned long long)s->offset, (unsigned long long)s->size,
                               (unsigned long long)e->nconstants);
      break;
    case KILN_SLOT_PARAM:
      /* Leaf and size are checked against the bindings below. */
      if (s->index >= e->nparams)
        return kiln_status_set(st, KILN_EINVAL, "load", "slot %u: parameter %u of %u", i, s->index,
                               e->nparams);
      break;
    case KILN_SLOT_OUTPUT:
      if (s->index >= e->nresults)
        return kiln_status_set(st, KILN_EINVAL, "load", "slot %u: result leaf %u of %u", i,
                               s->index, e->nresults);
      break;
    default:
      return kiln_status_set(st, KILN_EINVAL, "load", "slot %u: unknown kind %d", i, s->kind);
    }
  }
  return 0;
}

/* PARAM and OUTPUT slots against the bindings (after check_signature). */
static int check_slot_bindings(const kiln_executable *e, kiln__cpu_loaded *l, kiln_status *st) {
  for (uint32_t i = 0; i < e->nslots; i++) {
    const kiln_slot *s = &e->slots[i];
    const kiln_binding *b = NULL;
    if (s->kind == KILN_SLOT_PARAM) {
      uint32_t end = s->index + 1 < e->nparams ? l->leaf_base[s->index + 1] : e->nparam_leaves;
      if (s->leaf >= end - l->leaf_base[s->index])
        return kiln_status_set(st, KILN_EINVAL, "load", "slot %u: parameter %u has no leaf %u", i,
                               s->index, s->leaf);
      b = &e->params[l->leaf_base[s->index] + s->leaf];
    } else if (s->kind == KILN_SLOT_OUTPUT) {
      b = &e->results[s->index];
    }
    if (b && s->size != (uint64_t)kiln_shape_bytes(&b->shape))
      return kiln_status_set(st, KILN_EINVAL, "load", "slot %u: %llu bytes for a leaf of %lld", i,
                             (unsigned long long)s->size, (long long)kiln_shape_bytes(&b->shape));
  }
  for (uint32_t i = 0; i < e->nresults; i++) {
    const kiln_slot *s = &e->slots[e->results[i].slot];
    if (s->kind == KILN_SLOT_PARAM) l->donated[l->leaf_base[s->index] + s->leaf] = true;
  }
  return 0;
}

/* ---- steps -------------------------------------------------------------- */

/* Temporaries and outputs, and parameters donated to a result. */
static bool slot_writable(const kiln_executable *e, const kiln__cpu_loaded *l, uint32_t slot) {
  const kiln_slot *s = &e->slots[slot];
  if (s->kind == KILN_SLOT_PARAM) return l->donated[l->leaf_base[s->index] + s->leaf];
  return s->kind == KILN_SLOT_TEMP || s->kind == KILN_SLOT_OUTPUT;
}

/* A GEMM's epilogue (executable.h, KILN_STEP_GEMM): a kernel whose
 * iterations are whole rows' worth of a dense C. */
static int check_epilogue(const kiln_executable *e, const kiln_step *s, const char *w,
                          kiln_status *st) {
  const kiln_gemm *g = &s->gemm;
  if (s->kernel >= e->nkernels)
    return kiln_status_set(st, KILN_EINVAL, w, "gemm epilogue kernel %u out of range (%u kernels)",
                           s->kernel, e->nkernels);
  __int128 total = (__int128)g->batch * g->m * g->n;
  if (g->ldc != g->n || (g->batch > 1 && g->stride_c != g->m * g->n) || s->range == 0 ||
      total % s->range != 0 || g->n % (int64_t)(total / s->range) != 0)
    return kiln_status_set(
        st, KILN_EINVAL, w,
        "gemm epilogue of %llu iterations over a %lld x %lld x %lld C (ldc %lld)",
        (unsigned long long)s->range, (long long)g->batch, (long long)g->m, (long long)g->n,
        (long long)g->ldc);
  return 0;
}

static int check_gemm(const kiln_executable *e, const kiln__cpu_loaded *l, const kiln_step *s,
                      const char *w, kiln_status *st) {
  const kiln_gemm *g = &s->gemm;
  if (s->nargs < 3)
    return kiln_status_set(st, KILN_EINVAL, w,
                           "gemm takes 3 slots (A, B, C) and its epilogue's, %u given", s->nargs);
  bool i8 = g->dtype == KILN_S8 || g->dtype == KILN_U8, bf = g->dtype == KILN_BF16;
  if (g->dtype != KILN_F32 && g->dtype != KILN_F64 && !i8 && !bf)
    return kiln_status_set(st, KILN_EUNIMPL, w,
                           "gemm of element type %d (f32, f64, bf16 into f32, and s8 or u8 into "
                           "s32 only)",
                           g->dtype);
  if (i8 && s->nargs != 3)
    return kiln_status_set(st, KILN_EINVAL, w, "integer gemm takes 3 slots (A, B, C), %u given",
                           s->nargs);
  if (g->batch < 0 || g->m < 0 || g->n < 0 || g->k < 0 || g->m > INT_MAX || g->n > INT_MAX ||
      g->k > INT_MAX)
    return kiln_status_set(st, KILN_EINVAL, w, "gemm batch %lld, m %lld, n %lld, k %lld",
                           (long long)g->batch, (long long)g->m, (long long)g->n, (long long)g->k);
  char why[160];
  if (!kiln_gemm_check_extents(g, s->args, e->slots, why, sizeof why))
    return kiln_status_set(st, KILN_EINVAL, w, "%s", why);
  if (!slot_writable(e, l, s->args[2]))
    return kiln_status_set(st, KILN_EINVAL, w, "gemm writes slot %u, a parameter or constant",
                           s->args[2]);
  return s->nargs > 3 ? check_epilogue(e, s, w, st) : 0;
}

static int check_step(const kiln_executable *e, const kiln__cpu_loaded *l, const kiln_step *s,
                      const char *w, kiln_status *st) {
  if (s->nargs > MAX_STEP_ARGS || (s->nargs > 0 && s->args == NULL))
    return kiln_status_set(st, KILN_EINVAL, w, "%u slot ids", s->nargs);
  if (s->nsub > 0 && s->sub == NULL)
    return kiln_status_set(st, KILN_EINVAL, w, "%u sub-programs missing", s->nsub);
  for (uint32_t i = 0; i < s->nargs; i++)
    if (s->args[i] >= e->nslots)
      return kiln_status_set(st, KILN_EINVAL, w, "argument %u: slot %u out of range (%u slots)", i,
                             s->args[i], e->nslots);
  for (uint32_t i = 0; i < s->nsub; i++)
    if (s->sub[i] >= e->nprograms)
      return kiln_status_set(st, KILN_EINVAL, w, "sub-program %u out of range (%u programs)",
                             s->sub[i], e->nprograms);
  switch (s->kind) {
  case KILN_STEP_KERNEL:
    if (s->kernel >= e->nkernels)
      return kiln_status_set(st, KILN_EINVAL, w, "kernel %u out of range (%u kernels)", s->kernel,
                             e->nkernels);
    if (s->range > (uint64_t)INT64_MAX)
      return kiln_status_set(st, KILN_EINVAL, w, "range %llu", (unsigned long long)s->range);
    return 0;
  case KILN_STEP_GEMM: return check_gemm(e, l, s, w, st);
  case KILN_STEP_COPY:
    if (s->nargs != 2)
      return kiln_status_set(st, KILN_EINVAL, w, "copy takes 2 slots, %u given", s->nargs);
    for (int i = 0; i < 2; i++)
      if (s->range > e->slots[s->args[i]].size)
        return kiln_status_set(st, KILN_EINVAL, w, "copy of %llu bytes, slot %u has %llu",
                               (unsigned long long)s->range, s->args[i],
                               (unsigned long long)e->slots[s->args[i]].size);
    if (s->range > 0 && !slot_writable(e, l, s->args[0]))
      return kiln_status_set(st, KILN_EINVAL, w, "copy writes slot %u, a parameter or constant",
                             s->args[0]);
    return 0;
  case KILN_STEP_WHILE:
    if (s->nsub != 2 || s->nargs < 1)
      return kiln_status_set(st, KILN_EINVAL, w,
                             "while takes 2 programs and a predicate slot, has %u and %u", s->nsub,
                             s->nargs);
    if (e->slots[s->args[0]].size < 1)
      return kiln_status_set(st, KILN_EINVAL, w, "while predicate slot %u is empty", s->args[0]);
    return 0;
  case KILN_STEP_CONDITIONAL: {
    if (s->nsub < 1 || s->nargs < 1)
      return kiln_status_set(st, KILN_EINVAL, w,
                             "conditional takes branches and a selector slot, has %u and %u",
                             s->nsub, s->nargs);
    uint64_t size = e->slots[s->args[0]].size;
    if (size != 1 && size != 4)
      return kiln_status_set(st, KILN_EINVAL, w,
                             "selector slot %u has %llu bytes (1 for pred, 4 for s32)", s->args[0],
                             (unsigned long long)size);
    return 0;
  }
  case KILN_STEP_CALL:
    if (s->nsub != 1)
      return kiln_status_set(st, KILN_EINVAL, w, "call takes 1 program, has %u", s->nsub);
    return 0;
  case KILN_STEP_CONV: {
    char why[160];
    if (s->conv == NULL)
      return kiln_status_set(st, KILN_EINVAL, w, "conv step without a description");
    if (s->nargs != 3)
      return kiln_status_set(st, KILN_EINVAL, w, "conv takes 3 slots (lhs, rhs, out), %u given",
                             s->nargs);
    if (!kiln_conv_check(s->conv, e->slots[s->args[0]].size, e->slots[s->args[1]].size,
                         e->slots[s->args[2]].size, why, sizeof why))
      return kiln_status_set(st, KILN_EINVAL, w, "conv: %s", why);
    if (!slot_writable(e, l, s->args[2]))
      return kiln_status_set(st, KILN_EINVAL, w, "conv writes slot %u, a parameter or constant",
                             s->args[2]);
    return 0;
  }
  case KILN_STEP_COLLECTIVE: {
    const char *why = kiln_coll_check(&s->coll, s->nargs, e->slots, s->args);
    if (why) return kiln_status_set(st, KILN_EINVAL, w, "collective: %s", why);
    uint32_t first = s->coll.nops; /* results follow the operands */
    for (uint32_t i = first; i < s->nargs; i++)
      if (!slot_writable(e, l, s->args[i]))
        return kiln_status_set(st, KILN_EINVAL, w,
                               "collective writes slot %u, a parameter or constant", s->args[i]);
    return 0;
  }
  case KILN_STEP_DEBUG_PRINT: {
    kiln_debug_record rec;
    char why[160];
    if (s->nargs != 2 || e->slots[s->args[1]].kind != KILN_SLOT_CONSTANT)
      return kiln_status_set(st, KILN_EINVAL, w, "debug print takes a value and a constant record");
    const kiln_slot *rs = &e->slots[s->args[1]];
    if (!kiln_debug_record_read(e->constants + rs->offset, rs->size, e->slots[s->args[0]].size,
                                &rec, why, sizeof why))
      return kiln_status_set(st, KILN_EINVAL, w, "%s", why);
    return 0;
  }
  case KILN_STEP_FFT: {
    char why[200];
    if (s->fft == NULL)
      return kiln_status_set(st, KILN_EINVAL, w, "fft step without a description");
    if (s->nargs != 2)
      return kiln_status_set(st, KILN_EINVAL, w, "fft takes 2 slots (operand, result), %u given",
                             s->nargs);
    if (!kiln_fft_check(s->fft, e->slots[s->args[0]].size, e->slots[s->args[1]].size, why,
                        sizeof why))
      return kiln_status_set(st, KILN_EINVAL, w, "fft: %s", why);
    if (!slot_writable(e, l, s->args[1]))
      return kiln_status_set(st, KILN_EINVAL, w, "fft writes slot %u, a parameter or constant",
                             s->args[1]);
    return 0;
  }
  case KILN_STEP_LINALG: {
    char why[200];
    uint64_t sizes[KILN_LAPACK_MAX_ARGS];
    if (s->linalg == NULL)
      return kiln_status_set(st, KILN_EINVAL, w, "linalg step without a description");
    if (s->nargs != s->linalg->l.nargs || s->nargs > KILN_LAPACK_MAX_ARGS)
      return kiln_status_set(st, KILN_EINVAL, w, "linalg takes %u slots, %u given",
                             s->linalg->l.nargs, s->nargs);
    for (uint32_t k = 0; k < s->nargs; k++) sizes[k] = e->slots[s->args[k]].size;
    if (!kiln_linalg_check(s->linalg, s->nargs, sizes, why, sizeof why))
      return kiln_status_set(st, KILN_EINVAL, w, "linalg: %s", why);
    /* Operands are read, every result leaf is written. */
    for (uint32_t k = kiln_lapack_noperands(s->linalg->l.kind); k < s->nargs; k++)
      if (!slot_writable(e, l, s->args[k]))
        return kiln_status_set(st, KILN_EINVAL, w, "linalg writes slot %u, a parameter or constant",
                               s->args[k]);
    return 0;
  }
  }
  return kiln_status_set(st, KILN_EINVAL, w, "unknown step kind %d", s->kind);
}

/* The library primitives of CONV step i of program p, made once here. */
static int plan_conv(kiln__cpu_loaded *l, kiln_arena *a, uint32_t p, uint32_t i, const char *w,
                     kiln_status *st) {
  const kiln_program *pr = &l->exe->programs[p];
  if (l->conv == NULL &&
      (l->conv = kiln_arena_calloc(a, l->exe->nprograms, sizeof *l->conv)) == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  if (l->conv[p] == NULL &&
      (l->conv[p] = kiln_arena_calloc(a, pr->nsteps, sizeof **l->conv)) == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  return kiln__cpu_conv_create(pr->steps[i].conv, &l->conv[p][i], w, st);
}

/* The FFTW plan of FFT step i of program p, made once here. */
static int plan_fft(kiln__cpu_loaded *l, kiln_arena *a, uint32_t p, uint32_t i, const char *w,
                    kiln_status *st) {
  const kiln_program *pr = &l->exe->programs[p];
  if (l->fft == NULL && (l->fft = kiln_arena_calloc(a, l->exe->nprograms, sizeof *l->fft)) == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  if (l->fft[p] == NULL && (l->fft[p] = kiln_arena_calloc(a, pr->nsteps, sizeof **l->fft)) == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  return kiln__cpu_fft_create(pr->steps[i].fft, &l->fft[p][i], w, st);
}

/* Height of program p's nesting below it; rejects cycles and depth beyond
 * MAX_NESTING. state: 0 unseen, 1 on the path, 2 done (height known). */
static int check_nesting(const kiln_executable *e, uint32_t p, uint32_t depth, uint8_t *state,
                         uint32_t *height, kiln_status *st) {
  if (state[p] == 1)
    return kiln_status_set(st, KILN_EINVAL, "load", "program %u runs itself (a cycle)", p);
  if (state[p] == 2) {
    if (depth + height[p] > MAX_NESTING) goto too_deep;
    return 0;
  }
  if (depth > MAX_NESTING) goto too_deep;
  state[p] = 1;
  uint32_t h = 0;
  const kiln_program *pr = &e->programs[p];
  for (uint32_t i = 0; i < pr->nsteps; i++)
    for (uint32_t j = 0; j < pr->steps[i].nsub; j++) {
      uint32_t q = pr->steps[i].sub[j];
      int rc = check_nesting(e, q, depth + 1, state, height, st);
      if (rc) return rc;
      if (height[q] + 1 > h) h = height[q] + 1;
    }
  state[p] = 2;
  height[p] = h;
  return 0;
too_deep:
  return kiln_status_set(st, KILN_ELIMIT, "load", "programs nest deeper than %d", MAX_NESTING);
}

static int check_programs(const kiln_executable *e, kiln__cpu_loaded *l, kiln_arena *a,
                          kiln_status *st) {
  if (e->nprograms == 0 || e->programs == NULL)
    return kiln_status_set(st, KILN_EINVAL, "load", "no entry program");
  if (e->nkernels > MAX_KERNELS)
    return kiln_status_set(st, KILN_ELIMIT, "load", "%u kernels (at most %u)", e->nkernels,
                           MAX_KERNELS);
  l->argv_base = kiln_arena_calloc(a, e->nprograms, sizeof *l->argv_base);
  uint8_t *state = kiln_arena_calloc(a, e->nprograms, 1);
  uint32_t *height = kiln_arena_calloc(a, e->nprograms, sizeof *height);
  if (l->argv_base == NULL || state == NULL || height == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  uint64_t nargv = 0;
  for (uint32_t p = 0; p < e->nprograms; p++) {
    const kiln_program *pr = &e->programs[p];
    if (pr->nsteps > 0 && pr->steps == NULL)
      return kiln_status_set(st, KILN_EINVAL, "load", "program %u: steps missing", p);
    l->argv_base[p] = kiln_arena_calloc(a, pr->nsteps + 1, sizeof(uint64_t));
    if (l->argv_base[p] == NULL) return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
    for (uint32_t i = 0; i < pr->nsteps; i++) {
      const kiln_step *s = &pr->steps[i];
      char w[96];
      unsigned kind = (unsigned)s->kind;
      snprintf(w, sizeof w, "program %u step %u (%s)", p, i,
               kind < sizeof step_names / sizeof step_names[0] ? step_names[kind] : "?");
      int rc = check_step(e, l, s, w, st);
      if (rc == 0 && s->kind == KILN_STEP_CONV) rc = plan_conv(l, a, p, i, w, st);
      if (rc == 0 && s->kind == KILN_STEP_FFT) rc = plan_fft(l, a, p, i, w, st);
      if (rc) return rc;
      l->argv_base[p][i] = nargv;
      nargv += s->nargs;
      if (nargv > (UINT64_C(1) << 28))
        return kiln_status_set(st, KILN_ELIMIT, "load", "too many step arguments");
    }
  }
  l->nargv = nargv;
  return check_nesting(e, 0, 0, state, height, st);
}

/* ---- header ------------------------------------------------------------- */

/* Whether this host can run code compiled for `march`. */
static bool host_runs(const char *march) {
  if (march == NULL || strcmp(march, "native") == 0) return true;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  if (strcmp(march, "x86-64") == 0) return true;
  if (strcmp(march, "x86-64-v2") == 0) return __builtin_cpu_supports("x86-64-v2");
  if (strcmp(march, "x86-64-v3") == 0) return __builtin_cpu_supports("x86-64-v3");
  if (strcmp(march, "x86-64-v4") == 0) return __builtin_cpu_supports("x86-64-v4");
  return false;
#elif defined(__x86_64__)
  return strncmp(march, "x86-64", 6) == 0;
#else
  return false;
#endif
}

static int check_header(const kiln__cpu_device *dev, const kiln_executable *e, kiln_status *st) {
  if (e->format_version != KILN_EXE_FORMAT_VERSION)
    return kiln_status_set(st, KILN_EINVAL, "load",
                           "executable format version %u, this executor runs version %u",
                           e->format_version, KILN_EXE_FORMAT_VERSION);
  if (e->target == NULL || e->target[0] == '\0') /* "" would resolve to the default */
    return kiln_status_set(st, KILN_EINVAL, "load", "executable names no target");
  const kiln_target *t;
  if (kiln_target_resolve("cpu", e->target, &t, NULL))
    return kiln_status_set(st, KILN_EINVAL, "load",
                           "executable compiled for target '%.64s', not a cpu target", e->target);
  if (!host_runs(t->march))
    return kiln_status_set(st, KILN_EUNIMPL, "load",
                           "executable compiled for %s (-march=%s), which this host's CPU lacks",
                           t->name, t->march);
  if (e->temp_bytes > dev->max_temp_bytes)
    return kiln_status_set(
        st, KILN_ELIMIT, "load", "executable needs a %llu-byte temporary arena, the limit is %llu",
        (unsigned long long)e->temp_bytes, (unsigned long long)dev->max_temp_bytes);
  return 0;
}

/* ---- code --------------------------------------------------------------- */

static int write_all(int fd, const uint8_t *p, uint64_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (uint64_t)w;
  }
  return 0;
}

#if defined(__x86_64__)
#define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_MACHINE EM_AARCH64
#else
#define HOST_MACHINE EM_NONE
#endif

/* The ELF header and program headers of the code object, before the
 * dynamic loader sees it: the loader maps segments straight from the file
 * and trusts their offsets, so a truncated object would fault (SIGBUS) on
 * first touch instead of failing to load. What the checked tables describe
 * is then inside the bytes we have. (The code itself is trusted: the cache
 * only hands over signed executables.) */
static int check_elf(const uint8_t *code, uint64_t n, kiln_status *st) {
  Elf64_Ehdr h;
  if (n < sizeof h || memcmp(code, ELFMAG, SELFMAG) != 0)
    return kiln_status_set(st, KILN_EINVAL, "load", "the code object is not an ELF shared object");
  memcpy(&h, code, sizeof h);
  if (h.e_ident[EI_CLASS] != ELFCLASS64 || h.e_ident[EI_DATA] != ELFDATA2LSB ||
      h.e_type != ET_DYN || h.e_machine != HOST_MACHINE)
    return kiln_status_set(st, KILN_EINVAL, "load",
                           "the code object is not a 64-bit little-endian shared object for "
                           "this machine (class %u, data %u, type %u, machine %u)",
                           h.e_ident[EI_CLASS], h.e_ident[EI_DATA], h.e_type, h.e_machine);
  if (h.e_phentsize != sizeof(Elf64_Phdr) || h.e_phnum == 0 || h.e_phoff > n ||
      (uint64_t)h.e_phnum * sizeof(Elf64_Phdr) > n - h.e_phoff)
    return kiln_status_set(st, KILN_EINVAL, "load", "the code object's program headers are cut");
  if (h.e_shoff != 0 && (h.e_shoff > n || (uint64_t)h.e_shnum * h.e_shentsize > n - h.e_shoff))
    return kiln_status_set(st, KILN_EINVAL, "load", "the code object's section headers are cut");
  for (uint32_t i = 0; i < h.e_phnum; i++) {
    Elf64_Phdr ph;
    memcpy(&ph, code + h.e_phoff + (uint64_t)i * sizeof ph, sizeof ph);
    if (ph.p_type == PT_NULL) continue;
    if (ph.p_offset > n || ph.p_filesz > n - ph.p_offset ||
        (ph.p_type == PT_LOAD && ph.p_filesz > ph.p_memsz))
      return kiln_status_set(st, KILN_EINVAL, "load",
                             "the code object's segment %u lies outside its %llu bytes", i,
                             (unsigned long long)n);
  }
  return 0;
}

static int map_code(kiln__cpu_loaded *l, const kiln_executable *e, kiln_arena *a, kiln_status *st) {
  if (e->nkernels == 0) return 0; /* nothing to map: copies and GEMMs only */
  if (e->code == NULL || e->ncode == 0)
    return kiln_status_set(st, KILN_EINVAL, "load", "%u kernels but no code object", e->nkernels);
  if (e->ncode > MAX_CODE_BYTES)
    return kiln_status_set(st, KILN_ELIMIT, "load", "code object of %llu bytes",
                           (unsigned long long)e->ncode);
  int rc = check_elf(e->code, e->ncode, st);
  if (rc) return rc;
  l->kernels = kiln_arena_calloc(a, e->nkernels, sizeof *l->kernels);
  l->kernel_cost = kiln_arena_calloc(a, e->nkernels, sizeof *l->kernel_cost);
  if (l->kernels == NULL || l->kernel_cost == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  l->memfd = memfd_create("kiln-executable", MFD_CLOEXEC);
  if (l->memfd < 0)
    return kiln_status_set(st, KILN_EIO, "load", "memfd_create: %s", strerror(errno));
  if (write_all(l->memfd, e->code, e->ncode))
    return kiln_status_set(st, KILN_EIO, "load", "writing the code object: %s", strerror(errno));
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", l->memfd);
  l->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (l->dl == NULL) {
    const char *why = dlerror();
    return kiln_status_set(st, KILN_EINVAL, "load", "cannot load the code object: %.400s",
                           why ? why : "unknown error");
  }
  for (uint32_t i = 0; i < e->nkernels; i++) {
    char name[32];
    snprintf(name, sizeof name, "kiln_kernel_%u", i);
    void *sym = dlsym(l->dl, name);
    if (sym == NULL)
      return kiln_status_set(st, KILN_EINVAL, "load", "the code object does not export %s", name);
    /* POSIX guarantees dlsym's object pointer converts to a function pointer. */
    memcpy(&l->kernels[i], &sym, sizeof sym);
  }
  return 0;
}

/* ---- entry points ------------------------------------------------------- */

typedef struct loaded_block {
  kiln__cpu_loaded l;
  kiln_arena *arena;
} loaded_block;

int kiln__cpu_load(kiln__cpu_device *dev, const kiln_executable *e, kiln__cpu_loaded **out,
                   kiln_status *st) {
  *out = NULL;
  int rc = check_header(dev, e, st);
  if (rc) return rc;
  kiln_arena *a = kiln_arena_create();
  loaded_block *blk = a ? kiln_arena_calloc(a, 1, sizeof *blk) : NULL;
  if (blk == NULL) {
    kiln_arena_destroy(a);
    return kiln_status_set(st, KILN_ENOMEM, "load", "out of memory");
  }
  blk->arena = a;
  kiln__cpu_loaded *l = &blk->l;
  l->exe = e;
  l->dev = dev;
  l->memfd = -1;
  pthread_mutex_init(&l->mu, NULL);
  if ((rc = check_slots(e, st)) || (rc = check_signature(e, l, a, st)) ||
      (rc = check_slot_bindings(e, l, st)) || (rc = check_programs(e, l, a, st)) ||
      (rc = map_code(l, e, a, st))) {
    kiln__cpu_unload(l);
    return rc;
  }
  *out = l;
  return 0;
}

void kiln__cpu_unload(kiln__cpu_loaded *l) {
  if (l == NULL) return;
  if (l->dl) dlclose(l->dl);
  if (l->memfd >= 0) close(l->memfd);
  for (uint32_t p = 0; l->conv && p < l->exe->nprograms; p++)
    for (uint32_t i = 0; l->conv[p] && i < l->exe->programs[p].nsteps; i++)
      kiln__cpu_conv_destroy(l->conv[p][i]);
  for (uint32_t p = 0; l->fft && p < l->exe->nprograms; p++)
    for (uint32_t i = 0; l->fft[p] && i < l->exe->programs[p].nsteps; i++)
      kiln__cpu_fft_destroy(l->fft[p][i]);
  for (uint32_t i = 0; i < l->narena_cache; i++) kiln_free(l->arena_cache[i]);
  pthread_mutex_destroy(&l->mu);
  loaded_block *blk = (loaded_block *)l;
  kiln_arena_destroy(blk->arena);
}
