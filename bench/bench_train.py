#!/usr/bin/env python3
"""Training-step benchmark of Kiln's transforms on the CPU backend.

The program is an MLP's softmax cross-entropy loss (batch 256,
784->1024->1024->10, bias and relu, labels as one-hot rows), written as HLO
with each layer a call. Kiln's `grad:wrt=0,...,5` transform turns it into
the training step (the loss and the gradients of all six weights); both
programs are compiled by `kiln run --backend cpu --dump-dir` (whose first dump
is the transformed module) and timed by `kiln bench` on device buffers.
Measured in the same run:

  step / forward   kiln's step time over kiln's forward (loss only) time
                   (goal: <= 3x);
  vs NumPy         the same step hand-derived in NumPy (float32);
  vs JAX           jax.jit(jax.grad(loss, argnums=0..5)) on JAX's CPU backend;
  peak bytes       of the step with every layer checkpointed
                   (frontend_attributes={_kiln_checkpoint="true"}) against
                   the step without checkpoints;
  fastest runs     kiln's fastest single forward and step run over all
                   rounds, and their ratio: what a quiet machine would see
                   (on a shared one the medians measure its load too).

Each round times every contender --iters times after a warm-up and keeps
the medians; the figures printed are medians over --rounds rounds, the
ratios medians of the per-round ratios. One JSON line goes to stdout,
progress to stderr. Not part of the test suite.

    python bench/bench_train.py [--kiln build/kiln] [--rounds 5] [--iters 10]

OPENBLAS_CORETYPE is set to SkylakeX unless already set (see RESULTS.md:
the system OpenBLAS does not recognize this machine's CPU); NumPy and JAX
come from the Python running this script.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("OPENBLAS_CORETYPE", "SkylakeX")
try:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
except ImportError:  # pragma: no cover - depends on the environment
    jax = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, DIN, H1, H2, DOUT = 256, 784, 1024, 1024, 10
WRT = "grad:wrt=0,1,2,3,4,5"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def median(v):
    return statistics.median(v) if v else None


def timed(fn, iters):
    fn()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return median(out)


def layer_comp(name, k, n, relu):
    act = (f"  z = f32[] constant(0)\n  zb = f32[{BATCH},{n}] broadcast(z), dimensions={{}}\n"
           f"  ROOT h = f32[{BATCH},{n}] maximum(a, zb)\n") if relu else ""
    root = "" if relu else "ROOT "
    return (f"{name} {{\n  x = f32[{BATCH},{k}] parameter(0)\n  w = f32[{k},{n}] parameter(1)\n"
            f"  b = f32[{n}] parameter(2)\n"
            f"  d = f32[{BATCH},{n}] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n"
            f"  bb = f32[{BATCH},{n}] broadcast(b), dimensions={{1}}\n"
            f"  {root}a = f32[{BATCH},{n}] add(d, bb)\n{act}}}\n")


def loss_hlo(checkpoint):
    """The loss; parameters w1, b1, w2, b2, w3, b3, x, onehot."""
    mark = ', frontend_attributes={_kiln_checkpoint="true"}' if checkpoint else ""
    return f"""HloModule train

max_f32 {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}}

add_f32 {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

{layer_comp("layer1", DIN, H1, True)}
{layer_comp("layer2", H1, H2, True)}
{layer_comp("layer3", H2, DOUT, False)}
ENTRY loss {{
  w1 = f32[{DIN},{H1}] parameter(0)
  b1 = f32[{H1}] parameter(1)
  w2 = f32[{H1},{H2}] parameter(2)
  b2 = f32[{H2}] parameter(3)
  w3 = f32[{H2},{DOUT}] parameter(4)
  b3 = f32[{DOUT}] parameter(5)
  x = f32[{BATCH},{DIN}] parameter(6)
  y = f32[{BATCH},{DOUT}] parameter(7)
  h1 = f32[{BATCH},{H1}] call(x, w1, b1), to_apply=layer1{mark}
  h2 = f32[{BATCH},{H2}] call(h1, w2, b2), to_apply=layer2{mark}
  z = f32[{BATCH},{DOUT}] call(h2, w3, b3), to_apply=layer3{mark}
  c0 = f32[] constant(0)
  ninf = f32[] constant(-inf)
  m = f32[{BATCH}] reduce(z, ninf), dimensions={{1}}, to_apply=max_f32
  mb = f32[{BATCH},{DOUT}] broadcast(m), dimensions={{0}}
  s = f32[{BATCH},{DOUT}] subtract(z, mb)
  e = f32[{BATCH},{DOUT}] exponential(s)
  se = f32[{BATCH}] reduce(e, c0), dimensions={{1}}, to_apply=add_f32
  lse = f32[{BATCH}] log(se)
  lb = f32[{BATCH},{DOUT}] broadcast(lse), dimensions={{0}}
  logp = f32[{BATCH},{DOUT}] subtract(s, lb)
  py = f32[{BATCH},{DOUT}] multiply(y, logp)
  tot = f32[] reduce(py, c0), dimensions={{0,1}}, to_apply=add_f32
  scale = f32[] constant({-1.0 / BATCH!r})
  ROOT loss = f32[] multiply(tot, scale)
}}
"""


def args(rng):
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)
    onehot = np.zeros((BATCH, DOUT), np.float32)
    onehot[np.arange(BATCH), rng.integers(0, DOUT, BATCH)] = 1
    return [u(DIN, H1) * 0.05, u(H1) * 0.1, u(H1, H2) * 0.05, u(H2) * 0.1, u(H2, DOUT) * 0.05,
            u(DOUT) * 0.1, u(BATCH, DIN), onehot]


def numpy_step(w1, b1, w2, b2, w3, b3, x, y):
    a1 = x @ w1 + b1
    h1 = np.maximum(a1, 0)
    a2 = h1 @ w2 + b2
    h2 = np.maximum(a2, 0)
    z = h2 @ w3 + b3
    s = z - z.max(axis=1, keepdims=True)
    e = np.exp(s)
    se = e.sum(axis=1, keepdims=True)
    loss = -np.sum(y * (s - np.log(se))) / BATCH
    dz = (e / se * y.sum(axis=1, keepdims=True) - y) / BATCH
    gw3, gb3 = h2.T @ dz, dz.sum(axis=0)
    da2 = (dz @ w3.T) * (a2 > 0)
    gw2, gb2 = h1.T @ da2, da2.sum(axis=0)
    da1 = (da2 @ w2.T) * (a1 > 0)
    gw1, gb1 = x.T @ da1, da1.sum(axis=0)
    return loss, (gw1, gb1, gw2, gb2, gw3, gb3)


def jax_loss(w1, b1, w2, b2, w3, b3, x, y):
    h = jnp.maximum(x @ w1 + b1, 0)
    h = jnp.maximum(h @ w2 + b2, 0)
    z = h @ w3 + b3
    return -jnp.sum(y * jax.nn.log_softmax(z, axis=1)) / BATCH


def kiln_dump(kiln, src, transforms, tmp, tag):
    """The module kiln compiles after the transforms (its first dump)."""
    d = os.path.join(tmp, f"dump_{tag}")
    cmd = [kiln, "run", src, "--backend", "cpu", "--random-args", "1", "--dump-dir", d]
    for t in transforms:
        cmd += ["--transform", t]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr}")
    return os.path.join(d, "00-input.hlo")


def kiln_bench(kiln, path, iters):
    cmd = [kiln, "bench", path, "--iters", str(iters)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr}")
    return json.loads(p.stdout)


def check_gradients(kiln, src, a, tmp):
    """Kiln's step on the cpu backend against the NumPy step (a sanity check
    that the benchmarked program computes the gradients)."""
    cmd = [kiln, "run", src, "--backend", "cpu", "--transform", WRT, "--out", os.path.join(tmp, "out")]
    for i, v in enumerate(a):
        p = os.path.join(tmp, f"arg{i}.npy")
        np.save(p, v)
        cmd += ["--arg", p]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr}")
    got = [np.load(os.path.join(tmp, "out", f"{i}.npy")) for i in range(7)]
    loss, grads = numpy_step(*[v.astype(np.float64) for v in a])
    for g, w in zip(got, [loss, *grads]):
        np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    o = ap.parse_args()
    rng = np.random.default_rng(0)
    a = args(rng)
    res = {"openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}
    with tempfile.TemporaryDirectory(prefix="kiln_train_") as tmp:
        plain, ck = os.path.join(tmp, "loss.hlo"), os.path.join(tmp, "loss_ck.hlo")
        with open(plain, "w") as f:
            f.write(loss_hlo(False))
        with open(ck, "w") as f:
            f.write(loss_hlo(True))
        log("checking kiln's gradients against NumPy")
        check_gradients(o.kiln, plain, a, tmp)
        fwd = kiln_dump(o.kiln, plain, [], tmp, "fwd")
        step = kiln_dump(o.kiln, plain, [WRT], tmp, "step")
        step_ck = kiln_dump(o.kiln, ck, [WRT], tmp, "step_ck")
        step_fn = None
        if jax is not None:
            step_fn = jax.jit(jax.grad(jax_loss, argnums=(0, 1, 2, 3, 4, 5)))
            ja = [jnp.asarray(v) for v in a]
            run_jax = lambda: jax.block_until_ready(step_fn(*ja))
        rows = []
        for r in range(o.rounds):
            kf = kiln_bench(o.kiln, fwd, o.iters)
            ks = kiln_bench(o.kiln, step, o.iters)
            kc = kiln_bench(o.kiln, step_ck, o.iters)
            row = {"fwd_ms": kf["run_us_median"] / 1e3, "step_ms": ks["run_us_median"] / 1e3,
                   "fwd_min_ms": kf["run_us_min"] / 1e3, "step_min_ms": ks["run_us_min"] / 1e3,
                   "step_ck_ms": kc["run_us_median"] / 1e3, "peak": ks["peak_bytes"],
                   "peak_ck": kc["peak_bytes"], "numpy_ms": timed(lambda: numpy_step(*a), o.iters) * 1e3,
                   "jax_ms": timed(run_jax, o.iters) * 1e3 if step_fn else None}
            rows.append(row)
            log(f"round {r + 1}/{o.rounds}: {json.dumps(row)}")
    col = lambda k: [x[k] for x in rows if x[k] is not None]
    ratio = lambda k, base: median([x[k] / x[base] for x in rows if x[k] and x[base]])
    res.update({
        "forward_ms": median(col("fwd_ms")), "step_ms": median(col("step_ms")),
        "step_checkpointed_ms": median(col("step_ck_ms")), "numpy_step_ms": median(col("numpy_ms")),
        "jax_step_ms": median(col("jax_ms")), "step_over_forward": ratio("step_ms", "fwd_ms"),
        "numpy_over_kiln": ratio("numpy_ms", "step_ms"), "jax_over_kiln": ratio("jax_ms", "step_ms"),
        "forward_best_ms": min(col("fwd_min_ms")), "step_best_ms": min(col("step_min_ms")),
        "step_over_forward_best": min(col("step_min_ms")) / min(col("fwd_min_ms")),
        "peak_bytes": rows[-1]["peak"], "peak_bytes_checkpointed": rows[-1]["peak_ck"],
        "rounds": o.rounds, "iters": o.iters,
    })
    print(json.dumps(res))


if __name__ == "__main__":
    main()
