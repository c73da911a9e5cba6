"""JAX as the peer for Kiln's function transforms.

Each test writes a function in JAX, exports it untransformed with
jax.jit(f).lower(*args).as_text(dialect="hlo"), lets `kiln run FILE
--transform SPEC ...` transform and run it, and compares every output with
what JAX's own transforms compute: jax.grad / jax.value_and_grad, jax.jvp,
jax.vjp, jax.vmap and their compositions (Hessian-vector products, grad of
grad, per-example gradients, Hessians). The MLP's softmax cross-entropy
gradient is also checked against a NumPy implementation of its hand-derived
gradient. float32 results agree within rtol 2e-4 / atol 2e-5 (the two sides
sum in different orders), integers exactly.

Kiln's transformed signatures (compiler/transforms/transform.h):
  grad(f)(p...) -> (value, grads for wrt...)
  jvp(f)(p..., tangents for wrt...) -> (outputs..., output tangents...)
  vjp(f)(p..., cotangents for outputs...) -> (outputs..., cotangents for wrt...)
  vmap(f) -> f's outputs with the batch at out_axes

The kiln binary is $KILN_BIN, else build/kiln under the repository root.
Exits 77 (skipped) when jax cannot be imported. KILN_PEER_KEEP=1 keeps each
test's directory.
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
    print(f"jax_transforms: skipped, cannot import jax/numpy ({e})")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN_BIN") or os.path.join(ROOT, "build", "kiln")

RTOL, ATOL = 2e-4, 2e-5


def _rng(seed):
    return np.random.default_rng(seed)


def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---- the functions ---------------------------------------------------------

def mlp_params(rng, din=4, dhidden=8, dout=3):
    return (_f32(rng, din, dhidden, scale=0.5), _f32(rng, dhidden, scale=0.1),
            _f32(rng, dhidden, dout, scale=0.5), _f32(rng, dout, scale=0.1))


def xent_loss(w1, b1, w2, b2, x, labels):
    h = jnp.tanh(x @ w1 + b1)
    logits = h @ w2 + b2
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, labels[:, None], axis=-1)
    return -jnp.mean(picked)


def xent_grad_numpy(w1, b1, w2, b2, x, labels):
    """The MLP's softmax cross-entropy gradient, derived by hand."""
    x, w1, b1, w2, b2 = (np.asarray(a, np.float64) for a in (x, w1, b1, w2, b2))
    n = x.shape[0]
    a = x @ w1 + b1
    h = np.tanh(a)
    logits = h @ w2 + b2
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    onehot = np.zeros_like(p)
    onehot[np.arange(n), labels] = 1
    dlogits = (p - onehot) / n              # d loss / d logits
    gw2 = h.T @ dlogits
    gb2 = dlogits.sum(axis=0)
    dh = dlogits @ w2.T
    da = dh * (1 - h * h)                   # tanh' = 1 - tanh^2
    gw1 = x.T @ da
    gb1 = da.sum(axis=0)
    loss = -np.mean(np.log(p[np.arange(n), labels]))
    return loss, (gw1, gb1, gw2, gb2)


def chain(x, y):
    return jnp.sum(jnp.log(jnp.exp(jnp.tanh(x) * y) + 1.0) * jnp.sin(x))


def dots(a, b, c):
    return jnp.sum(jnp.tanh(a @ b) @ c)


def reductions(x):
    return jnp.sum(jnp.max(x, axis=0) * jnp.mean(x, axis=1)[:, None]) + jnp.sum(jnp.min(x ** 2, axis=1))


def loop(x, s):
    def body(i, v):
        return v * 0.9 + jnp.sin(v) * s
    return jnp.sum(lax.fori_loop(0, 5, body, x))


def branch(p, x):
    return jnp.sum(lax.cond(p > 0, lambda v: jnp.exp(v) * 2.0, lambda v: jnp.cos(v) * v, x))


def quadratic(x):
    a = jnp.array([[2.0, 1.0, 0.0], [3.0, 4.0, -1.0], [0.5, -2.0, 5.0]], jnp.float32)
    return 0.5 * x @ (a @ x) + jnp.sin(x).sum()


def scalar(x):
    return jnp.sin(x) * x ** 3 + jnp.exp(x / 2)


def argmax_pick(x, w):
    """jnp.argmax's index picks values (no derivative through the index),
    and the same maximum taken as the value of a variadic (value, index)
    reduce."""
    i = jnp.argmax(x, axis=1)
    picked = jnp.take_along_axis(x, i[:, None], axis=1)[:, 0]
    io = lax.broadcasted_iota(jnp.int32, x.shape, 1)

    def sel(a, b):
        (av, ai), (bv, bi) = a, b
        pick = (av > bv) | ((av == bv) & (ai < bi))
        return (jnp.where(pick, av, bv), jnp.where(pick, ai, bi))
    v, _ = lax.reduce((x, io), (np.float32(-np.inf), np.int32(0)), sel, (1,))
    return jnp.sum(picked * w) + jnp.sum(jnp.sin(v))


def argmax_pick_oracle(x, w):
    """argmax_pick without ties, as JAX can differentiate it."""
    return jnp.sum(jnp.max(x, axis=1) * w) + jnp.sum(jnp.sin(jnp.max(x, axis=1)))


def scatter_combiners(x, u):
    return (jnp.sum(x.at[jnp.array([1, 0, 2])].multiply(u, unique_indices=True) ** 2)
            + jnp.sum(x.at[jnp.array([1, 1, 0])].max(u))
            + jnp.sum(jnp.sin(x.at[jnp.array([2, 1, 2])].min(u))))


def dilated_max_pool(x):
    y = lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (1, 1), ((1, 1), (0, 0)),
                          base_dilation=(2, 1), window_dilation=(1, 2))
    return jnp.sum(y ** 2)


def sort_topk(x, v):
    ks, vs = lax.sort((x, v), dimension=1, num_keys=1)
    w = jnp.arange(1.0, 1.0 + x.shape[1], dtype=jnp.float32)
    return jnp.sum(jnp.sort(x, axis=0) * w) + jnp.sum(vs * w) + jnp.sum(jnp.sin(lax.top_k(x, 2)[0]))


def batch_grouped_conv(x, k):
    """A convolution with batch groups, as the kernel gradient of a
    depthwise convolution has them."""
    y = lax.conv_general_dilated(x, k, (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC"),
                                 batch_group_count=2)
    return jnp.sum(jnp.sin(y))


def depthwise_conv(x, k):
    y = lax.conv_general_dilated(x, k, (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC"),
                                 feature_group_count=2)
    return jnp.sum(jnp.sin(y))


def fft_power(x):
    return jnp.sum(jnp.abs(jnp.fft.fft(x)) ** 2)


def fft_kinds(x, y, w):
    z = lax.complex(x, y)
    f = jnp.fft.fft2(z)
    g = jnp.fft.ifft(f * z)
    r = jnp.fft.rfft(x * w, axis=-1)
    i = jnp.fft.irfft(z, n=6, axis=-1)
    return (jnp.sum(jnp.real(g) * w) + jnp.sum(jnp.imag(f) ** 2) + jnp.sum(jnp.abs(r))
            + jnp.sum(i * i))


def complex_parts(x, y):
    z = lax.complex(x, y)
    q = z * jnp.conj(z) + z * z / (z + 2.0)
    return jnp.sum(jnp.real(q) * x) + jnp.sum(jnp.imag(q - z) * y) + jnp.sum(jnp.abs(z * 3.0 - 1.0))


def complex_dot(x, y):
    a, b = lax.complex(x, y), lax.complex(y, -x)
    return jnp.sum(jnp.abs(a @ b.T)) + jnp.real(jnp.sum(a * 2.0 - b))


def fft_complex_out(x, y):
    return jnp.fft.fft(lax.complex(x, y)) * lax.complex(y, x)


def one_device_collectives():
    """Collectives over the one device a shard_map of one device has."""
    try:
        from jax import shard_map
    except ImportError:  # older JAX
        from jax.experimental.shard_map import shard_map
    from jax.sharding import Mesh, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()[:1]), ("i",))

    def body(x):
        a = lax.all_gather(x, "i", axis=1, tiled=True)
        b = lax.psum_scatter(a * 2.0, "i", scatter_dimension=0, tiled=True)
        c = lax.ppermute(jnp.sin(b), "i", perm=[(0, 0)])
        return jnp.tanh(c) * x
    try:
        return shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
    except TypeError:  # older JAX
        return shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(), check_rep=False)


class JaxTransformsTest(unittest.TestCase):
    def kiln(self, name, fn, args, transforms, kiln_args=None):
        """Exports fn at args, runs kiln with the transforms, returns outputs."""
        args = [np.asarray(a) for a in args]
        hlo = jax.jit(fn, keep_unused=True).lower(*args).as_text(dialect="hlo")
        keep = os.environ.get("KILN_PEER_KEEP")
        d = tempfile.mkdtemp(prefix=f"kiln_tx_{name}_") if keep else None
        ctx = None if keep else tempfile.TemporaryDirectory(prefix=f"kiln_tx_{name}_")
        d = d or ctx.name
        try:
            module = os.path.join(d, f"{name}.hlo")
            with open(module, "w") as f:
                f.write(hlo)
            cmd = [KILN, "run", module, "--backend", "interp"]
            for t in transforms:
                cmd += ["--transform", t]
            for i, a in enumerate(kiln_args if kiln_args is not None else args):
                p = os.path.join(d, f"arg{i}.npy")
                np.save(p, np.asarray(a))
                cmd += ["--arg", p]
            out = os.path.join(d, "out")
            cmd += ["--out", out]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            self.assertEqual(proc.returncode, 0,
                             f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr}")
            outs = []
            while os.path.exists(os.path.join(out, f"{len(outs)}.npy")):
                outs.append(np.load(os.path.join(out, f"{len(outs)}.npy")))
            return outs
        finally:
            if ctx:
                ctx.cleanup()

    def same(self, name, got, want):
        want = [np.asarray(w) for w in jax.tree_util.tree_leaves(want)]
        self.assertEqual(len(got), len(want), f"{name}: kiln gave {len(got)} outputs, JAX {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            self.assertEqual(g.shape, w.shape, f"{name}: output {i} shape")
            if np.issubdtype(w.dtype, np.floating) or np.issubdtype(w.dtype, np.complexfloating):
                np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{name}: output {i}")
            else:
                np.testing.assert_array_equal(g, w, err_msg=f"{name}: output {i}")

    # ---- grad ----------------------------------------------------------------

    def test_mlp_xent_grad(self):
        rng = _rng(0)
        params = mlp_params(rng)
        x = _f32(rng, 6, 4)
        labels = rng.integers(0, 3, size=(6,)).astype(np.int32)
        got = self.kiln("xent", xent_loss, (*params, x, labels), ["grad:wrt=0,1,2,3"])
        self.same("xent vs jax.value_and_grad", got,
                  jax.value_and_grad(xent_loss, argnums=(0, 1, 2, 3))(*params, x, labels))
        loss, grads = xent_grad_numpy(*params, x, labels)
        self.same("xent vs numpy", got, (np.float32(loss), tuple(g.astype(np.float32) for g in grads)))

    def test_grad_of_chains(self):
        rng = _rng(1)
        x, y = _f32(rng, 3, 4), _f32(rng, 3, 4)
        got = self.kiln("chain", chain, (x, y), ["grad:wrt=0,1"])
        self.same("chain", got, jax.value_and_grad(chain, argnums=(0, 1))(x, y))
        a, b, c = _f32(rng, 2, 3), _f32(rng, 3, 4), _f32(rng, 4, 2)
        got = self.kiln("dots", dots, (a, b, c), ["grad:wrt=0,1,2"])
        self.same("dots", got, jax.value_and_grad(dots, argnums=(0, 1, 2))(a, b, c))
        r = _f32(rng, 4, 5)
        got = self.kiln("reductions", reductions, (r,), ["grad"])
        self.same("reductions", got, jax.value_and_grad(reductions)(r))

    def test_grad_through_control_flow(self):
        rng = _rng(2)
        x = _f32(rng, 3, 2)
        s = np.float32(0.7)
        got = self.kiln("loop", loop, (x, s), ["grad:wrt=0,1"])
        self.same("fori_loop", got, jax.value_and_grad(loop, argnums=(0, 1))(x, s))
        for p in (np.float32(1.0), np.float32(-1.0)):
            got = self.kiln("cond", branch, (p, x), ["grad:wrt=1"])
            self.same(f"cond p={p}", got, jax.value_and_grad(branch, argnums=1)(p, x))

    def test_grad_of_general_reductions_sorts_and_scatters(self):
        rng = _rng(7)
        x, w = _f32(rng, 3, 5), _f32(rng, 3)
        got = self.kiln("argmax", argmax_pick, (x, w), ["grad:wrt=0,1"])
        # JAX cannot differentiate a variadic reduce with an integer operand:
        # the same function written with jnp.max is the oracle
        self.same("argmax pick", got, jax.value_and_grad(argmax_pick_oracle, argnums=(0, 1))(x, w))
        x, u = _f32(rng, 3, 5), _f32(rng, 3, 5)
        got = self.kiln("scatter_comb", scatter_combiners, (x, u), ["grad:wrt=0,1"])
        self.same("scatter mul/max/min", got, jax.value_and_grad(scatter_combiners, argnums=(0, 1))(x, u))
        got = self.kiln("sort_topk", sort_topk, (x, u), ["grad:wrt=0,1"])
        self.same("sort and top_k", got, jax.value_and_grad(sort_topk, argnums=(0, 1))(x, u))
        tx, tu = _f32(rng, 3, 5), _f32(rng, 3, 5)
        got = self.kiln("sort_topk_jvp", sort_topk, (x, u), ["jvp"], kiln_args=(x, u, tx, tu))
        self.same("jvp sort and top_k", got, jax.jvp(sort_topk, (x, u), (tx, tu)))
        # JAX has no VJP for a dilated max window; its forward mode is the oracle
        got = self.kiln("dilated_pool", dilated_max_pool, (x,), ["grad"])
        self.same("dilated max window", got, (dilated_max_pool(x), jax.jacfwd(dilated_max_pool)(x)))

    # ---- jvp and vjp -----------------------------------------------------------

    def test_jvp(self):
        rng = _rng(3)
        x, y = _f32(rng, 3, 4), _f32(rng, 3, 4)
        tx, ty = _f32(rng, 3, 4), _f32(rng, 3, 4)
        got = self.kiln("jvp_chain", chain, (x, y), ["jvp"], kiln_args=(x, y, tx, ty))
        self.same("jvp chain", got, jax.jvp(chain, (x, y), (tx, ty)))
        got = self.kiln("jvp_loop", loop, (x, np.float32(0.3)), ["jvp:wrt=0"],
                        kiln_args=(x, np.float32(0.3), tx))
        self.same("jvp loop", got, jax.jvp(lambda v: loop(v, np.float32(0.3)), (x,), (tx,)))

    def test_vjp(self):
        rng = _rng(4)
        x = _f32(rng, 3, 4)

        def f(v):
            return jnp.tanh(v) * 2.0, jnp.sum(v ** 2, axis=0)
        u0, u1 = _f32(rng, 3, 4), _f32(rng, 4)
        got = self.kiln("vjp", f, (x,), ["vjp"], kiln_args=(x, u0, u1))
        out, pullback = jax.vjp(f, x)
        self.same("vjp", got, (out, pullback((u0, u1))))

    # ---- vmap -------------------------------------------------------------------

    def test_vmap(self):
        rng = _rng(5)
        xs, y = _f32(rng, 5, 3, 4), _f32(rng, 3, 4)
        got = self.kiln("vmap_chain", chain, (xs[0], y), ["vmap:in_axes=0,none"], kiln_args=(xs, y))
        self.same("vmap chain", got, jax.vmap(chain, in_axes=(0, None))(xs, y))
        a, bs, c = _f32(rng, 2, 3), _f32(rng, 3, 4, 6), _f32(rng, 4, 2)

        def prod(a, b, c):
            return jnp.tanh(a @ b) @ c
        got = self.kiln("vmap_dots", prod, (a, bs[:, :, 0], c), ["vmap:in_axes=none,2,none,out_axes=1"],
                        kiln_args=(a, bs, c))
        self.same("vmap dots", got, jax.vmap(prod, in_axes=(None, 2, None), out_axes=1)(a, bs, c))
        ps = np.array([1.0, -1.0, 0.5, -2.0], np.float32)
        xb = _f32(rng, 4, 3, 2)
        got = self.kiln("vmap_cond", branch, (ps[0], xb[0]), ["vmap"], kiln_args=(ps, xb))
        self.same("vmap cond (batched predicate)", got, jax.vmap(branch)(ps, xb))

    # ---- compositions -------------------------------------------------------------

    def test_hvp_and_hessian(self):
        x = np.array([0.3, -0.7, 1.1], np.float32)
        v = np.array([1.0, 2.0, -0.5], np.float32)
        got = self.kiln("hvp", quadratic, (x,), ["grad", "jvp"], kiln_args=(x, v))
        self.same("hvp", got, jax.jvp(jax.value_and_grad(quadratic), (x,), (v,)))
        eye = np.eye(3, dtype=np.float32)
        got = self.kiln("hessian", quadratic, (x,), ["grad", "jvp", "vmap:in_axes=none,0"],
                        kiln_args=(x, eye))
        hess = jax.hessian(quadratic)(x)
        np.testing.assert_allclose(got[3], hess, rtol=RTOL, atol=ATOL, err_msg="Hessian")
        hvp = jax.vmap(lambda t: jax.jvp(jax.value_and_grad(quadratic), (x,), (t,)), in_axes=0)(eye)
        self.same("vmap of hvp", got, hvp)

    def test_grad_of_grad(self):
        x = np.float32(0.8)
        got = self.kiln("gg", scalar, (x,), ["grad", "grad:output=1"])
        self.same("grad of grad", got, (jax.grad(scalar)(x), jax.grad(jax.grad(scalar))(x)))

    def test_per_example_gradients(self):
        rng = _rng(6)
        params = mlp_params(rng)
        x = _f32(rng, 5, 4)
        labels = rng.integers(0, 3, size=(5,)).astype(np.int32)

        def one(w1, b1, w2, b2, xi, li):
            return xent_loss(w1, b1, w2, b2, xi[None, :], li[None])
        got = self.kiln("per_example", one, (*params, x[0], labels[0]),
                        ["grad:wrt=0,2", "vmap:in_axes=none,none,none,none,0,0"],
                        kiln_args=(*params, x, labels))
        want = jax.vmap(jax.value_and_grad(one, argnums=(0, 2)), in_axes=(None,) * 4 + (0, 0))(
            *params, x, labels)
        self.same("vmap of grad", got, want)


    # ---- complex values and fft ----------------------------------------------------

    def test_complex_and_fft(self):
        rng = _rng(10)
        x = _f32(rng, 3, 8)
        got = self.kiln("fft_power", fft_power, (x,), ["grad"])
        self.same("grad of sum(abs(fft(x))**2)", got, jax.value_and_grad(fft_power)(x))
        x, y, w = _f32(rng, 2, 4), _f32(rng, 2, 4), _f32(rng, 2, 4)
        got = self.kiln("fft_kinds", fft_kinds, (x, y, w), ["grad:wrt=0,1,2"])
        self.same("grad through fft, ifft, rfft, irfft", got,
                  jax.value_and_grad(fft_kinds, argnums=(0, 1, 2))(x, y, w))
        got = self.kiln("complex_parts", complex_parts, (x, y), ["grad:wrt=0,1"])
        self.same("grad through complex, conj, real, imag, abs", got,
                  jax.value_and_grad(complex_parts, argnums=(0, 1))(x, y))
        got = self.kiln("complex_dot", complex_dot, (x, y), ["grad:wrt=0,1"])
        self.same("grad through a complex dot and sum", got,
                  jax.value_and_grad(complex_dot, argnums=(0, 1))(x, y))
        tx, ty = _f32(rng, 2, 4), _f32(rng, 2, 4)
        got = self.kiln("fft_jvp", fft_complex_out, (x, y), ["jvp"], kiln_args=(x, y, tx, ty))
        self.same("jvp of fft", got, jax.jvp(fft_complex_out, (x, y), (tx, ty)))
        u = (_f32(rng, 2, 4) + 1j * _f32(rng, 2, 4)).astype(np.complex64)
        got = self.kiln("fft_vjp", fft_complex_out, (x, y), ["vjp"], kiln_args=(x, y, u))
        out, pullback = jax.vjp(fft_complex_out, x, y)
        self.same("vjp of fft (complex cotangent)", got, (out, pullback(u)))
        # a complex parameter: jax.grad's convention, df/dx - i df/dy
        z = (_f32(rng, 3) + 1j * _f32(rng, 3)).astype(np.complex64)

        def of_z(v):
            return jnp.sum(jnp.abs(v) ** 2 + jnp.real(v ** 3) + jnp.imag(jnp.fft.fft(v) * v))
        got = self.kiln("complex_param", of_z, (z,), ["grad"])
        self.same("grad wrt a complex parameter", got, jax.value_and_grad(of_z)(z))
        xs, ys = _f32(rng, 5, 2, 4), _f32(rng, 2, 5, 4)
        got = self.kiln("fft_vmap", fft_complex_out, (x, y), ["vmap:in_axes=0,1"], kiln_args=(xs, ys))
        self.same("vmap of fft", got, jax.vmap(fft_complex_out, in_axes=(0, 1))(xs, ys))

    # ---- lowered ops and collectives ---------------------------------------------

    def test_batch_grouped_convolution(self):
        rng = _rng(8)
        x, k = _f32(rng, 4, 6, 2), _f32(rng, 3, 2, 4)
        got = self.kiln("bgc", batch_grouped_conv, (x, k), ["grad:wrt=0,1"])
        self.same("batch-grouped convolution", got, jax.value_and_grad(batch_grouped_conv, argnums=(0, 1))(x, k))
        tx, tk = _f32(rng, 4, 6, 2), _f32(rng, 3, 2, 4)
        got = self.kiln("bgc_jvp", batch_grouped_conv, (x, k), ["jvp"], kiln_args=(x, k, tx, tk))
        self.same("jvp batch-grouped convolution", got, jax.jvp(batch_grouped_conv, (x, k), (tx, tk)))
        # the inner kernel gradient of a depthwise convolution is batch-grouped
        x, k = _f32(rng, 2, 5, 2), _f32(rng, 2, 1, 2)
        tx, tk = _f32(rng, 2, 5, 2), _f32(rng, 2, 1, 2)
        got = self.kiln("dw_hvp", depthwise_conv, (x, k), ["grad:wrt=1", "jvp"], kiln_args=(x, k, tx, tk))
        self.same("jvp of the kernel gradient of a depthwise convolution", got,
                  jax.jvp(jax.value_and_grad(depthwise_conv, argnums=1), (x, k), (tx, tk)))

    def test_collectives_one_device(self):
        f = one_device_collectives()
        rng = _rng(9)
        x = _f32(rng, 2, 3)
        u = _f32(rng, 2, 3)
        got = self.kiln("coll_vjp", f, (x,), ["vjp"], kiln_args=(x, u))
        out, pullback = jax.vjp(f, x)
        self.same("vjp of all-gather, reduce-scatter, collective-permute", got, (out, pullback(u)))
        t = _f32(rng, 2, 3)
        got = self.kiln("coll_jvp", f, (x,), ["jvp"], kiln_args=(x, t))
        self.same("jvp of collectives", got, jax.jvp(f, (x,), (t,)))
        xs = _f32(rng, 4, 2, 3)
        got = self.kiln("coll_vmap", f, (x,), ["vmap:in_axes=1,out_axes=2"], kiln_args=(xs.transpose(1, 0, 2),))
        self.same("vmap of collectives", got, jax.vmap(f, in_axes=1, out_axes=2)(xs.transpose(1, 0, 2)))

if __name__ == "__main__":
    unittest.main()
