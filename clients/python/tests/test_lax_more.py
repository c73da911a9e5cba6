"""Convolutions, conv_transpose, associative_scan, reduce_window, top_k, fft
and the Jacobians, against JAX (where installed) and numpy; shape errors
raise before anything is sent."""
import numpy as np
import pytest

import kiln
import kiln.numpy as jnp
from kiln import lax

jax = pytest.importorskip("jax")
jlax = jax.lax

RNG = np.random.default_rng(7)
IMG = RNG.standard_normal((2, 9, 8, 3)).astype(np.float32)    # NHWC
KER = RNG.standard_normal((3, 3, 3, 4)).astype(np.float32)    # HWIO
IMG_NCHW = np.ascontiguousarray(IMG.transpose(0, 3, 1, 2))
KER_OIHW = np.ascontiguousarray(KER.transpose(3, 2, 0, 1))
NHWC = ("NHWC", "HWIO", "NHWC")

CONVS = [
    ("nchw_valid", lambda L: L.conv_general_dilated(IMG_NCHW, KER_OIHW, (1, 1), "VALID")),
    ("nchw_same_stride", lambda L: L.conv_general_dilated(IMG_NCHW, KER_OIHW, (2, 2), "SAME")),
    ("nhwc_pads_dilated", lambda L: L.conv_general_dilated(
        IMG, KER, (1, 2), ((1, 2), (0, 1)), rhs_dilation=(2, 1), dimension_numbers=NHWC)),
    ("lhs_dilated", lambda L: L.conv_general_dilated(
        IMG, KER, (1, 1), ((2, 2), (2, 2)), lhs_dilation=(2, 2), dimension_numbers=NHWC)),
    ("groups", lambda L: L.conv_general_dilated(
        IMG_NCHW[:, :2], np.ascontiguousarray(KER_OIHW[:, :1]), (1, 1), "SAME",
        feature_group_count=2)),
    ("conv1d", lambda L: L.conv_general_dilated(IMG[:, :, 0], KER[0], (1,), "SAME",
                                                 dimension_numbers=("NHC", "HIO", "NHC"))),
    ("transpose_same", lambda L: L.conv_transpose(IMG, KER, (2, 2), "SAME",
                                                  dimension_numbers=NHWC)),
    ("transpose_valid", lambda L: L.conv_transpose(IMG, KER, (2, 1), "VALID",
                                                   dimension_numbers=NHWC)),
    ("transpose_flip", lambda L: L.conv_transpose(
        IMG, np.ascontiguousarray(KER[:, :, :, :3]), (2, 2), "SAME", dimension_numbers=NHWC,
        transpose_kernel=True)),
]


@pytest.mark.parametrize("name,f", CONVS, ids=[c[0] for c in CONVS])
def test_conv_against_jax(name, f):
    want = np.asarray(f(jlax))
    got = kiln.jit(lambda: f(lax))()
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
    eager = f(lax)  # op by op, the same
    np.testing.assert_allclose(np.asarray(eager), want, rtol=1e-4, atol=1e-4)


def test_conv_grad_against_jax():
    def loss(L, np_):
        def f(x, k):
            y = L.conv_general_dilated(x, k, (2, 1), "SAME", dimension_numbers=NHWC)
            return np_.sum(np_.tanh(y) ** 2)
        return f

    want = jax.grad(loss(jlax, jax.numpy), argnums=(0, 1))(IMG, KER)
    got = kiln.grad(loss(lax, jnp), argnums=(0, 1))(IMG, KER)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-3, atol=1e-3)


def test_conv_errors_before_sending():
    conn = kiln.connection()
    n = conn.rpc_count
    with pytest.raises(TypeError, match="conv_general_dilated.*features"):
        lax.conv_general_dilated(IMG, KER[:, :, :2], (1, 1), "SAME", dimension_numbers=NHWC)
    with pytest.raises(TypeError, match="spatial"):
        lax.conv_general_dilated(IMG, KER, (1,), "SAME", dimension_numbers=NHWC)
    with pytest.raises(ValueError, match="matmul.*contracting"):
        jnp.matmul(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
    with pytest.raises(ValueError, match="associative_scan"):
        lax.associative_scan(lax.add, (np.ones(3), np.ones(4)))
    assert conn.rpc_count == n


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13])
def test_associative_scan(n):
    x = RNG.standard_normal((n, 3)).astype(np.float32)
    got = kiln.jit(lambda a: lax.associative_scan(lax.add, a))(x)
    np.testing.assert_allclose(np.asarray(got), np.cumsum(x, axis=0), rtol=1e-5, atol=1e-5)
    got = lax.associative_scan(jnp.maximum, x, reverse=True)
    np.testing.assert_allclose(np.asarray(got),
                               np.asarray(jlax.associative_scan(jax.numpy.maximum, x,
                                                                reverse=True)))
    # a pytree of elements and a non-commutative operator: affine maps composed
    a = RNG.uniform(0.5, 1.5, (n, 2)).astype(np.float32)
    b = RNG.standard_normal((n, 2)).astype(np.float32)

    def compose(p, q):
        return (q[0] * p[0], q[0] * p[1] + q[1])

    ga, gb = kiln.jit(lambda a, b: lax.associative_scan(compose, (a, b), axis=0))(a, b)
    wa, wb = jlax.associative_scan(compose, (a, b), axis=0)
    np.testing.assert_allclose(np.asarray(ga), np.asarray(wa), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(gb), np.asarray(wb), rtol=1e-4, atol=1e-5)


def test_associative_scan_axis():
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    got = kiln.jit(lambda a: lax.associative_scan(lax.mul, a, axis=1))(x)
    np.testing.assert_allclose(np.asarray(got), np.cumprod(x, axis=1), rtol=1e-5)


def test_reduce_window_sort_top_k_fft():
    x = RNG.standard_normal((1, 6, 6, 2)).astype(np.float32)
    got = lax.reduce_window(x, -np.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    want = jlax.reduce_window(x, -np.inf, jlax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want))
    v = RNG.standard_normal((3, 7)).astype(np.float32)
    vals, idx = kiln.jit(lambda a: lax.top_k(a, 3))(v)
    wv, wi = jlax.top_k(v, 3)
    np.testing.assert_allclose(np.asarray(vals), np.asarray(wv))
    np.testing.assert_array_equal(np.asarray(idx), np.asarray(wi))
    np.testing.assert_allclose(np.asarray(jnp.sort(v, axis=1)), np.sort(v, axis=1))
    np.testing.assert_array_equal(np.asarray(jnp.argsort(v, axis=1)),
                                  np.argsort(v, axis=1, kind="stable"))
    f = np.asarray(kiln.jit(lambda a: jnp.fft.rfft(a))(v))
    np.testing.assert_allclose(f, np.fft.rfft(v), rtol=1e-4, atol=1e-4)


def _f(x, y):
    return {"a": jnp.sin(x) * y[0], "b": jnp.sum(x ** 2) + y[1]}


def _jf(x, y):
    return {"a": jax.numpy.sin(x) * y[0], "b": jax.numpy.sum(x ** 2) + y[1]}


@pytest.mark.parametrize("which", ["jacfwd", "jacrev"])
def test_jacobians_against_jax(which):
    x = RNG.standard_normal(3).astype(np.float32)
    y = RNG.standard_normal(2).astype(np.float32)
    for argnums in (0, (0, 1)):
        got = getattr(kiln, which)(_f, argnums=argnums)(x, y)
        want = getattr(jax, which)(_jf, argnums=argnums)(x, y)
        gl, gt = kiln.tree_util.tree_flatten(got)
        wl, wt = jax.tree_util.tree_flatten(want)
        assert len(gl) == len(wl)
        for g, w in zip(gl, wl):
            assert np.asarray(g).shape == np.asarray(w).shape
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)
    m = RNG.standard_normal((2, 3)).astype(np.float32)
    got = getattr(kiln, which)(lambda a: jnp.tanh(a @ x))(m)
    want = getattr(jax, which)(lambda a: jax.numpy.tanh(a @ x))(m)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match=which):
        getattr(kiln, which)(lambda a: a * 2)(np.arange(3))
