"""A data-parallel MLP training step on 2 cpu devices vs 1, in the same run.

The step (loss, gradients and an SGD update of a two-layer tanh MLP) is
jitted by JAX with the batch split over a mesh of N host devices and the
parameters replicated, exported to HLO text for N = 1 and N = 2, and timed
with `kiln bench FILE --partitions N` (cpu backend: the partitioned
per-device program, compiled once, run as a gang of N devices on host
literals). The ratio is time(1 device) / time(2 devices): above 1 means
the second device pays for its all-reduce. Never part of the test run.

    python bench/bench_spmd.py [--batch B] [--hidden H] [--iters N]

Needs jax (KILN_PYTHON's venv) and build/kiln ($KILN_BIN).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILN = os.environ.get("KILN_BIN") or os.path.join(ROOT, "build", "kiln")


def loss(w1, w2, x, y):
    return jnp.mean((jnp.tanh(x @ w1) @ w2 - y) ** 2)


def step(w1, w2, x, y):
    l, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2, x, y)
    return l, w1 - 0.01 * g1, w2 - 0.01 * g2


def export(n, shapes):
    mesh = jax.make_mesh((n,), ("b",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices()[:n])
    rep, bat = NamedSharding(mesh, P()), NamedSharding(mesh, P("b", None))
    args = [np.zeros(s, np.float32) for s in shapes]
    j = jax.jit(step, in_shardings=(rep, rep, bat, bat), out_shardings=(rep, rep, rep))
    return j.lower(*args).as_text(dialect="hlo")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--din", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--dout", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternate 1- and 2-device benches this many times (medians taken)")
    a = ap.parse_args()
    shapes = [(a.din, a.hidden), (a.hidden, a.dout), (a.batch, a.din), (a.batch, a.dout)]
    runs = {1: [], 2: []}
    coll = None
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for n in (1, 2):
            paths[n] = os.path.join(tmp, f"dp{n}.hlo")
            with open(paths[n], "w") as f:
                f.write(export(n, shapes))
        for _ in range(a.rounds):
            for n in (1, 2):
                out = subprocess.run([KILN, "bench", paths[n], "--partitions", str(n), "--iters",
                                      str(a.iters), "--warmup", "3"],
                                     capture_output=True, text=True, check=True)
                r = json.loads(out.stdout)
                runs[n].append(r["run_us_median"])
                if n == 2:
                    coll = r["collectives"]
    t1, t2 = float(np.median(runs[1])), float(np.median(runs[2]))
    print(json.dumps({"batch": a.batch, "din": a.din, "hidden": a.hidden, "dout": a.dout,
                      "us_1_device": t1, "us_2_devices": t2, "ratio": t1 / t2,
                      "rounds_1": runs[1], "rounds_2": runs[2], "collectives_2": coll}))


if __name__ == "__main__":
    sys.exit(main())
