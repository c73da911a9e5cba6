"""kiln.ops: jax.ops.segment_sum / segment_max / segment_min / segment_prod.

Each is a scatter of data (shape (N, *rest)) into num_segments rows along
the leading axis, staged as one jitted program (num_segments static). As in
JAX, ids outside [0, num_segments) are dropped, and an empty segment holds
the reduction's identity (0, -inf or the integer minimum, +inf or the
maximum, 1). num_segments defaults to max(segment_ids) + 1, which needs
concrete ids (inside a trace it must be given).
"""
import math

import numpy as np

from . import _dtypes, lax
from . import numpy as jnp
from ._api import jit
from ._core import Tracer
from .errors import ConcretizationTypeError

__all__ = ["segment_sum", "segment_max", "segment_min", "segment_prod"]


def _identity(kind, dt):
    if kind == "add":
        return 0
    if kind == "mul":
        return 1
    if _dtypes.is_float(dt):
        return -np.inf if kind == "max" else np.inf
    if dt == _dtypes.bool_:
        return kind == "min"
    info = np.iinfo(dt)
    return info.min if kind == "max" else info.max


def _segment_impl(data, ids, num_segments, kind):
    data = lax.convert_element_type(data, data.dtype)
    ids = lax.convert_element_type(ids, _dtypes.int32)
    if len(ids.shape) != 1 or not data.shape or data.shape[0] != ids.shape[0]:
        raise ValueError(f"kiln.ops.segment_{kind}: segment_ids of shape {tuple(ids.shape)} "
                         f"for data of shape {tuple(data.shape)} (one id per leading row)")
    n, rest = data.shape[0], tuple(data.shape[1:])
    r = math.prod(rest)
    s = int(num_segments)
    valid = jnp.logical_and(ids >= 0, ids < s)
    row = jnp.where(valid, ids, s)  # row s is out of range: the scatter drops it
    flat = jnp.reshape(row, (n, 1)) * r + jnp.reshape(jnp.arange(r, dtype=jnp.int32), (1, r))
    init = jnp.full((s * r,), _identity(kind, data.dtype), dtype=data.dtype)
    out = lax._scatter_flat(init, jnp.reshape(flat, (n * r,)), jnp.reshape(data, (n * r,)),
                            kind)
    return jnp.reshape(out, (s,) + rest)


_segment_j = jit(_segment_impl, static_argnums=(2, 3))


def _segment(kind, data, segment_ids, num_segments):
    if num_segments is None:
        if isinstance(segment_ids, Tracer):
            raise ConcretizationTypeError(
                f"kiln.ops.segment_{kind}: num_segments must be given when segment_ids is "
                "traced (the output shape depends on it)")
        ids = np.asarray(segment_ids)
        num_segments = int(ids.max()) + 1 if ids.size else 0
    num_segments = int(num_segments)
    if num_segments < 0:
        raise ValueError(f"kiln.ops.segment_{kind}: num_segments {num_segments} is negative")

    def val(x):
        if isinstance(x, Tracer) or hasattr(x, "handle"):
            return x
        a = np.asarray(x)
        return a.astype(_dtypes.canonical(a.dtype))

    return _segment_j(val(data), val(segment_ids), num_segments, kind)


def segment_sum(data, segment_ids, num_segments=None, indices_are_sorted=False,
                unique_indices=False, bucket_size=None, mode=None):
    return _segment("add", data, segment_ids, num_segments)


def segment_max(data, segment_ids, num_segments=None, indices_are_sorted=False,
                unique_indices=False, bucket_size=None, mode=None):
    return _segment("max", data, segment_ids, num_segments)


def segment_min(data, segment_ids, num_segments=None, indices_are_sorted=False,
                unique_indices=False, bucket_size=None, mode=None):
    return _segment("min", data, segment_ids, num_segments)


def segment_prod(data, segment_ids, num_segments=None, indices_are_sorted=False,
                 unique_indices=False, bucket_size=None, mode=None):
    return _segment("mul", data, segment_ids, num_segments)
