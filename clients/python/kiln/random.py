"""kiln.random: JAX's threefry2x32 random numbers, computed on kilnd.

A key is what jax.random.PRNGKey gives: a uint32[2] array. Every function
here is written with kiln.lax primitives and staged as one jitted program
(shapes and dtypes static), so a call outside a trace is one Compile (cached)
and one Execute, and a call inside a traced function is inlined into it.

The algorithms follow JAX's documented ones with its default configuration
(jax_threefry_partitionable=True), so the same key gives the same bits:

  threefry2x32(k0, k1, x0, x1): the Threefry-2x32 block cipher with 20
    rounds (rotations 13 15 26 6 / 17 29 16 24), key schedule k0, k1,
    k0 ^ k1 ^ 0x1BD11BDA, and the round counter added every four rounds.
  PRNGKey(seed): [seed >> 32, seed & 0xFFFFFFFF] (a 32-bit seed: [0, seed]).
  random bits of shape S: the element at flat index i is the XOR of the two
    words threefry2x32(key, hi32(i), lo32(i)); 8- and 16-bit bits truncate it.
  split(key, S): the pair of words for flat index i is new key i.
  fold_in(key, d): threefry over the counts [0, d], split in halves.
  uniform: the top mantissa bits under exponent 0 (a float in [1, 2)), minus
    one, scaled into [minval, maxval); normal: sqrt(2) * erfinv of a uniform
    in (-1, 1) (XLA's single-precision polynomial); randint: two words per
    value reduced modulo the span; bernoulli: uniform < p; permutation:
    sorting by random 32-bit keys, ceil(3 ln n / ln(2^32 - 1)) rounds.

The integer results (bits, keys, randint, bernoulli, permutation) and uniform
are bit for bit JAX's. normal depends on the server's log1p and sqrt, which
may differ from XLA's by an ulp, so it matches JAX's to a few ulp.
"""
import math

import numpy as np

from . import _dtypes, lax
from . import numpy as jnp
from ._api import jit
from ._core import Tracer

__all__ = ["PRNGKey", "split", "fold_in", "bits", "uniform", "normal", "randint", "bernoulli",
           "permutation", "key_data"]

_U32 = np.dtype("uint32")
_UINT = {8: np.dtype("uint8"), 16: np.dtype("uint16"), 32: _U32}


def _full(v, dtype, shape):
    return lax.broadcast_in_dim(np.asarray(v, dtype=dtype), tuple(shape), ())


def _scalar_of(key, i):
    return lax.reshape(lax.slice(key, (i,), (i + 1,)), ())


def _rotl(v, r):
    s = v.shape
    return lax.bitwise_or(lax.shift_left(v, _full(r, _U32, s)),
                          lax.shift_right_logical(v, _full(32 - r, _U32, s)))


_ROT = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(k0, k1, x0, x1):
    """The threefry2x32 hash of the counter words (x0, x1) (uint32 tracers of
    one shape) under the key words k0, k1 (uint32 scalars)."""
    shape = x0.shape
    ks = [lax.broadcast_in_dim(k0, shape, ()), lax.broadcast_in_dim(k1, shape, ())]
    ks.append(lax.bitwise_xor(lax.bitwise_xor(ks[0], ks[1]), _full(0x1BD11BDA, _U32, shape)))
    x = [lax.add(x0, ks[0]), lax.add(x1, ks[1])]
    for block in range(5):
        for r in _ROT[block % 2]:
            x[0] = lax.add(x[0], x[1])
            x[1] = lax.bitwise_xor(x[0], _rotl(x[1], r))
        x[0] = lax.add(x[0], ks[(block + 1) % 3])
        x[1] = lax.add(lax.add(x[1], ks[(block + 2) % 3]), _full(block + 1, _U32, shape))
    return x[0], x[1]


def _check_key(name, key):
    from ._core import aval_of

    shape, dt = aval_of(key)
    if shape != (2,) or dt != _U32:
        raise TypeError(f"kiln.random.{name}: a key is a uint32[2] array (from PRNGKey or "
                        f"split); got {dt}{list(shape)}")


def _canon_shape(shape, name):
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"kiln.random.{name}: shape must be a tuple of ints, got {shape!r}") \
            from None
    if any(d < 0 for d in shape):
        raise ValueError(f"kiln.random.{name}: negative dimension in shape {shape}")
    return shape


def _counter_words(shape):
    """The high and low 32 bits of the row-major index of each element."""
    n = math.prod(shape)
    if n >= 2 ** 32:
        raise NotImplementedError("kiln.random: more than 2**32 values in one call")
    if not shape:
        return _full(0, _U32, ()), _full(0, _U32, ())
    lo = lax.reshape(lax.iota(_U32, n), shape) if n else _full(0, _U32, shape)
    return _full(0, _U32, shape), lo


def _hash_shape(key, shape):
    hi, lo = _counter_words(shape)
    return _threefry2x32(_scalar_of(key, 0), _scalar_of(key, 1), hi, lo)


def _bits(key, width, shape):
    b0, b1 = _hash_shape(key, shape)
    b = lax.bitwise_xor(b0, b1)
    return b if width == 32 else lax.convert_element_type(b, _UINT[width])


def _split_impl(key, shape):
    b0, b1 = _hash_shape(key, shape)
    return lax.concatenate([lax.reshape(b0, shape + (1,)), lax.reshape(b1, shape + (1,))],
                           len(shape))


_split_j = jit(_split_impl, static_argnums=(1,))


def _stage(f, static):
    return jit(f, static_argnums=static)


# ---- keys --------------------------------------------------------------------------

def PRNGKey(seed):  # noqa: N802  (JAX's name)
    """A key from an integer seed: [seed >> 32, seed & 0xFFFFFFFF]."""
    if isinstance(seed, Tracer):
        if not np.issubdtype(seed.dtype, np.integer) or seed.shape:
            raise TypeError(f"kiln.random.PRNGKey: the seed must be an integer scalar, got "
                            f"{seed.dtype}{list(seed.shape)}")
        lo = lax.reshape(lax.convert_element_type(seed, _U32), (1,))
        return lax.concatenate([_full(0, _U32, (1,)), lo], 0)
    s = np.asarray(seed)
    if s.shape or not np.issubdtype(s.dtype, np.integer):
        raise TypeError(f"kiln.random.PRNGKey: the seed must be an integer scalar, got {seed!r}")
    v = int(s)
    if not -2 ** 63 <= v < 2 ** 64:
        raise OverflowError(f"kiln.random.PRNGKey: seed {v} does not fit in 64 bits")
    if s.dtype.itemsize < 8 or isinstance(seed, int) and -2 ** 31 <= v < 2 ** 31:
        # 32-bit seeds (Python ints become int32, as in JAX without x64)
        if isinstance(seed, int) and not -2 ** 31 <= v < 2 ** 31:
            raise OverflowError(f"kiln.random.PRNGKey: seed {v} does not fit in int32 "
                                "(JAX without x64 refuses it too)")
        k = np.array([0, v & 0xFFFFFFFF], _U32)
    else:
        v &= 0xFFFFFFFFFFFFFFFF
        k = np.array([v >> 32, v & 0xFFFFFFFF], _U32)
    from ._client import device_put

    return device_put(k)


def key_data(key):
    return key


def split(key, num=2):
    """num new keys (an int or a shape), as a (*shape, 2) uint32 array."""
    _check_key("split", key)
    shape = _canon_shape(num, "split")
    return _split_j(key, shape)


def _fold_in_impl(key, data):
    d = lax.convert_element_type(data, _U32)
    x0 = _full(0, _U32, (1,))
    x1 = lax.reshape(d, (1,))
    b0, b1 = _threefry2x32(_scalar_of(key, 0), _scalar_of(key, 1), x0, x1)
    return lax.concatenate([b0, b1], 0)


_fold_in_j = jit(_fold_in_impl)


def fold_in(key, data):
    _check_key("fold_in", key)
    if np.ndim(data) if not isinstance(data, Tracer) else data.shape:
        raise TypeError("kiln.random.fold_in: data must be a scalar")
    if not isinstance(data, Tracer):
        data = np.asarray(int(data) & 0xFFFFFFFF, _U32)
    return _fold_in_j(key, data)


_bits_j = jit(lambda key, width, shape: _bits(key, width, shape), static_argnums=(1, 2))


def bits(key, shape=(), dtype=None):
    _check_key("bits", key)
    dt = np.dtype(dtype or _U32)
    if dt.kind != "u" or dt.itemsize * 8 not in _UINT:
        raise TypeError(f"kiln.random.bits: dtype must be uint8, uint16 or uint32, got {dt}")
    return _bits_j(key, dt.itemsize * 8, _canon_shape(shape, "bits"))


# ---- floats --------------------------------------------------------------------------

def _float_dtype(dtype, name):
    dt = _dtypes.canonical(np.dtype(dtype) if dtype is not None else _dtypes.float32)
    if not _dtypes.is_float(dt) or dt.kind == "c":
        raise TypeError(f"kiln.random.{name}: dtype must be a floating-point type, got {dt}")
    if dt.itemsize not in (2, 4):
        raise TypeError(f"kiln.random.{name}: {dt} is not supported")
    return dt


def _nmant(dt):
    return {2: 7 if dt.name == "bfloat16" else 10, 4: 23}[dt.itemsize]


def _uniform01(key, shape, dt):
    """Floats in [0, 1) of dtype dt from the mantissa bits (as JAX)."""
    nbits, nmant = dt.itemsize * 8, _nmant(dt)
    rng_bits = 8 if nmant < 8 else nbits
    b = _bits(key, rng_bits, shape)
    ut = _UINT[nbits]
    if rng_bits != nbits:
        b = lax.convert_element_type(b, ut)
    fb = lax.shift_right_logical(b, _full(rng_bits - nmant, ut, shape))
    one_bits = np.array(1.0, dt).view(ut)
    fb = lax.bitwise_or(fb, _full(one_bits, ut, shape))
    return lax.sub(lax.bitcast_convert_type(fb, dt), _full(1.0, dt, shape))


def _bcast(v, dt, shape, name):
    v = lax.convert_element_type(v, dt)
    if tuple(v.shape) == shape:
        return v
    try:
        return jnp.broadcast_to(v, shape)
    except Exception:
        raise ValueError(f"kiln.random.{name}: a parameter of shape {tuple(v.shape)} does not "
                         f"broadcast to the shape {shape}") from None


def _uniform_impl(key, minval, maxval, shape, dt):
    f = _uniform01(key, shape, dt)
    lo, hi = _bcast(minval, dt, shape, "uniform"), _bcast(maxval, dt, shape, "uniform")
    return lax.max(lo, lax.add(lax.mul(f, lax.sub(hi, lo)), lo))


_uniform_j = jit(_uniform_impl, static_argnums=(3, 4))


def uniform(key, shape=(), dtype=None, minval=0.0, maxval=1.0):
    _check_key("uniform", key)
    dt = _float_dtype(dtype, "uniform")
    return _uniform_j(key, minval, maxval, _canon_shape(shape, "uniform"), dt)


_ERFINV_LT5 = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
               -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_GE5 = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
               -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _erf_inv32(x):
    """XLA's single-precision inverse error function (Giles' polynomials)."""
    f32, s = _dtypes.float32, x.shape
    w = lax.neg(lax.log1p(lax.neg(lax.mul(x, x))))
    small = lax.lt(w, _full(5.0, f32, s))
    w = lax.select(small, lax.sub(w, _full(2.5, f32, s)),
                   lax.sub(lax.sqrt(w), _full(3.0, f32, s)))

    def coef(i):
        return lax.select(small, _full(_ERFINV_LT5[i], f32, s), _full(_ERFINV_GE5[i], f32, s))

    p = coef(0)
    for i in range(1, 9):
        p = lax.add(coef(i), lax.mul(p, w))
    edge = lax.eq(lax.abs(x), _full(1.0, f32, s))
    return lax.select(edge, lax.mul(x, _full(np.inf, f32, s)), lax.mul(p, x))


def _normal_impl(key, shape, dt):
    if dt.name == "bfloat16":
        lo = np.asarray(-0.99609375, dt)  # the bfloat16 after -1 towards 0
    else:
        lo = np.nextafter(np.array(-1.0, dt), np.array(0.0, dt))
    u = _uniform_impl(key, np.asarray(lo, dt), np.asarray(1.0, dt), shape, dt)
    u32 = lax.convert_element_type(u, _dtypes.float32)
    r = lax.convert_element_type(_erf_inv32(u32), dt)
    return lax.mul(_full(np.sqrt(2), dt, shape), r)


_normal_j = jit(_normal_impl, static_argnums=(1, 2))


def normal(key, shape=(), dtype=None):
    _check_key("normal", key)
    return _normal_j(key, _canon_shape(shape, "normal"), _float_dtype(dtype, "normal"))


# ---- integers ----------------------------------------------------------------------

def _clip_to(v, dt):
    """v (an integer tracer) converted to dt, clipped to dt's range."""
    vi, di = np.iinfo(v.dtype), np.iinfo(dt)
    lo, hi = max(vi.min, di.min), min(vi.max, di.max)
    v = lax.clamp(np.asarray(lo, v.dtype), v, np.asarray(hi, v.dtype))
    return lax.convert_element_type(v, dt)


def _randint_impl(key, minval, maxval, shape, dt):
    if not np.issubdtype(minval.dtype, np.integer):
        minval = lax.convert_element_type(minval, _dtypes.int32)
    if not np.issubdtype(maxval.dtype, np.integer):
        maxval = lax.convert_element_type(maxval, _dtypes.int32)
    minval = lax.convert_element_type(minval, minval.dtype)  # tracers from here on
    maxval = lax.convert_element_type(maxval, maxval.dtype)
    di = np.iinfo(dt)
    top = min(di.max, np.iinfo(maxval.dtype).max)
    out_of_range = lax.gt(maxval, _full(top, maxval.dtype, tuple(maxval.shape)))
    mn = _bcast(_clip_to(minval, dt), dt, shape, "randint")
    mx = _bcast(_clip_to(maxval, dt), dt, shape, "randint")
    out_of_range = jnp.broadcast_to(out_of_range, shape)
    nbits = dt.itemsize * 8
    keys = _split_impl(key, (2,))
    k1 = lax.reshape(lax.slice(keys, (0, 0), (1, 2)), (2,))
    k2 = lax.reshape(lax.slice(keys, (1, 0), (2, 2)), (2,))
    higher, lower = _bits(k1, nbits, shape), _bits(k2, nbits, shape)
    ut = _UINT[nbits]
    span = lax.convert_element_type(lax.sub(mx, mn), ut)
    span = lax.select(lax.le(mx, mn), _full(1, ut, shape), span)
    span = lax.select(lax.bitwise_and(out_of_range, lax.gt(mx, mn)),
                      lax.add(span, _full(1, ut, shape)), span)
    mult = lax.rem(_full(2 ** (nbits // 2), ut, shape), span)
    mult = lax.rem(lax.mul(mult, mult), span)
    off = lax.add(lax.mul(lax.rem(higher, span), mult), lax.rem(lower, span))
    off = lax.rem(off, span)
    return lax.add(mn, lax.convert_element_type(off, dt))


def _randint_small(key, minval, maxval, shape, dt):
    """Sub-32-bit dtypes sample in int32 (bounds clipped to dt) and convert,
    as JAX does to reduce the bias."""
    info = np.iinfo(dt)
    i32 = _dtypes.int32
    lo = lax.clamp(np.int32(info.min), lax.convert_element_type(minval, i32), np.int32(info.max))
    hi = lax.clamp(np.int32(info.min), lax.convert_element_type(maxval, i32),
                   np.int32(info.max + 1))
    return lax.convert_element_type(_randint_impl(key, lo, hi, shape, i32), dt)


_randint_j = jit(_randint_impl, static_argnums=(3, 4))
_randint_small_j = jit(_randint_small, static_argnums=(3, 4))


def _as_value(x):
    """x unless it is a plain Python or numpy value: then a canonical numpy
    array (so that an inlined call sees arrays with dtypes)."""
    if isinstance(x, Tracer) or hasattr(x, "handle"):
        return x
    a = np.asarray(x)
    return a.astype(_dtypes.canonical(a.dtype))


def randint(key, shape, minval, maxval, dtype=None):
    _check_key("randint", key)
    dt = _dtypes.canonical(np.dtype(dtype) if dtype is not None else _dtypes.int32)
    if dt.kind not in "iu" or dt.itemsize * 8 not in _UINT:
        raise TypeError(f"kiln.random.randint: dtype must be an 8-, 16- or 32-bit integer type, "
                        f"got {dt}")
    minval, maxval = _as_value(minval), _as_value(maxval)
    f = _randint_small_j if dt.itemsize < 4 else _randint_j
    return f(key, minval, maxval, _canon_shape(shape, "randint"), dt)


def _bernoulli_impl(key, p, shape, mode):
    dt = p.dtype
    if mode == "high":
        u = _uniform01(key, (2,) + shape, dt)
        u1 = lax.reshape(lax.slice(u, (0,) + (0,) * len(shape), (1,) + shape), shape)
        u2 = lax.reshape(lax.slice(u, (1,) + (0,) * len(shape), (2,) + shape), shape)
        u2 = lax.mul(u2, _full(2.0 ** -_nmant(dt), dt, shape))
        return lax.lt(u2, lax.sub(_bcast(p, dt, shape, "bernoulli"), u1))
    return lax.lt(_uniform01(key, shape, dt), _bcast(p, dt, shape, "bernoulli"))


_bernoulli_j = jit(_bernoulli_impl, static_argnums=(2, 3))


def bernoulli(key, p=0.5, shape=None, mode="low"):
    _check_key("bernoulli", key)
    if mode not in ("low", "high"):
        raise ValueError(f"kiln.random.bernoulli: mode={mode!r}, expected 'high' or 'low'")
    if not isinstance(p, Tracer) and not hasattr(p, "handle"):
        p = np.asarray(p)
        if not np.issubdtype(p.dtype, np.floating):
            raise TypeError(f"kiln.random.bernoulli: p must have a floating dtype, got {p.dtype}")
        p = p.astype(_dtypes.canonical(p.dtype))
    pshape = tuple(p.shape)
    shape = pshape if shape is None else _canon_shape(shape, "bernoulli")
    return _bernoulli_j(key, p, shape, mode)


# ---- permutation -------------------------------------------------------------------

def _shuffle(key, x, axis):
    n = math.prod(x.shape)
    rounds = int(np.ceil(3 * np.log(max(1, n)) / np.log(np.iinfo(np.uint32).max)))
    for _ in range(rounds):
        keys = _split_impl(key, (2,))
        key = lax.reshape(lax.slice(keys, (0, 0), (1, 2)), (2,))
        sub = lax.reshape(lax.slice(keys, (1, 0), (2, 2)), (2,))
        _, x = lax.sort_key_val(_bits(sub, 32, tuple(x.shape)), x, axis)
    return x


def _permutation_impl(key, x, axis, independent):
    x = lax.convert_element_type(x, x.dtype)  # a tracer
    if independent or len(x.shape) == 1:
        return _shuffle(key, x, axis)
    ind = _shuffle(key, lax.iota(_dtypes.int32, x.shape[axis]), 0)
    return jnp.take(x, ind, axis=axis)


_permutation_j = jit(_permutation_impl, static_argnums=(2, 3))


def permutation(key, x, axis=0, independent=False):
    """A random permutation of arange(x) (x an int) or of x along axis."""
    _check_key("permutation", key)
    if isinstance(x, (int, np.integer)):
        if int(x) < 0:
            raise ValueError("kiln.random.permutation: x must be non-negative")
        x = np.arange(int(x), dtype=np.int32)
        axis = 0
    elif not isinstance(x, Tracer) and not hasattr(x, "handle"):
        x = np.asarray(x)
        x = x.astype(_dtypes.canonical(x.dtype))
    nd = len(x.shape)
    if nd == 0:
        raise TypeError("kiln.random.permutation: x must be an integer or at least 1-D")
    if not -nd <= axis < nd:
        raise ValueError(f"kiln.random.permutation: axis {axis} out of range for {nd} dims")
    return _permutation_j(key, x, axis % nd, bool(independent))
