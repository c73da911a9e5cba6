/* Function transforms applied on the server: grad, vjp, jvp, vmap and
 * checkpoint, the seed design of JAX applied to the HLO a client sent.
 *
 * A transform rewrites the module's ENTRY computation into a new ENTRY that
 * computes the transformed function; called computations are shared or new
 * ones are added next to them. A list of transforms is applied innermost
 * first: [grad, vmap] is vmap(grad(f)). Every transform is generic over one
 * rule table keyed by opcode (rules.c) holding each op's JVP rule, its
 * transpose (VJP) rule and its batching rule.
 *
 * Signatures of transformed programs. The "outputs" of a program are the
 * leaves of its root, depth-first (a non-tuple root is one output), as
 * `kiln run` prints them; parameters keep their numbers. With n parameters
 * p0..p(n-1), outputs o0..o(m-1) and wrt = w0..w(k-1):
 *
 *   jvp(f)(p0..p(n-1), t_w0..t_w(k-1)) -> (o0..o(m-1), do0..do(m-1))
 *       one tangent parameter per wrt parameter, of its shape; parameters
 *       not in wrt have zero tangents. Default wrt: all parameters.
 *   vjp(f)(p0..p(n-1), ct_c0..ct_c(j-1)) -> (o0..o(m-1), g_w0..g_w(k-1))
 *       one cotangent parameter per chosen output c (all outputs, or the
 *       one named by output=), of its shape. Default wrt: all parameters.
 *   grad(f)(p0..p(n-1)) -> (o_c, g_w0..g_w(k-1))
 *       JAX's value_and_grad: the chosen output o_c (output=, default 0)
 *       must be a floating-point scalar; its cotangent is 1. Default wrt:
 *       parameter 0, as jax.grad's argnums=0. wrt parameters must be
 *       floating point.
 *   vmap(f)(p0..p(n-1)) -> the root of f, each leaf batched
 *       parameter i of f's shape S gets a batch dimension of size
 *       axis_size inserted at in_axes[i] ("none": not batched, S as it is;
 *       negative axes count from the end; default 0 for all);
 *       output leaf j gets it at out_axes[j] (default 0; "none" only for
 *       an output that does not depend on a batched input). All batched
 *       parameters must agree on the batch size.
 *       Outputs that do not depend on batched inputs are broadcast along
 *       the batch, as jax.vmap does with out_axes=0.
 *   autocast(f)(p0..p(n-1)) -> f's root (mixed precision)
 *       every dot and convolution of f32 operands, in the ENTRY and the
 *       computations it calls, takes its operands converted to bf16 or f16
 *       and accumulates in f32 (the written f32 result is XLA's
 *       preferred_element_type); everything else (reductions, softmax,
 *       norms, exp/log, the loss) stays f32. See autocast.c.
 *   grad(autocast:f16(f))(p0..p(n-1), scale, good) ->
 *       (o_c, g_w0..g_w(k-1), new_scale, new_good)   dynamic loss scaling
 *       a grad applied after an autocast:f16 (unless loss_scale=none)
 *       seeds the backward pass with the f32 scalar `scale` instead of 1,
 *       divides the gradients by it, and when any gradient is not finite
 *       returns zero gradients (the update is skipped), halves the scale
 *       and resets the s32 count `good` of finite steps; after
 *       growth_interval finite steps in a row the scale doubles.
 *   checkpoint(f)(p0..p(n-1)) -> f's root
 *       the body of f becomes a call marked for rematerialization: a later
 *       vjp/grad recomputes its forward values in the backward pass instead
 *       of keeping them alive (jax.checkpoint). Calls in a source module
 *       marked with frontend_attributes={_kiln_checkpoint="true"} are
 *       treated the same way.
 *
 *   custom rules (custom.c): a call whose frontend_attributes name a
 *       custom_jvp rule (_kiln_custom_jvp="J") or a custom_vjp rule
 *       (_kiln_custom_vjp_fwd="F", _kiln_custom_vjp_bwd="B"), computations
 *       of the same module, is differentiated with the rule instead of its
 *       body, as jax.custom_jvp / jax.custom_vjp; vmap batches the rule with
 *       the call. Names and signatures are checked (KILN_EINVAL).
 *
 * These compose: grad of grad chooses the inner gradient as its output
 * (grad, grad:output=1); a Hessian-vector product is jvp of grad:
 * (x, v) -> (f(x), g(x), df(x).v, H(x)v); a Hessian is vmap of that over v
 * (vmap:in_axes=none,0). Integer and pred values have zero tangents and
 * cotangents (written as zeros of their own type).
 *
 * Coverage. Every op of ops.def has derivative and batching rules, is
 * first rewritten into ops that have them (async wrappers and the -start/
 * -done forms, batch norms, maps of elementwise computations,
 * batch-grouped convolutions: lower.c), or is listed in rules.c as without
 * them, with the reason an error gives when a transform reaches it
 * (integer and pred values, random numbers, side effects, dynamic shapes,
 * custom calls, ragged-all-to-all). Complex values are differentiated with
 * JAX's conventions (transposes without conjugation; the gradient of a
 * real function of z = x + iy is df/dx - i df/dy); real, imag, complex and
 * fft (all four types) have rules. Collectives transpose into
 * collectives over the same devices (all-gather <-> reduce-scatter,
 * all-to-all, collective-permute inverted, collective-broadcast as a sum
 * kept on the source).
 *
 * Spec strings, as given to `kiln run --transform` and in compile options:
 *   grad | grad:wrt=0,1 | grad:wrt=0,output=1 | vjp:wrt=0 | vjp:output=1
 *   jvp | jvp:wrt=0 | vmap:in_axes=0,none,1 | vmap:in_axes=0,out_axes=1
 *   vmap:in_axes=0,size=8 | checkpoint
 *   autocast:bf16 | autocast:f16 | autocast:f16,loss_scale=none
 *   autocast:f16,growth_interval=1000 | autocast:bf16,loss_scale=dynamic
 * Options are separated by ','; a bare integer or "none" continues the list
 * of the option before it (wrt=0,1 and in_axes=0,none,1).
 */
#ifndef KILN_COMPILER_TRANSFORMS_TRANSFORM_H
#define KILN_COMPILER_TRANSFORMS_TRANSFORM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_transform_kind {
  KILN_TRANSFORM_GRAD,
  KILN_TRANSFORM_VJP,
  KILN_TRANSFORM_JVP,
  KILN_TRANSFORM_VMAP,
  KILN_TRANSFORM_CHECKPOINT,
  KILN_TRANSFORM_AUTOCAST,
} kiln_transform_kind;

#define KILN_TRANSFORM_MAX_ARGS 64
/* vmap axis "none": the value is not batched. Other negative axes count
 * from the end, as in jax.vmap (-1: a new last dimension). */
#define KILN_AXIS_NONE INT64_MIN

typedef struct kiln_transform {
  kiln_transform_kind kind;
  /* grad/vjp/jvp: the parameters differentiated against, in the order the
   * results list them; nwrt == 0 means the default (see above). */
  uint32_t nwrt;
  int64_t wrt[KILN_TRANSFORM_MAX_ARGS];
  /* grad/vjp: the output differentiated; -1: default (grad: 0; vjp: all). */
  int64_t output;
  /* vmap: per parameter, the batch dimension or KILN_AXIS_NONE; nin_axes
   * == 0 means 0 for every parameter, 1 applies to every parameter. */
  uint32_t nin_axes;
  int64_t in_axes[KILN_TRANSFORM_MAX_ARGS];
  /* vmap: per output leaf, where the batch dimension goes (KILN_AXIS_NONE:
   * unbatched); nout_axes == 0 means 0 for every output, 1 applies to
   * every output. */
  uint32_t nout_axes;
  int64_t out_axes[KILN_TRANSFORM_MAX_ARGS];
  /* vmap: the batch size (jax.vmap's axis_size); 0 until given with size=N
   * or inferred from argument shapes (kiln_transforms_infer_sizes). */
  int64_t axis_size;
  /* autocast: the narrow type dots and convolutions take (KILN_BF16 or
   * KILN_F16); loss_scale: a grad later in the list gets dynamic loss
   * scaling (default on for f16, off for bf16); growth_interval: finite
   * steps before the scale doubles (0: the default, 2000). */
  kiln_dtype cast_to;
  bool loss_scale;
  int64_t growth_interval;
} kiln_transform;

/* What a reverse-mode transform kept alive from the forward pass to the
 * backward pass: forward values (not parameters or constants) of the ENTRY
 * that backward instructions use. A proxy for peak memory until buffer
 * assignment reports it. */
typedef struct kiln_transform_stats {
  uint32_t saved_values;
  int64_t saved_bytes;
} kiln_transform_stats;

/* Parses one spec string (see above). Errors are KILN_EINVAL with a
 * message naming the offending part: "vmap: in_axes entry 'x' is not an
 * integer or none". */
int kiln_transform_parse(const char *spec, kiln_transform *out, kiln_status *st);

/* Writes the canonical spec of `t` ("grad:wrt=0,1") into buf. */
void kiln_transform_format(const kiln_transform *t, char *buf, size_t size);

const char *kiln_transform_kind_name(kiln_transform_kind k); /* "grad" */

/* Fills in the batch size of every vmap in ts[0..n) that has none, from
 * the shapes of the arguments the transformed program will be called with
 * (args[i] for its parameter i): for each vmap, from its first batched
 * parameter, looking through the vmaps applied after it. A vmap whose size
 * cannot be found, or arguments that disagree with a given size, are
 * KILN_EINVAL. */
int kiln_transforms_infer_sizes(kiln_transform *ts, uint32_t n, const kiln_shape *const *args,
                                uint32_t nargs, kiln_status *st);

/* Applies ts[0..n) to the module's ENTRY, innermost first, and removes what
 * the transforms left unused (DCE). The module must be verified. On error
 * the module may hold new, unreferenced computations but its ENTRY is
 * unchanged unless a later transform of the list failed. The entry layout
 * and input/output aliases of the header are dropped (they describe the old
 * signature). */
int kiln_transforms_apply(kiln_module *m, const kiln_transform *ts, uint32_t n, kiln_status *st);

/* Same, and reports on the last vjp/grad of the list in *stats (zeros when
 * there is none). */
int kiln_transforms_apply_stats(kiln_module *m, const kiln_transform *ts, uint32_t n,
                                kiln_transform_stats *stats, kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_TRANSFORMS_TRANSFORM_H */
