#!/usr/bin/env python3
"""The executable cache across servers: several kilnd sharing one real Redis.

Each scenario starts its own redis-server (`--save "" --appendonly no`, a
free loopback port) and kilnd processes (free ports, a temporary
--cache-dir, --redis-url 127.0.0.1:PORT, one KILN_CACHE_SECRET), compiles
small cpu-backend programs and counts with the Stats RPC:

  shared       a module compiled on one server is a SHARED hit on the other,
               and runs there with the right numbers; CacheList, /metrics,
               CacheEvict with shared=true;
  policy       REFRESH builds and overwrites the shared entry; BYPASS builds,
               reads and stores nothing;
  single       32 concurrent identical compiles, 16 on each of two servers:
               one build over the cluster, one key, the rest wait or hit;
  integrity    entries written into Redis behind the servers' backs (a
               flipped byte, cut short, a bad version, another key's entry,
               sealed with another secret) are refused by a server with no
               local copy, counted by reason, rebuilt, and replaced in Redis
               by a good entry;
  lock         the Redis lock driven by hand: a server finding another's
               lock waits for its entry (SINGLE_FLIGHT, nothing built); a
               lock whose holder died expires and the module is built; a
               lock planted without an expiry is taken over at once;
  redis_down   Redis killed under a stream of compiles: no request fails,
               faults are counted and redis_up drops to 0; Redis restarted on
               the same port: shared hits resume without restarting kilnd;
  redis_late   kilnd started before Redis: served meanwhile, sharing once
               Redis is up;
  redis_slow   Redis stopped (SIGSTOP): compiles are not held up past the
               timeouts and faults are counted; SIGCONT: hits resume;
  redis_full   a Redis at maxmemory under noeviction: compiles succeed and
               the refused writes are counted as faults;
  disk         the disk tier survives a restart; a file damaged meanwhile is
               refused and rebuilt, a dead writer's temporary file removed;
               the memory and disk tiers stay within their bounds under a
               flood of modules.

The helpers (RESP client, Redis and kilnd processes, programs) are also used
by bench/bench_cache.py. Usage:

    KILND=build/server/kilnd test_cache_cluster.py --proto-dir proto [--only a,b]

Exit status 0 when everything passed, 1 otherwise, 77 (skipped) when kilnd is
not built, redis-server is not installed, or grpcio/grpcio-tools is missing.
"""
import argparse
import hashlib
import hmac
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

try:
    import grpc
    from grpc_tools import protoc
except ImportError as e:  # pragma: no cover - depends on the environment
    grpc = protoc = None
    IMPORT_ERROR = e

SECRET = "kiln-cluster-test-secret-0123456789"
OTHER_SECRET = "another-cluster-secret-9876543210"
PREFIX = "kiln:v1:"
RPC_TIMEOUT = 180  # seconds; compiles queue behind each other on a busy machine
X = [1.0, 2.0, 3.0, 4.0]
Y = [0.5, -1.0, 2.0, 3.0]

# The sealed entry layout of cache/entry.h: magic, version, kind, key,
# 5 component digests, compile_ns, created_unix_ms, peak_bytes, payload
# length, then the payload and an HMAC-SHA-256 trailer.
ENTRY_MAGIC = b"KILNCE\r\n"
ENTRY_HEADER = 8 + 4 + 4 + 32 + 5 * 32 + 4 * 8
ENTRY_MAC = 32
OFF_VERSION = 8

SANITIZER_MARK = re.compile(r"ERROR: (Address|Leak|Thread)Sanitizer|runtime error: ")

FAILURES = []
pb = None  # the generated modules, once loaded: pb.kiln, pb.grpc


def log(*a):
    print(*a, flush=True)


def check(cond, what):
    log(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILURES.append(what)
    return cond


# ---- stubs -------------------------------------------------------------------


class _Stubs:
    pass


def load_stubs(proto_dir, out):
    """Generates the Python stubs of proto/ into out and imports them."""
    global pb
    os.makedirs(out, exist_ok=True)
    files = ["kiln/v1/hlo.proto", "kiln/v1/kiln.proto"]
    args = ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}"]
    if protoc.main(args + [os.path.join(proto_dir, f) for f in files]) != 0:
        raise RuntimeError("grpc_tools.protoc failed")
    sys.path.insert(0, out)
    from kiln.v1 import hlo_pb2, kiln_pb2, kiln_pb2_grpc
    pb = _Stubs()
    pb.hlo, pb.kiln, pb.grpc = hlo_pb2, kiln_pb2, kiln_pb2_grpc
    pb.src = {v: k[len("CACHE_SOURCE_"):] for k, v in kiln_pb2.CacheSource.items()}
    return pb


# ---- Redis: the process and a raw RESP client ---------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RespError(Exception):
    pass


class Resp:
    """A minimal RESP2 client over one socket: binary-safe, no dependencies."""

    def __init__(self, port, timeout=5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self):
        self.sock.close()

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(max(65536, n + 2 - len(self.buf)))
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RespError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise RespError(f"unexpected reply {line[:40]!r}")

    def send(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))

    def cmd(self, *args):
        """One command; a Redis error reply is raised as RespError."""
        self.send(*args)
        r = self._reply()
        if isinstance(r, RespError):
            raise r
        return r


class Redis:
    """A redis-server of our own on a free loopback port."""

    def __init__(self, tmp, extra=(), port=None):
        self.tmp, self.extra = tmp, list(extra)
        self.port = port or free_port()
        self.proc = None
        self.start()

    def start(self):
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--dir", self.tmp] + self.extra
        self.log = open(os.path.join(self.tmp, f"redis-{self.port}.log"), "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited {self.proc.returncode}")
            try:
                c = Resp(self.port)
                if c.cmd("PING") == "PONG":
                    c.close()
                    return
                c.close()
            except (OSError, RespError):
                pass
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING")

    def client(self):
        return Resp(self.port)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def url(self):
        return f"127.0.0.1:{self.port}"


# ---- kilnd -------------------------------------------------------------------


class Kilnd:
    """A kilnd on free loopback ports, stderr kept in a file for post-mortems."""

    def __init__(self, binary, tmp, name, args=(), secret=SECRET, redis=None, cache_dir=True):
        self.name, self.binary, self.tmp = name, binary, tmp
        self.args = ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"] + list(args)
        if redis is not None:
            self.args += ["--redis-url", redis.url()]
        if cache_dir is True:
            cache_dir = tempfile.mkdtemp(prefix=f"cache-{name}-", dir=tmp)
        if cache_dir:
            self.args += ["--cache-dir", cache_dir]
        self.cache_dir = cache_dir
        self.env = dict(os.environ)
        self.env.pop("KILN_CACHE_SECRET", None)
        if secret is not None:
            self.env["KILN_CACHE_SECRET"] = secret
        self.errpath = os.path.join(tmp, f"kilnd-{name}.stderr")
        self.proc = self.chan = self.stub = None
        self.start()

    def start(self):
        self.err = open(self.errpath, "ab")
        self.proc = subprocess.Popen([self.binary] + self.args, stdout=subprocess.PIPE,
                                     stderr=self.err, env=self.env, text=True)
        self.addr = self.metrics = None
        ready = threading.Event()

        def drain():  # read stdout forever so kilnd never blocks on a full pipe
            for line in self.proc.stdout:
                if line.startswith("kilnd: listening on "):
                    self.addr = line.split()[-1]
                elif line.startswith("kilnd: metrics listening on "):
                    self.metrics = line.split()[-1]
                if self.addr and self.metrics:
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(60) or not self.addr:
            self.stop()
            raise RuntimeError(f"kilnd {self.name} did not print its addresses\n{self.tail()}")
        self.chan = grpc.insecure_channel(
            self.addr, options=[("grpc.max_receive_message_length", 256 << 20)])
        grpc.channel_ready_future(self.chan).result(timeout=30)
        self.stub = pb.grpc.KilnStub(self.chan)

    def stop(self):
        """SIGTERM, then SIGKILL after 20 s; returns the exit status."""
        if self.chan:
            self.chan.close()
            self.chan = None
        rc = None
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        elif self.proc:
            rc = self.proc.returncode
        self.err.close()
        return rc

    def tail(self, n=40):
        try:
            with open(self.errpath, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"  [{self.name}] {x}" for x in lines[-n:])

    # RPCs

    def compile(self, hlo, policy=None, backend="cpu", **opts):
        req = pb.kiln.CompileRequest(hlo_text=hlo)
        req.options.backend = backend
        if policy is not None:
            req.options.cache_policy = policy
        for k, v in opts.items():
            setattr(req.options, k, v)
        return self.stub.Compile(req, timeout=RPC_TIMEOUT)

    def execute(self, exe_id, args=(X, Y)):
        req = pb.kiln.ExecuteRequest(executable_id=exe_id)
        for a in args:
            lit = req.arguments.add().literal
            lit.shape.element_type = pb.hlo.ElementType.Value("ELEMENT_TYPE_F32")
            lit.shape.dimensions.append(len(a))
            lit.data = struct.pack(f"<{len(a)}f", *a)
        r = self.stub.Execute(req, timeout=RPC_TIMEOUT)
        data = r.outputs[0].literal.data
        return list(struct.unpack(f"<{len(data) // 4}f", data))

    def stats(self):
        """Counters as {(name, ((label, value), ...)): value}."""
        r = self.stub.Stats(pb.kiln.StatsRequest(), timeout=30)
        return {(c.name, tuple(sorted((l.name, l.value) for l in c.labels))): c.value
                for c in r.counters}

    def evict(self, keys=(), all_=False, shared=False):
        return self.stub.CacheEvict(
            pb.kiln.CacheEvictRequest(keys=list(keys), all=all_, shared=shared),
            timeout=30).evicted

    def cache_list(self, keys=()):
        return self.stub.CacheList(pb.kiln.CacheListRequest(keys=list(keys)), timeout=30)


def ctr(stats, name, **labels):
    """One counter's value; 0 when the server does not report it."""
    return stats.get((name, tuple(sorted(labels.items()))), 0)


def has(stats, name, **labels):
    return (name, tuple(sorted(labels.items()))) in stats


def delta(before, after, name, **labels):
    """How much a counter grew; None when the server does not report it."""
    if not has(after, name, **labels):
        return None
    return ctr(after, name, **labels) - ctr(before, name, **labels)


# ---- programs ----------------------------------------------------------------

_serial = [0]
_serial_lock = threading.Lock()


def program(n=None):
    """A small distinct program (x * y + n over f32[4]) and its expected result."""
    if n is None:
        with _serial_lock:
            _serial[0] += 1
            n = _serial[0]
    hlo = f"""HloModule p{n}
ENTRY main {{
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  m = f32[4] multiply(x, y)
  c = f32[] constant({n})
  cb = f32[4] broadcast(c), dimensions={{}}
  ROOT r = f32[4] add(m, cb)
}}
"""
    return hlo, [a * b + n for a, b in zip(X, Y)]


def close(got, want):
    return len(got) == len(want) and all(abs(g - w) <= 1e-5 * max(1, abs(w))
                                         for g, w in zip(got, want))


def src(resp):
    return pb.src.get(resp.cache_source, str(resp.cache_source))


def entry_mac_ok(value, secret):
    if len(value) < ENTRY_HEADER + ENTRY_MAC:
        return False
    mac = hmac.new(secret.encode(), value[:-ENTRY_MAC], hashlib.sha256).digest()
    return hmac.compare_digest(mac, value[-ENTRY_MAC:])


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


# ---- scenarios ---------------------------------------------------------------


class Env:
    """What a scenario starts; everything is stopped at its end."""

    def __init__(self, kilnd_bin, tmp, scenario=""):
        self.kilnd_bin, self.tmp = kilnd_bin, os.path.join(tmp, scenario) if scenario else tmp
        os.makedirs(self.tmp, exist_ok=True)
        self.servers, self.redises = [], []

    def redis(self, extra=()):
        r = Redis(self.tmp, extra)
        self.redises.append(r)
        return r

    def kilnd(self, name, *args, **kw):
        k = Kilnd(self.kilnd_bin, self.tmp, name, args, **kw)
        self.servers.append(k)
        return k

    def close(self):
        for k in self.servers:
            rc = k.stop()
            if rc not in (0, None):
                check(False, f"kilnd {k.name} exits 0 on SIGTERM (got {rc})")
            # A sanitizer build reports on stderr and may still exit 0.
            bad = [x for x in k.tail(100000).splitlines() if SANITIZER_MARK.search(x)]
            if bad:
                check(False, f"kilnd {k.name}: sanitizer report: {bad[0].strip()}")
                log(k.tail(80))
        for r in self.redises:
            r.kill()

    def dump_logs(self):
        for k in self.servers:
            t = k.tail()
            if t:
                log(f"--- kilnd {k.name} stderr (last lines) ---\n{t}")


def scenario_shared(env):
    r = env.redis()
    a = env.kilnd("A", redis=r)
    b = env.kilnd("B", redis=r)
    hlo, want = program()
    ca = a.compile(hlo)
    check(src(ca) == "COMPILED", f"shared: first compile on A is COMPILED (got {src(ca)})")
    check(len(ca.cache_key) == 64 and ca.cache_key == ca.executable_id,
          "shared: the cache key is 64 hex digits and is the executable id")
    names = [c.name for c in ca.key_components]
    check(names == ["module", "signature", "options", "target", "version"],
          f"shared: five key components in order (got {names})")
    check(all(len(c.digest) == 64 for c in ca.key_components),
          "shared: each component digest is 64 hex digits")
    val = r.client().cmd("GET", PREFIX + "exe:" + ca.cache_key)
    check(val is not None and val[:8] == ENTRY_MAGIC,
          f"shared: Redis holds {PREFIX}exe:<key>, a sealed entry")
    check(val is not None and entry_mac_ok(val, SECRET),
          "shared: the entry's HMAC-SHA-256 trailer verifies under the cluster secret")
    before = b.stats()
    cb = b.compile(hlo)
    after = b.stats()
    check(src(cb) == "SHARED", f"shared: the same module on B is SHARED (got {src(cb)})")
    check(cb.cache_key == ca.cache_key, "shared: same key on both servers")
    d = delta(before, after, "kiln_cache_hits_total", tier="redis")
    check(d == 1, f"shared: B counts one redis hit (got {d})")
    d = delta(before, after, "kiln_cache_builds_total")
    check(d == 0, f"shared: B built nothing (got {d})")
    got = b.execute(cb.executable_id)
    check(close(got, want), f"shared: executing on B gives {want} (got {got})")
    cb2 = b.compile(hlo)
    check(src(cb2) == "MEMORY", f"shared: again on B is MEMORY (got {src(cb2)})")
    lst = b.cache_list([ca.cache_key])
    tiers = [list(e.tiers) for e in lst.entries]
    check(tiers == [["memory", "disk"]], f"shared: B lists the entry in memory and disk ({tiers})")
    if lst.entries:
        e = lst.entries[0]
        check(e.key == ca.cache_key and e.bytes > 0 and e.compile_ns > 0
              and [(k.name, k.digest) for k in e.components]
              == [(k.name, k.digest) for k in ca.key_components],
              "shared: the listed entry has its key, size, compile time and components")
    text = urllib.request.urlopen(f"http://{b.metrics}/metrics", timeout=10).read().decode()
    line = 'kiln_cache_hits_total{tier="redis"} 1'
    check(line in text.splitlines(), f"shared: B's /metrics has the line {line}")

    # Evicting with shared=true also removes the Redis entry: B, emptied of
    # its local copy too, then builds again.
    n = a.evict([ca.cache_key], shared=True)
    check(n >= 2, f"shared: A evicts the key from its tiers and Redis ({n} removals)")
    check(r.client().cmd("EXISTS", PREFIX + "exe:" + ca.cache_key) == 0,
          "shared: the Redis entry is gone")
    b.evict([ca.cache_key])
    check(len(b.cache_list([ca.cache_key]).entries) == 0, "shared: B lists no entry after evict")
    cb3 = b.compile(hlo)
    check(src(cb3) == "COMPILED", f"shared: after both evictions B builds (got {src(cb3)})")
    check(close(b.execute(cb3.executable_id), want), "shared: and it runs right")


def scenario_single(env):
    r = env.redis()
    a = env.kilnd("A", redis=r)
    b = env.kilnd("B", redis=r)
    hlo, want = program()
    before = [s.stats() for s in (a, b)]
    barrier = threading.Barrier(32)
    results = [None] * 32

    def worker(i):
        server = a if i % 2 == 0 else b
        barrier.wait(timeout=60)
        try:
            results[i] = server.compile(hlo)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RPC_TIMEOUT + 60)
    after = [s.stats() for s in (a, b)]
    errors = [x for x in results if not hasattr(x, "cache_key")]
    check(not errors, f"single: all 32 compiles succeed ({len(errors)} failed: {errors[:2]})")
    ok = [x for x in results if hasattr(x, "cache_key")]
    keys = {x.cache_key for x in ok}
    check(len(keys) == 1, f"single: one key over all 32 ({len(keys)} distinct)")
    sources = [src(x) for x in ok]
    hist = {s: sources.count(s) for s in sorted(set(sources))}
    check(sources.count("COMPILED") == 1, f"single: exactly one COMPILED (sources {hist})")
    check(set(sources) <= {"COMPILED", "SINGLE_FLIGHT", "SHARED", "MEMORY"},
          f"single: the rest SINGLE_FLIGHT, SHARED or MEMORY (sources {hist})")
    ds = [delta(x, y, "kiln_cache_builds_total") for x, y in zip(before, after)]
    builds = None if None in ds else sum(ds)
    check(builds == 1, f"single: kiln_cache_builds_total over both servers +1 (got +{builds})")
    if ok:
        for s in (a, b):
            c = s.compile(hlo)
            got = s.execute(c.executable_id)
            check(close(got, want), f"single: executing on {s.name} gives {want} (got {got})")


def integrity_case(env, a, c, r, reason, mangle):
    """Puts a good entry in Redis through A, replaces it by mangle(value,
    other) and compiles the module on C, which has never seen it."""
    hlo, want = program()
    ka = a.compile(hlo)
    key = PREFIX + "exe:" + ka.cache_key
    rc = r.client()
    good = rc.cmd("GET", key)
    if not check(good is not None and entry_mac_ok(good, SECRET),
                 f"integrity/{reason}: A stored a good entry"):
        return
    other_val = None
    if reason == "key":  # another module's good entry
        other = a.compile(program()[0])
        other_val = rc.cmd("GET", PREFIX + "exe:" + other.cache_key)
    bad = mangle(good, other_val)
    rc.cmd("SET", key, bad)
    before = c.stats()
    kc = c.compile(hlo)
    after = c.stats()
    check(src(kc) == "COMPILED", f"integrity/{reason}: refused and rebuilt: COMPILED "
          f"(got {src(kc)})")
    d = delta(before, after, "kiln_cache_integrity_failures_total", reason=reason)
    check(d == 1, f"integrity/{reason}: integrity_failures_total{{reason={reason}}} +1 (got +{d})")
    got = c.execute(kc.executable_id)
    check(close(got, want), f"integrity/{reason}: executing gives {want} (got {got})")
    now = rc.cmd("GET", key)
    check(now is not None and entry_mac_ok(now, SECRET) and now[16:48] == good[16:48],
          f"integrity/{reason}: Redis holds a good entry again")
    rc.close()


def flip(value, off):
    return value[:off] + bytes([value[off] ^ 0x01]) + value[off + 1:]


def scenario_integrity(env):
    r = env.redis()
    a = env.kilnd("A", redis=r)
    c = env.kilnd("C", redis=r, cache_dir=None)
    payload_mid = lambda v: ENTRY_HEADER + (len(v) - ENTRY_HEADER - ENTRY_MAC) // 2
    integrity_case(env, a, c, r, "mac", lambda v, o: flip(v, payload_mid(v)))
    integrity_case(env, a, c, r, "mac", lambda v, o: flip(v, len(v) - 1))
    integrity_case(env, a, c, r, "truncated", lambda v, o: v[:len(v) // 2])
    integrity_case(env, a, c, r, "truncated", lambda v, o: v[:-1])
    integrity_case(env, a, c, r, "truncated", lambda v, o: v[:7])
    integrity_case(env, a, c, r, "version", lambda v, o: flip(v, OFF_VERSION))
    integrity_case(env, a, c, r, "version", lambda v, o: b"NOTKILN!" + v[8:])
    integrity_case(env, a, c, r, "key", lambda v, o: o)

    # Sealed with another secret, by a server of another cluster on the same
    # Redis; C (this cluster) must refuse it.
    d = env.kilnd("D", redis=r, secret=OTHER_SECRET)
    hlo, want = program()
    kd = d.compile(hlo)
    rc = r.client()
    val = rc.cmd("GET", PREFIX + "exe:" + kd.cache_key)
    check(val is not None and entry_mac_ok(val, OTHER_SECRET) and not entry_mac_ok(val, SECRET),
          "integrity/secret: D sealed its entry with its own secret")
    before = c.stats()
    kc = c.compile(hlo)
    after = c.stats()
    check(src(kc) == "COMPILED", f"integrity/secret: refused and rebuilt: COMPILED "
          f"(got {src(kc)})")
    dm = delta(before, after, "kiln_cache_integrity_failures_total", reason="mac")
    check(dm == 1, f"integrity/secret: counted as reason mac (+{dm})")
    got = c.execute(kc.executable_id)
    check(close(got, want), f"integrity/secret: executing gives {want} (got {got})")
    rc.close()
    st = c.stats()
    check(all(has(st, "kiln_cache_integrity_failures_total", reason=x)
              for x in ("truncated", "version", "key", "mac")),
          "integrity: Stats reports the four reasons")


def scenario_redis_down(env):
    r = env.redis()
    a = env.kilnd("A", redis=r)
    b = env.kilnd("B", redis=r)
    stop = threading.Event()
    lock = threading.Lock()
    done, failed = [], []

    def worker(server):
        while not stop.is_set():
            hlo, want = program()
            try:
                c = server.compile(hlo)
                got = server.execute(c.executable_id)
                with lock:
                    (done if close(got, want) else failed).append((server.name, src(c), got))
            except Exception as e:  # noqa: BLE001
                with lock:
                    failed.append((server.name, repr(e)))

    threads = [threading.Thread(target=worker, args=(s,)) for s in (a, b, a, b)]
    for t in threads:
        t.start()
    time.sleep(2.5)
    with lock:
        before_kill = len(done)
    r.kill()
    time.sleep(4.0)
    stop.set()
    for t in threads:
        t.join(RPC_TIMEOUT + 60)
    log(f"     {len(done)} compile+execute done ({before_kill} before the kill)")
    check(not failed, f"redis_down: no failed request ({len(failed)} failed: {failed[:2]})")
    check(len(done) > before_kill, "redis_down: compiles went on after Redis died")
    for s in (a, b):
        st = s.stats()
        check(ctr(st, "kiln_cache_redis_faults_total") > 0,
              f"redis_down: {s.name} counts Redis faults "
              f"({ctr(st, 'kiln_cache_redis_faults_total')})")
        check(has(st, "kiln_cache_redis_up") and ctr(st, "kiln_cache_redis_up") == 0,
              f"redis_down: {s.name} reports kiln_cache_redis_up 0")
    # A compile while Redis is down is still served.
    hlo, want = program()
    c = a.compile(hlo)
    check(src(c) == "COMPILED" and close(a.execute(c.executable_id), want),
          f"redis_down: a compile with Redis down is COMPILED and right (got {src(c)})")

    r.start()
    t0 = time.time()
    shared_after = None
    while time.time() - t0 < 20:
        hlo, want = program()
        a.compile(hlo)
        cb = b.compile(hlo)
        if src(cb) == "SHARED":
            shared_after = time.time() - t0
            check(close(b.execute(cb.executable_id), want),
                  "redis_down: the shared hit after the restart executes right")
            break
        time.sleep(0.2)
    check(shared_after is not None, "redis_down: after Redis restarts, a module compiled on A "
          f"is a SHARED hit on B (after {shared_after and round(shared_after, 2)} s)")
    for s in (a, b):
        st = s.stats()
        check(ctr(st, "kiln_cache_redis_up") == 1,
              f"redis_down: {s.name} reports redis_up 1 again")


def timed_compile(server, hlo, out):
    t0 = time.time()
    try:
        out["resp"] = server.compile(hlo)
    except Exception as e:  # noqa: BLE001
        out["resp"] = e
    out["s"] = time.time() - t0


def scenario_lock(env):
    """The Redis lock between servers, driven by hand: a server that finds
    another one's lock waits for its entry; a lock whose holder died (it
    expires with no entry) is taken over and the module built."""
    r = env.redis()
    aux = env.redis()
    a = env.kilnd("A", redis=r, cache_dir=None)
    x = env.kilnd("X", redis=aux, cache_dir=None)  # same secret, its own Redis
    rc = r.client()

    # Another server holds the lock and stores its entry 0.8 s later.
    hlo, want = program()
    kx = x.compile(hlo)
    val = aux.client().cmd("GET", PREFIX + "exe:" + kx.cache_key)
    rc.cmd("SET", PREFIX + "lock:" + kx.cache_key, "another-server", "PX", "20000")
    before = a.stats()
    out = {}
    t = threading.Thread(target=timed_compile, args=(a, hlo, out))
    t.start()
    time.sleep(0.8)
    rc.cmd("SET", PREFIX + "exe:" + kx.cache_key, val)
    t.join(RPC_TIMEOUT + 10)
    after = a.stats()
    ka = out.get("resp")
    ok = hasattr(ka, "cache_key")
    check(ok, "lock: the compile waiting on another server's lock succeeds"
          + ("" if ok else f" ({ka!r:.300})"))
    if ok:
        check(src(ka) == "SINGLE_FLIGHT" and ka.cache_key == kx.cache_key,
              f"lock: it is served the other server's entry: SINGLE_FLIGHT (got {src(ka)})")
        check(0.7 <= out["s"] < 10, f"lock: it waited for the entry ({out['s']:.2f} s)")
        check(close(a.execute(ka.executable_id), want), "lock: and it runs right")
    d = delta(before, after, "kiln_cache_lock_waits_total")
    check(d == 1, f"lock: kiln_cache_lock_waits_total +1 (got {d})")
    d = delta(before, after, "kiln_cache_builds_total")
    check(d == 0, f"lock: nothing built (got {d})")

    # A lock left by a server that died: it expires (1.5 s) with no entry.
    hlo, want = program()
    kx = x.compile(hlo)
    rc.cmd("SET", PREFIX + "lock:" + kx.cache_key, "a-dead-server", "PX", "1500")
    before = a.stats()
    out = {}
    timed_compile(a, hlo, out)
    after = a.stats()
    ka = out.get("resp")
    ok = hasattr(ka, "cache_key")
    check(ok, "lock: the compile behind a dead server's lock succeeds"
          + ("" if ok else f" ({ka!r:.300})"))
    if ok:
        check(src(ka) == "COMPILED", f"lock: built once the lock expired (got {src(ka)})")
        check(1.2 <= out["s"] < 10,
              f"lock: after waiting about the lock's life ({out['s']:.2f} s)")
        check(close(a.execute(ka.executable_id), want), "lock: and it runs right")
    check(delta(before, after, "kiln_cache_builds_total") == 1, "lock: one build")
    check(rc.cmd("EXISTS", PREFIX + "lock:" + kx.cache_key) == 0, "lock: A released its lock")
    check(rc.cmd("EXISTS", PREFIX + "exe:" + kx.cache_key) == 1, "lock: A stored its entry")

    # A lock key planted without an expiry (kiln never sets one): it would
    # hold every server off the key for good; a Compile without a deadline
    # takes it over at once and builds.
    hlo, want = program()
    kx = x.compile(hlo)
    rc.cmd("SET", PREFIX + "lock:" + kx.cache_key, "forever")
    before = a.stats()
    out = {}
    timed_compile(a, hlo, out)
    after = a.stats()
    ka = out.get("resp")
    ok = hasattr(ka, "cache_key")
    check(ok, "lock: the compile behind a lock without expiry succeeds"
          + ("" if ok else f" ({ka!r:.300})"))
    if ok:
        check(src(ka) == "COMPILED", f"lock: built at once (got {src(ka)})")
        check(out["s"] < 10, f"lock: without waiting on the lock ({out['s']:.2f} s)")
        check(close(a.execute(ka.executable_id), want), "lock: and it runs right")
    check(delta(before, after, "kiln_cache_builds_total") == 1, "lock: one build")
    check(rc.cmd("EXISTS", PREFIX + "lock:" + kx.cache_key) == 0,
          "lock: the taken-over lock was released as A's own")
    rc.close()


def scenario_redis_late(env):
    """kilnd started before its Redis: compiles are served meanwhile, and
    once Redis comes up the servers share without a restart."""
    port = free_port()
    a = env.kilnd("A", "--redis-url", f"127.0.0.1:{port}")
    b = env.kilnd("B", "--redis-url", f"127.0.0.1:{port}")
    hlo, want = program()
    c = a.compile(hlo)
    check(src(c) == "COMPILED" and close(a.execute(c.executable_id), want),
          f"redis_late: a compile with no Redis yet is COMPILED and right (got {src(c)})")
    st = a.stats()
    check(has(st, "kiln_cache_redis_up") and ctr(st, "kiln_cache_redis_up") == 0,
          "redis_late: kiln_cache_redis_up 0")
    r = Redis(env.tmp, port=port)
    env.redises.append(r)
    t0 = time.time()
    shared_after = None
    while time.time() - t0 < 20:
        hlo, want = program()
        a.compile(hlo)
        cb = b.compile(hlo)
        if src(cb) == "SHARED":
            shared_after = time.time() - t0
            check(close(b.execute(cb.executable_id), want),
                  "redis_late: the shared hit runs right")
            break
        time.sleep(0.2)
    check(shared_after is not None, "redis_late: once Redis is up, SHARED hits begin "
          f"(after {shared_after and round(shared_after, 2)} s)")


def scenario_redis_slow(env):
    """Redis stopped (SIGSTOP: connections open, no answers): compiles are
    served within the Redis timeouts, faults counted; SIGCONT: hits resume."""
    r = env.redis()
    a = env.kilnd("A", "--redis-timeout-ms", "200", redis=r)
    b = env.kilnd("B", "--redis-timeout-ms", "200", redis=r)
    hlo, want = program()
    a.compile(hlo)
    check(src(b.compile(hlo)) == "SHARED", "redis_slow: a SHARED hit before Redis stops")
    before = a.stats()
    r.proc.send_signal(signal.SIGSTOP)
    try:
        for i in range(3):
            hlo, want = program()
            t0 = time.time()
            c = a.compile(hlo)
            took = time.time() - t0
            check(src(c) == "COMPILED" and close(a.execute(c.executable_id), want),
                  f"redis_slow: compile {i} with Redis stopped is COMPILED and right "
                  f"(got {src(c)}, {took:.2f} s)")
            check(took < 10, f"redis_slow: compile {i} is not held up by Redis ({took:.2f} s)")
        after = a.stats()
        d = delta(before, after, "kiln_cache_redis_faults_total")
        check(d is not None and d > 0, f"redis_slow: A counts the timeouts as faults (+{d})")
    finally:
        r.proc.send_signal(signal.SIGCONT)
    t0 = time.time()
    shared_after = None
    while time.time() - t0 < 20:
        hlo, want = program()
        a.compile(hlo)
        if src(b.compile(hlo)) == "SHARED":
            shared_after = time.time() - t0
            break
        time.sleep(0.2)
    check(shared_after is not None, "redis_slow: after SIGCONT, SHARED hits resume "
          f"(after {shared_after and round(shared_after, 2)} s)")


def scenario_policy(env):
    """CompileOptions.cache_policy: REFRESH builds and overwrites every tier,
    BYPASS builds and stores nothing."""
    r = env.redis()
    a = env.kilnd("A", redis=r)
    b = env.kilnd("B", redis=r)
    refresh = pb.kiln.CachePolicy.Value("CACHE_POLICY_REFRESH")
    bypass = pb.kiln.CachePolicy.Value("CACHE_POLICY_BYPASS")
    rc = r.client()

    hlo, want = program()
    c1 = a.compile(hlo)
    key = PREFIX + "exe:" + c1.cache_key
    v1 = rc.cmd("GET", key)
    time.sleep(0.01)  # created_unix_ms must move
    before = a.stats()
    c2 = a.compile(hlo, policy=refresh)
    after = a.stats()
    check(src(c2) == "COMPILED", f"policy: REFRESH of a cached module is COMPILED (got {src(c2)})")
    d = delta(before, after, "kiln_cache_builds_total")
    check(d == 1, f"policy: REFRESH builds once (+{d})")
    v2 = rc.cmd("GET", key)
    check(v1 is not None and v2 is not None and entry_mac_ok(v2, SECRET)
          and v2[216:224] != v1[216:224], "policy: REFRESH overwrote the Redis entry")
    check(close(a.execute(c2.executable_id), want), "policy: the refreshed module runs right")
    check(src(b.compile(hlo)) == "SHARED", "policy: the refreshed entry is shared")

    hlo, want = program()
    before = a.stats()
    c3 = a.compile(hlo, policy=bypass)
    after = a.stats()
    check(src(c3) == "COMPILED", f"policy: BYPASS is COMPILED (got {src(c3)})")
    check(delta(before, after, "kiln_cache_builds_total") == 1, "policy: BYPASS builds once")
    check(close(a.execute(c3.executable_id), want), "policy: the BYPASS module runs right")
    check(rc.cmd("EXISTS", PREFIX + "exe:" + c3.cache_key) == 0,
          "policy: BYPASS stored nothing in Redis")
    check(len(a.cache_list([c3.cache_key]).entries) == 0,
          "policy: BYPASS stored nothing in the local tiers")
    c4 = b.compile(hlo)
    check(src(c4) == "COMPILED", f"policy: another server builds it again (got {src(c4)})")
    c5 = a.compile(hlo, policy=bypass)
    check(src(c5) == "COMPILED", f"policy: BYPASS does not read Redis either (got {src(c5)})")
    rc.close()


def scenario_redis_full(env):
    r = env.redis(["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"])
    rc = r.client()
    for i in range(400):
        try:
            rc.cmd("SET", f"filler:{i}", b"x" * 16384)
        except RespError:
            break
    # Redis checks maxmemory before a write, not after: memory freed by a
    # closing client would let the next write through. Put the limit well
    # under what is held so that every write is refused.
    info = rc.cmd("INFO", "memory").decode()
    used = int(next(x for x in info.split() if x.startswith("used_memory:")).split(":")[1])
    rc.cmd("CONFIG", "SET", "maxmemory", str(max(used // 2, 1 << 20)))
    rc.close()
    refused = False
    rc = r.client()
    try:
        rc.cmd("SET", "probe", "1")
    except RespError as e:
        refused = "OOM" in str(e)
    check(refused, "redis_full: Redis refuses writes (OOM) once prefilled")
    a = env.kilnd("A", redis=r)
    b = env.kilnd("B", redis=r)
    for s in (a, b):
        hlo, want = program()
        c = s.compile(hlo)
        check(src(c) == "COMPILED", f"redis_full: compile on {s.name} succeeds: COMPILED "
              f"(got {src(c)})")
        check(rc.cmd("EXISTS", PREFIX + "exe:" + c.cache_key) == 0,
              f"redis_full: Redis refused {s.name}'s entry")
        check(close(s.execute(c.executable_id), want), f"redis_full: executing on {s.name} right")
        c2 = s.compile(hlo)
        check(src(c2) == "MEMORY", f"redis_full: again on {s.name} is MEMORY (got {src(c2)})")
        st = s.stats()
        check(ctr(st, "kiln_cache_redis_faults_total") > 0,
              f"redis_full: {s.name} counts the refused writes as faults "
              f"({ctr(st, 'kiln_cache_redis_faults_total')})")


def scenario_disk(env):
    cache_dir = tempfile.mkdtemp(prefix="cache-E-", dir=env.tmp)
    e = env.kilnd("E", cache_dir=cache_dir)
    hlo, want = program()
    c1 = e.compile(hlo)
    check(src(c1) == "COMPILED", f"disk: first compile COMPILED (got {src(c1)})")
    lst = e.cache_list([c1.cache_key])
    size = lst.entries[0].bytes if lst.entries else 0
    check(size > 0, f"disk: CacheList gives the entry's size ({size} bytes)")
    rc = e.stop()
    check(rc == 0, f"disk: kilnd exits 0 on SIGTERM (got {rc})")
    e.start()
    c2 = e.compile(hlo)
    check(src(c2) == "DISK", f"disk: after a restart on the same --cache-dir: DISK "
          f"(got {src(c2)})")
    check(c2.cache_key == c1.cache_key, "disk: same key after the restart")
    check(close(e.execute(c2.executable_id), want), "disk: the disk hit executes right")

    # A file damaged while kilnd was down is refused and rebuilt; a
    # temporary file left by a writer that died is removed at open.
    path = os.path.join(cache_dir, c1.cache_key[:2], c1.cache_key)
    check(os.path.isfile(path), "disk: the entry is the file <dir>/<2 hex>/<key>")
    e.stop()
    if os.path.isfile(path):
        with open(path, "r+b") as fh:
            raw = fh.read()
            fh.seek(0)
            fh.write(flip(raw, len(raw) // 2))
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = os.path.join(cache_dir, c1.cache_key[:2], f".tmp-{dead.pid}-leftover")
    with open(leftover, "wb") as fh:
        fh.write(b"half an entry")
    e.start()
    c3 = e.compile(hlo)
    st = e.stats()
    check(src(c3) == "COMPILED", f"disk: a damaged file is refused and rebuilt (got {src(c3)})")
    check(ctr(st, "kiln_cache_integrity_failures_total", reason="mac") == 1,
          "disk: counted as integrity failure reason mac")
    check(close(e.execute(c3.executable_id), want), "disk: the rebuilt module runs right")
    check(not os.path.exists(leftover), "disk: the dead writer's temporary file is gone")
    if size <= 0:
        return

    # Bounds: room for about 3 entries in memory and 5 on disk.
    mem_bound, disk_bound = int(size * 3.5), int(size * 5.5)
    f = env.kilnd("F", "--cache-memory-bytes", str(mem_bound),
                  "--cache-disk-bytes", str(disk_bound))
    progs = [program() for _ in range(30)]
    failed = []

    def worker(part):
        for hlo_i, want_i in part:
            try:
                c = f.compile(hlo_i)
                if not close(f.execute(c.executable_id), want_i):
                    failed.append("wrong result")
            except Exception as ex:  # noqa: BLE001
                failed.append(repr(ex))

    threads = [threading.Thread(target=worker, args=(progs[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RPC_TIMEOUT * 4)
    check(not failed, f"disk: 30 distinct compiles succeed ({failed[:2]})")
    st = f.stats()
    for tier, bound in (("memory", mem_bound), ("disk", disk_bound)):
        held = ctr(st, "kiln_cache_bytes", tier=tier)
        check(0 < held <= bound, f"disk: kiln_cache_bytes{{tier={tier}}} {held} <= {bound}")
        ev = ctr(st, "kiln_cache_evictions_total", tier=tier)
        check(ev > 0, f"disk: kiln_cache_evictions_total{{tier={tier}}} {ev} > 0")
    on_disk = dir_bytes(f.cache_dir)
    check(on_disk <= disk_bound, f"disk: the directory holds {on_disk} <= {disk_bound} bytes")
    n = ctr(st, "kiln_cache_entries", tier="disk")
    check(1 <= n <= 5, f"disk: kiln_cache_entries{{tier=disk}} {n} within the bound")
    # The first modules were evicted from both tiers; they still compile and run.
    c = f.compile(progs[0][0])
    check(close(f.execute(c.executable_id), progs[0][1]),
          f"disk: an evicted module compiles again and runs right ({src(c)})")


SCENARIOS = [("shared", scenario_shared), ("single", scenario_single),
             ("policy", scenario_policy), ("integrity", scenario_integrity),
             ("lock", scenario_lock),
             ("redis_down", scenario_redis_down), ("redis_late", scenario_redis_late),
             ("redis_slow", scenario_redis_slow),
             ("redis_full", scenario_redis_full), ("disk", scenario_disk)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto-dir", required=True)
    ap.add_argument("--kilnd", default=os.environ.get("KILND", ""))
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    opts = ap.parse_args()
    if protoc is None:
        log(f"test_cache_cluster: skipped: {IMPORT_ERROR} (install grpcio and grpcio-tools)")
        return 77
    if not opts.kilnd or not os.access(opts.kilnd, os.X_OK):
        log(f"test_cache_cluster: skipped: kilnd is not built (KILND={opts.kilnd!r})")
        return 77
    if not shutil.which("redis-server"):
        log("test_cache_cluster: skipped: redis-server is not installed")
        return 77

    tmp = tempfile.mkdtemp(prefix="kiln-cache-cluster-")
    load_stubs(opts.proto_dir, os.path.join(tmp, "stubs"))
    only = set(filter(None, opts.only.split(",")))
    t_all = time.time()
    for name, fn in SCENARIOS:
        if only and name not in only:
            continue
        log(f"== {name}")
        env = Env(opts.kilnd, tmp, name)
        n_fail, t0 = len(FAILURES), time.time()
        try:
            fn(env)
        except Exception:  # noqa: BLE001 - a scenario's crash is one failure
            traceback.print_exc()
            FAILURES.append(f"{name}: raised")
        finally:
            if len(FAILURES) > n_fail:
                env.dump_logs()
            env.close()
        log(f"   {name}: {time.time() - t0:.1f} s")
    log(f"test_cache_cluster: {time.time() - t_all:.1f} s")
    if opts.keep:
        log(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILURES:
        log(f"test_cache_cluster: {len(FAILURES)} failed")
        return 1
    log("test_cache_cluster: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
