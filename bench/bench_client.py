#!/usr/bin/env python3
"""The Python thin client's overhead: a digits training step through kilnd
against the same step in local jax.jit.

The step is examples/python/train_digits.py's (an MLP 64->128->10 on
scikit-learn's digits, batch 64, Adam): one jitted value_and_grad, one jitted
Adam update donating the old parameters and moments, and fetching the loss as
a float, so each step uploads the minibatch and downloads one scalar. The
same code runs through kiln (import kiln as jax) against a kilnd started
here on a free loopback port (--backend, default cpu) and through JAX on its
CPU backend, in the same run. Per round, after --warmup steps, --steps steps
are timed; the figures are medians over --rounds rounds:

  kiln_ms / jax_ms   milliseconds per step (wall clock, client side);
  ratio              kiln_ms / jax_ms (the per-round ratios' median);
  rpcs_per_step      gRPC calls per steady-state step (Execute, GetBuffer,
                     ReleaseBuffers, ...), from the connection's counter;
  bytes_up/down      serialized request / response message bytes per step.

One JSON line goes to stdout, progress to stderr. Not part of the test suite.

    python bench/bench_client.py [--kilnd build/server/kilnd] [--backend cpu]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))


class Counting:
    """Wraps a stub's methods, adding up the serialized message sizes."""

    def __init__(self, stub):
        self._stub, self.up, self.down = stub, 0, 0

    def __getattr__(self, name):
        fn = getattr(self._stub, name)

        def call(req, *a, **k):
            if hasattr(req, "ByteSize"):
                self.up += req.ByteSize()
            else:  # a request stream
                def it(src=req):
                    for m in src:
                        self.up += m.ByteSize()
                        yield m
                req = it()
            resp = fn(req, *a, **k)
            if hasattr(resp, "ByteSize"):
                self.down += resp.ByteSize()
                return resp

            def out(src=resp):  # a response stream
                for m in src:
                    self.down += m.ByteSize()
                    yield m
            return out()

        return call


def start_kilnd(path, backend):
    p = subprocess.Popen([path, "--listen", "127.0.0.1:0", "--metrics-listen", "off",
                          "--default-backend", backend],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("kilnd: listening on "):
            return p, line.split()[-1]
    raise SystemExit("bench_client: kilnd did not start")


def run_steps(jax, jnp, steps, warmup, seed=0, conn=None):
    import train_digits as td

    xtr, ytr, _, _ = td.load_data(seed)
    loss_and_grad, adam, _ = td.make_step(jax, jnp)
    params = jax.device_put(td.init_params(seed))
    zeros = jax.tree_util.tree_map(lambda p: np.zeros(p.shape, np.float32), td.init_params(seed))
    m, v = jax.device_put(zeros), jax.device_put(zeros)
    batches = list(td.batches(len(xtr), 64, warmup + steps, seed))
    t0 = rpc0 = up0 = down0 = None
    for t, idx in enumerate(batches, start=1):
        if t == warmup + 1:
            t0 = time.perf_counter()
            if conn is not None:
                rpc0, up0, down0 = conn.rpc_count, conn.stub.up, conn.stub.down
        value, grads = loss_and_grad(params, xtr[idx], ytr[idx])
        params, m, v = adam(params, m, v, grads, np.float32(t))
        float(value)
    ms = (time.perf_counter() - t0) * 1e3 / steps
    if conn is None:
        return ms, None
    return ms, ((conn.rpc_count - rpc0) / steps, (conn.stub.up - up0) / steps,
                (conn.stub.down - down0) / steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kilnd", default=os.path.join(ROOT, "build", "server", "kilnd"))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args()

    import jax
    import jax.numpy as jnp

    import kiln
    import kiln.numpy as knp

    p, addr = start_kilnd(opts.kilnd, opts.backend)
    try:
        conn = kiln.connect(addr)
        conn.stub = Counting(conn.stub)
        rows = []
        for r in range(opts.rounds):
            k_ms, (rpcs, up, down) = run_steps(kiln, knp, opts.steps, opts.warmup, conn=conn)
            j_ms, _ = run_steps(jax, jnp, opts.steps, opts.warmup)
            rows.append((k_ms, j_ms, k_ms / j_ms, rpcs, up, down))
            print(f"round {r + 1}: kiln {k_ms:.2f} ms, jax {j_ms:.2f} ms, {rpcs:.2f} RPCs, "
                  f"{up:.0f} B up, {down:.0f} B down per step", file=sys.stderr)
        conn.close()
    finally:
        p.terminate()
        p.wait(timeout=30)
    med = [statistics.median(c) for c in zip(*rows)]
    print(json.dumps({"backend": opts.backend, "steps": opts.steps, "rounds": opts.rounds,
                      "kiln_ms": round(med[0], 3), "jax_ms": round(med[1], 3),
                      "ratio": round(med[2], 2), "rpcs_per_step": round(med[3], 2),
                      "bytes_up_per_step": round(med[4]), "bytes_down_per_step": round(med[5])}))


if __name__ == "__main__":
    main()
