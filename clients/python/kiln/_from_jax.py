"""kiln.from_jax: code that already uses JAX, lowered by JAX on the client
and compiled and run on kilnd.

from_jax(f) returns a function that, per argument signature (pytree
structure, shapes, dtypes, static arguments), lowers jax.jit(f,
keep_unused=True) to HLO text (lower(...).as_text(dialect="hlo")) on the
client, compiles it on kilnd once and runs it on server-resident arrays; the
outputs stay on the server (kiln Arrays) in f's output pytree, scalars
inline. donate_argnums, as jax.jit's: those arguments' server buffers may be
reused for the outputs (a training step's state), so a step costs one
Execute. JAX is needed only here.
"""
import functools

import numpy as np

from . import _dtypes, tree_util
from ._client import INLINE_MAX_ELEMENTS, Array, connection


def from_jax(f, *, static_argnums=(), donate_argnums=(), num_partitions=1):
    try:
        import jax
    except ImportError:
        raise ImportError("kiln.from_jax needs JAX installed on the client") from None
    if num_partitions != 1:
        raise NotImplementedError("kiln.from_jax: sharded functions (num_partitions > 1); kilnd "
                                  "runs single-device programs")
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    static_argnums = tuple(static_argnums)
    if isinstance(donate_argnums, int):
        donate_argnums = (donate_argnums,)
    donate_argnums = tuple(donate_argnums)
    jitted = jax.jit(f, static_argnums=static_argnums, keep_unused=True)
    cache = {}

    def spec(x):
        if isinstance(x, Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype)
        a = np.asarray(x)
        return jax.ShapeDtypeStruct(a.shape, _dtypes.canonical(a.dtype))

    @functools.wraps(f)
    def run(*args):
        nargs = len(args)
        static = {i % nargs for i in static_argnums} if nargs else set()
        dyn = [a for i, a in enumerate(args) if i not in static]
        leaves, tree = jax.tree_util.tree_flatten(dyn)
        specs = [spec(x) for x in leaves]
        key = (tree, tuple((s.shape, str(s.dtype)) for s in specs),
               tuple((i, args[i]) for i in sorted(static)))
        hit = cache.get(key)
        if hit is None:
            it = iter(jax.tree_util.tree_unflatten(tree, specs))
            largs = [args[i] if i in static else next(it) for i in range(nargs)]
            lowered = jitted.lower(*largs)
            try:
                out_shapes = [o.shape for o in jax.tree_util.tree_leaves(lowered.out_info)]
            except Exception:
                out_shapes = None
            donate = set()
            k = 0
            for i in range(nargs):
                if i in static:
                    continue
                n = jax.tree_util.tree_structure(args[i]).num_leaves
                if i in donate_argnums:
                    donate.update(range(k, k + n))
                k += n
            hit = cache[key] = (lowered.as_text(dialect="hlo"), lowered.out_tree, out_shapes,
                                donate)
        text, out_tree, out_shapes, donate = hit
        conn = connection()
        exe = conn.compile(text)
        values = [x if isinstance(x, Array) else np.asarray(x, dtype=s.dtype)
                  for x, s in zip(leaves, specs)]
        inline = None
        if out_shapes is not None and len(out_shapes) == out_tree.num_leaves:
            inline = [int(np.prod(s, dtype=np.int64)) <= INLINE_MAX_ELEMENTS for s in out_shapes]
        outs = conn.execute(exe.executable_id, values, donate=donate, nout=out_tree.num_leaves,
                            inline=inline)
        return jax.tree_util.tree_unflatten(out_tree, outs)

    run.lower_text = lambda *args: jitted.lower(*args).as_text(dialect="hlo")
    return run
