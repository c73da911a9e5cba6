#!/usr/bin/env python3
"""Trains a small character-level transformer language model through kilnd.

The text is examples/python/data/kiln_tale.txt (a short story written for
this repository, about 2.6 KB). The model is a decoder-only transformer:
token and position embeddings, --layers pre-norm blocks (causal multi-head
self-attention and a GELU MLP, each with a residual), a final layer norm and
a projection to the vocabulary, trained with next-character cross-entropy
and Adam. As in train_digits.py the parameters and Adam's moments live on
the server for the whole run: a step is one jitted program (value_and_grad
of the loss, then the Adam update, donating the old state), one round trip,
so only the minibatch goes up and the scalar loss comes down (inline in the
Execute response). Written with
JAX's names: the same functions train locally with import jax (the tests
compare the two), and --jax does that here.

    KILN_SERVER=127.0.0.1:50051 python examples/python/train_charlm.py --steps 300
    python examples/python/train_charlm.py --quick     # 30 steps, for CI
"""
import argparse
import os

import numpy as np

TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "kiln_tale.txt")


def load_text(path=TEXT):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    vocab = sorted(set(text))
    ids = np.array([vocab.index(c) for c in text], np.int32)
    return ids, vocab


def init_params(vocab_size, d=64, layers=2, seq=32, seed=0):
    rng = np.random.default_rng(seed)

    def dense(n_in, n_out, scale=1.0):
        return (rng.standard_normal((n_in, n_out)) * scale / np.sqrt(n_in)).astype(np.float32)

    def ln():
        return {"g": np.ones(d, np.float32), "b": np.zeros(d, np.float32)}

    blocks = []
    for _ in range(layers):
        blocks.append({"ln1": ln(), "qkv": dense(d, 3 * d), "proj": dense(d, d, 0.5),
                       "ln2": ln(), "fc": dense(d, 4 * d), "fc_b": np.zeros(4 * d, np.float32),
                       "out": dense(4 * d, d, 0.5), "out_b": np.zeros(d, np.float32)})
    return {"tok": (rng.standard_normal((vocab_size, d)) * 0.1).astype(np.float32),
            "pos": (rng.standard_normal((seq, d)) * 0.1).astype(np.float32),
            "blocks": blocks, "ln_f": ln(), "head": dense(d, vocab_size)}


def batches(ids, batch, seq, steps, seed=0):
    """(inputs, targets) int32 pairs of shape (batch, seq): random windows of
    the text and the same windows shifted by one character."""
    rng = np.random.default_rng(seed + 1)
    for _ in range(steps):
        start = rng.integers(0, len(ids) - seq - 1, batch)
        idx = start[:, None] + np.arange(seq)[None, :]
        yield ids[idx], ids[idx + 1]


def make_parts(jax, jnp, heads=4, lr=3e-3, b1=0.9, b2=0.99, eps=1e-8):
    """(train_step, loss), not jitted, for the framework given:
    train_step(params, m, v, tokens, targets, t) -> (params, m, v, loss)."""
    tu = jax.tree_util

    def layer_norm(x, p):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * p["g"] + p["b"]

    def attention(x, p):
        b, t, d = x.shape
        hd = d // heads
        qkv = x @ p["qkv"]                                   # (b, t, 3d)
        qkv = jnp.reshape(qkv, (b, t, 3, heads, hd))
        q = jnp.transpose(qkv[:, :, 0], (0, 2, 1, 3))        # (b, h, t, hd)
        k = jnp.transpose(qkv[:, :, 1], (0, 2, 1, 3))
        v = jnp.transpose(qkv[:, :, 2], (0, 2, 1, 3))
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.float32(np.sqrt(hd))
        causal = np.tril(np.ones((t, t), bool))
        s = jnp.where(causal, s, np.float32(-1e9))
        a = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhqk,bhkd->bhqd", a, v)
        o = jnp.reshape(jnp.transpose(o, (0, 2, 1, 3)), (b, t, d))
        return o @ p["proj"]

    def block(x, p):
        x = x + attention(layer_norm(x, p["ln1"]), p)
        h = jax.nn.gelu(layer_norm(x, p["ln2"]) @ p["fc"] + p["fc_b"])
        return x + h @ p["out"] + p["out_b"]

    def logits_of(params, tokens):
        t = tokens.shape[1]
        x = jnp.take(params["tok"], tokens, axis=0) + params["pos"][:t]
        for p in params["blocks"]:
            x = block(x, p)
        return layer_norm(x, params["ln_f"]) @ params["head"]

    def loss(params, tokens, targets):
        logits = logits_of(params, tokens)
        logp = jax.nn.log_softmax(logits, axis=-1)
        onehot = jax.nn.one_hot(targets, logits.shape[-1])
        return -jnp.mean(jnp.sum(logp * onehot, axis=-1))

    def adam(params, m, v, grads, t):
        m = tu.tree_map(lambda m_, g: b1 * m_ + (1 - b1) * g, m, grads)
        v = tu.tree_map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, v, grads)
        c1 = 1 - b1 ** t
        c2 = 1 - b2 ** t
        params = tu.tree_map(lambda p, m_, v_: p - lr * (m_ / c1) / (jnp.sqrt(v_ / c2) + eps),
                             params, m, v)
        return params, m, v

    def train_step(params, m, v, tokens, targets, t):
        value, grads = jax.value_and_grad(loss)(params, tokens, targets)
        params, m, v = adam(params, m, v, grads, t)
        return params, m, v, value

    return train_step, loss


def make_model(jax, jnp, **kw):
    """(train_step, loss), jitted; train_step donates the state."""
    train_step, loss = make_parts(jax, jnp, **kw)
    return jax.jit(train_step, donate_argnums=(0, 1, 2)), jax.jit(loss)


def train(jax, jnp, steps=300, batch=16, seq=32, d=64, layers=2, seed=0, progress=True):
    """Trains from a fixed seed; returns the per-step losses."""
    ids, vocab = load_text()
    train_step, _ = make_model(jax, jnp)
    init = init_params(len(vocab), d, layers, seq, seed)
    params = jax.device_put(init)
    zeros = jax.tree_util.tree_map(lambda p: np.zeros(p.shape, np.float32), init)
    m, v = jax.device_put(zeros), jax.device_put(zeros)
    losses = []
    it = batches(ids, batch, seq, steps, seed)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, total=steps, desc="charlm")
    for t, (x, y) in enumerate(it, start=1):
        params, m, v, value = train_step(params, m, v, x, y, np.float32(t))
        losses.append(float(value))
        if progress:
            it.set_postfix(loss=f"{losses[-1]:.4f}")
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default=None, help="kilnd address (default $KILN_SERVER)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="30 steps (a smoke test)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jax", action="store_true", help="train with local JAX instead")
    opts = ap.parse_args()
    steps = 30 if opts.quick else opts.steps

    if opts.jax:
        import jax
        import jax.numpy as jnp
    else:
        import kiln as jax
        import kiln.numpy as jnp

        jax.connect(opts.server)
    losses = train(jax, jnp, steps, opts.batch, opts.seq, layers=opts.layers, seed=opts.seed)
    k = max(1, min(10, len(losses) // 3))
    first, last = np.mean(losses[:k]), np.mean(losses[-k:])
    print(f"loss {first:.4f} -> {last:.4f} (mean of the first and last {k} steps)")


if __name__ == "__main__":
    main()
