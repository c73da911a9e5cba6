"""Robustness: clients that die, servers that restart or stop answering.

Each test starts its own kilnd (so the counts it reads are its own) and
talks to it through a private kiln Connection or a child process, leaving
the session's default connection alone.
"""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import kiln
from kiln._client import Connection

from conftest import ROOT, _kilnd

CLIENT = os.path.join(ROOT, "clients", "python")


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _start(port, extra=()):
    backend = os.environ.get("KILN_TEST_BACKEND", "interp")
    p = subprocess.Popen([_kilnd(), "--listen", f"127.0.0.1:{port}", "--metrics-listen", "off",
                          "--default-backend", backend, *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("kilnd: listening on "):
            return p, line.split()[-1]
    p.kill()
    pytest.fail("kilnd did not start")


def _stop(p):
    if p.poll() is None:
        p.kill()
    p.wait(timeout=30)


@pytest.fixture
def private_kilnd():
    procs = []

    def start(port=None, extra=()):
        p, addr = _start(port or _free_port(), extra)
        procs.append(p)
        return p, addr

    yield start
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
        _stop(p)


def _live(addr):
    c = Connection(addr, timeout=10)
    try:
        return c.stats().live_buffers
    finally:
        c.closed = True  # owns nothing; just close the channel
        c.channel.close()


TRAIN = textwrap.dedent("""
    import sys, time, numpy as np
    import kiln, kiln.numpy as jnp
    kiln.connect(sys.argv[1])
    w = kiln.device_put(np.zeros((16, 4), np.float32))
    x = kiln.device_put(np.ones((8, 16), np.float32))
    step = kiln.jit(kiln.value_and_grad(lambda w, x: jnp.mean((x @ w - 1.0) ** 2)))
    for i in range(3):
        v, g = step(w, x)
        w = w - 0.1 * g
    keep = [kiln.device_put(np.full(3, i, np.float32)) for i in range(4)]
    kiln.connection().flush_releases()  # what it dropped is gone before it counts
    print("ready", flush=True)
    if sys.argv[2] == "hang":
        time.sleep(600)
""")


def _run_client(addr, mode):
    env = dict(os.environ, PYTHONPATH=CLIENT)
    return subprocess.Popen([sys.executable, "-c", TRAIN, addr, mode], stdout=subprocess.PIPE,
                            env=env, text=True)


def test_client_that_exits_leaves_no_buffers(private_kilnd):
    _, addr = private_kilnd()
    assert _live(addr) == 0
    c = _run_client(addr, "exit")
    assert c.stdout.readline().strip() == "ready"
    assert c.wait(timeout=120) == 0
    assert _live(addr) == 0  # close() at exit released every array it still held


LEASE = 1.5  # seconds: short, so that the tests below wait for it


def _live_after(addr, want, wait):
    deadline = time.time() + wait
    while True:
        n = _live(addr)
        if n == want or time.time() > deadline:
            return n
        time.sleep(0.2)


def test_killed_client_buffers_expire_with_the_lease(private_kilnd):
    """A client SIGKILLed mid-training cannot release anything: its buffers
    go when its lease runs out (--buffer-lease-seconds), while another
    client's, kept alive by its connection's renewals, stay."""
    _, addr = private_kilnd(extra=("--buffer-lease-seconds", str(LEASE)))
    other = Connection(addr, timeout=20)
    assert other.lease == LEASE
    mine = other.put(np.arange(4, dtype=np.float32))
    c = _run_client(addr, "hang")
    assert c.stdout.readline().strip() == "ready"
    held = _live(addr)
    assert held >= 6  # w, x and the four kept arrays, at least, and mine
    time.sleep(2 * LEASE)  # the child is alive and idle: its renewals keep them
    assert _live(addr) == held
    c.send_signal(signal.SIGKILL)
    c.wait(timeout=30)
    assert _live_after(addr, 1, LEASE + 5) == 1  # only mine is left
    np.testing.assert_array_equal(other.get(mine.handle), np.arange(4, dtype=np.float32))
    other.close()
    assert _live(addr) == 0


def test_lease_off_keeps_buffers(private_kilnd):
    """--buffer-lease-seconds 0: buffers live until released, as before."""
    _, addr = private_kilnd(extra=("--buffer-lease-seconds", "0"))
    c = _run_client(addr, "hang")
    assert c.stdout.readline().strip() == "ready"
    held = _live(addr)
    c.send_signal(signal.SIGKILL)
    c.wait(timeout=30)
    time.sleep(1.5)
    assert _live(addr) == held


def test_client_that_stops_renewing_loses_its_buffers(private_kilnd):
    """The lease is the server's: a connection whose renewals stop (here its
    keeper thread is stopped by hand) finds its handles gone, with a clear
    NotFoundError rather than someone else's data."""
    _, addr = private_kilnd(extra=("--buffer-lease-seconds", str(LEASE)))
    conn = Connection(addr, timeout=20)
    a = conn.put(np.ones(3, np.float32))
    conn._stop.set()
    assert _live_after(addr, 0, LEASE + 5) == 0
    with pytest.raises(kiln.errors.NotFoundError):
        conn.get(a.handle)
    conn.close()


def test_restart_mid_training_raises_clearly(private_kilnd):
    port = _free_port()
    p, addr = private_kilnd(port)
    conn = Connection(addr, timeout=20)
    a = conn.put(np.arange(6, dtype=np.float32))
    exe = conn.compile("HloModule m\n\nENTRY main {\n  p = f32[6] parameter(0)\n"
                       "  ROOT t = (f32[6]) tuple(p)\n}\n")
    conn.execute(exe.executable_id, [a], nout=1)
    _stop(p)  # the server dies
    t0 = time.time()
    with pytest.raises(kiln.errors.UnavailableError):
        conn.execute(exe.executable_id, [a], nout=1)
    with pytest.raises(kiln.errors.UnavailableError):
        conn.get(a.handle)
    assert time.time() - t0 < 30
    # it comes back on the same port: the old handles are gone, with a clear error
    private_kilnd(port)
    deadline = time.time() + 30
    while True:
        try:
            conn.stats()
            break
        except kiln.errors.UnavailableError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)
    with pytest.raises(kiln.errors.NotFoundError):
        conn.get(a.handle)
    with pytest.raises(kiln.errors.KilnError):
        conn.execute(exe.executable_id, [a], nout=1)  # the executable is gone too
    b = conn.put(np.ones(2, np.float32))  # and the connection works again
    np.testing.assert_array_equal(conn.get(b.handle), np.ones(2, np.float32))
    conn.close()


LOOP = textwrap.dedent("""
    import sys, numpy as np
    import kiln, kiln.numpy as jnp
    kiln.connect(sys.argv[1], timeout=20)
    loss = lambda w, x: jnp.mean((x @ w - 1.0) ** 2)

    @kiln.jit
    def step(w, x):
        v, g = kiln.value_and_grad(loss)(w, x)
        return w - 0.1 * g, v

    w = kiln.device_put(np.zeros((16, 4), np.float32))
    x = np.ones((8, 16), np.float32)
    for i in range(100000):
        w, v = step(w, x)
        print("step", float(v), flush=True)
""")


def test_restart_mid_training_loop_fails_clearly(private_kilnd):
    """A training loop whose kilnd dies mid-run ends with UnavailableError
    (after the retries of idempotent calls), not a hang, and exits."""
    p, addr = private_kilnd()
    env = dict(os.environ, PYTHONPATH=CLIENT)
    c = subprocess.Popen([sys.executable, "-c", LOOP, addr], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, text=True)
    for _ in range(3):
        assert c.stdout.readline().startswith("step")
    _stop(p)
    t0 = time.time()
    try:
        _, err = c.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        c.kill()
        pytest.fail("the client hung after kilnd died")
    assert c.returncode != 0
    assert "UnavailableError" in err, err[-2000:]
    assert time.time() - t0 < 60


def _wait_stopped(pid):
    deadline = time.time() + 10
    while time.time() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.05)
    pytest.fail("kilnd did not stop")


def test_server_that_stops_answering_times_out(private_kilnd):
    p, addr = private_kilnd()
    conn = Connection(addr, timeout=2)
    a = conn.put(np.arange(3, dtype=np.float32))
    os.kill(p.pid, signal.SIGSTOP)
    try:
        _wait_stopped(p.pid)
        t0 = time.time()
        with pytest.raises(kiln.errors.DeadlineExceededError):
            conn.get(a.handle)
        assert time.time() - t0 < 15
    finally:
        os.kill(p.pid, signal.SIGCONT)
    # Resumed, the server answers again: with a deadline that a loaded
    # machine (CI runs two suites at once) leaves room for; 2 s was the
    # deadline under test, not a bound on how soon a resumed process runs.
    conn.timeout = 30
    np.testing.assert_array_equal(conn.get(a.handle), np.arange(3, dtype=np.float32))
    conn.close()
