/* kiln_compile: verify, clone, pipeline, buffer assignment, lowering and
 * code emission for the target (C or CUDA C), the C compiler or NVRTC,
 * packaging. Each stage is timed for the report.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/alloc.h"
#include "compiler/buffer_assign.h"
#include "compiler/codegen/cc.h"
#include "compiler/codegen/dyn_pad.h"
#include "compiler/codegen/lower.h"
#include "compiler/codegen/nvrtc.h"
#include "compiler/codegen/target_iface.h"
#include "compiler/codegen/user_kernel.h"
#include "compiler/compile.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/verify.h"
#include "compiler/pass.h"
#include "compiler/passes/passes.h"
#include "compiler/target.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void kiln_compile_options_init(kiln_compile_options *o) {
  memset(o, 0, sizeof *o);
  o->opt_level = 2;
}

static void dump_source(const char *dir, const char *name, const char *src, size_t len) {
  char path[4096];
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) return;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (f == NULL) return;
  fwrite(src, 1, len, f);
  fclose(f);
}

typedef struct stage {
  kiln_module *m;
  kiln_buffer_assignment *ba;
  uint64_t *scratch;
  kiln__codegen g;
  bool g_init;
  char *src;
  size_t nsrc;
} stage;

static int run_pipeline(stage *s, const kiln_compile_options *o, const kiln_target *t,
                        kiln_compile_report *r, kiln_status *st) {
  kiln_pipeline_options po = {.target = t,
                              .opt_level = o->opt_level,
                              .verify_each = o->verify_each,
                              .dump_dir = o->dump_dir,
                              .disabled = o->disabled,
                              .ndisabled = o->ndisabled,
                              .memory_budget = o->memory_budget,
                              .remat = &r->remat};
  double t0 = now_ms();
  r->npasses = KILN_COMPILE_MAX_PASSES;
  int rc = kiln_pipeline_run(s->m, &po, r->passes, &r->npasses, st);
  r->pipeline_ms = now_ms() - t0;
  return rc;
}

static int generate(stage *s, const kiln_compile_options *o, const kiln_target *t,
                    kiln_executable *e, kiln_compile_report *r, kiln_status *st) {
  double t0 = now_ms();
  int rc = kiln__lower_prepare(s->m, &s->scratch, st);
  kiln_buffer_options bo = {.scratch_bytes = s->scratch};
  if (rc == 0) rc = kiln_buffer_assign(s->m, &bo, &s->ba, st);
  r->assign_ms = now_ms() - t0;
  if (rc) return rc;
  r->temp_bytes = s->ba->temp_bytes;
  r->peak_bytes = s->ba->peak_bytes;
  t0 = now_ms();
  /* check_target admitted only targets that have a code generator. */
  if ((rc = kiln__codegen_init(&s->g, s->m, kiln__cg_target_for(t->backend), st))) return rc;
  s->g_init = true;
  s->g.user = o->user_kernels;
  rc = kiln__lower(s->m, s->ba, &s->g, e, st);
  if (rc == 0 && (s->src = kiln__codegen_source(&s->g, &s->nsrc)) == NULL)
    rc = kiln_status_set(st, KILN_ENOMEM, "codegen", "out of memory");
  r->codegen_ms = now_ms() - t0;
  r->nkernels = s->g.nkernels;
  r->source_bytes = s->nsrc;
  for (uint32_t p = 0; rc == 0 && p < e->nprograms; p++) r->nsteps += e->programs[p].nsteps;
  return rc;
}

/* Kernels that touch little data finish in microseconds whatever the
 * optimizer does, and -O3's extra passes (unrolling, peeling, versioning)
 * cost the C compiler more than twice the time of -O2 on them (measured on
 * a transformer LM's Adam step: 2.8 s at -O3, 1.2 s at -O2, 1.4 s at -O2
 * with the dynamic cost model). A kernel whose every step runs once per
 * run (in the entry program, or in a call or conditional branch of a
 * program that runs once; not in a loop body) on arguments of at most
 * LIGHT_MAX_BYTES each is light: -O2 with -O3's vectorizer cost model, so
 * its loops still vectorize. One whose arguments add up to at most
 * TINY_MAX_BYTES (a few thousand elements: microseconds even as scalar
 * code) is tiny: -O1, without the vectorizer, whose analysis of every loop
 * for several vector sizes costs GCC 5-10 ms a kernel (topk's seven small
 * kernels: 130 ms of CPU at -O3/-O2, 55 ms at -O1). The others keep -O3.
 * The choice is per kernel: the kernels go into translation units of one
 * class each (codegen/cc_split.c). */
#define LIGHT_MAX_BYTES (UINT64_C(4) << 20)
#define TINY_MAX_BYTES (UINT64_C(16) << 10)

/* Per program: whether it runs at most once per run of the entry (the
 * entry, and what a once program calls or branches to; a loop's body and
 * condition, or a program reached from them, run any number of times). */
static bool *once_programs(const kiln_executable *e) {
  bool *once = kiln_calloc(e->nprograms + 1, sizeof *once);
  bool *many = kiln_calloc(e->nprograms + 1, sizeof *many);
  if (once == NULL || many == NULL) {
    kiln_free(once);
    kiln_free(many);
    return NULL;
  }
  bool *reached = once; /* reached first, then once = reached && !many */
  if (e->nprograms) reached[0] = true;
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t p = 0; p < e->nprograms; p++) {
      if (!reached[p]) continue;
      for (uint32_t i = 0; i < e->programs[p].nsteps; i++) {
        const kiln_step *k = &e->programs[p].steps[i];
        for (uint32_t j = 0; j < k->nsub; j++) {
          uint32_t q = k->sub[j];
          if (q >= e->nprograms) continue;
          bool m = many[p] || k->kind == KILN_STEP_WHILE;
          if (!reached[q] || (m && !many[q])) changed = true;
          reached[q] = true;
          many[q] = many[q] || m;
        }
      }
    }
  }
  for (uint32_t p = 0; p < e->nprograms; p++) once[p] = reached[p] && !many[p];
  kiln_free(many);
  return once;
}

/* Per kernel: its kiln__cc_class; kiln_malloc'd. */
static uint8_t *kernel_classes(const kiln_executable *e, uint32_t nkernels) {
  uint8_t *cls = kiln_malloc(nkernels + 1);
  bool *once = once_programs(e);
  if (cls == NULL || once == NULL) {
    kiln_free(cls);
    kiln_free(once);
    return NULL;
  }
  memset(cls, KILN__CC_TINY, nkernels + 1);
  for (uint32_t p = 0; p < e->nprograms; p++)
    for (uint32_t i = 0; i < e->programs[p].nsteps; i++) {
      const kiln_step *k = &e->programs[p].steps[i];
      /* A GEMM step's epilogue (args[3..] its arguments) is a kernel run
       * as often as the GEMM, over C. */
      bool epilogue = k->kind == KILN_STEP_GEMM && k->nargs > 3;
      if ((k->kind != KILN_STEP_KERNEL && !epilogue) || k->kernel >= nkernels) continue;
      uint8_t c = once[p] ? KILN__CC_TINY : KILN__CC_HEAVY;
      uint64_t sum = 0;
      for (uint32_t a = epilogue ? 3 : 0; a < k->nargs && c != KILN__CC_HEAVY; a++) {
        uint64_t size = e->slots[k->args[a]].size;
        sum += size;
        if (size > LIGHT_MAX_BYTES) c = KILN__CC_HEAVY;
      }
      if (c == KILN__CC_TINY && sum > TINY_MAX_BYTES) c = KILN__CC_LIGHT;
      if (c < cls[k->kernel]) cls[k->kernel] = c;
    }
  kiln_free(once);
  return cls;
}

static int compile_c(stage *s, const kiln_compile_options *o, const kiln_target *t,
                     kiln_executable *e, kiln_compile_report *r, kiln_status *st) {
  const char *cc = o->cc ? o->cc : getenv("KILN_CC");
  kiln__cc_options co = {.cc = cc,
                         .march = t->march,
                         .timeout_s = o->cc_timeout_s,
                         .light_opt = "-O2",
                         .light_tune = "-fvect-cost-model=dynamic",
                         .tiny_opt = "-O1",
                         .jobs = o->cc_jobs,
                         .cache_dir = o->kernel_cache_dir,
                         .no_cache = o->no_kernel_cache};
  uint8_t *cls = kernel_classes(e, s->g.nkernels);
  if (cls == NULL) return kiln_status_set(st, KILN_ENOMEM, "compile", "out of memory");
  kiln__cc_program prog = {.prelude = s->g.mod.target->prelude,
                           .funcs = kiln_sbuf_str(&s->g.mod.funcs),
                           .kernels = kiln_sbuf_str(&s->g.kernels),
                           .nkernels = s->g.nkernels,
                           .cls = cls};
  const uint8_t *objs[KILN_USER_KERNELS_MAX];
  size_t objs_len[KILN_USER_KERNELS_MAX];
  for (uint32_t u = 0; u < s->g.nused && u < KILN_USER_KERNELS_MAX; u++) {
    objs[u] = s->g.used[u]->obj;
    objs_len[u] = s->g.used[u]->nobj;
    prog.nobjs = u + 1;
  }
  prog.objs = objs;
  prog.objs_len = objs_len;
  uint8_t *so = NULL;
  size_t nso = 0;
  kiln__cc_stats cs;
  double t0 = now_ms();
  if (o->dump_dir) dump_source(o->dump_dir, "kernels.c", s->src, s->nsrc);
  /* Copies, GEMMs, FFTs and library steps only: no code object at all
   * (the cpu loader maps none), and no C compiler run. */
  if (s->g.nkernels == 0) {
    kiln_free(cls);
    return 0;
  }
  int rc = kiln__cc_build(&co, &prog, &so, &nso, &cs, st);
  r->cc_ms = now_ms() - t0;
  r->cc_cpu_ms = cs.cpu_ms;
  r->cc_units = cs.units;
  r->cc_units_cached = cs.units_cached;
  r->cc_jobs = cs.jobs;
  kiln_free(cls);
  if (rc) return rc;
  e->code = kiln_arena_memdup(e->arena, so, nso ? nso : 1);
  e->ncode = nso;
  r->code_bytes = nso;
  kiln_free(so);
  return e->code ? 0 : kiln_status_set(st, KILN_ENOMEM, "compile", "out of memory");
}

/* The CUDA target's code: the whole translation unit through NVRTC into
 * one cubin for the row's architecture (codegen/nvrtc.c). No GPU is
 * needed. */
static int compile_cuda(stage *s, const kiln_compile_options *o, const kiln_target *t,
                        kiln_executable *e, kiln_compile_report *r, kiln_status *st) {
  kiln__nvrtc_options no = {.arch = t->isa, .timeout_s = o->cc_timeout_s};
  uint8_t *cubin = NULL;
  size_t n = 0;
  double t0 = now_ms();
  if (o->dump_dir) dump_source(o->dump_dir, "kernels.cu", s->src, s->nsrc);
  int rc = kiln__nvrtc_compile(&no, s->src, s->nsrc, &cubin, &n, st);
  r->cc_ms = now_ms() - t0;
  r->cc_units = 1;
  r->cc_jobs = 1;
  if (rc) return rc;
  e->code_kind = KILN_CODE_CUBIN;
  e->code = kiln_arena_memdup(e->arena, cubin, n);
  e->ncode = n;
  r->code_bytes = n;
  kiln_free(cubin);
  return e->code ? 0 : kiln_status_set(st, KILN_ENOMEM, "compile", "out of memory");
}

/* The target by any spelling kiln_target_resolve accepts (an unknown one
 * is KILN_ENOTFOUND, as compile.h promises); a row whose backend has no
 * code generator (interp) is refused here. */
static int check_target(const kiln_compile_options *o, const kiln_target **t, kiln_status *st) {
  kiln_status rs;
  kiln_status_clear(&rs);
  if (kiln_target_resolve(NULL, o->target, t, &rs))
    return kiln_status_set(st, KILN_ENOTFOUND, "options.target", "%s", rs.msg);
  if (kiln__cg_target_for((*t)->backend) == NULL)
    return kiln_status_set(st, KILN_EUNIMPL, "options.target",
                           "target '%s' (backend %s) has no code generator; use a cpu or cuda "
                           "target",
                           (*t)->name, (*t)->backend);
  return 0;
}

int(kiln_compile)(const kiln_module *m, const kiln_compile_options *o, kiln_executable **out,
                  kiln_compile_report *report, kiln_status *st) {
  *out = NULL;
  kiln_compile_options defaults;
  kiln_compile_report scratch_report;
  if (o == NULL) {
    kiln_compile_options_init(&defaults);
    o = &defaults;
  }
  kiln_compile_report *r = report ? report : &scratch_report;
  memset(r, 0, sizeof *r);
  double t0 = now_ms();
  const kiln_target *t;
  stage s = {0};
  kiln_executable *e = NULL;
  int rc = check_target(o, &t, st);
  if (rc) return rc;
  kiln_verify_options vo = {.max_nesting = o->max_nesting};
  if ((rc = kiln_module_verify(m, &vo, st))) return rc;
  r->verify_ms = now_ms() - t0;
  if ((rc = kiln_module_clone(m, &s.m)))
    return kiln_status_set(st, rc, "compile", "out of memory cloning the module");
  if ((e = kiln_executable_create()) == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, "compile", "out of memory");
    goto out;
  }
  e->target = kiln_arena_strdup(e->arena, t->name);
  if (kiln__dyn_pad_needed(s.m)) {
    /* Bounded-dynamic shapes: static from here on, sizes as values. */
    if (kiln__cg_target_for(t->backend)->code == KILN__CODE_CUBIN) {
      rc = kiln_status_set(st, KILN_EUNIMPL, "options.target",
                           "bounded-dynamic shapes run on the cpu and interp backends, not on "
                           "target '%s'",
                           t->name);
      goto out;
    }
    /* Calls inlined first, so that a runtime size flows through them. */
    kiln_arena *scratch = kiln_arena_create();
    if (scratch == NULL) {
      rc = kiln_status_set(st, KILN_ENOMEM, "compile", "out of memory");
      goto out;
    }
    kiln_pass_ctx pc = {.target = t, .scratch = scratch, .st = st, .opt_level = o->opt_level};
    rc = kiln__dyn_pad_split_calls(s.m, st);
    if (rc == 0) rc = kiln_pass_inline(s.m, &pc);
    kiln_arena_destroy(scratch);
    if (rc == 0) rc = kiln__dyn_pad(s.m, e->arena, &e->dyn, st);
    if (rc) goto out;
  }
  if (o->progress) o->progress(o->progress_arg, "passes");
  if ((rc = run_pipeline(&s, o, t, r, st))) goto out;
  if ((rc = generate(&s, o, t, e, r, st))) goto out;
  if (o->progress) o->progress(o->progress_arg, "cc");
  if (s.g.mod.target->code == KILN__CODE_CUBIN)
    rc = compile_cuda(&s, o, t, e, r, st);
  else
    rc = compile_c(&s, o, t, e, r, st);
  if (rc) goto out;
  *out = e;
  e = NULL;
out:
  r->total_ms = now_ms() - t0;
  kiln_executable_destroy(e);
  kiln_free(s.src);
  if (s.g_init) kiln__codegen_free(&s.g);
  kiln_buffer_assignment_destroy(s.ba);
  kiln_free(s.scratch);
  kiln_module_destroy(s.m);
  return rc;
}

const char *kiln_compile_code_identity(const char *backend, char *buf, size_t size) {
  const kiln__cg_target *g = kiln__cg_target_for(backend);
  if (g == NULL || g->code != KILN__CODE_CUBIN || size == 0) return NULL;
  int major = 0, minor = 0;
  if (kiln__nvrtc_version(&major, &minor, NULL) != 0)
    snprintf(buf, size, "nvrtc none");
  else
    snprintf(buf, size, "nvrtc %d.%d;%s", major, minor, kiln__nvrtc_flags());
  return buf;
}
