"""jit, grad, value_and_grad, vmap, jvp, vjp, checkpoint: functions staged out
to kilnd.

A Staged function is a Python function plus a list of transform layers,
innermost first (jit(vmap(grad(f))) is f with [grad, vmap]). Calling it
traces f once per argument signature (pytree structure, shapes and dtypes of
the array leaves, values of the static arguments) into an HLO module with the
signature the innermost layer sees (a vmap layer strips its batch axes), and
compiles that module on kilnd with one kiln.v1.Transform per layer, in the
same order. The layers say what the transformed program's parameters and
outputs are (compiler/transforms/transform.h):

  the program's parameters: the user's array leaves, the trace's hidden
  parameters (lifted constants and captured server arrays), then what each
  layer adds at the end (vjp's cotangents, jvp's tangents), innermost first;
  its outputs: a flat list of leaves that each layer regroups into the pytree
  JAX would return.

grad with has_aux is vjp of output 0 with a cotangent of one (the server's
grad refuses has_aux): vjp returns every output, so the auxiliary values come
back alongside. A Staged function with no layers called inside a trace is
inlined, as jax.jit is. A transformed one called inside a trace (grad inside
jit: a whole training step as one program) is traced alone, transformed by
the server (a Compile on the interpreter backend asking for the module text
after the transforms, once per signature) and that text is inlined into the
enclosing trace as computations called with HLO call.
"""
import re
import functools

import numpy as np

from . import _core, _dtypes, tree_util
from ._client import INLINE_MAX_ELEMENTS, Array, connection
from ._core import Graph, Tracer, _stack, aval_of, to_tracer
from ._proto import kiln_pb2


def _is_array_leaf(x):
    return isinstance(x, (Array, Tracer, np.ndarray, np.generic, bool, int, float, complex))


class Layer:
    kind = None


class GradLayer(Layer):
    kind = "grad"

    def __init__(self, argnums, has_aux, with_value):
        self.argnums, self.has_aux, self.with_value = argnums, has_aux, with_value


class VmapLayer(Layer):
    kind = "vmap"

    def __init__(self, in_axes, out_axes, axis_size):
        self.in_axes, self.out_axes, self.axis_size = in_axes, out_axes, axis_size


class CheckpointLayer(Layer):
    kind = "checkpoint"

    def __init__(self, policy):
        self.policy = policy


class JvpLayer(Layer):
    kind = "jvp"


class VjpLayer(Layer):
    kind = "vjp"


def _argnum_leaves(in_tree_args, argnums):
    """User-leaf indices of the positional arguments argnums, and a rebuild
    function giving the pytree of per-leaf values grouped as JAX does."""
    counts = [tree_util.tree_structure(a).num_leaves for a in in_tree_args]
    starts = np.cumsum([0] + counts).tolist()
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    idx = []
    for n in nums:
        if not -len(counts) <= n < len(counts):
            raise ValueError(f"kiln: argnums {n} is out of range for {len(counts)} arguments")
        n %= len(counts)
        idx.extend(range(starts[n], starts[n] + counts[n]))

    def rebuild(vals):
        out, k = [], 0
        for n in nums:
            n %= len(counts)
            td = tree_util.tree_structure(in_tree_args[n])
            out.append(td.unflatten(vals[k:k + counts[n]]))
            k += counts[n]
        return out[0] if isinstance(argnums, int) else tuple(out)

    return idx, rebuild


class _Trace:
    """One traced signature: the module text, its hidden values and the
    output tree of the base function."""

    def __init__(self, text, hidden, out_tree, out_avals):
        self.text, self.hidden, self.out_tree, self.out_avals = text, hidden, out_tree, out_avals
        self.hidden_arrays = None  # hidden numpy values uploaded once


def trace_function(fn, args, kwargs, dyn_mask, avals, name):
    """Traces fn(*args, **kwargs) with the dynamic leaves (dyn_mask) replaced
    by parameters of the given avals."""
    leaves, tree = tree_util.tree_flatten((args, kwargs))
    g = Graph(name)
    params = []
    for leaf, dyn, av in zip(leaves, dyn_mask, avals):
        params.append(g.add_parameter(*av) if dyn else leaf)
    _stack().append(g.entry)
    try:
        a, k = tree.unflatten(params)
        out = fn(*a, **k)
        out_leaves, out_tree = tree_util.tree_flatten(out)
        outs = [to_tracer(o, g.entry) for o in out_leaves]
        text = g.render(outs)
    finally:
        _stack().pop()
        for c in [g.entry] + g.comps:
            c.finished = True
    tr = _Trace(text, list(g.hidden), out_tree, [(o.shape, o.dtype) for o in outs])
    return tr


class Staged:
    """A function traced and compiled on kilnd, with transform layers."""

    def __init__(self, fn, layers=(), static_argnums=(), donate_argnums=(), name=None):
        functools.update_wrapper(self, fn, updated=())
        self.fn = fn
        self.layers = list(layers)
        self.static_argnums = tuple(static_argnums)
        self.donate_argnums = tuple(donate_argnums)
        self.name = name or getattr(fn, "__name__", "fn")
        self._traces = {}

    def with_layer(self, layer):
        return Staged(self.fn, self.layers + [layer], self.static_argnums, (), self.name)

    def _cache_size(self):
        return len(self._traces)

    def __get__(self, obj, objtype=None):
        return self if obj is None else functools.partial(self, obj)

    def lower(self, *args, **kwargs):
        """The traced module (a Lowered: the HLO text, a str, as before,
        with JAX's as_text() and compile())."""
        return Lowered(self, args, kwargs, self._prepare(args, kwargs, ())[0].text)

    def __call__(self, *args, **kwargs):
        return self._run(args, kwargs, ())

    # ---- the work ----
    def _split(self, args, kwargs):
        static = {i % max(len(args), 1) for i in self.static_argnums}
        leaves, tree = tree_util.tree_flatten((args, kwargs))
        # leaf index ranges of the static positional args
        is_static = []
        for i, a in enumerate(args):
            n = tree_util.tree_structure(a).num_leaves
            is_static += [i in static] * n
        is_static += [False] * (len(leaves) - len(is_static))
        pred = getattr(self, "_dyn_pred", _is_array_leaf)
        dyn = [not s and pred(x) for s, x in zip(is_static, leaves)]
        return leaves, tree, dyn

    def _prepare(self, args, kwargs, extras_spec, inside=False):
        if not inside and (any(isinstance(x, Tracer)
                               for x in tree_util.tree_leaves((args, kwargs))) or _stack()):
            raise NotImplementedError(
                f"kiln: {'/'.join(l.kind for l in self.layers)} of '{self.name}' called inside "
                "a traced function: the server transforms whole programs; apply the transform "
                "to the outermost function (e.g. jit(value_and_grad(loss))) instead")
        leaves, tree, dyn = self._split(args, kwargs)
        user = [x for x, d in zip(leaves, dyn) if d]
        outer_avals = [aval_of(x) for x in user]
        # per layer, outer to inner: the avals of the user leaves it sees
        level_avals = [None] * len(self.layers)
        cur = outer_avals
        vmap_axes = {}
        for li in range(len(self.layers) - 1, -1, -1):
            level_avals[li] = cur
            L = self.layers[li]
            if L.kind == "vmap":
                axes, size = self._vmap_axes(L, args, kwargs, leaves, dyn, cur)
                vmap_axes[li] = (axes, size)
                cur = [(s[:a] + s[a + 1:], d) if a is not None else (s, d)
                       for (s, d), a in zip(cur, axes)]
        statics = tuple(_hashable(x) for x, d in zip(leaves, dyn) if not d)
        key = (tree, tuple(cur), statics)
        tr = self._traces.get(key)
        if tr is None:
            it = iter(cur)
            avals = [next(it) if d else None for d in dyn]
            tr = trace_function(self.fn, args, kwargs, dyn, avals, f"jit_{_ident(self.name)}")
            self._traces[key] = tr
        return tr, user, level_avals, vmap_axes

    def _vmap_axes(self, L, args, kwargs, leaves, dyn, cur):
        in_axes = L.in_axes
        if isinstance(in_axes, list):
            in_axes = tuple(in_axes)
        if not isinstance(in_axes, tuple) or len(args) == 1 and not isinstance(L.in_axes, tuple):
            per_arg = [in_axes] * len(args)
        else:
            if len(in_axes) != len(args):
                raise ValueError(f"kiln.vmap: in_axes has {len(in_axes)} entries for "
                                 f"{len(args)} positional arguments")
            per_arg = list(in_axes)
        axes_all = []
        for a, ax in zip(args, per_arg):
            n = tree_util.tree_structure(a).num_leaves
            axes_all += tree_util.broadcast_prefix(ax, a) if ax is not None else [None] * n
        axes_all += [0] * (len(leaves) - len(axes_all))  # kwargs: batched along 0, as JAX
        axes = []
        size = L.axis_size
        for (s, d), ax in zip(cur, [a for a, dd in zip(axes_all, dyn) if dd]):
            if ax is None:
                axes.append(None)
                continue
            if not -len(s) <= ax < len(s) or not s:
                raise ValueError(f"kiln.vmap: in_axes {ax} is out of range for an argument of "
                                 f"shape {s}")
            ax %= len(s)
            if size is not None and s[ax] != size:
                raise ValueError(f"kiln.vmap: mapped axes have different sizes: {size} and "
                                 f"{s[ax]} (shape {s}, axis {ax})")
            size = s[ax]
            axes.append(ax)
        if size is None:
            raise ValueError("kiln.vmap: no argument is mapped; give axis_size")
        return axes, size

    def _run(self, args, kwargs, extra_values):
        """Runs the program; extra_values: the values of the parameters the
        layers add, outermost layer's last (as in _plan)."""
        if _stack() and not self.layers:
            return self.fn(*args, **kwargs)  # jit inside a trace: inline
        if _stack():
            return self._run_inside(args, kwargs, extra_values)
        tr, user, level_avals, vmap_axes = self._prepare(args, kwargs, extra_values)
        transforms, nparams, out_avals, regroup, seeds = self._plan(tr, args, len(user),
                                                                    level_avals, vmap_axes)
        conn = connection()
        if tr.hidden_arrays is None:
            tr.hidden_arrays = [h if isinstance(h, Array) else conn.put(np.asarray(h))
                                for h in tr.hidden]
        values = list(user) + list(tr.hidden_arrays) + seeds + list(extra_values)
        if len(values) != nparams:
            raise AssertionError(f"kiln: {len(values)} arguments for {nparams} parameters")
        exe = conn.compile(tr.text, transforms)
        donate = self._donated_leaves(args)
        inline = [int(np.prod(s, dtype=np.int64)) <= INLINE_MAX_ELEMENTS for s, _ in out_avals]
        outs = conn.execute(exe.executable_id, values, donate=donate, nout=len(out_avals),
                            inline=inline)
        return regroup(outs)

    def _run_inside(self, args, kwargs, extra_values):
        """A transformed function called inside a trace: its own trace, the
        server's transformed text of it, inlined here."""
        comp = _core.current_computation()
        tr, user, level_avals, vmap_axes = self._prepare(args, kwargs, extra_values, inside=True)
        transforms, nparams, out_avals, regroup, seeds = self._plan(tr, args, len(user),
                                                                    level_avals, vmap_axes)
        values = list(user) + list(tr.hidden) + seeds + list(extra_values)
        if len(values) != nparams:
            raise AssertionError(f"kiln: {len(values)} arguments for {nparams} parameters")
        text = connection().transformed_text(tr.text, transforms)
        return regroup(_inline_module(comp, text, values, out_avals))

    def _donated_leaves(self, args):
        if not self.donate_argnums:
            return ()
        counts = [tree_util.tree_structure(a).num_leaves for a in args]
        starts = np.cumsum([0] + counts).tolist()
        out = set()
        for n in self.donate_argnums:
            out.update(range(starts[n], starts[n] + counts[n]))
        return out

    def _plan(self, tr, args, nuser, level_avals, vmap_axes):
        """The transforms list, the parameter count, the output avals and the
        regrouping of the flat outputs into the result pytree."""
        out_avals = list(tr.out_avals)
        nparams = nuser + len(tr.hidden)
        seeds = []
        regroup = tr.out_tree.unflatten
        transforms = []
        T = kiln_pb2.Transform
        for li, L in enumerate(self.layers):
            users = level_avals[li]
            if L.kind == "grad":
                wrt, rebuild = _argnum_leaves(args, L.argnums)
                for w in wrt:
                    if not _dtypes.is_float(users[w][1]):
                        raise TypeError(f"kiln.grad: argument leaf {w} has dtype {users[w][1]}; "
                                        "grad requires floating-point inputs")
                grads_avals = [users[w] for w in wrt]
                if not L.has_aux:
                    if len(out_avals) != 1 or out_avals[0][0] != ():
                        raise TypeError("kiln.grad: the function must return a scalar; it "
                                        f"returns {len(out_avals)} array(s) of shapes "
                                        f"{[a[0] for a in out_avals]}")
                    if not _dtypes.is_float(out_avals[0][1]):
                        raise TypeError("kiln.grad: the function's result must be floating point")
                    transforms.append(T(grad=kiln_pb2.GradTransform(wrt=wrt,
                                                                     with_value=L.with_value)))
                    if L.with_value:
                        regroup = _grad_regroup(rebuild, True, len(wrt))
                        out_avals = out_avals[:1] + grads_avals
                    else:
                        regroup = _grad_regroup(rebuild, False, len(wrt))
                        out_avals = grads_avals
                else:
                    if not out_avals or out_avals[0][0] != ():
                        raise TypeError("kiln.grad(has_aux=True): the function must return "
                                        "(scalar, aux)")
                    transforms.append(T(vjp=kiln_pb2.VjpTransform(wrt=wrt, output=0,
                                                                   has_output=True)))
                    seeds.append(np.ones((), out_avals[0][1]))
                    nparams += 1
                    nout = len(out_avals)
                    prev = regroup
                    regroup = _aux_regroup(prev, rebuild, nout, L.with_value)
                    out_avals = out_avals + grads_avals
            elif L.kind == "vmap":
                axes, size = vmap_axes[li]
                pin = [kiln_pb2.VmapAxis(not_mapped=True) if a is None else
                       kiln_pb2.VmapAxis(axis=a) for a in axes]
                pin += [kiln_pb2.VmapAxis(not_mapped=True)] * (nparams - len(pin))
                outs = _out_axes(L.out_axes, regroup, len(out_avals))
                pout = [kiln_pb2.VmapAxis(not_mapped=True) if a is None else
                        kiln_pb2.VmapAxis(axis=a) for a in outs]
                transforms.append(T(vmap=kiln_pb2.VmapTransform(in_axes=pin, out_axes=pout,
                                                                 axis_size=size)))
                new = []
                for (s, d), a in zip(out_avals, outs):
                    if a is None:
                        new.append((s, d))
                    else:
                        a = a % (len(s) + 1)
                        new.append((s[:a] + (size,) + s[a:], d))
                out_avals = new
            elif L.kind == "checkpoint":
                transforms.append(T(checkpoint=kiln_pb2.CheckpointTransform(policy=L.policy)))
            elif L.kind == "jvp":
                wrt = list(range(nuser))
                transforms.append(T(jvp=kiln_pb2.JvpTransform(wrt=wrt)))
                nparams += nuser
                prev, n = regroup, len(out_avals)
                regroup = lambda outs, prev=prev, n=n: (prev(outs[:n]), prev(outs[n:]))  # noqa
                out_avals = out_avals + out_avals
            elif L.kind == "vjp":
                wrt = list(range(nuser))
                transforms.append(T(vjp=kiln_pb2.VjpTransform(wrt=wrt)))
                nparams += len(out_avals)
                prev, n = regroup, len(out_avals)
                _, rebuild = _argnum_leaves(args, tuple(range(len(args))))
                regroup = lambda outs, prev=prev, n=n, rb=rebuild: (prev(outs[:n]),  # noqa
                                                                     rb(outs[n:]))
                out_avals = out_avals + list(users)
        return transforms, nparams, out_avals, regroup, seeds


class Lowered(str):
    """jax.stages.Lowered: what Staged.lower traced, for its text and to
    compile it ahead of the first call. It is the module's HLO text itself
    (a str), so code that used lower() as text keeps working."""

    def __new__(cls, staged, args, kwargs, text):
        obj = super().__new__(cls, text)
        obj._staged, obj._args, obj._kwargs = staged, args, kwargs
        return obj

    def as_text(self, dialect=None):
        if dialect not in (None, "hlo"):
            raise NotImplementedError(f"kiln: Lowered.as_text(dialect={dialect!r}): only HLO")
        return str(self)

    def compile(self, progress=None):
        """Compiles on kilnd (the transforms of the staged function's layers
        applied there) and returns a Compiled. progress: a callable given a
        kiln.CompileProgress for each phase the server reports (through the
        CompileStream RPC), the last with phase "done"; an exception it
        raises abandons the compile."""
        st = self._staged
        tr, user, level_avals, vmap_axes = st._prepare(self._args, self._kwargs, ())
        transforms = st._plan(tr, self._args, len(user), level_avals, vmap_axes)[0]
        resp = connection().compile(tr.text, transforms, progress=progress)
        return Compiled(self, resp)


class Compiled:
    """jax.stages.Compiled: a compiled executable of a Lowered, callable
    with the dynamic arguments (static ones may be left out, as in JAX, or
    given again); a call reuses this executable (no Compile round trip)."""

    def __init__(self, lowered, response):
        self._lowered, self.response = lowered, response
        self.executable_id = response.executable_id
        self.cache_key = response.cache_key
        # "compiled", "memory", "disk", "shared", ...
        self.cache_source = kiln_pb2.CacheSource.Name(response.cache_source)[
            len("CACHE_SOURCE_"):].lower()
        self.compile_time = response.compile_wall_ns / 1e9
        self.peak_bytes = response.peak_bytes

    def as_text(self):
        return self._lowered.as_text()

    def __call__(self, *args, **kwargs):
        st, largs = self._lowered._staged, self._lowered._args
        static = sorted({i % max(len(largs), 1) for i in st.static_argnums})
        if len(args) + len(static) == len(largs) and static:
            full, it = [], iter(args)
            for i in range(len(largs)):
                full.append(largs[i] if i in static else next(it))
            args = tuple(full)
        return st(*args, **kwargs)

    def __repr__(self):
        return f"<kiln.Compiled {self.executable_id} ({self.cache_source})>"


class _RawComputation:
    """Computations of another module's text, renamed, rendered as given."""

    def __init__(self, text):
        self.text, self.finished = text, True

    def render(self):
        return self.text


_COMP_HEAD = re.compile(r"^(ENTRY\s+)?%?([A-Za-z_][\w.\-]*)\s*(\([^\n]*?\))?\s*(->[^\n{]*)?"
                        r"\{\s*$", re.M)


def _inline_module(comp, text, values, out_avals):
    """Appends text's computations (renamed apart) to comp's graph and a call
    of its ENTRY on values to comp; the call's outputs as tracers."""
    g = comp.graph
    body = text.split("\n", 1)[1] if text.startswith("HloModule") else text
    heads = list(_COMP_HEAD.finditer(body))
    names = {m.group(2) for m in heads}
    entry = [m.group(2) for m in heads if m.group(1)]
    if len(entry) != 1:
        raise AssertionError("kiln: the transformed module has no single ENTRY computation")
    prefix = f"inl{next(g.counter)}_"

    def rename(m):
        return "%" + prefix + m.group(1) if m.group(1) in names else m.group(0)

    # every reference to a computation is %name in the server's text; the
    # headers are renamed too (instruction names are local to a computation)
    body = re.sub(r"(?m)^ENTRY\s+", "", body)
    body = re.sub(r"(?m)^%?([A-Za-z_][\w.\-]*)(?=\s*[({])",
                  lambda m: "%" + prefix + m.group(1) if m.group(1) in names else m.group(0),
                  body)
    body = re.sub(r"%([A-Za-z_][\w.\-]*)(?![\w.\-])", rename, body)
    # custom rules name their computations in frontend attributes (custom.c)
    body = re.sub(r'(_kiln_custom_(?:jvp|vjp_fwd|vjp_bwd)=")%?([A-Za-z_][\w.\-]*)"',
                  lambda m: f'{m.group(1)}{prefix}{m.group(2)}"' if m.group(2) in names
                  else m.group(0), body)
    g.comps.append(_RawComputation(body.strip("\n") + "\n"))
    ops = [to_tracer(v, comp) for v in values]
    head = [m for m in heads if m.group(1)][0]
    tuple_out = (head.group(4) or "->(").replace(" ", "").startswith("->(")
    if tuple_out:
        r = comp.add(list(out_avals), "call", [o.instr for o in ops],
                     f", to_apply=%{prefix}{entry[0]}")
        return [Tracer(comp.add(av, "get-tuple-element", [r], f", index={i}"))
                for i, av in enumerate(out_avals)]
    return [Tracer(comp.add(out_avals[0], "call", [o.instr for o in ops],
                            f", to_apply=%{prefix}{entry[0]}"))]


def _grad_regroup(rebuild, with_value, n):
    if with_value:
        return lambda outs: (outs[0], rebuild(outs[1:]))
    return lambda outs: rebuild(outs)


def _aux_regroup(prev, rebuild, nout, with_value):
    def f(outs):
        value_aux = prev(outs[:nout])
        if not isinstance(value_aux, (tuple, list)) or len(value_aux) != 2:
            raise TypeError("kiln.grad(has_aux=True): the function must return a pair "
                            "(scalar, aux)")
        g = rebuild(outs[nout:])
        if with_value:
            return (value_aux[0], value_aux[1]), g
        return g, value_aux[1]

    return f


def _out_axes(out_axes, regroup, n):
    """One out axis per output leaf from a prefix of the result tree."""
    if out_axes is None or isinstance(out_axes, int):
        return [out_axes] * n
    # a prefix: build the result tree of placeholders to broadcast over
    marks = regroup(list(range(n)))
    return [int(a) if a is not None else None
            for a in tree_util.broadcast_prefix(out_axes, marks)]


def _hashable(x):
    try:
        hash(x)
        return x
    except TypeError:
        return ("<id>", id(x))


def _ident(name):
    s = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return s or "fn"


# ---- the public transforms -------------------------------------------------------

def _staged(fun):
    return fun if isinstance(fun, Staged) else Staged(fun)


def jit(fun=None, *, static_argnums=(), donate_argnums=(), static_argnames=None, **kw):
    """Stages fun out to kilnd: traced once per signature, compiled, run on
    server-resident arrays."""
    if fun is None:
        return lambda f: jit(f, static_argnums=static_argnums, donate_argnums=donate_argnums)
    if static_argnames:
        raise NotImplementedError("kiln.jit: static_argnames (use static_argnums)")
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if isinstance(donate_argnums, int):
        donate_argnums = (donate_argnums,)
    s = _staged(fun)
    return Staged(s.fn, s.layers, static_argnums or s.static_argnums,
                  donate_argnums or s.donate_argnums, s.name)


def grad(fun, argnums=0, has_aux=False, holomorphic=False, allow_int=False):
    if holomorphic or allow_int:
        raise NotImplementedError("kiln.grad: holomorphic and allow_int")
    return _staged(fun).with_layer(GradLayer(argnums, has_aux, False))


def value_and_grad(fun, argnums=0, has_aux=False, holomorphic=False, allow_int=False):
    if holomorphic or allow_int:
        raise NotImplementedError("kiln.value_and_grad: holomorphic and allow_int")
    return _staged(fun).with_layer(GradLayer(argnums, has_aux, True))


def vmap(fun, in_axes=0, out_axes=0, axis_name=None, axis_size=None, spmd_axis_name=None):
    if axis_name is not None or spmd_axis_name is not None:
        raise NotImplementedError("kiln.vmap: axis_name (collectives inside vmap)")
    return _staged(fun).with_layer(VmapLayer(in_axes, out_axes, axis_size))


def checkpoint(fun=None, *, prevent_cse=True, policy=None, static_argnums=()):
    if fun is None:
        return lambda f: checkpoint(f, policy=policy)
    name = getattr(policy, "_kiln_name", policy) or ""
    return _staged(fun).with_layer(CheckpointLayer(name))


remat = checkpoint


class _Policies:
    def __getattr__(self, name):
        if name in ("nothing_saveable", "dots_saveable", "everything_saveable",
                    "dots_with_no_batch_dims_saveable"):
            def pol(*a, **k):
                return False
            pol._kiln_name = name
            return pol
        raise NotImplementedError(f"kiln.checkpoint_policies.{name}")


checkpoint_policies = _Policies()


def jvp(fun, primals, tangents, has_aux=False):
    if has_aux:
        raise NotImplementedError("kiln.jvp: has_aux")
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise ValueError(f"kiln.jvp: {len(primals)} primals but {len(tangents)} tangents")
    pl, pt = tree_util.tree_flatten(primals)
    tl, tt = tree_util.tree_flatten(tangents)
    if pt != tt:
        raise ValueError("kiln.jvp: primals and tangents have different tree structures")
    for p, t in zip(pl, tl):
        if aval_of(p)[0] != aval_of(t)[0]:
            raise ValueError(f"kiln.jvp: a tangent of shape {aval_of(t)[0]} for a primal of "
                             f"shape {aval_of(p)[0]}")
    s = _staged(fun).with_layer(JvpLayer())
    tl = [np.asarray(t, dtype=aval_of(p)[1]) if not isinstance(t, (Array, Tracer)) else t
          for p, t in zip(pl, tl)]
    return s._run(primals, {}, tl)


def vjp(fun, *primals, has_aux=False):
    if has_aux:
        raise NotImplementedError("kiln.vjp: has_aux")
    base = _staged(fun)
    out = base(*primals)
    s = base.with_layer(VjpLayer())

    def vjp_fn(ct):
        cl, ct_tree = tree_util.tree_flatten(ct)
        ol, o_tree = tree_util.tree_flatten(out)
        if ct_tree != o_tree:
            raise ValueError("kiln.vjp: the cotangent's tree structure differs from the output's")
        for c, o in zip(cl, ol):
            if aval_of(c)[0] != tuple(o.shape):
                raise ValueError(f"kiln.vjp: a cotangent of shape {aval_of(c)[0]} for an output "
                                 f"of shape {tuple(o.shape)}")
        cl = [c if isinstance(c, (Array, Tracer)) else np.asarray(c, dtype=o.dtype)
              for c, o in zip(cl, ol)]
        _, grads = s._run(primals, {}, cl)
        return grads

    return out, vjp_fn


def _unsupported(name):
    def f(*a, **k):
        raise NotImplementedError(f"kiln.{name} is not supported by the kiln client yet")

    f.__name__ = name
    return f


def _jac_argnums(argnums, nargs, name):
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for n in nums:
        if not isinstance(n, int) or not -nargs <= n < nargs:
            raise ValueError(f"kiln.{name}: argnums {argnums} is out of range for {nargs} "
                             "arguments")
    return [n % nargs for n in nums]


def _jac_check(name, args, nums, has_aux, holomorphic):
    if has_aux or holomorphic:
        raise NotImplementedError(f"kiln.{name}: has_aux / holomorphic")
    for n in nums:
        for x in tree_util.tree_leaves(args[n]):
            if not _dtypes.is_float(aval_of(x)[1]):
                raise TypeError(f"kiln.{name}: argument {n} has a leaf of dtype "
                                f"{aval_of(x)[1]}; floating point is required")


def _size(shape):
    return int(np.prod(shape, dtype=np.int64))


def _basis(avals):
    """The standard basis over the concatenated leaves of avals: per leaf an
    array (N, *shape), N the total size, with an identity block where that
    leaf's elements are; and the leaves' start rows."""
    total = sum(_size(s) for s, _ in avals)
    out, starts, at = [], [], 0
    for s, d in avals:
        n = _size(s)
        b = np.zeros((total, n), d)
        b[at:at + n] = np.eye(n, dtype=d)
        out.append(b.reshape((total,) + tuple(s)))
        starts.append(at)
        at += n
    return out, starts


def _out_avals(fun, args):
    """The output tree and leaf avals of fun(*args), traced (not run)."""
    leaves, _ = tree_util.tree_flatten((args, {}))
    dyn = [_is_array_leaf(x) for x in leaves]
    avals = [aval_of(x) if d else None for x, d in zip(leaves, dyn)]
    tr = trace_function(fun, args, {}, dyn, avals, "shape_of")
    return tr.out_tree, tr.out_avals


def _jac_block(knp, rows, start, in_shape, out_shape, rows_first):
    """The (out_shape + in_shape) block of a Jacobian from the vmapped
    results: rows is (N, *shape) over the basis of the side that was
    mapped (inputs for jacfwd, outputs for jacrev)."""
    if rows_first:  # jacrev: rows index outputs, rows' trailing dims the input
        n = _size(out_shape)
        blk = rows[start:start + n]
        return knp.reshape(blk, tuple(out_shape) + tuple(in_shape))
    n = _size(in_shape)  # jacfwd: rows index inputs, trailing dims the output
    blk = knp.reshape(rows[start:start + n], (n,) + tuple(out_shape))
    blk = knp.moveaxis(blk, 0, -1)
    return knp.reshape(blk, tuple(out_shape) + tuple(in_shape))


def jacfwd(fun, argnums=0, has_aux=False, holomorphic=False):
    """The Jacobian by forward mode, as JAX's: vmap of jvp over the standard
    basis of the differentiated arguments, one program on the server (also
    inside jit)."""
    from . import numpy as knp

    def jac(*args):
        nums = _jac_argnums(argnums, len(args), "jacfwd")
        _jac_check("jacfwd", args, nums, has_aux, holomorphic)
        keys, avals = [], []
        for n in nums:
            for k, x in enumerate(tree_util.tree_leaves(args[n])):
                keys.append((n, k))
                avals.append(aval_of(x))
        basis, starts = _basis(avals)

        def pushfwd(args_, basis_):
            given = dict(zip(keys, basis_))
            tangents = []
            for i, a in enumerate(args_):
                xl, xt = tree_util.tree_flatten(a)
                tangents.append(xt.unflatten([
                    given[i, k] if (i, k) in given else np.zeros(*aval_of(x))
                    for k, x in enumerate(xl)]))
            return jvp(fun, tuple(args_), tuple(tangents))[1]

        out_tree, out_avals = _out_avals(fun, args)
        if not keys:
            raise ValueError("kiln.jacfwd: the differentiated arguments have no array leaves")
        rows = vmap(pushfwd, in_axes=(None, 0))(tuple(args), basis)
        row_leaves = tree_util.tree_leaves(rows)
        per_out = []
        for o, (oshape, _) in enumerate(out_avals):
            trees = []
            for n in nums:
                xl, xt = tree_util.tree_flatten(args[n])
                trees.append(xt.unflatten([
                    _jac_block(knp, row_leaves[o], starts[keys.index((n, k))], aval_of(x)[0],
                               oshape, False) for k, x in enumerate(xl)]))
            per_out.append(trees[0] if isinstance(argnums, int) else tuple(trees))
        return out_tree.unflatten(per_out)

    return jac


def jacrev(fun, argnums=0, has_aux=False, holomorphic=False, allow_int=False):
    """The Jacobian by reverse mode, as JAX's: vmap of vjp over the standard
    basis of the outputs, one program on the server (also inside jit)."""
    from . import numpy as knp

    def jac(*args):
        nums = _jac_argnums(argnums, len(args), "jacrev")
        _jac_check("jacrev", args, nums, has_aux, holomorphic)
        out_tree, out_avals = _out_avals(fun, args)
        for o, (_, dt) in enumerate(out_avals):
            if not _dtypes.is_float(dt):
                raise TypeError(f"kiln.jacrev: output leaf {o} has dtype {dt}; floating point "
                                "is required")
        basis, starts = _basis(out_avals)

        def pullback(args_, ct_):
            _, vjp_fn = vjp(fun, *args_)
            return vjp_fn(out_tree.unflatten(list(ct_)))

        grads = vmap(pullback, in_axes=(None, 0))(tuple(args), basis)
        per_out = []
        for o, (oshape, _) in enumerate(out_avals):
            trees = []
            for n in nums:
                xl, xt = tree_util.tree_flatten(args[n])
                gl = tree_util.tree_leaves(grads[n])
                trees.append(xt.unflatten([
                    _jac_block(knp, gl[k], starts[o], aval_of(x)[0], oshape, True)
                    for k, x in enumerate(xl)]))
            per_out.append(trees[0] if isinstance(argnums, int) else tuple(trees))
        return out_tree.unflatten(per_out)

    return jac


pmap = _unsupported("pmap")


def hessian(fun, argnums=0, has_aux=False, holomorphic=False):
    """The Hessian of a scalar function, as JAX's: jacfwd of the gradient
    (forward over reverse), one program on the server (also inside jit and
    of a jitted function); argnums and the arguments may be pytrees."""
    if has_aux or holomorphic:
        raise NotImplementedError("kiln.hessian: has_aux / holomorphic")
    return jacfwd(grad(fun, argnums=argnums), argnums=argnums)


from ._custom import custom_jvp, custom_vjp  # noqa: E402,F401  (re-exported)
