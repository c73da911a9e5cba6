"""CompileOptions.memory_budget_bytes through kilnd (compiler/passes/remat.c).

The training step of an 8-layer MLP (grad of the loss with respect to every
weight and bias) is compiled by a kilnd started here with and without a
budget (`kiln compile --server --memory-budget`): under a budget between
the smallest peak and the unconstrained one the server's peak_bytes fits it,
the cache key differs from the unbudgeted program's, and `kiln run
--server` gives the same outputs as without a budget (recomputation is
deterministic). A budget no schedule reaches is RESOURCE_EXHAUSTED naming
the smallest peak, which then compiles; the interp backend, which places no
buffers, refuses a budget naming the field.

Environment: KILND (the kilnd binary) and KILN_CLI (the kiln command), as
for the other client tests. Exits 77 when either is missing.
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_toolbox import start_kilnd  # noqa: E402

KILND = os.environ.get("KILND", "")
KILN = os.environ.get("KILN_CLI", "")
LAYERS = 8


def mlp_text(layers):
    s = ["HloModule mlp",
         "add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }",
         "layer { x = f32[32,64] parameter(0)  w = f32[64,64] parameter(1)"
         "  b = f32[64] parameter(2)",
         "  d = f32[32,64] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
         "  bb = f32[32,64] broadcast(b), dimensions={1}  a = f32[32,64] add(d, bb)",
         "  s = f32[32,64] logistic(a)  ROOT h = f32[32,64] multiply(a, s) }",
         "ENTRY main { h0 = f32[32,64] parameter(0)"]
    for i in range(1, layers + 1):
        s.append(f"  w{i} = f32[64,64] parameter({i})  b{i} = f32[64] parameter({layers + i})")
    for i in range(1, layers + 1):
        s.append(f"  h{i} = f32[32,64] call(h{i - 1}, w{i}, b{i}), to_apply=layer")
    s.append(f"  sq = f32[32,64] multiply(h{layers}, h{layers})  zero = f32[] constant(0)")
    s.append("  ROOT loss = f32[] reduce(sq, zero), dimensions={0,1}, to_apply=add }")
    return "\n".join(s) + "\n"


GRAD = "grad:wrt=" + ",".join(str(i) for i in range(1, 2 * LAYERS + 1))


class MemoryBudget(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory(prefix="kiln_remat_")
        cls.file = os.path.join(cls.dir.name, "mlp.hlo")
        with open(cls.file, "w") as f:
            f.write(mlp_text(LAYERS))
        cls.kilnd, cls.addr = start_kilnd()

    @classmethod
    def tearDownClass(cls):
        cls.kilnd.terminate()
        cls.kilnd.wait(timeout=30)
        cls.dir.cleanup()

    def kiln(self, *args):
        return subprocess.run([KILN, *args], capture_output=True, text=True, timeout=300)

    def compile(self, *args):
        r = self.kiln("compile", self.file, "--server", self.addr, "--backend", "cpu",
                      "--transform", GRAD, *args)
        peak = re.search(r"peak (\d+) bytes", r.stdout)
        key = re.search(r"^cache \S+ ([0-9a-f]{64})$", r.stdout, re.M)
        return r, int(peak.group(1)) if peak else None, key.group(1) if key else None

    def test_budget_is_met_and_keyed(self):
        r, peak0, key0 = self.compile()
        self.assertEqual(r.returncode, 0, r.stderr)
        budget = peak0 * 3 // 4
        r, peak, key = self.compile("--memory-budget", str(budget))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertLessEqual(peak, budget, r.stdout)
        self.assertIsNotNone(key0)
        self.assertNotEqual(key, key0, "a budget must change the cache key")
        runs = []
        for extra in ([], ["--memory-budget", str(budget)]):
            r = self.kiln("run", self.file, "--server", self.addr, "--backend", "cpu",
                          "--transform", GRAD, "--random-args", "3", *extra)
            self.assertEqual(r.returncode, 0, r.stderr)
            runs.append(r.stdout)
        self.assertEqual(runs[1], runs[0], "rematerialization changed the results")

    def test_unreachable_budget_names_the_smallest_peak(self):
        r, _, _ = self.compile("--memory-budget", "4096")
        self.assertEqual(r.returncode, 1, r.stdout)
        m = re.search(r"reaches (\d+) bytes at the least", r.stderr)
        self.assertIsNotNone(m, r.stderr)
        self.assertIn("memory_budget", r.stderr)
        least = int(m.group(1))
        r, peak, _ = self.compile("--memory-budget", str(least))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertLessEqual(peak, least)

    def test_interp_refuses_a_budget(self):
        r = self.kiln("compile", self.file, "--server", self.addr, "--backend", "interp",
                      "--memory-budget", "1M")
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("options.memory_budget_bytes", r.stderr)


if __name__ == "__main__":
    if not KILND or not KILN or not os.path.exists(KILND) or not os.path.exists(KILN):
        print("KILND and KILN_CLI must name the kilnd and kiln binaries", file=sys.stderr)
        sys.exit(77)
    unittest.main()
