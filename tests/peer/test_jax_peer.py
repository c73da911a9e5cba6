"""JAX as the peer: real JAX programs, exported to HLO text, run by `kiln run`.

Each test defines a JAX function and concrete inputs, exports it with
jax.jit(f).lower(*args).as_text(dialect="hlo"), saves the inputs as .npy,
runs `kiln run FILE --backend interp --arg a0.npy ... --out DIR` and compares
every output leaf (JAX's result pytree flattened, as kiln flattens a tuple
result) with what JAX itself computes: float32 within rtol 1e-5 / atol 1e-6,
integers and booleans exactly.

Every program runs twice: JaxPeerTest on the interpreter, JaxPeerCpuTest on
the CPU backend (`--backend cpu`, compiled to native code), with the same
tolerances. A program whose ops the CPU compiler refuses ("the cpu backend
cannot compile ...", exit 1) is skipped with that reason, not failed.

The kiln binary is $KILN_BIN, else build/kiln under the repository root.
Run directly (python tests/peer/test_jax_peer.py) or through ctest
(jax_peer). Exits 77 (skipped) when jax cannot be imported. Set
KILN_PEER_KEEP=1 to keep each test's directory (module, inputs, outputs).
"""

import os
import subprocess
import sys
import tempfile
import unittest

try:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax import lax
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"jax_peer: skipped, cannot import jax/numpy ({e})")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN_BIN") or os.path.join(ROOT, "build", "kiln")


def _rng(seed):
    return np.random.default_rng(seed)


def mlp_params(rng, din=4, dhidden=8, dout=3):
    w1 = rng.standard_normal((din, dhidden)).astype(np.float32) * 0.5
    b1 = rng.standard_normal((dhidden,)).astype(np.float32) * 0.1
    w2 = rng.standard_normal((dhidden, dout)).astype(np.float32) * 0.5
    b2 = rng.standard_normal((dout,)).astype(np.float32) * 0.1
    return w1, b1, w2, b2


def mlp_forward(w1, b1, w2, b2, x):
    h = jnp.tanh(x @ w1 + b1)
    return h @ w2 + b2


def mse_loss(w1, b1, w2, b2, x, y):
    return jnp.mean((mlp_forward(w1, b1, w2, b2, x) - y) ** 2)


def xent_loss(w1, b1, w2, b2, x, labels):
    logits = mlp_forward(w1, b1, w2, b2, x)
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, labels[:, None], axis=-1)
    return -jnp.mean(picked)


class JaxPeerTest(unittest.TestCase):
    BACKEND = "interp"

    def run_peer(self, name, fn, *args):
        """Exports fn at args, runs it on kiln, compares with JAX."""
        args = [np.asarray(a) for a in args]
        jitted = jax.jit(fn, keep_unused=True)
        hlo = jitted.lower(*args).as_text(dialect="hlo")
        want = [np.asarray(v) for v in jax.tree_util.tree_leaves(jitted(*args))]

        keep = os.environ.get("KILN_PEER_KEEP")
        tmp = tempfile.mkdtemp(prefix=f"kiln_peer_{name}_") if keep else None
        ctx = tempfile.TemporaryDirectory(prefix=f"kiln_peer_{name}_") if not keep else None
        d = tmp or ctx.name
        try:
            module = os.path.join(d, f"{name}.hlo")
            with open(module, "w") as f:
                f.write(hlo)
            cmd = [KILN, "run", module, "--backend", self.BACKEND]
            for i, a in enumerate(args):
                p = os.path.join(d, f"arg{i}.npy")
                # NumPy has no bf16: kiln takes float32 for a bf16 parameter.
                np.save(p, a.astype(np.float32) if a.dtype == jnp.bfloat16 else a)
                cmd += ["--arg", p]
            out = os.path.join(d, "out")
            cmd += ["--out", out]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if (self.BACKEND == "cpu" and proc.returncode == 1
                    and "the cpu backend cannot compile" in proc.stderr):
                self.skipTest("unsupported on cpu: " + proc.stderr.strip().splitlines()[0])
            self.assertEqual(
                proc.returncode, 0,
                f"kiln run failed (exit {proc.returncode}) on {module}:\n{proc.stderr}")
            for i, w in enumerate(want):
                got = np.load(os.path.join(out, f"{i}.npy"))
                self.assertEqual(got.shape, w.shape, f"output {i} shape")
                if w.dtype == jnp.bfloat16:
                    # Written as float32, exactly; allow one bf16 ulp for
                    # differences in accumulation order.
                    self.assertEqual(got.dtype, np.float32, f"output {i} dtype")
                    np.testing.assert_allclose(got, w.astype(np.float32), rtol=2.0**-7,
                                               atol=1e-6, err_msg=f"{name}: output {i}")
                elif np.issubdtype(w.dtype, np.floating):
                    self.assertEqual(got.dtype, w.dtype, f"output {i} dtype")
                    np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6,
                                               err_msg=f"{name}: output {i}")
                else:
                    self.assertEqual(got.dtype, w.dtype, f"output {i} dtype")
                    np.testing.assert_array_equal(got, w, err_msg=f"{name}: output {i}")
            self.assertFalse(os.path.exists(os.path.join(out, f"{len(want)}.npy")),
                             "kiln wrote more outputs than JAX returns")
        finally:
            if ctx:
                ctx.cleanup()

    def test_mlp_mse_loss(self):
        rng = _rng(0)
        x = rng.standard_normal((5, 4)).astype(np.float32)
        y = rng.standard_normal((5, 3)).astype(np.float32)
        self.run_peer("mlp_mse_loss", mse_loss, *mlp_params(rng), x, y)

    def test_mlp_mse_grad(self):
        rng = _rng(1)
        x = rng.standard_normal((5, 4)).astype(np.float32)
        y = rng.standard_normal((5, 3)).astype(np.float32)
        grad = jax.grad(mse_loss, argnums=(0, 1, 2, 3))
        self.run_peer("mlp_mse_grad", grad, *mlp_params(rng), x, y)

    def test_mlp_xent_loss_and_grad(self):
        rng = _rng(2)
        x = rng.standard_normal((6, 4)).astype(np.float32)
        labels = rng.integers(0, 3, size=(6,)).astype(np.int32)
        vg = jax.value_and_grad(xent_loss, argnums=(0, 1, 2, 3))
        self.run_peer("mlp_xent_value_and_grad", vg, *mlp_params(rng), x, labels)

    def test_softmax(self):
        x = _rng(3).standard_normal((4, 10)).astype(np.float32) * 3
        self.run_peer("softmax", lambda v: jax.nn.softmax(v, axis=-1), x)

    def test_fori_loop(self):
        def f(x, s):
            def body(i, carry):
                v, acc = carry
                v = v * 0.9 + jnp.sin(v) * s + i.astype(jnp.float32) * 0.01
                return v, acc + jnp.sum(v)
            return lax.fori_loop(0, 7, body, (x, jnp.float32(0)))
        x = _rng(4).standard_normal((3, 5)).astype(np.float32)
        self.run_peer("fori_loop", f, x, np.float32(0.5))

    def test_cond(self):
        def f(p, x):
            return lax.cond(p > 0, lambda v: jnp.exp(v) * 2.0, lambda v: -jnp.abs(v), x)
        x = _rng(5).standard_normal((6,)).astype(np.float32)
        self.run_peer("cond_true", f, np.float32(1.5), x)
        self.run_peer("cond_false", f, np.float32(-1.0), x)

    def test_take_gather(self):
        table = _rng(6).standard_normal((10, 4)).astype(np.float32)
        idx = np.array([0, 9, 3, 3, 7, 1], dtype=np.int32)
        self.run_peer("take", lambda t, i: jnp.take(t, i, axis=0), table, idx)

    def test_scan(self):
        def f(xs, c0):
            def step(c, x):
                c = jnp.tanh(c * 0.5 + x)
                return c, c * 2.0
            return lax.scan(step, c0, xs)
        xs = _rng(8).standard_normal((6, 3)).astype(np.float32)
        self.run_peer("scan", f, xs, np.zeros(3, np.float32))

    def test_conv2d(self):
        def f(img, k):
            y = lax.conv_general_dilated(img, k, window_strides=(1, 2), padding="SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return jax.nn.relu(y)
        rng = _rng(9)
        img = rng.standard_normal((2, 6, 7, 3)).astype(np.float32)
        k = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)
        self.run_peer("conv2d", f, img, k)

    def test_sort_and_cumsum(self):
        def f(x):
            return jnp.sort(x, axis=-1), jnp.cumsum(x, axis=0), jnp.argsort(x[0]).astype(jnp.int32)
        x = _rng(10).standard_normal((4, 9)).astype(np.float32)
        self.run_peer("sort_cumsum", f, x)

    def test_bf16(self):
        def f(a, b):
            h = jnp.sin(a) * b + a
            return h, jnp.max(h, axis=1)
        rng = _rng(11)
        a = rng.standard_normal((3, 8)).astype(jnp.bfloat16)
        b = rng.standard_normal((3, 8)).astype(jnp.bfloat16)
        self.run_peer("bf16", f, a, b)

    def test_integer_and_bool_outputs(self):
        def f(x, k):
            return jnp.argmax(x, axis=1).astype(jnp.int32) + k, x > 0
        x = _rng(7).standard_normal((5, 6)).astype(np.float32)
        self.run_peer("argmax_compare", f, x, np.int32(3))


class JaxPeerCpuTest(JaxPeerTest):
    """The same programs, compiled for and run on the CPU backend."""
    BACKEND = "cpu"


if __name__ == "__main__":
    if not os.path.exists(KILN):
        print(f"jax_peer: kiln binary not found at {KILN} (set KILN_BIN)", file=sys.stderr)
        sys.exit(1)
    unittest.main(verbosity=2)
