#!/usr/bin/env python3
"""The Python thin client's overhead: training steps through kilnd against
the same steps in local jax.jit.

Two models, each the training step of its example: the digits MLP of
examples/python/train_digits.py (64->128->10, batch 64, Adam) and the
transformer block of examples/python/train_charlm.py (a character-level LM:
2 pre-norm blocks of causal 4-head attention and a GELU MLP, d=64, batch 16
x 32 characters, Adam). Each runs three ways in the same run:

  kiln     the example's own step through kiln (import kiln as jax): one
           jitted value_and_grad and one jitted Adam update that donates the
           old parameters and moments, then float(loss);
  fused    the same step lowered whole by JAX on the client and run through
           kiln.from_jax (value_and_grad and Adam in one program, state
           donated): the one-round-trip step;
  jax      the example's step in local jax.jit on JAX's CPU backend.

A kilnd is started here on a free loopback port (--backend, default cpu).
Per round, after --warmup steps, --steps steps are timed; the figures are
medians over --rounds rounds:

  *_ms               milliseconds per step (wall clock, client side);
  ratio, fused_ratio kiln_ms / jax_ms and fused_ms / jax_ms (per-round ratios' median);
  rpcs_per_step      gRPC calls per steady-state step (Execute, GetBuffer,
                     ReleaseBuffers, ...), from the connection's counter;
  bytes_up/down      serialized request / response message bytes per step.

One JSON line per model goes to stdout, progress to stderr. Not part of the
test suite.

    python bench/bench_client.py [--kilnd build/server/kilnd] [--backend cpu] [--model all]
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


# ---- the models: (initial state, batches, step functions) ---------------------------

def digits_model(jax, jnp, n, seed=0):
    import train_digits as td

    xtr, ytr, _, _ = td.load_data(seed)
    init = td.init_params(seed)
    data = [(xtr[i], ytr[i]) for i in td.batches(len(xtr), 64, n, seed)]
    return init, data, td.make_step(jax, jnp)[:2]


def charlm_model(jax, jnp, n, seed=0):
    import train_charlm as tc

    ids, vocab = tc.load_text()
    init = tc.init_params(len(vocab), 64, 2, 32, seed)
    data = list(tc.batches(ids, 16, 32, n, seed))
    return init, data, tc.make_model(jax, jnp)[:2]


MODELS = {"digits": digits_model, "charlm": charlm_model}


def native_step(jax, jnp, model, n):
    init, data, (loss_and_grad, adam) = model(jax, jnp, n)
    zeros = jax.tree_util.tree_map(lambda p: np.zeros(p.shape, np.float32), init)
    state = [jax.device_put(init), jax.device_put(zeros), jax.device_put(zeros)]

    def step(t, batch):
        params, m, v = state
        value, grads = loss_and_grad(params, *batch)
        state[:] = adam(params, m, v, grads, np.float32(t))
        return float(value)

    return data, step


def fused_step(model, n):
    """The whole step as one JAX program, run on kilnd through from_jax."""
    import jax

    import kiln

    init, data, (loss_and_grad, adam) = model(jax, jax.numpy, n)

    def train_step(params, m, v, x, y, t):
        value, grads = loss_and_grad(params, x, y)
        params, m, v = adam(params, m, v, grads, t)
        return params, m, v, value

    run = kiln.from_jax(train_step, donate_argnums=(0, 1, 2))
    zeros = jax.tree_util.tree_map(lambda p: np.zeros(p.shape, np.float32), init)
    state = [kiln.device_put(init), kiln.device_put(zeros), kiln.device_put(zeros)]

    def step(t, batch):
        *new, value = run(*state, *batch, np.float32(t))
        state[:] = new
        return float(value)

    return data, step


def timed(data, step, warmup, steps, conn=None):
    t0 = rpc0 = up0 = down0 = None
    for t, batch in enumerate(data, start=1):
        if t == warmup + 1:
            t0 = time.perf_counter()
            if conn is not None:
                rpc0, up0, down0 = conn.rpc_count, conn.stub.up, conn.stub.down
        step(t, batch)
    ms = (time.perf_counter() - t0) * 1e3 / steps
    if conn is None:
        return ms, None
    return ms, ((conn.rpc_count - rpc0) / steps, (conn.stub.up - up0) / steps,
                (conn.stub.down - down0) / steps)


def bench_model(name, opts, conn):
    import jax
    import jax.numpy as jnp

    import kiln
    import kiln.numpy as knp

    model = MODELS[name]
    n = opts.warmup + opts.steps
    rows = []
    for r in range(opts.rounds):
        k_ms, (rpcs, up, down) = timed(*native_step(kiln, knp, model, n), opts.warmup,
                                       opts.steps, conn)
        f_ms, (f_rpcs, f_up, f_down) = timed(*fused_step(model, n), opts.warmup, opts.steps,
                                             conn)
        j_ms, _ = timed(*native_step(jax, jnp, model, n), opts.warmup, opts.steps)
        rows.append((k_ms, f_ms, j_ms, k_ms / j_ms, f_ms / j_ms, rpcs, up, down, f_rpcs, f_up,
                     f_down))
        print(f"{name} round {r + 1}: kiln {k_ms:.2f} ms ({rpcs:.2f} RPCs, {up:.0f} B up, "
              f"{down:.0f} B down), fused {f_ms:.2f} ms ({f_rpcs:.2f} RPCs, {f_up:.0f} B up, "
              f"{f_down:.0f} B down), jax {j_ms:.2f} ms per step", file=sys.stderr)
    med = [statistics.median(c) for c in zip(*rows)]
    return {"model": name, "backend": opts.backend, "steps": opts.steps, "rounds": opts.rounds,
            "kiln_ms": round(med[0], 3), "fused_ms": round(med[1], 3),
            "jax_ms": round(med[2], 3), "ratio": round(med[3], 2),
            "fused_ratio": round(med[4], 2), "rpcs_per_step": round(med[5], 2),
            "bytes_up_per_step": round(med[6]), "bytes_down_per_step": round(med[7]),
            "fused_rpcs_per_step": round(med[8], 2), "fused_bytes_up_per_step": round(med[9]),
            "fused_bytes_down_per_step": round(med[10])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kilnd", default=os.path.join(ROOT, "build", "server", "kilnd"))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--model", default="all", choices=["all"] + sorted(MODELS))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args()

    import kiln

    p, addr = start_kilnd(opts.kilnd, opts.backend)
    try:
        conn = kiln.connect(addr)
        conn.stub = Counting(conn.stub)
        for name in (sorted(MODELS) if opts.model == "all" else [opts.model]):
            print(json.dumps(bench_model(name, opts, conn)), flush=True)
        conn.close()
    finally:
        p.terminate()
        p.wait(timeout=30)


if __name__ == "__main__":
    main()
