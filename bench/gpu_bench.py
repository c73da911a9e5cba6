#!/usr/bin/env python3
"""The peer figures of scripts/gpu-check.sh, measured with JAX on the GPU.

  copy         device-to-device copy bandwidth (bytes read + written per
               second) of a 1 GiB f32 array: the roof for elementwise work;
  elementwise  a fused y = a * x + b, tanh(y) over the same array, in the
               same units, and its fraction of copy (the issue's goal for
               Kiln is >= 0.8 of copy);
  gemm         f32 (tf32 allowed as XLA does) and bf16 8192^3 matmuls in
               TFLOP/s: XLA calls cuBLAS(Lt) for them, the reference for
               Kiln's GEMM steps (goal >= 0.9x);
It also exports the HLO of each measured function to --export-dir, so
Kiln's side can be timed on the same programs (`kiln bench --backend cuda`)
once the cuda backend runs them. Writes one JSON object to stdout.
Not part of the test suite; needs JAX with its CUDA plugin.
"""
import argparse
import json
import os
import time


def timed(f, *args, reps=20):
    out = f(*args)
    out.block_until_ready()
    t0 = time.perf_counter()
    for _ in range(reps):
        out = f(*args)
    out.block_until_ready()
    return (time.perf_counter() - t0) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--export-dir", default=None)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--gemm-n", type=int, default=8192)
    o = ap.parse_args()
    import jax
    import jax.numpy as jnp

    dev = jax.devices()[0]
    res = {"device": str(dev), "platform": dev.platform, "jax": jax.__version__}
    if dev.platform != "gpu":
        res["error"] = "JAX sees no GPU (platform %s)" % dev.platform
        print(json.dumps(res))
        return 1
    n = int(o.gib * (1 << 30) // 4)
    x = jnp.ones((n,), jnp.float32)
    copy = jax.jit(lambda v: v + 0.0)  # one read, one write; XLA keeps it a copy kernel
    fused = jax.jit(lambda v: jnp.tanh(v * 1.5 + 0.25))
    tc = timed(copy, x)
    te = timed(fused, x)
    res["copy_GBps"] = 2 * 4 * n / tc / 1e9
    res["elementwise_GBps"] = 2 * 4 * n / te / 1e9
    res["elementwise_over_copy"] = tc / te
    N = o.gemm_n
    for name, dt in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
        a = jnp.ones((N, N), dt)
        b = jnp.ones((N, N), dt)
        mm = jax.jit(lambda p, q: p @ q)
        t = timed(mm, a, b, reps=10)
        res["gemm_%s_TFLOPs" % name] = 2 * N ** 3 / t / 1e12
        if o.export_dir:
            os.makedirs(o.export_dir, exist_ok=True)
            with open(os.path.join(o.export_dir, "gemm_%s.hlo" % name), "w") as f:
                f.write(mm.lower(a, b).as_text(dialect="hlo"))
    if o.export_dir:
        with open(os.path.join(o.export_dir, "elementwise.hlo"), "w") as f:
            f.write(fused.lower(x).as_text(dialect="hlo"))
        with open(os.path.join(o.export_dir, "copy.hlo"), "w") as f:
            f.write(copy.lower(x).as_text(dialect="hlo"))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
