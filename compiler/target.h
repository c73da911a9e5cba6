/* Targets: the table of what code can be built for, and the one resolver
 * that turns a name a user wrote into a row of it.
 *
 * A target is a backend ("cpu", "cuda", "interp") and, for native code, an
 * ISA within it ("x86-64-v3", "sm_90"). Every place that takes a target
 * name (kilnd's compile options, the kiln command's --target, `kiln cache
 * explain`, kiln_compile, the CPU loader reading an executable's header)
 * resolves it with kiln_target_resolve, so a spelling accepted in one place
 * is accepted, and means the same row, everywhere. The row's canonical name
 * is what executables record and reports print; its ISA is the target text
 * of cache keys (cache/key.h).
 */
#ifndef KILN_COMPILER_TARGET_H
#define KILN_COMPILER_TARGET_H

#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One row of the table: constants for the cost model and code generation. */
typedef struct kiln_target {
  const char *name;       /* canonical: "cpu", "cpu-x86-64-v3", "cuda-sm_90", "interp" */
  const char *backend;    /* the backend that runs its code: "cpu", "cuda", "interp" */
  const char *isa;        /* the ISA alone, also a spelling of the row and the cache key's
                           * target text: "x86-64-v3", "sm_90"; "native" for the host's own
                           * CPU (code differs per machine); NULL when there is none */
  const char *march;      /* C compiler -march value for CPU targets, else NULL */
  double peak_flops;      /* per second, per device */
  double bandwidth;       /* bytes per second, per device */
  double launch_overhead; /* seconds per kernel launch */
} kiln_target;

/* The whole table, in order; *n receives its length. A backend's first row
 * is its default. */
const kiln_target *kiln_targets(uint32_t *n);

/* The first row: "cpu", the host's own CPU (cc -march=native). */
const kiln_target *kiln_target_default(void);

/* Resolves `name` among the rows of `backend` (NULL: of every backend).
 * Accepted spellings of a row: its canonical name ("cpu-x86-64-v3"), its
 * ISA alone ("x86-64-v3"), and BACKEND-ISA ("cpu-native"); NULL or "" is the
 * backend's default row (the table's first row when backend is NULL).
 * Names are matched exactly (case matters). On success *out is the row (the
 * table is static: never freed). An unknown name, a row of another backend
 * or an unknown backend is KILN_EINVAL with a message that lists the names
 * the table knows; where is "target". st may be NULL. */
int kiln_target_resolve(const char *backend, const char *name, const kiln_target **out,
                        kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_TARGET_H */
