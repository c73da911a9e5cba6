/* The reference interpreter: a plain evaluator of the IR on literals,
 * following XLA's operation semantics. It is the oracle every other backend
 * and every pass is checked against, so it is written to be obviously
 * correct, not fast.
 *
 * It is the IR's reference semantics, so it lives with the compiler
 * (compiler/eval, library kiln_interp), which uses it for constant folding;
 * the names kept their interp_ / kiln_interp_ spelling from before the move.
 * Execution goes through the interp backend instead
 * (executor/interp/interp_backend.c, behind executor/backend.h): only the
 * compiler and tests that need the oracle itself call kiln_interp_run.
 */
#ifndef KILN_COMPILER_EVAL_INTERP_H
#define KILN_COMPILER_EVAL_INTERP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The rendezvous of the devices of a kiln_interp_run_mesh (opaque). */
typedef struct kiln_interp_mesh kiln_interp_mesh;

typedef struct kiln_interp_options {
  uint64_t max_while_iterations; /* per while loop; 0: default 1e9 */
  size_t max_live_bytes;         /* total literal bytes alive; 0: default 8 GiB */
  int64_t replica_id;            /* value of replica-id (single replica: 0) */
  int64_t partition_id;
  double timeout_seconds; /* wall-clock limit; 0: none */
  /* May be NULL. Once it reads nonzero, evaluation stops at the next time
   * check (between instructions, while iterations) with KILN_ECANCELED. */
  const atomic_int *cancel;
  /* Set by kiln_interp_run_mesh for each device (callers leave it NULL):
   * collectives then meet the other devices' interpreters. */
  kiln_interp_mesh *mesh;
  /* May be NULL: where kiln.debug_print custom calls print (debug_print.h);
   * without one they only pass their operand on. */
  const struct kiln_debug_sink *debug;
} kiln_interp_options;

/* Runs the ENTRY computation of a module on `args` (one literal per
 * parameter, shapes must match, layouts ignored; an argument of a
 * bounded-dynamic shape may carry runtime sizes). On success *out is a new
 * heap literal (a tuple when the root is a tuple). Unsupported ops and
 * element types (collectives whose groups span several devices, custom-call
 * targets that are not built in, infeed/outfeed/send/recv, complex math
 * beyond + - * / negate abs real imag complex and EQ/NE, arithmetic on the f8
 * types other than f8e5m2/f8e4m3/f8e3m4) fail with KILN_EUNIMPL and a
 * message naming the instruction. Limits (live bytes, while iterations,
 * wall-clock time) fail with KILN_ELIMIT. The module need not be verified:
 * malformed input is KILN_EINVAL, never a crash. `opts` may be NULL. */
int kiln_interp_run(const kiln_module *m, const kiln_literal *const *args, uint32_t nargs,
                    const kiln_interp_options *opts, kiln_literal **out, kiln_status *st);

/* Runs a per-device program (explicit collectives, replica-id and
 * partition-id, per-device shapes) on replicas x partitions devices, device
 * K = replica * partitions + partition, each on an interpreter of its own in
 * a thread of its own; collectives meet at a rendezvous. args[K] are device
 * K's nargs arguments; outs[K] receives its result (all NULL on failure).
 * Replica groups are read as XLA does (channel_id, use_global_device_ids).
 * The first failing device's status is returned (lowest K first), naming
 * the device; a device waiting on a peer that failed or finished without
 * reaching the collective fails too, never hangs. opts->replica_id,
 * partition_id and mesh are ignored. */
int kiln_interp_run_mesh(const kiln_module *m, uint32_t replicas, uint32_t partitions,
                         const kiln_literal *const *const *args, uint32_t nargs,
                         const kiln_interp_options *opts, kiln_literal **outs, kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_EVAL_INTERP_H */
