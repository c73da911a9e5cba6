"""Ahead-of-time compilation as in JAX: jit(f).lower(...).compile(progress=)
through kilnd's CompileStream, the Compiled object and its calls."""
import numpy as np
import pytest

import kiln
import kiln.numpy as knp

X = np.linspace(-1, 1, 12).astype(np.float32).reshape(3, 4)


def test_lower_compile_with_progress_then_call():
    f = kiln.jit(lambda x: knp.tanh(x) * 2 + 1)
    lowered = f.lower(X)
    assert isinstance(lowered, kiln.stages.Lowered)
    assert lowered.as_text().startswith("HloModule") and lowered == lowered.as_text()
    events = []
    compiled = lowered.compile(progress=events.append)
    assert isinstance(compiled, kiln.stages.Compiled)
    assert events and all(isinstance(e, kiln.CompileProgress) for e in events)
    phases = [e.phase for e in events]
    assert phases[-1] == "done" and phases.count("done") == 1, phases
    assert set(phases) <= {"queued", "loading", "waiting", "passes", "cc", "storing", "done"}
    assert [e.elapsed for e in events] == sorted(e.elapsed for e in events)
    assert events[-1].result.executable_id == compiled.executable_id
    assert all(e.result is None for e in events[:-1])
    assert compiled.cache_source in ("compiled", "memory", "disk", "shared")
    assert len(compiled.cache_key) == 64
    conn = kiln.connection()
    before = conn.rpc_count
    out = compiled(X)
    np.testing.assert_allclose(np.asarray(out), np.tanh(X) * 2 + 1, rtol=1e-6)
    assert conn.rpc_count - before <= 2  # the Execute (and a fetch), no Compile
    # a second compile of the same program is a hit of the server's cache
    again = f.lower(X).compile(progress=lambda e: None)
    assert again.cache_source == "memory" and again.executable_id == compiled.executable_id


def test_compile_of_transformed_and_static():
    g = kiln.jit(kiln.grad(lambda x, k: knp.sum(knp.sin(x) * k)), static_argnums=1)
    compiled = g.lower(X, 3.0).compile(progress=lambda e: None)
    want = np.cos(X) * 3.0
    np.testing.assert_allclose(np.asarray(compiled(X)), want, rtol=1e-5)  # static left out
    np.testing.assert_allclose(np.asarray(compiled(X, 3.0)), want, rtol=1e-5)
    plain = g.lower(X, 2.0).compile()  # without progress: the unary Compile
    np.testing.assert_allclose(np.asarray(plain(X)), np.cos(X) * 2.0, rtol=1e-5)


def test_progress_callback_error_abandons_the_compile():
    def boom(e):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        kiln.jit(lambda x: x * 7.0).lower(X).compile(progress=boom)
    # the connection is still usable
    np.testing.assert_allclose(np.asarray(kiln.jit(lambda x: x * 7.0)(X)), X * 7.0)


def test_compile_errors_come_through_the_stream():
    def kf(x, w):
        @kiln.custom_jvp
        def g(v):
            return v * w

        g.defjvp(lambda p, t: (g(p[0]), t[0] * w))
        return knp.sum(g(x))

    events = []
    lowered = kiln.jit(kiln.grad(kf, argnums=1)).lower(X, np.float32(3.0))
    with pytest.raises(kiln.errors.InvalidArgumentError, match="closed over"):
        lowered.compile(progress=events.append)
    assert "done" not in [e.phase for e in events]
