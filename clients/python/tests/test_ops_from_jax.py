"""kiln.ops segment reductions and kiln.from_jax, against JAX."""
import numpy as np
import pytest

import kiln
import kiln.numpy as knp

jax = pytest.importorskip("jax")
jnp = jax.numpy

rng = np.random.default_rng(3)
D = rng.standard_normal((7, 3)).astype(np.float32)
IDS = np.array([0, 2, 2, 1, 0, 4, 2], np.int32)


@pytest.mark.parametrize("name", ["segment_sum", "segment_max", "segment_min", "segment_prod"])
def test_segments(name):
    kf, jf = getattr(kiln.ops, name), getattr(jax.ops, name)
    np.testing.assert_allclose(np.asarray(kf(D, IDS, 6)), np.asarray(jf(D, IDS, 6)), rtol=1e-6)
    # num_segments from the ids; 1-D data
    np.testing.assert_allclose(np.asarray(kf(D[:, 0], IDS)), np.asarray(jf(D[:, 0], IDS)),
                               rtol=1e-6)


def test_segment_drops_out_of_range_and_ints():
    ids = np.array([0, -1, 3, 1, 9], np.int32)
    d = np.arange(5, dtype=np.int32) + 1
    for name in ("segment_sum", "segment_max"):
        np.testing.assert_array_equal(np.asarray(getattr(kiln.ops, name)(d, ids, 4)),
                                      np.asarray(getattr(jax.ops, name)(d, ids, 4)))


def test_segment_inside_jit_and_errors():
    f = kiln.jit(lambda d, i: kiln.ops.segment_sum(d * 2, i, num_segments=5))
    np.testing.assert_allclose(np.asarray(f(D, IDS)),
                               np.asarray(jax.ops.segment_sum(D * 2, IDS, 5)), rtol=1e-6)
    with pytest.raises(kiln.ConcretizationTypeError, match="num_segments"):
        kiln.jit(lambda d, i: kiln.ops.segment_sum(d, i))(D, IDS)
    with pytest.raises(ValueError, match="segment_ids"):
        kiln.ops.segment_sum(D, IDS[:3], 4)


def test_from_jax_mlp_grad():
    def loss(params, x, y):
        h = jnp.tanh(x @ params["w1"] + params["b1"])
        logits = h @ params["w2"]
        return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.sum(logits * y, axis=1))

    params = {"w1": rng.standard_normal((8, 16)).astype(np.float32) * 0.3,
              "b1": np.zeros(16, np.float32),
              "w2": rng.standard_normal((16, 4)).astype(np.float32) * 0.3}
    x = rng.standard_normal((10, 8)).astype(np.float32)
    y = np.eye(4, dtype=np.float32)[rng.integers(0, 4, 10)]
    step = kiln.from_jax(jax.value_and_grad(loss))
    v, g = step(kiln.device_put(params), x, y)  # server arrays and numpy mixed
    jv, jg = jax.jit(jax.value_and_grad(loss))(params, x, y)
    assert isinstance(v, kiln.Array)
    np.testing.assert_allclose(float(v), float(jv), rtol=1e-5)
    for k in params:
        assert isinstance(g[k], kiln.Array)
        np.testing.assert_allclose(np.asarray(g[k]), np.asarray(jg[k]), rtol=1e-4, atol=1e-6)
    # the outputs feed kiln code and another call without leaving the server
    v2, _ = step(kiln.tree_util.tree_map(lambda p, d: p - 0.1 * d, kiln.device_put(params), g),
                 x, y)
    assert float(v2) < float(v)


def test_from_jax_static_unused_and_single_output():
    f = kiln.from_jax(lambda a, b, n: jnp.cumsum(a, axis=0) ** n, static_argnums=2)
    np.testing.assert_allclose(np.asarray(f(D, D, 2)), np.cumsum(D, axis=0) ** 2, rtol=1e-5)
    g = kiln.from_jax(lambda a: (jnp.sort(a, axis=0), jnp.argmax(a, axis=1)))
    s, am = g(D)
    np.testing.assert_allclose(np.asarray(s), np.sort(D, axis=0))
    np.testing.assert_array_equal(np.asarray(am), np.argmax(D, axis=1))
    assert "HloModule" in f.lower_text(D, D, 2)
    np.testing.assert_allclose(np.asarray(knp.sum(s)), np.sum(D), rtol=1e-5)
