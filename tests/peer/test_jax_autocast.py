"""JAX as the peer for Kiln's mixed-precision transform (autocast).

`kiln run FILE --transform autocast:bf16` rewrites an f32 program so that
its dots and convolutions take bf16 (or f16) operands and accumulate in f32;
everything else stays f32. Two checks:

  * against the f32 program: the MLP and transformer-block exports of
    JAX (tests/peer/models/, from jax.jit(f).lower(...).as_text()) run on
    the cpu backend, f32 and autocast, agree within bf16 tolerance;
  * against JAX's own version of the same policy: functions written with
    jnp.dot / lax.conv_general_dilated on inputs cast to bf16 with
    preferred_element_type=float32 agree closely with kiln's autocast of
    the plain f32 function (both multiply the same rounded inputs exactly
    and sum in f32; only the order of the sums differs), and so do their
    gradients; the f16 grad with dynamic loss scaling gives JAX's f16
    gradient, and a small f16 training loop with loss scaling converges
    like the f32 one.

The kiln binary is $KILN_BIN, else build/kiln. Exits 77 (skipped) when jax
cannot be imported.
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
    print(f"jax_autocast: skipped, cannot import jax/numpy ({e})")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KILN = os.environ.get("KILN_BIN") or os.path.join(ROOT, "build", "kiln")

BF16_TOL = 2e-2  # relative to the largest magnitude of an output


def kiln_run(module_text_or_path, args, transforms, backend="interp"):
    with tempfile.TemporaryDirectory(prefix="kiln_autocast_") as d:
        if os.path.exists(module_text_or_path):
            module = module_text_or_path
        else:
            module = os.path.join(d, "m.hlo")
            with open(module, "w") as f:
                f.write(module_text_or_path)
        cmd = [KILN, "run", module, "--backend", backend]
        for t in transforms:
            cmd += ["--transform", t]
        for i, a in enumerate(args):
            p = os.path.join(d, f"arg{i}.npy")
            np.save(p, np.asarray(a))
            cmd += ["--arg", p]
        out = os.path.join(d, "out")
        cmd += ["--out", out]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
        outs = []
        while os.path.exists(os.path.join(out, f"{len(outs)}.npy")):
            outs.append(np.load(os.path.join(out, f"{len(outs)}.npy")))
        return outs


def hlo_of(fn, *args):
    return jax.jit(fn, keep_unused=True).lower(*args).as_text(dialect="hlo")


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def params_from_hlo(path, rng):
    """Random arguments for the ENTRY parameters of an exported module."""
    import re
    with open(path) as f:
        text = f.read()
    entry = text[text.index("ENTRY"):]
    shapes = {}
    for m in re.finditer(r"= f32\[([0-9,]*)\][^ ]* parameter\((\d+)\)", entry):
        dims = tuple(int(x) for x in m.group(1).split(",") if x)
        shapes[int(m.group(2))] = dims
    return [(rng.standard_normal(shapes[i]) * (1.0 / np.sqrt(max(shapes[i][0] if shapes[i] else 1, 1))))
            .astype(np.float32) for i in range(len(shapes))]


# ---- the policy in JAX ------------------------------------------------------

def mlp(w1, b1, w2, b2, x, cast=None):
    def dot(a, b):
        if cast is None:
            return jnp.dot(a, b)
        return jnp.dot(a.astype(cast), b.astype(cast), preferred_element_type=jnp.float32)
    h = jax.nn.gelu(dot(x, w1) + b1)
    logits = dot(h, w2) + b2
    return jax.nn.log_softmax(logits, axis=-1)


def mlp_loss(w1, b1, w2, b2, x, y, cast=None):
    logp = mlp(w1, b1, w2, b2, x, cast)
    return -jnp.mean(jnp.sum(logp * y, axis=-1))


def conv_net(x, k, cast=None):
    dn = ("NHWC", "HWIO", "NHWC")
    if cast is None:
        y = lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=dn)
    else:
        y = lax.conv_general_dilated(x.astype(cast), k.astype(cast), (1, 1), "SAME",
                                     dimension_numbers=dn, preferred_element_type=jnp.float32)
    return jnp.mean(jax.nn.relu(y) ** 2)


class AutocastPeer(unittest.TestCase):
    def test_models_within_bf16_tolerance(self):
        rng = np.random.default_rng(0)
        for name in ("mlp", "transformer"):
            path = os.path.join(HERE, "models", f"{name}.hlo")
            args = params_from_hlo(path, rng)
            (f32,) = kiln_run(path, args, [], backend="cpu")
            (bf16,) = kiln_run(path, args, ["autocast:bf16"], backend="cpu")
            (f16,) = kiln_run(path, args, ["autocast:f16"], backend="cpu")
            self.assertTrue(np.all(np.isfinite(bf16)), name)
            e_bf, e_f = rel_err(bf16, f32), rel_err(f16, f32)
            print(f"{name}: autocast:bf16 rel err {e_bf:.2e}, autocast:f16 {e_f:.2e}")
            self.assertLess(e_bf, BF16_TOL, f"{name}: bf16 autocast too far from f32")
            self.assertGreater(e_bf, 0, f"{name}: bf16 autocast changed nothing")
            self.assertLess(e_f, e_bf, f"{name}: f16 (10-bit mantissa) should beat bf16 (7)")

    def test_same_policy_as_jax(self):
        rng = np.random.default_rng(1)
        w1 = rng.standard_normal((16, 32)).astype(np.float32) * 0.3
        b1 = rng.standard_normal((32,)).astype(np.float32) * 0.1
        w2 = rng.standard_normal((32, 10)).astype(np.float32) * 0.3
        b2 = rng.standard_normal((10,)).astype(np.float32) * 0.1
        x = rng.standard_normal((8, 16)).astype(np.float32)
        y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 8)]
        args = (w1, b1, w2, b2, x)
        text = hlo_of(mlp, *args)
        for dt, name in ((jnp.bfloat16, "bf16"), (jnp.float16, "f16")):
            want = np.asarray(jax.jit(lambda *a: mlp(*a, cast=dt))(*args))
            plain = np.asarray(jax.jit(mlp)(*args))
            (got,) = kiln_run(text, args, [f"autocast:{name}"])
            # the policy, not f32: closer to JAX's policy than to f32
            self.assertLess(rel_err(got, want), 1e-4, f"mlp autocast:{name} vs JAX's policy")
            self.assertGreater(rel_err(plain, want), 10 * rel_err(got, want))
        # gradients: grad(autocast(f)) against jax.grad of the policy
        largs = (w1, b1, w2, b2, x, y)
        ltext = hlo_of(mlp_loss, *largs)
        got = kiln_run(ltext, largs, ["autocast:bf16", "grad:wrt=0,1,2,3"])
        val, grads = jax.value_and_grad(lambda *a: mlp_loss(*a, cast=jnp.bfloat16),
                                        argnums=(0, 1, 2, 3))(*largs)
        np.testing.assert_allclose(got[0], val, rtol=1e-4)
        for i, g in enumerate(grads):
            self.assertLess(rel_err(got[1 + i], g), 2e-2, f"gradient {i}")
        # convolution
        xc = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
        kc = rng.standard_normal((3, 3, 3, 4)).astype(np.float32) * 0.3
        (got,) = kiln_run(hlo_of(conv_net, xc, kc), (xc, kc), ["autocast:bf16"])
        want = jax.jit(lambda a, b: conv_net(a, b, cast=jnp.bfloat16))(xc, kc)
        self.assertLess(rel_err(got, want), 1e-4, "convolution vs JAX's policy")

    def test_f16_loss_scaling_trains(self):
        rng = np.random.default_rng(2)
        w1 = rng.standard_normal((16, 32)).astype(np.float32) * 0.3
        b1 = np.zeros((32,), np.float32)
        w2 = rng.standard_normal((32, 10)).astype(np.float32) * 0.3
        b2 = np.zeros((10,), np.float32)
        x = rng.standard_normal((64, 16)).astype(np.float32)
        y = np.eye(10, dtype=np.float32)[np.argmax(x[:, :10], axis=1)]
        text = hlo_of(mlp_loss, w1, b1, w2, b2, x, y)
        # one step at a finite scale: JAX's f16-policy gradient
        got = kiln_run(text, (w1, b1, w2, b2, x, y, np.float32(2.0 ** 12), np.int32(0)),
                       ["autocast:f16,growth_interval=2", "grad:wrt=0,1,2,3"])
        _, grads = jax.value_and_grad(lambda *a: mlp_loss(*a, cast=jnp.float16),
                                      argnums=(0, 1, 2, 3))(w1, b1, w2, b2, x, y)
        for i, g in enumerate(grads):
            self.assertLess(rel_err(got[1 + i], g), 5e-3, f"loss-scaled gradient {i}")
        self.assertEqual(int(got[6]), 1)
        # an overflowing scale skips the update and halves the scale
        got = kiln_run(text, (w1, b1, w2, b2, x, y, np.float32(1e38), np.int32(1)),
                       ["autocast:f16", "grad:wrt=0,1,2,3"])
        for i in range(4):
            self.assertEqual(float(np.abs(got[1 + i]).max()), 0.0)
        self.assertAlmostEqual(float(got[5]) / 5e37, 1.0, places=5)
        self.assertEqual(int(got[6]), 0)
        # a short SGD run converges like f32 (the f32 loss of JAX's own steps)
        p16 = [w1, b1, w2, b2]
        p32 = [jnp.asarray(a) for a in p16]
        scale, good = np.float32(2.0 ** 15), np.int32(0)
        g32 = jax.jit(jax.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3)))
        for _ in range(8):
            out = kiln_run(text, (*p16, x, y, scale, good),
                           ["autocast:f16,growth_interval=3", "grad:wrt=0,1,2,3"])
            p16 = [p - 0.5 * g for p, g in zip(p16, out[1:5])]
            scale, good = out[5], out[6]
            _, gs = g32(*p32, x, y)
            p32 = [p - 0.5 * g for p, g in zip(p32, gs)]
        l16 = float(mlp_loss(*p16, x, y))
        l32 = float(mlp_loss(*p32, x, y))
        l0 = float(mlp_loss(w1, b1, w2, b2, x, y))
        print(f"loss {l0:.4f} -> f32 {l32:.4f}, f16 autocast + loss scaling {l16:.4f}")
        self.assertLess(l16, 0.8 * l0)
        self.assertLess(abs(l16 - l32), 0.02 * l0 + 0.01)


if __name__ == "__main__":
    unittest.main()
