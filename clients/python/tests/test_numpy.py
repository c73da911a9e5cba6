"""kiln.numpy and kiln.nn against numpy, eager (op by op) and under jit."""
import numpy as np
import pytest

import kiln
import kiln.numpy as jnp

rng = np.random.default_rng(0)
X = rng.standard_normal((3, 4)).astype(np.float32)
Y = rng.standard_normal((3, 4)).astype(np.float32)
P = np.abs(X) + 0.5
M = rng.standard_normal((4, 5)).astype(np.float32)
I = rng.integers(-5, 6, (3, 4)).astype(np.int32)


def both(f, *args):
    """f on the server, eager and jitted; both must agree."""
    eager = f(*[kiln.device_put(a) if isinstance(a, np.ndarray) else a for a in args])
    jitted = kiln.jit(f)(*args)
    return eager, jitted


CASES = [
    ("add", lambda x, y: x + y, np.add, (X, Y)),
    ("sub", lambda x, y: x - y, np.subtract, (X, Y)),
    ("mul", lambda x, y: x * y, np.multiply, (X, Y)),
    ("div", lambda x, y: x / y, np.divide, (X, P)),
    ("pow", lambda x, y: jnp.power(x, y), np.power, (P, Y)),
    ("max", jnp.maximum, np.maximum, (X, Y)),
    ("min", jnp.minimum, np.minimum, (X, Y)),
    ("lt", jnp.less, np.less, (X, Y)),
    ("eq", jnp.equal, np.equal, (I, I.T.reshape(3, 4))),
    ("scalar", lambda x: 2.0 * x - 1, lambda x: 2.0 * x - 1, (X,)),
    ("broadcast", lambda x, b: x + b, np.add, (X, Y[0])),
    ("exp", jnp.exp, np.exp, (X,)),
    ("log", jnp.log, np.log, (P,)),
    ("sqrt", jnp.sqrt, np.sqrt, (P,)),
    ("tanh", jnp.tanh, np.tanh, (X,)),
    ("sin", jnp.sin, np.sin, (X,)),
    ("cos", jnp.cos, np.cos, (X,)),
    ("abs", jnp.abs, np.abs, (X,)),
    ("sign", jnp.sign, np.sign, (X,)),
    ("floor", jnp.floor, np.floor, (X,)),
    ("where", lambda x, y: jnp.where(x > y, x, y), lambda x, y: np.where(x > y, x, y), (X, Y)),
    ("clip", lambda x: jnp.clip(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5), (X,)),
    ("floordiv", lambda a: a // 3, lambda a: a // 3, (I,)),
    ("mod", lambda a: a % 3, lambda a: a % 3, (I,)),
    ("matmul", jnp.matmul, np.matmul, (X, M)),
    ("dot", jnp.dot, np.dot, (X, M)),
    ("einsum", lambda a, b: jnp.einsum("ij,jk->ik", a, b),
     lambda a, b: np.einsum("ij,jk->ik", a, b), (X, M)),
    ("einsum_batch", lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
     lambda a, b: np.einsum("bij,bjk->bik", a, b), (np.stack([X, Y]), np.stack([M, M]))),
    ("tensordot", lambda a, b: jnp.tensordot(a, b, 1), lambda a, b: np.tensordot(a, b, 1), (X, M)),
    ("sum", lambda x: jnp.sum(x), np.sum, (X,)),
    ("sum_axis", lambda x: jnp.sum(x, axis=1, keepdims=True),
     lambda x: np.sum(x, axis=1, keepdims=True), (X,)),
    ("mean", lambda x: jnp.mean(x, axis=0), lambda x: np.mean(x, axis=0), (X,)),
    ("max_r", lambda x: jnp.max(x, axis=1), lambda x: np.max(x, axis=1), (X,)),
    ("min_r", lambda x: jnp.min(x), np.min, (X,)),
    ("prod", lambda x: jnp.prod(x, axis=0), lambda x: np.prod(x, axis=0), (X,)),
    ("var", lambda x: jnp.var(x, axis=1), lambda x: np.var(x, axis=1), (X,)),
    ("std", lambda x: jnp.std(x), np.std, (X,)),
    ("argmax", lambda x: jnp.argmax(x, axis=1), lambda x: np.argmax(x, axis=1), (X,)),
    ("argmin", lambda x: jnp.argmin(x), np.argmin, (X,)),
    ("reshape", lambda x: jnp.reshape(x, (2, -1)), lambda x: np.reshape(x, (2, -1)), (X,)),
    ("transpose", jnp.transpose, np.transpose, (X,)),
    ("swapaxes", lambda x: jnp.swapaxes(x, 0, 1), lambda x: np.swapaxes(x, 0, 1), (X,)),
    ("expand_dims", lambda x: jnp.expand_dims(x, 1), lambda x: np.expand_dims(x, 1), (X,)),
    ("squeeze", lambda x: jnp.squeeze(x[:, :1]), lambda x: np.squeeze(x[:, :1]), (X,)),
    ("broadcast_to", lambda x: jnp.broadcast_to(x[0], (2, 4)),
     lambda x: np.broadcast_to(x[0], (2, 4)), (X,)),
    ("concatenate", lambda x, y: jnp.concatenate([x, y], axis=1),
     lambda x, y: np.concatenate([x, y], axis=1), (X, Y)),
    ("stack", lambda x, y: jnp.stack([x, y], axis=1), lambda x, y: np.stack([x, y], axis=1),
     (X, Y)),
    ("split", lambda x: jnp.split(x, 2, axis=1)[1], lambda x: np.split(x, 2, axis=1)[1], (X,)),
    ("pad", lambda x: jnp.pad(x, ((1, 0), (0, 2))), lambda x: np.pad(x, ((1, 0), (0, 2))), (X,)),
    ("flip", lambda x: jnp.flip(x, 1), lambda x: np.flip(x, 1), (X,)),
    ("roll", lambda x: jnp.roll(x, 1, axis=1), lambda x: np.roll(x, 1, axis=1), (X,)),
    ("tril", jnp.tril, np.tril, (X,)),
    ("triu", lambda x: jnp.triu(x, 1), lambda x: np.triu(x, 1), (X,)),
    ("take", lambda x: jnp.take(x, np.array([2, 0, 1, 1]), axis=1),
     lambda x: np.take(x, np.array([2, 0, 1, 1]), axis=1), (X,)),
    ("take_along", lambda x: jnp.take_along_axis(x, np.argsort(X, axis=1), axis=1),
     lambda x: np.take_along_axis(x, np.argsort(X, axis=1), axis=1), (X,)),
    ("cumsum", lambda x: jnp.cumsum(x, axis=1), lambda x: np.cumsum(x, axis=1), (X,)),
    ("cumprod", lambda x: jnp.cumprod(x, axis=0), lambda x: np.cumprod(x, axis=0), (X,)),
    ("sort", lambda x: jnp.sort(x, axis=1), lambda x: np.sort(x, axis=1), (X,)),
    ("argsort", lambda x: jnp.argsort(x, axis=1), lambda x: np.argsort(x, axis=1, kind="stable"),
     (X,)),
    ("astype", lambda x: x.astype(jnp.int32), lambda x: x.astype(np.int32), (X * 3,)),
    ("index_basic", lambda x: x[1:, ::2], lambda x: x[1:, ::2], (X,)),
    ("index_neg", lambda x: x[-1, ::-1], lambda x: x[-1, ::-1], (X,)),
    ("index_none", lambda x: x[None, :, 1], lambda x: x[None, :, 1], (X,)),
    ("index_array", lambda x: x[np.array([2, 0])], lambda x: x[np.array([2, 0])], (X,)),
    ("at_set", lambda x: x.at[1, 2].set(9.0), lambda x: _at(x, (1, 2), 9.0, "set"), (X,)),
    ("at_add", lambda x: x.at[:, 1].add(1.0), lambda x: _at(x, (slice(None), 1), 1.0, "add"),
     (X,)),
    ("at_mul", lambda x: x.at[0].multiply(2.0), lambda x: _at(x, 0, 2.0, "mul"), (X,)),
    ("norm", lambda x: jnp.linalg.norm(x), np.linalg.norm, (X,)),
    ("norm_axis", lambda x: jnp.linalg.norm(x, axis=1), lambda x: np.linalg.norm(x, axis=1), (X,)),
    ("tile", lambda x: jnp.tile(x, (2, 1)), lambda x: np.tile(x, (2, 1)), (X,)),
    ("repeat", lambda x: jnp.repeat(x, 2, axis=0), lambda x: np.repeat(x, 2, axis=0), (X,)),
    ("outer", lambda x: jnp.outer(x[0], x[1]), lambda x: np.outer(x[0], x[1]), (X,)),
]


def _at(x, idx, v, kind):
    x = x.copy()
    if kind == "set":
        x[idx] = v
    elif kind == "add":
        x[idx] += v
    else:
        x[idx] *= v
    return x


@pytest.mark.parametrize("name,f,ref,args", CASES, ids=[c[0] for c in CASES])
def test_against_numpy(name, f, ref, args):
    want = ref(*args)
    eager, jitted = both(f, *args)
    for got in (eager, jitted):
        got = np.asarray(got)
        assert got.shape == np.shape(want), name
        if np.asarray(want).dtype.kind in "fc":
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        else:
            np.testing.assert_array_equal(got, want)


def test_creation():
    np.testing.assert_array_equal(np.asarray(jnp.zeros((2, 3))), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(np.asarray(jnp.ones(3, jnp.int32)), np.ones(3, np.int32))
    np.testing.assert_array_equal(np.asarray(jnp.full((2,), 7.0)), np.full((2,), 7.0, np.float32))
    np.testing.assert_array_equal(np.asarray(jnp.arange(5)), np.arange(5))
    np.testing.assert_allclose(np.asarray(jnp.linspace(0, 1, 5)), np.linspace(0, 1, 5), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(jnp.eye(3)), np.eye(3, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(jnp.zeros_like(X)), np.zeros_like(X))
    np.testing.assert_array_equal(np.asarray(jnp.ones_like(I)), np.ones_like(I))


def test_dtypes():
    x = jnp.asarray(np.arange(4, dtype=np.float64))
    assert x.dtype == np.float32  # no x64, as JAX
    h = jnp.asarray(np.ones(3, np.float16))
    assert (h * 2.0).dtype == np.float16  # weak Python scalar
    b = jnp.asarray(np.ones(3, np.float32)).astype(jnp.bfloat16)
    assert b.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(b).astype(np.float32), np.ones(3, np.float32))
    assert (jnp.asarray(np.array([1, 2], np.int32)) > 1).dtype == np.bool_


NN = [
    ("relu", kiln.nn.relu, lambda x: np.maximum(x, 0)),
    ("sigmoid", kiln.nn.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    ("silu", kiln.nn.silu, lambda x: x / (1 + np.exp(-x))),
    ("softplus", kiln.nn.softplus, lambda x: np.log1p(np.exp(x))),
    ("gelu", kiln.nn.gelu,
     lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
    ("softmax", kiln.nn.softmax, lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True)),
    ("log_softmax", kiln.nn.log_softmax,
     lambda x: x - np.log(np.exp(x).sum(-1, keepdims=True))),
    ("logsumexp", lambda x: kiln.nn.logsumexp(x, axis=1), lambda x: np.log(np.exp(x).sum(1))),
]


@pytest.mark.parametrize("name,f,ref", NN, ids=[c[0] for c in NN])
def test_nn(name, f, ref):
    eager, jitted = both(f, X)
    for got in (eager, jitted):
        np.testing.assert_allclose(np.asarray(got), ref(X), rtol=1e-5, atol=1e-5)


def test_one_hot():
    got = kiln.jit(lambda i: kiln.nn.one_hot(i, 4))(np.array([0, 3, 1], np.int32))
    np.testing.assert_array_equal(np.asarray(got), np.eye(4, dtype=np.float32)[[0, 3, 1]])


def test_attention_matches_numpy():
    q = rng.standard_normal((1, 3, 2, 4)).astype(np.float32)
    k = rng.standard_normal((1, 5, 2, 4)).astype(np.float32)
    v = rng.standard_normal((1, 5, 2, 4)).astype(np.float32)
    got = np.asarray(kiln.jit(kiln.nn.dot_product_attention)(q, k, v))
    lg = np.einsum("btnh,bsnh->bnts", q, k) / 2.0
    w = np.exp(lg - lg.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, np.einsum("bnts,bsnh->btnh", w, v), rtol=1e-5, atol=1e-5)
