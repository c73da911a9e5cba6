"""The connection to kilnd and the arrays that live on it.

An Array is a handle to a server-resident buffer: uploaded with PutBuffer
(a header, then the bytes in chunks), fetched with GetBuffer, produced by
Execute with keep_on_server. Dropping the last Python reference releases the
buffer: handles are queued by __del__ (which must not block or raise) and
sent in one ReleaseBuffers before the next call once RELEASE_BATCH handles
or RELEASE_BYTES bytes are waiting (so a training loop does not pay a round
trip per step for them), on delete(), or at exit. The connection
also remembers every handle it still owns, and close() (also run at exit)
releases them all, so a client that ends normally leaves nothing on the
server. (A client that is killed cannot; the lease below covers it.)

Nothing a client owns outlives it on the server: kilnd releases the
buffers of a client that made no call for --buffer-lease-seconds (600 s by
default; Stats reports it as kiln_buffer_lease_ms), and every call renews the
lease. A connection names itself with a kiln-client identity of its own
(python-HOST-PID-RANDOM, or $KILN_CLIENT), so one process's calls never keep
another's buffers alive, and while it is open a daemon thread makes a call
(a ReleaseBuffers, carrying whatever is pending) whenever a quarter of the
lease passed without one, so an idle or long-blocked client keeps its arrays.
A client that is killed stops renewing and loses them one lease later.

A training step costs one round trip in steady state: Execute carries the
handles waiting to be released (release_handles) and scalar outputs come
back inline in its response (an Array holding its value, with no server
buffer, sent back as a literal when passed to another call), so neither
releases nor fetching the loss needs a call of its own.

Every call has a deadline (connect(timeout=...), KILN_TIMEOUT, default 600 s),
so a server that stops answering raises DeadlineExceededError rather than
hanging, and one that is gone raises UnavailableError once the idempotent
calls' retries are spent.

Executables are cached per connection by (module text, transforms): a
second call with the same program costs no Compile, and the server's own
cache makes another process's first Compile of it a hit.
"""
import atexit
import os
import re
import secrets
import socket
import threading
import time

import grpc
import numpy as np

from . import _dtypes
from ._core import ArrayOps, shape_str
from ._proto import hlo_pb2, kiln_pb2, kiln_pb2_grpc
from .errors import UnavailableError, UnimplementedError, from_rpc_error

CHUNK = 1 << 20
_conn = None
_conn_lock = threading.Lock()
_IDEMPOTENT_RETRIES = 3
RELEASE_BATCH = 64
RELEASE_BYTES = 16 << 20
INLINE_MAX_ELEMENTS = 1  # outputs this small come back in the Execute response
LITERAL_MAX_BYTES = 64 << 10  # a client-held array larger than this is uploaded once


def _identity():
    """A kiln-client name for this connection: $KILN_CLIENT, else one unique
    to the process (buffers and their lease belong to the name)."""
    name = os.environ.get("KILN_CLIENT")
    if not name:
        host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:48] or "host"
        name = f"python-{host}-{os.getpid()}-{secrets.token_hex(4)}"
    return name


class Device:
    def __init__(self, index, backend, description):
        self.id, self.platform, self.device_kind = index, backend, description

    def __repr__(self):
        return f"KilnDevice(id={self.id}, platform={self.platform!r}, kind={self.device_kind!r})"


def _read(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"kiln.connect: cannot read the {what} {path!r}: {e.strerror}") from None


def _tls_credentials(tls):
    """tls=True (the system's CA certificates), a path to a PEM file of CA
    certificates, a dict {"ca": path, "cert": path, "key": path} (mutual
    TLS; each optional), or grpc.ChannelCredentials as they are."""
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, (str, os.PathLike)):
        return grpc.ssl_channel_credentials(root_certificates=_read(tls, "CA file"))
    if isinstance(tls, dict):
        unknown = set(tls) - {"ca", "cert", "key"}
        if unknown:
            raise ValueError(f"kiln.connect: tls has unknown keys {sorted(unknown)} "
                             "(ca, cert, key)")
        if ("cert" in tls) != ("key" in tls):
            raise ValueError("kiln.connect: tls needs both cert and key for mutual TLS")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(tls["ca"], "CA file") if "ca" in tls else None,
            private_key=_read(tls["key"], "key file") if "key" in tls else None,
            certificate_chain=_read(tls["cert"], "certificate file") if "cert" in tls else None)
    raise TypeError("kiln.connect: tls is True, a CA file path, a dict of ca/cert/key paths "
                    f"or grpc.ChannelCredentials, not {type(tls).__name__}")


class CompileProgress:
    """One progress message of a compile (kiln.v1.CompileProgress): phase
    ("queued", "loading", "waiting", "passes", "cc", "storing", "done"),
    elapsed seconds since the server got the request, detail (who is
    building, when waiting) and, on the last one, result (the
    CompileResponse)."""

    __slots__ = ("phase", "elapsed", "detail", "result")

    def __init__(self, msg):
        name = kiln_pb2.CompilePhase.Name(msg.phase)
        self.phase = name[len("COMPILE_PHASE_"):].lower()
        self.elapsed = msg.elapsed_ns / 1e9
        self.detail = msg.detail
        self.result = msg.result if msg.HasField("result") else None

    def __repr__(self):
        d = f", detail={self.detail!r}" if self.detail else ""
        return f"CompileProgress({self.phase!r}, elapsed={self.elapsed:.3f}{d})"


class Connection:
    """One channel to kilnd."""

    def __init__(self, address, token=None, tls=None, timeout=600.0):
        self.address = address
        opts = [("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20)]
        if tls:
            self.channel = grpc.secure_channel(address, _tls_credentials(tls), options=opts)
        else:
            self.channel = grpc.insecure_channel(address, options=opts)
        self.stub = kiln_pb2_grpc.KilnStub(self.channel)
        self.identity = _identity()
        self.metadata = [("kiln-client", self.identity)]
        if token:
            self.metadata.append(("authorization", f"Bearer {token}"))
        self.timeout = timeout
        self._executables = {}
        self._pending_release = []
        self._owned = set()  # handles of this connection's arrays not yet released
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self.closed = False
        self.rpc_count = 0
        self._last_call = time.monotonic()
        self._stop = threading.Event()
        self._keeper = None
        self.lease = None  # seconds, from the server; None: no lease
        try:
            # the connection itself waits no longer than a call may
            grpc.channel_ready_future(self.channel).result(timeout=min(30.0, timeout))
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise UnavailableError(f"kiln.connect: no kilnd answering at {address}")
        self._start_keeper()

    # ---- the lease ----
    def _start_keeper(self):
        ms = None
        try:
            st = self.stats()
            ms = next((c.value for c in st.counters if c.name == "kiln_buffer_lease_ms"), None)
        except Exception:
            pass  # a user token may not call Stats: renew at the default lease's pace
        if ms is not None and ms <= 0:
            return  # the server keeps buffers until released
        self.lease = ms / 1000.0 if ms else None
        self._keeper = threading.Thread(target=self._keep, name="kiln-lease", daemon=True)
        self._keeper.start()

    def _keep(self):
        every = max(0.05, self.lease / 4) if self.lease else 60.0
        while not self._stop.wait(every / 2):
            if time.monotonic() - self._last_call >= every:
                self.flush_releases(renew=True)

    # ---- calls ----
    def _maybe_flush(self):
        if (len(self._pending_release) >= RELEASE_BATCH
                or self._pending_bytes >= RELEASE_BYTES):
            self.flush_releases()

    def _call(self, what, fn, *args, idempotent=False, flush=True, **kw):
        if flush:
            self._maybe_flush()
        delay = 0.1
        for attempt in range(_IDEMPOTENT_RETRIES + 1):
            try:
                self.rpc_count += 1
                self._last_call = time.monotonic()
                return fn(*args, metadata=self.metadata, timeout=self.timeout, **kw)
            except grpc.RpcError as e:
                if (idempotent and e.code() == grpc.StatusCode.UNAVAILABLE
                        and attempt < _IDEMPOTENT_RETRIES):
                    time.sleep(delay)
                    delay *= 4
                    continue
                raise from_rpc_error(e, f"kiln: {what}") from None

    def stats(self):
        return self._call("Stats", self.stub.Stats, kiln_pb2.StatsRequest(), idempotent=True)

    def devices(self):
        st = self.stats()
        return [Device(d.device, d.backend, d.description) for d in st.devices]

    def compile(self, hlo_text, transforms=(), progress=None):
        """The CompileResponse of hlo_text with transforms (cached per
        connection). With progress, a callable, the compile goes through
        CompileStream and progress gets a CompileProgress per phase the
        server reports, the last one with phase "done" (also on a hit of
        the connection's cache, where the server's own cache answers)."""
        key = (hlo_text, tuple(t.SerializeToString(deterministic=True) for t in transforms))
        hit = self._executables.get(key)
        if hit is not None and progress is None:
            return hit
        opts = kiln_pb2.CompileOptions()
        for t in transforms:
            opts.transforms.add().CopyFrom(t)
        req = kiln_pb2.CompileRequest(hlo_text=hlo_text, options=opts)
        if progress is None:
            resp = self._call("Compile", self.stub.Compile, req, idempotent=True)
        else:
            resp = self._compile_stream(req, progress)
        self._executables[key] = resp
        return resp

    def register_kernel(self, name, source, signature, cuda_source=""):
        """Registers C source as user kernel `name` (RegisterKernel; the
        server needs --allow-user-kernels, and an admin token when tokens
        are on). Programs call it with kiln.lax.user_kernel. Returns the
        RegisterKernelResponse (digest, cached, cuda_check). This
        connection's memo of compiled programs is dropped: a program calling
        the kernel compiles again against the new source."""
        req = kiln_pb2.RegisterKernelRequest(name=name, source=source, signature=signature,
                                             cuda_source=cuda_source or "")
        resp = self._call("RegisterKernel", self.stub.RegisterKernel, req)
        self._executables.clear()
        return resp

    def _compile_stream(self, req, progress):
        stream = self._call("CompileStream", self.stub.CompileStream, req)
        result = None
        try:
            for msg in stream:
                ev = CompileProgress(msg)
                if msg.HasField("result"):
                    result = msg.result
                progress(ev)
        except grpc.RpcError as e:
            raise from_rpc_error(e, "kiln: CompileStream") from None
        except BaseException:
            stream.cancel()  # the callback raised: the compile is abandoned
            raise
        if result is None:
            raise UnavailableError("kiln: CompileStream ended without a result")
        return result

    def execute(self, executable_id, args, donate=(), nout=None, inline=None):
        """Runs with args (Arrays or numpy arrays). With nout, every output
        stays on the server and comes back as an Array, except those marked
        in inline (a list of nout bools), which come back in the response as
        Arrays holding their value. The handles waiting to be released go
        with the request."""
        req = kiln_pb2.ExecuteRequest(executable_id=executable_id)
        for i, a in enumerate(args):
            arg = req.arguments.add()
            if isinstance(a, Array) and a.handle is None and a.nbytes > LITERAL_MAX_BYTES:
                a._upload()
            if isinstance(a, Array) and a.handle is not None:
                a._check_live()
                arg.buffer_handle = a.handle
                if i in donate:
                    arg.donate = True
            else:
                arg.literal.CopyFrom(literal_of(np.asarray(a)))
        if nout is not None:
            req.keep_on_server.extend(
                [not (inline and inline[k]) for k in range(nout)])
        with self._lock:
            released, self._pending_release = self._pending_release, []
            self._pending_bytes = 0
        req.release_handles.extend(released)
        try:
            resp = self._call("Execute", self.stub.Execute, req, flush=False)
        except UnavailableError:
            with self._lock:  # it never arrived: the handles are still to release
                self._pending_release.extend(released)
            raise
        for i in donate:
            if isinstance(args[i], Array) and args[i].handle is not None:
                args[i]._donated()
        outs = []
        for o in resp.outputs:
            if o.WhichOneof("value") == "buffer":
                outs.append(Array._from_info(self, o.buffer))
            elif nout is not None:
                outs.append(Array._from_value(self, array_of(o.literal)))
            else:
                outs.append(array_of(o.literal))
        return outs

    def transformed_text(self, hlo_text, transforms):
        """The module text of hlo_text after the server applied transforms
        (compiled on the interpreter, the cheapest backend, for its dump);
        cached per connection."""
        key = ("text", hlo_text,
               tuple(t.SerializeToString(deterministic=True) for t in transforms))
        hit = self._executables.get(key)
        if hit is not None:
            return hit
        opts = kiln_pb2.CompileOptions(backend="interp", dump_after_passes=["transforms"])
        for t in transforms:
            opts.transforms.add().CopyFrom(t)
        req = kiln_pb2.CompileRequest(hlo_text=hlo_text, options=opts)
        resp = self._call("Compile", self.stub.Compile, req, idempotent=True)
        text = next((d.hlo_text for d in resp.dumps if getattr(d, "pass") == "transforms"),
                    None)
        if text is None:
            raise UnimplementedError("kiln: this kilnd does not return the transformed module "
                                     "(dump_after_passes ['transforms']); apply transforms to "
                                     "the outermost function instead")
        self._executables[key] = text
        return text

    def put(self, a, device=0, label=""):
        a = np.asarray(a, order="C")
        dt = _dtypes.canonical(a.dtype)
        a = a.astype(dt, copy=False)
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()

        def chunks():
            head = kiln_pb2.PutBufferChunk()
            head.header.shape.CopyFrom(shape_proto(a.shape, dt))
            head.header.device = device
            head.header.label = label
            yield head
            for off in range(0, len(raw), CHUNK):
                yield kiln_pb2.PutBufferChunk(data=raw[off:off + CHUNK])

        resp = self._call("PutBuffer", self.stub.PutBuffer, chunks())
        return Array._from_info(self, resp.buffer)

    def get(self, handle):
        self._maybe_flush()
        parts, info = [], None
        try:
            self.rpc_count += 1
            self._last_call = time.monotonic()
            for ch in self.stub.GetBuffer(kiln_pb2.GetBufferRequest(handle=handle),
                                          metadata=self.metadata, timeout=self.timeout):
                if ch.HasField("info"):
                    info = ch.info
                if ch.data:
                    parts.append(ch.data)
        except grpc.RpcError as e:
            raise from_rpc_error(e, "kiln: GetBuffer") from None
        dt = _dtypes.FROM_WIRE[hlo_pb2.ElementType.Name(info.shape.element_type)[13:]]
        data = b"".join(parts)
        return np.frombuffer(data, dtype=dt.newbyteorder("<")).astype(dt).reshape(
            tuple(info.shape.dimensions))

    def adopt(self, handle):
        with self._lock:
            self._owned.add(handle)

    def forget(self, handle):
        """handle is no longer this connection's to release (donated)."""
        with self._lock:
            self._owned.discard(handle)

    def release_later(self, handle, nbytes=0):
        with self._lock:
            self._owned.discard(handle)
            self._pending_release.append(handle)
            self._pending_bytes += nbytes

    def flush_releases(self, renew=False):
        """Sends the handles waiting to be released (with renew, also when
        there are none: the call renews the lease)."""
        with self._lock:
            handles, self._pending_release = self._pending_release, []
            self._pending_bytes = 0
        if (not handles and not renew) or self.closed:
            return
        try:
            self.rpc_count += 1
            self._last_call = time.monotonic()
            self.stub.ReleaseBuffers(kiln_pb2.ReleaseBuffersRequest(handles=handles),
                                     metadata=self.metadata, timeout=min(30.0, self.timeout))
        except grpc.RpcError:
            pass  # the server frees them with the connection anyway

    def close(self):
        """Releases every buffer this connection still owns and closes it."""
        if not self.closed:
            self._stop.set()
            with self._lock:
                self._pending_release.extend(self._owned)
                self._owned.clear()
            self.flush_releases()
            self.closed = True
            self.channel.close()


def shape_proto(shape, dtype):
    s = hlo_pb2.Shape()
    s.element_type = hlo_pb2.ElementType.Value("ELEMENT_TYPE_" + _dtypes.WIRE_NAME[np.dtype(dtype)])
    s.dimensions.extend(int(d) for d in shape)
    return s


def literal_of(a):
    dt = _dtypes.canonical(a.dtype)
    a = np.asarray(a, dtype=dt, order="C")
    lit = hlo_pb2.Literal()
    lit.shape.CopyFrom(shape_proto(a.shape, dt))
    lit.data = a.astype(dt.newbyteorder("<"), copy=False).tobytes()
    return lit


def array_of(lit):
    dt = _dtypes.FROM_WIRE[hlo_pb2.ElementType.Name(lit.shape.element_type)[13:]]
    return np.frombuffer(lit.data, dtype=dt.newbyteorder("<")).astype(dt).reshape(
        tuple(lit.shape.dimensions))


class Array(ArrayOps):
    """An array resident on kilnd."""

    def __init__(self, conn, handle, shape, dtype, size_bytes=0, device=0):
        self._conn, self.handle = conn, handle
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes, self._device = size_bytes, device
        self._deleted = None  # why the handle is no longer valid
        self._value = None

    @classmethod
    def _from_value(cls, conn, value):
        """An array held by the client (a small output that came back
        inline): no server buffer; passed to a call as a literal."""
        value = np.array(value)
        value.setflags(write=False)
        a = cls(conn, None, value.shape, value.dtype, value.nbytes)
        a._value = value
        return a

    def _upload(self):
        """A client-held array becomes a server one (the first time a call
        uses it, when it is too large to travel as a literal every time)."""
        self._check_live()
        up = self._conn.put(self._value)
        self.handle, up.handle = up.handle, None  # this array owns it now
        self._device = up._device

    @classmethod
    def _from_info(cls, conn, info):
        dt = _dtypes.FROM_WIRE[hlo_pb2.ElementType.Name(info.shape.element_type)[13:]]
        conn.adopt(info.handle)
        return cls(conn, info.handle, tuple(info.shape.dimensions), dt, info.size_bytes,
                   info.device)

    def _check_live(self):
        if self._deleted:
            raise RuntimeError(f"kiln: this array was {self._deleted}; it can no longer be used")

    def _donated(self):
        self._deleted = "donated to a computation"
        self._conn.forget(self.handle)

    def delete(self):
        if not self._deleted:
            self._deleted = "deleted"
            if self.handle is not None:
                self._conn.release_later(self.handle)
                self._conn.flush_releases()

    def is_deleted(self):
        return bool(self._deleted)

    def __del__(self):
        try:
            if not self._deleted and self.handle is not None and not self._conn.closed:
                self._conn.release_later(self.handle, self.nbytes)
        except Exception:
            pass

    def block_until_ready(self):
        # Execute answers once the outputs exist.
        self._check_live()
        return self

    def _fetch(self):
        self._check_live()
        if self._value is None:
            self._value = self._conn.get(self.handle)
            self._value.setflags(write=False)
        return self._value

    def __array__(self, dtype=None, copy=None):
        v = self._fetch()
        if dtype is not None:
            return v.astype(dtype)
        return v.copy() if copy else v

    def item(self):
        return self._fetch().item()

    def tolist(self):
        return self._fetch().tolist()

    def __bool__(self): return bool(self._fetch())
    def __int__(self): return int(self._fetch())
    def __float__(self): return float(self._fetch())
    def __index__(self): return int(self._fetch())
    def __complex__(self): return complex(self._fetch())
    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __format__(self, spec):
        return format(self._fetch(), spec) if self.ndim == 0 else str(self)

    def __repr__(self):
        if self._deleted:
            return f"Array(<{self._deleted}>, {shape_str(self.shape, self.dtype)})"
        return f"Array({np.array2string(self._fetch(), separator=', ')}, dtype={self.dtype})"

    def __str__(self):
        return str(self._fetch())

    @property
    def device(self):
        return self._device

    def devices(self):
        return {self._device}


def connect(address=None, *, token=None, tls=None, timeout=None):
    """Connects to kilnd at address (default: $KILN_SERVER, else
    127.0.0.1:50051) and makes it the default connection. token: a bearer
    token (default $KILN_TOKEN). tls: True, a CA file path, or a dict of
    "ca", "cert", "key" paths (see _tls_credentials). timeout: the deadline
    of every call in seconds (default $KILN_TIMEOUT, else 600)."""
    global _conn
    address = address or os.environ.get("KILN_SERVER") or "127.0.0.1:50051"
    token = token if token is not None else os.environ.get("KILN_TOKEN")
    if timeout is None:
        timeout = float(os.environ.get("KILN_TIMEOUT") or 600.0)
    with _conn_lock:
        if _conn is not None:
            _conn.close()
        _conn = Connection(address, token=token, tls=tls, timeout=timeout)
    return _conn


def register_kernel(name, source, signature, cuda_source=None):
    """Registers a C user kernel with the default connection's kilnd
    (Connection.register_kernel; docs/toolbox.md has the ABI)."""
    return connection().register_kernel(name, source, signature, cuda_source or "")


def connection():
    """The default connection, made on first use."""
    if _conn is None or _conn.closed:
        return connect()
    return _conn


@atexit.register
def _close_at_exit():
    if _conn is not None:
        try:
            _conn.close()
        except Exception:
            pass


def devices():
    return connection().devices()


def device_put(x, device=None):
    """x (a pytree of numpy-like values) uploaded to the server."""
    from . import tree_util

    dev = device.id if isinstance(device, Device) else (device or 0)

    def put(v):
        if isinstance(v, Array):
            return v
        from ._core import Tracer

        if isinstance(v, Tracer):
            return v
        return connection().put(np.asarray(v), device=dev)

    return tree_util.tree_map(put, x)


def device_get(x):
    from . import tree_util

    return tree_util.tree_map(lambda v: np.asarray(v) if isinstance(v, Array) else v, x)
