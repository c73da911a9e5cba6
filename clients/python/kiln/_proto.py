"""The generated gRPC stubs of proto/kiln/v1, as the kiln.v1 subpackage.

An installed package carries them (setup.py generates them at build time).
Run from a source checkout, they are generated on first import with
grpcio-tools into a cache directory keyed by the proto files' digest, which
is then added to the kiln package's search path; nothing is written into the
sources.
"""
import hashlib
import os
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))


def _proto_dir():
    d = os.environ.get("KILN_PROTO_DIR") or os.path.join(_HERE, "..", "..", "..", "proto")
    return os.path.abspath(d)


def _generate():
    src = _proto_dir()
    files = [os.path.join(src, "kiln", "v1", f) for f in ("hlo.proto", "kiln.proto")]
    if not all(os.path.isfile(f) for f in files):
        raise ImportError(f"kiln: the gRPC stubs are not installed and {src} has no "
                          "kiln/v1/*.proto to generate them from (set KILN_PROTO_DIR)")
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise ImportError("kiln: the gRPC stubs are not installed and grpcio-tools is "
                          "missing to generate them") from e
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            h.update(fh.read())
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(tempfile.gettempdir(),
                                                            f"kiln-{os.getuid()}")
    out = os.path.join(base, "kiln-stubs-" + h.hexdigest()[:16])
    if not os.path.isfile(os.path.join(out, "kiln", "v1", "kiln_pb2_grpc.py")):
        tmp = tempfile.mkdtemp(prefix="kiln-stubs-", dir=os.makedirs(base, exist_ok=True) or base)
        os.makedirs(os.path.join(tmp, "kiln", "v1"))
        args = ["protoc", f"-I{src}", f"--python_out={tmp}", f"--grpc_python_out={tmp}"]
        if protoc.main(args + files) != 0:
            raise ImportError("kiln: grpc_tools.protoc failed on " + src)
        open(os.path.join(tmp, "kiln", "v1", "__init__.py"), "w").close()
        try:
            os.rename(tmp, out)
        except OSError:  # another process won the race
            pass
    return os.path.join(out, "kiln")


try:
    from kiln.v1 import hlo_pb2, kiln_pb2, kiln_pb2_grpc  # noqa: F401
except ImportError:
    import kiln as _pkg

    _pkg.__path__.append(_generate())
    sys.modules.pop("kiln.v1", None)
    from kiln.v1 import hlo_pb2, kiln_pb2, kiln_pb2_grpc  # noqa: F401
