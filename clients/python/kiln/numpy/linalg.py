"""kiln.numpy.linalg: norms."""
from .. import numpy as _np


def norm(x, ord=None, axis=None, keepdims=False):
    x = _np.asarray(x)
    if ord is None or ord == 2 and axis is not None and not isinstance(axis, tuple) or ord == "fro":
        return _np.sqrt(_np.sum(_np.multiply(x, x), axis=axis, keepdims=keepdims))
    if ord == 1 and (axis is not None and not isinstance(axis, tuple) or x.ndim == 1):
        return _np.sum(_np.abs(x), axis=axis, keepdims=keepdims)
    if ord in (float("inf"), "inf") and (axis is not None or x.ndim == 1):
        return _np.max(_np.abs(x), axis=axis, keepdims=keepdims)
    raise NotImplementedError(f"kiln.numpy.linalg.norm with ord={ord!r} axis={axis!r}")


def _unsupported(name):
    def f(*a, **k):
        raise NotImplementedError(f"kiln.numpy.linalg.{name} is not supported yet")
    return f


inv = _unsupported("inv")
solve = _unsupported("solve")
cholesky = _unsupported("cholesky")
svd = _unsupported("svd")
eigh = _unsupported("eigh")
det = _unsupported("det")
