"""custom_jvp / custom_vjp: user-defined derivative rules that kilnd's
transforms apply (compiler/transforms/custom.c).

Called inside a trace, a custom function becomes an HLO call of its primal
whose frontend attributes name the rule's computations, traced into the same
module:

  call(args..., closed...), to_apply=P, frontend_attributes={
      _kiln_custom_jvp="J" | _kiln_custom_vjp_fwd="F", _kiln_custom_vjp_bwd="B",
      _kiln_custom_nargs="n"}

  P(args, closed)             -> (out...)
  J(args, closed, tangents)   -> ((out...), (tangent_out...))
  F(args, closed)             -> ((out...), (residuals...))
  B(args, closed, (residuals...), (ct...)) -> (ct_args...)

args are the leaves of the differentiated arguments (n of them); closed
are the values any of the traced functions closed over (tracers of the
enclosing trace, lifted constants), passed to every computation in the same
order, which the rule does not differentiate (the server refuses to
differentiate with respect to them, as JAX does). The server's grad / vjp /
jvp use the rule instead of the primal's body; without a transform the call
runs P. Called outside a trace the function runs as written, as in JAX.
"""
import functools

import numpy as np

from . import _dtypes, tree_util
from ._core import Computation, Tracer, _stack, current_computation, to_tracer


class _RuleComputation(Computation):
    """A computation with flat parameters: the n argument leaves, then one
    parameter per closed-over value (shared by the rule's computations, in
    the order `closed` lists them), then its own extra parameters (numbered
    once every capture is known)."""

    def __init__(self, graph, name, parent, nargs, closed):
        super().__init__(graph, name, parent)
        self.nargs, self.closed = nargs, closed
        self.extra = []
        self._caps = {}

    def param(self, shape, dtype, number):
        ins = self.add((tuple(shape), np.dtype(dtype)), "parameter", [])
        ins.operands = None
        ins.op = number if callable(number) else f"parameter({number})"
        return Tracer(ins)

    def extra_param(self, shape, dtype):
        k = len(self.extra)
        t = self.param(shape, dtype,
                       lambda k=k: f"parameter({self.nargs + len(self.closed) + k})")
        self.extra.append(t)
        return t

    def capture(self, t):
        key = id(t.instr)
        if key in self._caps:
            return self._caps[key]
        outer = t if t.instr.comp is self.parent else self.parent.capture(t)
        for k, o in enumerate(self.closed):
            if o.instr is outer.instr:
                break
        else:
            k = len(self.closed)
            self.closed.append(outer)
        local = self.param(t.shape, t.dtype, self.nargs + k)
        self._caps[key] = local
        self._by_index[k] = local
        return local

    def finish_params(self):
        """Parameters for the closed-over values this one did not use (every
        rule computation takes them all)."""
        for k, o in enumerate(self.closed):
            if k not in self._by_index:
                self._by_index[k] = self.param(o.shape, o.dtype, self.nargs + k)
                self.instrs.insert(0, self.instrs.pop())
        self.finished = True

    _by_index = None


def _new_comp(parent, base, nargs, closed):
    g = parent.graph
    c = _RuleComputation(g, f"{base}_{len(g.comps)}", parent, nargs, closed)
    c._by_index = {}
    g.comps.append(c)
    return c


def _trace_into(c, fn, avals):
    """Traces fn over argument tracers of avals (parameters 0..n-1) into c;
    returns the output leaves as tracers and the output tree."""
    args = [c.param(s, d, k) for k, (s, d) in enumerate(avals)]
    _stack().append(c)
    try:
        out = fn(args)
        leaves, tree = tree_util.tree_flatten(out)
        outs = [to_tracer(o, c) for o in leaves]
    finally:
        _stack().pop()
    return outs, tree


def _avals(ts):
    return [(tuple(t.shape), np.dtype(t.dtype)) for t in ts]


def _set_root(c, parts):
    """parts: a list of tracers (an array tuple) or of lists of them (a
    tuple of tuples)."""
    instrs, shapes = [], []
    for p in parts:
        if isinstance(p, list):
            t = c.add(_avals(p), "tuple", [x.instr for x in p])
            instrs.append(t)
            shapes.append(_avals(p))
        else:
            instrs.append(p.instr)
            shapes.append((tuple(p.shape), np.dtype(p.dtype)))
    r = c.add(shapes, "tuple", instrs)
    r.root = True


def _tuple_elems(c, tup, avals):
    return [Tracer(c.add(av, "get-tuple-element", [tup.instr], f", index={i}"))
            for i, av in enumerate(avals)]


def _match(what, name, got, want):
    if [(tuple(s), np.dtype(d)) for s, d in got] != [(tuple(s), np.dtype(d)) for s, d in want]:
        raise TypeError(f"kiln.{what} '{name}': the rule returns arrays of shapes and dtypes "
                        f"{got}, expected {want} (those of the function's output)")


def _as(comp, x, aval, what, name):
    """x (a rule's output leaf, None for zero) as a tracer of aval."""
    s, d = aval
    if x is None:
        from . import lax

        return lax.broadcast_in_dim(to_tracer(np.zeros((), d), comp), s, ())
    t = to_tracer(x, comp)
    if tuple(t.shape) != tuple(s):
        raise TypeError(f"kiln.{what} '{name}': the rule returns a cotangent or tangent of shape "
                        f"{tuple(t.shape)} for a value of shape {tuple(s)}")
    if np.dtype(t.dtype) != np.dtype(d):
        from ._core import convert

        t = convert(t, d)
    return t


class _CustomDerivative:
    kind = None

    def __init__(self, fun, nondiff_argnums=()):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.nondiff_argnums = tuple(nondiff_argnums)
        self.name = getattr(fun, "__name__", "f")

    def __get__(self, obj, objtype=None):
        return self if obj is None else functools.partial(self, obj)

    def _split(self, args, kwargs):
        if kwargs:
            raise NotImplementedError(f"kiln.{self.kind} '{self.name}': keyword arguments "
                                      "(pass them positionally)")
        nd = {i % len(args) for i in self.nondiff_argnums} if args else set()
        for i in nd:
            if any(isinstance(x, Tracer) for x in tree_util.tree_leaves(args[i])):
                raise NotImplementedError(
                    f"kiln.{self.kind} '{self.name}': nondiff_argnums argument {i} is a traced "
                    "array; nondiff arguments must be static Python values")
        static = [args[i] for i in sorted(nd)]
        diff_pos = [i for i in range(len(args)) if i not in nd]
        return static, diff_pos, nd

    def _rebuild(self, args, nd, diff_pos):
        """fn(diff_args tuple) -> the full argument list."""
        def full(diff):
            out, it = [], iter(diff)
            for i in range(len(args)):
                out.append(args[i] if i in nd else next(it))
            return out
        return full

    _in_rule = 0

    def __call__(self, *args, **kwargs):
        if not _stack() or self._in_rule:
            # eager, as in JAX; or inside its own rule (log1pexp's JVP rule
            # calls log1pexp): the primal, inline, so that a rule never
            # refers to itself
            return self.fun(*args, **kwargs)
        comp = current_computation()
        static, diff_pos, nd = self._split(args, kwargs)
        full = self._rebuild(args, nd, diff_pos)
        diff = tuple(args[i] for i in diff_pos)
        leaves, in_tree = tree_util.tree_flatten(diff)
        ins = [to_tracer(x, comp) for x in leaves]
        avals = _avals(ins)
        n = len(ins)
        closed = []

        # the primal
        P = _new_comp(comp, f"{self.kind}_{_ident(self.name)}", n, closed)
        pouts, out_tree = _trace_into(P, lambda a: self.fun(*full(in_tree.unflatten(a))), avals)
        out_avals = _avals(pouts)
        self._in_rule += 1
        try:
            rules = self._trace_rules(comp, static, full, in_tree, avals, out_tree, out_avals,
                                      closed)
        finally:
            self._in_rule -= 1
        _set_root(P, pouts)
        for c in [P] + list(rules.values()):
            c.finish_params()
        if self.kind == "custom_jvp":
            fa = f'_kiln_custom_jvp="{rules["jvp"].name}"'
        else:
            fa = (f'_kiln_custom_vjp_fwd="{rules["fwd"].name}",'
                  f'_kiln_custom_vjp_bwd="{rules["bwd"].name}"')
        fa += f',_kiln_custom_nargs="{n}"'
        operands = [t.instr for t in ins] + [o.instr for o in closed]
        call = Tracer(comp.add(list(out_avals), "call", operands,
                               f", to_apply={P.name}, frontend_attributes={{{fa}}}"))
        outs = [Tracer(comp.add(av, "get-tuple-element", [call.instr], f", index={i}"))
                for i, av in enumerate(out_avals)]
        return out_tree.unflatten(outs)


def _ident(name):
    s = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return s or "f"


class custom_jvp(_CustomDerivative):  # noqa: N801  (JAX's name)
    """jax.custom_jvp: defjvp(rule) with rule(primals, tangents) ->
    (primal_out, tangent_out) (nondiff arguments first when given), or
    defjvps(*per-argument rules)."""

    kind = "custom_jvp"

    def __init__(self, fun, nondiff_argnums=()):
        super().__init__(fun, nondiff_argnums)
        self.jvp_rule = None

    def defjvp(self, jvp, symbolic_zeros=False):
        if symbolic_zeros:
            raise NotImplementedError("kiln.custom_jvp.defjvp: symbolic_zeros")
        self.jvp_rule = jvp
        return jvp

    def defjvps(self, *rules):
        def jvp(primals, tangents):
            ans = self.fun(*primals)
            out = None
            for rule, t in zip(rules, tangents):
                if rule is None:
                    continue
                d = rule(t, ans, *primals)
                out = d if out is None else tree_util.tree_map(lambda a, b: a + b, out, d)
            if out is None:
                out = tree_util.tree_map(lambda a: a * 0, ans)
            return ans, out

        self.jvp_rule = jvp

    def _trace_rules(self, comp, static, full, in_tree, avals, out_tree, out_avals, closed):
        if self.jvp_rule is None:
            raise TypeError(f"kiln.custom_jvp '{self.name}': no JVP rule (call defjvp first)")
        n = len(avals)
        J = _new_comp(comp, f"jvp_{_ident(self.name)}", n, closed)

        def body(a):
            ts = [J.extra_param(s, d) for s, d in avals]
            primals = tuple(in_tree.unflatten(a))
            tangents = tuple(in_tree.unflatten(ts))
            res = self.jvp_rule(*static, primals, tangents)
            if not isinstance(res, (tuple, list)) or len(res) != 2:
                raise TypeError(f"kiln.custom_jvp '{self.name}': the JVP rule must return a pair "
                                "(primal_out, tangent_out)")
            po, to = res
            pl, pt = tree_util.tree_flatten(po)
            tl, tt = tree_util.tree_flatten(to)
            if pt != out_tree:
                raise TypeError(f"kiln.custom_jvp '{self.name}': the JVP rule's primal output "
                                f"has structure {pt}, the function's {out_tree}")
            pl = [to_tracer(x, J) for x in pl]
            _match("custom_jvp", self.name, _avals(pl), out_avals)
            if len(tl) != len(out_avals):
                raise TypeError(f"kiln.custom_jvp '{self.name}': the JVP rule's tangent output "
                                f"has {len(tl)} leaves, the function's output {len(out_avals)}")
            tl = [_as(J, x, av, "custom_jvp", self.name) for x, av in zip(tl, out_avals)]
            return pl, tl

        args = [J.param(s, d, k) for k, (s, d) in enumerate(avals)]
        _stack().append(J)
        try:
            pl, tl = body(args)
        finally:
            _stack().pop()
        _set_root(J, [pl, tl])
        return {"jvp": J}


class custom_vjp(_CustomDerivative):  # noqa: N801  (JAX's name)
    """jax.custom_vjp: defvjp(fwd, bwd) with fwd(*args) -> (out, residuals)
    and bwd(*nondiff_args, residuals, ct) -> a tuple of one cotangent per
    (differentiated) argument, None for zero."""

    kind = "custom_vjp"

    def __init__(self, fun, nondiff_argnums=()):
        super().__init__(fun, nondiff_argnums)
        self.fwd = self.bwd = None

    def defvjp(self, fwd, bwd, symbolic_zeros=False):
        if symbolic_zeros:
            raise NotImplementedError("kiln.custom_vjp.defvjp: symbolic_zeros")
        self.fwd, self.bwd = fwd, bwd

    def _trace_rules(self, comp, static, full, in_tree, avals, out_tree, out_avals, closed):
        if self.fwd is None:
            raise TypeError(f"kiln.custom_vjp '{self.name}': no rule (call defvjp first)")
        n = len(avals)
        F = _new_comp(comp, f"fwd_{_ident(self.name)}", n, closed)
        res_tree = {}

        def fwd(a):
            r = self.fwd(*full(in_tree.unflatten(a)))
            if not isinstance(r, (tuple, list)) or len(r) != 2:
                raise TypeError(f"kiln.custom_vjp '{self.name}': fwd must return a pair "
                                "(output, residuals)")
            return r

        _stack().append(F)
        try:
            fo, res = fwd([F.param(s, d, k) for k, (s, d) in enumerate(avals)])
            fl, ft = tree_util.tree_flatten(fo)
            if ft != out_tree:
                raise TypeError(f"kiln.custom_vjp '{self.name}': fwd's output has structure "
                                f"{ft}, the function's {out_tree}")
            fl = [to_tracer(x, F) for x in fl]
            _match("custom_vjp", self.name, _avals(fl), out_avals)
            rl, rt = tree_util.tree_flatten(res)
            rl = [to_tracer(x, F) for x in rl]
            res_tree["t"] = rt
        finally:
            _stack().pop()
        res_avals = _avals(rl)
        _set_root(F, [fl, rl])

        Bc = _new_comp(comp, f"bwd_{_ident(self.name)}", n, closed)
        _stack().append(Bc)
        try:
            for k, (s, d) in enumerate(avals):
                Bc.param(s, d, k)
            rp = Bc.extra_param((), np.float32)
            rp.instr.shape = list(res_avals)
            cp = Bc.extra_param((), np.float32)
            cp.instr.shape = list(out_avals)
            res_v = res_tree["t"].unflatten(_tuple_elems(Bc, rp, res_avals))
            ct_v = out_tree.unflatten(_tuple_elems(Bc, cp, out_avals))
            cts = self.bwd(*static, res_v, ct_v)
            if not isinstance(cts, (tuple, list)):
                raise TypeError(f"kiln.custom_vjp '{self.name}': bwd must return a tuple of "
                                "cotangents, one per argument")
            cts = tuple(cts)
            diff_args = in_tree.unflatten(list(range(n)))
            if len(cts) != len(diff_args):
                raise TypeError(f"kiln.custom_vjp '{self.name}': bwd returned {len(cts)} "
                                f"cotangents for {len(diff_args)} arguments")
            flat = [None] * n
            for a, ct in zip(diff_args, cts):
                idx = tree_util.tree_leaves(a)
                cl = [None] * len(idx) if ct is None else tree_util.tree_leaves(ct)
                if len(cl) != len(idx):
                    raise TypeError(f"kiln.custom_vjp '{self.name}': a cotangent of bwd has "
                                    f"{len(cl)} leaves for an argument of {len(idx)}")
                for i, c in zip(idx, cl):
                    flat[i] = c
            outs = [_as(Bc, c, av, "custom_vjp", self.name) for c, av in zip(flat, avals)]
        finally:
            _stack().pop()
        _set_root(Bc, outs)
        return {"fwd": F, "bwd": Bc}


def _zero_tangent_rule(primals, tangents):
    (x,) = primals
    from . import numpy as knp

    return x, knp.zeros_like(x)


@custom_jvp
def _stop_gradient_one(x):
    return x


_stop_gradient_one.defjvp(_zero_tangent_rule)


def stop_gradient_leaf(t):
    """lax.stop_gradient of one float tracer: a custom_jvp identity whose
    tangent is zero."""
    if not _dtypes.is_float(t.dtype):
        return t
    return _stop_gradient_one(t)
