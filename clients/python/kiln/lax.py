"""kiln.lax: the primitives, each one HLO instruction (or a few), with its
shape inferred and checked here so that a wrong shape raises, naming the op
and the shapes, before anything reaches the server.

Every public function is a primitive: inside a trace it appends to the
computation being traced; called on concrete values it runs by itself on
kilnd (a one-op program, compiled once per signature), so code that is not
jitted runs op by op with the same results.
"""
import builtins
import functools

import numpy as np

from . import _dtypes, tree_util
from ._core import (Tracer, _stack, aval_of, convert, current_computation, dims_attr, emit,
                    to_tracer)

_EAGER = {}


def _eager_leaf(x):
    from ._client import Array

    return isinstance(x, (Array, np.ndarray))


def primitive(fn):
    """Runs fn in the current trace, or alone on the server when no trace is
    active (its array arguments become parameters, the rest is static)."""

    @functools.wraps(fn)
    def wrapped(*args, **kw):
        if _stack():
            return fn(*args, **kw)
        leaves = tree_util.tree_leaves((args, kw))
        if any(isinstance(x, Tracer) for x in leaves):
            return fn(*args, **kw)
        from ._api import Staged

        s = _EAGER.get(fn)
        if s is None:
            s = _EAGER[fn] = Staged(fn, name=fn.__name__)
            s._dyn_pred = _eager_leaf
        return s(*args, **kw)

    wrapped._kiln_primitive = fn
    return wrapped


def _t(x, dtype=None):
    return to_tracer(x, current_computation(), dtype)


def _err(op, msg, *vals):
    shapes = ", ".join(f"{tuple(v.shape)}" for v in vals)
    raise TypeError(f"kiln.lax.{op}: {msg} (operand shapes {shapes})")


# ---- elementwise ------------------------------------------------------------------

def _unary(name, hlo, float_only=False):
    @primitive
    def f(x):
        x = _t(x)
        if float_only and not _dtypes.is_float(x.dtype):
            x = convert(x, _dtypes.float32)
        return emit(hlo, [x], x.shape, x.dtype)

    f.__name__ = f.__qualname__ = name
    f._kiln_primitive.__name__ = name
    return f


neg = _unary("neg", "negate")
exp = _unary("exp", "exponential", True)
expm1 = _unary("expm1", "exponential-minus-one", True)
log = _unary("log", "log", True)
log1p = _unary("log1p", "log-plus-one", True)
sin = _unary("sin", "sine", True)
cos = _unary("cos", "cosine", True)
tan = _unary("tan", "tan", True)
tanh = _unary("tanh", "tanh", True)
logistic = _unary("logistic", "logistic", True)
sqrt = _unary("sqrt", "sqrt", True)
rsqrt = _unary("rsqrt", "rsqrt", True)
cbrt = _unary("cbrt", "cbrt", True)
erf = _unary("erf", "erf", True)


def _real_of(dt):
    """The real type of a complex one (abs, real, imag), else dt."""
    return {np.dtype("complex64"): np.dtype("float32"),
            np.dtype("complex128"): np.dtype("float64")}.get(np.dtype(dt), dt)


@primitive
def abs(x):  # noqa: A001
    x = _t(x)
    return emit("abs", [x], x.shape, _real_of(x.dtype))


@primitive
def real(x):
    x = _t(x)
    return emit("real", [x], x.shape, _real_of(x.dtype))


@primitive
def imag(x):
    x = _t(x)
    return emit("imag", [x], x.shape, _real_of(x.dtype))


@primitive
def complex(x, y):  # noqa: A001
    a, b = _same("complex", x, y)
    ct = {np.dtype("float32"): np.dtype("complex64"),
          np.dtype("float64"): np.dtype("complex128")}.get(np.dtype(a.dtype))
    if ct is None:
        raise TypeError(f"kiln.lax.complex: operands must be f32 or f64, not {a.dtype}")
    return emit("complex", [a, b], a.shape, ct)


def conj(x):
    x = _t(x)
    if np.dtype(x.dtype).kind != "c":
        return x
    return complex(real(x), neg(imag(x)))


sign = _unary("sign", "sign")
floor = _unary("floor", "floor", True)
ceil = _unary("ceil", "ceil", True)
round = _unary("round", "round-nearest-even", True)  # noqa: A001
bitwise_not = _unary("bitwise_not", "not")


@primitive
def is_finite(x):
    x = _t(x)
    return emit("is-finite", [x], x.shape, _dtypes.bool_)


def _same(op, *xs):
    ts = [_t(x) for x in xs]
    s, d = ts[0].shape, ts[0].dtype
    for t in ts[1:]:
        if t.shape != s:
            _err(op, "operands must have equal shapes (broadcast first)", *ts)
        if t.dtype != d:
            raise TypeError(f"kiln.lax.{op}: operands have dtypes {d} and {t.dtype}")
    return ts


def _binary(name, hlo, out_dtype=None):
    @primitive
    def f(x, y):
        a, b = _same(name, x, y)
        return emit(hlo, [a, b], a.shape, out_dtype or a.dtype)

    f.__name__ = f.__qualname__ = name
    return f


add = _binary("add", "add")
sub = _binary("sub", "subtract")
mul = _binary("mul", "multiply")
div = _binary("div", "divide")
rem = _binary("rem", "remainder")
pow = _binary("pow", "power")  # noqa: A001
max = _binary("max", "maximum")  # noqa: A001
min = _binary("min", "minimum")  # noqa: A001
atan2 = _binary("atan2", "atan2")
bitwise_and = _binary("bitwise_and", "and")
bitwise_or = _binary("bitwise_or", "or")
bitwise_xor = _binary("bitwise_xor", "xor")
shift_left = _binary("shift_left", "shift-left")
shift_right_arithmetic = _binary("shift_right_arithmetic", "shift-right-arithmetic")
shift_right_logical = _binary("shift_right_logical", "shift-right-logical")


def _compare(name, direction):
    @primitive
    def f(x, y):
        a, b = _same(name, x, y)
        return emit("compare", [a, b], a.shape, _dtypes.bool_, f", direction={direction}")

    f.__name__ = f.__qualname__ = name
    return f


eq = _compare("eq", "EQ")
ne = _compare("ne", "NE")
lt = _compare("lt", "LT")
le = _compare("le", "LE")
gt = _compare("gt", "GT")
ge = _compare("ge", "GE")


@primitive
def select(pred, on_true, on_false):
    p = _t(pred)
    a, b = _same("select", on_true, on_false)
    if p.dtype != _dtypes.bool_:
        raise TypeError(f"kiln.lax.select: the predicate has dtype {p.dtype}, not bool")
    if p.shape != a.shape and p.shape != ():
        _err("select", "the predicate's shape must equal the operands'", p, a, b)
    if p.shape != a.shape:
        p = broadcast_in_dim(p, a.shape, ())
    return emit("select", [p, a, b], a.shape, a.dtype)


@primitive
def clamp(lo, x, hi):
    x = _t(x)
    lo, hi = _t(lo, x.dtype), _t(hi, x.dtype)
    if lo.shape != x.shape:
        lo = broadcast_in_dim(lo, x.shape, ())
    if hi.shape != x.shape:
        hi = broadcast_in_dim(hi, x.shape, ())
    return emit("clamp", [lo, x, hi], x.shape, x.dtype)


@primitive
def convert_element_type(x, new_dtype):
    return convert(_t(x), _dtypes.canonical(new_dtype))


@primitive
def bitcast_convert_type(x, new_dtype):
    x = _t(x)
    nd = _dtypes.canonical(new_dtype)
    if nd.itemsize != x.dtype.itemsize:
        raise NotImplementedError("kiln.lax.bitcast_convert_type between sizes")
    return emit("bitcast-convert", [x], x.shape, nd)


def stop_gradient(x):
    """Identity whose derivative is zero: inside a trace a custom_jvp
    identity with a zero tangent (kiln._custom), so the server's transforms
    stop there."""
    from ._custom import stop_gradient_leaf

    def one(v):
        if not _stack():
            return v
        return stop_gradient_leaf(_t(v))

    return tree_util.tree_map(one, x)


# ---- shapes -----------------------------------------------------------------------

@primitive
def broadcast_in_dim(x, shape, broadcast_dimensions):
    x = _t(x)
    shape = tuple(int(d) for d in shape)
    bd = tuple(int(d) for d in broadcast_dimensions)
    if len(bd) != x.ndim:
        _err("broadcast_in_dim", f"broadcast_dimensions {bd} has {len(bd)} entries for rank "
             f"{x.ndim}", x)
    for i, d in enumerate(bd):
        if not 0 <= d < len(shape) or x.shape[i] not in (1, shape[d]):
            _err("broadcast_in_dim", f"operand dim {i} of size {x.shape[i]} cannot go to dim "
                 f"{d} of {shape}", x)
    if any(x.shape[i] == 1 and shape[d] != 1 for i, d in enumerate(bd)):
        keep = [i for i, d in enumerate(bd) if not (x.shape[i] == 1 and shape[d] != 1)]
        x = reshape(x, tuple(x.shape[i] for i in keep))
        bd = tuple(bd[i] for i in keep)
    if x.shape == shape and bd == tuple(range(len(shape))):
        return x
    return emit("broadcast", [x], shape, x.dtype, dims_attr("dimensions", bd))


def broadcast(x, sizes):
    x = _t(x) if _stack() else x
    sizes = tuple(sizes)
    nd = len(aval_of(x)[0])
    return broadcast_in_dim(x, sizes + tuple(aval_of(x)[0]),
                            tuple(range(len(sizes), len(sizes) + nd)))


@primitive
def reshape(x, new_sizes, dimensions=None):
    x = _t(x)
    new_sizes = tuple(int(d) for d in new_sizes)
    if int(np.prod(new_sizes, dtype=np.int64)) != x.size:
        _err("reshape", f"cannot reshape {x.size} elements into {new_sizes}", x)
    if dimensions is not None:
        x = transpose(x, dimensions)
    if x.shape == new_sizes:
        return x
    return emit("reshape", [x], new_sizes, x.dtype)


@primitive
def transpose(x, permutation):
    x = _t(x)
    perm = tuple(int(p) for p in permutation)
    if sorted(perm) != list(range(x.ndim)):
        _err("transpose", f"permutation {perm} is not a permutation of rank {x.ndim}", x)
    if perm == tuple(range(x.ndim)):
        return x
    return emit("transpose", [x], tuple(x.shape[p] for p in perm), x.dtype,
                dims_attr("dimensions", perm))


@primitive
def slice(x, start_indices, limit_indices, strides=None):  # noqa: A001
    x = _t(x)
    st = strides or (1,) * x.ndim
    if not (len(start_indices) == len(limit_indices) == len(st) == x.ndim):
        _err("slice", "start, limit and strides need one entry per dimension", x)
    out = []
    for s, l, k, n in zip(start_indices, limit_indices, st, x.shape):
        if not 0 <= s <= l <= n or k < 1:
            _err("slice", f"[{s}:{l}:{k}] is out of range for a dimension of size {n}", x)
        out.append(builtins.max(0, -(-(l - s) // k)))
    spec = ", ".join(f"[{s}:{l}:{k}]" for s, l, k in zip(start_indices, limit_indices, st))
    return emit("slice", [x], out, x.dtype, f", slice={{{spec}}}")


def _index_scalars(idx, n, op):
    ts = []
    for i in idx:
        t = _t(i)
        if t.shape != ():
            raise TypeError(f"kiln.lax.{op}: start indices must be scalars, got shape {t.shape}")
        if not _dtypes.is_int(t.dtype):
            raise TypeError(f"kiln.lax.{op}: start indices must be integers, got {t.dtype}")
        ts.append(convert(t, _dtypes.int32))
    if len(ts) != n:
        raise TypeError(f"kiln.lax.{op}: {len(ts)} start indices for rank {n}")
    return ts


@primitive
def dynamic_slice(x, start_indices, slice_sizes):
    x = _t(x)
    sizes = tuple(int(s) for s in slice_sizes)
    if len(sizes) != x.ndim or any(not 0 <= s <= n for s, n in zip(sizes, x.shape)):
        _err("dynamic_slice", f"slice_sizes {sizes} do not fit", x)
    idx = _index_scalars(start_indices, x.ndim, "dynamic_slice")
    return emit("dynamic-slice", [x] + idx, sizes, x.dtype,
                dims_attr("dynamic_slice_sizes", sizes))


@primitive
def dynamic_update_slice(x, update, start_indices):
    x = _t(x)
    u = _t(update, x.dtype)
    if u.ndim != x.ndim or any(a > b for a, b in zip(u.shape, x.shape)):
        _err("dynamic_update_slice", "the update must fit in the operand", x, u)
    idx = _index_scalars(start_indices, x.ndim, "dynamic_update_slice")
    return emit("dynamic-update-slice", [x, u] + idx, x.shape, x.dtype)


def dynamic_index_in_dim(x, index, axis=0, keepdims=True):
    shape = aval_of(x)[0]
    starts = [0] * len(shape)
    starts[axis] = index
    sizes = list(shape)
    sizes[axis] = 1
    r = dynamic_slice(x, starts, sizes)
    return r if keepdims else reshape(r, shape[:axis] + shape[axis + 1:])


def dynamic_update_index_in_dim(x, update, index, axis):
    shape = aval_of(x)[0]
    ushape = aval_of(update)[0]
    if len(ushape) == len(shape) - 1:
        update = reshape(update, ushape[:axis] + (1,) + ushape[axis:])
    starts = [0] * len(shape)
    starts[axis] = index
    return dynamic_update_slice(x, update, starts)


@primitive
def concatenate(operands, dimension):
    ts = [_t(o) for o in operands]
    d = ts[0].dtype
    ts = [convert(t, d) for t in ts]
    r = ts[0].ndim
    if not 0 <= dimension < r:
        _err("concatenate", f"dimension {dimension} is out of range", *ts)
    for t in ts[1:]:
        if t.ndim != r or any(a != b for i, (a, b) in enumerate(zip(t.shape, ts[0].shape))
                              if i != dimension):
            _err("concatenate", f"shapes differ outside dimension {dimension}", *ts)
    shape = list(ts[0].shape)
    shape[dimension] = sum(t.shape[dimension] for t in ts)
    return emit("concatenate", ts, shape, d, dims_attr("dimensions", [dimension]))


@primitive
def pad(x, padding_value, padding_config):
    x = _t(x)
    v = _t(padding_value, x.dtype)
    if len(padding_config) != x.ndim:
        _err("pad", f"padding_config has {len(padding_config)} entries for rank {x.ndim}", x)
    out, spec = [], []
    for (lo, hi, interior), n in zip(padding_config, x.shape):
        out.append(lo + hi + n + interior * builtins.max(n - 1, 0))
        spec.append(f"{lo}_{hi}" + (f"_{interior}" if interior else ""))
    return emit("pad", [x, v], out, x.dtype, f", padding={'x'.join(spec)}")


@primitive
def rev(x, dimensions):
    x = _t(x)
    return emit("reverse", [x], x.shape, x.dtype, dims_attr("dimensions", dimensions))


@primitive
def iota(dtype, size):
    return broadcasted_iota(dtype, (size,), 0)


def broadcasted_iota(dtype, shape, dimension):
    comp = current_computation()
    if comp is None:
        return iota_eager(dtype, tuple(shape), dimension)
    dt = _dtypes.canonical(dtype)
    ins = comp.add((tuple(int(s) for s in shape), dt), "iota", [],
                   f", iota_dimension={dimension}")
    ins.op = f"iota(), iota_dimension={dimension}"
    ins.operands = None
    return Tracer(ins)


@primitive
def iota_eager(dtype, shape, dimension):
    return broadcasted_iota(dtype, shape, dimension)


# ---- dot ----------------------------------------------------------------------------

@primitive
def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    a, b = _t(lhs), _t(rhs)
    d = _dtypes.result_type(a.dtype, b.dtype)
    a, b = convert(a, d), convert(b, d)
    (lc, rc), (lb, rb) = dimension_numbers
    lc, rc, lb, rb = (tuple(int(i) for i in v) for v in (lc, rc, lb, rb))
    if len(lc) != len(rc) or len(lb) != len(rb):
        _err("dot_general", "contracting or batch dimension lists differ in length", a, b)
    for i, j in list(zip(lc, rc)) + list(zip(lb, rb)):
        if not (0 <= i < a.ndim and 0 <= j < b.ndim) or a.shape[i] != b.shape[j]:
            _err("dot_general", f"lhs dim {i} and rhs dim {j} do not match", a, b)
    lfree = [i for i in range(a.ndim) if i not in lc and i not in lb]
    rfree = [i for i in range(b.ndim) if i not in rc and i not in rb]
    shape = [a.shape[i] for i in lb] + [a.shape[i] for i in lfree] + [b.shape[i] for i in rfree]
    attrs = ""
    if lb:
        attrs += dims_attr("lhs_batch_dims", lb) + dims_attr("rhs_batch_dims", rb)
    attrs += dims_attr("lhs_contracting_dims", lc) + dims_attr("rhs_contracting_dims", rc)
    out = emit("dot", [a, b], shape, d, attrs)
    if preferred_element_type is not None:
        out = convert(out, preferred_element_type)
    return out


def dot(lhs, rhs, precision=None, preferred_element_type=None):
    la, ra = aval_of(lhs)[0], aval_of(rhs)[0]
    if len(la) > 2 or len(ra) > 2 or not la or not ra:
        raise TypeError(f"kiln.lax.dot: operands of rank 1 or 2, got {la} and {ra}")
    return dot_general(lhs, rhs, (((len(la) - 1,), (0,)), ((), ())),
                       preferred_element_type=preferred_element_type)


# ---- reductions ---------------------------------------------------------------------

_REDUCERS = {"add": ("add", 0), "mul": ("multiply", 1), "max": ("maximum", None),
             "min": ("minimum", None), "and": ("and", True), "or": ("or", False)}


def _identity(kind, dtype):
    if kind == "max":
        return -np.inf if _dtypes.is_float(dtype) else (
            False if dtype == _dtypes.bool_ else np.iinfo(dtype).min)
    if kind == "min":
        return np.inf if _dtypes.is_float(dtype) else (
            True if dtype == _dtypes.bool_ else np.iinfo(dtype).max)
    return _REDUCERS[kind][1]


@primitive
def _reduce(x, axes, kind):
    x = _t(x)
    axes = tuple(sorted(int(a) % builtins.max(x.ndim, 1) for a in axes))
    hlo = _REDUCERS[kind][0]
    comp = current_computation()
    red = comp.graph.reducer(hlo, x.dtype)
    init = _t(np.asarray(_identity(kind, x.dtype), dtype=x.dtype))
    shape = [n for i, n in enumerate(x.shape) if i not in axes]
    return emit("reduce", [x, init], shape, x.dtype,
                dims_attr("dimensions", axes) + f", to_apply={red.name}")


def reduce_sum(x, axes): return _reduce(x, tuple(axes), "add")
def reduce_prod(x, axes): return _reduce(x, tuple(axes), "mul")
def reduce_max(x, axes): return _reduce(x, tuple(axes), "max")
def reduce_min(x, axes): return _reduce(x, tuple(axes), "min")
def reduce_and(x, axes): return _reduce(x, tuple(axes), "and")
def reduce_or(x, axes): return _reduce(x, tuple(axes), "or")


@primitive
def _reduce_window(x, kind, window, strides, padding):
    x = _t(x)
    hlo = _REDUCERS[kind][0]
    red = current_computation().graph.reducer(hlo, x.dtype)
    init = _t(np.asarray(_identity(kind, x.dtype), dtype=x.dtype))
    out = []
    for n, w, s, (lo, hi) in zip(x.shape, window, strides, padding):
        out.append((n + lo + hi - w) // s + 1)
    spec = "size=" + "x".join(builtins.map(str, window)) + " stride=" + "x".join(builtins.map(str, strides))
    spec += " pad=" + "x".join(f"{lo}_{hi}" for lo, hi in padding)
    return emit("reduce-window", [x, init], out, x.dtype,
                f", window={{{spec}}}, to_apply={red.name}")


def reduce_window(operand, init_value, computation, window_dimensions, window_strides, padding):
    kinds = {add: "add", max: "max", min: "min", mul: "mul"}
    kind = kinds.get(computation)
    if kind is None:
        raise NotImplementedError("kiln.lax.reduce_window: only lax.add/max/min/mul reducers")
    nd = len(window_dimensions)
    if isinstance(padding, str):
        if padding.upper() == "VALID":
            padding = [(0, 0)] * nd
        else:
            shape = aval_of(operand)[0]
            padding = []
            for n, w, s in zip(shape, window_dimensions, window_strides):
                out = -(-n // s)
                tot = builtins.max(0, (out - 1) * s + w - n)
                padding.append((tot // 2, tot - tot // 2))
    return _reduce_window(operand, kind, tuple(window_dimensions), tuple(window_strides),
                          tuple(tuple(p) for p in padding))


def _cumulative(x, axis, kind, reverse):
    shape = aval_of(x)[0]
    n = shape[axis]
    window = [1] * len(shape)
    window[axis] = n
    pads = [(0, 0)] * len(shape)
    pads[axis] = (0, n - 1) if reverse else (n - 1, 0)
    return _reduce_window(x, kind, tuple(window), (1,) * len(shape), tuple(pads))


def cumsum(x, axis=0, reverse=False): return _cumulative(x, axis, "add", reverse)
def cumprod(x, axis=0, reverse=False): return _cumulative(x, axis, "mul", reverse)
def cummax(x, axis=0, reverse=False): return _cumulative(x, axis, "max", reverse)
def cummin(x, axis=0, reverse=False): return _cumulative(x, axis, "min", reverse)


@primitive
def argmax(x, axis, index_dtype=np.int32):
    return _arg_extreme(x, axis, index_dtype, "max")


@primitive
def argmin(x, axis, index_dtype=np.int32):
    return _arg_extreme(x, axis, index_dtype, "min")


def _arg_extreme(x, axis, index_dtype, kind):
    x = _t(x)
    m = _reduce(x, (axis,), kind)
    mb = broadcast_in_dim(m, x.shape, [i for i in range(x.ndim) if i != axis])
    hit = eq(x, mb)
    if _dtypes.is_float(x.dtype):  # NaN wins, as numpy's argmax
        hit = bitwise_or(hit, ne(x, x))
    idx = broadcasted_iota(index_dtype, x.shape, axis)
    big = _t(np.asarray(x.shape[axis], dtype=_dtypes.canonical(index_dtype)))
    big = broadcast_in_dim(big, x.shape, ())
    return _reduce(select(hit, idx, big), (axis,), "min")


# ---- sort ---------------------------------------------------------------------------

@primitive
def _sort(operands, dimension, num_keys, is_stable):
    ts = [_t(o) for o in operands]
    comp = current_computation()
    g = comp.graph
    c = g.new_computation("compare", None)
    params = []
    for i, t in enumerate(ts):
        for j in (0, 1):
            p = c.add(((), t.dtype), f"parameter({2 * i + j})", [])
            p.operands = None
            params.append(Tracer(p))
    # lexicographic on the first num_keys operands, NaN last (total order)
    res = None
    for k in range(num_keys - 1, -1, -1):
        a, b = params[2 * k], params[2 * k + 1]
        if _dtypes.is_float(ts[k].dtype):
            less = emit("compare", [a, b], (), _dtypes.bool_, ", direction=LT, type=TOTALORDER")
            eqk = emit("compare", [a, b], (), _dtypes.bool_, ", direction=EQ, type=TOTALORDER")
        else:
            less = emit("compare", [a, b], (), _dtypes.bool_, ", direction=LT")
            eqk = emit("compare", [a, b], (), _dtypes.bool_, ", direction=EQ")
        if res is None:
            res = less
        else:
            res = emit("or", [less, emit("and", [eqk, res], (), _dtypes.bool_)], (),
                       _dtypes.bool_)
    res.instr.root = True
    c.finished = True
    shape = ts[0].shape
    attrs = dims_attr("dimensions", [dimension]) + (", is_stable=true" if is_stable else "") + \
        f", to_apply={c.name}"
    if len(ts) == 1:
        return [emit("sort", ts, shape, ts[0].dtype, attrs)]
    tup = Tracer(comp.add([(t.shape, t.dtype) for t in ts], "sort", [t.instr for t in ts],
                          attrs))
    return [_gte(tup, i) for i in range(len(ts))]


# ---- user kernels ----------------------------------------------------------------

_KERNEL_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _out_aval(o):
    if hasattr(o, "shape") and hasattr(o, "dtype"):
        return tuple(int(d) for d in o.shape), _dtypes.canonical(o.dtype)
    shape, dtype = o
    return tuple(int(d) for d in shape), _dtypes.canonical(dtype)


@primitive
def user_kernel(name, *operands, out_shapes):
    """Calls the C kernel registered as `name` (kiln.register_kernel) on
    the operands: a custom call of target "kiln.user.NAME". out_shapes is
    the result's (shape, dtype) (or anything with .shape and .dtype, such
    as jax.ShapeDtypeStruct), or a list of them for several results
    (returned as a tuple). The server checks the operands and results
    against the kernel's registered signature. The kernel runs on the cpu
    backend; for grad, wrap the call in kiln.custom_vjp."""
    if not (isinstance(name, str) and 0 < len(name) <= 64 and name[0].isascii()
            and name[0].isalpha() and set(name) <= _KERNEL_NAME_OK):
        raise ValueError(f"kiln.lax.user_kernel: {name!r} is not a kernel name (1 to 64 "
                         "letters, digits and '_', starting with a letter)")
    several = isinstance(out_shapes, list)
    outs = [_out_aval(o) for o in (out_shapes if several else [out_shapes])]
    if not outs:
        raise ValueError("kiln.lax.user_kernel: out_shapes lists no result")
    ts = [_t(o) for o in operands]
    comp = current_computation()
    attrs = f', custom_call_target="kiln.user.{name}"'
    if not several:
        return Tracer(comp.add(outs[0], "custom-call", [t.instr for t in ts], attrs))
    tup = Tracer(comp.add(list(outs), "custom-call", [t.instr for t in ts], attrs))
    return tuple(_gte(tup, i) for i in range(len(outs)))


def _gte(tup, i):
    s = tup.instr.shape[i]
    return Tracer(tup.instr.comp.add(s, "get-tuple-element", [tup.instr], f", index={i}"))


def sort(operand, dimension=-1, is_stable=True, num_keys=1):
    single = not isinstance(operand, (tuple, list))
    ops = [operand] if single else list(operand)
    nd = len(aval_of(ops[0])[0])
    out = _sort(ops, dimension % nd, num_keys, is_stable)
    return out[0] if single else tuple(out)


def sort_key_val(keys, values, dimension=-1, is_stable=True):
    return sort((keys, values), dimension, is_stable, 1)


def top_k(operand, k):
    from . import numpy as knp

    x = operand
    idx = knp.argsort(knp.negative(x) if _dtypes.is_float(aval_of(x)[1]) else -x, axis=-1,
                      stable=True)
    idx = idx[..., :k]
    return knp.take_along_axis(x, idx, axis=-1), idx


# ---- gather / scatter (the forms numpy indexing needs) -------------------------------

@primitive
def _take0(x, idx):
    """x[idx] along axis 0 for an integer index array of any shape."""
    x, i = _t(x), convert(_t(idx), _dtypes.int32)
    n = x.shape[0]
    i = select(lt(i, _full_like(i, 0)), add(i, _full_like(i, n)), i)
    iv = reshape(i, i.shape + (1,))
    out_shape = i.shape + x.shape[1:]
    offset = tuple(range(i.ndim, i.ndim + x.ndim - 1))
    sizes = (1,) + x.shape[1:]
    attrs = (dims_attr("offset_dims", offset) + dims_attr("collapsed_slice_dims", [0]) +
             dims_attr("start_index_map", [0]) + f", index_vector_dim={i.ndim}" +
             dims_attr("slice_sizes", sizes))
    return emit("gather", [x, iv], out_shape, x.dtype, attrs)


def _full_like(t, v):
    return broadcast_in_dim(_t(np.asarray(v, dtype=t.dtype)), t.shape, ())


@primitive
def _scatter_flat(x, flat_idx, updates, kind):
    """x (1-D) with updates combined in at flat_idx (1-D int32) by kind."""
    x = _t(x)
    i = reshape(convert(_t(flat_idx), _dtypes.int32), (aval_of(flat_idx)[0][0], 1))
    u = _t(updates, x.dtype)
    comp = current_computation()
    g = comp.graph
    if kind == "set":
        c = g.new_computation("scatter_set", None)
        a = c.add(((), x.dtype), "parameter(0)", [])
        a.operands = None
        b = c.add(((), x.dtype), "parameter(1)", [])
        b.operands = None
        b.root = True
        c.finished = True
    else:
        c = g.reducer({"add": "add", "mul": "multiply", "max": "maximum",
                       "min": "minimum"}[kind], x.dtype)
    attrs = (dims_attr("update_window_dims", []) + dims_attr("inserted_window_dims", [0]) +
             dims_attr("scatter_dims_to_operand_dims", [0]) + ", index_vector_dim=1" +
             f", to_apply={c.name}")
    return emit("scatter", [x, i, u], x.shape, x.dtype, attrs)


# ---- control flow -------------------------------------------------------------------

def _trace_sub(fn, avals, base, parent):
    """Traces fn over one tuple parameter of avals into a new computation;
    returns (computation, output tracers, output tree)."""
    g = parent.graph
    c = g.new_computation(base, parent)
    n = len(avals)
    c.capture_base = n
    p = c.add(lambda: [(s, d) for s, d in avals] + [(o.shape, o.dtype) for o, _ in c.captures],
              "parameter(0)", [])
    p.operands = None
    c.param_tuple = p
    args = []
    for k, (s, d) in enumerate(avals):
        args.append(Tracer(c.add((s, d), "get-tuple-element", [p], f", index={k}")))
    _stack().append(c)
    try:
        out = fn(args)
        leaves, tree = tree_util.tree_flatten(out)
        outs = [to_tracer(o, c) for o in leaves]
    finally:
        _stack().pop()
    return c, outs, tree


def while_loop(cond_fun, body_fun, init_val):
    init_leaves, tree = tree_util.tree_flatten(init_val)
    if not _stack():
        from ._api import Staged

        return Staged(lambda v: while_loop(cond_fun, body_fun, v), name="while_loop")(init_val)
    comp = current_computation()
    init = [_t(x) for x in init_leaves]
    avals = [(t.shape, t.dtype) for t in init]
    cc, couts, _ = _trace_sub(lambda a: cond_fun(tree.unflatten(a)), avals, "cond", comp)
    if len(couts) != 1 or couts[0].shape != () or couts[0].dtype != _dtypes.bool_:
        raise TypeError("kiln.lax.while_loop: cond_fun must return a boolean scalar")
    bc, bouts, btree = _trace_sub(lambda a: body_fun(tree.unflatten(a)), avals, "body", comp)
    if btree != tree or [(o.shape, o.dtype) for o in bouts] != avals:
        raise TypeError("kiln.lax.while_loop: body_fun must return a value of the carry's "
                        f"structure and types {avals}, got "
                        f"{[(o.shape, o.dtype) for o in bouts]}")
    # both computations carry the union of their captures
    outer, seen = [], set()
    for c in (cc, bc):
        for o, _ in c.captures:
            if id(o.instr) not in seen:
                seen.add(id(o.instr))
                outer.append(o)
    _align_captures([cc, bc], outer)
    couts[0].instr.root = True
    cc.finished = True
    bodyroot = bc.add(lambda: [(o.shape, o.dtype) for o in bouts] +
                      [(o.shape, o.dtype) for o in outer],
                      "tuple", [o.instr for o in bouts] + [_local(bc, o).instr for o in outer])
    bodyroot.root = True
    bc.finished = True
    state = avals + [(o.shape, o.dtype) for o in outer]
    tup = comp.add(list(state), "tuple", [t.instr for t in init] + [o.instr for o in outer])
    w = Tracer(comp.add(list(state), "while", [tup],
                        f", condition={cc.name}, body={bc.name}"))
    return tree.unflatten([_gte(w, i) for i in range(len(init))])


def _local(c, outer):
    for o, l in c.captures:
        if o.instr is outer.instr:
            return l
    return c.capture(outer)


def _align_captures(comps, outer):
    """Makes each computation capture exactly `outer`, in that order."""
    for c in comps:
        for o in outer:
            _local(c, o)
        order = {id(o.instr): k for k, o in enumerate(outer)}
        caps = sorted(c.captures, key=lambda ol: order[id(ol[0].instr)])
        c.captures[:] = caps
        for k, (o, l) in enumerate(caps):
            l.instr.attrs = (lambda k=k, c=c: f", index={c.capture_base + k}")


def fori_loop(lower, upper, body_fun, init_val):
    def cond(c):
        return lt(c[0], c[1])

    def body(c):
        i, n, v = c
        return add(i, _t(np.int32(1))), n, body_fun(i, v)

    if not _stack():
        from ._api import Staged

        return Staged(lambda lo, hi, v: fori_loop(lo, hi, body_fun, v),
                      name="fori_loop")(lower, upper, init_val)
    lo = convert(_t(lower), _dtypes.int32)
    hi = convert(_t(upper), _dtypes.int32)
    return while_loop(cond, body, (lo, hi, init_val))[2]


def scan(f, init, xs=None, length=None, reverse=False, unroll=1):
    if not _stack():
        from ._api import Staged

        return Staged(lambda c, x: scan(f, c, x, length, reverse), name="scan")(init, xs)
    x_leaves, x_tree = tree_util.tree_flatten(xs)
    x_leaves = [_t(x) for x in x_leaves]
    if length is None:
        if not x_leaves:
            raise ValueError("kiln.lax.scan: length is needed when xs is None")
        length = x_leaves[0].shape[0]
    for x in x_leaves:
        if not x.shape or x.shape[0] != length:
            raise ValueError(f"kiln.lax.scan: xs leaves must have leading size {length}, got "
                             f"{x.shape}")
    # the ys buffers' shapes: trace f once into a throwaway computation
    c_leaves, c_tree = tree_util.tree_flatten(init)
    c_avals = [aval_of(c) for c in c_leaves]
    x_avals = [(x.shape[1:], x.dtype) for x in x_leaves]
    comp = current_computation()
    probe = {}

    def shape_probe(flat):
        nc, y = f(c_tree.unflatten(flat[:len(c_avals)]), x_tree.unflatten(flat[len(c_avals):]))
        probe["y"] = tree_util.tree_structure(y)
        return tree_util.tree_leaves(y)

    pc, youts, _ = _trace_sub(shape_probe, c_avals + x_avals, "probe", comp)
    comp.graph.comps.remove(pc)
    pc.finished = True
    y_avals = [(o.shape, o.dtype) for o in youts]
    y_tree = probe["y"]
    ys0 = [broadcast_in_dim(_t(np.zeros((), d)), (length,) + tuple(s), ()) for s, d in y_avals]

    def body(state):
        i, carry, ys = state
        idx = sub(_t(np.int32(length - 1)), i) if reverse else i
        xi = [dynamic_index_in_dim(x, idx, 0, keepdims=False) for x in x_leaves]
        nc, y = f(c_tree.unflatten(carry), x_tree.unflatten(xi))
        ncl = [convert(_t(v), d) for v, (_, d) in zip(tree_util.tree_leaves(nc), c_avals)]
        yl = tree_util.tree_leaves(y)
        ys = [dynamic_update_index_in_dim(b, _t(v, b.dtype), idx, 0) for b, v in zip(ys, yl)]
        return add(i, _t(np.int32(1))), ncl, ys

    def cond(state):
        return lt(state[0], _t(np.int32(length)))

    _, carry, ys = while_loop(cond, body, (_t(np.int32(0)), [_t(c) for c in c_leaves], ys0))
    return c_tree.unflatten(carry), y_tree.unflatten(ys)


def cond(pred, true_fun, false_fun, *operands):
    return switch(pred, [false_fun, true_fun], *operands, _is_pred=True)


def switch(index, branches, *operands, _is_pred=False):
    if not _stack():
        from ._api import Staged

        return Staged(lambda i, *o: switch(i, branches, *o, _is_pred=_is_pred),
                      name="switch")(index, *operands)
    comp = current_computation()
    leaves, tree = tree_util.tree_flatten(operands)
    ts = [_t(x) for x in leaves]
    avals = [(t.shape, t.dtype) for t in ts]
    traced = [_trace_sub(lambda a, b=b: b(*tree.unflatten(a)), avals, f"branch{k}", comp)
              for k, b in enumerate(branches)]
    out_sig = [(o.shape, o.dtype) for o in traced[0][1]]
    for c, outs, otree in traced[1:]:
        if otree != traced[0][2] or [(o.shape, o.dtype) for o in outs] != out_sig:
            raise TypeError("kiln.lax.cond/switch: branches must return the same structure and "
                            f"types, got {out_sig} and {[(o.shape, o.dtype) for o in outs]}")
    outer, seen = [], set()
    for c, _, _ in traced:
        for o, _l in c.captures:
            if id(o.instr) not in seen:
                seen.add(id(o.instr))
                outer.append(o)
    _align_captures([t[0] for t in traced], outer)
    for c, outs, _ in traced:
        r = c.add(list(out_sig), "tuple", [o.instr for o in outs])
        r.root = True
        c.finished = True
    state = avals + [(o.shape, o.dtype) for o in outer]
    tup = comp.add(list(state), "tuple", [t.instr for t in ts] + [o.instr for o in outer])
    if _is_pred:
        p = _t(index)
        if p.dtype != _dtypes.bool_:
            p = ne(p, _t(np.zeros((), p.dtype)))
        if p.shape != ():
            raise TypeError(f"kiln.lax.cond: the predicate must be a scalar, got {p.shape}")
        attrs = f", true_computation={traced[1][0].name}, false_computation={traced[0][0].name}"
    else:
        p = convert(_t(index), _dtypes.int32)
        nb = len(branches)
        p = clamp(_t(np.int32(0)), p, _t(np.int32(nb - 1)))
        attrs = ", branch_computations={" + ", ".join(t[0].name for t in traced) + "}"
    r = Tracer(comp.add(list(out_sig), "conditional", [p.instr] + [tup] * len(branches), attrs))
    return traced[0][2].unflatten([_gte(r, i) for i in range(len(out_sig))])


def map(f, xs):  # noqa: A001
    _, ys = scan(lambda c, x: (c, f(x)), (), xs)
    return ys




def with_sharding_constraint(x, shardings):
    return x


# ---- convolutions ---------------------------------------------------------------

class ConvDimensionNumbers(tuple):
    """(lhs_spec, rhs_spec, out_spec), each a tuple of dimension numbers:
    lhs (batch, feature, spatial...), rhs (out feature, in feature,
    spatial...), out (batch, feature, spatial...), as JAX's."""

    def __new__(cls, lhs_spec, rhs_spec, out_spec):
        return super().__new__(cls, (tuple(lhs_spec), tuple(rhs_spec), tuple(out_spec)))

    lhs_spec = property(lambda self: self[0])
    rhs_spec = property(lambda self: self[1])
    out_spec = property(lambda self: self[2])


def conv_dimension_numbers(lhs_shape, rhs_shape, dimension_numbers):
    """ConvDimensionNumbers from None (NC01.., OI01.., NC01..), a triple of
    strings such as ('NHWC', 'HWIO', 'NHWC'), or dimension-number tuples."""
    nd = len(lhs_shape)
    if len(rhs_shape) != nd:
        raise TypeError(f"kiln.lax.conv_general_dilated: lhs of rank {nd} and rhs of rank "
                        f"{len(rhs_shape)}; they must have the same rank")
    if dimension_numbers is None:
        iota_ = tuple(range(nd))
        return ConvDimensionNumbers(iota_, iota_, iota_)
    if isinstance(dimension_numbers, ConvDimensionNumbers) or (
            len(dimension_numbers) == 3
            and all(not isinstance(s, str) for s in dimension_numbers)):
        return ConvDimensionNumbers(*dimension_numbers)
    lhs, rhs, out = dimension_numbers
    if not (len(lhs) == len(rhs) == len(out) == nd):
        raise TypeError(f"kiln.lax.conv_general_dilated: dimension_numbers {dimension_numbers} "
                        f"do not match rank {nd}")
    if set(lhs) - set(rhs) - {"N", "C"} or set(out) - set(rhs) - {"N", "C"}:
        raise TypeError(f"kiln.lax.conv_general_dilated: the spatial letters of "
                        f"{dimension_numbers} differ between lhs, rhs and out")

    def spec(s, a, b):
        spatial = sorted((i for i, c in enumerate(s) if c not in (a, b)),
                         key=lambda i: rhs.index(s[i]))
        return (s.index(a), s.index(b)) + tuple(spatial)

    return ConvDimensionNumbers(spec(lhs, "N", "C"), spec(rhs, "O", "I"), spec(out, "N", "C"))


def padtype_to_pads(in_shape, window_shape, window_strides, padding):
    """Explicit (lo, hi) pairs for 'SAME' / 'SAME_LOWER' / 'VALID' (JAX's)."""
    p = padding.upper()
    if p == "VALID":
        return [(0, 0)] * len(in_shape)
    if p not in ("SAME", "SAME_LOWER"):
        raise ValueError(f"kiln.lax: unknown padding {padding!r} (SAME, SAME_LOWER or VALID)")
    pads = []
    for n, w, s in zip(in_shape, window_shape, window_strides):
        out = -(-n // s)
        tot = builtins.max(0, (out - 1) * s + w - n)
        lo = tot // 2 if p == "SAME" else tot - tot // 2
        pads.append((lo, tot - lo))
    return pads


@primitive
def _conv(lhs, rhs, strides, padding, lhs_dil, rhs_dil, dn, fgc, bgc, out_dtype):
    lhs, rhs = _t(lhs), _t(rhs)
    ls, rs, os_ = dn
    nsp = lhs.ndim - 2
    cin, cout = lhs.shape[ls[1]], rhs.shape[rs[0]]
    if rhs.shape[rs[1]] * fgc != cin:
        _err("conv_general_dilated", f"lhs has {cin} features, the kernel takes "
             f"{rhs.shape[rs[1]]} input features with feature_group_count {fgc}", lhs, rhs)
    if cout % fgc or cout % bgc or lhs.shape[ls[0]] % bgc:
        _err("conv_general_dilated", f"the kernel's {cout} output features (and the lhs "
             f"batch) must divide by feature_group_count {fgc} and batch_group_count {bgc}",
             lhs, rhs)
    out = [0] * lhs.ndim
    out[os_[0]] = lhs.shape[ls[0]] // bgc
    out[os_[1]] = cout
    for i in range(nsp):
        n, k = lhs.shape[ls[2 + i]], rhs.shape[rs[2 + i]]
        lo, hi = padding[i]
        nd_ = (n - 1) * lhs_dil[i] + 1 + lo + hi if n else 0
        kd = (k - 1) * rhs_dil[i] + 1
        if nd_ < kd or strides[i] < 1:
            _err("conv_general_dilated", f"spatial dimension {i}: the padded input ({nd_}) is "
                 f"smaller than the dilated window ({kd})", lhs, rhs)
        out[os_[2 + i]] = (nd_ - kd) // strides[i] + 1

    def labels(spec, a, b):
        s = [""] * lhs.ndim
        s[spec[0]], s[spec[1]] = a, b
        for i in range(nsp):
            s[spec[2 + i]] = str(i)
        return "".join(s)

    x = "x".join
    win = (f"size={x(str(rhs.shape[rs[2 + i]]) for i in range(nsp))} "
           f"stride={x(builtins.map(str, strides))} "
           f"pad={x(f'{lo}_{hi}' for lo, hi in padding)} "
           f"lhs_dilate={x(builtins.map(str, lhs_dil))} rhs_dilate={x(builtins.map(str, rhs_dil))}")
    dt = _dtypes.canonical(out_dtype) if out_dtype is not None else lhs.dtype
    if rhs.dtype != lhs.dtype:
        rhs = convert(rhs, lhs.dtype)
    attrs = (f", window={{{win}}}, dim_labels={labels(ls, 'b', 'f')}_{labels(rs, 'o', 'i')}->"
             f"{labels(os_, 'b', 'f')}")
    if fgc != 1:
        attrs += f", feature_group_count={fgc}"
    if bgc != 1:
        attrs += f", batch_group_count={bgc}"
    if nsp == 0:
        attrs = attrs.replace("window={size= stride= pad= lhs_dilate= rhs_dilate=}, ", "")
    return emit("convolution", [lhs, rhs], out, dt, attrs)


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
                         batch_group_count=1, precision=None, preferred_element_type=None):
    """A general convolution (HLO convolution), with JAX's arguments."""
    (lshape, ldt), (rshape, _) = aval_of(lhs), aval_of(rhs)
    if not _dtypes.is_float(ldt):
        raise TypeError(f"kiln.lax.conv_general_dilated: lhs of dtype {ldt}; floating point "
                        "is required")
    dn = conv_dimension_numbers(lshape, rshape, dimension_numbers)
    nsp = len(lshape) - 2
    if nsp < 0:
        raise TypeError(f"kiln.lax.conv_general_dilated: operands of rank {len(lshape)}; "
                        "at least 2 (batch and feature) are needed")
    strides = tuple(int(s) for s in window_strides) if window_strides else (1,) * nsp
    lhs_dil = tuple(int(d) for d in lhs_dilation) if lhs_dilation else (1,) * nsp
    rhs_dil = tuple(int(d) for d in rhs_dilation) if rhs_dilation else (1,) * nsp
    for what, v in (("window_strides", strides), ("lhs_dilation", lhs_dil),
                    ("rhs_dilation", rhs_dil)):
        if len(v) != nsp:
            raise TypeError(f"kiln.lax.conv_general_dilated: {what} {v} has {len(v)} entries "
                            f"for {nsp} spatial dimensions")
    if isinstance(padding, str):
        if builtins.any(d != 1 for d in lhs_dil) and padding.upper() != "VALID":
            raise NotImplementedError("kiln.lax.conv_general_dilated: string padding with "
                                      "lhs_dilation (give explicit pads, or use conv_transpose)")
        ksz = [(rshape[dn[1][2 + i]] - 1) * rhs_dil[i] + 1 for i in range(nsp)]
        padding = padtype_to_pads([lshape[dn[0][2 + i]] for i in range(nsp)], ksz, strides,
                                  padding)
    padding = tuple((int(lo), int(hi)) for lo, hi in padding)
    if len(padding) != nsp:
        raise TypeError(f"kiln.lax.conv_general_dilated: padding {padding} has {len(padding)} "
                        f"entries for {nsp} spatial dimensions")
    return _conv(lhs, rhs, strides, padding, lhs_dil, rhs_dil, dn, int(feature_group_count),
                 int(batch_group_count), preferred_element_type)


def conv(lhs, rhs, window_strides, padding, precision=None, preferred_element_type=None):
    return conv_general_dilated(lhs, rhs, window_strides, padding,
                                preferred_element_type=preferred_element_type)


def conv_with_general_padding(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                              precision=None, preferred_element_type=None):
    return conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                                preferred_element_type=preferred_element_type)


def _conv_transpose_padding(k, s, padding):
    if padding == "SAME":
        pad_len = k + s - 2
        pad_a = k - 1 if s > k - 1 else -(-pad_len // 2)
    elif padding == "VALID":
        pad_len = k + s - 2 + builtins.max(k - s, 0)
        pad_a = k - 1
    else:
        raise ValueError(f"kiln.lax.conv_transpose: unknown padding {padding!r}")
    return pad_a, pad_len - pad_a


def conv_transpose(lhs, rhs, strides, padding, rhs_dilation=None, dimension_numbers=None,
                   transpose_kernel=False, precision=None, preferred_element_type=None):
    """The gradient-of-convolution shaped transpose (JAX's conv_transpose):
    a convolution of the lhs dilated by the strides."""
    (lshape, _), (rshape, _) = aval_of(lhs), aval_of(rhs)
    nd = len(lshape)
    if dimension_numbers is None:
        if nd == 3:
            dimension_numbers = ("NHC", "HIO", "NHC")
        elif nd == 4:
            dimension_numbers = ("NHWC", "HWIO", "NHWC")
        elif nd == 5:
            dimension_numbers = ("NHWDC", "HWDIO", "NHWDC")
        else:
            raise TypeError(f"kiln.lax.conv_transpose: rank {nd}; give dimension_numbers")
    dn = conv_dimension_numbers(lshape, rshape, dimension_numbers)
    nsp = nd - 2
    rhs_dil = tuple(rhs_dilation) if rhs_dilation else (1,) * nsp
    k_sdims = [rshape[d] for d in dn[1][2:]]
    if isinstance(padding, str):
        kd = [(k - 1) * r + 1 for k, r in zip(k_sdims, rhs_dil)]
        pads = [_conv_transpose_padding(k, s, padding.upper()) for k, s in zip(kd, strides)]
    else:
        pads = padding
    if transpose_kernel:
        rhs = rev(rhs, tuple(dn[1][2:]))
        rs = list(dn[1])
        rs[0], rs[1] = rs[1], rs[0]
        dn = ConvDimensionNumbers(dn[0], rs, dn[2])
    return conv_general_dilated(lhs, rhs, (1,) * nsp, pads, lhs_dilation=tuple(strides),
                                rhs_dilation=rhs_dil, dimension_numbers=dn,
                                preferred_element_type=preferred_element_type)


# ---- associative_scan -------------------------------------------------------------

def associative_scan(fn, elems, reverse=False, axis=0):
    """Inclusive prefix scan with an associative fn over a pytree of arrays
    along axis (JAX's semantics): the parallel odd/even recursion, log2(n)
    levels of elementwise fn applications, traced into the program."""
    leaves, tree = tree_util.tree_flatten(elems)
    if not leaves:
        return elems
    leaves = [_t(x) if _stack() else x for x in leaves]
    shapes = [aval_of(x)[0] for x in leaves]
    nd = len(shapes[0])
    if not -nd <= axis < nd:
        raise ValueError(f"kiln.lax.associative_scan: axis {axis} is out of range for rank {nd}")
    axis %= nd
    n = shapes[0][axis]
    if any(len(s) <= axis or s[axis] != n for s in shapes):
        raise ValueError("kiln.lax.associative_scan: the elements differ in length along axis "
                         f"{axis}: {[s[axis] if len(s) > axis else None for s in shapes]}")
    from . import numpy as knp

    def sl(xs, start, stop, step=1):
        out = []
        for x in xs:
            s = aval_of(x)[0]
            st = [0] * len(s)
            lim = list(s)
            strd = [1] * len(s)
            st[axis] = start
            lim[axis] = stop if stop is not None else s[axis]
            strd[axis] = step
            lim[axis] = builtins.max(lim[axis], start)
            out.append(slice(x, st, lim, strd))
        return out

    def combine(a, b):
        r = fn(tree.unflatten(a), tree.unflatten(b))
        rl = tree_util.tree_leaves(r)
        if len(rl) != len(a):
            raise TypeError("kiln.lax.associative_scan: fn must return the elements' structure")
        return rl

    def interleave(a, b):  # a[0], b[0], a[1], b[1], ... ; len(a) is len(b) or len(b) + 1
        na = aval_of(a)[0][axis]
        nb = aval_of(b)[0][axis]
        if na == nb + 1:
            pad_cfg = [(0, 0, 0)] * len(aval_of(b)[0])
            pad_cfg[axis] = (0, 1, 0)
            b = pad(b, np.zeros((), aval_of(b)[1]), pad_cfg)
        st = knp.stack([a, b], axis=axis + 1)
        s = list(aval_of(a)[0])
        s[axis] = 2 * na
        r = reshape(st, s)
        return sl([r], 0, na + nb)[0]

    def scan(xs):
        m = aval_of(xs[0])[0][axis]
        if m < 2:
            return xs
        reduced = combine(sl(xs, 0, m - 1, 2), sl(xs, 1, m, 2))
        odd = scan(reduced)
        if m % 2 == 0:
            even = combine(sl(odd, 0, aval_of(odd[0])[0][axis] - 1), sl(xs, 2, m, 2))
        else:
            even = combine(odd, sl(xs, 2, m, 2))
        even = [concatenate([f, e], axis) for f, e in zip(sl(xs, 0, 1), even)]
        return [interleave(e, o) for e, o in zip(even, odd)]

    if reverse:
        leaves = [rev(x, (axis,)) for x in leaves]
    out = scan(leaves)
    if reverse:
        out = [rev(x, (axis,)) for x in out]
    return tree.unflatten(out)
