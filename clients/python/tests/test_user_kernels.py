"""User kernels from Python: kiln.register_kernel and kiln.lax.user_kernel
against a kilnd of its own started with --allow-user-kernels (cpu backend):
a jitted program calling a registered C kernel equals numpy, eagerly too;
grad through a custom_vjp whose forward pass calls the kernel is the true
derivative; a kernel registered again changes what the same function
computes; an unregistered kernel, a compile error and a bad name are
errors naming the problem."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import kiln
import kiln.numpy as knp

# Backend-independent (this module starts a kilnd of its own): ctest runs the
# suite once per backend, and this module only in the interp run.
pytestmark = pytest.mark.skipif(os.environ.get("KILN_TEST_BACKEND", "interp") != "interp",
                                reason="backend-independent: runs in the interp run")

FMA = """#include <stdint.h>
void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end) {
  const float *a = bufs[0], *x = bufs[1];
  float *out = bufs[2];
  for (int64_t i = begin; i < end; i++) out[i] = a[i] * x[i] + OFFSET;
}
"""
SQUARE = """#include <stdint.h>
void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end) {
  const float *x = bufs[0];
  float *y = bufs[1];
  for (int64_t i = begin; i < end; i++) y[i] = x[i] * x[i];
}
"""
N = 256
A = np.linspace(-2, 2, N, dtype=np.float32)
X = np.cos(np.arange(N, dtype=np.float32))


@pytest.fixture(scope="module")
def ukern_server(server):
    from conftest import _kilnd

    p = subprocess.Popen([_kilnd(), "--listen", "127.0.0.1:0", "--metrics-listen", "off",
                          "--default-backend", "cpu", "--allow-user-kernels"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    addr = None
    deadline = time.time() + 60
    while addr is None and time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("kilnd: listening on "):
            addr = line.split()[-1]
    if addr is None:
        p.kill()
        pytest.fail("kilnd did not print its address")
    kiln.connect(addr)
    yield addr
    kiln.connect(server)  # the session's server again
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()


def fma(a, x):
    return kiln.lax.user_kernel("fma_py", a, x, out_shapes=((N,), np.float32))


def test_jit_and_eager_equal_numpy(ukern_server):
    r = kiln.register_kernel("fma_py", FMA.replace("OFFSET", "1.0f"), "f32[256], f32[256] -> f32[256]")
    assert len(r.digest) == 64 and not r.cached
    f = kiln.jit(lambda a, x: knp.tanh(fma(a, x)))
    np.testing.assert_allclose(np.asarray(f(A, X)), np.tanh(A * X + 1), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(fma(A, X)), A * X + 1, rtol=1e-6)
    # registered again with other source: the same jitted function follows it
    kiln.register_kernel("fma_py", FMA.replace("OFFSET", "-3.0f"), "f32[256], f32[256] -> f32[256]")
    np.testing.assert_allclose(np.asarray(f(A, X)), np.tanh(A * X - 3), rtol=1e-6, atol=1e-6)


def test_grad_through_custom_vjp(ukern_server):
    kiln.register_kernel("square_py", SQUARE, "f32[256] -> f32[256]")

    def kernel(x):
        return kiln.lax.user_kernel("square_py", x, out_shapes=(x.shape, x.dtype))

    @kiln.custom_vjp
    def square(x):
        return kernel(x)

    def fwd(x):
        return kernel(x), x

    def bwd(x, g):
        return (2 * x * g,)

    square.defvjp(fwd, bwd)
    loss = lambda x: knp.sum(knp.sin(square(x)))  # noqa: E731
    g = kiln.jit(kiln.grad(loss))(X)
    np.testing.assert_allclose(np.asarray(g), 2 * X * np.cos(X * X), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(kiln.jit(loss)(X)), np.sum(np.sin(X * X)), rtol=1e-5)


def test_errors(ukern_server):
    with pytest.raises(kiln.KilnError, match='"nope_py" is not registered'):
        kiln.jit(lambda x: kiln.lax.user_kernel("nope_py", x, out_shapes=((N,), np.float32)))(X)
    with pytest.raises(kiln.KilnError, match="undeclared"):
        kiln.register_kernel("bad_py", SQUARE.replace("x[i] * x[i]", "x[i] * nothing"),
                             "f32[256] -> f32[256]")
    with pytest.raises(ValueError, match="not a kernel name"):
        kiln.lax.user_kernel('a"b', X, out_shapes=((N,), np.float32))
