"""kiln.connect(tls=..., token=...) against a kilnd of its own with TLS and
bearer tokens (a CA and a server certificate made by openssl here): a good
token over TLS is served, a missing or wrong one raises the client's
UNAUTHENTICATED error, a client without the CA cannot connect, and a bad tls
argument is refused before anything is sent."""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import kiln
import kiln.numpy as jnp
from kiln import errors

from conftest import _kilnd

# Backend-independent (this module starts a kilnd of its own): ctest runs the
# suite once per backend, and this module only in the interp run.
pytestmark = pytest.mark.skipif(os.environ.get("KILN_TEST_BACKEND", "interp") != "interp",
                                reason="backend-independent: runs in the interp run")


def _sh(cmd, cwd):
    subprocess.run(cmd, cwd=cwd, shell=True, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    k = _kilnd()
    if k is None or shutil.which("openssl") is None:
        pytest.skip("needs kilnd and openssl")
    d = tmp_path_factory.mktemp("secure")
    _sh("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca "
        "-keyout ca.key -out ca.crt", d)
    with open(d / "srv.ext", "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _sh("openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout srv.key -out srv.csr", d)
    _sh("openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile srv.ext -out srv.crt", d)
    digest = hashlib.sha256(b"tok-py").hexdigest()
    with open(d / "tokens", "w") as f:
        f.write(f"sha256:{digest} pyuser user\n")
    p = subprocess.Popen([k, "--listen", "127.0.0.1:0", "--metrics-listen", "off",
                          "--tls-cert", str(d / "srv.crt"), "--tls-key", str(d / "srv.key"),
                          "--tokens", str(d / "tokens")],
                         stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    port = None
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("kilnd: listening on "):
            port = line.split()[-1].rsplit(":", 1)[1]
            break
    if port is None:
        p.kill()
        pytest.fail("kilnd did not print its address")
    yield {"addr": f"localhost:{port}", "ca": str(d / "ca.crt")}
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()


@pytest.fixture()
def restore(server):
    yield
    kiln.connect(server)  # the session's default connection again


def test_token_over_tls_is_served(secure, restore):
    kiln.connect(secure["addr"], token="tok-py", tls=secure["ca"], timeout=60)
    f = kiln.jit(lambda x: jnp.sum(x * 2.0))
    assert float(f(np.arange(4, dtype=np.float32))) == 12.0
    kiln.connect(secure["addr"], token="tok-py", tls={"ca": secure["ca"]}, timeout=60)
    assert float(f(np.ones(3, dtype=np.float32))) == 6.0


def test_missing_or_wrong_token_refused(secure, restore):
    f = kiln.jit(lambda x: x + 1.0)
    for token in (None, "tok-wrong"):
        os.environ.pop("KILN_TOKEN", None)
        kiln.connect(secure["addr"], token=token, tls=secure["ca"], timeout=60)
        with pytest.raises(errors.UnauthenticatedError):
            f(np.ones(2, dtype=np.float32))


def test_without_the_ca_no_connection(secure, restore):
    with pytest.raises(errors.KilnError):
        kiln.connect(secure["addr"], token="tok-py", tls=True, timeout=5)


def test_bad_tls_arguments(secure, restore):
    with pytest.raises(ValueError, match="cannot read the CA file"):
        kiln.connect(secure["addr"], tls="/nonexistent/ca.pem")
    with pytest.raises(ValueError, match="unknown keys"):
        kiln.connect(secure["addr"], tls={"root": secure["ca"]})
    with pytest.raises(ValueError, match="both cert and key"):
        kiln.connect(secure["addr"], tls={"ca": secure["ca"], "cert": secure["ca"]})
    with pytest.raises(TypeError, match="tls is True"):
        kiln.connect(secure["addr"], tls=3)
