"""kiln.random against jax.random: the same key gives the same numbers, bit
for bit (normal: to a few ulp, see kiln/random.py)."""
import numpy as np
import pytest

import kiln
import kiln.numpy as knp
from kiln import random as kr

jax = pytest.importorskip("jax")
jr = jax.random

SEEDS = [0, 1, 42, 2 ** 31 - 1, -7]
SHAPES = [(), (1,), (5,), (3, 4), (2, 3, 5)]


def keys():
    return [(s, np.asarray(jr.PRNGKey(s))) for s in (0, 42, -7)]


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        a = a.view(f"u{a.dtype.itemsize}")
        b = b.view(f"u{b.dtype.itemsize}")
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", SEEDS + [np.uint32(3000000000), np.int64(2 ** 40 + 5)])
def test_prngkey(seed):
    k = kr.PRNGKey(seed)
    assert k.dtype == np.uint32 and k.shape == (2,)
    if isinstance(seed, np.int64):  # JAX without x64 truncates 64-bit seeds; kiln keeps them
        assert np.asarray(k).tolist() == [seed >> 32, seed & 0xFFFFFFFF]
    else:
        same_bits(k, jr.PRNGKey(seed))


def test_prngkey_refuses():
    with pytest.raises(TypeError):
        kr.PRNGKey(1.5)
    with pytest.raises(TypeError):
        kr.PRNGKey(np.zeros(2, np.int32))
    with pytest.raises(TypeError, match="uint32\\[2\\]"):
        kr.uniform(np.zeros(3, np.uint32))


@pytest.mark.parametrize("num", [2, 3, (2, 2)])
def test_split(num):
    for s, jk in keys():
        same_bits(kr.split(kr.PRNGKey(s), num), jr.split(jk, num))


def test_split_chain_and_fold_in():
    k, jk = kr.PRNGKey(5), jr.PRNGKey(5)
    for _ in range(3):
        k, sub = kr.split(k)
        jk, jsub = jr.split(jk)
    same_bits(k, jk)
    same_bits(sub, jsub)
    same_bits(kr.fold_in(k, 17), jr.fold_in(jk, 17))


@pytest.mark.parametrize("shape", SHAPES)
def test_bits(shape):
    for s, jk in keys():
        same_bits(kr.bits(kr.PRNGKey(s), shape), jr.bits(jk, shape))


@pytest.mark.parametrize("shape", SHAPES)
def test_uniform(shape):
    for s, jk in keys():
        same_bits(kr.uniform(kr.PRNGKey(s), shape), jr.uniform(jk, shape))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_uniform_half(dtype):
    jk = jr.PRNGKey(3)
    same_bits(kr.uniform(kr.PRNGKey(3), (4, 5), dtype), jr.uniform(jk, (4, 5), dtype))


def test_uniform_range():
    jk = jr.PRNGKey(9)
    same_bits(kr.uniform(kr.PRNGKey(9), (6,), minval=-2.0, maxval=3.0),
              jr.uniform(jk, (6,), minval=-2.0, maxval=3.0))
    lo = np.array([0.0, 1.0, 2.0], np.float32)
    same_bits(kr.uniform(kr.PRNGKey(9), (2, 3), minval=lo, maxval=5.0),
              jr.uniform(jk, (2, 3), minval=lo, maxval=5.0))


@pytest.mark.parametrize("shape", [(), (7,), (16, 8)])
def test_normal(shape):
    for s, jk in keys():
        got = np.asarray(kr.normal(kr.PRNGKey(s), shape))
        want = np.asarray(jr.normal(jk, shape))
        assert got.dtype == want.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=4e-6, atol=4e-7)


def test_normal_half():
    got = np.asarray(kr.normal(kr.PRNGKey(1), (50,), "float16")).astype(np.float32)
    want = np.asarray(jr.normal(jr.PRNGKey(1), (50,), "float16")).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-3)


def test_normal_statistics():
    x = np.asarray(kr.normal(kr.PRNGKey(0), (4000,)))
    assert abs(x.mean()) < 0.1 and abs(x.std() - 1) < 0.1


@pytest.mark.parametrize("shape,lo,hi,dtype", [((10,), 0, 10, "int32"), ((3, 4), -5, 1000, "int32"),
                                               ((8,), 0, 256, "uint8"), ((6,), -3, 3, "int8"),
                                               ((5,), 4, 4, "int32"), ((), 0, 7, "int32")])
def test_randint(shape, lo, hi, dtype):
    for s, jk in keys():
        same_bits(kr.randint(kr.PRNGKey(s), shape, lo, hi, dtype),
                  jr.randint(jk, shape, lo, hi, dtype))


def test_randint_array_bounds():
    hi = np.array([5, 50, 500], np.int32)
    same_bits(kr.randint(kr.PRNGKey(2), (2, 3), 0, hi), jr.randint(jr.PRNGKey(2), (2, 3), 0, hi))


@pytest.mark.parametrize("p,shape", [(0.5, (10,)), (0.1, (4, 5)), (0.9, ())])
def test_bernoulli(p, shape):
    for s, jk in keys():
        same_bits(kr.bernoulli(kr.PRNGKey(s), p, shape), jr.bernoulli(jk, p, shape))


def test_bernoulli_array_p_and_high():
    p = np.array([0.1, 0.5, 0.9], np.float32)
    same_bits(kr.bernoulli(kr.PRNGKey(4), p), jr.bernoulli(jr.PRNGKey(4), p))
    same_bits(kr.bernoulli(kr.PRNGKey(4), 0.3, (7,), mode="high"),
              jr.bernoulli(jr.PRNGKey(4), 0.3, (7,), mode="high"))


def test_permutation():
    for s, jk in keys():
        same_bits(kr.permutation(kr.PRNGKey(s), 10), jr.permutation(jk, 10))
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    jk = jr.PRNGKey(8)
    same_bits(kr.permutation(kr.PRNGKey(8), x), jr.permutation(jk, x))
    same_bits(kr.permutation(kr.PRNGKey(8), x, axis=1), jr.permutation(jk, x, axis=1))
    same_bits(kr.permutation(kr.PRNGKey(8), x, axis=1, independent=True),
              jr.permutation(jk, x, axis=1, independent=True))
    same_bits(kr.permutation(kr.PRNGKey(8), np.arange(1, dtype=np.int32)),
              jr.permutation(jk, np.arange(1, dtype=np.int32)))


def test_inside_jit():
    """Inside a jitted function the random ops are inlined into its program."""
    def f(key, x):
        k1, k2 = kr.split(key)
        return x + kr.normal(k1, (3,)), kr.uniform(k2, (3,)), kr.randint(k2, (2,), 0, 9)

    def jf(key, x):
        k1, k2 = jr.split(key)
        return x + jr.normal(k1, (3,)), jr.uniform(k2, (3,)), jr.randint(k2, (2,), 0, 9)

    x = np.ones(3, np.float32)
    got = kiln.jit(f)(kr.PRNGKey(11), x)
    want = jax.jit(jf)(jr.PRNGKey(11), x)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=4e-6)
    same_bits(got[1], want[1])
    same_bits(got[2], want[2])


def test_dropout_grad():
    """A key passed to a differentiated function (dropout)."""
    def loss(w, key):
        keep = kr.bernoulli(key, 0.5, (4,))
        return knp.sum(knp.where(keep, w * 2.0, 0.0))

    w = np.ones(4, np.float32)
    g = kiln.grad(loss)(w, kr.PRNGKey(1))
    keep = np.asarray(jr.bernoulli(jr.PRNGKey(1), 0.5, (4,)))
    np.testing.assert_array_equal(np.asarray(g), np.where(keep, 2.0, 0.0))
