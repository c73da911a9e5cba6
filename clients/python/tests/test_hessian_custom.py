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


def test_hessian_refusals():
    with pytest.raises(NotImplementedError, match="argnums"):
        kiln.hessian(lambda x, y: knp.sum(x * y), argnums=(0, 1))
    with pytest.raises(TypeError, match="floating"):
        kiln.hessian(lambda x: knp.sum(x))(np.arange(3, dtype=np.int32))


