"""User kernels through kilnd: RegisterKernel and programs calling them.

A kilnd without --allow-user-kernels refuses RegisterKernel
(PERMISSION_DENIED, naming the flag). One with it and with tokens takes it
from an admin token only; a bad signature, source that does not compile
(the compiler's message comes back), source over --user-kernel-max-bytes
and a bad name are refused with their reasons. A registered kernel is
compiled once per source (the second registration says "cached"); a
program calling it runs through the server equal to the same program in
HLO ops, and to the local `kiln run --user-kernel`; the same name
registered again with other source changes what the program computes
(the key follows the source, not the request). The interpreter backend and
an unregistered kernel are refused naming the instruction.

Environment: KILND and KILN_CLI, as for the other client tests. Exits 77
when either is missing.
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import time
import unittest

KILND = os.environ.get("KILND", "")
KILN = os.environ.get("KILN_CLI", "")

ADMIN, USER = "admin-token-0123456789", "user-token-0123456789"

SAXPY = """#include <stdint.h>
void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end) {
  const float *a = bufs[0], *x = bufs[1];
  float *out = bufs[2];
  for (int64_t i = begin; i < end; i++) out[i] = a[i] * x[i] + 1.0f;
}
"""
SAXPY2 = SAXPY.replace("+ 1.0f", "- 1.0f")
BROKEN = SAXPY.replace("out[i] =", "out[i] = undeclared_name +")
SIG = "f32[64], f32[64] -> f32[64]"

KERNEL_HLO = """HloModule k
ENTRY main {
  a = f32[64] parameter(0)
  x = f32[64] parameter(1)
  s = f32[64] custom-call(a, x), custom_call_target="kiln.user.fma1"
  ROOT t = f32[64] tanh(s)
}
"""
OPS_HLO = """HloModule k
ENTRY main {
  a = f32[64] parameter(0)
  x = f32[64] parameter(1)
  m = f32[64] multiply(a, x)
  one = f32[] constant(1)
  b = f32[64] broadcast(one), dimensions={}
  s = f32[64] %OP(m, b)
  ROOT t = f32[64] tanh(s)
}
"""
CUDA = """extern "C" __global__ void kiln_user_kernel(void *const *bufs, long long begin,
                                                  long long end) {
  long long i = begin + blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const float *a = (const float *)bufs[0], *x = (const float *)bufs[1];
  if (i < end) ((float *)bufs[2])[i] = a[i] * x[i] + 1.0f;
}
"""
MISSING_HLO = KERNEL_HLO.replace("kiln.user.fma1", "kiln.user.nothing_here")


def start_kilnd(*flags, tokens=None):
    cmd = [KILND, "--listen", "127.0.0.1:0", "--metrics-listen", "off", *flags]
    if tokens:
        cmd += ["--tokens", tokens]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    addr = None
    deadline = time.time() + 30
    while addr is None and time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("kilnd: listening on "):
            addr = line.split()[-1]
    if addr is None:
        p.kill()
        raise RuntimeError("kilnd did not print its address")
    return p, addr


class UserKernels(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory(prefix="kiln_ukern_")
        d = cls.dir.name
        cls.f = {}
        for name, text in (("saxpy.c", SAXPY), ("saxpy2.c", SAXPY2), ("broken.c", BROKEN),
                           ("big.c", SAXPY + "// " + "x" * (300 << 10) + "\n"),
                           ("k.hlo", KERNEL_HLO), ("add.hlo", OPS_HLO.replace("%OP", "add")),
                           ("sub.hlo", OPS_HLO.replace("%OP", "subtract")),
                           ("missing.hlo", MISSING_HLO), ("fma1.cu", CUDA)):
            cls.f[name] = os.path.join(d, name)
            with open(cls.f[name], "w") as fh:
                fh.write(text)
        tokens = os.path.join(d, "tokens")
        with open(tokens, "w") as fh:
            for tok, client, role in ((ADMIN, "ops", "admin"), (USER, "alice", "user")):
                fh.write(f"sha256:{hashlib.sha256(tok.encode()).hexdigest()} {client} {role}\n")
        cls.off, cls.off_addr = start_kilnd()
        cls.on, cls.addr = start_kilnd("--allow-user-kernels", tokens=tokens)
        cls.args = ["--random-args", "3"]

    @classmethod
    def tearDownClass(cls):
        for p in (cls.off, cls.on):
            p.terminate()
            p.wait(timeout=30)
        cls.dir.cleanup()

    def kiln(self, *args):
        return subprocess.run([KILN, *args], capture_output=True, text=True, timeout=300)

    def register(self, name, path, sig=SIG, token=ADMIN, addr=None, *extra):
        return self.kiln("kernel", "register", "--server", addr or self.addr, "--token", token,
                         name, path, "--signature", sig, *extra)

    def run_remote(self, hlo, *extra):
        return self.kiln("run", self.f[hlo], "--server", self.addr, "--token", ADMIN, *self.args,
                         *extra)

    def test_0_refusals(self):
        r = self.register("fma1", self.f["saxpy.c"], addr=self.off_addr)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--allow-user-kernels", r.stderr)
        self.assertIn("PERMISSION_DENIED", r.stderr)
        r = self.register("fma1", self.f["saxpy.c"], token=USER)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("admin", r.stderr)
        r = self.register("fma1", self.f["saxpy.c"], sig="f32[64] f32[64] -> f32[64]")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("signature:1:9", r.stderr)
        r = self.register("fma1", self.f["broken.c"])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("undeclared_name", r.stderr)
        r = self.register("fma1", self.f["big.c"])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("RESOURCE_EXHAUSTED", r.stderr)
        r = self.register("no-dash", self.f["saxpy.c"])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("name", r.stderr)
        # nothing was registered by any of them
        r = self.run_remote("k.hlo", "--backend", "cpu")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn('"fma1" is not registered', r.stderr)

    def test_1_program_equals_hlo_ops(self):
        r = self.register("fma1", self.f["saxpy.c"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"^registered fma1 [0-9a-f]{64}\n$")
        # with CUDA C beside it: compile-checked by NVRTC, or skipped saying why
        again = self.register("fma1", self.f["saxpy.c"], SIG, ADMIN, None, "--cuda",
                              self.f["fma1.cu"])
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("(cached)", again.stdout)
        self.assertRegex(again.stdout, r"\ncuda: (ok|skipped: .+)\n$")
        got = self.run_remote("k.hlo", "--backend", "cpu")
        self.assertEqual(got.returncode, 0, got.stderr)
        want = self.kiln("run", self.f["add.hlo"], "--backend", "cpu", *self.args)
        self.assertEqual(want.returncode, 0, want.stderr)
        self.assertEqual(got.stdout, want.stdout)
        local = self.kiln("run", self.f["k.hlo"], "--backend", "cpu", *self.args, "--user-kernel",
                          f"fma1={self.f['saxpy.c']}:{SIG}")
        self.assertEqual(local.returncode, 0, local.stderr)
        self.assertEqual(local.stdout, want.stdout)
        # the default backend may not fall back to the interpreter
        dflt = self.run_remote("k.hlo")
        self.assertEqual(dflt.returncode, 0, dflt.stderr)
        self.assertEqual(dflt.stdout, want.stdout)
        interp = self.run_remote("k.hlo", "--backend", "interp")
        self.assertEqual(interp.returncode, 1, interp.stderr)
        self.assertIn("cpu backend", interp.stderr)
        missing = self.run_remote("missing.hlo", "--backend", "cpu")
        self.assertEqual(missing.returncode, 1, missing.stderr)
        self.assertIn('"nothing_here" is not registered', missing.stderr)
        # registered again with other source: the same request computes the new kernel
        r = self.register("fma1", self.f["saxpy2.c"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("(cached)", r.stdout)
        got2 = self.run_remote("k.hlo", "--backend", "cpu")
        self.assertEqual(got2.returncode, 0, got2.stderr)
        want2 = self.kiln("run", self.f["sub.hlo"], "--backend", "cpu", *self.args)
        self.assertEqual(got2.stdout, want2.stdout)
        self.assertNotEqual(got2.stdout, got.stdout)

    def test_2_usage(self):
        r = self.kiln("kernel", "register", "fma1", self.f["saxpy.c"], "--signature", SIG)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--server", r.stderr)
        r = self.kiln("run", self.f["k.hlo"], "--server", self.addr, "--token", ADMIN,
                      "--user-kernel", f"fma1={self.f['saxpy.c']}:{SIG}")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("local runs", r.stderr)
        r = self.kiln("run", self.f["k.hlo"], "--backend", "cpu", "--user-kernel", "fma1")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("NAME=FILE.c:SIGNATURE", r.stderr)
        r = self.kiln("run", self.f["k.hlo"], "--backend", "cpu", *self.args, "--user-kernel",
                      f"fma1={self.f['broken.c']}:{SIG}")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("undeclared_name", r.stderr)


if __name__ == "__main__":
    if not (KILND and os.path.exists(KILND) and KILN and os.path.exists(KILN)):
        print("KILND or KILN_CLI missing: skipped")
        sys.exit(77)
    unittest.main()
