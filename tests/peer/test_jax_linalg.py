"""JAX as the peer for Kiln's linear algebra.

jnp.linalg and jax.scipy.linalg on the CPU export LAPACK custom calls
(lapack_spotrf_ffi, lapack_dgetrf_ffi, lapack_sgeqrf_ffi + orgqr,
lapack_ssyevd_ffi, lapack_sgesdd_ffi, lapack_strsm_ffi, with their info and
pivot outputs and column-major layouts). Each function below is exported with
jax.jit(f).lower(...).as_text(dialect="hlo"), run by `kiln run` on the
interpreter (the reference loops) and on the cpu backend (LAPACK from
OpenBLAS), on f32 and f64, plain and under jax.vmap (the calls then carry
batch dimensions), and compared with JAX's own outputs:

  * cholesky + solve_triangular, solve, qr (reduced and complete, tall and
    wide), slogdet, inv, det: elementwise against JAX (these are unique);
  * eigh and svd: eigen/singular values elementwise; the vectors, defined
    only up to sign, through the identities they satisfy (A V = V diag(w),
    U diag(s) Vt = A, orthonormal columns);
  * c64 and c128: cholesky + solve_triangular under vmap, solve, qr, the
    eigenvalues of eigh (heevd) and the singular values (gesdd);
  * the HLO ops cholesky and triangular-solve (lax.linalg's, written by
    hand as HLO) on the cpu backend against the interpreter;
  * a malformed backend_config and an unknown flag are refused with a
    message naming them, and grad through a LAPACK call is refused naming
    the target.

The kiln binary is $KILN_BIN, else build/kiln. Exits 77 (skipped) when jax
cannot be imported.
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

try:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpy as np
    import jax
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"jax_linalg: skipped, cannot import jax/numpy ({e})")
    sys.exit(77)

jax.config.update("jax_enable_x64", True)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KILN = os.environ.get("KILN_BIN") or os.path.join(ROOT, "build", "kiln")

TOL = {np.float32: 2e-4, np.float64: 1e-10, np.complex64: 2e-4, np.complex128: 1e-10}
BACKENDS = tuple(os.environ.get("KILN_LINALG_BACKENDS", "interp,cpu").split(","))


def hlo_of(fn, *args):
    return jax.jit(fn).lower(*args).as_text(dialect="hlo")


def kiln_run(text, args, backend, transforms=(), expect_fail=False):
    with tempfile.TemporaryDirectory(prefix="kiln_linalg_") as d:
        module = os.path.join(d, "m.hlo")
        with open(module, "w") as f:
            f.write(text)
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
        if expect_fail:
            return proc
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
        outs = []
        while os.path.exists(os.path.join(out, f"{len(outs)}.npy")):
            outs.append(np.load(os.path.join(out, f"{len(outs)}.npy")))
        return outs


def rng(seed):
    return np.random.default_rng(seed)


def general(r, dt, *shape):
    """Well-conditioned matrices: identity-heavy plus noise."""
    a = r.standard_normal(shape) * 0.3
    n = min(shape[-2:])
    a[..., np.arange(n), np.arange(n)] += 2.0
    return a.astype(dt)


def spd(r, dt, *shape):
    a = r.standard_normal(shape)
    n = shape[-1]
    return (a @ np.swapaxes(a, -1, -2) / n + np.eye(n)).astype(dt)


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def chol_solve(a, b):
    c = jnp.linalg.cholesky(a)
    y = jsl.solve_triangular(c, b, lower=True)
    return c, jsl.solve_triangular(c, y, lower=True, trans=1)


def triangular_variants(a, b, bt):
    return (jsl.solve_triangular(a, b, lower=False, unit_diagonal=True),
            jsl.solve_triangular(a, b, lower=True, trans=1),
            jax.lax.linalg.triangular_solve(a, bt, left_side=False, lower=True),
            jax.lax.linalg.triangular_solve(a, bt, left_side=False, lower=False,
                                            transpose_a=True))


def slogdet_inv(a):
    s, ld = jnp.linalg.slogdet(a)
    return s, ld, jnp.linalg.inv(a), jnp.linalg.det(a)


class Linalg(unittest.TestCase):
    def same(self, name, outs, want, dt):
        want = [np.asarray(w) for w in jax.tree_util.tree_leaves(want)]
        self.assertEqual(len(outs), len(want), name)
        for i, (g, w) in enumerate(zip(outs, want)):
            self.assertEqual(g.shape, w.shape, f"{name} output {i}")
            if w.dtype.kind in "iub":
                np.testing.assert_array_equal(g, w, f"{name} output {i}")
            else:
                self.assertLess(rel_err(g, w), TOL[dt] * 10, f"{name} output {i}")

    def peer(self, name, fn, args, dt):
        text = hlo_of(fn, *args)
        self.assertIn("lapack_", text, f"{name}: JAX wrote no LAPACK call")
        want = fn(*args)
        for backend in BACKENDS:
            with self.subTest(name=name, backend=backend):
                self.same(f"{name} ({backend})", kiln_run(text, args, backend), want, dt)

    def test_cholesky_solve_triangular(self):
        for dt in (np.float32, np.float64):
            r = rng(1)
            a, b = spd(r, dt, 5, 5), r.standard_normal((5, 3)).astype(dt)
            self.peer(f"chol {dt.__name__}", chol_solve, (a, b), dt)
            ab, bb = spd(r, dt, 3, 4, 4), r.standard_normal((3, 4, 2)).astype(dt)
            self.peer(f"vmap chol {dt.__name__}", jax.vmap(chol_solve), (ab, bb), dt)
            t = general(r, dt, 4, 4)
            self.peer(f"trsm {dt.__name__}", triangular_variants,
                      (t, r.standard_normal((4, 3)).astype(dt),
                       r.standard_normal((3, 4)).astype(dt)), dt)

    def test_solve(self):
        for dt in (np.float32, np.float64):
            r = rng(2)
            self.peer(f"solve {dt.__name__}", jnp.linalg.solve,
                      (general(r, dt, 6, 6), r.standard_normal((6, 2)).astype(dt)), dt)
            self.peer(f"vmap solve {dt.__name__}", jax.vmap(jnp.linalg.solve),
                      (general(r, dt, 2, 3, 3), r.standard_normal((2, 3)).astype(dt)),
                      dt)
            self.peer(f"lu {dt.__name__}", jax.lax.linalg.lu, (general(r, dt, 4, 6),), dt)

    def test_qr(self):
        for dt in (np.float32, np.float64):
            r = rng(3)
            for shape in ((6, 4), (3, 5), (2, 5, 3)):
                x = general(r, dt, *shape)
                self.peer(f"qr {shape} {dt.__name__}", jnp.linalg.qr, (x,), dt)
                self.peer(f"qr complete {shape} {dt.__name__}",
                          lambda v: jnp.linalg.qr(v, mode="complete"), (x,), dt)

    def test_slogdet_inv(self):
        for dt in (np.float32, np.float64):
            r = rng(4)
            self.peer(f"slogdet/inv {dt.__name__}", slogdet_inv, (general(r, dt, 5, 5),), dt)
            self.peer(f"vmap slogdet/inv {dt.__name__}", jax.vmap(slogdet_inv),
                      (general(r, dt, 3, 4, 4),), dt)

    def vectors_ok(self, name, dt, a, w, v):
        tol = TOL[dt] * 20
        a, w, v = (np.asarray(x, np.float64) for x in (a, w, v))
        scale = max(np.max(np.abs(a)), 1e-30)
        self.assertLess(np.max(np.abs(a @ v - v * w[..., None, :])) / scale, tol, name)
        eye = np.eye(v.shape[-1])
        self.assertLess(np.max(np.abs(np.swapaxes(v, -1, -2) @ v - eye)), tol, name)

    def test_eigh(self):
        for dt in (np.float32, np.float64):
            r = rng(5)
            for shape in ((5, 5), (3, 4, 4)):
                a = spd(r, dt, *shape) - 1.5 * np.eye(shape[-1], dtype=dt)
                text = hlo_of(jnp.linalg.eigh, a)
                self.assertIn("syevd_ffi", text)
                w_want, _ = jnp.linalg.eigh(a)
                for backend in BACKENDS:
                    name = f"eigh {shape} {dt.__name__} ({backend})"
                    w, v = kiln_run(text, (a,), backend)
                    self.assertLess(rel_err(w, w_want), TOL[dt] * 10, name)
                    self.vectors_ok(name, dt, a, w, v)

    def svd_ok(self, name, dt, a, u, s, vt):
        tol = TOL[dt] * 20
        a, u, s, vt = (np.asarray(x, np.float64) for x in (a, u, s, vt))
        k = s.shape[-1]
        rec = (u[..., :, :k] * s[..., None, :]) @ vt[..., :k, :]
        self.assertLess(np.max(np.abs(rec - a)) / np.max(np.abs(a)), tol, name)
        for q in (u, np.swapaxes(vt, -1, -2)):
            eye = np.eye(q.shape[-1])
            self.assertLess(np.max(np.abs(np.swapaxes(q, -1, -2) @ q - eye)), tol, name)

    def test_svd(self):
        for dt in (np.float32, np.float64):
            r = rng(6)
            for shape in ((6, 4), (3, 5), (2, 4, 3)):
                a = general(r, dt, *shape)
                s_want = jnp.linalg.svd(a, compute_uv=False)
                for full in (True, False):
                    fn = lambda v, full=full: jnp.linalg.svd(v, full_matrices=full)
                    text = hlo_of(fn, a)
                    self.assertIn("gesdd_ffi", text)
                    for backend in BACKENDS:
                        name = f"svd {shape} full={full} {dt.__name__} ({backend})"
                        u, s, vt = kiln_run(text, (a,), backend)
                        self.assertLess(rel_err(s, s_want), TOL[dt] * 10, name)
                        self.svd_ok(name, dt, a, u, s, vt)
                text = hlo_of(lambda v: jnp.linalg.svd(v, compute_uv=False), a)
                for backend in BACKENDS:
                    (s,) = kiln_run(text, (a,), backend)
                    self.assertLess(rel_err(s, s_want), TOL[dt] * 10, f"svdvals {backend}")

    def test_complex(self):
        for dt, rdt in ((np.complex64, np.float32), (np.complex128, np.float64)):
            r = rng(9)
            x = (r.standard_normal((3, 4, 4)) + 1j * r.standard_normal((3, 4, 4))).astype(dt)
            a = (x @ np.conj(np.swapaxes(x, -1, -2)) / 4 + np.eye(4)).astype(dt)
            b = (r.standard_normal((3, 4, 2)) + 1j * r.standard_normal((3, 4, 2))).astype(dt)
            self.peer(f"vmap chol {dt.__name__}", jax.vmap(chol_solve), (a, b), dt)
            self.peer(f"solve {dt.__name__}", jnp.linalg.solve, (a[0], b[0]), dt)
            self.peer(f"qr {dt.__name__}", jnp.linalg.qr, (b[0],), dt)
            text = hlo_of(jnp.linalg.eigvalsh, a)
            self.assertIn("heevd_ffi", text)
            for backend in BACKENDS:
                (w,) = kiln_run(text, (a,), backend)
                self.assertLess(rel_err(w, jnp.linalg.eigvalsh(a)), TOL[rdt] * 10, backend)
            text = hlo_of(lambda v: jnp.linalg.svd(v, compute_uv=False), b)
            for backend in BACKENDS:
                (s,) = kiln_run(text, (b,), backend)
                self.assertLess(rel_err(s, jnp.linalg.svd(b, compute_uv=False)), TOL[rdt] * 10)

    def test_hlo_ops_cpu_against_interp(self):
        text = """HloModule hlo_linalg
ENTRY main {
  a = f64[3,4,4]{2,1,0} parameter(0)
  b = f64[3,4,2]{2,1,0} parameter(1)
  l = f64[3,4,4]{2,1,0} cholesky(a), lower=true
  u = f64[3,4,4]{2,1,0} cholesky(a), lower=false
  x = f64[3,4,2]{2,1,0} triangular-solve(l, b), left_side=true, lower=true, transpose_a=NO_TRANSPOSE
  y = f64[3,4,2]{2,1,0} triangular-solve(u, x), left_side=true, lower=false, transpose_a=TRANSPOSE, unit_diagonal=true
  ROOT t = (f64[3,4,4]{2,1,0}, f64[3,4,4]{2,1,0}, f64[3,4,2]{2,1,0}, f64[3,4,2]{2,1,0}) tuple(l, u, x, y)
}
"""
        r = rng(7)
        a, b = spd(r, np.float64, 3, 4, 4), r.standard_normal((3, 4, 2))
        want = kiln_run(text, (a, b), "interp")
        np.testing.assert_allclose(want[0], np.linalg.cholesky(a), rtol=1e-12, atol=1e-12)
        got = kiln_run(text, (a, b), "cpu")
        for g, w in zip(got, want):
            self.assertLess(rel_err(g, w), 1e-12)
        a[1] = -a[1]  # not positive definite: NaN from the failing column on, as the interpreter
        want, got = kiln_run(text, (a, b), "interp"), kiln_run(text, (a, b), "cpu")
        np.testing.assert_array_equal(np.isnan(got[0]), np.isnan(want[0]))
        self.assertTrue(np.isnan(got[0][1]).any())

    def test_refusals(self):
        a = spd(rng(8), np.float32, 4, 4)
        text = hlo_of(jnp.linalg.cholesky, a)
        bad = text.replace("uplo = 76 : ui8", "uplo = 88 : ui8")
        self.assertNotEqual(bad, text)
        for backend in BACKENDS:
            p = kiln_run(bad, (a,), backend, expect_fail=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("lapack_spotrf_ffi: uplo is 88, expected 76 ('L') or 85 ('U')", p.stderr)
        p = kiln_run(text.replace("uplo = 76 : ui8", "uplo = 76 : ui8, fast = 1 : ui8"), (a,),
                     "interp", expect_fail=True)
        self.assertIn("backend_config has key fast, which potrf does not take", p.stderr)
        p = kiln_run(text.replace("s32[]) custom-call", "s32[2]) custom-call", 1), (a,), "interp",
                     expect_fail=True)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"lapack_spotrf_ffi: (result 1 must be s32\[\]|.*s32)")
        g = hlo_of(lambda x: jnp.sum(jnp.linalg.cholesky(x)), a)
        p = kiln_run(g, (a,), "interp", transforms=("grad",), expect_fail=True)
        self.assertNotEqual(p.returncode, 0)
        self.assertTrue(re.search(r'custom-call target "lapack_spotrf_ffi" .* is a LAPACK call, '
                                  r'which Kiln does not differentiate', p.stderr), p.stderr)
        f = hlo_of(jnp.linalg.cholesky, a)
        for t in ("jvp", "vmap"):
            args = (a, a) if t == "jvp" else (a[None],)
            p = kiln_run(f, args, "interp", transforms=(t,), expect_fail=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn('custom-call target "lapack_spotrf_ffi"', p.stderr)
            self.assertIn("is a LAPACK call", p.stderr)


if __name__ == "__main__":
    unittest.main()
