"""kiln.debug_print through kilnd, and ahead-of-time compiles into its cache.

A program with a kiln.debug_print custom call is run with `kiln run`
locally (interp and cpu backends) and through a kilnd started here
(`kiln run --server`), plain and under grad and vmap: the text the local run
prints on stderr is the text the server sends back in the call's kiln-debug
trailer (which the kiln command prints on stderr). A huge value is cut to a
bounded trailer, autocast:bf16 runs the same through kilnd's Compile as
locally, and a format the server must refuse (a lone brace) is an
error naming the instruction, not a crash.

Environment: KILND (the kilnd binary) and KILN_CLI (the kiln command), as
for the other client tests. Exits 77 when either is missing.
"""

import os
import subprocess
import sys
import tempfile
import time
import unittest

KILND = os.environ.get("KILND", "")
KILN = os.environ.get("KILN_CLI", "")

PROGRAM = """HloModule dp
add_f {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[3] parameter(0)
  y = f32[3] multiply(x, x)
  p = f32[3] custom-call(y), custom_call_target="kiln.debug_print", backend_config="y = {} {{ok}}", custom_call_has_side_effect=true
  zero = f32[] constant(0)
  ROOT l = f32[] reduce(p, zero), dimensions={0}, to_apply=add_f
}
"""

BIG = """HloModule big
ENTRY main {
  x = f32[4096] parameter(0)
  a = f32[4096] custom-call(x), custom_call_target="kiln.debug_print", backend_config="a={}", custom_call_has_side_effect=true
  b = f32[4096] custom-call(a), custom_call_target="kiln.debug_print", backend_config="b={}", custom_call_has_side_effect=true
  ROOT c = f32[4096] custom-call(b), custom_call_target="kiln.debug_print", backend_config="c={}", custom_call_has_side_effect=true
}
"""

POLY = """HloModule poly
add_f {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[4,3] parameter(0)
  w = f32[3,2] parameter(1)
  d = f32[4,2] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = f32[4,2] tanh(d)
  z = f32[] constant(0)
  ROOT r = f32[4] reduce(t, z), dimensions={1}, to_apply=add_f
}
"""

BAD = PROGRAM.replace('backend_config="y = {} {{ok}}"', 'backend_config="y = {"')


def start_kilnd(secret=None):
    cmd = [KILND, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
    env = dict(os.environ)
    if secret:
        env["KILN_CACHE_SECRET"] = secret
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env=env)
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


class DebugPrint(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory(prefix="kiln_toolbox_")
        cls.files = {}
        for name, text in (("dp", PROGRAM), ("big", BIG), ("bad", BAD), ("poly", POLY)):
            path = os.path.join(cls.dir.name, f"{name}.hlo")
            with open(path, "w") as f:
                f.write(text)
            cls.files[name] = path
        cls.kilnd, cls.addr = start_kilnd()

    @classmethod
    def tearDownClass(cls):
        cls.kilnd.terminate()
        cls.kilnd.wait(timeout=30)
        cls.dir.cleanup()

    def kiln(self, *args):
        return subprocess.run([KILN, *args], capture_output=True, text=True, timeout=300)

    def same_local_and_remote(self, name, *args):
        outs = []
        for where in ([], ["--server", self.addr]):
            for backend in ("interp", "cpu"):
                r = self.kiln("run", self.files[name], "--backend", backend, "--random-args", "1",
                              *args, *where)
                self.assertEqual(r.returncode, 0, f"{args} {where} {backend}: {r.stderr}")
                outs.append((r.stdout, r.stderr))
        for o in outs[1:]:
            self.assertEqual(o, outs[0], f"{name} {args}: local and remote runs differ")
        return outs[0]

    def test_prints_locally_and_through_the_server(self):
        out, err = self.same_local_and_remote("dp")
        self.assertRegex(err, r"^y = \{[-0-9.e, ]+\} \{ok\}\n$")

    def test_grad_and_vmap_pass_through(self):
        _, plain = self.same_local_and_remote("dp")
        _, err = self.same_local_and_remote("dp", "--transform", "grad")
        self.assertEqual(err, plain, "grad prints the primal once, no tangents")
        _, err = self.same_local_and_remote("dp", "--transform", "vmap:size=2")
        self.assertRegex(err, r"^y = \{\{[-0-9.e, ]+\}, \{[-0-9.e, ]+\}\} \{ok\}\n$")

    def test_autocast_through_the_server(self):
        """kilnd's Compile takes the autocast transform as kiln run does."""
        outs = []
        for where in ([], ["--server", self.addr]):
            r = self.kiln("run", self.files["poly"], "--backend", "cpu", "--random-args", "3",
                          "--transform", "autocast:bf16", *where)
            self.assertEqual(r.returncode, 0, r.stderr)
            outs.append(r.stdout)
        self.assertEqual(outs[0], outs[1])
        r = self.kiln("run", self.files["poly"], "--backend", "cpu", "--random-args", "3")
        self.assertNotEqual(r.stdout, outs[0], "bf16 inputs should move the result")
        r = self.kiln("run", self.files["poly"], "--random-args", "3", "--server", self.addr,
                      "--transform", "autocast:f32")
        self.assertEqual(r.returncode, 2)
        self.assertIn("not bf16 or f16", r.stderr)

    def test_trailer_is_bounded(self):
        r = self.kiln("run", self.files["big"], "--backend", "cpu", "--random-args", "1",
                      "--server", self.addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertLessEqual(len(r.stderr), 4096 + 64)
        self.assertTrue(r.stderr.startswith("a=f32[4096] {"), r.stderr[:80])
        self.assertIn("...", r.stderr)

    def test_bad_format_is_an_error(self):
        for where in ([], ["--server", self.addr]):
            r = self.kiln("run", self.files["bad"], "--backend", "cpu", "--random-args", "1", *where)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("lone '{'", r.stderr)
            self.assertNotIn("Segmentation", r.stderr)


class AheadOfTime(DebugPrint):
    """Shares DebugPrint's server and files (its tests run again: cheap)."""

    def test_compile_several_signatures(self):
        r = self.kiln("compile", self.files["poly"], "--server", self.addr,
                      "--shapes", "f32[8,3];f32[3,2]", "--shapes", "f32[16,3];f32[3,5]",
                      "--shapes", "f32[8,3];f32[3,2]")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 3, r.stdout)
        ids = [line.split()[2].rstrip(",") for line in lines]
        self.assertNotEqual(ids[0], ids[1])
        self.assertEqual(ids[0], ids[2])
        self.assertTrue(lines[0].endswith("cache compiled") or lines[0].endswith("cache memory"))
        self.assertTrue(lines[2].endswith("cache memory"), lines[2])
        # the cache lists both
        r = self.kiln("cache", "list", "--server", self.addr, ids[0], ids[1])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(ids[0], r.stdout)
        self.assertIn(ids[1], r.stdout)

    def test_vmap_batch_sizes(self):
        r = self.kiln("compile", self.files["poly"], "--server", self.addr,
                      "--transform", "vmap:in_axes=0,none",
                      "--shapes", "f32[2,4,3];f32[3,2]", "--shapes", "f32[5,4,3];f32[3,2]")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(r.stdout.splitlines()), 2, r.stdout)

    def test_signature_that_does_not_fit(self):
        r = self.kiln("compile", self.files["poly"], "--server", self.addr,
                      "--shapes", "f32[8,4];f32[3,2]")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("dot", r.stderr)
        r = self.kiln("compile", self.files["poly"], "--server", self.addr, "--shapes", "f32[8")
        self.assertEqual(r.returncode, 2)
        r = self.kiln("compile", self.files["poly"], "--shapes", "f32[8,3];f32[3,2]")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--server", r.stderr)


class ExportImport(unittest.TestCase):
    SECRET = "toolbox-test-secret-0123456789abcdef"

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory(prefix="kiln_cxp_")
        cls.poly = os.path.join(cls.dir.name, "poly.hlo")
        with open(cls.poly, "w") as f:
            f.write(POLY)
        cls.servers = [start_kilnd(cls.SECRET), start_kilnd(cls.SECRET),
                       start_kilnd("a-different-secret-for-the-third-one")]

    @classmethod
    def tearDownClass(cls):
        for p, _ in cls.servers:
            p.terminate()
            p.wait(timeout=30)
        cls.dir.cleanup()

    def kiln(self, *args):
        return subprocess.run([KILN, *args], capture_output=True, text=True, timeout=300)

    def test_move_entries(self):
        a, b, other = (addr for _, addr in self.servers)
        r = self.kiln("compile", self.poly, "--server", a)
        self.assertEqual(r.returncode, 0, r.stderr)
        key = r.stdout.split()[1]
        path = os.path.join(self.dir.name, "entries.kcx")
        r = self.kiln("cache", "export", "--server", a, path, key)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith("exported 1 entries"), r.stdout)
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], b"KILNCXP1")
        # tampered: refused, nothing stored
        bad = os.path.join(self.dir.name, "bad.kcx")
        with open(bad, "wb") as f:
            f.write(data[:100] + bytes([data[100] ^ 1]) + data[101:])
        r = self.kiln("cache", "import", "--server", b, bad)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("signature does not match", r.stderr)
        r = self.kiln("cache", "list", "--server", b, key)
        self.assertNotIn(key, r.stdout)
        # another secret: refused
        r = self.kiln("cache", "import", "--server", other, path)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("another cache secret", r.stderr)
        # the same secret: stored, and a Compile there is a hit
        r = self.kiln("cache", "import", "--server", b, path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "imported 1 entries")
        r = self.kiln("compile", self.poly, "--server", b)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("cache memory", r.stdout)
        # every entry, when no key is named
        r = self.kiln("cache", "export", "--server", b, path)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.kiln("cache", "export", "--server", b, path, "nothex")
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    if not (KILND and KILN and os.path.exists(KILND) and os.path.exists(KILN)):
        print("test_toolbox: skipped, KILND and KILN_CLI must name the binaries")
        sys.exit(77)
    unittest.main()
