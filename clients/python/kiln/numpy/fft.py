"""kiln.numpy.fft: one-dimensional transforms over the last axis, as HLO fft."""
from .. import _dtypes, lax
from .. import numpy as _np
from .._core import emit


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


def _last(a, axis):
    if axis not in (-1, _np.ndim(a) - 1):
        raise NotImplementedError("kiln.numpy.fft: only the last axis")


def fft(a, n=None, axis=-1, norm=None):
    _last(a, axis)
    a = _np.asarray(a, _dtypes.complex64)
    if n is not None and n != _np.shape(a)[-1]:
        raise NotImplementedError("kiln.numpy.fft.fft: n different from the axis length")
    return _fft(a, "FFT", _np.shape(a)[-1])


def ifft(a, n=None, axis=-1, norm=None):
    _last(a, axis)
    a = _np.asarray(a, _dtypes.complex64)
    return _fft(a, "IFFT", _np.shape(a)[-1])


def rfft(a, n=None, axis=-1, norm=None):
    _last(a, axis)
    a = _np.asarray(a, _dtypes.float32)
    return _fft(a, "RFFT", _np.shape(a)[-1])


def irfft(a, n=None, axis=-1, norm=None):
    _last(a, axis)
    a = _np.asarray(a, _dtypes.complex64)
    n = n or 2 * (_np.shape(a)[-1] - 1)
    return _fft(a, "IRFFT", n)
