"""Builds the kiln package: the gRPC stubs of proto/kiln/v1 are generated into
kiln/v1/ of the build tree (never into the sources) by grpcio-tools.

The proto directory is the repository's proto/ (two levels up), or
$KILN_PROTO_DIR.
"""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def proto_dir():
    d = os.environ.get("KILN_PROTO_DIR") or os.path.join(HERE, "..", "..", "proto")
    if not os.path.isfile(os.path.join(d, "kiln", "v1", "kiln.proto")):
        raise RuntimeError(f"kiln: no proto/kiln/v1/kiln.proto under {d!r} (set KILN_PROTO_DIR)")
    return os.path.abspath(d)


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        from grpc_tools import protoc  # build requirement

        out = os.path.abspath(self.build_lib)
        os.makedirs(os.path.join(out, "kiln", "v1"), exist_ok=True)
        src = proto_dir()
        files = [os.path.join(src, "kiln", "v1", f) for f in ("hlo.proto", "kiln.proto")]
        args = ["protoc", f"-I{src}", f"--python_out={out}", f"--grpc_python_out={out}"]
        if protoc.main(args + files) != 0:
            raise RuntimeError("kiln: grpc_tools.protoc failed")
        init = os.path.join(out, "kiln", "v1", "__init__.py")
        if not os.path.exists(init):
            open(init, "w").close()


setup(cmdclass={"build_py": BuildWithStubs})
