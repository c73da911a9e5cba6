/* The compiler's entry point: a module in, an executable out.
 *
 * kiln_compile verifies the module, works on a clone of it (the caller's
 * module is never modified), runs the pass pipeline, assigns buffers,
 * emits one C translation unit for the target, compiles it with the
 * system C compiler into a shared object and packages everything into a
 * kiln_executable (compiler/codegen/executable.h).
 */
#ifndef KILN_COMPILER_COMPILE_H
#define KILN_COMPILER_COMPILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler/codegen/executable.h"
#include "compiler/ir/ir.h"
#include "compiler/pass.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_COMPILE_MAX_PASSES 64

typedef struct kiln_compile_options {
  const char *target;          /* any spelling kiln_target_resolve takes; NULL: "cpu" */
  int opt_level;               /* passed to the pipeline (0: only what correctness needs) */
  bool verify_each;            /* verify after every pass */
  const char *dump_dir;        /* NULL, or a directory for pass dumps and the generated source */
  const char *const *disabled; /* pass names switched off */
  uint32_t ndisabled;
  const char *cc;      /* C compiler; NULL: env KILN_CC, else "cc" */
  double cc_timeout_s; /* limit on the C compiler (the whole build); 0: 120 s */
  uint32_t cc_jobs;    /* C compilers at once; 0: env KILN_CC_JOBS, else the usable CPUs */
  /* Directory of compiled kernels shared across processes (codegen/cc.c);
   * NULL: env KILN_KERNEL_CACHE_DIR, if set; the in-process cache always.
   * Bounded by env KILN_KERNEL_CACHE_DIR_BYTES (default 1 GiB, 0: no
   * bound), least recently used objects removed first. */
  const char *kernel_cache_dir;
  bool no_kernel_cache; /* neither read nor fill the kernel cache */
  /* Told on the compiling thread as the build enters a phase: "passes"
   * (the pass pipeline and code generation), then "cc" (the C compiler).
   * NULL: nobody is told. */
  void (*progress)(void *arg, const char *phase);
  void *progress_arg;
  /* Deepest nesting of called computations accepted (verify.h); 0: the
   * verifier's default. */
  uint32_t max_nesting;
  /* The most bytes of temporaries live at once (the report's peak_bytes);
   * 0: no limit. Over it, the remat pass recomputes values instead of
   * keeping them; a budget it cannot reach is KILN_ELIMIT naming the
   * smallest peak it reached. */
  uint64_t memory_budget;
  /* The user kernels custom calls of kiln.user.NAME may call
   * (codegen/user_kernel.h); NULL: none (such a call is refused). Their
   * objects are linked into the executable: the caller's cache key must
   * hold their digests (kiln_user_kernels_key). */
  const struct kiln_user_kernels *user_kernels;
} kiln_compile_options;

typedef struct kiln_compile_report {
  kiln_pass_timing passes[KILN_COMPILE_MAX_PASSES];
  uint32_t npasses;
  double verify_ms;                            /* verifying the input */
  double pipeline_ms;                          /* all passes */
  double assign_ms;                            /* buffer assignment */
  double codegen_ms;                           /* lowering and C emission */
  double cc_ms;                                /* the C compiler */
  double cc_cpu_ms;                            /* its user + system time, all compilers together */
  uint32_t cc_units, cc_units_cached, cc_jobs; /* translation units, of them cached; parallelism */
  double total_ms;
  uint64_t temp_bytes; /* temporary arena */
  uint64_t peak_bytes; /* peak live temporary bytes */
  uint32_t nkernels, nsteps;
  size_t source_bytes;    /* generated C */
  size_t code_bytes;      /* shared object */
  kiln_remat_stats remat; /* zero without a memory budget */
} kiln_compile_report;

/* The defaults: target "cpu", opt_level 2, the rest off. */
void kiln_compile_options_init(kiln_compile_options *o);

/* Compiles m. `o` and `report` may be NULL. On success *out is a new
 * executable owned by the caller (kiln_executable_destroy). Errors:
 * KILN_EVERIFY for an invalid module, KILN_EUNIMPL naming the instruction
 * the target cannot compile, KILN_ENOTFOUND for an unknown target or a
 * missing C compiler, KILN_ELIMIT when the C compiler runs past its limit,
 * KILN_EINTERNAL with the compiler's output when it fails. For a cuda
 * target the code is a cubin made by NVRTC (no GPU needed); no libnvrtc is
 * KILN_EUNAVAIL. */
int kiln_compile(const kiln_module *m, const kiln_compile_options *o, kiln_executable **out,
                 kiln_compile_report *report, kiln_status *st);

/* The identity of the code compiler behind the target of `backend` when it
 * enters cache keys beside the ISA (cache/key.h,
 * kiln_cache_code_target_text): for cuda, "nvrtc MAJOR.MINOR;FLAGS" (or
 * "nvrtc none" where libnvrtc cannot be loaded), so that a new NVRTC or
 * other options never reuse a cubin; NULL for the others (the C compiler's
 * identity keys the kernel cache instead, codegen/cc.c). Written into
 * buf. */
const char *kiln_compile_code_identity(const char *backend, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_COMPILE_H */
