#!/usr/bin/env python3
"""Trains an MLP classifier on scikit-learn's bundled digits through kilnd.

The parameters and Adam's moments live on the server for the whole run: each
step is one jitted program (value_and_grad of the loss, then the Adam update,
donating the old parameters and moments), one round trip, so nothing but the
minibatch goes up and the loss comes down. Written against the kiln client
with JAX's names: swapping the two imports for jax and jax.numpy trains the
same model locally (tests/python compares the two).

    KILN_SERVER=127.0.0.1:50051 python examples/python/train_digits.py --steps 300
"""
import argparse

import numpy as np


def load_data(seed=0):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int32)
    perm = np.random.default_rng(seed).permutation(len(x))
    n_train = int(0.8 * len(x))
    tr, te = perm[:n_train], perm[n_train:]
    return x[tr], y[tr], x[te], y[te]


def init_params(seed=0, sizes=(64, 128, 10)):
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w = (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32)
        params.append({"w": w, "b": np.zeros(n_out, np.float32)})
    return params


def batches(n, batch, steps, seed=0):
    rng = np.random.default_rng(seed + 1)
    for _ in range(steps):
        yield rng.choice(n, batch, replace=False)


def make_parts(jax, jnp, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """(train_step, predict), not jitted, for the framework given:
    train_step(params, m, v, x, y, t) -> (params, m, v, loss)."""
    tu = jax.tree_util

    def forward(params, x):
        h = x
        for layer in params[:-1]:
            h = jax.nn.relu(h @ layer["w"] + layer["b"])
        return h @ params[-1]["w"] + params[-1]["b"]

    def loss(params, x, y):
        logits = forward(params, x)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.sum(logp * jax.nn.one_hot(y, logits.shape[-1]), axis=-1))

    def adam(params, m, v, grads, t):
        m = tu.tree_map(lambda m_, g: b1 * m_ + (1 - b1) * g, m, grads)
        v = tu.tree_map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, v, grads)
        c1 = 1 - b1 ** t
        c2 = 1 - b2 ** t
        params = tu.tree_map(lambda p, m_, v_: p - lr * (m_ / c1) / (jnp.sqrt(v_ / c2) + eps),
                             params, m, v)
        return params, m, v

    def train_step(params, m, v, x, y, t):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        params, m, v = adam(params, m, v, grads, t)
        return params, m, v, value

    return train_step, lambda p, x: jnp.argmax(forward(p, x), axis=-1)


def make_step(jax, jnp, **kw):
    """(train_step, predict), jitted; train_step donates the state."""
    train_step, predict = make_parts(jax, jnp, **kw)
    return jax.jit(train_step, donate_argnums=(0, 1, 2)), jax.jit(predict)


def train(jax, jnp, steps=300, batch=64, seed=0, progress=True):
    xtr, ytr, xte, yte = load_data(seed)
    train_step, predict = make_step(jax, jnp)
    params = jax.device_put(init_params(seed))
    zeros = jax.tree_util.tree_map(lambda p: np.zeros(p.shape, np.float32), init_params(seed))
    m, v = jax.device_put(zeros), jax.device_put(zeros)
    losses = []
    it = batches(len(xtr), batch, steps, seed)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, total=steps, desc="digits")
    for t, idx in enumerate(it, start=1):
        params, m, v, value = train_step(params, m, v, xtr[idx], ytr[idx], np.float32(t))
        losses.append(float(value))
        if progress:
            it.set_postfix(loss=f"{losses[-1]:.4f}")
    pred = np.asarray(predict(params, xte))
    return losses, float(np.mean(pred == yte))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default=None, help="kilnd address (default $KILN_SERVER)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default="digits_loss.png", help="loss curve PNG ('' for none)")
    opts = ap.parse_args()

    import kiln
    import kiln.numpy as jnp

    kiln.connect(opts.server)
    losses, acc = train(kiln, jnp, opts.steps, opts.batch, opts.seed)
    print(f"final loss {losses[-1]:.4f}, held-out accuracy {acc * 100:.2f}%")
    if opts.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(losses)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy")
        ax.set_title("digits MLP through kilnd")
        fig.tight_layout()
        fig.savefig(opts.plot)
        print(f"loss curve saved to {opts.plot}")


if __name__ == "__main__":
    main()
