/* Passes and the pass manager.
 *
 * One pass = one file in compiler/passes/ with one entry point of one
 * signature, kiln_pass_fn. A pass rewrites the module in place and keeps it
 * valid; it reports failure through ctx->st. The ordered list lives in
 * compiler/pipeline.c. The manager times each pass, can verify after each,
 * and can dump the module after each (HLO text and Graphviz DOT).
 */
#ifndef KILN_COMPILER_PASS_H
#define KILN_COMPILER_PASS_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/ir/ir.h"
#include "compiler/target.h" /* kiln_target */

#ifdef __cplusplus
extern "C" {
#endif

/* What rematerialization did (passes/remat.c); all zero when no budget
 * was given. Bytes are the peak of live temporaries as buffer assignment
 * places them (kiln_compile_report.peak_bytes). */
typedef struct kiln_remat_stats {
  uint64_t budget;      /* asked for */
  uint64_t peak_before; /* before the pass */
  uint64_t peak_after;  /* after it (<= budget, or the smallest reached) */
  double extra_flops;   /* of the recomputed values (cost.h's count) */
  double flops;         /* of the whole ENTRY after the pass (loops counted once) */
  uint32_t recomputed;  /* values computed a second time */
  uint32_t moved;       /* values computed later instead, at no cost */
} kiln_remat_stats;

typedef struct kiln_pass_ctx {
  const kiln_target *target;
  kiln_arena *scratch; /* freed after the pass */
  kiln_status *st;
  int opt_level;
  /* The most bytes of temporaries the program may hold live at once; 0:
   * no limit (remat does nothing). */
  uint64_t memory_budget;
  kiln_remat_stats *remat; /* NULL, or where remat reports */
} kiln_pass_ctx;

typedef int (*kiln_pass_fn)(kiln_module *m, const kiln_pass_ctx *ctx);

typedef struct kiln_pass {
  const char *name; /* "simplify", "dce", ... as used by --disable-pass */
  kiln_pass_fn run;
  int min_opt_level; /* runs when opt_level >= this */
} kiln_pass;

typedef struct kiln_pipeline_options {
  const kiln_target *target;   /* NULL: default */
  int opt_level;               /* 0: only what correctness needs; 2: default */
  bool verify_each;            /* run the verifier after every pass */
  const char *dump_dir;        /* NULL: no dumps; else NN-pass.hlo and .dot per pass */
  const char *stop_after;      /* NULL, or the name of the last pass to run */
  const char *const *disabled; /* pass names switched off */
  uint32_t ndisabled;
  /* NULL, or where passes that can explain their decisions with the cost
   * model's numbers write them, one line each (fusion; `kiln explain`):
   * kiln_pipeline_run makes it the running thread's kiln__pass_explain()
   * while it runs the passes. */
  struct kiln_sbuf *explain;
  uint64_t memory_budget;  /* kiln_pass_ctx.memory_budget */
  kiln_remat_stats *remat; /* kiln_pass_ctx.remat */
} kiln_pipeline_options;

typedef struct kiln_pass_timing {
  const char *name;
  double ms;
  bool ran;
} kiln_pass_timing;

/* The ordered pass list. */
const kiln_pass *kiln_pipeline_passes(uint32_t *n);
const kiln_pass *kiln_pipeline_find(const char *name);

/* Runs the pipeline on m. timings (may be NULL) receives one entry per pass
 * in the list (at most *ntimings on input; the count written on output). */
int kiln_pipeline_run(kiln_module *m, const kiln_pipeline_options *opts, kiln_pass_timing *timings,
                      uint32_t *ntimings, kiln_status *st);

/* The explain buffer of the pipeline running on this thread (see
 * kiln_pipeline_options.explain), or NULL. */
struct kiln_sbuf *kiln__pass_explain(void);

/* Graphviz DOT of a module (one cluster per computation). kiln_malloc'd. */
char *kiln_module_to_dot(const kiln_module *m, size_t *len);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_PASS_H */
