"""custom_jvp / custom_vjp rules applied by the server's transforms
(compiler/transforms/custom.c), against JAX: values and gradients, inside
jit and vmap, and the errors JAX gives."""
import functools

import numpy as np
import pytest

import kiln
import kiln.numpy as knp

jax = pytest.importorskip("jax")
jnp = jax.numpy

X = np.array([-3.0, -0.5, 0.0, 0.7, 2.0, 40.0], np.float32)
B = np.array([[0.1, 1.0, -2.0], [3.0, -0.2, 0.5]], np.float32)


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


# ---- the classic examples, written once per library ---------------------------

def make_log1pexp(lib, np_):
    @lib.custom_jvp
    def log1pexp(x):
        return np_.log(1. + np_.exp(x))

    @log1pexp.defjvp
    def log1pexp_jvp(primals, tangents):
        x, = primals
        x_dot, = tangents
        ans = log1pexp(x)
        return ans, x_dot * (1 - 1 / (1 + np_.exp(x)))

    return log1pexp


def make_clip_gradient(lib, np_):
    @functools.partial(lib.custom_vjp, nondiff_argnums=(0, 1))
    def clip_gradient(lo, hi, x):
        return x

    def fwd(lo, hi, x):
        return x, None

    def bwd(lo, hi, _, g):
        return (np_.clip(g, lo, hi),)

    clip_gradient.defvjp(fwd, bwd)
    return clip_gradient


def make_sin_res(lib, np_):
    """custom_vjp with residuals (a pytree of them) and two arguments."""
    @lib.custom_vjp
    def f(x, y):
        return np_.sin(x) * y

    def fwd(x, y):
        return np_.sin(x) * y, {"c": np_.cos(x), "s": np_.sin(x), "y": y}

    def bwd(res, g):
        return (res["c"] * g * res["y"] * 2.0, res["s"] * g)  # x's rule deliberately doubled

    f.defvjp(fwd, bwd)
    return f


K_LOG, J_LOG = make_log1pexp(kiln, knp), make_log1pexp(jax, jnp)
K_CLIP, J_CLIP = make_clip_gradient(kiln, knp), make_clip_gradient(jax, jnp)
K_SIN, J_SIN = make_sin_res(kiln, knp), make_sin_res(jax, jnp)


def test_log1pexp_custom_jvp_grad_is_stable():
    kf = lambda x: knp.sum(K_LOG(x))  # noqa: E731
    jf = lambda x: jnp.sum(J_LOG(x))  # noqa: E731
    g = np.asarray(kiln.grad(kf)(X))
    assert np.all(np.isfinite(g)), g  # the primal's own derivative is nan at 40
    close(g, jax.grad(jf)(X))
    close(kiln.jit(kiln.grad(kf))(X), jax.grad(jf)(X))
    v, g = kiln.jit(kiln.value_and_grad(kf))(X)
    jv, jg = jax.value_and_grad(jf)(X)
    close(v, jv)
    close(g, jg)


def test_log1pexp_jvp_and_vmap():
    t = np.linspace(-1, 1, X.size).astype(np.float32)
    out, tan = kiln.jvp(K_LOG, (X,), (t,))
    jout, jtan = jax.jvp(J_LOG, (X,), (t,))
    close(out, jout)
    close(tan, jtan)
    # vmap of grad, and grad of a vmapped function (vmap first: the rule is batched)
    kg = kiln.vmap(kiln.grad(lambda x: K_LOG(x)))
    jg = jax.vmap(jax.grad(lambda x: J_LOG(x)))
    close(kiln.jit(kg)(X), jg(X))
    close(kiln.grad(lambda x: knp.sum(kiln.vmap(K_LOG)(x)))(B),
          jax.grad(lambda x: jnp.sum(jax.vmap(J_LOG)(x)))(B))


def test_log1pexp_second_order():
    close(kiln.hessian(lambda x: knp.sum(K_LOG(x) * x))(X[:4]),
          jax.hessian(lambda x: jnp.sum(J_LOG(x) * x))(X[:4]), rtol=1e-4, atol=1e-5)


def test_clip_gradient_custom_vjp():
    kf = lambda x: knp.sum(K_CLIP(-0.5, 0.5, x) * x * 3)  # noqa: E731
    jf = lambda x: jnp.sum(J_CLIP(-0.5, 0.5, x) * x * 3)  # noqa: E731
    close(kiln.jit(kf)(X), jf(X))
    close(kiln.grad(kf)(X), jax.grad(jf)(X))
    close(kiln.jit(kiln.grad(kf))(X), jax.grad(jf)(X))
    # inside a jitted training step: value_and_grad then an update, one program
    step = kiln.jit(lambda x: x - 0.1 * kiln.grad(kf)(x))
    close(step(X), X - 0.1 * np.asarray(jax.grad(jf)(X)))
    # per-example gradients
    kv = kiln.jit(kiln.vmap(kiln.grad(lambda x: knp.sum(K_CLIP(-1.0, 1.0, x) * 4.0))))
    jv = jax.vmap(jax.grad(lambda x: jnp.sum(J_CLIP(-1.0, 1.0, x) * 4.0)))
    close(kv(B), jv(B))


def test_custom_vjp_with_residuals():
    x = X[:4]
    y = np.array([0.5, -1.0, 2.0, 3.0], np.float32)
    kf = lambda x, y: knp.sum(K_SIN(x, y) ** 2)  # noqa: E731
    jf = lambda x, y: jnp.sum(J_SIN(x, y) ** 2)  # noqa: E731
    kg = kiln.grad(kf, argnums=(0, 1))(x, y)
    jg = jax.grad(jf, argnums=(0, 1))(x, y)
    close(kg[0], jg[0])
    close(kg[1], jg[1])
    # the rule, not the primal's derivative, was used (x's rule is doubled)
    true_gx = 2 * np.sin(x) * y * np.cos(x) * y
    close(kg[0], 2 * true_gx, rtol=1e-4)
    kj = kiln.jit(kiln.vmap(kiln.grad(kf), in_axes=(0, None)))(B[:, :2].repeat(2, 1), y)
    jj = jax.vmap(jax.grad(jf), in_axes=(0, None))(B[:, :2].repeat(2, 1), y)
    close(kj, jj)
    _, vjp_fn = kiln.vjp(K_SIN, x, y)
    _, jvjp_fn = jax.vjp(J_SIN, x, y)
    ct = np.ones(4, np.float32)
    for a, b in zip(vjp_fn(ct), jvjp_fn(ct)):
        close(a, b)


def test_custom_rules_run_their_primal_without_transforms():
    close(K_LOG(X[:3]), np.log1p(np.exp(X[:3])))  # eager, as in JAX
    close(kiln.jit(K_SIN)(X[:2], X[2:4]), np.sin(X[:2]) * X[2:4])
    close(kiln.vmap(K_LOG)(B), np.log1p(np.exp(B)), rtol=1e-5)


def test_custom_vjp_refuses_jvp_as_jax():
    with pytest.raises(kiln.errors.InvalidArgumentError, match="custom_vjp"):
        kiln.jvp(lambda x: K_SIN(x, x), (X,), (X,))
    with pytest.raises(TypeError):
        jax.jvp(lambda x: J_SIN(x, x), (X,), (X,))


def test_closed_over_value_is_not_differentiated():
    def kf(x, w):
        @kiln.custom_jvp
        def g(v):
            return v * w

        g.defjvp(lambda p, t: (g(p[0]), t[0] * w))
        return knp.sum(g(x))

    close(kiln.grad(kf)(X, np.float32(3.0)), np.full(X.shape, 3.0))
    with pytest.raises(kiln.errors.InvalidArgumentError, match="closed over"):
        kiln.grad(kf, argnums=1)(X, np.float32(3.0))


def test_rule_shape_errors_raise_before_sending():
    @kiln.custom_vjp
    def f(x):
        return x * 2

    f.defvjp(lambda x: (x * 2, ()), lambda r, g: (g[:1],))
    with pytest.raises(TypeError, match="shape"):
        kiln.grad(lambda x: knp.sum(f(x)))(X)


def test_jacobians_through_custom_rules_inside_jit():
    x = X[:4]
    close(kiln.jit(kiln.jacrev(K_LOG))(x), jax.jacrev(J_LOG)(x))
    close(kiln.jit(kiln.jacfwd(K_LOG))(x), jax.jacfwd(J_LOG)(x))
    kf = lambda x: K_SIN(x, x * 2)  # noqa: E731
    jf = lambda x: J_SIN(x, x * 2)  # noqa: E731
    close(kiln.jit(kiln.jacrev(kf))(x), jax.jacrev(jf)(x))
