#!/usr/bin/env python3
"""The Python thin client's overhead: training steps through kilnd against
the same steps in local jax.jit.

Two models, each the training step of its example: the digits MLP of
examples/python/train_digits.py (64->128->10, batch 64, Adam) and the
transformer block of examples/python/train_charlm.py (a character-level LM:
2 pre-norm blocks of causal 4-head attention and a GELU MLP, d=64, batch 16
x 32 characters, Adam). Each runs four ways in the same run:

  kiln     the example's own step through kiln (import kiln as jax): one
           jitted train step (value_and_grad inside, the server's gradient
           program inlined, then Adam) donating the parameters and moments,
           then float(loss);
  split    the step as two jitted programs (value_and_grad, then the Adam
           update), as the examples were written before transforms could be
           called inside jit;
  fused    the example's step lowered whole by JAX on the client and run
           through kiln.from_jax (state donated);
  jax      the example's step in local jax.jit on JAX's CPU backend.

A kilnd is started here on a free loopback port (--backend, default cpu).
Per round, after --warmup steps, --steps steps are timed; the figures are
medians over --rounds rounds:

  *_ms               milliseconds per step (wall clock, client side);
  *ratio             kiln_ms / jax_ms, split_ms / jax_ms, fused_ms / jax_ms
                     (the per-round ratios' median);
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
    return init, data, td.make_parts(jax, jnp)[0]


def charlm_model(jax, jnp, n, seed=0):
    import train_charlm as tc

    ids, vocab = tc.load_text()
    init = tc.init_params(len(vocab), 64, 2, 32, seed)
    data = list(tc.batches(ids, 16, 32, n, seed))
    return init, data, tc.make_parts(jax, jnp)[0]


MODELS = {"digits": digits_model, "charlm": charlm_model}


def native_step(jax, jnp, model, n):
    init, data, train_step = model(jax, jnp, n)
    train_step = jax.jit(train_step, donate_argnums=(0, 1, 2))
    zeros = jax.tree_util.tree_map(lambda p: np.zeros(p.shape, np.float32), init)
    state = [jax.device_put(init), jax.device_put(zeros), jax.device_put(zeros)]

    def step(t, batch):
        *new, value = train_step(*state, *batch, np.float32(t))
        state[:] = new
        return float(value)

    return data, step


def split_step(jax, jnp, model, n):
    """The step as two programs: jit(value_and_grad(loss)), then jit(adam)."""
    init, data, train_step = model(jax, jnp, n)
    loss, adam = _parts(train_step)
    loss_and_grad = jax.jit(jax.value_and_grad(loss))
    adam = jax.jit(adam, donate_argnums=(0, 1, 2))
    zeros = jax.tree_util.tree_map(lambda p: np.zeros(p.shape, np.float32), init)
    state = [jax.device_put(init), jax.device_put(zeros), jax.device_put(zeros)]

    def step(t, batch):
        params, m, v = state
        value, grads = loss_and_grad(params, *batch)
        state[:] = adam(params, m, v, grads, np.float32(t))
        return float(value)

    return data, step


def _parts(train_step):
    """The loss and adam functions train_step closes over."""
    cells = dict(zip(train_step.__code__.co_freevars,
                     (c.cell_contents for c in train_step.__closure__)))
    return cells["loss"], cells["adam"]


def fused_step(model, n):
    """The whole step as one JAX program, run on kilnd through from_jax."""
    import jax

    import kiln

    init, data, train_step = model(jax, jax.numpy, n)
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
        ways = {"kiln": lambda: native_step(kiln, knp, model, n),
                "split": lambda: split_step(kiln, knp, model, n),
                "fused": lambda: fused_step(model, n)}
        row = {}
        for way, make in ways.items():
            ms, (rpcs, up, down) = timed(*make(), opts.warmup, opts.steps, conn)
            row[way] = (ms, rpcs, up, down)
        row["jax"] = (timed(*native_step(jax, jnp, model, n), opts.warmup, opts.steps)[0],)
        rows.append(row)
        print(f"{name} round {r + 1}: " + ", ".join(
            f"{w} {v[0]:.2f} ms" + (f" ({v[1]:.2f} RPCs, {v[2]:.0f} B up, {v[3]:.0f} B down)"
                                    if len(v) > 1 else "") for w, v in row.items()),
            file=sys.stderr)
    med = lambda f: statistics.median(f(r) for r in rows)  # noqa: E731
    out = {"model": name, "backend": opts.backend, "steps": opts.steps, "rounds": opts.rounds,
           "jax_ms": round(med(lambda r: r["jax"][0]), 3)}
    for way in ("kiln", "split", "fused"):
        p = "" if way == "kiln" else way + "_"
        out[f"{way}_ms"] = round(med(lambda r: r[way][0]), 3)
        out[f"{p}ratio"] = round(med(lambda r: r[way][0] / r["jax"][0]), 2)
        out[f"{p}rpcs_per_step"] = round(med(lambda r: r[way][1]), 2)
        out[f"{p}bytes_up_per_step"] = round(med(lambda r: r[way][2]))
        out[f"{p}bytes_down_per_step"] = round(med(lambda r: r[way][3]))
    return out


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
