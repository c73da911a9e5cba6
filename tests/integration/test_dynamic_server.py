#!/usr/bin/env python3
"""Bounded dynamic shapes through kilnd: one executable, every size.

A program with an f32[<=16,4] parameter is compiled once per backend (cpu
and interp) by a kilnd started here; Execute then takes batches of 1 to 16
rows through that one executable: as plain f32[n,4] arrays (the server
pads them to the bound) and in the padded form with dynamic_sizes. The
outputs come back at the bound with their runtime sizes, and their valid
rows equal numpy's. Compiling again is a cache hit with the same
executable id, the server counts one compile per backend, and 17 rows is
INVALID_ARGUMENT naming the argument.

    KILND=build/server/kilnd test_dynamic_server.py --proto-dir proto

Exit status 0 when everything passed, 1 otherwise, 77 (skipped) when kilnd
is not built or grpcio, grpcio-tools or numpy is missing.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

try:
    import grpc
    import numpy as np
    from grpc_tools import protoc
except ImportError as e:
    print(f"test_dynamic_server: skipped: {e}")
    sys.exit(77)

FAILURES = []

PROGRAM = """HloModule dyn_rows
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY main {
  x = f32[<=16,4] parameter(0)
  w = f32[4,3] parameter(1)
  e = f32[<=16,4] exponential(x)
  d = f32[<=16,3] dot(e, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  z = f32[] constant(0)
  s = f32[3] reduce(d, z), dimensions={0}, to_apply=add
  n = s32[] get-dimension-size(x), dimensions={0}
  ROOT t = (f32[<=16,3], f32[3], s32[]) tuple(d, s, n)
}
"""
BOUND = 16


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILURES.append(what)


def gen_stubs(proto_dir, out):
    files = ["kiln/v1/hlo.proto", "kiln/v1/kiln.proto"]
    args = ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}"]
    if protoc.main(args + [os.path.join(proto_dir, f) for f in files]) != 0:
        raise RuntimeError("grpc_tools.protoc failed")


def start_kilnd(kilnd):
    cmd = [kilnd, "--listen", "127.0.0.1:0", "--metrics-listen", "off"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("kilnd: listening on "):
            return p, line.split()[-1]
    p.kill()
    raise RuntimeError("kilnd did not print its address")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto-dir", required=True)
    opts = ap.parse_args()
    kilnd = os.environ.get("KILND", "")
    if not kilnd or not os.access(kilnd, os.X_OK):
        print(f"test_dynamic_server: skipped: kilnd is not built (KILND={kilnd!r})")
        return 77
    tmp = tempfile.mkdtemp(prefix="kiln-dynamic-")
    gen_stubs(opts.proto_dir, tmp)
    sys.path.insert(0, tmp)
    from kiln.v1 import hlo_pb2, kiln_pb2, kiln_pb2_grpc

    f32 = hlo_pb2.ElementType.Value("ELEMENT_TYPE_F32")

    def literal(a, bound=None):
        """a as a literal: static, or padded to `bound` rows with its rows
        as the runtime size of a dynamic dim 0."""
        a = np.ascontiguousarray(a, dtype=np.float32)
        lit = hlo_pb2.Literal()
        lit.shape.element_type = f32
        if bound is None:
            lit.shape.dimensions.extend(a.shape)
            lit.data = a.astype("<f4").tobytes()
            return lit
        padded = np.full((bound,) + a.shape[1:], np.nan, dtype=np.float32)
        padded[: a.shape[0]] = a
        lit.shape.dimensions.extend(padded.shape)
        lit.shape.is_dynamic_dimension.extend([True] + [False] * (a.ndim - 1))
        lit.dynamic_sizes.extend(a.shape)
        lit.data = padded.astype("<f4").tobytes()
        return lit

    def valid(lit):
        """The elements within the runtime sizes, and those sizes."""
        dims = tuple(lit.shape.dimensions)
        sizes = tuple(lit.dynamic_sizes) if len(lit.dynamic_sizes) else dims
        a = np.frombuffer(lit.data, dtype="<f4").reshape(dims)
        return a[tuple(slice(0, s) for s in sizes)], sizes

    proc, addr = start_kilnd(kilnd)
    try:
        chan = grpc.insecure_channel(addr)
        grpc.channel_ready_future(chan).result(timeout=30)
        stub = kiln_pb2_grpc.KilnStub(chan)
        md = (("kiln-client", "dynamic-test"),)

        def compile_(backend):
            return stub.Compile(kiln_pb2.CompileRequest(
                hlo_text=PROGRAM, options=kiln_pb2.CompileOptions(backend=backend)),
                metadata=md, timeout=300)

        def execute(exe, *lits):
            req = kiln_pb2.ExecuteRequest(executable_id=exe)
            for lit in lits:
                req.arguments.add().literal.CopyFrom(lit)
            return stub.Execute(req, metadata=md, timeout=60)

        rng = np.random.default_rng(0)
        w = rng.integers(-4, 4, (4, 3)).astype(np.float32) / 4
        before = stub.Stats(kiln_pb2.StatsRequest(), metadata=md, timeout=10).compiles
        for backend in ("cpu", "interp"):
            c = compile_(backend)
            check(c.executable_id != "", f"{backend}: compiled")
            for n in (1, 2, 5, 11, BOUND):
                x = rng.integers(-8, 8, (n, 4)).astype(np.float32) / 8
                want = np.exp(x).astype(np.float64) @ w.astype(np.float64)
                for form, lit in (("plain", literal(x)), ("padded", literal(x, BOUND))):
                    r = execute(c.executable_id, lit, literal(w))
                    d, dsz = valid(r.outputs[0].literal)
                    s, _ = valid(r.outputs[1].literal)
                    k = np.frombuffer(r.outputs[2].literal.data, dtype="<i4")
                    check(list(r.outputs[0].literal.shape.dimensions) == [BOUND, 3] and
                          dsz == (n, 3), f"{backend} n={n} {form}: rows come back as {dsz}")
                    check(np.allclose(d, want, rtol=1e-5, atol=1e-5) and
                          np.allclose(s, want.sum(axis=0), rtol=1e-5, atol=1e-5),
                          f"{backend} n={n} {form}: valid rows equal numpy")
                    check(k.tolist() == [n], f"{backend} n={n} {form}: get-dimension-size")
            again = compile_(backend)
            check(again.executable_id == c.executable_id,
                  f"{backend}: compiling again gives the same executable")
            try:
                execute(c.executable_id, literal(np.zeros((BOUND + 1, 4))), literal(w))
                check(False, f"{backend}: {BOUND + 1} rows refused")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and
                      "arguments[0]" in e.details() and "bound 16" in e.details(),
                      f"{backend}: {BOUND + 1} rows is INVALID_ARGUMENT naming the argument "
                      f"({e.code()}: {e.details()})")
        after = stub.Stats(kiln_pb2.StatsRequest(), metadata=md, timeout=10).compiles
        check(after - before == 2, f"one compile per backend for every size ({after - before})")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"test_dynamic_server: {len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
