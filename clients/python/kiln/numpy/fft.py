"""kiln.numpy.fft: jax.numpy.fft's transforms, as HLO fft.

One-dimensional transforms take any axis, a length n (the axis cut or
zero-padded to it, as numpy does) and norm ("backward", the default,
"ortho" or "forward"); the n-dimensional ones (fft2, fftn, rfftn, ...) are
one-dimensional transforms along each axis in turn, the real ones real on
the last axis. HLO's IFFT and IRFFT include the 1/n of numpy's "backward"
norm; the other norms rescale. Also fftfreq, rfftfreq, fftshift and
ifftshift.
"""
import builtins
import math

from .. import _dtypes, lax
from .. import numpy as _np
from .._core import emit

_NORMS = (None, "backward", "ortho", "forward")


@lax.primitive
def _fft(x, kind, n):
    x = lax._t(x)
    if kind == "RFFT":
        shape = x.shape[:-1] + (n // 2 + 1,)
        return emit("fft", [x], shape, _dtypes.complex64, f", fft_type=RFFT, fft_length={{{n}}}")
    if kind == "IRFFT":
        shape = x.shape[:-1] + (n,)
        return emit("fft", [x], shape, _dtypes.float32, f", fft_type=IRFFT, fft_length={{{n}}}")
    return emit("fft", [x], x.shape, _dtypes.complex64, f", fft_type={kind}, fft_length={{{n}}}")


def _axis(a, axis, who):
    nd = _np.ndim(a)
    if not isinstance(axis, int) or not -nd <= axis < nd:
        raise ValueError(f"kiln.numpy.fft.{who}: axis {axis!r} is out of range for an array of "
                         f"{nd} dimension{'s' if nd != 1 else ''}")
    return axis % nd


def _resize(a, n, who):
    """a with its last axis cut or zero-padded to n (numpy's n=)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"kiln.numpy.fft.{who}: n must be a positive integer, not {n!r}")
    m = _np.shape(a)[-1]
    if n < m:
        return a[..., :n]
    if n > m:
        return _np.pad(a, [(0, 0)] * (_np.ndim(a) - 1) + [(0, n - m)])
    return a


def _scale(x, norm, n, inverse, who):
    """The factor numpy's norm gives beyond HLO's (1 forward, 1/n inverse)."""
    if norm not in _NORMS:
        raise ValueError(f"kiln.numpy.fft.{who}: norm must be 'backward', 'ortho' or 'forward', "
                         f"not {norm!r}")
    if norm in (None, "backward"):
        return x
    if norm == "ortho":
        f = math.sqrt(n) if inverse else 1 / math.sqrt(n)
    else:  # "forward": the 1/n on the forward transform
        f = float(n) if inverse else 1 / n
    return x * f


def _one(a, n, axis, norm, kind, who):
    """A one-dimensional transform of kind along axis, with numpy's n and norm."""
    dtype = _dtypes.float32 if kind == "RFFT" else _dtypes.complex64
    a = _np.asarray(a, dtype)
    ax = _axis(a, axis, who)
    last = ax == _np.ndim(a) - 1
    x = a if last else _np.moveaxis(a, ax, -1)
    if kind == "IRFFT":
        n = n if n is not None else 2 * (_np.shape(x)[-1] - 1)
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"kiln.numpy.fft.{who}: n must be a positive integer, not {n!r}")
        x = _resize(x, n // 2 + 1, who)
    else:
        n = n if n is not None else _np.shape(x)[-1]
        x = _resize(x, n, who)
    y = _scale(_fft(x, kind, n), norm, n, kind in ("IFFT", "IRFFT"), who)
    return y if last else _np.moveaxis(y, -1, ax)


def fft(a, n=None, axis=-1, norm=None):
    return _one(a, n, axis, norm, "FFT", "fft")


def ifft(a, n=None, axis=-1, norm=None):
    return _one(a, n, axis, norm, "IFFT", "ifft")


def rfft(a, n=None, axis=-1, norm=None):
    return _one(a, n, axis, norm, "RFFT", "rfft")


def irfft(a, n=None, axis=-1, norm=None):
    return _one(a, n, axis, norm, "IRFFT", "irfft")


def _axes_sizes(a, s, axes, who):
    nd = _np.ndim(a)
    if axes is None:
        axes = list(range(nd)) if s is None else list(range(nd - len(s), nd))
    axes = [_axis(a, x, who) for x in axes]
    if len(set(axes)) != len(axes):
        raise ValueError(f"kiln.numpy.fft.{who}: repeated axes {axes}")
    if s is not None and len(s) != len(axes):
        raise ValueError(f"kiln.numpy.fft.{who}: s and axes differ in length")
    return axes, (list(s) if s is not None else [None] * len(axes))


def fftn(a, s=None, axes=None, norm=None):
    axes, s = _axes_sizes(_np.asarray(a), s, axes, "fftn")
    for ax, n in builtins.zip(axes, s):
        a = _one(a, n, ax, norm, "FFT", "fftn")
    return a


def ifftn(a, s=None, axes=None, norm=None):
    axes, s = _axes_sizes(_np.asarray(a), s, axes, "ifftn")
    for ax, n in builtins.zip(axes, s):
        a = _one(a, n, ax, norm, "IFFT", "ifftn")
    return a


def rfftn(a, s=None, axes=None, norm=None):
    axes, s = _axes_sizes(_np.asarray(a), s, axes, "rfftn")
    a = _one(a, s[-1], axes[-1], norm, "RFFT", "rfftn")
    for ax, n in builtins.zip(axes[:-1], s[:-1]):
        a = _one(a, n, ax, norm, "FFT", "rfftn")
    return a


def irfftn(a, s=None, axes=None, norm=None):
    axes, s = _axes_sizes(_np.asarray(a), s, axes, "irfftn")
    for ax, n in builtins.zip(axes[:-1], s[:-1]):
        a = _one(a, n, ax, norm, "IFFT", "irfftn")
    return _one(a, s[-1], axes[-1], norm, "IRFFT", "irfftn")


def fft2(a, s=None, axes=(-2, -1), norm=None):
    return fftn(a, s, axes, norm)


def ifft2(a, s=None, axes=(-2, -1), norm=None):
    return ifftn(a, s, axes, norm)


def rfft2(a, s=None, axes=(-2, -1), norm=None):
    return rfftn(a, s, axes, norm)


def irfft2(a, s=None, axes=(-2, -1), norm=None):
    return irfftn(a, s, axes, norm)


def fftfreq(n, d=1.0, *, dtype=None):
    """The sample frequencies of an n-point fft: [0, 1, ..., -1] / (d n)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"kiln.numpy.fft.fftfreq: n must be a positive integer, not {n!r}")
    k = [i if i < (n + 1) // 2 else i - n for i in range(n)]
    return _np.asarray([x / (d * n) for x in k], dtype or _dtypes.float32)


def rfftfreq(n, d=1.0, *, dtype=None):
    """The sample frequencies of an n-point rfft: [0, 1, ..., n // 2] / (d n)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"kiln.numpy.fft.rfftfreq: n must be a positive integer, not {n!r}")
    return _np.asarray([i / (d * n) for i in range(n // 2 + 1)], dtype or _dtypes.float32)


def _shift(x, axes, sign):
    nd = _np.ndim(x)
    axes = list(range(nd)) if axes is None else ([axes] if isinstance(axes, int) else list(axes))
    shape = _np.shape(x)
    for ax in axes:
        ax = _axis(x, ax, "fftshift")
        x = _np.roll(x, shape[ax] // 2 if sign > 0 else -(shape[ax] // 2), axis=ax)
    return x


def fftshift(x, axes=None):
    return _shift(_np.asarray(x), axes, 1)


def ifftshift(x, axes=None):
    return _shift(_np.asarray(x), axes, -1)
