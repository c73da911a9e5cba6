"""kiln.numpy: jax.numpy's functions over kiln.lax.

numpy semantics (broadcasting, promotion without x64, axis and keepdims),
Python scalars weakly typed as in JAX (x_f16 * 2.0 stays float16). Every
function works inside a trace and, on concrete arrays, runs on kilnd
primitive by primitive.
"""
import builtins
import math

import numpy as _onp

from .. import _dtypes, lax
from .._client import Array as ndarray  # noqa: F401
from .._core import ArrayOps, Tracer, _stack, aval_of

float16 = _dtypes.float16
float32 = _dtypes.float32
float64 = _dtypes.float64
bfloat16 = _dtypes.bfloat16
int8, int16, int32, int64 = _dtypes.int8, _dtypes.int16, _dtypes.int32, _dtypes.int64
uint8, uint16, uint32 = _dtypes.uint8, _dtypes.uint16, _dtypes.uint32
bool_ = _dtypes.bool_
complex64 = _dtypes.complex64
pi, e, inf, nan = _onp.pi, _onp.e, _onp.inf, _onp.nan
newaxis = None
dtype = _onp.dtype
finfo = _dtypes.finfo
iinfo = _dtypes.iinfo
issubdtype = _onp.issubdtype
floating, integer, inexact, number = _onp.floating, _onp.integer, _onp.inexact, _onp.number


def _is_weak(x):
    return isinstance(x, (bool, int, float, complex)) and not isinstance(x, _onp.generic)


def _arr(x):
    """x as something lax takes: kiln arrays stay, Python and numpy values
    become numpy arrays of their canonical dtype."""
    if isinstance(x, ArrayOps):
        return x
    a = _onp.asarray(x)
    return a.astype(_dtypes.canonical(a.dtype), copy=False)


def _dt(x):
    return aval_of(x)[1]


def _shape(x):
    return aval_of(x)[0]


def result_type(*xs):
    strong = [_dt(x) for x in xs if not _is_weak(x)]
    weak = [x for x in xs if _is_weak(x)]
    if not strong:
        return _dtypes.result_type(*[_dt(x) for x in xs])
    d = _dtypes.result_type(*strong)
    for w in weak:
        if isinstance(w, complex) and d.kind != "c":
            d = complex64
        elif isinstance(w, float) and not _dtypes.is_float(d):
            d = float32
        elif isinstance(w, int) and not isinstance(w, bool) and d == bool_:
            d = int32
    return d


def _promote(*xs):
    d = result_type(*xs)
    return [asarray(x, dtype=d) for x in xs]


def broadcast_shapes(*shapes):
    nd = builtins.max(len(s) for s in shapes) if shapes else 0
    out = []
    for i in range(nd):
        dims = {s[len(s) - nd + i] for s in shapes if len(s) - nd + i >= 0} - {1}
        if len(dims) > 1:
            raise ValueError(f"kiln.numpy: shapes {', '.join(map(str, shapes))} cannot be "
                             "broadcast together")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def broadcast_to(x, shape):
    x = _arr(x)
    shape = tuple(shape)
    s = _shape(x)
    if s == shape:
        return x
    if len(s) > len(shape) or broadcast_shapes(s, shape) != shape:
        raise ValueError(f"kiln.numpy.broadcast_to: cannot broadcast {s} to {shape}")
    return lax.broadcast_in_dim(x, shape, tuple(range(len(shape) - len(s), len(shape))))


def _bcast(*xs):
    shape = broadcast_shapes(*[_shape(x) for x in xs])
    return [broadcast_to(x, shape) for x in xs]


def asarray(a, dtype=None, copy=None):
    if isinstance(a, (list, tuple)) and any(isinstance(v, ArrayOps) for v in _flat(a)):
        return stack([asarray(v, dtype) for v in a])
    if isinstance(a, ArrayOps):
        if dtype is not None and _dtypes.canonical(dtype) != a.dtype:
            return lax.convert_element_type(a, _dtypes.canonical(dtype))
        return a
    x = _onp.asarray(a, dtype=dtype)
    x = x.astype(_dtypes.canonical(x.dtype), copy=False)
    if _stack():
        return x  # a constant of the trace
    from .._client import Array, connection

    # held by the client until a call uses it (as a literal, or uploaded
    # once if large): an op that refuses its shapes has sent nothing
    return Array._from_value(connection(), x)


def _flat(a):
    for v in a:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        else:
            yield v


array = asarray


def _bin(laxfn, name):
    def f(x, y):
        a, b = _bcast(*_promote(x, y))
        return laxfn(a, b)

    f.__name__ = name
    return f


add = _bin(lax.add, "add")
subtract = _bin(lax.sub, "subtract")
multiply = _bin(lax.mul, "multiply")
maximum = _bin(lax.max, "maximum")
minimum = _bin(lax.min, "minimum")
arctan2 = _bin(lax.atan2, "arctan2")
bitwise_and = _bin(lax.bitwise_and, "bitwise_and")
bitwise_or = _bin(lax.bitwise_or, "bitwise_or")
bitwise_xor = _bin(lax.bitwise_xor, "bitwise_xor")
logical_and = _bin(lax.bitwise_and, "logical_and")
logical_or = _bin(lax.bitwise_or, "logical_or")
logical_xor = _bin(lax.bitwise_xor, "logical_xor")


def _cmp(laxfn, name):
    def f(x, y):
        a, b = _bcast(*_promote(x, y))
        return laxfn(a, b)

    f.__name__ = name
    return f


equal = _cmp(lax.eq, "equal")
not_equal = _cmp(lax.ne, "not_equal")
less = _cmp(lax.lt, "less")
less_equal = _cmp(lax.le, "less_equal")
greater = _cmp(lax.gt, "greater")
greater_equal = _cmp(lax.ge, "greater_equal")


def _float_promote(x, y=None):
    xs = [x] if y is None else [x, y]
    d = result_type(*xs)
    if not _dtypes.is_float(d):
        d = float32
    return [asarray(v, dtype=d) for v in xs]


def divide(x, y):
    a, b = _bcast(*_float_promote(x, y))
    return lax.div(a, b)


true_divide = divide


def floor_divide(x, y):
    a, b = _bcast(*_promote(x, y))
    if _dtypes.is_float(_dt(a)):
        return lax.floor(lax.div(a, b))
    q = lax.div(a, b)
    # round toward -inf where the remainder is nonzero and signs differ
    r = lax.rem(a, b)
    zero = zeros_like(r)
    fix = lax.bitwise_and(lax.ne(r, zero), lax.ne(lax.lt(r, zero), lax.lt(b, zeros_like(b))))
    return where(fix, lax.sub(q, ones_like(q)), q)


def remainder(x, y):
    a, b = _bcast(*_promote(x, y))
    r = lax.rem(a, b)
    zero = zeros_like(r)
    fix = lax.bitwise_and(lax.ne(r, zero), lax.ne(lax.lt(r, zero), lax.lt(b, zeros_like(b))))
    return where(fix, lax.add(r, b), r)


mod = remainder


def fmod(x, y):
    a, b = _bcast(*_promote(x, y))
    return lax.rem(a, b)


def power(x, y):
    if isinstance(y, int) and not isinstance(y, bool) and 0 <= y <= 4:
        x = _arr(x)
        if y == 0:
            return ones_like(x)
        r = x
        for _ in range(y - 1):
            r = lax.mul(r, x)
        return r
    a, b = _bcast(*_promote(x, y))
    return lax.pow(a, b)


def _un(laxfn, name, to_float=True):
    def f(x):
        x = _arr(x)
        if to_float and not _dtypes.is_float(_dt(x)):
            x = asarray(x, float32)
        return laxfn(x)

    f.__name__ = name
    return f


exp = _un(lax.exp, "exp")
expm1 = _un(lax.expm1, "expm1")
log = _un(lax.log, "log")
log1p = _un(lax.log1p, "log1p")
sin = _un(lax.sin, "sin")
cos = _un(lax.cos, "cos")
tan = _un(lax.tan, "tan")
tanh = _un(lax.tanh, "tanh")
sqrt = _un(lax.sqrt, "sqrt")
cbrt = _un(lax.cbrt, "cbrt")
floor = _un(lax.floor, "floor")
ceil = _un(lax.ceil, "ceil")
negative = _un(lax.neg, "negative", False)
sign = _un(lax.sign, "sign", False)
isfinite = _un(lax.is_finite, "isfinite")


def abs(x):  # noqa: A001
    x = _arr(x)
    if _dt(x) == bool_ or _dt(x).kind == "u":
        return x
    return lax.abs(x)


absolute = abs


def real(x):
    x = _arr(x)
    return lax.real(x) if _dt(x).kind == "c" else x


def imag(x):
    x = _arr(x)
    return lax.imag(x) if _dt(x).kind == "c" else zeros_like(x)


def conj(x):
    return lax.conj(_arr(x))


conjugate = conj


def angle(z, deg=False):
    z = _arr(z)
    if _dt(z).kind == "c":
        a = lax.atan2(lax.imag(z), lax.real(z))
    else:
        z = z if _dtypes.is_float(_dt(z)) else asarray(z, float32)
        a = lax.atan2(zeros_like(z), z)
    return a * (180 / pi) if deg else a


def round(x, decimals=0):  # noqa: A001
    x = _arr(x)
    if not _dtypes.is_float(_dt(x)):
        return x
    if decimals == 0:
        return lax.round(x)
    f = 10.0 ** decimals
    return divide(lax.round(multiply(x, f)), f)


around = round


def rint(x):
    return round(x)


def log2(x): return divide(log(x), math.log(2.0))
def log10(x): return divide(log(x), math.log(10.0))
def exp2(x): return exp(multiply(_float_promote(x)[0], math.log(2.0)))
def square(x): return multiply(x, x)
def reciprocal(x): return divide(1.0, x)
def sinh(x): return multiply(subtract(exp(x), exp(negative(x))), 0.5)
def cosh(x): return multiply(add(exp(x), exp(negative(x))), 0.5)
def arcsinh(x): return log(add(x, sqrt(add(multiply(x, x), 1.0))))
def logaddexp(x, y):
    m = maximum(x, y)
    return add(m, log1p(exp(negative(abs(subtract(x, y))))))


def invert(x):
    return lax.bitwise_not(_arr(x))


bitwise_not = invert
logical_not = invert


def isnan(x):
    x = _arr(x)
    return not_equal(x, x)


def isinf(x):
    x = _arr(x)
    if not _dtypes.is_float(_dt(x)):
        return zeros(_shape(x), bool_)
    return equal(abs(x), inf)


def where(condition, x=None, y=None):
    if x is None and y is None:
        raise NotImplementedError("kiln.numpy.where with one argument (data-dependent shape)")
    c = asarray(condition, bool_) if _dt(condition) != bool_ else _arr(condition)
    a, b = _promote(x, y)
    c, a, b = _bcast(c, a, b)
    return lax.select(c, a, b)


def clip(x, a_min=None, a_max=None, min=None, max=None):  # noqa: A002
    a_min = min if a_min is None else a_min
    a_max = max if a_max is None else a_max
    x = _arr(x)
    if a_min is not None:
        x = maximum(x, a_min)
    if a_max is not None:
        x = minimum(x, a_max)
    return x


# ---- creation ---------------------------------------------------------------------

def full(shape, fill_value, dtype=None):
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    d = _dtypes.canonical(dtype) if dtype is not None else (
        result_type(fill_value) if not isinstance(fill_value, ArrayOps) else _dt(fill_value))
    v = asarray(fill_value, d) if isinstance(fill_value, ArrayOps) else _onp.asarray(fill_value, d)
    return lax.broadcast_in_dim(v, shape, tuple(range(len(shape) - len(_shape(v)), len(shape))))


def zeros(shape, dtype=None): return full(shape, 0, dtype or float32)
def ones(shape, dtype=None): return full(shape, 1, dtype or float32)
def empty(shape, dtype=None): return zeros(shape, dtype)
def full_like(a, fill_value, dtype=None, shape=None):
    return full(_shape(a) if shape is None else shape, fill_value, dtype or _dt(a))
def zeros_like(a, dtype=None, shape=None): return full_like(a, 0, dtype, shape)
def ones_like(a, dtype=None, shape=None): return full_like(a, 1, dtype, shape)
def empty_like(a, dtype=None, shape=None): return zeros_like(a, dtype, shape)


def arange(start, stop=None, step=None, dtype=None):
    for v in (start, stop, step):
        if isinstance(v, Tracer):
            raise TypeError("kiln.numpy.arange: the bounds must be concrete (not traced values)")
    return asarray(_onp.arange(start, stop, step, dtype=dtype))


def linspace(start, stop, num=50, endpoint=True, dtype=None):
    return asarray(_onp.linspace(start, stop, num, endpoint=endpoint).astype(dtype or float32))


def eye(N, M=None, k=0, dtype=None):
    return asarray(_onp.eye(N, M, k, dtype=dtype or float32))


def identity(n, dtype=None):
    return eye(n, dtype=dtype)


def tri(N, M=None, k=0, dtype=None):
    return asarray(_onp.tri(N, M, k, dtype=dtype or float32))


def tril(m, k=0):
    m = _arr(m)
    s = _shape(m)
    mask = _onp.tri(s[-2], s[-1], k, dtype=bool)
    return where(mask, m, zeros_like(m))


def triu(m, k=0):
    m = _arr(m)
    s = _shape(m)
    mask = ~_onp.tri(s[-2], s[-1], k - 1, dtype=bool)
    return where(mask, m, zeros_like(m))


# ---- shapes -----------------------------------------------------------------------

def _axis(a, nd):
    if not -nd <= a < builtins.max(nd, 1):
        raise ValueError(f"kiln.numpy: axis {a} is out of bounds for an array of rank {nd}")
    return a % builtins.max(nd, 1)


def _axes(axis, nd):
    if axis is None:
        return tuple(range(nd))
    if isinstance(axis, int):
        axis = (axis,)
    return tuple(_axis(a, nd) for a in axis)


def reshape(a, newshape, order="C"):
    a = _arr(a)
    newshape = (newshape,) if isinstance(newshape, int) else tuple(newshape)
    n = int(_onp.prod(_shape(a), dtype=_onp.int64))
    if newshape.count(-1) > 1:
        raise ValueError("kiln.numpy.reshape: only one -1")
    if -1 in newshape:
        rest = int(_onp.prod([d for d in newshape if d != -1], dtype=_onp.int64))
        if rest == 0 or n % rest:
            raise ValueError(f"kiln.numpy.reshape: cannot reshape {_shape(a)} into {newshape}")
        newshape = tuple(n // rest if d == -1 else d for d in newshape)
    return lax.reshape(a, newshape)


def ravel(a):
    return reshape(a, (-1,))


def transpose(a, axes=None):
    a = _arr(a)
    nd = len(_shape(a))
    axes = tuple(reversed(range(nd))) if axes is None else tuple(_axis(x, nd) for x in axes)
    return lax.transpose(a, axes)


def permute_dims(a, axes):
    return transpose(a, axes)


def swapaxes(a, axis1, axis2):
    nd = len(_shape(a))
    p = list(range(nd))
    i, j = _axis(axis1, nd), _axis(axis2, nd)
    p[i], p[j] = p[j], p[i]
    return transpose(a, p)


def moveaxis(a, source, destination):
    nd = len(_shape(a))
    s, d = _axis(source, nd), _axis(destination, nd)
    p = [i for i in range(nd) if i != s]
    p.insert(d, s)
    return transpose(a, p)


def expand_dims(a, axis):
    a = _arr(a)
    s = list(_shape(a))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    nd = len(s) + len(axes)
    for ax in sorted(x % nd for x in axes):
        s.insert(ax, 1)
    return lax.reshape(a, tuple(s))


def squeeze(a, axis=None):
    a = _arr(a)
    s = _shape(a)
    if axis is None:
        axes = [i for i, d in enumerate(s) if d == 1]
    else:
        axes = list(_axes(axis, len(s)))
        for ax in axes:
            if s[ax] != 1:
                raise ValueError(f"kiln.numpy.squeeze: axis {ax} has size {s[ax]}, not 1")
    return lax.reshape(a, tuple(d for i, d in enumerate(s) if i not in axes))


def atleast_1d(a):
    a = _arr(a)
    return reshape(a, (1,)) if _shape(a) == () else a


def atleast_2d(a):
    a = atleast_1d(a)
    return expand_dims(a, 0) if len(_shape(a)) == 1 else a


def concatenate(arrays, axis=0):
    arrays = [_arr(a) for a in arrays]
    if axis is None:
        arrays = [ravel(a) for a in arrays]
        axis = 0
    d = result_type(*arrays)
    arrays = [asarray(a, d) for a in arrays]
    return lax.concatenate(arrays, _axis(axis, len(_shape(arrays[0]))))


def stack(arrays, axis=0):
    arrays = [_arr(a) for a in arrays]
    shapes = {_shape(a) for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"kiln.numpy.stack: arrays must have one shape, got {sorted(shapes)}")
    nd = len(_shape(arrays[0])) + 1
    return concatenate([expand_dims(a, axis % nd) for a in arrays], axis % nd)


def vstack(arrays):
    return concatenate([atleast_2d(a) for a in arrays], 0)


def hstack(arrays):
    arrays = [atleast_1d(a) for a in arrays]
    return concatenate(arrays, 0 if len(_shape(arrays[0])) == 1 else 1)


def split(a, indices_or_sections, axis=0):
    a = _arr(a)
    s = _shape(a)
    ax = _axis(axis, len(s))
    n = s[ax]
    if isinstance(indices_or_sections, int):
        if n % indices_or_sections:
            raise ValueError(f"kiln.numpy.split: {n} is not divisible into "
                             f"{indices_or_sections} equal sections")
        k = n // indices_or_sections
        bounds = list(range(0, n + 1, k))
    else:
        bounds = [0] + list(indices_or_sections) + [n]
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        start = [0] * len(s)
        limit = list(s)
        start[ax], limit[ax] = lo, builtins.max(lo, hi)
        out.append(lax.slice(a, start, limit))
    return out


def array_split(a, sections, axis=0):
    n = _shape(a)[axis]
    q, r = divmod(n, sections)
    bounds, acc = [], 0
    for i in range(sections - 1):
        acc += q + (1 if i < r else 0)
        bounds.append(acc)
    return split(a, bounds, axis)


def pad(array, pad_width, mode="constant", constant_values=0):
    if mode != "constant":
        raise NotImplementedError(f"kiln.numpy.pad: mode={mode!r} (only 'constant')")
    a = _arr(array)
    nd = len(_shape(a))
    pw = _onp.broadcast_to(_onp.asarray(pad_width, dtype=_onp.int64), (nd, 2))
    return lax.pad(a, _onp.asarray(constant_values, dtype=_dt(a)),
                   [(int(lo), int(hi), 0) for lo, hi in pw])


def flip(m, axis=None):
    m = _arr(m)
    return lax.rev(m, _axes(axis, len(_shape(m))))


def fliplr(m): return flip(m, 1)
def flipud(m): return flip(m, 0)


def roll(a, shift, axis=None):
    a = _arr(a)
    if axis is None:
        return reshape(roll(ravel(a), shift, 0), _shape(a))
    shifts = (shift,) if isinstance(shift, int) else tuple(shift)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for sh, ax in zip(shifts, axes):
        ax = _axis(ax, len(_shape(a)))
        n = _shape(a)[ax]
        if n == 0:
            continue
        k = sh % n
        if k:
            lo, hi = split(a, [n - k], ax)
            a = concatenate([hi, lo], ax)
    return a


def tile(a, reps):
    a = _arr(a)
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    s = _shape(a)
    nd = builtins.max(len(s), len(reps))
    s = (1,) * (nd - len(s)) + s
    reps = (1,) * (nd - len(reps)) + reps
    a = reshape(a, s)
    # broadcast to (r0, s0, r1, s1, ...) then merge
    big = []
    for r, d in zip(reps, s):
        big += [r, d]
    b = lax.broadcast_in_dim(a, big, tuple(range(1, 2 * nd, 2)))
    return reshape(b, tuple(r * d for r, d in zip(reps, s)))


def repeat(a, repeats, axis=None):
    a = _arr(a)
    if axis is None:
        a, axis = ravel(a), 0
    if not isinstance(repeats, int):
        raise NotImplementedError("kiln.numpy.repeat with per-element repeats")
    s = _shape(a)
    ax = _axis(axis, len(s))
    b = lax.broadcast_in_dim(a, s[:ax + 1] + (repeats,) + s[ax + 1:],
                             tuple(range(ax + 1)) + tuple(range(ax + 2, len(s) + 1)))
    return reshape(b, s[:ax] + (s[ax] * repeats,) + s[ax + 1:])


# ---- reductions -------------------------------------------------------------------

def _reduce(laxfn, a, axis, keepdims, dtype=None):
    a = _arr(a)
    if dtype is not None:
        a = asarray(a, dtype)
    s = _shape(a)
    axes = _axes(axis, len(s))
    r = laxfn(a, axes) if axes else a
    if keepdims:
        r = lax.reshape(r, tuple(1 if i in axes else d for i, d in enumerate(s)))
    return r


def sum(a, axis=None, dtype=None, keepdims=False):  # noqa: A001
    a = _arr(a)
    if dtype is None and (_dt(a) == bool_ or (_dtypes.is_int(_dt(a)) and _dt(a).itemsize < 4)):
        dtype = int32 if _dt(a).kind != "u" else uint32
    return _reduce(lax.reduce_sum, a, axis, keepdims, dtype)


def prod(a, axis=None, dtype=None, keepdims=False):
    a = _arr(a)
    if dtype is None and _dt(a) == bool_:
        dtype = int32
    return _reduce(lax.reduce_prod, a, axis, keepdims, dtype)


def max(a, axis=None, keepdims=False):  # noqa: A001
    return _reduce(lax.reduce_max, a, axis, keepdims)


def min(a, axis=None, keepdims=False):  # noqa: A001
    return _reduce(lax.reduce_min, a, axis, keepdims)


amax, amin = max, min


def all(a, axis=None, keepdims=False):  # noqa: A001
    return _reduce(lax.reduce_and, asarray(a, bool_), axis, keepdims)


def any(a, axis=None, keepdims=False):  # noqa: A001
    return _reduce(lax.reduce_or, asarray(a, bool_), axis, keepdims)


def _count(a, axis):
    s = _shape(a)
    return int(_onp.prod([s[i] for i in _axes(axis, len(s))], dtype=_onp.int64))


def mean(a, axis=None, dtype=None, keepdims=False):
    a = _arr(a)
    d = dtype or (_dt(a) if _dtypes.is_float(_dt(a)) else float32)
    s = sum(asarray(a, d), axis=axis, keepdims=keepdims)
    return divide(s, _onp.asarray(_count(a, axis), dtype=d))


def var(a, axis=None, dtype=None, ddof=0, keepdims=False):
    a = _arr(a)
    d = dtype or (_dt(a) if _dtypes.is_float(_dt(a)) else float32)
    a = asarray(a, d)
    m = mean(a, axis=axis, keepdims=True)
    c = subtract(a, m)
    s = sum(multiply(c, c), axis=axis, keepdims=keepdims)
    return divide(s, _onp.asarray(builtins.max(_count(a, axis) - ddof, 0), dtype=d))


def std(a, axis=None, dtype=None, ddof=0, keepdims=False):
    return sqrt(var(a, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims))


def _arg(laxfn, a, axis, keepdims):
    a = _arr(a)
    if axis is None:
        a, axis = ravel(a), 0
    s = _shape(a)
    ax = _axis(axis, len(s))
    r = laxfn(a, ax)
    if keepdims:
        r = lax.reshape(r, tuple(1 if i == ax else d for i, d in enumerate(s)))
    return r


def argmax(a, axis=None, keepdims=False): return _arg(lax.argmax, a, axis, keepdims)
def argmin(a, axis=None, keepdims=False): return _arg(lax.argmin, a, axis, keepdims)


def _cum(laxfn, a, axis, dtype):
    a = _arr(a)
    if dtype is not None:
        a = asarray(a, dtype)
    elif _dt(a) == bool_:
        a = asarray(a, int32)
    if axis is None:
        a, axis = ravel(a), 0
    return laxfn(a, _axis(axis, len(_shape(a))))


def cumsum(a, axis=None, dtype=None): return _cum(lax.cumsum, a, axis, dtype)
def cumprod(a, axis=None, dtype=None): return _cum(lax.cumprod, a, axis, dtype)


def logsumexp(a, axis=None, keepdims=False):
    from ..nn import logsumexp as f

    return f(a, axis=axis, keepdims=keepdims)


# ---- products ---------------------------------------------------------------------

def matmul(a, b):
    a, b = _promote(a, b)
    sa, sb = _shape(a), _shape(b)
    if not sa or not sb:
        raise ValueError("kiln.numpy.matmul: operands must not be scalars")
    va, vb = len(sa) == 1, len(sb) == 1
    if va:
        a, sa = reshape(a, (1,) + sa), (1,) + sa
    if vb:
        b, sb = reshape(b, sb + (1,)), sb + (1,)
    if sa[-1] != sb[-2]:
        raise ValueError(f"kiln.numpy.matmul: shapes {aval_of(a)[0]} and {aval_of(b)[0]}: "
                         f"contracting sizes {sa[-1]} and {sb[-2]} differ")
    batch = broadcast_shapes(sa[:-2], sb[:-2])
    a = broadcast_to(a, batch + sa[-2:])
    b = broadcast_to(b, batch + sb[-2:])
    nb = len(batch)
    r = lax.dot_general(a, b, (((nb + 1,), (nb,)), (tuple(range(nb)), tuple(range(nb)))))
    if va:
        r = squeeze(r, nb)
    if vb:
        r = squeeze(r, -1)
    return r


def dot(a, b):
    sa, sb = _shape(a), _shape(b)
    if not sa or not sb:
        return multiply(a, b)
    if len(sb) == 1 or len(sa) == 1 or len(sb) == 2:
        return matmul(a, b)
    return tensordot(a, b, ((len(sa) - 1,), (len(sb) - 2,)))


def vdot(a, b):
    return sum(multiply(ravel(a), ravel(b)))


def inner(a, b):
    return tensordot(a, b, ((len(_shape(a)) - 1,), (len(_shape(b)) - 1,)))


def outer(a, b):
    return multiply(reshape(a, (-1, 1)), reshape(b, (1, -1)))


def tensordot(a, b, axes=2):
    a, b = _promote(a, b)
    sa, sb = _shape(a), _shape(b)
    if isinstance(axes, int):
        ca, cb = tuple(range(len(sa) - axes, len(sa))), tuple(range(axes))
    else:
        ca, cb = axes
        ca = (ca,) if isinstance(ca, int) else tuple(ca)
        cb = (cb,) if isinstance(cb, int) else tuple(cb)
    ca = tuple(_axis(x, len(sa)) for x in ca)
    cb = tuple(_axis(x, len(sb)) for x in cb)
    return lax.dot_general(a, b, ((ca, cb), ((), ())))


def einsum(subscripts, *operands, optimize=None, precision=None):
    """Pairwise contraction, left to right, through dot_general."""
    ops = [_arr(o) for o in operands]
    spec = subscripts.replace(" ", "")
    if "..." in spec:
        raise NotImplementedError("kiln.numpy.einsum with '...'")
    if "->" in spec:
        ins, out = spec.split("->")
    else:
        ins = spec
        letters = ins.replace(",", "")
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    terms = ins.split(",")
    if len(terms) != len(ops):
        raise ValueError(f"kiln.numpy.einsum: {len(terms)} terms for {len(ops)} operands")
    d = result_type(*ops)
    ops = [asarray(o, d) for o in ops]
    for t, o in zip(terms, ops):
        if len(t) != len(_shape(o)):
            raise ValueError(f"kiln.numpy.einsum: term {t!r} for an operand of shape {_shape(o)}")

    def diag_and_sum(t, o, keep):
        # repeated letters inside one term: not supported; sum letters not kept
        if len(set(t)) != len(t):
            raise NotImplementedError("kiln.numpy.einsum: repeated index within one operand")
        drop = [i for i, c in enumerate(t) if c not in keep]
        if drop:
            o = lax.reduce_sum(o, drop)
            t = "".join(c for c in t if c in keep)
        return t, o

    t0, o0 = terms[0], ops[0]
    rest = list(zip(terms[1:], ops[1:]))
    needed_later = lambda k: set(out).union(*[set(t) for t, _ in rest[k:]])  # noqa: E731
    t0, o0 = diag_and_sum(t0, o0, needed_later(0) | set("".join(t for t, _ in rest)))
    for k, (t1, o1) in enumerate(rest):
        later = set(out).union(*[set(t) for t, _ in rest[k + 1:]])
        t1, o1 = diag_and_sum(t1, o1, later | set(t0))
        batch = [c for c in t0 if c in t1 and c in later]
        contract = [c for c in t0 if c in t1 and c not in later]
        dn = ((tuple(t0.index(c) for c in contract), tuple(t1.index(c) for c in contract)),
              (tuple(t0.index(c) for c in batch), tuple(t1.index(c) for c in batch)))
        o0 = lax.dot_general(o0, o1, dn)
        t0 = "".join(batch) + "".join(c for c in t0 if c not in batch and c not in contract) + \
            "".join(c for c in t1 if c not in batch and c not in contract)
    t0, o0 = diag_and_sum(t0, o0, set(out))
    return transpose(o0, [t0.index(c) for c in out]) if len(out) > 1 else o0


# ---- sorting, indexing --------------------------------------------------------------

def sort(a, axis=-1, kind=None, order=None, stable=True, descending=False):
    a = _arr(a)
    if axis is None:
        a, axis = ravel(a), 0
    r = lax.sort(a, _axis(axis, len(_shape(a))))
    return flip(r, axis) if descending else r


def argsort(a, axis=-1, kind=None, order=None, stable=True, descending=False):
    a = _arr(a)
    if axis is None:
        a, axis = ravel(a), 0
    ax = _axis(axis, len(_shape(a)))
    if descending:
        a = negative(a) if _dtypes.is_float(_dt(a)) else subtract(0, a)
    idx = lax.broadcasted_iota(int32, _shape(a), ax) if _stack() else _iota(_shape(a), ax)
    _, i = lax.sort((a, idx), ax, is_stable=True, num_keys=1)
    return i


def _iota(shape, ax):
    return asarray(_onp.broadcast_to(
        _onp.arange(shape[ax], dtype=_onp.int32).reshape([-1 if i == ax else 1
                                                          for i in range(len(shape))]), shape))


def take(a, indices, axis=None, mode=None):
    a = _arr(a)
    if axis is None:
        a, axis = ravel(a), 0
    ax = _axis(axis, len(_shape(a)))
    if ax != 0:
        a = moveaxis(a, ax, 0)
    r = lax._take0(a, _arr(indices))
    ni = len(_shape(indices))
    if ax != 0:
        # result dims: indices..., then a's dims without ax; move them into place
        nd = len(_shape(r))
        perm = list(range(ni, ni + ax)) + list(range(ni)) + list(range(ni + ax, nd))
        r = transpose(r, perm)
    return r


def take_along_axis(arr, indices, axis):
    arr = _arr(arr)
    s = _shape(arr)
    ax = _axis(axis, len(s))
    si = _shape(indices)
    # flatten: linear index = sum over dims of idx_d * stride_d, with the given
    # axis replaced by indices
    strides = [int(_onp.prod(s[i + 1:], dtype=_onp.int64)) for i in range(len(s))]
    out_shape = broadcast_shapes(si, tuple(1 if i == ax else d for i, d in enumerate(s)))
    lin = None
    for d in range(len(s)):
        if d == ax:
            idx = asarray(indices, int32)
            idx = where(less(idx, 0), add(idx, s[d]), idx)
        else:
            shp = [1] * len(s)
            shp[d] = s[d]
            idx = _onp.arange(s[d], dtype=_onp.int32).reshape(shp)
        term = multiply(idx, strides[d]) if strides[d] != 1 else idx
        lin = term if lin is None else add(lin, term)
    lin = broadcast_to(lin, out_shape)
    return reshape(take(ravel(arr), ravel(lin), axis=0), out_shape)


def _static_index(idx):
    def ok(i):
        return i is None or i is Ellipsis or isinstance(i, (int, builtins.slice, _onp.integer))
    return builtins.all(ok(i) for i in idx)


def _expand_index(idx, nd):
    if not isinstance(idx, tuple):
        idx = (idx,)
    n_real = builtins.sum(1 for i in idx if i is not None and i is not Ellipsis)
    if builtins.sum(1 for i in idx if i is Ellipsis) > 1:
        raise IndexError("kiln.numpy: an index can only have a single ellipsis")
    out = []
    for i in idx:
        if i is Ellipsis:
            out += [builtins.slice(None)] * (nd - n_real)
        else:
            out.append(i)
    n_real_now = builtins.sum(1 for i in out if i is not None)
    out += [builtins.slice(None)] * (nd - n_real_now)
    return out


def _getitem(a, idx):
    s = _shape(a)
    full = _expand_index(idx, len(s))
    if builtins.sum(1 for i in full if i is not None) > len(s):
        raise IndexError(f"kiln.numpy: too many indices for an array of shape {s}")
    if _static_index(full):
        starts, limits, strides, rev, out_shape, d = [], [], [], [], [], 0
        for i in full:
            if i is None:
                out_shape.append(1)
                continue
            n = s[d]
            if isinstance(i, builtins.slice):
                st, sp, k = i.indices(n)
                if k < 0:
                    # reversed slice: reverse the dim then slice forward
                    cnt = len(range(st, sp, k))
                    rev.append(d)
                    st2 = n - 1 - st
                    starts.append(st2)
                    limits.append(st2 + (cnt - 1) * (-k) + 1 if cnt else st2)
                    strides.append(-k)
                    out_shape.append(cnt)
                else:
                    cnt = len(range(st, sp, k))
                    starts.append(st)
                    limits.append(st + (cnt - 1) * k + 1 if cnt else st)
                    strides.append(k)
                    out_shape.append(cnt)
            else:
                i = int(i)
                if not -n <= i < n:
                    raise IndexError(f"kiln.numpy: index {i} is out of bounds for axis {d} "
                                     f"with size {n}")
                i %= n
                starts.append(i)
                limits.append(i + 1)
                strides.append(1)
            d += 1
        r = _arr(a)
        if rev:
            r = lax.rev(r, rev)
        if starts != [0] * len(s) or limits != list(s) or builtins.any(k != 1 for k in strides):
            r = lax.slice(r, starts, limits, strides)
        return lax.reshape(r, tuple(out_shape))
    # one integer-array index (the others full slices), or a scalar traced index
    arr_pos = [k for k, i in enumerate(full) if i is not None and not (
        isinstance(i, builtins.slice) and i == builtins.slice(None))]
    if len(arr_pos) == 1 and not builtins.any(i is None for i in full):
        k = arr_pos[0]
        ind = full[k]
        if isinstance(ind, (list, tuple)):
            ind = _onp.asarray(ind)
        if _dt(ind) == bool_:
            raise NotImplementedError("kiln.numpy: boolean mask indexing (data-dependent shape)")
        return take(a, ind, axis=k)
    raise NotImplementedError(f"kiln.numpy: indexing with {idx!r} (supported: ints, slices, "
                              "None, Ellipsis, and one integer array with the rest full slices)")


class _IndexUpdateRef:
    def __init__(self, a, idx):
        self.a, self.idx = a, idx

    def _flat_positions(self):
        s = _shape(self.a)
        n = int(_onp.prod(s, dtype=_onp.int64))
        idx = self.idx
        leaves = idx if isinstance(idx, tuple) else (idx,)
        if builtins.any(isinstance(i, ArrayOps) for i in leaves):
            return None
        pos = _onp.arange(n, dtype=_onp.int32).reshape(s)[idx]
        return pos

    def _apply(self, v, kind):
        a = _arr(self.a)
        pos = self._flat_positions()
        if pos is None:
            full = _expand_index(self.idx, len(_shape(a)))
            arr_pos = [k for k, i in enumerate(full)
                       if not (isinstance(i, builtins.slice) and i == builtins.slice(None))]
            if len(arr_pos) != 1 or arr_pos[0] != 0 or builtins.any(i is None for i in full):
                raise NotImplementedError(
                    "kiln.numpy: .at[] with a traced index is supported on the first axis only")
            ind = asarray(full[0], int32)
            s = _shape(a)
            rows = where(less(ind, 0), add(ind, s[0]), ind)
            inner = int(_onp.prod(s[1:], dtype=_onp.int64))
            ri = ravel(rows)
            pos = add(reshape(multiply(ri, inner), (-1, 1)),
                      _onp.arange(inner, dtype=_onp.int32).reshape(1, -1))
            shape_sel = _shape(rows) + s[1:]
        else:
            shape_sel = pos.shape
        v = broadcast_to(asarray(v, _dt(a)), shape_sel)
        flat = lax._scatter_flat(ravel(a), ravel(pos), ravel(v), kind)
        return reshape(flat, _shape(a))

    def set(self, v): return self._apply(v, "set")
    def add(self, v): return self._apply(v, "add")
    def multiply(self, v): return self._apply(v, "mul")
    mul = multiply
    def max(self, v): return self._apply(v, "max")
    def min(self, v): return self._apply(v, "min")
    def get(self): return _getitem(self.a, self.idx)


class _IndexUpdateHelper:
    def __init__(self, a):
        self.a = a

    def __getitem__(self, idx):
        return _IndexUpdateRef(self.a, idx)


# ---- misc -------------------------------------------------------------------------

def shape(a): return _shape(a)
def ndim(a): return len(_shape(a))
def size(a): return int(_onp.prod(_shape(a), dtype=_onp.int64))


def allclose(a, b, rtol=1e-5, atol=1e-8):
    return all(less_equal(abs(subtract(a, b)), add(atol, multiply(rtol, abs(b)))))


def isclose(a, b, rtol=1e-5, atol=1e-8):
    return less_equal(abs(subtract(a, b)), add(atol, multiply(rtol, abs(b))))


def array_equal(a, b):
    if _shape(a) != _shape(b):
        return False
    return all(equal(a, b))


def meshgrid(*xs, indexing="xy"):
    xs = [ravel(x) for x in xs]
    shapes = [_shape(x)[0] for x in xs]
    if indexing == "xy" and len(xs) >= 2:
        shapes[0], shapes[1] = shapes[1], shapes[0]
    out = []
    for k, x in enumerate(xs):
        d = k
        if indexing == "xy" and len(xs) >= 2 and k < 2:
            d = 1 - k
        out.append(lax.broadcast_in_dim(x, tuple(shapes), (d,)))
    return out


def diag(v, k=0):
    v = _arr(v)
    s = _shape(v)
    if len(s) == 1:
        n = s[0] + builtins.abs(k)
        i = _onp.arange(s[0])
        rows, cols = (i, i + k) if k >= 0 else (i - k, i)
        return zeros((n, n), _dt(v)).at[rows, cols].set(v)
    idx = _onp.arange(builtins.min(s[0], s[1] - k) if k >= 0 else builtins.min(s[0] + k, s[1]))
    r = idx if k >= 0 else idx - k
    c = idx + k if k >= 0 else idx
    return take(ravel(v), _onp.asarray(r * s[1] + c, dtype=_onp.int32))


def trace(a, offset=0):
    return sum(diag(a, offset))


from . import fft, linalg  # noqa: E402,F401
