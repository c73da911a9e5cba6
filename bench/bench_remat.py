"""Rematerialization under a memory budget against per-layer checkpointing.

Two JAX training steps (value_and_grad and an SGD update), each exported
twice with jax.jit(...).lower(...).as_text(dialect="hlo"): plain, and with
every layer under jax.checkpoint (JAX's per-layer rematerialization, the
seed's rule: about a third more compute for the activations of one layer
input per layer):

  mlp      a 16-layer tanh MLP, 256 wide, batch 64;
  lm       a causal transformer LM, 8 pre-LN blocks (bench_models.block),
           d=128, ff=512, 4 heads, 4 x 64 tokens, vocabulary 1024.

Per workload, in the same run, `kiln bench --backend cpu` of: the plain
program, the checkpointed program, and the plain program under
`--memory-budget` = the checkpointed program's peak. Reported: the peak of
live temporaries (temp_peak_bytes), the program's flops by the cost model
(the remat record's "flops"; a budget far above the peak changes nothing
and reports them) and the step time (run_us_median). Kiln's remat should
reach the budget with no more extra flops than checkpointing adds.

    .venv/bin/python bench/bench_remat.py [--kiln build/kiln] [--iters 10]
        [--export-dir DIR] [--json]

Not part of the test suite (tests/peer/test_jax_remat.py checks the same
numbers and the results).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import bench_models as bm  # noqa: E402

HUGE = 1 << 40  # a budget no program here reaches: remat reports, changes nothing


def mlp_step(checkpointed, layers=16, d=256, batch=64):
    rng = np.random.default_rng(0)
    ws = [bm.uni(rng, d, d, scale=1 / np.sqrt(d)) for _ in range(layers)]
    bs = [bm.uni(rng, d, scale=0.1) for _ in range(layers)]
    x = bm.uni(rng, batch, d)

    def layer(h, w, b):
        return jnp.tanh(h @ w + b)
    if checkpointed:
        layer = jax.checkpoint(layer)

    def loss(p, x):
        h = x
        for w, b in zip(*p):
            h = layer(h, w, b)
        return jnp.mean(h * h)

    def step(p, x):
        val, g = jax.value_and_grad(loss)(p, x)
        return val, jax.tree_util.tree_map(lambda a, b: a - 0.01 * b, p, g)
    return bm.flat(step, (ws, bs), [x])


def lm_step(checkpointed, layers=8):
    c = dict(vocab=1024, d=128, ff=512, heads=4, layers=layers, batch=4, seq=64)
    rng = np.random.default_rng(0)
    p = {"emb": bm.uni(rng, c["vocab"], c["d"], scale=0.02),
         "pos": bm.uni(rng, c["seq"], c["d"], scale=0.02),
         "blocks": [bm.block_params(rng, c["d"], c["ff"]) for _ in range(c["layers"])],
         "lnf_g": np.ones(c["d"], np.float32), "lnf_b": np.zeros(c["d"], np.float32)}

    def blk(bp, x):
        return bm.block(bp, x, c["heads"], causal=True)
    if checkpointed:
        blk = jax.checkpoint(blk)

    def loss(p, ids):
        tok = bm.spread_ids(ids, c["vocab"])
        x = p["emb"][tok[:, :-1]] + p["pos"]
        for bp in p["blocks"]:
            x = blk(bp, x)
        logits = bm.layernorm(x, p["lnf_g"], p["lnf_b"]) @ p["emb"].T
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tok[:, 1:, None], axis=-1))

    def step(p, ids):
        val, g = jax.value_and_grad(loss)(p, ids)
        return val, jax.tree_util.tree_map(lambda a, b: a - 1e-3 * b, p, g)
    return bm.flat(step, p, [bm.raw_ids(rng, c["batch"], c["seq"] + 1)])


WORKLOADS = {"mlp": mlp_step, "lm": lm_step}


def export(name, checkpointed, directory):
    fn, args = WORKLOADS[name](checkpointed)
    text = jax.jit(fn, keep_unused=True).lower(*args).as_text(dialect="hlo")
    path = os.path.join(directory, f"{name}{'_ck' if checkpointed else ''}.hlo")
    with open(path, "w") as f:
        f.write(text)
    return path


def kiln_bench(kiln, path, budget, iters):
    cmd = [kiln, "bench", path, "--backend", "cpu", "--iters", str(iters),
           "--memory-budget", str(budget)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def measure(kiln, name, directory, iters):
    """The three benches of one workload and the numbers compared."""
    plain, ck = export(name, False, directory), export(name, True, directory)
    p = kiln_bench(kiln, plain, HUGE, iters)
    c = kiln_bench(kiln, ck, HUGE, iters)
    budget = c["temp_peak_bytes"]
    r = kiln_bench(kiln, plain, budget, iters)
    f0 = p["remat"]["flops"]
    return {"workload": name, "budget": budget,
            "plain": {"temp_peak_bytes": p["temp_peak_bytes"], "flops": f0,
                      "run_us": p["run_us_median"]},
            "checkpointed": {"temp_peak_bytes": budget, "flops": c["remat"]["flops"],
                             "extra_flops": c["remat"]["flops"] - f0,
                             "run_us": c["run_us_median"]},
            "remat": {"temp_peak_bytes": r["temp_peak_bytes"],
                      "extra_flops": r["remat"]["extra_flops"],
                      "recomputed": r["remat"]["recomputed"], "moved": r["remat"]["moved"],
                      "run_us": r["run_us_median"]},
            "files": {"plain": plain, "checkpointed": ck}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(os.path.dirname(HERE), "build", "kiln"))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--export-dir")
    ap.add_argument("--json", action="store_true")
    o = ap.parse_args()
    tmp = None
    directory = o.export_dir
    if directory is None:
        tmp = tempfile.TemporaryDirectory(prefix="kiln_remat_bench_")
        directory = tmp.name
    os.makedirs(directory, exist_ok=True)
    rows = [measure(o.kiln, name, directory, o.iters) for name in WORKLOADS]
    if o.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'workload':8} {'variant':13} {'peak bytes':>11} {'extra flops':>12} "
              f"{'% more':>7} {'step us':>9}")
        for row in rows:
            f0 = row["plain"]["flops"]
            for variant, extra in (("plain", 0), ("checkpointed", row["checkpointed"]["extra_flops"]),
                                   ("remat", row["remat"]["extra_flops"])):
                v = row[variant]
                print(f"{row['workload']:8} {variant:13} {v['temp_peak_bytes']:11d} {extra:12.0f} "
                      f"{100 * extra / f0:6.1f}% {v['run_us']:9.0f}")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
