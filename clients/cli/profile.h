/* `kiln bench --profile` and `--trace FILE`: the time of every step of a
 * compiled run (fused kernels, GEMMs, convolutions, copies, collectives,
 * control steps), named by the instruction it was lowered from and the
 * op_name JAX writes into metadata (so jax.named_scope regions show), as a
 * table on stderr and as Chrome trace JSON (Perfetto opens it).
 *
 * The profile observes runs through kiln_run_options.observer; the table
 * sums the timed iterations, the trace holds the last one: one "X" event
 * per step (cat "step" for leaf steps, "control" for while, conditional and
 * call steps, whose leaf steps nest inside them) and one "run" event for the
 * whole run. */
#ifndef KILN_CLIENTS_CLI_PROFILE_H
#define KILN_CLIENTS_CLI_PROFILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "compiler/codegen/executable.h"
#include "executor/backend.h"

typedef struct kiln__profile kiln__profile;

/* NULL on out-of-memory. The executable must outlive the profile. */
kiln__profile *kiln__profile_create(const kiln_executable *e);
void kiln__profile_destroy(kiln__profile *p);

/* The observer to put in kiln_run_options; runs between begin and end
 * count (begin(p, false) for warm-up runs, which are not counted). */
const kiln_step_observer *kiln__profile_observer(kiln__profile *p);
void kiln__profile_begin(kiln__profile *p, bool counted);
void kiln__profile_end(kiln__profile *p);

/* The table (to f), and the trace of the last counted run (to path);
 * the latter 0 or -1 with errno. */
void kiln__profile_print(const kiln__profile *p, FILE *f);
int kiln__profile_write_trace(const kiln__profile *p, const char *path);

#endif /* KILN_CLIENTS_CLI_PROFILE_H */
