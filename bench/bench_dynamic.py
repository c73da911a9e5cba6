#!/usr/bin/env python3
"""Bounded dynamic shapes: one Kiln executable for every batch size against
jax.jit, same program, same run.

The program is a two-layer MLP on a batch of rows with a reduction over the
batch: y = tanh(x @ w1 + b1) @ w2, s = sum of y over the rows. Kiln
compiles it once with x: f32[<=BOUND,D] (HLO written here: JAX has no
bounded-dynamic shapes on CPU) and runs every size through that one
executable (`kiln bench --arg x_n.npy`); JAX jits the same function once per
exact size (a new compile each) and once at the bound (the padded work
Kiln does). Per size, medians over rounds that alternate the contenders:
kiln/jax ratios (above 1: Kiln faster), from `kiln bench`'s run_us_median
and JAX's median step time. Compile time: Kiln's one compile against the
sum of JAX's per-size compiles.

    .venv/bin/python bench/bench_dynamic.py [--kiln build/kiln] [--rounds 5]
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def program(bound, d, h, o):
    return f"""HloModule dyn_mlp
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}}
ENTRY main {{
  x = f32[<={bound},{d}] parameter(0)
  w1 = f32[{d},{h}] parameter(1)
  b1 = f32[{h}] parameter(2)
  w2 = f32[{h},{o}] parameter(3)
  d1 = f32[<={bound},{h}] dot(x, w1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  bb = f32[<={bound},{h}] broadcast(b1), dimensions={{1}}
  a1 = f32[<={bound},{h}] add(d1, bb)
  t1 = f32[<={bound},{h}] tanh(a1)
  y = f32[<={bound},{o}] dot(t1, w2), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  z = f32[] constant(0)
  s = f32[{o}] reduce(y, z), dimensions={{0}}, to_apply=add
  ROOT r = (f32[<={bound},{o}], f32[{o}]) tuple(y, s)
}}
"""


def kiln_bench(kiln, path, args, iters):
    cmd = [kiln, "bench", path, "--backend", "cpu", "--iters", str(iters), "--warmup", "2"]
    for a in args:
        cmd += ["--arg", a]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"kiln bench failed: {p.stderr.strip()}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bound", type=int, default=128)
    ap.add_argument("--sizes", default="1,8,32,100,128")
    ap.add_argument("--iters", type=int, default=200)
    o = ap.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp

    D, H, O = 512, 512, 256
    sizes = [int(s) for s in o.sizes.split(",")]
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((D, H)) / np.sqrt(D)).astype(np.float32)
    b1 = rng.standard_normal(H).astype(np.float32) * 0.1
    w2 = (rng.standard_normal((H, O)) / np.sqrt(H)).astype(np.float32)
    xs = {n: rng.standard_normal((n, D)).astype(np.float32) for n in sizes}

    tmp = tempfile.mkdtemp(prefix="kiln-bench-dyn-")
    hlo = os.path.join(tmp, "dyn_mlp.hlo")
    with open(hlo, "w") as f:
        f.write(program(o.bound, D, H, O))
    static = os.path.join(tmp, "static_mlp.hlo")  # the same at the bound, no "<="
    with open(static, "w") as f:
        f.write(program(o.bound, D, H, O).replace("<=", ""))
    files = {}
    for name, a in (("w1", w1), ("b1", b1), ("w2", w2)):
        files[name] = os.path.join(tmp, f"{name}.npy")
        np.save(files[name], a)
    for n in sizes:
        files[n] = os.path.join(tmp, f"x{n}.npy")
        np.save(files[n], xs[n])
    files["bound"] = os.path.join(tmp, "xbound.npy")
    np.save(files["bound"], rng.standard_normal((o.bound, D)).astype(np.float32))

    def f(x, w1, b1, w2):
        y = jnp.tanh(x @ w1 + b1) @ w2
        return y, y.sum(axis=0)

    # JAX compiles: one per exact size, and one at the bound
    jits, jax_compile_s = {}, 0.0
    for n in sizes + [o.bound]:
        t0 = time.perf_counter()
        g = jax.jit(f).lower(np.zeros((n, D), np.float32), w1, b1, w2).compile()
        jax_compile_s += time.perf_counter() - t0 if n in sizes else 0.0
        jits[n] = g
    # correctness: Kiln's valid rows against JAX at each size
    for n in sizes:
        out = os.path.join(tmp, f"out{n}")
        p = subprocess.run([o.kiln, "run", hlo, "--backend", "cpu", "--arg", files[n], "--arg",
                            files["w1"], "--arg", files["b1"], "--arg", files["w2"], "--out", out],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            sys.exit(f"kiln run n={n}: {p.stderr}")
        got = [np.load(os.path.join(out, fn)) for fn in sorted(os.listdir(out))]
        want = [np.asarray(v) for v in jax.jit(f)(xs[n], w1, b1, w2)]
        for g, w in zip(got, want):
            err = float(np.max(np.abs(g - w)) / max(1e-30, float(np.max(np.abs(w)))))
            if g.shape != w.shape or err > 1e-4:
                sys.exit(f"n={n}: kiln {g.shape} differs from jax {w.shape} (rel err {err:.2e})")

    padded = {n: np.zeros((o.bound, D), np.float32) for n in sizes}
    for n in sizes:
        padded[n][:n] = xs[n]

    def jax_time(g, x):
        for _ in range(3):
            jax.block_until_ready(g(x, w1, b1, w2))
        ts = []
        for _ in range(o.iters):
            t0 = time.perf_counter()
            jax.block_until_ready(g(x, w1, b1, w2))
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e6

    kiln_us = {n: [] for n in sizes}
    jax_us = {n: [] for n in sizes}
    jaxp_us = {n: [] for n in sizes}
    kiln_compile_ms, static_us = [], []
    for r in range(o.rounds):
        k = kiln_bench(o.kiln, static, [files["bound"], files["w1"], files["b1"], files["w2"]],
                       o.iters)
        static_us.append(k["run_us_median"])
        for n in sizes:
            k = kiln_bench(o.kiln, hlo, [files[n], files["w1"], files["b1"], files["w2"]], o.iters)
            kiln_us[n].append(k["run_us_median"])
            kiln_compile_ms.append(k["compile_ms"])
            jax_us[n].append(jax_time(jits[n], xs[n]))
            jaxp_us[n].append(jax_time(jits[o.bound], padded[n]))
    med = statistics.median
    tree = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    print(f"bench_dynamic: tree {tree}, {o.rounds} rounds, {o.iters} iterations, bound {o.bound}, "
          f"x f32[n,{D}] -> {H} -> {O}, cpu")
    print(f"{'rows':>5} {'kiln us':>9} {'jax exact us':>13} {'jax@bound us':>13} "
          f"{'vs exact':>9} {'vs bound':>9}")
    for n in sizes:
        k, j, jp = med(kiln_us[n]), med(jax_us[n]), med(jaxp_us[n])
        print(f"{n:>5} {k:>9.1f} {j:>13.1f} {jp:>13.1f} {j / k:>9.2f} {jp / k:>9.2f}")
    print(f"kiln on the static program at the bound (f32[{o.bound},{D}]): "
          f"{med(static_us):.1f} us")
    print(f"compile: kiln one executable {med(kiln_compile_ms):.0f} ms (cold cc cached after the "
          f"first round); jax {len(sizes)} exact-size compiles {jax_compile_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
