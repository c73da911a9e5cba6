#!/usr/bin/env python3
"""One contract, local or remote: `kiln` in process against `kiln --server`.

Every program the project tests with runs through the kiln command twice,
in process and through a real kilnd started on a free loopback port, and
the two must agree: the same exit status, the same stderr (diagnostics,
with the server's address written as SERVER), the same stdout for check
and run, the same .npy files for run --out. What is compared per command:

  check    exit status, stdout, stderr
  run      exit status, stdout, stderr, every --out file byte for byte
  compile  exit status and stderr; stdout only as "something was printed"
           (in process it reports the generated code, through a server the
           executable id and cache key: different by design). Peer programs
           compile with --backend cpu: a server's default backend falls back
           to the interpreter (with a warning) for programs the cpu compiler
           refuses, where the local compile (cpu only) fails.
  bench    exit status and stderr; stdout as JSON with the same file, iters
           and warmup (timings differ by nature)

The programs:
  - the JAX peer programs: tests/peer/test_jax_transforms.py and
    test_jax_peer.py run as they are, with the `kiln` commands they issue
    (run with every transform and composition they use) intercepted and run
    both ways; each such program is also checked, compiled (without a vmap
    that takes its size from arguments) and benched both ways. Skipped
    without jax (KILN_PYTHON is a Python with jax).
  - examples/*.hlo: check, compile, run on random arguments, bench, and run
    with transforms, on interp and cpu.
  - the corpus runner's modules ($KILN_CORPUS_DIR, else --corpus-default;
    skipped when absent):
    every module checked; a deterministic sample of every 4th module (by
    name) run on random arguments on interp, to keep the run time for CI
    on 2 cores to a few minutes.
  - bad inputs: files that are missing, do not parse or do not verify, bad
    transform specs, arguments of the wrong number, shape or text, a vmap
    size that disagrees with the arguments, grad of a non-scalar, a wrt out
    of range; the same error text and exit status both ways.

    KILND=build/server/kilnd KILN_CLI=build/kiln test_remote_diff.py --source-dir .

Exit status 0 when every pair agreed, 1 otherwise, 77 (skipped) when kilnd
or the kiln command is not built.
"""
import argparse
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

FAILURES = []
COUNT = {"pairs": 0}


def start_kilnd(kilnd):
    cmd = [kilnd, "--listen", "127.0.0.1:0", "--metrics-listen", "off"]
    env = dict(os.environ)
    env.setdefault("KILN_CACHE_SECRET", "kiln-remote-diff-secret-0123456789")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("kilnd: listening on "):
            return p, line.split()[-1]
    p.kill()
    raise RuntimeError("kilnd did not print its address")


class Differ:
    """Runs kiln commands in process and through the server and compares."""

    def __init__(self, kiln, server):
        self.kiln = kiln
        self.server = server

    def _norm(self, text):
        return text.replace(self.server, "SERVER")

    def _run(self, argv, cwd=None):
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=cwd)

    def pair(self, args, cwd=None, label=None):
        """Runs `kiln ARGS` both ways; returns the local CompletedProcess."""
        args = list(args)
        cmd = args[0]
        local_args, remote_args = list(args), list(args) + ["--server", self.server]
        out_local = out_remote = None
        if "--out" in args:
            i = args.index("--out")
            out_local = args[i + 1]
            out_remote = out_local.rstrip("/") + ".remote"
            remote_args[i + 1] = out_remote
            for d in (out_local, out_remote):
                shutil.rmtree(d, ignore_errors=True)
        loc = self._run([self.kiln] + local_args, cwd)
        rem = self._run([self.kiln] + remote_args, cwd)
        COUNT["pairs"] += 1
        what = label or " ".join(args)
        problems = []
        if loc.returncode != rem.returncode:
            problems.append(f"exit {loc.returncode} in process, {rem.returncode} through kilnd")
        if self._norm(loc.stderr) != self._norm(rem.stderr):
            problems.append(f"stderr differs:\n  local:  {loc.stderr!r}\n  remote: {self._norm(rem.stderr)!r}")
        if cmd in ("check", "run"):
            if loc.stdout != rem.stdout:
                problems.append(f"stdout differs:\n  local:  {loc.stdout[:2000]!r}\n"
                                f"  remote: {rem.stdout[:2000]!r}")
        elif cmd == "compile":
            if loc.returncode == 0 and (not loc.stdout.strip() or not rem.stdout.strip()):
                problems.append("compile printed nothing")
        elif cmd == "bench" and loc.returncode == 0 and rem.returncode == 0:
            try:
                lj, rj = json.loads(loc.stdout), json.loads(rem.stdout)
                for k in ("file", "iters", "warmup"):
                    if lj.get(k) != rj.get(k):
                        problems.append(f"bench {k}: {lj.get(k)!r} vs {rj.get(k)!r}")
            except ValueError as e:
                problems.append(f"bench output is not JSON: {e}")
        if out_local and loc.returncode == 0:
            names_l = sorted(os.listdir(out_local)) if os.path.isdir(out_local) else []
            names_r = sorted(os.listdir(out_remote)) if os.path.isdir(out_remote) else []
            if names_l != names_r:
                problems.append(f"--out files differ: {names_l} vs {names_r}")
            else:
                for n in names_l:
                    with open(os.path.join(out_local, n), "rb") as a, \
                            open(os.path.join(out_remote, n), "rb") as b:
                        if a.read() != b.read():
                            problems.append(f"--out {n} differs")
        if problems:
            FAILURES.append(what)
            print(f"FAIL {what}\n  " + "\n  ".join(problems))
        return loc


# ---- the JAX peer programs ---------------------------------------------------------

def vmap_needs_args(transforms):
    return any(t.split(":")[0] == "vmap" and "size=" not in t for t in transforms)


class PeerSubprocess:
    """Stands in for the subprocess module inside a peer test: its kiln
    commands run both ways; check, compile and bench of the same program
    come along."""

    def __init__(self, differ, kiln, backends_seen):
        self.differ = differ
        self.kiln = kiln
        self.seen = backends_seen

    def __getattr__(self, name):
        return getattr(subprocess, name)

    def run(self, cmd, **kw):
        if not cmd or cmd[0] != self.kiln or cmd[1] != "run":
            return subprocess.run(cmd, **kw)
        args = cmd[1:]
        module = args[1]
        transforms = [args[i + 1] for i, a in enumerate(args) if a == "--transform"]
        res = self.differ.pair(args)
        key = (module, tuple(transforms))
        if key not in self.seen:  # once per program and transform list
            self.seen.add(key)
            tx = [x for t in transforms for x in ("--transform", t)]
            self.differ.pair(["check", module])
            if not vmap_needs_args(transforms):
                self.differ.pair(["bench", module, "--backend", "interp", "--iters", "1",
                                  "--warmup", "0", "--random-args", "1"] + tx)
            if os.environ.get("KILN_DIFF_COMPILE", "1") == "1":
                # --backend cpu: without it a server falls back to the
                # interpreter for what the cpu compiler refuses (a warning),
                # where a local compile, cpu only, fails
                self.differ.pair(["compile", module, "--backend", "cpu"] + tx)
        return res


def run_peer_tests(differ, kiln, source_dir):
    try:
        import jax  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"peer programs: skipped, cannot import jax/numpy ({e})")
        return
    os.environ["KILN_BIN"] = kiln
    seen = set()
    loader = unittest.TestLoader()
    for name in ("test_jax_transforms", "test_jax_peer"):
        path = os.path.join(source_dir, "tests", "peer", name + ".py")
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.KILN = kiln
        mod.subprocess = PeerSubprocess(differ, kiln, seen)
        suite = loader.loadTestsFromModule(mod)
        if name == "test_jax_peer" and os.environ.get("KILN_DIFF_PEER_CPU", "0") != "1":
            # the interpreter's half: the cpu half compiles every program
            # again, which the compile pairs above already do once
            suite = unittest.TestSuite(t for s in suite for t in s
                                       if type(t).__name__ != "JaxPeerCpuTest")
        result = unittest.TextTestRunner(verbosity=1, stream=sys.stdout).run(suite)
        if not result.wasSuccessful():
            FAILURES.append(f"{name}: the peer checks themselves failed")


# ---- examples, the corpus, bad inputs ---------------------------------------------------

def run_examples(differ, source_dir, tmp):
    for path in sorted(glob.glob(os.path.join(source_dir, "examples", "*.hlo"))):
        name = os.path.basename(path)
        differ.pair(["check", path])
        differ.pair(["compile", path])
        for backend in ("interp", "cpu"):
            out = os.path.join(tmp, f"ex_{name}_{backend}")
            differ.pair(["run", path, "--backend", backend, "--random-args", "7", "--out", out])
            differ.pair(["bench", path, "--backend", backend, "--iters", "2", "--random-args", "3"])
        for tx in (["grad"], ["jvp"], ["vjp"], ["checkpoint", "grad"], ["vmap:size=2"],
                   ["grad", "vmap:in_axes=none,0,none,size=3"]):
            flags = [x for t in tx for x in ("--transform", t)]
            out = os.path.join(tmp, f"ex_{name}_tx")
            differ.pair(["run", path, "--backend", "interp", "--random-args", "5", "--out", out]
                        + flags)


def run_corpus(differ, tmp, default):
    corpus = os.environ.get("KILN_CORPUS_DIR") or default or ""
    if not corpus or not os.path.isdir(corpus):
        print(f"corpus: skipped (KILN_CORPUS_DIR={corpus!r} is not a directory)")
        return
    mods = sorted(glob.glob(os.path.join(corpus, "*.hlo")))
    for path in mods:
        differ.pair(["check", path])
    for path in mods[::4]:  # the deterministic sample: every 4th by name
        out = os.path.join(tmp, "corpus_" + os.path.basename(path))
        differ.pair(["run", path, "--backend", "interp", "--random-args", "11", "--out", out])


BAD_PARSE = "HloModule m\nENTRY e {\n  a = f32[3] parameter(0)\n  ROOT b = f32[3] frobnicate(a)\n}\n"
BAD_VERIFY = ("HloModule m\nENTRY e {\n  a = f32[3] parameter(0)\n  b = f32[4] parameter(1)\n"
              "  ROOT c = f32[3] add(a, b)\n}\n")
SUMSQ = """HloModule sumsq

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  x = f32[3] parameter(0)
  m = f32[3] multiply(x, x)
  z = f32[] constant(0)
  ROOT s = f32[] reduce(m, z), dimensions={0}, to_apply=add
}
"""


def run_bad_inputs(differ, tmp):
    files = {}
    for name, text in (("bad_parse.hlo", BAD_PARSE), ("bad_verify.hlo", BAD_VERIFY),
                       ("sumsq.hlo", SUMSQ), ("empty.hlo", ""), ("junk.pb", "\xff\xff\x01")):
        files[name] = os.path.join(tmp, name)
        with open(files[name], "w") as f:
            f.write(text)
    missing = os.path.join(tmp, "no_such_file.hlo")
    sq, x3 = files["sumsq.hlo"], "f32[3] {1, 2, 3}"
    xs = "f32[2,3] {{1, 2, 3}, {4, 5, 6}}"
    for cmd in ("check", "compile", "run", "bench"):
        for f in (missing, files["bad_parse.hlo"], files["bad_verify.hlo"], files["empty.hlo"],
                  files["junk.pb"]):
            extra = ["--backend", "interp"] if cmd in ("run", "bench") else []
            differ.pair([cmd, f] + extra)
    out = os.path.join(tmp, "sq_out")
    cases = [
        ["run", sq, "--transform", "grad", "--arg", x3],
        ["run", sq, "--transform", "grad:output=0", "--arg", x3, "--out", out],
        ["run", sq, "--transform", "grad", "--transform", "grad:output=1", "--arg", x3],
        ["run", sq, "--transform", "vmap", "--arg", xs, "--out", out],
        ["run", sq, "--transform", "vmap:size=2", "--arg", xs],
        ["run", sq, "--transform", "vmap:size=3", "--arg", xs],
        ["run", sq, "--transform", "vmap"],
        ["run", sq, "--transform", "vmap", "--arg", "f32[2,3] {{1, 2}"],
        ["run", sq, "--transform", "grad", "--transform", "vmap", "--arg", xs],
        ["run", sq, "--transform", "vjp", "--arg", x3, "--arg", "f32[] 2"],
        ["run", sq, "--transform", "jvp", "--arg", x3, "--arg", x3],
        ["run", sq, "--transform", "bogus", "--arg", x3],
        ["run", sq, "--transform", "grad:wrt=x", "--arg", x3],
        ["run", sq, "--transform", "grad:wrt=3", "--arg", x3],
        ["run", sq, "--transform", "vmap:in_axes=5", "--arg", xs],
        ["run", sq, "--transform", "jvp", "--transform", "grad", "--arg", x3, "--arg", x3],
        ["run", sq],
        ["run", sq, "--arg", x3, "--arg", x3],
        ["run", sq, "--arg", "f32[4] {1, 2, 3, 4}"],
        ["run", sq, "--arg", "s32[3] {1, 2, 3}"],
        ["run", sq, "--arg", "not a literal"],
        ["run", sq, "--arg", os.path.join(tmp, "missing.npy")],
        ["run", sq, "--random-args", "x"],
        ["run", sq, "--backend", "nope"],
        ["compile", sq, "--transform", "vmap"],
        ["compile", sq, "--transform", "bogus"],
        ["compile", sq, "--transform", "grad"],
        ["bench", sq, "--transform", "vmap", "--iters", "1"],
        ["bench", sq, "--transform", "grad", "--iters", "1", "--backend", "interp"],
    ]
    for c in cases:
        if c[0] == "run" and "--backend" not in c:
            c = c + ["--backend", "interp"]
        differ.pair(c)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--corpus-default", default=None,
                    help="the corpus when KILN_CORPUS_DIR is not set")
    opts = ap.parse_args()
    kilnd = os.environ.get("KILND", "")
    kiln = os.environ.get("KILN_CLI", "")
    for what, p in (("kilnd", kilnd), ("kiln", kiln)):
        if not p or not os.access(p, os.X_OK):
            print(f"test_remote_diff: skipped: {what} is not built ({p!r})")
            return 77
    t0 = time.time()
    proc, addr = start_kilnd(kilnd)
    tmp = tempfile.mkdtemp(prefix="kiln-remote-diff-")
    try:
        differ = Differ(kiln, addr)
        parts = os.environ.get("KILN_DIFF_PARTS", "bad,examples,corpus,peer").split(",")
        if "bad" in parts:
            run_bad_inputs(differ, tmp)
        if "examples" in parts:
            run_examples(differ, opts.source_dir, tmp)
        if "corpus" in parts:
            run_corpus(differ, tmp, opts.corpus_default)
        if "peer" in parts:
            run_peer_tests(differ, kiln, opts.source_dir)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{COUNT['pairs']} command pairs in {time.time() - t0:.1f} s, "
          f"{len(FAILURES)} disagreed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
