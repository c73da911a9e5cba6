"""Rematerialization under a memory budget on JAX training steps.

The deep-MLP and transformer-LM training steps of bench/bench_remat.py are
exported from JAX plain and with every layer under jax.checkpoint (JAX's
per-layer rematerialization: its opt-barriers and recomputed forward in the
HLO). Checked, per workload:

  * `kiln bench --memory-budget B` of the plain step, B the checkpointed
    step's peak of live temporaries, reaches B with no more extra flops
    than checkpointing adds (the issue's acceptance);
  * the outputs under the budget are bit-equal to the outputs without it
    (`kiln run --backend cpu`, same pseudo-random arguments): recomputing
    runs the same kernels on the same inputs;
  * the checkpointed step itself under a budget below its own peak (remat
    on top of JAX's checkpoints, keeping what passes its opt-barriers and
    not computing JAX's recomputed values a third time) is bit-equal to it
    too, or, where nothing is left to recompute, refused naming the
    smallest peak, which is then met.

The kiln binary is $KILN_BIN, else build/kiln. Exits 77 (skipped) when jax
cannot be imported.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
try:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpy as np  # noqa: F401
    import jax  # noqa: F401
    import bench_remat as br
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"jax_remat: skipped, cannot import jax/numpy ({e})")
    sys.exit(77)

KILN = os.environ.get("KILN_BIN") or os.path.join(ROOT, "build", "kiln")


def run_cpu(path, *extra, may_fail=False):
    r = subprocess.run([KILN, "run", path, "--backend", "cpu", "--random-args", "7", *extra],
                       capture_output=True, text=True, timeout=900)
    if r.returncode and not may_fail:
        raise AssertionError(f"kiln run {path} {extra}: {r.stderr.strip()}")
    return r


class Remat(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory(prefix="kiln_jax_remat_")

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def check(self, name):
        row = br.measure(KILN, name, self.dir.name, 1)
        print(json.dumps({k: row[k] for k in ("workload", "plain", "checkpointed", "remat")}),
              file=sys.stderr)
        budget = row["budget"]
        self.assertLess(budget, row["plain"]["temp_peak_bytes"])
        self.assertLessEqual(row["remat"]["temp_peak_bytes"], budget)
        self.assertGreater(row["remat"]["extra_flops"], 0)
        self.assertLessEqual(row["remat"]["extra_flops"], row["checkpointed"]["extra_flops"],
                             "more recomputation than per-layer checkpointing")
        plain, ck = row["files"]["plain"], row["files"]["checkpointed"]
        self.assertEqual(run_cpu(plain, "--memory-budget", str(budget)).stdout,
                         run_cpu(plain).stdout)
        want = run_cpu(ck).stdout
        r = run_cpu(ck, "--memory-budget", str(budget * 9 // 10), may_fail=True)
        if r.returncode:
            m = re.search(r"memory_budget: .* reaches (\d+) bytes at the least", r.stderr)
            self.assertIsNotNone(m, r.stderr)
            self.assertLessEqual(int(m.group(1)), budget)
            r = run_cpu(ck, "--memory-budget", m.group(1))
        self.assertEqual(r.stdout, want)

    def test_deep_mlp(self):
        self.check("mlp")

    def test_transformer_lm(self):
        self.check("lm")


if __name__ == "__main__":
    unittest.main()
