#!/usr/bin/env python3
"""A Python grpcio client of kilnd, as a Python user would write one.

Stubs come from proto/ through grpc_tools.protoc at run time (nothing
generated is committed). Against a real kilnd on free loopback ports it
compiles a small model from HLO text, executes it with numpy arrays and
compares with numpy, moves a 64 MiB array up with a client stream of
chunks and back down with a server stream, feeds that buffer to an
execution by handle, reads the server's stats and asks the standard health
service. It also checks that every field of the wire schema it can set is
honoured (grad with and without its value, vmap's axis_size, grad's output,
device_ids where there is one placement) or refused with UNIMPLEMENTED
naming the field.

    KILND=build/server/kilnd test_python_client.py --proto-dir proto

Exit status 0 when everything passed, 1 otherwise, 77 (skipped) when kilnd
is not built or grpcio, grpcio-tools or numpy is missing.
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

try:
    import grpc
    import numpy as np
    from grpc_tools import protoc
except ImportError as e:
    print(f"test_python_client: skipped: {e}")
    sys.exit(77)

MLP = """
HloModule mlp_step
ENTRY main {
  x = f32[2,3] parameter(0)
  w = f32[3,4] parameter(1)
  b = f32[4] parameter(2)
  xw = f32[2,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  bb = f32[2,4] broadcast(b), dimensions={1}
  s = f32[2,4] add(xw, bb)
  zero = f32[] constant(0)
  zb = f32[2,4] broadcast(zero), dimensions={}
  ROOT r = f32[2,4] maximum(s, zb)
}
"""

SUM = """
HloModule total
ENTRY main {
  x = f32[16777216] parameter(0)
  zero = f32[] constant(0)
  ROOT s = f32[] reduce(x, zero), dimensions={0}, to_apply=add
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
"""

CHUNK = 1 << 20
FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILURES.append(what)


def gen_stubs(proto_dir, out):
    files = ["kiln/v1/hlo.proto", "kiln/v1/kiln.proto", "grpc/health/v1/health.proto"]
    args = ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}"]
    if protoc.main(args + [os.path.join(proto_dir, f) for f in files]) != 0:
        raise RuntimeError("grpc_tools.protoc failed")
    # grpc/ is also the grpcio package: make the generated tree importable
    # under its own name without shadowing it.
    os.rename(os.path.join(out, "grpc"), os.path.join(out, "grpc_health_gen"))


SUMSQ = """
HloModule sumsq
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


def wire_schema_checks(stub, md, kiln_pb2, hlo_pb2, literal, array):
    """Every field of CompileOptions, Transform and ExecuteRequest is
    honoured or refused with UNIMPLEMENTED naming it."""
    def compile_(timeout=60, **opts):
        transforms = opts.pop("transforms", [])
        o = kiln_pb2.CompileOptions(**opts)
        for t in transforms:
            o.transforms.add().CopyFrom(t)
        return stub.Compile(kiln_pb2.CompileRequest(hlo_text=SUMSQ, options=o), metadata=md,
                            timeout=timeout)

    def refused(what, field, code=grpc.StatusCode.UNIMPLEMENTED, **opts):
        try:
            compile_(**opts)
            check(False, f"{what}: refused")
        except grpc.RpcError as e:
            check(e.code() == code and field in e.details(),
                  f"{what}: {e.code()} naming {field} ({e.details()})")

    def run(exe, *arrays, **kw):
        req = kiln_pb2.ExecuteRequest(executable_id=exe, **kw)
        for a in arrays:
            req.arguments.add().literal.CopyFrom(literal(a))
        return stub.Execute(req, metadata=md, timeout=60)

    x = np.array([1, 2, 3], np.float32)
    T = kiln_pb2.Transform
    # grad: with_value is the CLI's grad (value, then gradient); without it, jax.grad
    vg = compile_(backend="interp", transforms=[T(grad=kiln_pb2.GradTransform(with_value=True))])
    r = run(vg.executable_id, x)
    check(len(r.outputs) == 2 and float(array(r.outputs[0].literal)) == 14.0
          and np.array_equal(array(r.outputs[1].literal), 2 * x), "grad with_value: (14, 2x)")
    g = compile_(backend="interp", transforms=[T(grad=kiln_pb2.GradTransform())])
    r = run(g.executable_id, x)
    check(len(r.outputs) == 1 and np.array_equal(array(r.outputs[0].literal), 2 * x),
          "grad without with_value: the gradient alone")
    # output travels: the outer grad differentiates output 0 (the value) again
    gg = compile_(backend="interp", transforms=[
        T(grad=kiln_pb2.GradTransform(with_value=True)),
        T(grad=kiln_pb2.GradTransform(with_value=True, has_output=True, output=0))])
    check(len(gg.signature.parameters) == 1, "grad output=0 composed: compiles")
    vm = compile_(backend="interp", transforms=[T(vmap=kiln_pb2.VmapTransform(axis_size=2))])
    check(list(vm.signature.parameters[0].dimensions) == [2, 3],
          f"vmap axis_size=2: parameter f32[2,3] ({list(vm.signature.parameters[0].dimensions)})")
    xs = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    r = run(vm.executable_id, xs)
    check(np.array_equal(array(r.outputs[0].literal), np.array([14, 77], np.float32)),
          "vmap axis_size=2: runs")

    # the one dump honoured: the module as the transforms left it, which parses
    d = compile_(backend="interp", dump_after_passes=["transforms"],
                 transforms=[T(grad=kiln_pb2.GradTransform(with_value=True))])
    check(len(d.dumps) == 1 and getattr(d.dumps[0], "pass") == "transforms"
          and "ENTRY" in d.dumps[0].hlo_text and "-> (f32[], f32[3])" in d.dumps[0].hlo_text,
          f"dump_after_passes transforms: the grad module's text ({d.dumps[:1]})")
    back = stub.Compile(kiln_pb2.CompileRequest(
        hlo_text=d.dumps[0].hlo_text, options=kiln_pb2.CompileOptions(backend="interp")),
        metadata=md, timeout=60)
    r = run(back.executable_id, x)
    check(len(r.outputs) == 2 and float(array(r.outputs[0].literal)) == 14.0,
          "dump_after_passes transforms: the text compiles and runs as the grad program")
    refused("dump_after_passes", "options.dump_after_passes", dump_after_passes=["*"])
    refused("argument_layouts", "options.argument_layouts",
            argument_layouts=hlo_pb2.ProgramShape())
    refused("interp memory_budget_bytes", "options.memory_budget_bytes", backend="interp",
            memory_budget_bytes=1 << 20)
    refused("interp target", "options.target", backend="interp", target="x86-64-v3")
    refused("interp return_executable", "options.return_executable", backend="interp",
            return_executable=True)
    refused("grad has_aux", "grad.has_aux",
            transforms=[T(grad=kiln_pb2.GradTransform(has_aux=True))])
    refused("checkpoint policy", "checkpoint.policy",
            transforms=[T(checkpoint=kiln_pb2.CheckpointTransform(policy="dots_saveable"))])
    refused("grad output without has_output", "grad.output", grpc.StatusCode.INVALID_ARGUMENT,
            transforms=[T(grad=kiln_pb2.GradTransform(output=1))])
    refused("vmap negative axis_size", "vmap.axis_size", grpc.StatusCode.INVALID_ARGUMENT,
            transforms=[T(vmap=kiln_pb2.VmapTransform(axis_size=-1))])

    # device_ids: the one placement there is is honoured; a choice is refused
    plain = compile_(backend="interp")
    ids = list(run(plain.executable_id, x).device_ids)
    try:
        run(plain.executable_id, x, device_ids=ids)
        check(False, "device_ids among two interp devices: refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNIMPLEMENTED and "device_ids" in e.details(),
              f"device_ids among two interp devices: {e.code()} ({e.details()})")
    cpu = compile_(backend="cpu", timeout=120)
    cids = list(run(cpu.executable_id, x).device_ids)
    r = run(cpu.executable_id, x, device_ids=cids)
    check(list(r.device_ids) == cids and float(array(r.outputs[0].literal)) == 14.0,
          f"device_ids {cids} on the one cpu device: honoured")


def start_kilnd(kilnd):
    # two interpreter devices: a device_ids list then names a choice the
    # scheduler would have to honour (refused), one cpu device: no choice
    cmd = [kilnd, "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--interp-devices", "2"]
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
    ap.add_argument("--source-dir", default=None)
    opts = ap.parse_args()
    kilnd = os.environ.get("KILND", "")
    if not kilnd or not os.access(kilnd, os.X_OK):
        print(f"test_python_client: skipped: kilnd is not built (KILND={kilnd!r})")
        return 77

    tmp = tempfile.mkdtemp(prefix="kiln-pyclient-")
    gen_stubs(opts.proto_dir, tmp)
    sys.path.insert(0, tmp)
    from kiln.v1 import hlo_pb2, kiln_pb2, kiln_pb2_grpc
    from grpc_health_gen.health.v1 import health_pb2

    def dtype_code(name):
        return hlo_pb2.ElementType.Value("ELEMENT_TYPE_" + name)

    def literal(a):
        a = np.ascontiguousarray(a, dtype=np.float32)
        lit = hlo_pb2.Literal()
        lit.shape.element_type = dtype_code("F32")
        lit.shape.dimensions.extend(a.shape)
        lit.data = a.astype("<f4").tobytes()
        return lit

    def array(lit):
        dims = tuple(lit.shape.dimensions)
        return np.frombuffer(lit.data, dtype="<f4").reshape(dims)

    proc, addr = start_kilnd(kilnd)
    try:
        chan = grpc.insecure_channel(
            addr, options=[("grpc.max_receive_message_length", 16 << 20)])
        grpc.channel_ready_future(chan).result(timeout=30)
        stub = kiln_pb2_grpc.KilnStub(chan)
        md = (("kiln-client", "python-test"),)

        # Health, the standard service.
        check_rpc = chan.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)
        h = check_rpc(health_pb2.HealthCheckRequest(service=""), timeout=10)
        check(h.status == health_pb2.HealthCheckResponse.SERVING, "health: SERVING")

        # Compile and execute a small model; numpy is the reference.
        c = stub.Compile(kiln_pb2.CompileRequest(hlo_text=MLP, request_id="py-1"),
                         metadata=md, timeout=120)
        check(c.executable_id != "", "compile: an executable id")
        check(len(c.signature.parameters) == 3, "compile: three parameters")
        check(c.request_id == "py-1", "compile: request id echoed")
        rng = np.random.default_rng(0)
        x = rng.integers(-4, 4, (2, 3)).astype(np.float32)
        w = rng.integers(-4, 4, (3, 4)).astype(np.float32)
        b = rng.integers(-4, 4, (4,)).astype(np.float32)
        req = kiln_pb2.ExecuteRequest(executable_id=c.executable_id)
        for a in (x, w, b):
            req.arguments.add().literal.CopyFrom(literal(a))
        r = stub.Execute(req, metadata=md, timeout=60)
        check(len(r.outputs) == 1, "execute: one output")
        want = np.maximum(x @ w + b, 0)
        got = array(r.outputs[0].literal)
        check(got.shape == (2, 4) and np.array_equal(got, want), "execute: equals numpy")

        # 64 MiB up as a stream of 1 MiB chunks, and back down.
        big = (np.arange(1 << 24, dtype=np.uint32) * 2654435761 % 1000).astype(np.float32)
        raw = big.astype("<f4").tobytes()

        def chunks():
            head = kiln_pb2.PutBufferChunk()
            head.header.shape.element_type = dtype_code("F32")
            head.header.shape.dimensions.append(big.size)
            head.header.label = "python-64MiB"
            yield head
            for off in range(0, len(raw), CHUNK):
                yield kiln_pb2.PutBufferChunk(data=raw[off:off + CHUNK])

        t0 = time.time()
        put = stub.PutBuffer(chunks(), metadata=md, timeout=120)
        t_put = time.time() - t0
        check(put.buffer.size_bytes == len(raw), "put: 64 MiB accepted")
        t0 = time.time()
        parts, first, offset_ok, expect = [], None, True, 0
        for ch in stub.GetBuffer(kiln_pb2.GetBufferRequest(handle=put.buffer.handle),
                                 metadata=md, timeout=120):
            if first is None:
                first = ch
            if ch.data:
                offset_ok &= ch.offset == expect
                expect += len(ch.data)
                parts.append(ch.data)
        t_get = time.time() - t0
        check(first is not None and first.info.handle == put.buffer.handle,
              "get: first chunk describes the buffer")
        check(offset_ok, "get: chunks in order, no gaps")
        check(b"".join(parts) == raw, "get: 64 MiB back byte for byte")
        print(f"     put {len(raw) / t_put / 1e6:.0f} MB/s, get {len(raw) / t_get / 1e6:.0f} MB/s")

        # The buffer as an argument, by handle.
        s = stub.Compile(kiln_pb2.CompileRequest(hlo_text=SUM), metadata=md, timeout=120)
        req = kiln_pb2.ExecuteRequest(executable_id=s.executable_id)
        req.arguments.add().buffer_handle = put.buffer.handle
        r = stub.Execute(req, metadata=md, timeout=120)
        total = array(r.outputs[0].literal)
        check(abs(float(total) - float(big.astype(np.float64).sum())) <= 1e-3 * float(big.sum()),
              "execute: a 64 MiB buffer by handle")

        # Errors as statuses.
        try:
            stub.GetBuffer(kiln_pb2.GetBufferRequest(handle="no-such-handle"),
                           metadata=md, timeout=10).next()
            check(False, "get: unknown handle fails")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.NOT_FOUND, f"get: unknown handle: {e.code()}")
        try:
            stub.Compile(kiln_pb2.CompileRequest(hlo_text="not hlo"), metadata=md, timeout=10)
            check(False, "compile: garbage fails")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"compile: garbage: {e.code()}")

        wire_schema_checks(stub, md, kiln_pb2, hlo_pb2, literal, array)

        # Stats see all of it.
        st = stub.Stats(kiln_pb2.StatsRequest(), metadata=md, timeout=10)
        check(st.server_version != "", "stats: a version")
        check(st.executions >= 2, f"stats: executions {st.executions}")
        check(st.live_buffers >= 1 and st.live_buffer_bytes >= len(raw),
              f"stats: {st.live_buffers} live buffers, {st.live_buffer_bytes} bytes")
        rel = stub.ReleaseBuffers(kiln_pb2.ReleaseBuffersRequest(handles=[put.buffer.handle]),
                                  metadata=md, timeout=10)
        check(rel.released == 1 and rel.freed_bytes == len(raw), "release: 64 MiB freed")
        chan.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        check(rc == 0, f"kilnd exits 0 on SIGTERM (got {rc})")

    if FAILURES:
        print(f"test_python_client: {len(FAILURES)} failed")
        return 1
    print("test_python_client: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
