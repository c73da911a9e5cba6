"""The client's cost per training step: one round trip in steady state.

A jitted step with its parameters resident on the server costs one Execute:
the arrays dropped by the previous step travel in it (release_handles), and
its scalar loss comes back inline, so float(loss) needs no GetBuffer.
"""
import numpy as np
import pytest

import kiln
import kiln.numpy as jnp


def _live():
    return kiln.connection().stats().live_buffers


def test_jitted_step_is_one_rpc_and_leaks_nothing():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = rng.standard_normal((32, 1)).astype(np.float32)

    @kiln.jit
    def step(w, b, x, y):
        err = x @ w + b - y
        gw = x.T @ err / x.shape[0]
        gb = jnp.mean(err, axis=0)
        return w - 0.1 * gw, b - 0.1 * gb, jnp.mean(err ** 2)

    w = kiln.device_put(np.zeros((8, 1), np.float32))
    b = kiln.device_put(np.zeros((1,), np.float32))
    losses = []
    for _ in range(3):  # warm up: compile, first calls
        w, b, loss = step(w, b, x, y)
        losses.append(float(loss))
    conn = kiln.connection()
    live0, rpc0 = _live(), conn.rpc_count
    for _ in range(20):
        w, b, loss = step(w, b, x, y)
        losses.append(float(loss))
    assert conn.rpc_count - rpc0 == 20
    assert losses[-1] < losses[0]
    # the old w and b went with the following Executes: nothing piles up
    assert _live() <= live0 + 2
    ref = np.asarray(w)
    assert ref.shape == (8, 1) and np.isfinite(ref).all()


def test_inline_scalar_is_an_array():
    f = kiln.jit(lambda a: (jnp.sum(a), a * 2))
    s, d = f(np.arange(4, dtype=np.float32))
    assert s.handle is None and d.handle is not None  # the scalar came back inline
    assert s.shape == () and s.dtype == np.float32
    assert float(s) == 6.0 and np.asarray(s) == 6.0
    g = kiln.jit(lambda a, k: a * k)
    np.testing.assert_array_equal(np.asarray(g(d, s)), np.arange(4) * 12.0)
    np.testing.assert_array_equal(np.asarray(d + s), np.arange(4) * 2.0 + 6.0)
    s.delete()
    assert s.is_deleted()


def test_from_jax_train_step_is_one_rpc():
    jax = pytest.importorskip("jax")
    jjnp = jax.numpy

    def loss(p, x, y):
        return jjnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    def train_step(p, x, y):
        v, g = jax.value_and_grad(loss)(p, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g), v

    step = kiln.from_jax(train_step, donate_argnums=0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 4)).astype(np.float32)
    y = rng.standard_normal((16, 1)).astype(np.float32)
    p = kiln.device_put({"w": np.zeros((4, 1), np.float32), "b": np.zeros((1,), np.float32)})
    p, v0 = step(p, x, y)
    conn = kiln.connection()
    rpc0 = conn.rpc_count
    for _ in range(10):
        p, v = step(p, x, y)
        float(v)
    assert conn.rpc_count - rpc0 == 10
    assert float(v) < float(v0)
    # the same step in JAX gives the same loss
    jp = {"w": np.zeros((4, 1), np.float32), "b": np.zeros((1,), np.float32)}
    jstep = jax.jit(train_step)
    for _ in range(11):
        jp, jv = jstep(jp, x, y)
    np.testing.assert_allclose(float(v), float(jv), rtol=1e-4)
