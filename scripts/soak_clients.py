#!/usr/bin/env python3
"""The clients of scripts/soak.sh: N threads of mixed Compile, Execute,
PutBuffer and GetBuffer against several kilnd for a bounded time.

Every answer is checked: an executed program must return its exact result
(x * y + n over f32[4], n chosen per program, from a pool small enough that
the servers share entries through Redis), a downloaded buffer must hold the
bytes uploaded. Every failure must be a gRPC status (an RpcError with a
code); anything else (an exception of another kind, a wrong result) is
counted as such. A client whose executable vanished (its server restarted,
or evicted it) compiles again.

Writes a JSON summary: per operation, OK count, failures by status code,
wrong results, failures that were not a status, and latency percentiles.

    soak_clients.py --servers A,B --clients 32 --duration 120 --proto-dir proto --out F
"""
import argparse
import json
import os
import random
import struct
import sys
import tempfile
import threading
import time

import grpc
from grpc_tools import protoc

X = [1.0, 2.0, 3.0, 4.0]
Y = [0.5, -1.0, 2.0, 3.0]
F32 = 16
RPC_TIMEOUT = 30


def load_stubs(proto_dir):
    out = tempfile.mkdtemp(prefix="kiln-soak-stubs-")
    args = ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}"]
    files = [os.path.join(proto_dir, f) for f in ("kiln/v1/hlo.proto", "kiln/v1/kiln.proto")]
    if protoc.main(args + files) != 0:
        raise RuntimeError("grpc_tools.protoc failed")
    sys.path.insert(0, out)
    from kiln.v1 import hlo_pb2, kiln_pb2, kiln_pb2_grpc  # noqa: E402
    return hlo_pb2, kiln_pb2, kiln_pb2_grpc


def program(n):
    hlo = (f"HloModule soak{n}\nENTRY main {{\n  x = f32[4] parameter(0)\n"
           f"  y = f32[4] parameter(1)\n  m = f32[4] multiply(x, y)\n"
           f"  c = f32[] constant({n})\n  cb = f32[4] broadcast(c), dimensions={{}}\n"
           f"  ROOT r = f32[4] add(m, cb)\n}}\n")
    return hlo, [a * b + n for a, b in zip(X, Y)]


class Stats:
    def __init__(self):
        self.mu = threading.Lock()
        self.ops = {}

    def add(self, op, outcome, ms):
        with self.mu:
            o = self.ops.setdefault(op, {"ok": 0, "status": {}, "wrong": 0, "not_status": 0,
                                         "ms": []})
            if outcome == "ok":
                o["ok"] += 1
            elif outcome == "wrong":
                o["wrong"] += 1
            elif outcome.startswith("status:"):
                code = outcome[7:]
                o["status"][code] = o["status"].get(code, 0) + 1
            else:
                o["not_status"] += 1
                o.setdefault("not_status_examples", [])
                if len(o["not_status_examples"]) < 5:
                    o["not_status_examples"].append(outcome)
            if len(o["ms"]) < 200000:
                o["ms"].append(ms)

    def summary(self):
        out = {}
        for op, o in self.ops.items():
            ms = sorted(o.pop("ms"))
            o["p50_ms"] = ms[len(ms) // 2] if ms else None
            o["p99_ms"] = ms[int(len(ms) * 0.99)] if ms else None
            out[op] = o
        return out


def f32_literal(hlo, vals):
    return hlo.Literal(shape=hlo.Shape(element_type=F32, dimensions=[len(vals)]),
                       data=struct.pack("<%df" % len(vals), *vals))


def client(idx, servers, deadline, pb, stats, npro):
    hlo, kiln, kgrpc = pb
    rng = random.Random(idx)
    addr = servers[idx % len(servers)]
    chan = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64 << 20)])
    stub = kgrpc.KilnStub(chan)
    md = (("kiln-client", f"soak-{idx}"),)
    exes = {}  # program n -> executable id on this server

    def timed(op, fn):
        t0 = time.monotonic()
        try:
            outcome = fn()
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            outcome = f"status:{code.name}" if code is not None else f"rpcerror:{e!r}"[:200]
        except Exception as e:  # noqa: BLE001 - counted, never raised
            outcome = f"{type(e).__name__}: {e}"[:200]
        stats.add(op, outcome, (time.monotonic() - t0) * 1e3)
        return outcome

    def compile_one(n):
        text, _ = program(n)
        req = kiln.CompileRequest(hlo_text=text, options=kiln.CompileOptions(backend="cpu"))
        resp = stub.Compile(req, timeout=RPC_TIMEOUT, metadata=md)
        if len(resp.executable_id) != 64:
            return "wrong"
        exes[n] = resp.executable_id
        return "ok"

    def execute_one(n):
        _, want = program(n)
        req = kiln.ExecuteRequest(executable_id=exes[n], arguments=[
            kiln.Argument(literal=f32_literal(hlo, X)), kiln.Argument(literal=f32_literal(hlo, Y))])
        try:
            resp = stub.Execute(req, timeout=RPC_TIMEOUT, metadata=md)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                exes.pop(n, None)  # the server lost it: compile again next time
            raise
        got = struct.unpack("<4f", resp.outputs[0].literal.data)
        return "ok" if list(got) == [float(struct.unpack("<f", struct.pack("<f", w))[0])
                                     for w in want] else "wrong"

    def put_get():
        count = rng.choice([4, 1024, 65536, 262144])
        data = os.urandom(4 * count)

        def chunks():
            step = 65536
            hdr = kiln.PutBufferHeader(shape=hlo.Shape(element_type=F32, dimensions=[count]),
                                       label="soak")
            yield kiln.PutBufferChunk(header=hdr, data=data[:step])
            for off in range(step, len(data), step):
                yield kiln.PutBufferChunk(data=data[off:off + step])

        put = stub.PutBuffer(chunks(), timeout=RPC_TIMEOUT, metadata=md)
        handle = put.buffer.handle
        got = bytearray()
        for ch in stub.GetBuffer(kiln.GetBufferRequest(handle=handle, release=True),
                                 timeout=RPC_TIMEOUT, metadata=md):
            if ch.data:
                if ch.offset != len(got):
                    return "wrong"
                got += ch.data
        return "ok" if bytes(got) == data else "wrong"

    while time.monotonic() < deadline:
        r = rng.random()
        n = rng.randrange(npro)
        if r < 0.2 or (r < 0.6 and n not in exes):
            timed("Compile", lambda: compile_one(n))
        elif r < 0.6:
            timed("Execute", lambda: execute_one(n))
        else:
            timed("PutBuffer+GetBuffer", put_get)
    chan.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", required=True)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=120)
    ap.add_argument("--programs", type=int, default=48)
    ap.add_argument("--proto-dir", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    pb = load_stubs(a.proto_dir)
    servers = a.servers.split(",")
    stats = Stats()
    deadline = time.monotonic() + a.duration
    threads = [threading.Thread(target=client, args=(i, servers, deadline, pb, stats, a.programs))
               for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = stats.summary()
    with open(a.out, "w") as f:
        json.dump(s, f, indent=1, sort_keys=True)
    bad = sum(o["wrong"] + o["not_status"] for o in s.values())
    print(json.dumps(s, indent=1, sort_keys=True))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
