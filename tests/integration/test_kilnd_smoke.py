#!/usr/bin/env python3
"""Smoke test of kilnd through Python grpcio.

Starts a real kilnd on free loopback ports, then: a health check, a compile
and executions (inline arguments, server-resident buffers moved in chunks past
gRPC's 4 MiB message limit, outputs kept on the server), the errors a hostile
or careless client meets (an unknown method, garbage bytes, a foreign handle,
a shape mismatch, a truncated upload), /metrics, and a SIGTERM that must end
the server with exit status 0.

Stubs are generated at run time from proto/ into a temporary directory, so
nothing generated is committed. Usage:

    test_kilnd_smoke.py --kilnd build/server/kilnd --proto-dir proto

Exit status 77 (ctest's SKIP_RETURN_CODE) when grpcio or grpcio-tools is
missing.
"""
import argparse
import importlib.util
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import grpc
    from grpc_tools import protoc
except ImportError as e:  # pragma: no cover
    print(f"skip: {e} (install grpcio and grpcio-tools)")
    sys.exit(77)

ADD_HLO = """
HloModule add
ENTRY main {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  ROOT s = f32[4] add(x, y)
}
"""

SCALE_HLO = """
HloModule scale
ENTRY main {
  x = f32[1310720] parameter(0)
  two = f32[] constant(2)
  b = f32[1310720] broadcast(two), dimensions={}
  m = f32[1310720] multiply(x, b)
  ROOT t = (f32[1310720], f32[1310720]) tuple(m, x)
}
"""

FAILURES = []


def check(cond, what):
    if cond:
        print(f"ok   {what}")
    else:
        print(f"FAIL {what}")
        FAILURES.append(what)


def gen_stubs(proto_dir, out):
    files = ["kiln/v1/hlo.proto", "kiln/v1/kiln.proto", "grpc/health/v1/health.proto"]
    args = ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}"]
    if protoc.main(args + [os.path.join(proto_dir, f) for f in files]) != 0:
        raise RuntimeError("grpc_tools.protoc failed")


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def start_kilnd(kilnd, extra):
    cmd = [kilnd, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"] + extra
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    addr = metrics = None
    deadline = time.time() + 30
    while (addr is None or metrics is None) and time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("kilnd: listening on "):
            addr = line.split()[-1]
        elif line.startswith("kilnd: metrics listening on "):
            metrics = line.split()[-1]
    if addr is None or metrics is None:
        p.kill()
        raise RuntimeError("kilnd did not print its addresses")
    return p, addr, metrics


def code_of(fn):
    try:
        fn()
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--proto-dir", required=True)
    opts = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="kilnd-smoke-")
    gen_stubs(opts.proto_dir, tmp)
    sys.path.insert(0, tmp)
    from kiln.v1 import hlo_pb2, kiln_pb2, kiln_pb2_grpc  # noqa: E402
    health = load(os.path.join(tmp, "grpc/health/v1/health_pb2.py"), "kilnd_health_pb2")
    f32 = hlo_pb2.ElementType.Value("ELEMENT_TYPE_F32")

    def lit(values):
        x = hlo_pb2.Literal()
        x.shape.element_type = f32
        x.shape.dimensions.append(len(values))
        x.data = struct.pack(f"<{len(values)}f", *values)
        return x

    proc, addr, metrics = start_kilnd(opts.kilnd, ["--cpu-devices", "2"])
    try:
        chan = grpc.insecure_channel(addr)
        stub = kiln_pb2_grpc.KilnStub(chan)
        md_a = (("kiln-client", "alice"),)
        md_b = (("kiln-client", "bob"),)

        # Health.
        check_rpc = chan.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health.HealthCheckRequest.SerializeToString,
            response_deserializer=health.HealthCheckResponse.FromString)
        r = check_rpc(health.HealthCheckRequest(service=""), timeout=10)
        check(r.status == health.HealthCheckResponse.SERVING, "health: SERVING")
        code, _ = code_of(lambda: check_rpc(health.HealthCheckRequest(service="nope"), timeout=10))
        check(code == grpc.StatusCode.NOT_FOUND, "health: unknown service is NOT_FOUND")

        # Compile and execute, on each backend.
        for backend in ["interp", ""]:
            req = kiln_pb2.CompileRequest(hlo_text=ADD_HLO, request_id="r1")
            req.options.backend = backend
            cr = stub.Compile(req, timeout=120, metadata=md_a)
            check(len(cr.executable_id) == 64, f"compile[{backend or 'default'}]: 64-hex id")
            check(len(cr.signature.parameters) == 2 and
                  list(cr.signature.result.dimensions) == [4],
                  f"compile[{backend or 'default'}]: signature")
            er = stub.Execute(kiln_pb2.ExecuteRequest(
                executable_id=cr.executable_id,
                arguments=[kiln_pb2.Argument(literal=lit([1, 2, 3, 4])),
                           kiln_pb2.Argument(literal=lit([10, 20, 30, 40]))]),
                timeout=30, metadata=md_a)
            out = struct.unpack("<4f", er.outputs[0].literal.data)
            check(out == (11.0, 22.0, 33.0, 44.0), f"execute[{backend or 'default'}]: {out}")
        again = stub.Compile(kiln_pb2.CompileRequest(hlo_text=ADD_HLO), timeout=60)
        check(again.cache_source == kiln_pb2.CACHE_SOURCE_MEMORY, "compile: repeat is a cache hit")

        # Errors.
        code, _ = code_of(lambda: stub.Execute(kiln_pb2.ExecuteRequest(
            executable_id=cr.executable_id, arguments=[kiln_pb2.Argument(literal=lit([1, 2]))] * 2),
            timeout=10))
        check(code == grpc.StatusCode.INVALID_ARGUMENT, "execute: shape mismatch")
        code, _ = code_of(lambda: stub.Execute(kiln_pb2.ExecuteRequest(executable_id="x" * 64),
                                               timeout=10))
        check(code == grpc.StatusCode.NOT_FOUND, "execute: unknown executable")
        nope = chan.unary_unary("/kiln.v1.Kiln/Nope", request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
        code, _ = code_of(lambda: nope(b"", timeout=10))
        check(code == grpc.StatusCode.UNIMPLEMENTED, "unknown method: UNIMPLEMENTED")
        raw = chan.unary_unary("/kiln.v1.Kiln/Execute", request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
        code, details = code_of(lambda: raw(b"\xff\xff\xff\xff\x0f garbage", timeout=10))
        check(code == grpc.StatusCode.INVALID_ARGUMENT, f"garbage bytes: INVALID_ARGUMENT ({details})")
        code, _ = code_of(lambda: stub.Compile(kiln_pb2.CompileRequest(hlo_text="HloModule x\n"),
                                               timeout=10))
        check(code == grpc.StatusCode.INVALID_ARGUMENT, "compile: bad program")

        # Buffers: 5 MiB up in chunks, scaled on the server, kept, read back.
        n = 1310720
        data = struct.pack(f"<{n}f", *([1.5] * n))

        def chunks():
            hdr = kiln_pb2.PutBufferHeader(label="x")
            hdr.shape.element_type = f32
            hdr.shape.dimensions.append(n)
            yield kiln_pb2.PutBufferChunk(header=hdr)
            for off in range(0, len(data), 1 << 20):
                yield kiln_pb2.PutBufferChunk(data=data[off:off + (1 << 20)])
        pr = stub.PutBuffer(chunks(), timeout=60, metadata=md_a)
        h = pr.buffer.handle
        check(len(h) == 32 and pr.buffer.size_bytes == 4 * n, "put: 5 MiB buffer stored")
        sc = stub.Compile(kiln_pb2.CompileRequest(hlo_text=SCALE_HLO), timeout=120)
        er = stub.Execute(kiln_pb2.ExecuteRequest(
            executable_id=sc.executable_id, arguments=[kiln_pb2.Argument(buffer_handle=h)],
            keep_on_server=[True, True]), timeout=60, metadata=md_a)
        kept = er.outputs[0].buffer.handle
        kept2 = er.outputs[1].buffer.handle
        check(len(kept) == 32 and len(kept2) == 32, "execute: outputs kept on the server")
        got = bytearray()
        in_order = True
        for ch in stub.GetBuffer(kiln_pb2.GetBufferRequest(handle=kept), timeout=60, metadata=md_a):
            in_order = in_order and (not ch.data or ch.offset == len(got))
            got += ch.data
        check(in_order, "get: chunks in order")
        check(len(got) == 4 * n and struct.unpack_from("<f", got, 4 * (n - 1))[0] == 3.0,
              "get: 5 MiB read back in chunks")
        code, _ = code_of(lambda: list(stub.GetBuffer(kiln_pb2.GetBufferRequest(handle=kept),
                                                      timeout=10, metadata=md_b)))
        check(code == grpc.StatusCode.NOT_FOUND, "get: another client's handle is NOT_FOUND")

        def short():
            hdr = kiln_pb2.PutBufferHeader()
            hdr.shape.element_type = f32
            hdr.shape.dimensions.append(8)
            yield kiln_pb2.PutBufferChunk(header=hdr, data=b"\0" * 12)
        code, details = code_of(lambda: stub.PutBuffer(short(), timeout=10, metadata=md_a))
        check(code == grpc.StatusCode.INVALID_ARGUMENT, f"put: truncated stream ({details})")
        rr = stub.ReleaseBuffers(kiln_pb2.ReleaseBuffersRequest(handles=[h, kept, kept2, "0" * 32]),
                                 timeout=10, metadata=md_a)
        check(rr.released == 3 and list(rr.unknown_handles) == ["0" * 32], "release")
        st = stub.Stats(kiln_pb2.StatsRequest(), timeout=10)
        check(st.live_buffers == 0 and st.executions >= 3, "stats: no buffers left, executions")

        # Metrics.
        text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
        check('kiln_requests_total{method="Execute",code="OK"}' in text, "metrics: requests")
        check("kiln_live_buffers 0" in text, "metrics: live buffers")
        chan.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
    check(rc == 0, f"SIGTERM: exit status {rc}")
    if FAILURES:
        print(f"{len(FAILURES)} failed")
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
