"""kiln.hessian against jax.hessian (also of jitted functions)."""
import numpy as np
import pytest

import kiln
import kiln.numpy as knp

jax = pytest.importorskip("jax")
jnp = jax.numpy


def test_hessian_vector_and_matrix():
    x = np.array([0.5, 1.0, 2.0], np.float32)
    kf = lambda x: knp.sum(knp.sin(x) * x[0] ** 2)  # noqa: E731
    jf = lambda x: jnp.sum(jnp.sin(x) * x[0] ** 2)  # noqa: E731
    np.testing.assert_allclose(np.asarray(kiln.hessian(kf)(x)), np.asarray(jax.hessian(jf)(x)),
                               rtol=1e-5, atol=1e-6)
    w = np.array([[0.3, -0.2], [0.1, 0.4]], np.float32)
    a = np.array([1.0, 2.0], np.float32)
    kg = lambda a, w: knp.sum(knp.tanh(w @ a) ** 2)  # noqa: E731
    jg = lambda a, w: jnp.sum(jnp.tanh(w @ a) ** 2)  # noqa: E731
    got = np.asarray(kiln.hessian(kg, argnums=1)(a, w))
    assert got.shape == (2, 2, 2, 2)
    np.testing.assert_allclose(got, np.asarray(jax.hessian(jg, argnums=1)(a, w)), rtol=1e-4,
                               atol=1e-6)


def test_hessian_refusals_and_tuple_argnums():
    with pytest.raises(TypeError, match="floating"):
        kiln.hessian(lambda x: knp.sum(x))(np.arange(3, dtype=np.int32))
    x = np.array([0.5, -1.0], np.float32)
    y = np.array([2.0, 0.3, 1.0], np.float32)
    kf = lambda x, y: knp.sum(knp.sin(x)) * knp.sum(y ** 3)  # noqa: E731
    jf = lambda x, y: jnp.sum(jnp.sin(x)) * jnp.sum(y ** 3)  # noqa: E731
    got = kiln.hessian(kf, argnums=(0, 1))(x, y)
    want = jax.hessian(jf, argnums=(0, 1))(x, y)
    for i in range(2):
        for j in range(2):
            np.testing.assert_allclose(np.asarray(got[i][j]), np.asarray(want[i][j]),
                                       rtol=1e-5, atol=1e-5)


X = np.array([0.5, 1.0, 2.0], np.float32)
W = np.array([[0.3, -0.2, 0.5], [0.1, 0.4, -1.0]], np.float32)


def kfun(x, w):
    return knp.tanh(w @ x) * x[0]


def jfun(x, w):
    return jnp.tanh(w @ x) * x[0]


def test_jacfwd_jacrev_eager_and_inside_jit():
    for kj, jj in ((kiln.jacfwd, jax.jacfwd), (kiln.jacrev, jax.jacrev)):
        want = np.asarray(jj(jfun)(X, W))
        np.testing.assert_allclose(np.asarray(kj(kfun)(X, W)), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(kiln.jit(kj(kfun))(X, W)), want, rtol=1e-5,
                                   atol=1e-6)
        # inside a bigger jitted function, with pytree outputs and tuple argnums
        k2 = kiln.jit(lambda x, w: kj(lambda x, w: {"a": kfun(x, w), "b": knp.sum(x * w)},
                                      argnums=(0, 1))(x, w))
        j2 = jj(lambda x, w: {"a": jfun(x, w), "b": jnp.sum(x * w)}, argnums=(0, 1))
        got, want2 = k2(X, W), j2(X, W)
        for key in ("a", "b"):
            for i in range(2):
                np.testing.assert_allclose(np.asarray(got[key][i]), np.asarray(want2[key][i]),
                                           rtol=1e-5, atol=1e-6)


def test_hessian_of_jitted_and_inside_jit():
    f = lambda x: knp.sum(knp.sin(x) * x[0] ** 2)  # noqa: E731
    jf = lambda x: jnp.sum(jnp.sin(x) * x[0] ** 2)  # noqa: E731
    want = np.asarray(jax.hessian(jf)(X))
    np.testing.assert_allclose(np.asarray(kiln.hessian(kiln.jit(f))(X)), want, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(kiln.jit(kiln.hessian(f))(X)), want, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(kiln.jit(kiln.hessian(kiln.jit(f)))(X)), want,
                               rtol=1e-5, atol=1e-6)
