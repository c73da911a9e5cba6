"""SPMD programs of the partitioner's newer rules against JAX, in the same run.

Each workload is jitted by JAX with NamedSharding over a mesh of 4 host
devices (XLA_FLAGS=--xla_force_host_platform_device_count=4), exported to
HLO text, and timed two ways, alternating, for several rounds: jax.jit on
the 4 host devices (arguments already placed, block_until_ready), and
`kiln bench FILE --partitions 4` (the cpu backend: the partitioned
per-device program run as a gang of 4 devices on host literals, so Kiln's
times include cutting the global arguments into shards and assembling the
result, which JAX's do not). The ratio is JAX's median over Kiln's: above 1,
Kiln is faster. Never part of the test run.

Workloads: an embedding lookup from a table split along its vocabulary
(masked local gather + all-reduce), its gradient (local scatter-add), the
same from a table split along its features (local gathers and
scatter-adds, no communication) and along both on a 2x2 mesh, a
lax.cond over batch-split activations, a lax.while_loop over one split
array, a shard_map manual over one axis of a 2x2 mesh whose body is
split along the other, and windowed einsum: a column-parallel matmul of
row-split activations (XLA all-gathers them) with Kiln's
--windowed-einsum on and off (the same program twice; the JSON gains the
per-device program's peak temporaries, temp_peak_bytes).

    python bench/bench_spmd_ops.py [--rounds R] [--iters N] [--only a,b]

Needs jax (KILN_PYTHON's venv) and build/kiln ($KILN_BIN).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILN = os.environ.get("KILN_BIN") or os.path.join(ROOT, "build", "kiln")


def mesh(shape, names):
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names))


def workloads():
    rng = np.random.default_rng(0)
    m1 = mesh((4,), ("v",))
    rep, voc = NamedSharding(m1, P()), NamedSharding(m1, P("v", None))
    table = rng.standard_normal((32000, 256)).astype(np.float32)
    ids = rng.integers(0, 32000, size=(2048,)).astype(np.int32)
    g = rng.standard_normal((2048, 256)).astype(np.float32)

    def embed(t, i):
        return jnp.tanh(jnp.take(t, i, axis=0))

    def embed_grad(t, i, g):
        return jax.grad(lambda t: jnp.sum(jnp.tanh(jnp.take(t, i, axis=0)) * g))(t)

    mb = mesh((4,), ("b",))
    brep, bat = NamedSharding(mb, P()), NamedSharding(mb, P("b", None))
    x = rng.standard_normal((4096, 256)).astype(np.float32)
    w = (rng.standard_normal((256, 256)) * 0.05).astype(np.float32)

    def cond(p, x, w):
        return jax.lax.cond(p > 0, lambda x: jnp.tanh(x @ w), lambda x: x @ w * 2.0, x)

    def loop(x):
        return jax.lax.while_loop(lambda c: jnp.sum(c) > 1.0, lambda c: c * 0.5, x)

    mf = mesh((4,), ("f",))
    frep, feat = NamedSharding(mf, P()), NamedSharding(mf, P(None, "f"))
    mvf = mesh((2, 2), ("v", "f"))
    vf, vfeat = NamedSharding(mvf, P("v", "f")), NamedSharding(mvf, P(None, "f"))

    m2 = mesh((2, 2), ("x", "y"))
    a = rng.standard_normal((2048, 1024)).astype(np.float32)

    def smap(a):
        def body(a):
            return jax.lax.psum(jnp.tanh(a) * 2.0 + 1.0, "x")
        return jax.shard_map(body, mesh=m2, in_specs=P("x", None), out_specs=P(),
                             axis_names={"x"})(a)

    xs = rng.standard_normal((512, 1024)).astype(np.float32)
    ws = (rng.standard_normal((1024, 1024)) * 0.05).astype(np.float32)
    srow, scol = NamedSharding(mb, P("b", None)), NamedSharding(mb, P(None, "b"))

    def colpar(x, w):
        return x @ w

    return {
        "windowed_on": (colpar, (srow, scol), scol, (xs, ws), ["--windowed-einsum", "on"]),
        "windowed_off": (colpar, (srow, scol), scol, (xs, ws), ["--windowed-einsum", "off"]),
        "embed_vocab": (embed, (voc, rep), rep, (table, ids)),
        "embed_vocab_grad": (embed_grad, (voc, rep, rep), voc, (table, ids, g)),
        "embed_feat": (embed, (feat, frep), feat, (table, ids)),
        "embed_feat_grad": (embed_grad, (feat, frep, feat), feat, (table, ids, g)),
        "embed_vocab_feat": (embed, (vf, NamedSharding(mvf, P())), vfeat, (table, ids)),
        "cond_split": (cond, (brep, bat, brep), bat, (np.float32(1.0), x, w)),
        "while_array": (loop, (bat,), bat, (np.abs(x) + 1.0,)),
        "shard_map_partial": (smap, (NamedSharding(m2, P("x", "y")),),
                              NamedSharding(m2, P(None, "y")), (a,)),
    }


def time_jax(j, args, iters):
    out = j(*args)
    jax.block_until_ready(out)
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(j(*args))
        ts.append((time.perf_counter() - t0) * 1e6)
    return float(np.median(ts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    ws = workloads()
    if a.only:
        ws = {k: v for k, v in ws.items() if k in a.only.split(",")}
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        prepared = {}
        for name, (fn, ins, outs, args, *flags) in ws.items():
            j = jax.jit(fn, in_shardings=ins, out_shardings=outs)
            path = os.path.join(tmp, f"{name}.hlo")
            with open(path, "w") as f:
                f.write(j.lower(*args).as_text(dialect="hlo"))
            placed = [jax.device_put(v, s) for v, s in zip(args, ins)]
            prepared[name] = (j, placed, path, flags[0] if flags else [])
            res[name] = {"kiln_us": [], "jax_us": [], "collectives": None}
        for _ in range(a.rounds):
            for name, (j, placed, path, flags) in prepared.items():
                out = subprocess.run([KILN, "bench", path, "--partitions", "4", "--iters",
                                      str(a.iters), "--warmup", "3"] + flags,
                                     capture_output=True, text=True, check=True)
                r = json.loads(out.stdout)
                res[name]["kiln_us"].append(r["run_us_median"])
                res[name]["collectives"] = r.get("collectives")
                res[name]["temp_peak_bytes"] = r.get("temp_peak_bytes")
                res[name]["jax_us"].append(time_jax(j, placed, a.iters))
    for name, r in res.items():
        k, jx = float(np.median(r["kiln_us"])), float(np.median(r["jax_us"]))
        print(json.dumps({"workload": name, "kiln_us": k, "jax_us": jx, "ratio": jx / k,
                          "kiln_rounds": r["kiln_us"], "jax_rounds": r["jax_us"],
                          "collectives": r["collectives"],
                          "temp_peak_bytes": r.get("temp_peak_bytes")}))


if __name__ == "__main__":
    sys.exit(main())
