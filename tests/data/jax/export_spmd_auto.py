"""Exports the small programs test_spmd_auto runs (tests/data/jax/):
mlp2.hlo, a 2-layer ReLU MLP at batch 256 (64 -> 128 -> 32), and
block_small.hlo, bench/bench_models.py's pre-LN transformer block at batch
2, sequence 16, width 64, 4 heads, MLP 128. Run with the project's .venv:
    .venv/bin/python tests/data/jax/export_spmd_auto.py
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))

import numpy as np  # noqa: E402

import bench_models as bm  # noqa: E402  (sets JAX_PLATFORMS=cpu first)
import jax  # noqa: E402


def mlp2(x, w1, b1, w2, b2):
    return jax.nn.relu(x @ w1 + b1) @ w2 + b2


def export(name, fn, args):
    text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
    with open(os.path.join(HERE, name + ".hlo"), "w") as f:
        f.write(text)


def main():
    rng = np.random.default_rng(0)
    export("mlp2", mlp2, [bm.uni(rng, 256, 64), bm.uni(rng, 64, 128), bm.uni(rng, 128),
                          bm.uni(rng, 128, 32), bm.uni(rng, 32)])
    p = bm.block_params(rng, 64, 128)
    fn, args = bm.flat(lambda p, x: bm.block(p, x, 4), p, [bm.uni(rng, 2, 16, 64)])
    export("block_small", fn, args)


if __name__ == "__main__":
    main()
