"""Starts one kilnd for the session (KILND, else build/server/kilnd of the
checkout) on a free loopback port and connects kiln to it; skips everything
when there is no kilnd."""
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _kilnd():
    k = os.environ.get("KILND") or os.path.join(ROOT, "build", "server", "kilnd")
    return k if os.access(k, os.X_OK) else None


@pytest.fixture(scope="session")
def server():
    k = _kilnd()
    if k is None:
        pytest.skip("kilnd is not built (set KILND)")
    backend = os.environ.get("KILN_TEST_BACKEND", "interp")
    p = subprocess.Popen([k, "--listen", "127.0.0.1:0", "--metrics-listen", "off",
                          "--default-backend", backend],
                         stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    addr = None
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("kilnd: listening on "):
            addr = line.split()[-1]
            break
    if addr is None:
        p.kill()
        pytest.fail("kilnd did not print its address")
    import kiln

    kiln.connect(addr)
    yield addr
    kiln.connection().close()
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()


@pytest.fixture(autouse=True)
def _connected(server):
    return server
