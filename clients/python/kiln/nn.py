"""kiln.nn: activations and the usual building blocks, in kiln.numpy."""
import math

from . import lax
from . import numpy as jnp


def relu(x): return jnp.maximum(x, 0)
def relu6(x): return jnp.minimum(jnp.maximum(x, 0), 6)
def sigmoid(x): return lax.logistic(jnp.asarray(x, jnp.result_type(x, 1.0)))
def silu(x): return jnp.multiply(x, sigmoid(x))


swish = silu


def softplus(x):
    x = jnp.asarray(x, jnp.result_type(x, 1.0))
    return jnp.add(jnp.maximum(x, 0), jnp.log1p(jnp.exp(jnp.negative(jnp.abs(x)))))


def log_sigmoid(x): return jnp.negative(softplus(jnp.negative(x)))
def elu(x, alpha=1.0): return jnp.where(jnp.greater(x, 0), x, jnp.multiply(alpha, jnp.expm1(x)))
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(jnp.greater_equal(x, 0), x, jnp.multiply(negative_slope, x))


def gelu(x, approximate=True):
    x = jnp.asarray(x, jnp.result_type(x, 1.0))
    if approximate:
        c = math.sqrt(2.0 / math.pi)
        inner = jnp.multiply(c, jnp.add(x, jnp.multiply(0.044715, jnp.power(x, 3))))
        return jnp.multiply(jnp.multiply(0.5, x), jnp.add(1.0, jnp.tanh(inner)))
    return jnp.multiply(jnp.multiply(0.5, x), jnp.add(1.0, lax.erf(jnp.divide(x, math.sqrt(2.0)))))


def logsumexp(a, axis=None, keepdims=False, b=None, return_sign=False):
    if b is not None or return_sign:
        raise NotImplementedError("kiln.nn.logsumexp with b or return_sign")
    a = jnp.asarray(a)
    m = jnp.max(a, axis=axis, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, jnp.zeros_like(m))
    s = jnp.log(jnp.sum(jnp.exp(jnp.subtract(a, m)), axis=axis, keepdims=True))
    r = jnp.add(s, m)
    return r if keepdims else jnp.squeeze(r, axis) if axis is not None else jnp.reshape(r, ())


def log_softmax(x, axis=-1):
    x = jnp.asarray(x)
    shifted = jnp.subtract(x, jnp.max(x, axis=axis, keepdims=True))
    return jnp.subtract(shifted, jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True)))


def softmax(x, axis=-1):
    x = jnp.asarray(x)
    e = jnp.exp(jnp.subtract(x, jnp.max(x, axis=axis, keepdims=True)))
    return jnp.divide(e, jnp.sum(e, axis=axis, keepdims=True))


def one_hot(x, num_classes, dtype=jnp.float32, axis=-1):
    x = jnp.asarray(x)
    nd = x.ndim + 1
    ax = axis % nd
    shape = list(x.shape)
    shape.insert(ax, num_classes)
    classes = lax.broadcasted_iota(jnp.int32, tuple(shape), ax) if lax._stack() else \
        jnp._iota(tuple(shape), ax)
    return jnp.asarray(jnp.equal(jnp.expand_dims(x, ax), classes), dtype)


def dot_product_attention(query, key, value, bias=None, mask=None, scale=None, is_causal=False):
    """query [B, T, N, H], key/value [B, S, N, H] (jax.nn's layout)."""
    q, k, v = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    h = q.shape[-1]
    scale = 1.0 / math.sqrt(h) if scale is None else scale
    logits = jnp.multiply(jnp.einsum("btnh,bsnh->bnts", q, k), scale)
    if bias is not None:
        logits = jnp.add(logits, bias)
    if is_causal:
        t, s = q.shape[1], k.shape[1]
        import numpy as onp

        causal = onp.tril(onp.ones((t, s), bool))
        mask = causal if mask is None else jnp.logical_and(mask, causal)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    w = softmax(logits, axis=-1)
    return jnp.einsum("bnts,bsnh->btnh", w, v)
