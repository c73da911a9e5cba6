"""`kiln bench --profile --trace FILE` on a JAX export with named scopes.

A small MLP written with jax.named_scope regions is exported
(jax.jit(f).lower(...).as_text(dialect="hlo", debug_info=True): with metadata) and
benchmarked on the cpu backend with --profile and --trace: the table on
stderr names its GEMMs and fused kernels and the scopes' op_names, and the
trace is Chrome trace JSON that Perfetto loads (traceEvents of ph "X" with
name, ts, dur, pid, tid) whose leaf steps ("cat": "step") name the scopes
and add up to about the run's duration.

The kiln binary is $KILN_BIN, else build/kiln. Exits 77 (skipped) when jax
cannot be imported.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpy as np
    import jax
    import jax.numpy as jnp
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"jax_profile: skipped, cannot import jax/numpy ({e})")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN_BIN") or os.path.join(ROOT, "build", "kiln")


def mlp(x, w1, w2):
    with jax.named_scope("encoder"):
        h = jax.nn.relu(x @ w1)
    with jax.named_scope("head"):
        y = h @ w2
        return jax.nn.softmax(y, axis=-1)


class Profile(unittest.TestCase):
    def test_profile_and_trace(self):
        rng = np.random.default_rng(0)
        args = (rng.standard_normal((128, 256)).astype(np.float32),
                rng.standard_normal((256, 512)).astype(np.float32),
                rng.standard_normal((512, 64)).astype(np.float32))
        hlo = jax.jit(mlp).lower(*args).as_text(dialect="hlo", debug_info=True)
        self.assertIn("encoder", hlo, "the export lost its metadata")
        with tempfile.TemporaryDirectory(prefix="kiln_profile_") as d:
            path = os.path.join(d, "mlp.hlo")
            with open(path, "w") as f:
                f.write(hlo)
            trace = os.path.join(d, "trace.json")
            r = subprocess.run([KILN, "bench", path, "--iters", "5", "--profile", "--trace", trace],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stderr)
            json.loads(r.stdout)  # the bench JSON is unchanged on stdout
            self.assertIn("profile: 5 runs", r.stderr)
            self.assertIn("gemm", r.stderr)
            self.assertIn("encoder", r.stderr)
            self.assertIn("head", r.stderr)
            with open(trace) as f:
                t = json.load(f)
        ev = t["traceEvents"]
        for e in ev:
            self.assertEqual(e["ph"], "X")
            for k in ("name", "ts", "dur", "pid", "tid"):
                self.assertIn(k, e)
        run = [e for e in ev if e["cat"] == "run"]
        steps = [e for e in ev if e["cat"] == "step"]
        self.assertEqual(len(run), 1)
        self.assertTrue(steps)
        names = " ".join(e["name"] for e in steps)
        self.assertIn("dot", names)
        self.assertIn("fusion", names)
        scopes = " ".join(e["args"]["op_name"] for e in steps)
        self.assertIn("encoder", scopes)
        self.assertIn("head", scopes)
        total = sum(e["dur"] for e in steps)
        self.assertLessEqual(total, run[0]["dur"] * 1.001)
        self.assertGreater(total, run[0]["dur"] * 0.7, "steps should cover most of the run")
        for e in steps:
            self.assertGreaterEqual(e["ts"], 0)
            self.assertLessEqual(e["ts"] + e["dur"], run[0]["dur"] * 1.001)


if __name__ == "__main__":
    unittest.main()
