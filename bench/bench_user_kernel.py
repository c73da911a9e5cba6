"""User kernels (docs/toolbox.md) against the same program in HLO ops and
against JAX, same run.

Two workloads, each four ways, timed in alternating rounds:

  gelu      jax.nn.gelu(x, approximate=True) over f32[4M] (element-wise);
  softmax   jax.nn.softmax(x, axis=-1) over f32[2048,1024] (block-indexed:
            one block per row, grid=2048).

  jax       jax.jit of the function (XLA:CPU);
  ops       `kiln bench --backend cpu` of JAX's exported HLO;
  uk        `kiln bench --backend cpu --user-kernel` of a program of one
            custom call of the C kernel in bench/user_kernels/ (NAME.c),
            written plainly with libm's tanhf / expf;
  uk_fast   the same with an exp of its own that GCC vectorizes
            (NAME_fast.c).

Reported per workload: the medians over rounds of each round's ratio
jax_time / kiln_time (above 1: Kiln faster), and the largest relative
difference of each Kiln output from JAX's.

    .venv/bin/python bench/bench_user_kernel.py [--kiln build/kiln] [--rounds 5]
        [--iters 30] [--json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from statistics import median

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import bench_models as bm  # noqa: E402

KERNELS = os.path.join(HERE, "user_kernels")


def workloads():
    rng = np.random.default_rng(0)
    n = 1 << 22
    x = rng.uniform(-4, 4, n).astype(np.float32)
    rows, cols = 2048, 1024
    y = rng.normal(0, 3, (rows, cols)).astype(np.float32)
    return [
        ("gelu", lambda v: jax.nn.gelu(v, approximate=True), x, "gelu",
         f"f32[{n}] -> f32[{n}]"),
        ("softmax", lambda v: jax.nn.softmax(v, axis=-1), y, "softmax_rows",
         f"f32[{rows},{cols}] -> f32[{rows},{cols}]; grid={rows}"),
    ]


def kernel_program(name, shape):
    s = bm.shape_text(np.float32, shape)
    return (f"HloModule uk_{name}\nENTRY main {{\n  x = {s} parameter(0)\n"
            f"  ROOT y = {s} custom-call(x), custom_call_target=\"kiln.user.{name}\"\n}}\n")


def kiln_json(cmd, timeout=600):
    return json.loads(bm.kiln_call(cmd, timeout))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "build", "kiln"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    o = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="kiln_ukbench_") as tmp:
        for name, fn, x, src, sig in workloads():
            jf = jax.jit(fn)
            text = jf.lower(x).as_text(dialect="hlo")
            ops_path = os.path.join(tmp, f"{name}_ops.hlo")
            uk_path = os.path.join(tmp, f"{name}_uk.hlo")
            with open(ops_path, "w") as f:
                f.write(text)
            with open(uk_path, "w") as f:
                f.write(kernel_program(name, x.shape))
            argf = bm.save_args([x], tmp)
            ways = [("ops", ops_path, [])]
            for label, file in (("uk", f"{src}.c"), ("uk_fast", f"{src}_fast.c")):
                ways.append((label, uk_path,
                             ["--user-kernel", f"{name}={os.path.join(KERNELS, file)}:{sig}"]))
            want = np.asarray(jf(x))
            errs = {}
            for label, path, extra in ways:
                out = os.path.join(tmp, f"out_{name}_{label}")
                bm.kiln_call([o.kiln, "run", path, "--backend", "cpu", "--out", out,
                              *bm.arg_flags(argf), *extra], 600)
                errs[label] = bm.rel_error([np.load(os.path.join(out, "0.npy"))], [want])
            dev = jax.device_put(x)
            ratios = {w[0]: [] for w in ways}
            times = {"jax": [], **{w[0]: [] for w in ways}}
            for _ in range(o.rounds):
                tj, _ = bm.jax_time(lambda: jax.block_until_ready(jf(dev)), o.iters)
                times["jax"].append(tj * 1e6)
                for label, path, extra in ways:
                    r = kiln_json([o.kiln, "bench", path, "--backend", "cpu", "--iters",
                                   str(o.iters), "--warmup", "2", *bm.arg_flags(argf), *extra])
                    times[label].append(r["run_us_median"])
                    ratios[label].append(tj * 1e6 / r["run_us_median"])
            rec = {"workload": name, "rounds": o.rounds, "iters": o.iters,
                   "us": {k: median(v) for k, v in times.items()},
                   "ratio": {k: median(v) for k, v in ratios.items()},
                   "rel_err": errs}
            results.append(rec)
            if o.json:
                print(json.dumps(rec), flush=True)
    labels = ["ops", "uk", "uk_fast"]
    print(f"{'workload':10} {'jax us':>10} " + " ".join(f"{l + ' us':>11}" for l in labels) + " "
          + " ".join(f"{'jax/' + l:>12}" for l in labels) + " "
          + " ".join(f"{'err ' + l:>12}" for l in labels), file=sys.stderr)
    for r in results:
        print(f"{r['workload']:10} {r['us']['jax']:10.1f} "
              + " ".join(f"{r['us'][l]:11.1f}" for l in labels) + " "
              + " ".join(f"{r['ratio'][l]:12.2f}" for l in labels) + " "
              + " ".join(f"{r['rel_err'][l]:12.2e}" for l in labels), file=sys.stderr)


if __name__ == "__main__":
    main()
