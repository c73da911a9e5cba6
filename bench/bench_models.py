#!/usr/bin/env python3
"""Real models written in JAX: Kiln's CPU backend against jax.jit, same HLO, same run.

Each workload is a JAX function (a layer, a model's forward pass, a training
step). It is exported with jax.jit(f, keep_unused=True).lower(...).as_text(
dialect="hlo"), and that text is what Kiln compiles and runs (`kiln bench
--backend cpu`, a fresh process each round, so each round also measures a
cold compile). jax.jit of the same function is timed in the same process,
with block_until_ready, on arguments already on the device, in alternating
rounds (Kiln first in even rounds, JAX first in odd ones). Per workload:

  ratio        JAX run time / Kiln run time (median of the per-round ratios;
               above 1 means Kiln is faster), and their geometric mean;
  compile      XLA's compile time (Lowered.compile(), cold: caches cleared and
               the function lowered again each time) / Kiln's cold compile_ms
               from `kiln bench` (above 1 means Kiln compiles faster);
  peak bytes   Kiln's peak_bytes (parameters, outputs and the peak of live
               temporaries) from `kiln bench`;
  error        Kiln's outputs (`kiln run --backend cpu --arg X.npy ... --out
               DIR`) against JAX's on the same random arguments: for each
               output max|kiln - jax| / max|jax|, the largest over the outputs;
               above --tolerance (or 4 ulps of the narrowest float type the
               program computes in, f16 or bf16, if larger) the workload is
               flagged MISMATCH.

A workload Kiln cannot compile or run is reported with the first line of
Kiln's error and no ratio; it is never dropped. Not part of the test suite.

    .venv/bin/python bench/bench_models.py [--only NAME,...] [--rounds 3]
        [--kiln build/kiln] [--export-dir DIR] [--export-only] [--json]
        [--list] [--extra FILE.py]

--extra FILE.py adds the workloads of a Python file kept outside the
repository (the issue's "programs that are not in the repository"): it
defines WORKLOADS, a dict of name -> (description, fn(rng) -> (f, args)),
the same form as below, and may import this module's helpers
(`from bench_models import uni, layernorm, ...`).

Both sides run on the same arguments: the workload's (saved as .npy and
given to `kiln bench --arg`), so that programs whose work depends on the
data (a while loop that stops when it converges, a sort, a gather) do the
same work on both. The token ids of the embedding workloads are spread over
the table inside the program (a multiplicative hash of the given ids and
their position), so that they touch rows all over it.

OPENBLAS_CORETYPE: nothing is set. Kiln picks its OpenBLAS core itself at
start (executor/cpu/cpu_blas.h; a variable already in the environment is
kept); XLA does not use OpenBLAS. The meta record says what the system
library detects and what the environment held.
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np



def _jax_platform_for(argv):
    """JAX runs where Kiln runs: on the GPU for --backend cuda, else on the CPU.
    Decided before jax is imported (bench_cpu imports it, defaulting to cpu); a
    JAX_PLATFORMS already in the environment wins."""
    for i, a in enumerate(argv):
        if a == "--backend" and i + 1 < len(argv):
            return "cuda" if argv[i + 1] == "cuda" else "cpu"
        if a.startswith("--backend="):
            return "cuda" if a.split("=", 1)[1] == "cuda" else "cpu"
    return "cpu"


os.environ.setdefault("JAX_PLATFORMS", _jax_platform_for(sys.argv[1:]))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cpu import chain_fn, log, median, mlp_args, mlp_fn, openblas_cores  # noqa: E402

import jax  # noqa: E402  (JAX_PLATFORMS set above: cpu, or cuda for --backend cuda)
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- model pieces -----------------------------------------------------------

def uni(rng, *shape, scale=1.0):
    return (rng.uniform(-1, 1, shape) * scale).astype(np.float32)


def raw_ids(rng, *shape):
    """Ids in kiln bench's range for signed ints, [-8, 8)."""
    return rng.integers(-8, 8, shape).astype(np.int32)


def spread_ids(raw, vocab):
    """Ids spread over [0, vocab) whatever the given ids are: a hash of the
    id and its position (kiln bench only draws ids in [-8, 8))."""
    u = raw.astype(jnp.uint32)
    pos = lax.iota(jnp.uint32, raw.size).reshape(raw.shape)
    mix = u * jnp.uint32(2654435761) + pos * jnp.uint32(40503) + jnp.uint32(12345)
    return ((mix >> 7) % jnp.uint32(vocab)).astype(jnp.int32)


def layernorm(x, g, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * lax.rsqrt(v + eps) * g + b


def attention(p, x, heads, causal=False):
    bsz, seq, d = x.shape
    hd = d // heads
    split = lambda t: t.reshape(bsz, seq, heads, hd)
    q, k, v = split(x @ p["wq"]), split(x @ p["wk"]), split(x @ p["wv"])
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * np.float32(1 / math.sqrt(hd))
    if causal:
        mask = jnp.tril(jnp.ones((seq, seq), bool))
        s = jnp.where(mask, s, np.float32(-1e9))
    a = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(bsz, seq, d)
    return o @ p["wo"]


def attn_params(rng, d):
    s = 1 / math.sqrt(d)
    return {k: uni(rng, d, d, scale=s) for k in ("wq", "wk", "wv", "wo")}


def block_params(rng, d, ff):
    return {"attn": attn_params(rng, d), "ln1_g": np.ones(d, np.float32),
            "ln1_b": np.zeros(d, np.float32), "ln2_g": np.ones(d, np.float32),
            "ln2_b": np.zeros(d, np.float32), "w1": uni(rng, d, ff, scale=1 / math.sqrt(d)),
            "b1": uni(rng, ff, scale=0.1), "w2": uni(rng, ff, d, scale=1 / math.sqrt(ff)),
            "b2": uni(rng, d, scale=0.1)}


def block(p, x, heads, causal=False):
    """A pre-LN transformer block: attention and a GELU MLP, each residual."""
    x = x + attention(p["attn"], layernorm(x, p["ln1_g"], p["ln1_b"]), heads, causal)
    h = layernorm(x, p["ln2_g"], p["ln2_b"])
    h = jax.nn.gelu(h @ p["w1"] + p["b1"])
    return x + h @ p["w2"] + p["b2"]


def cross_entropy(logits, onehot):
    return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits, axis=-1), axis=-1))


def conv(x, w, stride=1):
    return lax.conv_general_dilated(x, w, (stride, stride), "SAME",
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))


def max_pool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def batch_norm(x, g, b, eps=1e-5):
    """Training-mode batch norm over N, H, W."""
    m = x.mean((0, 1, 2))
    v = ((x - m) ** 2).mean((0, 1, 2))
    return (x - m) * lax.rsqrt(v + eps) * g + b


def flat(fn, tree_args, extra):
    """fn(tree, *extra) as a function of flat arrays: (f(*leaves, *extra), args)."""
    leaves, tdef = jax.tree_util.tree_flatten(tree_args)
    n = len(leaves)
    return (lambda *a: fn(jax.tree_util.tree_unflatten(tdef, a[:n]), *a[n:])), leaves + extra


# ---- workloads: (function of flat arrays, its arguments) ------------------

def w_chain(rng):
    n = 16 * 1024 * 1024
    return chain_fn(jnp), [uni(rng, n), uni(rng, n)]


def w_dot(rng):
    return (lambda a, b: a @ b), [uni(rng, 2048, 2048), uni(rng, 2048, 2048)]


def w_mlp(rng):
    return mlp_fn(jnp), mlp_args(rng, 256, 784, 1024, 1024, 10)


def w_mlp_grad(rng):
    a = mlp_args(rng, 256, 784, 1024, 1024, 10)
    onehot = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]

    def loss(p, x, y):
        w1, b1, w2, b2, w3, b3 = p
        h = jax.nn.relu(x @ w1 + b1)
        h = jax.nn.relu(h @ w2 + b2)
        return cross_entropy(h @ w3 + b3, y)
    return flat(jax.value_and_grad(loss), list(a[1:]), [a[0], onehot])


def w_transformer(rng):
    p = block_params(rng, 256, 1024)
    return flat(lambda p, x: block(p, x, 4), p, [uni(rng, 8, 128, 256)])


def w_transformer_grad(rng):
    p = block_params(rng, 256, 1024)
    loss = lambda p, x: jnp.mean(block(p, x, 4) ** 2)
    return flat(jax.value_and_grad(loss), p, [uni(rng, 8, 128, 256)])


def convnet_params(rng):
    return {"c1": uni(rng, 3, 3, 3, 32, scale=0.3), "cb1": uni(rng, 32, scale=0.1),
            "c2": uni(rng, 3, 3, 32, 64, scale=0.1), "cb2": uni(rng, 64, scale=0.1),
            "w": uni(rng, 64, 10, scale=0.1), "b": uni(rng, 10, scale=0.1)}


def convnet(p, x):
    h = jax.nn.relu(conv(x, p["c1"]) + p["cb1"])
    h = jax.nn.relu(conv(h, p["c2"]) + p["cb2"])
    h = max_pool(h).mean((1, 2))
    return h @ p["w"] + p["b"]


def w_convnet(rng):
    return flat(convnet, convnet_params(rng), [uni(rng, 16, 32, 32, 3)])


def w_convnet_grad(rng):
    onehot = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 16)]
    loss = lambda p, x, y: cross_entropy(convnet(p, x), y)
    return flat(jax.value_and_grad(loss), convnet_params(rng), [uni(rng, 16, 32, 32, 3), onehot])


def w_layernorm_softmax(rng):
    f = lambda x, g, b: jax.nn.softmax(layernorm(x, g, b), axis=-1)
    return f, [uni(rng, 4096, 1024), uni(rng, 1024), uni(rng, 1024)]


def w_gru_scan(rng):
    h = 256
    p = {k: uni(rng, h, h, scale=1 / math.sqrt(h)) for k in ("wz", "wr", "wh", "uz", "ur", "uh")}
    p.update({k: uni(rng, h, scale=0.1) for k in ("bz", "br", "bh")})

    def gru(p, xs, h0):
        def step(hc, x):
            z = jax.nn.sigmoid(x @ p["wz"] + hc @ p["uz"] + p["bz"])
            r = jax.nn.sigmoid(x @ p["wr"] + hc @ p["ur"] + p["br"])
            hh = jnp.tanh(x @ p["wh"] + (r * hc) @ p["uh"] + p["bh"])
            hn = (1 - z) * hc + z * hh
            return hn, hn
        return lax.scan(step, h0, xs)
    return flat(gru, p, [uni(rng, 64, 32, h), uni(rng, 32, h)])


def w_embedding(rng):
    vocab, d = 32000, 256

    def loss(table, ids, w):
        return jnp.sum(table[spread_ids(ids, vocab)] * w)
    f = jax.value_and_grad(loss)
    return f, [uni(rng, vocab, d), raw_ids(rng, 32, 128), uni(rng, 32, 128, d)]


def w_mha_small_heads(rng):
    """Self-attention, batch 4, seq 256, d 512, 32 heads of 16."""
    return flat(lambda p, x: attention(p, x, 32), attn_params(rng, 512), [uni(rng, 4, 256, 512)])


LM = dict(vocab=4096, d=256, ff=1024, heads=4, layers=4, batch=4, seq=128)


def w_transformer_lm_adam(rng):
    """A causal LM training step: embedding, 4 pre-LN blocks, final LN, tied
    output projection, next-token cross-entropy, value_and_grad and Adam."""
    c = LM
    p = {"emb": uni(rng, c["vocab"], c["d"], scale=0.02),
         "pos": uni(rng, c["seq"], c["d"], scale=0.02),
         "blocks": [block_params(rng, c["d"], c["ff"]) for _ in range(c["layers"])],
         "lnf_g": np.ones(c["d"], np.float32), "lnf_b": np.zeros(c["d"], np.float32)}

    def loss(p, ids):
        tok = spread_ids(ids, c["vocab"])
        x = p["emb"][tok[:, :-1]] + p["pos"]
        for bp in p["blocks"]:
            x = block(bp, x, c["heads"], causal=True)
        logits = layernorm(x, p["lnf_g"], p["lnf_b"]) @ p["emb"].T
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tok[:, 1:, None], axis=-1))

    def step(state, ids, t):
        p, m, v = state
        l, g = jax.value_and_grad(loss)(p, ids)
        b1, b2, lr, eps = np.float32(0.9), np.float32(0.999), np.float32(1e-3), np.float32(1e-8)
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        tt = t + 1
        c1, c2 = 1 - b1 ** tt, 1 - b2 ** tt
        p = jax.tree_util.tree_map(lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps),
                                   p, m, v)
        return l, p, m, v
    zeros = jax.tree_util.tree_map(np.zeros_like, p)
    state = (p, zeros, jax.tree_util.tree_map(lambda a: np.abs(a) * 0.01, p))
    return flat(step, state, [raw_ids(rng, c["batch"], c["seq"] + 1), np.float32(3)])


def resnet_params(rng, ch):
    s = 1 / math.sqrt(9 * ch)
    return {"c1": uni(rng, 3, 3, ch, ch, scale=s), "g1": np.ones(ch, np.float32),
            "b1": np.zeros(ch, np.float32), "c2": uni(rng, 3, 3, ch, ch, scale=s),
            "g2": np.ones(ch, np.float32), "b2": np.zeros(ch, np.float32)}


def resnet_block(p, x):
    h = jax.nn.relu(batch_norm(conv(x, p["c1"]), p["g1"], p["b1"]))
    h = batch_norm(conv(h, p["c2"]), p["g2"], p["b2"])
    return jax.nn.relu(h + x)


def w_resnet_block(rng):
    """conv3x3-BN-relu-conv3x3-BN + identity, relu; batch 8, 16x16x64."""
    return flat(resnet_block, resnet_params(rng, 64), [uni(rng, 8, 16, 16, 64)])


def w_resnet_block_grad(rng):
    loss = lambda p, x: jnp.mean(resnet_block(p, x) ** 2)
    return flat(jax.value_and_grad(loss), resnet_params(rng, 64), [uni(rng, 8, 16, 16, 64)])


def w_topk(rng):
    """Top-5 accuracy of 256 rows of 1000 logits (lax.top_k), as an eval step."""
    def acc(logits, labels):
        _, idx = lax.top_k(logits, 5)
        return jnp.mean(jnp.any(idx == (labels % 1000)[:, None], axis=1).astype(jnp.float32)), idx
    return acc, [uni(rng, 256, 1000), raw_ids(rng, 256)]


def fft_filter(x, gain):
    return jnp.fft.irfft(jnp.fft.rfft(x, axis=-1) * gain, n=x.shape[-1], axis=-1)


def w_fft_filter(rng):
    """Spectral filter of 64 real signals of 8192: rfft, a real gain per bin, irfft."""
    return fft_filter, [uni(rng, 64, 8192), uni(rng, 64, 4097)]


def fft2_mag(x):
    return jnp.abs(jnp.fft.fft2(x))


def w_fft2(rng):
    """|fft2| of 16 real 256x256 images (a c64 2-D FFT)."""
    return fft2_mag, [uni(rng, 16, 256, 256)]


def spd_of(x):
    """A symmetric positive definite matrix (per batch) from any x: x x^T / n + I."""
    n = x.shape[-1]
    return x @ jnp.swapaxes(x, -1, -2) / np.float32(n) + jnp.eye(n, dtype=x.dtype)


def w_linalg_cholesky_solve(rng):
    """Batched SPD solve: 32 systems of 128, cholesky + two solve_triangular (LAPACK calls)."""
    import jax.scipy.linalg as jsl

    def f(x, b):
        c = jnp.linalg.cholesky(spd_of(x))
        y = jsl.solve_triangular(c, b, lower=True)
        return jsl.solve_triangular(c, y, lower=True, trans=1)
    return f, [uni(rng, 32, 128, 128), uni(rng, 32, 128, 16)]


def w_linalg_solve(rng):
    """jnp.linalg.solve of a 512x512 system with 64 right-hand sides (getrf + trsm)."""
    def f(a, b):
        return jnp.linalg.solve(a + 4 * jnp.eye(512, dtype=a.dtype), b)
    return f, [uni(rng, 512, 512), uni(rng, 512, 64)]


def w_linalg_qr(rng):
    """Reduced QR of a 1024x256 matrix (geqrf + orgqr), then Q^T b and R."""
    def f(a, b):
        q, r = jnp.linalg.qr(a)
        return q.T @ b, r
    return f, [uni(rng, 1024, 256), uni(rng, 1024, 8)]


def w_linalg_eigh(rng):
    """eigh of a 256x256 symmetric matrix: eigenvalues and the projection V diag(w) V^T."""
    def f(x):
        w, v = jnp.linalg.eigh(x + x.T)
        return w, (v * jnp.maximum(w, 0)) @ v.T
    return f, [uni(rng, 256, 256)]


def w_linalg_svd(rng):
    """Reduced SVD of 256x128 (gesdd) and the rank-16 reconstruction."""
    def f(x):
        u, s, vt = jnp.linalg.svd(x, full_matrices=False)
        return s, (u[:, :16] * s[:16]) @ vt[:16]
    return f, [uni(rng, 256, 128)]


def w_linalg_slogdet_batched(rng):
    """slogdet and inv over a batch of 512 matrices of 8x8 (vmapped getrf)."""
    def f(x):
        a = x + 3 * jnp.eye(8, dtype=x.dtype)
        s, ld = jnp.linalg.slogdet(a)
        return s * ld, jnp.linalg.inv(a)
    return f, [uni(rng, 512, 8, 8)]


def w_half_act_norm(rng):
    """f16 and bf16 elementwise work: a GELU/SiLU mix in f16 and a layernorm
    in bf16 (means and variances accumulated in f32, as jnp upcasts them)."""
    def f(x, g):
        h = x.astype(jnp.float16)
        a = jax.nn.gelu(h) + jax.nn.silu(h) * jnp.cos(h) - jnp.sqrt(jnp.abs(h) + 1)
        z = x.astype(jnp.bfloat16)
        m = jnp.mean(z, axis=-1, keepdims=True)
        v = jnp.mean(jnp.square(z - m), axis=-1, keepdims=True)
        n = (z - m) * lax.rsqrt(v + 1e-5) * g.astype(jnp.bfloat16)
        return a.astype(jnp.float32), jnp.exp(n).astype(jnp.float32)
    return f, [uni(rng, 1024, 1024, scale=3.0), uni(rng, 1024)]


WORKLOADS = {
    "chain": ("10-op elementwise chain, 16M f32", w_chain),
    "dot": ("dot 2048x2048 f32", w_dot),
    "mlp": ("MLP forward, batch 256, 784-1024-1024-10", w_mlp),
    "mlp_grad": ("MLP value_and_grad step (softmax cross-entropy)", w_mlp_grad),
    "transformer": ("pre-LN transformer block, batch 8, seq 128, d 256, 4 heads", w_transformer),
    "transformer_grad": ("its value_and_grad", w_transformer_grad),
    "convnet": ("convnet: two 3x3 convs 32x32x3->32->64, max-pool, mean-pool, dense; batch 16",
                w_convnet),
    "convnet_grad": ("its value_and_grad", w_convnet_grad),
    "layernorm_softmax": ("layernorm + softmax over 4096x1024", w_layernorm_softmax),
    "gru_scan": ("GRU-style lax.scan, 64 steps, batch 32, hidden 256", w_gru_scan),
    "embedding": ("embedding gather + scatter-add gradient, 32000x256 table, 4096 ids",
                  w_embedding),
    "mha_small_heads": ("self-attention, batch 4, seq 256, d 512, 32 heads of 16",
                        w_mha_small_heads),
    "transformer_lm_adam": ("causal LM step: embedding 4096x256, 4 blocks, seq 128, batch 4, "
                            "value_and_grad + Adam", w_transformer_lm_adam),
    "resnet_block": ("ResNet block, 2 conv3x3 + batch norm, batch 8, 16x16x64", w_resnet_block),
    "resnet_block_grad": ("its value_and_grad", w_resnet_block_grad),
    "topk": ("top-5 accuracy, lax.top_k over 256x1000 logits", w_topk),
    "fft_filter": ("rfft, gain, irfft over 64 signals of 8192", w_fft_filter),
    "fft2": ("|fft2| of 16 real 256x256 images", w_fft2),
    "linalg_cholesky_solve": ("32 SPD solves of 128: cholesky + 2 solve_triangular",
                              w_linalg_cholesky_solve),
    "linalg_solve": ("jnp.linalg.solve 512x512, 64 right-hand sides", w_linalg_solve),
    "linalg_qr": ("reduced QR of 1024x256, Q^T b", w_linalg_qr),
    "linalg_eigh": ("eigh of 256x256 + V diag(w+) V^T", w_linalg_eigh),
    "linalg_svd": ("reduced SVD of 256x128 + rank-16 reconstruction", w_linalg_svd),
    "linalg_slogdet_batched": ("slogdet and inv of 512 matrices of 8x8", w_linalg_slogdet_batched),
    "half_act_norm": ("f16 GELU/SiLU/cos mix and bf16 layernorm + exp over 1024x1024",
                      w_half_act_norm),
}


# ---- export -----------------------------------------------------------------

DTYPES = {"float32": "f32", "int32": "s32", "uint32": "u32", "bool": "pred", "float16": "f16"}


def shape_text(dtype, shape):
    """HLO's spelling of a shape: f32[8,128]."""
    return f"{DTYPES.get(np.dtype(dtype).name, str(dtype))}[{','.join(map(str, shape))}]"


def export(name, fn, args):
    """(jitted function, HLO text, argument and output shapes)."""
    jf = jax.jit(fn, keep_unused=True)
    lowered = jf.lower(*args)
    outs = jax.tree_util.tree_leaves(lowered.out_info)
    return jf, lowered.as_text(dialect="hlo"), {
        "workload": name, "description": WORKLOADS[name][0],
        "params": [shape_text(np.asarray(a).dtype, np.shape(a)) for a in args],
        "outputs": [shape_text(o.dtype, o.shape) for o in outs],
        "exported_by": f"jax {jax.__version__}: jax.jit(f, keep_unused=True).lower(...)"
                       ".as_text(dialect='hlo')",
    }


# ---- Kiln -------------------------------------------------------------------

class KilnError(Exception):
    def __init__(self, cmd, rc, stderr):
        lines = [l for l in stderr.splitlines() if l.strip()]
        self.first_line = lines[0] if lines else f"exit status {rc}, no message"
        super().__init__(f"{' '.join(cmd)}: exit {rc}: {self.first_line}")


def kiln_call(cmd, timeout):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise KilnError(cmd, "timeout", f"timed out after {timeout} s")
    if p.returncode != 0:
        raise KilnError(cmd, p.returncode, p.stderr)
    return p.stdout


def save_args(args, tmp):
    """The arguments as .npy files, for kiln run and kiln bench --arg."""
    files = []
    for i, a in enumerate(args):
        f = os.path.join(tmp, f"arg{i}.npy")
        np.save(f, np.asarray(a))
        files.append(f)
    return files


def arg_flags(files):
    return [x for f in files for x in ("--arg", f)]


def kiln_bench(o, path, iters, argfiles, warmup=1):
    cmd = [o.kiln, "bench", path, "--backend", o.backend, "--iters", str(iters), "--warmup",
           str(warmup)] + arg_flags(argfiles)
    return json.loads(kiln_call(cmd, o.timeout))


def kiln_outputs(o, path, argfiles, n_out, tmp):
    cmd = [o.kiln, "run", path, "--backend", o.backend, "--out", os.path.join(tmp, "out")]
    cmd += arg_flags(argfiles)
    kiln_call(cmd, o.timeout)
    return [np.load(os.path.join(tmp, "out", f"{i}.npy")) for i in range(n_out)]


def rel_error(got, want):
    """max over outputs of max|got - want| / max|want| (shapes must agree)."""
    worst = 0.0
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape:
            return float("inf")
        if w.size == 0:
            continue
        scale = max(float(np.max(np.abs(w))), 1e-30)
        err = float(np.max(np.abs(g - w))) / scale
        worst = max(worst, err if not math.isnan(err) else float("inf"))
    return worst


# ---- timing -----------------------------------------------------------------

def jax_time(run, iters):
    """Seconds per call: one warm-up, then the median and minimum of `iters`."""
    run()
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run()
        t.append(time.perf_counter() - t0)
    return median(t), min(t)


def xla_compile_s(fn, args, runs):
    """Cold XLA compile times: caches cleared, lowered afresh, compiled."""
    out = []
    for _ in range(runs):
        jax.clear_caches()
        lowered = jax.jit(fn, keep_unused=True).lower(*args)
        t0 = time.perf_counter()
        lowered.compile()
        out.append(time.perf_counter() - t0)
    return out


# Units of the last place of the narrow float types, relative (2^-mantissa bits).
NARROW_EPS = (("bf16[", 2.0**-7), ("f16[", 2.0**-10))


def tolerance_for(hlo, tolerance):
    """The accepted error: --tolerance, or 4 units of the last place of the
    narrowest float type the program computes in, if larger. XLA keeps f16
    and bf16 intermediates in f32 between fused ops (excess precision) where
    Kiln rounds after every op as the interpreter does, so such programs
    differ by a few narrow ulps by design."""
    eps = [e for key, e in NARROW_EPS if key in hlo]
    return max([tolerance] + [4 * e for e in eps])


def iters_for(seconds, o):
    return max(o.min_iters, min(o.max_iters, int(o.target_s / max(seconds, 1e-6))))


def bench_one(o, name, tmp):
    desc, make = WORKLOADS[name]
    res = {"workload": name, "description": desc, "kiln_error": None, "ratio": None}
    rng = np.random.default_rng(sum(map(ord, name)))
    fn, args = make(rng)
    jf, hlo, shapes = export(name, fn, args)
    path = os.path.join(tmp, f"{name}.hlo")
    with open(path, "w") as f:
        f.write(hlo)
    res["params"] = len(args)
    res["hlo_bytes"] = len(hlo)
    argfiles = save_args(args, tmp)

    # JAX: compile, outputs, a probe for the number of iterations.
    res["xla_compile_ms"] = median(xla_compile_s(fn, args, o.compile_runs)) * 1e3
    dev = [jnp.asarray(a) for a in args]
    run_jax = lambda: jax.block_until_ready(jf(*dev))
    want = [np.asarray(x) for x in jax.tree_util.tree_leaves(run_jax())]
    t0 = time.perf_counter()
    run_jax()
    jax_iters = iters_for(time.perf_counter() - t0, o)

    def failed(e, where):
        """Kiln could not compile or run it: the row says so, JAX's time stays."""
        res["kiln_error"] = e.first_line.replace(path, f"{name}.hlo")
        res["kiln_error_in"] = where
        log(f"{name}: {e}")
        res["jax_ms"] = jax_time(run_jax, jax_iters)[0] * 1e3
        return res

    # Kiln: correctness on the same arguments, then a probe.
    res["max_rel_error"], res["correct"] = None, False
    run_error = None
    try:
        got = kiln_outputs(o, path, argfiles, len(want), tmp)
        res["max_rel_error"] = rel_error(got, want)
        res["tolerance"] = tolerance_for(hlo, o.tolerance)
        res["correct"] = res["max_rel_error"] <= res["tolerance"]
    except KilnError as e:
        run_error = e
        res["output_error"] = "kiln run: " + e.first_line.replace(path, f"{name}.hlo")
    except (OSError, ValueError) as e:
        res["output_error"] = "reading kiln's outputs: " + str(e).splitlines()[0]
    try:
        probe = kiln_bench(o, path, 1, argfiles, 0)
    except KilnError as e:
        return failed(e, "kiln bench")
    if run_error is not None:
        log(f"{name}: {run_error}")
    kiln_iters = iters_for(probe["run_us_median"] / 1e6, o)
    compiles = [probe["compile_ms"]]
    cc = [probe.get("cc_ms")]

    rows = []
    for r in range(o.rounds):
        row = {}
        order = ("kiln", "jax") if r % 2 == 0 else ("jax", "kiln")
        for who in order:
            if who == "kiln":
                try:
                    k = kiln_bench(o, path, kiln_iters, argfiles)
                except KilnError as e:
                    return failed(e, f"kiln bench, round {r + 1}")
                row["kiln"], row["kiln_min"] = k["run_us_median"] / 1e6, k["run_us_min"] / 1e6
                compiles.append(k["compile_ms"])
                cc.append(k.get("cc_ms"))
                res["peak_bytes"] = k.get("peak_bytes")
                res["temp_peak_bytes"] = k.get("temp_peak_bytes")
            else:
                row["jax"], row["jax_min"] = jax_time(run_jax, jax_iters)
        rows.append(row)
        log(f"{name} round {r + 1}/{o.rounds}: kiln {row['kiln'] * 1e3:.3f} ms, "
            f"jax {row['jax'] * 1e3:.3f} ms, ratio {row['jax'] / row['kiln']:.3f}")
    col = lambda k: [x[k] for x in rows]
    res.update({
        "kiln_ms": median(col("kiln")) * 1e3, "jax_ms": median(col("jax")) * 1e3,
        "kiln_best_ms": min(col("kiln_min")) * 1e3, "jax_best_ms": min(col("jax_min")) * 1e3,
        "ratio": median([x["jax"] / x["kiln"] for x in rows]),
        "kiln_iters": kiln_iters, "jax_iters": jax_iters,
        "kiln_compile_ms": median(compiles), "kiln_compile_first_ms": compiles[0],
        "kiln_cc_ms": median([c for c in cc if c is not None]) if any(c is not None for c in cc)
        else None,
    })
    res["ratio_best"] = res["jax_best_ms"] / res["kiln_best_ms"]
    res["compile_ratio"] = res["xla_compile_ms"] / res["kiln_compile_ms"]
    return res


# ---- report -----------------------------------------------------------------

def geomean(v):
    v = [x for x in v if x]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def table(results, summary):
    lines = ["| workload | kiln ms | jax ms | ratio | compile kiln ms | compile xla ms | "
             "compile ratio | kiln peak MB | max rel err |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.get("kiln_error"):
            lines.append(f"| {r['workload']} | FAILS ({r.get('kiln_error_in')}): "
                         f"`{r['kiln_error']}` | {fmt(r.get('jax_ms'), '.3f')} | - | - | "
                         f"{fmt(r.get('xla_compile_ms'), '.0f')} | - | - | - |")
            continue
        err = fmt(r.get("max_rel_error"), ".1e")
        if r.get("output_error"):
            err = f"**unchecked: {r['output_error']}**"
        elif not r.get("correct"):
            err = f"**MISMATCH {err}**"
        peak = r.get("peak_bytes")
        lines.append(
            f"| {r['workload']} | {fmt(r['kiln_ms'], '.3f')} | {fmt(r['jax_ms'], '.3f')} | "
            f"{fmt(r['ratio'], '.3f')} | {fmt(r['kiln_compile_ms'], '.0f')} | "
            f"{fmt(r['xla_compile_ms'], '.0f')} | {fmt(r['compile_ratio'], '.2f')} | "
            f"{fmt(peak and peak / 1e6, '.1f')} | {err} |")
    lines.append(f"\nGeometric mean of the run-time ratios: {fmt(summary['geomean_ratio'], '.3f')} "
                 f"over {summary['ratios']} workloads; of the compile-time ratios: "
                 f"{fmt(summary['geomean_compile_ratio'], '.3f')}; failing in Kiln: "
                 f"{', '.join(summary['kiln_failures']) or 'none'}; mismatching: "
                 f"{', '.join(summary['mismatches']) or 'none'}; outputs not checked: "
                 f"{', '.join(summary['unchecked']) or 'none'}.")
    return "\n".join(lines)


def add_extra(path):
    """Adds the WORKLOADS dict of the Python file at path (see --extra)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "kiln_extra_" + os.path.splitext(os.path.basename(path))[0], path)
    if spec is None:
        sys.exit(f"bench_models: --extra {path}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_models", sys.modules[__name__])
    try:
        spec.loader.exec_module(mod)
    except (OSError, SyntaxError, ImportError) as e:
        sys.exit(f"bench_models: --extra {path}: {e}")
    extra = getattr(mod, "WORKLOADS", None)
    if not isinstance(extra, dict):
        sys.exit(f"bench_models: --extra {path}: defines no WORKLOADS dict")
    for name, entry in extra.items():
        if name in WORKLOADS:
            sys.exit(f"bench_models: --extra {path}: workload {name} is already defined")
        if not (isinstance(entry, tuple) and len(entry) == 2 and callable(entry[1])):
            sys.exit(f"bench_models: --extra {path}: WORKLOADS[{name!r}] is not "
                     "(description, fn)")
        WORKLOADS[name] = entry


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.environ.get("KILN_BIN") or
                    os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--backend", default="cpu",
                    help="Kiln's backend (cuda: scripts/gpu-check.sh, JAX then runs on the GPU)")
    ap.add_argument("--only", default=None, help="comma-separated workloads (see --list)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--target-s", type=float, default=0.5,
                    help="timed seconds per contender per round, which sets the iterations")
    ap.add_argument("--min-iters", type=int, default=3)
    ap.add_argument("--max-iters", type=int, default=50)
    ap.add_argument("--compile-runs", type=int, default=3, help="cold XLA compiles per workload")
    ap.add_argument("--tolerance", type=float, default=1e-3,
                    help="largest max|kiln-jax|/max|jax| accepted as correct")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per kiln command")
    ap.add_argument("--export-dir", default=None,
                    help="write NAME.hlo and NAME.json (argument and output shapes) there")
    ap.add_argument("--export-only", action="store_true", help="export, do not benchmark")
    ap.add_argument("--json", action="store_true",
                    help="JSON lines on stdout (meta, one per workload, summary); the table "
                         "goes to stderr")
    ap.add_argument("--list", action="store_true", help="list the workloads and exit")
    ap.add_argument("--extra", action="append", default=[], metavar="FILE.py",
                    help="also the WORKLOADS of FILE.py (programs kept outside the repository)")
    o = ap.parse_args()
    for path in o.extra:
        add_extra(path)
    if o.list:
        for k, (d, _) in WORKLOADS.items():
            print(f"{k:22s} {d}")
        return
    if o.rounds < 1:
        sys.exit("bench_models: --rounds must be at least 1")
    names = o.only.split(",") if o.only else list(WORKLOADS)
    bad = [n for n in names if n not in WORKLOADS]
    if bad:
        sys.exit(f"bench_models: unknown workload(s) {', '.join(bad)}; --list shows them")
    dev = jax.devices()[0]
    log(f"bench_models: kiln --backend {o.backend}, JAX on {dev.platform} "
        f"({getattr(dev, 'device_kind', '?')}; JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')})")
    if o.backend == "cuda" and dev.platform == "cpu":
        sys.exit("bench_models: --backend cuda but JAX sees no GPU (JAX_PLATFORMS="
                 f"{os.environ.get('JAX_PLATFORMS')}): the ratio would be GPU against CPU")

    if o.export_dir:
        os.makedirs(o.export_dir, exist_ok=True)
        for n in names:
            fn, args = WORKLOADS[n][1](np.random.default_rng(sum(map(ord, n))))
            _, hlo, shapes = export(n, fn, args)
            with open(os.path.join(o.export_dir, f"{n}.hlo"), "w") as f:
                f.write(hlo)
            shapes["kiln_bench"] = f"kiln bench {n}.hlo --backend cpu"
            with open(os.path.join(o.export_dir, f"{n}.json"), "w") as f:
                json.dump(shapes, f, indent=1)
                f.write("\n")
            log(f"exported {n} ({len(hlo)} bytes of HLO)")
        if o.export_only:
            return
    if not os.path.exists(o.kiln):
        sys.exit(f"bench_models: no kiln binary at {o.kiln} (--kiln or KILN_BIN)")

    detected, _ = openblas_cores("none")
    tree = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or None
    meta = {"bench": "meta", "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "tree": tree, "kiln": o.kiln, "machine": platform.processor() or platform.machine(),
            "cores": len(os.sched_getaffinity(0)), "loadavg_start": os.getloadavg(),
            "jax": jax.__version__, "numpy": np.__version__, "rounds": o.rounds,
            "openblas_core_detected": detected,
            "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE")}
    out = sys.stdout if o.json else None
    if out:
        print(json.dumps(meta), flush=True)
    log(json.dumps(meta))
    # JAX's first compile in a process also starts its runtime: not a workload's cost.
    jax.jit(lambda x: x + 1).lower(np.float32(0)).compile()
    results = []
    with tempfile.TemporaryDirectory(prefix="kiln_models_") as tmp:
        for n in names:
            t0 = time.time()
            wd = os.path.join(tmp, n)
            os.makedirs(wd)
            try:
                r = bench_one(o, n, wd)
            except Exception as e:  # JAX could not export or run it: say so, go on
                first = (str(e).splitlines() or [type(e).__name__])[0]
                r = {"workload": n, "description": WORKLOADS[n][0], "ratio": None,
                     "kiln_error": f"not measured: JAX failed: {type(e).__name__}: {first}",
                     "kiln_error_in": "jax"}
                log(f"{n}: JAX failed: {e!r}")
            r["seconds"] = round(time.time() - t0, 1)
            results.append(r)
            if out:
                print(json.dumps(r), flush=True)
            log(json.dumps(r))
    ok = [r for r in results if r.get("ratio")]
    summary = {"bench": "summary", "ratios": len(ok),
               "geomean_ratio": geomean([r["ratio"] for r in ok]),
               "geomean_ratio_best": geomean([r["ratio_best"] for r in ok]),
               "geomean_compile_ratio": geomean([r["compile_ratio"] for r in ok]),
               "kiln_failures": [r["workload"] for r in results if r.get("kiln_error")],
               "mismatches": [r["workload"] for r in results
                              if not r.get("kiln_error") and not r.get("correct")
                              and not r.get("output_error")],
               "unchecked": [r["workload"] for r in results
                             if not r.get("kiln_error") and r.get("output_error")],
               "loadavg_end": os.getloadavg()}
    if out:
        print(json.dumps(summary), flush=True)
    text = table(results, summary)
    print(text, file=sys.stderr if out else sys.stdout, flush=True)


if __name__ == "__main__":
    main()
