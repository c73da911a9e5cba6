/* Running the system C compiler on generated source: a module's kernels
 * split into units compiled in parallel, reused from the kernel cache and
 * linked once (kiln__cc_build; cc.c's header says how). */
#ifndef KILN_COMPILER_CODEGEN_CC_H
#define KILN_COMPILER_CODEGEN_CC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct kiln__cc_options {
  const char *cc;    /* program (PATH is searched); NULL: "cc" */
  const char *march; /* -march= value; NULL or "": none */
  double timeout_s;  /* wall-clock limit over the whole build; <= 0: 120 s */
  const char *opt;   /* optimization flag; NULL: "-O3" */
  const char *tune;  /* one more flag after it (a -f option); NULL: none */
  /* kiln__cc_build only: */
  const char *light_opt;  /* for units of light kernels; NULL: opt */
  const char *light_tune; /* with light_opt; NULL: none */
  const char *tiny_opt;   /* for units of tiny kernels; NULL: as light */
  const char *tiny_tune;  /* with tiny_opt; NULL: none */
  uint32_t jobs;          /* compilers at once; 0: env KILN_CC_JOBS, else the CPUs we may use */
  size_t unit_bytes;      /* kernel text per unit; 0: env KILN_CC_UNIT_BYTES, else cc_split.c's */
  /* Directory of compiled units shared across processes; NULL: env
   * KILN_KERNEL_CACHE_DIR; "" (or unset): memory only. */
  const char *cache_dir;
  bool no_cache;         /* neither read nor fill the kernel cache */
  const char *link_flag; /* one more argument for the link; NULL: none */
} kiln__cc_options;

/* A module's generated source in its three parts (kernel.h): the target's
 * prelude, the helper functions ("static inline ... kf<N>(" / "kless<N>(",
 * each starting in column 0 and ending with "}\n\n"), and the kernels
 * ("void kiln_kernel_<N>(void *const *bufs, int64_t begin, int64_t end) {"
 * in column 0, N = 0, 1, ... in order). */
typedef struct kiln__cc_program {
  const char *prelude, *funcs, *kernels;
  uint32_t nkernels;
  const uint8_t *cls; /* per kernel: its kiln__cc_class (compile flags); NULL: all heavy */
  /* Objects compiled elsewhere (user kernels, user_kernel.h) linked in
   * after the units; their symbols are what the kernels call. */
  const uint8_t *const *objs;
  const size_t *objs_len;
  uint32_t nobjs;
} kiln__cc_program;

/* How much a kernel's run time is worth optimizing for (compile.c
 * decides): each class has its own flags, and units hold one class each. */
typedef enum kiln__cc_class {
  KILN__CC_HEAVY = 0, /* the full optimizer (opt) */
  KILN__CC_LIGHT = 1, /* little data, once per run (light_opt) */
  KILN__CC_TINY = 2,  /* a few KiB, once per run: cheap flags (tiny_opt) */
  KILN__CC_NCLASSES = 3
} kiln__cc_class;

typedef struct kiln__cc_stats {
  uint32_t units;        /* translation units */
  uint32_t units_cached; /* of which found in the kernel cache */
  uint32_t kernels_distinct;
  uint32_t jobs;  /* compilers run at once at most */
  double cpu_ms;  /* user + system time of the compilers and the link */
  double link_ms; /* the link step (wall) */
} kiln__cc_stats;

/* Compiles a module's kernels into a shared object and returns its bytes
 * in *so (kiln_malloc'd). The shared object exports kiln_kernel_0 ..
 * kiln_kernel_{nkernels-1}, built from units compiled concurrently or taken
 * from the kernel cache. Every compiler runs in its own process group with
 * a private temporary directory that is removed before returning. Failure
 * is KILN_EINTERNAL carrying the compiler's (truncated) output, a timeout
 * KILN_ELIMIT, a compiler that cannot be started KILN_ENOTFOUND. stats may
 * be NULL. */
int kiln__cc_build(const kiln__cc_options *o, const kiln__cc_program *p, uint8_t **so,
                   size_t *so_len, kiln__cc_stats *stats, kiln_status *st);

/* Compiles one translation unit src[0..n) on its own (-c, o's opt or
 * -O3, the fixed flags and `define`, a -D argument or NULL) into an
 * object, *obj kiln_malloc'd; no kernel cache. Within o's time limit
 * (KILN_ELIMIT past it); failure is KILN_EINTERNAL with the compiler's
 * (truncated) output. */
int kiln__cc_object(const kiln__cc_options *o, const char *src, size_t n, const char *define,
                    uint8_t **obj, size_t *obj_len, kiln_status *st);

/* The in-process kernel cache's bound in bytes of objects (the default is
 * env KILN_KERNEL_CACHE_BYTES, else 64 MiB; 0 turns it off); evicts down
 * to it at once. */
void kiln__cc_cache_set_limit(uint64_t bytes);
/* The cache directory's bound in bytes of objects (the default is env
 * KILN_KERNEL_CACHE_DIR_BYTES, else 1 GiB; 0: no bound), applied after
 * each put by removing the least recently used objects (cc_cache.c). */
void kiln__cc_cache_set_dir_limit(uint64_t bytes);
typedef struct kiln__cc_cache_stats {
  uint64_t bytes, entries, hits, misses, evictions, disk_hits, disk_rejected;
  uint64_t disk_evictions; /* objects this process removed from cache directories */
} kiln__cc_cache_stats;
void kiln__cc_cache_stats_get(kiln__cc_cache_stats *out);
/* Empties the in-process cache (tests). */
void kiln__cc_cache_clear(void);

#endif /* KILN_COMPILER_CODEGEN_CC_H */
