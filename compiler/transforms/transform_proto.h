/* The wire form of function transforms: kiln_transform <-> kiln.v1.Transform
 * (proto/kiln/v1/kiln.proto), in one place that the clients (the kiln
 * command, libkiln, and later the Python client's C core) and kilnd all
 * link, so that a spec means the same in process and through a server.
 *
 * The mapping is total in both directions for what a spec can say:
 *   grad[:wrt=..,output=k]   GradTransform{wrt, with_value=true, output=k}
 *   vjp[:wrt=..,output=k]    VjpTransform{wrt, output=k}
 *   jvp[:wrt=..]             JvpTransform{wrt}
 *   vmap[:in_axes=..,out_axes=..,size=N]
 *                            VmapTransform{in_axes, out_axes, axis_size=N}
 *   checkpoint               CheckpointTransform{}
 *   autocast:T[,loss_scale=..,growth_interval=N]
 *                            AutocastTransform{dtype=T, loss_scale, growth_interval}
 * A spec's grad is jax.value_and_grad (the value first, then the
 * gradients); the wire's GradTransform without with_value is jax.grad,
 * the same program with the value taken out of its result
 * (kiln_transform_drop_value). Wire fields a spec cannot say and the
 * compiler cannot do (grad.has_aux, checkpoint policies other than
 * nothing_saveable) are refused with KILN_EUNIMPL naming the field.
 *
 * A vmap whose size the caller gives as arguments (size=N absent) gets it
 * on the client, from the shapes of the arguments it is about to send
 * (kiln_transforms_infer_sizes): the server has no arguments at compile
 * time, and inferring on both sides the same way is what keeps the two
 * paths equal.
 */
#ifndef KILN_COMPILER_TRANSFORMS_TRANSFORM_PROTO_H
#define KILN_COMPILER_TRANSFORMS_TRANSFORM_PROTO_H

#include <stdbool.h>
#include <stdint.h>

#include "common/arena.h"
#include "common/status.h"
#include "compiler/ir/ir.h"
#include "compiler/transforms/transform.h"
#include "kiln/v1/kiln.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Encodes t (as kiln_transform_parse makes it) into a new Transform whose
 * messages live in `a` (wrt and axis lists too: t may go away). */
int kiln_transform_to_proto(kiln_arena *a, const kiln_transform *t, Kiln__V1__Transform **out,
                            kiln_status *st);

/* Decodes one Transform of a request; `path` names it in errors
 * ("options.transforms[1]", extended with the field: ".vmap.in_axes").
 * *drop_value is set for a grad without with_value. A malformed message is
 * KILN_EINVAL, a field that cannot be honoured KILN_EUNIMPL. */
int kiln_transform_from_proto(const Kiln__V1__Transform *pt, const char *path, kiln_transform *out,
                              bool *drop_value, kiln_status *st);

/* Parses specs[0..n), fills in the vmap sizes from args[0..nargs) when
 * some vmap has none and args is not NULL (nargs may be 0: no arguments
 * to infer from is then the error a local run gives), and encodes them into (*out)[0..n)
 * allocated in `a`. Errors are kiln_transform_parse's and
 * kiln_transforms_infer_sizes' (KILN_EINVAL); *bad is then the index of the
 * spec that failed to parse, or -1 when inference failed. */
int kiln_transform_specs_to_proto(kiln_arena *a, const char *const *specs, uint32_t n,
                                  const kiln_shape *const *args, uint32_t nargs,
                                  Kiln__V1__Transform ***out, int *bad, kiln_status *st);

/* The result of a grad (value, g0, ...) becomes g0 (one wrt) or (g0, ...):
 * jax.grad from jax.value_and_grad. Call right after that grad's
 * kiln_transforms_apply, so later transforms see the signature. */
int kiln_transform_drop_value(kiln_module *m, kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_TRANSFORMS_TRANSFORM_PROTO_H */
