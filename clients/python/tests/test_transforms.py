"""jit caching, control flow, transforms against JAX, errors."""
import numpy as np
import pytest

import kiln
import kiln.numpy as jnp
from kiln import lax

jax = pytest.importorskip("jax")
jjnp = jax.numpy

rng = np.random.default_rng(1)
W = rng.standard_normal((4, 3)).astype(np.float32)
X = rng.standard_normal((5, 4)).astype(np.float32)
V = rng.standard_normal((4,)).astype(np.float32)


def close(a, b, tol=1e-5):
    la, lb = kiln.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def loss(np_):
    def f(w, x):
        return np_.sum(np_.tanh(x @ w) ** 2)
    return f


def test_jit_retraces_only_on_new_signature():
    traces = []

    def f(x, n):
        traces.append(1)
        return x * n

    g = kiln.jit(f, static_argnums=1)
    g(X, 2)
    g(X + 1, 2)
    assert len(traces) == 1
    g(X, 3)  # new static value
    assert len(traces) == 2
    g(X[:2], 3)  # new shape
    assert len(traces) == 3
    g(X.astype(np.int32), 3)  # new dtype
    assert len(traces) == 4
    g({"a": X}["a"], 3)
    assert len(traces) == 4
    assert g._cache_size() == 4


def test_jit_pytree_and_server_arrays():
    f = kiln.jit(lambda p, x: {"y": x @ p["w"] + p["b"], "n": None})
    p = kiln.device_put({"w": W, "b": np.ones(3, np.float32)})
    out = f(p, X)
    assert out["n"] is None
    assert isinstance(out["y"], kiln.Array)
    np.testing.assert_allclose(np.asarray(out["y"].block_until_ready()), X @ W + 1, rtol=1e-5)


def test_donate():
    a = kiln.device_put(X)
    f = kiln.jit(lambda a: a * 2, donate_argnums=0)
    b = f(a)
    np.testing.assert_allclose(np.asarray(b), X * 2)
    assert a.is_deleted()
    with pytest.raises(RuntimeError, match="donated"):
        np.asarray(a)


def test_release_on_drop():
    conn = kiln.connection()
    conn.flush_releases()
    before = conn.stats().live_buffers
    arrays = [kiln.device_put(X) for _ in range(5)]
    assert conn.stats().live_buffers == before + 5
    del arrays
    conn.flush_releases()
    assert conn.stats().live_buffers == before


def test_releases_are_batched():
    """Dropped arrays are released in one ReleaseBuffers once RELEASE_BATCH
    are waiting, not one round trip per call."""
    from kiln import _client

    conn = kiln.connection()
    conn.flush_releases()
    before = conn.stats().live_buffers
    arrays = [kiln.device_put(X) for _ in range(3)]
    del arrays
    n = conn.rpc_count
    assert conn.stats().live_buffers == before + 3  # still waiting: no extra RPC
    assert conn.rpc_count == n + 1
    arrays = [kiln.device_put(X) for _ in range(_client.RELEASE_BATCH)]
    del arrays
    assert conn.stats().live_buffers == before  # the batch went with this call


def test_python_control_flow_raises_naming_the_line():
    def f(x):
        if x.sum() > 0:  # the line the error names
            return x
        return -x

    with pytest.raises(kiln.ConcretizationTypeError, match=r"test_transforms.py:\d+"):
        kiln.jit(f)(X)


def test_while_fori_scan_cond():
    f = kiln.jit(lambda n: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + c[0]),
                                          (0, 0)))
    i, s = f(10)
    assert int(i) == 10 and int(s) == 45
    g = kiln.jit(lambda x: lax.fori_loop(0, 3, lambda i, v: v * 2 + x, x))
    np.testing.assert_allclose(np.asarray(g(V)), ((V * 2 + V) * 2 + V) * 2 + V, rtol=1e-6)

    def step(c, x):
        c = c + x
        return c, c * 2

    c, ys = kiln.jit(lambda xs: lax.scan(step, jnp.zeros(4), xs))(X)
    np.testing.assert_allclose(np.asarray(c), X.sum(0), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ys), np.cumsum(X, 0) * 2, rtol=1e-5)
    h = kiln.jit(lambda p, x: lax.cond(p, lambda v: v + W.sum(), lambda v: v - 1.0, x))
    np.testing.assert_allclose(np.asarray(h(True, V)), V + W.sum(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(h(False, V)), V - 1, rtol=1e-6)
    sw = kiln.jit(lambda i, x: lax.switch(i, [lambda v: v, lambda v: v * 2, lambda v: -v], x))
    np.testing.assert_allclose(np.asarray(sw(2, V)), -V)
    # eager (not jitted) control flow gives the same
    i2, s2 = lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, c[1] + c[0]), (0, 0))
    assert int(s2) == 45


def test_lax_ops():
    x = kiln.device_put(X)
    np.testing.assert_allclose(np.asarray(lax.dynamic_slice(x, (1, 2), (2, 2))), X[1:3, 2:4])
    u = np.zeros((2, 2), np.float32)
    want = X.copy()
    want[1:3, 0:2] = 0
    np.testing.assert_allclose(np.asarray(lax.dynamic_update_slice(x, u, (1, 0))), want)
    np.testing.assert_allclose(np.asarray(lax.select(X > 0, X, -X)), np.abs(X))
    dn = (((1,), (0,)), ((), ()))
    np.testing.assert_allclose(np.asarray(lax.dot_general(X, W, dn)), X @ W, rtol=1e-5)
    j = kiln.jit(lambda x, i: lax.dynamic_slice(x, (i, 0), (1, 4)))
    np.testing.assert_allclose(np.asarray(j(X, 3)), X[3:4])


def test_grad_value_and_grad_against_jax():
    kf, jf = loss(jnp), loss(jjnp)
    close(kiln.grad(kf)(W, X), jax.grad(jf)(W, X))
    close(kiln.grad(kf, argnums=(0, 1))(W, X), jax.grad(jf, argnums=(0, 1))(W, X))
    close(kiln.value_and_grad(kf)(W, X), jax.value_and_grad(jf)(W, X))
    close(kiln.jit(kiln.value_and_grad(kf, argnums=1))(W, X),
          jax.jit(jax.value_and_grad(jf, argnums=1))(W, X))


def test_grad_pytree_and_has_aux():
    def kl(p, x):
        y = jnp.tanh(x @ p["w"] + p["b"])
        return jnp.mean(y ** 2), y.sum()

    def jl(p, x):
        y = jjnp.tanh(x @ p["w"] + p["b"])
        return jjnp.mean(y ** 2), y.sum()

    p = {"w": W, "b": np.ones(3, np.float32)}
    close(kiln.value_and_grad(kl, has_aux=True)(p, X), jax.value_and_grad(jl, has_aux=True)(p, X))
    close(kiln.grad(kl, has_aux=True)(p, X), jax.grad(jl, has_aux=True)(p, X))


def test_compositions_against_jax():
    kf = lambda x: jnp.sum(jnp.sin(x) * x)  # noqa: E731
    jf = lambda x: jjnp.sum(jjnp.sin(x) * x)  # noqa: E731
    close(kiln.vmap(kiln.grad(kf))(X), jax.vmap(jax.grad(jf))(X))
    close(kiln.jit(kiln.vmap(kiln.grad(kf)))(X), jax.jit(jax.vmap(jax.grad(jf)))(X))
    s = lambda x: jnp.sin(x) * x  # noqa: E731
    js = lambda x: jjnp.sin(x) * x  # noqa: E731
    close(kiln.grad(kiln.grad(lambda x: jnp.sin(x) * x))(np.float32(0.7)),
          jax.grad(jax.grad(lambda x: jjnp.sin(x) * x))(np.float32(0.7)))
    close(kiln.jvp(s, (V,), (np.ones_like(V),)), jax.jvp(js, (V,), (np.ones_like(V),)))
    # forward over reverse: Hessian-vector product
    close(kiln.jvp(kiln.grad(kf), (V,), (V,)), jax.jvp(jax.grad(jf), (V,), (V,)))
    ko, kvjp = kiln.vjp(s, V)
    jo, jvjp = jax.vjp(js, V)
    close(ko, jo)
    close(kvjp(np.ones_like(V)), jvjp(np.ones_like(V)))
    close(kiln.grad(kiln.checkpoint(kf))(V), jax.grad(jax.checkpoint(jf))(V))


def test_transforms_inside_jit_against_jax():
    """grad, value_and_grad (has_aux), vmap, jvp and vjp called inside a
    jitted function: the server's transformed program inlined as a call."""
    kl, jl = loss(jnp), loss(jjnp)

    def step(np_, vg):
        def f(w, x):
            v, g = vg(lambda w, x: (np_.sum(np_.tanh(x @ w) ** 2), np_.mean(w)),
                      has_aux=True)(w, x)
            return w - 0.1 * g, v[0], v[1]
        return f

    close(kiln.jit(step(jnp, kiln.value_and_grad))(W, X),
          jax.jit(step(jjnp, jax.value_and_grad))(W, X))
    close(kiln.jit(lambda w, x: kiln.grad(kl, argnums=(0, 1))(w, x))(W, X),
          jax.grad(jl, argnums=(0, 1))(W, X))
    kf = lambda x: jnp.sum(jnp.sin(x) * x)  # noqa: E731
    jf = lambda x: jjnp.sum(jjnp.sin(x) * x)  # noqa: E731
    close(kiln.jit(lambda x: kiln.vmap(kiln.grad(kf))(x) * 2)(X),
          jax.vmap(jax.grad(jf))(X) * 2)
    close(kiln.jit(lambda x, t: kiln.jvp(jnp.sin, (x,), (t,)))(V, V),
          jax.jvp(jjnp.sin, (V,), (V,)))

    def kv(x):
        out, f = kiln.vjp(jnp.tanh, x)
        return f(out * 2)

    def jv(x):
        out, f = jax.vjp(jjnp.tanh, x)
        return f(out * 2)

    close(kiln.jit(kv)(V), jax.jit(jv)(V))
    # inside a scan body: the inlined program is called from the loop
    close(kiln.jit(lambda x: lax.scan(lambda c, r: (c + kiln.grad(kf)(r), 0.0), V, x)[0])(X),
          jax.jit(lambda x: jax.lax.scan(lambda c, r: (c + jax.grad(jf)(r), 0.0), V, x)[0])(X))


def test_one_program_train_step_is_one_rpc():
    kl = loss(jnp)

    @kiln.jit
    def step(w, x):
        v, g = kiln.value_and_grad(kl)(w, x)
        return w - 0.05 * g, v

    w = kiln.device_put(W)
    w, v0 = step(w, X)
    conn = kiln.connection()
    n = conn.rpc_count
    for _ in range(5):
        w, v = step(w, X)
        float(v)
    assert conn.rpc_count - n == 5
    assert float(v) < float(v0)


def test_vmap_axes_against_jax():
    kf = lambda x, w: x @ w  # noqa: E731
    close(kiln.vmap(kf, in_axes=(0, None))(X, W), jax.vmap(kf, in_axes=(0, None))(X, W))
    close(kiln.vmap(kf, in_axes=(1, None), out_axes=1)(X.T, W),
          jax.vmap(kf, in_axes=(1, None), out_axes=1)(X.T, W))
    close(kiln.vmap(lambda d: d["a"] * 2, in_axes=({"a": 0},))({"a": X}),
          jax.vmap(lambda d: d["a"] * 2, in_axes=({"a": 0},))({"a": X}))


def test_errors():
    with pytest.raises(TypeError, match="dot_general"):
        kiln.jit(lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ()))))(X, X)
    with pytest.raises(ValueError, match="matmul"):
        jnp.matmul(kiln.device_put(X), kiln.device_put(X))
    with pytest.raises(ValueError, match="different sizes"):
        kiln.vmap(lambda a, b: a + b)(X, X[:2])
    with pytest.raises(TypeError, match="scalar"):
        kiln.grad(lambda x: x * 2)(V)
    with pytest.raises(NotImplementedError, match="pmap"):
        kiln.pmap(lambda x: x)(V)
    with pytest.raises(NotImplementedError, match="jacfwd: has_aux"):
        kiln.jacfwd(lambda x: x, has_aux=True)(V)
    with pytest.raises(kiln.UnexpectedTracerError):  # closes over the outer trace's tracer
        kiln.jit(lambda x: kiln.grad(lambda y: jnp.sum(y * x))(x))(V)
    with pytest.raises(kiln.errors.UnimplementedError):
        kiln.grad(kiln.checkpoint(lambda x: jnp.sum(x * x),
                                  policy=kiln.checkpoint_policies.dots_saveable))(V)
    with pytest.raises(kiln.errors.NotFoundError):
        kiln.connection().get("no-such-handle")
    with pytest.raises(kiln.TracerArrayConversionError):
        kiln.jit(lambda x: np.asarray(x))(V)


def test_stop_gradient_under_grad_matches_jax():
    f = lambda x: jnp.sum(lax.stop_gradient(x) * x)  # noqa: E731
    jf = lambda x: jax.numpy.sum(jax.lax.stop_gradient(x) * x)  # noqa: E731
    np.testing.assert_allclose(np.asarray(kiln.jit(f)(V)), np.sum(V * V), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(kiln.grad(f)(V)), np.asarray(jax.grad(jf)(V)),
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(kiln.grad(f)(V)), V, rtol=1e-6)  # not 2 V
