"""The tracer: Python functions become HLO text modules.

A trace is a Graph: the ENTRY computation and the computations it calls
(reducers, loop bodies, branches), each a list of instructions built from
tracers. A Tracer is a symbolic array of one computation; every lax-level
operation on tracers appends one instruction whose shape is inferred here, in
Python, so a wrong shape raises before anything is sent to the server.

Values a trace meets that are not its own tracers are brought in as follows:
Python and small numpy values become constants; large numpy arrays and
server-resident Arrays become hidden ENTRY parameters (appended after the
user's, passed by the caller at run time); tracers of an enclosing
computation are captured by a loop body or branch through its parameter
tuple (the construct passes them along).

Instructions are rendered to text only when the graph is finished, so that a
captured value's tuple index and a loop's carried tuple shape, which are
known only once every capture is, can still change while tracing.
"""
import inspect
import itertools
import os
import threading

import numpy as np

from . import _dtypes
from .errors import ConcretizationTypeError, TracerArrayConversionError, UnexpectedTracerError

# Arrays of more elements than this are lifted to parameters rather than
# written into the module text.
LIFT_ELEMENTS = 64

_state = threading.local()


def _stack():
    s = getattr(_state, "stack", None)
    if s is None:
        s = _state.stack = []
    return s


def current_computation():
    s = _stack()
    return s[-1] if s else None


def shape_str(shape, dtype):
    return f"{_dtypes.HLO_NAME[np.dtype(dtype)]}[{','.join(str(int(d)) for d in shape)}]"


def _user_line():
    """'file.py:12' of the innermost frame outside the kiln package."""
    here = os.path.dirname(os.path.abspath(__file__))
    for fr in inspect.stack()[2:]:
        if not os.path.abspath(fr.filename).startswith(here + os.sep):
            return f"{fr.filename}:{fr.lineno}"
    return "<unknown>"


class Instr:
    """One instruction. shape is a (dims, dtype) pair or, for tuples, a list
    of them (or a callable giving one, for tuples that grow while tracing)."""

    __slots__ = ("name", "shape", "op", "operands", "attrs", "comp", "root")

    def __init__(self, comp, name, shape, op, operands, attrs):
        self.comp, self.name, self.shape, self.op = comp, name, shape, op
        self.operands, self.attrs, self.root = operands, attrs, False

    def type_str(self):
        s = self.shape() if callable(self.shape) else self.shape
        return _type_str(s)

    def render(self):
        head = "ROOT " if self.root else ""
        if self.operands is None:  # parameter(n), constant(...): op carries its text
            op = self.op() if callable(self.op) else self.op
            return f"  {head}{self.name} = {self.type_str()} {op}"
        attrs = self.attrs() if callable(self.attrs) else self.attrs
        ops = ", ".join(o.name for o in self.operands)
        return f"  {head}{self.name} = {self.type_str()} {self.op}({ops}){attrs}"


def _type_str(s):
    if isinstance(s, list):
        return "(" + ", ".join(_type_str(e) for e in s) + ")"
    return shape_str(s[0], s[1])


class Computation:
    def __init__(self, graph, name, parent):
        self.graph, self.name, self.parent = graph, name, parent
        self.instrs = []
        self.root = None
        self.captures = []  # [(outer value's Tracer, local Tracer)]
        self._cap_index = {}
        self.capture_base = None  # set by the construct: first tuple index of captures
        self.param_tuple = None
        self.finished = False

    def add(self, shape, op, operands, attrs=""):
        if self.finished:
            raise UnexpectedTracerError("kiln: a traced value was used after its trace ended")
        ins = Instr(self, f"v{next(self.graph.counter)}", shape, op, list(operands), attrs)
        self.instrs.append(ins)
        return ins

    def capture(self, t):
        """A local tracer for t, a tracer of an enclosing computation."""
        key = id(t.instr)
        if key in self._cap_index:
            return self._cap_index[key]
        outer = t if t.instr.comp is self.parent else self.parent.capture(t)
        k = len(self.captures)
        ins = self.add((t.shape, t.dtype), "get-tuple-element", [self.param_tuple],
                       lambda k=k: f", index={self.capture_base + k}")
        local = Tracer(ins)
        self.captures.append((outer, local))
        self._cap_index[key] = local
        return local

    def render(self, entry=False):
        lines = [f"{'ENTRY ' if entry else ''}{self.name} {{"]
        lines += [i.render() for i in self.instrs]
        lines.append("}")
        return "\n".join(lines)


class Graph:
    """One trace: the ENTRY computation, its callees and its hidden
    parameters (values lifted from outside)."""

    def __init__(self, name="main"):
        self.counter = itertools.count()
        self.name = name
        self.comps = []
        self.entry = Computation(self, "main", None)
        self.hidden = []  # concrete values of the hidden parameters, in order
        self._hidden_index = {}
        self.nparams = 0
        self._reducers = {}

    def new_computation(self, base, parent):
        c = Computation(self, f"{base}_{len(self.comps)}", parent)
        self.comps.append(c)
        return c

    def add_parameter(self, shape, dtype):
        n = self.nparams
        self.nparams += 1
        ins = self.entry.add((tuple(shape), np.dtype(dtype)), "parameter", [])
        ins.op = f"parameter({n})"
        ins.operands = None
        return Tracer(ins)

    def lift(self, value, shape, dtype):
        key = id(value)
        if key in self._hidden_index:
            return self._hidden_index[key][1]
        t = self.add_parameter(shape, dtype)
        self.hidden.append(value)
        self._hidden_index[key] = (value, t)  # keeps value alive while the key is used
        return t

    def reducer(self, kind, dtype):
        key = (kind, np.dtype(dtype))
        if key not in self._reducers:
            c = self.new_computation(f"{kind}_{_dtypes.HLO_NAME[np.dtype(dtype)]}", None)
            a = c.add(((), dtype), "parameter(0)", [])
            a.operands = None
            b = c.add(((), dtype), "parameter(1)", [])
            b.operands = None
            r = c.add(((), dtype), kind, [a, b])
            r.root = True
            c.finished = True
            self._reducers[key] = c
        return self._reducers[key]

    def render(self, outputs):
        e = self.entry
        outs = [t.instr for t in outputs]
        r = e.add([o.shape for o in outs], "tuple", outs)
        r.root = True
        parts = [f"HloModule {self.name}", ""]
        parts += [c.render() + "\n" for c in self.comps]
        parts.append(e.render(entry=True))
        return "\n".join(parts) + "\n"


class ArrayOps:
    """Operators shared by Tracer and Array, forwarded to kiln.numpy."""

    __array_priority__ = 100

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def _np(self):
        from . import numpy as knp

        return knp

    def __add__(self, o): return self._np().add(self, o)
    def __radd__(self, o): return self._np().add(o, self)
    def __sub__(self, o): return self._np().subtract(self, o)
    def __rsub__(self, o): return self._np().subtract(o, self)
    def __mul__(self, o): return self._np().multiply(self, o)
    def __rmul__(self, o): return self._np().multiply(o, self)
    def __truediv__(self, o): return self._np().divide(self, o)
    def __rtruediv__(self, o): return self._np().divide(o, self)
    def __floordiv__(self, o): return self._np().floor_divide(self, o)
    def __rfloordiv__(self, o): return self._np().floor_divide(o, self)
    def __mod__(self, o): return self._np().remainder(self, o)
    def __rmod__(self, o): return self._np().remainder(o, self)
    def __pow__(self, o): return self._np().power(self, o)
    def __rpow__(self, o): return self._np().power(o, self)
    def __matmul__(self, o): return self._np().matmul(self, o)
    def __rmatmul__(self, o): return self._np().matmul(o, self)
    def __neg__(self): return self._np().negative(self)
    def __pos__(self): return self
    def __abs__(self): return self._np().abs(self)
    def __invert__(self): return self._np().invert(self)
    def __and__(self, o): return self._np().bitwise_and(self, o)
    def __rand__(self, o): return self._np().bitwise_and(o, self)
    def __or__(self, o): return self._np().bitwise_or(self, o)
    def __ror__(self, o): return self._np().bitwise_or(o, self)
    def __xor__(self, o): return self._np().bitwise_xor(self, o)
    def __rxor__(self, o): return self._np().bitwise_xor(o, self)
    def __lt__(self, o): return self._np().less(self, o)
    def __le__(self, o): return self._np().less_equal(self, o)
    def __gt__(self, o): return self._np().greater(self, o)
    def __ge__(self, o): return self._np().greater_equal(self, o)
    def __eq__(self, o): return self._np().equal(self, o)
    def __ne__(self, o): return self._np().not_equal(self, o)
    __hash__ = None

    def __getitem__(self, idx): return self._np()._getitem(self, idx)

    @property
    def at(self):
        return self._np()._IndexUpdateHelper(self)

    @property
    def T(self): return self._np().transpose(self)

    def astype(self, dtype): return self._np().asarray(self, dtype=dtype)
    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = shape[0]
        return self._np().reshape(self, shape)
    def transpose(self, *axes):
        if len(axes) == 1 and not isinstance(axes[0], int):
            axes = axes[0]
        return self._np().transpose(self, axes or None)
    def sum(self, axis=None, keepdims=False, dtype=None):
        return self._np().sum(self, axis=axis, keepdims=keepdims, dtype=dtype)
    def mean(self, axis=None, keepdims=False): return self._np().mean(self, axis=axis, keepdims=keepdims)
    def max(self, axis=None, keepdims=False): return self._np().max(self, axis=axis, keepdims=keepdims)
    def min(self, axis=None, keepdims=False): return self._np().min(self, axis=axis, keepdims=keepdims)
    def prod(self, axis=None, keepdims=False): return self._np().prod(self, axis=axis, keepdims=keepdims)
    def var(self, axis=None, keepdims=False): return self._np().var(self, axis=axis, keepdims=keepdims)
    def std(self, axis=None, keepdims=False): return self._np().std(self, axis=axis, keepdims=keepdims)
    def argmax(self, axis=None, keepdims=False): return self._np().argmax(self, axis=axis, keepdims=keepdims)
    def argmin(self, axis=None, keepdims=False): return self._np().argmin(self, axis=axis, keepdims=keepdims)
    def flatten(self): return self._np().ravel(self)
    def ravel(self): return self._np().ravel(self)
    def squeeze(self, axis=None): return self._np().squeeze(self, axis)
    def clip(self, min=None, max=None): return self._np().clip(self, min, max)
    def dot(self, o): return self._np().dot(self, o)
    def cumsum(self, axis=None): return self._np().cumsum(self, axis)


class Tracer(ArrayOps):
    """A symbolic array: one instruction of the computation being traced."""

    __slots__ = ("instr",)

    def __init__(self, instr):
        self.instr = instr

    @property
    def shape(self):
        return self.instr.shape[0]

    @property
    def dtype(self):
        return self.instr.shape[1]

    def __repr__(self):
        return f"Traced<{shape_str(self.shape, self.dtype)}>"

    def _concrete(self, what):
        raise ConcretizationTypeError(
            f"kiln: {what} needs a concrete value but got a traced array "
            f"{shape_str(self.shape, self.dtype)} at {_user_line()}: Python control flow "
            "cannot depend on traced values; use kiln.lax.cond / while_loop / fori_loop, "
            "kiln.numpy.where, or mark the argument static (static_argnums)")

    def __bool__(self): self._concrete("bool()")
    def __int__(self): self._concrete("int()")
    def __float__(self): self._concrete("float()")
    def __index__(self): self._concrete("use as an index")
    def __complex__(self): self._concrete("complex()")
    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __array__(self, dtype=None, copy=None):
        raise TracerArrayConversionError(
            f"kiln: np.asarray of a traced array {shape_str(self.shape, self.dtype)} at "
            f"{_user_line()}: a traced value has no data until the function runs")

    def item(self):
        self._concrete("item()")

    def block_until_ready(self):
        return self


def is_tracer(x):
    return isinstance(x, Tracer)


def is_concrete_array(x):
    from ._client import Array

    return isinstance(x, Array)


def aval_of(x):
    """(shape, canonical dtype) of an array-like value."""
    if isinstance(x, ArrayOps):
        return tuple(x.shape), np.dtype(x.dtype)
    if isinstance(x, bool):
        return (), _dtypes.bool_
    if isinstance(x, int):
        return (), _dtypes.int32
    if isinstance(x, float):
        return (), _dtypes.float32
    if isinstance(x, complex):
        return (), _dtypes.complex64
    a = np.asarray(x)
    return tuple(a.shape), _dtypes.canonical(a.dtype)


def _fmt_scalar(v, dtype):
    dtype = np.dtype(dtype)
    if dtype == _dtypes.bool_:
        return "true" if bool(v) else "false"
    if _dtypes.is_int(dtype):
        return str(int(v))
    if dtype.kind == "c":
        return f"({_fmt_scalar(v.real, np.float32)}, {_fmt_scalar(v.imag, np.float32)})"
    f = float(v)
    if f != f:
        return "nan"
    if f in (float("inf"), float("-inf")):
        return "inf" if f > 0 else "-inf"
    return repr(f)


def _fmt_literal(a, dtype):
    if a.ndim == 0:
        return _fmt_scalar(a[()], dtype)
    return "{" + ", ".join(_fmt_literal(a[i], dtype) for i in range(a.shape[0])) + "}"


def constant(comp, value, dtype=None):
    a = np.asarray(value)
    dt = _dtypes.canonical(dtype if dtype is not None else a.dtype)
    a = a.astype(dt)
    ins = comp.add((tuple(a.shape), dt), "constant", [], "")
    ins.op = f"constant({_fmt_literal(a, dt)})"
    ins.operands = None
    return Tracer(ins)


def to_tracer(x, comp, dtype=None):
    """x as a tracer of comp (see the module comment for how)."""
    if isinstance(x, Tracer):
        if x.instr.comp is comp:
            t = x
        elif x.instr.comp.finished or not _is_ancestor(x.instr.comp, comp):
            raise UnexpectedTracerError(
                f"kiln: a traced value {x!r} from another trace was used at {_user_line()} "
                "(a tracer escaped the function that created it)")
        else:
            t = comp.capture(x)
    elif is_concrete_array(x) or (isinstance(x, np.ndarray) and x.size > LIFT_ELEMENTS):
        shape, dt = aval_of(x)
        t = comp.graph.lift(x, shape, dt)
        if comp is not comp.graph.entry:
            t = comp.capture(t)
    else:
        if dtype is None:
            _, dt = aval_of(x)
        else:
            dt = dtype
        return constant(comp, x, dt)
    if dtype is not None and np.dtype(dtype) != t.dtype:
        t = convert(t, dtype)
    return t


def _is_ancestor(a, c):
    while c is not None:
        if c is a:
            return True
        c = c.parent
    return False


# ---- instruction emitters (operands are tracers of one computation) -------------

def emit(op, operands, shape, dtype, attrs=""):
    comp = operands[0].instr.comp
    return Tracer(comp.add((tuple(int(d) for d in shape), np.dtype(dtype)), op,
                           [o.instr for o in operands], attrs))


def convert(t, dtype):
    dtype = _dtypes.canonical(dtype)
    if t.dtype == dtype:
        return t
    return emit("convert", [t], t.shape, dtype)


def dims_attr(name, dims):
    return f", {name}={{{','.join(str(int(d)) for d in dims)}}}"
