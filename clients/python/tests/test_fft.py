"""kiln.numpy.fft against numpy.fft: every transform with axis, n (cut and
zero-padded) and each norm; the n-dimensional ones; the helpers; bad
arguments raise before anything is sent."""
import numpy as np
import pytest

import kiln
import kiln.numpy as jnp

RNG = np.random.default_rng(11)
TOL = dict(rtol=2e-4, atol=2e-4)


def real(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def cplx(*shape):
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(np.complex64)


@pytest.mark.parametrize("norm", [None, "backward", "ortho", "forward"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("n", [None, 5, 12])
def test_one_dimensional(server, norm, axis, n):
    x, z = real(6, 8, 3), cplx(6, 8, 3)
    for name, arg in (("fft", z), ("ifft", z), ("rfft", x), ("irfft", z)):
        got = np.asarray(getattr(jnp.fft, name)(arg, n=n, axis=axis, norm=norm))
        want = getattr(np.fft, name)(arg, n=n, axis=axis, norm=norm)
        np.testing.assert_allclose(got, want, err_msg=f"{name} n={n} axis={axis} norm={norm}",
                                   **TOL)


def test_in_jit(server):
    x = real(4, 16)
    f = kiln.jit(lambda a: jnp.abs(jnp.fft.fft2(a, norm="ortho")))
    np.testing.assert_allclose(np.asarray(f(x)), np.abs(np.fft.fft2(x, norm="ortho")), **TOL)


@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_n_dimensional(server, norm):
    x, z = real(3, 6, 10), cplx(3, 6, 10)
    cases = [
        ("fft2", z, {}), ("ifft2", z, {}), ("rfft2", x, {}), ("irfft2", z, {}),
        ("fftn", z, {}), ("ifftn", z, {"axes": (0, 2)}), ("rfftn", x, {"s": (4, 8), "axes": (1, 2)}),
        ("irfftn", z, {"s": (6, 18), "axes": (1, 2)}), ("fftn", z, {"s": (2, 7), "axes": (2, 0)}),
    ]
    for name, arg, kw in cases:
        got = np.asarray(getattr(jnp.fft, name)(arg, norm=norm, **kw))
        want = getattr(np.fft, name)(arg, norm=norm, **kw)
        np.testing.assert_allclose(got, want, err_msg=f"{name} {kw} norm={norm}", **TOL)


def test_helpers(server):
    for n in (1, 6, 7):
        np.testing.assert_allclose(np.asarray(jnp.fft.fftfreq(n, 0.5)), np.fft.fftfreq(n, 0.5),
                                   rtol=1e-6)
        np.testing.assert_allclose(np.asarray(jnp.fft.rfftfreq(n)), np.fft.rfftfreq(n), rtol=1e-6)
    x = real(5, 6)
    np.testing.assert_array_equal(np.asarray(jnp.fft.fftshift(x)), np.fft.fftshift(x))
    np.testing.assert_array_equal(np.asarray(jnp.fft.ifftshift(x)), np.fft.ifftshift(x))
    np.testing.assert_array_equal(np.asarray(jnp.fft.fftshift(x, axes=1)),
                                  np.fft.fftshift(x, axes=1))
    np.testing.assert_array_equal(np.asarray(jnp.fft.ifftshift(x, axes=(0,))),
                                  np.fft.ifftshift(x, axes=(0,)))


def test_bad_arguments(server):
    x = real(4, 8)
    with pytest.raises(ValueError, match="norm must be"):
        jnp.fft.fft(x, norm="sideways")
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        jnp.fft.rfft(x, axis=2)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        jnp.fft.fft(x, n=0)
    with pytest.raises(ValueError, match="repeated axes"):
        jnp.fft.fftn(x, axes=(1, -1))
    with pytest.raises(ValueError, match="s and axes differ"):
        jnp.fft.fftn(x, s=(4,), axes=(0, 1))


def test_complex_parts(server):
    z = cplx(3, 5)
    f = kiln.jit(lambda a: (jnp.abs(a), jnp.real(a), jnp.imag(a), jnp.conj(a), jnp.angle(a)))
    got = [np.asarray(v) for v in f(z)]
    want = [np.abs(z), z.real, z.imag, np.conj(z), np.angle(z)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    x = real(4)
    np.testing.assert_allclose(np.asarray(jnp.angle(x, deg=True)), np.angle(x, deg=True),
                               rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(jnp.imag(x)), np.zeros(4, np.float32))


def test_complex_refuses_integers(server):
    i = np.arange(4, dtype=np.int32)
    with pytest.raises(TypeError, match="kiln.lax.complex: operands must be f32 or f64"):
        kiln.jit(lambda a, b: kiln.lax.complex(a, b))(i, i)
